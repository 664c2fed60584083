"""Resizing layers: interpolation, pixel (un)shuffle, and grid sampling (``F.grid_sample``,
``F.affine_grid``).

pnnx spellings (from real exports with torch 2.13):

* ``nn.Upsample up 1 1 0 1 mode=nearest scale_factor=(2.0,2.0) size=None``
* ``nn.Upsample up2 ... align_corners=True mode=bilinear size=(7,9)``
* ``F.interpolate(..., scale_factor=s)`` comes out as ``F.upsample ... align_corners=False
  mode=bilinear scale_factor=(1.5,1.5)``; with ``recompute_scale_factor`` set, or mode
  ``nearest-exact``, as ``F.interpolate ... recompute_scale_factor=True scale_factor=(1.5,1.5)``;
  nearest by size as ``F.upsample_nearest size=(3,5)``; ``F.upsample_bilinear`` as ``F.upsample
  align_corners=True mode=bilinear``; a size taken from another tensor as an input
  ``$size=6`` fed by ``pnnx.Expression expr=[size(@0,2),size(@0,3)]``.
* ``nn.UpsamplingNearest2d scale_factor=(2.0,2.0) size=None``, ``nn.UpsamplingBilinear2d
  size=(5,7)`` (align_corners=True).
* mode ``area`` is exported as ``F.adaptive_avg_pool2d`` (not handled here); ``antialias=True``
  as a raw ``aten::_upsample_bilinear2d_aa`` (not supported).
* ``nn.PixelShuffle upscale_factor=2``, ``nn.PixelUnshuffle downscale_factor=2``,
  ``F.pixel_shuffle`` / ``F.pixel_unshuffle`` with the same keys.

Interpolation is separable: along each spatial axis the output is ``sum_t take(x, idx_t) * w_t``
with 1 tap (nearest), 2 (linear), 4 (cubic) or a variable number (area). The index and weight
tables reproduce torch's CPU kernels (``UpSampleKernel.cpp``) exactly, including their float32
coordinate arithmetic (emulated on the host), the use of the user's scale factor in the
coordinate mapping unless ``recompute_scale_factor=True``, and bicubic's A=-0.75 with clamped
taps. Tables are built on first use per (input size, output size, dtype), kept in a dict of
immutable tuples (thread-safe), and moved to the device once.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.limits import check_elements

from .base import BuildContext, Layer
from .misc import input_slots, to_int_list
from .registry import register
from .shape import runtime_ints

_F32 = struct.Struct("<f")


def _f32(v: float) -> float:
    """Round a double to the nearest float32 (products/quotients of float32 values computed in
    double and rounded once equal the float32 results, so this emulates C++ float arithmetic)."""
    return _F32.unpack(_F32.pack(v))[0]


_CUBIC_A = -0.75


def _cubic_weights(t: Any) -> tuple[Any, Any, Any, Any]:
    """torch's cubic convolution weights (A = -0.75) of the taps at -1, 0, 1, 2 for a fraction
    ``t`` (a float, or an array of them)."""
    a = _CUBIC_A

    def cc1(x: float) -> float:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def cc2(x: float) -> float:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return cc2(t + 1.0), cc1(t), cc1(1.0 - t), cc2(2.0 - t)


def _f64(v: float) -> float:
    return v


def _coord_scale(n_in: int, n_out: int, align_corners: bool, scale: float | None, rnd=_f32) -> float:
    """torch's ``area_pixel_compute_scale<opmath_t>`` (``rnd``: float32 rounding for float
    tensors, none for double ones)."""
    if align_corners:
        return rnd(float(n_in - 1) / (n_out - 1)) if n_out > 1 else 0.0
    if scale is not None and scale > 0:
        return rnd(1.0 / scale)
    return rnd(float(n_in) / n_out)


def _source_index(scale: float, dst: int, align_corners: bool, cubic: bool, rnd=_f32) -> float:
    """torch's ``area_pixel_compute_source_index<opmath_t>``."""
    if align_corners:
        return rnd(scale * dst)
    src = rnd(rnd(scale * rnd(dst + 0.5)) - 0.5)
    return 0.0 if (not cubic and src < 0) else src


def axis_taps(mode: str, n_in: int, n_out: int, align_corners: bool,
              scale: float | None, double: bool = False,
              ndim: int | None = None) -> list[tuple[list[int], list[float] | None]] | None:
    """Index and weight lists for one axis: ``[(idx, w), ...]`` (one entry per tap, each of
    length ``n_out``; ``w`` None for nearest), or None when the axis is left unchanged.
    ``double``: the coordinates in double precision, as torch computes them for float64
    tensors (its kernels' ``opmath_t``); else in float32. ``ndim``: the number of spatial axes
    (torch's kernels differ by it, see below).

    torch's shortcuts, which a ``scale_factor`` whose product with the size rounds down to the
    size (or twice it) makes visible: the linear modes leave an axis whose size does not change
    as it is (``scale_factor=1.3`` on 3 rows keeps the rows, where 1/1.3 would move them); the
    2-D ``nearest`` kernel copies such an axis and maps a doubled one by ``d >> 1``
    (``nearest_idx``; its 1-D and 3-D kernels use the scale). ``nearest`` computes its source
    index in float32 for float64 tensors too, and so does the 2-D ``nearest-exact``."""
    rnd = _f64 if double else _f32
    if mode in ("nearest", "nearest-exact"):
        if mode == "nearest" and ndim == 2 and n_out in (n_in, 2 * n_in):
            return None if n_out == n_in else [([d >> 1 for d in range(n_out)], None)]
        if mode == "nearest" or ndim == 2:
            rnd = _f32
        s = _coord_scale(n_in, n_out, False, scale, rnd)
        if mode == "nearest":
            idx = [min(math.floor(rnd(float(d) * s)), n_in - 1) for d in range(n_out)]
        else:
            idx = [min(math.floor(rnd(rnd(d + 0.5) * s)), n_in - 1) for d in range(n_out)]
        if n_in == n_out and idx == list(range(n_out)):
            return None
        return [(idx, None)]
    if mode in ("linear", "bilinear", "trilinear", "bicubic"):
        cubic = mode == "bicubic"
        if n_in == n_out and not cubic:
            return None
        s = _coord_scale(n_in, n_out, align_corners, scale, rnd)
        n_taps = 4 if cubic else 2
        idx_t: list[list[int]] = [[] for _ in range(n_taps)]
        w_t: list[list[float]] = [[] for _ in range(n_taps)]
        identity = n_in == n_out
        for d in range(n_out):
            real = _source_index(s, d, align_corners, cubic, rnd)
            i0 = min(math.floor(real), n_in - 1)
            lam = min(max(rnd(real - i0), 0.0), 1.0)
            if cubic:
                ws = _cubic_weights(lam)
                ids = [min(max(i0 - 1 + j, 0), n_in - 1) for j in range(4)]
            else:
                ws = (rnd(1.0 - lam), lam)
                ids = [i0, i0 + (1 if i0 < n_in - 1 else 0)]
            for j in range(n_taps):
                idx_t[j].append(ids[j])
                w_t[j].append(ws[j])
                if ws[j] != 0.0 and (ids[j] != d or ws[j] != 1.0):
                    identity = False
        if identity:
            return None
        return [(idx_t[j], w_t[j]) for j in range(n_taps)]
    if mode == "area":  # adaptive average pooling bins
        starts = [(d * n_in) // n_out for d in range(n_out)]
        ends = [-((-(d + 1) * n_in) // n_out) for d in range(n_out)]
        if n_in == n_out:
            return None
        return _padded_taps([(list(range(s, e)), [1.0 / (e - s)] * (e - s)) for s, e in zip(starts, ends)])
    raise ValueError(mode)


def aa_axis_matrix(cubic: bool, n_in: int, n_out: int, align_corners: bool, scale: float | None,
                   supports: list | None = None) -> list[list[float]]:
    """torch's antialiased resampling weights along one axis (``_compute_weights_aa``), as an
    (n_out, n_in) matrix: a triangle (bilinear) or Keys cubic (a = -0.5, bicubic) filter
    stretched by the scale when shrinking, each row normalised to sum 1. ``supports``, a list,
    receives each row's ``(lo, hi)``: the inputs torch weighs for it."""
    interp = 4 if cubic else 2
    if align_corners:
        s = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        s = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
    support = interp * 0.5 * s if s >= 1.0 else interp * 0.5
    inv = 1.0 / s if s >= 1.0 else 1.0

    def filt(x: float) -> float:
        x = abs(x)
        if not cubic:
            return max(0.0, 1.0 - x)
        a = -0.5
        if x < 1.0:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2.0:
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return 0.0

    rows = []
    for i in range(n_out):
        center = s * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        if supports is not None:
            supports.append((lo, hi))
        ws = [filt((j - center + 0.5) * inv) for j in range(lo, hi)]
        total = sum(ws)
        row = [0.0] * n_in
        for j, w in zip(range(lo, hi), ws):
            row[j] = w / total if total != 0.0 else w
        rows.append(row)
    return rows


def _padded_taps(rows: list[tuple[list[int], list[float]]]) -> list[tuple[list[int], list[float]]]:
    """Per-output (indices, weights) lists of different lengths as equally many taps: a shorter
    one repeats its last index, that index's weight shared equally by its repeats. (Not weight 0
    on the repeats: 0 * inf is NaN, and one inf in the input then spoiled outputs whose windows
    do not hold it.)"""
    width = max(len(ids) for ids, _ in rows)
    taps: list[tuple[list[int], list[float]]] = [([], []) for _ in range(width)]
    for ids, ws in rows:
        extra = width - len(ids)
        last = ws[-1] / (extra + 1)
        for j in range(width):
            if j < len(ids) - 1:
                taps[j][0].append(ids[j])
                taps[j][1].append(ws[j])
            else:
                taps[j][0].append(ids[-1])
                taps[j][1].append(last)
    return taps


def aa_axis_taps(cubic: bool, n_in: int, n_out: int, align_corners: bool,
                 scale: float | None) -> list[tuple[list[int], list[float]]]:
    """:func:`aa_axis_matrix`'s weights as taps over each output's support only (see
    :func:`_padded_taps`): what torch multiplies, nothing outside it."""
    supports: list[tuple[int, int]] = []
    m = aa_axis_matrix(cubic, n_in, n_out, align_corners, scale, supports)
    return _padded_taps([(list(range(lo, hi)), [m[i][j] for j in range(lo, hi)])
                         for i, (lo, hi) in enumerate(supports)])


@register("aten::_upsample_bilinear2d_aa", "aten::_upsample_bicubic2d_aa")
class InterpolateAntialias(Layer):
    """``F.interpolate(..., mode='bilinear'|'bicubic', antialias=True)`` as pnnx leaves it:
    ``aten::_upsample_bilinear2d_aa`` (input, output_size, align_corners, scales_h, scales_w), or
    with one list of scale factors (input, output_size, align_corners, scale_factors).
    Separable: along each axis whose size changes, taps over each output's support with torch's
    filter weights (:func:`aa_axis_taps`; made once per sizes), applied as the other modes'
    taps are (an axis of unchanged size is left as it is, as torch leaves it)."""

    def __init__(self, ctx: BuildContext, cubic: bool, where: str):
        super().__init__(ctx)
        self.cubic, self.where = cubic, where
        self._plans: dict[tuple, tuple] = {}

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) not in (4, 5):
            raise LayerParameterError(f"{op.where}: expected inputs (input, output_size, align_corners, "
                                      f"scales_h, scales_w) or (input, output_size, align_corners, "
                                      f"scale_factors), found {len(op.inputs)}")
        return cls(ctx, op.type.endswith("bicubic2d_aa"), op.where)

    def forward(self, x: Any, size: Any, align: Any, scale_h: Any, scale_w: Any = ...) -> Any:
        xp = self.xp
        if scale_w is ...:  # the .vec form: one list of scale factors
            scales = scale_h
            if scales is None:
                scale_h = scale_w = None
            else:
                scale_h, scale_w = (float(v) for v in (scales if len(scales) == 2 else list(scales) * 2))
        if x.ndim != 4:
            raise ShapeError(f"{self.where}: expected an (N, C, H, W) input, found {tuple(x.shape)}")
        if not xp.isdtype(x.dtype, "real floating"):
            raise ShapeError(f"{self.where}: antialiased resampling needs a float input, found {x.dtype}")
        h, w = x.shape[2], x.shape[3]
        sh = None if scale_h is None else float(scale_h)
        sw = None if scale_w is None else float(scale_w)
        if size is not None:
            ho, wo = runtime_ints(size, self.where, "output_size")
        elif sh is not None and sw is not None:
            ho, wo = math.floor(h * sh), math.floor(w * sw)
        else:
            raise ShapeError(f"{self.where}: needs output_size or both scales")
        if ho <= 0 or wo <= 0:
            raise ShapeError(f"{self.where}: output size ({ho}, {wo}) must be positive")
        ac = bool(align) if align is not None else False
        key = (h, w, ho, wo, ac, sh, sw, x.dtype)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 8:
                self._plans.clear()
            axes: list[Any] = []
            for n_in, n_out, sc in ((h, ho, sh), (w, wo, sw)):
                if n_in == n_out:
                    axes.append(None)
                    continue
                axes.append(tuple((xp.asarray(idx, dtype=xp.int64, device=self.device),
                                   xp.asarray(wt, dtype=x.dtype, device=self.device))
                                  for idx, wt in aa_axis_taps(self.cubic, n_in, n_out, ac, sc)))
            plan = self._plans[key] = tuple(axes)
        return apply_taps(self, x, plan)


def apply_taps(layer: Layer, x: Any, plan: tuple) -> Any:
    """A resize plan (per spatial axis: None, or taps ``(indices, weights or None)``) applied
    to ``x`` axis by axis: the backend's fast path when it has one, else a take per tap."""
    xp = layer.xp
    fast = getattr(layer.backend.fast, "resize_taps", None)
    if fast is not None:
        y = fast(x, plan)  # the same steps in the same order, threaded, pooled output
        if y is not None:
            return y
    for k, taps in enumerate(plan):
        if taps is None:
            continue
        axis = 2 + k
        if len(taps) == 1 and taps[0][1] is None:
            x = xp.take(x, taps[0][0], axis=axis)
            continue
        bshape = (-1,) + (1,) * (x.ndim - 1 - axis)
        acc = None
        for idx, w in taps:
            term = xp.take(x, idx, axis=axis) * xp.reshape(w, bshape)
            acc = term if acc is None else acc + term
        x = acc
    return x


_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")
_MODE_NDIM = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


def _expand(value: Any, n: int, what: str, where: str) -> tuple:
    seq = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if len(seq) == 1:
        seq = seq * n
    if len(seq) != n:
        raise ShapeError(f"{where}: {what} {value!r} does not match the {n} spatial dimension(s) of the input")
    return seq


def _check_declared_size(op: Any, size: Any) -> None:
    """Refuse a ``size`` parameter other than the output size the file declares (a size of
    40000x40000 on a declared 8x8 output asked for 24 GiB before any check)."""
    out = op.outputs[0].shape if op.outputs else None
    if size is None or out is None:
        return
    size = size if isinstance(size, list) else [size] * max(1, len(out) - 2)
    if len(out) < len(size):
        return
    for want, got in zip(size, out[len(out) - len(size):]):
        if got is not None and want != got:
            raise LayerParameterError(f"{op.where}: parameter size={size} but the file declares the output "
                                      "(" + ", ".join("?" if d is None else str(d) for d in out) + ")")


@register("nn.Upsample", "F.upsample", "F.interpolate", "F.upsample_nearest", "F.upsample_bilinear",
          "nn.UpsamplingNearest2d", "nn.UpsamplingBilinear2d")
class Interpolate(Layer):
    """``F.interpolate`` and its aliases, for modes nearest, nearest-exact, (bi/tri)linear,
    bicubic (align_corners either way) and area, by output size or by scale factor."""

    def __init__(self, ctx: BuildContext, mode: str, align_corners: bool, size: Any, scale: Any,
                 recompute: bool, size_pos: int | None, where: str, input_pos: int = 0):
        super().__init__(ctx)
        self.mode, self.align_corners = mode, align_corners
        self.size, self.scale, self.recompute = size, scale, recompute
        self.size_pos, self.where, self.input_pos = size_pos, where, input_pos
        self._plans: dict[tuple, tuple] = {}

    @classmethod
    def from_operator(cls, op, ctx):
        t = op.type
        if t in ("F.upsample_bilinear", "nn.UpsamplingBilinear2d"):
            mode, align = "bilinear", True
        elif t in ("F.upsample_nearest", "nn.UpsamplingNearest2d"):
            mode, align = "nearest", False
        else:
            mode = op.param("mode", str, default="nearest")
            align = op.param("align_corners", bool, default=False) or False
        if mode not in _MODES:
            raise LayerParameterError(f"{op.where}: unsupported interpolation mode {mode!r}; supported: {', '.join(_MODES)}")
        if op.param("antialias", bool, default=False):
            raise LayerParameterError(f"{op.where}: antialias=True is not supported")
        slots = input_slots(op, ("input", "size", "scale_factor"))
        if "scale_factor" in slots:
            raise LayerParameterError(f"{op.where}: a scale_factor given as an input is not supported")
        size = op.param("size", default=None)
        scale = op.param("scale_factor", default=None)
        if size is not None and not all(isinstance(s, int) and not isinstance(s, bool)
                                        for s in (size if isinstance(size, list) else [size])):
            raise LayerParameterError(f"{op.where}: parameter 'size' should be integers, found {size!r}")
        if scale is not None:
            items = scale if isinstance(scale, list) else [scale]
            if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in items):
                raise LayerParameterError(f"{op.where}: parameter 'scale_factor' should be positive numbers, "
                                          f"found {scale!r}")
            scale = [float(s) for s in items] if isinstance(scale, list) else float(scale)
        size_pos = slots.get("size")
        if size is None and scale is None and size_pos is None:
            raise LayerParameterError(f"{op.where}: either size or scale_factor is needed")
        recompute = op.param("recompute_scale_factor", bool, default=None) or False
        _check_declared_size(op, size)
        return cls(ctx, mode, align, size, scale, recompute, size_pos, op.where, slots.get("input", 0))

    def _plan(self, in_sizes: tuple[int, ...], out_sizes: tuple[int, ...], scales: tuple, dtype: Any) -> tuple:
        key = (in_sizes, out_sizes, str(dtype))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        xp, dev = self.xp, self.device
        check_elements(math.prod(out_sizes), self.where, "output's spatial size")
        axes = []
        for n_in, n_out, s in zip(in_sizes, out_sizes, scales):
            taps = axis_taps(self.mode, n_in, n_out, self.align_corners, s, double=dtype == xp.float64,
                             ndim=len(in_sizes))
            if taps is None:
                axes.append(None)
                continue
            axes.append(tuple(
                (xp.asarray(idx, dtype=xp.int64, device=dev),
                 None if w is None else xp.asarray(w, dtype=dtype, device=dev))
                for idx, w in taps))
        plan = tuple(axes)
        self._plans[key] = plan
        return plan

    def forward(self, *inputs: Any) -> Any:
        x = inputs[self.input_pos]
        nsp = x.ndim - 2
        if nsp < 1:
            raise ShapeError(f"{self.where}: interpolation needs an (N, C, spatial...) input, found shape {tuple(x.shape)}")
        need = _MODE_NDIM.get(self.mode)
        if need is not None and need != nsp:
            raise ShapeError(f"{self.where}: mode {self.mode!r} needs a {need + 2}-D input, found {x.ndim}-D")
        in_sizes = tuple(x.shape[2:])
        if self.size_pos is not None:
            out_sizes = _expand(to_int_list(inputs[self.size_pos]), nsp, "size", self.where)
            scales: tuple = (None,) * nsp
        elif self.size is not None:
            out_sizes = _expand(self.size, nsp, "size", self.where)
            scales = (None,) * nsp
        else:
            factors = _expand(self.scale, nsp, "scale_factor", self.where)
            out_sizes = tuple(int(math.floor(float(n) * f)) for n, f in zip(in_sizes, factors))
            scales = (None,) * nsp if self.recompute else factors
        return self._resize(x, in_sizes, tuple(out_sizes), scales)

    def _resize(self, x: Any, in_sizes: tuple, out_sizes: tuple, scales: tuple) -> Any:
        if any(n <= 0 for n in out_sizes) or any(n <= 0 for n in in_sizes):
            raise ShapeError(f"{self.where}: input size {in_sizes} and output size {out_sizes} must be positive")
        plan = self._plan(in_sizes, tuple(out_sizes), scales, x.dtype)
        return apply_taps(self, x, plan)


@register("aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d", "aten::_upsample_nearest_exact3d")
class AtenUpsampleNearest(Interpolate):
    """What pnnx leaves of ``F.interpolate(mode='nearest-exact')`` with
    ``recompute_scale_factor=True`` or a size read from another tensor: ``aten::_upsample_nearest_
    exact2d (input, output_size, scales_h, scales_w)`` (one scale per spatial axis, each None or
    the factor torch maps coordinates with), or ``(input, output_size, scale_factors)``."""

    @classmethod
    def from_operator(cls, op, ctx):
        nd = int(op.type[-2])
        if len(op.inputs) not in (2 + nd, 3):
            raise LayerParameterError(f"{op.where}: expected inputs (input, output_size, scales...), "
                                      f"found {len(op.inputs)}")
        layer = cls(ctx, "nearest-exact", False, None, None, False, None, op.where)
        layer.nd = nd
        return layer

    def forward(self, x: Any, size: Any, *scales: Any) -> Any:
        nd = self.nd
        if x.ndim != nd + 2:
            raise ShapeError(f"{self.where}: expected an input with {nd} spatial axes, found shape {tuple(x.shape)}")
        in_sizes = tuple(x.shape[2:])
        if len(scales) == 1 and (isinstance(scales[0], (list, tuple)) or (scales[0] is None and nd > 1)):
            scales = (None,) * nd if scales[0] is None else tuple(scales[0])  # (the .vec form)
        factors = tuple(None if f is None else float(f) for f in scales)
        if len(factors) != nd:
            raise ShapeError(f"{self.where}: {len(factors)} scale(s) for {nd} spatial axes")
        if size is not None:
            out_sizes = _expand(to_int_list(size), nd, "output_size", self.where)
        elif all(f is not None for f in factors):
            out_sizes = tuple(int(math.floor(float(n) * f)) for n, f in zip(in_sizes, factors))
        else:
            raise ShapeError(f"{self.where}: needs output_size or a scale per axis")
        return self._resize(x, in_sizes, tuple(out_sizes), factors)


def dropped_reshape(op: Any, r: int, up: bool) -> tuple[int, int, int] | None:
    """pnnx fuses ``reshape(6-D) -> permute -> reshape(4-D)`` into ``nn.PixelShuffle`` /
    ``nn.PixelUnshuffle`` without checking the input and drops the first reshape (MobileViTv2's
    patch fold: a (B, 32, 4, 64) tensor declared in, (B, 32, 16, 16) out). Where the declared
    shapes show it (batch first, the input not the shape the output implies but as many elements
    a sample), the per-sample shape that reshape gave (it lays the data out as the layer's input
    would be), for the layer to restore; else None."""
    ins = op.inputs[0].shape if op.inputs else None
    outs = op.outputs[0].shape if op.outputs else None
    if ins is None or outs is None or len(outs) != 4 or len(ins) < 2 or None in (*ins[1:], *outs[1:]):
        return None
    c, h, w = outs[1:]
    if up:
        want = (c * r * r, h // r, w // r) if not (h % r or w % r) else None
    else:
        want = (c // (r * r), h * r, w * r) if not c % (r * r) else None
    have = tuple(ins[1:])
    if want is None or have == want or math.prod(have) != math.prod(want):
        return None
    return want


@register("nn.PixelShuffle", "F.pixel_shuffle")
class PixelShuffle(Layer):
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r). An input pnnx left unreshaped (see
    :func:`dropped_reshape`) is reshaped to the shape the declared output implies first."""

    def __init__(self, ctx: BuildContext, r: int, where: str, restore: tuple | None = None):
        super().__init__(ctx)
        self.r, self.where, self.restore = r, where, restore

    @classmethod
    def from_operator(cls, op, ctx):
        key = "upscale_factor" if cls is PixelShuffle else "downscale_factor"
        r = op.param(key, int)
        if r <= 0:
            raise LayerParameterError(f"{op.where}: {key} must be positive, found {r}")
        return cls(ctx, r, op.where, dropped_reshape(op, r, cls is PixelShuffle))

    def _restored(self, x: Any) -> Any:
        if self.restore is None:
            return x
        if x.ndim < 1 or x.size != x.shape[0] * math.prod(self.restore):
            raise ShapeError(f"{self.where}: input shape {tuple(x.shape)} cannot take the shape "
                             f"(batch, {', '.join(map(str, self.restore))}) of the reshape pnnx dropped")
        return self.xp.reshape(x, (x.shape[0],) + self.restore)

    def forward(self, x: Any) -> Any:
        xp, r = self.xp, self.r
        x = self._restored(x)
        if x.ndim < 3 or x.shape[-3] % (r * r):
            raise ShapeError(f"{self.where}: input shape {tuple(x.shape)}: channels must be divisible by {r * r}")
        lead = tuple(x.shape[:-3])
        c, h, w = x.shape[-3] // (r * r), x.shape[-2], x.shape[-1]
        fast = getattr(self.backend.fast, "pixel_shuffle", None)
        y = None if fast is None else fast(x, r)
        if y is not None:
            return y
        n = len(lead)
        y = xp.reshape(x, lead + (c, r, r, h, w))
        y = xp.permute_dims(y, tuple(range(n)) + tuple(n + a for a in (0, 3, 1, 4, 2)))
        return xp.reshape(y, lead + (c, h * r, w * r))


@register("nn.PixelUnshuffle", "F.pixel_unshuffle")
class PixelUnshuffle(PixelShuffle):
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W); the reshape pnnx may drop is restored as in
    :class:`PixelShuffle`."""

    def forward(self, x: Any) -> Any:
        xp, r = self.xp, self.r
        x = self._restored(x)
        if x.ndim < 3 or x.shape[-2] % r or x.shape[-1] % r:
            raise ShapeError(f"{self.where}: input shape {tuple(x.shape)}: height and width must be divisible by {r}")
        lead = tuple(x.shape[:-3])
        c, h, w = x.shape[-3], x.shape[-2] // r, x.shape[-1] // r
        fast = getattr(self.backend.fast, "pixel_shuffle", None)
        y = None if fast is None else fast(x, r, inverse=True)
        if y is not None:
            return y
        n = len(lead)
        y = xp.reshape(x, lead + (c, h, r, w, r))
        y = xp.permute_dims(y, tuple(range(n)) + tuple(n + a for a in (0, 2, 4, 1, 3)))
        return xp.reshape(y, lead + (c * r * r, h, w))


# ---------------------------------------------------------------------------------------------
# grid sampling (spatial transformers, flow warping)


def _reflect(xp: Any, c: Any, twice_low: int, twice_high: int) -> Any:
    """torch's ``reflect_coordinates``: fold ``c`` into [twice_low/2, twice_high/2]."""
    if twice_low == twice_high:
        return xp.zeros_like(c)
    lo, span = twice_low / 2, (twice_high - twice_low) / 2
    c = xp.abs(c - lo)
    flips = xp.floor(c / span)
    extra = c - flips * span
    odd = (flips - 2 * xp.floor(flips / 2)) != 0
    return xp.where(odd, span - extra, extra) + lo


@register("F.grid_sample")
class GridSample(Layer):
    """``F.grid_sample(input, grid)``: ``grid`` (N, Ho, Wo, 2) holds (x, y) in [-1, 1]; modes
    ``bilinear``, ``nearest`` (round half to even, as torch) and ``bicubic`` (torch's cubic
    convolution, A = -0.75, over 4x4 taps each padded on its own); padding ``zeros``, ``border``
    or ``reflection``; ``align_corners`` either way. 5-D inputs (a volume, grid (N, Do, Ho, Wo, 3)
    of (x, y, z): VoxelMorph's spatial transformer) take trilinear or nearest reads. pnnx: ``F.grid_sample
    ... align_corners=False mode=bilinear padding_mode=zeros $input=0 $grid=1``."""

    def __init__(self, ctx: BuildContext, mode: str, padding: str, align: bool, pos: dict[str, int], where: str):
        super().__init__(ctx)
        self.mode, self.padding, self.align, self.pos, self.where = mode, padding, align, pos, where

    @classmethod
    def from_operator(cls, op, ctx):
        mode = op.param("mode", str, "bilinear")
        padding = op.param("padding_mode", str, "zeros")
        if mode not in ("bilinear", "nearest", "bicubic"):
            raise LayerParameterError(f"{op.where}: grid_sample mode {mode!r} is not supported (bilinear, nearest, "
                                      "bicubic)")
        if padding not in ("zeros", "border", "reflection"):
            raise LayerParameterError(f"{op.where}: padding_mode {padding!r} is not supported")
        pos = input_slots(op, ("input", "grid"))
        if set(pos) != {"input", "grid"}:
            raise LayerParameterError(f"{op.where}: needs input and grid")
        return cls(ctx, mode, padding, op.param("align_corners", bool, False) or False, pos, op.where)

    def _source(self, g: Any, size: int) -> Any:
        return self._pad(self._unnormalize(g, size), size)

    def _unnormalize(self, g: Any, size: int) -> Any:
        return (g + 1) / 2 * (size - 1) if self.align else ((g + 1) * size - 1) / 2

    def _pad(self, c: Any, size: int) -> Any:
        """A source coordinate moved inside by the padding mode (zeros: left as it is)."""
        xp = self.xp
        if self.padding == "border":
            c = xp.clip(c, 0, size - 1)
        elif self.padding == "reflection":
            c = _reflect(xp, c, 0, 2 * (size - 1)) if self.align else _reflect(xp, c, -1, 2 * size - 1)
            c = xp.clip(c, 0, size - 1)
        else:
            return c
        # a NaN coordinate (and, reflected, an infinite one) reads the first pixel, as torch's does
        return xp.where(xp.isnan(c), xp.zeros((), dtype=c.dtype, device=self.device), c)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x, grid = inputs[self.pos["input"]], inputs[self.pos["grid"]]
        if x.ndim == 5 and grid.ndim == 5 and grid.shape[-1] == 3 and grid.shape[0] == x.shape[0]:
            return self._volumetric(x, grid)
        if x.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != x.shape[0]:
            raise ShapeError(f"{self.where}: expected input (N, C, H, W) and grid (N, Ho, Wo, 2), or input "
                             f"(N, C, D, H, W) and grid (N, Do, Ho, Wo, 3); found {tuple(x.shape)} and "
                             f"{tuple(grid.shape)}")
        if 0 in tuple(x.shape[2:]):
            raise ShapeError(f"{self.where}: input {tuple(x.shape)} has an empty spatial dimension: nothing to "
                             "sample (torch raises too)")
        if self.mode == "bilinear":
            fast = getattr(self.backend.fast, "grid_sample_bilinear", None)
            y = None if fast is None else fast(x, grid, self.padding, self.align)
            if y is not None:
                return y
        n, c, h, w = x.shape
        ho, wo = grid.shape[1], grid.shape[2]
        grid = xp.astype(grid, x.dtype) if grid.dtype != x.dtype else grid
        gx, gy = xp.reshape(grid[..., 0], (n, ho * wo)), xp.reshape(grid[..., 1], (n, ho * wo))
        flat, outside = self._with_zero(xp.reshape(x, (n, c, h * w)))
        taps: list[tuple[Any, Any]] = []  # (flat index (N, L) int64, weight (N, L), 0 outside)

        def tap(yy: Any, xx: Any, weight: Any = None) -> None:
            """A read of x at integer positions (yy, xx) (float arrays (N, L)) times ``weight``."""
            taps.append(self._tap((yy, xx), (h, w), weight, outside))

        if self.mode == "nearest":
            tap(xp.round(self._source(gy, h)), xp.round(self._source(gx, w)))
        elif self.mode == "bicubic":
            # as torch: the unpadded source position, then each of the 4x4 taps padded on its own
            ux, uy = self._unnormalize(gx, w), self._unnormalize(gy, h)
            x0, y0 = xp.floor(ux), xp.floor(uy)
            wx, wy = _cubic_weights(ux - x0), _cubic_weights(uy - y0)
            for i in range(4):
                yy = self._pad(y0 + (i - 1), h)
                for j in range(4):
                    tap(yy, self._pad(x0 + (j - 1), w), wy[i] * wx[j])
        else:
            ix, iy = self._source(gx, w), self._source(gy, h)
            x0, y0 = xp.floor(ix), xp.floor(iy)
            fx, fy = ix - x0, iy - y0
            ex, ey = 1 - fx, 1 - fy
            tap(y0, x0, ey * ex)
            tap(y0, x0 + 1, ey * fx)
            tap(y0 + 1, x0, fy * ex)
            tap(y0 + 1, x0 + 1, fy * fx)
        return xp.reshape(self._gather(flat, taps), (n, c, ho, wo))

    def _with_zero(self, flat: Any) -> tuple[Any, int]:
        """The (N, C, M) flat map and the index reads outside it take: a zero appended to each
        row (index M), so an inf or NaN in the map never meets their weight 0 (torch adds nothing
        for them; the first pixel, read for them before, gave NaN wherever it was not finite).
        Where host reads are cheap and every first pixel is finite, that pixel times 0 is
        exactly 0: the map is used as it is (index 0), without the copy."""
        xp = self.xp
        if self.backend.cheap_host_reads and bool(xp.all(xp.isfinite(flat[:, :, 0]))):
            return flat, 0
        zero = xp.zeros((flat.shape[0], flat.shape[1], 1), dtype=flat.dtype, device=self.device)
        return xp.concat([flat, zero], axis=2), flat.shape[2]

    def _tap(self, coords: tuple, sizes: tuple, weight: Any, outside: int) -> tuple[Any, Any]:
        """One read at integer positions ``coords`` (float arrays (N, L), outermost axis first,
        in a map of ``sizes``): the flat (N, L) int64 index and the weight, 0 outside the map
        (where the index is ``outside``, from :meth:`_with_zero`); NaN coordinates are
        outside."""
        xp = self.xp
        ok = None
        for c, n in zip(coords, sizes):
            inside = (c >= 0) & (c <= n - 1)  # (False for NaN)
            ok = inside if ok is None else ok & inside
        pos = None
        dt = coords[0].dtype
        zero = xp.zeros((), dtype=dt, device=self.device)
        for c, n in zip(coords, sizes):
            # (integers before they are combined: float32 positions lose the last pixel's index
            # of maps over 2**24 elements, a 256**3 volume)
            ci = xp.astype(xp.where(ok, xp.clip(c, 0, n - 1), zero), xp.int64)
            pos = ci if pos is None else pos * n + ci
        idx = xp.where(ok, pos, xp.asarray(outside, dtype=xp.int64, device=self.device))
        wt = xp.astype(ok, dt)
        return idx, wt if weight is None else wt * weight  # (0 * NaN: NaN, as torch)

    def _gather(self, flat: Any, taps: list[tuple[Any, Any]]) -> Any:
        """``sum_t flat[n, :, idx_t[n]] * w_t[n]`` over the taps ((N, L) flat indices and weights)."""
        xp = self.xp
        fast = getattr(self.backend.fast, "gather_taps", None)
        y = None if fast is None else fast(flat, taps)
        if y is None:
            n, c = flat.shape[0], flat.shape[1]
            for idx, wt in taps:
                v = xp.take_along_axis(flat, xp.broadcast_to(idx[:, None, :], (n, c, idx.shape[1])), axis=2)
                v = v * wt[:, None, :]
                y = v if y is None else y + v
        return y

    def _volumetric(self, x: Any, grid: Any) -> Any:
        """The 5-D form: ``grid`` (N, Do, Ho, Wo, 3) holds (x, y, z); ``bilinear`` is trilinear
        (8 taps), ``nearest`` rounds half to even; torch has no bicubic here."""
        xp = self.xp
        if self.mode == "bicubic":
            raise ShapeError(f"{self.where}: mode bicubic needs a 4-D input (torch refuses it on 5-D too)")
        n, c, d, h, w = x.shape
        do, ho, wo = grid.shape[1], grid.shape[2], grid.shape[3]
        grid = xp.astype(grid, x.dtype) if grid.dtype != x.dtype else grid
        g = [xp.reshape(grid[..., k], (n, do * ho * wo)) for k in range(3)]  # x, y, z
        flat, outside = self._with_zero(xp.reshape(x, (n, c, d * h * w)))
        taps: list[tuple[Any, Any]] = []

        def tap(zz: Any, yy: Any, xx: Any, weight: Any = None) -> None:
            taps.append(self._tap((zz, yy, xx), (d, h, w), weight, outside))

        ix, iy, iz = self._source(g[0], w), self._source(g[1], h), self._source(g[2], d)
        if self.mode == "nearest":
            tap(xp.round(iz), xp.round(iy), xp.round(ix))
        else:
            x0, y0, z0 = xp.floor(ix), xp.floor(iy), xp.floor(iz)
            fx, fy, fz = ix - x0, iy - y0, iz - z0
            for dz, wz in ((0, 1 - fz), (1, fz)):
                for dy, wy in ((0, 1 - fy), (1, fy)):
                    for dx, wx in ((0, 1 - fx), (1, fx)):
                        tap(z0 + dz, y0 + dy, x0 + dx, wz * wy * wx)
        return xp.reshape(self._gather(flat, taps), (n, c, do, ho, wo))


@register("F.affine_grid")
class AffineGrid(Layer):
    """``F.affine_grid(theta, size)``: theta (N, 2, 3), size (N, C, H, W) -> (N, H, W, 2), the
    (x, y) of each output pixel's centre (or corner, with align_corners) mapped by theta; in 3-D
    theta (N, 3, 4), size (N, C, D, H, W) -> (N, D, H, W, 3).
    pnnx: ``F.affine_grid ... align_corners=False size=(1,3,8,8) $theta=0``; with a dynamic batch
    the size is an input, ``$theta=13 $size=14`` fed by ``pnnx.Expression [size(@0,0),1,28,28]``."""

    def __init__(self, ctx: BuildContext, size: tuple[int, ...] | None, align: bool, where: str,
                 slots: dict[str, int] | None = None):
        super().__init__(ctx)
        self.size, self.align, self.where = size, align, where
        self.slots = slots or {"theta": 0}

    @staticmethod
    def _check_size(size: tuple[int, ...], where: str, err: type[Exception]) -> tuple[int, ...]:
        if len(size) not in (4, 5) or min(size) < 1:
            raise err(f"{where}: size should be (N, C, H, W) or (N, C, D, H, W) with sizes >= 1; found {size}")
        return tuple(size)

    @classmethod
    def from_operator(cls, op, ctx):
        align = op.param("align_corners", bool, False) or False
        if op.has_param("size") or len(op.inputs) < 2:
            return cls(ctx, cls._check_size(op.ints("size"), op.where, LayerParameterError), align, op.where)
        slots = input_slots(op, ("theta", "size"))
        if set(slots) != {"theta", "size"}:
            slots = {"theta": 0, "size": 1}
        return cls(ctx, None, align, op.where, slots)

    def _axis(self, k: int, dtype: Any) -> Any:
        xp = self.xp
        i = xp.astype(xp.arange(k, device=self.device), dtype)
        if self.align:
            return i * (2 / (k - 1)) - 1 if k > 1 else xp.zeros_like(i)
        return (i * 2 + 1) / k - 1

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        theta = inputs[self.slots["theta"]]
        if self.size is None:
            size = self._check_size(runtime_ints(inputs[self.slots["size"]], self.where, "size"), self.where, ShapeError)
        else:
            size = self.size
        if len(size) == 5:
            return self._volumetric(theta, size)
        n, _, h, w = size
        if theta.ndim != 3 or tuple(theta.shape[1:]) != (2, 3) or theta.shape[0] != n:
            raise ShapeError(f"{self.where}: theta should be ({n}, 2, 3), found {tuple(theta.shape)}")
        xs, ys = self._axis(w, theta.dtype), self._axis(h, theta.dtype)
        base = xp.stack([xp.broadcast_to(xs[None, :], (h, w)), xp.broadcast_to(ys[:, None], (h, w)),
                         xp.ones((h, w), dtype=theta.dtype, device=self.device)], axis=-1)  # (H, W, 3)
        grid = self.matmul(xp.reshape(base, (1, h * w, 3)), xp.matrix_transpose(theta))  # (N, H*W, 2)
        return xp.reshape(grid, (n, h, w, 2))

    def _volumetric(self, theta: Any, size: tuple[int, ...]) -> Any:
        """The 3-D form: theta (N, 3, 4), size (N, C, D, H, W) -> (N, D, H, W, 3) of (x, y, z)."""
        xp = self.xp
        n, _, d, h, w = size
        if theta.ndim != 3 or tuple(theta.shape[1:]) != (3, 4) or theta.shape[0] != n:
            raise ShapeError(f"{self.where}: theta should be ({n}, 3, 4) for a 3-D grid, found {tuple(theta.shape)}")
        xs, ys, zs = self._axis(w, theta.dtype), self._axis(h, theta.dtype), self._axis(d, theta.dtype)
        shape = (d, h, w)
        base = xp.stack([xp.broadcast_to(xs[None, None, :], shape), xp.broadcast_to(ys[None, :, None], shape),
                         xp.broadcast_to(zs[:, None, None], shape),
                         xp.ones(shape, dtype=theta.dtype, device=self.device)], axis=-1)  # (D, H, W, 4)
        grid = self.matmul(xp.reshape(base, (1, d * h * w, 4)), xp.matrix_transpose(theta))  # (N, DHW, 3)
        return xp.reshape(grid, (n, d, h, w, 3))
