"""Advanced indexing and index-built tensors: ``Tensor.index`` (``x[:, idx]``, ``x[i, j]``,
``x[..., mask]``), ``aten::one_hot``, ``aten::scatter``, ``aten::embedding_bag`` (with the
``aten::numel`` its 2-D form needs).

pnnx spellings (torch 2.13 exports):

* constant indices stay a parameter: ``Tensor.index Tensor.index_1 1 1 0 1
  expr=[None,[0,2,3]]`` (``x[:, [0, 2, 3]]``), ``expr=[None,None,[True,False,True]]`` (a bool
  mask); ``None`` is a whole axis (``:``). Indexing by constant buffers is usually folded into a
  ``pnnx.Attribute`` by pnnx itself.
* indices that are graph values arrive through a list expression:
  ``pnnx.Expression pnnx_expr_1 1 1 1 2 expr=[None,@0]`` then ``Tensor.index Tensor.index_0 2 1
  0 2 3 $input=0 $expr=2``; ``x[i, j]`` is ``expr=[@0,@1]``.
* ``F.one_hot(x, 10)``: ``pnnx.Expression expr=10`` then ``aten::one_hot pnnx_4 2 1 0 1 2``.
* ``x.scatter(1, index, src)`` and ``torch.scatter(x, 0, index, 2.0)``: ``aten::scatter pnnx_3 4 1
  self dim index src``, dim (and a scalar src) fed by constant expressions.

Semantics follow torch (which follows NumPy): the integer index arrays broadcast together; a bool
mask of k dimensions stands for the k integer arrays of its True positions; when the indexed
axes are adjacent the broadcast index shape replaces them in place, otherwise it goes first.
Negative indices count from the end. Every index is checked against its axis (a clear
ShapeError naming the operator, never a wrapped or out-of-bounds read).

A bool mask that is a graph value (``a[a.sum(1) > 0]``) selects a data-dependent number of
elements: pnnx annotates one example count, so such a ``Tensor.index`` sets
``data_dependent_shape`` (the graph then checks only rank and dtype of its output and of what is
computed from it). Constant masks, and masks computed only from constants, keep full checks.
``F.one_hot(x)`` (``num_classes=-1``, or a runtime class count) is data-dependent the same way.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from kuiper_xp.errors import ExpressionError, LayerParameterError, ShapeError
from kuiper_xp.expression import parse

from .base import BuildContext, Layer
from .checks import check_range
from .expression import expression_text
from .misc import input_slots, to_int
from .registry import register

#: text of a constant index list that JSON can read once None/True/False are renamed: brackets,
#: commas, blanks, integers and the three names, nothing else
_PLAIN_LITERAL = re.compile(r"(?:[\[\],\s]|-?[0-9]+|None|True|False)*")
_JSON_NAMES = re.compile(r"None|True|False")
_JSON_NAME = {"None": "null", "True": "true", "False": "false"}


def literal_text(text: str, where: str) -> Any:
    """The constant index list ``text`` (``[None,[1615,1892,...]]``) as Python values. A plain
    list of integers, booleans and None is read by ``json.loads`` (data only, nothing evaluated:
    a gather over 22000 graph edges is one 150 kB literal, 0.15 s through the expression parser
    per layer); anything else, or malformed, goes through the expression parser and its errors."""
    if _PLAIN_LITERAL.fullmatch(text):
        try:
            return json.loads(_JSON_NAMES.sub(lambda m: _JSON_NAME[m.group(0)], text))
        except ValueError:
            pass  # (the parser says what is wrong)
    try:
        tree = parse(text)
    except ExpressionError as exc:
        raise LayerParameterError(f"{where}: bad index expression {text!r}: {exc}") from None
    return _literal(tree, where)


def _literal(node: Any, where: str) -> Any:
    """A constant index list written in the file, as Python values (lists, ints, bools, None)."""
    if node.kind == "const":
        if node.value is None or isinstance(node.value, (bool, int)):
            return node.value
    elif node.kind == "list":
        return [_literal(a, where) for a in node.args]
    elif node.kind == "call" and node.value == "neg" and len(node.args) == 1:
        v = _literal(node.args[0], where)
        if isinstance(v, int) and not isinstance(v, bool):
            return -v
    raise LayerParameterError(f"{where}: unsupported index item in expr (expected None, integers, "
                              f"booleans or lists of them)")


#: operator types whose results are not fixed by their inputs (a mask made from them is not a
#: build-time constant even when every input is)
_RANDOM = ("rand", "bernoulli", "normal", "multinomial", "poisson", "dropout", "uniform", "exponential",
           "geometric", "cauchy", "empty")


def is_constant_operand(operand: Any) -> bool:
    """True when ``operand``'s value is fixed once the graph is built: everything it is computed
    from is a constant (``pnnx.Attribute``, a constant ``pnnx.Expression``, ``torch.ones``...),
    with no graph input and no random operator upstream."""
    seen: set[int] = set()
    stack = [operand]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        prod = o.producer
        if prod is None or prod.type == "pnnx.Input" or any(w in prod.type.lower() for w in _RANDOM):
            return False
        stack.extend(prod.inputs)
    return True


def _list_items(operand: Any) -> list:
    """The operands an index list is built from (the inputs of the ``pnnx.Expression`` /
    ``prim::ListConstruct`` making it), or the operand itself."""
    prod = operand.producer
    if prod is not None and prod.type in ("pnnx.Expression", "prim::ListConstruct"):
        return list(prod.inputs)
    return [operand]


def runtime_mask(operand: Any) -> bool:
    """True when the index list ``operand`` holds a bool mask (or an item of unknown dtype) that
    is not a build-time constant: the indexed count then depends on the data."""
    return any(o.dtype in ("bool", None) and not is_constant_operand(o) for o in _list_items(operand))


def constant_int(operand: Any) -> int | None:
    """The integer a constant ``pnnx.Expression`` (``expr=-1``) gives, else None."""
    prod = operand.producer
    if prod is None or prod.type != "pnnx.Expression" or prod.inputs or "expr" not in prod.params:
        return None
    try:
        v = _literal(parse(expression_text(prod.params["expr"])), prod.where)
    except (ExpressionError, LayerParameterError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _nested_shape(v: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(v, list):
        shape.append(len(v))
        v = v[0] if v else None
    return tuple(shape)


def _flat(v: Any) -> list:
    if isinstance(v, list):
        return [y for item in v for y in _flat(item)]
    return [v]


def advanced_index(xp: Any, x: Any, items: list, where: str, bounds: list | None = None) -> Any:
    """``x[items]`` with torch's advanced-indexing rules; ``items`` are None (a whole axis) or
    integer / bool arrays of the namespace ``xp``; ``bounds[i]``, where given, is item i's known
    (min, max) (a constant index: its range is checked without reading the array)."""
    # a bool mask of k dims stands for k integer arrays (its True positions)
    idx: list[Any] = []
    if bounds is not None and any(it is not None and it.dtype == xp.bool for it in items):
        bounds = None  # (the positions shift)
    for it in items:
        if it is not None and it.dtype == xp.bool:
            if it.ndim == 0:
                raise ShapeError(f"{where}: a 0-d boolean index is not supported")
            idx.extend(xp.nonzero(it))
        else:
            idx.append(it)
    if len(idx) > x.ndim:
        raise ShapeError(f"{where}: {len(idx)} indices for an input of shape {tuple(x.shape)}")
    axes = [a for a, it in enumerate(idx) if it is not None]
    if not axes:
        return x
    arrays = []
    for a in axes:
        it = idx[a]
        if xp.isdtype(it.dtype, "real floating") or not xp.isdtype(it.dtype, "integral"):
            raise ShapeError(f"{where}: index for axis {a} must be integer or bool, found {it.dtype}")
        n = x.shape[a]
        it = xp.astype(it, xp.int64, copy=False)

        def message(bad: int | None, a: int = a, n: int = n) -> str:
            return (f"{where}: index {'' if bad is None else f'{bad} '}is out of range for axis {a} of "
                    f"size {n} (input shape {tuple(x.shape)})")

        known = None if bounds is None else bounds[a]
        if known is not None and it.size:
            least = known[0]
            if known[0] < -n or known[1] >= n:
                raise ShapeError(message(known[0] if known[0] < -n else known[1]))
        else:
            it, least = check_range(xp, it, -n, n, message)
        if least is None or least < 0:
            it = xp.where(it < 0, it + n, it)
        arrays.append(it)
    if len(arrays) == 1:  # one index array: its dims take the indexed axis's place, as torch
        a, it = axes[0], arrays[0]
        out = xp.take(x, xp.reshape(it, (-1,)) if it.ndim != 1 else it, axis=a)
        if it.ndim != 1:
            out = xp.reshape(out, tuple(x.shape[:a]) + tuple(it.shape) + tuple(x.shape[a + 1:]))
        return out
    try:
        arrays = list(xp.broadcast_arrays(*arrays)) if len(arrays) > 1 else arrays
    except ValueError:
        raise ShapeError(f"{where}: index shapes {[tuple(a.shape) for a in arrays]} do not broadcast "
                         f"together") from None
    bshape = tuple(arrays[0].shape)
    rest = [a for a in range(x.ndim) if a not in axes]
    # the indexed axes first, merged into one; a flat (row-major) index into them
    xt = xp.permute_dims(x, tuple(axes) + tuple(rest)) if axes != list(range(len(axes))) else x
    sizes = [x.shape[a] for a in axes]
    merged = xp.reshape(xt, (math.prod(sizes),) + tuple(x.shape[a] for a in rest))
    flat = arrays[-1]
    stride = sizes[-1]
    for arr, size in zip(arrays[-2::-1], sizes[-2::-1]):
        flat = flat + arr * stride
        stride *= size
    out = xp.take(merged, xp.reshape(flat, (-1,)), axis=0)
    out = xp.reshape(out, bshape + tuple(x.shape[a] for a in rest))
    contiguous = axes == list(range(axes[0], axes[-1] + 1))
    if contiguous and axes[0] > 0:
        # torch keeps adjacent indexed axes in place: move the index dims after the leading axes
        nb, lead = len(bshape), axes[0]
        order = tuple(range(nb, nb + lead)) + tuple(range(nb)) + tuple(range(nb + lead, out.ndim))
        out = xp.permute_dims(out, order)
    return out


@register("Tensor.index")
class Index(Layer):
    """``x[items]``: items from the ``expr`` parameter (constants) or the ``$expr`` input (a list
    built by a ``pnnx.Expression``, holding None and index arrays); data-dependent when a mask
    among them is a graph value."""

    data_dependent_shape = False

    def __init__(self, ctx: BuildContext, const: list | None, pos: dict[str, int], where: str):
        super().__init__(ctx)
        self.pos, self.where = pos, where
        self.const = self.bounds = None
        if const is not None:
            self.const = [None if v is None else self._const_array(ctx, v) for v in const]
            # (min, max) of each constant integer index: its range is checked without a host read
            self.bounds = [None if v is None or not f or isinstance(f[0], bool) else (min(f), max(f))
                           for v in const for f in [_flat(v) if isinstance(v, list) else [v]]]

    def _const_array(self, ctx: BuildContext, v: Any) -> Any:
        vals = _flat(v) if isinstance(v, list) else [v]
        shape = _nested_shape(v)
        if any(isinstance(a, list) for a in vals) or len(vals) != math.prod(shape):
            raise LayerParameterError(f"{self.where}: ragged index list {v!r}")
        if all(isinstance(a, bool) for a in vals):
            dtype = "bool"
        elif any(isinstance(a, bool) for a in vals) or not all(isinstance(a, int) for a in vals):
            raise LayerParameterError(f"{self.where}: index list {v!r} mixes booleans and integers")
        else:
            dtype = "int64"
        return self.xp.reshape(ctx.asarray(vals, dtype=dtype), shape)

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("input", "expr"))
        if "input" not in pos:
            raise LayerParameterError(f"{op.where}: needs an input")
        const = None
        if "expr" not in pos:
            if "expr" not in op.params:
                raise LayerParameterError(f"{op.where}: needs the indices (an expr parameter or input)")
            const = literal_text(expression_text(op.params["expr"]), op.where)
            if not isinstance(const, list):
                const = [const]
            _check_flattened_index(op, pos, const)
        layer = cls(ctx, const, pos, op.where)
        if const is None and runtime_mask(op.inputs[pos["expr"]]):
            layer.data_dependent_shape = True  # (the count of True in the mask)
        return layer

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x = inputs[self.pos["input"]]
        if self.const is not None:
            return advanced_index(xp, x, list(self.const), self.where, self.bounds)
        items = inputs[self.pos["expr"]]
        if not isinstance(items, (list, tuple)):
            items = [items]
        items = [None if it is None else (it if hasattr(it, "dtype") else xp.asarray(it)) for it in items]
        return advanced_index(xp, x, items, self.where)


def _check_flattened_index(op, pos: dict[str, int], const: list) -> None:
    """LayerParameterError where pnnx wrote a multi-dimensional constant index as a flat list:
    ``x[:, :, idx]`` with ``idx`` of shape (24, 8) comes out as ``expr=[None,None,[...24
    values...]]`` beside the declared output of the 2-D index's rank, so the index's shape (and
    most of its values) are not in the file; with several index lists alike (Informer's
    ``K[:, :, arange(L).unsqueeze(1), index_sample]``: ``[None,None,[0,1,2],[2,0,1]]``). k
    one-dimensional lists give an output of the input's rank - k + 1; a declared output of more
    dimensions is this case. Found at build, so that the model is refused at load with the cause
    instead of failing its output check at run time."""
    arrays = [v for v in const if v is not None]
    if not arrays or not all(isinstance(a, list) and len(_nested_shape(a)) == 1 and a for a in arrays):
        return  # (1-D integer lists among whole axes: the case pnnx writes)
    if not all(isinstance(v, int) and not isinstance(v, bool) for a in arrays for v in a):
        return
    x_shape, y_shape = op.inputs[pos["input"]].shape, op.outputs[0].shape if op.outputs else None
    if x_shape is None or y_shape is None or len(const) > len(x_shape):
        return
    k = len(arrays)
    if len(y_shape) > len(x_shape) - k + 1:
        held = (f"the index list holds {len(arrays[0])} values along one axis" if k == 1 else
                f"the {k} index lists hold {', '.join(str(len(a)) for a in arrays)} values, one dimension each")
        raise LayerParameterError(
            f"{op.where}: {held}, but the declared output {_shape_text(y_shape)} of input "
            f"{_shape_text(x_shape)} needs an index of {len(y_shape) - len(x_shape) + k} dimensions: pnnx "
            "writes a multi-dimensional constant index as a flat list and drops the rest of it, so the file "
            "lacks the index. Index with a 1-D tensor and reshape in the model instead, e.g. "
            "x.index_select(dim, idx.flatten()).view(...)")


def _shape_text(shape: tuple) -> str:
    return "(" + ",".join("?" if d is None else str(d) for d in shape) + ")"


@register("aten::one_hot")
class OneHot(Layer):
    """``F.one_hot(x, num_classes)``: int64, a trailing axis of ``num_classes`` (or, for -1,
    max(x) + 1: then data-dependent) with a 1 at each index."""

    data_dependent_shape = False

    def __init__(self, ctx: BuildContext, classes: int | None, where: str):
        super().__init__(ctx)
        self.classes, self.where = classes, where

    @classmethod
    def from_operator(cls, op, ctx):
        classes = op.param("num_classes", int, default=None)
        if classes is None and len(op.inputs) < 2:
            raise LayerParameterError(f"{op.where}: needs num_classes")
        if classes is not None and classes < -1:
            raise LayerParameterError(f"{op.where}: num_classes={classes}; expected -1 or a count")
        layer = cls(ctx, classes, op.where)
        n = classes if classes is not None else constant_int(op.inputs[1])
        if n is None or n == -1:  # (the class count is max(x) + 1, or a runtime value)
            layer.data_dependent_shape = True
        return layer

    def forward(self, x: Any, *rest: Any) -> Any:
        xp = self.xp
        n = self.classes if self.classes is not None else to_int(rest[0], "num_classes")
        if not xp.isdtype(x.dtype, "integral"):
            raise ShapeError(f"{self.where}: one_hot needs an integer input, found {x.dtype}")
        if n < -1:
            raise ShapeError(f"{self.where}: num_classes={n}; expected -1 or a count")
        if n == -1:
            n = int(xp.max(x)) + 1 if x.size else 0
        x, _ = check_range(xp, x, 0, n, lambda bad: f"{self.where}: class values must be in [0, {n}), "
                           f"found {'one outside' if bad is None else bad}")
        classes = xp.arange(n, dtype=xp.int64, device=self.device)
        return xp.astype(xp.astype(x, xp.int64)[..., None] == classes, xp.int64)


@register("aten::scatter")
class Scatter(Layer):
    """``self.scatter(dim, index, src)``: a copy of ``self`` with ``out[index[i][j]][j] =
    src[i][j]`` (for dim 0); ``src`` a tensor or a scalar ``value``. Duplicate indices along
    ``dim`` keep the last write (torch leaves that order unspecified). ``reduce='add'`` /
    ``'multiply'`` (a parameter, or the fifth input pnnx passes) combine every value sent to a
    place with it, as ``scatter_reduce(..., 'sum' / 'prod', include_self=True)``."""

    _REDUCE = {"add": "sum", "multiply": "prod"}

    def __init__(self, ctx: BuildContext, pos: dict[str, int], dim: int | None, value: Any, where: str,
                 reduce: str | None = None):
        super().__init__(ctx)
        self.pos, self.dim, self.value, self.where, self.reduce = pos, dim, value, where, reduce

    @classmethod
    def from_operator(cls, op, ctx):
        reduce = op.params.get("reduce")
        if reduce not in (None, "none", *cls._REDUCE):
            raise LayerParameterError(f"{op.where}: scatter with reduce={reduce!r} is not supported "
                                      "(add, multiply)")
        pos = input_slots(op, ("input", "dim", "index", "src", "reduce"))
        dim = op.param("dim", int, default=None)
        value = op.param("value", float, default=None)
        if "index" not in pos or ("src" not in pos and value is None):
            raise LayerParameterError(f"{op.where}: needs input, index and src (or value)")
        if dim is None and "dim" not in pos:
            raise LayerParameterError(f"{op.where}: needs dim")
        return cls(ctx, pos, dim, value, op.where, None if reduce in (None, "none") else reduce)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x, index = inputs[self.pos["input"]], inputs[self.pos["index"]]
        dim = self.dim if self.dim is not None else to_int(inputs[self.pos["dim"]], "dim")
        src = inputs[self.pos["src"]] if "src" in self.pos else self.value
        reduce = self.reduce if "reduce" not in self.pos else inputs[self.pos["reduce"]]
        if reduce not in (None, "none"):
            if reduce not in self._REDUCE:
                raise ShapeError(f"{self.where}: scatter with reduce={reduce!r} is not supported (add, multiply)")
            from .scatter import _scatter_along  # (scatter.py imports this module)

            if not hasattr(src, "shape"):
                src = xp.full(tuple(index.shape), src, dtype=x.dtype, device=self.device)
            return _scatter_along(xp, x, dim % max(x.ndim, 1), index, src, self._REDUCE[reduce], True,
                                  self.device, self.where, self.backend.fast)
        if x.ndim == 0 or index.ndim != x.ndim:
            raise ShapeError(f"{self.where}: index has {index.ndim} dims, input has {x.ndim}")
        axis = dim % x.ndim
        n = x.shape[axis]
        index, _ = check_range(xp, index, -n, n, lambda bad: f"{self.where}: index "
                               f"{'' if bad is None else f'{bad} '}is out of range for dim {axis} of size {n}")
        for a in range(x.ndim):
            if a != axis and index.shape[a] > x.shape[a]:
                raise ShapeError(f"{self.where}: index shape {tuple(index.shape)} exceeds input shape "
                                 f"{tuple(x.shape)} outside dim {axis}")
        index = xp.astype(index, xp.int64)
        index = xp.where(index < 0, index + n, index)
        if hasattr(src, "shape"):
            if any(index.shape[a] > src.shape[a] for a in range(index.ndim)):
                raise ShapeError(f"{self.where}: index shape {tuple(index.shape)} exceeds src shape "
                                 f"{tuple(src.shape)}")
            src = xp.astype(src[tuple(slice(0, s) for s in index.shape)], x.dtype)
        else:
            src = xp.full(index.shape, src, dtype=x.dtype, device=self.device)
        fast = getattr(self.backend.fast, "scatter", None)
        out = None if fast is None else fast(x, index, src, axis)
        if out is not None:
            return out
        # a one-hot comparison along the scattered axis (the standard has no scatter): for each
        # destination position along ``axis``, the last source row that names it
        d = xp.arange(n, dtype=xp.int64, device=self.device)
        shape_hit = index.shape[:axis] + (n,) + index.shape[axis:]
        ix = xp.expand_dims(index, axis=axis)  # (..., 1, k, ...)
        dd = xp.reshape(d, (1,) * axis + (n, 1) + (1,) * (x.ndim - axis - 1))
        hit = xp.broadcast_to(ix == dd, shape_hit)  # (..., n, k, ...)
        k = index.shape[axis]
        order = xp.reshape(xp.arange(1, k + 1, dtype=xp.int64, device=self.device), (1,) * (axis + 1) + (k,) + (1,) * (x.ndim - axis - 1))
        last = xp.max(xp.where(hit, order, xp.zeros_like(order)), axis=axis + 1)  # (..., n, ...) 0 = none
        written = last > 0
        src_at = xp.take_along_axis(src, xp.clip(last - 1, 0, max(k - 1, 0)), axis=axis) if k else None
        # the written part covers index's extent outside ``axis``; the rest of x is untouched
        region = tuple(slice(0, s) if a != axis else slice(None) for a, s in enumerate(index.shape))
        sub = x[region]
        new = xp.where(written, src_at, sub) if k else sub
        if all(index.shape[a] == x.shape[a] for a in range(x.ndim) if a != axis):
            return new
        out = xp.asarray(x, copy=True)
        out[region] = new
        return out


@register("aten::zero")
class Zero(Layer):
    """``x.zero_()`` as pnnx writes it (``aten::zero``; on a slice, followed by the
    ``Tensor.slice_copy`` that puts it back): zeros of x's shape and dtype."""

    def forward(self, x: Any) -> Any:
        return self.xp.zeros_like(x)


@register("aten::fill_diagonal")
class FillDiagonal(Layer):
    """``x.fill_diagonal_(value, wrap=False)`` (``aten::fill_diagonal (self, fill_value,
    wrap)``): a copy of x with its main diagonal set to value; x 2-D, or every dimension of one
    size. With ``wrap`` a tall matrix's diagonal starts again every ``cols + 1`` rows (torch's
    rule)."""

    def forward(self, x: Any, value: Any, wrap: Any = False) -> Any:
        xp = self.xp
        shape = tuple(x.shape)
        if len(shape) < 2 or (len(shape) > 2 and len(set(shape)) != 1):
            raise ShapeError(f"{self.op_type} {self.op_name!r}: needs a 2-D input or one with all dimensions of "
                             f"equal length, found shape {shape}")
        n = math.prod(shape)
        step = sum(math.prod(shape[d + 1:]) for d in range(len(shape)))  # (the diagonal's flat stride)
        count = min(shape)
        if len(shape) == 2 and bool(wrap) and shape[0] > shape[1] + 1:
            count = -(-n // step)
        flat = xp.arange(n, dtype=xp.int64, device=self.device)
        on = (flat % step == 0) & (flat // step < count)
        fill = xp.asarray(value, device=self.device)
        fill = xp.astype(fill, x.dtype) if fill.dtype != x.dtype else fill
        return xp.reshape(xp.where(on, fill, xp.reshape(x, (-1,))), shape)


@register("aten::numel")
class Numel(Layer):
    """The number of elements of the input, as a 0-d int64 array (``x.numel()``)."""

    def forward(self, x: Any) -> Any:
        return self.xp.asarray(math.prod(x.shape), dtype=self.xp.int64, device=self.device)


@register("aten::embedding_bag")
class EmbeddingBag(Layer):
    """``nn.EmbeddingBag`` as pnnx leaves it: ``aten::embedding_bag pnnx_22 9 4 weight indices
    offsets scale_grad_by_freq mode sparse per_sample_weights include_last_offset padding_idx``
    (the flags from constant expressions; a 2-D input arrives flattened, with offsets from
    ``torch.arange``), results (output, offset2bag, bag_size, max_indices: torch's, shapes and
    quirks included: mode sum without padding_idx gives an empty offset2bag). Modes 0 sum, 1 mean,
    2 max; entries equal to ``padding_idx`` are left out of their bag; an empty bag gives zeros.
    Bags are contiguous runs of the indices, reduced as segments (linear in their number).
    (pnnx 20261020 writes no file for a call with explicit offsets; the 2-D form exports.)"""

    def __init__(self, ctx: BuildContext, n_out: int, where: str):
        super().__init__(ctx)
        self.n_out, self.where = n_out, where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 9 or not 1 <= len(op.outputs) <= 4:
            raise LayerParameterError(f"{op.where}: expected 9 inputs and up to 4 outputs, found "
                                      f"{len(op.inputs)} and {len(op.outputs)}")
        return cls(ctx, len(op.outputs), op.where)

    def forward(self, weight, indices, offsets, _scale, mode, _sparse, psw, include_last, padding_idx):
        xp = self.xp
        mode = to_int(mode, "mode")
        if mode not in (0, 1, 2):
            raise ShapeError(f"{self.where}: mode={mode}, expected 0 (sum), 1 (mean) or 2 (max)")
        if indices.ndim != 1 or offsets.ndim != 1:
            raise ShapeError(f"{self.where}: expected 1-D indices and offsets, found {tuple(indices.shape)} "
                             f"and {tuple(offsets.shape)}")
        num, length = weight.shape[0], indices.shape[0]
        idx = xp.astype(indices, xp.int64)
        idx, _ = check_range(xp, idx, 0, num, lambda bad: f"{self.where}: indices must be in [0, {num}), "
                             f"found {'one outside' if bad is None else bad}")
        offs = xp.astype(offsets, xp.int64)
        if include_last is not None and bool(to_int(include_last, "include_last_offset")):
            offs = offs[:-1]
        dev = self.device
        padded = padding_idx is not None and to_int(padding_idx, "padding_idx") >= 0
        rows = xp.take(weight, idx, axis=0)  # (L, E)
        if psw is not None:
            if mode != 0:
                raise ShapeError(f"{self.where}: per_sample_weights needs mode sum")
            rows = rows * xp.reshape(xp.astype(psw, rows.dtype), (-1, 1))
        bags = offs.shape[0]
        even = (mode != 2 and not padded and bags > 0 and length > 0 and length % bags == 0
                and bool(xp.all(offs == xp.arange(0, length, length // bags, dtype=xp.int64, device=dev))))
        extra = None
        if even:
            # bags of one length (a 2-D input: pnnx's offsets from arange): one sum over an axis,
            # the entries of each bag added in order as the segment loop adds them
            k = length // bags
            out = xp.sum(xp.reshape(rows, (bags, k, rows.shape[1])), axis=1)
            if mode == 1:
                out = out / xp.asarray(k, dtype=out.dtype, device=dev)
                count = xp.full((bags,), k, dtype=xp.int64, device=dev)
        else:
            # bag b holds the entries [starts[b], ends[b]): reduced by segments, not through a
            # (bags, indices) membership matrix (quadratic in the batch: 1.5 s at 4096 bags of 8)
            starts = xp.clip(offs, 0, length)
            ends = xp.concat([starts[1:], xp.asarray([length], dtype=xp.int64, device=dev)])
            ends = xp.maximum(ends, starts)
            valid = (idx != to_int(padding_idx, "padding_idx")) if padded else xp.ones((length,), dtype=xp.bool, device=dev)
            if mode != 0:  # (the bag sizes: mean's divisor, max's and mean's auxiliary results)
                zero = xp.zeros((1,), dtype=xp.int64, device=dev)
                seen = xp.concat([zero, xp.cumulative_sum(xp.astype(valid, xp.int64))])
                count = xp.take(seen, ends) - xp.take(seen, starts)
            if mode == 2:
                out, extra = self._segment_max(rows, idx, valid, starts, ends)
            else:
                if padded:
                    rows = xp.where(valid[:, None], rows, xp.zeros((), dtype=rows.dtype, device=dev))
                out = self._segment_sum(rows, starts, ends)
                if mode == 1:
                    out = out / xp.reshape(xp.astype(xp.clip(count, min=1), rows.dtype), (-1, 1))
        if self.n_out == 1:
            return out
        # torch's auxiliary results: mean repeats bag_size as max_indices, sum leaves both zero
        # (one per offset, the last one included, where include_last_offset is set)
        if mode == 0:
            count = xp.zeros((offsets.shape[0],), dtype=xp.int64, device=dev)
        if extra is None:
            extra = count
        if mode == 0 and not padded:
            bag_of = xp.zeros((0,), dtype=xp.int64, device=dev)  # torch leaves offset2bag empty
        else:  # offset2bag: each entry's bag
            bag_of = xp.searchsorted(offs, xp.arange(length, dtype=xp.int64, device=dev), side="right") - 1
        return (out, bag_of, count, extra)[:self.n_out]

    def _segment_sum(self, rows: Any, starts: Any, ends: Any) -> Any:
        """Each bag's sum, in order (a NaN or inf stays in its bag): the backend's segment
        kernel, else the bags' t-th entries added together, as many steps as the longest bag."""
        xp = self.xp
        fast = getattr(self.backend.fast, "segment_sum", None)
        out = fast(rows, starts, ends) if fast is not None else None
        if out is not None:
            return out
        bags, width = starts.shape[0], rows.shape[1]
        out = xp.zeros((bags, width), dtype=rows.dtype, device=self.device)
        longest = int(xp.max(ends - starts)) if bags else 0
        last = max(rows.shape[0] - 1, 0)
        zero = xp.zeros((), dtype=rows.dtype, device=self.device)
        for t in range(longest):
            at = xp.minimum(starts + t, last)  # (starts are in [0, length] already)
            out = out + xp.where(xp.reshape(starts + t < ends, (-1, 1)), xp.take(rows, at, axis=0), zero)
        return out

    def _segment_max(self, rows: Any, idx: Any, valid: Any, starts: Any, ends: Any) -> tuple[Any, Any]:
        """Each bag's maximum and the weight row it came from, scanning the bags' t-th entries
        together (as many steps as the longest bag): torch's rule, the first entry then any
        greater one (a first NaN stays); an empty bag gives zeros."""
        xp = self.xp
        bags, width = starts.shape[0], rows.shape[1]
        out = xp.zeros((bags, width), dtype=rows.dtype, device=self.device)
        best = xp.zeros((bags, width), dtype=xp.int64, device=self.device)
        have = xp.zeros((bags, 1), dtype=xp.bool, device=self.device)
        longest = int(xp.max(ends - starts)) if bags else 0
        last = max(rows.shape[0] - 1, 0)
        for t in range(longest):
            at = xp.minimum(starts + t, last)  # (starts are in [0, length] already)
            ok = xp.reshape((starts + t < ends) & xp.take(valid, at), (-1, 1))
            v = xp.take(rows, at, axis=0)
            take = ok & (~have | (v > out))
            out = xp.where(take, v, out)
            best = xp.where(take, xp.reshape(xp.take(idx, at), (-1, 1)), best)
            have = have | ok
        return out, best

