"""Optional compiled kernels for the numpy backend (numba). Off by default: the plain numpy paths
of :mod:`numpy_fast` stay the default and the reference; ``numpy_fast.use_numba(True)`` or
``KUIPER_XP_NUMBA=1`` switches these on where numba is installed (``pip install numba``).

Only the depthwise convolution is here: in numpy it is ``kh*kw`` multiply and add passes over the
map (no FMA, one ufunc call per tap), the one hot spot of MobileNet-style models a GEMM cannot
absorb. The kernel is compiled on first use (about 1.5 s, cached on disk by numba afterwards) and
releases the GIL, so the numpy backend's own threads split it over channels.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["depthwise_channels", "warm_up"]


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


def warm_up(dtype=np.float32) -> None:
    """Compile (or load from numba's cache) the kernel for ``dtype`` now instead of on first use."""
    dt = np.dtype(dtype)
    depthwise_channels(np.zeros((1, 3, 3), dt), np.zeros((1, 3, 3), dt), np.zeros(1, dt),
                       np.zeros((1, 1, 1), dt), 0, 1, 1, 1, 1, 1, 1, 0, 0, False, 0.0, 0.0)
