"""Reading pnnx models: the ``.pnnx.param`` text, the ``.pnnx.bin`` archive, and the IR."""

from .binfile import BinReader
from .ir import DTYPES, Model, Operand, Operator, WeightRef
from .param import parse_param, parse_param_text, parse_value

__all__ = [
    "BinReader",
    "DTYPES",
    "Model",
    "Operand",
    "Operator",
    "WeightRef",
    "load_model",
    "parse_param",
    "parse_param_text",
    "parse_value",
]


def load_model(param_path, bin_path=None) -> Model:
    """Parse ``param_path`` and attach the ``.bin`` beside it (or ``bin_path``) lazily."""
    from pathlib import Path

    param_path = Path(param_path)
    model = parse_param(param_path)
    if bin_path is None:
        name = param_path.name
        bin_name = name[: -len(".param")] + ".bin" if name.endswith(".param") else name + ".bin"
        bin_path = param_path.with_name(bin_name)
    model.attach_bin(Path(bin_path))
    return model
