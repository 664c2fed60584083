"""Linear, batch-norm and no-op layers (kuiper_xp/layers/linear.py) against torch on every backend
leg, and one pnnx export end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import export_torch  # noqa: E402
from test_layers_conv import op_graph, rnd, run_op, t
from torch import nn

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.layers.linear import BatchNorm


@pytest.mark.parametrize("shape", [(5, 6), (2, 3, 6), (2, 2, 3, 6), (6,)], ids=["2d", "3d", "4d", "1d"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(backend, tmp_path, shape, bias):
    x, w, b = rnd(*shape), rnd(4, 6, seed=1), rnd(4, seed=2)
    expected = F.linear(t(x), t(w), t(b) if bias else None).numpy()
    params = {"bias": bias, "in_features": 6, "out_features": 4}
    run_op(backend, tmp_path, "nn.Linear", params, [x], expected, {"weight": w} | ({"bias": b} if bias else {}))


def test_functional_linear_weight_and_bias_inputs(backend, tmp_path):
    x, w, b = rnd(2, 3, 6), rnd(4, 6, seed=1), rnd(4, seed=2)
    run_op(backend, tmp_path, "F.linear", {}, [x, w, b], F.linear(t(x), t(w), t(b)).numpy(),
           keys=["input", "weight", "bias"])
    run_op(backend, tmp_path / "nb", "F.linear", {"bias": None}, [x, w], F.linear(t(x), t(w)).numpy(),
           keys=["input", "weight"])


def test_linear_non_contiguous_input(backend, tmp_path):
    """A transposed input (as a permute before the linear leaves it) still gives torch's result."""
    x, w = rnd(2, 6, 3), rnd(4, 6, seed=1)
    xt = np.swapaxes(x, 1, 2)
    g = op_graph(tmp_path, "nn.Linear", {"bias": False, "in_features": 6, "out_features": 4}, [xt],
                 [F.linear(t(xt), t(w)).numpy()], {"weight": w}, backend=backend)
    assert_close(g(xt)[0], F.linear(t(xt), t(w)).numpy())


def test_linear_feature_mismatch_raises_shape_error(backend, tmp_path):
    g = op_graph(tmp_path, "nn.Linear", {"bias": False, "in_features": 6, "out_features": 4}, [rnd(2, 6)], 1,
                 {"weight": rnd(4, 6)}, backend=backend, annotate=False)
    with pytest.raises(ShapeError, match=r"\(2, 5\).*\(4, 6\)"):
        g(rnd(2, 5))


def test_functional_linear_bias_operands(backend, tmp_path):
    """A bias operand of one element (or 0-d) broadcasts as in torch; one of the wrong length
    (pnnx writes the zeroed slice alone for torchvision Swin V2's ``qkv_bias[n:2n].zero_()``) is
    a ShapeError naming the layer and both shapes, not numpy's broadcast error."""
    x, w = rnd(2, 3, 6), rnd(4, 6, seed=1)
    for b in (rnd(1, seed=2), np.float32(0.5).reshape(())):
        run_op(backend, tmp_path / f"b{b.ndim}", "F.linear", {}, [x, w, b], F.linear(t(x), t(w), t(b)).numpy(),
               keys=["input", "weight", "bias"])
    g = op_graph(tmp_path / "bad", "F.linear", {}, [x, w, rnd(2)], 1, keys=["input", "weight", "bias"],
                 backend=backend, annotate=False)
    with pytest.raises(ShapeError, match=r"F.linear 'op'.*bias has shape \(2,\), expected \(4,\)"):
        g(x, w, rnd(2))
    # declared in the file (as pnnx declares them): refused at load, with the reason and the fix
    with pytest.raises(LayerParameterError, match=r"bias is declared \(2,\), the weight \(4, 6\).*torch.cat"):
        op_graph(tmp_path / "declared", "F.linear", {}, [x, w, rnd(2)], [np.zeros((2, 3, 4), np.float32)],
                 keys=["input", "weight", "bias"], backend=backend)


def test_functional_linear_vector_weight(backend, tmp_path):
    """``F.linear(x, w)`` with a 1-D weight drops the last axis (NanoDet / GFL's ``Integral``:
    ``F.linear(softmax(x), project)``); a bias with it must be 0-d, as in torch."""
    x, w = rnd(2, 5, 8), rnd(8, seed=1)
    run_op(backend, tmp_path / "nb", "F.linear", {"bias": None}, [x, w], F.linear(t(x), t(w)).numpy(),
           keys=["input", "weight"])
    b = np.float32(0.75).reshape(())
    run_op(backend, tmp_path / "b", "F.linear", {}, [x, w, b], F.linear(t(x), t(w), torch.tensor(0.75)).numpy(),
           keys=["input", "weight", "bias"])
    g = op_graph(tmp_path / "bad", "F.linear", {}, [x, w, rnd(1)], 1, keys=["input", "weight", "bias"],
                 backend=backend, annotate=False)
    with pytest.raises(ShapeError, match="with a 1-D weight the bias must be 0-d"):
        g(x, w, rnd(1))


@pytest.mark.parametrize("params, weights, needle", [
    ({"bias": True, "in_features": 6, "out_features": 4}, {"weight": rnd(4, 6)}, "bias"),
    ({"bias": False, "in_features": 5, "out_features": 4}, {"weight": rnd(4, 6)}, "in_features"),
    ({"bias": False, "in_features": 6, "out_features": 4}, {"weight": rnd(4, 6, 1)}, "weight"),
    ({"bias": True, "in_features": 6, "out_features": 4}, {"weight": rnd(4, 6), "bias": rnd(3)}, "bias"),
])
def test_linear_bad_parameters_fail_at_build(tmp_path, params, weights, needle):
    with pytest.raises(LayerParameterError) as ei:
        op_graph(tmp_path, "nn.Linear", params, [rnd(2, 6)], 1, weights, annotate=False)
    assert needle in str(ei.value) and "nn.Linear 'op'" in str(ei.value)


# ---------------------------------------------------------------------------------------------
# batch norm

def _bn_stats(c, seed=3):
    rng = np.random.default_rng(seed)
    return {"running_mean": rng.standard_normal(c).astype(np.float32),
            "running_var": rng.uniform(0.3, 2.0, c).astype(np.float32),
            "weight": rng.standard_normal(c).astype(np.float32),
            "bias": rng.standard_normal(c).astype(np.float32)}


@pytest.mark.parametrize("op_type, shape", [("nn.BatchNorm2d", (2, 4, 5, 6)), ("nn.BatchNorm1d", (3, 4)),
                                            ("nn.BatchNorm1d", (2, 4, 7))])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_matches_torch(backend, tmp_path, op_type, shape, affine):
    x = rnd(*shape)
    s = _bn_stats(4)
    if not affine:
        s = {k: v for k, v in s.items() if k.startswith("running")}
    expected = F.batch_norm(t(x), t(s["running_mean"]), t(s["running_var"]),
                            t(s["weight"]) if affine else None, t(s["bias"]) if affine else None,
                            eps=1e-3).numpy()
    params = {"affine": affine, "eps": 1e-3, "num_features": 4}
    run_op(backend, tmp_path, op_type, params, [x], expected, s)


def test_functional_batch_norm_with_input_statistics(backend, tmp_path):
    x = rnd(2, 4, 3, 3)
    s = _bn_stats(4)
    expected = F.batch_norm(t(x), t(s["running_mean"]), t(s["running_var"]), t(s["weight"]),
                            t(s["bias"]), eps=1e-5).numpy()
    run_op(backend, tmp_path, "F.batch_norm", {"eps": 1e-5},
           [x, s["running_mean"], s["running_var"], s["weight"], s["bias"]], expected,
           keys=["input", "running_mean", "running_var", "weight", "bias"])
    expected = F.batch_norm(t(x), t(s["running_mean"]), t(s["running_var"]), eps=1e-3).numpy()
    run_op(backend, tmp_path / "nw", "F.batch_norm", {"bias": None, "eps": 1e-3, "weight": None},
           [x, s["running_mean"], s["running_var"]], expected, keys=["input", "running_mean", "running_var"])


def test_batch_norm_channel_mismatch_raises_shape_error(backend, tmp_path):
    g = op_graph(tmp_path, "nn.BatchNorm2d", {"affine": True, "eps": 1e-5, "num_features": 4},
                 [rnd(1, 4, 2, 2)], 1, _bn_stats(4), backend=backend, annotate=False)
    with pytest.raises(ShapeError, match=r"\(1, 3, 2, 2\)"):
        g(rnd(1, 3, 2, 2))


@pytest.mark.parametrize("params, needle", [
    ({"affine": True, "eps": 1e-5, "num_features": 5}, "num_features"),
    ({"affine": True, "eps": "tiny", "num_features": 4}, "eps"),
])
def test_batch_norm_bad_parameters_fail_at_build(tmp_path, params, needle):
    with pytest.raises(LayerParameterError, match=needle):
        op_graph(tmp_path, "nn.BatchNorm2d", params, [rnd(1, 4, 2, 2)], 1, _bn_stats(4), annotate=False)


@pytest.mark.parametrize("op_type", ["nn.Dropout", "nn.Dropout2d", "F.dropout", "nn.Identity"])
def test_noop_layers_return_the_input(backend, tmp_path, op_type):
    x = rnd(2, 3, 4)
    run_op(backend, tmp_path, op_type, {"p": 0.5} if "ropout" in op_type else {}, [x], x)


# ---------------------------------------------------------------------------------------------
# pnnx export

class LinearZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn2 = nn.BatchNorm2d(4)
        self.bn1 = nn.BatchNorm1d(4, affine=False)
        self.fc = nn.Linear(24, 8)
        self.fc2 = nn.Linear(8, 3, bias=False)
        self.drop = nn.Dropout(0.3)
        for bn in (self.bn2, self.bn1):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
        self.bn2.weight.data.normal_()
        self.bn2.bias.data.normal_()
        self.rm, self.rv = torch.randn(4), torch.rand(4) + 0.5

    def forward(self, x, q, w):
        a = torch.relu(self.bn2(x))          # a BatchNorm2d that is not folded into a conv
        b = self.fc2(self.drop(self.fc(a.reshape(a.shape[0], 4, 24))))
        c = self.bn1(q)
        d = F.linear(q.transpose(1, 2), w)
        e = F.batch_norm(x, self.rm, self.rv, eps=1e-3)
        return b, c, d, e


@pytest.fixture(scope="session")
def linear_zoo_export(tmp_path_factory):
    from helpers import export_torch

    torch.manual_seed(0)
    m = LinearZoo().eval()
    inputs = (torch.randn(1, 4, 4, 6), torch.randn(1, 4, 7), torch.randn(5, 4))
    inputs2 = (torch.randn(3, 4, 4, 6), torch.randn(3, 4, 7), torch.randn(5, 4))
    return m, export_torch(m, inputs, tmp_path_factory.mktemp("linzoo"), inputs2=inputs2), inputs2


def test_pnnx_linear_module_matches_torch(model_backend, linear_zoo_export):
    from helpers import run_graph, torch_outputs

    m, param, inputs = linear_zoo_export
    types = {ln.split()[0] for ln in param.read_text().splitlines()[2:] if ln.strip()}
    from kuiper_xp.layers import registry
    missing = sorted(tp for tp in types if tp not in registry and tp != "prim::TupleConstruct")
    if missing:
        pytest.skip(f"layers outside this file not registered yet: {missing}")
    assert {"nn.Linear", "nn.BatchNorm2d", "nn.BatchNorm1d", "F.linear", "F.batch_norm"} <= types
    expected = torch_outputs(m, inputs)
    got = run_graph(param, model_backend, inputs)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=1e-5, what=f"output {k}")


@pytest.mark.parametrize("spec", ["gelu", "gelu_tanh", "silu", "relu", ("clamp", -0.5, 0.5), "callable",
                                  ("leaky", 0.2)])
def test_linear_fused_activation(backend, tmp_path, spec):
    """The runtime's fusion hook on Linear: named kernels in place on NumPy (a ValueError on
    backends without them), relu/clamp/callables everywhere."""
    x, w, b = rnd(2, 3, 6) * 3, rnd(5, 6, seed=1), rnd(5, seed=2)
    ref = F.linear(t(x), t(w), t(b))
    fns = {"gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu,
           "relu": F.relu, "callable": lambda y: y * 2.0}
    if isinstance(spec, tuple):
        expected = (F.leaky_relu(ref, spec[1]) if spec[0] == "leaky" else torch.clamp(ref, -0.5, 0.5)).numpy()
    else:
        expected = fns[spec](ref).numpy()
    g = op_graph(tmp_path, "nn.Linear", {"bias": True, "in_features": 6, "out_features": 5}, [x], [expected],
                 {"weight": w, "bias": b}, backend=backend)
    (layer,) = g.layers
    named = isinstance(spec, str) and spec not in ("relu", "callable")
    if named and backend.fast is None:
        with pytest.raises(ValueError):
            layer.set_fused_activation(spec)
        return
    layer.set_fused_activation(fns["callable"] if spec == "callable" else spec)
    assert_close(g(x)[0], expected, rtol=1e-5, what=str(spec))
    with pytest.raises(ValueError):
        layer.set_fused_activation("swish-ish")


def test_linear_gelu_is_fused_by_the_runtime(tmp_path):
    """A Linear followed by GELU in an exported module: one step on NumPy, torch's result."""
    from helpers import export_torch

    import kuiper_xp

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act1, self.fc2, self.act2 = nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3), nn.SiLU()

        def forward(self, x):
            return self.act2(self.fc2(self.act1(self.fc1(x))))

    m = MLP().eval()
    x = torch.from_numpy(rnd(2, 4, 6))
    g = kuiper_xp.load(export_torch(m, (x,), tmp_path), backend="numpy")
    assert len(g.fused) == 2
    with torch.no_grad():
        expected = m(x).numpy()
    assert_close(g(x.numpy())[0], expected, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows, k, n, block_bytes", [
    (301, 7, 13, 13 * 4 * 10),   # blocks of 10 rows, the weight under the block size
    (129, 16, 40, 40 * 4 * 7),   # an uneven last block
    (200, 33, 24, 64),           # the weight over the block size: one block per thread
    (1000, 9, 5, 1 << 20),       # one block
])
@pytest.mark.parametrize("spec, bias", [("gelu", True), ("silu", False), (("clamp", 0.0, None), True),
                                        (("leaky", 0.1), True)])
def test_numpy_linear_blocks_are_torch(monkeypatch, threads, rows, k, n, block_bytes, spec, bias):
    """numpy_fast.linear with a fused activation from LINEAR_BLOCKS_MIN_ROWS rows: blocks of rows,
    each block's GEMM, bias and activation on one thread (the block path taken: one GEMM a
    block), against torch's linear and activation."""
    from helpers import in_fast_scope
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "LINEAR_BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_MACS", 0)
    monkeypatch.setattr(nf, "LINEAR_TINY_MACS", 0)  # (small products, to exercise the blocks)
    blocks = []
    real = nf._mm
    monkeypatch.setattr(nf, "_mm", lambda a, b, out: blocks.append(out.shape[0]) or real(a, b, out))
    rng = np.random.default_rng(rows + n)
    x = rng.standard_normal((rows, k)).astype(np.float32) * 2
    w, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    y = in_fast_scope(nf, lambda: nf.linear(x, nf.pack_linear(w), b if bias else None, spec), threads=threads)
    ref = F.linear(t(x), t(w), t(b) if bias else None)
    if spec == "gelu":
        ref = F.gelu(ref)
    elif spec == "silu":
        ref = F.silu(ref)
    elif spec[0] == "clamp":
        ref = F.relu(ref)
    else:
        ref = F.leaky_relu(ref, spec[1])
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-5)
    assert sum(blocks) == rows, blocks
    want = -(-rows // threads) if w.size * 4 > block_bytes else min(-(-rows // threads), block_bytes // (n * 4))
    assert max(blocks) <= want, blocks


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", [None, "relu", ("clamp", -0.25, 0.5), ("clamp", None, 0.0), "gelu", "silu",
                                  ("leaky", 0.1)])
@pytest.mark.parametrize("rows, k, n, bias", [(1, 32, 64, True), (3, 64, 10, False), (2, 7, 1, True)])
def test_numpy_tiny_linear_is_torch(monkeypatch, dtype, spec, rows, k, n, bias):
    """A product of at most LINEAR_TINY_MACS multiply-adds (a small MLP on one sample) is one
    np.matmul on the calling thread, then the bias and the activation: torch's result (NaN kept
    through ReLU and clamps), the product never split (``_mm`` and ``_gemm`` not reached); with
    the lane off, the general path gives the same values. A destination named for the output (a
    concatenation's slot) still receives it."""
    from helpers import in_fast_scope
    from kuiper_xp.backends import numpy_fast as nf

    calls = []
    for name in ("_mm", "_gemm"):
        real = getattr(nf, name)
        monkeypatch.setattr(nf, name, lambda a, b, out, real=real, name=name: calls.append(name) or real(a, b, out))
    rng = np.random.default_rng(rows * k + n)
    x = (rng.standard_normal((rows, k)) * 2).astype(dtype)
    x[0, 0] = np.nan
    w, b = rng.standard_normal((n, k)).astype(dtype), rng.standard_normal(n).astype(dtype)
    ref = F.linear(t(x), t(w), t(b) if bias else None)
    if spec == "relu":
        ref = F.relu(ref)
    elif spec in ("gelu", "silu"):
        ref = getattr(F, spec)(ref)
    elif spec is not None and spec[0] == "clamp":
        ref = torch.clamp(ref, spec[1], spec[2])
    elif spec is not None:
        ref = F.leaky_relu(ref, spec[1])
    wt = nf.pack_linear(w)
    y = in_fast_scope(nf, lambda: nf.linear(x, wt, b if bias else None, spec), threads=2)
    assert y.dtype == dtype and calls == []
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-6)
    assert np.isnan(y[0]).all()  # (x[0, 0] is NaN: every output of row 0 is)
    monkeypatch.setattr(nf, "LINEAR_TINY_MACS", 0)
    general = in_fast_scope(nf, lambda: nf.linear(x, wt, b if bias else None, spec), threads=2)
    assert calls
    np.testing.assert_allclose(y, general, rtol=1e-6, atol=1e-7)
    monkeypatch.setattr(nf, "LINEAR_TINY_MACS", 1 << 16)
    dest = np.empty((rows, n), dtype)

    def into_dest():
        nf.set_destination(dest)
        try:
            return nf.linear(x, wt, b if bias else None, spec)
        finally:
            nf.set_destination(None)
    got = in_fast_scope(nf, into_dest, threads=2)
    assert got is dest
    np.testing.assert_allclose(got, general, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(2, 0, 0), (0, 0), (0, 4), (3, 0, 4)])
def test_numpy_linear_of_empty_inputs(shape):
    """numpy_fast.linear on inputs with no elements (no rows, or no features): torch's shape and
    values (a (2, 0, 0) input made numpy's reshape(-1, 0) ambiguous)."""
    from kuiper_xp.backends import numpy_fast as nf

    x = np.zeros(shape, np.float32)
    w, b = rnd(3, shape[-1], seed=1), rnd(3, seed=2)
    want = F.gelu(F.linear(t(x), t(w), t(b))).numpy()
    got = nf.linear(x, nf.pack_linear(w), b, "gelu")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_linear_gelu_on_many_rows_is_fused_in_blocks(tmp_path, monkeypatch):
    """A Linear + GELU exported from torch on 2 x 150 tokens runs its GELU on the blocks of the
    result (numpy_fast._linear_blocks), with torch's result."""
    from helpers import export_torch
    from kuiper_xp.backends import numpy_fast as nf

    import kuiper_xp

    seen = []
    real = nf._linear_blocks
    monkeypatch.setattr(nf, "_linear_blocks", lambda *a: seen.append(a[3]) or real(*a))
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 4)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    m = MLP().eval()
    x = torch.from_numpy(rnd(2, 150, 12) * 3)
    g = kuiper_xp.load(export_torch(m, (x,), tmp_path), backend="numpy")
    with torch.no_grad():
        expected = m(x).numpy()
    assert_close(g(x.numpy())[0], expected, rtol=1e-5)
    assert seen == ["gelu"], seen


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_scale_shift_is_torch_batch_norm(monkeypatch, dtype):
    """numpy_fast.scale_shift (an unfused inference BatchNorm): planes split over 3 threads,
    NaN kept, 2-D and 5-D inputs; arguments it does not take give None (generic path)."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    rng = np.random.default_rng(4)
    mean, var = rng.standard_normal(5).astype(dtype), rng.uniform(0.5, 1.5, 5).astype(dtype)
    w, b = rng.uniform(0.5, 1.5, 5).astype(dtype), rng.standard_normal(5).astype(dtype)
    scale, shift = BatchNorm.fold(mean, var, w, b, 1e-5, xp=np)
    old = nf.set_num_threads(3)
    try:
        for shape in ((3, 5, 7, 6), (4, 5), (2, 5, 3, 2, 2)):
            x = rng.standard_normal(shape).astype(dtype)
            x.flat[3] = np.nan
            want = F.batch_norm(torch.from_numpy(x), *map(torch.from_numpy, (mean, var, w, b)), eps=1e-5).numpy()
            with nf.compute_scope():
                got = nf.scale_shift(x, scale, shift)
            np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
            assert np.isnan(got.flat[3])
    finally:
        nf.set_num_threads(old)
    x = rng.standard_normal((3, 5, 4)).astype(dtype)
    assert nf.scale_shift(x[:, :, ::2], scale, shift) is None  # not contiguous
    assert nf.scale_shift(x, scale.astype(np.float16), shift) is None
    assert nf.scale_shift(x[:, :4], scale, shift) is None  # channel mismatch: the layer reports it


@pytest.mark.parametrize("shape", [(3, 5), (17, 4), (70, 9)])
@pytest.mark.parametrize("threads", [1, 2])
def test_numpy_pack_linear_is_a_contiguous_transpose(monkeypatch, shape, threads):
    """numpy_fast.pack_linear: W^T as a C-contiguous copy, in blocks of rows (a short last one)
    split over the threads; small weights in one copy."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PACK_ROWS", 8)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    old = nf.set_num_threads(threads)
    try:
        got = nf.pack_linear(w)
    finally:
        nf.set_num_threads(old)
    assert got.flags.c_contiguous and not np.shares_memory(got, w)
    np.testing.assert_array_equal(got, w.T)


@pytest.mark.parametrize("rows", [1, 2, 5, 64, 65])
def test_numpy_big_weights_stay_out_in(monkeypatch, tmp_path, rows):
    """A weight of PACK_KEEP_MIN_ELEMENTS or more is kept as read, (out, in) (pack_linear returns
    the transposed view, no copy); inputs of 2..LINEAR_FEW_ROWS rows then run as W @ x^T, others
    as x @ W^T: torch's result either way, bias and fused activation included."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PACK_KEEP_MIN_ELEMENTS", 64)
    monkeypatch.setattr(nf, "LINEAR_TINY_MACS", 0)  # (a small weight standing for a big one)
    w = rnd(24, 16, seed=1)
    packed = nf.pack_linear(w)
    assert np.shares_memory(packed, w) and packed.shape == (16, 24) and packed.flags.f_contiguous
    x, b = rnd(rows, 16), rnd(24, seed=2)
    g = op_graph(tmp_path, "nn.Linear", {"bias": True, "in_features": 16, "out_features": 24}, [x],
                 [F.linear(t(x), t(w), t(b)).numpy()], {"weight": w, "bias": b}, backend="numpy")
    lin = next(r.layer for r in g.execution_order if r.type == "nn.Linear")
    assert lin.weight_t.flags.f_contiguous
    old = nf.set_num_threads(2)
    try:
        for _ in range(2):
            assert_close(g(x)[0], F.linear(t(x), t(w), t(b)).numpy(), rtol=1e-5)
    finally:
        nf.set_num_threads(old)


def test_linear_and_attention_build_keep_only_the_packed_weights(tmp_path):
    """On numpy, Linear and MultiheadAttention keep contiguous W^T copies and drop the weights
    they read from the build's cache (loading holds one weight twice at a time, not all)."""
    from test_layers_misc import export_module

    import kuiper_xp
    from kuiper_xp.layers import BuildContext

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 24), nn.TransformerEncoderLayer(24, 4, 32, batch_first=True))
    module.eval()
    x = torch.randn(2, 5, 8)
    param = export_module(nn.Sequential(module[0], _SelfAttention(module[1].self_attn)), (x,), tmp_path)
    forgotten = []
    real = BuildContext.forget
    BuildContext.forget = lambda self, ref: forgotten.append(ref.member) or real(self, ref)
    try:
        g = kuiper_xp.load(param, backend="numpy")
    finally:
        BuildContext.forget = real
    assert sorted(forgotten) == sorted(["0.weight", "1.attn.in_proj_weight", "1.attn.out_proj.weight"]), forgotten
    lin = next(r.layer for r in g.execution_order if r.type == "nn.Linear")
    assert lin.weight_t.flags.c_contiguous and lin.weight_t.shape == (8, 24)
    mha = next(r.layer for r in g.execution_order if r.type == "nn.MultiheadAttention")
    assert mha.w["qkv_t"].flags.c_contiguous and mha.w["o_t"].flags.c_contiguous
    assert np.shares_memory(mha.w["k_t"], mha.w["qkv_t"])
    with torch.no_grad():
        want = _SelfAttention(module[1].self_attn)(module[0](x))
    assert_close(g(x.numpy())[0], want.numpy(), rtol=1e-5)


class _SelfAttention(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class _AddmmRowBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.addmm(self.b[None], x, self.w.t())


def test_addmm_with_a_row_bias(tmp_path):
    """pnnx writes ``torch.addmm(b[None], x, W.t())`` as an F.linear whose bias is declared
    (1, out): refused at load before, as if it were Swin V2's zeroed slice."""
    torch.manual_seed(0)
    m = _AddmmRowBias().eval()
    param = export_torch(m, (torch.randn(2, 6),), tmp_path, inputs2=(torch.randn(3, 6),))
    g = kuiper_xp.load(param, backend="numpy")
    for n in (1, 5):
        x = torch.randn(n, 6)
        with torch.no_grad():
            want = m(x).numpy()
        assert_close(np.asarray(g(x.numpy())[0]), want, rtol=1e-5)


class _LayerScale(nn.Module):
    """A linear layer times a learned per-feature scale (ConvNeXt's and CaiT's gamma), in the
    variants the runtime must and must not fold."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.fc, self.fc2 = nn.Linear(12, 8), nn.Linear(8, 8)
        shape = (1, 1, 8) if variant == "broadcast" else (8,)
        self.gamma = nn.Parameter(torch.linspace(-1.5, 2.0, 8).reshape(shape))

    def forward(self, x):
        y = self.fc(x)
        if self.variant == "after_gelu":  # gamma * gelu(fc(x)): the activation is in between
            return self.gamma * F.gelu(y)
        if self.variant == "reused":  # fc(x) read twice: nothing to fold into
            return self.gamma * y + self.fc2(y)
        if self.variant == "right":
            return self.fc2(y * self.gamma)
        return self.fc2(self.gamma * y)


@pytest.mark.parametrize("variant, folds", [("left", True), ("right", True), ("broadcast", True),
                                            ("after_gelu", False), ("reused", False)])
def test_layer_scale_is_folded_into_the_linear_layer(tmp_path, model_backend, variant, folds):
    """``gamma * linear(x)`` with a constant gamma of one value per feature: the runtime scales
    the linear layer's weight columns and bias instead of multiplying its output (the
    multiplication's step is gone), with torch's result; where an activation comes between, or
    the linear output has another reader, nothing is folded and the result is torch's too."""
    m = _LayerScale(variant).eval()
    x = torch.from_numpy(rnd(2, 5, 12, seed=3) * 2)
    param = export_torch(m, (x,), tmp_path)
    g = kuiper_xp.load(param, backend=model_backend)
    plain = kuiper_xp.load(param, backend=model_backend, fuse=False)
    with torch.no_grad():
        want = m(x).numpy()
    got = kuiper_xp.to_numpy(g(x.numpy())[0])
    assert_close(got, want, rtol=1e-5)
    assert_close(kuiper_xp.to_numpy(plain(x.numpy())[0]), want, rtol=1e-5)
    scaled = [pair for pair in g.fused if pair[0] == "fc" and "expr" in pair[1]]
    assert bool(scaled) == folds, g.fused
    if folds:
        assert len(g.execution_order) < len(plain.execution_order)
