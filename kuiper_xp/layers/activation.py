"""Activation layers."""

from __future__ import annotations

from typing import Any

from .base import Layer
from .registry import register


@register("nn.ReLU", "F.relu")
class ReLU(Layer):
    """y = max(x, 0) (seed 004)."""

    def forward(self, x: Any) -> Any:
        # where(x < 0, 0, x) keeps NaN as NaN, as torch does
        return self.xp.where(x < 0, self.xp.zeros((), dtype=x.dtype, device=self.device), x)


@register("nn.Sigmoid", "F.sigmoid", "torch.sigmoid")
class Sigmoid(Layer):
    """y = 1 / (1 + exp(-x)) (the seed course's homework)."""

    def forward(self, x: Any) -> Any:
        xp = self.xp
        return 1.0 / (1.0 + xp.exp(-x))
