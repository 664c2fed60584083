"""Whole reference models (tests/zoo, random weights) exported by pnnx, run through
kuiper_xp.load on every backend leg and compared with torch:
max |difference| <= RTOL x max |torch output|, for every output."""

import pytest
from conftest import assert_close
from zoo import get_spec, list_specs
from zoo.export import export, reference

import kuiper_xp

RTOL = 1e-5  # tighter than the 1e-4 the issue asks for; the measured errors are ~1e-6

CLASSIFIERS = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x1_0",
               "squeezenet1_1", "efficientnet_b0"]
DETECTION = ["yolov5n", "yolov8n", "unet"]
TRANSFORMERS = ["vit_tiny", "tiny_decoder"]
SMALL = ["relu_sigmoid_chain", "residual_branches", "two_input_expr", "two_outputs", "tiny_cnn"]
ALL = SMALL + CLASSIFIERS + DETECTION + TRANSFORMERS


def test_the_zoo_covers_every_tested_model():
    names = {s.name for s in list_specs()}
    assert set(ALL) <= names


def _run(name, backend, dynamic):
    spec = get_spec(name)
    batch = spec.dynamic_batch if dynamic else 1
    param = export(name, dynamic=dynamic)
    inputs, expected = reference(name, batch)
    g = kuiper_xp.load(param, backend=backend)
    got = g(*inputs)
    assert len(got) == len(expected), f"{name}: {len(got)} outputs, torch has {len(expected)}"
    for k, (a, e) in enumerate(zip(got, expected)):
        assert_close(a, e, rtol=RTOL, what=f"{name} batch {batch} output {k}")
    return g


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
