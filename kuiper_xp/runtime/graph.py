"""The runtime graph (seeds 002 and 003).

A :class:`Graph` goes through three explicit stages::

    NeedInit  --init()-->  NeedBuild  --build()-->  Complete

``init()`` reads the ``.pnnx.param`` (and opens the ``.bin``) into runtime operators; ``build()``
creates a layer for every operator but ``pnnx.Input`` / ``pnnx.Output``, links each operator to
its successors, orders them topologically (seed 002's DFS reverse post-order, iterative), checks
the operand shapes it can, and plans memory: every intermediate array is released right after its
last use (the Array API has no ``out=``, so instead of pre-allocating outputs as KuiperInfer does
we bound the live set). ``forward()`` runs the order and returns the graph outputs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from kuiper_xp.backends import Backend, get_backend
from kuiper_xp.errors import (
    GraphError,
    InputError,
    KuiperXPError,
    LayerParameterError,
    ShapeError,
    UnsupportedOperatorError,
)
from kuiper_xp.layers import BuildContext, Layer, registry
from kuiper_xp.layers.checks import deferring, raise_failed
from kuiper_xp.pnnx import load_model
from kuiper_xp.pnnx.ir import DTYPES, Model, Operand, Operator

from .topo import topological_order

__all__ = ["Graph", "GraphState", "TensorSpec", "RuntimeOperator", "LayerRuntimeError", "load"]

_NUMPY_NAMES: dict[Any, str] = {}  # numpy dtype -> its name
#: dtype names a numpy cast hint can spell as ``numpy.<name>``
_NUMPY_CASTS = frozenset({"float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"})

_PORTS = ("pnnx.Input", "pnnx.Output")
_TUPLE = "prim::TupleConstruct"
#: the dtype of a graph output that is a Python number, by its type: torch's for such a tensor
_NUMBER_DTYPES = {bool: "bool", int: "int64", float: "float32", complex: "complex64"}


class LayerRuntimeError(KuiperXPError, RuntimeError):
    """A layer failed while running; the message names the operator."""


class GraphState(IntEnum):
    """Build stages of seed 003."""

    NeedInit = -2
    NeedBuild = -1
    Complete = 0

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: operand name, shape (None = dynamic) and dtype name."""

    name: str
    shape: tuple[int | None, ...] | None
    dtype: str | None

    def __str__(self) -> str:
        shape = "?" if self.shape is None else "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"
        return f"{self.name}: {shape} {self.dtype or '?'}"


class RuntimeOperator:
    """An operator in the runtime graph: the IR operator, its layer and its successors."""

    __slots__ = ("op", "layer", "successors", "in_ids", "out_ids", "release", "piece_of", "joins")

    def __init__(self, op: Operator):
        self.op = op
        self.layer: Layer | None = None
        self.successors: list[RuntimeOperator] = []
        self.in_ids: tuple[int, ...] = ()
        self.out_ids: tuple[int, ...] = ()
        self.release: tuple[int, ...] = ()  # operand slots freed after this op runs
        self.piece_of: tuple[int, int] | None = None  # (concat step, input position) it feeds
        self.joins = False  # a concatenation whose pieces may be computed in place

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def type(self) -> str:
        return self.op.type

    def __repr__(self) -> str:
        return f"<RuntimeOperator {self.op.type} {self.op.name!r}>"


_DTYPE_NAMES: dict[tuple, str] = {}


def _dtype_name(dt: Any) -> str:
    """``"float32"`` for numpy's, cupy's or array_api_strict's float32 (memoised: the output
    check runs it once per step, and numpy's ``str(dtype)`` costs microseconds)."""
    # (keyed with the dtype's type: array_api_strict's dtypes hash like numpy's, and comparing the
    # two warns)
    key = (type(dt), dt)
    try:
        return _DTYPE_NAMES[key]
    except KeyError:
        name = _DTYPE_NAMES[key] = str(dt).rsplit(".", 1)[-1]
        return name
    except TypeError:  # an unhashable dtype object
        return str(dt).rsplit(".", 1)[-1]


class Graph:
    """A pnnx model bound to one backend and device.

    >>> g = Graph("m.pnnx.param", backend="numpy")
    >>> g.state
    <GraphState.NeedInit: -2>
    >>> g.build()          # runs init() first when needed
    >>> (y,) = g(x)
    """

    def __init__(
        self,
        param_path: str | os.PathLike,
        bin_path: str | os.PathLike | None = None,
        backend: str | Backend | None = None,
        device: Any = None,
        fuse: bool = True,
    ):
        self.param_path = Path(param_path)
        self.fuse = fuse
        self.fused: list[tuple[str, str]] = []  # (producer name, activation name) pairs
        #: explicit attention chains run as one step: (q @ k^T, [scale/mask expression,] softmax,
        #: @ v) operator names, the last one being the step that stays
        self.fused_attention: list[tuple[str, ...]] = []
        #: LayerNorms whose weight and bias were folded into the linear layers they feed:
        #: (LayerNorm name, names of those layers)
        self.folded_norms: list[tuple[str, tuple[str, ...]]] = []
        self.bin_path = None if bin_path is None else Path(bin_path)
        self.backend: Backend = get_backend(backend, device)
        self.xp = self.backend.xp
        self.state = GraphState.NeedInit
        self.model: Model | None = None
        self.operators: list[RuntimeOperator] = []  # file order after init, topological after build
        self.pruned: list[RuntimeOperator] = []
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self.last_profile: list[tuple[str, str, float]] = []
        self.shared_weights = 0  # set by build(): see there
        self._lock = threading.Lock()
        self._slots: dict[str, int] = {}
        self._input_ids: list[int] = []
        self._input_seen: list[tuple | None] = []
        self._output_ids: list[int] = []
        self._input_operands: list[Operand] = []
        self._steps: list[RuntimeOperator] = []
        self._check_shapes: list[list[list[Any]]] = []  # per step: [operand, output index, passed, rank only]
        #: operand slots whose shape depends on the data (an output of a layer with
        #: ``data_dependent_shape``, or computed from one): their ``#`` shapes are only traced
        #: examples, so only rank and dtype are checked and nothing is planned from them
        self._data_dependent: set[int] = set()
        self._dynamic = False
        #: graph input shapes/dtypes -> {concat step: (axis, dtype, piece shapes)} seen there
        self._pieces: dict[tuple, dict[int, tuple]] = {}
        self._joins = False
        #: reusable output buffers (numpy backend): values the plan drops are handed back
        self._pool = self.backend.buffer_pool()
        #: record-and-replay of whole forward passes (cupy: CUDA graphs), None where the backend
        #: has none or it is switched off (``cuda_graphs = False``, ``KUIPER_XP_CUDA_GRAPHS=0``)
        self._replayer = self.backend.graph_replayer()
        self.cuda_graphs = self._replayer is not None
        #: input signature -> the messages of the range checks a replayed pass defers (its
        #: status value is the replay's last output; see kuiper_xp.layers.checks)
        self._deferred_messages: dict[tuple, list[str]] = {}

    # -- stages ---------------------------------------------------------------------------------
    def init(self) -> Graph:
        """NeedInit -> NeedBuild: parse the model and create the runtime operators."""
        with self._lock:
            if self.state != GraphState.NeedInit:
                return self
            self.model = load_model(self.param_path, self.bin_path)
            self.operators = [RuntimeOperator(op) for op in self.model.operators]
            self.state = GraphState.NeedBuild
        return self

    def build(self) -> Graph:
        """NeedBuild -> Complete: layers, successor links, topological order, memory plan."""
        if self.state == GraphState.NeedInit:
            self.init()
        with self._lock:
            if self.state == GraphState.Complete:
                return self
            self._build()
            self.state = GraphState.Complete
        return self

    def _build(self) -> None:
        assert self.model is not None
        model = self.model
        by_op = {id(r.op): r for r in self.operators}
        _drop_tied_weight_operands(self.operators)

        # graph inputs and outputs
        in_ops = [r for r in self.operators if r.type == "pnnx.Input"]
        out_ops = [r for r in self.operators if r.type == "pnnx.Output"]
        if not out_ops:
            raise GraphError(f"{model.path}: the graph has no pnnx.Output operator")
        for r in in_ops:
            if len(r.op.outputs) != 1 or r.op.inputs:
                raise GraphError(f"{r.op.where}: pnnx.Input must have 0 inputs and 1 output")
        output_operands: list[Operand] = []
        for r in out_ops:
            if r.op.outputs:
                raise GraphError(f"{r.op.where}: pnnx.Output must have no outputs")
            # a model returning a tuple, nested ones flattened in order (``return lstm(x)``:
            # (output, (h_n, c_n)) gives three outputs)
            pending = list(r.op.inputs)[::-1]
            while pending:
                operand = pending.pop()
                prod = operand.producer
                if prod is not None and prod.type == _TUPLE and len(operand.consumers) == 1:
                    pending.extend(prod.inputs[::-1])
                else:
                    output_operands.append(operand)
        if not output_operands:
            raise GraphError(f"{model.path}: the graph has no outputs")

        # keep only operators that contribute to an output
        needed: set[int] = set()
        stack = [o.producer for o in output_operands if o.producer is not None]
        while stack:
            op = stack.pop()
            if id(op) in needed:
                continue
            needed.add(id(op))
            stack.extend(i.producer for i in op.inputs if i.producer is not None)
        compute = [r for r in self.operators
                   if r.type not in _PORTS and id(r.op) in needed
                   and not (r.type == _TUPLE and all(o not in output_operands for o in r.op.outputs)
                            and all(c.type == "pnnx.Output" for o in r.op.outputs for c in o.consumers))]
        compute_ids = {id(r) for r in compute}
        self.pruned = [r for r in self.operators if r.type not in _PORTS and id(r) not in compute_ids]

        # every unsupported operator at once, before anything is created
        missing = registry.unsupported(r.op for r in compute)
        if missing:
            lines = "\n".join(f"  {op.type} {op.name!r} ({op.path}:{op.line})" for op in missing)
            types = sorted({op.type for op in missing})
            raise UnsupportedOperatorError(
                f"{model.path}: {len(missing)} operator(s) of {len(types)} unsupported type(s) "
                f"({', '.join(types)}):\n{lines}\n{registry.missing_message(types)}"
            )

        # inputs of a dtype the backend lacks (float16 on array_api_strict), before any layer is
        # built (a layer making constants of that dtype would fail first, less clearly)
        for k, r in enumerate(in_ops):
            o = r.op.outputs[0]
            if o.array_dtype is not None and not hasattr(self.xp, o.array_dtype):
                raise GraphError(f"input {k} ({o.name}) is declared {o.array_dtype}, a dtype backend "
                                 f"{self.backend.name} does not have; export the model with float32 inputs")
        ctx = BuildContext(self.backend)
        for r in compute:
            r.layer = registry.create(r.op, ctx)
            for key, expected in r.op.param_typos():
                warnings.warn(f"{r.op.where}: parameter {key}={dict.get(r.op.params, key)!r} is not one "
                              f"{r.op.type} reads, and {expected!r}, which it reads, is missing, so its "
                              f"default is used: is {key!r} a misspelling of {expected!r}?", stacklevel=2)
        #: weights found equal to one read before, which share its array (pnnx writes a module
        #: called several times with a copy of its weights per call)
        self.shared_weights = ctx.shared_weights
        ctx.release()
        outputs_of: dict[int, list[Operand]] = {id(r): list(r.op.outputs) for r in compute}
        inputs_of: dict[int, list[Operand]] = {id(r): list(r.op.inputs) for r in compute}
        if self.fuse:
            compute = self._fuse_activations(compute, outputs_of, output_operands)
            compute = self._fuse_attention(compute, inputs_of, outputs_of, output_operands)
            self._fold_norm_affine(compute, output_operands)
            compute = self._fold_layer_scale(compute, outputs_of, output_operands)
            self._plan_layouts(compute, outputs_of, output_operands)

        # successors (seed 002): operators consuming any of this operator's outputs
        for r in self.operators:
            seen: set[int] = set()
            r.successors = []
            for o in r.op.outputs:
                for c in o.consumers:
                    if id(c) not in seen:
                        seen.add(id(c))
                        r.successors.append(by_op[id(c)])
        order = topological_order(self.operators, lambda r: r.successors,
                                  name=lambda r: f"{r.type} {r.name!r}")
        self.operators = order
        compute_set = {id(r) for r in compute}
        steps = [r for r in order if id(r) in compute_set]

        # operand slots, inputs/outputs
        slots: dict[str, int] = {}
        for name in model.operands:
            slots[name] = len(slots)
        self._slots = slots
        self._input_operands = [r.op.outputs[0] for r in in_ops]
        self._input_ids = [slots[o.name] for o in self._input_operands]
        self._output_ids = [slots[o.name] for o in output_operands]
        self._output_dtypes = [o.array_dtype for o in output_operands]
        self.inputs = [TensorSpec(o.name, o.shape, o.array_dtype) for o in self._input_operands]
        self._input_seen = [None] * len(self.inputs)
        dd_names = _data_dependent_operands(compute)
        self._data_dependent = {slots[n] for n in dd_names}
        self.outputs = [TensorSpec(o.name, _unknown_dims(o.shape) if o.name in dd_names else o.shape, o.array_dtype)
                        for o in output_operands]
        if dd_names:  # (a recorded device graph would replay the traced sizes)
            self._replayer, self.cuda_graphs = None, False
        self._input_alias = {r.name: i for i, r in enumerate(in_ops)}
        self._dynamic = any(o.shape is None or None in o.shape for o in self._input_operands)

        # memory plan: release each operand after its last consumer
        last_use: dict[int, int] = {}
        keep = set(self._output_ids)
        for i, r in enumerate(steps):
            r.in_ids = tuple(slots[o.name] for o in inputs_of[id(r)])
            r.out_ids = tuple(slots[o.name] for o in outputs_of[id(r)])
            for s in r.in_ids:
                last_use[s] = i
        for i, r in enumerate(steps):
            r.release = tuple(s for s in set(r.in_ids) if last_use.get(s) == i and s not in keep)
            _check_arity(r)
        produced = {s for r in steps for s in r.out_ids} | set(self._input_ids)
        for s in self._output_ids:
            if s not in produced:
                name = next(n for n, v in slots.items() if v == s)
                raise GraphError(f"{model.path}: graph output {name!r} is never produced")
        self._steps = steps
        self._plan_pieces(steps)
        self._check_shapes = [
            [[o, k, None, o.name in dd_names] for k, o in enumerate(outputs_of[id(r)])
             if o.shape is not None or o.dtype is not None]
            for r in steps
        ]

    def _plan_pieces(self, steps: list[RuntimeOperator]) -> None:
        """Concatenation without copies (backends with an output pool and
        ``fast.set_destination``): each input of a concatenation made by an earlier step (its
        only output, used once in the concatenation) is marked, so that from the second call
        with the same input shapes the runtime lays out the concatenation's output before its
        first piece is made and hands each producing layer its slice as the place for its
        output. A layer that puts its result elsewhere is copied in as before (checked per
        piece, per call)."""
        self._pieces.clear()
        fast = self.backend.fast
        self._joins = False
        if self._pool is None or getattr(fast, "set_destination", None) is None:
            return
        made_by: dict[int, int] = {}
        for i, r in enumerate(steps):
            r.piece_of, r.joins = None, False
            for s in r.out_ids:
                made_by[s] = i
        for j, r in enumerate(steps):
            if getattr(r.layer, "piece_plan", None) is None or len(r.in_ids) < 2 or len(r.out_ids) != 1:
                continue
            if any(s in self._data_dependent for s in r.in_ids):  # (plans are keyed on input shapes)
                continue
            r.joins = self._joins = True
            for k, s in enumerate(r.in_ids):
                i = made_by.get(s)
                if (i is not None and len(steps[i].out_ids) == 1 and steps[i].piece_of is None
                        and r.in_ids.count(s) == 1):
                    steps[i].piece_of = (j, k)
                    # a concatenation reshaped into this piece (YOLO heads: cat(xy, wh, conf, -1)
                    # per level, reshaped to rows, then cat of the levels) is laid out inside it
                    # too: its pieces are copied once, into their final place
                    p = made_by.get(steps[i].in_ids[0]) if len(steps[i].in_ids) == 1 else None
                    if (getattr(steps[i].layer, "is_reshape", False) and p is not None
                            and steps[p].joins and steps[p].piece_of is None):
                        steps[p].piece_of = (j, k)

    def _fuse_activations(self, compute: list[RuntimeOperator], outputs_of: dict[int, list[Operand]],
                          graph_outputs: list[Operand]) -> list[RuntimeOperator]:
        """Fold an activation into the convolution/linear that feeds it, where the producer's
        output goes nowhere else: the producer applies it in place (ReLU, clamp/ReLU6) or calls
        it (other activations), and the activation's step disappears from the schedule."""
        by_op = {id(r.op): r for r in compute}
        gone: set[int] = set()
        for r in compute:
            setter = getattr(r.layer, "set_fused_activation", None)
            if setter is None or len(r.op.outputs) != 1 or id(r) in gone:
                continue
            out = r.op.outputs[0]
            if out in graph_outputs or len(out.consumers) != 1:
                continue
            c = by_op.get(id(out.consumers[0]))
            if c is None or len(c.op.inputs) != 1 or len(c.op.outputs) != 1 or c.layer is None:
                continue
            spec_fn = getattr(c.layer, "fusion_spec", None)
            spec = spec_fn() if spec_fn is not None else None
            if spec is None:
                if type(c.layer).__module__ != "kuiper_xp.layers.activation":
                    continue
                spec = c.layer.forward
            try:
                setter(spec)
            except (TypeError, ValueError):
                continue
            keep = getattr(r.layer, "set_activation_layer", None)
            if keep is not None:  # (a producer that may run the activation's own layer instead)
                keep(c.layer.forward)
            outputs_of[id(r)] = list(c.op.outputs)
            gone.add(id(c))
            self.fused.append((r.name, c.name))
        return [r for r in compute if id(r) not in gone]

    def _fold_layer_scale(self, compute: list[RuntimeOperator], outputs_of: dict[int, list[Operand]],
                          graph_outputs: list[Operand]) -> list[RuntimeOperator]:
        """Fold a layer scale into the linear layer it multiplies: ``mul(@0,@1)`` of a constant
        (a ``pnnx.Attribute`` of one value per output feature, ConvNeXt's and CaiT's gamma) and
        the output of an ``nn.Linear`` with built weights and no fused activation, that output
        going nowhere else. ``(x @ W^T + b) * g = x @ (W^T g) + b g``: the weight's columns and
        the bias are scaled once (new arrays, the weight's layout kept) and the multiplication's
        pass over the result goes (ConvNeXt-T at batch 1: 18 passes of 0.1-0.25 ms)."""
        from kuiper_xp.layers.core import Attribute
        from kuiper_xp.layers.linear import Linear

        xp = self.xp
        by_op = {id(r.op): r for r in compute}
        gone: set[int] = set()
        for r in compute:
            lin = r.layer
            if (type(lin) is not Linear or lin.weight_t is None or set(lin.slots) != {"input"}
                    or lin.fused_activation is not None or len(r.op.outputs) != 1):
                continue
            out = r.op.outputs[0]
            if out in graph_outputs or len(out.consumers) != 1:
                continue
            c = by_op.get(id(out.consumers[0]))
            if (c is None or c.op.type != "pnnx.Expression" or len(c.op.inputs) != 2 or len(c.op.outputs) != 1
                    or str(c.op.params.get("expr", "")).replace(" ", "") not in ("mul(@0,@1)", "mul(@1,@0)")):
                continue
            other = c.op.inputs[1] if c.op.inputs[0] is out else c.op.inputs[0]
            if other is out:
                continue
            src = by_op.get(id(other.producer)) if other.producer is not None else None
            wt, n = lin.weight_t, lin.weight_t.shape[1]
            g = src.layer.value if src is not None and type(src.layer) is Attribute else None
            if (g is None or g.dtype != wt.dtype or g.dtype not in (xp.float32, xp.float64)
                    or tuple(g.shape) != (1,) * (g.ndim - 1) + (n,)
                    or len(out.shape or ()) < g.ndim  # (g's leading ones would add axes)
                    or (lin.bias is not None and lin.bias.dtype != wt.dtype)):
                continue
            g = xp.reshape(g, (n,))
            # (W^T g: a kept (out, in) weight, pack_linear's transposed view, stays that layout)
            lin.weight_t = xp.permute_dims(xp.permute_dims(wt, (1, 0)) * g[:, None], (1, 0)) \
                if _is_transposed(wt) else wt * g
            if lin.bias is not None:
                lin.bias = lin.bias * g
            outputs_of[id(r)] = list(c.op.outputs)
            gone.add(id(c))
            self.fused.append((r.name, c.name))
        return [r for r in compute if id(r) not in gone]

    def _fold_norm_affine(self, compute: list[RuntimeOperator], graph_outputs: list[Operand]) -> None:
        """Fold a LayerNorm's weight and bias into the linear layers that are the only readers of
        its output (a pre-norm transformer's attention and MLP inputs, ConvNeXt's first pointwise
        layer): with y = n * w + b and z = y @ W^T + c, z = n @ (diag(w) W^T) + (b @ W^T + c), so
        the norm stops after normalising and its two affine passes over the tokens go (the
        products are as many). Each reader gets new arrays (a weight shared with another layer
        is left as it is); only float32/float64 weights of one dtype, a norm over the last axis,
        and readers taking the output as their data input: ``nn.Linear`` with built weights,
        self-attention ``nn.MultiheadAttention`` with one packed input projection."""
        from kuiper_xp.layers.attention import MultiheadAttention
        from kuiper_xp.layers.linear import Linear
        from kuiper_xp.layers.norm import LayerNorm

        xp = self.xp
        by_op = {id(r.op): r for r in compute}
        for r in compute:
            ln = r.layer
            if type(ln) is not LayerNorm or len(ln.shape) != 1 or len(r.op.outputs) != 1:
                continue
            if ln.weight_pos is not None or ln.bias_pos is not None or (ln.weight is None and ln.bias is None):
                continue
            d = ln.shape[0]
            dt = (ln.weight if ln.weight is not None else ln.bias).dtype
            if dt not in (xp.float32, xp.float64) or any(a is not None and a.dtype != dt for a in (ln.weight, ln.bias)):
                continue
            out = r.op.outputs[0]
            if out in graph_outputs or not out.consumers:
                continue
            readers = [by_op.get(id(c)) for c in {id(c): c for c in out.consumers}.values()]  # (an op reading it twice: once)
            plan = []
            for c in readers:
                layer = None if c is None else c.layer
                if type(layer) is Linear:
                    if (layer.weight_t is None or set(layer.slots) != {"input"} or layer.weight_t.dtype != dt
                            or layer.weight_t.shape[0] != d or (layer.bias is not None and layer.bias.dtype != dt)
                            or any(o is not out for o in c.op.inputs)):
                        break
                    plan.append((c, "linear"))
                elif type(layer) is MultiheadAttention:
                    w = layer.w
                    if ("qkv_t" not in w or w["qkv_t"].dtype != dt or w["qkv_t"].shape[0] != d
                            or "bias_k" in w or any(o is not out for o in c.op.inputs)
                            or (w.get("qkv_b") is not None and w["qkv_b"].dtype != dt)):
                        break
                    plan.append((c, "mha"))
                else:
                    break
            else:
                scale = None if ln.weight is None else xp.reshape(ln.weight, (d, 1))
                for c, kind in plan:
                    layer = c.layer
                    if kind == "linear":
                        layer.weight_t, layer.bias = _folded_affine(xp, layer.weight_t, layer.bias, scale, ln.bias)
                    else:
                        w = layer.w
                        e = w["qkv_t"].shape[1] // 3
                        w["qkv_t"], w["qkv_b"] = _folded_affine(xp, w["qkv_t"], w.get("qkv_b"), scale, ln.bias)
                        qkv_t, qkv_b = w["qkv_t"], w["qkv_b"]
                        w["q_t"], w["k_t"], w["v_t"] = qkv_t[:, :e], qkv_t[:, e:2 * e], qkv_t[:, 2 * e:]
                        if qkv_b is not None:
                            w["q_b"], w["k_b"], w["v_b"] = qkv_b[:e], qkv_b[e:2 * e], qkv_b[2 * e:]
                ln.weight = ln.bias = None
                self.folded_norms.append((r.name, tuple(c.name for c, _ in plan)))

    def _fuse_attention(self, compute: list[RuntimeOperator], inputs_of: dict[int, list[Operand]],
                        outputs_of: dict[int, list[Operand]],
                        graph_outputs: list[Operand]) -> list[RuntimeOperator]:
        """Run ``torch.matmul(q, kt) -> [pnnx.Expression scaling the scores and/or adding a
        mask] -> softmax over the last axis -> torch.matmul(., v)`` (or ``torch.bmm``, or the
        einsums ``'bid,bjd->bij'`` / ``'bij,bjd->bid'`` of LDM-style code) as one step where the
        backend has a fast attention (numpy): the scores never exist whole. Each intermediate
        must go only to the next operator of the chain. The step stays at the last product
        (every operand is there by then) as a :class:`FusedAttention`, which falls back to the
        original layers, in order, when the fast path does not take the operands."""
        from kuiper_xp.layers.activation import Softmax
        from kuiper_xp.layers.attention import (
            BAddBMM,
            BatchMatMul,
            Einsum,
            FusedAttention,
            MatMul,
            einsum_attention_form,
            score_transform,
        )
        from kuiper_xp.layers.expression import Expression
        from kuiper_xp.layers.misc import MaskedFill, Where
        from kuiper_xp.layers.shape import swaps_last_two

        if getattr(self.backend.fast, "attention", None) is None:
            return compute
        by_op = {id(r.op): r for r in compute}

        def next_of(r: RuntimeOperator) -> RuntimeOperator | None:
            outs = outputs_of[id(r)]
            if len(outs) != 1 or outs[0] in graph_outputs or len(outs[0].consumers) != 1:
                return None
            return by_op.get(id(outs[0].consumers[0]))

        products = (MatMul, BatchMatMul)  # (torch.bmm over (batch * heads, L, D): BART, CLIP)

        def form(layer: Any, second: bool) -> str | None:
            """How a product reads: "kt" (``q @ kt``, ``p @ v``), "k" (an einsum of q with the
            keys themselves, ``'bid,bjd->bij'``), None where it is not such a product."""
            if type(layer) in products:
                return "kt"
            if type(layer) is BAddBMM:  # (diffusers' scores: baddbmm(empty, q, kt, beta=0, alpha=s))
                return "kt" if not second and layer.beta == 0.0 else None
            if type(layer) is Einsum:
                return einsum_attention_form(layer.equation, second)
            return None

        def first(layer: Any) -> int:
            if type(layer) is BAddBMM:
                return layer.pos["batch1"]
            return layer.pos["input"] if type(layer) is not Einsum else 0

        def other(layer: Any) -> int:
            if type(layer) is Einsum:
                return 1
            if type(layer) is BAddBMM:
                return layer.pos["batch2"]
            return layer.pos["other"] if "other" in layer.pos else layer.pos["mat2"]

        gone: set[int] = set()
        ctx = BuildContext(self.backend)
        for r1 in compute:
            keys = form(r1.layer, False)
            if keys is None or id(r1) in gone:
                continue
            mid = sm = next_of(r1)
            if mid is not None and type(mid.layer) is Expression:
                sm = next_of(mid)
            else:
                mid = None
            rep = None  # a torch.where / masked_fill replacing masked scores before the softmax
            if sm is not None and type(sm.layer) in (Where, MaskedFill):
                rep, sm = sm, next_of(sm)
            r2 = next_of(sm) if sm is not None else None
            rank = None if sm is None else sm.op.inputs[0].shape
            tp = None  # LDM's AttnBlock: bmm(v, probs.permute(0, 2, 1)), the output transposed
            if r2 is not None and rank is not None and swaps_last_two(r2.layer, len(rank)):
                tp, r2 = r2, next_of(r2)
            if (sm is None or type(sm.layer) is not Softmax or sm.layer.negate or r2 is None
                    or form(r2.layer, True) != "kt"
                    or sm.layer.dtype not in (None, sm.op.inputs[0].array_dtype)):  # (no cast)
                continue
            if sm.layer.dim != -1 and (rank is None or sm.layer.dim != len(rank) - 1):
                continue
            scores, probs = outputs_of[id(r1)][0], outputs_of[id(sm)][0]
            f1, f2 = first(r1.layer), first(r2.layer)
            ins1, ins2 = inputs_of[id(r1)], inputs_of[id(r2)]
            # the probabilities as the first factor (p @ v), or transposed as the second (v @ p^T)
            at, value = (other(r2.layer), f2) if tp is not None else (f2, other(r2.layer))
            seen = outputs_of[id(tp)][0] if tp is not None else probs
            added = type(r1.layer) is BAddBMM  # (its ignored `input`, beta 0, is given q in a fallback)
            if len(ins1) != 2 + added or len(ins2) != 2 or ins2[at] is not seen or ins2[value] is seen:
                continue
            operands = [ins1[f1], ins1[other(r1.layer)], ins2[value]]
            alpha = r1.layer.alpha if added else 1.0
            scale, steps = alpha, [(r1.layer, [1 if k == other(r1.layer) else 0 for k in range(len(ins1))])]
            if mid is not None:
                mins = inputs_of[id(mid)]
                if sum(o is scores for o in mins) != 1:
                    continue
                found = score_transform(mid.layer.program.tree, next(k for k, o in enumerate(mins) if o is scores))
                if found is None:
                    continue
                scale, mask_at = found
                scale *= alpha
                if mask_at is not None:
                    if mask_at >= len(mins):
                        continue
                    operands.append(mins[mask_at])
                sources = [None if o is scores else (3 if k == mask_at else -1) for k, o in enumerate(mins)]
                if -1 in sources:  # (an input neither the scores nor the mask)
                    continue
                steps.append((mid.layer, sources))
            has_mask = len(operands) == 4
            replace = None
            if rep is not None:
                before = outputs_of[id(mid if mid is not None else r1)][0]
                found = _replace_step(rep.layer, inputs_of[id(rep)], before)
                if found is None:
                    continue
                cond_k, fill_k, fill, when_true = found
                rins = inputs_of[id(rep)]
                sources = [None if o is before else len(operands) + (0 if k == cond_k else 1)
                           for k, o in enumerate(rins)]
                replace = (len(operands), None if fill_k is None else len(operands) + 1, fill, when_true)
                operands.append(rins[cond_k])
                if fill_k is not None:
                    operands.append(rins[fill_k])
                steps.append((rep.layer, sources))
            steps.append((sm.layer, [None]))
            if tp is not None:
                steps.append((tp.layer, [None]))
            steps.append((r2.layer, [None if k == at else 2 for k in range(2)]))
            chain = tuple(r for r in (r1, mid, rep, sm, tp, r2) if r is not None)
            names = tuple(r.name for r in chain)
            fused = FusedAttention(ctx, steps, scale, has_mask, names, replace, keys_given=keys == "k",
                                   transposed=tp is not None)
            fused.op_type, fused.op_name = r2.layer.op_type, r2.layer.op_name
            r2.layer = fused
            inputs_of[id(r2)] = operands
            gone.update(id(r) for r in chain[:-1])
            self.fused_attention.append(names)
        ctx.release()
        return [r for r in compute if id(r) not in gone]

    @staticmethod
    def _plan_layouts(compute: list[RuntimeOperator], outputs_of: dict[int, list[Operand]],
                      graph_outputs: list[Operand]) -> None:
        """A convolution whose result goes only to a layer that reads channels-last input
        without a copy (a depthwise convolution on a small map, numpy backend) hands it over
        channels-last: MobileNet's expand 1x1 before its depthwise 3x3."""
        by_op = {id(r.op): r for r in compute}
        for r in compute:
            if not hasattr(r.layer, "channels_last_out"):
                continue
            outs = outputs_of[id(r)]
            if len(outs) != 1 or outs[0] in graph_outputs or len(outs[0].consumers) != 1:
                continue
            c = by_op.get(id(outs[0].consumers[0]))
            reads = getattr(c.layer, "reads_channels_last", None) if c is not None else None
            if reads is not None and reads():
                r.layer.channels_last_out = True

    # -- inspection -----------------------------------------------------------------------------
    @property
    def layers(self) -> list[Layer]:
        return [r.layer for r in self._steps if r.layer is not None]

    @property
    def execution_order(self) -> list[RuntimeOperator]:
        """The operators that run, in order (after build)."""
        self._require_built()
        return list(self._steps)

    def planned_peak_bytes(self, batch: int | None = None) -> int:
        """Peak bytes of live activations under the memory plan, from the ``#`` shape annotations
        (a dynamic leading dimension counts as ``batch``, other dynamic dimensions as 1)."""
        self._require_built()
        assert self.model is not None
        if batch is None:
            batch = 1
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        size: dict[int, int] = {}
        for name, o in self.model.operands.items():
            if o.shape is None:
                continue
            shape = _unknown_dims(o.shape) if self._slots[name] in self._data_dependent else o.shape
            dims = [(batch if k == 0 else 1) if d is None else d for k, d in enumerate(shape)]
            item = DTYPES[o.dtype][1] if o.dtype in DTYPES else 4
            size[self._slots[name]] = math.prod(dims) * item
        live = {s: size.get(s, 0) for s in self._input_ids}
        peak = sum(live.values())
        for r in self._steps:
            for s in r.out_ids:
                live[s] = size.get(s, 0)
            peak = max(peak, sum(live.values()))
            for s in r.release:
                live.pop(s, None)
        return peak

    def _require_built(self) -> None:
        if self.state != GraphState.Complete:
            raise GraphError(f"the graph is in state {self.state.name}; call build() first")

    # -- execution --------------------------------------------------------------------------------
    def _convert_input(self, k: int, x: Any) -> Any:
        """Check input ``k`` (count is checked by the caller) against the model's declaration,
        then bring it to the graph's backend and device. Shape and dtype are checked *before*
        any conversion, so a wrong input never reaches the array library."""
        seen = self._input_seen[k]
        if seen is not None and type(x) is seen[0] and x.shape == seen[1] and x.dtype == seen[2]:
            return x  # (the type, shape and dtype of the last call's input, which passed as it was)
        spec = self.inputs[k]
        be = self.backend
        if type(x).__name__ == "Tensor" and hasattr(x, "backend") and hasattr(x, "data"):
            # (in this order: ``ndarray.data`` of an ml_dtypes array raises ValueError)
            x = x.data
        lib = type(x).__module__.split(".")[0]
        is_numpy = lib == "numpy" and hasattr(x, "dtype") and hasattr(x, "shape")
        if is_numpy:
            pass
        elif be.owns(x):
            if not be.same_device(getattr(x, "device", None)):
                raise InputError(f"input {k} ({spec.name}) is on device {x.device}, but the graph runs on "
                                 f"{be.device_str()}; move it there or pass a numpy array")
        else:
            hint = " (convert it with numpy.asarray)" if isinstance(x, (list, tuple, int, float)) else ""
            if lib == "torch":
                hint = " (convert it with tensor.numpy(), or .cpu().numpy() for a CUDA tensor)"
            raise InputError(
                f"input {k} ({spec.name}) is a {type(x).__module__}.{type(x).__name__}; pass a numpy array "
                f"or an array of the graph's backend ({be.name}){hint}")
        shape = tuple(x.shape)
        if spec.shape is not None:
            exp = spec.shape
            if len(shape) != len(exp) or any(e is not None and e != s for e, s in zip(exp, shape)):
                hint = ""
                if (not self._dynamic and len(shape) == len(exp) and shape[1:] == tuple(exp[1:])):
                    hint = (" (the model was exported with a static batch; export it with pnnx's "
                            "inputs2= to make the batch dynamic)")
                elif len(shape) == len(exp):
                    fixed = [d for d, (e, s) in enumerate(zip(exp, shape)) if e is not None and e != s]
                    many = len(fixed) > 1
                    hint = (f" (dimension{'s' if many else ''} {', '.join(map(str, fixed))} "
                            f"{'are' if many else 'is'} fixed in the export: check the input; if "
                            f"{'they are' if many else 'it is'} meant to vary, export with pnnx's "
                            "inputs2= giving another size there)")
                raise InputError(f"input {k} ({spec.name}) has shape {shape}, the model expects {spec}{hint}")
        if is_numpy:  # ('>f4' is float32; dtype.name is a slow property: a cache by dtype)
            dname = _NUMPY_NAMES.get(x.dtype)
            if dname is None:
                dname = _NUMPY_NAMES[x.dtype] = str(x.dtype.name)
        else:
            dname = _dtype_name(x.dtype)
        if spec.dtype is not None and dname != spec.dtype:
            cast = f" (cast it: x.astype(numpy.{spec.dtype}))" if is_numpy and spec.dtype in _NUMPY_CASTS else ""
            raise InputError(f"input {k} ({spec.name}) has dtype {dname}, the model expects {spec.dtype}{cast}")
        if not is_numpy:
            return x
        if not x.dtype.isnative:  # byte-swapped data (e.g. read from a big-endian file)
            x = x.astype(x.dtype.newbyteorder("="))
        if be.library == "numpy" and type(x).__name__ == "ndarray":
            self._input_seen[k] = (type(x), shape, x.dtype)
            return x
        try:  # numpy scalars and subclasses, or a host array for another backend
            return be.asarray(x)
        except Exception as exc:
            raise InputError(f"input {k} ({spec.name}): cannot move a {_dtype_name(x.dtype)} numpy array "
                             f"to backend {be.name}: {type(exc).__name__}: {exc}") from exc

    def index_input_limits(self) -> dict[str, int]:
        """For integer inputs used as indices (token ids into an ``nn.Embedding``, ``F.embedding``
        or ``embedding_bag`` table, classes for ``one_hot``), directly or through reshapes and
        slices: the rows of the smallest table they index, which random test inputs must stay
        under (``kuiper-xp bench`` draws them so). Inputs with no such use are left out."""
        limits: dict[str, int] = {}
        for o in self._input_operands:
            if o.array_dtype is None or not o.array_dtype.startswith(("int", "uint")):
                continue
            best = None
            stack, seen = [(o, 0)], set()
            while stack:
                operand, depth = stack.pop()
                for c in operand.consumers:
                    if id(c) in seen:
                        continue
                    seen.add(id(c))
                    n = _index_limit(c, operand)
                    if n is not None:
                        best = n if best is None else min(best, n)
                    elif depth < 4 and (c.type.startswith("Tensor.") or c.type in _VALUE_KEEPING):
                        stack.extend((out, depth + 1) for out in c.outputs)
            if best is not None and best > 0:
                limits[o.name] = best
        return limits

    def forward(self, *inputs: Any, profile: bool = False, **named: Any) -> tuple[Any, ...]:
        """Run the graph. Inputs by position (in ``self.inputs`` order) or by name; each a numpy
        array or an array of the graph's backend on its device. Returns a tuple of backend arrays
        in ``pnnx.Output`` order. ``profile=True`` records per-layer times in ``last_profile``."""
        if self.state != GraphState.Complete:
            self.build()
        n = len(self._input_ids)
        if named:
            if inputs:
                raise InputError("give the inputs either by position or by name, not both")
            index = {s.name: i for i, s in enumerate(self.inputs)} | self._input_alias
            unknown = sorted(set(named) - set(index))
            if unknown:
                raise InputError(f"unknown input name(s) {unknown}; the graph's inputs are "
                                 f"{[s.name for s in self.inputs]}")
            ordered: list[Any] = [None] * n
            given: dict[int, str] = {}
            for key, v in named.items():
                k = index[key]
                if k in given:  # (a name and its pnnx_input_k alias)
                    raise InputError(f"input {self.inputs[k].name!r} given twice, as {given[k]!r} and {key!r}")
                given[k] = key
                ordered[k] = v
            if any(v is None for v in ordered):
                miss = [self.inputs[i].name for i, v in enumerate(ordered) if v is None]
                raise InputError(f"missing input(s) {miss}")
            inputs = tuple(ordered)
        if len(inputs) != n:
            raise InputError(f"the graph takes {n} input(s) ({', '.join(str(s) for s in self.inputs)}); "
                             f"got {len(inputs)}")
        env: list[Any] = [None] * len(self._slots)
        for k, (s, x) in enumerate(zip(self._input_ids, inputs)):
            env[s] = self._convert_input(k, x)
        if self.cuda_graphs and self._replayer is not None and not profile:
            xs = [env[s] for s in self._input_ids]
            outs = self._replayer(xs, self._run_on)
            if outs is not None:
                messages = self._deferred_messages.get(_signature(xs))
                if messages:
                    outs, code = outs[:-1], outs[-1]
                    raise_failed(code, messages)
                return self._as_arrays(outs)
        pool = self._pool
        with self.backend.compute_scope(pool), self._checks() as pending:
            if pool is not None:
                pool.reclaim()  # buffers of earlier results the caller has dropped
            self._execute(env, profile)
        if pending is not None:
            raise_failed(pending.code, pending.messages)
        outs = self._as_arrays(tuple(env[s] for s in self._output_ids))
        if pool is not None:
            pool.lend(outs)
        return outs

    def _as_arrays(self, outs: tuple) -> tuple:
        """The outputs as arrays: the items of a list-valued output (``return [a, b]``, which
        pnnx writes as one list expression) in its place, and a Python number (an output computed
        from shapes alone, ``torch.tensor(x.shape[0], dtype=torch.float32) / 2``) as a 0-d array
        of the dtype the file declares for it, else torch's for that kind of number (float32,
        int64, bool, complex64)."""
        for o in outs:  # (a loop, not any() over a generator: ~1 us of a small model's call)
            if type(o) in _NUMBER_DTYPES or isinstance(o, (list, tuple)):
                break
        else:
            return outs
        xp, dev = self.xp, self.backend.device
        flat = []
        for o, dt in zip(outs, self._output_dtypes):
            for v in (o if isinstance(o, (list, tuple)) else (o,)):
                if type(v) in _NUMBER_DTYPES:  # (exact types: a numpy scalar is left as it is)
                    want = dt if dt is not None and v is o and hasattr(xp, dt) else _NUMBER_DTYPES[type(v)]
                    v = xp.asarray(v, dtype=getattr(xp, want), device=dev)
                flat.append(v)
        return tuple(flat)

    def _run_on(self, xs: list) -> tuple[Any, ...]:
        """One eager pass on converted input arrays ``xs`` (the replayer's recording run)."""
        env: list[Any] = [None] * len(self._slots)
        for s, x in zip(self._input_ids, xs):
            env[s] = x
        with self.backend.compute_scope(self._pool), self._checks() as pending:
            self._execute(env, False)
        outs = tuple(env[s] for s in self._output_ids)
        messages = [] if pending is None or pending.code is None else pending.messages
        if len(self._deferred_messages) >= 256:  # (many input shapes: the replayer forgets them too)
            self._deferred_messages.clear()
        self._deferred_messages[_signature(xs)] = messages
        return outs + (pending.code,) if messages else outs  # type: ignore[union-attr]

    def _checks(self) -> Any:
        """Where reading device values on the host is not cheap: a pass's range checks deferred
        to its end (kuiper_xp.layers.checks); else nothing."""
        if self.backend.cheap_host_reads:
            return contextlib.nullcontext()
        return deferring(self.backend.xp, self.backend.device,
                         getattr(self.backend.fast, "range_check", None))

    def _execute(self, env: list[Any], profile: bool) -> None:
        timings: list[tuple[str, str, float]] = []
        sync = self.backend.synchronize
        give = None if self._pool is None else self._pool.give
        plans: dict[int, tuple] | None = None
        if self._joins:
            sig = tuple((tuple(env[s].shape), str(env[s].dtype)) for s in self._input_ids)
            plans = self._pieces.get(sig)
            if plans is None:
                if len(self._pieces) >= 16:
                    self._pieces.clear()
                plans = self._pieces[sig] = {}
            fast = self.backend.fast
            joined: dict[int, Any] = {}  # concat step -> its laid-out output (None: cannot)
            steps = self._steps

            def layout(j: int) -> Any:
                """Concat step j's output buffer, laid out on first use; a concatenation that is
                itself a piece of a later one (DenseNet's growing features) is laid out inside
                that one's buffer, so nothing is copied twice."""
                if j not in joined:
                    axis, dt, shapes = plans[j]  # type: ignore[index]
                    outer = steps[j].piece_of
                    within = None
                    if outer is not None and outer[0] in plans:  # type: ignore[operator]
                        big = layout(outer[0])
                        if big is not None:
                            o_axis, _, o_shapes = plans[outer[0]]  # type: ignore[index]
                            # (reshaped there when this one reaches it through a reshape)
                            within = fast.concat_piece(big, o_axis, o_shapes, outer[1])
                    joined[j] = fast.concat_buffer(axis, dt, shapes, within)
                return joined[j]
        for i, (r, checks) in enumerate(zip(self._steps, self._check_shapes)):
            args = [env[s] for s in r.in_ids]
            t0 = time.perf_counter() if profile else 0.0
            dest = into = None
            if plans is not None:
                if r.joins and i in plans:
                    into = layout(i)  # laid out already when a piece was made, or now
                    joined.pop(i, None)
                elif r.piece_of is not None and r.piece_of[0] in plans:
                    j, k = r.piece_of
                    buf = layout(j)
                    if buf is not None:
                        axis, _, shapes = plans[j]
                        dest = fast.concat_piece(buf, axis, shapes, k)
                        if dest.flags.c_contiguous:
                            fast.set_destination(dest)
                        else:  # (along an inner axis: layers make contiguous outputs, copied in)
                            dest = None
            slot = dest
            try:
                if into is not None:
                    out = r.layer.forward_into(into, plans[i][0], *args)  # type: ignore[union-attr,index]
                else:
                    out = r.layer.forward(*args)  # type: ignore[union-attr]
            except KuiperXPError as exc:
                _note(exc, r)
                raise
            except Exception as exc:
                raise LayerRuntimeError(
                    f"{r.op.where} failed on inputs {[_describe(a) for a in args]}: "
                    f"{type(exc).__name__}: {exc}") from exc
            finally:
                if dest is not None:
                    fast.set_destination(None)
                    dest = None
            if slot is not None:  # (a view of the slot in another layout: its own copy)
                out = fast.piece_result(out, slot)
                slot = None
            if plans is not None and r.joins and i not in plans:
                plan = r.layer.piece_plan(args)  # type: ignore[union-attr]
                if plan is not None:
                    plans[i] = plan
            into = None
            if profile:
                sync()
                timings.append((r.name, r.type, time.perf_counter() - t0))
            if len(r.out_ids) == 1:
                env[r.out_ids[0]] = out
            else:
                if not isinstance(out, (tuple, list)) or len(out) != len(r.out_ids):
                    raise LayerRuntimeError(f"{r.op.where} returned {type(out).__name__}, expected "
                                            f"{len(r.out_ids)} outputs")
                for s, v in zip(r.out_ids, out):
                    env[s] = v
            for c in checks:  # [operand, output index, last (shape, dtype) that passed, rank only]
                v = env[r.out_ids[c[1]]]
                if c[2] is None or c[2][0] != getattr(v, "shape", None) or c[2][1] != getattr(v, "dtype", None):
                    _check_output(r, c[0], v, c[3])
                    c[2] = (v.shape, v.dtype)
            args = out = None
            for s in r.release:
                v, env[s] = env[s], None
                if give is not None:
                    give(v)
                v = None
        if profile:
            self.last_profile = timings

    __call__ = forward

    def release_memory(self) -> int:
        """Free the idle output buffers this graph keeps between calls and the scratch arrays
        the backend's fast paths keep (numpy backend; those are shared by every graph, and the
        next call makes them again); returns the bytes released."""
        n = 0
        if self._pool is not None:
            n = self._pool.idle_bytes
            self._pool.clear()
        drop = getattr(self.backend.fast, "release_workspaces", None)
        return n + (drop() if drop is not None else 0)

    def run(self, feeds: dict[str, Any] | None = None, **named: Any) -> dict[str, Any]:
        """Like :meth:`forward` with named inputs; returns ``{output name: array}``. Where names
        would collide (an output returned twice, the items of a returned list), every key carries
        the output's position: ``name#k``."""
        if feeds is not None and not isinstance(feeds, dict):
            raise InputError(f"run() takes {{input name: array}} (the names: {[s.name for s in self.inputs]}), "
                             f"not a {type(feeds).__name__}; for inputs by position call the graph: g(x)")
        outs = self.forward(**(feeds or {}), **named)
        names = [spec.name for spec in self.outputs]
        if len(names) != len(outs) or len(set(names)) != len(names):
            names = [f"{n}#{k}" for k, n in enumerate(names)] if len(names) == len(outs) else \
                [f"{names[0] if len(names) == 1 else 'output'}#{k}" for k in range(len(outs))]
        return dict(zip(names, outs))

    def __repr__(self) -> str:
        return (f"<Graph {self.param_path.name} state={self.state.name} backend={self.backend.name} "
                f"device={self.backend.device_str()} ops={len(self.operators)}>")


def _folded_affine(xp: Any, wt: Any, bias: Any, scale: Any, shift: Any) -> tuple[Any, Any]:
    """A linear layer's ``(W^T, bias)`` (bias maybe None) with ``y * scale + shift`` folded into
    its input: ``(scale * W^T, shift @ W^T + bias)``; ``scale`` a (d, 1) column or None, ``shift``
    (d,) or None. New arrays: the layer's own may be shared with another layer."""
    w2 = wt if scale is None else wt * scale
    if shift is None:
        return w2, bias
    add = xp.matmul(shift, wt)  # (with the weight as it was)
    return w2, add if bias is None else bias + add


def _describe(a: Any) -> str:
    shape = getattr(a, "shape", None)
    return f"{tuple(shape)} {_dtype_name(a.dtype)}" if shape is not None else type(a).__name__


def _signature(xs: list) -> tuple:
    """The shapes and dtypes of a pass's inputs (as the CUDA-graph replayer keys its graphs)."""
    return tuple((tuple(x.shape), str(x.dtype)) for x in xs)


def _is_transposed(a: Any) -> bool:
    """Whether the 2-D array ``a`` is laid out column by column (a transposed view), as far as
    its namespace says (numpy and cupy arrays have ``flags``; others count as row by row)."""
    flags = getattr(a, "flags", None)
    return flags is not None and bool(flags.f_contiguous) and not bool(flags.c_contiguous)


def _note(exc: BaseException, r: RuntimeOperator) -> None:
    add = getattr(exc, "add_note", None)
    if add is not None and r.op.where not in str(exc):  # (not when the message names it already)
        add(f"while running {r.op.where}")


def _unknown_dims(shape: tuple[int | None, ...] | None) -> tuple[int | None, ...] | None:
    """``shape`` with every dimension unknown (the rank kept)."""
    return None if shape is None else (None,) * len(shape)


#: operators that move, select or reshape values without changing them (index limits pass through)
_VALUE_KEEPING = frozenset({"torch.flatten", "torch.squeeze", "torch.unsqueeze", "torch.transpose",
                            "torch.permute", "torch.reshape", "torch.cat", "torch.stack", "torch.split",
                            "torch.chunk", "torch.narrow", "torch.clone", "torch.roll", "torch.flip"})


def _replace_step(layer: Any, ins: list[Operand], scores: Operand) -> tuple | None:
    """How a ``torch.where`` / ``Tensor.masked_fill`` layer between the attention scores and the
    softmax replaces scores: ``(condition input index, fill input index or None, fill constant,
    replaced where the condition holds)``, or None when it is not such a step (the scores in
    another role or twice, a fill that is not a number)."""
    if sum(o is scores for o in ins) != 1:
        return None
    src = layer.sources

    def role(key: str) -> tuple | None:
        kind, v = src[key]
        if kind == "in":
            return ("scores",) if ins[v] is scores else ("in", v)
        return ("const", v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    from kuiper_xp.layers.misc import MaskedFill

    if isinstance(layer, MaskedFill):
        keys = {"input": role("input"), "mask": role("mask"), "value": role("value")}
        if keys["input"] != ("scores",) or keys["mask"] is None or keys["mask"][0] != "in":
            return None
        cond_k, fill = keys["mask"][1], keys["value"]
        when_true = True
    else:
        keys = {k: role(k) for k in ("condition", "input", "other")}
        if keys["condition"] is None or keys["condition"][0] != "in":
            return None
        if keys["input"] == ("scores",):
            fill, when_true = keys["other"], False
        elif keys["other"] == ("scores",):
            fill, when_true = keys["input"], True
        else:
            return None
        cond_k = keys["condition"][1]
    if fill is None or fill == ("scores",):
        return None
    if fill[0] == "in":
        return cond_k, fill[1], 0.0, when_true
    return cond_k, None, float(fill[1]), when_true


def _index_limit(op: Operator, operand: Operand) -> int | None:
    """The number of rows ``operand`` indexes as ``op``'s index input, or None."""
    ins = op.inputs
    if op.type == "nn.Embedding" and ins and ins[0] is operand:
        n = op.params.get("num_embeddings")
        return n if isinstance(n, int) else None
    if op.type == "F.embedding" and len(ins) >= 2 and ins[0] is operand and ins[1].shape:
        return ins[1].shape[0]
    if op.type == "aten::embedding_bag" and len(ins) >= 2 and ins[1] is operand and ins[0].shape:
        return ins[0].shape[0]
    if op.type in ("F.one_hot", "aten::one_hot") and ins and ins[0] is operand:
        n = op.params.get("num_classes")
        src = ins[1].producer if n is None and len(ins) >= 2 else None
        if src is not None and src.type == "pnnx.Expression":  # aten::one_hot: a constant input
            e = str(src.params.get("expr", ""))
            n = int(e) if e.isdigit() else None
        return n if isinstance(n, int) and n > 0 else None
    return None


@functools.lru_cache(maxsize=None)
def _arity(forward_owner: type) -> tuple[int, float]:
    """(fewest, most) positional inputs a layer class's ``forward`` takes."""
    try:
        sig = inspect.signature(forward_owner.forward)
    except (TypeError, ValueError):
        return 0, math.inf
    params = list(sig.parameters.values())[1:]  # (self)
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        most: float = math.inf
    else:
        most = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    fewest = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)
    return fewest, most


def _check_arity(r: Any) -> None:
    """Refuse, at build, an operator given more or fewer inputs than its layer takes (a file
    with ``F.relu`` on two inputs failed at the first call inside the layer)."""
    fewest, most = _arity(type(r.layer))
    n = len(r.in_ids)
    if not fewest <= n <= most:
        takes = (f"{fewest}" if fewest == most else f"at least {fewest}" if most == math.inf
                 else f"{fewest} to {most}")
        raise LayerParameterError(f"{r.op.where}: the file gives it {n} input(s); {r.op.type} takes {takes}")


def _data_dependent_operands(compute: list[RuntimeOperator]) -> set[str]:
    """Names of the operands whose shape depends on data: the outputs of layers that set
    ``data_dependent_shape`` (nonzero, masked_select, unique) and every operand computed from
    them downstream (conservatively: whatever consumes one)."""
    pending = [o for r in compute if getattr(r.layer, "data_dependent_shape", False) for o in r.op.outputs]
    seen: set[str] = set()
    while pending:
        o = pending.pop()
        if o.name in seen:
            continue
        seen.add(o.name)
        for c in o.consumers:
            pending.extend(c.outputs)
    return seen


def _check_output(r: RuntimeOperator, operand: Operand, value: Any, rank_only: bool = False) -> None:
    """``value`` against ``operand``'s annotation: shape (only its rank where ``rank_only``: a
    data-dependent shape) and dtype."""
    shape = getattr(value, "shape", None)
    if shape is None:
        raise LayerRuntimeError(f"{r.op.where}: output {operand.name!r} is a {type(value).__name__}, not an array")
    exp = _unknown_dims(operand.shape) if rank_only else operand.shape
    if exp is not None:
        if len(shape) != len(exp) or any(e is not None and e != s for e, s in zip(exp, shape)):
            hint = ""
            if len(shape) == len(exp) and None in exp:
                hint = (" (pnnx declares a size fixed where both example inputs of the export gave it, "
                        "even one that follows the input's: export with example inputs that differ in "
                        "every size meant to vary; README, 'Fixed by coincidence')")
            raise ShapeError(f"{r.op.where}: output {operand.name!r} has shape {tuple(shape)}, "
                             f"the model declares {operand.shape_str()}{hint}")
    if operand.dtype is not None and operand.dtype in DTYPES:
        got = _dtype_name(value.dtype)
        want = DTYPES[operand.dtype][0]
        if got != want:
            hint = ""
            if r.type == "pnnx.Expression" and want.startswith("float") and not got.startswith(("float", "complex")):
                hint = (" (pnnx drops a multiplication of a boolean or integer tensor by 1.0, and some casts, "
                        "leaving the dtype it declares: write mask.float() or .to(dtype) in the model)")
            elif (r.type == "pnnx.Expression" and (want, got) == ("float64", "float32") and r.op.inputs
                  and all(o.dtype is not None and DTYPES.get(o.dtype, ("",))[0].startswith(("int", "uint", "bool"))
                          for o in r.op.inputs)):
                hint = (" (pnnx writes a 0-d constant tensor, torch.tensor(1.5, dtype=torch.float64), and a "
                        "Python float alike, as a bare literal, declaring float64 for both: torch gives float64 "
                        "for the first, and float32 for an integer tensor with a Python float (x // 0.5), as "
                        "kuiper-xp did: cast explicitly in the model, x.double() - 1.5 or x.float() // 0.5)")
            elif r.type == "pnnx.Expression":
                hint = (" (pnnx writes a 0-d constant tensor, torch.tensor(1.5, dtype=torch.float64), as a bare "
                        "literal that loses its dtype, and folds away identity arithmetic that promoted one "
                        "(x * torch.ones_like(y), x - torch.zeros(..., dtype=...)): cast explicitly with .to(dtype) "
                        "in the model)")
            raise ShapeError(f"{r.op.where}: output {operand.name!r} has dtype {got}, "
                             f"the model declares {want}{hint}")


def load(
    param_path: str | os.PathLike,
    backend: str | Backend | None = None,
    device: Any = None,
    bin_path: str | os.PathLike | None = None,
    fuse: bool = True,
) -> Graph:
    """Load a pnnx model (``.pnnx.param``; the ``.bin`` beside it unless ``bin_path``) and build
    it on ``backend``/``device`` (default: ``$KUIPER_XP_BACKEND``, else cupy with a CUDA device,
    else numpy). ``fuse=False`` keeps every activation as its own step (no folding into the
    producing convolution). Returns a built :class:`Graph`; call it with the inputs."""
    return Graph(param_path, bin_path=bin_path, backend=backend, device=device, fuse=fuse).build()


def _drop_tied_weight_operands(operators: list) -> int:
    """Tied weights (a language model's output projection sharing the embedding table, a tied
    autoencoder): pnnx writes the module using the shared parameter second with its own
    ``@weight`` *and* an extra unnamed operand in front of its real input, produced by a
    ``pnnx.Attribute`` holding the same values. Taken as the data input, that operand made the
    Linear compute ``weight @ x.T`` (silently wrong where the shapes happened to fit). Such an
    operand (an nn.* module's unnamed input from an attribute equal to one of its weights) is
    dropped; returns how many were."""
    dropped = 0
    for r in operators:
        op = r.op
        if not op.type.startswith("nn.") or not op.attrs or len(op.inputs) < 2:
            continue
        for k in range(len(op.inputs) - 1, -1, -1):
            operand = op.inputs[k]
            prod = operand.producer
            named = k < len(op.input_names) and op.input_names[k]
            data = None if prod is None or prod.type != "pnnx.Attribute" else prod.attrs.get("data")
            if named or data is None or len(op.inputs) < 2:
                continue
            same = [w for w in op.attrs.values() if w.shape == data.shape and w.dtype == data.dtype]
            if not same:
                continue
            try:
                values = data.numpy()
                if not any(_np_equal(values, w.numpy()) for w in same):
                    continue
            except Exception:  # (a weight that cannot be read: the layer's own build says so)
                continue
            del op.inputs[k]
            if k < len(op.input_names):
                del op.input_names[k]
            operand.consumers = [c for c in operand.consumers if c is not op]
            dropped += 1
    return dropped


def _np_equal(a: Any, b: Any) -> bool:
    """Bitwise equality of two host arrays of one shape and dtype (the .bin reader's arrays)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
