"""Per-step Python overhead of the graph executor against PyTorch eager's per-op overhead.

    python benchmarks/bench_overhead.py               # 200 steps on a (1, 8) tensor, numpy
    python benchmarks/bench_overhead.py --steps 400 --size 64 --backend array_api_strict
    python benchmarks/bench_overhead.py --model mlp   # a small classifier: whole-call cost

The model is a chain of ``--steps`` tiny elementwise operators (sigmoid, times 2; ReLU, plus
0.5; ...) on a ``(1, size)`` input, exported by pnnx, so that a call is almost all framework
cost: the runtime's loop, each layer's dispatch, output allocation and the annotation checks.
Prints the median microseconds per call and per step for kuiper-xp and for torch eager
(``torch.no_grad``, same thread count) on the same module and input. ``--model mlp`` times a
small classifier instead (Linear 32-64-64-10 with ReLUs and a softmax, batch 1: the linears
with their activations fused, three steps), where the per-call cost (the pass's set-up, input
checks, output bookkeeping) weighs as much as the steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]


def median_us(fn, repeat: int) -> float:
    for _ in range(max(3, repeat // 10)):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="operators in the chain (default 200)")
    ap.add_argument("--size", type=int, default=8, help="elements per row of the (1, size) input")
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--model", choices=("chain", "mlp"), default="chain",
                    help="chain: --steps tiny elementwise ops (default); mlp: a small classifier")
    args = ap.parse_args(argv)

    import torch
    from helpers import export_torch

    import kuiper_xp

    torch.set_num_threads(args.threads)

    class Chain(torch.nn.Module):
        def forward(self, x):
            for i in range(args.steps // 2):
                x = torch.relu(x) + 0.5 if i % 2 else torch.sigmoid(x) * 2.0
            return x

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)

        def forward(self, x):
            return torch.softmax(self.c(torch.relu(self.b(torch.relu(self.a(x))))), -1)

    torch.manual_seed(0)
    module = (Chain() if args.model == "chain" else MLP()).eval()
    x = torch.randn(1, args.size if args.model == "chain" else 32)
    with tempfile.TemporaryDirectory() as d:
        param = export_torch(module, (x,), Path(d))
        g = kuiper_xp.load(param, backend=args.backend)
    xn = x.numpy()
    steps = len(g.execution_order)
    got = np.asarray(kuiper_xp.to_numpy(g(xn)[0]))
    with torch.no_grad():
        want = module(x).numpy()
        t_torch = median_us(lambda: module(x), args.repeat)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    t_kx = median_us(lambda: g(xn), args.repeat)
    if args.model == "chain":
        ops = args.steps // 2 * 2
        print(f"chain of {ops} torch ops on a (1, {args.size}) input; kuiper-xp runs it as {steps} steps "
              f"on {args.backend}, {args.threads} threads")
    else:
        ops = 6  # three linears, two ReLUs, the softmax
        print(f"MLP 32-64-64-10 (6 torch ops) on a (1, 32) input; kuiper-xp runs it as {steps} steps "
              f"on {args.backend}, {args.threads} threads")
    print(f"kuiper-xp:   {t_kx:8.0f} us per call, {t_kx / steps:5.1f} us per step")
    print(f"torch eager: {t_torch:8.0f} us per call, {t_torch / ops:5.1f} us per op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
