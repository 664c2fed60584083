"""Writes through indices, scatters with reductions, diagonals, bucketing and the operators whose
output shape depends on the data.

pnnx spellings (torch 2.13 exports):

* ``y[idx] = v`` / ``x.index_put((i, j), v, accumulate=True)``: ``pnnx.Expression expr=[@0]``
  (``[None,@0]`` for ``y[:, idx]``, ``[@0,@1]`` for two index arrays) then ``Tensor.index_put
  ... accumulate=False $input=3 $indices=4 $values=2``, or ``values=0.0`` as a parameter. A
  bool mask goes through the same list (``y[m] = 0.0``).
* ``aten::index_add`` (input, dim, index, source, alpha); ``torch.scatter_add dim=0 $input
  $index $src``; ``aten::scatter_reduce`` (input, dim, index, src, reduce, include_self), reduce a
  bare-name constant ``expr=amax``; ``aten::masked_scatter`` (input, mask, source);
  ``aten::take_along_dim`` (input, indices, dim or None); ``torch.slice_scatter dim end start
  step $input $src``; ``aten::select_scatter`` (input, src, dim, index);
  ``aten::diagonal_scatter`` (input, src, offset, dim1, dim2); ``torch.diag diagonal=k``;
  ``aten::diagonal`` (input, offset, dim1, dim2: ``torch.diagonal`` and ``Tensor.diagonal``);
  ``aten::diag_embed`` (input, offset, dim1, dim2); ``aten::bucketize`` (input, boundaries,
  out_int32, right); ``aten::searchsorted`` (sorted_sequence, input, out_int32, right, side,
  sorter); ``aten::histc`` (input, bins, min, max); ``aten::index_fill`` (input, dim, index,
  value: ``expr=-1.0`` or a 0-d tensor); ``aten::index_copy`` (input, dim, index, source);
  ``aten::isin`` (elements, test_elements, assume_unique, invert; a scalar side is a constant
  expression).
* data-dependent shapes: ``aten::nonzero`` / ``aten::argwhere`` (one (count, ndim) int64
  output), ``aten::nonzero_numpy`` (``nonzero(as_tuple=True)``: a list for ``prim::ListUnpack``),
  ``torch.masked_select $input $mask``, ``aten::_unique2`` (input, sorted, return_inverse,
  return_counts; three outputs), ``aten::unique_consecutive`` (input, return_inverse,
  return_counts, dim; three outputs), ``aten::where`` with one input (``torch.where(cond)``: a list
  for ``prim::ListUnpack``), ``aten::bincount`` (input, weights, minlength). pnnx annotates their outputs with the traced shape; these
  layers set ``data_dependent_shape`` so that the graph checks only rank and dtype there and
  downstream.

The Array API has no scatter. Every write with possible duplicate targets goes through
:func:`segment_scatter`: a stable sort of the flat target positions, a reduction of each run of
equal targets by gathers (``take``) in rounds over the duplicate count (blocked so that memory
stays bounded; duplicates are combined in their original order, as torch's CPU kernels do), and a
``searchsorted`` gather that brings the results back to the destination. No update is lost.
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .indexing import advanced_index
from .misc import binary_operands, index_array, input_slots, is_float, to_float, to_int
from .registry import register

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


# ---------------------------------------------------------------------------------------------
# helpers


def _flag(v: Any, what: str, where: str) -> bool:
    """A bool from a constant operand (``expr=True``), a 0-d array or None (False)."""
    if v is None:
        return False
    if isinstance(v, (bool, int)):
        return bool(v)
    try:
        return bool(to_int(v, what))
    except ShapeError:
        raise ShapeError(f"{where}: {what} should be a bool, found {v!r}") from None


def _int(v: Any, what: str, where: str) -> int:
    try:
        return to_int(v, what)
    except ShapeError as exc:
        raise ShapeError(f"{where}: {exc}") from None


def _axis(dim: int, ndim: int, where: str, what: str = "dim") -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise ShapeError(f"{where}: {what}={dim} is out of range for a {ndim}-D input")
    return dim % n


def _combine(xp: Any, a: Any, b: Any, reduce: str) -> Any:
    if reduce in ("sum", "mean"):
        return (a | b) if a.dtype == xp.bool else a + b
    if reduce == "prod":
        return (a & b) if a.dtype == xp.bool else a * b
    if a.dtype == xp.bool:
        return (a | b) if reduce == "amax" else (a & b)
    return xp.maximum(a, b) if reduce == "amax" else xp.minimum(a, b)


def segment_scatter(xp: Any, dest: Any, pos: Any, vals: Any, reduce: str, include_self: bool,
                    device: Any, fast: Any = None, axis: int = 0) -> Any:
    """A new ``dest`` (shape (N, *tail)) where the rows named by the flat positions ``pos``
    ((k,), int64 in [0, N)) are combined with the rows of ``vals`` ((k, *tail), dest's dtype).

    ``reduce``: ``"sum"``, ``"prod"``, ``"mean"``, ``"amax"``, ``"amin"`` (every value sent to a
    row is combined, with the row's own value when ``include_self``), or ``"last"`` (the last value
    sent wins: ``index_put`` without accumulation). Rows nobody names are kept.

    With ``axis``, the rows are the slices along that axis of ``dest`` and ``vals`` (shaped like
    dest with k at ``axis``). ``fast``: the backend's fast module; its ``segment_scatter`` (numpy:
    one ``ufunc.at`` over flat positions, in place along ``axis``) is used where it covers the
    case (it returns None where not)."""
    k = pos.shape[0]
    if k == 0:
        return dest
    kernel = getattr(fast, "segment_scatter", None)
    if kernel is not None:
        out = kernel(dest, pos, vals, reduce, include_self, axis)
        if out is not None:
            return out
    if axis:
        out = segment_scatter(xp, xp.moveaxis(dest, axis, 0), pos, xp.moveaxis(vals, axis, 0), reduce, include_self,
                              device)
        return xp.moveaxis(out, 0, axis)
    tail = tuple(dest.shape[1:])
    order = xp.argsort(pos, stable=True)
    ps = xp.take(pos, order, axis=0)
    vs = xp.take(vals, order, axis=0)
    starts_mask = xp.concat([xp.ones((1,), dtype=xp.bool, device=device), ps[1:] != ps[:-1]])
    starts = xp.nonzero(starts_mask)[0]
    ends = xp.concat([starts[1:], xp.asarray([k], dtype=starts.dtype, device=device)])
    counts = ends - starts
    targets = xp.take(ps, starts, axis=0)
    s = starts.shape[0]
    bshape = (s,) + (1,) * len(tail)
    if reduce == "last":
        res = xp.take(vs, ends - 1, axis=0)
    else:
        # a segmented scan over the sorted values (Hillis-Steele: log2 of the longest run steps,
        # each combining every value with the one `shift` before it in its segment), then each
        # segment's last entry; rounds over the runs' t-th entries took (segments x longest run)
        # work: 43 s for 262k entries half of which go to one row (a graph's hub node)
        m = int(xp.max(counts))
        acc, shift = vs, 1
        while shift < m:
            same = xp.reshape(ps[shift:] == ps[:-shift], (k - shift,) + (1,) * len(tail))
            moved = xp.where(same, _combine(xp, acc[:-shift, ...], acc[shift:, ...], reduce), acc[shift:, ...])
            acc = xp.concat([acc[:shift, ...], moved], axis=0)
            shift *= 2
        acc = xp.take(acc, ends - 1, axis=0)
        if include_self:
            acc = _combine(xp, xp.take(dest, targets, axis=0), acc, reduce)
        if reduce == "mean":
            n = xp.reshape(counts + (1 if include_self else 0), bshape)
            if is_float(xp, dest.dtype):
                acc = acc / xp.astype(n, dest.dtype)
            else:  # (torch divides integers with floor rounding)
                acc = xp.astype(xp.floor_divide(xp.astype(acc, xp.int64), n), dest.dtype)
        res = acc
    # back to the destination by a gather: for every row, the segment naming it (if any)
    n_rows = dest.shape[0]
    q = xp.arange(n_rows, dtype=xp.int64, device=device)
    j = xp.clip(xp.searchsorted(targets, q), max=s - 1)
    hit = xp.take(targets, j, axis=0) == q
    return xp.where(xp.reshape(hit, (n_rows,) + (1,) * len(tail)), xp.take(res, j, axis=0), dest)


def _value_like(xp: Any, v: Any, like: Any, device: Any, where: str) -> Any:
    """``v`` (a Python scalar or an array) as an array of ``like``'s dtype."""
    if hasattr(v, "dtype"):
        return v if v.dtype == like.dtype else xp.astype(v, like.dtype)
    if isinstance(v, float) and not is_float(xp, like.dtype):
        if not float(v).is_integer():
            raise ShapeError(f"{where}: cannot write the float {v} into a {like.dtype} tensor")
        v = int(v)
    return xp.asarray(v, dtype=like.dtype, device=device)


def _dim_positions(xp: Any, shape: tuple, axis: int, index: Any, device: Any) -> Any:
    """Flat (row-major) positions in an array of ``shape`` of the elements at each position of
    ``index`` with its coordinate along ``axis`` replaced by the index value (scatter's rule)."""
    nd = len(shape)
    pos = xp.zeros(index.shape, dtype=xp.int64, device=device)
    stride = 1
    for a in range(nd - 1, -1, -1):
        if a == axis:
            coord = index
        else:
            coord = xp.reshape(xp.arange(index.shape[a], dtype=xp.int64, device=device),
                               (1,) * a + (index.shape[a],) + (1,) * (nd - a - 1))
        pos = pos + coord * stride
        stride *= shape[a]
    return pos


def _axis_only_index(index: Any, axis: int, x_shape: tuple, src_shape: tuple) -> Any:
    """The 1-D index along ``axis`` when ``index`` is one column broadcast over every other axis
    (``Tensor.expand`` of it: a zero stride there, on backends whose arrays have strides) and
    covers the input and src whole on those axes (GraphSAGE's mean aggregation
    ``scatter_reduce(1, dst.view(1, -1, 1).expand(B, -1, C), msg, "mean")``); else None."""
    strides = getattr(index, "strides", None)
    if strides is None or len(strides) != index.ndim or math.prod(index.shape) == 0:
        return None  # (an empty index: no column to take; numpy's strides of it say nothing)
    for a in range(index.ndim):
        if a != axis and (index.shape[a] != x_shape[a] or index.shape[a] != src_shape[a]
                          or (index.shape[a] > 1 and strides[a] != 0)):
            return None
    return index[(0,) * axis + (slice(None),) + (0,) * (index.ndim - axis - 1)]


def _scatter_along(xp: Any, x: Any, axis: int, index: Any, src: Any, reduce: str, include_self: bool,
                   device: Any, where: str, fast: Any = None) -> Any:
    """torch's ``scatter_add`` / ``scatter_reduce`` along ``axis``."""
    if index.ndim != x.ndim or (hasattr(src, "ndim") and src.ndim != x.ndim):
        raise ShapeError(f"{where}: input, index and src must have the same number of dimensions, found "
                         f"{x.ndim}, {index.ndim} and {getattr(src, 'ndim', 0)}")
    for a in range(x.ndim):
        if (a != axis and index.shape[a] > x.shape[a]) or index.shape[a] > src.shape[a]:
            raise ShapeError(f"{where}: index shape {tuple(index.shape)} exceeds src shape {tuple(src.shape)} "
                             f"or input shape {tuple(x.shape)} (outside dim {axis})")
    if x.ndim == 0:
        x1 = segment_scatter(xp, xp.reshape(x, (1,)), xp.reshape(index_array(xp, index, 1, where, False), (1,)),
                             xp.reshape(_value_like(xp, src, x, device, where), (1,)), reduce, include_self, device,
                             fast)
        return xp.reshape(x1, ())
    column = _axis_only_index(index, axis, tuple(x.shape), tuple(src.shape))
    if column is not None:  # whole slices along ``axis``: no flat positions to build
        column = index_array(xp, column, x.shape[axis], where, negative=False)
        src = _value_like(xp, src[tuple(slice(0, s) for s in index.shape)], x, device, where)
        return segment_scatter(xp, x, column, src, reduce, include_self, device, fast, axis=axis)
    index = index_array(xp, index, x.shape[axis], where, negative=False)
    src = _value_like(xp, src[tuple(slice(0, s) for s in index.shape)], x, device, where)
    pos = _dim_positions(xp, tuple(x.shape), axis, index, device)
    out = segment_scatter(xp, xp.reshape(x, (-1,)), xp.reshape(pos, (-1,)), xp.reshape(src, (-1,)),
                          reduce, include_self, device, fast)
    return xp.reshape(out, x.shape)


def _move_last2(xp: Any, x: Any, d1: int, d2: int) -> tuple[Any, tuple[int, ...]]:
    """``x`` with axes d1, d2 moved to the end (in that order) and the permutation used."""
    perm = tuple(a for a in range(x.ndim) if a not in (d1, d2)) + (d1, d2)
    return xp.permute_dims(x, perm), perm


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _diag_index(xp: Any, a: int, b: int, offset: int, device: Any) -> tuple[Any, int]:
    """Flat positions (row-major in an (a, b) matrix) of the diagonal ``offset`` and its length."""
    r0, c0 = max(-offset, 0), max(offset, 0)
    length = max(0, min(a - r0, b - c0))
    t = xp.arange(length, dtype=xp.int64, device=device)
    return (t + r0) * b + (t + c0), length


def _diag_matrix(xp: Any, v: Any, offset: int, device: Any) -> Any:
    """(..., L) -> (..., m, m) with m = L + |offset|: v on diagonal ``offset``, zeros elsewhere."""
    length = v.shape[-1]
    m = length + abs(offset)
    i = xp.reshape(xp.arange(m, dtype=xp.int64, device=device), (m, 1))
    j = xp.reshape(xp.arange(m, dtype=xp.int64, device=device), (1, m))
    on = (j - i) == offset
    t = xp.clip(i if offset >= 0 else j, max=max(length - 1, 0))  # position along the diagonal
    t = xp.broadcast_to(t, (m, m))
    if length == 0:
        return xp.zeros(tuple(v.shape[:-1]) + (m, m), dtype=v.dtype, device=device)
    g = xp.reshape(xp.take(v, xp.reshape(t, (-1,)), axis=v.ndim - 1), tuple(v.shape[:-1]) + (m, m))
    return xp.where(on, g, xp.zeros((), dtype=v.dtype, device=device))


def diagonal(xp: Any, x: Any, offset: int, d1: int, d2: int, device: Any) -> Any:
    """torch.diagonal: the diagonal of the (d1, d2) planes as a new last axis."""
    xt, _ = _move_last2(xp, x, d1, d2)
    a, b = xt.shape[-2], xt.shape[-1]
    flat_idx, _ = _diag_index(xp, a, b, offset, device)
    flat = xp.reshape(xt, tuple(xt.shape[:-2]) + (a * b,))
    return xp.take(flat, flat_idx, axis=flat.ndim - 1)


class _Named(Layer):
    """A layer whose operands all arrive as inputs; it keeps only the op's name for errors.
    ``operands``, where set, names the inputs the operator must have (checked at build), the
    last ``optional`` of them may be left out."""

    operands: tuple[str, ...] | None = None
    optional: int = 0

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        names, k = cls.operands, cls.optional
        if names is not None and not len(names) - k <= len(op.inputs) <= len(names):
            counts = " or ".join(str(n) for n in range(len(names) - k, len(names) + 1))
            listed = ", ".join(names[:len(names) - k]) + "".join(f"[, {n}]" for n in names[len(names) - k:])
            raise LayerParameterError(f"{op.where}: expected {counts} inputs ({listed}), found {len(op.inputs)}")
        return cls(ctx, op.where)


# ---------------------------------------------------------------------------------------------
# writes through indices


@register("Tensor.index_put")
class IndexPut(Layer):
    """``x.index_put(indices, values, accumulate)`` (``x[idx] = v``, ``x[:, idx] = v``,
    ``x[mask] = 0.0``): a copy of x with the elements ``x[indices]`` replaced by (or, with
    accumulate, increased by) the values broadcast to their shape; indices are None (a whole
    axis), integer arrays (negative ones count from the end) or bool masks, with torch's
    advanced-indexing rules. Accumulation sums duplicates; without it the last write wins."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int], value: Any, accumulate: bool, where: str):
        super().__init__(ctx)
        self.pos, self.value, self.accumulate, self.where = pos, value, accumulate, where

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("input", "indices", "values"))
        if "input" not in pos or "indices" not in pos:
            if "input" in pos and op.has_param("indices"):
                raise LayerParameterError(
                    f"{op.where}: pnnx folded the index tensor into a parameter (indices="
                    f"{op.params.get('indices')!r}) and dropped the whole-axis items before it, so which "
                    "axis it indexes is lost; not supported. Write the update with a slice or "
                    "index_fill / scatter instead of x[:, idx] = v")
            raise LayerParameterError(f"{op.where}: needs $input and $indices")
        value = None
        if "values" not in pos:
            value = op.param("values", default=None)
            if value is None and op.has_param("values"):  # (pnnx's spelling of a boolean value)
                raise LayerParameterError(f"{op.where}: values=None: pnnx lost the assigned value (it "
                                          "writes this for a boolean assignment such as m[idx] = False; "
                                          "assign to a float mask, or build the mask with torch.where)")
            if isinstance(value, str) or value is None or isinstance(value, (list, tuple)):
                raise LayerParameterError(f"{op.where}: needs $values or a scalar values parameter, "
                                          f"found {value!r}")
        return cls(ctx, pos, value, op.param("accumulate", bool, default=False), op.where)

    def forward(self, *inputs: Any) -> Any:
        xp, dev = self.xp, self.device
        x = inputs[self.pos["input"]]
        items = inputs[self.pos["indices"]]
        if not isinstance(items, (list, tuple)):
            items = [items]
        items = [None if it is None else (it if hasattr(it, "dtype") else xp.asarray(it, device=dev))
                 for it in items]
        values = inputs[self.pos["values"]] if "values" in self.pos else self.value
        values = _value_like(xp, values, x, dev, self.where)
        fast = None if self.accumulate else getattr(self.backend.fast, "index_put", None)
        if fast is not None:
            try:
                out = fast(x, items, values)
            except (IndexError, ValueError):
                out = None  # (the generic path below says what is wrong)
            if out is not None:
                return out
        n = math.prod(x.shape)
        flat_pos = xp.reshape(xp.arange(n, dtype=xp.int64, device=dev), x.shape)
        pos = advanced_index(xp, flat_pos, list(items), self.where)
        try:
            values = xp.broadcast_to(values, pos.shape)
        except ValueError:
            raise ShapeError(f"{self.where}: values of shape {tuple(values.shape)} do not broadcast to the "
                             f"indexed shape {tuple(pos.shape)}") from None
        out = segment_scatter(xp, xp.reshape(x, (-1,)), xp.reshape(pos, (-1,)), xp.reshape(values, (-1,)),
                              "sum" if self.accumulate else "last", True, dev, self.backend.fast)
        return xp.reshape(out, x.shape)


@register("aten::index_add")
class IndexAdd(_Named):
    """``x.index_add(dim, index, source, alpha=1)``: a copy of x with ``alpha * source[..., i,
    ...]`` added to ``x[..., index[i], ...]`` (duplicates add up)."""

    operands, optional = ("input", "dim", "index", "source", "alpha"), 1

    def forward(self, x, dim, index, source, alpha=1):
        xp, dev = self.xp, self.device
        axis, x1, index, src = self._along(x, dim, index, source)
        a = alpha if isinstance(alpha, (bool, int, float)) else (
            to_float(alpha) if is_float(xp, alpha.dtype) else to_int(alpha))
        if a != 1:
            if not is_float(xp, x.dtype) and isinstance(a, float) and not a.is_integer():
                raise ShapeError(f"{self.where}: alpha={a} for an integer tensor")
            src = src * _value_like(xp, a if is_float(xp, x.dtype) else int(a), x, dev, self.where)
        out = segment_scatter(xp, x1, index, src, "sum", True, dev, self.backend.fast, axis)
        return xp.reshape(out, x.shape) if x.ndim == 0 else out

    def _along(self, x, dim, index, source):
        """``(axis, x as at least 1-d, the index as 1-d int64 in range, source in x's dtype)``,
        the shapes checked as torch checks them."""
        xp, dev = self.xp, self.device
        axis = _axis(_int(dim, "dim", self.where), x.ndim, self.where)
        if index.ndim > 1:
            raise ShapeError(f"{self.where}: index must be 0-D or 1-D, found shape {tuple(index.shape)}")
        index = xp.reshape(index, (-1,))
        n = x.shape[axis] if x.ndim else 1
        index = index_array(xp, index, n, self.where, negative=False)
        if x.ndim == 0 or source.ndim == 0:  # (0-D with 0-D only, as in torch: one entry)
            if x.ndim != source.ndim:
                raise ShapeError(f"{self.where}: source of shape {tuple(source.shape)} does not match input "
                                 f"{tuple(x.shape)} (a 0-D input or source needs the other 0-D too)")
            x1, src = xp.reshape(x, (1,)), xp.reshape(source, (1,))
        else:
            x1, src = x, source
        shape = tuple(x1.shape)
        exp_shape = shape[:axis] + (index.shape[0],) + shape[axis + 1:]
        if tuple(src.shape) != exp_shape:
            raise ShapeError(f"{self.where}: source of shape {tuple(source.shape)} does not match input "
                             f"{tuple(x.shape)} with {index.shape[0]} entries along dim {axis}")
        return axis, x1, index, _value_like(xp, src, x, dev, self.where)


@register("aten::index_reduce")
class IndexReduce(IndexAdd):
    """``x.index_reduce(dim, index, source, reduce, include_self=True)``: a copy of x with each
    slice ``source[..., i, ...]`` reduced into ``x[..., index[i], ...]`` by ``reduce`` (prod, mean,
    amax, amin), with x's own value when include_self (an integer mean rounds down, as torch's);
    slices nobody names keep their value."""

    operands, optional = ("input", "dim", "index", "source", "reduce", "include_self"), 1

    def forward(self, x, dim, index, source, reduce, include_self=True):
        xp = self.xp
        keep = _reduce_args(reduce, include_self, _REDUCES[1:], self.where)
        axis, x1, index, src = self._along(x, dim, index, source)
        out = segment_scatter(xp, x1, index, src, reduce, keep, self.device, self.backend.fast, axis)
        return xp.reshape(out, x.shape) if x.ndim == 0 else out


def _long_index(xp: Any, index: Any, n: int, where: str, negative: bool) -> Any:
    """A 0-D or 1-D int64 index (torch's index_fill / index_copy accept no other dtype) as a 1-D
    int64 array in [0, n)."""
    if not hasattr(index, "dtype") or index.dtype != xp.int64:
        raise ShapeError(f"{where}: index must be an int64 tensor, found "
                         f"{getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim > 1:
        raise ShapeError(f"{where}: index must be 0-D or 1-D, found shape {tuple(index.shape)}")
    return index_array(xp, xp.reshape(index, (-1,)), n, where, negative=negative)


def _dim_index(layer, x, dim, index, negative: bool):
    """index_fill / index_copy's ``(axis, size along it, int64 1-D index)`` (a 0-d x counts as
    one entry)."""
    axis = _axis(_int(dim, "dim", layer.where), x.ndim, layer.where)
    n = x.shape[axis] if x.ndim else 1
    return axis, n, _long_index(layer.xp, index, n, layer.where, negative=negative)


@register("aten::index_fill")
class IndexFill(_Named):
    """``x.index_fill(dim, index, value)``: a copy of x with the slices ``index`` along dim set to
    the scalar (or 0-D tensor) value, converted to x's dtype as torch does (a float into an
    integer tensor truncates); negative indices count from the end."""

    operands = ("input", "dim", "index", "value")

    def forward(self, x, dim, index, value):
        xp, dev = self.xp, self.device
        axis, n, index = _dim_index(self, x, dim, index, negative=True)
        if hasattr(value, "dtype"):
            if value.ndim != 0:
                raise ShapeError(f"{self.where}: value must be a scalar or a 0-D tensor, found shape "
                                 f"{tuple(value.shape)}")
        elif isinstance(value, (bool, int, float)):
            kind = xp.bool if isinstance(value, bool) else xp.int64 if isinstance(value, int) else xp.float64
            value = xp.asarray(value, dtype=kind, device=dev)
        else:
            raise ShapeError(f"{self.where}: value must be a number, found {type(value).__name__}")
        v = value if value.dtype == x.dtype else xp.astype(value, x.dtype)
        d = xp.arange(n, dtype=xp.int64, device=dev)
        if index.shape[0]:  # each position looked up in the sorted indices (an (n, k) comparison was
            srt = xp.sort(index)  # 16 s at n = 262k, k = 65k; torch 0.2 ms)
            at = xp.clip(xp.searchsorted(srt, d), 0, srt.shape[0] - 1)
            hit = xp.take(srt, at) == d
        else:
            hit = xp.zeros((n,), dtype=xp.bool, device=dev)
        if x.ndim:
            hit = xp.reshape(hit, (n,) + (1,) * (x.ndim - axis - 1))
        else:
            hit = xp.reshape(hit, ())
        return xp.where(hit, v, x)


@register("aten::index_copy")
class IndexCopy(_Named):
    """``x.index_copy(dim, index, source)``: a copy of x with ``x[..., index[i], ...] =
    source[..., i, ...]`` along dim (source of x's dtype; indices in [0, size), no negative ones,
    as in torch; a repeated index keeps the last write)."""

    operands = ("input", "dim", "index", "source")

    def forward(self, x, dim, index, source):
        xp, dev = self.xp, self.device
        axis, n, index = _dim_index(self, x, dim, index, negative=False)
        if not hasattr(source, "dtype") or source.dtype != x.dtype:
            raise ShapeError(f"{self.where}: source must have the input's dtype {x.dtype}, found "
                             f"{getattr(source, 'dtype', type(source).__name__)}")
        if x.ndim <= 1 and source.ndim <= 1:  # (a scalar stands for one entry)
            x1, src = xp.reshape(x, (-1,)), xp.reshape(source, (-1,))
        elif source.ndim != x.ndim:
            raise ShapeError(f"{self.where}: source has {source.ndim} dimensions, the input {x.ndim}")
        else:
            x1, src = xp.moveaxis(x, axis, 0), xp.moveaxis(source, axis, 0)
        want = (index.shape[0],) + tuple(x1.shape[1:])
        if tuple(src.shape) != want:
            raise ShapeError(f"{self.where}: source of shape {tuple(source.shape)} does not match input "
                             f"{tuple(x.shape)} with {index.shape[0]} entries along dim {axis}")
        out = segment_scatter(xp, x1, index, src, "last", False, dev)
        return xp.reshape(out, x.shape) if x.ndim == 0 else xp.moveaxis(out, 0, axis)


@register("torch.scatter_add")
class ScatterAdd(Layer):
    """``x.scatter_add(dim, index, src)``: a copy of x with each ``src`` element added at its
    index along ``dim`` (the other coordinates kept); duplicates add up."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int], dim: int | None, where: str):
        super().__init__(ctx)
        self.pos, self.dim, self.where = pos, dim, where

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("input", "dim", "index", "src"))
        dim = op.param("dim", int, default=None)
        if not {"input", "index", "src"} <= set(pos) or (dim is None and "dim" not in pos):
            raise LayerParameterError(f"{op.where}: needs input, dim, index and src")
        return cls(ctx, pos, dim, op.where)

    def forward(self, *inputs: Any) -> Any:
        x = inputs[self.pos["input"]]
        dim = self.dim if self.dim is not None else _int(inputs[self.pos["dim"]], "dim", self.where)
        axis = _axis(dim, x.ndim, self.where)
        return _scatter_along(self.xp, x, axis, inputs[self.pos["index"]], inputs[self.pos["src"]], "sum", True,
                              self.device, self.where, self.backend.fast)


@register("aten::scatter_reduce")
class ScatterReduce(_Named):
    """``x.scatter_reduce(dim, index, src, reduce, include_self=True)``: every ``src`` element
    sent to its index along ``dim`` and each destination reduced with ``reduce`` (sum, prod,
    mean, amax, amin) over what it receives, with its own value when include_self; an integer
    mean rounds down as torch does. Destinations nobody names keep their value."""

    operands, optional = ("input", "dim", "index", "src", "reduce", "include_self"), 1

    def forward(self, x, dim, index, src, reduce, include_self=True):
        keep = _reduce_args(reduce, include_self, _REDUCES, self.where)
        axis = _axis(_int(dim, "dim", self.where), x.ndim, self.where)
        return _scatter_along(self.xp, x, axis, index, src, reduce, keep, self.device, self.where, self.backend.fast)


def _reduce_args(reduce: Any, include_self: Any, allowed: tuple[str, ...], where: str) -> bool:
    """scatter_reduce's and index_reduce's ``reduce`` checked against ``allowed``; returns
    include_self as a bool (None: True, torch's default)."""
    if not isinstance(reduce, str) or reduce not in allowed:
        raise ShapeError(f"{where}: reduce={reduce!r}; expected one of {', '.join(allowed)}")
    return True if include_self is None else _flag(include_self, "include_self", where)


def _broadcast_mask(xp: Any, x: Any, mask: Any, where: str) -> tuple[Any, Any]:
    """``x`` and a bool ``mask`` broadcast together (torch's masked_* rule), or a ShapeError."""
    if mask.dtype != xp.bool:
        raise ShapeError(f"{where}: mask must be bool, found {mask.dtype}")
    try:
        return xp.broadcast_arrays(x, mask)
    except ValueError:
        raise ShapeError(f"{where}: mask of shape {tuple(mask.shape)} does not broadcast with input "
                         f"{tuple(x.shape)}") from None


@register("aten::masked_scatter")
class MaskedScatter(_Named):
    """``x.masked_scatter(mask, source)``: x (broadcast with mask) with the positions where mask
    is True filled, in row-major order, by consecutive elements of source."""

    def forward(self, x, mask, source):
        xp = self.xp
        x, mask = _broadcast_mask(xp, x, mask, self.where)
        m = xp.reshape(mask, (-1,))
        n_src = math.prod(source.shape)
        c = xp.cumulative_sum(xp.astype(m, xp.int64)) - 1
        need = int(c[-1]) + 1 if m.shape[0] else 0
        if need > n_src:
            raise ShapeError(f"{self.where}: source has {n_src} elements, the mask selects {need}")
        if need == 0:
            return xp.asarray(x, copy=True)
        src = _value_like(self.xp, xp.reshape(source, (-1,)), x, self.device, self.where)
        g = xp.take(src, xp.clip(c, 0, n_src - 1), axis=0)
        return xp.reshape(xp.where(m, g, xp.reshape(x, (-1,))), x.shape)


@register("aten::take_along_dim")
class TakeAlongDim(_Named):
    """``torch.take_along_dim(x, indices, dim)``: ``x[..., indices[...], ...]`` along dim (x and
    indices broadcast over the other axes; negative indices count from the end); with dim None,
    x and indices are flattened first (and, as in torch, indices must then be in [0, numel))."""

    def forward(self, x, indices, dim=None):
        xp = self.xp
        if dim is None:
            flat = xp.reshape(x, (-1,))
            idx = index_array(xp, xp.reshape(indices, (-1,)), flat.shape[0], self.where, negative=False,
                               what="indices")
            return xp.take(flat, idx, axis=0)
        if indices.ndim != x.ndim:
            raise ShapeError(f"{self.where}: input and indices should have the same number of dimensions, "
                             f"found {x.ndim} and {indices.ndim}")
        axis = _axis(_int(dim, "dim", self.where), x.ndim, self.where)
        idx = index_array(xp, indices, x.shape[axis], self.where, negative=True, what="indices")
        shape = []
        for a, (p, q) in enumerate(zip(x.shape, idx.shape)):
            if a != axis and p != q and 1 not in (p, q):
                raise ShapeError(f"{self.where}: input {tuple(x.shape)} and indices {tuple(idx.shape)} do not "
                                 f"broadcast outside dim {axis}")
            shape.append(max(p, q) if p and q else 0)
        shape = tuple(shape)
        x = xp.broadcast_to(x, shape[:axis] + (x.shape[axis],) + shape[axis + 1:])
        idx = xp.broadcast_to(idx, shape[:axis] + (idx.shape[axis],) + shape[axis + 1:])
        return xp.take_along_axis(x, idx, axis=axis)


@register("torch.slice_scatter")
class SliceScatter(Layer):
    """``torch.slice_scatter(x, src, dim, start, end, step)``: a copy of x with
    ``x[..., start:end:step, ...]`` (along dim) replaced by src, which must have that shape."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int], dim: int, sl: slice, where: str):
        super().__init__(ctx)
        self.pos, self.dim, self.sl, self.where = pos, dim, sl, where

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("input", "src"))
        if len(pos) != 2:
            raise LayerParameterError(f"{op.where}: needs $input and $src")
        step = op.param("step", int, default=1)
        step = 1 if step is None else step
        if step <= 0:
            raise LayerParameterError(f"{op.where}: step={step}; slice_scatter needs a positive step")
        end = op.param("end", int, default=None)
        sl = slice(op.param("start", int, default=None), None if end is None or end >= 2**31 - 1 else end, step)
        return cls(ctx, pos, op.param("dim", int, default=0), sl, op.where)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x, src = inputs[self.pos["input"]], inputs[self.pos["src"]]
        axis = _axis(self.dim, x.ndim, self.where)
        key = (slice(None),) * axis + (self.sl, ...)
        n = len(range(*self.sl.indices(x.shape[axis])))
        want = tuple(x.shape[:axis]) + (n,) + tuple(x.shape[axis + 1:])
        if tuple(src.shape) != want:
            raise ShapeError(f"{self.where}: src has shape {tuple(src.shape)}, the slice has shape {want}")
        out = xp.asarray(x, copy=True)
        out[key] = _value_like(xp, src, x, self.device, self.where)
        return out


@register("aten::select_scatter")
class SelectScatter(_Named):
    """``torch.select_scatter(x, src, dim, index)``: a copy of x with ``x.select(dim, index)``
    replaced by src."""

    def forward(self, x, src, dim, index):
        xp = self.xp
        axis = _axis(_int(dim, "dim", self.where), x.ndim, self.where)
        n, i = x.shape[axis], _int(index, "index", self.where)
        if not -n <= i < n:
            raise ShapeError(f"{self.where}: index {i} is out of range for dim {axis} of size {n}")
        want = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:])
        if tuple(src.shape) != want:
            raise ShapeError(f"{self.where}: src has shape {tuple(src.shape)}, the selection has shape {want}")
        out = xp.asarray(x, copy=True)
        out[(slice(None),) * axis + (i % n, ...)] = _value_like(xp, src, x, self.device, self.where)
        return out


@register("aten::diagonal_scatter")
class DiagonalScatter(_Named):
    """``torch.diagonal_scatter(x, src, offset, dim1, dim2)``: a copy of x with
    ``torch.diagonal(x, offset, dim1, dim2)`` replaced by src."""

    def forward(self, x, src, offset=0, dim1=0, dim2=1):
        xp, dev = self.xp, self.device
        if x.ndim < 2:
            raise ShapeError(f"{self.where}: needs an input of at least 2 dimensions, found {x.ndim}")
        d1 = _axis(_int(dim1, "dim1", self.where), x.ndim, self.where, "dim1")
        d2 = _axis(_int(dim2, "dim2", self.where), x.ndim, self.where, "dim2")
        if d1 == d2:
            raise ShapeError(f"{self.where}: dim1 and dim2 cannot be the same dimension ({d1})")
        off = _int(offset, "offset", self.where)
        xt, perm = _move_last2(xp, x, d1, d2)
        a, b = xt.shape[-2], xt.shape[-1]
        _, length = _diag_index(xp, a, b, off, dev)
        want = tuple(xt.shape[:-2]) + (length,)
        if tuple(src.shape) != want:
            raise ShapeError(f"{self.where}: src has shape {tuple(src.shape)}, the diagonal has shape {want}")
        if length == 0:
            return xp.asarray(x, copy=True)
        src = _value_like(xp, src, x, dev, self.where)
        i = xp.reshape(xp.arange(a, dtype=xp.int64, device=dev), (a, 1))
        j = xp.reshape(xp.arange(b, dtype=xp.int64, device=dev), (1, b))
        on = (j - i) == off
        t = xp.broadcast_to(xp.clip((i - max(-off, 0)) if off < 0 else i, 0, length - 1), (a, b))
        g = xp.reshape(xp.take(src, xp.reshape(t, (-1,)), axis=src.ndim - 1), tuple(xt.shape))
        return xp.permute_dims(xp.where(on, g, xt), _inverse(perm))


# ---------------------------------------------------------------------------------------------
# diagonals


@register("torch.diag")
class Diag(Layer):
    """``torch.diag(x, diagonal)``: a 1-D x becomes the square matrix with x on diagonal
    ``diagonal`` (zeros elsewhere); a 2-D x gives that diagonal as a 1-D tensor."""

    def __init__(self, ctx: BuildContext, offset: int, where: str):
        super().__init__(ctx)
        self.offset, self.where = offset, where

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("diagonal", int, default=0) or 0, op.where)

    def forward(self, x):
        if x.ndim == 1:
            return _diag_matrix(self.xp, x, self.offset, self.device)
        if x.ndim == 2:
            return diagonal(self.xp, x, self.offset, 0, 1, self.device)
        raise ShapeError(f"{self.where}: expects a 1-D or 2-D input, found shape {tuple(x.shape)}")


@register("aten::diagonal")
class Diagonal(_Named):
    """``torch.diagonal(x, offset, dim1, dim2)`` / ``x.diagonal(...)``: the diagonal ``offset``
    of every (dim1, dim2) plane, as a new last axis (the two axes removed)."""

    def forward(self, x, offset=0, dim1=0, dim2=1):
        if x.ndim < 2:
            raise ShapeError(f"{self.where}: needs an input of at least 2 dimensions, found {x.ndim}")
        d1 = _axis(_int(dim1, "dim1", self.where), x.ndim, self.where, "dim1")
        d2 = _axis(_int(dim2, "dim2", self.where), x.ndim, self.where, "dim2")
        if d1 == d2:
            raise ShapeError(f"{self.where}: dim1 and dim2 cannot be the same dimension ({d1})")
        return diagonal(self.xp, x, _int(offset, "offset", self.where), d1, d2, self.device)


@register("aten::diag_embed")
class DiagEmbed(_Named):
    """``torch.diag_embed(x, offset, dim1, dim2)``: the last axis of x put on diagonal ``offset``
    of new (dim1, dim2) planes of size n + |offset| (zeros elsewhere); rank + 1."""

    def forward(self, x, offset=0, dim1=-2, dim2=-1):
        xp = self.xp
        if x.ndim == 0:
            raise ShapeError(f"{self.where}: needs an input of at least 1 dimension")
        rank = x.ndim + 1
        d1 = _axis(_int(dim1, "dim1", self.where), rank, self.where, "dim1")
        d2 = _axis(_int(dim2, "dim2", self.where), rank, self.where, "dim2")
        if d1 == d2:
            raise ShapeError(f"{self.where}: dim1 and dim2 cannot be the same dimension ({d1})")
        mat = _diag_matrix(xp, x, _int(offset, "offset", self.where), self.device)  # (..., row, col)
        # output axis k takes: row at d1, col at d2, the batch axes in order elsewhere
        batch = iter(range(rank - 2))
        perm = tuple(rank - 2 if k == d1 else rank - 1 if k == d2 else next(batch) for k in range(rank))
        return xp.permute_dims(mat, perm)


# ---------------------------------------------------------------------------------------------
# bucketing and histograms


def _out_int(xp: Any, v: Any, out_int32: bool) -> Any:
    return xp.astype(v, xp.int32 if out_int32 else xp.int64)


def _real_dtype_check(xp: Any, a: Any, what: str, where: str) -> None:
    if not hasattr(a, "dtype") or a.dtype == xp.bool or not xp.isdtype(a.dtype, ("real floating", "integral")):
        raise ShapeError(f"{where}: {what} must be a real (integer or floating) tensor, found "
                         f"{getattr(a, 'dtype', type(a).__name__)}")


def _common(xp: Any, a: Any, b: Any) -> tuple[Any, Any]:
    if a.dtype == b.dtype:
        return a, b
    if is_float(xp, a.dtype) != is_float(xp, b.dtype):
        dt = a.dtype if is_float(xp, a.dtype) else b.dtype
    else:
        dt = xp.result_type(a.dtype, b.dtype)
    return xp.astype(a, dt), xp.astype(b, dt)


@register("aten::bucketize")
class Bucketize(_Named):
    """``torch.bucketize(x, boundaries, out_int32, right)``: for each element, the index of the
    bucket of the sorted 1-D boundaries it falls in (right=False: b[i-1] < x <= b[i]; right=True:
    b[i-1] <= x < b[i]); int64, or int32 with out_int32."""

    def forward(self, x, boundaries, out_int32=False, right=False):
        xp = self.xp
        _real_dtype_check(xp, boundaries, "boundaries", self.where)
        if boundaries.ndim != 1:
            raise ShapeError(f"{self.where}: boundaries must be 1-D, found shape {tuple(boundaries.shape)}")
        if not hasattr(x, "dtype"):
            x = xp.asarray(x, device=self.device)
        _real_dtype_check(xp, x, "input", self.where)
        b, xv = _common(xp, boundaries, x)
        side = "right" if _flag(right, "right", self.where) else "left"
        out = xp.reshape(xp.searchsorted(b, xp.reshape(xv, (-1,)), side=side), x.shape)
        return _out_int(xp, out, _flag(out_int32, "out_int32", self.where))


@register("aten::searchsorted")
class SearchSorted(_Named):
    """``torch.searchsorted(sorted_sequence, x, out_int32, right, side, sorter)``: for each
    element of x, the insertion index into the sorted innermost axis of the sequence (its leading
    axes matching x's); side 'left' (default) or 'right' (``right=True`` is 'right'); sorter
    gives the order of an unsorted sequence. int64, or int32 with out_int32."""

    def forward(self, seq, x, out_int32=False, right=False, side=None, sorter=None):
        xp = self.xp
        right = _flag(right, "right", self.where)
        if side is not None:
            if side not in ("left", "right"):
                raise ShapeError(f"{self.where}: side={side!r}; expected 'left' or 'right'")
            if side == "left" and right:
                raise ShapeError(f"{self.where}: side='left' and right=True contradict each other")
            right = side == "right"
        _real_dtype_check(xp, seq, "sorted_sequence", self.where)
        _real_dtype_check(xp, x, "input", self.where)
        if seq.ndim == 0:
            raise ShapeError(f"{self.where}: sorted_sequence must have at least 1 dimension")
        if sorter is not None:
            if tuple(sorter.shape) != tuple(seq.shape):
                raise ShapeError(f"{self.where}: sorter of shape {tuple(sorter.shape)} does not match the "
                                 f"sequence {tuple(seq.shape)}")
            idx = index_array(xp, sorter, seq.shape[-1], self.where, negative=False, what="sorter")
            seq = xp.take_along_axis(seq, idx, axis=seq.ndim - 1)
        seq, x = _common(xp, seq, x)
        sd = "right" if right else "left"
        if seq.ndim == 1:
            out = xp.reshape(xp.searchsorted(seq, xp.reshape(x, (-1,)), side=sd), x.shape)
        else:
            if x.ndim != seq.ndim or tuple(x.shape[:-1]) != tuple(seq.shape[:-1]):
                raise ShapeError(f"{self.where}: the leading dimensions of the sequence {tuple(seq.shape)} and "
                                 f"the input {tuple(x.shape)} must match")
            rows = math.prod(seq.shape[:-1])
            s2 = xp.reshape(seq, (rows, seq.shape[-1]))
            x2 = xp.reshape(x, (rows, x.shape[-1]))
            if rows > 8 and seq.shape[-1] <= SEARCH_COUNT_MAX_LENGTH and not _has_nan(xp, s2, x2):
                out = _count_below(xp, s2, x2, right)
            else:  # (one search per row: ~2 us of Python each, 40x torch for 32k rows of 8)
                out = xp.stack([xp.searchsorted(s2[r, :], x2[r, :], side=sd) for r in range(rows)]) if rows else \
                    xp.zeros((0, x.shape[-1]), dtype=xp.int64, device=self.device)
            out = xp.reshape(out, x.shape)
        return _out_int(xp, out, _flag(out_int32, "out_int32", self.where))


def _has_nan(xp: Any, *arrays: Any) -> bool:
    return any(xp.isdtype(a.dtype, "real floating") and bool(xp.any(xp.isnan(a))) for a in arrays)


#: batched searchsorted rows of at most this many boundaries count them instead of searching
SEARCH_COUNT_MAX_LENGTH = 64


def _count_below(xp: Any, s2: Any, x2: Any, right: bool) -> Any:
    """Per row, how many boundaries of the sorted ``s2`` (rows, L) lie below each query of
    ``x2`` (rows, Q) (``<``; ``<=`` with ``right``): searchsorted's answer for a sorted row
    without NaN, in blocks of rows."""
    rows, length, q = s2.shape[0], s2.shape[1], x2.shape[1]
    step = max(1, (1 << 22) // max(1, length * q))
    out = []
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        a, b = s2[r0:r1, None, :], x2[r0:r1, :, None]
        hit = (a <= b) if right else (a < b)
        out.append(xp.sum(xp.astype(hit, xp.int64), axis=-1))
    return out[0] if len(out) == 1 else xp.concat(out, axis=0)


@register("aten::histc")
class Histc(_Named):
    """``torch.histc(x, bins, min, max)``: counts of the elements in ``bins`` equal-width bins
    over [min, max] (the data's range when both are 0; the last bin includes max; elements
    outside and NaN are left out), in x's floating dtype."""

    def forward(self, x, bins=100, lo=0, hi=0):
        xp, dev = self.xp, self.device
        if not hasattr(x, "dtype") or not xp.isdtype(x.dtype, "real floating"):
            raise ShapeError(f"{self.where}: histc needs a floating input, found {getattr(x, 'dtype', None)}")
        nb = _int(bins, "bins", self.where)
        if nb <= 0:
            raise ShapeError(f"{self.where}: bins={nb}; it must be positive")
        lo, hi = to_float(lo, "min"), to_float(hi, "max")
        v = xp.reshape(x, (-1,))
        if lo == hi == 0.0:
            fin = v[~xp.isnan(v)]
            if fin.shape[0]:
                lo, hi = float(xp.min(fin)), float(xp.max(fin))
        if lo > hi:
            raise ShapeError(f"{self.where}: max ({hi}) must be larger than min ({lo})")
        if math.isinf(lo) or math.isinf(hi) or math.isnan(lo) or math.isnan(hi):
            raise ShapeError(f"{self.where}: range [{lo}, {hi}] is not finite")
        if lo == hi:
            lo, hi = lo - 1.0, hi + 1.0
        dt = x.dtype
        lo_a, hi_a = xp.asarray(lo, dtype=dt, device=dev), xp.asarray(hi, dtype=dt, device=dev)
        keep = (v >= lo_a) & (v <= hi_a)
        # torch's histc kernel: the bin by division in x's dtype, truncated, (x - min) * bins /
        # (max - min), max itself in the last bin; no search of the edges (torch.histogram's rule),
        # which puts values on a bin edge (a 0.1 grid) one bin off now and then
        scaled = (xp.where(keep, v, lo_a) - lo_a) * xp.asarray(nb, dtype=dt, device=dev) / (hi_a - lo_a)
        b = xp.clip(xp.astype(scaled, xp.int64), 0, nb - 1)
        b = xp.where(keep, b, nb)  # out of range / NaN: an extra bin, dropped
        ones = xp.ones((b.shape[0],), dtype=xp.int64, device=dev)
        counts = segment_scatter(xp, xp.zeros((nb + 1,), dtype=xp.int64, device=dev), b, ones, "sum", True, dev,
                                 self.backend.fast)
        return xp.astype(counts[:nb], dt)


@register("aten::isin")
class IsIn(_Named):
    """``torch.isin(elements, test_elements, assume_unique, invert)``: a bool tensor shaped like
    elements (0-D for a scalar), True where the element equals some test element (compared in
    the promoted dtype; NaN matches nothing), negated with invert. Bool inputs are refused, as
    in torch."""

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) not in (2, 3, 4):
            raise LayerParameterError(f"{op.where}: expected 2 to 4 inputs (elements, test_elements, "
                                      f"assume_unique, invert), found {len(op.inputs)}")
        return cls(ctx, op.where)

    def forward(self, elements, test, _assume_unique=False, invert=False):
        xp, dev = self.xp, self.device
        for what, v in (("elements", elements), ("test_elements", test)):
            if isinstance(v, bool) or (hasattr(v, "dtype") and (v.dtype == xp.bool or not xp.isdtype(
                    v.dtype, ("real floating", "integral")))):
                raise ShapeError(f"{self.where}: {what} must be a real number or tensor (not bool or complex), "
                                 f"found {getattr(v, 'dtype', type(v).__name__)}")
            if not hasattr(v, "dtype") and not isinstance(v, (int, float)):
                raise ShapeError(f"{self.where}: {what} must be a tensor or a number, found {type(v).__name__}")
        a, b = binary_operands(xp, elements, test, dev)
        flat = xp.reshape(a, (-1,))
        pool = xp.sort(xp.reshape(b, (-1,)))
        m = pool.shape[0]
        if m == 0 or flat.shape[0] == 0:
            hit = xp.zeros(flat.shape, dtype=xp.bool, device=dev)
        else:
            j = xp.clip(xp.searchsorted(pool, flat), max=m - 1)
            hit = xp.take(pool, j, axis=0) == flat
        hit = xp.reshape(hit, a.shape)
        return ~hit if _flag(invert, "invert", self.where) else hit


# ---------------------------------------------------------------------------------------------
# data-dependent output shapes


class _DataDependent(Layer):
    """A layer whose output shape depends on the values of its input: the graph checks only the
    rank and dtype of its outputs (and of everything computed from them)."""

    data_dependent_shape = True

    def __init__(self, ctx: BuildContext, where: str, n_out: int = 1):
        super().__init__(ctx)
        self.where, self.n_out = where, n_out

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.where, len(op.outputs))

    def _coords(self, x: Any) -> tuple[Any, ...]:
        xp = self.xp
        if x.ndim == 0:
            n = 1 if bool(x != 0) else 0
            return (xp.zeros((n,), dtype=xp.int64, device=self.device),)  # (a placeholder)
        return tuple(xp.astype(c, xp.int64) for c in xp.nonzero(x))


@register("aten::nonzero", "aten::argwhere")
class NonZero(_DataDependent):
    """``torch.nonzero(x)`` / ``torch.argwhere(x)``: the (count, ndim) int64 coordinates of the
    non-zero elements, in row-major order."""

    def forward(self, x):
        xp = self.xp
        c = self._coords(x)
        if x.ndim == 0:
            return xp.zeros((c[0].shape[0], 0), dtype=xp.int64, device=self.device)
        return xp.stack(c, axis=1)


@register("aten::nonzero_numpy")
class NonZeroTuple(_DataDependent):
    """``torch.nonzero(x, as_tuple=True)``: one 1-D int64 tensor of coordinates per axis (a list,
    unpacked by ``prim::ListUnpack``)."""

    def forward(self, x):
        if x.ndim == 0:
            raise ShapeError(f"{self.where}: nonzero(as_tuple=True) of a 0-D tensor is not supported")
        return list(self._coords(x))


@register("torch.masked_select")
class MaskedSelect(_DataDependent):
    """``torch.masked_select(x, mask)``: the 1-D tensor of the elements of x (broadcast with mask)
    where mask is True, in row-major order."""

    @classmethod
    def from_operator(cls, op, ctx):
        layer = super().from_operator(op, ctx)
        layer.pos = input_slots(op, ("input", "mask"))
        if len(layer.pos) != 2:
            raise LayerParameterError(f"{op.where}: needs $input and $mask")
        return layer

    def forward(self, *inputs):
        xp = self.xp
        x, mask = inputs[self.pos["input"]], inputs[self.pos["mask"]]
        x, mask = _broadcast_mask(xp, x, mask, self.where)
        return xp.reshape(x, (-1,))[xp.reshape(mask, (-1,))]


@register("aten::_unique2")
class Unique(_DataDependent):
    """``torch.unique(x, sorted, return_inverse, return_counts)`` over all elements (dim=None):
    (sorted unique values, inverse indices shaped like x or empty, counts or empty); NaNs are
    each their own value, as in torch."""

    def forward(self, x, _sorted=True, return_inverse=False, return_counts=False):
        xp, dev = self.xp, self.device
        flat = xp.reshape(x, (-1,))
        n = flat.shape[0]
        key = xp.astype(flat, xp.uint8) if flat.dtype == xp.bool else flat
        order = xp.argsort(key, stable=True)
        s = xp.take(flat, order, axis=0)
        if n:
            start = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), s[1:] != s[:-1]])
        else:
            start = xp.zeros((0,), dtype=xp.bool, device=dev)
        starts = xp.nonzero(start)[0]
        values = xp.take(s, starts, axis=0)
        empty = xp.zeros((0,), dtype=xp.int64, device=dev)
        inverse = counts = empty
        if _flag(return_inverse, "return_inverse", self.where):
            seg = xp.cumulative_sum(xp.astype(start, xp.int64)) - 1
            inverse = xp.reshape(xp.take(seg, xp.argsort(order), axis=0), x.shape)  # (argsort: the inverse order)
        if _flag(return_counts, "return_counts", self.where):
            counts = _run_lengths(xp, starts, n, dev)
        out = (values, inverse, counts)
        return out[0] if self.n_out == 1 else out[:self.n_out]


@register("aten::unique_dim")
class UniqueDim(_DataDependent):
    """``torch.unique(x, dim=d, ...)`` (pnnx: ``aten::unique_dim op 5 3 x dim sorted
    return_inverse return_counts``): the distinct slices of x along dim in lexicographic order
    (sorted or not, as torch's kernel), the slice each input slice became, and the counts; like
    torch, the inverse and counts are always given. A NaN makes its slice differ from every
    other."""

    def forward(self, x, dim, _sorted=True, return_inverse=False, return_counts=False):
        xp, dev = self.xp, self.device
        if x.ndim == 0:
            raise ShapeError(f"{self.where}: dim={dim} for a 0-D input")
        axis = _axis(_int(dim, "dim", self.where), x.ndim, self.where)
        moved = xp.moveaxis(x, axis, 0)
        n, width = moved.shape[0], math.prod(moved.shape[1:])
        if n and not width:
            raise ShapeError(f"{self.where}: the input {tuple(x.shape)} has zero-sized dimensions other than "
                             f"dim {axis}")
        rows = xp.reshape(moved, (n, width))
        empty = xp.zeros((0,), dtype=xp.int64, device=dev)
        if n == 0:
            out = (x, empty, empty)
            return out[0] if self.n_out == 1 else out[:self.n_out]
        keys = xp.astype(rows, xp.uint8) if rows.dtype == xp.bool else rows
        order = xp.arange(n, dtype=xp.int64, device=dev)
        for c in range(width - 1, -1, -1):  # (stable sorts from the last column: lexicographic)
            order = xp.take(order, xp.argsort(xp.take(keys[:, c], order, axis=0), stable=True), axis=0)
        s = xp.take(rows, order, axis=0)
        change = xp.any(s[1:, :] != s[:-1, :], axis=1)
        start = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), change])
        starts = xp.nonzero(start)[0]
        values = xp.moveaxis(xp.take(xp.moveaxis(x, axis, 0), xp.take(order, starts, axis=0), axis=0), 0, axis)
        seg = xp.cumulative_sum(xp.astype(start, xp.int64)) - 1
        inverse = xp.take(seg, xp.argsort(order), axis=0)
        out = (values, inverse, _run_lengths(xp, starts, n, dev))
        return out[0] if self.n_out == 1 else out[:self.n_out]


def _run_lengths(xp: Any, starts: Any, n: int, device: Any) -> Any:
    """int64 lengths of the runs beginning at ``starts`` (ascending) in a sequence of ``n``."""
    ends = xp.concat([starts[1:], xp.asarray([n], dtype=starts.dtype, device=device)])
    return xp.astype(ends - starts, xp.int64)


@register("aten::unique_consecutive")
class UniqueConsecutive(_DataDependent):
    """``torch.unique_consecutive(x, return_inverse, return_counts, dim)``: x with each run of
    equal consecutive elements (dim None: of the flattened x) or slices along dim kept once, with
    the run each element falls in (shaped like x, or along dim) and the run lengths. Without dim
    an inverse or count not asked for is empty; with dim both are always given, as torch's
    kernel does. NaNs are each their own value."""

    def forward(self, x, return_inverse=False, return_counts=False, dim=None):
        xp, dev = self.xp, self.device
        empty = xp.zeros((0,), dtype=xp.int64, device=dev)
        if dim is None:
            flat = xp.reshape(x, (-1,))
            keep_inverse = _flag(return_inverse, "return_inverse", self.where)
            keep_counts = _flag(return_counts, "return_counts", self.where)
            rows, shape_inv = flat, tuple(x.shape)
            change = (rows[1:] != rows[:-1]) if rows.shape[0] else None
            axis = None
        else:
            if x.ndim == 0:
                raise ShapeError(f"{self.where}: dim={dim} for a 0-D input")
            axis = _axis(_int(dim, "dim", self.where), x.ndim, self.where)
            keep_inverse = keep_counts = True
            moved = xp.moveaxis(x, axis, 0)
            length = moved.shape[0]
            width = math.prod(moved.shape[1:])
            if length and not width:
                raise ShapeError(f"{self.where}: the input {tuple(x.shape)} has zero-sized dimensions other "
                                 f"than dim {axis}")
            rows, shape_inv = xp.reshape(moved, (length, width)), (length,)
            change = xp.any(rows[1:, :] != rows[:-1, :], axis=1) if length else None
        n = rows.shape[0]
        if n == 0:
            values = x if axis is not None else xp.reshape(x, (0,))
            return (values, empty, empty)[:self.n_out] if self.n_out > 1 else values
        start = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), change])
        starts = xp.nonzero(start)[0]
        if axis is None:
            values = xp.take(rows, starts, axis=0)
        else:
            values = xp.moveaxis(xp.take(xp.moveaxis(x, axis, 0), starts, axis=0), 0, axis)
        inverse = counts = empty
        if keep_inverse:
            inverse = xp.reshape(xp.cumulative_sum(xp.astype(start, xp.int64)) - 1, shape_inv)
        if keep_counts:
            counts = _run_lengths(xp, starts, n, dev)
        out = (values, inverse, counts)
        return out[0] if self.n_out == 1 else out[:self.n_out]


@register("aten::where")
class WhereTuple(_DataDependent):
    """``torch.where(condition)`` (pnnx's one-input ``aten::where``): like
    ``nonzero(as_tuple=True)``, one 1-D int64 tensor of coordinates of the non-zero elements per
    axis (a list for ``prim::ListUnpack``; a 0-D condition gives one of length 0 or 1). The
    three-input form is ``torch.where(condition, input, other)`` (not data-dependent)."""

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) not in (1, 3):
            raise LayerParameterError(f"{op.where}: expected 1 input (condition) or 3 (condition, input, "
                                      f"other), found {len(op.inputs)}")
        layer = super().from_operator(op, ctx)
        if len(op.inputs) == 3:
            layer.data_dependent_shape = False
        return layer

    def forward(self, cond, *rest):
        xp = self.xp
        if rest:
            if not hasattr(cond, "dtype"):
                raise ShapeError(f"{self.where}: condition must be a tensor, found {type(cond).__name__}")
            a, b = binary_operands(xp, rest[0], rest[1], self.device)
            return xp.where(cond if cond.dtype == xp.bool else cond != 0, a, b)
        coords = list(self._coords(cond))
        return coords if self.n_out == 1 else tuple(coords)


@register("aten::bincount")
class Bincount(_DataDependent):
    """``torch.bincount(x, weights, minlength)``: for the 1-D non-negative integer x, the count
    (or the sum of the weights) of each value 0..max(minlength, max(x) + 1) - 1; int64 counts,
    float32 sums for float32 weights, else float64 (an empty x gives int64 zeros, as in torch)."""

    def forward(self, x, weights=None, minlength=0):
        xp, dev = self.xp, self.device
        ml = 0 if minlength is None else _int(minlength, "minlength", self.where)
        if ml < 0:
            raise ShapeError(f"{self.where}: minlength={ml}; it should be >= 0")
        if not hasattr(x, "dtype") or x.dtype == xp.bool or not xp.isdtype(x.dtype, "integral") or x.ndim != 1:
            raise ShapeError(f"{self.where}: bincount needs a 1-D non-negative integer input, found "
                             f"{getattr(x, 'dtype', type(x).__name__)} of shape {tuple(getattr(x, 'shape', ()))}")
        if weights is not None and (not hasattr(weights, "shape") or tuple(weights.shape) != tuple(x.shape)):
            raise ShapeError(f"{self.where}: weights should be 1-D with the input's length {x.shape[0]}, found "
                             f"shape {tuple(getattr(weights, 'shape', ()))}")
        n = x.shape[0]
        if n == 0:
            return xp.zeros((ml,), dtype=xp.int64, device=dev)
        xi = xp.astype(x, xp.int64)
        lo = int(xp.min(xi))
        if lo < 0:
            raise ShapeError(f"{self.where}: bincount needs non-negative values, found {lo}")
        size = max(ml, int(xp.max(xi)) + 1)
        if weights is None:  # (a scatter of ones: numpy's ufunc.at, not a sort of every value)
            return segment_scatter(xp, xp.zeros((size,), dtype=xp.int64, device=dev), xi,
                                   xp.ones((n,), dtype=xp.int64, device=dev), "sum", True, dev, self.backend.fast)
        wdt = xp.float32 if weights.dtype == xp.float32 else xp.float64
        w = weights if weights.dtype == wdt else xp.astype(weights, wdt)
        return segment_scatter(xp, xp.zeros((size,), dtype=wdt, device=dev), xi, w, "sum", True, dev, self.backend.fast)
