"""Graph faults: malformed model structure gives a clear KuiperXPError naming file:line or the
operator; long chains need no recursion."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path

import numpy as np
import pytest

import kuiper_xp
from kuiper_xp.errors import (
    BinFormatError,
    GraphError,
    KuiperXPError,
    ParamFormatError,
    ShapeError,
    UnsupportedOperatorError,
)
from kuiper_xp.runtime.topo import topological_order


def write_model(tmp_path: Path, lines: list[str], n_operands: int | None = None,
                weights: dict[str, np.ndarray] | None = None, name: str = "m") -> Path:
    """A param file from operator lines (header counted unless ``n_operands`` given), and a
    stored-zip .bin when ``weights`` is given."""
    if n_operands is None:
        n_operands = sum(int(ln.split()[3]) for ln in lines)
    param = tmp_path / f"{name}.pnnx.param"
    param.write_text(f"7767517\n{len(lines)} {n_operands}\n" + "\n".join(lines) + "\n")
    if weights is not None:
        with zipfile.ZipFile(tmp_path / f"{name}.pnnx.bin", "w") as z:
            for k, v in weights.items():
                z.writestr(k, np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes())
    return param


def load(param: Path):
    return kuiper_xp.load(param, backend="numpy")


# -- topological order ---------------------------------------------------------------------------

@pytest.mark.parametrize("edges,cycle", [
    ({"a": ["a"]}, "a -> a"),
    ({"a": ["b"], "b": ["a"]}, "a -> b -> a"),
    ({"x": [], "y": ["z"], "z": ["w"], "w": ["y"]}, "y -> z -> w -> y"),
    ({"s": ["t", "u"], "t": [], "u": ["v"], "v": ["u"]}, "u -> v -> u"),
])
def test_cycles_are_graph_errors_naming_the_cycle(edges, cycle):
    with pytest.raises(GraphError, match=f"cycle: {cycle}"):
        topological_order(list(edges), lambda n: edges[n])


def test_cycle_at_the_end_of_a_10000_node_chain():
    n = 10_000
    succ = {i: [i + 1] for i in range(n - 1)}
    succ[n - 1] = [n - 3]
    with pytest.raises(GraphError, match=f"cycle: {n - 3} -> {n - 2} -> {n - 1} -> {n - 3}"):
        topological_order(list(range(n)), lambda i: succ[i], name=str)


def test_10000_node_chain_in_shuffled_order():
    n = 10_000
    nodes = list(range(n))
    random.Random(0).shuffle(nodes)
    order = topological_order(nodes, lambda i: [i + 1] if i + 1 < n else [])
    assert order == list(range(n))


def test_relu_chain_of_10000_ops_loads_and_runs(tmp_path):
    n = 10_000
    lines = ["pnnx.Input in 0 1 0 #0=(2,3)f32"]
    lines += [f"nn.ReLU relu.{k} 1 1 {k} {k + 1} #{k + 1}=(2,3)f32" for k in range(n)]
    lines += [f"pnnx.Output out 1 0 {n}"]
    g = load(write_model(tmp_path, lines))
    assert len(g.execution_order) == n
    x = np.array([[-1, 0, 2], [np.inf, -np.inf, np.nan]], np.float32)
    (y,) = g(x)
    y = kuiper_xp.to_numpy(y)
    np.testing.assert_array_equal(y, np.array([[0, 0, 2], [np.inf, 0, np.nan]], np.float32))
    assert y.dtype == np.float32


# -- structural faults in the .param ----------------------------------------------------------------

def _err_at(exc: BaseException, param: Path, line: int) -> None:
    assert f"{param}:{line}" in str(exc), str(exc)


def test_dangling_input_operand(tmp_path):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 nothere 1", "pnnx.Output out 1 0 1"])
    with pytest.raises(ParamFormatError, match="uses operand 'nothere' before any operator produces it") as e:
        load(p)
    _err_at(e.value, p, 4)


def test_an_input_of_a_dtype_the_backend_lacks_is_refused_at_load(tmp_path):
    """pnnx exports ``torch.randn(1, 4).bfloat16()`` inputs; NumPy has no bfloat16: a clear
    error at load, not a ValueError from inside numpy at the first call."""
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0 #0=(?,4)bf16", "nn.ReLU r 1 1 0 1 #0=(?,4)bf16 #1=(?,4)bf16",
                               "pnnx.Output out 1 0 1"])
    with pytest.raises(GraphError, match=r"input 0 \(0\) is declared bfloat16, a dtype backend numpy does not "
                                         r"have; export the model with float32 inputs"):
        load(p)
    # before any layer is built: a softmax of float16 on array_api_strict (no float16) failed
    # building its layer with an AttributeError
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0 #0=(2,4)f16", "F.softmax s 1 1 0 1 dim=-1 #0=(2,4)f16 #1=(2,4)f16",
                               "pnnx.Output out 1 0 1"])
    with pytest.raises(GraphError, match=r"input 0 \(0\) is declared float16, a dtype backend array_api_strict"):
        kuiper_xp.load(p, backend="array_api_strict")


def test_a_float_declared_for_a_boolean_expression_names_pnnx_s_dropped_cast(tmp_path):
    """``(x > 0) * 1.0 + (x > 1) * 1.0``: pnnx drops both ``* 1.0`` and declares float32 for
    the sum of two masks; the error says so and how to write the model instead."""
    p = write_model(tmp_path, [
        "pnnx.Input in 0 1 0 #0=(?,4)f32", "torch.gt a 1 1 0 1 other=0.0 #0=(?,4)f32 #1=(?,4)bool",
        "torch.gt b 1 1 0 2 other=1.0 #0=(?,4)f32 #2=(?,4)bool",
        "pnnx.Expression e 2 1 1 2 3 expr=add(@0,@1) #1=(?,4)bool #2=(?,4)bool #3=(?,4)f32",
        "pnnx.Output out 1 0 3"])
    g = load(p)
    with pytest.raises(ShapeError, match=r"has dtype bool, the model declares float32 \(pnnx drops a "
                                         r"multiplication .* write mask.float\(\)"):
        g(np.array([[-1.0, 0.5, 2.0, 0.0]], np.float32))


def test_dead_branch_is_pruned_and_the_rest_runs(tmp_path):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1", "nn.Sigmoid unused 1 1 0 2",
                               "pnnx.Output out 1 0 1"])
    g = load(p)
    assert [r.name for r in g.execution_order] == ["r"] and [r.name for r in g.pruned] == ["unused"]
    (y,) = g(np.array([-1.0, 1.0], np.float32))
    np.testing.assert_array_equal(kuiper_xp.to_numpy(y), [0.0, 1.0])


def test_duplicate_operator_names(tmp_path):
    """A name given twice is refused where the second operator has weights (they are read from
    the .bin by name); without weights it is renamed with a warning: pnnx itself writes such
    files (a torch.unbind and a Tensor.select both named 'Tensor.select_2')."""
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1", "nn.PReLU r 1 1 1 2 @weight=(1)f32",
                               "pnnx.Output out 1 0 2"], weights={"r.weight": np.full(1, 0.5, np.float32)})
    with pytest.raises(ParamFormatError, match="duplicate operator name 'r' on an operator with weights") as e:
        load(p)
    _err_at(e.value, p, 5)
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1", "F.hardtanh r 1 1 1 2 max_val=0.5 min_val=0.0",
                               "pnnx.Output out 1 0 2"], name="ok")
    with pytest.warns(UserWarning, match="duplicate operator name 'r': renamed 'r@line5'"):
        g = load(p)
    np.testing.assert_array_equal(np.asarray(g(np.array([-1.0, 0.25, 2.0], np.float32))[0]), [0.0, 0.25, 0.5])


def test_operand_produced_twice(tmp_path):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1", "nn.Sigmoid s 1 1 0 1",
                               "pnnx.Output out 1 0 1"], n_operands=2)
    with pytest.raises(ParamFormatError, match=r"operand '1' is produced twice: again by nn.Sigmoid 's' "
                                               r"\(first by nn.ReLU 'r', line 4\)") as e:
        load(p)
    _err_at(e.value, p, 5)


def test_no_output_operator(tmp_path):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1"])
    with pytest.raises(GraphError, match="no pnnx.Output"):
        load(p)


def test_output_operator_that_produces_something(tmp_path):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "pnnx.Output out 1 1 0 1"])
    with pytest.raises(GraphError, match=r"pnnx.Output 'out' \(.*m\.pnnx\.param:4\): pnnx.Output must have no outputs"):
        load(p)


def test_input_operator_with_inputs(tmp_path):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "pnnx.Input in2 1 1 0 1", "pnnx.Output out 1 0 1"])
    with pytest.raises(GraphError, match=r"pnnx.Input 'in2' .*must have 0 inputs and 1 output"):
        load(p)


def test_output_of_an_input_is_identity(tmp_path):
    g = load(write_model(tmp_path, ["pnnx.Input in 0 1 0 #0=(2)f32", "pnnx.Output out 1 0 0"]))
    x = np.array([1.5, -2], np.float32)
    (y,) = g(x)
    np.testing.assert_array_equal(kuiper_xp.to_numpy(y), x)


@pytest.mark.parametrize("lines,n_operands,line,pattern", [
    (["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1", "pnnx.Output out 1 0 1"], 1, 4, "more operands than the 1"),
    (["pnnx.Input in 0 1 0", "nn.ReLU r 2 1 0 1 2", "pnnx.Output out 1 0 2"], 2, 4, "uses operand '1' before"),
    (["pnnx.Input in 0 1 0", "nn.ReLU r 1 2 0 1", "pnnx.Output out 1 0 1"], 2, 4,
     "declares '1' inputs and '2' outputs but the line has only 2 names"),
    (["pnnx.Input in 0 1 0", "nn.ReLU r 1 1 0 1 2", "pnnx.Output out 1 0 1"], 2, 4, "expected key=value, found '2'"),
])
def test_counts_that_do_not_match_the_lists(tmp_path, lines, n_operands, line, pattern):
    p = write_model(tmp_path, lines, n_operands=n_operands)
    with pytest.raises(ParamFormatError, match=pattern) as e:
        load(p)
    _err_at(e.value, p, line)


def test_header_operator_count_that_does_not_match(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_text("7767517\n5 2\npnnx.Input in 0 1 0\nnn.ReLU r 1 1 0 1\npnnx.Output out 1 0 1\n")
    with pytest.raises(ParamFormatError, match="declares 5 operators but the file has 3 operator lines") as e:
        load(p)
    _err_at(e.value, p, 2)


def test_unknown_operator_types_are_listed_all_at_once(tmp_path):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", "nn.Frobnicate f1 1 1 0 1", "nn.ReLU r 1 1 1 2",
                               "torch.wibble w 1 1 2 3", "nn.Frobnicate f2 1 1 3 4", "pnnx.Output out 1 0 4"])
    with pytest.raises(UnsupportedOperatorError) as e:
        load(p)
    msg = str(e.value)
    assert "3 operator(s) of 2 unsupported type(s) (nn.Frobnicate, torch.wibble)" in msg
    for name, line in (("f1", 4), ("w", 6), ("f2", 7)):
        assert f"'{name}' ({p}:{line})" in msg, msg
    assert "types are supported (docs/operators.md" in msg and "did you mean" not in msg


@pytest.mark.parametrize("ops,needles", [
    (["nn.Relu6 r 1 1 0 1", "torch.mT t 1 1 1 2"],
     ["nn.Relu6: did you mean nn.ReLU6,", "torch.mT: did you mean aten::mT?"]),
    # swapped letters; prim::If from a torch.jit.script model: export the traced module
    (["F.rleu r 1 1 0 1", "prim::If c 1 1 1 2"],
     ["F.rleu: did you mean F.relu", "control flow of a torch.jit.script model", "pnnx.export"]),
    # random sampling (a VAE's reparameterisation): make the noise an input
    (["torch.randn_like n 1 1 0 1", "aten::normal m 1 1 1 2"],
     ["aten::normal, torch.randn_like: random sampling inside the model", "make the noise an input"]),
])
def test_unknown_operator_types_get_hints(tmp_path, ops, needles):
    p = write_model(tmp_path, ["pnnx.Input in 0 1 0", *ops, "pnnx.Output out 1 0 2"])
    with pytest.raises(UnsupportedOperatorError) as e:
        load(p)
    msg = str(e.value)
    for needle in needles:
        assert needle in msg, msg
    assert isinstance(e.value, NotImplementedError)


def test_missing_magic_line(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_text("2 1\npnnx.Input in 0 1 0\npnnx.Output out 1 0 0\n")
    with pytest.raises(ParamFormatError, match=r"m\.pnnx\.param:1: missing magic line: expected 7767517, found '2 1'"):
        load(p)


# -- the .bin -------------------------------------------------------------------------------------

ATTR = ["pnnx.Attribute cst 0 1 0 @data=(2,3)f32 #0=(2,3)f32", "nn.Sigmoid s 1 1 0 1", "pnnx.Output out 1 0 1"]


def test_attribute_model_runs(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    (y,) = load(write_model(tmp_path, ATTR, weights={"cst.data": w}))()
    np.testing.assert_allclose(kuiper_xp.to_numpy(y), 1 / (1 + np.exp(-w)), rtol=1e-6)


def test_wrong_sized_bin_member(tmp_path):
    p = write_model(tmp_path, ATTR, weights={"cst.data": np.zeros(5, np.float32)})
    with pytest.raises(BinFormatError, match=r"member 'cst.data' holds 20 bytes but the .param declares "
                                             r"\(2, 3\) f32 = 24 bytes"):
        load(p)


def test_missing_bin_member(tmp_path):
    p = write_model(tmp_path, ATTR, weights={"other.data": np.zeros(6, np.float32)})
    with pytest.raises(BinFormatError, match=r"member 'cst.data' \(weight 'data' of operator 'cst', "
                                             r"declared \(2, 3\) f32\) is missing"):
        load(p)


def test_missing_bin_file(tmp_path):
    p = write_model(tmp_path, ATTR)
    with pytest.raises(FileNotFoundError, match=r"m\.pnnx\.bin: weight file not found"):
        load(p)


def test_bin_that_is_not_a_zip(tmp_path):
    p = write_model(tmp_path, ATTR)
    (tmp_path / "m.pnnx.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(BinFormatError, match="not a valid pnnx .bin zip archive"):
        load(p)


def test_every_error_here_is_a_kuiper_error():
    for cls in (BinFormatError, GraphError, ParamFormatError, UnsupportedOperatorError):
        assert issubclass(cls, KuiperXPError)


# -- plausible files that do not add up (session 23's semantic mutations of real exports) --------

def test_module_weight_given_also_as_input_is_refused(tmp_path):
    """An nn.LayerNorm with its own @weight and a second input computed LN(x) * input + bias,
    silently ignoring @weight (an nn.Linear given x twice computed x @ x^T): pnnx never writes
    both, so the file is refused at load, naming the operator."""
    rng = np.random.default_rng(0)
    w = {"ln.weight": rng.standard_normal(6).astype(np.float32),
         "ln.bias": rng.standard_normal(6).astype(np.float32)}
    param = write_model(tmp_path, [
        "pnnx.Input in0 0 1 0 #0=(?,6)f32",
        "pnnx.Input in1 0 1 1 #1=(?,6)f32",
        "nn.LayerNorm ln 2 1 0 1 2 elementwise_affine=True eps=1e-05 normalized_shape=(6) "
        "@bias=(6)f32 @weight=(6)f32 #0=(?,6)f32 #1=(?,6)f32 #2=(?,6)f32",
        "pnnx.Output out 1 0 2"], weights=w)
    with pytest.raises(KuiperXPError, match=r"nn.LayerNorm 'ln'.*'weight' is given twice"):
        load(param)
    w = {"fc.weight": rng.standard_normal((4, 4)).astype(np.float32),
         "fc.bias": rng.standard_normal(4).astype(np.float32)}
    param = write_model(tmp_path, [
        "pnnx.Input in0 0 1 0 #0=(4,4)f32",
        "nn.Linear fc 2 1 0 0 1 bias=True in_features=4 out_features=4 @bias=(4)f32 @weight=(4,4)f32 "
        "#0=(4,4)f32 #1=(4,4)f32",
        "pnnx.Output out 1 0 1"], weights=w, name="fc")
    with pytest.raises(KuiperXPError, match=r"nn.Linear 'fc'.*'weight' is given twice"):
        load(param)


@pytest.mark.parametrize("line,n", [
    ("F.relu r 2 1 0 0 1 #0=(1,3,4,4)f32 #1=(1,3,4,4)f32", 2),
    ("F.softmax s 0 1 1 dim=1 #1=(1,3,4,4)f32", 0),
])
def test_wrong_number_of_inputs_is_refused_at_load(tmp_path, line, n):
    """Was found only at the first call, as a TypeError from inside the layer."""
    param = write_model(tmp_path, ["pnnx.Input in 0 1 0 #0=(1,3,4,4)f32", line, "pnnx.Output out 1 0 1"])
    with pytest.raises(KuiperXPError, match=rf"gives it {n} input\(s\); F\.\w+ takes 1"):
        load(param)


def _refused_at_load(tmp_path, input_shape: str, line: str, match: str, weights=None) -> None:
    """A one-operator model (input ``#0=input_shape``, ``line``, output 1) refused by load()."""
    param = write_model(tmp_path, [f"pnnx.Input in 0 1 0 #0={input_shape}f32", line, "pnnx.Output out 1 0 1"],
                        weights=weights)
    with pytest.raises(KuiperXPError, match=match):
        load(param)


def test_group_norm_weight_of_the_wrong_length_is_refused_at_load(tmp_path):
    _refused_at_load(tmp_path, "(1,4,3,3)",
                     "nn.GroupNorm gn 1 1 0 1 affine=True eps=1e-05 num_channels=4 num_groups=2 @bias=(4)f32 "
                     "@weight=(3)f32 #0=(1,4,3,3)f32 #1=(1,4,3,3)f32",
                     r"nn.GroupNorm 'gn'.*@weight has shape \(3,\), expected \(4,\)",
                     {"gn.weight": np.ones(3, np.float32), "gn.bias": np.zeros(4, np.float32)})


def test_none_parameter_takes_torchs_default(tmp_path):
    """``count_include_pad=None`` was read as False (torch's default is True) and
    ``negative_slope=None`` failed inside the fusion pass with a TypeError: None now means the
    parameter's default, as in torch's own ``align_corners=None``."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)
    param = write_model(tmp_path, [
        "pnnx.Input in 0 1 0 #0=(1,2,5,5)f32",
        "F.avg_pool2d p 1 1 0 1 ceil_mode=False count_include_pad=None divisor_override=None "
        "kernel_size=(3,3) padding=(1,1) stride=(2,2) #0=(1,2,5,5)f32 #1=(1,2,3,3)f32",
        "F.leaky_relu r 1 1 1 2 negative_slope=None #1=(1,2,3,3)f32 #2=(1,2,3,3)f32",
        "pnnx.Output out 1 0 2"])
    want = torch.nn.functional.leaky_relu(torch.nn.functional.avg_pool2d(
        torch.from_numpy(x), 3, 2, 1, count_include_pad=True)).numpy()
    for fuse in (True, False):
        got = kuiper_xp.load(param, backend="numpy", fuse=fuse)(x)[0]
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("line,msg", [
    ("nn.Conv1d c 1 1 0 1 bias=False dilation=(1) groups=4 in_channels=4 kernel_size=(3) out_channels=4 "
     "padding=(100000000) padding_mode=zeros stride=(1) @weight=(4,1,3)f32 #0=(?,4,8,8)f32 #1=(?,4,8,8)f32",
     r"give an output length of 200000006 for the declared input length 8; the file declares 8"),
    ("F.upsample up 1 1 0 1 align_corners=False mode=bilinear size=(40000,40000) $input=0 "
     "#0=(?,4,8,8)f32 #1=(?,4,16,16)f32", r"size=\[40000, 40000\] but the file declares the output \(\?, 4, 16, 16\)"),
])
def test_parameters_that_contradict_declared_sizes_are_refused_before_allocating(tmp_path, line, msg):
    """A padding of 10**8 or an upsampling size of 40000x40000 in a file that declares small
    outputs asked numpy for gigabytes at the first call; refused at load now."""
    line = line.replace("#0=(?,4,8,8)f32 #1=(?,4,8,8)f32", "#0=(?,4,8)f32 #1=(?,4,8)f32")
    param = write_model(tmp_path, ["pnnx.Input in 0 1 0 " + line.split()[-2], line,
                                   "pnnx.Output out 1 0 1"], weights={"c.weight": np.ones((4, 1, 3), np.float32)})
    with pytest.raises(KuiperXPError, match=msg):
        load(param)


@pytest.mark.parametrize("line,error,msg", [
    ("torch.topk s 1 2 0 1 2 dim=3 k=2 largest=True sorted=True $input=0", ShapeError,
     r"dim 3 is out of range for an input with 2 dimension"),
    ("torch.lt lt 1 1 0 1 other=None $input=0", KuiperXPError, r"parameter other=None; torch.lt needs a number"),
    ("Tensor.masked_fill mf 2 1 0 0 1 value=None", KuiperXPError, r"parameter value=None"),
    ("F.pad p 1 1 0 1 mode=replicate pad=(1,1000000000000) value=None $input=0", KuiperXPError,
     r"over the limit max_tensor_elements"),
    ("F.pad p 1 1 0 1 mode=constant pad=(0,3000000000) value=0.0 $input=0", KuiperXPError,
     r"over the limit max_tensor_elements"),
    ("F.adaptive_avg_pool1d p 1 1 0 1 output_size=(1000000000000) $input=0", KuiperXPError,
     r"over the limit max_tensor_elements"),
    ("torch.einsum e 2 1 0 0 1 equation=ij,jk->ikk", KuiperXPError, r"einsum output 'ikk' repeats an index"),
    ("torch.einsum e 2 1 0 0 1 equation=None", KuiperXPError, r"'equation' should be an einsum equation"),
    ("torch.split s 1 1 0 1 dim=1 split_size_or_sections=() $tensor=0", KuiperXPError,
     r"'split_size_or_sections' is empty"),
])
def test_mutated_parameters_are_refused_not_run(tmp_path, line, error, msg):
    """Session 23's second round of semantic mutations: a dim out of range wrapped modulo the
    rank (topk/gather/index_select/sort/normalize: silently another axis), None operands read
    as NaN / False, pads and pooling sizes of 10**9-10**12 hanging in Python loops or asking
    for tens of GiB, malformed einsum equations failing inside numpy or with AttributeError."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    if "masked_fill" in line:
        x = x > 0.5
    param = write_model(tmp_path, ["pnnx.Input in 0 1 0", line, "pnnx.Output out 1 0 1"])
    with pytest.raises(error, match=msg):
        g = load(param)
        g(x if "einsum" not in line else x[:, :3])


@pytest.mark.parametrize("attrs,missing", [("@weight=(6)f32", "bias"), ("@bias=(6)f32", "weight")])
def test_affine_norm_missing_a_weight_is_refused(tmp_path, attrs, missing):
    """affine=True with @bias or @weight missing ran with 0 / 1 in its place (1.3-6.4 off)."""
    ws = {f"n.{k}": np.ones(6, np.float32) for k in ("weight", "bias") if f"@{k}" in attrs}
    _refused_at_load(tmp_path, "(1,6,4,4)",
                     f"nn.InstanceNorm2d n 1 1 0 1 affine=True eps=1e-05 num_features=6 track_running_stats=False "
                     f"{attrs}", f"affine=True but @{missing} is missing", ws)


def test_linear_bias_false_with_a_stored_bias_is_refused(tmp_path):
    _refused_at_load(tmp_path, "(1,2)",
                     "nn.Linear c 1 1 0 1 bias=False in_features=2 out_features=2 @bias=(2)f32 @weight=(2,2)f32 "
                     "#0=(1,2)f32 #1=(1,2)f32", "bias=False but the file has a weight 'bias'",
                     {"c.weight": np.ones((2, 2), np.float32), "c.bias": np.ones(2, np.float32)})


@pytest.mark.parametrize("op_type", ["nn.Conv2d", "nn.Conv3d"])
def test_bias_false_with_a_stored_bias_is_refused(tmp_path, op_type):
    """nn.Conv2d used the stored @bias and nn.Conv3d ignored it: two answers to one file."""
    nd = 3 if op_type.endswith("3d") else 2
    k = ",".join(["1"] * nd)
    shape = ",".join(["4"] * nd)
    _refused_at_load(tmp_path, f"(1,2,{shape})",
                     f"{op_type} c 1 1 0 1 bias=False dilation=({k}) groups=1 in_channels=2 kernel_size=({k}) "
                     f"out_channels=2 padding=({','.join(['0'] * nd)}) padding_mode=zeros stride=({k}) @bias=(2)f32 "
                     f"@weight=(2,2,{k})f32 #0=(1,2,{shape})f32 #1=(1,2,{shape})f32",
                     "bias=False but the file has a weight 'bias'",
                     {"c.weight": np.ones((2, 2) + (1,) * nd, np.float32), "c.bias": np.ones(2, np.float32)})


def test_attention_flags_that_contradict_the_file_are_refused(tmp_path):
    """An nn.MultiheadAttention line edited to bias=False kept using its stored biases (5.0 off
    a real bias-free attention), and with bias=True and in_proj_bias removed ran without it
    (0.46 off); scaled_dot_product_attention's is_causal=None ran non-causally."""
    torch = pytest.importorskip("torch")
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import export_torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            y = self.a(x, x, x, need_weights=False)[0]
            return torch.nn.functional.scaled_dot_product_attention(y, y, y, is_causal=True)

    param = export_torch(M().eval(), (torch.randn(2, 5, 8),), tmp_path, inputs2=(torch.randn(3, 5, 8),))
    text = param.read_text()
    assert " bias=True " in text and "is_causal=True" in text
    load(param)  # (the export itself loads)
    for old, new, msg in [(" bias=True ", " bias=False ", r"bias=False, but in_proj_bias is present"),
                          (" @in_proj_bias=(24)f32", "", r"bias=True, but in_proj_bias is absent"),
                          ("is_causal=True", "is_causal=None", r"is_causal=None; it should be True or False")]:
        param.write_text(text.replace(old, new, 1))
        with pytest.raises(KuiperXPError, match=msg):
            load(param)
