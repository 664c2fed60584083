"""Convolution layers: ``nn.Conv1d/2d``, ``F.conv1d/2d``, ``nn.ConvTranspose1d/2d``,
``F.conv_transpose1d/2d``.

1-D layers run as 2-D ones over an ``(N, C, 1, L)`` view. Weights given as ``@weight``/``@bias``
attributes are checked and packed once at build; the ``F.*`` forms may instead take them as
input operands (``$weight``, ``$bias``), which are then used as they arrive. On NumPy the layer
builds a plan from ``backends/numpy_fast`` (GEMM with pre-packed weights, 1x1 and depthwise
special cases, Winograd where it wins); the generic Array-API path in :mod:`.functional` is the
reference.

``fused_activation`` (None by default) is the hook for the runtime to fold a following
activation into the convolution: ``"relu"``, ``("clamp", min, max)``, ``("leaky", slope)``,
``("elu", alpha, scale, divisor)`` or any callable taking and returning an array, or (fast path
only) a name from the fast backend's ``UNARY_ACTIVATIONS``
("silu", "sigmoid", "hardswish", "gelu", ...). The fast path applies all but callables in place
on the fresh output.
"""

from __future__ import annotations

from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from . import functional as fn
from .base import BuildContext, SpatialLayer, apply_plain_spec, checked_activation, is_plain_spec
from .misc import operand_slots
from .registry import register


def _dims(op) -> int:
    return 1 if op.type.endswith("1d") else 2


def _to2(v: tuple[int, ...], nd: int, fill: int) -> tuple[int, int]:
    return (fill, v[0]) if nd == 1 else (v[0], v[1])


def _weight_and_bias(op, ctx: BuildContext, slots: dict[str, int]):
    """(weight array or None if a runtime input, bias array or None, whether bias is a runtime
    input)."""
    weight = None
    if "weight" not in slots:
        weight = op.weight("weight", ctx)
    bias_flag = op.param("bias", None, default=None)
    bias = None
    bias_runtime = "bias" in slots
    if not bias_runtime:
        bias = op.weight("bias", ctx, optional=True)
        if bias_flag is True and bias is None:
            raise LayerParameterError(f"{op.where}: parameter bias=True but weight 'bias' is missing")
        if bias_flag is False and bias is not None:
            raise LayerParameterError(f"{op.where}: parameter bias=False but the file has a weight 'bias'")
    return weight, bias, bias_runtime


def _check_weight(op: Any, ctx: Any, weight: Any, bias: Any, nd: int, groups: int,
                  transposed: bool) -> tuple[Any, int, int]:
    """Check a convolution weight against the op's parameters; 1-D weights get a unit height.
    Weights are (out, in/groups, kh, kw), or (in, out/groups, kh, kw) when ``transposed``."""
    if weight.ndim != nd + 2:
        raise LayerParameterError(f"{op.where}: weight has shape {tuple(weight.shape)}, expected "
                                  f"{nd + 2} dimensions")
    if nd == 1:
        weight = ctx.xp.expand_dims(weight, axis=2)
    lead, per_group, kh, kw = weight.shape
    if lead % groups:
        name = "in_channels" if transposed else "out_channels"
        raise LayerParameterError(f"{op.where}: {name} {lead} is not divisible by groups={groups}")
    declared = tuple(op.attrs["weight"].shape) if "weight" in op.attrs else tuple(weight.shape)
    ks = op.ints("kernel_size", nd, default=None)
    if ks is not None and _to2(ks, nd, 1) != (kh, kw):
        raise LayerParameterError(f"{op.where}: kernel_size={ks} does not match weight shape {declared}")
    cin, cout = (lead, per_group * groups) if transposed else (per_group * groups, lead)
    for key, want, grouped in (("in_channels", cin, not transposed), ("out_channels", cout, transposed)):
        got = op.param(key, int, default=None)
        if got is not None and got != want:
            raise LayerParameterError(f"{op.where}: {key}={got} does not match weight shape {declared}"
                                      + (f" with groups={groups}" if grouped else ""))
    if bias is not None and tuple(bias.shape) != (cout,):
        raise LayerParameterError(f"{op.where}: bias has shape {tuple(bias.shape)}, expected ({cout},)")
    return weight, kh, kw


class _ConvBase(SpatialLayer):
    fused_activation: Any = None

    def set_fused_activation(self, spec: Any) -> None:
        """Fold an activation into this layer's output (see the module docstring). A name from
        the fast backend's ``UNARY_ACTIVATIONS`` ("silu", "sigmoid", ...) is accepted only when
        the fast path applies it (a ValueError otherwise, and the runtime does not fuse)."""
        if isinstance(spec, str) and spec in getattr(self.backend.fast, "UNARY_ACTIVATIONS", ()):
            if not self._fast_ok:
                raise ValueError(f"fused activation {spec!r} needs the backend's fast path")
            self.fused_activation = spec
            return
        self.fused_activation = checked_activation(spec)

    def _weight_and_bias(self, inputs: tuple[Any, ...]) -> tuple[Any, Any]:
        """The built weight and bias, or those given as operator inputs (``F.conv2d``)."""
        weight, bias = self.weight, self.bias
        if weight is None:
            weight = inputs[self.slots["weight"]]
            if weight.ndim != self.nd + 2:
                raise ShapeError(f"{self.op_type} {self.op_name!r}: weight has shape {tuple(weight.shape)}, "
                                 f"expected {self.nd + 2} dimensions")
            if self.nd == 1:
                weight = self.xp.expand_dims(weight, axis=2)
        if "bias" in self.slots:
            bias = inputs[self.slots["bias"]]
        return weight, bias

    def _activate(self, y: Any) -> Any:
        act = self.fused_activation
        if act is None:
            return y
        fast_act = getattr(self.backend.fast, "activation_inplace", None) if self._fast_ok else None
        if fast_act is not None and not callable(act):
            return fast_act(y, act)
        if is_plain_spec(act):
            return apply_plain_spec(self.xp, y, act)
        return act(y)

    def _check_channels(self, x: Any, orig_shape: tuple[int, ...], weight_shape: tuple[int, ...],
                        expected: int) -> None:
        if x.shape[1] != expected:
            if self.nd == 1 and len(weight_shape) == 4:
                weight_shape = weight_shape[:2] + weight_shape[3:]
            raise ShapeError(
                f"{self.op_type} {self.op_name!r}: input has {x.shape[1]} channels (shape "
                f"{tuple(orig_shape)}) but the weight {tuple(weight_shape)} with groups={self.groups} "
                f"expects {expected}")


#: numpy plans (``Conv2dPlan.algo``) that keep a re-laid-out copy and not the weight itself
_PACKED_ONLY = ("1x1", "patch", "depthwise", "shift")


class _Shape:
    """What a convolution reads of its weight once a plan holds the values: shape and dtype."""

    __slots__ = ("shape", "ndim", "dtype")

    def __init__(self, weight: Any) -> None:
        self.shape, self.ndim, self.dtype = tuple(weight.shape), weight.ndim, weight.dtype


@register("nn.Conv1d", "nn.Conv2d", "F.conv1d", "F.conv2d")
class Convolution(_ConvBase):
    """torch ``conv1d``/``conv2d``: stride, dilation, groups, padding as ints, pairs, ``same``,
    ``valid``; ``padding_mode`` zeros / reflect / replicate / circular; bias optional."""

    def __init__(self, ctx: BuildContext, *, nd: int, weight: Any, bias: Any, stride, dilation,
                 groups: int, pads: fn.Pads, padding_mode: str, slots: dict[str, int],
                 in_channels: int | None, input_hw: tuple | None = None):
        super().__init__(ctx)
        self.nd = nd
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.pads, self.padding_mode = pads, padding_mode
        self.slots = slots
        self.in_channels = in_channels
        self.weight = weight  # 4-D (O, C/G, kh, kw), None when it is a runtime input
        self.bias = bias
        self._fast_ok = ctx.fast is not None
        self._plan = None
        self.input_hw = input_hw
        self.channels_last_out = False  # set by the runtime: the consumer reads channels-last
        if weight is not None and ctx.fast is not None and hasattr(ctx.fast, "conv2d_plan"):
            plan_pads = pads if padding_mode == "zeros" else ((0, 0), (0, 0))
            # one plan (packed or transformed weights) for convolutions with the same weights
            # (a module called several times: ctx.weight returns equal weights as one array)
            self._plan = ctx.memo(
                ("conv2d_plan", id(weight), id(bias), stride, dilation, groups, plan_pads, input_hw),
                lambda: ctx.fast.conv2d_plan(weight, bias, stride=stride, dilation=dilation, groups=groups,
                                             pads=plan_pads, input_hw=input_hw), weight, bias)
            if getattr(self._plan, "algo", None) in _PACKED_ONLY:
                # the plan holds the only copy it needs (1x1, depthwise, ...): the layer keeps
                # the weight's shape for its checks, not a second copy of the values (ResNet-101
                # held 80 MiB of 1x1 weights twice)
                self.weight = _Shape(weight)

    @classmethod
    def from_operator(cls, op, ctx):
        nd = _dims(op)
        slots = operand_slots(op, ("input", "weight", "bias"))
        weight, bias, _ = _weight_and_bias(op, ctx, slots)
        stride = _to2(op.ints("stride", nd, default=(1,) * nd), nd, 1)
        dilation = _to2(op.ints("dilation", nd, default=(1,) * nd), nd, 1)
        groups = op.param("groups", int, default=1)
        mode = op.param("padding_mode", str, default="zeros")
        if mode not in fn.PAD_MODES:
            raise LayerParameterError(f"{op.where}: padding_mode={mode!r} is not supported; "
                                      f"supported: {', '.join(fn.PAD_MODES)}")
        if groups < 1 or any(s < 1 for s in stride) or any(d < 1 for d in dilation):
            raise LayerParameterError(f"{op.where}: groups={groups}, stride={stride}, dilation={dilation} "
                                      "must be positive")
        if weight is not None:
            weight, kh, kw = _check_weight(op, ctx, weight, bias, nd, groups, transposed=False)
            kernel = (kh, kw)
        else:
            ks = op.ints("kernel_size", nd, default=None)
            kernel = None if ks is None else _to2(ks, nd, 1)
        pads = cls._pads(op, nd, kernel, stride, dilation, weight_known=weight is not None)
        cls._check_declared_size(op, slots, nd, kernel, stride, dilation, pads)
        in_channels = None if weight is None else weight.shape[1] * groups
        return cls(ctx, nd=nd, weight=weight, bias=bias, stride=stride, dilation=dilation, groups=groups,
                   pads=pads, padding_mode=mode, slots=slots, in_channels=in_channels,
                   input_hw=cls._input_hw(op, slots, nd, pads, mode))

    @staticmethod
    def _check_declared_size(op, slots, nd, kernel, stride, dilation, pads):
        """Refuse parameters that do not give the output size the file declares for the
        declared input size (a padding of 10**8 asked for gigabytes before any check)."""
        shapes = [op.inputs[slots["input"]].shape if slots["input"] < len(op.inputs) else None,
                  op.outputs[0].shape if op.outputs else None]
        if kernel is None or pads == "same" or None in shapes or len(shapes[0]) != len(shapes[1]) \
                or len(shapes[0]) < nd + 1:
            return
        (ih, iw), (oh, ow) = ((((1,) + tuple(sh[-1:])) if nd == 1 else tuple(sh[-2:])) for sh in shapes)
        for a, (i, o) in enumerate(((ih, oh), (iw, ow))):
            if i is None or o is None:
                continue
            want = (i + sum(pads[a]) - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1
            if want != o:
                axis = "length" if nd == 1 else ("height", "width")[a]
                raise LayerParameterError(
                    f"{op.where}: kernel {kernel[a]}, stride {stride[a]}, padding {pads[a]}, dilation "
                    f"{dilation[a]} give an output {axis} of {want} for the declared input {axis} {i}; "
                    f"the file declares {o}")

    @staticmethod
    def _input_hw(op, slots, nd, pads, mode):
        """The annotated spatial size the convolution kernel sees (after a non-zero padding
        mode pads it), for the fast path's choice of algorithm; None when unknown."""
        shape = op.inputs[slots["input"]].shape if slots["input"] < len(op.inputs) else None
        if shape is None or len(shape) < nd + 1:
            return None
        hw = (1,) + tuple(shape[-1:]) if nd == 1 else tuple(shape[-2:])
        if None in hw or pads == "same":
            return None
        if mode != "zeros":
            hw = (hw[0] + sum(pads[0]), hw[1] + sum(pads[1]))
        return hw

    @staticmethod
    def _pads(op, nd, kernel, stride, dilation, weight_known):
        raw = op.params.get("padding", 0)
        if isinstance(raw, str):
            if raw == "valid":
                return ((0, 0), (0, 0))
            if raw != "same":
                raise LayerParameterError(f"{op.where}: padding={raw!r} is not supported; expected "
                                          "'same', 'valid', an int or a tuple")
            same = True
        elif raw is None:
            # pnnx writes padding=() for padding='same' with a non-zero padding_mode and an even
            # kernel (torch keeps the asymmetric pads in a private field); read it as 'same'
            same = True
        else:
            same = False
        if same:
            if stride != (1, 1):
                raise LayerParameterError(f"{op.where}: padding='same' needs stride 1, found stride={stride}")
            if kernel is None:
                return "same"
            return fn.same_pads(kernel, dilation)
        if isinstance(raw, (list, tuple)) and len(raw) == 2 * nd:
            # pnnx writes padding='same' with a non-zero padding_mode and an even kernel as
            # torch's private F.pad-order pads, last axis first: (left, right[, top, bottom])
            q = op.ints("padding", 2 * nd)
            if any(v < 0 for v in q):
                raise LayerParameterError(f"{op.where}: negative padding {q} is not supported")
            return ((0, 0), (q[0], q[1])) if nd == 1 else ((q[2], q[3]), (q[0], q[1]))
        p = op.ints("padding", nd, default=(0,) * nd)
        if any(v < 0 for v in p):
            raise LayerParameterError(f"{op.where}: negative padding {p} is not supported")
        p2 = _to2(p, nd, 0)
        return ((p2[0], p2[0]), (p2[1], p2[1]))

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x0 = inputs[self.slots["input"]]
        x, unbatched = self._as4d(x0)
        weight, bias = self._weight_and_bias(inputs)
        plan = self._plan
        self._check_channels(x, tuple(x0.shape), tuple(weight.shape), weight.shape[1] * self.groups)
        if weight.shape[0] % self.groups:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: weight {tuple(weight.shape)} has "
                             f"{weight.shape[0]} output channels, not divisible by groups={self.groups}")
        pads = self.pads
        if pads == "same":
            pads = fn.same_pads(tuple(weight.shape[2:]), self.dilation)
        if self.padding_mode != "zeros":
            x = self._pad_mode(x, pads)
            pads = ((0, 0), (0, 0))
        fast = self.backend.fast
        if plan is None and fast is not None and hasattr(fast, "conv2d_plan"):
            plan = fast.conv2d_plan(weight, bias, stride=self.stride, dilation=self.dilation,
                                    groups=self.groups, pads=pads, transient=True)
        act = self.fused_activation
        if (self.channels_last_out and plan is not None and plan is self._plan and not unbatched
                and (act is None or not callable(act))):
            return plan(x, act, channels_last=True)
        if plan is not None and act is not None and not callable(act) and isinstance(plan, fast.Conv2dPlan):
            # the plan applies it (a depthwise plan inside its cache-sized blocks)
            return self._from4d(plan(x, act), unbatched)
        if plan is not None:
            y = plan(x)
        else:
            y = fn.conv2d(x, weight, bias, self.stride, pads, self.dilation, self.groups, xp=xp)
        return self._activate(self._from4d(y, unbatched))

    def reads_channels_last(self) -> bool:
        """True when this convolution (a depthwise one on a small map, numpy backend) reads a
        channels-last input without a transposing copy."""
        plan = self._plan
        return (plan is not None and self.padding_mode == "zeros" and self.nd == 2
                and getattr(plan, "reads_channels_last", lambda hw: False)(self.input_hw))

    def _pad_mode(self, x: Any, pads: fn.Pads) -> Any:
        fast_pad = getattr(self.backend.fast, "pad", None)
        fn.check_pad(tuple(x.shape), pads, self.padding_mode)
        if fast_pad is not None:
            return fast_pad(x, pads, self.padding_mode)
        return fn.pad(x, pads, self.padding_mode, xp=self.xp)


@register("nn.ConvTranspose1d", "nn.ConvTranspose2d", "F.conv_transpose1d", "F.conv_transpose2d")
class ConvTranspose(_ConvBase):
    """torch ``conv_transpose1d``/``2d``: stride, padding, output_padding, dilation, groups;
    weight ``(C_in, C_out/groups, kh, kw)``."""

    def __init__(self, ctx: BuildContext, *, nd: int, weight: Any, bias: Any, stride, padding,
                 output_padding, dilation, groups: int, slots: dict[str, int]):
        super().__init__(ctx)
        self.nd = nd
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        self.weight, self.bias, self.slots = weight, bias, slots
        self._fast_ok = ctx.fast is not None
        self._plan = None
        if weight is not None and ctx.fast is not None and hasattr(ctx.fast, "conv_transpose2d_plan"):
            self._plan = ctx.fast.conv_transpose2d_plan(
                weight, bias, stride=stride, padding=padding, output_padding=output_padding,
                dilation=dilation, groups=groups)

    def _empty_map(self, x: Any, weight: Any, shape: tuple) -> Any:
        """The output for an input with an empty spatial dimension: an empty batch of the size
        the formula gives (torch's), or, with images in the batch, a ShapeError as torch raises."""
        sizes = [fn.conv_transpose_out_size(i, k, s, d, p, q) for i, s, p, d, k, q in zip(
            x.shape[2:], self.stride, self.padding, self.dilation, weight.shape[2:], self.output_padding)]
        if x.shape[0] != 0 or min(sizes) <= 0:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: input of shape {shape} has an empty "
                             "spatial dimension; only an empty batch is supported (as in torch)")
        return self.xp.zeros((0, weight.shape[1] * self.groups, *sizes), dtype=x.dtype, device=self.device)

    @classmethod
    def from_operator(cls, op, ctx):
        nd = _dims(op)
        slots = operand_slots(op, ("input", "weight", "bias"))
        weight, bias, _ = _weight_and_bias(op, ctx, slots)
        stride = _to2(op.ints("stride", nd, default=(1,) * nd), nd, 1)
        dilation = _to2(op.ints("dilation", nd, default=(1,) * nd), nd, 1)
        out_pad = _to2(op.ints("output_padding", nd, default=(0,) * nd), nd, 0)
        groups = op.param("groups", int, default=1)
        if isinstance(op.params.get("padding"), str):
            raise LayerParameterError(f"{op.where}: padding={op.params['padding']!r} is not supported "
                                      "by transposed convolutions; expected an int or a tuple")
        padding = _to2(op.ints("padding", nd, default=(0,) * nd), nd, 0)
        mode = op.param("padding_mode", str, default="zeros")
        if mode != "zeros":
            raise LayerParameterError(f"{op.where}: padding_mode={mode!r} is not supported for transposed "
                                      "convolutions (torch allows only 'zeros')")
        if groups < 1 or any(s < 1 for s in stride) or any(d < 1 for d in dilation) or min(padding) < 0:
            raise LayerParameterError(f"{op.where}: groups={groups}, stride={stride}, dilation={dilation}, "
                                      f"padding={padding} out of range")
        for op_, s, d in zip(out_pad, stride, dilation):
            if op_ < 0 or (op_ >= s and op_ >= d):
                raise LayerParameterError(f"{op.where}: output_padding={out_pad} must be smaller than "
                                          f"stride {stride} or dilation {dilation}")
        if weight is not None:
            weight, _, _ = _check_weight(op, ctx, weight, bias, nd, groups, transposed=True)
        return cls(ctx, nd=nd, weight=weight, bias=bias, stride=stride, padding=padding,
                   output_padding=out_pad, dilation=dilation, groups=groups, slots=slots)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x0 = inputs[self.slots["input"]]
        x, unbatched = self._as4d(x0)
        weight, bias = self._weight_and_bias(inputs)
        plan = self._plan
        self._check_channels(x, tuple(x0.shape), tuple(weight.shape), weight.shape[0])
        if weight.shape[0] % self.groups:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: weight {tuple(weight.shape)} has "
                             f"{weight.shape[0]} input channels, not divisible by groups={self.groups}")
        if x.shape[2] * x.shape[3] == 0:  # an empty map: torch takes it in an empty batch only
            return self._activate(self._from4d(self._empty_map(x, weight, tuple(x0.shape)), unbatched))
        fast = self.backend.fast
        if plan is None and fast is not None and hasattr(fast, "conv_transpose2d_plan"):
            plan = fast.conv_transpose2d_plan(
                weight, bias, stride=self.stride, padding=self.padding,
                output_padding=self.output_padding, dilation=self.dilation, groups=self.groups)
        if plan is not None:
            y = plan(x)
        else:
            y = fn.conv_transpose2d(x, weight, bias, self.stride, self.padding, self.output_padding,
                                    self.dilation, self.groups, xp=xp)
        return self._activate(self._from4d(y, unbatched))
