"""The layer registry of seed 004."""

from pathlib import Path

import numpy as np
import pytest
import torch

from kuiper_xp.errors import LayerParameterError, UnsupportedOperatorError
from kuiper_xp.layers import (
    BuildContext,
    Layer,
    LayerRegistry,
    RegistryError,
    create_layer,
    registry,
)
from kuiper_xp.pnnx.param import parse_param_text


def _op(text_line: str, extra_lines=()):
    lines = ["7767517", f"{2 + len(extra_lines)} 2", "pnnx.Input in0 0 1 0", text_line, *extra_lines]
    # the tested op reads operand 0 and writes 1; an Output closes the graph
    lines.append("pnnx.Output out0 1 0 1")
    lines[1] = f"{len(lines) - 2} 2"
    return parse_param_text("\n".join(lines)).operators[1]


def test_one_global_registry():
    # seed test registry1/registry2: every access sees the same registry
    from kuiper_xp.layers import registry as r1
    from kuiper_xp.layers.registry import registry as r2

    assert r1 is r2


def test_register_and_create_on_a_fresh_registry(backend):
    reg = LayerRegistry()
    assert len(reg) == 0

    @reg.register("test_type", "test_type_alias")
    class MyLayer(Layer):
        pass

    assert len(reg) == 2 and "test_type" in reg
    op = _op("test_type t0 1 1 0 1")
    layer = reg.create(op, BuildContext(backend))
    assert isinstance(layer, MyLayer) and layer.op_name == "t0" and layer.op_type == "test_type"
    assert MyLayer.type_names == ("test_type", "test_type_alias")


def test_duplicate_registration_is_an_error():
    reg = LayerRegistry()
    reg.register("x.Op")(type("A", (Layer,), {}))
    with pytest.raises(RegistryError, match="already registered to A"):
        reg.register("x.Op")(type("B", (Layer,), {}))
    with pytest.raises(RegistryError):
        reg.register()(type("C", (Layer,), {}))
    with pytest.raises(RegistryError, match="not a Layer"):
        reg.register("y.Op")(int)


def test_unknown_type_lists_supported(backend):
    op = _op("nn.Frobnicate f0 1 1 0 1")
    with pytest.raises(UnsupportedOperatorError) as ei:
        create_layer(op, BuildContext(backend))
    msg = str(ei.value)
    assert "nn.Frobnicate" in msg and "'f0'" in msg and ":4" in msg
    assert f"{len(registry)} types are supported (docs/operators.md" in msg
    assert isinstance(ei.value, NotImplementedError)


def test_seed_layers_are_registered_under_pnnx_names():
    for name in ("nn.ReLU", "F.relu", "nn.Sigmoid", "F.sigmoid", "pnnx.Input", "pnnx.Output", "pnnx.Attribute"):
        assert name in registry, name


@pytest.mark.parametrize("type_name,fn", [("nn.ReLU", torch.relu), ("F.relu", torch.relu),
                                          ("nn.Sigmoid", torch.sigmoid), ("F.sigmoid", torch.sigmoid)])
def test_relu_and_sigmoid_forward_match_torch(backend, type_name, fn):
    from conftest import assert_close

    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32) * 4
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    layer = create_layer(_op(f"{type_name} a 1 1 0 1"), BuildContext(backend))
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        got = layer(backend.asarray(x))
    assert_close(got, fn(torch.from_numpy(x)).numpy(), rtol=1e-6, what=type_name)


def test_typed_parameter_accessor_names_op_key_and_value():
    op = _op("nn.Foo foo 1 1 0 1 eps=1e-05 k=(3,3) mode=reflect flag=True n=4 none=None")
    assert op.param("eps", float) == 1e-05
    assert op.param("n", float) == 4.0
    assert op.ints("k", 2) == (3, 3)
    assert op.ints("n", 2) == (4, 4)
    assert op.param("mode", str) == "reflect"
    assert op.param("flag", bool) is True
    assert op.param("none", int) is None
    assert op.param("missing", int, default=7) == 7
    with pytest.raises(LayerParameterError, match=r"nn.Foo 'foo'.*'mode' should be int, found 'reflect'"):
        op.param("mode", int)
    with pytest.raises(LayerParameterError, match="'missing' is missing"):
        op.param("missing", int)
    with pytest.raises(LayerParameterError, match="3 values"):
        op.ints("k", 3)


def test_readme_example_registers_a_missing_operator(tmp_path):
    """The README's "An operator kuiper-xp lacks": a model with torch.special.spherical_bessel_j0
    is refused until a layer is registered for its pnnx type; then it matches torch (the class is
    the README's)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import export_module

    import kuiper_xp
    from kuiper_xp.layers.base import Layer
    from kuiper_xp.layers.registry import register, registry

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.special.spherical_bessel_j0(x) * 0.5

    x = torch.cat([torch.linspace(-12.0, 12.0, 95), torch.zeros(1)]).reshape(2, 48)
    param = export_module(Model(), (x,), tmp_path)
    with pytest.raises(UnsupportedOperatorError, match="aten::special_spherical_bessel_j0"):
        kuiper_xp.load(param, backend="numpy")
    assert "aten::special_spherical_bessel_j0" not in registry
    try:
        @register("aten::special_spherical_bessel_j0")
        class SphericalBesselJ0(Layer):
            """j0(x) = sin(x) / x, and 1 at 0."""

            @classmethod
            def from_operator(cls, op, ctx):   # op.param("name", type), op.inputs, op.weight(...) as needed
                return cls(ctx)

            def forward(self, x):              # one array per operator input
                xp = self.xp
                zero = x == 0
                safe = xp.where(zero, xp.ones_like(x), x)
                return xp.where(zero, xp.ones_like(x), xp.sin(safe) / safe)

        for leg in ("numpy", "array_api_strict"):
            g = kuiper_xp.load(param, backend=leg)
            got = kuiper_xp.to_numpy(g(x.numpy())[0])
            want = (torch.special.spherical_bessel_j0(x) * 0.5).numpy()
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    finally:
        registry._creators.pop("aten::special_spherical_bessel_j0", None)
