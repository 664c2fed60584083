"""Concurrency and endurance: one loaded graph run from several threads gives results bitwise
identical to serial runs; 10,000 inferences keep memory flat and results identical."""

from __future__ import annotations

import gc
import sys
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import kuiper_xp
from kuiper_xp.layers import registry
from kuiper_xp.pnnx import load_model

DATA = Path(__file__).resolve().parent.parent / "kuiper_xp" / "data"
DIGITS = DATA / "digits.pnnx.param"
HAVE_DIGITS_LAYERS = all(t in registry for t in ("nn.Conv2d", "nn.MaxPool2d", "nn.Linear", "torch.flatten"))
needs_digits = pytest.mark.skipif(not HAVE_DIGITS_LAYERS,
                                  reason="the digits model needs nn.Conv2d/nn.MaxPool2d/nn.Linear/torch.flatten")

SMALL = """7767517
7 6
pnnx.Input               in                       0 1 x #x=(?,3,8)f32
pnnx.Attribute           cst                      0 1 c @data=(3,8)f32 #c=(3,8)f32
nn.ReLU                  relu                     1 1 x r #x=(?,3,8)f32 #r=(?,3,8)f32
nn.Sigmoid               sig                      1 1 r s #r=(?,3,8)f32 #s=(?,3,8)f32
nn.Sigmoid               sig.c                    1 1 c t #c=(3,8)f32 #t=(3,8)f32
F.relu                   relu.2                   1 1 s u #s=(?,3,8)f32 #u=(?,3,8)f32
pnnx.Output              out                      2 0 u t
"""


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("small")
    (d / "m.pnnx.param").write_text(SMALL)
    w = np.linspace(-5, 5, 24, dtype="<f4").reshape(3, 8)
    with zipfile.ZipFile(d / "m.pnnx.bin", "w") as z:
        z.writestr("cst.data", w.tobytes())
    return d / "m.pnnx.param"


def _inputs(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * 4).astype(np.float32) for _ in range(n)]


def _digits_inputs(n):
    test = np.load(DATA / "digits_test.npz")
    x = next(v for v in test.values() if v.dtype == np.float32 and v.ndim == 4)
    return [x[i % len(x)][None] for i in range(n)]


def _as_bytes(outs) -> tuple[bytes, ...]:
    return tuple(np.ascontiguousarray(kuiper_xp.to_numpy(o)).tobytes() for o in outs)


def _threaded_equals_serial(g, inputs, threads=4, repeats=5):
    serial = [_as_bytes(g(x)) for x in inputs]
    barrier = threading.Barrier(threads)

    def worker(t):
        barrier.wait()
        got = []
        for r in range(repeats):
            order = range(len(inputs)) if (t + r) % 2 == 0 else reversed(range(len(inputs)))
            got.extend((i, _as_bytes(g(inputs[i]))) for i in order)
        return got

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(worker, range(threads)))
    for t, got in enumerate(results):
        assert len(got) == repeats * len(inputs)
        for i, outs in got:
            assert outs == serial[i], f"thread {t}: input {i} differs from the serial run"


@pytest.mark.parametrize("backend", ["numpy", "array_api_strict"])
def test_small_model_from_4_threads_is_bitwise_serial(small_model, backend):
    g = kuiper_xp.load(small_model, backend=backend)
    _threaded_equals_serial(g, _inputs((2, 3, 8), 16))


@needs_digits
@pytest.mark.parametrize("backend", ["numpy", "array_api_strict"])
def test_digits_from_4_threads_is_bitwise_serial(backend):
    g = kuiper_xp.load(DIGITS, backend=backend)
    _threaded_equals_serial(g, _digits_inputs(12), repeats=4)


def test_concurrent_first_calls_build_once(small_model):
    g = kuiper_xp.Graph(small_model, backend="numpy")
    x = _inputs((1, 3, 8), 1)[0]
    barrier = threading.Barrier(4)

    def first(_):
        barrier.wait()
        return _as_bytes(g(x))

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(first, range(4)))
    assert all(o == outs[0] for o in outs)
    layers = g.layers
    assert len(layers) == 5
    g.build()
    assert [id(a) for a in g.layers] == [id(a) for a in layers]


def test_concurrent_weight_reads():
    m = load_model(DIGITS)
    expected = {w.member: w.numpy().tobytes() for w in m.weights}

    def read_all(_):
        return [{w.member: w.numpy().tobytes() for w in m.weights} for _ in range(20)]

    with ThreadPoolExecutor(4) as pool:
        for batch in pool.map(read_all, range(4)):
            assert all(b == expected for b in batch)
    m.close()


# -- endurance ------------------------------------------------------------------------------------

def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:  # pragma: no cover - not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _endurance(g, inputs, n=10_000):
    """Run ``n`` inferences cycling through ``inputs``; every result equals the first pass, and
    neither Python object blocks nor RSS grow between 10% and 100% of the run."""
    first = [_as_bytes(g(x)) for x in inputs]
    blocks0 = rss0 = 0
    for k in range(n):
        i = k % len(inputs)
        outs = _as_bytes(g(inputs[i]))
        if outs != first[i]:
            raise AssertionError(f"inference {k}: input {i} gave a different result than the first time")
        if k == n // 10:
            gc.collect()
            blocks0, rss0 = sys.getallocatedblocks(), _rss_bytes()
    gc.collect()
    blocks, rss = sys.getallocatedblocks() - blocks0, _rss_bytes() - rss0
    # a leak of one small object per inference would add ~9,000 blocks
    assert blocks < 2_000, f"{blocks} Python memory blocks more after {n - n // 10} inferences"
    assert rss < 16 * 2**20, f"RSS grew by {rss / 2**20:.1f} MiB over {n - n // 10} inferences"


def test_small_model_10000_inferences(small_model):
    _endurance(kuiper_xp.load(small_model, backend="numpy"), _inputs((1, 3, 8), 10))


@needs_digits
def test_digits_10000_inferences():
    _endurance(kuiper_xp.load(DIGITS, backend="numpy"), _digits_inputs(10))
