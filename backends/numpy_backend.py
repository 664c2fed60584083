"""NumPy on the CPU: the default backend."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from .base import Backend

EXTRA = ""
DESCRIPTION = "NumPy on the CPU (default)"


def probe() -> tuple[bool, str]:
    return True, ""


def list_devices() -> list[str]:
    return ["cpu"]


#: glibc malloc settings of :func:`tune_malloc`
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TRIM_THRESHOLD = 256 << 20
_malloc_tuned = False


def tune_malloc(force: bool = False) -> bool:
    """Keep numpy's temporaries out of fresh pages: with glibc's defaults a large array is often a
    new mapping and freed memory at the heap's top goes back to the OS, so a layer computed by
    several array operations can page-fault its temporaries in on every call (an ELU over
    2x64x56x56: 8.1 ms, 2.1 ms with the settings here; an autoencoder with such activations
    39-44 -> 28 ms at batch 2). Arrays up to MALLOC_MMAP_THRESHOLD come from the heap and up to
    MALLOC_TRIM_THRESHOLD of free heap is kept for reuse, as a caching allocator keeps its blocks.

    Process-wide, so a library does not do it behind its host's back: it applies when ``force``
    (the ``kuiper-xp`` command, whose process is its own) or when ``KUIPER_XP_TUNE_MALLOC=1``;
    ``KUIPER_XP_TUNE_MALLOC=0`` refuses it even then. Linux with glibc only. True once applied."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    env = os.environ.get("KUIPER_XP_TUNE_MALLOC", "").strip().lower()
    if env in ("0", "false", "no", "off") or not (force or env in ("1", "true", "yes", "on")):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt  # glibc's; musl has none (AttributeError)
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    ok = mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD) == 1
    ok = mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD) == 1 and ok
    _malloc_tuned = ok
    return ok


class NumpyBackend(Backend):
    name = "numpy"
    library = "numpy"

    def __init__(self) -> None:
        from array_api_compat import numpy as xp

        super().__init__(xp, "cpu", f"NumPy {np.__version__} on the CPU")
        tune_malloc()
        from . import numpy_fast

        self.fast = numpy_fast

    def compute_scope(self, pool: Any = None) -> Any:
        return self.fast.compute_scope(pool)

    def buffer_pool(self) -> Any:
        return self.fast.BufferPool()

    def asarray(self, host: Any, dtype: Any = None) -> Any:
        return np.asarray(host, dtype=dtype)

    def to_numpy(self, a: Any) -> Any:
        return np.asarray(a)


def create(device: Any = None) -> Backend:
    if device not in (None, "cpu", "CPU"):
        from kuiper_xp.errors import BackendError

        raise BackendError(f"the numpy backend has one device, 'cpu'; got {device!r}")
    return NumpyBackend()
