"""Optional compiled kernels for the numpy backend (numba). Off by default: the plain numpy paths
of :mod:`numpy_fast` stay the default and the reference; ``numpy_fast.use_numba(True)`` or
``KUIPER_XP_NUMBA=1`` switches these on where numba is installed (``pip install numba``).

Two kernels, where numpy needs many passes over memory:

* depthwise convolution: in numpy ``kh*kw`` multiply and add passes over the map (no FMA, one
  ufunc call per tap; 98 for ConvNeXt's 7x7), the one hot spot of MobileNet-style models a GEMM
  cannot absorb;
* GELU (erf form) in float32: numpy evaluates the rational approximation of erf in 29 ufunc
  passes; here it is one vectorised loop, with the same float32 constants and operation order
  (no fast-math), so the results match the numpy path to rounding.

The kernels are compiled on first use (about 1.5 s each, cached on disk by numba afterwards) and
release the GIL, so the numpy backend's own threads split the work.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["depthwise_channels", "gelu_f32", "UNARY", "warm_up"]


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


#: elementwise kernels by activation name: ``kernel(src, dst)`` on flat float32 arrays
UNARY = {"gelu": gelu_f32}


def warm_up(dtype=np.float32) -> None:
    """Compile (or load from numba's cache) the kernels for ``dtype`` now instead of on first use."""
    dt = np.dtype(dtype)
    depthwise_channels(np.zeros((1, 3, 3), dt), np.zeros((1, 3, 3), dt), np.zeros(1, dt),
                       np.zeros((1, 1, 1), dt), 0, 1, 1, 1, 1, 1, 1, 0, 0, False, 0.0, 0.0)
    if dt == np.float32:
        gelu_f32(np.zeros(4, dt), np.zeros(4, dt))
