"""Tokenizer of the pnnx.Expression language (seed 000, section 2: "词法解析").

Positions follow the seed's code: ``start`` is the 0-based offset of the token's first character
in the original string and ``end`` is one past its last character (a half-open ``[start, end)``
span), so ``add(@0,mul(@1,@2))`` gives ``add`` 0..3, ``(`` 3..4, ``@0`` 4..6, ``,`` 6..7.
(The seed's prose says ``@0`` ends at 5, but its ``Token(TokenInputNumber, i, j)`` with ``j`` one
past the last digit gives 6; the code is what we follow.) Unlike the seed, whitespace is skipped
rather than deleted first, so positions always index the string as written in the model file.

Token kinds: ``NAME`` (a function name such as ``add`` or ``torch.float``), ``INPUT`` (``@3``),
``INT``, ``FLOAT`` (``2.0``, ``1e-05``, ``5.000000e+00``, ``inf``, ``nan``, ``nan.0``; ints and floats may carry
a leading ``-``), ``COMPLEX`` (pnnx's ``1.000000e+00+2.000000e+00j`` for ``1 + 2j``), ``BOOL``
(``True``/``False``), ``NONE``, and the punctuation ``LPAREN`` ``RPAREN``
``LBRACKET`` ``RBRACKET`` ``COMMA``.
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple

from kuiper_xp.errors import ExpressionError

__all__ = ["Token", "TokenKind", "tokenize", "token_value"]


class TokenKind(enum.Enum):
    NAME = "name"
    INPUT = "input"
    INT = "int"
    FLOAT = "float"
    COMPLEX = "complex"
    BOOL = "bool"
    NONE = "none"
    LPAREN = "("
    RPAREN = ")"
    LBRACKET = "["
    RBRACKET = "]"
    COMMA = ","


class Token(NamedTuple):
    """One token: its kind, its text, and its half-open span ``[start, end)`` in the expression."""

    kind: TokenKind
    text: str
    start: int
    end: int

    def __repr__(self) -> str:
        return f"Token({self.kind.name}, {self.text!r}, {self.start}, {self.end})"


# One master pattern; the named group that matched gives the token class. Numbers may carry a
# leading '-'; a number must not run into a letter, digit, '_', '.' or '@' (``1.2.3``, ``2x``).
_MASTER = re.compile(r"""
    (?P<ws>\s+)
  | (?P<punct>[()\[\],])
  | (?P<input>@[0-9]+)
  | (?P<special>-?(?:inf|nan)(?:\.0+)?(?![A-Za-z0-9_.@]))
  | (?P<complex>-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[+-](?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?j)(?![A-Za-z0-9_.@])
  | (?P<number>-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(?P<bad>[A-Za-z0-9_.@])?
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
""", re.VERBOSE)
_PUNCT = {
    "(": TokenKind.LPAREN,
    ")": TokenKind.RPAREN,
    "[": TokenKind.LBRACKET,
    "]": TokenKind.RBRACKET,
    ",": TokenKind.COMMA,
}
_WORDS = {"True": TokenKind.BOOL, "False": TokenKind.BOOL, "None": TokenKind.NONE,
          "inf": TokenKind.FLOAT, "nan": TokenKind.FLOAT}


def _max_chars() -> int:
    from kuiper_xp.limits import get_limits

    return get_limits().max_expression_chars


def tokenize(expr: str) -> list[Token]:
    """Split ``expr`` into tokens; :class:`ExpressionError` (with a caret) on a character or
    word that cannot start a token, or on an empty expression."""
    if not isinstance(expr, str):
        raise ExpressionError(f"an expression must be a string, got {type(expr).__name__}")
    limit = _max_chars()
    if len(expr) > limit:
        raise ExpressionError(
            f"expression of {len(expr)} characters exceeds the limit of {limit} "
            "(kuiper_xp.limits max_expression_chars)", expr[:200] + "...", None)
    tokens: list[Token] = []
    append = tokens.append
    match = _MASTER.match
    punct = _PUNCT
    i, n = 0, len(expr)
    while i < n:
        m = match(expr, i)
        if m is None:
            c = expr[i]
            if c == "@":
                raise ExpressionError("'@' must be followed by an input number, as in '@0'", expr, i)
            if c in "-.":
                raise ExpressionError(f"malformed number starting with {c!r}", expr, i)
            raise ExpressionError(f"unexpected character {c!r}", expr, i)
        group = m.lastgroup
        end = m.end()
        if group == "punct":
            c = expr[i]
            append(Token(punct[c], c, i, end))
        elif group == "input":
            append(Token(TokenKind.INPUT, m.group(), i, end))
        elif group == "name":
            text = m.group()
            append(Token(_WORDS.get(text, TokenKind.NAME), text, i, end))
        elif group == "complex":  # (pnnx writes a complex constant as ``1.000000e+00-2.000000e+00j``)
            append(Token(TokenKind.COMPLEX, m.group("complex"), i, m.end("complex")))
            end = m.end("complex")
        elif group == "special":  # (pnnx writes float('nan') as ``nan.0``)
            append(Token(TokenKind.FLOAT, m.group().split(".")[0], i, end))
        elif group in ("number", "bad"):
            if m.group("bad") is not None:
                raise ExpressionError(f"malformed number {m.group()!r}", expr, m.start("bad"))
            text = m.group("number")
            end = m.end("number")
            is_float = "." in text or "e" in text or "E" in text
            append(Token(TokenKind.FLOAT if is_float else TokenKind.INT, text, i, end))
        i = end
    if not tokens:
        raise ExpressionError("empty expression", expr, 0)
    return tokens


def token_value(tok: Token) -> int | float | complex | bool | None:
    """The Python value of a literal token (INT, FLOAT, COMPLEX, BOOL, NONE)."""
    if tok.kind is TokenKind.INT:
        return int(tok.text)
    if tok.kind is TokenKind.FLOAT:
        return float(tok.text)
    if tok.kind is TokenKind.COMPLEX:
        return complex(tok.text)
    if tok.kind is TokenKind.BOOL:
        return tok.text == "True"
    if tok.kind is TokenKind.NONE:
        return None
    raise ValueError(f"{tok!r} is not a literal")
