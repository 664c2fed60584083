"""Distances and similarities: ``F.cosine_similarity``, ``F.pairwise_distance``, ``torch.cdist``
(as pnnx writes them: ``aten::cosine_similarity``, ``F.pairwise_distance``, ``aten::cdist``).

pnnx spellings (torch 2.13 exports):

* ``F.cosine_similarity(a, b, dim=1)``: ``aten::cosine_similarity pnnx_2 4 1 a b dim eps``, dim
  and eps fed by constant expressions (``expr=1``, ``expr=1.000000e-8``);
* ``F.pairwise_distance(a, b)``: ``F.pairwise_distance ... eps=1.000000e-6 keepdim=False p=2.0
  $x1=0 $x2=1``;
* ``torch.cdist(a, b)``: ``aten::cdist pnnx_2 4 1 a b p compute_mode`` (``expr=2.0``,
  ``expr=None``).

As torch: cosine similarity is ``sum(a*b) / (max(|a|, eps) * max(|b|, eps))`` over ``dim`` after
broadcasting; pairwise distance is ``|a - b + eps|_p`` over the last axis; cdist the p-norm
distance between every row of ``a`` (..., P, M) and of ``b`` (..., R, M), p >= 0 (0 counts the
differing components, inf takes the largest).
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .misc import input_slots
from .registry import register


def _number(v: Any, who: str, what: str) -> float:
    if isinstance(v, (bool, int, float)):
        return float(v)
    if hasattr(v, "shape") and v.ndim == 0:
        return float(v)
    raise ShapeError(f"{who}: {what} should be a number, found {v!r}")


def _pnorm(xp: Any, d: Any, p: float, axis: int, keepdims: bool = False) -> Any:
    a = xp.abs(d)
    if p == 0:
        return xp.sum(xp.astype(a != 0, d.dtype), axis=axis, keepdims=keepdims)
    if math.isinf(p):
        return xp.max(a, axis=axis, keepdims=keepdims) if a.shape[axis] else xp.sum(a, axis=axis, keepdims=keepdims)
    if p == 1:
        return xp.sum(a, axis=axis, keepdims=keepdims)
    if p == 2:
        return xp.sqrt(xp.sum(a * a, axis=axis, keepdims=keepdims))
    return xp.sum(a ** p, axis=axis, keepdims=keepdims) ** (1.0 / p)


def _broadcast(xp: Any, a: Any, b: Any, who: str) -> tuple[Any, Any]:
    try:
        return tuple(xp.broadcast_arrays(a, b))
    except ValueError:
        raise ShapeError(f"{who}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast") from None


@register("aten::cosine_similarity")
class CosineSimilarity(Layer):
    """Cosine similarity along ``dim`` after broadcasting; inputs (x1, x2, dim, eps)."""

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 4:
            raise LayerParameterError(f"{op.where}: expected 4 inputs (x1, x2, dim, eps), found {len(op.inputs)}")
        return cls(ctx, op.where)

    def forward(self, a: Any, b: Any, dim: Any, eps: Any) -> Any:
        xp = self.xp
        a, b = _broadcast(xp, a, b, self.where)
        dim, eps = int(_number(dim, self.where, "dim")), _number(eps, self.where, "eps")
        if a.ndim == 0 or not -a.ndim <= dim < a.ndim:
            raise ShapeError(f"{self.where}: dim {dim} is out of range for inputs of shape {tuple(a.shape)}")
        # torch's order: each input over its clamped norm, then the sum of the products (a
        # norm that overflows gives 0, not inf / inf; tiny inputs keep their size)
        na = xp.clip(xp.sqrt(xp.sum(a * a, axis=dim, keepdims=True)), min=eps)
        nb = xp.clip(xp.sqrt(xp.sum(b * b, axis=dim, keepdims=True)), min=eps)
        return xp.sum((a / na) * (b / nb), axis=dim)


@register("F.pairwise_distance")
class PairwiseDistance(Layer):
    """``$x1 $x2`` inputs; p, eps, keepdim parameters."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int], p: float, eps: float, keepdim: bool, where: str):
        super().__init__(ctx)
        self.pos, self.p, self.eps, self.keepdim, self.where = pos, p, eps, keepdim, where

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("x1", "x2"))
        if set(pos) != {"x1", "x2"}:
            raise LayerParameterError(f"{op.where}: needs x1 and x2 inputs")
        return cls(ctx, pos, op.param("p", float, 2.0), op.param("eps", float, 1e-6),
                   op.param("keepdim", bool, False), op.where)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        a, b = _broadcast(xp, inputs[self.pos["x1"]], inputs[self.pos["x2"]], self.where)
        p, eps, keepdim = self.p, self.eps, self.keepdim
        if p < 0:
            raise ShapeError(f"{self.where}: p={p} must be >= 0")
        if a.ndim == 0:
            return xp.abs(a - b + eps) if p else xp.astype(a - b + eps != 0, a.dtype)
        return _pnorm(xp, a - b + eps, p, -1, keepdim)


#: elements of the differences :class:`CDist` makes at a time (away from the matrix-product form)
CDIST_BLOCK_ELEMENTS = 1 << 22


@register("aten::cdist")
class CDist(Layer):
    """p-norm distance between every row of x1 (..., P, M) and of x2 (..., R, M); inputs
    (x1, x2, p, compute_mode). As torch: for p = 2 through a matrix product (|a|^2 + |b|^2 -
    2 a.b, clipped at 0) when x1 or x2 has more than 25 rows (compute_mode None or 0,
    'use_mm_for_euclid_dist_if_necessary') or always (1, 'use_mm_for_euclid_dist'); else, and
    for any other p, from the broadcast differences (2, 'donot_use_mm_for_euclid_dist')."""

    #: rows of x1 or x2 above which p = 2 goes through the matrix product (torch's threshold)
    MM_MIN_ROWS = 25

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) < 2:
            raise LayerParameterError(f"{op.where}: needs x1 and x2")
        return cls(ctx, op.where)

    def forward(self, a: Any, b: Any, *rest: Any) -> Any:
        xp = self.xp
        p = _number(rest[0], self.where, "p") if rest else 2.0
        if p < 0:
            raise ShapeError(f"{self.where}: p={p} must be >= 0")
        mode = 0 if len(rest) < 2 or rest[1] is None else _number(rest[1], self.where, "compute_mode")
        if mode not in (0, 1, 2):
            raise ShapeError(f"{self.where}: compute_mode={mode:g} should be 0, 1 or 2 (torch's "
                             "use_mm_for_euclid_dist_if_necessary, use_mm_..., donot_use_mm_...)")
        if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
            raise ShapeError(f"{self.where}: expected (..., P, M) and (..., R, M) inputs, found "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        n_p, n_r = a.shape[-2], b.shape[-2]
        if p == 2 and (mode == 1 or mode == 0 and max(n_p, n_r) > self.MM_MIN_ROWS):
            aa = xp.sum(a * a, axis=-1)[..., :, None]
            bb = xp.sum(b * b, axis=-1)[..., None, :]
            ab = self.matmul(a, xp.matrix_transpose(b))
            return xp.sqrt(xp.clip(aa + bb - 2 * ab, min=0))
        # the (..., P, R, M) differences in blocks of P rows (at once: 512 MiB for 2048 x 2048
        # points of 32 values)
        lead = math.prod(a.shape[:-2]) * n_r * a.shape[-1]
        step = max(1, CDIST_BLOCK_ELEMENTS // max(1, lead))
        out = []
        for p0 in range(0, max(n_p, 1), step):  # (an empty x1: one empty block)
            a_blk = a[..., p0:min(n_p, p0 + step), :]
            d = xp.expand_dims(a_blk, axis=-2) - xp.expand_dims(b, axis=-3)  # (..., rows, R, M)
            out.append(_pnorm(xp, d, p, -1))
        return out[0] if len(out) == 1 else xp.concat(out, axis=-2)
