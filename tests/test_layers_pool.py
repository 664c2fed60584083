"""Pooling layers (kuiper_xp/layers/pooling.py) against torch.nn.functional on every backend leg,
the NumPy max-pool fast path against the generic kernel, and one pnnx export end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from array_api_compat import numpy as xnp
from conftest import assert_close
from kuiper_xp.backends import get_backend
from test_layers_conv import fast_mode, op_graph, rnd, run_op, t  # noqa: F401  (fixture)
from torch import nn

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.layers import functional as fn

# (batch, c, h, w, kernel, stride, padding, dilation, ceil_mode)
MAXPOOL = [
    (1, 3, 11, 13, 3, 2, 1, 1, False),
    (2, 2, 11, 13, 3, 2, 1, 1, True),
    (1, 2, 9, 9, 2, None, 0, 1, False),
    (1, 3, 10, 7, (2, 3), (1, 2), (1, 1), 2, True),
    (2, 2, 8, 8, 3, 3, 1, 1, True),
    (1, 2, 5, 6, 5, 1, 2, 1, False),
    (1, 1, 7, 7, 3, 2, 0, 2, True),
]


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


def _pool_params(k, s, p, d=None, ceil=False, nd=2, **extra):
    def tup(v):
        return v if isinstance(v, tuple) else (v,) * nd
    params = {"ceil_mode": ceil, "kernel_size": tup(k), "padding": tup(p), "stride": None if s is None else tup(s)}
    if d is not None:
        params["dilation"] = tup(d)
    return params | extra


@pytest.mark.parametrize("case", MAXPOOL, ids=[f"c{i}" for i in range(len(MAXPOOL))])
def test_max_pool2d_matches_torch(backend, tmp_path, case):
    n, c, h, w, k, s, p, d, ceil = case
    x = rnd(n, c, h, w)
    expected = F.max_pool2d(t(x), k, s, p, d, ceil_mode=ceil).numpy()
    params = _pool_params(k, s, p, d, ceil, return_indices=False)
    run_op(backend, tmp_path, "F.max_pool2d" if s is None else "nn.MaxPool2d", params, [x], expected)


@pytest.mark.parametrize("case", MAXPOOL[:4], ids=[f"c{i}" for i in range(4)])
def test_max_pool2d_return_indices(backend, tmp_path, case):
    n, c, h, w, k, s, p, d, ceil = case
    x = rnd(n, c, h, w)
    y, idx = F.max_pool2d(t(x), k, s, p, d, ceil_mode=ceil, return_indices=True)
    params = _pool_params(k, s, p, d, ceil, return_indices=True)
    run_op(backend, tmp_path, "nn.MaxPool2d", params, [x], [y.numpy(), idx.numpy()])


# (batch, c, h, w, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVGPOOL = [
    (1, 3, 11, 13, 3, 2, 1, False, True, None),
    (2, 2, 11, 13, 3, 2, 1, True, False, None),
    (1, 2, 11, 13, 3, 2, 1, True, True, None),
    (1, 2, 9, 8, 2, None, 0, False, True, None),
    (1, 2, 10, 7, (2, 3), (1, 2), (1, 1), True, False, None),
    (2, 2, 8, 9, 2, 2, 0, False, True, 3),
    (1, 2, 7, 7, 3, 2, 1, True, True, 5),
    (1, 1, 6, 6, 4, 3, 2, True, False, None),
    # a (1, k) window from AVG_RUNNING_MIN_TAPS on at stride 1: running sums (AvgPool1d(25))
    (2, 3, 1, 40, (1, 25), (1, 1), 0, False, True, None),
    (1, 2, 3, 30, (1, 12), (1, 1), 0, True, False, 7),
]


@pytest.mark.parametrize("case", AVGPOOL, ids=[f"c{i}" for i in range(len(AVGPOOL))])
def test_avg_pool2d_matches_torch(backend, tmp_path, case):
    n, c, h, w, k, s, p, ceil, cip, div = case
    x = rnd(n, c, h, w)
    expected = F.avg_pool2d(t(x), k, s, p, ceil, cip, div).numpy()
    params = _pool_params(k, s, p, None, ceil, count_include_pad=cip, divisor_override=div)
    run_op(backend, tmp_path, "F.avg_pool2d" if s is None else "nn.AvgPool2d", params, [x], expected)


@pytest.mark.parametrize("kind", ["max", "avg", "avg_wide"])
def test_pool1d_matches_torch(backend, tmp_path, kind):
    x = rnd(2, 3, 11)
    if kind == "avg_wide":  # Autoformer's moving average: running sums on numpy, on a transposed input
        x = np.ascontiguousarray(rnd(2, 60, 5).transpose(0, 2, 1))[:, :, ::-1]
        expected = F.avg_pool1d(t(np.ascontiguousarray(x)), 25, 1).numpy()
        run_op(backend, tmp_path, "nn.AvgPool1d", _pool_params(25, 1, 0, None, False, nd=1), [x], expected)
    elif kind == "max":
        expected = F.max_pool1d(t(x), 3, 2, 1, 1, ceil_mode=True).numpy()
        params = _pool_params(3, 2, 1, 1, True, nd=1, return_indices=False)
        run_op(backend, tmp_path, "nn.MaxPool1d", params, [x], expected)
    else:
        expected = F.avg_pool1d(t(x), 3, 2, 1, True, False).numpy()
        params = _pool_params(3, 2, 1, None, True, nd=1, count_include_pad=False)
        run_op(backend, tmp_path, "nn.AvgPool1d", params, [x], expected)


def test_pool_unbatched_input(backend, tmp_path):
    x = rnd(3, 9, 8)
    expected = F.max_pool2d(t(x), 3, 2, 1).numpy()
    run_op(backend, tmp_path, "nn.MaxPool2d", _pool_params(3, 2, 1, 1, False), [x], expected)


ADAPTIVE = [(1, 1), (3, 4), (5, 5), (4, 7), (11, 13), (2, 13), (7, 3), (3, None), (None, 5), (12, 15)]


@pytest.mark.parametrize("size", ADAPTIVE, ids=[str(s) for s in ADAPTIVE])
def test_adaptive_avg_pool2d_matches_torch(backend, tmp_path, size):
    x = rnd(2, 3, 11, 13)
    expected = F.adaptive_avg_pool2d(t(x), size).numpy()
    out = tuple(0 if v is None else v for v in size)  # pnnx writes torch's None as 0
    run_op(backend, tmp_path, "nn.AdaptiveAvgPool2d", {"output_size": out}, [x], expected)


@pytest.mark.parametrize("size", ADAPTIVE, ids=[str(s) for s in ADAPTIVE])
def test_adaptive_max_pool2d_matches_torch(backend, tmp_path, size):
    x = rnd(2, 3, 11, 13)
    y, idx = F.adaptive_max_pool2d(t(x), size, return_indices=True)
    out = tuple(0 if v is None else v for v in size)
    run_op(backend, tmp_path, "nn.AdaptiveMaxPool2d", {"output_size": out, "return_indices": False}, [x],
           y.numpy())
    run_op(backend, tmp_path / "f", "F.adaptive_max_pool2d", {"output_size": out, "return_indices": True},
           [x], [y.numpy(), idx.numpy()])


@pytest.mark.parametrize("size", [(3, 4), (1, 1), (12, 2)])
def test_adaptive_max_pool2d_equal_windows_with_ties(backend, tmp_path, size):
    """Windows of equal size (one reshape and argmax) with many ties: torch's first maximum."""
    x = np.round(rnd(2, 3, 12, 12) * 2).astype(np.float32)
    y, idx = F.adaptive_max_pool2d(t(x), size, return_indices=True)
    run_op(backend, tmp_path, "F.adaptive_max_pool2d", {"output_size": size, "return_indices": True},
           [x], [y.numpy(), idx.numpy()])


@pytest.mark.parametrize("size", [1, 3, 4, 11])
def test_adaptive_pool1d_matches_torch(backend, tmp_path, size):
    x = rnd(2, 3, 11)
    run_op(backend, tmp_path, "nn.AdaptiveAvgPool1d", {"output_size": (size,)}, [x],
           F.adaptive_avg_pool1d(t(x), size).numpy())
    y, idx = F.adaptive_max_pool1d(t(x), size, return_indices=True)
    run_op(backend, tmp_path / "m", "F.adaptive_max_pool1d", {"output_size": (size,), "return_indices": True},
           [x], [y.numpy(), idx.numpy()])


# ---------------------------------------------------------------------------------------------
# errors

@pytest.mark.parametrize("op_type, params, needle", [
    ("nn.MaxPool2d", _pool_params(2, 2, 2, 1, False), "padding"),
    ("nn.MaxPool2d", _pool_params(0, 1, 0, 1, False), "kernel_size"),
    ("nn.AvgPool2d", _pool_params(2, 2, 0, None, False, divisor_override=0), "divisor_override"),
    ("nn.MaxPool2d", _pool_params(2, 2, 0, 1, False, return_indices=True), "return_indices"),
    ("nn.AdaptiveAvgPool2d", {"output_size": (1, 2, 3)}, "output_size"),
    ("nn.AdaptiveAvgPool2d", {"output_size": "big"}, "output_size"),
])
def test_pool_bad_parameters_fail_at_build(tmp_path, op_type, params, needle):
    with pytest.raises(LayerParameterError) as ei:
        op_graph(tmp_path, op_type, params, [rnd(1, 2, 6, 6)], 1, annotate=False)
    assert needle in str(ei.value) and f"{op_type} 'op'" in str(ei.value)


def test_pool_output_would_be_empty_raises_shape_error(backend, tmp_path):
    g = op_graph(tmp_path, "nn.MaxPool2d", _pool_params(3, 1, 0, 1, False), [rnd(1, 2, 6, 6)], 1,
                 backend=backend, annotate=False)
    with pytest.raises(ShapeError, match="empty"):
        g(rnd(1, 2, 2, 6))


# ---------------------------------------------------------------------------------------------
# NumPy fast max pool against the generic kernel and torch

@pytest.mark.usefixtures("fast_mode")
@pytest.mark.parametrize("case", MAXPOOL, ids=[f"c{i}" for i in range(len(MAXPOOL))])
def test_numpy_fast_max_pool_matches_generic(case):
    n, c, h, w, k, s, p, d, ceil = case
    s = k if s is None else s
    x = rnd(n, c, h, w)
    expected = F.max_pool2d(t(x), k, s, p, d, ceil_mode=ceil).numpy()
    args = (_pair(k), _pair(s), _pair(p), _pair(d), ceil)
    assert_close(fn.max_pool2d(x, *args, xp=xnp), expected, what="generic")
    assert_close(get_backend("numpy").fast.max_pool2d(x, *args), expected, what="fast")


@pytest.mark.usefixtures("fast_mode")
@pytest.mark.parametrize("case", AVGPOOL, ids=[f"c{i}" for i in range(len(AVGPOOL))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_avg_pool_matches_generic(case, dtype):
    """The numpy fast average (separable sums over the taps inside the input, divided per block)
    against torch and the generic kernel: ceil mode, count_include_pad both ways, divisor
    override, rectangular kernels; integer input is left to the generic path."""
    n, c, h, w, k, s, p, ceil, cip, div = case
    s = k if s is None else s
    x = rnd(n, c, h, w).astype(dtype)
    expected = F.avg_pool2d(t(x), k, s, p, ceil, cip, div).numpy()
    args = (_pair(k), _pair(s), _pair(p), ceil, cip, div)
    fast = get_backend("numpy").fast.avg_pool2d(x, *args)
    assert fast.dtype == dtype
    assert_close(fast, expected, what="fast")
    assert_close(fast, fn.avg_pool2d(x, *args, xp=xnp), what="fast against generic")
    assert get_backend("numpy").fast.avg_pool2d(np.ones((1, 1, 4, 4), np.int64), *args) is None
    with pytest.raises(ShapeError, match="empty"):
        get_backend("numpy").fast.avg_pool2d(x[..., :1, :1], (4, 4), (1, 1), (0, 0), False, True, None)


ADAPTIVE_FAST = [((2, 3, 11, 13), (1, 1)), ((2, 3, 11, 13), (3, 4)), ((1, 5, 32, 32), (6, 6)),
                 ((3, 4, 12, 12), (4, 2)), ((2, 3, 1, 17), (1, 5)), ((1, 2, 7, 9), (7, 4)), ((2, 3, 5, 6), (9, 11))]


@pytest.mark.usefixtures("fast_mode")
@pytest.mark.parametrize("shape,size", ADAPTIVE_FAST, ids=[f"{s}->{o}" for s, o in ADAPTIVE_FAST])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_adaptive_avg_pool_matches_torch(shape, size, dtype):
    """The numpy fast adaptive average (one GEMM with the 0/1 window matrix, or a column of ones
    for the global mean, then divided by the windows' sizes) against torch: non-divisible and
    overlapping windows, outputs larger than the input, one row (the 1-d form), a channels-last
    input, float64; other dtypes are left to the generic path."""
    fast = get_backend("numpy").fast.adaptive_avg_pool2d
    x = rnd(*shape).astype(dtype)
    expected = F.adaptive_avg_pool2d(t(x), size).numpy()
    got = fast(x, size)
    assert got.dtype == dtype and got.shape == expected.shape
    assert_close(got, expected, what="fast")
    xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # channels-last view
    assert_close(fast(xl, size), expected, what="fast, channels-last input")
    assert fast(x.astype(np.int64), size) is None
    assert fast(x, x.shape[2:]) is None  # (the layer returns its input)


@pytest.mark.usefixtures("fast_mode")
@pytest.mark.parametrize("size", [(1, 1), (3, 4)])
def test_numpy_fast_adaptive_avg_pool_inf_nan_as_torch(backend, tmp_path, size):
    """An inf, a -inf and a NaN reach only the windows that hold them (the window matrix's zeros
    would make NaN of the others: such a result goes to the generic path), through the layer."""
    x = rnd(2, 3, 11, 13)
    x[0, 0, 1, 1], x[0, 1, 10, 12], x[1, 2, 5, 0], x[1, 2, 5, 1] = np.inf, -np.inf, np.nan, np.inf
    x[1, 0, 0, 0], x[1, 0, 10, 12] = np.inf, -np.inf
    expected = F.adaptive_avg_pool2d(t(x), size).numpy()
    if size != (1, 1):
        assert np.isfinite(expected).sum() > expected.size // 2  # (most windows hold none)
    run_op(backend, tmp_path, "nn.AdaptiveAvgPool2d", {"output_size": size}, [x], expected)


@pytest.mark.usefixtures("fast_mode")
def test_numpy_fast_adaptive_avg_pool_large_window_matrix_uses_generic(monkeypatch, backend, tmp_path):
    """Over ADAPTIVE_AVG_MATRIX_BYTES the fast path declines and the layer's generic path answers."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "ADAPTIVE_AVG_MATRIX_BYTES", 0)
    x = rnd(2, 3, 11, 13)
    assert nf.adaptive_avg_pool2d(x, (3, 4)) is None
    assert nf.adaptive_avg_pool2d(x, (1, 1)) is not None  # (the global mean needs no matrix)
    run_op(backend, tmp_path, "nn.AdaptiveAvgPool2d", {"output_size": (3, 4)}, [x],
           F.adaptive_avg_pool2d(t(x), (3, 4)).numpy())


# ---------------------------------------------------------------------------------------------
# pnnx export of a module with every pooling form

class PoolZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.mp = nn.MaxPool2d(3, 2, 1, ceil_mode=True)
        self.ap = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.aap = nn.AdaptiveAvgPool2d((3, None))
        self.amp = nn.AdaptiveMaxPool2d(4)
        self.mp1 = nn.MaxPool1d(3, 2)
        self.aap1 = nn.AdaptiveAvgPool1d(4)

    def forward(self, x, y):
        return (self.mp(x), self.ap(x), self.aap(x), self.amp(x), F.max_pool2d(x, 2),
                F.avg_pool2d(x, 3, stride=2, padding=1), F.adaptive_avg_pool2d(x, (2, 3)),
                F.adaptive_max_pool2d(x, 3), self.mp1(y), self.aap1(y), F.avg_pool1d(y, 2))


@pytest.fixture(scope="session")
def pool_zoo_export(tmp_path_factory):
    from helpers import export_torch

    m = PoolZoo().eval()
    inputs = (torch.randn(1, 4, 11, 13), torch.randn(1, 4, 11))
    inputs2 = (torch.randn(2, 4, 12, 9), torch.randn(2, 4, 10))
    return m, export_torch(m, inputs, tmp_path_factory.mktemp("poolzoo"), inputs2=inputs2), inputs2


def test_pnnx_pool_module_matches_torch(model_backend, pool_zoo_export):
    from helpers import run_graph, torch_outputs

    m, param, inputs = pool_zoo_export
    assert "return_indices=True" in param.read_text()  # F.adaptive_max_pool2d keeps its indices
    expected = torch_outputs(m, inputs)
    got = run_graph(param, model_backend, inputs)
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=1e-5, what=f"output {k}")


def test_max_pool_nan_propagates(backend, tmp_path):
    x = rnd(1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    expected = F.max_pool2d(t(x), 2).numpy()
    run_op(backend, tmp_path, "nn.MaxPool2d", _pool_params(2, 2, 0, 1, False), [x], expected)



@pytest.mark.parametrize("op,params,shape,call", [
    ("nn.MaxPool2d", _pool_params(3, 2, 1, 1, False, return_indices=True), (2, 3, 16, 6),
     lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)),
    ("F.max_pool1d", _pool_params(4, 2, 1, 1, True, nd=1, return_indices=True), (2, 3, 96),
     lambda x: F.max_pool1d(x, 4, 2, 1, ceil_mode=True, return_indices=True)),
    ("F.adaptive_max_pool2d", {"output_size": (2, 3), "return_indices": True}, (2, 3, 16, 6),
     lambda x: F.adaptive_max_pool2d(x, (2, 3), return_indices=True)),
    ("F.adaptive_max_pool2d", {"output_size": (4, 3), "return_indices": True}, (2, 3, 7, 5),
     lambda x: F.adaptive_max_pool2d(x, (4, 3), return_indices=True)),
    ("F.max_pool3d", _pool_params(2, 2, 0, 1, False, nd=3, return_indices=True), (2, 3, 2, 8, 6),
     lambda x: F.max_pool3d(x, 2, 2, return_indices=True)),
    ("F.adaptive_max_pool3d", {"output_size": (1, 2, 3), "return_indices": True}, (2, 3, 2, 8, 6),
     lambda x: F.adaptive_max_pool3d(x, (1, 2, 3), return_indices=True)),
], ids=["max2d", "max1d", "adaptive2d-equal", "adaptive2d", "max3d", "adaptive3d"])
def test_max_pool_indices_of_nan_windows(backend, tmp_path, op, params, shape, call):
    """Windows holding several NaNs: torch's pooling kernels report the last NaN (they scan with
    ``val > max || isnan(val)`` from -inf), where argmax would give the first; a window of -inf
    only (padding beside it) reports its first real element, not a padded place."""
    x = rnd(*shape)
    flat = x.reshape(-1)
    flat[np.random.default_rng(0).choice(flat.size, flat.size // 6, replace=False)] = np.nan
    x[1, 2] = -np.inf  # windows of -inf only: torch's index is the window's first real element
    y, idx = call(t(x))
    assert np.isnan(y.numpy()).any()
    run_op(backend, tmp_path, op, params, [x], [y.numpy(), idx.numpy()])


class _AdaptiveFromSize(nn.Module):
    """Output sizes computed from the input's: with H and W dynamic, pnnx passes them as a
    ``$output_size`` operand (fed by a pnnx.Expression), not a parameter."""

    def forward(self, x):
        h, w = x.shape[2], x.shape[3]
        return (F.adaptive_avg_pool2d(x, (h // 2, w // 3)), F.adaptive_max_pool2d(x, (h // 3, w // 2)),
                F.interpolate(x, scale_factor=0.25, mode="area"),
                F.adaptive_avg_pool3d(x.unsqueeze(2).expand(-1, -1, 4, -1, -1), (2, h // 2, w // 2)))


def test_adaptive_pools_with_runtime_output_sizes(model_backend, tmp_path):
    from test_layers_misc import compare_graph, export_module

    torch.manual_seed(0)
    param = export_module(_AdaptiveFromSize(), (torch.randn(1, 3, 12, 18),), tmp_path,
                          inputs2=(torch.randn(2, 3, 20, 14),))
    assert "$output_size" in param.read_text()
    for shape in ((1, 3, 12, 18), (3, 3, 17, 23)):
        compare_graph(param, model_backend, _AdaptiveFromSize(), (torch.randn(*shape),))


@pytest.mark.parametrize("op_type,params,shape", [
    ("F.max_pool1d", {"kernel_size": (9,), "stride": (9,)}, (2, 3, 9)),
    ("F.max_pool1d", {"kernel_size": (9,), "stride": (1,), "ceil_mode": True}, (2, 3, 9)),
    ("nn.MaxPool2d", {"kernel_size": (4, 6), "stride": (2, 2)}, (2, 3, 4, 6)),
])
def test_max_pool_over_the_whole_map(backend, tmp_path, op_type, params, shape):
    """A window covering the whole map (TextCNN's ``F.max_pool1d(h, h.size(2))``) is one
    reduction: torch's values, NaN kept, -inf where a row is all -inf."""
    x = rnd(*shape)
    x[0, 0].flat[3] = np.nan
    x[1, 2] = -np.inf
    full = dict(params, padding=(0,) * len(params["kernel_size"]), dilation=(1,) * len(params["kernel_size"]))
    fn_ = F.max_pool1d if len(shape) == 3 else F.max_pool2d
    want = fn_(t(x), params["kernel_size"], params["stride"], ceil_mode=params.get("ceil_mode", False)).numpy()
    run_op(backend, tmp_path, op_type, full, [x], want)


@pytest.mark.parametrize("size", [(5, 7), (4, 6), (3, 13)])
def test_adaptive_avg_pool2d_keeps_an_inf_in_its_own_windows(backend, tmp_path, size):
    """One inf (and one NaN) in the input: torch's windows that do not hold it stay finite (an
    averaging-matrix product made NaN of them: 0 * inf)."""
    x = rnd(1, 2, 11, 13)
    x[0, 0, 3, 4] = np.inf
    x[0, 1, 7, 2] = np.nan
    expected = F.adaptive_avg_pool2d(t(x), size).numpy()
    assert np.isfinite(expected).sum() > expected.size // 2
    run_op(backend, tmp_path, "nn.AdaptiveAvgPool2d", {"output_size": size}, [x], expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_avg_pool1d_long_window_sums_only_its_own_elements(backend, tmp_path, dtype):
    """AvgPool1d(k >= 12, stride 1) (the numpy backend's running-sum path): an inf, a NaN and a
    1e20 in a row leave the windows that do not hold them as torch computes them."""
    x = rnd(2, 3, 40).astype(dtype)
    x[0, 0, 5] = np.inf
    x[0, 1, 9] = np.nan
    x[1, 2, 3] = 1e20
    x[1, 0, 30] = -np.inf
    expected = F.avg_pool1d(t(x), 12, 1).numpy()
    params = _pool_params(12, 1, 0, None, False, nd=1)
    assert np.isfinite(expected).sum() > expected.size // 2
    run_op(backend, tmp_path, "nn.AvgPool1d", params, [x], expected, rtol=1e-5 if dtype == np.float32 else 1e-12)


class IndicesFirst(torch.nn.Module):
    """Max-pool modules whose indices the model reads first (pnnx: the int64 output listed
    first), reads alone (one int64 output, ``return_indices=False`` in the file), or an adaptive
    module whose (values, indices) pnnx leaves as one tuple for a ``prim::TupleUnpack``."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.p1 = nn.MaxPool1d(2, return_indices=True)
        self.p2 = nn.MaxPool2d(2, return_indices=True)
        self.p3 = nn.MaxPool3d(2, return_indices=True)
        self.a2 = nn.AdaptiveMaxPool2d((2, 3), return_indices=True)

    def forward(self, x):
        if self.kind == "first":
            v1, i1 = self.p1(x.flatten(2))
            v2, i2 = self.p2(x)
            v3, i3 = self.p3(x.unsqueeze(1))
            return i1 + 1, v1 * 2, i2 * 3, v2 - 1, i3 + 2, v3 * 3
        if self.kind == "alone":
            return self.p2(x)[1] + 1
        v, i = self.a2(x)
        return v * 2, i + 1


@pytest.mark.parametrize("kind", ["first", "alone", "tuple"])
def test_max_pool_modules_bind_outputs_by_declared_dtype(tmp_path, kind):
    """Was: the values bound to the int64 output (a ShapeError on the dtype), or the tuple form
    refused (prim::TupleUnpack). Against torch."""
    from test_layers_misc import export_module

    import kuiper_xp

    torch.manual_seed(0)
    m = IndicesFirst(kind).eval()
    x = torch.randn(2, 3, 4, 6)
    param = export_module(m, (x,), tmp_path)
    with torch.no_grad():
        want = m(x)
    want = want if isinstance(want, tuple) else (want,)
    got = kuiper_xp.load(param, backend="numpy")(x.numpy())
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        assert np.asarray(a).dtype == e.numpy().dtype, f"output {k}"
        assert_close(a, e.numpy(), rtol=1e-6, what=f"output {k}")


class _Unpool2d(nn.Module):
    def forward(self, x):
        p, i = F.max_pool2d(x, 3, 2, 1, return_indices=True)  # (overlapping windows: repeated indices)
        return F.max_unpool2d(p * 2, i, 3, 2, 1, output_size=[9, 7])


class _Unpool1d(nn.Module):
    def forward(self, x):
        p, i = F.max_pool1d(x, 2, return_indices=True)
        return F.max_unpool1d(p * 3, i, 2, output_size=[9])


class _Unpool3d(nn.Module):
    def forward(self, x):
        p, i = F.max_pool3d(x, 2, return_indices=True)
        return F.max_unpool3d(p - 1, i, 2, output_size=[4, 6, 6])


class _UnpoolGiven(nn.Module):
    def forward(self, x, i):
        return F.max_unpool2d(x, i, 2, output_size=[4, 4])


@pytest.mark.parametrize("name, module, shapes", [
    ("2d", _Unpool2d, [(1, 2, 9, 7), (3, 2, 9, 7)]),
    ("1d", _Unpool1d, [(1, 2, 9), (3, 2, 9)]),
    ("3d", _Unpool3d, [(1, 2, 4, 6, 6), (2, 2, 4, 6, 6)]),
])
def test_max_unpool_matches_torch(backend, tmp_path, name, module, shapes):
    """aten::max_unpool2d / max_unpool3d (SegNet's and ENet's decoders; 1-D goes through the
    2-D one): the pooled values back at their argmax positions in zeros of output_size, with a
    dynamic batch (0 too); an index outside the plane is a ShapeError naming the operator."""
    from helpers import export_module

    import kuiper_xp

    m = module()
    param = export_module(m, [torch.randn(*shapes[0])], tmp_path, inputs2=[torch.randn(*shapes[1])])
    g = kuiper_xp.load(param, backend=backend.name, device=backend.device)
    for n in (2, 1, 0):
        x = torch.randn(n, *shapes[0][1:])
        got = kuiper_xp.to_numpy(g(backend.asarray(x.numpy()))[0])
        want = m(x).numpy()
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_max_unpool_given_indices_checks_their_range(tmp_path):
    from helpers import export_module

    import kuiper_xp

    m = _UnpoolGiven()
    ex = (torch.randn(1, 2, 2, 2), torch.randint(0, 16, (1, 2, 2, 2)))
    param = export_module(m, ex, tmp_path, inputs2=(torch.randn(2, 2, 2, 2), torch.randint(0, 16, (2, 2, 2, 2))))
    g = kuiper_xp.load(param, backend="numpy")
    x, i = torch.randn(2, 2, 2, 2), torch.randperm(16)[:8].reshape(2, 2, 2).repeat(2, 1, 1, 1)
    np.testing.assert_array_equal(g(x.numpy(), i.numpy())[0], m(x, i).numpy())
    bad = i.clone()
    bad[1, 1, 0, 1] = 16
    with pytest.raises(RuntimeError):
        m(x, bad)  # (torch refuses it too)
    with pytest.raises(ShapeError, match=r"aten::max_unpool2d .*unpooling index 16 is out of range for a dimension of size 16"):
        g(x.numpy(), bad.numpy())


class _PoolFromSize(nn.Module):
    """Windows computed from the input's shape: pnnx keeps ``aten::avg_pool2d`` /
    ``aten::max_pool2d`` with every argument a ``pnnx.Expression`` operand (``size(@0,2)`` when
    the spatial size is dynamic). MobileOne's squeeze-excite pools this way."""

    def forward(self, x):
        b, c, h, w = x.size()
        return (F.avg_pool2d(x, kernel_size=[h, w]),
                F.avg_pool2d(x, [h // 2, w // 2], stride=2),
                F.max_pool2d(x, x.shape[2:]),
                F.max_pool2d(x, [h // 2, 3], stride=[2, 1], padding=1),
                F.max_pool2d(x, [3, w // 3], stride=[1, 2], padding=[1, 0], dilation=[2, 1], ceil_mode=True),
                F.avg_pool2d(x, [3, w // 2], stride=1, padding=[1, 0], ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(x, [h // 2, 2], divisor_override=3))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_aten_pools_with_windows_from_the_input_shape(model_backend, tmp_path, dynamic):
    from test_layers_misc import compare_graph, export_module

    torch.manual_seed(0)
    param = export_module(_PoolFromSize(), (torch.randn(2, 4, 8, 9),), tmp_path,
                          inputs2=(torch.randn(3, 4, 11, 12),) if dynamic else None)
    text = param.read_text()
    assert "aten::avg_pool2d" in text and "aten::max_pool2d" in text
    assert ("size(@0,2)" in text) == dynamic
    for shape in ((2, 4, 8, 9),) + (((1, 4, 13, 10), (3, 4, 11, 12)) if dynamic else ()):
        compare_graph(param, model_backend, _PoolFromSize(), (torch.randn(*shape),), rtol=1e-5)


def test_aten_pool_operands_are_checked(tmp_path):
    """Wrong arity fails at load naming the operator; a window that does not fit the input, or
    padding over half the kernel, is a ShapeError at run time naming it."""
    import zipfile

    import kuiper_xp
    from kuiper_xp.errors import KuiperXPError

    head = "7767517\n{n} {m}\npnnx.Input in0 0 1 x\n"
    consts = ("pnnx.Expression k 0 1 k expr=[2,2]\npnnx.Expression s 0 1 s expr=None\n"
              "pnnx.Expression p 0 1 p expr=[{pad},{pad}]\npnnx.Expression d 0 1 d expr=[1,1]\n"
              "pnnx.Expression c 0 1 c expr=False\n")
    good = head.format(n=8, m=7) + consts.format(pad=0) + \
        "aten::max_pool2d mp 6 1 x k s p d c y\npnnx.Output out 1 0 y\n"
    short = head.format(n=8, m=7) + consts.format(pad=0) + \
        "aten::max_pool2d mp 5 1 x k s p d y\npnnx.Output out 1 0 y\n"
    bad_pad = good.replace("expr=[0,0]", "expr=[2,2]")
    for name, text in (("good", good), ("short", short), ("bad_pad", bad_pad)):
        (tmp_path / f"{name}.pnnx.param").write_text(text)
        zipfile.ZipFile(tmp_path / f"{name}.pnnx.bin", "w").close()
    x = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    (y,) = kuiper_xp.load(tmp_path / "good.pnnx.param", backend="numpy")(x)
    np.testing.assert_array_equal(kuiper_xp.to_numpy(y), F.max_pool2d(torch.from_numpy(x), 2).numpy())
    with pytest.raises(LayerParameterError, match=r"mp.*expected 6 inputs"):
        kuiper_xp.load(tmp_path / "short.pnnx.param", backend="numpy")
    with pytest.raises(KuiperXPError, match=r"mp.*padding=\(2, 2\) must be at most half"):
        kuiper_xp.load(tmp_path / "bad_pad.pnnx.param", backend="numpy")(x)
    # the 1-D form (avg: no divisor_override operand)
    one_d = (head.format(n=7, m=6) + "pnnx.Expression k 0 1 k expr=[3]\npnnx.Expression s 0 1 s expr=None\n"
             "pnnx.Expression p 0 1 p expr=[1]\npnnx.Expression c 0 1 c expr=False\n"
             "aten::avg_pool1d ap 6 1 x k s p c c y\npnnx.Output out 1 0 y\n")
    (tmp_path / "one_d.pnnx.param").write_text(one_d)
    zipfile.ZipFile(tmp_path / "one_d.pnnx.bin", "w").close()
    x1 = np.random.default_rng(0).standard_normal((2, 3, 10)).astype(np.float32)
    (y1,) = kuiper_xp.load(tmp_path / "one_d.pnnx.param", backend="numpy")(x1)
    want = F.avg_pool1d(torch.from_numpy(x1), 3, None, 1, False, False).numpy()
    np.testing.assert_allclose(kuiper_xp.to_numpy(y1), want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ShapeError, match="empty") as info:  # (the runtime's note names the operator)
        kuiper_xp.load(tmp_path / "good.pnnx.param", backend="numpy")(np.ones((2, 3, 1, 1), np.float32))
    assert any("aten::max_pool2d 'mp'" in n for n in info.value.__notes__)
