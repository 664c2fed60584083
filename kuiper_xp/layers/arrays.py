"""Array builders and statistics that pnnx leaves as ``aten::`` operators: ``aten::movedim``,
``aten::unfold`` (``Tensor.unfold``), ``aten::fliplr`` / ``flipud`` / ``msort``, ``aten::diff``,
``aten::vander``, ``aten::combinations``, ``aten::trapezoid`` / ``trapz`` /
``cumulative_trapezoid``, ``aten::cov`` / ``corrcoef``, ``aten::renorm``, ``aten::pdist``,
``aten::atleast_1d`` / ``2d`` / ``3d``, ``aten::ravel``, ``aten::take``, ``aten::eye`` (``torch.eye`` of a
size from the input's shape; a constant size is folded by pnnx) and the window functions
``aten::hann_window`` / ``hamming_window`` / ``blackman_window`` / ``bartlett_window`` /
``kaiser_window`` of such a length (a spectrogram's ``torch.hann_window(x.shape[-1])``).

pnnx spellings (torch 2.13 exports); every scalar argument arrives as an input fed by a constant
``pnnx.Expression`` (``expr=1``, ``expr=[0,1]``, ``expr=None``, ``expr=True``, ``expr=inf``):

* ``torch.movedim(x, 0, -1)``, ``torch.moveaxis`` and ``Tensor.movedim``: ``aten::movedim op 3 1
  x source destination`` (ints or lists). ``torch.swapaxes`` / ``swapdims`` become
  ``torch.transpose``.
* ``x.unfold(dimension, size, step)``: ``aten::unfold op 4 1 x dimension size step``.
* ``torch.fliplr`` / ``flipud`` / ``msort``: one input.
* ``torch.diff(x, n, dim, prepend, append)``: ``aten::diff op 5 1 x n dim prepend append`` (the
  two tensors or ``expr=None``).
* ``torch.vander(x, N, increasing)``: ``aten::vander op 3 1 x N increasing``.
* ``torch.combinations(x, r, with_replacement)``: ``aten::combinations op 3 1 x r
  with_replacement``.
* ``torch.trapezoid(y, x=None, dx=None, dim=-1)``: ``aten::trapezoid op 3 1 y x_or_dx dim``; the
  second input is the sample tensor ``x`` or the number ``dx`` (``expr=1`` when neither is
  given). ``torch.trapz`` is ``aten::trapz`` and ``torch.cumulative_trapezoid``
  ``aten::cumulative_trapezoid``, same operands.
* ``torch.cov(x, correction, fweights, aweights)``: ``aten::cov op 4 1 x correction fweights
  aweights`` (weights are tensors, often folded ``pnnx.Attribute`` constants, or ``expr=None``);
  ``torch.corrcoef``: ``aten::corrcoef op 1 1 x``.
* ``torch.renorm(x, p, dim, maxnorm)``: ``aten::renorm op 4 1 x p dim maxnorm``; ``torch.pdist(x,
  p)``: ``aten::pdist op 2 1 x p``.
* ``torch.atleast_2d(x)``: ``aten::atleast_2d op 1 1 x y``; given a list of tensors
  (``torch.atleast_2d((a, b))``) the input is a list expression ``expr=[@0,@1]`` and the output a
  list taken apart by ``prim::ListUnpack``.
* ``torch.ravel``: ``aten::ravel op 1 1 x y``; ``torch.take(x, index)``: ``aten::take op 2 1 x
  index y``.

Semantics follow torch 2.13, dtypes included: ``diff`` of bool tensors is a logical xor, integer
``vander`` gives int64, ``cov`` / ``corrcoef`` / ``trapezoid`` of integer tensors give float32,
``renorm`` and ``pdist`` need floating tensors, ``cov`` has torch's one-observation corner cases
and sets a non-positive number of degrees of freedom to 0 (inf / NaN results, as torch, without
its warning).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.limits import check_elements

from .base import BuildContext, Layer
from .checks import check_range
from .mathops import _bessel_i
from .misc import is_float, output_dtype, promote
from .registry import register
from .shape import dtype_name, norm_dim, norm_dims, runtime_int, runtime_ints


def _is_array(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype")


class _ArrayLayer(Layer):
    """Common helpers: the op's name for messages, operand count, scalar arguments."""

    n_inputs: tuple[int, ...] = (1,)

    @property
    def who(self) -> str:
        return f"{self.op_type} {self.op_name!r}"

    @classmethod
    def from_operator(cls, op, ctx: BuildContext):
        if len(op.inputs) not in cls.n_inputs:
            want = " or ".join(str(n) for n in cls.n_inputs)
            raise LayerParameterError(f"{op.where}: expected {want} input(s), found {len(op.inputs)}")
        return cls(ctx)

    def _int(self, v: Any, what: str) -> int:
        return runtime_int(v, self.who, what)

    def _flag(self, v: Any, what: str) -> bool:
        if v is None:
            return False
        if isinstance(v, bool):
            return v
        if _is_array(v) and v.dtype == self.xp.bool and len(v.shape) == 0:
            return bool(v)
        return bool(self._int(v, what))

    def _number(self, v: Any, what: str) -> float:
        """A real number (int or float, not bool) from a constant input."""
        if isinstance(v, bool):
            raise ShapeError(f"{self.who}: {what} should be a real number, found {v!r}")
        if isinstance(v, (int, float)):
            return float(v)
        if _is_array(v) and len(v.shape) == 0 and v.dtype != self.xp.bool:
            return float(v)
        raise ShapeError(f"{self.who}: {what} should be a real number, found {v!r}")

    def _out_dtype(self, code: Any) -> Any:
        """The result dtype of a factory op: the one the file declares for the output (``self.dtype``),
        else the ``dtype`` input's torch ScalarType code, else float32."""
        declared = getattr(self, "dtype", None)
        if declared is not None:
            return declared
        c = None if code is None else self._int(code, "dtype")
        name = "float32" if c is None else _SCALAR_TYPES.get(c)
        if name is None or not hasattr(self.xp, name):
            raise ShapeError(f"{self.who}: unsupported dtype code {c}")
        return getattr(self.xp, name)

    def _tensor(self, v: Any, what: str) -> Any:
        if not _is_array(v):
            raise ShapeError(f"{self.who}: {what} should be a tensor, found {v!r}")
        return v

    def _float_dtype(self, dt: Any) -> Any:
        """The dtype torch gives a true division of ``dt`` values: float32 for integers/bool."""
        return dt if is_float(self.xp, dt) else self.xp.float32

    def _sum(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """torch.sum: integer and bool tensors sum in int64."""
        xp = self.xp
        if is_float(xp, x.dtype):
            return xp.sum(x, axis=axis, keepdims=keepdims)
        if x.dtype == xp.bool:
            x = xp.astype(x, xp.int64)
        return xp.sum(x, axis=axis, dtype=xp.int64, keepdims=keepdims)

    def _cumsum(self, x: Any, axis: int) -> Any:
        """torch.cumsum: integers accumulate in int64; float32 accumulates in float64 (torch's CPU
        accumulation type) and is rounded back."""
        xp = self.xp
        if x.dtype == xp.float32:
            return xp.astype(xp.cumulative_sum(xp.astype(x, xp.float64), axis=axis), xp.float32)
        if is_float(xp, x.dtype):
            return xp.cumulative_sum(x, axis=axis)
        return xp.cumulative_sum(xp.astype(x, xp.int64), axis=axis, dtype=xp.int64)

    def _slice(self, x: Any, axis: int, start: int | None, stop: int | None) -> Any:
        # (bounds resolved against the axis: the standard leaves a negative or out-of-range stop
        # on an empty axis unspecified, and array_api_strict refuses it)
        lo, hi, _ = slice(start, stop).indices(x.shape[axis])
        key = [slice(None)] * x.ndim
        key[axis] = slice(lo, max(lo, hi))
        return x[tuple(key)]

    def _promote(self, a: Any, b: Any) -> tuple[Any, Any]:
        return promote(self.xp, a, b)


# ---------------------------------------------------------------------------------------------
# shape builders


@register("aten::movedim")
class MoveDim(_ArrayLayer):
    """``torch.movedim`` / ``moveaxis``: moves the dims ``source`` to the positions ``destination``,
    the other dims keeping their order."""

    n_inputs = (3,)

    def forward(self, x: Any, source: Any, destination: Any) -> Any:
        src = runtime_ints(source, self.who, "source")
        dst = runtime_ints(destination, self.who, "destination")
        if len(src) != len(dst):
            raise ShapeError(f"{self.who}: source {src} and destination {dst} should have the same number of "
                             f"elements")
        nd = max(x.ndim, 1)
        src = norm_dims(src, nd, self.who, "source")
        dst = norm_dims(dst, nd, self.who, "destination")
        if x.ndim == 0:
            return x
        order: list[int | None] = [None] * x.ndim
        for s, d in zip(src, dst):
            order[d] = s
        rest = iter(d for d in range(x.ndim) if d not in src)
        perm = tuple(next(rest) if o is None else o for o in order)
        return x if perm == tuple(range(x.ndim)) else self.xp.permute_dims(x, perm)


@register("aten::unfold")
class Unfold(_ArrayLayer):
    """``Tensor.unfold(dimension, size, step)``: the windows ``x[..., i*step : i*step + size, ...]``
    of ``dimension``, which becomes the window count, each window's values in a new last dim."""

    n_inputs = (4,)

    def forward(self, x: Any, dimension: Any, size: Any, step: Any) -> Any:
        xp = self.xp
        d = norm_dim(self._int(dimension, "dimension"), max(x.ndim, 1), self.who, "dimension")
        size, step = self._int(size, "size"), self._int(step, "step")
        n = x.shape[d] if x.ndim else 1
        if size < 0:
            raise ShapeError(f"{self.who}: size is {size} but must be >= 0")
        if size > n:
            raise ShapeError(f"{self.who}: maximum size for tensor at dimension {d} is {n} but size is {size}")
        if step <= 0:
            raise ShapeError(f"{self.who}: step is {step} but must be > 0")
        if x.ndim == 0:
            return xp.reshape(x, (1,))[:size]
        count = (n - size) // step + 1
        starts = xp.arange(count, dtype=xp.int64, device=self.device) * step
        idx = xp.reshape(starts[:, None] + xp.arange(size, dtype=xp.int64, device=self.device)[None, :], (-1,))
        y = xp.take(x, idx, axis=d)
        shape = tuple(x.shape)
        y = xp.reshape(y, shape[:d] + (count, size) + shape[d + 1:])
        perm = tuple(range(d + 1)) + tuple(range(d + 2, x.ndim + 1)) + (d + 1,)
        return xp.permute_dims(y, perm)


@register("aten::fliplr")
class FlipLR(_ArrayLayer):
    """``torch.fliplr``: reverses dim 1 (a tensor of >= 2 dims)."""

    axis = 1

    def forward(self, x: Any) -> Any:
        if x.ndim <= self.axis:
            found = f"shape {tuple(x.shape)}" if x.ndim else "a 0-d tensor"
            raise ShapeError(f"{self.who}: input must be >= {self.axis + 1}-d, found {found}")
        return self.xp.flip(x, axis=self.axis)


@register("aten::flipud")
class FlipUD(FlipLR):
    """``torch.flipud``: reverses dim 0 (a tensor of >= 1 dims)."""

    axis = 0


@register("aten::msort")
class MSort(_ArrayLayer):
    """``torch.msort``: the values sorted ascending along dim 0 (NaN last)."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if x.ndim == 0:
            return x
        if x.dtype == xp.bool:
            return xp.astype(xp.sort(xp.astype(x, xp.uint8), axis=0), xp.bool)
        return xp.sort(x, axis=0)


@register("aten::atleast_1d", "aten::atleast_2d", "aten::atleast_3d")
class AtLeast(_ArrayLayer):
    """``torch.atleast_1d`` / ``2d`` / ``3d``: a view with at least 1, 2 or 3 dims (0-d -> (1,),
    (1, 1), (1, 1, 1); 1-d (n,) -> (1, n) or (1, n, 1); 2-d (m, n) -> (m, n, 1)); a list of
    tensors gives the list of their views."""

    nd = 1

    @classmethod
    def from_operator(cls, op, ctx):
        layer = super().from_operator(op, ctx)
        layer.nd = int(op.type[-2])  # (aten::atleast_Nd)
        return layer

    def _one(self, x: Any) -> Any:
        x = self._tensor(x, "input")
        xp, nd = self.xp, self.nd
        if x.ndim >= nd:
            return x
        if x.ndim == 0:
            return xp.reshape(x, (1,) * nd)
        if nd == 2 or x.ndim == 2:  # (n,) -> (1, n); (m, n) -> (m, n, 1)
            return xp.reshape(x, (1,) + tuple(x.shape) if nd == 2 else tuple(x.shape) + (1,))
        return xp.reshape(x, (1, x.shape[0], 1))

    def forward(self, x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return [self._one(v) for v in x]
        return self._one(x)


@register("aten::ravel")
class Ravel(_ArrayLayer):
    """``torch.ravel``: the values as a 1-d tensor in row-major order."""

    def forward(self, x: Any) -> Any:
        return self.xp.reshape(x, (-1,))


@register("aten::take")
class Take(_ArrayLayer):
    """``torch.take(x, index)``: the values of ``x`` read as a flat row-major array at the int64
    ``index`` (negative indices count from the end); the result has ``index``'s shape."""

    n_inputs = (2,)

    def forward(self, x: Any, index: Any) -> Any:
        xp = self.xp
        index = self._tensor(index, "index")
        if index.dtype != xp.int64:
            raise ShapeError(f"{self.who}: expected an int64 index tensor, found {dtype_name(index.dtype)}")
        flat = xp.reshape(x, (-1,))
        n = flat.shape[0]
        idx = xp.reshape(index, (-1,))
        if idx.shape[0]:
            idx, _ = check_range(xp, idx, -n, n, lambda bad: f"{self.who}: index "
                                 f"{'' if bad is None else f'{bad} '}is out of range for a tensor "
                                 f"of {n} elements")
            idx = xp.where(idx < 0, idx + n, idx)
        return xp.reshape(xp.take(flat, idx, axis=0), tuple(index.shape))


# ---------------------------------------------------------------------------------------------
# differences, powers, combinations


@register("aten::diff")
class Diff(_ArrayLayer):
    """``torch.diff``: the n-th forward difference ``out[i] = x[i+1] - x[i]`` along ``dim``, after
    ``prepend`` / ``append`` are joined on (a logical xor for bool tensors)."""

    n_inputs = (5,)

    def forward(self, x: Any, n: Any, dim: Any, prepend: Any, append: Any) -> Any:
        xp = self.xp
        if x.ndim == 0:
            raise ShapeError(f"{self.who}: diff expects input to be at least one-dimensional")
        n = 1 if n is None else self._int(n, "n")
        if n < 0:
            raise ShapeError(f"{self.who}: order must be non-negative but got {n}")
        d = norm_dim(-1 if dim is None else self._int(dim, "dim"), x.ndim, self.who)
        parts = []
        for what, t in (("prepend", prepend), (None, x), ("append", append)):
            if t is None:
                continue
            t = self._tensor(t, what)
            if what is not None:
                if t.ndim != x.ndim:
                    raise ShapeError(f"{self.who}: {what} should have the same number of dims as the input "
                                     f"({x.ndim}), found shape {tuple(t.shape)}")
                for k in range(x.ndim):
                    if k != d and t.shape[k] != x.shape[k]:
                        raise ShapeError(f"{self.who}: the shape of {what} {tuple(t.shape)} should match the "
                                         f"input's {tuple(x.shape)} except along dim {d}")
            parts.append(t)
        if n == 0:
            return x
        if len(parts) > 1:
            dt = parts[0].dtype
            for t in parts[1:]:
                dt = self._promote(xp.zeros((), dtype=dt, device=self.device), t)[0].dtype
            x = xp.concat([t if t.dtype == dt else xp.astype(t, dt) for t in parts], axis=d)
        for _ in range(min(n, x.shape[d])):
            hi, lo = self._slice(x, d, 1, None), self._slice(x, d, None, -1)
            x = xp.logical_xor(hi, lo) if x.dtype == xp.bool else hi - lo
        return x


@register("aten::vander")
class Vander(_ArrayLayer):
    """``torch.vander(x, N, increasing)``: the Vandermonde matrix, column j = ``x ** (N-1-j)``
    (``x ** j`` when increasing) by repeated multiplication; integer and bool inputs give int64."""

    n_inputs = (3,)

    def forward(self, x: Any, n: Any, increasing: Any) -> Any:
        xp = self.xp
        if x.ndim != 1:
            raise ShapeError(f"{self.who}: x must be a one-dimensional tensor, found shape {tuple(x.shape)}")
        n = x.shape[0] if n is None else self._int(n, "N")
        if n < 0:
            raise ShapeError(f"{self.who}: N must be non-negative, found {n}")
        dt = x.dtype if is_float(xp, x.dtype) else xp.int64
        x = x if x.dtype == dt else xp.astype(x, dt)
        if n == 0:
            return xp.zeros((x.shape[0], 0), dtype=dt, device=self.device)
        cols = [xp.ones(x.shape, dtype=dt, device=self.device)]
        for _ in range(n - 1):
            cols.append(cols[-1] * x)
        if not self._flag(increasing, "increasing"):
            cols.reverse()
        return xp.stack(cols, axis=1)


#: torch's ScalarType codes, as pnnx writes a ``dtype`` argument it keeps as an input
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                 7: "float64", 11: "bool"}


@register("aten::linspace")
class Linspace(_ArrayLayer):
    """``torch.linspace(start, end, steps, dtype)`` (pnnx: ``aten::linspace op 7 1 start end steps
    dtype layout device pin_memory``, the scalars as inputs, ``steps`` often ``size(@0,k)``): as
    torch computes it, ``start + i*step`` for the first half of the points and ``end - (steps-1-i)
    *step`` for the rest, ``step = (end - start) / (steps - 1)``, in the output's float dtype
    (float64 for integer outputs, then truncated). The dtype is the one the file declares for the
    output, else the ``dtype`` code, else float32."""

    n_inputs = (7,)

    def __init__(self, ctx: BuildContext, dtype: Any):
        super().__init__(ctx)
        self.dtype = dtype

    @classmethod
    def from_operator(cls, op, ctx: BuildContext):
        if len(op.inputs) not in cls.n_inputs:
            raise LayerParameterError(f"{op.where}: expected 7 inputs, found {len(op.inputs)}")
        return cls(ctx, output_dtype(op, ctx.xp))

    def forward(self, start: Any, end: Any, steps: Any, dtype: Any, *_: Any) -> Any:
        xp = self.xp
        out = self._out_dtype(dtype)
        n = self._int(steps, "steps")
        if n < 0:
            raise ShapeError(f"{self.who}: number of steps must be non-negative, found {n}")
        a, b = self._number(start, "start"), self._number(end, "end")
        work = out if is_float(xp, out) else xp.float64
        if n <= 1:
            return xp.astype(xp.full((n,), a, dtype=work, device=self.device), out)
        lo = xp.asarray(a, dtype=work, device=self.device)
        hi = xp.asarray(b, dtype=work, device=self.device)
        step = (hi - lo) / xp.asarray(n - 1, dtype=work, device=self.device)
        i = xp.arange(n, dtype=work, device=self.device)
        half = n // 2
        first = lo + step * i[:half]
        second = hi - step * (xp.asarray(n - 1, dtype=work, device=self.device) - i[half:])
        y = xp.concat([first, second])
        return y if y.dtype == out else xp.astype(y, out)


@register("aten::eye")
class Eye(_ArrayLayer):
    """``torch.eye(n)`` / ``torch.eye(n, m)`` whose size pnnx keeps as an input (``aten::eye op 5 1
    n dtype layout device pin_memory``, or 6 with ``m``; ``n`` often ``size(@0,k)``): ones on the
    diagonal of an (n, m) matrix. The dtype is the one the file declares for the output, else
    the ``dtype`` code, else float32."""

    n_inputs = (5, 6)

    def __init__(self, ctx: BuildContext, dtype: Any, square: bool):
        super().__init__(ctx)
        self.dtype, self.square = dtype, square

    @classmethod
    def from_operator(cls, op, ctx: BuildContext):
        if len(op.inputs) not in cls.n_inputs:
            raise LayerParameterError(f"{op.where}: expected 5 or 6 inputs (n, [m,] dtype, layout, device, "
                                      f"pin_memory), found {len(op.inputs)}")
        return cls(ctx, output_dtype(op, ctx.xp), len(op.inputs) == 5)

    def forward(self, n: Any, *rest: Any) -> Any:
        xp = self.xp
        m, dtype = (n, rest[0]) if self.square else (rest[0], rest[1])
        rows, cols = self._int(n, "n"), self._int(m, "m")
        if rows < 0 or cols < 0:
            raise ShapeError(f"{self.who}: n and m must be non-negative, found {rows} and {cols}")
        check_elements(rows * cols, self.who)
        out = self._out_dtype(dtype)
        return xp.eye(rows, cols, dtype=out, device=self.device)


@register("aten::hann_window", "aten::hamming_window", "aten::blackman_window", "aten::bartlett_window",
          "aten::kaiser_window")
class Window(_ArrayLayer):
    """``torch.hann_window(n, periodic=True, ...)`` and its kin whose length pnnx keeps as an input
    (``aten::hann_window op 5 1 n dtype layout device pin_memory``, 6 with ``periodic``;
    ``hamming_window`` also takes ``alpha``, ``beta``, ``kaiser_window`` ``beta``, before the
    dtype): computed as torch computes them, in the result dtype (float32 unless the file or the
    dtype code says otherwise; ``kaiser_window``'s Bessel ratio in float64), a periodic window
    being the first n points of the symmetric one of n + 1."""

    n_inputs = (5, 6, 7, 8)

    def __init__(self, ctx: BuildContext, dtype: Any):
        super().__init__(ctx)
        self.dtype = dtype

    @classmethod
    def from_operator(cls, op, ctx: BuildContext):
        most = {"aten::hamming_window": 8, "aten::kaiser_window": 7}.get(op.type, 6)
        if not 5 <= len(op.inputs) <= most:
            raise LayerParameterError(f"{op.where}: expected 5 to {most} inputs (window_length, [periodic, "
                                      f"parameters,] dtype, layout, device, pin_memory), found {len(op.inputs)}")
        return cls(ctx, output_dtype(op, ctx.xp))

    def forward(self, n: Any, *rest: Any) -> Any:
        xp = self.xp
        mid, code = rest[:-4], rest[-4]
        length = self._int(n, "window_length")
        if length < 0:
            raise ShapeError(f"{self.who}: window_length must be non-negative, found {length}")
        check_elements(length + 1, self.who)
        dt = self._out_dtype(code)
        if not xp.isdtype(dt, "real floating"):
            raise ShapeError(f"{self.who}: window functions need a floating dtype, found {dtype_name(dt)}")
        periodic = True if not mid else self._flag(mid[0], "periodic")
        if length <= 1:
            return xp.ones((length,), dtype=dt, device=self.device)
        m = length + 1 if periodic else length
        k = xp.arange(m, dtype=dt, device=self.device)
        kind = self.op_type.removeprefix("aten::").removesuffix("_window")
        if kind in ("hann", "hamming"):
            alpha = 0.5 if kind == "hann" else (self._number(mid[1], "alpha") if len(mid) > 1 else 0.54)
            beta = 0.5 if kind == "hann" else (self._number(mid[2], "beta") if len(mid) > 2 else 0.46)
            w = xp.cos(k * (2.0 * math.pi / (m - 1))) * (-beta) + alpha
        elif kind == "blackman":
            t = k * (math.pi / (m - 1))
            w = xp.cos(t * 4.0) * 0.08 - xp.cos(t * 2.0) * 0.5 + 0.42
        elif kind == "bartlett":
            t = k * (2.0 / (m - 1))
            first = ((m - 1) >> 1) + 1
            w = xp.concat([t[:first], 2.0 - t[first:]])
        else:  # kaiser: I0(beta sqrt(1 - ((k - a) / a)^2)) / I0(beta), a = (m - 1) / 2
            beta = self._number(mid[1], "beta") if len(mid) > 1 else 12.0
            a = (m - 1) / 2.0
            r = (xp.astype(k, xp.float64) - a) / a
            arg = beta * xp.sqrt(xp.clip(1.0 - r * r, 0.0, None))
            i0 = _bessel_i(xp.concat([arg, xp.asarray([beta], dtype=xp.float64, device=self.device)]), xp, 0,
                           False, math.log(float(xp.finfo(xp.float64).max)))
            w = xp.astype(i0[:-1] / i0[-1], dt)
        return w[:length] if periodic else w


@register("aten::combinations")
class Combinations(_ArrayLayer):
    """``torch.combinations(x, r, with_replacement)``: the rows are the r-element combinations of a
    1-d tensor's values, in ``itertools.combinations`` order (``combinations_with_replacement``
    with replacement)."""

    n_inputs = (3,)

    def forward(self, x: Any, r: Any, with_replacement: Any) -> Any:
        xp = self.xp
        if x.ndim != 1:
            raise ShapeError(f"{self.who}: expects a 1-d vector, found shape {tuple(x.shape)}")
        r = 2 if r is None else self._int(r, "r")
        if r < 0:
            raise ShapeError(f"{self.who}: r should be a non-negative number, found {r}")
        if r == 0:
            return xp.zeros((0,), dtype=x.dtype, device=self.device)
        combos = itertools.combinations_with_replacement if self._flag(with_replacement, "with_replacement") \
            else itertools.combinations
        flat = [i for c in combos(range(x.shape[0]), r) for i in c]
        idx = xp.asarray(flat, dtype=xp.int64, device=self.device)
        return xp.reshape(xp.take(x, idx, axis=0), (len(flat) // r, r))


# ---------------------------------------------------------------------------------------------
# trapezoid rule


class _Trapezoid(_ArrayLayer):
    n_inputs = (3,)
    cumulative = False

    def forward(self, y: Any, x_or_dx: Any, dim: Any) -> Any:
        xp = self.xp
        y = self._tensor(y, "y")
        d = norm_dim(-1 if dim is None else self._int(dim, "dim"), y.ndim, self.who) if y.ndim else None
        if d is None:
            raise ShapeError(f"{self.who}: y should have at least one dimension, found a 0-d tensor")
        if not self.cumulative and y.shape[d] == 0:  # torch (and numpy) integrate no samples to 0
            return xp.zeros(tuple(s for k, s in enumerate(y.shape) if k != d), dtype=y.dtype, device=self.device)
        if y.dtype == xp.bool or (_is_array(x_or_dx) and x_or_dx.dtype == xp.bool):
            raise ShapeError(f"{self.who}: received a bool input for x or y, but bool is not supported")
        left, right = self._slice(y, d, None, -1), self._slice(y, d, 1, None)
        if not _is_array(x_or_dx):  # a number dx
            dx = 1.0 if x_or_dx is None else self._number(x_or_dx, "dx")
            fdt = self._float_dtype(y.dtype)
            if self.cumulative:  # (dx / 2 * (left + right)).cumsum(dim)
                return self._cumsum(xp.astype(left + right, fdt) * (dx / 2.0), d)
            # (y.sum(dim) - (y[0] + y[-1]) * 0.5) * dx, the sum in int64 for integer y
            ends = self._slice(y, d, None, 1) + self._slice(y, d, -1, None)
            ends = xp.astype(xp.squeeze(ends, axis=d), fdt) * 0.5
            return (xp.astype(self._sum(y, axis=d), fdt) - ends) * dx
        x = x_or_dx
        if x.ndim == 1:
            if x.shape[0] != y.shape[d]:
                raise ShapeError(f"{self.who}: there must be one x value for each sample point, found "
                                 f"{x.shape[0]} x values for {y.shape[d]} samples")
            x = xp.reshape(x, tuple(x.shape[0] if k == d else 1 for k in range(y.ndim)))
        elif x.ndim < y.ndim:
            x = xp.reshape(x, (1,) * (y.ndim - x.ndim) + tuple(x.shape))
        dx = self._slice(x, d, 1, None) - self._slice(x, d, None, -1)
        a, b = self._promote(left + right, dx)
        try:
            _broadcast_shape(tuple(a.shape), tuple(b.shape))
        except ValueError:
            raise ShapeError(f"{self.who}: sample spacings of shape {tuple(dx.shape)} do not broadcast with the "
                             f"{tuple(left.shape)} values of y") from None
        prod = a * b
        s = self._cumsum(prod, d) if self.cumulative else self._sum(prod, axis=d)
        return xp.astype(s, self._float_dtype(s.dtype)) / 2.0


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for p, q in zip(a, b):
        if p != q and p != 1 and q != 1:
            raise ValueError(f"{a} and {b} do not broadcast")
        out.append(q if p == 1 else p)
    return tuple(out)


@register("aten::trapezoid", "aten::trapz")
class Trapezoid(_Trapezoid):
    """``torch.trapezoid`` / ``trapz``: the trapezoid-rule integral of ``y`` along ``dim``, with
    sample points ``x`` (a tensor) or the spacing ``dx`` (a number); integer y gives float32."""


@register("aten::cumulative_trapezoid")
class CumulativeTrapezoid(_Trapezoid):
    """``torch.cumulative_trapezoid``: the running trapezoid-rule integral of ``y`` along ``dim``
    (one value fewer than y), with sample points ``x`` or the spacing ``dx``."""

    cumulative = True


# ---------------------------------------------------------------------------------------------
# statistics


class _CovLayer(_ArrayLayer):
    def _cov(self, x: Any, correction: int, fw: Any, aw: Any) -> Any:
        """torch.cov (aten/src/ATen/native/Correlation.cpp), step by step with its dtypes."""
        xp = self.xp
        if x.ndim > 2:
            raise ShapeError(f"{self.who}: expected input to have two or fewer dimensions, found shape "
                             f"{tuple(x.shape)}")
        if x.dtype == xp.bool:
            raise ShapeError(f"{self.who}: bool dtype is not supported for input")
        data = xp.reshape(x, (1, -1)) if x.ndim < 2 else x
        n_obs = data.shape[1]
        w = None
        for what, t in (("fweights", fw), ("aweights", aw)):
            if t is None:
                continue
            t = self._tensor(t, what)
            if t.ndim > 1:
                raise ShapeError(f"{self.who}: expected {what} to have one or fewer dimensions, found shape "
                                 f"{tuple(t.shape)}")
            ok = is_float(xp, t.dtype) if what == "aweights" else (t.dtype != xp.bool and not is_float(xp, t.dtype))
            if not ok:
                kind = "floating point" if what == "aweights" else "integral"
                raise ShapeError(f"{self.who}: expected {what} to have {kind} dtype, found {dtype_name(t.dtype)}")
            if math.prod(t.shape) != n_obs:
                raise ShapeError(f"{self.who}: expected {what} to have as many elements as there are observations "
                                 f"in the input, found {math.prod(t.shape)} != {n_obs}")
            t = xp.reshape(t, (-1,))
            if n_obs and bool(xp.min(t) < 0):
                raise ShapeError(f"{self.who}: {what} cannot be negative")
            w = t if w is None else xp.multiply(*self._promote(w, t))
        if w is None:
            w_sum = xp.asarray(n_obs, dtype=xp.int64, device=self.device)
            total = self._sum(data, axis=1)
        else:
            w_sum = self._sum(w)
            if not bool(w_sum != 0):
                raise ShapeError(f"{self.who}: weights sum to zero, can't be normalized")
            total = self._sum(xp.multiply(*self._promote(data, w)), axis=1)
        fdt = self._float_dtype(total.dtype)
        avg = xp.astype(total, fdt) / xp.astype(w_sum, fdt)
        # the normalisation factor
        if w is None:
            norm = float(n_obs - correction)
        elif correction == 0:
            norm = float(w_sum)
        elif aw is None:
            norm = float(w_sum - correction)
        elif fw is None and n_obs == 1 and correction == 1:
            norm = 0.0
        else:
            aw1 = xp.reshape(aw, (-1,))
            norm = float(w_sum - correction * self._sum(xp.multiply(*self._promote(w, aw1))) / w_sum)
        norm = max(norm, 0.0)
        if n_obs == 1 and (fw is None) != (aw is None):  # torch's one-observation corner case
            centred = xp.zeros(data.shape, dtype=self._float_dtype(data.dtype), device=self.device)
        else:
            centred = xp.subtract(*self._promote(data, avg[:, None]))
        other = centred if w is None else xp.multiply(*self._promote(centred, w))
        a, b = self._promote(centred, other)
        c = self.matmul(a, xp.matrix_transpose(b))
        c = c / norm
        ones = tuple(k for k, s in enumerate(c.shape) if s == 1)
        return xp.squeeze(c, axis=ones) if ones else c


@register("aten::cov")
class Cov(_CovLayer):
    """``torch.cov(x, correction, fweights, aweights)``: the covariance matrix of the variables
    in the rows of ``x`` (observations in the columns), optionally weighted; size-1 dims are
    squeezed away and integer inputs give float32."""

    n_inputs = (4,)

    def forward(self, x: Any, correction: Any, fweights: Any, aweights: Any) -> Any:
        corr = 1 if correction is None else self._int(correction, "correction")
        return self._cov(self._tensor(x, "input"), corr, fweights, aweights)


@register("aten::corrcoef")
class CorrCoef(_CovLayer):
    """``torch.corrcoef``: the Pearson correlation coefficients of the rows of ``x``, the covariance
    divided by the standard deviations and clipped to [-1, 1]."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        c = self._cov(self._tensor(x, "input"), 1, None, None)
        if c.ndim == 0:
            return c / c
        k = c.shape[0]
        std = xp.sqrt(xp.reshape(c, (-1,))[::k + 1])
        c = c / std[:, None]
        c = c / std[None, :]
        return xp.clip(c, min=-1.0, max=1.0)


def _vector_norm(xp: Any, d: Any, p: float, axis: Any, keepdims: bool = False) -> Any:
    """torch.linalg.vector_norm of a floating tensor (``p`` > 0, or 0: the count of nonzeros)."""
    if p == 0:
        return xp.sum(xp.astype(d != 0, d.dtype), axis=axis, keepdims=keepdims)
    a = xp.abs(d)
    if p == math.inf:
        return xp.max(a, axis=axis, keepdims=keepdims)
    if p == 1:
        return xp.sum(a, axis=axis, keepdims=keepdims)
    if p == 2:
        return xp.sqrt(xp.sum(a * a, axis=axis, keepdims=keepdims))
    return xp.sum(a ** p, axis=axis, keepdims=keepdims) ** (1.0 / p)


@register("aten::renorm")
class Renorm(_ArrayLayer):
    """``torch.renorm(x, p, dim, maxnorm)``: each slice ``x.select(dim, i)`` whose p-norm exceeds
    ``maxnorm`` is scaled to norm ``maxnorm`` (by ``maxnorm / (norm + 1e-7)``)."""

    n_inputs = (4,)

    def forward(self, x: Any, p: Any, dim: Any, maxnorm: Any) -> Any:
        xp = self.xp
        p, maxnorm = self._number(p, "p"), self._number(maxnorm, "maxnorm")
        if not p > 0:
            raise ShapeError(f"{self.who}: non-positive norm p={p} not supported")
        if not maxnorm >= 0:
            raise ShapeError(f"{self.who}: expected maxnorm to be >= 0 but got {maxnorm}")
        if x.ndim < 2:
            raise ShapeError(f"{self.who}: input needs at least 2 dimensions, found shape {tuple(x.shape)}")
        if not is_float(xp, x.dtype):
            raise ShapeError(f"{self.who}: expected a floating point tensor, found {dtype_name(x.dtype)}")
        d = norm_dim(self._int(dim, "dim"), x.ndim, self.who)
        if x.shape[d] == 0 or math.prod(x.shape) == 0:
            return x
        axes = tuple(k for k in range(x.ndim) if k != d)
        norm = _vector_norm(xp, x, p, axes, keepdims=True)
        m = xp.asarray(maxnorm, dtype=x.dtype, device=self.device)
        factor = xp.where(norm > m, m / (norm + 1e-7), xp.ones_like(norm))
        return x * factor


#: pairs of :class:`PDist` rows differenced at a time, times the row length
PDIST_BLOCK_ELEMENTS = 1 << 20


@register("aten::pdist")
class PDist(_ArrayLayer):
    """``torch.pdist(x, p)``: the p-norm distances between the rows of a 2-d tensor, for every pair
    i < j in row-major order (``N * (N - 1) / 2`` values)."""

    n_inputs = (2,)

    def forward(self, x: Any, p: Any) -> Any:
        xp = self.xp
        p = 2.0 if p is None else self._number(p, "p")
        if x.ndim != 2:
            raise ShapeError(f"{self.who}: only supports 2-d tensors, found shape {tuple(x.shape)}")
        if not is_float(xp, x.dtype):
            raise ShapeError(f"{self.who}: only supports floating-point dtypes, found {dtype_name(x.dtype)}")
        if not p >= 0:
            raise ShapeError(f"{self.who}: only supports non-negative p values, found {p}")
        n, m = x.shape
        pairs = n * (n - 1) // 2
        if pairs == 0 or m == 0:
            return xp.zeros((pairs,), dtype=x.dtype, device=self.device)
        r = xp.arange(n, dtype=xp.int64, device=self.device)
        first, second = xp.nonzero(r[None, :] > r[:, None])  # (row-major: the pairs' order)
        step = max(1, PDIST_BLOCK_ELEMENTS // m)  # (blocks of pairs: no (pairs, m) differences at once)
        out = []
        for k0 in range(0, pairs, step):
            k1 = min(pairs, k0 + step)
            a = xp.take(x, first[k0:k1], axis=0)
            b = xp.take(x, second[k0:k1], axis=0)
            out.append(_vector_norm(xp, a - b, p, 1))
        return out[0] if len(out) == 1 else xp.concat(out)
