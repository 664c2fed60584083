"""NumPy on the CPU: the default backend."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Backend

EXTRA = ""
DESCRIPTION = "NumPy on the CPU (default)"


def probe() -> tuple[bool, str]:
    return True, ""


def list_devices() -> list[str]:
    return ["cpu"]


class NumpyBackend(Backend):
    name = "numpy"
    library = "numpy"

    def __init__(self) -> None:
        from array_api_compat import numpy as xp

        super().__init__(xp, "cpu", f"NumPy {np.__version__} on the CPU")
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
