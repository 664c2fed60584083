"""The pnnx.Expression language: tokenizer, parser, reverse Polish, evaluator, and every function
against torch on every backend leg. Expected values come from torch or from the seeds."""

from __future__ import annotations

import math
import operator
import time

import numpy as np
import pytest
import torch
from conftest import assert_close

import kuiper_xp
from kuiper_xp.errors import ExpressionError
from kuiper_xp.expression import (
    BINARY,
    UNARY,
    Program,
    TokenKind,
    erf,
    erf_generic,
    evaluate,
    evaluate_rpn,
    format_rpn,
    parse,
    to_rpn,
    tokenize,
    tree_str,
)
from kuiper_xp.layers.registry import registry

# -------------------------------------------------------------------------------------------------
# tokenizer (seed 000 section 2)


def test_tokens_and_positions_of_the_seed_example():
    toks = tokenize("add(@0,mul(@1,@2))")
    assert [(t.kind, t.text, t.start, t.end) for t in toks] == [
        (TokenKind.NAME, "add", 0, 3),
        (TokenKind.LPAREN, "(", 3, 4),
        (TokenKind.INPUT, "@0", 4, 6),
        (TokenKind.COMMA, ",", 6, 7),
        (TokenKind.NAME, "mul", 7, 10),
        (TokenKind.LPAREN, "(", 10, 11),
        (TokenKind.INPUT, "@1", 11, 13),
        (TokenKind.COMMA, ",", 13, 14),
        (TokenKind.INPUT, "@2", 14, 16),
        (TokenKind.RPAREN, ")", 16, 17),
        (TokenKind.RPAREN, ")", 17, 18),
    ]


def test_complex_literals_as_pnnx_writes_them():
    """pnnx writes a Python complex constant as ``<real>+<imag>j`` with both parts in %e form."""
    toks = tokenize("mul(@0,1.000000e+00+2.000000e+00j)")
    assert [(t.kind, t.text, t.start, t.end) for t in toks][4] == (
        TokenKind.COMPLEX, "1.000000e+00+2.000000e+00j", 7, 33)
    toks = tokenize("add(-1.5e+00-2.000000e-01j,@1)")
    assert toks[2].kind is TokenKind.COMPLEX and toks[2].text == "-1.5e+00-2.000000e-01j"
    with pytest.raises(ExpressionError, match="unexpected character '\\+'"):  # (not a literal: runs into a letter)
        tokenize("mul(@0,1.0+2.0jx)")
    x = np.array([1 + 1j, -2 + 0.5j], np.complex64)
    got = evaluate("mul(@0,1.000000e+00-2.000000e+00j)", [x], xp=np)
    assert got.dtype == np.complex64
    np.testing.assert_array_equal(got, (torch.from_numpy(x) * (1 - 2j)).numpy())
    r = np.array([0.5, -3.0], np.float64)  # a float64 tensor with a complex scalar: complex128, as torch
    got = evaluate("add(@0,0.000000e+00+1.000000e+00j)", [r], xp=np)
    want = (torch.from_numpy(r) + 1j).numpy()
    assert got.dtype == want.dtype == np.complex128
    np.testing.assert_array_equal(got, want)


def test_whitespace_is_skipped_and_positions_index_the_original_text():
    text = "add(@0, mul(@1, @2))"
    toks = tokenize(text)
    assert [t.text for t in toks] == ["add", "(", "@0", ",", "mul", "(", "@1", ",", "@2", ")", ")"]
    for t in toks:
        assert text[t.start:t.end] == t.text
    assert toks[4].start == 8  # 'mul' after ", "


def test_multi_digit_inputs_and_literals():
    toks = tokenize("pow(@31231,-12)")
    assert (toks[2].kind, toks[2].text, toks[2].start, toks[2].end) == (TokenKind.INPUT, "@31231", 4, 10)
    assert (toks[4].kind, toks[4].text) == (TokenKind.INT, "-12")
    kinds = [t.kind for t in tokenize("[5.000000e+00,1e-05,2.0,-0.5,True,False,None,inf,-inf,nan,7]")]
    assert kinds == [TokenKind.LBRACKET, TokenKind.FLOAT, TokenKind.COMMA, TokenKind.FLOAT, TokenKind.COMMA,
                     TokenKind.FLOAT, TokenKind.COMMA, TokenKind.FLOAT, TokenKind.COMMA, TokenKind.BOOL,
                     TokenKind.COMMA, TokenKind.BOOL, TokenKind.COMMA, TokenKind.NONE, TokenKind.COMMA,
                     TokenKind.FLOAT, TokenKind.COMMA, TokenKind.FLOAT, TokenKind.COMMA, TokenKind.FLOAT,
                     TokenKind.COMMA, TokenKind.INT, TokenKind.RBRACKET]
    assert [t.text for t in tokenize("torch.float(size(@1,2))")][:3] == ["torch.float", "(", "size"]


# -------------------------------------------------------------------------------------------------
# parser and reverse Polish (seed 000 sections 3.2, 3.3)


def test_tree_shape_of_the_seed_example():
    root = parse("add(mul(@0,@1),@2)")
    assert (root.kind, root.value, len(root.args)) == ("call", "add", 2)
    mul, at2 = root.args
    assert (mul.kind, mul.value, [a.value for a in mul.args]) == ("call", "mul", [0, 1])
    assert (at2.kind, at2.value) == ("input", 2)
    assert (root.start, mul.start, at2.start) == (0, 4, 15)


@pytest.mark.parametrize("text, rpn", [
    ("add(@0,@1)", "@0 @1 add"),
    ("add(mul(@0,@1),@2)", "@0 @1 mul @2 add"),
    ("mul(@2,add(@0,@1))", "@2 @0 @1 add mul"),
    ("add(add(mul(@0,@1),mul(@2,add(add(add(@0,@2),@3),@4))),@5)",
     "@0 @1 mul @2 @0 @2 add @3 add @4 add mul add @5 add"),
    ("sqrt(div(add(mul(@0,2),@1),12))", "@0 2 mul @1 add 12 div sqrt"),
    ("pow(3,@5)", "3 @5 pow"),
    ("[int(size(@0,0)),-1,int(size(@0,2))]", "@0 0 size int -1 @0 2 size int [3]"),
    ("add(@0,@1,2)", "@0 @1 2 add"),
])
def test_reverse_polish(text, rpn):
    root = parse(text)
    assert format_rpn(to_rpn(root)) == rpn
    assert tree_str(root) == text


def test_literals_parse_to_python_values():
    root = parse("[5.000000e+00,-3,True,None,1e-05,-inf]")
    assert root.kind == "list"
    assert [a.value for a in root.args][:5] == [5.0, -3, True, None, 1e-05]
    assert root.args[5].value == -math.inf
    assert type(root.args[0].value) is float and type(root.args[1].value) is int


def test_nan_and_inf_as_pnnx_writes_them():
    # x * float("nan") exports as mul(@0,nan.0)
    root = parse("[nan.0,-inf.0,inf.0]")
    assert math.isnan(root.args[0].value) and root.args[1].value == -math.inf and root.args[2].value == math.inf


# -------------------------------------------------------------------------------------------------
# errors: an ExpressionError whose message shows the expression and a caret under the column


def _caret_column(exc: ExpressionError, text: str) -> int:
    lines = str(exc).split("\n")
    k = next(i for i, line in enumerate(lines) if line == "  " + text)
    caret = lines[k + 1]
    assert caret.strip() == "^", str(exc)
    return len(caret) - 3


@pytest.mark.parametrize("text, column, words", [
    ("foo(@0)", 0, "unknown function 'foo'"),
    ("add(@0,sqr(@1))", 7, "unknown function 'sqr'"),
    ("add(@0)", 0, "add() takes 2 to 3 arguments, got 1"),
    ("neg(@0,@1)", 0, "neg() takes 1 argument, got 2"),
    ("size(@0)", 0, "size() takes 2 arguments, got 1"),
    ("add(@0,@1", 3, "unbalanced brackets"),
    ("mul(add(@0,@1),@2", 3, "')' missing"),
    ("[size(@0,0),-1", 0, "']' missing"),
    ("add(@0,@1))", 10, "unexpected ')' after the end"),
    ("add(@0,@1) @2", 11, "unexpected '@2' after the end"),
    ("add(@0,@1)x", 10, "after the end"),
    ("add@0", 3, "expected '(' after 'add'"),
    ("add(,@1)", 4, "expected an operand"),
    ("add(@0,@1,)", 10, "expected an operand"),
    ("add(@0;@1)", 6, "unexpected character ';'"),
    ("add(@,@1)", 4, "'@' must be followed by an input number"),
    ("add(@0,1.2.3)", 10, "malformed number"),
    ("(@0)", 0, "a bracket must follow a function name"),
    ("   ", 0, "empty expression"),
])
def test_bad_expressions_raise_with_a_caret(text, column, words):
    with pytest.raises(ExpressionError) as info:
        parse(text)
    assert words in str(info.value)
    assert info.value.pos == column
    assert _caret_column(info.value, text) == column


def test_empty_string_raises():
    with pytest.raises(ExpressionError, match="empty expression"):
        parse("")


def test_input_beyond_the_operator_inputs_raises(xp):
    with pytest.raises(ExpressionError, match=r"@3 refers to input 3, but the operator has 2 inputs") as info:
        Program("add(@0,mul(@1,@3))", xp, n_inputs=2)
    assert _caret_column(info.value, "add(@0,mul(@1,@3))") == 14


def test_deep_nesting_parses_and_evaluates_without_recursion():
    from kuiper_xp.backends import get_backend

    backend = get_backend("numpy")  # one leg: this checks the parser and the stack machine
    depth = 100_000
    text = "neg(" * depth + "@0" + ")" * depth
    prog = Program(text, backend.xp, backend.device, n_inputs=1)
    assert prog.mode == "stack"
    x = np.array([1.5, -2.0], dtype=np.float32)
    assert_close(prog(backend.asarray(x)), x, what="neg^100000")


@pytest.mark.parametrize("text", [
    "neg(" * 100_000 + "@0",                       # brackets never closed
    "neg(" * 100_000 + "@0" + ")" * 100_001,        # one ')' too many
], ids=["unclosed", "one-too-many"])
def test_deep_nesting_errors_are_expression_errors(text):
    t0 = time.perf_counter()
    with pytest.raises(ExpressionError) as info:
        parse(text)
    assert "column" in str(info.value)  # a long expression is shown around the column
    assert time.perf_counter() - t0 < 60  # not a timing assertion: a hang guard


def test_eval_is_never_used():
    with pytest.raises(ExpressionError):
        parse("__import__('os').system('true')")


# -------------------------------------------------------------------------------------------------
# every function against torch


_RNG = np.random.default_rng(1234)


def _float_data(shape, scale=3.0):
    a = (_RNG.standard_normal(shape) * scale).astype(np.float32)
    flat = a.reshape(-1)
    flat[::7] = 0.0                    # zeros
    flat[3::11] = 2.5                  # ties for round
    flat[5::13] = -0.5
    flat[6::17] = np.float32(-4.0)     # negative integers
    return a


def _int_data(shape, lo=-9, hi=10, nonzero=False):
    a = _RNG.integers(lo, hi, shape).astype(np.int64)
    if nonzero:
        a[a == 0] = 3
    return a


def _torch(v):
    return torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v


_TORCH_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "floor_divide": operator.floordiv, "remainder": operator.mod, "pow": operator.pow,
    "atan2": torch.atan2, "max": torch.max, "maximum": torch.maximum, "min": torch.min,
    "minimum": torch.minimum, "fmod": torch.fmod, "logaddexp": torch.logaddexp,
    "and": operator.and_, "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift,
    "rshift": operator.rshift,
}
# these torch functions take a tensor where the language has a scalar
_TENSOR_ONLY = {"atan2", "max", "maximum", "min", "minimum", "fmod", "logaddexp"}


def torch_binary(name, a, b):
    f = _TORCH_BINARY[name]
    ta, tb = _torch(a), _torch(b)
    if name in _TENSOR_ONLY:
        ta = torch.tensor(ta) if not isinstance(ta, torch.Tensor) else ta
        tb = torch.tensor(tb) if not isinstance(tb, torch.Tensor) else tb
    return f(ta, tb).numpy()


def _literal(v):
    return repr(v) if not isinstance(v, np.ndarray) else None


def _run(backend, text, values, rtol=1e-5):
    """Evaluate ``text`` whose @N are the arrays among ``values`` (literals are inlined)."""
    arrays = [backend.asarray(v) for v in values if isinstance(v, np.ndarray)]
    return Program(text, backend.xp, backend.device, backend.fast, n_inputs=len(arrays)).run(arrays)


def _binary_text(name, a, b):
    k = 0
    parts = []
    for v in (a, b):
        if isinstance(v, np.ndarray):
            parts.append(f"@{k}")
            k += 1
        else:
            parts.append(repr(v))
    return f"{name}({parts[0]},{parts[1]})"


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_unary_matches_torch(backend, name, dtype):
    x = _float_data((2, 3, 4)) if dtype == "float32" else _int_data((2, 3, 4))
    expected = getattr(torch, name)(_torch(x)).numpy()
    got = _run(backend, f"{name}(@0)", [x])
    assert_close(got, expected, rtol=1e-5, what=f"{name}({dtype})")


@pytest.mark.parametrize("name", ["sqrt", "exp", "square", "sign", "erf", "reciprocal"])
def test_unary_on_bool_and_int32_matches_torch(backend, name):
    for x in (np.array([[True, False, True]]), np.array([[3, -2, 0]], dtype=np.int32)):
        expected = getattr(torch, name)(_torch(x)).numpy()
        assert_close(_run(backend, f"{name}(@0)", [x]), expected, what=f"{name}({x.dtype})")


_FLOAT_BINARY = [n for n in BINARY if n not in ("and", "or", "xor", "lshift", "rshift")]
_INT_BINARY = [n for n in BINARY if n != "logaddexp"]


@pytest.mark.parametrize("name", _FLOAT_BINARY)
def test_binary_float_with_broadcasting_matches_torch(backend, name):
    a = _float_data((2, 3, 4))
    b = _float_data((3, 1)) + np.float32(0.25)  # other shape, broadcast; some zeros stay out
    if name == "pow":
        a = np.abs(a)  # avoid nan from negative bases to fractional powers (tested below)
    assert_close(_run(backend, _binary_text(name, a, b), [a, b]), torch_binary(name, a, b), rtol=1e-5, what=name)


@pytest.mark.parametrize("name", _INT_BINARY)
def test_binary_int_matches_torch(backend, name):
    a = _int_data((2, 3, 4))
    b = _int_data((3, 4), nonzero=True)
    if name in ("pow", "lshift", "rshift"):
        b = _int_data((3, 4), 0, 5)
    assert_close(_run(backend, _binary_text(name, a, b), [a, b]), torch_binary(name, a, b), what=name)


@pytest.mark.parametrize("name", _FLOAT_BINARY)
def test_binary_mixed_int_and_float_tensors_matches_torch(backend, name):
    a = _int_data((2, 3), nonzero=True)
    b = _float_data((2, 3)) + np.float32(0.25)
    if name == "pow":
        b = np.abs(b)
    for x, y in ((a, b), (b, a)):
        assert_close(_run(backend, _binary_text(name, x, y), [x, y]), torch_binary(name, x, y),
                     rtol=1e-5, what=f"{name}({x.dtype},{y.dtype})")


@pytest.mark.parametrize("name", ["add", "mul", "div", "max", "min", "and", "or", "xor"])
def test_binary_bool_matches_torch(backend, name):
    a = np.array([[True, False, True, False]])
    b = np.array([[True], [False]])
    assert_close(_run(backend, _binary_text(name, a, b), [a, b]), torch_binary(name, a, b), what=name)


_SCALAR_CASES = [
    # (name, scalar, scalar first?)
    ("add", 3, False), ("add", 2.5, False), ("sub", 1, True), ("sub", 5.000000e+00, False),
    ("mul", 3, False), ("mul", -2.5, False), ("div", 12, False), ("div", 1, True), ("div", 0.5, False),
    ("floor_divide", 3, False), ("floor_divide", -2, False), ("floor_divide", 7, True),
    ("remainder", -2, False), ("remainder", 3, False), ("remainder", 2.5, False), ("remainder", 5, True),
    ("pow", 2, False), ("pow", 3, False), ("pow", 0.5, False), ("pow", 3, True), ("pow", 2.5, True),
    ("pow", -2, False), ("atan2", 1.0, False), ("max", 0, False), ("min", 1.5, False),
    ("maximum", -1, True), ("minimum", 2, True), ("fmod", -3, False), ("fmod", 1.5, False),
    ("logaddexp", 0.0, False),
]


@pytest.mark.parametrize("name, scalar, first", _SCALAR_CASES)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_binary_with_a_literal_matches_torch(backend, name, scalar, first, dtype):
    x = _float_data((3, 4)) if dtype == "float32" else _int_data((3, 4), nonzero=True)
    if name == "pow" and not first:
        x = np.abs(x) + (1 if dtype == "int64" else 0)
    if name == "pow" and first and dtype == "float32":
        x = np.clip(x, -3, 3)
    if dtype == "int64" and name == "pow" and isinstance(scalar, int) and scalar < 0 and not first:
        with pytest.raises(ExpressionError, match="negative integer powers"):
            _run(backend, _binary_text(name, x, scalar), [x, scalar])
        with pytest.raises(RuntimeError, match="negative integer powers"):
            torch_binary(name, x, scalar)
        return
    if dtype == "int64" and name in ("logaddexp",):
        pytest.skip("torch.logaddexp has no integer kernel")
    args = (scalar, x) if first else (x, scalar)
    if dtype == "int64" and name == "fmod" and first:
        pytest.skip("torch.fmod takes no scalar first argument")
    assert_close(_run(backend, _binary_text(name, *args), list(args)), torch_binary(name, *args),
                 rtol=1e-5, what=_binary_text(name, *args))


@pytest.mark.parametrize("name, scalar", [("and", 3), ("or", 5), ("xor", -1), ("lshift", 2), ("rshift", 1),
                                          ("and", True)])
def test_bitwise_with_a_literal_matches_torch(backend, name, scalar):
    x = _int_data((3, 4))
    assert_close(_run(backend, f"{name}(@0,{scalar!r})", [x]), torch_binary(name, x, scalar), what=name)


def test_int_literal_does_not_promote_float32_and_float_literal_gives_float32(backend):
    f = _float_data((2, 3))
    i = _int_data((2, 3))
    assert_close(_run(backend, "mul(@0,3)", [f]), (_torch(f) * 3).numpy())
    assert_close(_run(backend, "mul(@0,3.0)", [i]), (_torch(i) * 3.0).numpy())
    assert_close(_run(backend, "div(@0,@1)", [i, i + 20]), (_torch(i) / _torch(i + 20)).numpy())
    i32 = i.astype(np.int32)
    assert_close(_run(backend, "add(@0,@1)", [i32, i]), (_torch(i32) + _torch(i)).numpy())
    assert_close(_run(backend, "add(@0,@1)", [f.astype(np.float64), f]),
                 (_torch(f.astype(np.float64)) + _torch(f)).numpy())
    if not hasattr(backend.xp, "float16"):
        return  # array_api_strict has no float16
    f16 = f.astype(np.float16)
    assert_close(_run(backend, "mul(@0,2.5)", [f16]), (_torch(f16) * 2.5).numpy(), rtol=1e-3)


def test_pow_of_negative_base_to_fractional_power_is_nan_like_torch(backend):
    x = np.array([-2.0, 2.0, 0.0], dtype=np.float32)
    assert_close(_run(backend, "pow(@0,0.5)", [x]), torch.pow(_torch(x), 0.5).numpy())
    assert_close(_run(backend, "pow(@0,-1)", [x]), torch.pow(_torch(x), -1).numpy())


def test_division_by_zero_in_floats_matches_torch(backend):
    a = np.array([5.0, -5.0, 0.0, 1.0, -0.0], dtype=np.float32)
    b = np.array([0.0, 0.0, 0.0, -0.0, 3.0], dtype=np.float32)
    for name in ("div", "floor_divide", "remainder", "fmod"):
        assert_close(_run(backend, f"{name}(@0,@1)", [a, b]), torch_binary(name, a, b), what=name)


def test_round_is_half_to_even(backend):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4999], dtype=np.float32)
    assert_close(_run(backend, "round(@0)", [x]), torch.round(_torch(x)).numpy())


def test_sign_of_nan_is_zero_like_torch(backend):
    x = np.array([np.nan, -0.0, 3.0, -2.0], dtype=np.float32)
    assert_close(_run(backend, "sign(@0)", [x]), torch.sign(_torch(x)).numpy())


def test_integer_division_by_a_zero_literal_raises(backend):
    x = _int_data((2, 2))
    for name in ("floor_divide", "remainder", "fmod"):
        with pytest.raises(ExpressionError, match="division by zero"):
            _run(backend, f"{name}(@0,0)", [x])


# -------------------------------------------------------------------------------------------------
# the seeds' worked examples


def test_seed_examples(backend):
    a, b, c, d, e, f = (_float_data((4, 3, 5)) for _ in range(6))
    ta, tb, tc, td, te, tf = (_torch(v) for v in (a, b, c, d, e, f))
    assert_close(_run(backend, "add(@0,@1)", [a, b]), (ta + tb).numpy())
    assert_close(_run(backend, "mul(add(@0,@1),@2)", [a, b, c]), ((ta + tb) * tc).numpy())
    assert_close(_run(backend, "add(mul(@0,@1),@2)", [a, b, c]), (ta * tb + tc).numpy())
    assert_close(_run(backend, "mul(@2, add(@0, @1))", [a, b, c]), (tc * (ta + tb)).numpy())
    six = "add(add(mul(@0,@1),mul(@2,add(add(add(@0,@2),@3),@4))),@5)"
    assert_close(_run(backend, six, [a, b, c, d, e, f]), (ta * tb + tc * (ta + tc + td + te) + tf).numpy())
    # the seed's first article writes the residual/sqrt example with a three-argument add
    x, y = np.abs(a), np.abs(b)
    assert_close(_run(backend, "sqrt(div(add(mul(@0,2),@1,1),12))", [x, y]),
                 torch.sqrt((2 * _torch(x) + _torch(y)) / 12).numpy())
    assert_close(_run(backend, "sub(@0,@1,2.5)", [a, b]), torch.sub(ta, tb, alpha=2.5).numpy())


def test_stack_machine_and_closures_agree(backend):
    text = "add(add(mul(@0,@1),mul(@2,add(add(add(@0,@2),@3),@4))),@5)"
    vals = [backend.asarray(_float_data((2, 3))) for _ in range(6)]
    prog = Program(text, backend.xp, backend.device, n_inputs=6)
    assert prog.mode == "closure"
    by_stack = evaluate_rpn(to_rpn(parse(text)), vals, backend.xp, backend.device)
    assert_close(prog.run(vals), backend.to_numpy(by_stack), rtol=0)


# -------------------------------------------------------------------------------------------------
# sizes, casts, lists: scalar results stay Python numbers


def test_size_arithmetic_stays_python(backend):
    x = backend.asarray(_float_data((2, 3, 4)))
    assert evaluate("mul(size(@0,0),3)", [x], backend.xp) == 6
    assert type(evaluate("mul(size(@0,0),3)", [x], backend.xp)) is int
    assert evaluate("size(@0,-1)", [x], backend.xp) == 4
    assert evaluate("div(size(@0,2),size(@0,0))", [x], backend.xp) == 2.0
    assert evaluate("floor_divide(size(@0,1),2)", [x], backend.xp) == 1
    assert evaluate("pow(size(@0,2),0.5)", [x], backend.xp) == 2.0
    assert evaluate("torch.float(size(@0,1))", [x], backend.xp) == 3.0
    assert type(evaluate("torch.float(size(@0,1))", [x], backend.xp)) is float
    assert evaluate("int(div(size(@0,2),3))", [x], backend.xp) == 1
    assert evaluate("mul(2,3)", [], backend.xp) == 6


def test_outermost_list_gives_python_ints(backend):
    x = backend.asarray(_float_data((2, 3, 4)))
    out = evaluate("[int(size(@0,0)),-1,int(size(@0,2))]", [x], backend.xp)
    assert out == [2, -1, 4] and all(type(v) is int for v in out)
    assert evaluate("[mul(size(@0,0),3),-1]", [x], backend.xp) == [6, -1]
    assert evaluate("[]", [x], backend.xp) == []


def test_size_and_cast_combined_with_tensors_match_torch(backend):
    x = _float_data((3, 3, 6, 5))
    y = _float_data((3, 3, 6, 5))
    tx, ty = _torch(x), _torch(y)
    assert_close(_run(backend, "div(@0,size(@1,0))", [y, x]), (ty / tx.size(0)).numpy())
    assert_close(_run(backend, "mul(@0,pow(size(@1,0),0.5))", [y, x]), (ty * tx.size(0) ** 0.5).numpy())
    assert_close(_run(backend, "add(@0,sqrt(torch.float(size(@1,0))))", [y, x]),
                 (ty + torch.tensor(tx.size(0)).to(torch.float32).sqrt()).numpy())
    i = _int_data((2, 3))
    assert_close(_run(backend, "torch.float(@0)", [i]), _torch(i).float().numpy())
    assert_close(_run(backend, "torch.long(mul(@0,2.5))", [i]), (_torch(i) * 2.5).long().numpy())
    size_error = Program("size(@0,5)", backend.xp, backend.device, n_inputs=1)
    with pytest.raises(ExpressionError, match="out of range"):
        size_error(backend.asarray(x))


def test_literal_only_programs_are_folded(xp):
    prog = Program("add(@0,mul(2,pow(2,0.5)))", xp, n_inputs=1)
    assert format_rpn(prog.rpn) == "@0 2 2 0.5 pow mul add"
    assert Program("mul(2,3)", xp).mode == "const"


# -------------------------------------------------------------------------------------------------
# erf: accurate to float32 without scipy; one numpy fast path


def test_erf_generic_is_accurate(xp, backend):
    grid = np.concatenate([np.linspace(-7, 7, 14001), [0.0, -0.0, 0.46875, -0.46875, 4.0, 1e-30, 30.0]])
    ref = np.array([math.erf(v) for v in grid])
    for dtype, tol in (("float32", 1e-6), ("float64", 1e-14)):
        x = grid.astype(dtype)
        ref_x = np.array([math.erf(float(v)) for v in x])
        got = backend.to_numpy(erf_generic(backend.asarray(x), xp))
        assert got.dtype == np.dtype(dtype)
        assert np.max(np.abs(got - ref_x)) < tol, dtype
    assert ref.shape == grid.shape
    special = backend.to_numpy(erf_generic(backend.asarray(np.array([np.inf, -np.inf, np.nan], np.float32)), xp))
    assert special[0] == 1 and special[1] == -1 and np.isnan(special[2])


def test_erf_numpy_fast_path_matches_generic_and_torch():
    from array_api_compat import numpy as npx
    from kuiper_xp.backends import numpy_fast

    x = np.concatenate([np.linspace(-8, 8, 30001), [np.inf, -np.inf, np.nan, 0.0, -0.0]]).astype(np.float32)
    fast = numpy_fast.expr_erf(x)
    generic = erf_generic(x, npx)
    np.testing.assert_allclose(fast, generic, atol=2e-7, rtol=0)
    np.testing.assert_allclose(fast, torch.erf(torch.from_numpy(x)).numpy(), atol=1e-6, rtol=0)
    assert erf(x, npx).dtype == np.float32
    x64 = np.linspace(-6, 6, 2001)
    np.testing.assert_allclose(numpy_fast.expr_erf(x64), [math.erf(v) for v in x64], atol=1e-15, rtol=0)
    assert numpy_fast.expr_erf(np.float32(0.3)).dtype == np.float32
    assert numpy_fast.expr_erf(np.array([1, 2])).dtype == np.float32


def test_erf_public_helper_on_every_backend(backend):
    x = _float_data((2, 5))
    assert_close(erf(backend.asarray(x), backend.xp), torch.erf(_torch(x)).numpy(), rtol=1e-6)


def test_fmod_numpy_fast_path_matches_generic():
    from array_api_compat import numpy as npx
    from kuiper_xp.backends import numpy_fast

    from kuiper_xp.expression.functions import fmod

    a = _float_data((50,))
    b = _float_data((50,)) + np.float32(0.25)
    np.testing.assert_array_equal(numpy_fast.expr_fmod(a, b), fmod(a, b, npx))
    ai, bi = _int_data((50,)), _int_data((50,), nonzero=True)
    np.testing.assert_array_equal(numpy_fast.expr_fmod(ai, bi), fmod(ai, bi, npx))


# -------------------------------------------------------------------------------------------------
# the registered layer


def _expression_op(text, n_inputs, out_annotation=""):
    from kuiper_xp.pnnx.param import parse_param_text

    ins = " ".join(str(k) for k in range(n_inputs))
    lines = [f"pnnx.Input in{k} 0 1 {k} #{k}=(2,3)f32" for k in range(n_inputs)]
    lines.append(f"pnnx.Expression expr_0 {n_inputs} 1 {ins} out expr={text} {out_annotation}".rstrip())
    lines.append("pnnx.Output out0 1 0 out")
    model = parse_param_text("7767517\n" + f"{len(lines)} {n_inputs + 1}\n" + "\n".join(lines) + "\n")
    return next(op for op in model.operators if op.type == "pnnx.Expression")


def _build(op, backend):
    from kuiper_xp.layers.base import BuildContext

    return registry.create(op, BuildContext(backend))


def test_layer_is_registered_and_parses_once(backend):
    assert "pnnx.Expression" in registry
    layer = _build(_expression_op("add(@0,mul(@1,2))", 2, "#out=(2,3)f32"), backend)
    a, b = _float_data((2, 3)), _float_data((2, 3))
    assert layer.program.mode == "closure"
    assert_close(layer(backend.asarray(a), backend.asarray(b)), (_torch(a) + _torch(b) * 2).numpy())


def test_layer_rejects_inputs_beyond_its_operands(backend):
    with pytest.raises(ExpressionError, match=r"expr_0.*@2 refers to input 2, but the operator has 2 inputs"):
        _build(_expression_op("add(@0,@2)", 2), backend)


def test_layer_rejects_bad_expressions_with_op_name(backend):
    with pytest.raises(ExpressionError, match=r"expr_0.*unknown function 'bogus'") as info:
        _build(_expression_op("add(@0,bogus(@1))", 2), backend)
    assert "\n  add(@0,bogus(@1))\n         ^" in str(info.value)


def test_layer_reads_list_expressions_split_by_the_param_reader(backend):
    layer = _build(_expression_op("[int(size(@0,0)),-1,int(size(@0,1)),5.000000e+00]", 1), backend)
    assert layer(backend.asarray(_float_data((2, 3)))) == [2, -1, 3, 5.0]


def test_layer_returns_annotated_scalar_results_as_arrays(backend):
    layer = _build(_expression_op("mul(size(@0,1),2)", 1, "#out=()i64"), backend)
    out = layer(backend.asarray(_float_data((2, 3))))
    assert_close(out, np.asarray(6, dtype=np.int64))


def _word_feeding(consumer: str):
    """A bare-word pnnx.Expression (``expr=linear``) read by one ``consumer`` op type."""
    from kuiper_xp.pnnx.param import parse_param_text

    text = ("7767517\n4 3\npnnx.Input in0 0 1 0 #0=(2,3)f32\npnnx.Expression word 0 1 1 expr=linear\n"
            f"{consumer} c 2 1 0 1 2 #0=(2,3)f32 #2=(2,3)f32\npnnx.Output out0 1 0 2\n")
    model = parse_param_text(text)
    return next(op for op in model.operators if op.name == "word")


def test_bare_word_read_by_aten_ops_is_a_string_argument(backend):
    # pnnx writes string arguments of aten:: ops (quantile's interpolation, scatter_reduce's
    # reduce, meshgrid's indexing) as a bare-word expression
    assert _build(_word_feeding("aten::quantile"), backend)() == "linear"


def test_bare_word_read_by_other_ops_is_still_an_unknown_name(backend):
    with pytest.raises(ExpressionError, match=r"word.*unknown function 'linear'"):
        _build(_word_feeding("torch.add"), backend)


@pytest.mark.parametrize("e", [2, 3, 0.5, -0.5, -1, -2, 4, 5.0, -7, 8, 2.5])
def test_pow_by_constants_matches_torch(backend, e):
    """Powers torch computes by products, sqrt and division (2, 3, 0.5, -0.5, -1, -2: the same
    bits on numpy but for 0.5, which torch 2.13 rounds differently in an element or two), integer
    ones by repeated squaring (within 4e-7), the rest by pow."""
    x = _float_data((6, 50)) * 3
    x = np.abs(x) + 0.25 if e != int(e) else x
    g = backend.to_numpy(Program(f"pow(@0,{e})", backend.xp, None, None, n_inputs=1).run([backend.asarray(x)]))
    want = (torch.from_numpy(x) ** e).numpy()
    if backend.name == "numpy" and e in (2, 3, -0.5, -1, -2):
        np.testing.assert_array_equal(g, want)
    assert_close(g, want, rtol=1e-6)


def test_float32_logs_round_like_torch():
    """float32 log / log10 / log1p are computed in float64 and rounded: torch's float64 result
    rounded to float32, and within an ulp of torch's float32 one, where NumPy's float32
    functions are further off (its float32 log10 differed from torch's on 40% of these values).
    (torch's own float32 bits depend on the CPU: on AVX-512 its log is correctly rounded on all
    but 0.2% of these values; on an AVX2-only Zen 3 it differed from the rounded float64 on 4%.)
    So DeBERTa's log-bucketed relative positions come out as torch's (one ulp made ``ceil`` one
    bucket off)."""
    from kuiper_xp.backends import get_backend

    b = get_backend("numpy")
    run = lambda text, *a: np.asarray(Program(text, b.xp, b.device, b.fast, n_inputs=len(a)).run(list(a)))  # noqa: E731
    rng = np.random.default_rng(0)
    x = np.concatenate([np.arange(1, 4096, dtype=np.float32) / 2, rng.uniform(0, 10, 4096).astype(np.float32)])
    for name in ("log", "log10", "log1p"):
        fn = getattr(torch, name)
        rounded = fn(torch.from_numpy(x).double()).float().numpy()
        want32 = fn(torch.from_numpy(x)).numpy()
        got = run(f"{name}(@0)", x)
        assert got.dtype == np.float32 and (got != rounded).mean() < 1e-3, name
        ulps = np.abs(got.view(np.int32).astype(np.int64) - want32.view(np.int32))
        assert ulps.max() <= 1, (name, ulps.max())
    mid, max_pos = 2, 8
    pos = np.arange(3, 60, dtype=np.float32)
    t = torch.from_numpy(pos)
    want = torch.ceil(torch.log(t / mid) / torch.log(torch.tensor((max_pos - 1) / mid)) * (mid - 1)) + mid
    got = run(f"add(ceil(mul(div(log(div(@0,{mid})),log(@1)),{mid - 1})),{mid})", pos,
              np.asarray((max_pos - 1) / mid, np.float32))
    assert np.array_equal(got, want.numpy())


class _Log1pExpm1(torch.nn.Module):
    """torch.log1p / torch.expm1, which pnnx writes malformed (``log1p,abs(@0)``,
    ``sub(mul(@0,log1p),abs(@1)),3``): every function and operand in prefix order, the brackets
    wrong."""

    def forward(self, x, y):
        return (torch.log1p(x.abs()), torch.expm1(y), torch.log1p(x.abs()) * 2 + 1,
                torch.log1p(x.abs()) + torch.expm1(y), torch.log1p(torch.expm1(x.abs())),
                x * torch.log1p(y.abs()) - 3, torch.log1p(x.abs() + torch.expm1(y)) * torch.log1p(y.abs()))


def test_pnnx_malformed_log1p_expm1_are_read_as_meant(tmp_path):
    from helpers import export_module

    import kuiper_xp
    from kuiper_xp.expression.parser import _repair_prefix

    x, y = torch.randn(2, 5), torch.randn(2, 5)
    param = export_module(_Log1pExpm1(), (x, y), tmp_path)
    assert "log1p," in param.read_text() and "expm1," in param.read_text()  # (pnnx's malformed form)
    got = kuiper_xp.load(param, backend="numpy")(x.numpy(), y.numpy())
    for a, e in zip(got, _Log1pExpm1()(x, y)):
        assert_close(np.asarray(a), e.numpy(), rtol=1e-6)
    assert _repair_prefix("sub(mul(@0,log1p),abs(@1)),3") == "sub(mul(@0,log1p(abs(@1))),3)"
    assert _repair_prefix("log1p,@0,@1") is None  # tokens left over: not a reading
    with pytest.raises(ExpressionError, match="expected '\\(' after 'log1p'"):
        Program("log1p,@0,@1", np, n_inputs=2)


def test_sign_of_a_0d_operand(backend):
    """``torch.sign(x.sum()) * x``: the fast sign of a 0-d float array (numpy gives a scalar)."""
    x = np.array([[1.5, -4.0], [0.5, 1.0]], dtype=np.float32)
    s = np.asarray(x.sum())
    assert_close(_run(backend, "mul(sign(@0),@1)", [s, x]), (torch.sign(_torch(s)) * _torch(x)).numpy())


def test_float32_erf_reaches_one_where_torch_does(backend):
    """erf is +-1 in float32 far enough out: floor(erf(x)) is 1 and 1 - erf(x) 0 there, as torch
    gives. Where torch's float32 erf first gives 1 depends on the CPU: from 3.8325069 on an
    AVX-512 one, from ~3.92 (where the exact erf rounds to 1) on an AVX2-only Zen 3; kuiper-xp
    gives 1 from 3.8325069, within an ulp of both in between."""
    x = np.array([3.95, 4.0, 10.0, np.inf, -4.5, 3.8, 3.83250642, 0.5], dtype=np.float32)
    for text, fn in (("erf(@0)", torch.erf), ("floor(erf(@0))", lambda t: torch.floor(torch.erf(t))),
                     ("sub(1,erf(@0))", lambda t: 1 - torch.erf(t))):
        assert_close(_run(backend, text, [x]), fn(_torch(x)).numpy(), rtol=1e-7, atol=1e-7, what=text)
    np.testing.assert_array_equal(kuiper_xp.to_numpy(_run(backend, "floor(erf(@0))", [x])),
                                  torch.floor(torch.erf(_torch(x))).numpy())
    band = np.array([3.8325069, 3.9, 3.919], dtype=np.float32)  # (torch's bits depend on the CPU)
    assert_close(_run(backend, "erf(@0)", [band]), torch.erf(_torch(band)).numpy(), rtol=0, atol=6e-8,
                 what="erf where float32 rounds to 1")


def test_scalar_logaddexp_of_equal_infinities():
    """Both operands Python numbers (constant-folded): inf - inf must not make NaN."""
    from kuiper_xp.expression.functions import _scalar_logaddexp

    assert _scalar_logaddexp(math.inf, math.inf) == float(torch.logaddexp(torch.tensor(math.inf),
                                                                            torch.tensor(math.inf)))
    assert _scalar_logaddexp(-math.inf, -math.inf) == -math.inf


def test_input_index_of_thousands_of_digits_is_an_expression_error():
    with pytest.raises(ExpressionError, match="out of range"):
        parse("add(@" + "9" * 5000 + ",1)")


def test_bool_tensor_to_a_bool_power_is_bool(backend):
    b = np.array([True, False, True])
    for e in ("True", "False"):
        want = torch.pow(torch.from_numpy(b), e == "True").numpy()
        assert_close(_run(backend, f"pow(@0,{e})", [b]), want, what=f"pow(@0,{e})")


def test_programs_share_one_array_ops_per_namespace():
    """Every compiled expression of a namespace, device and fast module uses one ArrayOps (its
    bound float functions took ~130 us to make per expression at load); another fast module gets
    its own, and the shared one computes as a fresh one does."""
    from kuiper_xp.backends import get_backend

    from kuiper_xp.expression.functions import ArrayOps

    b = get_backend("numpy")
    p1 = Program("add(@0,exp(@1))", b.xp, b.device, b.fast, n_inputs=2)
    p2 = Program("mul(log(@0),@1)", b.xp, b.device, b.fast, n_inputs=2)
    p3 = Program("mul(log(@0),@1)", b.xp, b.device, None, n_inputs=2)
    assert p1.ops is p2.ops and p3.ops is not p1.ops and p3.ops.fast is None
    x, y = np.float32([0.5, 2.0]), np.float32([1.0, -3.0])
    want = (torch.log(torch.from_numpy(x)) * torch.from_numpy(y)).numpy()
    np.testing.assert_allclose(np.asarray(p2.run([x, y])), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(p3.run([x, y])), want, rtol=1e-6)
    assert ArrayOps.shared(b.xp, b.device, b.fast) is p1.ops
