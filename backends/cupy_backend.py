"""CuPy on a CUDA device."""

from __future__ import annotations

from typing import Any

from .base import Backend

EXTRA = "cuda"
DESCRIPTION = "CuPy on a CUDA device"

_probe_result: tuple[bool, str] | None = None


def probe() -> tuple[bool, str]:
    """cupy imports AND a CUDA device answers. Never raises: a half-installed cupy (no driver,
    wrong CUDA) is reported as unavailable with the reason."""
    global _probe_result
    if _probe_result is not None:
        return _probe_result
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken install raising anything
        _probe_result = (False, f"cupy does not import ({type(exc).__name__}: {exc})")
        return _probe_result
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        if n < 1:
            _probe_result = (False, "cupy imports but no CUDA device answers")
        else:
            cupy.zeros(1).sum().item()  # a device that answers
            _probe_result = (True, "")
    except Exception as exc:
        _probe_result = (False, f"cupy imports but no CUDA device answers ({type(exc).__name__}: {exc})")
    return _probe_result


def list_devices() -> list[str]:
    import cupy

    out = []
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        out.append(f"cuda:{i} ({name})")
    return out


class CupyBackend(Backend):
    name = "cupy"
    library = "cupy"

    def __init__(self, index: int) -> None:
        import cupy
        from array_api_compat import cupy as xp

        self._cupy = cupy
        self._dev = cupy.cuda.Device(index)
        super().__init__(xp, self._dev, f"CuPy {cupy.__version__} on cuda:{index}")
        self.index = index
        from . import cupy_fast

        self.fast = cupy_fast

    def asarray(self, host: Any, dtype: Any = None) -> Any:
        with self._dev:
            return self._cupy.asarray(host, dtype=dtype)

    def to_numpy(self, a: Any) -> Any:
        return self._cupy.asnumpy(a)

    def synchronize(self) -> None:
        with self._dev:
            self._cupy.cuda.get_current_stream().synchronize()

    def same_device(self, device: Any) -> bool:
        return device is None or _index(device) == self.index

    def device_str(self) -> str:
        return f"cuda:{self.index}"

    def memory_stats(self) -> dict[str, int]:
        pool = self._cupy.get_default_memory_pool()
        return {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes())}


def _index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    if hasattr(device, "id"):
        return int(device.id)
    text = str(device).strip().lower()
    if text.startswith("cuda:"):
        text = text[5:]
    elif text in ("cuda", "gpu"):
        return 0
    try:
        return int(text.split()[0])
    except ValueError:
        from kuiper_xp.errors import BackendError

        raise BackendError(f"cupy device must be 'cuda:N' or an integer; got {device!r}") from None


def create(device: Any = None) -> Backend:
    import cupy

    index = _index(device)
    n = cupy.cuda.runtime.getDeviceCount()
    if not 0 <= index < n:
        from kuiper_xp.errors import BackendError

        raise BackendError(f"cupy has devices cuda:0..cuda:{n - 1}; got {device!r}")
    return CupyBackend(index)
