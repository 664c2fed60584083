"""Activation layers against torch: every layer over its parameters on every backend leg, with
NaN/Inf inputs, dtype rules, bad parameters, and whole pnnx exports run through kuiper_xp.load."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close
from helpers import (  # noqa: E402
    export_torch,
    in_fast_scope,
    make_layer,
    run,
    run_graph,
    torch_outputs,
    use_compiled,
)

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError

# inf * 0 and inf / inf are part of the NaN/Inf checks: numpy warns, torch gives the same NaN
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


# -- helpers -------------------------------------------------------------------------------------
def gelu(x, approximate="none"):
    """torch's GELU with GELU(+inf) = +inf, its limit: torch 2.13's CPU kernel gives +inf there, but
    torch 2.11's AVX-512 kernel (the GPU machine's CPU) gives NaN, which would fail the NaN checks
    of every backend on that machine."""
    return torch.where(torch.isposinf(x), x, F.gelu(x, approximate=approximate))


def special_input(shape=(2, 3, 4, 5), dtype=np.float32, seed=0):
    """Random values with NaN, +-Inf, +-0, +-3 (kinks), +-25 and +-100 (overflow checks) mixed in."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    flat = x.reshape(-1)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 25.0, -25.0, 100.0, -100.0, 0.5, -0.5]
    flat[: len(specials)] = specials
    return x


def check(actual, expected, rtol=2e-6, atol=2e-6, what="output"):
    """assert_close (shape, dtype, NaN and Inf positions), then the finite values against a bound
    from the finite expected values only (an Inf in ``expected`` must not widen the bound)."""
    assert_close(actual, expected, rtol=rtol, atol=atol, what=what)
    a, e = kuiper_xp.to_numpy(actual), np.asarray(expected)
    if e.dtype.kind == "f":
        fin = np.isfinite(e)
        if fin.any():
            bound = rtol * float(np.abs(e[fin]).max()) + atol
            err = float(np.abs(a[fin].astype(np.float64) - e[fin]).max())
            assert err <= bound, f"{what}: max |difference| {err:.3g} > {bound:.3g} on finite values"


def torch_ref(fn, *host):
    with torch.no_grad():
        out = fn(*[torch.from_numpy(np.ascontiguousarray(h)) for h in host])
    return out.numpy()


# -- elementwise grid ----------------------------------------------------------------------------
# (pnnx type, parameter text, torch function)
ELEMENTWISE = [
    ("nn.ReLU", "", F.relu),
    ("F.relu", "", F.relu),
    ("nn.ReLU6", "", F.relu6),
    ("F.relu6", "", F.relu6),
    ("nn.Hardtanh", "min_val=-2.0 max_val=3.0", lambda x: F.hardtanh(x, -2.0, 3.0)),
    ("F.hardtanh", "max_val=1.0 min_val=-1.0", F.hardtanh),
    ("torch.clamp", "max=None min=-0.5", lambda x: torch.clamp(x, min=-0.5)),
    ("torch.clamp", "max=0.5 min=None", lambda x: torch.clamp(x, max=0.5)),
    ("torch.clamp", "max=0.2 min=-0.1", lambda x: torch.clamp(x, -0.1, 0.2)),
    ("torch.clamp", "max=-1.0 min=1.0", lambda x: torch.clamp(x, 1.0, -1.0)),  # min > max
    ("torch.clamp", "max=1 min=-1", lambda x: torch.clip(x, -1, 1)),
    ("nn.LeakyReLU", "negative_slope=0.2", lambda x: F.leaky_relu(x, 0.2)),
    ("F.leaky_relu", "", F.leaky_relu),
    ("F.leaky_relu", "negative_slope=-1.5", lambda x: F.leaky_relu(x, -1.5)),
    ("F.leaky_relu", "negative_slope=0.0", lambda x: F.leaky_relu(x, 0.0)),  # +inf stays +inf
    ("nn.LeakyReLU", "negative_slope=1.5", lambda x: F.leaky_relu(x, 1.5)),
    ("nn.RReLU", "lower=0.125 upper=0.333333343", nn.RReLU().eval()),
    ("nn.ELU", "alpha=0.7", lambda x: F.elu(x, 0.7)),
    ("F.elu", "alpha=1.0", F.elu),
    ("nn.CELU", "alpha=0.5", lambda x: F.celu(x, 0.5)),
    ("nn.SELU", "", F.selu),
    ("F.selu", "", F.selu),
    ("nn.SiLU", "", F.silu),
    ("F.silu", "", F.silu),
    ("nn.Hardswish", "", F.hardswish),
    ("F.hardswish", "", F.hardswish),
    ("nn.Hardsigmoid", "", F.hardsigmoid),
    ("F.hardsigmoid", "", F.hardsigmoid),
    ("nn.Sigmoid", "", torch.sigmoid),
    ("F.sigmoid", "", torch.sigmoid),
    ("nn.Tanh", "", torch.tanh),
    ("F.tanh", "", torch.tanh),
    ("nn.GELU", "", gelu),
    ("F.gelu", "approximate=tanh", lambda x: gelu(x, approximate="tanh")),
    ("nn.Mish", "", F.mish),
    ("F.mish", "", F.mish),
    ("nn.Softplus", "beta=2.0 threshold=10.0", lambda x: F.softplus(x, 2.0, 10.0)),
    ("F.softplus", "beta=1 threshold=20", F.softplus),
    ("F.softplus", "beta=0.5 threshold=1.0", lambda x: F.softplus(x, 0.5, 1.0)),
    ("nn.Threshold", "threshold=0.1 value=20.0", lambda x: F.threshold(x, 0.1, 20.0)),
    ("nn.Hardshrink", "lambd=0.2", lambda x: F.hardshrink(x, 0.2)),
    ("nn.Softshrink", "lambd=0.3", lambda x: F.softshrink(x, 0.3)),
    ("nn.Tanhshrink", "", F.tanhshrink),
    ("nn.LogSigmoid", "", F.logsigmoid),
    ("nn.Softsign", "", F.softsign),
]


@pytest.mark.parametrize("op_type,params,fn", ELEMENTWISE,
                         ids=[f"{t}[{p}]" if p else t for t, p, _ in ELEMENTWISE])
def test_elementwise_matches_torch(backend, op_type, params, fn):
    x = special_input()
    layer = make_layer(backend, op_type, params)
    expected = torch_ref(fn, x)
    check(run(backend, layer, x), expected, rtol=2e-6, atol=2e-6, what=f"{op_type} {params}")


@pytest.mark.parametrize("op_type,params,fn", [
    ("nn.GELU", "", gelu), ("nn.SiLU", "", F.silu), ("nn.Mish", "", F.mish),
    ("nn.ELU", "alpha=0.7", lambda x: F.elu(x, 0.7)), ("F.softplus", "beta=2.0 threshold=20.0",
                                                       lambda x: F.softplus(x, 2.0, 20.0)),
    ("nn.Hardswish", "", F.hardswish), ("nn.Sigmoid", "", torch.sigmoid), ("nn.LogSigmoid", "", F.logsigmoid),
])
def test_float64_stays_float64(backend, op_type, params, fn):
    x = special_input(shape=(3, 7), dtype=np.float64, seed=1)
    layer = make_layer(backend, op_type, params)
    check(run(backend, layer, x), torch_ref(fn, x), rtol=1e-12, atol=1e-13, what=op_type)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_type,params,fn", [
    ("nn.ELU", "alpha=0.7", lambda x: F.elu(x, 0.7)), ("nn.CELU", "alpha=0.5", lambda x: F.celu(x, 0.5)),
    ("nn.SELU", "", F.selu), ("nn.Mish", "", F.mish), ("F.softplus", "beta=1 threshold=20", F.softplus),
    ("F.softplus", "beta=0.5 threshold=1.0", lambda x: F.softplus(x, 0.5, 1.0)), ("nn.LogSigmoid", "", F.logsigmoid),
])
def test_expm1_log1p_free_activations_keep_relative_accuracy(backend, op_type, params, fn, dtype):
    """ELU/CELU/SELU, Mish, Softplus and LogSigmoid avoid NumPy's slow expm1/log1p: every
    element, tiny ones included (1e-30 .. 1e2 of either sign), within a few ulps of torch's
    float64 result, not only against the map's largest value."""
    mag = np.logspace(-30, 2, 161)
    x = np.concatenate([-mag, mag, [0.0, -0.0, np.inf, -np.inf, np.nan]]).astype(dtype)
    layer = make_layer(backend, op_type, params)
    got = kuiper_xp.to_numpy(run(backend, layer, x))
    want = fn(torch.from_numpy(x.astype(np.float64))).numpy().astype(dtype)
    tiny = np.finfo(dtype).tiny
    np.testing.assert_allclose(got, want, rtol=4e-6 if dtype == np.float32 else 1e-13, atol=tiny,
                               equal_nan=True, err_msg=f"{op_type} {params}")


def test_activations_on_a_noncontiguous_input(backend):
    """A permuted view (non-contiguous on numpy) goes through unchanged semantics."""
    x = special_input(seed=2)
    xt = np.transpose(x, (0, 2, 3, 1))
    xp = backend.xp
    arr = xp.permute_dims(backend.asarray(x), (0, 2, 3, 1))
    for op_type, fn in (("nn.Hardswish", F.hardswish), ("nn.GELU", gelu), ("nn.ReLU6", F.relu6)):
        check(make_layer(backend, op_type)(arr), torch_ref(fn, xt), rtol=2e-6, atol=2e-6, what=op_type)


def test_integer_inputs_keep_torch_dtypes(backend):
    x = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    cases = [
        ("nn.ReLU", "", F.relu),
        ("torch.clamp", "max=3 min=-2", lambda t: torch.clamp(t, -2, 3)),
        ("torch.clamp", "max=None min=0", lambda t: torch.clamp(t, min=0)),
        ("nn.ReLU6", "", lambda t: torch.clamp(t, 0, 6)),  # F.relu6 on ints: hardtanh, same values
        ("torch.clamp", "max=2.5 min=None", lambda t: torch.clamp(t, max=2.5)),  # promotes to float32
        ("nn.Tanh", "", torch.tanh),  # int -> float32
        ("nn.Sigmoid", "", torch.sigmoid),
    ]
    for op_type, params, fn in cases:
        layer = make_layer(backend, op_type, params)
        check(run(backend, layer, x), torch_ref(fn, x), rtol=1e-6, what=f"{op_type} {params} int32")


def test_clamp_with_tensor_bounds(backend):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    lo = rng.standard_normal((3, 1)).astype(np.float32) - 0.5
    hi = lo + 1.0
    layer = make_layer(backend, "torch.clamp", "", n_in=3, names=("input", "min", "max"))
    expected = torch_ref(lambda a, b, c: torch.clamp(a, b, c), x, lo, hi)
    check(run(backend, layer, x, lo, hi), expected, what="clamp(x, tensor, tensor)")
    layer = make_layer(backend, "torch.clamp", "max=None", n_in=2, names=("input", "min"))
    expected = torch_ref(lambda a, b: torch.clamp(a, min=b), x, lo)
    check(run(backend, layer, x, lo), expected, what="clamp(x, min=tensor)")


def test_clamp_with_a_size_as_bound(model_backend, tmp_path):
    """``torch.clamp(x, max=x.shape[0])``: pnnx passes the size an expression computes (a Python
    number, not a tensor) as the ``$max`` operand."""
    from helpers import export_torch, run_graph

    class ClampBySize(torch.nn.Module):
        def forward(self, x, ids):
            return torch.clamp(x, max=x.shape[0]), torch.clamp(ids, min=ids.shape[1] - 3, max=ids.shape[1])

    gen = torch.Generator().manual_seed(0)
    ins = [(torch.randn(b, 8, generator=gen) * 3, torch.randint(-4, 12, (b, 6), generator=gen)) for b in (1, 3)]
    param = export_torch(ClampBySize(), ins[0], tmp_path, inputs2=ins[1])
    assert "$max" in param.read_text()
    for x, ids in ins:
        with torch.no_grad():
            want = ClampBySize()(x, ids)
        for got, e in zip(run_graph(param, model_backend, [x, ids]), want):
            check(got, e.numpy(), rtol=0, what="clamp by a size")


def test_clamp_with_infinite_bounds(backend):
    # pnnx writes float('inf') as a bare word (max=inf), -inf as a number
    x = np.array([[-np.inf, -1.5, 0.0], [2.5, np.inf, np.nan]], np.float32)
    for params, fn in (("min=-inf max=inf", lambda a: torch.clamp(a, -float("inf"), float("inf"))),
                       ("min=0.5 max=inf", lambda a: torch.clamp(a, 0.5, float("inf"))),
                       ("min=-inf max=nan", lambda a: torch.clamp(a, -float("inf"), float("nan")))):
        layer = make_layer(backend, "torch.clamp", params)
        check(run(backend, layer, x), torch_ref(fn, x), what=f"torch.clamp {params}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_prelu_plane_blocks_threads(monkeypatch, dtype):
    """The numpy fast PReLU: plane blocks (the last one short) over 3 threads, NaN and +-inf,
    slopes of another dtype; against torch. Inputs it does not take give None."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "NORM_BLOCK_ELEMENTS", 20)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = (np.random.default_rng(3).standard_normal((3, 5, 4, 3)) * 4).astype(dtype)
    x[0, 1, 2, 1], x[1, 2, 0, 0], x[2, 4, 3, 2] = np.nan, np.inf, -np.inf
    w = np.linspace(-0.5, 1.5, 5).astype(np.float32)
    want = F.prelu(torch.from_numpy(x), torch.from_numpy(w.astype(dtype))).numpy()
    got = in_fast_scope(nf, lambda: nf.prelu(x, w))
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert nf.prelu(x.transpose(0, 2, 3, 1), w) is None
    assert nf.prelu(x, np.ones(4, dtype)) is None
    assert nf.prelu(x.astype(np.int32), w) is None


def test_prelu_with_weight_input(backend):
    rng = np.random.default_rng(4)
    x = special_input(shape=(2, 3, 5), seed=4)
    for w in (np.array([0.25, -0.1, 2.0], np.float32), np.array([0.3], np.float32)):
        layer = make_layer(backend, "F.prelu", "", n_in=2, names=("input", "weight"))
        check(run(backend, layer, x, w), torch_ref(F.prelu, x, w), what=f"prelu {w.size} slopes")
    layer = make_layer(backend, "F.prelu", "", n_in=2, names=("input", "weight"))
    with pytest.raises(ShapeError, match="slopes"):
        run(backend, layer, x, rng.standard_normal(4).astype(np.float32))


# -- softmax family --------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("op_type,fn", [
    ("nn.Softmax", F.softmax), ("F.softmax", F.softmax), ("nn.LogSoftmax", F.log_softmax),
    ("F.log_softmax", F.log_softmax), ("nn.Softmin", F.softmin),
])
def test_softmax_family(backend, op_type, fn, dim):
    x = (np.random.default_rng(5).standard_normal((3, 4, 5)) * 20).astype(np.float32)  # needs max-shift
    layer = make_layer(backend, op_type, f"dim={dim}")
    check(run(backend, layer, x), torch_ref(lambda t: fn(t, dim=dim), x), rtol=1e-5, atol=1e-6,
                 what=f"{op_type} dim={dim}")


def test_softmax_flushes_subnormal_weights(backend):
    """A Swin window mask of -100: exponentials under float32's smallest normal come out 0 (the
    product after the softmax ran 8-10x slower on subnormal weights); torch's values otherwise,
    -inf still 0 and an all -inf row still NaN."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 49, 49)).astype(np.float32)
    x[rng.random(x.shape) < 0.3] -= 100.0
    x[0, 0, :5] = -np.inf
    x[1, 2, :] = -np.inf
    layer = make_layer(backend, "F.softmax", "dim=-1")
    got = backend.to_numpy(run(backend, layer, x))
    check(got, torch_ref(lambda t: F.softmax(t, dim=-1), x), rtol=1e-6, atol=1e-7, what="masked softmax")
    fin = got[np.isfinite(got)]
    if backend.name == "numpy":
        assert not ((fin > 0) & (fin < np.finfo(np.float32).tiny)).any()
    assert (got[0, 0, :5] == 0).all() and np.isnan(got[1, 2]).all()


def test_softmax_over_an_empty_axis(backend):
    """Batch 0 normalised over the batch axis: torch gives an empty result (a max over the empty
    axis raised)."""
    x = np.zeros((0, 3), np.float32)
    for op_type, fn in (("F.softmax", F.softmax), ("F.log_softmax", F.log_softmax), ("nn.Softmin", F.softmin)):
        for dim in (0, 1):
            layer = make_layer(backend, op_type, f"dim={dim}")
            check(run(backend, layer, x), torch_ref(lambda t, fn=fn, d=dim: fn(t, dim=d), x), what=op_type)


def test_softmax_special_values_and_huge_logits(backend):
    x = np.array([[np.inf, 1.0, 2.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 1.0, 0.0],
                  [np.nan, 1.0, 2.0], [1000.0, 1001.0, -1000.0], [-1e4, -1e4 + 1, -1e4 + 2]], np.float32)
    for op_type, fn in (("F.softmax", F.softmax), ("F.log_softmax", F.log_softmax)):
        layer = make_layer(backend, op_type, "dim=1")
        check(run(backend, layer, x), torch_ref(lambda t, fn=fn: fn(t, dim=1), x), rtol=1e-6, atol=1e-6,
                     what=op_type)


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "numba"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_softmax_rows_blocks_threads(monkeypatch, dtype, compiled):
    """The numpy fast path (and the optional numba kernel for float32): row blocks (the last
    one short) over 3 threads, huge logits, a row with a NaN, an all -inf row (NaN rows, as
    torch), masked -inf entries (exact zeros); against torch. Arguments it does not take give
    None."""
    from kuiper_xp.backends import numpy_fast as nf

    if compiled:
        use_compiled(nf, monkeypatch)
    monkeypatch.setattr(nf, "NORM_BLOCK_ELEMENTS", 30)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = (np.random.default_rng(5).standard_normal((5, 7, 13)) * 20).astype(dtype)
    x[1, 2, 3] = np.nan
    x[2, 4] = -np.inf
    x[3, 1, :4] = 1e4
    x[4, 0, 5:9] = -np.inf
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    ok = ~np.isnan(want)
    # blocks within +-SOFTMAX_NO_SHIFT take exp unshifted (most blocks of 2 rows here), the
    # others (NaN, -inf, 1e4) are shifted by their row max; a bound of 0 shifts every block
    for bound in (nf.SOFTMAX_NO_SHIFT, 0.0):
        monkeypatch.setattr(nf, "SOFTMAX_NO_SHIFT", bound)
        got = in_fast_scope(nf, lambda: nf.softmax_last(x))
        assert got.dtype == dtype and np.array_equal(np.isnan(got), np.isnan(want))
        assert (got[4, 0, 5:9] == 0).all()
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-7)
    assert nf.softmax_last(np.ones((2, 3), np.int64)) is None


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "numba"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,perm", [
    ((4, 9, 9, 3), (0, 3, 1, 2)),        # talking heads: (B, N, N, H) permuted to (B, H, N, N)
    ((1, 40, 33, 5), (0, 3, 2, 1)),      # one item: the copy split over the next axis
    ((2, 3, 4), (2, 0, 1)),              # tiny: one block on this thread
    ((6, 300), (1, 0)),                  # transposed rows
])
def test_numpy_fast_softmax_of_a_permuted_view(monkeypatch, dtype, compiled, shape, perm):
    """A permuted (non-contiguous) array is copied into the output and soft-maxed there: torch's
    values, NaN rows and exact zeros, over 3 threads and small blocks; the input is untouched."""
    from kuiper_xp.backends import numpy_fast as nf

    if compiled:
        use_compiled(nf, monkeypatch)
    monkeypatch.setattr(nf, "NORM_BLOCK_ELEMENTS", 64)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    base = (np.random.default_rng(7).standard_normal(shape) * 10).astype(dtype)
    flat = base.reshape(-1)
    flat[3], flat[11:15], flat[-5:] = np.nan, -np.inf, 1e4
    x = base.transpose(perm)
    assert not x.flags.c_contiguous
    keep = base.copy()
    want = torch.softmax(torch.from_numpy(np.ascontiguousarray(x)), -1).numpy()
    got = in_fast_scope(nf, lambda: nf.softmax_last(x))
    assert got.shape == want.shape and got.dtype == dtype
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got == 0, want == 0)
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-7)
    np.testing.assert_array_equal(base, keep)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_softmax_of_a_few_rows_is_plain(dtype):
    """At most SOFTMAX_PLAIN_MAX_ROWS rows: the plain shifted form, with torch's NaN rows (a NaN,
    all -inf), exact zeros under -inf, huge logits and a -1e9 mask."""
    from kuiper_xp.backends import numpy_fast as nf

    x = (np.random.default_rng(6).standard_normal((5, 13)) * 20).astype(dtype)
    x[0, 3], x[1] = np.nan, -np.inf
    x[2, :4], x[3, 5:9], x[4, -3:] = 1e4, -np.inf, -1e9
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    got = in_fast_scope(nf, lambda: nf.softmax_last(x))
    assert got.dtype == dtype and np.array_equal(np.isnan(got), np.isnan(want))
    assert (got[3, 5:9] == 0).all() and (got[4, -3:] == 0).all()
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_log_softmax_of_a_few_rows(dtype):
    """log_softmax_last (a classifier's last layer): torch's values, its NaN rows (a NaN, all
    -inf, +inf), -inf under -inf, huge logits and a -1e9 mask; arrays it does not take (too many
    rows, not contiguous, integers) give None."""
    from kuiper_xp.backends import numpy_fast as nf

    x = (np.random.default_rng(7).standard_normal((6, 11)) * 20).astype(dtype)
    x[0, 3], x[1], x[5, 2] = np.nan, -np.inf, np.inf
    x[2, :4], x[3, 5:9], x[4, -3:] = 1e4, -np.inf, -1e9
    want = torch.log_softmax(torch.from_numpy(x), -1).numpy()
    got = in_fast_scope(nf, lambda: nf.log_softmax_last(x))
    assert got.dtype == dtype and np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-5)
    assert nf.log_softmax_last(np.zeros((nf.SOFTMAX_PLAIN_MAX_ROWS + 1, 3), dtype)) is None
    assert nf.log_softmax_last(np.swapaxes(x, 0, 1)) is None
    assert nf.log_softmax_last(np.ones((2, 3), np.int64)) is None


def test_softmax2d_and_implicit_dim(backend):
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 5)).astype(np.float32)
    layer = make_layer(backend, "nn.Softmax2d")
    check(run(backend, layer, x), torch_ref(lambda t: F.softmax(t, dim=-3), x), what="Softmax2d")
    # dim=None: torch's legacy choice (dim 1 for a 4-d input)
    layer = make_layer(backend, "nn.Softmax", "dim=None", annotations="#i0=(2,3,4,5)f32")
    check(run(backend, layer, x), torch_ref(lambda t: F.softmax(t, dim=1), x), what="Softmax dim=None")


def test_softmax_dtype_from_output_annotation(backend):
    """F.softmax(x, dim, dtype=torch.float64): pnnx drops dtype=, the output annotation keeps it."""
    x = np.random.default_rng(7).standard_normal((2, 5)).astype(np.float32)
    layer = make_layer(backend, "F.softmax", "dim=1", annotations="#i0=(2,5)f32 #o0=(2,5)f64")
    expected = torch_ref(lambda t: F.softmax(t, 1, dtype=torch.float64), x)
    check(run(backend, layer, x), expected, rtol=1e-12, what="softmax dtype=float64")


def test_glu(backend):
    x = special_input(shape=(2, 4, 6), seed=8)
    for dim in (1, -1, 2):
        layer = make_layer(backend, "nn.GLU", f"dim={dim}")
        check(run(backend, layer, x), torch_ref(lambda t, dim=dim: F.glu(t, dim), x), rtol=2e-6, atol=2e-6,
                     what=f"GLU dim={dim}")
    layer = make_layer(backend, "nn.GLU", "dim=0")
    with pytest.raises(ShapeError, match="even"):
        run(backend, layer, np.ones((3, 2), np.float32))


# -- bad parameters --------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type,params,key,value", [
    ("nn.LeakyReLU", "negative_slope=abc", "negative_slope", "abc"),
    ("nn.ELU", "alpha=True", "alpha", "True"),
    ("nn.Softplus", "beta=(1,2)", "beta", "[1, 2]"),
    ("nn.Softmax", "dim=1.5", "dim", "1.5"),
    ("F.gelu", "approximate=fast", "approximate", "fast"),
    ("torch.clamp", "min=low", "min", "low"),
    ("nn.Hardtanh", "min_val=(1)", "min_val", "[1]"),
])
def test_bad_parameters_name_op_key_and_value(backend, op_type, params, key, value):
    with pytest.raises(LayerParameterError) as info:
        make_layer(backend, op_type, params)
    msg = str(info.value)
    assert op_type in msg and "'op'" in msg and "unit.param" in msg, msg
    assert key in msg and value in msg, msg


def test_softmax_dim_out_of_range(backend):
    layer = make_layer(backend, "F.softmax", "dim=3")
    with pytest.raises(ShapeError, match="dim 3"):
        run(backend, layer, np.ones((2, 3), np.float32))


# -- whole exports ---------------------------------------------------------------------------------
class ActivationZoo(nn.Module):
    """Many activation spellings in one module (one export)."""

    def __init__(self):
        super().__init__()
        self.mods = nn.ModuleList([
            nn.ReLU(), nn.ReLU6(), nn.LeakyReLU(0.2), nn.ELU(0.7), nn.SiLU(), nn.Hardswish(), nn.Hardsigmoid(),
            nn.Tanh(), nn.GELU(), nn.GELU(approximate="tanh"), nn.Mish(), nn.Softplus(2.0, 10.0), nn.PReLU(3),
            nn.Hardtanh(-2.0, 3.0), nn.Softmax(dim=1), nn.LogSoftmax(dim=-1), nn.Sigmoid(), nn.SELU(),
            nn.CELU(0.5), nn.Softsign(), nn.LogSigmoid(), nn.Threshold(0.1, 20.0), nn.Softmin(2),
        ])
        with torch.no_grad():
            self.mods[12].weight.copy_(torch.tensor([0.25, -0.5, 1.5]))

    def forward(self, x):
        outs = [m(x) for m in self.mods]
        outs += [F.relu6(x), F.leaky_relu(x, 0.3), F.elu(x, 1.5), F.silu(x), F.hardswish(x), F.hardsigmoid(x),
                 torch.tanh(x), F.gelu(x), F.gelu(x, approximate="tanh"), F.mish(x), F.softplus(x),
                 F.hardtanh(x, -1.0, 1.0), torch.clamp(x, min=-0.5), torch.clamp(x, max=0.5), torch.clip(x, -1, 1),
                 F.softmax(x, dim=2), torch.softmax(x, -1), F.log_softmax(x, 1), torch.sigmoid(x), torch.relu(x),
                 x * torch.sigmoid(x), x.clamp(min=0)]
        return tuple(outs)


@pytest.fixture(scope="session")
def activation_export(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    return export_torch(ActivationZoo(), (x,), tmp_path_factory.mktemp("act"))


def test_exported_activations_match_torch(model_backend, activation_export):
    x = torch.from_numpy(special_input(seed=9))
    module = ActivationZoo()
    expected = list(torch_outputs(module, (x,)))
    for k in (8, 9, 30, 31):  # the GELU outputs: +inf at +inf (see gelu above)
        expected[k] = np.where(np.isposinf(x.numpy()), np.float32(np.inf), expected[k])
    got = run_graph(activation_export, model_backend, (x,))
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        check(a, e, rtol=2e-6, atol=2e-6, what=f"output {k}")


def test_export_uses_the_expected_types(activation_export):
    text = activation_export.read_text()
    for t in ("nn.ReLU6", "F.relu6", "nn.LeakyReLU", "F.leaky_relu", "nn.ELU", "F.elu", "nn.SiLU", "F.silu",
              "nn.Hardswish", "nn.Hardsigmoid", "F.tanh", "nn.GELU", "F.gelu", "nn.Mish", "F.mish", "nn.Softplus",
              "nn.PReLU", "nn.Hardtanh", "F.hardtanh", "torch.clamp", "nn.Softmax", "F.softmax", "nn.LogSoftmax",
              "F.log_softmax", "nn.SELU", "nn.CELU", "nn.Softsign", "nn.LogSigmoid", "nn.Threshold", "nn.Softmin"):
        assert f"\n{t} " in text, f"the export has no {t}"


def test_float32_erf_used_by_gelu_is_accurate(backend):
    """GELU's float32 erf (rational approximation) against torch.erf in float64, on a dense grid."""
    from kuiper_xp.layers.activation import _erf_float32

    x = np.concatenate([np.linspace(-6, 6, 20001), [np.nan, np.inf, -np.inf, 0.0, 1e-30, -1e-20]]).astype(np.float32)
    got = kuiper_xp.to_numpy(_erf_float32(backend.asarray(x), backend.xp))
    assert got.dtype == np.float32
    expected = torch.erf(torch.from_numpy(x.astype(np.float64))).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    fin = ~np.isnan(expected)
    assert float(np.max(np.abs(got[fin] - expected[fin]))) < 5e-7
    tiny = np.abs(x) < 1e-3  # relative accuracy near 0, where erf(x) ~ 2x/sqrt(pi)
    assert np.allclose(got[tiny], expected[tiny], rtol=1e-6, atol=0)


# -- NumPy fast elementwise kernels (backends/numpy_fast.unary / activation_inplace) -------------
FAST_UNARY = {
    "sigmoid": ("nn.Sigmoid", "", torch.sigmoid),
    "silu": ("nn.SiLU", "", F.silu),
    "hardswish": ("nn.Hardswish", "", F.hardswish),
    "hardsigmoid": ("nn.Hardsigmoid", "", F.hardsigmoid),
    "gelu": ("nn.GELU", "", gelu),
    "gelu_tanh": ("nn.GELU", "approximate=tanh", lambda x: gelu(x, approximate="tanh")),
    "mish": ("nn.Mish", "", F.mish),
    "tanh": ("nn.Tanh", "", torch.tanh),
}


def _fast_numpy():
    from kuiper_xp.backends import get_backend

    return get_backend("numpy").fast


@pytest.fixture(params=[1, 2, 0], ids=["1thread", "2threads", "tiny"])
def small_chunks(request, monkeypatch):
    """Chunks smaller than the arrays (a short last chunk included), on one and two threads;
    "tiny": the arrays under TINY_ELEMENTS, computed whole on a fresh array without chunks."""
    nf = _fast_numpy()
    if request.param == 0:
        monkeypatch.setattr(nf, "TINY_ELEMENTS", 1 << 20)
        yield nf
        return
    monkeypatch.setattr(nf, "UNARY_CHUNK", 64)
    monkeypatch.setattr(nf, "TINY_ELEMENTS", 0)  # (else these small arrays skip the chunks)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 1)
    old = nf.set_num_threads(request.param)
    yield nf
    nf.set_num_threads(old)


@pytest.mark.parametrize("name", sorted(FAST_UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, view", [((2, 3, 4, 5), None), ((3, 85, 4, 5), (0, 2, 3, 1)), ((29,), None),
                                         ((), None), ((0, 4), None), ((6, 9), "slice")],
                         ids=["4d", "permuted", "1d", "0d", "empty", "strided"])
def test_fast_unary_matches_generic_and_torch(small_chunks, name, dtype, shape, view):
    """Fast kernel vs the generic Array-API layer (strict backend) vs torch, NaN/Inf included,
    with no floating-point warnings; a permuted input gives a result laid out the same way."""
    nf = small_chunks
    op_type, params, fn = FAST_UNARY[name]
    if not shape or 0 in shape:
        x = np.full(shape, -100.0, dtype=dtype)
    else:
        x = special_input(shape=shape, dtype=dtype, seed=3)
    if view == "slice":
        x = x[:, ::2]
    elif view is not None:
        x = np.transpose(x, view)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nf.unary(name, x)
    assert got.shape == x.shape and got.dtype == x.dtype
    if view is not None and view != "slice":
        assert got.strides == np.empty_like(x).strides  # same memory order as the input
    expected = torch_ref(fn, x).reshape(x.shape)  # (ascontiguousarray makes 0-d inputs 1-d)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    check(got, expected, rtol=tol, atol=tol, what=f"fast {name}")
    from kuiper_xp.backends import get_backend

    try:
        strict = get_backend("array_api_strict")
    except Exception:  # noqa: BLE001 - array_api_strict not installed: torch alone is the reference
        strict = None
    if strict is not None:
        generic = make_layer(strict, op_type, params)(strict.asarray(np.array(x, order="C")))
        check(got, strict.to_numpy(generic), rtol=tol, atol=tol, what=f"fast {name} vs generic")
    # in place on a fresh contiguous array, and the layer's forward takes the same kernel
    y = np.array(x, order="C")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z = nf.activation_inplace(y, name)
    assert z is y or y.size == 0 or y.ndim == 0
    check(z, expected, rtol=tol, atol=tol, what=f"in-place {name}")


def test_fast_activation_inplace_other_dtypes_and_layouts():
    nf = _fast_numpy()
    x = special_input(shape=(4, 6), seed=4)
    h = x.astype(np.float16)
    got = nf.activation_inplace(h.copy(), "silu")
    assert got.dtype == np.float16
    check(got.astype(np.float32), torch_ref(F.silu, h.astype(np.float32)), rtol=2e-3, atol=2e-3)
    f = np.asfortranarray(x)
    check(nf.activation_inplace(f, "sigmoid"), torch_ref(torch.sigmoid, x))


def test_fusion_spec_names_the_fast_kernel(backend):
    """On NumPy the fusible activations name their in-place kernel; elsewhere the runtime calls
    ``forward`` (fusion_spec is None)."""
    for name, (op_type, params, _) in FAST_UNARY.items():
        layer = make_layer(backend, op_type, params)
        assert layer.fusion_spec() == (name if backend.fast is not None else None)
    assert make_layer(backend, "nn.Softsign").fusion_spec() is None


def test_numpy_fast_clamp_fresh_layout_and_nan(monkeypatch):
    """numpy_fast.clamp (ReLU/clamp layers): one-sided and two-sided, NaN kept, a permuted input
    gives a result laid out alike, chunks split over 3 threads; against torch."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "UNARY_CHUNK", 7)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = np.random.default_rng(5).standard_normal((3, 5, 11)).astype(np.float32).transpose(2, 0, 1)
    x[1, 2, 3] = np.nan
    old = nf.set_num_threads(3)
    try:
        with nf.compute_scope():
            for lo, hi in ((0.0, None), (None, 0.5), (-0.25, 0.75)):
                got = nf.clamp(x, lo, hi)
                want = torch.clamp(torch.from_numpy(np.ascontiguousarray(x)), lo, hi).numpy()
                np.testing.assert_array_equal(got, want)
                assert got.strides == x.strides and not np.shares_memory(got, x)
            assert nf.clamp(np.arange(4), 0, 2) is None  # ints: the generic path
            np.testing.assert_array_equal(nf.clamp(x.astype(np.float64), 0.0, None),
                                          torch.relu(torch.from_numpy(np.ascontiguousarray(x, np.float64))).numpy())
    finally:
        nf.set_num_threads(old)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("table", [True, False], ids=["chords", "formula"])
@pytest.mark.parametrize("threads", [1, 3])
def test_numpy_float32_chord_tables_match_torch(monkeypatch, name, table, threads):
    """The float32 GELU chord tables of the numpy path (forced on) and the formulas they replace
    where numpy lacks AVX-512 (forced off: the exp of a fitted logit, the tanh form), against
    torch in float64 on a dense grid over [-12, 12] (every piece several times, both ends of the
    tables) and at the specials: within 3e-7 of max(1, |x|) (measured 1.9e-7), within 7e-7 of it
    relatively for |x| <= 1, GELU(+-1e-30)
    within 1e-30 (no offset at 0), NaN where torch has NaN, +-inf as torch's, the tails (x on the right,
    ~0 on the left); in place as out of place, in short chunks over the threads."""
    from kuiper_xp.backends import numpy_fast as nf

    ref = {"gelu": gelu, "gelu_tanh": lambda v: gelu(v, approximate="tanh")}[name]
    monkeypatch.setattr(nf, "CHORD_TABLES", table)
    monkeypatch.setattr(nf, "UNARY_CHUNK", 1 << 16)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    edge = nf._CHORD_SPECS[name][1]
    grid = np.linspace(-12, 12, 1_500_007)
    f32 = np.float32
    near = [edge, -edge, np.nextafter(f32(edge), f32(0)), np.nextafter(f32(-edge), f32(-20)), edge + 0.5, -edge - 0.5,
            1e30, -1e30, 3.4e38, -3.4e38, 1e-30, -1e-30, 3e-4, -3e-4, 0.0, -0.0, np.inf, -np.inf, np.nan]
    x = np.concatenate([grid, near]).astype(np.float32)
    want = ref(torch.from_numpy(x.astype(np.float64))).numpy()
    got = in_fast_scope(nf, lambda: nf.unary(name, x), threads)
    inplace = x.copy()
    assert in_fast_scope(nf, lambda: nf.activation_inplace(inplace, name), threads) is inplace
    assert (name in nf._chord_tabs) or not table
    np.testing.assert_array_equal(inplace, got)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf])
    fin = np.isfinite(want)
    err = np.abs(got[fin] - want[fin]) / np.maximum(1.0, np.abs(want[fin]))
    assert float(err.max()) < 3e-7, x[fin][np.argmax(err)]
    tiny = np.abs(x) == np.float32(1e-30)  # (the pieces either side of 0 pass through 0)
    assert np.all(np.abs(got[tiny]) <= 1e-30) and np.all(np.sign(got[tiny]) == np.sign(x[tiny]))
    assert got[-11] == np.float32(3.4e38) and abs(float(got[-10])) < 1e-30  # x on the right, ~0 on the left
    # relatively accurate near 0 (chords of x g(x) had a slope of 0.5 + 0.4 h through 0: 8e-4 off
    # for |x| < 1e-3, grown to 3e-5 by a wav2vec2 feature encoder's six conv + GELU layers);
    # measured 3.7e-7 (torch's float32 GELU: 6.2e-7)
    m = np.logspace(-12, 0, 20001)
    x = np.concatenate([m, -m]).astype(np.float32)
    want = ref(torch.from_numpy(x.astype(np.float64))).numpy()
    got = in_fast_scope(nf, lambda: nf.unary(name, x), threads)
    rel = np.abs(got - want) / np.abs(want)
    assert float(rel.max()) < 7e-7, x[np.argmax(rel)]


def test_numba_gelu_matches_numpy_path_and_torch(monkeypatch):
    """The optional numba GELU (float32, the erf form) and the numpy path (the exp form of a fitted
    logit): within 2e-6 and 1e-6 of torch, NaN/inf as torch; in place and out
    of place, chunks over 3 threads; float64 stays on the numpy path."""
    pytest.importorskip("numba")
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "UNARY_CHUNK", 1000)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = (np.random.default_rng(3).standard_normal(7919) * 4).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30]
    want = gelu(torch.from_numpy(x)).numpy()
    plain = nf.unary("gelu", x)
    old_threads, old = nf.set_num_threads(3), nf.use_numba(True)
    try:
        with nf.compute_scope():
            got = nf.unary("gelu", x)
            inplace = x.copy()
            assert nf.activation_inplace(inplace, "gelu") is inplace
            x64 = nf.unary("gelu", x.astype(np.float64))
    finally:
        nf.use_numba(old)
        nf.set_num_threads(old_threads)
    np.testing.assert_array_equal(inplace, got)
    np.testing.assert_allclose(plain, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)  # (erf's cancellation near x = -5)
    np.testing.assert_allclose(x64, gelu(torch.from_numpy(x.astype(np.float64))).numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name,fn", [("silu", F.silu), ("sigmoid", torch.sigmoid)])
def test_numba_silu_sigmoid_match_torch(monkeypatch, name, fn):
    """The optional numba SiLU/sigmoid (float32, their own vectorised exp: numpy's float32 exp is
    scalar on AVX2): within 2 float32 ulps of torch (denormal results aside), the numpy path's
    NaN/inf results, in place and out of place over 3 threads; float64 stays on the numpy path."""
    pytest.importorskip("numba")
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "UNARY_CHUNK", 1000)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = (np.random.default_rng(4).standard_normal(7919) * 6).astype(np.float32)
    x[:12] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 87.0, -87.0, 88.9, -88.9, 200.0, -200.0]
    want = fn(torch.from_numpy(x)).numpy()
    plain = nf.unary(name, x)
    old_threads, old = nf.set_num_threads(3), nf.use_numba(True)
    try:
        with nf.compute_scope():
            got = nf.unary(name, x)
            inplace = x.copy()
            assert nf.activation_inplace(inplace, name) is inplace
            x64 = nf.unary(name, x.astype(np.float64))
    finally:
        nf.use_numba(old)
        nf.set_num_threads(old_threads)
    np.testing.assert_array_equal(inplace, got)
    special = ~np.isfinite(x)
    np.testing.assert_array_equal(got[special], plain[special])  # NaN and +-inf as the numpy path
    np.testing.assert_allclose(got, plain, rtol=5e-7, atol=1e-36)  # over/underflow too (both round)
    normal = np.abs(want) >= np.finfo(np.float32).tiny
    np.testing.assert_allclose(got[normal], want[normal], rtol=2.5e-7, atol=0)
    np.testing.assert_allclose(got[~normal], want[~normal], rtol=0, atol=1e-36)
    np.testing.assert_allclose(x64, fn(torch.from_numpy(x.astype(np.float64))).numpy(), rtol=1e-12, atol=1e-300)


class _SignedZeros(nn.Module):
    def forward(self, x, y):
        return (1 / torch.remainder(x, y), 1 / torch.remainder(x, 0.5), 1 / torch.remainder(-1.5, y),
                1 / F.elu(x), 1 / F.celu(x, 0.7), 1 / F.selu(x))


@pytest.mark.parametrize("fuse", [True, False])
def test_signed_zeros_as_torch(tmp_path, fuse):
    """An exact zero remainder takes the dividend's sign (numpy gives the divisor's), and
    ELU/CELU/SELU of -0.0 are -0.0: through 1/x the sign decides between -inf and +inf."""
    x = torch.tensor([[-1.5, 1.5, -0.0, 0.0, -1.0, 2.5, 0.7, -0.3]])
    y = torch.tensor([[0.5, -0.5, 0.5, -0.5, -0.5, 0.5, 0.25, -2.0]])
    m = _SignedZeros().eval()
    param = export_torch(m, (x, y), tmp_path, inputs2=(x.repeat(2, 1), y.repeat(2, 1)))
    with torch.no_grad():
        want = m(x, y)
    got = kuiper_xp.load(param, backend="numpy", fuse=fuse)(x.numpy(), y.numpy())
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        a, e = np.asarray(a), e.numpy()
        inf = np.isinf(e)
        assert np.array_equal(np.isinf(a), inf) and np.array_equal(np.sign(a[inf]), np.sign(e[inf])), \
            f"output {k}: {a} against torch's {e}"
        assert_close(a[~inf], e[~inf], rtol=1e-5, what=f"output {k}")


@pytest.mark.parametrize("make", [
    lambda a: a[:, :, :-8],                           # a causal crop (TCN): rows of a wider array
    lambda a: a[:1, :, 3:],                           # a batch of one: rows split past the batch axis
    lambda a: a.transpose(0, 2, 1)[:, 1:, :],         # a permuted view, sliced
    lambda a: a[:, ::2, :],                           # every other channel
], ids=["crop", "batch1", "permuted", "step"])
def test_numpy_unary_and_clamp_of_strided_views(make):
    """The numpy fast path's activations and clamps of a non-contiguous input (each block of
    rows copied into the result and computed there in place), against numpy on a contiguous
    copy, with 2 threads and the split forced; the result laid out like the input."""
    from kuiper_xp.backends import numpy_fast as nf

    rng = np.random.default_rng(3)
    x = make(rng.standard_normal((4, 64, 1008)).astype(np.float32) * 3)
    ref_x = np.ascontiguousarray(x)
    old = nf.get_num_threads()
    nf.set_num_threads(2)
    try:
        with pytest.MonkeyPatch.context() as mp, nf.compute_scope():
            mp.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
            got_c = nf.clamp(x, 0.0, 6.0)
            got_s = nf.unary("sigmoid", x)
            want_s = nf.unary("sigmoid", ref_x)
    finally:
        nf.set_num_threads(old)
    np.testing.assert_array_equal(got_c, np.clip(ref_x, 0.0, 6.0))
    np.testing.assert_allclose(got_s, 1 / (1 + np.exp(-ref_x.astype(np.float64))), rtol=2e-6)
    np.testing.assert_array_equal(got_s, want_s)
    assert got_c.shape == x.shape and np.argsort(got_c.strides).tolist() == np.argsort(x.strides).tolist()
