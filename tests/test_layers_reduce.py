"""Reduction layers against torch: every reduction over dims (int, list, negative, all) and
keepdim on every backend leg, torch's result dtypes (sum of int32 is int64, indices are int64,
mean of an int tensor is an error), NaN/Inf, and a pnnx export run through kuiper_xp.load."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import assert_close
from helpers import export_torch, make_layer, ref, run, run_graph, torch_outputs  # noqa: E402

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


# -- helpers -------------------------------------------------------------------------------------
def check(actual, expected, rtol=2e-6, what="output"):
    """assert_close (shape, dtype, NaN and Inf positions), then the finite values against a bound
    from the finite expected values only (an Inf in ``expected`` must not widen the bound)."""
    assert_close(actual, expected, rtol=max(rtol, 1e-30), what=what)
    a, e = kuiper_xp.to_numpy(actual), np.asarray(expected)
    if e.dtype.kind == "f":
        fin = np.isfinite(e)
        if fin.any():
            bound = rtol * float(np.abs(e[fin]).max())
            err = float(np.abs(a[fin].astype(np.float64) - e[fin]).max())
            assert err <= bound, f"{what}: max |difference| {err:.3g} > {bound:.3g} on finite values"


RNG = np.random.default_rng(0)
XF = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
XI = RNG.integers(-50, 50, (2, 3, 4, 5)).astype(np.int32)

# (param text for dim, torch dim argument)
DIMS = [("", None), ("dim=(1)", (1,)), ("dim=(-1)", (-1,)), ("dim=(0,2)", (0, 2)), ("dim=(-1,1)", (-1, 1)),
        ("dim=(0,1,2,3)", (0, 1, 2, 3))]


def _torch_reduce(name, dims, keepdim):
    f = getattr(torch, name)
    if dims is None:
        return lambda t: f(t)
    return lambda t: f(t, dim=dims, keepdim=keepdim)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dimtext,dims", DIMS, ids=[d or "all" for d, _ in DIMS])
@pytest.mark.parametrize("name", ["mean", "sum", "amax", "amin", "logsumexp", "std", "var"])
def test_reductions_over_dims(backend, name, dimtext, dims, keepdim):
    if dims is None and keepdim:
        pytest.skip("torch has no keepdim without dim for this op")
    if dims is None and name in ("logsumexp", "amax", "amin", "std", "var"):
        dims, dimtext = (0, 1, 2, 3), "dim=(0,1,2,3)"
    params = f"{dimtext} keepdim={keepdim}" if dimtext else ""
    layer = make_layer(backend, f"torch.{name}", params)
    expected = ref(_torch_reduce(name, dims, keepdim), XF)
    assert_close(run(backend, layer, XF), expected, rtol=2e-6, what=f"torch.{name} {params}")


@pytest.mark.parametrize("params,fn", [
    ("", lambda t: torch.prod(t)),
    ("dim=1 keepdim=False", lambda t: torch.prod(t, 1)),
    ("dim=-1 keepdim=True", lambda t: torch.prod(t, -1, keepdim=True)),
])
def test_prod(backend, params, fn):
    x = (XF[:, :, :2] * 0.5 + 1).astype(np.float32)
    assert_close(run(backend, make_layer(backend, "torch.prod", params), x), ref(fn, x), rtol=2e-6, what=params)
    xi = (XI[:, :, :2] % 5).astype(np.int32)
    assert_close(run(backend, make_layer(backend, "torch.prod", params), xi), ref(fn, xi), what=f"int32 {params}")


@pytest.mark.parametrize("op_type,params,fn", [
    ("torch.sum", "dim=(1) keepdim=False", lambda t: t.sum(1)),
    ("torch.sum", "", lambda t: t.sum()),
    ("torch.amax", "dim=(0) keepdim=False", lambda t: torch.amax(t, 0)),
    ("torch.amin", "dim=(-1,2) keepdim=True", lambda t: torch.amin(t, (-1, 2), keepdim=True)),
    ("torch.max", "", lambda t: torch.max(t)),
    ("torch.max", "dim=1 keepdim=False", lambda t: torch.max(t, 1)[0]),
    ("torch.min", "dim=-1 keepdim=True", lambda t: torch.min(t, -1, keepdim=True)[0]),
    ("torch.argmax", "dim=1 keepdim=False", lambda t: torch.argmax(t, 1)),
    ("torch.argmin", "dim=None keepdim=False", lambda t: torch.argmin(t)),
    ("torch.cumsum", "dim=1", lambda t: torch.cumsum(t, 1)),
])
def test_integer_inputs_follow_torch_dtypes(backend, op_type, params, fn):
    """sum/prod/cumsum of int32 accumulate in int64; max/amax keep int32; indices are int64."""
    assert_close(run(backend, make_layer(backend, op_type, params), XI), ref(fn, XI), what=f"{op_type} {params}")


def test_sum_of_bool_is_int64(backend):
    b = XF > 0
    assert_close(run(backend, make_layer(backend, "torch.sum", "dim=(1) keepdim=False"), b),
                 ref(lambda t: t.sum(1), b), what="sum bool")


def test_mean_of_int_is_an_error_like_torch(backend):
    with pytest.raises(RuntimeError):
        torch.mean(torch.from_numpy(XI))
    layer = make_layer(backend, "torch.mean", "dim=(1) keepdim=False")
    with pytest.raises(ShapeError, match="torch.mean 'op'.*int32"):
        run(backend, layer, XI)


def test_dtype_from_the_output_annotation(backend):
    """x.sum(1, dtype=torch.float64): pnnx drops dtype=, the annotation says f64."""
    layer = make_layer(backend, "torch.sum", "dim=(1) keepdim=False", annotations="#o0=(2,4,5)f64")
    assert_close(run(backend, layer, XF), ref(lambda t: t.sum(1, dtype=torch.float64), XF), rtol=1e-12,
                 what="sum dtype=float64")
    layer = make_layer(backend, "torch.mean", "dim=(1) keepdim=False", annotations="#o0=(2,4,5)f64")
    assert_close(run(backend, layer, XI), ref(lambda t: t.mean(1, dtype=torch.float64), XI), rtol=1e-12,
                 what="mean of int32 with dtype=float64")


@pytest.mark.parametrize("op_type", ["torch.max", "torch.min"])
@pytest.mark.parametrize("dim,keepdim", [(1, False), (-1, True), (0, False), (3, True)])
def test_max_min_with_indices(backend, op_type, dim, keepdim):
    x = XF.copy()
    x[0, 1, 2, 3] = np.nan  # a NaN wins in torch, and its index is reported
    x[1, 0, 0, 0] = np.inf
    x[1, 2, 3, 4] = -np.inf
    layer = make_layer(backend, op_type, f"dim={dim} keepdim={keepdim}", n_out=2)
    fn = getattr(torch, op_type.split(".")[1])
    values, indices = run(backend, layer, x)
    ev, ei = ref(lambda t: tuple(fn(t, dim, keepdim=keepdim)), x)
    check(values, ev, rtol=0, what=f"{op_type} values")
    assert_close(indices, ei, what=f"{op_type} indices")


def test_max_min_elementwise_with_two_inputs(backend):
    y = RNG.standard_normal((1, 3, 1, 5)).astype(np.float32)
    for op_type, fn in (("torch.max", torch.max), ("torch.min", torch.min)):
        layer = make_layer(backend, op_type, "", n_in=2, names=("input", "other"))
        assert_close(run(backend, layer, XF, y), ref(fn, XF, y), rtol=0, what=f"{op_type}(x, y)")


@pytest.mark.parametrize("op_type", ["torch.argmax", "torch.argmin"])
@pytest.mark.parametrize("params,kw", [
    ("dim=1 keepdim=False", {"dim": 1}), ("dim=-1 keepdim=True", {"dim": -1, "keepdim": True}),
    ("dim=None keepdim=False", {}), ("dim=None keepdim=True", {"dim": None, "keepdim": True}),
])
def test_argmax_argmin(backend, op_type, params, kw):
    fn = getattr(torch, op_type.split(".")[1])
    assert_close(run(backend, make_layer(backend, op_type, params), XF), ref(lambda t: fn(t, **kw), XF),
                 what=f"{op_type} {params}")


def test_logsumexp_over_an_empty_axis(backend):
    """An empty sum: -inf, as torch (a max over the empty axis raised); empty where the reduced
    axes are not the empty ones."""
    x = np.zeros((0, 3), np.float32)
    for params, fn in (("dim=(0) keepdim=False", lambda t: torch.logsumexp(t, 0)),
                       ("dim=(0) keepdim=True", lambda t: torch.logsumexp(t, 0, keepdim=True)),
                       ("dim=(1) keepdim=False", lambda t: torch.logsumexp(t, 1))):
        check(run(backend, make_layer(backend, "torch.logsumexp", params), x), ref(fn, x), what=params)


def test_nan_and_inf_propagate(backend):
    x = XF.copy()
    x[0, 0, 0, 0] = np.nan
    x[1, 1, 1, 1] = np.inf
    x[1, 2, 0, :] = -np.inf
    for op_type, params, fn in [
        ("torch.mean", "dim=(3) keepdim=False", lambda t: t.mean(3)),
        ("torch.sum", "dim=(3) keepdim=False", lambda t: t.sum(3)),
        ("torch.amax", "dim=(3) keepdim=False", lambda t: t.amax(3)),
        ("torch.amin", "dim=(3) keepdim=False", lambda t: t.amin(3)),
        ("torch.logsumexp", "dim=(3) keepdim=False", lambda t: torch.logsumexp(t, 3)),
        ("torch.max", "", lambda t: t.max()),
    ]:
        check(run(backend, make_layer(backend, op_type, params), x), ref(fn, x), rtol=2e-6,
              what=f"{op_type} with NaN/Inf")


@pytest.mark.parametrize("params,fn", [
    ("dim=(1) keepdim=False unbiased=False", lambda t: torch.std(t, 1, unbiased=False)),
    ("dim=(1,2) keepdim=True correction=0", lambda t: torch.std(t, (1, 2), correction=0, keepdim=True)),
])
def test_std_options(backend, params, fn):
    assert_close(run(backend, make_layer(backend, "torch.std", params), XF), ref(fn, XF), rtol=2e-6, what=params)


@pytest.mark.parametrize("params,fn", [
    ("dim=(1) keepdim=False p=2", lambda t: torch.norm(t, dim=1)),
    ("dim=(1,2) keepdim=True p=1", lambda t: torch.norm(t, p=1, dim=(1, 2), keepdim=True)),
    ("dim=(-1) keepdim=False p=inf", lambda t: torch.norm(t, p=float("inf"), dim=-1)),
    ("dim=(-1) keepdim=False p=3.0", lambda t: torch.norm(t, p=3, dim=-1)),
    ("dim=(1) keepdim=False p=0", lambda t: torch.norm(t, p=0, dim=1)),
    ("p=fro", lambda t: torch.norm(t)),
])
def test_norm(backend, params, fn):
    x = XF.copy()
    x[0, 0, 0, :2] = 0.0
    assert_close(run(backend, make_layer(backend, "torch.norm", params), x), ref(fn, x), rtol=2e-6, what=params)


@pytest.mark.parametrize("op_type,params,fn", [
    ("torch.cumsum", "dim=-1", lambda t: torch.cumsum(t, -1)),
    ("torch.cumprod", "dim=2", lambda t: torch.cumprod(t, 2)),
    ("torch.all", "dim=(1) keepdim=False", lambda t: torch.all(t, 1)),
    ("torch.any", "", lambda t: torch.any(t)),
])
def test_cumulative_and_logical(backend, op_type, params, fn):
    x = XF > 0 if op_type in ("torch.all", "torch.any") else (XF * 0.5).astype(np.float32)
    assert_close(run(backend, make_layer(backend, op_type, params), x), ref(fn, x), rtol=2e-6, what=op_type)


@pytest.mark.parametrize("op_type,dim,dtype", [
    ("torch.cumsum", 1, np.float32), ("torch.cumsum", 0, np.float32), ("torch.cumsum", 2, np.int32),
    ("torch.cumsum", 1, np.bool_), ("torch.cumprod", 1, np.float32), ("torch.cumprod", -3, np.int64),
])
def test_cumulative_along_an_outer_axis(backend, op_type, dim, dtype):
    """A scan with a long inner slice (numpy's fast path walks the axis one slice at a time when
    each step has CUMULATIVE_MIN_STEP elements: dims 0 and 1 here, not 2): torch's values and
    dtype, odd sizes, a non-contiguous input."""
    g = np.random.default_rng(7)
    x = g.standard_normal((3, 7, 15, 13)).astype(np.float32)
    x = x * 0.4 + 1 if op_type == "torch.cumprod" else x
    x = x > 0 if dtype is np.bool_ else (x if dtype is np.float32 else np.round(x * 2).astype(dtype))
    x = np.swapaxes(np.swapaxes(x, 0, 3).copy(), 0, 3)  # same values, another memory layout
    fn = torch.cumsum if op_type == "torch.cumsum" else torch.cumprod
    got = backend.to_numpy(run(backend, make_layer(backend, op_type, f"dim={dim}"), x))
    want = ref(lambda t: fn(t, dim), x)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert_close(got, want, rtol=2e-6, what=f"{op_type} dim={dim} {np.dtype(dtype)}")


@pytest.mark.parametrize("op_type,keepdim,dtype,n", [
    ("torch.max", False, np.float32, 8), ("torch.min", True, np.float32, 3), ("torch.max", True, np.int32, 16),
    ("torch.min", False, np.float64, 2), ("torch.max", False, np.bool_, 5), ("torch.max", False, np.float32, 17),
])
def test_max_min_over_a_short_last_axis(backend, op_type, keepdim, dtype, n):
    """Many rows of a few values (numpy's chained elementwise path up to 16), NaN in some rows
    (it wins, as in torch), ties, ints and bools; 17 values take the plain reduction."""
    g = np.random.default_rng(3)
    x = np.round(g.standard_normal((4, 33, 40, n)) * 2)
    if dtype in (np.float32, np.float64):
        x[0, 0, :3, 1] = np.nan
    x = (x > 0) if dtype is np.bool_ else x.astype(dtype)
    fn = torch.amax if op_type == "torch.max" else torch.amin
    got = backend.to_numpy(run(backend, make_layer(backend, op_type, f"dim=-1 keepdim={keepdim}"), x))
    want = ref(lambda t: fn(t, -1, keepdim=keepdim), x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_aten_reductions_take_dims_as_inputs(backend):
    """``x.prod()`` and ``torch.all(x, 1)`` stay ``aten::`` ops with dim/keepdim as inputs."""
    layer = make_layer(backend, "aten::prod", "", n_in=2)
    x = (XF * 0.1 + 1).astype(np.float32)
    assert_close(run(backend, layer, x, None), ref(torch.prod, x), rtol=2e-6, what="aten::prod")
    layer = make_layer(backend, "aten::all", "", n_in=3)
    b = XF > -1
    assert_close(run(backend, layer, b, 1, False), ref(lambda t: torch.all(t, 1), b), what="aten::all")


@pytest.mark.parametrize("op_type,params,key,value", [
    ("torch.sum", "dim=(1) keepdim=maybe", "keepdim", "maybe"),
    ("torch.mean", "dim=x keepdim=False", "dim", "x"),
    ("torch.max", "dim=1.5", "dim", "1.5"),
    ("torch.norm", "dim=(1) p=nuc", "p", "nuc"),
])
def test_bad_parameters_name_op_key_and_value(backend, op_type, params, key, value):
    with pytest.raises(LayerParameterError) as info:
        make_layer(backend, op_type, params)
    msg = str(info.value)
    assert f"{op_type} 'op' (unit.param:" in msg and key in msg and value in msg, msg


def test_dim_out_of_range_is_a_shape_error(backend):
    with pytest.raises(ShapeError, match="dim 4 is out of range"):
        run(backend, make_layer(backend, "torch.sum", "dim=(4) keepdim=False"), XF)


# -- whole export ----------------------------------------------------------------------------------
class ReduceZoo(nn.Module):
    def forward(self, x):
        v, i = torch.max(x, 1)
        v2, i2 = torch.min(x, -1, keepdim=True)
        return (torch.mean(x, 1), x.mean((2, 3), keepdim=True), x.mean(), torch.sum(x, -1), x.sum(), x.sum((0, 2)),
                torch.max(x), v, i, x.max(2)[0], v2, i2, torch.min(x), torch.amax(x, (1, 2)), torch.amin(x, -1, True),
                torch.prod(x, 1), torch.argmax(x, 1), torch.argmin(x), x.argmax(-1, keepdim=True), x.std(1), x.var(1),
                torch.logsumexp(x, 1), x.norm(dim=1), torch.cumsum(x, 1), x.sum(1, dtype=torch.float64),
                torch.mean(x, dim=[1, 3]))


@pytest.fixture(scope="session")
def reduce_export(tmp_path_factory):
    torch.manual_seed(0)
    return export_torch(ReduceZoo(), (torch.randn(2, 3, 4, 5),), tmp_path_factory.mktemp("reduce"),
                        inputs2=(torch.randn(3, 3, 4, 5),))


@pytest.mark.parametrize("batch", [2, 4])
def test_exported_reductions_match_torch(model_backend, reduce_export, batch):
    x = torch.randn(batch, 3, 4, 5)
    expected = torch_outputs(ReduceZoo(), (x,))
    got = run_graph(reduce_export, model_backend, (x,))
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=2e-6, what=f"output {k}")


@pytest.mark.parametrize("op", ["torch.cumsum", "torch.cumprod"])
def test_cumulative_float32_accumulates_in_float64_as_torch(backend, op):
    """torch on the CPU keeps float32 running sums and products in float64: a large value and
    its negative cancel exactly, an intermediate overflow times 0 is 0."""
    from test_layers_misc import make_layer

    x = np.array([[1e8, 1, 1, 1, -1e8, 1], [3e38, 3e38, -3e38, 0.5, 1e-30, 2.0]], np.float32)
    if op == "torch.cumprod":
        x = np.array([[3e38, 3e38, 0, 1, 1, 1], [1e-30, 1e-30, 1e30, 1e30, 1e-10, 3.0]], np.float32)
    layer = make_layer(backend, f"{op} op 1 1 0 1 dim=-1 $input=0")
    got = backend.to_numpy(layer(backend.asarray(x)))
    want = getattr(torch, op.split(".")[1])(torch.from_numpy(x), -1).numpy()
    assert got.dtype == np.float32
    assert np.array_equal(got, want, equal_nan=True), (got, want)


@pytest.mark.parametrize("op", ["torch.std", "torch.var"])
def test_std_var_of_float32_extremes_as_torch(backend, op):
    """float32 squares overflowed (std of [1e20, -1e20, 0, 3e19]: inf, torch 8.3e19) or underflowed
    (values near 1e-25: 0); computed in float64 as torch's CPU kernel accumulates."""
    from test_layers_misc import make_layer

    x = np.array([[1e20, -1e20, 0, 3e19], [1e-25, 3e-25, -2e-25, 5e-25]], np.float32)
    layer = make_layer(backend, f"{op} op 1 1 0 1 dim=(-1) keepdim=False unbiased=True $input=0")
    got = backend.to_numpy(layer(backend.asarray(x)))
    want = getattr(torch, op.split(".")[1])(torch.from_numpy(x), -1).numpy()
    assert got.dtype == np.float32 and np.array_equal(got == np.inf, want == np.inf)  # (var: 6.9e39 is inf)
    fin = np.isfinite(want)
    assert_close(got[fin], want[fin], rtol=1e-6)
    if op == "torch.std":
        assert np.isfinite(got).all() and (got > 0).all()


@pytest.mark.parametrize("shape,dims", [((2, 24, 17, 19), (2, 3)), ((3, 50, 64), (-1,)), ((2, 3, 4, 5, 60), (2, 3, 4)),
                                        ((64, 700), (1,)), ((3, 9, 300), (2, 1))])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean_over_trailing_axes(backend, shape, dims, keepdim):
    """Sums and means over the trailing axes (numpy: one matrix-vector product with ones, split
    over the threads): torch's values, a NaN, an inf and an inf against a -inf each reaching
    only its own output."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    k = int(np.prod([shape[d] for d in dims]))
    flat[[3, k + 5, 2 * k + 1, 2 * k + 7]] = [np.nan, np.inf, np.inf, -np.inf]
    if backend.name == "numpy":
        from kuiper_xp.backends import numpy_fast as nf

        nd = len(shape)
        assert nf._sum_trailing(x, tuple(d % nd for d in dims), keepdim, False) is not None
    for name, fn in (("sum", lambda t: t.sum(dims, keepdim=keepdim)), ("mean", lambda t: t.mean(dims, keepdim=keepdim))):
        layer = make_layer(backend, f"torch.{name}", f"dim=({','.join(map(str, dims))}) keepdim={keepdim}")
        got = backend.to_numpy(run(backend, layer, x))
        want = ref(fn, x)
        assert np.isnan(got).sum() == np.isnan(want).sum() == 2
        assert_close(got, want, rtol=1e-6, what=f"{name} {shape} {dims}")


@pytest.mark.parametrize("shape,dim", [((4, 50, 16, 3), 2), ((2, 7, 5, 1, 2), 1), ((3, 40, 4), 1), ((6, 5, 3), 0),
                                       ((2, 64, 40, 3), 3), ((4096, 8), 1), ((3, 2000, 2), 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean_over_an_axis_before_a_short_one(backend, shape, dim, keepdim):
    """A reduced axis followed by a few elements (numpy: einsum instead of a reduction stepping
    through 3-element inner loops), or a short last axis (slice additions): torch's sums and
    means, NaN and inf included."""
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[[3, 17]] = [np.nan, np.inf]
    if backend.name == "numpy":
        assert backend.fast.sum_short_inner(x, (dim,), keepdim) is not None
    for name, fn in (("sum", lambda t: t.sum(dim, keepdim=keepdim)), ("mean", lambda t: t.mean(dim, keepdim=keepdim))):
        layer = make_layer(backend, f"torch.{name}", f"dim=({dim}) keepdim={keepdim}")
        assert_close(backend.to_numpy(run(backend, layer, x)), ref(fn, x), rtol=1e-6, what=f"{name} {shape} {dim}")
