"""Exception types.

Every error kuiper-xp raises on purpose derives from :class:`KuiperXPError`; each subclass also
derives from the builtin that matches it, so ``except ValueError`` keeps working for callers that
do not know this package.
"""

from __future__ import annotations

__all__ = [
    "KuiperXPError",
    "BackendError",
    "BackendUnavailableError",
    "ShapeError",
    "ModelFormatError",
    "ParamFormatError",
    "ModelNotFoundError",
    "BinFormatError",
    "ResourceLimitError",
    "GraphError",
    "UnsupportedOperatorError",
    "LayerParameterError",
    "ExpressionError",
    "InputError",
    "OptionError",
]


class KuiperXPError(Exception):
    """Base class of every error raised by kuiper-xp."""


class BackendError(KuiperXPError, ValueError):
    """An unknown backend name or device."""


class BackendUnavailableError(KuiperXPError, ImportError):
    """The backend exists but cannot be used here (not installed, or no device)."""


class ShapeError(KuiperXPError, ValueError):
    """A shape that does not fit: bad reshape target, wrong operand shape."""


class ModelFormatError(KuiperXPError, ValueError):
    """A model file that cannot be read."""


class ParamFormatError(ModelFormatError):
    """A malformed ``.pnnx.param`` file; the message names the file and line."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        elif line is not None:
            where = f"line {line}: "
        super().__init__(where + message)
        self.path = path
        self.line = line


class ModelNotFoundError(KuiperXPError, FileNotFoundError):
    """A ``.pnnx.param`` or ``.pnnx.bin`` file that does not exist (a ``FileNotFoundError``);
    the message names it, and the model file beside it when the path was the stem or the weights."""


class BinFormatError(ModelFormatError):
    """A malformed ``.pnnx.bin`` archive or a member that does not match its declaration."""


class ResourceLimitError(ModelFormatError):
    """A model file asks for more than the configured limits allow (see ``kuiper_xp.limits``)."""


class GraphError(KuiperXPError, ValueError):
    """A graph that cannot be executed: cycles, dangling operands, duplicates, bad stage order."""


class UnsupportedOperatorError(KuiperXPError, NotImplementedError):
    """An operator type no layer is registered for."""


class LayerParameterError(KuiperXPError, ValueError):
    """An operator parameter or weight that is missing, of the wrong type, or unsupported."""


class ExpressionError(KuiperXPError, ValueError):
    """A ``pnnx.Expression`` that cannot be parsed or evaluated; shows a caret at the column."""

    def __init__(self, message: str, expr: str | None = None, pos: int | None = None):
        text = message
        if expr is not None:
            shown = expr if len(expr) <= 200 else None
            if shown is not None and pos is not None:
                text += f"\n  {shown}\n  {' ' * max(0, min(pos, len(shown)))}^"
            elif pos is not None:
                lo = max(0, pos - 60)
                snippet = expr[lo : pos + 60]
                text += f"\n  ...{snippet}...\n  {' ' * (3 + pos - lo)}^  (column {pos})"
            else:
                text += f"\n  {expr[:200]}"
        super().__init__(text)
        self.expr = expr
        self.pos = pos


class InputError(KuiperXPError, ValueError):
    """Inputs given to a graph that do not match what it expects (count, shape, dtype, device)."""


class OptionError(InputError):
    """A command-line option whose value does not fit the model (``--mean`` with 2 values for 3
    channels); the ``kuiper-xp`` command exits with status 2 for it, as for other usage errors."""
