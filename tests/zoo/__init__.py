"""Reference-model zoo: plain-torch re-implementations of well-known architectures.

Every model is described by a :class:`ModelSpec`; the modules ``small``, ``classifiers``,
``transformers`` and ``detection`` each hold a ``MODELS`` dict of them. Weights are random but
seeded, BatchNorm/LayerNorm statistics and affine parameters are randomised too (so that a wrong
fold or a swapped weight/bias shows), and inputs are seeded as well: two calls give the same
tensors bit for bit. Deep nets whose output would otherwise not depend on the input (the signal
shrinks through default-initialised layers) get BatchNorm statistics measured on a seeded batch
(:func:`calibrate_norms`) or He-initialised convolutions (:func:`kaiming_convs`);
``tests/test_models.py`` checks that every zoo model's output moves with its input.

    from tests.zoo import get_spec, list_specs
    spec = get_spec("resnet18")
    model = spec.build()            # nn.Module in eval mode
    inputs = spec.inputs(1)         # tuple of torch tensors, batch 1

Exporting with pnnx (cached) lives in :mod:`tests.zoo.export`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["ModelSpec", "get_spec", "list_specs", "ZOO_MODULES", "seeded_randn", "randomize_norms"]

#: zoo modules that hold a ``MODELS`` dict, in listing order
ZOO_MODULES = ("small", "classifiers", "transformers", "detection")

#: base seed for weights; each model adds nothing to it (build() seeds torch globally)
WEIGHT_SEED = 0
#: base seed for inputs; the batch size is mixed in so that batches differ
INPUT_SEED = 1234


@dataclass(frozen=True)
class ModelSpec:
    """How to build and feed one zoo model.

    name:          registry key, also the file stem of the export (``<name>.pnnx.param``)
    build:         ``() -> nn.Module`` in eval mode with seeded weights (deterministic)
    inputs:        ``(batch: int) -> tuple[torch.Tensor, ...]`` seeded example inputs
    dynamic_batch: batch size of the second input set for a dynamic export (``inputs2``);
                   None means the model is only exported with static shapes
    description:   one line, what this is
    slow:          True for the big ones (ViT-B/32, detectors, UNet): tests may mark them slow
    outputs:       names of the outputs, in order (documentation only)
    """

    name: str
    build: Callable[[], "object"]
    inputs: Callable[[int], tuple]
    dynamic_batch: int | None = 4
    description: str = ""
    slow: bool = False
    outputs: tuple[str, ...] = ("out",)
    tags: tuple[str, ...] = field(default_factory=tuple)


def _registry() -> dict[str, ModelSpec]:
    specs: dict[str, ModelSpec] = {}
    for mod_name in ZOO_MODULES:
        mod = importlib.import_module(f"{__name__}.{mod_name}")
        for name, spec in mod.MODELS.items():
            if name in specs:
                raise ValueError(f"zoo model {name!r} is defined twice ({mod_name})")
            if name != spec.name:
                raise ValueError(f"zoo key {name!r} != spec.name {spec.name!r}")
            specs[name] = spec
    return specs


_SPECS: dict[str, ModelSpec] | None = None


def list_specs() -> list[ModelSpec]:
    """All zoo models, small ones first."""
    global _SPECS
    if _SPECS is None:
        _SPECS = _registry()
    return list(_SPECS.values())


def get_spec(name: str | ModelSpec) -> ModelSpec:
    """The spec named ``name`` (a ModelSpec passes through)."""
    if isinstance(name, ModelSpec):
        return name
    specs = {s.name: s for s in list_specs()}
    try:
        return specs[name]
    except KeyError:
        raise KeyError(f"no zoo model {name!r}; known: {', '.join(specs)}") from None


# ---------------------------------------------------------------------------------------------
# helpers shared by the zoo modules


def seeded_randn(*shape: int, seed: int, scale: float = 1.0):
    """A reproducible N(0, scale^2) float32 tensor that does not touch the global RNG."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32) * scale


def image_inputs(c: int, h: int, w: int, seed_offset: int = 0):
    """``inputs(batch)`` for a single NCHW image input."""

    def inputs(batch: int):
        return (seeded_randn(batch, c, h, w, seed=INPUT_SEED + 1000 * seed_offset + batch),)

    return inputs


def randomize_norms(model, seed: int = 1):
    """Give every BatchNorm/LayerNorm/RMSNorm non-trivial statistics and affine parameters.

    A freshly built model has BN mean 0, var 1, weight 1, bias 0: a runtime that ignores or
    swaps them would still pass. The ranges keep activations in a sane range for deep nets.
    """
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)

    def u(shape, lo, hi):
        return torch.rand(shape, generator=g) * (hi - lo) + lo

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(u(n, 0.5, 1.5))
                if m.affine:
                    m.weight.copy_(u(n, 0.5, 1.5))
                    m.bias.copy_(torch.randn(n, generator=g) * 0.1)
            elif isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(u(m.weight.shape, 0.5, 1.5))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model


def finalize(model, seed: int = 1):
    """randomize_norms + eval(); what every build() returns."""
    randomize_norms(model, seed)
    return model.eval()


#: seed of the random batch whose statistics calibrate_norms gives the BatchNorms
CALIBRATION_SEED = 4321


def calibrate_norms(model, input_shape: tuple[int, ...], batch: int = 2):
    """Set every BatchNorm's running mean and variance to the statistics of the activations it
    sees on one seeded N(0, 1) batch (train-mode forward, cumulative averages; the affine
    parameters stay as randomize_norms made them), then eval(). Deep nets of default-initialised
    layers with unit statistics shrink the signal layer by layer until the output is the last
    bias: MobileNetV2's logits moved by 4e-7 of their size when the input was shifted by a pixel,
    so a comparison with torch could not have caught a wrong layer. Calibrated, they move by 0.35."""
    import torch
    from torch import nn

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative: the batch's own statistics
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    model.train()
    with torch.no_grad():
        model(torch.randn((batch,) + tuple(input_shape), generator=g))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def kaiming_convs(model):
    """He-normal (fan in, ReLU gain) weights and zero biases for every Conv2d: a net without
    normalisation (SqueezeNet) keeps its signal instead of shrinking it by ~sqrt(3) a layer."""
    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


def builder(cls, *args, calibrate: tuple[int, ...] | None = None, kaiming: bool = False, **kwargs):
    """``build`` callable: seed the global RNG, construct ``cls(*args, **kwargs)``, finalize;
    ``kaiming``: :func:`kaiming_convs` first; ``calibrate`` (an input shape without the batch
    axis): :func:`calibrate_norms` after (for nets whose output would otherwise ignore the input)."""

    def build():
        import torch

        torch.manual_seed(WEIGHT_SEED)
        model = cls(*args, **kwargs)
        if kaiming:
            kaiming_convs(model)
        model = finalize(model)
        return model if calibrate is None else calibrate_norms(model, calibrate)

    build.__qualname__ = f"build[{getattr(cls, '__name__', cls)}]"
    return build
