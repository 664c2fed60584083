"""Replays the regression corpus in ``tests/fuzz_corpus/``: inputs that broke (or nearly broke)
the readers, each named ``<expected outcome>__<what it is>``. ``ok`` means it must load; any
other prefix names the KuiperXPError subclass it must raise.

- ``param/*.pnnx.param``: parsed with :func:`kuiper_xp.pnnx.parse_param`;
- ``bin/<case>.pnnx.param`` + ``bin/<case>.pnnx.bin``: loaded with
  :func:`kuiper_xp.pnnx.load_model`, every weight read.

Add a case by dropping a file in; see ``fuzz_corpus/README.md``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kuiper_xp import errors
from kuiper_xp.errors import KuiperXPError
from kuiper_xp.pnnx import load_model, parse_param

CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
PARAMS = sorted((CORPUS / "param").glob("*.pnnx.param"))
BINS = sorted((CORPUS / "bin").glob("*.pnnx.bin"))


def _expected(path: Path):
    outcome = path.name.split("__", 1)[0]
    if outcome == "ok":
        return None
    cls = getattr(errors, outcome, None)
    assert isinstance(cls, type) and issubclass(cls, KuiperXPError), f"{path.name}: unknown outcome {outcome!r}"
    return cls


def _check(path: Path, fn):
    cls = _expected(path)
    t0 = time.perf_counter()
    if cls is None:
        fn()
    else:
        with pytest.raises(cls) as info:
            fn()
        assert type(info.value) is cls, f"{path.name}: raised {type(info.value).__name__}: {info.value}"
    # a bound on pathological slowness (quadratic scans took minutes), not a benchmark
    assert time.perf_counter() - t0 < 10


def test_corpus_is_there():
    assert len(PARAMS) >= 10 and len(BINS) >= 5


@pytest.mark.parametrize("path", PARAMS, ids=[p.name.split(".")[0] for p in PARAMS])
def test_param_corpus(path):
    _check(path, lambda: parse_param(path))


@pytest.mark.parametrize("path", BINS, ids=[p.name.split(".")[0] for p in BINS])
def test_bin_corpus(path):
    param = path.with_name(path.name[: -len(".bin")] + ".param")

    def run():
        m = load_model(param, path)
        try:
            for w in m.weights:
                a = w.numpy()
                assert a.shape == w.shape
        finally:
            m.close()

    _check(path, run)
