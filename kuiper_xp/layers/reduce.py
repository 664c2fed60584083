"""Reduction layers: mean, sum, prod, max/min (values, or values and indices), amax/amin,
argmax/argmin, std/var, logsumexp, norm, all/any, and the cumulative sum/product.

Dims are ``dim=`` (an int, a list, or absent/None for all dims) with ``keepdim=``; the axes for a
given input rank are worked out once and cached. Result dtypes follow torch: sum/prod/cumsum of
an integer or bool tensor accumulate in int64, mean of an integer tensor is an error, indices are
int64. When pnnx dropped a ``dtype=`` argument (``x.sum(1, dtype=torch.float64)``), the output's
dtype annotation in the file says what torch produced, and it is honoured.
"""

from __future__ import annotations

from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .registry import register
from .shape import ShapeLayer, dtype_name, norm_dim, norm_dims, out_dtype, runtime_int, runtime_ints

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
                             f"input here; cast it first)")
        if x.dtype != dt:
            x = xp.astype(x, dt)
        return xp.mean(x, axis=self.axes(x.ndim), keepdims=self.keepdim)


def _no_bool(xp: Any, x: Any, dt: Any) -> Any:
    """The Array API does not sum booleans: count them as ints (torch sums bool to int64)."""
    return xp.astype(x, dt) if x.dtype == xp.bool else x


@register("torch.sum", "Tensor.sum")
class Sum(_Reduce):
    def forward(self, x: Any) -> Any:
        xp = self.xp
        dt = self._out_dtype(x, xp.int64)
        return xp.sum(_no_bool(xp, x, dt), axis=self.axes(x.ndim), dtype=dt, keepdims=self.keepdim)


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
        red = xp.max if self.is_max else xp.min
        values = red(x, axis=axes, keepdims=self.keepdim)
        if not self.with_indices:
            return values
        arg = xp.argmax if self.is_max else xp.argmin
        idx = arg(x, axis=axes[0], keepdims=self.keepdim)
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


@register("torch.std", "torch.var", "Tensor.std", "Tensor.var")
class StdVar(_Reduce):
    """Standard deviation / variance with ``unbiased`` (bool) or ``correction`` (number)."""

    def __init__(self, ctx: BuildContext, dims, keepdim, dtype, correction: float, is_std: bool):
        super().__init__(ctx, dims, keepdim, dtype)
        self.correction, self.is_std = correction, is_std

    @classmethod
    def from_operator(cls, op, ctx):
        if op.has_param("correction") and op.params["correction"] is not None:
            corr = op.param("correction", float)
        else:
            corr = 1.0 if op.param("unbiased", bool, True) else 0.0
        return cls(ctx, *_dims_keepdim(op), out_dtype(op), corr, op.type.endswith("std"))

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if not _is_float(xp, x.dtype):
            raise ShapeError(f"{self.who}: std/var of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
        f = xp.std if self.is_std else xp.var
        return f(x, axis=self.axes(x.ndim), correction=self.correction, keepdims=self.keepdim)


@register("torch.logsumexp", "Tensor.logsumexp")
class LogSumExp(_Reduce):
    """log(sum(exp(x))) = m + log(sum(exp(x - m))) with m the (finite) max; an all -inf slice
    gives -inf, an inf anywhere gives inf."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if not _is_float(xp, x.dtype):
            x = xp.astype(x, xp.float32)
        axes = self.axes(x.ndim)
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
    (count of non-zeros) or any other number."""

    def __init__(self, ctx: BuildContext, dims, keepdim, dtype, p: float):
        super().__init__(ctx, dims, keepdim, dtype)
        self.p = p

    @classmethod
    def from_operator(cls, op, ctx):
        key = "ord" if op.has_param("ord") else "p"
        raw = op.param(key, None, 2.0)
        if raw is None or raw == "fro":
            p = 2.0
        elif isinstance(raw, str) and raw in ("inf", "-inf"):
            p = float(raw)
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            p = float(raw)
        else:
            raise LayerParameterError(f"{op.where}: parameter {key!r} should be a number, 'fro' or inf, found {raw!r}")
        return cls(ctx, *_dims_keepdim(op), out_dtype(op), p)

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if not _is_float(xp, x.dtype):
            raise ShapeError(f"{self.who}: norm of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
        axes, kd, p = self.axes(x.ndim), self.keepdim, self.p
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


@register("torch.all", "torch.any", "Tensor.all", "Tensor.any")
class AllAny(_Reduce):
    """Logical and/or over ``dim`` (all dims when absent); the result is bool."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        f = xp.all if self.op_type.endswith("all") else xp.any
        return f(x, axis=self.axes(x.ndim), keepdims=self.keepdim)


@register("torch.cumsum", "Tensor.cumsum")
class CumSum(Layer):
    """Running sum along ``dim``; an integer/bool input accumulates in int64 (as torch)."""

    prod = False

    def __init__(self, ctx: BuildContext, dim: int, dtype: str | None):
        super().__init__(ctx)
        self.dim, self.dtype = dim, dtype

    @classmethod
    def from_operator(cls, op, ctx):
        return cls(ctx, op.param("dim", int), out_dtype(op))

    def forward(self, x: Any) -> Any:
        xp = self.xp
        who = f"{self.op_type} {self.op_name!r}"
        if x.ndim == 0:
            x = xp.reshape(x, (1,))
            d, scalar = 0, True
        else:
            d, scalar = norm_dim(self.dim, x.ndim, who), False
        dt = getattr(xp, self.dtype, None) if self.dtype else None
        if dt is None:
            dt = x.dtype if _is_float(xp, x.dtype) else xp.int64
        f = xp.cumulative_prod if self.prod else xp.cumulative_sum
        out = f(_no_bool(xp, x, dt), axis=d, dtype=dt)
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
            return (xp.all if kind == "all" else xp.any)(x, axis=axes, keepdims=kd)
        if kind in ("amax", "amin"):
            return (xp.max if kind == "amax" else xp.min)(x, axis=axes, keepdims=kd)
        dt = self._out_dtype(x, xp.int64)
        if kind == "mean":
            if not _is_float(xp, dt):
                raise ShapeError(f"{self.who}: mean of a {dtype_name(x.dtype)} tensor (torch needs a floating input)")
            return xp.mean(x if x.dtype == dt else xp.astype(x, dt), axis=axes, keepdims=kd)
        f = xp.prod if kind == "prod" else xp.sum
        return f(_no_bool(xp, x, dt), axis=axes, dtype=dt, keepdims=kd)


@register("aten::var_mean", "aten::std_mean", "torch.var_mean", "torch.std_mean")
class StdVarMean(_Reduce):
    """``torch.var_mean`` / ``std_mean``: (var or std, mean). pnnx leaves them as ``aten::``
    operators whose dim, unbiased (a bool) or correction (a number, None meaning 1) and keepdim
    arrive as inputs from constant expressions; the ``torch.`` spellings carry parameters."""

    def __init__(self, ctx: BuildContext, dims, keepdim, dtype, correction: float | None, is_std: bool):
        super().__init__(ctx, dims, keepdim, dtype)
        self.correction, self.is_std = correction, is_std

    @classmethod
    def from_operator(cls, op, ctx):
        is_std = op.type.split("::")[-1].split(".")[-1].startswith("std")
        if op.type.startswith("aten::"):
            return cls(ctx, None, False, out_dtype(op), None, is_std)
        if op.has_param("correction") and op.params["correction"] is not None:
            corr = op.param("correction", float)
        else:
            corr = 1.0 if op.param("unbiased", bool, True) else 0.0
        return cls(ctx, *_dims_keepdim(op), out_dtype(op), corr, is_std)

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
        return (f(x, axis=axes, correction=corr, keepdims=kd), xp.mean(x, axis=axes, keepdims=kd))
