"""Parser for the ``.pnnx.param`` text format (see PNNX.md).

Nothing read from the file is ever evaluated as code: every value goes through
:func:`parse_value`, which only recognises literals.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

from kuiper_xp.errors import ModelNotFoundError, ParamFormatError, ResourceLimitError
from kuiper_xp.limits import get_limits

from .ir import DTYPES, Model, Operand, Operator, WeightRef

MAGIC = "7767517"
_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_NONFINITE_RE = re.compile(r"[-+]?(nan|inf)\.0+\Z")  # (bare nan / inf stay words, by pnnx's rules)
_COUNT_RE = re.compile(r"[0-9]{1,18}\Z")  # a count: non-negative, fits in int64
# pnnx's C++ reader separates tokens with ASCII whitespace only; a name may hold any other
# character (U+00A0, U+2028, ...), so str.split()/strip() (which know Unicode spaces) are not used
_ASCII_WS = " \t\r\x0b\x0c"
_WS_RE = re.compile(r"[ \t\r\x0b\x0c]+")
_SHAPE_RE = re.compile(r"\((.*)\)([a-z0-9]+)\Z")
_UNSEEN = object()


def _plain_ascii(line: str) -> bool:
    """Whether ``str.split()`` splits ``line`` as pnnx does (at runs of ASCII space, tab, CR, VT,
    FF): ASCII text without the separator characters 0x1c-0x1f, which str.split() takes for
    whitespace too. A sixth of the regex split's cost (6.1 -> 1.1 us for a convolution's line)."""
    return line.isascii() and "\x1c" not in line and "\x1d" not in line and "\x1e" not in line \
        and "\x1f" not in line


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
    if text.isdigit() and text.isascii():  # the common case, [0-9]+ (what the checks below give it)
        return int(text)
    if not text:
        raise ValueError("empty item")
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    if _NONFINITE_RE.match(text):  # pnnx writes float("nan") as nan.0 (and inf sometimes as inf.0)
        return float(text.split(".")[0])
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


def _shorten(text: str, n: int = 60) -> str:
    return repr(text) if len(text) <= n else repr(text[:n]) + f"... ({len(text)} characters)"


def _parse_shape(text: str, limits, seen: dict | None = None) -> tuple[tuple[int | None, ...], str]:
    """``(d0,d1,...)dtype`` -> (dims, dtype). Format errors raise ValueError; a dimension or rank
    over the limits raises ResourceLimitError (without location: the caller adds it). ``seen``
    keeps the texts already parsed (with the same limits) and their results: a file repeats its
    shapes, each operand's on the line that makes it and on every line that reads it."""
    if seen is not None:
        got = seen.get(text)
        if got is None:
            got = seen[text] = _parse_shape(text, limits)
        return got
    m = _SHAPE_RE.match(text)
    if not m:
        raise ValueError(f"expected '(d0,d1,...)dtype', found {_shorten(text)}")
    inner, dtype = m.group(1), m.group(2)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {_shorten(dtype, 20)} in {_shorten(text)}; known: {', '.join(DTYPES)}")
    dims: list[int | None] = []
    if inner.strip():
        parts = inner.split(",")
        if len(parts) > limits.max_rank:
            raise ResourceLimitError(f"shape {_shorten(text)} has {len(parts)} dimensions "
                                     f"(limit max_rank={limits.max_rank})")
        for p in parts:
            p = p.strip()
            if p == "?" or p == "-1":
                dims.append(None)
            elif p.isdigit() and p.isascii():  # ([0-9]+: str.isdigit alone takes any script's digits)
                # more than 30 digits is over any limit; do not feed it to int()
                d = int(p) if len(p) <= 30 else None
                if d is None or d > limits.max_dim:
                    raise ResourceLimitError(f"dimension {_shorten(p, 40)} in {_shorten(text)} is over "
                                             f"the limit max_dim={limits.max_dim}")
                dims.append(d)
            else:
                raise ValueError(f"bad dimension {_shorten(p, 40)} in {_shorten(text)}")
    return tuple(dims), dtype


def _raise_limit(exc: ResourceLimitError, where: str) -> None:
    raise ResourceLimitError(f"{where}: {exc} (raise it with kuiper_xp.limits.set_limits(...) or "
                             "the KUIPER_XP_MAX_... environment variable)") from None


def _param_hint(path: Path) -> str:
    """For a missing model path: the ``.pnnx.param`` its stem names, where there is one."""
    for cand in (path.with_name(path.name + ".pnnx.param"), path.with_name(path.name + ".param")):
        if cand.is_file():
            return f" ({cand} is there: pass that)"
    return ""


def parse_param(path: str | os.PathLike) -> Model:
    """Parse a ``.pnnx.param`` file into a :class:`Model` (no weights attached)."""
    path = Path(path)
    limits = get_limits()
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ModelNotFoundError(f"{path}: file not found{_param_hint(path)}") from None
    except (OSError, ValueError) as exc:
        raise ParamFormatError(f"cannot read: {exc}", str(path)) from None
    if size > limits.max_param_bytes:
        raise ResourceLimitError(
            f"{path}: param file is {size} bytes, over the limit max_param_bytes="
            f"{limits.max_param_bytes} (raise it with kuiper_xp.limits.set_limits(max_param_bytes=...) "
            "or KUIPER_XP_MAX_PARAM_BYTES)"
        )
    try:
        with open(path, "rb") as fh:
            # read() pre-allocates its argument: ask for the size stat() gave, plus one byte to
            # notice a file that grew since
            raw = fh.read(size + 1)
        if len(raw) > limits.max_param_bytes:
            raise ResourceLimitError(f"{path}: param file is over the limit max_param_bytes="
                                     f"{limits.max_param_bytes}")
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        what = _binary_kind(raw, str(path))
        if what:
            raise ParamFormatError(what, str(path)) from None
        line = raw[: exc.start].count(b"\n") + 1
        raise ParamFormatError(f"not UTF-8 text (byte {exc.start})", str(path), line) from None
    except OSError as exc:
        raise ParamFormatError(f"cannot read: {exc}", str(path)) from None
    return parse_param_text(text, str(path))


def _binary_kind(raw: bytes, path: str) -> str:
    """What a binary file given as the model most likely is, with what to pass instead ("" when
    unknown): a TorchScript ``.pt`` or a ``.pnnx.bin`` (zip archives), a ``.npy`` array, an ONNX
    model."""
    if raw.startswith(b"PK\x03\x04"):
        if path.endswith(".pnnx.bin"):
            return (f"this is the weights archive; pass the .pnnx.param beside it "
                    f"({path[:-len('.pnnx.bin')]}.pnnx.param)")
        return ("a zip archive (a TorchScript .pt or a .pnnx.bin), not a .pnnx.param: convert a .pt with "
                "pnnx (pnnx model.pt inputshape=[1,3,224,224]) and pass the .pnnx.param it writes")
    if raw.startswith(b"\x93NUMPY"):
        return "a .npy array, not a model: pass the .pnnx.param first and the arrays as inputs"
    if path.lower().endswith(".onnx"):
        return ("an ONNX model, not a .pnnx.param: convert it with pnnx (pnnx model.onnx "
                "inputshape=[1,3,224,224]) and pass the .pnnx.param it writes")
    return ""


#: operator types of ncnn's own .param format (the file pnnx writes beside model.pnnx.param);
#: a pnnx graph's types are dotted (``nn.Conv2d``, ``pnnx.Input``, ...)
_NCNN_TYPES = frozenset({"Input", "Convolution", "ConvolutionDepthWise", "Split", "Pooling", "InnerProduct",
                         "MemoryData", "BinaryOp", "Eltwise", "Concat", "ReLU", "Swish", "Permute"})


def _reject_ncnn(body: list[tuple[int, str]], path: str) -> None:
    """An ncnn .param shares the magic line; say so instead of failing on its contents (its
    ``Split`` blobs read as duplicate operator names)."""
    if not body:
        return
    types = [(lno, line.split(None, 1)[0]) for lno, line in body[:64]]
    if any(t.startswith("pnnx.") for _, t in types):
        return
    hit = next(((lno, t) for lno, t in types if t in _NCNN_TYPES), None)
    if hit is not None:
        sibling = str(path)[:-len(".ncnn.param")] + ".pnnx.param" if str(path).endswith(".ncnn.param") else None
        hint = f"; here that is {sibling}" if sibling and os.path.isfile(sibling) else ""
        raise ParamFormatError(
            f"this is an ncnn .param file (operator type {hit[1]!r}), not a pnnx one: kuiper-xp reads "
            f"the model.pnnx.param that pnnx writes next to it{hint}", path, hit[0])


def _count(text: str) -> int | None:
    """A non-negative count, or None when it is not one; a count of more than 18 digits is
    returned as a huge number (it is over every limit) without converting it."""
    if _COUNT_RE.match(text):
        return int(text)
    if _INT_RE.match(text) and text[0] not in "+-":
        return 10**18
    return None


def parse_param_text(text: str, path: str = "<string>") -> Model:
    """Parse the text of a ``.pnnx.param`` file (``\n`` or ``\r\n`` line ends; blank lines are
    skipped). Raises :class:`ParamFormatError` naming ``path:line`` for malformed text and
    :class:`ResourceLimitError` for declarations over :func:`kuiper_xp.limits.get_limits`."""
    limits = get_limits()
    if not isinstance(text, str):
        raise ParamFormatError(f"expected the text of a .pnnx.param file, got {type(text).__name__}", path)
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")

    def err(msg: str, line: int) -> ParamFormatError:
        return ParamFormatError(msg, path, line)

    # skip blank lines, remember 1-based numbers
    numbered = [(i + 1, ln.strip(_ASCII_WS)) for i, ln in enumerate(lines)]
    numbered = [(i, ln) for i, ln in numbered if ln]
    if not numbered:
        raise err("empty file; expected the magic line 7767517", 1)
    lno, first = numbered[0]
    if first != MAGIC:
        raise err(f"missing magic line: expected {MAGIC}, found {_shorten(first, 40)}", lno)
    if len(numbered) < 2:
        raise err("missing the '<operator_count> <operand_count>' line", lno + 1)
    lno, counts = numbered[1]
    parts = _WS_RE.split(counts)
    if len(parts) != 2 or not all(_INT_RE.match(p) for p in parts):
        raise err(f"expected '<operator_count> <operand_count>', found {_shorten(counts)}", lno)
    if any(p[0] == "-" for p in parts):
        raise err(f"negative counts {_shorten(counts)}", lno)
    n_ops, n_operands = _count(parts[0].lstrip("+")), _count(parts[1].lstrip("+"))
    assert n_ops is not None and n_operands is not None
    if n_ops > limits.max_operators or n_operands > limits.max_operands:
        _raise_limit(ResourceLimitError(
            f"the header declares {_shorten(parts[0], 30)} operators / {_shorten(parts[1], 30)} operands, "
            f"over the limits max_operators={limits.max_operators} / max_operands={limits.max_operands}"),
            f"{path}:{lno}")
    body = numbered[2:]
    _reject_ncnn(body, path)
    if len(body) != n_ops:
        raise err(
            f"header declares {n_ops} operators but the file has {len(body)} operator lines",
            body[n_ops][0] if len(body) > n_ops else lno,
        )

    operands: dict[str, Operand] = {}
    operators: list[Operator] = []
    op_names: set[str] = set()
    shapes: dict[str, tuple] = {}  # shape texts parsed (see _parse_shape)
    values: dict[str, Any] = {}  # parameter texts parsed: a file repeats 'stride=(1,1)', 'bias=True'
    for lno, line in body:
        if len(line) > limits.max_line_chars:
            _raise_limit(ResourceLimitError(
                f"line of {len(line)} characters, over the limit max_line_chars={limits.max_line_chars}"),
                f"{path}:{lno}")
        tok = line.split() if _plain_ascii(line) else _WS_RE.split(line)
        if len(tok) < 4:
            raise err(f"an operator line needs '<type> <name> <n_in> <n_out> ...', found {_shorten(line, 80)}", lno)
        typ, name, s_in, s_out = tok[:4]
        n_in, n_out = _count(s_in), _count(s_out)
        if n_in is None or n_out is None:
            raise err(f"operator {_shorten(name)}: input/output counts must be non-negative integers, "
                      f"found {_shorten(s_in, 30)} {_shorten(s_out, 30)}", lno)
        if len(tok) < 4 + n_in + n_out:
            raise err(
                f"operator {typ[:60]} {_shorten(name)} declares {_shorten(s_in, 30)} inputs and "
                f"{_shorten(s_out, 30)} outputs "
                f"but the line has only {len(tok) - 4} names after the counts", lno)
        if name in op_names:
            # pnnx itself sometimes names two operators alike (a torch.unbind and a Tensor.select
            # both 'Tensor.select_2'); operands do the wiring, so one without weights (read by
            # name from the .bin) is renamed; with weights the file is ambiguous
            if any(t.startswith("@") for t in tok[4 + n_in + n_out:]):
                raise err(f"duplicate operator name {_shorten(name)} on an operator with weights", lno)
            renamed = f"{name}@line{lno}"
            warnings.warn(f"{path}:{lno}: duplicate operator name {_shorten(name)}: renamed {_shorten(renamed)}",
                          stacklevel=2)
            name = renamed
        op_names.add(name)
        op = Operator(type=typ, name=name, line=lno, path=path)
        in_names = tok[4 : 4 + n_in]
        out_names = tok[4 + n_in : 4 + n_in + n_out]
        for oname in in_names:
            operand = operands.get(oname)
            if operand is None:
                raise err(f"operator {typ} {_shorten(name)} uses operand {_shorten(oname)} before any "
                          "operator produces it", lno)
            operand.consumers.append(op)
            op.inputs.append(operand)
        for oname in out_names:
            if oname in operands:
                prev = operands[oname].producer
                by = f" (first by {prev.type} {prev.name!r}, line {prev.line})" if prev is not None else ""
                raise err(f"operand {_shorten(oname)} is produced twice: again by {typ} "
                          f"{_shorten(name)}{by}", lno)
            if len(operands) >= n_operands:
                raise err(f"more operands than the {n_operands} the header declares", lno)
            operand = Operand(oname, producer=op)
            operands[oname] = operand
            op.outputs.append(operand)
        # '$key=operand' names the first not yet named input slot holding that operand
        free_slots: dict[str, list[int]] = {}
        for k in range(len(in_names) - 1, -1, -1):
            free_slots.setdefault(in_names[k], []).append(k)
        own = {id(o) for o in op.inputs} | {id(o) for o in op.outputs}
        op.input_names = [""] * n_in
        for kv in tok[4 + n_in + n_out :]:
            key, sep, value = kv.partition("=")
            if not sep or not key:
                raise err(f"operator {_shorten(name)}: expected key=value, found {_shorten(kv, 80)}", lno)
            head = key[0]
            if head == "@":
                wname = key[1:]
                try:
                    shape, dtype = _parse_shape(value, limits, shapes)
                except ResourceLimitError as exc:
                    _raise_limit(ResourceLimitError(f"weight {name}.{wname}: {exc}"), f"{path}:{lno}")
                except ValueError as exc:
                    raise err(f"operator {_shorten(name)}: weight {_shorten(wname)}: {exc}", lno) from None
                if any(d is None for d in shape):
                    raise err(f"operator {_shorten(name)}: weight {_shorten(wname)} has a dynamic shape "
                              f"{_shorten(value)}", lno)
                item = DTYPES[dtype][1]
                n = math.prod(shape) * item
                # also bound the non-zero dims, so '(huge,0)' cannot make an absurd empty array
                n_nonzero = math.prod(d for d in shape if d) * item  # type: ignore[misc]
                if max(n, n_nonzero) > limits.max_weight_bytes:
                    _raise_limit(ResourceLimitError(
                        f"weight {name}.{wname} {_shorten(value)} would take {max(n, n_nonzero)} bytes"
                        f"{' (not counting its zero dimensions)' if n != n_nonzero else ''}, over the "
                        f"limit max_weight_bytes={limits.max_weight_bytes}"), f"{path}:{lno}")
                op.attrs[wname] = WeightRef(name, wname, shape, dtype)  # type: ignore[arg-type]
            elif head == "$":
                slots = free_slots.get(value)
                if slots is None:
                    raise err(f"operator {_shorten(name)}: input key {_shorten(key)} names operand "
                              f"{_shorten(value)}, which is not among its inputs {in_names[:20]}", lno)
                k = slots.pop() if len(slots) > 1 else slots[0]
                op.input_names[k] = key[1:]
            elif head == "#":
                oname = key[1:]
                operand = operands.get(oname)
                if operand is None or id(operand) not in own:
                    raise err(f"operator {_shorten(name)}: shape annotation for operand {_shorten(oname)}, "
                              "which is not one of its inputs or outputs", lno)
                try:
                    shape, dtype = _parse_shape(value, limits, shapes)
                except ResourceLimitError as exc:
                    _raise_limit(ResourceLimitError(f"operand {oname}: {exc}"), f"{path}:{lno}")
                except ValueError as exc:
                    raise err(f"operator {_shorten(name)}: operand {_shorten(oname)}: {exc}", lno) from None
                operand.shape, operand.dtype = shape, dtype
            else:
                try:
                    # a pnnx.Expression keeps its text: pnnx's value rules would split
                    # '[size(@0,0),-1]' at the commas and turn '5.000000e+00' into 5.0
                    if key == "expr" and typ == "pnnx.Expression":
                        op.params[key] = value
                    else:
                        got = values.get(value, _UNSEEN)
                        if got is _UNSEEN:
                            got = values[value] = parse_value(value)
                        # (each operator its own list: a layer may change what it was given)
                        op.params[key] = got.copy() if type(got) is list else got
                except ValueError as exc:
                    raise err(f"operator {_shorten(name)}: parameter {_shorten(key)}: {exc}", lno) from None
        operators.append(op)
    # (fewer operands than the header declares is fine: pnnx counts an output it dropped, the
    # unused indices of a torch.sort / topk of a weight it folded into a constant; more is refused
    # above, as each operand is made)
    return Model(operators, operands, path)
