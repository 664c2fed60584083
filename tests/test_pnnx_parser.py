"""The ``.pnnx.param`` parser and the ``.pnnx.bin`` reader on every value type of PNNX.md, both
zip layouts, and the bundled real pnnx export. Expected values are written out by hand from the
format description, never taken from the parser."""

from __future__ import annotations

import math
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kuiper_xp.errors import BinFormatError, KuiperXPError, ParamFormatError
from kuiper_xp.pnnx import BinReader, load_model, parse_param, parse_param_text, parse_value
from kuiper_xp.pnnx.ir import DTYPES

DATA = Path(__file__).resolve().parent.parent / "kuiper_xp" / "data"
DIGITS = DATA / "digits.pnnx.param"


def write_bin(path: Path, members: dict[str, bytes], layout: str = "classic") -> Path:
    """A .pnnx.bin: ``classic`` (32-bit sizes in the local headers), ``zip64`` (local headers
    with 0xffffffff sizes and a zip64 extra field, as current pnnx writes), or ``deflated``."""
    comp = zipfile.ZIP_DEFLATED if layout == "deflated" else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=comp) as z:
        for name, data in members.items():
            if layout == "zip64":
                with z.open(name, "w", force_zip64=True) as f:
                    f.write(data)
            else:
                z.writestr(name, data)
    return path


# -- parameter values -------------------------------------------------------------------------

VALUES = [
    # '%' -> string, whatever else it looks like
    ("%x", "%x"), ("1%", "1%"), ("(%a,%b)", "(%a,%b)"),
    # none
    ("None", None), ("()", None), ("[]", None),
    # bool
    ("True", True), ("False", False),
    # lists of int / float / string, one-element tuple
    ("(3)", [3]), ("(1,2)", [1, 2]), ("[1,2,3]", [1, 2, 3]), ("(-1,0)", [-1, 0]),
    ("(1.5,2.0)", [1.5, 2.0]), ("(1e-05,3)", [1e-05, 3]), ("(a,b)", ["a", "b"]),
    ("(2147483647)", [2147483647]), ("(True,False)", [True, False]),
    # leading non-digit -> string (reflect contains an 'e': the string test comes first)
    ("reflect", "reflect"), ("zeros", "zeros"), ("bilinear", "bilinear"), ("nearest", "nearest"),
    ("trunc", "trunc"), ("inf", "inf"), ("nan", "nan"),
    # floats
    ("1e-05", 1e-05), ("1.000000e-05", 1e-05), ("0.5", 0.5), ("-0.25", -0.25),
    ("5.000000e+00", 5.0), ("1e999", math.inf),
    # ints
    ("0", 0), ("7", 7), ("-1", -1), ("-128", -128), ("2147483647", 2147483647),
    ("-2147483648", -2147483648), ("9223372036854775807", 9223372036854775807),
]


@pytest.mark.parametrize("text,expected", VALUES, ids=[v[0] for v in VALUES])
def test_parse_value(text, expected):
    got = parse_value(text)
    assert got == expected and type(got) is type(expected), f"{text!r} -> {got!r}"


def test_negative_infinity_and_nan_floats():
    assert parse_value("-inf") == -math.inf
    assert math.isnan(parse_value("-nan"))


@pytest.mark.parametrize("bad", ["(1,,2)", "(1,2", "[1)", "(", "["])
def test_malformed_list_values_name_file_line_and_key(bad):
    text = f"7767517\n1 1\npnnx.Input in 0 1 0 k={bad}\n"
    with pytest.raises(ParamFormatError, match=r"m\.param:3: .*'k'"):
        parse_param_text(text, "m.param")


def test_typed_accessors_on_parsed_params():
    text = ("7767517\n1 1\npnnx.Input in 0 1 0 a=1e-05 b=(3) c=(1,2) d=reflect e=True f=-inf "
            "g=inf h=None i=2147483647\n")
    op = parse_param_text(text).operators[0]
    assert op.param("a", float) == 1e-05
    assert op.ints("b", 2) == (3, 3)
    assert op.ints("c", 2) == (1, 2)
    assert op.param("d", str) == "reflect"
    assert op.param("e", bool) is True
    assert op.param("f", float) == -math.inf
    assert op.param("g", float) == math.inf  # 'inf' is a string by pnnx's rules; float() takes it
    assert op.param("h", int) is None
    assert op.param("i", int) == 2147483647
    assert op.param("zz", int, default=4) == 4
    with pytest.raises(KuiperXPError, match=r"'d' should be int, found 'reflect'"):
        op.param("d", int)
    with pytest.raises(KuiperXPError, match=r"'zz' is missing"):
        op.param("zz")


# -- operator lines -------------------------------------------------------------------------

SMALL = """7767517
5 4
pnnx.Input               pnnx_input_0             0 1 x.in #x.in=(?,3,?,8)f32

nn.ReLU                  features.0.act           1 1 x.in a.1 #x.in=(?,3,?,8)f32 #a.1=(?,3,?,8)f32
pnnx.Attribute           pnnx_attr_0              0 1 c @data=(3,1,1)f32 #c=(3,1,1)f32
torch.add                add.1                    2 1 a.1 c d $input=a.1 $other=c alpha=1 #d=(?,3,?,8)f32
pnnx.Output              pnnx_output_0            1 0 d
"""


def test_small_model_structure():
    m = parse_param_text(SMALL, "small.param")
    assert [op.type for op in m.operators] == ["pnnx.Input", "nn.ReLU", "pnnx.Attribute", "torch.add",
                                                "pnnx.Output"]
    assert [op.line for op in m.operators] == [3, 5, 6, 7, 8]  # the blank line counts
    assert list(m.operands) == ["x.in", "a.1", "c", "d"]
    relu = m.operators[1]
    assert relu.name == "features.0.act"
    assert relu.inputs[0] is m.operands["x.in"] and relu.outputs[0] is m.operands["a.1"]
    assert m.operands["x.in"].shape == (None, 3, None, 8) and m.operands["x.in"].dtype == "f32"
    assert m.operands["x.in"].array_dtype == "float32"
    assert m.operands["x.in"].producer is m.operators[0]
    assert m.operands["x.in"].consumers == [relu]
    add = m.operators[3]
    assert add.input_names == ["input", "other"]
    assert add.params == {"alpha": 1}
    w = m.operators[2].attrs["data"]
    assert (w.op_name, w.name, w.shape, w.dtype, w.member, w.nbytes) == (
        "pnnx_attr_0", "data", (3, 1, 1), "f32", "pnnx_attr_0.data", 12)
    assert m.operators[2].where == "pnnx.Attribute 'pnnx_attr_0' (small.param:6)"


def test_crlf_blank_lines_and_bom_are_accepted():
    crlf = SMALL.replace("\n", "\r\n")
    a, b = parse_param_text(SMALL), parse_param_text("\ufeff" + "\n\n" + crlf + "\r\n\r\n")
    assert [(o.type, o.name) for o in a.operators] == [(o.type, o.name) for o in b.operators]
    assert [o.shape for o in a.operands.values()] == [o.shape for o in b.operands.values()]
    # line numbers follow the file as it is: two blank lines were added in front
    assert [o.line for o in b.operators] == [o.line + 2 for o in a.operators]


@pytest.mark.parametrize("odd", ["\x1c", "\x1d", "\x1e", "\x1f", "\u00a0", "\u2028", "\x85"])
def test_only_ascii_space_tab_cr_vt_ff_separate_tokens(odd):
    """pnnx's reader splits at ASCII whitespace only: an operator name holding a character that
    Python's str.split() also takes for a space (0x1c-0x1f, NBSP, U+2028, NEL) stays one name,
    while tabs, vertical tabs and form feeds between the tokens separate them."""
    text = ("7767517\n3 3\npnnx.Input in0 0 1 a #a=(1,4)f32\n"
            f"nn.ReLU relu{odd}x 1 1 a b\n"
            "pnnx.Output \t out0\x0b1\x0c0 b\n")
    m = parse_param_text(text)
    assert [o.name for o in m.operators] == ["in0", f"relu{odd}x", "out0"]
    assert [o.type for o in m.operators] == ["pnnx.Input", "nn.ReLU", "pnnx.Output"]
    assert m.operators[1].inputs[0].name == "a" and m.operators[2].inputs[0].name == "b"


def test_repeated_parameter_texts_give_each_operator_its_own_values():
    """Equal parameter texts are parsed once per file; a list value is still each operator's own."""
    text = ("7767517\n4 3\npnnx.Input in0 0 1 a #a=(1,2,4,4)f32\n"
            "nn.MaxPool2d p1 1 1 a b kernel_size=(2,2) stride=(2,2) ceil_mode=False\n"
            "nn.MaxPool2d p2 1 1 b c kernel_size=(2,2) stride=(2,2) ceil_mode=False\n"
            "pnnx.Output out0 1 0 c\n")
    m = parse_param_text(text)
    p1, p2 = m.operators[1].params, m.operators[2].params
    assert p1 == p2 == {"kernel_size": [2, 2], "stride": [2, 2], "ceil_mode": False}
    p1["kernel_size"].append(9)
    assert p2["kernel_size"] == [2, 2] and p1["stride"] is not p2["stride"]


def test_parse_param_reads_a_file_with_bom_and_crlf(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_bytes(b"\xef\xbb\xbf" + SMALL.replace("\n", "\r\n").encode())
    assert len(parse_param(p).operators) == 5


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_weight_dtypes(dtype):
    op = parse_param_text(f"7767517\n1 1\npnnx.Attribute a 0 1 0 @data=(2,3){dtype}\n").operators[0]
    w = op.attrs["data"]
    sizes = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1,
             "bool": 1, "c64": 8, "c128": 16, "c32": 4}
    assert w.shape == (2, 3) and w.dtype == dtype and w.nbytes == 6 * sizes[dtype]


def test_scalar_and_empty_weight_shapes():
    op = parse_param_text("7767517\n1 1\npnnx.Attribute a 0 1 0 @s=()f32 @e=(0,4)f32\n").operators[0]
    assert op.attrs["s"].shape == () and op.attrs["s"].nbytes == 4
    assert op.attrs["e"].shape == (0, 4) and op.attrs["e"].nbytes == 0


def test_shape_annotation_with_unknown_dims_and_minus_one():
    m = parse_param_text("7767517\n1 1\npnnx.Input a 0 1 0 #0=(?,-1,5)i64\n")
    assert m.operands["0"].shape == (None, None, 5) and m.operands["0"].array_dtype == "int64"


def test_input_keys_name_repeated_operands_in_order():
    m = parse_param_text("7767517\n2 2\npnnx.Input in 0 1 0\ntorch.mul m 2 1 0 0 1 $input=0 $other=0\n")
    assert m.operators[1].input_names == ["input", "other"]


@pytest.mark.parametrize("text,line,pattern", [
    ("", 1, "magic"),
    ("7767518\n0 0\n", 1, "missing magic line"),
    ("\n\nhello\n0 0\n", 3, "missing magic line"),
    ("7767517\n", 2, "operator_count"),
    ("7767517\n1\n", 2, "operator_count"),
    ("7767517\n-1 0\n", 2, "negative"),
    ("7767517\n1 1\n", 2, "declares 1 operators but the file has 0"),
    ("7767517\n1 1\npnnx.Input a 0 1 0\npnnx.Output b 1 0 0\n", 4, "declares 1 operators but the file has 2"),
    ("7767517\n2 1\npnnx.Input a 0 1 0\npnnx.Input b 0 1 1\n", 4, "more operands than the 1"),
    ("7767517\n1 1\npnnx.Input a 0\n", 3, "needs '<type> <name> <n_in> <n_out>"),
    ("7767517\n1 1\npnnx.Input a x 1 0\n", 3, "non-negative integers"),
    ("7767517\n1 1\npnnx.Input a -1 1 0\n", 3, "non-negative integers"),
    ("7767517\n1 1\npnnx.Input a 0 2 0\n", 3, "declares '0' inputs and '2' outputs"),
    ("7767517\n1 1\npnnx.Input a 0 1 0 1\n", 3, "expected key=value, found '1'"),
    ("7767517\n2 2\npnnx.Input a 0 1 0\nnn.PReLU a 1 1 0 1 @weight=(1)f32\n", 4,
     "duplicate operator name 'a' on an operator with weights"),
    ("7767517\n2 1\npnnx.Input a 0 1 0\nnn.ReLU r 1 1 0 0\n", 4, "produced twice"),
    ("7767517\n1 1\nnn.ReLU r 1 1 7 0\n", 3, "uses operand '7' before"),
    ("7767517\n1 1\npnnx.Input a 0 1 0 @w=(2,?)f32\n", 3, "dynamic shape"),
    ("7767517\n1 1\npnnx.Input a 0 1 0 @w=(2)f33\n", 3, "unknown dtype 'f33'"),
    ("7767517\n1 1\npnnx.Input a 0 1 0 @w=2f32\n", 3, r"expected '\(d0,d1"),
    ("7767517\n1 1\npnnx.Input a 0 1 0 #0=(2,x)f32\n", 3, "bad dimension 'x'"),
    ("7767517\n1 1\npnnx.Input a 0 1 0 #0=(2,\u0663)f32\n", 3, "bad dimension '\u0663'"),  # (a digit to str.isdigit)
    ("7767517\n1 1\npnnx.Input a 0 1 0 #0=(+2)f32\n", 3, r"bad dimension '\+2'"),
    ("7767517\n2 2\npnnx.Input a 0 1 0 #0=(2,x)f32\nnn.ReLU r 1 1 0 1 #0=(2,x)f32\n", 3, "bad dimension 'x'"),
    ("7767517\n1 1\npnnx.Input a 0 1 0 #9=(2)f32\n", 3, "not one of its inputs or outputs"),
    ("7767517\n2 2\npnnx.Input a 0 1 0\nnn.ReLU r 1 1 0 1 $input=1\n", 4, "not among its inputs"),
])
def test_format_errors_name_file_and_line(text, line, pattern):
    with pytest.raises(ParamFormatError, match=pattern) as info:
        parse_param_text(text, "bad.param")
    assert info.value.path == "bad.param" and info.value.line == line, str(info.value)
    assert str(info.value).startswith(f"bad.param:{line}: ")


def test_header_may_declare_more_operands_than_produced():
    """pnnx counts an output it dropped (the indices of a torch.sort of a weight folded into a
    constant: NODE's entmax): the header's count is an upper bound."""
    m = parse_param_text("7767517\n2 5\npnnx.Input a 0 1 0\npnnx.Output b 1 0 0\n", "m.param")
    assert list(m.operands) == ["0"] and [op.name for op in m.operators] == ["a", "b"]


def test_not_utf8_names_the_line(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_bytes(b"7767517\n1 1\npnnx.Input a\xff 0 1 0\n")
    with pytest.raises(ParamFormatError, match=r"m\.pnnx\.param:3: not UTF-8"):
        parse_param(p)


@pytest.mark.parametrize("name,data,pattern", [
    ("m.pt", b"PK\x03\x04\x14\x00\x00\x08\x80\xff", r"m\.pt: a zip archive .*TorchScript .*pnnx model\.pt"),
    ("m.pnnx.bin", b"PK\x03\x04\x14\x00\x00\x08\x80\xff", r"weights archive; pass the \.pnnx\.param .*m\.pnnx\.param"),
    ("x.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'\xff", r"a \.npy array, not a model"),
    ("m.onnx", b"\x08\x07\x12\x07pytorch\xff\xfe", r"an ONNX model, not a \.pnnx\.param: convert it with pnnx"),
])
def test_binary_files_given_as_the_model_say_what_they_are(tmp_path, name, data, pattern):
    """A TorchScript file, the weights archive, an input array or an ONNX model passed where the
    .param goes: the error says what the file is and what to pass (it said "not UTF-8 text")."""
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(ParamFormatError, match=pattern):
        parse_param(p)


def test_missing_param_file(tmp_path):
    """A missing model file is a FileNotFoundError (and a kuiper-xp error); given the stem of a
    model that is there, the message names the file to pass."""
    from kuiper_xp.errors import KuiperXPError, ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="nope.pnnx.param: file not found$") as info:
        parse_param(tmp_path / "nope.pnnx.param")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, KuiperXPError)
    (tmp_path / "m.pnnx.param").write_text("7767517\n0 0\n")
    with pytest.raises(FileNotFoundError, match=r"m: file not found \(.*m\.pnnx\.param is there: pass that\)"):
        parse_param(tmp_path / "m")


# -- the .bin ---------------------------------------------------------------------------------

BIN_PARAM = ("7767517\n3 3\npnnx.Attribute a 0 1 0 @data=(2,3)f32\n"
             "pnnx.Attribute b.x 0 1 1 @data=(4)i64\npnnx.Attribute c 0 1 2 @data=()f64 @e=(0,2)f32\n")


def _bin_members():
    a = np.arange(6, dtype="<f4").reshape(2, 3) / 7
    b = np.array([-1, 2**40, 3, -(2**62)], dtype="<i8")
    c = np.array(np.pi, dtype="<f8")
    return {"a.data": a, "b.x.data": b, "c.data": c, "c.e": np.zeros((0, 2), "<f4")}


@pytest.mark.parametrize("layout", ["classic", "zip64", "deflated"])
def test_bin_layouts(tmp_path, layout):
    arrays = _bin_members()
    path = write_bin(tmp_path / "m.pnnx.bin", {k: v.tobytes() for k, v in arrays.items()}, layout)
    raw = path.read_bytes()
    size_fields = struct.unpack("<II", raw[18:26])  # first local header: compressed, uncompressed
    if layout == "zip64":
        assert size_fields == (0xFFFFFFFF, 0xFFFFFFFF)
    elif layout == "classic":
        assert size_fields == (24, 24)
    m = parse_param_text(BIN_PARAM)
    m.attach_bin(path)
    got = {w.member: w.numpy() for w in m.weights}
    assert sorted(got) == sorted(arrays)
    for k, v in arrays.items():
        assert got[k].shape == v.shape and got[k].dtype == v.dtype, k
        np.testing.assert_array_equal(got[k], v, err_msg=k)
        assert got[k].flags.c_contiguous and got[k].flags.writeable and got[k].flags.aligned
    m.close()


def test_weights_are_unique_unless_another_has_their_shape_dtype_and_crc(tmp_path):
    """``WeightRef.unique``: no other member shares its (shape, dtype, CRC-32), so no other can
    hold the same values. Equal bytes of another shape or dtype do not count."""
    text = ("7767517\n5 5\npnnx.Attribute a 0 1 0 @data=(2,3)f32\npnnx.Attribute b 0 1 1 @data=(2,3)f32\n"
            "pnnx.Attribute c 0 1 2 @data=(3,2)f32\npnnx.Attribute d 0 1 3 @data=(2,3)f32\n"
            "pnnx.Attribute e 0 1 4 @data=(6)i32\n")
    same = (np.arange(6, dtype="<f4") / 7).reshape(2, 3)
    members = {"a.data": same, "b.data": same.copy(), "c.data": same.reshape(3, 2), "d.data": same + 1,
               "e.data": same.reshape(-1).view("<i4")}
    path = write_bin(tmp_path / "m.pnnx.bin", {k: v.tobytes() for k, v in members.items()})
    m = parse_param_text(text)
    m.attach_bin(path)
    assert {w.member: w.unique for w in m.weights} == {"a.data": False, "b.data": False, "c.data": True,
                                                        "d.data": True, "e.data": True}
    m.close()


def test_all_numpy_dtypes_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    np_types = {"f32": "<f4", "f64": "<f8", "f16": "<f2", "i64": "<i8", "i32": "<i4", "i16": "<i2",
                "i8": "i1", "u8": "u1", "bool": "?", "c64": "<c8", "c128": "<c16"}
    lines, members, arrays = [], {}, {}
    for k, (suffix, npt) in enumerate(np_types.items()):
        a = (rng.standard_normal((3, 2)) * 50).astype(npt)
        lines.append(f"pnnx.Attribute w{k} 0 1 {k} @data=(3,2){suffix}")
        members[f"w{k}.data"], arrays[f"w{k}.data"] = a.tobytes(), a
    text = f"7767517\n{len(lines)} {len(lines)}\n" + "\n".join(lines) + "\n"
    m = parse_param_text(text)
    m.attach_bin(write_bin(tmp_path / "m.bin", members, "zip64"))
    for w in m.weights:
        got = w.numpy()
        assert got.dtype == arrays[w.member].dtype
        np.testing.assert_array_equal(got, arrays[w.member])


def test_unreadable_dtype_is_a_clear_error(tmp_path):
    m = parse_param_text("7767517\n1 1\npnnx.Attribute a 0 1 0 @data=(2)bf16\n")
    with pytest.raises(BinFormatError, match="bf16"):
        m.attach_bin(write_bin(tmp_path / "m.bin", {"a.data": b"\0" * 4}))


def test_model_without_weights_needs_no_bin(tmp_path):
    m = parse_param_text("7767517\n1 1\npnnx.Input a 0 1 0\n")
    m.attach_bin(tmp_path / "missing.bin")
    assert m.weights == []


# -- the bundled real pnnx export ---------------------------------------------------------------

def test_real_pnnx_export():
    m = load_model(DIGITS)
    assert len(m.operators) == 14 and len(m.operands) == 13
    assert [op.type for op in m.operators][:3] == ["pnnx.Input", "nn.Conv2d", "nn.ReLU"]
    conv = m.operators[1]
    assert conv.name == "convbn2d_0" and conv.line == 4
    assert conv.params == {"bias": True, "dilation": [1, 1], "groups": 1, "in_channels": 1,
                           "kernel_size": [3, 3], "out_channels": 8, "padding": [1, 1],
                           "padding_mode": "zeros", "stride": [1, 1]}
    assert conv.input_names == ["input"]
    assert {k: (w.shape, w.dtype) for k, w in conv.attrs.items()} == {
        "bias": ((8,), "f32"), "weight": ((8, 1, 3, 3), "f32")}
    assert m.operands["0"].shape == (None, 1, 8, 8)
    assert m.operators[9].name == "torch.flatten_0" and m.operators[9].params == {"end_dim": -1, "start_dim": 1}
    assert m.operators[-1].type == "pnnx.Output" and m.operators[-1].inputs[0].name == "12"
    # current pnnx writes zip64 local headers; every weight matches what zipfile reads
    raw = (DATA / "digits.pnnx.bin").read_bytes()
    assert struct.unpack("<II", raw[18:26]) == (0xFFFFFFFF, 0xFFFFFFFF)
    with zipfile.ZipFile(DATA / "digits.pnnx.bin") as z:
        for w in m.weights:
            ref = np.frombuffer(z.read(w.member), dtype="<f4").reshape(w.shape)
            np.testing.assert_array_equal(w.numpy(), ref, err_msg=w.member)
    m.close()


def test_bin_reader_lists_members():
    r = BinReader(DATA / "digits.pnnx.bin")
    assert len(r.members) == 10 and "classifier.3.weight" in r.members
    r.close()
    r.close()  # twice is fine


NCNN_PARAM = """7767517
4 4
Input                    in0                      0 1 in0
Split                    splitncnn_0              1 2 in0 1 2
Convolution              conv_0                   1 1 1 3 0=4 1=3 11=3 12=1 13=1 14=1 2=1 3=1 4=1 5=1 6=108
BinaryOp                 add_0                    2 1 2 3 out0 0=0
"""


def test_an_ncnn_param_file_is_named_as_such(tmp_path):
    """pnnx writes model.ncnn.param beside model.pnnx.param with the same magic line: passing it
    gets an error that says which format it is and where the pnnx file is, not a complaint
    about its Split blobs."""
    with pytest.raises(ParamFormatError, match=r"ncnn \.param file \(operator type 'Input'\)") as info:
        parse_param_text(NCNN_PARAM, "m.ncnn.param")
    assert info.value.line == 3 and str(info.value).startswith("m.ncnn.param:3: ")
    (tmp_path / "m.ncnn.param").write_text(NCNN_PARAM)
    (tmp_path / "m.pnnx.param").write_text("7767517\n0 0\n")
    with pytest.raises(ParamFormatError, match=r"here that is .*m\.pnnx\.param"):
        parse_param(tmp_path / "m.ncnn.param")


def test_non_finite_parameter_literals():
    """pnnx writes float("nan") as ``nan.0`` (and inf as ``inf`` / ``inf.0``): the ``.0`` forms
    are read as floats, in lists too (bare ``inf`` / ``nan`` stay words by pnnx's rules; a number
    parameter takes them); words that merely start like them stay strings."""
    import math

    text = ("7767517\n2 2\npnnx.Input in 0 1 0\n"
            "Tensor.masked_fill op 1 1 0 1 value=nan.0 a=-nan.0 b=inf.0 c=-inf d=(nan.0,1) e=nanx f=info\n")
    op = parse_param_text(text, path="t.param").operators[-1]
    assert math.isnan(op.params["value"]) and math.isnan(op.params["a"])
    assert op.params["b"] == math.inf and op.params["c"] == -math.inf and op.param("value", float) != 0
    assert math.isnan(op.params["d"][0]) and op.params["d"][1] == 1
    assert op.params["e"] == "nanx" and op.params["f"] == "info"
