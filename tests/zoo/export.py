"""Cached pnnx exports of the zoo models, and torch reference outputs.

    from tests.zoo.export import export, reference
    param = export("resnet18")                  # .../resnet18.pnnx.param (the .pnnx.bin beside it)
    param = export("resnet18", dynamic=True)    # batch dimension exported as '?'
    inputs, outputs = reference("resnet18", 1)  # numpy tuples, from torch under no_grad

Or by hand: ``python -m tests.zoo.export resnet18 --dynamic`` prints the path.

An export is what ``pnnx.export(model.eval(), pt_path, inputs, inputs2=...)`` does: torch.jit.trace,
save the TorchScript file, run the pnnx converter binary shipped in the pnnx wheel with
``inputshape=``/``inputshape2=`` built by pnnx's own helpers. It is spelled out here (same trace,
same command line) so that the converter's exit status is checked, its chatter goes to a log file,
and the generated ``*_pnnx.py`` is not imported back (pnnx.export does that, and it costs a second
load of the weights). The trace runs with ``check_trace=False`` (pnnx.export's default is True): the
check re-traces and re-runs the model, a third of the export time, and the zoo models are
deterministic.

Cache: ``$KUIPER_XP_ZOO_CACHE`` or ``~/.cache/kuiper-xp/zoo``; one directory per export,
``<name>-<static|dyn>-<hash>``, where the hash covers the zoo's source files and the torch and pnnx
versions (export.py itself enters through EXPORT_FORMAT, bumped when what an export produces
changes, so that editing this file does not invalidate every cache). Each holds ``<name>.pnnx.param``, ``<name>.pnnx.bin``, ``<name>.ncnn.param``,
``<name>.ncnn.bin``, ``export.log`` (the converter's output) and ``meta.json``. A directory is built
under a temporary name and renamed into place, and a per-export lock file keeps concurrent pytest
workers from doing the same export twice, so parallel runs are safe.

Set ``KUIPER_XP_VERBOSE_EXPORT=1`` to see pnnx's output instead of logging it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from . import ModelSpec, get_spec

__all__ = [
    "export",
    "export_meta",
    "reference",
    "cache_root",
    "zoo_hash",
    "export_dir",
    "prune_cache",
    "main",
]

ZOO_DIR = Path(__file__).resolve().parent
#: files whose content decides the cache key (README, inventory and INVENTORY.md do not)
HASHED_SOURCES = ("__init__.py", "small.py", "classifiers.py", "transformers.py", "detection.py")
#: bump when export() starts producing different files (pnnx options, kept files, meta layout)
EXPORT_FORMAT = 2
#: what is kept of an export; anything else pnnx writes (.pt, _pnnx.py, .pnnx.onnx, _ncnn.py) goes
KEPT_SUFFIXES = (".pnnx.param", ".pnnx.bin", ".ncnn.param", ".ncnn.bin")

PNNX_MAGIC = "7767517"


def _verbose() -> bool:
    return bool(os.environ.get("KUIPER_XP_VERBOSE_EXPORT"))


def cache_root() -> Path:
    """Where exports are cached: $KUIPER_XP_ZOO_CACHE, else ~/.cache/kuiper-xp/zoo."""
    env = os.environ.get("KUIPER_XP_ZOO_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "kuiper-xp" / "zoo"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _versions() -> dict[str, str]:
    import importlib.metadata

    import torch

    try:
        pnnx_version = importlib.metadata.version("pnnx")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        pnnx_version = "unknown"
    return {"torch": torch.__version__, "pnnx": pnnx_version}


_HASH: str | None = None


def zoo_hash() -> str:
    """12 hex digits over the zoo sources and the torch/pnnx versions."""
    global _HASH
    if _HASH is None:
        h = hashlib.sha256()
        for fname in HASHED_SOURCES:
            h.update(fname.encode())
            h.update((ZOO_DIR / fname).read_bytes())
        h.update(json.dumps(_versions(), sort_keys=True).encode())
        h.update(f"export-format-{EXPORT_FORMAT}".encode())
        _HASH = h.hexdigest()[:12]
    return _HASH


def export_dir(name_or_spec: str | ModelSpec, dynamic: bool = False) -> Path:
    """The cache directory of one export (it may not exist yet)."""
    spec = get_spec(name_or_spec)
    return cache_root() / f"{spec.name}-{'dyn' if dynamic else 'static'}-{zoo_hash()}"


# ---------------------------------------------------------------------------------------------
# output silencing


@contextlib.contextmanager
def redirect_fds(log_path: str | os.PathLike):
    """Send fd 1 and fd 2 (C++ and Python alike) to log_path, unless verbose."""
    if _verbose():
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # TracerWarning and friends
                    yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock (fcntl) on path; a no-op where fcntl is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# export


def _is_complete(d: Path, name: str) -> bool:
    return (
        (d / f"{name}.pnnx.param").is_file()
        and (d / f"{name}.pnnx.bin").is_file()
        and (d / "meta.json").is_file()
    )


def _param_complete(param: Path) -> bool:
    """A .pnnx.param with the magic line and as many operator lines as its header declares."""
    lines = [ln for ln in param.read_text(errors="replace").splitlines() if ln.strip()]
    if len(lines) < 2 or lines[0].strip() != PNNX_MAGIC:
        return False
    head = lines[1].split()
    return len(head) == 2 and head[0].isdigit() and len(lines) - 2 == int(head[0])


def _exit_status(code: int) -> str:
    """``-6 (SIGABRT)`` for a signal, else the number."""
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


_REASON_RE = re.compile(r"error|terminate|what\(\)|segmentation|abort|assert|free\(\)|fault|exception|not supported",
                        re.IGNORECASE)


def _pnnx_reason(log: str) -> str:
    """The lines of pnnx's log (after the last command line) that say why it stopped, else its
    last lines: what a one-line error report should show first."""
    tail = log.rsplit("\n$ ", 1)[-1].splitlines()[1:]
    lines = [ln.strip() for ln in tail if ln.strip()]
    hits = [ln for ln in lines if _REASON_RE.search(ln)]
    pick = hits[-3:] if hits else lines[-3:]
    return " | ".join(pick)[-400:] or "no output"


def _run_pnnx(spec: ModelSpec, workdir: Path, dynamic: bool, log_path: Path) -> dict:
    """Trace spec's model into workdir and run the pnnx binary there; return meta information."""
    import pnnx
    import torch
    from pnnx.utils.utils import generate_inputs_arg, get_shape_from_inputs, get_type_from_inputs

    inputs = tuple(spec.inputs(1))
    inputs2 = tuple(spec.inputs(spec.dynamic_batch)) if dynamic else None
    model = spec.build().eval()
    name = spec.name
    pt_path = workdir / f"{name}.pt"

    t0, c0 = time.perf_counter(), time.process_time()
    with redirect_fds(log_path), torch.no_grad():
        traced = torch.jit.trace(model, inputs, check_trace=False)
        traced.save(str(pt_path))
    t_trace, c_trace = time.perf_counter() - t0, time.process_time() - c0
    del traced

    cmd = [
        pnnx.EXEC_PATH,
        str(pt_path),
        "inputshape="
        + generate_inputs_arg(get_shape_from_inputs(inputs), get_type_from_inputs(inputs)),
        "device=cpu",
        "optlevel=2",
    ]
    if inputs2 is not None:
        cmd.append(
            "inputshape2="
            + generate_inputs_arg(get_shape_from_inputs(inputs2), get_type_from_inputs(inputs2))
        )
    outs = {
        "pnnxparam": f"{name}.pnnx.param",
        "pnnxbin": f"{name}.pnnx.bin",
        "pnnxpy": f"{name}_pnnx.py",
        "pnnxonnx": f"{name}.pnnx.onnx",
        "ncnnparam": f"{name}.ncnn.param",
        "ncnnbin": f"{name}.ncnn.bin",
        "ncnnpy": f"{name}_ncnn.py",
    }
    cmd += [f"{k}={workdir / v}" for k, v in outs.items()]

    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    if _verbose():
        proc = subprocess.run(cmd, cwd=workdir)
    else:
        with open(log_path, "ab") as log:
            log.write(("\n$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            proc = subprocess.run(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    t_pnnx = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    c_pnnx = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)

    param = workdir / outs["pnnxparam"]
    written = param.is_file() and (workdir / outs["pnnxbin"]).is_file()
    # pnnx writes the .pnnx.param/.bin, then the _pnnx.py, then runs its ncnn passes: a crash in
    # those (seen for einsum with one operand twice, a Conv1d 'same' with reflect padding) leaves
    # complete pnnx files, which are used (with a note); anything earlier is a failed export
    late_crash = proc.returncode != 0 and written and (workdir / outs["pnnxpy"]).is_file() and _param_complete(param)
    if (proc.returncode != 0 and not late_crash) or not written:
        text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        raise RuntimeError(
            f"pnnx failed to export zoo model {name!r} (dynamic={dynamic}, exit status "
            f"{_exit_status(proc.returncode)}): {_pnnx_reason(text)}; log tail:\n{text[-4000:]}"
        )
    if late_crash:
        text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        print(f"note: pnnx exited with status {_exit_status(proc.returncode)} ({_pnnx_reason(text)}) after "
              f"writing {param.name} and its .bin: a later pass (its ncnn conversion) failed; using them",
              file=sys.stderr)
    first = param.read_text().split("\n", 1)[0].strip()
    if first != PNNX_MAGIC:
        raise RuntimeError(f"{param}: first line {first!r}, expected the pnnx magic {PNNX_MAGIC}")

    # drop everything but the kept files (and our log)
    for p in workdir.iterdir():
        if p.name == log_path.name or any(p.name == name + s for s in KEPT_SUFFIXES):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()

    return {
        "name": name,
        "dynamic": dynamic,
        "input_shapes": [list(t.shape) for t in inputs],
        "input_dtypes": [str(t.dtype).removeprefix("torch.") for t in inputs],
        "input_shapes2": [list(t.shape) for t in inputs2] if inputs2 is not None else None,
        "trace_seconds": round(t_trace, 3),
        "pnnx_seconds": round(t_pnnx, 3),
        "pnnx_exit_status": proc.returncode,
        "trace_cpu_seconds": round(c_trace, 3),
        "pnnx_cpu_seconds": round(c_pnnx, 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": _versions(),
        "zoo_hash": zoo_hash(),
    }


def export(name_or_spec: str | ModelSpec, dynamic: bool = False, *, force: bool = False) -> Path:
    """Export a zoo model with pnnx (cached) and return the path of its ``.pnnx.param``.

    The ``.pnnx.bin`` (and ``.ncnn.param``/``.ncnn.bin``) lie beside it. ``dynamic=True`` exports
    with a second input set of batch ``spec.dynamic_batch`` so that batch dimensions read ``?``.
    ``force=True`` re-exports even when the cache holds a copy.
    """
    spec = get_spec(name_or_spec)
    if dynamic and spec.dynamic_batch is None:
        raise ValueError(f"zoo model {spec.name!r} has no dynamic export (dynamic_batch is None)")
    final = export_dir(spec, dynamic)
    param = final / f"{spec.name}.pnnx.param"
    if not force and _is_complete(final, spec.name):
        return param

    root = final.parent
    with _file_lock(root / f".{final.name}.lock"):
        if not force and _is_complete(final, spec.name):  # another process finished it meanwhile
            return param
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
        try:
            t0 = time.perf_counter()
            meta = _run_pnnx(spec, tmp, dynamic, tmp / "export.log")
            meta["export_seconds"] = round(time.perf_counter() - t0, 3)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
            if final.exists():  # stale/incomplete or forced: move it aside, then drop it
                old = Path(tempfile.mkdtemp(prefix=f".old-{final.name}-", dir=root))
                os.replace(final, old / "x")
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException as exc:
            log = tmp / "export.log"
            if isinstance(exc, RuntimeError) and "; log tail:" in str(exc) and log.is_file():
                kept = root / f"{final.name}.failed.log"  # the whole log outlives the temporary folder
                shutil.copyfile(log, kept)
                shutil.rmtree(tmp, ignore_errors=True)
                raise RuntimeError(str(exc).replace("; log tail:", f"; whole log: {kept}; log tail:", 1)) from None
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if _verbose():
        print(
            f"[zoo] exported {spec.name} (dynamic={dynamic}) in {meta['export_seconds']:.1f}s -> {final}"
        )
    return param


def export_meta(name_or_spec: str | ModelSpec, dynamic: bool = False) -> dict:
    """meta.json of an export (exports first if needed): shapes, timings, versions."""
    param = export(name_or_spec, dynamic)
    return json.loads((param.parent / "meta.json").read_text())


# ---------------------------------------------------------------------------------------------
# torch reference


def _flatten_outputs(y) -> list:
    if isinstance(y, (tuple, list)):
        out = []
        for item in y:
            out.extend(_flatten_outputs(item))
        return out
    return [y]


def reference(name_or_spec: str | ModelSpec, batch: int = 1, *, cache: bool = True):
    """``(inputs, outputs)``: numpy tuples of the seeded inputs of ``batch`` and the torch outputs
    (flattened in order, the same order as the pnnx graph's outputs), computed under no_grad.

    Cached as ``<name>-ref-b<batch>-<hash>.npz`` beside the exports unless ``cache=False``.
    """
    import numpy as np
    import torch

    spec = get_spec(name_or_spec)
    path = cache_root() / f"{spec.name}-ref-b{batch}-{zoo_hash()}.npz"
    if cache and path.is_file():
        with np.load(path) as z:
            n_in, n_out = int(z["n_in"]), int(z["n_out"])
            return tuple(z[f"in{i}"] for i in range(n_in)), tuple(
                z[f"out{i}"] for i in range(n_out)
            )

    inputs = tuple(spec.inputs(batch))
    model = spec.build()
    with torch.no_grad():
        outs = _flatten_outputs(model(*inputs))
    ins_np = tuple(t.detach().cpu().numpy() for t in inputs)
    outs_np = tuple(t.detach().cpu().contiguous().numpy() for t in outs)
    if cache:
        arrays = {f"in{i}": a for i, a in enumerate(ins_np)}
        arrays.update({f"out{i}": a for i, a in enumerate(outs_np)})
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".npz", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, n_in=len(ins_np), n_out=len(outs_np), **arrays)
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return ins_np, outs_np


def prune_cache() -> list[Path]:
    """Remove exports and references whose hash is not the current zoo_hash(); return them."""
    root, h = cache_root(), zoo_hash()
    removed = []
    for p in root.iterdir():
        if p.name.startswith(".") or h in p.name:
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse

    from . import list_specs

    ap = argparse.ArgumentParser(
        prog="python -m tests.zoo.export", description=__doc__.split("\n")[0]
    )
    ap.add_argument("names", nargs="*", help="zoo models (default: all)")
    ap.add_argument("--dynamic", action="store_true", help="export with a dynamic batch dimension")
    ap.add_argument("--force", action="store_true", help="re-export even if cached")
    ap.add_argument("--list", action="store_true", help="list the zoo models and exit")
    ap.add_argument(
        "--prune", action="store_true", help="delete cached exports of older zoo versions and exit"
    )
    args = ap.parse_args(argv)
    if args.prune:
        for p in prune_cache():
            print(f"removed {p}")
        return 0
    if args.list:
        for s in list_specs():
            print(
                f"{s.name:22s} dyn_batch={s.dynamic_batch!s:4s} {'slow ' if s.slow else ''}{s.description}"
            )
        return 0
    for n in args.names or [s.name for s in list_specs()]:
        t0 = time.perf_counter()
        p = export(n, args.dynamic, force=args.force)
        print(f"{p}  ({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
