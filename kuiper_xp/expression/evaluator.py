"""Evaluation of a parsed expression (seed 000, section 4.4: the stack evaluator).

Two forms, both made once at build time from the reverse Polish order:

* :func:`evaluate_rpn` is the seed's stack machine: walk the RPN, push inputs and literals, pop
  the arguments of each call and push its result. It is iterative, so any depth works.
* :class:`Program` compiles the RPN into Python closures (one per call node, specialised when
  the arguments are inputs or literals; all-literal sub-trees are folded), so a forward pass is
  one call of the root closure with no per-call dispatch. Trees deeper than
  :data:`MAX_CLOSURE_DEPTH` run on the stack machine instead (nested closures would hit
  Python's recursion limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kuiper_xp.errors import ExpressionError

from .functions import ArrayOps, OpError
from .parser import Node, parse, to_rpn

__all__ = ["Program", "compile_expression", "evaluate", "evaluate_rpn", "MAX_CLOSURE_DEPTH"]

#: Trees up to this height are compiled to nested closures; deeper ones use the stack machine.
MAX_CLOSURE_DEPTH = 64


class _Instr:
    """One RPN instruction: push input ``arg`` (op 0), push literal ``arg`` (op 1), or call
    ``arg`` on the top ``nargs`` values (op 2)."""

    __slots__ = ("op", "arg", "nargs", "node")

    def __init__(self, op: int, arg: Any, nargs: int, node: Node):
        self.op, self.arg, self.nargs, self.node = op, arg, nargs, node


def _make_list(*items: Any) -> list:
    return list(items)


def _func(node: Node, ops: ArrayOps) -> Any:
    if node.kind == "list":
        return _make_list
    return ops.function(node.value)


def _raise_at(exc: Exception, text: str, node: Node) -> ExpressionError:
    name = node.value if node.kind == "call" else "list"
    return ExpressionError(f"{name}(): {exc}" if not str(exc).startswith(f"{name}") else str(exc), text, node.start)


def _constant(v: Any, ops: ArrayOps) -> Any:
    """A literal as the ops take it: numbers stay Python numbers; a complex literal becomes a 0-d
    complex64 array, which promotes as torch's complex scalar does (complex64 beside float32,
    integer and bool tensors, complex128 beside float64 and complex128 ones)."""
    if type(v) is complex:
        return ops.xp.asarray(v, dtype=ops.xp.complex64, device=ops.device)
    return v


def _assemble(rpn: Sequence[Node], ops: ArrayOps) -> list[_Instr]:
    code = []
    for node in rpn:
        if node.kind == "input":
            code.append(_Instr(0, node.value, 0, node))
        elif node.kind == "const":
            code.append(_Instr(1, _constant(node.value, ops), 0, node))
        else:
            code.append(_Instr(2, _func(node, ops), len(node.args), node))
    return code


def _run_code(code: Sequence[_Instr], inputs: Sequence[Any], text: str) -> Any:
    stack: list[Any] = []
    push = stack.append
    for ins in code:
        op = ins.op
        if op == 0:
            push(inputs[ins.arg])
        elif op == 1:
            push(ins.arg)
        else:
            n = ins.nargs
            args = stack[-n:]
            del stack[-n:]
            try:
                push(ins.arg(*args))
            except (OpError, OverflowError) as exc:
                raise _raise_at(exc, text, ins.node) from None
    return stack[0]


def evaluate_rpn(rpn: Sequence[Node], inputs: Sequence[Any], xp: Any, device: Any = None,
                 text: str = "") -> Any:
    """Evaluate the reverse Polish sequence ``rpn`` (from :func:`to_rpn`) on ``inputs`` with the
    stack machine of the seed."""
    return _run_code(_assemble(rpn, ArrayOps(xp, device)), inputs, text)


class Program:
    """An expression compiled for one namespace/device: ``program(*inputs)`` evaluates it.

    Attributes: ``text``, ``tree`` (root :class:`Node`), ``rpn`` (nodes in reverse Polish order),
    ``n_inputs`` (1 + the largest ``@N``), ``mode`` (``"closure"``, ``"stack"`` or ``"const"``).
    """

    def __init__(self, text: str, xp: Any, device: Any = None, fast: Any = None, n_inputs: int | None = None,
                 tree: Node | None = None):
        self.text = text
        self.tree = tree if tree is not None else parse(text)
        self.rpn = to_rpn(self.tree)
        self.ops = ArrayOps.shared(xp, device, fast)
        used, height = _scan(self.rpn)
        if n_inputs is not None:
            if used > n_inputs:
                bad = next(nd for nd in self.rpn if nd.kind == "input" and nd.value >= n_inputs)
                raise ExpressionError(
                    f"@{bad.value} refers to input {bad.value}, but the operator has {n_inputs} "
                    f"input{'s' if n_inputs != 1 else ''} (@0..@{n_inputs - 1})" if n_inputs else
                    f"@{bad.value} refers to input {bad.value}, but the operator has no inputs",
                    text, bad.start)
            self.n_inputs = n_inputs
        else:
            self.n_inputs = used
        if height > MAX_CLOSURE_DEPTH:
            self.mode = "stack"
            code = _assemble(self.rpn, self.ops)
            self._fn = lambda inputs: _run_code(code, inputs, text)
        else:
            fn, const, value = self._compile()
            if const:
                self.mode = "const"
                self._fn = lambda inputs: value
            else:
                self.mode = "closure"
                self._fn = fn

    def __call__(self, *inputs: Any) -> Any:
        return self._fn(inputs)

    def run(self, inputs: Sequence[Any]) -> Any:
        """Evaluate on a sequence of inputs."""
        return self._fn(inputs)

    def __repr__(self) -> str:
        return f"<Program {self.text!r} mode={self.mode}>"

    # -- closure compilation -----------------------------------------------------------------
    def _compile(self) -> tuple[Any, bool, Any]:
        """Walk the RPN with a stack of (closure, kind, payload): kind 'in' (payload = index),
        'const' (payload = value) or 'fn'. Returns (root closure, is constant, constant value)."""
        text = self.text
        stack: list[tuple[Any, str, Any]] = []
        for node in self.rpn:
            if node.kind == "input":
                i = node.value
                stack.append((lambda ins, i=i: ins[i], "in", i))
                continue
            if node.kind == "const":
                v = _constant(node.value, self.ops)
                stack.append((lambda ins, v=v: v, "const", v))
                continue
            n = len(node.args)
            args = stack[-n:] if n else []
            if n:
                del stack[-n:]
            fn = _func(node, self.ops)
            if all(kind == "const" for _, kind, _ in args):
                try:
                    v = fn(*[p for _, _, p in args])
                except OpError as exc:
                    raise _raise_at(exc, text, node) from None
                except (ArithmeticError, ValueError, TypeError) as exc:
                    raise ExpressionError(f"cannot evaluate the constant {node.value}(...): {exc}",
                                          text, node.start) from None
                stack.append((lambda ins, v=v: v, "const", v))
                continue
            stack.append((_closure(fn, args, text, node), "fn", None))
        (fn, kind, payload), = stack
        return fn, kind == "const", payload


def _scan(rpn: Sequence[Node]) -> tuple[int, int]:
    """(1 + the largest @N, height of the tree) in one pass over the reverse Polish order."""
    used = 0
    heights: list[int] = []
    best = 0
    for node in rpn:
        n = len(node.args)
        if n:
            h = 1 + max(heights[-n:])
            del heights[-n:]
        else:
            h = 1
            if node.kind == "input" and node.value >= used:
                used = node.value + 1
        heights.append(h)
        if h > best:
            best = h
    return used, best


def _closure(fn: Any, args: list[tuple[Any, str, Any]], text: str, node: Node) -> Any:
    """A closure computing ``fn`` of its arguments, specialised for input/literal arguments."""
    kinds = tuple(k for _, k, _ in args)
    pay = [p for _, _, p in args]
    subs = [f for f, _, _ in args]

    def fail(exc: Exception) -> ExpressionError:
        return _raise_at(exc, text, node)

    if kinds == ("in", "in"):
        i, j = pay

        def f(ins: Any) -> Any:
            try:
                return fn(ins[i], ins[j])
            except (OpError, OverflowError) as exc:
                raise fail(exc) from None
    elif kinds == ("in", "const"):
        i, c = pay

        def f(ins: Any) -> Any:
            try:
                return fn(ins[i], c)
            except (OpError, OverflowError) as exc:
                raise fail(exc) from None
    elif kinds == ("const", "in"):
        c, j = pay

        def f(ins: Any) -> Any:
            try:
                return fn(c, ins[j])
            except (OpError, OverflowError) as exc:
                raise fail(exc) from None
    elif kinds == ("in",):
        (i,) = pay

        def f(ins: Any) -> Any:
            try:
                return fn(ins[i])
            except (OpError, OverflowError) as exc:
                raise fail(exc) from None
    elif len(args) == 1:
        (g,) = subs

        def f(ins: Any) -> Any:
            try:
                return fn(g(ins))
            except (OpError, OverflowError) as exc:
                raise fail(exc) from None
    elif len(args) == 2:
        g, h = subs

        def f(ins: Any) -> Any:
            try:
                return fn(g(ins), h(ins))
            except (OpError, OverflowError) as exc:
                raise fail(exc) from None
    else:
        def f(ins: Any) -> Any:
            try:
                return fn(*[g(ins) for g in subs])
            except (OpError, OverflowError) as exc:
                raise fail(exc) from None
    return f


def compile_expression(text: str, xp: Any, device: Any = None, fast: Any = None,
                       n_inputs: int | None = None) -> Program:
    """Parse ``text`` once and compile it for ``xp``/``device``; checks every ``@N`` against
    ``n_inputs`` when given."""
    return Program(text, xp, device, fast, n_inputs)


def evaluate(text: str, inputs: Sequence[Any], xp: Any, device: Any = None) -> Any:
    """Parse and evaluate ``text`` on ``inputs`` in one go (tests, one-off use)."""
    return Program(text, xp, device, None, len(inputs)).run(inputs)
