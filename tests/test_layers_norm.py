"""Normalisation layers (kuiper_xp/layers/norm.py) against PyTorch: LayerNorm, RMSNorm,
GroupNorm, InstanceNorm, F.normalize; plus a pnnx export of the real spellings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import in_fast_scope, use_compiled
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

rng = np.random.default_rng(2)


def _x(*shape, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def _shape(s):
    return "(" + ",".join(map(str, s)) + ")"


@pytest.mark.parametrize("shape,norm_shape,affine,eps", [
    ((2, 5, 8), (8,), True, 1e-5), ((2, 5, 8), (5, 8), True, 1e-3), ((3, 8), (8,), False, 1e-6),
    ((1, 2, 3, 4), (3, 4), True, 1e-5),
])
def test_layer_norm(backend, tmp_path, shape, norm_shape, affine, eps):
    x = _x(*shape, scale=3.0, shift=2.0)
    w, b = _x(*norm_shape), _x(*norm_shape)
    tw, tb = (torch.from_numpy(w), torch.from_numpy(b)) if affine else (None, None)
    e = F.layer_norm(torch.from_numpy(x), norm_shape, tw, tb, eps)
    params = f"elementwise_affine={affine} eps={eps:e} normalized_shape={_shape(norm_shape)}"
    run_one_op(backend, tmp_path / "nn", "nn.LayerNorm", [x], t2n(e), params=params,
               weights={"weight": w, "bias": b} if affine else None)
    # F.layer_norm with weight/bias as inputs ($weight/$bias)
    ins, keys = ([x, w, b], ["input", "weight", "bias"]) if affine else ([x], ["input"])
    run_one_op(backend, tmp_path / "f", "F.layer_norm", ins, t2n(e),
               params=f"eps={eps:e} normalized_shape={_shape(norm_shape)}", keys=keys)


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "numba"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_numpy_fast_layer_norm_in_row_blocks(monkeypatch, dtype, affine, compiled):
    """The numpy fast path (and the optional numba kernel): blocks of a few rows split over 3
    threads (last block short), a permuted (non-contiguous) input, float64; against torch.
    Arguments it does not take (an int input, a weight of another dtype) give None, for the
    generic path."""
    from kuiper_xp.backends import numpy_fast as nf

    if compiled:
        use_compiled(nf, monkeypatch)

    monkeypatch.setattr(nf, "NORM_BLOCK_ELEMENTS", 40)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = _x(9, 7, 12, scale=3.0, shift=2.0).astype(dtype).transpose(1, 0, 2)
    w, b = (_x(12).astype(dtype), _x(12).astype(dtype)) if affine else (None, None)
    tw, tb = (torch.from_numpy(w), torch.from_numpy(b)) if affine else (None, None)
    want = F.layer_norm(torch.from_numpy(np.ascontiguousarray(x)), (12,), tw, tb, 1e-3).numpy()
    got = in_fast_scope(nf, lambda: nf.layer_norm(x, 12, w, b, 1e-3))
    assert got.shape == x.shape and got.dtype == dtype
    assert_close(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert nf.layer_norm(np.ones((2, 12), np.int64), 12) is None
    assert nf.layer_norm(x, 12, np.ones(12, np.float16)) is None
    assert nf.layer_norm(x, 5) is None


@pytest.mark.parametrize("eps", [None, 1e-5, 0.1])
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm(backend, tmp_path, eps, affine):
    x = _x(2, 3, 16, scale=2.0)
    w = _x(16)
    e = F.rms_norm(torch.from_numpy(x), (16,), torch.from_numpy(w) if affine else None, eps)
    params = f"elementwise_affine={affine} eps={eps} normalized_shape=(16)"
    run_one_op(backend, tmp_path / "nn", "nn.RMSNorm", [x], t2n(e), params=params,
               weights={"weight": w} if affine else None)
    run_one_op(backend, tmp_path / "f", "F.rms_norm", [x, w] if affine else [x], t2n(e),
               params=f"eps={eps} normalized_shape=(16)", keys=["input", "weight"] if affine else ["input"])


def test_rms_norm_tiny_values_use_dtype_eps(backend, tmp_path):
    x = _x(2, 4, scale=1e-5)
    e = F.rms_norm(torch.from_numpy(x), (4,))
    run_one_op(backend, tmp_path, "F.rms_norm", [x], t2n(e), params="eps=None normalized_shape=(4) weight=None",
               keys=["input"])


@pytest.mark.parametrize("shape,groups,affine", [((2, 6, 3, 4), 3, True), ((2, 6, 5), 2, False),
                                                 ((1, 4, 2, 2, 2), 4, True), ((3, 4), 1, True)])
def test_group_norm(backend, tmp_path, shape, groups, affine):
    x = _x(*shape, scale=2.0, shift=1.0)
    c = shape[1]
    w, b = _x(c), _x(c)
    e = F.group_norm(torch.from_numpy(x), groups, torch.from_numpy(w) if affine else None,
                     torch.from_numpy(b) if affine else None, 1e-5)
    run_one_op(backend, tmp_path / "nn", "nn.GroupNorm", [x], t2n(e),
               params=f"affine={affine} eps=1e-05 num_channels={c} num_groups={groups}",
               weights={"weight": w, "bias": b} if affine else None)
    ins, keys = ([x, w, b], ["input", "weight", "bias"]) if affine else ([x], ["input"])
    run_one_op(backend, tmp_path / "f", "F.group_norm", ins, t2n(e), params=f"eps=1e-05 num_groups={groups}", keys=keys)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,groups", [((3, 6, 7, 9), 3), ((2, 5, 11), 1), ((2, 4, 3, 5), 4), ((1, 8, 40), 2)])
def test_numpy_fast_group_norm_chunks_threads_activation(monkeypatch, dtype, shape, groups):
    """The numpy fast path, both forms: blocks of whole groups ((3, 6, 7, 9) in 3, (2, 4, 3, 5) in
    4), and groups larger than a block with fewer groups than 2 per thread split into chunks
    (the last one short; (2, 5, 11) in 1, (1, 8, 40) in 2), over 3 threads; a
    large mean against a small spread (a one-pass E[x^2] - mean^2 would lose it in float32),
    the affine folded in, fused activations; against torch in float64. Arguments it does not
    take give None, for the generic path."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "NORM_BLOCK_ELEMENTS", 50)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    c = shape[1]
    x = _x(*shape, scale=0.5, shift=300.0).astype(dtype)
    w, b = _x(c).astype(dtype), _x(c).astype(dtype)
    ref = F.group_norm(torch.from_numpy(x).double(), groups, torch.from_numpy(w).double(),
                       torch.from_numpy(b).double(), 1e-5)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    for act, fn in [(None, lambda t: t), ("silu", F.silu), (("clamp", 0.0, 6.0), F.relu6), ("relu", F.relu)]:
        got = in_fast_scope(nf, lambda act=act: nf.group_norm(x, groups, w, b, 1e-5, act))
        assert got.shape == x.shape and got.dtype == dtype
        assert_close(got, fn(ref).numpy().astype(dtype), rtol=rtol, what=str(act))
    plain = F.group_norm(torch.from_numpy(x).double(), groups, eps=1e-5).numpy().astype(dtype)
    assert_close(in_fast_scope(nf, lambda: nf.group_norm(x, groups)), plain, rtol=rtol, what="no affine")
    assert nf.group_norm(x.astype(np.float16), groups) is None
    assert nf.group_norm(np.ones(shape, np.int32), groups) is None
    assert nf.group_norm(np.swapaxes(x, -1, -2), groups) is None  # not C-contiguous
    assert nf.group_norm(x, groups, np.ones(c + 1, dtype)) is None
    assert nf.group_norm(x, c + 1) is None


class GroupNormSiLU(nn.Module):
    """A UNet/diffusion-style pre-activation pair: GroupNorm then SiLU, then an InstanceNorm
    with ReLU."""

    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(4, 8)
        self.inn = nn.InstanceNorm2d(8, affine=True)
        with torch.no_grad():
            for m in (self.gn, self.inn):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return F.relu(self.inn(F.silu(self.gn(x)) * 2.0))


def test_group_norm_activation_fused_matches_torch(tmp_path, model_backend):
    """The runtime folds the SiLU after a GroupNorm (and the ReLU after an InstanceNorm) into
    the norm; results as torch's on every backend."""
    torch.manual_seed(0)
    module = GroupNormSiLU().eval()
    inputs = (torch.randn(2, 8, 9, 7) * 3 + 1,)
    param = export_module(module, inputs, tmp_path)
    compare_graph(param, model_backend, module, inputs)
    g = kuiper_xp.load(param, backend=model_backend)
    fused = [names for names in g.fused]
    assert any(a.startswith("gn") for a, _ in fused) and any(a.startswith("inn") for a, _ in fused), fused


@pytest.mark.parametrize("kind,shape", [("nn.InstanceNorm1d", (2, 3, 7)), ("nn.InstanceNorm2d", (2, 3, 4, 5)),
                                        ("nn.InstanceNorm3d", (1, 3, 2, 3, 4))])
@pytest.mark.parametrize("affine,track", [(True, False), (False, True), (False, False)])
@pytest.mark.parametrize("unbatched", [False, True])
def test_instance_norm(backend, tmp_path, kind, shape, affine, track, unbatched):
    """nn.InstanceNormNd, also on an unbatched (C, *spatial) input as torch takes it (pnnx writes
    the module on that operand: it was normalised over the wrong axes, or refused with affine)."""
    x = _x(*shape, scale=2.0, shift=-1.0)
    if unbatched:
        x = x[0]
    cls = getattr(nn, kind.split(".")[1])
    m = cls(3, affine=affine, track_running_stats=track).eval()
    weights = {}
    with torch.no_grad():
        if affine:
            m.weight.copy_(torch.from_numpy(_x(3)))
            m.bias.copy_(torch.from_numpy(_x(3)))
            weights = {"weight": t2n(m.weight), "bias": t2n(m.bias)}
        if track:
            m.running_mean.copy_(torch.from_numpy(_x(3)))
            m.running_var.copy_(torch.from_numpy(np.abs(_x(3)) + 0.5))
            weights.update(running_mean=t2n(m.running_mean), running_var=t2n(m.running_var))
        e = m(torch.from_numpy(x))
    run_one_op(backend, tmp_path, kind, [x], t2n(e), weights=weights,
               params=f"affine={affine} eps=1e-05 num_features=3 track_running_stats={track}")


def test_unbatched_instance_norm_with_a_fused_softmax(model_backend, tmp_path):
    """An unbatched InstanceNorm1d followed by softmax over dim 0 (the channels): the runtime fuses
    the softmax into the norm, which must apply it on the (C, L) output."""
    from helpers import compare_with_torch, export_torch

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.n = nn.InstanceNorm1d(3, affine=True)

        def forward(self, x):
            return torch.softmax(self.n(x), dim=0)

    torch.manual_seed(0)
    m = M().eval()
    x = torch.from_numpy(_x(3, 9, scale=2.0))
    param = export_torch(m, (x,), tmp_path)
    assert kuiper_xp.load(param, backend="numpy").fused
    compare_with_torch(m, (x,), model_backend, param=param, rtol=1e-5)


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, -1), (3.0, 0)])
def test_normalize(backend, tmp_path, p, dim):
    x = _x(3, 4, 5)
    e = F.normalize(torch.from_numpy(x), p=p, dim=dim)
    run_one_op(backend, tmp_path, "F.normalize", [x], t2n(e), params=f"dim={dim} eps=1e-12 p={p}", keys=["input"])


def test_norm_errors(backend):
    from kuiper_xp.errors import LayerParameterError, ShapeError

    layer = make_layer(backend, "nn.LayerNorm op 1 1 0 1 elementwise_affine=False eps=1e-5 normalized_shape=(8)")
    with pytest.raises(ShapeError, match="normalized_shape"):
        layer.forward(backend.asarray(_x(2, 4)))
    with pytest.raises(LayerParameterError, match="num_groups"):
        make_layer(backend, "nn.GroupNorm op 1 1 0 1 affine=False eps=1e-5 num_channels=6 num_groups=4")
    layer = make_layer(backend, "F.rms_norm op 1 1 0 1 eps=None normalized_shape=(4) weight=None $input=0")
    x64 = (_x(2, 4) * 1e-9).astype(np.float64)  # eps=None: float64's machine epsilon, not float32's
    assert_close(layer.forward(backend.asarray(x64)), t2n(F.rms_norm(torch.from_numpy(x64), (4,))), rtol=1e-6)


# ---- pnnx end to end ------------------------------------------------------------------------------


class NormModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.ln2 = nn.LayerNorm((5, 16), elementwise_affine=False, eps=1e-3)
        self.rms = nn.RMSNorm(16)
        self.rms2 = nn.RMSNorm(16, eps=1e-5)
        self.gn = nn.GroupNorm(2, 4)
        self.inn = nn.InstanceNorm2d(4, affine=True)
        self.inr = nn.InstanceNorm2d(4, track_running_stats=True)
        self.g = nn.Parameter(torch.rand(4) + 0.5)
        with torch.no_grad():
            for m in (self.ln, self.rms, self.rms2, self.gn, self.inn):
                m.weight.uniform_(0.5, 1.5)
                if getattr(m, "bias", None) is not None:
                    m.bias.uniform_(-0.5, 0.5)
            self.inr.running_mean.uniform_(-0.5, 0.5)
            self.inr.running_var.uniform_(0.5, 1.5)

    def forward(self, x, img):
        return (self.ln(x), self.ln2(x), self.rms(x), self.rms2(x), F.layer_norm(x, (16,)), F.rms_norm(x, (16,)),
                self.gn(img), F.group_norm(img, 2, self.g), self.inn(img), self.inr(img))


@pytest.fixture(scope="session")
def norm_export(tmp_path_factory):
    torch.manual_seed(0)
    module = NormModule().eval()
    inputs = (torch.randn(2, 5, 16) * 2 + 1, torch.randn(2, 4, 3, 3))
    return export_module(module, inputs, tmp_path_factory.mktemp("norm")), module, inputs


def test_norm_export_matches_torch(norm_export, model_backend):
    param, module, inputs = norm_export
    text = param.read_text()
    for t in ("nn.LayerNorm", "F.layer_norm", "nn.RMSNorm", "F.rms_norm", "nn.GroupNorm", "F.group_norm",
              "nn.InstanceNorm2d", "eps=None", "@running_mean"):
        assert t in text, f"pnnx no longer emits {t}"
    require_types(param)
    compare_graph(param, model_backend, module, inputs)


class AtenInstanceNormModule(nn.Module):
    """What pnnx leaves as ``aten::instance_norm``: F.instance_norm with running statistics
    (use_input_stats=False), and a freshly made nn.InstanceNorm2d that tracks them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.randn(4))
        self.register_buffer("rv", torch.rand(4) + 0.5)
        self.w = nn.Parameter(torch.randn(4))
        self.b = nn.Parameter(torch.randn(4))
        self.fresh = nn.InstanceNorm2d(4, affine=True, track_running_stats=True)

    def forward(self, x):
        return (F.instance_norm(x, self.rm, self.rv, self.w, self.b, use_input_stats=False, eps=1e-3),
                self.fresh(x) * 2, F.instance_norm(x, self.rm, self.rv, None, self.b, use_input_stats=False))


def test_aten_instance_norm_matches_torch(model_backend, tmp_path):
    torch.manual_seed(0)
    module = AtenInstanceNormModule().eval()
    inputs = (torch.randn(2, 4, 6, 5) * 2 + 1,)
    param = export_module(module, inputs, tmp_path)
    assert "aten::instance_norm" in param.read_text(), "pnnx no longer leaves aten::instance_norm"
    compare_graph(param, model_backend, module, inputs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, groups", [((3, 8, 6, 7), 4), ((2, 6, 5), 3), ((1, 32, 16, 16), 8)])
def test_numpy_fast_group_norm_silu_from_the_negated_affine(dtype, shape, groups):
    """GroupNorm with SiLU fused computes SiLU from the negated affine (one pass fewer): bit for
    bit the same as the affine then the SiLU kernel, and torch's values, with +-inf and NaN in
    one group (NaN there, as in torch) and without weight or bias."""
    from kuiper_xp.backends import numpy_fast as nf

    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x[0, 0].reshape(-1)[:3] = [np.inf, -np.inf, np.nan]
    w, b = rng.standard_normal(shape[1]).astype(dtype), rng.standard_normal(shape[1]).astype(dtype)
    for wb in ((w, b), (None, b), (w, None), (None, None)):
        got = in_fast_scope(nf, lambda wb=wb: nf.group_norm(x, groups, *wb, activation="silu"))
        sep = in_fast_scope(nf, lambda wb=wb: nf.activation_inplace(nf.group_norm(x, groups, *wb), "silu"))
        assert np.array_equal(got, sep, equal_nan=True)
        t = [None if a is None else torch.from_numpy(a) for a in wb]
        want = F.silu(F.group_norm(torch.from_numpy(x), groups, *t)).numpy()
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


class PreNormBlocks(nn.Module):
    """LayerNorms the runtime folds into the linear layers reading them (ln1: self-attention;
    ln2: an MLP; ln3: three linears, one without a bias; ln7: attention without biases), and
    those it leaves (ln4: also read by the residual; ln5: no affine; ln6: an output)."""

    def __init__(self, d=24):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln3 = nn.LayerNorm(d)  # (bias=False: pnnx drops the weight too, see the README)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.ln4, self.mix = nn.LayerNorm(d), nn.Linear(d, d)
        self.ln5, self.fc5 = nn.LayerNorm(d, elementwise_affine=False), nn.Linear(d, d)
        self.ln7, self.attn_nb = nn.LayerNorm(d), nn.MultiheadAttention(d, 4, batch_first=True, bias=False)
        self.ln6 = nn.LayerNorm(d)
        with torch.no_grad():  # (the default 1 and 0 would make folding them a no-op)
            for m in self.modules():
                if isinstance(m, nn.LayerNorm) and m.weight is not None:
                    m.weight.copy_(torch.randn_like(m.weight) * 0.5 + 1)
                    if m.bias is not None:
                        m.bias.copy_(torch.randn_like(m.bias))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        h = self.ln3(x)
        x = x + self.q(h) * torch.sigmoid(self.k(h)) + self.v(h)
        h = self.ln4(x)
        x = h + self.mix(h)
        x = x + self.fc5(self.ln5(x))
        h = self.ln7(x)
        x = x + self.attn_nb(h, h, h, need_weights=False)[0]
        return self.ln6(x), x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_affine_folded_into_its_linear_readers(tmp_path, model_backend, dtype):
    """A LayerNorm read only by linear layers (or a self-attention's input projection) has its
    weight and bias folded into their weights and biases at build: it then only normalises.
    Torch's results on every backend, in float32 and float64; the folds listed in
    ``g.folded_norms``, none where the norm's own output is needed; ``fuse=False`` folds none."""
    torch.manual_seed(0)
    module = PreNormBlocks().to(dtype).eval()
    inputs = (torch.randn(2, 7, 24, dtype=dtype) * 2 + 0.5,)
    param = export_module(module, inputs, tmp_path)
    compare_graph(param, model_backend, module, inputs, rtol=1e-5)
    g = kuiper_xp.load(param, backend=model_backend)
    folded = {n: set(readers) for n, readers in g.folded_norms}
    assert set(folded) == {"ln1", "ln2", "ln3", "ln7"}, g.folded_norms
    assert folded["ln3"] == {"q", "k", "v"} and folded["ln2"] == {"fc1"}, g.folded_norms
    assert not kuiper_xp.load(param, backend=model_backend, fuse=False).folded_norms


def test_layer_norm_weight_alone_folded(tmp_path):
    """A LayerNorm with a weight and no bias (written by hand: pnnx drops both for
    ``bias=False``) folded into a linear layer: torch's ``F.layer_norm(x, (8,), w, None)``
    then ``F.linear``."""
    from test_robustness_graph import write_model

    w = rng.standard_normal(8).astype(np.float32) + 1
    fw = rng.standard_normal((5, 8)).astype(np.float32)
    fb = rng.standard_normal(5).astype(np.float32)
    param = write_model(tmp_path, [
        "pnnx.Input in 0 1 0",
        "nn.LayerNorm ln 1 1 0 1 elementwise_affine=True eps=1e-05 normalized_shape=(8) @weight=(8)f32",
        "nn.Linear fc 1 1 1 2 bias=True in_features=8 out_features=5 @weight=(5,8)f32 @bias=(5)f32",
        "pnnx.Output out 1 0 2",
    ], weights={"ln.weight": w, "fc.weight": fw, "fc.bias": fb})
    g = kuiper_xp.load(param, backend="numpy")
    assert g.folded_norms == [("ln", ("fc",))]
    x = rng.standard_normal((3, 4, 8)).astype(np.float32) * 3
    want = F.linear(F.layer_norm(torch.from_numpy(x), (8,), torch.from_numpy(w), None, 1e-5),
                    torch.from_numpy(fw), torch.from_numpy(fb)).numpy()
    assert_close(np.asarray(g(x)[0]), want, rtol=1e-5)


def test_layer_norm_folded_once_into_attention_reading_it_three_times(tmp_path):
    """A self-attention written with the norm's output as query, key and value (three inputs
    naming one operand) gets the fold once: torch's ``attn(h, h, h)``."""
    from test_robustness_graph import write_model

    torch.manual_seed(3)
    d = 8
    ln, attn = nn.LayerNorm(d), nn.MultiheadAttention(d, 2, batch_first=True)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(d) * 0.5 + 1)
        ln.bias.copy_(torch.randn(d))
    weights = {"ln.weight": t2n(ln.weight), "ln.bias": t2n(ln.bias),
               "attn.in_proj_weight": t2n(attn.in_proj_weight), "attn.in_proj_bias": t2n(attn.in_proj_bias),
               "attn.out_proj.weight": t2n(attn.out_proj.weight), "attn.out_proj.bias": t2n(attn.out_proj.bias)}
    param = write_model(tmp_path, [
        "pnnx.Input in 0 1 0",
        f"nn.LayerNorm ln 1 1 0 1 elementwise_affine=True eps=1e-05 normalized_shape=({d}) @weight=({d})f32 @bias=({d})f32",
        f"nn.MultiheadAttention attn 3 1 1 1 1 2 add_bias_kv=False add_zero_attn=False batch_first=True bias=True "
        f"embed_dim={d} kdim={d} num_heads=2 vdim={d} @in_proj_weight=({3 * d},{d})f32 @in_proj_bias=({3 * d})f32 "
        f"@out_proj.weight=({d},{d})f32 @out_proj.bias=({d})f32",
        "pnnx.Output out 1 0 2",
    ], weights=weights)
    g = kuiper_xp.load(param, backend="numpy")
    assert g.folded_norms == [("ln", ("attn",))]
    x = torch.randn(2, 5, d) * 2
    with torch.no_grad():
        h = ln(x)
        want = attn(h, h, h, need_weights=False)[0].numpy()
    assert_close(np.asarray(g(x.numpy())[0]), want, rtol=1e-5)
