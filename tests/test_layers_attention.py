"""Attention layers (kuiper_xp/layers/attention.py) against PyTorch: nn.MultiheadAttention (inputs
laid out the way pnnx lays them out), F.scaled_dot_product_attention, matmul / bmm / mm / addmm /
baddbmm / einsum, nn.Embedding; plus pnnx exports of the real spellings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from test_layers_misc import (
    compare_graph,
    export_module,
    make_layer,
    require_types,
    run_one_op,
    t2n,
)
from torch import nn

import kuiper_xp

rng = np.random.default_rng(3)


def _x(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- nn.MultiheadAttention ------------------------------------------------------------------------


def _mha_weights(m: nn.MultiheadAttention) -> dict[str, np.ndarray]:
    names = ["in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v"]
    w = {n: t2n(getattr(m, n)) for n in names if getattr(m, n, None) is not None}
    w["out_proj.weight"] = t2n(m.out_proj.weight)
    if m.out_proj.bias is not None:
        w["out_proj.bias"] = t2n(m.out_proj.bias)
    return w


def _mha_params(m: nn.MultiheadAttention) -> str:
    p = (f"add_bias_kv={m.bias_k is not None} add_zero_attn={m.add_zero_attn} bias={m.in_proj_bias is not None} "
         f"embed_dim={m.embed_dim} kdim={m.kdim} num_heads={m.num_heads} vdim={m.vdim}")
    return p + " batch_first=True" if m.batch_first else p  # pnnx leaves batch_first out when False


N, L, S, E, H = 2, 5, 4, 8, 2

# name -> (module kwargs, call builder). The builder returns (torch call args, torch call kwargs,
# the op's inputs in pnnx's order, whether the last input carries $attn_mask).


def _case(name):
    bf = name != "seq_first_float_mask"
    x = _x(N, L, E) if bf else _x(L, N, E)
    y = _x(N, S, E)
    kpm = np.zeros((N, S), bool)
    kpm[0, -1] = kpm[1, -2:] = True
    kpm_self = np.zeros((N, L), bool)
    kpm_self[1, -1] = True
    causal = np.triu(np.ones((L, L), bool), 1)
    if name == "self":
        return {}, (x, x, x), {"need_weights": False}, [x], False
    if name == "cross_weights":
        return {}, (x, y, y), {}, [x, y], False
    if name == "seq_first_float_mask":
        m = _x(L, L)
        return {"batch_first": False}, (x, x, x), {"attn_mask": torch.from_numpy(m), "need_weights": False}, [x, m], True
    if name == "buffer_mask_first":
        # a float attn_mask held in a registered buffer (CLIP's causal mask): pnnx lists the
        # pnnx.Attribute before the query and still tags the last input (the query) $attn_mask
        m = np.triu(np.full((L, L), -np.inf, np.float32), 1)
        return {}, (x, x, x), {"attn_mask": torch.from_numpy(m), "need_weights": False}, [m, x], True
    if name == "kpm_bool_and_float_mask":
        m = _x(L, S)
        return ({}, (x, y, y), {"attn_mask": torch.from_numpy(m), "key_padding_mask": torch.from_numpy(kpm)},
                [kpm, x, y, m], True)
    if name == "causal_bool_and_kpm_per_head":
        return ({}, (x, x, x), {"attn_mask": torch.from_numpy(causal), "key_padding_mask": torch.from_numpy(kpm_self),
                                "average_attn_weights": False}, [kpm_self, causal, x], True)
    if name == "float_kpm":
        kf = np.where(kpm, -3.0, 0.5).astype(np.float32)
        return {}, (x, y, y), {"key_padding_mask": torch.from_numpy(kf), "need_weights": False}, [x, y, kf], True
    if name == "kdim_vdim":
        k, v = _x(N, S, 6), _x(N, S, 3)
        return {"kdim": 6, "vdim": 3}, (x, k, v), {"need_weights": False}, [x, k, v], False
    if name == "no_bias_3d_mask":
        m = _x(N * H, L, L)
        return {"bias": False}, (x, x, x), {"attn_mask": torch.from_numpy(m), "need_weights": False}, [x, m], True
    if name == "bias_kv_zero_attn":
        return ({"add_bias_kv": True, "add_zero_attn": True}, (x, y, y),
                {"key_padding_mask": torch.from_numpy(kpm)}, [kpm, x, y], True)
    if name == "unbatched":
        x2 = _x(L, E)
        return {}, (x2, x2, x2), {}, [x2], False
    if name == "unbatched_3d_mask_keys_eq_embed":
        # an unbatched query beside a (heads, L, S) mask with S == embed_dim: the query is still
        # the first input (a 3-D input shaped like a batched query does not win)
        x2, y2, m = _x(L, E), _x(E, E), _x(H, L, E)
        return {}, (x2, y2, y2), {"attn_mask": torch.from_numpy(m), "need_weights": False}, [x2, y2, m], True
    raise KeyError(name)


MHA_CASES = ["self", "cross_weights", "seq_first_float_mask", "buffer_mask_first", "kpm_bool_and_float_mask",
             "causal_bool_and_kpm_per_head", "unbatched_3d_mask_keys_eq_embed",
             "float_kpm", "kdim_vdim", "no_bias_3d_mask", "bias_kv_zero_attn", "unbatched"]


@pytest.mark.parametrize("name", MHA_CASES)
def test_multihead_attention(backend, tmp_path, name):
    mkw, args, kwargs, op_inputs, labelled = _case(name)
    torch.manual_seed(0)
    m = nn.MultiheadAttention(E, H, batch_first=mkw.pop("batch_first", True), **mkw).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(-0.5, 0.5)
        out, weights = m(*(torch.from_numpy(a) for a in args), **kwargs)
    expected = [t2n(out)] if weights is None else [t2n(out), t2n(weights)]
    keys = [""] * len(op_inputs)
    if labelled:
        keys[-1] = "attn_mask"  # as pnnx tags it, whatever the last input really is
    run_one_op(backend, tmp_path, "nn.MultiheadAttention", op_inputs, expected, params=_mha_params(m),
               weights=_mha_weights(m), keys=keys, rtol=1e-4)


def test_mha_rejects_bad_weights(backend):
    from kuiper_xp.errors import LayerParameterError

    with pytest.raises(LayerParameterError, match="num_heads"):
        make_layer(backend, "nn.MultiheadAttention op 1 1 0 1 embed_dim=10 num_heads=3")


# ---- F.scaled_dot_product_attention ----------------------------------------------------------------


@pytest.mark.parametrize("case", ["causal", "causal_rect", "float_mask", "bool_mask", "scale", "gqa", "3d",
                                  "bool_mask_dead_rows", "float_mask_dead_rows"])
def test_sdpa(backend, tmp_path, case):
    q, k, v = _x(2, 4, 5, 8), _x(2, 4, 5, 8), _x(2, 4, 5, 6)
    kw, params, ins, keys = {}, "dropout_p=0.0", [q, k, v], ["query", "key", "value"]
    if case == "causal":
        kw["is_causal"], params = True, params + " attn_mask=None is_causal=True"
    elif case == "causal_rect":
        k, v = _x(2, 4, 7, 8), _x(2, 4, 7, 6)
        ins = [q, k, v]
        kw["is_causal"], params = True, params + " attn_mask=None is_causal=True"
    elif case in ("float_mask", "bool_mask"):
        m = _x(5, 5) if case == "float_mask" else np.tril(np.ones((5, 5), bool)) | (rng.random((5, 5)) > 0.5)
        kw["attn_mask"] = torch.from_numpy(m)
        ins, keys = ins + [m], keys + ["attn_mask"]
        params += " is_causal=False"
    elif case in ("float_mask_dead_rows", "bool_mask_dead_rows"):
        # queries whose mask keeps no key (a left-padded batch): torch's SDPA gives zeros there
        m = np.tril(np.ones((2, 1, 5, 5), bool))
        m[0, :, 1] = m[1, :, 3] = False
        if case == "float_mask_dead_rows":
            m = np.where(m, _x(2, 1, 5, 5), -np.inf).astype(np.float32)
        kw["attn_mask"] = torch.from_numpy(m)
        ins, keys = ins + [m], keys + ["attn_mask"]
        params += " is_causal=False"
    elif case == "scale":
        kw["scale"], params = 0.3, params + " attn_mask=None is_causal=False scale=0.3"
    elif case == "gqa":
        k, v = _x(2, 2, 5, 8), _x(2, 2, 5, 6)
        ins = [q, k, v]
        kw["enable_gqa"], params = True, params + " attn_mask=None is_causal=False enable_gqa=True"
    elif case == "3d":
        q, k, v = _x(3, 5, 4), _x(3, 6, 4), _x(3, 6, 4)
        ins = [q, k, v]
        params += " attn_mask=None is_causal=False"
    e = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in ins[:3]), **kw)
    if "dead_rows" in case:
        assert (t2n(e)[0, :, 1] == 0).all() and np.isfinite(t2n(e)).all()
    run_one_op(backend, tmp_path, "F.scaled_dot_product_attention", ins, t2n(e), params=params, keys=keys, rtol=1e-4)


# ---- products --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 2)), ((2, 3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2)),
                                   ((4,), (4,))])
def test_matmul(backend, tmp_path, sa, sb):
    a, b = _x(*sa), _x(*sb)
    run_one_op(backend, tmp_path, "torch.matmul", [a, b], t2n(torch.matmul(torch.from_numpy(a), torch.from_numpy(b))),
               keys=["input", "other"], rtol=1e-5)


def test_mm_bmm_addmm_baddbmm(backend, tmp_path):
    a, b = _x(3, 4), _x(4, 5)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    run_one_op(backend, tmp_path / "mm", "torch.mm", [a, b], t2n(torch.mm(ta, tb)), keys=["input", "mat2"])
    c = _x(3, 5)
    e = torch.addmm(torch.from_numpy(c), ta, tb, beta=0.5, alpha=2.0)
    run_one_op(backend, tmp_path / "addmm", "torch.addmm", [c, a, b], t2n(e), params="alpha=2.0 beta=0.5",
               keys=["input", "mat1", "mat2"])
    ba, bb, bc = _x(2, 3, 4), _x(2, 4, 5), _x(1, 5)
    run_one_op(backend, tmp_path / "bmm", "torch.bmm", [ba, bb], t2n(torch.bmm(torch.from_numpy(ba), torch.from_numpy(bb))),
               keys=["input", "mat2"])
    e = torch.baddbmm(torch.from_numpy(bc), torch.from_numpy(ba), torch.from_numpy(bb), beta=0.0, alpha=1.0)
    run_one_op(backend, tmp_path / "baddbmm", "torch.baddbmm", [bc * np.nan, ba, bb], t2n(e), params="alpha=1 beta=0",
               keys=["input", "batch1", "batch2"])


@pytest.mark.parametrize("c_shape", [(5,), (1, 5), (3, 5), (3, 1), ()])
def test_addmm_bias_added_in_place_matches_torch(backend, tmp_path, c_shape):
    """beta = alpha = 1 with a broadcasting bias (GPT-2's Conv1D): the sum is made in the fresh
    product; the operands are left as they were."""
    a, b, c = _x(3, 4), _x(4, 5), _x(*c_shape) if c_shape else np.float32(0.25)
    c = np.asarray(c, np.float32)
    keep = [a.copy(), b.copy(), c.copy()]
    e = torch.addmm(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b))
    run_one_op(backend, tmp_path, "torch.addmm", [c, a, b], t2n(e), keys=["input", "mat1", "mat2"])
    for before, now in zip(keep, (a, b, c)):
        np.testing.assert_array_equal(before, now)


def test_einsum_plans_per_shape(backend, tmp_path):
    """The contraction is planned once per operand shapes and dtypes: calls alternating between
    two batch sizes, and a diagonal equation, each give torch's result every time."""
    from helpers import make_layer

    layer = make_layer(backend, "torch.einsum", "equation=bhid,bhjd->bhij", n_in=2)
    for n in (2, 5, 2, 5):
        a, b = _x(n, 3, 4, 6), _x(n, 3, 7, 6)
        want = torch.einsum("bhid,bhjd->bhij", torch.from_numpy(a), torch.from_numpy(b))
        assert_close(backend.to_numpy(layer(backend.asarray(a), backend.asarray(b))), t2n(want), rtol=1e-5)
    assert len(layer._plans) == 2
    diag = make_layer(backend, "torch.einsum", "equation=bii,bij->bj", n_in=2)
    for n in (1, 3, 1):
        a, b = _x(n, 4, 4), _x(n, 4, 5)
        want = torch.einsum("bii,bij->bj", torch.from_numpy(a), torch.from_numpy(b))
        assert_close(backend.to_numpy(diag(backend.asarray(a), backend.asarray(b))), t2n(want), rtol=1e-5)


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bhid,bhjd->bhij", [(2, 3, 4, 5), (2, 3, 6, 5)]), ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]), ("i,j->ij", [(3,), (4,)]), ("...ij,...jk", [(2, 3, 4), (4, 5)]),
    ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 2)]), ("ijk,ik->j", [(3, 4, 5), (3, 5)]),
    # linear attention: batched outer products (nothing contracted), then a contraction
    ("bnhd,bnhe->bnhde", [(2, 5, 3, 4), (2, 5, 3, 6)]), ("bnhd,bnhe->hedb", [(2, 5, 3, 4), (1, 5, 3, 6)]),
    ("bnhd,bnhde,bnh->bnhe", [(2, 5, 3, 4), (2, 5, 3, 4, 6), (2, 5, 3)]),
])
def test_einsum(backend, tmp_path, eq, shapes):
    ops = [_x(*s) for s in shapes]
    e = torch.einsum(eq, *(torch.from_numpy(a) for a in ops))
    run_one_op(backend, tmp_path, "torch.einsum", ops, t2n(e), params=f"equation={eq}", rtol=1e-5)


# ---- embedding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,dtype", [((2, 7), np.int64), ((5,), np.int64), ((2, 3, 2), np.int32), ((), np.int64)])
def test_embedding(backend, tmp_path, shape, dtype):
    w = _x(10, 6)
    idx = rng.integers(0, 10, shape).astype(dtype)
    e = F.embedding(torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(w))
    run_one_op(backend, tmp_path, "nn.Embedding", [idx], t2n(e), params="embedding_dim=6 num_embeddings=10 sparse=False",
               weights={"weight": w})


def test_embedding_max_norm_and_weight_input(backend, tmp_path):
    w = _x(10, 6) * 3
    idx = np.array([[1, 2, 2], [9, 0, 3]], dtype=np.int64)
    e = F.embedding(torch.from_numpy(idx), torch.from_numpy(w.copy()), max_norm=1.5)
    run_one_op(backend, tmp_path / "a", "nn.Embedding", [idx], t2n(e),
               params="embedding_dim=6 num_embeddings=10 max_norm=1.5 sparse=False", weights={"weight": w})
    e = F.embedding(torch.from_numpy(idx), torch.from_numpy(w))
    run_one_op(backend, tmp_path / "b", "F.embedding", [idx, w], t2n(e), keys=["input", "weight"])


def test_embedding_index_out_of_range_is_an_error(model_backend, tmp_path):
    """torch raises for a token id outside the table; numpy's take wrapped a negative one (-1 gave
    the last row). Checked where host reads are cheap (not on a GPU, where it would block graph
    capture)."""
    import kuiper_xp

    m = nn.Embedding(10, 4).eval()
    param = export_module(m, (torch.tensor([[1, 2, 3]]),), tmp_path)
    g = kuiper_xp.load(param, backend=model_backend)
    assert_close(kuiper_xp.to_numpy(g(np.array([[0, 9, 3]]))[0]), t2n(m(torch.tensor([[0, 9, 3]]))))
    if not g.backend.cheap_host_reads:
        return
    for bad in (-1, 10):
        with pytest.raises(kuiper_xp.errors.ShapeError, match=f"index {bad} is out of range"):
            g(np.array([[1, bad, 2]]))
        with pytest.raises(IndexError):
            m(torch.tensor([[1, bad, 2]]))


# ---- pnnx end to end ------------------------------------------------------------------------------


class AttentionModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_bf = nn.MultiheadAttention(16, 4, batch_first=True)
        self.cross = nn.MultiheadAttention(16, 4, batch_first=True)
        self.seq_first = nn.MultiheadAttention(16, 2, batch_first=False, bias=False)
        self.masked = nn.MultiheadAttention(16, 4, batch_first=True)
        self.emb = nn.Embedding(50, 16)

    def forward(self, x, y, xs, mask, causal_f, q4, k4, v4, tok, w3):
        a, _ = self.self_bf(x, x, x, need_weights=False)
        b, bw = self.cross(x, y, y)
        c, _ = self.seq_first(xs, xs, xs, attn_mask=mask, need_weights=False)
        d, dw = self.masked(x, x, x, attn_mask=causal_f > 0.5, average_attn_weights=False)
        e = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)
        f = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=0.3)
        g = self.emb(tok)
        h = torch.bmm(x, w3) + torch.matmul(x, w3[0])
        i = torch.einsum("bld,bmd->blm", x, y)
        return a, b, bw, c, d, dw, e, f, g, h, i


@pytest.fixture(scope="session")
def attention_export(tmp_path_factory):
    torch.manual_seed(0)
    module = AttentionModule().eval()
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    xs = torch.randn(5, 2, 16)
    mask = torch.randn(5, 5)
    causal_f = torch.triu(torch.ones(5, 5), 1)
    q4, k4, v4 = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    tok = torch.randint(0, 50, (2, 5))
    inputs = (x, y, xs, mask, causal_f, q4, k4, v4, tok, torch.randn(2, 16, 3))
    return export_module(module, inputs, tmp_path_factory.mktemp("attention")), module, inputs


def test_attention_export_matches_torch(attention_export, model_backend):
    param, module, inputs = attention_export
    text = param.read_text()
    for t in ("nn.MultiheadAttention", "batch_first=True", "$attn_mask=", "F.scaled_dot_product_attention",
              "is_causal=True", "scale=0.3", "nn.Embedding", "torch.einsum"):
        assert t in text, f"pnnx no longer emits {t}"
    require_types(param)
    compare_graph(param, model_backend, module, inputs, rtol=1e-4)


class BufferMaskAttention(nn.Module):
    """CLIP's text encoder keeps its causal mask in a buffer: pnnx makes it a pnnx.Attribute and
    lists it before the query among the attention's inputs."""

    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(16, 4, batch_first=True)
        self.register_buffer("mask", torch.full((6, 6), float("-inf")).triu(1))

    def forward(self, x):
        return self.att(x, x, x, need_weights=False, attn_mask=self.mask)[0]


def test_attention_with_a_mask_buffer_matches_torch(model_backend, tmp_path):
    torch.manual_seed(0)
    module = BufferMaskAttention().eval()
    inputs = (torch.randn(2, 6, 16),)
    param = export_module(module, inputs, tmp_path, inputs2=(torch.randn(3, 6, 16),))
    line = next(t for t in param.read_text().splitlines() if t.startswith("nn.MultiheadAttention"))
    assert "$attn_mask=" in line and len(line.split()[4:6]) == 2, line
    compare_graph(param, model_backend, module, inputs, rtol=1e-4)
    compare_graph(param, model_backend, module, (torch.randn(4, 6, 16),), rtol=1e-4)


class CausalDecoder(nn.Module):
    """nn.TransformerDecoder with generate_square_subsequent_mask: torch detects the mask as
    causal and pnnx then drops it, unless tgt_is_causal=False is passed (README)."""

    def __init__(self, keep_mask):
        super().__init__()
        self.keep_mask = keep_mask
        layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, 1)

    def forward(self, tgt, memory):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.dec(tgt, memory, tgt_mask=mask, tgt_is_causal=False if self.keep_mask else None)


@pytest.mark.parametrize("keep_mask", [False, True])
def test_causal_decoder_mask_needs_tgt_is_causal_false(keep_mask, tmp_path):
    torch.manual_seed(0)
    module = CausalDecoder(keep_mask).eval()
    inputs = (torch.randn(2, 7, 16), torch.randn(2, 9, 16))
    param = export_module(module, inputs, tmp_path)
    line = next(t for t in param.read_text().splitlines() if t.split()[1:2] == ["dec.layers.0.self_attn"])
    n_inputs = int(line.split()[2])
    if not keep_mask:  # what the README warns about: the mask is gone from the file
        assert n_inputs == 1, f"pnnx now keeps the detected causal mask (update the README): {line[:120]}"
        return
    assert n_inputs == 2, line[:120]
    compare_graph(param, "numpy", module, inputs, rtol=1e-4)


class EncoderStack(nn.Module):
    """nn.TransformerEncoder in eval mode: torch traces its fused inference path, which pnnx keeps
    as aten::_transformer_encoder_layer_fwd (post-norm ReLU layers, then a pre-norm GELU one)."""

    def __init__(self):
        super().__init__()
        post = nn.TransformerEncoderLayer(16, 4, 40, dropout=0.0, batch_first=True, norm_first=False)
        pre = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, activation="gelu", batch_first=True,
                                         norm_first=True, layer_norm_eps=1e-3)
        self.post = nn.TransformerEncoder(post, 2, enable_nested_tensor=False)
        self.pre = nn.TransformerEncoder(pre, 1, enable_nested_tensor=False)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():  # the stacked copies start equal and the norms at 1/0: make them differ
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim > 1 else 0.5) + (1.0 if p.ndim == 1 and p.shape[0] == 16 else 0.0))

    def forward(self, x):
        return self.pre(self.post(x))


@pytest.fixture(scope="session")
def encoder_export(tmp_path_factory):
    module = EncoderStack().eval()
    x, x2 = torch.randn(2, 7, 16), torch.randn(3, 7, 16)
    return export_module(module, (x,), tmp_path_factory.mktemp("encoder"), inputs2=(x2,)), module, x, x2


def test_fused_transformer_encoder_layer_matches_torch(encoder_export, model_backend):
    param, module, x, x2 = encoder_export
    assert param.read_text().count("aten::_transformer_encoder_layer_fwd") == 3, "pnnx no longer emits the fused op"
    compare_graph(param, model_backend, module, (x,), rtol=1e-4)
    compare_graph(param, model_backend, module, (x2,), rtol=1e-4)  # the batch is dynamic


def test_fused_transformer_encoder_layer_errors(encoder_export):
    """A key-padding mask or an attention mask that does not fit, and a src that does not fit
    embed_dim, are clear errors naming the op."""
    import kuiper_xp
    from kuiper_xp.errors import ShapeError

    param = encoder_export[0]
    g = kuiper_xp.load(param, backend="numpy")
    step = next(r for r in g.execution_order if r.type == "aten::_transformer_encoder_layer_fwd")
    args = [np.zeros((2, 7, 16), np.float32), 16, 4] + [np.zeros(1, np.float32)] * 17
    args[7:10] = [True, False, 1e-5]
    args[18], args[19] = np.zeros((2, 6), bool), 1  # a key-padding mask (mask_type 1)
    with pytest.raises(ShapeError, match=r"key-padding mask of shape \(2, 6\) does not fit \(batch, seq\) = \(2, 7\)"):
        step.layer.forward(*args)
    args[18] = np.zeros((2, 7), bool)
    args[19] = 0  # an attention mask that does not fit (L, L)
    with pytest.raises(ShapeError, match=r"attention mask of shape \(2, 7\) does not fit"):
        step.layer.forward(*args)
    args[18], args[0] = None, np.zeros((2, 7, 12), np.float32)
    with pytest.raises(ShapeError, match=r"\(2, 7, 12\) does not fit embed_dim=16"):
        step.layer.forward(*args)


class PaddedEncoder(nn.Module):
    """Token ids with 0 as padding: ``src_key_padding_mask=ids == 0`` alone reaches the fused
    layer as a key-padding mask (mask_type 1); a stack passes it to each of its layers."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.one = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, batch_first=True, norm_first=True)
        self.stack = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, ids):
        pad = ids == 0
        return self.stack(self.one(self.emb(ids), src_key_padding_mask=pad), src_key_padding_mask=pad)


def test_fused_encoder_layer_takes_a_key_padding_mask(tmp_path, model_backend):
    torch.manual_seed(0)
    module = PaddedEncoder().eval()
    ids = torch.tensor([[5, 9, 3, 2, 0, 0, 0, 0]])
    ids3 = torch.tensor([[7, 1, 4, 0, 0, 0, 0, 0], [3, 3, 8, 9, 2, 6, 5, 1], [4, 2, 2, 2, 2, 0, 0, 0]])
    param = export_module(module, (ids,), tmp_path, inputs2=(ids3,))
    assert param.read_text().count("aten::_transformer_encoder_layer_fwd") == 3, "pnnx no longer emits the fused op"
    compare_graph(param, model_backend, module, (ids,), rtol=1e-4)
    compare_graph(param, model_backend, module, (ids3,), rtol=1e-4)


class CausalEncoder(nn.Module):
    """A CLIP-text-like encoder: a causal src_mask through the fused path (torch merges it to
    (N, H, L, L), mask_type 2), pre-norm, pooled at each sequence's largest token id."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, ids):
        mask = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)
        x = self.enc(self.emb(ids), mask=mask)
        return x[torch.arange(x.shape[0]), ids.argmax(dim=-1)]


def test_fused_transformer_encoder_layer_with_a_causal_mask(model_backend, tmp_path):
    torch.manual_seed(0)
    module, ids = CausalEncoder().eval(), torch.randint(0, 50, (3, 9))
    param = export_module(module, (ids,), tmp_path)
    assert "aten::_transformer_encoder_layer_fwd" in param.read_text(), "pnnx no longer emits the fused op"
    compare_graph(param, model_backend, module, (ids,), rtol=1e-4)


def _sdpa_ref(q, k, v, scale, mask=None):
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)]
    m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    return F.scaled_dot_product_attention(*t, attn_mask=m, scale=scale).numpy()


@pytest.mark.parametrize("case", ["vit_b8", "one_item_split_heads", "3d", "5d", "mask_keys", "mask_full",
                                  "big_scores", "all_masked_row", "float64", "cross_lengths",
                                  "item_blocks", "item_blocks_mask", "item_blocks_big_scores",
                                  "split_rows", "split_rows_mask_scale1"])
@pytest.mark.parametrize("nn_copy", [True, False], ids=["kT_copied", "kT_view"])
def test_numpy_fast_attention(case, nn_copy, monkeypatch):
    """numpy_fast.attention (the fused per-block path of MultiheadAttention/SDPA) against torch's
    scaled_dot_product_attention: strided per-head views of one fused QKV tensor, heads split over
    3 threads when there are fewer items than threads, several blocks per thread, masks, scores
    past the no-shift range, a row with every key masked (NaN, as the generic path), float64;
    ``item_blocks*``: all heads of two items per block, one stacked product per block (Swin's
    windows), 7 items so the last block is short; ``split_rows*``: one item with fewer blocks of
    heads than threads, each thread taking every head for a third of 41 query rows (timm's
    ViT-Tiny), with a full (heads, L, S) mask sliced by rows and a scale of 1 (none applied).
    Both ways of reading k: copied as k^T (N-N products, the scale folded in) and as a
    transposed view (the scale on the scores)."""
    from kuiper_xp.backends import numpy_fast as nf

    from kuiper_xp.layers.attention import attend

    monkeypatch.setattr(nf, "ATTENTION_NN_COPY", nn_copy)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    monkeypatch.setattr(nf, "ATTENTION_BLOCK_BYTES", 3 * 7 * 9 * 4)  # blocks of 3 heads
    rng = np.random.default_rng(11)
    dt = np.float64 if case == "float64" else np.float32
    n, h, lq, s, d = 4, 5, 7, 9, 8
    if case == "one_item_split_heads":
        n = 1
    if case.startswith("item_blocks"):
        n = 7
        monkeypatch.setattr(nf, "ATTENTION_BLOCK_BYTES", 2 * h * lq * s * 4)
    lead, mask, scale = (n, h), None, 0.3
    if case.startswith("split_rows"):
        n, h, lq, lead = 1, 2, 41, (1, 2)
        monkeypatch.setattr(nf, "ATTENTION_BLOCK_BYTES", 1 << 20)
    if case == "split_rows_mask_scale1":
        mask, scale = rng.standard_normal((h, lq, s)).astype(dt), 1.0
    if case == "cross_lengths":
        lq, s = 3, 11
    if case == "3d":
        lead = (h,)
    if case == "5d":
        lead = (2, n, h)
    qkv = rng.standard_normal(lead[:-1] + (max(lq, s), 3, lead[-1], d)).astype(dt)
    q = np.moveaxis(qkv[..., :lq, 0, :, :], -2, -3)  # (..., H, L, D) strided views, as MHA makes
    k = np.moveaxis(qkv[..., :s, 1, :, :], -2, -3)
    v = np.moveaxis(qkv[..., :s, 2, :, :], -2, -3)
    if case in ("big_scores", "item_blocks_big_scores"):
        q = q * 40.0
    if case in ("mask_keys", "item_blocks_mask"):
        mask = np.where(rng.random((n, 1, 1, s)) < 0.3, -np.inf, 0.0).astype(dt)
    if case == "mask_full":
        mask = rng.standard_normal((lq, s)).astype(dt)
    if case == "all_masked_row":
        mask = np.zeros((n, h, lq, s), dt)
        mask[1, 2, 3] = -np.inf
    scores = []
    real_ws = nf._workspace

    def spy(shape, dtype, slot=0):
        if slot == 50:
            scores.append(tuple(shape))
        return real_ws(shape, dtype, slot)
    monkeypatch.setattr(nf, "_workspace", spy)
    old = nf.set_num_threads(3)
    try:
        with nf.compute_scope():
            got = nf.attention(q, k, v, scale, mask)
            generic = attend(np, q, k, v, scale, mask)[0]
    finally:
        nf.set_num_threads(old)
    assert got.shape == q.shape[:-1] + (d,)
    if case.startswith("item_blocks"):  # blocks of (items, heads, L, S) scores: 2, 2, 2, 1 items
        assert sorted(sc[0] for sc in scores) == [1, 2, 2, 2] and all(len(sc) == 4 for sc in scores), scores
    if case.startswith("split_rows"):  # both heads, 13 + 14 + 14 query rows
        assert sorted(scores) == [(2 * 13, s), (2 * 14, s), (2 * 14, s)], scores
    # relative to the largest output; scores of +-300 (big_scores) make float32 softmax sensitive
    # to the order of the scale and the shift (torch differs from the generic path as much)
    rtol = 1e-12 if dt == np.float64 else 1e-4 if case.endswith("big_scores") else 2e-6
    want = _sdpa_ref(q, k, v, scale, mask)
    if case == "all_masked_row":
        assert np.isnan(got[1, 2, 3]).all() and np.isnan(generic[1, 2, 3]).all()  # as torch's MHA
        got, want, generic = got.copy(), want.copy(), generic.copy()
        got[1, 2, 3] = want[1, 2, 3] = generic[1, 2, 3] = 0
    assert_close(got, generic, rtol=rtol, what="against the generic path")
    assert_close(got, want, rtol=rtol, what="against torch")


@pytest.mark.parametrize("masked", ["none", "mask", "drop"])
def test_numpy_fast_attention_with_several_item_axes(masked):
    """(batch, windows, heads, N, d) operands (Twins, NesT) are merged into one item axis: the
    same values as torch's softmax attention, a (windows, 1, N, N) mask broadcast over the batch."""
    from kuiper_xp.backends import numpy_fast as nf

    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((3, 5, 2, 7, 4)).astype(np.float32) for _ in range(3))
    mask = drop = None
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    w = tq @ tk.transpose(-1, -2) * 0.5
    if masked == "mask":
        mask = np.where(rng.random((5, 1, 7, 7)) < 0.3, -100.0, 0.0).astype(np.float32)
        w = w + torch.from_numpy(mask)
    elif masked == "drop":
        drop = rng.random((5, 1, 7, 7)) < 0.3
        w = w.masked_fill(torch.from_numpy(drop), -1e9)
    want = torch.softmax(w, -1) @ tv
    old = nf.set_num_threads(2)
    try:
        with nf.compute_scope():
            got = nf.attention(q, k, v, 0.5, mask, drop, -1e9)
    finally:
        nf.set_num_threads(old)
    assert got is not None and got.shape == (3, 5, 2, 7, 4)
    assert_close(got, want.numpy(), rtol=1e-5)


def test_numpy_fast_attention_declines():
    from kuiper_xp.backends import numpy_fast as nf

    a = np.zeros((2, 3, 4, 5), np.float32)
    assert nf.attention(a, a, a.astype(np.float64), 1.0) is None
    assert nf.attention(a, a[..., :3, :], a, 1.0) is None  # key and value lengths differ
    assert nf.attention(a, a, a, 1.0, np.zeros((3, 4), np.float32)) is None  # mask does not broadcast
    assert nf.attention(a, a, a, 1.0, np.zeros((4, 4), bool)) is None  # bool masks: converted by the caller
    assert nf.attention(a[0, 0], a[0, 0], a[0, 0], 1.0) is None  # 2-D: no heads


# ---- explicit attention written as operators: one fused step on numpy ---------------------------


class ExplicitAttention(nn.Module):
    """Attention the way timm and BERT-style code write it, which pnnx keeps as separate
    operators: ``a`` scales q first (timm), ``b`` divides the scores and adds a padding mask (BERT),
    ``c`` scales the scores with softmax over dim=3, ``d`` shares one key/value set across the
    batch (a broadcasting product, which the fast path declines), ``e`` also returns its scores
    (so the chain must not be fused)."""

    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def split(self, x):
        n, length, _ = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)

    def forward(self, x, pad, kv):
        q, k, v = self.split(x)
        a = torch.matmul(q * self.d ** -0.5, k.transpose(-2, -1)).softmax(dim=-1) @ v
        # (distinct operands throughout: pnnx merges equal products into one with several users)
        b = F.softmax(torch.matmul(q + 1, k.transpose(-2, -1)) / 4.0 + pad, dim=-1) @ v
        c = torch.matmul(torch.softmax(torch.matmul(q - 1, k.transpose(-2, -1)) * 0.3, dim=3), v)
        ks, vs = kv[:1, 0], kv[1:, 0]
        d = torch.matmul(torch.softmax(torch.matmul(q * 2, ks.transpose(-2, -1)), dim=-1), vs)
        scores = torch.matmul(q * 3, k.transpose(-2, -1))
        e = torch.matmul(scores.softmax(-1), v)
        return a, b, c, d, e, scores


@pytest.fixture(scope="session")
def explicit_attention_export(tmp_path_factory):
    torch.manual_seed(0)
    module = ExplicitAttention().eval()
    x = torch.randn(2, 41, 24)
    pad = torch.where(torch.rand(2, 1, 1, 41) < 0.2, -1e4, 0.0)
    kv = torch.randn(2, 1, 3, 41, 8)
    param = export_module(module, (x, pad, kv), tmp_path_factory.mktemp("explicit_attention"))
    return param, module, (x, pad, kv)


def test_explicit_attention_fused_matches_torch(explicit_attention_export, model_backend):
    """On numpy the chains a-d run as one step each (e keeps its own: its scores are an output)
    and match torch, as does every backend and the unfused graph."""
    import kuiper_xp

    param, module, inputs = explicit_attention_export
    require_types(param)
    compare_graph(param, model_backend, module, inputs, rtol=1e-4)
    g = kuiper_xp.load(param, backend=model_backend)
    if getattr(g.backend.fast, "attention", None) is None:
        assert g.fused_attention == []
        return
    chains = sorted(g.fused_attention)
    assert len(chains) == 4, chains
    assert sum(len(c) == 4 for c in chains) == 2  # b and c: a score expression between
    plain = kuiper_xp.load(param, backend=model_backend, fuse=False)
    assert plain.fused_attention == []
    assert len(plain.execution_order) - len(g.execution_order) == len(g.fused) + sum(len(c) - 1 for c in chains)
    xs = [t2n(t) for t in inputs]
    for a, b in zip(g(*xs), plain(*xs)):
        assert_close(kuiper_xp.to_numpy(a), kuiper_xp.to_numpy(b), rtol=1e-5)


class BmmAttention(nn.Module):
    """HuggingFace's CLIP / BART attention without a mask: heads folded into the batch,
    ``torch.bmm`` for both products. (With BART's mask the scores are viewed to 4-D and back
    around the addition, which the fusion does not follow.)"""

    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def qkv(self, x):
        """q, k, v of x (n, length, dim) with the heads folded into the batch."""
        n, length, _ = x.shape

        def heads(t):
            return t.view(n, length, self.h, self.d).transpose(1, 2).reshape(n * self.h, length, self.d)
        return heads(self.q(x)), heads(self.k(x)), heads(self.v(x))

    def forward(self, x):
        n, length, _ = x.shape
        q, k, v = self.qkv(x)
        w = torch.bmm(q, k.transpose(1, 2)) * self.d ** -0.5
        return torch.bmm(F.softmax(w, dim=-1), v).view(n, self.h, length, self.d)


def test_bmm_attention_is_fused_and_matches_torch(tmp_path, model_backend):
    import kuiper_xp

    torch.manual_seed(0)
    module = BmmAttention().eval()
    x = torch.randn(2, 17, 24)
    param = export_module(module, (x,), tmp_path)
    assert "torch.bmm" in param.read_text()
    compare_graph(param, model_backend, module, (x,), rtol=1e-4)
    g = kuiper_xp.load(param, backend=model_backend)
    if getattr(g.backend.fast, "attention", None) is not None:
        assert len(g.fused_attention) == 1 and "torch.bmm" in " ".join(
            op.type for op in g.model.operators if op.name in g.fused_attention[0]), g.fused_attention


class EinsumAttention(nn.Module):
    """LDM / Stable Diffusion's CrossAttention: ``einsum('b i d, b j d -> b i j', q, k) * scale``,
    softmax, ``einsum('b i j, b j d -> b i d', attn, v)``, heads folded into the batch; over a
    context of another length (cross) and over x itself (self), plus a chain whose scores go
    through an einsum taking the keys already transposed."""

    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(16, dim), nn.Linear(16, dim)
        self.k2, self.v2 = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def heads(self, t):
        n, length, _ = t.shape
        return t.reshape(n, length, self.h, self.d).permute(0, 2, 1, 3).reshape(n * self.h, length, self.d)

    def forward(self, x, ctx):
        q = self.heads(self.q(x))
        k, v = self.heads(self.k(ctx)), self.heads(self.v(ctx))
        cross = torch.einsum("b i j, b j d -> b i d",
                             torch.einsum("b i d, b j d -> b i j", q, k).mul(self.d ** -0.5).softmax(dim=-1), v)
        k2, v2 = self.heads(self.k2(x)), self.heads(self.v2(x))
        own = torch.einsum("bij,bjd->bid", torch.einsum("bid,bdj->bij", q * 0.3, k2.transpose(1, 2)).softmax(-1), v2)
        return cross, own


def test_einsum_attention_is_fused_and_matches_torch(tmp_path, model_backend):
    import kuiper_xp

    torch.manual_seed(0)
    module = EinsumAttention().eval()
    x, ctx = torch.randn(2, 33, 24), torch.randn(2, 9, 16)
    param = export_module(module, (x, ctx), tmp_path, inputs2=(torch.randn(3, 33, 24), torch.randn(3, 9, 16)))
    assert sum(t.startswith("torch.einsum ") for t in param.read_text().splitlines()) == 4
    compare_graph(param, model_backend, module, (x, ctx), rtol=1e-4)
    g = kuiper_xp.load(param, backend=model_backend)
    if getattr(g.backend.fast, "attention", None) is None:
        assert g.fused_attention == []
        return
    assert len(g.fused_attention) == 2, g.fused_attention
    plain = kuiper_xp.load(param, backend=model_backend, fuse=False)
    xs = (t2n(x), t2n(ctx))
    for a, b in zip(g(*xs), plain(*xs)):
        assert_close(kuiper_xp.to_numpy(a), kuiper_xp.to_numpy(b), rtol=1e-5)


class LdmAttnBlock(nn.Module):
    """taming-transformers / LDM's AttnBlock (the VAE's mid-block): GroupNorm, 1x1 q/k/v, then
    ``w = bmm(q.permute(0, 2, 1), k) * c**-0.5``, softmax over dim 2, ``bmm(v, w.permute(0, 2, 1))``:
    the probabilities reach the second product transposed."""

    def __init__(self, c=32):
        super().__init__()
        self.norm = nn.GroupNorm(8, c)
        self.q, self.k, self.v, self.o = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        b, c, hh, ww = q.shape
        q = q.reshape(b, c, hh * ww).permute(0, 2, 1)
        w = torch.bmm(q, k.reshape(b, c, hh * ww)) * (int(c) ** (-0.5))
        w = F.softmax(w, dim=2)
        out = torch.bmm(v.reshape(b, c, hh * ww), w.permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + self.o(out)


def test_ldm_attention_block_is_fused_and_matches_torch(tmp_path, model_backend):
    import kuiper_xp

    torch.manual_seed(0)
    module = LdmAttnBlock().eval()
    x = torch.randn(1, 32, 12, 10)
    param = export_module(module, (x,), tmp_path, inputs2=(torch.randn(2, 32, 12, 10),))
    compare_graph(param, model_backend, module, (x,), rtol=1e-4)
    g = kuiper_xp.load(param, backend=model_backend)
    if getattr(g.backend.fast, "attention", None) is None:
        assert g.fused_attention == []
        return
    assert len(g.fused_attention) == 1 and len(g.fused_attention[0]) == 5, g.fused_attention  # (permute in)
    x2 = t2n(torch.randn(2, 32, 12, 10))
    plain = kuiper_xp.load(param, backend=model_backend, fuse=False)
    assert_close(kuiper_xp.to_numpy(g(x2)[0]), kuiper_xp.to_numpy(plain(x2)[0]), rtol=1e-5)


class BaddbmmAttention(BmmAttention):
    """diffusers' AttnProcessor: heads folded into the batch, the scores as
    ``torch.baddbmm(torch.empty(...), q, k^T, beta=0, alpha=scale)``, softmax, ``torch.bmm``."""

    def __init__(self, dim=32, heads=4):
        super().__init__(dim, heads)

    def forward(self, x):
        length = x.shape[1]
        q, k, v = self.qkv(x)
        empty = torch.empty(q.shape[0], length, length, dtype=q.dtype)
        scores = torch.baddbmm(empty, q, k.transpose(-1, -2), beta=0, alpha=self.d ** -0.5)
        return torch.bmm(scores.softmax(dim=-1), v)


def test_baddbmm_attention_is_fused_and_matches_torch(tmp_path, model_backend):
    import kuiper_xp
    from kuiper_xp.layers.attention import FusedAttention

    torch.manual_seed(0)
    module = BaddbmmAttention().eval()
    x = torch.randn(1, 20, 32)
    param = export_module(module, (x,), tmp_path, inputs2=(torch.randn(2, 20, 32),))
    assert "torch.baddbmm" in param.read_text()
    compare_graph(param, model_backend, module, (x,), rtol=1e-4)
    g = kuiper_xp.load(param, backend=model_backend)
    if getattr(g.backend.fast, "attention", None) is None:
        assert g.fused_attention == []
        return
    assert len(g.fused_attention) == 1, g.fused_attention
    step = next(r for r in g.execution_order if isinstance(r.layer, FusedAttention))
    x2 = t2n(torch.randn(2, 20, 32))
    fast = kuiper_xp.to_numpy(g(x2)[0]).copy()
    step.layer._attention = None  # the original layers, in order (its ignored input given q)
    assert_close(kuiper_xp.to_numpy(g(x2)[0]), fast, rtol=1e-5)
    with torch.no_grad():
        assert_close(fast, module(torch.from_numpy(x2)).numpy(), rtol=1e-4)


def test_einsum_attention_forms():
    from kuiper_xp.layers.attention import einsum_attention_form as form

    assert form("b i d, b j d -> b i j", False) == "k" and form("bhqd,bhkd->bhqk", False) == "k"
    assert form("bid,bdj->bij", False) == "kt" and form("bij,bjd->bid", True) == "kt"
    for eq, second in (("bid,bjd->bij", True), ("bid,bje->bij", False), ("bhid,bhjd->bhji", False),
                       ("id,jd->ij", False), ("bii,bid->bid", True), ("...id,...jd->...ij", False)):
        assert form(eq, second) is None, eq


def test_explicit_attention_fused_step_falls_back_and_names_its_ops(explicit_attention_export):
    """The fused step runs the original layers where the fast path declines (the shared key set of
    ``d`` broadcasts; a key of the wrong depth, which then gets the product's own error)."""
    import kuiper_xp
    from kuiper_xp.layers.attention import FusedAttention

    param, _, inputs = explicit_attention_export
    g = kuiper_xp.load(param, backend="numpy")
    steps = [r for r in g.execution_order if isinstance(r.layer, FusedAttention)]
    assert len(steps) == 4
    calls = []
    for r in steps:
        real = r.layer._fast
        r.layer._fast = lambda *a, real=real: calls.append(real(*a)) or calls[-1]
    g(*[t2n(t) for t in inputs])
    assert sum(c is None for c in calls) == 1  # d: k of batch 1 against q of batch 2
    layer = steps[0].layer
    assert layer.names[-1] == steps[0].name and len(layer.names) in (3, 4)
    q = np.zeros((2, 3, 41, 8), np.float32)
    mask = [np.zeros((2, 1, 1, 41), np.float32)] if layer.has_mask else []
    with pytest.raises(ValueError, match="size 7 is different from 8"):  # (the runtime adds the op)
        layer.forward(q, np.zeros((2, 3, 7, 41), np.float32), q, *mask)


@pytest.mark.parametrize("name", ["gpt", "detr_lite", "gpt2_hf", "albert"])
def test_benchmark_transformers_match_torch(model_backend, tmp_path, name):
    """benchmarks/more_models.py's GPT-style decoder (causal mask from torch.tril and
    masked_fill(-inf), tanh GELU), DETR-style head (nn.TransformerEncoderLayer and
    nn.TransformerDecoderLayer over learned queries, two outputs), Hugging Face-style GPT-2
    (Conv1D as torch.addmm, a sliced causal-mask buffer in torch.where, torch.pow(x, 3.0)) and
    ALBERT (one layer applied three times: shared weights), small, exported by pnnx and run
    against torch at batch 2."""
    from helpers import more_models

    more = more_models()
    torch.manual_seed(0)
    if name == "gpt":
        model, x = more.GPT(d=64, heads=4, depth=2).eval(), torch.randn(2, 24, 64)
    elif name == "gpt2_hf":
        model, x = more.GPT2(vocab=100, d=64, h=4, layers=2, max_pos=32).eval(), torch.randint(0, 100, (2, 20))
    elif name == "albert":
        model, x = more.Albert(vocab=100, e=32, d=64, repeat=3).eval(), torch.randint(0, 100, (2, 20))
    else:
        model, x = more.DetrLite(d=64, queries=10).eval(), torch.randn(2, 3, 64, 64)
    param = export_module(model, (x,), tmp_path)
    compare_graph(param, model_backend, model, (x,), rtol=1e-4)


class ReplacedScores(nn.Module):
    """Masks written as replacements between the scores and the softmax: GPT-2's
    ``torch.where(causal, w, -1e4)`` (with whole rows masked by a padding input: those rows are
    uniform), ``masked_fill(mask, -inf)``, and ``where(cond, fill, w)`` with the fill a 0-d
    tensor."""

    def __init__(self, dim=16, heads=2, max_pos=32):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.register_buffer("causal", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool)).view(
            1, 1, max_pos, max_pos))

    def forward(self, x, keep):
        n, t, _ = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.h, self.d).permute(2, 0, 3, 1, 4).unbind(0)
        w = torch.matmul(q, k.transpose(-1, -2)) / (float(self.d) ** 0.5)
        rows = self.causal[:, :, :t, :t] & (keep[:, None, :, None] > 0)  # whole rows dropped
        a = torch.matmul(torch.where(rows, w, torch.full([], -1e4, dtype=w.dtype)).softmax(-1), v)
        w2 = torch.matmul(q + 1, k.transpose(-1, -2))
        b = torch.matmul(w2.masked_fill(~self.causal[:, :, :t, :t], float("-inf")).softmax(-1), v)
        w3 = torch.matmul(q * 2, k.transpose(-1, -2)) * 0.5
        c = torch.matmul(torch.where(~self.causal[:, :, :t, :t], torch.full([], -1e9), w3).softmax(-1), v)
        return a, b, c


def test_replaced_scores_fused_match_torch(model_backend, tmp_path):
    """On numpy the three chains run as one step each, the replacement inside (rows masked
    whole give torch's uniform weights); every backend and the unfused graph match torch."""
    import kuiper_xp

    torch.manual_seed(0)
    module = ReplacedScores().eval()
    x, keep = torch.randn(2, 12, 16), torch.tensor([[1] * 9 + [0] * 3, [1] * 12])
    x2, keep2 = torch.randn(3, 12, 16), torch.tensor([[1] * 12, [0] * 12, [1] * 5 + [0] * 7])
    param = export_module(module, (x, keep), tmp_path, inputs2=(x2, keep2))
    compare_graph(param, model_backend, module, (x2, keep2), rtol=1e-5)
    g = kuiper_xp.load(param, backend=model_backend)
    if getattr(g.backend.fast, "attention", None) is None:
        return
    chains = g.fused_attention
    assert len(chains) == 3 and all(len(c) in (4, 5) for c in chains), chains
    assert {c[-3].split("_")[0] for c in chains} >= {"torch.where", "Tensor.masked"}, chains
    from kuiper_xp.layers.attention import FusedAttention

    calls = []
    for r in g.execution_order:
        if isinstance(r.layer, FusedAttention):
            real = r.layer._fast
            r.layer._fast = lambda *a, real=real: calls.append(real(*a)) or calls[-1]
    plain = kuiper_xp.load(param, backend=model_backend, fuse=False)
    for a, b in zip(g(x2.numpy(), keep2.numpy()), plain(x2.numpy(), keep2.numpy())):
        assert_close(kuiper_xp.to_numpy(a), kuiper_xp.to_numpy(b), rtol=1e-5)
    assert len(calls) == 3 and all(c is not None for c in calls)  # the fast path took all three


class _FillOfHigherRank(nn.Module):
    """``torch.where(cond, scores, fill)`` whose one-element fill has more dimensions than the
    scores: torch broadcasts the result (and so the attention output) up to the fill's rank."""

    def forward(self, q, k, v, mraw):
        w = q @ k.transpose(-1, -2)
        fill = (mraw.sum() * 0 - 7.0).reshape(1, 1, 1, 1, 1)
        return torch.softmax(torch.where(mraw > 0, w, fill), -1) @ v


def test_replaced_scores_with_a_fill_of_higher_rank(model_backend, tmp_path):
    """The fused step took such a fill for a number and returned the 4-D result (a ShapeError
    against the declared 5-D one); it now leaves the chain to the original layers."""
    torch.manual_seed(0)
    m = _FillOfHigherRank().eval()
    make = lambda b: (torch.randn(b, 2, 5, 4), torch.randn(b, 2, 5, 4), torch.randn(b, 2, 5, 3),  # noqa: E731
                      torch.randn(b, 1, 5, 5))
    param = export_module(m, make(1), tmp_path, inputs2=make(3))
    compare_graph(param, model_backend, m, make(3), rtol=1e-5)


class LonePaddingMask(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.m = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q, k, pad):
        return self.m(q, k, k, key_padding_mask=pad > 0.5, need_weights=False)[0]


def _lone_mask_inputs(n, length, s=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    pad = torch.zeros(n, s)
    pad[:, 2:] = 1.0
    pad[0, 1] = 1.0
    return torch.randn(n, length, 8, generator=g), torch.randn(n, s, 8, generator=g), pad


def test_mha_lone_key_padding_mask_read_by_declared_shapes(tmp_path):
    """A lone (N, S) key_padding_mask when the batch equals the query length at run time: the
    file's declared shapes (a dynamic batch, exported at N != L) say which mask it is."""
    module = LonePaddingMask().eval()
    param = export_module(module, _lone_mask_inputs(3, 2), tmp_path, inputs2=_lone_mask_inputs(4, 2, seed=1))
    g = kuiper_xp.load(param, backend="numpy")
    q, k, pad = _lone_mask_inputs(2, 2, seed=2)  # N == L == 2
    with torch.no_grad():
        want = module(q, k, pad).numpy()
    assert_close(g(q.numpy(), k.numpy(), pad.numpy())[0], want, rtol=1e-5)


def test_mha_lone_ambiguous_mask_warns(tmp_path):
    """Exported with N == L and a static batch: nothing tells the two masks apart; the layer
    takes attn_mask, as documented, and says so once."""
    module = LonePaddingMask().eval()
    inputs = _lone_mask_inputs(2, 2)
    param = export_module(module, inputs, tmp_path)
    g = kuiper_xp.load(param, backend="numpy")
    with pytest.warns(UserWarning, match="may be a key_padding_mask"):
        g(*[a.numpy() for a in inputs])


class _NegativePaddingIdx(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(10, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return F.embedding(x, self.w, padding_idx=-1) * 2


def test_aten_embedding_of_a_negative_padding_idx(model_backend, tmp_path):
    """F.embedding(padding_idx=-1) is left as aten::embedding(weight, indices, ...)."""
    x = torch.randint(0, 10, (2, 3), generator=torch.Generator().manual_seed(1))
    param = export_module(_NegativePaddingIdx(), (x,), tmp_path)
    assert "aten::embedding" in param.read_text()
    compare_graph(param, model_backend, _NegativePaddingIdx(), (x,))
    from kuiper_xp.errors import ShapeError

    g = kuiper_xp.load(param, backend=model_backend)
    with pytest.raises(ShapeError, match="out of range"):
        kuiper_xp.to_numpy(g(np.array([[1, 10, 2], [0, 0, 0]]))[0])


def test_bare_recurrent_module_refusal_says_to_wrap_it(tmp_path):
    from kuiper_xp.errors import UnsupportedOperatorError

    param = export_module(nn.GRU(4, 5), (torch.randn(3, 2, 4),), tmp_path)
    with pytest.raises(UnsupportedOperatorError, match="wrap it in a parent nn.Module"):
        kuiper_xp.load(param, backend="numpy")


class WeightsFirst(nn.Module):
    """need_weights=True with the weights read before the output, or alone: pnnx lists the
    outputs in the order of first use (``#1`` the weights), with a dynamic token count ``(?,?,?)``."""

    def __init__(self, both: bool, per_head: bool = False):
        super().__init__()
        self.a = nn.MultiheadAttention(8, 2, batch_first=True)
        self.both, self.per_head = both, per_head

    def forward(self, x):
        y, w = self.a(x, x, x, need_weights=True, average_attn_weights=not self.per_head)
        return (w * 2, y + 1) if self.both else w * 2


@pytest.mark.parametrize("both,per_head,t2", [(False, False, 7), (False, False, 5), (True, False, 7),
                                              (True, True, 7), (False, True, 5)])
def test_mha_outputs_in_order_of_use(tmp_path, both, per_head, t2):
    """kuiper-xp took output 0 as attn_output: it returned (1, 5, 8) for the weights (dynamic
    tokens: silently), or stopped on the declared (?, 5, 5). Outputs are now told apart by their
    declared shapes; at batch 1 and 2, against torch."""
    torch.manual_seed(0)
    m = WeightsFirst(both, per_head).eval()
    param = export_module(m, (torch.randn(1, 5, 8),), tmp_path, inputs2=(torch.randn(2, t2, 8),))
    g = kuiper_xp.load(param, backend="numpy")
    for x in (torch.randn(1, 5, 8), torch.randn(2, t2, 8)):
        with torch.no_grad():
            want = m(x)
        want = want if isinstance(want, tuple) else (want,)
        got = g(x.numpy())
        assert len(got) == len(want)
        for k, (a, e) in enumerate(zip(got, want)):
            assert_close(a, e.numpy(), rtol=1e-5, what=f"output {k}")


class SeqFirstWeights(nn.Module):
    def __init__(self, alone: bool):
        super().__init__()
        self.a = nn.MultiheadAttention(4, 2)  # (L, N, E)
        self.alone = alone

    def forward(self, x):
        y, w = self.a(x, x, x, need_weights=True)
        return w * 2 if self.alone else (w * 2, y + 1)


@pytest.mark.parametrize("alone", [False, True])
def test_mha_outputs_told_apart_by_leading_axes(tmp_path, alone):
    """Sequence-first (L, N, E) = (4, 2, 4): output (4, 2, 4) and weights (2, 4, 4) differ only
    in their leading axes (was a ShapeError: the weights' shape declared for the output)."""
    torch.manual_seed(0)
    m = SeqFirstWeights(alone).eval()
    x = torch.randn(4, 2, 4)
    param = export_module(m, (x,), tmp_path)
    with torch.no_grad():
        want = m(x)
    want = want if isinstance(want, tuple) else (want,)
    got = kuiper_xp.load(param, backend="numpy")(x.numpy())
    for k, (a, e) in enumerate(zip(got, want)):
        assert_close(a, e.numpy(), rtol=1e-5, what=f"output {k}")


def test_mha_outputs_that_shapes_cannot_tell_apart_warn(tmp_path):
    """Key length == embed_dim, static: output and weights have one shape; the layer says it
    takes torch's order (it cannot know pnnx listed the weights first)."""
    torch.manual_seed(0)
    m = WeightsFirst(True).eval()
    x = torch.randn(1, 8, 8)
    param = export_module(m, (x,), tmp_path)
    with pytest.warns(UserWarning, match="do not tell the attention output from the attention weights"):
        kuiper_xp.load(param, backend="numpy")


class _BufferCausal(nn.Module):
    """A float causal mask in a buffer (listed before the query) with L == embed_dim."""

    def __init__(self, batch_first):
        super().__init__()
        self.bf = batch_first
        self.mha = nn.MultiheadAttention(4, 1, batch_first=batch_first)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(4))

    def forward(self, x):
        x = x if self.bf else x.transpose(0, 1)
        return self.mha(x, x, x, attn_mask=self.causal, need_weights=False)[0]


class _BufferBoolMasks(nn.Module):
    """A bool attn_mask in a buffer (listed first) beside a key_padding_mask, run at batch == L."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.register_buffer("causal_b", torch.triu(torch.ones(4, 4, dtype=torch.bool), 1))

    def forward(self, x, idx):
        return self.mha(x, x, x, key_padding_mask=idx == 0, attn_mask=self.causal_b, need_weights=False)[0]


class _BiasKvWeightsFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True)

    def forward(self, x):
        o, w = self.mha(x, x, x, need_weights=True, average_attn_weights=False)
        return w * 2.0, o + 1.0


class _ValueIsQuery(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True, kdim=4, vdim=8)

    def forward(self, q, k):
        return self.mha(q, k, q, need_weights=False)[0]


def _idx(n, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, 5, (n, 4), generator=g)
    idx[:, -1] = 0
    return idx


@pytest.mark.parametrize("case", ["buffer_causal_bf", "buffer_causal_sf", "bool_masks", "bias_kv", "value_is_query"])
def test_mha_inputs_and_outputs_told_apart_by_declared_shapes(tmp_path, case):
    """Session 23's fuzzing: a (L, L) float mask in a buffer taken for an unbatched query when L
    == embed_dim (a ShapeError, or the weights returned for the output: 1.9 off); two bool masks
    swapped at batch == L (0.94 off); the weights of add_bias_kv (S + 1 keys) not recognised
    (a ShapeError, or the outputs swapped); mha(q, k, q) with kdim != vdim (a numpy error)."""
    torch.manual_seed(0)
    if case.startswith("buffer_causal"):
        m = _BufferCausal(case.endswith("bf"))
        ex, ex2, runs = (torch.randn(2, 4, 4),), (torch.randn(3, 4, 4),), [(torch.randn(1, 4, 4),), (torch.randn(2, 4, 4),)]
    elif case == "bool_masks":
        m = _BufferBoolMasks()
        ex, ex2 = (torch.randn(2, 4, 8), _idx(2, 1)), (torch.randn(3, 4, 8), _idx(3, 2))
        runs = [(torch.randn(4, 4, 8), _idx(4, 3)), (torch.randn(2, 4, 8), _idx(2, 4))]
    elif case == "bias_kv":
        m = _BiasKvWeightsFirst()
        ex, ex2, runs = (torch.randn(2, 5, 8),), (torch.randn(3, 5, 8),), [(torch.randn(4, 5, 8),)]
    else:
        m = _ValueIsQuery()
        ex, ex2 = (torch.randn(2, 5, 8), torch.randn(2, 5, 4)), (torch.randn(3, 5, 8), torch.randn(3, 5, 4))
        runs = [ex]
    m = m.eval()
    param = export_module(m, ex, tmp_path, inputs2=ex2)
    g = kuiper_xp.load(param, backend="numpy")
    for args in runs:
        with torch.no_grad():
            want = m(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = g(*[a.numpy() for a in args])
        assert len(got) == len(want)
        for k, (a, e) in enumerate(zip(got, want)):
            assert_close(np.asarray(a), e.numpy(), rtol=1e-5, what=f"{case} output {k}")


class _LonePaddingMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x, lengths):
        kpm = torch.arange(x.size(1))[None] >= lengths[:, None]
        return self.mha(x, x, x, key_padding_mask=kpm, need_weights=False)[0]


class _UnbatchedCausal(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2)

    def forward(self, x):
        t = x.size(0)
        return self.mha(x, x, x, attn_mask=torch.triu(torch.ones(t, t), 1) * -1e4, need_weights=False)[0]


def test_mha_masks_with_dynamic_batch_and_length(tmp_path):
    """A lone key_padding_mask declared (?, ?) at batch == length was taken for an attn_mask
    (1.0-1.3 off; now its role, told by an earlier call's shapes, is kept), and an unbatched
    query's (T, T) float mask was taken for the key and value at T == embed_dim (1.7e4 off: a
    mask declared with a dynamic last axis is never data)."""
    torch.manual_seed(0)
    m = _LonePaddingMask().eval()

    def lens(n, t):
        return torch.randint(1, t + 1, (n,))
    param = export_module(m, (torch.randn(2, 6, 8), lens(2, 6)), tmp_path / "kpm",
                          inputs2=(torch.randn(3, 10, 8), lens(3, 10)))
    g = kuiper_xp.load(param, backend="numpy")
    for n, t in ((5, 7), (4, 4), (6, 6)):
        x, ln = torch.randn(n, t, 8), lens(n, t)
        with torch.no_grad():
            want = m(x, ln).numpy()
        assert_close(np.asarray(g(x.numpy(), ln.numpy())[0]), want, rtol=1e-5, what=f"N={n} T={t}")
    m = _UnbatchedCausal().eval()
    param = export_module(m, (torch.randn(6, 8),), tmp_path / "causal", inputs2=(torch.randn(10, 8),))
    g = kuiper_xp.load(param, backend="numpy")
    for t in (7, 8):
        x = torch.randn(t, 8)
        with torch.no_grad():
            want = m(x).numpy()
        assert_close(np.asarray(g(x.numpy())[0]), want, rtol=1e-5, what=f"T={t}")


def test_numpy_embedding_fast_path_takes_rows_and_declines_bad_ids():
    """The numpy backend's one-np.take lookup: the rows for int64/int32/uint8 ids of any shape
    (against torch), None for ids out of range (the layer then names them), float ids, an empty
    index or a table that is not 2-D."""
    from kuiper_xp.backends import numpy_fast as nf

    w = _x(10, 6)
    for dt in (np.int64, np.int32, np.uint8):
        idx = rng.integers(0, 10, (2, 3, 4)).astype(dt)
        want = F.embedding(torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(w)).numpy()
        np.testing.assert_array_equal(nf.embedding(w, idx), want)
    assert nf.embedding(w, np.array([0, 10])) is None and nf.embedding(w, np.array([-1, 2])) is None
    assert nf.embedding(w, np.array([1.0])) is None and nf.embedding(w, np.zeros((0,), np.int64)) is None
    assert nf.embedding(w[0], np.array([1])) is None
