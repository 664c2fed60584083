"""Optional compiled kernels for the numpy backend (numba). Off by default: the plain numpy paths
of :mod:`numpy_fast` stay the default and the reference; ``numpy_fast.use_numba(True)`` or
``KUIPER_XP_NUMBA=1`` switches these on where numba is installed (``pip install numba``).

Kernels where numpy needs many passes over memory, or has no fast routine:

* depthwise convolution: in numpy ``kh*kw`` multiply and add passes over the map (no FMA, one
  ufunc call per tap; 98 for ConvNeXt's 7x7), the one hot spot of MobileNet-style models a GEMM
  cannot absorb;
* GELU (erf form) in float32: numpy evaluates the rational approximation of erf in 29 ufunc
  passes; here it is one vectorised loop, with the same float32 constants and operation order
  (no fast-math), so the results match the numpy path to rounding;
* SiLU and sigmoid in float32: numpy's float32 ``exp`` is a scalar loop on AVX2 machines (about
  2.3 ns per element here, 24 of YOLOv5n's 93 ms at batch 1); these use their own exp (Cephes'
  range reduction and polynomial, within 1 ulp), which LLVM vectorises: about 1 ns per element
  on one thread. Results are within 2 float32 ulps of torch (denormal results aside), not
  bit-equal to the numpy path.

The kernels are compiled on first use (about 1.5 s each, cached on disk by numba afterwards) and
release the GIL, so the numpy backend's own threads split the work.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["depthwise_channels", "gelu_f32", "silu_f32", "sigmoid_f32", "UNARY", "warm_up"]


@njit(nogil=True, cache=True, boundscheck=False, fastmath={"contract"})
def depthwise_channels(x, w, bias, y, c0, c1, mult, sh, sw, dh, dw, pt, pl, clamp, lo, hi):  # pragma: no cover - compiled
    """``y[c] = bias[c] + sum_taps w[c, i, j] * xpad[c // mult]`` for channels ``[c0, c1)`` of
    one image: ``x`` (C, H, W) unpadded (zero padding ``pt``/``pl`` top/left handled by the tap
    ranges), ``w`` (O, kh, kw), ``y`` (O, Ho, Wo); ``clamp`` applies ``min(max(v, lo), hi)``.
    Each tap adds a contiguous (or strided) run of a row into a row accumulator: slices so
    that LLVM vectorises the inner loop (plain indexed loops kept numba's wraparound checks)."""
    H = x.shape[1]
    W = x.shape[2]
    KH = w.shape[1]
    KW = w.shape[2]
    Ho = y.shape[1]
    Wo = y.shape[2]
    acc = np.empty(Wo, dtype=y.dtype)
    for c in range(c0, c1):
        xc = x[c // mult]
        b = bias[c]
        for i in range(Ho):
            for j in range(Wo):
                acc[j] = b
            for ki in range(KH):
                r = i * sh - pt + ki * dh
                if r < 0 or r >= H:
                    continue
                xr = xc[r]
                for kj in range(KW):
                    wv = w[c, ki, kj]
                    off = kj * dw - pl
                    j0 = 0
                    if off < 0:
                        j0 = (-off + sw - 1) // sw
                    j1 = (W - 1 - off) // sw + 1
                    if j1 > Wo:
                        j1 = Wo
                    if j1 <= j0:
                        continue
                    a = acc[j0:j1]
                    if sw == 1:  # a unit-stride slice: numba types it contiguous (vector loads)
                        src = xr[j0 + off:j1 + off]
                        for j in range(j1 - j0):
                            a[j] += wv * src[j]
                    else:
                        srs = xr[j0 * sw + off:(j1 - 1) * sw + off + 1:sw]
                        for j in range(j1 - j0):
                            a[j] += wv * srs[j]
            yr = y[c, i]
            if clamp:
                for j in range(Wo):
                    v = acc[j]
                    if v < lo:
                        v = lo
                    if v > hi:
                        v = hi
                    yr[j] = v
            else:
                for j in range(Wo):
                    yr[j] = acc[j]


# float32 constants of numpy_fast._k_gelu (x * (0.5 + 0.5 erf(x / sqrt 2)), the 0.5 folded into
# the numerator): numba keeps float32 arithmetic when every operand is float32
_F = np.float32
_S = _F(0.70710678118654752440)
_P = tuple(_F(c * 0.5) for c in (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
                                 -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
                                 -2.72614225801306e-10))
_Q = tuple(_F(c) for c in (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
                           -2.13374055278905e-04, -1.45660718464996e-05))
_P0, _P1, _P2, _P3, _P4, _P5, _P6 = _P
_Q0, _Q1, _Q2, _Q3, _Q4 = _Q
_LO, _HI, _HALF = _F(-4.0), _F(4.0), _F(0.5)


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")  # numpy's division: no
def gelu_f32(src, dst):  # ZeroDivisionError branch, so the loop vectorises
    """GELU (erf) of flat float32 ``src`` into ``dst`` (may be the same array: blocks go through
    a local buffer, else LLVM's overlap check sends the in-place call to its scalar loop)."""
    n = src.shape[0]
    buf = np.empty(512, dtype=np.float32)
    for i0 in range(0, n, 512):
        m = min(512, n - i0)
        s_blk = src[i0:i0 + m]
        for i in range(m):
            s = s_blk[i]
            x = min(max(s * _S, _LO), _HI)  # selects (NaN: the product with s below keeps it)
            x2 = x * x
            p = x2 * _P6 + _P5
            p = p * x2 + _P4
            p = p * x2 + _P3
            p = p * x2 + _P2
            p = p * x2 + _P1
            p = p * x2 + _P0
            q = x2 * _Q4 + _Q3
            q = q * x2 + _Q2
            q = q * x2 + _Q1
            q = q * x2 + _Q0
            buf[i] = s * (p * x / q + _HALF)
        d_blk = dst[i0:i0 + m]
        for i in range(m):
            d_blk[i] = buf[i]


# exp(x) for float32 as Cephes' expf: x = k ln2 + r (ln2 in two parts), |r| <= ln2 / 2, exp(r) by a
# degree-7 polynomial (within 1 ulp), 2^k put into the exponent bits. numpy's float32 exp runs
# about 2.3 ns per element on this AVX2 machine (no SIMD exp there); this loop vectorises.
_LOG2E = _F(1.44269504088896341)
_LN2_HI, _LN2_LO = _F(0.693359375), _F(-2.12194440e-4)
_E0, _E1, _E2, _E3, _E4, _E5 = (_F(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                                4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
# below -87 exp is under float32's smallest normal (1 + it is 1 anyway); from 88.4 on 2^k is
# 2^128, whose bits are +inf: exp overflows to inf as numpy's does
_X_LO, _X_HI, _ONE = _F(-87.0), _F(89.0), _F(1.0)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _exp_block(src, m, neg, eb, fb, ib):  # pragma: no cover - compiled
    """``eb[:m] * fb[:m] = exp(-src[:m] if neg else src[:m])``; ``ib`` is ``fb`` viewed as int32."""
    for i in range(m):
        x = -src[i] if neg else src[i]
        x = min(max(x, _X_LO), _X_HI)  # NaN passes through a select and stays NaN below
        k = np.floor(x * _LOG2E + _HALF)  # np.floor keeps float32 (math.floor gives an int64)
        r = x - k * _LN2_HI
        r = r - k * _LN2_LO
        p = _E0 * r + _E1
        p = p * r + _E2
        p = p * r + _E3
        p = p * r + _E4
        p = p * r + _E5
        eb[i] = p * r * r + r + _ONE
        ib[i] = (np.int32(k) + np.int32(127)) << 23


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _logistic(src, dst, times_x):  # pragma: no cover - compiled
    """``(x if times_x else 1) / (1 + exp(-x))`` of flat float32 ``src`` into ``dst`` (may be the
    same array); inlined into each caller with ``times_x`` a constant, so the branch folds."""
    n = src.shape[0]
    fb = np.empty(512, dtype=np.float32)
    ib = fb.view(np.int32)
    eb = np.empty(512, dtype=np.float32)
    for i0 in range(0, n, 512):
        m = min(512, n - i0)
        s_blk = src[i0:i0 + m]
        _exp_block(s_blk, m, True, eb, fb, ib)
        for i in range(m):  # into the local buffer: an in-place dst would fail LLVM's
            eb[i] = (s_blk[i] if times_x else _ONE) / (_ONE + eb[i] * fb[i])  # overlap check
        d_blk = dst[i0:i0 + m]
        for i in range(m):
            d_blk[i] = eb[i]


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def silu_f32(src, dst):  # pragma: no cover - compiled
    """SiLU ``x / (1 + exp(-x))`` of flat float32 ``src`` into ``dst`` (may be the same array)."""
    _logistic(src, dst, True)


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def sigmoid_f32(src, dst):  # pragma: no cover - compiled
    """Sigmoid ``1 / (1 + exp(-x))`` of flat float32 ``src`` into ``dst`` (may be the same)."""
    _logistic(src, dst, False)


#: elementwise kernels by activation name: ``kernel(src, dst)`` on flat float32 arrays
UNARY = {"gelu": gelu_f32, "silu": silu_f32, "sigmoid": sigmoid_f32}


def warm_up(dtype=np.float32) -> None:
    """Compile (or load from numba's cache) the kernels for ``dtype`` now instead of on first use."""
    dt = np.dtype(dtype)
    depthwise_channels(np.zeros((1, 3, 3), dt), np.zeros((1, 3, 3), dt), np.zeros(1, dt),
                       np.zeros((1, 1, 1), dt), 0, 1, 1, 1, 1, 1, 1, 0, 0, False, 0.0, 0.0)
    if dt == np.float32:
        for kernel in UNARY.values():
            kernel(np.zeros(4, dt), np.zeros(4, dt))
