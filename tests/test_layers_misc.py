"""Misc layers (kuiper_xp/layers/misc.py) against PyTorch: where, comparisons, logic, masked_fill,
creation ops, padding, topk/sort/argsort, tril/triu, index_select, gather.

Single-operator graphs are written by hand (``one_op_param``, also used by the resize, norm and
attention tests) so that these tests need no layer but the one under test; one pnnx export per
family checks the real spellings end to end.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from helpers import bad_value, export_module  # noqa: F401  (export_module: imported from here by other test files)
from torch import nn

import kuiper_xp
from kuiper_xp.layers import BuildContext, registry
from kuiper_xp.pnnx.param import parse_param_text

# ---------------------------------------------------------------------------------------------
# helpers shared with test_layers_resize/norm/attention

_SUFFIX = {"float32": "f32", "float64": "f64", "float16": "f16", "int64": "i64", "int32": "i32",
           "bool": "bool", "uint8": "u8", "int8": "i8"}


def _shape_str(shape) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


def _ann(name: str, a: np.ndarray) -> str:
    return f"#{name}={_shape_str(a.shape)}{_SUFFIX[str(a.dtype)]}"


def one_op_param(tmp_path: Path, op_type: str, inputs, outputs, params: str = "", weights=None,
                 keys=None, name: str = "op") -> Path:
    """Write ``m.pnnx.param`` (+ ``m.pnnx.bin``) holding one ``op_type`` operator fed by graph
    inputs shaped like ``inputs`` and annotated with the shapes/dtypes of ``outputs`` (the
    expected torch results). ``keys`` gives the ``$key`` of each input ('' for none)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    weights = weights or {}
    keys = keys or [""] * len(inputs)
    lines, n_ops = [], 0
    for i, a in enumerate(inputs):
        lines.append(f"pnnx.Input in{i} 0 1 i{i} {_ann(f'i{i}', a)}")
        n_ops += 1
    ins = " ".join(f"i{i}" for i in range(len(inputs)))
    outs = " ".join(f"o{k}" for k in range(len(outputs)))
    extra = [f"@{w}={_shape_str(a.shape)}{_SUFFIX[str(a.dtype)]}" for w, a in weights.items()]
    extra += [f"${k}=i{i}" for i, k in enumerate(keys) if k]
    extra += [_ann(f"i{i}", a) for i, a in enumerate(inputs)] + [_ann(f"o{k}", a) for k, a in enumerate(outputs)]
    lines.append(f"{op_type} {name} {len(inputs)} {len(outputs)} {ins} {outs} {params} {' '.join(extra)}")
    n_ops += 1
    n_operands = len(inputs) + len(outputs)
    if len(outputs) > 1:
        lines.append(f"prim::TupleConstruct tup {len(outputs)} 1 {outs} t")
        lines.append("pnnx.Output out 1 0 t")
        n_ops += 2
        n_operands += 1
    else:
        lines.append("pnnx.Output out 1 0 o0")
        n_ops += 1
    param = tmp_path / "m.pnnx.param"
    param.write_text(f"7767517\n{n_ops} {n_operands}\n" + "\n".join(lines) + "\n")
    with zipfile.ZipFile(tmp_path / "m.pnnx.bin", "w", zipfile.ZIP_STORED) as z:
        for w, a in weights.items():
            z.writestr(f"{name}.{w}", np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes())
    return param


def run_one_op(backend, tmp_path, op_type, inputs, expected, params="", weights=None, keys=None, rtol=1e-5):
    """Build the one-operator graph, run it on ``backend`` and compare every output with torch."""
    inputs = [np.asarray(a) for a in inputs]
    expected = [np.asarray(e) for e in (expected if isinstance(expected, (list, tuple)) else [expected])]
    param = one_op_param(tmp_path, op_type, inputs, expected, params, weights, keys)
    g = kuiper_xp.load(param, backend=backend)
    got = g(*inputs)
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=rtol, what=f"{op_type} output {k}")
    return got


def make_layer(backend, line: str, n_in: int = 1):
    """Build the layer of a single param line whose inputs are operands 0..n_in-1."""
    head = "".join(f"pnnx.Input in{i} 0 1 {i}\n" for i in range(n_in))
    n_out = int(line.split()[3])
    model = parse_param_text(f"7767517\n{n_in + 1} {n_in + n_out}\n{head}{line}\n")
    return registry.create(model.operators[-1], BuildContext(backend))


def t2n(t) -> np.ndarray:
    return t.detach().numpy()


def require_types(param: Path) -> None:
    """Skip when the exported graph needs an operator type no layer is registered for yet."""
    types = {ln.split()[0] for ln in param.read_text().splitlines()[2:] if ln.strip()}
    missing = sorted(t for t in types if t not in registry and t != "prim::TupleConstruct")
    if missing:
        pytest.skip(f"layers not registered yet: {', '.join(missing)}")


def compare_graph(param: Path, backend, module, inputs, rtol=1e-4):
    with torch.no_grad():
        out = module.eval()(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    g = kuiper_xp.load(param, backend=backend)
    got = g(*[t2n(t) for t in inputs])
    assert len(got) == len(out)
    for k, (a, e) in enumerate(zip(got, out)):
        assert_close(a, t2n(e), rtol=rtol, what=f"output {k}")


# ---------------------------------------------------------------------------------------------

rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---- where / comparisons / logic ------------------------------------------------------------


def test_where_tensors(backend, tmp_path):
    c, a, b = randn(2, 3) > 0, randn(2, 3), randn(1, 3)
    e = torch.where(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b))
    run_one_op(backend, tmp_path, "torch.where", [c, a, b], t2n(e), keys=["condition", "input", "other"])


@pytest.mark.parametrize("params,dtype", [("other=0.0", np.float32), ("input=1.0 other=0.0", np.float32),
                                          ("other=2", np.int64)])
def test_where_scalars(backend, tmp_path, params, dtype):
    c, a = randn(3, 4) > 0, (randn(3, 4) * 5).astype(dtype)
    kw = dict(kv.split("=") for kv in params.split())
    inp = float(kw["input"]) if "input" in kw else torch.from_numpy(a)
    other = float(kw["other"]) if "." in kw["other"] else int(kw["other"])
    e = torch.where(torch.from_numpy(c), inp, other)
    ins, keys = ([c], ["condition"]) if "input" in kw else ([c, a], ["condition", "input"])
    run_one_op(backend, tmp_path, "torch.where", ins, t2n(e), params=params, keys=keys)


@pytest.mark.parametrize("op", ["eq", "ne", "gt", "ge", "lt", "le"])
def test_compare(backend, tmp_path, op):
    a = np.round(randn(3, 4)).astype(np.float32)
    b = np.round(randn(1, 4)).astype(np.float32)
    fn = getattr(torch, op)
    run_one_op(backend, tmp_path / "t", f"torch.{op}", [a, b], t2n(fn(torch.from_numpy(a), torch.from_numpy(b))),
               keys=["input", "other"])
    run_one_op(backend, tmp_path / "s", f"torch.{op}", [a], t2n(fn(torch.from_numpy(a), 0.5)),
               params="other=0.5", keys=["input"])


def test_compare_int_with_float_scalar(backend, tmp_path):
    a = np.arange(-3, 3, dtype=np.int64)
    run_one_op(backend, tmp_path, "torch.gt", [a], t2n(torch.gt(torch.from_numpy(a), 0.5)), params="other=0.5",
               keys=["input"])


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or"])
def test_logical(backend, tmp_path, op):
    a, b = randn(2, 5) > 0, randn(2, 5) > 0
    e = getattr(torch, op)(torch.from_numpy(a), torch.from_numpy(b))
    run_one_op(backend, tmp_path, f"torch.{op}", [a, b], t2n(e), keys=["input", "other"])


def test_logical_not_and_bitwise(backend, tmp_path):
    m = randn(3, 3) > 0
    run_one_op(backend, tmp_path / "a", "torch.logical_not", [m], ~m, keys=["input"])
    run_one_op(backend, tmp_path / "b", "torch.bitwise_not", [m], ~m, keys=["input"])
    i = np.arange(6, dtype=np.int64)
    run_one_op(backend, tmp_path / "c", "torch.bitwise_not", [i], t2n(torch.bitwise_not(torch.from_numpy(i))),
               keys=["input"])
    f = randn(4)
    run_one_op(backend, tmp_path / "d", "torch.logical_and", [f, m[0, :1].astype(np.float32)],
               t2n(torch.logical_and(torch.from_numpy(f), torch.from_numpy(m[0, :1].astype(np.float32)))),
               keys=["input", "other"])


@pytest.mark.parametrize("value", ["-1.0", "-inf", "3", "nan.0"])
def test_masked_fill(backend, tmp_path, value):
    """(``nan.0`` is how pnnx writes ``float("nan")``: it was refused as a parameter.)"""
    x, m = randn(2, 3, 4), randn(3, 4) > 0
    e = torch.from_numpy(x).masked_fill(torch.from_numpy(m), float(value.removesuffix(".0")))
    run_one_op(backend, tmp_path, "Tensor.masked_fill", [x, m], t2n(e), params=f"value={value}", keys=["input", "mask"])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("value", ["2.7", "-2.7", "0.0", "nan.0", "300", "-1"])
def test_masked_fill_of_integer_and_bool_tensors(backend, tmp_path, dtype, value):
    """A float fill on an integer tensor is truncated toward zero, on a bool one any non-zero
    number (NaN too) is True; NaN/inf on integers and out-of-range integers are errors, as in
    torch (which cannot convert them either)."""
    x = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    m = randn(3, 4) > 0
    v = float(value.removesuffix(".0")) if "." in value else int(value)
    try:
        e = t2n(torch.from_numpy(x).masked_fill(torch.from_numpy(m), v))
    except RuntimeError:
        layer = make_layer(backend, f"Tensor.masked_fill op 2 1 0 1 2 value={value} $input=0 $mask=1", 2)
        with pytest.raises(kuiper_xp.errors.ShapeError, match="cannot"):
            layer(backend.asarray(x), backend.asarray(m))
        return
    run_one_op(backend, tmp_path, "Tensor.masked_fill", [x, m], e, params=f"value={value}", keys=["input", "mask"])


# ---- creation ---------------------------------------------------------------------------------


def test_creation_static(backend, tmp_path):
    run_one_op(backend, tmp_path / "z", "torch.zeros", [], np.zeros((2, 3), np.float32), params="size=(2,3) dtype=None")
    run_one_op(backend, tmp_path / "o", "torch.ones", [], np.ones((4,), bool), params="size=(4) dtype=torch.bool")
    run_one_op(backend, tmp_path / "f", "torch.full", [], np.full((2, 2), -np.inf, np.float32),
               params="size=(2,2) fill_value=-inf dtype=None")
    run_one_op(backend, tmp_path / "a", "torch.arange", [], np.arange(2, 11, 3), params="start=2 end=11 step=3 dtype=None")
    run_one_op(backend, tmp_path / "af", "torch.arange", [], t2n(torch.arange(0, 1, 0.25)),
               params="start=0 end=1 step=0.25 dtype=None")
    x = randn(2, 3)
    run_one_op(backend, tmp_path / "zl", "torch.zeros_like", [x], np.zeros_like(x), keys=["input"])
    run_one_op(backend, tmp_path / "fl", "torch.full_like", [x], np.full_like(x, 7), params="fill_value=7",
               keys=["input"])
    run_one_op(backend, tmp_path / "nz", "Tensor.new_ones", [x], np.ones((3, 1), np.float32),
               params="size=(3,1) dtype=None", keys=["input"])


def test_creation_dynamic_size(backend):
    """Sizes and arange bounds fed by pnnx.Expression outputs (Python ints or 0-d arrays)."""
    xp = backend.xp
    layer = make_layer(backend, "torch.ones op 1 1 0 1 dtype=None $size=0")
    assert_close(layer.forward([2, 3]), np.ones((2, 3), np.float32))
    layer = make_layer(backend, "torch.full op 1 1 0 1 fill_value=2.5 dtype=None $size=0")
    assert_close(layer.forward([xp.asarray(4, device=backend.device)]), np.full((4,), 2.5, np.float32))
    layer = make_layer(backend, "Tensor.new_zeros op 2 1 0 1 2 dtype=None $input=0 $size=1", n_in=2)
    x = backend.asarray(randn(2, 2).astype(np.float64))
    assert_close(layer.forward(x, (3, 1)), np.zeros((3, 1), np.float64))
    layer = make_layer(backend, "torch.arange op 1 1 0 1 dtype=None $end=0")
    assert_close(layer.forward(5), np.arange(5))
    assert_close(layer.forward(xp.asarray(3, device=backend.device)), np.arange(3))


# ---- padding ------------------------------------------------------------------------------------


PAD_CASES = [
    ("constant", (1, 2), 0.0), ("constant", (1, 2, 0, 3), 1.5), ("constant", (-1, 2, 1, -2), 0.0),
    ("reflect", (1, 2), None), ("reflect", (2, 1, 1, 3), None), ("replicate", (1, 2, 3, 0), None),
    ("replicate", (2, -1), None), ("circular", (1, 2, 2, 1), None), ("circular", (3, 0), None),
    # circular with a crop: torch crops first, then wraps what is left
    ("circular", (-1, 2), None), ("circular", (-1, 2, 1, -2), None), ("circular", (3, -2, -1, 1), None),
    ("reflect", (-1, 2, 2, -1), None),
]


@pytest.mark.parametrize("mode,pad,value", PAD_CASES)
def test_f_pad(backend, tmp_path, mode, pad, value):
    x = randn(2, 4, 5)
    kw = {} if value is None else {"value": value}
    e = F.pad(torch.from_numpy(x), pad, mode=mode, **kw)
    params = f"mode={mode} pad={_shape_str(pad)} value={'None' if value is None else value}"
    run_one_op(backend, tmp_path, "F.pad", [x], t2n(e), params=params, keys=["input"])


class PadToSkip(nn.Module):
    """A U-Net pads its upsampled map to the skip connection's size (crop when negative)."""

    def forward(self, u, skip):
        w0 = u.shape[3]
        u = F.pad(u, (0, skip.shape[3] - w0, 1, skip.shape[2] - u.shape[2] - 1))
        return torch.cat([u, skip], 1), F.pad(skip, (w0 % 3, 1, 0, w0 % 2), mode="reflect")


def test_pad_amounts_from_an_input(model_backend, tmp_path):
    """With dynamic shapes pnnx passes the amounts as an input (``$pad=`` from a list
    expression); each call pads by what that call's shapes give."""
    def pair(n, h, w, dh, dw):
        return torch.randn(n, 2, h, w), torch.randn(n, 3, h + dh, w + dw)

    param = export_module(PadToSkip(), pair(1, 4, 5, 2, 1), tmp_path, inputs2=pair(2, 6, 7, 3, 2))
    assert "$pad=" in param.read_text(), "pnnx no longer passes F.pad's amounts as an input"
    for ins in (pair(2, 6, 7, 3, 2), pair(3, 5, 7, 1, 0), pair(1, 6, 4, 2, -1)):
        compare_graph(param, model_backend, PadToSkip(), ins)


def test_pad_int_and_3d(backend, tmp_path):
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    e = F.pad(torch.from_numpy(x), (1, 1, 1, 0, 0, 1), value=-7)
    run_one_op(backend, tmp_path, "F.pad", [x], t2n(e), params="mode=constant pad=(1,1,1,0,0,1) value=-7",
               keys=["input"])


@pytest.mark.parametrize("module,params", [
    (nn.ZeroPad2d((1, 2, 0, 1)), "padding=(1,2,0,1)"),
    (nn.ConstantPad1d(2, 3.5), "padding=(2,2) value=3.5"),
    (nn.ReflectionPad2d(1), "padding=(1,1,1,1)"),
    (nn.ReplicationPad2d((1, 0, 2, 1)), "padding=(1,0,2,1)"),
    (nn.CircularPad2d(1), "padding=(1,1,1,1)"),
])
def test_pad_modules(backend, tmp_path, module, params):
    x = randn(1, 2, 3, 4)
    run_one_op(backend, tmp_path, f"nn.{type(module).__name__}", [x], t2n(module(torch.from_numpy(x))),
               params=params)


# ---- sort / topk ------------------------------------------------------------------------------


@pytest.mark.parametrize("k,dim,largest", [(3, 1, True), (2, -1, False), (1, 0, True), (5, -1, True)])
def test_topk(backend, tmp_path, k, dim, largest):
    x = randn(4, 5)
    v, i = torch.topk(torch.from_numpy(x), k, dim=dim, largest=largest)
    run_one_op(backend, tmp_path, "torch.topk", [x], [t2n(v), t2n(i)],
               params=f"dim={dim} k={k} largest={largest} sorted=True", keys=["input"])


class _TopHalf(nn.Module):
    def forward(self, x):
        v, i = torch.topk(x, x.shape[1] // 2, dim=1, largest=False)
        return v, i


def test_topk_with_k_computed_from_a_dynamic_size(backend, tmp_path):
    # pnnx passes such a k as the input $k (`torch.topk ... $input=0 $k=1`), not a parameter
    from helpers import export_torch

    param = export_torch(_TopHalf(), (torch.randn(2, 6),), tmp_path, inputs2=(torch.randn(3, 10),))
    g = kuiper_xp.load(param, backend=backend)
    x = torch.randn(4, 14)
    v, i = (backend.to_numpy(a) for a in g(x.numpy()))
    tv, ti = _TopHalf()(x)
    np.testing.assert_array_equal(v, t2n(tv))
    np.testing.assert_array_equal(i, t2n(ti))


@pytest.mark.parametrize("shape,k,dim,largest,dtype", [
    ((3, 70, 10), 8, 1, True, np.float32), ((24, 90), 20, -1, False, np.float64), ((32, 64), 16, 1, True, np.int64),
    ((40, 60), 10, 0, False, np.int32), ((2, 3, 400), 1, 2, True, np.float32), ((8, 300), 75, 1, True, np.float32),
    ((1, 1000), 50, 1, True, np.float32),  # (small: the sort)
])
def test_topk_with_ties_matches_torch_and_the_sort(backend, shape, k, dim, largest, dtype):
    """Rows long enough for numpy's partition path (short rows, k over a quarter of the row and
    NaN go to the stable sort), many ties (values on a grid of halves, with -0.0 and 0.0): the
    values equal torch's, the indices the stable sort's (ties: lower index first), int64."""
    rng = np.random.default_rng(5)
    x = (np.round(rng.standard_normal(shape) * 3) / 2).astype(dtype)
    if dtype in (np.float32, np.float64):
        x.reshape(-1)[:4] = [0.0, -0.0, -0.0, 0.0]
    layer = make_layer(backend, f"torch.topk op 1 2 0 1 2 dim={dim} k={k} largest={largest} sorted=True")
    v, i = (backend.to_numpy(a) for a in layer(backend.asarray(x)))
    if backend.name == "numpy":
        from kuiper_xp.backends import numpy_fast as nf
        assert (nf.topk(x, k, dim % x.ndim, largest) is None) == (x.size < nf.TOPK_MIN_ELEMENTS)
    tv, _ = torch.topk(torch.from_numpy(x), k, dim=dim, largest=largest)
    np.testing.assert_array_equal(v, t2n(tv))
    assert i.dtype == np.int64
    order = np.argsort(-x if largest else x, axis=dim, kind="stable")  # (ints: small, no overflow)
    np.testing.assert_array_equal(i, np.take(order, np.arange(k), axis=dim))
    xn = x.astype(np.float32)
    xn.reshape(-1)[5] = np.nan  # (the sort's order: NaN as torch orders it)
    tv, ti = torch.topk(torch.from_numpy(xn), k, dim=dim, largest=largest)
    got = [backend.to_numpy(a) for a in make_layer(backend, f"torch.topk op 1 2 0 1 2 dim={dim} k={k} "
                                                            f"largest={largest} sorted=True")(backend.asarray(xn))]
    np.testing.assert_array_equal(got[0], t2n(tv))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("tied_row", [False, True])
def test_topk_without_ties_takes_the_partition_as_it_is(largest, tied_row):
    """The numpy fast path: where no row holds more values equal to its k-th than it takes, the
    partition's k indices are the answer (sorted into the stable order); one row with such ties
    sends the whole array through the tie-resolving path. Both give torch's values and the
    stable sort's indices."""
    from kuiper_xp.backends import numpy_fast as nf

    x = np.random.default_rng(6).standard_normal((6, 2000)).astype(np.float32)
    if tied_row:  # 40 copies of that row's 6th value, straddling its 20th (along axis 1)
        x[2, :40] = np.sort(x[2])[::-1][5] if largest else np.sort(x[2])[5]
    k = 20
    for a, axis in ((x, 1), (np.ascontiguousarray(x.T), 0)):
        v, i = nf.topk(a, k, axis, largest)
        tv, _ = torch.topk(torch.from_numpy(a), k, dim=axis, largest=largest)
        np.testing.assert_array_equal(v, t2n(tv))
        order = np.argsort(-a if largest else a, axis=axis, kind="stable")
        np.testing.assert_array_equal(i, np.take(order, np.arange(k), axis=axis))
        assert i.dtype == np.int64


@pytest.mark.parametrize("dim,descending", [(1, False), (-1, True), (0, True)])
def test_sort_argsort(backend, tmp_path, dim, descending):
    x = randn(3, 4, 5)
    v, i = torch.sort(torch.from_numpy(x), dim=dim, descending=descending)
    run_one_op(backend, tmp_path / "s", "torch.sort", [x], [t2n(v), t2n(i)],
               params=f"dim={dim} descending={descending}", keys=["input"])
    a = torch.argsort(torch.from_numpy(x), dim=dim, descending=descending)
    run_one_op(backend, tmp_path / "a", "torch.argsort", [x], t2n(a), params=f"dim={dim} descending={descending}",
               keys=["input"])


def test_aten_sort_and_triangles_with_scalar_inputs(backend):
    """``aten::sort(x, dim, descending)`` / ``aten::tril(x, diagonal)`` get their scalars as
    inputs from constant pnnx.Expression ops."""
    x = randn(4, 6)
    xb = backend.asarray(x)
    v, i = torch.sort(torch.from_numpy(x), dim=1, descending=True)
    layer = make_layer(backend, "aten::sort op 3 2 0 1 2 3 4", n_in=3)
    got = layer.forward(xb, 1, True)
    assert_close(got[0], t2n(v))
    assert_close(got[1], t2n(i))
    layer = make_layer(backend, "aten::argsort op 3 1 0 1 2 3", n_in=3)
    assert_close(layer.forward(xb, -1, False), t2n(torch.argsort(torch.from_numpy(x), dim=-1)))
    for k in (-1, 0, 2):
        for kind in ("tril", "triu"):
            layer = make_layer(backend, f"aten::{kind} op 2 1 0 1 2", n_in=2)
            assert_close(layer.forward(xb, k), t2n(getattr(torch, kind)(torch.from_numpy(x), k)))


@pytest.mark.parametrize("kind,diag", [("tril", 0), ("triu", 1), ("tril", -1)])
def test_torch_tril_triu(backend, tmp_path, kind, diag):
    x = randn(2, 4, 5)
    e = getattr(torch, kind)(torch.from_numpy(x), diag)
    run_one_op(backend, tmp_path, f"torch.{kind}", [x], t2n(e), params=f"diagonal={diag}", keys=["input"])


# ---- indexing ---------------------------------------------------------------------------------


def test_index_select_and_gather(backend, tmp_path):
    x = randn(3, 6)
    idx = np.array([0, 5, 2, 2], dtype=np.int64)
    e = torch.index_select(torch.from_numpy(x), 1, torch.from_numpy(idx))
    run_one_op(backend, tmp_path / "i", "torch.index_select", [x, idx], t2n(e), params="dim=1", keys=["input", "index"])
    gi = np.array([[1, 0], [2, 2]], dtype=np.int64)  # smaller than the input outside dim
    e = torch.gather(torch.from_numpy(x), 0, torch.from_numpy(gi))
    run_one_op(backend, tmp_path / "g", "torch.gather", [x, gi], t2n(e), params="dim=0", keys=["input", "index"])


@pytest.mark.parametrize("axis,x_shape,i_shape,expand", [
    (2, (6, 40, 32), (6, 40, 50), True),  # DeBERTa's relative-position gather: an expanded index
    (1, (3, 50, 40), (3, 60, 30), False), (0, (30, 20, 12), (25, 20, 10), False),
    (1, (4, 30, 8), (4, 20, 8), "tail"),  # Reformer's sort: (B, k, 1) expanded over the rows
    # big enough to be split over the 2 threads, one row of the first axis each
    (1, (2, 128, 256), (2, 128, 256), False), (2, (2, 64, 600), (2, 64, 512), False),
])
def test_gather_numpy_fast_path_matches_torch(tmp_path, monkeypatch, axis, x_shape, i_shape, expand):
    """Indices of 4096 elements and more take numpy's flat-position path (split over threads)."""
    from kuiper_xp.backends import numpy_fast as nf

    real, used = nf.take_along, []
    monkeypatch.setattr(nf, "take_along", lambda *a: used.append(real(*a)) or used[-1])

    rng = np.random.default_rng(3)
    x = rng.standard_normal(x_shape).astype(np.float32)
    if expand == "tail":
        idx = np.broadcast_to(rng.integers(0, x_shape[axis], i_shape[:2] + (1,)), i_shape)
    elif expand:
        idx = np.broadcast_to(rng.integers(0, x_shape[axis], (1,) + i_shape[1:]), i_shape)
    else:
        idx = rng.integers(0, x_shape[axis], i_shape)
    e = torch.gather(torch.from_numpy(x), axis, torch.from_numpy(np.ascontiguousarray(idx)))
    if expand == "tail":  # (the graph's input is a copy: the expanded view as an expand layer makes it)
        np.testing.assert_array_equal(nf.take_along(x[:, :, :i_shape[2]], idx, axis), t2n(e))
        # a permuted input (PointNet++'s (B, N, 3) view of (B, 3, N) points): read in place
        xt = np.swapaxes(np.ascontiguousarray(np.swapaxes(x, 1, 2)), 1, 2)
        assert not xt.flags.c_contiguous
        np.testing.assert_array_equal(nf.take_along(xt, idx, axis), t2n(e))
    param = one_op_param(tmp_path, "torch.gather", [x, idx], [t2n(e)], f"dim={axis}", None, ["input", "index"])
    g = kuiper_xp.load(param, backend="numpy")
    old = nf.set_num_threads(2)
    try:
        np.testing.assert_array_equal(kuiper_xp.to_numpy(g(x, idx)[0]), t2n(e))
    finally:
        nf.set_num_threads(old)
    assert used and used[-1] is not None


@pytest.mark.parametrize("op_type,bad", [("torch.gather", -1), ("torch.gather", 6), ("torch.index_select", -1),
                                         ("torch.index_select", 6)])
def test_index_select_and_gather_refuse_out_of_range_indices(backend, tmp_path, op_type, bad):
    """torch raises for an index outside [0, size) (negative ones included); -1 used to wrap
    silently (numpy's take), 6 failed inside numpy, and CuPy's take would wrap both."""
    x = randn(3, 6)
    idx = np.array([0, bad], np.int64) if op_type == "torch.index_select" else np.array([[0, bad]], np.int64)
    with pytest.raises(RuntimeError):
        (torch.index_select if op_type == "torch.index_select" else torch.gather)(torch.from_numpy(x), 1,
                                                                                  torch.from_numpy(idx))
    param = one_op_param(tmp_path, op_type, [x, idx], [np.zeros((3, 2) if idx.ndim == 1 else (1, 2), np.float32)],
                         "dim=1", None, ["input", "index"])
    g = kuiper_xp.load(param, backend=backend)
    with pytest.raises(kuiper_xp.errors.ShapeError, match=rf"{op_type} 'op'.*index {bad_value(backend, bad)}is out of range for a dimension of size 6"):
        g(x, idx)


class _SortedWeight(torch.nn.Module):
    """NODE's entmax of a parameter: pnnx folds the sort of a weight into a constant, drops the
    unused indices and still counts them in the header's operand count."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 4))

    def forward(self, x):
        return x @ torch.sort(self.w, dim=0, descending=True)[0]


def test_header_counting_a_dropped_output_loads(tmp_path, model_backend):
    from helpers import export_torch

    torch.manual_seed(0)
    m = _SortedWeight().eval()
    param = export_torch(m, [torch.randn(1, 6)], tmp_path, inputs2=[torch.randn(3, 6)])
    declared = int(param.read_text().splitlines()[1].split()[1])
    g = kuiper_xp.load(param, backend=model_backend)
    assert declared > len(g.model.operands)  # (the case this is about)
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    assert_close(kuiper_xp.to_numpy(g(x)[0]), t2n(m(torch.from_numpy(x)).detach()), rtol=1e-5, what="sorted weight")


# ---- errors -----------------------------------------------------------------------------------


def test_bad_parameters_name_the_op(backend):
    from kuiper_xp.errors import LayerParameterError

    with pytest.raises(LayerParameterError, match="F.pad 'op'.*mode"):
        make_layer(backend, "F.pad op 1 1 0 1 mode=wrap pad=(1,1)")
    with pytest.raises(LayerParameterError, match="torch.where"):
        make_layer(backend, "torch.where op 1 1 0 1 $condition=0")
    with pytest.raises(LayerParameterError, match="topk.*k"):
        make_layer(backend, "torch.topk op 1 2 0 1 2 dim=0 k=-1")


# ---- pnnx end to end ----------------------------------------------------------------------------


class MiscModule(nn.Module):
    def forward(self, x, y, idx, tok):
        m = x > 0.2
        r = [torch.where(x > y, x, y), torch.where(m, x, 0.0), torch.eq(x, y), x <= 0.1, torch.ne(x, 0.3),
             torch.logical_and(m, y < 0.5), torch.logical_not(m), x.masked_fill(~m, float("-inf"))]
        x4 = x.unsqueeze(0)
        r += [F.pad(x, (1, 2), value=1.5), F.pad(x4, (1, 2, 2, 1), mode="reflect"),
              F.pad(x4, (1, 2, 0, 1), mode="replicate"), F.pad(x4, (1, 1, 1, 1), mode="circular"),
              F.pad(x, (-1, 2))]
        v, i = torch.topk(x, 3, dim=1)
        r += [v, i]
        v, i = torch.sort(x, dim=1, descending=True)
        r += [v, i, torch.argsort(y, dim=-1), torch.tril(x), torch.triu(x, 1)]
        r += [torch.index_select(x, 1, idx), torch.gather(x, 1, tok)]
        return tuple(r)


@pytest.fixture(scope="session")
def misc_export(tmp_path_factory):
    torch.manual_seed(0)
    x, y = torch.rand(3, 8), torch.rand(3, 8)
    idx = torch.tensor([0, 3, 1, 7])
    tok = torch.randint(0, 8, (3, 5))
    inputs = (x, y, idx, tok)
    return export_module(MiscModule(), inputs, tmp_path_factory.mktemp("misc")), inputs


def test_misc_export_matches_torch(misc_export, model_backend):
    param, inputs = misc_export
    text = param.read_text()
    for t in ("torch.where", "torch.gt", "torch.eq", "torch.le", "torch.ne", "torch.logical_and", "F.pad",
              "torch.topk", "aten::sort", "aten::argsort", "aten::tril", "aten::triu", "Tensor.masked_fill",
              "torch.index_select", "torch.gather"):
        assert t in text, f"pnnx no longer emits {t}"
    require_types(param)
    compare_graph(param, model_backend, MiscModule(), inputs)


class DynamicCreation(nn.Module):
    def forward(self, s):
        T = s.size(1)
        causal = torch.triu(torch.ones(T, T), diagonal=1)
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        return (s + torch.arange(T).float(), causal, s[:, :, :T].masked_fill(~keep, -1e4),
                torch.full((T,), 2.0), s.new_zeros(s.shape))


def test_dynamic_creation_export(model_backend, tmp_path_factory):
    s, s2 = torch.rand(2, 5, 5), torch.rand(3, 6, 6)
    param = export_module(DynamicCreation(), (s,), tmp_path_factory.mktemp("dyncreate"), inputs2=(s2,))
    text = param.read_text()
    assert "torch.arange" in text and "torch.ones" in text and "Tensor.new_zeros" in text
    require_types(param)
    compare_graph(param, model_backend, DynamicCreation(), (s2,))
    compare_graph(param, model_backend, DynamicCreation(), (s,))


class _NarrowIntScalars(nn.Module):
    """A narrow integer tensor with a Python int outside its range: torch wraps the scalar into
    the tensor's dtype (NumPy 2 raised OverflowError)."""

    def forward(self, x):
        i8 = x.to(torch.int8)
        u8 = (x * 60 + 128).to(torch.uint8)
        return i8 + 1000, u8 + (-1), u8 * 300, u8 == -56, torch.where(x > 0, u8, -1)


class _ZeroDimOperands(nn.Module):
    """A 0-d tensor of a wider dtype of the same kind does not widen the other operand: the
    float32 comparison with 0.1 (x == 0.1f is True in torch) and int32 & 0-d int64 (int32)."""

    def forward(self, x):
        t = x.double().abs().amax() * 0 + 0.1
        k = (x.abs().amax() * 0).long() + 3
        return x > t, torch.eq(x, t), torch.bitwise_and((x * 10).int(), k)


@pytest.mark.parametrize("module", [_NarrowIntScalars, _ZeroDimOperands])
def test_torch_scalar_and_zero_dim_promotion(model_backend, tmp_path, module):
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(-5, 6, (1, 4, 6), generator=g).float() / (1 if module is _NarrowIntScalars else 10)
    x3 = torch.randint(-5, 6, (3, 4, 6), generator=g).float() / (1 if module is _NarrowIntScalars else 10)
    param = export_module(module(), (x1,), tmp_path, inputs2=(x3,))
    for x in (x1, x3):
        with torch.no_grad():
            want = module()(x)
        got = kuiper_xp.load(param, backend=model_backend)(x.numpy())
        for k, (a, e) in enumerate(zip(got, want)):
            a = kuiper_xp.to_numpy(a)
            assert a.dtype == t2n(e).dtype, (k, a.dtype, e.dtype)
            np.testing.assert_array_equal(a, t2n(e), err_msg=f"output {k}")


class _InPlaceComparisons(nn.Module):
    """YOLOv8-seg's ``masks.gt_(0.5)``: in place, the result keeps x's float dtype; pnnx writes it
    as ``torch.gt`` with a float32 output (it was refused: 'has dtype bool, the model declares
    float32'); beside a plain comparison (bool)."""

    def forward(self, x):
        return x.sigmoid().gt_(0.5), (x * 2).lt_(0.3).sum(-1), x.gt(0.1)


def test_in_place_comparisons_keep_the_float_dtype(model_backend, tmp_path):
    g = torch.Generator().manual_seed(1)
    x1, x3 = torch.randn(1, 4, 8, generator=g), torch.randn(3, 4, 8, generator=g)
    param = export_module(_InPlaceComparisons(), (x1,), tmp_path, inputs2=(x3,))
    assert "torch.gt_0 1 1 1 2 other=0.5" in " ".join(param.read_text().split())
    got = kuiper_xp.load(param, backend=model_backend)(x3.numpy())
    for k, (a, e) in enumerate(zip(got, _InPlaceComparisons()(x3))):
        a = kuiper_xp.to_numpy(a)
        assert a.dtype == t2n(e).dtype, (k, a.dtype)
        np.testing.assert_array_equal(a, t2n(e), err_msg=f"output {k}")
