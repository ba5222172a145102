"""Accuracy, special values, typing and vectorisation of pdjit.codegen.cpu.mathfuncs.

Accuracy is measured in ulps against NumPy's result for the same dtype (sigmoid / softplus:
the NumPy float64 formula, rounded for float32). float32 is swept over every 97th bit pattern
of the whole range (~44M values); float64 over values spread across all exponents.
"""
import functools
import math
import re

import numpy as np
import pytest
from numba import njit

from pdjit.codegen.cpu import mathfuncs as _m

MAX_ULP = 4
VECTORISED = ["tanh", "exp", "expm1", "log", "log1p", "sigmoid", "softplus"]
SWEEP_STEP = {"tanh": 97, "exp": 97, "log": 97, "sigmoid": 97,
              "expm1": 389, "log1p": 389, "softplus": 389}


@functools.lru_cache(maxsize=None)
def _loop(name, fastmath=False):
    fn = getattr(_m, name)

    @njit(error_model="numpy", fastmath=fastmath)
    def loop(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])
    return loop


def _apply(name, x, fastmath=False):
    out = np.empty_like(x)
    _loop(name, fastmath)(x, out)
    return out


def _sigmoid_ref(x64):
    e = np.exp(-np.abs(x64))
    return np.where(x64 >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _reference(name, x):
    with np.errstate(all="ignore"):
        if name == "sigmoid":
            return _sigmoid_ref(x.astype(np.float64)).astype(x.dtype)
        if name == "softplus":
            return np.logaddexp(0.0, x.astype(np.float64)).astype(x.dtype)
        return getattr(np, name)(x)


@njit
def _max_ulp_core(a, b, ia, ib, mag):
    worst = 0.0
    where = -1
    for i in range(a.size):
        na, nb = a[i] != a[i], b[i] != b[i]
        if na and nb:
            continue
        if na or nb:
            return np.inf, i
        # sign-magnitude -> ordered integer line; exact when the signs agree, and a
        # float64 estimate (huge anyway) across signs, where int64 could overflow
        oa = ia[i] if ia[i] >= 0 else -(ia[i] & mag)
        ob = ib[i] if ib[i] >= 0 else -(ib[i] & mag)
        if (oa >= 0) == (ob >= 0):
            d = float(abs(oa - ob))
        else:
            d = abs(float(oa) - float(ob))
        if d > worst:
            worst = d
            where = i
    return worst, where


def _max_ulp(a, b):
    """Max ulp distance; nan vs nan and -0.0 vs 0.0 count as 0."""
    it, mag = (np.int64, 0x7FFFFFFFFFFFFFFF) if a.dtype == np.float64 else (np.int32, 0x7FFFFFFF)
    return _max_ulp_core(a, b, a.view(it), b.view(it), mag)


def _check(name, x, limit=MAX_ULP):
    got = _apply(name, x)
    ref = _reference(name, x)
    assert got.dtype == x.dtype
    worst, i = _max_ulp(got, ref)
    assert worst <= limit, (f"{name}({x.dtype}): {worst} ulp at x={x[i]!r}: "
                            f"got {got[i]!r}, numpy {ref[i]!r}")
    return worst


def test_max_ulp_helper():
    a = np.array([0.0, -0.0, np.nan, 1.0, -1.0], np.float32)
    b = np.array([-0.0, 0.0, np.nan, np.nextafter(np.float32(1), np.float32(2)), -1.0],
                 np.float32)
    assert _max_ulp(a, b)[0] == 1
    assert _max_ulp(np.array([np.float32(1e-45)]), np.array([np.float32(-1e-45)]))[0] == 2
    assert _max_ulp(np.array([1.0]), np.array([np.nextafter(1.0, 0.0)]))[0] == 1


@pytest.mark.parametrize("name", VECTORISED)
def test_float32_whole_range_sweep(name):
    step = SWEEP_STEP[name]
    chunk = 1 << 23
    worst = 0.0
    for start in range(0, 1 << 32, chunk * step):
        bits = np.arange(start, min(start + chunk * step, 1 << 32), step, dtype=np.uint64)
        x = bits.astype(np.uint32).view(np.float32)
        worst = max(worst, _check(name, x))
    print(f"{name} float32 max ulp {worst}")


def _float32_specials():
    f = np.float32
    fi = np.finfo(np.float32)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, -fi.max, fi.tiny, -fi.tiny,
            fi.smallest_subnormal, -fi.smallest_subnormal, 1e-40, -1e-40, 1.0, -1.0,
            0.625, -0.625, 10.0, -10.0, 9.0, 88.72283, 88.72284, 88.7229, 89.0, -87.33655,
            -87.3366, -103.27893, -103.97208, -103.9721, -104.0, -150.0, 0.5, 2.0,
            np.nextafter(f(1), f(0)), np.nextafter(f(1), f(2)), np.nextafter(f(-1), f(0)),
            np.nextafter(f(-1), f(-2)), -17.0, -18.0, 16.5, 17.0, 1e-7, -1e-7, 2.0 ** -12]
    return np.array(vals, np.float32)


def _float64_specials():
    fi = np.finfo(np.float64)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, -fi.max, fi.tiny, -fi.tiny,
            fi.smallest_subnormal, -fi.smallest_subnormal, 1e-310, -1e-310, 1.0, -1.0,
            709.782712893384, 709.7827128933841, 709.79, 710.0, -708.39, -708.4, -744.44,
            -745.1332191019411, -745.14, -746.0, 0.5, 2.0, np.nextafter(1.0, 0.0),
            np.nextafter(1.0, 2.0), np.nextafter(-1.0, 0.0), np.nextafter(-1.0, -2.0),
            19.0, 20.0, 22.0, -40.0, 37.0, 2.0 ** -28, 2.0 ** -29, 1e-17, -1e-17]
    return np.array(vals, np.float64)


@pytest.mark.parametrize("name", VECTORISED)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(name, dtype):
    x = _float32_specials() if dtype == np.float32 else _float64_specials()
    x = np.concatenate([x, -x])
    _check(name, x)
    got = _apply(name, x)
    ref = _reference(name, x)
    # signed zeros and infinities exactly as NumPy
    exact = (ref == 0) | np.isinf(ref)
    np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(ref[exact]))
    np.testing.assert_array_equal(got[exact], ref[exact])


def test_named_special_values():
    for dt in (np.float32, np.float64):
        def f(name, v, dt=dt):
            return _apply(name, np.array([v], dt))[0]
        assert f("tanh", np.inf) == 1 and f("tanh", -np.inf) == -1
        assert np.isnan(f("tanh", np.nan))
        assert f("tanh", -0.0) == 0 and np.signbit(f("tanh", -0.0))
        assert f("exp", -np.inf) == 0 and f("exp", np.inf) == np.inf and f("exp", 1000.0) == np.inf
        assert f("log", 0.0) == -np.inf and np.isnan(f("log", -1.0)) and f("log", np.inf) == np.inf
        assert f("sigmoid", 1e30) == 1 and f("sigmoid", -1e30) == 0
        assert f("sigmoid", np.inf) == 1 and f("sigmoid", -np.inf) == 0
        assert f("softplus", -np.inf) == 0 and f("softplus", np.inf) == np.inf
        assert f("log1p", -1.0) == -np.inf and f("expm1", -np.inf) == -1
    sub = np.finfo(np.float32).smallest_subnormal
    assert _apply("log", np.array([sub], np.float32))[0] == np.log(sub)


@pytest.mark.parametrize("name", VECTORISED)
def test_float64_dense_sample(name):
    rng = np.random.default_rng(1234)
    n = 1 << 20
    # mantissas in [1, 2) times 2^e for every exponent, both signs, plus a dense band near 0
    e = rng.integers(-1074, 1024, n).astype(np.float64)
    x = (1 + rng.random(n)) * np.exp2(np.minimum(e, 1022)) * rng.choice([-1.0, 1.0], n)
    x = np.concatenate([x, rng.uniform(-40, 40, n), rng.uniform(0, 2, n)])
    worst = _check(name, x)
    print(f"{name} float64 max ulp {worst}")


_PACKED = re.compile(r"\bv(?:mul|add|sub|div|fn?m(?:add|sub)\d*)p([sd])\s+[^\n]*%[yz]mm")
# libm symbols appear as call targets or (Numba's usual form) as `movabsq $tanhf, %reg`
_LIBM = re.compile(r"[\s$*](?:tanh|exp|expm1|log|log1p|erfc?)f?(?:@PLT)?\b(?!\.)")


@pytest.mark.parametrize("name", VECTORISED + ["erfc"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_loop_is_vectorised(name, dtype):
    x = np.linspace(0.1, 2, 64).astype(dtype)
    loop = _loop(name)
    loop(x, np.empty_like(x))
    sig = [s for s in loop.signatures if str(s[0].dtype) == np.dtype(dtype).name][0]
    asm = loop.inspect_asm(sig)
    kinds = set(_PACKED.findall(asm))
    packed = "s" if dtype == np.float32 else "d"
    assert packed in kinds, f"{name}: no packed ymm/zmm arithmetic"
    assert not _LIBM.search(asm), f"{name}: calls a libm function"


@pytest.mark.parametrize("name", VECTORISED + ["erfc", "erf"])
def test_return_type_follows_argument(name):
    fn = getattr(_m, name)

    @njit(error_model="numpy")
    def scalar(v):
        return fn(v)

    scalar(np.float32(0.5))   # Numba boxes float32 results as Python floats: check the
    scalar(np.float64(0.5))   # compiled signatures instead
    scalar(1)
    rt = {str(s.args[0]): str(s.return_type) for s in scalar.nopython_signatures}
    assert rt == {"float32": "float32", "float64": "float64", "int64": "float64"}
    # the Python fallback keeps the dtype too
    assert np.asarray(fn(np.float32(0.5))).dtype == np.float32


def test_fastmath_caller_keeps_results():
    rng = np.random.default_rng(5)
    for dt in (np.float32, np.float64):
        x = np.concatenate([rng.standard_normal(4096) * 30,
                            [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]]).astype(dt)
        for name in ("tanh", "exp", "log1p", "sigmoid"):
            np.testing.assert_array_equal(_apply(name, x, fastmath=True), _apply(name, x))


def test_erf_scalar_fallback():
    from scipy.special import erf as ref
    x = np.linspace(-5, 5, 1001)
    np.testing.assert_allclose(_apply("erf", x), ref(x), rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(_apply("erf", x.astype(np.float32)), ref(x).astype(np.float32),
                               rtol=2e-7)
    assert math.isclose(float(_m.erf(0.5)), math.erf(0.5))


def test_vectorisation_check_detects_libm_loop():
    # control: the same loop over math.tanh is scalar libm code, and the check must say so
    @njit(error_model="numpy")
    def loop(x, out):
        for i in range(x.size):
            out[i] = math.tanh(x[i])

    x = np.ones(8, np.float32)
    loop(x, np.empty_like(x))
    assert _LIBM.search(loop.inspect_asm(loop.signatures[0]))


# ---- erfc: against libm's math.erfc (in float64; rounded to float32 for float32) --------------
def _erfc_ref(x):
    with np.errstate(invalid="ignore"):     # nan inputs
        return np.vectorize(math.erfc, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


def test_erfc_float32_sweep():
    # every 9973rd bit pattern of the whole float32 range (nan, inf, subnormals included)
    x = np.arange(0, 1 << 32, 9973, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, np.linspace(-11, 11, 200001, dtype=np.float32),
                        _float32_specials(), -_float32_specials()])
    got, want = _apply("erfc", x), _erfc_ref(x)
    # all-float32 evaluation: <= 4 ulp where erfc is a normal number (measured 4 over every
    # 97th bit pattern), <= 2 subnormal steps in the underflow tail (x > 9.19)
    normal = np.abs(want) >= np.finfo(np.float32).tiny
    for sel, limit in ((normal, 4), (~normal, 2)):
        worst, i = _max_ulp(got[sel], want[sel])
        xs, gs, ws = x[sel][i], got[sel][i], want[sel][i]
        assert worst <= limit, f"erfc(float32): {worst} ulp at x={xs!r}: got {gs!r}, want {ws!r}"


def test_erfc_float64_dense_sample():
    rng = np.random.default_rng(77)
    x = np.concatenate([rng.uniform(-7, 28, 400000), rng.uniform(-1, 1, 100000),
                        rng.uniform(26, 27.3, 20000),
                        (1 + rng.random(20000)) * np.exp2(rng.integers(-1074, 1023, 20000)),
                        _float64_specials(), -_float64_specials()])
    x = np.concatenate([x, -x])
    got, want = _apply("erfc", x), _erfc_ref(x)
    worst, i = _max_ulp(got, want)
    # libm's erfc is itself up to ~3 ulp off; against 30-digit mpmath the helper is within 5
    assert worst <= 8, f"erfc(float64): {worst} ulp at x={x[i]!r}: got {got[i]!r}, want {want[i]!r}"


def test_erfc_special_values():
    for dt in (np.float32, np.float64):
        x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 40.0, -40.0], dt)
        got = _apply("erfc", x)
        np.testing.assert_array_equal(got, np.array([1, 1, 0, 2, np.nan, 0, 2, 0, 2], dt))
        assert not np.signbit(got[2])
    # the smallest results: float32 rounds once to the last subnormals, float64 too
    assert _apply("erfc", np.array([10.0], np.float32))[0] == np.float32(math.erfc(10.0))
    assert _apply("erfc", np.array([27.2]))[0] == math.erfc(27.2)
    assert float(_m.erfc(0.5)) == math.erfc(0.5)
    assert np.asarray(_m.erfc(np.float32([0.5, -3.0]))).dtype == np.float32
