"""The runtime graph (seeds 002/003) on models exported by pnnx from small torch networks."""

import warnings
import weakref
import zipfile

import numpy as np
import pytest
import torch
from conftest import assert_close
from helpers import export_torch, torch_outputs
from torch import nn

import kuiper_xp
from kuiper_xp import Graph, GraphState
from kuiper_xp.errors import GraphError, InputError, ShapeError


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.ReLU()
        self.b = nn.Sigmoid()

    def forward(self, x):
        return self.a(self.b(self.a(x)))


class TwoInTwoOut(nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x), torch.relu(torch.sigmoid(y))


@pytest.fixture(scope="session")
def chain_param(tmp_path_factory):
    x = torch.randn(1, 3, 8, 8)
    return export_torch(Chain(), (x,), tmp_path_factory.mktemp("chain"))


@pytest.fixture(scope="session")
def chain_dynamic_param(tmp_path_factory):
    return export_torch(Chain(), (torch.randn(1, 3, 8, 8),), tmp_path_factory.mktemp("chaindyn"),
                        inputs2=(torch.randn(4, 3, 8, 8),))


@pytest.fixture(scope="session")
def two_param(tmp_path_factory):
    return export_torch(TwoInTwoOut(), (torch.randn(2, 5), torch.randn(1, 3, 4)),
                        tmp_path_factory.mktemp("two"))


def test_stages_step_by_step(chain_param, backend):
    g = Graph(chain_param, backend=backend)
    assert g.state == GraphState.NeedInit and str(g.state) == "NeedInit"
    with pytest.raises(GraphError, match="NeedInit"):
        _ = g.execution_order
    g.init()
    assert g.state == GraphState.NeedBuild
    assert [r.type for r in g.operators][0] == "pnnx.Input"
    g.build()
    assert g.state == GraphState.Complete
    g.build()  # building twice is a no-op, as in the seed
    types = [r.type for r in g.execution_order]
    assert types == ["nn.ReLU", "nn.Sigmoid", "nn.ReLU"]
    # successors link each operator to the next (seed 002's output_operators)
    first = g.operators[0]
    assert first.type == "pnnx.Input" and [s.type for s in first.successors] == ["nn.ReLU"]


def test_chain_matches_torch(chain_param, backend):
    x = torch.randn(1, 3, 8, 8) * 3
    (y,) = kuiper_xp.load(chain_param, backend=backend)(x.numpy())
    assert_close(y, torch_outputs(Chain(), (x,))[0], rtol=1e-6)


def test_backend_arrays_are_accepted_and_returned(chain_param, backend):
    g = kuiper_xp.load(chain_param, backend=backend)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (y,) = g(backend.asarray(x))
    assert backend.owns(y)
    assert_close(y, torch_outputs(Chain(), (torch.from_numpy(x),))[0], rtol=1e-6)


def test_several_inputs_and_outputs_by_position_and_name(two_param, backend):
    g = kuiper_xp.load(two_param, backend=backend)
    assert len(g.inputs) == 2 and len(g.outputs) == 2
    assert g.inputs[0].shape == (2, 5) and g.inputs[1].shape == (1, 3, 4)
    assert g.inputs[0].dtype == "float32"
    x = torch.randn(2, 5)
    y = torch.randn(1, 3, 4)
    expected = torch_outputs(TwoInTwoOut(), (x, y))
    got = g(x.numpy(), y.numpy())
    for a, e in zip(got, expected):
        assert_close(a, e, rtol=1e-6)
    named = g.run({g.inputs[0].name: x.numpy(), g.inputs[1].name: y.numpy()})
    assert list(named) == [s.name for s in g.outputs]
    for a, e in zip(named.values(), expected):
        assert_close(a, e, rtol=1e-6)


def test_dynamic_batch(chain_dynamic_param, backend):
    g = kuiper_xp.load(chain_dynamic_param, backend=backend)
    assert g.inputs[0].shape[0] is None
    for batch in (1, 3, 7):
        x = torch.randn(batch, 3, 8, 8)
        (y,) = g(x.numpy())
        assert_close(y, torch_outputs(Chain(), (x,))[0], rtol=1e-6, what=f"batch {batch}")


def test_static_batch_is_enforced_with_a_hint(chain_param):
    g = kuiper_xp.load(chain_param, backend="numpy")
    with pytest.raises(InputError, match="static batch"):
        g(np.zeros((2, 3, 8, 8), np.float32))


def test_wrong_inputs_are_clear(chain_param):
    g = kuiper_xp.load(chain_param, backend="numpy")
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(InputError, match="takes 1 input"):
        g(x, x)
    with pytest.raises(InputError, match=r"shape \(1, 3, 8\)"):
        g(x[..., 0])
    with pytest.raises(InputError, match="dtype float64"):
        g(x.astype(np.float64))
    with pytest.raises(InputError, match="unknown input name"):
        g(nope=x)
    name, alias = g.inputs[0].name, "pnnx_input_0"
    assert name != alias
    with pytest.raises(InputError, match=f"given twice, as '{name}' and '{alias}'"):
        g(**{name: x, alias: x + 1})  # (one array was silently dropped)


def test_profile_and_memory_plan(chain_param):
    g = kuiper_xp.load(chain_param, backend="numpy")
    g(np.zeros((1, 3, 8, 8), np.float32), profile=True)
    assert [t for _, t, _ in g.last_profile] == ["nn.ReLU", "nn.Sigmoid", "nn.ReLU"]
    assert all(s >= 0 for _, _, s in g.last_profile)
    # 1x3x8x8 float32 = 768 bytes; along a chain at most two activations are alive at once
    assert g.planned_peak_bytes() == 2 * 768


def test_intermediates_are_released_after_last_use(chain_param):
    import gc
    import weakref

    g = kuiper_xp.load(chain_param, backend="numpy")
    refs = []
    layer = g.execution_order[0].layer
    orig = layer.forward

    def spy(x):
        out = orig(x)
        refs.append(weakref.ref(out))
        return out

    layer.forward = spy
    (y,) = g(np.ones((1, 3, 8, 8), np.float32))
    gc.collect()
    assert refs[0]() is None  # the first ReLU's output was dropped once the Sigmoid consumed it


def _load_text(tmp_path, text):
    """A graph from ``.pnnx.param`` text written to ``tmp_path`` (numpy backend), and its path."""
    p = tmp_path / "m.pnnx.param"
    p.write_text(text)
    return kuiper_xp.load(p, backend="numpy"), p


def test_outputs_are_checked_against_the_annotations_on_every_shape(tmp_path):
    """Each step's output is checked against its ``#`` annotation; a shape that passed once is
    not re-checked, but a new one is (a later batch against a fixed annotated dim), and a dtype
    that differs from the annotation is refused on the first call."""
    from kuiper_xp.errors import ShapeError

    text = ("7767517\n3 2\n"
            "pnnx.Input in0 0 1 0 #0=(?,3)f32\n"
            "nn.ReLU relu 1 1 0 1 #1=(2,3)f32\n"
            "pnnx.Output out 1 0 1\n")
    g, p = _load_text(tmp_path, text)
    x2 = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(g(x2)[0], np.maximum(x2, 0))
    with pytest.raises(ShapeError, match=r"nn.ReLU 'relu'.*output '1' has shape \(4, 3\), the model declares \(2,3\)"):
        g(np.ones((4, 3), np.float32))
    p.write_text(text.replace("#1=(2,3)f32", "#1=(?,4)f32"))
    g4, _ = _load_text(tmp_path, p.read_text())
    with pytest.raises(ShapeError, match=r"declares \(\?,4\) \(pnnx declares a size fixed where both example"):
        g4(x2)
    p.write_text(text)
    g, p = _load_text(tmp_path, text)
    np.testing.assert_array_equal(g(x2)[0], np.maximum(x2, 0))
    p.write_text(text.replace("#1=(2,3)f32", "#1=(2,3)f16"))
    g = kuiper_xp.load(p, backend="numpy")
    with pytest.raises(ShapeError, match="has dtype float32, the model declares float16"):
        g(x2)


def test_expression_dtype_lost_by_pnnx_says_why(tmp_path):
    """``n - torch.tensor(1.5, dtype=torch.float64)`` on an int tensor: pnnx writes the constant
    as a bare literal (float32 arithmetic) but declares torch's float64; the error says so."""
    text = ("7767517\n3 2\n"
            "pnnx.Input in0 0 1 0 #0=(2,3)i64\n"
            "pnnx.Expression e 1 1 0 1 expr=sub(@0,1.5) #0=(2,3)i64 #1=(2,3)f64\n"
            "pnnx.Output out 1 0 1\n")
    g, _ = _load_text(tmp_path, text)
    with pytest.raises(ShapeError, match=r"has dtype float32, the model declares float64 \(pnnx writes a 0-d constant"):
        g(np.arange(6, dtype=np.int64).reshape(2, 3))


class SharedModules(nn.Module):
    """Modules called several times (pnnx writes a copy of their weights per call), two
    LayerNorms equal by construction, and a Linear equal to the shared one but for one weight
    (which must stay apart)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.lin = nn.Linear(16, 16)
        self.ln_a, self.ln_b = nn.LayerNorm(16), nn.LayerNorm(16)
        self.near = nn.Linear(16, 16)
        with torch.no_grad():
            self.near.weight.copy_(self.lin.weight)
            self.near.weight[7, 5] += 0.25  # a value the fingerprint's sample does not see
            self.near.bias.copy_(self.lin.bias)

    def forward(self, x):
        for _ in range(3):
            x = torch.relu(self.conv(x)) + x
        t = x.flatten(2)  # (N, 3, 16)
        for _ in range(4):
            t = self.ln_a(torch.tanh(self.lin(t)) + t)
        return self.ln_b(self.near(t)), t


def test_equal_weights_are_shared(backend, tmp_path):
    from kuiper_xp.layers.conv import Convolution as Conv
    from kuiper_xp.layers.linear import Linear

    torch.manual_seed(0)
    m = SharedModules().eval()
    x = torch.randn(2, 3, 4, 4)
    param = export_torch(m, (x,), tmp_path)
    assert param.read_text().count("nn.Linear") == 5, "pnnx no longer writes a Linear per call"
    g = kuiper_xp.load(param, backend=backend)
    for got, want in zip(g(x.numpy()), torch_outputs(m, (x,))):
        assert_close(kuiper_xp.to_numpy(got), want, rtol=1e-5)
    lins = [r.layer for r in g.operators if isinstance(r.layer, Linear)]
    weights = {id(lin.weight_t) for lin in lins}
    assert len(lins) == 5 and len(weights) == 2  # the four calls share one, `near` keeps its own
    assert g.shared_weights >= 3 + 3 + 2  # linear weights and biases, two conv copies, ln_b
    if backend == "numpy":  # (shared: the packed copies are read-only like the weights read)
        assert not any(lin.weight_t.flags.writeable for lin in lins)
    if backend == "numpy":
        convs = [r.layer for r in g.operators if isinstance(r.layer, Conv)]
        assert len(convs) == 3 and len({id(c._plan) for c in convs}) == 1
        with pytest.raises(ValueError, match="read-only"):
            convs[0].weight[0, 0, 0, 0] = 1.0


class _OneByOnes(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (nn.Conv2d(8, 8, 3, padding=1, groups=8) for _ in range(3))
        self.d, self.e = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.e(torch.tanh(self.d(self.c(self.b(torch.relu(self.a(x)))))))


def test_weights_the_file_holds_once_are_freed_during_the_build(tmp_path, monkeypatch):
    """A weight no other member of the .bin can equal (its shape, dtype and CRC-32 are its own)
    is not held to the end of the build: a depthwise convolution keeps only its re-laid-out
    taps, so the array read from the file is gone before the next layer's weights are read.
    Weights the file holds twice are still compared and shared; a 1x1 convolution's plan uses
    the array read from the file as its matrix (no copy)."""
    from kuiper_xp.layers.conv import Convolution as Conv
    from kuiper_xp.pnnx import binfile

    torch.manual_seed(0)
    m = _OneByOnes().eval()
    with torch.no_grad():
        m.e.weight.copy_(m.d.weight)
        m.e.bias.copy_(m.d.bias)
    x = torch.randn(2, 8, 5, 5)
    param = export_torch(m, (x,), tmp_path)
    read, alive_at_read = [], []
    real_read = binfile.BinReader.read

    def read_and_watch(self, w):
        alive_at_read.append((w.member, [name for name, ref in read if ref() is not None]))
        out = real_read(self, w)
        read.append((w.member, weakref.ref(out)))
        return out

    monkeypatch.setattr(binfile.BinReader, "read", read_and_watch)
    g = kuiper_xp.load(param, backend="numpy")
    (got,) = g(x.numpy())
    assert_close(kuiper_xp.to_numpy(got), torch_outputs(m, (x,))[0], rtol=1e-5)
    unique = {w.member: w.unique for w in g.model.weights}
    assert unique == {"a.weight": True, "a.bias": True, "b.weight": True, "b.bias": True, "c.weight": True,
                      "c.bias": True, "d.weight": False, "d.bias": False, "e.weight": False, "e.bias": False}
    # (a plan keeps its bias, as it is)
    alive = {k: [n for n in v if n.endswith(".weight")] for k, v in alive_at_read}
    assert not alive["b.weight"] and not alive["c.weight"], alive  # freed as their layers were made
    assert alive["e.weight"] == ["d.weight"], alive  # kept to be compared, then shared
    convs = [r.layer for r in g.operators if isinstance(r.layer, Conv)]
    assert convs[3]._plan is convs[4]._plan and len({id(c._plan) for c in convs}) == 4
    d_read = dict(read)["d.weight"]()
    assert d_read is not None and np.shares_memory(convs[3]._plan.wmat, d_read)
    assert g.shared_weights >= 2


class _TiedHead(nn.Module):
    """GPT-2 / BERT-MLM style weight tying: the output projection is the embedding table."""

    def __init__(self, reverse=False):
        super().__init__()
        self.reverse = reverse
        self.emb, self.head = nn.Embedding(11, 8), nn.Linear(8, 11, bias=reverse)
        if reverse:  # the Linear is used first, so pnnx ties the Embedding to it
            self.emb.weight = self.head.weight
        else:
            self.head.weight = self.emb.weight

    def forward(self, ids, x):
        if self.reverse:
            return self.head(x), self.emb(ids).sum(1)
        return self.head(self.emb(ids).mean(1)) + x.sum(1, keepdim=True)


class _TiedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("kind", ["lm_head", "reverse", "conv"])
def test_tied_weights_are_not_taken_for_the_input(kind, backend, tmp_path):
    """pnnx writes the second user of a tied parameter with its own @weight and an extra operand
    from a pnnx.Attribute holding the same values in front of the real input; taken as the
    input, it made the LM head compute ``table @ x.T`` (at batch 11 = out_features silently,
    with the declared shape). The operand is dropped; against torch at batches 1, 3 and 11."""
    torch.manual_seed(0)
    if kind == "conv":
        m = _TiedConv().eval()
        make = lambda b: (torch.randn(b, 4, 6, 6),)  # noqa: E731
    else:
        m = _TiedHead(reverse=kind == "reverse").eval()
        make = lambda b: (torch.randint(0, 11, (b, 4)), torch.randn(b, 8))  # noqa: E731
    param = export_torch(m, make(1), tmp_path, inputs2=make(3))
    text = param.read_text()
    assert "pnnx.Attribute" in text  # (the shape of the file this test is about)
    g = kuiper_xp.load(param, backend=backend)
    for b in (1, 3, 11):
        inputs = make(b)
        expected = torch_outputs(m, inputs)
        got = g(*[i.numpy() for i in inputs])
        assert len(got) == len(expected)
        for a, e in zip(got, expected):
            assert_close(backend.to_numpy(a), e, rtol=1e-5, what=f"{kind} batch {b}")


class _ListAndTwice(nn.Module):
    def forward(self, x):
        a = x * 2
        return [a, x + 1, a]


def test_list_outputs_are_flattened_and_run_keys_stay_unique(tmp_path):
    """``return [a, b, a]``: pnnx writes one list-valued expression; its items are the graph's
    outputs (they came back as one nested list), and ``run`` keys them by position."""
    m = _ListAndTwice().eval()
    x = torch.randn(2, 3)
    g = kuiper_xp.load(export_torch(m, (x,), tmp_path), backend="numpy")
    got = g(x.numpy())
    want = m(x)
    assert len(got) == 3 and all(isinstance(o, np.ndarray) for o in got)
    for a, e in zip(got, want):
        assert_close(a, e.numpy(), rtol=1e-6)
    named = g.run({g.inputs[0].name: x.numpy()})
    assert len(named) == 3 and all("#" in k for k in named)
    with pytest.raises(ValueError, match="positive integer"):
        g.planned_peak_bytes(batch=0)


def test_a_misspelled_parameter_is_named_at_load(tmp_path):
    # a hand-edited .param with `strde=` for `stride=`: the layer read no stride, took its
    # default (1) and ran silently wrong; now the build warns, naming the key and the line
    text = ("7767517\n3 2\npnnx.Input in0 0 1 x #x=(1,2,8,8)f32\n"
            "F.max_pool2d pool 1 1 x y kernel_size=(2,2) {key}=(2,2) padding=(0,0) dilation=(1,1) "
            "ceil_mode=False return_indices=False #x=(1,2,8,8)f32 #y=(1,2,4,4)f32\n"
            "pnnx.Output out0 1 0 y\n")
    with zipfile.ZipFile(tmp_path / "m.pnnx.bin", "w"):
        pass  # (no weights)
    bad = tmp_path / "m.pnnx.param"
    bad.write_text(text.format(key="strde"))
    with pytest.warns(UserWarning, match=r"pool' \(.*m\.pnnx\.param:4\): parameter strde=.*misspelling of 'stride'"):
        kuiper_xp.load(bad)
    bad.write_text(text.format(key="stride"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = kuiper_xp.load(bad)
    x = np.arange(128, dtype=np.float32).reshape(1, 2, 8, 8)
    (y,) = g(x)
    assert_close(np.asarray(y), torch.nn.functional.max_pool2d(torch.from_numpy(x), 2, 2).numpy())


class _ShapeNumbers(nn.Module):
    def forward(self, x):
        return x.sum(), torch.tensor(x.shape[0], dtype=torch.float32) / 2, x.new_tensor(1.0) * x.shape[0]


def test_outputs_computed_from_shapes_alone_are_arrays_of_torchs_dtype(tmp_path):
    # pnnx writes them as expressions of size() alone, which evaluate to Python numbers: they
    # came back as float64 arrays (or Python floats), torch's are float32 tensors
    m = _ShapeNumbers()
    param = export_torch(m, (torch.randn(2, 6),), tmp_path, inputs2=(torch.randn(3, 6),))
    x = torch.randn(5, 6)
    got = kuiper_xp.load(param)(x.numpy())
    for a, e in zip(got, m(x)):
        assert str(a.dtype) == str(e.dtype).removeprefix("torch.") and a.shape == ()
        assert_close(np.asarray(a), e.numpy())


def test_an_error_that_names_its_operator_gets_no_second_note(tmp_path):
    # "nn.Embedding 'e' (...:4): index 25 is out of range ... (while running nn.Embedding 'e' (...:4))"
    m = nn.Sequential(nn.Embedding(20, 8))
    g = kuiper_xp.load(export_torch(m, (torch.randint(0, 20, (2, 5)),), tmp_path))
    with pytest.raises(ShapeError, match="out of range for an embedding table of 20 rows") as info:
        g(np.full((2, 5), 25, np.int64))
    text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert text.count("nn.Embedding '0'") == 1, text


class _IntFloorByFloat(nn.Module):
    def forward(self, a):
        return a // 0.5


def test_an_integer_tensor_floor_divided_by_a_float_names_pnnxs_declared_dtype(tmp_path):
    # pnnx declares float64 for it (`expr=floor_divide(@0,0.5) #1=(1,8)f64`); torch gives float32
    a = torch.randint(-9, 10, (1, 8))
    assert _IntFloorByFloat()(a).dtype == torch.float32
    param = export_torch(_IntFloorByFloat(), (a,), tmp_path)
    if "f64" not in param.read_text():
        pytest.skip("this pnnx declares the dtype torch gives")
    g = kuiper_xp.load(param)
    with pytest.raises(ShapeError, match=r"has dtype float32, the model declares float64 \(pnnx writes .* float32 "
                                         r"for an integer tensor with a Python float .*x\.float\(\) // 0\.5"):
        g(a.numpy())
