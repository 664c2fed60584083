"""Shape and data-movement layers against torch: each layer over its parameters on every backend
leg (negative dims, slice sentinels, several outputs, dynamic parameters arriving as inputs),
run-time shape errors, bad parameters, and pnnx exports (static, dynamic batch, dynamic batch and
spatial size) run end to end through kuiper_xp.load."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import assert_close
from helpers import Fn, export_module, export_torch, make_layer, ref, run, run_graph, torch_outputs  # noqa: E402

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError

BIG = 2147483647
BIG64 = 9223372036854775807


# -- helpers -------------------------------------------------------------------------------------
def check_all(got, expected, what):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected), f"{what}: {len(got)} outputs, torch has {len(expected)}"
        for k, (a, e) in enumerate(zip(got, expected)):
            assert_close(a, e, rtol=0, what=f"{what} output {k}")
    else:
        assert_close(got, expected, rtol=0, what=what)


X4 = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5) - 60.0


def cases(op_type, grid):
    return [pytest.param(op_type, p, fn, id=f"{op_type}[{p}]") for p, fn in grid]


# -- flatten / reshape ---------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type,params,fn", cases("torch.flatten", [
    ("start_dim=0 end_dim=-1", lambda t: torch.flatten(t)),
    ("start_dim=1 end_dim=-1", lambda t: torch.flatten(t, 1)),
    ("start_dim=2 end_dim=3", lambda t: torch.flatten(t, 2, 3)),
    ("start_dim=-3 end_dim=-2", lambda t: torch.flatten(t, -3, -2)),
    ("start_dim=1 end_dim=1", lambda t: torch.flatten(t, 1, 1)),
]) + cases("nn.Flatten", [("", lambda t: nn.Flatten()(t))]) + cases("Tensor.reshape", [
    ("shape=(6,20)", lambda t: t.reshape(6, 20)),
    ("shape=(-1,5)", lambda t: t.reshape(-1, 5)),
    ("shape=(2,-1,4)", lambda t: t.reshape(2, -1, 4)),
    ("shape=(120)", lambda t: t.reshape(120)),
    ("shape=(5,1,4,6)", lambda t: t.reshape(5, 1, 4, 6)),
]) + cases("Tensor.view", [("shape=(-1)", lambda t: t.view(-1))]) + cases("Tensor.unflatten", [
    ("dim=1 sizes=(1,3)", lambda t: t.unflatten(1, (1, 3))),
    ("dim=-1 sizes=(-1,1)", lambda t: t.unflatten(-1, (-1, 1))),
]) + cases("nn.Unflatten", [("dim=2 unflattened_size=(2,2)", lambda t: nn.Unflatten(2, (2, 2))(t))]))
def test_flatten_reshape(backend, op_type, params, fn):
    check_all(run(backend, make_layer(backend, op_type, params), X4), ref(fn, X4), f"{op_type} {params}")


def test_flatten_of_a_scalar(backend):
    x = np.array(3.5, np.float32)
    check_all(run(backend, make_layer(backend, "torch.flatten", "start_dim=0 end_dim=-1"), x),
              ref(torch.flatten, x), "flatten 0-d")


@pytest.mark.parametrize("shape_value", [[2, -1, 5], (-1, 12, 5), "array"])
def test_reshape_target_as_input(backend, shape_value):
    """The dynamic form: pnnx.Expression hands a Python list (or an int array) as ``$shape``."""
    layer = make_layer(backend, "Tensor.reshape", "", n_in=2, names=("input", "shape"))
    if shape_value == "array":
        shape_value = backend.asarray(np.array([4, -1], np.int64))
        expected = X4.reshape(4, -1)
    else:
        expected = X4.reshape(tuple(shape_value))
    check_all(run(backend, layer, X4, shape_value), expected, f"reshape to {shape_value}")


def test_reshape_of_a_permuted_view(backend):
    """permute -> reshape: the reshape of a non-contiguous result keeps torch's element order."""
    perm = make_layer(backend, "Tensor.permute", "dims=(0,2,3,1)")
    resh = make_layer(backend, "Tensor.reshape", "shape=(2,-1)")
    flat = make_layer(backend, "torch.flatten", "start_dim=1 end_dim=2")
    y = perm(backend.asarray(X4))
    check_all(resh(y), ref(lambda t: t.permute(0, 2, 3, 1).reshape(2, -1), X4), "permute+reshape")
    check_all(flat(y), ref(lambda t: t.permute(0, 2, 3, 1).flatten(1, 2), X4), "permute+flatten")
    tr = make_layer(backend, "torch.transpose", "dim0=1 dim1=3")
    check_all(resh(tr(backend.asarray(X4))), ref(lambda t: t.transpose(1, 3).reshape(2, -1), X4),
              "transpose+reshape")


@pytest.mark.parametrize("params,n_in,extra,match", [
    ("shape=(7,-1)", 1, (), r"\(2, 3, 4, 5\).*120.*\(7, -1\)"),
    ("shape=(-1,-1)", 1, (), "only one -1"),
    ("shape=(-2,-1,5)", 1, (), "only one -1"),
    ("shape=(-7,4,5)", 1, (), r"\(-7, 4, 5\) \(-7: 7 times the dynamic size\)"),
    ("shape=(2,3,4)", 1, (), r"24 elements"),
    ("", 2, ([7, -1],), r"\(7, -1\)"),
    ("", 2, ([2.5, -1],), "integer"),
])
def test_reshape_errors_name_op_and_sizes(backend, params, n_in, extra, match):
    layer = make_layer(backend, "Tensor.reshape", params, n_in=n_in, names=("input", "shape")[:n_in])
    with pytest.raises(ShapeError, match=match) as info:
        run(backend, layer, X4, *extra)
    assert "Tensor.reshape 'op'" in str(info.value)


def test_reshape_reads_pnnx_minus_k_as_k_times_the_dynamic_size(backend):
    """pnnx writes ``batch * heads`` of a dynamic batch as ``-heads``: DistilBERT's attention mask
    at a fixed length came out ``shape=(-4,16,16)`` (its own Python fails on it); torch's result
    is the reshape to ``(batch * 4, 16, 16)``."""
    x = np.arange(2 * 4 * 16 * 16, dtype=np.float32).reshape(2, 4, 16, 16)
    check_all(run(backend, make_layer(backend, "Tensor.reshape", "shape=(-4,16,16)"), x),
              ref(lambda t: t.reshape(-1, 16, 16), x), "reshape (-4,16,16)")


# -- permutations --------------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type,params,fn", cases("Tensor.permute", [
    ("dims=(0,2,3,1)", lambda t: t.permute(0, 2, 3, 1)),
    ("dims=(3,2,1,0)", lambda t: t.permute(3, 2, 1, 0)),
    ("dims=(-1,0,-2,1)", lambda t: t.permute(-1, 0, -2, 1)),
]) + cases("torch.permute", [("dims=(1,0,2,3)", lambda t: torch.permute(t, (1, 0, 2, 3)))]) + cases("torch.transpose", [
    ("dim0=1 dim1=2", lambda t: t.transpose(1, 2)),
    ("dim0=-1 dim1=-2", lambda t: t.transpose(-1, -2)),
    ("dim0=0 dim1=3", lambda t: t.transpose(0, 3)),
    ("dim0=2 dim1=2", lambda t: t.transpose(2, 2)),
]) + cases("nn.ChannelShuffle", [
    ("groups=3", lambda t: nn.ChannelShuffle(3)(t)),
    ("groups=1", lambda t: nn.ChannelShuffle(1)(t)),
]))
def test_permutations(backend, op_type, params, fn):
    check_all(run(backend, make_layer(backend, op_type, params), X4), ref(fn, X4), f"{op_type} {params}")


def test_channel_shuffle_groups_and_errors(backend):
    x = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
    for g in (2, 3, 6):
        check_all(run(backend, make_layer(backend, "nn.ChannelShuffle", f"groups={g}"), x),
                  ref(lambda t, g=g: nn.ChannelShuffle(g)(t), x), f"shuffle g={g}")
    with pytest.raises(ShapeError, match="4 groups"):
        run(backend, make_layer(backend, "nn.ChannelShuffle", "groups=4"), x)


# -- joining -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_cat(backend, dim):
    rng = np.random.default_rng(dim + 10)
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for k, s in enumerate(shapes):
        s[dim] += k
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    layer = make_layer(backend, "torch.cat", f"dim={dim}", n_in=3)
    check_all(run(backend, layer, *xs), ref(lambda *t: torch.cat(t, dim), *xs), f"cat dim={dim}")


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shapes, dim, views", [
    ([(1, 3, 8, 8, 2), (1, 3, 8, 8, 2), (1, 3, 8, 8, 81)], 4, False),  # YOLO's detect head, split over rows
    ([(2, 5, 3), (2, 0, 3), (2, 1, 3)], 1, True),                     # an empty piece, permuted views
    ([(1, 1, 2), (1, 3, 2)], 1, False),                               # no axis long enough: per-piece copies
    ([(6, 4), (2, 4)], 0, True),
    ([(2, 4, 3), (2, 4, 1), (2, 4, 5)], 2, True),                     # last axis, strided rows: per-row copies
    ([(5, 1), (5, 7), (5, 2)], 1, False),                             # last axis: rows as void items
])
def test_numpy_fast_concat_matches_torch(monkeypatch, threads, shapes, dim, views):
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    old = nf.set_num_threads(threads)
    rng = np.random.default_rng(len(shapes) + dim)
    try:
        xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        if views:  # non-contiguous inputs: transposed copies viewed back
            xs = [np.ascontiguousarray(a.T).T for a in xs]
        with nf.compute_scope():
            got = nf.concat(xs, dim)
        np.testing.assert_array_equal(got, torch.cat([torch.from_numpy(np.ascontiguousarray(a)) for a in xs],
                                                     dim).numpy())
        assert nf.concat([xs[0], xs[0].astype(np.float64)], dim) is None  # mixed: the generic path
        assert nf.concat([xs[0], xs[0][None]], dim) is None
    finally:
        nf.set_num_threads(old)


def test_cat_of_mixed_dtypes_follows_the_annotation(backend):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    layer = make_layer(backend, "torch.cat", "dim=0", n_in=2, annotations="#o0=(4,3)f32")
    check_all(run(backend, layer, a, b), ref(lambda s, t: torch.cat((s, t), 0), a, b), "cat int32+float32")


@pytest.mark.parametrize("dim", [0, 2, -1, 3, -4])
def test_stack(backend, dim):
    xs = [X4[0] + k for k in range(3)]
    layer = make_layer(backend, "torch.stack", f"dim={dim}", n_in=3)
    check_all(run(backend, layer, *xs), ref(lambda *t: torch.stack(t, dim), *xs), f"stack dim={dim}")


def test_cat_shape_mismatch_is_a_shape_error(backend):
    layer = make_layer(backend, "torch.cat", "dim=1", n_in=2)
    with pytest.raises(ShapeError, match="torch.cat 'op'"):
        run(backend, layer, np.ones((2, 3), np.float32), np.ones((3, 3), np.float32))


# -- splitting -----------------------------------------------------------------------------------------
X3 = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)


@pytest.mark.parametrize("op_type,params,n_out,fn", [
    ("torch.chunk", "chunks=3 dim=1", 3, lambda t: torch.chunk(t, 3, 1)),
    ("torch.chunk", "chunks=2 dim=-1", 2, lambda t: torch.chunk(t, 2, -1)),
    ("torch.chunk", "chunks=4 dim=2", 3, lambda t: torch.chunk(t, 4, 2)),  # only 3 pieces of 2
    ("torch.split", "split_size_or_sections=2 dim=1", 3, lambda t: torch.split(t, 2, 1)),
    ("torch.split", "split_size_or_sections=(1,3,1) dim=1", 3, lambda t: torch.split(t, [1, 3, 1], 1)),
    ("torch.split", "split_size_or_sections=(0,6) dim=-1", 2, lambda t: torch.split(t, [0, 6], -1)),
    ("torch.split", "split_size_or_sections=(2) dim=0", 1, lambda t: torch.split(t, [2], 0)),
    ("torch.tensor_split", "sections=3 dim=1", 3, lambda t: torch.tensor_split(t, 3, 1)),
    ("torch.tensor_split", "sections=4 dim=2", 4, lambda t: torch.tensor_split(t, 4, 2)),
    ("torch.tensor_split", "indices=(1,3) dim=1", 3, lambda t: torch.tensor_split(t, (1, 3), 1)),
    ("torch.tensor_split", "indices=(-2) dim=-1", 2, lambda t: torch.tensor_split(t, (-2,), -1)),
    ("torch.tensor_split", "indices=(4,2,10) dim=2", 4, lambda t: torch.tensor_split(t, (4, 2, 10), 2)),
    ("torch.unbind", "dim=1", 5, lambda t: torch.unbind(t, 1)),
    ("torch.unbind", "dim=-3", 2, lambda t: torch.unbind(t, -3)),
])
def test_split_family(backend, op_type, params, n_out, fn):
    layer = make_layer(backend, op_type, params, n_out=n_out)
    got = run(backend, layer, X3)
    if n_out == 1:  # a one-output op returns its array (what the graph stores), not a tuple
        assert not isinstance(got, tuple)
        got = (got,)
    check_all(got, ref(fn, X3), f"{op_type} {params}")


def test_split_sections_must_sum_to_the_dim(backend):
    layer = make_layer(backend, "torch.split", "split_size_or_sections=(2,2) dim=1", n_out=2)
    with pytest.raises(ShapeError) as info:
        run(backend, layer, X3)
    msg = str(info.value)
    assert "torch.split 'op'" in msg and "[2, 2]" in msg and "sum to 4" in msg and "size 5" in msg, msg


def test_split_piece_count_must_match_outputs(backend):
    layer = make_layer(backend, "torch.chunk", "chunks=3 dim=2", n_out=3)
    with pytest.raises(ShapeError, match=r"gives 2 pieces \[2, 2\].*3 outputs"):
        run(backend, layer, np.ones((1, 2, 4), np.float32))  # chunk(3) of 4 -> pieces of 2: only 2


# -- slicing -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params,fn", [
    (f"dim=1 start=1 end={BIG} step=1", lambda t: t[:, 1:]),
    ("dim=2 start=1 end=-1 step=2", lambda t: t[:, :, 1:-1:2]),
    (f"dim=3 start=-3 end={BIG} step=1", lambda t: t[..., -3:]),
    (f"dim=3 start=0 end={BIG64} step=2", lambda t: t[..., ::2]),
    ("dim=-1 start=1 end=3 step=1", lambda t: t[..., 1:3]),
    ("dim=2 start=-100 end=100 step=3", lambda t: t[:, :, -100:100:3]),
    ("dim=1 start=2 end=1 step=1", lambda t: t[:, 2:1]),
    ("dim=0 start=1", lambda t: t[1:]),
    # the several-dims form, as pnnx writes it
    (f"dims=(1,2) ends=(0,{BIG}) selects=(1,{BIG}) starts=(0,2) steps=(0,1)", lambda t: t[:, 1, 2:]),
    (f"dims=(2,3) ends=({BIG},0) selects=({BIG},1) starts=(0,0) steps=(2,0)", lambda t: t[:, :, ::2, 1]),
    ("dims=(2,3) ends=(0,0) selects=(0,0) starts=(0,0) steps=(0,0)", lambda t: t[:, :, 0, 0]),
    (f"dims=(1,3) ends=({BIG},-1) selects=({BIG},{BIG}) starts=(-2,1) steps=(1,1)", lambda t: t[:, -2:, :, 1:-1]),
    (f"dims=(1,2,3) ends=({BIG},0,{BIG}) selects=({BIG},2,{BIG}) starts=(1,0,1) steps=(1,0,1)",
     lambda t: t[:, 1:, 2, 1:]),
    (f"dims=(-1,0) ends=(0,{BIG}) selects=(-2,{BIG}) starts=(0,1) steps=(0,1)", lambda t: t[1:, ..., -2]),
])
def test_slice(backend, params, fn):
    check_all(run(backend, make_layer(backend, "Tensor.slice", params), X4), ref(fn, X4), f"slice {params}")


def test_slice_with_bounds_as_inputs(backend):
    """x[:, :, :n // 2] with a dynamic n: ``$end`` arrives from a pnnx.Expression."""
    layer = make_layer(backend, "Tensor.slice", "dim=2 start=0 step=1", n_in=2, names=("input", "end"))
    check_all(run(backend, layer, X4, 2), X4[:, :, :2], "slice $end=int")
    check_all(run(backend, layer, X4, backend.asarray(np.array(3, np.int64))), X4[:, :, :3], "slice $end=0-d")
    # pnnx.SliceIndexes builds the starts list of the several-dims form
    idx = make_layer(backend, "pnnx.SliceIndexes", "indexes=(@0,1)")
    starts = idx(2)
    assert starts == [2, 1]
    layer = make_layer(backend, "Tensor.slice", f"dims=(2,3) ends=({BIG},{BIG}) selects=({BIG},{BIG}) steps=(1,1)",
                       n_in=2, names=("input", "starts"))
    check_all(run(backend, layer, X4, starts), X4[:, :, 2:, 1:], "slice $starts")


@pytest.mark.parametrize("params,match", [
    ("dim=1 start=0 end=2 step=0", "step 0"),
    ("dims=(1) ends=(0) selects=(3) starts=(0) steps=(0)", "index 3 is out of range"),
    ("dim=4 start=0 end=1 step=1", "dim 4 is out of range"),
])
def test_slice_runtime_errors(backend, params, match):
    with pytest.raises(ShapeError, match=match):
        run(backend, make_layer(backend, "Tensor.slice", params), X4)


@pytest.mark.parametrize("op_type,params,fn", cases("Tensor.select", [
    ("dim=1 index=0", lambda t: t.select(1, 0)),
    ("dim=-1 index=-2", lambda t: t.select(-1, -2)),
    ("dim=0 index=1", lambda t: t[1]),
]) + cases("torch.narrow", [
    ("dim=1 start=-2 length=2", lambda t: t.narrow(1, -2, 2)),
    ("dim=-2 start=1 length=3", lambda t: t.narrow(-2, 1, 3)),
]) + cases("torch.squeeze", [
    ("", lambda t: torch.squeeze(t)),
    ("dim=1", lambda t: t.squeeze(1)),
    ("dim=(1,2)", lambda t: t.squeeze((1, 2))),
    ("dim=0", lambda t: t.squeeze(0)),  # size 2: a no-op in torch
    ("dim=-1", lambda t: t.squeeze(-1)),
]) + cases("torch.unsqueeze", [
    ("dim=0", lambda t: t.unsqueeze(0)),
    ("dim=-1", lambda t: t.unsqueeze(-1)),
    ("dim=2", lambda t: t.unsqueeze(2)),
    ("dim=-5", lambda t: t.unsqueeze(-5)),
]))
def test_select_narrow_squeeze_unsqueeze(backend, op_type, params, fn):
    x = X4[:, :1, :1] if op_type == "torch.squeeze" else X4
    check_all(run(backend, make_layer(backend, op_type, params), x), ref(fn, x), f"{op_type} {params}")


def test_select_with_index_input_and_errors(backend):
    layer = make_layer(backend, "Tensor.select", "dim=2", n_in=2, names=("input", "index"))
    check_all(run(backend, layer, X4, 3), X4[:, :, 3], "select $index")
    with pytest.raises(ShapeError, match="index 4 is out of range for dim 2 of size 4"):
        run(backend, layer, X4, 4)
    with pytest.raises(ShapeError, match="narrow"):
        run(backend, make_layer(backend, "torch.narrow", "dim=1 start=2 length=2"), X4)


# -- expand / repeat / roll / flip ------------------------------------------------------------------
X1 = X4[:, :1]


@pytest.mark.parametrize("op_type,params,fn", cases("Tensor.expand", [
    ("sizes=(-1,3,-1,-1)", lambda t: t.expand(-1, 3, -1, -1)),
    ("sizes=(2,2,3,4,5)", lambda t: t.expand(2, 2, 3, 4, 5)),
    ("sizes=(2,1,4,5)", lambda t: t.expand(2, 1, 4, 5)),
]) + cases("Tensor.repeat", [
    ("sizes=(1,2,1,1)", lambda t: t.repeat(1, 2, 1, 1)),
    ("sizes=(2,1,1,2,1)", lambda t: t.repeat(2, 1, 1, 2, 1)),
]) + cases("torch.tile", [
    ("dims=(2)", lambda t: torch.tile(t, (2,))),
    ("dims=(2,1,3)", lambda t: torch.tile(t, (2, 1, 3))),
]) + cases("torch.repeat_interleave", [
    ("dim=1 repeats=2", lambda t: torch.repeat_interleave(t, 2, 1)),
    ("dim=-1 repeats=3", lambda t: torch.repeat_interleave(t, 3, -1)),
    ("repeats=2", lambda t: torch.repeat_interleave(t, 2)),
]) + cases("torch.roll", [
    ("dims=(2) shifts=(1)", lambda t: torch.roll(t, 1, 2)),
    ("dims=(1,3) shifts=(1,-2)", lambda t: torch.roll(t, (1, -2), (1, 3))),
    ("dims=(-1) shifts=(7)", lambda t: torch.roll(t, 7, -1)),
    ("shifts=(3)", lambda t: torch.roll(t, 3)),
]) + cases("torch.flip", [
    ("dims=(1)", lambda t: torch.flip(t, (1,))),
    ("dims=(-1,0)", lambda t: torch.flip(t, (-1, 0))),
]))
def test_expand_repeat_roll_flip(backend, op_type, params, fn):
    check_all(run(backend, make_layer(backend, op_type, params), X1), ref(fn, X1), f"{op_type} {params}")


def test_repeat_interleave_with_a_list(backend):
    x = X4[0, :, 0]  # (3, 5)
    layer = make_layer(backend, "torch.repeat_interleave", "dim=0 repeats=(1,2,3)")
    check_all(run(backend, layer, x), ref(lambda t: torch.repeat_interleave(t, torch.tensor([1, 2, 3]), 0), x),
              "repeat_interleave list")


@pytest.mark.parametrize("params,size,stride,offset", [
    ("size=(3,4) stride=(8,2)", (3, 4), (8, 2), 0),
    ("size=(2,3,3) stride=(4,2,1) storage_offset=5", (2, 3, 3), (4, 2, 1), 5),  # overlapping windows
    ("size=(4,2) stride=(0,1) storage_offset=None", (4, 2), (0, 1), 0),  # a broadcast row
    ("size=(0,3) stride=(1,1)", (0, 3), (1, 1), 0),
])
def test_as_strided(backend, params, size, stride, offset):
    layer = make_layer(backend, "torch.as_strided", params)
    check_all(run(backend, layer, X4), ref(lambda t: torch.as_strided(t, size, stride, offset), X4),
              f"as_strided {params}")


def test_as_strided_operands_and_bounds(backend):
    """size/stride as runtime operands (pnnx's ``$size`` for a dynamic batch); a window reading
    past the input, negative strides and mismatched lengths are refused, as torch refuses them."""
    layer = make_layer(backend, "torch.as_strided", "stride=(40,2,1)", n_in=2, names=("input", "size"))
    check_all(run(backend, layer, X4.reshape(3, 40), [1, 3, 4]),
              ref(lambda t: torch.as_strided(t, (1, 3, 4), (40, 2, 1)), X4.reshape(3, 40)), "$size")
    with pytest.raises(ShapeError, match="past the input's 120 elements"):
        run(backend, make_layer(backend, "torch.as_strided", "size=(4,4) stride=(40,1)"), X4)
    with pytest.raises(ShapeError, match="non-negative"):
        run(backend, make_layer(backend, "torch.as_strided", "size=(2,2) stride=(-1,1) storage_offset=3"), X4)
    with pytest.raises(ShapeError, match="different lengths"):
        run(backend, make_layer(backend, "torch.as_strided", "size=(2,2) stride=(1)"), X4)
    with pytest.raises(LayerParameterError, match="'stride' is neither"):
        make_layer(backend, "torch.as_strided", "size=(2,2)")


def test_expand_as_and_sizes_input(backend):
    layer = make_layer(backend, "Tensor.expand_as", "", n_in=2, names=("input", "other"))
    check_all(run(backend, layer, X1, X4), ref(lambda a, b: a.expand_as(b), X1, X4), "expand_as")
    layer = make_layer(backend, "Tensor.expand", "", n_in=2, names=("input", "sizes"))
    check_all(run(backend, layer, X1, [2, 3, -1, 5]), ref(lambda a: a.expand(2, 3, -1, 5), X1), "expand $sizes")
    with pytest.raises(ShapeError, match="cannot expand"):
        run(backend, layer, X1, [2, 3, 3, 5])


# -- casts and no-ops ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,fn", [
    ("torch.double", lambda t: t.double()), ("torch.int", lambda t: t.int()), ("torch.long", lambda t: t.long()),
    ("torch.bool", lambda t: t.bool()), ("torch.float", lambda t: t.float()), ("torch.int8", lambda t: t.to(torch.int8)),
])
def test_tensor_to(backend, dtype, fn):
    x = np.array([[-2.7, -0.5, 0.0, 0.5, 1.9, 100.25]], np.float32)  # float -> int truncates toward 0
    check_all(run(backend, make_layer(backend, "Tensor.to", f"copy=False dtype={dtype}"), x), ref(fn, x), dtype)
    xi = np.array([[-3, 0, 7]], np.int32)
    check_all(run(backend, make_layer(backend, "Tensor.to", f"copy=False dtype={dtype}"), xi), ref(fn, xi),
              f"{dtype} from int32")


def test_type_as_contiguous_and_annotation_cast(backend):
    x = np.array([[1.5, -2.5]], np.float32)
    y = np.array([1], np.int64)
    layer = make_layer(backend, "Tensor.type_as", "", n_in=2, names=("input", "other"))
    check_all(run(backend, layer, x, y), ref(lambda a, b: a.type_as(b), x, y), "type_as")
    check_all(run(backend, make_layer(backend, "Tensor.contiguous"), x), x, "contiguous")
    layer = make_layer(backend, "Tensor.to", "copy=False", annotations="#o0=(1,2)f64")
    check_all(run(backend, layer, x), x.astype(np.float64), "Tensor.to from the annotation")


# -- bad parameters ----------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type,params,key,value", [
    ("torch.flatten", "start_dim=a", "start_dim", "'a'"),
    ("Tensor.reshape", "shape=(2,x)", "shape", "'x'"),
    ("Tensor.permute", "dims=(0,0,1)", "dims", "(0, 0, 1)"),
    ("torch.chunk", "chunks=0 dim=1", "chunks", "0"),
    ("torch.split", "split_size_or_sections=1.5 dim=0", "split_size_or_sections", "1.5"),
    ("Tensor.slice", "start=0 end=1", "dim", "missing"),
    ("Tensor.to", "dtype=torch.quint8", "dtype", "torch.quint8"),
    ("torch.unsqueeze", "dim=None2", "dim", "None2"),
    ("nn.ChannelShuffle", "groups=0", "groups", "0"),
])
def test_bad_parameters_name_op_key_and_value(backend, op_type, params, key, value):
    with pytest.raises(LayerParameterError) as info:
        make_layer(backend, op_type, params)
    msg = str(info.value)
    assert f"{op_type} 'op' (unit.param:" in msg and key in msg and value in msg, msg


# -- whole exports -----------------------------------------------------------------------------------
class ShapeZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.shuffle = nn.ChannelShuffle(2)

    def forward(self, x):
        y = x.permute(0, 2, 3, 1)
        return (
            torch.flatten(x, 1), x.flatten(2, -1), x.reshape(2, -1), x.view(-1, 4, 5), y.reshape(2, -1), y.flatten(1),
            torch.transpose(x, 1, 2), x.transpose(-1, -2).contiguous(), torch.cat((x, y.permute(0, 3, 1, 2)), 1),
            torch.cat([x, x], dim=-1), torch.stack((x, x), 2), *torch.chunk(x, 2, 1), *torch.split(x, [1, 3], 2),
            *torch.split(x, 2, 3), *torch.tensor_split(x, 3, 3), x[:, 1:], x[:, :, 1:-1:2], x[..., -3:], x[:, 0],
            x[:, 1, 2:], x[:, :, ::2, 1], x.select(1, 2), x.narrow(2, 1, 2), torch.squeeze(x[:, :1]),
            x[:, :1].squeeze(1), torch.unsqueeze(x, 0), x.unsqueeze(-1), self.shuffle(torch.cat((x, x), 1)),
            x[:, :1].expand(-1, 3, -1, -1), x.repeat(1, 2, 1, 1), torch.roll(x, (1, -2), (1, 3)), x.flip(1),
            x.to(torch.float64), x.long(), x.unbind(1)[2], x.unflatten(1, (1, 3)), torch.tile(x, (2,)),
            x.repeat_interleave(2, 1),
        )


class DynamicBatch(nn.Module):
    """Exported with two batch sizes: reshapes become ``-1`` plus the fixed sizes."""

    def forward(self, x):
        b = x.size(0)
        r = x.view(b, 3, 2, 2, 5).transpose(1, 2).contiguous().view(b, -1, 4, 5)
        windows = torch.as_strided(x, (b, 3, 4), (60, 7, 2))  # (pnnx: torch.as_strided with $size)
        return (x.view(b, -1), x.reshape(x.shape[0], 3, -1), torch.flatten(x, 1), x.permute(0, 2, 3, 1).reshape(b, 20, 3),
                r, windows)


class DynamicSpatial(nn.Module):
    """Exported with two batch and spatial sizes: reshape targets and expand sizes come from
    pnnx.Expression lists, slice bounds from expressions and pnnx.SliceIndexes."""

    def forward(self, x):
        b, c, h, w = x.shape
        y = x.view(b, c, h * w).permute(0, 2, 1)
        z = y.reshape(b, h, w, c)
        s = x.view(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, -1, h, w)
        n = x.size(2)
        # split sizes from the width (pnnx: torch.split with $split_size_or_sections an input)
        return (z, s, x.flatten(2), x.expand(b, c, h, w), torch.split(x, [1, 3], 1)[1], x[:, :, : n // 2],
                x[:, 1:, n // 2:], x.select(2, n - 1), x.view(b, -1, 2), *torch.split(x, [2, w - 2], 3),
                x.narrow(3, 1, w - 1))


@pytest.fixture(scope="session")
def shape_exports(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    static = export_torch(ShapeZoo(), (x,), tmp_path_factory.mktemp("shape_static"))
    dyn_b = export_torch(DynamicBatch(), (x,), tmp_path_factory.mktemp("shape_dynb"), inputs2=(torch.randn(3, 3, 4, 5),))
    dyn_s = export_torch(DynamicSpatial(), (torch.randn(2, 4, 4, 6),), tmp_path_factory.mktemp("shape_dyns"),
                         inputs2=(torch.randn(3, 4, 6, 8),))
    return {"static": static, "batch": dyn_b, "spatial": dyn_s}


def _compare(module, param, backend, x):
    expected = torch_outputs(module, (x,))
    got = run_graph(param, backend, (x,))
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=0, what=f"{type(module).__name__} output {k}")


def test_exported_shape_ops_match_torch(model_backend, shape_exports):
    _compare(ShapeZoo(), shape_exports["static"], model_backend, torch.randn(2, 3, 4, 5))


class Alias(nn.Module):
    def forward(self, x):
        return x[...] * x  # pnnx: aten::alias


def test_alias_export(model_backend, tmp_path):
    """``x[...]`` (pnnx writes ``aten::alias``, which its own generated Python cannot import:
    export_module catches that) runs as the identity."""
    param = export_module(Alias(), (torch.randn(2, 5),), tmp_path)
    assert "aten::alias" in param.read_text()
    _compare(Alias(), param, model_backend, torch.randn(2, 5))


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_dynamic_batch_export(model_backend, shape_exports, batch):
    text = shape_exports["batch"].read_text()
    assert "shape=(-1," in text, "pnnx did not make the reshapes dynamic"
    assert "torch.as_strided" in text
    _compare(DynamicBatch(), shape_exports["batch"], model_backend, torch.randn(batch, 3, 4, 5))


@pytest.mark.parametrize("shape", [(2, 4, 4, 6), (1, 4, 6, 8), (3, 4, 8, 3)])
def test_dynamic_spatial_export(model_backend, shape_exports, shape):
    text = shape_exports["spatial"].read_text()
    assert "$shape=" in text and "pnnx.Expression" in text, "pnnx did not make the reshape targets inputs"
    assert "$split_size_or_sections=" in text, "pnnx did not make the split sizes an input"
    _compare(DynamicSpatial(), shape_exports["spatial"], model_backend, torch.randn(*shape))


# -- in-place assignment into slices (Tensor.slice_copy, Tensor.fill, torch.clone) ----------------


class SliceAssign(nn.Module):
    """torch code that writes into slices in place: a padding mask made in ``forward`` (BERT
    style), a slice of a clone set from another input, a strided 2-D slice filled with a number,
    and one index along dim 1 (pnnx: ``select=0 step=0``)."""

    def forward(self, x, y):
        keep = torch.ones(x.shape[0], 1, 1, 12)
        keep[..., -4:] = 0
        z = x.clone()
        z[:, 1:3] = y
        w = x * 2
        w[:, :, ::2, 1:5] = 7.0
        v = x + 1
        v[:, 0] = y[:, 1]
        return keep * x, z, w, v


def test_slice_assignment_matches_torch(backend, tmp_path):
    """Exported with a dynamic batch (a static export folds the mask, and pnnx then drops the
    assignment: its own bug); both batch sizes against torch, exactly."""
    from helpers import compare_with_torch

    x, y = torch.randn(2, 4, 5, 12), torch.randn(2, 2, 5, 12)
    x2, y2 = torch.randn(3, 4, 5, 12), torch.randn(3, 2, 5, 12)
    with warnings.catch_warnings():
        # (its fills feed slice copies: no warning about folded constants)
        warnings.filterwarnings("error", message=".*fills the folded constant")
        param = compare_with_torch(SliceAssign(), (x, y), backend, tmp_path, rtol=0, inputs2=(x2, y2))
    text = param.read_text()
    for t in ("Tensor.slice_copy", "Tensor.fill", "select=0", "steps=(2,1)"):
        assert t in text, f"pnnx no longer emits {t}"
    compare_with_torch(SliceAssign(), (x2, y2), backend, rtol=0, param=param)


class NumberAssign(nn.Module):
    """A number assigned to an element of a tensor computed in ``forward`` (TimesNet's
    ``frequency_list[0] = 0``): pnnx writes ``Tensor.slice_copy`` with the number as a
    parameter ``src`` and no second input."""

    def forward(self, x):
        y = x.amax(0) * 2  # (exact on every backend: the comparison below is bit for bit)
        y[0] = 0
        w = x * 3
        w[:, -1] = -1.5
        return x + y, w


def test_slice_copy_of_a_number_matches_torch(backend, tmp_path):
    from helpers import compare_with_torch

    x, x2 = torch.randn(2, 8), torch.randn(3, 8)
    param = compare_with_torch(NumberAssign(), (x,), backend, tmp_path, rtol=0, inputs2=(x2,))
    text = param.read_text()
    # (y is static: the number as a parameter; w has the dynamic batch: a Tensor.fill as the source)
    assert "src=0.0" in text, "pnnx no longer writes the number as a parameter"
    compare_with_torch(NumberAssign(), (x2,), backend, rtol=0, param=param)


def test_slice_copy_number_is_cast_like_torch(backend):
    """The number is cast to the input's dtype as torch's assignment casts it (truncated into
    integers, nonzero -> True for bool); a slice_copy with neither a source input nor a number
    is refused at build, naming it."""
    sc = make_layer(backend, "Tensor.slice_copy", "dim=1 start=1 end=3 step=1 src=2.7", names=("self",))
    for dt, tdt in ((np.int64, torch.int64), (np.float32, torch.float32), (np.bool_, torch.bool)):
        x = np.zeros((2, 4), dtype=dt)
        want = torch.zeros(2, 4, dtype=tdt)
        want[:, 1:3] = 2.7
        got = backend.to_numpy(run(backend, sc, x))
        assert got.dtype == dt
        np.testing.assert_array_equal(got, want.numpy())
    # a bound from an input beside the number: inputs (self, start)
    sc = make_layer(backend, "Tensor.slice_copy", "dim=1 end=3 step=1 src=5", n_in=2, names=("self", "start"))
    got = backend.to_numpy(run(backend, sc, np.zeros((2, 4), np.float32), 1))
    want = np.zeros((2, 4), np.float32)
    want[:, 1:3] = 5
    np.testing.assert_array_equal(got, want)
    with pytest.raises(LayerParameterError, match=r"Tensor.slice_copy 'op'.*no source to assign"):
        make_layer(backend, "Tensor.slice_copy", "dim=1 start=1 end=3 step=1", names=("self",))


class FoldedSliceAssign(nn.Module):
    """A slice assignment into a tensor pnnx folds (MAE's ``mask = torch.ones([N, L]); mask[:,
    :keep] = 0``): pnnx keeps the slice alone, as a ``pnnx.Attribute`` and a ``Tensor.fill``,
    and drops the write into the whole tensor."""

    def forward(self, x):
        m = torch.ones(1, 8)
        m[:, :3] = 0
        return x * m


def test_fill_of_a_folded_constant_warns_at_load(tmp_path):
    param = export_torch(FoldedSliceAssign(), (torch.randn(1, 8),), tmp_path)
    text = param.read_text()
    if "Tensor.slice_copy" in text or "Tensor.fill" not in text:
        pytest.skip("pnnx now exports the slice assignment whole")
    with pytest.warns(UserWarning, match=r"Tensor.fill .*fills the folded constant .*\(1,3\) that no slice copy "
                                         r"reads: pnnx writes this for a slice assignment"):
        kuiper_xp.load(param, backend="numpy")


class NarrowTail(nn.Module):
    """A streaming cache: the last 3 frames of ``cat([c, x], 1)``, by ``narrow`` with a start
    from the concatenation's size (pnnx folds it to the first example's value) and by a slice
    (exported right)."""

    def forward(self, x, c):
        y = torch.cat([c, x], 1)
        return y.narrow(1, y.size(1) - 3, 3), y[:, -3:] * 2


def test_narrow_with_a_folded_start_on_a_dynamic_dim_warns(tmp_path):
    param = export_torch(NarrowTail(), (torch.randn(2, 10), torch.randn(2, 3)), tmp_path,
                         inputs2=(torch.randn(3, 14), torch.randn(3, 3)))
    text = param.read_text()
    if "pnnx.Attribute" not in text:
        pytest.skip("pnnx no longer folds the start")
    with pytest.warns(UserWarning, match=r"torch.narrow .*its start is the constant .* pnnx folded, while dim 1 "):
        g = kuiper_xp.load(param, backend="numpy")
    x, c = np.random.rand(2, 12).astype(np.float32), np.random.rand(2, 3).astype(np.float32)
    with torch.no_grad():
        want = NarrowTail()(torch.from_numpy(x), torch.from_numpy(c))
    got = [kuiper_xp.to_numpy(o) for o in g(x, c)]
    np.testing.assert_array_equal(got[1], want[1].numpy())  # the slice: right at any length
    assert not np.array_equal(got[0], want[0].numpy())  # (why it warns: the folded start)
    with warnings.catch_warnings():  # a narrow whose start pnnx keeps computed: no warning
        warnings.filterwarnings("error", message=".*pnnx folded, while dim")
        p2 = export_torch(Fn(lambda x: x.narrow(1, x.size(1) - 3, 3)), (torch.randn(2, 10),), tmp_path / "b",
                          inputs2=(torch.randn(3, 14),))
        kuiper_xp.load(p2, backend="numpy")


def test_slice_copy_and_fill_edges(backend):
    """slice_copy leaves its input alone, broadcasts and casts the source, names itself when the
    source does not fit; fill casts its value to the input's dtype (truncating for integers)."""
    sc = make_layer(backend, "Tensor.slice_copy", "dim=1 start=1 end=3 step=1", n_in=2, names=("self", "src"))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = run(backend, sc, x, np.array([5, 6], dtype=np.int64))
    want = x.copy()
    want[:, 1:3] = [5, 6]
    np.testing.assert_array_equal(backend.to_numpy(got), want)
    x_dev = backend.asarray(x)
    sc(x_dev, backend.asarray(np.ones((3, 1), np.float32)))
    np.testing.assert_array_equal(backend.to_numpy(x_dev), x)  # not written in place
    with pytest.raises(ShapeError, match=r"Tensor.slice_copy 'op': the source of shape \(3, 3\) does not fit "
                                         r"the slice of shape \(3, 2\)"):
        run(backend, sc, x, np.zeros((3, 3), np.float32))
    fill = make_layer(backend, "Tensor.fill", "value=2.7", names=("input",))
    got = run(backend, fill, np.zeros((2, 3), np.int64))
    assert backend.to_numpy(got).dtype == np.int64
    np.testing.assert_array_equal(backend.to_numpy(got), torch.zeros(2, 3, dtype=torch.long).fill_(2.7).numpy())
    got = run(backend, fill, np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(backend.to_numpy(got), np.full((2, 3), 2.7, np.float32))
    with pytest.raises(LayerParameterError, match="'value' is missing"):
        make_layer(backend, "Tensor.fill", "", names=("input",))
    with pytest.raises(LayerParameterError, match="value=None: pnnx lost the fill value.*m\\[:, 0\\] = False"):
        make_layer(backend, "Tensor.fill", "value=None", names=("input",))


class LengthRegulator(nn.Module):
    """FastSpeech's length regulator: repeat_interleave by a tensor of counts (a buffer, and
    counts computed from an input), and by a scalar tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("r", torch.tensor([1, 0, 2, 3, 1, 1, 2, 0]))

    def forward(self, x, d):
        a = torch.repeat_interleave(x, self.r, dim=1)
        b = x[0].repeat_interleave(d.clamp(min=0), dim=0)
        return a, b * 2, torch.repeat_interleave(x, torch.tensor(2), dim=2)


def test_repeat_interleave_tensor_repeats_matches_torch(backend, tmp_path):
    from helpers import compare_with_torch

    x, d = torch.randn(2, 8, 4), torch.tensor([2, 0, 1, 3, 1, 1, 0, 2])
    param = compare_with_torch(LengthRegulator(), (x, d), backend, tmp_path, rtol=0,
                               inputs2=(torch.randn(3, 8, 4), torch.tensor([0, 0, 4, 1, 1, 1, 0, 1])))
    assert "$repeats" in param.read_text()
    layer = make_layer(backend, "torch.repeat_interleave", "dim=0", n_in=2, names=("input", "repeats"))
    x = X4[0, :, 0]  # (3, 5)
    check_all(run(backend, layer, x, np.array([2, 0, 1])), ref(
        lambda t: torch.repeat_interleave(t, torch.tensor([2, 0, 1]), 0), x), "repeat_interleave $repeats")
    for bad, match in ((np.array([1, 2]), "2 repeats for 3 elements"), (np.array([1, -1, 0]), ">= 0"),
                       (np.array([1.0, 2.0, 1.0]), "integers"), (np.ones((3, 1), np.int64), "scalar or 1-D")):
        with pytest.raises(ShapeError, match=match):
            run(backend, layer, x, bad)


class _NarrowFromSizes(nn.Module):
    """``x.narrow(1, 0, x.size(1) - 1)`` / a start from a size: pnnx passes the computed
    argument as an input (``$length=...``); it was refused ("parameter 'length' is missing")."""

    def forward(self, x):
        return x.narrow(1, 0, x.size(1) - 1), torch.narrow(x, 2, x.size(2) - 2, 2) * 2


def test_narrow_with_arguments_computed_from_sizes(model_backend, tmp_path):
    import kuiper_xp

    m = _NarrowFromSizes().eval()
    param = export_torch(m, (torch.randn(1, 4, 5),), tmp_path, inputs2=(torch.randn(3, 6, 7),))
    assert "$length=" in param.read_text()
    g = kuiper_xp.load(param, backend=model_backend)
    for shape in ((1, 4, 5), (3, 6, 7), (2, 9, 3)):
        x = torch.randn(*shape)
        for a, e in zip(g(x.numpy()), m(x)):
            assert_close(kuiper_xp.to_numpy(a), e.numpy(), rtol=1e-6, what=str(shape))


class _SizesFromTheBatch(nn.Module):
    """``x.new_full((x.shape[0], 3), v)`` and ``y.broadcast_to(x.shape[0], 3, 6)``: with a dynamic
    batch pnnx leaves ``aten::new_full`` / ``aten::broadcast_to`` with the size as a list input
    (refused as unsupported)."""

    def forward(self, x):
        y = x[:, :1, :]
        return (x.new_full((x.shape[0], 3), 4.0), y.broadcast_to(x.shape[0], 3, 6) * 2,
                x.new_full((2, x.shape[1]), 7, dtype=torch.int64))


def test_new_full_and_broadcast_to_with_sizes_from_the_batch(model_backend, tmp_path):
    from helpers import export_module

    import kuiper_xp

    m = _SizesFromTheBatch().eval()
    param = export_module(m, (torch.randn(1, 4, 6),), tmp_path, inputs2=(torch.randn(3, 4, 6),))
    text = param.read_text()
    assert "aten::new_full" in text and "aten::broadcast_to" in text
    g = kuiper_xp.load(param, backend=model_backend)
    for b in (1, 3, 5):
        x = torch.randn(b, 4, 6)
        for a, e in zip(g(x.numpy()), m(x)):
            a = kuiper_xp.to_numpy(a)
            assert a.dtype == e.numpy().dtype and a.shape == tuple(e.shape)
            assert_close(a, e.numpy(), rtol=1e-6)


class _MixtralGather(nn.Module):
    """HF Mixtral's routing gather: ``x[None, tok].reshape(-1, d)`` after a data-dependent
    ``torch.where``; pnnx declares the where's result as (0) and writes the reshape target as
    ``(0, 8)``, a size frozen at the example's 0 (it stopped with 'cannot reshape ... to (0, 8)')."""

    def forward(self, x, idx):
        _, tok = torch.where(torch.nn.functional.one_hot(idx, 4).permute(2, 1, 0)[0])
        return x[None, tok].reshape(-1, x.shape[-1]) * 2


def test_reshape_target_with_a_size_pnnx_froze_at_zero(model_backend, tmp_path):
    from helpers import export_module

    import kuiper_xp

    g = torch.Generator().manual_seed(3)
    ins1 = (torch.randn(16, 8, generator=g), torch.randint(0, 4, (16, 2), generator=g))
    ins2 = (torch.randn(33, 8, generator=g), torch.randint(0, 4, (33, 2), generator=g))
    param = export_module(_MixtralGather(), ins1, tmp_path, inputs2=ins2)
    assert "shape=(0,8)" in param.read_text()
    graph = kuiper_xp.load(param, backend=model_backend)
    for ins in (ins1, ins2):
        got = graph(*(t.numpy() for t in ins))[0]
        assert_close(kuiper_xp.to_numpy(got), _MixtralGather()(*ins).numpy(), rtol=1e-6)
    layer = make_layer(model_backend, "Tensor.reshape", "shape=(0,4)")
    with pytest.raises(ShapeError, match=r"cannot reshape an input of shape \(3, 3\)"):
        run(model_backend, layer, np.ones((3, 3), np.float32))  # (9 does not split into rows of 4)


class _SizesFromShape(nn.Module):
    """Sizes a pnnx.Expression computes from the input's shape, given as an input of the op:
    ``$sizes`` (unflatten), ``$shifts`` (roll), ``$output_size`` (fold)."""

    def forward(self, x):
        u = x.flatten(1).unflatten(1, (x.size(1), -1))
        r = torch.roll(x, (x.size(2) // 2, 1), (2, 3))
        f = nn.functional.fold(nn.functional.unfold(x, 3, padding=1), output_size=x.shape[-2:], kernel_size=3,
                               padding=1)
        return u * 2, r + 1, f


def test_sizes_computed_from_the_shape_at_unseen_shapes(tmp_path):
    """Were refused at load ("parameter 'sizes' is missing"); run at shapes the export never saw."""
    m = _SizesFromShape().eval()
    param = export_module(m, (torch.randn(2, 4, 8, 12),), tmp_path, inputs2=(torch.randn(3, 4, 12, 16),))
    g = kuiper_xp.load(param, backend="numpy")
    for shape in ((1, 4, 5, 5), (3, 4, 9, 7)):
        x = torch.randn(*shape)
        with torch.no_grad():
            want = m(x)
        got = g(x.numpy())
        for k, (a, e) in enumerate(zip(got, want)):
            assert_close(np.asarray(a), e.numpy(), rtol=1e-5, what=f"{shape} output {k}")
