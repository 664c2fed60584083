"""Resource limits applied while reading model files (untrusted input).

Defaults are generous for real models and refuse absurd files before memory is allocated. Raise
them with :func:`set_limits` (or the environment variables ``KUIPER_XP_MAX_<NAME>``, e.g.
``KUIPER_XP_MAX_WEIGHT_BYTES=8e9``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Limits:
    max_param_bytes: int = 256 * 2**20  # size of a .pnnx.param file
    max_line_chars: int = 16 * 2**20  # one line of it
    max_operators: int = 1_000_000
    max_operands: int = 2_000_000
    max_rank: int = 16  # dimensions of one shape
    max_weight_bytes: int = 4 * 2**30  # one weight / attribute
    max_total_weight_bytes: int = 16 * 2**30  # all weights of a model
    max_expression_chars: int = 1_000_000
    max_bin_members: int = 2_000_000


def _from_env(base: Limits) -> Limits:
    changes = {}
    for f in fields(Limits):
        raw = os.environ.get("KUIPER_XP_" + f.name.upper())
        if raw:
            try:
                changes[f.name] = int(float(raw))
            except ValueError:
                pass
    return replace(base, **changes) if changes else base


_current = Limits()


def get_limits() -> Limits:
    """The limits in force: those set with :func:`set_limits`, overridden by environment."""
    return _from_env(_current)


def set_limits(**changes: int) -> Limits:
    """Change limits for this process, e.g. ``set_limits(max_weight_bytes=8 * 2**30)``."""
    global _current
    unknown = set(changes) - {f.name for f in fields(Limits)}
    if unknown:
        from kuiper_xp.errors import KuiperXPError

        raise KuiperXPError(f"unknown limits {sorted(unknown)}; known: {[f.name for f in fields(Limits)]}")
    _current = replace(_current, **changes)
    return _current
