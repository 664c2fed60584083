"""Batch inference on Dask: data larger than one machine, on a cluster of workers.

    >>> import dask.array as da, kuiper_xp.dask as kxd
    >>> x = da.from_zarr(...)                        # (N, 3, 224, 224), chunked along N
    >>> y = kxd.map_model("resnet.pnnx.param", x)    # lazy dask array (N, 1000)
    >>> y.compute()                                  # or y.to_zarr(...) on a cluster

Each worker process loads the model once (a per-process cache keyed by path, file stamp,
backend and device), never with every task: tasks carry only the model path. Chunks run with the
numpy backend by default (``backend="cupy"`` on GPU workers). Results are identical, bit for
bit, to a single-process run over the same chunks with the same thread count (Dask workers run
BLAS single-threaded; a BLAS with more threads, or another batch size, may round differently).

Needs the ``dask`` extra: ``pip install -e '.[dask]' (in the kuiper-xp checkout)``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kuiper_xp.errors import BackendUnavailableError, InputError

try:  # pragma: no cover - exercised by the import itself
    import dask
    import dask.array as da
except ImportError as exc:  # pragma: no cover
    raise BackendUnavailableError(
        f"kuiper_xp.dask needs dask ({exc}); install it with: pip install -e '.[dask]' (in the kuiper-xp checkout)"
    ) from None

__all__ = ["map_model", "map_files", "run_files", "load_cached", "clear_cache"]

_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size)


def load_cached(model: str | os.PathLike, backend: str = "numpy", device: Any = None):
    """The built graph for ``model`` in this process, loading it on first use only."""
    import kuiper_xp

    path = Path(model).resolve()
    key = (str(path), _stamp(path), backend, None if device is None else str(device))
    graph = _cache.get(key)
    if graph is None:
        with _cache_lock:
            graph = _cache.get(key)
            if graph is None:
                graph = kuiper_xp.load(path, backend=backend, device=device)
                _cache[key] = graph
    return graph


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _run_block(block: Any, model: str, backend: str, device: Any) -> tuple[Any, ...]:
    import kuiper_xp

    g = load_cached(model, backend, device)
    outs = g(block)
    return tuple(kuiper_xp.to_numpy(o) for o in outs)


def _probe(model: str, sample: Any, backend: str, device: Any):
    """Output shapes (without batch) and dtypes, from one sample run here on the client."""
    outs = _run_block(sample, model, backend, device)
    return [(o.shape[1:], o.dtype) for o in outs]


def map_model(
    model: str | os.PathLike,
    data: Any,
    *,
    backend: str = "numpy",
    device: Any = None,
    sample: Any | None = None,
) -> Any:
    """Run ``model`` over a Dask array chunked along the batch axis (axis 0).

    Returns a lazy Dask array for a single-output model, or a tuple of them (one per
    ``pnnx.Output``, each sharing the same per-chunk task: the model runs once per chunk).
    Chunks along the other axes are merged first. ``sample`` (one input item with batch 1) lets
    the output shapes be found without reading the first chunk.
    """
    model = str(Path(model).resolve())
    if not isinstance(data, da.Array):
        raise InputError(f"map_model takes a dask.array.Array, got {type(data).__name__}; "
                         "use dask.array.from_array(x, chunks=(n, ...)) first")
    if data.ndim == 0:
        raise InputError("map_model needs a batch axis (axis 0)")
    if any(len(c) > 1 for c in data.chunks[1:]):
        data = data.rechunk({i: -1 for i in range(1, data.ndim)})
    if sample is None:
        sample = data[:1].compute()
    specs = _probe(model, sample, backend, device)
    blocks = data.to_delayed().reshape(-1)
    run = dask.delayed(_run_block, pure=True, nout=len(specs))
    results = [run(b, model, backend, device) for b in blocks]
    outputs = []
    for k, (shape, dtype) in enumerate(specs):
        parts = [da.from_delayed(r[k], shape=(n,) + tuple(shape), dtype=dtype)
                 for r, n in zip(results, data.chunks[0])]
        outputs.append(da.concatenate(parts, axis=0))
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _default_loader(path: str) -> Any:
    from kuiper_xp import io as kio

    return kio.load_array(path)


class ItemLoader:
    """Reads one file as one model input item (no batch axis) on a worker: ``.npy``/``.npz`` or
    an image preprocessed with ``pre``; a leading batch axis of 1 is dropped and the array is cast
    to the input's declared dtype. Picklable, so it travels with the task graph."""

    def __init__(self, spec: Any = None, pre: Any = None):
        self.spec, self.pre = spec, pre

    def __call__(self, path: str) -> Any:
        from kuiper_xp import io as kio

        a = kio.load_array(path, self.spec, self.pre) if self.pre is not None else kio.load_array(path, self.spec)
        shape = getattr(self.spec, "shape", None)
        if shape is not None and a.ndim == len(shape) and a.shape[0] == 1:
            a = a[0]
        dtype = getattr(self.spec, "dtype", None)
        if dtype is not None and str(a.dtype) != dtype:
            a = a.astype(dtype)
        return a


def _run_files(paths: Sequence[str], model: str, backend: str, device: Any,
               loader: Callable[[str], Any]) -> tuple[Any, ...]:
    from kuiper_xp.backends import get_backend

    xp = get_backend("numpy").xp  # host arrays: the files are read into numpy on the worker
    batch = xp.stack([loader(p) for p in paths])
    return _run_block(batch, model, backend, device)


def map_files(
    model: str | os.PathLike,
    paths: Sequence[str | os.PathLike] | Any,
    *,
    batch_size: int = 32,
    backend: str = "numpy",
    device: Any = None,
    loader: Callable[[str], Any] | None = None,
) -> Any:
    """Run ``model`` over input files (each one item without the batch axis: ``.npy``, or an
    image through ``kuiper_xp.io``), read on the workers.

    ``paths`` is a list of paths (returns lazy Dask array(s) with one row per file, in order) or
    a ``dask.bag.Bag`` of paths (returns a Bag of per-file tuples of outputs).
    """
    model = str(Path(model).resolve())
    loader = loader or _default_loader
    try:
        import dask.bag as db
    except ImportError:  # pragma: no cover
        db = None
    if db is not None and isinstance(paths, db.Bag):
        def part(ps):
            ps = list(ps)
            if not ps:
                return []
            outs = _run_files([str(p) for p in ps], model, backend, device, loader)
            return [tuple(o[i] for o in outs) for i in range(len(ps))]

        return paths.map_partitions(part)
    paths = [str(p) for p in paths]
    if not paths:
        raise InputError("map_files got no paths")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    specs = [(o.shape[1:], o.dtype) for o in _run_files(paths[:1], model, backend, device, loader)]
    run = dask.delayed(_run_files, pure=True, nout=len(specs))
    groups = [paths[i:i + batch_size] for i in range(0, len(paths), batch_size)]
    results = [run(g, model, backend, device, loader) for g in groups]
    outputs = []
    for k, (shape, dtype) in enumerate(specs):
        parts = [da.from_delayed(r[k], shape=(len(g),) + tuple(shape), dtype=dtype)
                 for r, g in zip(results, groups)]
        outputs.append(da.concatenate(parts, axis=0))
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def run_files(
    model: str | os.PathLike,
    paths: Sequence[str | os.PathLike],
    *,
    scheduler: str | None = None,
    local_workers: int | None = None,
    batch_size: int = 32,
    backend: str = "numpy",
    progress: bool = True,
    loader: Callable[[str], Any] | None = None,
) -> tuple[Any, ...]:
    """Compute :func:`map_files` on a Dask cluster: ``scheduler`` is an address
    (``tcp://host:8786``) or None with ``local_workers`` for a LocalCluster of that many worker
    processes on this machine. Progress is Dask's own (``distributed.progress``), drawn on
    stderr (Dask draws it on stdout, where the outputs of a command may go)."""
    from distributed import Client, LocalCluster
    from distributed import progress as dask_progress

    cluster = None
    if scheduler is None:
        cluster = LocalCluster(n_workers=local_workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        client = Client(scheduler)
    try:
        outs = map_files(model, paths, batch_size=batch_size, backend=backend, loader=loader)
        outs = outs if isinstance(outs, tuple) else (outs,)
        persisted = client.persist(list(outs))
        if progress:
            with contextlib.redirect_stdout(sys.stderr):
                dask_progress(persisted)
        return tuple(client.compute(list(persisted), sync=True))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
