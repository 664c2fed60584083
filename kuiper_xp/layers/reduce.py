"""Reduction layers: mean, sum, prod, max/min (values, or values and indices), amax/amin,
argmax/argmin, std/var, logsumexp, norm, all/any, and the cumulative sum/product.

Dims are ``dim=`` (an int, a list, or absent/None for all dims) with ``keepdim=``; the axes for a
given input rank are worked out once and cached. Result dtypes follow torch: sum/prod/cumsum of
an integer or bool tensor accumulate in int64, mean of an integer tensor is an error, indices are
int64. When pnnx dropped a ``dtype=`` argument (``x.sum(1, dtype=torch.float64)``), the output's
dtype annotation in the file says what torch produced, and it is honoured.
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .registry import register
from .shape import (
    ShapeLayer,
    dtype_name,
    norm_dim,
    norm_dims,
    out_dtype,
    runtime_flag,
    runtime_int,
    runtime_ints,
)

__all__ = ["Mean", "Sum", "Prod", "AMax", "AMin", "MaxMin", "ArgMax", "ArgMin", "StdVar", "LogSumExp",
           "Norm", "AllAny", "CumSum", "CumProd", "AtenReduce", "StdVarMean"]


def _is_float(xp: Any, dt: Any) -> bool:
    return xp.isdtype(dt, ("real floating", "complex floating"))


def _dims_keepdim(op) -> tuple[tuple[int, ...] | None, bool]:
    """``dim`` (int or list; absent, None or empty: all dims) and ``keepdim``."""
    dims = op.param("dim", (int,), None)
    if dims is not None and len(dims) == 0:
        dims = None
    return dims, op.param("keepdim", bool, False)


class _Reduce(ShapeLayer):
    """dim (None = all) + keepdim; ``dtype`` is the annotated output dtype name (or None)."""

    def __init__(self, ctx: BuildContext, dims: tuple[int, ...] | None, keepdim: bool, dtype: str | None):
        super().__init__(ctx)
        self.dims, self.keepdim, self.dtype = dims, keepdim, dtype

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, *_dims_keepdim(op), out_dtype(op))

    def axes(self, nd: int) -> tuple[int, ...] | None:
        if self.dims is None:
            return None
        return self.cached(nd, lambda: () if nd == 0 and all(d in (0, -1) for d in self.dims)
                           else norm_dims(self.dims, nd, self.who))

    def _out_dtype(self, x: Any, integer_default: Any) -> Any:
        """The annotated dtype if any, else ``integer_default`` for int/bool input, else x's dtype."""
        xp = self.xp
        if self.dtype is not None:
            dt = getattr(xp, self.dtype, None)
            if dt is not None:
                return dt
        if _is_float(xp, x.dtype):
            return x.dtype
        return integer_default


@register("torch.mean", "Tensor.mean")
class Mean(_Reduce):
    def forward(self, x: Any) -> Any:
        xp = self.xp
        dt = self._out_dtype(x, None)
        if dt is None:
            raise ShapeError(f"{self.who}: mean of a {dtype_name(x.dtype)} tensor (torch needs a floating "
                             f"input or dtype= here, and pnnx does not always write dtype= into the file: "
                             f"cast it first, e.g. x.float().mean(...))")
        if x.dtype != dt:
            x = xp.astype(x, dt)
        axes = self.axes(x.ndim)
        fast = getattr(self.backend.fast, "sum_short_inner", None)
        y = None if fast is None else fast(x, axes, self.keepdim, mean=True)
        return xp.mean(x, axis=axes, keepdims=self.keepdim) if y is None else y


def _no_bool(xp: Any, x: Any, dt: Any) -> Any:
    """The Array API does not sum booleans: count them as ints (torch sums bool to int64)."""
    return xp.astype(x, dt) if x.dtype == xp.bool else x


@register("torch.sum", "Tensor.sum")
class Sum(_Reduce):
    def forward(self, x: Any) -> Any:
        xp = self.xp
        dt = self._out_dtype(x, xp.int64)
        axes = self.axes(x.ndim)
        if dt == getattr(xp, "float16", None):  # torch accumulates half sums in float32
            return xp.astype(xp.sum(xp.astype(x, xp.float32), axis=axes, keepdims=self.keepdim), dt)
        fast = getattr(self.backend.fast, "sum_short_inner", None) if x.dtype == dt else None
        y = None if fast is None else fast(x, axes, self.keepdim)
        return xp.sum(_no_bool(xp, x, dt), axis=axes, dtype=dt, keepdims=self.keepdim) if y is None else y


@register("torch.prod", "Tensor.prod")
class Prod(_Reduce):
    def forward(self, x: Any) -> Any:
        xp = self.xp
        dt = self._out_dtype(x, xp.int64)
        return xp.prod(_no_bool(xp, x, dt), axis=self.axes(x.ndim), dtype=dt, keepdims=self.keepdim)


def _check_nonempty(layer: _Reduce, x: Any, axes: tuple[int, ...] | None) -> None:
    shape = tuple(x.shape)
    sizes = shape if axes is None else tuple(shape[a] for a in axes)
    if any(s == 0 for s in sizes):
        raise ShapeError(f"{layer.who}: cannot take the max/min over an empty dim of an input of shape {shape}")


@register("torch.amax")
class AMax(_Reduce):
    def forward(self, x: Any) -> Any:
        axes = self.axes(x.ndim)
        _check_nonempty(self, x, axes)
        return self.xp.max(x, axis=axes, keepdims=self.keepdim)


@register("torch.amin")
class AMin(_Reduce):
    def forward(self, x: Any) -> Any:
        axes = self.axes(x.ndim)
        _check_nonempty(self, x, axes)
        return self.xp.min(x, axis=axes, keepdims=self.keepdim)


@register("torch.max", "torch.min", "Tensor.max", "Tensor.min")
class MaxMin(_Reduce):
    """No dim: the max of all elements. ``dim=d``: the values, and with two outputs also the
    int64 indices (first occurrence; a NaN counts as the largest, as in torch). Two inputs: the
    elementwise maximum/minimum."""

    def __init__(self, ctx: BuildContext, dims, keepdim, dtype, is_max: bool, with_indices: bool,
                 binary: bool):
        super().__init__(ctx, dims, keepdim, dtype)
        self.is_max, self.with_indices, self.binary = is_max, with_indices, binary
        self._short = getattr(ctx.fast, "max_short_last", None)  # (numpy: a short last axis)

    @classmethod
    def from_operator(cls, op, ctx):
        is_max = op.type.endswith("max")
        if len(op.inputs) >= 2:
            return cls(ctx, None, False, out_dtype(op), is_max, False, True)
        dim = op.param("dim", int, None)
        if len(op.outputs) > 2:
            raise LayerParameterError(f"{op.where}: {op.type} has {len(op.outputs)} outputs; expected 1 or 2")
        with_indices = len(op.outputs) == 2
        if with_indices and dim is None:
            raise LayerParameterError(f"{op.where}: {op.type} with values and indices needs 'dim'")
        return cls(ctx, None if dim is None else (dim,), op.param("keepdim", bool, False), out_dtype(op),
                   is_max, with_indices, False)

    def forward(self, x: Any, other: Any = None) -> Any:
        xp = self.xp
        if self.binary:
            if x.dtype != other.dtype:
                dt = getattr(xp, self.dtype) if self.dtype else xp.result_type(x, other)
                x, other = xp.astype(x, dt), xp.astype(other, dt)
            return xp.maximum(x, other) if self.is_max else xp.minimum(x, other)
        axes = self.axes(x.ndim)
        _check_nonempty(self, x, axes)
        values = None
        if self._short is not None and axes == (x.ndim - 1,):
            values = self._short(x, self.is_max, self.keepdim)
        boolean = x.dtype == xp.bool  # (the standard's max/min take numbers only: any/all)
        if values is None:
            if boolean:
                red = xp.any if self.is_max else xp.all
            else:
                red = xp.max if self.is_max else xp.min
            values = red(x, axis=axes, keepdims=self.keepdim)
        if not self.with_indices:
            return values
        arg = xp.argmax if self.is_max else xp.argmin
        idx = arg(xp.astype(x, xp.uint8) if boolean else x, axis=axes[0], keepdims=self.keepdim)
        if idx.dtype != xp.int64:
            idx = xp.astype(idx, xp.int64)
        return values, idx


@register("torch.argmax", "Tensor.argmax")
class ArgMax(_Reduce):
    """Index (int64) of the first max along ``dim``, or in the flattened input when dim is None."""

    is_max = True

    @classmethod
    def from_operator(cls, op, ctx):
        dim = op.param("dim", int, None)
        return cls(ctx, None if dim is None else (dim,), op.param("keepdim", bool, False), None)

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if x.ndim == 0:
            return xp.zeros((), dtype=xp.int64, device=self.device)
        axes = self.axes(x.ndim)
        _check_nonempty(self, x, axes)
        f = xp.argmax if self.is_max else xp.argmin
        idx = f(x, axis=None if axes is None else axes[0], keepdims=self.keepdim)
        return idx if idx.dtype == xp.int64 else xp.astype(idx, xp.int64)


@register("torch.argmin", "Tensor.argmin")
class ArgMin(ArgMax):
    is_max = False


def _in_float64(xp: Any, x: Any, fn: Any) -> Any:
    """``fn`` of a float32/float16 ``x`` computed in float64 and rounded back, as torch's CPU
    variance accumulates (std of [1e20, -1e20, 0, 3e19]: 8.3e19, not the inf of float32 squares)."""
    if x.dtype == xp.float64 or not _is_float(xp, x.dtype):
        return fn(x)
    return xp.astype(fn(xp.astype(x, xp.float64)), x.dtype)


def _correction(op: Any) -> float:
    """The degrees-of-freedom correction of a ``torch.std``/``var`` spelling: ``correction=c``,
    or ``unbiased`` as a bool, or a number there too (pnnx writes ``x.var(dim, correction=3)`` as
    ``unbiased=3``)."""
    if op.has_param("correction") and op.params["correction"] is not None:
        return op.param("correction", float)
    u = op.param("unbiased", default=True)
    if isinstance(u, (int, float)) and not isinstance(u, bool):
        return float(u)
    return 1.0 if op.param("unbiased", bool, True) else 0.0


@register("torch.std", "torch.var", "Tensor.std", "Tensor.var")
class StdVar(_Reduce):
    """Standard deviation / variance with ``unbiased`` (bool) or ``correction`` (number)."""

    def __init__(self, ctx: BuildContext, dims, keepdim, dtype, correction: float, is_std: bool):
        super().__init__(ctx, dims, keepdim, dtype)
        self.correction, self.is_std = correction, is_std

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, *_dims_keepdim(op), out_dtype(op), _correction(op), op.type.endswith("std"))

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if not _is_float(xp, x.dtype):
            raise ShapeError(f"{self.who}: std/var of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
        f = xp.std if self.is_std else xp.var
        return _in_float64(xp, x, lambda w: f(w, axis=self.axes(x.ndim), correction=self.correction,
                                               keepdims=self.keepdim))


@register("torch.logsumexp", "Tensor.logsumexp")
class LogSumExp(_Reduce):
    """log(sum(exp(x))) = m + log(sum(exp(x - m))) with m the (finite) max; an all -inf slice
    gives -inf, an inf anywhere gives inf."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if not _is_float(xp, x.dtype):
            x = xp.astype(x, xp.float32)
        axes = self.axes(x.ndim)
        if math.prod(x.shape) == 0:  # (an empty sum: -inf, as torch; a max over an empty axis raises)
            m = xp.zeros((), dtype=x.dtype, device=self.device)
        else:
            m = xp.max(x, axis=axes, keepdims=True)
            m = xp.where(xp.isfinite(m), m, xp.zeros((), dtype=x.dtype, device=self.device))
        s = xp.sum(xp.exp(x - m), axis=axes, keepdims=True)
        out = xp.log(s) + m
        if not self.keepdim:
            out = xp.squeeze(out, axis=tuple(range(x.ndim)) if axes is None else axes)
        return out


@register("torch.norm", "torch.linalg.vector_norm")
class Norm(_Reduce):
    """The vector p-norm over ``dim`` (all dims when absent): p = 2/'fro', 1, inf, -inf, 0
    (count of non-zeros) or any other number; p='nuc' over two dims is the nuclear norm."""

    def __init__(self, ctx: BuildContext, dims, keepdim, dtype, p: float | str):
        super().__init__(ctx, dims, keepdim, dtype)
        self.p = p

    @classmethod
    def from_operator(cls, op, ctx):
        key = "ord" if op.has_param("ord") else "p"
        raw = op.param(key, None, 2.0)
        if raw is None or raw == "fro":
            p = 2.0
        elif raw == "nuc":
            p = "nuc"
        elif isinstance(raw, str) and raw in ("inf", "-inf"):
            p = float(raw)
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            p = float(raw)
        else:
            raise LayerParameterError(f"{op.where}: parameter {key!r} should be a number, 'fro', 'nuc' or inf, found {raw!r}")
        dims, keepdim = _dims_keepdim(op)
        if p == "nuc" and (dims is None or len(dims) != 2):
            raise LayerParameterError(f"{op.where}: parameter {key!r}=nuc (the nuclear norm) needs a dim of two "
                                      f"dims, found dim={dims}")
        return cls(ctx, dims, keepdim, out_dtype(op), p)

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if not _is_float(xp, x.dtype):
            raise ShapeError(f"{self.who}: norm of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
        if self.p == "nuc":
            return _matrix_norm(self, x, "nuc", self.axes(x.ndim), self.keepdim)
        return _vector_norm(xp, x, self.axes(x.ndim), self.keepdim, self.p, self.who)


def _vector_norm(xp: Any, x: Any, axes: tuple[int, ...] | None, kd: bool, p: float, who: str = "norm") -> Any:
    """torch's vector p-norm over ``axes`` (None: all): 2, 1, inf, -inf, 0 (count of non-zeros) or
    any other p as (sum |x|^p)^(1/p). The inf norms of an empty dim are a ShapeError, as in torch."""
    if p in (float("inf"), float("-inf")):
        sizes = tuple(x.shape) if axes is None else tuple(x.shape[a] for a in axes)
        if 0 in sizes:
            raise ShapeError(f"{who}: the {p} norm over an empty dim of an input of shape {tuple(x.shape)} "
                             "is undefined (torch raises too)")
    if p == 2.0:
        return xp.sqrt(xp.sum(x * x, axis=axes, keepdims=kd))
    a = xp.abs(x)
    if p == 1.0:
        return xp.sum(a, axis=axes, keepdims=kd)
    if p == float("inf"):
        return xp.max(a, axis=axes, keepdims=kd)
    if p == float("-inf"):
        return xp.min(a, axis=axes, keepdims=kd)
    if p == 0.0:
        return xp.sum(xp.astype(a != 0, x.dtype), axis=axes, keepdims=kd)
    return xp.sum(a ** p, axis=axes, keepdims=kd) ** (1.0 / p)


_MATRIX_ORDS = ("fro", "nuc", 1.0, -1.0, 2.0, -2.0, float("inf"), float("-inf"))


def _matrix_norm(layer: Layer, x: Any, ord_: Any, axes: tuple[int, int], kd: bool) -> Any:
    """torch's matrix norm over the two ``axes`` (rows, columns): 'fro', 'nuc' (sum of singular
    values), 2 / -2 (largest / smallest singular value), 1 / -1 (max / min column abs sum), inf /
    -inf (max / min row abs sum)."""
    xp = layer.xp
    r, c = axes
    if ord_ == "fro":
        y = xp.sqrt(xp.sum(x * x, axis=axes, keepdims=True))
    elif ord_ in ("nuc", 2.0, -2.0):
        svdvals = getattr(getattr(xp, "linalg", None), "svdvals", None)
        if svdvals is None:
            from kuiper_xp.errors import UnsupportedOperatorError

            raise UnsupportedOperatorError(f"{layer.op_type} {layer.op_name!r}: ord={ord_!r} needs singular values "
                                           f"(xp.linalg.svdvals), which this backend's namespace lacks")
        rest = [d for d in range(x.ndim) if d not in axes]
        sv = svdvals(xp.permute_dims(x, tuple(rest) + (r, c)))
        red = xp.sum if ord_ == "nuc" else xp.max if ord_ == 2.0 else xp.min
        y = red(sv, axis=-1)
        for d in sorted(axes):
            y = xp.expand_dims(y, axis=d)
    elif ord_ in (1.0, -1.0, float("inf"), float("-inf")):
        first, second = (r, c) if abs(ord_) == 1.0 else (c, r)
        y = xp.sum(xp.abs(x), axis=first, keepdims=True)
        y = (xp.max if ord_ > 0 else xp.min)(y, axis=second, keepdims=True)
    else:
        raise LayerParameterError(f"{layer.op_type} {layer.op_name!r}: matrix norm ord={ord_!r}; expected one of "
                                  f"'fro', 'nuc', 1, -1, 2, -2, inf, -inf")
    return y if kd else xp.squeeze(y, axis=axes)


def _ord_value(v: Any, who: str) -> Any:
    """An ``ord`` argument: None, a number (as float), or 'fro' / 'nuc'."""
    if v is None or (isinstance(v, str) and v in ("fro", "nuc")):
        return v
    if isinstance(v, str) and v in ("inf", "-inf"):
        return float(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if hasattr(v, "shape") and len(v.shape) == 0:
        return float(v)
    raise LayerParameterError(f"{who}: ord={v!r}; expected a number, inf, 'fro' or 'nuc'")


@register("aten::linalg_norm", "aten::linalg_matrix_norm")
class LinalgNorm(ShapeLayer):
    """``torch.linalg.norm(input, ord=None, dim=None, keepdim=False)``: a vector norm over one dim
    (or over all elements when ord and dim are None), a matrix norm over two; ``linalg.matrix_norm``
    (ord='fro', dim=(-2, -1) by default) always the matrix norm. 'nuc' and ord=+-2 take singular
    values from ``xp.linalg.svdvals``. A ``dtype=`` argument is honoured through the output's
    dtype annotation."""

    def __init__(self, ctx: BuildContext, dtype: str | None):
        super().__init__(ctx)
        self.dtype = dtype

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.outputs) != 1:
            raise LayerParameterError(f"{op.where}: {op.type} has {len(op.outputs)} outputs; expected 1")
        return cls(ctx, out_dtype(op))

    def forward(self, x: Any, ord_: Any = None, dim: Any = None, keepdim: Any = False, *_: Any) -> Any:
        xp, who = self.xp, self.who
        if self.dtype is not None and dtype_name(x.dtype) != self.dtype:
            dt = getattr(xp, self.dtype, None)
            x = x if dt is None else xp.astype(x, dt)
        if not _is_float(xp, x.dtype):
            raise ShapeError(f"{who}: norm of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
        o = _ord_value(ord_, who)
        kd = runtime_flag(keepdim, who, "keepdim")
        dims = None if dim is None else runtime_ints(dim, who, "dim")
        matrix = self.op_type.endswith("matrix_norm")
        if matrix:
            o = "fro" if o is None else o
            dims = (-2, -1) if dims is None else dims
        if dims is None:
            if o is None:
                return _vector_norm(xp, x, None, kd, 2.0)
            if x.ndim not in (1, 2):
                raise ShapeError(f"{who}: ord={ord_!r} without dim needs a 1-D or 2-D input, found shape "
                                 f"{tuple(x.shape)}")
            dims = tuple(range(x.ndim))
        if len(dims) == 1 and not matrix:
            if isinstance(o, str):
                raise LayerParameterError(f"{who}: ord={o!r} is a matrix norm; it needs two dims, found dim={dims}")
            axes = None if x.ndim == 0 else norm_dims(dims, x.ndim, who)
            return _vector_norm(xp, x, axes, kd, 2.0 if o is None else o, who)
        if len(dims) != 2:
            raise ShapeError(f"{who}: dim={dims} should name one dim (vector norm) or two (matrix norm)")
        if x.ndim < 2:
            raise ShapeError(f"{who}: a matrix norm needs an input of at least 2 dims, found shape {tuple(x.shape)}")
        axes = norm_dims(dims, x.ndim, who)
        o = "fro" if o is None else o
        if o not in _MATRIX_ORDS:
            raise LayerParameterError(f"{who}: matrix norm ord={ord_!r}; expected one of 'fro', 'nuc', 1, -1, "
                                      f"2, -2, inf, -inf")
        return _matrix_norm(self, x, o, axes, kd)


@register("torch.all", "torch.any", "Tensor.all", "Tensor.any")
class AllAny(_Reduce):
    """Logical and/or over ``dim`` (all dims when absent); the result is bool (uint8 for a uint8
    input, as torch keeps it)."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        f = xp.all if self.op_type.endswith("all") else xp.any
        y = f(x, axis=self.axes(x.ndim), keepdims=self.keepdim)
        return xp.astype(y, xp.uint8) if x.dtype == xp.uint8 else y


@register("torch.cumsum", "Tensor.cumsum")
class CumSum(Layer):
    """Running sum along ``dim``; an integer/bool input accumulates in int64 (as torch)."""

    prod = False

    def __init__(self, ctx: BuildContext, dim: int, dtype: str | None):
        super().__init__(ctx)
        self.dim, self.dtype = dim, dtype
        self._fast = getattr(ctx.fast, "cumulative", None)  # (numpy: an outer axis slice by slice)

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("dim", int), out_dtype(op))

    def forward(self, x: Any) -> Any:
        xp = self.xp
        who = f"{self.op_type} {self.op_name!r}"
        fast = self._fast
        if x.ndim == 0:
            x = xp.reshape(x, (1,))
            d, scalar = 0, True
        else:
            d, scalar = norm_dim(self.dim, x.ndim, who), False
        dt = getattr(xp, self.dtype, None) if self.dtype else None
        if dt is None:
            dt = x.dtype if _is_float(xp, x.dtype) else xp.int64
        # torch on the CPU accumulates float32 (and half) running sums and products in float64:
        # [1e8, 1, 1, 1, -1e8, 1] ends 3, 4 there (0, 1 in float32)
        work = xp.float64 if _is_float(xp, dt) and dt != xp.float64 else dt
        out = None if fast is None else fast(x, d, "prod" if self.prod else "sum", work)
        if out is None:
            f = xp.cumulative_prod if self.prod else xp.cumulative_sum
            out = f(_no_bool(xp, x, work), axis=d, dtype=work)
        if out.dtype != dt:
            out = xp.astype(out, dt)
        return xp.reshape(out, ()) if scalar else out


@register("torch.cumprod", "Tensor.cumprod")
class CumProd(CumSum):
    prod = True


@register("aten::prod", "aten::sum", "aten::mean", "aten::all", "aten::any", "aten::amax", "aten::amin")
class AtenReduce(_Reduce):
    """The ``aten::`` reductions pnnx leaves unconverted (``x.prod()``, ``torch.all(x, 1)``): the
    dim and keepdim arrive as inputs (from ``pnnx.Expression`` ops: None, an int or a list, and a
    bool) instead of parameters."""

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, None, False, out_dtype(op))

    def forward(self, x: Any, dim: Any = None, keepdim: Any = False, *_: Any) -> Any:
        xp = self.xp
        dims = None if dim is None else runtime_ints(dim, self.who, "dim")
        if not dims:
            axes = None
        elif x.ndim == 0:
            axes = ()
        else:
            axes = norm_dims(dims, x.ndim, self.who)
        kd = bool(keepdim) if isinstance(keepdim, bool) else bool(runtime_int(keepdim, self.who, "keepdim"))
        kind = self.op_type.split("::", 1)[1]
        if kind in ("all", "any"):
            y = (xp.all if kind == "all" else xp.any)(x, axis=axes, keepdims=kd)
            return xp.astype(y, xp.uint8) if x.dtype == xp.uint8 else y  # (torch keeps uint8)
        if kind in ("amax", "amin"):
            return (xp.max if kind == "amax" else xp.min)(x, axis=axes, keepdims=kd)
        dt = self._out_dtype(x, xp.int64)
        if kind == "mean":
            if not _is_float(xp, dt):
                raise ShapeError(f"{self.who}: mean of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
            return xp.mean(x if x.dtype == dt else xp.astype(x, dt), axis=axes, keepdims=kd)
        f = xp.prod if kind == "prod" else xp.sum
        return f(_no_bool(xp, x, dt), axis=axes, dtype=dt, keepdims=kd)


@register("aten::var_mean", "aten::std_mean", "torch.var_mean", "torch.std_mean", "aten::std", "aten::var")
class StdVarMean(_Reduce):
    """``torch.var_mean`` / ``std_mean``: (var or std, mean). pnnx leaves them as ``aten::``
    operators whose dim, unbiased (a bool) or correction (a number, None meaning 1) and keepdim
    arrive as inputs from constant expressions; the ``torch.`` spellings carry parameters.
    ``aten::std`` / ``aten::var`` (what pnnx writes for ``x.std()``, ``torch.var(x)`` over the
    whole tensor: ``(input, unbiased)``, or the four-input form) give the first result only."""

    def __init__(self, ctx: BuildContext, dims, keepdim, dtype, correction: float | None, is_std: bool,
                 single: bool = False):
        super().__init__(ctx, dims, keepdim, dtype)
        self.correction, self.is_std, self.single = correction, is_std, single

    @classmethod
    def from_operator(cls, op, ctx):
        is_std = op.type.split("::")[-1].split(".")[-1].startswith("std")
        single = op.type in ("aten::std", "aten::var")
        if op.type.startswith("aten::"):
            return cls(ctx, None, False, out_dtype(op), None, is_std, single)
        return cls(ctx, *_dims_keepdim(op), out_dtype(op), _correction(op), is_std)

    def forward(self, x: Any, *args: Any) -> Any:
        xp = self.xp
        if not _is_float(xp, x.dtype):
            raise ShapeError(f"{self.who}: std/var of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
        if self.correction is not None:
            axes, kd, corr = self.axes(x.ndim), self.keepdim, self.correction
        else:
            # (input, dim, unbiased | correction, keepdim); a 2-input form is (input, unbiased)
            if len(args) == 1:
                args = (None, args[0], False)
            dim, corr_arg, keepdim = (tuple(args) + (None, None, False))[:3]
            dims = None if dim is None else runtime_ints(dim, self.who, "dim")
            axes = None if not dims else (() if x.ndim == 0 else norm_dims(dims, x.ndim, self.who))
            if corr_arg is None:
                corr = 1.0
            elif isinstance(corr_arg, bool):
                corr = 1.0 if corr_arg else 0.0
            elif isinstance(corr_arg, (int, float)):
                corr = float(corr_arg)
            else:
                corr = float(runtime_int(corr_arg, self.who, "correction"))
            kd = bool(keepdim) if isinstance(keepdim, bool) else bool(runtime_int(keepdim, self.who, "keepdim"))
        f = xp.std if self.is_std else xp.var
        spread = _in_float64(xp, x, lambda w: f(w, axis=axes, correction=corr, keepdims=kd))
        if self.single:
            return spread
        return (spread, xp.mean(x, axis=axes, keepdims=kd))


# -- aten:: reductions whose arguments arrive as constant-expression inputs --------------------------
# pnnx 2.13 leaves these as ``aten::`` operators: ``torch.median(x, 1)`` becomes
# ``aten::median op 3 2 x dim keepdim values indices`` with ``dim`` and ``keepdim`` produced by
# ``pnnx.Expression expr=1`` / ``expr=False``. A string argument (``interpolation='linear'``,
# ``ord='fro'``) arrives as the Python string of a bare-word expression (``expr=linear``).

def _axes_arg(v: Any, nd: int, who: str) -> tuple[int, ...] | None:
    """``dim`` as None (all dims), an int or a list; () for a 0-d input given dim 0 or -1."""
    dims = None if v is None else runtime_ints(v, who, "dim")
    if not dims:
        return None
    if nd == 0:
        if any(d not in (0, -1) for d in dims):
            raise ShapeError(f"{who}: dim {dims} is out of range for a 0-d input")
        return ()
    return norm_dims(dims, nd, who)


def _one_axis(v: Any, nd: int, who: str) -> int:
    """One ``dim`` for a scan or a selection along an axis (a 0-d input is viewed as (1,))."""
    return norm_dim(runtime_int(v, who, "dim"), max(nd, 1), who)


def _no_bool_input(layer: Layer, x: Any, what: str) -> None:
    if x.dtype == layer.xp.bool:
        raise ShapeError(f"{layer.op_type} {layer.op_name!r}: {what} of a bool tensor (torch does not implement it)")


def _need_float(layer: Layer, x: Any, what: str) -> None:
    if not _is_float(layer.xp, x.dtype):
        raise ShapeError(f"{layer.op_type} {layer.op_name!r}: {what} of a {dtype_name(x.dtype)} tensor (torch "
                         f"needs a floating input)")


def _last(xp: Any, x: Any, axis: int) -> Any:
    """``x`` with ``axis`` moved to the end."""
    return x if axis in (-1, x.ndim - 1) else xp.moveaxis(x, axis, -1)


def _sort_nan_last(xp: Any, x: Any) -> tuple[Any, Any]:
    """(sorted values, int64 permutation) along the last axis, stable, NaNs after every number in
    their original order (torch's order; the Array API leaves NaN placement to the library)."""
    perm = xp.argsort(x, axis=-1, stable=True)
    if _is_float(xp, x.dtype):
        nan = xp.isnan(x)
        if bool(xp.any(nan)):
            nan_sorted = xp.astype(xp.take_along_axis(nan, perm, axis=-1), xp.int8)
            perm = xp.take_along_axis(perm, xp.argsort(nan_sorted, axis=-1, stable=True), axis=-1)
    if perm.dtype != xp.int64:
        perm = xp.astype(perm, xp.int64)
    return xp.take_along_axis(x, perm, axis=-1), perm


def _pick(xp: Any, s: Any, perm: Any, k: Any) -> tuple[Any, Any]:
    """Value and original index at sorted position ``k`` (an int64 array, last axis of size 1)."""
    return xp.take_along_axis(s, k, axis=-1), xp.take_along_axis(perm, k, axis=-1)


def _finish(xp: Any, y: Any, axis: int, keepdim: bool, scalar: bool) -> Any:
    """A result whose last axis has size 1 back to torch's layout: that axis at ``axis`` when
    keepdim, dropped otherwise (a 0-d input gives a 0-d result either way)."""
    if scalar:
        return xp.reshape(y, ())
    if keepdim:
        return y if axis == y.ndim - 1 else xp.moveaxis(y, -1, axis)
    return xp.squeeze(y, axis=-1)


class _AtenArgs(ShapeLayer):
    """Base of the layers below: a fixed output count checked at build."""

    n_outputs: tuple[int, ...] = (1,)

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.outputs) not in cls.n_outputs:
            raise LayerParameterError(f"{op.where}: {op.type} has {len(op.outputs)} outputs; expected "
                                      f"{' or '.join(map(str, cls.n_outputs))}")
        layer = cls(ctx)
        layer.n_out = len(op.outputs)
        layer.n_in = len(op.inputs)
        layer.out_dtype = out_dtype(op)
        return layer


@register("aten::median", "aten::nanmedian")
class Median(_AtenArgs):
    """The median: the lower of the two middle values for an even count (as torch). Without
    ``dim``: one value over all elements. With ``dim``: values and int64 indices. ``median`` gives
    NaN (and the first NaN's index) for a slice holding a NaN; ``nanmedian`` ignores NaNs (NaN only
    for an all-NaN slice)."""

    n_outputs = (1, 2)

    def forward(self, x: Any, dim: Any = None, keepdim: Any = False) -> Any:
        xp = self.xp
        _no_bool_input(self, x, "median")
        ignore_nan = self.op_type.endswith("nanmedian")
        if self.n_in == 1 or dim is None:
            if self.n_out == 2:
                raise ShapeError(f"{self.who}: values and indices need a dim")
            flat = xp.reshape(x, (1, -1))
            if flat.shape[1] == 0:
                return xp.full((), float("nan"), dtype=x.dtype, device=self.device)
            v, _ = self._median(flat, ignore_nan)
            return xp.reshape(v, ())
        axis = _one_axis(dim, x.ndim, self.who)
        kd, scalar = runtime_flag(keepdim, self.who, "keepdim"), x.ndim == 0
        xl = xp.reshape(x, (1,)) if scalar else _last(xp, x, axis)
        if xl.shape[-1] == 0:
            raise ShapeError(f"{self.who}: median over dim {axis} of size 0 (input shape {tuple(x.shape)})")
        v, i = self._median(xl, ignore_nan)
        return _finish(xp, v, axis, kd, scalar), _finish(xp, i, axis, kd, scalar)

    def _median(self, xl: Any, ignore_nan: bool) -> tuple[Any, Any]:
        xp = self.xp
        n = xl.shape[-1]
        fast = getattr(self.backend.fast, "kth_stable", None)
        got = None if fast is None else fast(xl, (n - 1) // 2)  # (None with a NaN: the sort below)
        if got is not None:
            return got
        s, perm = _sort_nan_last(xp, xl)
        if not _is_float(xp, xl.dtype):
            k = xp.full(xl.shape[:-1] + (1,), (n - 1) // 2, dtype=xp.int64, device=self.device)
            return _pick(xp, s, perm, k)
        cnt = xp.sum(xp.astype(~xp.isnan(xl), xp.int64), axis=-1, keepdims=True)  # non-NaN count
        if ignore_nan:  # the lower median of the numbers; position 0 (a NaN) when there are none
            k = xp.where(cnt > 0, (cnt - 1) // 2, xp.zeros_like(cnt))
        else:  # a NaN makes the median NaN: the first NaN sits at sorted position cnt
            k = xp.where(cnt < n, cnt, xp.full_like(cnt, (n - 1) // 2))
        return _pick(xp, s, perm, k)


@register("aten::kthvalue")
class KthValue(_AtenArgs):
    """The k-th smallest value along ``dim`` (k from 1; NaN counts as the largest) and its int64
    index, as ``torch.kthvalue(input, k, dim=-1, keepdim=False)``."""

    n_outputs = (2,)

    def forward(self, x: Any, k: Any, dim: Any = -1, keepdim: Any = False) -> Any:
        xp = self.xp
        _no_bool_input(self, x, "kthvalue")
        k = runtime_int(k, self.who, "k")
        axis = _one_axis(-1 if dim is None else dim, x.ndim, self.who)
        kd, scalar = runtime_flag(keepdim, self.who, "keepdim"), x.ndim == 0
        xl = xp.reshape(x, (1,)) if scalar else _last(xp, x, axis)
        n = xl.shape[-1]
        if not 1 <= k <= n:
            raise ShapeError(f"{self.who}: k={k} is out of range for dim {axis} of size {n} (1 <= k <= {n})")
        fast = getattr(self.backend.fast, "kth_stable", None)
        got = None if fast is None else fast(xl, k - 1)  # (None with a NaN: the sort below)
        if got is None:
            s, perm = _sort_nan_last(xp, xl)
            got = _pick(xp, s, perm, xp.full(xl.shape[:-1] + (1,), k - 1, dtype=xp.int64, device=self.device))
        v, i = got
        return _finish(xp, v, axis, kd, scalar), _finish(xp, i, axis, kd, scalar)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _lerp(xp: Any, a: Any, b: Any, w: Any) -> Any:
    """torch's lerp: a + w*(b - a) for |w| < 0.5, else b - (b - a)*(1 - w)."""
    d = b - a
    return xp.where(xp.abs(w) < 0.5, a + w * d, b - d * (1 - w))


@register("aten::quantile", "aten::nanquantile")
class Quantile(_AtenArgs):
    """``torch.quantile`` / ``nanquantile(input, q, dim=None, keepdim=False, interpolation)``: q a
    number or a 0-d/1-d tensor in [0, 1] (a 1-d q adds a leading output dim), the rank
    q * (n - 1) over the sorted slice, then linear / lower / higher / midpoint / nearest (round half
    to even) as torch computes them. ``quantile`` gives NaN for a slice with a NaN; ``nanquantile``
    ranks the non-NaN values only."""

    def forward(self, x: Any, q: Any, dim: Any = None, keepdim: Any = False, interpolation: Any = "linear") -> Any:
        xp = self.xp
        who = self.who
        if not isinstance(interpolation, str) or interpolation not in _INTERPOLATIONS:
            raise LayerParameterError(f"{who}: interpolation={interpolation!r}; expected one of "
                                      f"{', '.join(_INTERPOLATIONS)}")
        if not xp.isdtype(x.dtype, "real floating"):
            raise ShapeError(f"{who}: quantile of a {dtype_name(x.dtype)} tensor (torch needs float or double)")
        kd = runtime_flag(keepdim, who, "keepdim")
        # q as a 1-d array in x's dtype (torch computes the ranks in the input's dtype)
        if isinstance(q, (int, float)) and not isinstance(q, bool):
            q_scalar, qa = True, xp.asarray([float(q)], dtype=x.dtype, device=self.device)
        elif hasattr(q, "shape") and q.ndim <= 1:
            q_scalar = q.ndim == 0
            qa = xp.reshape(q, (-1,))
            if not xp.isdtype(qa.dtype, "real floating"):
                raise ShapeError(f"{who}: q must be a floating tensor, found {dtype_name(qa.dtype)}")
            qa = xp.astype(qa, x.dtype)
        else:
            raise ShapeError(f"{who}: q must be a number or a 0-d/1-d tensor, found {q!r}")
        if qa.shape[0] and bool(xp.any((qa < 0) | (qa > 1) | xp.isnan(qa))):
            raise ShapeError(f"{who}: q values must be in the range [0, 1]")
        if dim is None:
            axis, xl = None, xp.reshape(x, (-1,))
        else:
            axis = _one_axis(dim, x.ndim, who)
            xl = xp.reshape(x, (1,)) if x.ndim == 0 else _last(xp, x, axis)
        n = xl.shape[-1]
        if n == 0:
            raise ShapeError(f"{who}: quantile of an empty slice (input shape {tuple(x.shape)})")
        s, _ = _sort_nan_last(xp, xl)
        rest = tuple(s.shape[:-1])
        qb = xp.reshape(qa, (qa.shape[0],) + (1,) * (len(rest) + 1))
        nan = xp.isnan(s)
        if self.op_type.endswith("nanquantile"):
            last = xp.astype(xp.sum(xp.astype(~nan, xp.int64), axis=-1, keepdims=True) - 1, x.dtype)
            ranks = qb * last
            ranks = xp.where(ranks < 0, xp.zeros_like(ranks), ranks)
        else:
            ranks = qb * float(n - 1)
            ranks = xp.where(xp.any(nan, axis=-1, keepdims=True), xp.full_like(ranks, float(n - 1)), ranks)
        if interpolation == "lower":
            ranks = xp.floor(ranks)
        elif interpolation == "higher":
            ranks = xp.ceil(ranks)
        elif interpolation == "nearest":
            ranks = xp.round(ranks)
        sb = xp.broadcast_to(s, (qa.shape[0],) + tuple(s.shape))
        below = xp.astype(ranks, xp.int64)
        out = xp.take_along_axis(sb, below, axis=-1)
        if interpolation in ("linear", "midpoint"):
            w = xp.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - xp.astype(below, x.dtype)
            above = xp.take_along_axis(sb, xp.astype(xp.ceil(ranks), xp.int64), axis=-1)
            out = _lerp(xp, out, above, w)
        # out: (Q, *rest, 1)
        if axis is None:
            out = xp.reshape(out, (qa.shape[0],) + ((1,) * x.ndim if kd else ()))
        elif x.ndim == 0:
            out = xp.reshape(out, (qa.shape[0],))
        elif kd:
            out = xp.moveaxis(out, -1, axis + 1)
        else:
            out = xp.squeeze(out, axis=-1)
        return out[0, ...] if q_scalar else out


@register("aten::aminmax")
class AMinMax(_AtenArgs):
    """``torch.aminmax(input, dim=None, keepdim=False)``: (min, max) over ``dim`` or over all
    elements; a NaN gives NaN."""

    n_outputs = (2,)

    def forward(self, x: Any, dim: Any = None, keepdim: Any = False) -> Any:
        xp = self.xp
        axes = _axes_arg(dim, x.ndim, self.who)
        kd = runtime_flag(keepdim, self.who, "keepdim")
        _check_nonempty(self, x, axes)
        xc = xp.astype(x, xp.int8) if x.dtype == xp.bool else x
        lo, hi = xp.min(xc, axis=axes, keepdims=kd), xp.max(xc, axis=axes, keepdims=kd)
        if x.dtype == xp.bool:
            lo, hi = xp.astype(lo, xp.bool), xp.astype(hi, xp.bool)
        return lo, hi


@register("aten::count_nonzero")
class CountNonzero(_AtenArgs):
    """``torch.count_nonzero(input, dim=None)``: the int64 count of non-zero elements (NaN counts)
    over ``dim`` (an int or a list) or over all elements."""

    def forward(self, x: Any, dim: Any = None) -> Any:
        xp = self.xp
        nz = x if x.dtype == xp.bool else x != 0
        return xp.sum(xp.astype(nz, xp.int64), axis=_axes_arg(dim, x.ndim, self.who))


def _scan(xp: Any, state: tuple[Any, ...], combine: Any) -> tuple[Any, ...]:
    """Inclusive scan along the last axis (Hillis-Steele, log2(n) steps): ``combine(earlier,
    later)`` must be associative and returns the combined state arrays."""
    n = state[0].shape[-1]
    s = 1
    while s < n:
        head = tuple(a[..., :s] for a in state)
        merged = combine(tuple(a[..., :-s] for a in state), tuple(a[..., s:] for a in state))
        state = tuple(xp.concat((h, m), axis=-1) for h, m in zip(head, merged))
        s *= 2
    return state


@register("aten::logcumsumexp")
class LogCumSumExp(_AtenArgs):
    """``torch.logcumsumexp(input, dim)``: log of the running sum of exp along ``dim``, computed as
    a scan of ``logaddexp`` (no overflow for large inputs, no underflow for small early ones)."""

    def forward(self, x: Any, dim: Any) -> Any:
        xp = self.xp
        _need_float(self, x, "logcumsumexp")
        axis = _one_axis(dim, x.ndim, self.who)
        if x.ndim == 0:
            return x
        fast = getattr(self.backend.fast, "logcumsumexp", None)
        y = None if fast is None else fast(x, axis % x.ndim)
        if y is not None:
            return y
        (y,) = _scan(xp, (_last(xp, x, axis),), lambda a, b: (xp.logaddexp(a[0], b[0]),))
        return y if axis == x.ndim - 1 else xp.moveaxis(y, -1, axis)


@register("aten::cummax", "aten::cummin")
class CumMaxMin(_AtenArgs):
    """``torch.cummax`` / ``cummin(input, dim)``: the running max/min along ``dim`` and its int64
    index; ties take the later index, and from the first NaN on the value is NaN with the index
    of the latest NaN (torch's rule)."""

    n_outputs = (2,)

    def forward(self, x: Any, dim: Any) -> Any:
        xp = self.xp
        axis = _one_axis(dim, x.ndim, self.who)
        if x.ndim == 0:
            return x, xp.zeros((), dtype=xp.int64, device=self.device)
        fast = getattr(self.backend.fast, "cum_extreme", None)
        got = None if fast is None else fast(x, axis % x.ndim, self.op_type.endswith("cummax"))
        if got is not None:
            return got
        xl = _last(xp, x, axis)
        v = xp.astype(xl, xp.int8) if x.dtype == xp.bool else xl
        idx = xp.broadcast_to(xp.arange(v.shape[-1], dtype=xp.int64, device=self.device), tuple(v.shape))
        is_max, floating = self.op_type.endswith("cummax"), _is_float(xp, x.dtype)

        def combine(a, b):
            take_b = b[0] >= a[0] if is_max else b[0] <= a[0]
            if floating:
                take_b = xp.isnan(b[0]) | (~xp.isnan(a[0]) & take_b)
            return xp.where(take_b, b[0], a[0]), xp.where(take_b, b[1], a[1])

        v, idx = _scan(xp, (v, idx), combine)
        if x.dtype == xp.bool:
            v = xp.astype(v, xp.bool)
        if axis != x.ndim - 1:
            v, idx = xp.moveaxis(v, -1, axis), xp.moveaxis(idx, -1, axis)
        return v, idx


@register("aten::mode")
class Mode(_AtenArgs):
    """``torch.mode(input, dim=-1, keepdim=False)``: the most frequent value along ``dim`` (the
    smallest one on a tie in counts) and the int64 index of its last occurrence, as torch's CPU
    kernel returns them for rows of up to 16 values; for longer rows torch's index is whichever
    occurrence its unstable sort leaves last (measured: rows of 17 and 64 gave other indices),
    so only the value, and that the index points at an equal element, match there. NaNs are
    counted as distinct values."""

    n_outputs = (2,)

    def forward(self, x: Any, dim: Any = -1, keepdim: Any = False) -> Any:
        xp = self.xp
        axis = _one_axis(-1 if dim is None else dim, x.ndim, self.who)
        kd, scalar = runtime_flag(keepdim, self.who, "keepdim"), x.ndim == 0
        xl = xp.reshape(x, (1,)) if scalar else _last(xp, x, axis)
        n = xl.shape[-1]
        if n == 0:
            raise ShapeError(f"{self.who}: mode over dim {axis} of size 0 (input shape {tuple(x.shape)})")
        xc = xp.astype(xl, xp.int8) if x.dtype == xp.bool else xl
        s, _ = _sort_nan_last(xp, xc)
        pos = xp.broadcast_to(xp.arange(n, dtype=xp.int64, device=self.device), tuple(s.shape))
        first = xp.ones(s.shape[:-1] + (1,), dtype=xp.bool, device=self.device)
        starts = xp.concat((first, s[..., 1:] != s[..., :-1]), axis=-1)
        (run_start,) = _scan(xp, (xp.where(starts, pos, xp.zeros_like(pos)),),
                             lambda a, b: (xp.maximum(a[0], b[0]),))
        length = pos - run_start + 1
        best = xp.argmax(length, axis=-1, keepdims=True)  # first (smallest-valued) longest run
        value = xp.take_along_axis(s, xp.astype(best, xp.int64), axis=-1)
        same = xc == value
        if _is_float(xp, xc.dtype):  # (a NaN mode: one of the NaNs, never -1)
            same = same | (xp.isnan(xc) & xp.isnan(value))
        idx = xp.max(xp.where(same, pos, xp.full_like(pos, -1)), axis=-1, keepdims=True)
        if x.dtype == xp.bool:
            value = xp.astype(value, xp.bool)
        return _finish(xp, value, axis, kd, scalar), _finish(xp, idx, axis, kd, scalar)


@register("aten::nansum", "aten::nanmean")
class NanSumMean(_AtenArgs):
    """``torch.nansum`` / ``nanmean(input, dim=None, keepdim=False, dtype=None)``: the sum / mean
    with NaNs left out (an all-NaN slice sums to 0, has mean NaN). nansum of an integer or bool
    tensor accumulates in int64; nanmean needs a floating input."""

    def forward(self, x: Any, dim: Any = None, keepdim: Any = False, *_: Any) -> Any:
        xp = self.xp
        axes = _axes_arg(dim, x.ndim, self.who)
        kd = runtime_flag(keepdim, self.who, "keepdim")
        dt = getattr(xp, self.out_dtype) if self.out_dtype else (x.dtype if _is_float(xp, x.dtype) else xp.int64)
        is_mean = self.op_type.endswith("nanmean")
        if is_mean and not _is_float(xp, dt):
            raise ShapeError(f"{self.who}: nanmean of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
        if not _is_float(xp, x.dtype):
            return xp.sum(_no_bool(xp, x, dt), axis=axes, dtype=dt, keepdims=kd)
        keep = ~xp.isnan(x)
        xz = xp.where(keep, x, xp.zeros_like(x))
        if x.dtype != dt:
            xz = xp.astype(xz, dt)
        if dt == getattr(xp, "float16", None):  # torch accumulates half sums in float32
            total = xp.astype(xp.sum(xp.astype(xz, xp.float32), axis=axes, keepdims=kd), dt)
        else:
            total = xp.sum(xz, axis=axes, keepdims=kd)
        if not is_mean:
            return total
        return total / xp.astype(xp.sum(xp.astype(keep, xp.int64), axis=axes, keepdims=kd), dt)
