"""The ``kuiper-xp`` command: run / inspect / bench / backends, called in-process through
``main(argv)`` (plus one subprocess test of the installed console script and one of
``python -m kuiper_xp``). Expected values come from torch, from the stored test labels and torch
logits of the bundled model, or from numbers worked out by hand in the comments."""

from __future__ import annotations

import importlib.resources
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kuiper_xp
from kuiper_xp.cli import main
from kuiper_xp.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
DATA = importlib.resources.files("kuiper_xp.data")


def _stored():
    with (DATA / "digits_test.npz").open("rb") as fh, np.load(fh) as z:
        return {k: z[k] for k in z.files}


def _one_error_line(err: str, prefix: str = "kuiper-xp") -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note:")]
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"expected one error line, got:\n{err}"
    assert lines[0].startswith(prefix) and "error:" in lines[0], lines[0]
    return lines[0]


def _write_model(tmp_path: Path, text: str, name: str = "m") -> Path:
    """A pnnx model written by hand: layers without weights need no .bin."""
    ops = [ln for ln in text.strip().splitlines() if ln.strip()]
    operands = set()
    for ln in ops:
        tok = ln.split()
        n_in, n_out = int(tok[2]), int(tok[3])
        operands.update(tok[4:4 + n_in + n_out])
    p = tmp_path / f"{name}.pnnx.param"
    p.write_text(f"7767517\n{len(ops)} {len(operands)}\n" + "\n".join(ops) + "\n")
    return p


RELU_NCHW = """
pnnx.Input  in0  0 1 x #x=(?,3,4,4)f32
nn.ReLU     relu 1 1 x y #x=(?,3,4,4)f32 #y=(?,3,4,4)f32
pnnx.Output out0 1 0 y #y=(?,3,4,4)f32
"""
RELU_NC = """
pnnx.Input  in0  0 1 x #x=(?,5)f32
nn.ReLU     relu 1 1 x y #x=(?,5)f32 #y=(?,5)f32
pnnx.Output out0 1 0 y #y=(?,5)f32
"""
RELU_STATIC2 = RELU_NC.replace("?", "2")
TWO_IN_TWO_OUT = """
pnnx.Input  in_a  0 1 a #a=(?,5)f32
pnnx.Input  in_b  0 1 b #b=(?,2,3)f32
nn.ReLU     r     1 1 a ya #a=(?,5)f32 #ya=(?,5)f32
nn.Sigmoid  s     1 1 b yb #b=(?,2,3)f32 #yb=(?,2,3)f32
pnnx.Output out_a 1 0 ya #ya=(?,5)f32
pnnx.Output out_b 1 0 yb #yb=(?,2,3)f32
"""
UNSUPPORTED = """
pnnx.Input   in0   0 1 x #x=(?,5)f32
foo.Frobnicate f0  1 1 x y #x=(?,5)f32 #y=(?,5)f32
nn.ReLU      relu  1 1 y z #y=(?,5)f32 #z=(?,5)f32
bar.Twiddle  t0    1 1 z w #z=(?,5)f32 #w=(?,5)f32
pnnx.Output  out0  1 0 w #w=(?,5)f32
"""
MATMUL = """
pnnx.Input   in0 0 1 a #a=(?,4,6)f32
pnnx.Input   in1 0 1 b #b=(6,3)f32
torch.matmul mm  2 1 a b c $input=a $other=b #a=(?,4,6)f32 #b=(6,3)f32 #c=(?,4,3)f32
pnnx.Output  out 1 0 c #c=(?,4,3)f32
"""


def _digits_torch():
    """The bundled model's architecture (BatchNorm folded away by pnnx), for torch's FLOP count."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128, 32), nn.ReLU(), nn.Linear(32, 10)).eval()


def _torch_flops(module, *inputs) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        module(*inputs)
    return int(fc.get_total_flops())


# -- run: the bundled model ----------------------------------------------------------------------------
def _accuracy(out: str) -> float:
    m = re.search(r"accuracy:\s+([0-9.]+)% \((\d+)/(\d+)\)", out)
    assert m, out
    return float(m.group(1))


@pytest.mark.parametrize("backend, device", [(None, None), ("array_api_strict", "device1")])
def test_default_run_reaches_97_percent(tmp_path, capsys, backend, device):
    logits_file = tmp_path / "logits.npy"
    argv = ["run", "--output", str(logits_file), "--batch-size", "100"]
    if backend:
        argv += ["--backend", backend, "--device", device]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert _accuracy(out) >= 97.0
    expected_backend = backend or kuiper_xp.get_backend().name
    assert re.search(rf"backend:\s+{expected_backend} on {device or ''}", out), out
    assert re.search(r"throughput:\s+[0-9,]+ images/s", out), out
    diff = float(re.search(r"max \|difference\| of logits ([0-9.e+-]+)", out).group(1))
    # recompute from the saved logits against the stored labels and torch's logits
    stored = _stored()
    logits = np.load(logits_file)
    assert logits.shape == (450, 10) and logits.dtype == np.float32
    acc = float(np.mean(np.argmax(logits, axis=1) == stored["labels"])) * 100
    assert acc >= 97.0 and abs(acc - _accuracy(out)) < 0.01
    ref = stored["torch_logits"]
    err = float(np.max(np.abs(logits - ref)))
    assert err <= 1e-4 * float(np.max(np.abs(ref))), f"max |logits - torch| = {err}"
    assert abs(err - diff) <= 1e-3 * max(err, 1e-7) + 1e-9


def test_default_run_quiet_prints_only_the_accuracy(capsys):
    assert main(["run", "--quiet", "--backend", "numpy"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("accuracy:"), captured.out
    assert captured.err == ""


def test_bundled_model_on_png_digits(tmp_path, capsys):
    """--input with no MODEL runs the bundled model with its own normalisation: an 8x8 digit from
    the stored test set, saved as a grey PNG, is read back as the same input."""
    meta = json.loads((DATA / "digits_meta.json").read_text())["preprocess"]
    stored = _stored()
    from PIL import Image

    for i in range(3):
        raw = stored["images"][i, 0] * meta["std"] + meta["mean"]  # back to image / 16
        Image.fromarray(np.round(raw * 255).clip(0, 255).astype(np.uint8), mode="L").save(tmp_path / f"d{i}.png")
    assert main(["run", "-i", str(tmp_path), "-o", str(tmp_path / "y.npy"), "--topk", "1"]) == 0
    y = np.load(tmp_path / "y.npy")
    assert np.array_equal(np.argmax(y, axis=1), np.argmax(stored["torch_logits"][:3], axis=1))
    out = capsys.readouterr().out
    assert "top-1" in out and "d0.png" in out


# -- run: models and inputs -----------------------------------------------------------------------------
def test_run_npy_batches_through_directory_and_glob(tmp_path, capsys):
    model = _write_model(tmp_path, RELU_NCHW)
    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 4, 4)).astype(np.float32) for _ in range(7)]
    for i, x in enumerate(xs):
        np.save(d / f"{i:02d}.npy", x)
    expected = torch.relu(torch.from_numpy(np.stack(xs))).numpy()
    for src in (str(d), str(d / "*.npy")):
        out_file = tmp_path / "y.npy"
        assert main(["run", str(model), "--input", src, "--batch-size", "3", "-o", str(out_file)]) == 0
        y = np.load(out_file)
        assert y.dtype == np.float32 and np.array_equal(y, expected)
        out = capsys.readouterr().out
        assert "7 file(s), 7 row(s) in 3 batch(es)" in out


def test_run_casts_float64_with_a_note(tmp_path, capsys):
    model = _write_model(tmp_path, RELU_NC)
    x = np.linspace(-2, 2, 10).reshape(2, 5)  # float64
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 0
    err = capsys.readouterr().err
    assert "note: float64 input cast to float32" in err
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, torch.relu(torch.from_numpy(x).float()).numpy())


def test_run_cast_overflow_is_a_note_not_a_warning(tmp_path, capsys, recwarn):
    """float64 values beyond float32 become inf in the cast, as torch's .float() makes them: a
    note says how many (numpy printed an overflow RuntimeWarning from inside kuiper-xp)."""
    model = _write_model(tmp_path, RELU_NC)
    x = np.array([[1e300, -1e300, 1.0, 2.0, 3e38]], np.float64)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 0
    assert "2 value(s) beyond float32's range became inf" in capsys.readouterr().err
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), torch.relu(torch.from_numpy(x).float()).numpy())


def test_run_topk_summary_matches_torch(tmp_path, capsys):
    model = _write_model(tmp_path, RELU_NC)
    x = np.array([[0.1, 2.0, -1.0, 0.5, 1.5], [3.0, -2.0, 0.2, 0.1, 0.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy"), "--topk", "3"]) == 0
    out = capsys.readouterr().out
    y = torch.relu(torch.from_numpy(x))
    probs, idx = torch.topk(torch.softmax(y, dim=1), 3)
    for row in range(2):
        line = next(ln for ln in out.splitlines() if f"x.npy[{row}]" in ln)
        got = [int(t) for t in re.findall(r"(\d+) \(", line)]
        assert got == idx[row].tolist(), line
        assert f"({probs[row, 0].item():.3f})" in line


def test_run_static_batch_pads_the_last_batch(tmp_path):
    model = _write_model(tmp_path, RELU_STATIC2)
    x = np.arange(15, dtype=np.float32).reshape(3, 5) - 7
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"), "-q"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), torch.relu(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("nc", [RELU_NC, RELU_STATIC2], ids=["dynamic", "static2"])
def test_run_inputs_of_zero_rows(tmp_path, capsys, nc):
    """A 0-row input runs once and writes a 0-row output (torch gives one), with no top-k lines
    (it said "the model has 0 outputs" with -o, and printed an empty top-k list without)."""
    model = _write_model(tmp_path, nc)
    np.save(tmp_path / "x.npy", np.zeros((0, 5), np.float32))
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 0
    assert np.load(tmp_path / "y.npy").shape == torch.relu(torch.zeros(0, 5)).shape
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy")]) == 0
    out = capsys.readouterr().out
    assert "0 row(s)" in out and "(0, 5) float32" in out and "top-" not in out


@pytest.mark.parametrize("layout", ["npz_names", "npz_positional", "two_files", "named"])
def test_run_two_inputs_two_outputs(tmp_path, layout):
    model = _write_model(tmp_path, TWO_IN_TWO_OUT)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((4, 2, 3)).astype(np.float32)
    if layout == "npz_names":
        np.savez(tmp_path / "s.npz", a=a, b=b)
        inputs = ["-i", str(tmp_path / "s.npz")]
    elif layout == "npz_positional":
        np.savez(tmp_path / "s.npz", a, b)
        inputs = ["-i", str(tmp_path / "s.npz")]
    else:
        np.save(tmp_path / "a.npy", a)
        np.save(tmp_path / "b.npy", b)
        if layout == "two_files":
            inputs = ["-i", str(tmp_path / "a.npy"), "-i", str(tmp_path / "b.npy")]
        else:
            inputs = ["-i", f"b={tmp_path / 'b.npy'}", "-i", f"a={tmp_path / 'a.npy'}"]
    assert main(["run", str(model), *inputs, "-o", str(tmp_path / "y.npz"), "-q"]) == 0
    with np.load(tmp_path / "y.npz") as z:
        assert z.files == ["ya", "yb"], "keys are the output names"
        np.testing.assert_array_equal(z["ya"], torch.relu(torch.from_numpy(a)).numpy())
        np.testing.assert_allclose(z["yb"], torch.sigmoid(torch.from_numpy(b)).numpy(), rtol=1e-6)


def test_run_images_with_preprocessing(tmp_path, capsys):
    from PIL import Image

    model = _write_model(tmp_path, RELU_NCHW)
    rng = np.random.default_rng(2)
    for i, ext in enumerate(("png", "jpg")):
        Image.fromarray(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8), mode="RGB").save(tmp_path / f"im{i}.{ext}")
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    argv = ["run", str(model), "-i", str(tmp_path / "im*"), "--size", "4", "4", "--mean", *map(str, mean),
            "--std", *map(str, std), "-o", str(tmp_path / "y.npy")]
    assert main(argv) == 0
    expected = []
    for i, ext in enumerate(("png", "jpg")):
        with Image.open(tmp_path / f"im{i}.{ext}") as im:
            a = np.asarray(im.convert("RGB").resize((4, 4), Image.Resampling.BILINEAR), np.float32) / 255
        expected.append(((a - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1))
    ref = torch.relu(torch.from_numpy(np.stack(expected))).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, rtol=1e-6, atol=1e-6)


# -- bad input: one line, exit 1 or 2, no traceback ------------------------------------------------------
def _png(tmp_path):
    from PIL import Image

    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "rgb.png")
    return tmp_path / "rgb.png"


@pytest.mark.parametrize("case, code, match", [
    ("missing_input", 1, "input file not found"),
    ("empty_dir", 1, "has no usable inputs"),
    ("bad_image", 1, "cannot decode image"),
    ("wrong_shape", 1, r"has shape \(2, 4\), but the model's input 'x' is \(\?, 5\)"),
    ("unknown_backend", 2, "unknown backend 'tensorflow'"),
    ("missing_model", 1, "model file not found"),
    ("no_match", 1, "matches nothing"),
    ("no_input", 2, "give the inputs with --input"),
    ("npy_for_two_outputs", 2, "use an .npz --output"),
    ("bad_output_ext", 2, "must end in .npy"),
    ("output_dir_missing", 2, r"the directory .*nodir does not exist"),
    ("unsupported", 1, r"2 operator\(s\) of 2 unsupported type\(s\) \(bar.Twiddle, foo.Frobnicate\)"),
    ("bad_batch", 2, "expected a positive integer"),
    ("unknown_input_name", 2, r"no input named 'zz'; its inputs are 'x'"),
    ("mean_count", 2, r"--mean has 2 values; the model's input has 3 channel"),
])
def test_bad_input_is_one_line(tmp_path, capsys, case, code, match):
    nc = _write_model(tmp_path, RELU_NC)
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.png").write_bytes(b"\x89PNG but not really")
    np.save(tmp_path / "wrong.npy", np.zeros((2, 4), np.float32))
    np.save(tmp_path / "ok.npy", np.zeros((2, 5), np.float32))
    two = _write_model(tmp_path, TWO_IN_TWO_OUT, "two")
    np.savez(tmp_path / "two.npz", a=np.zeros((1, 5), np.float32), b=np.zeros((1, 2, 3), np.float32))
    argv = {
        "missing_input": ["run", str(nc), "-i", str(tmp_path / "nope.npy")],
        "empty_dir": ["run", str(nc), "-i", str(tmp_path / "empty")],
        "bad_image": ["run", str(_write_model(tmp_path, RELU_NCHW, "img")), "-i", str(tmp_path / "bad.png")],
        "wrong_shape": ["run", str(nc), "-i", str(tmp_path / "wrong.npy")],
        "unknown_backend": ["run", str(nc), "-i", str(tmp_path / "ok.npy"), "--backend", "tensorflow"],
        "missing_model": ["run", str(tmp_path / "nomodel.pnnx.param"), "-i", str(tmp_path / "ok.npy")],
        "no_match": ["run", str(nc), "-i", str(tmp_path / "*.jpeg")],
        "no_input": ["run", str(nc)],
        "npy_for_two_outputs": ["run", str(two), "-i", str(tmp_path / "two.npz"), "-o", str(tmp_path / "y.npy")],
        "bad_output_ext": ["run", str(nc), "-i", str(tmp_path / "ok.npy"), "-o", str(tmp_path / "y.csv")],
        "output_dir_missing": ["run", str(nc), "-i", str(tmp_path / "ok.npy"), "-o", str(tmp_path / "nodir" / "y.npy")],
        "unsupported": ["run", str(_write_model(tmp_path, UNSUPPORTED, "u")), "-i", str(tmp_path / "ok.npy")],
        "bad_batch": ["run", str(nc), "-i", str(tmp_path / "ok.npy"), "--batch-size", "0"],
        "unknown_input_name": ["run", str(nc), "-i", f"zz={tmp_path / 'ok.npy'}"],
        "mean_count": ["run", str(_write_model(tmp_path, RELU_NCHW, "img3")), "-i", str(_png(tmp_path)),
                       "--mean", "0.5", "0.5"],
    }[case]
    assert main(argv) == code
    err = capsys.readouterr().err
    if code == 2 and case == "bad_batch":  # argparse: usage line, then the error line
        assert "Traceback" not in err and re.search(match, err.strip().splitlines()[-1])
        return
    line = _one_error_line(err)
    assert re.search(match, line), line


def test_verbose_adds_the_traceback(tmp_path, capsys):
    model = _write_model(tmp_path, RELU_NC)
    assert main(["run", str(model), "-i", str(tmp_path / "nope.npy"), "--verbose"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("kuiper-xp: error: input file not found")


# -- progress bar ---------------------------------------------------------------------------------------
class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal():
    plain = io.StringIO()
    with Progress(10, "running", stream=plain) as bar:
        bar.update(10)
    assert plain.getvalue() == ""
    tty = _TTY()
    with Progress(10, "running", stream=tty, min_interval=0) as bar:
        bar.update(4)
        assert "running [" in tty.getvalue() and "4/10" in tty.getvalue()
        bar.update(6)
    assert "10/10" in tty.getvalue() and tty.getvalue().endswith("\r"), "the bar is erased at the end"


def test_run_draws_the_bar_on_a_tty_stderr_only(tmp_path, capsys, monkeypatch):
    model = _write_model(tmp_path, RELU_NC)
    np.save(tmp_path / "x.npy", np.zeros((6, 5), np.float32))
    argv = ["run", str(model), "-i", str(tmp_path / "x.npy"), "-b", "2", "-o", str(tmp_path / "y.npy")]
    assert main(argv) == 0
    assert "running [" not in capsys.readouterr().err, "no bar when stderr is not a terminal"
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(argv) == 0
    assert "running [" in tty.getvalue() and "6/6" in tty.getvalue()


# -- inspect --------------------------------------------------------------------------------------------
def test_inspect_bundled_model(tmp_path, capsys):
    dot = tmp_path / "g.dot"
    assert main(["inspect", "--dot", str(dot), "--batch", "4"]) == 0
    out = capsys.readouterr().out
    for name in ("convbn2d_0", "features.7", "torch.flatten_0", "classifier.3"):
        assert name in out
    assert "5:(?,16,4,4)f32" in out, "operands are shown with their shapes"
    # folded weights: conv 8*9+8, 16*72+16, 32*144+32; linear 32*128+32, 10*32+10
    assert "parameters:   10,346 (40.4 KiB of weights, 41,384 bytes)" in out
    flops = _torch_flops(_digits_torch(), torch.zeros(4, 1, 8, 8))
    assert f"at batch 4 ({flops:,})" in out and "estimate" in out
    assert re.search(r"peak memory:\s+[0-9.]+ (KiB|B) of live activations at batch 4", out), out
    assert "unsupported:  none" in out
    text = dot.read_text()
    assert text.startswith('digraph "digits.pnnx.param"') and text.count("->") == 13


def test_inspect_matmul_flops_match_torch(tmp_path, capsys):
    assert main(["inspect", str(_write_model(tmp_path, MATMUL)), "--batch", "3"]) == 0
    out = capsys.readouterr().out
    flops = _torch_flops(lambda a, b: torch.matmul(a, b), torch.zeros(3, 4, 6), torch.zeros(6, 3))
    assert f"at batch 3 ({flops:,})" in out


def test_inspect_flags_every_unsupported_operator(tmp_path, capsys):
    model = _write_model(tmp_path, UNSUPPORTED, "u")
    dot = tmp_path / "u.dot"
    assert main(["inspect", str(model), "--dot", str(dot)]) == 0
    out = capsys.readouterr().out
    flagged = [ln for ln in out.splitlines() if ln.rstrip().endswith("! unsupported")]
    assert len(flagged) == 2 and "f0" in flagged[0] and "t0" in flagged[1]
    assert "unsupported:  2 operator(s) of 2 type(s) (bar.Twiddle, foo.Frobnicate)" in out
    assert f"! foo.Frobnicate 'f0' ({model}:4)" in out and f"! bar.Twiddle 't0' ({model}:6)" in out
    assert "peak memory:  n/a" in out
    assert dot.read_text().count("#f8c9c4") == 2, "unsupported operators are red in the dot file"


def test_inspect_missing_model_is_one_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "none.pnnx.param")]) == 1
    _one_error_line(capsys.readouterr().err)


# -- bench ----------------------------------------------------------------------------------------------
def test_bench_bundled_model(capsys):
    assert main(["bench", "--batch", "8", "--warmup", "1", "--runs", "3", "--threads", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "input:       '0' (8, 1, 8, 8) float32" in out
    assert re.search(r"latency:\s+median [0-9.]+ (us|ms|s)\s+IQR .* min .* max ", out), out
    assert re.search(r"load:\s+[0-9.]+ (us|ms|s) \(parse \+ build\)", out)
    assert "samples/s at batch 8" in out
    prof = out.split("slowest layers")[1].strip().splitlines()[1:]
    assert len(prof) == 3 and all(re.search(r"nn\.\w+|torch\.\w+", ln) for ln in prof), out


def test_bench_hand_written_model_and_shape_errors(tmp_path, capsys):
    model = _write_model(tmp_path, RELU_NCHW)
    assert main(["bench", str(model), "--batch", "2", "--runs", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "(2, 3, 4, 4) float32" in out and "relu" in out
    dyn = _write_model(tmp_path, RELU_NCHW.replace("(?,3,4,4)", "(?,3,?,?)"), "dyn")
    assert main(["bench", str(dyn), "--runs", "1"]) == 1
    assert "dynamic dimension 2; give its shape after the batch, --shape" in _one_error_line(capsys.readouterr().err)
    assert main(["bench", str(dyn), "--runs", "1", "--shape", "1,3,5,5"]) == 0
    assert "(1, 3, 5, 5) float32" in capsys.readouterr().out
    # the shape after the batch, as the help and the error say: --batch goes in front
    for shape in ("3,6,5", "x=3,6,5", "3x6x5"):
        assert main(["bench", str(dyn), "--runs", "1", "--batch", "2", "--shape", shape]) == 0
        assert "(2, 3, 6, 5) float32" in capsys.readouterr().out
    assert main(["run", str(model), "--input", str(tmp_path / "nothing.png"), "--scale", "0"]) == 2
    assert "positive number" in capsys.readouterr().err


# -- backends, help, entry points --------------------------------------------------------------------------
def test_backends_lists_every_backend(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    infos = kuiper_xp.list_backends()
    for info in infos:
        line = next(ln for ln in out.splitlines() if ln.startswith(info.name + " "))
        if info.available:
            assert "available" in line and all(d in line for d in info.devices)
        else:
            assert "unavailable" in line and info.reason.split("(")[0].strip() in line
    assert "default:" in out
    from kuiper_xp.backends import mkl_kernels, numpy_fast

    mkl_line = next(ln for ln in out.splitlines() if ln.startswith("numpy option: MKL products and vector math:"))
    lib = mkl_kernels.find_library()
    want = "on" if numpy_fast.mkl_enabled() else ("installed, off" if lib else "not installed")
    where = f"found at {lib}; " if lib else ""  # (where it was found: a venv may see its base Python's)
    assert f"vector math: {want} ({where}KUIPER_XP_MKL=1" in mkl_line
    assert any(ln.startswith("numpy option: numba kernels:") for ln in out.splitlines())


@pytest.mark.parametrize("command, expect", [
    ([], ["run", "inspect", "bench", "backends"]),
    (["run"], ["--input", "--backend", "--device", "--output", "--batch-size", "--topk", "--size",
               "--mean", "--std", "--verbose", "--quiet"]),
    (["inspect"], ["--dot", "--backend", "estimate"]),
    (["bench"], ["--batch", "--warmup", "--runs", "--threads", "--backend", "--device"]),
    (["backends"], ["--verbose"]),
])
def test_help_of_every_command(capsys, command, expect):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kuiper-xp")
    for word in expect:
        assert word in out, f"{word} missing from the help of {command}"


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_console_script_is_installed():
    exe = shutil.which("kuiper-xp") or shutil.which("kuiper-xp", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the kuiper-xp console script is not installed (pip install -e .)")
    r = subprocess.run([exe, "backends"], capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    assert re.search(r"^numpy\s+available", r.stdout, re.M), r.stdout
    r = subprocess.run([exe, "run", "nowhere.pnnx.param", "-i", "x.npy"], capture_output=True,
                       text=True, timeout=120, env=_env())
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == "kuiper-xp: error: model file not found: nowhere.pnnx.param"


def test_python_m_kuiper_xp_help():
    r = subprocess.run([sys.executable, "-m", "kuiper_xp", "--help"], capture_output=True, text=True,
                       timeout=120, env=_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: kuiper-xp") and "bench" in r.stdout


# -- docs/operators.md ----------------------------------------------------------------------------------
def test_operator_docs_are_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_operator_table", ROOT / "scripts" / "gen_operator_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    committed = (ROOT / "docs" / "operators.md").read_text(encoding="utf-8")
    assert committed == mod.render(), ("docs/operators.md is out of date with the layer registry; "
                                       "run: python scripts/gen_operator_table.py")
    from kuiper_xp.layers import registry

    for name in registry.types():
        assert f"| `{name}` |" in committed
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert mod.render_readme_section() in readme, (
        "README.md's operator table is out of date; run: python scripts/gen_operator_table.py")


def test_inspect_without_the_bin_still_prints_the_table(tmp_path, capsys):
    text = """
pnnx.Input  in0 0 1 x #x=(?,6)f32
nn.Linear   fc  1 1 x y bias=True in_features=6 out_features=4 @bias=(4)f32 @weight=(4,6)f32 #x=(?,6)f32 #y=(?,4)f32
pnnx.Output out 1 0 y #y=(?,4)f32
"""
    model = _write_model(tmp_path, text)
    assert main(["inspect", str(model), "--batch", "2"]) == 0
    captured = capsys.readouterr()
    assert "m.pnnx.bin not found" in captured.err
    assert "parameters:   28 (112 B of weights, 112 bytes)" in captured.out  # 4*6 + 4
    flops = _torch_flops(torch.nn.Linear(6, 4), torch.zeros(2, 6))
    assert f"at batch 2 ({flops:,})" in captured.out
    # a damaged .bin: the table still, a note naming the problem, then the error and status 1
    (tmp_path / "m.pnnx.bin").write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["inspect", str(model), "--batch", "2"]) == 1
    captured = capsys.readouterr()
    assert "parameters:   28" in captured.out
    assert "m.pnnx.bin unreadable" in captured.err and "not a valid pnnx .bin" in captured.err.splitlines()[-1]


class _Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(3, 4)

    def forward(self, ids, cls):
        return self.emb(ids.flatten(1)).sum(1) + torch.nn.functional.one_hot(cls, 5).float()[:, :4]


def test_bench_draws_token_ids_inside_their_tables(tmp_path, capsys):
    """Random integer inputs stay under the table they index (an embedding of 3 rows, one_hot of
    5 classes): the benchmark runs instead of stopping on an out-of-range index."""
    from helpers import export_module

    ids, cls = torch.tensor([[[0, 2], [1, 1]]]), torch.tensor([4])
    param = export_module(_Tokens(), (ids, cls), tmp_path, inputs2=(ids.repeat(2, 1, 1), cls.repeat(2)))
    assert main(["bench", str(param), "--batch", "2", "--runs", "2", "--warmup", "0", "--profile-runs", "0"]) == 0
    out = capsys.readouterr().out
    assert "in [0, 3)" in out and "in [0, 5)" in out
    g = kuiper_xp.load(param)
    assert g.index_input_limits() == {g.inputs[0].name: 3, g.inputs[1].name: 5}


def test_run_refuses_a_damaged_weight_file(tmp_path, capsys, monkeypatch):
    """One flipped bit in a stored weight: the command checks the zip CRC-32 of every weight it
    reads and stops with one line naming the member (the library does when asked:
    KUIPER_XP_VERIFY_WEIGHTS=1 / binfile.VERIFY_CRC)."""
    import struct
    import zipfile

    from kuiper_xp.pnnx import binfile

    monkeypatch.delenv("KUIPER_XP_VERIFY_WEIGHTS", raising=False)
    monkeypatch.setattr(binfile, "VERIFY_CRC", False)
    for f in ("digits.pnnx.param", "digits.pnnx.bin"):
        shutil.copy(DATA / f, tmp_path / f)
    binf = tmp_path / "digits.pnnx.bin"
    info = max(zipfile.ZipFile(binf).infolist(), key=lambda i: i.file_size)
    assert info.compress_type == zipfile.ZIP_STORED
    with open(binf, "r+b") as fh:
        fh.seek(info.header_offset)
        n, m = struct.unpack("<HH", fh.read(30)[26:30])
        fh.seek(info.header_offset + 30 + n + m + info.file_size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x40]))
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    assert main(["run", str(tmp_path / "digits.pnnx.param"), "-i", str(tmp_path / "x.npy")]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert info.filename in line and "CRC-32" in line
    kuiper_xp.load(tmp_path / "digits.pnnx.param")  # the library's default: no check
    monkeypatch.setattr(binfile, "VERIFY_CRC", True)
    with pytest.raises(kuiper_xp.errors.BinFormatError, match="CRC-32"):
        kuiper_xp.load(tmp_path / "digits.pnnx.param")


def test_image_options_on_array_inputs_get_a_note(tmp_path, capsys):
    """--size/--mean/--std/--scale only preprocess images: given with .npy inputs, a note says
    they are not applied (they were ignored silently)."""
    model = _write_model(tmp_path, RELU_NCHW)
    np.save(tmp_path / "x.npy", np.ones((1, 3, 4, 4), np.float32))
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy"), "--mean", "0.5", "--scale", "2"]) == 0
    err = capsys.readouterr().err
    assert "--mean/--scale apply to images only" in err
    assert main(["run", str(model), "-i", str(tmp_path / "x.npy")]) == 0
    assert "images only" not in capsys.readouterr().err
