"""CuPy on a CUDA device.

A forward pass on CuPy launches a few hundred small kernels, and at batch 1 the time is the
Python and launch overhead of those calls, not the GPU's work (ResNet-18: 14 ms eager on an H100,
about the same at batch 8). :class:`CudaGraphs` records the whole pass once per input signature
as a CUDA graph and replays it: one launch per call. It is on by default for graphs on this
backend; ``KUIPER_XP_CUDA_GRAPHS=0`` (or ``graph.cuda_graphs = False``) keeps every call eager.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
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
    cheap_host_reads = False
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

    def graph_replayer(self) -> Any:
        flag = os.environ.get("KUIPER_XP_CUDA_GRAPHS", "1").strip().lower()
        if flag in ("0", "false", "no", "off"):
            return None
        return CudaGraphs(self._cupy, self._dev)

    def memory_stats(self) -> dict[str, int]:
        pool = self._cupy.get_default_memory_pool()
        return {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes())}


class _Recorded:
    """One captured forward pass: its static input and output arrays and the CUDA graph."""

    __slots__ = ("graph", "static_in", "static_out")

    def __init__(self, graph: Any, static_in: list, static_out: tuple):
        self.graph, self.static_in, self.static_out = graph, static_in, static_out


class CudaGraphs:
    """Record a graph's forward pass as a CUDA graph per input signature (shapes and dtypes) and
    replay it.

    * The first call with a signature runs eagerly (kernels compile, caches fill).
    * The second runs the pass once more eagerly on a private stream and memory pool (the
      reference, and it fills the pool so that the capture allocates little), then captures it
      (``Stream.begin_capture``, relaxed mode), launches the graph on the same inputs and
      compares its outputs with the reference bit for bit. A capture that fails (a layer that
      synchronises or reads device values on the host) or a graph whose outputs differ is
      dropped with a warning, and that signature stays eager.
    * Later calls copy the inputs into the graph's static input buffers, launch the graph, and
      return copies of its static outputs (the next replay overwrites those).

    All graphs of one model share the private pool and stream: their scratch memory is reused
    across signatures (replays are serialised on that stream). At most :attr:`MAX_SIGNATURES`
    graphs are kept (least recently used dropped). A call made while another thread replays runs
    eagerly. ``stats`` counts captures, replays and failures.
    """

    MAX_SIGNATURES = 8
    #: input signatures remembered (seen once, or failed) before the oldest half are forgotten
    MAX_SEEN = 256

    def __init__(self, cupy: Any, device: Any):
        self.cp = cupy
        self.dev = device
        self._entries: OrderedDict[tuple, Any] = OrderedDict()  # sig -> int | _Recorded | None
        self._lock = threading.Lock()
        self._stream = None
        self._pool = None
        self.stats: dict[str, Any] = {"captured": 0, "replays": 0, "failed": []}

    def __call__(self, xs: list, run: Any) -> tuple | None:
        """Outputs for inputs ``xs`` (cupy arrays) from a replay or a fresh capture, or None when
        the caller should run eagerly (``run(xs)`` runs the pass on given input arrays)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            sig = tuple((tuple(x.shape), x.dtype.str) for x in xs)
            e = self._entries.get(sig, 0)
            if isinstance(e, _Recorded):
                self._entries.move_to_end(sig)
                return self._replay(e, xs)
            if e is None:
                return None
            if e < 1:
                if len(self._entries) >= self.MAX_SEEN:  # forget shapes seen once (dynamic shapes)
                    for k in [k for k, v in self._entries.items() if not isinstance(v, _Recorded)][:len(self._entries) // 2]:
                        del self._entries[k]
                self._entries[sig] = e + 1
                return None
            ref, static_in = self._reference(xs, run)  # a layer's own error propagates
            try:
                rec = self._record(static_in, ref, run)
            except Exception as exc:
                self._entries[sig] = None
                why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                self.stats["failed"].append((sig, why))
                warnings.warn(f"kuiper-xp: CUDA graph capture for inputs {[s for s, _ in sig]} failed ({why}); "
                              "these shapes run eagerly", RuntimeWarning, stacklevel=4)
                return ref
            self._entries[sig] = rec
            self._entries.move_to_end(sig)
            while sum(isinstance(v, _Recorded) for v in self._entries.values()) > self.MAX_SIGNATURES:
                old = next(k for k, v in self._entries.items() if isinstance(v, _Recorded))
                del self._entries[old]
            return ref
        finally:
            self._lock.release()

    def _reference(self, xs: list, run: Any) -> tuple[tuple, list]:
        """Copy the inputs into static buffers and run the pass eagerly on the private stream and
        pool: the reference outputs (copied out of the pool) and the static inputs."""
        cp = self.cp
        with self.dev:
            if self._stream is None:
                self._stream = cp.cuda.Stream(non_blocking=True)
                self._pool = cp.cuda.MemoryPool()
            stream, caller = self._stream, cp.cuda.get_current_stream()
            stream.wait_event(caller.record())  # the inputs were made on the caller's stream
            with stream:
                with cp.cuda.using_allocator(self._pool.malloc):
                    static_in = [cp.empty(x.shape, dtype=x.dtype) for x in xs]
                    for s, x in zip(static_in, xs):
                        cp.copyto(s, x)
                    ref_private = run(static_in)
                ref = tuple(cp.array(r, copy=True) for r in ref_private)  # outside the private pool
                del ref_private
                stream.synchronize()
            caller.wait_event(stream.record())
        return ref, static_in

    def _record(self, static_in: list, ref: tuple, run: Any) -> _Recorded:
        """Capture the pass on the static inputs, launch it once and check it against ``ref``."""
        cp = self.cp
        with self.dev:
            stream = self._stream
            with stream:
                with cp.cuda.using_allocator(self._pool.malloc):
                    stream.begin_capture()
                    try:
                        static_out = run(static_in)
                    finally:
                        graph = stream.end_capture()  # raises when the capture was invalidated
                graph.launch(stream)
                same = len(static_out) == len(ref) and all(_bitwise_equal(cp, a, b) for a, b in zip(static_out, ref))
                stream.synchronize()
        if not same:
            raise RuntimeError("the replayed graph's outputs differ from the eager pass")
        self.stats["captured"] += 1
        return _Recorded(graph, static_in, tuple(static_out))

    def _replay(self, rec: _Recorded, xs: list) -> tuple:
        cp = self.cp
        with self.dev:
            stream, caller = self._stream, cp.cuda.get_current_stream()
            stream.wait_event(caller.record())
            with stream:
                for s, x in zip(rec.static_in, xs):
                    cp.copyto(s, x)
                rec.graph.launch(stream)
                outs = tuple(o.copy() for o in rec.static_out)
            caller.wait_event(stream.record())
        self.stats["replays"] += 1
        return outs


_differ_kernel: list = []


def _bitwise_equal(cp: Any, a: Any, b: Any) -> bool:
    """``array_equal(a, b, equal_nan=True)`` by one elementwise kernel that raises a flag (cupy's
    own is a CUB reduction, compiled by NVRTC for each class of array length: seconds per output
    shape on the first capture, on a fresh machine)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind not in "fiub":
        return bool(cp.array_equal(a, b, equal_nan=True))
    if not a.size:
        return True
    if not _differ_kernel:
        _differ_kernel.append(cp.ElementwiseKernel(
            "T a, T b", "raw int32 flag",
            "if (!(a == b || (a != a && b != b))) atomicExch(&flag[0], 1);", "kuiper_xp_differ"))
    flag = cp.zeros((1,), dtype=cp.int32)
    _differ_kernel[0](a, b, flag)
    return not int(flag[0])


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
