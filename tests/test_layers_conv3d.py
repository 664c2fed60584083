"""3-D layers (kuiper_xp/layers/conv3d.py) against torch through pnnx exports, on every backend
leg: Conv3d (stride, padding incl. "same" and the padding modes, dilation, groups, depthwise, no
bias, BatchNorm3d folded), ConvTranspose3d (output_padding, groups, dilation), max / average
pooling (ceil_mode, padding, count_include_pad, divisor_override, max with its indices), adaptive pooling (sizes that
do not divide, kept sizes, the functional max with its indices), a small video classifier; and
the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import in_fast_scope
from test_layers_misc import export_module, make_layer, t2n
from torch import nn

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv3d(3, 8, 3, stride=(1, 2, 2), padding=1)
        self.bn = nn.BatchNorm3d(8)
        self.b = nn.Conv3d(8, 8, 3, padding="same", groups=4, dilation=(2, 1, 1), bias=False,
                           padding_mode="replicate")
        self.c = nn.Conv3d(8, 8, (3, 1, 3), stride=(2, 1, 1), padding=(1, 0, 2), groups=8)  # depthwise
        self.d = nn.Conv3d(8, 6, 2, dilation=2, padding=(0, 1, 1), padding_mode="circular")
        self.e = nn.Conv3d(8, 4, (1, 3, 3), padding=(0, 1, 1), padding_mode="reflect", bias=False)

    def forward(self, x):
        y = F.relu(self.bn(self.a(x)))
        return self.b(y), F.relu6(self.c(y)), self.d(y), self.e(y)  # (ReLU6 folded into the depthwise one)


class Factorised(nn.Module):
    """(2+1)-D video blocks: temporal (kd, 1, 1) and pointwise (1, 1, 1) convolutions, run as 2-D
    (kd, 1) convolutions over (D, H*W) maps (depth padding, stride and dilation, groups, a
    folded BatchNorm and a fused ReLU); and a spatial (1, 3, 3) one."""

    def __init__(self):
        super().__init__()
        self.s = nn.Conv3d(4, 6, (1, 3, 3), padding=(0, 1, 1))
        self.t = nn.Conv3d(6, 8, (3, 1, 1), padding=(1, 0, 0), bias=False)
        self.bn = nn.BatchNorm3d(8)
        self.t2 = nn.Conv3d(8, 4, (3, 1, 1), stride=(2, 1, 1), dilation=(2, 1, 1), padding=(2, 0, 0), groups=2)
        self.p = nn.Conv3d(8, 5, 1)

    def forward(self, x):
        y = F.relu(self.bn(self.t(self.s(x))))
        return self.t2(y), self.p(y)


class Depthwise(nn.Module):
    """X3D's and CSN's depthwise 3-D convolutions, stride 1 (the numpy backend's whole-volume
    depthwise path): a 3x3x3 one with a folded BatchNorm and SiLU, an uneven (3, 5, 3) kernel with
    uneven padding and no bias, and an even kernel's "same" padding (0 before, 1 after)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv3d(6, 6, 3, padding=1, groups=6)
        self.bn = nn.BatchNorm3d(6)
        self.b = nn.Conv3d(6, 6, (3, 5, 3), padding=(1, 2, 0), groups=6, bias=False)
        self.c = nn.Conv3d(6, 6, 2, padding="same", groups=6)

    def forward(self, x):
        y = F.silu(self.bn(self.a(x)))
        return self.b(y), self.c(y)


class Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.ConvTranspose3d(6, 4, 2, 2)
        self.b = nn.ConvTranspose3d(6, 4, 3, stride=(2, 1, 2), padding=1, output_padding=(1, 0, 1), groups=2)
        self.c = nn.ConvTranspose3d(6, 3, (2, 3, 3), dilation=(2, 1, 1), bias=False)

    def forward(self, x):
        return self.a(x), self.b(x), self.c(x)


class Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.mp = nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1), ceil_mode=True)
        self.mpd = nn.MaxPool3d(2, 1, dilation=(2, 1, 2))
        self.ap = nn.AvgPool3d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.apd = nn.AvgPool3d((2, 3, 2), (1, 2, 2), (1, 1, 0), divisor_override=5)
        self.aap = nn.AdaptiveAvgPool3d((2, None, 3))
        self.amp = nn.AdaptiveMaxPool3d((3, 2, 2))

    def forward(self, x):
        return (self.mp(x), self.mpd(x), self.ap(x), self.apd(x), F.avg_pool3d(x, 2), F.max_pool3d(x, 3, 2, 1),
                self.aap(x), self.amp(x), F.adaptive_avg_pool3d(x, 1), F.adaptive_max_pool3d(x, (2, 3, 2)))


class PoolsWithIndices(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.MaxPool3d(2, return_indices=True)
        self.b = nn.MaxPool3d((3, 2, 3), (2, 1, 2), (1, 1, 1), dilation=(1, 2, 1), ceil_mode=True,
                              return_indices=True)

    def forward(self, x):
        return (*self.a(x), *self.b(x), *F.max_pool3d(x, 3, 2, 1, return_indices=True))


class Video(nn.Module):
    """C3D-like: Conv3d-BN-ReLU, MaxPool3d, Conv3d, AdaptiveAvgPool3d, flatten, Linear."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv3d(3, 16, 3, padding=1), nn.BatchNorm3d(16), nn.ReLU(),
                               nn.MaxPool3d((1, 2, 2)), nn.Conv3d(16, 32, 3, padding=1), nn.ReLU(),
                               nn.MaxPool3d(2), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(32, 5))

    def forward(self, x):
        return self.f(x)


def _randomise_bn(module):
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return module.eval()


CASES = {
    "convs": (Convs, (2, 3, 5, 9, 8)),
    "factorised": (Factorised, (2, 4, 7, 6, 5)),
    "depthwise": (Depthwise, (2, 6, 5, 9, 8)),
    "transposed": (Transposed, (2, 6, 3, 4, 5)),
    "pools": (Pools, (2, 3, 7, 9, 8)),
    "pools_indices": (PoolsWithIndices, (2, 3, 7, 9, 8)),
    "video": (Video, (2, 3, 4, 16, 16)),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            torch.manual_seed(0)
            cls, shape = CASES[name]
            module = _randomise_bn(cls())
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
            cache[name] = export_module(module, (x,), tmp_path_factory.mktemp(name)), module, x
        return cache[name]
    return get


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    param, module, x = exported(name)
    with torch.no_grad():
        want = module(x)
    want = want if isinstance(want, tuple) else (want,)
    got = kuiper_xp.load(param, backend=backend)(t2n(x))
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        assert_close(a, t2n(e), rtol=1e-5, what=f"{name} output {k}")


def test_the_exports_have_the_3d_operators(exported):
    text = "".join(exported(n)[0].read_text() for n in CASES)
    for t in ("nn.Conv3d", "padding_mode=replicate", "padding_mode=circular", "padding_mode=reflect",
              "nn.ConvTranspose3d", "nn.MaxPool3d", "nn.AvgPool3d", "divisor_override=5", "F.avg_pool3d",
              "F.max_pool3d", "nn.AdaptiveAvgPool3d", "nn.AdaptiveMaxPool3d", "F.adaptive_avg_pool3d",
              "F.adaptive_max_pool3d", "return_indices=True", "padding=(1,1,1,1,2,2)"):
        assert t in text, f"pnnx no longer writes {t!r}"


def test_activations_are_folded_into_the_convolutions(exported):
    param = exported("convs")[0]
    g = kuiper_xp.load(param)
    fused = {a for _, a in g.fused}
    acts = {r.name for r in g.operators if r.type in ("F.relu", "F.relu6", "F.hardtanh", "nn.ReLU")}
    assert acts and acts <= fused, (acts, g.fused)


def test_kernels_without_spatial_extent_run_as_2d_depth_convolutions(backend, exported):
    param = exported("factorised")[0]
    g = kuiper_xp.load(param, backend=backend)
    taken = {r.name: r.layer.depth_only is not None for r in g.operators if r.type == "nn.Conv3d"}
    assert len(taken) == 4 and taken.pop("s") is False and all(taken.values()), taken  # (1, 3, 3): not


def test_stride_one_depthwise_kernels_take_the_whole_volume_path(backend, exported):
    """On numpy the stride-1 depthwise layers run as one plan over the padded volume
    (``Depthwise3dPlan``), the strided depthwise one of ``convs`` keeps the per-depth-tap 2-D
    convolutions; array_api_strict has no plan."""
    g = kuiper_xp.load(exported("depthwise")[0], backend=backend)
    taken = {r.name: r.layer.depthwise3d is not None for r in g.operators if r.type == "nn.Conv3d"}
    assert len(taken) == 3 and set(taken.values()) == {backend.name == "numpy"}, taken
    g2 = kuiper_xp.load(exported("convs")[0], backend=backend)
    assert all(r.layer.depthwise3d is None for r in g2.operators if r.type == "nn.Conv3d")


def test_unbatched_input(backend, exported):
    """(C, D, H, W) gives what the same sample as a batch of one gives, for a convolution and a
    pool."""
    param, _, x = exported("video")
    g = kuiper_xp.load(param, backend=backend)
    for t in ("nn.Conv3d", "nn.MaxPool3d"):
        layer = next(r.layer for r in g.execution_order if r.type == t)
        one = layer(backend.asarray(t2n(x[0])))
        assert tuple(one.shape) == tuple(layer(backend.asarray(t2n(x[:1]))).shape[1:])
        assert_close(one, backend.to_numpy(layer(backend.asarray(t2n(x[:1]))))[0], rtol=1e-6, what=t)


def test_errors_name_the_operator(backend, exported):
    param, _, x = exported("video")
    g = kuiper_xp.load(param, backend=backend)
    conv = next(r.layer for r in g.execution_order if r.type == "nn.Conv3d")
    with pytest.raises(ShapeError, match=r"nn.Conv3d.*input has 4 channels.*expects 3"):
        conv(backend.asarray(np.zeros((1, 4, 4, 8, 8), np.float32)))
    with pytest.raises(ShapeError, match=r"expects a 5-D input"):
        conv(backend.asarray(np.zeros((4, 8, 8), np.float32)))
    with pytest.raises(LayerParameterError, match=r"return_indices=True needs 2 output"):
        make_layer(backend, "nn.MaxPool3d mp 1 1 0 1 ceil_mode=False dilation=(1,1,1) kernel_size=(2,2,2) "
                            "padding=(0,0,0) return_indices=True stride=(2,2,2)")
    with pytest.raises(LayerParameterError, match=r"padding at most half"):
        make_layer(backend, "nn.AvgPool3d ap 1 1 0 1 kernel_size=(2,2,2) padding=(2,0,0) stride=(1,1,1)")


def test_numpy_depthwise3d_plan_random_geometries_match_torch():
    """The numpy backend's whole-volume depthwise plan against torch over random kernels (1-5
    per axis), uneven paddings (0-3), sizes (1-9), batches 0-2, float32 and float64, with and
    without a bias, planar and channels-last inputs, on one and two threads; where torch finds
    the output empty the plan refuses too."""
    from kuiper_xp.backends import numpy_fast as nf

    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(40):
        c, n = int(rng.integers(1, 7)), int(rng.integers(0, 3))
        k = tuple(int(v) for v in rng.integers(1, 6, size=3))
        pads = tuple((int(rng.integers(0, 4)), int(rng.integers(0, 4))) for _ in range(3))
        size = tuple(int(v) for v in rng.integers(1, 10, size=3))
        dt = np.float32 if rng.random() < 0.7 else np.float64
        x = rng.standard_normal((n, c) + size).astype(dt)
        if rng.random() < 0.3:
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1)).transpose(0, 4, 1, 2, 3)
        w = rng.standard_normal((c, 1) + k).astype(dt)
        b = rng.standard_normal(c).astype(dt) if rng.random() < 0.7 else None
        plan = nf.depthwise3d_plan(w, b, groups=c, pads=pads)
        (f0, f1), (t0, t1), (l0, l1) = pads
        xt = F.pad(torch.from_numpy(np.ascontiguousarray(x)), (l0, l1, t0, t1, f0, f1))
        if min(s + sum(p) - kk + 1 for s, p, kk in zip(size, pads, k)) <= 0:
            with pytest.raises(ShapeError, match="non-empty output"):
                plan(x)
            continue
        ref = F.conv3d(xt, torch.from_numpy(w), None if b is None else torch.from_numpy(b), groups=c).numpy()
        for threads in (1, 2):
            got = in_fast_scope(nf, lambda p=plan, x=x: p(x), threads)
            assert_close(got, ref, rtol=1e-5 if dt == np.float32 else 1e-12, what=f"{n, c, k, pads, size}")
        checked += 1
    assert checked >= 25
