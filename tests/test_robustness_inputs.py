"""Input faults at run time: wrong count, shape, dtype, namespace or device give a clear
InputError; NaN/Inf propagate as in torch without warnings; read-only and non-contiguous inputs
give correct results. Expected values come from torch."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from kuiper_xp.backends import get_backend

import kuiper_xp
from kuiper_xp.errors import InputError

CHAIN = """7767517
4 3
pnnx.Input               in                       0 1 0 #0=(2,3)f32
nn.ReLU                  relu                     1 1 0 1 #0=(2,3)f32 #1=(2,3)f32
nn.Sigmoid               sig                      1 1 1 2 #1=(2,3)f32 #2=(2,3)f32
pnnx.Output              out                      1 0 2 #2=(2,3)f32
"""

TWO = """7767517
6 4
pnnx.Input               in.a                     0 1 a #a=(?,4)f32
pnnx.Input               in.b                     0 1 b #b=(?,?)f32
nn.Sigmoid               sig                      1 1 a c #a=(?,4)f32 #c=(?,4)f32
nn.ReLU                  relu                     1 1 b d #b=(?,?)f32 #d=(?,?)f32
pnnx.Output              out.c                    1 0 c
pnnx.Output              out.d                    1 0 d
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    out = {}
    for name, text in (("chain", CHAIN), ("two", TWO)):
        (d / f"{name}.pnnx.param").write_text(text)
        out[name] = d / f"{name}.pnnx.param"
    return out


def torch_chain(x: np.ndarray) -> np.ndarray:
    return torch.sigmoid(torch.relu(torch.from_numpy(np.array(x, copy=True)))).numpy()


X = np.array([[-1.5, 0.0, 2.0], [3.0, -4.0, 0.25]], np.float32)


# -- count, shape, dtype --------------------------------------------------------------------------

def test_wrong_input_count(models):
    g = kuiper_xp.load(models["chain"], backend="numpy")
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(0: \(2, 3\) float32\); got 0"):
        g()
    with pytest.raises(InputError, match="got 2"):
        g(X, X)
    g2 = kuiper_xp.load(models["two"], backend="numpy")
    with pytest.raises(InputError, match=r"missing input\(s\) \['b'\]"):
        g2(a=np.zeros((1, 4), np.float32))
    with pytest.raises(InputError, match=r"unknown input name\(s\) \['zz'\]"):
        g2(a=np.zeros((1, 4), np.float32), zz=1)
    with pytest.raises(InputError, match="by position or by name, not both"):
        g2(X, b=X)


@pytest.mark.parametrize("shape,hint", [((3, 2), "dimensions 0, 1 are fixed in the export: check the input; "
                                                  "if they are meant to vary"), ((2, 3, 1), ""),
                                        ((6,), ""), ((1, 3), "static batch"), ((2, 4), "dimension 1 is fixed"),
                                        ((), "")])
def test_wrong_shape(models, shape, hint):
    g = kuiper_xp.load(models["chain"], backend="numpy")
    with pytest.raises(InputError, match=r"input 0 \(0\) has shape .* the model expects 0: \(2, 3\) float32") as e:
        g(np.zeros(shape, np.float32))
    assert hint in str(e.value)


def test_dynamic_dims_accept_any_size_but_not_a_wrong_static_dim(models):
    g = kuiper_xp.load(models["two"], backend="numpy")
    c, d = g(np.zeros((5, 4), np.float32), np.zeros((7, 9), np.float32))
    assert c.shape == (5, 4) and d.shape == (7, 9)
    with pytest.raises(InputError, match=r"input 0 \(a\) has shape \(5, 3\)"):
        g(np.zeros((5, 3), np.float32), np.zeros((1, 1), np.float32))


def test_checks_after_an_accepted_input(models):
    """The graph remembers the last input that passed its checks (type, shape, dtype) to skip
    them for the same kind of input: after good calls, a wrong shape, dtype, byte order or kind
    of object is still refused, and good inputs still give torch's result."""
    g = kuiper_xp.load(models["two"], backend="numpy")
    a, b = np.zeros((5, 4), np.float32), np.ones((7, 9), np.float32)
    for _ in range(2):
        g(a, b)
    with pytest.raises(InputError, match=r"input 0 \(a\) has shape \(5, 3\)"):
        g(np.zeros((5, 3), np.float32), b)
    with pytest.raises(InputError, match=r"input 1 \(b\) has dtype float64"):
        g(a, b.astype(np.float64))
    with pytest.raises(InputError, match="is a builtins.list"):
        g(a.tolist(), b)
    swapped = (b - 2).astype(">f4")  # (the same shape, a non-native float32: converted, not taken as is)
    _, d = g(a, swapped)
    np.testing.assert_array_equal(d, torch.relu(torch.from_numpy(b - 2)).numpy())
    c, d = g(a + 1, b)
    np.testing.assert_array_equal(c, torch.sigmoid(torch.from_numpy(a + 1)).numpy())
    np.testing.assert_array_equal(d, b)


@pytest.mark.parametrize("leg", [("numpy", None), ("array_api_strict", None)])
@pytest.mark.parametrize("dtype", ["float64", "float16", "int32", "int64", "bool", "complex64", "object", "<U3"])
def test_wrong_dtype_is_an_input_error_on_every_backend(models, leg, dtype):
    g = kuiper_xp.load(models["chain"], backend=get_backend(*leg))
    with pytest.raises(InputError, match=r"has dtype \S+, the model expects float32") as e:
        g(np.zeros((2, 3), dtype=dtype))
    assert "x.astype(numpy.float32)" in str(e.value)


def test_run_takes_a_mapping(models):
    """``Graph.run`` with an array (meant for ``g(x)``) says how to call it, not numpy's
    truth-value error."""
    g = kuiper_xp.load(models["two"], backend="numpy")
    for bad in (np.zeros((1, 4), np.float32), [np.zeros((1, 4), np.float32)]):
        with pytest.raises(InputError, match=r"run\(\) takes \{input name: array\} \(the names: \['a', 'b'\]\)"):
            g.run(bad)
    got = g.run({"a": np.zeros((1, 4), np.float32), "b": np.ones((2, 2), np.float32)})
    assert sorted(got) == sorted(s.name for s in g.outputs)


def test_big_endian_float32_is_accepted(models):
    g = kuiper_xp.load(models["chain"], backend="numpy")
    (y,) = g(X.astype(">f4"))
    np.testing.assert_allclose(kuiper_xp.to_numpy(y), torch_chain(X), rtol=1e-6)


# -- namespace and device -------------------------------------------------------------------------

@pytest.mark.parametrize("bad,pattern", [
    (torch.zeros(2, 3), r"torch.Tensor; pass a numpy array .*tensor.numpy\(\)"),
    ([[0.0] * 3] * 2, r"builtins.list; pass a numpy array .*numpy.asarray"),
    (None, r"builtins.NoneType"),
    (1.5, r"builtins.float"),
    ("abc", r"builtins.str"),
])
def test_foreign_objects(models, bad, pattern):
    g = kuiper_xp.load(models["chain"], backend="numpy")
    with pytest.raises(InputError, match=pattern):
        g(bad)


def test_strict_array_on_the_numpy_graph(models):
    import array_api_strict as s

    g = kuiper_xp.load(models["chain"], backend="numpy")
    with pytest.raises(InputError, match=r"array_api_strict.*pass a numpy array or an array of the graph's backend \(numpy\)"):
        g(s.asarray(X))


def test_numpy_graph_rejects_a_numpy_like_of_another_library(models):
    g = kuiper_xp.load(models["chain"], backend=get_backend("array_api_strict"))
    with pytest.raises(InputError, match=r"torch.Tensor"):
        g(torch.from_numpy(X))


@pytest.mark.parametrize("graph_dev,array_dev", [("CPU_DEVICE", "device1"), ("device1", "CPU_DEVICE")])
def test_array_on_another_device(models, graph_dev, array_dev):
    import array_api_strict as s

    g = kuiper_xp.load(models["chain"], backend="array_api_strict", device=graph_dev)
    x = s.asarray(X, device=s.Device(array_dev))
    with pytest.raises(InputError, match=f"is on device .*{array_dev}.*, but the graph runs on {graph_dev}"):
        g(x)
    # the right device, or a host array, works
    (y,) = g(s.asarray(X, device=s.Device(graph_dev)))
    np.testing.assert_allclose(kuiper_xp.to_numpy(y), torch_chain(X), rtol=1e-6)
    (y,) = g(X)
    assert str(y.device) == str(s.Device(graph_dev))


# -- special values --------------------------------------------------------------------------------

SPECIAL = np.array([[-np.inf, np.inf, np.nan], [-0.0, 0.0, 1e-45]], np.float32)


def _no_runtime_warnings(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with np.errstate(over="warn", invalid="warn", divide="warn", under="ignore"):
            return fn()


def test_nan_and_inf_propagate_like_torch_without_warnings(models, model_backend):
    g = kuiper_xp.load(models["chain"], backend=model_backend)
    (y,) = _no_runtime_warnings(lambda: g(SPECIAL))
    y = kuiper_xp.to_numpy(y)
    expected = torch_chain(SPECIAL)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_array_equal(y, expected)


def test_relu_on_special_values_is_exact(models, model_backend):
    g = kuiper_xp.load(models["two"], backend=model_backend)
    b = np.array([[-np.inf, np.inf, np.nan, -0.0, 1e-45, -1e-45]], np.float32)
    _, d = _no_runtime_warnings(lambda: g(np.zeros((1, 4), np.float32), b))
    expected = torch.relu(torch.from_numpy(b)).numpy()
    np.testing.assert_array_equal(kuiper_xp.to_numpy(d), expected)


def test_sigmoid_of_large_negative_finite_values_does_not_warn(models, model_backend):
    """exp(-x) overflows float32 for x < -88.7; a stable sigmoid never computes it."""
    g = kuiper_xp.load(models["two"], backend=model_backend)
    a = np.array([[-100.0, -1000.0, -3.4e38, 100.0]], np.float32)
    c, _ = _no_runtime_warnings(lambda: g(a, np.zeros((1, 1), np.float32)))
    expected = torch.sigmoid(torch.from_numpy(a)).numpy()
    got = kuiper_xp.to_numpy(c)
    # torch's float32 kernel gives 0 for sigmoid(-100); the exact value 3.8e-44 is as good
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-37)


# -- memory layouts --------------------------------------------------------------------------------

def _layouts():
    base = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 3
    ro = X.copy()
    ro.setflags(write=False)
    return {
        "read-only": ro,
        "transposed": np.ascontiguousarray(X.T).T,  # F-ordered (2, 3)
        "negative strides": X[::-1, ::-1].copy()[::-1, ::-1],
        "offset slice": base[:2, 1:4],
        "step slice": np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2] - 5,
        "broadcast view": np.broadcast_to(np.array([1.0, -2.0, 3.0], np.float32), (2, 3)),
        "read-only memmap-like": np.frombuffer(X.tobytes(), dtype=np.float32).reshape(2, 3),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_read_only_and_non_contiguous_inputs(models, model_backend, layout):
    x = _layouts()[layout]
    g = kuiper_xp.load(models["chain"], backend=model_backend)
    before = x.copy()
    (y,) = g(x)
    if model_backend.name == "cupy":  # the GPU's exp differs from the CPU's by an ulp
        np.testing.assert_allclose(kuiper_xp.to_numpy(y), torch_chain(x), rtol=3e-7, atol=0)
    else:
        np.testing.assert_array_equal(kuiper_xp.to_numpy(y), torch_chain(x))
    np.testing.assert_array_equal(x, before)  # the input is never written


def test_input_is_not_modified_in_place(models, model_backend):
    x = X.copy()
    g = kuiper_xp.load(models["chain"], backend=model_backend)
    g(x)
    np.testing.assert_array_equal(x, X)


def test_numpy_scalar_for_a_scalar_input(tmp_path):
    p = tmp_path / "s.pnnx.param"
    p.write_text("7767517\n3 2\npnnx.Input in 0 1 0 #0=()f32\nnn.ReLU r 1 1 0 1 #1=()f32\npnnx.Output out 1 0 1\n")
    g = kuiper_xp.load(p, backend="numpy")
    (y,) = g(np.float32(-2.0))
    assert kuiper_xp.to_numpy(y).shape == () and float(kuiper_xp.to_numpy(y)) == 0.0
