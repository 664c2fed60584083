"""The layer base class (seed 004) and the build context every layer is created with."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from kuiper_xp.backends import Backend
    from kuiper_xp.pnnx.ir import Operator, WeightRef



def _read_only(arr: Any) -> None:
    """Mark a (numpy) weight array read-only where the backend's arrays have that flag."""
    flags = getattr(arr, "flags", None)
    if flags is not None and hasattr(flags, "writeable"):
        flags.writeable = False

class BuildContext:
    """What a layer needs at build time: the backend's namespace ``xp``, its ``device``, the
    backend's optional ``fast`` paths, and :meth:`weight` to move a weight to the device once."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.xp = backend.xp
        self.device = backend.device
        self.fast = backend.fast
        #: ``matmul(a, b)``: the backend's fast matrix product where it has one (the numpy backend
        #: splits it over its threads inside a forward pass), else the namespace's
        self.matmul = getattr(backend.fast, "matmul", None) or backend.xp.matmul
        self._weights: dict[int, Any] = {}
        #: weights read so far, by a sample of their contents: pnnx writes a module called
        #: several times (ALBERT's shared layer, a cell stepped through time, a Siamese branch)
        #: as that many operators with a copy of its weights each; equal copies become one array
        self._seen: dict[tuple, list[weakref.ref]] = {}
        self._derived: dict[tuple, list[tuple[Any, Any]]] = {}
        self._memo: dict[tuple, tuple[Any, tuple]] = {}
        self._reused: dict[tuple, Any] = {}
        #: arrays of weights no other member of the file can equal (``WeightRef.unique``), by id
        #: (with a weak reference, to tell a live one from a later array given the same id)
        self._unique: dict[int, weakref.ref] = {}
        self._unique_refs: dict[int, weakref.ref] = {}  # the same, by id(WeightRef)
        #: how many weights were found equal to one read earlier (and share its array)
        self.shared_weights = 0

    def weight(self, ref: WeightRef, dtype: str | None = None) -> Any:
        """The weight as a backend array on the device, read from the .bin at most once; a weight
        equal to one read before (same shape, dtype and values) is that same array.

        A weight the file holds once (``ref.unique``: no other member has its shape, dtype and
        CRC-32, so none can equal it) is neither kept nor compared: once its layer has what it
        needs (a packed copy), its array is freed during the build, and the next weight's read
        reuses that memory (MobileNetV2's load made 1600-2100 page faults, 5 ms here, holding
        every array to the end of the build; 40-80 without). Read again, it comes from the file."""
        key = id(ref)
        arr = self._weights.get(key)
        if arr is None and key in self._unique_refs:
            arr = self._unique_refs[key]()
        if arr is None and getattr(ref, "unique", False):
            arr = self._device_copy(ref.numpy())
            wr = _weak(arr)
            if wr is None:  # an array type without weak references: kept to the end
                self._weights[key] = arr
            else:
                self._unique_refs[key] = self._unique[id(arr)] = wr
        elif arr is None:
            host = ref.numpy()
            fp = _fingerprint(host)
            arr = self._earlier(fp, host)
            if arr is None:
                arr = self._device_copy(host)
                wr = _weak(arr)
                if wr is not None:  # (an array type without weak references is not shared)
                    self._seen.setdefault(fp, []).append(wr)
            else:
                self.shared_weights += 1
            self._weights[key] = arr
        if dtype is not None and str(arr.dtype).rsplit(".", 1)[-1] != dtype:
            arr = self.xp.astype(arr, getattr(self.xp, dtype))
        return arr

    def _device_copy(self, host: Any) -> Any:
        arr = self.backend.asarray(host)
        _read_only(arr)  # it may be shared: no layer writes into a weight
        return arr

    def _earlier(self, fp: tuple, host: Any) -> Any:
        from kuiper_xp.backends import to_numpy

        for wr in self._seen.get(fp, ()):
            a = wr()
            if a is not None and _equal(to_numpy(a), host):
                return a
        return None

    def memo(self, key: tuple, make: Callable[[], Any], *alive: Any) -> Any:
        """``make()``, once per ``key`` during this build: for things made from arrays named in
        the key by ``id`` (pass those arrays as ``alive``: the memo holds them, so their ids
        cannot be reused by other arrays while it lasts)."""
        hit = self._memo.get(key)
        if hit is not None:
            self.shared_weights += 1
            return hit[0]
        held = [a for a in alive if a is not None]
        if held and all(self._is_unique(a) for a in held):
            return make()  # (no other layer can have these arrays: nothing to share, nothing held)
        result = make()
        self._memo[key] = (result, alive)
        return result

    def _is_unique(self, a: Any) -> bool:
        wr = self._unique.get(id(a))
        return wr is not None and wr() is a

    def reuse(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, once per ``key`` (hashable values only, no array ids) during this build:
        for immutable things that several layers may share, such as a compiled expression."""
        hit = self._reused.get(key, _UNSEEN)
        if hit is _UNSEEN:
            hit = self._reused[key] = make()
        return hit

    def derived(self, tag: Any, source: Any, make: Callable[[Any], Any], source_of: Callable[[Any], Any]) -> Any:
        """``make(source)``, or the result made earlier (with the same ``tag``) from a source
        equal to this one: layers share a re-laid-out weight (a transposed, packed copy) as
        :meth:`weight` shares the raw ones, even after the raw array was forgotten.
        ``source_of(result)`` must give back (a view equal to) the source a result was made
        from: it is what an equal source is compared with."""
        from kuiper_xp.backends import to_numpy

        key = (tag,) + _fingerprint(source, self.xp, to_numpy)  # (only the sample leaves the device)
        for result, inverse in self._derived.get(key, ()):
            if _equal(to_numpy(inverse(result)), to_numpy(source)):
                self.shared_weights += 1
                return result
        result = make(source)
        _read_only(result)  # (shared like the weights it is made from)
        self._derived.setdefault(key, []).append((result, source_of))
        return result

    def forget(self, ref: WeightRef | None) -> None:
        """Drop ``ref``'s array from the cache (a layer that keeps only a re-laid-out copy: the
        build's peak memory then holds one extra weight, not a second copy of them all). A later
        :meth:`weight` of it reads the .bin again."""
        if ref is not None:
            self._weights.pop(id(ref), None)
            self._unique_refs.pop(id(ref), None)

    def asarray(self, host: Any, dtype: str | None = None) -> Any:
        """An array on the device from host data (python lists, scalars)."""
        xp = self.xp
        return xp.asarray(host, dtype=None if dtype is None else getattr(xp, dtype), device=self.device)

    def dtype(self, name: str) -> Any:
        return getattr(self.xp, name)

    def release(self) -> None:
        """Drop the weight cache once layers have taken what they need."""
        self._weights.clear()
        self._unique.clear()
        self._unique_refs.clear()
        self._seen.clear()
        self._derived.clear()
        self._memo.clear()
        self._reused.clear()


_UNSEEN = object()


def _weak(a: Any) -> weakref.ref | None:
    try:
        return weakref.ref(a)
    except TypeError:
        return None


def _fingerprint(a: Any, xp: Any = None, to_host: Any = None) -> tuple:
    """Shape, dtype and a few dozen values spread over an array (a host one, or with ``xp`` and
    ``to_host`` a device one: only the sample is copied): equal arrays have equal fingerprints;
    unequal ones almost never do (then :func:`_equal` tells them apart)."""
    flat = a.reshape(-1) if xp is None else xp.reshape(a, (-1,))
    n = flat.shape[0]
    step = max(1, n // 32)
    sample, tail = flat[0:min(n, 33 * step):step], flat[max(0, n - 3):n]  # (in-bounds slices)
    if to_host is not None:
        sample, tail = to_host(sample), to_host(tail)
    # (dtype.str: str(dtype) goes through numpy's Python-level __str__, 4% of a MobileNetV2 load)
    return (tuple(a.shape), sample.dtype.str, sample.tobytes(), tail.tobytes())


def _equal(a: Any, b: Any) -> bool:
    """Two host arrays of the same shape, dtype and bytes (NaN weights equal themselves; -0.0
    and 0.0 differ): compared as unsigned integers of the item size, without a bytes copy."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}.get(a.dtype.itemsize)
    if bits is None or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return a.tobytes() == b.tobytes()
    return bool((a.reshape(-1).view(bits) == b.reshape(-1).view(bits)).all())


class Layer:
    """One operator's computation. Subclasses implement :meth:`forward`, and
    :meth:`from_operator` when they read parameters or weights (``op.param``, ``op.weight``).

    ``forward`` takes one array per operator input and returns one array, or a tuple of arrays
    for an operator with several outputs. It must be thread-safe: it may not keep per-call
    state on ``self``.
    """

    type_names: ClassVar[tuple[str, ...]] = ()
    op_type: str = ""
    op_name: str = ""

    def __init__(self, ctx: BuildContext):
        self.xp = ctx.xp
        self.device = ctx.device
        self.backend = ctx.backend
        self.matmul = ctx.matmul

    @classmethod
    def from_operator(cls, op: Operator, ctx: BuildContext) -> Layer:
        return cls(ctx)

    def forward(self, *inputs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def __call__(self, *inputs: Any) -> Any:
        return self.forward(*inputs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.op_type} {self.op_name!r}>"


def is_plain_spec(spec: Any) -> bool:
    """``"relu"``, ``("clamp", lo, hi)``, ``("leaky", slope)`` or ``("elu", alpha, scale, divisor)``
    (ELU, CELU, SELU): the fused activations every backend can apply (:func:`apply_plain_spec`),
    besides callables and fast kernels' names."""
    if spec == "relu":
        return True
    if not isinstance(spec, tuple) or not spec:
        return False
    if spec[0] == "clamp":
        return len(spec) == 3
    if spec[0] == "elu":  # ("elu", alpha, scale, divisor): ELU, CELU and SELU
        return len(spec) == 4 and all(isinstance(v, float) for v in spec[1:]) and spec[3] != 0.0
    return spec[0] == "leaky" and len(spec) == 2 and isinstance(spec[1], float)


def apply_plain_spec(xp: Any, y: Any, spec: Any) -> Any:
    """The generic (Array API) form of a :func:`is_plain_spec` activation; NaN stays NaN."""
    if spec == "relu":
        return xp.clip(y, min=0.0)
    if spec[0] == "clamp":
        return xp.clip(y, min=spec[1], max=spec[2])
    if spec[0] == "elu":  # scale * (max(x, 0) + alpha * expm1(min(x, 0) / divisor))
        _, alpha, scale, div = spec
        r = xp.clip(y, min=0.0) + xp.expm1(xp.clip(y, max=0.0) / div) * alpha  # clip keeps NaN
        return r * scale if scale != 1.0 else r
    slope = spec[1]
    if 0.0 < slope <= 1.0:  # (slope 0: inf * 0 would turn +inf into NaN)
        return xp.maximum(y, y * slope)
    return xp.where(y < 0, y * slope, y)


def checked_activation(spec: Any) -> Any:
    """``spec`` if it is None, a callable or a :func:`is_plain_spec` activation, else the
    ValueError that makes the runtime keep the activation as its own step."""
    if spec is None or callable(spec) or is_plain_spec(spec):
        return spec
    raise ValueError("fused_activation must be None, 'relu', ('clamp', min, max), ('leaky', slope), "
                     f"('elu', alpha, scale, divisor) or a callable; got {spec!r}")


class FusesActivation:
    """Mixin for a layer that can take over the activation following it (the runtime's
    ``set_fused_activation`` hook): a :func:`is_plain_spec` activation, a callable, or a name from
    the fast backend's ``UNARY_ACTIVATIONS`` (accepted only where the backend has
    ``activation_inplace``). Anything else is a ValueError: the runtime then keeps the
    activation as its own step. :meth:`_activate` applies it to a fresh output."""

    fused_activation: Any = None

    def set_fused_activation(self, spec: Any) -> None:
        fast = self.backend.fast
        named = isinstance(spec, str) and spec in getattr(fast, "UNARY_ACTIVATIONS", ())
        if named and getattr(fast, "activation_inplace", None) is None:
            raise ValueError(f"fused activation {spec!r} needs the backend's activation_inplace")
        self.fused_activation = spec if named else checked_activation(spec)

    def _activate(self, y: Any, stage: str = "any") -> Any:
        """Apply the fused activation to ``y``. A layer computing on an internal shape calls it
        with ``stage="inner"`` there (an elementwise spec runs on the fresh array) and with
        ``stage="outer"`` on the output's own shape, where a callable runs: the activation's
        layer (softmax over a dim, GLU, PReLU's channels) must see the shape it would have."""
        act = self.fused_activation
        if act is None or (stage == "inner" and callable(act)) or (stage == "outer" and not callable(act)):
            return y
        if callable(act):
            return act(y)
        fast_act = getattr(self.backend.fast, "activation_inplace", None)
        if fast_act is not None:  # the backend's own arrays: in place, in cache-sized chunks
            return fast_act(y, act)
        return apply_plain_spec(self.xp, y, act)


class SpatialLayer(Layer):
    """A layer on (N, C, L) or (N, C, H, W) data (``nd`` = 1 or 2), also accepting the unbatched
    (C, ...) form as torch does; 1-D data run through the 2-D code with a unit height."""

    nd = 2

    def _as4d(self, x: Any) -> tuple[Any, bool]:
        from kuiper_xp.errors import ShapeError

        xp = self.xp
        if x.ndim not in (self.nd + 1, self.nd + 2):
            raise ShapeError(f"{self.op_type} {self.op_name!r}: expects a {self.nd + 2}-D input "
                             f"(N, C, {'L' if self.nd == 1 else 'H, W'}) or its unbatched "
                             f"{self.nd + 1}-D form, got shape {tuple(x.shape)}")
        unbatched = x.ndim == self.nd + 1
        if unbatched:
            x = xp.expand_dims(x, axis=0)
        if self.nd == 1:
            x = xp.expand_dims(x, axis=2)
        return x, unbatched

    def _from4d(self, y: Any, unbatched: bool) -> Any:
        xp = self.xp
        if self.nd == 1:
            y = xp.squeeze(y, axis=2)
        if unbatched:
            y = xp.squeeze(y, axis=0)
        return y
