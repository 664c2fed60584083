"""The numpy backend's fused expressions (backends/numpy_fast.fuse_expression): a tree of
elementwise float functions run chunk by chunk with chunk-sized scratch, small sub-trees computed
once, whole. The same ufuncs on the same values in the same order as the evaluator, so the
results are compared with it bit for bit, and with torch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import assert_close
from helpers import in_fast_scope, make_layer, special_inputs
from kuiper_xp.backends import get_backend
from kuiper_xp.backends import numpy_fast as nf

from kuiper_xp.expression import Program

# (expression, torch function of the inputs); all fused on numpy
FUSED = [
    ("add(@0,mul(@1,@2))", lambda a, b, c: a + b * c),  # the seeds' example
    ("div(sub(@0,@1),add(abs(@2),0.5))", lambda a, b, c: (a - b) / (c.abs() + 0.5)),
    ("mul(@0,div(1,add(1,exp(neg(@0)))))", lambda a: a * (1 / (1 + torch.exp(-a)))),
    ("max(@0,min(@1,3.5))", lambda a, b: torch.maximum(a, torch.minimum(b, torch.tensor(3.5, dtype=b.dtype)))),
    ("sqrt(add(square(@0),1e-05))", lambda a: torch.sqrt(a * a + 1e-05)),
    ("rsqrt(add(abs(@0),1))", lambda a: torch.rsqrt(a.abs() + 1)),
    ("reciprocal(@0)", torch.reciprocal),
    ("add(@0,@1,2)", lambda a, b: a + 2 * b),
    ("sub(@0,@1,0.5)", lambda a, b: a - 0.5 * b),
    ("mul(tanh(@0),exp(neg(abs(@1))))", lambda a, b: torch.tanh(a) * torch.exp(-b.abs())),
    ("sub(1.0,mul(sin(@0),cos(@1)))", lambda a, b: 1.0 - torch.sin(a) * torch.cos(b)),
    ("mul(@0,0.5)", lambda a: a * 0.5),
    # powers torch computes by multiplication, sqrt and division (GPT-2's tanh GELU: x ** 3.0),
    # of inputs and of step results (a value read by two steps of the same power)
    ("mul(add(@0,mul(pow(@1,3.0),0.044715)),0.797884583)", lambda a, b: (a + b ** 3.0 * 0.044715) * 0.797884583),
    ("add(pow(add(@0,1.5),3),mul(pow(sub(@1,@0),2),pow(abs(@0),0.5)))",
     lambda a, b: (a + 1.5) ** 3 + (b - a) ** 2 * a.abs() ** 0.5),
    ("mul(pow(add(abs(@0),1),-0.5),pow(add(abs(@1),1),-2.0))", lambda a, b: (a.abs() + 1) ** -0.5 * (b.abs() + 1) ** -2.0),
    ("div(@0,pow(add(abs(@1),0.5),-1))", lambda a, b: a / (b.abs() + 0.5) ** -1),
    # ConvNeXt-V2's GRN: the per-channel factor is a small sub-tree, computed once
    ("add(add(mul(@0,mul(@1,div(@2,add(@3,1.000000e-6)))),@4),@1)",
     lambda g, x, gx, m, b: g * (x * (gx / (m + 1e-6))) + b + x),
]
# the inputs' shapes, cycled: full, per-channel, full, per-sample, per-channel
SHAPES = [(3, 37, 41, 29), (1, 37, 1, 1), (3, 37, 41, 29), (3, 1, 1, 1), (1, 37, 1, 1)]


def _n_inputs(expr):
    return 1 + max(int(t[0]) for t in expr.split("@")[1:])


def _inputs(n, dtype, seed=0, shapes=SHAPES):
    out = special_inputs(n, shapes, dtype, seed)
    if n > 2:  # one input in another memory layout (same values)
        out[2] = np.asfortranarray(out[2])
    return out


@pytest.fixture(params=[None, 1000, 1 << 30], ids=["default-chunks", "small-chunks", "one-chunk"])
def chunk(request, monkeypatch):
    if request.param is not None:
        monkeypatch.setattr(nf, "FUSE_CHUNK", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("expr,fn", FUSED, ids=[e for e, _ in FUSED])
def test_fused_expression_is_the_evaluator_bit_for_bit(expr, fn, dtype, chunk):
    n = _n_inputs(expr)
    layer = make_layer(get_backend("numpy"), "pnnx.Expression", f"expr={expr}", n_in=n)
    assert layer._fused is not None, f"{expr} was not fused"
    host = _inputs(n, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's warnings on inf - inf and the like
        fused = layer._fused(host)
        generic = Program(expr, np, None, None, n_inputs=n).run(host)
    assert fused is not None, "the fused path declined"
    assert fused.dtype == generic.dtype and fused.shape == generic.shape
    np.testing.assert_array_equal(fused, generic, err_msg=expr)
    np.testing.assert_array_equal(np.asarray(layer(*host)), generic, err_msg=expr)
    with torch.no_grad():
        want = fn(*[torch.from_numpy(np.ascontiguousarray(h)) for h in host]).numpy()
    tol = 4e-6 if dtype == np.float32 else 1e-12
    assert_close(fused, want, rtol=tol, atol=tol, what=f"{expr} vs torch")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_sub_trees_are_computed_once(dtype, chunk, monkeypatch):
    """GRN with its real shapes: gx (N, 1, 1, C) and its mean (N, 1, 1, 1) make a per-sample,
    per-channel factor that is computed whole before the chunks (the ufuncs' calls counted)."""
    expr, fn = FUSED[-1]
    shapes = [(1, 1, 1, 40), (3, 21, 23, 40), (3, 1, 1, 40), (3, 1, 1, 1), (1, 1, 1, 40)]
    host = _inputs(5, dtype, shapes=shapes)
    layer = make_layer(get_backend("numpy"), "pnnx.Expression", f"expr={expr}", n_in=5)
    sizes = []
    steps = layer._fused.steps
    for j, (ufunc, args) in enumerate(steps):
        def spy(*a, _u=ufunc, **kw):
            out = _u(*a, **kw)
            sizes.append(out.size)
            return out
        steps[j] = (spy, args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's warnings on inf * 0 in the evaluator
        got = layer._fused(host)
        np.testing.assert_array_equal(got, Program(expr, np, None, None, n_inputs=5).run(host))
    assert sizes[:2] == [3, 120], sizes  # add(@3, eps) and the div: once, at their own size
    assert all(s > 120 for s in sizes[2:]), sizes
    with torch.no_grad():
        want = fn(*[torch.from_numpy(np.ascontiguousarray(h)) for h in host]).numpy()
    assert_close(got, want, rtol=4e-6, atol=4e-6, what="GRN vs torch")


def test_fused_expression_declines_what_it_does_not_cover():
    layer = make_layer(get_backend("numpy"), "pnnx.Expression", "expr=add(@0,mul(@1,2))", n_in=2)
    big = np.ones((64, 1024), np.float32)
    assert layer._fused(_inputs(2, np.float32)[:2]) is not None
    assert layer._fused([big.astype(np.int64), big.astype(np.int64)]) is None  # integers: torch's rules
    assert layer._fused([big, big.astype(np.float64)]) is None  # mixed dtypes: torch's promotion
    assert layer._fused([big[:2, :4], big[:2, :4]]) is None  # small: the evaluator's whole-array calls
    assert layer._fused([big, np.ones((3,), np.float32)]) is None  # no broadcast: the evaluator's error
    out = layer(big.astype(np.int64), big.astype(np.int64))
    assert out.dtype == np.int64 and int(out[0, 0]) == 3
    with pytest.raises(Exception, match="add|mul|broadcast|shape"):
        layer(big, np.ones((3,), np.float32))


def test_not_fused_outside_the_table_or_a_plain_residual_add():
    for expr in ("fmod(@0,2.0)", "floor_divide(@0,@1)", "size(@0,1)", "add(@0,@1)", "pow(@0,2.5)", "pow(@0,@1)",
                 "erf(@0)", "mul(tanh(@0),log(abs(@1)))"):  # (log: float32 through float64 on the evaluator)
        layer = make_layer(get_backend("numpy"), "pnnx.Expression", f"expr={expr}", n_in=2 if "@1" in expr else 1)
        assert layer._fused is None, expr


@pytest.mark.parametrize("shape,fused", [
    ("(1,8)", False), ("(?,64)", False),  # declared small: the evaluator alone, no per-call check
    ("(?,197,768)", True), ("(?,32,?,?)", True), ("(64,1024)", True),  # big, or sizes unknown
])
def test_declared_small_outputs_skip_the_fused_path(shape, fused):
    layer = make_layer(get_backend("numpy"), "pnnx.Expression", "expr=mul(add(@0,1.5),2.0)",
                       annotations=f"#i0={shape}f32 #o0={shape}f32")
    assert (layer._fused is not None) == fused, shape


# -- a residual add (sub, mul) taking over the activation after it --------------------------------
_ACTS = {
    "relu": torch.relu,
    "relu6": torch.nn.functional.relu6,
    "sigmoid": torch.sigmoid,
    "gelu": torch.nn.functional.gelu,
    "leaky": lambda t: torch.nn.functional.leaky_relu(t, 0.1),
    "softmax": lambda t: torch.softmax(t, dim=1),  # (not elementwise: called on the whole sum)
}


class _OpAct(torch.nn.Module):
    def __init__(self, op, act):
        super().__init__()
        self.op, self.act = op, act

    def forward(self, a, b):
        y = a + b if self.op == "add" else a - b if self.op == "sub" else a * b
        return _ACTS[self.act](y)


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
@pytest.mark.parametrize("act", sorted(_ACTS))
@pytest.mark.parametrize("second", [(3, 37, 41, 29), (1, 37, 1, 1)], ids=["same-shape", "broadcast"])
@pytest.mark.parametrize("chunk", [None, 1000], ids=["default-chunk", "small-chunks"])
def test_binary_expression_takes_the_activation_after_it(tmp_path, monkeypatch, op, act, second, chunk):
    """``act(a op b)`` exported by pnnx: the activation's step is folded into the expression (one
    step), and the result is the unfused graph's bit for bit and torch's: each chunk of the sum
    activated while in cache on the fast path (several chunks per thread with ``chunk``), the
    whole sum on the evaluator's path (a broadcast operand). NaN, infinities and signed zeros
    among the values."""
    from helpers import export_torch

    import kuiper_xp

    if chunk is not None:
        monkeypatch.setattr(nf, "BINARY_ACTIVATION_CHUNK", chunk)
    a, b = special_inputs(2, [(3, 37, 41, 29), second], np.float32, seed=3)
    m = _OpAct(op, act).eval()
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    param = export_torch(m, (ta, tb), tmp_path)
    fused = kuiper_xp.load(param, backend="numpy")
    plain = kuiper_xp.load(param, backend="numpy", fuse=False)
    assert len(fused.execution_order) == 1 and len(plain.execution_order) == 2, fused.fused
    with torch.no_grad():
        want = m(ta, tb).numpy()
    got = in_fast_scope(nf, lambda: np.array(fused(a, b)[0]))
    ref = in_fast_scope(nf, lambda: np.array(plain(a, b)[0]))
    np.testing.assert_array_equal(got, ref)
    assert_close(got, want, rtol=1e-5, what=f"{act}({op})")


@pytest.mark.parametrize("op", ["add", "sub"])
def test_binary_expression_activation_of_integers_as_torch(tmp_path, op):
    """The sum of int64 tensors is not on the fast path: the activation's own layer runs on it,
    as unfused (ReLU and ReLU6 keep the integers, sigmoid makes float32, as torch does; ReLU6's
    float bounds on an int64 sum raised a casting error once)."""
    from helpers import export_torch

    import kuiper_xp

    a = np.arange(-12, 12, dtype=np.int64).reshape(4, 6)
    b = np.arange(24, dtype=np.int64).reshape(4, 6)[::-1].copy() - 9
    for act in ("relu", "relu6", "sigmoid"):
        m = _OpAct(op, act).eval()
        g = kuiper_xp.load(export_torch(m, (torch.from_numpy(a), torch.from_numpy(b)), tmp_path / act),
                           backend="numpy")
        assert g.fused, act
        assert len(g.execution_order) == 1, g.fused
        with torch.no_grad():
            want = m(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        got = np.asarray(g(a, b)[0])
        assert got.dtype == want.dtype, act
        assert_close(got, want, rtol=1e-6, what=act)


def test_only_a_binary_op_of_two_inputs_takes_an_activation():
    backend = get_backend("numpy")
    layer = make_layer(backend, "pnnx.Expression", "expr=add(@0,@1)", n_in=2)
    layer.set_fused_activation("relu")
    for expr, n in (("add(@0,2.0)", 1), ("add(@0,mul(@1,2.0))", 2), ("size(@0,1)", 1)):
        with pytest.raises(ValueError):
            make_layer(backend, "pnnx.Expression", f"expr={expr}", n_in=n).set_fused_activation("relu")


def test_activated_sum_written_into_a_concatenation_and_returned(tmp_path):
    """A fused add + ReLU whose result is a piece of a concatenation (written into its slot, the
    YOLO C3 layout) and a fused sub + SiLU returned as a graph output: torch's values, from the
    first call and again from the second (the slots are laid out then)."""
    from helpers import export_torch

    import kuiper_xp

    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.cat([torch.relu(a + b), a * 2.0], 1), torch.nn.functional.silu(a - b)

    a, b = special_inputs(2, [(2, 8, 33, 31)], np.float32, seed=5)
    m = M().eval()
    g = kuiper_xp.load(export_torch(m, (torch.from_numpy(a), torch.from_numpy(b)), tmp_path), backend="numpy")
    assert sum(1 for p, _ in g.fused if p.startswith("pnnx_expr")) == 2, g.fused
    with torch.no_grad():
        want = [t.numpy() for t in m(torch.from_numpy(a), torch.from_numpy(b))]
    for _ in range(2):
        got = in_fast_scope(nf, lambda: [np.array(v) for v in g(a, b)])
        for k in range(2):
            assert_close(got[k], want[k], rtol=1e-5, what=f"output {k}")
