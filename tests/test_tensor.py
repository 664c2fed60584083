"""Tensor (seed 003) on every backend leg; reshape checked against numpy's order='C'/'F'."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kuiper_xp
from kuiper_xp import Tensor
from kuiper_xp.errors import KuiperXPError, ShapeError


def seed_column_major_reshape(a: np.ndarray, shape) -> np.ndarray:
    """Armadillo cube semantics written independently with numpy: a (c, r, k) cube is stored
    slice by slice, each slice column-major; reshape keeps that memory order."""
    def to_mem(x):
        if x.ndim == 1:
            return x
        if x.ndim == 2:
            return x.reshape(-1, order="F")
        return np.concatenate([x[c].reshape(-1, order="F") for c in range(x.shape[0])])

    mem = to_mem(a)
    if len(shape) == 1:
        return mem.reshape(shape)
    if len(shape) == 2:
        return mem.reshape(shape, order="F")
    c, r, k = shape
    return np.stack([mem[i * r * k:(i + 1) * r * k].reshape((r, k), order="F") for i in range(c)])


def test_channels_rows_cols_follow_the_seed(backend):
    assert (Tensor.zeros((5,), backend=backend).channels, Tensor.zeros((5,), backend=backend).rows,
            Tensor.zeros((5,), backend=backend).cols) == (1, 1, 5)
    t2 = Tensor.zeros((3, 4), backend=backend)
    assert (t2.channels, t2.rows, t2.cols) == (1, 3, 4)
    t3 = Tensor.ones((2, 3, 4), backend=backend)
    assert (t3.channels, t3.rows, t3.cols, t3.size, t3.ndim) == (2, 3, 4, 24, 3)
    with pytest.raises(ShapeError, match="4-D"):
        _ = Tensor.zeros((1, 2, 3, 4), backend=backend).channels


def test_seed_worked_example_row_and_column_major(backend):
    # seed 003: a 2x3x4 tensor filled 0..23, reshaped to (4, 6)
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor(a, backend=backend)
    np.testing.assert_array_equal(t.reshape((4, 6)).to_numpy(), a.reshape(4, 6, order="C"))
    got = t.reshape((4, 6), row_major=False).to_numpy()
    np.testing.assert_array_equal(got, seed_column_major_reshape(a, (4, 6)))
    # first column of the result walks channel 0's matrix column by column
    np.testing.assert_array_equal(got[:, 0], [0, 4, 8, 1])


@pytest.mark.parametrize("shape,target", [((6,), (2, 3)), ((2, 3), (3, 2)), ((4, 6), (24,)),
                                          ((2, 3), (6,)), ((3, 4), (2, 6))])
def test_column_major_matches_numpy_F_for_1d_and_2d(backend, shape, target):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = Tensor(a, backend=backend).reshape(target, row_major=False).to_numpy()
    np.testing.assert_array_equal(got, a.reshape(-1, order="F").reshape(target, order="F"))


def test_column_major_3d_is_not_numpy_F(backend):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = Tensor(a, backend=backend).reshape((3, 2, 4), row_major=False).to_numpy()
    np.testing.assert_array_equal(got, seed_column_major_reshape(a, (3, 2, 4)))
    assert not np.array_equal(got, a.reshape(-1, order="F").reshape((3, 2, 4), order="F"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_random_reshapes_match_numpy(dims, data):
    size = int(np.prod(dims))
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    r = data.draw(st.sampled_from(divisors))
    target = data.draw(st.sampled_from([(size,), (r, size // r)] + [
        (c, r2, size // (c * r2)) for c in divisors for r2 in divisors if size % (c * r2) == 0][:6]))
    a = np.random.default_rng(len(dims)).standard_normal(dims).astype(np.float32)
    for name in ("numpy", "array_api_strict"):
        t = Tensor(a, backend=name)
        np.testing.assert_array_equal(t.reshape(target).to_numpy(), a.reshape(target))
        np.testing.assert_array_equal(t.reshape(target, row_major=False).to_numpy(),
                                      seed_column_major_reshape(a, target))


def test_view_flatten_and_infer(backend):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a, backend=backend)
    np.testing.assert_array_equal(t.view((2, -1)).to_numpy(), a.reshape(2, 6))
    np.testing.assert_array_equal(t.flatten().to_numpy(), a.reshape(-1))
    np.testing.assert_array_equal(t.flatten(row_major=False).to_numpy(), a.reshape(-1, order="F"))
    assert t.shape == (3, 4)  # reshape returns a new tensor


@pytest.mark.parametrize("bad", [(5, 5), (0, 12), (-2, 6), (2.5, 4), ("3", 4), (True, 12), (-1, -1)])
def test_bad_reshape_targets_are_clear(backend, bad):
    t = Tensor.zeros((3, 4), backend=backend)
    with pytest.raises(ShapeError) as ei:
        t.reshape(bad)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, KuiperXPError)
    assert "(3, 4)" in str(ei.value) or "shape" in str(ei.value)


@pytest.mark.parametrize("bad", [(-1, 2), (2.0,), ("a",)])
def test_bad_constructor_shapes(backend, bad):
    with pytest.raises(ShapeError):
        Tensor.zeros(bad, backend=backend)


def test_pad_seed_style_and_pairs(backend):
    a = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    t = Tensor(a, backend=backend)
    got = t.pad((1, 2, 0, 1), value=-1.0).to_numpy()
    np.testing.assert_array_equal(got, np.pad(a, ((0, 0), (1, 2), (0, 1)), constant_values=-1))
    got = t.pad([(1, 0), (0, 0), (2, 2)]).to_numpy()
    np.testing.assert_array_equal(got, np.pad(a, ((1, 0), (0, 0), (2, 2))))
    with pytest.raises(ShapeError):
        t.pad((1, -1, 0, 0))


def test_fill_row_and_column_major(backend):
    vals = list(range(6))
    t = Tensor.zeros((2, 3), backend=backend)
    np.testing.assert_array_equal(t.fill(vals).to_numpy(), np.arange(6).reshape(2, 3, order="C"))
    np.testing.assert_array_equal(t.fill(vals, row_major=False).to_numpy(),
                                  np.arange(6).reshape(2, 3, order="F"))
    assert t.fill(7.0).to_numpy().tolist() == [[7.0] * 3] * 2
    for v in (np.float32(2.5), np.int64(3), np.array(1.5)):  # numpy scalars and 0-d arrays are scalars
        assert t.fill(v).to_numpy().tolist() == [[float(v)] * 3] * 2
    with pytest.raises(ShapeError, match="5 values"):
        t.fill([1, 2, 3, 4, 5])


def test_rand_is_seeded_and_backend_independent(backend):
    a = Tensor.rand((3, 4), seed=7, backend=backend).to_numpy()
    b = Tensor.rand((3, 4), seed=7, backend="numpy").to_numpy()
    np.testing.assert_array_equal(a, b)
    assert ((a >= 0) & (a < 1)).all()
    n = Tensor.randn((1000,), seed=1, backend=backend).to_numpy()
    assert abs(n.mean()) < 0.15 and 0.8 < n.std() < 1.2
    assert not np.array_equal(Tensor.rand((3,), seed=1, backend=backend).to_numpy(),
                              Tensor.rand((3,), seed=2, backend=backend).to_numpy())


def test_transform_index_and_access(backend):
    a = np.array([[-1.0, 2.0], [3.0, -4.0]], dtype=np.float32)
    t = Tensor(a, backend=backend)
    t.transform(lambda x: x * 2)
    np.testing.assert_array_equal(t.to_numpy(), a * 2)
    assert t.index(1) == 4.0  # row-major
    assert t.index(1, row_major=False) == 6.0  # column-major (seed/armadillo order)
    assert t.at(1, 1) == -8.0
    assert t[0, 1] == 4.0
    assert t[0].shape == (2,)
    with pytest.raises(IndexError):
        t.index(4)
    with pytest.raises(ShapeError):
        t.transform(lambda x: x[0:1, ...])


def test_wraps_any_backend_array_and_moves(backend):
    host = np.ones((2, 2), dtype=np.float32)
    native = backend.asarray(host)
    t = Tensor(native)
    assert t.backend.name == backend.name
    assert t.backend.same_device(backend.device)
    moved = t.to("numpy")
    assert moved.backend.name == "numpy"
    np.testing.assert_array_equal(moved.to_numpy(), host)
    np.testing.assert_array_equal(kuiper_xp.to_numpy(t), host)
    r = repr(t)
    assert "shape=(2, 2)" in r and backend.name in r
