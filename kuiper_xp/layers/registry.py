"""The layer registry (seed 004): pnnx type name -> layer class, filled by ``@register``."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from kuiper_xp.errors import KuiperXPError, LayerParameterError, UnsupportedOperatorError

from .base import BuildContext, Layer

if TYPE_CHECKING:  # pragma: no cover
    from kuiper_xp.pnnx.ir import Operator



def _one_swap(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with two adjacent characters swapped."""
    if len(a) != len(b) or a == b:
        return False
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]

class RegistryError(KuiperXPError, ValueError):
    """Registering a type name twice, or registering something that is not a layer."""


class LayerRegistry:
    """Maps pnnx operator type names (``nn.ReLU``, ``F.relu``) to layer classes."""

    def __init__(self) -> None:
        self._creators: dict[str, type[Layer]] = {}

    def register(self, *type_names: str) -> Callable[[type[Layer]], type[Layer]]:
        """Class decorator: ``@registry.register("nn.ReLU", "F.relu")``."""
        if not type_names or not all(isinstance(t, str) and t for t in type_names):
            raise RegistryError(f"register() needs one or more pnnx type names, got {type_names!r}")

        def deco(cls: type[Layer]) -> type[Layer]:
            if not (isinstance(cls, type) and issubclass(cls, Layer)):
                raise RegistryError(f"{cls!r} is not a Layer subclass")
            for name in type_names:
                self.add(name, cls)
            cls.type_names = tuple(cls.type_names) + tuple(type_names)
            return cls

        return deco

    def add(self, type_name: str, cls: type[Layer]) -> None:
        if type_name in self._creators:
            raise RegistryError(
                f"operator type {type_name!r} is already registered to {self._creators[type_name].__name__}"
            )
        self._creators[type_name] = cls

    def __contains__(self, type_name: str) -> bool:
        return type_name in self._creators

    def __len__(self) -> int:
        return len(self._creators)

    def get(self, type_name: str) -> type[Layer] | None:
        return self._creators.get(type_name)

    def types(self) -> list[str]:
        return sorted(self._creators)

    def items(self) -> list[tuple[str, type[Layer]]]:
        return sorted(self._creators.items())

    def unsupported(self, ops: Iterable[Operator]) -> list[Operator]:
        return [op for op in ops if op.type not in self._creators]

    def near(self, type_name: str, n: int = 3) -> list[str]:
        """Registered types spelled like ``type_name`` (a typo, or another prefix of the same
        name: ``torch.mT`` -> ``aten::mT``), best first."""
        base = type_name.rsplit(".", 1)[-1].rsplit("::", 1)[-1]
        same = [t for t in self._creators if t.rsplit(".", 1)[-1].rsplit("::", 1)[-1] == base]
        if same:
            return sorted(same)[:n]
        keys: dict[str, str] = {}
        for t in self._creators:
            keys.setdefault(t.lower().replace("_", ""), t)
        q = type_name.lower().replace("_", "")
        swapped = [t for k, t in keys.items() if _one_swap(q, k)]  # (difflib rates F.rleu far from F.relu)
        close = difflib.get_close_matches(q, list(keys), n=n, cutoff=0.85)
        return (swapped + [keys[k] for k in close if keys[k] not in swapped])[:n]

    def missing_message(self, types: Iterable[str]) -> str:
        """The closing lines of an unsupported-operator error: near spellings, and where the
        supported types are listed."""
        types = list(types)
        hints = [f"  {t}: did you mean {', '.join(near)}?" for t in types if (near := self.near(t))]
        bare = sorted({"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"} & set(types))
        if bare:
            hints.append(f"  {', '.join(bare)}: pnnx writes an nn.LSTM / nn.GRU / nn.RNN exported on its own "
                         "(the top-level module) this way; wrap it in a parent nn.Module and export that (it "
                         "then comes out as nn.LSTM / nn.GRU / nn.RNN, which kuiper-xp runs)")
        rand = sorted(t for t in types if t.rsplit(".", 1)[-1].removeprefix("aten::") in _RANDOM)
        if rand:
            hints.append(f"  {', '.join(rand)}: random sampling inside the model; kuiper-xp computes deterministic "
                         "inference: make the noise an input of the model (forward(x, eps) with eps = "
                         "torch.randn_like(...) drawn outside) and export that")
        if {"prim::If", "prim::Loop"} & set(types):
            hints.append("  prim::If / prim::Loop: control flow of a torch.jit.script model; kuiper-xp runs "
                         "traced graphs: export the module itself with pnnx.export (it traces it; branches "
                         "and loop counts are then fixed by the example inputs)")
        return ("\n".join(hints) + "\n" if hints else "") + (
            f"{len(self._creators)} types are supported (docs/operators.md, "
            "kuiper_xp.layers.registry.types())")

    def create(self, op: Operator, ctx: BuildContext) -> Layer:
        """A layer for ``op``; :class:`UnsupportedOperatorError` (with near spellings) where no
        layer is registered for its type."""
        cls = self._creators.get(op.type)
        if cls is None:
            raise UnsupportedOperatorError(
                f"{op.where}: unsupported operator type {op.type!r}\n" + self.missing_message([op.type]))
        try:
            layer = cls.from_operator(op, ctx)
        except KuiperXPError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, ArithmeticError, AttributeError) as exc:
            raise LayerParameterError(f"{op.where}: cannot build the layer: {type(exc).__name__}: {exc}") from exc
        layer.op_type = op.type
        layer.op_name = op.name
        return layer


#: the names (after ``torch.``, ``Tensor.`` or ``aten::``) of torch's random sampling operators
_RANDOM = frozenset({"randn", "randn_like", "rand", "rand_like", "randint", "randint_like", "randperm", "normal",
                     "normal_", "uniform_", "bernoulli", "bernoulli_", "multinomial", "poisson", "exponential_"})

#: The global registry every built-in layer registers with.
registry = LayerRegistry()
register = registry.register


def create_layer(op: Operator, ctx: BuildContext) -> Layer:
    """Create the layer for ``op`` from the global registry."""
    return registry.create(op, ctx)
