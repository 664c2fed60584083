"""Array builders and statistics (kuiper_xp/layers/arrays.py): pnnx exports of small torch
modules run on every backend leg and compared with torch, plus the errors bad operands get."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import assert_close
from helpers import Fn, case_exporter
from test_layers_misc import make_layer, t2n

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ResourceLimitError, ShapeError


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _i(*shape, seed=0, dtype=torch.int64, lo=-5, hi=6):
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


D = torch.float64
NAN = float("nan")

# name -> (module, inputs, types the export must contain[, inputs2 for dynamic shapes]); several
# ops per module keep the number of pnnx exports (about 0.3 s each) down. pnnx cannot export a
# graph with bool inputs: bools are made inside. pnnx hangs on a graph with a zero-sized tensor
# (``x[:, :0]``): empty operands are checked on the layers directly (test_empty_operands_match_torch).
CASES = {
    "movedim": (
        Fn(lambda x, i: (torch.movedim(x, 0, -1), torch.moveaxis(x, [0, 1], [2, 0]), x.movedim(1, 0),
                         torch.movedim(x, (-1, 0), (0, -1)), torch.movedim(i, 2, 1), torch.movedim(x, 1, 1) * 2,
                         torch.movedim(x[..., :1], [0, 1, 2], [1, 2, 0]))),
        (_r(2, 3, 4), _i(2, 1, 3)), {"aten::movedim"}),
    "unfold": (
        Fn(lambda x, v, i: (x.unfold(2, 2, 1), v.unfold(0, 3, 2), x.unfold(-1, 4, 4), x.unfold(-3, 1, 5),
                            v.unfold(0, 6, 1), v.unfold(0, 0, 3), i.unfold(1, 2, 2), (v > 0).unfold(-1, 4, 1),
                            x.unfold(1, 2, 1).unfold(1, 2, 1))),
        (_r(2, 3, 4), _r(6, seed=1), _i(3, 5)), {"aten::unfold"}),
    # audio framing: a dynamic-length signal cut into frames of 4 with hop 2
    "unfold_dyn": (Fn(lambda v: v.unfold(-1, 4, 2) * 2), (_r(2, 9),), {"aten::unfold"}, (_r(3, 13, seed=1),)),
    "flips_msort": (
        Fn(lambda m, x, i, n: (torch.fliplr(m), torch.flipud(m), torch.msort(m), x.fliplr(), x.flipud(),
                               torch.fliplr(i), torch.msort(i), torch.msort(x), torch.msort(n), torch.msort(m > 0),
                               torch.flipud(m[0]))),
        (_r(3, 5), _r(2, 3, 4, seed=1), _i(4, 3), torch.tensor([[1.0, NAN], [NAN, -1.0], [0.5, 2.0]])),
        {"aten::fliplr", "aten::flipud", "aten::msort"}),
    "diff": (
        Fn(lambda m, v, i, j: (torch.diff(m), torch.diff(m, n=2, dim=0), torch.diff(v, prepend=v[:2], append=v[:1]),
                               torch.diff(m > 0), torch.diff(m > 0, n=2, dim=0), torch.diff(m, n=0),
                               torch.diff(m, n=9), torch.diff(i, n=3), torch.diff(j), torch.diff(j, append=i[:, :2]),
                               torch.diff(i, prepend=m[:, :1], dim=-1), torch.diff((v > 0)[None], prepend=m[:1, :2]),
                               torch.diff(m, dim=-2, prepend=m[:1], append=m) * 2)),
        (_r(3, 5), _r(6, seed=1), _i(3, 4), _i(3, 4, seed=1, dtype=torch.int32)), {"aten::diff"}),
    "diff_f64_u8": (
        Fn(lambda m, u: (torch.diff(m, n=2), torch.diff(m, prepend=m[:, :1] * 0), torch.diff(u), torch.diff(u, dim=0))),
        (_r(3, 5, dtype=D), _i(3, 4, lo=0, hi=250, dtype=torch.uint8)), {"aten::diff"}),
    "vander": (
        Fn(lambda v, i, s: (torch.vander(v), torch.vander(v, N=3, increasing=True), torch.vander(i),
                            torch.vander(i, 4, True), torch.vander(v > 0, N=3), torch.vander(s), torch.vander(v, N=1),
                            torch.vander(i, N=0))),  # (pnnx hangs exporting vander of an empty tensor)
        (_r(4), _i(3, seed=1), _i(5, seed=2, dtype=torch.int16)), {"aten::vander"}),
    "vander_f64": (Fn(lambda v: torch.vander(v, N=5)), (_r(4, dtype=D),), {"aten::vander"}),
    # coordinate grids: the count from a shape (dynamic), dtypes by code, a bound from a shape
    "linspace": (
        Fn(lambda x: (x * torch.linspace(-1, 1, x.shape[-1]), torch.linspace(0, 10, x.shape[-1], dtype=torch.float64),
                      torch.linspace(2, 7, x.shape[-1], dtype=torch.int64), torch.linspace(x.shape[0], 3.5, 4),
                      torch.linspace(-3.3, 1e3, 7) * 1, torch.linspace(5, 5, 1) + x[0, :1])),
        (_r(2, 6),), {"aten::linspace"}, (_r(3, 9, seed=1),)),
    # an identity of a size from the input's shape (SchNet-style masks of the diagonal); dtypes by code
    "eye": (
        Fn(lambda x: (x * (1 - torch.eye(x.shape[1])), torch.eye(x.shape[0], x.shape[1], dtype=torch.int64),
                      torch.eye(x.shape[1], 3, dtype=torch.float64), torch.eye(x.shape[0] - 2, x.shape[1]) + 1)),
        (_r(2, 5, 5),), {"aten::eye"}, (_r(4, 6, 6, seed=1),)),
    # window functions of a length from the input's shape (a spectrogram's window): every kind,
    # periodic and symmetric, hamming's alpha/beta, kaiser's beta, float64 by code
    "windows": (
        Fn(lambda x: (x * torch.hann_window(x.shape[1]), x * torch.hann_window(x.shape[1], periodic=False),
                      x * torch.hamming_window(x.shape[1]), x * torch.hamming_window(x.shape[1], False, 0.5, 0.4),
                      x * torch.blackman_window(x.shape[1]), x * torch.bartlett_window(x.shape[1], periodic=False),
                      x * torch.bartlett_window(x.shape[1]), x * torch.kaiser_window(x.shape[1], True, 8.0),
                      x * torch.kaiser_window(x.shape[1], False), torch.hann_window(x.shape[1], dtype=torch.float64),
                      torch.blackman_window(x.shape[0] - 1))),
        (_r(2, 6),), {"aten::hann_window", "aten::hamming_window", "aten::blackman_window", "aten::bartlett_window",
                      "aten::kaiser_window"}, (_r(3, 11, seed=1),)),
    "combinations": (
        Fn(lambda v, i: (torch.combinations(v), torch.combinations(v, r=3, with_replacement=True),
                         torch.combinations(v, r=1), torch.combinations(v, r=5), torch.combinations(v, r=0),
                         torch.combinations(i, 2, True), torch.combinations(v > 0, r=2), torch.combinations(v[:1]))),
        (_r(4), _i(3, seed=1)), {"aten::combinations"}),
    "trapezoid": (
        Fn(lambda m, t, i, b: (torch.trapezoid(m), torch.trapezoid(m, dx=0.5, dim=0), torch.trapezoid(m, m * 2),
                               torch.trapz(m), torch.trapz(m, t), torch.trapz(m, dx=2), torch.trapezoid(m, x=t[:3], dim=0),
                               torch.trapezoid(b, m), torch.trapezoid(b, m[None], dim=1), torch.trapezoid(i),
                               torch.trapezoid(i, dx=2.5), torch.trapezoid(i, i), torch.trapezoid(i, m[:, :4]),
                               torch.trapezoid(m[:, :1]),
                               torch.trapezoid(m, t, dim=-1))),
        (_r(3, 5), torch.arange(5.0) ** 2, _i(3, 4), _r(2, 3, 5, seed=1)), {"aten::trapezoid", "aten::trapz"}),
    "cumulative_trapezoid": (
        Fn(lambda m, t, i, j: (torch.cumulative_trapezoid(m), torch.cumulative_trapezoid(m, dx=2.0, dim=0),
                               torch.cumulative_trapezoid(m, t), torch.cumulative_trapezoid(m, x=m * 3, dim=0),
                               torch.cumulative_trapezoid(i), torch.cumulative_trapezoid(i, dx=3),
                               torch.cumulative_trapezoid(i, i), torch.cumulative_trapezoid(j * 40, j),
                               torch.cumulative_trapezoid(m[:, :1]))),
        (_r(3, 5), torch.arange(5.0) ** 2, _i(3, 4), _i(2, 6, seed=1, dtype=torch.int8)),
        {"aten::cumulative_trapezoid"}),
    "trapezoid_f64": (
        Fn(lambda m, t: (torch.trapezoid(m), torch.trapezoid(m, t), torch.cumulative_trapezoid(m, dx=0.25),
                         torch.cumulative_trapezoid(m, t))),
        (_r(3, 5, dtype=D), torch.arange(5.0, dtype=D).sqrt()), {"aten::trapezoid", "aten::cumulative_trapezoid"}),
    "cov": (
        Fn(lambda m, aw, i, v: (torch.cov(m), torch.cov(m, correction=0), torch.cov(m, fweights=torch.arange(5), aweights=aw),
                                torch.cov(m, aweights=aw), torch.cov(m, fweights=torch.tensor([1, 2, 0, 3, 1])),
                                torch.cov(m, correction=3, aweights=aw, fweights=torch.arange(1, 6, dtype=torch.int32)),
                                torch.cov(i), torch.cov(i, aweights=aw), torch.cov(v), torch.cov(m[:1]),
                                torch.cov(m, correction=5), torch.cov(m[:, :1]), torch.cov(m[:, :1], aweights=aw[:1]),
                                torch.cov(i[:, :1], fweights=torch.tensor([2])), torch.cov(m, correction=7),
                                torch.cov(m[:, :1], aweights=aw[:1], correction=0))),
        (_r(3, 5), torch.rand(5, generator=torch.Generator().manual_seed(1)) + 0.1, _i(3, 5), _r(6, seed=2)),
        {"aten::cov"}),
    "corrcoef": (
        Fn(lambda m, i, v, z: (torch.corrcoef(m), torch.corrcoef(i), torch.corrcoef(v), torch.corrcoef(z),
                               torch.corrcoef(m[:1]), torch.corrcoef(v[None] * 0))),
        (_r(3, 5), _i(4, 6), _r(6, seed=2), torch.tensor([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])), {"aten::corrcoef"}),
    "cov_f64": (
        Fn(lambda m, aw: (torch.cov(m), torch.cov(m, aweights=aw, fweights=torch.arange(5)), torch.corrcoef(m),
                          torch.cov(m.float(), aweights=aw))),
        (_r(3, 5, dtype=D), torch.rand(5, generator=torch.Generator().manual_seed(1), dtype=D)),
        {"aten::cov", "aten::corrcoef"}),
    "renorm_pdist": (
        Fn(lambda x, m: (torch.renorm(x, 2, 1, 1.0), x.renorm(1, 0, 5.0), torch.renorm(x, float("inf"), -1, 0.5),
                         torch.renorm(x, 3, 2, 2.0), torch.renorm(m, 2, 0, 0.0), torch.renorm(m, 0.5, 1, 100.0),
                         torch.pdist(m), torch.pdist(m, p=1), torch.pdist(m, 0), torch.pdist(m, float("inf")),
                         torch.pdist(m, 1.5), torch.pdist(m[:1]), torch.pdist(x[0]) * 2)),
        (_r(2, 3, 4) * 2, torch.tensor([[0.0, 1.0, 2.0], [0.0, 3.0, 2.5], [1.0, -1.0, 0.0], [0.0, 1.0, 2.0]])),
        {"aten::renorm", "aten::pdist"}),
    "renorm_pdist_f64": (
        Fn(lambda x: (torch.renorm(x, 2, 0, 1.0), torch.pdist(x[0]), torch.pdist(x[1], 3))),
        (_r(2, 3, 4, dtype=D) * 2,), {"aten::renorm", "aten::pdist"}),
    "atleast_ravel_take": (
        Fn(lambda x, v, m, i: (torch.atleast_1d(v.sum()), torch.atleast_1d(v), torch.atleast_2d(v.sum()),
                               torch.atleast_2d(v), torch.atleast_2d(x), torch.atleast_3d(v.sum()), torch.atleast_3d(v),
                               torch.atleast_3d(m), torch.atleast_3d(x), *torch.atleast_2d((m, v)),
                               *torch.atleast_3d([m]), torch.ravel(x), torch.ravel(m.transpose(0, 1)),
                               torch.take(x, i), x.take(i[0]), torch.take(m, i[:1, :1]) + 1, torch.flatten(v.sum()),
                               torch.swapaxes(x, 0, 2), torch.swapdims(x, -1, 1))),
        (_r(2, 3, 4), _r(6, seed=1), _i(3, 5, seed=2), torch.tensor([[0, 5], [-1, 14], [-15, 3]])),
        {"aten::atleast_1d", "aten::atleast_2d", "aten::atleast_3d", "aten::ravel", "aten::take"}),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return case_exporter(tmp_path_factory, CASES)


def _torch(module, inputs):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # cov's degrees-of-freedom warning
        want = module.eval()(*inputs)
    return want if isinstance(want, tuple) else (want,)


def _run(backend, param, inputs):
    g = kuiper_xp.load(param, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 0 / 0 in cov with no degrees of freedom
        return g(*[t2n(t) for t in inputs])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    module, inputs, *_ = CASES[name]
    param = exported(name)
    want = _torch(module, inputs)
    got = _run(backend, param, inputs)
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        assert_close(backend.to_numpy(a), t2n(e), rtol=1e-5, what=f"{name} output {k}")
    if len(CASES[name]) > 3:  # a dynamic export: its other shapes too
        inputs2 = CASES[name][3]
        for k, (a, e) in enumerate(zip(_run(backend, param, inputs2), _torch(module, inputs2))):
            assert_close(backend.to_numpy(a), t2n(e), rtol=1e-5, what=f"{name} output {k}, second shape")


def test_dynamic_length(backend, exported):
    """The frame count of an unfold follows the input length of a dynamic-shape export."""
    module, _, _, inputs2 = CASES["unfold_dyn"]
    for inputs in (inputs2, (_r(1, 4, seed=3),)):
        (got,) = _run(backend, exported("unfold_dyn"), inputs)
        assert_close(backend.to_numpy(got), t2n(_torch(module, inputs)[0]), what="unfold_dyn")


def test_empty_operands_match_torch(backend):
    """Zero-sized operands (not exportable: pnnx hangs on them), fed to the layers directly."""
    a = backend.asarray
    m, i = _r(3, 5), _i(3, 4)
    tz = make_layer(backend, "aten::trapezoid tz 3 1 0 1 2 3", 3)
    ct = make_layer(backend, "aten::cumulative_trapezoid ct 3 1 0 1 2 3", 3)
    pd = make_layer(backend, "aten::pdist pd 2 1 0 1 2", 2)
    for got, want, what in ((tz(a(t2n(m[:, :0])), 1, -1), torch.trapezoid(m[:, :0]), "trapezoid"),
                            (tz(a(t2n(i[:, :0])), 1, -1), torch.trapezoid(i[:, :0]), "int trapezoid"),
                            (ct(a(t2n(m[:, :0])), 1, -1), torch.cumulative_trapezoid(m[:, :0]), "cumulative_trapezoid"),
                            (pd(a(t2n(m[:, :0])), 2.0), torch.pdist(m[:, :0]), "pdist")):
        assert_close(backend.to_numpy(got), t2n(want), what=what)


# ---- errors ----------------------------------------------------------------------------------


def _arr(backend, *shape, dtype=np.float32):
    return backend.asarray(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape))


def test_shape_builders_reject_bad_operands(backend):
    md = make_layer(backend, "aten::movedim md 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::movedim 'md': source \(0, 1\) and destination \(1,\) should have"):
        md(_arr(backend, 2, 3), [0, 1], [1])
    with pytest.raises(ShapeError, match=r"aten::movedim 'md': source \(0, -2\) repeats a dimension"):
        md(_arr(backend, 2, 3), [0, -2], [0, 1])
    with pytest.raises(ShapeError, match=r"aten::movedim 'md': destination 2 is out of range"):
        md(_arr(backend, 2, 3), 0, 2)
    uf = make_layer(backend, "aten::unfold uf 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::unfold 'uf': maximum size for tensor at dimension 1 is 3 but size "
                                         r"is 4"):
        uf(_arr(backend, 2, 3), -1, 4, 1)
    with pytest.raises(ShapeError, match=r"aten::unfold 'uf': step is 0 but must be > 0"):
        uf(_arr(backend, 2, 3), 0, 1, 0)
    with pytest.raises(ShapeError, match=r"aten::unfold 'uf': size is -1 but must be >= 0"):
        uf(_arr(backend, 2, 3), 0, -1, 1)
    with pytest.raises(ShapeError, match=r"aten::unfold 'uf': dimension 2 is out of range"):
        uf(_arr(backend, 2, 3), 2, 1, 1)
    zero = uf(backend.asarray(np.float32(3.0)), 0, 1, 1)
    assert backend.to_numpy(zero).tolist() == [3.0]
    with pytest.raises(ShapeError, match=r"aten::fliplr 'fl': input must be >= 2-d"):
        make_layer(backend, "aten::fliplr fl 1 1 0 1")(_arr(backend, 3))
    with pytest.raises(ShapeError, match=r"aten::flipud 'fu': input must be >= 1-d"):
        make_layer(backend, "aten::flipud fu 1 1 0 1")(backend.asarray(np.float32(1.0)))
    tk = make_layer(backend, "aten::take tk 2 1 0 1 2", 2)
    with pytest.raises(ShapeError, match=r"aten::take 'tk': index 6 is out of range for a tensor of 6 elements"):
        tk(_arr(backend, 2, 3), backend.asarray(np.array([0, 6])))
    with pytest.raises(ShapeError, match=r"aten::take 'tk': index -7 is out of range"):
        tk(_arr(backend, 2, 3), backend.asarray(np.array([-7])))
    with pytest.raises(ShapeError, match=r"aten::take 'tk': expected an int64 index tensor, found int32"):
        tk(_arr(backend, 2, 3), backend.asarray(np.array([0], dtype=np.int32)))
    with pytest.raises(LayerParameterError, match=r"aten::unfold.*expected 4 input\(s\), found 2"):
        make_layer(backend, "aten::unfold uf 2 1 0 1 2", 2)


def test_diff_vander_combinations_reject_bad_operands(backend):
    df = make_layer(backend, "aten::diff df 5 1 0 1 2 3 4 5", 5)
    with pytest.raises(ShapeError, match=r"aten::diff 'df': diff expects input to be at least one-dimensional"):
        df(backend.asarray(np.float32(1.0)), 1, -1, None, None)
    with pytest.raises(ShapeError, match=r"aten::diff 'df': order must be non-negative but got -1"):
        df(_arr(backend, 3), -1, -1, None, None)
    with pytest.raises(ShapeError, match=r"aten::diff 'df': prepend should have the same number of dims"):
        df(_arr(backend, 2, 3), 1, -1, _arr(backend, 3), None)
    with pytest.raises(ShapeError, match=r"aten::diff 'df': the shape of append \(3, 1\) should match the input's "
                                         r"\(2, 3\) except along dim 1"):
        df(_arr(backend, 2, 3), 1, 1, None, _arr(backend, 3, 1))
    vd = make_layer(backend, "aten::vander vd 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::vander 'vd': x must be a one-dimensional tensor"):
        vd(_arr(backend, 2, 2), None, False)
    with pytest.raises(ShapeError, match=r"aten::vander 'vd': N must be non-negative"):
        vd(_arr(backend, 3), -1, False)
    empty = vd(backend.asarray(np.zeros(0, dtype=np.float32)), None, False)  # (not exportable: pnnx hangs)
    assert_close(backend.to_numpy(empty), t2n(torch.vander(torch.zeros(0))), what="vander of nothing")
    ey = make_layer(backend, "aten::eye ey 5 1 0 1 2 3 4 5", 5)
    with pytest.raises(ShapeError, match=r"aten::eye 'ey': n and m must be non-negative, found -2 and -2"):
        ey(-2, None, None, "cpu", False)
    with pytest.raises(ResourceLimitError, match=r"aten::eye 'ey': the output would have 10,000,000,000,000,000 "):
        ey(10**8, None, None, "cpu", False)
    with pytest.raises(ShapeError, match=r"aten::eye 'ey': unsupported dtype code 99"):
        ey(3, 99, None, "cpu", False)
    with pytest.raises(LayerParameterError, match=r"aten::eye.*expected 5 or 6 inputs"):
        make_layer(backend, "aten::eye ey 2 1 0 1 2", 2)
    hw = make_layer(backend, "aten::hann_window hw 5 1 0 1 2 3 4 5", 5)
    with pytest.raises(ShapeError, match=r"aten::hann_window 'hw': window_length must be non-negative, found -3"):
        hw(-3, None, None, "cpu", False)
    with pytest.raises(ShapeError, match=r"aten::hann_window 'hw': window functions need a floating dtype, found int64"):
        hw(4, 4, None, "cpu", False)
    with pytest.raises(LayerParameterError, match=r"aten::hann_window.*expected 5 to 6 inputs"):
        make_layer(backend, "aten::hann_window hw 7 1 0 1 2 3 4 5 6 7", 7)
    cb = make_layer(backend, "aten::combinations cb 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::combinations 'cb': expects a 1-d vector, found shape \(2, 2\)"):
        cb(_arr(backend, 2, 2), 2, False)
    with pytest.raises(ShapeError, match=r"aten::combinations 'cb': r should be a non-negative number, found -1"):
        cb(_arr(backend, 3), -1, False)


def test_trapezoid_rejects_bad_operands(backend):
    tz = make_layer(backend, "aten::trapezoid tz 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::trapezoid 'tz': there must be one x value for each sample point, "
                                         r"found 4 x values for 5 samples"):
        tz(_arr(backend, 3, 5), _arr(backend, 4), -1)
    with pytest.raises(ShapeError, match=r"aten::trapezoid 'tz': received a bool input"):
        tz(backend.asarray(np.ones((2, 3), dtype=bool)), 1, -1)
    with pytest.raises(ShapeError, match=r"aten::trapezoid 'tz': dx should be a real number, found True"):
        tz(_arr(backend, 2, 3), True, -1)
    with pytest.raises(ShapeError, match=r"aten::trapezoid 'tz': sample spacings of shape \(1, 4\) do not broadcast"):
        tz(_arr(backend, 3, 5), _arr(backend, 2, 4), 0)
    # (x of 2 samples along dim 0 has one spacing, which torch broadcasts over y's two intervals)
    got = tz(_arr(backend, 3, 5), _arr(backend, 2, 5), 0)
    want = torch.trapezoid(torch.arange(15.0).reshape(3, 5), torch.arange(10.0).reshape(2, 5), dim=0)
    assert_close(backend.to_numpy(got), t2n(want), what="one spacing broadcast")
    with pytest.raises(ShapeError, match=r"aten::trapezoid 'tz': dim 2 is out of range"):
        tz(_arr(backend, 3, 5), 1.0, 2)
    ct = make_layer(backend, "aten::cumulative_trapezoid ct 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::cumulative_trapezoid 'ct': received a bool input"):
        ct(_arr(backend, 2, 3), backend.asarray(np.ones(3, dtype=bool)), -1)


def test_statistics_reject_bad_operands(backend):
    cv = make_layer(backend, "aten::cov cv 4 1 0 1 2 3 4", 4)
    x = _arr(backend, 2, 4)
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': expected input to have two or fewer dimensions"):
        cv(_arr(backend, 2, 2, 2), 1, None, None)
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': bool dtype is not supported"):
        cv(backend.asarray(np.ones((2, 3), dtype=bool)), 1, None, None)
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': expected fweights to have integral dtype, found float32"):
        cv(x, 1, _arr(backend, 4), None)
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': expected aweights to have floating point dtype, found int64"):
        cv(x, 1, None, _arr(backend, 4, dtype=np.int64))
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': expected fweights to have as many elements as there are "
                                         r"observations in the input, found 3 != 4"):
        cv(x, 1, _arr(backend, 3, dtype=np.int64), None)
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': aweights cannot be negative"):
        cv(x, 1, None, backend.asarray(np.array([1.0, -1.0, 0.0, 1.0], dtype=np.float32)))
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': weights sum to zero"):
        cv(x, 1, backend.asarray(np.zeros(4, dtype=np.int64)), None)
    with pytest.raises(ShapeError, match=r"aten::cov 'cv': expected fweights to have one or fewer dimensions"):
        cv(x, 1, _arr(backend, 2, 2, dtype=np.int64), None)
    cc = make_layer(backend, "aten::corrcoef cc 1 1 0 1")
    with pytest.raises(ShapeError, match=r"aten::corrcoef 'cc': expected input to have two or fewer dimensions"):
        cc(_arr(backend, 1, 2, 3))
    rn = make_layer(backend, "aten::renorm rn 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::renorm 'rn': non-positive norm p=0.0 not supported"):
        rn(_arr(backend, 2, 3), 0, 0, 1.0)
    with pytest.raises(ShapeError, match=r"aten::renorm 'rn': expected maxnorm to be >= 0 but got -1.0"):
        rn(_arr(backend, 2, 3), 2, 0, -1.0)
    with pytest.raises(ShapeError, match=r"aten::renorm 'rn': input needs at least 2 dimensions"):
        rn(_arr(backend, 3), 2, 0, 1.0)
    with pytest.raises(ShapeError, match=r"aten::renorm 'rn': expected a floating point tensor, found int64"):
        rn(_arr(backend, 2, 3, dtype=np.int64), 2, 0, 1.0)
    pd = make_layer(backend, "aten::pdist pd 2 1 0 1 2", 2)
    with pytest.raises(ShapeError, match=r"aten::pdist 'pd': only supports 2-d tensors, found shape \(3,\)"):
        pd(_arr(backend, 3), 2.0)
    with pytest.raises(ShapeError, match=r"aten::pdist 'pd': only supports floating-point dtypes, found int64"):
        pd(_arr(backend, 2, 3, dtype=np.int64), 2.0)
    with pytest.raises(ShapeError, match=r"aten::pdist 'pd': only supports non-negative p values, found -1.0"):
        pd(_arr(backend, 2, 3), -1)


@pytest.mark.parametrize("p", [2.0, 1.0, 0.5, float("inf")])
def test_pdist_in_blocks_of_pairs(backend, monkeypatch, p):
    """The pairs' differences in blocks (the last one short), in torch's row-major pair order."""
    from kuiper_xp.layers import arrays

    monkeypatch.setattr(arrays, "PDIST_BLOCK_ELEMENTS", 50)
    x = _r(23, 7)
    pd = make_layer(backend, "aten::pdist pd 2 1 0 1 2", 2)
    assert_close(backend.to_numpy(pd(backend.asarray(t2n(x)), p)), t2n(torch.pdist(x, p)), rtol=1e-5, what=f"p={p}")
