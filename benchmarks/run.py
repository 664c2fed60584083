#!/usr/bin/env python
"""Side-by-side benchmark: kuiper-xp (each backend) against PyTorch eager, onnxruntime and ncnn.

    python benchmarks/run.py                                  # 4 models x batch 1, 8; ~3 min on 2 cores
    python benchmarks/run.py --quick                          # a smoke run: batch 1, 3 runs
    python benchmarks/run.py --models resnet18 --batches 1 --engines kuiper,torch --runs 30

Same model (the zoo's seeded random weights), same input, same thread count for every engine,
engines interleaved round-robin within each repetition; medians, IQR and minimum; each engine's
output compared with torch's; load time (file to first result); peak RSS of a fresh subprocess per
(engine, model, batch) (``--memory``, on by default) and the cupy pool's peak on a GPU. Results go
to ``<out>/<timestamp>.json|.md`` and ``<out>/latest.json|.md``. See benchmarks/README.md.
"""

from __future__ import annotations

import os

# Before numpy/torch/onnxruntime/ncnn are imported: OpenMP workers sleep instead of spinning
# between parallel regions, so that engines interleaved in one process do not steal each
# other's cores (torch and ncnn both use libgomp). A value set by the user is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(HERE), str(REPO), str(REPO / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

ENGINES = ("kuiper", "torch", "torch-cuda", "onnxruntime", "ncnn")
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
#: ``--isa avx2``: the libraries' own switches that keep them off AVX-512 (set before they are
#: imported), to approximate an AVX2 machine (the issue's) on an AVX-512 one. NumPy's SIMD
#: dispatch (names of numpy >= 2.4 and of earlier 2.x; unknown names are ignored), OpenBLAS's
#: kernels (numpy's BLAS), PyTorch's ATen kernels, oneDNN and MKL (torch's convolutions and
#: GEMMs; MKL's also for kuiper-xp's optional numpy+mkl), numba's LLVM target. onnxruntime and ncnn pick their kernels from CPUID and have no such
#: switch: they keep AVX-512 where the CPU has it (the report says so).
ISA_AVX2_ENV = {
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_SKX AVX512_CLX "
                                "AVX512_CNL AVX512_KNL AVX512_KNM",
    "OPENBLAS_CORETYPE": "Haswell",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "NUMBA_CPU_NAME": "haswell",
}
CHILD_TAG = "@@KUIPER_BENCH_CHILD@@"
#: the issue's reference figures (ms; median on the reporter's machine); context only
ISSUE_FIGURES = {
    ("resnet18", 1): {"torch": 33.5, "onnxruntime": 20.6, "ncnn": 18.0},
    ("resnet18", 8): {"torch": 238.0, "onnxruntime": 156.0, "ncnn": 144.0},
    ("mobilenet_v2", 1): {"torch": 21.3, "onnxruntime": 5.3, "ncnn": 7.8},
    ("yolov5n", 1): {"torch": 73.9, "onnxruntime": 34.0, "ncnn": 63.0},
    ("vit_b_32", 1): {"torch": 97.2, "onnxruntime": 59.2, "ncnn": 72.8},
}


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python benchmarks/run.py", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2,yolov5n,vit_b_32",
                    help="zoo model names, comma-separated (vit_b32 is accepted for vit_b_32), or a "
                         "model of your own as path/to/file.py:factory (a function or class in that "
                         "file returning a torch nn.Module; needs --input-shape)")
    ap.add_argument("--input-shape", default=None,
                    help="per-input shape without the batch axis for file.py:factory models, e.g. "
                         "3,224,224 (several inputs: 3,224,224;16); integer or bool inputs as "
                         "DIMS:DTYPE[:HIGH], e.g. token ids 128:int64:30522 (values in [0, HIGH)); "
                         "one value per sample with no DIMS, e.g. a timestep: 3,32,32;:int64:1000")
    ap.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    ap.add_argument("--runs", type=int, default=None,
                    help="timed repetitions per cell (default: 15 at batch 1, 6 above; --quick: 3)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed runs per engine (default 2 at batch 1, 1 above; --quick 1)")
    ap.add_argument("--load-runs", type=int, default=None,
                    help="session creations timed per engine and cell, each on a fresh runner, "
                         "interleaved; 'ready' is their median (default 3; --quick: 1)")
    ap.add_argument("--max-cell-seconds", type=float, default=40.0,
                    help="stop repeating a (model, batch) cell after this long once --min-runs are done")
    ap.add_argument("--min-runs", type=int, default=3)
    ap.add_argument("--engines", default=None,
                    help=f"subset of {','.join(ENGINES)} (default: all of them, torch-cuda only where "
                         "torch sees a CUDA device)")
    ap.add_argument("--backends", default=None,
                    help="kuiper-xp backends (default: numpy, plus numpy+numba where numba is "
                         "installed, numpy+mkl where MKL's library is (pip install mkl) and cupy where "
                         "a CUDA device answers; numpy+numba+mkl is accepted too)")
    mem = ap.add_mutually_exclusive_group()
    mem.add_argument("--memory", dest="memory", action="store_true", default=True,
                     help="peak RSS from a fresh subprocess per (engine, model, batch) (default on)")
    mem.add_argument("--no-memory", dest="memory", action="store_false")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: batch 1 only (unless --batches), 3 runs, 1 warmup, no memory children")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="avx2: keep numpy, OpenBLAS, torch (ATen, oneDNN, MKL) and numba off AVX-512, "
                         "to approximate an AVX2 machine on an AVX-512 one (onnxruntime and ncnn have "
                         "no such switch and still use it); default native")
    ap.add_argument("--out", default=str(HERE / "results"), help="results folder")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
    if args.quick:
        if "--batches" not in given:
            args.batches = "1"
        if "--memory" not in given:
            args.memory = False
    args.models = _csv(args.models)
    args.batches = [int(b) for b in _csv(args.batches)]
    args.engines = _csv(args.engines) if args.engines else None  # default: after set_threads (imports torch)
    bad = [e for e in args.engines or () if e not in ENGINES]
    if bad:
        ap.error(f"unknown engine(s) {bad}; known: {', '.join(ENGINES)}")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.load_runs is None:
        args.load_runs = 1 if args.quick else 3
    if args.load_runs < 1:
        ap.error("--load-runs must be >= 1")
    return args


def runs_for(args, batch: int) -> int:
    if args.runs is not None:
        return args.runs
    if args.quick:
        return 3
    return 15 if batch == 1 else 6


def warmup_for(args, batch: int) -> int:
    if args.warmup is not None:
        return args.warmup
    return 1 if args.quick or batch > 1 else 2


def set_threads(threads: int) -> str:
    """Equal thread counts: env vars before numpy is imported, then threadpoolctl if present.
    Returns a description of the BLAS/OpenMP pools for the report."""
    for v in THREAD_ENV:
        os.environ[v] = str(threads)
    import numpy  # noqa: F401  (after the env vars)

    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return f"env {'/'.join(THREAD_ENV)}={threads} (threadpoolctl not installed)"
    threadpool_limits(limits=threads)
    pools = sorted({f"{p['internal_api']}:{p['num_threads']}" for p in threadpool_info()})
    return f"threadpoolctl limits={threads} ({', '.join(pools)})"


def default_engines() -> list[str]:
    """Every engine; torch-cuda (PyTorch on the GPU, the peer of kuiper[cupy]) only where torch
    sees a CUDA device."""
    out = [e for e in ENGINES if e != "torch-cuda"]
    try:
        import torch

        if torch.cuda.is_available():
            out.insert(2, "torch-cuda")
    except Exception:
        pass
    return out


def default_backends() -> list[str]:
    import importlib.util

    from kuiper_xp.backends import mkl_kernels

    import kuiper_xp

    out = ["numpy"]
    if importlib.util.find_spec("numba") is not None:
        out.append("numpy+numba")  # the optional compiled kernels, beside the default
    if mkl_kernels.find_library() is not None:
        out.append("numpy+mkl")  # the optional MKL paths
    for info in kuiper_xp.list_backends():
        if info.name == "cupy" and info.available:
            out.append("cupy")
    return out


# ---------------------------------------------------------------------------------------------
# statistics


def stats(times_s: list[float]) -> dict:
    import numpy as np

    if not times_s:
        return {}
    ms = np.asarray(times_s) * 1e3
    q1, med, q3 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3), "iqr_ms": float(q3 - q1),
            "min_ms": float(ms.min()), "max_ms": float(ms.max()), "runs": len(ms),
            "times_ms": [round(float(t), 4) for t in ms]}


#: the reference counts as ignoring its input when perturbed inputs move no output by more than
#: this fraction of the outputs' largest magnitude
INSENSITIVE_REL = 1e-6
INSENSITIVE_NOTE = ("torch's outputs did not change when every input was perturbed (a float input mixed with its "
                    "neighbour along the last axis, x + 0.5 * roll(x), an integer one rolled by one element): the "
                    "model (random weights washing the signal out of a deep net?) ignores its input, so the rel "
                    "err column cannot tell a wrong engine from a right one")


def perturbed_inputs(inputs: tuple) -> tuple:
    """The inputs the sensitivity check runs: a float input plus half of itself rolled by one
    element along its last axis (not a permutation, which a set model such as DGCNN or PointNet
    is built to ignore, nor an affine map, which an input normalisation cancels); an integer
    input (token ids) with every value moved to the next one seen, the largest to the smallest
    (not a roll: a bag-of-tokens model, mean-pooled embeddings without positions, ignores the
    order; the ids stay among those the input holds); a bool input (a mask) rolled by one
    element."""
    import numpy as np

    out = []
    for x in inputs:
        if not x.ndim:
            out.append(x)
        elif x.dtype.kind == "f":
            out.append((x + 0.5 * np.roll(x, 1, axis=-1)).astype(x.dtype))
        elif x.dtype.kind in "iu" and x.size:
            seen = np.unique(x)
            out.append(seen[(np.searchsorted(seen, x) + 1) % seen.size].astype(x.dtype))
        else:
            out.append(np.roll(x, 1, axis=-1))
    return tuple(out)


def insensitive_reference(runner, inputs: tuple, ref: list) -> bool:
    """Whether the reference engine's float outputs stay within INSENSITIVE_REL of ``ref`` when
    the inputs are perturbed (:func:`perturbed_inputs`; a model whose random weights wash the
    input out, as a deep net of default-initialised layers can, passes any engine's check).
    False when nothing can be compared (no float output, inputs the perturbation leaves alone)."""
    import numpy as np

    shifted = perturbed_inputs(inputs)
    if all(np.array_equal(a, b) for a, b in zip(shifted, inputs)):
        return False
    outs = [np.asarray(o) for o in runner.outputs(runner.run(runner.prepare(shifted)))]
    pairs = [(a, b) for a, b in zip(ref, outs) if a.dtype.kind == "f" and a.size and a.shape == b.shape]
    if not pairs:
        return False
    with np.errstate(invalid="ignore"):
        scale = max(float(np.abs(a).max()) for a, _ in pairs)
        diff = max(float(np.abs(a - b).max()) for a, b in pairs)
    return scale > 0 and diff <= INSENSITIVE_REL * scale  # (NaN compares False)


def rel_error(outs: list, ref: list, exact_shape: bool = True) -> tuple[float | None, str]:
    """max |out - ref| / max |ref| over the finite values of all outputs; an error string on a
    count or shape mismatch (``exact_shape=False``: only the sizes must agree, for ncnn, which has
    no batch axis) or where the non-finite values (NaN, +-inf) are not torch's."""
    import numpy as np

    if len(outs) != len(ref):
        return None, f"{len(outs)} outputs, torch has {len(ref)}"
    worst = 0.0
    for i, (a, r) in enumerate(zip(outs, ref)):
        a = np.asarray(a)
        if a.size != r.size or (exact_shape and a.shape != r.shape):
            return None, f"output {i}: shape {a.shape}, torch {r.shape}"
        a = a.reshape(r.shape).astype(np.float64)
        r64 = r.astype(np.float64)
        fa, fr = np.isfinite(a), np.isfinite(r64)
        if not (np.array_equal(fa, fr) and np.array_equal(np.isnan(a), np.isnan(r64))
                and np.array_equal(a[~fa & ~np.isnan(a)], r64[~fr & ~np.isnan(r64)])):
            return None, f"output {i} has non-finite values where torch has others"
        a, r64 = a[fr], r64[fr]
        scale = float(np.max(np.abs(r64))) if r64.size else 0.0
        diff = float(np.max(np.abs(a - r64))) if r64.size else 0.0
        worst = max(worst, diff / (scale if scale > 0 else 1.0))
    return worst, ""


# ---------------------------------------------------------------------------------------------
# one (model, batch) cell, all engines interleaved


def bench_cell(spec, files, batch: int, engines: list[tuple[str, str | None]], args, log) -> dict:
    import numpy as np
    import torch
    from models import flatten, one_line
    from peers import engine_label, make_runner

    inputs = tuple(t.numpy() for t in spec.inputs(batch))
    entries: dict[str, dict] = {}
    active = []  # (label, runner, prepared)

    # torch first: its output is the reference for every engine
    ordered = sorted(engines, key=lambda e: e[0] != "torch")
    ref = None
    ref_note = ""
    for engine, backend in ordered:
        runner = None
        try:
            runner = make_runner(engine, args.threads, backend)
            label = runner.label
            entry = entries[label] = {"label": label, "engine": engine, "backend": backend,
                                      "error": "", "note": runner.note}
            if engine == "kuiper" and batch != 1 and files.pnnx_param is not None \
                    and spec.dynamic_batch is None:
                raise RuntimeError("static export: batch 1 only")
            t0 = time.perf_counter()
            runner.load(files, spec)
            entry["ready_s"] = time.perf_counter() - t0  # file to runnable (session creation)
            entry["ready_runs"] = [entry["ready_s"]]  # (more after the timed runs: load_again)
            prepared = runner.prepare(inputs)
            raw = runner.run(prepared)
            entry["load_s"] = time.perf_counter() - t0  # file to first result
            outs = runner.outputs(raw)
            if engine == "torch":
                ref = [np.asarray(o) for o in outs]
                try:
                    if insensitive_reference(runner, inputs, ref):
                        ref_note = INSENSITIVE_NOTE
                        log(f"    note: {ref_note}")
                except Exception as exc:  # (the check is advisory: a model it cannot run is still timed)
                    log(f"    (input-sensitivity check skipped: {one_line(exc)})")
            active.append((label, runner, prepared, outs))
        except Exception as exc:
            label = runner.label if runner is not None else f"{engine}[{backend}]" if backend else engine
            entries.setdefault(label, {"label": label, "engine": engine, "backend": backend, "note": ""})
            entries[label]["error"] = one_line(exc)
            log(f"    {label}: ERROR {one_line(exc)}")
            if runner is not None:
                runner.close()
    no_ref = ""
    if ref is None:  # torch not benchmarked: still the reference
        try:
            with torch.no_grad():
                ref = [t.contiguous().numpy() for t in flatten(spec.build().eval()(*map(torch.from_numpy, inputs)))]
        except Exception as exc:  # (torch cannot run the model on these inputs: a row, not a crash)
            no_ref = f"no torch reference: {one_line(exc)}"
            log(f"    {no_ref}")
    for label, _runner, _p, outs in active:
        if ref is None:
            entries[label]["rel_err"], entries[label]["check"] = None, no_ref
            continue
        err, why = rel_error(outs, ref, exact_shape=not label.startswith("ncnn"))
        entries[label]["rel_err"] = err
        if why:
            entries[label]["check"] = why
    active = [(label, r, p) for label, r, p, _ in active]

    def drop(label, exc):
        nonlocal active
        entries[label]["error"] = one_line(exc)
        log(f"    {label}: ERROR {one_line(exc)}")
        for lab, r, _ in active:
            if lab == label:
                r.close()
        active = [a for a in active if a[0] != label]

    # warm-up, interleaved
    for _ in range(warmup_for(args, batch)):
        for label, r, p in list(active):
            try:
                r.run(p)
            except Exception as exc:
                drop(label, exc)

    # timed repetitions: round robin, the starting engine rotates every repetition
    times: dict[str, list[float]] = {label: [] for label, _, _ in active}
    n_runs = runs_for(args, batch)
    t_cell = time.perf_counter()
    for i in range(n_runs):
        k = i % max(len(active), 1)
        for label, r, p in list(active[k:] + active[:k]):
            try:
                t0 = time.perf_counter()
                r.run(p)
                times[label].append(time.perf_counter() - t0)
            except Exception as exc:
                drop(label, exc)
        if i + 1 >= args.min_runs and time.perf_counter() - t_cell > args.max_cell_seconds:
            log(f"    stopped after {i + 1} of {n_runs} runs (--max-cell-seconds {args.max_cell_seconds:g})")
            break
    load_again(args, files, spec, [entries[label] for label, _, _ in active], log)
    for label, r, _ in active:
        entries[label].update(stats(times[label]))
        mem = r.memory()
        if mem:
            entries[label]["gpu_pool"] = mem
        r.close()
    del active
    gc.collect()
    order = [engine_label(e, b) for e, b in engines]
    rows = sorted(entries.values(), key=lambda e: order.index(e["label"]) if e["label"] in order else len(order))
    cell = {"model": spec.name, "batch": batch, "input_shapes": [list(x.shape) for x in inputs], "entries": rows}
    if ref_note:
        cell["reference_note"] = ref_note
    return cell


def load_again(args, files, spec, engines: list[dict], log) -> None:
    """``--load-runs`` - 1 more session creations per engine, each on a fresh runner (made, like
    the first, outside the timing) that is closed at once; the engines take turns, the first
    rotating. An entry's ``ready_s`` becomes the median of all its creations (one load of a
    2-vCPU VM moved by up to 2x between calls), ``ready_runs`` keeps them."""
    from models import one_line
    from peers import make_runner

    for j in range(args.load_runs - 1):
        k = j % max(len(engines), 1)
        for entry in engines[k:] + engines[:k]:
            fresh = None
            try:
                fresh = make_runner(entry["engine"], args.threads, entry["backend"])
                t0 = time.perf_counter()
                fresh.load(files, spec)
                entry["ready_runs"].append(time.perf_counter() - t0)
            except Exception as exc:  # (it loaded once: keep that figure, say why not again)
                log(f"    {entry['label']}: load again failed: {one_line(exc)}")
            finally:
                if fresh is not None:
                    fresh.close()
                del fresh
                gc.collect()
    for entry in engines:
        runs = entry.get("ready_runs")
        if runs:
            entry["ready_s"] = statistics.median(runs)


# ---------------------------------------------------------------------------------------------
# --memory: a fresh process per (engine, model, batch)


def child_main(spec_json: str) -> int:
    """Run in a fresh interpreter: import one engine, load, run; report peak RSS as JSON."""
    cfg = json.loads(spec_json)
    set_threads(cfg["threads"])
    import numpy as np
    from models import ModelFiles, resolve_model
    from peers import make_runner

    def maxrss_bytes() -> int:
        # Linux keeps ru_maxrss across execve, so a child of a big parent would start at the
        # parent's peak: VmHWM (this address space's high-water mark) is exact there.
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(r) if sys.platform == "darwin" else int(r) * 1024

    files = ModelFiles(**{k: (Path(v) if k in ("pnnx_param", "onnx", "ncnn_param", "ncnn_bin") and v else v)
                          for k, v in cfg["files"].items()})
    files.ncnn_inputs, files.ncnn_outputs = tuple(files.ncnn_inputs), tuple(files.ncnn_outputs)
    with np.load(cfg["inputs"]) as z:
        inputs = tuple(z[f"in{i}"] for i in range(int(z["n"])))
    engine = cfg["engine"]
    # import the engine's library before the baseline so that the delta is the model's own cost
    if engine == "kuiper":
        import kuiper_xp.runtime.graph  # noqa: F401
    elif engine in ("torch", "torch-cuda"):
        import torch  # noqa: F401
    elif engine == "onnxruntime":
        import onnxruntime  # noqa: F401
    elif engine == "ncnn":
        import ncnn  # noqa: F401
    spec = resolve_model(cfg["model"], cfg.get("input_shape")) if engine in ("torch", "torch-cuda") else None
    out: dict = {"baseline_rss": maxrss_bytes()}
    try:
        r = make_runner(engine, cfg["threads"], cfg.get("backend"))
        # the engine's start-up (kuiper-xp: its backend, and numba's kernels compiled or loaded
        # from their cache) is not the model's cost either: the baseline comes after it
        out["baseline_rss"] = maxrss_bytes()
        t0 = time.perf_counter()
        r.load(files, spec)
        p = r.prepare(inputs)
        r.run(p)
        out["load_s"] = time.perf_counter() - t0
        for _ in range(cfg["runs"]):
            r.run(p)
        out["gpu_pool"] = r.memory()
    except Exception as exc:
        from models import one_line

        out["error"] = one_line(exc)
    out["peak_rss"] = maxrss_bytes()
    print(CHILD_TAG + json.dumps(out), flush=True)
    return 0


def measure_memory(spec, model_arg: str, files, batch: int, entry: dict, args, tmpdir: Path, log) -> None:
    import dataclasses

    import numpy as np

    npz = tmpdir / f"{spec.name}-b{batch}.npz"
    if not npz.is_file():
        inputs = tuple(t.numpy() for t in spec.inputs(batch))
        np.savez(npz, n=len(inputs), **{f"in{i}": x for i, x in enumerate(inputs)})
    fdict = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(files).items()}
    cfg = {"engine": entry["engine"], "backend": entry.get("backend"), "model": model_arg,
           "input_shape": args.input_shape,
           "threads": args.threads, "runs": 1, "inputs": str(npz), "files": fdict}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", json.dumps(cfg)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_TAG)), None)
        if line is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            entry["memory_error"] = f"child exited {proc.returncode}: {tail[:200]}"
            return
        res = json.loads(line[len(CHILD_TAG):])
    except subprocess.TimeoutExpired:
        entry["memory_error"] = "child timed out"
        return
    if "error" in res:
        entry["memory_error"] = res["error"]
    entry["peak_rss_mib"] = res["peak_rss"] / 2**20
    entry["rss_delta_mib"] = (res["peak_rss"] - res["baseline_rss"]) / 2**20
    if "load_s" in res:
        entry["load_fresh_s"] = res["load_s"]
    if res.get("gpu_pool"):
        entry["gpu_pool_child"] = res["gpu_pool"]


# ---------------------------------------------------------------------------------------------
# report


def ratios(cell: dict) -> dict:
    """kuiper[b] / peer, on medians."""
    ok = {e["label"]: e for e in cell["entries"] if e.get("median_ms") and not e.get("error")}
    out = {}
    for k, ke in ok.items():
        if ke["engine"] != "kuiper":
            continue
        for p, pe in ok.items():
            if pe["engine"] != "kuiper":
                out[f"{k}/{p}"] = ke["median_ms"] / pe["median_ms"]
    return out


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _f(v, fmt="{:.2f}", none="–"):
    return none if v is None else fmt.format(v)


def _load(e: dict) -> str:
    if e.get("ready_s") is None:
        return _f(e.get("load_s"), "{:.3f}")
    return f"{e['ready_s']:.3f} / {_f(e.get('load_s'), '{:.3f}')}"


def _load_table(result: dict) -> list[str]:
    """Load times of each kuiper-xp entry against onnxruntime's, both ways of counting."""
    rows = []
    for c in result["cells"]:
        by = {e["label"]: e for e in c["entries"] if not e.get("error")}
        ort = by.get("onnxruntime")
        if ort is None or ort.get("ready_s") is None:
            continue
        for e in by.values():
            if e["engine"] != "kuiper" or e.get("ready_s") is None:
                continue
            rows.append(f"| {c['model']} | {c['batch']} | {e['label']} | {e['ready_s']:.3f} | "
                        f"{ort['ready_s']:.3f} | {e['ready_s'] / ort['ready_s']:.2f} | {e['load_s']:.3f} | "
                        f"{ort['load_s']:.3f} | {e['load_s'] / ort['load_s']:.2f} |")
    if not rows:
        return []
    return ["", "## Load time, kuiper-xp / onnxruntime (s)", "",
            "ready = file to runnable (onnxruntime: session creation), the median of --load-runs; "
            "first = file to first result (one).", "",
            "| model | batch | engine | ready | ort ready | ratio | first | ort first | ratio |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|"] + rows


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"# kuiper-xp side-by-side benchmark ({m['timestamp']})", "",
             f"- machine: {m['cpu']} ({m['cpu_count']} logical CPUs), {m['platform']}",
             f"- threads per engine: {m['threads']}; OMP_WAIT_POLICY={m['omp_wait_policy']}; {m['blas']}",
             f"- versions: {', '.join(f'{k} {v}' for k, v in m['versions'].items())}",
             *([f"- ISA limited to AVX2 (`--isa avx2`: {', '.join(f'{k}={v}' for k, v in m['isa_env'].items())}); "
                "onnxruntime and ncnn have no such switch and use AVX-512 where the CPU has it"]
               if m.get("isa") == "avx2" else []),
             f"- runs: {m['runs']} (warm-up {m['warmup']}), engines interleaved round-robin; "
             "time = median, IQR = q3 - q1 (ms)",
             "- rel err = max|out - torch| / max|torch| over all outputs; load = ready / first: file to "
             "runnable (kuiper-xp: parse + build; onnxruntime: session creation; ncnn: load_param + "
             f"load_model; torch: module construction; the median of {m.get('load_runs', 1)} per engine, "
             "each on a fresh runner, engines interleaved) / file to first result (the first of "
             "them + the first run)",
             ("- peak RSS = high-water RSS (VmHWM) of a fresh process per (engine, model, batch); "
              "Δ = above the same process after importing the engine and reading the input"
              if m.get("memory") else "- peak RSS: not measured in this run (--no-memory or --quick)"), ""]
    notes = set()
    for cell in result["cells"]:
        lines += [f"## {cell['model']}, batch {cell['batch']} (input {' '.join('x'.join(map(str, s)) for s in cell['input_shapes'])})",
                  "", "| engine | median ms | IQR ms | min ms | runs | rel err | load s (ready / first) | peak RSS MiB (Δ) | kuiper/engine | note |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        kuipers = [e for e in cell["entries"] if e["engine"] == "kuiper" and e.get("median_ms")]
        for e in cell["entries"]:
            if e.get("error"):
                lines.append(f"| {e['label']} | error | | | | | | | | {e['error'].replace('|', '/')} |")
                continue
            mem = "–"
            if e.get("peak_rss_mib") is not None:
                mem = f"{e['peak_rss_mib']:.0f} ({e['rss_delta_mib']:+.0f})"
            gpu = e.get("gpu_pool") or {}
            note = ""
            if e.get("note") and cell["batch"] > 1:
                notes.add(f"{e['label']}: {e['note']}")
                note = "see notes"
            if e.get("check"):
                note = (note + "; " if note else "") + e["check"]
            if e.get("memory_error"):
                note = (note + "; " if note else "") + "memory: " + e["memory_error"]
            if gpu:
                pool = "torch CUDA allocator peak" if e["engine"] == "torch-cuda" else "cupy pool"
                note = (note + "; " if note else "") + f"{pool} {gpu.get('total_bytes', 0) / 2**20:.0f} MiB"
            rat = ", ".join(f"{k['label']}: {k['median_ms'] / e['median_ms']:.2f}" for k in kuipers
                            if e["engine"] != "kuiper") or "–"
            lines.append(f"| {e['label']} | {e['median_ms']:.2f} | {e['iqr_ms']:.2f} | {e['min_ms']:.2f} | "
                         f"{e['runs']} | {_f(e.get('rel_err'), '{:.1e}')} | {_load(e)} | {mem} | "
                         f"{rat} | {note.replace('|', '/')} |")
        if cell.get("reference_note"):
            lines += ["", f"**Note:** {cell['reference_note']}."]
        ref = ISSUE_FIGURES.get((cell["model"], cell["batch"]))
        if ref:
            lines.append("")
            lines.append("Issue's reference figures (other machine, context only): "
                         + ", ".join(f"{k} {v} ms" for k, v in ref.items()))
        lines.append("")
    # summary of medians
    labels: list[str] = []
    for cell in result["cells"]:
        for e in cell["entries"]:
            if e["label"] not in labels and e["engine"] != "all":
                labels.append(e["label"])
    lines += ["## Summary: median ms", "", "| model | batch | " + " | ".join(labels) + " |",
              "|---|---:|" + "---:|" * len(labels)]
    for cell in result["cells"]:
        by = {e["label"]: e for e in cell["entries"]}
        row = []
        for lab in labels:
            e = by.get(lab)
            if e is None and "all" in by:
                e = by["all"]
            row.append("n/a" if e is None else "error" if e.get("error") else _ms(e["median_ms"]))
        lines.append(f"| {cell['model']} | {cell['batch']} | " + " | ".join(row) + " |")
    # (in the order the engines ran: the default numpy backend first, as in the tables above;
    # a pair with an engine that failed everywhere keeps its column, marked "error")
    def pairs(c: dict) -> list[tuple[str, dict, dict]]:
        es = c["entries"]
        return [(f"{k['label']}/{p['label']}", k, p) for k in es if k.get("engine") == "kuiper"
                for p in es if p.get("engine") not in ("kuiper", "all")]

    rat_keys = list(dict.fromkeys([k for c in result["cells"] for k in c["ratios"]]
                                  + [key for c in result["cells"] for key, _, _ in pairs(c)]))
    if rat_keys:
        lines += ["", "## Ratios kuiper-xp / peer (medians; < 1 means kuiper-xp is faster)", "",
                  "| model | batch | " + " | ".join(rat_keys) + " |", "|---|---:|" + "---:|" * len(rat_keys)]
        for c in result["cells"]:
            failed = {key for key, k, p in pairs(c) if k.get("error") or p.get("error")}
            lines.append(f"| {c['model']} | {c['batch']} | "
                         + " | ".join("error" if k not in c["ratios"] and k in failed else _f(c["ratios"].get(k))
                                      for k in rat_keys) + " |")
    lines += _load_table(result)
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in sorted(notes)]
    return "\n".join(lines) + "\n"


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("kuiper-xp", "numpy", "torch", "onnxruntime", "ncnn", "pnnx", "cupy-cuda12x", "cupy-cuda13x"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            if pkg == "kuiper-xp":
                import kuiper_xp

                out[pkg] = kuiper_xp.__version__ + " (source)"
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._child:
        return child_main(args._child)
    if args.isa == "avx2":  # before numpy/torch/numba are imported; memory children inherit it
        os.environ.update(ISA_AVX2_ENV)
    blas = set_threads(args.threads)

    import torch

    if args.engines is None:
        args.engines = default_engines()

    torch.set_num_threads(args.threads)
    from models import model_files, resolve_model

    def log(msg: str) -> None:
        print(msg, flush=True)

    backends = _csv(args.backends) if args.backends else default_backends()
    engines: list[tuple[str, str | None]] = []
    for e in args.engines:
        if e == "kuiper":
            engines += [("kuiper", b) for b in backends]
        else:
            engines.append((e, None))
    engine_names = {e for e, _ in engines}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result = {"meta": {
        "timestamp": stamp, "argv": sys.argv[1:] if argv is None else list(argv),
        "threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "blas": blas,
        "isa": args.isa, "isa_env": ISA_AVX2_ENV if args.isa == "avx2" else {},
        "runs": "custom" if args.runs else ("3" if args.quick else "15 at batch 1, 6 above"),
        "warmup": args.warmup if args.warmup is not None else ("1" if args.quick else "2 at batch 1, 1 above"),
        "load_runs": args.load_runs,
        "max_cell_seconds": args.max_cell_seconds, "memory": args.memory,
        "cpu": cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "versions": versions(), "backends": backends,
        "engines": [f"kuiper[{b}]" if e == "kuiper" else e for e, b in engines]},
        "cells": []}
    if args.runs:
        result["meta"]["runs"] = str(args.runs)
    # the command line's mistakes (an unknown model, a file without :factory, a missing or
    # malformed --input-shape, one that does not fit the model's forward) stop the run before
    # any work, as argparse's own errors do; a model that fails later is a row of the report
    specs = []
    for name in args.models:
        try:
            spec = resolve_model(name, args.input_shape)
            if ".py:" in name:  # (a model of your own: built once here, so that its errors come now)
                spec.build()
        except Exception as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else f"{type(exc).__name__}: {exc}"
            print(f"{Path(sys.argv[0]).name}: error: {msg}", file=sys.stderr)
            return 2
        specs.append((name, spec))
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kuiper-bench-") as tmp:
        for name, spec in specs:
            log(f"[{spec.name}] exports")
            files = model_files(spec, engine_names)
            for batch in args.batches:
                t0 = time.perf_counter()
                log(f"[{spec.name} b{batch}] timing {', '.join(l for l in result['meta']['engines'])}")
                cell = bench_cell(spec, files, batch, engines, args, log)
                if args.memory:
                    for e in cell["entries"]:
                        if not e.get("error"):
                            measure_memory(spec, name, files, batch, e, args, Path(tmp), log)
                cell["ratios"] = ratios(cell)
                result["cells"].append(cell)
                for e in cell["entries"]:
                    if not e.get("error"):
                        log(f"    {e['label']:18s} {e['median_ms']:9.2f} ms  iqr {e['iqr_ms']:7.2f}  "
                            f"min {e['min_ms']:8.2f}  n={e['runs']}  rel err {_f(e.get('rel_err'), '{:.1e}')}"
                            f"  load {_f(e.get('ready_s'), '{:.3f}')}/{_f(e.get('load_s'), '{:.3f}')} s"
                            + (f"  peak RSS {e['peak_rss_mib']:.0f} MiB" if 'peak_rss_mib' in e else ""))
                log(f"    ({time.perf_counter() - t0:.0f} s)")
    result["meta"]["wall_s"] = round(time.perf_counter() - t_all, 1)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md_text = markdown(result)
    for stem in (stamp, "latest"):
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / f"{stem}.md").write_text(md_text)
    print()
    print(md_text)
    print(f"wrote {out / (stamp + '.json')}, {out / (stamp + '.md')} and latest.* "
          f"({result['meta']['wall_s']:.0f} s)")
    timed = any(not e.get("error") for c in result["cells"] for e in c["entries"])
    if not timed:
        print("error: nothing was timed (every model or engine failed: see the error rows)", file=sys.stderr)
    return 0 if timed else 1


if __name__ == "__main__":
    raise SystemExit(main())
