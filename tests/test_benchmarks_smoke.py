"""Smoke test of the side-by-side benchmark harness (benchmarks/run.py): it runs on a small zoo
model with one timed run and writes JSON and Markdown. No timing assertions: only that every
engine either has a time and an accuracy figure or a one-line error, and that the files agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "benchmarks" / "run.py"

pytest.importorskip("torch")
pytest.importorskip("pnnx")


def _run(tmp_path: Path, *extra: str, status: int = 0) -> tuple[dict, str, str]:
    out = tmp_path / "results"
    env = dict(os.environ, KUIPER_XP_BENCH_CACHE=str(tmp_path / "bench-cache"))
    cmd = [sys.executable, str(RUN), "--models", "relu_sigmoid_chain", "--runs", "1", "--warmup", "0",
           "--threads", "1", "--engines", "kuiper,torch,onnxruntime,ncnn", "--backends", "numpy",
           "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == status, f"run.py exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    latest = json.loads((out / "latest.json").read_text())
    stamped = [p for p in out.glob("*.json") if p.name != "latest.json"]
    assert len(stamped) == 1, f"expected one timestamped JSON, found {[p.name for p in stamped]}"
    assert json.loads(stamped[0].read_text()) == latest
    md = (out / "latest.md").read_text()
    assert (out / stamped[0].with_suffix(".md").name).read_text() == md
    return latest, md, proc.stdout


def _usage_error(tmp_path: Path, *extra: str) -> str:
    """Run run.py expecting a command-line error: exit status 2, nothing written; its stderr."""
    out = tmp_path / "results"
    env = dict(os.environ, KUIPER_XP_BENCH_CACHE=str(tmp_path / "bench-cache"))
    cmd = [sys.executable, str(RUN), "--runs", "1", "--warmup", "0", "--threads", "1", "--engines", "kuiper",
           "--backends", "numpy", "--no-memory", "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 2, f"run.py exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert not out.exists() and "Traceback" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith("run.py: error: "), line
    return line


def _check_entries(cell: dict) -> dict:
    by = {e["label"]: e for e in cell["entries"]}
    assert set(by) == {"kuiper[numpy]", "torch", "onnxruntime", "ncnn"}, sorted(by)
    for label, e in by.items():
        if e.get("error"):
            assert isinstance(e["error"], str) and "\n" not in e["error"], (label, e["error"])
            continue
        assert e["runs"] == 1, (label, e)
        assert e["median_ms"] > 0 and e["min_ms"] > 0 and e["iqr_ms"] >= 0, (label, e)
        # ready: the median of --load-runs (3) creations on fresh runners; the first of them
        # is part of file-to-first-result
        assert len(e["ready_runs"]) == 3 and 0 < e["ready_runs"][0] <= e["load_s"], (label, e)
        assert e["ready_s"] == sorted(e["ready_runs"])[1], (label, e)
        assert e["rel_err"] is not None and e["rel_err"] < 1e-4, (label, e.get("rel_err"), e.get("check"))
    assert not by["torch"].get("error"), by["torch"]
    assert by["torch"]["rel_err"] == 0.0
    return by


def test_harness_writes_json_and_markdown(tmp_path):
    result, md, stdout = _run(tmp_path, "--batches", "1,2", "--no-memory")
    assert result["meta"]["threads"] == 1
    assert result["meta"]["omp_wait_policy"]
    cells = result["cells"]
    assert [(c["model"], c["batch"]) for c in cells] == [("relu_sigmoid_chain", 1), ("relu_sigmoid_chain", 2)]
    for cell in cells:
        by = _check_entries(cell)
        assert cell["input_shapes"][0][0] == cell["batch"]
        if not by["kuiper[numpy]"].get("error"):
            assert "kuiper[numpy]/torch" in cell["ratios"]
    assert "## relu_sigmoid_chain, batch 1" in md and "## relu_sigmoid_chain, batch 2" in md
    assert "| engine | median ms |" in md and "## Summary: median ms" in md
    assert "## relu_sigmoid_chain, batch 1" in stdout
    ok = [c for c in cells if not any(e.get("error") for e in c["entries"]
                                      if e["label"] in ("kuiper[numpy]", "onnxruntime"))]
    if ok:  # both loaded: the load table compares them, ready and first result
        assert "## Load time, kuiper-xp / onnxruntime (s)" in md
        assert "| relu_sigmoid_chain | 1 | kuiper[numpy] |" in md


def test_memory_mode_and_bad_names_do_not_crash(tmp_path):
    """--memory spawns one child process per (engine, model, batch); an unknown model is a
    command-line error before any work (exit 2, a one-line message naming it, no report), not a
    crash. With --isa avx2 (the libraries' AVX-512 switches off, children included) every
    engine still runs and the report says so."""
    line = _usage_error(tmp_path / "bad", "--models", "relu_sigmoid_chain,no_such_model")
    assert "no zoo model 'no_such_model'" in line
    result, md, _ = _run(tmp_path, "--batches", "1", "--memory", "--models", "relu_sigmoid_chain", "--isa", "avx2")
    assert result["meta"]["isa"] == "avx2" and result["meta"]["isa_env"]["OPENBLAS_CORETYPE"] == "Haswell"
    assert "ISA limited to AVX2" in md
    cells = {c["model"]: c for c in result["cells"]}
    by = _check_entries(cells["relu_sigmoid_chain"])
    for label, e in by.items():
        if not e.get("error"):
            assert e["peak_rss_mib"] > 10 and "memory_error" not in e, (label, e)
    assert "peak RSS" in md


USER_MODEL = '''
import torch
from torch import nn

OFFSET = torch.randn(5)  # drawn when the file is imported (once per export and for torch)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)
        self.register_buffer("offset", OFFSET.clone())

    def forward(self, x, scale):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3))) * scale + self.offset
'''


def test_a_model_of_your_own_from_a_file(tmp_path):
    """--models path.py:factory with --input-shape (two inputs): exported, timed on every engine
    against its torch output, the memory child resolving the same file; a missing shape or
    factory, a file without ``:factory`` or shapes for another number of inputs than the
    model's forward takes are command-line errors (exit 2, one line, nothing written)."""
    (tmp_path / "mynet.py").write_text(USER_MODEL)
    arg = f"{tmp_path / 'mynet.py'}:Net"
    result, md, _ = _run(tmp_path, "--batches", "1,2", "--memory", "--models", arg, "--input-shape", "3,12,10;5")
    cells = result["cells"]
    assert [c["batch"] for c in cells] == [1, 2] and cells[0]["model"].startswith("mynet_Net_")
    assert cells[1]["input_shapes"] == [[2, 3, 12, 10], [2, 5]]
    for cell in cells:
        by = _check_entries(cell)
        assert not by["kuiper[numpy]"].get("error"), by["kuiper[numpy]"]
        assert by["kuiper[numpy]"]["peak_rss_mib"] > 10
    assert "needs --input-shape" in _usage_error(tmp_path / "e1", "--models", arg)
    assert "no top-level 'Nope'" in _usage_error(tmp_path / "e2", "--models", f"{tmp_path / 'mynet.py'}:Nope",
                                                 "--input-shape", "3,12,10;5")
    assert "path/to/file.py:factory" in _usage_error(tmp_path / "e3", "--models", str(tmp_path / "mynet.py"),
                                                     "--input-shape", "3,12,10;5")
    line = _usage_error(tmp_path / "e4", "--models", arg, "--input-shape", "3,12,10")
    assert "takes 2 input(s)" in line and "gives 1" in line, line
    assert "DTYPE one of" in _usage_error(tmp_path / "e5", "--models", arg, "--input-shape", "3,12,10:int8;5")


def test_input_shapes_with_dtypes():
    """--input-shape DIMS[:DTYPE[:HIGH]]: float32 by default, integer inputs drawn from [0, HIGH)
    (token ids), bools; malformed fields are one-line errors naming the expected form."""
    import torch

    if str(RUN.parent) not in sys.path:
        sys.path.insert(0, str(RUN.parent))
    from models import parse_input_shape, parse_inputs, seeded_input

    specs = parse_inputs("3,8x8;128:int64:30522;16:bool;4:int32")
    assert specs == [((3, 8, 8), "float32", 2), ((128,), "int64", 30522), ((16,), "bool", 2), ((4,), "int32", 2)]
    assert parse_input_shape("3,8x8;5") == [(3, 8, 8), (5,)]
    # one value per sample (a diffusion timestep): no DIMS before the dtype, or "()"
    assert parse_inputs("3,32,32;:int64:1000") == [((3, 32, 32), "float32", 2), ((), "int64", 1000)]
    assert parse_input_shape("()") == [()]
    t = seeded_input(4, (), "int64", 1000, seed=2)
    assert t.shape == (4,) and t.dtype == torch.int64
    ids = seeded_input(3, (128,), "int64", 30522, seed=1)
    assert ids.dtype == torch.int64 and ids.shape == (3, 128) and 0 <= int(ids.min()) and int(ids.max()) < 30522
    assert len(set(ids.flatten().tolist())) > 300  # spread over the range
    assert torch.equal(ids, seeded_input(3, (128,), "int64", 30522, seed=1))
    assert seeded_input(2, (16,), "bool", 2, seed=1).dtype == torch.bool
    assert seeded_input(2, (3, 4), "float32", 2, seed=1).dtype == torch.float32
    for bad, needle in (("128:int8", "DTYPE one of"), ("128:float32:5", "HIGH only for integers"),
                        ("128:int64:0", "positive integer"), ("0,3", "positive integers"),
                        ("128:int64:9:9", "DIMS"), ("", "positive integers")):
        with pytest.raises(KeyError, match=needle):
            parse_inputs(bad)


def test_a_model_file_imports_the_modules_beside_it(tmp_path):
    """A model file may import a module next to it (``from blocks import Block``): build() finds
    it, sys.path is as before afterwards, and editing that module changes the export's cache
    name as editing the file does."""
    import torch

    if str(RUN.parent) not in sys.path:
        sys.path.insert(0, str(RUN.parent))
    from models import user_model

    (tmp_path / "blocks_kxp_test.py").write_text(
        "import torch\nclass Block(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n")
    (tmp_path / "net.py").write_text("import torch\nfrom blocks_kxp_test import Block\n\n"
                                     "def build():\n    return torch.nn.Sequential(Block(), torch.nn.ReLU())\n")
    before = list(sys.path)
    spec = user_model(str(tmp_path / "net.py"), "build", "4")
    model = spec.build()
    assert sys.path == before
    assert torch.equal(model(torch.tensor([[-1.0, 2.0, 0.5, -3.0]])), torch.tensor([[0.0, 4.0, 1.0, 0.0]]))
    (tmp_path / "blocks_kxp_test.py").write_text(
        "import torch\nclass Block(torch.nn.Module):\n    def forward(self, x):\n        return x * 3\n")
    assert user_model(str(tmp_path / "net.py"), "build", "4").name != spec.name
    sys.modules.pop("blocks_kxp_test", None)


def test_a_model_file_may_import_a_module_named_as_the_scripts_own(tmp_path):
    """``from models import cbr`` in a model file means the ``models.py`` beside it, not the
    benchmark script's own ``models`` (imported first); the script's is back afterwards."""
    import torch

    if str(RUN.parent) not in sys.path:
        sys.path.insert(0, str(RUN.parent))
    import models
    from models import user_model

    (tmp_path / "models.py").write_text("import torch\ndef cbr(c):\n    return torch.nn.Conv2d(c, c, 1)\n")
    (tmp_path / "net.py").write_text("import torch\nfrom models import cbr\n\n"
                                     "def build():\n    return torch.nn.Sequential(cbr(3), torch.nn.ReLU())\n")
    model = user_model(str(tmp_path / "net.py"), "build", "3,8,8").build()
    assert isinstance(model[0], torch.nn.Conv2d)
    assert sys.modules["models"] is models and models.user_model is user_model


def test_rel_error_shapes_and_non_finite_values():
    """The accuracy check: equal infinities (masked log-probabilities) are no error; NaN or inf
    where torch has none (or another sign) is; a shape that only reshapes to torch's is an error
    except for ncnn (no batch axis)."""
    import numpy as np

    if str(RUN.parent) not in sys.path:
        sys.path.insert(0, str(RUN.parent))
    from run import rel_error

    ref = np.array([[0.5, -np.inf, 2.0]], np.float32)
    assert rel_error([ref + np.float32(1e-6)], [ref]) == (pytest.approx(5e-7, rel=0.2), "")
    for bad in ([[0.5, np.inf, 2.0]], [[0.5, np.nan, 2.0]], [[np.nan, -np.inf, 2.0]]):
        err, why = rel_error([np.array(bad, np.float32)], [ref])
        assert err is None and "non-finite" in why
    err, why = rel_error([ref.reshape(3, 1)], [ref])
    assert err is None and "shape (3, 1)" in why
    assert rel_error([ref[0]], [ref], exact_shape=False) == (0.0, "")
    assert rel_error([ref, ref], [ref])[1] == "2 outputs, torch has 1"


def test_load_again_takes_the_median_and_survives_a_failing_creation(monkeypatch):
    """``--load-runs``: the extra creations run on fresh runners, engines taking turns; ready is
    the median of all of them; an engine whose later creation fails keeps what it had, and the
    log says why."""
    import types

    if str(RUN.parent) not in sys.path:
        sys.path.insert(0, str(RUN.parent))
    import peers
    import run

    made, order = [], []

    class Fake:
        def __init__(self, engine):
            self.engine, self.closed = engine, False
            made.append(self)

        def load(self, files, spec):
            order.append(self.engine)
            if self.engine == "bad":
                raise RuntimeError("no\nsecond session")

        def close(self):
            self.closed = True

    monkeypatch.setattr(peers, "make_runner", lambda engine, threads, backend: Fake(engine))
    good = {"engine": "good", "backend": None, "label": "good", "ready_s": 9.0, "ready_runs": [9.0]}
    bad = {"engine": "bad", "backend": None, "label": "bad", "ready_s": 0.5, "ready_runs": [0.5]}
    lines = []
    run.load_again(types.SimpleNamespace(load_runs=3, threads=1), None, None, [good, bad], lines.append)
    assert order == ["good", "bad", "bad", "good"] and all(f.closed for f in made)
    assert len(good["ready_runs"]) == 3 and good["ready_s"] == sorted(good["ready_runs"])[1] < 9.0
    assert bad["ready_runs"] == [0.5] and bad["ready_s"] == 0.5
    assert lines == ["    bad: load again failed: RuntimeError: no second session"] * 2


def test_a_reference_that_ignores_its_input_is_flagged(tmp_path):
    """A model whose output does not depend on its input (here by construction; with random
    weights a deep net can get there) gets the note in the log and the Markdown; one whose output
    does, or whose input a shift leaves alone, does not."""
    import numpy as np

    if str(RUN.parent) not in sys.path:
        sys.path.insert(0, str(RUN.parent))
    from run import insensitive_reference

    class Fake:  # the Runner protocol, on a numpy function
        def __init__(self, fn):
            self.fn = fn

        def prepare(self, inputs):
            return inputs

        def run(self, prepared):
            return self.fn(*prepared)

        def outputs(self, raw):
            return [raw]

    x = np.random.default_rng(0).standard_normal((1, 3, 8)).astype(np.float32)
    const = Fake(lambda a: np.full((1, 4), 0.25, np.float32) + 0 * a[..., :4].sum())
    live = Fake(lambda a: a[..., :4] * 2)
    assert insensitive_reference(const, (x,), const.outputs(const.run((x,))))
    assert not insensitive_reference(live, (x,), live.outputs(live.run((x,))))
    # a set function of the last axis (a point cloud's max over its points, as DGCNN and
    # PointNet): invariant under a roll, which a permutation is, but it does use its input
    pointset = Fake(lambda a: a.max(axis=-1))
    assert not insensitive_reference(pointset, (x,), pointset.outputs(pointset.run((x,))))
    ids = np.array([[3, 9, 3, 7, 120, 9, 0, 7]], np.int64)  # ids move to the next one seen, in range
    assert not insensitive_reference(Fake(lambda a: a * 0.5), (ids,), [ids * 0.5])
    assert insensitive_reference(Fake(lambda a: np.full(3, 0.25)), (ids,), [np.full(3, 0.25)])
    # a bag of tokens (mean-pooled embeddings, no positions) ignores the order, not the ids: a
    # roll of the ids flagged it
    table = np.random.default_rng(1).standard_normal((121, 4)).astype(np.float32)
    bag = Fake(lambda a: table[a].mean(axis=1))
    assert not insensitive_reference(bag, (ids,), bag.outputs(bag.run((ids,))))
    from run import perturbed_inputs
    (moved,) = perturbed_inputs((ids,))
    assert moved.dtype == ids.dtype and set(moved.ravel()) <= set(ids.ravel())
    assert (moved != ids).all()
    flat = np.zeros((1, 3, 8), np.float32)  # (the perturbation changes nothing: no verdict)
    assert not insensitive_reference(const, (flat,), const.outputs(const.run((flat,))))

    (tmp_path / "deadnet.py").write_text(DEAD_MODEL)
    result, md, out = _run(tmp_path, "--batches", "1", "--no-memory", "--engines", "kuiper,torch",
                           "--models", f"{tmp_path / 'deadnet.py'}:Dead", "--input-shape", "3,8,8")
    assert "ignores its input" in result["cells"][0]["reference_note"]
    assert "ignores its input" in md and "ignores its input" in out
    result, md, _ = _run(tmp_path / "live", "--batches", "1", "--no-memory", "--engines", "kuiper,torch",
                         "--models", f"{tmp_path / 'deadnet.py'}:Live", "--input-shape", "3,8,8")
    assert "reference_note" not in result["cells"][0] and "ignores its input" not in md


DEAD_MODEL = """
import torch
from torch import nn


class Dead(nn.Module):  # the input is multiplied by zero: only the bias reaches the output
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(192, 4)

    def forward(self, x):
        return self.fc(x.flatten(1) * 0.0)


class Live(Dead):
    def forward(self, x):
        return self.fc(x.flatten(1))
"""


def test_overhead_benchmark_runs():
    """benchmarks/bench_overhead.py on a short chain: its output matches torch (it asserts
    that itself) and it prints both lines."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_overhead.py"), "--steps", "12",
                           "--repeat", "5"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "us per step" in proc.stdout and "us per op" in proc.stdout, proc.stdout


def test_pnnx_failure_reports(tmp_path):
    """What the export harness reads from a pnnx run: a complete .pnnx.param (kept when pnnx
    crashes in a later pass), the log lines that say why it stopped, the signal's name."""
    from zoo.export import _exit_status, _param_complete, _pnnx_reason

    param = tmp_path / "m.pnnx.param"
    ops = ["pnnx.Input in0 0 1 0", "nn.ReLU r 1 1 0 1", "pnnx.Output out0 1 0 1"]
    param.write_text("7767517\n3 2\n" + "\n".join(ops) + "\n")
    assert _param_complete(param)
    param.write_text("7767517\n3 2\n" + "\n".join(ops[:2]) + "\n")  # cut short
    assert not _param_complete(param)
    param.write_text("7767518\n3 2\n" + "\n".join(ops) + "\n")
    assert not _param_complete(param)
    log = ("$ old command\nterminate called earlier\n$ /x/pnnx m.pt inputshape=[1,3]\n############# pass_level5\n"
           "terminate called after throwing an instance of 'std::length_error'\n  what():  vector::_M_default_append\n")
    assert _pnnx_reason(log) == ("terminate called after throwing an instance of 'std::length_error' | "
                                 "what():  vector::_M_default_append")
    assert _pnnx_reason("$ /x/pnnx m.pt\n## pass_level4\n## pass_level5\n## pass_ncnn\n") == (
        "## pass_level4 | ## pass_level5 | ## pass_ncnn")
    assert _exit_status(-11) == "-11 (SIGSEGV)" and _exit_status(-6) == "-6 (SIGABRT)" and _exit_status(1) == "1"


def test_nothing_timed_is_a_failure_with_a_readable_report(tmp_path):
    """Every model failing at run time (here: a model of your own that torch itself cannot run on
    the given shape, so no engine times it) gives exit status 1 after the report is written;
    mistakes on the command line (an unknown zoo name, a file without --input-shape) stop before
    any work with status 2 and a message without a KeyError's quotes."""
    out = tmp_path / "results"
    env = dict(os.environ, KUIPER_XP_BENCH_CACHE=str(tmp_path / "bench-cache"))
    (tmp_path / "net.py").write_text("import torch\ndef build():\n    return torch.nn.Conv2d(3, 4, 3)\n")
    proc = subprocess.run([sys.executable, str(RUN), "--models", f"{tmp_path / 'net.py'}:build",
                           "--input-shape", "5,8,8", "--quick", "--no-memory", "--engines", "kuiper,torch",
                           "--backends", "numpy", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nothing was timed" in proc.stderr
    latest = json.loads((out / "latest.json").read_text())
    assert all(e.get("error") for c in latest["cells"] for e in c["entries"]), latest["cells"]
    line = _usage_error(tmp_path / "usage", "--models", f"resnet19,{tmp_path / 'net.py'}:build")
    assert "no zoo model 'resnet19'" in line and "error: '" not in line
    line = _usage_error(tmp_path / "usage2", "--models", f"{tmp_path / 'net.py'}:build")
    assert "needs --input-shape" in line and "error: '" not in line


def test_a_torch_failure_is_a_row_not_a_crash(tmp_path):
    """A model torch itself cannot run on the given shape (wrong channel count): every engine gets
    its error row and the report is written (the reference run used to raise out of run.py)."""
    out = tmp_path / "results"
    env = dict(os.environ, KUIPER_XP_BENCH_CACHE=str(tmp_path / "bench-cache"))
    (tmp_path / "net.py").write_text("import torch\ndef build():\n    return torch.nn.Conv2d(3, 4, 3)\n")
    proc = subprocess.run([sys.executable, str(RUN), "--models", f"{tmp_path / 'net.py'}:build",
                           "--input-shape", "5,8,8", "--quick", "--no-memory", "--engines", "kuiper,onnxruntime",
                           "--backends", "numpy", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (out / "latest.json").exists()
    cell = json.loads((out / "latest.json").read_text())["cells"][0]
    assert all(e.get("error") or "no torch reference" in e.get("check", "") for e in cell["entries"]), cell


def test_a_failed_peer_keeps_its_ratio_column():
    """An engine that failed in every cell keeps its column in the ratio table, marked "error"
    (the column vanished, and with it any sign that ncnn had been asked for)."""
    if str(RUN.parent) not in sys.path:
        sys.path.insert(0, str(RUN.parent))
    from run import markdown, ratios

    cell = {"model": "m", "batch": 1, "input_shapes": [[1, 3]], "entries": [
        {"label": "kuiper[numpy]", "engine": "kuiper", "median_ms": 2.0, "iqr_ms": 0.1, "min_ms": 1.9, "runs": 3},
        {"label": "torch", "engine": "torch", "median_ms": 4.0, "iqr_ms": 0.1, "min_ms": 3.9, "runs": 3},
        {"label": "ncnn", "engine": "ncnn", "error": "RuntimeError: ncnn load_param failed"}]}
    cell["ratios"] = ratios(cell)
    meta = {"timestamp": "t", "engines": ["kuiper[numpy]", "torch", "ncnn"], "threads": 2, "runs": "3",
            "warmup": "1", "argv": [], "memory": False, "cpu": "c", "versions": {}, "backends": ["numpy"],
            "isa": "native", "isa_env": {}, "omp_wait_policy": None, "blas": {}, "load_runs": 1,
            "max_cell_seconds": None, "cpu_count": 2, "platform": "p", "wall_s": 1}
    md = markdown({"meta": meta, "cells": [cell]})
    table = md[md.index("## Ratios"):]
    assert "| model | batch | kuiper[numpy]/torch | kuiper[numpy]/ncnn |" in table
    assert "| m | 1 | 0.50 | error |" in table
