"""The pnnx.Expression language (seeds 000/001): tokenizer, parser to an n-ary tree, reverse
Polish conversion, and a stack evaluator / closure compiler over an Array API namespace.

    >>> from kuiper_xp.expression import tokenize, parse, to_rpn, format_rpn, compile_expression
    >>> format_rpn(to_rpn(parse("add(mul(@0,@1),@2)")))
    '@0 @1 mul @2 add'
    >>> prog = compile_expression("sqrt(div(add(mul(@0,2),@1),12))", xp, device, n_inputs=2)
    >>> y = prog(a, b)

Every function computes what the torch function of the same name computes, result dtype
included (see :class:`~kuiper_xp.expression.functions.ArrayOps`). Known differences from torch:
``floor_divide`` is torch's floor division, so a ``div(a,b,rounding_mode='trunc')`` that pnnx
rewrote to ``floor_divide`` rounds toward -inf for negative quotients (pnnx's own rewrite loses
the difference); a cast of a Python scalar (``torch.float(size(@0,1))``) stays a Python number
rather than a 0-d tensor, which only matters when it meets an integer tensor with a float64 cast.
"""

from __future__ import annotations

from .evaluator import MAX_CLOSURE_DEPTH, Program, compile_expression, evaluate, evaluate_rpn
from .functions import BINARY, CASTS, SIGNATURES, UNARY, ArrayOps, erf, erf_generic, fmod
from .parser import Node, depth, format_rpn, max_input, parse, to_rpn, tree_str
from .tokenizer import Token, TokenKind, token_value, tokenize

__all__ = [
    "Token", "TokenKind", "tokenize", "token_value",
    "Node", "parse", "to_rpn", "format_rpn", "tree_str", "max_input", "depth",
    "Program", "compile_expression", "evaluate", "evaluate_rpn", "MAX_CLOSURE_DEPTH",
    "ArrayOps", "BINARY", "UNARY", "CASTS", "SIGNATURES", "erf", "erf_generic", "fmod",
]
