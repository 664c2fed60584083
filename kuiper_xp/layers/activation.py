"""Activation layers: elementwise nonlinearities, clamps, softmax and friends.

Every layer keeps the input's floating dtype (an integer input to a transcendental function
becomes float32, as in torch), and never makes float64 intermediates: Python scalars mixed with
an array take the array's dtype under the Array API's promotion rules, and the constants handed
to ``xp.maximum``/``xp.where`` are 0-d arrays of the input's dtype. NaN and +-Inf come out as
torch's CPU kernels give them (``hardswish(-inf)`` is NaN, ``hardsigmoid(nan)`` is NaN,
``relu6(inf)`` is 6); the tests check each against torch.

The hot activations are written with ``clip``/``maximum``/``minimum`` (which propagate NaN, per
the standard) rather than ``where`` over a data-dependent mask: on NumPy a masked select over
random signs is 5 to 10 times slower than the arithmetic form.
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.expression.functions import wrap_int

from .base import BuildContext, Layer
from .misc import promote
from .registry import register

__all__ = [
    "ReLU", "Sigmoid", "Clamp", "LeakyReLU", "PReLU", "ELU", "CELU", "SELU", "SiLU", "Hardswish",
    "Hardsigmoid", "Tanh", "GELU", "Mish", "Softplus", "Softmax", "LogSoftmax", "Threshold",
    "Hardshrink", "Softshrink", "Tanhshrink", "LogSigmoid", "Softsign", "GLU",
]

_EXP_LIMITS: dict[Any, float] = {}  # per dtype
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_SQRT1_2 = 0.70710678118654752440
_SQRT_2_PI = 0.79788456080286535588  # sqrt(2 / pi)


#: (dtype's type, dtype) -> whether it is a real floating dtype (``xp.isdtype``), filled as met
_REAL_FLOATING: dict[tuple, bool] = {}

class _Unary(Layer):
    """Shared helpers: 0-d constants of the input's dtype, float promotion of integer input."""

    #: the name of this activation in the backend's fast elementwise kernels, if it has one
    fast_name: str | None = None

    def __init__(self, ctx: BuildContext):
        super().__init__(ctx)
        self._consts: dict[tuple[Any, Any], Any] = {}  # (value, dtype) -> 0-d array
        fast = ctx.fast
        names = getattr(fast, "UNARY_ACTIVATIONS", ())
        self._fast_unary = getattr(fast, "unary", None) if self.fast_name in names else None
        self._fast_clamp = getattr(fast, "clamp", None)  # float (lo, hi) -> fresh pooled array, or None

    def _fast(self, x: Any) -> Any:
        """The backend's fast kernel for this activation on a float32/float64 input, or None."""
        xp = self.xp
        if self._fast_unary is not None and x.dtype in (xp.float32, xp.float64):
            return self._fast_unary(self.fast_name, x)
        return None

    def fusion_spec(self) -> Any:
        """What a producer (convolution, linear) applies in place on its fresh output when the
        runtime fuses this activation: the fast kernel's name, or None (the runtime then calls
        ``forward``)."""
        return self.fast_name if self._fast_unary is not None else None

    def _const(self, value: Any, x: Any) -> Any:
        """A 0-d array holding ``value`` in x's dtype on the device, made once per dtype (no
        host-to-device copy per call on a GPU; filling the cache is idempotent, so thread-safe)."""
        key = (value, x.dtype)
        c = self._consts.get(key)
        if c is None:
            c = self.xp.asarray(value, dtype=x.dtype, device=self.device)
            self._consts[key] = c
        return c

    def _floating(self, x: Any) -> Any:
        """torch's unary float functions turn integer/bool tensors into float32."""
        xp = self.xp
        key = (type(x.dtype), x.dtype)  # (the type first: dtypes of two libraries never compared)
        real = _REAL_FLOATING.get(key)
        if real is None:  # (isdtype took 0.7 us a call, a tenth of a small softmax's)
            real = _REAL_FLOATING[key] = bool(xp.isdtype(x.dtype, "real floating"))
        if real:
            return x
        return xp.astype(x, xp.float32)

    def _exp_limit(self, x: Any) -> float:
        """log(max finite value) of x's dtype: exp of anything below it does not overflow."""
        key = (type(x.dtype), x.dtype)  # (see _floating)
        lim = _EXP_LIMITS.get(key)
        if lim is None:
            lim = math.floor(math.log(float(self.xp.finfo(x.dtype).max)))
            _EXP_LIMITS[key] = lim
        return lim

    def _sigmoid(self, x: Any) -> Any:
        """1 / (1 + exp(-x)), as torch computes it, with the argument of exp clipped below
        overflow; where torch's exp overflows (x < -log(max)) its result is exactly 0, and so is
        this one (the mask keeps sigmoid(-inf) = 0, so that silu(-inf) is NaN as in torch)."""
        xp = self.xp
        lim = self._exp_limit(x)
        r = 1.0 / (1.0 + xp.exp(-xp.clip(x, min=-lim)))
        return r * xp.astype(x >= -lim, x.dtype)

    def _relu(self, x: Any) -> Any:
        if self._fast_clamp is not None:
            y = self._fast_clamp(x, 0.0, None)
            if y is not None:
                return y
        return self.xp.maximum(x, self._const(0, x))

    def _min0(self, x: Any) -> Any:
        return self.xp.minimum(x, self._const(0, x))

    def _split_sign(self, x: Any) -> tuple[Any, Any]:
        """(x > 0, x where not, else 0): the ELU family's branches as torch takes them, so that
        -0.0 gives -0.0 (relu(x) + f(min(x, 0)) gave +0.0: 1 / elu(-0.0) was +inf, torch's -inf)."""
        pos = x > 0
        return pos, self.xp.where(pos, self._const(0, x), x)

    def _softplus(self, x: Any) -> Any:
        """log(1 + exp(x)) without overflow."""
        xp = self.xp
        return self._log1p_pos(xp.exp(-xp.abs(x))) + self._relu(x)

    # NumPy's float32 expm1 and log1p are scalar loops (about 14 and 18 ns per element here,
    # against 2-3 for tanh, exp and log): Mish spent 18 ms of a 1M-element map in log1p. These
    # two give the same accuracy (a few ulps) from the fast functions.

    def _expm1_neg(self, m: Any) -> Any:
        """exp(m) - 1 for m <= 0 (or NaN), as 2t / (1 - t) with t = tanh(m / 2): no cancellation
        near 0 (t ~ m / 2), and 1 - t lies in [1, 2)."""
        t = self.xp.tanh(m * 0.5)
        return (t + t) / (1.0 - t)

    def _log1p_pos(self, e: Any) -> Any:
        """log(1 + e) for e >= 0 (or NaN) by Kahan's correction ``log(u) * e / (u - 1)``, u = 1 + e
        (exactly e where u rounds to 1)."""
        xp = self.xp
        u = 1.0 + e
        d = u - 1.0
        tiny = d == 0.0
        r = xp.log(u) * (e / xp.where(tiny, self._const(1, e), d))
        return xp.where(tiny, e, r)


def _bound(op, key: str, default: Any) -> Any:
    """A clamp bound: int, float or None (kept as given so an int tensor stays int)."""
    v = op.param(key, None, default)
    if v is None:
        return None
    if v in ("inf", "nan"):  # (pnnx writes float('inf') bare, which its own rules keep a word)
        return float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise LayerParameterError(f"{op.where}: parameter {key!r} should be a number or None, found {v!r}")
    return v


@register("nn.ReLU", "F.relu", "torch.relu")
class ReLU(_Unary):
    """y = max(x, 0) (seed 004); NaN stays NaN, as in torch."""

    def forward(self, x: Any) -> Any:
        # maximum propagates NaN (Array API), as torch's relu does
        return self._relu(x)

    def fusion_spec(self) -> Any:
        """What a producer (convolution, linear) applies in place when the runtime fuses this."""
        return "relu"


@register("nn.Sigmoid", "F.sigmoid", "torch.sigmoid")
class Sigmoid(_Unary):
    """y = 1 / (1 + exp(-x)) (the seed course's homework), evaluated without overflow."""

    fast_name = "sigmoid"

    def forward(self, x: Any) -> Any:
        y = self._fast(x)
        if y is not None:
            return y
        return self._sigmoid(self._floating(x))


@register("torch.clamp", "torch.clip", "F.hardtanh", "nn.Hardtanh", "nn.ReLU6", "F.relu6")
class Clamp(_Unary):
    """min(max(x, lo), hi); either bound may be None (torch.clamp), or come as an input tensor
    (``$min`` / ``$max``). Hardtanh reads ``min_val``/``max_val``; ReLU6 is clamp(0, 6).
    NaN stays NaN. An integer tensor clamped with a float bound becomes float, a bool one with an
    integer bound int64 (torch promotes)."""

    def __init__(self, ctx: BuildContext, lo: Any, hi: Any, min_slot: int | None = None,
                 max_slot: int | None = None, out_dtype: str | None = None):
        super().__init__(ctx)
        self.lo, self.hi = lo, hi
        self.min_slot, self.max_slot = min_slot, max_slot
        self.out_dtype = out_dtype
        self.promote = isinstance(lo, float) or isinstance(hi, float)
        # clip's result for lo > hi is left to the library; torch gives hi there
        self.crossed = lo is not None and hi is not None and lo > hi

    @classmethod
    def from_operator(cls, op, ctx):
        if op.type in ("nn.ReLU6", "F.relu6"):
            return cls(ctx, 0, 6)
        if op.type in ("F.hardtanh", "nn.Hardtanh"):
            return cls(ctx, _bound(op, "min_val", -1.0), _bound(op, "max_val", 1.0))
        names = list(op.input_names)
        min_slot = names.index("min") if "min" in names else None
        max_slot = names.index("max") if "max" in names else None
        lo = None if min_slot is not None else _bound(op, "min", None)
        hi = None if max_slot is not None else _bound(op, "max", None)
        out = op.outputs[0].array_dtype if op.outputs else None
        return cls(ctx, lo, hi, min_slot, max_slot, out)

    def fusion_spec(self) -> Any:
        if self.min_slot is not None or self.max_slot is not None or self.crossed:
            return None
        return ("clamp", None if self.lo is None else float(self.lo),
                None if self.hi is None else float(self.hi))

    def forward(self, x: Any, *bounds: Any) -> Any:
        xp = self.xp
        if not xp.isdtype(x.dtype, "real floating") and (self.promote or (
                self.out_dtype is not None and self.out_dtype.startswith("float"))):
            x = xp.astype(x, getattr(xp, self.out_dtype or "float32"))
        elif x.dtype == xp.bool and self.out_dtype != "bool":
            # a bool tensor clamped with an integer bound: torch's result is int64
            declared = self.out_dtype if (self.out_dtype or "").startswith(("int", "uint")) else None
            if declared is not None or any(type(b) is int for b in (self.lo, self.hi)):
                x = xp.astype(x, getattr(xp, declared or "int64"))
        if self.crossed:
            return xp.where(x != x, x, self._const(self.hi, x))  # NaN stays NaN
        lo, hi = self.lo, self.hi
        if lo is not None or hi is not None:
            if xp.isdtype(x.dtype, "real floating"):
                lo = None if lo is None else float(lo)
                hi = None if hi is None else float(hi)
            elif xp.isdtype(x.dtype, "integral"):  # torch wraps an int bound into the dtype first
                info = xp.iinfo(x.dtype)           # (clamp(uint8, min=-1) is 255 everywhere)
                lo = None if lo is None else wrap_int(int(lo), info)
                hi = None if hi is None else wrap_int(int(hi), info)
            y = self._fast_clamp(x, lo, hi) if self._fast_clamp is not None else None
            x = xp.clip(x, min=lo, max=hi) if y is None else y
        if self.min_slot is not None:
            x, b = self._with_bound(x, bounds[self.min_slot - 1])
            x = xp.maximum(x, b)
        if self.max_slot is not None:
            x, b = self._with_bound(x, bounds[self.max_slot - 1])
            x = xp.minimum(x, b)
        return x

    def _with_bound(self, x: Any, b: Any) -> tuple[Any, Any]:
        """x and a bound operand in torch's promoted dtype: a tensor (float32 x with a float64
        bound is float64; uint8 with int8 int16), or a Python number (``max=x.shape[0]``: pnnx
        passes the size an expression computes) in x's dtype."""
        if hasattr(b, "dtype"):
            return promote(self.xp, x, b)
        if type(b) is int and self.xp.isdtype(x.dtype, "integral"):
            b = wrap_int(b, self.xp.iinfo(x.dtype))
        return x, self.xp.asarray(b, dtype=x.dtype, device=self.device)


@register("nn.LeakyReLU", "F.leaky_relu", "nn.RReLU", "F.rrelu")
class LeakyReLU(_Unary):
    """x if x >= 0 else slope * x. RReLU in eval mode uses the fixed slope (lower + upper) / 2."""

    def __init__(self, ctx: BuildContext, slope: float):
        super().__init__(ctx)
        self.slope = slope

    @classmethod
    def from_operator(cls, op, ctx):
        if op.type in ("nn.RReLU", "F.rrelu"):
            lower = op.param("lower", float, 1.0 / 8.0)
            upper = op.param("upper", float, 1.0 / 3.0)
            return cls(ctx, (lower + upper) / 2.0)
        return cls(ctx, op.param("negative_slope", float, 0.01))

    def forward(self, x: Any) -> Any:
        if 0.0 < self.slope <= 1.0:  # NaN propagates (slope 0: inf * 0 would make +inf NaN)
            return self.xp.maximum(x, x * self.slope)
        return self.xp.where(x < 0, x * self.slope, x)

    def fusion_spec(self) -> Any:
        """Applied by the producer on its fresh output (on NumPy in place, split over the threads)."""
        return ("leaky", float(self.slope))


@register("nn.PReLU", "F.prelu")
class PReLU(_Unary):
    """x if x >= 0 else w[c] * x, with one slope per channel (dim 1) or a single slope.
    The slopes are the ``@weight`` attribute or the op's second input."""

    def __init__(self, ctx: BuildContext, weight: Any):
        super().__init__(ctx)
        self.weight = weight

    @classmethod
    def from_operator(cls, op, ctx):
        w = op.weight("weight", ctx, optional=True)
        if w is None and len(op.inputs) < 2:
            raise LayerParameterError(f"{op.where}: PReLU needs a '@weight' attribute or a weight input")
        return cls(ctx, w)

    def forward(self, x: Any, w: Any = None) -> Any:
        xp = self.xp
        w = self.weight if w is None else w
        n = w.shape[0] if w.ndim else 1
        if n != 1:
            if x.ndim < 2 or x.shape[1] != n:
                raise ShapeError(f"{self.op_type} {self.op_name!r}: {n} slopes for an input of shape "
                                 f"{tuple(x.shape)} (channels are dim 1)")
            fast = getattr(self.backend.fast, "prelu", None)
            y = None if fast is None else fast(x, w)
            if y is not None:
                return y
            w = xp.reshape(w, (n,) + (1,) * (x.ndim - 2))
        else:
            w = xp.reshape(w, ())
        return self._relu(x) + self._min0(x) * xp.astype(w, x.dtype)


@register("nn.ELU", "F.elu")
class ELU(_Unary):
    """x if x > 0 else alpha * (exp(x) - 1)."""

    def __init__(self, ctx: BuildContext, alpha: float):
        super().__init__(ctx)
        self.alpha = alpha

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("alpha", float, 1.0))

    def forward(self, x: Any) -> Any:
        x = self._floating(x)
        pos, m = self._split_sign(x)
        return self.xp.where(pos, x, self._expm1_neg(m) * self.alpha)

    def fusion_spec(self) -> Any:
        return ("elu", float(self.alpha), 1.0, 1.0)


@register("nn.CELU", "F.celu")
class CELU(_Unary):
    """x if x > 0 else alpha * (exp(x / alpha) - 1)."""

    def __init__(self, ctx: BuildContext, alpha: float):
        super().__init__(ctx)
        self.alpha = alpha

    @classmethod
    def from_operator(cls, op, ctx):
        alpha = op.param("alpha", float, 1.0)
        if alpha == 0:
            raise LayerParameterError(f"{op.where}: parameter 'alpha' must not be 0, found {alpha!r}")
        return cls(ctx, alpha)

    def forward(self, x: Any) -> Any:
        x = self._floating(x)
        pos, m = self._split_sign(x)
        return self.xp.where(pos, x, self._expm1_neg(m / self.alpha) * self.alpha)

    def fusion_spec(self) -> Any:
        return ("elu", float(self.alpha), 1.0, float(self.alpha))


@register("nn.SELU", "F.selu", "torch.selu")
class SELU(_Unary):
    """scale * (x if x > 0 else alpha * (exp(x) - 1)) with the fixed SELU constants."""

    def forward(self, x: Any) -> Any:
        x = self._floating(x)
        pos, m = self._split_sign(x)
        return self.xp.where(pos, x, self._expm1_neg(m) * _SELU_ALPHA) * _SELU_SCALE

    def fusion_spec(self) -> Any:
        return ("elu", float(_SELU_ALPHA), float(_SELU_SCALE), 1.0)


@register("nn.SiLU", "F.silu")
class SiLU(_Unary):
    """x * sigmoid(x) (``x * torch.sigmoid(x)`` is fused into F.silu by pnnx)."""

    fast_name = "silu"

    def forward(self, x: Any) -> Any:
        y = self._fast(x)
        if y is not None:
            return y
        x = self._floating(x)
        return x * self._sigmoid(x)


@register("nn.Hardswish", "F.hardswish")
class Hardswish(_Unary):
    """x * clamp(x + 3, 0, 6) / 6 (so hardswish(-inf) is NaN, as in torch)."""

    fast_name = "hardswish"

    def forward(self, x: Any) -> Any:
        y = self._fast(x)
        if y is not None:
            return y
        xp = self.xp
        x = self._floating(x)
        return x * xp.clip(x + 3.0, min=0.0, max=6.0) / 6.0


@register("nn.Hardsigmoid", "F.hardsigmoid")
class Hardsigmoid(_Unary):
    """clamp(x + 3, 0, 6) / 6."""

    fast_name = "hardsigmoid"

    def forward(self, x: Any) -> Any:
        y = self._fast(x)
        if y is not None:
            return y
        xp = self.xp
        x = self._floating(x)
        return xp.clip(x + 3.0, min=0.0, max=6.0) / 6.0


@register("nn.Tanh", "F.tanh", "torch.tanh")
class Tanh(_Unary):
    fast_name = "tanh"

    def forward(self, x: Any) -> Any:
        y = self._fast(x)
        if y is not None:
            return y
        return self.xp.tanh(self._floating(x))


@register("nn.GELU", "F.gelu")
class GELU(_Unary):
    """Exact: x/2 * (1 + erf(x / sqrt 2)); ``approximate=tanh``:
    x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""

    def __init__(self, ctx: BuildContext, approximate: str):
        self.fast_name = "gelu_tanh" if approximate == "tanh" else "gelu"
        super().__init__(ctx)
        self.tanh = approximate == "tanh"
        if not self.tanh:
            from kuiper_xp.expression.functions import erf

            self.erf = erf

    @classmethod
    def from_operator(cls, op, ctx):
        approx = op.param("approximate", str, "none")
        if approx not in ("none", "tanh"):
            raise LayerParameterError(
                f"{op.where}: parameter 'approximate' should be 'none' or 'tanh', found {approx!r}")
        return cls(ctx, approx)

    def forward(self, x: Any) -> Any:
        y = self._fast(x)
        if y is not None:
            return y
        xp = self.xp
        x = self._floating(x)
        if self.tanh:
            inner = (x + x * x * x * 0.044715) * _SQRT_2_PI
            return x * 0.5 * (1.0 + xp.tanh(inner))
        if x.dtype == xp.float32:
            return x * 0.5 * (1.0 + _erf_float32(x * _SQRT1_2, xp))
        return x * 0.5 * (1.0 + self.erf(x * _SQRT1_2, xp))


@register("nn.Mish", "F.mish")
class Mish(_Unary):
    """x * tanh(softplus(x))."""

    fast_name = "mish"

    def forward(self, x: Any) -> Any:
        y = self._fast(x)
        if y is not None:
            return y
        # tanh(log(1 + n)) = n (n + 2) / (n (n + 2) + 2) with n = exp(x): one exp instead of
        # exp, log1p and tanh; exp's argument stops at 20, past which the ratio is 1 in float32
        # and float64 alike (NaN passes through minimum; -inf gives -inf * 0 = NaN, as torch)
        xp = self.xp
        x = self._floating(x)
        n = xp.exp(xp.minimum(x, self._const(20, x)))
        p = n * (n + 2.0)
        return x * (p / (p + 2.0))


@register("nn.Softplus", "F.softplus")
class Softplus(_Unary):
    """log(1 + exp(beta x)) / beta, or x where beta x > threshold (torch's rule)."""

    def __init__(self, ctx: BuildContext, beta: float, threshold: float):
        super().__init__(ctx)
        self.beta, self.threshold = beta, threshold

    @classmethod
    def from_operator(cls, op, ctx):
        beta = op.param("beta", float, 1.0)
        if beta == 0:
            raise LayerParameterError(f"{op.where}: parameter 'beta' must not be 0, found {beta!r}")
        return cls(ctx, beta, op.param("threshold", float, 20.0))

    def forward(self, x: Any) -> Any:
        xp = self.xp
        x = self._floating(x)
        bx = x * self.beta if self.beta != 1.0 else x
        big = bx > self.threshold
        # exp only sees values <= threshold, so nothing overflows where the result is kept
        soft = self._log1p_pos(xp.exp(xp.where(big, self._const(0, x), bx)))
        if self.beta != 1.0:
            soft = soft / self.beta
        return xp.where(big, x, soft)


# Rational minimax approximation of erf for float32 on [-4, 4] (odd numerator of degree 13 over an
# even denominator of degree 8; the form used by Eigen's and XLA's float erf). Beyond |x| = 4 erf
# is +-1 in float32. Max |error| 4.5e-7 over the real line in float32 arithmetic (checked against
# math.erf by tests/test_layers_activation.py); pure multiply-adds, no masked selects, about ten
# times faster than the general-purpose erf on NumPy.
_ERF_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
          -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10)
_ERF_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
          -1.45660718464996e-05)


def _erf_float32(x: Any, xp: Any) -> Any:
    """erf(x) for a float32 array (NaN stays NaN: clip propagates it). The Horner steps update
    the two fresh temporaries in place (Array API in-place operators), which saves an allocation
    per step."""
    x = xp.clip(x, min=-4.0, max=4.0)
    x2 = x * x
    p = x2 * _ERF_P[6]
    p += _ERF_P[5]
    for c in _ERF_P[4::-1]:
        p *= x2
        p += c
    q = x2 * _ERF_Q[4]
    q += _ERF_Q[3]
    for c in _ERF_Q[2::-1]:
        q *= x2
        q += c
    p *= x
    p /= q
    return p


def _softmax_dim(op, ndim: int | None) -> int:
    dim = op.param("dim", int, None)
    if dim is None:
        if op.type == "nn.Softmax2d":
            return -3
        if ndim is None:
            raise LayerParameterError(f"{op.where}: 'dim' is None and the input rank is unknown")
        return 0 if ndim in (0, 1, 3) else 1  # torch's legacy implicit dim
    return dim


@register("nn.Softmax", "F.softmax", "torch.softmax", "nn.Softmin", "F.softmin", "nn.Softmax2d")
class Softmax(_Unary):
    """exp(x - max) / sum(exp(x - max)) along ``dim`` (Softmin: of -x). A ``dtype=`` pnnx
    dropped shows in the output annotation; the input is cast to it first, as torch does."""

    log = False

    def __init__(self, ctx: BuildContext, dim: int, negate: bool = False, dtype: str | None = None):
        super().__init__(ctx)
        self.dim, self.negate, self.dtype = dim, negate, dtype
        # (the dtype object, compared per call: its name cost ~2 us a call to make)
        self._dt = None if dtype is None else getattr(ctx.xp, dtype)
        self._fast_softmax = getattr(ctx.fast, "log_softmax_last" if self.log else "softmax_last", None)

    @classmethod
    def from_operator(cls, op, ctx):
        shape = op.inputs[0].shape if op.inputs else None
        dim = _softmax_dim(op, None if shape is None else len(shape))
        dt = op.outputs[0].array_dtype if op.outputs else None
        if dt is not None and not dt.startswith("float"):
            dt = None
        return cls(ctx, dim, op.type in ("nn.Softmin", "F.softmin"), dt)

    def forward(self, x: Any) -> Any:
        fast = self._fast_softmax
        if (fast is not None and not self.negate and x.ndim and self.dim in (-1, x.ndim - 1)
                and (self._dt is None or x.dtype == self._dt)):
            # (the last axis, no cast: the backend's kernel straight away, ~1.5 us of a
            # classifier head's call less; it declines non-float and empty inputs)
            y = fast(x)
            if y is not None:
                return y
        xp = self.xp
        if self._dt is not None and x.dtype != self._dt:
            x = xp.astype(x, self._dt)
        x = self._floating(x)
        if self.negate:
            x = -x
        d = self.dim
        if not -x.ndim <= d < max(x.ndim, 1):
            raise ShapeError(f"{self.op_type} {self.op_name!r}: dim {d} is out of range for an input "
                             f"of shape {tuple(x.shape)}")
        if x.ndim == 0:
            return xp.zeros_like(x) if self.log else xp.ones_like(x)
        if math.prod(x.shape) == 0:  # (nothing to normalise: a max over an empty axis raises)
            return xp.empty_like(x)
        if self._fast_softmax is not None and d % x.ndim == x.ndim - 1:
            y = self._fast_softmax(x)
            if y is not None:
                return y
        z = x - xp.max(x, axis=d, keepdims=True)
        if self.log:
            z -= xp.log(xp.sum(xp.exp(z), axis=d, keepdims=True))
            return z
        e = xp.exp(z)
        e /= xp.sum(e, axis=d, keepdims=True)  # e is a fresh temporary
        return e


@register("nn.LogSoftmax", "F.log_softmax", "torch.log_softmax")
class LogSoftmax(Softmax):
    """(x - max) - log(sum(exp(x - max))) along ``dim``."""

    log = True


@register("nn.Threshold", "F.threshold")
class Threshold(_Unary):
    """value where x <= threshold, else x (NaN stays NaN)."""

    def __init__(self, ctx: BuildContext, threshold: float, value: float):
        super().__init__(ctx)
        self.threshold, self.value = threshold, value

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("threshold", float), op.param("value", float))

    def forward(self, x: Any) -> Any:
        return self.xp.where(x <= self.threshold, self._const(self.value, x), x)


@register("nn.Hardshrink", "F.hardshrink")
class Hardshrink(_Unary):
    """0 where -lambd <= x <= lambd, else x."""

    def __init__(self, ctx: BuildContext, lambd: float):
        super().__init__(ctx)
        self.lambd = lambd

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("lambd", float, 0.5))

    def forward(self, x: Any) -> Any:
        inside = (x >= -self.lambd) & (x <= self.lambd)
        return self.xp.where(inside, self._const(0, x), x)


@register("nn.Softshrink", "F.softshrink")
class Softshrink(Hardshrink):
    """x - lambd where x > lambd, x + lambd where x < -lambd, else 0 (NaN stays NaN)."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        lam = self.lambd
        return xp.where(x > lam, x - lam, xp.where(x < -lam, x + lam, x * 0.0))


@register("nn.Tanhshrink", "F.tanhshrink")
class Tanhshrink(_Unary):
    """x - tanh(x)."""

    def forward(self, x: Any) -> Any:
        x = self._floating(x)
        return x - self.xp.tanh(x)


@register("nn.LogSigmoid", "F.logsigmoid")
class LogSigmoid(_Unary):
    """log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|))."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        x = self._floating(x)
        return self._min0(x) - self._log1p_pos(xp.exp(-xp.abs(x)))


@register("nn.Softsign", "F.softsign")
class Softsign(_Unary):
    """x / (1 + |x|)."""

    def forward(self, x: Any) -> Any:
        x = self._floating(x)
        return x / (1.0 + self.xp.abs(x))


@register("nn.GLU", "F.glu")
class GLU(_Unary):
    """a * sigmoid(b), where a, b are the two halves of x along ``dim``."""

    def __init__(self, ctx: BuildContext, dim: int):
        super().__init__(ctx)
        self.dim = dim

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("dim", int, -1))

    def forward(self, x: Any) -> Any:
        nd = x.ndim
        d = self.dim + nd if self.dim < 0 else self.dim
        if not 0 <= d < nd or x.shape[d] % 2:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: cannot halve dim {self.dim} of an input "
                             f"of shape {tuple(x.shape)} (it must exist and have an even size)")
        h = x.shape[d] // 2
        head = (slice(None),) * d
        a = x[head + (slice(0, h), ...)]
        b = x[head + (slice(h, 2 * h), ...)]
        return a * self._sigmoid(self._floating(b))

