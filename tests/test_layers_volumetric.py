"""F.conv3d and F.conv_transpose3d (kuiper_xp/layers/volumetric.py) against torch, on every
backend leg: pnnx exports with the weights and biases as graph inputs (stride, padding as ints,
'same' with an even kernel and 'valid', dilation, groups, depthwise, 1x1x1, no bias, a runtime
bias, odd sizes, batch 2, a following ReLU folded in), both the single-matmul im2col path and the
per-tap path, unbatched input, weights as attributes in float32 and float64; and the errors.
(The module forms and the 3-D pools are tested in test_layers_conv3d.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from test_layers_conv import op_graph
from test_layers_misc import export_module, make_layer, t2n
from torch import nn

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError
from kuiper_xp.layers import volumetric

# torch's own note on an even kernel with padding='same' (the case is tested on purpose)
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")


class Functional(nn.Module):
    """Every weight is an input, so pnnx keeps the functional ops."""

    def forward(self, x, w1, b1, w2, w3, w4, w5, w6):
        a = F.conv3d(x, w1, b1, stride=2, padding=(1, 0, 2), dilation=(1, 2, 1))
        b = F.conv3d(x, w2, None, padding="same", groups=2, dilation=(2, 1, 1))  # even kernel
        c = F.relu(F.conv3d(x, w3, padding="valid", groups=4))  # depthwise, multiplier 2
        d = F.conv3d(x, w4, stride=(1, 2, 2))  # 1x1x1
        e = F.conv_transpose3d(x, w5, b1, stride=(2, 1, 2), padding=1, output_padding=(1, 0, 0), groups=2,
                               dilation=(1, 2, 1))
        f = F.conv_transpose3d(x, w6)
        return a, b, c, d, e, f


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    shapes = [(2, 4, 5, 7, 6), (6, 4, 3, 2, 3), (6,), (6, 2, 2, 3, 4), (8, 1, 3, 3, 3), (5, 4, 1, 1, 1),
              (4, 3, 2, 3, 3), (4, 2, 3, 2, 2)]
    return tuple(torch.randn(*s, generator=g, dtype=dtype) for s in shapes)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    inputs = _inputs()
    module = Functional().eval()
    with torch.no_grad():
        want = module(*inputs)
    return export_module(module, inputs, tmp_path_factory.mktemp("functional3d")), inputs, want


@pytest.mark.parametrize("path", ["im2col", "per-tap"])
def test_functional_3d_convolutions_match_torch(backend, exported, path, monkeypatch):
    param, inputs, want = exported
    if path == "per-tap":
        monkeypatch.setattr(volumetric, "IM2COL_LIMIT", 0)
    g = kuiper_xp.load(param, backend=backend)
    got = g(*[t2n(i) for i in inputs])
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        assert_close(a, t2n(e), rtol=1e-5, what=f"{path} output {k}")


def test_pnnx_spells_the_functional_ops_as_documented(exported):
    text = exported[0].read_text()
    for s in ("F.conv3d", "F.conv_transpose3d", "padding=same", "padding=valid", "padding=(1,0,2)",
              "output_padding=(1,0,0)", "$weight=", "$bias=", "bias=None", "dilation=(1,2,1)"):
        assert s in text, f"pnnx no longer writes {s!r}"
    assert "nn.Conv3d" not in text and "nn.ConvTranspose3d" not in text


def test_relu_is_folded_into_the_functional_conv(exported):
    g = kuiper_xp.load(exported[0])
    convs = {r.name for r in g.operators if r.type == "F.conv3d"}
    assert any(p in convs for p, _ in g.fused), g.fused


def test_unbatched_input(backend, exported):
    """(C, D, H, W) gives what the same sample as a batch of one gives (torch's unbatched form)."""
    param, inputs, _ = exported
    g = kuiper_xp.load(param, backend=backend)
    x, w1, b1 = inputs[:3]
    for t, args in (("F.conv3d", (w1, b1)), ("F.conv_transpose3d", (inputs[7],))):
        layer = next(r.layer for r in g.execution_order if r.type == t and len(r.op.inputs) == 1 + len(args))
        weights = [backend.asarray(t2n(a)) for a in args]
        one = layer(backend.asarray(t2n(x[0])), *weights)
        with torch.no_grad():
            ref = (F.conv3d(x[0], w1, b1, stride=2, padding=(1, 0, 2), dilation=(1, 2, 1)) if t == "F.conv3d"
                   else F.conv_transpose3d(x[:1], inputs[7])[0])
        assert_close(one, t2n(ref), rtol=1e-5, what=t)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_weights_as_attributes(backend, tmp_path, dtype):
    """Hand-written files may carry @weight/@bias: packed at build, any float dtype."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 4, 5, 7)).astype(dtype)
    w = rng.standard_normal((4, 3, 3, 1, 2)).astype(dtype)
    wt = rng.standard_normal((6, 2, 2, 2, 3)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    bt = rng.standard_normal(6).astype(dtype)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    with torch.no_grad():
        want = F.conv3d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), 1, "same", (1, 2, 1), 2)
        want_t = F.conv_transpose3d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(bt), 2, (1, 0, 1),
                                    0, 3)
    g = op_graph(tmp_path / "c", "F.conv3d", {"dilation": (1, 2, 1), "groups": 2, "padding": "same",
                                              "stride": (1, 1, 1)},
                 [x], [t2n(want)], {"weight": w, "bias": b}, ["input"], backend)
    assert_close(g(x)[0], t2n(want), rtol=rtol, what="F.conv3d")
    g = op_graph(tmp_path / "t", "F.conv_transpose3d", {"groups": 3, "padding": (1, 0, 1), "stride": 2},
                 [x], [t2n(want_t)], {"weight": wt, "bias": bt}, ["input"], backend)
    assert_close(g(x)[0], t2n(want_t), rtol=rtol, what="F.conv_transpose3d")


def _conv(backend, params="stride=(1,1,1) padding=(0,0,0)", kind="F.conv3d", bias=False):
    ins = "0 1 2" if bias else "0 1"
    keys = "$input=0 $weight=1" + (" $bias=2" if bias else "")
    return make_layer(backend, f"{kind} op {2 + bias} 1 {ins} 9 {params} {keys}", n_in=2 + bias)


def test_wrong_channel_count_names_the_operator(backend):
    layer = _conv(backend, "groups=2 padding=(1,1,1)")
    x = backend.asarray(np.zeros((1, 3, 4, 4, 4), np.float32))
    w = backend.asarray(np.zeros((4, 2, 3, 3, 3), np.float32))
    with pytest.raises(ShapeError, match=r"F\.conv3d 'op'.*input has 3 channels.*groups=2 expects 4"):
        layer(x, w)
    t = _conv(backend, kind="F.conv_transpose3d")
    with pytest.raises(ShapeError, match=r"F\.conv_transpose3d 'op'.*input has 3 channels.*expects 4"):
        t(x, backend.asarray(np.zeros((4, 2, 2, 2, 2), np.float32)))


def test_bad_operands_raise_shape_errors(backend):
    layer = _conv(backend, "groups=2", bias=True)
    x = backend.asarray(np.zeros((1, 4, 4, 4, 4), np.float32))
    w = backend.asarray(np.zeros((4, 2, 3, 3, 3), np.float32))
    b = backend.asarray(np.zeros(4, np.float32))
    with pytest.raises(ShapeError, match=r"F\.conv3d 'op'.*expects a 5-D input"):
        layer(backend.asarray(np.zeros((4, 4, 4), np.float32)), w, b)
    with pytest.raises(ShapeError, match=r"weight has shape \(4, 2, 3, 3\), expected 5 dimensions"):
        layer(x, backend.asarray(np.zeros((4, 2, 3, 3), np.float32)), b)
    with pytest.raises(ShapeError, match=r"5 output channels, not divisible by groups=2"):
        layer(x, backend.asarray(np.zeros((5, 2, 3, 3, 3), np.float32)), b)
    with pytest.raises(ShapeError, match=r"bias has shape \(3,\), expected \(4,\)"):
        layer(x, w, backend.asarray(np.zeros(3, np.float32)))
    with pytest.raises(ShapeError, match=r"F\.conv3d 'op'.*output would be empty"):
        layer(backend.asarray(np.zeros((1, 4, 2, 4, 4), np.float32)), w, b)


@pytest.mark.parametrize("kind,params,needle", [
    ("F.conv3d", "stride=(2,2,2) padding=same", r"'same' needs stride 1"),
    ("F.conv3d", "padding=full", r"padding='full' is not supported"),
    ("F.conv3d", "padding=(1,1)", r"should be 1, 3 or 6 integers"),
    ("F.conv3d", "padding=(0,0,0) padding_mode=reflect", r"padding_mode='reflect' is not supported"),
    ("F.conv3d", "groups=0", r"must be positive"),
    ("F.conv_transpose3d", "stride=(2,2,2) output_padding=(2,0,0)", r"output_padding=\(2, 0, 0\) must be smaller"),
    ("F.conv_transpose3d", "padding=same", r"not supported by transposed convolutions"),
])
def test_bad_parameters_fail_at_build(backend, kind, params, needle):
    with pytest.raises(LayerParameterError, match=rf"{kind} 'op'.*{needle}"):
        _conv(backend, params, kind)


def test_missing_weight_names_the_operator(backend):
    with pytest.raises(LayerParameterError, match=r"F\.conv3d 'op'.*weight 'weight' is missing"):
        make_layer(backend, "F.conv3d op 1 1 0 9 padding=(0,0,0) $input=0")
