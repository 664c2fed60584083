"""Optional compiled kernels for the numpy backend (numba). Off by default: the plain numpy paths
of :mod:`numpy_fast` stay the default and the reference; ``numpy_fast.use_numba(True)`` or
``KUIPER_XP_NUMBA=1`` switches these on where numba is installed (``pip install numba``).

Kernels where numpy needs many passes over memory, or has no fast routine:

* depthwise convolution: in numpy ``kh*kw`` multiply and add passes over the map (no FMA, one
  ufunc call per tap; 98 for ConvNeXt's 7x7), the one hot spot of MobileNet-style models a GEMM
  cannot absorb;
* GELU (erf form) in float32: numpy's path takes 17 ufunc passes (x / (1 + exp(-g(x))) with a
  fitted odd polynomial g); here the rational approximation of erf the generic layer uses is one
  vectorised loop (no fast-math, no exp), within 1e-6 of the numpy path and of torch;
* SiLU and sigmoid in float32: numpy's float32 ``exp`` is a scalar loop on AVX2 machines (about
  2.3 ns per element here, 24 of YOLOv5n's 93 ms at batch 1); these use their own exp (Cephes'
  range reduction and polynomial, within 1 ulp), which LLVM vectorises: about 1 ns per element
  on one thread. Results are within 2 float32 ulps of torch (denormal results aside), not
  bit-equal to the numpy path;
* softmax over rows in float32 (ViT-Tiny's attention scores, 3x197x197: 0.15 ms against
  numpy's 0.51), with the same exp; masked (-inf) entries give exact zeros;
* LayerNorm over rows (float32/float64): three vectorised loops per row where numpy needs
  about a dozen ufunc calls per block of rows, each too short to share between two threads.

The kernels are compiled on first use (1-2.5 s each, cached on disk by numba afterwards) and
release the GIL, so the numpy backend's own threads split the work.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["depthwise_channels", "gelu_f32", "silu_f32", "sigmoid_f32", "softmax_rows_f32", "layer_norm_rows",
           "UNARY", "warm_up"]


_OPTS = dict(nogil=True, cache=True, boundscheck=False, fastmath={"contract"})

# Depthwise convolution. Per channel, the zero-padded input is split into its stride phases
# (phase (p, q) holds padded rows sh*r + p, columns sw*m + q; stride 1: one phase, the padded
# plane), each stored flat with row length ``wq``, as numpy_fast's planar path does. Tap (ki, kj)
# then reads one contiguous run of ``Ho*wq`` values at a fixed offset, and the output (with
# ``wq - Wo`` spare columns per row, dropped at the end) is ``bias + sum_t w[t] * run_t``. The
# taps are summed three or five at a time in one vectorised loop over the whole map (one
# accumulator load and store per group, FMAs between), so the per-tap overhead of a loop over one
# output row (7x7 kernels on 56-pixel rows: 5-6x slower, measured) is gone.


@njit(inline="always", **_OPTS)
def _taps1(acc, src, off, wt, t, n):  # pragma: no cover - compiled
    """``acc[:n] += wt[t] * src[off[t]:][:n]``."""
    a0 = src[off[t]:off[t] + n]
    w0 = wt[t]
    for j in range(n):
        acc[j] = acc[j] + w0 * a0[j]


@njit(inline="always", **_OPTS)
def _taps3(acc, src, off, wt, t, n):  # pragma: no cover - compiled
    """Taps ``t, t+1, t+2`` added to ``acc[:n]`` in one loop."""
    a0 = src[off[t]:off[t] + n]
    a1 = src[off[t + 1]:off[t + 1] + n]
    a2 = src[off[t + 2]:off[t + 2] + n]
    w0, w1, w2 = wt[t], wt[t + 1], wt[t + 2]
    for j in range(n):
        acc[j] = acc[j] + w0 * a0[j] + w1 * a1[j] + w2 * a2[j]


@njit(inline="always", **_OPTS)
def _taps5(acc, src, off, wt, t, n):  # pragma: no cover - compiled
    """Taps ``t .. t+4`` added to ``acc[:n]`` in one loop."""
    a0 = src[off[t]:off[t] + n]
    a1 = src[off[t + 1]:off[t + 1] + n]
    a2 = src[off[t + 2]:off[t + 2] + n]
    a3 = src[off[t + 3]:off[t + 3] + n]
    a4 = src[off[t + 4]:off[t + 4] + n]
    w0, w1, w2, w3, w4 = wt[t], wt[t + 1], wt[t + 2], wt[t + 3], wt[t + 4]
    for j in range(n):
        acc[j] = acc[j] + w0 * a0[j] + w1 * a1[j] + w2 * a2[j] + w3 * a3[j] + w4 * a4[j]


@njit(**_OPTS)
def depthwise_channels(x, w, bias, y, c0, c1, mult, sh, sw, dh, dw, pt, pl, clamp, lo, hi):  # pragma: no cover
    """``y[c] = bias[c] + sum_taps w[c, i, j] * xpad[c // mult]`` for channels ``[c0, c1)`` of
    one image: ``x`` (C, H, W) unpadded (zero padding ``pt``/``pl`` top/left; bottom/right as
    far as the output needs), ``w`` (O, kh, kw), ``y`` (O, Ho, Wo); ``clamp`` applies
    ``min(max(v, lo), hi)`` (NaN stays NaN). See the comment above for the layout."""
    H = x.shape[1]
    W = x.shape[2]
    KH = w.shape[1]
    KW = w.shape[2]
    Ho = y.shape[1]
    Wo = y.shape[2]
    T = KH * KW
    hq = Ho + ((KH - 1) * dh) // sh + 1
    wq = Wo + ((KW - 1) * dw) // sw
    plane = hq * wq
    off = np.empty(T, dtype=np.int64)
    for ki in range(KH):
        for kj in range(KW):
            p = (ki * dh) % sh
            q = (kj * dw) % sw
            off[ki * KW + kj] = (p * sw + q) * plane + ((ki * dh) // sh) * wq + (kj * dw) // sw
    ph = np.empty(sh * sw * plane, dtype=y.dtype)
    n = Ho * wq
    acc = np.empty(n, dtype=y.dtype)
    wt = np.empty(T, dtype=y.dtype)
    for c in range(c0, c1):
        xc = x[c // mult]
        # the phases of the padded channel: columns m_lo <= m < m_hi come from the input
        for p in range(sh):
            for q in range(sw):
                base = (p * sw + q) * plane
                m_lo = max(0, -((q - pl) // sw))
                m_hi = min(wq, (W - 1 + pl - q) // sw + 1)
                for r in range(hq):
                    row = ph[base + r * wq: base + (r + 1) * wq]
                    a = sh * r + p - pt
                    if a < 0 or a >= H or m_hi <= m_lo:
                        for m in range(wq):
                            row[m] = 0
                        continue
                    xr = xc[a]
                    for m in range(m_lo):
                        row[m] = 0
                    for m in range(m_hi, wq):
                        row[m] = 0
                    if sw == 1:
                        seg = xr[m_lo + q - pl: m_hi + q - pl]
                        dst = row[m_lo:m_hi]
                        for m in range(m_hi - m_lo):
                            dst[m] = seg[m]
                    elif sw == 2:  # constant stride: LLVM's interleaved loads
                        seg = xr[2 * m_lo + q - pl:]
                        dst = row[m_lo:m_hi]
                        for m in range(m_hi - m_lo):
                            dst[m] = seg[2 * m]
                    else:
                        for m in range(m_lo, m_hi):
                            row[m] = xr[sw * m + q - pl]
        for ki in range(KH):
            for kj in range(KW):
                wt[ki * KW + kj] = w[c, ki, kj]
        b = bias[c]
        for j in range(n):
            acc[j] = b
        t = 0
        if T == 3 or T == 6 or T == 9:  # 3x3: three groups of three
            while t < T:
                _taps3(acc, ph, off, wt, t, n)
                t += 3
        else:
            while t + 5 <= T:
                _taps5(acc, ph, off, wt, t, n)
                t += 5
            while t + 3 <= T:
                _taps3(acc, ph, off, wt, t, n)
                t += 3
            while t < T:
                _taps1(acc, ph, off, wt, t, n)
                t += 1
        yc = y[c]
        for i in range(Ho):
            a = acc[i * wq: i * wq + Wo]
            yr = yc[i]
            if clamp:
                for j in range(Wo):
                    v = a[j]
                    if v < lo:
                        v = lo
                    if v > hi:
                        v = hi
                    yr[j] = v
            else:
                for j in range(Wo):
                    yr[j] = a[j]


# float32 constants of the rational erf of kuiper_xp.layers.activation (x * (0.5 + 0.5 erf(x /
# sqrt 2)), the 0.5 folded into the numerator): numba keeps float32 arithmetic when every operand
# is float32
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


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", fastmath={"reassoc", "contract"})
def softmax_rows_f32(src, dst):  # pragma: no cover - compiled
    """Softmax of each row of C-contiguous float32 ``src`` (rows, n) into ``dst``, with the
    vectorised exp above. Entries more than 87 below their row's max give exactly 0 (masked
    -inf scores); a NaN, or a row whose max is infinite, gives a NaN row, as torch's."""
    rows, n = src.shape
    sh = np.empty(n, dtype=np.float32)
    eb = np.empty(n, dtype=np.float32)
    fb = np.empty(n, dtype=np.float32)
    ib = fb.view(np.int32)
    for r in range(rows):
        s = src[r]
        m = s[0]
        for i in range(1, n):
            v = s[i]
            m = v if v > m else m
        for i in range(n):
            sh[i] = s[i] - m
        _exp_block(sh, n, False, eb, fb, ib)
        tot = np.float32(0.0)
        for i in range(n):
            e = eb[i] * fb[i]
            if sh[i] < _X_LO:  # False for NaN: it stays NaN
                e = _F(0.0)
            eb[i] = e
            tot += e
        inv = _ONE / tot
        d = dst[r]
        for i in range(n):
            d[i] = eb[i] * inv


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", fastmath={"reassoc", "contract"})
def layer_norm_rows(src, w, b, dst, eps):  # pragma: no cover - compiled
    """LayerNorm of each row of C-contiguous ``src`` (rows, d) into ``dst``: the mean, then the
    (biased) variance of the centred values, as torch computes them, then
    ``(x - mean) / sqrt(var + eps) * w + b`` (``w``/``b`` of d values: ones/zeros for none); one
    vectorised loop per step where numpy takes about a dozen ufunc calls per block."""
    rows, d = src.shape
    for r in range(rows):
        s = src[r]
        acc = s.dtype.type(0.0)
        for i in range(d):
            acc += s[i]
        mean = acc / d
        var = s.dtype.type(0.0)
        for i in range(d):
            t = s[i] - mean
            var += t * t
        rstd = s.dtype.type(1.0) / np.sqrt(var / d + eps)
        o = dst[r]
        for i in range(d):
            o[i] = (s[i] - mean) * rstd * w[i] + b[i]


#: elementwise kernels by activation name: ``kernel(src, dst)`` on flat float32 arrays
UNARY = {"gelu": gelu_f32, "silu": silu_f32, "sigmoid": sigmoid_f32}


def warm_up(dtype=np.float32) -> None:
    """Compile (or load from numba's cache) the kernels for ``dtype`` now instead of on first use."""
    dt = np.dtype(dtype)
    layer_norm_rows(np.zeros((2, 3), dt), np.ones(3, dt), np.zeros(3, dt), np.zeros((2, 3), dt), dt.type(1e-5))
    depthwise_channels(np.zeros((1, 3, 3), dt), np.zeros((1, 3, 3), dt), np.zeros(1, dt),
                       np.zeros((1, 1, 1), dt), 0, 1, 1, 1, 1, 1, 1, 0, 0, False, 0.0, 0.0)
    if dt == np.float32:
        for kernel in UNARY.values():
            kernel(np.zeros(4, dt), np.zeros(4, dt))
        softmax_rows_f32(np.zeros((2, 3), dt), np.zeros((2, 3), dt))
