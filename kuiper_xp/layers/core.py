"""Graph plumbing operators: inputs, outputs, constants."""

from __future__ import annotations

from typing import Any

from kuiper_xp.errors import LayerParameterError

from .base import BuildContext, Layer
from .registry import register


@register("pnnx.Input", "pnnx.Output")
class GraphPort(Layer):
    """Marks graph inputs and outputs; the runtime handles them and never calls forward."""

    def forward(self, *inputs: Any) -> Any:  # pragma: no cover - never scheduled
        raise RuntimeError("pnnx.Input / pnnx.Output are not executed")


@register("pnnx.Attribute")
class Attribute(Layer):
    """A constant tensor stored in the .bin (``@data``), e.g. anchor grids, class tokens."""

    def __init__(self, ctx: BuildContext, value: Any):
        super().__init__(ctx)
        self.value = value

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.attrs) != 1:
            raise LayerParameterError(f"{op.where}: pnnx.Attribute holds one weight, found {sorted(op.attrs)}")
        (ref,) = op.attrs.values()
        return cls(ctx, ctx.weight(ref))

    def forward(self) -> Any:
        return self.value
