"""Less common operators: advanced indexing (Tensor.index), one_hot, scatter, embedding_bag,
bilinear, distances (cosine similarity, pairwise distance, cdist), unfold/fold, LocalResponseNorm, var_mean/std_mean,
grid_sample/affine_grid (every mode, padding and align_corners) and the list-valued chunk of
traced RNN cells (aten::unsafe_chunk + prim::ListUnpack): pnnx exports of small torch modules
run on every backend leg and compared with torch; plus the errors a bad index gets. A runtime
bool mask (``a[a.sum(1) > 0]``) and ``F.one_hot(x)`` (num_classes=-1) are data-dependent: a graph
traced with one count runs on inputs with another."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import bad_value, case_exporter
from test_layers_misc import compare_graph, make_layer, t2n
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


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=_g(seed))


# name -> (module, inputs, types the export must contain)
def _theta(n, dims=2):
    """n different 2x3 (3x4 for dims=3) affine matrices near the identity."""
    base = (torch.tensor([[0.8, 0.3, 0.1], [-0.2, 1.1, 0.0]]) if dims == 2 else
            torch.tensor([[0.9, 0.2, -0.1, 0.1], [-0.2, 1.1, 0.05, 0.0], [0.1, -0.1, 0.95, -0.2]]))
    return base + 0.05 * torch.arange(n, dtype=torch.float32).view(n, 1, 1)


CASES = {
    "index_const": (Fn(lambda s, x: x[:, [0, 2, 3]] * 2), (_r(2, 5, 3),), {"Tensor.index"}),
    # (a constant 2-D index list is written flattened to its first row by pnnx 2.13, and the
    # output annotation check then refuses the graph: not tested here)
    "index_const_neg": (Fn(lambda s, x: x[:, :, [1, -1, 0]]), (_r(2, 3, 4),), {"Tensor.index"}),
    "index_mask": (Fn(lambda s, x: x[:, :, torch.tensor([True, False, True, True])]), (_r(2, 3, 4),),
                   {"Tensor.index"}),
    "index_input": (Fn(lambda s, x, i: x[:, i] + 1), (_r(2, 5, 3), torch.tensor([4, 0, -1, 2])), {"Tensor.index"}),
    "index_pair": (Fn(lambda s, x, i, j: x[i, j]), (_r(4, 5, 3), torch.tensor([0, 3, 3]), torch.tensor([[1], [4]])),
                   {"Tensor.index"}),
    "index_apart": (Fn(lambda s, x, i, j: x[i, :, j]), (_r(4, 5, 3), torch.tensor([0, 3]), torch.tensor([2, 1])),
                    {"Tensor.index"}),
    "one_hot": (Fn(lambda s, x: F.one_hot(x, 7).float() * 3), (torch.tensor([[0, 6, 2], [1, 1, 5]]),),
                {"aten::one_hot"}),
    # every data-indexed lookup whose range is checked (kuiper_xp.layers.checks), one input each
    "lookups": (Fn(lambda s, x, e, g, k, j, h: (s.m[0](e), torch.gather(x, 1, g), x.index_select(1, k),
                                                 x[:, j], F.one_hot(h, 9)), nn.Embedding(9, 3)),
                (_r(2, 6), torch.tensor([[0, 8, 3]]), torch.tensor([[5, 0], [1, 2]]), torch.tensor([2, 5, 0]),
                 torch.tensor([1, -6]), torch.tensor([8, 0])),
                {"nn.Embedding", "torch.gather", "torch.index_select", "Tensor.index", "aten::one_hot"}),
    # scatter(reduce='multiply'): pnnx passes the reduction as a fifth input (was refused)
    "scatter_multiply": (Fn(lambda s, x, i: torch.scatter(x, 1, i, x[:, :4] + 2, reduce="multiply")),
                         (_r(3, 6), torch.tensor([[0, 0, 2, 1], [5, 5, 5, 0], [3, 1, 1, 4]])), {"aten::scatter"}),
    "scatter": (Fn(lambda s, x, i: torch.zeros(3, 8).scatter(1, i, x)),
                (_r(3, 2), torch.tensor([[0, 7], [2, 3], [5, 4]])), {"aten::scatter"}),
    "scatter_value": (Fn(lambda s, x, i: x.scatter(1, i, x[:, :2] * 3) + torch.scatter(x, 0, i, 2.0)),
                      (_r(3, 8), torch.tensor([[0, 1], [2, 0], [1, 1]])), {"aten::scatter"}),
    # Informer's form: top-k rows put back along axis 2, index covering part of the other axes
    "scatter_topk": (Fn(lambda s, x, v: torch.scatter(x, 2, torch.topk(v[:, :3, :, :6], 5, dim=2)[1], v[:, :3, :5, :6] * 2)),
                     (_r(2, 4, 12, 8), _r(2, 4, 12, 8, seed=1)), {"aten::scatter", "torch.topk"}),
    "cosine": (Fn(lambda s, a, b: F.cosine_similarity(a, b, dim=1)), (_r(3, 8, 2), _r(3, 8, 1, seed=1)),
               {"aten::cosine_similarity"}),
    # torch divides by each norm first: a norm that overflows gives 0, tiny vectors keep their size
    "cosine_extreme_scales": (Fn(lambda s, a, b: (F.cosine_similarity(a * 1e20, b.flip(1) * 1e20, dim=1),
                                                  F.cosine_similarity(a * 1e-25, b * 1e-25, dim=1) * 1e33)),
                              (_r(3, 8), _r(3, 8, seed=1)), {"aten::cosine_similarity"}),
    "pairwise": (Fn(lambda s, a, b: F.pairwise_distance(a, b, p=3.0, keepdim=True)), (_r(3, 8), _r(3, 8, seed=1)),
                 {"F.pairwise_distance"}),
    "cdist": (Fn(lambda s, a, b: torch.cdist(a, b)), (_r(2, 5, 4), _r(2, 6, 4, seed=1)), {"aten::cdist"}),
    "cdist_p1": (Fn(lambda s, a, b: torch.cdist(a, b, p=1.0)), (_r(5, 4), _r(6, 4, seed=1)), {"aten::cdist"}),
    # more than 25 rows: torch's matrix-product form (and the broadcast one when told not to)
    "cdist_mm": (Fn(lambda s, a, b: torch.cdist(a, b) + torch.cdist(
        a, b, compute_mode="donot_use_mm_for_euclid_dist") + torch.cdist(a, b[:, :1], compute_mode="use_mm_for_euclid_dist")),
        (_r(2, 40, 24), _r(2, 30, 24, seed=1)), {"aten::cdist"}),
    "unfold": (Fn(lambda s, x: F.unfold(x, (3, 2), dilation=(1, 2), padding=1, stride=(2, 1))), (_r(2, 3, 7, 8),),
               {"F.unfold"}),
    "fold": (Fn(lambda s, x: F.fold(x, (7, 6), 3, padding=1, stride=2)), (_r(2, 18, 12),), {"F.fold"}),
    "unfold_fold": (Fn(lambda s, x: s.m[1](s.m[0](x) * 2), nn.Unfold(2, stride=2), nn.Fold((6, 8), 2, stride=2)),
                    (_r(1, 4, 6, 8),), {"nn.Unfold", "nn.Fold"}),
    "lrn": (Fn(lambda s, x: s.m[0](x), nn.LocalResponseNorm(4, alpha=0.3, beta=0.6, k=1.5)), (_r(2, 7, 3, 5) * 3,),
            {"nn.LocalResponseNorm"}),
    "lrn_3d": (Fn(lambda s, x: s.m[0](x), nn.LocalResponseNorm(3)), (_r(2, 5, 6),), {"nn.LocalResponseNorm"}),
    # one large channel (k=0): window sums as differences of cumulative sums cancelled to 0 or inf
    "lrn_large": (Fn(lambda s, x: s.m[0](x), nn.LocalResponseNorm(3, alpha=1.0, beta=0.5, k=0.0)),
                  (torch.tensor([[1e4, 1.0, 1.0, 1e-2, 1.0, 1.0, 2.0, 1.0]]).reshape(1, 8, 1),),
                  {"nn.LocalResponseNorm"}),
    "var_mean": (Fn(lambda s, x: torch.var_mean(x, dim=1)), (_r(3, 8, 2),), {"aten::var_mean"}),
    "std_mean_keep": (Fn(lambda s, x: torch.std_mean(x, dim=(0, 2), keepdim=True, correction=0)), (_r(3, 8, 2),),
                      {"aten::std_mean"}),
    **{f"grid_{mode}_{pad}_{int(align)}": (
        Fn(lambda s, x, g, mode=mode, pad=pad, align=align: F.grid_sample(x, g, mode, pad, align)),
        (_r(2, 3, 5, 7), torch.rand(2, 4, 6, 2, generator=_g(1)) * 3 - 1.5), {"F.grid_sample"})
       for mode in ("bilinear", "nearest", "bicubic") for pad in ("zeros", "border", "reflection") for align in (False, True)},
    # an inf in the first pixel of every plane: reads outside the map add nothing (not 0 * inf)
    **{f"grid_inf_{mode}_{pad}": (
        Fn(lambda s, x, g, mode=mode, pad=pad: F.grid_sample(x, g, mode, pad, False)),
        (_r(2, 3, 5, 7).index_put_((torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([0, 0]),
                                    torch.tensor([0, 0])), torch.tensor(float("inf"))),
         torch.rand(2, 4, 6, 2, generator=_g(1)) * 3 - 1.5), {"F.grid_sample"})
       for mode in ("bilinear", "nearest", "bicubic") for pad in ("zeros", "border")},
    "grid3d_inf": (Fn(lambda s, x, g: F.grid_sample(x, g, "bilinear", "zeros", False)),
                   (_r(2, 3, 4, 5, 6).index_put_((torch.tensor([0]), torch.tensor([1]), torch.tensor([0]),
                                                  torch.tensor([0]), torch.tensor([0])), torch.tensor(float("-inf"))),
                    torch.rand(2, 3, 4, 5, 3, generator=_g(2)) * 3 - 1.5), {"F.grid_sample"}),
    # volumes (VoxelMorph's spatial transformer): trilinear / nearest reads of a 5-D input
    **{f"grid3d_{mode}_{pad}_{int(align)}": (
        Fn(lambda s, x, g, mode=mode, pad=pad, align=align: F.grid_sample(x, g, mode, pad, align)),
        (_r(2, 3, 4, 5, 6), torch.rand(2, 3, 4, 5, 3, generator=_g(2)) * 3 - 1.5), {"F.grid_sample"})
       for mode in ("bilinear", "nearest") for pad in ("zeros", "border", "reflection") for align in (False, True)},
    "stn3d_dynamic": (Fn(lambda s, x, t: F.grid_sample(x, F.affine_grid(t, x.size(), align_corners=True),
                                                        align_corners=True)),
                      (_r(2, 2, 4, 6, 5), _theta(2, 3)), {"F.grid_sample", "F.affine_grid"},
                      (_r(3, 2, 4, 6, 5, seed=1), _theta(3, 3))),
    "stn": (Fn(lambda s, x, t: F.grid_sample(x, F.affine_grid(t, (2, 3, 6, 5), align_corners=False),
                                              align_corners=False)),
            (_r(2, 3, 8, 8), torch.tensor([[[0.8, 0.3, 0.1], [-0.2, 1.1, 0.0]], [[1.0, 0.0, 0.5], [0.0, 0.5, -0.3]]])),
            {"F.grid_sample", "F.affine_grid"}),
    "affine_grid_corners": (Fn(lambda s, t: F.affine_grid(t, (1, 2, 4, 7), align_corners=True)),
                            (torch.tensor([[[0.8, 0.3, 0.1], [-0.2, 1.1, 0.0]]]),), {"F.affine_grid"}),
    # a dynamic batch: pnnx passes affine_grid's size as an input ($size=, fed by
    # [size(@0,0),3,8,8]); the 4th entry is the second example input that makes the export dynamic
    "stn_dynamic": (Fn(lambda s, x, t: F.grid_sample(x, F.affine_grid(t, x.size(), align_corners=False),
                                                      align_corners=False)),
                    (_r(2, 3, 8, 8), _theta(2)), {"F.grid_sample", "F.affine_grid"}, (_r(3, 3, 8, 8, seed=1), _theta(3))),
    "embedding_bag": (Fn(lambda s, ids: (s.m[0](ids), s.m[1](ids), s.m[2](ids)),
                         nn.EmbeddingBag(10, 4, mode="mean"), nn.EmbeddingBag(10, 4, mode="sum", padding_idx=2),
                         nn.EmbeddingBag(10, 4, mode="max")),
                      (torch.tensor([[1, 2, 4], [2, 2, 2], [9, 0, 2]]),),  # (the middle bag is all padding)
                      {"aten::embedding_bag", "aten::numel"}),
    # mode sum without padding_idx: torch's offset2bag is empty, per-sample weights
    "embedding_bag_sum": (Fn(lambda s, ids, w: (s.m[0](ids), s.m[0](ids, per_sample_weights=w)),
                             nn.EmbeddingBag(10, 4, mode="sum")),
                          (torch.tensor([[1, 2, 4], [2, 2, 2], [9, 0, 2]]), _r(3, 3, seed=2)), {"aten::embedding_bag"}),
    # F.embedding_bag with a constant table, include_last_offset and per-sample weights: torch's
    # (unused) bag_size / max_indices have one entry per offset, the last included
    "embedding_bag_last_offset": (
        Fn(lambda s, x, w: F.embedding_bag((x[0, :4].abs() * 3).long().clamp(0, 9), w, torch.tensor([0, 2, 4]),
                                           mode="sum", per_sample_weights=x[0, 4:8], include_last_offset=True)),
        (_r(1, 8), _r(10, 4, seed=1)), {"aten::embedding_bag"}),
    "bilinear": (Fn(lambda s, a, b: (s.m[0](a, b), s.m[1](a, a)), nn.Bilinear(4, 5, 3), nn.Bilinear(4, 4, 2, bias=False)),
                 (_r(2, 7, 4), _r(2, 7, 5, seed=1)), {"aten::bilinear"}),
    "gru_cell": (Fn(lambda s, x, h: s.m[0](x, h), nn.GRUCell(4, 6)), (_r(2, 4), _r(2, 6, seed=1)),
                 {"aten::unsafe_chunk", "prim::ListUnpack"}),
    "lstm_cell": (Fn(lambda s, x, h, c: s.m[0](x, (h, c)), nn.LSTMCell(4, 6)), (_r(2, 4), _r(2, 6, seed=1), _r(2, 6, seed=2)),
                  {"aten::unsafe_chunk", "prim::ListUnpack"}),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return case_exporter(tmp_path_factory, CASES)


def _same_as_torch(backend, got, want, name):
    """Every output has torch's shape, dtype and values."""
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        a = backend.to_numpy(a)
        assert a.shape == tuple(e.shape), (k, a.shape, tuple(e.shape))
        assert a.dtype == t2n(e).dtype, (k, a.dtype, t2n(e).dtype)
        assert_close(a, t2n(e), rtol=1e-5, what=f"{name} output {k}")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    module, inputs, *_ = CASES[name]
    param = exported(name)
    with torch.no_grad():
        want = module.eval()(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    g = kuiper_xp.load(param, backend=backend)
    _same_as_torch(backend, g(*[t2n(t) for t in inputs]), want, name)


def test_affine_grid_takes_its_size_from_an_input(backend, exported):
    module = CASES["stn_dynamic"][0]
    param = exported("stn_dynamic")
    assert "$size=" in param.read_text(), "pnnx no longer passes affine_grid's size as an input"
    g = kuiper_xp.load(param, backend=backend)
    for n in (1, 4):
        inputs = (_r(n, 3, 8, 8, seed=n), _theta(n))
        with torch.no_grad():
            want = module.eval()(*inputs)
        _same_as_torch(backend, g(*[t2n(t) for t in inputs]), (want,), f"stn_dynamic batch {n}")


def _runtime_masks(s, a, k):
    rows = a[a.sum(1) > 0]  # (pnnx annotates one example count)
    return rows * 2, rows.sum(0), a[:, a[0] > 0].sum(1), a[a > 0], a[k > 0, 1:], F.one_hot(k.clamp(min=0)).sum(0)


DATA_DEPENDENT = {
    # name -> (module, traced inputs, other inputs (all / none / some true), types)
    "runtime_mask": (Fn(_runtime_masks), (_r(5, 3), torch.tensor([1, -1, 0, 3, 2])),
                     [(torch.ones(5, 3), torch.tensor([5, 6, 7, 8, 9])), (-torch.ones(5, 3), torch.tensor([0, -1, 0, -2, 0])),
                      (_r(5, 3, seed=9), torch.tensor([0, 0, 1, 0, 0]))],
                     {"Tensor.index", "aten::one_hot"}),
}


@pytest.mark.parametrize("name", list(DATA_DEPENDENT))
def test_runtime_masks_are_data_dependent(name, backend, exported):
    module, inputs, others, types = DATA_DEPENDENT[name]
    g = kuiper_xp.load(exported(name, module, inputs, types), backend=backend)
    assert all(d is None for spec in g.outputs for d in spec.shape or ()), g.outputs
    for ins in (inputs, *others):
        with torch.no_grad():
            want = module.eval()(*ins)
        _same_as_torch(backend, g(*[t2n(t) for t in ins]), want, name)


def test_constant_and_integer_indices_keep_full_shape_checks(backend, exported):
    """A constant mask (folded into ``expr=``), a mask computed from constants only, integer index
    inputs and a fixed one_hot class count are not data-dependent."""
    from kuiper_xp.layers import BuildContext, registry
    from kuiper_xp.pnnx.param import parse_param_text

    for name in ("index_mask", "index_input", "index_pair", "one_hot"):
        g = kuiper_xp.load(exported(name), backend=backend)
        assert not g._data_dependent, name
        assert all(d is not None for spec in g.outputs for d in spec.shape), (name, g.outputs)
    text = ("7767517\n7 7\npnnx.Input in 0 1 0 #0=(4,5)f32\npnnx.Attribute w 0 1 1 @data=(5)f32 #1=(5)f32\n"
            "torch.gt gt 1 1 1 2 other=0 $input=1 #1=(5)f32 #2=(5)bool\n"
            "pnnx.Expression e 1 1 2 3 expr=[None,@0] #2=(5)bool\n"
            "Tensor.index ix 2 1 0 3 4 $input=0 $expr=3 #0=(4,5)f32 #4=(4,3)f32\n"
            "torch.rand r 0 1 5 size=(5) #5=(5)f32\n"
            "pnnx.Expression e2 1 1 5 6 expr=[None,@0] #5=(5)f32\n")
    ops = {op.name: op for op in parse_param_text(text).operators}
    ctx = BuildContext(backend)
    assert not registry.create(ops["ix"], ctx).data_dependent_shape  # (computed from a weight only)
    from kuiper_xp.layers.indexing import runtime_mask

    assert not runtime_mask(ops["ix"].inputs[1])
    assert runtime_mask(ops["e2"].outputs[0]) is False  # (float, not a mask: an integer index's count is fixed)
    bad = ops["r"].outputs[0]
    bad.dtype = "bool"
    assert runtime_mask(ops["e2"].outputs[0])  # (a random mask is not a constant)


def test_index_errors_name_the_operator(exported, backend):
    g = kuiper_xp.load(exported("index_input"), backend=backend)
    x = t2n(_r(2, 5, 3))
    with pytest.raises(ShapeError, match=rf"Tensor\.index.*index {bad_value(backend, 5)}is out of range for axis 1 of size 5"):
        g(x, np.array([5, 0, 1, 2]))
    with pytest.raises(ShapeError, match=rf"index {bad_value(backend, -6)}is out of range"):
        g(x, np.array([-6, 0, 1, 2]))
    layer = make_layer(backend, "Tensor.index idx 2 1 0 1 2 $input=0 $expr=1", 2)
    xb = backend.asarray(x)
    with pytest.raises(ShapeError, match=r"do not broadcast"):
        layer(xb, [backend.asarray(np.array([0, 1, 1])), backend.asarray(np.array([0, 1]))])
    with pytest.raises(ShapeError, match=r"must be integer or bool"):
        layer(xb, [None, backend.asarray(np.array([0.0, 1.0], np.float32))])
    with pytest.raises(ShapeError, match=r"4 indices for an input of shape \(2, 5, 3\)"):
        layer(xb, [None, None, None, None])


def test_constant_indices_are_range_checked_from_their_known_bounds(backend):
    """A constant index list (``x[:, [0, 4, -5]]``) keeps its min and max from the file: checked
    against each input's size without reading the array; the one index array is a plain take."""
    from test_layers_misc import make_layer

    layer = make_layer(backend, "Tensor.index ix 1 1 0 1 expr=[None,[[0,4],[-4,2]]]")
    assert layer.bounds == [None, (-4, 4)]
    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    got = backend.to_numpy(layer(backend.asarray(x)))
    assert_close(got, t2n(torch.from_numpy(x)[:, torch.tensor([[0, 4], [-4, 2]])]))
    with pytest.raises(ShapeError, match=r"index 4 is out of range for axis 1 of size 4"):
        layer(backend.asarray(x[:, :4]))
    with pytest.raises(ShapeError, match=r"index -5 is out of range for axis 1 of size 4"):
        make_layer(backend, "Tensor.index ix 1 1 0 1 expr=[None,[-5,2]]")(backend.asarray(x[:, :4]))


def test_one_hot_and_scatter_reject_out_of_range(exported, backend):
    g = kuiper_xp.load(exported("one_hot"), backend=backend)
    with pytest.raises(ShapeError, match=r"aten::one_hot.*\[0, 7\)"):
        g(np.array([[0, 7, 1], [0, 0, 0]]))
    g = kuiper_xp.load(exported("scatter"), backend=backend)
    with pytest.raises(ShapeError, match=r"aten::scatter.*out of range"):
        g(t2n(_r(3, 2)), np.array([[0, 8], [1, 1], [2, 2]]))


LOOKUP_ERRORS = [  # (input position, bad value, the error)
    (1, [[0, 9, 3]], r"nn\.Embedding.*out of range for an embedding table of 9 rows"),
    (2, [[6, 0], [1, 2]], r"torch\.gather.*out of range for a dimension of size 6"),
    (3, [2, -1, 0], r"torch\.index_select.*out of range for a dimension of size 6"),
    (4, [1, 6], r"Tensor\.index.*out of range for axis 1 of size 6"),
    (5, [9, 0], r"aten::one_hot.*class values must be in \[0, 9\)"),
]


class _NumpyRangeKernel:
    """A backend's ``fast`` holding a ``range_check`` kernel written with numpy (on numpy legs;
    cupy's is the real one): the protocol of kuiper_xp.layers.checks.PendingChecks.check."""

    def __init__(self, fast):
        self._fast, self.calls = fast, 0

    def __getattr__(self, name):
        return getattr(self._fast, name)

    def range_check(self, index, lo, hi, k, code):
        if not isinstance(index, np.ndarray):
            return None
        self.calls += 1
        if code[0] == 0 and ((index < lo) | (index >= hi)).any():
            code[0] = k
        return np.clip(index, lo, hi - 1)


@pytest.mark.parametrize("kernel", [False, True], ids=["generic", "kernel"])
@pytest.mark.parametrize("replayed", [False, True], ids=["eager", "replayed"])
def test_range_checks_deferred_to_the_end_of_a_pass(exported, backend, replayed, kernel):
    """Where reading device values on the host is not cheap (a GPU: the check would stop the
    device and a CUDA-graph capture), a pass's range checks are flags on the device, read once
    when the pass ends (kuiper_xp.layers.checks): the same results as torch, and each bad index
    still a ShapeError naming its operator, also when the pass comes from a replayer (the flags
    its last output). ``kernel``: through the backend's one-kernel ``fast.range_check`` (cupy's;
    a numpy stand-in on the numpy legs), else the generic comparisons."""
    deferred = copy.copy(backend)
    deferred.cheap_host_reads = False
    has_kernel = getattr(backend.fast, "range_check", None) is not None
    if kernel and not has_kernel:
        if backend.name != "numpy":
            pytest.skip("this backend has no range-check kernel")
        deferred.fast = _NumpyRangeKernel(backend.fast)
    elif not kernel and has_kernel:
        deferred.fast = None
    g = kuiper_xp.load(exported("lookups"), backend=deferred)
    if replayed:
        runs = []
        g._replayer, g.cuda_graphs = (lambda xs, run: runs.append(1) or run(xs)), True
    module, inputs, _ = CASES["lookups"]
    with torch.no_grad():
        want = module.eval()(*inputs)
    got = g(*[t2n(t) for t in inputs])
    _same_as_torch(backend, got, want, "lookups")
    for pos, bad, error in LOOKUP_ERRORS:
        args = [t2n(t) for t in inputs]
        args[pos] = np.array(bad)
        with pytest.raises(ShapeError, match=error):
            g(*args)
    assert not replayed or len(runs) == 1 + len(LOOKUP_ERRORS)
    if isinstance(deferred.fast, _NumpyRangeKernel):
        assert deferred.fast.calls >= 1 + len(LOOKUP_ERRORS)  # (used in every pass)
    # two bad lookups in one pass: the first in the pass's order is named, as the host checks do
    args = [t2n(t) for t in inputs]
    args[1], args[2] = np.array([[0, 9, 3]]), np.array([[6, 0], [1, 2]])
    plain = kuiper_xp.load(exported("lookups"), backend=backend)
    with pytest.raises(ShapeError) as first:
        plain(*args)
    error = next(e for _, _, e in LOOKUP_ERRORS[:2] if re.search(e, str(first.value)))
    with pytest.raises(ShapeError, match=error):
        g(*args)
    # the same errors with the bad value named where the checks read the host
    args = [t2n(t) for t in inputs]
    args[1] = np.array([[0, 9, 3]])
    with pytest.raises(ShapeError, match=rf"index {bad_value(backend, 9)}is out of range for an embedding table"):
        plain(*args)


def test_fold_rejects_a_wrong_block_count(backend):
    layer = make_layer(backend, "F.fold f 1 1 0 1 dilation=(1,1) kernel_size=(3,3) output_size=(7,6) "
                                "padding=(1,1) stride=(2,2) $input=0")
    with pytest.raises(ShapeError, match=r"F\.fold.*\(N, C\*9, 12\)"):
        layer(backend.asarray(t2n(_r(2, 18, 10))))


@pytest.mark.parametrize("out,blocks", [((1, 1), 1), ((2, 2), 0)])
def test_fold_rejects_an_output_smaller_than_the_kernel(backend, out, blocks):
    """No block fits: (-1) * (-1) or 0 * 0 blocks matched the input's count before (a numpy
    reshape error, or zeros where torch refuses)."""
    layer = make_layer(backend, "F.fold f 1 1 0 1 dilation=(1,1) kernel_size=(3,3) "
                                f"output_size=({out[0]},{out[1]}) padding=(0,0) stride=(1,1) $input=0")
    with pytest.raises(ShapeError, match="no sliding block fits"):
        layer(backend.asarray(t2n(_r(2, 9, blocks))))


@pytest.mark.parametrize("expr,needle", [
    ("[None,[1,2]", "bad index expression"),
    ("[None,[1.5,2]]", "unsupported index item"),
    ("[None,[1,True]]", "mixes booleans and integers"),
    ("[None,add(@0,1)]", "unsupported index item"),
])
def test_bad_constant_index_lists_are_refused_at_build(backend, expr, needle):
    from kuiper_xp.errors import LayerParameterError

    with pytest.raises(LayerParameterError, match=needle):
        make_layer(backend, f"Tensor.index idx 1 1 0 1 expr={expr}")


def test_list_unpack_checks_the_item_count(backend):
    layer = make_layer(backend, "prim::ListUnpack u 1 2 0 1 2")
    a = backend.asarray(np.zeros(2, np.float32))
    assert len(layer([a, a])) == 2
    with pytest.raises(ShapeError, match=r"a list of 3 items for 2 outputs"):
        layer([a, a, a])
    with pytest.raises(ShapeError, match=r"expected a list"):
        layer(a)


def test_constant_index_lists_read_like_the_expression_parser():
    """The JSON fast path for plain constant index lists (a gather over a fixed graph's edges is
    a literal of tens of thousands of integers) gives what the expression parser gives, and
    anything else still goes to the parser and its errors."""
    from kuiper_xp.errors import LayerParameterError
    from kuiper_xp.expression import parse
    from kuiper_xp.layers.indexing import _literal, literal_text

    big = "[None,[" + ",".join(str(i * 7 % 2003 - 50) for i in range(5000)) + "]]"
    for text in ("[None,[1,-2,3]]", "5", "-4", "None", "[True,False]", "[[0,1],[2,3]]", "[None,None,[1]]", "[-0]",
                 "[ 1 , 2 ]", "[01]", big):
        got, want = literal_text(text, "here"), _literal(parse(text), "here")
        assert got == want and repr(got) == repr(want), text
    with pytest.raises(LayerParameterError, match=r"here: bad index expression '\[1,,2\]'"):
        literal_text("[1,,2]", "here")
    for text in ("[1.5]", "[1e5]", "[@0]", "[NaN]", "[Infinity]", "[\"a\"]"):
        with pytest.raises(LayerParameterError, match=r"here: (unsupported index item|bad index expression)"):
            literal_text(text, "here")


def test_scatter_duplicates_fast_and_generic_agree():
    """Duplicate indices along the axis: the numpy path (np.put_along_axis) and the generic one
    (the one-hot comparison) both keep the last write along the axis."""
    from kuiper_xp.backends import get_backend

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 7, 5)).astype(np.float32)
    idx = rng.integers(0, 7, (3, 9, 4))  # 9 writes into 7 rows: duplicates
    src = rng.standard_normal((3, 9, 4)).astype(np.float32)
    want = x.copy()
    for a in range(3):
        for k in range(9):
            for c in range(4):
                want[a, idx[a, k, c], c] = src[a, k, c]
    got = {}
    for name in ("numpy", "array_api_strict"):
        be = get_backend(name)
        layer = make_layer(be, "aten::scatter sc 3 1 0 1 2 3 dim=1 $input=0 $index=1 $src=2", 3)
        got[name] = be.to_numpy(layer(be.asarray(x), be.asarray(idx), be.asarray(src)))
    np.testing.assert_array_equal(got["numpy"], want)
    np.testing.assert_array_equal(got["array_api_strict"], want)


@pytest.mark.parametrize("cases", [
    [(1, 5, 9, 11, 7, 13), (3, 5, 9, 11, 7, 13)],  # image by image; a batch of small images read at once
    [(40, 1, 8, 8, 5, 5)],  # RAFT's lookup: many one-channel images, a few points each
    [(2, 40, 9, 11, 16, 16)],  # more channel-points per image than GATHER_BATCHED_MAX: image by image
], ids=["small", "raft", "wide"])
@pytest.mark.parametrize("mode,pad", [("bilinear", "zeros"), ("bicubic", "reflection"), ("nearest", "border")])
def test_grid_sample_numpy_gather_is_the_generic_path(monkeypatch, mode, pad, cases):
    """The numpy gather (np.take per image, positions split over the threads when images are
    few; blocks of images read at once by flat positions when each is small) gives the generic
    take_along_axis path's bits."""
    from kuiper_xp.backends import get_backend

    be = get_backend("numpy")
    monkeypatch.setattr(be.fast, "PARALLEL_MIN_ELEMENTS", 1)
    layer = make_layer(be, f"F.grid_sample gs 2 1 0 1 2 align_corners=True mode={mode} padding_mode={pad} "
                           "$input=0 $grid=1", 2)
    rng = np.random.default_rng(5)
    for n, c, h, w, ho, wo in cases:
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        g = (rng.random((n, ho, wo, 2)) * 2.6 - 1.3).astype(np.float32)
        old = be.fast.set_num_threads(2)
        try:
            with be.fast.compute_scope():
                fast = layer(x, g)
        finally:
            be.fast.set_num_threads(old)
        monkeypatch.setattr(be.fast, "gather_taps", lambda *a: None)
        generic = layer(x, g)
        monkeypatch.undo()
        monkeypatch.setattr(be.fast, "PARALLEL_MIN_ELEMENTS", 1)
        np.testing.assert_array_equal(fast, generic)
        want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(g), mode=mode, padding_mode=pad, align_corners=True)
        assert_close(fast, want.numpy(), rtol=1e-5)


def test_grid_sample_volume_errors(backend):
    """Bicubic on a volume is refused, as torch refuses it; a grid of the wrong rank names both
    forms."""
    x = backend.asarray(np.zeros((1, 2, 3, 4, 5), np.float32))
    with pytest.raises(RuntimeError):
        F.grid_sample(torch.zeros(1, 2, 3, 4, 5), torch.zeros(1, 2, 2, 2, 3), mode="bicubic", align_corners=False)
    layer = make_layer(backend, "F.grid_sample gs 2 1 0 1 2 align_corners=False mode=bicubic padding_mode=zeros "
                                "$input=0 $grid=1", 2)
    with pytest.raises(ShapeError, match="bicubic needs a 4-D input"):
        layer(x, backend.asarray(np.zeros((1, 2, 2, 2, 3), np.float32)))
    with pytest.raises(ShapeError, match=r"or input \(N, C, D, H, W\) and grid \(N, Do, Ho, Wo, 3\)"):
        layer(x, backend.asarray(np.zeros((1, 2, 2, 2), np.float32)))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("pad", ["border", "reflection", "zeros"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_non_finite_coordinates(backend, mode, pad, align):
    """NaN grid coordinates (and, reflected, infinite ones) read the first pixel with border and
    reflection padding, as torch documents and does; they gave NaN (bilinear) or 0 (nearest)."""
    layer = make_layer(backend, f"F.grid_sample gs 2 1 0 1 2 align_corners={align} mode={mode} "
                                f"padding_mode={pad} $input=0 $grid=1", 2)
    nan, inf = float("nan"), float("inf")
    x = torch.arange(32.0).reshape(2, 1, 4, 4)
    g = torch.tensor([[[[nan, 0.0], [-1.0, 0.0], [0.0, nan], [inf, 0.0], [-inf, 0.0], [0.3, -0.2]]]] * 2)
    want = F.grid_sample(x, g, mode=mode, padding_mode=pad, align_corners=align).numpy()
    got = backend.to_numpy(layer(backend.asarray(x.numpy()), backend.asarray(g.numpy())))
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)), (got, want)
    assert_close(got[finite], want[finite], rtol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_bag_segments_match_torch(backend, mode, padding_idx):
    """Bags of uneven lengths (empty ones, repeated offsets, a last bag to the end), ties and a
    NaN row for max, 600 bags: every result of torch's ``embedding_bag`` (the max rows' indices
    too)."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(12, 5, generator=gen)
    weight[7] = weight[2]  # ties
    weight[9, 1] = float("nan")
    lengths = torch.randint(0, 5, (600,), generator=gen)
    lengths[:3] = torch.tensor([0, 0, 9])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    ids = torch.randint(0, 12, (int(lengths.sum()),), generator=gen)
    want = torch.ops.aten._embedding_bag_forward_only(weight, ids, offsets, False, mode, False, None, False,
                                                      -1 if padding_idx is None else padding_idx)
    layer = make_layer(backend, "aten::embedding_bag eb 9 4 0 1 2 3 4 5 6 7 8 9 10 11 12", 9)
    layer.n_out = 4
    got = layer(backend.asarray(t2n(weight)), backend.asarray(t2n(ids)), backend.asarray(t2n(offsets)), False,
                mode, False, None, None, padding_idx)
    names = ("output", "offset2bag", "bag_size", "max_indices")
    for k in range(4):
        assert_close(backend.to_numpy(got[k]), t2n(want[k]), rtol=1e-5, what=names[k])


@pytest.mark.parametrize("mode", [0, 1, 2], ids=["sum", "mean", "max"])
@pytest.mark.parametrize("include_last", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_even_bags_match_torch(backend, mode, include_last, weighted):
    """Bags of one length (a 2-D input's offsets from arange: summed over an axis rather than by
    segments), with include_last_offset and per-sample weights (mode sum only): every result of
    torch's ``embedding_bag``, shapes included; bags of 3 that look even but are not (an offset
    moved) take the segments."""
    if weighted and mode != 0:
        pytest.skip("per_sample_weights needs mode sum")
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(50, 6, generator=gen)
    ids = torch.randint(0, 50, (64 * 3,), generator=gen)
    psw = torch.randn(ids.shape[0], generator=gen) if weighted else None
    for offsets in (torch.arange(0, ids.shape[0], 3), torch.tensor([0, 3, 5] + list(range(9, 192, 3)))):
        offs = torch.cat([offsets, torch.tensor([ids.shape[0]])]) if include_last else offsets
        want = torch.ops.aten._embedding_bag_forward_only(weight, ids, offs, False, mode, False, psw,
                                                          include_last, -1)
        layer = make_layer(backend, "aten::embedding_bag eb 9 4 0 1 2 3 4 5 6 7 8 9 10 11 12", 9)
        layer.n_out = 4
        got = layer(backend.asarray(t2n(weight)), backend.asarray(t2n(ids)), backend.asarray(t2n(offs)), False,
                    mode, False, None if psw is None else backend.asarray(t2n(psw)), include_last, None)
        for k, name in enumerate(("output", "offset2bag", "bag_size", "max_indices")):
            assert_close(backend.to_numpy(got[k]), t2n(want[k]), rtol=1e-6, what=f"{name}, offsets {offsets[:3]}")


@pytest.mark.parametrize("shape,wrap", [((4, 4), False), ((3, 6), False), ((9, 3), False), ((9, 3), True),
                                        ((7, 2), True), ((3, 3, 3), False)])
def test_fill_diagonal_and_zero_match_torch(backend, shape, wrap):
    """``x.fill_diagonal_(v, wrap)`` (tall matrices wrap every cols + 1 rows) and ``x.zero_()``."""
    x = torch.randn(*shape, generator=_g(3))
    fd = make_layer(backend, "aten::fill_diagonal fd 3 1 0 1 2 3", 3)
    want = x.clone().fill_diagonal_(-7.5, wrap=wrap)
    assert_close(backend.to_numpy(fd(backend.asarray(t2n(x)), -7.5, wrap)), t2n(want), rtol=0, what="fill_diagonal")
    xi = torch.arange(math.prod(shape)).reshape(shape)
    want = xi.clone().fill_diagonal_(3, wrap=wrap)
    assert_close(backend.to_numpy(fd(backend.asarray(t2n(xi)), 3, wrap)), t2n(want), what="fill_diagonal int")
    zero = make_layer(backend, "aten::zero z 1 1 0 1")
    got = backend.to_numpy(zero(backend.asarray(t2n(xi))))
    assert got.dtype == np.int64 and not got.any() and got.shape == shape
    with pytest.raises(ShapeError, match=r"aten::fill_diagonal 'fd': needs a 2-D input"):
        fd(backend.asarray(np.zeros((2, 3, 3), np.float32)), 1.0, False)


@pytest.mark.parametrize("p", [1.0, 2.0, 0.5, float("inf"), 0.0])
def test_cdist_differences_in_blocks(backend, monkeypatch, p):
    """Away from the matrix-product form, the differences in blocks of x1's rows (the last one
    short), batched; an empty x1 too."""
    from kuiper_xp.layers import distance

    monkeypatch.setattr(distance, "CDIST_BLOCK_ELEMENTS", 200)
    a, b = _r(2, 13, 5), _r(2, 7, 5, seed=1)
    cd = make_layer(backend, "aten::cdist cd 4 1 0 1 2 3 4", 4)
    assert_close(backend.to_numpy(cd(backend.asarray(t2n(a)), backend.asarray(t2n(b)), p, 2)),
                 t2n(torch.cdist(a, b, p, compute_mode="donot_use_mm_for_euclid_dist")), rtol=1e-5, what=f"p={p}")
    got = backend.to_numpy(cd(backend.asarray(t2n(a[:, :0])), backend.asarray(t2n(b)), p, 2))
    assert got.shape == (2, 0, 7)


@pytest.mark.parametrize("name", ["dgcnn", "sparsemax_attn", "moe_top2", "mamba_lite"])
def test_benchmark_set_and_sort_models_match_torch(model_backend, tmp_path, name):
    """Session 29's survey architectures whose operators meet in ways no layer test combines,
    small, exported by pnnx and run against torch at batch 2: DGCNN (k nearest neighbours by
    top-k of pairwise distances, a gather by a flattened index built from arange, EdgeConv's
    max), sparsemax attention (sort, cumsum, a comparison with arange, gather by the support
    size), a top-2 mixture of experts (top-k gates scattered into zeros_like, experts by einsum)
    and Mamba-2's SSD (cumsum segment sums masked by tril, exp, a four-operand einsum)."""
    from helpers import export_module, more_models

    more = more_models()
    torch.manual_seed(0)
    model, x = {
        "dgcnn": lambda: (more.DGCNN(k=8), torch.randn(2, 3, 64)),
        "sparsemax_attn": lambda: (more.SparsemaxAttn(), torch.randn(2, 12, 64)),
        "moe_top2": lambda: (more.MoETransformer(), torch.randn(2, 10, 128)),
        "mamba_lite": lambda: (more.MambaLite(), torch.randn(2, 16, 128)),
    }[name]()
    param = export_module(model.eval(), (x,), tmp_path)
    compare_graph(param, model_backend, model, (x,), rtol=1e-4)


def test_flattened_multidimensional_constant_index_is_refused_at_build(backend):
    """pnnx writes ``x[:, :, idx]`` with a constant (3, 2) idx as a flat list of its first 3
    values beside the declared (1, 2, 3, 2, 5) output (seen with pnnx 20261020): the file lacks
    the index, so the load names the cause and the rewrite instead of an output-shape failure at
    run time; a 1-D index of the same file form still builds and runs."""
    from kuiper_xp.errors import LayerParameterError

    with pytest.raises(LayerParameterError, match=r"declared output \(1,2,3,2,5\).*index of 2 dimensions.*"
                                                  r"index_select"):
        make_layer(backend, "Tensor.index ix 1 1 0 1 expr=[None,None,[0,1,3]] #0=(1,2,4,5)f32 #1=(1,2,3,2,5)f32")
    layer = make_layer(backend, "Tensor.index ix 1 1 0 1 expr=[None,None,[0,1,3]] #0=(1,2,4,5)f32 #1=(1,2,3,5)f32")
    x = np.arange(40, dtype=np.float32).reshape(1, 2, 4, 5)
    np.testing.assert_array_equal(backend.to_numpy(layer(backend.asarray(x))), x[:, :, [0, 1, 3]])
    # two lists (Informer's x[:, arange(3).unsqueeze(1), idx] with a (3, 2) idx: pnnx keeps 3 of
    # each's values, the declared output keeps the 2-D index's rank); two 1-D lists still run
    with pytest.raises(LayerParameterError, match=r"2 index lists hold 3, 3 values.*declared output \(1,3,2\)"):
        make_layer(backend, "Tensor.index ix 1 1 0 1 expr=[None,[0,1,2],[2,0,1]] #0=(1,3,4)f32 #1=(1,3,2)f32")
    layer = make_layer(backend, "Tensor.index ix 1 1 0 1 expr=[None,[0,1,2],[2,0,1]] #0=(1,3,4)f32 #1=(1,3)f32")
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    np.testing.assert_array_equal(backend.to_numpy(layer(backend.asarray(x))), x[:, [0, 1, 2], [2, 0, 1]])
