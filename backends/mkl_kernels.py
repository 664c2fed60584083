"""Optional matrix products and vector math through Intel MKL for the numpy backend. Off by
default: numpy's own ``matmul`` (OpenBLAS in the PyPI wheels) and ufuncs stay the default and the
reference;
``numpy_fast.use_mkl(True)`` or ``KUIPER_XP_MKL=1`` switches this on where the ``mkl`` wheel is
installed (``pip install mkl``, which puts ``libmkl_rt`` in ``<prefix>/lib``).

Why: OpenBLAS packs the weight panel on every call, which dominates products with few rows.
ViT-B/32's linear layers at batch 1 (50 tokens, 768 -> 3072) took 1.84 ms with OpenBLAS and 1.33
with MKL, split the same way over 2 threads, cold weights; PyTorch, which calls MKL, 1.26. And
numpy has no erf: GELU's float32 rational approximation was 27 ufunc passes, 3.2 ms on 400x3072,
against 1.2 with MKL's vector erf (4 passes around one call); numpy's path is now 17 passes
around one ``exp`` (numpy_fast._k_gelu).

MKL runs sequentially here (``MKL_Set_Threading_Layer(SEQUENTIAL)``): kuiper-xp's own threads
split the products (``numpy_fast._gemm``), as they do with OpenBLAS pinned to one thread. That
setting belongs to the process's ``libmkl_rt``: a numpy built on that same library would run
sequentially too (PyTorch's MKL is linked into torch and is not affected). The calls go through
ctypes (``cblas_sgemm``/``cblas_dgemm``, LP64), which releases the GIL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

import numpy as np

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_SEQUENTIAL = 1
_INT_MAX = 2**31 - 1


def find_library() -> str | None:
    """The path of ``libmkl_rt`` (the ``mkl`` wheel's, in this Python's prefix, first), or None."""
    # The wheel's soname moves with MKL's major version (libmkl_rt.so.2 up to 2025, .so.3 in
    # 2026), so any numbered one is taken, the newest first.
    patterns = ("libmkl_rt.so.*", "libmkl_rt.so", "libmkl_rt.*.dylib", "libmkl_rt.dylib", "mkl_rt.*.dll", "mkl_rt.dll")
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX") or sys.prefix)):
        for sub in ("lib", "Library/bin"):
            for pattern in patterns:
                found = sorted((p for p in (Path(prefix) / sub).glob(pattern) if p.is_file()), reverse=True)
                if found:
                    return str(found[0])
    return ctypes.util.find_library("mkl_rt")


def _operand(a: np.ndarray) -> tuple[int, int] | None:
    """``(transpose flag, leading dimension)`` of a 2-D array as a row-major BLAS operand: rows
    with unit stride (as stored) or columns with unit stride (its transpose is row-major); None
    for any other layout."""
    item = a.itemsize
    (r, c), (s0, s1) = a.shape, a.strides
    if (s1 == item or c == 1) and s0 % item == 0:
        ld = s0 // item if r > 1 else max(1, c)
        if ld >= max(1, c):
            return _NO_TRANS, ld
    if (s0 == item or r == 1) and s1 % item == 0:
        ld = s1 // item if c > 1 else max(1, r)
        if ld >= max(1, r):
            return _TRANS, ld
    return None


class MKL:
    """``cblas_?gemm`` and the vector ``v?Erf``/``v?Exp`` of ``libmkl_rt``, bound (raises
    ImportError when the library cannot be found or loaded)."""

    def __init__(self, path: str | None = None) -> None:
        path = path or find_library()
        if path is None:
            raise ImportError("libmkl_rt was not found")
        try:
            lib = ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_LOCAL", 0))
            lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
            lib.MKL_Set_Threading_Layer(_SEQUENTIAL)
            self._fns = {}
            for dt, name, scalar in ((np.float32, "cblas_sgemm", ctypes.c_float),
                                     (np.float64, "cblas_dgemm", ctypes.c_double)):
                fn = getattr(lib, name)
                fn.restype = None
                fn.argtypes = [ctypes.c_int] * 6 + [scalar, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                    ctypes.c_int, scalar, ctypes.c_void_p, ctypes.c_int]
                self._fns[np.dtype(dt)] = fn
            self._vml = {}
            for dt, prefix in ((np.float32, "vs"), (np.float64, "vd")):
                for name in ("Erf", "Exp"):
                    fn = getattr(lib, prefix + name)
                    fn.restype = None
                    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
                    self._vml[(name.lower(), np.dtype(dt))] = fn
        except (OSError, AttributeError) as exc:
            raise ImportError(f"{path} could not be used as MKL: {exc}") from None
        self.path = path

    def unary(self, name: str, x: np.ndarray, out: np.ndarray) -> bool:
        """``out[...] = name(x)`` with MKL's vector math (``"erf"`` or ``"exp"``, high-accuracy
        mode: within about 1 ulp) for contiguous 1-D float32 or float64 arrays of one dtype and
        size (``out`` may be ``x``); False (nothing written) for anything else."""
        fn = self._vml.get((name, x.dtype))
        if (fn is None or out.dtype != x.dtype or x.ndim != 1 or out.shape != x.shape or x.size > _INT_MAX
                or not (x.flags.c_contiguous and out.flags.c_contiguous)):
            return False
        if x.size:
            fn(x.size, x.ctypes.data, out.ctypes.data)
        return True

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """``out[...] = a @ b`` for 2-D float32 or float64 arrays of one dtype, each operand with
        a unit-stride axis, ``out`` with unit-stride rows and no memory shared with the operands;
        False (nothing written) for anything else, which the caller gives to numpy."""
        fn = self._fns.get(out.dtype)
        if (fn is None or a.dtype != out.dtype or b.dtype != out.dtype or a.ndim != 2 or b.ndim != 2
                or out.ndim != 2):
            return False
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2 or out.shape != (m, n) or 0 in (m, n, k) or max(m, n, k) > _INT_MAX:
            return False
        la, lb = _operand(a), _operand(b)
        lo = _operand(out)
        if la is None or lb is None or lo is None or lo[0] != _NO_TRANS:
            return False
        if np.may_share_memory(out, a) or np.may_share_memory(out, b):
            return False
        if max(la[1], lb[1], lo[1]) > _INT_MAX:
            return False
        fn(_ROW_MAJOR, la[0], lb[0], m, n, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1], 0.0,
           out.ctypes.data, lo[1])
        return True
