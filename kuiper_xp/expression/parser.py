"""Parser of the pnnx.Expression language to a tree, and the tree's reverse Polish form
(seed 000, sections 3.2 and 3.3).

The seed's ``Generate_`` is recursive descent over a binary tree of add/mul; here the grammar is

    expr := INPUT | INT | FLOAT | BOOL | NONE
          | NAME '(' expr (',' expr)* ')'          a call; its arity is checked
          | '[' [expr (',' expr)*] ']'             a list (pnnx's outermost shape list)

and nodes are n-ary (``args`` is a tuple of any length). The descent is written with an explicit
stack instead of recursion, so nesting depth is bounded only by the expression length (limit
``max_expression_chars``): ``neg(neg(...(@0)...))`` 100,000 deep parses in well under a second.
The post-order walk that gives reverse Polish (seed: ``ReversePolish``) is iterative too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kuiper_xp.errors import ExpressionError

from .functions import SIGNATURES
from .tokenizer import Token, TokenKind, token_value, tokenize

__all__ = ["Node", "parse", "to_rpn", "format_rpn", "tree_str", "max_input", "depth"]

_LITERALS = (TokenKind.INT, TokenKind.FLOAT, TokenKind.COMPLEX, TokenKind.BOOL, TokenKind.NONE)


@dataclass(eq=False, slots=True)
class Node:
    """A tree node.

    ``kind`` is ``"input"`` (``value`` = input index N of ``@N``), ``"const"`` (``value`` = a
    Python int/float/bool/None), ``"call"`` (``value`` = the function name) or ``"list"``.
    ``args`` are the children in order; ``start``/``end`` the span of the node's first token
    (the function name for a call) in the expression.
    """

    kind: str
    value: Any
    args: list[Node] = field(default_factory=list)
    start: int = 0
    end: int = 0

    def __repr__(self) -> str:
        if self.kind == "input":
            return f"@{self.value}"
        if self.kind == "const":
            return repr(self.value)
        return f"<{self.label} with {len(self.args)} args>"

    @property
    def label(self) -> str:
        """The node as one RPN item: ``@0``, ``2``, ``add``, ``[]`` (a list)."""
        if self.kind == "input":
            return f"@{self.value}"
        if self.kind == "const":
            return repr(self.value)
        if self.kind == "list":
            return f"[{len(self.args)}]"
        return str(self.value)


def _describe(tok: Token | None) -> str:
    return "the end of the expression" if tok is None else repr(tok.text)


def parse(expr: str | list[Token], text: str | None = None) -> Node:
    """Parse ``expr`` (a string, or its tokens with ``text`` the string) to its tree.

    Raises :class:`ExpressionError` with a caret under the offending column for an unknown
    function, a wrong argument count, unbalanced or missing brackets, a missing operand, and
    anything after the end of the expression. pnnx's malformed ``log1p`` / ``expm1`` (see
    :func:`_repair_prefix`) are read as meant."""
    try:
        return _parse(expr, text)
    except ExpressionError:
        src = expr if isinstance(expr, str) else text
        if src is None or not _MALFORMED_UNARY.search(src):
            raise
        fixed = _repair_prefix(src)
        if fixed is None:
            raise
        return _parse(fixed, None)


_MALFORMED_UNARY = re.compile(r"\b(log1p|expm1)\b(?!\()")  # (the name without its bracket)


def _repair_prefix(text: str) -> str | None:
    """pnnx (20261020) writes ``torch.log1p`` / ``torch.expm1`` without their brackets and with the
    enclosing ones shifted (``x * log1p(|y|) - 3`` comes out as ``sub(mul(@0,log1p),abs(@1)),3``),
    but keeps every function and operand in prefix order. The call is rebuilt from that order and
    the functions' arities; None unless exactly one reading uses every token (a function with a
    variable argument count, ``add(a,b,alpha)``, could make it ambiguous)."""
    try:
        toks = [t for t in tokenize(text) if t.kind not in (TokenKind.LPAREN, TokenKind.RPAREN, TokenKind.COMMA)]
    except ExpressionError:
        return None
    if any(t.kind in (TokenKind.LBRACKET, TokenKind.RBRACKET) for t in toks) or len(toks) > 256:
        return None

    budget = [20000]  # readings tried (variable arities could make the search exponential)

    def readings(i: int):  # (string, next index) for each way to read one operand from token i
        budget[0] -= 1
        if i >= len(toks) or budget[0] < 0:
            return
        t = toks[i]
        if t.kind is not TokenKind.NAME:
            yield t.text, i + 1
            return
        if t.text not in SIGNATURES:
            return
        lo, hi = SIGNATURES[t.text]

        def args(j: int, k: int):
            if k == 0:
                yield [], j
                return
            for a, j2 in readings(j):
                for rest, j3 in args(j2, k - 1):
                    yield [a] + rest, j3
        for k in range(lo, min(hi, 3) + 1):
            for parts, j in args(i + 1, k):
                yield f"{t.text}({','.join(parts)})", j

    found = []
    for s, j in readings(0):
        if j == len(toks):
            found.append(s)
            if len(found) > 1:
                return None
    return found[0] if found else None


def _parse(expr: str | list[Token], text: str | None = None) -> Node:
    if isinstance(expr, str):
        text = expr
        tokens = tokenize(expr)
    else:
        tokens = expr
        text = text if text is not None else " ".join(t.text for t in tokens)
        if not tokens:
            raise ExpressionError("empty expression", text, 0)
    n = len(tokens)
    end_pos = len(text)

    def err(msg: str, i: int) -> ExpressionError:
        pos = tokens[i].start if i < n else end_pos
        return ExpressionError(msg, text, pos)

    # frames of open calls/lists: [node, closing kind, index of the opening token]
    stack: list[tuple[Node, TokenKind, int]] = []
    i = 0
    root: Node | None = None
    while True:
        # ---- parse one operand starting at token i
        if i >= n:
            raise err("expected an operand (an input @N, a number or a function call), found the "
                      "end of the expression", i)
        tok = tokens[i]
        k = tok.kind
        if k is TokenKind.INPUT:
            if len(tok.text) > 20:  # (int() of thousands of digits is refused by Python itself)
                raise err(f"input index {tok.text[:12]}... is out of range", i)
            node = Node("input", int(tok.text[1:]), [], tok.start, tok.end)
            i += 1
        elif k in _LITERALS:
            try:
                value = token_value(tok)
            except ValueError as exc:
                raise err(f"bad literal {tok.text!r}: {exc}", i) from None
            if type(value) is int and not -(2**63) <= value < 2**63:
                raise err(f"integer literal {tok.text} does not fit in int64", i)
            node = Node("const", value, [], tok.start, tok.end)
            i += 1
        elif k is TokenKind.NAME:
            if tok.text not in SIGNATURES:
                raise err(f"unknown function {tok.text!r}; known: " + " ".join(sorted(SIGNATURES)), i)
            if i + 1 >= n or tokens[i + 1].kind is not TokenKind.LPAREN:
                raise err(f"expected '(' after {tok.text!r}, found {_describe(tokens[i + 1] if i + 1 < n else None)}",
                          i + 1)
            stack.append((Node("call", tok.text, [], tok.start, tok.end), TokenKind.RPAREN, i))
            i += 2
            continue
        elif k is TokenKind.LBRACKET:
            lst = Node("list", None, [], tok.start, tok.end)
            if i + 1 < n and tokens[i + 1].kind is TokenKind.RBRACKET:
                node = lst
                i += 2
            else:
                stack.append((lst, TokenKind.RBRACKET, i))
                i += 1
                continue
        else:
            if k is TokenKind.LPAREN:
                msg = "unexpected '(': a bracket must follow a function name"
            else:
                msg = f"expected an operand (an input @N, a number or a function call), found {tok.text!r}"
            raise err(msg, i)
        # ---- an operand is complete: attach it, then close every frame that ends here
        while True:
            if not stack:
                root = node
                break
            parent, closer, opened = stack[-1]
            parent.args.append(node)
            tok2 = tokens[i] if i < n else None
            if tok2 is not None and tok2.kind is TokenKind.COMMA:
                i += 1
                break  # next argument
            if tok2 is not None and tok2.kind is closer:
                stack.pop()
                i += 1
                if parent.kind == "call":
                    for arg in parent.args:
                        if arg.kind == "list" or (arg.kind == "const" and arg.value is None):
                            what = "a list" if arg.kind == "list" else "None"
                            raise ExpressionError(f"{parent.value}() cannot take {what} as an argument",
                                                  text, arg.start)
                    lo, hi = SIGNATURES[parent.value]
                    got = len(parent.args)
                    if not lo <= got <= hi:
                        want = str(lo) if lo == hi else f"{lo} to {hi}"
                        raise ExpressionError(
                            f"{parent.value}() takes {want} argument{'s' if hi > 1 else ''}, got {got}",
                            text, parent.start)
                node = parent
                continue
            want = "')'" if closer is TokenKind.RPAREN else "']'"
            if tok2 is None:
                raise ExpressionError(
                    f"unbalanced brackets: {want} missing for the "
                    f"{'call to ' + parent.value if parent.kind == 'call' else 'list'} opened here",
                    text, tokens[opened].start if parent.kind == "list" else tokens[opened + 1].start)
            raise err(f"expected ',' or {want}, found {tok2.text!r}", i)
        if root is not None:
            break
    if i < n:
        raise err(f"unexpected {tokens[i].text!r} after the end of the expression", i)
    return root


def to_rpn(root: Node) -> list[Node]:
    """The nodes in reverse Polish order: a post-order walk (children left to right, then the
    node). ``add(mul(@0,@1),@2)`` gives ``@0 @1 mul @2 add``."""
    out: list[Node] = []
    stack: list[tuple[Node, int]] = [(root, 0)]
    while stack:
        node, k = stack.pop()
        if k < len(node.args):
            stack.append((node, k + 1))
            stack.append((node.args[k], 0))
        else:
            out.append(node)
    return out


def format_rpn(rpn: list[Node]) -> str:
    """``"@0 @1 mul @2 add"``."""
    return " ".join(node.label for node in rpn)


def tree_str(root: Node) -> str:
    """The tree back as prefix text, e.g. ``add(mul(@0,@1),@2)`` (iterative)."""
    parts: list[str] = []
    stack: list[tuple[Node, int]] = [(root, 0)]
    while stack:
        node, k = stack.pop()
        if node.kind in ("input", "const"):
            parts.append(node.label)
            continue
        if k == 0:
            parts.append(f"{node.value}(" if node.kind == "call" else "[")
        if k < len(node.args):
            if k > 0:
                parts.append(",")
            stack.append((node, k + 1))
            stack.append((node.args[k], 0))
        else:
            parts.append(")" if node.kind == "call" else "]")
    return "".join(parts)


def max_input(root: Node) -> int:
    """The largest N of the ``@N`` in the tree, -1 when there is none."""
    best = -1
    stack = [root]
    while stack:
        node = stack.pop()
        if node.kind == "input":
            best = max(best, node.value)
        stack.extend(node.args)
    return best


def depth(root: Node) -> int:
    """The height of the tree (a leaf has depth 1)."""
    best = 0
    stack = [(root, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        stack.extend((a, d + 1) for a in node.args)
    return best
