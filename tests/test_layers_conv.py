"""Convolution layers (kuiper_xp/layers/conv.py) against torch.nn.functional, on every backend leg;
the NumPy fast paths (backends/numpy_fast.py) against the generic Array-API kernels and torch;
one pnnx export of a module with many convolutions end to end.

Single-operator graphs are written by hand with ``op_graph`` (also imported by the pooling and
linear tests); expected values always come from torch on the same numpy data.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from array_api_compat import numpy as xnp
from conftest import assert_close
from helpers import in_fast_scope
from kuiper_xp.backends import get_backend
from torch import nn

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.layers import functional as fn

RTOL = 1e-5

# ---------------------------------------------------------------------------------------------
# single-operator graphs from a parameter dict

_SUFFIX = {"float32": "f32", "float64": "f64", "float16": "f16", "int64": "i64", "int32": "i32",
           "bool": "bool"}


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_fmt(i) for i in v) + ")"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _ann(name, a) -> str:
    return f"#{name}=(" + ",".join(str(d) for d in a.shape) + f"){_SUFFIX[str(a.dtype)]}"


def op_graph(tmp_path: Path, op_type: str, params: dict, inputs, outputs, weights=None, keys=None,
             backend="numpy", annotate=True):
    """Build a graph of one ``op_type`` operator: graph inputs shaped like ``inputs``, outputs
    annotated like ``outputs`` (the torch results, or a count when ``annotate`` is False),
    ``weights`` stored in a .bin, ``keys`` the ``$key`` of each input."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    weights = weights or {}
    keys = keys or [""] * len(inputs)
    n_out = outputs if isinstance(outputs, int) else len(outputs)
    lines = [f"pnnx.Input in{i} 0 1 i{i} {_ann(f'i{i}', a) if annotate else ''}" for i, a in enumerate(inputs)]
    ins = " ".join(f"i{i}" for i in range(len(inputs)))
    outs = " ".join(f"o{k}" for k in range(n_out))
    extra = [f"{k}={_fmt(v)}" for k, v in params.items()]
    extra += [f"@{w}=(" + ",".join(str(d) for d in a.shape) + f"){_SUFFIX[str(a.dtype)]}"
              for w, a in weights.items()]
    extra += [f"${k}=i{i}" for i, k in enumerate(keys) if k]
    if annotate:
        extra += [_ann(f"i{i}", a) for i, a in enumerate(inputs)]
        extra += [_ann(f"o{k}", a) for k, a in enumerate(outputs)]
    lines.append(f"{op_type} op {len(inputs)} {n_out} {ins} {outs} {' '.join(extra)}")
    lines.append(f"pnnx.Output out {n_out} 0 {outs}")
    param = tmp_path / "m.pnnx.param"
    param.write_text(f"7767517\n{len(lines)} {len(inputs) + n_out}\n" + "\n".join(lines) + "\n")
    with zipfile.ZipFile(tmp_path / "m.pnnx.bin", "w", zipfile.ZIP_STORED) as z:
        for w, a in weights.items():
            z.writestr(f"op.{w}", np.ascontiguousarray(a).tobytes())
    return kuiper_xp.load(param, backend=backend)


def run_op(backend, tmp_path, op_type, params, inputs, expected, weights=None, keys=None, rtol=RTOL):
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    g = op_graph(tmp_path, op_type, params, inputs, expected, weights, keys, backend)
    got = g(*inputs)
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=rtol, what=f"{op_type} output {k}")
    return g


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ---------------------------------------------------------------------------------------------
# nn.Conv2d / nn.Conv1d over a parameter grid

# (batch, cin, cout, h, w, kernel, stride, padding, dilation, groups, bias, padding_mode)
CONV2D = [
    (1, 3, 4, 7, 7, 3, 1, 1, 1, 1, True, "zeros"),
    (2, 4, 6, 9, 8, 3, 2, 1, 1, 1, False, "zeros"),
    (2, 4, 4, 9, 11, (3, 1), (2, 1), (1, 0), 1, 1, True, "zeros"),
    (1, 4, 8, 10, 9, 3, 1, "same", 2, 2, True, "zeros"),
    (1, 4, 4, 8, 8, 4, 1, "same", 1, 1, False, "zeros"),  # even kernel: asymmetric same padding
    (2, 6, 6, 9, 9, 3, 1, "valid", 1, 1, True, "zeros"),
    (2, 6, 6, 8, 7, 3, 2, 1, 1, 6, True, "zeros"),  # depthwise stride 2
    (1, 4, 8, 7, 9, 3, 1, 1, 1, 4, False, "zeros"),  # depthwise, channel multiplier 2
    (1, 6, 4, 9, 9, 5, 2, 2, 1, 2, True, "zeros"),
    (2, 5, 7, 6, 7, 1, 1, 0, 1, 1, True, "zeros"),  # 1x1
    (1, 4, 6, 9, 8, 1, 2, 0, 1, 1, False, "zeros"),  # 1x1 stride 2
    (1, 4, 4, 8, 8, 3, 1, (1, 2), 1, 1, True, "reflect"),
    (2, 3, 5, 7, 6, 3, 2, 1, 1, 1, True, "replicate"),
    (1, 4, 4, 6, 6, 3, 1, 2, 2, 2, True, "circular"),
    (1, 3, 3, 9, 7, (2, 3), 1, "same", 1, 1, True, "reflect"),
    (1, 4, 4, 5, 5, 3, 3, 0, 1, 1, True, "zeros"),  # stride larger than the overlap
    (1, 16, 16, 6, 5, 3, 1, 1, 1, 1, True, "zeros"),
    (1, 2, 3, 3, 3, 3, 1, 0, 1, 1, True, "zeros"),  # 1x1 output
]


def _torch_conv(x, w, b, stride, padding, dilation, groups, mode, nd=2):
    tx = t(x)
    if mode != "zeros":
        k = w.shape[2:]
        d = dilation if isinstance(dilation, tuple) else (dilation,) * nd
        if padding == "same":
            pads = [(dd * (kk - 1) // 2, dd * (kk - 1) - dd * (kk - 1) // 2) for kk, dd in zip(k, d)]
        else:
            p = padding if isinstance(padding, tuple) else (padding,) * nd
            pads = [(pp, pp) for pp in p]
        flat = [v for lo_hi in reversed(pads) for v in lo_hi]
        tx = F.pad(tx, flat, mode=mode)
        padding = 0
    conv = F.conv2d if nd == 2 else F.conv1d
    return conv(tx, t(w), None if b is None else t(b), stride, padding, dilation, groups).numpy()


def _conv_params(cin, cout, k, stride, padding, dilation, groups, bias, mode, nd=2):
    def tup(v):
        return v if isinstance(v, tuple) else (v,) * nd
    return {"bias": bias, "dilation": tup(dilation), "groups": groups, "in_channels": cin,
            "kernel_size": tup(k), "out_channels": cout, "padding": padding if isinstance(padding, str) else tup(padding),
            "padding_mode": mode, "stride": tup(stride)}


@pytest.mark.parametrize("case", CONV2D, ids=[f"c{i}" for i in range(len(CONV2D))])
def test_conv2d_matches_torch(backend, tmp_path, case):
    n, cin, cout, h, w, k, s, p, d, g, bias, mode = case
    kk = k if isinstance(k, tuple) else (k, k)
    x = rnd(n, cin, h, w)
    wt = rnd(cout, cin // g, *kk, seed=1)
    b = rnd(cout, seed=2) if bias else None
    expected = _torch_conv(x, wt, b, s, p, d, g, mode)
    weights = {"weight": wt} | ({"bias": b} if bias else {})
    run_op(backend, tmp_path, "nn.Conv2d", _conv_params(cin, cout, k, s, p, d, g, bias, mode), [x],
           expected, weights)


CONV1D = [
    (2, 4, 5, 11, 3, 1, 1, 1, 1, True, "zeros"),
    (1, 4, 6, 10, 3, 2, 0, 2, 2, False, "zeros"),
    (1, 4, 4, 9, 4, 1, "same", 1, 4, True, "zeros"),
    (2, 3, 3, 8, 2, 2, 1, 1, 1, True, "reflect"),
    (1, 4, 4, 9, 3, 1, 2, 1, 1, True, "circular"),
    (1, 3, 2, 7, 1, 1, 0, 1, 1, True, "zeros"),
]


@pytest.mark.parametrize("case", CONV1D, ids=[f"c{i}" for i in range(len(CONV1D))])
def test_conv1d_matches_torch(backend, tmp_path, case):
    n, cin, cout, length, k, s, p, d, g, bias, mode = case
    x = rnd(n, cin, length)
    wt = rnd(cout, cin // g, k, seed=1)
    b = rnd(cout, seed=2) if bias else None
    expected = _torch_conv(x, wt, b, s, p, d, g, mode, nd=1)
    weights = {"weight": wt} | ({"bias": b} if bias else {})
    run_op(backend, tmp_path, "nn.Conv1d", _conv_params(cin, cout, k, s, p, d, g, bias, mode, nd=1), [x],
           expected, weights)


def test_conv_unbatched_input(backend, tmp_path):
    x = rnd(4, 7, 6)
    wt = rnd(5, 4, 3, 3, seed=1)
    expected = F.conv2d(t(x), t(wt), None, 1, 1).numpy()
    run_op(backend, tmp_path, "nn.Conv2d", _conv_params(4, 5, 3, 1, 1, 1, 1, False, "zeros"), [x],
           expected, {"weight": wt})


def test_conv_padding_lost_by_pnnx_reads_as_same(backend, tmp_path):
    """pnnx writes ``padding=()`` for padding='same' with a non-zero padding_mode and an even
    kernel; the layer reads it as 'same' (torch pads 1 left, 2 right for kernel 4)."""
    x = rnd(1, 4, 9)
    wt = rnd(4, 4, 4, seed=1)
    b = rnd(4, seed=2)
    expected = F.conv1d(F.pad(t(x), (1, 2), mode="circular"), t(wt), t(b)).numpy()
    params = _conv_params(4, 4, 4, 1, 0, 1, 1, True, "circular", nd=1) | {"padding": None}
    run_op(backend, tmp_path, "nn.Conv1d", params, [x], expected, {"weight": wt, "bias": b})


# ---------------------------------------------------------------------------------------------
# transposed convolutions

# (batch, cin, cout, h, w, kernel, stride, padding, output_padding, dilation, groups, bias)
CONVT2D = [
    (1, 4, 3, 5, 6, 3, 2, 1, 1, 1, 1, True),
    (2, 4, 6, 4, 5, 3, 2, 0, 0, 1, 2, False),
    (1, 3, 2, 4, 4, 3, 1, 2, 0, 2, 1, True),
    (1, 4, 4, 5, 3, (2, 3), (3, 2), (1, 0), (2, 1), 1, 1, True),
    (2, 4, 4, 3, 3, 4, 2, 1, 0, 1, 4, True),  # depthwise transposed
    (1, 2, 3, 4, 4, 3, 2, 2, 1, 2, 1, True),  # output padding below dilation
    (1, 3, 4, 4, 5, 2, 3, 0, 0, 1, 1, True),  # stride above the kernel: a phase no tap reaches
    (2, 4, 2, 3, 4, 5, 2, 3, 1, 1, 1, False),  # padding above the stride crops whole taps
    # 20x16 maps at batch 5: each thread takes whole images (CONVT_IMAGES_MIN_PIXELS); with groups
    (5, 4, 6, 20, 16, 4, 2, 1, 1, 1, 2, True),
    # 6x8 maps at batch 5: the images share one GEMM (too small for an image per thread)
    (5, 4, 6, 6, 8, 4, 2, 1, 1, 1, 2, True),
    # 4x4 maps at batch 70: blocks of 64 images and of 6, each one GEMM and one col2im; stride 1
    (70, 4, 3, 4, 4, 2, 2, 0, 0, 1, 1, True),
    (9, 6, 6, 5, 3, 3, 1, 1, 0, 1, 3, True),
]


@pytest.mark.parametrize("case", CONVT2D, ids=[f"c{i}" for i in range(len(CONVT2D))])
def test_conv_transpose2d_matches_torch(backend, tmp_path, case):
    n, cin, cout, h, w, k, s, p, op_, d, g, bias = case
    kk = k if isinstance(k, tuple) else (k, k)
    x = rnd(n, cin, h, w)
    wt = rnd(cin, cout // g, *kk, seed=1)
    b = rnd(cout, seed=2) if bias else None
    expected = F.conv_transpose2d(t(x), t(wt), None if b is None else t(b), s, p, op_, g, d).numpy()

    def tup(v):
        return v if isinstance(v, tuple) else (v, v)
    params = {"bias": bias, "dilation": tup(d), "groups": g, "in_channels": cin, "kernel_size": kk,
              "out_channels": cout, "output_padding": tup(op_), "padding": tup(p), "stride": tup(s)}
    weights = {"weight": wt} | ({"bias": b} if bias else {})
    run_op(backend, tmp_path, "nn.ConvTranspose2d", params, [x], expected, weights)


def test_conv_transpose1d_matches_torch(backend, tmp_path):
    x = rnd(2, 5, 10)
    wt = rnd(5, 3, 3, seed=1)
    b = rnd(3, seed=2)
    expected = F.conv_transpose1d(t(x), t(wt), t(b), 2, 1, 1).numpy()
    params = {"bias": True, "dilation": (1,), "groups": 1, "in_channels": 5, "kernel_size": (3,),
              "out_channels": 3, "output_padding": (1,), "padding": (1,), "stride": (2,)}
    run_op(backend, tmp_path, "nn.ConvTranspose1d", params, [x], expected, {"weight": wt, "bias": b})


# ---------------------------------------------------------------------------------------------
# F.conv* with weights as input operands (what pnnx writes when the weight is computed)

def test_functional_conv2d_weight_and_bias_inputs(backend, tmp_path):
    x, wt, b = rnd(2, 4, 8, 8), rnd(4, 2, 3, 3, seed=1), rnd(4, seed=2)
    expected = F.conv2d(t(x), t(wt), t(b), 1, "same", 2, 2).numpy()
    params = {"dilation": (2, 2), "groups": 2, "padding": "same", "stride": (1, 1)}
    run_op(backend, tmp_path, "F.conv2d", params, [x, wt, b], expected, keys=["input", "weight", "bias"])


def test_functional_conv1d_weight_input_no_bias(backend, tmp_path):
    x, wt = rnd(1, 4, 9), rnd(5, 4, 3, seed=1)
    expected = F.conv1d(t(x), t(wt), None, 2, 1).numpy()
    params = {"bias": None, "dilation": (1,), "groups": 1, "padding": (1,), "stride": (2,)}
    run_op(backend, tmp_path, "F.conv1d", params, [x, wt], expected, keys=["input", "weight"])


def test_functional_conv_transpose2d_inputs(backend, tmp_path):
    x, wt, b = rnd(1, 4, 5, 5), rnd(4, 2, 3, 3, seed=1), rnd(4, seed=2)
    expected = F.conv_transpose2d(t(x), t(wt), t(b), 2, 0, 0, 2).numpy()
    params = {"dilation": (1, 1), "groups": 2, "output_padding": (0, 0), "padding": (0, 0), "stride": (2, 2)}
    run_op(backend, tmp_path, "F.conv_transpose2d", params, [x, wt, b], expected,
           keys=["input", "weight", "bias"])


def test_functional_conv_transpose1d_input_weight(backend, tmp_path):
    x, wt = rnd(1, 4, 9), rnd(4, 5, 3, seed=1)
    expected = F.conv_transpose1d(t(x), t(wt)).numpy()
    params = {"bias": None, "dilation": (1,), "groups": 1, "output_padding": (0,), "padding": (0,),
              "stride": (1,)}
    run_op(backend, tmp_path, "F.conv_transpose1d", params, [x, wt], expected, keys=["input", "weight"])


def test_functional_conv2d_weight_attribute(backend, tmp_path):
    x, wt = rnd(1, 3, 6, 6), rnd(2, 3, 3, 3, seed=1)
    expected = F.conv2d(t(x), t(wt), None, 1, 1).numpy()
    params = {"bias": None, "dilation": (1, 1), "groups": 1, "padding": (1, 1), "stride": (1, 1)}
    run_op(backend, tmp_path, "F.conv2d", params, [x], expected, {"weight": wt}, keys=["input"])


# ---------------------------------------------------------------------------------------------
# errors

def _conv_line_params(**over):
    return _conv_params(4, 4, 3, 1, 1, 1, 1, False, "zeros") | over


@pytest.mark.parametrize("over, needle", [
    ({"padding_mode": "zigzag"}, "padding_mode"),
    ({"padding": "full"}, "padding"),
    ({"padding": "same", "stride": (2, 2)}, "padding='same'"),
    ({"groups": 3}, "groups"),
    ({"kernel_size": (5, 5)}, "kernel_size"),
    ({"in_channels": 8}, "in_channels"),
    ({"stride": (0, 1)}, "stride"),
])
def test_conv_bad_parameters_fail_at_build(tmp_path, over, needle):
    with pytest.raises(LayerParameterError) as ei:
        op_graph(tmp_path, "nn.Conv2d", _conv_line_params(**over), [rnd(1, 4, 6, 6)], 1,
                 {"weight": rnd(4, 4, 3, 3)}, annotate=False)
    assert needle in str(ei.value) and "nn.Conv2d 'op'" in str(ei.value)


def test_conv_transpose_bad_output_padding(tmp_path):
    params = {"bias": False, "dilation": (1, 1), "groups": 1, "in_channels": 4, "kernel_size": (3, 3),
              "out_channels": 4, "output_padding": (2, 2), "padding": (0, 0), "stride": (2, 2)}
    with pytest.raises(LayerParameterError, match="output_padding"):
        op_graph(tmp_path, "nn.ConvTranspose2d", params, [rnd(1, 4, 6, 6)], 1, {"weight": rnd(4, 4, 3, 3)},
                 annotate=False)


def test_conv_channel_mismatch_raises_shape_error(backend, tmp_path):
    g = op_graph(tmp_path, "nn.Conv2d", _conv_line_params(), [rnd(1, 4, 6, 6)], 1,
                 {"weight": rnd(4, 4, 3, 3)}, backend=backend, annotate=False)
    with pytest.raises(ShapeError) as ei:
        g(rnd(1, 3, 6, 6))
    msg = str(ei.value)
    assert "(1, 3, 6, 6)" in msg and "(4, 4, 3, 3)" in msg


def test_conv_transpose_channel_mismatch_raises_shape_error(backend, tmp_path):
    params = {"bias": False, "dilation": (1, 1), "groups": 1, "in_channels": 4, "kernel_size": (3, 3),
              "out_channels": 2, "output_padding": (0, 0), "padding": (0, 0), "stride": (1, 1)}
    g = op_graph(tmp_path, "nn.ConvTranspose2d", params, [rnd(1, 4, 5, 5)], 1, {"weight": rnd(4, 2, 3, 3)},
                 backend=backend, annotate=False)
    with pytest.raises(ShapeError, match=r"\(1, 5, 5, 5\).*\(4, 2, 3, 3\)"):
        g(rnd(1, 5, 5, 5))


def test_reflect_padding_too_large_raises_shape_error(backend, tmp_path):
    g = op_graph(tmp_path, "nn.Conv2d", _conv_line_params(padding=(3, 3), padding_mode="reflect"),
                 [rnd(1, 4, 3, 3)], 1, {"weight": rnd(4, 4, 3, 3)}, backend=backend, annotate=False)
    with pytest.raises(ShapeError, match="reflect"):
        g(rnd(1, 4, 3, 3))


# ---------------------------------------------------------------------------------------------
# the fused-activation hook

@pytest.mark.parametrize("spec", ["relu", ("clamp", -0.5, 0.5), "callable", ("leaky", 0.1), ("leaky", 1.5),
                                  ("leaky", -0.3), ("elu", 0.7, 1.0, 1.0), ("elu", 1.5, 1.0, 1.5),
                                  ("elu", 1.6732632423543772, 1.0507009873554805, 1.0)])
def test_fused_activation_hook(backend, tmp_path, spec):
    x, wt, b = rnd(1, 4, 6, 6), rnd(4, 4, 3, 3, seed=1), rnd(4, seed=2)
    ref = F.conv2d(t(x), t(wt), t(b), 1, 1)
    if spec == "relu":
        expected = F.relu(ref).numpy()
    elif spec == "callable":
        expected = (ref * 2.0).numpy()
        spec = lambda y: y * 2.0  # noqa: E731
    elif spec[0] == "leaky":
        expected = F.leaky_relu(ref, spec[1]).numpy()
    elif spec[0] == "elu":  # ELU, CELU (divisor alpha), SELU (its constants)
        fn_ = {1.0: lambda r: F.elu(r, spec[1]), 1.5: lambda r: F.celu(r, spec[1])}.get(spec[3])
        expected = (F.selu(ref) if spec[2] != 1.0 else fn_(ref)).numpy()
    else:
        expected = torch.clamp(ref, -0.5, 0.5).numpy()
    g = op_graph(tmp_path, "nn.Conv2d", _conv_params(4, 4, 3, 1, 1, 1, 1, True, "zeros"), [x], [expected],
                 {"weight": wt, "bias": b}, backend=backend)
    (layer,) = g.layers
    layer.set_fused_activation(spec)
    assert_close(g(x)[0], expected, rtol=RTOL)
    with pytest.raises(ValueError):
        layer.set_fused_activation("swish-ish")


_NAMED = {"silu": F.silu, "sigmoid": torch.sigmoid, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
          "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "mish": F.mish}


@pytest.mark.parametrize("name", sorted(_NAMED))
@pytest.mark.parametrize("cin, k, stride, groups", [(4, 3, 1, 1), (4, 1, 1, 1), (4, 3, 2, 4), (3, 2, 2, 1)],
                         ids=["gemm", "1x1", "depthwise", "patch"])
def test_fused_named_activation(backend, tmp_path, name, cin, k, stride, groups):
    """Named activations (the fast backend's in-place kernels) fused into a convolution; backends
    without the kernels refuse them with a ValueError, so the runtime leaves them unfused."""
    x, wt, b = rnd(2, cin, 6, 6) * 4, rnd(4, cin // groups, k, k, seed=1), rnd(4, seed=2)
    pad = 1 if k == 3 else 0
    expected = _NAMED[name](F.conv2d(t(x), t(wt), t(b), stride, pad, 1, groups)).numpy()
    g = op_graph(tmp_path, "nn.Conv2d", _conv_params(cin, 4, k, stride, pad, 1, groups, True, "zeros"), [x],
                 [expected], {"weight": wt, "bias": b}, backend=backend)
    (layer,) = g.layers
    if backend.fast is None:
        with pytest.raises(ValueError):
            layer.set_fused_activation(name)
        return
    layer.set_fused_activation(name)
    assert_close(g(x)[0], expected, rtol=RTOL, what=name)


# ---------------------------------------------------------------------------------------------
# NumPy fast paths against the generic kernels and torch

nf = get_backend("numpy").fast

@pytest.fixture(params=["serial", "split"])
def fast_mode(request, monkeypatch):
    """Run each fast-path test twice: as configured, and with every copy/elementwise pass split
    over 3 threads and the im2col in blocks of a few rows (exercising the chunk edges). Winograd
    runs even on calls too small to pay (the tests use small images)."""
    monkeypatch.setattr(nf, "WINOGRAD_MIN_PIXELS", 0)
    monkeypatch.setattr(nf, "WINOGRAD_DILATED_MIN_SIDE", 0)
    if request.param == "split":
        monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
        monkeypatch.setattr(nf, "GEMM_BLOCK_BYTES", 4096)
        monkeypatch.setattr(nf, "GEMM_ROWS_BYTES", 4096)
        monkeypatch.setattr(nf, "SHIFT_BLOCK_BYTES", 2048)
        monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_MACS", 0)
        monkeypatch.setattr(nf, "POOL_BLOCK_BYTES", 64)
        monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_COLUMNS", 4)
        monkeypatch.setattr(nf, "GEMM_SPLIT_STEP", 3)
        monkeypatch.setattr(nf, "DEPTHWISE_BLOCK_BYTES", 2048)
        monkeypatch.setattr(nf, "WINOGRAD_CHUNK_BYTES", 1)
        old = nf.set_num_threads(3)
        with nf.compute_scope():  # GEMMs split over the 3 threads too
            yield request.param
        nf.set_num_threads(old)
    else:
        yield request.param


# (batch, cin, cout, h, w, k, stride, pads, dilation, groups, algo)
FAST = [
    (2, 32, 32, 9, 7, 3, 1, ((1, 1), (1, 1)), 1, 1, "winograd4"),
    (1, 32, 40, 8, 8, 3, 1, ((0, 0), (0, 0)), 1, 1, "winograd4"),
    (3, 32, 32, 5, 6, 3, 1, ((1, 0), (2, 1)), 1, 1, "winograd4"),
    (1, 32, 32, 1, 1, 3, 1, ((1, 1), (1, 1)), 1, 1, "winograd4"),
    (2, 32, 32, 9, 7, 3, 1, ((1, 1), (1, 1)), 1, 1, "winograd2"),
    (1, 32, 36, 6, 11, 3, 1, ((0, 1), (1, 1)), 1, 1, "winograd2"),
    (2, 8, 12, 9, 7, 3, 1, ((1, 1), (1, 1)), 1, 1, "gemm"),
    (2, 8, 12, 9, 7, 3, 2, ((1, 1), (1, 1)), 1, 1, "gemm"),
    (1, 6, 9, 11, 10, 5, 2, ((2, 2), (1, 3)), 2, 3, "gemm"),
    (2, 3, 8, 15, 13, 7, 2, ((3, 3), (3, 3)), 1, 1, "gemm"),
    (1, 4, 6, 17, 16, 3, 2, ((1, 1), (2, 2)), 3, 1, "gemm"),  # stride 2, dilation 3: phase rows step 3
    (2, 4, 6, 13, 14, 4, 3, ((2, 1), (0, 2)), 1, 2, "gemm"),  # stride 3, even kernel, groups
    (1, 4, 6, 40, 41, 3, 2, ((1, 1), (1, 1)), 1, 1, "gemm"),  # strided, row blocks
    (2, 4, 6, 9, 9, 1, 2, ((1, 1), (1, 1)), 1, 1, "gemm"),  # padded strided 1x1
    (2, 8, 8, 6, 5, 3, 1, ((1, 1), (1, 1)), 1, 2, "gemm"),
    (2, 4, 6, 33, 32, 3, 1, ((1, 1), (1, 1)), 1, 1, "gemm"),  # row blocks, one image at a time
    # patch rows of a multiple of 256 bytes: the im2col workspace's rows are spaced further
    # apart (_operand_workspace): small images side by side, one whole image, a strided 1x1
    (2, 8, 12, 16, 16, 3, 1, ((1, 1), (1, 1)), 1, 1, "gemm"),
    (1, 8, 12, 64, 64, 3, 1, ((1, 1), (1, 1)), 1, 1, "gemm"),
    (3, 6, 10, 32, 32, 3, 2, ((1, 1), (1, 1)), 1, 1, "gemm"),
    (2, 6, 10, 32, 32, 1, 2, ((0, 0), (0, 0)), 1, 1, "1x1"),
    (2, 4, 6, 33, 32, 1, 1, ((0, 0), (0, 0)), 1, 1, "1x1"),
    (1, 8, 4, 32, 33, 1, 1, ((0, 0), (0, 0)), 1, 1, "1x1"),  # O < C: GEMM on the input, bias after
    (3, 32, 32, 33, 32, 3, 1, ((1, 1), (1, 1)), 1, 1, "winograd4"),
    # dilated "same": polyphase sub-images (sides multiples of the dilation, and not)
    (1, 48, 40, 16, 18, 3, 1, ((2, 2), (2, 2)), 2, 1, "winograd2"),
    (2, 40, 48, 15, 17, 3, 1, ((3, 3), (3, 3)), 3, 1, "winograd4"),
    (1, 32, 32, 9, 10, 3, 1, ((4, 4), (4, 4)), 4, 1, "winograd2"),  # sub-images of 2-3 pixels
    (2, 5, 7, 6, 9, 1, 1, ((0, 0), (0, 0)), 1, 1, "1x1"),
    (2, 5, 7, 7, 9, 1, 2, ((0, 0), (0, 0)), 1, 1, "1x1"),
    (2, 8, 8, 9, 7, 3, 1, ((1, 1), (1, 1)), 1, 8, "depthwise"),
    (3, 8, 8, 10, 9, 3, 2, ((1, 1), (1, 1)), 1, 8, "depthwise"),
    (1, 8, 8, 11, 10, 3, 2, ((1, 0), (0, 2)), 1, 8, "depthwise"),
    (1, 6, 6, 11, 9, 3, (2, 1), ((1, 1), (1, 1)), 2, 6, "depthwise"),
    (1, 4, 8, 9, 9, 5, 1, ((2, 2), (2, 2)), 2, 4, "depthwise"),
    (1, 4, 4, 9, 8, 4, 3, ((0, 0), (0, 0)), 1, 4, "depthwise"),
    (1, 300, 300, 3, 3, 3, 1, ((1, 1), (1, 1)), 1, 300, "depthwise"),
    (2, 6, 6, 13, 12, 7, 1, ((3, 3), (3, 2)), 1, 6, "depthwise"),  # ConvNeXt's 7x7
    (1, 5, 5, 10, 11, 7, 2, ((3, 3), (2, 3)), 1, 5, "depthwise"),
    (1, 3, 3, 8, 9, 2, 1, ((0, 1), (1, 0)), 1, 3, "depthwise"),
    (2, 16, 8, 9, 7, 3, 1, ((1, 1), (1, 1)), 1, 1, "shift"),
    (1, 12, 5, 11, 13, 3, 1, ((0, 2), (1, 0)), 2, 1, "shift"),  # dilation 2, uneven padding
    (2, 10, 4, 30, 12, 3, 1, ((5, 5), (5, 5)), 5, 1, "shift"),  # halo of 10 rows: blocks of 30
    (3, 9, 4, 8, 10, 4, 1, ((0, 0), (0, 0)), 1, 1, "shift"),  # even kernel, no padding
    (1, 8, 8, 10, 9, 1, 1, ((1, 0), (0, 1)), 1, 1, "shift"),  # 1x1 with padding (any algo='shift')
    (2, 3, 8, 8, 12, 4, 4, ((0, 0), (0, 0)), 1, 1, "patch"),
    (3, 4, 5, 9, 10, 3, 3, ((0, 0), (0, 0)), 1, 1, "patch"),  # input not a multiple of the patch
    (1, 3, 6, 4, 4, 2, 2, ((0, 0), (0, 0)), 1, 1, "patch"),
]


@pytest.mark.parametrize("case", FAST, ids=[f"{c[-1]}-{i}" for i, c in enumerate(FAST)])
def test_numpy_fast_conv_matches_generic_and_torch(case, fast_mode):
    n, cin, cout, h, w, k, s, pads, d, g, algo = case
    s = s if isinstance(s, tuple) else (s, s)
    x = rnd(n, cin, h, w)
    wt = rnd(cout, cin // g, k, k, seed=1)
    b = rnd(cout, seed=2)
    (pt, pb), (pl, pr) = pads
    expected = F.conv2d(F.pad(t(x), (pl, pr, pt, pb)), t(wt), t(b), s, 0, d, g).numpy()
    generic = fn.conv2d(x, wt, b, s, pads, (d, d), g, xp=xnp)
    assert_close(generic, expected, rtol=RTOL, what="generic")
    tile = int(algo[-1]) if algo.startswith("winograd") else None
    name = "winograd" if tile else algo
    for bias in (b, None):
        plan = nf.conv2d_plan(wt, bias, stride=s, dilation=(d, d), groups=g, pads=pads, algo=name, tile=tile)
        assert (plan.algo, plan.tile if tile else None) == (name, tile)
        got = plan(x)
        # planar, but for depthwise on small maps: a channels-last array seen as (N, C, H, W)
        small = (algo == "depthwise" and g == cout and got.shape[2] * got.shape[3] <= nf.DEPTHWISE_NHWC_MAX_PIXELS
                 and not plan._dense_ok(n, h, w, *got.shape[2:]))
        assert (got.transpose(0, 2, 3, 1) if small else got).flags.c_contiguous and got.dtype == np.float32
        want = expected if bias is not None else expected - b.reshape(1, -1, 1, 1)
        assert_close(got, want, rtol=1e-4 if tile else RTOL, what=f"{algo} bias={bias is not None}")
        assert_close(got, generic if bias is not None else generic - b.reshape(1, -1, 1, 1),
                     rtol=1e-4 if tile else RTOL, what=f"{algo} vs generic")
    auto = nf.conv2d_plan(wt, b, stride=s, dilation=(d, d), groups=g, pads=pads, input_hw=(h, w))
    assert_close(auto(x), expected, rtol=1e-4, what=f"auto ({auto.algo})")


DEPTHWISE = [c for c in FAST if c[-1] == "depthwise"]


@pytest.mark.parametrize("stride", [1, 2])
def test_numpy_fast_depthwise_small_maps_channels_last_into_1x1(stride):
    """A depthwise convolution on a small map returns a channels-last array viewed as (N, C, H,
    W); the 1x1 convolution after it reads that as a transposed GEMM operand; the destination
    set for the next planar output of that shape (here (2, 5, 5, 5), the channels-last shape too)
    is left alone; ReLU6 fused; against torch."""
    x, wd, bd = rnd(2, 5, 5 * stride, 5 * stride) * 3, rnd(5, 1, 3, 3, seed=1), rnd(5, seed=2)
    w1, b1 = rnd(7, 5, 1, 1, seed=3), rnd(7, seed=4)
    dw = nf.conv2d_plan(wd, bd, stride=(stride, stride), groups=5, pads=((1, 1), (1, 1)))
    pw = nf.conv2d_plan(w1, b1)
    assert (dw.algo, pw.algo) == ("depthwise", "1x1")
    h = F.relu6(F.conv2d(t(x), t(wd), t(bd), stride, 1, 1, 5))
    want = F.conv2d(h, t(w1), t(b1)).numpy()
    dest = np.full((2, 5, 5, 5), 7.0, np.float32)
    old = nf.set_num_threads(3)
    try:
        with nf.compute_scope():
            nf.set_destination(dest)
            mid = dw(x, ("clamp", 0.0, 6.0))
            nf.set_destination(None)
            got = pw(mid)
    finally:
        nf.set_num_threads(old)
    assert mid.shape == (2, 5, 5, 5) and mid.transpose(0, 2, 3, 1).flags.c_contiguous
    assert (dest == 7.0).all()
    assert_close(mid, h.numpy(), rtol=RTOL, what="depthwise")
    assert got.flags.c_contiguous
    assert_close(got, want, rtol=RTOL, what="1x1 after it")


@pytest.mark.parametrize("block", [8, 64], ids=["8px", "whole"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("layout", ["planar", "channels_last"])
@pytest.mark.parametrize("act, bias", [(None, True), (("clamp", 0.0, 6.0), True), ("silu", False)])
def test_numpy_fast_1x1_in_blocks_of_pixels(monkeypatch, block, batch, layout, act, bias):
    """A stride-1 1x1 convolution works on blocks of pixels split over the threads (GEMM, bias
    and activation per block), for a channels-last result (blocks of pixel rows) and a planar one
    (blocks of columns): blocks of 8 pixels of a 5x7 map (a short last block) or whole images,
    1 and 3 images (one image is cut finer so that each thread has a block), a planar or a
    channels-last input, against torch."""
    monkeypatch.setattr(nf, "TINY_ELEMENTS", 0)
    monkeypatch.setattr(nf, "CONV1X1_BLOCK_BYTES", block * 11 * 4)
    monkeypatch.setattr(nf, "CONV1X1_SPLIT_MIN_MACS", 0)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    x = rnd(batch, 6, 5, 7) * 3
    w, b = rnd(11, 6, 1, 1, seed=1), rnd(11, seed=2) if bias else None
    plan = nf.conv2d_plan(w, b)
    assert plan.algo == "1x1"
    y = F.conv2d(t(x), t(w), None if b is None else t(b))
    want = {None: y, "silu": F.silu(y)}.get(act, F.relu6(y)).numpy()
    xin = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if layout == "channels_last" else x
    old = nf.set_num_threads(3)
    try:
        with nf.compute_scope():
            got = plan(xin, act, channels_last=True)
            planar = plan(xin, act)
    finally:
        nf.set_num_threads(old)
    assert got.shape == (batch, 11, 5, 7) and got.transpose(0, 2, 3, 1).flags.c_contiguous
    assert_close(got, want, rtol=RTOL, what=f"1x1 channels-last, {layout}, act {act}")
    assert planar.flags.c_contiguous
    assert_close(planar, want, rtol=RTOL, what=f"1x1 planar result, {layout} input, act {act}")


# (kernel, dilation, pads ((top, bottom), (left, right)), input HxW, batch, bias, activation):
# rates past the map (whole taps out), asymmetric pads, a 5x3 kernel, a rectangular map
TAPS = [((3, 3), (18, 18), ((18, 18), (18, 18)), (9, 11), 1, True, None),
        ((3, 3), (4, 4), ((4, 4), (4, 4)), (6, 7), 3, False, "relu"),
        ((3, 3), (5, 2), ((2, 7), (1, 3)), (7, 5), 2, True, ("clamp", 0.0, 6.0)),
        ((5, 3), (3, 4), ((6, 6), (4, 4)), (5, 8), 1, True, "silu"),
        ((3, 3), (40, 40), ((40, 40), (40, 40)), (8, 8), 2, True, None)]


@pytest.mark.parametrize("case", TAPS, ids=[f"taps-{i}" for i in range(len(TAPS))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_dilated_conv_one_gemm_per_tap(monkeypatch, case, dtype):
    """A stride-1 convolution whose taps mostly read padding runs one GEMM per tap over the
    output pixels with real input (whole input rows as a view, other rectangles copied), summed
    into the output with the bias, then the activation: against torch and the im2col GEMM, with
    the GEMMs and adds split over 3 threads."""
    (kh, kw), dil, pads, (h, w_), n, bias, act = case
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    monkeypatch.setattr(nf, "GEMM_SPLIT_MIN_MACS", 0)
    monkeypatch.setattr(nf, "TAPS_MIN_SAVED_MACS", 0)  # (small channel counts: the path's mechanics)
    monkeypatch.setattr(nf, "SMALL_CONV_MACS", 0)  # (and not the plain GEMM of tiny convolutions)
    x = rnd(n, 5, h, w_).astype(dtype)
    w, b = rnd(7, 5, kh, kw, seed=1).astype(dtype), rnd(7, seed=2).astype(dtype) if bias else None
    plan = nf.conv2d_plan(w, b, stride=(1, 1), dilation=dil, pads=pads)
    assert plan.algo == "gemm"
    ho, wo = plan.out_size(h, w_)
    assert plan._tap_rects(h, w_, ho, wo) is not None, "the case should take the per-tap path"
    xp = F.pad(t(x), (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
    y = F.conv2d(xp, t(w), None if b is None else t(b), dilation=dil)
    want = {None: y, "relu": F.relu(y), "silu": F.silu(y)}.get(act, F.relu6(y) if act else y).numpy()
    rects = plan._tap_rects(h, w_, ho, wo)
    copies = []
    real_ws = nf._workspace
    monkeypatch.setattr(nf, "_workspace", lambda shape, dt, slot=0: (copies.append(slot) if slot == 21 else None)
                        or real_ws(shape, dt, slot))
    old = nf.set_num_threads(3)
    try:
        with nf.compute_scope():
            got = plan(x, act)
            # taps reading whole input rows take them as views; the others copy their rectangle
            assert len(copies) == n * sum(c1 - c0 < w_ for _, _, _, c0, c1, _, _ in rects)
            monkeypatch.setattr(nf, "TAPS_MAX_FRACTION", -1.0)
            im2col = plan(x, act)
    finally:
        nf.set_num_threads(old)
    tol = RTOL if dtype == np.float32 else 1e-12
    assert got.shape == want.shape and got.dtype == dtype
    assert_close(got, want, rtol=tol, what=f"per-tap GEMMs {case}")
    assert_close(got, im2col, rtol=tol, what="per-tap GEMMs against the im2col GEMM")


def test_numpy_fast_taps_only_where_padding_dominates(monkeypatch):
    """The per-tap path is taken only when the taps' real pixels are few: DeepLab's rate 18 on a
    28x28 map (a third), not a 3x3 convolution with padding 1 on 7x7 (0.82) nor a strided one;
    and only when the products it skips are worth its tap GEMMs: 256 -> 256 at rate 18, not
    TimesNet's 16 -> 16 5x5 over 4x24 maps (padding a third of the patches there too)."""
    big = nf.conv2d_plan(rnd(256, 256, 3, 3), None, dilation=(18, 18), pads=((18, 18), (18, 18)))
    assert big._tap_rects(28, 28, 28, 28) is not None
    small_map = nf.conv2d_plan(rnd(16, 16, 5, 5), None, pads=((2, 2), (2, 2)), algo="gemm")
    assert small_map._tap_rects(4, 24, 4, 24) is None
    monkeypatch.setattr(nf, "TAPS_MIN_SAVED_MACS", 0)
    assert small_map._tap_rects(4, 24, 4, 24) is not None  # (padding alone would have taken it)
    w = rnd(4, 3, 3, 3)
    rate18 = nf.conv2d_plan(w, None, dilation=(18, 18), pads=((18, 18), (18, 18)))
    rects = rate18._tap_rects(28, 28, 28, 28)
    real = sum((r1 - r0) * (c1 - c0) for _, r0, r1, c0, c1, _, _ in rects)
    assert len(rects) == 9 and real == (10 + 28 + 10) ** 2  # rows and columns: 10 + 28 + 10 of 3 * 28
    plain = nf.conv2d_plan(w, None, pads=((1, 1), (1, 1)), algo="gemm")
    assert plain._tap_rects(7, 7, 7, 7) is None
    strided = nf.conv2d_plan(w, None, stride=(2, 2), dilation=(18, 18), pads=((18, 18), (18, 18)))
    assert strided._tap_rects(28, 28, 14, 14) is None


@pytest.fixture
def numba_on():
    """The optional numba kernels switched on for one test (skipped without numba)."""
    pytest.importorskip("numba")
    old = nf.use_numba(True)
    yield
    nf.use_numba(old)


@pytest.mark.parametrize("layout", ["planar", "nhwc", "band", "dense", "numba"])
@pytest.mark.parametrize("case", DEPTHWISE, ids=[f"dw-{i}" for i in range(len(DEPTHWISE))])
def test_numpy_fast_depthwise_both_layouts(monkeypatch, request, case, layout):
    """Every depthwise layout (channels-last is picked for small maps, the banded GEMMs for big
    kernels at stride 1 on larger ones, per-channel dense matrices for kernels covering much of a
    small map), and the optional numba kernel, against torch."""
    monkeypatch.setattr(nf, "DEPTHWISE_NHWC_MAX_PIXELS", 10**9 if layout == "nhwc" else 0)
    monkeypatch.setattr(nf, "DEPTHWISE_BAND_MIN_TAPS", 1 if layout == "band" else 10**9)
    monkeypatch.setattr(nf, "DEPTHWISE_BAND_MIN_PIXELS", 0)
    monkeypatch.setattr(nf, "DEPTHWISE_DENSE_MAX_BYTES", 1 << 40 if layout == "dense" else 0)
    monkeypatch.setattr(nf, "DEPTHWISE_DENSE_RATIO", 10**9)
    monkeypatch.setattr(nf, "DEPTHWISE_DENSE_RATIO_BATCHED", 10**9)
    if layout == "numba":
        request.getfixturevalue("numba_on")
    n, cin, cout, h, w, k, s, pads, d, g, _ = case
    s = s if isinstance(s, tuple) else (s, s)
    x, wt, b = rnd(n, cin, h, w), rnd(cout, cin // g, k, k, seed=1), rnd(cout, seed=2)
    (pt, pb), (pl, pr) = pads
    expected = F.conv2d(F.pad(t(x), (pl, pr, pt, pb)), t(wt), t(b), s, 0, d, g)
    plan = nf.conv2d_plan(wt, b, stride=s, dilation=(d, d), groups=g, pads=pads)
    assert plan.algo == "depthwise"
    assert plan._dense_ok(n, h, w, *expected.shape[2:]) == (layout == "dense" and g == cout)
    assert_close(plan(x), expected.numpy(), rtol=RTOL, what=layout)
    assert_close(plan(x, ("clamp", 0.0, 6.0)), F.relu6(expected).numpy(), rtol=RTOL, what=f"{layout} relu6")
    assert_close(plan(x, "relu"), F.relu(expected).numpy(), rtol=RTOL, what=f"{layout} relu")
    assert_close(plan(x, "silu"), F.silu(expected).numpy(), rtol=RTOL, what=f"{layout} silu")


def _depthwise_case(case):
    """Input, weight, bias, pads, torch's result and the numpy plan of a depthwise case
    ``(n, c, h, w, (kh, kw), pads)``."""
    n, c, h, w, (kh, kw), pads = case
    x, wt, b = rnd(n, c, h, w), rnd(c, 1, kh, kw, seed=1), rnd(c, seed=2)
    (pt, pb), (pl, pr) = pads
    expected = F.conv2d(F.pad(t(x), (pl, pr, pt, pb)), t(wt), t(b), 1, 0, 1, c)
    return x, wt, b, pads, expected, nf.conv2d_plan(wt, b, groups=c, pads=pads)


def _check_depthwise_variants(plan, x, wt, b, pads, expected):
    """A depthwise plan's fused activations on two threads, its form without a bias and in
    float64, against torch."""
    c = wt.shape[0]
    (pt, pb), (pl, pr) = pads
    old = nf.set_num_threads(2)
    try:
        with nf.compute_scope():
            assert_close(plan(x, "gelu"), F.gelu(expected).numpy(), rtol=RTOL, what="gelu")
            assert_close(plan(x, ("clamp", 0.0, 6.0)), F.relu6(expected).numpy(), rtol=RTOL, what="relu6")
    finally:
        nf.set_num_threads(old)
    nobias = nf.conv2d_plan(wt, None, groups=c, pads=pads)
    assert_close(nobias(x, "relu"), F.relu(expected - t(b).reshape(1, -1, 1, 1)).numpy(), rtol=RTOL)
    x64, w64 = x.astype(np.float64), wt.astype(np.float64)
    want64 = F.conv2d(F.pad(torch.from_numpy(x64), (pl, pr, pt, pb)), torch.from_numpy(w64), None, 1, 0, 1, c)
    got64 = nf.conv2d_plan(w64, None, groups=c, pads=pads)(x64)
    assert got64.dtype == np.float64
    np.testing.assert_allclose(got64, want64.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [(2, 12, 20, 18, (3, 3), ((1, 1), (1, 1))), (1, 6, 17, 23, (3, 3), ((0, 1), (1, 0)))])
def test_numpy_fast_depthwise_of_a_channels_last_view(monkeypatch, case):
    """A large map that arrives channels-last (the (B, C, H, W) view of a transformer's tokens,
    PVT-v2's MLP) takes the einsum path even with 9 taps, not the planar taps' per-channel
    gathers: torch's result, fused activations, float64."""
    x, wt, b, pads, expected, plan = _depthwise_case(case)
    xv = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # same values, channels-last
    used = []
    real = plan._run_depthwise_einsum
    monkeypatch.setattr(plan, "_run_depthwise_einsum", lambda *a, **k: used.append(1) or real(*a, **k))
    assert_close(plan(xv), expected.numpy(), rtol=RTOL, what="channels-last view")
    assert used
    used.clear()
    assert_close(plan(x), expected.numpy(), rtol=RTOL, what="planar input")
    assert not used  # (a planar input keeps the tap passes)
    _check_depthwise_variants(plan, xv, wt, b, pads, expected)


BAND = [  # n, c, h, w, (kh, kw), pads: widths a multiple of the band width and not, one band
    (1, 12, 30, 32, (7, 7), ((3, 3), (3, 3))),  # 2 bands of 16: written straight into the output
    (3, 10, 23, 37, (7, 7), ((3, 3), (3, 3))),  # 3 bands of 13 for 37 columns
    (2, 9, 17, 21, (5, 7), ((1, 3), (4, 2))),  # uneven kernel and padding
    (1, 7, 24, 20, (5, 5), ((0, 0), (0, 0))),  # no padding: a 20x16 output, one band
    (2, 5, 19, 40, (1, 25), ((0, 0), (12, 12))),  # one kernel row
]


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("case", BAND, ids=[f"band-{i}" for i in range(len(BAND))])
def test_numpy_fast_depthwise_band(monkeypatch, case, cache):
    """Stride-1 depthwise convolutions with big kernels as banded GEMMs, against torch: band
    matrices kept or copied per block, blocks of a few channels (the last one short), batch,
    bias or not, fused activations, float64; on the threads of a compute scope too."""
    monkeypatch.setattr(nf, "DEPTHWISE_BAND_BLOCK_BYTES", 20 * 1024)
    monkeypatch.setattr(nf, "DEPTHWISE_BAND_CACHE_BYTES", 1 << 30 if cache else 0)
    monkeypatch.setattr(nf, "DEPTHWISE_BAND_MIN_PIXELS", 0)  # (small maps keep the tests quick)
    x, wt, b, pads, expected, plan = _depthwise_case(case)
    ho, wo = expected.shape[2:]
    assert plan.algo == "depthwise" and plan._banded(ho, wo)
    got = plan(x)
    assert got.flags.c_contiguous and got.dtype == np.float32
    assert_close(got, expected.numpy(), rtol=RTOL, what="band")
    assert (plan._bands[next(iter(plan._bands))][1] is not None) == cache
    _check_depthwise_variants(plan, x, wt, b, pads, expected)


EINSUM_DW = [  # n, c, h, w, (kh, kw), pads: small maps (at most DEPTHWISE_BAND_MIN_PIXELS outputs)
    (1, 24, 14, 14, (7, 7), ((3, 3), (3, 3))),  # ConvNeXt's stage 3
    (3, 10, 15, 15, (7, 7), ((3, 3), (3, 3))),  # a batch (7x7 maps take the dense matrices)
    (2, 9, 11, 13, (5, 7), ((1, 3), (4, 2))),  # uneven kernel and padding
    (1, 7, 16, 16, (5, 5), ((0, 0), (0, 0))),  # no padding
    (2, 16, 28, 28, (7, 7), ((3, 3), (3, 3))),  # ConvNeXt's stage 2: the einsum up to 32x32 outputs
]


@pytest.mark.parametrize("case", EINSUM_DW, ids=[f"einsum-{i}" for i in range(len(EINSUM_DW))])
def test_numpy_fast_depthwise_einsum(monkeypatch, case):
    """Stride-1 depthwise convolutions with 25 taps or more on small maps, as an einsum over a
    channels-last window view, against torch: batch, bias or not, fused activations, float64,
    blocks of rows spanning two images, on the threads of a compute scope."""
    monkeypatch.setattr(nf, "EINSUM_ROWS_ELEMENTS", 100)  # (blocks of a few rows: some span two images)
    x, wt, b, pads, expected, plan = _depthwise_case(case)
    ho, wo = expected.shape[2:]
    used = []
    real = plan._run_depthwise_einsum
    monkeypatch.setattr(plan, "_run_depthwise_einsum", lambda *a, **k: used.append(1) or real(*a, **k))
    assert_close(plan(x), expected.numpy(), rtol=RTOL, what="einsum")
    assert used and not plan._banded(ho, wo)
    _check_depthwise_variants(plan, x, wt, b, pads, expected)


def test_numpy_fast_depthwise_band_only_where_it_pays():
    """The banded GEMMs take big kernels at stride 1 on maps above the channels-last size; 3x3
    kernels, strides, dilations and channel multipliers keep the tap passes."""
    def banded(k, hw, **kw):
        groups = kw.pop("groups", 8)
        plan = nf.conv2d_plan(rnd(kw.pop("o", 8), 1, k, k), None, groups=groups, pads=((k // 2,) * 2,) * 2, **kw)
        return plan._banded(*plan.out_size(hw, hw))
    assert banded(7, 56) and banded(5, 40)
    assert not banded(3, 56)  # (measured slower than the taps)
    assert not banded(7, 14)  # 196 output pixels: channels-last taps
    assert not banded(7, 28) and not banded(5, 24)  # up to 784 output pixels: the einsum
    assert banded(9, 32)
    assert not banded(7, 56, stride=(2, 2)) and not banded(7, 56, dilation=(2, 2))
    assert not banded(7, 56, o=16)  # two outputs per channel


def test_numba_depthwise_float64_nan_and_batch(numba_on):
    """The compiled kernel: float64, a channel multiplier, batch 3, NaN propagated through the
    fused clamp as torch does, no bias; the switch restores the previous setting."""
    x, wt = rnd(3, 5, 17, 19).astype(np.float64), rnd(10, 1, 3, 3, seed=1).astype(np.float64)
    x[1, 2, 4, 6] = np.nan
    plan = nf.conv2d_plan(wt, None, stride=(2, 1), groups=5, pads=((1, 2), (0, 1)))
    assert plan.algo == "depthwise" and nf.numba_enabled()
    expected = F.conv2d(F.pad(torch.from_numpy(x), (0, 1, 1, 2)), torch.from_numpy(wt), None, (2, 1), 0, 1, 5)
    got = plan(x, ("clamp", 0.0, 6.0))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, F.relu6(expected).numpy(), rtol=1e-12, atol=1e-12)
    assert np.isnan(got).sum() == np.isnan(F.relu6(expected).numpy()).sum() > 0
    assert nf.use_numba(False) is True and not nf.numba_enabled()


@pytest.mark.parametrize("layout", ["planar", "nhwc"])
@pytest.mark.parametrize("n, stride", [(8, 1), (3, 2)])
def test_numpy_fast_depthwise_in_channel_blocks(monkeypatch, n, stride, layout):
    """Blocks of a few channels over the whole batch (the block size counts the images)."""
    monkeypatch.setattr(nf, "DEPTHWISE_BLOCK_BYTES", 8 * 1024)
    monkeypatch.setattr(nf, "DEPTHWISE_NHWC_MAX_PIXELS", 10**9 if layout == "nhwc" else 0)
    x, wt, b = rnd(n, 40, 12, 11), rnd(40, 1, 3, 3, seed=1), rnd(40, seed=2)
    expected = F.conv2d(t(x), t(wt), t(b), stride, 1, 1, 40).numpy()
    plan = nf.conv2d_plan(wt, b, stride=(stride, stride), groups=40, pads=((1, 1), (1, 1)))
    assert plan.algo == "depthwise"
    assert_close(plan(x), expected, rtol=RTOL)
    # a fused activation is applied inside the blocks (bias first), as by the other algorithms
    assert_close(plan(x, ("clamp", 0.0, 6.0)), F.relu6(t(expected)).numpy(), rtol=RTOL, what="relu6")
    assert_close(plan(x, "silu"), F.silu(t(expected)).numpy(), rtol=RTOL, what="silu")
    nobias = nf.conv2d_plan(wt, None, stride=(stride, stride), groups=40, pads=((1, 1), (1, 1)))
    assert_close(nobias(x, "relu"), F.relu(t(expected - b.reshape(1, -1, 1, 1))).numpy(), rtol=RTOL)
    gemm = nf.conv2d_plan(rnd(6, 40, 3, 3, seed=3), b[:6], pads=((1, 1), (1, 1)), algo="gemm")
    assert_close(gemm(x, "sigmoid"), torch.sigmoid(t(gemm(x))).numpy(), rtol=RTOL, what="gemm sigmoid")


@pytest.mark.parametrize("rows_bytes", [4096, 1 << 20, 0])
@pytest.mark.parametrize("act", ["silu", "relu", ("clamp", -0.5, 0.25), "gelu", "hardswish", ("leaky", 0.1)])
def test_numpy_fast_gemm_row_blocks_fuse_the_activation(monkeypatch, act, rows_bytes):
    """With several threads each takes whole blocks of output rows (own im2col, GEMM, activation);
    0 switches that off. Stride 2 with a 6x6 kernel (YOLOv5's stem), stride 1, batch 2, odd
    sizes, last block shorter than the others, grouped (ResNeXt's 3x3, strided too); against
    torch."""
    monkeypatch.setattr(nf, "GEMM_ROWS_BYTES", rows_bytes)
    torch_act = {"silu": F.silu, "relu": F.relu, "gelu": F.gelu, "hardswish": F.hardswish}
    old = nf.set_num_threads(3)
    try:
        for cin, cout, k, s, p, h, w, g in [(3, 16, 6, 2, 2, 37, 30, 1), (5, 7, 3, 1, 1, 19, 23, 1),
                                            (16, 24, 3, 1, 1, 37, 33, 4), (12, 12, 3, 2, 1, 70, 63, 3)]:
            if isinstance(act, tuple):
                ref = ((lambda a: F.leaky_relu(a, act[1])) if act[0] == "leaky"
                       else (lambda a: torch.clamp(a, act[1], act[2])))
            else:
                ref = torch_act[act]
            _check_gemm_conv(2, cin, cout, k, s, p, h, w, g, act, ref)
    finally:
        nf.set_num_threads(old)


def _check_gemm_conv(n, cin, cout, k, s, p, h, w, g, act, ref, force=False):
    """A GEMM convolution plan (the one chosen, or forced) with the fused ``act`` inside a
    compute scope, against torch's convolution followed by ``ref``; a C-contiguous result."""
    x, wt, b = rnd(n, cin, h, w), rnd(cout, cin // g, k, k, seed=1), rnd(cout, seed=2)
    pre = F.conv2d(t(x), t(wt), t(b), s, p, 1, g)
    plan = nf.conv2d_plan(wt, b, stride=(s, s), pads=((p, p), (p, p)), groups=g, algo="gemm" if force else None)
    assert plan.algo == "gemm"
    with nf.compute_scope():
        got = plan(x, act)
    assert got.flags.c_contiguous
    # the sums' rounding scales with the convolution's output, not the clamped one's
    assert_close(got, ref(pre).numpy(), rtol=RTOL, atol=RTOL * float(pre.abs().max()), what=f"{act} k{k} s{s} g{g}")


@pytest.mark.parametrize("per_block", [1, 2])
def test_numpy_fast_gemm_image_blocks_per_thread(monkeypatch, per_block):
    """Small images at batch > 1 on several threads: each thread takes whole blocks of images
    side by side (own im2col, GEMM, activation, copy into NCHW), the last block short; plain,
    strided and grouped, against torch."""
    old = nf.set_num_threads(3)
    try:
        for cin, cout, k, s, p, h, w, g, act in [(6, 10, 3, 1, 1, 9, 7, 1, "relu"), (8, 12, 3, 2, 1, 13, 11, 1, None),
                                                 (12, 12, 3, 1, 1, 8, 9, 3, "silu")]:
            ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            # room for `per_block` images' patches (k*k*cin/g + 1 rows of ho*wo) per block
            monkeypatch.setattr(nf, "GEMM_ROWS_BYTES", per_block * (k * k * cin // g + 1) * ho * wo * 4)
            _check_gemm_conv(7, cin, cout, k, s, p, h, w, g, act, {"relu": F.relu, "silu": F.silu, None: lambda a: a}[act],
                             force=True)
    finally:
        nf.set_num_threads(old)


def test_numpy_fast_conv_picks_the_expected_algorithm():
    def algo(cout, cin, k, s=1, g=1, pads=((1, 1), (1, 1)), hw=None):
        plan = nf.conv2d_plan(rnd(cout, cin // g, k, k), None, stride=(s, s), groups=g, pads=pads, input_hw=hw)
        return plan.algo, plan.tile
    assert algo(64, 64, 1, pads=((0, 0), (0, 0)))[0] == "1x1"
    assert algo(16, 64, 3)[0] == "shift" and algo(8, 16, 5)[0] == "shift"  # few outputs, stride 1
    assert algo(16, 16, 3)[0] == "gemm" and algo(16, 64, 3, s=2)[0] == "gemm"
    dilated = nf.conv2d_plan(rnd(8, 32, 3, 3), None, dilation=(6, 6), pads=((6, 6), (6, 6)))
    assert dilated.algo == "gemm"  # shift would run its GEMM over the wide padding too
    assert algo(64, 64, 1, s=2, pads=((0, 0), (0, 0)))[0] == "1x1"
    assert algo(32, 32, 3, g=32)[0] == "depthwise"
    assert algo(64, 64, 3, s=2)[0] == "gemm"
    assert algo(8, 8, 3)[0] == "gemm"
    assert algo(64, 64, 3, hw=(56, 56)) == ("winograd", 4)
    assert algo(256, 256, 3, hw=(14, 14)) == ("winograd", 2)
    assert algo(512, 512, 3, hw=(7, 7)) == ("winograd", 2)  # the GEMM for one image, F(2x2) from 4
    assert algo(64, 64, 3, hw=None) == ("winograd", 4)
    # 32-47 channels: F(4x4) from a 40-pixel output side (the per-thread blocks), else the GEMM
    # (or, for half as many outputs, shift); an unknown size keeps the GEMM
    assert algo(32, 32, 3, hw=(40, 40)) == ("winograd", 4) and algo(32, 64, 3, hw=(128, 128)) == ("winograd", 4)
    assert algo(32, 32, 3, hw=(28, 28))[0] == "gemm" and algo(32, 32, 3)[0] == "gemm"
    assert algo(32, 64, 3, hw=(28, 28))[0] == "shift" and algo(16, 16, 3, hw=(128, 128))[0] == "gemm"
    assert algo(16, 3, 4, s=4, pads=((0, 0), (0, 0)))[0] == "patch"
    assert algo(16, 3, 4, s=4)[0] == "gemm"  # padded
    assert algo(16, 4, 4, s=4, g=2, pads=((0, 0), (0, 0)))[0] == "gemm"
    with pytest.raises(ValueError):
        nf.conv2d_plan(rnd(4, 4, 3, 3), None, stride=(1, 1), algo="patch")


def test_winograd_plan_runs_the_gemm_on_small_calls(monkeypatch):
    x, wt, b = rnd(1, 48, 6, 6), rnd(48, 48, 3, 3, seed=1), rnd(48, seed=2)
    plan = nf.conv2d_plan(wt, b, pads=((1, 1), (1, 1)), input_hw=(6, 6))
    assert (plan.algo, plan.tile) == ("winograd", 2)
    calls = []
    monkeypatch.setattr(plan, "wino", lambda *a: calls.append(a))
    assert_close(plan(x), F.conv2d(t(x), t(wt), t(b), 1, 1).numpy(), rtol=RTOL)
    assert not calls  # 36 output pixels < WINOGRAD_MIN_PIXELS: the GEMM ran


@pytest.mark.usefixtures("fast_mode")
def test_numpy_fast_conv_float64_and_non_contiguous_input():
    x = rnd(2, 6, 9, 8).astype(np.float64)[:, :, ::-1]
    wt = rnd(4, 6, 3, 3, seed=1).astype(np.float64)
    expected = F.conv2d(t(x.copy()), t(wt), None, 1, 1).numpy()
    for algo in ("gemm", "winograd"):
        got = nf.conv2d_plan(wt, None, pads=((1, 1), (1, 1)), algo=algo, tile=2)(x)
        assert_close(got, expected, rtol=1e-10 if algo == "gemm" else 1e-8, what=algo)


def test_winograd_error_against_torch_on_resnet_shapes():
    """Winograd's extra rounding stays far inside the model tests' rtol 1e-4 of max|y| (measured
    about 1e-6 for F(2x2) and 1e-5 for F(4x4) in float32)."""
    for c, hw, tile in ((64, 20, 4), (128, 14, 2)):
        x = rnd(1, c, hw, hw)
        wt = rnd(c, c, 3, 3, seed=1) * 0.05
        expected = F.conv2d(t(x), t(wt), None, 1, 1).numpy()
        got = nf.conv2d_plan(wt, None, pads=((1, 1), (1, 1)), algo="winograd", tile=tile)(x)
        err = np.abs(got - expected).max() / np.abs(expected).max()
        assert err < (5e-5 if tile == 4 else 1e-5), (tile, err)


@pytest.mark.parametrize("case", CONVT2D, ids=[f"c{i}" for i in range(len(CONVT2D))])
def test_numpy_fast_conv_transpose_matches_generic(case, fast_mode):
    n, cin, cout, h, w, k, s, p, op_, d, g, bias = case
    kk = k if isinstance(k, tuple) else (k, k)

    def tup(v):
        return v if isinstance(v, tuple) else (v, v)
    x, wt, b = rnd(n, cin, h, w), rnd(cin, cout // g, *kk, seed=1), rnd(cout, seed=2)
    expected = F.conv_transpose2d(t(x), t(wt), t(b), s, p, op_, g, d).numpy()
    generic = fn.conv_transpose2d(x, wt, b, tup(s), tup(p), tup(op_), tup(d), g, xp=xnp)
    assert_close(generic, expected, rtol=RTOL, what="generic")
    plan = nf.conv_transpose2d_plan(wt, b, stride=tup(s), padding=tup(p), output_padding=tup(op_),
                                    dilation=tup(d), groups=g)
    assert_close(plan(x), expected, rtol=RTOL, what="fast")


@pytest.mark.parametrize("case", [
    # (n, cin, cout, h, w, k, s, p, output_padding, dilation, groups)
    (4, 8, 6, 9, 8, 2, 2, 0, 0, 1, 1),       # U-Net's up-sampling
    (3, 6, 4, 8, 10, 3, 1, 1, 0, 2, 2),      # stride 1 (written straight into the output), dilated, groups
    (2, 4, 5, 8, 8, 4, 3, 1, 2, 1, 1),       # output padding, stride above half the kernel
])
def test_conv_transpose2d_whole_images_per_thread(monkeypatch, case):
    """From two images of at least CONVT_IMAGES_MIN_PIXELS each, every thread runs whole images
    (its GEMM and col2im); the same against torch with the per-image split steps forced."""
    n, cin, cout, h, w, k, s, p, op_, d, g = case
    x, wt, b = rnd(n, cin, h, w), rnd(cin, cout // g, k, k, seed=1), rnd(cout, seed=2)
    expected = F.conv_transpose2d(t(x), t(wt), t(b), s, p, op_, g, d).numpy()
    slots = []
    real = nf.ConvTranspose2dPlan._col2im
    monkeypatch.setattr(nf.ConvTranspose2dPlan, "_col2im",
                        lambda self, *a, slot: slots.append(slot) or real(self, *a, slot=slot))
    plan = nf.conv_transpose2d_plan(wt, b, stride=(s, s), padding=(p, p), output_padding=(op_, op_),
                                    dilation=(d, d), groups=g)
    for limit in (nf.CONVT_IMAGES_MIN_PIXELS, 1 << 30):
        monkeypatch.setattr(nf, "CONVT_IMAGES_MIN_PIXELS", limit)
        slots.clear()
        got = np.array(in_fast_scope(nf, lambda: plan(x), 2))
        assert_close(got, expected, rtol=RTOL, what=f"limit {limit}")
        assert set(slots) == ({64} if limit < 1 << 30 else {60}), slots


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
def test_pad_modes_fast_and_generic(mode):
    x = rnd(2, 3, 5, 6)
    pads = ((2, 1), (0, 3))
    expected = F.pad(t(x), (0, 3, 2, 1), mode="constant" if mode == "zeros" else mode).numpy()
    assert_close(fn.pad(x, pads, mode, xp=xnp), expected, what="generic")
    assert_close(nf.pad(x, pads, mode), expected, what="fast")


# ---------------------------------------------------------------------------------------------
# pnnx export of a module with many convolutions

class ConvZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding="same", dilation=2, groups=8, bias=False)
        self.refl = nn.Conv2d(8, 6, 3, padding=1, padding_mode="reflect")
        self.rep = nn.Conv2d(6, 6, (3, 1), padding=(1, 0), padding_mode="replicate")
        self.circ = nn.Conv2d(6, 6, 4, padding="same", padding_mode="circular")
        self.valid = nn.Conv2d(6, 4, 2, padding="valid")
        self.up = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.pw = nn.Conv2d(4, 5, 1)
        self.c1 = nn.Conv1d(3, 4, 3, padding=1, stride=2)
        self.c1t = nn.ConvTranspose1d(4, 2, 4, stride=2, dilation=2)
        self.w = nn.Parameter(torch.randn(5, 5, 3, 3) * 0.2)

    def forward(self, x, y, k):
        a = self.valid(self.circ(self.rep(self.refl(self.dw(self.stem(x))))))
        a = self.pw(self.up(a))
        b = F.conv2d(a, self.w, padding=1)
        c = F.conv2d(a, k, stride=2)
        d = self.c1t(self.c1(y))
        return b, c, d


@pytest.fixture(scope="session")
def conv_zoo_export(tmp_path_factory):
    from helpers import export_torch

    torch.manual_seed(0)
    m = ConvZoo().eval()
    inputs = (torch.randn(1, 3, 18, 17), torch.randn(1, 3, 12), torch.randn(4, 5, 3, 3))
    inputs2 = (torch.randn(2, 3, 20, 16), torch.randn(2, 3, 14), torch.randn(4, 5, 3, 3))
    param = export_torch(m, inputs, tmp_path_factory.mktemp("convzoo"), inputs2=inputs2)
    return m, param, inputs2


def test_pnnx_conv_module_matches_torch(model_backend, conv_zoo_export):
    from helpers import run_graph, torch_outputs

    m, param, inputs = conv_zoo_export
    text = param.read_text()
    assert "padding_mode=circular" in text and "F.conv2d" in text and "nn.ConvTranspose1d" in text
    expected = torch_outputs(m, inputs)
    got = run_graph(param, model_backend, inputs)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=1e-4, what=f"output {k}")


@pytest.mark.usefixtures("fast_mode")
@pytest.mark.parametrize("algo, k, pads, g", [("gemm", 3, ((0, 0), (0, 0)), 1), ("1x1", 1, ((0, 0), (0, 0)), 1),
                                              ("depthwise", 3, ((0, 0), (0, 0)), 32),
                                              ("winograd", 3, ((0, 0), (0, 0)), 1),
                                              ("patch", 2, ((0, 0), (0, 0)), 1)])
def test_numpy_fast_conv_on_strided_views(algo, k, pads, g):
    base = rnd(2, 32, 12, 22)
    x = base[:, :, 1:11, ::-2]  # non-contiguous, negative stride
    wt = rnd(32, 32 // g, k, k, seed=1)
    s = k if algo == "patch" else 1
    expected = F.conv2d(t(x.copy()), t(wt), None, s, 0, 1, g).numpy()
    plan = nf.conv2d_plan(wt, None, stride=(s, s), groups=g, pads=pads, algo=algo,
                          tile=4 if algo == "winograd" else None)
    assert_close(plan(x), expected, rtol=1e-4, what=algo)


def test_conv_graph_is_thread_safe(tmp_path):
    """Several threads running one built graph (workspaces are per thread, outputs fresh)."""
    from concurrent.futures import ThreadPoolExecutor

    wt, b = rnd(32, 32, 3, 3, seed=1), rnd(32, seed=2)
    xs = [rnd(2, 32, 12, 12, seed=10 + i) for i in range(8)]
    expected = [F.conv2d(t(x), t(wt), t(b), 1, 1).numpy() for x in xs]
    g = op_graph(tmp_path, "nn.Conv2d", _conv_params(32, 32, 3, 1, 1, 1, 1, True, "zeros"), xs[:1],
                 expected[:1], {"weight": wt, "bias": b})
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda x: g(x)[0], xs * 3))
    for r, e in zip(results, expected * 3):
        assert_close(r, e, rtol=1e-4)


def test_conv1d_channel_mismatch_message_uses_1d_shapes(tmp_path):
    g = op_graph(tmp_path, "nn.Conv1d", _conv_params(4, 5, 3, 1, 1, 1, 1, False, "zeros", nd=1),
                 [rnd(1, 4, 9)], 1, {"weight": rnd(5, 4, 3)}, annotate=False)
    with pytest.raises(ShapeError, match=r"\(1, 3, 9\).*\(5, 4, 3\)"):
        g(rnd(1, 3, 9))


def test_numpy_fast_leaky_inplace_chunks_nan_and_every_slope(monkeypatch):
    """("leaky", slope) applied in place by activation_inplace: chunks split over 3 threads, NaN
    and +-inf kept as torch keeps them, slopes in [0, 1], above 1 and negative, a float64 array
    and a non-contiguous one; against torch."""
    monkeypatch.setattr(nf, "UNARY_CHUNK", 7)
    monkeypatch.setattr(nf, "TINY_ELEMENTS", 0)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    base = rnd(3, 5, 11) * 3
    base[0, 1, 2], base[1, 2, 3], base[2, 3, 4] = np.nan, np.inf, -np.inf
    old = nf.set_num_threads(3)
    try:
        with nf.compute_scope():
            for slope in (0.01, 0.0, 1.0, 1.7, -0.4):
                for x in (base, base.astype(np.float64), base.transpose(2, 0, 1)):
                    want = F.leaky_relu(t(np.ascontiguousarray(x)), slope).numpy()
                    y = x.copy() if x.flags.c_contiguous else x.transpose(1, 2, 0).copy().transpose(2, 0, 1)
                    got = nf.activation_inplace(y, ("leaky", slope))
                    assert got is y
                    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                    assert_close(np.nan_to_num(got, posinf=9, neginf=-9), np.nan_to_num(want, posinf=9, neginf=-9),
                                 rtol=1e-7, what=f"slope {slope} {x.dtype} c={x.flags.c_contiguous}")
    finally:
        nf.set_num_threads(old)


def test_numpy_fast_elu_inplace_chunks_specials(monkeypatch):
    """("elu", alpha, scale, divisor) in place: ELU, CELU and SELU over chunks on 3 threads, NaN and
    +-inf and values near 0 (expm1 exact there), float64, a non-contiguous array; against torch."""
    monkeypatch.setattr(nf, "UNARY_CHUNK", 7)
    monkeypatch.setattr(nf, "TINY_ELEMENTS", 0)
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 0)
    base = rnd(3, 5, 11) * 3
    base[0, 0, :4] = [1e-30, -1e-30, -1e-6, 1e-6]
    base[0, 1, 2], base[1, 2, 3], base[2, 3, 4] = np.nan, np.inf, -np.inf
    cases = [(("elu", 1.0, 1.0, 1.0), lambda x: F.elu(x)), (("elu", 0.3, 1.0, 1.0), lambda x: F.elu(x, 0.3)),
             (("elu", 2.0, 1.0, 2.0), lambda x: F.celu(x, 2.0)),
             (("elu", 1.6732632423543772, 1.0507009873554805, 1.0), F.selu)]
    old = nf.set_num_threads(3)
    try:
        with nf.compute_scope():
            for spec, ref_fn in cases:
                for x in (base, base.astype(np.float64), base.transpose(2, 0, 1)):
                    want = ref_fn(t(np.ascontiguousarray(x))).numpy()
                    y = x.copy() if x.flags.c_contiguous else x.transpose(1, 2, 0).copy().transpose(2, 0, 1)
                    got = nf.activation_inplace(y, spec)
                    assert got is y
                    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
                    ok = np.isfinite(want)
                    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-6, atol=0, err_msg=str(spec))
    finally:
        nf.set_num_threads(old)


class _InvertedResidual(nn.Module):
    """MobileNetV2's block on a small map: 1x1 expand + ReLU6, depthwise 3x3 + ReLU6, 1x1."""

    def __init__(self, c=8, e=24, stride=1):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, stride, 1, groups=e), nn.ReLU6())
        self.project = nn.Conv2d(e, c, 1)

    def forward(self, x):
        return self.project(self.dw(self.expand(x)))


@pytest.mark.parametrize("stride", [1, 2])
def test_expand_conv_hands_a_small_depthwise_its_output_channels_last(tmp_path, stride):
    """The runtime marks a convolution whose only consumer is a depthwise convolution reading
    channels-last (numpy, small map): the 1x1 expand then computes its result channels-last;
    the block still gives torch's result at batch 1 and 3, with the optional numba kernels on
    too (they read planar input: the hand-over then costs a copy, never a wrong answer)."""
    from helpers import export_torch

    torch.manual_seed(0)
    m = _InvertedResidual(stride=stride).eval()
    x1, x3 = torch.rand(1, 8, 10, 10) * 4, torch.rand(3, 8, 10, 10) * 4
    g = kuiper_xp.load(export_torch(m, (x1,), tmp_path, inputs2=(x3,)), backend="numpy")
    marked = [r.layer for r in g.execution_order if getattr(r.layer, "channels_last_out", False)]
    assert len(marked) == 1 and marked[0].weight.shape[2:] == (1, 1)
    with torch.no_grad():
        for x in (x1, x3):
            assert_close(g(x.numpy())[0], m(x).numpy(), rtol=1e-5, what=f"batch {x.shape[0]}")
    try:
        from kuiper_xp.backends import numpy_fast as nf

        old = nf.use_numba(True)
    except ImportError:
        return
    try:
        with torch.no_grad():
            assert_close(g(x3.numpy())[0], m(x3).numpy(), rtol=1e-5, what="numba")
    finally:
        nf.use_numba(old)


def test_deeplab_aspp_from_the_benchmark_models_matches_torch(model_backend, tmp_path):
    """benchmarks/more_models.py's DeepLab-style ASPP exported by pnnx (dilated 3x3 convolutions
    at rates 6, 12 and 18 on an 8x8 map: on numpy the per-tap path, most taps reading padding;
    a global pool upsampled back, concatenation, bilinear upsampling) against torch, batch 2."""
    from helpers import more_models
    from test_layers_misc import compare_graph, export_module

    more = more_models()
    torch.manual_seed(0)
    model = more.deeplab_aspp().eval()
    x = torch.randn(2, 3, 64, 64)
    param = export_module(model, (x,), tmp_path)  # (pnnx's own Python of a Sequential does not parse)
    compare_graph(param, model_backend, model, (x,), rtol=1e-4)


def test_numpy_fast_winograd_dilated_choice_and_refusal():
    """A dilated 3x3 "same" convolution with enough channels on sub-images big enough runs as
    Winograd over its polyphase sub-images (DeepLab's rate-2 layer: 256 -> 512 at 28x28, F(2x2));
    small sub-images or few channels keep the GEMM; Winograd forced on a dilated convolution whose
    padding is not its dilation is refused (the polyphase split would give a wrong answer)."""
    pick = nf.choose_algorithm
    same = ((2, 2), (2, 2))
    assert pick(512, 256, (3, 3), (1, 1), (2, 2), 1, same, np.float32, (28, 28)) == ("winograd", 2)
    assert pick(256, 256, (3, 3), (1, 1), (2, 2), 1, same, np.float32, (64, 64)) == ("winograd", 4)
    assert pick(512, 512, (3, 3), (1, 1), (4, 4), 1, ((4, 4), (4, 4)), np.float32, (28, 28))[0] != "winograd"
    assert pick(64, 64, (3, 3), (1, 1), (2, 2), 1, same, np.float32, (56, 56))[0] != "winograd"
    assert pick(512, 256, (3, 3), (1, 1), (2, 2), 1, ((1, 1), (1, 1)), np.float32, (28, 28))[0] != "winograd"
    assert pick(512, 256, (3, 3), (1, 1), (2, 2), 1, same, np.float32, None) == ("winograd", 4)
    assert pick(64, 64, (3, 3), (1, 1), (2, 2), 1, same, np.float32, None)[0] != "winograd"
    # the polyphase path runs (and matches torch) on a call with sub-images big enough
    x, w3, b3 = rnd(1, 256, 29, 28), rnd(256, 256, 3, 3, seed=1) * 0.05, rnd(256, seed=2)
    plan = nf.conv2d_plan(w3, b3, dilation=(2, 2), pads=same, input_hw=(29, 28))
    assert (plan.algo, plan.tile) == ("winograd", 2)
    calls = []
    orig = plan._run_winograd_phases
    plan._run_winograd_phases = lambda *a: calls.append(1) or orig(*a)
    want = F.conv2d(t(x), t(w3), t(b3), 1, 2, 2).numpy()
    assert_close(plan(x), want, rtol=1e-4, what="dilated Winograd")
    assert calls == [1]
    small = x[:, :, :12, :12]
    assert_close(plan(small), F.conv2d(t(small), t(w3), t(b3), 1, 2, 2).numpy(), rtol=1e-4,
                 what="small call: GEMM")
    assert calls == [1]
    w = rnd(8, 8, 3, 3)
    with pytest.raises(ValueError, match="Winograd"):
        nf.conv2d_plan(w, None, dilation=(2, 2), pads=((1, 1), (1, 1)), algo="winograd")
    with pytest.raises(ValueError, match="Winograd"):
        nf.conv2d_plan(w, None, dilation=(2, 3), pads=((2, 2), (3, 3)), algo="winograd")


class SamePaddingForms(nn.Module):
    """padding='same' as pnnx writes it: ``same`` (square kernel, circular), F.pad-order pads
    ``(2,2,0,1)`` (kernel (2, 5), reflect) and ``()`` (Conv1d, replicate)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 4, padding="same", padding_mode="circular")
        self.b = nn.Conv2d(4, 4, (2, 5), padding="same", padding_mode="reflect")
        self.c = nn.Conv1d(3, 4, 4, padding="same", padding_mode="replicate")
        self.d = nn.Conv2d(4, 2, (3, 4), padding="same", dilation=(1, 2))

    def forward(self, x, y):
        return self.d(self.b(self.a(x))), self.c(y)


def test_pnnx_same_padding_forms_match_torch(model_backend, tmp_path):
    from helpers import export_torch, run_graph, torch_outputs

    torch.manual_seed(0)
    m = SamePaddingForms().eval()
    inputs2 = (torch.randn(2, 3, 10, 12), torch.randn(2, 3, 15))
    param = export_torch(m, (torch.randn(1, 3, 9, 11), torch.randn(1, 3, 13)), tmp_path, inputs2=inputs2)
    assert "padding=(2,2,0,1)" in param.read_text()  # the form this test is for
    for k, (a, e) in enumerate(zip(run_graph(param, model_backend, inputs2), torch_outputs(m, inputs2))):
        assert_close(a, e, rtol=1e-4, what=f"output {k}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fast_depthwise_dense_small_maps(monkeypatch, dtype):
    """Kernels covering much of a small map (ConvMixer's 9x9 on 9x9, ConvNeXt's 7x7 on 7x7, 3x3 on
    5x5 from batch 4) run as per-channel dense matrices by default: two input sizes (one matrix
    each), batch 1 and 4, stride 2 with uneven pads, fused GELU on the threads of a compute
    scope (channels split between them), a channels-last input view; against torch."""
    monkeypatch.setattr(nf, "PARALLEL_MIN_ELEMENTS", 1)
    rtol = RTOL if dtype == np.float32 else 1e-12
    cases = [(1, 12, 9, 9, 9, 1, ((4, 4), (4, 4))), (4, 12, 9, 9, 9, 1, ((4, 4), (4, 4))),
             (2, 10, 7, 8, 7, 1, ((3, 3), (3, 3))), (4, 8, 5, 5, 3, 1, ((1, 1), (1, 1))),
             (5, 6, 6, 7, 5, 2, ((2, 1), (1, 2)))]
    for n, c, h, w, k, s, pads in cases:
        x, wt, b = (a.astype(dtype) for a in (rnd(n, c, h, w), rnd(c, 1, k, k, seed=1), rnd(c, seed=2)))
        (pt, pb), (pl, pr) = pads
        expected = F.conv2d(F.pad(t(x), (pl, pr, pt, pb)), t(wt), t(b), s, 0, 1, c)
        plan = nf.conv2d_plan(wt, b, stride=(s, s), groups=c, pads=pads)
        assert plan._dense_ok(n, h, w, *expected.shape[2:]), (n, c, h, w, k)
        got = plan(x)
        assert got.flags.c_contiguous and got.dtype == dtype
        assert_close(got, expected.numpy(), rtol=rtol, what=f"dense {n, c, h, w, k}")
        old = nf.set_num_threads(2)
        try:
            with nf.compute_scope():
                xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
                assert_close(plan(xl, "gelu"), F.gelu(expected).numpy(), rtol=rtol, what="dense gelu")
        finally:
            nf.set_num_threads(old)
    assert len(plan._dense) == 1
    x2 = rnd(1, 6, 4, 5).astype(dtype)  # a second input size: a second matrix
    assert_close(plan(x2), F.conv2d(F.pad(t(x2), (1, 2, 2, 1)), t(wt), t(b), 2, 0, 1, 6).numpy(), rtol=rtol)
    assert len(plan._dense) == 2


class _ConvThenDimActivation(nn.Module):
    """A convolution whose only consumer is an activation over a dim: the runtime fuses it (the
    activation layer's forward becomes the convolution's callable) and the callable must see the
    convolution's output shape, not its internal 4-D/5-D one."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.conv = {"conv1d": nn.Conv1d(6, 8, 3, padding=1), "convT1d": nn.ConvTranspose1d(6, 8, 3, stride=2),
                     "conv3d": nn.Conv3d(3, 4, 3, padding=1), "conv3d_t": nn.Conv3d(3, 4, (3, 1, 1)),
                     "conv2d": nn.Conv2d(3, 4, 3, padding=1)}[kind.split(":")[0]]

    def forward(self, x):
        y = self.conv(x)
        dim = int(self.kind.split(":")[1])
        if self.kind.endswith(":glu"):
            return F.glu(y, dim=dim)
        return F.softmax(y, dim=dim)


@pytest.mark.parametrize("kind, shape", [
    ("conv1d:2", (2, 6, 10)), ("conv1d:-2", (2, 6, 10)), ("conv1d:2:glu", (2, 6, 10)),
    ("convT1d:2", (2, 6, 7)), ("conv3d:2", (2, 3, 4, 5, 6)), ("conv3d_t:4", (2, 3, 4, 5, 6)),
    ("conv2d:3", (2, 3, 6, 8)),
])
def test_activation_over_a_dim_fused_into_a_convolution(model_backend, tmp_path, kind, shape):
    """Conv1d then softmax(dim=2) was fused and applied on the (N, C, 1, L) array inside the
    convolution (ECAPA-TDNN's attentive pooling 2e3 off torch; GLU(dim=2) refused the shape)."""
    from helpers import compare_with_torch, export_torch

    torch.manual_seed(0)
    m = _ConvThenDimActivation(kind).eval()
    x = torch.from_numpy(rnd(*shape))
    param = export_torch(m, (x,), tmp_path)
    g = kuiper_xp.load(param, backend="numpy")
    assert g.fused, "the activation is expected to be fused into the convolution"
    compare_with_torch(m, (x,), model_backend, param=param, rtol=1e-5)


@pytest.mark.parametrize("max_stride", [2, 1 << 10], ids=["large-strides-one-block", "all-polyphase"])
@pytest.mark.parametrize("n, c, o, h, w, kh, kw, stride, pads", [
    (1, 1, 10, 1, 700, 1, 64, (1, 32), ((0, 0), (0, 0))),   # an STFT-like Conv1d: 32 phases
    (2, 3, 5, 17, 19, 5, 5, (4, 4), ((2, 2), (1, 2))),
    (2, 4, 6, 13, 14, 4, 4, (3, 3), ((2, 1), (0, 2))),
    (1, 3, 4, 15, 15, 3, 3, (2, 2), ((1, 1), (1, 1))),     # stride 2: polyphase either way
])
def test_numpy_fast_gemm_polyphase_only_for_small_strides(monkeypatch, max_stride, n, c, o, h, w, kh, kw,
                                                          stride, pads):
    """A strided GEMM convolution takes its patches from the input's polyphase split only up to
    GEMM_POLYPHASE_MAX_STRIDE (one patch block per phase: 32 of them for the STFT-like case);
    both layouts give torch's result."""
    monkeypatch.setattr(nf, "GEMM_POLYPHASE_MAX_STRIDE", max_stride)
    x, wt, b = rnd(n, c, h, w), rnd(o, c, kh, kw, seed=1), rnd(o, seed=2)
    blocks = nf._gemm_blocks(kh, kw, stride, (1, 1), c)
    phases = sum(1 for p in range(stride[0]) if p < kh) * sum(1 for q in range(stride[1]) if q < kw)
    assert len(blocks) == (phases if max(stride) <= max_stride else 1)
    plan = nf.conv2d_plan(wt, b, stride=stride, pads=pads, algo="gemm")
    xp_ = F.pad(t(x), (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
    want = F.conv2d(xp_, t(wt), t(b), stride).numpy()
    from helpers import in_fast_scope

    assert_close(in_fast_scope(nf, lambda: plan(x)), want, rtol=RTOL, what=f"{len(blocks)} blocks")


def test_packed_plans_hold_the_only_copy_of_the_weight(tmp_path):
    """numpy: a 1x1 or depthwise convolution's plan keeps its re-laid-out weight, the layer only
    the shape (not a second copy of the values); results and the channel check are unchanged."""
    from helpers import export_torch

    from kuiper_xp.layers.conv import _PACKED_ONLY, _Shape

    class Net(nn.Module):  # (named children: pnnx's Python re-export of a Sequential's "0" fails)
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(8, 16, 1), nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.c = nn.Conv2d(16, 4, 3)

        def forward(self, x):
            return self.c(self.b(self.a(x)))

    m = Net().eval()
    x = torch.randn(2, 8, 9, 9)
    g = kuiper_xp.load(export_torch(m, (x,), tmp_path, inputs2=(torch.randn(3, 8, 9, 9),)), backend="numpy")
    convs = [lay for lay in g.layers if type(lay).__name__ == "Convolution"]
    assert [c._plan.algo for c in convs][:2] == ["1x1", "depthwise"]
    assert all(isinstance(c.weight, _Shape) == (c._plan.algo in _PACKED_ONLY) for c in convs)
    with torch.no_grad():
        assert_close(g(x.numpy())[0], m(x).numpy(), rtol=1e-5, what="1x1 + depthwise + 3x3")
    with pytest.raises(ShapeError, match=r"input has 7 channels .* weight \(16, 8, 1, 1\)"):
        convs[0](np.zeros((1, 7, 9, 9), np.float32))


@pytest.mark.parametrize("case", [
    # (n, c, h, w, k, dilation, where, value): paths that multiply by matrices or transforms
    (1, 6, 4, 4, 3, 1, (0, 0, 0, 0), np.inf),      # depthwise, dense matrix (small map)
    (4, 6, 7, 7, 3, 1, (0, 0, 0, 0), np.nan),      # depthwise, dense matrix (7x7 at batch 4)
    (1, 6, 20, 20, 5, 1, (0, 0, 10, 3), np.inf),   # depthwise 5x5, Toeplitz bands
    (1, 64, 28, 28, 3, 1, (0, 0, 5, 5), np.inf),   # Winograd F(4x4, 3x3)
    (1, 64, 28, 28, 3, 2, (0, 0, 5, 5), np.nan),   # Winograd on the dilated polyphase split
])
def test_numpy_fast_conv_non_finite_input_stays_where_torch_has_it(case):
    """One inf or NaN pixel: torch's convolution spreads it to the outputs that read it; the
    dense/band depthwise products and the Winograd transforms must not spread it further."""
    from kuiper_xp.backends import numpy_fast as nf

    n, c, h, w, k, d, where, value = case
    depthwise = c == 6
    x = rnd(n, c, h, w)
    x[where] = value
    wt = rnd(c, 1 if depthwise else c, k, k, seed=1)
    b = rnd(c, seed=2)
    p = d * (k // 2)
    expected = F.conv2d(t(x), t(wt), t(b), 1, p, d, c if depthwise else 1).numpy()
    assert 0 < (~np.isfinite(expected)).sum() < expected.size // 2
    plan = nf.conv2d_plan(wt, b, stride=(1, 1), dilation=(d, d), groups=c if depthwise else 1,
                          pads=((p, p), (p, p)), input_hw=(h, w), algo=None if depthwise else "winograd")
    assert plan.algo == ("depthwise" if depthwise else "winograd")
    for threads in (1, 2):
        old = nf.set_num_threads(threads)
        try:
            with nf.compute_scope():
                got = plan(x)
        finally:
            nf.set_num_threads(old)
        assert_close(got, expected, rtol=1e-4, what=f"{plan.algo}, {threads} thread(s)")


def test_numpy_fast_winograd_of_huge_values_does_not_overflow():
    """|x| ~ 1e37: F(4x4, 3x3)'s input transform overflows float32 where the convolution
    itself does not (torch: outputs ~3e32)."""
    from kuiper_xp.backends import numpy_fast as nf

    x = rnd(1, 64, 28, 28) * np.float32(1e37)
    wt = rnd(64, 64, 3, 3, seed=1) * np.float32(1e-6)
    expected = F.conv2d(t(x), t(wt), None, 1, 1).numpy()
    assert np.isfinite(expected).all()
    plan = nf.conv2d_plan(wt, None, pads=((1, 1), (1, 1)), input_hw=(28, 28))
    assert plan.algo == "winograd"
    assert_close(plan(x), expected, rtol=1e-4)


def _torch_activation(ref, act):
    """torch's result of a fused activation spec of ``activation_inplace`` (None, "relu", "silu",
    ("clamp", lo, hi), ("leaky", slope))."""
    if act is None:
        return ref
    if act == "relu":
        return torch.relu(ref)
    if act == "silu":
        return F.silu(ref)
    if act[0] == "clamp":
        return ref.clamp(act[1], act[2])
    assert act[0] == "leaky", act
    return F.leaky_relu(ref, act[1])


_WINO_BLOCK_CASES = [
    # (n, c, o, h, w, tile, pads ((t, b), (l, r)), bias, activation, dtype, block bytes)
    (8, 16, 24, 30, 30, 4, ((1, 1), (1, 1)), True, ("leaky", 0.1), np.float32, None),  # whole images
    (2, 16, 24, 30, 30, 4, ((1, 1), (1, 1)), True, "silu", np.float32, 40 << 10),  # a tile row each
    (1, 16, 24, 30, 30, 4, ((1, 1), (1, 1)), True, "relu", np.float32, 40 << 10),
    (3, 12, 20, 23, 17, 4, ((2, 0), (0, 1)), False, None, np.float32, 40 << 10),  # uneven pads, rows
    (3, 32, 40, 14, 14, 2, ((1, 1), (1, 1)), True, ("clamp", 0.0, 6.0), np.float32, 64 << 10),
    (2, 8, 8, 19, 21, 4, ((1, 1), (1, 1)), True, ("leaky", 0.2), np.float64, 32 << 10),
]


@pytest.mark.parametrize("case", _WINO_BLOCK_CASES, ids=lambda c: f"n{c[0]}c{c[1]}o{c[2]}_{c[3]}x{c[4]}F{c[5]}")
def test_winograd_blocks_per_thread_match_torch(monkeypatch, case):
    """With two threads and enough tiles beside the weights, each thread runs all of Winograd's steps
    on its own blocks of tile rows (``_Winograd._blocks``), bias and activation fused: against
    torch for whole images per block and tile rows per block, outputs that are not a multiple
    of the tile (uneven padding), F(2x2), float64, without a bias, and each fused activation (a
    leaky ReLU applied twice would show, a SiLU left unapplied too); one thread runs the same
    blocks one after the other."""
    n, c, o, h, w, tile, pads, has_bias, act, dt, block = case
    if block is not None:
        monkeypatch.setattr(nf, "WINOGRAD_BLOCK_BYTES", block)
    rng = np.random.default_rng(n * c + o + h)
    x = rng.standard_normal((n, c, h, w)).astype(dt)
    wt = (rng.standard_normal((o, c, 3, 3)) * 0.2).astype(dt)
    b = rng.standard_normal(o).astype(dt) if has_bias else None
    (t_, bo), (l, r) = pads
    ref = F.conv2d(F.pad(torch.from_numpy(x), (l, r, t_, bo)), torch.from_numpy(wt),
                   None if b is None else torch.from_numpy(b))
    ref = _torch_activation(ref, act)
    calls = []
    real = nf._Winograd._blocks

    def spy(self, *args, **kw):
        k = nf._threads_now()
        calls.append((k, len(self._items(args[0].shape[0], *[-(-s // self.m) for s in ref.shape[2:]], c,
                                         args[0].dtype.itemsize, k))))
        return real(self, *args, **kw)
    monkeypatch.setattr(nf._Winograd, "_blocks", spy)
    plan = nf.conv2d_plan(wt, b, pads=pads, algo="winograd", tile=tile)
    results = {threads: np.array(in_fast_scope(nf, lambda: plan(x, act), threads)) for threads in (2, 1)}
    assert [k for k, _ in calls] == [2, 1] and calls[0][1] >= 2, calls  # several blocks on two threads
    if block is not None:
        assert calls[0][1] > n  # (tile rows of one image per block)
    tol = 1e-4 if dt == np.float32 else 1e-10
    for threads, got in results.items():
        assert got.dtype == dt and got.shape == tuple(ref.shape)
        assert_close(got, ref.numpy(), rtol=tol, what=f"Winograd F({tile}x{tile}), {threads} thread(s)")


def test_winograd_blocks_only_with_enough_tiles_per_channel(monkeypatch):
    """One 16x16 image of 64 channels (16 tiles, 0.25 per channel) keeps the chunked steps, split
    over the threads; two images (0.5, from WINOGRAD_BLOCKS_BATCH_MIN_RATIO) take the blocks;
    both against torch."""
    calls = []
    for name in ("_blocks", "_steps"):
        real = getattr(nf._Winograd, name)
        monkeypatch.setattr(nf._Winograd, name,
                            lambda self, *a, name=name, real=real: calls.append((name, a[0].shape[0])) or real(self, *a))
    wt, b = rnd(64, 64, 3, 3, seed=1) * np.float32(0.1), rnd(64, seed=2)
    plan = nf.conv2d_plan(wt, b, pads=((1, 1), (1, 1)), algo="winograd", tile=4)
    for n in (1, 2):
        x = rnd(n, 64, 16, 16, seed=n)
        got = np.array(in_fast_scope(nf, lambda x=x: plan(x, "relu"), 2))
        assert_close(got, torch.relu(F.conv2d(t(x), t(wt), t(b), 1, 1)).numpy(), rtol=1e-4)
    assert calls == [("_steps", 1), ("_blocks", 2)]


def test_winograd_blocks_non_finite_and_huge_inputs_match_torch(monkeypatch):
    """The per-thread blocks keep the chunked path's guards: one inf pixel reaches only the
    outputs that read it, and inputs near 1e37 (which overflow F(4x4)'s transform) give torch's
    finite result (both are made again as a GEMM, the fused activation too)."""
    x = rnd(4, 16, 24, 24)
    wt = rnd(16, 16, 3, 3, seed=1) * np.float32(0.1)
    b = rnd(16, seed=2)
    x_inf = x.copy()
    x_inf[2, 3, 10, 7] = np.inf
    calls = []
    real = nf._Winograd._blocks
    monkeypatch.setattr(nf._Winograd, "_blocks", lambda self, *a: calls.append(1) or real(self, *a))
    for xi, w_, finite in ((x_inf, wt, False), (x * np.float32(1e37), wt * np.float32(1e-6), True)):
        plan = nf.conv2d_plan(w_, b, pads=((1, 1), (1, 1)), algo="winograd", tile=4)
        expected = F.leaky_relu(F.conv2d(t(xi), t(w_), t(b), 1, 1), 0.1).numpy()
        assert np.isfinite(expected).all() == finite
        if not finite:
            assert (~np.isfinite(expected)).sum() <= 9 * 16  # the 3x3 outputs reading it
        got = np.array(in_fast_scope(nf, lambda p=plan, xi=xi: p(xi, ("leaky", 0.1)), 2))
        assert_close(got, expected, rtol=1e-4)
    assert len(calls) == 2


@pytest.mark.parametrize("case", [
    # (n, c, o, k, stride, hw, shared): small maps at batch > 1 on two threads
    (4, 64, 64, 3, 1, 24, False),   # weights 0.14 MiB, patches 1.3 MiB an image: per-thread blocks
    (4, 32, 32, 3, 1, 28, False),   # two blocks of two images: one per thread
    (4, 256, 128, 9, 2, 8, True),   # weights 10 MiB, 8x one image's patches: shared GEMMs
    (9, 256, 96, 9, 2, 8, True),    # 7.6 MiB: chunks of 6 images (and 3)
])
def test_small_maps_with_heavy_weights_share_their_gemms(monkeypatch, case):
    """Batched small maps run as per-thread blocks of images, each thread reading all the
    weights per block, unless the weights are over GEMM_IMAGES_MAX_WEIGHT_RATIO times a block's
    patches (CapsNet's 9x9 256 -> 256): then shared GEMMs over as many images as the weights
    weigh. Both against torch, ReLU fused."""
    n, c, o, k, s, hw, shared = case
    calls = []
    real = nf.Conv2dPlan._run_gemm_images
    monkeypatch.setattr(nf.Conv2dPlan, "_run_gemm_images", lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(n + c + o + k)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    wt = (rng.standard_normal((o, c, k, k)) * 0.05).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    plan = nf.conv2d_plan(wt, b, stride=(s, s), pads=((k // 2, k // 2),) * 2, algo="gemm")
    got = np.array(in_fast_scope(nf, lambda: plan(x, "relu"), 2))
    assert bool(calls) != shared, calls
    ref = torch.relu(F.conv2d(t(x), t(wt), t(b), s, k // 2)).numpy()
    assert_close(got, ref, rtol=1e-5)


@pytest.mark.parametrize("layout", ["planar", "channels_last"])
def test_heavy_1x1_convolutions_on_small_maps_take_one_shared_gemm(monkeypatch, layout):
    """A batched 1x1 convolution whose output channels are over GEMM_IMAGES_MAX_WEIGHT_RATIO
    times an image's pixels (ResNet-50's 512 -> 2048 at 7x7) copies the images side by side into
    one GEMM (``_run_1x1_copy``) instead of per-thread blocks that each read all the weights; a
    light one (64 -> 32) keeps the blocks. Against torch, bias and ReLU, planar and
    channels-last inputs."""
    calls = []
    real = nf.Conv2dPlan._run_1x1_copy
    monkeypatch.setattr(nf.Conv2dPlan, "_run_1x1_copy", lambda self, *a: calls.append(self.o) or real(self, *a))
    rng = np.random.default_rng(3)
    for c, o in ((512, 2048), (64, 32)):
        x = rng.standard_normal((4, c, 7, 7)).astype(np.float32)
        if layout == "channels_last":
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        wt = (rng.standard_normal((o, c, 1, 1)) * 0.05).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32)
        plan = nf.conv2d_plan(wt, b, input_hw=(7, 7))
        assert plan.algo == "1x1"
        got = np.array(in_fast_scope(nf, lambda p=plan, x=x: p(x, "relu"), 2))
        assert_close(got, torch.relu(F.conv2d(t(np.ascontiguousarray(x)), t(wt), t(b))).numpy(), rtol=1e-5)
    assert calls == [2048], calls


def test_numpy_fast_conv_plan_refuses_what_it_cannot_run():
    """The plan API (benchmarks, tests, users forcing an algorithm) says what does not fit
    instead of failing inside numpy or reading only some of the channels."""
    from kuiper_xp.backends import numpy_fast as nf

    w3 = rnd(4, 3, 3, 3)
    with pytest.raises(ValueError, match="unknown convolution algorithm 'fft'"):
        nf.conv2d_plan(w3, None, algo="fft")
    with pytest.raises(ValueError, match="1x1 algorithm needs a 1x1 kernel"):
        nf.conv2d_plan(w3, None, algo="1x1")
    with pytest.raises(ValueError, match="one input channel per group"):
        nf.conv2d_plan(rnd(4, 2, 3, 3), None, groups=2, algo="depthwise")
    plan = nf.conv2d_plan(w3, None, pads=((1, 1), (1, 1)))
    with pytest.raises(ShapeError, match=r"expected \(N, 3, H, W\)"):
        plan(rnd(2, 4, 6, 6))


def test_operand_workspace_spaces_aliasing_rows():
    """GEMM operands whose rows are a multiple of 256 bytes get rows 64 bytes further apart
    (OpenBLAS packs them faster); other widths stay contiguous."""
    a = nf._operand_workspace((5, 256), np.float32, slot=90)
    assert a.shape == (5, 256) and a.strides == ((256 + 16) * 4, 4)
    b = nf._operand_workspace((2, 5, 3136), np.float32, slot=90)
    assert b.shape == (2, 5, 3136) and b.strides[1] == (3136 + 16) * 4
    c = nf._operand_workspace((5, 200), np.float32, slot=90)
    assert c.flags.c_contiguous and c.shape == (5, 200)
    d = nf._operand_workspace((5, 32), np.float64, slot=90)  # 256 bytes a row: padded too
    assert d.strides == ((32 + 8) * 8, 8)


_SMALL_CASES = [
    # (n, c, o, k, stride, dilation, pads ((t, b), (l, r)), groups, h, w, dtype, activation)
    (1, 1, 16, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), 1, 28, 28, np.float32, "relu"),  # an MNIST stem
    (1, 16, 32, (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), 1, 14, 14, np.float32, None),
    (3, 6, 8, (5, 3), (1, 2), (1, 1), ((2, 1), (0, 2)), 2, 11, 9, np.float32, ("clamp", 0.0, 6.0)),
    (2, 8, 12, (3, 3), (1, 1), (2, 2), ((2, 2), (2, 2)), 4, 9, 10, np.float64, ("leaky", 0.1)),
    (1, 4, 6, (2, 4), (3, 1), (1, 2), ((0, 0), (0, 0)), 1, 13, 12, np.float32, None),  # no padding
    (4, 3, 5, (1, 3), (1, 1), (1, 1), ((0, 0), (1, 1)), 1, 5, 7, np.float32, ("leaky", 0.2)),
    (1, 48, 48, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 1, 8, 8, np.float32, ("leaky", 0.1)),  # Winograd's
]


@pytest.mark.parametrize("case", _SMALL_CASES, ids=lambda c: f"{c[0]}x{c[1]}to{c[2]}k{c[3]}s{c[4]}d{c[5]}g{c[7]}")
def test_tiny_convolutions_take_one_plain_gemm_and_match_torch(monkeypatch, case):
    """A convolution of at most SMALL_CONV_MACS multiply-adds, on a plan whose algorithm was
    chosen automatically, runs as one im2col and GEMM (Conv2dPlan._run_small): against torch
    for groups, strides, dilations, uneven padding, batches, float64 and each fused activation
    (a leaky ReLU applied twice would show: the Winograd-chosen plan applies it after the
    convolution itself). A plan whose algorithm was named keeps it."""
    n, c, o, k, s, d, pads, g, h, w, dt, act = case
    rng = np.random.default_rng(len(_SMALL_CASES) + n * c * o)
    x = rng.standard_normal((n, c, h, w)).astype(dt)
    wt = rng.standard_normal((o, c // g, *k)).astype(dt)
    b = rng.standard_normal(o).astype(dt)
    calls = []
    real = nf.Conv2dPlan._run_small

    def spy(self, *args, **kw):
        calls.append(self.algo)
        return real(self, *args, **kw)
    monkeypatch.setattr(nf.Conv2dPlan, "_run_small", spy)
    plan = nf.conv2d_plan(wt, b, stride=s, dilation=d, groups=g, pads=pads, input_hw=(h, w))
    with nf.compute_scope():
        got = np.array(plan(x, act))
    (t, bo), (l, r) = pads
    ref = F.conv2d(F.pad(torch.from_numpy(x), (l, r, t, bo)), torch.from_numpy(wt), torch.from_numpy(b),
                   stride=s, dilation=d, groups=g)
    ref = _torch_activation(ref, act)
    assert calls == [plan.algo], (calls, plan.algo)
    assert got.dtype == dt and got.shape == tuple(ref.shape)
    assert_close(got, ref.numpy(), rtol=1e-5 if dt == np.float32 else 1e-12, what=f"tiny convolution {case}")
    named = nf.conv2d_plan(wt, b, stride=s, dilation=d, groups=g, pads=pads, algo="gemm")
    with nf.compute_scope():
        again = np.array(named(x, act))
    assert calls == [plan.algo]  # (not taken for the named algorithm)
    assert_close(again, ref.numpy(), rtol=1e-5 if dt == np.float32 else 1e-12, what="gemm")


@pytest.mark.parametrize("stride,batch", [(1, 1), (2, 1), (1, 3)])
def test_1x1_plan_takes_read_only_weights_as_they_are(stride, batch):
    """A 1x1 plan uses read-only weights (a graph's) as its matrix without a copy and makes the
    (O, C + 1) matrix with the bias column only for a call that folds the bias (a strided input,
    several small images); writeable weights are copied, so changing them later changes
    nothing. torch gives the expected values."""
    from kuiper_xp.backends import numpy_fast as nf

    rng = np.random.default_rng(stride * 10 + batch)
    w = rng.standard_normal((24, 16, 1, 1)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    x = rng.standard_normal((batch, 16, 9, 7)).astype(np.float32)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride=stride).numpy()
    w.flags.writeable = False
    plan = nf.conv2d_plan(w, b, stride=(stride, stride))
    assert plan.algo == "1x1" and np.shares_memory(plan.wmat, w) and plan._wfold is None
    assert_close(in_fast_scope(nf, lambda: plan(x)), want, rtol=1e-5)
    if stride == 2:  # (the strided input is copied, with a row of ones for the bias)
        assert plan._wfold is not None and plan._wfold.shape == (24, 17)
    w2 = w.copy()
    plan2 = nf.conv2d_plan(w2, b, stride=(stride, stride))
    assert not np.shares_memory(plan2.wmat, w2)
    w2[:] = 0
    assert_close(in_fast_scope(nf, lambda: plan2(x)), want, rtol=1e-5)
