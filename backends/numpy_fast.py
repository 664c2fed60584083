"""NumPy-only fast paths. Each function mirrors a generic Array API implementation elsewhere,
which stays the reference; layers reach these through ``backend.fast`` and fall back when absent.

Convolution (``conv2d_plan``) picks, once at build, one of:

* ``1x1``: a 1x1 convolution without padding is a plain matmul over ``(N, C, H*W)`` (strided 1x1
  convolutions subsample first); no patch copy.
* ``depthwise``: ``groups == C_in`` with one input channel per group accumulates the ``kh*kw``
  shifted slices times per-channel weights, in channel blocks that stay in cache; no GEMM.
* ``winograd``: F(2x2, 3x3) for 3x3 stride-1 dilation-1 ungrouped convolutions with enough
  channels, where it measured faster than the GEMM on this kind of machine (see
  ``WINOGRAD_MIN_CHANNELS``).
* ``gemm``: im2col into a per-thread workspace laid out ``(C/G*kh*kw, Ho*Wo)`` (one strided copy
  per image), then one ``(O, K) @ (K, Ho*Wo)`` matmul per image written straight into the NCHW
  output; the weights are packed ``(G, O/G, K)`` contiguous at build.

Bias is added in place on the fresh output; ``activation_inplace`` applies a fused activation.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = [
    "conv2d_plan",
    "conv_transpose2d_plan",
    "Conv2dPlan",
    "pad",
    "max_pool2d",
    "linear",
    "pack_linear",
    "activation_inplace",
]

#: Winograd F(m x m, 3x3) is used for 3x3 stride-1 ungrouped convolutions when both channel
#: counts are at least this (below it the transforms cost more than the multiplications they save)
WINOGRAD_MIN_CHANNELS = 64
#: the output tile m of F(m x m, 3x3): 2 or 4
WINOGRAD_TILE = 4
#: set to False to force the GEMM path everywhere (tests compare both)
USE_WINOGRAD = True

_tls = threading.local()


def _workspace(shape: tuple[int, ...], dtype: Any, slot: int = 0) -> np.ndarray:
    """A per-thread scratch array (reused across calls; never returned to callers)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < n:
        buf = np.empty(max(n, 1), dtype=np.uint8)
        bufs[slot] = buf
    return buf[:n].view(dtype).reshape(shape)


def _pad_zeros(x: np.ndarray, pads) -> np.ndarray:
    (t, b), (l, r) = pads
    if not (t or b or l or r):
        return x
    n, c, h, w = x.shape
    out = np.zeros((n, c, h + t + b, w + l + r), dtype=x.dtype)
    out[:, :, t:t + h, l:l + w] = x
    return out


_NP_MODES = {"zeros": "constant", "constant": "constant", "reflect": "reflect", "replicate": "edge",
             "circular": "wrap"}


def pad(x: np.ndarray, pads, mode: str = "zeros", value: float = 0.0) -> np.ndarray:
    """Mirror of ``functional.pad`` (torch's reflect/replicate/circular are numpy's
    reflect/edge/wrap)."""
    if not any(lo or hi for lo, hi in pads):
        return x
    width = [(0, 0)] * (x.ndim - len(pads)) + [tuple(p) for p in pads]
    m = _NP_MODES[mode]
    if m == "constant":
        return np.pad(x, width, mode="constant", constant_values=value)
    return np.pad(x, width, mode=m)


def activation_inplace(y: np.ndarray, spec: Any) -> np.ndarray:
    """Apply a fused activation (``"relu"`` or ``("clamp", lo, hi)``) to ``y`` in place."""
    if spec == "relu":
        np.maximum(y, 0, out=y)
    elif isinstance(spec, tuple) and spec[0] == "clamp":
        lo, hi = spec[1], spec[2]
        if lo is None:
            np.minimum(y, hi, out=y)
        elif hi is None:
            np.maximum(y, lo, out=y)
        else:
            np.clip(y, lo, hi, out=y)
    else:
        return spec(y)
    return y


# -- convolution -------------------------------------------------------------------------------
class Conv2dPlan:
    """A convolution with its weights packed for one algorithm; ``plan(x)`` runs it on an NCHW
    array (zero padding ``pads`` applied here)."""

    def __init__(self, weight, bias, stride, dilation, groups, pads, algo: str | None = None):
        w = np.asarray(weight)
        self.o, self.cg, self.kh, self.kw = w.shape
        self.stride, self.dilation, self.groups = tuple(stride), tuple(dilation), int(groups)
        self.pads = tuple(tuple(p) for p in pads)
        self.dtype = w.dtype
        self.bias = None if bias is None else np.ascontiguousarray(np.asarray(bias), dtype=w.dtype)
        self.in_channels = self.cg * self.groups
        og = self.o // self.groups
        if algo is None:
            algo = self._choose()
        self.algo = algo
        if algo == "1x1":
            self.wmat = np.ascontiguousarray(w.reshape(self.o, self.cg))
        elif algo == "depthwise":
            mult = og  # output channels per input channel
            self.mult = mult
            # (kh*kw, O, 1, 1): per-tap per-channel multipliers
            self.wtaps = np.ascontiguousarray(w.reshape(self.o, self.kh * self.kw).T).reshape(
                self.kh * self.kw, self.o, 1, 1)
        elif algo == "winograd":
            self.wino = _Winograd(w, WINOGRAD_TILE)
        else:
            self.wmat = np.ascontiguousarray(w.reshape(self.groups, og, self.cg * self.kh * self.kw))

    def _choose(self) -> str:
        one = (self.kh, self.kw) == (1, 1) and self.dilation == (1, 1)
        if one and self.groups == 1 and not any(a or b for a, b in self.pads):
            return "1x1"
        if self.cg == 1 and self.groups > 1:
            return "depthwise"
        if (USE_WINOGRAD and self.groups == 1 and (self.kh, self.kw) == (3, 3)
                and self.stride == (1, 1) and self.dilation == (1, 1)
                and min(self.o, self.cg) >= WINOGRAD_MIN_CHANNELS and self.dtype == np.float32):
            return "winograd"
        return "gemm"

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        (t, b), (l, r) = self.pads
        ho = (h + t + b - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1
        wo = (w + l + r - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1
        return ho, wo

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        n, c, h, w = x.shape
        ho, wo = self.out_size(h, w)
        if ho <= 0 or wo <= 0:
            from kuiper_xp.errors import ShapeError

            raise ShapeError(f"convolution output would be empty for input {x.shape}, kernel "
                             f"{(self.kh, self.kw)}, pads {self.pads}, stride {self.stride}")
        y = getattr(self, "_run_" + self.algo)(x, ho, wo)
        if self.bias is not None:
            y += self.bias.reshape(1, self.o, 1, 1)
        return y

    # -- algorithms --------------------------------------------------------------------------
    def _run_1x1(self, x, ho, wo):
        n, c = x.shape[:2]
        sh, sw = self.stride
        if (sh, sw) != (1, 1):
            x = x[:, :, ::sh, ::sw][:, :, :ho, :wo]
        x = np.ascontiguousarray(x)
        y = np.empty((n, self.o, ho, wo), dtype=self.dtype)
        np.matmul(self.wmat, x.reshape(n, c, ho * wo), out=y.reshape(n, self.o, ho * wo))
        return y

    def _run_gemm(self, x, ho, wo):
        n, c = x.shape[:2]
        xp = _pad_zeros(x, self.pads)
        g, cg, kh, kw = self.groups, self.cg, self.kh, self.kw
        og = self.o // g
        k = cg * kh * kw
        (sh, sw), (dh, dw) = self.stride, self.dilation
        y = np.empty((n, self.o, ho, wo), dtype=self.dtype)
        cols = _workspace((c, kh, kw, ho, wo), self.dtype)
        s0, s1, s2, s3 = xp.strides
        for i in range(n):
            view = as_strided(xp[i], shape=(c, kh, kw, ho, wo),
                              strides=(s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw), writeable=False)
            np.copyto(cols, view)
            if g == 1:
                np.matmul(self.wmat[0], cols.reshape(k, ho * wo), out=y[i].reshape(self.o, ho * wo))
            else:
                np.matmul(self.wmat, cols.reshape(g, k, ho * wo), out=y[i].reshape(g, og, ho * wo))
        return y

    def _run_depthwise(self, x, ho, wo):
        n, c = x.shape[:2]
        if self.mult != 1:
            x = np.repeat(x, self.mult, axis=1)
        xp = _pad_zeros(x, self.pads)
        (sh, sw), (dh, dw) = self.stride, self.dilation
        o = self.o
        y = np.empty((n, o, ho, wo), dtype=self.dtype)
        # channel blocks of ~256 KiB of output so the accumulator and the temporary stay in cache
        block = max(1, (64 * 1024) // max(1, ho * wo))
        tmp_full = _workspace((n, min(block, o), ho, wo), self.dtype)
        taps = [(i, j) for i in range(self.kh) for j in range(self.kw)]
        for c0 in range(0, o, block):
            c1 = min(o, c0 + block)
            acc = y[:, c0:c1]
            tmp = tmp_full[:, : c1 - c0]
            for t, (i, j) in enumerate(taps):
                v = xp[:, c0:c1, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
                wt = self.wtaps[t, c0:c1]
                if t == 0:
                    np.multiply(v, wt, out=acc)
                else:
                    np.multiply(v, wt, out=tmp)
                    acc += tmp
        return y

    def _run_winograd(self, x, ho, wo):
        return self.wino(x, self.pads, ho, wo)


def conv2d_plan(weight, bias=None, *, stride=(1, 1), dilation=(1, 1), groups=1,
                pads=((0, 0), (0, 0)), algo: str | None = None) -> Conv2dPlan | None:
    """A :class:`Conv2dPlan` for float weights, or None (the caller then uses the generic path)."""
    w = np.asarray(weight)
    if w.ndim != 4 or w.dtype.kind != "f":
        return None
    return Conv2dPlan(w, bias, stride, dilation, groups, pads, algo)


# -- Winograd F(m x m, 3x3) -----------------------------------------------------------------------
def _winograd_matrices(m: int):
    """B^T, G, A^T of Lavin & Gray for F(2,3) (points 0, 1, -1) and F(4,3) (0, 1, -1, 2, -2)."""
    if m == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        g = [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    else:
        bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
              [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
        g = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
             [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
    return (np.array(bt, dtype=np.float64), np.array(g, dtype=np.float64), np.array(at, dtype=np.float64))


class _Winograd:
    """F(m x m, 3x3) for 3x3 stride-1 convolutions, every step a BLAS call or one strided copy:

    1. copy the overlapping (m+2)^2 input tiles of each channel into ``d`` laid out
       ``((m+2)^2, C*T)`` (T tiles per image; one ``np.copyto`` from an ``as_strided`` view);
    2. ``V = (B^T kron B^T) @ d``; 3. ``M[k] = U[k] @ V[k]`` for the (m+2)^2 transformed kernels
       ``U = G g G^T`` (packed ``((m+2)^2, O, C)`` at build);
    4. ``Y = (A^T kron A^T) @ M`` and one strided copy of the ``m x m`` output tiles into NCHW.

    It replaces the 9 multiplications per output of the direct method by (m+2)^2/m^2 (4 for
    F(2,3), 2.25 for F(4,3)), at the price of the transforms and a slightly larger rounding error
    (measured against torch: about 1e-6 of max|y| for F(2,3), 1e-5 for F(4,3) in float32).
    """

    def __init__(self, w: np.ndarray, m: int):
        bt, g, at = _winograd_matrices(m)
        self.m, self.a = m, m + 2
        o, c = w.shape[:2]
        u = np.einsum("ai,ocij,bj->aboc", g, w.astype(np.float64), g)
        self.u = np.ascontiguousarray(u.reshape(self.a * self.a, o, c).astype(w.dtype))
        self.bk = np.kron(bt, bt).astype(w.dtype)
        self.ak = np.kron(at, at).astype(w.dtype)
        self.o, self.c = o, c

    def __call__(self, x: np.ndarray, pads, ho: int, wo: int) -> np.ndarray:
        m, a, o = self.m, self.a, self.o
        n, c, h, w = x.shape
        th, tw = -(-ho // m), -(-wo // m)
        nt = th * tw
        (t, _), (l, _) = pads
        hp, wp = m * th + 2, m * tw + 2
        hh, ww = min(h, hp - t), min(w, wp - l)
        xp = _workspace((c, hp, wp), x.dtype, slot=4)
        y = np.empty((n, o, ho, wo), dtype=x.dtype)
        exact = ho == m * th and wo == m * tw
        full = y if exact else _workspace((n, o, m * th, m * tw), x.dtype, slot=5)
        d = _workspace((a * a, c * nt), x.dtype, slot=1)
        v = _workspace((a * a, c * nt), x.dtype, slot=2)
        mm = _workspace((a * a, o, nt), x.dtype, slot=3)
        yy = _workspace((m * m, o * nt), x.dtype, slot=6)
        for i in range(n):
            # zero only the border the copy does not overwrite
            xp[:, :t] = 0
            xp[:, t + hh:] = 0
            xp[:, t:t + hh, :l] = 0
            xp[:, t:t + hh, l + ww:] = 0
            xp[:, t:t + hh, l:l + ww] = x[i, :, :hh, :ww]
            s = xp.strides
            tiles = as_strided(xp, shape=(a, a, c, th, tw), strides=(s[1], s[2], s[0], m * s[1], m * s[2]),
                               writeable=False)
            np.copyto(d.reshape(a, a, c, th, tw), tiles)
            np.matmul(self.bk, d, out=v)
            np.matmul(self.u, v.reshape(a * a, c, nt), out=mm)
            np.matmul(self.ak, mm.reshape(a * a, o * nt), out=yy)
            fi = full[i]
            st = fi.strides
            dst = as_strided(fi, shape=(m, m, o, th, tw), strides=(st[1], st[2], st[0], m * st[1], m * st[2]))
            np.copyto(dst, yy.reshape(m, m, o, th, tw))
        if not exact:
            y[...] = full[:, :, :ho, :wo]
        return y


# -- transposed convolution ------------------------------------------------------------------------
class ConvTranspose2dPlan:
    """col2im: one GEMM per image maps each input pixel to its ``O/G*kh*kw`` contributions, which
    are added tap by tap into strided slices of the uncropped output."""

    def __init__(self, weight, bias, stride, padding, output_padding, dilation, groups):
        w = np.asarray(weight)
        self.c, self.og, self.kh, self.kw = w.shape
        self.groups = int(groups)
        self.cg = self.c // self.groups
        self.o = self.og * self.groups
        self.stride, self.padding = tuple(stride), tuple(padding)
        self.output_padding, self.dilation = tuple(output_padding), tuple(dilation)
        self.dtype = w.dtype
        # (G, og*kh*kw, cg)
        self.wmat = np.ascontiguousarray(
            w.reshape(self.groups, self.cg, self.og * self.kh * self.kw).transpose(0, 2, 1))
        self.bias = None if bias is None else np.asarray(bias, dtype=w.dtype)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        n, c, h, w = x.shape
        (sh, sw), (dh, dw), (ph, pw) = self.stride, self.dilation, self.padding
        hf = (h - 1) * sh + dh * (self.kh - 1) + 1 + self.output_padding[0]
        wf = (w - 1) * sw + dw * (self.kw - 1) + 1 + self.output_padding[1]
        ho, wo = hf - 2 * ph, wf - 2 * pw
        if ho <= 0 or wo <= 0:
            from kuiper_xp.errors import ShapeError

            raise ShapeError(f"transposed convolution output would be empty for input {x.shape}")
        full = np.zeros((n, self.o, hf, wf), dtype=self.dtype)
        g = self.groups
        for i in range(n):
            xi = np.ascontiguousarray(x[i]).reshape(g, self.cg, h * w)
            cols = _workspace((g, self.og * self.kh * self.kw, h * w), self.dtype)
            np.matmul(self.wmat, xi, out=cols)
            cols6 = cols.reshape(self.o, self.kh, self.kw, h, w)
            fi = full[i]
            for a in range(self.kh):
                for b in range(self.kw):
                    fi[:, a * dh: a * dh + sh * (h - 1) + 1: sh, b * dw: b * dw + sw * (w - 1) + 1: sw] += cols6[:, a, b]
        y = full[:, :, ph: ph + ho, pw: pw + wo]
        if ph or pw:
            y = np.ascontiguousarray(y)
        if self.bias is not None:
            y += self.bias.reshape(1, self.o, 1, 1)
        return y


def conv_transpose2d_plan(weight, bias=None, *, stride=(1, 1), padding=(0, 0), output_padding=(0, 0),
                          dilation=(1, 1), groups=1) -> ConvTranspose2dPlan | None:
    w = np.asarray(weight)
    if w.ndim != 4 or w.dtype.kind != "f":
        return None
    return ConvTranspose2dPlan(w, bias, stride, padding, output_padding, dilation, groups)


# -- pooling -------------------------------------------------------------------------------------
def _pool_out(size, k, s, p, d, ceil_mode):
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool2d(x: np.ndarray, kernel, stride, padding, dilation, ceil_mode) -> np.ndarray:
    """Running ``np.maximum`` over the ``kh*kw`` strided window views, in place."""
    x = np.asarray(x)
    n, c, h, w = x.shape
    ho = _pool_out(h, kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
    wo = _pool_out(w, kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
    if ho <= 0 or wo <= 0:
        from kuiper_xp.errors import ShapeError

        raise ShapeError(f"pooling output would be empty for input {x.shape}, kernel {tuple(kernel)}")
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = kernel, stride, dilation, padding
    bh = max(ph, (ho - 1) * sh + dh * (kh - 1) + 1 - h - ph)
    bw = max(pw, (wo - 1) * sw + dw * (kw - 1) + 1 - w - pw)
    if ph or pw or bh or bw:
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        xp = np.full((n, c, h + ph + bh, w + pw + bw), low, dtype=x.dtype)
        xp[:, :, ph:ph + h, pw:pw + w] = x
    else:
        xp = x
    y = None
    for i in range(kh):
        for j in range(kw):
            v = xp[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
            if y is None:
                y = np.array(v, copy=True)
            else:
                np.maximum(y, v, out=y)
    return y


# -- linear ----------------------------------------------------------------------------------------
def pack_linear(weight) -> np.ndarray:
    """``W^T`` as an (in, out) view of the (out, in) weight (BLAS reads it transposed)."""
    return np.asarray(weight).T


def linear(x: np.ndarray, weight_t: np.ndarray, bias=None) -> np.ndarray:
    x = np.asarray(x)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    y = np.matmul(x2, weight_t)
    if bias is not None:
        y += bias
    return y.reshape(lead + (weight_t.shape[1],))


# --- expression ---------------------------------------------------------------------------------
# Fast paths of kuiper_xp.expression.functions (the generic Array-API code there is the reference
# and is tested against these).


def expr_erf(x):
    """torch.erf for a float numpy array: Cody's rational approximation (the same coefficients as
    ``erf_generic``) with in-place Horner steps; the |x| <= 0.46875 and (float64) |x| > 4 ranges
    are computed only where they apply."""
    from kuiper_xp.expression.functions import CODY_A, CODY_B, CODY_C, CODY_D, THRESH, _erfc_large

    x = np.asarray(x)
    if x.ndim == 0:
        return expr_erf(x.reshape(1)).reshape(())
    if x.dtype == np.float16:
        return expr_erf(x.astype(np.float32)).astype(np.float16)
    if x.dtype.kind != "f":
        x = x.astype(np.float32)
    dt = x.dtype.type
    with np.errstate(all="ignore"):
        y = np.abs(x)
        ym = np.clip(y, THRESH, 4.0)
        num = ym * dt(CODY_C[8])
        den = ym.copy()
        for i in range(7):
            num += dt(CODY_C[i])
            num *= ym
            den += dt(CODY_D[i])
            den *= ym
        num += dt(CODY_C[7])
        den += dt(CODY_D[7])
        num /= den
        # exp(-y*y) as exp(-ysq*ysq) * exp(-(y-ysq)(y+ysq)), ysq = trunc(16 y)/16 (Cody)
        ysq = ym * dt(16)
        np.trunc(ysq, out=ysq)
        ysq *= dt(1 / 16)
        t = ym - ysq
        ym += ysq
        t *= ym
        ysq *= ysq
        ysq += t
        np.negative(ysq, out=ysq)
        np.exp(ysq, out=ysq)
        num *= ysq  # erfc(|x|) for 0.46875 < |x| <= 4
        big = y > 4.0
        if big.any():
            if x.dtype == np.float64:
                num[big] = _erfc_large(np.minimum(y[big], 30.0), np)
            else:
                num[big] = 0  # erfc(4) = 1.5e-8 is below float32's resolution at 1
        np.subtract(dt(0.5), num, out=num)
        num += dt(0.5)
        np.copysign(num, x, out=num)
        small = y <= THRESH
        if small.any():
            xs = x[small]
            z = xs * xs
            n2 = CODY_A[4] * z
            d2 = z
            for i in range(3):
                n2 = (n2 + dt(CODY_A[i])) * z
                d2 = (d2 + dt(CODY_B[i])) * z
            num[small] = xs * (n2 + dt(CODY_A[3])) / (d2 + dt(CODY_B[3]))
        nan = np.isnan(x)
        if nan.any():
            num[nan] = np.nan
    return num


def expr_fmod(a, b):
    """torch.fmod on numpy arrays (or an array and a Python scalar) of one dtype."""
    return np.fmod(a, b)


def expr_sign(x):
    """torch.sign of a float numpy array: like np.sign, but NaN gives 0."""
    r = np.sign(x)
    np.copyto(r, 0, where=np.isnan(x))
    return r
