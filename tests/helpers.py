"""Shared test helpers: export a torch module with pnnx, run it with kuiper-xp, compare.

    path = export_torch(module, (x,), tmp_path)                 # -> .pnnx.param
    compare_with_torch(module, (x,), backend, tmp_path)           # export + run + assert_close
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

import kuiper_xp
from kuiper_xp.layers import BuildContext, create_layer
from kuiper_xp.pnnx.param import parse_param_text


def quiet_fds():
    """Silence stdout/stderr at the file-descriptor level (pnnx's C++ converter prints a lot),
    unless KUIPER_XP_VERBOSE_EXPORT is set."""
    from zoo.export import redirect_fds

    return redirect_fds(os.devnull)


def export_torch(module, inputs, out_dir=None, inputs2=None, name="m") -> Path:
    """Export ``module`` (put in eval mode) with pnnx; returns the ``.pnnx.param`` path.
    ``inputs2`` (a second input tuple of another batch) makes the exported shapes dynamic."""
    import pnnx
    import torch

    out_dir = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="kxp-export-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    module = module.eval()
    inputs = tuple(inputs)
    kwargs = {}
    if inputs2 is not None:
        kwargs["inputs2"] = tuple(inputs2)
    pt = out_dir / f"{name}.pt"
    (out_dir / f"{name}.pnnx.param").unlink(missing_ok=True)  # (a stale one would hide a failure below)
    with torch.no_grad(), quiet_fds():
        try:
            pnnx.export(module, str(pt), inputs, **kwargs)
        except (SyntaxError, AttributeError):
            # (as export_module: pnnx imports the Python it generated at the end, which raw
            # aten:: ops make invalid, after writing a complete .pnnx.param/.bin; once in a CI
            # run that import also found no `Model` in it, a file read half-written)
            if not (out_dir / f"{name}.pnnx.param").exists():
                raise
        except FileNotFoundError:  # (pnnx stopped without its files: a result never used, say)
            if not (out_dir / f"{name}.pnnx.param").exists():
                raise RuntimeError(f"pnnx did not write {out_dir / (name + '.pnnx.param')} (pnnx stops "
                                   "silently on some modules, one whose result is never used among them)") from None
    for suffix in (".pt", "_pnnx.py", ".pnnx.onnx", ".ncnn.param", ".ncnn.bin", "_ncnn.py"):
        p = out_dir / f"{name}{suffix}"
        if p.exists():
            p.unlink()
    param = out_dir / f"{name}.pnnx.param"
    if not param.exists():
        raise RuntimeError(f"pnnx did not write {param}")
    return param


def torch_outputs(module, inputs) -> tuple[np.ndarray, ...]:
    import torch

    with torch.no_grad():
        out = module.eval()(*inputs)
    if isinstance(out, torch.Tensor):
        out = (out,)
    flat = []
    for o in out:
        if isinstance(o, (tuple, list)):
            flat.extend(o)
        else:
            flat.append(o)
    return tuple(o.detach().numpy() for o in flat)


def run_graph(param, backend, inputs) -> tuple[np.ndarray, ...]:
    g = kuiper_xp.load(param, backend=backend)
    host = [i.detach().numpy() if hasattr(i, "detach") else np.asarray(i) for i in inputs]
    return tuple(kuiper_xp.to_numpy(o) for o in g(*host))


def compare_with_torch(module, inputs, backend, out_dir=None, rtol=1e-4, inputs2=None, param=None,
                       run_inputs=None):
    """Export (unless ``param`` is given), run on ``backend``, compare every output with torch."""
    from conftest import assert_close

    if param is None:
        param = export_torch(module, inputs, out_dir, inputs2=inputs2)
    run_inputs = inputs if run_inputs is None else run_inputs
    expected = torch_outputs(module, run_inputs)
    got = run_graph(param, backend, run_inputs)
    assert len(got) == len(expected), f"{len(got)} outputs, torch has {len(expected)}"
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=rtol, what=f"output {k}")
    return param


# -- single-operator layers (layer unit tests) ----------------------------------------------------
def make_layer(backend, op_type, params="", n_in=1, n_out=1, names=(), annotations=""):
    """A layer for one operator written as a .param line (no weights)."""
    ins = " ".join(f"i{k}" for k in range(n_in))
    outs = " ".join(f"o{k}" for k in range(n_out))
    keys = " ".join(f"${n}=i{k}" for k, n in enumerate(names) if n)
    inputs = "".join(f"pnnx.Input in{k} 0 1 i{k}\n" for k in range(n_in))
    text = (f"7767517\n{n_in + 1} {n_in + n_out}\n{inputs}"
            f"{op_type} op {n_in} {n_out} {ins} {outs} {params} {keys} {annotations}\n")
    op = parse_param_text(text, path="unit.param").operators[-1]
    return create_layer(op, BuildContext(backend))


def run(backend, layer, *host):
    args = [backend.asarray(h) if isinstance(h, np.ndarray) else h for h in host]
    return layer(*args)


def ref(fn, *host):
    """torch's result of fn on the host arrays, as numpy (a tuple for several outputs)."""
    import torch

    with torch.no_grad():
        out = fn(*[torch.from_numpy(np.ascontiguousarray(h)) for h in host])
    if isinstance(out, (tuple, list)):
        return tuple(o.numpy() for o in out)
    return out.numpy()


def in_fast_scope(nf, fn, threads=3):
    """``fn()`` inside a numpy_fast compute scope on ``threads`` threads (the setting restored)."""
    old = nf.set_num_threads(threads)
    try:
        with nf.compute_scope():
            return fn()
    finally:
        nf.set_num_threads(old)


def use_compiled(nf, monkeypatch):
    """Switch numpy_fast's optional numba kernels on for one test (skipped without numba; the
    previous setting comes back with the monkeypatch)."""
    import pytest

    pytest.importorskip("numba")
    monkeypatch.setattr(nf, "_numba", None)
    nf.use_numba(True)


def more_models():
    """``benchmarks/more_models.py`` imported as a module (the benchmark architectures)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "more_models.py"
    spec = importlib.util.spec_from_file_location("kxp_more_models", path)
    more = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(more)
    return more


# -- exports of small modules, cached per test module -----------------------------------------------


def export_module(module, inputs, out_dir: Path, inputs2=None) -> Path:
    """pnnx export (check_trace off: modules with several attention blocks trip the checker on
    value names only); returns the .pnnx.param path."""
    import pnnx
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    kwargs = {} if inputs2 is None else {"inputs2": tuple(inputs2)}
    param = out_dir / "m.pnnx.param"
    with torch.no_grad(), quiet_fds():
        try:
            pnnx.export(module.eval(), str(out_dir / "m.pt"), tuple(inputs), check_trace=False, **kwargs)
        except (SyntaxError, AttributeError):
            # pnnx imports the Python it generated at the end; raw aten:: ops make that invalid
            # Python (or the import finds no `Model`) although the .pnnx.param/.bin are complete
            if not param.exists():
                raise
    return param


def operator_types(param: Path) -> set[str]:
    """The operator types a .pnnx.param holds."""
    return {ln.split()[0] for ln in param.read_text().splitlines()[2:] if ln.strip()}


def case_exporter(tmp_path_factory, cases: dict):
    """``get(name)``: the export of ``cases[name] = (module, inputs, types[, inputs2])``, made
    once per test module (torch seeded first), checked to hold every operator type in ``types``
    (so a case keeps testing the operator it was written for). ``get(name, module, inputs,
    types)`` exports a case that is not in the table."""
    import torch

    cache: dict = {}

    def get(name, module=None, inputs=None, types=frozenset()):
        if name not in cache:
            inputs2 = None
            if module is None:
                module, inputs, types, *rest = cases[name]
                inputs2 = rest[0] if rest else None
            torch.manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # tracer and deprecation notes
                param = export_module(module, inputs, tmp_path_factory.mktemp(name), inputs2=inputs2)
            found = operator_types(param)
            assert set(types) <= found, f"the export no longer has {set(types) - found}: {sorted(found)}"
            cache[name] = param
        return cache[name]
    return get


_FN_CLASS = None


def Fn(fn):  # noqa: N802  (used like the class it makes)
    """``nn.Module`` whose forward is ``fn(*inputs)``: one small module per tested operator call
    (torch is imported on first use, so that torch-free tests can import this file)."""
    global _FN_CLASS
    if _FN_CLASS is None:
        from torch import nn

        class FnModule(nn.Module):
            def __init__(self, f):
                super().__init__()
                self.fn = f

            def forward(self, *a):
                return self.fn(*a)

        _FN_CLASS = FnModule
    return _FN_CLASS(fn)


#: values each input of :func:`special_inputs` starts with: NaN, +-inf, signed zeros, a
#: denormal, ordinary values and exp's overflow range
SPECIAL_VALUES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3.0, 2.5, 80.0, -80.0], np.float32)


def special_inputs(n, shapes, dtype, seed=0):
    """``n`` arrays of N(0, 9) values of ``dtype``, shaped ``shapes`` in turn, each starting with
    as many of :data:`SPECIAL_VALUES` as it holds (elementwise kernels against torch)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        x = (rng.standard_normal(shapes[k % len(shapes)]) * 3).astype(dtype)
        flat = x.reshape(-1)
        flat[: min(flat.size, SPECIAL_VALUES.size)] = SPECIAL_VALUES[: flat.size].astype(dtype)
        out.append(x)
    return out


def bad_value(backend, value) -> str:
    """The offending index as a range error names it (followed by a space): where the backend
    defers range checks to the end of a pass (a GPU; kuiper_xp.layers.checks) the value is not
    read back, and the message names none."""
    return f"{value} " if backend.cheap_host_reads else ""
