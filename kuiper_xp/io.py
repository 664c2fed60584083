"""Reading inputs for the ``kuiper-xp`` command and writing its outputs.

Inputs are ``.npy`` / ``.npz`` files or images (PNG, JPEG, ... through Pillow), given as files,
directories (their usable files, sorted) or glob patterns. Each becomes a :class:`Sample`: one
numpy array per model input, fitted to the model's declared shapes and dtypes. Samples are then
grouped into batches (:func:`make_batches`) and the outputs concatenated back
(:func:`concat_outputs`). Nothing here is Array API code: this is the host side, so it uses numpy.

``.npy``/``.npz`` files are read with ``allow_pickle=False`` (input files are untrusted).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kuiper_xp.errors import InputError, OptionError

__all__ = [
    "ARRAY_EXTS",
    "IMAGE_EXTS",
    "Batch",
    "Preprocess",
    "Sample",
    "concat_outputs",
    "expand_inputs",
    "fit_to_spec",
    "load_array",
    "load_image",
    "load_samples",
    "make_batches",
    "random_inputs",
    "read_npy",
    "read_npz",
    "save_outputs",
]

ARRAY_EXTS = (".npy", ".npz")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm", ".pbm")
_USABLE = ARRAY_EXTS + IMAGE_EXTS
_GLOB_CHARS = "*?["


class Spec(Protocol):
    """What a model input looks like (``kuiper_xp.runtime.graph.TensorSpec`` fits)."""

    name: str
    shape: tuple[int | None, ...] | None
    dtype: str | None


@dataclass(frozen=True)
class Preprocess:
    """Image preprocessing: ``x = (pixel / scale - mean) / std`` per channel, NCHW float32.

    ``size`` is (height, width) to resize to (bilinear); None keeps the model's declared size, or
    the image's own when the model's is dynamic. ``mean``/``std`` hold one value or one per channel.
    """

    size: tuple[int, int] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale: float = 255.0


@dataclass
class Sample:
    """Arrays read from one source (a file, or one file per input): one array per model input,
    each with its batch dimension. ``count`` is the number of rows along that dimension."""

    source: str
    arrays: list[np.ndarray]
    count: int
    batchable: bool = True


@dataclass
class Batch:
    """Arrays to feed the model once; ``rows`` maps its first ``n`` rows back to their samples,
    ``pad`` rows of zeros were added to fill a static batch size."""

    arrays: list[np.ndarray]
    n: int
    pad: int = 0
    rows: list[tuple[str, int]] = field(default_factory=list)
    #: the rows were cut from, joined across or padded beyond the samples as given: each output
    #: must then have the batch's rows as its first dimension (see :func:`concat_outputs`)
    regrouped: bool = False


# -- finding files ----------------------------------------------------------------------------------
def _fmt_shape(shape: Sequence[int | None] | None) -> str:
    if shape is None:
        return "?"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def expand_inputs(patterns: Sequence[str | os.PathLike]) -> list[Path]:
    """Files named by ``patterns``: a file as is, a directory's usable files (``.npy``, ``.npz``,
    images; sorted, not recursive), or a glob pattern's matches (sorted). Raises
    :class:`InputError` for a missing file, an empty directory or a pattern with no match."""
    out: list[Path] = []
    for pat in patterns:
        text = os.fspath(pat)
        p = Path(text).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in _USABLE)
            if not found:
                raise InputError(f"directory {text} has no usable inputs "
                                 f"({', '.join(_USABLE)})")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        elif any(c in text for c in _GLOB_CHARS):
            matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(text)))
            files = [m for m in matches if m.is_file() and m.suffix.lower() in _USABLE]
            if not files:
                what = "no usable files" if matches else "nothing"
                raise InputError(f"input pattern {text!r} matches {what}")
            out.extend(files)
        elif p.exists():
            raise InputError(f"input {text} is not a regular file or directory")
        else:
            raise InputError(f"input file not found: {text}")
    return out


# -- reading ----------------------------------------------------------------------------------------
def _check_numeric(a: np.ndarray, where: str) -> np.ndarray:
    if a.dtype.kind not in "biufc":
        raise InputError(f"{where} holds {a.dtype} data; expected numbers")
    return a


def read_npy(path: str | os.PathLike) -> np.ndarray:
    """An ``.npy`` file (no pickles)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except OSError as exc:
        raise InputError(f"cannot read {os.fspath(path)}: {_one_line(exc)}") from None
    if magic != b"\x93NUMPY":  # (numpy's own message for such a file is about pickles)
        raise InputError(f"{os.fspath(path)} is not a .npy file (it does not start with numpy's magic "
                         "bytes); write arrays with numpy.save")
    try:
        a = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"cannot read {os.fspath(path)} as .npy: {_one_line(exc)}") from None
    if not isinstance(a, np.ndarray):
        raise InputError(f"{os.fspath(path)} is not an .npy file")
    return _check_numeric(a, os.fspath(path))


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """An ``.npz`` file as ``{key: array}`` in the archive's order (no pickles)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise InputError(f"{os.fspath(path)} is not an .npz archive")
            out = {k: z[k] for k in z.files}
    except InputError:
        raise
    except (ValueError, OSError, EOFError, KeyError) as exc:
        raise InputError(f"cannot read {os.fspath(path)} as .npz: {_one_line(exc)}") from None
    except Exception as exc:  # zipfile.BadZipFile and friends
        raise InputError(f"cannot read {os.fspath(path)} as .npz: {type(exc).__name__}: "
                         f"{_one_line(exc)}") from None
    if not out:
        raise InputError(f"{os.fspath(path)} holds no arrays")
    for k, a in out.items():
        _check_numeric(a, f"{os.fspath(path)}[{k}]")
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _image_layout(spec: Spec | None, where: str) -> tuple[int, int | None, int | None]:
    """(channels, height, width) an image input of ``spec`` needs (None: not fixed)."""
    if spec is None or spec.shape is None:
        return 3, None, None
    if len(spec.shape) != 4:
        raise InputError(f"{where}: images become NCHW arrays, but the model's input "
                         f"{spec.name!r} has shape {_fmt_shape(spec.shape)}")
    c, h, w = spec.shape[1:]
    return (3 if c is None else c), h, w


def load_image(path: str | os.PathLike, spec: Spec | None = None,
               pre: Preprocess = Preprocess()) -> np.ndarray:
    """An image file as a ``(1, C, H, W)`` float32 array: converted to the channel count the
    model's input declares (1: grey, 3: RGB, 4: RGBA), resized to ``pre.size`` or the declared
    height and width (bilinear), then ``(pixel / scale - mean) / std``."""
    where = os.fspath(path)
    channels, h, w = _image_layout(spec, where)
    modes = {1: "L", 3: "RGB", 4: "RGBA"}
    if channels not in modes:
        raise InputError(f"{where}: the model's input has {channels} channels; images give 1, 3 or 4")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise InputError("reading images needs Pillow: pip install -e '.[image]' (in the kuiper-xp checkout)") from None
    try:
        with Image.open(path) as im:
            im = im.convert(modes[channels])
            size = pre.size or ((h, w) if h is not None and w is not None else None)
            if size is not None and (im.height, im.width) != tuple(size):
                im = im.resize((int(size[1]), int(size[0])), Image.Resampling.BILINEAR)
            a = np.asarray(im, dtype=np.float32)
    except UnidentifiedImageError:
        raise InputError(f"cannot decode image {where}: not an image Pillow can read") from None
    except (OSError, ValueError, SyntaxError) as exc:  # truncated files, bad headers
        raise InputError(f"cannot decode image {where}: {_one_line(exc)}") from None
    a = a[:, :, None] if a.ndim == 2 else a
    a = a / np.float32(pre.scale)
    for name, vals in (("mean", pre.mean), ("std", pre.std)):
        if vals is not None and len(vals) not in (1, channels):
            raise OptionError(f"--{name} has {len(vals)} values; the model's input has {channels} "
                             f"channel(s): give 1 or {channels}")
    if pre.mean is not None:
        a = a - np.asarray(pre.mean, dtype=np.float32)
    if pre.std is not None:
        std = np.asarray(pre.std, dtype=np.float32)
        if np.any(std == 0):
            raise OptionError("--std must not be 0")
        a = a / std
    return np.ascontiguousarray(np.transpose(a, (2, 0, 1))[None], dtype=np.float32)


# -- fitting arrays to the model ------------------------------------------------------------------
def fit_to_spec(a: np.ndarray, spec: Spec, where: str, notes: list[str] | None = None) -> np.ndarray:
    """``a`` checked against the model input ``spec``: a missing batch dimension is added (one
    sample of a batched input), float64 (or integer) data is cast to the declared float dtype with
    a note appended to ``notes``; a shape that cannot fit raises :class:`InputError`."""
    a = np.asarray(a)
    if spec.shape is not None:
        exp = tuple(spec.shape)
        if a.ndim == len(exp) - 1 and exp and (exp[0] is None or exp[0] == 1):
            a = a[None]
        bad = a.ndim != len(exp) or any(e is not None and e != s for e, s in zip(exp[1:], a.shape[1:]))
        if bad:
            raise InputError(f"{where} has shape {_fmt_shape(a.shape)}, but the model's input "
                             f"{spec.name!r} is {_fmt_shape(exp)}")
    if spec.dtype is not None and a.dtype.name != spec.dtype:
        try:
            target = np.dtype(spec.dtype)
        except TypeError:
            raise InputError(f"the model's input {spec.name!r} has dtype {spec.dtype}, which numpy "
                             "cannot hold") from None
        ok = ((target.kind == "f" and a.dtype.kind in "fiub")
              or (target.kind in "iu" and a.dtype.kind in "iub")
              or (target.kind == "c" and a.dtype.kind in "fiubc")
              or (target.kind == "b" and a.dtype.kind == "b"))
        if not ok:
            raise InputError(f"{where} has dtype {a.dtype.name}, but the model's input "
                             f"{spec.name!r} is {spec.dtype}; convert it first")
        if notes is not None:
            note = f"{a.dtype.name} input cast to {spec.dtype} (the model's declared dtype of {spec.name!r})"
            if note not in notes:
                notes.append(note)
        with np.errstate(over="ignore", invalid="ignore"):
            b = a.astype(target)
        if notes is not None and target.kind in "fc" and a.dtype.kind in "fc":
            lost = int(np.count_nonzero(np.isinf(b) & np.isfinite(a)))
            if lost:  # (numpy would print an overflow RuntimeWarning from here)
                notes.append(f"{where}: {lost} value(s) beyond {spec.dtype}'s range became inf in the cast")
        a = b
    return np.ascontiguousarray(a)


def _batch_dims_match(arrays: Sequence[np.ndarray], specs: Sequence[Spec]) -> bool:
    if not arrays or any(a.ndim == 0 for a in arrays):
        return False
    n = arrays[0].shape[0]
    if any(a.shape[0] != n for a in arrays):
        return False
    first = {None if s.shape is None or not s.shape else s.shape[0] for s in specs}
    return len(first) == 1


def _pick_from_npz(arrays: dict[str, np.ndarray], spec: Spec, k: int, n_inputs: int,
                   aliases: Sequence[str], where: str) -> np.ndarray:
    for key in (spec.name, *aliases):
        if key and key in arrays:
            return arrays[key]
    if f"arr_{k}" in arrays:
        return arrays[f"arr_{k}"]
    if n_inputs == 1 and len(arrays) == 1:
        return next(iter(arrays.values()))
    names = [spec.name, *[a for a in aliases if a]]
    raise InputError(f"{where} has arrays {sorted(arrays)}; none is named "
                     f"{' or '.join(repr(n) for n in names)} or 'arr_{k}' (model input {k})")


def load_array(path: str | os.PathLike, spec: Spec | None = None,
               pre: Preprocess = Preprocess()) -> np.ndarray:
    """One input file as one array, as stored: an ``.npy``; the only array of an ``.npz`` (or
    its ``arr_0``, or ``spec.name``); an image as ``(C, H, W)`` float32 without a batch axis
    (see :func:`load_image`; RGB at its own size when ``spec`` is None)."""
    p = Path(path)
    ext = p.suffix.lower()
    if not p.is_file():
        raise InputError(f"input file not found: {os.fspath(path)}")
    if ext == ".npy":
        return read_npy(p)
    if ext == ".npz":
        arrays = read_npz(p)
        return _pick_from_npz(arrays, spec or _NoSpec(), 0, 1, (), str(p))
    return load_image(p, spec, pre)[0]


@dataclass(frozen=True)
class _NoSpec:
    name: str = ""
    shape: tuple[int | None, ...] | None = None
    dtype: str | None = None


def _read_one(path: Path, spec: Spec, pre: Preprocess) -> np.ndarray:
    ext = path.suffix.lower()
    if ext == ".npy":
        return read_npy(path)
    if ext == ".npz":
        arrays = read_npz(path)
        return _pick_from_npz(arrays, spec, 0, 1, (), str(path))
    return load_image(path, spec, pre)


def load_samples(sources: Sequence[str], specs: Sequence[Spec], pre: Preprocess = Preprocess(),
                 notes: list[str] | None = None, aliases: Sequence[Sequence[str]] = ()) -> list[Sample]:
    """Read every input named by ``sources`` (files, directories, globs; ``NAME=PATH`` to give
    one model input by name) into samples fitted to ``specs`` (the model's inputs, in order).

    A single-input model takes one sample per file (an ``.npy`` may hold a batch). A model with
    several inputs takes ``.npz`` files with one array per input (keys: input names, or
    ``arr_0``, ``arr_1``, ... by position), exactly one file per input in order, or
    ``NAME=PATH`` for each input (directories/globs paired in sorted order).
    ``aliases[k]`` are other accepted names for input k (the pnnx.Input operator's name).
    """
    if not specs:
        raise InputError("the model declares no inputs")
    n_in = len(specs)
    alias = [tuple(aliases[k]) if k < len(aliases) else () for k in range(n_in)]
    index: dict[str, int] = {}
    for k, s in enumerate(specs):
        for name in (s.name, *alias[k]):
            if name:
                index.setdefault(name, k)

    named: dict[int, str] = {}
    plain: list[str] = []
    for src in sources:
        key, sep, rest = str(src).partition("=")
        if sep and key in index and not Path(src).exists():
            k = index[key]
            if k in named:
                raise InputError(f"model input {specs[k].name!r} is given twice")
            named[k] = rest
        elif sep and key and "/" not in key and not Path(src).exists() and Path(rest).exists():
            names = ", ".join(repr(n) for n in index)
            raise OptionError(f"--input {src}: the model has no input named {key!r}; its inputs are {names} "
                              "(as kuiper-xp inspect lists them)")
        else:
            plain.append(str(src))

    def fit(a: np.ndarray, k: int, where: str) -> np.ndarray:
        return fit_to_spec(a, specs[k], where, notes)

    samples: list[Sample] = []
    if named:
        if plain:
            raise InputError("give every input as NAME=PATH, or none: mixed named and plain inputs")
        missing = [specs[k].name for k in range(n_in) if k not in named]
        if missing:
            raise InputError(f"missing model input(s) {missing}; the model's inputs are "
                             f"{[s.name for s in specs]}")
        lists = {k: expand_inputs([named[k]]) for k in range(n_in)}
        counts = {len(v) for v in lists.values()}
        if len(counts) != 1:
            raise InputError("NAME=PATH inputs name different numbers of files: "
                             + ", ".join(f"{specs[k].name}: {len(v)}" for k, v in lists.items()))
        for j in range(counts.pop()):
            arrays = [fit(_read_one(lists[k][j], specs[k], pre), k, str(lists[k][j])) for k in range(n_in)]
            samples.append(_sample(" + ".join(str(lists[k][j]) for k in range(n_in)), arrays, specs))
        return samples

    files = expand_inputs(plain)
    if not files:
        raise InputError("no inputs given")
    if n_in == 1:
        for f in files:
            samples.append(_sample(str(f), [fit(_read_one(f, specs[0], pre), 0, str(f))], specs))
        return samples

    if all(f.suffix.lower() == ".npz" for f in files):
        for f in files:
            arrays = read_npz(f)
            got = [fit(_pick_from_npz(arrays, specs[k], k, n_in, alias[k], str(f)), k,
                       f"{f}[{specs[k].name}]") for k in range(n_in)]
            samples.append(_sample(str(f), got, specs))
        return samples
    if len(files) == n_in and not any(f.suffix.lower() == ".npz" for f in files):
        arrays = [fit(_read_one(f, specs[k], pre), k, str(f)) for k, f in enumerate(files)]
        return [_sample(" + ".join(str(f) for f in files), arrays, specs)]
    raise InputError(
        f"the model has {n_in} inputs ({', '.join(s.name for s in specs)}) and {len(files)} input "
        f"file(s) were given; give one .npz per sample with one array per input (keys = input names "
        f"or arr_0, arr_1, ...), exactly {n_in} files (one per input, in order), or NAME=PATH per input")


def _sample(source: str, arrays: list[np.ndarray], specs: Sequence[Spec]) -> Sample:
    ok = _batch_dims_match(arrays, specs)
    count = arrays[0].shape[0] if ok else 1
    return Sample(source, arrays, count, ok)


# -- batching -----------------------------------------------------------------------------------------
def _static_batch(specs: Sequence[Spec]) -> int | None:
    s = specs[0].shape
    return None if s is None or not s else s[0]


def make_batches(samples: Sequence[Sample], batch_size: int, specs: Sequence[Spec]) -> Iterator[Batch]:
    """Concatenate consecutive samples of the same trailing shapes and cut them into batches of
    ``batch_size`` rows (or the model's static batch size, padding the last batch with zeros).
    A sample whose inputs have no common batch dimension runs on its own, as it is."""
    if batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}")
    static = _static_batch(specs)
    size = static if static is not None else batch_size
    group: list[Sample] = []

    def key(s: Sample) -> tuple:
        return tuple((a.shape[1:], a.dtype.str) for a in s.arrays)

    def flush() -> Iterator[Batch]:
        if not group:
            return
        rows = [(s.source, i) if s.count > 1 else (s.source, -1) for s in group for i in range(s.count)]
        cat = [np.concatenate([s.arrays[k] for s in group], axis=0) if len(group) > 1 else group[0].arrays[k]
               for k in range(len(specs))]
        total = len(rows)
        if total == 0:  # inputs of 0 rows: the model runs once on them (outputs of 0 rows, as torch)
            part = [np.concatenate([a, np.zeros((static,) + a.shape[1:], dtype=a.dtype)]) if static else a
                    for a in cat]
            yield Batch(part, 0, static or 0, [])
        for lo in range(0, total, size):
            hi = min(lo + size, total)
            part = [a[lo:hi] for a in cat]
            pad = 0
            if static is not None and hi - lo < static:
                pad = static - (hi - lo)
                part = [np.concatenate([a, np.zeros((pad,) + a.shape[1:], dtype=a.dtype)]) for a in part]
            yield Batch(part, hi - lo, pad, rows[lo:hi], regrouped=len(group) > 1 or total > size or pad > 0)
        group.clear()

    for s in samples:
        if not s.batchable:
            yield from flush()
            yield Batch(list(s.arrays), 1, 0, [(s.source, -1)])
            continue
        if group and key(group[0]) != key(s):
            yield from flush()
        group.append(s)
    yield from flush()


def concat_outputs(per_batch: Sequence[Sequence[np.ndarray]], batches: Sequence[Batch],
                   names: Sequence[str]) -> list[np.ndarray]:
    """The outputs of every batch joined along the batch dimension (padding rows dropped). An
    output of a regrouped batch (rows split, joined or padded) whose first dimension is not the
    batch's rows raises :class:`InputError`: it reduces or mixes the rows (``x.mean(0)``), so
    the batches' results cannot stand for the samples' own."""
    if not per_batch:
        return []
    out: list[np.ndarray] = []
    for k, name in enumerate(names):
        parts = []
        for outs, b in zip(per_batch, batches):
            a = outs[k]
            if b.regrouped and (a.ndim == 0 or a.shape[0] != b.n + b.pad):
                how = (f"padded with {b.pad} zero row(s) to the model's static batch of {b.n + b.pad}"
                       if b.pad else f"cut into batches of at most {b.n + b.pad} row(s)")
                fix = ("give inputs of exactly the static batch's rows" if b.pad else
                       "run all rows in one call (--batch-size at least the number of rows; a model "
                       "exported with a static batch: one input file of that many rows per command)")
                raise InputError(f"output {name!r} has shape {tuple(a.shape)} for a batch of {b.n + b.pad} "
                                 f"row(s): its first dimension is not the batch's, so the model reduces or "
                                 f"mixes rows and the inputs, {how}, would not give the samples' own "
                                 f"results; {fix}")
            if b.pad:
                a = a[: b.n]
            parts.append(a)
        if len(parts) == 1:
            out.append(parts[0])
            continue
        shapes = {p.shape[1:] for p in parts}
        if len(shapes) != 1 or any(p.ndim == 0 for p in parts):
            raise InputError(f"output {name!r} has different shapes across batches "
                             f"({sorted(str(p.shape) for p in parts)[:4]}); run with a larger "
                             "--batch-size or fewer inputs to save it")
        out.append(np.concatenate(parts, axis=0))
    return out


# -- writing ------------------------------------------------------------------------------------------
def save_outputs(path: str | os.PathLike, names: Sequence[str], arrays: Sequence[np.ndarray]) -> Path:
    """Write the model's outputs: ``.npy`` for a single output, ``.npz`` (keys = output names)
    for one or several."""
    p = Path(path)
    ext = p.suffix.lower()
    if ext == ".npy":
        if len(arrays) != 1:
            raise InputError(f"the model has {len(arrays)} outputs ({', '.join(names)}); "
                             f"write them to an .npz file, not {p.name}")
        with open(p, "wb") as fh:
            np.save(fh, np.asarray(arrays[0]), allow_pickle=False)
    elif ext == ".npz":
        keys = _unique_keys(names)
        with open(p, "wb") as fh:
            np.savez(fh, **{k: np.asarray(a) for k, a in zip(keys, arrays)})
    else:
        raise InputError(f"output file {p} must end in .npy (one output) or .npz")
    return p


def _unique_keys(names: Sequence[str]) -> list[str]:
    keys: list[str] = []
    for i, n in enumerate(names):
        k = n or f"arr_{i}"
        while k in keys:
            k = f"{k}_{i}"
        keys.append(k)
    return keys


# -- random inputs (bench) ---------------------------------------------------------------------------
def random_inputs(specs: Sequence[Spec], batch: int, shapes: dict[str, tuple[int, ...]] | None = None,
                  seed: int = 0, highs: dict[str, int] | None = None) -> list[np.ndarray]:
    """Seeded random arrays of the model's declared input shapes (a dynamic first dimension is
    ``batch``); ``shapes`` overrides the shape of an input by name. Floats are standard normal,
    integers in [0, 10) (in [0, ``highs[name]``) where given: token ids for an embedding of that
    many rows), booleans fair coins."""
    rng = np.random.default_rng(seed)
    out = []
    for k, s in enumerate(specs):
        shape: Any = (shapes or {}).get(s.name) or (shapes or {}).get(str(k))
        if shape is None:
            if s.shape is None:
                raise InputError(f"model input {s.name!r} has no declared shape; give --shape "
                                 f"{s.name}=D0,D1,...")
            dims = []
            for i, d in enumerate(s.shape):
                if d is None and i > 0:
                    raise InputError(f"model input {s.name!r} {_fmt_shape(s.shape)} has a dynamic "
                                     f"dimension {i}; give its shape after the batch, --shape "
                                     f"{s.name}=D1,D2,... (or the whole shape)")
                dims.append(batch if d is None else d)
            shape = tuple(dims)
        dt = np.dtype(s.dtype or "float32")
        if dt.kind == "f" or dt.kind == "c":
            a = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            a = rng.integers(0, max(1, (highs or {}).get(s.name, 10)), size=shape).astype(dt)
        elif dt.kind == "b":
            a = rng.random(shape) < 0.5
        else:
            raise InputError(f"cannot make random data of dtype {dt} for input {s.name!r}")
        out.append(np.ascontiguousarray(a))
    return out
