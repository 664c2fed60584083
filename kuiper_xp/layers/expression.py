"""pnnx.Expression: elementwise arithmetic, shape arithmetic and shape lists fused by pnnx
(seed 000 section 4: ExpressionLayer). The expression is parsed and compiled once at build;
``forward`` only runs the compiled program."""

from __future__ import annotations

import re
from typing import Any

from kuiper_xp.errors import ExpressionError, LayerParameterError
from kuiper_xp.expression import Program

from .base import BuildContext, FusesActivation, Layer
from .registry import register


def expression_text(value: Any) -> str:
    """The ``expr`` parameter as written in the file.

    The .param value parser reads a value starting with ``[`` as a list split at every comma, so
    ``[size(@0,0),15,size(@0,2)]`` arrives as ``['size(@0', '0)', 15, 'size(@0', '2)']``; joining
    the items with commas gives the text back (numbers may be respelled: ``5.000000e+00`` becomes
    ``5.0``, same value). An expression that is a bare literal (``expr=3``) arrives as a number."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_item(v) for v in value) + "]"
    if value is None or isinstance(value, (bool, int, float)):
        return _item(value)
    raise TypeError(f"expected a string, found {type(value).__name__} {value!r}")


def _item(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    raise TypeError(f"unexpected item {v!r} in a list expression")


#: a bare word that is no literal: a string argument of an aten:: op (``expr=linear``, ``expr=fro``)
_BARE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LITERAL_WORDS = frozenset({"inf", "nan", "True", "False", "None"})


class StringConstant(Layer):
    """A constant string argument (``interpolation='linear'``, ``ord='fro'``, ``reduce='amax'``)
    that pnnx writes as a bare-word expression feeding ``aten::`` operators; they get the string."""

    def __init__(self, ctx: BuildContext, text: str):
        super().__init__(ctx)
        self.text = text

    def forward(self, *inputs: Any) -> str:
        return self.text


def _string_argument(op, text: str) -> bool:
    """True where ``text`` is a bare word read only by ``aten::`` operators (their string
    arguments); anywhere else it stays an expression, and an unknown name is an error."""
    if op.inputs or not _BARE_WORD.fullmatch(text) or text in _LITERAL_WORDS:
        return False
    consumers = [c for o in op.outputs for c in o.consumers]
    return bool(consumers) and all(c.type.startswith("aten::") for c in consumers)


_INTEGER_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8"})
_DIV_CALL = re.compile(r"(?<![A-Za-z0-9_])div\(")
#: an operand read as a value, not only for its size (``size(@1,3)``)
_VALUE_OPERAND = re.compile(r"(?<!size\()@(\d+)")


def integer_floor_division(op: Any, text: str) -> str:
    """pnnx writes ``torch.div(a, b, rounding_mode="floor")`` as a plain ``div`` (README: pnnx
    pitfalls). On integer tensors the file still shows it: every input read as a value integer
    (an input read only through ``size(@k, d)`` does not count: a float feature map whose width
    divides an index when H and W are dynamic) and the output declared integer, which torch's
    true division (a float result) cannot give. There ``div`` is floor division (CenterNet's
    ``torch.div(index, w, rounding_mode="floor")``); anything else keeps ``div`` as it is."""
    if not op.inputs or not op.outputs or not _DIV_CALL.search(text):
        return text
    read = {int(k) for k in _VALUE_OPERAND.findall(text)}
    dtypes = [op.inputs[k].array_dtype for k in sorted(read) if k < len(op.inputs)]
    if (dtypes and op.outputs[0].array_dtype in _INTEGER_DTYPES
            and all(d in _INTEGER_DTYPES or d == "bool" for d in dtypes)):  # ((x > 0) // n: bool)
        return _DIV_CALL.sub("floor_divide(", text)
    return text


@register("pnnx.Expression")
class Expression(FusesActivation, Layer):
    """Evaluates ``expr`` (e.g. ``add(@0,mul(@1,2))``) on the op's inputs with torch's semantics.

    The result is an array, a Python number (pure shape arithmetic such as ``mul(size(@0,0),3)``)
    or a Python list (``[size(@0,0),-1,size(@0,2)]``, the ``shape`` input of a Tensor.reshape).
    A Python number whose output operand carries a ``#`` shape annotation is returned as a 0-d
    array of the annotated dtype, so that the runtime's shape check holds.

    A binary ``add``/``sub``/``mul`` of two inputs that goes to the backend's fast path takes
    over the activation following it (a residual block's add and ReLU): the fast path applies
    it to each chunk of the sum while in cache; where that path declines (broadcast operands,
    other dtypes), it runs on the evaluator's result.
    """

    def __init__(self, ctx: BuildContext, program: Program, scalar_dtype: Any = None, out_shape: Any = None):
        super().__init__(ctx)
        self._binary: tuple | None = None
        self._activation_layer: Any = None
        self.program = program
        self.expr = program.text
        self._fn = program._fn
        self._scalar_dtype = scalar_dtype
        if scalar_dtype is not None:
            self.forward = self._forward_array  # type: ignore[method-assign]
        # the whole tree as one fused kernel where the backend compiles one (cupy)
        fuse = getattr(ctx.fast, "fuse_expression", None)
        declines = getattr(ctx.fast, "fuse_expression_declines", None)
        if declines is not None and declines(out_shape):  # (declared too small to fuse)
            fuse = None
        self._fused = fuse(program.tree) if fuse is not None and program.mode == "closure" else None
        if self._fused is not None:
            self.forward = self._forward_fused  # type: ignore[method-assign]
            return
        # a binary op of two inputs (residual add) goes to the backend's fast path when it has one
        root, fast = program.tree, getattr(ctx.fast, "binary", None)
        if (fast is not None and root.kind == "call" and root.value in ("add", "sub", "mul")
                and len(root.args) == 2 and all(a.kind == "input" for a in root.args)):
            self._binary = (fast, root.value, root.args[0].value, root.args[1].value)
            self.forward = self._forward_binary  # type: ignore[method-assign]

    @classmethod
    def from_operator(cls, op, ctx):
        if "expr" not in op.params:
            raise LayerParameterError(f"{op.where}: parameter 'expr' is missing; it has "
                                      f"{sorted(op.params) or 'no parameters'}")
        try:
            text = expression_text(op.params["expr"])
        except TypeError as exc:
            raise LayerParameterError(f"{op.where}: parameter 'expr': {exc}") from None
        if _string_argument(op, text):
            return StringConstant(ctx, text)
        text = integer_floor_division(op, text)
        try:
            # (one compiled program per text and input count: YOLOv5n's 13 expressions are 5)
            program = ctx.reuse(("expression", text, len(op.inputs)),
                                lambda: Program(text, ctx.xp, ctx.device, ctx.fast, n_inputs=len(op.inputs)))
        except ExpressionError as exc:
            err = ExpressionError(f"{op.where}: {exc}")
            err.expr, err.pos = exc.expr, exc.pos
            raise err from None
        scalar_dtype = None
        if op.outputs and op.outputs[0].shape is not None and op.outputs[0].dtype is not None:
            name = op.outputs[0].array_dtype
            scalar_dtype = getattr(ctx.xp, name, None) if name else None
        out_shape = op.outputs[0].shape if op.outputs else None
        return cls(ctx, program, scalar_dtype, out_shape)

    def forward(self, *inputs: Any) -> Any:
        return self._fn(inputs)

    def set_fused_activation(self, spec: Any) -> None:
        """Take over the activation after this expression (the runtime's hook): only a binary
        op on the backend's fast path does; anything else is a ValueError (not fused)."""
        if self._binary is None:
            raise ValueError(f"{self.expr!r} is not a binary op of two inputs on a fast path")
        super().set_fused_activation(spec)
        if self.fused_activation is not None:
            self.forward = self._forward_binary_activated  # type: ignore[method-assign]

    def _forward_binary(self, *inputs: Any) -> Any:
        fast, name, i, j = self._binary  # type: ignore[misc]
        out = fast(name, inputs[i], inputs[j])
        return self._evaluate(inputs) if out is None else out

    def _forward_binary_activated(self, *inputs: Any) -> Any:
        fast, name, i, j = self._binary  # type: ignore[misc]
        act = self.fused_activation
        out = fast(name, inputs[i], inputs[j], None if callable(act) else act)
        if out is None:  # (integers, float16, broadcast operands: the activation's own layer, as unfused)
            y = self._evaluate(inputs)
            return self._activation_layer(y) if self._activation_layer is not None else self._activate(y)
        return act(out) if callable(act) else out

    def set_activation_layer(self, forward: Any) -> None:
        """The fused activation's own ``forward`` (the runtime's hook, after
        :meth:`set_fused_activation`): what runs where the fast path declines, so that results
        of any dtype are the unfused graph's."""
        self._activation_layer = forward

    def _forward_fused(self, *inputs: Any) -> Any:
        try:
            out = self._fused(inputs)  # type: ignore[misc]
        except Exception:  # shapes that do not broadcast: the evaluator's own error names the call
            out = None
        return self._evaluate(inputs) if out is None else out  # other dtypes, or not cupy arrays

    def _evaluate(self, inputs: tuple) -> Any:
        """The evaluator's result, where a fast path declines."""
        return self._forward_array(*inputs) if self._scalar_dtype is not None else self._fn(inputs)

    def _forward_array(self, *inputs: Any) -> Any:
        out = self._fn(inputs)
        if isinstance(out, (int, float, bool)):
            return self.xp.asarray(out, dtype=self._scalar_dtype, device=self.device)
        return out
