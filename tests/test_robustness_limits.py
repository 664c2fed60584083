"""Resource limits: absurd declarations in a model file are refused with a clear error *before*
memory is allocated, and a user can raise each limit to let a large-but-declared model through."""

from __future__ import annotations

import tracemalloc
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import kuiper_xp
from kuiper_xp import limits as L
from kuiper_xp.errors import BinFormatError, KuiperXPError, ParamFormatError, ResourceLimitError
from kuiper_xp.pnnx import load_model, parse_param, parse_param_text

MiB = 2**20


@contextmanager
def peak_below(nbytes: int):
    """Fail if Python/numpy allocate more than ``nbytes`` at once inside the block."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield
    finally:
        peak = tracemalloc.get_traced_memory()[1] - base
        if not was_tracing:
            tracemalloc.stop()
        assert peak < nbytes, f"peak allocation {peak} bytes >= {nbytes}"


def attr_model(tmp_path: Path, shape: tuple[int, ...], data: np.ndarray | None = None,
               compress: int = zipfile.ZIP_STORED, name: str = "m") -> Path:
    """pnnx.Input is not needed: one pnnx.Attribute feeding pnnx.Output."""
    dims = ",".join(map(str, shape))
    param = tmp_path / f"{name}.pnnx.param"
    param.write_text(f"7767517\n2 1\npnnx.Attribute a 0 1 0 @data=({dims})f32 #0=({dims})f32\n"
                     "pnnx.Output out 1 0 0\n")
    if data is not None:
        with zipfile.ZipFile(tmp_path / f"{name}.pnnx.bin", "w", compression=compress) as z:
            z.writestr("a.data", data.astype("<f4").tobytes())
    return param


def patch_sizes(path: Path, member_index: int, size: int, compressed: int | None = None) -> None:
    """Overwrite the 32-bit sizes of one member in its local header and central-directory entry."""
    raw = bytearray(path.read_bytes())
    locals_ = [i for i in range(len(raw) - 3) if raw[i:i + 4] == b"PK\x03\x04"]
    centrals = [i for i in range(len(raw) - 3) if raw[i:i + 4] == b"PK\x01\x02"]
    lo, ce = locals_[member_index], centrals[member_index]
    raw[lo + 22: lo + 26] = size.to_bytes(4, "little")
    raw[ce + 24: ce + 28] = size.to_bytes(4, "little")
    if compressed is not None:
        raw[lo + 18: lo + 22] = compressed.to_bytes(4, "little")
        raw[ce + 20: ce + 24] = compressed.to_bytes(4, "little")
    path.write_bytes(bytes(raw))


# -- .param declarations -------------------------------------------------------------------------

def test_weight_whose_shape_product_overflows():
    text = "7767517\n1 1\npnnx.Attribute a 0 1 0 @w=(99999999999,99999999999)f32\n"
    with peak_below(1 * MiB), pytest.raises(ResourceLimitError, match=r"<string>:3: weight a\.w .*max_weight_bytes") as e:
        parse_param_text(text)
    assert "set_limits" in str(e.value)


@pytest.mark.parametrize("shape", ["(99999999999999999999999,0)", "(0," + "9" * 5000 + ")"])
def test_absurd_dimension_even_with_zero_elements(shape):
    with pytest.raises(ResourceLimitError, match="max_dim"):
        parse_param_text(f"7767517\n1 1\npnnx.Attribute a 0 1 0 @w={shape}f32\n")


def test_header_claiming_billions_of_operands():
    with peak_below(1 * MiB), pytest.raises(ResourceLimitError, match=r"<string>:2: .*max_operands"):
        parse_param_text("7767517\n3 4000000000\npnnx.Input a 0 1 0\n")
    with pytest.raises(ResourceLimitError, match="max_operators"):
        parse_param_text("7767517\n" + "9" * 5000 + " 1\n")


def test_header_claim_within_limits_costs_nothing():
    with peak_below(1 * MiB), pytest.raises(ParamFormatError, match="declares 1000000 operators but"):
        parse_param_text("7767517\n1000000 2000000\npnnx.Input a 0 1 0\n")


def _many_operands(n: int) -> str:
    lines = ["pnnx.Input in 0 1 0"] + [f"nn.ReLU r{k} 1 1 {k} {k + 1}" for k in range(n - 1)]
    lines.append(f"pnnx.Output out 1 0 {n - 1}")
    return f"7767517\n{len(lines)} {n}\n" + "\n".join(lines) + "\n"


def test_operand_limit_can_be_raised():
    text = _many_operands(150)
    with L.limits(max_operands=100):
        with pytest.raises(ResourceLimitError, match="max_operands=100"):
            parse_param_text(text)
    with L.limits(max_operands=200, max_operators=200):
        assert len(parse_param_text(text).operands) == 150


def test_very_long_line_is_refused_and_the_limit_can_be_raised():
    line = "pnnx.Input a 0 1 0 " + " ".join(f"k{i}=1" for i in range(400))
    text = f"7767517\n1 1\n{line}\n"
    with L.limits(max_line_chars=1000):
        with pytest.raises(ResourceLimitError, match=r"<string>:3: line of \d+ characters.*max_line_chars=1000"):
            parse_param_text(text)
    with L.limits(max_line_chars=10_000):
        assert len(parse_param_text(text).operators[0].params) == 400


def test_very_long_line_at_the_default_limit():
    text = "7767517\n1 1\npnnx.Input a 0 1 0 x=" + "1" * (L.get_limits().max_line_chars + 1) + "\n"
    with pytest.raises(ResourceLimitError, match="max_line_chars"):
        parse_param_text(text)


def test_param_file_size_limit(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_text(_many_operands(50))
    with L.limits(max_param_bytes=256):
        with pytest.raises(ResourceLimitError, match="max_param_bytes=256"):
            parse_param(p)
    with L.limits(max_param_bytes=1 * MiB):
        assert len(parse_param(p).operators) == 51


def test_rank_limit():
    dims = ",".join(["1"] * 17)
    with pytest.raises(ResourceLimitError, match="max_rank=16"):
        parse_param_text(f"7767517\n1 1\npnnx.Input a 0 1 0 #0=({dims})f32\n")
    with L.limits(max_rank=17):
        assert parse_param_text(f"7767517\n1 1\npnnx.Input a 0 1 0 #0=({dims})f32\n").operands["0"].shape == (1,) * 17


def test_weight_limit_can_be_raised_for_a_legitimately_large_model(tmp_path):
    data = np.arange(2**19, dtype=np.float32)  # 2 MiB
    param = attr_model(tmp_path, data.shape, data)
    with L.limits(max_weight_bytes="1M"):
        with pytest.raises(ResourceLimitError, match=r"m\.pnnx\.param:3: weight a\.data .*2097152 bytes"):
            kuiper_xp.load(param, backend="numpy")
    with L.limits(max_weight_bytes="4M"):
        (y,) = kuiper_xp.load(param, backend="numpy")()
        np.testing.assert_array_equal(kuiper_xp.to_numpy(y), data)


def test_total_weight_limit(tmp_path):
    data = np.ones(1000, np.float32)
    param = attr_model(tmp_path, data.shape, data)
    with L.limits(max_total_weight_bytes=3999):
        with pytest.raises(ResourceLimitError, match="max_total_weight_bytes=3999"):
            load_model(param)
    with L.limits(max_total_weight_bytes=4000):
        load_model(param).close()


# -- .bin archives ------------------------------------------------------------------------------

def test_stored_member_claiming_a_huge_size(tmp_path):
    param = attr_model(tmp_path, (4,), np.ones(4))
    patch_sizes(tmp_path / "m.pnnx.bin", 0, 0xFFFFFFF0, 0xFFFFFFF0)
    with peak_below(2 * MiB), pytest.raises(BinFormatError, match="holds 4294967280 bytes but the .param declares"):
        load_model(param)


def test_stored_member_matching_a_large_declaration_but_past_the_file_end(tmp_path):
    n = 2**28  # 1 GiB of f32 declared (under the 4 GiB default), 16 bytes in the file
    param = attr_model(tmp_path, (n,), np.ones(4))
    patch_sizes(tmp_path / "m.pnnx.bin", 0, 4 * n, 4 * n)
    with peak_below(2 * MiB), pytest.raises(BinFormatError, match="runs past the end of the file"):
        load_model(param)


def _deflated_zeros(path: Path, n_bytes: int) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        with z.open("a.data", "w", force_zip64=True) as f:
            chunk = bytes(MiB)
            for _ in range(n_bytes // MiB):
                f.write(chunk)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    """A deflated member of 32 MiB of zeros (about 32 KiB compressed)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.bin"
    _deflated_zeros(path, 32 * MiB)
    assert path.stat().st_size < MiB
    return path


def test_zip_bomb_larger_than_declared(tmp_path, bomb):
    param = attr_model(tmp_path, (1000,))
    (tmp_path / "m.pnnx.bin").write_bytes(bomb.read_bytes())
    with peak_below(2 * MiB), pytest.raises(BinFormatError, match="holds 33554432 bytes but the .param declares"):
        load_model(param)


def test_zip_bomb_lying_about_its_size(tmp_path):
    """The central directory says 4000 bytes (as declared); the stream inflates to 64 MiB."""
    param = attr_model(tmp_path, (1000,))
    path = tmp_path / "m.pnnx.bin"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("a.data", bytes(16 * MiB))
    patch_sizes(path, 0, 4000)
    m = load_model(param)  # sizes agree with the declaration
    # zipfile stops at the claimed size and then finds the CRC wrong; either way nothing inflates
    with peak_below(4 * MiB), pytest.raises(BinFormatError, match="inflates past the declared|Bad CRC"):
        m.weights[0].numpy()
    m.close()


def test_deflated_member_claiming_more_than_deflate_can_produce(tmp_path):
    n = 2**28  # 1 GiB declared and claimed, from a few KiB of deflated data
    param = attr_model(tmp_path, (n,), np.ones(1024), compress=zipfile.ZIP_DEFLATED)
    patch_sizes(tmp_path / "m.pnnx.bin", 0, 4 * n)
    with peak_below(2 * MiB), pytest.raises(BinFormatError, match="more than deflate can produce"):
        load_model(param)


def test_declared_large_deflated_member_reads(tmp_path):
    data = np.zeros(2**20, np.float32)  # 4 MiB, compresses ~1000:1
    param = attr_model(tmp_path, data.shape, data, compress=zipfile.ZIP_DEFLATED)
    m = load_model(param)
    np.testing.assert_array_equal(m.weights[0].numpy(), data)
    m.close()


def test_central_directory_claiming_many_members(tmp_path):
    param = attr_model(tmp_path, (2,))
    with zipfile.ZipFile(tmp_path / "m.pnnx.bin", "w") as z:
        for k in range(5):
            z.writestr("a.data" if k == 0 else f"junk{k}", np.ones(2, "<f4").tobytes())
    with L.limits(max_bin_members=3):
        with pytest.raises(ResourceLimitError, match="max_bin_members=3"):
            load_model(param)
    with L.limits(max_bin_members=5):
        load_model(param).close()


def test_central_directory_claiming_huge_sizes(tmp_path):
    param = attr_model(tmp_path, (2,), np.ones(2))
    path = tmp_path / "m.pnnx.bin"
    raw = bytearray(path.read_bytes())
    eocd = raw.rfind(b"PK\x05\x06")
    raw[eocd + 8: eocd + 12] = b"\xff\xff\xff\xff"  # entries on disk / total: 65535
    raw[eocd + 12: eocd + 16] = (0xFFFFFFF0).to_bytes(4, "little")  # central directory size
    path.write_bytes(bytes(raw))
    with peak_below(2 * MiB), pytest.raises(BinFormatError, match="not a valid pnnx .bin zip archive"):
        load_model(param)


def test_compression_methods_other_than_stored_or_deflated(tmp_path):
    param = attr_model(tmp_path, (4,), np.ones(4), compress=zipfile.ZIP_BZIP2)
    with pytest.raises(BinFormatError, match="compression method 12"):
        load_model(param)


# -- the limits API -----------------------------------------------------------------------------

def test_environment_overrides(monkeypatch, tmp_path):
    data = np.ones(256, np.float32)  # 1 KiB
    param = attr_model(tmp_path, data.shape, data)
    monkeypatch.setenv("KUIPER_XP_MAX_WEIGHT_BYTES", "1000")
    with pytest.raises(ResourceLimitError, match="max_weight_bytes=1000"):
        load_model(param)
    for ok in ("1K", "1KiB", "1.5e3", "4096"):
        monkeypatch.setenv("KUIPER_XP_MAX_WEIGHT_BYTES", ok)
        load_model(param).close()
    monkeypatch.setenv("KUIPER_XP_MAX_WEIGHT_BYTES", "lots")
    with pytest.raises(L.LimitsError, match="KUIPER_XP_MAX_WEIGHT_BYTES.*'lots'"):
        L.get_limits()
    monkeypatch.setenv("KUIPER_XP_MAX_WEIGHT_BYTES", "inf")
    with pytest.raises(KuiperXPError):
        L.get_limits()


def test_environment_wins_over_set_limits(monkeypatch):
    monkeypatch.setenv("KUIPER_XP_MAX_RANK", "5")
    with L.limits(max_rank=9):
        assert L.get_limits().max_rank == 5


def test_set_limits_validates_and_context_restores():
    before = L.get_limits()
    with pytest.raises(L.LimitsError, match="unknown limits"):
        L.set_limits(max_nonsense=1)
    with pytest.raises(L.LimitsError, match=">= 0"):
        L.set_limits(max_rank=-1)
    with pytest.raises(L.LimitsError):
        L.set_limits(max_rank=True)
    with L.limits(max_rank=3, max_weight_bytes="2G") as now:
        assert now.max_rank == 3 and now.max_weight_bytes == 2 * 2**30
    assert L.get_limits() == before
    assert isinstance(L.LimitsError("x"), ValueError)


def test_defaults():
    d = L.Limits()
    assert d.max_weight_bytes == 4 * 2**30 and d.max_total_weight_bytes == 16 * 2**30
    assert d.max_operators == 1_000_000 and d.max_operands == 2_000_000
    assert d.max_line_chars == 16 * 2**20 and d.max_param_bytes == 256 * 2**20
    assert d.max_rank == 16 and d.max_dim == 2**40 and d.max_bin_members == 2_000_000
