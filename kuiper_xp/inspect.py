"""Model summaries for ``kuiper-xp inspect``: an operator table, totals, unsupported operators,
and a Graphviz export. Works on the parsed model (:func:`kuiper_xp.pnnx.load_model`), so it runs
before, and without, building the graph; nothing here executes a layer.

The FLOP count is an *estimate*: multiply-accumulates of convolutions, transposed convolutions,
linear layers, matrix products and attention, times two. Element-wise operators, pooling,
normalisation and the rest are not counted. A dynamic first dimension counts as ``batch``, any
other dynamic dimension as 1 (the same rule as ``Graph.planned_peak_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kuiper_xp.pnnx.ir import DTYPES, Model, Operand, Operator

__all__ = [
    "OpInfo",
    "ModelSummary",
    "summarize",
    "estimate_macs",
    "format_table",
    "format_totals",
    "to_dot",
    "human_bytes",
    "human_count",
]

#: handled by the runtime itself (a tuple feeding pnnx.Output), not by a registered layer
RUNTIME_TYPES = ("prim::TupleConstruct",)

_CONV = ("nn.Conv1d", "nn.Conv2d", "nn.Conv3d", "F.conv1d", "F.conv2d", "F.conv3d")
_DECONV = ("nn.ConvTranspose1d", "nn.ConvTranspose2d", "nn.ConvTranspose3d",
           "F.conv_transpose1d", "F.conv_transpose2d", "F.conv_transpose3d")
_LINEAR = ("nn.Linear", "F.linear")
_MATMUL = ("torch.matmul", "torch.mm", "torch.bmm", "Tensor.matmul", "torch.einsum_matmul")
_ADDMM = ("torch.addmm", "torch.baddbmm")


@dataclass
class OpInfo:
    """One row of the operator table."""

    index: int
    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: int
    weight_bytes: int
    macs: int | None
    supported: bool
    where: str


@dataclass
class ModelSummary:
    path: str
    ops: list[OpInfo]
    inputs: list[str]
    outputs: list[str]
    batch: int
    params: int = 0
    weight_bytes: int = 0
    macs: int = 0
    macs_unknown: int = 0  # counted op types whose shapes were not annotated
    unsupported: list[OpInfo] = field(default_factory=list)

    @property
    def flops(self) -> int:
        return 2 * self.macs

    @property
    def types(self) -> list[str]:
        return sorted({o.type for o in self.ops})


# -- shapes -----------------------------------------------------------------------------------------
def _dims(shape: Sequence[int | None] | None, batch: int) -> tuple[int, ...] | None:
    if shape is None:
        return None
    return tuple((batch if k == 0 else 1) if d is None else int(d) for k, d in enumerate(shape))


def _operand_str(o: Operand) -> str:
    dtype = o.dtype or ""
    return f"{o.name}:{o.shape_str()}{dtype}" if o.shape is not None else f"{o.name}:?{dtype}"


def _weight_shape(op: Operator, name: str, input_index: int | None, batch: int) -> tuple[int, ...] | None:
    ref = op.attrs.get(name)
    if ref is not None:
        return tuple(ref.shape)
    if input_index is not None and input_index < len(op.inputs):
        return _dims(op.inputs[input_index].shape, batch)
    return None


def estimate_macs(op: Operator, batch: int = 1) -> int | None:
    """Multiply-accumulates of one operator at ``batch``; 0 for an operator type that is not
    counted, None for a counted type whose shapes are not known."""
    t = op.type
    out = _dims(op.outputs[0].shape, batch) if op.outputs else None
    inp = _dims(op.inputs[0].shape, batch) if op.inputs else None
    try:
        if t in _CONV:
            w = _weight_shape(op, "weight", 1, batch)
            if out is None or w is None:
                return None
            return math.prod(out) * math.prod(w[1:])
        if t in _DECONV:
            w = _weight_shape(op, "weight", 1, batch)
            if inp is None or w is None:
                return None
            return math.prod(inp) * math.prod(w[1:])
        if t in _LINEAR:
            w = _weight_shape(op, "weight", 1, batch)
            k = w[-1] if w else (inp[-1] if inp else None)
            if out is None or k is None:
                return None
            return math.prod(out) * k
        if t in _MATMUL or t in _ADDMM:
            a_idx = 1 if t in _ADDMM else 0
            a = _dims(op.inputs[a_idx].shape, batch) if len(op.inputs) > a_idx else None
            if out is None or not a:
                return None
            return math.prod(out) * a[-1]
        if t == "nn.MultiheadAttention":
            return _mha_macs(op, batch)
        if t == "F.scaled_dot_product_attention":
            if len(op.inputs) < 3:
                return None
            q, k, v = (_dims(op.inputs[i].shape, batch) for i in range(3))
            if q is None or k is None or v is None or len(q) < 2:
                return None
            lead = math.prod(q[:-2])
            return lead * q[-2] * k[-2] * (q[-1] + v[-1])
    except (TypeError, ValueError, IndexError):
        return None
    return 0


def _mha_macs(op: Operator, batch: int) -> int | None:
    e = op.params.get("embed_dim")
    q = _dims(op.inputs[0].shape, batch) if op.inputs else None
    if q is None or len(q) != 3:
        return None
    kv = _dims(op.inputs[1].shape, batch) if len(op.inputs) > 1 else q
    if kv is None or len(kv) != 3:
        return None
    if not isinstance(e, int):
        e = q[-1]
    batch_first = bool(op.params.get("batch_first", False))
    n, lq = (q[0], q[1]) if batch_first else (q[1], q[0])
    s = kv[1] if batch_first else kv[0]
    kdim = op.params.get("kdim") if isinstance(op.params.get("kdim"), int) else e
    vdim = op.params.get("vdim") if isinstance(op.params.get("vdim"), int) else e
    proj = lq * e * e + s * e * kdim + s * e * vdim + lq * e * e  # q, k, v, out projections
    attn = 2 * lq * s * e  # scores and weighted sum
    return n * (proj + attn)


# -- the summary ------------------------------------------------------------------------------------
def summarize(model: Model, batch: int = 1, registry: Any = None) -> ModelSummary:
    """The operator table and totals of a parsed model. ``registry`` (default: the global layer
    registry) decides which operator types are supported."""
    if registry is None:
        from kuiper_xp.layers import registry as registry  # registers every built-in layer
    rows: list[OpInfo] = []
    summary = ModelSummary(model.path, rows, [], [], batch)
    for i, op in enumerate(model.operators):
        params = sum(math.prod(w.shape) for w in op.attrs.values())
        wbytes = sum(math.prod(w.shape) * DTYPES.get(w.dtype, ("", 4))[1] for w in op.attrs.values())
        macs = estimate_macs(op, batch)
        supported = op.type in registry or op.type in RUNTIME_TYPES
        info = OpInfo(i, op.type, op.name, [_operand_str(o) for o in op.inputs],
                      [_operand_str(o) for o in op.outputs], params, wbytes, macs, supported, op.where)
        rows.append(info)
        summary.params += params
        summary.weight_bytes += wbytes
        if macs is None:
            summary.macs_unknown += 1
        else:
            summary.macs += macs
        if not supported:
            summary.unsupported.append(info)
        if op.type == "pnnx.Input":
            summary.inputs.extend(_operand_str(o) for o in op.outputs)
        elif op.type == "pnnx.Output":
            for o in op.inputs:
                prod = o.producer
                if prod is not None and prod.type == "prim::TupleConstruct":
                    summary.outputs.extend(_operand_str(x) for x in prod.inputs)
                else:
                    summary.outputs.append(_operand_str(o))
    return summary


# -- text -------------------------------------------------------------------------------------------
def human_count(n: float) -> str:
    """1234567 -> '1.23 M'."""
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)}"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def _cell(items: list[str], limit: int = 3, width: int = 44) -> str:
    if not items:
        return "-"
    shown = items[:limit]
    text = " ".join(shown) + (f" +{len(items) - limit}" if len(items) > limit else "")
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(summary: ModelSummary) -> str:
    """The operator table: index, type, name, inputs and outputs (operand:shape dtype),
    parameter count, estimated FLOPs, and ``!`` on every unsupported operator."""
    header = ["#", "type", "name", "inputs", "outputs", "params", "FLOPs", ""]
    rows = [header]
    for o in summary.ops:
        flops = "?" if o.macs is None else ("-" if o.macs == 0 else human_count(2 * o.macs))
        rows.append([str(o.index), o.type, o.name if len(o.name) <= 32 else o.name[:29] + "...",
                     _cell(o.inputs), _cell(o.outputs), f"{o.params:,}" if o.params else "-", flops,
                     "" if o.supported else "! unsupported"])
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    right = {0, 5, 6}
    lines = []
    for r in rows:
        cells = [r[c].rjust(widths[c]) if c in right else r[c].ljust(widths[c]) for c in range(len(header))]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths[:-1]))
    return "\n".join(lines)


def format_totals(summary: ModelSummary, peak: str | None = None) -> str:
    """Totals: operators, parameters, weight bytes, estimated FLOPs, planned peak activation
    memory (``peak``, already formatted), and the unsupported operators."""
    n_ops = len(summary.ops)
    n_compute = sum(1 for o in summary.ops if o.type not in ("pnnx.Input", "pnnx.Output"))
    b = summary.batch
    flops = f"{human_count(summary.flops)} at batch {b} ({summary.flops:,})"
    note = "estimate: conv/linear/matmul/attention multiply-adds x 2; other operators not counted"
    if summary.macs_unknown:
        note += f"; {summary.macs_unknown} operator(s) without shapes not counted"
    lines = [
        f"inputs:       {', '.join(summary.inputs) or '-'}",
        f"outputs:      {', '.join(summary.outputs) or '-'}",
        f"operators:    {n_ops} ({n_compute} compute), {len(summary.types)} types",
        f"parameters:   {summary.params:,} ({human_bytes(summary.weight_bytes)} of weights, "
        f"{summary.weight_bytes:,} bytes)",
        f"FLOPs:        {flops}  [{note}]",
    ]
    if peak is not None:
        lines.append(f"peak memory:  {peak}")
    if summary.unsupported:
        types = sorted({o.type for o in summary.unsupported})
        lines.append(f"unsupported:  {len(summary.unsupported)} operator(s) of {len(types)} type(s) "
                     f"({', '.join(types)}); the model cannot run until they have layers:")
        lines.extend(f"  ! {o.where}" for o in summary.unsupported)
    else:
        lines.append("unsupported:  none (every operator type has a registered layer)")
    return "\n".join(lines)


# -- Graphviz -----------------------------------------------------------------------------------------
def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(model: Model, unsupported: set[str] | frozenset[str] = frozenset(), title: str = "") -> str:
    """The graph in Graphviz dot: one box per operator (inputs and outputs as ellipses,
    unsupported types in red), one edge per operand labelled with its name and shape."""
    ids = {id(op): f"op{i}" for i, op in enumerate(model.operators)}
    lines = [f"digraph {_q(title or 'model')} {{",
             "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8];']
    for op in model.operators:
        attrs = [f"label={_q(op.type + chr(10) + op.name)}"]
        if op.type in ("pnnx.Input", "pnnx.Output"):
            attrs.append('shape=ellipse, fillcolor="#e8f5e9"')
        if op.type in unsupported:
            attrs.append('fillcolor="#f8c9c4", color="#c0392b", penwidth=2')
            attrs.append(f"tooltip={_q('unsupported: ' + op.type)}")
        lines.append(f"  {ids[id(op)]} [{', '.join(attrs)}];")
    for op in model.operators:
        for o in op.outputs:
            label = o.name + ("" if o.shape is None else "\n" + o.shape_str() + (o.dtype or ""))
            for c in o.consumers:
                if id(c) in ids:
                    lines.append(f"  {ids[id(op)]} -> {ids[id(c)]} [label={_q(label)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
