"""Shape and data-movement layers: flatten, reshape, permute, concat, split, slice, squeeze, ...

Parameters are read once at build. Whatever depends on the runtime input shape (negative dims,
slice bounds, split boundaries, ``-1`` in a reshape) is computed on the first call for a shape
and kept in a small per-layer cache keyed by that shape, so a steady-state call costs one dict
look-up plus the array operation. Filling the cache is idempotent, so concurrent calls are safe.

A parameter pnnx could not fold (a dynamic reshape target, slice bound or select index) arrives
as an extra input named ``$shape``, ``$end``, ``$starts``, ``$index``, ...: a Python int or list
of ints from a ``pnnx.Expression`` / ``pnnx.SliceIndexes`` op, or a 0-d / 1-d integer array.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.expression.functions import astype_wrapping

from .base import BuildContext, Layer
from .registry import register

#: slice bounds at or beyond this mean "to the end" (pnnx writes INT_MAX or INT64_MAX)
END = 2147483647
_CACHE_MAX = 64


# -- helpers shared with reduce.py -----------------------------------------------------------------
class ShapeLayer(Layer):
    """A layer with a per-input-shape cache of derived indices/shapes."""

    #: True for layers whose output is their (single) input reshaped, the same elements in the
    #: same order (a view of a contiguous input): the runtime may then lay out the input of such
    #: a layer inside the concatenation that its output is a piece of
    is_reshape = False

    def __init__(self, ctx: BuildContext):
        super().__init__(ctx)
        self._cache: dict[Any, Any] = {}

    @property
    def who(self) -> str:
        return f"{self.op_type} {self.op_name!r}"

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        v = self._cache.get(key)
        if v is None:
            v = make()
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = v
        return v


def _mixed_dtypes(xs: Sequence[Any]) -> bool:
    """Whether the arrays differ in dtype (compared as objects: str() of a numpy dtype costs ~3 us,
    most of a small stack's time)."""
    d0 = xs[0].dtype
    return any(a.dtype != d0 for a in xs[1:])


def norm_dim(d: int, ndim: int, who: str, what: str = "dim") -> int:
    """``d`` in [0, ndim); ShapeError naming the op when out of range."""
    if not -ndim <= d < ndim:
        raise ShapeError(f"{who}: {what} {d} is out of range for an input with {ndim} dimension(s)")
    return d + ndim if d < 0 else d


def norm_dims(dims: Sequence[int], ndim: int, who: str, what: str = "dim") -> tuple[int, ...]:
    out = tuple(norm_dim(d, ndim, who, what) for d in dims)
    if len(set(out)) != len(out):
        raise ShapeError(f"{who}: {what} {tuple(dims)} repeats a dimension")
    return out


def _one_int(v: Any, who: str, what: str) -> int:
    if isinstance(v, bool):
        raise ShapeError(f"{who}: {what} should be an integer, found {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if hasattr(v, "shape") and len(v.shape) == 0:
        dt = str(v.dtype)
        if "int" in dt:
            return int(v)
        if "float" in dt and float(v).is_integer():
            return int(float(v))
    raise ShapeError(f"{who}: {what} should be an integer, found {v!r}")


def runtime_ints(value: Any, who: str, what: str) -> tuple[int, ...]:
    """A runtime parameter (python int/list/tuple, 0-d or 1-d integer array) as a tuple of ints."""
    if isinstance(value, (list, tuple)):
        items: Sequence[Any] = value
    elif hasattr(value, "shape"):
        if len(value.shape) == 0:
            items = [value]
        elif len(value.shape) == 1:
            items = [value[i] for i in range(value.shape[0])]
        else:
            raise ShapeError(f"{who}: {what} should be a list of integers, found an array of shape "
                             f"{tuple(value.shape)}")
    else:
        items = [value]
    return tuple(_one_int(v, who, what) for v in items)


def runtime_flag(v: Any, who: str, what: str) -> bool:
    """A bool argument arriving as an input (keepdim, upper, left): a Python bool, an int, or a
    0-d array; None is False."""
    if v is None:
        return False
    if isinstance(v, bool):
        return v
    return bool(runtime_int(v, who, what))


def runtime_int(value: Any, who: str, what: str) -> int:
    v = runtime_ints(value, who, what)
    if len(v) != 1:
        raise ShapeError(f"{who}: {what} should be one integer, found {v!r}")
    return v[0]


def input_slots(op, keys: Sequence[str]) -> dict[str, int]:
    """Positions of the op's inputs named ``$key`` for the given keys (dynamic parameters)."""
    return {name: i for i, name in enumerate(op.input_names) if name in keys}


def number_as(xp: Any, v: Any, dtype: Any) -> Any:
    """A Python number cast to ``dtype``'s kind as torch casts a number written into a tensor:
    bool for bool, truncated toward zero for integers (2.7 -> 2), unchanged for floats."""
    if dtype == xp.bool:
        return bool(v)
    if not xp.isdtype(dtype, ("real floating", "complex floating")):
        return int(v)
    return v


def out_dtype(op, k: int = 0) -> str | None:
    """The Array API dtype name of output ``k`` as annotated in the file, or None."""
    return op.outputs[k].array_dtype if len(op.outputs) > k else None


def dtype_name(dt: Any) -> str:
    return str(dt).rsplit(".", 1)[-1]


def _resolve_shape(target: Sequence[int], numel: int, in_shape: tuple[int, ...], who: str) -> tuple[int, ...]:
    """torch's view/reshape rule: at most one -1, inferred; every other size >= 0. One exception:
    pnnx writes ``batch * heads`` of a dynamic batch as ``-heads`` (``(-4,16,16)``: DistilBERT's
    mask reshaped for ``nn.MultiheadAttention`` at a fixed length; its own Python fails on it), so
    a single ``-k`` with no -1 beside it is inferred too, and must come out a multiple of k; and a
    single 0 in the target of a non-empty input (a data-dependent size pnnx froze at its
    example's 0) is inferred as a -1 would be."""
    neg = [i for i, s in enumerate(target) if s < 0]
    if len(neg) > 1:
        raise ShapeError(f"{who}: invalid target shape {tuple(target)} (only one -1 allowed, no other "
                         f"negative sizes)")
    known = math.prod(s for s in target if s >= 0)
    if neg:
        k = -target[neg[0]]
        if known == 0 or numel % known or (numel // known) % k:
            raise ShapeError(f"{who}: cannot reshape an input of shape {in_shape} ({numel} elements) to "
                             f"{tuple(target)}" + (f" (-{k}: {k} times the dynamic size)" if k > 1 else ""))
        t = list(target)
        t[neg[0]] = numel // known
        return tuple(t)
    zeros = [i for i, s in enumerate(target) if s == 0]
    if known != numel and numel and len(zeros) == 1:
        # a data-dependent size pnnx froze at the example's 0 (HF Mixtral's
        # x[None, tok].reshape(-1, d) after a torch.where: it writes shape=(0,8)); torch never
        # reshapes a non-empty tensor to no elements, so that 0 can only be the inferred size
        rest = math.prod(s for s in target if s != 0)
        if numel % rest == 0:
            t = list(target)
            t[zeros[0]] = numel // rest
            return tuple(t)
    if known != numel:
        raise ShapeError(f"{who}: cannot reshape an input of shape {in_shape} ({numel} elements) to "
                         f"{tuple(target)} ({known} elements)")
    return tuple(target)


# -- flatten / reshape -----------------------------------------------------------------------------
@register("torch.flatten", "Tensor.flatten", "nn.Flatten")
class Flatten(ShapeLayer):
    """Merge dims start_dim..end_dim into one (nn.Flatten defaults to start_dim=1)."""

    is_reshape = True

    def __init__(self, ctx: BuildContext, start: int, end: int):
        super().__init__(ctx)
        self.start, self.end = start, end

    @classmethod
    def from_operator(cls, op, ctx):
        default = 1 if op.type == "nn.Flatten" else 0
        return cls(ctx, op.param("start_dim", int, default), op.param("end_dim", int, -1))

    def _target(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        nd = max(len(shape), 1)
        s = norm_dim(self.start, nd, self.who, "start_dim")
        e = norm_dim(self.end, nd, self.who, "end_dim")
        if s > e:
            raise ShapeError(f"{self.who}: start_dim {self.start} comes after end_dim {self.end} for an "
                             f"input of shape {shape}")
        if not shape:
            return (1,)
        return shape[:s] + (math.prod(shape[s:e + 1]),) + shape[e + 1:]

    def forward(self, x: Any) -> Any:
        shape = tuple(x.shape)
        return self.xp.reshape(x, self.cached(shape, lambda: self._target(shape)))


@register("Tensor.unflatten", "torch.unflatten", "nn.Unflatten")
class Unflatten(ShapeLayer):
    """Split dim ``dim`` into ``sizes`` (one of them may be -1)."""

    is_reshape = True

    def __init__(self, ctx: BuildContext, dim: int, sizes: tuple[int, ...]):
        super().__init__(ctx)
        self.dim, self.sizes = dim, sizes

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) >= 2:  # sizes computed in the model (``$sizes``, a pnnx.Expression)
            return cls(ctx, op.param("dim", int), None)
        key = "unflattened_size" if op.has_param("unflattened_size") else "sizes"
        return cls(ctx, op.param("dim", int), op.param(key, (int,)))

    def _target(self, shape: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, ...]:
        d = norm_dim(self.dim, len(shape), self.who)
        mid = _resolve_shape(sizes, shape[d], shape, self.who)
        return shape[:d] + mid + shape[d + 1:]

    def forward(self, x: Any, sizes: Any = None) -> Any:
        shape = tuple(x.shape)
        if sizes is not None:
            return self.xp.reshape(x, self._target(shape, runtime_ints(sizes, self.who, "the sizes")))
        return self.xp.reshape(x, self.cached(shape, lambda: self._target(shape, self.sizes)))


@register("Tensor.reshape", "Tensor.view", "torch.reshape")
class Reshape(ShapeLayer):
    """torch's reshape/view: ``shape`` (may hold one -1), or a second input carrying the target
    (a list of ints built by a ``pnnx.Expression`` such as ``[int(size(@0,0)),-1,...]``)."""

    is_reshape = True

    def __init__(self, ctx: BuildContext, shape: tuple[int, ...] | None):
        super().__init__(ctx)
        self.shape = shape

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) >= 2:
            return cls(ctx, None)
        if op.has_param("shape") and op.params["shape"] is None:  # pnnx's spelling of view([]): 0-d
            return cls(ctx, ())
        return cls(ctx, op.param("shape", (int,)))

    def forward(self, x: Any, shape: Any = None) -> Any:
        in_shape = tuple(x.shape)
        if shape is None:
            target = self.cached(in_shape, lambda: _resolve_shape(self.shape, math.prod(in_shape), in_shape,
                                                                   self.who))
        else:
            target = _resolve_shape(runtime_ints(shape, self.who, "the target shape"), math.prod(in_shape),
                                    in_shape, self.who)
        return self.xp.reshape(x, target)


@register("torch.as_strided", "Tensor.as_strided")
class AsStrided(ShapeLayer):
    """``torch.as_strided(x, size, stride, storage_offset)``: element ``(i0, i1, ...)`` of the
    result is element ``storage_offset + sum(i_k * stride_k)`` of ``x`` read in row-major order
    (what torch's strides index when ``x`` is contiguous, the usual case: torch's own layout of a
    non-contiguous operand is not known here). Computed as one gather of those flat positions
    (cached per shape), so it works on every backend; a window that would read outside ``x`` is a
    ShapeError, as torch refuses it. ``size`` and ``stride`` may be parameters or runtime operands
    (``$size``, ``$stride``)."""

    def __init__(self, ctx: BuildContext, size, stride, offset, slots: dict[str, int]):
        super().__init__(ctx)
        self.size, self.stride, self.offset, self.slots = size, stride, offset, slots

    @classmethod
    def from_operator(cls, op, ctx):
        slots = input_slots(op, ("input", "size", "stride", "storage_offset"))
        slots.setdefault("input", 0)

        def fixed(key):
            if key in slots or not op.has_param(key):
                return None
            return op.param(key, (int,)) if key != "storage_offset" else op.param(key, int, None)
        size, stride = fixed("size"), fixed("stride")
        for key, v in (("size", size), ("stride", stride)):
            if v is None and key not in slots:
                raise LayerParameterError(f"{op.where}: '{key}' is neither a parameter nor an input")
        return cls(ctx, size, stride, fixed("storage_offset"), slots)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x = inputs[self.slots["input"]]

        def given(key, default):
            if key in self.slots:
                v = inputs[self.slots[key]]
                return None if v is None else runtime_ints(v, self.who, key)
            return default
        size, stride = given("size", self.size), given("stride", self.stride)
        off = given("storage_offset", None if self.offset is None else (self.offset,))
        if size is None or stride is None or (off is not None and len(off) != 1):
            raise ShapeError(f"{self.who}: expected size and stride lists and one storage_offset, found "
                             f"{size}, {stride}, {off}")
        offset = 0 if off is None else off[0]
        key = (tuple(x.shape), tuple(size), tuple(stride), offset)
        flat = self.cached(key, lambda: self._positions(math.prod(x.shape), tuple(size), tuple(stride), offset))
        if flat is None:  # an empty result
            return xp.zeros(tuple(size), dtype=x.dtype, device=self.device)
        return xp.reshape(xp.take(xp.reshape(x, (-1,)), flat, axis=0), tuple(size))

    def _positions(self, n: int, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Any:
        """The flat positions the result reads, as an int64 array (None for an empty result)."""
        xp = self.xp
        if len(size) != len(stride):
            raise ShapeError(f"{self.who}: size {size} and stride {stride} have different lengths")
        if any(v < 0 for v in size) or any(v < 0 for v in stride) or offset < 0:
            raise ShapeError(f"{self.who}: size {size}, stride {stride} and storage_offset {offset} must be "
                             "non-negative (torch refuses negative strides too)")
        if math.prod(size) == 0:
            return None
        last = offset + sum((s - 1) * st for s, st in zip(size, stride))
        if last >= n:
            raise ShapeError(f"{self.who}: size {size}, stride {stride} and storage_offset {offset} read "
                             f"element {last}, past the input's {n} elements")
        pos = xp.asarray(offset, dtype=xp.int64, device=self.device)
        for s, st in zip(size, stride):
            pos = pos[..., None] + xp.arange(s, dtype=xp.int64, device=self.device) * st
        return xp.reshape(pos, (-1,))


# -- axis permutations -----------------------------------------------------------------------------
@register("Tensor.permute", "torch.permute")
class Permute(ShapeLayer):
    def __init__(self, ctx: BuildContext, dims: tuple[int, ...]):
        super().__init__(ctx)
        self.dims = dims
        n = len(dims)
        norm = tuple(d + n if d < 0 else d for d in dims)
        self.perm = norm if sorted(norm) == list(range(n)) else None

    @classmethod
    def from_operator(cls, op, ctx):
        dims = op.param("dims", (int,))
        layer = cls(ctx, dims)
        if layer.perm is None:
            raise LayerParameterError(f"{op.where}: parameter 'dims' should be a permutation, found {dims!r}")
        return layer

    def forward(self, x: Any) -> Any:
        if x.ndim != len(self.dims):
            raise ShapeError(f"{self.who}: dims {self.dims} do not fit an input of shape {tuple(x.shape)}")
        return self.xp.permute_dims(x, self.perm)


@register("torch.transpose", "Tensor.transpose", "torch.swapaxes", "torch.swapdims")
class Transpose(ShapeLayer):
    """Swap two dims."""

    def __init__(self, ctx: BuildContext, dim0: int, dim1: int):
        super().__init__(ctx)
        self.dim0, self.dim1 = dim0, dim1

    @classmethod
    def from_operator(cls, op, ctx):
        if op.has_param("dim0"):
            return cls(ctx, op.param("dim0", int), op.param("dim1", int))
        return cls(ctx, op.param("axis0", int), op.param("axis1", int))

    def _perm(self, nd: int) -> tuple[int, ...]:
        a, b = norm_dim(self.dim0, nd, self.who, "dim0"), norm_dim(self.dim1, nd, self.who, "dim1")
        p = list(range(nd))
        p[a], p[b] = p[b], p[a]
        return tuple(p)

    def forward(self, x: Any) -> Any:
        nd = x.ndim
        return self.xp.permute_dims(x, self.cached(nd, lambda: self._perm(nd)))


def swaps_last_two(layer: Any, ndim: int) -> bool:
    """Whether ``layer`` is a Permute / Transpose that swaps the last two axes of an ndim-D input
    and nothing else."""
    if ndim < 2:
        return False
    if type(layer) is Permute:
        return layer.perm == tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)
    if type(layer) is Transpose:
        return {layer.dim0 % ndim, layer.dim1 % ndim} == {ndim - 2, ndim - 1}
    return False


@register("nn.ChannelShuffle", "F.channel_shuffle", "torch.channel_shuffle", "torch.native_channel_shuffle")
class ChannelShuffle(ShapeLayer):
    """(N, C, *) -> (N, g, C/g, *) -> swap 1, 2 -> (N, C, *)."""

    def __init__(self, ctx: BuildContext, groups: int):
        super().__init__(ctx)
        self.groups = groups

    @classmethod
    def from_operator(cls, op, ctx):
        g = op.param("groups", int)
        if g < 1:
            raise LayerParameterError(f"{op.where}: parameter 'groups' should be >= 1, found {g!r}")
        return cls(ctx, g)

    def _plan(self, shape: tuple[int, ...]):
        if len(shape) < 2 or shape[1] % self.groups:
            raise ShapeError(f"{self.who}: {shape[1] if len(shape) > 1 else '?'} channels of an input of "
                             f"shape {shape} do not split into {self.groups} groups")
        g = self.groups
        split = (shape[0], g, shape[1] // g) + shape[2:]
        perm = (0, 2, 1) + tuple(range(3, len(split)))
        return split, perm

    def forward(self, x: Any) -> Any:
        xp = self.xp
        shape = tuple(x.shape)
        split, perm = self.cached(shape, lambda: self._plan(shape))
        return xp.reshape(xp.permute_dims(xp.reshape(x, split), perm), shape)


# -- joining ---------------------------------------------------------------------------------------
@register("torch.cat", "torch.concat", "torch.concatenate")
class Cat(ShapeLayer):
    """Concatenate all inputs along ``dim``; mixed dtypes are cast to the annotated output dtype."""

    def __init__(self, ctx: BuildContext, dim: int, dtype: str | None):
        super().__init__(ctx)
        self.dim, self.dtype = dim, dtype
        self._fast = getattr(ctx.fast, "concat", None)
        self._into = getattr(ctx.fast, "concat_into", None)

    @classmethod
    def from_operator(cls, op, ctx):
        key = "axis" if op.has_param("axis") and not op.has_param("dim") else "dim"
        return cls(ctx, op.param(key, int, 0), out_dtype(op))

    def piece_plan(self, xs: tuple) -> tuple | None:
        """``(axis, dtype, shapes)`` of this call's inputs, from which the runtime lays out the
        output before the next call with the same graph inputs, so that the layers producing
        the pieces write them in place (see ``Graph``); None when the backend cannot."""
        if self._into is None or len(xs) < 2 or _mixed_dtypes(xs):
            return None
        nd = xs[0].ndim
        if nd == 0 or any(a.ndim != nd for a in xs):
            return None
        return norm_dim(self.dim, nd, self.who), xs[0].dtype, tuple(tuple(a.shape) for a in xs)

    def forward_into(self, buf: Any, axis: int, *xs: Any) -> Any:
        """The concatenation into ``buf`` laid out from :meth:`piece_plan` (pieces already in
        place are not copied); the plain forward when the inputs do not fit it."""
        out = self._into(buf, xs, axis) if self._into is not None else None
        return self.forward(*xs) if out is None else out

    def forward(self, *xs: Any) -> Any:
        xp = self.xp
        if _mixed_dtypes(xs):
            dt = getattr(xp, self.dtype) if self.dtype else xp.result_type(*xs)
            xs = tuple(a if a.dtype == dt else xp.astype(a, dt) for a in xs)
        nd = xs[0].ndim
        if any(a.ndim != nd for a in xs):
            raise ShapeError(f"{self.who}: inputs of shapes {[tuple(a.shape) for a in xs]} have different ranks")
        d = norm_dim(self.dim, nd, self.who)
        if self._fast is not None:
            out = self._fast(xs, d)
            if out is not None:
                return out
        try:
            return xp.concat(list(xs), axis=d)
        except ValueError as exc:
            raise ShapeError(f"{self.who}: cannot concatenate shapes {[tuple(a.shape) for a in xs]} along "
                             f"dim {self.dim}: {exc}") from exc


@register("torch.stack")
class Stack(Cat):
    """Stack inputs along a new dim ``dim``."""

    def piece_plan(self, xs: tuple) -> tuple | None:
        return None

    def forward(self, *xs: Any) -> Any:
        xp = self.xp
        if _mixed_dtypes(xs):
            dt = getattr(xp, self.dtype) if self.dtype else xp.result_type(*xs)
            xs = tuple(a if a.dtype == dt else xp.astype(a, dt) for a in xs)
        shapes = {tuple(a.shape) for a in xs}
        if len(shapes) != 1:
            raise ShapeError(f"{self.who}: cannot stack inputs of different shapes {[tuple(a.shape) for a in xs]}")
        d = norm_dim(self.dim, xs[0].ndim + 1, self.who)
        return xp.stack(list(xs), axis=d)


# -- splitting (several outputs) -------------------------------------------------------------------
class _Split(ShapeLayer):
    """Base: subclasses give the (start, stop) pieces of dim ``d`` of size ``n``."""

    def __init__(self, ctx: BuildContext, dim: int, n_out: int):
        super().__init__(ctx)
        self.dim, self.n_out = dim, n_out

    def _bounds(self, n: int) -> list[tuple[int, int]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _keys(self, shape: tuple[int, ...], bounds_of: Any = None) -> tuple[tuple[Any, ...], ...]:
        d = norm_dim(self.dim, len(shape), self.who)
        bounds = (bounds_of or self._bounds)(shape[d])
        if len(bounds) != self.n_out:
            raise ShapeError(f"{self.who}: splitting dim {self.dim} of size {shape[d]} (input shape {shape}) "
                             f"gives {len(bounds)} pieces {[b - a for a, b in bounds]}, the op has "
                             f"{self.n_out} outputs")
        head = (slice(None),) * d
        tail = (slice(None),) * (len(shape) - d - 1)
        return tuple(head + (slice(a, b),) + tail for a, b in bounds)

    def forward(self, x: Any) -> Any:
        shape = tuple(x.shape)
        keys = self.cached(shape, lambda: self._keys(shape))
        if self.n_out == 1:  # one piece: the op's one output is that array
            return x[keys[0]]
        return tuple(x[k] for k in keys)


@register("torch.chunk", "Tensor.chunk")
class Chunk(_Split):
    """torch.chunk: pieces of ceil(n / chunks); the last may be smaller (or there may be fewer)."""

    def __init__(self, ctx: BuildContext, dim: int, n_out: int, chunks: int):
        super().__init__(ctx, dim, n_out)
        self.chunks = chunks

    @classmethod
    def from_operator(cls, op, ctx):
        chunks = op.param("chunks", int)
        if chunks < 1:
            raise LayerParameterError(f"{op.where}: parameter 'chunks' should be >= 1, found {chunks!r}")
        return cls(ctx, op.param("dim", int, 0), len(op.outputs), chunks)

    def _bounds(self, n: int) -> list[tuple[int, int]]:
        return chunk_bounds(n, self.chunks)


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """torch.chunk's pieces of a dim of size n: ceil(n / chunks) each, the last smaller."""
    if n == 0:
        return [(0, 0)] * chunks
    step = -(-n // chunks)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


@register("aten::unsafe_chunk", "aten::chunk")
class AtenChunk(ShapeLayer):
    """``aten::unsafe_chunk(input, chunks, dim)`` as pnnx leaves it inside traced RNN cells
    (``nn.GRUCell``, ``nn.LSTMCell``): chunks and dim arrive as inputs (constant expressions) and
    the result is one value, a list of the pieces, taken apart by a ``prim::ListUnpack``."""

    def forward(self, x: Any, chunks: Any, dim: Any = 0) -> list[Any]:
        k, d = runtime_int(chunks, self.who, "chunks"), runtime_int(dim, self.who, "dim")
        if k < 1:
            raise ShapeError(f"{self.who}: chunks={k} should be >= 1")
        d = norm_dim(d, x.ndim, self.who)
        head = (slice(None),) * d
        return [x[head + (slice(a, b),)] for a, b in chunk_bounds(x.shape[d], k)]


@register("prim::ListUnpack", "prim::TupleUnpack")
class ListUnpack(ShapeLayer):
    """The items of a list value (``aten::unsafe_chunk``'s pieces, a list expression) or of a
    tuple (``nn.AdaptiveMaxPool2d(..., return_indices=True)``'s (values, indices), which pnnx
    leaves as one value) as the operator's outputs; their number must match."""

    def __init__(self, ctx: BuildContext, n_out: int):
        super().__init__(ctx)
        self.n_out = n_out

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, len(op.outputs))

    def forward(self, items: Any) -> Any:
        if not isinstance(items, (list, tuple)):
            raise ShapeError(f"{self.who}: expected a list to unpack, found {type(items).__name__}")
        if len(items) != self.n_out:
            raise ShapeError(f"{self.who}: a list of {len(items)} items for {self.n_out} outputs")
        return items[0] if self.n_out == 1 else tuple(items)


@register("torch.split", "Tensor.split", "Tensor.split_with_sizes", "torch.split_with_sizes")
class Split(_Split):
    """torch.split: an int piece size (last piece smaller) or a list of sizes summing to the dim.
    The sizes may come as an input (``$split_size_or_sections``: pnnx's form for sizes computed
    from a dynamic shape, ``torch.split(x, [1, x.shape[1] - 1], 1)``)."""

    _KEYS = ("split_size_or_sections", "split_sizes", "split_size")

    def __init__(self, ctx: BuildContext, dim: int, n_out: int, sections: tuple[int, ...] | None,
                 is_list: bool, slot: int | None = None):
        super().__init__(ctx, dim, n_out)
        self.sections, self.is_list, self.slot = sections, is_list, slot

    @classmethod
    def from_operator(cls, op, ctx):
        dim, n_out = op.param("dim", int, 0), len(op.outputs)
        slots = input_slots(op, cls._KEYS)
        if slots:
            slot = min(slots.values())
            if slot == 0:
                raise LayerParameterError(f"{op.where}: the split sizes are the first input; expected the tensor")
            return cls(ctx, dim, n_out, None, True, slot)
        key = next((k for k in cls._KEYS if op.has_param(k)), "split_size_or_sections")
        raw = op.param(key)
        is_list = isinstance(raw, (list, tuple))
        sections = op.param(key, (int,))
        if not sections:
            raise LayerParameterError(f"{op.where}: parameter {key!r} is empty ({raw!r}); it needs a size or sizes")
        if any(s < 0 for s in sections) or (not is_list and sections[0] < 1):
            raise LayerParameterError(f"{op.where}: parameter {key!r} has invalid sizes {raw!r}")
        return cls(ctx, dim, n_out, sections, is_list)

    def forward(self, x: Any, *extra: Any) -> Any:
        if self.slot is None:
            return super().forward(x)
        if len(extra) < self.slot:
            raise ShapeError(f"{self.who}: the split sizes (input {self.slot}) are missing")
        raw = extra[self.slot - 1]
        sizes = runtime_ints(raw, self.who, "split_size_or_sections")
        is_list = isinstance(raw, (list, tuple)) or len(getattr(raw, "shape", ())) > 0
        if any(v < 0 for v in sizes) or (not is_list and sizes[0] < 1):
            raise ShapeError(f"{self.who}: invalid split sizes {list(sizes)}")
        keys = self._keys(tuple(x.shape), lambda n: self._split_bounds(n, sizes, is_list))
        if self.n_out == 1:
            return x[keys[0]]
        return tuple(x[k] for k in keys)

    def _bounds(self, n: int) -> list[tuple[int, int]]:
        return self._split_bounds(n, self.sections, self.is_list)

    def _split_bounds(self, n: int, sections: Any, is_list: bool) -> list[tuple[int, int]]:
        if not is_list:
            s = sections[0]
            return [(a, min(a + s, n)) for a in range(0, n, s)] or [(0, 0)]
        if sum(sections) != n:
            raise ShapeError(f"{self.who}: split sizes {list(sections)} sum to {sum(sections)}, "
                             f"but dim {self.dim} has size {n}")
        out, a = [], 0
        for s in sections:
            out.append((a, a + s))
            a += s
        return out


@register("torch.tensor_split", "Tensor.tensor_split")
class TensorSplit(_Split):
    """torch.tensor_split: ``sections`` (first n % s pieces one longer) or ``indices`` (cut points)."""

    def __init__(self, ctx: BuildContext, dim: int, n_out: int, sections: int | None,
                 indices: tuple[int, ...] | None):
        super().__init__(ctx, dim, n_out)
        self.sections, self.indices = sections, indices

    @classmethod
    def from_operator(cls, op, ctx):
        dim = op.param("dim", int, 0)
        if op.has_param("indices"):
            return cls(ctx, dim, len(op.outputs), None, op.param("indices", (int,)))
        s = op.param("sections", int)
        if s < 1:
            raise LayerParameterError(f"{op.where}: parameter 'sections' should be >= 1, found {s!r}")
        return cls(ctx, dim, len(op.outputs), s, None)

    def _bounds(self, n: int) -> list[tuple[int, int]]:
        if self.sections is not None:
            q, r = divmod(n, self.sections)
            out, a = [], 0
            for i in range(self.sections):
                b = a + q + (1 if i < r else 0)
                out.append((a, b))
                a = b
            return out
        cuts = [0] + [slice(i).indices(n)[1] for i in self.indices] + [n]
        out = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            out.append((a, max(a, b)))
        return out


@register("torch.unbind", "Tensor.unbind")
class Unbind(ShapeLayer):
    """One output per index of ``dim``, with that dim removed."""

    def __init__(self, ctx: BuildContext, dim: int, n_out: int):
        super().__init__(ctx)
        self.dim, self.n_out = dim, n_out

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("dim", int, 0), len(op.outputs))

    def _keys(self, shape: tuple[int, ...]):
        d = norm_dim(self.dim, len(shape), self.who)
        if shape[d] != self.n_out:
            raise ShapeError(f"{self.who}: dim {self.dim} of an input of shape {shape} has size {shape[d]}, "
                             f"the op has {self.n_out} outputs")
        head = (slice(None),) * d
        return tuple(head + (i, ...) for i in range(shape[d]))

    def forward(self, x: Any) -> Any:
        shape = tuple(x.shape)
        keys = self.cached(shape, lambda: self._keys(shape))
        if self.n_out == 1:  # pnnx writes x[0] / x[-1] on a dim of size 1 as a one-output unbind
            return x[keys[0]]
        return tuple(x[k] for k in keys)


# -- slicing ---------------------------------------------------------------------------------------
def _slice_key(n: int, start: int, end: int, step: int, who: str, d: int) -> slice:
    if step < 1:
        raise ShapeError(f"{who}: slice step {step} on dim {d} should be >= 1")
    a, b, _ = slice(start, None if end >= END else end, step).indices(n)
    return slice(a, max(a, b), step)


def _select_key(n: int, index: int, who: str, d: int) -> int:
    if not -n <= index < n:
        raise ShapeError(f"{who}: index {index} is out of range for dim {d} of size {n}")
    return index + n if index < 0 else index


_SLICE1 = ("dim", "start", "end", "step", "select")
_SLICEN = ("dims", "starts", "ends", "steps", "selects")


@register("Tensor.slice")
class Slice(ShapeLayer):
    """``x[..., start:end:step, ...]`` on one dim (``dim/start/end/step``; a ``select`` other than
    INT_MAX picks one index and drops the dim) or several (``dims/starts/ends/steps/selects``: a
    ``selects`` entry other than INT_MAX does the same). Dims are those of the input. End >= 2147483647 means "to the end"; negative
    starts/ends count from the end and are clamped, as in Python. Any parameter may instead come as
    an input (``$end``, ``$starts``, ...)."""

    def __init__(self, ctx: BuildContext, multi: bool, params: dict[str, Any], slots: dict[str, int]):
        super().__init__(ctx)
        self.multi, self.params, self.slots = multi, params, slots

    @classmethod
    def from_operator(cls, op, ctx):
        multi = any(op.has_param(k) for k in _SLICEN) or any(n in _SLICEN for n in op.input_names)
        keys = _SLICEN if multi else _SLICE1
        slots = input_slots(op, keys)
        params: dict[str, Any] = {}
        for k in keys:
            if k in slots:
                continue
            if multi:
                params[k] = op.param(k, (int,), None)
            else:
                params[k] = op.param(k, int, None)
        if multi:
            if params.get("dims") is None and "dims" not in slots:
                raise LayerParameterError(f"{op.where}: parameter 'dims' is missing")
            if "dims" not in slots and len(set(params["dims"])) != len(params["dims"]):
                raise LayerParameterError(f"{op.where}: parameter 'dims' repeats a dim: {params['dims']!r}")
        elif params.get("dim") is None and "dim" not in slots:
            raise LayerParameterError(f"{op.where}: parameter 'dim' is missing")
        return cls(ctx, multi, params, slots)

    def _values(self, extra: tuple[Any, ...]) -> dict[str, Any]:
        vals = dict(self.params)
        for k, i in self.slots.items():
            v = extra[i - 1]
            vals[k] = runtime_ints(v, self.who, k) if self.multi else runtime_int(v, self.who, k)
        return vals

    def _key(self, shape: tuple[int, ...], vals: dict[str, Any]) -> tuple[Any, ...]:
        nd = len(shape)
        key: list[Any] = [slice(None)] * nd
        if not self.multi:
            d = norm_dim(vals["dim"], nd, self.who)
            sel = vals.get("select")
            if sel is not None and sel < END:  # (pnnx's Tensor.slice_copy for x[:, i] = y: step=0)
                key[d] = _select_key(shape[d], sel, self.who, d)
                return tuple(key)
            start = 0 if vals.get("start") is None else vals["start"]
            end = END if vals.get("end") is None else vals["end"]
            step = 1 if vals.get("step") is None else vals["step"]
            key[d] = _slice_key(shape[d], start, end, step, self.who, d)
            return tuple(key)
        dims = vals["dims"]
        m = len(dims)

        def get(k: str, default: int) -> tuple[int, ...]:
            v = vals.get(k)
            if v is None:
                return (default,) * m
            if len(v) != m:
                raise ShapeError(f"{self.who}: {k} {v} should have {m} entries like dims {dims}")
            return v

        starts, ends, steps, selects = get("starts", 0), get("ends", END), get("steps", 1), get("selects", END)
        for d, a, b, s, sel in zip(norm_dims(dims, nd, self.who), starts, ends, steps, selects):
            if sel < END:
                key[d] = _select_key(shape[d], sel, self.who, d)
            else:
                key[d] = _slice_key(shape[d], a, b, s, self.who, d)
        return tuple(key)

    def forward(self, x: Any, *extra: Any) -> Any:
        shape = tuple(x.shape)
        if extra:
            return x[self._key(shape, self._values(extra))]
        return x[self.cached(shape, lambda: self._key(shape, self.params))]


@register("Tensor.slice_copy")
class SliceCopy(Slice):
    """torch's in-place assignment into a slice (``x[..., a:b] = y``, ``x[:, 0] = y``), which
    pnnx writes as ``Tensor.slice_copy $self $src`` with :class:`Slice`'s parameters: a copy of
    ``self`` with ``src`` (broadcast to the slice, cast to self's dtype) written into the slice;
    ``self`` itself is not modified (other layers may share it). A number assigned (``y[0] = 0``
    on a tensor computed in ``forward``: TimesNet's ``frequency_list[0] = 0``) comes as the
    parameter ``src`` with no second input."""

    def __init__(self, ctx: BuildContext, multi: bool, params: dict[str, Any], slots: dict[str, int],
                 src: Any = None):
        super().__init__(ctx, multi, params, slots)
        self.src = src  # the number assigned, or None: the source is the second input

    @classmethod
    def from_operator(cls, op, ctx):
        layer = super().from_operator(op, ctx)
        src = op.params.get("src")
        if len(op.inputs) == 1 or (src is not None and "src" not in op.input_names):
            if not isinstance(src, (bool, int, float)):
                raise LayerParameterError(f"{op.where}: no source to assign: neither a second input nor a "
                                          f"number 'src' (found {src!r})")
            if len(op.inputs) != 1 + len(layer.slots):
                raise LayerParameterError(f"{op.where}: a number 'src'={src!r} and {len(op.inputs)} inputs; "
                                          f"expected the input and its {len(layer.slots)} named slice bound(s)")
            layer.src = src
        return layer

    def forward(self, x: Any, *rest: Any) -> Any:
        xp = self.xp
        shape = tuple(x.shape)
        if self.src is None:
            if not rest:
                raise ShapeError(f"{self.who}: no source to assign (the file gives no second input)")
            src, bounds = rest[0], len(rest) > 1
        else:
            src, bounds = None, bool(rest)
        if bounds:  # (rest[i - 1] is input i, as _values reads them)
            key = self._key(shape, self._values(rest))
        else:
            key = self.cached(shape, lambda: self._key(shape, self.params))
        out = xp.asarray(x, copy=True)
        if src is None:
            out[key] = xp.asarray(number_as(xp, self.src, out.dtype), dtype=out.dtype, device=self.device)
            return out
        target = out[key]
        try:
            value = xp.broadcast_to(src, tuple(target.shape))
        except Exception:  # noqa: BLE001 - the library's own broadcasting error
            raise ShapeError(f"{self.who}: the source of shape {tuple(src.shape)} does not fit the slice "
                             f"of shape {tuple(target.shape)} of an input of shape {shape}") from None
        if value.dtype != out.dtype:
            value = xp.astype(value, out.dtype)
        out[key] = value
        return out


@register("Tensor.select", "torch.select")
class Select(ShapeLayer):
    """``x[..., index, ...]`` on ``dim`` (the dim is dropped); ``index`` may be an input."""

    def __init__(self, ctx: BuildContext, dim: int, index: int | None, slot: int | None):
        super().__init__(ctx)
        self.dim, self.index, self.slot = dim, index, slot

    @classmethod
    def from_operator(cls, op, ctx):
        slot = input_slots(op, ("index",)).get("index")
        if slot is None and len(op.inputs) >= 2:
            slot = 1
        index = None if slot is not None else op.param("index", int)
        return cls(ctx, op.param("dim", int), index, slot)

    def _key(self, shape: tuple[int, ...], index: int) -> tuple[Any, ...]:
        d = norm_dim(self.dim, len(shape), self.who)
        return (slice(None),) * d + (_select_key(shape[d], index, self.who, d), ...)

    def forward(self, x: Any, *extra: Any) -> Any:
        shape = tuple(x.shape)
        if self.slot is not None:
            return x[self._key(shape, runtime_int(extra[self.slot - 1], self.who, "index"))]
        return x[self.cached(shape, lambda: self._key(shape, self.index))]


def _warn_folded_bound(op: Any, slots: dict[str, int], dim: int) -> None:
    """Warn when a narrow's start or length is a constant pnnx folded (a ``pnnx.Attribute``)
    while the narrowed dimension is dynamic: pnnx freezes ``y.size(d) - k`` of a computed tensor
    (a concatenation, a sum) to the first example's value (a streaming cache kept by
    ``cat([c, x], 1).narrow(1, size - 3, 3)``: right at that size only, silently)."""
    x = op.inputs[0].shape if op.inputs else None
    if x is None or not -len(x) <= dim < len(x) or x[dim] is not None:
        return
    for key in ("start", "length"):
        pos = slots.get(key)
        src = op.inputs[pos].producer if pos is not None else None
        if src is not None and src.type == "pnnx.Attribute":
            warnings.warn(
                f"{op.where}: its {key} is the constant {src.name!r} pnnx folded, while dim {dim} of its input "
                f"{op.inputs[0].shape_str()} is dynamic: pnnx freezes a size of a computed tensor (y.size(1) - 3 "
                "after a torch.cat) to the first example's value, so other sizes take the wrong elements. "
                "Slice with y[:, -3:], or take the size from a model input.", stacklevel=2)


@register("torch.narrow", "Tensor.narrow")
class Narrow(ShapeLayer):
    """``x[..., start:start+length, ...]`` on ``dim`` (negative start counts from the end);
    ``start`` and ``length`` parameters, or inputs computed from sizes (``x.narrow(1, 0,
    x.size(1) - 1)``: ``$length=...``)."""

    def __init__(self, ctx: BuildContext, dim: int, start: int | None, length: int | None,
                 slots: dict[str, int] | None = None):
        super().__init__(ctx)
        self.dim, self.start, self.length = dim, start, length
        self.slots = slots or {}

    @classmethod
    def from_operator(cls, op, ctx):
        slots = {k: v for k, v in input_slots(op, ("input", "start", "length")).items() if k != "input"}
        start = None if "start" in slots else op.param("start", int)
        length = None if "length" in slots else op.param("length", int)
        dim = op.param("dim", int)
        _warn_folded_bound(op, slots, dim)
        return cls(ctx, dim, start, length, slots)

    def _key(self, shape: tuple[int, ...], start: int, length: int) -> tuple[Any, ...]:
        d = norm_dim(self.dim, len(shape), self.who)
        n = shape[d]
        a = start + n if start < 0 else start
        if not 0 <= a <= n or length < 0 or a + length > n:
            raise ShapeError(f"{self.who}: narrow(start={start}, length={length}) does not fit dim "
                             f"{self.dim} of size {n}")
        return (slice(None),) * d + (slice(a, a + length), ...)

    def forward(self, x: Any, *extra: Any) -> Any:
        shape = tuple(x.shape)
        if self.slots:
            inputs = (x,) + extra
            start = self.start if self.start is not None else runtime_int(inputs[self.slots["start"]], self.who, "start")
            length = (self.length if self.length is not None
                      else runtime_int(inputs[self.slots["length"]], self.who, "length"))
            return x[self._key(shape, start, length)]
        return x[self.cached(shape, lambda: self._key(shape, self.start, self.length))]


@register("pnnx.SliceIndexes")
class SliceIndexes(ShapeLayer):
    """Builds the list of slice bounds for a dynamic ``Tensor.slice``: ``indexes=(@0,1)`` gives
    ``[int(input 0), 1]``."""

    def __init__(self, ctx: BuildContext, items: tuple[Any, ...]):
        super().__init__(ctx)
        self.items = items

    @classmethod
    def from_operator(cls, op, ctx):
        raw = op.param("indexes", list)
        items: list[Any] = []
        for v in raw:
            if isinstance(v, str) and v.startswith("@") and v[1:].isdigit():
                k = int(v[1:])
                if k >= len(op.inputs):
                    raise LayerParameterError(f"{op.where}: parameter 'indexes' refers to input {v}, the op "
                                              f"has {len(op.inputs)} input(s)")
                items.append(k)
            elif isinstance(v, int) and not isinstance(v, bool):
                items.append(("const", v))
            else:
                raise LayerParameterError(f"{op.where}: parameter 'indexes' has an entry {v!r} that is neither "
                                          f"an int nor @N")
        return cls(ctx, tuple(items))

    def forward(self, *inputs: Any) -> list[int]:
        return [it[1] if isinstance(it, tuple) else runtime_int(inputs[it], self.who, "index")
                for it in self.items]


# -- adding / removing unit dims -------------------------------------------------------------------
@register("torch.squeeze", "Tensor.squeeze")
class Squeeze(ShapeLayer):
    """Drop size-1 dims: all of them, or those listed in ``dim`` (a listed dim whose size is not 1
    is kept, as in torch)."""

    is_reshape = True

    def __init__(self, ctx: BuildContext, dims: tuple[int, ...] | None):
        super().__init__(ctx)
        self.dims = dims

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("dim", (int,), None))

    def _axes(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.dims is None:
            return tuple(i for i, s in enumerate(shape) if s == 1)
        if not shape:
            for d in self.dims:
                norm_dim(d, 1, self.who)
            return ()
        return tuple(d for d in norm_dims(self.dims, len(shape), self.who) if shape[d] == 1)

    def forward(self, x: Any) -> Any:
        shape = tuple(x.shape)
        axes = self.cached(shape, lambda: self._axes(shape))
        return self.xp.squeeze(x, axis=axes) if axes else x


@register("torch.unsqueeze", "Tensor.unsqueeze")
class Unsqueeze(ShapeLayer):
    """Insert a size-1 dim at ``dim`` (in [-ndim-1, ndim])."""

    is_reshape = True

    def __init__(self, ctx: BuildContext, dim: int):
        super().__init__(ctx)
        self.dim = dim

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("dim", int))

    def _target(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        d = norm_dim(self.dim, len(shape) + 1, self.who)
        return shape[:d] + (1,) + shape[d:]

    def forward(self, x: Any) -> Any:
        shape = tuple(x.shape)
        return self.xp.reshape(x, self.cached(shape, lambda: self._target(shape)))


# -- copies, repeats, broadcasts -------------------------------------------------------------------
@register("Tensor.contiguous", "Tensor.clone", "Tensor.detach", "torch.clone", "torch.detach", "aten::alias")
class Contiguous(Layer):
    """No-op: arrays here have no layout the next op must care about (clone: arrays are not
    written in place by any layer, so sharing is safe; ``aten::alias`` is pnnx's ``x[...]``)."""

    def forward(self, x: Any, *_: Any) -> Any:
        return x


@register("Tensor.expand", "Tensor.expand_as", "torch.broadcast_to", "Tensor.broadcast_to", "aten::broadcast_to")
class Expand(ShapeLayer):
    """Broadcast to ``sizes`` (-1 keeps a dim; extra leading dims allowed), to a ``$sizes`` input,
    or (expand_as) to the second input's shape."""

    def __init__(self, ctx: BuildContext, sizes: tuple[int, ...] | None, mode: str):
        super().__init__(ctx)
        self.sizes, self.mode = sizes, mode

    @classmethod
    def from_operator(cls, op, ctx):
        if op.type == "Tensor.expand_as":
            return cls(ctx, None, "as")
        if len(op.inputs) >= 2:
            return cls(ctx, None, "input")
        key = "size" if op.has_param("size") and not op.has_param("sizes") else "sizes"
        return cls(ctx, op.param(key, (int,)), "param")

    def _target(self, shape: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, ...]:
        lead = len(sizes) - len(shape)
        if lead < 0:
            raise ShapeError(f"{self.who}: expand sizes {sizes} have fewer dims than the input shape {shape}")
        out = []
        for i, s in enumerate(sizes):
            if s == -1:
                if i < lead:
                    raise ShapeError(f"{self.who}: -1 is not allowed for a new leading dim in expand sizes {sizes}")
                s = shape[i - lead]
            elif i >= lead and shape[i - lead] not in (1, s):
                raise ShapeError(f"{self.who}: cannot expand an input of shape {shape} to {sizes}")
            elif s < 0:
                raise ShapeError(f"{self.who}: invalid expand sizes {sizes}")
            out.append(s)
        return tuple(out)

    def forward(self, x: Any, other: Any = None) -> Any:
        shape = tuple(x.shape)
        if self.mode == "as":
            target = tuple(other.shape)
            if target == shape:
                return x
            return self.xp.broadcast_to(x, self._target(shape, target))
        if self.mode == "input":
            target = self._target(shape, runtime_ints(other, self.who, "sizes"))
        else:
            target = self.cached(shape, lambda: self._target(shape, self.sizes))
        return x if target == shape else self.xp.broadcast_to(x, target)


@register("Tensor.repeat", "torch.tile", "Tensor.tile")
class Repeat(ShapeLayer):
    """Tile the input: ``Tensor.repeat sizes=`` (at least ndim entries) or ``torch.tile dims=``
    (fewer entries are padded with leading 1s); ``sizes`` may be an input."""

    def __init__(self, ctx: BuildContext, reps: tuple[int, ...] | None, strict_len: bool):
        super().__init__(ctx)
        self.reps, self.strict_len = reps, strict_len

    @classmethod
    def from_operator(cls, op, ctx):
        strict_len = op.type == "Tensor.repeat"
        if len(op.inputs) >= 2:
            return cls(ctx, None, strict_len)
        key = next((k for k in ("sizes", "dims", "repeats") if op.has_param(k)), "sizes")
        reps = op.param(key, (int,))
        if any(r < 0 for r in reps):
            raise LayerParameterError(f"{op.where}: parameter {key!r} has negative repeats {reps!r}")
        return cls(ctx, reps, strict_len)

    def forward(self, x: Any, reps: Any = None) -> Any:
        reps = self.reps if reps is None else runtime_ints(reps, self.who, "repeats")
        if self.strict_len and len(reps) < x.ndim:
            raise ShapeError(f"{self.who}: {len(reps)} repeats {reps} for an input with {x.ndim} dims")
        if all(r == 1 for r in reps) and len(reps) <= x.ndim:
            return x
        return self.xp.tile(x, tuple(reps))


@register("torch.repeat_interleave", "Tensor.repeat_interleave")
class RepeatInterleave(ShapeLayer):
    """Repeat each element ``repeats`` times along ``dim`` (or of the flattened input); repeats a
    parameter, or an integer operand (``$repeats``: a scalar, or one count per element, as a
    FastSpeech length regulator has)."""

    def __init__(self, ctx: BuildContext, repeats: Any, dim: int | None):
        super().__init__(ctx)
        self.repeats, self.dim = repeats, dim
        self.swapped = False  # $repeats listed before $input

    @classmethod
    def from_operator(cls, op, ctx):
        if not op.has_param("repeats"):
            if len(op.inputs) < 2:
                raise LayerParameterError(f"{op.where}: repeats is neither a parameter nor an input")
            layer = cls(ctx, None, op.param("dim", int, None))
            layer.swapped = input_slots(op, ("input", "repeats")).get("repeats") == 0
            layer.data_dependent_shape = True  # the output's length is the counts' sum
            return layer
        raw = op.param("repeats")
        if isinstance(raw, (list, tuple)):
            reps = op.param("repeats", (int,))
            repeats: Any = ctx.asarray(list(reps), dtype="int64") if len(reps) > 1 else reps[0]
        else:
            repeats = op.param("repeats", int)
        return cls(ctx, repeats, op.param("dim", int, None))

    def forward(self, x: Any, reps: Any = None) -> Any:
        xp = self.xp
        if self.swapped:
            x, reps = reps, x
        repeats = self.repeats if reps is None else self._runtime_repeats(reps)
        if self.dim is None:
            x, d = xp.reshape(x, (-1,)), 0
        else:
            d = norm_dim(self.dim, x.ndim, self.who)
        if not isinstance(repeats, int) and repeats.shape[0] not in (1, x.shape[d]):
            raise ShapeError(f"{self.who}: {repeats.shape[0]} repeats for {x.shape[d]} elements along dim "
                             f"{'(flattened)' if self.dim is None else d}")
        if not isinstance(repeats, int) and self.backend.name == "cupy":
            repeats = self.backend.to_numpy(repeats).tolist()  # cupy.repeat takes an int or a list
        return xp.repeat(x, repeats, axis=d)

    def _runtime_repeats(self, reps: Any) -> Any:
        """A repeats operand as an int or a 1-D int64 array of counts >= 0."""
        xp = self.xp
        if not hasattr(reps, "shape"):  # a python int or list from an expression
            vals = runtime_ints(reps, self.who, "repeats")
            reps = vals[0] if isinstance(reps, int) else xp.asarray(list(vals), dtype=xp.int64)
        elif "int" not in str(reps.dtype):
            raise ShapeError(f"{self.who}: repeats must be integers, found {reps.dtype}")
        elif len(reps.shape) == 0:
            reps = int(reps)
        elif len(reps.shape) != 1:
            raise ShapeError(f"{self.who}: repeats must be a scalar or 1-D, found shape {tuple(reps.shape)}")
        else:
            reps = xp.astype(reps, xp.int64)
        if isinstance(reps, int) and reps < 0 or not isinstance(reps, int) and bool(xp.any(reps < 0)):
            raise ShapeError(f"{self.who}: repeats must be >= 0")
        return reps


@register("torch.roll", "Tensor.roll")
class Roll(ShapeLayer):
    """Roll along ``dims`` by ``shifts`` (no dims: over the flattened input)."""

    def __init__(self, ctx: BuildContext, shifts: tuple[int, ...], dims: tuple[int, ...] | None):
        super().__init__(ctx)
        self.shifts, self.dims = shifts, dims

    @classmethod
    def from_operator(cls, op, ctx):
        dims = op.param("dims", (int,), None)
        if len(op.inputs) >= 2:  # shifts computed in the model (``$shifts``, a pnnx.Expression)
            return cls(ctx, None, dims)
        shifts = op.param("shifts", (int,))
        if dims is not None and len(dims) != len(shifts):
            raise LayerParameterError(f"{op.where}: parameters 'shifts' {shifts!r} and 'dims' {dims!r} differ in length")
        if dims is None and len(shifts) != 1:
            raise LayerParameterError(f"{op.where}: several shifts {shifts!r} need 'dims'")
        return cls(ctx, shifts, dims)

    def forward(self, x: Any, shifts: Any = None) -> Any:
        xp = self.xp
        if shifts is None:
            shifts = self.shifts
        else:
            shifts = runtime_ints(shifts, self.who, "the shifts")
            if len(shifts) != (1 if self.dims is None else len(self.dims)):
                raise ShapeError(f"{self.who}: {len(shifts)} shifts {shifts!r} for dims {self.dims!r}")
        if self.dims is None:
            return xp.reshape(xp.roll(xp.reshape(x, (-1,)), shifts[0]), x.shape)
        nd = x.ndim
        axes = self.cached(nd, lambda: tuple(norm_dim(d, nd, self.who) for d in self.dims))
        return xp.roll(x, shift=shifts, axis=axes)


@register("torch.flip", "Tensor.flip")
class Flip(ShapeLayer):
    def __init__(self, ctx: BuildContext, dims: tuple[int, ...]):
        super().__init__(ctx)
        self.dims = dims

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("dims", (int,)))

    def forward(self, x: Any) -> Any:
        nd = x.ndim
        axes = self.cached(nd, lambda: norm_dims(self.dims, nd, self.who))
        return self.xp.flip(x, axis=axes)


# -- dtype casts and constant-like tensors ---------------------------------------------------------
TORCH_DTYPES = {
    "torch.float": "float32", "torch.float32": "float32", "torch.double": "float64",
    "torch.float64": "float64", "torch.half": "float16", "torch.float16": "float16",
    "torch.bfloat16": "bfloat16", "torch.int": "int32", "torch.int32": "int32", "torch.long": "int64",
    "torch.int64": "int64", "torch.short": "int16", "torch.int16": "int16", "torch.int8": "int8",
    "torch.uint8": "uint8", "torch.bool": "bool", "torch.cfloat": "complex64",
    "torch.complex64": "complex64", "torch.cdouble": "complex128", "torch.complex128": "complex128",
}


def torch_dtype(op, ctx: BuildContext, key: str = "dtype") -> Any:
    """The backend dtype named by ``dtype=torch.xxx`` (else the output annotation), or None."""
    raw = op.param(key, None, None)
    name = None
    if raw is not None:
        if not isinstance(raw, str) or raw not in TORCH_DTYPES:
            raise LayerParameterError(f"{op.where}: parameter {key!r} should be a torch dtype such as "
                                      f"torch.float, found {raw!r}")
        name = TORCH_DTYPES[raw]
    elif out_dtype(op) is not None:
        name = out_dtype(op)
    if name is None:
        return None
    dt = getattr(ctx.xp, name, None)
    if dt is None:
        raise LayerParameterError(f"{op.where}: dtype {name} is not available on this backend")
    return dt


@register("Tensor.to", "Tensor.type")
class Cast(ShapeLayer):
    """Cast to ``dtype`` (``torch.float``, ``torch.long``, ...); float to int truncates toward 0."""

    def __init__(self, ctx: BuildContext, dtype: Any):
        super().__init__(ctx)
        self.dtype = dtype

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, torch_dtype(op, ctx))

    def forward(self, x: Any, *_: Any) -> Any:
        if self.dtype is None or x.dtype == self.dtype:
            return x
        return astype_wrapping(self.xp, x, self.dtype)


@register("Tensor.type_as")
class TypeAs(Layer):
    """Cast the first input to the dtype of the second."""

    def forward(self, x: Any, other: Any) -> Any:
        return x if x.dtype == other.dtype else astype_wrapping(self.xp, x, other.dtype)
