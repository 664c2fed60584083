"""Concatenation without copies (numpy backend): from the second call with the same input shapes
the runtime lays out each torch.cat's output first and hands the layers producing its pieces
their slices as output places (``numpy_fast.set_destination``). These tests check the results
against torch on every call, that the pieces really are made in place, and the edges: a piece
that is a view of the buffer, a change of batch, results the caller still holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from kuiper_xp.backends import numpy_fast as nf
from test_layers_misc import export_module, t2n
from torch import nn

import kuiper_xp


class CatNet(nn.Module):
    """Pieces from a fused conv+ReLU, a residual add (which a later conv also reads), a nearest
    upsample, a max-pool, a permuted view (copied: not the layer's own output) and a sigmoid."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 6, 1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.d = nn.Conv2d(36, 4, 1)

    def forward(self, x):
        a = torch.relu(self.a(x))
        b = self.b(x)
        r = a + self.c(a)
        u = F.interpolate(F.max_pool2d(b, 2), scale_factor=2.0, mode="nearest")
        p = F.max_pool2d(r, 3, 1, 1)
        t = b.permute(0, 1, 3, 2)
        y = torch.cat([r, u, p, t, torch.sigmoid(a)], 1)
        z = torch.cat([self.d(y), y[:, :5]], 1)
        return y, z


@pytest.fixture(scope="module")
def catnet(tmp_path_factory):
    torch.manual_seed(0)
    module = CatNet().eval()
    x, x2 = torch.randn(1, 3, 16, 16), torch.randn(2, 3, 16, 16)
    return export_module(module, (x,), tmp_path_factory.mktemp("catnet"), inputs2=(x2,)), module


def _torch(module, x):
    with torch.no_grad():
        return [t2n(t) for t in module(torch.from_numpy(x))]


def _same_view(a, b):
    """Whether ``a`` and ``b`` are the same elements in the same places."""
    return (a.shape == b.shape and a.dtype == b.dtype
            and (a.strides == b.strides or (a.flags.c_contiguous and b.flags.c_contiguous))
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _load_with_spy(param):
    """The graph, and a list that each concatenation finished in place appends to: per piece,
    whether it had to be copied (False: the producing layer wrote it in its place)."""
    copied: list[bool] = []
    real = nf.concat_into

    def spy(buf, xs, axis):
        off = 0
        for a in xs:
            m = a.shape[axis]
            copied.append(not _same_view(a, buf[(slice(None),) * axis + (slice(off, off + m),)]))
            off += m
        return real(buf, xs, axis)

    g = kuiper_xp.load(param, backend="numpy")
    for layer in g.layers:
        if getattr(layer, "_into", None) is not None:
            layer._into = spy
    return g, copied


def test_pieces_are_made_in_place_and_results_match_torch(catnet):
    param, module = catnet
    g, copied = _load_with_spy(param)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(3)]
    held = []
    for k, x in enumerate(xs):
        copied.clear()
        got = g(x)
        for a, e, what in zip(got, _torch(module, x), ("y", "z")):
            assert_close(a, e, rtol=1e-5, what=f"call {k}: {what}")
        if k == 0:
            assert copied == []  # the first call only learns the shapes
        else:
            # y: r, u, p, sigmoid(a) in place, the permuted view copied; z: d(y) in place, the
            # slice of y copied
            assert copied == [False, False, False, True, False, False, True], copied
        held.append((x, got))
    for k, (x, got) in enumerate(held):  # results the caller kept were never overwritten
        for a, e in zip(got, _torch(module, x)):
            assert_close(a, e, rtol=1e-5, what=f"kept result of call {k}")


def test_batch_changes_and_back(catnet):
    """Batch 2 (pieces not contiguous: concatenated by copying), then batch 1 again."""
    param, module = catnet
    g = kuiper_xp.load(param, backend="numpy")
    rng = np.random.default_rng(2)
    for n in (1, 1, 2, 2, 1, 2, 1):
        x = rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
        for a, e, what in zip(g(x), _torch(module, x), ("y", "z")):
            assert_close(a, e, rtol=1e-5, what=f"batch {n}: {what}")


def test_concat_into_edges():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((1, 3, 3, 4)).astype(np.float32)
    shapes = (a.shape, b.shape)
    buf = nf.concat_buffer(1, np.float32, shapes)
    assert buf.shape == (1, 5, 3, 4)
    piece = nf.concat_piece(buf, 1, shapes, 1)
    piece[...] = b  # b computed in place
    out = nf.concat_into(buf, (a, piece), 1)
    assert out is buf
    np.testing.assert_array_equal(out, np.concatenate([a, b], 1))
    # a piece that is a view of another part of the buffer is copied out before the buffer is written
    buf2 = nf.concat_buffer(1, np.float32, ((1, 3, 3, 4), (1, 2, 3, 4)))
    buf2[:, :3] = b
    buf2[:, 3:] = 0
    out = nf.concat_into(buf2, (b, buf2[:, 1:3]), 1)
    np.testing.assert_array_equal(out, np.concatenate([b, b[:, 1:3]], 1))
    # pieces that do not fit: nothing written, the caller concatenates as usual
    buf3 = nf.concat_buffer(1, np.float32, shapes)
    buf3[...] = 7
    assert nf.concat_into(buf3, (a, a), 1) is None
    assert nf.concat_into(buf3, (a, b.astype(np.float64)), 1) is None
    assert nf.concat_into(buf3, (a, b[:, :, :2]), 1) is None
    assert (buf3 == 7).all()
    # pieces that would not be contiguous: no buffer
    assert nf.concat_buffer(1, np.float32, ((2, 2, 3), (2, 3, 3))) is None
    assert nf.concat_buffer(2, np.float32, ((1, 2, 3), (1, 2, 3))) is None


def test_destination_is_taken_once_and_only_for_its_shape():
    dest = np.empty((2, 3), np.float32)
    nf.set_destination(dest)
    try:
        assert nf._out((3, 2), np.float32) is not dest
        assert nf._out((2, 3), np.float64) is not dest
        assert nf._out((2, 3), np.float32) is dest
        assert nf._out((2, 3), np.float32) is not dest
    finally:
        nf.set_destination(None)


@pytest.mark.parametrize("name,ref", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)])
def test_binary_fast_path(name, ref):
    rng = np.random.default_rng(4)
    for shape in [(1, 7, 33, 65), (300001,)]:  # one chunk; several chunks over the threads
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(nf.binary(name, a, b), ref(a, b))
    a = rng.standard_normal((4, 5)).astype(np.float32)
    assert nf.binary(name, a, a[:1]) is None  # broadcasting: the evaluator's job
    assert nf.binary(name, a, a.astype(np.float64)) is None
    assert nf.binary(name, a, a.T.copy().T) is None  # not C-contiguous
    assert nf.binary(name, a.astype(np.int64), a.astype(np.int64)) is None


class DenseNet(nn.Module):
    """x1 = cat(x0, f(x0)), x2 = cat(x1, g(x1)): each concatenation is a piece of the next, so
    the runtime lays the inner one out inside the outer one's buffer (nothing copied twice)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.f = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
        self.g = nn.Sequential(nn.BatchNorm2d(12), nn.ReLU(), nn.Conv2d(12, 4, 3, padding=1))
        self.h = nn.Conv2d(16, 2, 1)

    def forward(self, x):
        x0 = self.stem(x)
        x1 = torch.cat([x0, self.f(x0)], 1)
        x2 = torch.cat([x1, self.g(x1)], 1)
        return self.h(x2), x1  # x1 handed to the caller too: a view into x2's buffer


def test_nested_concatenations_are_laid_out_inside_the_outer_one(tmp_path_factory):
    torch.manual_seed(1)
    module = DenseNet().eval()
    with torch.no_grad():  # BN statistics that are not the identity
        for bn in (module.f[0], module.g[0]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    x, x2 = torch.randn(1, 3, 12, 12), torch.randn(2, 3, 12, 12)
    param = export_module(module, (x,), tmp_path_factory.mktemp("dense"), inputs2=(x2,))
    g, copied = _load_with_spy(param)
    rng = np.random.default_rng(5)
    kept = []
    for k in range(3):
        x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
        copied.clear()
        got = g(x)
        for a, e, what in zip(got, _torch(module, x), ("y", "x1")):
            assert_close(a, e, rtol=1e-5, what=f"call {k}: {what}")
        if k:
            assert copied == [False] * 4, copied  # x0, f(x0) inside x1; x1, g(x1) inside x2
        kept.append((x, got))
    for x, got in kept:  # the views handed out were never overwritten by later calls
        for a, e in zip(got, _torch(module, x)):
            assert_close(a, e, rtol=1e-5, what="kept result")
    xb = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)  # batch 2: copied, still right
    for a, e in zip(g(xb), _torch(module, xb)):
        assert_close(a, e, rtol=1e-5, what="batch 2")


class YoloHead(nn.Module):
    """YOLOv5's detection head: per level a 1x1 conv, reshaped and permuted to (n, 3, h, w, k),
    a sigmoid, split into xy, wh and scores, the boxes decoded, cat(..., -1), reshaped to rows
    (n, 3*h*w, k); then cat of the levels along the rows. From the second call each level's
    concatenation is laid out inside the final one's buffer through the reshape."""

    def __init__(self):
        super().__init__()
        self.m = nn.ModuleList(nn.Conv2d(c, 3 * 7, 1) for c in (8, 16))
        self.grids = [torch.randn(1, 3, s, s, 2) for s in (8, 4)]

    def forward(self, x0, x1):
        out = []
        for x, conv, grid, stride in zip((x0, x1), self.m, self.grids, (8.0, 16.0)):
            y = conv(x)
            n, _, h, w = y.shape
            y = y.reshape(n, 3, 7, h, w).permute(0, 1, 3, 4, 2).sigmoid()
            xy, wh, conf = y.split((2, 2, 3), 4)
            xy = (xy * 2 + grid) * stride
            wh = (wh * 2) ** 2 * grid
            out.append(torch.cat((xy, wh, conf), 4).reshape(n, -1, 7))
        return torch.cat(out, 1)


def test_concatenation_through_a_reshape_is_laid_out_in_the_outer_one(tmp_path_factory):
    torch.manual_seed(2)
    module = YoloHead().eval()
    xs = (torch.randn(1, 8, 8, 8), torch.randn(1, 16, 4, 4))
    xs2 = (torch.randn(2, 8, 8, 8), torch.randn(2, 16, 4, 4))
    param = export_module(module, xs, tmp_path_factory.mktemp("yolohead"), inputs2=xs2)
    g, copied = _load_with_spy(param)
    rng = np.random.default_rng(6)
    kept = []
    for k, n in enumerate((1, 1, 1, 2, 1)):
        x = [rng.standard_normal((n, c, s, s)).astype(np.float32) for c, s in ((8, 8), (16, 4))]
        copied.clear()
        got = g(*x)
        got = got[0] if isinstance(got, (tuple, list)) else got
        with torch.no_grad():
            want = module(*map(torch.from_numpy, x)).numpy()
        assert_close(got, want, rtol=1e-5, what=f"call {k} batch {n}")
        if k in (1, 2):  # (call 0 learns the shapes; batch 2 concatenates by copying)
            # each level's cat copies its three (strided) pieces into the final buffer; the
            # final cat then finds both levels in place
            assert copied == [True, True, True, True, True, True, False, False], copied
        kept.append((x, got))
    for k, (x, got) in enumerate(kept):  # results the caller kept were never overwritten
        with torch.no_grad():
            assert_close(got, module(*map(torch.from_numpy, x)).numpy(), rtol=1e-5, what=f"kept {k}")


@pytest.mark.parametrize("axis", [0, 1, 3])
def test_concat_into_with_pieces_in_place_fresh_and_overlapping(axis):
    """Pieces that are the buffer's own slices, fresh arrays and views of other places in the
    buffer (copied out first: they overlap it): np.concatenate's result; many small pieces too."""
    rng = np.random.default_rng(0)
    sizes = [1, 3, 2, 1, 4]
    shape = [2, 5, 4, 6]
    shapes = [tuple(shape[:axis] + [m] + shape[axis + 1:]) for m in sizes]
    buf = rng.standard_normal(tuple(shape[:axis] + [sum(sizes)] + shape[axis + 1:])).astype(np.float32)
    own = [nf.concat_piece(buf, axis, shapes, k) for k in range(len(sizes))]
    lead = (slice(None),) * axis
    xs = [own[0], rng.standard_normal(shapes[1]).astype(np.float32), buf[lead + (slice(1, 3),)], own[3],
          rng.standard_normal(shapes[4]).astype(np.float32)]
    expected = np.concatenate([a.copy() for a in xs], axis)
    assert nf.concat_into(buf, xs, axis) is buf
    np.testing.assert_array_equal(buf, expected)
    many = [rng.standard_normal(tuple(shape[:axis] + [1] + shape[axis + 1:])).astype(np.float32) for _ in range(49)]
    np.testing.assert_array_equal(nf.concat(many, axis), np.concatenate(many, axis))


class TransposedPieces(nn.Module):
    """Pieces that come out as views in another layout: an activation of a transposed square map
    (laid out like its input), scaled-dot-product attention with as many heads as tokens (its
    output is a (L, heads) buffer seen as (heads, L)); each also returned after the
    concatenation, so that a slot rewritten under it shows."""

    def forward(self, x, z, q, k, v):
        y = torch.relu(x.transpose(2, 3))
        s = torch.sigmoid(x.transpose(2, 3))
        c = torch.cat([y, z, s], 1)
        o = F.scaled_dot_product_attention(q, k, v)
        d = torch.cat([o, q], 1)
        return c, y, s, d, o


def test_pieces_laid_out_as_transposed_views_are_not_rewritten(tmp_path_factory):
    """A layer offered a concatenation's slot that returns a transposed view of it (square maps:
    the permuted shape equals the piece's) had its value rewritten when the concatenation was
    finished, from the second call on (max error ~1 on y, s and o); every call against torch."""
    torch.manual_seed(0)
    module = TransposedPieces().eval()
    ins = (torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8), torch.randn(1, 4, 4, 8), torch.randn(1, 4, 4, 8),
           torch.randn(1, 4, 4, 8))
    ins2 = tuple(torch.randn((2,) + tuple(a.shape[1:])) for a in ins)
    param = export_module(module, ins, tmp_path_factory.mktemp("transposed"), inputs2=ins2)
    with torch.no_grad():
        want = [t2n(t) for t in module(*ins)]
    for fuse in (True, False):
        g = kuiper_xp.load(param, backend="numpy", fuse=fuse)
        held = []
        for call in range(3):
            outs = g(*[t2n(a) for a in ins])
            held.append(outs)
            for k, (a, e) in enumerate(zip(outs, want)):
                assert_close(a, e, rtol=1e-5, what=f"fuse={fuse} call {call} output {k}")
        for outs in held:  # (results handed out earlier are not rewritten by later calls)
            for k, (a, e) in enumerate(zip(outs, want)):
                assert_close(a, e, rtol=1e-5, what=f"fuse={fuse} held output {k}")


def test_piece_result_copies_only_a_view_of_the_slot_in_another_layout():
    buf = np.zeros((1, 8, 4, 4), np.float32)
    slot = buf[:, :4]
    assert nf.piece_result(slot, slot) is slot
    same = slot.reshape(1, 4, 4, 4)  # (the slot itself as another array object)
    assert nf.piece_result(same, slot) is same
    fresh = np.ones((1, 4, 4, 4), np.float32)
    assert nf.piece_result(fresh, slot) is fresh
    tr = slot.transpose(0, 1, 3, 2)
    tr[...] = np.arange(64, dtype=np.float32).reshape(1, 4, 4, 4)
    got = nf.piece_result(tr, slot)
    assert got is not tr and not np.may_share_memory(got, buf) and np.array_equal(got, tr)
