"""Sliding-window patches: ``F.unfold`` / ``nn.Unfold`` (im2col) and ``F.fold`` / ``nn.Fold``
(col2im, overlapping values summed).

pnnx spellings (torch 2.13 exports): ``F.unfold F.unfold_0 1 1 0 1 dilation=(1,1)
kernel_size=(3,3) padding=(1,1) stride=(2,2) $input=0`` and ``F.fold F.fold_0 1 1 0 1
dilation=(1,1) kernel_size=(2,2) output_size=(6,6) padding=(0,0) stride=(2,2) $input=0``; the
modules keep the same parameters.

Unfold maps (N, C, H, W) (or unbatched (C, H, W)) to (N, C*kh*kw, L), the patch rows in (c, i,
j) order and the L = Ho*Wo blocks row by row; fold takes (N, C*kh*kw, L) back to (N, C, H, W)
and needs L to match the block count of ``output_size``.
"""

from __future__ import annotations

from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .registry import register
from .shape import runtime_ints


def _pair(op, key: str, default: int | None = None) -> tuple[int, int]:
    if not op.has_param(key) or op.params[key] is None:
        if default is None:
            raise LayerParameterError(f"{op.where}: parameter {key!r} is missing")
        return default, default
    v = op.ints(key, 2)
    if len(v) != 2:
        raise LayerParameterError(f"{op.where}: {key}={v} should be one or two integers")
    return int(v[0]), int(v[1])


class _Windows(Layer):
    def __init__(self, ctx: BuildContext, kernel, dilation, padding, stride, where: str, output_size=None):
        super().__init__(ctx)
        self.kernel, self.dilation, self.padding, self.stride = kernel, dilation, padding, stride
        self.output_size, self.where = output_size, where
        for name, v, low in (("kernel_size", kernel, 1), ("dilation", dilation, 1), ("stride", stride, 1),
                             ("padding", padding, 0)):
            if any(a < low for a in v):
                raise LayerParameterError(f"{where}: {name}={v} must be >= {low}")

    @classmethod
    def from_operator(cls, op, ctx):
        fold = op.type in ("F.fold", "nn.Fold")
        # (a fold's output_size computed in the model, ``$output_size``, comes as a second input)
        out = _pair(op, "output_size") if fold and len(op.inputs) < 2 else None
        return cls(ctx, _pair(op, "kernel_size"), _pair(op, "dilation", 1), _pair(op, "padding", 0),
                   _pair(op, "stride", 1), op.where, out)

    def _tap(self, i: int, j: int, ho: int, wo: int) -> tuple[slice, slice]:
        """The rows and columns of the padded image that kernel tap (i, j) reads for the
        ``ho x wo`` blocks."""
        (dh, dw), (sh, sw) = self.dilation, self.stride
        return (slice(i * dh, i * dh + sh * (ho - 1) + 1, sh), slice(j * dw, j * dw + sw * (wo - 1) + 1, sw))

    def _blocks(self, h: int, w: int) -> tuple[int, int]:
        (kh, kw), (dh, dw), (ph, pw), (sh, sw) = self.kernel, self.dilation, self.padding, self.stride
        ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return ho, wo


@register("F.unfold", "nn.Unfold")
class Unfold(_Windows):
    """im2col: (N, C, H, W) -> (N, C*kh*kw, L), patch rows in (c, i, j) order."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        unbatched = x.ndim == 3
        if unbatched:
            x = x[None]
        if x.ndim != 4:
            raise ShapeError(f"{self.where}: expected a (N, C, H, W) or (C, H, W) input, found shape {tuple(x.shape)}")
        n, c, h, w = x.shape
        ho, wo = self._blocks(h, w)
        if ho < 1 or wo < 1:
            raise ShapeError(f"{self.where}: kernel {self.kernel} (dilation {self.dilation}, padding "
                             f"{self.padding}) does not fit the input's {h}x{w}")
        (kh, kw), (ph, pw) = self.kernel, self.padding
        if ph or pw:
            xpad = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype, device=self.device)
            xpad[:, :, ph:ph + h, pw:pw + w] = x
            x = xpad
        taps = [x[(slice(None), slice(None)) + self._tap(i, j, ho, wo)] for i in range(kh) for j in range(kw)]
        y = xp.reshape(xp.stack(taps, axis=2), (n, c * kh * kw, ho * wo))
        return y[0] if unbatched else y


@register("F.fold", "nn.Fold")
class Fold(_Windows):
    """col2im: (N, C*kh*kw, L) -> (N, C, H, W) of ``output_size``, overlaps summed."""

    def forward(self, x: Any, output_size: Any = None) -> Any:
        xp = self.xp
        unbatched = x.ndim == 2
        if unbatched:
            x = x[None]
        (kh, kw), (ph, pw) = self.kernel, self.padding
        if output_size is None:
            h, w = self.output_size
        else:
            size = runtime_ints(output_size, self.where, "output_size")
            if len(size) not in (1, 2):
                raise ShapeError(f"{self.where}: output_size {size!r} should be one or two integers")
            h, w = size * 2 if len(size) == 1 else size
        ho, wo = self._blocks(h, w)
        if ho < 1 or wo < 1:
            raise ShapeError(f"{self.where}: output size {(h, w)} with padding {self.padding} is smaller than "
                             f"the kernel {self.kernel} at dilation {self.dilation}: no sliding block fits")
        if x.ndim != 3 or x.shape[1] % (kh * kw) or x.shape[2] != ho * wo:
            raise ShapeError(f"{self.where}: expected a (N, C*{kh * kw}, {ho * wo}) input for output size "
                             f"{(h, w)}, kernel {self.kernel}, found shape {tuple(x.shape)}")
        n, c = x.shape[0], x.shape[1] // (kh * kw)
        cols = xp.reshape(x, (n, c, kh, kw, ho, wo))
        y = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype, device=self.device)
        for i in range(kh):
            for j in range(kw):
                key = (slice(None), slice(None)) + self._tap(i, j, ho, wo)
                y[key] = y[key] + cols[:, :, i, j, ...]
        y = y[:, :, ph:ph + h, pw:pw + w]
        return y[0] if unbatched else y
