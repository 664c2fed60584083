"""The backend test matrix: every test that takes ``backend`` (or ``xp``) runs on each leg.

Legs: numpy; array_api_strict on CPU_DEVICE and on its second device ``device1`` (catches a lost
``device=``); cupy (skipped where no CUDA device answers). ``KUIPER_XP_TEST_BACKENDS`` (comma
separated leg ids) narrows the matrix.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from kuiper_xp.backends import get_backend, list_backends

import kuiper_xp

LEGS = [
    ("numpy", "numpy", None),
    ("strict-cpu", "array_api_strict", "CPU_DEVICE"),
    ("strict-device1", "array_api_strict", "device1"),
    ("cupy", "cupy", None),
]

_avail = {info.name: info for info in list_backends()}
_only = {s.strip() for s in os.environ.get("KUIPER_XP_TEST_BACKENDS", "").split(",") if s.strip()}


def _leg_params(legs=LEGS):
    params = []
    for leg_id, name, device in legs:
        marks = []
        info = _avail[name]
        if not info.available:
            marks.append(pytest.mark.skip(reason=f"{name} unavailable: {info.reason}"))
        elif _only and leg_id not in _only:
            marks.append(pytest.mark.skip(reason=f"leg {leg_id} not in KUIPER_XP_TEST_BACKENDS"))
        params.append(pytest.param((name, device), id=leg_id, marks=marks))
    return params


@pytest.fixture(params=_leg_params())
def backend(request):
    """A kuiper_xp Backend: ``.xp``, ``.device``, ``.asarray(host)``, ``.to_numpy(a)``."""
    name, device = request.param
    return get_backend(name, device)


@pytest.fixture
def xp(backend):
    return backend.xp


@pytest.fixture(params=_leg_params([leg for leg in LEGS if leg[0] != "strict-device1"]))
def model_backend(request):
    """The matrix for whole-model tests (device1 is covered by the layer tests)."""
    name, device = request.param
    return get_backend(name, device)


def assert_close(actual, expected, rtol=1e-4, atol=None, what="output"):
    """Compare shape, dtype and values with ``max|a-e| <= rtol * max|e|`` (plus ``atol``)."""
    actual = kuiper_xp.to_numpy(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != expected {expected.dtype}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    fin = np.isfinite(expected)
    scale = float(np.max(np.abs(expected[fin]))) if fin.any() else 1.0
    bound = rtol * max(scale, 1e-30) + (atol if atol is not None else 0.0)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=f"{what}: NaN positions differ")
    np.testing.assert_array_equal(actual[~fin & ~np.isnan(expected)], expected[~fin & ~np.isnan(expected)],
                                  err_msg=f"{what}: infinities differ")
    err = float(np.max(np.abs(actual[fin].astype(np.float64) - expected[fin]))) if fin.any() else 0.0
    assert err <= bound, f"{what}: max |difference| {err:.3g} > bound {bound:.3g} (max |expected| {scale:.3g})"
