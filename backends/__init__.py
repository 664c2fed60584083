"""The backend switch: which array library (and device) kuiper-xp computes with.

Installed as ``kuiper_xp.backends``. One module per array library:

* ``numpy_backend``  -- NumPy on the CPU, the default;
* ``cupy_backend``   -- CuPy on a CUDA device;
* ``strict_backend`` -- ``array_api_strict``, the test backend that rejects anything outside the
  Array API standard (with its second fake device ``device1`` to catch a lost ``device=``).

Choice, highest first: an explicit name, the ``KUIPER_XP_BACKEND`` environment variable, then
``auto`` = cupy when it imports *and* a CUDA device answers, else numpy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kuiper_xp.errors import BackendError, BackendUnavailableError

from .base import Backend

__all__ = [
    "Backend",
    "BackendInfo",
    "ENV_VAR",
    "BACKEND_NAMES",
    "get_backend",
    "list_backends",
    "backend_for_array",
    "to_numpy",
]

ENV_VAR = "KUIPER_XP_BACKEND"
BACKEND_NAMES = ("numpy", "cupy", "array_api_strict")
_ALIASES = {"np": "numpy", "cp": "cupy", "cuda": "cupy", "strict": "array_api_strict",
            "array-api-strict": "array_api_strict"}


def _module(name: str):
    if name == "numpy":
        from . import numpy_backend as m
    elif name == "cupy":
        from . import cupy_backend as m
    else:
        from . import strict_backend as m
    return m


@dataclass(frozen=True)
class BackendInfo:
    """One line of :func:`list_backends`: a backend, whether it works here, and why not."""

    name: str
    available: bool
    reason: str
    devices: tuple[str, ...]
    description: str
    extra: str

    def __str__(self) -> str:
        if self.available:
            return f"{self.name:17s} available   devices: {', '.join(self.devices)}  ({self.description})"
        return f"{self.name:17s} unavailable {self.reason}"


_cache: dict[tuple[str, str | None], Backend] = {}


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else name
    if not isinstance(key, str):
        raise BackendError(f"backend name must be a string, got {type(name).__name__}")
    key = _ALIASES.get(key, _ALIASES.get(name.strip().lower(), key))
    if key == "auto" or key in BACKEND_NAMES:
        return key
    raise BackendError(
        f"unknown backend {name!r}; allowed: {', '.join(('auto',) + BACKEND_NAMES)}"
        f" (also settable with {ENV_VAR})"
    )


def _resolve_auto() -> str:
    ok, _ = _module("cupy").probe()
    return "cupy" if ok else "numpy"


def get_backend(name: str | Backend | None = None, device: Any = None) -> Backend:
    """Return the backend chosen by ``name``, else ``$KUIPER_XP_BACKEND``, else ``auto``.

    ``device`` picks a device of that backend (``"cpu"``; ``"cuda:1"`` or ``1`` for cupy;
    ``"CPU_DEVICE"`` or ``"device1"`` for array_api_strict); None takes the backend's default.
    Raises :class:`BackendUnavailableError` (an ``ImportError``) naming the extra to install when
    the backend cannot be used here, and :class:`BackendError` for an unknown name or device.
    """
    if isinstance(name, Backend):
        if device is None or name.same_device(device):
            return name
        name = name.name
    source = "argument"
    if name is None:
        name = os.environ.get(ENV_VAR) or "auto"
        source = ENV_VAR if os.environ.get(ENV_VAR) else "default"
    key = _canonical(name)
    if key == "auto":
        key = _resolve_auto()
    cache_key = (key, None if device is None else str(device))
    hit = _cache.get(cache_key)
    if hit is not None:
        return hit
    mod = _module(key)
    ok, reason = mod.probe()
    if not ok:
        hint = f"; install it with: pip install -e '.[{mod.EXTRA}]' (in the kuiper-xp checkout)" if mod.EXTRA else ""
        via = f" (asked for by {source})" if source != "argument" else ""
        raise BackendUnavailableError(f"backend {key!r} is unavailable{via}: {reason}{hint}")
    backend = mod.create(device)
    _cache[cache_key] = backend
    return backend


def list_backends() -> list[BackendInfo]:
    """Each known backend, whether it can be used on this machine, its devices, and why not."""
    out = []
    for name in BACKEND_NAMES:
        mod = _module(name)
        ok, reason = mod.probe()
        devices: tuple[str, ...] = ()
        if ok:
            try:
                devices = tuple(mod.list_devices())
            except Exception as exc:  # pragma: no cover - defensive: a broken driver
                ok, reason = False, f"devices could not be listed: {exc}"
        out.append(BackendInfo(name, ok, "" if ok else reason, devices, mod.DESCRIPTION,
                               mod.EXTRA or ""))
    return out


def backend_for_array(a: Any) -> Backend:
    """The backend (and device) an array of any supported library lives on."""
    mod_name = type(a).__module__.split(".")[0]
    if mod_name == "numpy":
        return get_backend("numpy")
    if mod_name == "cupy":
        return get_backend("cupy", device=f"cuda:{a.device.id}")
    if mod_name == "array_api_strict":
        return get_backend("array_api_strict", device=str(a.device).split("'")[1]
                           if "'" in str(a.device) else None)
    raise BackendError(f"not an array of a supported library: {type(a).__module__}.{type(a).__name__}")


def to_numpy(a: Any):
    """Copy (or view, for numpy) any supported array, or a Tensor, to a numpy array on the host."""
    if hasattr(a, "to_numpy") and not type(a).__module__.startswith(("numpy", "cupy", "array_api")):
        return a.to_numpy()
    if isinstance(a, (list, tuple)):
        return type(a)(to_numpy(x) for x in a)
    mod_name = type(a).__module__.split(".")[0]
    if mod_name in ("numpy", "builtins"):
        from .numpy_backend import np
        return np.asarray(a)
    return backend_for_array(a).to_numpy(a)
