"""Parser for the ``.pnnx.param`` text format (see PNNX.md).

Nothing read from the file is ever evaluated as code: every value goes through
:func:`parse_value`, which only recognises literals.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from kuiper_xp.errors import ParamFormatError, ResourceLimitError
from kuiper_xp.limits import get_limits

from .ir import DTYPES, Model, Operand, Operator, WeightRef

MAGIC = "7767517"
_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_COUNT_RE = re.compile(r"[0-9]{1,18}\Z")  # a count: non-negative, fits in int64
_SHAPE_RE = re.compile(r"\((.*)\)([a-z0-9]+)\Z")


def parse_value(text: str) -> Any:
    """One parameter value, with pnnx's own rules, in pnnx's order:
    ``%`` -> string; ``None``/``()``/``[]`` -> None; ``True``/``False`` -> bool; ``(..)``/``[..]``
    -> list; leading non-digit (not ``-``) -> string; ``.`` or ``e`` -> float; else int."""
    if "%" in text:
        return text
    if text in ("None", "()", "[]", ""):
        return None
    if text == "True":
        return True
    if text == "False":
        return False
    if text[0] in "([":
        close = ")" if text[0] == "(" else "]"
        if text[-1] != close:
            raise ValueError(f"unbalanced list {text!r}")
        inner = text[1:-1]
        if not inner:
            return []
        return [_scalar(item) for item in inner.split(",")]
    return _scalar(text)


def _scalar(text: str) -> Any:
    if not text:
        raise ValueError("empty item")
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    if not (text[0].isdigit() or text[0] in "-+."):
        return text
    if _INT_RE.match(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        if text.endswith("j"):
            try:
                return complex(text)
            except ValueError:
                pass
        # e.g. '-inf' is float(), but '-foo' is a string pnnx would keep as it is
        return text


def _parse_shape(text: str, limits) -> tuple[tuple[int | None, ...], str]:
    m = _SHAPE_RE.match(text)
    if not m:
        raise ValueError(f"expected '(d0,d1,...)dtype', found {text!r}")
    inner, dtype = m.group(1), m.group(2)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} in {text!r}; known: {', '.join(DTYPES)}")
    dims: list[int | None] = []
    if inner.strip():
        parts = inner.split(",")
        if len(parts) > limits.max_rank:
            raise ValueError(f"shape {text!r} has {len(parts)} dimensions (limit {limits.max_rank})")
        for p in parts:
            p = p.strip()
            if p == "?":
                dims.append(None)
            elif _INT_RE.match(p) and int(p) >= 0:
                dims.append(int(p))
            elif p == "-1":
                dims.append(None)
            else:
                raise ValueError(f"bad dimension {p!r} in {text!r}")
    return tuple(dims), dtype


def parse_param(path: str | os.PathLike) -> Model:
    """Parse a ``.pnnx.param`` file into a :class:`Model` (no weights attached)."""
    path = Path(path)
    limits = get_limits()
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ParamFormatError("file not found", str(path)) from None
    except OSError as exc:
        raise ParamFormatError(f"cannot read: {exc}", str(path)) from None
    if size > limits.max_param_bytes:
        raise ResourceLimitError(
            f"{path}: param file is {size} bytes, over the limit of {limits.max_param_bytes} "
            "(raise it with kuiper_xp.limits.set_limits(max_param_bytes=...))"
        )
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ParamFormatError(f"not UTF-8 text (byte {exc.start})", str(path), line) from None
    except OSError as exc:
        raise ParamFormatError(f"cannot read: {exc}", str(path)) from None
    return parse_param_text(text, str(path))


def parse_param_text(text: str, path: str = "<string>") -> Model:
    """Parse the text of a ``.pnnx.param`` file."""
    limits = get_limits()
    lines = text.split("\n")

    def err(msg: str, line: int) -> ParamFormatError:
        return ParamFormatError(msg, path, line)

    # skip blank lines, remember 1-based numbers
    numbered = [(i + 1, ln.strip()) for i, ln in enumerate(lines)]
    numbered = [(i, ln) for i, ln in numbered if ln]
    if not numbered:
        raise err("empty file; expected the magic line 7767517", 1)
    lno, first = numbered[0]
    if first != MAGIC:
        raise err(f"missing magic line: expected {MAGIC}, found {first[:40]!r}", lno)
    if len(numbered) < 2:
        raise err("missing the '<operator_count> <operand_count>' line", lno + 1)
    lno, counts = numbered[1]
    parts = counts.split()
    if len(parts) != 2 or not all(_INT_RE.match(p) for p in parts):
        raise err(f"expected '<operator_count> <operand_count>', found {counts[:60]!r}", lno)
    n_ops, n_operands = int(parts[0]), int(parts[1])
    if n_ops < 0 or n_operands < 0:
        raise err(f"negative counts {n_ops} {n_operands}", lno)
    if n_ops > limits.max_operators or n_operands > limits.max_operands:
        raise ResourceLimitError(
            f"{path}:{lno}: {n_ops} operators / {n_operands} operands exceed the limits "
            f"({limits.max_operators} / {limits.max_operands}; raise with kuiper_xp.limits.set_limits)"
        )
    body = numbered[2:]
    if len(body) != n_ops:
        raise err(
            f"header declares {n_ops} operators but the file has {len(body)} operator lines",
            body[-1][0] if len(body) > n_ops and n_ops < len(body) else lno,
        )

    operands: dict[str, Operand] = {}
    operators: list[Operator] = []
    op_names: set[str] = set()
    for lno, line in body:
        if len(line) > limits.max_line_chars:
            raise ResourceLimitError(f"{path}:{lno}: line of {len(line)} characters (limit {limits.max_line_chars})")
        tok = line.split()
        if len(tok) < 4:
            raise err(f"an operator line needs '<type> <name> <n_in> <n_out> ...', found {line[:80]!r}", lno)
        typ, name, s_in, s_out = tok[:4]
        if not (_INT_RE.match(s_in) and _INT_RE.match(s_out)) or int(s_in) < 0 or int(s_out) < 0:
            raise err(f"operator {name!r}: input/output counts must be non-negative integers, found {s_in!r} {s_out!r}", lno)
        n_in, n_out = int(s_in), int(s_out)
        if len(tok) < 4 + n_in + n_out:
            raise err(
                f"operator {typ} {name!r} declares {n_in} inputs and {n_out} outputs but the line has "
                f"only {len(tok) - 4} names after the counts", lno)
        if name in op_names:
            raise err(f"duplicate operator name {name!r}", lno)
        op_names.add(name)
        op = Operator(type=typ, name=name, line=lno, path=path)
        in_names = tok[4 : 4 + n_in]
        out_names = tok[4 + n_in : 4 + n_in + n_out]
        for oname in in_names:
            operand = operands.get(oname)
            if operand is None:
                raise err(f"operator {typ} {name!r} uses operand {oname!r} before any operator produces it", lno)
            operand.consumers.append(op)
            op.inputs.append(operand)
        for oname in out_names:
            if oname in operands:
                raise err(f"operand {oname!r} is produced twice (again by {typ} {name!r})", lno)
            if len(operands) >= n_operands:
                raise err(f"more operands than the {n_operands} the header declares", lno)
            operand = Operand(oname, producer=op)
            operands[oname] = operand
            op.outputs.append(operand)
        op.input_names = [""] * n_in
        for kv in tok[4 + n_in + n_out :]:
            key, sep, value = kv.partition("=")
            if not sep or not key:
                raise err(f"operator {name!r}: expected key=value, found {kv[:80]!r}", lno)
            head = key[0]
            if head == "@":
                wname = key[1:]
                try:
                    shape, dtype = _parse_shape(value, limits)
                except ValueError as exc:
                    raise err(f"operator {name!r}: weight {wname!r}: {exc}", lno) from None
                if any(d is None for d in shape):
                    raise err(f"operator {name!r}: weight {wname!r} has a dynamic shape {value!r}", lno)
                n = math.prod(shape) * DTYPES[dtype][1]
                if n > limits.max_weight_bytes:
                    raise ResourceLimitError(
                        f"{path}:{lno}: weight {name}.{wname} {value} would take {n} bytes "
                        f"(limit {limits.max_weight_bytes}; raise with kuiper_xp.limits.set_limits)")
                op.attrs[wname] = WeightRef(name, wname, shape, dtype)  # type: ignore[arg-type]
            elif head == "$":
                if value not in in_names:
                    raise err(f"operator {name!r}: input key {key!r} names operand {value!r}, "
                              f"which is not among its inputs {in_names}", lno)
                op.input_names[in_names.index(value)] = key[1:]
            elif head == "#":
                oname = key[1:]
                operand = operands.get(oname)
                if operand is None or (operand not in op.inputs and operand not in op.outputs):
                    raise err(f"operator {name!r}: shape annotation for operand {oname!r}, "
                              "which is not one of its inputs or outputs", lno)
                try:
                    shape, dtype = _parse_shape(value, limits)
                except ValueError as exc:
                    raise err(f"operator {name!r}: operand {oname!r}: {exc}", lno) from None
                operand.shape, operand.dtype = shape, dtype
            else:
                try:
                    op.params[key] = parse_value(value)
                except ValueError as exc:
                    raise err(f"operator {name!r}: parameter {key!r}: {exc}", lno) from None
        operators.append(op)
    if len(operands) != n_operands:
        raise err(f"header declares {n_operands} operands but the operators produce {len(operands)}",
                  numbered[1][0])
    return Model(operators, operands, path)
