"""Recurrent layers: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` (torch's equations, eval mode).

pnnx spellings (torch 2.13 exports):

* ``nn.LSTM l 1 3 0 1 2 3 batch_first=True bias=True bidirectional=True hidden_size=32
  input_size=16 num_layers=2 proj_size=0 @bias_hh_l0=(128)f32 @bias_hh_l0_reverse=(128)f32
  @bias_ih_l0=(128)f32 ... @weight_hh_l0=(128,32)f32 @weight_ih_l0=(128,16)f32
  @weight_ih_l1=(128,64)f32 ...``: results (output, h_n, c_n). With ``proj_size=8`` each layer
  and direction also has ``@weight_hr_l{k}[_reverse]=(8,32)`` and ``@weight_hh_l{k}`` is (4H, 8).
* ``nn.GRU g 1 2 0 1 2 batch_first=False bias=True bidirectional=False hidden_size=24
  input_size=16 num_layers=1 @bias_hh_l0=(72)f32 ...``: results (output, h_n).
* ``nn.RNN r 1 2 0 1 2 ... nonlinearity=relu num_layers=1 ...`` (or ``nonlinearity=tanh``).
* ``bias=False`` drops every ``@bias_*``. Weights are named as in torch's state dict, with
  ``_reverse`` for the second direction; ``batch_first`` is always written.
* Initial states are extra inputs in call order: ``lstm(x, (h0, c0))`` -> ``3 3 x h0 c0 ...``,
  ``gru(x, h0)`` -> ``2 2 x h0 ...``; one tensor given as both h0 and c0 (``lstm(x, (h0, h0))``)
  is written once: ``2 ... x h0``, read as both.
* Unbatched input ``(L, H_in)`` exports as it is; h_n / c_n are then ``(D*num_layers, H_out)``.
* Unused results are dropped from the op: ``y, _ = lstm(x)`` gives ``nn.LSTM 1 1 x y``, and a
  model using only h_n gives ``1 1`` too, the one result being h_n. The results that remain are
  listed in the order the model first uses them, not in torch's order: ``return c, h, y`` gives
  ``1 3 x c h y``, and an unbatched LSTM returned whole (``return lstm(x)``, nested) gives
  (h_n, c_n, output); pnnx's own generated Python misreads such files. So this layer tells the
  results apart by the shapes the file annotates (output ``(N, L, D*H_out)`` / ``(L, N,
  D*H_out)`` / ``(L, D*H_out)``, h_n ``(D*num_layers, N, H_out)``, c_n ``(D*num_layers, N,
  hidden_size)``; ``?`` fits any size, but where the input's batch or length is ``?`` so is
  the output's, which tells a ``(1, ?, H)`` h_n from a batch_first output), and by position,
  in torch's order (output, h_n, c_n), only where the shapes cannot decide (with a warning at
  load). Not recoverable: which of h_n and c_n an LSTM
  without projection gives when the model uses c_n before h_n, or c_n alone (pnnx writes the
  same line as for h_n, c_n / h_n alone), and output against h_n when they share a shape
  (sequence length == num_layers, one direction, 2-D, or 3-D with batch_first=False).

Equations (torch's documentation), with W x + b over all time steps precomputed per layer and
direction in one product, then one ``(N, H) @ (H, G*H)`` product per step:

* LSTM, gates i, f, g, o: ``c' = f*c + i*g``, ``h' = o*tanh(c')`` (then ``h' @ W_hr^T`` with
  proj_size); i, f, o = sigmoid(.), g = tanh(.).
* GRU, gates r, z, n: ``n = tanh(W_in x + b_in + r*(W_hn h + b_hn))``, ``h' = (1-z)*n + z*h``.
* RNN: ``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)`` (or relu).

sigmoid(a) is computed as ``(1 + tanh(a/2)) / 2``: the sigmoid gates' rows of the weights and
biases are halved once at build (exact: a power of two), so each step takes one tanh over all
gates and cannot overflow. The computation runs in the input's floating dtype (weights are
cast once per dtype).
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .registry import register

_ROLES = ("output", "h_n", "c_n")
_ANY = object()


class _Recurrent(Layer):
    """The shared build and time loop; subclasses name the gate count and the cell step."""

    GATES = 1
    #: gate slots computed as sigmoid (their weight rows are halved at build)
    SIGMOID_GATES: tuple[int, ...] = ()
    N_STATES = 1  # h (GRU, RNN) or h and c (LSTM)
    #: GRU: the last gate's hidden bias b_hn stays inside r * (W_hn h + b_hn)
    HIDDEN_BIAS_INSIDE = False
    #: RNN: reads ``nonlinearity`` (tanh or relu)
    HAS_NONLINEARITY = False
    #: the cell's name for the backend's fast time loop
    KIND = ""

    def __init__(self, ctx: BuildContext, *, where: str, input_size: int, hidden_size: int, num_layers: int,
                 directions: int, proj_size: int, batch_first: bool, cells: list[dict[str, Any]],
                 roles: list[str], relu: bool = False):
        super().__init__(ctx)
        self.where = where
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.directions, self.proj_size, self.batch_first = directions, proj_size, batch_first
        self.h_out = proj_size or hidden_size
        #: per layer and direction: w_ih_t, w_hh_t, w_hr_t (or None); b_x = b_ih + b_hh (the part
        #: outside the cell's products; None without bias), b_hn (GRU)
        self.cells = cells
        self.roles = roles
        self.relu = relu
        self._cast: dict[str, list[dict[str, Any]]] = {}
        #: the backend's in-place time loop (``rnn_sequence`` of the numpy fast paths), or None
        self._fast = getattr(ctx.fast, "rnn_sequence", None)

    # -- build -----------------------------------------------------------------------------------

    @classmethod
    def from_operator(cls, op, ctx):
        xp = ctx.xp
        input_size = op.param("input_size", int)
        hidden_size = op.param("hidden_size", int)
        num_layers = op.param("num_layers", int, default=1)
        bias = op.param("bias", bool, default=True)
        D = 2 if op.param("bidirectional", bool, default=False) else 1
        proj = op.param("proj_size", int, default=0) if cls.N_STATES == 2 else 0
        for key, v, lo in (("input_size", input_size, 1), ("hidden_size", hidden_size, 1),
                           ("num_layers", num_layers, 1), ("proj_size", proj, 0)):
            if v < lo:
                raise LayerParameterError(f"{op.where}: {key}={v} must be at least {lo}")
        if proj >= hidden_size:
            raise LayerParameterError(f"{op.where}: proj_size={proj} must be smaller than hidden_size={hidden_size}")
        relu = False
        if cls.HAS_NONLINEARITY:
            nl = op.param("nonlinearity", str, default="tanh")
            if nl not in ("tanh", "relu"):
                raise LayerParameterError(f"{op.where}: nonlinearity={nl!r}, expected 'tanh' or 'relu'")
            relu = nl == "relu"
        n_in = len(op.inputs)
        # (an LSTM without a projection given one tensor as both states, ``lstm(x, (h0, h0))``:
        # pnnx writes that operand once)
        if n_in not in (1, 1 + cls.N_STATES) and not (cls.N_STATES == 2 and n_in == 2 and proj == 0):
            states = "(h0, c0)" if cls.N_STATES == 2 else "h0"
            raise LayerParameterError(f"{op.where}: {n_in} inputs; expected the input, optionally with {states}")

        H, G, h_out = hidden_size, cls.GATES, proj or hidden_size
        fast_pack = getattr(ctx.fast, "pack_linear", None)
        expected: set[str] = set()

        def want(name: str, shape: tuple[int, ...]) -> Any:
            expected.add(name)
            a = op.weight(name, ctx)
            if tuple(a.shape) != shape:
                raise LayerParameterError(f"{op.where}: weight {name!r} has shape {tuple(a.shape)}, expected {shape} "
                                          f"(input_size={input_size}, hidden_size={H}, proj_size={proj}, "
                                          f"bidirectional={D == 2})")
            if not xp.isdtype(a.dtype, "real floating"):
                raise LayerParameterError(f"{op.where}: weight {name!r} has dtype {a.dtype}, expected floating point")
            return a

        def halve(name: str, a: Any) -> Any:
            """The sigmoid gates' rows of ``a`` times 0.5 (along axis 0); the read weight is
            dropped from the build's cache when a copy is made."""
            if not cls.SIGMOID_GATES:
                return a
            s = [0.5 if g in cls.SIGMOID_GATES else 1.0 for g in range(G) for _ in range(H)]
            s = xp.asarray(s, dtype=a.dtype, device=ctx.device)
            ctx.forget(op.weight_ref(name))
            return a * (s if a.ndim == 1 else s[:, None])

        def transposed(name: str, a: Any) -> Any:
            if fast_pack is None:
                return xp.matrix_transpose(a)
            ctx.forget(op.weight_ref(name))
            return fast_pack(a, keep_big=False)

        cells: list[dict[str, Any]] = []
        for k in range(num_layers):
            in_k = input_size if k == 0 else D * h_out
            for d in range(D):
                sfx = f"l{k}" + ("_reverse" if d else "")
                cell: dict[str, Any] = {}
                name = f"weight_ih_{sfx}"
                cell["w_ih_t"] = transposed(name, halve(name, want(name, (G * H, in_k))))
                name = f"weight_hh_{sfx}"
                cell["w_hh_t"] = transposed(name, halve(name, want(name, (G * H, h_out))))
                cell["b_x"] = cell["b_hn"] = cell["w_hr_t"] = None
                if bias:
                    b_ih = halve(f"bias_ih_{sfx}", want(f"bias_ih_{sfx}", (G * H,)))
                    b_hh = halve(f"bias_hh_{sfx}", want(f"bias_hh_{sfx}", (G * H,)))
                    if cls.HIDDEN_BIAS_INSIDE:
                        zeros = xp.zeros((H,), dtype=b_hh.dtype, device=ctx.device)
                        b_hh, cell["b_hn"] = xp.concat([b_hh[:2 * H], zeros]), b_hh[2 * H:]
                    # the two parts are kept for another dtype: their sum is made in that dtype
                    cell["b_ih"], cell["b_hh"], cell["b_x"] = b_ih, b_hh, b_ih + b_hh
                if proj:
                    name = f"weight_hr_{sfx}"
                    cell["w_hr_t"] = transposed(name, want(name, (proj, H)))
                cells.append(cell)
        extra = sorted(set(op.attrs) - expected)
        if extra:
            raise LayerParameterError(f"{op.where}: unexpected weight(s) {extra} for num_layers={num_layers}, "
                                      f"bidirectional={D == 2}, bias={bias}, proj_size={proj}")
        roles = cls._output_roles(op, D * num_layers, h_out, H, D * h_out)
        return cls(ctx, where=op.where, input_size=input_size, hidden_size=H, num_layers=num_layers, directions=D,
                   proj_size=proj, batch_first=op.param("batch_first", bool, default=False), cells=cells,
                   roles=roles, relu=relu)

    @classmethod
    def _output_roles(cls, op: Any, n_states: int, h_out: int, h_cell: int, out_features: int) -> list[str]:
        """Which result (output, h_n, c_n) each op output is, from the annotated shapes (see the
        module docstring); position decides where the shapes cannot."""
        names = _ROLES[:1 + cls.N_STATES]
        n_out = len(op.outputs)
        if not 1 <= n_out <= len(names):
            raise LayerParameterError(f"{op.where}: {n_out} outputs; expected 1 to {len(names)} of {list(names)}")
        xs = op.inputs[0].shape
        batch_first = op.param("batch_first", bool, default=False)
        # the input's batch and length: _ANY where the input is not annotated, None where it is
        # dynamic ('?', which a result's dimension that follows it shows too)
        n = seq = _ANY
        if xs is not None and len(xs) == 3:
            n, seq = (xs[0], xs[1]) if batch_first else (xs[1], xs[0])
        elif xs is not None and len(xs) == 2:
            seq = xs[0]
        batched_in = xs is not None and len(xs) == 3

        def fits(shape: Any, want: tuple[Any, ...]) -> bool:
            return len(shape) == len(want) and all(
                w is _ANY or (a is None if w is None else a in (None, w)) for a, w in zip(shape, want))

        def can_be(shape: Any, role: str) -> bool:
            if shape is None:
                return True
            # (sizes fixed by the weights are never '?': a state's first and last, the output's last)
            if role == "output" and shape[-1] != out_features:
                return False
            if role != "output" and (shape[0] != n_states or shape[-1] != (h_out if role == "h_n" else h_cell)):
                return False
            if role == "output":
                if len(shape) == 2:
                    return not batched_in and fits(shape, (seq, out_features))
                return fits(shape, (n, seq, out_features) if batch_first else (seq, n, out_features))
            h = h_out if role == "h_n" else h_cell
            if len(shape) == 2:
                return not batched_in and fits(shape, (n_states, h))
            return fits(shape, (n_states, n, h))

        fitting = [order for order in itertools.permutations(names, n_out)  # torch's order first
                   if all(can_be(o.shape, r) for o, r in zip(op.outputs, order))]
        if fitting:
            first = fitting[0]
            if len(fitting) > 1 and "output" in first and first.index("output") > 0:
                # (pnnx listed the results in the order of first use, as a state before the
                # output shows, and the states' shapes cannot say which is which; with the output
                # first there is no such sign, and torch's order is taken silently)
                warnings.warn(
                    f"{op.where}: the declared shapes {[o.shape_str() for o in op.outputs]} fit several "
                    f"readings of the results ({', '.join('(' + ', '.join(f) + ')' for f in fitting)}); "
                    f"taken as ({', '.join(fitting[0])}). pnnx lists them in the order the model first uses "
                    "them and writes c_n alone like h_n: use h_n before c_n, or give the states sizes "
                    "that differ (proj_size, a sequence length other than num_layers).", stacklevel=2)
            return list(fitting[0])
        shapes = [o.shape_str() for o in op.outputs]
        raise LayerParameterError(f"{op.where}: output shapes {shapes} do not fit {list(names)} (output "
                                  f"(..., {out_features}), states ({n_states}, ..., {h_out}))")

    # -- compute ---------------------------------------------------------------------------------

    def _cells(self, dtype: Any) -> list[dict[str, Any]]:
        """The weights in ``dtype`` (cast once per dtype; filling the cache is idempotent)."""
        key = str(dtype)
        cast = self._cast.get(key)
        if cast is None:
            xp = self.xp
            if all(v.dtype == dtype for c in self.cells for v in c.values() if v is not None):
                cast = self.cells
            else:
                cast = [{k: None if v is None else xp.astype(v, dtype) for k, v in c.items()} for c in self.cells]
                for c in cast:  # the bias sum made in this dtype
                    if c["b_x"] is not None:
                        c["b_x"] = c["b_ih"] + c["b_hh"]
            self._cast[key] = cast
        return cast

    def _state(self, s: Any, what: str, n: int, size: int, unbatched: bool, dtype: Any) -> Any:
        """An initial state input as (D*num_layers, N, size) in ``dtype``."""
        xp = self.xp
        want = (self.directions * self.num_layers, size) if unbatched else (self.directions * self.num_layers, n, size)
        if tuple(s.shape) != want:
            raise ShapeError(f"{self.where}: {what} has shape {tuple(s.shape)}, expected {want}")
        if s.dtype != dtype:
            s = xp.astype(s, dtype)
        return s[:, None, :] if unbatched else s

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        x = inputs[0]
        if x.ndim not in (2, 3):
            raise ShapeError(f"{self.where}: expects a 3-D input ({'N, L' if self.batch_first else 'L, N'}, "
                             f"{self.input_size}) or an unbatched (L, {self.input_size}) one, got shape {tuple(x.shape)}")
        if x.shape[-1] != self.input_size:
            raise ShapeError(f"{self.where}: input has {x.shape[-1]} features (shape {tuple(x.shape)}), "
                             f"expected input_size={self.input_size}")
        if not xp.isdtype(x.dtype, "real floating"):
            raise ShapeError(f"{self.where}: expects a floating-point input, got {x.dtype}")
        unbatched = x.ndim == 2
        if unbatched:
            x = x[:, None, :]
        elif self.batch_first:
            x = xp.permute_dims(x, (1, 0, 2))
        L, N = x.shape[0], x.shape[1]
        if L == 0:
            raise ShapeError(f"{self.where}: the input sequence is empty (shape {tuple(inputs[0].shape)})")
        dt = x.dtype
        S = self.directions * self.num_layers
        if len(inputs) > 1:
            h0 = self._state(inputs[1], "h0", N, self.h_out, unbatched, dt)
            c0 = (self._state(inputs[2 if len(inputs) > 2 else 1], "c0", N, self.hidden_size, unbatched, dt)
                  if self.N_STATES == 2 else None)
        else:
            h0 = xp.zeros((S, N, self.h_out), dtype=dt, device=self.device)
            c0 = xp.zeros((S, N, self.hidden_size), dtype=dt, device=self.device) if self.N_STATES == 2 else None

        cells = self._cells(dt)
        h_n: list[Any] = []
        c_n: list[Any] = []
        layer_in = x
        fast = self._fast
        for k in range(self.num_layers):
            outs = []
            # the fast loop writes each direction's steps into its half of the layer's output
            out_k = None if fast is None else xp.empty((L, N, self.directions * self.h_out), dtype=dt,
                                                         device=self.device)
            # (the cells were cast to the input's floating dtype: the fast loop takes them all)
            for d in range(self.directions):
                j = k * self.directions + d
                cell = cells[j]
                # W_ih x + b for every time step in one product
                f_in = layer_in.shape[2]
                xw = self.matmul(xp.reshape(layer_in, (L * N, f_in)), cell["w_ih_t"])
                if cell["b_x"] is not None:
                    xw = xw + cell["b_x"]
                xw = xp.reshape(xw, (L, N, xw.shape[1]))
                h, c = h0[j, ...], None if c0 is None else c0[j, ...]
                if out_k is not None:
                    h, c = fast(self.KIND, xw, cell["w_hh_t"], h, c,
                                out_k[:, :, d * self.h_out:(d + 1) * self.h_out], reverse=bool(d),
                                b_hn=cell["b_hn"], w_hr_t=cell["w_hr_t"], relu=self.relu)
                else:
                    ys: list[Any] = [None] * L
                    for t in (range(L - 1, -1, -1) if d else range(L)):
                        h, c = self._step(xw[t, ...], h, c, cell)
                        ys[t] = h
                    outs.append(xp.stack(ys, axis=0))
                h_n.append(h)
                if c is not None:
                    c_n.append(c)
            if out_k is not None:
                layer_in = out_k
            else:
                layer_in = outs[0] if len(outs) == 1 else xp.concat(outs, axis=2)

        results = {"output": layer_in, "h_n": xp.stack(h_n, axis=0)}
        if c_n:
            results["c_n"] = xp.stack(c_n, axis=0)
        if unbatched:
            results = {r: v[:, 0, :] for r, v in results.items()}
        elif self.batch_first:
            results["output"] = xp.permute_dims(results["output"], (1, 0, 2))
        got = tuple(results[r] for r in self.roles)
        return got[0] if len(got) == 1 else got

    def _step(self, xw: Any, h: Any, c: Any, cell: dict[str, Any]) -> tuple[Any, Any]:  # pragma: no cover
        raise NotImplementedError


@register("nn.LSTM")
class LSTM(_Recurrent):
    """torch.nn.LSTM (gates i, f, g, o), with ``proj_size`` and initial (h0, c0) inputs."""

    GATES = 4
    SIGMOID_GATES = (0, 1, 3)
    N_STATES = 2
    KIND = "lstm"

    def _step(self, xw, h, c, cell):
        xp, H = self.xp, self.hidden_size
        a = xp.tanh(xw + self.matmul(h, cell["w_hh_t"]))  # i, f, o halved: sigmoid = (1 + a) / 2
        s = a * 0.5 + 0.5
        c = s[:, H:2 * H] * c + s[:, :H] * a[:, 2 * H:3 * H]
        h = s[:, 3 * H:] * xp.tanh(c)
        if cell["w_hr_t"] is not None:
            h = self.matmul(h, cell["w_hr_t"])
        return h, c


@register("nn.GRU")
class GRU(_Recurrent):
    """torch.nn.GRU (gates r, z, n; b_hn stays inside the reset gate's product)."""

    GATES = 3
    SIGMOID_GATES = (0, 1)
    HIDDEN_BIAS_INSIDE = True
    KIND = "gru"

    def _step(self, xw, h, c, cell):
        xp, H = self.xp, self.hidden_size
        hw = self.matmul(h, cell["w_hh_t"])
        rz = xp.tanh(xw[:, :2 * H] + hw[:, :2 * H]) * 0.5 + 0.5  # r, z halved: sigmoid = (1 + a) / 2
        hn = hw[:, 2 * H:]
        if cell["b_hn"] is not None:
            hn = hn + cell["b_hn"]
        n = xp.tanh(xw[:, 2 * H:] + rz[:, :H] * hn)
        return n + rz[:, H:] * (h - n), None


@register("nn.RNN")
class RNN(_Recurrent):
    """torch.nn.RNN with ``nonlinearity`` tanh or relu."""

    HAS_NONLINEARITY = True
    KIND = "rnn"

    def _step(self, xw, h, c, cell):
        a = xw + self.matmul(h, cell["w_hh_t"])
        return (self.xp.clip(a, min=0.0) if self.relu else self.xp.tanh(a)), None
