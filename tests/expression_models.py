"""Torch modules whose pnnx exports consist of pnnx.Expression operators only (plus inputs and
outputs); used by tests/test_expression_models.py and benchmarks/bench_expression.py."""

from __future__ import annotations

import torch


class FloatExpressions(torch.nn.Module):
    """Elementwise arithmetic on two float32 tensors of shapes (2,3,4,5) and (3,1,5)."""

    def forward(self, x, y):
        return (
            x + y,                                  # residual add, broadcast
            torch.sqrt((2 * x.abs() + y.abs()) / 12),
            x * 0.5 + 1,
            x // 3,
            x % -2,
            torch.floor_divide(x, y),
            -x,
            1 / x,
            1 - x,
            torch.pow(3, x) + x ** 2 - x ** 3,
            torch.atan2(x, y) * torch.maximum(x, y) - torch.minimum(x, y),
            torch.fmod(x, y) + torch.remainder(x, y),
            torch.round(x * 3) + torch.trunc(x) + torch.ceil(x) - torch.floor(x) + torch.sign(x),
            torch.exp(x) - torch.log(x.abs() + 1) * torch.sin(x) / torch.cos(y),
            torch.erf(x) * torch.sinh(y) + torch.rsqrt(x * x + 1) + torch.reciprocal(y + 10),
            torch.square(x) - torch.abs(y) + torch.log10(y * y + 2) * torch.atan(x),
        )


class IntExpressions(torch.nn.Module):
    """Integer arithmetic: int64 tensors of shape (2,3); ``d`` is non-zero."""

    def forward(self, a, d):
        return (
            (a & d) | (a ^ 3),
            a << 2,
            a >> 1,
            a // d,
            a % d,
            a / d,                                  # true division: float32
            a * 2.5,                                # float literal: float32
            torch.fmod(a, d),
            torch.remainder(a, -3),
            a * 3 - d,
            -a + torch.abs(d),
        )


class SizeExpressions(torch.nn.Module):
    """Shape arithmetic; exported with a second input set so the sizes stay dynamic."""

    def forward(self, x, y):
        return (
            y / x.size(0),
            y * (x.size(2) // 2),
            y * (x.size(0) ** 0.5),
            y + torch.tensor(x.size(0)).to(torch.float32).sqrt(),
            x * x.size(1) + y,
        )


class DynamicReshape(torch.nn.Module):
    """``x.view(x.size(0), -1, x.size(2))``: pnnx writes the target shape as a list expression."""

    def forward(self, x):
        return x.view(x.size(0), -1, x.size(2)) * 2
