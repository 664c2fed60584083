"""array_api_strict: the test backend that rejects anything outside the Array API standard.

It has two devices, ``CPU_DEVICE`` and the fake ``device1``; running a model on ``device1``
catches code that creates an array without ``device=``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Backend

EXTRA = "test"
DESCRIPTION = "array_api_strict (standard-only test backend; CPU_DEVICE and fake devices)"


def probe() -> tuple[bool, str]:
    try:
        import array_api_strict  # noqa: F401
    except ImportError as exc:
        return False, f"array_api_strict does not import ({exc})"
    return True, ""


def list_devices() -> list[str]:
    import array_api_strict as s

    return [str(d).split("'")[1] for d in s.__array_namespace_info__().devices()]


class StrictBackend(Backend):
    name = "array_api_strict"
    library = "array_api_strict"

    def __init__(self, device_name: str) -> None:
        import array_api_strict as xp

        self._cpu = xp.Device("CPU_DEVICE")
        super().__init__(xp, xp.Device(device_name), DESCRIPTION)
        self._name = device_name

    def asarray(self, host: Any, dtype: Any = None) -> Any:
        host = np.asarray(host)
        if dtype is None:
            dtype = getattr(self.xp, str(host.dtype), None) if host.dtype != np.bool_ else self.xp.bool
        if not host.flags.c_contiguous:
            host = np.ascontiguousarray(host)
        return self.xp.asarray(host, dtype=dtype, device=self.device)

    def to_numpy(self, a: Any) -> Any:
        return np.from_dlpack(a.to_device(self._cpu)) if a.device != self._cpu else np.from_dlpack(a)

    def same_device(self, device: Any) -> bool:
        return device is None or str(device).split("'")[-2:-1] == [self._name] or str(device) == self._name

    def device_str(self) -> str:
        return self._name


def create(device: Any = None) -> Backend:
    import array_api_strict as xp

    name = "CPU_DEVICE" if device is None else str(device)
    if "'" in name:
        name = name.split("'")[1]
    known = list_devices()
    if name not in known:
        from kuiper_xp.errors import BackendError

        raise BackendError(f"array_api_strict has devices {known}; got {device!r}")
    del xp
    return StrictBackend(name)
