"""Resource limits applied while reading model files (untrusted input).

Defaults are generous for real models and refuse absurd files *before* memory is allocated.
Raise them for one process with :func:`set_limits`, or with the environment variables
``KUIPER_XP_MAX_<NAME>`` (e.g. ``KUIPER_XP_MAX_WEIGHT_BYTES=8e9`` or ``=8G``), which win over
:func:`set_limits`. Byte sizes accept the suffixes K, M, G, T (powers of 1024).

=========================  ===========  ===============================================
limit                      default      what it bounds
=========================  ===========  ===============================================
max_param_bytes            256 MiB      size of a ``.pnnx.param`` file
max_line_chars             16 Mi        characters in one operator line
max_operators              1,000,000    operators the header may declare
max_operands               2,000,000    operands the header may declare
max_rank                   16           dimensions of one ``#``/``@`` shape
max_dim                    2**40        one dimension of a shape
max_weight_bytes           4 GiB        one weight (``@``) / ``pnnx.Attribute``
max_total_weight_bytes     16 GiB       all weights of one model
max_bin_members            2,000,000    members of the ``.pnnx.bin`` zip archive
max_expression_chars       1,000,000    characters of one ``pnnx.Expression``
max_tensor_elements        2**32        elements of an array a layer makes from its
                                        parameters (a pad, an upsampling or adaptive
                                        pooling size), checked before it is allocated
=========================  ===========  ===============================================

The nesting depth of an expression needs no limit of its own: the parser and the evaluator
walk it with explicit stacks, so it is bounded by ``max_expression_chars``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

from kuiper_xp.errors import KuiperXPError

__all__ = ["Limits", "LimitsError", "get_limits", "set_limits", "limits", "ENV_PREFIX", "check_elements"]

ENV_PREFIX = "KUIPER_XP_"


class LimitsError(KuiperXPError, ValueError):
    """An unknown limit name, or a value that is not a non-negative integer."""


@dataclass(frozen=True)
class Limits:
    max_param_bytes: int = 256 * 2**20  # size of a .pnnx.param file
    max_line_chars: int = 16 * 2**20  # one line of it
    max_operators: int = 1_000_000
    max_operands: int = 2_000_000
    max_rank: int = 16  # dimensions of one shape
    max_dim: int = 2**40  # one dimension of one shape
    max_weight_bytes: int = 4 * 2**30  # one weight / attribute
    max_total_weight_bytes: int = 16 * 2**30  # all weights of a model
    max_expression_chars: int = 1_000_000
    max_bin_members: int = 2_000_000
    max_tensor_elements: int = 2**32  # an array sized by a layer's parameters (16 GiB of float32)


_NAMES = tuple(f.name for f in fields(Limits))
_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_VALUE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE]\+?[0-9]{1,3})?)\s*([KMGT]?)(?:i?B)?\s*\Z", re.I)


def _parse(name: str, raw: object, source: str) -> int:
    """A limit value: a non-negative int, or a string like '8e9', '512M', '4GiB'."""
    if isinstance(raw, bool):
        raise LimitsError(f"{source}: limit {name} must be an integer, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str) and (m := _VALUE_RE.match(raw)):
        value = int(float(m.group(1)) * _SUFFIX[m.group(2).upper()])
    else:
        raise LimitsError(f"{source}: limit {name} must be a non-negative integer (optionally with a "
                          f"K/M/G/T suffix), got {raw!r}")
    if value < 0:
        raise LimitsError(f"{source}: limit {name} must be >= 0, got {raw!r}")
    return value


def _from_env(base: Limits) -> Limits:
    changes = {}
    for name in _NAMES:
        var = ENV_PREFIX + name.upper()
        raw = os.environ.get(var)
        if raw is not None and raw.strip():
            changes[name] = _parse(name, raw, f"environment variable {var}")
    return replace(base, **changes) if changes else base


_current = Limits()


def get_limits() -> Limits:
    """The limits in force: those set with :func:`set_limits`, overridden by environment."""
    return _from_env(_current)


def set_limits(**changes: int | str) -> Limits:
    """Change limits for this process, e.g. ``set_limits(max_weight_bytes=8 * 2**30)``; returns
    the new settings (environment variables still win, see :func:`get_limits`)."""
    global _current
    unknown = sorted(set(changes) - set(_NAMES))
    if unknown:
        raise LimitsError(f"unknown limits {unknown}; known: {list(_NAMES)}")
    parsed = {k: _parse(k, v, "set_limits") for k, v in changes.items()}
    _current = replace(_current, **parsed)
    return _current


@contextlib.contextmanager
def limits(**changes: int | str) -> Iterator[Limits]:
    """Temporarily change limits: ``with kuiper_xp.limits.limits(max_weight_bytes="8G"): ...``.
    (Process-wide, not per thread.)"""
    global _current
    saved = _current
    try:
        yield set_limits(**changes)
    finally:
        _current = saved


def check_elements(count: int, where: str, what: str = "output") -> None:
    """Refuse, before allocating it or looping over it, an array of ``count`` elements sized by a
    model's parameters beyond ``max_tensor_elements`` (a pad of 10**12 hung in a Python loop; a
    pad of 3 * 10**8 asked for 17 GiB)."""
    from kuiper_xp.errors import ResourceLimitError

    limit = get_limits().max_tensor_elements
    if count > limit:
        raise ResourceLimitError(
            f"{where}: the {what} would have {count:,} elements, over the limit max_tensor_elements={limit:,} "
            f"(raise it with {ENV_PREFIX}MAX_TENSOR_ELEMENTS or kuiper_xp.limits.set_limits if the model "
            "really needs it)")
