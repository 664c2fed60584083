"""Tiny nets for the first end-to-end tests: a few ops each, exported in well under a second."""

from __future__ import annotations

import torch
from torch import nn

from . import INPUT_SEED, ModelSpec, builder, image_inputs, seeded_randn


class ReluSigmoidChain(nn.Module):
    """x -> relu -> sigmoid -> relu -> sigmoid (elementwise only, one input, one output)."""

    def __init__(self):
        super().__init__()
        self.relu1 = nn.ReLU()
        self.sig1 = nn.Sigmoid()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        x = self.relu1(x)
        x = self.sig1(x)
        x = self.relu2(x)
        return torch.sigmoid(x)


class ResidualBranches(nn.Module):
    """Branches that fan out and merge: a conv, then x + relu(x), sigmoid(x) * x, x * 0.5 ..."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        x = self.conv(x)
        a = x + torch.relu(x)  # residual add of a branch
        b = torch.sigmoid(x) * x  # pnnx folds this into F.silu
        c = torch.sigmoid(a) * b  # a real binary mul of two branches
        y = self.conv2(a + c) + b * 0.5
        return y - x


class TwoInputExpr(nn.Module):
    """Two inputs, one arithmetic expression: torch.sqrt((2 * x + y) / 12)."""

    def forward(self, x, y):
        return torch.sqrt((2 * x + y) / 12)


class TwoOutputs(nn.Module):
    """One input, a shared conv, two outputs (relu branch, sigmoid branch)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.conv_b = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        x = self.conv(x)
        return torch.relu(x), torch.sigmoid(self.conv_b(x))


class TinyCNN(nn.Module):
    """conv-bn-relu, maxpool, conv-bn-relu, global avgpool, flatten, linear: a 10-class toy."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.fc(torch.flatten(x, 1))


def _positive_pair(batch: int):
    # 2x + y must stay >= 0 for sqrt: draw both from U(0, 1)
    g = torch.Generator().manual_seed(INPUT_SEED + 7 + batch)
    x = torch.rand(batch, 3, 8, 8, generator=g)
    y = torch.rand(batch, 3, 8, 8, generator=g)
    return (x, y)


MODELS = {
    s.name: s
    for s in [
        ModelSpec(
            "relu_sigmoid_chain",
            builder(ReluSigmoidChain),
            lambda b: (seeded_randn(b, 4, 16, 16, seed=INPUT_SEED + b),),
            description="nn.ReLU -> nn.Sigmoid -> nn.ReLU -> torch.sigmoid",
            tags=("small",),
        ),
        ModelSpec(
            "residual_branches",
            builder(ResidualBranches),
            image_inputs(3, 16, 16),
            description="conv, fan-out, x+relu(x), sigmoid(x)*x, binary add/mul/sub of branches",
            tags=("small",),
        ),
        ModelSpec(
            "two_input_expr",
            builder(TwoInputExpr),
            _positive_pair,
            description="torch.sqrt((2*x+y)/12) with two inputs: one pnnx.Expression",
            tags=("small",),
        ),
        ModelSpec(
            "two_outputs",
            builder(TwoOutputs),
            image_inputs(3, 16, 16),
            description="shared conv, two outputs (relu, conv+sigmoid)",
            outputs=("relu", "sigmoid"),
            tags=("small",),
        ),
        ModelSpec(
            "tiny_cnn",
            builder(TinyCNN),
            image_inputs(3, 32, 32),
            description="conv-bn-relu, maxpool, conv-bn-relu, adaptive avgpool, flatten, linear",
            tags=("small",),
        ),
    ]
}
