"""Affine layers: ``nn.Linear`` / ``F.linear``, inference batch norm (``nn.BatchNorm1d/2d/3d``,
``F.batch_norm``), and the no-ops ``nn.Dropout*`` / ``F.dropout*`` / ``nn.Identity`` (pnnx
usually removes those; they are registered for files that keep them)."""

from __future__ import annotations

from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from . import functional as fn
from .base import BuildContext, FusesActivation, Layer
from .misc import operand_slots
from .registry import register


def _row_bias(shape: tuple, out: int) -> bool:
    """Whether a bias of ``shape`` adds one row to every output row of ``out`` features: ``(out,)``,
    ``(1,)``, ``()``, or those with leading 1s (``torch.addmm`` with a ``(1, out)`` input comes out
    as an ``F.linear`` with that bias)."""
    return all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] in (out, 1))


@register("nn.Linear", "F.linear")
class Linear(FusesActivation, Layer):
    """y = x @ W^T + b over the last axis of an input of any rank ``(..., in) -> (..., out)``.
    ``W^T`` is formed once at build; ``F.linear`` may take weight and bias as inputs."""

    def __init__(self, ctx: BuildContext, weight_t: Any, bias: Any, slots: dict[str, int]):
        super().__init__(ctx)
        self.weight_t, self.bias, self.slots = weight_t, bias, slots
        self._fast = getattr(ctx.fast, "linear", None)
        self.fused_activation: Any = None
        # weight and bias from the file, the backend's fast path: forward's short way
        self._plain = (self._fast is not None and weight_t is not None and "weight" not in slots
                       and "bias" not in slots)
        self._in = slots["input"]

    @classmethod
    def from_operator(cls, op, ctx):
        slots = operand_slots(op, ("input", "weight", "bias"))
        if "weight" in slots and "bias" in slots:  # operands: compare what the file declares
            ws, bs = op.inputs[slots["weight"]].shape, op.inputs[slots["bias"]].shape
            if (ws is not None and bs is not None and len(ws) == 2 and ws[0] is not None
                    and None not in bs and not _row_bias(bs, ws[0])):
                raise LayerParameterError(
                    f"{op.where}: bias is declared {tuple(bs)}, the weight ({ws[0]}, {ws[1]}): expected "
                    f"({ws[0]},) (pnnx writes only the zeroed slice for `b = bias.clone(); b[n:2n].zero_()`, "
                    "torchvision's Swin V2: build the bias with torch.cat)")
        weight_t = bias = None
        if "weight" not in slots:
            w = op.weight("weight", ctx)
            if w.ndim != 2:
                raise LayerParameterError(f"{op.where}: weight has shape {tuple(w.shape)}, expected (out, in)")
            out_f, in_f = w.shape
            if op.param("in_features", int, default=in_f) != in_f or \
                    op.param("out_features", int, default=out_f) != out_f:
                raise LayerParameterError(
                    f"{op.where}: in_features={op.params.get('in_features')}, out_features="
                    f"{op.params.get('out_features')} do not match weight shape {tuple(w.shape)}")
            fast_pack = getattr(ctx.fast, "pack_linear", None)
            if fast_pack is not None:  # (numpy: a contiguous W^T; the read weight is dropped)
                ctx.forget(op.weight_ref("weight"))
                weight_t = ctx.derived("pack_linear", w, fast_pack, lambda wt: wt.T)
            else:
                xp = ctx.xp
                weight_t = ctx.derived("linear_t", w, lambda a: xp.permute_dims(a, (1, 0)),
                                       lambda wt: xp.permute_dims(wt, (1, 0)))
        if "bias" not in slots:
            bias = op.weight("bias", ctx, optional=True)
            if op.param("bias", None, default=None) is True and bias is None:
                raise LayerParameterError(f"{op.where}: parameter bias=True but weight 'bias' is missing")
            if op.param("bias", None, default=None) is False and bias is not None:
                raise LayerParameterError(f"{op.where}: parameter bias=False but the file has a weight 'bias'")
            if bias is not None and weight_t is not None and tuple(bias.shape) != (weight_t.shape[1],):
                raise LayerParameterError(f"{op.where}: bias has shape {tuple(bias.shape)}, expected "
                                          f"({weight_t.shape[1]},)")
        return cls(ctx, weight_t, bias, slots)

    def forward(self, *inputs: Any) -> Any:
        x = inputs[self._in]
        wt, bias = self.weight_t, self.bias
        if self._plain and x.ndim and x.shape[-1] == wt.shape[0]:
            # (~2 us of a small layer's call less than the checks below, which it needs not)
            act = self.fused_activation
            if act is None or not callable(act):
                return self._fast(x, wt, bias, act)
            return act(self._fast(x, wt, bias))
        if wt is None:
            w = inputs[self.slots["weight"]]
            if w.ndim == 1:  # torch: a vector weight (in,) drops the last axis (GFL's Integral)
                return self._vector_weight(x, w, inputs[self.slots["bias"]] if "bias" in self.slots else None)
            if w.ndim != 2:
                raise ShapeError(f"{self.op_type} {self.op_name!r}: weight has shape {tuple(w.shape)}, "
                                 "expected (out, in)")
            wt = self.xp.permute_dims(w, (1, 0))
        if "bias" in self.slots:
            bias = inputs[self.slots["bias"]]
            if bias is not None and (not _row_bias(tuple(bias.shape), wt.shape[1]) or bias.ndim > max(1, x.ndim)):
                raise ShapeError(f"{self.op_type} {self.op_name!r}: bias has shape {tuple(bias.shape)}, expected "
                                 f"({wt.shape[1]},) for a weight of shape ({wt.shape[1]}, {wt.shape[0]})")
            if bias is not None and bias.ndim > 1:  # (1, out): torch.addmm(b[None], x, W.t()) as pnnx writes it
                bias = self.xp.reshape(bias, (bias.shape[-1],))
        if x.ndim == 0 or x.shape[-1] != wt.shape[0]:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: input shape {tuple(x.shape)} does not fit "
                             f"the weight ({wt.shape[1]}, {wt.shape[0]}): expected last dimension {wt.shape[0]}")
        if self._fast is not None:
            act = self.fused_activation
            if act is not None and not callable(act):  # an elementwise spec: on blocks of the result in cache
                return self._fast(x, wt, bias, act)
            return self._activate(self._fast(x, wt, bias))
        return self._activate(fn.linear(x, wt, bias, xp=self.xp))

    def _vector_weight(self, x: Any, w: Any, bias: Any) -> Any:
        """``F.linear(x, w)`` with a 1-D weight: ``x @ w`` over the last axis (plus a 0-d bias)."""
        xp = self.xp
        if x.ndim == 0 or x.shape[-1] != w.shape[0]:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: input shape {tuple(x.shape)} does not fit the "
                             f"weight ({w.shape[0]},): expected last dimension {w.shape[0]}")
        if bias is not None and bias.ndim != 0:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: with a 1-D weight the bias must be 0-d (as in "
                             f"torch), found shape {tuple(bias.shape)}")
        y = xp.reshape(self.matmul(xp.reshape(x, (-1, x.shape[-1])), xp.reshape(w, (-1, 1))), tuple(x.shape[:-1]))
        if bias is not None:
            y = y + bias
        return self._activate(y)


@register("nn.BatchNorm1d", "nn.BatchNorm2d", "nn.BatchNorm3d", "F.batch_norm")
class BatchNorm(Layer):
    """Inference batch norm, y = x * scale + shift with ``scale = weight / sqrt(var + eps)`` and
    ``shift = bias - mean * scale`` folded once at build (per call for ``F.batch_norm`` whose
    statistics arrive as inputs). The channel axis is 1."""

    def __init__(self, ctx: BuildContext, scale: Any, shift: Any, eps: float, slots: dict[str, int]):
        super().__init__(ctx)
        self.scale, self.shift, self.eps, self.slots = scale, shift, eps, slots

    @staticmethod
    def fold(mean, var, weight, bias, eps, *, xp):
        scale = 1.0 / xp.sqrt(var + eps)
        if weight is not None:
            scale = scale * weight
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias
        return scale, shift

    @classmethod
    def from_operator(cls, op, ctx):
        eps = op.param("eps", float, default=1e-5)
        slots = operand_slots(op, ("input", "running_mean", "running_var", "weight", "bias"))
        if op.param("training", bool, default=False):
            raise LayerParameterError(f"{op.where}: training=True batch norm is not supported (inference only)")
        names = ("running_mean", "running_var", "weight", "bias")
        if any(n in slots for n in names):
            return cls(ctx, None, None, eps, slots)
        mean, var = op.weight("running_mean", ctx), op.weight("running_var", ctx)
        weight = op.weight("weight", ctx, optional=True)
        bias = op.weight("bias", ctx, optional=True)
        if op.param("affine", bool, default=True) and op.type.startswith("nn.") and (weight is None or bias is None):
            raise LayerParameterError(f"{op.where}: affine=True but weight/bias are missing")
        c = mean.shape[0] if mean.ndim == 1 else -1
        for name, a in (("running_var", var), ("weight", weight), ("bias", bias)):
            if a is not None and tuple(a.shape) != (c,):
                raise LayerParameterError(f"{op.where}: {name} has shape {tuple(a.shape)}, expected ({c},)")
        nf = op.param("num_features", int, default=c)
        if nf != c:
            raise LayerParameterError(f"{op.where}: num_features={nf} does not match running_mean shape ({c},)")
        scale, shift = cls.fold(mean, var, weight, bias, eps, xp=ctx.xp)
        return cls(ctx, scale, shift, eps, slots)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x = inputs[self.slots["input"]]
        scale, shift = self.scale, self.shift
        if scale is None:
            get = {k: inputs[i] for k, i in self.slots.items()}
            scale, shift = self.fold(get["running_mean"], get["running_var"], get.get("weight"),
                                     get.get("bias"), self.eps, xp=xp)
        c = scale.shape[0]
        if x.ndim < 2 or x.shape[1] != c:
            raise ShapeError(f"{self.op_type} {self.op_name!r}: input shape {tuple(x.shape)} has "
                             f"{x.shape[1] if x.ndim > 1 else '?'} channels, the statistics have {c}")
        fast = getattr(self.backend.fast, "scale_shift", None)
        if fast is not None:
            y = fast(x, scale, shift)
            if y is not None:
                return y
        b = (1, c) + (1,) * (x.ndim - 2)
        return x * xp.reshape(scale, b) + xp.reshape(shift, b)


@register("nn.Dropout", "nn.Dropout1d", "nn.Dropout2d", "nn.Dropout3d", "nn.AlphaDropout",
          "nn.FeatureAlphaDropout", "F.dropout", "F.dropout1d", "F.dropout2d", "F.dropout3d",
          "F.alpha_dropout", "F.feature_alpha_dropout", "nn.Identity")
class Identity(Layer):
    """Inference no-op: returns its (first) input unchanged."""

    def forward(self, *inputs: Any) -> Any:
        return inputs[0]


@register("aten::bilinear")
class Bilinear(Layer):
    """``nn.Bilinear`` / ``F.bilinear``: ``y[..., o] = x1[..., i] W[o, i, j] x2[..., j] + b[o]``.
    pnnx leaves it as ``aten::bilinear pnnx_0 4 1 x1 x2 weight bias`` (weight and bias from
    ``pnnx.Attribute`` ops; a missing bias is a None input). Computed as one product of x1 with
    the weight laid out (I, O*J), then a multiply by x2 and a sum over J."""

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) not in (3, 4):
            raise LayerParameterError(f"{op.where}: expected inputs (x1, x2, weight, bias), found {len(op.inputs)}")
        return cls(ctx, op.where)

    def forward(self, x1: Any, x2: Any, weight: Any, bias: Any = None) -> Any:
        xp = self.xp
        if weight.ndim != 3 or x1.shape[-1] != weight.shape[1] or x2.shape[-1] != weight.shape[2]:
            raise ShapeError(f"{self.where}: inputs {tuple(x1.shape)} and {tuple(x2.shape)} do not fit the "
                             f"weight {tuple(weight.shape)} (out, in1, in2)")
        if tuple(x1.shape[:-1]) != tuple(x2.shape[:-1]):
            raise ShapeError(f"{self.where}: inputs {tuple(x1.shape)} and {tuple(x2.shape)} differ outside "
                             f"the last dimension")
        o, i, j = weight.shape
        lead = tuple(x1.shape[:-1])
        w = xp.reshape(xp.permute_dims(weight, (1, 0, 2)), (i, o * j))
        z = xp.reshape(self.matmul(xp.reshape(x1, (-1, i)), w), (-1, o, j))
        y = xp.sum(z * xp.reshape(x2, (-1, 1, j)), axis=2)
        if bias is not None:
            y = y + bias
        return xp.reshape(y, lead + (o,))
