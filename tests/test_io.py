"""kuiper_xp.io: finding input files, reading .npy/.npz/images, fitting them to a model's inputs,
batching, writing outputs. Expected image values are computed here with Pillow and numpy from
the documented recipe ``(pixel / scale - mean) / std``, NCHW float32."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kuiper_xp import io as kio
from kuiper_xp.errors import InputError, KuiperXPError

Image = pytest.importorskip("PIL.Image")


@dataclass(frozen=True)
class Spec:
    name: str
    shape: tuple | None
    dtype: str | None = "float32"


RGB = Spec("x", (None, 3, 4, 4))


def _png(path, w=6, h=5, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    ch = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    a = rng.integers(0, 256, size=(h, w, ch) if ch > 1 else (h, w), dtype=np.uint8)
    Image.fromarray(a, mode=mode).save(path)
    return path


def _expected(path, size, mode, mean=None, std=None, scale=255.0):
    with Image.open(path) as im:
        im = im.convert(mode)
        if size is not None and (im.height, im.width) != size:
            im = im.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        a = np.asarray(im).astype(np.float32)
    if a.ndim == 2:
        a = a[:, :, None]
    a = a / np.float32(scale)
    if mean is not None:
        a = a - np.asarray(mean, np.float32)
    if std is not None:
        a = a / np.asarray(std, np.float32)
    return a.transpose(2, 0, 1)[None]


# -- expand_inputs ------------------------------------------------------------------------------------
def test_expand_file_directory_and_glob(tmp_path):
    for n in ("b.npy", "a.npy", "c.png", "notes.txt"):
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    names = [p.name for p in kio.expand_inputs([tmp_path])]
    assert names == ["a.npy", "b.npy", "c.png"], "directory: usable files only, sorted, not recursive"
    assert [p.name for p in kio.expand_inputs([str(tmp_path / "*.npy")])] == ["a.npy", "b.npy"]
    assert [p.name for p in kio.expand_inputs([tmp_path / "b.npy", tmp_path / "a.npy"])] == ["b.npy", "a.npy"]


@pytest.mark.parametrize("case, match", [
    ("missing", "input file not found"),
    ("empty_dir", "has no usable inputs"),
    ("no_match", "matches nothing"),
])
def test_expand_errors_are_input_errors(tmp_path, case, match):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("x")
    arg = {"missing": tmp_path / "nope.npy", "empty_dir": tmp_path / "empty",
           "no_match": str(tmp_path / "*.npz")}[case]
    with pytest.raises(InputError, match=match) as ei:
        kio.expand_inputs([arg])
    assert isinstance(ei.value, KuiperXPError) and isinstance(ei.value, ValueError)


# -- reading arrays -----------------------------------------------------------------------------------
def test_npy_and_npz_round_trip(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "b.npz", first=a, second=a[:1])
    got = kio.read_npy(tmp_path / "a.npy")
    assert got.dtype == np.float32 and np.array_equal(got, a)
    z = kio.read_npz(tmp_path / "b.npz")
    assert list(z) == ["first", "second"] and np.array_equal(z["second"], a[:1])


def test_pickled_npy_is_refused(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="cannot read .*obj.npy as .npy"):
        kio.read_npy(tmp_path / "obj.npy")


def test_npy_that_is_not_one_says_so(tmp_path):
    """A text file named .npy: numpy's message would invite allow_pickle=True."""
    (tmp_path / "x.npy").write_text("1 2 3\n")
    with pytest.raises(InputError, match=r"x.npy is not a .npy file") as e:
        kio.read_npy(tmp_path / "x.npy")
    assert "pickle" not in str(e.value)


def test_garbage_npz_is_an_input_error(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"PK not really a zip")
    with pytest.raises(InputError, match="bad.npz"):
        kio.read_npz(tmp_path / "bad.npz")


# -- fit_to_spec --------------------------------------------------------------------------------------
def test_fit_adds_the_batch_dimension_of_one_sample():
    got = kio.fit_to_spec(np.zeros((3, 4, 4), np.float32), RGB, "x.npy")
    assert got.shape == (1, 3, 4, 4)


def test_fit_casts_float64_with_a_note():
    notes = []
    a = np.linspace(-1, 1, 2 * 48).reshape(2, 3, 4, 4)
    got = kio.fit_to_spec(a, RGB, "x.npy", notes)
    assert got.dtype == np.float32 and np.array_equal(got, a.astype(np.float32))
    assert notes == ["float64 input cast to float32 (the model's declared dtype of 'x')"]
    kio.fit_to_spec(a, RGB, "y.npy", notes)
    assert len(notes) == 1, "the same note is given once"


def test_fit_rejects_wrong_shape_and_float_to_int():
    with pytest.raises(InputError, match=r"x.npy has shape \(2, 3, 5, 4\).*'x' is \(\?, 3, 4, 4\)"):
        kio.fit_to_spec(np.zeros((2, 3, 5, 4), np.float32), RGB, "x.npy")
    with pytest.raises(InputError, match="has dtype float32.*int64"):
        kio.fit_to_spec(np.zeros((2, 5), np.float32), Spec("ids", (None, 5), "int64"), "ids.npy")


# -- images -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, channels, mean, std", [
    ("RGB", 3, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)),
    ("L", 1, (0.5,), (0.25,)),
    ("RGBA", 4, None, None),
])
def test_image_to_nchw_float32(tmp_path, mode, channels, mean, std):
    path = _png(tmp_path / "im.png", mode="RGB")  # converted to the model's channel count
    spec = Spec("x", (None, channels, 4, 3))
    got = kio.load_image(path, spec, kio.Preprocess(mean=mean, std=std))
    exp = _expected(path, (4, 3), mode, mean, std)
    assert got.shape == (1, channels, 4, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-6)


def test_image_size_option_wins_and_dynamic_keeps_native_size(tmp_path):
    path = _png(tmp_path / "im.jpg", w=7, h=9)
    got = kio.load_image(path, Spec("x", (None, 3, 4, 4)), kio.Preprocess(size=(5, 6), scale=1.0))
    np.testing.assert_allclose(got, _expected(path, (5, 6), "RGB", scale=1.0), rtol=1e-6)
    native = kio.load_image(path, Spec("x", (None, 3, None, None)))
    assert native.shape == (1, 3, 9, 7)


def test_image_errors(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"this is not a png")
    with pytest.raises(InputError, match="cannot decode image .*bad.png"):
        kio.load_image(bad, RGB)
    good = _png(tmp_path / "ok.png")
    trunc = tmp_path / "trunc.png"
    trunc.write_bytes(good.read_bytes()[:60])
    with pytest.raises(InputError, match="cannot decode image .*trunc.png"):
        kio.load_image(trunc, RGB)
    with pytest.raises(InputError, match="--mean has 2 values"):
        kio.load_image(good, RGB, kio.Preprocess(mean=(0.1, 0.2)))
    with pytest.raises(InputError, match="images become NCHW"):
        kio.load_image(good, Spec("x", (None, 5)))


# -- load_samples ---------------------------------------------------------------------------------------
TWO = [Spec("a", (None, 5)), Spec("b", (None, 2, 3))]


def test_single_input_one_sample_per_file(tmp_path):
    np.save(tmp_path / "0.npy", np.ones((2, 5), np.float32))
    np.save(tmp_path / "1.npy", np.ones((5,), np.float32))
    np.savez(tmp_path / "2.npz", only=np.ones((3, 5), np.float32))
    s = kio.load_samples([str(tmp_path)], [Spec("a", (None, 5))])
    assert [x.count for x in s] == [2, 1, 3]


@pytest.mark.parametrize("layout", ["names", "positional", "files", "named_dirs"])
def test_multi_input_layouts(tmp_path, layout):
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    b = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    if layout == "names":
        np.savez(tmp_path / "s.npz", b=b, a=a)
        srcs = [str(tmp_path / "s.npz")]
    elif layout == "positional":
        np.savez(tmp_path / "s.npz", a, b)
        srcs = [str(tmp_path / "s.npz")]
    elif layout == "files":
        np.save(tmp_path / "a.npy", a)
        np.save(tmp_path / "b.npy", b)
        srcs = [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    else:
        for d, arr in (("A", a), ("B", b)):
            (tmp_path / d).mkdir()
            for i in range(2):
                np.save(tmp_path / d / f"{i}.npy", arr[i])
        srcs = [f"b={tmp_path / 'B'}", f"a={tmp_path / 'A'}"]
    samples = kio.load_samples(srcs, TWO)
    got_a = np.concatenate([s.arrays[0] for s in samples])
    got_b = np.concatenate([s.arrays[1] for s in samples])
    assert np.array_equal(got_a, a) and np.array_equal(got_b, b)


def test_multi_input_errors(tmp_path):
    np.savez(tmp_path / "s.npz", x=np.zeros((1, 5), np.float32))
    with pytest.raises(InputError, match=r"has arrays \['x'\]; none is named 'a' or 'arr_0'"):
        kio.load_samples([str(tmp_path / "s.npz")], TWO)
    np.save(tmp_path / "one.npy", np.zeros((1, 5), np.float32))
    with pytest.raises(InputError, match="the model has 2 inputs"):
        kio.load_samples([str(tmp_path / "one.npy")], TWO)
    with pytest.raises(InputError, match=r"missing model input\(s\) \['b'\]"):
        kio.load_samples([f"a={tmp_path / 'one.npy'}"], TWO)


def test_pnnx_input_operator_name_is_an_alias(tmp_path):
    np.savez(tmp_path / "s.npz", in_a=np.zeros((1, 5), np.float32), in_b=np.zeros((1, 2, 3), np.float32))
    s = kio.load_samples([str(tmp_path / "s.npz")], TWO, aliases=[("in_a",), ("in_b",)])
    assert s[0].arrays[1].shape == (1, 2, 3)


# -- batching -----------------------------------------------------------------------------------------
def _samples(counts, width=5):
    out, k = [], 0
    for c in counts:
        out.append(kio.Sample(f"s{k}", [np.full((c, width), k, np.float32)], c))
        k += 1
    return out


def test_dynamic_batches_concatenate_and_split():
    spec = [Spec("a", (None, 5))]
    batches = list(kio.make_batches(_samples([2, 3, 1]), 4, spec))
    assert [b.n for b in batches] == [4, 2] and all(b.pad == 0 for b in batches)
    assert batches[0].rows == [("s0", 0), ("s0", 1), ("s1", 0), ("s1", 1)]
    outs = [[b.arrays[0] * 2] for b in batches]
    (joined,) = kio.concat_outputs(outs, batches, ["y"])
    exp = np.concatenate([s.arrays[0] for s in _samples([2, 3, 1])]) * 2
    assert np.array_equal(joined, exp)


def test_static_batch_pads_the_last_batch_and_drops_the_padding():
    spec = [Spec("a", (2, 5))]
    batches = list(kio.make_batches(_samples([3]), 64, spec))
    assert [(b.n, b.pad, b.arrays[0].shape[0]) for b in batches] == [(2, 0, 2), (1, 1, 2)]
    (joined,) = kio.concat_outputs([[b.arrays[0]] for b in batches], batches, ["y"])
    assert joined.shape == (3, 5)


def test_outputs_that_reduce_the_rows_of_regrouped_batches_are_refused():
    # x.mean(0) of a 100-row file cut into batches of 64 and 36 gave two means joined as one
    # (12,) output; a static batch padded with zero rows changed the mean itself
    spec = [Spec("a", (None, 5))]
    batches = list(kio.make_batches(_samples([100]), 64, spec))
    means = [[b.arrays[0].mean(0)] for b in batches]
    with pytest.raises(InputError, match=r"output 'm' has shape \(5,\) for a batch of 64 row\(s\).*--batch-size"):
        kio.concat_outputs(means, batches, ["m"])
    static = list(kio.make_batches(_samples([3]), 64, [Spec("a", (4, 5))]))
    assert [(b.n, b.pad) for b in static] == [(3, 1)]
    with pytest.raises(InputError, match="padded with 1 zero row.*static batch of 4"):
        kio.concat_outputs([[b.arrays[0].mean(0)] for b in static], static, ["m"])
    # one sample run as given (no split, no join, no padding): the model's own output, any shape
    (single,) = list(kio.make_batches(_samples([100]), 128, spec))
    assert not single.regrouped
    (m,) = kio.concat_outputs([[single.arrays[0].mean(0)]], [single], ["m"])
    assert m.shape == (5,)


def test_different_shapes_are_not_mixed():
    spec = [Spec("a", (None, None))]
    s = _samples([1, 1]) + _samples([1], width=3)
    batches = list(kio.make_batches(s, 8, spec))
    assert [b.arrays[0].shape for b in batches] == [(2, 5), (1, 3)]


# -- outputs ------------------------------------------------------------------------------------------
def test_save_outputs(tmp_path):
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    kio.save_outputs(tmp_path / "y.npy", ["out"], [y])
    assert np.array_equal(np.load(tmp_path / "y.npy"), y)
    kio.save_outputs(tmp_path / "y.npz", ["p", "q"], [y, y[:1]])
    with np.load(tmp_path / "y.npz") as z:
        assert z.files == ["p", "q"] and np.array_equal(z["q"], y[:1])
    with pytest.raises(InputError, match="2 outputs"):
        kio.save_outputs(tmp_path / "z.npy", ["p", "q"], [y, y])
    with pytest.raises(InputError, match=r"must end in .npy"):
        kio.save_outputs(tmp_path / "z.txt", ["p"], [y])


def test_random_inputs():
    specs = [Spec("x", (None, 3, 4, 4)), Spec("ids", (None, 7), "int64"), Spec("m", (2,), "bool")]
    a = kio.random_inputs(specs, batch=5, seed=1)
    assert [(x.shape, x.dtype.name) for x in a] == [((5, 3, 4, 4), "float32"), ((5, 7), "int64"),
                                                     ((2,), "bool")]
    b = kio.random_inputs(specs, batch=5, seed=1)
    assert all(np.array_equal(p, q) for p, q in zip(a, b)), "seeded"
    with pytest.raises(InputError, match="dynamic dimension 2"):
        kio.random_inputs([Spec("x", (None, 3, None))], batch=1)
    (c,) = kio.random_inputs([Spec("x", (None, 3, None))], batch=1, shapes={"x": (2, 3, 9)})
    assert c.shape == (2, 3, 9)


def test_load_array_one_item_per_file(tmp_path):
    """kuiper_xp.dask's default loader: one item per file, no batch axis added."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "a.npz", a)
    assert np.array_equal(kio.load_array(tmp_path / "a.npy"), a)
    assert np.array_equal(kio.load_array(tmp_path / "a.npz"), a)
    path = _png(tmp_path / "im.png", w=6, h=5)
    np.testing.assert_allclose(kio.load_array(path), _expected(path, None, "RGB")[0], rtol=1e-6)
    with pytest.raises(InputError, match="input file not found"):
        kio.load_array(tmp_path / "none.npy")
