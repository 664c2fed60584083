"""Spectral and complex-number operators: ``torch.fft.*`` transforms, ``fftshift``,
``torch.stft`` / ``torch.istft``, and the complex helpers (``view_as_real``,
``view_as_complex``, ``real``, ``imag``, ``complex``, ``angle``, ``polar``, ``conj``).

pnnx spellings (torch 2.13 exports):

* ``torch.fft.fft(x, n, dim, norm)``: ``torch.fft.fft torch.fft.fft_0 1 1 0 1 dim=-1 n=None
  norm=None $input=0 #1=(2,8)c64``; likewise ``ifft``, ``rfft``, ``irfft``, ``hfft``, ``ihfft``;
* ``torch.fft.fft2(x, s, dim, norm)``: ``torch.fft.fft2 ... dim=(-2,-1) norm=None s=(4,6)``;
  likewise ``ifft2``, ``rfft2``, ``irfft2``, ``hfft2``, ``ihfft2`` and the ``fftn`` family
  (``dim=None`` = every axis, or the last ``len(s)`` axes when ``s`` is given; ``hfftn`` /
  ``ihfftn`` as ``irfftn`` / ``rfftn`` of the conjugate with the normalisation swapped);
* ``torch.fft.fftshift(x, dim)``: ``aten::fft_fftshift pnnx_3 2 1 x dim`` with ``dim`` from a
  constant expression (``expr=None``, ``expr=[-1]``); ``aten::fft_ifftshift`` the same;
* ``torch.view_as_real`` / ``torch.view_as_complex`` / ``torch.real`` / ``torch.imag``
  (``$input``), ``torch.complex`` (``$real $imag``), ``aten::angle``, ``aten::polar`` (abs, angle),
  ``aten::_conj`` (``Tensor.conj``);
* ``torch.stft torch.stft_8 2 1 0 1 2 center=True hop_length=4 n_fft=16 normalized=False
  onesided=None pad_mode=reflect return_complex=True win_length=None $input=0 $window=1``
  (``window=None`` as a parameter when there is no window; a window made inside ``forward``
  arrives folded into a ``pnnx.Attribute``; ``align_to_window=True`` is written only when given,
  with ``center=False``);
* ``torch.istft`` with the same keys plus ``length``, input complex (..., freq, frames).

Results follow torch: float32 (and integer or bool, which torch promotes to float32) gives
complex64, float64 gives complex128; the inverse real transforms give the real dtype; norm is
``backward`` (None), ``ortho`` or ``forward``. float16 is refused (torch's CPU FFT refuses it
too). The transforms run on the Array API ``fft`` extension (``xp.fft``); STFT frames are cut
with index arithmetic (``take``), and the inverse STFT overlaps and adds with ``ceil(n_fft /
hop)`` shifted sums (no scatter).
"""

from __future__ import annotations

import math
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .misc import input_slots, to_int, to_int_list
from .registry import register

_NORMS = ("backward", "ortho", "forward")
_PAD_MODES = ("reflect", "constant", "replicate", "circular")


# -- dtype helpers --------------------------------------------------------------------------------

def _is_complex(xp: Any, dtype: Any) -> bool:
    return xp.isdtype(dtype, "complex floating")


def _complex_of(xp: Any, dtype: Any) -> Any:
    """The complex dtype with the precision of the real floating ``dtype``."""
    return xp.complex128 if dtype == xp.float64 else xp.complex64


def _real_of(xp: Any, dtype: Any) -> Any:
    """The real dtype with the precision of the complex ``dtype`` (a real dtype stays)."""
    if dtype == xp.complex128:
        return xp.float64
    if dtype == xp.complex64:
        return xp.float32
    return dtype


def _float_input(xp: Any, x: Any, where: str) -> Any:
    """``x`` as torch's FFT sees it: integer and bool arrays become float32 (the default dtype);
    float32/float64 and complex64/complex128 stay; anything else (float16) is refused."""
    dt = x.dtype
    if dt in (xp.float32, xp.float64) or _is_complex(xp, dt):
        return x
    if dt == xp.bool or xp.isdtype(dt, "integral"):
        return xp.astype(x, xp.float32)
    raise ShapeError(f"{where}: unsupported input dtype {dt} (torch's FFT takes float32, float64, "
                     f"complex or integer input)")


def _as_complex(xp: Any, x: Any) -> Any:
    return x if _is_complex(xp, x.dtype) else xp.astype(x, _complex_of(xp, x.dtype))


def _make_complex(layer: Layer, re: Any, im: Any) -> Any:
    """``re + i*im`` for two real arrays of one dtype. numpy and cupy write the two parts into
    a new array; the generic path computes ``re + im * 1j``, exact for finite parts (an infinite
    ``im`` makes its real part NaN there, where torch keeps ``re``)."""
    xp = layer.xp
    cdt = _complex_of(xp, re.dtype)
    re, im = xp.broadcast_arrays(re, im)
    if layer.backend.library in ("numpy", "cupy"):
        out = xp.empty(re.shape, dtype=cdt, device=layer.device)
        out.real[...] = re
        out.imag[...] = im
        return out
    return xp.astype(re, cdt) + xp.astype(im, cdt) * 1j


def _norm(op: Any) -> str:
    norm = op.param("norm", str, default=None)
    if norm is None:
        return "backward"
    if norm not in _NORMS:
        raise LayerParameterError(f"{op.where}: norm={norm!r} is not one of None, {', '.join(_NORMS)}")
    return norm


def _check_points(n: int, where: str) -> None:
    if n < 1:
        raise ShapeError(f"{where}: invalid number of data points ({n}) specified")


def _axis(dim: int, ndim: int, where: str) -> int:
    if not -ndim <= dim < ndim or ndim == 0:
        raise ShapeError(f"{where}: dim {dim} is out of range for an input with {ndim} dimensions")
    return dim % ndim


# -- one-dimensional transforms -------------------------------------------------------------------

#: pnnx type -> (xp.fft function, kind): "c2c" complex in and out, "r2c" real in (complex refused),
#: "c2r" complex in (a real input is taken as complex), real out
_FFT1 = {
    "torch.fft.fft": ("fft", "c2c"), "torch.fft.ifft": ("ifft", "c2c"),
    "torch.fft.rfft": ("rfft", "r2c"), "torch.fft.irfft": ("irfft", "c2r"),
    "torch.fft.hfft": ("hfft", "c2r"), "torch.fft.ihfft": ("ihfft", "r2c"),
}
_FFTN = {
    "torch.fft.fft2": ("fftn", "c2c", 2), "torch.fft.ifft2": ("ifftn", "c2c", 2),
    "torch.fft.rfft2": ("rfftn", "r2c", 2), "torch.fft.irfft2": ("irfftn", "c2r", 2),
    "torch.fft.fftn": ("fftn", "c2c", 0), "torch.fft.ifftn": ("ifftn", "c2c", 0),
    "torch.fft.rfftn": ("rfftn", "r2c", 0), "torch.fft.irfftn": ("irfftn", "c2r", 0),
    "torch.fft.hfft2": ("hfftn", "c2r", 2), "torch.fft.ihfft2": ("ihfftn", "r2c", 2),
    "torch.fft.hfftn": ("hfftn", "c2r", 0), "torch.fft.ihfftn": ("ihfftn", "r2c", 0),
}
#: a norm and its opposite: hfftn(x) is irfftn(conj(x)) and ihfftn(x) conj(rfftn(x)), each with
#: the normalisation on the other side
_SWAPPED_NORM = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _prepare(xp: Any, x: Any, kind: str, name: str, where: str) -> tuple[Any, Any]:
    """The input (already through :func:`_float_input`) converted for ``kind``, and the dtype of
    the result."""
    if kind == "r2c":
        if _is_complex(xp, x.dtype):
            raise ShapeError(f"{where}: {name} expects a real input, got {x.dtype}")
        return x, _complex_of(xp, x.dtype)
    x = _as_complex(xp, x)
    return x, (x.dtype if kind == "c2c" else _real_of(xp, x.dtype))


def _real_forward(xp: Any, x: Any, sizes: tuple, axes: tuple, norm: str) -> Any | None:
    """``fftn`` of a real float ``x`` (sizes ``sizes`` over ``axes``) from its ``rfftn``: a real
    signal's spectrum is Hermitian, X[-k] = conj(X[k]) (indices mod each size), so the half the
    real transform leaves out along the last axis is the conjugate of the first half mirrored over
    every axis. None for a complex input. NumPy, 2 Zen 3 cores: (8, 16000) over the last axis 5.5
    -> 0.9 ms, (4, 64, 64, 32) over three 34.8 -> 8.3, FNet's (4, 128, 96) over two 0.50 ->
    0.35 (the complex transform also reads a complex copy of the input)."""
    if _is_complex(xp, x.dtype):
        return None
    r = xp.fft.rfftn(x, s=tuple(sizes), axes=tuple(axes), norm=norm)
    last = axes[-1]
    k = sizes[-1] - r.shape[last]  # the missing indices n//2 + 1 .. n - 1 mirror 1 .. k
    if k <= 0:
        return r
    take = [slice(None)] * r.ndim
    take[last] = slice(1, k + 1)
    t = xp.flip(r[tuple(take)], axis=last)
    for a in axes[:-1]:  # index j -> (-j) mod n: 0 stays, the rest reversed
        t = xp.roll(xp.flip(t, axis=a), 1, axis=a)
    return xp.concat([r, xp.conj(t)], axis=last)


def _cast(xp: Any, y: Any, dtype: Any) -> Any:
    return y if y.dtype == dtype else xp.astype(y, dtype)


@register(*_FFT1)
class FFT(Layer):
    """The one-dimensional discrete Fourier transform of ``torch.fft.fft`` / ``ifft`` / ``rfft`` /
    ``irfft`` / ``hfft`` / ``ihfft`` along ``dim``, cropped or zero-padded to ``n`` points."""

    def __init__(self, ctx: BuildContext, fn: str, kind: str, n: int | None, dim: int, norm: str, where: str):
        super().__init__(ctx)
        self.fn, self.kind, self.n, self.dim, self.norm, self.where = fn, kind, n, dim, norm, where

    @classmethod
    def from_operator(cls, op, ctx):
        fn, kind = _FFT1[op.type]
        slots = _operand_slots(op, "n")
        n = None if "n" in slots else op.param("n", int, default=None)
        if n is not None and n < 1:
            raise LayerParameterError(f"{op.where}: invalid number of data points n={n}")
        layer = cls(ctx, fn, kind, n, op.param("dim", int, default=-1), _norm(op), op.where)
        layer.slots = slots
        return layer

    slots: dict[str, int] = {"input": 0}

    def forward(self, *args: Any) -> Any:
        xp = self.xp
        x = args[self.slots["input"]]
        axis = _axis(self.dim, x.ndim, self.where)
        x = _float_input(xp, x, self.where)
        m = x.shape[axis]
        n = self.n if "n" not in self.slots else to_int(args[self.slots["n"]], f"{self.where}: n")
        if n is None:
            n = 2 * (m - 1) if self.kind == "c2r" else m
        _check_points(n, self.where)
        if self.fn == "fft":
            y = _real_forward(xp, x, (n,), (axis,), self.norm)
            if y is not None:
                return y
        x, out_dtype = _prepare(xp, x, self.kind, self.fn, self.where)
        y = getattr(xp.fft, self.fn)(x, n=n, axis=axis, norm=self.norm)
        return _cast(xp, y, out_dtype)


@register(*_FFTN)
class FFTN(Layer):
    """The n-dimensional discrete Fourier transform of ``torch.fft.fft2`` / ``fftn`` and their
    inverse and real forms, over the axes ``dim`` with signal sizes ``s``."""

    def __init__(self, ctx: BuildContext, fn: str, kind: str, s: tuple | None, dim: tuple | None, norm: str,
                 where: str):
        super().__init__(ctx)
        self.fn, self.kind, self.s, self.dim, self.norm, self.where = fn, kind, s, dim, norm, where

    @classmethod
    def from_operator(cls, op, ctx):
        fn, kind, rank = _FFTN[op.type]
        s = op.param("s", (int,), default=None)
        dim = op.param("dim", (int,), default=None)
        if rank and dim is None:
            dim = (-2, -1)
        if s is not None and dim is not None and len(s) != len(dim):
            raise LayerParameterError(f"{op.where}: s={s} and dim={dim} must have the same length")
        if s is not None and any(v < 1 and v != -1 for v in s):
            raise LayerParameterError(f"{op.where}: invalid number of data points s={s}")
        if dim is not None and not dim:
            raise LayerParameterError(f"{op.where}: dim=() (no axes) is not supported")
        slots = _operand_slots(op, "s")
        layer = cls(ctx, fn, kind, s, dim, _norm(op), op.where)
        layer.slots = slots
        return layer

    slots: dict[str, int] = {"input": 0}

    def forward(self, *args: Any) -> Any:
        x = args[self.slots["input"]]
        if "s" in self.slots:  # sizes computed from the input's (pnnx: ``$s`` from an expression)
            s = to_int_list(args[self.slots["s"]], f"{self.where}: s")
            if self.dim is not None and len(s) != len(self.dim):
                raise ShapeError(f"{self.where}: s={s} and dim={self.dim} must have the same length")
            if any(v < 1 and v != -1 for v in s):
                raise ShapeError(f"{self.where}: invalid number of data points s={s}")
            return self._transform(x, s)
        return self._transform(x, self.s)

    def _transform(self, x: Any, sizes: tuple | None) -> Any:
        xp = self.xp
        nd = x.ndim
        if self.dim is not None:
            axes = [_axis(d, nd, self.where) for d in self.dim]
        elif sizes is not None:
            if len(sizes) > nd:
                raise ShapeError(f"{self.where}: s={sizes} has more sizes than the input has dimensions ({nd})")
            axes = list(range(nd - len(sizes), nd))
        else:
            axes = list(range(nd))
        if len(set(axes)) != len(axes):
            raise ShapeError(f"{self.where}: FFT dims must be unique, got {self.dim}")
        if not axes:
            raise ShapeError(f"{self.where}: a 0-d input has no axis to transform")
        x = _float_input(xp, x, self.where)
        s = list(sizes) if sizes is not None else [-1] * len(axes)
        for i, a in enumerate(axes):
            if s[i] == -1:
                last_c2r = self.kind == "c2r" and i == len(axes) - 1
                s[i] = 2 * (x.shape[a] - 1) if last_c2r else x.shape[a]
            _check_points(s[i], self.where)
        if self.fn == "fftn":
            y = _real_forward(xp, x, tuple(s), tuple(axes), self.norm)
            if y is not None:
                return y
        x, out_dtype = _prepare(xp, x, self.kind, self.fn, self.where)
        if self.fn == "hfftn":
            y = xp.fft.irfftn(xp.conj(x), s=tuple(s), axes=tuple(axes), norm=_SWAPPED_NORM[self.norm])
        elif self.fn == "ihfftn":
            y = xp.conj(xp.fft.rfftn(x, s=tuple(s), axes=tuple(axes), norm=_SWAPPED_NORM[self.norm]))
        else:
            y = getattr(xp.fft, self.fn)(x, s=tuple(s), axes=tuple(axes), norm=self.norm)
        return _cast(xp, y, out_dtype)


def _operand_slots(op: Any, size: str) -> dict[str, int]:
    """Operand positions of the input and of ``size`` (``n`` or ``s``), when pnnx passes the
    size as an operand: computed from the input's shape (``n=x.shape[-1]``, ``s=(H, W)``)."""
    slots = input_slots(op, ("input", size))
    if "input" not in slots:
        raise LayerParameterError(f"{op.where}: needs an input tensor")
    return slots


@register("aten::fft_fftshift", "aten::fft_ifftshift")
class FFTShift(Layer):
    """``torch.fft.fftshift`` / ``ifftshift``: rolls each axis of ``dim`` (all axes for None) by
    half its length, moving the zero frequency to the centre (or back); inputs (x, dim)."""

    def __init__(self, ctx: BuildContext, inverse: bool, where: str):
        super().__init__(ctx)
        self.inverse, self.where = inverse, where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) not in (1, 2):
            raise LayerParameterError(f"{op.where}: expected inputs (x, dim), found {len(op.inputs)}")
        return cls(ctx, op.type == "aten::fft_ifftshift", op.where)

    def forward(self, x: Any, dim: Any = None) -> Any:
        nd = x.ndim
        axes = list(range(nd)) if dim is None else [_axis(d, nd, self.where) for d in to_int_list(dim, "dim")]
        if not axes:
            return x
        shifts = [(-(x.shape[a] // 2) if self.inverse else x.shape[a] // 2) for a in axes]
        return self.xp.roll(x, shift=tuple(shifts), axis=tuple(axes))


# -- complex helpers ------------------------------------------------------------------------------

class _Unary(Layer):
    """A one-input layer; ``where`` names the operator in errors."""

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 1:
            raise LayerParameterError(f"{op.where}: expected one input, found {len(op.inputs)}")
        return cls(ctx, op.where)

    def _need_complex(self, x: Any) -> None:
        if not _is_complex(self.xp, x.dtype):
            raise ShapeError(f"{self.where}: expects a complex input, got {x.dtype}")


@register("torch.view_as_real")
class ViewAsReal(_Unary):
    """A complex array as real numbers: a new trailing axis of 2 holds (real, imaginary)."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        self._need_complex(x)
        return xp.stack([xp.real(x), xp.imag(x)], axis=-1)


@register("torch.view_as_complex")
class ViewAsComplex(_Unary):
    """A real array whose last axis has size 2 (real, imaginary) as a complex array without it."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if x.dtype not in (xp.float32, xp.float64):
            raise ShapeError(f"{self.where}: expects a float32 or float64 input, got {x.dtype}")
        if x.ndim == 0 or x.shape[-1] != 2:
            raise ShapeError(f"{self.where}: the last dimension must have size 2, got shape {tuple(x.shape)}")
        return _make_complex(self, x[..., 0], x[..., 1])


@register("torch.real")
class Real(_Unary):
    """The real part of a complex array (a real array is returned as it is)."""

    def forward(self, x: Any) -> Any:
        return self.xp.real(x) if _is_complex(self.xp, x.dtype) else x


@register("torch.imag")
class Imag(_Unary):
    """The imaginary part of a complex array (a real input is refused, as torch does)."""

    def forward(self, x: Any) -> Any:
        self._need_complex(x)
        return self.xp.imag(x)


@register("aten::_conj", "aten::conj", "aten::conj_physical")
class Conj(_Unary):
    """The complex conjugate (a real input is returned as it is)."""

    def forward(self, x: Any) -> Any:
        return self.xp.conj(x) if _is_complex(self.xp, x.dtype) else x


@register("aten::resolve_conj", "aten::resolve_neg")
class ResolveConj(_Unary):
    """The input itself: torch materialises a lazy conjugation (or negation) here, which this
    runtime has already applied."""

    def forward(self, x: Any) -> Any:
        return x


@register("aten::angle")
class Angle(_Unary):
    """The argument of each complex value, ``atan2(imag, real)``; for real input 0 or pi (for
    negative values), NaN staying NaN, integers giving float32."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if _is_complex(xp, x.dtype):
            return xp.atan2(xp.imag(x), xp.real(x))
        x = _float_input(xp, x, self.where)
        zero = xp.zeros_like(x)
        out = xp.where(x < 0, xp.full_like(x, math.pi), zero)
        return xp.where(xp.isnan(x), x, out)


def _real_pair(layer: Layer, a: Any, b: Any, what: str) -> tuple[Any, Any]:
    xp = layer.xp
    if a.dtype != b.dtype or a.dtype not in (xp.float32, xp.float64):
        raise ShapeError(f"{layer.where}: {what} must be two float32 or two float64 arrays, got {a.dtype} "
                         f"and {b.dtype}")
    try:
        return tuple(xp.broadcast_arrays(a, b))
    except ValueError:
        raise ShapeError(f"{layer.where}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast") from None


@register("torch.complex")
class Complex(Layer):
    """``real + i * imag`` from two real arrays of one dtype (broadcast together)."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int], where: str):
        super().__init__(ctx)
        self.pos, self.where = pos, where

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("real", "imag"))
        if set(pos) != {"real", "imag"}:
            raise LayerParameterError(f"{op.where}: needs real and imag inputs")
        return cls(ctx, pos, op.where)

    def forward(self, *inputs: Any) -> Any:
        re, im = _real_pair(self, inputs[self.pos["real"]], inputs[self.pos["imag"]], "real and imag")
        return _make_complex(self, re, im)


@register("aten::polar")
class Polar(Layer):
    """``abs * (cos(angle) + i * sin(angle))`` from two real arrays of one dtype."""

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 2:
            raise LayerParameterError(f"{op.where}: expected inputs (abs, angle), found {len(op.inputs)}")
        return cls(ctx, op.where)

    def forward(self, r: Any, theta: Any) -> Any:
        xp = self.xp
        r, theta = _real_pair(self, r, theta, "abs and angle")
        return _make_complex(self, r * xp.cos(theta), r * xp.sin(theta))


# -- short-time Fourier transform -----------------------------------------------------------------

def _stft_common(op: Any) -> dict[str, Any]:
    """n_fft, hop_length, win_length, center, normalized, onesided, return_complex, checked."""
    n_fft = op.param("n_fft", int)
    if n_fft < 1:
        raise LayerParameterError(f"{op.where}: n_fft={n_fft} must be positive")
    hop = op.param("hop_length", int, default=None)
    hop = n_fft // 4 if hop is None else hop
    if hop < 1:
        raise LayerParameterError(f"{op.where}: expected hop_length > 0, got hop_length={hop}")
    win = op.param("win_length", int, default=None)
    win = n_fft if win is None else win
    if not 0 < win <= n_fft:
        raise LayerParameterError(f"{op.where}: expected 0 < win_length <= n_fft, got win_length={win} "
                                  f"(n_fft={n_fft})")
    return {
        "n_fft": n_fft, "hop": hop, "win": win,
        "center": op.param("center", bool, default=True),
        "normalized": op.param("normalized", bool, default=False),
        "onesided": op.param("onesided", bool, default=None),
    }


class _STFTBase(Layer):
    """What stft and istft share: the checked parameters (``cfg``), the input slots and the
    window."""

    def __init__(self, ctx: BuildContext, cfg: dict[str, Any], pos: dict[str, int], where: str):
        super().__init__(ctx)
        self.cfg, self.pos, self.where = cfg, pos, where

    @classmethod
    def _inputs(cls, op: Any) -> dict[str, int]:
        pos = input_slots(op, ("input", "window"))
        if "input" not in pos:
            raise LayerParameterError(f"{op.where}: needs an input")
        if "window" not in pos and op.params.get("window") is not None:
            raise LayerParameterError(f"{op.where}: window={op.params['window']!r} should be an input or None")
        return pos

    def _window(self, inputs: tuple, dtype: Any, cfg: dict | None = None, pos: dict | None = None) -> Any:
        """The window padded to n_fft (centred, as torch does when win_length < n_fft); a
        rectangular window of win_length when there is none."""
        xp, c, pos = self.xp, cfg or self.cfg, pos or self.pos
        n_fft, win = c["n_fft"], c["win"]
        if "window" in pos:
            w = inputs[pos["window"]]
            if w.ndim != 1 or w.shape[0] != win:
                raise ShapeError(f"{self.where}: expected a 1-D window of win_length={win} values, got shape "
                                 f"{tuple(w.shape)}")
            if not (w.dtype in (xp.float32, xp.float64) or _is_complex(xp, w.dtype)):
                w = xp.astype(w, xp.float32)
        else:
            w = xp.ones((win,), dtype=dtype, device=self.device)
        left = (n_fft - win) // 2
        if win < n_fft:
            zl = xp.zeros((left,), dtype=w.dtype, device=self.device)
            zr = xp.zeros((n_fft - win - left,), dtype=w.dtype, device=self.device)
            w = xp.concat([zl, w, zr])
        return w


def _pad_last(xp: Any, x: Any, pad: int, mode: str, device: Any, where: str) -> Any:
    """torch.nn.functional.pad of the last axis by ``pad`` on both sides."""
    n = x.shape[-1]
    if mode == "reflect":
        if pad >= n:
            raise ShapeError(f"{where}: reflect padding {pad} must be less than the signal length {n}")
        left, right = xp.flip(x[..., 1:pad + 1], axis=-1), xp.flip(x[..., n - pad - 1:n - 1], axis=-1)
    elif mode == "replicate":
        shape = tuple(x.shape[:-1]) + (pad,)
        left, right = xp.broadcast_to(x[..., :1], shape), xp.broadcast_to(x[..., n - 1:], shape)
    elif mode == "circular":
        if pad > n:
            raise ShapeError(f"{where}: circular padding {pad} wraps around a signal of length {n} more than once")
        left, right = x[..., n - pad:], x[..., :pad]
    else:
        z = xp.zeros(tuple(x.shape[:-1]) + (pad,), dtype=x.dtype, device=device)
        left = right = z
    return xp.concat([left, x, right], axis=-1)


@register("torch.stft")
class STFT(_STFTBase):
    """The short-time Fourier transform of a (batch, time) or (time,) signal: windowed frames of
    n_fft samples every hop_length, transformed to (batch, freq, frames), complex (or with a
    trailing (real, imaginary) axis for return_complex=False)."""

    @classmethod
    def from_operator(cls, op, ctx):
        cfg = _stft_common(op)
        pad_mode = op.param("pad_mode", str, default="reflect")
        if pad_mode not in _PAD_MODES:
            raise LayerParameterError(f"{op.where}: pad_mode={pad_mode!r} is not one of {', '.join(_PAD_MODES)}")
        cfg["pad_mode"] = pad_mode
        # (center=False only: frames start where the window's nonzero part starts, torch >= 2.7)
        cfg["align"] = bool(op.param("align_to_window", bool, default=False)) and not cfg["center"]
        rc = op.param("return_complex", bool, default=True)
        cfg["return_complex"] = True if rc is None else rc
        return cls(ctx, cfg, cls._inputs(op), op.where)

    def forward(self, *inputs: Any) -> Any:
        xp, c = self.xp, self.cfg
        x = inputs[self.pos["input"]]
        if x.ndim not in (1, 2):
            raise ShapeError(f"{self.where}: expected a 1-D or 2-D input, got shape {tuple(x.shape)}")
        if not (x.dtype in (xp.float32, xp.float64) or _is_complex(xp, x.dtype)):
            raise ShapeError(f"{self.where}: expected a floating point or complex input, got {x.dtype}")
        unbatched = x.ndim == 1
        if unbatched:
            x = xp.expand_dims(x, axis=0)
        n_fft, hop = c["n_fft"], c["hop"]
        w = self._window(inputs, _real_of(xp, x.dtype))
        if c["center"]:
            x = _pad_last(xp, x, n_fft // 2, c["pad_mode"], self.device, self.where)
        elif c["align"] and c["win"] < n_fft:
            # the window sits at (n_fft - win) // 2 in each frame: shift the signal by as much
            # (the zeros land where the padded window is zero)
            left = (n_fft - c["win"]) // 2
            if x.shape[-1] < n_fft:  # (torch checks the signal before the shift)
                raise ShapeError(f"{self.where}: expected 0 < n_fft <= {x.shape[-1]} (the signal length), got "
                                 f"n_fft={n_fft}")
            z = xp.zeros(tuple(x.shape[:-1]), dtype=x.dtype, device=self.device)[..., None]
            x = xp.concat([xp.broadcast_to(z, (x.shape[0], left)), x,
                           xp.broadcast_to(z, (x.shape[0], n_fft - c["win"] - left))], axis=-1)
        length = x.shape[-1]
        if not 0 < n_fft <= length:
            raise ShapeError(f"{self.where}: expected 0 < n_fft <= {length} (the padded signal length), got "
                             f"n_fft={n_fft}")
        frames = 1 + (length - n_fft) // hop
        idx = (xp.arange(frames, dtype=xp.int64, device=self.device)[:, None] * hop
               + xp.arange(n_fft, dtype=xp.int64, device=self.device)[None, :])
        f = xp.take(x, xp.reshape(idx, (-1,)), axis=-1)
        f = xp.reshape(f, (x.shape[0], frames, n_fft)) * w
        complex_in = _is_complex(xp, f.dtype)
        onesided = c["onesided"]
        if onesided is None:
            onesided = not complex_in
        elif onesided and complex_in:
            raise ShapeError(f"{self.where}: cannot have onesided output if window or input is complex")
        norm = "ortho" if c["normalized"] else "backward"
        if onesided:
            y = _cast(xp, xp.fft.rfft(f, axis=-1, norm=norm), _complex_of(xp, f.dtype))
        else:
            y = _cast(xp, xp.fft.fft(_as_complex(xp, f), axis=-1, norm=norm), _complex_of(xp, _real_of(xp, f.dtype)))
        y = xp.permute_dims(y, (0, 2, 1))
        if unbatched:
            y = y[0, ...]
        if not c["return_complex"]:
            y = xp.stack([xp.real(y), xp.imag(y)], axis=-1)
        return y


def _overlap_add(xp: Any, frames: Any, hop: int, device: Any) -> Any:
    """Sum of (batch, T, n) frames placed every ``hop`` samples: (batch, n + hop * (T - 1))."""
    b, t, n = frames.shape
    r = -(-n // hop)
    if r * hop > n:
        frames = xp.concat([frames, xp.zeros((b, t, r * hop - n), dtype=frames.dtype, device=device)], axis=-1)
    chunks = xp.reshape(frames, (b, t, r, hop))
    out = None
    for k in range(r):
        part = chunks[:, :, k, :]
        pieces = [part]
        if k:
            pieces.insert(0, xp.zeros((b, k, hop), dtype=frames.dtype, device=device))
        if r - 1 - k:
            pieces.append(xp.zeros((b, r - 1 - k, hop), dtype=frames.dtype, device=device))
        part = xp.concat(pieces, axis=1) if len(pieces) > 1 else part
        out = part if out is None else out + part
    out = xp.reshape(out, (b, (t + r - 1) * hop))
    return out[:, :n + hop * (t - 1)]


@register("torch.istft")
class ISTFT(_STFTBase):
    """The inverse short-time Fourier transform: complex (batch, freq, frames) or (freq, frames)
    spectra back to (batch, time) signals by windowed overlap-add, divided by the summed squared
    window; ``length`` trims or zero-pads the result."""

    @classmethod
    def from_operator(cls, op, ctx):
        cfg = _stft_common(op)
        cfg["length"] = op.param("length", int, default=None)
        if cfg["length"] is not None and cfg["length"] < 0:
            raise LayerParameterError(f"{op.where}: length={cfg['length']} must not be negative")
        cfg["return_complex"] = bool(op.param("return_complex", bool, default=False))
        return cls(ctx, cfg, cls._inputs(op), op.where)

    def forward(self, *inputs: Any) -> Any:
        return self._istft(inputs, self.cfg, self.pos)

    def _istft(self, inputs: tuple, c: dict, pos: dict) -> Any:
        xp = self.xp
        x = inputs[pos["input"]]
        if not _is_complex(xp, x.dtype):
            raise ShapeError(f"{self.where}: istft requires a complex-valued input (the output of stft with "
                             f"return_complex=True), got {x.dtype}")
        if x.ndim not in (2, 3):
            raise ShapeError(f"{self.where}: expected a 2-D or 3-D input, got shape {tuple(x.shape)}")
        unbatched = x.ndim == 2
        if unbatched:
            x = xp.expand_dims(x, axis=0)
        n_fft, hop = c["n_fft"], c["hop"]
        nfreq, nframes = x.shape[1], x.shape[2]
        rdt = _real_of(xp, x.dtype)
        w = self._window(inputs, rdt, c, pos)
        cw = _is_complex(xp, w.dtype)
        onesided = c["onesided"]
        if onesided is None:
            onesided = nfreq != n_fft
        want = n_fft // 2 + 1 if onesided else n_fft
        if nfreq != want:
            kind = "onesided" if onesided else "two-sided"
            raise ShapeError(f"{self.where}: expected the frequency dimension (-2) of the input to be {want} for "
                             f"a {kind} transform of n_fft={n_fft}, got {nfreq}")
        if nframes < 1:
            raise ShapeError(f"{self.where}: the input has no frames")
        norm = "ortho" if c["normalized"] else "backward"
        spec = xp.permute_dims(x, (0, 2, 1))
        if c["return_complex"]:
            if onesided:
                raise ShapeError(f"{self.where}: cannot have onesided output if window or input is complex")
            y = _cast(xp, xp.fft.ifft(spec, axis=-1, norm=norm), x.dtype)
        else:
            if cw:
                raise ShapeError(f"{self.where}: complex windows are incompatible with return_complex=False")
            if not onesided:
                spec = spec[..., :n_fft // 2 + 1]
            y = _cast(xp, xp.fft.irfft(spec, n=n_fft, axis=-1, norm=norm), rdt)
        y = _overlap_add(xp, y * w, hop, self.device)
        wsq = w * xp.conj(w) if cw else w * w
        env = _overlap_add(xp, xp.reshape(wsq, (1, 1, n_fft)) * xp.ones((1, nframes, 1), dtype=wsq.dtype,
                                                                      device=self.device), hop, self.device)
        expected = n_fft + hop * (nframes - 1)
        start = n_fft // 2 if c["center"] else 0
        if c["length"] is not None:
            end = start + c["length"]
        else:
            end = expected - n_fft // 2 if c["center"] else expected
        end_c = min(end, expected)
        y, env = y[:, start:end_c], env[:, start:end_c]
        if env.shape[1] and float(xp.min(xp.abs(env))) < 1e-11:
            raise ShapeError(f"{self.where}: window overlap add min: {float(xp.min(xp.abs(env)))} (the window "
                             f"and hop_length do not satisfy the NOLA condition)")
        y = y / env
        if end > expected:
            y = xp.concat([y, xp.zeros((y.shape[0], end - expected), dtype=y.dtype, device=self.device)], axis=1)
        if unbatched:
            y = y[0, ...]
        return y


@register("aten::istft")
class AtenISTFT(ISTFT):
    """``torch.istft`` as pnnx leaves it when ``length`` follows an input's size: ``aten::istft
    (self, n_fft, hop_length, win_length, window, center, normalized, onesided, length,
    return_complex)``, every argument an operand (constants or computed sizes)."""

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != 10:
            raise LayerParameterError(f"{op.where}: expected 10 inputs (self, n_fft, hop_length, win_length, "
                                      f"window, center, normalized, onesided, length, return_complex), found "
                                      f"{len(op.inputs)}")
        return cls(ctx, {}, {"input": 0, "window": 4}, op.where)

    def forward(self, x: Any, n_fft: Any, hop: Any, win: Any, window: Any, center: Any, normalized: Any,
                onesided: Any, length: Any, return_complex: Any) -> Any:
        who = self.where
        n_fft = to_int(n_fft, f"{who}: n_fft")
        hop = n_fft // 4 if hop is None else to_int(hop, f"{who}: hop_length")
        win = n_fft if win is None else to_int(win, f"{who}: win_length")
        length = None if length is None else to_int(length, f"{who}: length")
        if n_fft < 1 or hop < 1 or not 0 < win <= n_fft or (length is not None and length < 0):
            raise ShapeError(f"{who}: invalid istft arguments n_fft={n_fft}, hop_length={hop}, "
                             f"win_length={win}, length={length}")
        cfg = {"n_fft": n_fft, "hop": hop, "win": win, "length": length,
               "center": True if center is None else bool(center), "normalized": bool(normalized),
               "onesided": None if onesided is None else bool(onesided), "return_complex": bool(return_complex)}
        pos = {"input": 0} if window is None else {"input": 0, "window": 4}
        return self._istft((x, n_fft, hop, win, window), cfg, pos)
