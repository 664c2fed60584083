"""More reductions and LPPool against torch: median / nanmedian, kthvalue, quantile / nanquantile
(every interpolation, q a number, a constant tensor or an input), aminmax, count_nonzero,
logcumsumexp, cummax / cummin, mode, nansum / nanmean, torch.linalg.norm / matrix_norm,
torch.norm with p=inf/-inf/0, and nn.LPPool1d/2d / F.lp_pool1d/2d. Each case is a pnnx export of a
small torch module run on every backend leg; the exports are cached per module.

Inputs of the index-returning ops have no ties (torch leaves the index of a tie to the kernel),
except where torch documents the rule (cummax/cummin: the later index)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import case_exporter
from test_layers_misc import make_layer, t2n
from torch import nn

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


class Fn(nn.Module):
    """A module around a function of its inputs (and optional submodules)."""

    def __init__(self, fn, *mods):
        super().__init__()
        self.fn, self.m = fn, nn.ModuleList(mods)

    def forward(self, *a):
        return self.fn(self, *a)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_g(seed), dtype=dtype)


def _distinct(*shape, seed=0, dtype=torch.float32):
    """Values without ties: a random permutation of 0..n-1, shifted and scaled."""
    n = int(np.prod(shape))
    return (torch.randperm(n, generator=_g(seed)).reshape(shape).to(dtype) - n / 2) * 0.25


def _with_nans(x, every=5, all_nan_row=False):
    x = x.clone()
    x.view(-1)[1::every] = float("nan")
    if all_nan_row:
        x[0, 0] = float("nan")
    return x


_NAN = float("nan")
XD = _distinct(2, 4, 6)                 # even sizes: the median is the lower middle value
XO = _distinct(3, 5, 7, seed=1)         # odd sizes
XN = _with_nans(_distinct(3, 5, 7, seed=2), every=6)
XNA = _with_nans(_distinct(3, 4, 6, seed=3), every=7, all_nan_row=True)
XI = torch.randperm(40, generator=_g(4)).reshape(5, 8).to(torch.int32) - 20
XT = torch.tensor([[1., 3., 3., 0., 5., 5., 2.], [_NAN, 1., 4., _NAN, 9., -1., 0.], [2., 2., -1., -1., 7., 7., 7.]])
XM = torch.tensor([[1, 2, 2, 3, 3, 1, 5, 0], [4, 4, 4, 1, 1, 1, 0, 0], [7, 6, 5, 4, 3, 2, 1, 7]], dtype=torch.int64)

# name -> (module, inputs, types the export must contain)
CASES = {
    # x.var(dim, correction=c) with c other than 0/1 (pnnx: ``unbiased=3``), and std/var of the whole
    # tensor (pnnx: ``aten::std`` / ``aten::var``)
    "var_correction": (Fn(lambda s, x: (x.var(-1, correction=3), torch.var(x, 1, correction=0.5, keepdim=True),
                                        x.std(0, correction=2), x.var(1, unbiased=False))), (XO,), {"torch.var"}),
    "std_var_all": (Fn(lambda s, x: (x.std(), x.var(unbiased=False), torch.var(x) * 2, torch.std(x, unbiased=False))),
                    (XO,), {"aten::std", "aten::var"}),
    "median": (Fn(lambda s, x: (torch.median(x), torch.median(x, 1), x.median(-1, keepdim=True), torch.median(x, 0))),
               (XD,), {"aten::median"}),
    "median_odd_int": (Fn(lambda s, x, i: (torch.median(x), torch.median(x, 2), torch.median(i), torch.median(i, 1))),
                       (XO, XI), {"aten::median"}),
    "median_nan": (Fn(lambda s, x: (torch.median(x), torch.median(x, 1), torch.nanmedian(x), torch.nanmedian(x, 1),
                                    torch.nanmedian(x, -1, keepdim=True))), (XN,), {"aten::median", "aten::nanmedian"}),
    "nanmedian_all_nan_row": (Fn(lambda s, x: (torch.nanmedian(x, -1)[0], torch.median(x, -1)[0])), (XNA,),
                              {"aten::nanmedian"}),
    "kthvalue": (Fn(lambda s, x, i: (torch.kthvalue(x, 2, 1), x.kthvalue(3, keepdim=True), torch.kthvalue(x, 1, 0),
                                     torch.kthvalue(x, 4, -1), torch.kthvalue(i, 5, 1))), (XO, XI), {"aten::kthvalue"}),
    "quantile_modes": (Fn(lambda s, x: tuple(torch.quantile(x, q, dim=d, keepdim=k, interpolation=m)
                                             for m in ("linear", "lower", "higher", "midpoint", "nearest")
                                             for q, d, k in ((0.3, None, False), (0.625, 1, True), (0.5, -1, False)))),
                       (XO,), {"aten::quantile"}),
    "quantile_tensor_q": (Fn(lambda s, x, q: (torch.quantile(x, torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0]), dim=-1),
                                              torch.quantile(x, q, dim=1, keepdim=True, interpolation="nearest"),
                                              torch.quantile(x, q, keepdim=True, interpolation="midpoint"),
                                              torch.quantile(x, torch.tensor(0.25), dim=0))),
                          (XD, torch.tensor([0.125, 0.5, 0.7])), {"aten::quantile"}),
    "nanquantile": (Fn(lambda s, x: (torch.nanquantile(x, 0.4, dim=1), torch.quantile(x, 0.4, dim=1),
                                     torch.nanquantile(x, 0.25, dim=2, interpolation="nearest"),
                                     torch.nanquantile(x, 0.9, interpolation="lower"),
                                     torch.nanquantile(x, 0.75, dim=-1, keepdim=True, interpolation="midpoint"))),
                    (XNA,), {"aten::nanquantile", "aten::quantile"}),
    "float64": (Fn(lambda s, x: (torch.quantile(x, 0.35, dim=1), torch.median(x, 2), torch.logcumsumexp(x, 1),
                                 torch.nanmean(x, 0), torch.linalg.norm(x, dim=-1), torch.cummax(x, 2))),
                (_distinct(3, 5, 4, seed=5, dtype=torch.float64),), {"aten::quantile", "aten::logcumsumexp"}),
    "aminmax": (Fn(lambda s, x, i: (torch.aminmax(x), torch.aminmax(x, dim=1, keepdim=True), torch.aminmax(x, dim=-1),
                                    torch.aminmax(i, dim=0), torch.aminmax(x > 0, dim=1))),
                (XN, XI), {"aten::aminmax"}),
    "count_nonzero": (Fn(lambda s, x, i: (torch.count_nonzero(x), torch.count_nonzero(x, 1),
                                          torch.count_nonzero(x, (0, 2)), torch.count_nonzero(i, -1),
                                          torch.count_nonzero(x > 0, 0))),
                      (torch.where(XN.abs() < 2, torch.zeros(()), XN), XI), {"aten::count_nonzero"}),
    "logcumsumexp": (Fn(lambda s, x, y: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x, -1), torch.logcumsumexp(y, 0))),
                     (_r(2, 9, 5) * 4, torch.tensor([[-1000., 0., 1000.], [-float("inf"), -float("inf"), 3.],
                                                     [800., -1e30, 5.], [1., 2., -float("inf")]])),
                     {"aten::logcumsumexp"}),
    "cummax_cummin": (Fn(lambda s, x, i, y: (torch.cummax(x, 1), torch.cummin(x, -1), torch.cummax(i, 0),
                                             torch.cummin(i, 1), torch.cummax(y, 0), torch.cummin(y > 0, 1))),
                      (XT, XI, _r(5, 3, 4)), {"aten::cummax", "aten::cummin"}),
    # long rows: many ties and NaNs (numpy's accumulate path), a long log-sum
    "cummax_cummin_long": (Fn(lambda s, x, i: (torch.cummax(x, 1), torch.cummin(x, 0), torch.cummax(i, -1),
                                               torch.logcumsumexp(x.nan_to_num(0.5) * 8, 1))),
                           (torch.where(torch.rand(3, 400, generator=_g(7)) < 0.01, _NAN,
                                        torch.round(torch.randn(3, 400, generator=_g(8)) * 2)),
                            torch.randint(-9, 9, (2, 300), generator=_g(9))),
                           {"aten::cummax", "aten::cummin", "aten::logcumsumexp"}),
    "mode": (Fn(lambda s, x, y: (torch.mode(x, 1), torch.mode(x, 0, keepdim=True), torch.mode(y, -1))),
             (XM, torch.tensor([[3., 1., 3., 1.], [2., 0.5, 0.5, 2.], [9., 9., 9., 1.]])), {"aten::mode"}),
    "nansum_nanmean": (Fn(lambda s, x, i: (torch.nansum(x), torch.nansum(x, 1), torch.nansum(x, (0, 2), keepdim=True),
                                           torch.nanmean(x), torch.nanmean(x, -1, keepdim=True), torch.nansum(i, 1),
                                           torch.nansum(i))),
                       (XNA, XI), {"aten::nansum", "aten::nanmean"}),
    "linalg_norm_vector": (Fn(lambda s, x: (torch.linalg.norm(x), torch.linalg.norm(x, dim=-1),
                                            torch.linalg.norm(x, ord=1, dim=1, keepdim=True),
                                            torch.linalg.norm(x, ord=float("inf"), dim=0),
                                            torch.linalg.norm(x, ord=float("-inf"), dim=2),
                                            torch.linalg.norm(x, ord=3.5, dim=1), torch.linalg.norm(x, ord=0, dim=-1),
                                            torch.linalg.norm(x[0, 0], ord=1))),
                           (_r(2, 3, 6),), {"aten::linalg_norm"}),
    "linalg_norm_matrix": (Fn(lambda s, x: (torch.linalg.norm(x, ord="fro", dim=(1, 2)),
                                            torch.linalg.norm(x, ord=1, dim=(0, 2)),
                                            torch.linalg.norm(x, ord=float("inf"), dim=(-1, 1), keepdim=True),
                                            torch.linalg.norm(x, dim=(2, 0)), torch.linalg.norm(x[0], ord=-1),
                                            torch.linalg.matrix_norm(x), torch.linalg.matrix_norm(x, ord=-1, keepdim=True),
                                            torch.linalg.matrix_norm(x, ord=float("-inf"), dim=(0, 1)))),
                           (_r(2, 3, 6),), {"aten::linalg_norm", "aten::linalg_matrix_norm"}),
    "torch_norm": (Fn(lambda s, x: (torch.norm(x, p=float("inf"), dim=1), torch.norm(x, p=float("-inf"), dim=-1),
                                    torch.norm(x, p=0, dim=1), torch.norm(x, p="fro"),
                                    torch.norm(x, p="fro", dim=(1, 2), keepdim=True))),
                   (torch.where(_r(2, 3, 6).abs() < 0.3, torch.zeros(()), _r(2, 3, 6)),), {"torch.norm"}),
    "lppool": (Fn(lambda s, x, y: (s.m[0](x), F.lp_pool1d(x, 3.0, 3, 2, ceil_mode=True), s.m[1](y),
                                   F.lp_pool2d(y, 2, 2), F.lp_pool2d(y.abs(), 1.5, (3, 2), stride=(1, 2), ceil_mode=True),
                                   s.m[2](x[0])),
                  nn.LPPool1d(2, 3), nn.LPPool2d(1.5, (3, 2), stride=(2, 1)), nn.LPPool1d(4, 2)),
               (_r(2, 3, 8), _r(2, 3, 7, 6, seed=1)), {"nn.LPPool1d", "F.lp_pool1d", "nn.LPPool2d", "F.lp_pool2d"}),
    "lppool_f64": (Fn(lambda s, x: (s.m[0](x), F.lp_pool2d(x, 3, 2, ceil_mode=True)), nn.LPPool2d(2, 2)),
                   (_r(1, 2, 5, 5, dtype=torch.float64),), {"nn.LPPool2d", "F.lp_pool2d"}),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return case_exporter(tmp_path_factory, CASES)


def _flat(out):
    """torch's nested outputs (tuples, return_types) flattened in order, as pnnx flattens them."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    module, inputs, _ = CASES[name]
    param = exported(name)
    with torch.no_grad():
        want = _flat(module.eval()(*inputs))
    g = kuiper_xp.load(param, backend=backend)
    got = g(*[t2n(t) for t in inputs])
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        a = backend.to_numpy(a)
        assert a.shape == tuple(e.shape), (k, a.shape, tuple(e.shape))
        assert a.dtype == t2n(e).dtype, (k, a.dtype, t2n(e).dtype)
        assert_close(a, t2n(e), rtol=1e-12 if e.dtype == torch.float64 else 2e-6, what=f"{name} output {k}")


# -- forms this torch build cannot trace, and errors -----------------------------------------------
def _layer(backend, op_type, n_in, n_out=1):
    ins = " ".join(str(i) for i in range(n_in + n_out))
    return make_layer(backend, f"{op_type} op {n_in} {n_out} {ins}", n_in)


@pytest.mark.parametrize("op_type,args,ord_", [
    ("aten::linalg_norm", ("nuc", [1, 2], False, None), "nuc"),
    ("aten::linalg_norm", (2, [-2, -1], True, None), 2),
    ("aten::linalg_matrix_norm", (-2, [0, 2], False, None), -2),
    ("aten::linalg_norm", ("nuc", None, False, None), "nuc"),
])
def test_singular_value_norms(backend, op_type, args, ord_):
    """ord='nuc' and +-2 (this torch build has no LAPACK to trace or compute them: numpy's
    linalg.norm is the reference)."""
    x = t2n(_r(2, 3, 5)) if args[1] is not None else t2n(_r(4, 3))
    layer = _layer(backend, op_type, 5)
    got = layer(backend.asarray(x), *args)
    axes = tuple(args[1]) if args[1] is not None else (0, 1)
    want = np.linalg.norm(x.astype(np.float64), ord=ord_, axis=axes, keepdims=args[2]).astype(np.float32)
    assert_close(got, want, rtol=1e-5, what=f"{op_type} ord={ord_!r}")


def test_norm_nuc_parameter(backend):
    layer = make_layer(backend, "torch.norm op 1 1 0 1 dim=(0,1) keepdim=False p=nuc")
    x = t2n(_r(4, 3, 2))
    want = np.linalg.norm(x.astype(np.float64).transpose(2, 0, 1), ord="nuc", axis=(1, 2)).astype(np.float32)
    assert_close(layer(backend.asarray(x)), want, rtol=1e-5, what="torch.norm p=nuc")


def test_errors_name_the_operator(backend):
    x = backend.asarray(t2n(_r(2, 3, 5)))
    with pytest.raises(ShapeError, match=r"aten::kthvalue 'op'.*k=6 is out of range for dim 2 of size 5"):
        _layer(backend, "aten::kthvalue", 4, 2)(x, 6, -1, False)
    with pytest.raises(ShapeError, match=r"aten::kthvalue 'op'.*k=0"):
        _layer(backend, "aten::kthvalue", 4, 2)(x, 0, 1, False)
    q = _layer(backend, "aten::quantile", 5)
    with pytest.raises(ShapeError, match=r"aten::quantile 'op'.*\[0, 1\]"):
        q(x, backend.asarray(np.array([0.5, 1.5], np.float32)), 1, False, "linear")
    with pytest.raises(ShapeError, match=r"aten::quantile 'op'.*\[0, 1\]"):
        q(x, -0.1, None, False, "linear")
    with pytest.raises(LayerParameterError, match=r"aten::quantile 'op'.*interpolation='cubic'"):
        q(x, 0.5, 1, False, "cubic")
    with pytest.raises(ShapeError, match=r"aten::quantile 'op'.*int32 tensor"):
        q(backend.asarray(t2n(XI)), 0.5, 1, False, "linear")
    n = _layer(backend, "aten::linalg_norm", 5)
    with pytest.raises(LayerParameterError, match=r"aten::linalg_norm 'op'.*ord='nuc' is a matrix norm"):
        n(x, "nuc", [1], False, None)
    with pytest.raises(LayerParameterError, match=r"aten::linalg_norm 'op'.*matrix norm ord=3"):
        n(x, 3, [1, 2], False, None)
    with pytest.raises(ShapeError, match=r"aten::linalg_norm 'op'.*1-D or 2-D input"):
        n(x, 1, None, False, None)
    with pytest.raises(ShapeError, match=r"aten::median 'op'.*bool"):
        make_layer(backend, "aten::median op 1 1 0 1")(backend.asarray(np.array([True, False])))
    with pytest.raises(ShapeError, match=r"aten::logcumsumexp 'op'.*int32"):
        _layer(backend, "aten::logcumsumexp", 2)(backend.asarray(t2n(XI)), 0)
    with pytest.raises(ShapeError, match=r"aten::nanmean 'op'.*int32"):
        _layer(backend, "aten::nanmean", 4)(backend.asarray(t2n(XI)), None, False, None)
    with pytest.raises(ShapeError, match=r"aten::cummax.*dim 3 is out of range"):
        _layer(backend, "aten::cummax", 2, 2)(x, 3)


@pytest.mark.parametrize("line,needle", [
    ("nn.LPPool2d op 1 1 0 1 ceil_mode=False kernel_size=(2,2) norm_type=0 stride=(2,2)", "norm_type=0"),
    ("nn.LPPool1d op 1 1 0 1 ceil_mode=False kernel_size=0 norm_type=2.0 stride=1", "out of range"),
    ("aten::median op 1 3 0 1 2 3", "3 outputs"),
])
def test_bad_parameters_are_refused_at_build(backend, line, needle):
    with pytest.raises(LayerParameterError, match=needle):
        make_layer(backend, line)


def test_mode_index_points_at_the_mode_even_when_it_is_nan(backend):
    """A row whose mode is NaN gave index -1 (NaN never equals itself), which a later gather
    would wrap silently; the index now points at a NaN of the row (torch's choice of mode among
    NaNs is its own; rows without NaN match torch exactly)."""
    from test_layers_misc import make_layer

    layer = make_layer(backend, "aten::mode m 3 2 0 1 2 3 4", 3)
    nan = float("nan")
    x = np.array([[nan, nan, nan, nan], [1.0, 2.0, 2.0, 3.0], [nan, 5.0, 5.0, 7.0]], np.float32)
    values, idx = (backend.to_numpy(a) for a in layer(backend.asarray(x), -1, False))
    assert (idx >= 0).all()
    picked = x[np.arange(3), idx]
    assert np.array_equal(picked, values, equal_nan=True)
    want = torch.mode(torch.from_numpy(x[1:2]), -1)
    assert values[1] == want.values.item() and idx[1] == want.indices.item()


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_median_and_kthvalue_by_partition_equal_the_stable_sort(dtype):
    """numpy's partition path (no NaN) gives the value and index the stable sort gives (the
    generic path, on the strict backend): many ties, -0.0 beside 0.0, odd and even rows; the
    values are torch's."""
    from kuiper_xp.backends import get_backend

    rng = np.random.default_rng(6)
    x = np.round(rng.standard_normal((5, 3, 301)) * 3).astype(dtype)
    if dtype == np.float32:
        x[0, 0, :5] = [0.0, -0.0, -0.0, 0.0, -0.0]
    fast, strict = get_backend("numpy"), get_backend("strict")
    assert fast.fast.kth_stable(x, 150) is not None
    for line, args in (("aten::median md 3 2 0 1 2 3 4", (2, False)), ("aten::median md 3 2 0 1 2 3 4", (1, True)),
                       ("aten::kthvalue kv 4 2 0 1 2 3 4 5", (37, 2, False)),
                       ("aten::kthvalue kv 4 2 0 1 2 3 4 5", (3, 0, True))):
        n_in = int(line.split()[2])
        got = [fast.to_numpy(a) for a in make_layer(fast, line, n_in)(x, *args)]
        want = [strict.to_numpy(a) for a in make_layer(strict, line, n_in)(strict.asarray(x), *args)]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
            assert g.dtype == w.dtype
        tv = (torch.median(torch.from_numpy(x), args[0], keepdim=args[1]) if "median" in line
              else torch.kthvalue(torch.from_numpy(x), args[0], args[1], keepdim=args[2]))
        np.testing.assert_array_equal(got[0], tv.values.numpy())
