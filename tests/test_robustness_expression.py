"""Fuzzing the pnnx.Expression language (tokenizer, parser, compiler, evaluator).

Property: any text gives a tree or an :class:`ExpressionError` (never another exception, never a
RecursionError), each case well under a second; a parsed tree prints back to text that parses
to the same tree; a compiled program run on small arrays returns an array/number or raises a
KuiperXPError. Budget as in ``test_robustness_fuzz.py`` (``KUIPER_XP_FUZZ_EXAMPLES=N``)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kuiper_xp.backends import get_backend

from kuiper_xp.errors import ExpressionError, KuiperXPError
from kuiper_xp.limits import limits

expression = pytest.importorskip("kuiper_xp.expression")

FUZZ_N = int(os.environ.get("KUIPER_XP_FUZZ_EXAMPLES", "0") or 0)


def fuzz_settings(n: int = 200):
    # the normal suite: the same cases every run, no shrinking (a failure prints its input
    # as generated); a long run shrinks and keeps a database
    kw = {} if FUZZ_N else {"derandomize": True, "database": None,
                            "phases": [Phase.explicit, Phase.generate]}
    return settings(max_examples=FUZZ_N or n, deadline=1000, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much], **kw)


SIGNATURES = dict(expression.SIGNATURES)
NAMES = sorted(SIGNATURES)
SEEDS = [
    "sqrt(div(add(mul(@0,2),@1),12))", "pow(3,@1)", "sub(@0,@1)", "[int(size(@0,0)),-1,int(size(@0,2))]",
    "add(@0,1e-05)", "mul(@0,5.000000e+00)", "neg(@0)", "max(@0,@1)", "floor_divide(@0,2)",
    "remainder(@0,-3)", "atan2(@0,@1)", "logaddexp(@0,@1)", "rsqrt(add(@0,1.000000e-05))",
    "and(@2,@3)", "lshift(@2,2)", "erf(div(@0,1.414214e+00))", "[]", "mul(@0,True)", "add(@0,None)",
    "size(@0,-1)", "div(@0,0)", "fmod(@2,0)", "pow(@2,-1)",
]
LITERALS = ["0", "1", "-1", "2.0", "1e-05", "5.000000e+00", "-0.5", "inf", "-inf", "nan", "True",
            "False", "None", "2147483647", "9223372036854775807", "99999999999999999999999", "1e999",
            "-9" * 3, "0.", ".5", "1e+308"]
ODD = ["(", ")", ",", "[", "]", "@", "@-1", "@99999999999999999999", "@0", " ", "\t", "\n", "-", ".",
       "e", "é", "😀", "\x00", "\u202e", "add", "add(", "size(", "((", "))", ",,", "@0@1", "1e", "--1",
       "True(", "neg(neg(", "[[", "]]", "1.2.3", "0x10", "_", "torch.float", "int("]


def _tree(depth: int):
    leaf = st.one_of(st.integers(0, 3).map(lambda i: f"@{i}"), st.sampled_from(LITERALS))
    if depth == 0:
        return leaf

    def call(args_name):
        name, args = args_name
        return f"{name}({','.join(args)})"

    sub = _tree(depth - 1)
    calls = st.tuples(st.sampled_from(NAMES), st.lists(sub, min_size=0, max_size=4)).map(call)
    right_arity = st.sampled_from(NAMES).flatmap(
        lambda n: st.lists(sub, min_size=SIGNATURES[n][0], max_size=min(SIGNATURES[n][1], 4)).map(
            lambda a, n=n: f"{n}({','.join(a)})"))
    lists = st.lists(sub, max_size=4).map(lambda a: f"[{','.join(a)}]")
    return st.one_of(leaf, right_arity, right_arity, calls, lists)


EXPRS = _tree(4)


@st.composite
def mutated_expr(draw):
    text = draw(st.one_of(st.sampled_from(SEEDS), EXPRS))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "dup"]))
        n = len(text)
        piece = draw(st.one_of(st.sampled_from(ODD), st.sampled_from(LITERALS), st.characters()))
        if kind == "flip" and n:
            i = draw(st.integers(0, n - 1))
            text = text[:i] + piece + text[i + 1:]
        elif kind == "insert":
            i = draw(st.integers(0, n))
            text = text[:i] + piece + text[i:]
        elif kind == "delete" and n:
            i = draw(st.integers(0, n - 1))
            text = text[:i] + text[i + draw(st.integers(1, 8)):]
        elif kind == "truncate":
            text = text[: draw(st.integers(0, n))]
        elif kind == "dup" and n:
            i, j = sorted((draw(st.integers(0, n)), draw(st.integers(0, n))))
            text = text[:j] + text[i:j] + text[j:]
    return text


def check_parse(text: str):
    try:
        tree = expression.parse(text)
    except ExpressionError as exc:
        assert str(exc)
        return None
    # round trip: the printed tree parses to the same tree
    printed = expression.tree_str(tree)
    again = expression.parse(printed)
    assert expression.tree_str(again) == printed
    assert expression.format_rpn(expression.to_rpn(again)) == expression.format_rpn(expression.to_rpn(tree))
    return tree


NP = get_backend("numpy")
RNG = np.random.default_rng(0)
INPUTS = [
    (RNG.standard_normal((2, 3)) * 3).astype(np.float32),
    (RNG.standard_normal((2, 3)) * 3).astype(np.float32),
    np.arange(-3, 3, dtype=np.int64).reshape(2, 3),
    np.array([[True, False, True], [False, False, True]]),
]


def check_run(text: str, backend=NP, inputs=INPUTS):
    try:
        prog = expression.compile_expression(text, backend.xp, backend.device, backend.fast,
                                             n_inputs=len(inputs))
    except KuiperXPError as exc:
        assert str(exc)
        return
    arrays = [backend.asarray(a) for a in inputs]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            out = prog(*arrays)
        except KuiperXPError as exc:
            assert str(exc)
            return
    assert out is None or isinstance(out, (int, float, bool, list)) or hasattr(out, "shape"), type(out)


@fuzz_settings()
@given(mutated_expr())
def test_parser_on_mutated_expressions(text):
    check_parse(text)


@fuzz_settings()
@given(st.lists(st.one_of(st.sampled_from(ODD), st.sampled_from(LITERALS), st.characters()),
                max_size=60).map("".join))
def test_parser_on_random_text(text):
    check_parse(text)


@fuzz_settings()
@given(mutated_expr())
def test_compile_and_run_on_numpy(text):
    check_run(text)


@fuzz_settings(100)
@given(EXPRS)
def test_compile_and_run_on_strict(text):
    check_run(text, get_backend("array_api_strict"))


@pytest.mark.parametrize("n", [1_000, 20_000])
def test_deep_nesting_parses_and_runs_without_recursion(n):
    text = "neg(" * n + "@0" + ")" * n
    tree = expression.parse(text)
    assert expression.depth(tree) == n + 1
    x = np.array([1.0, -2.0], np.float32)
    prog = expression.compile_expression(text, NP.xp, NP.device, n_inputs=1)
    np.testing.assert_array_equal(prog(x), x if n % 2 == 0 else -x)
    del tree, prog  # dropping a deep tree must not overflow the C stack either


@pytest.mark.parametrize("text", [
    "neg(" * 20_000 + "@0",  # never closed
    "[" * 20_000,
    "add(" * 10_000 + "@0," * 10_000,
    "(" * 20_000 + "@0" + ")" * 20_000,
    ",".join(["@0"] * 20_000),
], ids=["unclosed-calls", "open-brackets", "unclosed-add", "parenthesised", "bare-commas"])
def test_deep_or_long_garbage_is_an_expression_error(text):
    with pytest.raises(ExpressionError):
        expression.parse(text)


def test_wide_list_parses():
    text = "[" + ",".join(["@0"] * 20_000) + "]"
    assert len(expression.parse(text).args) == 20_000


def test_expression_length_limit():
    text = "neg(" * 1000 + "@0" + ")" * 1000
    with limits(max_expression_chars=100):
        with pytest.raises(ExpressionError, match="max_expression_chars"):
            expression.parse(text)
    with limits(max_expression_chars=10_000):
        expression.parse(text)


@pytest.mark.parametrize("text", [
    "mul(99999999999999999999,99999999999999999999)", "lshift(@2,99999999999)", "pow(2.0,99999.0)",
    "size(@0,99999999999999999999)", "add(@0,99999999999999999999999)", "mul(@2,9223372036854775807)",
    "minimum(99999999999999999999999,@3)", "pow(@0,99999999999)", "rshift(@2,-1)",
])
def test_huge_integer_literals_fail_fast_or_compute(text):
    check_run(text)


# Python ints are unbounded: folding these constants could take minutes and gigabytes. They run
# in a child process (memory capped, killed after a timeout) so a regression cannot hang the suite.
UNBOUNDED = ["lshift(1,99999999999)", "pow(10,99999999999)", "pow(99999999999,99999999999)",
             "lshift(int(size(@0,0)),99999999999)", "pow(-7,99999999999)", "mul(lshift(1,62),lshift(1,62))"]
_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
sys.path.insert(0, sys.argv[1])
import test_robustness_expression as t
for text in sys.argv[2:]:
    print("start", text, flush=True)
    t.check_run(text)
    print("ok", text, flush=True)
"""


def test_unbounded_integer_arithmetic_is_refused_quickly():
    import subprocess
    import sys
    from pathlib import Path

    cmd = [sys.executable, "-c", _CHILD, str(Path(__file__).parent), *UNBOUNDED]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        last = [ln for ln in out.splitlines() if ln.startswith("start ")]
        pytest.fail(f"still computing after 20 s: {last[-1][6:] if last else '?'}")
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
