"""Layers, one module per family, all registered with :data:`registry`.

Importing this package registers every built-in layer.
"""

from . import (  # noqa: F401  (imported for their @register side effects)
    activation,
    arrays,
    attention,
    conv,
    conv3d,
    core,
    distance,
    expression,
    indexing,
    linalg,
    linear,
    losses,
    mathops,
    misc,
    norm,
    patches,
    pooling,
    recurrent,
    reduce,
    resize,
    scatter,
    shape,
    spectral,
    volumetric,
)
from .base import BuildContext, Layer
from .registry import LayerRegistry, RegistryError, create_layer, register, registry

__all__ = ["BuildContext", "Layer", "LayerRegistry", "RegistryError", "create_layer", "register", "registry"]
