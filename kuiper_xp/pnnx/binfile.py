"""Reader for ``.pnnx.bin``: a zip archive (classic or zip64 layout) whose members hold raw
little-endian weight data named ``<op name>.<attr name>``.

Members are located through Python's ``zipfile`` central directory (which understands zip64),
and each weight is read exactly once into an aligned numpy array: stored members straight from
the file, deflated ones through a bounded, chunked read, so a zip bomb cannot inflate past the
size the ``.param`` declared. Every size is checked against the declaration and the file size
*before* memory is allocated; anything malformed raises :class:`BinFormatError`, anything over
:mod:`kuiper_xp.limits` raises :class:`ResourceLimitError`.
"""

from __future__ import annotations

import os
import struct
import threading
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kuiper_xp.errors import BinFormatError, KuiperXPError, ModelNotFoundError, ResourceLimitError
from kuiper_xp.limits import get_limits

if TYPE_CHECKING:  # pragma: no cover
    from .ir import WeightRef

_NP_DTYPES = {
    "f32": "<f4", "f64": "<f8", "f16": "<f2", "i64": "<i8", "i32": "<i4", "i16": "<i2",
    "i8": "i1", "u8": "u1", "bool": "?", "c64": "<c8", "c128": "<c16",
}
_CHUNK = 1 << 20  # bytes inflated at a time from a deflated member
_CD_ENTRY_MIN = 46  # bytes of one central-directory entry with an empty name
_DEFLATE_MAX_RATIO = 1100  # deflate cannot expand more than ~1032:1
_LIMIT_HINT = "raise it with kuiper_xp.limits.set_limits(...) or KUIPER_XP_MAX_..."

#: check each stored weight against its zip CRC-32 as it is read (deflated members are checked by
#: ``zipfile``): a damaged ``.bin`` then fails to load instead of giving other answers. Off by
#: default in the library (about 20 ms for ResNet-18's 45 MB, a fifth of its load time here);
#: ``KUIPER_XP_VERIFY_WEIGHTS=1`` turns it on, and the ``kuiper-xp`` command sets it.
VERIFY_CRC = os.environ.get("KUIPER_XP_VERIFY_WEIGHTS", "0").strip().lower() in ("1", "true", "yes", "on")


def _central_directory_claims(f, size: int) -> tuple[int, int] | None:
    """(entries, central directory bytes) from the end records, classic or zip64; None when
    they cannot be found (zipfile then reports the damage)."""
    tail_len = min(size, 22 + 0xFFFF)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    pos = tail.rfind(b"PK\x05\x06")
    if pos < 0 or len(tail) - pos < 22:
        return None
    _, _, _, _, entries, cd_size, _, _ = struct.unpack("<4s4H2LH", tail[pos : pos + 22])
    loc = pos - 20
    if loc >= 0 and tail[loc : loc + 4] == b"PK\x06\x07":
        (z64_off,) = struct.unpack("<Q", tail[loc + 8 : loc + 16])
        if z64_off + 56 <= size:
            f.seek(z64_off)
            rec = f.read(56)
            if len(rec) == 56 and rec[:4] == b"PK\x06\x06":
                e64, s64 = struct.unpack("<QQ", rec[32:48])
                entries, cd_size = e64, s64  # the classic record holds 0xffff sentinels
    return entries, cd_size


class BinReader:
    """The weights of one ``.pnnx.bin``. Thread-safe: reads are serialised by a lock."""

    def __init__(self, path: str | os.PathLike, lazy_missing: bool = False):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._zip: zipfile.ZipFile | None = None
        self._members: dict[str, zipfile.ZipInfo] = {}
        self._size = 0
        if lazy_missing and not self.path.exists():
            return  # a model without weights needs no .bin
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError:
            raise ModelNotFoundError(f"{self.path}: weight file not found (expected beside the .param)") from None
        except OSError as exc:
            raise BinFormatError(f"{self.path}: cannot open: {exc}") from None
        try:
            self._open()
        except BaseException:
            self._file.close()
            raise

    def _open(self) -> None:
        # the limits in force when the file is opened hold for all its reads (get_limits reads
        # the environment: ~15 us, 3 ms of MobileNetV2's 30 ms build when taken per weight)
        self._limits = limits = get_limits()
        try:
            self._size = os.fstat(self._file.fileno()).st_size
            claims = _central_directory_claims(self._file, self._size)
        except OSError as exc:
            raise BinFormatError(f"{self.path}: cannot read: {exc}") from None
        if claims is not None:
            entries, cd_size = claims
            # zipfile walks cd_size bytes whatever the entry count says: bound both before it does
            most = min(cd_size, self._size) // _CD_ENTRY_MIN
            if max(entries, most) > limits.max_bin_members:
                raise ResourceLimitError(
                    f"{self.path}: the zip central directory declares {entries} members in {cd_size} "
                    f"bytes, over the limit max_bin_members={limits.max_bin_members} ({_LIMIT_HINT})")
        try:
            self._file.seek(0)
            self._zip = zipfile.ZipFile(self._file)
            infos = self._zip.infolist()
        except MemoryError:
            raise
        except Exception as exc:  # zipfile parses untrusted bytes; anything it raises is damage
            raise BinFormatError(f"{self.path}: not a valid pnnx .bin zip archive "
                                 f"({type(exc).__name__}: {exc})") from None
        if len(infos) > limits.max_bin_members:
            raise ResourceLimitError(f"{self.path}: {len(infos)} members, over the limit "
                                     f"max_bin_members={limits.max_bin_members} ({_LIMIT_HINT})")
        self._members = {i.filename: i for i in infos}

    @property
    def members(self) -> list[str]:
        return list(self._members)

    def _check_one(self, w: WeightRef) -> zipfile.ZipInfo:
        """The member of ``w`` after checking it against the declaration (nothing is read)."""
        if self._zip is None:
            raise ModelNotFoundError(f"{self.path}: weight file not found (needed for {w.member!r})")
        info = self._members.get(w.member)
        if info is None:
            raise BinFormatError(
                f"{self.path}: member {w.member!r} (weight {w.name!r} of operator {w.op_name!r}, "
                f"declared {w.shape} {w.dtype}) is missing")
        if w.dtype not in _NP_DTYPES:
            raise BinFormatError(f"{self.path}: weight {w.member!r} has dtype {w.dtype}, which "
                                 "kuiper-xp cannot read (no numpy equivalent)")
        n = w.nbytes
        limits = self._limits
        if n > limits.max_weight_bytes:
            raise ResourceLimitError(f"{self.path}: weight {w.member!r} is {n} bytes, over the limit "
                                     f"max_weight_bytes={limits.max_weight_bytes} ({_LIMIT_HINT})")
        if info.file_size != n:
            raise BinFormatError(
                f"{self.path}: member {w.member!r} holds {info.file_size} bytes but the .param "
                f"declares {w.shape} {w.dtype} = {n} bytes")
        if info.flag_bits & 0x1:
            raise BinFormatError(f"{self.path}: member {w.member!r} is encrypted")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.header_offset < 0 or info.header_offset + 30 + n > self._size:
                raise BinFormatError(f"{self.path}: member {w.member!r} ({n} bytes at offset "
                                     f"{info.header_offset}) runs past the end of the file ({self._size} bytes)")
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            if n > max(info.compress_size, 1) * _DEFLATE_MAX_RATIO + 1024:
                raise BinFormatError(
                    f"{self.path}: member {w.member!r} claims {n} bytes from {info.compress_size} "
                    "deflated bytes, more than deflate can produce (a zip bomb or a damaged archive)")
        else:
            raise BinFormatError(
                f"{self.path}: member {w.member!r} uses zip compression method {info.compress_type}; "
                "kuiper-xp reads stored (as pnnx writes) or deflated members only")
        return info

    def check(self, weights: list[WeightRef]) -> None:
        """Every declared weight has a member of exactly the declared size (before reading)."""
        limits = get_limits()
        total = 0
        for w in weights:
            self._check_one(w)
            total += w.nbytes
        if total > limits.max_total_weight_bytes:
            raise ResourceLimitError(f"{self.path}: weights total {total} bytes, over the limit "
                                     f"max_total_weight_bytes={limits.max_total_weight_bytes} ({_LIMIT_HINT})")

    def mark_unique(self, weights: list[WeightRef]) -> None:
        """Set ``w.unique`` on each weight no other one shares shape, dtype and the CRC-32 the
        archive declares for it with: equal values would have an equal CRC, so none can equal
        it (a file that declares wrong CRCs can hide an equal pair: then they are not shared,
        which costs memory, never a wrong value)."""
        count: dict[tuple, int] = {}
        keys = []
        for w in weights:
            info = self._members.get(w.member)
            k = None if info is None else (tuple(w.shape), w.dtype, info.CRC)
            keys.append(k)
            count[k] = count.get(k, 0) + 1
        for w, k in zip(weights, keys):
            w.unique = k is not None and count[k] == 1

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        self._file.seek(info.header_offset)
        header = self._file.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise BinFormatError(f"{self.path}: bad local header for member {info.filename!r}")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        return info.header_offset + 30 + name_len + extra_len

    def read(self, w: WeightRef) -> np.ndarray:
        """The weight ``w`` as a new C-ordered numpy array of its declared shape and dtype."""
        info = self._check_one(w)
        n = w.nbytes
        try:
            out = np.empty(w.shape, dtype=_NP_DTYPES[w.dtype])
        except (ValueError, OverflowError) as exc:
            raise BinFormatError(f"{self.path}: weight {w.member!r}: cannot make an array of shape "
                                 f"{w.shape}: {exc}") from None
        buf = memoryview(out.reshape(-1).view(np.uint8))
        got = 0
        with self._lock:
            try:
                if info.compress_type == zipfile.ZIP_STORED:
                    off = self._data_offset(info)
                    if off + n > self._size:
                        raise BinFormatError(f"{self.path}: member {w.member!r} runs past the end of the file")
                    self._file.seek(off)
                    while got < n:
                        k = self._file.readinto(buf[got:])
                        if not k:
                            break
                        got += k
                else:
                    with self._zip.open(info) as fh:  # type: ignore[union-attr]
                        while got < n:
                            chunk = fh.read(min(_CHUNK, n - got))
                            if not chunk:
                                break
                            buf[got : got + len(chunk)] = chunk
                            got += len(chunk)
                        if got == n and fh.read(1):
                            raise BinFormatError(f"{self.path}: member {w.member!r} inflates past the "
                                                 f"declared {n} bytes")
            except KuiperXPError:
                raise
            except MemoryError:
                raise
            except Exception as exc:  # zipfile/zlib on damaged bytes
                raise BinFormatError(f"{self.path}: cannot read member {w.member!r}: "
                                     f"{type(exc).__name__}: {exc}") from None
        if got != n:
            raise BinFormatError(f"{self.path}: member {w.member!r}: read {got} bytes, expected {n}")
        if VERIFY_CRC and info.compress_type == zipfile.ZIP_STORED and zlib.crc32(buf) != info.CRC:
            raise BinFormatError(f"{self.path}: member {w.member!r} does not match its CRC-32: the file is "
                                 "damaged (re-export or copy it again)")
        return out

    def close(self) -> None:
        with self._lock:
            if self._zip is not None:
                self._zip.close()
                self._zip = None
            f = getattr(self, "_file", None)
            if f is not None:
                f.close()

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
