"""Typed IR of a pnnx model: operators, operands, parameters, and weight references."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kuiper_xp.errors import LayerParameterError

if TYPE_CHECKING:  # pragma: no cover
    from .binfile import BinReader

# pnnx dtype suffix -> (Array API dtype name, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "f32": ("float32", 4),
    "f64": ("float64", 8),
    "f16": ("float16", 2),
    "bf16": ("bfloat16", 2),
    "i64": ("int64", 8),
    "i32": ("int32", 4),
    "i16": ("int16", 2),
    "i8": ("int8", 1),
    "u8": ("uint8", 1),
    "bool": ("bool", 1),
    "c64": ("complex64", 8),
    "c128": ("complex128", 16),
    "c32": ("complex32", 4),
}

_MISSING = object()


@dataclass(eq=False)
class Operand:
    """A value flowing between operators. ``shape`` uses None for a dynamic (``?``) dimension;
    ``shape``/``dtype`` are None when the file did not annotate them."""

    name: str
    shape: tuple[int | None, ...] | None = None
    dtype: str | None = None
    producer: Operator | None = None
    consumers: list[Operator] = field(default_factory=list)

    @property
    def array_dtype(self) -> str | None:
        return DTYPES[self.dtype][0] if self.dtype in DTYPES else None

    def shape_str(self) -> str:
        if self.shape is None:
            return "?"
        return "(" + ",".join("?" if d is None else str(d) for d in self.shape) + ")"

    def __repr__(self) -> str:
        return f"Operand({self.name!r}, {self.shape_str()}, {self.dtype})"


@dataclass(eq=False)
class WeightRef:
    """A weight declared by ``@name=(shape)dtype``; the data stay in the .bin until read."""

    op_name: str
    name: str
    shape: tuple[int, ...]
    dtype: str  # pnnx suffix, e.g. 'f32'
    reader: BinReader | None = None
    #: no other weight of the file has this one's shape, dtype and CRC-32 (set when the .bin is
    #: attached), so none can hold the same values: the build need not keep it to compare
    unique: bool = False

    @property
    def member(self) -> str:
        return f"{self.op_name}.{self.name}"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]

    @property
    def array_dtype(self) -> str:
        return DTYPES[self.dtype][0]

    def numpy(self):
        """The weight as a host (numpy) array, read from the .bin (one copy)."""
        if self.reader is None:
            from kuiper_xp.errors import BinFormatError

            raise BinFormatError(f"weight {self.member!r} has no .bin attached")
        return self.reader.read(self)


class Params(dict):
    """An operator's parameters, recording every key a layer looks up (present or not), so that
    a key nothing read can be told from one a layer expected: see :meth:`Operator.param_typos`."""

    __slots__ = ("asked",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.asked.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.asked.add(key)
        return super().__contains__(key)


@dataclass(eq=False)
class Operator:
    type: str
    name: str
    inputs: list[Operand] = field(default_factory=list)
    outputs: list[Operand] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)  # '$key' per input ('' when unnamed)
    params: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, WeightRef] = field(default_factory=dict)
    line: int = 0
    path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.params, Params):
            self.params = Params(self.params)

    def param_typos(self) -> list[tuple[str, str]]:
        """``(key, expected)`` pairs after a layer was built from this operator: a parameter no
        lookup asked for, next to one the layer asked for that is missing and that it resembles
        (``strde=(2,2)`` where ``stride`` was expected: the layer then took stride's default)."""
        asked = getattr(self.params, "asked", set())
        have = set(dict.keys(self.params))
        unread = have - asked
        if not unread:
            return []
        missing = sorted(asked - have)
        if not missing:
            return []
        out = []
        for key in sorted(unread):
            near = difflib.get_close_matches(key, missing, n=1, cutoff=0.75)
            if near:
                out.append((key, near[0]))
        return out

    @property
    def where(self) -> str:
        loc = f"{self.path}:{self.line}" if self.path else f"line {self.line}"
        return f"{self.type} {self.name!r} ({loc})"

    def has_param(self, key: str) -> bool:
        return key in self.params

    def param(self, key: str, kind: Any = None, default: Any = _MISSING) -> Any:
        """The parameter ``key`` converted to ``kind``.

        ``kind`` is ``int``, ``float``, ``bool``, ``str``, ``list``/``tuple`` (any items), or
        ``(int,)`` / ``(float,)`` for a tuple of that item type (a scalar is promoted to a
        1-tuple). ``None`` in the file becomes None, or ``default`` where one other than None is
        given (as torch reads ``align_corners=None``; a layer never sees None where it expects a
        value). Errors name the op, the key and the value.
        """
        params = self.params
        asked = getattr(params, "asked", None)
        if asked is not None:
            asked.add(key)
        value = dict.get(params, key, _MISSING)  # (one lookup: this runs for every parameter at load)
        if value is _MISSING:
            if default is _MISSING:
                raise LayerParameterError(
                    f"{self.where}: parameter {key!r} is missing; it has {sorted(params) or 'no parameters'}"
                )
            return default
        if value is None and default is not _MISSING and default is not None:
            return default
        if kind is None or value is None:
            return value
        try:
            return _convert(value, kind)
        except (TypeError, ValueError):
            name = kind.__name__ if isinstance(kind, type) else f"tuple of {kind[0].__name__}"
            raise LayerParameterError(
                f"{self.where}: parameter {key!r} should be {name}, found {value!r}"
            ) from None

    def ints(self, key: str, n: int | None = None, default: Any = _MISSING) -> tuple[int, ...] | Any:
        """An int or tuple of ints, expanded to ``n`` items when a single value is given."""
        v = self.param(key, (int,), default)
        if v is None or v is default:
            return v
        if n is not None:
            if len(v) == 1:
                v = v * n
            if len(v) != n:
                raise LayerParameterError(f"{self.where}: parameter {key!r} should have {n} values, found {v!r}")
        return v

    def weight_ref(self, name: str) -> WeightRef | None:
        return self.attrs.get(name)

    def weight(self, name: str, ctx: Any, optional: bool = False, dtype: str | None = None):
        """The weight ``@name`` as an array of ``ctx``'s backend on its device (read once)."""
        ref = self.attrs.get(name)
        if ref is None:
            if optional:
                return None
            raise LayerParameterError(
                f"{self.where}: weight {name!r} is missing; it has {sorted(self.attrs) or 'no weights'}"
            )
        return ctx.weight(ref, dtype=dtype)

    def __repr__(self) -> str:
        return (f"Operator({self.type} {self.name!r}, in={[o.name for o in self.inputs]}, "
                f"out={[o.name for o in self.outputs]})")


def _convert(value: Any, kind: Any) -> Any:
    if isinstance(kind, tuple):
        item = kind[0]
        seq = value if isinstance(value, (list, tuple)) else [value]
        if item is int and all(type(v) is int for v in seq):  # (the common case: no bools)
            return tuple(seq)
        return tuple(_convert(v, item) for v in seq)
    if kind in (list, tuple):
        return kind(value) if isinstance(value, (list, tuple)) else kind([value])
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(value)
        return value
    if kind is float:
        if isinstance(value, bool):
            raise ValueError(value)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and value.lower() in ("inf", "-inf", "+inf", "nan"):
            return float(value)
        raise ValueError(value)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(value)
        return value
    raise TypeError(kind)


@dataclass(eq=False)
class Model:
    """A parsed pnnx model: operators in file order and operands by name."""

    operators: list[Operator]
    operands: dict[str, Operand]
    path: str = ""
    bin: BinReader | None = None

    def attach_bin(self, bin_path) -> None:
        from .binfile import BinReader

        needs = [w for op in self.operators for w in op.attrs.values()]
        reader = BinReader(bin_path, lazy_missing=not needs)
        self.bin = reader
        for w in needs:
            w.reader = reader
        if needs:
            reader.check(needs)
            reader.mark_unique(needs)

    @property
    def weights(self) -> list[WeightRef]:
        return [w for op in self.operators for w in op.attrs.values()]

    def close(self) -> None:
        if self.bin is not None:
            self.bin.close()
