"""Reader for ``.pnnx.bin``: a zip archive (classic or zip64 layout) whose members hold raw
little-endian weight data named ``<op name>.<attr name>``.

Members are located through Python's ``zipfile`` central directory (which understands zip64),
and each weight is read exactly once into an aligned numpy array: stored members straight from
the file, compressed ones through a bounded read, so a zip bomb cannot inflate past the size the
``.param`` declared.
"""

from __future__ import annotations

import os
import struct
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kuiper_xp.errors import BinFormatError, ResourceLimitError
from kuiper_xp.limits import get_limits

if TYPE_CHECKING:  # pragma: no cover
    from .ir import WeightRef

_NP_DTYPES = {
    "f32": "<f4", "f64": "<f8", "f16": "<f2", "i64": "<i8", "i32": "<i4", "i16": "<i2",
    "i8": "i1", "u8": "u1", "bool": "?", "c64": "<c8", "c128": "<c16",
}


class BinReader:
    def __init__(self, path: str | os.PathLike, lazy_missing: bool = False):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._zip: zipfile.ZipFile | None = None
        self._members: dict[str, zipfile.ZipInfo] = {}
        if lazy_missing and not self.path.exists():
            return  # a model without weights needs no .bin
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError:
            raise BinFormatError(f"{self.path}: weight file not found (expected beside the .param)") from None
        except OSError as exc:
            raise BinFormatError(f"{self.path}: cannot open: {exc}") from None
        try:
            self._zip = zipfile.ZipFile(self._file)
            infos = self._zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError,
                struct.error, NotImplementedError) as exc:
            self._file.close()
            raise BinFormatError(f"{self.path}: not a valid pnnx .bin zip archive ({exc})") from None
        limits = get_limits()
        if len(infos) > limits.max_bin_members:
            raise ResourceLimitError(f"{self.path}: {len(infos)} members (limit {limits.max_bin_members})")
        self._members = {i.filename: i for i in infos}
        self._size = os.fstat(self._file.fileno()).st_size

    def check(self, weights: list[WeightRef]) -> None:
        """Every declared weight has a member of exactly the declared size (before reading)."""
        limits = get_limits()
        total = 0
        for w in weights:
            info = self._members.get(w.member)
            if info is None:
                raise BinFormatError(
                    f"{self.path}: member {w.member!r} (weight {w.name!r} of operator {w.op_name!r}, "
                    f"declared {w.shape} {w.dtype}) is missing")
            if w.dtype not in _NP_DTYPES:
                raise BinFormatError(f"{self.path}: weight {w.member!r} has dtype {w.dtype}, which "
                                     "kuiper-xp cannot read (no numpy equivalent)")
            if info.file_size != w.nbytes:
                raise BinFormatError(
                    f"{self.path}: member {w.member!r} holds {info.file_size} bytes but the .param "
                    f"declares {w.shape} {w.dtype} = {w.nbytes} bytes")
            if info.compress_type == zipfile.ZIP_STORED and info.header_offset + info.file_size > self._size:
                raise BinFormatError(f"{self.path}: member {w.member!r} runs past the end of the file")
            total += w.nbytes
        if total > limits.max_total_weight_bytes:
            raise ResourceLimitError(f"{self.path}: weights total {total} bytes (limit "
                                     f"{limits.max_total_weight_bytes}; raise with kuiper_xp.limits.set_limits)")

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        self._file.seek(info.header_offset)
        header = self._file.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise BinFormatError(f"{self.path}: bad local header for member {info.filename!r}")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        return info.header_offset + 30 + name_len + extra_len

    def read(self, w: WeightRef) -> np.ndarray:
        if self._zip is None:
            raise BinFormatError(f"{self.path}: weight file not found (needed for {w.member!r})")
        info = self._members.get(w.member)
        if info is None:
            raise BinFormatError(f"{self.path}: member {w.member!r} is missing")
        n = w.nbytes
        if info.file_size != n:
            raise BinFormatError(f"{self.path}: member {w.member!r} holds {info.file_size} bytes, "
                                 f"declared {n}")
        out = np.empty(w.shape, dtype=_NP_DTYPES[w.dtype])
        buf = out.reshape(-1).view(np.uint8) if n else memoryview(b"")
        with self._lock:
            try:
                if info.compress_type == zipfile.ZIP_STORED:
                    self._file.seek(self._data_offset(info))
                    got = self._file.readinto(buf) if n else 0
                else:
                    with self._zip.open(info) as fh:
                        data = fh.read(n + 1)
                    got = len(data)
                    if got == n:
                        buf[:] = np.frombuffer(data, dtype=np.uint8)
            except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError,
                    ValueError, struct.error) as exc:
                raise BinFormatError(f"{self.path}: cannot read member {w.member!r}: {exc}") from None
        if got != n:
            raise BinFormatError(f"{self.path}: member {w.member!r}: read {got} bytes, expected {n}")
        return out

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._file.close()
            self._zip = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
