"""The numpy backend's own threads (backends/numpy_fast.py): the worker team, GEMMs split over it
inside a compute scope, and OpenBLAS pinned to one thread there and restored after."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
from helpers import in_fast_scope
from kuiper_xp.backends import numpy_fast as nf


@pytest.fixture
def threads3(monkeypatch):
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_MACS", 0)
    old = nf.set_num_threads(3)
    yield
    nf.set_num_threads(old)


def _pieces_seen(monkeypatch):
    """Record the out-shapes of the BLAS calls _gemm makes."""
    seen = []
    real = np.matmul

    class _Spy:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def matmul(a, b, out=None):
            seen.append(out.shape)
            return real(a, b, out=out)
    monkeypatch.setattr(nf, "np", _Spy())
    return seen


@pytest.mark.parametrize("a_shape, b_shape, how", [
    ((37, 50), (50, 301), "columns"),      # columns split in 16-wide blocks, a short last block
    ((301, 50), (50, 20), "rows"),         # few columns: rows
    ((36, 40, 30), (36, 30, 77), "stack"),  # Winograd's batched product: over the stack
    ((1, 40, 30), (5, 30, 200), "columns"),  # broadcast stack of 1, too few matrices to split
    ((3, 60, 30), (3, 30, 5), "rows"),
])
def test_split_gemm_matches_matmul(threads3, monkeypatch, a_shape, b_shape, how):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    expected = np.matmul(a, b).astype(np.float64)
    out = np.full(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]), np.nan, np.float32)
    seen = _pieces_seen(monkeypatch)
    with nf.compute_scope():
        if not nf._gemm_split:
            pytest.skip("numpy's BLAS is not OpenBLAS here: GEMMs are not split")
        nf._gemm(a, b, out)
    assert len(seen) == 3, seen
    if how == "columns":
        assert all(s[-2] == out.shape[-2] for s in seen) and sum(s[-1] for s in seen) == out.shape[-1]
    elif how == "rows":
        assert all(s[-1] == out.shape[-1] for s in seen) and sum(s[-2] for s in seen) == out.shape[-2]
    else:
        assert sum(s[0] for s in seen) == out.shape[0]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_gemm_outside_a_scope_is_one_call(threads3, monkeypatch):
    seen = _pieces_seen(monkeypatch)
    a, b = np.ones((64, 64), np.float32), np.ones((64, 640), np.float32)
    nf._gemm(a, b, np.empty((64, 640), np.float32))
    assert len(seen) == 1


def test_scope_pins_openblas_and_restores_it():
    blas = nf._get_blas()
    if not blas.ok:
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    before = blas.get()
    old = nf.set_num_threads(2)
    try:
        with nf.compute_scope():
            assert blas.get() == 1
            assert nf.get_num_threads() == 2
            with nf.compute_scope():  # re-entrant
                assert blas.get() == 1
            assert blas.get() == 1
        assert blas.get() == before
        nf.set_num_threads(None)  # default: as many as BLAS had
        with nf.compute_scope():
            assert nf.get_num_threads() == before
    finally:
        nf.set_num_threads(old)
    assert blas.get() == before


def test_scope_pins_openblas_when_asked_for_one_thread_too():
    """``KUIPER_XP_NUM_THREADS=1`` (set_num_threads(1)) with OpenBLAS on several threads: the pass
    runs on one thread, OpenBLAS included (it was left on its own count: an LSTM's per-step
    products woke its workers every step, 15 ms against 1.1 for a (61, 1, 128) sequence)."""
    blas = nf._get_blas()
    if not blas.ok:
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    before = blas.get()
    blas.set(2)
    old = nf.set_num_threads(1)
    try:
        with nf.compute_scope():
            assert blas.get() == 1
            assert not nf._gemm_split
        assert blas.get() == 2
    finally:
        nf.set_num_threads(old)
        blas.set(before)


def test_scope_sets_the_ufunc_buffer_on_every_thread_and_restores_it(threads3):
    """Inside a scope, numpy's ufunc buffer is UFUNC_BUFSIZE on the caller and on the team's
    threads (a (C, L) by (C, 1) product over rows shorter than numpy's default buffer of 8192
    goes through the buffers: 1.8x slower); outside, the caller's own setting is back."""
    before = np.getbufsize()
    seen = {}

    def part(lo, hi):
        seen[lo] = np.getbufsize()
    with nf.compute_scope():
        assert np.getbufsize() == nf.UFUNC_BUFSIZE
        nf._parallel(part, 3, 1 << 30)
    assert sorted(seen) == [0, 1, 2]
    assert set(seen.values()) == {nf.UFUNC_BUFSIZE}
    assert np.getbufsize() == before


def _affinity_or_skip():
    if not nf._HAS_AFFINITY or nf._current_cpu() is None:
        pytest.skip("no sched_setaffinity / sched_getcpu here")
    mask = os.sched_getaffinity(0)
    if len(mask) < 2:
        pytest.skip("this process may run on one CPU only")
    return mask


def test_scope_holds_the_caller_on_its_cpu_and_keeps_the_workers_off_it(threads3, monkeypatch):
    """Inside a scope the thread dispatching the team's jobs runs on one CPU, the one it was on,
    and the workers' masks leave that CPU out (else Linux may wake them onto it and the split
    work runs serially); the caller's own mask is back after the scope."""
    before = _affinity_or_skip()
    monkeypatch.setattr(nf, "PLACE_TEAM", True)
    monkeypatch.setattr(nf, "_cpus_busy", lambda k, cpus: False)
    seen = {}

    def part(lo, hi):
        seen[lo] = os.sched_getaffinity(0)
    with nf.compute_scope():
        nf._parallel(part, 3, 1 << 30)
        inside = os.sched_getaffinity(0)
        nf._parallel(part, 3, 1 << 30)  # a second job: nothing changes
        assert os.sched_getaffinity(0) == inside
    assert len(inside) == 1 and inside <= before
    (cpu,) = inside
    assert seen[0] == inside
    assert seen[1] == seen[2] == before - {cpu}
    assert os.sched_getaffinity(0) == before


def test_placement_ends_with_the_callers_own_scope(threads3, monkeypatch):
    """A thread's mask is back when its own scope ends, even while another thread's scope is
    still open; a thread calling the team outside any scope of its own is not held."""
    before = _affinity_or_skip()
    monkeypatch.setattr(nf, "PLACE_TEAM", True)
    monkeypatch.setattr(nf, "_cpus_busy", lambda k, cpus: False)
    opened, close = threading.Event(), threading.Event()
    seen = {}

    def other():
        with nf.compute_scope():
            opened.set()
            close.wait(30)
    t = threading.Thread(target=other)
    t.start()
    try:
        assert opened.wait(30)
        nf._parallel(lambda lo, hi: None, 3, 1 << 30)  # no scope of its own: left alone
        seen["outside"] = os.sched_getaffinity(0)
        with nf.compute_scope():
            nf._parallel(lambda lo, hi: None, 3, 1 << 30)
            seen["inside"] = os.sched_getaffinity(0)
        seen["after"] = os.sched_getaffinity(0)
    finally:
        close.set()
        t.join(30)
    assert seen["outside"] == before and seen["after"] == before
    assert len(seen["inside"]) == 1


def test_scope_leaves_placement_alone_when_switched_off_or_on_one_cpu(threads3, monkeypatch):
    """KUIPER_XP_PIN_THREADS=0 (PLACE_TEAM False), or a caller allowed one CPU only: the
    caller's mask stays as it is inside the scope."""
    before = _affinity_or_skip()
    monkeypatch.setattr(nf, "PLACE_TEAM", False)
    with nf.compute_scope():
        nf._parallel(lambda lo, hi: None, 3, 1 << 30)
        assert os.sched_getaffinity(0) == before
    monkeypatch.setattr(nf, "PLACE_TEAM", True)
    one = {min(before)}
    os.sched_setaffinity(0, one)
    try:
        with nf.compute_scope():
            nf._parallel(lambda lo, hi: None, 3, 1 << 30)
            assert os.sched_getaffinity(0) == one
        assert os.sched_getaffinity(0) == one
    finally:
        os.sched_setaffinity(0, before)


def test_placement_is_skipped_and_undone_while_other_work_keeps_the_cpus_busy(threads3, monkeypatch):
    """With more runnable threads elsewhere than CPUs left for the team, the caller is not held
    and workers placed by an earlier scope get their masks back; once the machine is quiet
    again (samples smoothed), placement resumes."""
    before = _affinity_or_skip()
    monkeypatch.setattr(nf, "PLACE_TEAM", True)
    monkeypatch.setattr(nf, "LOAD_SAMPLE_S", 0.0)  # a fresh sample on every scope
    monkeypatch.setattr(nf, "_load", {"t": float("-inf"), "others": 0.0})
    runnable = {"n": 1}
    monkeypatch.setattr(nf, "_read_runnable", lambda: runnable["n"])
    seen = {}

    def part(lo, hi):
        seen[lo] = os.sched_getaffinity(0)

    with nf.compute_scope():  # quiet: placed
        nf._parallel(part, 3, 1 << 30)
        assert len(os.sched_getaffinity(0)) == 1
    assert seen[1] != before
    # twice as many other runnable threads as CPUs: the first busy sample is averaged with the
    # quiet one before it (on 2 CPUs one CPU's worth already tips it, on 16 it did not)
    runnable["n"] = 1 + 2 * len(before)
    seen.clear()
    with nf.compute_scope():
        nf._parallel(part, 3, 1 << 30)
        assert os.sched_getaffinity(0) == before
        nf._parallel(part, 3, 1 << 30)  # still left alone within the scope
        assert os.sched_getaffinity(0) == before
    assert seen[0] == seen[1] == seen[2] == before
    assert all(w.excluded is None for w in nf._team)
    runnable["n"] = 1
    for _ in range(8):  # the smoothed count decays below the threshold
        with nf.compute_scope():
            nf._parallel(part, 3, 1 << 30)
            placed = len(os.sched_getaffinity(0)) == 1
    assert placed
    assert os.sched_getaffinity(0) == before


def test_cpus_busy_reads_the_runnable_count():
    """The fourth field of /proc/loadavg counts this thread: alone on two CPUs a team of two is
    not 'busy'; with three others runnable it is."""
    n = nf._read_runnable()
    if n is None:
        pytest.skip("no /proc/loadavg here")
    assert n >= 1
    saved = dict(nf._load)
    try:
        nf._load.update(t=float("-inf"), others=0.0)
        orig = nf._read_runnable
        nf._read_runnable = lambda: 1
        assert not nf._cpus_busy(2, 2)
        nf._load.update(t=float("-inf"), others=0.0)
        nf._read_runnable = lambda: 4
        assert nf._cpus_busy(2, 2)
        assert not nf._cpus_busy(2, 16) or nf._load["others"] + 2 > 16.5
    finally:
        nf._read_runnable = orig
        nf._load.update(saved)


def test_worker_error_reaches_the_caller_and_the_team_stays_usable(threads3):
    def part(lo, hi):
        if lo > 0:
            raise ZeroDivisionError(f"piece {lo}")
    with pytest.raises(ZeroDivisionError, match="piece"):
        nf._parallel(part, 9, 1 << 30)
    got = np.zeros(9)

    def fill(lo, hi):
        got[lo:hi] = np.arange(lo, hi)
    nf._parallel(fill, 9, 1 << 30)
    np.testing.assert_array_equal(got, np.arange(9))


def test_nested_and_concurrent_parallel_calls_finish(threads3):
    """A _parallel inside a piece (or from another thread while the team is busy) runs inline."""
    out = np.zeros((4, 30))

    def inner(row):
        def part(lo, hi):
            out[row, lo:hi] += 1
        return part

    def outer(lo, hi):
        for r in range(lo, hi):
            nf._parallel(inner(r), 30, 1 << 30)

    errors = []

    def run():
        try:
            nf._parallel(outer, 4, 1 << 30)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
    ts = [threading.Thread(target=run) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in ts)
    np.testing.assert_array_equal(out, 3)


@pytest.mark.parametrize("a_shape, b_shape, transpose_b", [
    ((2, 3, 20, 16), (2, 3, 20, 16), True),   # attention scores: q @ k^T on a transposed view
    ((2, 3, 20, 20), (2, 3, 20, 16), False),  # weights @ v
    ((1, 20, 16), (4, 16, 70), False),        # broadcast stack
    ((200, 16), (16, 70), False),
    ((5, 1, 20, 16), (5, 2, 16, 8), False),   # 4-D with broadcasting: numpy's own matmul
])
def test_fast_matmul_matches_numpy(threads3, a_shape, b_shape, transpose_b):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    with nf.compute_scope():
        got = nf.matmul(a, b)
    np.testing.assert_allclose(got, np.matmul(a.astype(np.float64), b.astype(np.float64)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        with nf.compute_scope():
            nf.matmul(a, b[..., :-1, :])


@pytest.mark.parametrize("shape", [(300, 9, 32), (3, 300, 20), (6, 50, 64), (2, 3, 17, 40)])
def test_fast_matmul_of_a_stack_by_its_own_transpose(threads3, monkeypatch, shape):
    """``x @ x^T`` on stacks (feature interactions, Gram matrices): operands sharing memory are
    copied where numpy's per-matrix syrk path is slow (many small or large matrices, see
    ``matmul``) and left to it elsewhere; torch's result either way (4-D stacks too), the operand
    itself untouched."""
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    before = x.copy()
    shared = []
    real = nf._gemm
    monkeypatch.setattr(nf, "_gemm", lambda a, b, out: shared.append(np.shares_memory(a, b)) or real(a, b, out))
    with nf.compute_scope():
        got = nf.matmul(x, np.swapaxes(x, -1, -2))
    want = torch.matmul(torch.from_numpy(before), torch.from_numpy(before).transpose(-1, -2)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(x, before)
    m, k = shape[-2], shape[-1]
    assert shared == [not (m >= 256 or m <= 16 or k <= 32)], shared


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 0, 5), (2, 3, 5, 4)), ((2, 3, 4, 0), (2, 3, 0, 6)),
                                            ((2, 3, 4, 5), (2, 3, 5, 0)), ((0, 4, 5), (0, 5, 3))])
def test_fast_matmul_of_empty_stacks(threads3, a_shape, b_shape):
    """An empty 4-D stack: numpy could not infer the flattened stack's -1 there (a ValueError
    from deep inside the fast path); torch gives the empty (or zero) product."""
    import torch

    a = np.ones(a_shape, np.float32)
    b = np.ones(b_shape, np.float32)
    with nf.compute_scope():
        got = nf.matmul(a, b)
    want = torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("delay_us, low, high", [(0, 1.0, 1.0), (200, 8.0, 8.0), (60, 2.0, 8.0)])
def test_gemm_split_threshold_follows_the_measured_hand_off(monkeypatch, delay_us, low, high):
    """The round trip of an empty job to a worker, over the 20 us the GEMM threshold was tuned
    at, scales that threshold (1 to 8): a machine whose idle cores wake slowly splits only
    products big enough to pay for it."""
    import time

    class FakeWorker:
        def start(self, fn, lo, hi):
            fn(lo, hi)

        def finish(self):
            end = time.perf_counter() + delay_us * 1e-6
            while time.perf_counter() < end:
                pass

    monkeypatch.setattr(nf, "_gemm_split_scale", nf._gemm_split_scale)
    nf._calibrate_handoff(FakeWorker())
    assert low <= nf._gemm_split_scale <= high, nf._gemm_split_scale


def test_a_product_under_the_scaled_threshold_is_not_split(monkeypatch):
    seen = _pieces_seen(monkeypatch)
    monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_MACS", 100_000)
    old = nf.set_num_threads(2)
    try:
        a, b = np.ones((37, 50), np.float32), np.ones((50, 301), np.float32)  # 556,850 MACs
        for scale, pieces in ((8.0, 1), (1.0, 2)):  # 800,000 > 556,850 >= 100,000
            monkeypatch.setattr(nf, "_gemm_split_scale", scale)
            seen.clear()
            with nf.compute_scope():
                if not nf._gemm_split:
                    pytest.skip("numpy's BLAS is not OpenBLAS here: GEMMs are not split")
                out = nf._gemm(a, b, np.empty((37, 301), np.float32))
            assert len(seen) == pieces and float(out[5, 7]) == 50.0, (scale, seen)
    finally:
        nf.set_num_threads(old)


def _split_decisions(monkeypatch) -> list[bool]:
    """Record, for each numpy_fast._parallel call, whether it runs on more than one thread."""
    calls = []
    real = nf._parallel

    def spy(fn, n, work):
        calls.append(min(nf._threads_now(), n) > 1 and work >= nf.PARALLEL_MIN_ELEMENTS)
        return real(fn, n, work)

    monkeypatch.setattr(nf, "_parallel", spy)
    return calls


@pytest.mark.parametrize("shape, causal, split", [
    ((8, 12, 50, 64), False, True),   # ViT-B/32 at batch 8: 3.1-3.6 ms on one thread, 1.9-2.1 split
    ((1, 6, 197, 64), False, True),   # DeiT-Small's 6 heads of 197 tokens
    ((4, 4, 64, 32), True, False),    # Gemma-size causal: 0.52 ms on one thread, 0.92 split
    ((1, 12, 50, 64), False, False),  # ViT-B/32 at batch 1
])
def test_attention_split_counts_the_products(monkeypatch, shape, causal, split):
    """Whether attention splits over the threads where the hand-offs are slow (the calibrated
    scale of a VM whose idle vCPUs take ~110 us to wake) counts the products' D-deep work, not
    only the softmax's passes over the scores: ViT-B/32's heads at batch 8 ran on one thread."""
    calls = _split_decisions(monkeypatch)
    monkeypatch.setattr(nf, "_gemm_split_scale", 5.5)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    L, D = shape[-2], shape[-1]
    mask = np.triu(np.full((L, L), -np.inf, np.float32), 1) if causal else None
    y = in_fast_scope(nf, lambda: nf.attention(q, k, v, D ** -0.5, mask), threads=2)
    assert calls and any(calls) == split, calls
    ref = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), is_causal=causal).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 5.5])
@pytest.mark.parametrize("what, size, split_at_5_5", [
    ("layer_norm", (196, 384), False),   # DeiT-S's tokens: 0.15-0.20 ms on one thread, 0.34-0.45 split
    ("layer_norm", (128, 768), False),   # BERT-base at 128 tokens (rows of 768: never split)
    ("layer_norm", (400, 512), True),    # narrower rows of as many elements: split
    ("layer_norm", (400, 768), False),   # ViT-B/32 at batch 8: 0.34-0.40 ms on one thread, 0.43-0.55 split
    ("layer_norm", (3136, 96), True),    # ConvNeXt-T's first stage: split
    ("gelu", (150_000,), False),         # 0.67 against 0.78 ms split
    ("gelu", (300_000,), True),
])
def test_short_call_passes_split_by_the_hand_off_scale(monkeypatch, scale, what, size, split_at_5_5):
    """LayerNorm's blocks and the chunked activations split over the threads only from a size
    that grows with the calibrated hand-off scale (over 2 and 4): where idle vCPUs wake slowly a
    small LayerNorm took twice as long on two threads; where hand-offs are quick (scale 1) every
    size above PARALLEL_MIN_ELEMENTS splits, as before, but for LayerNorm rows of
    NORM_SPLIT_MAX_WIDTH or more, which never split. Results against torch either way."""
    calls = _split_decisions(monkeypatch)
    monkeypatch.setattr(nf, "_gemm_split_scale", scale)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(size).astype(np.float32)
    if what == "layer_norm":
        d = size[-1]
        w, b = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
        y = in_fast_scope(nf, lambda: nf.layer_norm(x, d, w, b, 1e-5), threads=2)
        ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (d,), torch.from_numpy(w), torch.from_numpy(b))
    else:
        y = in_fast_scope(nf, lambda: nf.activation_inplace(x.copy(), "gelu"), threads=2)
        ref = torch.nn.functional.gelu(torch.from_numpy(x))
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-5)
    expect = True if scale == 1.0 else split_at_5_5
    if what == "layer_norm" and size[-1] >= nf.NORM_SPLIT_MAX_WIDTH:
        expect = False  # (rows of 768 and more stay on one thread at any scale: faster there)
    assert calls and calls[-1] == expect, calls


@pytest.mark.parametrize("value,expected,warning", [
    ("1", 1, None), ("", None, None), ("abc", None, "not a positive integer"), ("-1", None, "not a positive integer"),
    ("0", None, "not a positive integer"), ("100000", "cpus", "more than the"),
])
def test_env_thread_count_is_checked(monkeypatch, value, expected, warning):
    """``KUIPER_XP_NUM_THREADS``: a bad value is ignored with a warning (it was ignored silently),
    more than the CPUs is capped with one (1000 threads made each call 8x slower)."""
    import warnings

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setenv("KUIPER_XP_NUM_THREADS", value)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = nf._env_threads()
    assert got == (cpus if expected == "cpus" else expected)
    texts = [str(w.message) for w in seen]
    assert (warning is None and not texts) or any(warning in t for t in texts), texts


@pytest.mark.parametrize("score, v_scale", [(79.0, 1e5), (-79.0, 1e-30), (19.0, 1.0), (-29.0, 1.0)])
def test_fast_attention_unnormalised_weights_neither_overflow_nor_underflow(threads3, score, v_scale):
    """Scores just inside the softmax's no-shift range: attention multiplies v by the weights
    before dividing by their sums, so at +-79 they must be shifted (inf or 0 there before)."""
    import torch

    rng = np.random.default_rng(0)
    q = np.ones((1, 2, 4, 1), np.float32)
    k = np.full((1, 2, 16, 1), score, np.float32)
    k[0, :, ::3] -= 0.5
    v = (rng.standard_normal((1, 2, 16, 8)) * v_scale).astype(np.float32)
    with nf.compute_scope():
        got = nf.attention(q, k, v, 1.0)
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), scale=1.0).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))


def test_fast_softmax_long_rows_near_the_no_shift_bound(threads3):
    """7000 values of 79.9 per row: exp(79.9) alone fits float32, their sum does not."""
    import torch

    x = np.full((17, 7000), 79.9, np.float32)
    x[:, ::7] = 79.0
    q, k = np.ones((1, 1, 1, 1), np.float32), np.full((1, 1, 8192, 1), 79.9, np.float32)
    v = np.random.default_rng(1).standard_normal((1, 1, 8192, 2)).astype(np.float32)
    with nf.compute_scope():
        got = nf.softmax_last(x)
        att = nf.attention(q, k, v, 1.0)
    np.testing.assert_allclose(got, torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=1e-5)
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), scale=1.0).numpy()
    np.testing.assert_allclose(att, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared-state", "errstate"])
def test_scope_silences_floating_point_errors_and_restores_the_callers_state(monkeypatch, prepared):
    """Inside a (nested) scope numpy's floating-point conditions are ignored and the ufunc
    buffer is UFUNC_BUFSIZE; on leaving, the caller's own settings (here: raise on division by
    zero, a buffer of 16384) are back, also after an exception. Both ways of setting them:
    the prepared error state, and np.errstate / np.setbufsize where numpy has none."""
    if not prepared:
        monkeypatch.setattr(nf, "_EXTOBJ", None)
    elif nf._EXTOBJ is None:
        pytest.skip("this numpy has no error-state context variable")
    with np.errstate(divide="raise", invalid="warn"):
        np.setbufsize(16384)
        try:
            with nf.compute_scope():
                assert np.geterr() == {"divide": "ignore", "over": "ignore", "under": "ignore", "invalid": "ignore"}
                assert np.getbufsize() == nf.UFUNC_BUFSIZE
                np.log(np.zeros(2))  # would raise outside
                with nf.compute_scope():
                    np.divide(np.ones(1), 0.0)
                assert np.geterr()["divide"] == "ignore"
            with pytest.raises(KeyError), nf.compute_scope():
                raise KeyError("inside")
            assert np.geterr()["divide"] == "raise" and np.geterr()["invalid"] == "warn"
            assert np.getbufsize() == 16384
            with pytest.raises(FloatingPointError):
                np.log(np.zeros(2))
        finally:
            np.setbufsize(8192)
