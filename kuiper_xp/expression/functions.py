"""Elementwise functions the Array API standard lacks, written portably over ``xp``.

``erf(x, xp)`` is W. J. Cody's rational Chebyshev approximation (SPECFUN ``CALERF``, public
domain): |error| < 1e-15 relative in float64, within a few float32 ulp in float32, far below the
1e-6 absolute error a float32 model needs. Numpy arrays are routed to one fast path
(:func:`kuiper_xp.backends.numpy_fast.expr_erf`), which evaluates each range only where it applies.
"""

from __future__ import annotations

import math
import operator
from typing import Any

__all__ = [
    "erf", "erf_generic", "fmod", "ArrayOps", "BINARY", "UNARY", "CASTS", "SIGNATURES", "OpError",
]

# W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23 (1969),
# coefficients as in SPECFUN CALERF.
CODY_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
          3.20937758913846947e03, 1.85777706184603153e-1)
CODY_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)
CODY_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
          2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
          2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
CODY_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
          1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
          3.43936767414372164e03, 1.23033935480374942e03)
CODY_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
          1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
CODY_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
          6.05183413124413191e-2, 2.33520497626869185e-3)
SQRT_1_PI = 5.6418958354775628695e-1
THRESH = 0.46875


def _small(x: Any) -> Any:
    """erf(x) for |x| <= 0.46875."""
    a, b = CODY_A, CODY_B
    z = x * x
    num = a[4] * z
    den = z
    for i in range(3):
        num = (num + a[i]) * z
        den = (den + b[i]) * z
    return x * (num + a[3]) / (den + b[3])


def erfcx_mid(y: Any) -> Any:
    """erfcx(y) = exp(y^2) erfc(y) for 0.46875 <= y <= 4 (Cody's rational form)."""
    c, d = CODY_C, CODY_D
    num = c[8] * y
    den = y
    for i in range(7):
        num = (num + c[i]) * y
        den = (den + d[i]) * y
    return (num + c[7]) / (den + d[7])


def erfcx_large(y: Any) -> Any:
    """erfcx(y) for y >= 4 (Cody; y may be +inf)."""
    p, q = CODY_P, CODY_Q
    z = 1.0 / (y * y)
    num = p[5] * z
    den = z
    for i in range(4):
        num = (num + p[i]) * z
        den = (den + q[i]) * z
    r = z * (num + p[4]) / (den + q[4])
    return (SQRT_1_PI - r) / y


def _erfc_mid(y: Any, xp: Any) -> Any:
    """erfc(y) for 0.46875 < y <= 4 (y >= 0)."""
    return _scale_exp(y, erfcx_mid(y), xp)


def _erfc_large(y: Any, xp: Any) -> Any:
    """erfc(y) for y > 4."""
    return _scale_exp(y, erfcx_large(y), xp)


def _scale_exp(y: Any, r: Any, xp: Any) -> Any:
    # exp(-y*y) split as exp(-ysq*ysq) * exp(-(y-ysq)(y+ysq)) with ysq = trunc(16 y)/16, which keeps
    # the rounding error of y*y out of the exponent (Cody's trick).
    ysq = xp.trunc(y * 16.0) / 16.0
    return xp.exp(-ysq * ysq) * xp.exp(-(y - ysq) * (y + ysq)) * r


def _float_dtype(x: Any, xp: Any) -> Any:
    """torch's result dtype for a unary float function: ints/bools become float32."""
    if xp.isdtype(x.dtype, ("real floating", "complex floating")):
        return x.dtype
    return xp.float32


def erf_generic(x: Any, xp: Any) -> Any:
    """The Array-API reference: every range evaluated on the whole array, then selected."""
    dt = _float_dtype(x, xp)
    if x.dtype != dt:
        x = xp.astype(x, dt)
    low = x.dtype == xp.float16 if hasattr(xp, "float16") else False
    if low:
        x = xp.astype(x, xp.float32)
    y = xp.abs(x)
    small = _small(xp.clip(x, -THRESH, THRESH))
    big4 = y > 4.0
    # clamp the argument of each branch into its range so no branch overflows or divides by 0
    ym = xp.clip(y, THRESH, 4.0)
    erfc = _erfc_mid(ym, xp)
    if x.dtype == xp.float64:
        yl = xp.clip(y, 4.0, 30.0)  # erfc(27.3) underflows to 0 in float64
        erfc = xp.where(big4, _erfc_large(yl, xp), erfc)
    else:
        # float32 erf is +-1 from 3.8325069 on, as torch's float32 erf gives it on AVX-512 CPUs
        # (the exact erf rounds to 1 from ~3.9192, where torch gives it on AVX2-only ones): exactly
        # +-1 beyond it
        erfc = xp.where(y >= 3.8325069, xp.zeros_like(erfc), erfc)
    big = (0.5 - erfc) + 0.5
    big = xp.where(x < 0, -big, big)
    out = xp.where(y <= THRESH, small, big)
    # NaN propagates through `small` (y <= THRESH is False for NaN, so take it from x)
    out = xp.where(xp.isnan(x), x, out)
    if low:
        out = xp.astype(out, xp.float16)
    return out


def erf(x: Any, xp: Any) -> Any:
    """torch.erf(x) over the Array API namespace ``xp`` (int/bool inputs give float32).

    Uses the numpy fast path for numpy arrays, the generic implementation otherwise."""
    if type(x).__module__ == "numpy":
        from kuiper_xp.backends import numpy_fast

        fast = getattr(numpy_fast, "expr_erf", None)
        if fast is not None:
            return fast(x)
    return erf_generic(x, xp)


def fmod(x: Any, y: Any, xp: Any) -> Any:
    """torch.fmod for two arrays (or an array and a Python scalar) of one dtype: the remainder with
    the sign of the dividend (C's fmod). Exact: |x| mod |y| is a fmod of non-negative numbers."""
    r = xp.remainder(_abs(x, xp), _abs(y, xp))
    if isinstance(r, (int, float)):  # pragma: no cover - both scalars are handled by the caller
        return math.fmod(x, y)
    if xp.isdtype(r.dtype, "real floating"):
        return xp.copysign(r, x) if not _is_scalar(x) else (r if math.copysign(1.0, x) > 0 else -r)
    return xp.where(x < 0, -r, r) if not _is_scalar(x) else (r if x >= 0 else -r)


# -------------------------------------------------------------------------------------------------
# The language: every function name, its arity, and its implementation on ArrayOps.

#: Binary functions (``add``/``sub`` also take pnnx's old three-argument form ``add(a,b,alpha)``).
BINARY = (
    "add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "atan2", "max", "maximum",
    "min", "minimum", "fmod", "logaddexp", "and", "or", "xor", "lshift", "rshift",
)
#: Unary functions.
UNARY = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "erf", "exp",
    "expm1", "floor", "log", "log10", "log1p", "neg", "reciprocal", "round", "rsqrt", "sign", "sin",
    "sinh", "sqrt", "square", "tan", "tanh", "trunc",
)
#: Casts: pnnx writes ``int(...)`` for aten::Int and ``torch.<dtype>(...)`` for a Tensor.to on a
#: scalar. On a Python scalar they give a Python int/float/bool, on an array ``xp.astype``.
CASTS = {
    "int": "int64", "float": "float32", "bool": "bool",
    "torch.float": "float32", "torch.float32": "float32", "torch.double": "float64",
    "torch.float64": "float64", "torch.half": "float16", "torch.float16": "float16",
    "torch.int": "int32", "torch.int32": "int32", "torch.long": "int64", "torch.int64": "int64",
    "torch.short": "int16", "torch.int16": "int16", "torch.int8": "int8", "torch.uint8": "uint8",
    "torch.bool": "bool",
}
#: name -> (min args, max args)
SIGNATURES: dict[str, tuple[int, int]] = {
    **{n: (2, 2) for n in BINARY}, "add": (2, 3), "sub": (2, 3),
    **{n: (1, 1) for n in UNARY},
    **{n: (1, 1) for n in CASTS},
    "size": (2, 2),
}

# method names on ArrayOps for names that are Python keywords or builtins
_METHOD = {"and": "and_", "or": "or_", "xor": "xor_", "max": "maximum", "min": "minimum",
           "abs": "abs_", "round": "round_", "pow": "pow_"}

_SCALARS = (int, float, bool)
_BOOL, _INT, _FLOAT, _COMPLEX = 0, 1, 2, 3


class OpError(Exception):
    """Raised by an op on bad operands; the evaluator turns it into an ExpressionError with the
    position of the call in the expression."""


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _i64(v: Any, name: str) -> Any:
    """A Python scalar result, checked to fit int64 when it is an int (torch's scalar ints are
    int64; Python's are unbounded, and shape arithmetic must not grow without limit)."""
    if type(v) is int and not _I64_MIN <= v <= _I64_MAX:
        raise OpError(f"{name}: integer result overflows int64")
    return v


#: torch's own forms of ``pow(x, c)`` for these exponents of a float tensor (ATen's
#: pow_tensor_scalar_optimized_kernel): the same bits (for 0.5 numpy's sqrt, as numpy's own
#: ``x ** 0.5``, within an ulp of torch's), and no generic pow per element (numpy's
#: ``x ** 3.0`` took 20 of a GPT-2 block's 40 ms, in its tanh GELU)
_POW_FORMS = {
    2: lambda xp, a: a * a,
    3: lambda xp, a: a * a * a,
    0.5: lambda xp, a: xp.sqrt(a),
    -0.5: lambda xp, a: 1.0 / xp.sqrt(a),
    -1: lambda xp, a: 1.0 / a,
    -2: lambda xp, a: 1.0 / (a * a),
}


def _int_power(a: Any, e: int) -> Any:
    """``a ** e`` for a float array and an integer 4 <= |e| <= 8 by repeated squaring (at most
    4e-7 from the exact power, torch's pow 6e-8; numpy's generic power takes ~50 ns an element
    when the base has negative values: 19.5 ms against torch's 0.5 for x ** 4.0 on 393 Ki)."""
    result = None
    sq = a
    n = abs(e)
    while n:
        if n & 1:
            result = sq if result is None else result * sq
        n >>= 1
        if n:
            sq = sq * sq
    return 1.0 / result if e < 0 else result


def _scalar_pow(a: Any, b: Any) -> Any:
    if type(a) is not float and type(b) is not float:
        a, b = int(a), int(b)
        if b >= 0 and abs(a) > 1 and b > 63:
            raise OpError("pow: integer result overflows int64")
        if b < 0 and a == 0:
            return math.inf
        return _i64(a ** b, "pow")
    try:
        r = a ** b
    except ZeroDivisionError:
        return math.inf
    except OverflowError:
        odd = float(b).is_integer() and int(b) % 2 == 1
        return -math.inf if (a < 0 and odd) else math.inf
    if isinstance(r, complex):
        return math.nan  # a negative base to a fractional power: torch gives nan
    return r


def _is_scalar(v: Any) -> bool:
    return type(v) in _SCALARS


def _abs(v: Any, xp: Any) -> Any:
    return abs(v) if type(v) in _SCALARS else xp.abs(v)


def _scalar_math(name: str, fn: Any, x: Any) -> Any:
    """A float function of a Python scalar, with IEEE results where ``math`` raises."""
    x = float(x)
    try:
        return fn(x)
    except (ValueError, OverflowError, ZeroDivisionError):
        if name in ("log", "log10", "log1p") and x == (-1.0 if name == "log1p" else 0.0):
            return -math.inf
        if name in ("exp", "expm1", "cosh", "sinh"):
            return math.inf if (x > 0 or name == "cosh") else -math.inf
        if name == "atanh" and abs(x) == 1.0:
            return math.copysign(math.inf, x)
        if name == "rsqrt" and x == 0.0:
            return math.copysign(math.inf, x)
        if name == "reciprocal" and x == 0.0:
            return math.copysign(math.inf, x)
        return math.nan


def _int_fmod(a: int, b: int) -> int:
    if b == 0:
        raise OpError("fmod: integer division by zero")
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


def _scalar_logaddexp(a: float, b: float) -> float:
    a, b = float(a), float(b)
    if a == b and math.isinf(a):  # (inf - inf is NaN below; torch gives the infinity)
        return a
    m = max(a, b)
    return m + math.log1p(math.exp(-abs(a - b)))


_SCALAR_FLOAT_FN = {
    "acos": math.acos, "acosh": math.acosh, "asin": math.asin, "asinh": math.asinh,
    "atan": math.atan, "atanh": math.atanh, "cos": math.cos, "cosh": math.cosh, "erf": math.erf,
    "exp": math.exp, "expm1": math.expm1, "log": math.log, "log10": math.log10, "log1p": math.log1p,
    "sin": math.sin, "sinh": math.sinh, "sqrt": math.sqrt, "tan": math.tan, "tanh": math.tanh,
    "reciprocal": lambda x: 1.0 / x, "rsqrt": lambda x: 1.0 / math.sqrt(x),
}
def wrap_int(v: int, info: Any) -> int:
    """``v`` wrapped into the integer range ``info`` (``xp.iinfo``) modulo 2**bits, as torch
    converts a Python int for an integer tensor (``uint8_tensor + 300`` adds 44)."""
    span = info.max - info.min + 1
    return (v - info.min) % span + info.min


def astype_wrapping(xp: Any, x: Any, dtype: Any) -> Any:
    """``x`` cast to ``dtype``; a float array cast to an 8- or 16-bit integer goes through int64,
    so out-of-range values wrap modulo 2**bits as torch's CPU cast does (``-4.0`` to uint8 is 252)
    on every backend: CuPy's direct float-to-uint8 conversion saturates (0)."""
    if x.dtype != dtype and dtype in (xp.int8, xp.uint8, xp.int16) \
            and xp.isdtype(x.dtype, "real floating"):
        x = xp.astype(x, xp.int64)
    return xp.astype(x, dtype)


#: float32 logarithms computed in float64 and rounded (up to LOG_VIA_FLOAT64_MAX elements): torch's
#: float32 log is within an ulp of the correctly rounded value and so is this, but NumPy's
#: float32 log / log10 / log1p differ from torch's on 12% / 40-50% / 8% of random values (the
#: rounded float64 ones on 0.02% / 0.01% / 0.5%), and a one-ulp difference turned into a
#: different integer where a model rounds the result: DeBERTa's log-bucketed relative positions,
#: ``ceil(log(3.5) / log(...) * (mid - 1))``, came out one bucket off.
LOGS_VIA_FLOAT64 = frozenset({"log", "log10", "log1p"})
LOG_VIA_FLOAT64_MAX = 1 << 20
# float functions on arrays: name -> xp attribute (None: written here)
_ARRAY_FLOAT_FN = {
    "acos": "acos", "acosh": "acosh", "asin": "asin", "asinh": "asinh", "atan": "atan",
    "atanh": "atanh", "cos": "cos", "cosh": "cosh", "exp": "exp", "expm1": "expm1", "log": "log",
    "log10": "log10", "log1p": "log1p", "sin": "sin", "sinh": "sinh", "sqrt": "sqrt", "tan": "tan",
    "tanh": "tanh", "erf": None, "reciprocal": None, "rsqrt": None,
}


class ArrayOps:
    """Every function of the language over one namespace ``xp`` and device, with torch's
    semantics and result dtypes. Values are arrays of ``xp`` or Python scalars (int, float, bool);
    an operation on Python scalars only stays a Python scalar (shape arithmetic).

    Type promotion follows torch (c10 ``result_type``): operands are grouped into arrays with
    dimensions, 0-d arrays and Python scalars ("wrapped numbers": bool, int64, float32); a group
    only changes the result when its category (bool < integer < floating) is higher, so
    ``mul(@0,3)`` on float32 stays float32, an int tensor times 2.5 gives float32, and int64 with a
    float32 tensor gives float32. ``div``, ``atan2``, ``logaddexp`` and the float functions turn
    integer results into float32 (torch's default dtype).
    """

    def __init__(self, xp: Any, device: Any = None, fast: Any = None):
        self.xp = xp
        self.device = device
        self.fast = fast
        self.float32 = xp.float32
        self.float64 = xp.float64
        self.int64 = xp.int64
        self.bool_ = xp.bool
        self._cats: dict[Any, int] = {}
        self._pairs: dict[tuple[Any, Any], Any] = {}
        for name, attr in _ARRAY_FLOAT_FN.items():
            if attr is not None:
                setattr(self, name, self._make_float_fn(name, getattr(xp, attr)))
        self.sign_nan_fix = fast is None or not hasattr(fast, "expr_sign")

    _SHARED: dict[tuple, ArrayOps] = {}

    @classmethod
    def shared(cls, xp: Any, device: Any = None, fast: Any = None) -> ArrayOps:
        """One instance per (namespace, device, fast module), made once: its ~30 bound float
        functions took ~130 us to make, for every pnnx.Expression of a model (a Program compiled
        in 233 us, now 84). The instance keeps no per-expression state (its dtype caches are the
        same for every caller)."""
        try:
            key = (id(xp), device, id(fast))
            ops = cls._SHARED.get(key)
        except TypeError:  # (an unhashable device)
            return cls(xp, device, fast)
        if ops is None or ops.xp is not xp or ops.fast is not fast:
            if len(cls._SHARED) >= 64:
                cls._SHARED.clear()
            ops = cls._SHARED[key] = cls(xp, device, fast)
        return ops

    # -- lookup --------------------------------------------------------------------------------
    def function(self, name: str) -> Any:
        """The implementation of the language function ``name``: a callable on values."""
        if name in CASTS:
            return self._make_cast(name)
        return getattr(self, _METHOD.get(name, name))

    # -- dtype rules ---------------------------------------------------------------------------
    def cat(self, dtype: Any) -> int:
        c = self._cats.get(dtype)
        if c is None:
            xp = self.xp
            if dtype == xp.bool:
                c = _BOOL
            elif xp.isdtype(dtype, "integral"):
                c = _INT
            elif xp.isdtype(dtype, "real floating"):
                c = _FLOAT
            else:
                c = _COMPLEX
            self._cats[dtype] = c
        return c

    def promote(self, a: Any, b: Any) -> Any:
        """The dtype of two dtypes together (torch's promoteTypes)."""
        if a == b:
            return a
        key = (a, b)
        r = self._pairs.get(key)
        if r is None:
            ca, cb = self.cat(a), self.cat(b)
            if ca == cb:
                try:
                    r = self.xp.result_type(a, b)
                except (TypeError, ValueError) as exc:
                    raise OpError(f"cannot combine dtypes {a} and {b}: {exc}") from None
            elif {ca, cb} == {_FLOAT, _COMPLEX}:
                # complex64 with float64 gives complex128 (torch keeps the wider precision)
                c, f = (a, b) if ca == _COMPLEX else (b, a)
                r = self.xp.complex128 if f == self.float64 else c
            else:
                r = a if ca > cb else b
            self._pairs[key] = r
        return r

    def complex_of(self, dtype: Any) -> Any:
        """The complex dtype holding the real floating ``dtype`` (torch's toComplexType; float16
        goes to complex64, there being no complex32 in the Array API)."""
        return self.xp.complex128 if dtype == self.float64 else self.xp.complex64

    def _combine(self, higher: Any, lower: Any) -> Any:
        if higher is None:
            return lower
        if lower is None:
            return higher
        ch = self.cat(higher)
        if ch == _COMPLEX:
            return higher
        if self.cat(lower) == _COMPLEX:  # (c10 combine_categories: a float keeps its precision)
            return self.complex_of(higher) if ch == _FLOAT else lower
        if ch >= _FLOAT:
            return higher
        if ch == _BOOL or self.cat(lower) >= _FLOAT:
            return self.promote(higher, lower)
        return higher

    def result_dtype(self, values: Any) -> Any:
        """torch's result dtype of an elementwise op on ``values`` (arrays and Python scalars);
        None when every value is a Python scalar."""
        dim = zero = wrapped = None
        for v in values:
            t = type(v)
            if t in _SCALARS:
                d = self.bool_ if t is bool else self.int64 if t is int else self.float32
                wrapped = d if wrapped is None else self.promote(wrapped, d)
            elif not hasattr(v, "dtype"):
                raise OpError(f"expected an array or a number, got {t.__name__}")
            elif v.ndim == 0:
                zero = v.dtype if zero is None else self.promote(zero, v.dtype)
            else:
                dim = v.dtype if dim is None else self.promote(dim, v.dtype)
        return self._combine(dim, self._combine(zero, wrapped))

    def _to(self, v: Any, dt: Any) -> Any:
        t = type(v)
        if t in _SCALARS:
            c = self.cat(dt)
            if c == _BOOL:
                return v
            if t is bool:
                return int(v) if c == _INT else float(v)
            if t is int and c == _INT:
                info = self.xp.iinfo(dt)
                if not info.min <= v <= info.max:
                    v = wrap_int(v, info)
            return v
        if v.dtype != dt:
            return self.xp.astype(v, dt)
        return v

    def coerce(self, a: Any, b: Any, float_result: bool = False) -> tuple[Any, Any, Any]:
        """``a`` and ``b`` converted so that the Array API operation on them gives torch's dtype."""
        dt = self.result_dtype((a, b))
        if float_result and self.cat(dt) < _FLOAT:
            dt = self.float32
        return self._to(a, dt), self._to(b, dt), dt

    def _ready(self, a: Any, b: Any, float_result: bool = False) -> bool:
        """Whether ``a`` and ``b`` can go to the Array API operation as they are (the fast path)."""
        ta, tb = type(a), type(b)
        if ta in _SCALARS:
            return tb not in _SCALARS and ta is not bool and self.cat(b.dtype) >= _FLOAT
        if tb in _SCALARS:
            return tb is not bool and self.cat(a.dtype) >= _FLOAT
        if a.dtype != b.dtype:
            return False
        c = self._cats.get(a.dtype)
        if c is None:
            c = self.cat(a.dtype)
        return c >= _FLOAT if float_result else c >= _INT

    def _binary(self, op: Any, a: Any, b: Any, float_result: bool = False, bool_op: Any = None,
                name: str = "") -> Any:
        if not self._ready(a, b, float_result):
            a, b, dt = self.coerce(a, b, float_result)
            if self.cat(dt) == _BOOL:
                if bool_op is None:
                    raise OpError(f"{name} is not defined for bool operands (torch raises too)")
                return bool_op(a, b)
        return op(a, b)

    @staticmethod
    def _both_scalars(a: Any, b: Any) -> bool:
        return type(a) in _SCALARS and type(b) in _SCALARS

    # -- binary --------------------------------------------------------------------------------
    def add(self, a: Any, b: Any, alpha: Any = None) -> Any:
        if alpha is not None:
            b = self.mul(b, alpha)
        if type(a) is not bool and type(b) is not bool and self._both_scalars(a, b):
            return _i64(a + b, "add")
        return self._binary(operator.add, a, b, False, self.xp.logical_or)

    def sub(self, a: Any, b: Any, alpha: Any = None) -> Any:
        if alpha is not None:
            b = self.mul(b, alpha)
        if self._both_scalars(a, b):
            return _i64(a - b, "sub")
        return self._binary(operator.sub, a, b, name="sub")

    def mul(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            return _i64(a * b, "mul")
        return self._binary(operator.mul, a, b, False, self.xp.logical_and)

    def div(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            if b == 0:
                return math.copysign(math.inf, a) if a != 0 else math.nan
            return a / b
        return self._binary(operator.truediv, a, b, True)

    def floor_divide(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            if b == 0:
                raise OpError("floor_divide: division by zero")
            return _i64(a // b, "floor_divide")
        return self._int_divmod(operator.floordiv, "floor_divide", a, b)

    def remainder(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            if b == 0:
                raise OpError("remainder: division by zero")
            return a % b
        r = self._int_divmod(operator.mod, "remainder", a, b)
        xp = self.xp
        if not _is_scalar(r) and xp.isdtype(r.dtype, "real floating"):
            # a zero remainder takes the dividend's sign in torch (fmod, then + b where the signs
            # differ), the divisor's in numpy: 1 / remainder(-1.5, 0.5) is -inf in torch
            if _is_scalar(a):
                zero = -0.0 if math.copysign(1.0, a) < 0 else 0.0
            else:
                zero = xp.copysign(xp.zeros_like(r), a if xp.isdtype(a.dtype, "real floating")
                                   else xp.astype(a, r.dtype))
            r = xp.where(r == 0, zero, r)
        return r

    def _int_divmod(self, op: Any, name: str, a: Any, b: Any) -> Any:
        if not self._ready(a, b):
            a, b, dt = self.coerce(a, b)
            if self.cat(dt) == _BOOL:
                raise OpError(f"{name} is not defined for bool operands (torch raises too)")
            if self.cat(dt) == _INT and type(b) is int and b == 0:
                raise OpError(f"{name}: integer division by zero (torch raises ZeroDivisionError)")
        return op(a, b)

    def pow_(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            return _scalar_pow(a, b)
        if not self._ready(a, b):
            a, b, dt = self.coerce(a, b)
            c = self.cat(dt)
            if c == _INT and type(b) is int and b < 0:
                raise OpError("integers to negative integer powers are not allowed (as in torch.pow)")
            if c == _BOOL and type(b) is not bool:
                raise OpError("pow is not defined for bool operands (torch raises too)")
        else:
            c = self.cat(b.dtype if type(b) not in _SCALARS else a.dtype)
        if c == _BOOL:  # (a bool tensor ** True / False is bool in torch; numpy gives int8)
            if type(b) is bool and type(a) not in _SCALARS:
                return a if b else self.xp.ones_like(a, dtype=self.xp.bool)
            raise OpError("pow of a bool exponent tensor is not implemented (torch raises too)")
        if c == _INT and type(b) not in _SCALARS:
            return self._int_pow(a, b)
        if type(b) in (int, float) and type(a) not in _SCALARS and str(a.dtype).endswith(("float32", "float64")):
            if b in _POW_FORMS:
                return _POW_FORMS[b](self.xp, a)
            if b == int(b) and 4 <= abs(b) <= 8:
                return _int_power(a, int(b))
        return a ** b

    def _int_pow(self, a: Any, b: Any) -> Any:
        """Integer power with an integer array exponent: torch gives 1 for base 1, +-1 for base
        -1 and 0 otherwise where the exponent is negative (numpy raises instead)."""
        xp = self.xp
        neg = b < 0
        r = a ** xp.where(neg, xp.zeros_like(b), b)
        one = xp.ones_like(r)
        zero = xp.zeros_like(r)
        minus = xp.where(b % 2 == 0, one, -one)
        if type(a) in _SCALARS:
            special = one if a == 1 else minus if a == -1 else zero
        else:
            special = xp.where(a == 1, one, xp.where(a == -1, minus, zero))
        return xp.where(neg, special, r)

    def atan2(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            return math.atan2(a, b)
        return self._binary(self.xp.atan2, a, b, True)

    def maximum(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            return a if (a != a or a >= b) else b
        return self._binary(self.xp.maximum, a, b, False, self.xp.logical_or)

    def minimum(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            return a if (a != a or a <= b) else b
        return self._binary(self.xp.minimum, a, b, False, self.xp.logical_and)

    def fmod(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            if type(a) is float or type(b) is float:
                return math.fmod(a, b) if b != 0 else math.nan
            return _int_fmod(int(a), int(b))
        a, b, dt = self.coerce(a, b)
        c = self.cat(dt)
        if c == _BOOL:
            raise OpError("fmod is not defined for bool operands (torch raises too)")
        if c == _INT and type(b) is int and b == 0:
            raise OpError("fmod: integer division by zero (torch raises ZeroDivisionError)")
        if self.fast is not None and hasattr(self.fast, "expr_fmod"):
            return self.fast.expr_fmod(a, b)
        return fmod(a, b, self.xp)

    def logaddexp(self, a: Any, b: Any) -> Any:
        if self._both_scalars(a, b):
            return _scalar_logaddexp(a, b)
        return self._binary(self.xp.logaddexp, a, b, True)

    def _bitwise(self, op: Any, name: str, a: Any, b: Any, allow_bool: bool = True) -> Any:
        if not allow_bool and type(b) is int and b < 0:
            raise OpError(f"{name}: negative shift count {b}")
        if self._both_scalars(a, b):
            if type(a) is float or type(b) is float:
                raise OpError(f"{name} needs integer or bool operands, got {a!r} and {b!r}")
            if op is operator.lshift and a != 0 and b > 63:
                raise OpError(f"{name}: integer result overflows int64")
            return _i64(op(a, b), name)
        a, b, dt = self.coerce(a, b)
        c = self.cat(dt)
        if c >= _FLOAT or (c == _BOOL and not allow_bool):
            raise OpError(f"{name} is not defined for {dt} operands (torch raises too)")
        return op(a, b)

    def and_(self, a: Any, b: Any) -> Any:
        return self._bitwise(operator.and_, "and", a, b)

    def or_(self, a: Any, b: Any) -> Any:
        return self._bitwise(operator.or_, "or", a, b)

    def xor_(self, a: Any, b: Any) -> Any:
        return self._bitwise(operator.xor, "xor", a, b)

    def lshift(self, a: Any, b: Any) -> Any:
        return self._bitwise(operator.lshift, "lshift", a, b, allow_bool=False)

    def rshift(self, a: Any, b: Any) -> Any:
        return self._bitwise(operator.rshift, "rshift", a, b, allow_bool=False)

    # -- unary ---------------------------------------------------------------------------------
    def _as_float(self, x: Any) -> Any:
        if self.cat(x.dtype) < _FLOAT:
            return self.xp.astype(x, self.float32)
        return x

    def _make_float_fn(self, name: str, fn: Any) -> Any:
        sfn = _SCALAR_FLOAT_FN[name]
        cat, cats, f32, f64, astype = self.cat, self._cats, self.float32, self.float64, self.xp.astype
        rounded = name in LOGS_VIA_FLOAT64

        def unary(x: Any) -> Any:
            if type(x) in _SCALARS:
                return _scalar_math(name, sfn, x)
            c = cats.get(x.dtype)
            if c is None:
                c = cat(x.dtype)
            if c < _FLOAT:
                x = astype(x, f32)
            if rounded and x.dtype == f32 and math.prod(x.shape) <= LOG_VIA_FLOAT64_MAX:
                return astype(fn(astype(x, f64)), f32)
            return fn(x)

        unary.__name__ = name
        return unary

    def erf(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return math.erf(x)
        x = self._as_float(x)
        if self.fast is not None and hasattr(self.fast, "expr_erf"):
            return self.fast.expr_erf(x)
        return erf_generic(x, self.xp)

    def reciprocal(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return _scalar_math("reciprocal", _SCALAR_FLOAT_FN["reciprocal"], x)
        return 1.0 / self._as_float(x)

    def rsqrt(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return _scalar_math("rsqrt", _SCALAR_FLOAT_FN["rsqrt"], x)
        return 1.0 / self.xp.sqrt(self._as_float(x))

    def _no_bool(self, name: str, x: Any) -> None:
        if self.cat(x.dtype) == _BOOL:
            raise OpError(f"{name} is not defined for bool arrays (torch raises too)")

    def abs_(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return _i64(abs(x), "abs") if type(x) is not bool else x
        self._no_bool("abs", x)
        return self.xp.abs(x)

    def neg(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return _i64(-x, "neg")
        self._no_bool("neg", x)
        return -x

    def sign(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            if type(x) is float:
                return 0.0 if (x == 0 or x != x) else math.copysign(1.0, x)
            return (x > 0) - (x < 0) if type(x) is int else x
        c = self.cat(x.dtype)
        if c == _BOOL:
            return x
        if c == _FLOAT:
            if self.fast is not None and hasattr(self.fast, "expr_sign"):
                return self.fast.expr_sign(x)
            xp = self.xp
            s = xp.sign(x)
            return xp.where(xp.isnan(x), xp.zeros_like(s), s)  # torch.sign(nan) == 0
        return self.xp.sign(x)

    def square(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return int(x) * int(x) if type(x) is bool else _i64(x * x, "square")
        if self.cat(x.dtype) == _BOOL:
            x = self.xp.astype(x, self.int64)
        return x * x

    def _rounding(self, name: str, x: Any, sfn: Any) -> Any:
        if type(x) in _SCALARS:
            return float(sfn(x)) if type(x) is float and math.isfinite(x) else x
        c = self.cat(x.dtype)
        if c == _BOOL:
            raise OpError(f"{name} is not defined for bool arrays (torch raises too)")
        if c == _INT:
            return x  # torch keeps integers as they are
        return getattr(self.xp, name)(x)

    def ceil(self, x: Any) -> Any:
        return self._rounding("ceil", x, math.ceil)

    def floor(self, x: Any) -> Any:
        return self._rounding("floor", x, math.floor)

    def trunc(self, x: Any) -> Any:
        return self._rounding("trunc", x, math.trunc)

    def round_(self, x: Any) -> Any:
        return self._rounding("round", x, round)  # round(): half to even, as torch.round

    # -- shapes and casts ----------------------------------------------------------------------
    def size(self, x: Any, dim: Any) -> int:
        if type(x) in _SCALARS or not hasattr(x, "shape"):
            raise OpError(f"size() needs an array as first argument, got {type(x).__name__}")
        if type(dim) is not int:
            raise OpError(f"size() needs an integer dimension, got {dim!r}")
        shape = x.shape
        if not -len(shape) <= dim < len(shape):
            raise OpError(f"size(): dimension {dim} is out of range for an array of shape {tuple(shape)}")
        n = shape[dim]
        if n is None:
            raise OpError(f"size(): dimension {dim} of the array is unknown (lazy array)")
        return int(n)

    def _make_cast(self, name: str) -> Any:
        target = CASTS[name]
        py = int if target.startswith(("int", "uint")) else bool if target == "bool" else float
        xp = self.xp
        dtype = getattr(xp, target, None)
        to_scalar = name in ("int", "float", "bool")

        def to_py(x: Any) -> Any:
            try:
                return _i64(py(x), name)
            except (ValueError, OverflowError) as exc:
                raise OpError(f"{name}(): cannot convert {x!r}: {exc}") from None

        def cast(x: Any) -> Any:
            if type(x) in _SCALARS:
                return to_py(x)
            if to_scalar:
                if getattr(x, "ndim", 1) != 0:
                    raise OpError(f"{name}() needs a number or a 0-d array, got an array of shape "
                                  f"{tuple(x.shape)}")
                return to_py(x)
            if dtype is None:
                raise OpError(f"{name}: dtype {target} is not available in this array library")
            return astype_wrapping(xp, x, dtype) if x.dtype != dtype else x

        cast.__name__ = name.replace(".", "_")
        return cast
