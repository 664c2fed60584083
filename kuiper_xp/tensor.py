"""The Tensor class of seed 003, over any Array API backend.

A :class:`Tensor` wraps one backend array. It keeps KuiperInfer's vocabulary -- ``channels``,
``rows``, ``cols`` for 1-3-D data, row-major ``reshape`` (the seed's ``ReView``) and
column-major ``reshape(..., row_major=False)`` (the seed's ``ReRawshape`` over an armadillo cube),
``flatten``, ``pad``, ``fill``, ``transform`` -- but holds any rank, any dtype and any device.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from kuiper_xp.backends import Backend, backend_for_array, get_backend
from kuiper_xp.backends.base import host_random
from kuiper_xp.errors import ShapeError

__all__ = ["Tensor"]


def _check_shape(shape: Any, allow_infer: bool = False) -> tuple[int, ...]:
    if isinstance(shape, int) or hasattr(shape, "__index__") and not isinstance(shape, Sequence):
        shape = (shape,)
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise ShapeError(f"a shape is a sequence of non-negative integers; got {shape!r}")
    dims = []
    for i, d in enumerate(shape):
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise ShapeError(f"dimension {i} of shape {tuple(shape)!r} is not an integer: {d!r}")
        d = operator.index(d)
        if d < 0 and not (allow_infer and d == -1):
            raise ShapeError(
                f"dimension {i} of shape {tuple(shape)!r} is negative ({d}); dimensions must be"
                + (" >= 0 (or a single -1 to infer)" if allow_infer else " >= 0")
            )
        dims.append(d)
    if dims.count(-1) > 1:
        raise ShapeError(f"shape {tuple(shape)!r} has more than one -1")
    return tuple(dims)


class Tensor:
    """One array on one backend, with the seed's shape vocabulary.

    ``Tensor(a)`` wraps ``a``: a numpy array (or anything numpy can read) goes to the backend the
    switch chooses (or ``backend=``); an array of a backend library stays on its backend and
    device unless ``backend=`` names another, in which case it is copied there through the host.
    """

    __slots__ = ("_data", "_backend")

    def __init__(self, data: Any, backend: str | Backend | None = None, device: Any = None):
        if isinstance(data, Tensor):
            data = data._data
        lib = type(data).__module__.split(".")[0]
        native = lib in ("numpy", "cupy", "array_api_strict") and hasattr(data, "shape")
        if backend is None and native and lib != "numpy":
            be = backend_for_array(data)
            if device is not None and not be.same_device(device):
                be = get_backend(be.name, device)
        else:
            be = get_backend(backend, device)
        if native and be.owns(data) and (lib == "numpy" or be.same_device(_device_of(data))):
            self._data = data if lib != "numpy" else be.asarray(data)
        else:
            host = backend_for_array(data).to_numpy(data) if native else data
            self._data = be.asarray(host)
        self._backend = be

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def _wrap(cls, data: Any, backend: Backend) -> Tensor:
        t = object.__new__(cls)
        t._data = data
        t._backend = backend
        return t

    @classmethod
    def zeros(cls, shape, dtype: str = "float32", backend=None, device=None) -> Tensor:
        be = get_backend(backend, device)
        shape = _check_shape(shape)
        return cls._wrap(be.xp.zeros(shape, dtype=getattr(be.xp, dtype), device=be.device), be)

    @classmethod
    def ones(cls, shape, dtype: str = "float32", backend=None, device=None) -> Tensor:
        be = get_backend(backend, device)
        shape = _check_shape(shape)
        return cls._wrap(be.xp.ones(shape, dtype=getattr(be.xp, dtype), device=be.device), be)

    @classmethod
    def full(cls, shape, value, dtype: str = "float32", backend=None, device=None) -> Tensor:
        be = get_backend(backend, device)
        shape = _check_shape(shape)
        return cls._wrap(be.xp.full(shape, value, dtype=getattr(be.xp, dtype), device=be.device), be)

    @classmethod
    def rand(cls, shape, seed: int | None = None, dtype: str = "float32", backend=None, device=None) -> Tensor:
        """Uniform [0, 1) numbers; the same ``seed`` gives the same numbers on every backend."""
        be = get_backend(backend, device)
        return cls._wrap(be.asarray(host_random(_check_shape(shape), seed, False, dtype)), be)

    @classmethod
    def randn(cls, shape, seed: int | None = None, dtype: str = "float32", backend=None, device=None) -> Tensor:
        """Standard-normal numbers; the same ``seed`` gives the same numbers on every backend."""
        be = get_backend(backend, device)
        return cls._wrap(be.asarray(host_random(_check_shape(shape), seed, True, dtype)), be)

    # -- properties ---------------------------------------------------------------------------
    @property
    def data(self) -> Any:
        """The backend array."""
        return self._data

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def xp(self):
        return self._backend.xp

    @property
    def device(self):
        return self._backend.device

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self):
        return self._data.dtype

    def empty(self) -> bool:
        return self.size == 0

    def _crc(self) -> tuple[int, int, int]:
        s = self.shape
        if self.ndim == 1:
            return 1, 1, s[0]
        if self.ndim == 2:
            return 1, s[0], s[1]
        if self.ndim == 3:
            return s
        raise ShapeError(
            f"channels/rows/cols describe 1-3-D data as in KuiperInfer; this tensor is {self.ndim}-D {s}"
        )

    @property
    def channels(self) -> int:
        """Seed 003: 1 for 1-D and 2-D data, the first dimension of 3-D data."""
        return self._crc()[0]

    @property
    def rows(self) -> int:
        """Seed 003: 1 for 1-D data, else the second-to-last dimension."""
        return self._crc()[1]

    @property
    def cols(self) -> int:
        """Seed 003: the last dimension."""
        return self._crc()[2]

    # -- reshape ------------------------------------------------------------------------------
    def _target(self, shape) -> tuple[int, ...]:
        dims = _check_shape(shape, allow_infer=True)
        known = math.prod(d for d in dims if d != -1)
        if -1 in dims:
            if known == 0 or self.size % known:
                raise ShapeError(f"cannot reshape a tensor of size {self.size} {self.shape} into {dims}")
            dims = tuple(self.size // known if d == -1 else d for d in dims)
        elif known != self.size:
            raise ShapeError(
                f"cannot reshape a tensor of size {self.size} {self.shape} into {dims} "
                f"(size {known}); the sizes must be equal"
            )
        return dims

    def reshape(self, shape, row_major: bool = True) -> Tensor:
        """A tensor of the same elements in ``shape``.

        ``row_major=True`` is the seed's ``ReView`` (numpy ``order='C'``): elements are read and
        written last axis fastest.

        ``row_major=False`` is the seed's ``ReRawshape`` on an armadillo cube: the data are read and
        written channel by channel, each channel's rows x cols matrix in column-major order. For
        1-D and 2-D shapes this is numpy's ``order='F'``; for 3-D (channels, rows, cols) it is not
        (channels stay outermost). Beyond 3-D the same rule is extended: the last two axes form a
        column-major matrix and all leading axes are walked row-major, outermost first.

        One dimension may be -1 (inferred). Returns a new Tensor; ``self`` is unchanged.
        """
        dims = self._target(shape)
        xp = self.xp
        if row_major:
            return Tensor._wrap(xp.reshape(self._data, dims), self._backend)
        flat = xp.reshape(_swap_last2(xp, self._data), (-1,))
        if len(dims) < 2:
            return Tensor._wrap(xp.reshape(flat, dims), self._backend)
        tmp = xp.reshape(flat, dims[:-2] + (dims[-1], dims[-2]))
        return Tensor._wrap(_swap_last2(xp, tmp), self._backend)

    def view(self, shape) -> Tensor:
        """Row-major reshape, sharing memory where the backend can."""
        return self.reshape(shape, row_major=True)

    def flatten(self, row_major: bool = True) -> Tensor:
        """A 1-D tensor of the elements, in row-major or (seed) column-major order."""
        return self.reshape((self.size,), row_major=row_major)

    # -- filling and padding --------------------------------------------------------------------
    def fill(self, values, row_major: bool = True) -> Tensor:
        """Set every element to ``values`` (a scalar) or to a sequence of exactly ``size`` values
        laid out in row-major or (seed) column-major order. Changes and returns ``self``."""
        xp = self.xp
        if getattr(values, "shape", None) == () and not isinstance(values, Tensor):
            values = values.item() if hasattr(values, "item") else values  # (a numpy scalar, a 0-d array)
        if isinstance(values, (int, float, bool)):
            self._data = xp.full(self.shape, values, dtype=self.dtype, device=self.device)
            return self
        if isinstance(values, Tensor):
            values = values.data
        if not hasattr(values, "shape"):
            values = list(values)
            n = len(values)
            values = self._backend.asarray(values)
        n = math.prod(values.shape)
        if n != self.size:
            raise ShapeError(f"fill got {n} values for a tensor of size {self.size} {self.shape}")
        flat = Tensor(values, backend=self._backend).reshape((n,))
        filled = flat.reshape(self.shape, row_major=row_major).data
        self._data = xp.astype(filled, self.dtype)
        return self

    def pad(self, pads: Sequence[int] | Sequence[Sequence[int]], value: float = 0.0) -> Tensor:
        """A padded copy.

        ``pads`` is either the seed's four amounts ``(top, bottom, left, right)`` for the rows and
        columns (last two axes), or one ``(before, after)`` pair per axis, from the first axis.
        ``value`` fills the new elements.
        """
        pads = list(pads)
        if len(pads) == 4 and all(isinstance(p, int) for p in pads):
            if self.ndim < 2:
                raise ShapeError(f"(top, bottom, left, right) padding needs >= 2-D data; shape is {self.shape}")
            pairs = [(0, 0)] * (self.ndim - 2) + [(pads[0], pads[1]), (pads[2], pads[3])]
        else:
            pairs = [tuple(p) for p in pads]
            if len(pairs) != self.ndim or any(len(p) != 2 for p in pairs):
                raise ShapeError(f"pad needs (top, bottom, left, right) or {self.ndim} (before, after) pairs; got {pads!r}")
        for p in pairs:
            for amount in p:
                if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                    raise ShapeError(f"padding amounts are non-negative integers; got {pads!r}")
        xp = self.xp
        new_shape = tuple(s + a + b for s, (a, b) in zip(self.shape, pairs))
        out = xp.full(new_shape, value, dtype=self.dtype, device=self.device)
        out[tuple(slice(a, a + s) for s, (a, _) in zip(self.shape, pairs))] = self._data
        return Tensor._wrap(out, self._backend)

    def transform(self, fn: Callable[[Any], Any]) -> Tensor:
        """Replace the data by ``fn(data)`` (an elementwise function of the backend array), as the
        seed's ``Transform``. The result must keep the shape. Returns ``self``."""
        out = fn(self._data)
        if tuple(out.shape) != self.shape:
            raise ShapeError(f"transform must keep the shape {self.shape}; the function returned {tuple(out.shape)}")
        self._data = out
        return self

    # -- element access ---------------------------------------------------------------------------
    def index(self, offset: int, row_major: bool = True):
        """The element at a linear ``offset`` in row-major or (seed) column-major order."""
        if not -self.size <= offset < self.size:
            raise IndexError(f"offset {offset} is out of range for a tensor of size {self.size}")
        flat = self.flatten(row_major).data
        return _scalar(flat[offset % self.size])

    def at(self, *idx: int):
        """The element at one index per dimension (``at(c, r, col)`` for 3-D data)."""
        if len(idx) != self.ndim:
            raise IndexError(f"at() takes {self.ndim} indices for shape {self.shape}; got {len(idx)}")
        return _scalar(self._data[idx])

    def __getitem__(self, key):
        out = self._data[_full_key(key, self.ndim)]
        return _scalar(out) if out.ndim == 0 else Tensor._wrap(out, self._backend)

    def __setitem__(self, key, value):
        if isinstance(value, Tensor):
            value = value.data
        self._data[_full_key(key, self.ndim)] = value

    def __len__(self) -> int:
        return self.shape[0] if self.ndim else 0

    # -- conversion ------------------------------------------------------------------------------
    def to_numpy(self):
        return self._backend.to_numpy(self._data)

    def to(self, backend: str | Backend, device: Any = None) -> Tensor:
        """A copy on another backend or device."""
        return Tensor(self.to_numpy(), backend=backend, device=device)

    def __array_namespace__(self, api_version=None):
        return self.xp

    def __repr__(self) -> str:
        head = f"Tensor(shape={self.shape}, dtype={self.dtype}, backend={self._backend.name}, device={self._backend.device_str()})"
        try:
            body = repr(self.to_numpy())
        except Exception:  # pragma: no cover - repr must not fail
            return head
        if len(body) > 400:
            body = body[:400] + " ..."
        return head + "\n" + body


def _full_key(key, ndim: int):
    # numpy-style partial indexing (t[0] on a 2-D tensor); the standard needs the trailing '...'
    parts = key if isinstance(key, tuple) else (key,)
    if any(p is Ellipsis or p is None for p in parts) or len(parts) >= ndim:
        return key
    if any(hasattr(p, "shape") for p in parts):
        return key
    return parts + (Ellipsis,)


def _swap_last2(xp, a):
    if a.ndim < 2:
        return a
    axes = tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2)
    return xp.permute_dims(a, axes)


def _device_of(a):
    return getattr(a, "device", None)


def _scalar(a):
    v = a.item() if hasattr(a, "item") else a
    return v
