"""Recurrent layers (kuiper_xp/layers/recurrent.py) against PyTorch: nn.LSTM (layers, directions,
batch_first, proj_size, initial states, unbatched), nn.GRU, nn.RNN (tanh, relu), bias=False,
float64; results told apart by their annotated shapes; errors naming the op.

Single-operator graphs (``one_op_param``, weights from a torch module's state dict) cover the
variants cheaply; four pnnx exports (module-scoped, one each) check the real spellings end to
end, including unused results dropped by pnnx, ``?`` shapes and a small LSTM -> Linear model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_close
from test_layers_misc import (
    compare_graph,
    export_module,
    one_op_param,
    require_types,
    run_one_op,
    t2n,
)
from torch import nn

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError

rng = np.random.default_rng(5)


def _x(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _op_params(m: nn.RNNBase) -> str:
    """The parameters as pnnx writes them for ``m``."""
    p = (f"batch_first={m.batch_first} bias={m.bias} bidirectional={m.bidirectional} "
         f"hidden_size={m.hidden_size} input_size={m.input_size} num_layers={m.num_layers}")
    if isinstance(m, nn.LSTM):
        p += f" proj_size={m.proj_size}"
    if type(m) is nn.RNN:
        p += f" nonlinearity={m.nonlinearity}"
    return p


def _weights(m: nn.RNNBase) -> dict[str, np.ndarray]:
    return {k: t2n(v) for k, v in m.state_dict().items()}


def _module(kind: str, **kw) -> nn.RNNBase:
    torch.manual_seed(1)
    cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
    m = cls(6, 5, **kw).eval()
    with torch.no_grad():  # wider than torch's init, so that the gates leave their linear range
        for p in m.parameters():
            p.uniform_(-0.8, 0.8)
    return m


# name -> (kind, module kwargs, input shape, states given, dtype)
CASES = {
    "lstm_2layers_bidirectional_batch_first": ("lstm", dict(num_layers=2, bidirectional=True, batch_first=True),
                                               (3, 7, 6), False, np.float32),
    "lstm_proj_with_h0_c0_bidirectional": ("lstm", dict(proj_size=3, bidirectional=True), (7, 2, 6), True,
                                           np.float32),
    "lstm_unbatched_no_bias_with_state": ("lstm", dict(bias=False, num_layers=2), (7, 6), True, np.float32),
    "gru_2layers_with_h0": ("gru", dict(num_layers=2), (7, 3, 6), True, np.float32),
    "gru_bidirectional_batch_first_no_bias": ("gru", dict(bidirectional=True, batch_first=True, bias=False),
                                              (2, 7, 6), False, np.float32),
    "rnn_relu_2layers": ("rnn", dict(nonlinearity="relu", num_layers=2), (7, 3, 6), False, np.float32),
    "rnn_tanh_bidirectional_with_h0": ("rnn", dict(bidirectional=True, batch_first=True), (3, 7, 6), True,
                                       np.float32),
    "gru_float64": ("gru", dict(bidirectional=True), (7, 2, 6), True, np.float64),
    "lstm_float64": ("lstm", dict(proj_size=2, batch_first=True), (2, 7, 6), True, np.float64),
}


def _states(m: nn.RNNBase, x: np.ndarray) -> list[np.ndarray]:
    d = 2 if m.bidirectional else 1
    batch = () if x.ndim == 2 else (x.shape[0 if m.batch_first else 1],)
    h_out = getattr(m, "proj_size", 0) or m.hidden_size
    states = [_x(d * m.num_layers, *batch, h_out, dtype=x.dtype)]
    if isinstance(m, nn.LSTM):
        states.append(_x(d * m.num_layers, *batch, m.hidden_size, dtype=x.dtype))
    return states


def _torch_run(m: nn.RNNBase, x: np.ndarray, states: list[np.ndarray]) -> list[np.ndarray]:
    """torch's (output, h_n[, c_n]) for ``x`` and the initial states (none: zeros)."""
    t = [torch.from_numpy(a) for a in [x, *states]]
    hx = None if not states else (tuple(t[1:]) if isinstance(m, nn.LSTM) else t[1])
    with torch.no_grad():
        y, h = m(t[0], hx)
    return [t2n(y), *(map(t2n, h) if isinstance(h, tuple) else [t2n(h)])]


@pytest.mark.parametrize("name", list(CASES))
def test_recurrent_matches_torch(backend, tmp_path, name):
    kind, kw, shape, with_state, dtype = CASES[name]
    m = _module(kind, **kw)
    if dtype == np.float64:
        m = m.double()
    x = _x(*shape, dtype=dtype)
    states = _states(m, x) if with_state else []
    expected = _torch_run(m, x, states)
    run_one_op(backend, tmp_path, f"nn.{type(m).__name__}", [x, *states], expected, params=_op_params(m),
               weights=_weights(m), rtol=1e-10 if dtype == np.float64 else 1e-4)


def test_float64_input_with_float32_weights_runs_in_float64(backend, tmp_path):
    m = _module("lstm", num_layers=2, batch_first=True)
    x = _x(2, 5, 6, dtype=np.float64)
    expected = _torch_run(m.double(), x, [])  # the float32 weights are exact in float64
    run_one_op(backend, tmp_path, "nn.LSTM", [x], expected, params=_op_params(m),
               weights={k: v.astype(np.float32) for k, v in _weights(m).items()}, rtol=1e-10)


@pytest.mark.parametrize("order", [("h_n",), ("c_n", "h_n", "output"), ("output", "c_n")])
def test_results_are_told_apart_by_their_annotated_shapes(backend, tmp_path, order):
    """pnnx lists the results the model uses, in the order it uses them: with proj_size the
    three shapes differ, so each op output gets its own result whatever the order."""
    m = _module("lstm", proj_size=2, num_layers=2)
    x = _x(7, 3, 6)
    y, h, c = _torch_run(m, x, [])
    got = {"output": y, "h_n": h, "c_n": c}
    run_one_op(backend, tmp_path, "nn.LSTM", [x], [got[r] for r in order], params=_op_params(m),
               weights=_weights(m), rtol=1e-4)


def test_rnn_with_only_h_n_used(backend, tmp_path):
    """``_, h = rnn(x)``: pnnx writes one output, annotated with h_n's shape."""
    m = _module("rnn", num_layers=3)
    x = _x(7, 2, 6)
    run_one_op(backend, tmp_path, "nn.RNN", [x], _torch_run(m, x, [])[1:], params=_op_params(m),
               weights=_weights(m), rtol=1e-4)


# ---- errors ------------------------------------------------------------------------------------


def _graph(tmp_path, m, inputs, outputs, weights=None, params=None):
    param = one_op_param(tmp_path, f"nn.{type(m).__name__}", inputs, outputs,
                         params if params is not None else _op_params(m),
                         _weights(m) if weights is None else weights)
    return kuiper_xp.load(param, backend="numpy")


def test_wrong_input_feature_size_names_the_op(backend, tmp_path):
    m = _module("lstm", batch_first=True)
    x = _x(2, 7, 4)  # input_size is 6
    param = one_op_param(tmp_path, "nn.LSTM", [x], [np.zeros((2, 7, 5), np.float32)], _op_params(m), _weights(m))
    g = kuiper_xp.load(param, backend=backend)
    with pytest.raises(ShapeError, match=r"nn.LSTM 'op'.*input has 4 features.*expected input_size=6"):
        g(x)


def test_wrong_input_rank_and_state_shape_name_the_op(tmp_path):
    m = _module("gru")
    x = _x(2, 3, 7, 6)
    g = _graph(tmp_path / "rank", m, [x], [np.zeros((7, 3, 5), np.float32)])
    with pytest.raises(ShapeError, match=r"nn.GRU 'op'.*3-D input.*\(2, 3, 7, 6\)"):
        g(x)
    x, h0 = _x(7, 3, 6), _x(1, 2, 5)  # h0's batch is not the input's
    g = _graph(tmp_path / "h0", m, [x, h0], [np.zeros((7, 3, 5), np.float32), np.zeros((1, 3, 5), np.float32)])
    with pytest.raises(ShapeError, match=r"nn.GRU 'op'.*h0 has shape \(1, 2, 5\), expected \(1, 3, 5\)"):
        g(x, h0)


def test_bad_weights_and_parameters_name_the_op(tmp_path):
    m = _module("lstm", num_layers=2)
    x, out = _x(7, 2, 6), [np.zeros((7, 2, 5), np.float32)]
    w = _weights(m)
    missing = {k: v for k, v in w.items() if k != "weight_hh_l1"}
    with pytest.raises(LayerParameterError, match=r"nn.LSTM 'op'.*'weight_hh_l1' is missing"):
        _graph(tmp_path / "missing", m, [x], out, weights=missing)
    with pytest.raises(LayerParameterError, match=r"nn.LSTM 'op'.*'weight_ih_l0' has shape \(20, 6\), expected \(24, 6\)"):
        _graph(tmp_path / "hidden", m, [x], out, params=_op_params(m).replace("hidden_size=5", "hidden_size=6"))
    with pytest.raises(LayerParameterError, match=r"nn.LSTM 'op'.*unexpected weight.*'bias_hh_l0'"):
        _graph(tmp_path / "bias", m, [x], out, params=_op_params(m).replace("bias=True", "bias=False"))
    with pytest.raises(LayerParameterError, match=r"nn.LSTM 'op'.*unexpected weight.*'weight_hh_l1'"):
        _graph(tmp_path / "layers", m, [x], out, params=_op_params(m).replace("num_layers=2", "num_layers=1"))
    with pytest.raises(LayerParameterError, match=r"nn.LSTM 'op'.*output shapes \['\(7,2,9\)'\] do not fit"):
        _graph(tmp_path / "out", m, [x], [np.zeros((7, 2, 9), np.float32)])
    r = _module("rnn")
    with pytest.raises(LayerParameterError, match=r"nn.RNN 'op'.*nonlinearity='gelu'"):
        _graph(tmp_path / "nl", r, [x], out, params=_op_params(r).replace("=tanh", "=gelu"))
    with pytest.raises(LayerParameterError, match=r"nn.RNN 'op'.*3 inputs"):
        _graph(tmp_path / "inputs", r, [x, _x(1, 2, 5), _x(1, 2, 5)], out)


# ---- pnnx end to end ---------------------------------------------------------------------------


class LSTMs(nn.Module):
    """Two layers, bidirectional, batch_first; and proj_size with given (h0, c0), seq first."""

    def __init__(self):
        super().__init__()
        self.deep = nn.LSTM(8, 12, num_layers=2, bidirectional=True, batch_first=True)
        self.proj = nn.LSTM(8, 10, proj_size=4)

    def forward(self, x, xs, h0, c0):
        y, (h, c) = self.deep(x)
        y2, (h2, c2) = self.proj(xs, (h0, c0))
        return y, h, c, y2, h2, c2


class GRUsAndRNNs(nn.Module):
    """GRU (seq first) with h0; RNN relu; RNN tanh without bias, unbatched, only h_n used."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 6, num_layers=2)
        self.relu = nn.RNN(8, 5, nonlinearity="relu", batch_first=True)
        self.tanh = nn.RNN(8, 7, bias=False, bidirectional=True)

    def forward(self, xs, h0, x, u):
        y, h = self.gru(xs, h0)
        y2, h2 = self.relu(x)
        _, h3 = self.tanh(u)
        return y, h, y2, h2, h3


class Float64(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 6, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(8, 5, bias=False)

    def forward(self, x, xs):
        y, (h, c) = self.lstm(x)
        y2, _ = self.gru(xs)
        return y, h, c, y2


class Tagger(nn.Module):
    """A small sequence model: LSTM -> Linear over every step, plus a GRU whose last state
    feeds a classifier (pnnx drops the unused results of both)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True, bidirectional=True)
        self.tags = nn.Linear(32, 5)
        self.gru = nn.GRU(32, 6, batch_first=True)
        self.cls = nn.Linear(6, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        _, h = self.gru(y)
        return self.tags(y), self.cls(torch.flatten(h.permute(1, 0, 2), 1))


def _export(module, inputs, tmp_path_factory, name, inputs2=None):
    torch.manual_seed(0)
    module = module.eval()
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.6, 0.6)
    return export_module(module, inputs, tmp_path_factory.mktemp(name), inputs2=inputs2), module, inputs


@pytest.fixture(scope="module")
def lstm_export(tmp_path_factory):
    g = torch.Generator().manual_seed(1)
    inputs = tuple(torch.randn(s, generator=g) for s in [(2, 7, 8), (6, 2, 8), (1, 2, 4), (1, 2, 10)])
    return _export(LSTMs(), inputs, tmp_path_factory, "lstm")


@pytest.fixture(scope="module")
def gru_rnn_export(tmp_path_factory):
    g = torch.Generator().manual_seed(2)
    inputs = tuple(torch.randn(s, generator=g) for s in [(7, 3, 8), (2, 3, 6), (3, 5, 8), (6, 8)])
    return _export(GRUsAndRNNs(), inputs, tmp_path_factory, "gru_rnn")


@pytest.fixture(scope="module")
def float64_export(tmp_path_factory):
    g = torch.Generator().manual_seed(3)
    inputs = tuple(torch.randn(s, generator=g, dtype=torch.float64) for s in [(2, 7, 8), (7, 2, 8)])
    return _export(Float64().double(), inputs, tmp_path_factory, "float64")


@pytest.fixture(scope="module")
def tagger_export(tmp_path_factory):
    g = torch.Generator().manual_seed(4)
    x, x2 = torch.randn(2, 9, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    (param, module, _) = _export(Tagger(), (x,), tmp_path_factory, "tagger", inputs2=(x2,))
    return param, module, x, x2


def _expect_in(param, *texts):
    text = param.read_text()
    for t in texts:
        assert t in text, f"pnnx no longer emits {t!r}"


def test_lstm_export_matches_torch(lstm_export, model_backend):
    param, module, inputs = lstm_export
    _expect_in(param, "nn.LSTM", "bidirectional=True", "num_layers=2", "@weight_ih_l1_reverse=(48,24)",
               "proj_size=4", "@weight_hr_l0=(4,10)", " 3 3 ")  # (x, h0, c0) in, (y, h_n, c_n) out
    require_types(param)
    compare_graph(param, model_backend, module, inputs, rtol=1e-4)


def test_gru_rnn_export_matches_torch(gru_rnn_export, model_backend):
    param, module, inputs = gru_rnn_export
    _expect_in(param, "nn.GRU", "nn.RNN", "nonlinearity=relu", "nonlinearity=tanh", "bias=False",
               "=(6,8)f32", "=(2,7)f32")  # unbatched input; the op's one output is h_n
    require_types(param)
    compare_graph(param, model_backend, module, inputs, rtol=1e-4)


def test_float64_export_matches_torch(float64_export, model_backend):
    param, module, inputs = float64_export
    _expect_in(param, "@weight_ih_l0=(24,8)f64")
    require_types(param)
    compare_graph(param, model_backend, module, inputs, rtol=1e-10)


def test_lstm_linear_model_matches_torch(tagger_export, model_backend):
    param, module, x, x2 = tagger_export
    _expect_in(param, "nn.LSTM", "nn.GRU", "nn.Linear")
    lines = [ln.split() for ln in param.read_text().splitlines()]
    assert [ln[3] for ln in lines if ln and ln[0] in ("nn.LSTM", "nn.GRU")] == ["1", "1"], \
        "pnnx no longer drops the unused results"
    require_types(param)
    compare_graph(param, model_backend, module, (x,), rtol=1e-4)
    compare_graph(param, model_backend, module, (x2,), rtol=1e-4)  # batch and length are dynamic


class Returned(nn.Module):
    """Results as models return them: an LSTM's nested (output, (h_n, c_n)) tuple, and the last
    layer's state taken with h[-1] on a one-layer GRU (pnnx writes that select on a dim of size 1
    as a one-output torch.unbind)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 6, batch_first=True)
        self.gru = nn.GRU(8, 5)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        _, h = self.gru(x.transpose(0, 1))
        return self.lstm(x), self.fc(h[-1])


def _flat(t):
    return tuple(a for item in t for a in (_flat(item) if isinstance(item, tuple) else (item,)))


def test_nested_results_and_last_state_match_torch(tmp_path_factory, model_backend):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 8, generator=g)
    param, module, _ = _export(Returned(), (x,), tmp_path_factory, "returned")
    _expect_in(param, "prim::TupleConstruct", "torch.unbind")
    got = kuiper_xp.load(param, backend=model_backend)(x.numpy())
    with torch.no_grad():
        want = _flat(module(x))
    assert len(got) == len(want) == 4
    for a, e in zip(got, want):
        assert_close(a, e.numpy(), rtol=1e-4)


def test_numpy_runs_the_fast_time_loop_and_it_matches_the_generic_one(lstm_export, gru_rnn_export):
    """On numpy the layers hand their time loop to backends/numpy_fast.rnn_sequence (in-place, no
    allocation per step); it gives what the generic per-step code gives (which the
    array_api_strict legs run), for every cell kind, direction, projection and state input."""
    import kuiper_xp

    seen = set()
    for param, _, inputs in (lstm_export, gru_rnn_export):
        g_fast, g_plain = (kuiper_xp.load(param, backend="numpy") for _ in range(2))
        kinds = []
        for r in g_fast.execution_order:
            f = getattr(r.layer, "_fast", None)
            if f is not None:
                r.layer._fast = lambda *a, f=f, kinds=kinds, **k: kinds.append(a[0]) or f(*a, **k)
        for r in g_plain.execution_order:
            if hasattr(r.layer, "_fast"):
                r.layer._fast = None
        xs = [t2n(t) for t in inputs]
        for a, b in zip(g_fast(*xs), g_plain(*xs)):
            assert_close(a, b, rtol=1e-6)
        assert kinds, "the fast loop did not run"
        seen |= set(kinds)
    assert seen == {"lstm", "gru", "rnn"}


class _SharedStates(nn.Module):
    """``lstm(x, (h0, h0))``: one tensor as both initial states (an input, or zeros made here)."""

    def __init__(self, made):
        super().__init__()
        self.made = made
        self.rnn = nn.LSTM(6, 7, num_layers=2, batch_first=True, bidirectional=made)

    def forward(self, x, *h):
        h = torch.zeros(4, x.shape[0], 7) if self.made else h[0]
        y, (hn, cn) = self.rnn(x, (h, h))
        return y, hn, cn


@pytest.mark.parametrize("made", [False, True])
def test_lstm_with_one_tensor_as_both_states(model_backend, tmp_path_factory, made):
    """pnnx writes a tensor passed as both h0 and c0 once (``nn.LSTM ... 2 3 x h0``): it was
    refused ("2 inputs"); read as both states, against torch at two batch sizes."""
    torch.manual_seed(0)
    m = _SharedStates(made).eval()
    make = lambda b: (torch.randn(b, 5, 6),) + (() if made else (torch.randn(2, b, 7),))  # noqa: E731
    param, module, _ = _export(m, make(1), tmp_path_factory, "shared", inputs2=make(3))
    assert any(line.startswith("nn.LSTM") and line.split()[2] == "2" for line in param.read_text().splitlines())
    for b in (1, 3):
        compare_graph(param, model_backend, module, make(b), rtol=1e-4)


class StatesOutOfOrder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        return y, c * 3, h + 1  # c_n read first: pnnx lists it before h_n


def test_lstm_states_that_shapes_cannot_tell_apart_warn(tmp_path):
    """h_n and c_n of one shape, listed in the order of first use: the file cannot say which is
    which, and the layer says so (it used to swap them silently)."""
    from test_layers_misc import export_module

    torch.manual_seed(0)
    param = export_module(StatesOutOfOrder().eval(), (torch.randn(2, 5, 4),), tmp_path,
                          inputs2=(torch.randn(3, 7, 4),))
    with pytest.warns(UserWarning, match="fit several readings of the results"):
        kuiper_xp.load(param, backend="numpy")


def test_recurrent_weights_are_packed_whatever_their_size(monkeypatch, tmp_path):
    """Linear keeps weights of PACK_KEEP_MIN_ELEMENTS or more as read (a transposed view); a
    recurrent layer's are always made contiguous (its step products of a few rows ran 1.2-1.45x
    slower on the view), and still give torch's result."""
    from kuiper_xp.backends import numpy_fast as nf

    monkeypatch.setattr(nf, "PACK_KEEP_MIN_ELEMENTS", 16)
    m = _module("lstm", num_layers=2, batch_first=True)
    x = _x(2, 5, 6)
    g = _graph(tmp_path, m, [x], _torch_run(m, x, [])[:1])
    lstm = next(r.layer for r in g.execution_order if r.type == "nn.LSTM")
    for cell in lstm.cells:
        for key in ("w_ih_t", "w_hh_t"):
            assert cell[key].flags.c_contiguous, key
    assert_close(g(x)[0], _torch_run(m, x, [])[0], rtol=1e-4)
    assert not nf.pack_linear(np.zeros((8, 4), np.float32)).flags.c_contiguous  # (Linear's: a view)
