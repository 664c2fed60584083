"""The ``kuiper-xp`` command (also ``python -m kuiper_xp``).

    kuiper-xp run                      # the bundled digits model on its test set: accuracy, speed
    kuiper-xp run MODEL -i x.npy -o y.npy
    kuiper-xp inspect MODEL [--dot g.dot]
    kuiper-xp bench [MODEL] [--batch 8]
    kuiper-xp backends

:func:`main` takes ``argv`` and returns the exit status (0 success, 1 runtime error, 2 usage
error) instead of exiting, so tests can call it in-process. Errors print one line,
``kuiper-xp: error: ...``; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import kuiper_xp
from kuiper_xp import io as kio
from kuiper_xp.errors import (
    BackendError,
    BackendUnavailableError,
    BinFormatError,
    InputError,
    KuiperXPError,
    OptionError,
    UnsupportedOperatorError,
)
from kuiper_xp.progress import Progress

PROG = "kuiper-xp"
BUNDLED = "digits"
_DATA = "kuiper_xp.data"


class UsageError(Exception):
    """A command line that parses but cannot work (exit status 2)."""


# -- small helpers ----------------------------------------------------------------------------------
class _Out:
    """stdout for results, stderr for notes; ``--quiet`` keeps only results marked essential."""

    def __init__(self, args: argparse.Namespace):
        self.quiet = bool(getattr(args, "quiet", False))
        self.verbose = bool(getattr(args, "verbose", False))

    def say(self, text: str = "", essential: bool = False) -> None:
        if essential or not self.quiet:
            print(text, flush=True)

    def note(self, text: str) -> None:
        if not self.quiet:
            print(f"note: {text}", file=sys.stderr, flush=True)

    def debug(self, text: str) -> None:
        if self.verbose:
            print(f"debug: {text}", file=sys.stderr, flush=True)


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonneg_int = _int_at_least(0, "an integer >= 0")


def _positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {v}")
    return v


def _fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


@dataclass
class _ModelFiles:
    param: Path
    bin: Path | None
    label: str
    bundled: bool


def _resolve_model(text: str) -> Path:
    """A model argument: the ``.pnnx.param`` file, its ``.pnnx.bin``, the common stem
    (``m`` for ``m.pnnx.param``) or a directory holding exactly one ``.pnnx.param``."""
    p = Path(text).expanduser()
    if p.is_dir():
        found = sorted(p.glob("*.pnnx.param")) or sorted(p.glob("*.param"))
        if len(found) == 1:
            return found[0]
        if not found:
            raise InputError(f"directory {text} holds no .pnnx.param model")
        raise InputError(f"directory {text} holds several models ({', '.join(f.name for f in found)}); "
                         "name one")
    if p.is_file():
        if p.name.endswith(".pnnx.bin"):
            q = p.with_name(p.name[: -len(".bin")] + ".param")
            if q.is_file():
                return q
            raise InputError(f"{text} is a weight file and {q.name} is not beside it")
        return p
    for cand in (p.with_name(p.name + ".pnnx.param"), p.with_name(p.name + ".param")):
        if cand.is_file():
            return cand
    raise InputError(f"model file not found: {text}")


@contextlib.contextmanager
def _model_files(model: str | None) -> Iterator[_ModelFiles]:
    """The model's files; with no model, the bundled digits model (package data)."""
    if model is not None:
        yield _ModelFiles(_resolve_model(model), None, model, False)
        return
    res = importlib.resources.files(_DATA)
    with contextlib.ExitStack() as stack:
        param = stack.enter_context(importlib.resources.as_file(res / f"{BUNDLED}.pnnx.param"))
        binp = stack.enter_context(importlib.resources.as_file(res / f"{BUNDLED}.pnnx.bin"))
        yield _ModelFiles(Path(param), Path(binp), f"bundled digits CNN ({BUNDLED}.pnnx.param)", True)


def _bundled_meta() -> dict[str, Any]:
    return json.loads((importlib.resources.files(_DATA) / f"{BUNDLED}_meta.json").read_text("utf-8"))


def _bundled_test_set() -> dict[str, np.ndarray]:
    with (importlib.resources.files(_DATA) / f"{BUNDLED}_test.npz").open("rb") as fh:
        with np.load(fh, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}


def _load_graph(files: _ModelFiles, args: argparse.Namespace):
    load = kuiper_xp.load  # imports the runtime and the layers: not part of the load time
    backend = kuiper_xp.get_backend(args.backend, args.device)  # imports the array library: neither
    t0 = time.perf_counter()
    g = load(files.param, backend=backend, bin_path=files.bin)
    return g, time.perf_counter() - t0


def _backend_line(g) -> str:
    be = g.backend
    return f"{be.name} on {be.device_str()} ({be.description})"


def _softmax(z: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):  # (infinite logits: NaN, as torch's softmax)
        z = z.astype(np.float64)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)


def _topk_lines(logits: np.ndarray, rows: Sequence[tuple[str, int]], k: int, limit: int = 20) -> list[str]:
    """``source: class (score) ...`` for the first ``limit`` rows of an (N, C) output."""
    a = np.asarray(logits)
    if a.dtype.kind not in "fiu" or a.shape[0] == 0:
        return []
    a = a.astype(np.float64)
    is_prob = bool(np.all(a >= 0) and np.allclose(a.sum(axis=1), 1.0, atol=1e-3))
    scores = a if is_prob else _softmax(a)
    k = min(k, a.shape[1])
    order = np.argsort(-a, axis=1, kind="stable")[:, :k]
    names = [src if i < 0 else f"{src}[{i}]" for src, i in rows] if len(rows) == a.shape[0] else \
        [f"row {i}" for i in range(a.shape[0])]
    width = min(max((len(n) for n in names[:limit]), default=0), 48)
    lines = [f"top-{k} ({'probability' if is_prob else 'softmax of the output'}):"]
    for i in range(min(limit, a.shape[0])):
        name = names[i] if len(names[i]) <= width else "..." + names[i][-(width - 3):]
        picks = "  ".join(f"{c} ({scores[i, c]:.3f})" for c in order[i])
        lines.append(f"  {name.ljust(width)}  {picks}")
    if a.shape[0] > limit:
        lines.append(f"  ... {a.shape[0] - limit} more rows (save them all with --output)")
    return lines


def _check_output_path(path: str | None) -> None:
    """Refuse an --output the run could not write, before the model loads and runs."""
    if path is None:
        return
    if Path(path).suffix.lower() not in (".npy", ".npz"):
        raise UsageError(f"--output {path}: the file must end in .npy (one output) or .npz")
    parent = Path(path).parent
    if not parent.is_dir():
        raise UsageError(f"--output {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--output {path}: the directory {parent} is not writable")


# -- run ----------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    out = _Out(args)
    _check_output_path(args.output)
    if args.scheduler or args.dask:
        return _run_on_dask(args, out)
    if args.model is None and not args.input:
        return _run_test_set(args, out)
    if not args.input:
        raise UsageError("give the inputs with --input FILE (.npy, .npz, an image, a directory or a "
                         "quoted glob); with no MODEL, `kuiper-xp run` checks the bundled model")
    with _model_files(args.model) as files:
        g, load_s = _load_graph(files, args)
        specs = g.inputs
        out.say(f"model:       {files.label if files.bundled else files.param}")
        out.say(f"backend:     {_backend_line(g)}")
        mean, std, scale = args.mean, args.std, args.scale
        if files.bundled:  # images for the digits model: its own normalisation
            pre = _bundled_meta()["preprocess"]
            mean = mean if mean is not None else [pre["mean"]]
            std = std if std is not None else [pre["std"]]
        preprocess = kio.Preprocess(
            size=tuple(args.size) if args.size else None,
            mean=tuple(mean) if mean is not None else None,
            std=tuple(std) if std is not None else None,
            scale=scale)
        notes: list[str] = []
        aliases = [(op.name,) for op in g.model.operators if op.type == "pnnx.Input"]
        samples = kio.load_samples(args.input, specs, preprocess, notes, aliases)
        given = [f"--{k}" for k in ("size", "mean", "std") if getattr(args, k) is not None]
        given += ["--scale"] if args.scale != 255.0 else []
        if given and not any(Path(str(src).rpartition("=")[2]).suffix.lower() in kio.IMAGE_EXTS
                             or Path(str(src).rpartition("=")[2]).is_dir() or any(c in str(src) for c in "*?[")
                             for src in args.input):
            notes.append(f"{'/'.join(given)} apply to images only; these inputs are arrays, used as they are")
        for n in notes:
            out.note(n)
        if args.output and Path(args.output).suffix.lower() == ".npy" and len(g.outputs) != 1:
            raise UsageError(f"the model has {len(g.outputs)} outputs "
                             f"({', '.join(s.name for s in g.outputs)}); use an .npz --output")
        batches = list(kio.make_batches(samples, args.batch_size, specs))
        total = sum(b.n for b in batches)
        padded = sum(b.pad for b in batches)
        if padded:
            out.note(f"{padded} zero row(s) padded the input(s) to the model's static batch of "
                     f"{batches[0].n + batches[0].pad} (their outputs are dropped): right for a model "
                     "whose rows do not mix; export with a dynamic batch (inputs2=) to run the rows as they are")
        out.debug(f"{len(samples)} sample(s), {total} row(s) in {len(batches)} batch(es)")
        per_batch: list[list[np.ndarray]] = []
        sync = g.backend.synchronize
        show_bar = None if (len(batches) > 1 and not out.quiet) else False
        t0 = time.perf_counter()
        with Progress(total, "running", enabled=show_bar, unit="inputs") as bar:
            for b in batches:
                outs = g(*b.arrays)
                sync()
                per_batch.append([np.asarray(kuiper_xp.to_numpy(o)) for o in outs])
                bar.update(b.n)
        run_s = time.perf_counter() - t0
        names = [s.name for s in g.outputs]
        outputs = kio.concat_outputs(per_batch, batches, names)
        rows = [r for b in batches for r in b.rows]
        out.say(f"inputs:      {len(samples)} file(s), {total} row(s) in {len(batches)} batch(es)")
        out.say(f"time:        load {_fmt_seconds(load_s)}, run {_fmt_seconds(run_s)} "
                f"({total / max(run_s, 1e-12):,.1f} inputs/s)")
        for name, a in zip(names, outputs):
            out.say(f"output:      {name!r} {_fmt_shape(a.shape)} {a.dtype}")
        if args.output:
            path = kio.save_outputs(args.output, names, outputs)
            out.say(f"wrote:       {path}")
        k = 5 if args.topk is None else args.topk
        if k > 0:
            for name, a in zip(names, outputs):
                if a.ndim == 2 and a.shape[1] > 1:
                    lines = _topk_lines(a, rows, k)
                    if lines:
                        if len(names) > 1:
                            lines[0] = f"output {name!r} " + lines[0]
                        for line in lines:
                            out.say(line, essential=True)
    return 0


def _run_on_dask(args: argparse.Namespace, out: _Out) -> int:
    """``run MODEL --input ... --scheduler ADDRESS`` or ``--dask local``: the inputs are read and
    run on Dask workers (each loads the model once); progress is Dask's own."""
    try:
        import kuiper_xp.dask as kxd
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    if not args.input:
        raise UsageError("--scheduler/--dask need --input files (one input item per file)")
    if args.dask not in (None, "local"):
        raise UsageError(f"--dask takes 'local' (a LocalCluster on this machine), got {args.dask!r}")
    with _model_files(args.model) as files:
        g, _ = _load_graph(files, args)
        if len(g.inputs) != 1:
            raise UsageError(f"--scheduler/--dask run single-input models; this one takes {len(g.inputs)}")
        paths = [str(p) for p in kio.expand_inputs(args.input)]
        pre = kio.Preprocess(size=tuple(args.size) if args.size else None,
                             mean=tuple(args.mean) if args.mean else None,
                             std=tuple(args.std) if args.std else None, scale=args.scale)
        where = args.scheduler or f"a LocalCluster of {args.workers} worker processes"
        out.say(f"model:       {files.param}")
        out.say(f"dask:        {len(paths)} file(s) in batches of {args.batch_size} on {where}")
        t0 = time.perf_counter()
        outputs = kxd.run_files(files.param, paths, scheduler=args.scheduler,
                                local_workers=args.workers, batch_size=args.batch_size,
                                backend=g.backend.name, progress=not out.quiet and sys.stderr.isatty(),
                                loader=kxd.ItemLoader(g.inputs[0], pre))
        run_s = time.perf_counter() - t0
        names = [s.name for s in g.outputs]
        out.say(f"time:        {_fmt_seconds(run_s)} ({len(paths) / max(run_s, 1e-12):,.1f} inputs/s)")
        for name, a in zip(names, outputs):
            out.say(f"output:      {name!r} {_fmt_shape(a.shape)} {a.dtype}")
        if args.output:
            path = kio.save_outputs(args.output, names, list(outputs))
            out.say(f"wrote:       {path}")
    return 0


def _run_test_set(args: argparse.Namespace, out: _Out) -> int:
    """The bundled digits model on its held-out test set: accuracy, agreement with torch, speed."""
    for opt in ("size", "mean", "std"):
        if getattr(args, opt) is not None:
            out.note(f"--{opt} is ignored: the bundled test set is already preprocessed")
    data = _bundled_test_set()
    meta = _bundled_meta()
    images, labels, ref = data["images"], data["labels"], data["torch_logits"]
    with _model_files(None) as files:
        g, load_s = _load_graph(files, args)
    bs = args.batch_size
    sync = g.backend.synchronize
    n = images.shape[0]
    out.say(f"model:       {files.label}, trained with torch {meta.get('torch_version', '?')}, "
            f"exported with pnnx")
    out.say(f"backend:     {_backend_line(g)}")
    out.say(f"test set:    {n} images {_fmt_shape(images.shape[1:])} {images.dtype}, batch size {bs}")
    for _ in range(2):  # warm-up: first-call costs are not throughput (on cupy the second call
        g(images[:bs])  # records the CUDA graph that later calls of this batch size replay)
    sync()
    parts: list[np.ndarray] = []
    show_bar = None if (n > bs and not out.quiet) else False
    t0 = time.perf_counter()
    with Progress(n, "running", enabled=show_bar, unit="images") as bar:
        for lo in range(0, n, bs):
            (y,) = g(images[lo:lo + bs])
            parts.append(np.asarray(kuiper_xp.to_numpy(y)))
            bar.update(min(bs, n - lo))
    sync()
    run_s = time.perf_counter() - t0
    logits = np.concatenate(parts, axis=0)
    pred = np.argmax(logits, axis=1)
    correct = int(np.sum(pred == labels))
    acc = correct / n
    torch_acc = float(np.mean(np.argmax(ref, axis=1) == labels))
    diff = float(np.max(np.abs(logits.astype(np.float64) - ref.astype(np.float64))))
    agree = int(np.sum(pred == np.argmax(ref, axis=1)))
    out.say(f"accuracy:    {acc * 100:.2f}% ({correct}/{n})  [torch: {torch_acc * 100:.2f}%]",
            essential=True)
    out.say(f"vs torch:    max |difference| of logits {diff:.3g}; same class for {agree}/{n} images")
    out.say(f"throughput:  {n / max(run_s, 1e-12):,.0f} images/s ({n} images in {_fmt_seconds(run_s)}, "
            f"after 2 warm-up batches; load {_fmt_seconds(load_s)})")
    if args.output:
        path = kio.save_outputs(args.output, [s.name for s in g.outputs], [logits])
        out.say(f"wrote:       {path} (logits {_fmt_shape(logits.shape)} {logits.dtype})")
    if args.topk:
        rows = [("image", i) for i in range(n)]
        for line in _topk_lines(logits, rows, args.topk, limit=10):
            out.say(line)
    return 0


# -- inspect ------------------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from kuiper_xp import inspect as kinspect
    from kuiper_xp.layers import registry
    from kuiper_xp.pnnx import load_model, parse_param

    out = _Out(args)
    damaged: BinFormatError | None = None
    with _model_files(args.model) as files:
        bin_path = files.bin or _bin_beside(files.param)
        model = None
        if bin_path.is_file():
            try:
                model = load_model(files.param, bin_path)
            except BinFormatError as exc:  # (the table still shows what the .param holds)
                damaged = exc
        if model is None:
            model = parse_param(files.param)
            why = "not found" if damaged is None else f"unreadable ({_message(damaged, 'inspect')})"
            out.note(f"{bin_path.name} {why}: weights are not checked, peak memory not planned")
        summary = kinspect.summarize(model, batch=args.batch, registry=registry)
        peak = None
        if summary.unsupported:
            peak = "n/a (the graph does not build: unsupported operators below)"
        elif bin_path.is_file() and damaged is None:
            peak = _planned_peak(files, bin_path, args)
        out.say(f"model:        {files.label if files.bundled else files.param}")
        out.say(kinspect.format_table(summary), essential=True)
        out.say("")
        out.say(kinspect.format_totals(summary, peak), essential=True)
        if args.dot:
            text = kinspect.to_dot(model, {o.type for o in summary.unsupported},
                                   title=Path(files.param).name)
            Path(args.dot).write_text(text, encoding="utf-8")
            out.say(f"wrote:        {args.dot} (render with: dot -Tsvg {args.dot} -o graph.svg)")
        model.close()
    if damaged is not None:
        raise damaged  # (after the table: the exit status says the file is damaged)
    return 0


def _bin_beside(param: Path) -> Path:
    name = param.name
    return param.with_name(name[: -len(".param")] + ".bin" if name.endswith(".param") else name + ".bin")


def _planned_peak(files: _ModelFiles, bin_path: Path, args: argparse.Namespace) -> str:
    from kuiper_xp.inspect import human_bytes

    try:
        g = kuiper_xp.load(files.param, backend=args.backend, device=args.device, bin_path=bin_path)
    except (BackendError, BackendUnavailableError):
        raise  # the user's --backend / --device: an error of the command, not of the model
    except (KuiperXPError, OSError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return f"n/a (the graph does not build: {type(exc).__name__}: {first})"
    peak = g.planned_peak_bytes(args.batch)
    return (f"{human_bytes(peak)} of live activations at batch {args.batch} ({peak:,} bytes; "
            f"planned from the shape annotations, backend {g.backend.name})")


# -- bench --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _thread_limit(n: int | None) -> Iterator[str]:
    if n is None:
        yield "library default"
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(n)
        yield (f"{n} requested (threadpoolctl is not installed: set OMP_NUM_THREADS before starting "
               "for it to take effect)")
        return
    with threadpool_limits(limits=n):
        yield f"{n} (BLAS/OpenMP pools, threadpoolctl)"


def _parse_shapes(items: Sequence[str] | None, specs, batch: int | None = None) -> dict[str, tuple[int, ...]]:
    """``--shape [NAME=]D0,D1,...`` per input: the whole shape, or (an input with a dynamic batch
    dimension) the shape after the batch, which ``batch`` is put in front of."""
    out: dict[str, tuple[int, ...]] = {}
    by_name = {s.name: s for s in specs}
    for item in items or ():
        name, sep, dims = item.rpartition("=")
        if not sep:
            if len(specs) != 1:
                raise UsageError(f"--shape {item}: the model has {len(specs)} inputs; write NAME=D0,D1,...")
            name = specs[0].name
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            raise UsageError(f"--shape {item}: expected [NAME=]D0,D1,... with integers") from None
        if not shape or any(d < 0 for d in shape):
            raise UsageError(f"--shape {item}: expected [NAME=]D0,D1,... with integers >= 0")
        if name not in by_name:
            raise UsageError(f"--shape {item}: the model has no input {name!r} "
                             f"(inputs: {', '.join(s.name for s in specs)})")
        declared = by_name[name].shape
        if batch is not None and declared and len(shape) == len(declared) - 1 and declared[0] is None:
            shape = (batch,) + shape  # (the shape after the batch dimension: --batch in front)
        out[name] = shape
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    out = _Out(args)
    with _thread_limit(args.threads) as threads, _model_files(args.model) as files:
        g, load_s = _load_graph(files, args)
        be = g.backend
        highs = g.index_input_limits()
        host = kio.random_inputs(g.inputs, args.batch, _parse_shapes(args.shape, g.inputs, args.batch),
                                 seed=args.seed, highs=highs)
        fixed = {a.shape[0] for a, s in zip(host, g.inputs) if a.ndim and s.shape and s.shape[0] is not None}
        if fixed and args.batch not in fixed and args.batch != 1 and all(s.shape and s.shape[0] is not None for s in g.inputs):
            out.note(f"the model's batch is static ({', '.join(map(str, sorted(fixed)))}): --batch {args.batch} "
                     "is not used (export with a dynamic batch, inputs2=, to time other batches)")
        x = [be.asarray(a) for a in host]  # on the device once: transfers are not timed
        for _ in range(args.warmup):
            g(*x)
        be.synchronize()
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            g(*x)
            be.synchronize()
            times.append(time.perf_counter() - t0)
        profiles: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.profile_runs):
            g.forward(*x, profile=True)
            for name, typ, sec in g.last_profile:
                profiles.setdefault((name, typ), []).append(sec)

    med = statistics.median(times)
    q1, q3 = (statistics.quantiles(times, n=4, method="inclusive")[::2] if len(times) > 1
              else (times[0], times[0]))
    rows = host[0].shape[0] if host and host[0].ndim else 1
    out.say(f"model:       {files.label if files.bundled else files.param}")
    out.say(f"backend:     {_backend_line(g)}; threads: {threads}")
    for s, a in zip(g.inputs, host):
        out.say(f"input:       {s.name!r} {_fmt_shape(a.shape)} {a.dtype} (random, seed {args.seed}"
                + (f"; in [0, {highs[s.name]}): indices into a table of that many rows)" if s.name in highs
                   else ")"))
    out.say(f"load:        {_fmt_seconds(load_s)} (parse + build)")
    out.say(f"runs:        {args.runs} timed after {args.warmup} warm-up, backend synchronised after each")
    out.say(f"latency:     median {_fmt_seconds(med)}  IQR {_fmt_seconds(q1)} - {_fmt_seconds(q3)}  "
            f"min {_fmt_seconds(min(times))}  max {_fmt_seconds(max(times))}", essential=True)
    out.say(f"throughput:  {rows / med:,.1f} samples/s at batch {rows}", essential=True)
    if profiles and args.top > 0:
        med_layer = [(statistics.median(v), name, typ) for (name, typ), v in profiles.items()]
        total = sum(m for m, _, _ in med_layer) or 1e-12
        med_layer.sort(key=lambda t: -t[0])
        out.say(f"slowest layers (median of {args.profile_runs} profiled run(s); layers total "
                f"{_fmt_seconds(total)}):")
        shown = med_layer[: args.top]
        wn = max(len(n) for _, n, _ in shown)
        wt = max(len(t) for _, _, t in shown)
        for i, (m, name, typ) in enumerate(shown, 1):
            out.say(f"  {i:2d}. {name.ljust(wn)}  {typ.ljust(wt)}  {_fmt_seconds(m):>10s}  "
                    f"{100 * m / total:5.1f}%")
    return 0


# -- backends -----------------------------------------------------------------------------------------
def cmd_backends(args: argparse.Namespace) -> int:
    out = _Out(args)
    infos = kuiper_xp.list_backends()
    w = max(len(i.name) for i in infos)
    for i in infos:
        if i.available:
            out.say(f"{i.name.ljust(w)}  available    devices: {', '.join(i.devices)}  ({i.description})",
                    essential=True)
        else:
            hint = f"; install: pip install -e '.[{i.extra}]' (in the kuiper-xp checkout)" if i.extra else ""
            out.say(f"{i.name.ljust(w)}  unavailable  {i.reason}{hint}", essential=True)
    env = os.environ.get("KUIPER_XP_BACKEND")
    try:
        default = kuiper_xp.get_backend()
        chosen = f"{default.name} on {default.device_str()}"
    except KuiperXPError as exc:
        chosen = f"none ({_first_line(exc)})"
    how = f"KUIPER_XP_BACKEND={env}" if env else "auto: cupy when a CUDA device answers, else numpy"
    out.say(f"default:     {chosen} ({how}; --backend NAME overrides)")
    numpy_info = next((i for i in infos if i.name == "numpy" and i.available), None)
    if numpy_info is not None:  # the numpy backend's optional fast paths (off by default)
        for name, installed, on, hint in kuiper_xp.get_backend("numpy").fast.optional_paths():
            state = "on" if on else ("installed, off" if installed else "not installed")
            out.say(f"numpy option: {name}: {state} ({hint})")
    return 0


# -- parser -------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("output")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="more detail, and a traceback on errors")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="print only the results (no headers, notes or progress bar)")

    backend = argparse.ArgumentParser(add_help=False)
    b = backend.add_argument_group("backend")
    b.add_argument("--backend", metavar="NAME", default=None,
                   help="numpy, cupy, array_api_strict or auto (default: $KUIPER_XP_BACKEND, else "
                        "auto = cupy when a CUDA device answers, else numpy); see `kuiper-xp backends`")
    b.add_argument("--device", metavar="D", default=None,
                   help="device of that backend: cpu; cuda:0, cuda:1, ... for cupy; CPU_DEVICE or "
                        "device1 for array_api_strict (default: the backend's first)")

    p = argparse.ArgumentParser(
        prog=PROG,
        description="kuiper-xp: run, inspect and benchmark pnnx models (model.pnnx.param + "
                    "model.pnnx.bin) on NumPy, CuPy or array_api_strict.",
        epilog="Run `kuiper-xp COMMAND --help` for a command's options. Exit status: 0 success, "
               "1 runtime error, 2 usage error.")
    p.add_argument("--version", action="version", version=f"%(prog)s {kuiper_xp.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser(
        "run", parents=[backend, common], help="run a model on inputs (no model: check the bundled one)",
        description="Run a pnnx model on inputs and save or summarise its outputs. With no MODEL and "
                    "no --input, run the bundled digits model on its 450-image test set and print "
                    "accuracy, throughput, the backend and device, and the largest difference from "
                    "torch's stored logits.",
        epilog="Inputs: .npy (an array, or a batch of them), .npz (a model with several inputs: one "
               "array per input, keyed by input name or arr_0, arr_1, ...), images (PNG, JPEG, ...; "
               "turned into NCHW float32 as (pixel/SCALE - MEAN)/STD, resized to --size or the "
               "model's declared height and width), a directory of them, or a quoted glob. Several "
               "--input for a multi-input model: one file per input in order, or NAME=FILE. float64 "
               "or integer arrays are cast to the model's declared dtype with a note. Outputs: "
               "--output x.npy (one output) or x.npz (keys = output names); (N, C) outputs get a "
               "top-k summary. A progress bar is drawn on stderr when it is a terminal.")
    r.add_argument("model", nargs="?", metavar="MODEL",
                   help="the model's .pnnx.param (or its stem, or a directory holding one); "
                        "default: the bundled digits model")
    r.add_argument("-i", "--input", action="append", metavar="FILE", default=[],
                   help="input file, directory, quoted glob or NAME=FILE; repeat for more")
    r.add_argument("-o", "--output", metavar="FILE",
                   help="save the outputs: .npy (one output) or .npz (keys = output names)")
    r.add_argument("-b", "--batch-size", type=_positive_int, default=64, metavar="N",
                   help="rows per model call when the batch dimension is dynamic (default: 64)")
    r.add_argument("-k", "--topk", type=_nonneg_int, default=None, metavar="K",
                   help="classes shown per row for (N, C) outputs (default: 5 with --input; 0: none)")
    pre = r.add_argument_group("image preprocessing")
    pre.add_argument("--size", nargs=2, type=_positive_int, metavar=("H", "W"),
                     help="resize images to H x W (default: the model's declared size)")
    pre.add_argument("--mean", nargs="+", type=float, metavar="M",
                     help="subtract after scaling: one value or one per channel (default: none; "
                          "the bundled model's own for it)")
    pre.add_argument("--std", nargs="+", type=float, metavar="S",
                     help="divide by after the mean: one value or one per channel (default: none; "
                          "the bundled model's own for it)")
    pre.add_argument("--scale", type=_positive_float, default=255.0, metavar="S",
                     help="divide pixel values by S first (default: 255, giving [0, 1])")
    d = r.add_argument_group("distributed (needs the dask extra)")
    d.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="run on the Dask cluster at ADDRESS (tcp://host:8786): each --input file "
                        "is one input item, read and run on the workers")
    d.add_argument("--dask", metavar="local", default=None,
                   help="'local': start a LocalCluster of --workers processes on this machine")
    d.add_argument("--workers", type=_positive_int, default=2, metavar="N",
                   help="worker processes for --dask local (default: 2)")
    r.set_defaults(func=cmd_run)

    i = sub.add_parser(
        "inspect", parents=[backend, common], help="operator table, parameters, FLOPs, unsupported ops",
        description="Print the model's operators (type, name, input and output operands with shapes, "
                    "parameter count, estimated FLOPs), totals (parameters, weight bytes, estimated "
                    "FLOPs, planned peak activation memory) and every operator type without a "
                    "registered layer. Nothing is run; the table is printed even when the model "
                    "cannot be built.",
        epilog="FLOPs are an estimate: 2 x the multiply-adds of convolutions, linear layers, matrix "
               "products and attention; other operators are not counted. Dynamic dimensions count "
               "as --batch (the first) or 1 (the others).")
    i.add_argument("model", nargs="?", metavar="MODEL",
                   help="the model's .pnnx.param (default: the bundled digits model)")
    i.add_argument("--dot", metavar="FILE", help="also write the graph for Graphviz (dot -Tsvg FILE)")
    i.add_argument("--batch", type=_positive_int, default=1, metavar="N",
                   help="batch size for FLOPs and peak memory (default: 1)")
    i.set_defaults(func=cmd_inspect)

    be = sub.add_parser(
        "bench", parents=[backend, common], help="time a model on random inputs",
        description="Benchmark a model on seeded random inputs of its declared shapes (the dynamic "
                    "batch dimension = --batch): load time, --warmup untimed runs, --runs timed runs "
                    "with the backend synchronised after each (median, IQR, min, max), and a "
                    "per-layer profile of the slowest layers. No MODEL: the bundled digits model.",
        epilog="Inputs are created on the device before timing, so host-device transfers are not "
               "counted; outputs stay on the device. Floats are standard normal, integers in [0, 10) "
               "or, for token ids and classes, under the size of the embedding table or one_hot "
               "they index.")
    be.add_argument("model", nargs="?", metavar="MODEL",
                    help="the model's .pnnx.param (default: the bundled digits model)")
    be.add_argument("--batch", type=_positive_int, default=1, metavar="N",
                    help="size of a dynamic batch dimension (default: 1)")
    be.add_argument("--warmup", type=_nonneg_int, default=5, metavar="W",
                    help="untimed runs first (default: 5)")
    be.add_argument("--runs", type=_positive_int, default=50, metavar="R",
                    help="timed runs (default: 50)")
    be.add_argument("--threads", type=_positive_int, default=None, metavar="T",
                    help="limit BLAS/OpenMP threads (CPU backends; default: the library's choice)")
    be.add_argument("--shape", action="append", metavar="[NAME=]D0,D1,...",
                    help="shape of an input with dynamic dimensions other than the batch: the "
                         "dimensions after the batch (--batch goes in front, e.g. 3,224,224) or the "
                         "whole shape (its first dimension is then the batch)")
    be.add_argument("--profile-runs", type=_nonneg_int, default=3, metavar="P",
                    help="profiled runs for the per-layer table (default: 3; 0: no profile)")
    be.add_argument("--top", type=_nonneg_int, default=10, metavar="K",
                    help="slowest layers shown (default: 10)")
    be.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    be.set_defaults(func=cmd_bench)

    bk = sub.add_parser(
        "backends", parents=[common], help="which backends work here, their devices, why not",
        description="List the array backends, whether each can be used on this machine, its "
                    "devices, and why the others cannot (with the extra to install).")
    bk.set_defaults(func=cmd_backends)
    return p


# -- entry point ------------------------------------------------------------------------------------
def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].rstrip(":") if lines else type(exc).__name__


def _message(exc: BaseException, command: str | None) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, KuiperXPError) and exc.strerror:
        msg = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    elif isinstance(exc, (KuiperXPError, OSError, UsageError)):
        msg = _first_line(exc)
    else:
        msg = (f"{type(exc).__name__}: {_first_line(exc)} (unexpected; rerun with --verbose for the "
               "traceback)")
    if isinstance(exc, UnsupportedOperatorError):
        msg += "; `kuiper-xp inspect MODEL` lists them"
    notes = [n for n in getattr(exc, "__notes__", ()) if isinstance(n, str)]
    if notes:
        msg += " (" + "; ".join(notes) + ")"
    return msg


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, --version, usage errors
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    from kuiper_xp.backends.numpy_backend import tune_malloc

    tune_malloc(force=True)  # the command's process is its own (KUIPER_XP_TUNE_MALLOC=0: not)
    from kuiper_xp.pnnx import binfile

    verify_before = binfile.VERIFY_CRC
    if args.command in ("run", "inspect") and "KUIPER_XP_VERIFY_WEIGHTS" not in os.environ:
        binfile.VERIFY_CRC = True  # (a damaged .bin fails instead of giving other answers)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (OptionError, BackendError) as exc:  # (an option or backend name that cannot work)
        print(f"{PROG} {args.command}: error: {_message(exc, args.command)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`kuiper-xp inspect m | head`): stop quietly
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - avoid a second error at exit
        return 1
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {_message(exc, args.command)}", file=sys.stderr)
        return 1
    finally:
        binfile.VERIFY_CRC = verify_before


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
