"""Functional 3-D convolutions: ``F.conv3d`` and ``F.conv_transpose3d``, whose weight (and bias)
usually arrive as graph operands.

The module forms and the 3-D pools (``nn.Conv3d``, ``nn.ConvTranspose3d``, ``nn.MaxPool3d`` /
``F.max_pool3d``, ``nn.AvgPool3d`` / ``F.avg_pool3d``, ``nn.AdaptiveAvgPool3d`` /
``F.adaptive_avg_pool3d``, ``nn.AdaptiveMaxPool3d`` / ``F.adaptive_max_pool3d``) live in
:mod:`.conv3d`. pnnx turns an ``F.conv3d`` / ``F.conv_transpose3d`` whose weight is a constant
(a parameter or buffer) into ``nn.Conv3d`` / ``nn.ConvTranspose3d``, so the functional types
appear only when the weight is computed or fed in.

pnnx spellings (torch 2.13 exports):

* ``F.conv3d F.conv3d_3 2 1 0 1 4 bias=None dilation=(1,1,1) groups=1 padding=valid
  stride=(2,2,2) $input=0 $weight=1``; ``padding`` is ``same``, ``valid``, or ``(pd,ph,pw)``;
  with a bias operand there is no ``bias=`` key but ``$bias=2``. There is no ``padding_mode``
  (F.conv3d pads with zeros only).
* ``F.conv_transpose3d F.conv_transpose3d_12 3 1 0 1 2 3 dilation=(1,2,1) groups=2
  output_padding=(1,0,0) padding=(1,1,1) stride=(2,1,2) $input=0 $weight=1 $bias=2``, or
  ``bias=None`` without one; the weight is ``(C_in, C_out/groups, kd, kh, kw)``.

A weight given as an ``@weight`` attribute (hand-written files) is checked and packed once at
build. Everything is generic Array-API code: a convolution is one batched ``matmul`` of the
``(G, O/G, C/G*kd*kh*kw)`` weight with an im2col of the ``kd*kh*kw`` strided taps of the
zero-padded input, or, where that column matrix would pass :data:`IM2COL_LIMIT` elements, a sum
over the taps of one product each (no copy larger than the input). A transposed convolution is
col2im: the products of every input voxel with the ``(O/G, kd, kh, kw)`` kernels, each tap added
into a strided slice of the uncropped output (again per tap past the limit). Inputs are
(N, C, D, H, W) or unbatched (C, D, H, W); float32 and float64. The runtime may fold a following
activation into either layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from . import functional as fn
from .base import BuildContext, FusesActivation, Layer
from .conv3d import _triple, conv3d_padding
from .misc import operand_slots
from .registry import register

#: Largest im2col / col2im matrix (in elements) built in one piece; past it, one product per tap.
IM2COL_LIMIT = 1 << 25

Triple = tuple[int, int, int]
Pads3 = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


# -- generic functions -------------------------------------------------------------------------
def _strided_tap(x: Any, start: Sequence[int], step: Sequence[int], count: Sequence[int]) -> Any:
    """``x[:, :, a::sd, b::sh, c::sw]`` limited to ``count`` items per spatial axis."""
    return x[(slice(None), slice(None)) + tuple(slice(a, a + s * (n - 1) + 1, s)
                                                for a, s, n in zip(start, step, count))]


def _tap_offsets(kernel: Sequence[int], dilation: Sequence[int]) -> list[Triple]:
    kd, kh, kw = kernel
    dd, dh, dw = dilation
    return [(a * dd, b * dh, c * dw) for a in range(kd) for b in range(kh) for c in range(kw)]


def pack_conv3d_weight(weight: Any, groups: int, *, xp: Any) -> Any:
    """``(O, C/G, kd, kh, kw)`` -> the ``(G, O/G, C/G*kd*kh*kw)`` matrix :func:`conv3d` multiplies
    by (channel-major, then the kernel taps in depth, row, column order)."""
    o, cg = weight.shape[:2]
    return xp.reshape(weight, (groups, o // groups, cg * math.prod(weight.shape[2:])))


def conv3d(x: Any, weight: Any, bias: Any = None, stride: Sequence[int] = (1, 1, 1),
           pads: Pads3 = ((0, 0), (0, 0), (0, 0)), dilation: Sequence[int] = (1, 1, 1), groups: int = 1,
           *, xp: Any, matmul: Any = None, packed: Any = None) -> Any:
    """torch's ``conv3d`` of (N, C, D, H, W) ``x`` with zero padding ``pads`` (lo, hi per axis).
    ``packed`` is :func:`pack_conv3d_weight` of ``weight`` when already made; ``matmul`` the
    matrix product to use (the backend's, by default ``xp.matmul``)."""
    matmul = matmul or xp.matmul
    o, cg, kd, kh, kw = weight.shape
    kernel, k = (kd, kh, kw), kd * kh * kw
    wm = pack_conv3d_weight(weight, groups, xp=xp) if packed is None else packed
    x = fn.pad(x, pads, "zeros", xp=xp)
    n, c = x.shape[:2]
    out = tuple((size - d * (kk - 1) - 1) // s + 1
                for size, kk, s, d in zip(x.shape[2:], kernel, stride, dilation))
    if min(out) <= 0:
        raise ShapeError(f"convolution output would be empty: padded input {tuple(x.shape)}, kernel "
                         f"{kernel}, dilation {tuple(dilation)}, stride {tuple(stride)}")
    length = math.prod(out)
    og = o // groups
    # groups == 1: a 2-D weight against (N, K, L) stacks (one GEMM over the batch)
    wmat = wm[0, ...] if groups == 1 else wm
    lead = (n,) if groups == 1 else (n, groups)
    taps = (_strided_tap(x, t, stride, out) for t in _tap_offsets(kernel, dilation))
    if n * c * k * length <= IM2COL_LIMIT:
        cols = next(taps) if k == 1 else xp.stack(list(taps), axis=2)  # (N, C, K, Do, Ho, Wo)
        y = matmul(wmat, xp.reshape(cols, lead + (cg * k, length)))
    else:
        w4 = xp.reshape(wmat, wmat.shape[:-1] + (cg, k))
        y = None
        for t, tap in enumerate(taps):
            part = matmul(w4[..., t], xp.reshape(tap, lead + (cg, length)))
            y = part if y is None else y + part
    y = xp.reshape(y, (n, og * groups) + out)
    if bias is not None:
        y = y + xp.reshape(bias, (1, o, 1, 1, 1))
    return y


def pack_conv_transpose3d_weight(weight: Any, groups: int, *, xp: Any) -> Any:
    """``(C, O/G, kd, kh, kw)`` -> the ``(G, O/G*kd*kh*kw, C/G)`` matrix of
    :func:`conv_transpose3d`."""
    c, og = weight.shape[:2]
    k = math.prod(weight.shape[2:])
    return xp.permute_dims(xp.reshape(weight, (groups, c // groups, og * k)), (0, 2, 1))


def conv_transpose3d(x: Any, weight: Any, bias: Any = None, stride: Sequence[int] = (1, 1, 1),
                     padding: Sequence[int] = (0, 0, 0), output_padding: Sequence[int] = (0, 0, 0),
                     dilation: Sequence[int] = (1, 1, 1), groups: int = 1, *, xp: Any, matmul: Any = None,
                     packed: Any = None) -> Any:
    """torch's ``conv_transpose3d`` of (N, C, D, H, W) ``x``; ``weight`` is
    ``(C, O/groups, kd, kh, kw)``, ``packed`` its :func:`pack_conv_transpose3d_weight`."""
    matmul = matmul or xp.matmul
    n, c = x.shape[:2]
    size = tuple(x.shape[2:])
    _, og, kd, kh, kw = weight.shape
    kernel, k = (kd, kh, kw), kd * kh * kw
    o, cg = og * groups, c // groups
    full_size = tuple((i - 1) * s + d * (kk - 1) + 1 + op_
                      for i, s, d, kk, op_ in zip(size, stride, dilation, kernel, output_padding))
    out = tuple(f - 2 * p for f, p in zip(full_size, padding))
    if min(out) <= 0:
        raise ShapeError(f"transposed convolution output would be empty for input {tuple(x.shape)}, "
                         f"kernel {kernel}, stride {tuple(stride)}, padding {tuple(padding)}")
    wm = pack_conv_transpose3d_weight(weight, groups, xp=xp) if packed is None else packed
    voxels = math.prod(size)
    xs = xp.reshape(x, (n, groups, cg, voxels))
    full = xp.zeros((n, o) + full_size, dtype=x.dtype, device=x.device)
    offsets = _tap_offsets(kernel, dilation)
    if n * o * k * voxels <= IM2COL_LIMIT:
        cols = xp.reshape(matmul(wm, xs), (n, o, k) + size)  # (N, O, K, D, H, W)
        parts = (cols[:, :, t, ...] for t in range(k))
    else:
        w4 = xp.reshape(wm, (groups, og, k, cg))
        parts = (xp.reshape(matmul(w4[:, :, t, :], xs), (n, o) + size) for t in range(k))
    for t, part in zip(offsets, parts):
        key = (slice(None), slice(None)) + tuple(slice(a, a + s * (i - 1) + 1, s)
                                                 for a, s, i in zip(t, stride, size))
        full[key] = full[key] + part
    y = full[(slice(None), slice(None)) + tuple(slice(p, p + m) for p, m in zip(padding, out))]
    if bias is not None:
        y = y + xp.reshape(bias, (1, o, 1, 1, 1))
    return y


# -- parameters --------------------------------------------------------------------------------
def _operand_slots(op) -> dict[str, int]:
    """Which input carries ``$input``, ``$weight``, ``$bias`` (unnamed ones in torch's order)."""
    if len(op.inputs) > 3:
        raise LayerParameterError(f"{op.where}: takes at most 3 inputs (input, weight, bias), found "
                                  f"{len(op.inputs)}")
    return operand_slots(op, ("input", "weight", "bias"))


def _window_params(op) -> tuple[Triple, Triple, int]:
    stride, dilation = _triple(op, "stride", 1), _triple(op, "dilation", 1)
    groups = op.param("groups", int, default=1)
    if groups < 1 or min(stride) < 1 or min(dilation) < 1:
        raise LayerParameterError(f"{op.where}: groups={groups}, stride={stride}, dilation={dilation} "
                                  "must be positive")
    return stride, dilation, groups


def _weights(op, ctx: BuildContext, slots: dict[str, int]) -> tuple[Any, Any]:
    """The ``@weight`` / ``@bias`` attributes, None where they are runtime inputs or absent."""
    weight = None if "weight" in slots else op.weight("weight", ctx)
    bias = None
    if "bias" not in slots:
        bias = op.weight("bias", ctx, optional=True)
        if op.param("bias", None, default=None) is True and bias is None:
            raise LayerParameterError(f"{op.where}: parameter bias=True but weight 'bias' is missing")
    return weight, bias


class _Volumetric(FusesActivation, Layer):
    """Shared plumbing: the operand slots, 5-D checks, weights from attributes or inputs."""

    transposed = False

    def __init__(self, ctx: BuildContext, *, where: str, slots: dict[str, int], weight: Any, bias: Any,
                 stride: Triple, dilation: Triple, groups: int):
        super().__init__(ctx)
        self.where, self.slots = where, slots
        self.weight, self.bias = weight, bias
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.packed = None
        if weight is not None:  # an attribute: checked and packed once
            self._check_weight(weight, LayerParameterError, where)
            lead, per_group = weight.shape[:2]
            cout = per_group * groups if self.transposed else lead
            if bias is not None and tuple(bias.shape) != (cout,):
                raise LayerParameterError(f"{where}: bias has shape {tuple(bias.shape)}, expected ({cout},)")
            self.packed = self._pack(weight)

    def _pack(self, weight: Any) -> Any:
        raise NotImplementedError  # pragma: no cover

    def _name(self) -> str:
        return f"{self.op_type} {self.op_name!r}" if self.op_type else self.where

    def _operands(self, inputs: tuple[Any, ...]) -> tuple[Any, bool, Any, Any, Any]:
        """(5-D input, whether it was unbatched, weight, packed weight, bias), all checked."""
        x = inputs[self.slots["input"]]
        if x.ndim not in (4, 5):
            raise ShapeError(f"{self._name()}: expects a 5-D input (N, C, D, H, W) or its unbatched 4-D "
                             f"form, got shape {tuple(x.shape)}")
        unbatched = x.ndim == 4
        x5 = self.xp.expand_dims(x, axis=0) if unbatched else x
        weight, packed, bias = self.weight, self.packed, self.bias
        if weight is None:
            weight = inputs[self.slots["weight"]]
            self._check_weight(weight, ShapeError, self._name())
            packed = self._pack(weight)
        if "bias" in self.slots:
            bias = inputs[self.slots["bias"]]
        lead, per_group = weight.shape[:2]
        cin = lead if self.transposed else per_group * self.groups
        if x5.shape[1] != cin:
            raise ShapeError(f"{self._name()}: input has {x5.shape[1]} channels (shape {tuple(x.shape)}) "
                             f"but the weight {tuple(weight.shape)} with groups={self.groups} expects {cin}")
        cout = per_group * self.groups if self.transposed else lead
        if bias is not None and tuple(bias.shape) != (cout,):
            raise ShapeError(f"{self._name()}: bias has shape {tuple(bias.shape)}, expected ({cout},)")
        return x5, unbatched, weight, packed, bias

    def _check_weight(self, weight: Any, error: type[Exception], name: str) -> None:
        if weight.ndim != 5:
            raise error(f"{name}: weight has shape {tuple(weight.shape)}, expected 5 dimensions "
                        f"({'C_in, C_out/groups' if self.transposed else 'C_out, C_in/groups'}, kd, kh, kw)")
        if weight.shape[0] % self.groups:
            what = "input" if self.transposed else "output"
            raise error(f"{name}: weight {tuple(weight.shape)} has {weight.shape[0]} {what} channels, "
                        f"not divisible by groups={self.groups}")

    def _finish(self, y: Any, unbatched: bool) -> Any:
        y = self._activate(y, "inner")
        return self._activate(y[0, ...] if unbatched else y, "outer")


@register("F.conv3d")
class FunctionalConv3d(_Volumetric):
    """torch ``F.conv3d``: weight and bias as inputs or attributes; stride, dilation, groups,
    padding as ints, triples, ``same`` or ``valid``."""

    def __init__(self, ctx: BuildContext, *, padding: Any, **kw: Any):
        super().__init__(ctx, **kw)
        self.padding = padding  # Pads3, or "same" (worked out from the runtime weight)
        if self.weight is not None and padding == "same":
            self.padding = fn.same_pads(tuple(self.weight.shape[2:]), self.dilation)

    def _pack(self, weight: Any) -> Any:
        return pack_conv3d_weight(weight, self.groups, xp=self.xp)

    @classmethod
    def from_operator(cls, op, ctx):
        slots = _operand_slots(op)
        weight, bias = _weights(op, ctx, slots)
        stride, dilation, groups = _window_params(op)
        padding: Any = conv3d_padding(op)
        if padding == "same" and stride != (1, 1, 1):
            raise LayerParameterError(f"{op.where}: padding='same' needs stride 1, found stride={stride}")
        mode = op.param("padding_mode", str, default="zeros")
        if mode != "zeros":
            raise LayerParameterError(f"{op.where}: padding_mode={mode!r} is not supported by F.conv3d "
                                      "(it pads with zeros)")
        return cls(ctx, where=op.where, slots=slots, weight=weight, bias=bias, stride=stride,
                   dilation=dilation, groups=groups, padding=padding)

    def forward(self, *inputs: Any) -> Any:
        x, unbatched, weight, packed, bias = self._operands(inputs)
        pads = self.padding
        if pads == "same":
            pads = fn.same_pads(tuple(weight.shape[2:]), self.dilation)
        try:
            y = conv3d(x, weight, bias, self.stride, pads, self.dilation, self.groups, xp=self.xp,
                       matmul=self.matmul, packed=packed)
        except ShapeError as exc:
            raise ShapeError(f"{self._name()}: {exc}") from None
        return self._finish(y, unbatched)


@register("F.conv_transpose3d")
class FunctionalConvTranspose3d(_Volumetric):
    """torch ``F.conv_transpose3d``: weight ``(C_in, C_out/groups, kd, kh, kw)`` and bias as
    inputs or attributes; stride, padding, output_padding, dilation, groups."""

    transposed = True

    def __init__(self, ctx: BuildContext, *, padding: Triple, output_padding: Triple, **kw: Any):
        super().__init__(ctx, **kw)
        self.padding, self.output_padding = padding, output_padding

    def _pack(self, weight: Any) -> Any:
        return pack_conv_transpose3d_weight(weight, self.groups, xp=self.xp)

    @classmethod
    def from_operator(cls, op, ctx):
        slots = _operand_slots(op)
        weight, bias = _weights(op, ctx, slots)
        stride, dilation, groups = _window_params(op)
        if isinstance(op.params.get("padding"), str):
            raise LayerParameterError(f"{op.where}: padding={op.params['padding']!r} is not supported by "
                                      "transposed convolutions; expected an int or three ints")
        padding, output_padding = _triple(op, "padding", 0), _triple(op, "output_padding", 0)
        if min(padding) < 0:
            raise LayerParameterError(f"{op.where}: negative padding {padding} is not supported")
        for op_, s, d in zip(output_padding, stride, dilation):
            if op_ < 0 or (op_ >= s and op_ >= d):
                raise LayerParameterError(f"{op.where}: output_padding={output_padding} must be smaller than "
                                          f"stride {stride} or dilation {dilation}")
        return cls(ctx, where=op.where, slots=slots, weight=weight, bias=bias, stride=stride,
                   dilation=dilation, groups=groups, padding=padding, output_padding=output_padding)

    def forward(self, *inputs: Any) -> Any:
        x, unbatched, weight, packed, bias = self._operands(inputs)
        try:
            y = conv_transpose3d(x, weight, bias, self.stride, self.padding, self.output_padding,
                                 self.dilation, self.groups, xp=self.xp, matmul=self.matmul, packed=packed)
        except ShapeError as exc:
            raise ShapeError(f"{self._name()}: {exc}") from None
        return self._finish(y, unbatched)
