"""Model selection and the exports every engine of the benchmark reads.

The architectures (and their seeded random weights and inputs) come from the reference zoo in
``tests/zoo/``; every engine gets the *same* torch module, so the weights are identical:

* kuiper-xp: the zoo's cached pnnx export with a dynamic batch (``tests.zoo.export.export(name,
  dynamic=True)``): one ``.pnnx.param``/``.pnnx.bin`` serves batch 1 and batch 8;
* onnxruntime: ``torch.onnx.export`` of the same module with a dynamic batch axis;
* ncnn: pnnx's own ncnn export (``.ncnn.param``/``.ncnn.bin``) of a batch-1 trace with ``fp16=0``
  (the zoo's export keeps pnnx's default fp16 weights, so the benchmark makes its own).

Peer exports are cached in ``$KUIPER_XP_BENCH_CACHE`` (default ``~/.cache/kuiper-xp/bench``), one
directory per model and zoo hash (the hash covers the zoo sources and the torch/pnnx versions).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from zoo import ModelSpec, get_spec, list_specs  # noqa: E402
from zoo.export import export as zoo_export  # noqa: E402
from zoo.export import redirect_fds as _quiet  # noqa: E402
from zoo.export import zoo_hash  # noqa: E402

__all__ = [
    "DEFAULT_MODELS",
    "ALIASES",
    "resolve_model",
    "ModelFiles",
    "model_files",
    "flatten",
    "bench_cache_root",
]

#: the four models of issue 8
DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "yolov5n", "vit_b_32")
#: spellings accepted on the command line
ALIASES = {
    "vit_b32": "vit_b_32",
    "vit-b/32": "vit_b_32",
    "vitb32": "vit_b_32",
    "resnet-18": "resnet18",
    "mobilenetv2": "mobilenet_v2",
    "yolov5": "yolov5n",
}


def resolve_model(name: str, input_shape: str | None = None) -> ModelSpec:
    """The spec of a command-line model: a zoo name (aliases such as ``vit_b32`` accepted; the
    zoo's own inputs, ``input_shape`` is not used), or ``path/to/file.py:factory`` (see
    :func:`user_model`; needs ``input_shape``)."""
    path, sep, attr = name.strip().rpartition(":")
    if sep and path.endswith(".py"):
        return user_model(path, attr, input_shape)
    if name.strip().endswith(".py"):
        raise KeyError(f"{name.strip()}: a model from a file is named path/to/file.py:factory (the function "
                       "or class in the file that returns the torch nn.Module)")
    key = name.strip().lower()
    return get_spec(ALIASES.get(key, key))


#: dtypes an input of your own may have (``--input-shape 128:int64:30522``)
INPUT_DTYPES = ("float32", "int64", "int32", "bool")


def parse_inputs(text: str) -> list[tuple[tuple[int, ...], str, int]]:
    """``"3,224,224"``, ``"3,224,224;16"`` (one shape per input, without the batch axis), each
    optionally with ``:DTYPE`` (float32, the default; int64, int32, bool) and for integers
    ``:HIGH`` (values drawn from [0, HIGH), default 2: token ids need the vocabulary size):
    ``"128:int64:30522;128:int64:2"``. An input with one value per sample (a diffusion timestep)
    has no dims: ``"3,32,32;:int64:1000"`` or ``"()"``. Returns ``(shape, dtype, high)`` per input."""
    specs = []
    for part in text.split(";"):
        fields = [f.strip() for f in part.split(":")]
        # no dims ("()", or nothing before a dtype: ":int64:1000") is one value per sample
        per_sample = fields[0] in ("()", "") and (fields[0] == "()" or len(fields) > 1)
        try:
            dims = tuple(int(d) for d in fields[0].replace("x", ",").split(",") if d.strip())
        except ValueError:
            dims = ()
        if (not dims and not per_sample) or any(d <= 0 for d in dims):
            raise KeyError(f"--input-shape {text!r}: expected positive integers per input, e.g. 3,224,224 "
                           f"(the batch axis is added by --batches; several inputs separated by ';', "
                           f"a dtype after ':', e.g. 128:int64:30522; one value per sample: () or :int64:1000)")
        dtype = fields[1] if len(fields) > 1 and fields[1] else "float32"
        if dtype not in INPUT_DTYPES or len(fields) > 3 or (len(fields) == 3 and not dtype.startswith("int")):
            raise KeyError(f"--input-shape {text!r}: {part!r} should be DIMS[:DTYPE[:HIGH]] with DTYPE one of "
                           f"{', '.join(INPUT_DTYPES)} (HIGH only for integers)")
        high = 2
        if len(fields) == 3:
            try:
                high = int(fields[2])
            except ValueError:
                high = 0
            if high <= 0:
                raise KeyError(f"--input-shape {text!r}: HIGH in {part!r} should be a positive integer "
                               f"(integer inputs are drawn from [0, HIGH))")
        specs.append((dims, dtype, high))
    return specs


def parse_input_shape(text: str) -> list[tuple[int, ...]]:
    """The shapes of :func:`parse_inputs`."""
    return [shape for shape, _, _ in parse_inputs(text)]


def seeded_input(batch: int, shape: tuple[int, ...], dtype: str, high: int, seed: int):
    """A reproducible input: N(0, 1) float32, or integers uniform in [0, high), or bools."""
    import torch
    from zoo import seeded_randn

    if dtype == "float32":
        return seeded_randn(batch, *shape, seed=seed)
    g = torch.Generator().manual_seed(seed)
    if dtype == "bool":
        return torch.randint(0, 2, (batch, *shape), generator=g).bool()
    return torch.randint(0, high, (batch, *shape), generator=g, dtype=getattr(torch, dtype))


def user_model(path: str, attr: str, input_shape: str | None) -> ModelSpec:
    """A model of your own: ``attr`` of the Python file ``path`` (a class or a function) returns
    an ``nn.Module``; it is built after ``torch.manual_seed(0)``, so every engine (and every
    export) gets the same weights, and run in eval mode on seeded N(0, 1) inputs of
    ``input_shape`` with the batch axis in front. The file is your own code and is imported as
    such. Exports are cached under a name that carries a hash of the file and the shapes."""
    import hashlib
    import importlib.util

    from zoo import INPUT_SEED

    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise KeyError(f"{path}:{attr}: no such file {file}")
    if not attr.isidentifier():
        raise KeyError(f"{path}:{attr}: {attr!r} is not a Python name (expected file.py:factory)")
    if not input_shape:
        raise KeyError(f"{path}:{attr}: a model from a file needs --input-shape (per-input shape "
                       "without the batch axis, e.g. 3,224,224)")
    import ast

    names = set()
    beside: list[Path] = []  # modules next to the file that it imports (their text is hashed too)
    local: set[str] = set()  # their names
    for node in ast.parse(file.read_text(), filename=str(file)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            roots = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if not node.level else [])
            for root in {r.split(".")[0] for r in roots if r}:
                if (file.parent / f"{root}.py").is_file():
                    beside.append(file.parent / f"{root}.py")
                    local.add(root)
                elif (file.parent / root / "__init__.py").is_file():
                    beside.extend(sorted((file.parent / root).rglob("*.py")))
                    local.add(root)
    if attr not in names:
        raise KeyError(f"{path}:{attr}: {file.name} defines no top-level {attr!r} "
                       f"(found: {', '.join(sorted(names)) or 'nothing'})")
    specs = parse_inputs(input_shape)
    shapes = [shape for shape, _, _ in specs]
    key = shapes if all(dt == "float32" for _, dt, _ in specs) else specs  # (float-only: the old names)
    text = file.read_bytes() + b"".join(f.read_bytes() for f in sorted(set(beside)))
    digest = hashlib.sha256(text + repr((attr, key)).encode()).hexdigest()[:10]
    name = f"{re.sub(r'[^A-Za-z0-9_]+', '_', f'{file.stem}_{attr}').strip('_')}_{digest}"

    def build():
        import torch

        mod_spec = importlib.util.spec_from_file_location(f"kuiper_bench_user_{digest}", file)
        module = importlib.util.module_from_spec(mod_spec)
        torch.manual_seed(0)  # the file runs again for each build: tensors drawn at import agree too
        folder = str(file.parent)  # (so that it can import the modules beside it)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        # a module beside the file named as one this script has imported already (its own
        # ``models``, the zoo's ``helpers``) is the file's: set ours aside while the file runs
        ours = {k: sys.modules.pop(k) for k in list(sys.modules)
                if k.split(".")[0] in local and not _module_in(sys.modules[k], file.parent)}
        try:
            mod_spec.loader.exec_module(module)
        finally:
            if added and folder in sys.path:
                sys.path.remove(folder)
            roots = {k.split(".")[0] for k in ours}
            for k in [k for k in sys.modules if k.split(".")[0] in roots]:
                del sys.modules[k]
            sys.modules.update(ours)
        factory = getattr(module, attr, None)
        if factory is None:
            raise KeyError(f"{file} defines no {attr!r}")
        torch.manual_seed(0)
        model = factory()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{file}:{attr}() returned {type(model).__name__}, expected a torch.nn.Module")
        _check_input_count(model, len(specs), f"{path}:{attr}", input_shape)
        return model.eval()

    def inputs(batch: int):
        return tuple(seeded_input(batch, s, dt, high, seed=INPUT_SEED + 1000 * i + batch)
                     for i, (s, dt, high) in enumerate(specs))

    return ModelSpec(name=name, build=build, inputs=inputs, dynamic_batch=4,
                     description=f"{file}:{attr} with inputs {input_shape}")


def _check_input_count(model, n: int, where: str, input_shape: str) -> None:
    """A KeyError when ``model.forward`` cannot take ``n`` positional inputs (``--input-shape``
    gives one shape per input, separated by ';')."""
    import inspect

    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # (no signature to read: the call itself will tell)
        return
    kinds = inspect.Parameter
    positional = [q for q in params if q.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for q in positional if q.default is q.empty)
    varargs = any(q.kind == kinds.VAR_POSITIONAL for q in params)
    if n < required or (n > len(positional) and not varargs):
        want = str(required) if required == len(positional) or varargs else f"{required} to {len(positional)}"
        raise KeyError(f"{where}: its forward takes {want}{'+' if varargs else ''} input(s), --input-shape "
                       f"{input_shape!r} gives {n} (one shape per input, separated by ';')")


def _module_in(module, folder: Path) -> bool:
    origin = getattr(module, "__file__", None)
    return origin is not None and Path(origin).resolve().is_relative_to(folder)


def available_models() -> list[str]:
    return [s.name for s in list_specs()]


def bench_cache_root() -> Path:
    env = os.environ.get("KUIPER_XP_BENCH_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "kuiper-xp" / "bench"
    root.mkdir(parents=True, exist_ok=True)
    return root


def flatten(y) -> list:
    """Model outputs flattened in order (the order of the pnnx graph's outputs)."""
    if isinstance(y, (tuple, list)):
        out: list = []
        for item in y:
            out.extend(flatten(item))
        return out
    return [y]


@dataclass
class ModelFiles:
    """Where each engine's copy of one model lies (paths may be None when an export failed;
    the matching ``*_error`` then says why)."""

    name: str
    pnnx_param: Path | None = None
    pnnx_error: str = ""
    onnx: Path | None = None
    onnx_error: str = ""
    ncnn_param: Path | None = None
    ncnn_bin: Path | None = None
    ncnn_inputs: tuple[str, ...] = ()
    ncnn_outputs: tuple[str, ...] = ()
    ncnn_error: str = ""


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, at most 400 characters (the error column of the table)."""
    text = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)
    msg = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())  # (KeyError: no repr quotes)
    text = f"{type(exc).__name__}: {msg}".strip()
    return text if len(text) <= 400 else text[:397] + "..."


def _peer_dir(spec: ModelSpec) -> Path:
    return bench_cache_root() / f"{spec.name}-{zoo_hash()}"


_BLOB_RE = re.compile(r'ex\.(input|extract)\(\s*"([^"]+)"')


def ncnn_blob_names(ncnn_py: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Input and output blob names, in order, from the ``*_ncnn.py`` that pnnx writes
    (``ex.input("in0", ...)`` / ``ex.extract("out0")``)."""
    ins: list[str] = []
    outs: list[str] = []
    for kind, name in _BLOB_RE.findall(ncnn_py.read_text()):
        (ins if kind == "input" else outs).append(name)
    return tuple(dict.fromkeys(ins)), tuple(dict.fromkeys(outs))


def _export_ncnn(spec: ModelSpec, model, inputs, d: Path, log: Path) -> None:
    """Trace at batch 1 and run the pnnx binary with fp16=0; keep the ncnn files + blob names."""
    import pnnx
    import torch
    from pnnx.utils.utils import generate_inputs_arg, get_shape_from_inputs, get_type_from_inputs

    work = Path(tempfile.mkdtemp(prefix=".ncnn-", dir=d))
    try:
        pt = work / "m.pt"
        with _quiet(log), torch.no_grad():
            traced = torch.jit.trace(model, inputs, check_trace=False)
            traced.save(str(pt))
        del traced
        shapes = generate_inputs_arg(get_shape_from_inputs(inputs), get_type_from_inputs(inputs))
        cmd = [pnnx.EXEC_PATH, str(pt), f"inputshape={shapes}", "device=cpu", "fp16=0",
               f"pnnxparam={work / 'm.pnnx.param'}", f"pnnxbin={work / 'm.pnnx.bin'}",
               f"pnnxpy={work / 'm_pnnx.py'}", f"pnnxonnx={work / 'm.pnnx.onnx'}",
               f"ncnnparam={work / 'm.ncnn.param'}", f"ncnnbin={work / 'm.ncnn.bin'}",
               f"ncnnpy={work / 'm_ncnn.py'}"]
        with open(log, "ab") as f:
            f.write(("\n$ " + " ".join(cmd) + "\n").encode())
            f.flush()
            proc = subprocess.run(cmd, cwd=work, stdout=f, stderr=subprocess.STDOUT)
        if proc.returncode != 0 or not (work / "m.ncnn.param").is_file():
            raise RuntimeError(f"pnnx ncnn export failed (exit {proc.returncode}); see {log}")
        ins, outs = ncnn_blob_names(work / "m_ncnn.py")
        for f_ in ("m.ncnn.param", "m.ncnn.bin", "m_ncnn.py"):
            os.replace(work / f_, d / f_)
        (d / "ncnn_blobs.json").write_text(json.dumps({"inputs": ins, "outputs": outs}) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _static_batch_inputs(path: Path) -> list[str]:
    """Names of the ONNX graph inputs whose first dimension is a number, not a symbol."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return [i.name for i in m.graph.input
            if i.type.tensor_type.shape.dim and not i.type.tensor_type.shape.dim[0].dim_param]


def _export_onnx(spec: ModelSpec, model, inputs, d: Path, log: Path) -> None:
    """torch.onnx.export with a dynamic batch axis on every input and output."""
    import torch

    with torch.no_grad():
        n_out = len(flatten(model(*inputs)))
    in_names = [f"in{i}" for i in range(len(inputs))]
    out_names = [f"out{i}" for i in range(n_out)]
    axes = {n: {0: "batch"} for n in in_names + out_names}
    tmp = d / ".m.onnx.tmp"
    errors: list[str] = []
    # the legacy TorchScript exporter first: it is quick, needs no onnxscript rewrites, and
    # writes one self-contained file; the dynamo exporter is the fallback
    for dynamo in (False, True):
        try:
            with _quiet(log):
                kw = dict(input_names=in_names, output_names=out_names, opset_version=17)
                args = tuple(inputs)
                if dynamo:
                    batch = torch.export.Dim("batch", min=1, max=64)
                    kw["dynamic_shapes"] = tuple({0: batch} for _ in inputs)
                    kw["external_data"] = False
                    # torch.export specialises a dimension of size 1: trace with batch 2
                    args = tuple(spec.inputs(2))
                else:
                    kw["dynamic_axes"] = axes
                torch.onnx.export(model, args, str(tmp), dynamo=dynamo, **kw)
            static = _static_batch_inputs(tmp)
            if static:
                raise RuntimeError(f"batch axis of {static} exported as a fixed size")
            os.replace(tmp, d / "m.onnx")
            (d / "onnx.json").write_text(json.dumps({"dynamo": dynamo}) + "\n")
            return
        except Exception as exc:  # try the other exporter
            errors.append(f"dynamo={dynamo}: {one_line(exc)}")
    raise RuntimeError("torch.onnx.export failed: " + " | ".join(errors))


def model_files(spec: ModelSpec, engines: set[str], verbose: bool = True) -> ModelFiles:
    """Make (or find cached) the exports the chosen engines need; never raises: a failed export
    is recorded in the matching ``*_error`` field."""

    mf = ModelFiles(spec.name)
    if "kuiper" in engines:
        try:
            t0 = time.perf_counter()
            mf.pnnx_param = zoo_export(spec, dynamic=spec.dynamic_batch is not None)
            if verbose and time.perf_counter() - t0 > 1:
                print(f"  [{spec.name}] pnnx export (dynamic batch) {time.perf_counter() - t0:.1f}s")
        except Exception as exc:
            mf.pnnx_error = "pnnx export: " + one_line(exc)
    d = _peer_dir(spec)
    d.mkdir(parents=True, exist_ok=True)
    log = d / "export.log"
    need_onnx = "onnxruntime" in engines and not (d / "m.onnx").is_file()
    need_ncnn = "ncnn" in engines and not (d / "ncnn_blobs.json").is_file()
    if need_onnx or need_ncnn:
        model = spec.build().eval()
        inputs = tuple(spec.inputs(1))
        if need_onnx:
            # not under no_grad: there nn.MultiheadAttention takes its fused fast path
            # (aten::_native_multi_head_attention), which the TorchScript exporter cannot write
            t0 = time.perf_counter()
            try:
                _export_onnx(spec, model, inputs, d, log)
                if verbose:
                    print(f"  [{spec.name}] onnx export {time.perf_counter() - t0:.1f}s")
            except Exception as exc:
                mf.onnx_error = "onnx export: " + one_line(exc)
        if need_ncnn:
            t0 = time.perf_counter()
            try:
                _export_ncnn(spec, model, inputs, d, log)
                if verbose:
                    print(f"  [{spec.name}] ncnn export (pnnx, fp16=0) {time.perf_counter() - t0:.1f}s")
            except Exception as exc:
                mf.ncnn_error = "ncnn export: " + one_line(exc)
        del model
    if "onnxruntime" in engines and not mf.onnx_error:
        mf.onnx = d / "m.onnx"
    if "ncnn" in engines and not mf.ncnn_error:
        mf.ncnn_param, mf.ncnn_bin = d / "m.ncnn.param", d / "m.ncnn.bin"
        blobs = json.loads((d / "ncnn_blobs.json").read_text())
        mf.ncnn_inputs, mf.ncnn_outputs = tuple(blobs["inputs"]), tuple(blobs["outputs"])
    return mf
