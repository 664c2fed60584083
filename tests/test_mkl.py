"""The optional MKL paths of the numpy backend (backends/mkl_kernels.py, switched on by
numpy_fast.use_mkl): the matrix products in every layout the wrapper takes, against numpy's
matmul, and every layout it must refuse (then nothing is written and numpy computes); whole layers
against torch with the products split over threads; MKL's erf and exp and the activations built on
them against torch. Skipped where MKL's library is not installed (pip install mkl)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import in_fast_scope
from kuiper_xp.backends import mkl_kernels
from kuiper_xp.backends import numpy_fast as nf

if mkl_kernels.find_library() is None:
    pytest.skip("MKL's library is not installed (pip install mkl)", allow_module_level=True)


@pytest.fixture
def mkl(monkeypatch):
    monkeypatch.setattr(nf, "_mkl", None)
    nf.use_mkl(True)
    assert nf.mkl_enabled()
    return nf._mkl


def rnd(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _layouts(m, k, n, dtype):
    """(name, a, b): C order, transposed views, slices with a leading dimension larger than the
    width, single rows and columns."""
    a, b = rnd(m, k, dtype=dtype), rnd(k, n, dtype=dtype, seed=1)
    wide_a, wide_b = rnd(m, k + 5, dtype=dtype, seed=2), rnd(k, n + 7, dtype=dtype, seed=3)
    yield "c", a, b
    yield "a transposed", np.ascontiguousarray(a.T).T, b
    yield "b transposed", a, np.ascontiguousarray(b.T).T
    yield "both transposed", np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T
    yield "column slices", wide_a[:, 2:2 + k], wide_b[:, 3:3 + n]
    yield "rows of a transposed slice", rnd(k + 4, m, dtype=dtype, seed=4)[1:1 + k].T, b
    yield "one row", a[m - 1:m], b
    yield "one column of b", a, b[:, n - 1:n]
    yield "a column as rows", rnd(k, 3, dtype=dtype, seed=5)[:, 1:2].T, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", [(5, 7, 3), (50, 96, 130), (1, 1, 1)])
def test_mkl_matmul_layouts_match_numpy(mkl, dtype, m, k, n):
    for name, a, b in _layouts(m, k, n, dtype):
        out = np.full((a.shape[0], b.shape[1]), np.nan, dtype)
        assert mkl.matmul(a, b, out), name
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol * k,
                                   err_msg=name)
    # an output with a leading dimension larger than its width: only its columns are written
    a, b = rnd(m, k, dtype=dtype), rnd(k, n, dtype=dtype, seed=1)
    big = np.full((m, n + 4), 7.0, dtype)
    assert mkl.matmul(a, b, big[:, 2:2 + n])
    assert (big[:, :2] == 7).all() and (big[:, 2 + n:] == 7).all()
    np.testing.assert_allclose(big[:, 2:2 + n], a @ b, rtol=1e-5, atol=1e-5 * k)


def test_mkl_matmul_refuses_what_it_cannot_take(mkl):
    a, b = rnd(6, 8), rnd(8, 5, seed=1)
    refused = {
        "float16": (a.astype(np.float16), b.astype(np.float16), np.empty((6, 5), np.float16)),
        "mixed dtypes": (a, b.astype(np.float64), np.empty((6, 5), np.float64)),
        "int": (a.astype(np.int32), b.astype(np.int32), np.empty((6, 5), np.int32)),
        "3-D": (a[None], b[None], np.empty((1, 6, 5), np.float32)),
        "no unit stride": (rnd(12, 16)[::2, ::2], b, np.empty((6, 5), np.float32)),
        "negative stride": (a[::-1], b, np.empty((6, 5), np.float32)),
        "column-major out": (a, b, np.empty((5, 6), np.float32).T),
        "shape mismatch": (a, rnd(7, 5), np.empty((6, 5), np.float32)),
        "empty": (a[:, :0], b[:0], np.empty((6, 5), np.float32)),
    }
    for name, (x, y, out) in refused.items():
        before = out.copy()
        assert not mkl.matmul(x, y, out), name
        assert np.array_equal(out, before, equal_nan=True) or out.size == 0, name
    # the output overlapping an operand: refused, and _mm gives numpy's answer
    buf = rnd(6, 8)
    want = buf[:, :5] @ rnd(5, 5, seed=4)
    assert not mkl.matmul(buf[:, :5], rnd(5, 5, seed=4), buf[:, 3:8])
    got = nf._mm(buf[:, :5], rnd(5, 5, seed=4), buf[:, 3:8])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_use_mkl_switch_and_missing_library(monkeypatch):
    monkeypatch.setattr(nf, "_mkl", None)
    assert nf.use_mkl(True) is False and nf.mkl_enabled()
    assert nf.use_mkl(False) is True and not nf.mkl_enabled()
    monkeypatch.setattr(mkl_kernels, "find_library", lambda: None)
    with pytest.raises(ImportError, match="pip install mkl"):
        nf.use_mkl(True)
    assert not nf.mkl_enabled()
    with pytest.raises(ImportError, match="could not be used as MKL"):
        mkl_kernels.MKL("/nonexistent/libmkl_rt.so.2")


@pytest.mark.parametrize("m", [1, 50, 203])
def test_split_gemm_through_mkl_matches_torch(mkl, monkeypatch, m):
    """numpy_fast._gemm with MKL on, split over 3 threads by columns or by rows (ViT's linear
    shapes, a transposed weight view as the layer packs it), and numpy_fast.linear."""
    monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_MACS", 0)
    x, w, bias = rnd(m, 96), rnd(200, 96, seed=1), rnd(200, seed=2)
    want = F.linear(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias)).numpy()
    got = in_fast_scope(nf, lambda: nf.linear(x, nf.pack_linear(w), bias))
    assert_close(got, want, rtol=1e-5, what=f"linear, {m} rows")
    tall = rnd(300, 40, seed=3)  # more rows than columns: split by rows
    got = in_fast_scope(nf, lambda: nf._gemm(tall, w[:40, :20], np.empty((300, 20), np.float32)))
    assert_close(got, tall @ w[:40, :20], rtol=1e-5, what="rows split")


@pytest.mark.parametrize("layout", ["planar", "channels_last"])
def test_convolutions_through_mkl_match_torch(mkl, monkeypatch, layout):
    """The convolution paths whose products go through MKL (1x1 blocks of pixels, im2col rows,
    shift) against torch, on 3 threads."""
    monkeypatch.setattr(nf, "CONV1X1_SPLIT_MIN_MACS", 0)
    x = rnd(2, 24, 9, 11)
    if layout == "channels_last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    for w_shape, stride, pad in (((32, 24, 1, 1), 1, 0), ((16, 24, 3, 3), 2, 1), ((8, 24, 3, 3), 1, 1)):
        w, b = rnd(*w_shape, seed=1), rnd(w_shape[0], seed=2)
        plan = nf.conv2d_plan(w, b, stride=(stride, stride), pads=((pad, pad), (pad, pad)))
        want = F.silu(F.conv2d(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(w),
                               torch.from_numpy(b), stride, pad)).numpy()
        got = in_fast_scope(nf, lambda p=plan: p(x, "silu"))
        assert_close(got, want, rtol=1e-5, what=f"{plan.algo} {w_shape} stride {stride}, {layout}")


def test_mkl_vector_math_matches_torch_and_refuses_other_layouts(mkl):
    x = np.concatenate([np.linspace(-12, 12, 4001), [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, 89.0, -104.0]])
    for dt in (np.float32, np.float64):
        xs = x.astype(dt)
        for name, fn in (("erf", torch.erf), ("exp", torch.exp)):
            out = np.empty_like(xs)
            assert mkl.unary(name, xs, out)
            with np.errstate(over="ignore"):  # (float32: exp(89) = inf)
                want = fn(torch.from_numpy(xs.astype(np.float64))).numpy().astype(dt)
            np.testing.assert_allclose(out, want, rtol=3e-7 if dt == np.float32 else 1e-15, atol=0,
                                       err_msg=f"{name} {dt.__name__}")
            inplace = xs.copy()
            assert mkl.unary(name, inplace, inplace)
            np.testing.assert_array_equal(inplace, out)
    a = np.ones(8, np.float32)
    for name, x, out in (("erf", a[::2], np.full(4, 5, np.float32)), ("erf", a, np.full(8, 5, np.float64)),
                         ("erf", a.reshape(2, 4), np.full((2, 4), 5, np.float32)), ("tanh", a, a.copy()),
                         ("exp", a.astype(np.float16), a.astype(np.float16))):
        before = out.copy()
        assert not mkl.unary(name, x, out), (name, x.dtype, x.shape)
        assert np.array_equal(out, before)
    assert mkl.unary("exp", a[:0], a[:0])  # empty: nothing to do


@pytest.mark.parametrize("name, fn", [("gelu", F.gelu), ("silu", F.silu), ("sigmoid", torch.sigmoid)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_through_mkl_vector_math_match_torch(mkl, monkeypatch, name, fn, dtype):
    """GELU (erf), SiLU and sigmoid with MKL's erf/exp: in chunks (a short last one) over 3
    threads, in place and out of place, NaN and infinities as torch gives them (GELU's +inf: the
    limit, +inf)."""
    monkeypatch.setattr(nf, "UNARY_CHUNK", 1000)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = (np.random.default_rng(3).standard_normal(7919) * 5).astype(dtype)
    x[:7] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -90.0]
    want = fn(torch.from_numpy(x.astype(np.float64))).numpy()
    if name == "gelu":
        want[1] = np.inf
    got = in_fast_scope(nf, lambda: nf.unary(name, x))
    inplace = x.copy()
    assert in_fast_scope(nf, lambda: nf.activation_inplace(inplace, name)) is inplace
    tol = 2e-6 if dtype == np.float32 else 1e-12
    for what, y in (("fresh", got), ("in place", inplace)):
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want), err_msg=what)
        np.testing.assert_allclose(y, want, rtol=tol, atol=tol, err_msg=f"{name} {what}")
