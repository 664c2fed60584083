"""Throughput of kuiper_xp.dask versus the number of local worker processes.

    python benchmarks/bench_dask.py [--model mobilenet_v2] [--items 256] [--chunk 16] [--workers 1,2]

Runs the model over ``--items`` random inputs chunked along the batch axis: once in this process
(numpy backend, BLAS limited to 1 thread, the way a Dask worker runs), then on a LocalCluster of
each worker count (processes, 1 thread each). Prints items/s and the speed-up over one worker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet_v2", help="a tests/zoo model name or a .pnnx.param path")
    p.add_argument("--items", type=int, default=256)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--workers", default="1,2")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*Sending large graph.*")

    import dask.array as da
    from distributed import Client, LocalCluster
    from threadpoolctl import threadpool_limits

    import kuiper_xp
    import kuiper_xp.dask as kxd

    if args.model.endswith(".param"):
        param = Path(args.model)
    else:
        from zoo import get_spec
        from zoo.export import export

        get_spec(args.model)
        param = export(args.model, dynamic=True)
    g = kuiper_xp.load(param, backend="numpy")
    shape = [d if d is not None else 1 for d in g.inputs[0].shape]
    x = np.random.default_rng(0).standard_normal([args.items] + shape[1:]).astype(np.float32)

    with threadpool_limits(1):
        g(x[: args.chunk])
        t0 = time.perf_counter()
        for i in range(0, args.items, args.chunk):
            g(x[i:i + args.chunk])
        single = time.perf_counter() - t0
    print(f"model {param.name}, {args.items} items in chunks of {args.chunk}, {os.cpu_count()} cores")
    print(f"{'single process (1 thread)':28s} {args.items / single:9.1f} items/s")
    base = None
    for n in [int(w) for w in args.workers.split(",")]:
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            dx = da.from_array(x, chunks=(args.chunk,) + x.shape[1:])
            y = kxd.map_model(param, dx)
            y = y[0] if isinstance(y, tuple) else y
            client.compute(kxd.map_model(param, dx[: args.chunk * n]), sync=True)  # load on workers
            t0 = time.perf_counter()
            client.compute(y, sync=True)
            dt = time.perf_counter() - t0
        rate = args.items / dt
        base = base or rate
        print(f"{f'LocalCluster, {n} worker(s)':28s} {rate:9.1f} items/s  ({rate / base:.2f}x one worker)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
