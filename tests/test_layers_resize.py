"""Resizing layers (kuiper_xp/layers/resize.py) against PyTorch: interpolate in every mode, by
size and by scale factor (recompute_scale_factor both ways, non-integer and downscaling factors),
pixel shuffle / unshuffle; plus pnnx exports of the real spellings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from test_layers_misc import (
    compare_graph,
    export_module,
    make_layer,
    require_types,
    run_one_op,
    t2n,
)
from torch import nn

rng = np.random.default_rng(1)


def _x(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _fmt(v):
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(str(float(e)) if isinstance(e, float) else str(e) for e in v) + ")"
    return str(v)


# (mode, align_corners, size, scale_factor, recompute) -- torch.nn.functional.interpolate keywords
GRID = [
    ("nearest", None, None, 2.0, None),
    ("nearest", None, None, 1.5, None),
    ("nearest", None, None, 0.5, None),
    ("nearest", None, None, (1.7, 0.6), None),
    ("nearest", None, None, 1.5, True),
    ("nearest", None, (7, 3), None, None),
    ("nearest-exact", None, None, 1.5, None),
    ("nearest-exact", None, (4, 11), None, None),
    ("bilinear", False, None, 2.0, None),
    ("bilinear", True, None, 2.0, None),
    ("bilinear", False, None, 1.5, None),
    ("bilinear", True, None, 1.5, None),
    ("bilinear", False, None, 0.5, None),
    ("bilinear", False, None, 0.7, True),
    ("bilinear", False, None, (1.5, 2.5), None),
    ("bilinear", True, (9, 4), None, None),
    ("bilinear", False, (1, 1), None, None),
    ("bicubic", False, None, 2.0, None),
    ("bicubic", True, None, 2.0, None),
    ("bicubic", False, None, 1.5, None),
    ("bicubic", True, None, 1.5, None),
    ("bicubic", False, None, 0.6, None),
    ("bicubic", False, None, 1.3, True),
    ("bicubic", True, (3, 13), None, None),
    ("area", None, (3, 4), None, None),
]


def _interp_args(mode, ac, size, scale, recompute=None):
    """F.interpolate's keyword arguments for a 2-D case, and the same as pnnx parameters."""
    kw = {"mode": mode}
    params = [f"mode={mode}"]
    if ac is not None:
        kw["align_corners"] = ac
        params.append(f"align_corners={ac}")
    if size is not None:
        kw["size"] = size
        params.append(f"size={_fmt(size)}")
    else:
        kw["scale_factor"] = scale
        sf = scale if isinstance(scale, tuple) else (scale, scale)
        params.append(f"scale_factor={_fmt(sf)}")
    if recompute is not None:
        kw["recompute_scale_factor"] = recompute
        params.append(f"recompute_scale_factor={recompute}")
    return kw, " ".join(params)


@pytest.mark.parametrize("mode,ac,size,scale,recompute", GRID)
def test_interpolate_2d(backend, tmp_path, mode, ac, size, scale, recompute):
    x = _x(2, 3, 5, 7)
    kw, params = _interp_args(mode, ac, size, scale, recompute)
    e = F.interpolate(torch.from_numpy(x), **kw)
    run_one_op(backend, tmp_path, "F.interpolate", [x], t2n(e), params=params, keys=["input"])


@pytest.mark.parametrize("mode,ac,size,scale", [
    ("bilinear", False, None, 1.5), ("bilinear", True, (9, 4), None), ("bicubic", False, None, 1.3),
    ("bicubic", True, (3, 13), None), ("nearest", None, None, (1.7, 0.6)), ("bilinear", False, (11, 13), None),
])
def test_interpolate_float64_computes_coordinates_in_double(backend, tmp_path, mode, ac, size, scale):
    """torch computes a float64 tensor's source coordinates and weights in double (its kernels'
    opmath type), a float32 one's in float: the float64 results agree to ~1e-15, not 1e-8."""
    x = _x(2, 3, 5, 7).astype(np.float64) * 3
    kw, params = _interp_args(mode, ac, size, scale)
    e = F.interpolate(torch.from_numpy(x), **kw)
    run_one_op(backend, tmp_path, "F.interpolate", [x], t2n(e), params=params, keys=["input"], rtol=1e-13)


@pytest.mark.parametrize("mode,ac,scale", [("linear", False, 2.5), ("linear", True, 0.7), ("nearest", None, 3.0),
                                           ("trilinear", False, 1.5), ("trilinear", True, 2.0),
                                           ("nearest", None, 0.5)])
def test_interpolate_1d_3d(backend, tmp_path, mode, ac, scale):
    x = _x(1, 2, 6) if mode == "linear" or (mode == "nearest" and scale == 3.0) else _x(1, 2, 3, 4, 5)
    nsp = x.ndim - 2
    kw = {"mode": mode, "scale_factor": scale}
    params = f"mode={mode} scale_factor={_fmt((scale,) * nsp)}"
    if ac is not None:
        kw["align_corners"] = ac
        params += f" align_corners={ac}"
    e = F.interpolate(torch.from_numpy(x), **kw)
    run_one_op(backend, tmp_path, "F.upsample", [x], t2n(e), params=params, keys=["input"])


def test_interpolate_aliases(backend, tmp_path):
    x = _x(1, 2, 4, 3)
    xt = torch.from_numpy(x)
    run_one_op(backend, tmp_path / "a", "F.upsample_bilinear", [x], t2n(F.upsample_bilinear(xt, scale_factor=2)),
               params="scale_factor=(2.0,2.0)", keys=["input"])
    run_one_op(backend, tmp_path / "b", "nn.UpsamplingBilinear2d", [x],
               t2n(nn.UpsamplingBilinear2d(size=(5, 7))(xt)), params="size=(5,7)")
    run_one_op(backend, tmp_path / "c", "nn.UpsamplingNearest2d", [x],
               t2n(nn.UpsamplingNearest2d(scale_factor=3)(xt)), params="scale_factor=(3.0,3.0) size=None")
    run_one_op(backend, tmp_path / "d", "F.upsample_nearest", [x], t2n(F.upsample_nearest(xt, size=(2, 5))),
               params="size=(2,5)", keys=["input"])
    run_one_op(backend, tmp_path / "e", "nn.Upsample", [x], t2n(nn.Upsample(scale_factor=2.0, mode="nearest")(xt)),
               params="mode=nearest scale_factor=(2.0,2.0) size=None")


def test_interpolate_size_input_and_cache(backend):
    """A size fed by a pnnx.Expression list (ints or 0-d arrays); several input sizes through one
    layer exercise the per-size table cache."""
    layer = make_layer(backend, "F.upsample op 2 1 0 1 2 align_corners=False mode=bilinear $input=0 $size=1", n_in=2)
    xp = backend.xp
    for shape, size in [((1, 2, 4, 5), (7, 9)), ((2, 2, 3, 3), (6, 6)), ((1, 2, 4, 5), (7, 9))]:
        x = _x(*shape)
        e = F.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=False)
        s = [xp.asarray(size[0], device=backend.device), size[1]]
        assert_close(layer.forward(backend.asarray(x), s), t2n(e), rtol=1e-5)


def test_nearest_int_dtype(backend, tmp_path):
    x = rng.integers(0, 255, (1, 1, 3, 4)).astype(np.uint8)
    e = F.interpolate(torch.from_numpy(x), scale_factor=1.5, mode="nearest")
    run_one_op(backend, tmp_path, "F.upsample", [x], t2n(e), params="mode=nearest scale_factor=(1.5,1.5)",
               keys=["input"])


@pytest.mark.parametrize("r", [2, 3])
def test_pixel_shuffle(backend, tmp_path, r):
    x = _x(2, 2 * r * r, 3, 4)
    run_one_op(backend, tmp_path / "s", "nn.PixelShuffle", [x], t2n(F.pixel_shuffle(torch.from_numpy(x), r)),
               params=f"upscale_factor={r}")
    y = _x(1, 3, 2 * r, 3 * r)
    run_one_op(backend, tmp_path / "u", "F.pixel_unshuffle", [y], t2n(F.pixel_unshuffle(torch.from_numpy(y), r)),
               params=f"downscale_factor={r}", keys=["input"])


def test_resize_errors(backend):
    from kuiper_xp.errors import LayerParameterError, ShapeError

    with pytest.raises(LayerParameterError, match="mode"):
        make_layer(backend, "F.upsample op 1 1 0 1 mode=lanczos scale_factor=(2.0,2.0)")
    with pytest.raises(LayerParameterError, match="size or scale_factor"):
        make_layer(backend, "F.upsample op 1 1 0 1 mode=nearest")
    layer = make_layer(backend, "F.upsample op 1 1 0 1 mode=bilinear scale_factor=(2.0,2.0)")
    with pytest.raises(ShapeError, match="4-D"):
        layer.forward(backend.asarray(_x(1, 2, 3)))


# ---- pnnx end to end ------------------------------------------------------------------------------


class ResizeModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.up2 = nn.Upsample(size=(7, 9), mode="bilinear", align_corners=True)
        self.ps, self.pu = nn.PixelShuffle(2), nn.PixelUnshuffle(2)
        self.ub = nn.UpsamplingBilinear2d(scale_factor=1.5)

    def forward(self, x):
        r = [self.up(x), self.up2(x)]
        for sf in (2.0, 1.5):
            for mode in ("bilinear", "bicubic"):
                for ac in (False, True):
                    r.append(F.interpolate(x, scale_factor=sf, mode=mode, align_corners=ac))
        r += [F.interpolate(x, size=(3, 5), mode="nearest"), F.upsample_nearest(x, scale_factor=2),
              F.upsample_bilinear(x, scale_factor=2), F.interpolate(x, scale_factor=0.5, mode="bilinear"),
              F.interpolate(x, scale_factor=1.5, mode="nearest", recompute_scale_factor=True),
              F.interpolate(x, scale_factor=1.5, mode="nearest-exact"), self.ps(x), self.pu(x),
              F.pixel_shuffle(x, 2), F.pixel_unshuffle(x, 2), self.ub(x)]
        return tuple(r)


@pytest.fixture(scope="session")
def resize_export(tmp_path_factory):
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((1, 4, 6, 8)).astype(np.float32))
    return export_module(ResizeModule(), (x,), tmp_path_factory.mktemp("resize")), x


def test_resize_export_matches_torch(resize_export, model_backend):
    param, x = resize_export
    text = param.read_text()
    for t in ("nn.Upsample", "F.upsample", "F.upsample_nearest", "F.interpolate", "nn.PixelShuffle",
              "nn.PixelUnshuffle", "F.pixel_shuffle", "F.pixel_unshuffle", "nn.UpsamplingBilinear2d", "mode=bicubic"):
        assert t in text, f"pnnx no longer emits {t}"
    require_types(param)  # only resize layers: never skips
    compare_graph(param, model_backend, ResizeModule(), (x,))


class SizeFromSkip(nn.Module):
    def forward(self, x, skip):
        a = F.interpolate(x, size=skip.shape[2:], mode="bilinear", align_corners=False)
        b = F.interpolate(x, size=(x.size(2) * 2, x.size(3) * 2), mode="nearest")
        return a, b


def test_resize_dynamic_size_export(model_backend, tmp_path_factory):
    """The output size comes from another tensor: pnnx feeds it through a pnnx.Expression list."""
    x, skip = torch.rand(1, 3, 4, 5), torch.rand(1, 2, 7, 9)
    x2, skip2 = torch.rand(2, 3, 5, 6), torch.rand(2, 2, 8, 11)
    param = export_module(SizeFromSkip(), (x, skip), tmp_path_factory.mktemp("resize_dyn"), inputs2=(x2, skip2))
    assert "$size=" in param.read_text()
    require_types(param)
    compare_graph(param, model_backend, SizeFromSkip(), (x2, skip2))
    compare_graph(param, model_backend, SizeFromSkip(), (x, skip))


class _NearestAten(nn.Module):
    """Nearest(-exact) resizes pnnx leaves as ``aten::_upsample_nearest_exact{1,2,3}d`` /
    ``aten::upsample_nearest{1,2,3}d``: recomputed scale factors, a size from another tensor."""

    def forward(self, x, y):
        return (F.interpolate(x, scale_factor=(1.7, 0.6), mode="nearest-exact", recompute_scale_factor=True),
                F.interpolate(x, size=y.shape[2:], mode="nearest-exact"),
                F.interpolate(x[:, :, 0], scale_factor=0.4, mode="nearest-exact", recompute_scale_factor=True),
                F.interpolate(x.unsqueeze(2), scale_factor=(1.5, 0.5, 2.2), mode="nearest-exact",
                              recompute_scale_factor=True),
                F.interpolate(x, scale_factor=(1.3, 2.1), mode="nearest", recompute_scale_factor=True),
                F.interpolate(x, size=y.shape[2:], mode="nearest") * 2)


def test_nearest_resizes_left_as_aten_ops(model_backend, tmp_path_factory):
    """They were refused as unsupported operators; against torch at two batch sizes."""
    x, y = torch.randn(1, 2, 13, 7), torch.randn(1, 1, 5, 17)
    x2, y2 = torch.randn(3, 2, 13, 7), torch.randn(3, 1, 5, 17)
    param = export_module(_NearestAten(), (x, y), tmp_path_factory.mktemp("nearest_aten"), inputs2=(x2, y2))
    text = param.read_text()
    assert "aten::_upsample_nearest_exact1d" in text and "aten::_upsample_nearest_exact3d" in text
    require_types(param)
    compare_graph(param, model_backend, _NearestAten(), (x2, y2))
    compare_graph(param, model_backend, _NearestAten(), (x, y))


@pytest.mark.parametrize("line, shape", [
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bilinear scale_factor=(2.0,1.5)", (2, 3, 7, 6)),
    ("F.interpolate op 1 1 0 1 align_corners=True mode=bilinear size=(5,11)", (1, 4, 9, 4)),
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bicubic size=(8,8)", (2, 2, 5, 6)),
    ("F.interpolate op 1 1 0 1 mode=nearest scale_factor=(3.0,2.0)", (1, 5, 4, 3)),
    ("F.interpolate op 1 1 0 1 align_corners=False mode=trilinear size=(3,6,5)", (1, 2, 4, 3, 2)),
    ("F.interpolate op 1 1 0 1 align_corners=False mode=linear size=(9)", (3, 2, 5)),
    # whole factors on both axes (4 bicubic taps with two edge columns; nearest)
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bilinear scale_factor=(2.0,2.0)", (2, 3, 6, 9)),
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bicubic scale_factor=(2.0,4.0)", (1, 2, 8, 5)),
    ("F.interpolate op 1 1 0 1 mode=nearest scale_factor=(2.0,2.0)", (2, 3, 5, 7)),
])
def test_numpy_fast_resize_is_the_generic_path_bit_for_bit(monkeypatch, line, shape):
    """numpy_fast.resize_taps runs the generic steps in the same order (threaded over planes,
    pooled output): equal bit for bit, NaN and inf included, float64 too (the numpy leg of the
    tests above compares this path with torch)."""
    from kuiper_xp.backends import get_backend
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    layer = make_layer(get_backend("numpy"), line)
    for dtype in (np.float32, np.float64):
        x = np.random.default_rng(7).standard_normal(shape).astype(dtype)
        x.flat[2], x.flat[-1] = np.nan, np.inf
        old = nf.set_num_threads(3)
        try:
            with nf.compute_scope():
                fast = layer.forward(x)
        finally:
            nf.set_num_threads(old)
        with monkeypatch.context() as m, np.errstate(invalid="ignore"):  # inf * 0-weight taps
            m.setattr(nf, "resize_taps", lambda *a: None)
            generic = layer.forward(x)
        np.testing.assert_array_equal(fast, generic)
        assert fast.dtype == dtype and fast.flags.c_contiguous


@pytest.mark.parametrize("line,shape", [
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bilinear scale_factor=(2.0,2.0)", (2, 8, 32, 24)),
    ("F.interpolate op 1 1 0 1 align_corners=True mode=bilinear scale_factor=(4.0,4.0)", (2, 8, 16, 16)),
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bicubic scale_factor=(2.0,4.0)", (2, 8, 40, 20)),
])
def test_numpy_fast_resize_of_short_axes_as_matrix_products(monkeypatch, line, shape):
    """Axes of at most RESIZE_MATMUL_MAX_IN samples of a finite input are interpolated as products
    with their tap matrices (equal taps of align_corners' edges added up): the generic gathers'
    results within float rounding, and torch's; a non-finite input keeps the gathers."""
    from kuiper_xp.backends import get_backend
    from kuiper_xp.backends import numpy_fast as nf

    used = []
    real = nf._resize_axis_matmul
    monkeypatch.setattr(nf, "_resize_axis_matmul", lambda *a: used.append(a[3]) or real(*a))
    layer = make_layer(get_backend("numpy"), line)
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    with nf.compute_scope():
        fast = layer.forward(x)
    assert used == [1, 2], used  # (the H and W axes of the (planes, H, W) array)
    with monkeypatch.context() as m:
        m.setattr(nf, "resize_taps", lambda *a: None)
        generic = layer.forward(x)
    assert_close(fast, generic, rtol=1e-6)
    mode = "bicubic" if "bicubic" in line else "bilinear"
    scale = tuple(float(v) for v in line.split("scale_factor=(")[1].rstrip(")").split(","))
    want = F.interpolate(torch.from_numpy(x), scale_factor=scale, mode=mode, align_corners="True" in line)
    assert_close(fast, want.numpy(), rtol=2e-6)
    x.flat[5] = np.inf
    used.clear()
    with nf.compute_scope():
        layer.forward(x)
    assert used == []


@pytest.mark.parametrize("line,shape", [
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bilinear scale_factor=(2.0,2.0)", (2, 3, 20, 100)),
    ("F.interpolate op 1 1 0 1 align_corners=True mode=bilinear size=(23,197)", (1, 4, 11, 99)),
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bicubic scale_factor=(1.0,3.0)", (2, 2, 9, 70)),
    ("F.interpolate op 1 1 0 1 align_corners=False mode=bilinear size=(13,75)", (1, 3, 30, 150)),
])
def test_numpy_fast_resize_of_long_last_axes_in_bands(monkeypatch, line, shape):
    """A last axis longer than RESIZE_MATMUL_MAX_IN is taken as products per band of
    RESIZE_BAND_COLUMNS output columns with the rows of the tap matrix that band reads (up and
    down, odd sizes, align_corners, bicubic's four taps; a short last band), in blocks of rows
    (every output made once), over 3 threads:
    torch's results within float rounding and the generic gathers'; a non-finite input keeps the
    gathers; a band of the whole input (RESIZE_BAND_MAX_K = 0) too."""
    from helpers import in_fast_scope
    from kuiper_xp.backends import get_backend
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    monkeypatch.setattr(nf, "RESIZE_MATMUL_MIN_OUT", 0)
    monkeypatch.setattr(nf, "_TAP_BANDS", {})
    monkeypatch.setattr(nf, "RESIZE_BAND_ROWS_BYTES", 1)  # (blocks of 64 rows: several per thread)
    used = []
    real = nf._mm
    monkeypatch.setattr(nf, "_mm", lambda a, b, out: used.append((a.shape[0],) + b.shape) or real(a, b, out))
    layer = make_layer(get_backend("numpy"), line)
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    fast = in_fast_scope(nf, lambda: layer.forward(x))
    n_out = fast.shape[-1]
    rows = math.prod(fast.shape[:-1])
    assert sum(r * w for r, _, w in used) == rows * n_out  # every output once
    assert max(w for _, _, w in used) == nf.RESIZE_BAND_COLUMNS and max(r for r, _, _ in used) <= 64, used
    assert max(k for _, k, _ in used) < shape[-1]  # each band reads part of the input only
    with monkeypatch.context() as m:
        m.setattr(nf, "resize_taps", lambda *a: None)
        generic = layer.forward(x)
    assert_close(fast, generic, rtol=1e-6)
    mode = "bicubic" if "bicubic" in line else "bilinear"
    kw = ({"size": tuple(int(v) for v in line.split("size=(")[1].rstrip(")").split(","))} if "size=" in line else
          {"scale_factor": tuple(float(v) for v in line.split("scale_factor=(")[1].rstrip(")").split(","))})
    want = F.interpolate(torch.from_numpy(x), mode=mode, align_corners="True" in line, **kw)
    tol = 1e-5 if mode == "bicubic" else 2e-6  # (x3: torch's float32 cubic weights of 1/3 steps, as the gathers')
    assert_close(fast, want.numpy(), rtol=tol)
    used.clear()
    y = x.copy()
    y.flat[5] = np.nan
    with nf.compute_scope():
        layer.forward(y)
    assert used == []
    monkeypatch.setattr(nf, "RESIZE_BAND_MAX_K", 0)
    monkeypatch.setattr(nf, "_TAP_BANDS", {})
    with nf.compute_scope():
        again = layer.forward(x)
    assert all(w != nf.RESIZE_BAND_COLUMNS or k <= nf.RESIZE_MATMUL_MAX_IN for _, k, w in used), used
    assert_close(again, want.numpy(), rtol=tol)


@pytest.mark.parametrize("shape, r", [((2, 2 * 9, 5, 7), 3), ((1, 3 * 4, 9, 6), 2), ((3, 2, 4, 8, 4, 5), 2),
                                      ((4 * 4, 3, 5), 4)])
def test_numpy_fast_pixel_shuffle_and_unshuffle(monkeypatch, shape, r):
    """numpy_fast.pixel_shuffle (and inverse=True) on 3 threads: split over images x channels or,
    with fewer of them than threads, over the row phases; extra leading axes, no batch axis;
    float64 and uint8 alike; against torch."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    old = nf.set_num_threads(3)
    try:
        for dt in (np.float32, np.float64, np.uint8):
            x = (np.random.default_rng(3).random(shape) * 200).astype(dt)
            with nf.compute_scope():
                got = nf.pixel_shuffle(x, r)
                back = nf.pixel_shuffle(got, r, inverse=True)
            want = F.pixel_shuffle(torch.from_numpy(x), r).numpy()
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(back, F.pixel_unshuffle(torch.from_numpy(want), r).numpy())
            np.testing.assert_array_equal(back, x)
    finally:
        nf.set_num_threads(old)


class Antialias(nn.Module):
    """F.interpolate(antialias=True), which pnnx leaves as aten::_upsample_*2d_aa: shrinking
    (the filter stretched) and growing, by size and by scale factor, align_corners either way."""

    def forward(self, x):
        return (F.interpolate(x, size=(6, 7), mode="bilinear", antialias=True),
                F.interpolate(x, size=(5, 11), mode="bicubic", antialias=True),
                F.interpolate(x, scale_factor=0.3, mode="bilinear", antialias=True, align_corners=True),
                F.interpolate(x, size=(20, 9), mode="bicubic", antialias=True, align_corners=True),
                F.interpolate(x, scale_factor=(0.5, 1.5), mode="bilinear", antialias=True))


def test_interpolate_antialias_matches_torch(model_backend, tmp_path):
    x = torch.from_numpy(np.random.default_rng(7).standard_normal((2, 3, 17, 16)).astype(np.float32))
    param = export_module(Antialias(), (x,), tmp_path)
    text = param.read_text()
    assert "aten::_upsample_bilinear2d_aa" in text and "aten::_upsample_bicubic2d_aa" in text
    compare_graph(param, model_backend, Antialias(), (x,))


@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("channels", [1, 5, 16])
def test_grid_sample_bilinear_fast_path_equals_the_generic_one(padding, align, channels):
    """numpy's bilinear fast path does the generic layer's arithmetic in the same order: the
    same values bit for bit (NaN and infinite coordinates, points outside, float64 grids), for
    one channel (RAFT's lookups) and several (Deformable DETR's)."""
    from kuiper_xp.backends import get_backend

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, channels, 9, 11)).astype(np.float32)
    grid = (rng.random((3, 7, 6, 2)) * 2.6 - 1.3).astype(np.float64)
    grid[0, 0, :3, 0] = np.nan
    grid[1, 2, 1] = [np.inf, -np.inf]
    grid[2, 3, :] = [-1.0, 1.0]  # the corners exactly
    line = (f"F.grid_sample gs 2 1 0 1 2 align_corners={align} mode=bilinear padding_mode={padding} "
            f"$input=0 $grid=1")
    fast = get_backend("numpy")
    assert fast.fast.grid_sample_bilinear(x, grid, padding, align) is not None
    got = fast.to_numpy(make_layer(fast, line, 2)(x, grid))
    strict = get_backend("strict")
    want = strict.to_numpy(make_layer(strict, line, 2)(strict.asarray(x), strict.asarray(grid)))
    np.testing.assert_array_equal(got, want)
    tw = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid.astype(np.float32)), "bilinear", padding, align)
    assert np.array_equal(np.isnan(got), np.isnan(tw.numpy()))


class _PatchFold(nn.Module):
    """MobileViTv2's fold of (B, C, patch pixels, patches) back to a map, written as reshape /
    permute / reshape: pnnx fuses it into nn.PixelShuffle and drops the first reshape, so the
    file feeds the (B, 32, 4, 64) tensor to the shuffle; and the inverse, a flat (B, 32, 256) map
    patchified into nn.PixelUnshuffle."""

    def forward(self, p, flat):
        c = p.shape[1]
        y = p.reshape(-1, c, 2, 2, 8, 8).permute(0, 1, 4, 2, 5, 3).reshape(-1, c, 16, 16)
        z = flat.reshape(-1, 32, 8, 2, 8, 2).permute(0, 1, 3, 5, 2, 4).reshape(-1, 128, 8, 8)
        return y, z


def test_pixel_shuffles_restore_the_reshape_pnnx_dropped(model_backend, tmp_path):
    import kuiper_xp

    g = torch.Generator().manual_seed(2)
    ins1 = (torch.randn(1, 32, 4, 64, generator=g), torch.randn(1, 32, 256, generator=g))
    ins3 = (torch.randn(3, 32, 4, 64, generator=g), torch.randn(3, 32, 256, generator=g))
    param = export_module(_PatchFold(), ins1, tmp_path, inputs2=ins3)
    text = " ".join(param.read_text().split())
    assert "nn.PixelShuffle" in text and "nn.PixelUnshuffle" in text
    graph = kuiper_xp.load(param, backend=model_backend)
    assert {r.type: r.layer.restore for r in graph.operators if r.type.startswith("nn.Pixel")} == {
        "nn.PixelShuffle": (128, 8, 8), "nn.PixelUnshuffle": (32, 16, 16)}
    got = graph(*(t.numpy() for t in ins3))
    for a, e in zip(got, _PatchFold()(*ins3)):
        assert_close(kuiper_xp.to_numpy(a), e.numpy(), rtol=1e-6)


@pytest.mark.parametrize("mode,shape,scale,dtype", [
    ("nearest", (1, 2, 7, 7), 2.1, np.float32),     # 7 -> 14 = 2n: torch's 2-D kernel maps d -> d >> 1
    ("nearest", (1, 2, 5, 5), 1.1, np.float32),     # 5 -> 5: copied
    ("nearest", (1, 2, 7, 7), 2.1, np.float64),
    ("nearest", (1, 2, 5), 1.1, np.float32),        # 1-D and 3-D nearest use the scale
    ("nearest", (1, 2, 5, 5, 5), 1.1, np.float32),
    ("bilinear", (1, 2, 3, 8), 1.3, np.float32),    # 3 rows stay 3: kept as they are
    ("linear", (1, 2, 4), 1.2, np.float32),
    ("trilinear", (1, 2, 3, 4, 8), 1.3, np.float32),
    ("bicubic", (1, 2, 3, 8), 1.3, np.float32),     # bicubic resamples such an axis
    ("nearest-exact", (1, 2, 19, 18), (2.7, 0.9), np.float64),  # 2-D: float32 coordinates
])
def test_interpolate_scale_factor_that_keeps_or_doubles_a_size(backend, tmp_path, mode, shape, scale, dtype):
    """A scale_factor whose product with a size rounds down to that size (or twice it): torch's
    kernels take shortcuts there that differ by mode and rank."""
    x = _x(*shape).astype(dtype)
    nsp = x.ndim - 2
    sf = scale if isinstance(scale, tuple) else (scale,) * nsp
    kw = {"mode": mode, "scale_factor": sf}
    params = f"mode={mode} scale_factor={_fmt(sf)}"
    if mode in ("linear", "bilinear", "trilinear", "bicubic"):
        kw["align_corners"] = False
        params += " align_corners=False"
    e = F.interpolate(torch.from_numpy(x), **kw)
    run_one_op(backend, tmp_path, "F.upsample", [x], t2n(e), params=params, keys=["input"],
               rtol=1e-5 if dtype == np.float32 else 1e-13)


def test_interpolate_nearest_float64_indices_as_torch(backend, tmp_path):
    """torch's nearest kernels compute a float64 tensor's source index in float32 (161 -> 140
    picks another element than the double computation for one output)."""
    x = np.arange(161, dtype=np.float64).reshape(1, 1, 161)
    e = F.interpolate(torch.from_numpy(x), size=(140,), mode="nearest")
    run_one_op(backend, tmp_path, "F.upsample", [x], t2n(e), params="mode=nearest size=(140)",
               keys=["input"], rtol=0.0)


class AntialiasInf(nn.Module):
    def forward(self, x):
        return (F.interpolate(x, size=(5, 6), mode="bilinear", antialias=True),
                F.interpolate(x, size=(4, 16), mode="bicubic", antialias=True))


def test_interpolate_antialias_keeps_an_inf_in_its_own_support(model_backend, tmp_path):
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 2, 17, 16)).astype(np.float32))
    x[0, 0, 2, 3] = float("inf")
    x[0, 1, 9, 12] = float("nan")
    param = export_module(AntialiasInf(), (x,), tmp_path)
    with torch.no_grad():
        want = AntialiasInf()(x)
    assert all(np.isfinite(w.numpy()).sum() > w.numel() // 2 for w in want)
    compare_graph(param, model_backend, AntialiasInf(), (x,))
