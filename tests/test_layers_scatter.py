"""Writes through indices and scatters (Tensor.index_put, index_add, scatter_add, scatter_reduce,
masked_scatter, slice/select/diagonal_scatter), take_along_dim, diagonals (diag, diagonal,
diag_embed), bucketize / searchsorted / histc, index_fill / index_copy / isin, and the operators
whose output shape depends on the data (nonzero, argwhere, masked_select, unique,
unique_consecutive, one-argument where, bincount): pnnx exports of small torch modules run on
every backend leg and compared with torch; duplicates in scatters must add up exactly like torch;
a graph traced with one count of non-zeros must run on inputs with another."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_close
from helpers import Fn, bad_value, case_exporter
from test_layers_misc import make_layer, t2n

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _t(v, dtype=None):
    return torch.tensor(v, dtype=dtype)


def _set(x, key, v):
    y = x.clone()
    y[key] = v
    return y


def _index_put(x, i, j, v, w):
    return (_set(x, i, v),  # x[idx] = v (values broadcast over rows, a negative index)
            x.index_put((j,), w, accumulate=True),  # duplicates add up
            x.index_put((j, j % 3), w[:, 0], accumulate=True),  # two index arrays, duplicate pairs
            x.index_put((j,), torch.tensor(2.0), accumulate=True))  # a scalar values parameter


def _index_put_nd(x, i, j, s, v):
    return (_set(x, (slice(None), i), v),  # x[:, idx] = v
            _set(x, (i[:2], slice(None), j), v[:2, :, 0]),  # x[i, :, j] = v: apart, the index dims go first
            _set(x, s > 0, x[0, 0]),  # a (4, 5) mask over the leading dims, values broadcast over the rest
            _set(x, x < 0, 0.5))  # a full mask, a scalar


def _scatter_red(x, i, s, xi, ii, si):
    outs = [x.scatter_reduce(1, i, s, r, include_self=inc) for r in ("sum", "prod", "mean", "amax", "amin")
            for inc in (True, False)]
    return (*outs, xi.scatter_reduce(0, ii, si, "mean"), xi.scatter_reduce(0, ii, si, "amax", include_self=False))


def _put_one(y, i, j, v):
    y = y.clone()
    y[i, :, j] = v[0, 0, :1]
    return y


# name -> (module, inputs, types the export must contain)
CASES = {
    "index_put": (Fn(_index_put), (_r(5, 3), _t([4, 0, -2]), _t([1, 3, 1, 1, -1]), _r(1, 3, seed=1),
                                   _r(5, 3, seed=2)), {"Tensor.index_put"}),
    "index_put_nd": (Fn(_index_put_nd), (_r(4, 5, 3), _t([3, -1, 0]), _t([2, 0]), _r(4, 5, seed=1),
                                         _r(4, 1, 3, seed=2)), {"Tensor.index_put"}),
    # values of shape (1,) go through Tensor.reshape shape=None (pnnx's spelling of view([]))
    "index_put_one_value": (Fn(_put_one),
                            (_r(4, 3, 5), _t([0, 2]), _t([1, 3]), _r(2, 2, 3, seed=1)),
                            {"Tensor.index_put", "Tensor.reshape"}),
    "index_add": (Fn(lambda x, i, s, y: (x.index_add(1, i, s, alpha=2.5), y.index_add(0, i, y[:3] * 3))),
                  (_r(3, 5), _t([1, 1, 4]), _r(3, 3, seed=1), _r(6, 2, seed=2, dtype=torch.float64)),
                  {"aten::index_add"}),
    "index_add_int": (Fn(lambda x, i, s: x.index_add(0, i, s, alpha=3)),
                      (_t([1, 2, 3, 4, 5]), _t([0, 4, 0, 0]), _t([10, 20, 30, -7])), {"aten::index_add"}),
    # every reduce, with and without x's own values, duplicates and an index nobody names; int mean floors
    "index_reduce": (Fn(lambda x, i, s, n, m: (x.index_reduce(1, i, s, "prod"), x.index_reduce(1, i, s, "mean"),
                                               x.index_reduce(1, i, s, "amax", include_self=False),
                                               x.index_reduce(0, i[:2], x[:2] * 2, "amin"),
                                               n.index_reduce(0, i, m, "mean", include_self=False),
                                               n.index_reduce(0, i, m, "mean"), n.index_reduce(0, i, m, "amax"))),
                     (_r(3, 5), _t([1, 1, 4]), _r(3, 3, seed=1), _t([3, -4, 7, 1, 9]), _t([-5, 2, 6])),
                     {"aten::index_reduce"}),
    "scatter_add": (Fn(lambda x, i, s, y, j: (x.scatter_add(1, i, s), y.scatter_add(0, j, y[:2] * 2))),
                    (_r(3, 8), _t([[0, 7, 0, 0], [2, 3, 3, 2], [5, 4, 1, 0]]), _r(3, 5, seed=1),
                     _r(4, 3, seed=2, dtype=torch.float64), _t([[0, 1, 1], [0, 3, 1]])), {"torch.scatter_add"}),
    "scatter_reduce": (Fn(_scatter_red), (_r(3, 6), _t([[0, 5, 0, 0], [2, 3, 3, 2], [5, 4, 1, 1]]), _r(3, 4, seed=1),
                                          _t([-1, 2, 3]), _t([0, 0, 0, 1]), _t([-2, -5, 4, 9])),
                       {"aten::scatter_reduce"}),
    # a hub: half of 3000 entries go to one row (integer mean floors, float sums and maxima)
    "scatter_reduce_hub": (Fn(lambda x, i, s, f: (x.scatter_reduce(1, i, s, "mean", include_self=False),
                                                  x.scatter_reduce(1, i, s * 3, "sum"),
                                                  f.scatter_reduce(1, i, f[:, :3000] * 2, "amax", include_self=False),
                                                  f.scatter_reduce(1, i, f[:, :3000], "mean"))),
                           (torch.zeros(1, 500, dtype=torch.int64),
                            torch.where(torch.rand(1, 3000, generator=torch.Generator().manual_seed(5)) < 0.5, 0,
                                        torch.randint(0, 500, (1, 3000), generator=torch.Generator().manual_seed(6))),
                            torch.randint(-50, 50, (1, 3000), generator=torch.Generator().manual_seed(7)),
                            _r(1, 3000, seed=8)),
                           {"aten::scatter_reduce"}),
    "masked_scatter": (Fn(lambda x, s, src: (x.masked_scatter(x > 0, src), x.masked_scatter(s > 0, src * 2))),
                       (_r(4, 3), _r(3, seed=1), _r(5, 3, seed=2)), {"aten::masked_scatter"}),
    "take_along": (Fn(lambda x, i, j, k: (torch.take_along_dim(x, i, 1), torch.take_along_dim(x, j),
                                          x.take_along_dim(k, dim=-1))),
                   (_r(3, 4), _t([[0, 3], [-1, 2], [1, 1]]), _t([[0, 11], [5, 10]]), _t([[2], [0], [3]])),
                   {"aten::take_along_dim"}),
    "slice_select_diag_scatter": (
        Fn(lambda x, a, b, c, d, y, e: (torch.slice_scatter(x, a, 1, 0, 4, 2), torch.slice_scatter(x, b, 0, 1),
                                        torch.select_scatter(x, c, 1, -1), torch.diagonal_scatter(x, d, 1),
                                        torch.diagonal_scatter(y, e, -1, 0, 2))),
        (_r(4, 5), _r(4, 2, seed=1), _r(3, 5, seed=2), _r(4, seed=3), _r(4, seed=4), _r(3, 2, 4, seed=5),
         _r(2, 2, seed=6)),
        {"torch.slice_scatter", "aten::select_scatter", "aten::diagonal_scatter"}),
    "diag": (Fn(lambda v, m, x: (torch.diag(v, -1), torch.diag(m, 1), torch.diag(m), torch.diagonal(x, 1, 0, 2),
                                 x.diagonal(-1, 2, 1), torch.diag_embed(v), torch.diag_embed(m, 1, 0, 2),
                                 torch.diag_embed(m, -2, 2, 0))),
             (_r(4), _r(3, 4, seed=1), _r(3, 4, 5, seed=2)), {"torch.diag", "aten::diagonal", "aten::diag_embed"}),
    "bucketize": (Fn(lambda x, b, s, y: (torch.bucketize(x, b), torch.bucketize(x, b, right=True, out_int32=True),
                                         torch.searchsorted(b, x), torch.searchsorted(s, y, right=True, out_int32=True))),
                  (torch.round(_r(3, 5) * 2) / 2, _t([-1.0, 0.0, 0.5, 1.0]), torch.sort(torch.round(_r(2, 4) * 2) / 2)[0],
                   torch.round(_r(2, 5, seed=1) * 2) / 2), {"aten::bucketize", "aten::searchsorted"}),
    "searchsorted_side": (Fn(lambda b, x: torch.searchsorted(b, x, side="right")),
                          (_t([-1.0, 0.0, 0.0, 1.0]), torch.round(_r(3, 5) * 2) / 2), {"aten::searchsorted"}),
    "index_fill": (Fn(lambda x, i, y, k, d: (x.index_fill(1, i, -1.5), x.index_fill(0, i[:1], y.sum()),
                                             k.index_fill(-1, i, 2.7), k.index_fill(0, i[1:], 7),
                                             d.index_fill(2, i, float("nan")))),
                   (_r(3, 4), _t([0, -1]), _r(3, seed=1), _t([[1, 2, 3], [4, 5, 6]]), _r(2, 2, 3, seed=2, dtype=torch.float64)),
                   {"aten::index_fill"}),
    "index_fill_long_index": (Fn(lambda x, i: x.index_fill(1, i, -1.0)),  # duplicates, negatives, 1200 of 3000
                              (_r(2, 3000), torch.randint(-3000, 3000, (1200,), generator=torch.Generator().manual_seed(3))),
                              {"aten::index_fill"}),
    # many short rows: boundaries counted, not searched row by row; ties on both sides, ints
    "searchsorted_many_rows": (Fn(lambda b, x, bi, xi: (torch.searchsorted(b, x), torch.searchsorted(b, x, right=True),
                                                        torch.searchsorted(bi, xi, side="right", out_int32=True))),
                               (torch.sort(torch.round(_r(40, 6) * 2) / 2).values, torch.round(_r(40, 9, seed=1) * 2) / 2,
                                torch.sort(torch.randint(0, 9, (3, 12, 5), generator=torch.Generator().manual_seed(2))).values,
                                torch.randint(-1, 10, (3, 12, 4), generator=torch.Generator().manual_seed(3))),
                               {"aten::searchsorted"}),
    "index_copy": (Fn(lambda x, i, s, k, j, w: (x.index_copy(1, i, s), k.index_copy(0, j, w), x.index_copy(0, j[:1], x[1:2] * 2))),
                   (_r(3, 4), _t([3, 0]), _r(3, 2, seed=1), _t([[1, 2], [3, 4], [5, 6]]), _t([2, 0, 2]),
                    _t([[10, 20], [30, 40], [50, 60]])), {"aten::index_copy"}),
    "index_copy_f64": (Fn(lambda x, i, s: x.index_copy(-1, i, s)),
                       (_r(2, 3, 4, dtype=torch.float64), _t([1, 3]), _r(2, 3, 2, seed=1, dtype=torch.float64)),
                       {"aten::index_copy"}),
    "isin": (Fn(lambda x, t, f: (torch.isin(x, t), torch.isin(x, t, invert=True), torch.isin(x, 3), torch.isin(f, t),
                                 torch.isin(x, f, assume_unique=True), torch.isin(f, 2.5, invert=True), torch.isin(2, t))),
             (_t([[1, 2, 5], [3, 4, 2]]), _t([2, 3, 7, 3]), _t([2.0, 2.5, float("nan"), -1.0])), {"aten::isin"}),
    "histc": (Fn(lambda x, y: (torch.histc(x, bins=5), torch.histc(x, bins=4, min=-1, max=1), torch.histc(y, 3))),
              (_r(50), _r(4, 6, seed=1, dtype=torch.float64)), {"aten::histc"}),
    # values on a 0.1 grid, many on a bin edge: torch divides, it does not search the edges
    "histc_grid_values": (Fn(lambda x: (torch.histc(x, bins=60, min=-3, max=3), torch.histc(x, bins=10, min=-3, max=3),
                                        torch.histc(x.double(), bins=30, min=-3, max=3), torch.histc(x, bins=7))),
                          (torch.round(_r(8, 64) * 10) / 10,), {"aten::histc"}),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return case_exporter(tmp_path_factory, CASES)


def _compare(g, backend, module, inputs, name):
    with torch.no_grad():
        want = module.eval()(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = g(*[t2n(t) for t in inputs])
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        a = backend.to_numpy(a)
        assert a.shape == tuple(e.shape), (name, k, a.shape, tuple(e.shape))
        assert a.dtype == t2n(e).dtype, (name, k, a.dtype, t2n(e).dtype)
        assert_close(a, t2n(e), rtol=1e-5, what=f"{name} output {k}")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    module, inputs, _ = CASES[name]
    _compare(kuiper_xp.load(exported(name), backend=backend), backend, module, inputs, name)


# -- scatter_reduce / searchsorted(side=) through the layer (their string arguments as inputs) ----


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_layer(reduce, backend):
    layer = make_layer(backend, "aten::scatter_reduce sr 6 1 0 1 2 3 4 5 6", 6)
    a = backend.asarray
    x, s = _r(3, 6), _r(3, 4, seed=1)
    i = _t([[0, 5, 0, 0], [2, 3, 3, 2], [5, 4, 1, 1]])
    for inc in (True, False):
        got = layer(a(t2n(x)), 1, a(t2n(i)), a(t2n(s)), reduce, inc)
        assert_close(got, t2n(x.scatter_reduce(1, i, s, reduce, include_self=inc)), rtol=1e-5,
                     what=f"{reduce} include_self={inc}")
    xi, ii, si = _t([-1, 2, 3, 7]), _t([0, 0, 0, 1, 3]), _t([-2, -5, 4, 9, 1])
    got = layer(a(t2n(xi)), 0, a(t2n(ii)), a(t2n(si)), reduce, True)
    assert_close(got, t2n(xi.scatter_reduce(0, ii, si, reduce)), what=f"int64 {reduce}")
    x64 = _r(4, 3, dtype=torch.float64)
    i2, s2 = _t([[0, 1, 1], [0, 3, 1], [0, 0, 1]]), _r(3, 3, seed=3, dtype=torch.float64)
    got = layer(a(t2n(x64)), -2, a(t2n(i2)), a(t2n(s2)), reduce, False)
    assert_close(got, t2n(x64.scatter_reduce(-2, i2, s2, reduce, include_self=False)), rtol=1e-12,
                 what=f"float64 {reduce}")
    with pytest.raises(ShapeError, match=r"aten::scatter_reduce.*reduce='max'"):
        layer(a(t2n(x)), 1, a(t2n(i)), a(t2n(s)), "max", True)


@pytest.mark.parametrize("reduce, inc", [("mean", False), ("sum", True), ("amax", False), ("prod", True),
                                          ("amin", True)])
@pytest.mark.parametrize("axis", [1, 0, 2])
def test_scatter_reduce_with_an_expanded_index(reduce, inc, axis, backend, monkeypatch):
    """GraphSAGE's mean aggregation: an index column expanded over the other axes (a zero-stride
    view on numpy/cupy) scatters whole slices along ``axis`` without flat positions; an index
    covering only part of another axis (or of src) keeps the general path. Against torch."""
    import kuiper_xp.layers.scatter as sc

    layer = make_layer(backend, "aten::scatter_reduce sr 6 1 0 1 2 3 4 5 6", 6)
    xp = backend.xp
    shape = [3, 5, 4]
    k = 7
    col = torch.tensor([4, 0, 2, 4, 1, 0, 4])[: min(k, 7)] % shape[axis]
    ishape = list(shape)
    ishape[axis] = k
    view = [1, 1, 1]
    view[axis] = k
    x, src = _r(*shape), _r(*ishape, seed=1)
    idx_t = col.view(view).expand(ishape)
    want = t2n(x.scatter_reduce(axis, idx_t, src, reduce, include_self=inc))
    idx = xp.broadcast_to(xp.reshape(backend.asarray(t2n(col)), tuple(view)), tuple(ishape))
    built = []
    real = sc._dim_positions
    monkeypatch.setattr(sc, "_dim_positions", lambda *a: built.append(1) or real(*a))
    got = layer(backend.asarray(t2n(x)), axis, idx, backend.asarray(t2n(src)), reduce, inc)
    assert_close(got, want, rtol=1e-5, what=f"{reduce} along {axis}")
    if getattr(idx, "strides", None) is not None:
        assert not built, "an expanded index should not need flat positions"
    # part of another axis only: general path, same answer as torch
    other = (axis + 1) % 3
    part = list(ishape)
    part[other] -= 1
    idx_p = idx_t[tuple(slice(0, n) for n in part)]
    want_p = t2n(x.scatter_reduce(axis, idx_p, src, reduce, include_self=inc))
    idx_pb = idx[tuple(slice(0, n) for n in part)]
    got = layer(backend.asarray(t2n(x)), axis, idx_pb, backend.asarray(t2n(src)), reduce, inc)
    assert_close(got, want_p, rtol=1e-5, what=f"{reduce} along {axis}, partial index")


def test_searchsorted_side_layer(backend):
    layer = make_layer(backend, "aten::searchsorted ss 6 1 0 1 2 3 4 5 6", 6)
    a = backend.asarray
    b, x = _t([-1.0, 0.0, 0.0, 1.0]), torch.round(_r(3, 5) * 2) / 2
    for side in ("left", "right"):
        got = layer(a(t2n(b)), a(t2n(x)), False, False, side, None)
        assert_close(got, t2n(torch.searchsorted(b, x, side=side)), what=side)
    perm = _t([3, 0, 2, 1])
    got = layer(a(t2n(b[perm.argsort()])), a(t2n(x)), True, True, None, a(t2n(perm.argsort().argsort().argsort())))
    want = torch.searchsorted(b[perm.argsort()], x, right=True, out_int32=True,
                              sorter=perm.argsort().argsort().argsort())
    assert_close(got, t2n(want), what="sorter")
    with pytest.raises(ShapeError, match=r"aten::searchsorted.*contradict"):
        layer(a(t2n(b)), a(t2n(x)), False, True, "left", None)


# -- duplicates, bigger scatters --------------------------------------------------------------


def test_many_duplicates_add_up_like_torch(backend):
    """Thousands of writes to a few places (more rounds than one gather block) lose nothing."""
    layer = make_layer(backend, "Tensor.index_put ip 3 1 0 1 2 3 accumulate=True $input=0 $indices=1 $values=2", 3)
    g = torch.Generator().manual_seed(5)
    x = torch.zeros(7, 2, dtype=torch.float64)
    i = torch.randint(-7, 7, (3000,), generator=g)
    v = torch.randn(3000, 2, generator=g, dtype=torch.float64)
    got = layer(backend.asarray(t2n(x)), [backend.asarray(t2n(i))], backend.asarray(t2n(v)))
    assert_close(got, t2n(x.index_put((i,), v, accumulate=True)), rtol=1e-12, what="index_put accumulate")
    xi = torch.zeros(5, dtype=torch.int64)
    ii = torch.randint(0, 5, (4000,), generator=g)
    got = layer(backend.asarray(t2n(xi)), [backend.asarray(t2n(ii))], backend.asarray(np.ones(4000, np.int64)))
    assert_close(got, t2n(torch.bincount(ii, minlength=5)), what="counts")


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_segment_scatter_fast_and_generic_paths_match_torch(reduce):
    """numpy's fast segment_scatter (a sort and ufunc.reduceat; ufunc.at for single elements) and
    the generic array-API rounds give torch's scatter_reduce, for rows and single elements,
    every dtype the fast path takes (and those it hands back: int mean)."""
    from array_api_compat import numpy as xp_np
    from kuiper_xp.backends import numpy_fast

    from kuiper_xp.layers.scatter import segment_scatter

    g = torch.Generator().manual_seed(11)
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32):
        for tail in ((), (5,), (2, 3)):
            n, k = 9, 40
            if dtype.is_floating_point:
                dest, vals = torch.randn((n,) + tail, generator=g, dtype=dtype), torch.randn((k,) + tail, generator=g,
                                                                                             dtype=dtype)
            else:
                dest = torch.randint(-4, 5, (n,) + tail, generator=g, dtype=dtype)
                vals = torch.randint(-3, 4, (k,) + tail, generator=g, dtype=dtype)
            if reduce == "prod":  # (keep products of 40 values small)
                vals = torch.where(vals.abs() > 1, vals.sign(), vals) if not dtype.is_floating_point else vals / 2 + 1
            pos = torch.randint(0, n - 2, (k,), generator=g)  # (the last two rows are never named)
            index = pos.reshape((k,) + (1,) * len(tail)).expand((k,) + tail)
            for inc in (True, False):
                want = t2n(dest.scatter_reduce(0, index, vals, reduce, include_self=inc))
                args = (t2n(dest), t2n(pos), t2n(vals), reduce, inc)
                generic = segment_scatter(xp_np, *args, None)
                fast = segment_scatter(xp_np, *args, None, numpy_fast)
                what = f"{reduce} {dtype} tail={tail} include_self={inc}"
                for name, got in (("generic", generic), ("fast", fast)):
                    assert got.dtype == want.dtype, f"{name} {what}"
                    assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-12, what=f"{name} {what}")
    # the fast path declines what it does not cover, and leaves its input alone
    d = np.zeros((3, 2), np.float32)
    assert numpy_fast.segment_scatter(d, np.array([0, 0]), np.ones((2, 2), np.float32), "last", True) is None
    assert numpy_fast.segment_scatter(d, np.array([0]), np.ones((1, 2), np.float64), "sum", True) is None
    assert numpy_fast.segment_scatter(d, np.array([1, 1]), np.ones((2, 2), np.float32), "sum", True)[1].tolist() == [2, 2]
    assert not d.any()


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax"])
def test_segment_scatter_along_an_axis_matches_torch(reduce):
    """Slices along a middle or last axis (an index_add over nodes of a batch), with few and with
    many leading slices (the numpy path loops over up to 64, then builds one index)."""
    from array_api_compat import numpy as xp_np
    from kuiper_xp.backends import numpy_fast

    from kuiper_xp.layers.scatter import segment_scatter

    g = torch.Generator().manual_seed(3)
    for shape, axis in (((2, 7, 3), 1), ((3, 7), 1), ((70, 7, 2), 1), ((2, 3, 7), 2), ((7, 4), 0)):
        k = 25
        dest = torch.randn(shape, generator=g, dtype=torch.float64)
        vshape = shape[:axis] + (k,) + shape[axis + 1:]
        vals = torch.randn(vshape, generator=g, dtype=torch.float64)
        pos = torch.randint(0, shape[axis] - 1, (k,), generator=g)
        index = pos.reshape((1,) * axis + (k,) + (1,) * (len(shape) - axis - 1)).expand(vshape)
        for inc in (True, False):
            want = t2n(dest.scatter_reduce(axis, index, vals, reduce, include_self=inc))
            args = (t2n(dest), t2n(pos), t2n(vals), reduce, inc)
            for name, fast in (("generic", None), ("fast", numpy_fast)):
                got = segment_scatter(xp_np, *args, None, fast, axis)
                assert_close(got, want, rtol=1e-12, what=f"{name} {reduce} {shape} axis {axis} include_self={inc}")
    # vals not shaped like dest with k at the axis: declined, for the caller to report
    assert numpy_fast.segment_scatter(np.zeros((2, 3)), np.array([0]), np.zeros((1, 3)), "sum", True, 1) is None


# -- errors -----------------------------------------------------------------------------------


def test_errors_name_the_operator(backend, exported):
    a = backend.asarray
    g = kuiper_xp.load(exported("index_add"), backend=backend)
    with pytest.raises(ShapeError, match=rf"aten::index_add.*index {bad_value(backend, 5)}is out of range"):
        g(t2n(_r(3, 5)), np.array([1, 5, 0]), t2n(_r(3, 3)), t2n(_r(6, 2, dtype=torch.float64)))
    with pytest.raises(ShapeError, match=rf"aten::index_add.*index {bad_value(backend, -1)}is out of range"):
        g(t2n(_r(3, 5)), np.array([1, -1, 0]), t2n(_r(3, 3)), t2n(_r(6, 2, dtype=torch.float64)))
    put = make_layer(backend, "Tensor.index_put ip 3 1 0 1 2 3 accumulate=False $input=0 $indices=1 $values=2", 3)
    x = a(t2n(_r(5, 3)))
    with pytest.raises(ShapeError, match=r"Tensor\.index_put.*index 5 is out of range for axis 0"):
        put(x, [a(np.array([5]))], a(np.ones((1, 3), np.float32)))
    with pytest.raises(ShapeError, match=r"Tensor\.index_put.*do not broadcast"):
        put(x, [a(np.array([0, 1]))], a(np.ones((2, 2), np.float32)))
    sa = make_layer(backend, "torch.scatter_add sa 3 1 0 1 2 3 dim=1 $input=0 $index=1 $src=2", 3)
    with pytest.raises(ShapeError, match=r"torch\.scatter_add.*index 8 is out of range"):
        sa(a(np.zeros((2, 8), np.float32)), a(np.array([[8], [0]])), a(np.ones((2, 1), np.float32)))
    with pytest.raises(ShapeError, match=r"torch\.scatter_add.*exceeds src shape"):
        sa(a(np.zeros((2, 8), np.float32)), a(np.array([[1, 2], [0, 0]])), a(np.ones((2, 1), np.float32)))
    ms = make_layer(backend, "aten::masked_scatter ms 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::masked_scatter.*source has 2 elements, the mask selects 3"):
        ms(a(np.zeros(3, np.float32)), a(np.ones(3, bool)), a(np.ones(2, np.float32)))
    hist = make_layer(backend, "aten::histc h 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::histc.*floating input"):
        hist(a(np.arange(4)), 3, 0, 0)
    with pytest.raises(ShapeError, match=r"aten::histc.*max \(0.0\) must be larger than min \(1.0\)"):
        hist(a(np.ones(4, np.float32)), 3, 1.0, 0.0)
    bk = make_layer(backend, "aten::bucketize b 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::bucketize.*boundaries must be 1-D"):
        bk(a(np.ones(4, np.float32)), a(np.ones((2, 2), np.float32)), False, False)
    with pytest.raises(LayerParameterError, match=r"torch\.slice_scatter.*positive step"):
        make_layer(backend, "torch.slice_scatter s 2 1 0 1 2 dim=0 start=0 end=2 step=0 $input=0 $src=1", 2)
    with pytest.raises(LayerParameterError, match=r"Tensor\.index_put.*needs \$values"):
        make_layer(backend, "Tensor.index_put ip 2 1 0 1 2 accumulate=False $input=0 $indices=1", 2)
    dg = make_layer(backend, "torch.diag d 1 1 0 1 diagonal=0 $input=0", 1)
    with pytest.raises(ShapeError, match=r"torch\.diag.*1-D or 2-D"):
        dg(a(np.ones((2, 2, 2), np.float32)))


def test_new_index_ops_errors_name_the_operator(backend):
    a = backend.asarray
    add = make_layer(backend, "aten::index_add ia 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::index_add.*a 0-D input or source needs the other 0-D too"):
        add(a(np.zeros(3, np.float32)), 0, a(np.array([1])), a(np.float32(5.0)))
    x = a(t2n(_r(3, 4)))
    fill = make_layer(backend, "aten::index_fill f 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::index_fill.*index 4 is out of range"):
        fill(x, 1, a(np.array([4])), 1.0)
    with pytest.raises(ShapeError, match=r"aten::index_fill.*int64"):
        fill(x, 1, a(np.array([1], np.int32)), 1.0)
    with pytest.raises(ShapeError, match=r"aten::index_fill.*0-D tensor"):
        fill(x, 1, a(np.array([1])), a(np.ones(1, np.float32)))
    with pytest.raises(ShapeError, match=r"aten::index_fill.*dim=2 is out of range"):
        fill(x, 2, a(np.array([1])), 1.0)
    with pytest.raises(LayerParameterError, match=r"aten::index_fill.*expected 4 inputs"):
        make_layer(backend, "aten::index_fill f 3 1 0 1 2 3", 3)
    copy = make_layer(backend, "aten::index_copy c 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::index_copy.*same dtype|aten::index_copy.*input's dtype"):
        copy(x, 1, a(np.array([0])), a(np.ones((3, 1), np.float64)))
    with pytest.raises(ShapeError, match=r"aten::index_copy.*index -1 is out of range"):
        copy(x, 1, a(np.array([-1])), a(np.ones((3, 1), np.float32)))
    with pytest.raises(ShapeError, match=r"aten::index_copy.*does not match input"):
        copy(x, 1, a(np.array([0])), a(np.ones((2, 1), np.float32)))
    isin = make_layer(backend, "aten::isin i 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::isin.*not bool"):
        isin(a(np.array([True, False])), a(np.array([1])), False, False)
    bc = make_layer(backend, "aten::bincount b 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::bincount.*non-negative values, found -1"):
        bc(a(np.array([1, -1])), None, 0)
    with pytest.raises(ShapeError, match=r"aten::bincount.*1-D non-negative integer input"):
        bc(a(np.array([[1, 2]])), None, 0)
    with pytest.raises(ShapeError, match=r"aten::bincount.*1-D non-negative integer input"):
        bc(a(np.array([1.0, 2.0], np.float32)), None, 0)
    with pytest.raises(ShapeError, match=r"aten::bincount.*weights should be 1-D"):
        bc(a(np.array([1, 2])), a(np.ones(3, np.float32)), 0)
    with pytest.raises(ShapeError, match=r"aten::bincount.*minlength=-1"):
        bc(a(np.array([1, 2])), None, -1)
    uc = make_layer(backend, "aten::unique_consecutive u 4 3 0 1 2 3 4 5 6", 4)
    with pytest.raises(ShapeError, match=r"aten::unique_consecutive.*dim=2 is out of range"):
        uc(a(np.ones((2, 3))), False, False, 2)
    with pytest.raises(ShapeError, match=r"aten::unique_consecutive.*zero-sized"):
        uc(a(np.ones((2, 0))), False, False, 0)
    with pytest.raises(LayerParameterError, match=r"aten::where.*expected 1 input"):
        make_layer(backend, "aten::where w 2 1 0 1 2", 2)


def test_new_index_ops_edge_cases(backend):
    """Through the layers: empty and 0-D inputs, a 0-D where, the three-input aten::where."""
    a = backend.asarray
    uc = make_layer(backend, "aten::unique_consecutive u 4 3 0 1 2 3 4 5 6", 4)
    for x, dim in ((_r(0), None), (_t(3), None), (torch.zeros(0, 3), 0), (_t([True, True, False]), None)):
        got = uc(a(t2n(x)), True, True, dim)
        want = torch.ops.aten.unique_consecutive(x, True, True, dim)
        for k, (g, w) in enumerate(zip(got, want)):
            assert tuple(g.shape) == tuple(w.shape), (x, dim, k)
            assert_close(g, t2n(w), what=f"unique_consecutive {tuple(x.shape)} output {k}")
    bc = make_layer(backend, "aten::bincount b 3 1 0 1 2 3", 3)
    for w in (None, np.zeros(0, np.float32)):
        got = bc(a(np.zeros(0, np.int64)), None if w is None else a(w), 3)
        assert_close(got, t2n(torch.bincount(torch.zeros(0, dtype=torch.int64), minlength=3)), what="empty bincount")
    got = bc(a(np.array([1, 1, 3], np.uint8)), a(np.array([1, 0, 1], np.int32)), 0)
    assert_close(got, t2n(torch.bincount(_t([1, 1, 3], torch.uint8), _t([1, 0, 1], torch.int32))), what="int weights")
    wh = make_layer(backend, "aten::where w 1 1 0 1", 1)
    for v in (0.0, 2.0):
        (got,) = wh(a(np.asarray(v, np.float32)))
        assert_close(got, t2n(torch.where(torch.tensor(v))[0]), what=f"where of 0-D {v}")
    wh3 = make_layer(backend, "aten::where w 3 1 0 1 2 3", 3)
    assert not getattr(wh3, "data_dependent_shape", False)
    c, x = _r(3, 4) > 0, _r(3, 4, seed=1)
    assert_close(wh3(a(t2n(c)), a(t2n(x)), 0.5), t2n(torch.where(c, x, 0.5)), what="three-input where")
    fill = make_layer(backend, "aten::index_fill f 4 1 0 1 2 3 4", 4)
    s = torch.tensor(1.5)
    assert_close(fill(a(t2n(s)), -1, a(np.array(0)), 7.0), t2n(s.index_fill(-1, torch.tensor(0), 7.0)), what="0-D fill")
    copy = make_layer(backend, "aten::index_copy c 4 1 0 1 2 3 4", 4)
    v = _r(4)
    assert_close(copy(a(t2n(v)), 0, a(np.array(2)), a(np.asarray(9.0, np.float32))),
                 t2n(v.index_copy(0, torch.tensor(2), torch.tensor(9.0))), what="0-D source")


# -- data-dependent output shapes -------------------------------------------------------------


def _nonzero_chain(x, s):
    m = x > 0
    idx = torch.nonzero(m)
    sel = torch.masked_select(x, s > 0)
    rows, cols = torch.nonzero(m, as_tuple=True)
    return idx, idx.sum(0), x[idx[:, 0], idx[:, 1]] * 2, torch.argwhere(x < 0), sel, sel.sum(), rows + cols


def _unique(x, y):
    v, inv, cnt = torch.unique(x, return_inverse=True, return_counts=True)
    return v, inv, cnt, torch.unique(y), v.float().mean()


def _where_one(x, k):
    rows, cols = torch.where(x > 0)
    return rows, cols, x[torch.where(x < 0)] * 2, torch.where(k)[0] + 1, (rows * 4 + cols).sum()


def _bincount(i, w):
    return (torch.bincount(i), torch.bincount(i, w, minlength=6), torch.bincount(i, w.double()),
            torch.bincount(i.int(), minlength=2).sum(), torch.bincount(i, i))


def _unique_consecutive(x, y, f):
    v, inv, cnt = torch.unique_consecutive(x, return_inverse=True, return_counts=True)
    return (v, inv, cnt, torch.unique_consecutive(y, dim=1), torch.unique_consecutive(y, return_counts=True, dim=0)[1],
            torch.unique_consecutive(f), cnt.max())


def _unique_dim(x, i):
    v, inv, cnt = torch.unique(x, dim=0, return_inverse=True, return_counts=True)
    b = i > 0  # (a bool input makes pnnx write no file)
    return v, inv, cnt, torch.unique(x, dim=1), torch.unique(b, dim=1, return_counts=True)[1], v.float().sum()


DATA_DEPENDENT = {
    # traced with one count, run with others (all, none, some)
    "nonzero_chain": (Fn(_nonzero_chain), (_r(3, 5), _r(5, seed=1)),
                      [(_r(3, 5, seed=7), _r(5, seed=8)), (torch.ones(3, 5), -torch.ones(5)),
                       (-torch.ones(3, 5), torch.ones(5))],
                      {"aten::nonzero", "aten::argwhere", "aten::nonzero_numpy", "torch.masked_select"}),
    "unique": (Fn(_unique), (_t([3, 1, 3, 2, 1]), _t([[0.5, -1.0], [0.5, 2.0]])),
               [(_t([7, 7, 7, 7, 7]), _t([[1.0, 2.0], [3.0, 4.0]])), (_t([5, -4, 3, 2, 1]), _t([[0.0, 0.0], [0.0, 1.0]]))],
               {"aten::_unique2"}),
    # rows and columns; ties broken by later columns, negative values, bools
    "unique_dim": (Fn(_unique_dim), (_t([[2, 1], [0, 5], [2, 1], [0, -3], [2, 0], [0, 5]]),
                                     _t([[1, 0, 1], [0, 0, 0]])),
                   [(_t([[7, 7], [7, 7], [7, 7], [7, 7], [7, 7], [7, 7]]), _t([[1, 1, 1], [1, 1, 1]])),
                    (_t([[-1, 9], [3, 2], [3, -2], [-1, 9], [5, 5], [3, 2]]), _t([[0, 1, 1], [1, 1, 0]]))],
                   {"aten::unique_dim"}),
    "where_one": (Fn(_where_one), (_r(3, 4), _t([0, 3, 0, 1, 2])),
                  [(torch.ones(3, 4), _t([0, 0, 0, 0, 0])), (-torch.ones(3, 4), _t([1, 1, 1, 1, 1])),
                   (_r(3, 4, seed=5), _t([0, 0, 7, 0, 0]))],
                  {"aten::where", "prim::ListUnpack"}),
    "bincount": (Fn(_bincount), (_t([1, 2, 2, 5, 0, 2]), _r(6)),
                 [(_t([0, 0, 0, 0, 0, 0]), _r(6, seed=1)), (_t([9, 1, 3, 3, 12, 0]), _r(6, seed=2))],
                 {"aten::bincount"}),
    "unique_consecutive": (Fn(_unique_consecutive),
                           (_t([[1, 1, 2], [2, 3, 1]]), _t([[1, 1, 2, 2, 2], [0, 0, 1, 1, 5]]), _t([0.5, 0.5, -1.0, 0.5])),
                           [(_t([[4, 4, 4], [4, 4, 4]]), _t([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]),
                             _t([float("nan"), float("nan"), 2.0, 2.0])),
                            (_t([[1, 2, 3], [4, 5, 6]]), _t([[7, 7, 7, 7, 7], [7, 7, 7, 7, 7]]), _t([-0.0, 0.0, 0.0, 1.0]))],
                           {"aten::unique_consecutive"}),
}


@pytest.mark.parametrize("name", list(DATA_DEPENDENT))
def test_data_dependent_shapes(name, backend, exported):
    module, inputs, others, types = DATA_DEPENDENT[name]
    param = exported(name, module, inputs, types)
    g = kuiper_xp.load(param, backend=backend)
    assert all(d is None for spec in g.outputs if spec.shape for d in spec.shape), g.outputs
    assert g.planned_peak_bytes() > 0
    for k, ins in enumerate([inputs, *others]):
        _compare(g, backend, module, ins, f"{name} inputs {k}")


def test_data_dependent_rank_and_dtype_still_checked(backend, exported):
    """An annotation that disagrees in rank stays an error downstream of nonzero."""
    module, inputs, _, types = DATA_DEPENDENT["nonzero_chain"]
    param = exported("nonzero_chain", module, inputs, types)
    text = param.read_text().splitlines()
    line = next(k for k, ln in enumerate(text) if ln.startswith("aten::nonzero "))
    out = text[line].split()[5]
    bad = param.parent / "bad.pnnx.param"
    bad.write_text("\n".join(text).replace(f" #{out}=(", f" #{out}=(1,") + "\n")
    g = kuiper_xp.load(bad, bin_path=param.with_suffix("").with_suffix(".pnnx.bin"), backend=backend)
    with pytest.raises(ShapeError, match=r"aten::nonzero.*has shape"):
        g(*[t2n(t) for t in inputs])


def test_index_put_of_a_lost_boolean_value_says_why(backend):
    """Mask2Former's ``m[torch.where(...)] = False`` on a bool mask: pnnx writes ``values=None``
    (the boolean is lost); refused at load, naming the cause and the way round it."""
    with pytest.raises(LayerParameterError, match=r"values=None: pnnx lost the assigned value .* m\[idx\] = False"):
        make_layer(backend, "Tensor.index_put ip 2 1 0 1 2 $input=0 $indices=1 accumulate=False values=None", 2)


def test_index_put_with_indices_folded_into_a_parameter_says_so(backend):
    """``y[:, torch.tensor([0])] = 0``: pnnx writes ``indices=(0)`` as a parameter and drops the
    leading whole-axis item."""
    from kuiper_xp.errors import LayerParameterError

    with pytest.raises(LayerParameterError, match="folded the index tensor into a parameter"):
        make_layer(backend, "Tensor.index_put op 1 1 0 1 accumulate=False indices=(0) values=0 $input=0")
