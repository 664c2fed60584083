"""Linear-algebra products and shape builders (kuiper_xp/layers/linalg.py) and einsum's diagonal
(repeated index) terms: pnnx exports of small torch modules run on every backend leg and compared
with torch, plus the errors bad operands get."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import case_exporter, export_module
from test_layers_misc import make_layer, t2n
from torch import nn

import kuiper_xp
from kuiper_xp.errors import ShapeError


class Fn(nn.Module):
    """A module around a function of its inputs (and optional submodules)."""

    def __init__(self, fn, *mods):
        super().__init__()
        self.fn, self.m = fn, nn.ModuleList(mods)

    def forward(self, *a):
        return self.fn(self, *a)


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _i(*shape, seed=0, dtype=torch.int64):
    return torch.randint(-5, 6, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


D = torch.float64

# name -> (module, inputs, types the export must contain); several ops per module keep the
# number of pnnx exports (about 0.3 s each) down
CASES = {
    "mv_outer_kron": (
        Fn(lambda s, a, v, u: (torch.mv(a, v), a.mv(v) * 2, torch.outer(u, v), torch.ger(v, u),
                               torch.kron(a, a[:2, :3]), torch.kron(u, a))),
        (_r(3, 4), _r(4, seed=1), _r(3, seed=2)), {"torch.mv", "aten::outer", "aten::kron"}),
    "mv_outer_kron_f64": (
        Fn(lambda s, a, v, u: (torch.mv(a, v), torch.outer(u, v), torch.kron(a, u))),
        (_r(3, 4, dtype=D), _r(4, seed=1, dtype=D), _r(3, seed=2, dtype=D)), {"torch.mv", "aten::outer"}),
    "int_products": (
        Fn(lambda s, a, v, u: (torch.mv(a, v), torch.outer(u, v.float()), torch.kron(a, a[:2, :1]), torch.dot(v, v),
                               torch.inner(a, a), torch.trace(a), torch.tensordot(a, a, dims=([0], [0])),
                               torch.addmv(a[:, 0], a, v, beta=2, alpha=3))),
        (_i(3, 4), _i(4, seed=1), _i(3, seed=2, dtype=torch.int32)),
        {"torch.mv", "aten::outer", "aten::kron", "aten::dot", "aten::inner", "aten::trace", "aten::tensordot",
         "aten::addmv"}),
    "kron_nd": (Fn(lambda s, a, b: (torch.kron(a, b), torch.kron(b, a))), (_r(2, 3), _r(4, 2, 2, seed=1)),
                {"aten::kron"}),
    "tensordot": (
        Fn(lambda s, a, b, c: (torch.tensordot(a, b, dims=2), torch.tensordot(a, c, dims=([1, 0], [0, 2])),
                               torch.tensordot(a, c, dims=([-2], [0])), torch.tensordot(a[0], c[0, 0], dims=0),
                               torch.tensordot(c, a, dims=1))),
        (_r(2, 3, 4), _r(3, 4, 5, seed=1), _r(3, 5, 2, seed=2)), {"aten::tensordot"}),
    "inner_dot_trace": (
        Fn(lambda s, a, b, v: (torch.inner(a, b), torch.inner(v, b), torch.inner(a.sum(), v), torch.dot(v, b[0]),
                               torch.vdot(v, b[1]), torch.trace(a), torch.trace(a.transpose(0, 1)), torch.trace(b[:3, :3]))),
        (_r(2, 4), _r(3, 4, seed=1), _r(4, seed=2)), {"aten::inner", "aten::dot", "aten::vdot", "aten::trace"}),
    "inner_dot_trace_f64": (
        Fn(lambda s, a, b: (torch.inner(a, b), torch.dot(a[0], b[0]), torch.trace(b))),
        (_r(2, 4, dtype=D), _r(3, 4, seed=1, dtype=D)), {"aten::inner", "aten::dot", "aten::trace"}),
    "multi_dot": (
        Fn(lambda s, a, b, c, v, w: (torch.chain_matmul(a, b, c), torch.chain_matmul(a),
                                     torch.linalg.multi_dot([v, b, c]), torch.linalg.multi_dot([a, b, w]),
                                     torch.linalg.multi_dot([v, b, w]), torch.linalg.multi_dot([a, b, c, c.transpose(0, 1)]))),
        (_r(2, 3), _r(3, 4, seed=1), _r(4, 5, seed=2), _r(3, seed=3), _r(4, seed=4)),
        {"aten::chain_matmul", "aten::linalg_multi_dot"}),
    "addmv_addr_addbmm": (
        Fn(lambda s, c, m, v, c2, u, c3, b1, b2, nan: (
            torch.addmv(c, m, v, beta=0.5, alpha=2), torch.addmv(c[:1], m, v), torch.addr(c2, u, v, beta=0.5, alpha=2),
            torch.addr(c2[:1], u, v), torch.addbmm(c3, b1, b2, beta=0.5, alpha=2), torch.addbmm(c3[0], b1, b2),
            torch.addmv(nan, m, v, beta=0), torch.addr(nan[:, None], u, v, beta=0.0))),
        (_r(3), _r(3, 4, seed=1), _r(4, seed=2), _r(3, 4, seed=3), _r(3, seed=4), _r(3, 5, seed=5),
         _r(2, 3, 4, seed=6), _r(2, 4, 5, seed=7), torch.tensor([float("nan"), 1.0, float("inf")])),
        {"aten::addmv", "aten::addr", "aten::addbmm"}),
    # (pnnx cannot export a graph with bool inputs: the bools are made inside)
    "bool": (Fn(lambda s, c, u, v: (torch.addr(c > 0, u > 0, v > 0), torch.outer(u > 0, v > 0),
                                    torch.kron(u > 0, v > 0))),
             (_r(3, 2), _r(3, seed=1), _r(2, seed=2)), {"aten::addr", "aten::outer", "aten::kron"}),
    "cross": (
        Fn(lambda s, a, b, c, d: (torch.cross(a, b, dim=1), torch.cross(a, b, -2), torch.cross(c, d),
                                  torch.linalg.cross(c, d[:1]), torch.linalg.cross(a, b, dim=1),
                                  torch.cross(d[:1, :].transpose(0, 1), c[:3].transpose(0, 1)))),
        (_r(2, 3, 4), _r(2, 3, 4, seed=1), _r(4, 3, seed=2), _r(4, 3, seed=3)), {"torch.cross", "aten::linalg_cross"}),
    "cross_f64_int": (
        Fn(lambda s, a, b, i, j: (torch.cross(a, b, dim=0), torch.linalg.cross(i, j))),
        (_r(3, 2, dtype=D), _r(3, 2, seed=1, dtype=D), _i(2, 3), _i(2, 3, seed=1)), {"torch.cross", "aten::linalg_cross"}),
    "block_diag_cartesian": (
        Fn(lambda s, a, b, c, i: (torch.block_diag(a, b, c), torch.block_diag(a.sum(), b, i), torch.block_diag(i),
                                  torch.cartesian_prod(b, c[0], b[:2]), torch.cartesian_prod(b) * 2)),
        (_r(2, 3), _r(3, seed=1), _r(2, 2, seed=2), _i(2, 2)), {"aten::block_diag", "aten::cartesian_prod"}),
    # torch.result_type: a 0-d tensor only counts when of a higher kind (block_diag, inner);
    # hstack and kron make it 1-d first
    "promotion": (
        Fn(lambda s, a, b, i: (torch.block_diag(a.sum(), b), torch.block_diag(b.sum(), i), torch.inner(a.sum(), b),
                               torch.inner(b.sum(), i), torch.hstack((a.sum(), b)), torch.kron(a.sum(), b),
                               torch.block_diag(i, b))),
        (_r(2, dtype=D), _r(3, seed=1), _i(3, dtype=torch.int32)), {"aten::block_diag", "aten::inner"}),
    "stacks": (
        Fn(lambda s, v, w, m, n, i: (torch.hstack((v, w)), torch.hstack((m, n, m)), torch.vstack((v, w)),
                                     torch.vstack((m, v)), torch.row_stack((v, m, v)), torch.dstack((v, w)),
                                     torch.dstack((m, m)), torch.dstack((m[None], m[None])),
                                     torch.column_stack((v, w)), torch.column_stack((v, m.transpose(0, 1), i)),
                                     torch.hstack((i, v)), torch.vstack((v.sum(), v.sum())))),
        (_r(3), _r(3, seed=1), _r(2, 3, seed=2), _r(2, 4, seed=3), _i(3)),
        {"aten::hstack", "aten::vstack", "aten::dstack", "aten::column_stack"}),
    "rot90": (
        Fn(lambda s, x, m: (torch.rot90(x, 3, [1, 2]), torch.rot90(m), torch.rot90(m, -1), torch.rot90(x, 2, [2, 0]),
                            torch.rot90(x, 4, [0, 1]), torch.rot90(x, -7, [-1, -3]), torch.rot90(m, 1, [1, 0]))),
        (_r(2, 3, 4), _i(3, 5)), {"aten::rot90"}),
    # powers of square stacks: 0 (the identity), 1, odd and even by squaring, an integer matrix
    # (a negative power needs LAPACK, which pnnx's own libtorch lacks: no file; on the layer below)
    "matrix_power": (
        Fn(lambda s, a, i: (torch.linalg.matrix_power(a, 3), torch.matrix_power(a, 0), a.matrix_power(1),
                            torch.linalg.matrix_power(a, 6), torch.matrix_power(i, 4), torch.matrix_power(i, 0))),
        (_r(2, 3, 3), _i(2, 2, 2)), {"aten::linalg_matrix_power"}),
    # matrix exponentials of small and larger norms (squarings); triangular solves, upper and
    # lower, from the left and the right, with a unit diagonal
    "matrix_exp_solve_triangular": (
        Fn(lambda s, a, b: (torch.linalg.matrix_exp(a), torch.linalg.matrix_exp(a * 6),
                            torch.linalg.solve_triangular(a.triu() + 3 * torch.eye(3), b, upper=True),
                            torch.linalg.solve_triangular(a.tril() + 3 * torch.eye(3), b, upper=False,
                                                          unitriangular=True),
                            torch.linalg.solve_triangular(a.triu() + 3 * torch.eye(3), b.transpose(-1, -2), upper=True,
                                                          left=False))),
        (_r(2, 3, 3), _r(2, 3, 4, seed=1)), {"aten::linalg_matrix_exp", "aten::linalg_solve_triangular"}),
    "channel_shuffle": (
        Fn(lambda s, x, y, i: (s.m[0](x), F.channel_shuffle(x, 3), torch.channel_shuffle(y, 2),
                               torch.channel_shuffle(i, 4), F.native_channel_shuffle(x, 2)),
           nn.ChannelShuffle(2)),
        (_r(2, 6, 3, 3), _r(1, 4, 5, seed=1), _i(1, 8, 2, 1, 2)),
        {"aten::channel_shuffle", "aten::native_channel_shuffle"}),
    "einsum_diag": (
        Fn(lambda s, a, b, c, d: (torch.einsum("ii->i", a), torch.einsum("ii", a), torch.einsum("bii->b", b),
                                  torch.einsum("...ii->...i", b), torch.einsum("bii,bj->bij", b, c),
                                  torch.einsum("iii->i", d), torch.einsum("ij,jj->i", c[:, :3], a),
                                  torch.einsum("ii,jk->jk", a, c), torch.einsum("iji->j", d[:, 1:, :]),
                                  torch.einsum("bii->bi", b) * 2)),
        (_r(3, 3), _r(2, 3, 3, seed=1), _r(2, 4, seed=2), _r(3, 3, 3, seed=3)), {"torch.einsum"}),
    "einsum_diag_f64": (
        Fn(lambda s, a, b: (torch.einsum("ii->i", a), torch.einsum("bjj,bk->bjk", b, a[:2]))),
        (_r(3, 3, dtype=D), _r(2, 4, 4, seed=1, dtype=D)), {"torch.einsum"}),
    "meshgrid": (
        Fn(lambda s, a, b, c: (*torch.meshgrid(a, b, indexing="ij"), *torch.meshgrid(a, b, c, indexing="xy"))),
        (_r(3), _r(4, seed=1), _r(2, seed=2)), {"aten::meshgrid", "prim::ListUnpack"}),
    "broadcast_tensors": (
        Fn(lambda s, x, y, i: (*torch.broadcast_tensors(x, y.exp(), i), sum(torch.broadcast_tensors(y, x[:1])))),
        (_r(2, 1, 4), _r(3, 1), _i(4)), {"aten::broadcast_tensors", "prim::ListUnpack"}),
    "tri_indices_of_a_size": (  # DLRM's interaction: the pairs below the diagonal, sized by the input
        Fn(lambda s, t: (t[:, torch.tril_indices(t.shape[1], t.shape[1], offset=-1)[0],
                           torch.tril_indices(t.shape[1], t.shape[1], offset=-1)[1]],
                         torch.triu_indices(t.shape[1], t.shape[2] + 1, 1) * 2)),
        (_r(1, 5, 4),), {"aten::tril_indices", "aten::triu_indices"}, (_r(2, 7, 6),)),
    "normal_log_prob": (  # torch.distributions broadcasts its parameters and the value
        Fn(lambda s, mu, v: torch.distributions.Normal(mu, v[:, :1].exp()).log_prob(v)),
        (_r(2, 5), _r(2, 5, seed=1)), {"aten::broadcast_tensors"}),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return case_exporter(tmp_path_factory, CASES)


def _load(param, backend):
    return kuiper_xp.load(param, backend=backend)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    module, inputs, _, *more = CASES[name]  # (more: the inputs of another size, for a dynamic export)
    param = exported(name)
    g = _load(param, backend)
    for ins in [inputs, *more]:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            want = module.eval()(*ins)
        want = want if isinstance(want, tuple) else (want,)
        got = g(*[t2n(t) for t in ins])
        assert len(got) == len(want)
        for k, (a, e) in enumerate(zip(got, want)):
            assert_close(backend.to_numpy(a), t2n(e), rtol=1e-5, what=f"{name} output {k}")


# ---- meshgrid: its layer directly (the export needs string expressions) ----------------------


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_layer(backend, indexing):
    a, b, c = np.arange(3.0, dtype=np.float32), np.arange(4.0, dtype=np.float32) * 10, np.float32(7.0)
    want = torch.meshgrid(*(torch.tensor(v) for v in (a, b, c)), indexing=indexing)
    layer = make_layer(backend, "aten::meshgrid mg 2 1 0 1 2", 2)
    got = layer([backend.asarray(v) for v in (a, b, np.asarray(c))], indexing)
    assert isinstance(got, list) and len(got) == 3
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(backend.to_numpy(g), t2n(w), what=f"meshgrid {indexing} grid {k}")
    unpack = make_layer(backend, "prim::ListUnpack lu 1 3 0 1 2 3", 1)
    assert len(unpack(got)) == 3


# ---- errors ----------------------------------------------------------------------------------


def _arr(backend, *shape, dtype=np.float32):
    return backend.asarray(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape))


def test_products_reject_bad_operands(backend):
    mv = make_layer(backend, "torch.mv mv0 2 1 0 1 2 $input=0 $vec=1", 2)
    with pytest.raises(ShapeError, match=r"torch\.mv 'mv0': cannot multiply shapes \(3, 4\) and \(5,\)"):
        mv(_arr(backend, 3, 4), _arr(backend, 5))
    with pytest.raises(ShapeError, match=r"torch\.mv 'mv0': operands should have one dtype"):
        mv(_arr(backend, 3, 4), _arr(backend, 4, dtype=np.float64))
    with pytest.raises(ShapeError, match=r"torch\.mv 'mv0': vec should be 1-D"):
        mv(_arr(backend, 3, 4), _arr(backend, 4, 1))
    td = make_layer(backend, "aten::tensordot td 4 1 0 1 2 3 4", 4)
    with pytest.raises(ShapeError, match=r"aten::tensordot 'td': contracted dimensions need to match"):
        td(_arr(backend, 2, 3), _arr(backend, 4, 2), [1], [0])
    with pytest.raises(ShapeError, match=r"aten::tensordot 'td': dim 2 is out of range"):
        td(_arr(backend, 2, 3), _arr(backend, 3, 2), [2], [0])
    with pytest.raises(ShapeError, match=r"aten::tensordot 'td': both dim lists"):
        td(_arr(backend, 2, 3), _arr(backend, 3, 2), [1, 0], [0])
    md = make_layer(backend, "aten::linalg_multi_dot md 1 1 0 1", 1)
    with pytest.raises(ShapeError, match=r"aten::linalg_multi_dot 'md': tensors 0 and 1 .* cannot be multiplied"):
        md([_arr(backend, 2, 3), _arr(backend, 4, 2)])
    tr = make_layer(backend, "aten::trace tr 1 1 0 1", 1)
    with pytest.raises(ShapeError, match=r"aten::trace 'tr': not implemented for bool"):
        tr(backend.asarray(np.ones((2, 2), dtype=bool)))
    am = make_layer(backend, "aten::addmv am 5 1 0 1 2 3 4 5", 5)
    with pytest.raises(ShapeError, match=r"aten::addmv 'am': a float alpha/beta for integer tensors"):
        am(_arr(backend, 3, dtype=np.int64), _arr(backend, 3, 2, dtype=np.int64), _arr(backend, 2, dtype=np.int64),
           0.5, 1)
    with pytest.raises(ShapeError, match=r"aten::addmv 'am': input of shape \(4,\) does not broadcast"):
        am(_arr(backend, 4), _arr(backend, 3, 2), _arr(backend, 2), 1, 1)


def test_shape_builders_reject_bad_operands(backend):
    rot = make_layer(backend, "aten::rot90 rot 3 1 0 1 2 3", 3)
    with pytest.raises(ShapeError, match=r"aten::rot90 'rot': rotation dims should differ"):
        rot(_arr(backend, 2, 3), 1, [0, -2])
    with pytest.raises(ShapeError, match=r"aten::rot90 'rot': expected an input of >= 2 dims"):
        rot(_arr(backend, 3), 1, [0, 1])
    with pytest.raises(ShapeError, match=r"aten::rot90 'rot': dim 3 is out of range"):
        rot(_arr(backend, 2, 3), 1, [0, 3])
    me = make_layer(backend, "aten::linalg_matrix_exp me 1 1 0 1")
    with pytest.raises(ShapeError, match=r"aten::linalg_matrix_exp 'me': needs a floating tensor"):
        me(backend.asarray(np.eye(2, dtype=np.int64)))
    bad = np.stack([np.eye(3), np.eye(3) * 0.5])
    bad[0, 0, 1] = np.nan
    got = backend.to_numpy(me(backend.asarray(bad)))
    want = torch.linalg.matrix_exp(torch.from_numpy(bad)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # (the NaN matrix's result only)
    assert_close(got[1], want[1], rtol=1e-14)
    st = make_layer(backend, "aten::linalg_solve_triangular st 5 1 0 1 2 3 4 5", 5)
    with pytest.raises(ShapeError, match=r"aten::linalg_solve_triangular 'st': A of shape \(3, 3\) does not fit B "):
        st(backend.asarray(np.eye(3)), backend.asarray(np.ones((2, 2))), True, True, False)
    mp = make_layer(backend, "aten::linalg_matrix_power mp 2 1 0 1 2", 2)
    a = np.random.default_rng(3).standard_normal((2, 3, 3)) + 3 * np.eye(3)
    got = backend.to_numpy(mp(backend.asarray(a), -2))  # the inverse's square, float64
    assert_close(got, torch.linalg.matrix_power(torch.from_numpy(a), -2).numpy(), rtol=1e-12)
    with pytest.raises(ShapeError, match=r"aten::linalg_matrix_power 'mp': a negative power \(-1\) needs the "
                                         r"inverse of a floating matrix"):
        mp(backend.asarray(np.eye(2, dtype=np.int64)), -1)
    with pytest.raises(ShapeError, match=r"aten::linalg_matrix_power 'mp': needs a \(stack of\) square matrices"):
        mp(backend.asarray(np.ones((2, 3), np.float32)), 2)
    cs = make_layer(backend, "aten::channel_shuffle cs 2 1 0 1 2", 2)
    with pytest.raises(ShapeError, match=r"aten::channel_shuffle 'cs': 6 channels do not split into 4 groups"):
        cs(_arr(backend, 1, 6, 2), 4)
    with pytest.raises(ShapeError, match=r"aten::channel_shuffle 'cs': the number of groups should be positive"):
        cs(_arr(backend, 1, 6, 2), 0)
    with pytest.raises(ShapeError, match=r"aten::channel_shuffle 'cs': expects an input of > 2 dims"):
        cs(_arr(backend, 2, 6), 2)
    cr = make_layer(backend, "torch.cross cr 2 1 0 1 2 dim=None $input=0 $other=1", 2)
    with pytest.raises(ShapeError, match=r"torch\.cross 'cr': no dimension of size 3"):
        cr(_arr(backend, 2, 4), _arr(backend, 2, 4))
    with pytest.raises(ShapeError, match=r"torch\.cross 'cr': inputs dimension 0 must have length 3, found 3 and 1"):
        cr(_arr(backend, 3, 3), _arr(backend, 1, 3))
    with pytest.raises(ShapeError, match=r"torch\.cross 'cr': inputs must have the same number of dimensions"):
        cr(_arr(backend, 4, 3), _arr(backend, 3))
    hs = make_layer(backend, "aten::vstack vs 1 1 0 1", 1)
    with pytest.raises(ShapeError, match=r"aten::vstack 'vs': shapes \[\(1, 3\), \(1, 4\)\] do not fit together"):
        hs([_arr(backend, 3), _arr(backend, 4)])
    mg = make_layer(backend, "aten::meshgrid mg 2 1 0 1 2", 2)
    with pytest.raises(ShapeError, match=r"aten::meshgrid 'mg': indexing should be 'ij' or 'xy', found 'ji'"):
        mg([_arr(backend, 3)], "ji")
    with pytest.raises(ShapeError, match=r"aten::meshgrid 'mg': tensor 1 should be 0-D or 1-D"):
        mg([_arr(backend, 3), _arr(backend, 2, 2)], "ij")
    with pytest.raises(ShapeError, match=r"aten::meshgrid 'mg': operands should have one dtype"):
        mg([_arr(backend, 3), _arr(backend, 2, dtype=np.int64)], "ij")


def test_einsum_diagonal_sizes_must_match(backend):
    layer = make_layer(backend, "torch.einsum es 1 1 0 1 equation=ii->i", 1)
    with pytest.raises(ShapeError, match=r"torch\.einsum.*subscript 'i' is repeated in one operand but the sizes "
                                         r"differ, 3 != 4"):
        layer(_arr(backend, 3, 4))
    empty = layer(_arr(backend, 0, 0))
    assert tuple(empty.shape) == (0,)


def test_einsum_term_too_short_names_pnnx_ellipsis(backend):
    """pnnx writes '...chw,cd->...dhw' as 'ljk,li->ijk': the error says what happened."""
    layer = make_layer(backend, "torch.einsum es 2 1 0 1 2 equation=ljk,li->ijk", 2)
    with pytest.raises(ShapeError, match=r"einsum term 'ljk' does not match a 4-D operand \(pnnx drops the '\.\.\.'"):
        layer(_arr(backend, 2, 3, 4, 5), _arr(backend, 3, 6))


@pytest.mark.parametrize("dim", [1, -1])
def test_linalg_vecdot(tmp_path, dim):
    """``torch.linalg.vecdot`` (pnnx: ``aten::linalg_vecdot`` with dim as a third input) was
    refused as unsupported."""
    m = Fn(lambda s, a, b: torch.linalg.vecdot(a, b, dim=dim))
    a, b = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    param = export_module(m, (a, b), tmp_path, inputs2=(torch.randn(3, 5, 4), torch.randn(3, 5, 4)))
    g = kuiper_xp.load(param, backend="numpy")
    for n in (1, 4):
        a, b = torch.randn(n, 5, 4), torch.randn(n, 5, 4)
        assert_close(np.asarray(g(a.numpy(), b.numpy())[0]), m(a, b).numpy(), rtol=1e-5)
