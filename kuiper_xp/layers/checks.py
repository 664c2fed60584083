"""Index range checks that need not stop the device.

torch raises on an index out of range, and so must kuiper-xp: CuPy's ``take`` and integer-array
indexing wrap any index silently (NumPy's raise, with numpy's own words). So every layer that
indexes with data checks the range. Reading the index's min and max back to the host is cheap on
the CPU; on a GPU it waits for the device and makes a forward pass impossible to capture as a CUDA
graph. There (a backend whose ``cheap_host_reads`` is False) :class:`~kuiper_xp.runtime.graph.Graph`
runs each pass inside :func:`deferring`: a check then only computes an "any index bad" flag on the
device and hands it to the pass's :class:`PendingChecks`, and the lookup goes on with the index
clipped into range. A backend may give one kernel that does both (``fast.range_check``, CuPy's:
one kernel per check instead of five); else they are the Array API's comparisons, ``any`` and
``where``. The graph reads the pass's one status value when the pass is done (a replayed CUDA
graph included) and raises the first failing check's
:class:`~kuiper_xp.errors.ShapeError`, which names the layer (the pass's results are dropped with
it). A layer called outside a graph pass checks on the host at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from kuiper_xp.errors import ShapeError

_tls = threading.local()


class PendingChecks:
    """The checks deferred during one pass: ``code`` (a 0-d int32 device array, or None when no
    check ran) holds 0, or k for the first failing check, whose message is ``messages[k - 1]``."""

    __slots__ = ("xp", "device", "kernel", "code", "messages")

    def __init__(self, xp: Any, device: Any, kernel: Callable | None = None):
        self.xp, self.device, self.kernel = xp, device, kernel
        self.code: Any = None
        self.messages: list[str] = []

    def check(self, index: Any, lo: int, hi: int, message: str) -> Any:
        """Record the check that every entry of ``index`` is in ``[lo, hi)``; the index clipped
        into that range (so that no lookup leaves its array before the error is raised)."""
        if self.kernel is not None:
            # kernel(index, lo, hi, k, code): the clipped index, or None where it declines; it
            # sets code[0] to k if code is still 0 and an entry fails (checks run in stream order)
            code = self.code
            if code is None:
                code = self.xp.zeros((), dtype=self.xp.int32, device=self.device)
            # (the kernel writes through a one-element view)
            out = self.kernel(index, lo, hi, len(self.messages) + 1, self.xp.reshape(code, (1,)))
            if out is not None:
                self.code = code
                self.messages.append(message)
                return out
        xp = self.xp
        self.add(xp.logical_or(index < lo, index >= hi), message)
        # (not xp.clip: array-api-compat's clip assigns through a boolean mask, which reads the
        # mask's count on the host)
        bounds = [xp.full((), v, dtype=index.dtype, device=self.device) for v in (lo, hi - 1)]
        return xp.minimum(xp.maximum(index, bounds[0]), bounds[1])

    def add(self, bad: Any, message: str) -> None:
        """Record a check: ``bad`` a boolean device array, true where an entry fails."""
        xp = self.xp
        self.messages.append(message)
        k = xp.full((), len(self.messages), dtype=xp.int32, device=self.device)
        hit = xp.any(bad)
        if self.code is None:
            self.code = xp.where(hit, k, xp.zeros((), dtype=xp.int32, device=self.device))
        else:
            self.code = xp.where(xp.logical_and(self.code == 0, hit), k, self.code)


def raise_failed(code: Any, messages: list[str]) -> None:
    """One host read of a pass's status ``code``; the first failing check's ShapeError."""
    if code is not None and messages:
        k = int(code)
        if k:
            raise ShapeError(messages[k - 1])


@contextmanager
def deferring(xp: Any, device: Any, kernel: Callable | None = None):
    """Defer this thread's range checks into a fresh :class:`PendingChecks` (yielded), made
    with the backend's ``kernel`` where it has one (see :meth:`PendingChecks.check`)."""
    prev = getattr(_tls, "pending", None)
    pending = _tls.pending = PendingChecks(xp, device, kernel)
    try:
        yield pending
    finally:
        _tls.pending = prev


def check_range(xp: Any, index: Any, lo: int, hi: int,
                message: Callable[[int | None], str]) -> tuple[Any, int | None]:
    """ShapeError unless every entry of the integer array ``index`` is in ``[lo, hi)``:
    ``message(bad)`` is its text, given the offending extreme, or None where the check was
    deferred (see the module docstring) and the value is not known. Returns the index to use and
    its smallest entry (``hi`` for an empty index); when deferred, the index clipped into the range
    (so that no lookup leaves its array before the error is raised) and None."""
    if not index.size:
        return index, hi
    pending = getattr(_tls, "pending", None)
    if pending is not None:
        return pending.check(index, lo, hi, message(None)), None
    mn, mx = int(xp.min(index)), int(xp.max(index))
    if mn < lo or mx >= hi:
        raise ShapeError(message(mn if mn < lo else mx))
    return index, mn
