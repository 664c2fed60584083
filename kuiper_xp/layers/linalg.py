"""Linear-algebra products and shape builders that pnnx leaves as ``torch.`` / ``aten::`` operators:
``torch.mv``, ``aten::outer`` / ``kron`` / ``tensordot`` / ``inner`` / ``dot`` / ``vdot`` /
``trace`` / ``chain_matmul`` / ``linalg_multi_dot`` / ``addmv`` / ``addr`` / ``addbmm``,
``torch.cross`` / ``aten::linalg_cross``, ``aten::linalg_vecdot``, ``aten::block_diag`` / ``cartesian_prod`` /
``meshgrid``, ``aten::hstack`` / ``vstack`` / ``dstack`` / ``column_stack``, ``aten::rot90``,
``aten::channel_shuffle``, ``aten::linalg_matrix_power``, ``aten::linalg_matrix_exp`` and
``aten::linalg_solve_triangular``.

pnnx spellings (torch 2.13 exports):

* ``torch.mv torch.mv_0 2 1 0 1 2 $input=0 $vec=1`` (also ``Tensor.mv``).
* ``torch.outer`` and ``torch.ger``: ``aten::outer pnnx_0 2 1 a b``; ``aten::kron``,
  ``aten::inner``, ``aten::dot``, ``aten::vdot`` likewise (two unnamed inputs); ``aten::trace``
  one input. The 0-d results of dot / vdot / trace carry no shape annotation.
* ``torch.tensordot(a, b, dims=2)`` and ``dims=([1, 0], [0, 2])`` both come out as
  ``aten::tensordot pnnx_6 4 1 a b dims_a dims_b``, the two dim lists from constant expressions
  (``expr=[-2,-1]`` and ``expr=[0,1]`` for the int form).
* list-taking functions get their tensors through a list expression: ``pnnx.Expression
  expr=[@0,@1]`` then ``aten::block_diag`` / ``aten::cartesian_prod`` / ``aten::hstack`` /
  ``aten::vstack`` (``torch.row_stack`` too) / ``aten::dstack`` / ``aten::column_stack`` /
  ``aten::chain_matmul`` / ``aten::linalg_multi_dot`` ``1 1 list out``.
* ``torch.meshgrid(a, b, indexing="ij")``: ``aten::meshgrid pnnx_2 2 1 list indexing out`` whose
  one output is the list of grids, taken apart by a ``prim::ListUnpack`` (the convention of
  ``aten::chunk``). pnnx writes the indexing as a constant expression ``expr=ij`` / ``expr=xy``.
* ``torch.rot90(x, k, dims)``: ``aten::rot90 pnnx_4 3 1 x k dims`` (k and dims from constant
  expressions, always written, also for the defaults).
* ``nn.ChannelShuffle`` / ``F.channel_shuffle`` / ``torch.channel_shuffle``: ``aten::channel_shuffle
  pnnx_1 2 1 x groups``; ``F.native_channel_shuffle``: ``aten::native_channel_shuffle``, alike.
* ``torch.cross(a, b, dim=1)``: ``torch.cross ... dim=1 $input=0 $other=1``; without a dim pnnx
  writes ``dim=None``, which torch 2.13 reads as the first dimension of ``input`` of size 3 (with
  a deprecation warning). ``torch.linalg.cross``: ``aten::linalg_cross pnnx_1 3 1 a b dim``.
* ``torch.addmv(c, m, v, beta=0.5, alpha=2)`` (and ``addr``, ``addbmm``): ``aten::addmv pnnx_2 5
  1 c m v beta alpha``, beta and alpha from constant expressions.

Semantics follow torch: the products need operands of one dtype (torch refuses to mix them:
a ShapeError here), integer operands give integer results; outer / kron / block_diag and the
stack builders promote mixed dtypes as torch does; a bool ``outer`` / ``addr`` is a logical and /
or. ``beta=0`` ignores the added tensor (NaN included), as in torch.
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .misc import input_slots, is_float, output_dtype, promote
from .registry import register
from .shape import norm_dim, runtime_flag, runtime_int, runtime_ints


class _LinalgLayer(Layer):
    """Common helpers: the op's name for messages, dtype checks, products."""

    @property
    def who(self) -> str:
        return f"{self.op_type} {self.op_name!r}"

    def _dims(self, x: Any, want: tuple[int, ...], what: str) -> None:
        if x.ndim not in want:
            allowed = " or ".join(f"{d}-D" for d in want)
            raise ShapeError(f"{self.who}: {what} should be {allowed}, found shape {tuple(x.shape)}")

    def _same_dtype(self, *arrays: Any) -> None:
        dts = {str(a.dtype) for a in arrays}
        if len(dts) > 1:
            raise ShapeError(f"{self.who}: operands should have one dtype (as torch requires), found "
                             f"{', '.join(_dt(a.dtype) for a in arrays)}")

    def _no_bool(self, *arrays: Any) -> None:
        for a in arrays:
            if a.dtype == self.xp.bool:
                raise ShapeError(f"{self.who}: not implemented for bool tensors (as in torch)")

    def _mm(self, a: Any, b: Any) -> Any:
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise ShapeError(f"{self.who}: cannot multiply shapes {tuple(a.shape)} and {tuple(b.shape)}")
        return self.matmul(a, b)

    def _items(self, items: Any, what: str = "tensors") -> list[Any]:
        if hasattr(items, "shape") and not isinstance(items, (list, tuple)):
            return [items]
        if not isinstance(items, (list, tuple)):
            raise ShapeError(f"{self.who}: expected a list of {what}, found {type(items).__name__}")
        out = list(items)
        for a in out:
            if not hasattr(a, "shape"):
                raise ShapeError(f"{self.who}: expected a list of {what}, found an item {a!r}")
        return out

    def _common_dtype(self, arrays: list[Any]) -> Any:
        """The dtype of the arrays under torch's promotion applied pairwise."""
        xp = self.xp
        dt = arrays[0].dtype
        for a in arrays[1:]:
            if a.dtype != dt:
                _, probe = promote(xp, xp.zeros((), dtype=dt, device=self.device),
                                   xp.zeros((), dtype=a.dtype, device=self.device))
                dt = probe.dtype
        return dt

    def _promote_all(self, arrays: list[Any]) -> list[Any]:
        """The arrays in one dtype (:meth:`_common_dtype`)."""
        dt = self._common_dtype(arrays)
        return [a if a.dtype == dt else self.xp.astype(a, dt) for a in arrays]

    def _result_dtype(self, arrays: list[Any]) -> Any:
        """torch.result_type of tensors: 0-d tensors only count when their kind (bool < integer <
        floating) is higher than that of the tensors with dimensions."""
        xp = self.xp
        dim = [a for a in arrays if a.ndim > 0]
        zero = [a for a in arrays if a.ndim == 0]
        if not dim or not zero:
            return self._common_dtype(dim or zero)

        def kind(dt: Any) -> int:
            return 0 if dt == xp.bool else (2 if is_float(xp, dt) else 1)
        dt_dim, dt_zero = self._common_dtype(dim), self._common_dtype(zero)
        return dt_dim if kind(dt_zero) <= kind(dt_dim) else dt_zero

    def _mul(self, a: Any, b: Any) -> Any:
        """Elementwise product with torch's promotion; bool * bool is a logical and."""
        a, b = promote(self.xp, a, b)
        if a.dtype == self.xp.bool:
            return self.xp.logical_and(a, b)
        return a * b


def _dt(dt: Any) -> str:
    return str(dt).rsplit(".", 1)[-1]


def _scalar(v: Any, who: str, what: str) -> float | int | bool:
    """A Python number from a constant-expression input (number or 0-d array)."""
    if isinstance(v, (bool, int, float)):
        return v
    shape = getattr(v, "shape", None)
    if shape is not None and math.prod(shape) == 1:
        s = v if len(shape) == 0 else v[(0,) * len(shape)]
        dt = str(s.dtype)
        if "bool" in dt:
            return bool(s)
        return int(s) if "int" in dt else float(s)
    raise ShapeError(f"{who}: {what} should be a number, found {type(v).__name__}")


# ---------------------------------------------------------------------------------------------
# products


@register("torch.mv", "Tensor.mv")
class MV(_LinalgLayer):
    """``torch.mv``: the matrix-vector product of an (n, m) matrix and an (m,) vector."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int]):
        super().__init__(ctx)
        self.pos = pos

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("input", "vec"))
        if len(pos) != 2:
            raise LayerParameterError(f"{op.where}: needs input and vec")
        return cls(ctx, pos)

    def forward(self, *inputs: Any) -> Any:
        a, v = inputs[self.pos["input"]], inputs[self.pos["vec"]]
        self._dims(a, (2,), "input")
        self._dims(v, (1,), "vec")
        self._same_dtype(a, v)
        self._no_bool(a)
        return self._mm(a, v)


@register("aten::outer")
class Outer(_LinalgLayer):
    """``torch.outer`` / ``torch.ger``: ``out[i, j] = a[i] * b[j]`` of two vectors."""

    def forward(self, a: Any, b: Any) -> Any:
        self._dims(a, (1,), "input")
        self._dims(b, (1,), "vec2")
        return self._mul(a[:, None], b[None, :])


@register("aten::kron")
class Kron(_LinalgLayer):
    """``torch.kron``: the Kronecker product; the operand with fewer dims gets leading unit dims,
    and ``out[i*b0 + k, ...] = a[i, ...] * b[k, ...]``."""

    def forward(self, a: Any, b: Any) -> Any:
        xp = self.xp
        nd = max(a.ndim, b.ndim)
        sa = (1,) * (nd - a.ndim) + tuple(a.shape)
        sb = (1,) * (nd - b.ndim) + tuple(b.shape)
        a2 = xp.reshape(a, tuple(v for s in sa for v in (s, 1)))
        b2 = xp.reshape(b, tuple(v for s in sb for v in (1, s)))
        return xp.reshape(self._mul(a2, b2), tuple(x * y for x, y in zip(sa, sb)))


def _contract(layer: _LinalgLayer, a: Any, b: Any, da: tuple[int, ...], db: tuple[int, ...]) -> Any:
    """``tensordot``: sum over the axes ``da`` of ``a`` paired with ``db`` of ``b``; the free axes of
    ``a`` then those of ``b``."""
    xp = layer.xp
    fa = [d for d in range(a.ndim) if d not in da]
    fb = [d for d in range(b.ndim) if d not in db]
    k = math.prod(a.shape[d] for d in da)
    pa = tuple(fa) + tuple(da)
    pb = tuple(db) + tuple(fb)
    a2 = xp.permute_dims(a, pa) if pa != tuple(range(a.ndim)) else a
    b2 = xp.permute_dims(b, pb) if pb != tuple(range(b.ndim)) else b
    out_shape = tuple(a.shape[d] for d in fa) + tuple(b.shape[d] for d in fb)
    a2 = xp.reshape(a2, (math.prod(a.shape[d] for d in fa), k))
    b2 = xp.reshape(b2, (k, math.prod(b.shape[d] for d in fb)))
    return xp.reshape(layer.matmul(a2, b2), out_shape)


@register("aten::tensordot")
class TensorDot(_LinalgLayer):
    """``torch.tensordot(a, b, dims)``: sums products over the paired dims (``dims_a[i]`` of a with
    ``dims_b[i]`` of b); the result has a's remaining dims then b's."""

    def forward(self, a: Any, b: Any, dims_a: Any, dims_b: Any) -> Any:
        da = runtime_ints(dims_a, self.who, "dims") if dims_a is not None else ()
        db = runtime_ints(dims_b, self.who, "dims") if dims_b is not None else ()
        if len(da) != len(db):
            raise ShapeError(f"{self.who}: both dim lists should have the same length, found {da} and {db}")
        self._same_dtype(a, b)
        self._no_bool(a)
        da = tuple(norm_dim(d, max(a.ndim, 1), self.who) for d in da)
        db = tuple(norm_dim(d, max(b.ndim, 1), self.who) for d in db)
        if len(set(da)) != len(da) or len(set(db)) != len(db):
            raise ShapeError(f"{self.who}: a dim repeats in {da} / {db}")
        for x, y in zip(da, db):
            if a.shape[x] != b.shape[y]:
                raise ShapeError(f"{self.who}: contracted dimensions need to match, but the first has size "
                                 f"{a.shape[x]} in dim {x} and the second has size {b.shape[y]} in dim {y}")
        return _contract(self, a, b, da, db)


@register("aten::inner")
class Inner(_LinalgLayer):
    """``torch.inner``: sums products over the last dim of both (a 0-d operand scales the other);
    the result has a's leading dims then b's."""

    def forward(self, a: Any, b: Any) -> Any:
        if a.ndim == 0 or b.ndim == 0:  # a scaled tensor, in torch.result_type's dtype
            dt = self._result_dtype([a, b])
            return self._mul(self.xp.astype(a, dt), self.xp.astype(b, dt))
        self._same_dtype(a, b)
        self._no_bool(a)
        if a.shape[-1] != b.shape[-1]:
            raise ShapeError(f"{self.who}: the last dims of shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
        return _contract(self, a, b, (a.ndim - 1,), (b.ndim - 1,))


@register("aten::dot", "aten::vdot")
class Dot(_LinalgLayer):
    """``torch.dot`` / ``torch.vdot``: the 0-d sum of products of two equal-length vectors
    (vdot conjugates its first operand when complex)."""

    def forward(self, a: Any, b: Any) -> Any:
        xp = self.xp
        self._dims(a, (1,), "the first operand")
        self._dims(b, (1,), "the second operand")
        self._same_dtype(a, b)
        self._no_bool(a)
        if a.shape[0] != b.shape[0]:
            raise ShapeError(f"{self.who}: vectors of sizes {a.shape[0]} and {b.shape[0]}")
        if self.op_type == "aten::vdot" and xp.isdtype(a.dtype, "complex floating"):
            a = xp.conj(a)
        return xp.asarray(self.matmul(a, b), device=self.device)  # (numpy gives a scalar for 1-D @ 1-D)


@register("aten::trace")
class Trace(_LinalgLayer):
    """``torch.trace``: the 0-d sum of a matrix's main diagonal (integer input gives int64)."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        self._dims(x, (2,), "input")
        self._no_bool(x)
        n, m = x.shape
        diag = xp.reshape(x, (n * m,))[:min(n, m) * m:m + 1]  # x[i, i]: every (m+1)-th item
        dt = x.dtype if is_float(xp, x.dtype) else xp.int64
        return xp.sum(diag, dtype=dt)


class _ListLayer(_LinalgLayer):
    def forward(self, items: Any) -> Any:
        arrays = self._items(items)
        if not arrays:
            raise ShapeError(f"{self.who}: expects a non-empty list of tensors")
        return self.build(arrays)

    def build(self, arrays: list[Any]) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


@register("aten::chain_matmul", "aten::linalg_multi_dot")
class MultiDot(_ListLayer):
    """``torch.linalg.multi_dot`` / ``torch.chain_matmul``: the product of a list of matrices
    (multi_dot: the first may be a row vector and the last a column vector, dropped from the
    result), multiplied in the cheapest order."""

    def build(self, arrays: list[Any]) -> Any:
        multi = self.op_type == "aten::linalg_multi_dot"
        n = len(arrays)
        if multi and n < 2:
            raise ShapeError(f"{self.who}: expected at least 2 tensors, found {n}")
        for i, a in enumerate(arrays):
            ok = (1, 2) if multi and i in (0, n - 1) else (2,)
            self._dims(a, ok, f"tensor {i}")
        self._same_dtype(*arrays)
        self._no_bool(arrays[0])
        mats = list(arrays)
        first_vec, last_vec = mats[0].ndim == 1, mats[-1].ndim == 1
        if first_vec:
            mats[0] = mats[0][None, :]
        if last_vec:
            mats[-1] = mats[-1][:, None]
        for i in range(n - 1):
            if mats[i].shape[1] != mats[i + 1].shape[0]:
                raise ShapeError(f"{self.who}: tensors {i} and {i + 1} with shapes {tuple(arrays[i].shape)} and "
                                 f"{tuple(arrays[i + 1].shape)} cannot be multiplied")
        out = self._chain(mats)
        if first_vec and last_vec:
            return out[0, 0]
        if first_vec:
            return out[0, :]
        if last_vec:
            return out[:, 0]
        return out

    def _chain(self, mats: list[Any]) -> Any:
        """The matrix chain product in the order of least multiplications (dynamic programming)."""
        n = len(mats)
        if n == 1:
            return mats[0]
        dims = [m.shape[0] for m in mats] + [mats[-1].shape[1]]
        cost = [[0] * n for _ in range(n)]
        split = [[0] * n for _ in range(n)]
        for length in range(1, n):
            for i in range(n - length):
                j = i + length
                best = None
                for s in range(i, j):
                    c = cost[i][s] + cost[s + 1][j] + dims[i] * dims[s + 1] * dims[j + 1]
                    if best is None or c < best:
                        best, split[i][j] = c, s
                cost[i][j] = best

        def run(i: int, j: int) -> Any:
            if i == j:
                return mats[i]
            s = split[i][j]
            return self.matmul(run(i, s), run(s + 1, j))
        return run(0, n - 1)


class _AddLayer(_LinalgLayer):
    """``beta * input + alpha * product`` (aten::addmv / addr / addbmm, beta and alpha inputs)."""

    def forward(self, c: Any, m1: Any, m2: Any, beta: Any = 1, alpha: Any = 1) -> Any:
        xp = self.xp
        beta = _scalar(beta, self.who, "beta") if beta is not None else 1
        alpha = _scalar(alpha, self.who, "alpha") if alpha is not None else 1
        prod = self.product(m1, m2)
        if _broadcast(c.shape, prod.shape) != tuple(prod.shape):
            raise ShapeError(f"{self.who}: input of shape {tuple(c.shape)} does not broadcast to the product's "
                             f"shape {tuple(prod.shape)}")
        if prod.dtype == xp.bool:
            if c.dtype != xp.bool:
                raise ShapeError(f"{self.who}: a bool product with a {_dt(c.dtype)} input")
            # torch: (beta and input) or (alpha and product)
            out = xp.logical_and(prod, xp.asarray(bool(alpha), device=self.device))
            return xp.logical_or(out, xp.logical_and(c, xp.asarray(bool(beta), device=self.device)))
        if not is_float(xp, prod.dtype) and (isinstance(alpha, float) or isinstance(beta, float)):
            raise ShapeError(f"{self.who}: a float alpha/beta for integer tensors (torch refuses it)")
        if alpha != 1:
            prod = prod * alpha
        if beta == 0:  # torch ignores input (even NaN) when beta is 0
            return prod
        if c.dtype != prod.dtype:
            raise ShapeError(f"{self.who}: input dtype {_dt(c.dtype)} differs from the product's {_dt(prod.dtype)}")
        return prod + (c * beta if beta != 1 else c)

    def product(self, m1: Any, m2: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


def _broadcast(s1: tuple[int, ...], s2: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast shape of two shapes, None when they do not broadcast."""
    nd = max(len(s1), len(s2))
    a = (1,) * (nd - len(s1)) + tuple(s1)
    b = (1,) * (nd - len(s2)) + tuple(s2)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


@register("aten::addmv")
class AddMV(_AddLayer):
    """``torch.addmv``: ``beta * input + alpha * (mat @ vec)``."""

    def product(self, m: Any, v: Any) -> Any:
        self._dims(m, (2,), "mat")
        self._dims(v, (1,), "vec")
        self._same_dtype(m, v)
        self._no_bool(m)
        return self._mm(m, v)


@register("aten::addr")
class AddR(_AddLayer):
    """``torch.addr``: ``beta * input + alpha * outer(vec1, vec2)`` (bool: logical and / or)."""

    def product(self, a: Any, b: Any) -> Any:
        self._dims(a, (1,), "vec1")
        self._dims(b, (1,), "vec2")
        self._same_dtype(a, b)
        return self._mul(a[:, None], b[None, :])


@register("aten::addbmm")
class AddBMM(_AddLayer):
    """``torch.addbmm``: ``beta * input + alpha * sum_i(batch1[i] @ batch2[i])``."""

    def product(self, a: Any, b: Any) -> Any:
        xp = self.xp
        self._dims(a, (3,), "batch1")
        self._dims(b, (3,), "batch2")
        self._same_dtype(a, b)
        self._no_bool(a)
        if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise ShapeError(f"{self.who}: cannot multiply batches of shapes {tuple(a.shape)} and {tuple(b.shape)}")
        # sum over the batch = one (n, B*k) @ (B*k, m) product
        bsz, n, k = a.shape
        m = b.shape[2]
        a2 = xp.reshape(xp.permute_dims(a, (1, 0, 2)), (n, bsz * k))
        b2 = xp.reshape(b, (bsz * k, m))
        return self.matmul(a2, b2)


# ---------------------------------------------------------------------------------------------
# cross product


class _Cross(_LinalgLayer):
    def cross(self, a: Any, b: Any, dim: int | None) -> Any:
        xp = self.xp
        if a.ndim != b.ndim:
            raise ShapeError(f"{self.who}: inputs must have the same number of dimensions, found shapes "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        self._same_dtype(a, b)
        self._no_bool(a)
        if dim is None:  # torch.cross without dim: the first dim of input of size 3
            sizes = [d for d in range(a.ndim) if a.shape[d] == 3]
            if not sizes:
                raise ShapeError(f"{self.who}: no dimension of size 3 in input of shape {tuple(a.shape)}")
            d = sizes[0]
        else:
            d = norm_dim(dim, max(a.ndim, 1), self.who)
        if a.shape[d] != 3 or b.shape[d] != 3:
            raise ShapeError(f"{self.who}: inputs dimension {d} must have length 3, found {a.shape[d]} and {b.shape[d]}")
        if _broadcast(a.shape, b.shape) is None:
            raise ShapeError(f"{self.who}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast")
        head = (slice(None),) * d

        def comp(x: Any, i: int) -> Any:
            return x[head + (slice(i, i + 1), ...)]
        a0, a1, a2 = (comp(a, i) for i in range(3))
        b0, b1, b2 = (comp(b, i) for i in range(3))
        return xp.concat([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=d)


@register("torch.cross")
class Cross(_Cross):
    """``torch.cross(input, other, dim)``: the 3-vector cross product along ``dim`` (None: the
    first dim of ``input`` of size 3, torch 2.13's deprecated default); other dims broadcast."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int], dim: int | None):
        super().__init__(ctx)
        self.pos, self.dim = pos, dim

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("input", "other"))
        if len(pos) != 2:
            raise LayerParameterError(f"{op.where}: needs input and other")
        dim = op.param("dim", int, default=None)
        return cls(ctx, pos, dim)

    def forward(self, *inputs: Any) -> Any:
        return self.cross(inputs[self.pos["input"]], inputs[self.pos["other"]], self.dim)


@register("aten::linalg_cross")
class LinalgCross(_Cross):
    """``torch.linalg.cross(a, b, dim=-1)``: the 3-vector cross product along ``dim``; other dims
    broadcast."""

    def forward(self, a: Any, b: Any, dim: Any = -1) -> Any:
        return self.cross(a, b, runtime_int(dim, self.who, "dim") if dim is not None else -1)


@register("aten::linalg_vecdot")
class VecDot(_LinalgLayer):
    """``torch.linalg.vecdot(a, b, dim=-1)``: the sum of products along ``dim`` (the first
    operand conjugated when complex); other dims broadcast. pnnx passes ``dim`` as a third input."""

    def forward(self, a: Any, b: Any, dim: Any = -1) -> Any:
        xp = self.xp
        self._same_dtype(a, b)
        self._no_bool(a)
        d = runtime_int(dim, self.who, "dim") if dim is not None else -1
        if not -a.ndim <= d < a.ndim or not -b.ndim <= d < b.ndim or a.shape[d] != b.shape[d]:
            raise ShapeError(f"{self.who}: dim {d} does not pair shapes {tuple(a.shape)} and {tuple(b.shape)}")
        if xp.isdtype(a.dtype, "complex floating"):
            a = xp.conj(a)
        return xp.sum(a * b, axis=d)


# ---------------------------------------------------------------------------------------------
# shape builders


@register("aten::block_diag")
class BlockDiag(_ListLayer):
    """``torch.block_diag``: the tensors (0-d, 1-d as one row, or 2-d) placed along the diagonal
    of a zero matrix, in promoted dtype."""

    def build(self, arrays: list[Any]) -> Any:
        xp = self.xp
        for i, a in enumerate(arrays):
            self._dims(a, (0, 1, 2), f"tensor {i}")
        mats = [xp.reshape(a, (1, 1)) if a.ndim == 0 else (a[None, :] if a.ndim == 1 else a)
                for a in arrays]
        dt = self._result_dtype(arrays)
        mats = [m if m.dtype == dt else xp.astype(m, dt) for m in mats]
        cols = sum(m.shape[1] for m in mats)
        pieces, c0 = [], 0
        for m in mats:
            r, c = m.shape
            left = xp.zeros((r, c0), dtype=dt, device=self.device)
            right = xp.zeros((r, cols - c0 - c), dtype=dt, device=self.device)
            pieces.append(xp.concat([left, m, right], axis=1))
            c0 += c
        return xp.concat(pieces, axis=0)


def _grids(xp: Any, arrays: list[Any], xy: bool) -> list[Any]:
    """meshgrid: each 0-d/1-d array broadcast along its own axis (xy: the first two swapped)."""
    vecs = [xp.reshape(a, (-1,)) for a in arrays]
    n = len(vecs)
    axes = list(range(n))
    if xy and n >= 2:
        axes[0], axes[1] = 1, 0
    shape = [0] * n
    for v, ax in zip(vecs, axes):
        shape[ax] = v.shape[0]
    out = []
    for v, ax in zip(vecs, axes):
        s = [1] * n
        s[ax] = v.shape[0]
        out.append(xp.broadcast_to(xp.reshape(v, tuple(s)), tuple(shape)))
    return out


@register("aten::meshgrid")
class MeshGrid(_LinalgLayer):
    """``torch.meshgrid(*tensors, indexing)``: a list of grids, one per 0-d/1-d input, each
    varying along its own axis ('ij'; 'xy' swaps the first two axes). Its one output is the
    list, unpacked by a following ``prim::ListUnpack``."""

    def forward(self, items: Any, indexing: Any = "ij") -> list[Any]:
        arrays = self._items(items)
        if not arrays:
            raise ShapeError(f"{self.who}: expects a non-empty list of tensors")
        if indexing is None:
            indexing = "ij"
        if indexing not in ("ij", "xy"):
            raise ShapeError(f"{self.who}: indexing should be 'ij' or 'xy', found {indexing!r}")
        for i, a in enumerate(arrays):
            self._dims(a, (0, 1), f"tensor {i}")
        self._same_dtype(*arrays)
        return _grids(self.xp, arrays, indexing == "xy")


@register("aten::broadcast_tensors")
class BroadcastTensors(_LinalgLayer):
    """``torch.broadcast_tensors(*tensors)`` (what ``torch.distributions.Normal(mu,
    sigma).log_prob`` leaves): each tensor broadcast to the common shape, dtypes kept; the one
    output is the list, unpacked by a following ``prim::ListUnpack``."""

    def forward(self, items: Any) -> list[Any]:
        arrays = self._items(items)
        shapes = [tuple(a.shape) for a in arrays]
        nd = max((len(sh) for sh in shapes), default=0)
        shape = []
        for d in range(nd):
            sizes = {sh[len(sh) - nd + d] for sh in shapes if len(sh) - nd + d >= 0} - {1}
            if len(sizes) > 1:
                raise ShapeError(f"{self.who}: shapes {shapes} do not broadcast (dim {d - nd}: sizes "
                                 f"{sorted(sizes)})")
            shape.append(sizes.pop() if sizes else 1)
        return [a if tuple(a.shape) == tuple(shape) else self.xp.broadcast_to(a, tuple(shape)) for a in arrays]


@register("aten::tril_indices", "aten::triu_indices")
class TriIndices(_LinalgLayer):
    """``torch.tril_indices(row, col, offset)`` / ``triu_indices`` as pnnx keeps them when the
    sizes come from an input's shape: ``(self_row, col, offset, dtype, layout, device,
    pin_memory)``; a (2, n) array of the (row, column) pairs on or below (above) the diagonal
    ``offset``, in row-major order."""

    def __init__(self, ctx: BuildContext, upper: bool, dtype: Any):
        super().__init__(ctx)
        self.upper, self.dtype = upper, dtype

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 7:
            raise LayerParameterError(f"{op.where}: expected 7 inputs (row, col, offset, dtype, layout, device, "
                                      f"pin_memory), found {len(op.inputs)}")
        return cls(ctx, op.type == "aten::triu_indices", output_dtype(op, ctx.xp) or ctx.xp.int64)

    def forward(self, row: Any, col: Any, offset: Any = 0, *_: Any) -> Any:
        xp = self.xp
        n_row, n_col = runtime_int(row, self.who, "row"), runtime_int(col, self.who, "col")
        k = runtime_int(offset, self.who, "offset")
        if n_row < 0 or n_col < 0:
            raise ShapeError(f"{self.who}: row ({n_row}) and col ({n_col}) must be non-negative")
        r = xp.reshape(xp.arange(n_row, dtype=xp.int64, device=self.device), (n_row, 1))
        c = xp.reshape(xp.arange(n_col, dtype=xp.int64, device=self.device), (1, n_col))
        keep = (c - r >= k) if self.upper else (c - r <= k)
        rows, cols = xp.nonzero(keep)
        return xp.astype(xp.stack([rows, cols]), self.dtype)


@register("aten::cartesian_prod")
class CartesianProd(_ListLayer):
    """``torch.cartesian_prod``: every combination of the vectors' items, one per row
    (shape (prod n_i, k)); a single vector is returned unchanged."""

    def build(self, arrays: list[Any]) -> Any:
        xp = self.xp
        for i, a in enumerate(arrays):
            self._dims(a, (1,), f"tensor {i}")
        self._same_dtype(*arrays)
        if len(arrays) == 1:
            return arrays[0]
        grids = _grids(xp, arrays, False)
        return xp.stack([xp.reshape(g, (-1,)) for g in grids], axis=1)


def _atleast(xp: Any, a: Any, nd: int) -> Any:
    """torch.atleast_{1,2,3}d: 0-d -> (1,)*nd; 1-d (n) -> (1, n) / (1, n, 1); 2-d (m, n) -> (m, n, 1)."""
    if a.ndim >= nd:
        return a
    if a.ndim == 0:
        return xp.reshape(a, (1,) * nd)
    if a.ndim == 1:
        return a[None, :] if nd == 2 else a[None, :, None]
    return a[:, :, None]


@register("aten::hstack", "aten::vstack", "aten::row_stack", "aten::dstack", "aten::column_stack")
class StackBuilder(_ListLayer):
    """``torch.hstack`` / ``vstack`` (``row_stack``) / ``dstack`` / ``column_stack``: concatenate
    along columns (dim 0 if all are 1-d) / rows / depth / columns after torch's atleast_Nd
    reshaping (column_stack turns 0-d and 1-d inputs into columns)."""

    def build(self, arrays: list[Any]) -> Any:
        xp = self.xp
        kind = self.op_type.split("::")[-1]
        arrays = self._promote_all(arrays)
        if kind == "hstack":
            arrays = [_atleast(xp, a, 1) for a in arrays]
            axis = 0 if all(a.ndim == 1 for a in arrays) else 1
        elif kind in ("vstack", "row_stack"):
            arrays = [_atleast(xp, a, 2) for a in arrays]
            axis = 0
        elif kind == "dstack":
            arrays = [_atleast(xp, a, 3) for a in arrays]
            axis = 2
        else:  # column_stack
            arrays = [xp.reshape(a, (-1, 1)) if a.ndim <= 1 else a for a in arrays]
            axis = 1
        nd = arrays[0].ndim
        for a in arrays:
            if a.ndim != nd or any(a.shape[d] != arrays[0].shape[d] for d in range(nd) if d != axis):
                raise ShapeError(f"{self.who}: shapes {[tuple(x.shape) for x in arrays]} do not fit together "
                                 f"along dim {axis}")
        return xp.concat(arrays, axis=axis)


@register("aten::rot90")
class Rot90(_LinalgLayer):
    """``torch.rot90(x, k, dims)``: rotates by k * 90 degrees in the plane of the two dims, from
    the first towards the second (any integer k)."""

    def forward(self, x: Any, k: Any = 1, dims: Any = None) -> Any:
        xp = self.xp
        k = runtime_int(k, self.who, "k") if k is not None else 1
        dims = runtime_ints(dims, self.who, "dims") if dims is not None else (0, 1)
        if len(dims) != 2:
            raise ShapeError(f"{self.who}: expected 2 rotation dims, found {len(dims)}")
        if x.ndim < 2:
            raise ShapeError(f"{self.who}: expected an input of >= 2 dims, found shape {tuple(x.shape)}")
        d0, d1 = (norm_dim(d, x.ndim, self.who) for d in dims)
        if d0 == d1:
            raise ShapeError(f"{self.who}: rotation dims should differ, found {tuple(dims)}")
        k %= 4
        if k == 0:
            return x
        if k == 2:
            return xp.flip(x, axis=(d0, d1))
        perm = list(range(x.ndim))
        perm[d0], perm[d1] = d1, d0
        return xp.permute_dims(xp.flip(x, axis=d1 if k == 1 else d0), tuple(perm))


@register("aten::linalg_matrix_power", "aten::matrix_power")
class MatrixPower(_LinalgLayer):
    """``torch.linalg.matrix_power(A, n)`` (``torch.matrix_power``, ``Tensor.matrix_power``) of a
    stack of square matrices: n >= 0 by repeated squaring (n = 0: the identity in A's dtype);
    n < 0 the inverse's power, for floating matrices on a backend with a ``linalg`` extension."""

    def forward(self, a: Any, n: Any) -> Any:
        xp = self.xp
        k = runtime_int(n, self.who, "n")
        if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
            raise ShapeError(f"{self.who}: needs a (stack of) square matrices, found shape {tuple(a.shape)}")
        self._no_bool(a)
        if k == 0:
            eye = xp.eye(a.shape[-1], dtype=a.dtype, device=self.device)
            return xp.asarray(xp.broadcast_to(eye, tuple(a.shape)), copy=True)
        if k < 0:
            inv = getattr(getattr(xp, "linalg", None), "inv", None)
            if inv is None or not xp.isdtype(a.dtype, ("real floating", "complex floating")):
                raise ShapeError(f"{self.who}: a negative power ({k}) needs the inverse of a floating matrix "
                                 f"(found {_dt(a.dtype)} on a backend {'with' if inv else 'without'} linalg.inv)")
            a, k = inv(a), -k
        result = None
        base = a
        while k:
            if k & 1:
                result = base if result is None else xp.matmul(result, base)
            k >>= 1
            if k:
                base = xp.matmul(base, base)
        return result if result is not a else xp.asarray(a, copy=True)


@register("aten::linalg_solve_triangular")
class SolveTriangular(_LinalgLayer):
    """``torch.linalg.solve_triangular(A, B, upper=, left=True, unitriangular=False)`` (pnnx:
    ``aten::linalg_solve_triangular op 5 1 A B upper left unitriangular``): X with A X = B (``left``)
    or X A = B, reading only A's upper or lower triangle (its diagonal taken as ones when
    ``unitriangular``), by the backend's ``linalg.solve`` on that triangle."""

    def forward(self, a: Any, b: Any, upper: Any, left: Any = True, unitriangular: Any = False) -> Any:
        xp = self.xp
        solve = getattr(getattr(xp, "linalg", None), "solve", None)
        if solve is None:
            raise ShapeError(f"{self.who}: this backend has no linalg.solve")
        for name, t in (("A", a), ("B", b)):
            if not xp.isdtype(t.dtype, ("real floating", "complex floating")):
                raise ShapeError(f"{self.who}: {name} should be a floating tensor (as torch requires), found "
                                 f"{_dt(t.dtype)}")
        self._same_dtype(a, b)
        n = a.shape[-1] if a.ndim >= 2 else -1
        if a.ndim < 2 or a.shape[-2] != n or b.ndim < 2:
            raise ShapeError(f"{self.who}: needs square matrices A and a matrix B, found shapes {tuple(a.shape)} "
                             f"and {tuple(b.shape)}")
        is_left = runtime_flag(left, self.who, "left")
        if b.shape[-2 if is_left else -1] != n:
            raise ShapeError(f"{self.who}: A of shape {tuple(a.shape)} does not fit B of shape {tuple(b.shape)} "
                             f"(left={is_left})")
        m = xp.triu(a) if runtime_flag(upper, self.who, "upper") else xp.tril(a)
        if runtime_flag(unitriangular, self.who, "unitriangular"):
            eye = xp.eye(n, dtype=xp.bool, device=self.device)
            m = xp.where(eye, xp.ones_like(m), m)
        if is_left:
            return solve(m, b)
        return xp.matrix_transpose(solve(xp.matrix_transpose(m), xp.matrix_transpose(b)))


#: matrix_exp's Taylor degree after scaling the matrix to a 1-norm of at most 1/2 (the first term
#: left out, 0.5^19 / 19!, is under 2e-23)
_EXPM_DEGREE = 18


@register("aten::linalg_matrix_exp")
class MatrixExp(_LinalgLayer):
    """``torch.linalg.matrix_exp(A)`` of a stack of square floating matrices: scaling and squaring
    around a degree-18 Taylor polynomial, in float64 (complex128 for complex input), rounded to
    A's dtype. NaN or inf anywhere in a matrix gives NaN in all of that matrix's result, as torch."""

    def forward(self, a: Any) -> Any:
        xp = self.xp
        if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
            raise ShapeError(f"{self.who}: needs a (stack of) square matrices, found shape {tuple(a.shape)}")
        if not xp.isdtype(a.dtype, ("real floating", "complex floating")):
            raise ShapeError(f"{self.who}: needs a floating tensor (as torch requires), found {_dt(a.dtype)}")
        work = xp.complex128 if xp.isdtype(a.dtype, "complex floating") else xp.float64
        x = a if a.dtype == work else xp.astype(a, work)
        n = a.shape[-1]
        if math.prod(a.shape) == 0:
            return xp.asarray(a, copy=True)
        norms = xp.max(xp.sum(xp.abs(x), axis=-2), axis=-1)[..., None, None]  # each matrix's 1-norm
        finite = xp.isfinite(norms)
        norm = float(xp.max(xp.where(finite, norms, 0.0)))
        squarings = max(0, math.ceil(math.log2(norm / 0.5))) if norm > 0.5 else 0
        x = xp.where(finite, x, xp.zeros_like(x)) / (2.0 ** squarings)
        eye = xp.eye(n, dtype=work, device=self.device)
        result = eye + x / float(_EXPM_DEGREE)  # Horner: I + x (I + x/2 (I + x/3 (...)))
        for k in range(_EXPM_DEGREE - 1, 0, -1):
            result = eye + xp.matmul(x, result) / float(k)
        for _ in range(squarings):
            result = xp.matmul(result, result)
        result = xp.where(finite, result, xp.asarray(xp.nan, dtype=work, device=self.device))
        return result if result.dtype == a.dtype else xp.astype(result, a.dtype)


@register("aten::channel_shuffle", "aten::native_channel_shuffle")
class AtenChannelShuffle(_LinalgLayer):
    """``channel_shuffle(x, groups)`` (nn.ChannelShuffle, F / torch.channel_shuffle as pnnx 2.13
    writes them; ``F.native_channel_shuffle`` as ``aten::native_channel_shuffle``): (N, C, *) ->
    (N, g, C/g, *) -> swap dims 1 and 2 -> (N, C, *)."""

    def forward(self, x: Any, groups: Any) -> Any:
        xp = self.xp
        g = runtime_int(groups, self.who, "groups")
        if g < 1:
            raise ShapeError(f"{self.who}: the number of groups should be positive, found {g}")
        if x.ndim < 3:
            raise ShapeError(f"{self.who}: expects an input of > 2 dims, found shape {tuple(x.shape)}")
        c = x.shape[1]
        if c % g:
            raise ShapeError(f"{self.who}: {c} channels do not split into {g} groups")
        split = (x.shape[0], g, c // g) + tuple(x.shape[2:])
        perm = (0, 2, 1) + tuple(range(3, len(split)))
        return xp.reshape(xp.permute_dims(xp.reshape(x, split), perm), tuple(x.shape))
