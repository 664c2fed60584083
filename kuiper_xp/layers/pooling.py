"""Pooling layers: max, average, adaptive average and adaptive max, 1-D and 2-D.

pnnx writes ``stride=None`` for the functional forms (meaning stride = kernel), ``output_size``
entries of 0 for torch's ``None`` (keep that input size), and ``return_indices=True`` for
``F.adaptive_max_pool*`` even when the indices are unused; the layers then return
``(values, int64 indices)`` as torch does. 1-D layers run as 2-D over an ``(N, C, 1, L)`` view;
unbatched inputs (no ``N``) are accepted as torch accepts them.
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.limits import check_elements

from . import functional as fn
from .base import BuildContext, Layer, SpatialLayer
from .misc import index_array, to_int, to_int_list
from .registry import register
from .scatter import segment_scatter
from .shape import input_slots, runtime_ints


def _dims(op) -> int:
    return 1 if op.type.endswith("1d") else 2


def _to2(v: tuple[int, ...], nd: int, fill: int) -> tuple[int, int]:
    return (fill, v[0]) if nd == 1 else (v[0], v[1])


def _n_outputs(op, return_indices: bool) -> None:
    want = 2 if return_indices else 1
    if op.outputs and len(op.outputs) != want:
        raise LayerParameterError(f"{op.where}: return_indices={return_indices} needs {want} output(s), "
                                  f"the operator has {len(op.outputs)}")


def index_outputs(op, return_indices: bool) -> tuple[bool, tuple[str, ...]]:
    """``(return_indices, what each output is)`` for a max pool, from the declared dtypes: pnnx
    lists a module's results in the order the model first uses them (``nn.MaxPool2d(...,
    return_indices=True)`` with the indices read first: the int64 output first) and writes the
    indices alone as one int64 output with ``return_indices=False``. Torch's order (values,
    indices) where the dtypes do not say otherwise."""
    outs = op.outputs
    is_index = [(o.array_dtype or "").startswith(("int", "uint")) for o in outs]
    if len(outs) == 1 and is_index[0]:
        return True, ("indices",)
    if (len(outs) == 1 and return_indices and outs[0].array_dtype is None and outs[0].consumers
            and all(c.type == "prim::TupleUnpack" for c in outs[0].consumers)):
        return True, ("pair",)  # (one tuple value, unpacked by a prim::TupleUnpack: adaptive modules)
    if len(outs) == 2 and (return_indices or any(is_index)):
        return True, ("indices", "values") if is_index[0] and not is_index[1] else ("values", "indices")
    _n_outputs(op, return_indices)
    return return_indices, ("values", "indices") if return_indices else ("values",)


def ordered_results(order: tuple[str, ...], values: Any, indices: Any) -> Any:
    """A max pool's results in the file's output order (see :func:`index_outputs`)."""
    if order == ("values", "indices"):
        return values, indices
    if order == ("indices",):
        return indices
    if order == ("pair",):
        return (values, indices)
    return indices, values


class _PoolBase(SpatialLayer):
    nd = 2


def _window(op, nd, has_dilation: bool):
    kernel = _to2(op.ints("kernel_size", nd), nd, 1)
    stride_raw = op.params.get("stride")
    stride = kernel if stride_raw is None or stride_raw == [] else _to2(op.ints("stride", nd), nd, 1)
    padding = _to2(op.ints("padding", nd, default=(0,) * nd), nd, 0)
    dilation = _to2(op.ints("dilation", nd, default=(1,) * nd), nd, 1) if has_dilation else (1, 1)
    return _check_window(kernel, stride, padding, dilation, op.where, LayerParameterError)


def _check_window(kernel, stride, padding, dilation, where: str, err: type[Exception]):
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise err(f"{where}: kernel_size={kernel}, stride={stride}, padding={padding}, "
                  f"dilation={dilation} out of range")
    for k, p, d in zip(kernel, padding, dilation):
        if p > (d * (k - 1) + 1) // 2:
            raise err(f"{where}: padding={padding} must be at most half of the (dilated) kernel_size={kernel}")
    return kernel, stride, padding, dilation


@register("nn.MaxPool1d", "nn.MaxPool2d", "F.max_pool1d", "F.max_pool2d")
class MaxPool(_PoolBase):
    """torch ``max_pool1d/2d``: kernel, stride (None = kernel), padding (with -inf), dilation,
    ceil_mode; ``return_indices`` gives a second int64 output of flat ``h*W + w`` indices."""

    def __init__(self, ctx: BuildContext, nd, kernel, stride, padding, dilation, ceil_mode, return_indices,
                 order: tuple[str, ...] | None = None):
        super().__init__(ctx)
        self.nd = nd
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, padding, dilation
        self.ceil_mode, self.return_indices = ceil_mode, return_indices
        self.order = order or (("values", "indices") if return_indices else ("values",))
        self._fast = None if return_indices else getattr(ctx.fast, "max_pool2d", None)

    @classmethod
    def from_operator(cls, op, ctx):
        nd = _dims(op)
        kernel, stride, padding, dilation = _window(op, nd, True)
        ceil_mode = op.param("ceil_mode", bool, default=False)
        ri, order = index_outputs(op, op.param("return_indices", bool, default=False))
        return cls(ctx, nd, kernel, stride, padding, dilation, ceil_mode, ri, order)

    def forward(self, x: Any) -> Any:
        x4, unbatched = self._as4d(x)
        if (not self.return_indices and tuple(x4.shape[-2:]) == tuple(self.kernel) and not any(self.padding)
                and tuple(self.dilation) == (1, 1) and x4.shape[-1] * x4.shape[-2] > 1):
            # one window over the whole map (TextCNN's max_pool1d(h, h.size(2))): one reduction,
            # not a maximum per tap (82 against 4 us for 29 taps)
            return self._from4d(self.xp.max(x4, axis=(-2, -1), keepdims=True), unbatched)
        if self._fast is not None:
            y = self._fast(x4, self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode)
            return self._from4d(y, unbatched)
        out = fn.max_pool2d(x4, self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices, xp=self.xp)
        if self.return_indices:
            return ordered_results(self.order, self._from4d(out[0], unbatched), self._from4d(out[1], unbatched))
        return self._from4d(out, unbatched)


@register("nn.AvgPool1d", "nn.AvgPool2d", "F.avg_pool1d", "F.avg_pool2d")
class AvgPool(_PoolBase):
    """torch ``avg_pool1d/2d``: kernel, stride (None = kernel), padding, ceil_mode,
    count_include_pad, divisor_override."""

    def __init__(self, ctx: BuildContext, nd, kernel, stride, padding, ceil_mode, count_include_pad,
                 divisor_override):
        super().__init__(ctx)
        self.nd = nd
        self.kernel, self.stride, self.padding = kernel, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override
        self._fast = getattr(ctx.fast, "avg_pool2d", None)

    @classmethod
    def from_operator(cls, op, ctx):
        nd = _dims(op)
        kernel, stride, padding, _ = _window(op, nd, False)
        ceil_mode = op.param("ceil_mode", bool, default=False)
        cip = op.param("count_include_pad", bool, default=True)
        div = op.param("divisor_override", int, default=None)
        if div is not None and div <= 0:
            raise LayerParameterError(f"{op.where}: divisor_override={div} must be positive")
        return cls(ctx, nd, kernel, stride, padding, ceil_mode, cip, div)

    def forward(self, x: Any) -> Any:
        x4, unbatched = self._as4d(x)
        args = (x4, self.kernel, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                self.divisor_override)
        y = self._fast(*args) if self._fast is not None else None  # (None: not a float array)
        if y is None:
            y = fn.avg_pool2d(*args, xp=self.xp)
        return self._from4d(y, unbatched)


@register("aten::max_pool1d", "aten::max_pool2d", "aten::avg_pool1d", "aten::avg_pool2d")
class AtenPool(_PoolBase):
    """Max and average pooling as pnnx leaves them when the window is computed from the input's
    shape (``F.avg_pool2d(x, x.shape[2:])``, MobileOne's squeeze-excite; ``F.max_pool2d(x, [h //
    2, 3])``): torch's positional operands, each a runtime value (``pnnx.Expression`` lists,
    ``size(@0,2)`` with a dynamic input). ``max_pool1d/2d``: (input, kernel_size, stride,
    padding, dilation, ceil_mode); ``avg_pool2d``: (input, kernel_size, stride, padding,
    ceil_mode, count_include_pad, divisor_override), ``avg_pool1d`` without the last. A stride of
    None or [] is the kernel's. Each window met runs through a :class:`MaxPool` / :class:`AvgPool`
    made for it (kept: a model's input sizes are few)."""

    def __init__(self, ctx: BuildContext, nd: int, kind: str, where: str):
        super().__init__(ctx)
        self.nd, self.kind, self.where = nd, kind, where
        self._ctx = ctx
        self._pools: dict[tuple, _PoolBase] = {}

    @classmethod
    def from_operator(cls, op, ctx):
        nd = _dims(op)
        kind = "max" if "max_pool" in op.type else "avg"
        want = 7 if (kind, nd) == ("avg", 2) else 6
        if len(op.inputs) != want or len(op.outputs) != 1:
            names = ("input, kernel_size, stride, padding, dilation, ceil_mode" if kind == "max" else
                     "input, kernel_size, stride, padding, ceil_mode, count_include_pad"
                     + (", divisor_override" if nd == 2 else ""))
            raise LayerParameterError(f"{op.where}: expected {want} inputs ({names}) and one output, found "
                                      f"{len(op.inputs)} and {len(op.outputs)}")
        return cls(ctx, nd, kind, op.where)

    def _ints(self, value: Any, what: str, fill: int) -> tuple[int, int]:
        v = runtime_ints(value, self.where, what)
        if len(v) == 1 and self.nd == 2:
            v = v * 2
        if len(v) != self.nd:
            raise ShapeError(f"{self.where}: {what}={v} should have {self.nd} entries")
        return _to2(v, self.nd, fill)

    def forward(self, x: Any, kernel: Any, stride: Any, padding: Any, *rest: Any) -> Any:
        k = self._ints(kernel, "kernel_size", 1)
        s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) else self._ints(stride, "stride", 1)
        p = self._ints(padding, "padding", 0)
        d = self._ints(rest[0], "dilation", 1) if self.kind == "max" else (1, 1)
        flags = rest[1:] if self.kind == "max" else rest
        ceil = bool(to_int(flags[0], f"{self.where}: ceil_mode"))
        cip = self.kind == "max" or bool(to_int(flags[1], f"{self.where}: count_include_pad"))
        div = None if len(flags) < 3 or flags[2] is None else to_int(flags[2], f"{self.where}: divisor_override")
        key = (k, s, p, d, ceil, cip, div)
        pool = self._pools.get(key)
        if pool is None:
            _check_window(k, s, p, d, self.where, ShapeError)
            if div is not None and div <= 0:
                raise ShapeError(f"{self.where}: divisor_override={div} must be positive")
            pool = (MaxPool(self._ctx, self.nd, k, s, p, d, ceil, False) if self.kind == "max"
                    else AvgPool(self._ctx, self.nd, k, s, p, ceil, cip, div))
            pool.op_type, pool.op_name = self.op_type, self.op_name
            if len(self._pools) >= 16:
                self._pools.clear()
            self._pools[key] = pool
        return pool.forward(x)


def _output_size(op, nd, slots: dict[str, int]):
    """The ``output_size`` parameter as ``nd`` sizes (None keeps the input's), or None when it is
    a runtime operand (``$output_size`` in ``slots``: pnnx's form when the input's spatial size is
    dynamic, ``F.interpolate(scale_factor=0.25, mode="area")``)."""
    if "output_size" in slots:
        return None
    return _check_output_size(op.param("output_size", list), nd, f"{op.where}: output_size",
                              LayerParameterError)


def _check_output_size(raw, nd: int, what: str, err: type[Exception]) -> tuple:
    if raw is None:
        raise err(f"{what} is None")
    raw = list(raw)
    if len(raw) == 1:
        raw = raw * nd
    if len(raw) != nd or not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in raw):
        raise err(f"{what}={raw!r} should be {nd} ints (0 or None keeps the input size)")
    sizes = tuple(None if v in (None, 0) else v for v in raw)
    if any(v is not None and v < 0 for v in sizes):
        raise err(f"{what}={sizes} must not be negative")
    return (None,) + sizes if nd == 1 else sizes


def adaptive_slots(op) -> dict[str, int]:
    """Positions of an adaptive pool's ``input`` and (when a runtime operand) ``output_size``."""
    slots = input_slots(op, ("input", "output_size"))
    if "input" not in slots:
        slots["input"] = 1 if slots.get("output_size") == 0 else 0
    return slots


class _AdaptiveBase(_PoolBase):
    def __init__(self, ctx: BuildContext, nd, output_size, slots: dict[str, int]):
        super().__init__(ctx)
        self.nd = nd
        self.output_size = output_size
        self.slots = slots

    def _operands(self, inputs: tuple) -> tuple[Any, tuple]:
        """The input and the output size (the parameter, or the ``$output_size`` operand)."""
        x = inputs[self.slots["input"]]
        if self.output_size is not None:
            return x, self.output_size
        who = f"{self.op_type} {self.op_name!r}: output_size"
        raw = runtime_ints(inputs[self.slots["output_size"]], who, "output_size")
        return x, _check_output_size(raw, self.nd, who, ShapeError)

    def _out_hw(self, x4: Any, size: tuple) -> tuple[int, int]:
        h, w = x4.shape[-2:]
        oh = h if size[0] is None else size[0]
        ow = w if size[1] is None else size[1]
        if (oh > 0 and h == 0) or (ow > 0 and w == 0) or oh == 0 or ow == 0:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: cannot pool input {tuple(x4.shape)} to "
                             f"{(oh, ow)}")
        return oh, ow


@register("nn.AdaptiveAvgPool1d", "nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool1d", "F.adaptive_avg_pool2d")
class AdaptiveAvgPool(_AdaptiveBase):
    """torch ``adaptive_avg_pool1d/2d`` to any output size (non-divisible sizes included)."""

    def __init__(self, ctx: BuildContext, nd, output_size, slots: dict[str, int]):
        super().__init__(ctx, nd, output_size, slots)
        self._fast = getattr(ctx.fast, "adaptive_avg_pool2d", None)

    @classmethod
    def from_operator(cls, op, ctx):
        nd, slots = _dims(op), adaptive_slots(op)
        return cls(ctx, nd, _output_size(op, nd, slots), slots)

    def forward(self, *inputs: Any) -> Any:
        x, size = self._operands(inputs)
        x4, unbatched = self._as4d(x)
        hw = self._out_hw(x4, size)
        y = self._fast(x4, hw) if self._fast is not None else None  # (None: the generic path)
        if y is None:
            y = fn.adaptive_avg_pool2d(x4, hw, xp=self.xp)
        return self._from4d(y, unbatched)


@register("nn.AdaptiveMaxPool1d", "nn.AdaptiveMaxPool2d", "F.adaptive_max_pool1d", "F.adaptive_max_pool2d")
class AdaptiveMaxPool(_AdaptiveBase):
    """torch ``adaptive_max_pool1d/2d``; with ``return_indices`` (what pnnx writes for the
    functional form) a second int64 output of flat indices."""

    def __init__(self, ctx, nd, output_size, slots, return_indices, order: tuple[str, ...] | None = None):
        super().__init__(ctx, nd, output_size, slots)
        self.return_indices = return_indices
        self.order = order or (("values", "indices") if return_indices else ("values",))

    @classmethod
    def from_operator(cls, op, ctx):
        nd = _dims(op)
        ri, order = index_outputs(op, op.param("return_indices", bool, default=False))
        slots = adaptive_slots(op)
        return cls(ctx, nd, _output_size(op, nd, slots), slots, ri, order)

    def forward(self, *inputs: Any) -> Any:
        x, size = self._operands(inputs)
        x4, unbatched = self._as4d(x)
        out = fn.adaptive_max_pool2d(x4, self._out_hw(x4, size), self.return_indices, xp=self.xp)
        if self.return_indices:
            return ordered_results(self.order, self._from4d(out[0], unbatched), self._from4d(out[1], unbatched))
        return self._from4d(out, unbatched)


@register("nn.LPPool1d", "nn.LPPool2d", "F.lp_pool1d", "F.lp_pool2d")
class LPPool(_PoolBase):
    """torch ``lp_pool1d/2d``: (avg_pool(x^p) * kernel_numel)^(1/p), the window sum of x^p to the
    power 1/p, with torch's exact steps (``sign(s) * relu(|s|)``, so a negative window sum, which an
    odd p can give, yields NaN); norm_type, kernel_size, stride (None = kernel), ceil_mode (a
    window hanging past the edge is averaged over its in-bounds part, then scaled by the full
    kernel size, as torch does)."""

    def __init__(self, ctx: BuildContext, nd, norm_type: float, kernel, stride, ceil_mode):
        super().__init__(ctx)
        self.nd = nd
        self.norm_type, self.kernel, self.stride, self.ceil_mode = norm_type, kernel, stride, ceil_mode
        self._fast = getattr(ctx.fast, "avg_pool2d", None)

    @classmethod
    def from_operator(cls, op, ctx):
        nd = _dims(op)
        p = op.param("norm_type", float)
        if not p or p != p:
            raise LayerParameterError(f"{op.where}: norm_type={p} must be a non-zero number")
        kernel, stride, _, _ = _window(op, nd, False)
        return cls(ctx, nd, p, kernel, stride, op.param("ceil_mode", bool, default=False))

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if not xp.isdtype(x.dtype, "real floating"):
            raise ShapeError(f"{self.op_type} {self.op_name!r}: expects a floating input, found {x.dtype}")
        x4, unbatched = self._as4d(x)
        p = self.norm_type
        xpow = x4 * x4 if p == 2.0 else x4 ** p
        args = (xpow, self.kernel, self.stride, (0, 0), self.ceil_mode, True, None)
        y = self._fast(*args) if self._fast is not None else None  # (None: not a float array)
        if y is None:
            y = fn.avg_pool2d(*args, xp=xp)
        y = xp.sign(y) * xp.clip(xp.abs(y), min=0.0) * float(self.kernel[0] * self.kernel[1])
        y = xp.sqrt(y) if p == 2.0 else y ** (1.0 / p)
        return self._from4d(y, unbatched)


@register("aten::max_unpool2d", "aten::max_unpool3d")
class MaxUnpool(Layer):
    """``F.max_unpool1d/2d/3d`` (``nn.MaxUnpool*``; SegNet's and ENet's decoders) as pnnx writes
    them: ``aten::max_unpool2d(input, indices, output_size)`` (1-D through it with a unit width)
    and ``aten::max_unpool3d(input, indices, output_size, stride, padding)``. Zeros of shape
    (N, C, *output_size), each input value written at its flat index within its (n, c) plane
    (the indices of a max pooling's ``return_indices``); where indices repeat the last write
    wins, as torch's loop. An index outside the plane is a ShapeError, as in torch."""

    def __init__(self, ctx: BuildContext, nd: int, where: str, size: tuple[int, ...] | None):
        super().__init__(ctx)
        self.nd, self.where, self.size = nd, where, size

    @classmethod
    def from_operator(cls, op, ctx):
        nd = 3 if op.type.endswith("3d") else 2
        size = None
        if len(op.inputs) < 3:  # (the size as a parameter, where pnnx folded it)
            if not op.has_param("output_size"):
                raise LayerParameterError(f"{op.where}: expected the inputs (input, indices, output_size), "
                                          f"found {len(op.inputs)} and no output_size parameter")
            size = tuple(op.ints("output_size", nd))
        return cls(ctx, nd, op.where, size)

    def forward(self, x: Any, indices: Any, output_size: Any = None, *_stride_padding: Any) -> Any:
        xp, nd = self.xp, self.nd
        size = self.size if self.size is not None else to_int_list(output_size, f"{self.where}: output_size")
        if len(size) == nd + 2:  # (torch takes the full shape too: its last nd entries count)
            size = size[2:]
        if len(size) != nd or min(size) < 0:
            raise ShapeError(f"{self.where}: output_size should be {nd} sizes, found {list(size)}")
        if x.ndim not in (nd + 1, nd + 2) or tuple(indices.shape) != tuple(x.shape):
            raise ShapeError(f"{self.where}: expects a {nd + 2}-D input (or its unbatched {nd + 1}-D form) and "
                             f"indices of its shape, found {tuple(x.shape)} and {tuple(indices.shape)}")
        lead = tuple(x.shape[: x.ndim - nd])
        planes, per_in, per_out = math.prod(lead), math.prod(x.shape[x.ndim - nd:]), math.prod(size)
        check_elements(planes * per_out, self.where)
        out = xp.zeros((planes * per_out,), dtype=x.dtype, device=self.device)
        if planes * per_in == 0:
            return xp.reshape(out, lead + tuple(size))
        idx = index_array(xp, xp.reshape(indices, (planes, per_in)), per_out, self.where, negative=False,
                          what="unpooling index")
        base = xp.reshape(xp.arange(planes, dtype=xp.int64, device=self.device) * per_out, (planes, 1))
        pos = xp.reshape(idx + base, (-1,))
        out = segment_scatter(xp, out, pos, xp.reshape(x, (-1,)), "last", False, self.device,
                              getattr(self.backend, "fast", None))
        return xp.reshape(out, lead + tuple(size))
