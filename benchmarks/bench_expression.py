"""Per-call cost of the pnnx.Expression layer against the array library's own arithmetic.

    python benchmarks/bench_expression.py                 # numpy, 1x64x56x56 float32
    python benchmarks/bench_expression.py --backend array_api_strict --repeat 200

For each case it times ``layer.forward(a, b, ...)`` (the compiled program of a layer built from a
.param line, as the runtime calls it) and the same computation written directly with the
backend's operators, and prints min and median microseconds per call and the ratio
layer/direct (min over median-of-blocks). Also times erf: the numpy fast path against the
generic Array-API implementation. The CuPy path is not covered here (no GPU on the machine this
was written on).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kuiper_xp.backends import get_backend  # noqa: E402

from kuiper_xp.layers.base import BuildContext  # noqa: E402
from kuiper_xp.layers.registry import registry  # noqa: E402
from kuiper_xp.pnnx.param import parse_param_text  # noqa: E402


def build_layer(expr: str, n_inputs: int, backend):
    lines = [f"pnnx.Input in{k} 0 1 {k}" for k in range(n_inputs)]
    ins = " ".join(str(k) for k in range(n_inputs))
    lines.append(f"pnnx.Expression e {n_inputs} 1 {ins} out expr={expr}")
    lines.append("pnnx.Output o 1 0 out")
    model = parse_param_text(f"7767517\n{len(lines)} {n_inputs + 1}\n" + "\n".join(lines) + "\n")
    op = next(o for o in model.operators if o.type == "pnnx.Expression")
    return registry.create(op, BuildContext(backend))


def timeit(fn, args, repeat: int, number: int) -> tuple[float, float]:
    """(min, median) seconds per call over ``repeat`` blocks of ``number`` calls."""
    fn(*args)
    per = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*args)
        per.append((time.perf_counter() - t0) / number)
    return min(per), statistics.median(per)


CASES = [
    ("add(@0,@1)", 2, lambda xp: lambda a, b: a + b),
    ("sqrt(div(add(mul(@0,2),@1),12))", 2, lambda xp: lambda a, b: xp.sqrt((a * 2 + b) / 12)),
    ("add(add(mul(@0,@1),mul(@2,add(add(add(@0,@2),@3),@4))),@5)", 6,
     lambda xp: lambda a, b, c, d, e, f: a * b + c * (a + c + d + e) + f),
    ("add(mul(@0,0.5),1)", 1, lambda xp: lambda a: a * 0.5 + 1),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--shape", default="1,64,56,56")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--number", type=int, default=20)
    args = ap.parse_args(argv)
    backend = get_backend(args.backend)
    xp = backend.xp
    shape = tuple(int(s) for s in args.shape.split(","))
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(shape).astype(np.float32) for _ in range(6)]
    arrays = [backend.asarray(h) for h in host]
    print(f"backend {backend.name} ({backend.description}), shape {shape} float32, "
          f"{args.repeat} blocks of {args.number} calls")
    print(f"{'expression':<62} {'layer us':>10} {'direct us':>10} {'ratio':>7}")
    for expr, n, direct in CASES:
        layer = build_layer(expr, n, backend)
        ins = arrays[:n]
        got, want = backend.to_numpy(layer.forward(*ins)), backend.to_numpy(direct(xp)(*ins))
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True), expr
        lmin, lmed = timeit(layer.forward, ins, args.repeat, args.number)
        dmin, dmed = timeit(direct(xp), ins, args.repeat, args.number)
        print(f"{expr:<62} {lmin * 1e6:>10.1f} {dmin * 1e6:>10.1f} {lmin / dmin:>7.3f}"
              f"   (median {lmed * 1e6:.1f} vs {dmed * 1e6:.1f}: {lmed / dmed:.3f})")
    # erf: one fast path (numpy) against the generic Array-API implementation
    from kuiper_xp.expression.functions import erf, erf_generic

    x = arrays[0]
    gmin, _ = timeit(lambda a: erf_generic(a, xp), (x,), max(3, args.repeat // 10), 2)
    fmin, _ = timeit(lambda a: erf(a, xp), (x,), max(3, args.repeat // 10), 2)
    print(f"{'erf: public erf() (fast path where there is one)':<62} {fmin * 1e6:>10.1f} "
          f"{gmin * 1e6:>10.1f} {fmin / gmin:>7.3f}   (vs generic Array-API erf)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
