"""CuPy-only fast paths: fused elementwise kernels for activations and expressions.

The generic Array API code stays the reference (and the fallback for anything these functions
decline by returning None). What is here:

* ``unary(name, x)`` / ``activation_inplace(y, spec)``: the activations of
  :data:`UNARY_ACTIVATIONS` (and the plain fused specs ``"relu"``, ``("clamp", lo, hi)``,
  ``("leaky", slope)``, ``("elu", alpha, scale, divisor)``) as one CUDA kernel each, in place
  on a producer's fresh output (a convolution's or linear's fused activation) or into a fresh
  array. The generic code makes 3-8 kernels and temporaries for SiLU, GELU, hardswish.
* ``clamp(x, lo, hi)``: ReLU/ReLU6/clamp as one kernel that keeps NaN, -0.0 and subnormals as
  torch does (``cupy.maximum`` flushed 1e-45 to 0 on an H100).
* ``conv2d_plan`` / ``concat`` / ``matmul`` / ``linear``: convolutions as an im2col kernel + one
  cuBLAS GEMM (depthwise: a direct kernel, R outputs of a row per thread at stride 1),
  concatenation as slice copies, matrix products through cuBLAS called directly (a linear
  layer's bias and activation then one kernel); none copies host data to the device or goes
  through cupy's cuBLAS binding, so that a forward pass can be captured as a CUDA graph
  (``cupy_backend``).
* ``layer_norm(x, d, weight, bias, eps)`` / ``softmax_last(x)``: LayerNorm over the trailing
  ``d`` elements and softmax over the last axis as one kernel each (a warp per row: the generic
  code makes 9 and 5 kernels with their temporaries; BERT-base has 25 LayerNorms, ConvNeXt-T 19).
* ``range_check(index, lo, hi, k, code)``: a deferred index range check (kuiper_xp.layers.checks)
  as one kernel that clips the index and sets the pass's status flag.
* ``fuse_expression(tree)``: a whole ``pnnx.Expression`` tree of arithmetic and float functions
  (``add(@0,mul(@1,sigmoid...))``...) compiled at build into one ``cupy.ElementwiseKernel``
  (broadcasting as the Array API does); it runs when every input is a cupy array of one float
  dtype, else the expression evaluator runs as usual.

Kernels are compiled by CuPy on first use and cached on disk by CuPy; the C source of each is
made from fixed templates and the expression tree's own tokens (input indices, finite float
literals, names from a fixed table): nothing from a model file reaches the compiler as text.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

import cupy
import numpy as np

from .base import concat_shape

__all__ = ["UNARY_ACTIVATIONS", "unary", "activation_inplace", "clamp", "fuse_expression",
           "FUSED_FUNCTIONS", "Conv2dPlan", "conv2d_plan", "concat", "matmul", "linear", "range_check",
           "layer_norm", "softmax_last"]

_FLOATS = (cupy.dtype("float32"), cupy.dtype("float64"))

#: name -> C body with ``x`` the input and ``y`` the output (T = float or double); the formulas
#: are the numpy fast path's (so NaN/inf come out as torch's): sigmoid 1/(1+e^-x), SiLU
#: x/(1+e^-x), GELU with CUDA's erf, Mish as x n(n+2)/(n(n+2)+2) with n = e^min(x,20)
_UNARY_BODIES = {
    "sigmoid": "y = T(1) / (T(1) + exp(-x));",
    "silu": "y = x / (T(1) + exp(-x));",
    "tanh": "y = tanh(x);",
    "hardswish": "T t = x + T(3); t = t < T(0) ? T(0) : (t > T(6) ? T(6) : t); y = x * t / T(6);",
    "hardsigmoid": "T t = x + T(3); t = t < T(0) ? T(0) : (t > T(6) ? T(6) : t); y = t / T(6);",
    "gelu": "y = x * (T(0.5) + T(0.5) * erf(x * T(0.70710678118654752440)));",
    "gelu_tanh": "y = T(0.5) * x * (T(1) + tanh(T(0.79788456080286535588) * "
                 "(x + T(0.044715) * x * x * x)));",
    "mish": "T n = exp(x < T(20) ? x : T(20)); T p = n * (n + T(2)); y = x * (p / (p + T(2)));",
}
#: the activations :func:`unary` and :func:`activation_inplace` compute (float32/float64 arrays)
UNARY_ACTIVATIONS = frozenset(_UNARY_BODIES)

# "relu", ("clamp", lo, hi), ("leaky", slope), ("elu", alpha, scale, div): as the layers and torch
# (x > 0 ? x : x * s keeps NaN; clamp by comparisons keeps NaN, -0.0 and subnormals)
# a NaN bound gives NaN everywhere, as torch.clamp
_CLAMP = ("T v = x; if (v < lo) v = lo; if (v > hi) v = hi; if (lo != lo) v = lo; if (hi != hi) v = hi; "
          "y = v;", "T lo, T hi")
_RELU = ("y = (x != x) ? x : (signbit(x) ? T(0) : x);", "")  # by the sign bit: kernels flush
# subnormals to zero in comparisons (-1e-45 < 0 was false on an H100), the stored x is not flushed
_LEAKY = ("y = x > T(0) ? x : x * s;", "T s")
_ELU = ("y = x > T(0) ? scale * x : scale * alpha * expm1(x / div);", "T alpha, T scale, T div")

_kernels: dict[tuple[str, str], Any] = {}
#: a linear layer's bias and activation as one kernel (:func:`_bias_activation`); False: two
FUSED_BIAS = True


def _kernel(name: str, body: str, params: str = "") -> Any:
    key = (name, params)
    k = _kernels.get(key)
    if k is None:
        ins = "T x" + (", " + params if params else "")
        k = _kernels[key] = cupy.ElementwiseKernel(ins, "T y", body, f"kuiper_xp_{name}")
    return k


def _is_float(x: Any) -> bool:
    return isinstance(x, cupy.ndarray) and x.dtype in _FLOATS


def unary(name: str, x: Any) -> Any:
    """One of :data:`UNARY_ACTIVATIONS` of a float32/float64 cupy array as a fresh array (one
    kernel); other dtypes compute in float32 and convert back, as the numpy path."""
    if not _is_float(x):
        return unary(name, x.astype(cupy.float32)).astype(x.dtype)
    return _kernel(name, _UNARY_BODIES[name])(x)


def clamp(x: Any, lo: float | None, hi: float | None) -> Any:
    """``min(max(x, lo), hi)`` (either bound None) of a float cupy array as a fresh array; None
    for other dtypes (the layer's generic code runs)."""
    if not _is_float(x) or x.ndim == 0:
        return None
    kernel, args = _plain_kernel("relu" if lo == 0 and hi is None else ("clamp", lo, hi))
    return kernel(x, *args)


def _activation_source(spec: Any) -> tuple[str, str, str, tuple]:
    """(name, C body, scalar parameters, their values) of an activation spec: a name of
    :data:`UNARY_ACTIVATIONS` or a plain spec (``"relu"``, ``("clamp", lo, hi)`` with either
    bound None, ``("leaky", s)``, ``("elu", a, scale, div)``)."""
    if isinstance(spec, str) and spec in _UNARY_BODIES:
        return spec, _UNARY_BODIES[spec], "", ()
    if spec == "relu":
        return "relu", *_RELU, ()
    kind = spec[0]
    if kind == "clamp":
        lo, hi = spec[1], spec[2]
        return "clamp", *_CLAMP, (-math.inf if lo is None else lo, math.inf if hi is None else hi)
    if kind == "leaky":
        return "leaky", *_LEAKY, (spec[1],)
    if kind == "elu":
        return "elu", *_ELU, tuple(spec[1:4])
    raise ValueError(f"unknown fused activation {spec!r}")


def _plain_kernel(spec: Any) -> tuple[Any, tuple]:
    """The kernel and its scalar arguments for a plain activation spec (see
    :func:`_activation_source`)."""
    name, body, params, args = _activation_source(spec)
    return _kernel(name, body, params), args


_bias_kernels: dict[tuple[str, str], Any] = {}


def _bias_activation(y: Any, bias: Any, spec: Any) -> Any:
    """``y += bias`` over the last axis, then the activation ``spec`` (None for none), in place
    as one kernel: one pass over a linear layer's product instead of two. ``y`` is a fresh
    C-contiguous float array under 2**31 elements, ``bias`` a 1-D array of its last dimension
    and dtype. The sum is rounded before the activation reads it, as in two kernels."""
    name, body, params, args = ("bias", "y = x;", "", ()) if spec is None else _activation_source(spec)
    key = (name, params)
    k = _bias_kernels.get(key)
    if k is None:
        ins = "raw T bias_, int32 nbias_" + (", " + params if params else "")
        k = _bias_kernels[key] = cupy.ElementwiseKernel(
            ins, "T y", "const T x = y + bias_[((int)i) % nbias_]; " + body, f"kuiper_xp_bias_{name}")
    k(bias, int(bias.shape[0]), *args, y)
    return y


def _into(kernel: Any, y: Any, *args: Any) -> Any:
    """Run ``kernel`` with ``y`` as both input and output (elementwise: each element reads its
    own value before writing it)."""
    kernel(y, *args, y)
    return y


def activation_inplace(y: Any, spec: Any) -> Any:
    """Apply a fused activation to the fresh array ``y``, in place (one kernel) for float
    arrays; integer outputs and callables take the generic route."""
    if callable(spec):
        return spec(y)
    if not _is_float(y):
        if isinstance(spec, str) and spec in _UNARY_BODIES:
            return unary(spec, y)
        from array_api_compat import cupy as xp

        from kuiper_xp.layers.base import apply_plain_spec

        return apply_plain_spec(xp, y, spec)
    kernel, args = _plain_kernel(spec)
    return _into(kernel, y, *args)


# -- expressions ---------------------------------------------------------------------------------
_NAN_MAX = "(a != a || b != b) ? (a + b) : (a > b ? a : b)"
_NAN_MIN = "(a != a || b != b) ? (a + b) : (a < b ? a : b)"
#: language function -> C template over the argument expressions (T = the inputs' float type).
#: Only functions whose C/CUDA form has the generic path's semantics on float operands:
#: true division, IEEE pow/atan2, NaN-propagating max/min, round half to even (rint).
FUSED_FUNCTIONS: dict[str, str] = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "pow": "pow({0}, {1})", "atan2": "atan2({0}, {1})",
    "max": "_kx_max({0}, {1})", "min": "_kx_min({0}, {1})",
    "neg": "(-{0})", "abs": "fabs({0})", "square": "_kx_sq({0})", "reciprocal": "(T(1) / {0})",
    "exp": "exp({0})", "expm1": "expm1({0})", "log": "log({0})", "log1p": "log1p({0})",
    "log10": "log10({0})", "sqrt": "sqrt({0})", "rsqrt": "rsqrt({0})", "erf": "erf({0})",
    "sin": "sin({0})", "cos": "cos({0})", "tan": "tan({0})", "asin": "asin({0})",
    "acos": "acos({0})", "atan": "atan({0})", "sinh": "sinh({0})", "cosh": "cosh({0})",
    "tanh": "tanh({0})", "asinh": "asinh({0})", "acosh": "acosh({0})", "atanh": "atanh({0})",
    "floor": "floor({0})", "ceil": "ceil({0})", "round": "rint({0})", "trunc": "trunc({0})",
}
_PREAMBLE = (
    "template <typename T> __device__ T _kx_max(T a, T b) { return " + _NAN_MAX + "; }\n"
    "template <typename T> __device__ T _kx_min(T a, T b) { return " + _NAN_MIN + "; }\n"
    "template <typename T> __device__ T _kx_sq(T a) { return a * a; }\n")
#: trees larger than this stay on the evaluator (a kernel per distinct tree is compiled)
MAX_FUSED_NODES = 256


def _c_source(node: Any, used: set[int], count: list[int]) -> str | None:
    count[0] += 1
    if count[0] > MAX_FUSED_NODES:
        return None
    if node.kind == "input":
        used.add(int(node.value))
        return f"in{int(node.value)}"
    if node.kind == "const":
        v = node.value
        if type(v) not in (int, float) or not math.isfinite(v) or abs(v) > 1e300:
            return None
        return f"T({float(v)!r})"
    if node.kind != "call":
        return None
    name, args = node.value, node.args
    if name in ("add", "sub") and len(args) == 3:  # add(a, b, alpha) = a + alpha * b
        a, b, alpha = (_c_source(n, used, count) for n in args)
        if a is None or b is None or alpha is None:
            return None
        return f"({a} {'+' if name == 'add' else '-'} {alpha} * {b})"
    template = FUSED_FUNCTIONS.get(name)
    if template is None or len(args) != (2 if "{1}" in template else 1):
        return None
    parts = [_c_source(n, used, count) for n in args]
    if any(p is None for p in parts):
        return None
    return template.format(*parts)


class FusedExpression:
    """One ``pnnx.Expression`` as one elementwise kernel; ``__call__(inputs)`` returns the result
    or None when the inputs do not qualify (not all cupy arrays of one float dtype, or a
    constant-only tree)."""

    def __init__(self, body: str, used: list[int]):
        self.used = used
        params = ", ".join(f"T in{i}" for i in used)
        self.kernel = cupy.ElementwiseKernel(params, "T out0", f"out0 = {body};", "kuiper_xp_expr",
                                             preamble=_PREAMBLE)

    def __call__(self, inputs: Any) -> Any:
        args = []
        dt = None
        for i in self.used:
            a = inputs[i]
            if not isinstance(a, cupy.ndarray) or (dt is not None and a.dtype != dt) or a.dtype not in _FLOATS:
                return None
            dt = a.dtype
            args.append(a)
        return self.kernel(*args)


def fuse_expression(tree: Any) -> FusedExpression | None:
    """A fused kernel for the expression ``tree`` (a parsed :class:`kuiper_xp.expression.Node`),
    or None where any node is outside :data:`FUSED_FUNCTIONS`, a literal is not a finite number,
    or the tree reads no input."""
    used: set[int] = set()
    body = _c_source(tree, used, [0])
    if body is None or not used or tree.kind != "call":
        return None
    return FusedExpression(body, sorted(used))


# -- convolution ---------------------------------------------------------------------------------
# Three kernels at most per convolution, none of which copies host data to the device (so that a
# forward pass can be captured as a CUDA graph; cupy's stack/concatenate of many arrays copies a
# table of pointers from the host): an im2col kernel that reads the zero padding in place, one 2-D
# cuBLAS GEMM per group, and an epilogue kernel (NCHW order + bias); depthwise convolutions are one
# direct kernel. The fused activation then runs in place (one kernel).
# Index arithmetic is 32-bit (a plan sends larger arrays to the generic code): 64-bit integer
# division is a long subroutine on a GPU, and ten of them per element made the im2col kernel
# compute-bound (half of ResNet-18's GPU time at batch 8 on an H100).
_INT32_MAX = 2**31 - 1

# one thread per (input channel c, output position p): reads its kh*kw taps of x (the padding as
# zeros, in place) and writes them down column p of rows c*kh*kw ... of col (G, Cg*kh*kw, N*Ho*Wo)
# (neighbouring threads write neighbouring addresses)
_IM2COL = cupy.ElementwiseKernel(
    "raw T x, int32 N, int32 C, int32 H, int32 W, int32 Ho, int32 Wo, int32 kh, int32 kw, "
    "int32 sh, int32 sw, int32 dh, int32 dw, int32 ph, int32 pw",
    "raw T col",
    """
    const int P = N * Ho * Wo;
    const int t = (int)i;
    const int p = t % P, c = t / P;
    const int ox = p % Wo, q = p / Wo, oy = q % Ho, n = q / Ho;
    const T* xc = &x[((long long)n * C + c) * H * W];
    T* out = &col[(long long)c * (kh * kw) * P + p];
    const int y0 = oy * sh - ph, x0 = ox * sw - pw;
    for (int ky = 0; ky < kh; ++ky) {
        const int iy = y0 + ky * dh;
        const bool row = iy >= 0 && iy < H;
        for (int kx = 0; kx < kw; ++kx) {
            const int ix = x0 + kx * dw;
            *out = (row && ix >= 0 && ix < W) ? xc[iy * W + ix] : T(0);
            out += P;
        }
    }
    """,
    "kuiper_xp_im2col")

# y (N, O, P1) from the GEMM's (O, N*P1) + bias
_EPILOGUE = cupy.ElementwiseKernel(
    "raw T src, raw T bias, int32 O, int32 N, int32 P1",
    "T y",
    """
    const int t = (int)i;
    const int p = t % P1, q = t / P1, o = q % O, n = q / O;
    y = src[((long long)o * N + n) * P1 + p] + bias[o];
    """,
    "kuiper_xp_conv_epilogue")

_DEPTHWISE = cupy.ElementwiseKernel(
    "raw T x, raw T w, raw T bias, int32 C, int32 H, int32 W, int32 O, int32 Ho, int32 Wo, "
    "int32 kh, int32 kw, int32 sh, int32 sw, int32 dh, int32 dw, int32 ph, int32 pw, int32 mult",
    "T y",
    """
    const int t = (int)i;
    const int ox = t % Wo, q1 = t / Wo, oy = q1 % Ho, q2 = q1 / Ho, o = q2 % O, n = q2 / O;
    const int c = o / mult;
    const T* xc = &x[((long long)n * C + c) * H * W];
    const T* wo = &w[(long long)o * kh * kw];
    T acc = bias[o];
    for (int ky = 0; ky < kh; ++ky) {
        const int iy = oy * sh - ph + ky * dh;
        if (iy < 0 || iy >= H) continue;
        for (int kx = 0; kx < kw; ++kx) {
            const int ix = ox * sw - pw + kx * dw;
            if (ix >= 0 && ix < W) acc += xc[iy * W + ix] * wo[ky * kw + kx];
        }
    }
    y = acc;
    """,
    "kuiper_xp_depthwise")


#: outputs along a row that one thread of the stride-1 depthwise kernel computes (0: the kernel
#: above, one output a thread)
DEPTHWISE_ROW = 4
#: the row kernel's largest kernel size (its loops are unrolled for each size)
_DEPTHWISE_ROW_MAX_K = 11
# Stride 1, dilation 1: a thread computes R neighbouring outputs of a row. For each kernel row it
# loads the KW + R - 1 inputs they share once into registers (the kernel above loads KW per
# output), then adds the taps in the same order as the kernel above (ky, then kx; taps outside
# the input are skipped, not read as zeros, so NaN and inf land where the direct sum puts them).
_DEPTHWISE_ROW_BODY = """
    const int t = (int)i;
    const int Wq = (Wo + R - 1) / R;
    const int q = t % Wq, q1 = t / Wq, oy = q1 % Ho, q2 = q1 / Ho, o = q2 % O, n = q2 / O;
    const T* xc = &x[((long long)n * C + o / mult) * H * W];
    const T* wo = &w[(long long)o * KH * KW];
    const int ox0 = q * R, ix0 = ox0 - pw;
    const bool inner = ix0 >= 0 && ix0 + KW + R - 1 <= W;
    T acc[R];
    #pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = bias[o];
    #pragma unroll
    for (int ky = 0; ky < KH; ++ky) {
        const int iy = oy - ph + ky;
        if (iy < 0 || iy >= H) continue;
        const T* row = xc + iy * W;
        T v[KW + R - 1];
        #pragma unroll
        for (int j = 0; j < KW + R - 1; ++j) {
            const int ix = ix0 + j;
            v[j] = (inner || (ix >= 0 && ix < W)) ? row[ix] : T(0);
        }
        #pragma unroll
        for (int kx = 0; kx < KW; ++kx) {
            const T wv = wo[ky * KW + kx];
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                const int ix = ix0 + r + kx;
                if (inner || (ix >= 0 && ix < W)) acc[r] += v[r + kx] * wv;
            }
        }
    }
    T* yo = &y[((long long)q2 * Ho + oy) * Wo + ox0];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        if (ox0 + r < Wo) yo[r] = acc[r];
    }
"""
_depthwise_row_kernels: dict[tuple[int, int, int], Any] = {}


def _depthwise_row_kernel(kh: int, kw: int, r: int) -> Any:
    key = (kh, kw, r)
    k = _depthwise_row_kernels.get(key)
    if k is None:
        k = _depthwise_row_kernels[key] = cupy.ElementwiseKernel(
            "raw T x, raw T w, raw T bias, int32 C, int32 H, int32 W, int32 O, int32 Ho, int32 Wo, "
            "int32 ph, int32 pw, int32 mult", "raw T y",
            f"const int KH = {kh}, KW = {kw}, R = {r};" + _DEPTHWISE_ROW_BODY,
            f"kuiper_xp_depthwise_{kh}x{kw}_r{r}")
    return k


class Conv2dPlan:
    """A 2-D convolution with its weights packed once: ``plan(x, act=None)`` for an NCHW cupy
    array of the weights' dtype (others go to the generic code). ``algo``: ``depthwise`` (one
    input channel per group: a direct kernel), ``1x1`` (stride 1, no padding, one group: the
    input is the GEMM's right-hand side, no im2col) or ``gemm``."""

    def __init__(self, weight: Any, bias: Any, stride, dilation, groups: int, pads):
        o, cg, kh, kw = (int(v) for v in weight.shape)
        self.o, self.cg, self.kh, self.kw, self.groups = o, cg, kh, kw, int(groups)
        self.stride, self.dilation = tuple(int(v) for v in stride), tuple(int(v) for v in dilation)
        self.pads = tuple((int(a), int(b)) for a, b in pads)
        self.dtype = weight.dtype
        self.weight = cupy.ascontiguousarray(weight)
        self.wmat = self.weight.reshape(self.groups, o // self.groups, cg * kh * kw)
        self.has_bias = bias is not None
        self.bias = (cupy.ascontiguousarray(bias).astype(weight.dtype, copy=False) if bias is not None
                     else cupy.zeros((o,), dtype=weight.dtype))
        if cg == 1 and self.groups > 1:
            self.algo = "depthwise"
        elif (kh, kw) == (1, 1) and self.stride == (1, 1) and self.groups == 1 and not any(
                a or b for a, b in self.pads):
            self.algo = "1x1"
        else:
            self.algo = "gemm"

    def _generic(self, x: Any) -> Any:
        from array_api_compat import cupy as xp

        from kuiper_xp.layers.functional import conv2d

        return conv2d(x, self.weight, self.bias if self.has_bias else None, self.stride, self.pads,
                      self.dilation, self.groups, xp=xp)

    def __call__(self, x: Any, act: Any = None, channels_last: bool = False) -> Any:
        if not isinstance(x, cupy.ndarray) or x.dtype != self.dtype or x.ndim != 4:
            y = self._generic(x)
        else:
            y = self._run(cupy.ascontiguousarray(x))
        return y if act is None else activation_inplace(y, act)

    def _run(self, x: Any) -> Any:
        n, c, h, w = (int(v) for v in x.shape)
        (sh, sw), (dh, dw), ((pt, pb), (pl, pr)) = self.stride, self.dilation, self.pads
        kh, kw, o, g, cg = self.kh, self.kw, self.o, self.groups, self.cg
        ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        wo = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
        if ho <= 0 or wo <= 0 or c != cg * g:
            return self._generic(x)  # the generic code raises its clear error
        p1 = ho * wo
        if n == 0 or max(n * c * p1, n * o * p1, n * c * h * w) > _INT32_MAX:
            return self._generic(x)  # (the kernels' index arithmetic is 32-bit; no kernel of size 0)
        if self.algo == "depthwise":
            y = cupy.empty((n, o, ho, wo), dtype=x.dtype)
            r = DEPTHWISE_ROW
            if r and (sh, sw, dh, dw) == (1, 1, 1, 1) and max(kh, kw) <= _DEPTHWISE_ROW_MAX_K:
                _depthwise_row_kernel(kh, kw, r)(x, self.weight, self.bias, c, h, w, o, ho, wo, pt, pl, o // g, y,
                                                 size=n * o * ho * -(-wo // r))
                return y
            _DEPTHWISE(x, self.weight, self.bias, c, h, w, o, ho, wo, kh, kw, sh, sw, dh, dw, pt, pl,
                       o // g, y)
            return y
        og = o // g
        if self.algo == "1x1":
            y = cupy.empty((n, o, ho, wo), dtype=x.dtype)
            w2 = self.wmat[0]
            _gemm(w2, x.reshape(n, c, p1), y.reshape(n, o, p1))
            if self.has_bias:
                y += self.bias.reshape(1, o, 1, 1)
            return y
        k = cg * kh * kw
        cols = cupy.empty((g, k, n * p1), dtype=x.dtype)
        _IM2COL(x, n, c, h, w, ho, wo, kh, kw, sh, sw, dh, dw, pt, pl, cols, size=c * n * p1)
        tmp = cupy.empty((g, og, n * p1), dtype=x.dtype)
        _gemm(self.wmat, cols, tmp)
        y = cupy.empty((n, o, ho, wo), dtype=x.dtype)
        _EPILOGUE(tmp, self.bias, o, n, p1, y)
        return y


def conv2d_plan(weight, bias=None, *, stride=(1, 1), dilation=(1, 1), groups=1, pads=((0, 0), (0, 0)),
                input_hw=None, transient: bool = False, **_: Any) -> Conv2dPlan | None:
    """A :class:`Conv2dPlan` for float32/float64 cupy weights, else None (the generic code)."""
    if not isinstance(weight, cupy.ndarray) or weight.ndim != 4 or weight.dtype not in _FLOATS:
        return None
    if bias is not None and not isinstance(bias, cupy.ndarray):
        return None
    return Conv2dPlan(weight, bias, stride, dilation, groups, pads)


def concat(xs: Any, axis: int) -> Any:
    """``concatenate(xs, axis)`` as one slice copy per piece (cupy's own concatenate copies a host
    table of pointers for many pieces, which a CUDA graph capture refuses); None when the pieces
    are not cupy arrays of one dtype and rank whose other dimensions agree (the generic code then
    reports the mismatch or promotes)."""
    shape = concat_shape(xs, axis, cupy.ndarray)
    if shape is None:
        return None
    out = cupy.empty(shape, dtype=xs[0].dtype)
    off = 0
    lead = (slice(None),) * axis
    for a in xs:
        m = int(a.shape[axis])
        if m:
            out[lead + (slice(off, off + m),)] = a
        off += m
    return out


# -- row kernels: LayerNorm and softmax ------------------------------------------------------
# One warp per row of d (or n) elements, 8 rows to a block; each lane strides over the row, and
# the row's sums are shuffles within the warp. LayerNorm reads the row twice (the mean, then the
# variance of the centred values, as the generic code and torch compute it) and writes it once;
# softmax reads it twice (max, then the sum of exp(x - max)) and writes exp(x - max) / sum. Sums
# are in float for float32 (as torch's), double for float64. The max keeps NaN (a row with a NaN
# is NaN, an all -inf row NaN, as torch's). Longer rows go to the generic code: one warp would
# walk them alone.
ROW_KERNEL_MAX = 8192
_ROWS_PER_BLOCK = 8
_ROW_SOURCE = r"""
#define WARP_SUM(v) for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o)
__device__ __forceinline__ A nan_max(A a, A b) { return (b > a || b != b) ? b : a; }

extern "C" __global__ void kuiper_xp_layer_norm(const T* __restrict__ x, const T* __restrict__ w,
        const T* __restrict__ b, T* __restrict__ y, const int rows, const int d, const double eps,
        const int affine) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // (the whole warp: row is the same for its lanes)
    const T* xr = x + (long long)row * d;
    T* yr = y + (long long)row * d;
    A s = 0;
    for (int j = lane; j < d; j += 32) s += (A)xr[j];
    WARP_SUM(s);
    const A mean = s / (A)d;
    A q = 0;
    for (int j = lane; j < d; j += 32) { const A t = (A)xr[j] - mean; q += t * t; }
    WARP_SUM(q);
    const A inv = A(1) / sqrt(q / (A)d + (A)eps);
    for (int j = lane; j < d; j += 32) {
        A t = ((A)xr[j] - mean) * inv;
        if (affine & 1) t *= (A)w[j];
        if (affine & 2) t += (A)b[j];
        yr[j] = (T)t;
    }
}

extern "C" __global__ void kuiper_xp_softmax(const T* __restrict__ x, T* __restrict__ y,
        const int rows, const int n) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const T* xr = x + (long long)row * n;
    T* yr = y + (long long)row * n;
    A m = NEG_INF;
    for (int j = lane; j < n; j += 32) m = nan_max(m, (A)xr[j]);
    for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    A s = 0;
    for (int j = lane; j < n; j += 32) s += exp((A)xr[j] - m);
    WARP_SUM(s);
    for (int j = lane; j < n; j += 32) yr[j] = (T)(exp((A)xr[j] - m) / s);
}
"""
_row_modules: dict[Any, Any] = {}


def _row_header(dtype: Any) -> str:
    if dtype == np.float32:
        return "typedef float T;\ntypedef float A;\n#define NEG_INF (-__int_as_float(0x7f800000))\n"
    return "typedef double T;\ntypedef double A;\n#define NEG_INF (-__longlong_as_double(0x7ff0000000000000LL))\n"


def _row_kernel(dtype: Any, name: str) -> Any:
    mod = _row_modules.get(dtype)
    if mod is None:
        mod = _row_modules[dtype] = cupy.RawModule(code=_row_header(dtype) + _ROW_SOURCE)
    return mod.get_function(name)


def _rows(x: Any, d: int) -> Any:
    """``x`` as a C-contiguous (rows, d) cupy float array, or None where the row kernels do not
    apply (another type or dtype, rows longer than ROW_KERNEL_MAX, 2**31 elements or more)."""
    if (not isinstance(x, cupy.ndarray) or x.dtype not in _FLOATS or d <= 0 or d > ROW_KERNEL_MAX
            or x.size == 0 or x.size % d or x.size > _INT32_MAX):
        return None
    return cupy.ascontiguousarray(x).reshape(-1, d)


def _launch(kernel: Any, rows: int, args: tuple) -> None:
    blocks = -(-rows // _ROWS_PER_BLOCK)
    kernel((blocks,), (32 * _ROWS_PER_BLOCK,), args)


def layer_norm(x: Any, d: int, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the trailing ``d`` elements of a float32/float64 cupy array (weight and
    bias of ``d`` elements and x's dtype, or None) as one kernel; a non-contiguous ``x`` (a
    channels-last permute) is copied first. None where it does not apply (the generic code)."""
    src = _rows(x, d)
    if src is None:
        return None
    for a in (weight, bias):
        if a is not None and (not isinstance(a, cupy.ndarray) or a.dtype != x.dtype or a.size != d):
            return None
    w = src if weight is None else cupy.ascontiguousarray(weight)
    b = src if bias is None else cupy.ascontiguousarray(bias)
    y = cupy.empty(x.shape, dtype=x.dtype)
    rows = src.shape[0]
    affine = (weight is not None) | (bias is not None) << 1
    _launch(_row_kernel(x.dtype, "kuiper_xp_layer_norm"), rows,
            (src, w, b, y, np.int32(rows), np.int32(d), np.float64(eps), np.int32(affine)))
    return y


def softmax_last(x: Any) -> Any:
    """Softmax over the last axis of a float32/float64 cupy array of at least one dimension as one
    kernel; None where it does not apply (the generic code)."""
    if not isinstance(x, cupy.ndarray) or x.ndim == 0:
        return None
    n = int(x.shape[-1])
    src = _rows(x, n)
    if src is None:
        return None
    y = cupy.empty(x.shape, dtype=x.dtype)
    rows = src.shape[0]
    _launch(_row_kernel(x.dtype, "kuiper_xp_softmax"), rows, (src, y, np.int32(rows), np.int32(n)))
    return y


# -- range checks -----------------------------------------------------------------------------
# kuiper_xp.layers.checks defers a pass's index range checks on a GPU to one flag read when the
# pass ends. Made of cupy's comparisons, ``any`` and ``where``, each check took 5 kernels (``any``
# a reduction compiled for each class of index length). One elementwise kernel, compiled once per
# index dtype, clips the index and sets the pass's status (first calls measured alike either way
# on an H100, docs/benchmarks/h100-cupy.md).
_RANGE_CHECK = cupy.ElementwiseKernel(
    "I x, int64 lo, int64 hi, int32 k", "I y, raw int32 code",
    """
    const long long v = (long long)x;
    if (v < lo || v >= hi) {
        atomicCAS(&code[0], 0, k);
        y = (I)(v < lo ? lo : hi - 1);
    } else {
        y = x;
    }
    """,
    "kuiper_xp_range_check")


def range_check(index: Any, lo: int, hi: int, k: int, code: Any) -> Any:
    """``index`` clipped into ``[lo, hi)`` as a fresh array, setting ``code[0]`` to ``k`` where it
    is still 0 and an entry is outside (kernels run in stream order, so the first failing check of
    a pass keeps its number); None for anything but a signed or unsigned integer cupy array."""
    if not isinstance(index, cupy.ndarray) or index.dtype.kind not in "iu" or index.dtype == cupy.uint64:
        return None  # (uint64 past 2**63 would read as negative: the generic comparisons)
    y = cupy.empty_like(index)
    _RANGE_CHECK(index, lo, hi, k, y, code)
    return y


# -- matrix products -----------------------------------------------------------------------------
# cupy refuses any cuBLAS call while a stream is being captured into a CUDA graph (its binding of
# cublasSetStream raises), although cuBLAS itself supports capture. The products here call
# cuBLAS's strided-batched GEMM through ctypes on cupy's own handle, with a fixed workspace (so
# that nothing is allocated inside a capture); eager calls take the same path, so a replayed graph
# is bit-identical to the eager pass. Where the library cannot be found, cupy.matmul is used (and
# graphs with products fail their capture and stay eager).
_BLAS_LOCK = threading.Lock()
_blas_state: dict[str, Any] = {}
_WORKSPACE_BYTES = 32 << 20


def _blas() -> Any:
    lib = _blas_state.get("lib")
    if lib is not None or "error" in _blas_state:
        return lib
    with _BLAS_LOCK:
        if "lib" in _blas_state or "error" in _blas_state:
            return _blas_state.get("lib")
        try:
            handle = cupy.cuda.device.get_cublas_handle()  # loads libcublas into the process
            path = None
            with open("/proc/self/maps") as f:
                for line in f:
                    name = line.rsplit("/", 1)[-1]
                    if name.startswith("libcublas.so"):
                        path = line.split(None, 5)[-1].strip()
                        break
            if path is None:
                raise OSError("libcublas is not mapped in this process")
            lib = ctypes.CDLL(path)
            vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
            for fn in ("cublasSgemmStridedBatched", "cublasDgemmStridedBatched"):
                f = getattr(lib, fn)
                f.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i64, vp, i32, i64, vp, vp, i32, i64, i32]
                f.restype = i32
            lib.cublasSetStream_v2.argtypes = [vp, vp]
            lib.cublasSetStream_v2.restype = i32
            ws = cupy.empty(_WORKSPACE_BYTES, dtype=cupy.uint8)
            if hasattr(lib, "cublasSetWorkspace_v2"):
                lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
                lib.cublasSetWorkspace_v2.restype = i32
                if lib.cublasSetWorkspace_v2(handle, ws.data.ptr, _WORKSPACE_BYTES) != 0:
                    raise OSError("cublasSetWorkspace failed")
            _blas_state.update(lib=lib, workspace=ws, handle_dev=cupy.cuda.Device().id)
        except Exception as exc:  # noqa: BLE001 - no usable cuBLAS: cupy.matmul
            _blas_state["error"] = f"{type(exc).__name__}: {exc}"
            return None
    return _blas_state["lib"]


def _layout(x: Any, rows: int, cols: int) -> tuple[int, int] | None:
    """(op, ld) of a matrix view ``x`` (last two axes ``rows x cols``) for column-major cuBLAS:
    row-major storage is the transpose as-is (op N), column-major needs op T; None otherwise."""
    isz = x.itemsize
    s_r, s_c = x.strides[-2], x.strides[-1]
    if (s_c == isz or cols == 1) and (rows == 1 or (s_r % isz == 0 and s_r // isz >= cols)):
        return 0, max(cols, s_r // isz if rows > 1 else cols, 1)
    if (s_r == isz or rows == 1) and (cols == 1 or (s_c % isz == 0 and s_c // isz >= rows)):
        return 1, max(rows, s_c // isz if cols > 1 else rows, 1)
    return None


def _batch_stride(x: Any, nb: int) -> int | None:
    """The element stride between consecutive matrices of ``x`` over its flattened batch axes
    (0 for a broadcast operand), or None when the batch axes do not flatten to one stride."""
    if nb == 0:
        return 0
    shape, strides = x.shape[:nb], x.strides[:nb]
    isz = x.itemsize
    dims = [(n, st) for n, st in zip(shape, strides) if n != 1]
    if not dims:
        return 0
    if all(st == 0 for _, st in dims):
        return 0
    step = dims[-1][1]
    expect = step
    for n, st in reversed(dims):
        if st != expect or st % isz:
            return None
        expect = st * n
    return step // isz


def _gemm(a: Any, b: Any, out: Any) -> None:
    """``out[...] = a @ b`` for float32/float64 cupy arrays, ``out`` C-contiguous of the broadcast
    batch shape; one strided-batched cuBLAS call (a loop over the batch where strides do not
    allow it)."""
    lib = _blas()
    if lib is None or a.dtype != b.dtype or a.dtype != out.dtype or a.dtype not in _FLOATS:
        cupy.matmul(a, b, out=out)
        return
    m, k = int(a.shape[-2]), int(a.shape[-1])
    n = int(b.shape[-1])
    batch = tuple(out.shape[:-2])
    if m == 0 or n == 0:
        return
    if k == 0:
        out.fill(0)
        return
    a = cupy.broadcast_to(a, batch + (m, k))
    b = cupy.broadcast_to(b, batch + (k, n))
    la, lb = _layout(a, m, k), _layout(b, k, n)
    sa, sb = _batch_stride(a, len(batch)), _batch_stride(b, len(batch))
    if la is None or sa is None:  # (permuted heads of an attention, say): one copy, one call
        a = cupy.ascontiguousarray(a)
        la, sa = _layout(a, m, k), _batch_stride(a, len(batch))
    if lb is None or sb is None:
        b = cupy.ascontiguousarray(b)
        lb, sb = _layout(b, k, n), _batch_stride(b, len(batch))
    count = int(np.prod(batch)) if batch else 1
    f32 = a.dtype == cupy.float32
    one, zero = (ctypes.c_float(1.0), ctypes.c_float(0.0)) if f32 else (ctypes.c_double(1.0), ctypes.c_double(0.0))
    fn = lib.cublasSgemmStridedBatched if f32 else lib.cublasDgemmStridedBatched
    handle = cupy.cuda.device.get_cublas_handle()
    if lib.cublasSetStream_v2(handle, cupy.cuda.get_current_stream().ptr) != 0:
        raise RuntimeError("cublasSetStream failed")
    # column-major: out^T (n x m) = b^T (n x k) @ a^T (k x m)
    st = fn(handle, lb[0], la[0], n, m, k, ctypes.addressof(one), b.data.ptr, lb[1], sb,
            a.data.ptr, la[1], sa, ctypes.addressof(zero), out.data.ptr, n, m * n, count)
    if st != 0:
        raise RuntimeError(f"cuBLAS gemm failed with status {st}")


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` (the layers' matrix product on this backend) through :func:`_gemm` for cupy
    float arrays of at least 2 dimensions and one dtype; ``cupy.matmul`` otherwise. An (..., k)
    @ (k, n) product with a contiguous left operand is one GEMM over all rows."""
    if (not isinstance(a, cupy.ndarray) or not isinstance(b, cupy.ndarray) or a.ndim < 2 or b.ndim < 2
            or a.dtype != b.dtype or a.dtype not in _FLOATS or a.shape[-1] != b.shape[-2]):
        return cupy.matmul(a, b)
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
        rows = a.reshape(-1, a.shape[-1])
        out = cupy.empty((rows.shape[0], b.shape[1]), dtype=a.dtype)
        _gemm(rows, b, out)
        return out.reshape(a.shape[:-1] + (b.shape[1],))
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return cupy.matmul(a, b)  # cupy's own error
    out = cupy.empty(tuple(batch) + (a.shape[-2], b.shape[-1]), dtype=a.dtype)
    _gemm(a, b, out)
    return out


def linear(x: Any, weight_t: Any, bias: Any = None, activation: Any = None) -> Any:
    """``x @ weight_t + bias`` over the last axis through :func:`matmul`, then ``activation`` (a
    spec of :func:`activation_inplace`, or None): the bias and the activation are one kernel in
    place on the fresh product (:func:`_bias_activation`), else two (the bias added in place)."""
    y = matmul(x, weight_t)
    if bias is not None:
        if (FUSED_BIAS and isinstance(bias, cupy.ndarray) and bias.ndim == 1 and _is_float(y)
                and bias.dtype == y.dtype and y.ndim >= 1 and y.shape[-1] == bias.shape[0]
                and y.flags.c_contiguous and 0 < y.size <= _INT32_MAX and not callable(activation)):
            return _bias_activation(y, bias, activation)
        if isinstance(y, cupy.ndarray) and isinstance(bias, cupy.ndarray) and bias.dtype == y.dtype:
            y += bias
        else:
            y = y + bias
    return y if activation is None else activation_inplace(y, activation)
