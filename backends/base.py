"""The interface every backend module provides."""

from __future__ import annotations

import contextlib
from typing import Any


class Backend:
    """An array library bound to one device.

    Attributes: ``name``, ``xp`` (the Array API namespace, through array-api-compat), ``device``
    (the device object to pass as ``device=``), ``description`` (one line), and ``fast``: an object
    holding optional library-specific fast paths, or None (generic Array API code is then used).
    """

    name: str = ""
    description: str = ""
    fast: Any = None
    #: whether reading a value back on the host is cheap (a check of index ranges); False on a GPU,
    #: where it would wait for the device and stop a forward pass from being captured as a graph
    cheap_host_reads: bool = True

    def __init__(self, xp: Any, device: Any, description: str):
        self.xp = xp
        self.device = device
        self.description = description

    # -- host <-> device -------------------------------------------------------------------
    def asarray(self, host: Any, dtype: Any = None) -> Any:
        """An array of this backend on its device, from host data (numpy array, list, scalar)."""
        raise NotImplementedError

    def to_numpy(self, a: Any) -> Any:
        """A numpy array with the contents of ``a`` (an array of this backend)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until queued device work has finished (for timing); a no-op on the CPU."""

    def owns(self, a: Any) -> bool:
        """Whether ``a`` is an array of this backend's library."""
        return type(a).__module__.split(".")[0] == self.library

    def same_device(self, device: Any) -> bool:
        return str(device) == str(self.device) or device is None

    def device_str(self) -> str:
        return str(self.device)

    def compute_scope(self, pool: Any = None) -> Any:
        """A context manager the runtime enters around each forward pass (the numpy backend
        takes over BLAS's threads there, and draws outputs from ``pool``); a no-op by default."""
        return contextlib.nullcontext()

    def buffer_pool(self) -> Any:
        """A new pool of reusable output buffers for one graph (``give(array)`` for values the
        runtime drops, ``lend(results)`` / ``reclaim()`` for results handed to the caller), or None."""
        return None

    def graph_replayer(self) -> Any:
        """A recorder that runs a graph's forward pass once per input signature as a device graph
        and replays it afterwards (cupy: CUDA graphs), or None; see ``cupy_backend.CudaGraphs``."""
        return None

    def memory_stats(self) -> dict[str, int]:
        """Device memory pool statistics where the library has a pool (cupy), else {}."""
        return {}

    library: str = ""

    def __repr__(self) -> str:
        return f"<Backend {self.name} on {self.device_str()}: {self.description}>"


def concat_shape(xs: Any, axis: int, array_type: type) -> list[int] | None:
    """The shape of ``concatenate(xs, axis)`` when every piece is an ``array_type`` of one dtype
    and rank whose other dimensions agree, else None (the fast paths' callers then run the
    generic code, which reports the mismatch or promotes)."""
    first = xs[0]
    if not isinstance(first, array_type):
        return None
    nd, dt = first.ndim, first.dtype
    if nd == 0 or not 0 <= axis < nd:
        return None
    lo, hi = tuple(first.shape[:axis]), tuple(first.shape[axis + 1:])
    total = 0
    for a in xs:  # (tuple comparisons: 49 pieces of a cost volume took 80 us per dim)
        if (not isinstance(a, array_type) or (a.dtype is not dt and a.dtype != dt) or a.ndim != nd
                or tuple(a.shape[:axis]) != lo or tuple(a.shape[axis + 1:]) != hi):
            return None
        total += int(a.shape[axis])
    return [int(n) for n in lo] + [total] + [int(n) for n in hi]


def host_random(shape: tuple[int, ...], seed: int | None, normal: bool, dtype: str = "float32"):
    """Seeded host random numbers (numpy's PCG64), the same on every backend."""
    import numpy as np

    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) if normal else rng.random(shape)
    return a.astype(dtype)
