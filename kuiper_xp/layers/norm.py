"""Normalisation layers: LayerNorm, GroupNorm, InstanceNorm, RMSNorm, F.normalize.

pnnx spellings (torch 2.13 exports):

* ``nn.LayerNorm ln 1 1 0 21 elementwise_affine=True eps=1.000000e-5 normalized_shape=(16)
  @bias=(16)f32 @weight=(16)f32``; ``F.layer_norm ... bias=None eps=1.000000e-5
  normalized_shape=(16) weight=None $input=1`` (an ``F.layer_norm`` whose weight and bias are
  module parameters is folded back into ``nn.LayerNorm``).
* ``nn.GroupNorm gn ... affine=True eps=1.000000e-5 num_channels=4 num_groups=2 @bias @weight``;
  ``F.group_norm ... bias=None eps=1.000000e-5 num_groups=2 $input=0 $weight=5`` (weight and bias
  may be inputs fed by ``pnnx.Attribute``).
* ``nn.InstanceNorm2d inn ... affine=True eps=1.000000e-5 num_features=4
  track_running_stats=False @bias @weight`` (with ``track_running_stats=True``:
  ``@running_mean @running_var``, which eval mode uses instead of the input statistics).
* ``nn.RMSNorm rms ... elementwise_affine=True eps=None normalized_shape=(16) @weight``;
  ``F.rms_norm ... eps=None normalized_shape=(16) weight=None $input=0``. ``eps=None`` means
  ``torch.finfo(dtype).eps``.

Statistics are computed in float32 for float16/bfloat16 inputs (as torch does) and the result
is cast back to the input dtype.
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, FusesActivation, Layer
from .misc import input_slots, is_float, to_float, to_int
from .registry import register
from .shape import norm_dim


def _weight_or_input(op: Any, ctx: BuildContext, key: str, slots: dict[str, int]) -> tuple[Any, int | None]:
    """A weight from ``@key`` (returned as an array) or from the input ``$key`` (its position)."""
    if key in slots:
        return None, slots[key]
    return op.weight(key, ctx, optional=True), None


def _check_affine(op: Any, w: Any, b: Any, slots: dict[str, int], channels: int | None) -> None:
    """Refuse affine weights that do not fit: ``affine=True`` with ``@weight`` or ``@bias``
    missing (they ran as 1 and 0, silently), or either not 1-D of the channels' length (of
    each other's where the channel count is not given)."""
    if op.param("affine", bool, default=None) is True:
        for name, a in (("weight", w), ("bias", b)):
            if a is None and name not in slots:
                raise LayerParameterError(f"{op.where}: affine=True but @{name} is missing")
    want = channels if channels is not None else (w.shape[0] if w is not None and len(w.shape) == 1 else None)
    for name, a in (("weight", w), ("bias", b)):
        if a is not None and (len(a.shape) != 1 or (want is not None and a.shape[0] != want)):
            raise LayerParameterError(f"{op.where}: @{name} has shape {tuple(a.shape)}, expected "
                                      f"({want if want is not None else 'channels'},)")


class _NormBase(Layer):
    """Shared plumbing: optional affine weight/bias, each a stored array or an input position."""

    def __init__(self, ctx: BuildContext, weight: Any, weight_pos: int | None, bias: Any, bias_pos: int | None,
                 where: str):
        super().__init__(ctx)
        self.weight, self.weight_pos, self.bias, self.bias_pos = weight, weight_pos, bias, bias_pos
        self.where = where
        self._fast_group_norm = getattr(ctx.fast, "group_norm", None)

    def _affine(self, inputs: tuple) -> tuple[Any, Any]:
        w = inputs[self.weight_pos] if self.weight_pos is not None else self.weight
        b = inputs[self.bias_pos] if self.bias_pos is not None else self.bias
        return w, b

    def _fast_norm(self, x: Any, rest: tuple, groups: int, call: bool = True) -> Any:
        """The backend's ``group_norm`` fast path with the affine and a fused activation (None
        where there is none or it declines: the generic code then runs); a callable one only
        when ``call`` (else the caller applies it, on the output's own shape)."""
        if self._fast_group_norm is None:
            return None
        act = getattr(self, "fused_activation", None)
        w, b = self._affine((x,) + rest)
        y = self._fast_group_norm(x, groups, w, b, self.eps, None if callable(act) else act)
        return act(y) if y is not None and callable(act) and call else y

    def _compute_dtype(self, x: Any) -> Any:
        xp = self.xp
        if not is_float(xp, x.dtype):
            raise ShapeError(f"{self.where}: normalisation needs a floating-point input, found {x.dtype}")
        if any(x.dtype == getattr(xp, n) for n in ("float16", "bfloat16") if hasattr(xp, n)):
            return xp.astype(x, xp.float32)
        return x


@register("nn.LayerNorm", "F.layer_norm")
class LayerNorm(_NormBase):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last len(normalized_shape) axes."""

    def __init__(self, ctx, weight, weight_pos, bias, bias_pos, where, shape: tuple[int, ...], eps: float):
        super().__init__(ctx, weight, weight_pos, bias, bias_pos, where)
        self.shape, self.eps = shape, eps
        self.axes = tuple(range(-len(shape), 0))

    @classmethod
    def from_operator(cls, op, ctx):
        shape = op.param("normalized_shape", (int,))
        eps = op.param("eps", float, default=1e-5)
        slots = input_slots(op, ("input", "weight", "bias"))
        w, wp = _weight_or_input(op, ctx, "weight", slots)
        b, bp = _weight_or_input(op, ctx, "bias", slots)
        for name, arr in (("weight", w), ("bias", b)):
            if arr is not None and tuple(arr.shape) != tuple(shape):
                raise LayerParameterError(f"{op.where}: {name} has shape {tuple(arr.shape)}, "
                                          f"normalized_shape is {tuple(shape)}")
        return cls(ctx, w, wp, b, bp, op.where, tuple(shape), eps)

    def forward(self, x: Any, *rest: Any) -> Any:
        xp = self.xp
        k = len(self.shape)
        if tuple(x.shape[x.ndim - k:]) != self.shape:
            raise ShapeError(f"{self.where}: input shape {tuple(x.shape)} does not end with normalized_shape {self.shape}")
        inputs = (x,) + rest
        fast = getattr(self.backend.fast, "layer_norm", None)
        if fast is not None:
            w, b = self._affine(inputs)
            y = fast(x, math.prod(self.shape), w, b, self.eps)
            if y is not None:
                return y
        xc = self._compute_dtype(x)
        mean = xp.mean(xc, axis=self.axes, keepdims=True)
        y = xc - mean  # fresh: the steps below update it in place (no temporaries of x's size
        sq = y * y     # but this one)
        var = xp.mean(sq, axis=self.axes, keepdims=True)
        var += self.eps
        y /= xp.sqrt(var)
        w, b = self._affine(inputs)
        if w is not None:
            if w.dtype == y.dtype and w.ndim <= y.ndim:
                y *= w
            else:
                y = y * w
        if b is not None:
            if b.dtype == y.dtype and b.ndim <= y.ndim:
                y += b
            else:
                y = y + b
        return y if y.dtype == x.dtype else xp.astype(y, x.dtype)


@register("nn.RMSNorm", "F.rms_norm")
class RMSNorm(_NormBase):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape) axes; eps None
    is the machine epsilon of the input dtype."""

    def __init__(self, ctx, weight, weight_pos, where, shape: tuple[int, ...], eps: float | None):
        super().__init__(ctx, weight, weight_pos, None, None, where)
        self.shape, self.eps = shape, eps
        self.axes = tuple(range(-len(shape), 0))

    @classmethod
    def from_operator(cls, op, ctx):
        shape = op.param("normalized_shape", (int,))
        eps = op.param("eps", float, default=None)
        slots = input_slots(op, ("input", "weight"))
        w, wp = _weight_or_input(op, ctx, "weight", slots)
        if w is not None and tuple(w.shape) != tuple(shape):
            raise LayerParameterError(f"{op.where}: weight has shape {tuple(w.shape)}, normalized_shape is {tuple(shape)}")
        return cls(ctx, w, wp, op.where, tuple(shape), eps)

    def forward(self, x: Any, *rest: Any) -> Any:
        xp = self.xp
        k = len(self.shape)
        if tuple(x.shape[x.ndim - k:]) != self.shape:
            raise ShapeError(f"{self.where}: input shape {tuple(x.shape)} does not end with normalized_shape {self.shape}")
        eps = self.eps if self.eps is not None else float(xp.finfo(x.dtype).eps)
        xc = self._compute_dtype(x)
        y = xc / xp.sqrt(xp.mean(xc * xc, axis=self.axes, keepdims=True) + eps)
        w, _ = self._affine((x,) + rest)
        if y.dtype != x.dtype:
            y = xp.astype(y, x.dtype)
        if w is not None:
            y = y * w
        return y


@register("nn.GroupNorm", "F.group_norm")
class GroupNorm(FusesActivation, _NormBase):
    """Normalise (N, C, *) over groups of C/G channels and all spatial positions, then a
    per-channel affine; a following activation (UNet blocks' SiLU) can be fused in. On the numpy
    backend ``fast.group_norm`` does it in three threaded passes."""

    def __init__(self, ctx, weight, weight_pos, bias, bias_pos, where, groups: int, eps: float):
        super().__init__(ctx, weight, weight_pos, bias, bias_pos, where)
        self.groups, self.eps = groups, eps

    @classmethod
    def from_operator(cls, op, ctx):
        groups = op.param("num_groups", int)
        if groups <= 0:
            raise LayerParameterError(f"{op.where}: num_groups must be positive, found {groups}")
        channels = op.param("num_channels", int, default=None)
        if channels is not None and channels % groups:
            raise LayerParameterError(f"{op.where}: num_channels={channels} is not divisible by num_groups={groups}")
        slots = input_slots(op, ("input", "weight", "bias"))
        w, wp = _weight_or_input(op, ctx, "weight", slots)
        b, bp = _weight_or_input(op, ctx, "bias", slots)
        _check_affine(op, w, b, slots, channels)
        return cls(ctx, w, wp, b, bp, op.where, groups, op.param("eps", float, default=1e-5))

    def forward(self, x: Any, *rest: Any) -> Any:
        xp = self.xp
        if x.ndim < 2 or x.shape[1] % self.groups:
            raise ShapeError(f"{self.where}: input shape {tuple(x.shape)}: channels not divisible by {self.groups} groups")
        n, c = x.shape[0], x.shape[1]
        if math.prod(x.shape) == 0:  # (an empty batch or map: nothing to normalise, no warning)
            return self._activate(xp.empty_like(x))
        y = self._fast_norm(x, rest, self.groups)
        if y is not None:
            return y
        xc = self._compute_dtype(x)
        # (the group size spelled out: numpy cannot infer -1 for an empty batch)
        g = xp.reshape(xc, (n, self.groups, math.prod(x.shape[1:]) // self.groups))
        mean = xp.mean(g, axis=2, keepdims=True)
        d = g - mean
        var = xp.mean(d * d, axis=2, keepdims=True)
        y = xp.reshape(d / xp.sqrt(var + self.eps), tuple(x.shape))
        w, b = self._affine((x,) + rest)
        cshape = (1, c) + (1,) * (x.ndim - 2)
        if w is not None:
            y = y * xp.reshape(w, cshape)
        if b is not None:
            y = y + xp.reshape(b, cshape)
        return self._activate(y if y.dtype == x.dtype else xp.astype(y, x.dtype))


@register("nn.InstanceNorm1d", "nn.InstanceNorm2d", "nn.InstanceNorm3d", "F.instance_norm")
class InstanceNorm(FusesActivation, _NormBase):
    """Normalise each (sample, channel) over its spatial positions, or with the running
    statistics when the module tracks them (eval mode), then an optional per-channel affine."""

    def __init__(self, ctx, weight, weight_pos, bias, bias_pos, where, eps: float,
                 mean: Any, var: Any, stat_pos: tuple[int | None, int | None], nd: int | None = None):
        super().__init__(ctx, weight, weight_pos, bias, bias_pos, where)
        self.eps, self.mean, self.var, self.stat_pos = eps, mean, var, stat_pos
        self.nd = nd  # spatial rank of nn.InstanceNorm1d/2d/3d (None: F.instance_norm, batched only)

    @classmethod
    def from_operator(cls, op, ctx):
        slots = input_slots(op, ("input", "running_mean", "running_var", "weight", "bias"))
        w, wp = _weight_or_input(op, ctx, "weight", slots)
        b, bp = _weight_or_input(op, ctx, "bias", slots)
        _check_affine(op, w, b, slots, None)
        mean = var = None
        stat_pos: tuple[int | None, int | None] = (None, None)
        if op.type == "F.instance_norm":
            if not op.param("use_input_stats", bool, default=True):
                stat_pos = (slots.get("running_mean"), slots.get("running_var"))
                if None in stat_pos:
                    raise LayerParameterError(f"{op.where}: use_input_stats=False needs running_mean and running_var inputs")
        elif op.param("track_running_stats", bool, default=False):
            mean, var = op.weight("running_mean", ctx), op.weight("running_var", ctx)
        nd = int(op.type[-2]) if op.type.startswith("nn.InstanceNorm") and op.type[-2].isdigit() else None
        return cls(ctx, w, wp, b, bp, op.where, op.param("eps", float, default=1e-5), mean, var, stat_pos, nd)

    def forward(self, x: Any, *rest: Any) -> Any:
        if self.nd is not None and x.ndim == self.nd + 1:
            # unbatched (C, *spatial), as torch's InstanceNormNd takes it (pnnx writes the module
            # on that operand): normalised as one sample, the fused activation on (C, ...)
            y = self._normalise(self.xp.expand_dims(x, axis=0), rest, late=True)
            return self._activate(y[0, ...], "outer")
        return self._normalise(x, rest, late=False)

    def _normalise(self, x: Any, rest: tuple, late: bool) -> Any:
        xp = self.xp
        inputs = (x,) + rest
        if x.ndim < 2:
            raise ShapeError(f"{self.where}: instance norm needs an (N, C, ...) input, found {tuple(x.shape)}")
        c = x.shape[1]
        cshape = (1, c) + (1,) * (x.ndim - 2)
        if self.mean is None and self.stat_pos[0] is None:
            y = self._fast_norm(x, rest, c, call=not late)
            if y is not None:
                return y
        xc = self._compute_dtype(x)
        if self.mean is not None or self.stat_pos[0] is not None:
            mean = self.mean if self.mean is not None else inputs[self.stat_pos[0]]
            var = self.var if self.var is not None else inputs[self.stat_pos[1]]
            y = (xc - xp.reshape(mean, cshape)) / xp.sqrt(xp.reshape(var, cshape) + self.eps)
        else:
            axes = tuple(range(2, x.ndim))
            mean = xp.mean(xc, axis=axes, keepdims=True)
            d = xc - mean
            var = xp.mean(d * d, axis=axes, keepdims=True)
            y = d / xp.sqrt(var + self.eps)
        w, b = self._affine(inputs)
        if w is not None:
            y = y * xp.reshape(w, cshape)
        if b is not None:
            y = y + xp.reshape(b, cshape)
        return self._activate(y if y.dtype == x.dtype else xp.astype(y, x.dtype), "inner" if late else "any")


@register("aten::instance_norm")
class AtenInstanceNorm(Layer):
    """``aten::instance_norm`` as pnnx leaves it (``F.instance_norm(use_input_stats=False)``, an
    ``nn.InstanceNorm2d`` whose running statistics it could not fold): inputs (input, weight,
    bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled), any of the
    four tensors None. With ``use_input_stats`` the statistics of each (sample, channel) over its
    positions, else the running ones; then the optional affine."""

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 9:
            raise LayerParameterError(f"{op.where}: expected 9 inputs (input, weight, bias, running_mean, "
                                      f"running_var, use_input_stats, momentum, eps, cudnn_enabled), found {len(op.inputs)}")
        return cls(ctx, op.where)

    def forward(self, x, w, b, mean, var, use_input_stats, _momentum, eps, _cudnn) -> Any:
        xp = self.xp
        if x.ndim < 2:
            raise ShapeError(f"{self.where}: instance norm needs an (N, C, ...) input, found {tuple(x.shape)}")
        c = x.shape[1]
        for name, t in (("weight", w), ("bias", b), ("running_mean", mean), ("running_var", var)):
            if t is not None and tuple(t.shape) != (c,):
                raise ShapeError(f"{self.where}: {name} has shape {tuple(t.shape)}, expected ({c},) for "
                                 f"an input of {c} channels")
        cshape = (1, c) + (1,) * (x.ndim - 2)
        eps = to_float(eps, f"{self.where}: eps")
        if bool(to_int(use_input_stats, f"{self.where}: use_input_stats")):
            axes = tuple(range(2, x.ndim))
            m = xp.mean(x, axis=axes, keepdims=True)
            d = x - m
            y = d / xp.sqrt(xp.mean(d * d, axis=axes, keepdims=True) + eps)
        else:
            if mean is None or var is None:
                raise ShapeError(f"{self.where}: use_input_stats=False needs running_mean and running_var")
            y = (x - xp.reshape(xp.astype(mean, x.dtype), cshape)) / xp.sqrt(
                xp.reshape(xp.astype(var, x.dtype), cshape) + eps)
        if w is not None:
            y = y * xp.reshape(xp.astype(w, x.dtype), cshape)
        if b is not None:
            y = y + xp.reshape(xp.astype(b, x.dtype), cshape)
        return y


@register("F.normalize")
class Normalize(Layer):
    """y = x / max(||x||_p, eps) along ``dim``."""

    def __init__(self, ctx: BuildContext, p: float, dim: int, eps: float):
        super().__init__(ctx)
        self.p, self.dim, self.eps = p, dim, eps

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("p", float, default=2.0), op.param("dim", int, default=1),
                   op.param("eps", float, default=1e-12))

    def forward(self, x: Any) -> Any:
        xp = self.xp
        axis = norm_dim(self.dim, max(x.ndim, 1), f"{self.op_type} {self.op_name!r}")
        a = xp.abs(x)
        if self.p == 2.0:
            norm = xp.sqrt(xp.sum(a * a, axis=axis, keepdims=True))
        elif self.p == 1.0:
            norm = xp.sum(a, axis=axis, keepdims=True)
        elif self.p == float("inf"):
            norm = xp.max(a, axis=axis, keepdims=True)
        elif self.p == float("-inf"):
            norm = xp.min(a, axis=axis, keepdims=True)
        else:
            norm = xp.sum(a ** self.p, axis=axis, keepdims=True) ** (1.0 / self.p)
        return x / xp.maximum(norm, xp.asarray(self.eps, dtype=x.dtype, device=self.device))


@register("nn.LocalResponseNorm", "F.local_response_norm")
class LocalResponseNorm(Layer):
    """``x / (k + alpha/size * sum of x^2 over a window of `size` channels)^beta`` (AlexNet's
    LRN), the window centred as torch pads it: ``size // 2`` channels before, ``(size - 1) // 2``
    after; inputs (N, C, ...) with at least 3 dims. ``nn.LocalResponseNorm m 1 1 0 1 alpha=0.0001
    beta=0.75 k=1.0 size=5``."""

    def __init__(self, ctx: BuildContext, size: int, alpha: float, beta: float, k: float, where: str):
        super().__init__(ctx)
        self.size, self.alpha, self.beta, self.k, self.where = size, alpha, beta, k, where

    @classmethod
    def from_operator(cls, op, ctx):
        size = op.param("size", int)
        if size < 1:
            raise LayerParameterError(f"{op.where}: size={size} must be >= 1")
        return cls(ctx, size, op.param("alpha", float, 1e-4), op.param("beta", float, 0.75),
                   op.param("k", float, 1.0), op.where)

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if x.ndim < 3:
            raise ShapeError(f"{self.where}: expected an input of 3 or more dims (N, C, ...), found "
                             f"shape {tuple(x.shape)}")
        c = x.shape[1]
        before, after = self.size // 2, (self.size - 1) // 2
        sq = x * x
        # windowed channel sums: the window's shifted slices of the zero-padded squares added (a
        # difference of cumulative sums cancelled: 1e4 in one channel gave inf four channels on,
        # and one inf NaN in every later window)
        zeros = xp.zeros((x.shape[0], 1) + tuple(x.shape[2:]), dtype=x.dtype, device=self.device)
        padded = xp.concat([zeros] * before + [sq] + [zeros] * after, axis=1)
        win = padded[:, :c, ...]
        for j in range(1, self.size):
            win = win + padded[:, j:j + c, ...]
        return x / (self.k + win * (self.alpha / self.size)) ** self.beta
