"""Elementwise math operators pnnx keeps as their own ops (kuiper_xp.layers.mathops): special
functions (lgamma, digamma, erfinv, erfc, erfcx, ndtr, ndtri, log_ndtr), clamp_min / clamp_max,
logit, lerp, addcmul / addcdiv, nan_to_num, the float predicates, hypot / xlogy / heaviside /
copysign / fmin / fmax / float_power / logaddexp2 / nextafter / ldexp, the integer shifts and
``t`` / ``view_as`` / ``reshape_as``: pnnx exports of small torch modules run on every backend
leg and compared with torch, the special functions over wide ranges (poles, infinities, NaN, far
tails) against torch in float32 and float64, and the errors for inputs torch refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_close
from helpers import Fn, case_exporter
from test_layers_misc import make_layer, t2n

import kuiper_xp
from kuiper_xp.errors import LayerParameterError, ShapeError


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _r(*shape, seed=0, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=_g(seed), dtype=torch.float64) * scale).to(dtype)


def _u(*shape, seed=0, lo=0.0, hi=1.0, dtype=torch.float32):
    return (torch.rand(*shape, generator=_g(seed), dtype=torch.float64) * (hi - lo) + lo).to(dtype)


_SPECIAL = torch.tensor([0.0, -0.0, 1.0, 2.0, -1.0, -2.5, 0.5, float("inf"), -float("inf"), float("nan")])


def _unary_all(x, u, p):
    return (torch.lgamma(x), torch.digamma(x), torch.erfc(x), torch.special.erfcx(x), torch.special.ndtr(x),
            torch.special.log_ndtr(x), torch.exp2(x), torch.sinc(x), torch.frac(x), torch.deg2rad(x),
            torch.rad2deg(x), torch.sgn(x), torch.special.entr(x), torch.log2(x), torch.erfinv(u),
            torch.special.ndtri(p), torch.logit(p), torch.logit(p, eps=0.2), torch.special.gammaln(x),
            torch.positive(x), torch.mvlgamma(x.abs() + 1.5, 3))


def _with_specials(x):
    x = x.clone()
    x.view(-1)[: _SPECIAL.numel()] = _SPECIAL.to(x.dtype)
    return x


_UNARY_TYPES = {"torch.lgamma", "aten::digamma", "aten::erfc", "aten::special_erfcx", "aten::special_ndtr",
                "aten::special_log_ndtr", "aten::exp2", "aten::sinc", "aten::frac", "aten::deg2rad", "aten::rad2deg",
                "aten::sgn", "aten::special_entr", "aten::log2", "aten::erfinv", "aten::special_ndtri", "aten::logit",
                "torch.positive", "aten::mvlgamma"}


def _binary_all(a, b):
    return (torch.hypot(a, b), torch.copysign(a, b), torch.nextafter(a, b), torch.fmin(a, b), torch.fmax(a, b),
            torch.float_power(a.abs(), b), torch.float_power(2, a), torch.logaddexp2(a, b), torch.xlogy(a, b.abs()),
            torch.xlogy(2.0, b), torch.special.xlog1py(a, b), torch.heaviside(a, b), a.clamp_min(0.25),
            torch.clamp_max(a, b), a.clamp_min(b[0]), torch.ldexp(a, torch.tensor([3, -2, 0, 1])),
            torch.hypot(a, torch.tensor(3.0)))


_BINARY_TYPES = {"aten::hypot", "aten::copysign", "aten::nextafter", "aten::fmin", "aten::fmax", "aten::float_power",
                 "aten::logaddexp2", "aten::xlogy", "aten::special_xlog1py", "aten::heaviside", "aten::clamp_min",
                 "aten::clamp_max", "aten::ldexp"}


def _with_nan(a, seed):
    a = a.clone()
    a[0, 0], a[1, seed % 4], a[2, 1] = float("nan"), float("inf"), 0.0
    return a


_INTS = torch.tensor([[-9, -1, 0, 1], [2, 5, 63, 64], [-64, 7, 100, -100]])

# name -> (module, inputs, types the export must contain)
CASES = {
    # torch.sgn of a complex tensor: z / |z|, 0 at 0 (real parts zeroed where a <= 0 below)
    "sgn_complex": (Fn(lambda a, b: torch.view_as_real(torch.sgn(torch.complex(a * (a > 0), b * (a > 0))))),
                    (_r(3, 5), _r(3, 5, seed=1)), {"aten::sgn", "torch.complex"}),
    # torch.isclose: defaults, tolerances, equal_nan, infinities, integers, broadcasting
    "isclose": (Fn(lambda a, b, i: (torch.isclose(a, b), torch.isclose(a, b, rtol=0.3, atol=0.1),
                                    torch.isclose(a, b, equal_nan=True), torch.isclose(a, a, rtol=0, atol=0),
                                    torch.isclose(a, a + 1e-7), torch.isclose(i, i.flip(0), atol=2),
                                    torch.isclose(a, b[:1], rtol=1.0))),
                (_with_nan(_r(3, 4, scale=3), 0), _with_nan(_r(3, 4, seed=1, scale=3), 0), _INTS), {"aten::isclose"}),
    "views": (Fn(lambda x, y, z: (x.t() * 2, torch.t(x[0]), y.view_as(x), z.reshape_as(x.t()))),
              (_r(3, 4), _r(12, seed=1), _r(2, 6, seed=2)), {"torch.t", "aten::view_as", "Tensor.reshape_as"}),
    "transposes": (Fn(lambda x, y: (x.T @ x + 1, y.mT * 2, torch.adjoint(y) + 0, torch.fft.fft(y).mH.real)),
                   (_r(3, 4), _r(2, 3, 5, seed=1)), {"aten::numpy_T", "aten::mT", "aten::mH"}),
    "unary_f32": (Fn(_unary_all), (_with_specials(_r(6, 7, scale=8)), _with_specials(_u(6, 7, lo=-1)),
                                   _with_specials(_u(6, 7))), _UNARY_TYPES),
    "unary_f64": (Fn(_unary_all), (_with_specials(_r(6, 7, scale=8, dtype=torch.float64)),
                                   _u(6, 7, lo=-1, dtype=torch.float64), _u(6, 7, dtype=torch.float64)), _UNARY_TYPES),
    "unary_int": (Fn(lambda i: (torch.lgamma(i), torch.exp2(i), torch.sinc(i), torch.isfinite(i), torch.signbit(i),
                                i.clamp_min(0.5), i.clamp_max(3), torch.xlogy(i, 3), torch.digamma(i),
                                torch.nan_to_num(i), torch.copysign(i, -1 * i), torch.fmin(i, i.flip(0)),
                                torch.sgn(i), torch.positive(i), torch.addcmul(i, i, i, value=2))),
                  (_INTS,), {"torch.lgamma", "aten::clamp_min", "aten::clamp_max", "aten::signbit", "aten::addcmul"}),
    "binary_f32": (Fn(_binary_all), (_with_nan(_r(3, 4, scale=3), 0), _with_nan(_r(3, 4, seed=1, scale=3), 1)),
                   _BINARY_TYPES),
    "binary_f64": (Fn(_binary_all), (_r(3, 4, scale=3, dtype=torch.float64), _r(3, 4, seed=1, dtype=torch.float64)),
                   _BINARY_TYPES),
    "predicates": (Fn(lambda x: (torch.isfinite(x), torch.isnan(x), torch.isinf(x), torch.isposinf(x),
                                 torch.isneginf(x), torch.signbit(x), torch.isreal(x), torch.nan_to_num(x),
                                 torch.nan_to_num(x, nan=1.5, posinf=2.0, neginf=-3.0), x.nan_to_num(0.0),
                                 torch.nan_to_num(x.double(), posinf=5.0), torch.nan_to_num(x, posinf=1e39))),
                   (torch.tensor([[0.0, -0.0, 1.0, -2.0], [float("nan"), float("inf"), -float("inf"), 3e38]]),),
                   {"aten::isfinite", "aten::isnan", "aten::isinf", "aten::isposinf", "aten::isneginf", "aten::signbit",
                    "aten::isreal", "aten::nan_to_num"}),
    "ternary": (Fn(lambda a, b, w: (torch.lerp(a, b, 0.3), a.lerp(b, 0.75), torch.lerp(a, b, w), torch.lerp(a, b, w[0]),
                                    torch.addcmul(a, b, w, value=0.5), torch.addcmul(a, b, w), torch.addcdiv(a, b, w, value=2),
                                    torch.addcdiv(a, b, w.abs() + 0.5))),
                (_r(3, 4), _r(3, 4, seed=1, scale=5), _u(3, 4, lo=-1, hi=2)),
                {"aten::lerp", "aten::addcmul", "aten::addcdiv"}),
    "shifts": (Fn(lambda a, b, c: (torch.bitwise_left_shift(a, b), torch.bitwise_right_shift(a, b),
                                   torch.bitwise_left_shift(c, 2), torch.bitwise_right_shift(c, 1),
                                   torch.bitwise_left_shift(c, c), torch.bitwise_right_shift(c, a))),
               (_INTS, torch.tensor([[63, 64, -1, 2], [0, 1, 5, 70], [3, -5, 1, 62]]),
                torch.tensor([[-128, -1, 7, 8], [64, 1, 3, 127], [9, -9, 0, 100]], dtype=torch.int8)),
               {"torch.bitwise_left_shift", "torch.bitwise_right_shift"}),
    "bessel": (Fn(lambda x, i: (torch.i0(x), torch.special.i0(x * 10), torch.special.i0e(x * 40), torch.special.i1(x * 5),
                                torch.special.i1e(x * 50), torch.i0(i))),
               (_r(3, 4), torch.tensor([[0, 3, -20]])),
               {"aten::i0", "aten::special_i0e", "aten::special_i1", "aten::special_i1e"}),
    "frexp": (Fn(lambda x, d: (*torch.frexp(x * 1e3), *torch.frexp(d), torch.frexp(x)[0] * 2)),
              (_r(3, 4), _r(2, 3, seed=1, dtype=torch.float64)), {"aten::frexp"}),
    "zeta": (Fn(lambda x, q, i: (torch.special.zeta(x.abs() + 1.5, q), torch.special.zeta(x.abs() * 3 + 1, 2.5),
                                 torch.special.zeta(3.0, q), torch.special.zeta(i, i + 0.5))),
             (_r(3, 4), _r(3, 4, seed=1, scale=4), torch.tensor([[2, 3, 5, 8]])), {"aten::special_zeta"}),
    "polygamma": (Fn(lambda x, i: (torch.polygamma(0, x), torch.polygamma(1, x * 3), torch.polygamma(2, x + 2.5),
                                   torch.special.polygamma(3, x * 4), torch.polygamma(5, i))),
                  (_r(3, 4), torch.tensor([[1, 3, -2, 7]])), {"aten::polygamma"}),
    # signs, zeros, coprimes, a broadcast, int32 and int8 tensors
    "gcd_lcm": (Fn(lambda a, b, c: (torch.gcd(a, b), torch.lcm(a, b), torch.gcd(a, b[:1]), torch.lcm(c, c.flip(1)),
                                    torch.gcd(c, c.flip(0)), torch.lcm(a.int(), b.int()))),
                (torch.tensor([[-4, 6, 0, 0, 17], [12, -18, 35, 1, -9]]),
                 torch.tensor([[6, -9, 5, 0, 5], [8, 27, 64, 1, -3]]),
                 torch.tensor([[4, -6, 10], [0, 15, -25]], dtype=torch.int8)),
                {"aten::gcd", "aten::lcm"}),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return case_exporter(tmp_path_factory, CASES)


def _close(got, want, rtol, atol, what):
    """Element by element: |got - want| <= rtol |want| + atol; NaN and infinities where torch has them."""
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{what}: NaN positions differ")
    inf = np.isinf(want)
    np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"{what}: infinities differ")
    fin = ~nan & ~inf
    g, w = got[fin].astype(np.float64), want[fin].astype(np.float64)
    bad = np.abs(g - w) > rtol * np.abs(w) + atol
    if bad.any():
        k = np.argmax(np.abs(g - w) - rtol * np.abs(w))
        pytest.fail(f"{what}: {bad.sum()} values differ, e.g. got {g[k]!r} want {w[k]!r}")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name, backend, exported):
    module, inputs, _ = CASES[name]
    param = exported(name)
    with torch.no_grad():
        want = module.eval()(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    g = kuiper_xp.load(param, backend=backend)
    got = g(*[t2n(t) for t in inputs])
    assert len(got) == len(want)
    for k, (a, e) in enumerate(zip(got, want)):
        e = t2n(e)
        rtol, atol = (1e-12, 1e-14) if e.dtype == np.float64 else (2e-6, 1e-6)
        _close(backend.to_numpy(a), e, rtol, atol, f"{name} output {k}")


# -- special functions over wide ranges ---------------------------------------------------------

def _wide(seed=0, n=3000):
    rng = np.random.default_rng(seed)
    return np.concatenate([
        rng.uniform(-60, 60, n), rng.standard_normal(n // 2) * 3, 10 ** rng.uniform(-30, 30, n // 4),
        -(10 ** rng.uniform(-30, 12, n // 4)), -np.arange(1, 40) + 1e-6 * rng.uniform(-1, 1, 39),
        [0.0, -0.0, 1, 2, -1, -2, -30, np.inf, -np.inf, np.nan, 0.5, -0.5, -2.5, 1.4616321449683622,
         1 + 1e-7, 2 - 1e-7, 3e38, -3e38, 1e-38]])


def _unit(seed=0, n=3000):
    rng = np.random.default_rng(seed)
    return np.concatenate([
        rng.uniform(-1, 1, n), 1 - 10 ** rng.uniform(-15, 0, n // 4), -1 + 10 ** rng.uniform(-15, 0, n // 4),
        10 ** rng.uniform(-40, 0, n // 4), [0.0, -0.0, 1, -1, 1.5, -2, np.nan, np.inf, 0.5, -0.5, 1 - 2 ** -24]])


def _prob(seed=0, n=3000):
    rng = np.random.default_rng(seed)
    return np.concatenate([
        rng.uniform(0, 1, n), 10 ** rng.uniform(-300, 0, n // 4), 1 - 10 ** rng.uniform(-15, 0, n // 4),
        [0.0, 1.0, -0.1, 1.1, 0.5, 0.25, 0.75, np.nan, 5e-324, 1e-45]])


SPECIAL = {
    # type: (torch function, input generator, (rtol, atol) for float32, for float64)
    "torch.lgamma": (torch.lgamma, _wide, (2e-6, 1e-8), (1e-12, 1e-14)),
    "aten::digamma": (torch.digamma, _wide, (2e-6, 2e-6), (1e-12, 1e-14)),
    "aten::erfc": (torch.erfc, _wide, (2e-6, 1e-44), (1e-14, 1e-300)),
    "aten::special_erfcx": (torch.special.erfcx, _wide, (2e-6, 0.0), (1e-12, 0.0)),
    "aten::special_ndtr": (torch.special.ndtr, _wide, (1e-6, 2e-7), (1e-14, 1e-16)),
    "aten::special_log_ndtr": (torch.special.log_ndtr, _wide, (2e-6, 1e-44), (1e-12, 1e-300)),
    "aten::erfinv": (torch.erfinv, _unit, (2e-6, 1e-44), (1e-14, 1e-300)),
    "aten::special_ndtri": (torch.special.ndtri, _prob, (2e-6, 0.0), (1e-14, 0.0)),
    "aten::exp2": (torch.exp2, _wide, (2e-7, 1e-44), (1e-15, 1e-300)),
    "aten::sinc": (torch.sinc, _wide, (2e-6, 1e-7), (1e-14, 1e-16)),
    "aten::special_entr": (torch.special.entr, _wide, (2e-6, 0.0), (1e-15, 0.0)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op_type", list(SPECIAL))
def test_special_function_wide_range(op_type, dtype, backend):
    fn, gen, tol32, tol64 = SPECIAL[op_type]
    x = gen().astype(dtype)
    rtol, atol = tol32 if dtype == "float32" else tol64
    ref = x
    if backend.name == "cupy" and dtype == "float32":
        # CuPy compiles its kernels with -ftz=true: float32 subnormal inputs read as zero and
        # subnormal results are written as zero; the reference flushes the inputs likewise
        tiny = np.finfo(np.float32).tiny
        ref = np.where(np.abs(x) < tiny, np.copysign(np.float32(0), x), x)
        atol = max(atol, float(tiny))
    with np.errstate(all="ignore"):
        want = fn(torch.from_numpy(ref)).numpy()
    layer = make_layer(backend, f"{op_type} f 1 1 0 1")
    got = backend.to_numpy(layer(backend.asarray(x)))
    _close(got, want, rtol, atol, f"{op_type} {dtype}")


def test_lgamma_is_relatively_accurate_near_its_zeros(backend):
    x = np.array([1 + 1e-12, 1 - 1e-9, 2 + 1e-10, 2 - 3e-8, 1.1, 1.9, 0.95, 2.15])
    layer = make_layer(backend, "torch.lgamma f 1 1 0 1 $input=0")
    _close(backend.to_numpy(layer(backend.asarray(x))), torch.lgamma(torch.from_numpy(x)).numpy(), 1e-13, 0.0,
           "lgamma near 1 and 2")
    zeros = np.array([1.0, 2.0], np.float32)  # +0.0 there, as torch (its series gave -0.0)
    got = backend.to_numpy(layer(backend.asarray(zeros)))
    want = torch.lgamma(torch.from_numpy(zeros)).numpy()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("op, fn", [("aten::i0", torch.special.i0), ("aten::special_i0e", torch.special.i0e),
                                    ("aten::special_i1", torch.special.i1), ("aten::special_i1e", torch.special.i1e)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bessel_functions_across_their_range(backend, op, fn, dtype):
    """Both sides of the switch from the power series to the asymptotic series (|x| = 30), past
    the unscaled functions' overflow (torch's: where exp(|x|) overflows in the input's dtype),
    +-inf (NaN for I0 and I1, 0 for the scaled ones, as torch), NaN and -0.0."""
    x = np.array([0.0, -0.0, 1e-8, 0.5, -1.0, 2.5, -7.0, 15.0, 29.9, 30.1, -45.0, 80.0, 88.0, 89.0, -95.0, 200.0,
                  700.0, 709.5, 710.0, -712.0, np.inf, -np.inf, np.nan], dtype)
    layer = make_layer(backend, f"{op} f 1 1 0 1")
    got = backend.to_numpy(layer(backend.asarray(x)))
    with np.errstate(all="ignore"):
        want = fn(torch.from_numpy(x)).numpy()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) & (got > 0), np.isinf(want) & (want > 0))
    np.testing.assert_array_equal(np.isinf(got) & (got < 0), np.isinf(want) & (want < 0))
    ok = np.isfinite(want)
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    _close(got[ok], want[ok], 1e-12 if dtype == np.float64 else 1e-6, 0.0, f"{op} {np.dtype(dtype).name}")


@pytest.mark.parametrize("n", [0, 1, 2, 3, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_polygamma_across_its_range(backend, n, dtype):
    """Near and at the poles, negative non-integers (the zeta sum stepping up from them), far out,
    +-inf and NaN, against torch; n < 0 and inputs below POLYGAMMA_MIN_X are refused."""
    from kuiper_xp.layers.mathops import POLYGAMMA_MIN_X

    x = np.array([0.0, -0.0, 1e-6, 0.3, 0.5, 1.0, 2.5, 7.3, 9.0, 10.0, 35.5, 1e3, 1e6, -0.5, -1.0, -2.7,
                  -15.25, np.inf, -np.inf, np.nan], dtype)
    layer = make_layer(backend, "aten::polygamma pg 2 1 0 1 2", 2)
    got = backend.to_numpy(layer(n, backend.asarray(x)))
    with np.errstate(all="ignore"):
        want = torch.polygamma(n, torch.from_numpy(x)).numpy()
    assert got.dtype == want.dtype
    for what in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(what(got), what(want), err_msg=f"{what.__name__} n={n}")
    ok = np.isfinite(want)
    _close(got[ok], want[ok], 1e-13 if dtype == np.float64 else 1e-6, 0.0, f"polygamma({n}) {np.dtype(dtype).name}")
    with pytest.raises(ShapeError, match=r"aten::polygamma 'pg': n should be a non-negative integer, found -1"):
        layer(-1, backend.asarray(x))
    with pytest.raises(ShapeError, match=r"aten::polygamma 'pg': inputs below -100000 are not supported"):
        layer(2, backend.asarray(np.array([POLYGAMMA_MIN_X * 2], dtype)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_frexp_is_exact_across_the_range(backend, dtype):
    """Zeros of both signs, infinities, NaN, subnormals, the largest finite values and powers of
    two (where log2 may round either way): mantissa and int32 exponent bit for bit as torch's."""
    info = np.finfo(dtype)
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(64) * 10.0 ** rng.integers(info.minexp // 4, info.maxexp // 4, 64),
                        [0.0, -0.0, 1.0, -3.5, np.inf, -np.inf, np.nan, 0.75, 1024.0, info.tiny, info.smallest_subnormal,
                         info.max, -info.max, 2.0 ** (info.maxexp - 1), 2.0 ** -(info.nmant + 1)]]).astype(dtype)
    layer = make_layer(backend, "aten::frexp fx 1 2 0 1 2")
    m, e = (backend.to_numpy(a) for a in layer(backend.asarray(x)))
    xt = x
    if backend.to_numpy(backend.asarray(x[-5:-4]) * 1.0)[0] == 0.0:
        # a backend that flushes float32 subnormals to zero in its kernels (CuPy compiles them with
        # -ftz=true): its frexp sees a zero there, as torch's frexp of the flushed input does
        assert dtype == np.float32 and x[-5] == info.smallest_subnormal
        xt = np.where(np.abs(x) < info.tiny, np.copysign(np.zeros_like(x), x), x)
    tm, te = torch.frexp(torch.from_numpy(xt))
    assert m.dtype == dtype and e.dtype == np.int32
    np.testing.assert_array_equal(m, tm.numpy())
    np.testing.assert_array_equal(np.signbit(m), np.signbit(tm.numpy()))
    np.testing.assert_array_equal(e, te.numpy())
    with pytest.raises(ShapeError, match=r"aten::frexp 'fx': frexp needs a floating tensor, found int64"):
        layer(backend.asarray(np.arange(3)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hurwitz_zeta_across_its_domain(backend, dtype):
    """torch.special.zeta(x, q): the poles (q = 0, -1, ...: +inf, even for x NaN), x = 1 (+inf),
    x < 1 (NaN), negative non-integer q with integer and non-integer x, x = +inf (torch's loop:
    1 at q = 1, NaN above, +inf below), tiny and large q, NaN; non-integer q below
    POLYGAMMA_MIN_X is refused."""
    x = np.array([1.0, 1.5, 2.0, 2.5, 3.0, 4.7, 10.0, 0.5, 1.0, 2.0, 3.0, 2.5, 2.0, 50.0, np.nan, np.inf, np.inf,
                  np.inf, np.inf, 2.0, 2.0, np.nan, 3.0], dtype)
    q = np.array([1.0, 2.0, 0.3, 5.0, -2.5, 1e-3, 7.0, 1.0, 0.5, 0.0, -3.0, -2.5, 1e3, 0.9, 1.0, 1.0, 1.5, 0.5,
                  -3.0, np.inf, -np.inf, -3.0, -7.25], dtype)
    layer = make_layer(backend, "aten::special_zeta z 2 1 0 1 2", 2)
    got = backend.to_numpy(layer(backend.asarray(x), backend.asarray(q)))
    want = torch.special.zeta(torch.from_numpy(x), torch.from_numpy(q)).numpy()
    assert got.dtype == want.dtype
    for what in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(what(got), what(want), err_msg=what.__name__)
    ok = np.isfinite(want)
    _close(got[ok], want[ok], 1e-13 if dtype == np.float64 else 4e-7, 0.0, f"zeta {np.dtype(dtype).name}")
    with pytest.raises(ShapeError, match=r"aten::special_zeta 'z': q below -100000 is not supported"):
        layer(backend.asarray(np.array([2.0], dtype)), backend.asarray(np.array([-2.5e5 - 0.5], dtype)))


def test_scalar_operands_given_as_parameters(backend):
    """pnnx writes ``torch.bitwise_left_shift(x, 2)`` with ``other=2`` as a parameter."""
    x = np.array([1, -3, 64, 127], np.int8)
    layer = make_layer(backend, "torch.bitwise_left_shift s 1 1 0 1 other=2 $input=0")
    want = torch.bitwise_left_shift(torch.from_numpy(x), 2).numpy()
    assert_close(backend.to_numpy(layer(backend.asarray(x))), want)


# -- errors ---------------------------------------------------------------------------------------

def test_refused_inputs_name_the_operator(backend):
    f = backend.asarray(np.ones((2, 3), np.float32))
    i = backend.asarray(np.ones((2, 3), np.int64))
    with pytest.raises(ShapeError, match=r"torch\.t 't'.*<= 2 dimensions"):
        make_layer(backend, "torch.t t 1 1 0 1 $input=0")(backend.asarray(np.ones((2, 3, 4), np.float32)))
    with pytest.raises(ShapeError, match=r"aten::view_as.*cannot reshape"):
        make_layer(backend, "aten::view_as v 2 1 0 1 2", 2)(f, backend.asarray(np.ones(5, np.float32)))
    with pytest.raises(ShapeError, match=r"aten::frac.*int64"):
        make_layer(backend, "aten::frac f 1 1 0 1")(i)
    with pytest.raises(ShapeError, match=r"aten::hypot.*int64"):
        make_layer(backend, "aten::hypot h 2 1 0 1 2", 2)(i, i)
    with pytest.raises(ShapeError, match=r"aten::heaviside.*different dtypes"):
        make_layer(backend, "aten::heaviside h 2 1 0 1 2", 2)(f, backend.asarray(np.ones((2, 3), np.float64)))
    with pytest.raises(ShapeError, match=r"torch\.bitwise_left_shift.*float32"):
        make_layer(backend, "torch.bitwise_left_shift s 2 1 0 1 2 $input=0 $other=1", 2)(f, f)
    with pytest.raises(ShapeError, match=r"aten::addcdiv.*integer division"):
        make_layer(backend, "aten::addcdiv a 3 1 0 1 2 3", 3)(i, i, i)
    with pytest.raises(ShapeError, match=r"aten::lerp.*one dtype"):
        make_layer(backend, "aten::lerp l 3 1 0 1 2 3", 3)(f, backend.asarray(np.ones((2, 3), np.float64)), 0.5)
    with pytest.raises(ShapeError, match=r"torch\.positive.*bool"):
        make_layer(backend, "torch.positive p 1 1 0 1 $input=0")(backend.asarray(np.ones(3, bool)))
    with pytest.raises(LayerParameterError, match=r"aten::mvlgamma.*p must be an integer >= 1"):
        make_layer(backend, "aten::mvlgamma m 2 1 0 1 2", 2)(f, 0)


def test_missing_inputs_are_refused_at_build(backend):
    with pytest.raises(LayerParameterError, match=r"missing \['other'\]"):
        make_layer(backend, "aten::hypot h 1 1 0 1")
    with pytest.raises(LayerParameterError, match=r"should be a number"):
        make_layer(backend, "torch.bitwise_left_shift s 1 1 0 1 other=abc $input=0")


class _BoolArithmetic(torch.nn.Module):
    def forward(self, a, b):
        return torch.clamp(a > 0, min=0) * 3, torch.div(a > 0, b, rounding_mode="floor"), \
            torch.clamp(a < 0, max=1) + b


def test_bool_tensors_in_integer_arithmetic(model_backend, tmp_path):
    """A bool tensor clamped with an integer bound is int64 in torch; floor division of a bool
    tensor by an integer one (pnnx writes a plain div) is integer floor division."""
    from test_layers_misc import compare_graph, export_module

    a = torch.randn(2, 3)
    b = torch.tensor([[-2, 3, 1], [1, -1, 2]])
    param = export_module(_BoolArithmetic(), (a, b), tmp_path)
    compare_graph(param, model_backend, _BoolArithmetic(), (a, b))


class _PromotingBounds(torch.nn.Module):
    def forward(self, x, hi, u, lo):
        return (torch.clamp(x, max=hi), torch.clamp(u, min=lo), torch.clamp(u, min=-1), u.clamp_min(-1),
                u.clamp_max(7), torch.all(u, dim=1), torch.any(u > 2, dim=0),
                torch.special.log_ndtr(x.sum()))


def test_integer_and_mixed_dtype_bounds_promote_and_wrap_as_torch(model_backend, tmp_path):
    """clamp with a tensor bound takes torch's promoted dtype (float32 with float64: float64;
    uint8 with int8: int16); an int bound wraps into the tensor's integer dtype first
    (clamp(uint8, min=-1) is 255); all/any keep uint8; log_ndtr of a 0-d tensor."""
    from test_layers_misc import compare_graph, export_module

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, generator=g)
    hi = torch.randn(2, 4, generator=g, dtype=torch.float64)
    u = torch.tensor([[0, 3, 10, 200], [1, 1, 0, 7]], dtype=torch.uint8)
    lo = torch.tensor([[-3, 5, -1, 2], [0, 9, 1, -100]], dtype=torch.int8)
    inputs = (x, hi, u, lo)
    param = export_module(_PromotingBounds(), inputs, tmp_path)
    compare_graph(param, model_backend, _PromotingBounds(), inputs)


class _HalfSums(torch.nn.Module):
    def forward(self, h):
        return h.sum(0), torch.nansum(h, dim=0), h.sum(1)


def test_half_sums_accumulate_in_float32(model_backend, tmp_path):
    """torch sums float16 in float32 and rounds once: accumulating in half was ~7x further off."""
    from test_layers_misc import compare_graph, export_module

    if not hasattr(kuiper_xp.get_backend(model_backend).xp, "float16"):
        pytest.skip("this backend has no float16")
    x = (torch.rand(400, 6, generator=torch.Generator().manual_seed(2)) * 0.1).half()
    param = export_module(_HalfSums(), (x,), tmp_path)
    compare_graph(param, model_backend, _HalfSums(), (x,), rtol=1e-3)
