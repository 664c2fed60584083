"""Miscellaneous layers: selection and comparison (``torch.where``, ``torch.eq`` ...), logical
ops, tensor creation (``torch.arange``, ``torch.zeros`` ..., ``Tensor.new_zeros`` ...), padding
(``F.pad`` in every mode and the ``nn.*Pad*d`` modules), ``torch.topk`` / sort / argsort,
``Tensor.masked_fill``, ``tril`` / ``triu``, ``torch.index_select`` and ``torch.gather``.

pnnx spellings (seen in real exports): comparisons carry the second operand either as an input
(``$input=0 $other=1``) or as a scalar parameter (``other=0.5``); ``torch.where`` likewise
(``$condition $input $other`` or ``input=1.0 other=0.0``); the creation ops take their size from
a ``pnnx.Expression`` list when it is dynamic (``torch.ones ... dtype=None $size=8``);
``torch.sort`` / ``argsort`` / ``tril`` / ``triu`` come out as raw ``aten::sort`` etc. whose
non-tensor arguments are inputs fed by constant expressions (``pnnx.Expression expr=1``).

The small helpers at the top (input slots, scalar conversion, dtype names, type promotion) are
shared with the other layer modules of this family (attention, norm, resize).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.expression.functions import wrap_int
from kuiper_xp.limits import check_elements

from .base import BuildContext, Layer
from .checks import check_range
from .registry import register
from .shape import norm_dim, number_as, runtime_int, runtime_ints

# ---------------------------------------------------------------------------------------------
# shared helpers


def input_slots(op: Any, names: Sequence[str]) -> dict[str, int]:
    """Map input keys to operand positions: ``$key`` names first, then the unnamed inputs take
    the remaining keys of ``names`` in order. Unknown ``$key`` names raise LayerParameterError."""
    slots: dict[str, int] = {}
    unnamed: list[int] = []
    n = len(op.inputs)
    given = list(op.input_names) + [""] * (n - len(op.input_names))
    for i, key in enumerate(given[:n]):
        if key:
            if key not in names:
                raise LayerParameterError(f"{op.where}: unexpected input ${key}; this operator takes {list(names)}")
            slots[key] = i
        else:
            unnamed.append(i)
    free = [k for k in names if k not in slots]
    if len(unnamed) > len(free):
        raise LayerParameterError(f"{op.where}: {n} inputs, but this operator takes at most {list(names)}")
    for i, key in zip(unnamed, free):
        slots[key] = i
    refuse_weight_twice(op, slots)
    return slots


def operand_slots(op: Any, names: Sequence[str]) -> dict[str, int]:
    """Which input position carries each of ``names`` (``$input``, ``$weight``, ``$bias``, ...):
    ``$key`` names first, then unnamed inputs in torch's positional order (extra ones ignored,
    unlike :func:`input_slots`); a data input is required."""
    slots: dict[str, int] = {}
    for i, key in enumerate(op.input_names or [""] * len(op.inputs)):
        if key in names and key not in slots:
            slots[key] = i
    free = [n for n in names if n not in slots]
    for i in range(len(op.inputs)):
        if i not in slots.values() and free:
            slots[free.pop(0)] = i
    if "input" not in slots:
        raise LayerParameterError(f"{op.where}: no data input; inputs are {op.input_names}")
    refuse_weight_twice(op, slots)
    return slots


def refuse_weight_twice(op: Any, slots: dict[str, int]) -> None:
    """Refuse an operator given a weight both as its own ``@name`` and as an input for the same
    slot (``nn.LayerNorm`` with an extra input, say): pnnx never writes that (a tied weight comes
    as a ``pnnx.Attribute`` operand, which the runtime folds first), and taking either one would
    silently ignore the other."""
    attrs = getattr(op, "attrs", None) or {}
    for key, i in slots.items():
        if key in attrs:
            raise LayerParameterError(
                f"{op.where}: {key!r} is given twice, as the weight @{key} and as input {i} "
                f"(operand {op.inputs[i].name!r}); a file from pnnx has one or the other")


def to_int(v: Any, what: str = "value") -> int:
    """A Python int from an int, a bool, or a one-element (0-d) integer array."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    shape = getattr(v, "shape", None)
    if shape is not None and math.prod(shape) == 1:
        return int(v) if len(shape) == 0 else int(v[(0,) * len(shape)])
    raise ShapeError(f"{what} should be an integer, found {type(v).__name__} {getattr(v, 'shape', '')}")


def to_float(v: Any, what: str = "value") -> float:
    if isinstance(v, (int, float)):
        return float(v)
    shape = getattr(v, "shape", None)
    if shape is not None and math.prod(shape) == 1:
        return float(v) if len(shape) == 0 else float(v[(0,) * len(shape)])
    raise ShapeError(f"{what} should be a number, found {type(v).__name__}")


def to_int_list(v: Any, what: str = "size") -> tuple[int, ...]:
    """A tuple of Python ints from a list/tuple of scalars or 0-d arrays, or a 1-D array."""
    if isinstance(v, (list, tuple)):
        return tuple(to_int(e, what) for e in v)
    if isinstance(v, int):
        return (v,)
    shape = getattr(v, "shape", None)
    if shape is not None and len(shape) <= 1:
        if len(shape) == 0:
            return (int(v),)
        return tuple(int(v[i]) for i in range(shape[0]))
    raise ShapeError(f"{what} should be a list of integers, found {type(v).__name__}")


_TORCH_DTYPES = {
    "float": "float32", "float32": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int": "int32", "int32": "int32", "int64": "int64", "long": "int64", "int16": "int16",
    "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
    "complex64": "complex64", "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
}


def torch_dtype(op: Any, xp: Any, key: str = "dtype", default: Any = None) -> Any:
    """The array dtype named by a ``dtype=torch.float`` parameter (None when absent or None)."""
    name = op.param(key, default=None)
    if name is None:
        return default
    if not isinstance(name, str):
        raise LayerParameterError(f"{op.where}: parameter {key!r} should be a torch dtype, found {name!r}")
    short = name.rsplit(".", 1)[-1]
    if short not in _TORCH_DTYPES or not hasattr(xp, _TORCH_DTYPES[short]):
        raise LayerParameterError(f"{op.where}: parameter {key!r}: unsupported dtype {name!r}")
    return getattr(xp, _TORCH_DTYPES[short])


def output_dtype(op: Any, xp: Any, k: int = 0) -> Any:
    """The dtype the model file declares for output ``k`` (None when not annotated)."""
    if k < len(op.outputs):
        name = op.outputs[k].array_dtype
        if name is not None and hasattr(xp, name):
            return getattr(xp, name)
    return None


def is_float(xp: Any, dtype: Any) -> bool:
    return xp.isdtype(dtype, ("real floating", "complex floating"))


def promote(xp: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Bring two arrays to a common dtype the way torch does for a binary op (the Array API
    refuses to mix kinds, e.g. an int tensor with a float one)."""
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b
    fa, fb = is_float(xp, da), is_float(xp, db)
    # a 0-d tensor does not widen a tensor with dimensions of its own kind (float32 > 0-d float64
    # compares in float32, int32 & 0-d int64 stays int32)
    if (a.ndim == 0) != (b.ndim == 0) and fa == fb and (da == xp.bool) == (db == xp.bool):
        return (xp.astype(a, db), b) if a.ndim == 0 else (a, xp.astype(b, da))
    if fa and not fb:
        return a, xp.astype(b, da)
    if fb and not fa:
        return xp.astype(a, db), b
    if da == xp.bool:
        return xp.astype(a, db), b
    if db == xp.bool:
        return a, xp.astype(b, da)
    dt = xp.result_type(da, db)
    return xp.astype(a, dt), xp.astype(b, dt)


def scalar_array(xp: Any, value: Any, like: Any, device: Any) -> Any:
    """A 0-d array for a Python scalar next to the array ``like``, with torch's promotion rule for
    a tensor and a scalar: the tensor's dtype wins unless the scalar is of a higher kind."""
    dt = like.dtype
    if isinstance(value, bool):
        return xp.asarray(value, dtype=dt, device=device)
    if isinstance(value, int):
        if dt == xp.bool:
            return xp.asarray(value, dtype=xp.int64, device=device)
        if not is_float(xp, dt):
            value = wrap_int(value, xp.iinfo(dt))  # as torch converts it (uint8 == -56 tests 200)
        return xp.asarray(value, dtype=dt, device=device)
    if not is_float(xp, dt):
        return xp.asarray(value, dtype=xp.float32, device=device)
    return xp.asarray(value, dtype=dt, device=device)


def binary_operands(xp: Any, a: Any, b: Any, device: Any) -> tuple[Any, Any]:
    """Arrays of one dtype for ``a op b`` where either may be a Python scalar (torch promotion)."""
    a_arr, b_arr = hasattr(a, "dtype"), hasattr(b, "dtype")
    if a_arr and b_arr:
        return promote(xp, a, b)
    if a_arr:
        return promote(xp, a, scalar_array(xp, b, a, device))
    if b_arr:
        return promote(xp, scalar_array(xp, a, b, device), b)
    dt = xp.float32 if isinstance(a, float) or isinstance(b, float) else xp.int64
    return xp.asarray(a, dtype=dt, device=device), xp.asarray(b, dtype=dt, device=device)


def _scalar_param(op: Any, key: str) -> Any:
    v = op.param(key)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise LayerParameterError(f"{op.where}: parameter {key!r} should be a number, found {v!r}") from None
    if v is not None and not isinstance(v, (int, float, bool)):
        raise LayerParameterError(f"{op.where}: parameter {key!r} should be a scalar, found {v!r}")
    return v


def _scalar_input(xp: Any, v: Any) -> Any:
    """A fill value arriving as an input: a Python number as it is, a 0-d array as a float or
    an int by its dtype."""
    if isinstance(v, (bool, int, float)):
        return v
    return to_float(v) if is_float(xp, v.dtype) else to_int(v)


def norm_axis(op: Any, axis: int, ndim: int, what: str = "dim") -> int:
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op.where}: {what}={axis} is out of range for a {ndim}-D input")
    return axis % ndim


class _ArgsLayer(Layer):
    """A layer whose operands are a mix of inputs and scalar parameters: ``self.sources`` maps
    each argument key to ('in', position) or ('param', value)."""

    KEYS: tuple[str, ...] = ()

    def __init__(self, ctx: BuildContext, op: Any):
        super().__init__(ctx)
        self.where = op.where
        slots = input_slots(op, self.KEYS)
        self.sources: dict[str, tuple[str, Any]] = {}
        for key in self.KEYS:
            if key in slots:
                self.sources[key] = ("in", slots[key])
            elif op.has_param(key):
                v = _scalar_param(op, key)
                if v is None:  # (torch raises on None there; it was read as NaN / False)
                    raise LayerParameterError(f"{op.where}: parameter {key}=None; {op.type} needs a number "
                                              "or a tensor there")
                self.sources[key] = ("param", v)

    def arg(self, key: str, inputs: Sequence[Any]) -> Any:
        kind, v = self.sources[key]
        return inputs[v] if kind == "in" else v

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op)


# ---------------------------------------------------------------------------------------------
# selection, comparison, logic


@register("torch.where")
class Where(_ArgsLayer):
    """``torch.where(condition, input, other)``; ``input``/``other`` may be scalar parameters."""

    KEYS = ("condition", "input", "other")

    def __init__(self, ctx: BuildContext, op: Any):
        super().__init__(ctx, op)
        missing = [k for k in self.KEYS if k not in self.sources]
        if missing:
            raise LayerParameterError(f"{op.where}: torch.where needs condition, input and other; "
                                      f"missing {missing} (the one-argument form is not supported)")
        self.out_dtype = output_dtype(op, ctx.xp)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        cond = self.arg("condition", inputs)
        if cond.dtype != xp.bool:
            cond = cond != 0
        a, b = binary_operands(xp, self.arg("input", inputs), self.arg("other", inputs), self.device)
        out = xp.where(cond, a, b)
        if self.out_dtype is not None and out.dtype != self.out_dtype:
            out = xp.astype(out, self.out_dtype)
        return out


_COMPARE = {
    "torch.eq": "equal", "torch.ne": "not_equal", "torch.gt": "greater",
    "torch.ge": "greater_equal", "torch.lt": "less", "torch.le": "less_equal",
}


@register(*_COMPARE)
class Compare(_ArgsLayer):
    """Elementwise comparison with torch's type promotion; ``other`` is an input or a scalar.
    A result the file declares floating point is cast to it: pnnx writes the in-place
    ``x.gt_(0.5)`` (YOLOv8's mask thresholding), which keeps x's float dtype, as ``torch.gt``."""

    KEYS = ("input", "other")

    def __init__(self, ctx: BuildContext, op: Any):
        super().__init__(ctx, op)
        if set(self.sources) != set(self.KEYS):
            raise LayerParameterError(f"{op.where}: needs input and other, found {sorted(self.sources)}")
        self.fn = getattr(ctx.xp, _COMPARE[op.type])
        declared = op.outputs[0].array_dtype if op.outputs else None
        self.cast = getattr(ctx.xp, declared, None) if declared in ("float16", "float32", "float64") else None

    def forward(self, *inputs: Any) -> Any:
        a, b = binary_operands(self.xp, self.arg("input", inputs), self.arg("other", inputs), self.device)
        y = self.fn(a, b)
        return y if self.cast is None else self.xp.astype(y, self.cast)


_LOGICAL = {
    "torch.logical_and": "logical_and", "torch.logical_or": "logical_or",
    "torch.logical_xor": "logical_xor", "torch.bitwise_and": "bitwise_and",
    "torch.bitwise_or": "bitwise_or", "torch.bitwise_xor": "bitwise_xor",
}


@register(*_LOGICAL)
class Logical(_ArgsLayer):
    """``logical_*`` (any dtype, nonzero is True, bool result) and ``bitwise_*`` (bool or int)."""

    KEYS = ("input", "other")

    def __init__(self, ctx: BuildContext, op: Any):
        super().__init__(ctx, op)
        if set(self.sources) != set(self.KEYS):
            raise LayerParameterError(f"{op.where}: needs input and other, found {sorted(self.sources)}")
        name = _LOGICAL[op.type]
        suffix = name.split("_", 1)[1]
        self.logical = name.startswith("logical")
        self.fn_logical = getattr(ctx.xp, "logical_" + suffix)
        self.fn_bitwise = getattr(ctx.xp, "bitwise_" + suffix)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        a, b = self.arg("input", inputs), self.arg("other", inputs)
        if self.logical:
            a, b = (_as_bool(xp, v, self.device) for v in (a, b))
            return self.fn_logical(a, b)
        a, b = binary_operands(xp, a, b, self.device)
        return self.fn_logical(a, b) if a.dtype == xp.bool else self.fn_bitwise(a, b)


def _as_bool(xp: Any, v: Any, device: Any) -> Any:
    if not hasattr(v, "dtype"):
        return xp.asarray(bool(v), device=device)
    return v if v.dtype == xp.bool else v != 0


@register("torch.logical_not", "torch.bitwise_not")
class Not(Layer):
    """``logical_not`` (bool result) / ``bitwise_not`` (bool: logical not; int: ~x)."""

    def __init__(self, ctx: BuildContext, logical: bool):
        super().__init__(ctx)
        self.logical = logical

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.type == "torch.logical_not")

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if x.dtype == xp.bool:
            return xp.logical_not(x)
        if self.logical:
            return x == 0
        return xp.bitwise_invert(x)


@register("Tensor.masked_fill")
class MaskedFill(_ArgsLayer):
    """``x.masked_fill(mask, value)``: value is a scalar parameter or a 0-d input."""

    KEYS = ("input", "mask", "value")

    def __init__(self, ctx: BuildContext, op: Any):
        super().__init__(ctx, op)
        if set(self.sources) != set(self.KEYS):
            raise LayerParameterError(f"{op.where}: needs input, mask and value, found {sorted(self.sources)}")

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x, mask, value = (self.arg(k, inputs) for k in self.KEYS)
        if hasattr(value, "dtype"):
            value = xp.astype(xp.reshape(value, ()), x.dtype)
        else:
            if x.dtype == xp.bool:
                value = bool(value)  # (torch: any non-zero number, NaN too, is True)
            elif not is_float(xp, x.dtype):
                info = xp.iinfo(x.dtype)
                if isinstance(value, float):
                    if not info.min <= value <= info.max:  # (NaN too)
                        raise ShapeError(f"{self.where}: cannot fill a {x.dtype} tensor with {value}")
                    value = int(value)  # toward zero, as torch
                # torch's checked conversion of an int: the dtype's range, and for unsigned types
                # the negatives down to -max too (two's complement: -1 fills uint8 with 255)
                if not (-info.max if info.min == 0 else info.min) <= value <= info.max:
                    raise ShapeError(f"{self.where}: {value} cannot be converted to {x.dtype} without overflow")
                value = wrap_int(value, info)
            value = xp.asarray(value, dtype=x.dtype, device=self.device)
        if mask.dtype != xp.bool:
            mask = mask != 0
        return xp.where(mask, value, x)


# ---------------------------------------------------------------------------------------------
# creation


def _creation_dtype(op: Any, xp: Any, fill: Any = None) -> Any:
    dt = torch_dtype(op, xp)
    if dt is not None:
        return dt
    declared = output_dtype(op, xp)
    if declared is not None:
        return declared
    if isinstance(fill, bool):
        return xp.bool
    if isinstance(fill, int):
        return xp.int64
    return xp.float32


@register("torch.zeros", "torch.ones", "torch.full", "torch.empty")
class Full(Layer):
    """``torch.zeros/ones/empty(size)`` and ``torch.full(size, fill_value)``; the size is a
    parameter or (dynamic shapes) an input list. ``empty`` gives zeros."""

    def __init__(self, ctx: BuildContext, fill: Any, dtype: Any, size: tuple[int, ...] | None,
                 slots: dict[str, int]):
        super().__init__(ctx)
        self.fill, self.dtype, self.size, self.slots = fill, dtype, size, slots

    @classmethod
    def from_operator(cls, op, ctx):
        slots = input_slots(op, ("size", "fill_value"))
        if op.type == "torch.full":
            fill = None if "fill_value" in slots else _scalar_param(op, "fill_value")
        else:
            fill = 1 if op.type == "torch.ones" else 0
        dtype = _creation_dtype(op, ctx.xp, fill if op.type == "torch.full" else None)
        size = None if "size" in slots else op.param("size", (int,))
        return cls(ctx, fill, dtype, size, slots)

    def forward(self, *inputs: Any) -> Any:
        size = self.size if self.size is not None else to_int_list(inputs[self.slots["size"]])
        fill = self.fill
        if fill is None:
            fill = _scalar_input(self.xp, inputs[self.slots["fill_value"]])
        return self.xp.full(size, fill, dtype=self.dtype, device=self.device)


@register("torch.zeros_like", "torch.ones_like", "torch.full_like", "torch.empty_like",
          "Tensor.new_zeros", "Tensor.new_ones", "Tensor.new_full", "Tensor.new_empty")
class FullLike(Layer):
    """``*_like(input)`` (shape and dtype of the input) and ``Tensor.new_*(size)`` (the input's
    dtype, the given size)."""

    def __init__(self, ctx: BuildContext, fill: Any, dtype: Any, size: Any, input_pos: int, size_pos: int | None,
                 new: bool):
        super().__init__(ctx)
        self.fill, self.dtype, self.size, self.new = fill, dtype, size, new
        self.input_pos, self.size_pos = input_pos, size_pos

    @classmethod
    def from_operator(cls, op, ctx):
        kind = op.type.rsplit(".", 1)[-1]
        new = op.type.startswith("Tensor.new_")
        if kind.endswith("full") or kind.endswith("full_like"):
            fill = _scalar_param(op, "fill_value")
        else:
            fill = 1 if "ones" in kind else 0
        slots = input_slots(op, ("input", "size"))
        size = None
        if new and "size" not in slots:
            size = op.param("size", (int,))
        if "input" not in slots:
            raise LayerParameterError(f"{op.where}: needs an input tensor")
        return cls(ctx, fill, torch_dtype(op, ctx.xp), size, slots["input"], slots.get("size"), new)

    def forward(self, *inputs: Any) -> Any:
        x = inputs[self.input_pos]
        dtype = self.dtype if self.dtype is not None else x.dtype
        if self.new:
            size = self.size if self.size_pos is None else to_int_list(inputs[self.size_pos])
        else:
            size = tuple(x.shape)
        return self.xp.full(size, self.fill, dtype=dtype, device=self.device)


@register("aten::new_full")
class AtenNewFull(Layer):
    """``x.new_full(size, fill)`` as pnnx leaves it when the size follows an input's shape:
    ``aten::new_full (self, size, fill_value, dtype, layout, device, pin_memory)``; the dtype the
    file declares for the output (else x's)."""

    def __init__(self, ctx: BuildContext, dtype: Any):
        super().__init__(ctx)
        self.dtype = dtype

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 7:
            raise LayerParameterError(f"{op.where}: expected 7 inputs (self, size, fill_value, dtype, layout, "
                                      f"device, pin_memory), found {len(op.inputs)}")
        return cls(ctx, output_dtype(op, ctx.xp))

    def forward(self, x: Any, size: Any, fill: Any, *_: Any) -> Any:
        dtype = self.dtype if self.dtype is not None else x.dtype
        return self.xp.full(to_int_list(size), _scalar_input(self.xp, fill), dtype=dtype, device=self.device)


def _warn_fill_of_folded(op: Any, pos: int) -> None:
    """Warn when a fill reads a constant pnnx folded (a ``pnnx.Attribute``) and no slice copy
    takes its result: what pnnx leaves of a slice assignment into a tensor it folded (``m =
    torch.ones(1, 8); m[:, :3] = 0; x * m``, even in a static export): the slice alone, the
    write into the whole tensor dropped, so the result has the slice's shape (a broadcast error
    later) or, for a single element, broadcasts to a silently wrong answer."""
    src = op.inputs[pos].producer if pos < len(op.inputs) else None
    if src is None or src.type != "pnnx.Attribute":
        return
    if any(c.type == "Tensor.slice_copy" for o in op.outputs for c in o.consumers):
        return
    warnings.warn(
        f"{op.where}: fills the folded constant {src.name!r} {op.inputs[pos].shape_str()} that no slice copy "
        "reads: pnnx writes this for a slice assignment into a tensor it folded (m = torch.ones(1, 8); "
        "m[:, :3] = 0), having dropped the write into the whole tensor, so the result is likely not "
        "torch's. Build such a tensor out of place (torch.cat, torch.where) or make it a buffer.",
        stacklevel=2)


@register("Tensor.fill", "Tensor.fill_")
class Fill(Layer):
    """``x.fill_(value)`` as a fresh array: x's shape and dtype, every element ``value`` (a
    parameter or a 0-d input; cast to x's dtype as torch does: truncated for integers)."""

    def __init__(self, ctx: BuildContext, value: Any, slot: int | None, input_pos: int):
        super().__init__(ctx)
        self.value, self.slot, self.input_pos = value, slot, input_pos

    @classmethod
    def from_operator(cls, op, ctx):
        slots = input_slots(op, ("input", "value"))
        if "input" not in slots:
            raise LayerParameterError(f"{op.where}: needs an input tensor")
        value = None if "value" in slots else _scalar_param(op, "value")
        if value is None and "value" not in slots:
            if op.has_param("value"):  # (pnnx's spelling of a boolean slice assignment, m[:, 0] = False)
                raise LayerParameterError(f"{op.where}: value=None: pnnx lost the fill value (it writes this "
                                          "for a boolean slice assignment such as m[:, 0] = False; build "
                                          "the mask with torch.cat or torch.where instead)")
            raise LayerParameterError(f"{op.where}: parameter 'value' is missing")
        _warn_fill_of_folded(op, slots["input"])
        return cls(ctx, value, slots.get("value"), slots["input"])

    def forward(self, *inputs: Any) -> Any:
        xp, x = self.xp, inputs[self.input_pos]
        v = self.value
        if self.slot is not None:
            v = _scalar_input(xp, inputs[self.slot])
        return xp.full(tuple(x.shape), number_as(xp, v, x.dtype), dtype=x.dtype, device=self.device)


@register("torch.arange")
class Arange(Layer):
    """``torch.arange(start, end, step)``; each bound a parameter or an input scalar. With no
    dtype, int64 when all bounds are integers, else float32 (as torch)."""

    def __init__(self, ctx: BuildContext, sources: dict[str, tuple[str, Any]], dtype: Any, where: str):
        super().__init__(ctx)
        self.sources, self.dtype, self.where = sources, dtype, where

    @classmethod
    def from_operator(cls, op, ctx):
        slots = input_slots(op, ("start", "end", "step"))
        sources: dict[str, tuple[str, Any]] = {}
        for key in ("start", "end", "step"):
            if key in slots:
                sources[key] = ("in", slots[key])
            elif op.has_param(key) and op.params[key] is not None:
                sources[key] = ("param", _scalar_param(op, key))
        if "end" not in sources:
            raise LayerParameterError(f"{op.where}: torch.arange needs end")
        return cls(ctx, sources, torch_dtype(op, ctx.xp) or output_dtype(op, ctx.xp), op.where)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        vals = {}
        for key, (kind, v) in self.sources.items():
            if kind == "in":
                v = inputs[v]
                if hasattr(v, "dtype"):
                    v = to_int(v) if not is_float(xp, v.dtype) else to_float(v)
            vals[key] = v
        start, end, step = vals.get("start", 0), vals["end"], vals.get("step", 1)
        dtype = self.dtype
        if dtype is None:
            dtype = xp.float32 if any(isinstance(v, float) for v in (start, end, step)) else xp.int64
        if is_float(xp, dtype):
            n = max(0, math.ceil((end - start) / step))
            return xp.astype(xp.arange(n, dtype=xp.float64, device=self.device) * step + start, dtype)
        return xp.arange(int(start), int(end), int(step), dtype=dtype, device=self.device)


# ---------------------------------------------------------------------------------------------
# tril / triu, sort, topk, index_select, gather


@register("torch.tril", "torch.triu", "aten::tril", "aten::triu")
class Triangle(Layer):
    """Lower/upper triangle of the last two axes; ``diagonal`` a parameter or (``aten::``) the
    second input."""

    def __init__(self, ctx: BuildContext, upper: bool, diagonal: int | None):
        super().__init__(ctx)
        self.upper, self.diagonal = upper, diagonal

    @classmethod
    def from_operator(cls, op, ctx):
        upper = op.type.endswith("triu")
        diagonal = None
        if len(op.inputs) < 2:
            diagonal = op.param("diagonal", int, default=0)
        return cls(ctx, upper, diagonal)

    def forward(self, x: Any, *rest: Any) -> Any:
        k = self.diagonal if self.diagonal is not None else to_int(rest[0], "diagonal")
        return self.xp.triu(x, k=k) if self.upper else self.xp.tril(x, k=k)


@register("torch.sort", "torch.argsort", "aten::sort", "aten::argsort")
class Sort(Layer):
    """Stable sort along ``dim`` (values and int64 indices, or indices only for argsort).
    ``aten::`` forms take ``(input, dim, descending)`` or ``(input, stable, dim, descending)`` as
    inputs. Ties keep their original order (torch's stable sort; torch's default sort leaves the
    order of ties unspecified)."""

    def __init__(self, ctx: BuildContext, values: bool, dim: int | None, descending: bool | None, arg_pos: tuple):
        super().__init__(ctx)
        self.values, self.dim, self.descending, self.arg_pos = values, dim, descending, arg_pos

    @classmethod
    def from_operator(cls, op, ctx):
        values = not op.type.endswith("argsort")
        if op.type.startswith("aten::"):
            n = len(op.inputs)
            if n == 3:
                pos = (1, 2)
            elif n == 4:
                pos = (2, 3)
            else:
                raise LayerParameterError(f"{op.where}: expected 3 or 4 inputs (input, [stable,] dim, descending), found {n}")
            return cls(ctx, values, None, None, pos)
        return cls(ctx, values, op.param("dim", int, default=-1), op.param("descending", bool, default=False), ())

    def forward(self, x: Any, *rest: Any) -> Any:
        xp = self.xp
        if self.arg_pos:
            dim = to_int(rest[self.arg_pos[0] - 1], "dim")
            descending = bool(to_int(rest[self.arg_pos[1] - 1], "descending"))
        else:
            dim, descending = self.dim, self.descending
        if x.ndim == 0:
            idx = xp.zeros((), dtype=xp.int64, device=self.device)
            return (x, idx) if self.values else idx
        axis = norm_dim(dim, x.ndim, f"{self.op_type} {self.op_name!r}")
        idx = xp.argsort(x, axis=axis, descending=descending, stable=True)
        idx = xp.astype(idx, xp.int64)
        if not self.values:
            return idx
        return xp.take_along_axis(x, idx, axis=axis), idx


@register("torch.topk")
class TopK(Layer):
    """``torch.topk(input, k, dim, largest, sorted)`` -> (values, int64 indices), through a
    stable argsort (ties: lower index first)."""

    def __init__(self, ctx: BuildContext, k: int | None, dim: int, largest: bool,
                 slots: dict[str, int] | None = None):
        super().__init__(ctx)
        self.k, self.dim, self.largest = k, dim, largest
        # k computed in the graph (``x.shape[1] // 2``, a dynamic export) arrives as the input $k
        self.slots = slots or {"input": 0}
        self._fast = getattr(ctx.fast, "topk", None)  # (numpy: a partition, then k sorted)

    @classmethod
    def from_operator(cls, op, ctx):
        slots = input_slots(op, ("input", "k"))
        k = None
        if "k" not in slots:
            k = op.param("k", int)
            if k < 0:
                raise LayerParameterError(f"{op.where}: k={k} must be >= 0")
        return cls(ctx, k, op.param("dim", int, default=-1), op.param("largest", bool, default=True), slots)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x = inputs[self.slots["input"]]
        k = self.k
        if k is None:
            who = f"{self.op_type} {self.op_name!r}"
            k = runtime_int(inputs[self.slots["k"]], who, "k")
            if k < 0:
                raise ShapeError(f"{who}: k={k} must be >= 0")
        if x.ndim == 0:
            x = xp.reshape(x, (1,))
            axis = 0
        else:
            axis = norm_dim(self.dim, x.ndim, f"{self.op_type} {self.op_name!r}")
        n = x.shape[axis]
        if k > n:
            raise ShapeError(f"topk: k={k} is larger than dimension {axis} of size {n}")
        got = None if self._fast is None else self._fast(x, k, axis, self.largest)
        if got is not None:
            return got
        idx = xp.argsort(x, axis=axis, descending=self.largest, stable=True)
        sl = tuple(slice(0, k) if a == axis else slice(None) for a in range(x.ndim))
        idx = xp.astype(idx[sl], xp.int64)
        return xp.take_along_axis(x, idx, axis=axis), idx


def index_array(xp: Any, index: Any, n: int, where: str, negative: bool, what: str = "index") -> Any:
    """``index`` as int64 in [0, n): negative entries wrap when ``negative``, anything else out of
    range is a ShapeError naming the operator."""
    if not hasattr(index, "dtype") or not xp.isdtype(index.dtype, "integral"):
        raise ShapeError(f"{where}: {what} must be an integer tensor, found "
                         f"{getattr(index, 'dtype', type(index).__name__)}")
    index = xp.astype(index, xp.int64, copy=False)
    index, least = check_range(xp, index, -n if negative else 0, n, lambda bad: f"{where}: {what} "
                               f"{'' if bad is None else f'{bad} '}is out of range for a dimension of size {n}")
    if negative and (least is None or least < 0):
        index = xp.where(index < 0, index + n, index)
    return index


class _IndexOp(Layer):
    """An operator with ``input`` and ``index`` inputs and a ``dim`` parameter."""

    def __init__(self, ctx: BuildContext, dim: int, pos: tuple[int, int]):
        super().__init__(ctx)
        self.dim, self.pos = dim, pos

    @classmethod
    def from_operator(cls, op, ctx):
        slots = input_slots(op, ("input", "index"))
        if set(slots) != {"input", "index"}:
            raise LayerParameterError(f"{op.where}: needs input and index inputs")
        return cls(ctx, op.param("dim", int), (slots["input"], slots["index"]))


@register("torch.index_select")
class IndexSelect(_IndexOp):
    """``torch.index_select(input, dim, index)`` with a 0-d or 1-D integer index."""

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x, index = inputs[self.pos[0]], inputs[self.pos[1]]
        if index.ndim == 0:
            index = xp.reshape(index, (1,))
        if x.ndim == 0:
            return x
        axis = norm_dim(self.dim, x.ndim, f"{self.op_type} {self.op_name!r}")
        index = index_array(xp, index, x.shape[axis], f"{self.op_type} {self.op_name!r}", negative=False)
        return xp.take(x, index, axis=axis)


@register("torch.gather")
class Gather(_IndexOp):
    """``torch.gather(input, dim, index)``: out[i][j] = input[index[i][j]][j] (for dim 0). The
    index may be smaller than the input in the other dimensions (torch allows it)."""

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x, index = inputs[self.pos[0]], inputs[self.pos[1]]
        if x.ndim != index.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, input has {x.ndim}")
        if x.ndim == 0:
            return x
        axis = norm_dim(self.dim, x.ndim, f"{self.op_type} {self.op_name!r}")
        if any(a != axis and index.shape[a] > x.shape[a] for a in range(x.ndim)):
            raise ShapeError(f"gather: index shape {tuple(index.shape)} exceeds input shape {tuple(x.shape)} "
                             f"outside dim {axis}")
        sl = tuple(slice(None) if a == axis else slice(0, index.shape[a]) for a in range(x.ndim))
        index = index_array(xp, index, x.shape[axis], f"{self.op_type} {self.op_name!r}", negative=False)
        fast = getattr(self.backend.fast, "take_along", None)
        y = None if fast is None else fast(x[sl], index, axis)
        return xp.take_along_axis(x[sl], index, axis=axis) if y is None else y


# ---------------------------------------------------------------------------------------------
# padding


_PAD_MODULES = {
    **{f"nn.ZeroPad{d}d": "zero" for d in (1, 2, 3)},
    **{f"nn.ConstantPad{d}d": "constant" for d in (1, 2, 3)},
    **{f"nn.ReflectionPad{d}d": "reflect" for d in (1, 2, 3)},
    **{f"nn.ReplicationPad{d}d": "replicate" for d in (1, 2, 3)},
    **{f"nn.CircularPad{d}d": "circular" for d in (1, 2, 3)},
}


def pad_index(mode: str, n: int, left: int, right: int) -> list[int]:
    """Source index of each output position along one axis for a non-constant pad mode."""
    out = []
    kept = n + min(left, 0) + min(right, 0)  # (circular: torch crops first, then wraps what is left)
    for o in range(n + left + right):
        s = o - left
        if mode == "replicate":
            s = min(max(s, 0), n - 1)
        elif mode == "circular":
            s = max(-left, 0) + (o - max(left, 0)) % kept
        else:  # reflect (without repeating the edge)
            if n == 1:
                s = 0
            else:
                period = 2 * (n - 1)
                s %= period
                if s >= n:
                    s = period - s
        out.append(s)
    return out


@register("F.pad", *_PAD_MODULES)
class Pad(Layer):
    """``F.pad(input, pad, mode, value)`` and the padding modules. ``pad`` lists (left, right)
    pairs starting from the last axis; negative amounts crop. Constant mode crops by slicing and
    pads by concatenation; reflect/replicate/circular gather with an index per axis, built once
    per input size (cached, thread-safe)."""

    def __init__(self, ctx: BuildContext, pads: tuple[int, ...] | None, mode: str, value: float, where: str):
        super().__init__(ctx)
        # pads None: they arrive as the second input (a U-Net padding its upsampled map to the
        # skip's size: ``$pad=`` from ``pnnx.Expression [0,sub(size(@0,3),size(@1,3)),...]``)
        self.pairs = None if pads is None else self._pairs(pads)
        self.mode, self.value, self.where = mode, value, where
        self._index: dict[tuple[int, int, int], Any] = {}

    @staticmethod
    def _pairs(pads: Sequence[int]) -> list[tuple[int, int]]:
        return [(pads[2 * i], pads[2 * i + 1]) for i in range(len(pads) // 2)]

    @classmethod
    def from_operator(cls, op, ctx):
        if op.type == "F.pad":
            dynamic = not op.has_param("pad") and len(op.inputs) == 2
            pads = None if dynamic else op.param("pad", (int,))
            mode = op.param("mode", str, default="constant")
            value = op.param("value", default=None)
        else:
            pads = op.param("padding", (int,))
            mode = _PAD_MODULES[op.type]
            value = op.param("value", default=None) if mode == "constant" else None
            if len(pads) == 1:
                pads = pads * (2 * int(op.type[-2]))
            if mode == "zero":
                mode = "constant"
        if pads is not None and len(pads) % 2:
            raise LayerParameterError(f"{op.where}: pad should hold (left, right) pairs, found {pads}")
        if mode not in ("constant", "reflect", "replicate", "circular"):
            raise LayerParameterError(f"{op.where}: unsupported pad mode {mode!r}; "
                                      "supported: constant, reflect, replicate, circular")
        if isinstance(value, str):
            value = float(value)
        if value is not None and not isinstance(value, (int, float)):
            raise LayerParameterError(f"{op.where}: pad value should be a number, found {value!r}")
        return cls(ctx, pads, mode, 0 if value is None else value, op.where)

    def _take_index(self, axis: int, n: int, left: int, right: int) -> Any:
        key = (n, left, right)
        idx = self._index.get(key)
        if idx is None:
            if self.mode == "reflect" and (left >= n or right >= n):
                raise ShapeError(f"{self.where}: reflect padding ({left}, {right}) must be smaller than "
                                 f"the dimension size {n}")
            if self.mode == "circular" and (left > n or right > n):
                raise ShapeError(f"{self.where}: circular padding ({left}, {right}) must not exceed "
                                 f"the dimension size {n}")
            idx = self.xp.asarray(pad_index(self.mode, n, left, right), dtype=self.xp.int64, device=self.device)
            self._index[key] = idx
        return idx

    def forward(self, x: Any, pad: Any = None) -> Any:
        xp = self.xp
        pairs = self.pairs
        if pairs is None:
            pads = runtime_ints(pad, self.where, "pad")
            if len(pads) % 2:
                raise ShapeError(f"{self.where}: pad should hold (left, right) pairs, found {list(pads)}")
            pairs = self._pairs(pads)
        if len(pairs) > x.ndim:
            raise ShapeError(f"{self.where}: {len(pairs)} pad pairs for a {x.ndim}-D input")
        out = list(x.shape)
        for k, (left, right) in enumerate(pairs):
            out[x.ndim - 1 - k] += left + right
        check_elements(math.prod(max(0, d) for d in out), self.where)
        for k, (left, right) in enumerate(pairs):
            if left == 0 and right == 0:
                continue
            axis = x.ndim - 1 - k
            n = x.shape[axis]
            if n + left + right < 0:
                raise ShapeError(f"{self.where}: padding ({left}, {right}) leaves a negative size on axis {axis}")
            if self.mode != "constant":
                x = xp.take(x, self._take_index(axis, n, left, right), axis=axis)
                continue
            lo, hi = max(0, -left), n - max(0, -right)
            if lo or hi != n:
                x = x[(slice(None),) * axis + (slice(lo, max(lo, hi)), ...)]
            parts = []
            for amount in (left, right):
                if amount > 0:
                    shape = tuple(amount if a == axis else s for a, s in enumerate(x.shape))
                    parts.append(xp.full(shape, self.value, dtype=x.dtype, device=self.device))
                else:
                    parts.append(None)
            x = xp.concat([p for p in (parts[0], x, parts[1]) if p is not None], axis=axis)
        return x
