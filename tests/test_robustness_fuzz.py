"""Property-based and mutation fuzzing of the model readers: the ``.pnnx.param`` parser, the
``.pnnx.bin`` reader, and whole-model loading and running.

The property: hostile input raises only :class:`KuiperXPError` subclasses (never another type,
never a RecursionError) and each case finishes well under a second (hypothesis ``deadline``).

Budget: ``max_examples`` ~200 per target, derandomized (the same cases on every run). For a long
random run set ``KUIPER_XP_FUZZ_EXAMPLES=N`` (hypothesis then uses its example database in
``.hypothesis/`` so a failure replays). Interesting inputs found go to ``tests/fuzz_corpus/``
and are replayed by ``test_robustness_corpus.py``.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kuiper_xp
from kuiper_xp.errors import KuiperXPError
from kuiper_xp.pnnx import parse_param_text

DATA = Path(__file__).resolve().parent.parent / "kuiper_xp" / "data"
FUZZ_N = int(os.environ.get("KUIPER_XP_FUZZ_EXAMPLES", "0") or 0)


def fuzz_settings(n: int = 200):
    """``n`` derandomized examples normally; ``$KUIPER_XP_FUZZ_EXAMPLES`` random ones on request."""
    # the normal suite: the same cases every run, no shrinking (a failure prints its input
    # as generated); a long run shrinks and keeps a database
    kw = {}
    if not FUZZ_N:
        kw = {"derandomize": True, "database": None, "phases": [Phase.explicit, Phase.generate]}
    return settings(max_examples=FUZZ_N or n, deadline=1000, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much], **kw)


# -- seeds --------------------------------------------------------------------------------------

DIGITS_TEXT = (DATA / "digits.pnnx.param").read_text()

CHAIN = """7767517
5 4
pnnx.Input               pnnx_input_0             0 1 0 #0=(2,3)f32
nn.ReLU                  relu.1                   1 1 0 1 #0=(2,3)f32 #1=(2,3)f32
pnnx.Attribute           attr.c                   0 1 2 @data=(2,3)f32 #2=(2,3)f32
nn.Sigmoid               sig                      1 1 1 3 #1=(2,3)f32 #3=(2,3)f32
pnnx.Output              pnnx_output_0            1 0 3 #3=(2,3)f32
"""

PARAMS = """7767517
3 3
pnnx.Input               in                       0 1 x #x=(?,4)f32
F.interpolate            up                       1 1 x y a=None b=() c=[] d=True e=False f=(3) g=(1,2,3) h=[1.5,2] i=reflect j=1e-05 k=1.000000e-05 l=-7 m=2147483647 n=%x o=(a,b) $input=x #y=(?,8)f32
pnnx.Output              out                      1 0 y #y=(?,8)f32
"""

TWO_OUT = """7767517
6 6
pnnx.Input               in.0                     0 1 a #a=(1,?,?)f32
pnnx.Input               in.1                     0 1 b #b=(1,?,?)f32
torch.cat                cat                      2 1 a b c dim=1 $tensors=a $tensors=b #c=(1,?,?)f32
torch.chunk              chunk                    1 2 c d e chunks=2 dim=1 #d=(1,?,?)f32 #e=(1,?,?)f32
prim::TupleConstruct     tup                      2 1 d e f
pnnx.Output              out                      1 0 f
"""

SEEDS = [DIGITS_TEXT, CHAIN, PARAMS, TWO_OUT]

ODD = ["\x00", "\u202e", "\ufeff", "\u2028", "\x85", "\x0b", "\x1c", "é", "😀", "\ud800", "\t", "\r",
       "\r\n", "=", "==", "@", "#", "$", "(", ")", "((", "))", ",", "?", "%", "-", "--", "+", ".", "e",
       "٣", "²", "７", "\u00a0", " ", "  ", "\n", "\n\n", "[", "]", "'", '"', "\\", "j", "inf", "nan",
       "None", "True", "()", "[]", "(,)", "@=", "#=", "$=", "=(", ")f32", "f32", "bf16", "c32", "f99"]
HUGE = ["99999999999", "2147483648", "4294967296", "9223372036854775808", "18446744073709551616",
        "9" * 25, "9" * 5000, "-1", "-2147483648", "-99999999999", "1e308", "1e999", "-0", "0",
        "00000000000000000000001", "+1", "1_000"]
_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")

MUTATIONS = ["flip", "insert", "delete_chars", "truncate", "swap_lines", "dup_line", "delete_line",
             "number", "token", "header", "repeat_token"]


@st.composite
def mutated_text(draw, seeds=tuple(SEEDS)):
    """A seed file with 1..4 mutations: character flips/inserts (odd unicode included),
    truncation, line swaps/duplications/deletions, huge/negative numbers, token damage."""
    text = draw(st.sampled_from(seeds))
    char = st.one_of(st.sampled_from(ODD), st.characters(), st.sampled_from(HUGE))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(MUTATIONS))
        n = len(text)
        lines = text.split("\n")
        if kind == "flip" and n:
            i = draw(st.integers(0, n - 1))
            text = text[:i] + draw(char) + text[i + 1:]
        elif kind == "insert":
            i = draw(st.integers(0, n))
            text = text[:i] + draw(char) + text[i:]
        elif kind == "delete_chars" and n:
            i = draw(st.integers(0, n - 1))
            text = text[:i] + text[i + draw(st.integers(1, 20)):]
        elif kind == "truncate":
            text = text[: draw(st.integers(0, n))]
        elif kind == "swap_lines" and len(lines) > 1:
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif kind == "dup_line":
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines)))
            lines.insert(j, lines[i])
            text = "\n".join(lines)
        elif kind == "delete_line":
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "\n".join(lines)
        elif kind == "number":
            found = list(_NUM.finditer(text))
            if found:
                m = found[draw(st.integers(0, len(found) - 1))]
                new = draw(st.one_of(st.sampled_from(HUGE), st.integers(-(10**20), 10**20).map(str)))
                text = text[: m.start()] + new + text[m.end():]
        elif kind in ("token", "repeat_token"):
            spans = [m.span() for m in re.finditer(r"\S+", text)]
            if spans:
                a, b = spans[draw(st.integers(0, len(spans) - 1))]
                tok = text[a:b]
                if kind == "token":
                    new = draw(st.one_of(char, st.sampled_from([tok + tok, tok[: len(tok) // 2],
                                                                tok.replace("=", ""), tok + "=",
                                                                tok.upper()])))
                else:
                    new = " ".join([tok] * draw(st.integers(2, 50)))
                text = text[:a] + new + text[b:]
        elif kind == "header" and len(lines) > 1:
            num = st.one_of(st.sampled_from(HUGE), st.integers(-3, 30).map(str))
            lines[1] = f"{draw(num)} {draw(num)}"
            text = "\n".join(lines)
    return text


def random_text():
    """Unstructured text, with and without the magic line and a count line in front."""
    piece = st.one_of(st.characters(), st.sampled_from(ODD), st.sampled_from(HUGE))
    body = st.lists(piece, max_size=120).map("".join)
    head = st.sampled_from(["", "7767517\n", "7767517\n1 1\n", "7767517\n2 2\npnnx.Input a 0 1 0\n"])
    return st.tuples(head, body).map(lambda t: t[0] + t[1])


def check_param_text(text: str):
    try:
        m = parse_param_text(text, "fuzz.param")
    except KuiperXPError as exc:
        assert str(exc), "an error without a message"
        return None
    # what the parser accepts is consistent
    for op in m.operators:
        assert len(op.input_names) == len(op.inputs)
        for o in op.inputs:
            assert o.producer is not None and m.operands[o.name] is o
        for o in op.outputs:
            assert o.producer is op
    return m


# -- the .param parser ------------------------------------------------------------------------

@fuzz_settings()
@given(mutated_text())
def test_param_parser_on_mutated_files(text):
    check_param_text(text)


@fuzz_settings()
@given(random_text())
def test_param_parser_on_random_text(text):
    check_param_text(text)


@st.composite
def generated_model(draw):
    """Random, mostly well-formed files from the grammar (random types, counts, keys and values)."""
    n_ops = draw(st.integers(0, 8))
    lines, produced, n_operands = [], [], 0
    for k in range(n_ops):
        n_in = draw(st.integers(0, min(3, len(produced))))
        ins = [draw(st.sampled_from(produced)) for _ in range(n_in)] if produced else []
        n_out = draw(st.integers(0, 2))
        outs = [f"t{n_operands + j}" for j in range(n_out)]
        n_operands += n_out
        produced += outs
        extras = draw(st.lists(st.one_of(
            st.tuples(st.sampled_from(["k", "eps", "dim", "mode"]),
                      st.sampled_from(["1", "-1", "1e-05", "(1,2)", "(3)", "None", "True", "reflect",
                                       "[]", "%s", "2147483647", "inf", "-inf"])).map("=".join),
            st.tuples(st.sampled_from(["@w", "@b", "@data"]),
                      st.sampled_from(["(2,3)f32", "(4)i64", "()f64", "(0)f32", "(?,2)f32", "(1)bf16"])
                      ).map("=".join),
            st.sampled_from([f"${n}={o}" for n in ("input", "other") for o in (ins or ["zz"])]),
            st.sampled_from([f"#{o}=(?,3)f32" for o in (ins + outs or ["zz"])] + ["#t0=(1,2)i8"]),
        ), max_size=5))
        typ = draw(st.sampled_from(["pnnx.Input", "pnnx.Output", "nn.ReLU", "torch.cat", "F.relu",
                                    "pnnx.Attribute", "nn.Unknown"]))
        lines.append(" ".join([typ, f"op.{k}", str(n_in), str(n_out), *ins, *outs, *extras]))
    counts = draw(st.sampled_from([f"{n_ops} {n_operands}", f"{n_ops + 1} {n_operands}",
                                   f"{n_ops} {n_operands - 1}"]))
    return "7767517\n" + counts + "\n" + "\n".join(lines) + "\n"


@fuzz_settings()
@given(generated_model())
def test_param_parser_on_generated_files(text):
    check_param_text(text)


# -- the .bin reader ----------------------------------------------------------------------------

BIN_PARAM = ("7767517\n3 3\npnnx.Attribute a 0 1 0 @data=(2,3)f32\n"
             "pnnx.Attribute b 0 1 1 @data=(5)i64\npnnx.Attribute c 0 1 2 @data=(4,4)f32\n")
BIN_ARRAYS = {"a.data": np.arange(6, dtype="<f4").reshape(2, 3),
              "b.data": np.array([1, -2, 3, 2**40, -(2**50)], "<i8"),
              "c.data": np.zeros((4, 4), "<f4")}


def _valid_bin() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a.data", BIN_ARRAYS["a.data"].tobytes())  # classic stored
        with z.open("b.data", "w", force_zip64=True) as f:  # zip64 local header
            f.write(BIN_ARRAYS["b.data"].tobytes())
        z.writestr("c.data", BIN_ARRAYS["c.data"].tobytes(), compress_type=zipfile.ZIP_DEFLATED)
    return buf.getvalue()


VALID_BIN = _valid_bin()
DIGITS_BIN = (DATA / "digits.pnnx.bin").read_bytes()
# offsets of zip structures, where damage matters most
_SIGS = (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07")


def _struct_offsets(data: bytes) -> list[int]:
    return [m.start() for sig in _SIGS for m in re.finditer(re.escape(sig), data)]


FIELD_VALUES = [0, 1, 0xFF, 0xFFFF, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 2**63 - 1, 2**64 - 1, 46, 2**40]


@st.composite
def mutated_bin(draw, seed: bytes = VALID_BIN):
    data = bytearray(seed)
    anchors = _struct_offsets(seed)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "field", "field", "truncate", "append", "dup", "delete"]))
        n = len(data)
        if kind == "byte" and n:
            data[draw(st.integers(0, n - 1))] = draw(st.integers(0, 255))
        elif kind == "field" and anchors:
            # overwrite a 2/4/8-byte field inside a zip header with a sentinel or huge value
            base = draw(st.sampled_from(anchors)) + draw(st.integers(0, 56))
            width = draw(st.sampled_from([2, 4, 8]))
            value = draw(st.sampled_from(FIELD_VALUES)) % (1 << (8 * width))
            if base + width <= len(data):
                data[base: base + width] = value.to_bytes(width, "little")
        elif kind == "truncate":
            del data[draw(st.integers(0, n)):]
        elif kind == "append":
            data += draw(st.binary(max_size=64))
        elif kind == "dup" and n:
            i = draw(st.integers(0, n - 1))
            data[i:i] = data[i: i + draw(st.integers(1, 64))]
        elif kind == "delete" and n:
            i = draw(st.integers(0, n - 1))
            del data[i: i + draw(st.integers(1, 64))]
    return bytes(data)


def check_bin(param_text: str, data: bytes, tmp: Path):
    path = tmp / "fuzz.pnnx.bin"
    path.write_bytes(data)
    m = parse_param_text(param_text)
    try:
        m.attach_bin(path)
        for w in m.weights:
            a = w.numpy()
            assert a.shape == w.shape and a.dtype.itemsize * a.size == w.nbytes
    except KuiperXPError as exc:
        assert str(exc)
    finally:
        m.close()


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="kxp-fuzz-") as d:
        yield Path(d)


@fuzz_settings()
@given(data=mutated_bin())
def test_bin_reader_on_mutated_archives(scratch, data):
    check_bin(BIN_PARAM, data, scratch)


@fuzz_settings(100)
@given(data=mutated_bin(DIGITS_BIN))
def test_bin_reader_on_mutated_real_export(scratch, data):
    check_bin(DIGITS_TEXT, data, scratch)


@fuzz_settings(100)
@given(data=st.binary(max_size=400))
def test_bin_reader_on_random_bytes(scratch, data):
    check_bin(BIN_PARAM, b"PK\x03\x04" + data if data[:1] == b"\x00" else data, scratch)


def test_unchanged_archive_reads_back(scratch):
    path = scratch / "ok.pnnx.bin"
    path.write_bytes(VALID_BIN)
    m = parse_param_text(BIN_PARAM)
    m.attach_bin(path)
    for w in m.weights:
        np.testing.assert_array_equal(w.numpy(), BIN_ARRAYS[w.member])
    m.close()


def test_reader_survives_a_truncation_at_every_offset(scratch):
    """Exhaustive rather than sampled: the valid archive cut at every byte."""
    for cut in range(len(VALID_BIN)):
        check_bin(BIN_PARAM, VALID_BIN[:cut], scratch)


# -- whole models: load + build + run -------------------------------------------------------------

CHAIN_BIN = {"attr.c.data": np.linspace(-1, 1, 6, dtype="<f4").reshape(2, 3)}


def _zip(members: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k, v in members.items():
            z.writestr(k, v.tobytes())
    return buf.getvalue()


def check_model(param_text: str, bin_bytes: bytes, tmp: Path):
    p = tmp / "m.pnnx.param"
    p.write_text(param_text, encoding="utf-8", errors="surrogatepass")
    (tmp / "m.pnnx.bin").write_bytes(bin_bytes)
    try:
        g = kuiper_xp.load(p, backend="numpy")
        feeds = []
        for spec in g.inputs:
            shape = tuple(2 if d is None else d for d in (spec.shape or (2, 3)))
            if np.prod(shape, dtype=float) > 1e5 or spec.dtype not in (None, "float32", "float64", "int64"):
                return
            feeds.append(np.ones(shape, dtype=spec.dtype or "float32"))
        g(*feeds)
    except KuiperXPError as exc:
        assert str(exc)


@fuzz_settings(150)
@given(text=mutated_text(seeds=(CHAIN,)), data=st.one_of(st.just(_zip(CHAIN_BIN)),
                                                          mutated_bin(_zip(CHAIN_BIN))))
def test_load_and_run_mutated_models(scratch, text, data):
    check_model(text, data, scratch)


def test_seed_model_runs(scratch):
    check_model(CHAIN, _zip(CHAIN_BIN), scratch)
    g = kuiper_xp.load(scratch / "m.pnnx.param", backend="numpy")
    x = np.array([[-1, 0, 2], [3, -4, 5]], np.float32)
    (y,) = g(x)
    np.testing.assert_allclose(kuiper_xp.to_numpy(y), 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-6)


def test_fuzz_settings_pick_up_the_environment():
    s = fuzz_settings(7)
    assert s.max_examples == (FUZZ_N or 7) and s.deadline is not None
