"""Whole reference models (tests/zoo, random weights) exported by pnnx, run through
kuiper_xp.load on every backend leg and compared with torch:
max |difference| <= RTOL x max |torch output|, for every output."""

import pytest
from conftest import assert_close
from zoo import get_spec, list_specs
from zoo.export import export, reference

import kuiper_xp

RTOL = 1e-5  # tighter than the 1e-4 the issue asks for; the measured errors are ~1e-6
#: the detectors are held to the issue's 1e-4: their decoded boxes ((2 sigmoid)^2 x anchors of up
#: to ~600 px) amplify float32 rounding, and torch's own float32 outputs lie up to 4.6e-5 (YOLOv5n)
#: and 1.3e-5 (YOLOv8n) of their size from its float64 ones; kuiper-xp's accuracy against that float64
#: result is tested below (test_as_close_to_float64_as_torch)
RTOL_BY_MODEL = {"yolov5n": 1e-4, "yolov8n": 1e-4}

CLASSIFIERS = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x1_0",
               "squeezenet1_1", "efficientnet_b0"]
DETECTION = ["yolov5n", "yolov8n", "unet"]
TRANSFORMERS = ["vit_tiny", "tiny_decoder"]
SMALL = ["relu_sigmoid_chain", "residual_branches", "two_input_expr", "two_outputs", "tiny_cnn"]
ALL = SMALL + CLASSIFIERS + DETECTION + TRANSFORMERS


def test_the_zoo_covers_every_tested_model():
    names = {s.name for s in list_specs()}
    assert set(ALL) <= names


#: each float output of a zoo model must move by at least this fraction of its size when the
#: input is shifted by one element (a hundred times RTOL: else the comparisons below could not
#: tell a wrong layer from a right one)
MIN_INPUT_EFFECT = 1e-3


@pytest.mark.parametrize("name", ALL)
def test_zoo_outputs_depend_on_their_input(name):
    """torch alone: with random weights a deep net can wash its input out until the output is
    its last bias (MobileNetV2's logits moved by 4e-7 of their size before calibrate_norms), and
    then a kuiper-xp result matching torch's proves little."""
    import numpy as np
    import torch

    spec = get_spec(name)
    model = spec.build()
    inputs = [x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x)) for x in spec.inputs(1)]
    shifted = [torch.roll(x, 1, -1) if x.dim() else x for x in inputs]
    with torch.no_grad():
        a, b = model(*inputs), model(*shifted)
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    moved = [float((x - y).abs().max() / x.abs().max()) for x, y in zip(a, b) if x.is_floating_point()]
    assert moved and min(moved) >= MIN_INPUT_EFFECT, f"{name}: outputs moved by {moved} of their size"


def _run(name, backend, dynamic):
    spec = get_spec(name)
    batch = spec.dynamic_batch if dynamic else 1
    param = export(name, dynamic=dynamic)
    inputs, expected = reference(name, batch)
    g = kuiper_xp.load(param, backend=backend)
    got = g(*inputs)
    assert len(got) == len(expected), f"{name}: {len(got)} outputs, torch has {len(expected)}"
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=RTOL_BY_MODEL.get(name, RTOL), what=f"{name} batch {batch} output {k}")
    return g


#: kuiper-xp's error against torch's float64 result may be at most this many times torch's own
#: float32 error (plus 1e-6 of the output's size); measured 0.9-2.0x on an AMD EPYC (Zen 3)
FLOAT64_ERROR_FACTOR = 4.0


@pytest.mark.parametrize("name", ["yolov5n", "yolov8n", "mobilenet_v2", "efficientnet_b0"])
def test_as_close_to_float64_as_torch(name):
    """The numpy backend against torch run in float64 on the same weights and input: as close to
    it as torch's float32 result is, within FLOAT64_ERROR_FACTOR, output by output."""
    import numpy as np
    import torch

    spec = get_spec(name)
    inputs, expected = reference(name, 1)
    with torch.no_grad():
        exact = spec.build().double()(*[torch.from_numpy(np.asarray(x)).double() for x in inputs])
    exact = [t.numpy() for t in (exact if isinstance(exact, (tuple, list)) else (exact,))]
    got = kuiper_xp.load(export(name), backend="numpy")(*inputs)
    for k, (a, e32, e64) in enumerate(zip(got, expected, exact)):
        scale = float(np.abs(e64).max())
        torch_err = float(np.abs(e32 - e64).max())
        ours = float(np.abs(np.asarray(a, np.float64) - e64).max())
        assert ours <= FLOAT64_ERROR_FACTOR * torch_err + 1e-6 * scale, (
            f"{name} output {k}: {ours / scale:.2e} of its size from float64, torch float32 {torch_err / scale:.2e}")


@pytest.mark.parametrize("name", ALL)
def test_static_export_matches_torch(name, model_backend):
    _run(name, model_backend, dynamic=False)


@pytest.mark.parametrize("name", ALL)
def test_dynamic_batch_export_matches_torch(name, model_backend):
    g = _run(name, model_backend, dynamic=True)
    assert g.inputs[0].shape[0] is None, "the dynamic export should leave the batch open"


@pytest.mark.parametrize("name", ["mobilenet_v2", "squeezenet1_1"])
def test_activation_fusion_changes_no_result(name, model_backend):
    param = export(name, dynamic=False)
    inputs, expected = reference(name, 1)
    fused = kuiper_xp.load(param, backend=model_backend)
    plain = kuiper_xp.load(param, backend=model_backend, fuse=False)
    assert fused.fused, "some convolution -> activation pairs should be folded"
    assert len(fused.execution_order) == len(plain.execution_order) - len(fused.fused)
    a = kuiper_xp.to_numpy(fused(*inputs)[0])
    b = kuiper_xp.to_numpy(plain(*inputs)[0])
    assert_close(a, expected[0], rtol=RTOL)
    assert_close(b, expected[0], rtol=RTOL)
