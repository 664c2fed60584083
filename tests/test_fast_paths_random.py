"""Seeded random cases for the numpy backend's fast paths (backends/numpy_fast.py) against
torch: convolution plans (every algorithm the choice can make, channels-last views), pooling,
resizing by scale factor, grid sampling, attention and gather, each drawn over the parameter
ranges where the branches and their thresholds meet, on one and on two threads with the
splitting thresholds lowered so that small arrays take the threaded code. A fixed seed per
family keeps the cases the same from run to run; each case's parameters are in its message.
(Session 21's fuzzing of these families found wrong results that the fixed-case tests had not:
these keep a sample of that search in the suite.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import make_layer, run
from kuiper_xp.backends import get_backend
from kuiper_xp.backends import numpy_fast as nf

CASES = 40


@pytest.fixture(params=["one", "split"])
def mode(request, monkeypatch):
    """As configured on one thread; or two threads with every split threshold lowered."""
    if request.param == "split":
        monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
        monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_MACS", 0)
        monkeypatch.setattr(nf, "TINY_ELEMENTS", 8)
        monkeypatch.setattr(nf, "WINOGRAD_MIN_PIXELS", 0)
        threads = 2
    else:
        threads = 1
    old = nf.set_num_threads(threads)
    try:
        with nf.compute_scope():
            yield request.param
    finally:
        nf.set_num_threads(old)


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _conv_case(rng):
    n = int(rng.integers(1, 4))
    kind = rng.choice(["dense", "depthwise", "grouped", "pointwise"])
    c = int(rng.integers(1, 9)) * (2 if kind == "grouped" else 1)
    k = 1 if kind == "pointwise" else int(rng.choice([1, 2, 3, 3, 5, 7]))
    groups = c if kind == "depthwise" else (2 if kind == "grouped" else 1)
    o = c * int(rng.integers(1, 3)) if kind == "depthwise" else int(rng.integers(1, 10)) * groups
    s = int(rng.choice([1, 1, 2, 3]))
    d = int(rng.choice([1, 1, 2]))
    pads = tuple(int(v) for v in rng.integers(0, k, 4))
    h, w = (int(v) for v in rng.integers(1, 24, 2))
    ext = d * (k - 1) + 1
    h, w = max(h, ext - pads[0] - pads[1]), max(w, ext - pads[2] - pads[3])
    return n, c, o, k, s, d, groups, pads, h, w


@pytest.mark.parametrize("weight_view", [False, True], ids=["packed", "weight_view"])
def test_random_convolutions_match_torch(mode, weight_view, monkeypatch):
    """Every algorithm (Winograd forced on the cases it takes), with an inf or NaN pixel in some
    inputs: torch's non-finite outputs exactly, the others within 1e-5 of the sums' size.
    ``weight_view``: every stride-1 im2col GEMM multiplies the weight itself and adds the bias
    after it (GEMM_WEIGHT_VIEW_MIN_K 0; by default only from 1024 multiply-adds per output)."""
    if weight_view:
        monkeypatch.setattr(nf, "GEMM_WEIGHT_VIEW_MIN_K", 0)
    rng = np.random.default_rng(2101)
    for i in range(CASES * 2):
        n, c, o, k, s, d, groups, (pt, pb, pl, pr), h, w = case = _conv_case(rng)
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        if rng.random() < 0.25:
            x.reshape(-1)[rng.integers(0, x.size)] = rng.choice([np.inf, -np.inf, np.nan])
        if rng.random() < 0.3:  # a channels-last array seen as (N, C, H, W)
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        wt = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32) if rng.random() < 0.7 else None
        algo = tile = None
        if k == 3 and s == 1 and groups == 1 and d == 1 and rng.random() < 0.5:
            algo, tile = "winograd", int(rng.choice([2, 4]))
        plan = nf.conv2d_plan(wt, b, stride=(s, s), dilation=(d, d), groups=groups,
                              pads=((pt, pb), (pl, pr)), input_hw=(h, w), algo=algo, tile=tile)
        if plan is None:
            continue
        x64 = F.pad(_t(x).double(), (pl, pr, pt, pb))
        want = F.conv2d(x64, _t(wt).double(), None if b is None else _t(b).double(), s, 0, d, groups).numpy()
        fin = np.isfinite(want)
        got = np.asarray(plan(x))
        what = f"case {i} {case} algo {plan.algo}"
        assert got.shape == want.shape, what
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
        np.testing.assert_array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)], err_msg=what)
        x64 = x64.nan_to_num(0.0, 0.0, 0.0)
        scale = F.conv2d(x64.abs(), _t(wt).double().abs(), None, s, 0, d, groups).numpy()  # the sums' size
        if plan.algo == "winograd":  # (its rounding is relative to the largest sums of the map)
            scale = np.maximum(scale, scale.max())
        err = float((np.abs(got[fin] - want[fin]) / (scale[fin] + 1)).max()) if fin.any() else 0.0
        assert err < 1e-5, f"{what}: error {err:.2g}"


@pytest.mark.parametrize("n, c, o, k, hw, groups", [
    (1, 128, 96, 3, 7, 1),     # a small map: the GEMM on one image
    (3, 128, 64, 3, 6, 1),     # small images side by side
    (1, 48, 40, 5, 20, 1),     # 5x5: the row pipeline
    (2, 256, 64, 3, 5, 2),     # grouped
])
def test_convolution_gemm_on_the_weight_itself(mode, n, c, o, k, hw, groups):
    """From GEMM_WEIGHT_VIEW_MIN_K multiply-adds per output a stride-1 im2col GEMM reads the
    weight itself (no packed copy) and adds the bias after it, then the fused activation: the
    result is torch's."""
    rng = np.random.default_rng(2105)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    wt = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    wt.flags.writeable = False  # (as a graph's weights are)
    b = rng.standard_normal(o).astype(np.float32)
    plan = nf.Conv2dPlan(wt, b, (1, 1), (1, 1), groups, ((k // 2,) * 2,) * 2, algo="gemm")
    assert c // groups * k * k >= nf.GEMM_WEIGHT_VIEW_MIN_K and not plan.bias_column
    got = np.asarray(plan(x, "relu"))
    assert np.shares_memory(plan.wmat, wt)
    want = F.relu(F.conv2d(_t(x), _t(wt.copy()), _t(b), 1, k // 2, 1, groups)).numpy()
    assert_close(got, want, rtol=1e-5, atol=1e-5, what=f"{(n, c, o, k, hw, groups)}")


def test_random_pools_match_torch(mode):
    rng = np.random.default_rng(2102)
    for i in range(CASES * 2):
        n, c = int(rng.integers(1, 3)), int(rng.integers(1, 6))
        k = (int(rng.integers(1, 6)), int(rng.integers(1, 14)))
        s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        p = (int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1)))
        ceil = bool(rng.random() < 0.4)
        h, w = int(rng.integers(k[0], k[0] + 12)), int(rng.integers(k[1], k[1] + 30))
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        if rng.random() < 0.3:
            x.reshape(-1)[rng.integers(0, x.size, 2)] = rng.choice([np.inf, -np.inf, np.nan], 2)
        case = (n, c, h, w, k, s, p, ceil)
        if rng.random() < 0.5:
            include = bool(rng.random() < 0.5)
            want = F.avg_pool2d(_t(x), k, s, p, ceil, include).numpy()
            got = nf.avg_pool2d(x, k, s, p, ceil, include, None)
        else:
            want = F.max_pool2d(_t(x), k, s, p, 1, ceil).numpy()
            got = nf.max_pool2d(x, k, s, p, (1, 1), ceil)
        if got is not None:
            assert_close(got, want, rtol=1e-5, what=f"case {i} {case}")


@pytest.mark.parametrize("rows_first", [False, True])
def test_random_max_pools_either_order_equal_torch(mode, rows_first):
    """The separable max pool taking the column views first or the row views first (max_pool2d
    picks per shape) gives torch's maxima exactly, NaN and infinities included, for strides,
    dilations, padding and ceil mode, in float32 and int32."""
    rng = np.random.default_rng(2104)
    for i in range(CASES):
        n, c = int(rng.integers(1, 3)), int(rng.integers(1, 5))
        k = (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
        s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        d = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        p = (int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1)))
        ceil = bool(rng.random() < 0.4)
        h = int(rng.integers(d[0] * (k[0] - 1) + 1, d[0] * (k[0] - 1) + 14))
        w = int(rng.integers(d[1] * (k[1] - 1) + 1, d[1] * (k[1] - 1) + 30))
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        if i % 3 == 0:
            x.reshape(-1)[rng.integers(0, x.size, 3)] = rng.choice([np.inf, -np.inf, np.nan], 3)
        if i % 4 == 1:
            x = rng.integers(-1000, 1000, (n, c, h, w)).astype(np.int32)
        case = (x.dtype, n, c, h, w, k, s, p, d, ceil)
        want = F.max_pool2d(torch.from_numpy(x.astype(np.float64)), k, s, p, d, ceil).numpy().astype(x.dtype)
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        got = nf._window_reduce(x, k, s, p, d, ceil, np.maximum, low, rows_first=rows_first)
        assert got.dtype == x.dtype, case
        np.testing.assert_array_equal(got, want, err_msg=f"case {i} {case}")


def test_random_long_row_averages_match_torch(mode):
    """AvgPool1d over long windows (the running-sum path) with infinities and huge values."""
    rng = np.random.default_rng(2103)
    for i in range(CASES):
        k = int(rng.integers(12, 40))
        x = rng.standard_normal((int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(k, 3 * k)))
                                ).astype(np.float32)
        for _ in range(int(rng.integers(0, 3))):
            x.reshape(-1)[rng.integers(0, x.size)] = rng.choice([np.inf, -np.inf, np.nan, 1e20, -3e19])
        want = F.avg_pool1d(_t(x), k, 1).numpy()
        got = nf.avg_pool2d(x[:, :, None, :], (1, k), (1, 1), (0, 0), False, True, None)
        assert_close(got[:, :, 0, :], want, rtol=1e-5, what=f"case {i} k={k}")


def test_random_resizes_by_scale_factor_match_torch():
    """F.interpolate by a scale factor, every mode, 1-3 spatial axes, sizes whose product with
    the factor rounds to the size or twice it (torch's kernels take shortcuts there)."""
    rng = np.random.default_rng(2104)
    be = get_backend("numpy")
    modes = {1: ["nearest", "nearest-exact", "linear"], 2: ["nearest", "nearest-exact", "bilinear", "bicubic"],
             3: ["nearest", "nearest-exact", "trilinear"]}
    for i in range(CASES * 3):
        nsp = int(rng.integers(1, 4))
        mode = str(rng.choice(modes[nsp]))
        sizes = tuple(int(v) for v in rng.integers(1, 12, nsp))
        factors = tuple(float(round(rng.choice([rng.uniform(0.4, 3.0), 1 + rng.uniform(0, 1) / n,
                                                2 + rng.uniform(0, 1) / n]), 4)) for n in sizes)
        if any(int(n * f) < 1 for n, f in zip(sizes, factors)):
            continue
        dtype = np.float64 if rng.random() < 0.3 else np.float32
        x = rng.standard_normal((1, 2) + sizes).astype(dtype)
        ac = bool(rng.random() < 0.3) if mode in ("linear", "bilinear", "bicubic", "trilinear") else None
        kw = {} if ac is None else {"align_corners": ac}
        want = F.interpolate(_t(x), scale_factor=factors, mode=mode, **kw).numpy()
        params = f"mode={mode} scale_factor=({','.join(repr(f) for f in factors)})"
        if ac is not None:
            params += f" align_corners={ac}"
        got = run(be, make_layer(be, "F.interpolate", params), x)
        assert_close(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                     what=f"case {i}: {mode} {sizes} x {factors} align_corners={ac} {np.dtype(dtype).name}")


def test_random_grid_samples_match_torch():
    rng = np.random.default_rng(2105)
    be = get_backend("numpy")
    for i in range(CASES):
        mode = str(rng.choice(["bilinear", "nearest", "bicubic"]))
        pad = str(rng.choice(["zeros", "border", "reflection"]))
        ac = bool(rng.random() < 0.5)
        n, c, h, w = 2, int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        if rng.random() < 0.4:
            x[:, :, 0, 0] = rng.choice([np.inf, -np.inf, np.nan])
        g = (rng.uniform(-1.6, 1.6, (n, int(rng.integers(1, 6)), int(rng.integers(1, 6)), 2))).astype(np.float32)
        want = F.grid_sample(_t(x), _t(g), mode, pad, ac).numpy()
        layer = make_layer(be, "F.grid_sample", f"mode={mode} padding_mode={pad} align_corners={ac}", n_in=2,
                           names=("input", "grid"))
        assert_close(run(be, layer, x, g), want, rtol=1e-5, what=f"case {i}: {mode} {pad} ac={ac} {x.shape}")


def test_random_attention_matches_torch(mode):
    rng = np.random.default_rng(2106)
    for i in range(CASES):
        lead = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(1, 3))))
        L, S, D, Dv = (int(v) for v in rng.integers(1, 40, 4))
        spread = float(rng.choice([1.0, 10.0, 60.0]))
        q = (rng.standard_normal(lead + (L, D)) * spread / np.sqrt(D)).astype(np.float32)
        k = rng.standard_normal(lead + (S, D)).astype(np.float32)
        v = (rng.standard_normal(lead + (S, Dv)) * float(rng.choice([1.0, 1e4]))).astype(np.float32)
        if rng.random() < 0.4:  # every score moved near the softmax's no-shift bounds
            q = np.concatenate([q, np.ones(lead + (L, 1), np.float32)], axis=-1)
            k = np.concatenate([k * 0.1, np.full(lead + (S, 1), rng.choice([79.0, -79.0, 40.0]), np.float32)], axis=-1)
            v = (v * float(rng.choice([10.0, 1e-30]))).astype(np.float32)
        mask = None
        if rng.random() < 0.4:
            mask = np.where(rng.random((L, S)) < 0.3, -np.inf, 0.0).astype(np.float32)
            mask[:, 0] = 0.0
        scale = 1.0 if q.shape[-1] != D else float(rng.choice([1.0, 1 / np.sqrt(D)]))
        got = nf.attention(q, k, v, scale, mask)
        want = F.scaled_dot_product_attention(_t(q).double(), _t(k).double(), _t(v).double(),
                                              None if mask is None else _t(mask).double(), scale=scale).numpy()
        assert got is not None
        assert_close(got, want.astype(np.float32), rtol=1e-4, what=f"case {i}: lead {lead} L{L} S{S} D{D} Dv{Dv}")


def test_random_gathers_match_torch(mode):
    rng = np.random.default_rng(2107)
    for i in range(CASES):
        nd = int(rng.integers(1, 4))
        shape = tuple(int(v) for v in rng.integers(1, 9, nd))
        axis = int(rng.integers(0, nd))
        ishape = tuple(int(rng.integers(1, s + 1)) if a != axis else int(rng.integers(1, 12))
                       for a, s in enumerate(shape))
        x = rng.standard_normal(shape).astype(np.float32)
        idx = rng.integers(0, shape[axis], ishape)
        want = torch.gather(_t(x), axis, _t(idx)).numpy()
        got = nf.take_along(x, idx, axis)
        if got is None:  # (small: numpy's take_along_axis)
            continue
        np.testing.assert_array_equal(got, want, err_msg=f"case {i}: {shape} axis {axis} index {ishape}")
