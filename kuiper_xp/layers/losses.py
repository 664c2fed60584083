"""Loss functions, for models that return a loss from ``forward`` (a VQ-VAE's commitment loss, a
distillation or reconstruction head exported whole).

pnnx spellings (torch 2.13 exports): the tensors first, then torch's positional arguments fed by
constant expressions, ``reduction`` as an int (0 none, 1 mean, 2 sum):

* ``F.mse_loss(a, b)``: ``aten::broadcast_tensors`` + ``prim::ListUnpack`` then
  ``aten::mse_loss a b reduction``; ``F.l1_loss`` alike (``aten::l1_loss``);
  ``F.smooth_l1_loss(a, b, beta=)`` / ``F.huber_loss(a, b, delta=)``: ``a b reduction beta`` /
  ``a b reduction delta``; ``F.soft_margin_loss``: ``aten::soft_margin_loss x y reduction``;
* ``F.kl_div(x, t, log_target=)``: ``aten::kl_div x t reduction log_target``
  (``reduction='batchmean'`` is written as a sum, divided by the batch in a later expression);
* ``F.binary_cross_entropy(x, t, weight)``: ``aten::binary_cross_entropy x t weight reduction``;
  ``F.binary_cross_entropy_with_logits``: ``... x t weight pos_weight reduction`` (weights None
  or tensors);
* ``F.nll_loss``: ``aten::nll_loss_nd x target weight reduction ignore_index``;
  ``F.cross_entropy``: ``aten::cross_entropy_loss x target weight reduction ignore_index
  label_smoothing``, with class-index or class-probability targets.

As torch: the class axis is 1 (0 for an input of one dimension); a mean of a weighted
``nll_loss`` / ``cross_entropy`` with class indices divides by the summed weights of the targets
not ignored (NaN when there are none); binary cross entropy clamps each log at -100; a class
index outside ``[0, C)`` (other than ``ignore_index``) is a ShapeError, as is a probability
outside ``[0, 1]`` given to ``binary_cross_entropy`` (checked where host reads are cheap).
"""

from __future__ import annotations

from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .checks import check_range
from .misc import is_float, to_float, to_int
from .registry import register

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


class _Loss(Layer):
    """A loss with ``n_inputs`` operands (tensors, then constants), reduced by ``reduction``."""

    n_inputs = 3

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != cls.n_inputs:
            raise LayerParameterError(f"{op.where}: expected {cls.n_inputs} inputs, found {len(op.inputs)}")
        return cls(ctx, op.where)

    def _float(self, *arrays: Any) -> None:
        for a in arrays:
            if not hasattr(a, "dtype") or not is_float(self.xp, a.dtype):
                raise ShapeError(f"{self.where}: needs floating-point tensors, found "
                                 f"{getattr(a, 'dtype', type(a).__name__)}")

    def _pair(self, a: Any, b: Any) -> tuple[Any, Any]:
        self._float(a, b)
        if a.dtype != b.dtype:
            raise ShapeError(f"{self.where}: input and target have different dtypes {a.dtype} and {b.dtype}")
        try:
            return tuple(self.xp.broadcast_arrays(a, b))
        except ValueError:
            raise ShapeError(f"{self.where}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                             "broadcast") from None

    def _reduce(self, v: Any, reduction: Any) -> Any:
        r = to_int(reduction, "reduction")
        if r not in _REDUCTIONS:
            raise ShapeError(f"{self.where}: reduction={r}; expected 0 (none), 1 (mean) or 2 (sum)")
        xp = self.xp
        return v if r == 0 else xp.mean(v) if r == 1 else xp.sum(v)


@register("aten::mse_loss")
class MSELoss(_Loss):
    def forward(self, a: Any, b: Any, reduction: Any) -> Any:
        a, b = self._pair(a, b)
        d = a - b
        return self._reduce(d * d, reduction)


@register("aten::l1_loss")
class L1Loss(_Loss):
    def forward(self, a: Any, b: Any, reduction: Any) -> Any:
        a, b = self._pair(a, b)
        return self._reduce(self.xp.abs(a - b), reduction)


@register("aten::smooth_l1_loss", "aten::huber_loss")
class SmoothL1Loss(_Loss):
    """smooth L1 (beta): ``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - beta / 2``; Huber
    (delta): ``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - delta / 2)``."""

    n_inputs = 4

    def forward(self, a: Any, b: Any, reduction: Any, param: Any) -> Any:
        xp = self.xp
        a, b = self._pair(a, b)
        p = to_float(param, "beta" if self.op_type == "aten::smooth_l1_loss" else "delta")
        if p < 0 or (p == 0 and self.op_type == "aten::huber_loss"):
            raise ShapeError(f"{self.where}: {'beta' if self.op_type == 'aten::smooth_l1_loss' else 'delta'}"
                             f"={p} must be {'>= 0' if self.op_type == 'aten::smooth_l1_loss' else '> 0'}")
        d = xp.abs(a - b)
        if self.op_type == "aten::huber_loss":
            v = xp.where(d < p, 0.5 * d * d, p * (d - 0.5 * p))
        else:  # (pnnx writes beta 0 as an L1 loss; the formula gives it too)
            v = xp.where(d < p, 0.5 * d * d / max(p, 1e-30), d - 0.5 * p)
        return self._reduce(v, reduction)


@register("aten::soft_margin_loss")
class SoftMarginLoss(_Loss):
    """``log(1 + exp(-y x))``."""

    def forward(self, x: Any, y: Any, reduction: Any) -> Any:
        xp = self.xp
        x, y = self._pair(x, y)
        return self._reduce(xp.log1p(xp.exp(-y * x)), reduction)


@register("aten::kl_div")
class KLDiv(_Loss):
    """``t (log t - x)`` (0 where t is 0), or with ``log_target`` ``exp(t) (t - x)``."""

    n_inputs = 4

    def forward(self, x: Any, t: Any, reduction: Any, log_target: Any) -> Any:
        xp = self.xp
        x, t = self._pair(x, t)
        if to_int(log_target, "log_target"):
            v = xp.exp(t) * (t - x)
        else:
            zero = xp.zeros((), dtype=t.dtype, device=self.device)
            v = xp.where(t == 0, zero, t * xp.log(xp.where(t == 0, zero + 1, t))) - t * x
        return self._reduce(v, reduction)


def _weighted(layer: _Loss, v: Any, weight: Any) -> Any:
    if weight is None:
        return v
    layer._float(weight)
    try:
        return v * weight
    except ValueError:
        raise ShapeError(f"{layer.where}: weight of shape {tuple(weight.shape)} does not broadcast "
                         f"to {tuple(v.shape)}") from None


@register("aten::binary_cross_entropy")
class BinaryCrossEntropy(_Loss):
    """``-w (t log x + (1 - t) log(1 - x))``, each log clamped at -100."""

    n_inputs = 4

    def forward(self, x: Any, t: Any, weight: Any, reduction: Any) -> Any:
        xp = self.xp
        x, t = self._pair(x, t)
        if self.backend.cheap_host_reads and x.size and bool(xp.any(xp.logical_or(x < 0, x > 1))):
            raise ShapeError(f"{self.where}: all elements of the input should be between 0 and 1 "
                             "(binary_cross_entropy takes probabilities; logits go to "
                             "binary_cross_entropy_with_logits)")
        floor = xp.full((), -100.0, dtype=x.dtype, device=self.device)
        v = -(t * xp.maximum(xp.log(x), floor) + (1 - t) * xp.maximum(xp.log(1 - x), floor))
        return self._reduce(_weighted(self, v, weight), reduction)


@register("aten::binary_cross_entropy_with_logits")
class BinaryCrossEntropyWithLogits(_Loss):
    """``w ((1 - t) x + l (log(1 + exp(-|x|)) + max(-x, 0)))``, ``l = 1 + (pos_weight - 1) t``."""

    n_inputs = 5

    def forward(self, x: Any, t: Any, weight: Any, pos_weight: Any, reduction: Any) -> Any:
        xp = self.xp
        x, t = self._pair(x, t)
        soft = xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(-x, xp.zeros((), dtype=x.dtype, device=self.device))
        if pos_weight is not None:
            self._float(pos_weight)
            soft = (1 + (pos_weight - 1) * t) * soft
        return self._reduce(_weighted(self, (1 - t) * x + soft, weight), reduction)


class _ClassLoss(_Loss):
    """Shared by nll_loss and cross_entropy: the class axis, the picked log-probabilities of
    class-index targets, the ignore mask and the target weights."""

    def _axis(self, x: Any) -> int:
        if x.ndim == 0:
            raise ShapeError(f"{self.where}: the input needs a class dimension, found a 0-d tensor")
        return 0 if x.ndim == 1 else 1

    def _picked(self, logp: Any, target: Any, weight: Any, ignore: int) -> tuple[Any, Any, Any]:
        """(-w[t] logp[t] per element, w[t] per element, 1 where not ignored; 0 where ignored)."""
        xp = self.xp
        axis = self._axis(logp)
        c = logp.shape[axis]
        want = logp.shape[:axis] + logp.shape[axis + 1:]
        if tuple(target.shape) != want:
            raise ShapeError(f"{self.where}: target of shape {tuple(target.shape)} does not fit an input of "
                             f"shape {tuple(logp.shape)} (expected {want})")
        t = xp.astype(target, xp.int64)
        keep = t != ignore
        t = xp.where(keep, t, xp.zeros((), dtype=xp.int64, device=self.device))
        t, _ = check_range(xp, t, 0, c, lambda bad: f"{self.where}: target "
                           f"{'' if bad is None else f'{bad} '}is out of bounds for {c} classes")
        picked = xp.squeeze(xp.take_along_axis(logp, xp.expand_dims(t, axis=axis), axis=axis), axis=axis)
        kept = xp.astype(keep, logp.dtype)
        w = kept
        if weight is not None:
            self._float(weight)
            if tuple(weight.shape) != (c,):
                raise ShapeError(f"{self.where}: weight of shape {tuple(weight.shape)}, expected ({c},)")
            w = w * xp.reshape(xp.take(weight, xp.reshape(t, (-1,)), axis=0), tuple(t.shape))
        return -picked * w, w, kept

    def _reduce_by_weight(self, v: Any, w: Any, reduction: Any) -> Any:
        if to_int(reduction, "reduction") == 1:
            return self.xp.sum(v) / self.xp.sum(w)
        return self._reduce(v, reduction)


@register("aten::nll_loss_nd", "aten::nll_loss", "aten::nll_loss2d")
class NLLLoss(_ClassLoss):
    """``-w[t] x[t]`` along the class axis; inputs (x, target, weight, reduction, ignore_index)."""

    n_inputs = 5

    def forward(self, x: Any, target: Any, weight: Any, reduction: Any, ignore_index: Any) -> Any:
        self._float(x)
        v, w, _ = self._picked(x, target, weight, to_int(ignore_index, "ignore_index"))
        return self._reduce_by_weight(v, w, reduction)


@register("aten::cross_entropy_loss")
class CrossEntropyLoss(_ClassLoss):
    """``log_softmax`` along the class axis, then the negative log-likelihood of class-index
    targets, or ``-sum(w t log p)`` of class-probability targets; ``label_smoothing`` eps mixes
    in the uniform distribution as torch does. Inputs (x, target, weight, reduction,
    ignore_index, label_smoothing)."""

    n_inputs = 6

    def forward(self, x: Any, target: Any, weight: Any, reduction: Any, ignore_index: Any,
                label_smoothing: Any) -> Any:
        xp = self.xp
        self._float(x)
        axis = self._axis(x)
        c = x.shape[axis]
        eps = to_float(label_smoothing, "label_smoothing")
        if not 0.0 <= eps <= 1.0:
            raise ShapeError(f"{self.where}: label_smoothing={eps} must be in [0, 1]")
        m = xp.max(x, axis=axis, keepdims=True)
        s = x - m
        logp = s - xp.log(xp.sum(xp.exp(s), axis=axis, keepdims=True))
        shape_w = [1] * x.ndim
        shape_w[axis] = c
        if not is_float(xp, target.dtype):  # class indices
            v, w, kept = self._picked(logp, target, weight, to_int(ignore_index, "ignore_index"))
            if eps == 0:
                return self._reduce_by_weight(v, w, reduction)
            lw = logp if weight is None else logp * xp.reshape(weight, tuple(shape_w))
            smooth = -xp.sum(lw, axis=axis) * kept
            if to_int(reduction, "reduction") == 1:  # (both over the summed target weights)
                den = xp.sum(w)
                return (1 - eps) * (xp.sum(v) / den) + (eps / c) * (xp.sum(smooth) / den)
            return (1 - eps) * self._reduce(v, reduction) + (eps / c) * self._reduce(smooth, reduction)
        if tuple(target.shape) != tuple(x.shape):
            raise ShapeError(f"{self.where}: class-probability target of shape {tuple(target.shape)}, "
                             f"expected the input's {tuple(x.shape)}")
        if target.dtype != x.dtype:
            raise ShapeError(f"{self.where}: input and target have different dtypes {x.dtype} and {target.dtype}")
        t = target * (1 - eps) + eps / c if eps else target
        lw = logp if weight is None else logp * xp.reshape(weight, tuple(shape_w))
        return self._reduce(-xp.sum(lw * t, axis=axis), reduction)  # (a mean over the N x d... rows)
