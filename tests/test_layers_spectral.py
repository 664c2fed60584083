"""Spectral and complex-number operators (kuiper_xp/layers/spectral.py): torch.fft transforms,
fftshift, stft/istft, view_as_real/complex, real/imag, complex, angle, polar, conj, and the
expression layer on complex values; pnnx exports of small torch modules run on every backend
leg and compared with torch (complex results part by part), whole models (a log-mel front end
with a conv net, an FNet block, a GFNet global filter), and the errors bad parameters and
inputs get."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import assert_close
from helpers import case_exporter
from test_layers_misc import make_layer, t2n
from torch import nn

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError

# torch warns about stft without a window, return_complex=False and istft's zero padding
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Fn(nn.Module):
    """A module around a function of its inputs (and optional submodules and buffers)."""

    def __init__(self, fn, *mods, **buffers):
        super().__init__()
        self.fn, self.m = fn, nn.ModuleList(mods)
        for k, v in buffers.items():
            self.register_buffer(k, v)

    def forward(self, *a):
        return self.fn(self, *a)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_g(seed), dtype=dtype)


fft = torch.fft
vr = torch.view_as_real
HANN = torch.hann_window(16)


def _mel_fb(n_freq=33, n_mels=8, sr=8000):
    """A triangular mel filterbank (freq, mels), as torchaudio's melscale_fbanks builds it."""
    def mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)
    pts = torch.linspace(mel(0.0), mel(sr / 2), n_mels + 2)
    hz = 700.0 * (10 ** (pts / 2595.0) - 1.0)
    f = torch.linspace(0, sr / 2, n_freq)[:, None]
    lo, c, hi = hz[:-2], hz[1:-1], hz[2:]
    return torch.clamp(torch.minimum((f - lo) / (c - lo), (hi - f) / (hi - c)), min=0.0)


class LogMel(nn.Module):
    """stft -> |.|^2 -> mel filterbank -> clamp -> log, then a small conv net."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(64))
        self.register_buffer("fb", _mel_fb())
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                 nn.Conv2d(4, 4, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x):
        s = torch.stft(x, 64, hop_length=16, window=self.window, return_complex=True)
        p = s.abs().pow(2)                                   # (B, 33, T)
        mel = torch.matmul(p.transpose(1, 2), self.fb)      # (B, T, 8): pnnx makes it an nn.Linear
        logmel = torch.log(torch.clamp(mel, min=1e-6))
        return self.net(logmel.unsqueeze(1))


class FNetBlock(nn.Module):
    """FNet: the real part of a 2-D FFT over (tokens, hidden) as the mixing layer."""

    def __init__(self, d=16):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))

    def forward(self, x):
        x = self.n1(x + fft.fft2(x, dim=(-2, -1)).real)
        return self.n2(x + self.ff(x))


class GlobalFilter(nn.Module):
    """GFNet: rfft2 over the spatial axes, times a learned complex filter, irfft2 back."""

    def __init__(self, h=6, w=8, c=4):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(h, w // 2 + 1, c, 2, generator=_g(3)) * 0.02)
        self.h, self.w = h, w

    def forward(self, x):  # (B, H, W, C)
        y = fft.rfft2(x, dim=(1, 2), norm="ortho")
        y = y * torch.view_as_complex(self.weight)
        return fft.irfft2(y, s=(self.h, self.w), dim=(1, 2), norm="ortho") + x


# name -> (module, inputs, types the export must contain[, inputs2 for a dynamic batch])
CASES = {
    # one-dimensional transforms
    "fft_abs": (Fn(lambda s, x: fft.fft(x).abs()), (_r(2, 8),), {"torch.fft.fft"}),
    "fft_n_ortho": (Fn(lambda s, x: vr(fft.fft(x, n=10, dim=0, norm="ortho"))), (_r(6, 3),), {"torch.fft.fft"}),
    "fft_crop_complex_out": (Fn(lambda s, x: fft.fft(x, n=5)), (_r(3, 8),), {"torch.fft.fft"}),
    "ifft_forward": (Fn(lambda s, x: fft.ifft(fft.fft(x), norm="forward").real), (_r(2, 8),),
                     {"torch.fft.ifft", "torch.real"}),
    "rfft_irfft": (Fn(lambda s, x: (fft.rfft(x), fft.irfft(fft.rfft(x)), fft.irfft(fft.rfft(x), n=7, norm="ortho"))),
                   (_r(2, 9),), {"torch.fft.rfft", "torch.fft.irfft"}),
    "rfft_dim0_pad": (Fn(lambda s, x: vr(fft.rfft(x, n=12, dim=0, norm="forward"))), (_r(7, 3),), {"torch.fft.rfft"}),
    "hfft_ihfft": (Fn(lambda s, x: (fft.hfft(fft.ihfft(x)), fft.hfft(fft.ihfft(x, norm="ortho"), n=9, norm="ortho"))),
                   (_r(2, 8),), {"torch.fft.hfft", "torch.fft.ihfft"}),
    "fft_int_input": (Fn(lambda s, x: fft.fft(x).abs()), (torch.tensor([[3, -1, 4, 1, -5, 9]]),), {"torch.fft.fft"}),
    "rfft_f64": (Fn(lambda s, x: (fft.rfft(x), fft.rfft(x).abs())), (_r(2, 8, dtype=torch.float64),),
                 {"torch.fft.rfft"}),
    "fft_complex_input": (Fn(lambda s, x: fft.fft(torch.view_as_complex(x), dim=0).abs()), (_r(4, 3, 2),),
                          {"torch.view_as_complex", "torch.fft.fft"}),
    # the forward transforms of a real input come from the real transform and the spectrum's
    # Hermitian symmetry: every output in full, odd and even sizes, crops and pads, 1 and 2 points
    "fft_real_full": (Fn(lambda s, x: (vr(fft.fft(x)), vr(fft.fft(x, n=6, dim=0, norm="ortho")), vr(fft.fft(x, n=1)),
                                       vr(fft.fft(x, n=2, norm="forward")))), (_r(5, 7),), {"torch.fft.fft"}),
    "fft2_real_full": (Fn(lambda s, x: (vr(fft.fft2(x)), vr(fft.fft2(x, dim=(0, 2), norm="ortho")),
                                        vr(fft.fft2(x.transpose(1, 2))))), (_r(3, 5, 6),), {"torch.fft.fft2"}),
    "fftn_real_pad_crop_f64": (Fn(lambda s, x: (vr(fft.fftn(x, s=(3, 5, 4))), vr(fft.fftn(x, dim=(2, 0, 1))))),
                               (_r(2, 4, 7, dtype=torch.float64),), {"torch.fft.fftn"}),
    # n-dimensional transforms
    "fft2_s": (Fn(lambda s, x: fft.fft2(x, s=(4, 6)).real), (_r(2, 4, 5),), {"torch.fft.fft2"}),
    "ifft2_imag": (Fn(lambda s, x: fft.ifft2(fft.fft2(x)).imag + fft.ifft2(x, norm="forward").imag), (_r(2, 4, 5),),
                   {"torch.fft.ifft2", "torch.imag"}),
    "rfft2_irfft2": (Fn(lambda s, x: (fft.rfft2(x, norm="ortho"), fft.irfft2(fft.rfft2(x, norm="ortho"), s=(4, 5),
                                                                                norm="ortho"))),
                     (_r(2, 4, 5),), {"torch.fft.rfft2", "torch.fft.irfft2"}),
    "fftn_dims": (Fn(lambda s, x: fft.ifftn(fft.fftn(x, dim=(0, 2))).real + fft.fftn(x, dim=(2, 0)).imag),
                  (_r(2, 4, 5),), {"torch.fft.fftn", "torch.fft.ifftn"}),
    "fftn_s_only": (Fn(lambda s, x: vr(fft.fftn(x, s=(3, 6)))), (_r(2, 4, 5),), {"torch.fft.fftn"}),
    "rfftn_irfftn": (Fn(lambda s, x: fft.irfftn(fft.rfftn(x)) + fft.irfftn(fft.rfftn(x, dim=(0, 1)), dim=(0, 1))),
                     (_r(2, 4, 6),), {"torch.fft.rfftn", "torch.fft.irfftn"}),
    # the Hermitian n-dimensional pair: every norm, sizes, dims, a real input to hfft2
    "hfftn_ihfftn": (Fn(lambda s, x: (vr(fft.ihfft2(x)), vr(fft.ihfftn(x, dim=(0, 2), norm="ortho")),
                                      vr(fft.ihfftn(x, s=(3, 8), norm="forward")), fft.hfft2(fft.ihfft2(x)),
                                      fft.hfftn(fft.ihfftn(x, norm="ortho"), s=(4, 5), norm="ortho"),
                                      fft.hfft2(x, norm="forward"), fft.hfftn(torch.view_as_complex(torch.stack(
                                          [x, x.flip(2)], -1)), dim=(1, 2)))),
                     (_r(2, 4, 6),), {"torch.fft.hfft2", "torch.fft.ihfft2", "torch.fft.hfftn", "torch.fft.ihfftn"}),
    "fftshift": (Fn(lambda s, x: (fft.fftshift(x, dim=-1), fft.ifftshift(x), fft.fftshift(fft.ifftshift(x, dim=(0, 2))))),
                 (_r(3, 4, 7),), {"aten::fft_fftshift", "aten::fft_ifftshift"}),
    # complex helpers and the expression layer on complex values
    "view_as_complex_mul": (Fn(lambda s, x: vr(torch.view_as_complex(x) * 2)), (_r(2, 4, 2),),
                            {"torch.view_as_complex", "torch.view_as_real"}),
    "complex_abs": (Fn(lambda s, a, b: (torch.complex(a, b).abs(), torch.complex(a, b))), (_r(3), _r(3, seed=1)),
                    {"torch.complex"}),
    "angle": (Fn(lambda s, x: (torch.angle(fft.fft(x)), torch.angle(x))),
              (torch.tensor([1.0, -2.0, 0.0, -0.0, 3.0, float("nan"), -1.5, 0.5]),), {"aten::angle"}),
    "polar": (Fn(lambda s, a, b: vr(torch.polar(a, b))), (_r(5).abs(), _r(5, seed=1) * 3), {"aten::polar"}),
    "conj": (Fn(lambda s, x: (vr(fft.fft(x).conj() * fft.fft(x)), vr(fft.fft(x).conj_physical()))), (_r(8),),
             {"aten::_conj", "aten::conj_physical"}),
    "complex_expr": (Fn(lambda s, x, y: (vr(fft.rfft(x) * y + 1), fft.rfft(x).abs().pow(2).add(1e-6).log(),
                                         vr(torch.exp(fft.fft(x)) - fft.fft(x) / 3))),
                     (_r(2, 8), _r(2, 5, seed=1)), {"pnnx.Expression"}),
    "complex_times_f64": (Fn(lambda s, x, y: vr(fft.fft(x) * y)), (_r(2, 8), _r(2, 8, seed=1, dtype=torch.float64)),
                          {"torch.fft.fft"}),
    # short-time Fourier transform
    "stft_hann": (Fn(lambda s, x, w: torch.stft(x, 16, hop_length=4, window=w, return_complex=True).abs()),
                  (_r(1, 128), HANN), {"torch.stft"}),
    "stft_no_window_pow": (Fn(lambda s, x: torch.stft(x, 16, return_complex=True).abs() ** 2), (_r(2, 100),),
                           {"torch.stft"}),
    "stft_real_out": (Fn(lambda s, x: torch.stft(x, 16, return_complex=False)), (_r(1, 64),), {"torch.stft"}),
    "stft_buffer_winlen_constant": (
        Fn(lambda s, x: torch.stft(x, 16, hop_length=5, win_length=12, window=s.w, pad_mode="constant",
                                   normalized=True, return_complex=True), w=torch.hann_window(12)),
        (_r(2, 100),), {"torch.stft"}),
    "stft_unbatched_twosided": (
        Fn(lambda s, x: torch.stft(x, 16, window=torch.hann_window(16), center=False, onesided=False,
                                   return_complex=True)), (_r(100),), {"torch.stft"}),
    "stft_align_to_window": (
        Fn(lambda s, x: torch.stft(x, 16, hop_length=5, win_length=12, window=torch.hann_window(12), center=False,
                                   align_to_window=True, return_complex=True)), (_r(2, 100),), {"torch.stft"}),
    "stft_winlen_no_window": (Fn(lambda s, x: torch.stft(x, 16, win_length=9, return_complex=True).real), (_r(100),),
                              {"torch.stft"}),
    "stft_replicate_circular": (
        Fn(lambda s, x: (torch.stft(x, 10, hop_length=3, pad_mode="replicate", return_complex=True),
                         torch.stft(x, 10, hop_length=3, pad_mode="circular", return_complex=True))),
        (_r(2, 41),), {"torch.stft"}),
    "stft_f64": (Fn(lambda s, x: torch.stft(x, 16, window=torch.hann_window(16, dtype=torch.float64),
                                            return_complex=True)), (_r(2, 64, dtype=torch.float64),), {"torch.stft"}),
    "istft_length": (Fn(lambda s, x, w: torch.istft(torch.stft(x, 16, window=w, return_complex=True), 16, window=w,
                                                    length=128)), (_r(2, 128), HANN), {"torch.stft", "torch.istft"}),
    "istft_spectrum_in": (
        Fn(lambda s, x: (torch.istft(x, 16, hop_length=4, window=torch.hann_window(16)),
                         torch.istft(x, 16, hop_length=4, window=torch.hann_window(16), length=90),
                         torch.istft(x, 16, hop_length=5, win_length=12, window=torch.hann_window(12), length=50))),
        (torch.randn(9, 20, dtype=torch.complex64, generator=_g(4)),), {"torch.istft"}),
    "istft_no_center": (
        Fn(lambda s, x: torch.istft(torch.stft(x, 16, hop_length=4, window=torch.hamming_window(16), center=False,
                                               return_complex=True),
                                    16, hop_length=4, window=torch.hamming_window(16), center=False)),
        (_r(2, 100),), {"torch.istft"}),
    "istft_twosided_complex": (
        Fn(lambda s, x: vr(torch.istft(torch.stft(x, 16, window=torch.hann_window(16), onesided=False,
                                                  return_complex=True), 16, window=torch.hann_window(16),
                                       onesided=False, return_complex=True))),
        (_r(1, 64),), {"torch.istft"}),
    # sizes computed from the input's shape: pnnx passes n / s as operands
    "irfft_n_from_shape": (Fn(lambda s, x: fft.irfft(fft.rfft(x) * 0.5, n=x.shape[-1])), (_r(1, 4, 21),),
                           {"torch.fft.irfft"}, (_r(3, 4, 32),)),
    "rfft_n_twice_the_length": (Fn(lambda s, x: fft.irfft(fft.rfft(x, n=2 * x.shape[-1]) ** 2, n=2 * x.shape[-1])),
                                (_r(1, 3, 10),), {"torch.fft.rfft", "torch.fft.irfft"}, (_r(2, 3, 17),)),
    "irfft2_s_from_shape": (Fn(lambda s, x: fft.irfft2(fft.rfft2(x) * 0.5, s=(x.shape[-2], x.shape[-1]))),
                            (_r(1, 2, 12, 15),), {"torch.fft.irfft2"}, (_r(3, 2, 16, 20),)),
    "istft_length_from_shape": (
        Fn(lambda s, x: torch.istft(torch.stft(x, 32, 8, window=s.w, return_complex=True) * 0.5, 32, 8, window=s.w,
                                    length=x.shape[-1]), w=torch.hann_window(32)),
        (_r(1, 200),), {"aten::istft"}, (_r(3, 257),)),
    "istft_length_from_shape_no_window": (
        Fn(lambda s, x: torch.istft(torch.stft(x, 16, window=None, center=False, return_complex=True), 16,
                                    center=False, length=x.shape[-1] - 3)),
        (_r(1, 100),), {"aten::istft"}, (_r(2, 131),)),
    # whole models
    "model_logmel_convnet": (LogMel(), (_r(2, 512),), {"torch.stft", "nn.Linear", "nn.Conv2d"}, (_r(3, 512),)),
    "model_fnet": (nn.Sequential(FNetBlock(), FNetBlock()), (_r(2, 10, 16),), {"torch.fft.fft2", "torch.real"},
                   (_r(3, 10, 16),)),
    "model_gfnet": (GlobalFilter(), (_r(2, 6, 8, 4),), {"torch.fft.rfft2", "torch.fft.irfft2", "pnnx.Attribute"}),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return case_exporter(tmp_path_factory, CASES)


def _compare(got, want, what, rtol=1e-5):
    """Shape, dtype and values; complex arrays part by part (real, imaginary)."""
    got = np.asarray(kuiper_xp.to_numpy(got))
    want = t2n(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if np.iscomplexobj(want):
        scale = float(np.max(np.abs(want))) if want.size else 1.0
        for part, a, e in (("real", got.real, want.real), ("imag", got.imag, want.imag)):
            assert_close(a, e, rtol=0, atol=rtol * max(scale, 1e-30), what=f"{what} ({part} part)")
    else:
        assert_close(got, want, rtol=rtol, what=what)


def _run_case(name, backend, exported, inputs=None):
    module, default_inputs, *_ = CASES[name]
    inputs = default_inputs if inputs is None else inputs
    with torch.no_grad():
        want = module.eval()(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    g = kuiper_xp.load(exported(name), backend=backend)
    got = g(*[t2n(t) for t in inputs])
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        _compare(a, e, f"{name} output {k}", rtol=1e-4 if name.startswith("model") else 1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    _run_case(name, backend, exported)


@pytest.mark.parametrize("name", ["model_logmel_convnet", "model_fnet", "irfft_n_from_shape",
                                  "rfft_n_twice_the_length", "irfft2_s_from_shape", "istft_length_from_shape",
                                  "istft_length_from_shape_no_window"])
def test_dynamic_batch_models(name, model_backend, exported):
    _run_case(name, model_backend, exported, inputs=CASES[name][3])


# ---------------------------------------------------------------------------------------------
# errors: bad parameters at build, bad inputs at run time, each naming the operator

@pytest.mark.parametrize("line,needle", [
    ("torch.fft.fft f 1 1 0 1 dim=-1 n=None norm=bad $input=0", r"torch\.fft\.fft 'f'.*norm='bad'"),
    ("torch.fft.rfft f 1 1 0 1 dim=-1 n=0 norm=None $input=0", r"torch\.fft\.rfft 'f'.*n=0"),
    ("torch.fft.fft2 f 1 1 0 1 dim=(-2,-1) norm=None s=(4) $input=0", r"torch\.fft\.fft2 'f'.*same length"),
    ("torch.stft f 1 1 0 1 center=True hop_length=0 n_fft=16 normalized=False onesided=None pad_mode=reflect "
     "return_complex=True win_length=None window=None $input=0", r"torch\.stft 'f'.*hop_length > 0"),
    ("torch.stft f 1 1 0 1 center=True hop_length=None n_fft=16 normalized=False onesided=None pad_mode=zeros "
     "return_complex=True win_length=None window=None $input=0", r"torch\.stft 'f'.*pad_mode='zeros'"),
    ("torch.stft f 1 1 0 1 center=True hop_length=None n_fft=16 normalized=False onesided=None pad_mode=reflect "
     "return_complex=True win_length=20 window=None $input=0", r"torch\.stft 'f'.*0 < win_length <= n_fft"),
])
def test_bad_parameters_are_refused_at_build(backend, line, needle):
    with pytest.raises(LayerParameterError, match=needle):
        make_layer(backend, line)


def _layer(backend, line, n_in=1):
    return make_layer(backend, line, n_in)


def test_bad_inputs_are_refused_at_run_time(backend):
    xb = backend.asarray
    x = t2n(_r(2, 8))
    rfft = _layer(backend, "torch.fft.rfft f 1 1 0 1 dim=-1 n=None norm=None $input=0")
    fft1 = _layer(backend, "torch.fft.fft f 1 1 0 1 dim=2 n=None norm=None $input=0")
    cplx = _layer(backend, "torch.fft.fft f 1 1 0 1 dim=-1 n=None norm=None $input=0")(xb(x))
    with pytest.raises(ShapeError, match=r"torch\.fft\.rfft 'f'.*expects a real input"):
        rfft(cplx)
    with pytest.raises(ShapeError, match=r"torch\.fft\.fft 'f'.*dim 2 is out of range"):
        fft1(xb(x))
    if hasattr(backend.xp, "float16"):  # (array_api_strict has no float16)
        with pytest.raises(ShapeError, match=r"torch\.fft\.rfft 'f'.*unsupported input dtype"):
            rfft(xb(x.astype(np.float16)))
    irfft = _layer(backend, "torch.fft.irfft f 1 1 0 1 dim=-1 n=None norm=None $input=0")
    with pytest.raises(ShapeError, match=r"torch\.fft\.irfft 'f'.*number of data points \(0\)"):
        irfft(xb(x[:, :1]))
    fftn = _layer(backend, "torch.fft.fftn f 1 1 0 1 dim=(0,-2) norm=None s=None $input=0")
    with pytest.raises(ShapeError, match=r"torch\.fft\.fftn 'f'.*unique"):
        fftn(xb(x))
    with pytest.raises(ShapeError, match=r"torch\.imag 'f'.*complex input"):
        _layer(backend, "torch.imag f 1 1 0 1 $input=0")(xb(x))
    with pytest.raises(ShapeError, match=r"torch\.view_as_real 'f'.*complex input"):
        _layer(backend, "torch.view_as_real f 1 1 0 1 $input=0")(xb(x))
    with pytest.raises(ShapeError, match=r"torch\.view_as_complex 'f'.*last dimension must have size 2"):
        _layer(backend, "torch.view_as_complex f 1 1 0 1 $input=0")(xb(x))
    with pytest.raises(ShapeError, match=r"torch\.complex 'f'.*two float32 or two float64"):
        _layer(backend, "torch.complex f 2 1 0 1 2 $real=0 $imag=1", 2)(xb(x), xb(x.astype(np.float64)))


def test_stft_and_istft_input_errors(backend, exported):
    g = kuiper_xp.load(exported("stft_no_window_pow"), backend=backend)
    stft = _layer(backend, "torch.stft f 1 1 0 1 center=True hop_length=None n_fft=16 normalized=False "
                           "onesided=None pad_mode=reflect return_complex=True win_length=None window=None $input=0")
    with pytest.raises(ShapeError, match=r"torch\.stft 'f'.*reflect padding 8 must be less than the signal length 6"):
        stft(backend.asarray(t2n(_r(2, 6))))
    with pytest.raises(ShapeError, match=r"torch\.stft 'f'.*1-D or 2-D input"):
        stft(backend.asarray(t2n(_r(2, 2, 64))))
    with pytest.raises(ShapeError, match=r"torch\.stft 'f'.*floating point or complex input"):
        stft(backend.asarray(np.arange(64)))
    win = _layer(backend, "torch.stft f 2 1 0 1 2 center=True hop_length=None n_fft=16 normalized=False "
                          "onesided=True pad_mode=reflect return_complex=True win_length=None $input=0 $window=1", 2)
    x = backend.asarray(t2n(_r(2, 64)))
    with pytest.raises(ShapeError, match=r"torch\.stft 'f'.*1-D window of win_length=16"):
        win(x, backend.asarray(np.ones(12, np.float32)))
    with pytest.raises(ShapeError, match=r"torch\.stft 'f'.*onesided output.*complex"):
        win(x, backend.asarray(np.ones(16, np.complex64)))
    assert g(t2n(_r(2, 100)))[0].shape == (2, 9, 26)
    istft = _layer(backend, "torch.istft f 2 1 0 1 2 center=False hop_length=None length=None n_fft=16 "
                            "normalized=False onesided=None return_complex=False win_length=None $input=0 $window=1", 2)
    spec = backend.asarray(t2n(torch.stft(_r(2, 64), 16, return_complex=True)))
    with pytest.raises(ShapeError, match=r"torch\.istft 'f'.*window overlap add min"):
        istft(spec, backend.asarray(t2n(torch.hann_window(16))))
    with pytest.raises(ShapeError, match=r"torch\.istft 'f'.*complex-valued input"):
        istft(backend.asarray(t2n(_r(2, 9, 17))), backend.asarray(np.ones(16, np.float32)))
    with pytest.raises(ShapeError, match=r"torch\.istft 'f'.*frequency dimension.*to be 9"):
        istft(spec[:, :8, :], backend.asarray(np.ones(16, np.float32)))
