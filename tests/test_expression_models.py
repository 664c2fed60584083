"""Models exported by pnnx whose graphs hold only pnnx.Input/Output/Expression operators,
compared with torch end to end through ``kuiper_xp.load``; plus one dynamic reshape fed by a list
expression (skipped while Tensor.reshape is not registered)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pnnx")

from helpers import compare_with_torch, export_torch  # noqa: E402

from kuiper_xp.layers.registry import registry  # noqa: E402
from kuiper_xp.pnnx.param import parse_param  # noqa: E402

EXPRESSION_ONLY = {"pnnx.Input", "pnnx.Output", "pnnx.Expression", "prim::TupleConstruct"}


class FloatExpressions(torch.nn.Module):
    """Elementwise arithmetic on two float32 tensors of shapes (2,3,4,5) and (3,1,5)."""

    def forward(self, x, y):
        return (
            x + y,                                  # residual add, broadcast
            torch.sqrt((2 * x.abs() + y.abs()) / 12),
            x * 0.5 + 1,
            x // 3,
            x % -2,
            torch.floor_divide(x, y),
            -x,
            1 / x,
            1 - x,
            torch.pow(3, x) + x ** 2 - x ** 3,
            torch.atan2(x, y) * torch.maximum(x, y) - torch.minimum(x, y),
            torch.fmod(x, y) + torch.remainder(x, y),
            torch.round(x * 3) + torch.trunc(x) + torch.ceil(x) - torch.floor(x) + torch.sign(x),
            torch.exp(x) - torch.log(x.abs() + 1) * torch.sin(x) / torch.cos(y),
            torch.erf(x) * torch.sinh(y) + torch.rsqrt(x * x + 1) + torch.reciprocal(y + 10),
            torch.square(x) - torch.abs(y) + torch.log10(y * y + 2) * torch.atan(x),
        )


class IntExpressions(torch.nn.Module):
    """Integer arithmetic: int64 tensors of shape (2,3); ``d`` is non-zero."""

    def forward(self, a, d):
        return (
            (a & d) | (a ^ 3),
            a << 2,
            a >> 1,
            a // d,
            a % d,
            a / d,                                  # true division: float32
            a * 2.5,                                # float literal: float32
            torch.fmod(a, d),
            torch.remainder(a, -3),
            a * 3 - d,
            -a + torch.abs(d),
            # pnnx writes these as div(...): integer in, integer declared out, so floor division
            # (a plain torch.div(a, d, rounding_mode="floor") here would be merged with a / d
            # above into one float div by pnnx)
            torch.div(a + 1, d, rounding_mode="floor"),
            torch.div(a * 3, 4, rounding_mode="floor") + d,
        )


class SizeExpressions(torch.nn.Module):
    """Shape arithmetic; exported with a second input set so the sizes stay dynamic."""

    def forward(self, x, y):
        return (
            y / x.size(0),
            y * (x.size(2) // 2),
            y * (x.size(0) ** 0.5),
            y + torch.tensor(x.size(0)).to(torch.float32).sqrt(),
            x * x.size(1) + y,
        )


class DynamicReshape(torch.nn.Module):
    """``x.view(x.size(0), -1, x.size(2))``: pnnx writes the target shape as a list expression."""

    def forward(self, x):
        return x.view(x.size(0), -1, x.size(2)) * 2


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 3


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """Each module exported once per session: name -> (module, example inputs, param path)."""
    out = {}
    root = tmp_path_factory.mktemp("expr-models")
    x, y = _rand(2, 3, 4, 5, seed=1), _rand(3, 1, 5, seed=2)
    m = FloatExpressions()
    out["float"] = (m, (x, y), export_torch(m, (x, y), root / "float"))
    a = torch.randint(-9, 10, (2, 3), generator=torch.Generator().manual_seed(3))
    d = torch.tensor([[2, -3, 1], [-1, 4, 3]])
    m = IntExpressions()
    out["int"] = (m, (a, d), export_torch(m, (a, d), root / "int"))
    x, y = _rand(2, 3, 4, 5, seed=4), _rand(2, 3, 4, 5, seed=5)
    x2, y2 = _rand(3, 3, 6, 5, seed=6), _rand(3, 3, 6, 5, seed=7)
    m = SizeExpressions()
    out["size"] = (m, (x2, y2), export_torch(m, (x, y), root / "size", inputs2=(x2, y2)))
    m = DynamicReshape()
    out["reshape"] = (m, (_rand(4, 3, 7, 5, seed=8),),
                      export_torch(m, (x,), root / "reshape", inputs2=(x2,)))
    return out


def _op_types(param):
    return {op.type for op in parse_param(param).operators}


@pytest.mark.parametrize("name", ["float", "int", "size"])
def test_exported_graph_holds_only_expressions(exports, name):
    _, _, param = exports[name]
    assert _op_types(param) <= EXPRESSION_ONLY, _op_types(param) - EXPRESSION_ONLY


def test_float_expressions_match_torch(exports, model_backend):
    module, inputs, param = exports["float"]
    compare_with_torch(module, inputs, model_backend, param=param, rtol=1e-5)


def test_int_expressions_match_torch(exports, model_backend):
    module, inputs, param = exports["int"]
    compare_with_torch(module, inputs, model_backend, param=param)


def test_size_expressions_follow_the_runtime_shapes(exports, model_backend):
    module, inputs, param = exports["size"]
    ops = parse_param(param).operators
    exprs = [op.params["expr"] for op in ops if op.type == "pnnx.Expression"]
    assert "div(@0,size(@1,0))" in exprs and "add(@0,sqrt(torch.float(size(@1,0))))" in exprs
    # run with another batch and height than the export's first input set
    compare_with_torch(module, inputs, model_backend, param=param)


class FloorDivBySize(torch.nn.Module):
    """CenterNet's decode with H and W dynamic: pnnx writes ``torch.div(index, W,
    rounding_mode="floor")`` as ``div(@0,size(@1,3))``, the float map read only for its size."""

    def forward(self, x):
        _, i = x.flatten(1).topk(5)
        return torch.div(i, x.shape[3], rounding_mode="floor"), i % x.shape[3]


def test_floor_division_by_a_dynamic_size(model_backend, tmp_path):
    m = FloorDivBySize()
    x, x2 = _rand(1, 2, 8, 8, seed=9), _rand(3, 2, 6, 10, seed=10)
    param = export_torch(m, (x,), tmp_path, inputs2=(x2,))
    exprs = [op.params["expr"] for op in parse_param(param).operators if op.type == "pnnx.Expression"]
    assert "div(@0,size(@1,3))" in exprs
    compare_with_torch(m, (x2,), model_backend, param=param)


def test_dynamic_reshape_uses_a_list_expression(exports, model_backend):
    module, inputs, param = exports["reshape"]
    ops = parse_param(param).operators
    shape_op = next(op for op in ops if op.type == "pnnx.Expression" and op.params["expr"].startswith("["))
    assert shape_op.outputs[0].shape is None  # a list has no '#' annotation
    reshape = next(op for op in ops if op.type == "Tensor.reshape")
    assert reshape.input_names == ["input", "shape"]
    if "Tensor.reshape" not in registry:
        pytest.skip("Tensor.reshape is not registered yet")
    compare_with_torch(module, inputs, model_backend, param=param)


def test_malformed_pnnx_expression_is_read_back_from_its_prefix_order(tmp_path):
    """pnnx 20261020 writes torch.expm1/torch.log1p inside a fused expression without their
    brackets (the enclosing ones shifted); every function and operand is still in prefix order,
    and the expression is read back from it: ``erf(x) + expm1(y) + log1p(|x|) + logaddexp(x, y)``.
    A string that no reading fits is still an ExpressionError with the column marked."""
    import numpy as np
    from conftest import assert_close

    import kuiper_xp
    from kuiper_xp.errors import ExpressionError

    text = ("7767517\n4 3\n"
            "pnnx.Input in0 0 1 0 #0=(2,3)f32\n"
            "pnnx.Input in1 0 1 1 #1=(2,3)f32\n"
            "pnnx.Expression e 2 1 0 1 2 expr=add(add(add(erf(@0),expm1),@1),log1p),abs(@0),"
            "logaddexp(@0,@1) #2=(2,3)f32\n"
            "pnnx.Output out 1 0 2\n")
    p = tmp_path / "bad.pnnx.param"
    p.write_text(text)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (got,) = kuiper_xp.load(p, backend="numpy")(x.numpy(), y.numpy())
    want = torch.erf(x) + torch.expm1(y) + torch.log1p(x.abs()) + torch.logaddexp(x, y)
    assert_close(np.asarray(got), want.numpy(), rtol=1e-6)
    p.write_text(text.replace(",logaddexp(@0,@1)", ",@1,@0"))  # operands left over: no reading
    with pytest.raises(ExpressionError, match="expected '\\(' after 'expm1'") as info:
        kuiper_xp.load(p, backend="numpy")
    assert "pnnx.Expression 'e'" in str(info.value)
    assert info.value.pos == 25  # the ")" right after "expm1"


def test_equal_expressions_share_one_compiled_program(model_backend, tmp_path):
    """Expressions of the same text and input count are compiled once per build and shared;
    each still computes on its own inputs (torch gives the expected values), and an error in a
    shared program names the operator it happened in."""
    import numpy as np
    from conftest import assert_close

    import kuiper_xp
    from kuiper_xp.errors import KuiperXPError

    text = ("7767517\n6 5\n"
            "pnnx.Input in0 0 1 0 #0=(2,3)f32\n"
            "pnnx.Input in1 0 1 1 #1=(?,?)f32\n"
            "pnnx.Expression e1 2 1 0 1 2 expr=add(mul(@0,2.5),@1) #2=(?,?)f32\n"
            "pnnx.Expression e2 2 1 2 0 3 expr=add(mul(@0,2.5),@1) #3=(2,3)f32\n"
            "pnnx.Expression e3 1 1 3 4 expr=add(mul(@0,2.5),@0) #4=(2,3)f32\n"
            "pnnx.Output out 1 0 4\n")
    p = tmp_path / "shared.pnnx.param"
    p.write_text(text)
    g = kuiper_xp.load(p, backend=model_backend)
    layers = {r.name: r.layer for r in g.operators if r.type == "pnnx.Expression"}
    assert layers["e1"].program is layers["e2"].program
    assert layers["e3"].program is not layers["e1"].program
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    b = g.backend
    (got,) = g(b.asarray(x.numpy()), b.asarray(y.numpy()))
    e2 = (x * 2.5 + y) * 2.5 + x
    assert_close(b.to_numpy(got), (e2 * 2.5 + e2).numpy(), rtol=1e-6)
    with pytest.raises(KuiperXPError, match="'e1'"):
        g(b.asarray(np.ones((2, 3), np.float32)), b.asarray(np.ones((3, 2), np.float32)))


class ComplexConstants(torch.nn.Module):
    """Python complex constants in arithmetic on complex tensors (rotary embeddings in complex
    form, frequency-domain filters): pnnx writes them as ``1.000000e+00+2.000000e+00j``."""

    def forward(self, x):
        z = torch.view_as_complex(x)
        return torch.view_as_real(z * (1 + 2j) + 1j - (0.5 - 1.5j) * z.conj())


def test_complex_constants_match_torch(model_backend, tmp_path):
    x, x2 = _rand(2, 3, 4, 2, seed=11), _rand(3, 3, 4, 2, seed=12)
    param = export_torch(ComplexConstants(), (x,), tmp_path, inputs2=(x2,))
    exprs = [op.params["expr"] for op in parse_param(param).operators if op.type == "pnnx.Expression"]
    assert any("e+00j" in e for e in exprs), f"pnnx no longer writes complex literals this way: {exprs}"
    compare_with_torch(ComplexConstants(), (x2,), model_backend, param=param)
