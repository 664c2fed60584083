"""Elementwise math and small views that pnnx 2.13 leaves as their own operators instead of folding
them into a ``pnnx.Expression``: special functions (lgamma, digamma, erfinv, erfc, ndtr, the
modified Bessel functions i0 / i0e / i1 / i1e, polygamma, ...), clamps against one bound, lerp / addcmul /
addcdiv, nan_to_num, the floating-point predicates (isnan, isfinite, signbit, ...), the integer
shifts, gcd / lcm, and ``x.t()`` / ``view_as`` / ``reshape_as``.

pnnx spellings (torch 2.13 exports):

* ``torch.t``, ``torch.positive``, ``torch.lgamma`` (also ``torch.special.gammaln``): ``$input``;
  ``torch.bitwise_left_shift`` / ``torch.bitwise_right_shift``: ``$input $other``;
  ``Tensor.reshape_as``: ``$input $other``; ``aten::view_as``: two positional inputs.
* every other operator here is an ``aten::`` op whose inputs are positional, in the order of the
  torch signature; scalar arguments come from constant ``pnnx.Expression`` ops (``expr=0.5``,
  ``expr=None``) and arrive as Python numbers or None, or as 0-d arrays (a folded
  ``pnnx.Attribute``). ``x.clamp_min(0.5)``: ``aten::clamp_min 2 1 x v``; ``torch.logit(x, eps)``:
  ``aten::logit x eps`` (eps None without clamping); ``torch.lerp(a, b, w)``: ``aten::lerp a b w``;
  ``torch.addcmul(x, t1, t2, value=v)``: ``aten::addcmul x t1 t2 v``; ``torch.nan_to_num(x, nan,
  posinf, neginf)``: ``aten::nan_to_num x nan posinf neginf``; ``torch.xlogy(2.0, y)`` keeps the
  order (``aten::xlogy c y``); ``torch.special.*`` spellings (erfc, exp2, expit ...) export as
  the plain ops (``torch.special.expit`` becomes ``F.sigmoid``, ``special.erf`` an Expression).

Semantics and dtypes follow torch: integer and bool inputs of a float function give float32;
binary ops promote as torch does (a Python scalar does not raise a tensor's dtype within its
kind); ``clamp_min(bool, 0)`` is int64; ops torch refuses for a dtype (``frac``/``hypot`` of
integers, ``addcdiv`` of integers, shifts of floats, ``positive`` of bool, ``heaviside`` of two
dtypes, ``lerp`` of mixed dtypes) raise a ShapeError naming the operator.

Special functions are evaluated in float64 (float32 and float16 inputs are widened, then rounded
back once), so a float32 result is the correctly rounded value up to about one ulp:

* ``lgamma``: Lanczos (g = 7, n = 9) for x >= 0.5, the Taylor series of lgamma(1 + e) (zeta
  values) within 0.2 of 1 and 2 where lgamma has its zeros, reflection
  ``log(pi / |sin(pi x)|) - lgamma(1 - x)`` below 0.5 with an exact argument reduction; +inf at
  the poles (0, -1, -2, ...) and at +-inf.
* ``digamma``: torch's own algorithm in the input's dtype (not widened), so its float32 roundings
  are torch's: recurrence up to x >= 10, the asymptotic series, reflection
  ``psi(1 - x) - pi / tan(pi frac(x))`` for x < 0; -inf at +0, +inf at -0, NaN at negative
  integers and -inf.
* ``erfc`` / ``erfcx``: W. J. Cody's rational approximations (the ones behind
  :func:`kuiper_xp.expression.functions.erf`), relative accuracy in the tail.
* ``erfinv`` / ``ndtri``: M. Giles' single-precision approximation (an asymptotic start in the far
  tail) refined by Newton steps on erf near 0 and on log(erfc) in the tails, where 1 - |y| is
  exact; ``log_ndtr`` as torch writes it from erfc / erfcx; ``ndtr`` as torch, from erf in the
  input's dtype.

Close to the zeros of lgamma at negative x, torch's float32 kernel (the C library's lgammaf) loses
digits; there the results here are the more accurate ones and differ from torch by its rounding.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, ClassVar

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.expression.functions import (
    LOG_VIA_FLOAT64_MAX,
    THRESH,
    ArrayOps,
    erf_generic,
    erfcx_large,
    erfcx_mid,
    wrap_int,
)
from kuiper_xp.expression.functions import erf as _erf

from .base import BuildContext, Layer
from .misc import input_slots
from .registry import register
from .shape import dtype_name

_SCALARS = (bool, int, float)
_LOG_PI = math.log(math.pi)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT2 = math.sqrt(2.0)
_SQRT_PI = math.sqrt(math.pi)
_EULER = 0.57721566490153286061


# -------------------------------------------------------------------------------------------------
# Special functions on float64 arrays of the namespace ``xp``.

def _zeta(s: int) -> float:
    """Riemann zeta(s) for an integer s >= 2 (Euler-Maclaurin from N = 50; error < 1e-17)."""
    n = 50
    head = math.fsum(k ** -float(s) for k in range(1, n))
    tail = n ** (1.0 - s) / (s - 1) + 0.5 * n ** -float(s)
    rising, corr = float(s), 0.0
    for j, b in enumerate((1 / 6, -1 / 30, 1 / 42, -1 / 30), start=1):
        corr += b / math.factorial(2 * j) * rising * n ** (-s - 2 * j + 1.0)
        rising *= (s + 2 * j - 1) * (s + 2 * j)
    return head + tail + corr


#: lgamma(1 + e) = sum c[k] e^k (k >= 1): c[1] = -gamma, c[k] = (-1)^k zeta(k) / k
_LGAMMA1P = (-_EULER,) + tuple((-1) ** k * _zeta(k) / k for k in range(2, 27))
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
            1.5056327351493116e-7)
#: z * sum A[i] z^(6 - i), z = 1 / x^2: the asymptotic series of digamma (torch's / Cephes' A)
_DIGAMMA_A = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
              -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
              8.33333333333333333333e-2)
_PSI_10 = 2.25175258906672110764
_GILES_MID = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
              -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
               -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _horner(coeffs: tuple[float, ...], z: Any) -> Any:
    """coeffs[0] z^n + ... + coeffs[n]."""
    p = coeffs[0]
    for c in coeffs[1:]:
        p = p * z + c
    return p


def _lgamma_pos(x: Any, xp: Any) -> Any:
    """lgamma(x) for x >= 0.5 (float64; +inf stays +inf)."""
    xf = xp.where(xp.isinf(x), 1.0, x)
    z = xf - 1.0
    a = _LANCZOS[0]
    for i in range(1, len(_LANCZOS)):
        a = a + _LANCZOS[i] / (z + float(i))
    t = z + (_LANCZOS_G + 0.5)
    lanczos = _HALF_LOG_2PI + (z + 0.5) * xp.log(t) - t + xp.log(a)
    # the Taylor series around 1 and 2 keeps lgamma's zeros relatively accurate
    e1 = xp.clip(xf - 1.0, min=-0.2, max=0.2)
    e2 = xp.clip(xf - 2.0, min=-0.2, max=0.2)
    s1 = _horner(_LGAMMA1P[::-1], e1) * e1
    s2 = _horner(_LGAMMA1P[::-1], e2) * e2 + xp.log1p(e2)
    out = xp.where(xp.abs(xf - 1.0) <= 0.2, s1, xp.where(xp.abs(xf - 2.0) <= 0.2, s2, lanczos))
    return xp.where(xp.isinf(x), x, out)


def lgamma(x: Any, xp: Any) -> Any:
    """torch.lgamma on a float64 array."""
    refl = x < 0.5
    ax = xp.abs(x)
    finite = xp.isfinite(x)
    xs = xp.where(finite, x, 0.0)
    main = _lgamma_pos(xp.where(refl, 1.0 - xs, xs), xp)
    # |sin(pi x)| by an exact reduction: u = x - floor(x) is exact for x <= -0.5
    u = xs - xp.floor(xs)
    v = xp.where(ax < 0.5, ax, xp.minimum(u, 1.0 - u))
    s = xp.sin(math.pi * xp.where(finite, v, 0.5))
    pole = (s == 0.0) & refl
    refl_val = _LOG_PI - xp.log(xp.where(pole, 1.0, s)) - main
    out = xp.where(refl, refl_val, main)
    out = xp.where(pole | xp.isinf(x), xp.inf, out)
    # (+ 0.0: the series around 1 and 2 gives -0.0 at those zeros, where torch gives +0.0)
    return xp.where(xp.isnan(x), x, out + 0.0)


def digamma(x: Any, xp: Any) -> Any:
    """torch.digamma, vectorised from torch's calc_digamma in the dtype of ``x`` (float32 or
    float64, so that the roundings are torch's own; the reflection term pi / tan(pi frac(x)) is
    computed in float64, as torch does for float32 too)."""
    neg = x < 0.0
    finite = xp.isfinite(x)
    y = xp.where(neg, 1.0 - x, x)
    y = xp.where(finite & (y != 0.0), y, 10.5)
    acc = xp.zeros_like(y)
    for _ in range(10):
        small = y < 10.0
        acc = acc - xp.where(small, 1.0 / y, 0.0)
        y = xp.where(small, y + 1.0, y)
    z = 1.0 / (y * y)
    res = acc + xp.log(y) - 0.5 / y - z * _horner(_DIGAMMA_A, z)
    res = xp.where(y == 10.0, acc + _PSI_10, res)
    x64 = x if x.dtype == xp.float64 else xp.astype(x, xp.float64)
    r = x64 - xp.trunc(x64)
    refl = math.pi / xp.tan(math.pi * xp.where(neg & finite & (r != 0.0), r, 0.25))
    res = xp.where(neg, res - (refl if x.dtype == xp.float64 else xp.astype(refl, x.dtype)), res)
    res = xp.where(neg & ((r == 0.0) | ~finite), xp.nan, res)  # negative integers, -inf
    res = xp.where(x == 0.0, xp.copysign(xp.full_like(x, xp.inf), -x), res)
    res = xp.where(x == xp.inf, xp.inf, res)
    return xp.where(xp.isnan(x), x, res)


def _erfcx_pos(y: Any, xp: Any) -> Any:
    """erfcx(y) = exp(y^2) erfc(y) for y >= 0 (float64; NaN for NaN)."""
    mid = erfcx_mid(xp.clip(y, min=THRESH, max=4.0))
    large = erfcx_large(xp.clip(y, min=4.0))
    ys = xp.clip(y, max=THRESH)
    small = xp.exp(ys * ys) * (1.0 - erf_generic(ys, xp))
    return xp.where(y <= THRESH, small, xp.where(y <= 4.0, mid, large))


def _exp_neg_sq(y: Any, xp: Any) -> Any:
    """exp(-y*y) without the rounding error of y*y in the exponent (Cody's split)."""
    ysq = xp.trunc(y * 16.0) / 16.0
    return xp.exp(-ysq * ysq) * xp.exp(-(y - ysq) * (y + ysq))


def erfc(x: Any, xp: Any) -> Any:
    """torch.erfc on a float64 array: relatively accurate down to the underflow near x = 26.5."""
    y = xp.clip(xp.abs(x), max=30.0)
    pos = _erfcx_pos(y, xp) * _exp_neg_sq(y, xp)
    out = xp.where(x < 0.0, 2.0 - pos, pos)
    xs = xp.clip(x, min=-THRESH, max=THRESH)
    out = xp.where(xp.abs(x) <= THRESH, 1.0 - erf_generic(xs, xp), out)
    return xp.where(xp.isnan(x), x, out)


def erfcx(x: Any, xp: Any, sq: Any = None) -> Any:
    """torch.special.erfcx on a float64 array: exp(x^2) erfc(x) (+inf below about -26.6). ``sq``:
    x * x as torch rounds it in the input's dtype (it sets the value for x < 0)."""
    y = xp.abs(x)
    pos = _erfcx_pos(y, xp)
    sq = x * x if sq is None else sq
    neg = 2.0 * xp.exp(xp.where(x < -26.7, 0.0, sq)) - pos
    out = xp.where(x < 0.0, xp.where(x < -26.7, xp.inf, neg), pos)
    return xp.where(xp.isnan(x), x, out)


def _erfcinv_small(t: Any, xp: Any) -> Any:
    """erfc^-1(t) for 0 < t <= 0.5 (float64): a start from Giles' approximation (an asymptotic
    one in the far tail), then Newton steps on log(erfc(x)) = log(t)."""
    w = -xp.log(t * (2.0 - t))
    g_mid = _horner(_GILES_MID, w - 2.5)
    g_tail = _horner(_GILES_TAIL, xp.sqrt(w) - 3.0)
    lt = -xp.log(t)
    asym = xp.sqrt(xp.clip(lt - 0.5 * xp.log(math.pi * lt), min=0.0))
    x = xp.where(w < 5.0, g_mid, g_tail) * (1.0 - t)
    x = xp.where(w > 16.0, asym, x)
    logt = xp.log(t)
    for _ in range(4):
        ex = _erfcx_pos(xp.clip(x, min=0.0), xp)
        x = x + (xp.log(ex) - x * x - logt) * (0.5 * _SQRT_PI) * ex
    return x


def erfinv(y: Any, xp: Any) -> Any:
    """torch.erfinv on a float64 array: +-inf at +-1, NaN outside [-1, 1]."""
    a = xp.abs(y)
    inner = a <= 0.5
    yc = xp.where(inner, y, 0.0)
    w = -xp.log((1.0 - yc) * (1.0 + yc))
    x = _horner(_GILES_MID, w - 2.5) * yc
    for _ in range(2):
        x = x - (_erf(x, xp) - yc) * (0.5 * _SQRT_PI) * xp.exp(x * x)
    t = xp.where(inner | (a >= 1.0), 0.5, 1.0 - a)  # exact for |y| >= 0.5
    tail = _erfcinv_small(t, xp)
    out = xp.where(inner, x, xp.where(y < 0.0, -tail, tail))
    out = xp.where(a == 1.0, xp.copysign(xp.full_like(y, xp.inf), y), out)
    return xp.where((a > 1.0) | xp.isnan(y), xp.nan, out)




def log_ndtr(t: Any, tt: Any, xp: Any) -> Any:
    """torch.special.log_ndtr of x from t = x / sqrt(2) and tt = t * t (float64 arrays of the
    values torch rounds in the input's dtype): log(erfcx(-t) / 2) - t^2 below x = -1, else
    log1p(-erfc(t) / 2)."""
    low_side = t < -1.0 / _SQRT2
    tl = xp.where(low_side, t, -1.0)
    low = xp.log(erfcx(-tl, xp) / 2.0) - xp.where(low_side, tt, 1.0)
    high = xp.log1p(-erfc(xp.where(low_side, 0.0, t), xp) / 2.0)
    out = xp.where(low_side, low, high)
    return xp.where(xp.isnan(t), t, out)


def ndtri(p: Any, xp: Any) -> Any:
    """torch.special.ndtri: the inverse of the normal CDF; -inf at 0, +inf at 1, NaN outside."""
    low = p < 0.25
    high = p > 0.75
    t = xp.where(low, 2.0 * p, xp.where(high, 2.0 * (1.0 - p), 0.5))  # exact
    t = xp.where(t > 0.0, t, 0.5)
    tail = _SQRT2 * _erfcinv_small(t, xp)
    mid = _SQRT2 * erfinv(xp.where(low | high, 0.0, 2.0 * p - 1.0), xp)
    out = xp.where(low, -tail, xp.where(high, tail, mid))
    out = xp.where(p == 0.0, -xp.inf, xp.where(p == 1.0, xp.inf, out))
    return xp.where((p < 0.0) | (p > 1.0) | xp.isnan(p), xp.nan, out)


# -------------------------------------------------------------------------------------------------
# Layers


class _Op(Layer):
    """Shared plumbing: input slots (``$name`` or positional, in ``slots`` order; the first
    ``required`` must be there), torch's dtype promotion, float widening."""

    slots: ClassVar[tuple[str, ...]] = ("input",)
    required: ClassVar[int] = 1

    def __init__(self, ctx: BuildContext, order: list[int | None], consts: dict[int, Any], where: str):
        super().__init__(ctx)
        self.order, self.consts, self.where = order, consts, where
        self.ops = ArrayOps.shared(ctx.xp, ctx.device)

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, cls.slots)
        consts: dict[int, Any] = {}
        for k, name in enumerate(cls.slots):
            # a scalar argument written as a parameter (``other=2``) instead of an input
            if name not in pos and op.has_param(name):
                v = op.params[name]
                if v is not None and not isinstance(v, _SCALARS):
                    raise LayerParameterError(f"{op.where}: parameter {name}={v!r} should be a number")
                consts[k] = v
        missing = [k for i, k in enumerate(cls.slots[: cls.required]) if k not in pos and i not in consts]
        if missing:
            raise LayerParameterError(f"{op.where}: {len(op.inputs)} inputs, missing {missing}; this operator "
                                      f"takes {list(cls.slots)}")
        return cls(ctx, [pos.get(k) for k in cls.slots], consts, op.where)

    @property
    def who(self) -> str:
        return f"{self.op_type} {self.op_name!r}"

    def forward(self, *inputs: Any) -> Any:
        return self.compute(*[self.consts.get(k) if i is None else inputs[i] for k, i in enumerate(self.order)])

    def compute(self, *args: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- helpers -----------------------------------------------------------------------------
    def is_float(self, dt: Any) -> bool:
        return self.xp.isdtype(dt, "real floating")

    def array(self, v: Any, what: str = "input") -> Any:
        if hasattr(v, "dtype") and getattr(v, "ndim", None) == 0 and not hasattr(v, "__setitem__"):
            v = self.xp.asarray(v)  # (a NumPy scalar: what arithmetic on a 0-d array gives)
        if isinstance(v, _SCALARS) or not hasattr(v, "dtype"):
            raise ShapeError(f"{self.who}: {what} should be a tensor, found {type(v).__name__} {v!r}")
        if self.xp.isdtype(v.dtype, "complex floating"):
            raise ShapeError(f"{self.who}: complex tensors are not supported")
        return v

    def scalar(self, v: Any, what: str, allow_none: bool = False) -> Any:
        """A Python number from a constant operand (a number or a one-element array)."""
        if v is None and allow_none:
            return None
        if isinstance(v, _SCALARS):
            return v
        if hasattr(v, "shape") and math.prod(v.shape) == 1:
            v = self.xp.reshape(v, ())
            return bool(v) if v.dtype == self.xp.bool else int(v) if self.xp.isdtype(v.dtype, "integral") else float(v)
        raise ShapeError(f"{self.who}: {what} should be a number, found {type(v).__name__} {getattr(v, 'shape', v)!r}")

    def float_dtype(self, x: Any) -> Any:
        """torch's result dtype of a float function: integers and bool give float32."""
        return x.dtype if self.is_float(x.dtype) else self.xp.float32

    def as_float(self, x: Any) -> Any:
        dt = self.float_dtype(x)
        return x if x.dtype == dt else self.xp.astype(x, dt)

    def widen(self, x: Any) -> Any:
        xp = self.xp
        return x if x.dtype == xp.float64 else xp.astype(x, xp.float64)

    def in_own_dtype(self, fn: Any, x: Any) -> Any:
        """``fn`` evaluated in x's float dtype as torch's templated kernels are (float32 for
        float32, float16 and integers; float64 for float64), in torch's result dtype."""
        xp = self.xp
        dt = self.float_dtype(x)
        work = dt if dt == xp.float64 else xp.float32  # (float16: in float32, as torch)
        y = fn(x if x.dtype == work else xp.astype(x, work), xp)
        return y if y.dtype == dt else xp.astype(y, dt)

    def via64(self, fn: Any, x: Any) -> Any:
        """``fn`` evaluated in float64 on ``x`` widened, rounded back to torch's result dtype."""
        xp = self.xp
        x = self.array(x)
        dt = self.float_dtype(x)
        y = fn(x if x.dtype == xp.float64 else xp.astype(x, xp.float64), xp)
        return y if dt == xp.float64 else xp.astype(y, dt)

    def promote(self, *values: Any, floating: bool = False) -> tuple[Any, list[Any]]:
        """torch's result dtype of ``values`` (arrays and Python numbers; with ``floating``, an
        integer or bool result becomes float32) and the values as arrays of it (numbers as 0-d)."""
        xp = self.xp
        for v in values:
            if not isinstance(v, _SCALARS):
                self.array(v)
        dt = self.ops.result_dtype(values)
        if dt is None:
            raise ShapeError(f"{self.who}: needs at least one tensor")
        if floating and not self.is_float(dt):
            dt = xp.float32
        out = []
        for v in values:
            if isinstance(v, _SCALARS):
                if type(v) is int and xp.isdtype(dt, "integral"):  # (torch wraps: clamp_min(u8, -1) is 255)
                    v = wrap_int(v, xp.iinfo(dt))
                v = xp.asarray(v, dtype=dt, device=self.device)
            elif v.dtype != dt:
                v = xp.astype(v, dt)
            out.append(v)
        return dt, out

    def need_float(self, dt: Any, name: str) -> None:
        if not self.is_float(dt):
            raise ShapeError(f"{self.who}: {name} is not defined for {dtype_name(dt)} tensors (torch raises too)")


# -- views ----------------------------------------------------------------------------------------


@register("torch.t")
class MatrixT(_Op):
    """``x.t()``: the transpose of a 2-D tensor; 0-D and 1-D tensors come back unchanged."""

    def compute(self, x):
        if x.ndim > 2:
            raise ShapeError(f"{self.who}: t() expects a tensor with <= 2 dimensions, found shape {tuple(x.shape)}")
        return self.xp.matrix_transpose(x) if x.ndim == 2 else x


@register("aten::numpy_T")
class NumpyT(_Op):
    """``x.T``: x with all its dimensions reversed (a 2-D tensor's transpose)."""

    def compute(self, x):
        return self.xp.permute_dims(x, tuple(range(x.ndim))[::-1]) if x.ndim > 1 else x


@register("aten::mT", "aten::mH")
class MatrixTranspose(_Op):
    """``x.mT``: the last two dimensions swapped (``x.mH`` and ``torch.adjoint(x)``: also conjugated)."""

    def compute(self, x):
        if x.ndim < 2:
            raise ShapeError(f"{self.who}: expects a tensor with at least 2 dimensions, found shape {tuple(x.shape)}")
        y = self.xp.matrix_transpose(x)
        if self.op_type != "aten::mT" and self.xp.isdtype(x.dtype, "complex floating"):
            y = self.xp.conj(y)
        return y


@register("aten::view_as", "Tensor.reshape_as")
class ReshapeAs(_Op):
    """``a.view_as(b)`` / ``a.reshape_as(b)``: ``a`` reshaped (row-major) to ``b``'s shape."""

    slots = ("input", "other")
    required = 2

    def compute(self, x, other):
        shape = tuple(other.shape)
        if math.prod(shape) != math.prod(x.shape):
            raise ShapeError(f"{self.who}: cannot reshape a tensor of shape {tuple(x.shape)} "
                             f"({math.prod(x.shape)} elements) to {shape}")
        return self.xp.reshape(x, shape)


# -- simple unary ---------------------------------------------------------------------------------


@register("torch.positive")
class Positive(_Op):
    """``torch.positive(x)``: x itself (bool tensors are refused, as torch does)."""

    def compute(self, x):
        x = self.array(x)
        if x.dtype == self.xp.bool:
            raise ShapeError(f"{self.who}: positive is not defined for bool tensors (torch raises too)")
        return x


@register("torch.lgamma")
class LGamma(_Op):
    """``torch.lgamma``: log |Gamma(x)|, +inf at the poles 0, -1, -2, ... and at +-inf."""

    def compute(self, x):
        return self.via64(lgamma, x)


@register("aten::digamma")
class Digamma(_Op):
    """``torch.digamma``: the logarithmic derivative of Gamma; -inf at +0, +inf at -0, NaN at the
    negative integers."""

    def compute(self, x):
        return self.in_own_dtype(digamma, self.array(x))


#: B_2, B_4, ..., B_24 (Bernoulli numbers): the Euler-Maclaurin terms of the Hurwitz zeta are
#: t_i = s (s+1) ... (s+2i) w^-(s+2i+1) / ((2i+2)! / B_(2i+2)), as in torch's zeta (Cephes)
_BERNOULLI_EVEN = (Fraction(1, 6), Fraction(-1, 30), Fraction(1, 42), Fraction(-1, 30), Fraction(5, 66),
                   Fraction(-691, 2730), Fraction(7, 6), Fraction(-3617, 510), Fraction(43867, 798),
                   Fraction(-174611, 330), Fraction(854513, 138), Fraction(-236364091, 2730))
_ZETA_A = tuple(float(math.factorial(2 * i + 2) / b) for i, b in enumerate(_BERNOULLI_EVEN))
#: polygamma refuses inputs below this: the zeta sum steps from x up to 9, one pass per unit
POLYGAMMA_MIN_X = -1e5


def hurwitz_zeta(s: Any, q: Any, xp: Any) -> Any:
    """zeta(s, q) = sum_k (q + k)^-s for a float64 array ``q`` and s > 1 (a number, or a float64
    array broadcasting with q), as torch's zeta: the terms summed until q + k > 9 (and at least
    10 of them), then the Euler-Maclaurin tail; +inf at the poles q = 0, -1, -2, ..."""
    acc = xp.pow(q, -s)
    a = q
    b = xp.zeros_like(q)
    low = float(xp.min(xp.where(xp.isfinite(q), q, 9.0))) if q.size else 9.0
    steps = max(9, int(math.ceil(9.0 - low)) + 1)
    for i in range(steps):
        more = (a <= 9.0) | (i < 9)
        a = xp.where(more, a + 1.0, a)
        b = xp.where(more, xp.pow(a, -s), b)
        acc = acc + xp.where(more, b, 0.0)
    w = a
    acc = acc + b * w / (s - 1.0) - 0.5 * b
    fac, k = 1.0, 0.0
    for coef in _ZETA_A:
        fac *= s + k
        b = b / w
        acc = acc + fac * b / coef
        k += 1.0
        fac *= s + k
        b = b / w
        k += 1.0
    pole = (q <= 0.0) & (q == xp.floor(q))
    return xp.where(pole, xp.inf, acc)


def trigamma(x: Any, xp: Any) -> Any:
    """torch's calc_trigamma on a float32 or float64 array, in its dtype: reflection below 1/2,
    six steps up, then the asymptotic series."""
    refl = x < 0.5
    sin_pi = xp.sin(math.pi * xp.where(refl, x, 0.25))
    result = xp.where(refl, -(math.pi * math.pi) / (sin_pi * sin_pi), 0.0)
    y = xp.where(refl, 1.0 - x, x)
    for _ in range(6):
        result = result + 1.0 / (y * y)
        y = y + 1.0
    ixx = 1.0 / (y * y)
    result = result + (1.0 + 1.0 / (2.0 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / y
    return xp.where(refl, -result, result)


@register("aten::polygamma")
class Polygamma(_Op):
    """``torch.polygamma(n, x)`` (pnnx: ``aten::polygamma op 2 1 n x``): digamma for n = 0 and
    torch's trigamma for n = 1 (both in the input's float dtype, as torch), (-1)^(n+1) n! zeta(n +
    1, x) above (in float64, rounded to torch's result dtype; integers give float32)."""

    slots = ("n", "input")
    required = 2

    def compute(self, n, x):
        xp = self.xp
        k = self.scalar(n, "n")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ShapeError(f"{self.who}: n should be a non-negative integer, found {k!r}")
        x = self.as_float(self.array(x))  # (integers: float32, as torch)
        if k == 0:
            return self.in_own_dtype(digamma, x)
        if x.size and bool(xp.any((x < POLYGAMMA_MIN_X) & xp.isfinite(x))):
            raise ShapeError(f"{self.who}: inputs below {POLYGAMMA_MIN_X:g} are not supported (the series "
                             "steps up from x one unit at a time)")
        if k == 1:  # (in float32 for float32, as torch: its poles' values come from float32's sin)
            return self.in_own_dtype(trigamma, x)
        sign = 1.0 if k % 2 else -1.0
        scale = sign * math.exp(math.lgamma(k + 1.0))
        return self.via64(lambda v, xp: scale * hurwitz_zeta(k + 1.0, v, xp), x)


@register("aten::frexp")
class Frexp(_Op):
    """``torch.frexp(x)`` -> (mantissa, int32 exponent) with x = mantissa * 2**exponent and
    0.5 <= |mantissa| < 1; zeros, infinities and NaN come back as they are with exponent 0, as
    torch's. Exact: the exponent from log2 in float64, corrected by one where it rounded, and the
    scaling by powers of two (split in two, so that 2**1024 is never formed). The powers come from
    a table made on the host (``math.ldexp``): a GPU's ``pow(2.0, k)`` may be an ulp off, which
    made mantissas an ulp off on CuPy. (CuPy flushes float32 subnormals to zero in every kernel,
    so there a float32 subnormal is a zero: mantissa 0, exponent 0.)"""

    _pow2: Any = None

    def _powers_of_two(self, k):
        """2.0**k, exactly, for float64 integers k: a table of 2**-1074 (the smallest subnormal)
        to 2**1023, with 0 below it and inf above it (where log2 rounded the exponent out of the
        range; the correction by one then moves it back)."""
        xp = self.xp
        if self._pow2 is None:
            self._pow2 = xp.asarray([0.0] + [math.ldexp(1.0, j) for j in range(-1074, 1024)] + [math.inf],
                                    dtype=xp.float64, device=self.device)
        index = xp.astype(xp.clip(k, -1075.0, 1024.0) + 1075.0, xp.int32)
        return xp.reshape(xp.take(self._pow2, xp.reshape(index, (-1,))), k.shape)

    def compute(self, x):
        xp = self.xp
        x = self.array(x)
        if not self.is_float(x.dtype):
            raise ShapeError(f"{self.who}: frexp needs a floating tensor, found {dtype_name(x.dtype)} (torch too)")
        v = self.widen(x)
        ok = xp.isfinite(v) & (v != 0.0)
        a = xp.where(ok, xp.abs(v), 1.0)
        e = xp.floor(xp.log2(a)) + 1.0

        def scaled(e):
            return a / self._powers_of_two(e - 1.0) * 0.5

        m = scaled(e)
        e = xp.where(m >= 1.0, e + 1.0, xp.where(m < 0.5, e - 1.0, e))
        m = xp.where(ok, scaled(e), 0.0)
        mant = xp.where(ok, xp.where(v < 0.0, -m, m), v)
        return xp.astype(mant, x.dtype), xp.astype(xp.where(ok, e, 0.0), xp.int32)


@register("aten::erfinv")
class ErfInv(_Op):
    """``torch.erfinv``: the inverse error function; +-inf at +-1, NaN outside [-1, 1]."""

    def compute(self, x):
        return self.via64(erfinv, x)


@register("aten::erfc")
class Erfc(_Op):
    """``torch.erfc``: 1 - erf(x), accurate relative to its value in the tail."""

    def compute(self, x):
        return self.via64(erfc, x)


@register("aten::special_erfcx")
class Erfcx(_Op):
    """``torch.special.erfcx``: the scaled complementary error function exp(x^2) erfc(x)."""

    def compute(self, x):
        x = self.as_float(self.array(x))
        sq = self.widen(x * x)  # (rounded in the input's dtype, as torch)
        return self.via64(lambda v, xp: erfcx(v, xp, sq), x)


#: modified Bessel functions: the power series up to |x| = _BESSEL_SERIES_MAX (its terms peak
#: near k = |x| / 2 and are below 1e-17 of the sum by k = 80), Hankel's asymptotic series beyond
#: (its terms fall until k ~ 2 |x|; 25 of them reach 1e-24 at |x| = 30)
_BESSEL_SERIES_MAX = 30.0
_BESSEL_SERIES_TERMS = 80
_BESSEL_ASYMPTOTIC_TERMS = 25


def _bessel_i(x: Any, xp: Any, order: int, scaled: bool, exp_max: float) -> Any:
    """I0 / I1 of a float64 array (times exp(-|x|) when ``scaled``): torch.i0, special.i0e, i1, i1e.
    As torch's kernels, which take exp(|x|) in the input's dtype: the unscaled functions are inf
    from |x| > ``exp_max`` (that dtype's log(max)) and NaN at +-inf; the scaled ones 0 at +-inf."""
    ax = xp.abs(x)
    small = ax <= _BESSEL_SERIES_MAX
    xs = xp.where(small, ax, 0.0)
    q = xs * xs * 0.25
    term = xp.ones_like(xs) if order == 0 else xs * 0.5
    total = term
    for k in range(1, _BESSEL_SERIES_TERMS + 1):
        term = term * q / float(k * (k + order))
        total = total + term
    series = total * xp.exp(-xs) if scaled else total
    xl = xp.where(small, 1.0, ax if scaled else xp.minimum(ax, exp_max))
    d = xp.ones_like(xl)
    acc = d
    mu = 4.0 * order * order
    for k in range(1, _BESSEL_ASYMPTOTIC_TERMS + 1):
        d = d * ((2 * k - 1) ** 2 - mu) / (8.0 * k) / xl
        acc = acc + d
    # e^|x| / sqrt(2 pi |x|) as one exp (finite to the clamp above)
    lead = 1.0 / xp.sqrt(2.0 * math.pi * xl) if scaled else xp.exp(xl - 0.5 * xp.log(2.0 * math.pi * xl))
    out = xp.where(small, series, acc * lead)
    if not scaled:
        out = xp.where(ax > exp_max, xp.inf, out)
        out = xp.where(xp.isinf(x), xp.nan, out)
    if order == 1:
        out = xp.where(x < 0, -out, out)
    return xp.where(xp.isnan(x), x, out)


@register("aten::i0", "aten::special_i0e", "aten::special_i1", "aten::special_i1e")
class BesselI(_Op):
    """``torch.i0`` / ``torch.special.i0`` (pnnx: ``aten::i0``), ``special.i0e``, ``special.i1``,
    ``special.i1e``: modified Bessel functions of the first kind of order 0 and 1, and the same
    times exp(-|x|), in float64 and rounded to torch's result dtype (integers give float32)."""

    def compute(self, x):
        name = self.op_type
        order = 1 if name.endswith(("i1", "i1e")) else 0
        scaled = name.endswith("e")
        x = self.array(x)
        exp_max = math.log(float(self.xp.finfo(self.float_dtype(x)).max))
        return self.via64(lambda v, xp: _bessel_i(v, xp, order, scaled, exp_max), x)


@register("aten::special_ndtr")
class Ndtr(_Op):
    """``torch.special.ndtr``: the standard normal CDF, (1 + erf(x / sqrt(2))) / 2 in the input's
    dtype as torch computes it (so the far left tail rounds to 0, as in torch)."""

    def compute(self, x):
        x = self.as_float(self.array(x))
        return (1.0 + _erf(x * (1.0 / _SQRT2), self.xp)) * 0.5


@register("aten::special_ndtri")
class Ndtri(_Op):
    """``torch.special.ndtri``: the inverse of the standard normal CDF; -inf at 0, +inf at 1."""

    def compute(self, x):
        return self.via64(ndtri, x)


@register("aten::special_log_ndtr")
class LogNdtr(_Op):
    """``torch.special.log_ndtr``: log of the standard normal CDF, accurate far into both tails."""

    def compute(self, x):
        t = self.as_float(self.array(x)) * (1.0 / _SQRT2)
        tt = self.widen(t * t)
        return self.via64(lambda v, xp: log_ndtr(v, tt, xp), t)


@register("aten::exp2")
class Exp2(_Op):
    """``torch.exp2``: 2 ** x."""

    def compute(self, x):
        return self.via64(lambda v, xp: xp.pow(2.0, v), x)


@register("aten::log2")
class Log2(_Op):
    """``torch.log2``: the base-2 logarithm."""

    def compute(self, x):
        x = self.as_float(self.array(x))
        xp = self.xp
        if x.dtype == xp.float32 and math.prod(x.shape) <= LOG_VIA_FLOAT64_MAX:  # (torch's bits: see there)
            return xp.astype(xp.log2(xp.astype(x, xp.float64)), xp.float32)
        return xp.log2(x)


@register("aten::sinc")
class Sinc(_Op):
    """``torch.sinc``: sin(pi x) / (pi x), 1 at 0 (computed in the input's dtype, as torch)."""

    def compute(self, x):
        xp = self.xp
        x = self.as_float(self.array(x))
        px = x * math.pi
        return xp.where(x == 0, xp.asarray(1.0, dtype=x.dtype, device=self.device),
                        xp.sin(px) / xp.where(x == 0, 1.0, px))


@register("aten::frac")
class Frac(_Op):
    """``torch.frac``: x - trunc(x) (floating tensors only; NaN at +-inf)."""

    def compute(self, x):
        x = self.array(x)
        self.need_float(x.dtype, "frac")
        return x - self.xp.trunc(x)


@register("aten::deg2rad", "aten::rad2deg")
class AngleUnits(_Op):
    """``torch.deg2rad`` / ``torch.rad2deg``: x times pi / 180 (or 180 / pi)."""

    def compute(self, x):
        f = math.pi / 180.0 if self.op_type.endswith("deg2rad") else 180.0 / math.pi
        return self.as_float(self.array(x)) * f


@register("aten::sgn")
class Sgn(_Op):
    """``torch.sgn``: of a real tensor its sign (0 for NaN and 0; bool stays bool), of a complex
    one ``z / |z|`` (0 where ``z`` is 0)."""

    def compute(self, x):
        xp = self.xp
        if hasattr(x, "dtype") and xp.isdtype(x.dtype, "complex floating"):
            a = xp.abs(x)
            zero = a == 0
            return xp.where(zero, xp.zeros_like(x), x / xp.astype(xp.where(zero, xp.ones_like(a), a), x.dtype))
        x = self.array(x)
        if x.dtype == xp.bool:
            return x
        s = xp.sign(x)
        return xp.where(xp.isnan(x), xp.zeros_like(s), s) if self.is_float(x.dtype) else s


@register("aten::special_entr")
class Entr(_Op):
    """``torch.special.entr``: -x log(x) for x > 0, 0 at 0, -inf for x < 0."""

    def compute(self, x):
        xp = self.xp
        x = self.as_float(self.array(x))
        pos = x > 0
        y = -x * xp.log(xp.where(pos, x, 1.0))
        y = xp.where(x < 0, -xp.inf, xp.where(x == 0, 0.0, y))
        return xp.where(xp.isnan(x), x, y)


@register("aten::isfinite", "aten::isnan", "aten::isinf", "aten::isposinf", "aten::isneginf",
          "aten::signbit", "aten::isreal")
class FloatPredicate(_Op):
    """``torch.isfinite`` / ``isnan`` / ``isinf`` / ``isposinf`` / ``isneginf`` / ``signbit`` /
    ``isreal``: a bool tensor (integer and bool inputs are finite, never NaN, and have a sign bit
    only when negative)."""

    def compute(self, x):
        xp = self.xp
        x = self.array(x)
        kind = self.op_type.split("::")[-1]
        if self.is_float(x.dtype):
            if kind == "isfinite":
                return xp.isfinite(x)
            if kind == "isnan":
                return xp.isnan(x)
            if kind == "isinf":
                return xp.isinf(x)
            if kind == "isposinf":
                return x == xp.inf
            if kind == "isneginf":
                return x == -xp.inf
            if kind == "signbit":
                return xp.signbit(x)
            return xp.ones(x.shape, dtype=xp.bool, device=self.device)
        if kind == "signbit" and x.dtype != xp.bool:
            return x < 0
        fill = kind in ("isfinite", "isreal")
        return xp.full(x.shape, fill, dtype=xp.bool, device=self.device)


# -- unary with scalar arguments -------------------------------------------------------------------


@register("aten::logit")
class Logit(_Op):
    """``torch.logit(x, eps)``: log(x / (1 - x)), x first clamped to [eps, 1 - eps] (torch's order:
    below eps gives eps, else above 1 - eps gives 1 - eps) unless eps is None."""

    slots = ("input", "eps")

    def compute(self, x, eps=None):
        xp = self.xp
        x = self.as_float(self.array(x))
        eps = self.scalar(eps, "eps", allow_none=True)
        if eps is not None:
            lo, hi = float(eps), 1.0 - float(eps)
            x = xp.where(x < lo, lo, xp.where(x > hi, hi, x))
        return xp.log(x / (1.0 - x))


@register("aten::mvlgamma")
class MvLGamma(_Op):
    """``torch.mvlgamma(x, p)``: the multivariate log-gamma, sum of lgamma(x - i/2) for i < p plus
    p (p - 1) / 4 log(pi); p >= 1."""

    slots = ("input", "p")
    required = 2

    def compute(self, x, p):
        p = self.scalar(p, "p")
        if isinstance(p, float) or p < 1:
            raise LayerParameterError(f"{self.who}: p must be an integer >= 1, found {p!r}")

        def fn(v, xp):
            total = None
            for i in range(p - 1, -1, -1):  # torch sums from x - (p-1)/2 up to x
                term = lgamma(v - 0.5 * i, xp)
                total = term if total is None else total + term
            return total + p * (p - 1) / 4.0 * _LOG_PI

        return self.via64(fn, x)


@register("aten::clamp_min", "aten::clamp_max")
class ClampOne(_Op):
    """``x.clamp_min(v)`` / ``x.clamp_max(v)``: max(x, v) / min(x, v) against a number or a
    (broadcast) tensor, in torch's promoted dtype; NaN in either propagates."""

    slots = ("input", "bound")
    required = 2

    def compute(self, x, v):
        xp = self.xp
        x = self.array(x)
        is_min = self.op_type.endswith("clamp_min")
        if isinstance(v, _SCALARS) or v.ndim == 0:
            if isinstance(v, bool) or (not isinstance(v, _SCALARS) and v.dtype == xp.bool):
                if x.dtype == xp.bool:
                    raise ShapeError(f"{self.who}: clamp of a bool tensor by a bool (torch raises too)")
        dt, (x, v) = self.promote(x, v)
        if dt == xp.bool:
            return xp.logical_or(x, v) if is_min else xp.logical_and(x, v)
        return xp.maximum(x, v) if is_min else xp.minimum(x, v)


@register("aten::nan_to_num")
class NanToNum(_Op):
    """``torch.nan_to_num(x, nan, posinf, neginf)``: NaN, +inf and -inf replaced (defaults 0 and
    the dtype's largest / lowest finite value); integer and bool tensors come back unchanged."""

    slots = ("input", "nan", "posinf", "neginf")

    def compute(self, x, nan=None, posinf=None, neginf=None):
        xp = self.xp
        x = self.array(x)
        if not self.is_float(x.dtype):
            return x
        fi = xp.finfo(x.dtype)
        nan = self.scalar(nan, "nan", allow_none=True)
        posinf = self.scalar(posinf, "posinf", allow_none=True)
        neginf = self.scalar(neginf, "neginf", allow_none=True)
        vals = [0.0 if nan is None else float(nan), float(fi.max) if posinf is None else float(posinf),
                float(fi.min) if neginf is None else float(neginf)]
        # each replacement rounded to the dtype, as torch's cast (overflow gives +-inf)
        n, p, m = (xp.asarray(v, dtype=xp.float64, device=self.device) for v in vals)
        n, p, m = (xp.astype(a, x.dtype) for a in (n, p, m))
        y = xp.where(xp.isnan(x), n, x)
        y = xp.where(x == xp.inf, p, y)
        return xp.where(x == -xp.inf, m, y)


# -- binary ---------------------------------------------------------------------------------------


class _Binary(_Op):
    slots = ("input", "other")
    required = 2


@register("aten::special_zeta")
class Zeta(_Binary):
    """``torch.special.zeta(x, q)``: the Hurwitz zeta function sum_k (q + k)^-x, elementwise (in
    float64, rounded to torch's result dtype; integers give float32), with torch's domain: +inf
    at x = 1 and at the poles q = 0, -1, ...; NaN for x < 1 and for a negative non-integer q with
    a non-integer x. q below POLYGAMMA_MIN_X is refused (the sum steps up from q one unit at a
    time)."""

    def compute(self, x, q):
        xp = self.xp
        dt, (x, q) = self.promote(x, q, floating=True)
        x64, q64 = self.widen(x), self.widen(q)
        x64, q64 = xp.broadcast_arrays(x64, q64)
        q_int = q64 == xp.floor(q64)
        pole = (q64 <= 0.0) & q_int
        if q64.size and bool(xp.any((q64 < POLYGAMMA_MIN_X) & ~q_int & xp.isfinite(q64))):
            raise ShapeError(f"{self.who}: q below {POLYGAMMA_MIN_X:g} is not supported (the series steps up "
                             "from q one unit at a time)")
        ok = (x64 > 1.0) & xp.isfinite(x64)
        y = hurwitz_zeta(xp.where(ok, x64, 2.0), xp.where(pole, 1.0, q64), xp)
        y = xp.where((q64 <= 0.0) & ~q_int & (x64 != xp.floor(x64)), xp.nan, y)
        y = xp.where(pole, xp.inf, y)
        # x = +inf as torch's loop ends it: 1 at q = 1, NaN above, +inf below (a term 0^-inf)
        at_inf = xp.where(q64 > 1.0, xp.nan, xp.where(q64 == 1.0, xp.ones_like(y), xp.inf))
        y = xp.where(x64 == xp.inf, at_inf, y)
        y = xp.where(x64 < 1.0, xp.nan, y)
        y = xp.where(x64 == 1.0, xp.inf, y)
        y = xp.where((xp.isnan(x64) & ~pole) | xp.isnan(q64), xp.nan, y)  # (a pole is +inf even then)
        return y if dt == xp.float64 else xp.astype(y, dt)


@register("aten::hypot")
class Hypot(_Binary):
    """``torch.hypot(a, b)``: sqrt(a^2 + b^2) without overflow (floating tensors only)."""

    def compute(self, a, b):
        dt, (a, b) = self.promote(a, b)
        self.need_float(dt, "hypot")
        return self.xp.hypot(a, b)


@register("aten::copysign")
class CopySign(_Binary):
    """``torch.copysign(a, b)``: |a| with the sign of b (integers give float32)."""

    def compute(self, a, b):
        _, (a, b) = self.promote(a, b, floating=True)
        return self.xp.copysign(a, b)


@register("aten::nextafter")
class NextAfter(_Binary):
    """``torch.nextafter(a, b)``: the next floating-point value after a towards b."""

    def compute(self, a, b):
        dt, (a, b) = self.promote(a, b)
        self.need_float(dt, "nextafter")
        return self.xp.nextafter(a, b)


@register("aten::fmin", "aten::fmax")
class FMinMax(_Binary):
    """``torch.fmin`` / ``torch.fmax``: elementwise min / max that ignores a NaN in one operand."""

    def compute(self, a, b):
        xp = self.xp
        dt, (a, b) = self.promote(a, b)
        is_min = self.op_type.endswith("fmin")
        if dt == xp.bool:
            return xp.logical_and(a, b) if is_min else xp.logical_or(a, b)
        m = xp.minimum(a, b) if is_min else xp.maximum(a, b)
        if not self.is_float(dt):
            return m
        return xp.where(xp.isnan(a), b, xp.where(xp.isnan(b), a, m))


@register("aten::float_power")
class FloatPower(_Binary):
    """``torch.float_power(a, b)``: a ** b in float64."""

    def compute(self, a, b):
        xp = self.xp
        vals = []
        for v in (a, b):
            if isinstance(v, _SCALARS):
                vals.append(float(v))
            else:
                v = self.array(v)
                vals.append(v if v.dtype == xp.float64 else xp.astype(v, xp.float64))
        if all(isinstance(v, float) for v in vals):
            raise ShapeError(f"{self.who}: needs at least one tensor")
        return xp.pow(*vals)


@register("aten::logaddexp2")
class LogAddExp2(_Binary):
    """``torch.logaddexp2(a, b)``: log2(2^a + 2^b), computed stably (floating tensors only)."""

    def compute(self, a, b):
        xp = self.xp
        dt, (a, b) = self.promote(a, b)
        self.need_float(dt, "logaddexp2")
        m = xp.maximum(a, b)
        d = xp.abs(a - b)
        y = m + xp.log1p(xp.pow(2.0, -xp.where(xp.isnan(d), 0.0, d))) * (1.0 / math.log(2.0))
        same_inf = xp.isinf(a) & (a == b)
        return xp.where(same_inf, a, xp.where(xp.isnan(d), a - b, y))


@register("aten::ldexp")
class Ldexp(_Binary):
    """``torch.ldexp(x, e)``: x * 2^e, in the float dtype of x and 2^e (integers give float32)."""

    def compute(self, x, e):
        xp = self.xp
        if not isinstance(e, _SCALARS):
            e = self.as_float(self.array(e, "exponent"))
        p = xp.pow(2.0, e) if not isinstance(e, _SCALARS) else 2.0 ** float(e)
        _, (x, p) = self.promote(x, p, floating=True)
        return x * p


@register("aten::xlogy", "aten::special_xlog1py")
class XLogY(_Binary):
    """``torch.xlogy(x, y)`` = x log(y) / ``torch.special.xlog1py(x, y)`` = x log1p(y): 0 where x is
    0 (unless y is NaN); integers give float32."""

    def compute(self, x, y):
        xp = self.xp
        _, (x, y) = self.promote(x, y, floating=True)
        log = xp.log1p if self.op_type.endswith("xlog1py") else xp.log
        r = x * log(y)
        r = xp.where(x == 0, xp.zeros_like(r), r)
        return xp.where(xp.isnan(y), y + xp.zeros_like(r), r)


@register("aten::isclose")
class IsClose(_Op):
    """``torch.isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False)`` as torch computes it: equal
    values (infinities too), NaN pairs where ``equal_nan``, else ``|a - b| <= atol + |rtol * b|``
    for a finite difference, in the tensors' float dtype (integers in float32); both tensors of
    one dtype, as torch requires."""

    slots = ("input", "other", "rtol", "atol", "equal_nan")
    required = 2

    def compute(self, a, b, rtol, atol, equal_nan):
        xp = self.xp
        a, b = self.array(a), self.array(b, "other")
        if a.dtype != b.dtype:
            raise ShapeError(f"{self.who}: isclose of tensors of different dtypes ({dtype_name(a.dtype)}, "
                             f"{dtype_name(b.dtype)}); torch raises too")
        rtol = 1e-05 if rtol is None else float(self.scalar(rtol, "rtol"))
        atol = 1e-08 if atol is None else float(self.scalar(atol, "atol"))
        if rtol < 0 or atol < 0:
            raise ShapeError(f"{self.who}: rtol ({rtol}) and atol ({atol}) must be non-negative")
        close = a == b
        floating = self.is_float(a.dtype)
        if floating and equal_nan is not None and bool(self.scalar(equal_nan, "equal_nan")):
            close = close | (xp.isnan(a) & xp.isnan(b))
        if rtol == 0 and atol == 0:
            return close
        if not floating:
            a, b = xp.astype(a, xp.float32), xp.astype(b, xp.float32)
        actual = xp.abs(a - b)
        return close | (xp.isfinite(actual) & (actual <= atol + xp.abs(rtol * b)))


@register("aten::heaviside")
class Heaviside(_Binary):
    """``torch.heaviside(x, values)``: 0 where x < 0 (and NaN), values where x == 0, 1 where x > 0;
    both tensors of one dtype, as torch requires."""

    def compute(self, x, values):
        xp = self.xp
        x = self.array(x)
        values = self.array(values, "values")
        if x.dtype != values.dtype:
            raise ShapeError(f"{self.who}: heaviside of tensors of different dtypes ({dtype_name(x.dtype)}, "
                             f"{dtype_name(values.dtype)}); torch raises too")
        step = xp.astype(x > 0, x.dtype) if x.dtype != xp.bool else x
        return xp.where(x == 0 if x.dtype != xp.bool else ~x, values, step)


@register("aten::gcd", "aten::lcm")
class GcdLcm(_Binary):
    """``torch.gcd(a, b)`` / ``torch.lcm(a, b)`` of integer tensors: non-negative, gcd(0, 0) = 0
    and lcm with a 0 is 0, as torch. Euclid's algorithm on whole tensors (at most ~92 steps for
    int64, each one remainder)."""

    def compute(self, a, b):
        xp = self.xp
        dt, (a, b) = self.promote(a, b)
        if dt == xp.bool or not xp.isdtype(dt, "integral"):
            raise ShapeError(f"{self.who}: gcd / lcm are not defined for {dtype_name(dt)} tensors (torch raises too)")
        a, b = xp.broadcast_arrays(a, b)
        x, y = xp.abs(a), xp.abs(b)
        zero, one = xp.zeros_like(y), xp.ones_like(y)
        while bool(xp.any(y != 0)):
            nz = y != 0
            x, y = xp.where(nz, y, x), xp.where(nz, x % xp.where(nz, y, one), zero)
        if self.op_type.endswith("gcd"):
            return x
        return xp.where(x == 0, zero, xp.abs(a // xp.where(x == 0, one, x) * b))


@register("torch.bitwise_left_shift", "torch.bitwise_right_shift")
class Shift(_Binary):
    """``torch.bitwise_left_shift`` / ``bitwise_right_shift`` of integer tensors, with torch's rules
    for out-of-range counts: a negative count or one >= the bit width gives 0 (left), the sign
    fill (right, signed) or 0 (right, unsigned); left shifts wrap around."""

    def compute(self, a, b):
        xp = self.xp
        dt, (a, b) = self.promote(a, b)
        if dt == xp.bool or not xp.isdtype(dt, "integral"):
            raise ShapeError(f"{self.who}: shifts are not defined for {dtype_name(dt)} tensors (torch raises too)")
        bits = xp.iinfo(dt).bits
        signed = xp.isdtype(dt, "signed integer")
        bad = (b < 0) | (b >= bits) if signed else b >= bits
        cnt = xp.where(bad, xp.zeros_like(b), b)
        zero = xp.zeros_like(a)
        if self.op_type.endswith("left_shift"):
            return xp.where(bad, zero, xp.bitwise_left_shift(a, cnt))
        fill = xp.bitwise_right_shift(a, xp.full_like(b, bits - 1)) if signed else zero
        return xp.where(bad, fill, xp.bitwise_right_shift(a, cnt))


# -- ternary --------------------------------------------------------------------------------------


@register("aten::lerp")
class Lerp(_Op):
    """``torch.lerp(start, end, weight)``: start + weight (end - start) as torch computes it
    (from end when |weight| >= 0.5); start and end of one floating dtype, weight a number or a
    tensor of that dtype (a 0-d tensor of another float dtype is cast)."""

    slots = ("input", "end", "weight")
    required = 3

    def compute(self, start, end, w):
        xp = self.xp
        start, end = self.array(start), self.array(end, "end")
        if start.dtype != end.dtype:
            raise ShapeError(f"{self.who}: start and end must have one dtype, found {dtype_name(start.dtype)} "
                             f"and {dtype_name(end.dtype)} (torch raises too)")
        self.need_float(start.dtype, "lerp")
        if not isinstance(w, _SCALARS):
            w = self.array(w, "weight")
            if w.ndim == 0 and self.is_float(w.dtype) and w.dtype != start.dtype:
                w = xp.astype(w, start.dtype)
            if w.dtype != start.dtype:
                raise ShapeError(f"{self.who}: weight must have dtype {dtype_name(start.dtype)}, found "
                                 f"{dtype_name(w.dtype)} (torch raises too)")
        diff = end - start
        if isinstance(w, _SCALARS):
            w = float(w)
            return start + w * diff if abs(w) < 0.5 else end - diff * (1.0 - w)
        return xp.where(xp.abs(w) < 0.5, start + w * diff, end - diff * (1.0 - w))


@register("aten::addcmul", "aten::addcdiv")
class AddCMulDiv(_Op):
    """``torch.addcmul(x, t1, t2, value)`` = x + value * t1 * t2 and ``torch.addcdiv`` =
    x + value * t1 / t2 (value cast to the result dtype; addcdiv of integer t1 and t2 is refused,
    as in torch)."""

    slots = ("input", "tensor1", "tensor2", "value")
    required = 3

    def compute(self, x, t1, t2, value=1):
        xp = self.xp
        value = self.scalar(1 if value is None else value, "value")
        is_div = self.op_type.endswith("addcdiv")
        t1, t2 = self.array(t1, "tensor1"), self.array(t2, "tensor2")
        if is_div and not self.is_float(t1.dtype) and not self.is_float(t2.dtype):
            raise ShapeError(f"{self.who}: integer division with addcdiv is not supported (torch raises too)")
        dt, (x, t1, t2) = self.promote(x, t1, t2)
        if dt == xp.bool:
            raise ShapeError(f"{self.who}: not defined for bool tensors (torch raises too)")
        v = float(value) if self.is_float(dt) else int(value)
        scaled = t1 * v if v != 1 else t1
        return x + (scaled / t2 if is_div else scaled * t2)
