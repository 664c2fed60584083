"""The cupy backend's own paths: fused expression kernels and CUDA-graph replay (skipped where no
CUDA device answers). The rest of the suite runs on the cupy leg through the ``backend``
fixture; these tests check what only exists there, against torch and the generic code."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import assert_close
from helpers import export_module, export_torch, make_layer, special_inputs, torch_outputs
from kuiper_xp.backends import get_backend, list_backends

import kuiper_xp
from kuiper_xp.errors import ShapeError

_CUPY = {i.name: i for i in list_backends()}["cupy"]
pytestmark = pytest.mark.skipif(not _CUPY.available, reason=f"cupy unavailable: {_CUPY.reason}")

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture(scope="module")
def cp_backend():
    return get_backend("cupy")



# (expression, torch function of the inputs); every one is fused on cupy
FUSED = [
    ("add(@0,mul(@1,@2))", lambda a, b, c: a + b * c),  # the seeds' example
    ("div(sub(@0,@1),add(abs(@2),0.5))", lambda a, b, c: (a - b) / (c.abs() + 0.5)),
    ("mul(@0,div(1,add(1,exp(neg(@0)))))", lambda a: a * (1 / (1 + torch.exp(-a)))),
    ("max(@0,min(@1,3.5))", lambda a, b: torch.maximum(a, torch.minimum(b, torch.tensor(3.5)))),
    ("pow(@0,2)", lambda a: a ** 2),
    ("sqrt(add(square(@0),1e-05))", lambda a: torch.sqrt(a * a + 1e-05)),
    ("rsqrt(add(@0,1))", lambda a: torch.rsqrt(a + 1)),
    ("add(@0,@1,2)", lambda a, b: a + 2 * b),
    ("sub(@0,@1,0.5)", lambda a, b: a - 0.5 * b),
    ("round(mul(@0,2.5))", lambda a: torch.round(a * 2.5)),
    ("floor(@0)", torch.floor),
    ("tanh(atan2(@0,@1))", lambda a, b: torch.tanh(torch.atan2(a, b))),
    ("mul(erf(@0),log1p(abs(@1)))", lambda a, b: torch.erf(a) * torch.log1p(b.abs())),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("expr,fn", FUSED, ids=[e for e, _ in FUSED])
def test_fused_expression_matches_torch_and_the_generic_path(cp_backend, expr, fn, dtype):
    """One kernel per expression, broadcasting (4-D with a per-channel and a scalar-like input),
    NaN/inf where torch has them; the same as the evaluator's generic result."""
    n = 1 + max(int(t[0]) for t in expr.split("@")[1:])
    layer = make_layer(cp_backend, "pnnx.Expression", f"expr={expr}", n_in=n)
    assert layer._fused is not None, f"{expr} was not fused"
    shapes = [(2, 3, 4, 5), (1, 3, 1, 1), (2, 3, 4, 5)]
    host = special_inputs(n, shapes, dtype)
    got = layer(*[cp_backend.asarray(h) for h in host])
    with torch.no_grad():
        want = fn(*[torch.from_numpy(h) for h in host]).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's warnings on inf - inf and the like
        generic = make_layer(get_backend("numpy"), "pnnx.Expression", f"expr={expr}", n_in=n)(*host)
    tol = 4e-6 if dtype == np.float32 else 1e-12
    assert_close(got, want, rtol=tol, atol=tol, what=f"{expr} vs torch")
    assert_close(got, np.asarray(generic), rtol=tol, atol=tol, what=f"{expr} vs generic")


def test_fused_expression_falls_back_for_other_dtypes_and_bad_shapes(cp_backend):
    """Integer inputs, mixed float dtypes and numpy inputs take the evaluator (torch's promotion);
    shapes that do not broadcast get the evaluator's error naming the expression."""
    layer = make_layer(cp_backend, "pnnx.Expression", "expr=add(@0,mul(@1,2))", n_in=2)
    assert layer._fused is not None
    a = cp_backend.asarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    b = cp_backend.asarray(np.ones((2, 3), np.float64))
    out = layer(a, a)
    assert out.dtype == cp_backend.xp.int64
    np.testing.assert_array_equal(kuiper_xp.to_numpy(out), np.arange(6).reshape(2, 3) * 3)
    out = layer(cp_backend.asarray(np.ones((2, 3), np.float32)), b)
    assert out.dtype == cp_backend.xp.float64  # float32 + float64 tensor: float64, as torch
    with pytest.raises(Exception, match="add|mul|broadcast|shape"):
        layer(cp_backend.asarray(np.ones((2, 3), np.float32)), cp_backend.asarray(np.ones((4,), np.float32)))


def test_not_fused_when_a_function_is_outside_the_table(cp_backend):
    for expr in ("fmod(@0,2.0)", "eq(@0,@1)", "size(@0,1)", "add(@0,inf)"):
        n = 2 if "@1" in expr else 1
        try:
            layer = make_layer(cp_backend, "pnnx.Expression", f"expr={expr}", n_in=n)
        except Exception:  # noqa: BLE001 - a literal the parser refuses: nothing to fuse either
            continue
        assert layer._fused is None, expr


# -- row kernels: LayerNorm and softmax -----------------------------------------------------------
def _maybe(fn):
    return lambda a: None if a is None else fn(a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 33), (2, 3, 64), (4, 777), (2, 4100)])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
def test_layer_norm_kernel_matches_torch(cp_backend, shape, dtype, affine):
    """cupy_fast.layer_norm: rows shorter and longer than a warp, not a multiple of 32, over two
    trailing axes, each of weight and bias present or not; values offset by 50 (the two-pass
    variance); a permuted (non-contiguous) input."""
    import cupy
    from kuiper_xp.backends import cupy_fast as cf
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 50).astype(dtype)
    d = shape[-1]
    w = rng.standard_normal(d).astype(dtype) if affine[0] else None
    b = rng.standard_normal(d).astype(dtype) if affine[1] else None
    t, c = _maybe(torch.from_numpy), _maybe(cupy.asarray)
    want = F.layer_norm(torch.from_numpy(x), (d,), t(w), t(b), 1e-5).numpy()
    got = cf.layer_norm(cupy.asarray(x), d, c(w), c(b), 1e-5)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    assert_close(got, want, rtol=tol, atol=tol, what=f"layer_norm {shape}")
    if len(shape) == 3:  # the trailing two axes as one row of 3 * 64
        want = F.layer_norm(torch.from_numpy(x), shape[1:], None, None, 1e-3).numpy()
        assert_close(cf.layer_norm(cupy.asarray(x), shape[1] * shape[2], None, None, 1e-3), want,
                     rtol=tol, atol=tol, what="layer_norm over two axes")
        xt = np.ascontiguousarray(np.swapaxes(x, 1, 2))  # (2, 64, 3); normalised over the 3
        want = F.layer_norm(torch.from_numpy(xt).transpose(1, 2), (64,), t(w), t(b), 1e-5).numpy()
        got = cf.layer_norm(cupy.swapaxes(cupy.asarray(xt), 1, 2), 64, c(w), c(b), 1e-5)
        assert_close(got, want, rtol=tol, atol=tol, what="layer_norm of a permuted input")


def test_layer_norm_kernel_declines(cp_backend):
    import cupy
    from kuiper_xp.backends import cupy_fast as cf
    x = cupy.ones((2, 12), cupy.float32)
    assert cf.layer_norm(cupy.ones((2, 12), cupy.int64), 12) is None
    assert cf.layer_norm(x, 12, cupy.ones(12, cupy.float64)) is None  # another dtype
    assert cf.layer_norm(x, 5) is None  # rows do not divide the array
    assert cf.layer_norm(np.ones((2, 12), np.float32), 12) is None
    assert cf.layer_norm(cupy.ones((1, cf.ROW_KERNEL_MAX + 1), cupy.float32), cf.ROW_KERNEL_MAX + 1) is None


# (n, channels in, multiplier, h, w, kernel (kh, kw), pads ((top, bottom), (left, right)))
DEPTHWISE_ROW_CASES = [
    (2, 5, 1, 13, 17, (7, 7), ((3, 3), (3, 3))),  # ConvNeXt's; widths not a multiple of R
    (1, 3, 1, 9, 11, (3, 3), ((1, 1), (1, 1))),
    (3, 4, 2, 6, 5, (5, 5), ((2, 2), (2, 2))),  # a channel multiplier of 2; w < kernel + R - 1
    (1, 2, 1, 5, 23, (1, 11), ((0, 0), (5, 5))),  # a strip convolution (SegNeXt's 1x11)
    (1, 3, 1, 8, 8, (3, 3), ((0, 2), (1, 0))),  # asymmetric padding
    (2, 4, 1, 7, 7, (3, 3), ((0, 0), (0, 0))),  # no padding: every row's window inside
    (1, 2, 1, 4, 3, (2, 2), ((0, 1), (1, 0))),  # an even kernel; 3 columns
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", DEPTHWISE_ROW_CASES, ids=[f"{c[5][0]}x{c[5][1]}-{c[3]}x{c[4]}" for c in DEPTHWISE_ROW_CASES])
def test_depthwise_row_kernel_matches_torch(cp_backend, case, dtype, monkeypatch):
    """The stride-1 depthwise kernel that computes R outputs of a row per thread, for R = 1 (the
    one-output kernel), 2, 4 and 8: against torch's grouped convolution on the CPU, with NaN and
    inf in the input (only the outputs whose windows hold them are NaN/inf, as torch's: taps
    outside the input are skipped, never read as zeros)."""
    import cupy
    from kuiper_xp.backends import cupy_fast as cf
    n, c, mult, h, w, (kh, kw), ((pt, pb), (pl, pr)) = case
    rng = np.random.default_rng(h * w + kh)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    x[0, 0, h // 2, w - 1] = np.nan
    x[-1, c - 1, 0, 0] = np.inf
    wt = rng.standard_normal((c * mult, 1, kh, kw)).astype(dtype)
    b = rng.standard_normal(c * mult).astype(dtype)
    xt = F.pad(torch.from_numpy(x), (pl, pr, pt, pb))
    want = F.conv2d(xt, torch.from_numpy(wt), torch.from_numpy(b), groups=c).numpy()
    plan = cf.conv2d_plan(cupy.asarray(wt), cupy.asarray(b), groups=c, pads=((pt, pb), (pl, pr)))
    assert plan.algo == "depthwise"
    tol = 1e-5 if dtype == np.float32 else 1e-12
    got = {}
    for r in (0, 2, 4, 8):
        monkeypatch.setattr(cf, "DEPTHWISE_ROW", r)
        got[r] = cupy.asnumpy(plan(cupy.asarray(x)))
        assert_close(got[r], want, rtol=tol, what=f"depthwise {kh}x{kw}, {r} outputs a thread")
    for r in (2, 4, 8):  # the same sums in the same order as the one-output kernel
        np.testing.assert_allclose(got[r], got[0], rtol=1e-6 if dtype == np.float32 else 1e-14, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", [None, "gelu", "silu", "sigmoid", "tanh", "hardswish", "mish", "relu",
                                 ("clamp", 0.0, 6.0), ("clamp", None, 1.5), ("leaky", 0.1), ("elu", 1.0, 1.0, 1.0)],
                         ids=str)
def test_linear_bias_and_activation_as_one_kernel(cp_backend, act, dtype, monkeypatch):
    """cupy_fast.linear adds the bias and applies the activation in one kernel: the same values
    as the two kernels before it (bit for bit), and torch's; NaN and inf in the input rows."""
    import cupy
    from kuiper_xp.backends import cupy_fast as cf
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5, 37)).astype(dtype)
    x[0, 0, 3], x[1, 2, 0] = np.nan, np.inf
    wt = rng.standard_normal((37, 29)).astype(dtype)
    b = rng.standard_normal(29).astype(dtype)
    args = [cupy.asarray(a) for a in (x, wt, b)]
    calls = []
    monkeypatch.setattr(cf, "_bias_activation", lambda *a, f=cf._bias_activation: calls.append(1) or f(*a))
    one = cupy.asnumpy(cf.linear(*args, act))
    assert calls, "the one-kernel path was not taken"
    monkeypatch.setattr(cf, "FUSED_BIAS", False)
    two = cupy.asnumpy(cf.linear(*args, act))
    np.testing.assert_array_equal(one, two)
    # torch's activation in float64 on the product rounded to the dtype: torch 2.11's float32 GELU
    # of +inf was NaN on the CPU (2.13's is inf, as its float64 GELU and ours)
    y = (torch.from_numpy(x) @ torch.from_numpy(wt) + torch.from_numpy(b)).double()
    fns = {None: lambda v: v, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
           "hardswish": F.hardswish, "mish": F.mish, "relu": F.relu}
    if isinstance(act, tuple):
        kind = act[0]
        want = {"clamp": lambda v: torch.clamp(v, act[1], act[2]), "leaky": lambda v: F.leaky_relu(v, act[1]),
                "elu": lambda v: F.elu(v, act[1])}[kind](y)
    else:
        want = fns[act](y)
    want = want.numpy().astype(dtype)
    assert_close(one, want, rtol=2e-5 if dtype == np.float32 else 1e-12, what=f"linear + {act}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 12, 50, 50), (5, 33), (3, 1000), (2, 8192)])
def test_softmax_kernel_matches_torch(cp_backend, shape, dtype):
    """cupy_fast.softmax_last against torch: scores of all sizes, a row with a -1e9 mask, a row
    of large values (1e30: the shift by the max), a row with a NaN, one all -inf and one with +inf
    (NaN rows, as torch's)."""
    import cupy
    from kuiper_xp.backends import cupy_fast as cf
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] >= 6 and shape[-1] >= 3:
        rows[0, 1:] = -1e9
        rows[1] *= 1e30 if dtype == np.float64 else 1e37
        rows[2, 1] = np.nan
        rows[3] = -np.inf
        rows[4, 2] = np.inf
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    got = cf.softmax_last(cupy.asarray(x))
    tol = 2e-6 if dtype == np.float32 else 1e-12
    g = kuiper_xp.to_numpy(got)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
    assert_close(got, want, rtol=tol, atol=tol, what=f"softmax {shape}")
    assert cf.softmax_last(cupy.asarray(x[..., :0])) is None
    assert cf.softmax_last(cupy.ones((2, 3), cupy.int32)) is None
    assert cf.softmax_last(cupy.ones((1, cf.ROW_KERNEL_MAX + 1), cupy.float32)) is None


# -- CUDA graphs -----------------------------------------------------------------------------------
class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = F.silu(self.bn(self.c1(x)))
        y = y + torch.sigmoid(y) * 0.5
        y = F.relu(self.c2(y))
        return self.fc(y.mean((2, 3))), y


@pytest.fixture(scope="module")
def small_net(tmp_path_factory):
    torch.manual_seed(0)
    m = SmallNet().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    d = tmp_path_factory.mktemp("graphs")
    param = export_torch(m, (torch.randn(1, 3, 16, 16),), d, inputs2=(torch.randn(2, 3, 20, 20),))
    return m, param


def test_cuda_graph_replays_match_eager_and_torch(small_net, monkeypatch):
    """Call 1 eager, call 2 captures, later calls replay: each with new input values (copied into
    the graph's static inputs), results bit-equal to the eager path and close to torch, earlier
    results not overwritten by later replays; a second shape gets its own graph."""
    m, param = small_net
    g = kuiper_xp.load(param, backend="cupy")
    eager = kuiper_xp.load(param, backend="cupy")
    eager.cuda_graphs = False
    assert g.cuda_graphs
    rng = np.random.default_rng(1)
    kept = []
    for shape in [(1, 3, 16, 16)] * 5 + [(2, 3, 20, 20)] * 3 + [(1, 3, 16, 16)]:
        x = rng.standard_normal(shape).astype(np.float32)
        outs = g(x)
        ref = eager(x)
        for a, b in zip(outs, ref):
            np.testing.assert_array_equal(kuiper_xp.to_numpy(a), kuiper_xp.to_numpy(b))
        for a, e in zip(outs, torch_outputs(m, (torch.from_numpy(x),))):
            assert_close(a, e, rtol=1e-4)
        kept.append((x, [kuiper_xp.to_numpy(o).copy() for o in outs], outs))
    for _x, host, outs in kept:  # replays return fresh arrays: earlier results unchanged
        for h, o in zip(host, outs):
            np.testing.assert_array_equal(kuiper_xp.to_numpy(o), h)
    st = g._replayer.stats
    assert st["captured"] == 2 and not st["failed"], st
    assert st["replays"] == 3 + 1 + 1, st


def test_cuda_graph_capture_failure_falls_back_to_eager(small_net, monkeypatch):
    """A layer that reads a device value on the host cannot be captured: a warning, that shape
    stays eager, and the results are still right."""
    m, param = small_net
    g = kuiper_xp.load(param, backend="cupy").build()
    layer = g._steps[-1].layer
    orig = layer.forward

    def syncing(*args):
        float(kuiper_xp.to_numpy(args[0]).ravel()[0])  # a device-to-host copy
        return orig(*args)

    monkeypatch.setattr(layer, "forward", syncing)
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    expected = torch_outputs(m, (torch.from_numpy(x),))
    g(x)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture"):
        outs = g(x)
    outs2 = g(x)
    for o, o2, e in zip(outs, outs2, expected):
        assert_close(o, e, rtol=1e-4)
        assert_close(o2, e, rtol=1e-4)
    st = g._replayer.stats
    assert st["captured"] == 0 and len(st["failed"]) == 1 and st["replays"] == 0


def test_cuda_graphs_switched_off_by_the_environment(small_net, monkeypatch):
    monkeypatch.setenv("KUIPER_XP_CUDA_GRAPHS", "0")
    g = kuiper_xp.load(small_net[1], backend="cupy")
    assert not g.cuda_graphs


class Lookups(torch.nn.Module):
    """Data-indexed lookups (embedding, gather, advanced index, one_hot) whose range checks read
    nothing on the host on cupy, so the pass can be captured."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(9, 4)

    def forward(self, ids, x, g):
        e = self.emb(ids)
        return e + torch.gather(x, 1, g)[:, :, None] + x[:, ids[0] % 6][..., None], F.one_hot(ids, 10).sum(1)


def test_lookups_are_captured_and_their_range_checked_after_each_replay(tmp_path):
    """Embedding, gather, Tensor.index and one_hot check their index range on the device (flags
    read once per pass, kuiper_xp.layers.checks): the pass is captured as a CUDA graph, and a
    bad index in a later replay is still a ShapeError naming the operator."""
    torch.manual_seed(0)
    m = Lookups().eval()
    ids, x, g = torch.tensor([[0, 8, 3, 2]]), torch.randn(1, 6), torch.tensor([[5, 0, 1, 1]])
    param = export_module(m, (ids, x, g), tmp_path,  # (pnnx's python file: a SyntaxError, ignored)
                          inputs2=(ids.repeat(2, 1), x.repeat(2, 1), g.repeat(2, 1)))
    gr = kuiper_xp.load(param, backend="cupy")
    rng = np.random.default_rng(0)
    for _ in range(4):
        args = (rng.integers(0, 9, (1, 4)), rng.standard_normal((1, 6)).astype(np.float32),
                rng.integers(0, 6, (1, 4)))
        for a, e in zip(gr(*args), torch_outputs(m, tuple(torch.from_numpy(v) for v in args))):
            assert_close(a, e, rtol=1e-5)
    st = gr._replayer.stats
    assert st["captured"] == 1 and not st["failed"] and st["replays"] == 2, st
    with pytest.raises(ShapeError, match=r"nn\.Embedding.*out of range for an embedding table of 9 rows"):
        gr(np.array([[0, 9, 1, 1]]), args[1], args[2])
    with pytest.raises(ShapeError, match=r"torch\.gather.*out of range"):
        gr(args[0], args[1], np.array([[0, 6, 1, 1]]))
    assert gr._replayer.stats["replays"] == 4
