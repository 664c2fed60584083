"""The numpy backend's output-buffer pool (backends/numpy_fast.BufferPool): buffers are reused only
when nothing else refers to them, and results handed to the caller are never overwritten."""

from __future__ import annotations

import importlib.resources

import numpy as np
import pytest
from kuiper_xp.backends import numpy_fast as nf

import kuiper_xp

DATA = importlib.resources.files("kuiper_xp.data")


@pytest.fixture
def tiny_pool(monkeypatch):
    monkeypatch.setattr(nf.BufferPool, "MIN_BYTES", 0)
    return nf.BufferPool()


def test_a_sole_buffer_is_reused(tiny_pool):
    a = tiny_pool.empty((4, 5), np.float32)
    where = id(a.base)
    tiny_pool.give(a)  # the caller's contract: give the last reference, then drop it
    del a
    assert tiny_pool.idle_bytes == 4096  # one grain
    b = tiny_pool.empty((2, 10), np.float32)
    assert id(b.base) == where and tiny_pool.idle_bytes == 0


def test_a_buffer_with_a_view_or_a_second_reference_is_kept_out(tiny_pool):
    a = tiny_pool.empty((4, 5), np.float32)
    view = a[1:]  # noqa: F841  (alive: the buffer is still in use)
    tiny_pool.give(a)
    assert tiny_pool.idle_bytes == 0
    c = tiny_pool.empty((4, 5), np.float32)
    other = [c]  # noqa: F841
    tiny_pool.give(c)
    assert tiny_pool.idle_bytes == 0
    tiny_pool.give(np.ones(3))  # not ours: ignored
    assert tiny_pool.idle_bytes == 0


def test_best_fit_and_cap(tiny_pool):
    big = tiny_pool.empty((1 << 14,), np.float32)  # 64 KiB
    tiny_pool.give(big)
    del big
    small = tiny_pool.empty((100,), np.float32)  # 64 KiB is over twice its size: a new buffer
    assert small.base is not None and tiny_pool.idle_bytes == 1 << 16
    half = tiny_pool.empty((1 << 13,), np.float32)  # 32 KiB: takes the idle 64 KiB one
    assert tiny_pool.idle_bytes == 0 and half.base.nbytes == 1 << 16
    tiny_pool.give(half)
    del half
    tiny_pool.max_bytes = 1 << 16
    more = tiny_pool.empty((1 << 14,), np.float32)  # takes it again; then one more, new
    more2 = tiny_pool.empty((1 << 14,), np.float32)
    tiny_pool.give(more)
    del more
    tiny_pool.give(more2)  # over the cap: dropped
    del more2
    assert tiny_pool.idle_bytes == 1 << 16
    tiny_pool.clear()
    assert tiny_pool.idle_bytes == 0


def test_graph_outputs_survive_later_calls(monkeypatch):
    """Every intermediate of the digits model goes through the pool; results of one call are
    unchanged by the next, and repeated calls agree bit for bit with a pool-less graph."""
    monkeypatch.setattr(nf.BufferPool, "MIN_BYTES", 0)
    with (DATA / "digits_test.npz").open("rb") as fh, np.load(fh) as z:
        images = z["images"]
    param = DATA / "digits.pnnx.param"
    g = kuiper_xp.load(param, backend="numpy")
    plain = kuiper_xp.load(param, backend="numpy")
    plain._pool = None
    y1 = g(images[:64])[0]
    keep = y1.copy()
    assert g._pool.idle_bytes > 0  # intermediates came back
    y2 = g(images[64:128])[0]
    y3 = g(images[:64])[0]
    np.testing.assert_array_equal(y1, keep)
    np.testing.assert_array_equal(y3, keep)
    np.testing.assert_array_equal(y2, plain(images[64:128])[0])
    assert y1.base is not y2.base


def test_release_memory_frees_the_idle_buffers(monkeypatch):
    monkeypatch.setattr(nf.BufferPool, "MIN_BYTES", 0)
    with (DATA / "digits_test.npz").open("rb") as fh, np.load(fh) as z:
        images = z["images"][:32]
    g = kuiper_xp.load(DATA / "digits.pnnx.param", backend="numpy")
    g(images)
    nf.release_workspaces()  # (scratch arrays of earlier tests)
    g(images)
    idle = g._pool.idle_bytes
    scratch = sum(b.nbytes for bufs in nf._workspaces for b in bufs.values())
    assert idle > 0 and scratch > 0
    assert g.release_memory() == idle + scratch and g._pool.idle_bytes == 0
    assert not any(nf._workspaces[k] for k in range(len(nf._workspaces)))
    np.testing.assert_array_equal(g(images)[0], kuiper_xp.load(DATA / "digits.pnnx.param", backend="numpy")(images)[0])
    strict = kuiper_xp.load(DATA / "digits.pnnx.param", backend="array_api_strict")
    assert strict.release_memory() == 0


def test_lent_buffers_come_back_only_once_every_view_is_gone(tiny_pool):
    a = tiny_pool.empty((4, 5), np.float32)
    view = a.T[1:]  # what the caller gets may be a view of a view
    where = id(a.base)
    tiny_pool.lend((view, np.ones(3), 7))  # not ours / not arrays: ignored
    tiny_pool.lend((view,))  # twice: noted once
    del a
    tiny_pool.reclaim()
    assert tiny_pool.idle_bytes == 0  # the view keeps it in use
    del view
    tiny_pool.reclaim()
    assert tiny_pool.idle_bytes == 4096
    assert id(tiny_pool.empty((20,), np.float32).base) == where


def test_dropped_results_are_reused_and_kept_ones_never_overwritten(monkeypatch):
    """Results handed to the caller: reused by a later call once dropped, never while held
    (a held one stays bit-equal through later calls); clear() forgets lent ones."""
    monkeypatch.setattr(nf.BufferPool, "MIN_BYTES", 0)
    with (DATA / "digits_test.npz").open("rb") as fh, np.load(fh) as z:
        images = z["images"]
    g = kuiper_xp.load(DATA / "digits.pnnx.param", backend="numpy")
    y1 = g(images[:64])[0]
    keep, where = y1.copy(), id(y1.base)
    y2 = g(images[64:128])[0]
    assert id(y2.base) != where
    np.testing.assert_array_equal(y1, keep)
    del y1
    y3 = g(images[:64])[0]  # y1's buffer was free again: reused
    assert id(y3.base) == where
    np.testing.assert_array_equal(y3, keep)
    y4 = g(images[:64])[0]
    np.testing.assert_array_equal(y3, keep)  # y3 held: untouched
    np.testing.assert_array_equal(y4, keep)
    g.release_memory()
    assert g._pool._lent == []
