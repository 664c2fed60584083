"""Volumetric (3-D) layers: ``nn.Conv3d``, ``nn.ConvTranspose3d``, max / average pooling and
their adaptive forms, on (N, C, D, H, W) data (or unbatched (C, D, H, W)).

pnnx spellings (torch 2.13 exports):

* ``nn.Conv3d c 1 1 0 1 bias=True dilation=(1,1,1) groups=1 in_channels=3 kernel_size=(3,3,3)
  out_channels=8 padding=(1,1,1) padding_mode=zeros stride=(1,2,2) @bias @weight``; a BatchNorm3d
  after it is folded in (``convbn3d_0``); ``padding="same"`` comes out as six numbers in F.pad's
  order, ``padding=(w_lo,w_hi,h_lo,h_hi,d_lo,d_hi)``; ``padding_mode`` zeros, reflect,
  replicate or circular.
* ``nn.ConvTranspose3d ct ... dilation=(1,1,1) groups=1 kernel_size=(2,2,2) output_padding=(0,0,0)
  padding=(0,0,0) stride=(2,2,2) @bias @weight``.
* ``nn.MaxPool3d mp ... ceil_mode=True dilation=(1,1,1) kernel_size=(1,3,3) padding=(0,1,1)
  return_indices=False stride=(1,2,2)``; ``F.max_pool3d ... stride=None``; with
  ``return_indices=True`` a second, int64 output of flat ``d*H*W + h*W + w`` indices.
* ``nn.AvgPool3d ap ... ceil_mode=False count_include_pad=False divisor_override=None
  kernel_size=(2,2,2) padding=(0,0,0) stride=(2,2,2)``.
* ``nn.AdaptiveAvgPool3d aap ... output_size=(1,0,2)`` (0: keep that size),
  ``nn.AdaptiveMaxPool3d amp ... output_size=(2,2,2) return_indices=False``; the functional
  ``F.adaptive_max_pool3d`` has ``return_indices=True`` and a second, int64 output (flat
  ``d*H*W + h*W + w`` indices).

Everything runs through the 2-D code, so the numpy fast paths (GEMM, Winograd, pooling blocks)
serve it too: a 3-D convolution is one 2-D convolution of the (N*Do) stacks of its kd depth
slices, the depth taps folded into the channels (a depthwise one: the sum over its depth taps of
2-D depthwise convolutions); a transposed one adds each depth tap's 2-D
transposed convolution into every sd-th output slice. Max and average pooling are separable
over a box window (the average's divisor, with or without the padding, is a product of per-axis
counts): a 2-D pool over (H, W), then a (kd, 1) pool over (D, H*W).
"""

from __future__ import annotations

from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from . import functional as fn
from .base import BuildContext, FusesActivation, Layer
from .pooling import adaptive_slots, index_outputs, ordered_results
from .registry import register
from .shape import runtime_ints


def _triple(op, key: str, default: int | None) -> tuple[int, int, int]:
    if not op.has_param(key) or op.params[key] in (None, []):
        if default is None:
            raise LayerParameterError(f"{op.where}: parameter {key!r} is missing")
        return default, default, default
    v = op.ints(key, 3)
    if len(v) != 3:
        raise LayerParameterError(f"{op.where}: {key}={v} should be one or three integers")
    return int(v[0]), int(v[1]), int(v[2])


def _weight_bias_groups(op, ctx: BuildContext) -> tuple[Any, Any, int]:
    """The 5-D ``@weight``, the ``@bias`` (None without one) and ``groups`` (at least 1)."""
    weight = op.weight("weight", ctx)
    if weight.ndim != 5:
        raise LayerParameterError(f"{op.where}: weight should be 5-D, found shape {tuple(weight.shape)}")
    if op.param("bias", bool, default=None) is False and "bias" in op.attrs:
        raise LayerParameterError(f"{op.where}: parameter bias=False but the file has a weight 'bias'")
    bias = op.weight("bias", ctx) if op.param("bias", bool, default=True) and "bias" in op.attrs else None
    groups = op.param("groups", int, default=1)
    if groups < 1:
        raise LayerParameterError(f"{op.where}: groups={groups} must be at least 1")
    return weight, bias, groups


def conv3d_padding(op) -> Any:
    """A 3-D convolution's ``padding``: "same" (left to the caller, which knows the kernel), or
    ((d_lo, d_hi), (h_lo, h_hi), (w_lo, w_hi)) from "valid", one or three ints, or six in F.pad's
    order (last axis first, as pnnx writes a module's "same")."""
    raw = op.params.get("padding", 0)
    if raw == "same":
        return "same"
    if raw == "valid":
        return ((0, 0),) * 3
    if isinstance(raw, str):
        raise LayerParameterError(f"{op.where}: padding={raw!r} is not supported; expected 'same', "
                                  "'valid', an int or three ints")
    p = op.ints("padding", default=(0,))
    p = (0,) if p is None else p
    if len(p) == 6:
        padding = ((p[4], p[5]), (p[2], p[3]), (p[0], p[1]))
    elif len(p) in (1, 3):
        padding = tuple((v, v) for v in (p * 3 if len(p) == 1 else p))
    else:
        raise LayerParameterError(f"{op.where}: padding={p} should be 1, 3 or 6 integers")
    if min(min(lh) for lh in padding) < 0:
        raise LayerParameterError(f"{op.where}: negative padding {p} is not supported")
    return padding


def _as5d(layer: Layer, x: Any) -> tuple[Any, bool]:
    if x.ndim not in (4, 5):
        raise ShapeError(f"{layer.op_type} {layer.op_name!r}: expects a 5-D input (N, C, D, H, W) or "
                         f"its unbatched 4-D form, got shape {tuple(x.shape)}")
    return (layer.xp.expand_dims(x, axis=0), True) if x.ndim == 4 else (x, False)


def _depth_slices(xp: Any, x: Any, a: int, dd: int, sd: int, do: int) -> Any:
    """Depth tap ``a``'s slices of (N, C, D, H, W) as (N*Do, C, H, W) images."""
    n, c, _, h, w = x.shape
    s = x[:, :, a * dd: a * dd + sd * (do - 1) + 1: sd, ...]
    return xp.reshape(xp.permute_dims(s, (0, 2, 1, 3, 4)), (n * do, c, h, w))


@register("nn.Conv3d")
class Conv3d(FusesActivation, Layer):
    """The runtime may fold the following activation in (applied to the fresh output before its
    axes are put back in (N, C, D, H, W) order)."""

    def __init__(self, ctx: BuildContext, weight: Any, bias: Any, stride, padding, dilation, groups: int,
                 mode: str, where: str):
        super().__init__(ctx)
        self.weight, self.bias, self.where = weight, bias, where
        self.stride, self.padding, self.dilation, self.groups, self.mode = stride, padding, dilation, groups, mode
        o, cg, kd, kh, kw = weight.shape
        self.in_channels = cg * groups
        hw_pads = padding[1:] if mode == "zeros" else ((0, 0), (0, 0))
        plan = getattr(ctx.fast, "conv2d_plan", None)
        xp = ctx.xp
        # the depth taps folded into the channels: one 2-D convolution of (N*Do, C*kd, H, W)
        # stacks of depth slices with the (O, C/g*kd, kh, kw) weight, its bias inside (one GEMM or
        # Winograd of the whole 3-D reduction, no per-tap sums); depthwise convolutions instead
        # run one depthwise 2-D convolution per depth tap and add them up
        self.folded = not (cg == 1 and groups > 1)
        if self.folded:
            ws = [xp.reshape(weight, (o, cg * kd, kh, kw))]
            biases = [bias]
        else:
            ws = [weight[:, :, a, ...] for a in range(kd)]
            biases = [None] * kd
        # a kernel with no spatial extent ((kd, 1, 1): (2+1)-D video blocks' temporal
        # convolutions, pointwise (1, 1, 1) ones) is a 2-D (kd, 1) convolution over (D, H*W)
        # maps: no stacks of depth slices, no permutes, the output already (N, O, Do, H, W)
        self.depth_only = None
        if (kh, kw) == (1, 1) and tuple(stride[1:]) == (1, 1) and hw_pads == ((0, 0), (0, 0)) \
                and mode == "zeros":
            w_d = xp.reshape(weight, (o, cg, kd, 1))
            d_pads = (tuple(padding[0]), (0, 0))
            p = None if plan is None else plan(w_d, bias, stride=(stride[0], 1), dilation=(dilation[0], 1),
                                               groups=groups, pads=d_pads)
            self.depth_only = p if p is not None else (
                lambda x4: fn.conv2d(x4, w_d, bias, (stride[0], 1), d_pads, (dilation[0], 1), groups, xp=self.xp))
        # a depthwise kernel of stride 1 (X3D's and CSN's 3x3x3): the backend's whole 3-D
        # depthwise convolution where it has one (numpy: every tap a slice of the flat volume)
        self.depthwise3d = None
        dw_plan = getattr(ctx.fast, "depthwise3d_plan", None)
        if not self.folded and o == groups and mode == "zeros" and dw_plan is not None and self.depth_only is None:
            self.depthwise3d = dw_plan(weight, bias, stride=stride, dilation=dilation, groups=groups,
                                       pads=tuple(tuple(p) for p in padding))
        self.taps = []
        for w2, b2 in zip(ws, biases) if self.depthwise3d is None else ():
            p = None if plan is None else plan(w2, b2, stride=stride[1:], dilation=dilation[1:], groups=groups,
                                               pads=hw_pads)
            self.taps.append(p if p is not None else (
                lambda x4, w2=w2, b2=b2: fn.conv2d(x4, w2, b2, stride[1:], hw_pads, dilation[1:], groups, xp=self.xp)))

    @classmethod
    def from_operator(cls, op, ctx):
        weight, bias, groups = _weight_bias_groups(op, ctx)
        o, cg = weight.shape[:2]
        if o % groups or (op.has_param("in_channels") and op.param("in_channels", int) != cg * groups):
            raise LayerParameterError(f"{op.where}: weight {tuple(weight.shape)} does not fit groups={groups}")
        stride, dilation = _triple(op, "stride", 1), _triple(op, "dilation", 1)
        padding = conv3d_padding(op)
        if padding == "same":
            padding = fn.same_pads(tuple(weight.shape[2:]), dilation)
        mode = op.param("padding_mode", str, default="zeros")
        if mode not in ("zeros", "reflect", "replicate", "circular"):
            raise LayerParameterError(f"{op.where}: padding_mode={mode!r} is not supported")
        if min(stride) < 1 or min(dilation) < 1 or min(min(p) for p in padding) < 0:
            raise LayerParameterError(f"{op.where}: stride={stride}, dilation={dilation}, padding={padding} "
                                      f"out of range")
        return cls(ctx, weight, bias, stride, padding, dilation, groups, mode, op.where)

    def forward(self, x: Any) -> Any:
        xp = self.xp
        x, unbatched = _as5d(self, x)
        if x.shape[1] != self.in_channels:
            raise ShapeError(f"{self.where}: input has {x.shape[1]} channels (shape {tuple(x.shape)}), "
                             f"the weight expects {self.in_channels}")
        if self.depth_only is not None:
            n, c, d, h, w = x.shape
            if d + sum(self.padding[0]) < self.dilation[0] * (self.weight.shape[2] - 1) + 1:
                raise ShapeError(f"{self.where}: output depth would be empty for input {tuple(x.shape)} (padded)")
            y = self.depth_only(xp.reshape(x, (n, c, d, h * w)))
            y = self._activate(y, "inner")
            y = xp.reshape(y, (n, y.shape[1], y.shape[2], h, w))
            return self._activate(y[0, ...] if unbatched else y, "outer")
        if self.depthwise3d is not None:
            if min(self.depthwise3d.out_size(*x.shape[2:])) <= 0:
                raise ShapeError(f"{self.where}: output would be empty for input {tuple(x.shape)} "
                                 f"(kernel {tuple(self.weight.shape[2:])}, padding {self.padding})")
            y = self._activate(self.depthwise3d(x), "inner")
            return self._activate(y[0, ...] if unbatched else y, "outer")
        if self.mode == "zeros":
            x = fn.pad(x, (self.padding[0], (0, 0), (0, 0)), "zeros", xp=xp)
        else:
            x = fn.pad(x, self.padding, self.mode, xp=xp)
        n, _, dp, hp, wp = x.shape
        kd = self.weight.shape[2]
        (sd, _, _), (dd, _, _) = self.stride, self.dilation
        do = (dp - dd * (kd - 1) - 1) // sd + 1
        if do <= 0:
            raise ShapeError(f"{self.where}: output depth would be empty for input {tuple(x.shape)} (padded)")
        if self.folded:
            c = x.shape[1]
            stack = xp.stack([xp.permute_dims(x[:, :, a * dd: a * dd + sd * (do - 1) + 1: sd, ...], (0, 2, 1, 3, 4))
                              for a in range(kd)], axis=3)  # (N, Do, C, kd, H, W)
            y = self.taps[0](xp.reshape(stack, (n * do, c * kd, hp, wp)))
        else:
            y = None
            for a, tap in enumerate(self.taps):
                t = tap(_depth_slices(xp, x, a, dd, sd, do))
                y = t if y is None else y + t
        o, ho, wo = y.shape[1], y.shape[2], y.shape[3]
        if self.bias is not None and not self.folded:
            y = y + xp.reshape(self.bias, (1, o, 1, 1))
        y = self._activate(y, "inner")
        y = xp.permute_dims(xp.reshape(y, (n, do, o, ho, wo)), (0, 2, 1, 3, 4))
        return self._activate(y[0, ...] if unbatched else y, "outer")


@register("nn.ConvTranspose3d")
class ConvTranspose3d(Layer):
    """torch ``conv_transpose3d``: stride, padding, output_padding, dilation, groups; weight
    ``(C_in, C_out/groups, kd, kh, kw)``; each depth tap's 2-D transposed convolution added into
    every sd-th output slice."""

    def __init__(self, ctx: BuildContext, weight: Any, bias: Any, stride, padding, output_padding, dilation,
                 groups: int, where: str):
        super().__init__(ctx)
        self.weight, self.bias, self.where = weight, bias, where
        self.stride, self.padding, self.output_padding, self.dilation = stride, padding, output_padding, dilation
        self.groups = groups
        plan = getattr(ctx.fast, "conv_transpose2d_plan", None)
        self.taps = []
        for a in range(weight.shape[2]):
            w2 = weight[:, :, a, ...]
            kw = dict(stride=stride[1:], padding=padding[1:], output_padding=output_padding[1:],
                      dilation=dilation[1:], groups=groups)
            p = None if plan is None else plan(w2, None, **kw)
            self.taps.append(p if p is not None else (
                lambda x4, w2=w2, kw=kw: fn.conv_transpose2d(x4, w2, None, xp=self.xp, **kw)))

    @classmethod
    def from_operator(cls, op, ctx):
        weight, bias, groups = _weight_bias_groups(op, ctx)
        if weight.shape[0] % groups:
            raise LayerParameterError(f"{op.where}: weight {tuple(weight.shape)} does not fit groups={groups}")
        stride, padding = _triple(op, "stride", 1), _triple(op, "padding", 0)
        output_padding, dilation = _triple(op, "output_padding", 0), _triple(op, "dilation", 1)
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or min(output_padding) < 0 or any(
                op_ >= max(s, d) for op_, s, d in zip(output_padding, stride, dilation)):
            raise LayerParameterError(f"{op.where}: stride={stride}, padding={padding}, output_padding="
                                      f"{output_padding}, dilation={dilation} out of range")
        return cls(ctx, weight, bias, stride, padding, output_padding, dilation, groups, op.where)

    def forward(self, x: Any) -> Any:
        xp = self.xp
        x, unbatched = _as5d(self, x)
        if x.shape[1] != self.weight.shape[0]:
            raise ShapeError(f"{self.where}: input has {x.shape[1]} channels (shape {tuple(x.shape)}), "
                             f"the weight expects {self.weight.shape[0]}")
        n, c, d, h, w = x.shape
        kd = self.weight.shape[2]
        sd, pd, opd, dd = self.stride[0], self.padding[0], self.output_padding[0], self.dilation[0]
        df = (d - 1) * sd + dd * (kd - 1) + 1 + opd
        do = df - 2 * pd
        if do <= 0:
            raise ShapeError(f"{self.where}: output depth would be empty for input {tuple(x.shape)}")
        x4 = xp.reshape(xp.permute_dims(x, (0, 2, 1, 3, 4)), (n * d, c, h, w))
        full = None
        for a, tap in enumerate(self.taps):
            t = tap(x4)
            o, ho, wo = t.shape[1], t.shape[2], t.shape[3]
            t = xp.permute_dims(xp.reshape(t, (n, d, o, ho, wo)), (0, 2, 1, 3, 4))
            if full is None:
                full = xp.zeros((n, o, df, ho, wo), dtype=t.dtype, device=self.device)
            key = (slice(None), slice(None), slice(a * dd, a * dd + sd * (d - 1) + 1, sd), slice(None), slice(None))
            full[key] = full[key] + t
        y = full[:, :, pd: pd + do, ...]
        if self.bias is not None:
            y = y + xp.reshape(self.bias, (1, y.shape[1], 1, 1, 1))
        return y[0, ...] if unbatched else y


class _Pool3d(Layer):
    def __init__(self, ctx: BuildContext, kernel, stride, padding, dilation, ceil_mode: bool, where: str):
        super().__init__(ctx)
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, padding, dilation
        self.ceil_mode, self.where = ceil_mode, where

    @staticmethod
    def _window(op, has_dilation: bool):
        kernel = _triple(op, "kernel_size", None)
        stride = kernel if op.params.get("stride") in (None, []) else _triple(op, "stride", 1)
        padding = _triple(op, "padding", 0)
        dilation = _triple(op, "dilation", 1) if has_dilation else (1, 1, 1)
        if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or any(
                p > (d * (k - 1) + 1) // 2 for k, p, d in zip(kernel, padding, dilation)):
            raise LayerParameterError(f"{op.where}: kernel_size={kernel}, stride={stride}, padding={padding}, "
                                      f"dilation={dilation} out of range (padding at most half the window)")
        return kernel, stride, padding, dilation

    def _separable(self, x: Any, pool2d) -> Any:
        """``pool2d(x4, kernel, stride, padding, dilation)`` over (H, W), then over (D, H*W)."""
        xp = self.xp
        x, unbatched = _as5d(self, x)
        n, c, d, h, w = x.shape
        (kd, kh, kw), (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = self.kernel, self.stride, self.padding, self.dilation
        y = pool2d(xp.reshape(x, (n, c * d, h, w)), (kh, kw), (sh, sw), (ph, pw), (dh, dw))
        ho, wo = y.shape[2], y.shape[3]
        y = pool2d(xp.reshape(y, (n, c, d, ho * wo)), (kd, 1), (sd, 1), (pd, 0), (dd, 1))
        y = xp.reshape(y, (n, c, y.shape[2], ho, wo))
        return y[0, ...] if unbatched else y


@register("nn.MaxPool3d", "F.max_pool3d")
class MaxPool3d(_Pool3d):
    """With ``return_indices`` (two outputs) also the flat ``d*H*W + h*W + w`` input index of
    each maximum: the (H, W) pass's indices picked at the depth the second pass chose (the first
    maximum in (d, h, w) order, as torch scans)."""

    def __init__(self, ctx, kernel, stride, padding, dilation, ceil_mode, where, return_indices=False,
                 order: tuple[str, ...] | None = None):
        super().__init__(ctx, kernel, stride, padding, dilation, ceil_mode, where)
        self.return_indices = return_indices
        self.order = order or (("values", "indices") if return_indices else ("values",))

    @classmethod
    def from_operator(cls, op, ctx):
        ri, order = index_outputs(op, op.param("return_indices", bool, default=False))
        return cls(ctx, *cls._window(op, True), op.param("ceil_mode", bool, default=False), op.where, ri, order)

    def forward(self, x: Any) -> Any:
        if self.return_indices:
            return ordered_results(self.order, *self._with_indices(x))
        fast = getattr(self.backend.fast, "max_pool2d", None)

        def pool2d(x4, k, s, p, d):
            if fast is not None:
                return fast(x4, k, s, p, d, self.ceil_mode)
            return fn.max_pool2d(x4, k, s, p, d, self.ceil_mode, False, xp=self.xp)
        return self._separable(x, pool2d)

    def _with_indices(self, x: Any) -> tuple[Any, Any]:
        xp = self.xp
        x, unbatched = _as5d(self, x)
        n, c, d, h, w = x.shape
        (kd, kh, kw), (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = self.kernel, self.stride, self.padding, self.dilation
        v, i_hw = fn.max_pool2d(xp.reshape(x, (n, c * d, h, w)), (kh, kw), (sh, sw), (ph, pw), (dh, dw),
                                self.ceil_mode, True, xp=xp)
        ho, wo = v.shape[2], v.shape[3]
        v, i_d = fn.max_pool2d(xp.reshape(v, (n, c, d, ho * wo)), (kd, 1), (sd, 1), (pd, 0), (dd, 1),
                               self.ceil_mode, True, xp=xp)
        do = v.shape[2]
        depth = i_d // (ho * wo)  # (N, C, Do, Ho*Wo): the input depth of each maximum
        hw = xp.take_along_axis(xp.reshape(i_hw, (n, c, d, ho * wo)), xp.astype(depth, xp.int64), axis=2)
        idx = xp.reshape(xp.astype(depth, xp.int64) * (h * w) + xp.astype(hw, xp.int64), (n, c, do, ho, wo))
        v = xp.reshape(v, (n, c, do, ho, wo))
        return (v[0, ...], idx[0, ...]) if unbatched else (v, idx)


@register("nn.AvgPool3d", "F.avg_pool3d")
class AvgPool3d(_Pool3d):
    """torch ``avg_pool3d``: kernel, stride (None = kernel), padding, ceil_mode,
    count_include_pad, divisor_override; separable over the box window."""

    def __init__(self, ctx, kernel, stride, padding, dilation, ceil_mode, where, count_include_pad, divisor):
        super().__init__(ctx, kernel, stride, padding, dilation, ceil_mode, where)
        self.count_include_pad, self.divisor = count_include_pad, divisor

    @classmethod
    def from_operator(cls, op, ctx):
        div = op.param("divisor_override", int, default=None)
        if div is not None and div <= 0:
            raise LayerParameterError(f"{op.where}: divisor_override={div} must be positive")
        return cls(ctx, *cls._window(op, False), op.param("ceil_mode", bool, default=False), op.where,
                   op.param("count_include_pad", bool, default=True), div)

    def forward(self, x: Any) -> Any:
        fast = getattr(self.backend.fast, "avg_pool2d", None)
        # with divisor_override: window sums (a divisor of 1 on each pass), then the one division
        div = None if self.divisor is None else 1

        def pool2d(x4, k, s, p, _):
            args = (x4, k, s, p, self.ceil_mode, self.count_include_pad, div)
            y = fast(*args) if fast is not None else None
            return fn.avg_pool2d(*args, xp=self.xp) if y is None else y
        y = self._separable(x, pool2d)
        return y if self.divisor is None else y / self.divisor


def _adaptive_size(raw, what: str, err: type[Exception]) -> tuple[int | None, int | None, int | None]:
    if raw is None:
        raise err(f"{what} is None")
    raw = list(raw)
    raw = raw * 3 if len(raw) == 1 else raw
    if len(raw) != 3 or not all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in raw):
        raise err(f"{what}={raw!r} should be 3 sizes (0 or None keeps the input size)")
    return tuple(None if v in (None, 0) else v for v in raw)


class _Adaptive3d(Layer):
    def __init__(self, ctx: BuildContext, size, return_indices: bool, where: str, slots: dict[str, int],
                 order: tuple[str, ...] | None = None):
        super().__init__(ctx)
        self.size, self.return_indices, self.where, self.slots = size, return_indices, where, slots
        self.order = order or (("values", "indices") if return_indices else ("values",))

    @classmethod
    def from_operator(cls, op, ctx):
        ri, order = index_outputs(op, op.param("return_indices", bool, default=False))
        slots = adaptive_slots(op)
        size = None if "output_size" in slots else _adaptive_size(
            op.param("output_size", list), f"{op.where}: output_size", LayerParameterError)
        return cls(ctx, size, ri, op.where, slots, order)

    def _operands(self, inputs: tuple) -> tuple[Any, tuple]:
        """The input and its output size (the parameter, or the ``$output_size`` operand pnnx
        writes when the input's size is dynamic)."""
        x = inputs[self.slots["input"]]
        if self.size is not None:
            return x, self.size
        raw = runtime_ints(inputs[self.slots["output_size"]], self.where, "output_size")
        return x, _adaptive_size(raw, f"{self.where}: output_size", ShapeError)

    def _out(self, x: Any, size: tuple) -> tuple[int, int, int]:
        out = tuple(s if o is None else o for s, o in zip(x.shape[2:], size))
        if min(x.shape[2:]) == 0:
            raise ShapeError(f"{self.where}: cannot pool input {tuple(x.shape)} to {out}")
        return out

    def _separable(self, x: Any, size: tuple, pool2d) -> Any:
        xp = self.xp
        x, unbatched = _as5d(self, x)
        n, c, d, h, w = x.shape
        od, oh, ow = self._out(x, size)
        y = pool2d(xp.reshape(x, (n, c * d, h, w)), (oh, ow))
        y = xp.reshape(pool2d(xp.reshape(y, (n, c, d, oh * ow)), (od, oh * ow)), (n, c, od, oh, ow))
        return y[0, ...] if unbatched else y


@register("nn.AdaptiveAvgPool3d", "F.adaptive_avg_pool3d")
class AdaptiveAvgPool3d(_Adaptive3d):
    """torch ``adaptive_avg_pool3d`` to any output size (0 / None keeps a size); separable."""

    def forward(self, *inputs: Any) -> Any:
        x, size = self._operands(inputs)
        return self._separable(x, size, lambda x4, out: fn.adaptive_avg_pool2d(x4, out, xp=self.xp))


@register("nn.AdaptiveMaxPool3d", "F.adaptive_max_pool3d")
class AdaptiveMaxPool3d(_Adaptive3d):
    """Without indices: separable. With them (the functional form): one max and argmax per
    output bin, the argmax turned into a flat ``d*H*W + h*W + w`` index as torch gives."""

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x, size = self._operands(inputs)
        if not self.return_indices:
            return self._separable(x, size, lambda x4, out: fn.adaptive_max_pool2d(x4, out, False, xp=xp))
        x, unbatched = _as5d(self, x)
        n, c, d, h, w = x.shape
        od, oh, ow = self._out(x, size)
        vals, idxs = [], []
        for d0, d1 in fn.adaptive_bounds(d, od):
            for h0, h1 in fn.adaptive_bounds(h, oh):
                for w0, w1 in fn.adaptive_bounds(w, ow):
                    # (the window's size spelled out: numpy cannot infer -1 for an empty batch)
                    region = xp.reshape(x[:, :, d0:d1, h0:h1, w0:w1], (n, c, (d1 - d0) * (h1 - h0) * (w1 - w0)))
                    vals.append(xp.max(region, axis=2))
                    r = fn.window_argmax(region, 2, xp=xp)  # torch: first maximum, else last NaN
                    bh, bw = h1 - h0, w1 - w0
                    idxs.append((d0 + r // (bh * bw)) * (h * w) + (h0 + (r // bw) % bh) * w + (w0 + r % bw))
        v = xp.reshape(xp.stack(vals, axis=2), (n, c, od, oh, ow))
        i = xp.reshape(xp.stack(idxs, axis=2), (n, c, od, oh, ow))
        return ordered_results(self.order, *((v[0, ...], i[0, ...]) if unbatched else (v, i)))
