"""kuiper-xp: a pnnx inference runtime written against the Python Array API.

    >>> import kuiper_xp
    >>> g = kuiper_xp.load("model.pnnx.param")        # backend from KUIPER_XP_BACKEND or auto
    >>> (y,) = g(x)                                    # x: numpy array or array of g's backend
    >>> kuiper_xp.to_numpy(y)
"""

from __future__ import annotations

import importlib.util as _ilu
import sys as _sys
from pathlib import Path as _Path

__version__ = "0.1.0"


def _ensure_backends() -> None:
    """``backends/`` ships inside the wheel as ``kuiper_xp.backends`` (setuptools package-dir).
    In a source checkout that is not installed, load it from the sibling folder instead."""
    name = __name__ + ".backends"
    if name in _sys.modules or _ilu.find_spec(name) is not None:
        return
    src = _Path(__file__).resolve().parent.parent / "backends" / "__init__.py"
    spec = _ilu.spec_from_file_location(name, src, submodule_search_locations=[str(src.parent)])
    if spec is None or spec.loader is None:  # pragma: no cover - broken install
        raise ImportError(f"kuiper_xp.backends is missing (looked for {src})")
    mod = _ilu.module_from_spec(spec)
    _sys.modules[name] = mod
    spec.loader.exec_module(mod)


_ensure_backends()

from kuiper_xp import errors  # noqa: E402
from kuiper_xp.backends import get_backend, list_backends, to_numpy  # noqa: E402
from kuiper_xp.errors import (  # noqa: E402
    BackendUnavailableError,
    ExpressionError,
    GraphError,
    InputError,
    KuiperXPError,
    ModelFormatError,
    ModelNotFoundError,
    ShapeError,
    UnsupportedOperatorError,
)
from kuiper_xp.tensor import Tensor  # noqa: E402


def __getattr__(name: str):
    # The runtime pulls in every layer module; import it on first use so that
    # `import kuiper_xp` stays cheap for backend and Tensor work.
    if name in ("load", "Graph", "GraphState"):
        from kuiper_xp.runtime import graph as _g

        return getattr(_g, name)
    raise AttributeError(f"module 'kuiper_xp' has no attribute {name!r}")


__all__ = [
    "load",
    "Graph",
    "GraphState",
    "Tensor",
    "get_backend",
    "list_backends",
    "to_numpy",
    "errors",
    "KuiperXPError",
    "BackendUnavailableError",
    "ExpressionError",
    "GraphError",
    "InputError",
    "ModelFormatError",
    "ModelNotFoundError",
    "ShapeError",
    "UnsupportedOperatorError",
]
