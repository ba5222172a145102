"""Vectorisable transcendental functions for generated Numba kernels.

Why this module exists: pip's llvmlite has no SVML, so a Numba loop that calls ``math.tanh`` /
``np.exp`` / ``math.log`` is never vectorised -- every element calls glibc's scalar ``tanhf``
(~20 ns) and a fused kernel ends up slower than NumPy op by op. The functions here are written
in plain branch-free arithmetic (selects, integer bit tricks on the float representation), so
LLVM's loop vectoriser turns a loop calling them into packed AVX2/AVX-512 code.

Use from generated code::

    from pdjit.codegen.cpu import mathfuncs as _m

    @numba.njit(error_model='numpy')
    def kernel(x, out):
        for i in range(x.size):
            out[i] = _m.tanh(x[i])

Functions: ``tanh, exp, expm1, log, log1p, sigmoid, softplus, erfc`` (vectorised, float32 and
float64) and ``erf`` (NOT vectorised: it calls libm ``math.erf``; see below). Each accepts a
float32 or float64 scalar and returns the same type (integers are treated as float64). The
float32 and float64 implementations are separate ``@njit`` functions chosen by argument type through
``numba.extending.overload``; all their constants are typed, so float32 code never widens to
float64. Outside compiled code each name is a NumPy-based Python function (same results up to
the ulps below), which is also what runs under the CUDA simulator.

Method (both precisions, written from the textbook methods, no library code):

- exp / expm1: Cody-Waite reduction ``x = k*ln2 + r``, ``|r| <= ln2/2``, with ln2 split in a
  hi part whose low bits are zero (so ``k*ln2_hi`` is exact) and a lo part; ``k`` is rounded
  with the 1.5*2^p "shifter" trick, whose low mantissa bits then ARE the integer ``k``. exp(r) /
  expm1(r) by a Taylor polynomial (degree 7 for float32, 13 for float64; truncation error below
  0.1 ulp). The scale 2^k is built in the exponent field and applied in two halves
  (``p * 2^(k/2) * 2^(k-k/2)``), so overflow gives inf and the subnormal range is rounded
  once, as NumPy does. expm1 = ``2^k*p + (2^k - 1)`` (exact 2^k - 1 keeps relative accuracy).
- log / log1p: exponent/mantissa split on the bit pattern so the mantissa m lies in
  [sqrt(1/2), sqrt(2)); ``log(m) = 2*atanh(s)``, ``s = f/(2+f)``, ``f = m-1``, in the form
  ``f - f^2/2 + s*(f^2/2 + R(s^2))`` (R: Taylor series of atanh, 4 terms float32 / 11 float64).
  Subnormal inputs are pre-scaled by 2^23 / 2^54. log1p(x) = log(u) + (x-(u-1))/u, u = 1+x.
- tanh: float32: odd near-minimax polynomial (coefficients fitted by least squares on
  Chebyshev nodes) for |x| < 0.625, else ``(1-e)/(1+e)``, ``e = exp(-2|x|)``. float64:
  ``-e/(e+2)``, ``e = expm1(-2|x|)`` (no cancellation anywhere), tanh(x) = x for |x| < 2^-28.
- sigmoid: ``e = exp(-|x|)``; ``1/(1+e)`` for x >= 0, ``e/(1+e)`` for x < 0 (so large
  negative x underflows gradually to subnormals and 0, never nan).
- softplus: ``max(x, 0) + log1p(exp(-|x|))`` (= np.logaddexp(0, x)).
- erfc: ``exp(-x^2) * t * Q(s)`` for x >= 0 with ``t = c / (c + x)`` and ``s`` linear in t,
  ``Q = erfcx / t`` a polynomial in s (Chebyshev interpolant of 60-digit values, stored in the
  power basis); ``2 - erfc(-x)`` for x < 0. float32 evaluates in float32 throughout (c = 2,
  degree 11; t with the rounding of c + x put back; exp(-x^2) as exp(-xh^2 + d) with
  xh^2 exact, d folded into the exp's reduced argument); float64 splits x^2 exactly (c = 3,
  degree 24). Accurate in both
  tails, unlike ``1 - erf``: the normal CDF is ``erfc(-x / sqrt 2) / 2``.

Special values match NumPy: nan -> nan; tanh(+-inf) = +-1, tanh(-0.0) = -0.0; exp(-inf) = 0,
exp(inf) = inf, overflow -> inf, underflow -> subnormal/0; expm1(-inf) = -1; log(0) = -inf,
log(x<0) = nan, log(inf) = inf, subnormal inputs exact-exponent; log1p(-1) = -inf;
sigmoid(+-inf) = 1/0; softplus(-inf) = 0, softplus(inf) = inf; erfc(inf) = 0, erfc(-inf) = 2,
underflow to subnormals/0 (x > 10.05 float32, 27.23 float64); signed zeros kept where NumPy
keeps them.

Measured max error (tests/codegen/cpu/test_mathfuncs.py; float32: every 97th bit pattern of the
whole float32 range (every 389th for expm1/log1p/softplus) plus special values; float64: ~3M
values spread over all exponents plus dense bands), in ulps against NumPy's own result for the
same dtype (sigmoid: NumPy's float64 formula, rounded for float32; softplus: np.logaddexp(0, x)
in float64, rounded for float32). In brackets: against the correctly rounded value, where
checked -- part of the distance to NumPy is NumPy's own error (its float32 log/exp/expm1 are
off by up to 2-3 ulp):

    ========  =========  =========
    function  float32    float64
    ========  =========  =========
    exp       3  [1]     1
    expm1     2  [1]     2
    log       3  [1]     1  [1]
    log1p     2          1
    tanh      2  [1]     3  [2]
    sigmoid   2  [2]     2  [2]
    softplus  2          2
    erfc      4          5  [5]
    ========  =========  =========

erfc is measured against libm's ``math.erfc`` (rounded to float32 for float32; float32: every
9973rd bit pattern and a dense band; every 97th measured once: 4 ulp, 92% of values exact,
0.06% at 3-4 ulp), not NumPy (which has none); in brackets: against 30-digit mpmath on 60,000
float64 values over [-1, 27.3] (libm's own erfc: 3 ulp there). The erfc test asserts <= 4 ulp
(float32, where the result is a normal number; <= 2 subnormal steps in the underflow tail
x > 9.19) and <= 8 ulp (float64, where libm's error adds to the helper's).

(The tests assert <= 4 ulp; figures measured on AMD Zen 4 with NumPy 2.4 and FMA contraction.)

Vectorisation: a ``for i in range(n): out[i] = _m.f(x[i])`` loop over contiguous arrays,
compiled with ``error_model='numpy'``, vectorises for every function above except erf
(packed ``vmulps``/``vmulpd`` on ymm/zmm registers, no call to ``tanhf``/``expf``/``logf``;
asserted by the tests). erfc: ~0.8 ns (float32; 1.7 ns when it evaluated in float64) and
~5.5 ns (float64) an element against ~24 ns for a loop over libm's erfc (one core, 2^20
normal values). Notes for the code generator:

- Use ``error_model='numpy'`` (or ``parallel=True``, which implies it) in the kernel: the
  default 'python' error model inserts division checks that stop vectorisation.
- ``fastmath`` in the calling kernel is fine (tested): these helpers are separate njit
  functions with their own flags (strict IEEE except FMA contraction), which LLVM keeps per
  instruction after inlining, so the shifter trick and the nan/inf selects survive a fastmath
  caller. They are marked ``alwaysinline`` at LLVM level so the caller's loop sees their body.
- Do not call the private ``_tanh_f32`` etc. directly; call ``_m.tanh`` (the overload picks
  the implementation by argument type and is inlined into the caller's Numba IR).
- Loops over non-contiguous ('A' layout) arrays may not vectorise; that is the array access,
  not these functions.

float64: all functions except erf are vectorised float64 implementations (no libm calls).
erf (both dtypes) calls ``math.erf`` (libm): correct but scalar; where the value feeds a
CDF, use ``erfc`` (exact gelu does: ``Phi(x) = erfc(-x / sqrt 2) / 2``).

CUDA: the overloads are registered for the CPU target only. The CUDA target (real device or
the simulator) must map ``_m.tanh``, ``_m.erfc`` etc. to ``math.tanh``, ``math.erfc`` etc.
(CUDA's libdevice is already vectorisation-free and accurate); under the CUDA simulator the
Python fallbacks defined here also work, since kernels run as Python.
"""
import math
from decimal import Decimal, getcontext

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from pdjit.codegen.diskcache import cached

__all__ = ["tanh", "exp", "expm1", "log", "log1p", "sigmoid", "softplus", "erfc", "erf"]

# Strict IEEE semantics are required (no reassociation, no nnan/ninf): the shifter rounding
# trick, the Cody-Waite / log1p compensations and the nan/inf selects rely on every operation
# being rounded as written. FMA contraction only removes roundings (measured 20-40 % faster).
_jit = cached(njit(error_model="numpy", nogil=True, fastmath={"contract"}))


# --------------------------------------------------------------------------- bit casts
# Plain LLVM bitcasts: unlike ``np.array(...).view`` these are free and vectorise.

@intrinsic
def _f32_bits(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, b):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _f64_bits(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _bits_f64(typingctx, b):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def _always_inline(typingctx):
    # Marks the enclosing compiled function ``alwaysinline``. Without it LLVM's inliner finds
    # e.g. tanh (exp + polynomial + selects) too big to inline into the caller's loop, the
    # call stays opaque and the loop is not vectorised. Inlining at LLVM level (not Numba's
    # ``inline='always'``) keeps these helpers' strict-IEEE flags even in a fastmath caller.
    def codegen(context, builder, sig, args):
        builder.function.attributes.add("alwaysinline")
        return context.get_dummy_value()
    return types.none(), codegen


# --------------------------------------------------------------------------- constants
getcontext().prec = 50
_LN2 = Decimal("0.69314718055994530941723212145817656807550013436026")


def _split_ln2(zero_bits):
    """ln2 = hi + lo with the low ``zero_bits`` mantissa bits of hi (a float64) cleared."""
    hi_bits = np.array([float(_LN2)], np.float64).view(np.int64)[0] & ~((1 << zero_bits) - 1)
    hi = float(np.array([hi_bits], np.int64).view(np.float64)[0])
    lo = float(_LN2 - Decimal(hi))
    return hi, lo


F = np.float32
D = np.float64

# float32. ln2_hi keeps 15 significant bits: k*ln2_hi is exact for |k| <= 255.
_hi, _ = _split_ln2(29 + 9)
_F_LN2HI = F(_hi)
_F_LN2LO = F(float(_LN2 - Decimal(float(_F_LN2HI))))
_F_LN2 = F(float(_LN2))
_F_INVLN2 = F(1.4426950408889634)
_F_SHIFT = F(12582912.0)          # 1.5 * 2**23
_F_SHIFT_BITS = 0x4B400000
_F_0, _F_1, _F_2, _F_HALF = F(0.0), F(1.0), F(2.0), F(0.5)
_F_INF, _F_NAN = F(np.inf), F(np.nan)
_F_EXP_HI = F(88.8)               # above: exp overflows float32 anyway
_F_EXP_LO = F(-104.0)             # below: exp rounds to +0
_F_EM1_LO = F(-18.0)              # below: expm1 rounds to -1
_F_TINY = F(2.0 ** -126)
_F_TWO23 = F(2.0 ** 23)
_F_SQRTH_BITS = 0x3F3504F3        # bits of float32 sqrt(0.5)
# Taylor 1/n!, n = 2..8
_F_E2, _F_E3, _F_E4, _F_E5, _F_E6, _F_E7, _F_E8 = (F(1.0 / math.factorial(n)) for n in range(2, 9))
# atanh series 2/(2n+1), n = 1..4
_F_L1, _F_L2, _F_L3, _F_L4 = (F(2.0 / (2 * n + 1)) for n in range(1, 5))
# tanh(x) = x + x^3 * P(x^2) on |x| < 0.625; P fitted (weighted least squares, Chebyshev nodes,
# mpmath reference); max relative error 0.1 ulp before rounding.
_F_T0 = F(-0.3333328068256378)
_F_T1 = F(0.133314311504364)
_F_T2 = F(-0.05373915657401085)
_F_T3 = F(0.020637862384319305)
_F_T4 = F(-0.005704042501747608)
_F_TANH_SPLIT = F(0.625)
_F_TANH_SAT = F(10.0)             # tanh(10) == 1 in float32

# float64. ln2_hi keeps 21 significant bits: k*ln2_hi is exact for |k| < 2^32.
_D_LN2HI, _D_LN2LO = _split_ln2(32)
_D_INVLN2 = 1.4426950408889634
_D_SHIFT = 6755399441055744.0     # 1.5 * 2**52
_D_SHIFT_BITS = 0x4338000000000000
_D_INF, _D_NAN = math.inf, math.nan
_D_EXP_HI = 710.0
_D_EXP_LO = -746.0
_D_EM1_LO = -40.0
_D_TINY = 2.0 ** -1022
_D_TWO54 = 2.0 ** 54
_D_SQRTH_BITS = 0x3FE6A09E667F3BCD
(_D_E2, _D_E3, _D_E4, _D_E5, _D_E6, _D_E7, _D_E8, _D_E9, _D_E10, _D_E11, _D_E12,
 _D_E13) = (1.0 / math.factorial(n) for n in range(2, 14))
(_D_L1, _D_L2, _D_L3, _D_L4, _D_L5, _D_L6, _D_L7, _D_L8, _D_L9, _D_L10,
 _D_L11) = (2.0 / (2 * n + 1) for n in range(1, 12))
_D_TANH_SAT = 20.0                # tanh(20) == 1 in float64
_D_TANH_TINY = 2.0 ** -28         # below: tanh(x) == x in float64


# --------------------------------------------------------------------------- float32
@_jit
def _scale2_f32(ki):
    _always_inline()
    # 2^k as two halves: each half stays a normal float32 for k in [-252, 254].
    k1 = ki >> 1
    s1 = _bits_f32(np.int32((k1 + 127) << 23))
    s2 = _bits_f32(np.int32((ki - k1 + 127) << 23))
    return s1, s2


@_jit
def _exp_core_f32(x):
    _always_inline()
    # nan is clamped to the upper bound; public wrappers restore it.
    xc = x if x < _F_EXP_HI else _F_EXP_HI
    xc = xc if xc > _F_EXP_LO else _F_EXP_LO
    t = xc * _F_INVLN2 + _F_SHIFT
    k = t - _F_SHIFT
    r = (xc - k * _F_LN2HI) - k * _F_LN2LO
    q = _F_E2 + r * (_F_E3 + r * (_F_E4 + r * (_F_E5 + r * (_F_E6 + r * _F_E7))))
    p = _F_1 + (r + r * r * q)
    s1, s2 = _scale2_f32(_f32_bits(t) - _F_SHIFT_BITS)
    return p * s1 * s2


@_jit
def _exp_f32(x):
    _always_inline()
    y = _exp_core_f32(x)
    return y if x == x else x


@_jit
def _expm1_f32(x):
    _always_inline()
    xc = x if x < _F_EXP_HI else _F_EXP_HI
    xc = xc if xc > _F_EM1_LO else _F_EM1_LO
    t = xc * _F_INVLN2 + _F_SHIFT
    k = t - _F_SHIFT
    r = (xc - k * _F_LN2HI) - k * _F_LN2LO
    q = _F_E2 + r * (_F_E3 + r * (_F_E4 + r * (_F_E5 + r * (_F_E6 + r * (_F_E7 + r * _F_E8)))))
    p = r + r * r * q
    ki = _f32_bits(t) - _F_SHIFT_BITS
    s1, s2 = _scale2_f32(ki)
    s = s1 * s2
    # 2^k - 1 is exact for k <= 24; above, the -1 is below half an ulp of the result.
    small = s * p + (s - _F_1)
    big = (p + _F_1) * s1 * s2
    y = small if ki < 25 else big
    y = y if x == x else x
    return y if x != _F_0 else x


@_jit
def _log_core_f32(x, kadj):
    _always_inline()
    # x: positive, finite, normal. kadj: exponent correction from pre-scaling.
    ix = _f32_bits(x) - _F_SQRTH_BITS
    k = (ix >> 23) + kadj
    m = _bits_f32(np.int32((ix & 0x7FFFFF) + _F_SQRTH_BITS))
    f = m - _F_1
    s = f / (_F_2 + f)
    z = s * s
    hfsq = _F_HALF * f * f
    R = z * (_F_L1 + z * (_F_L2 + z * (_F_L3 + z * _F_L4)))
    kf = F(k)
    return kf * _F_LN2HI - ((hfsq - (s * (hfsq + R) + kf * _F_LN2LO)) - f)


@_jit
def _log_f32(x):
    _always_inline()
    tiny = x < _F_TINY
    xs = x * _F_TWO23 if tiny else x
    y = _log_core_f32(xs, -23 if tiny else 0)
    y = y if x < _F_INF else x
    y = y if x >= _F_0 else _F_NAN
    return y if x != _F_0 else -_F_INF


@_jit
def _log1p_f32(x):
    _always_inline()
    u = _F_1 + x
    # (x - (u-1))/u corrects for the rounding of 1 + x.
    c = (x - (u - _F_1)) / u
    uu = u if u > _F_0 else _F_1
    uu = uu if uu < _F_INF else _F_1
    y = _log_core_f32(uu, 0) + c
    y = y if x < _F_INF else x
    y = y if x >= -_F_1 else _F_NAN
    y = y if x != -_F_1 else -_F_INF
    return y if x != _F_0 else x


@_jit
def _tanh_f32(x):
    _always_inline()
    ax = abs(x)
    z = x * x
    small = x + x * z * (_F_T0 + z * (_F_T1 + z * (_F_T2 + z * (_F_T3 + z * _F_T4))))
    axc = ax if ax < _F_TANH_SAT else _F_TANH_SAT
    e = _exp_core_f32(-_F_2 * axc)
    big = (_F_1 - e) / (_F_1 + e)
    big = -big if x < _F_0 else big
    y = small if ax < _F_TANH_SPLIT else big
    y = y if x != _F_0 else x            # keeps -0.0 (x + x^3*P gives +0.0)
    return y if x == x else x


@_jit
def _sigmoid_f32(x):
    _always_inline()
    e = _exp_core_f32(-abs(x))
    # one division (not e * (1/(1+e))): one rounding fewer
    y = (_F_1 if x >= _F_0 else e) / (_F_1 + e)
    return y if x == x else x


@_jit
def _softplus_f32(x):
    _always_inline()
    e = _exp_core_f32(-abs(x))
    u = _F_1 + e
    c = (e - (u - _F_1)) / u
    lg = _log_core_f32(u, 0) + c
    m = x if x > _F_0 else _F_0
    y = m + lg
    return y if x == x else x


# --------------------------------------------------------------------------- float64
@_jit
def _scale2_f64(ki):
    _always_inline()
    k1 = ki >> 1
    s1 = _bits_f64((k1 + 1023) << 52)
    s2 = _bits_f64((ki - k1 + 1023) << 52)
    return s1, s2


@_jit
def _expq_f64(r):
    _always_inline()
    # (exp(r) - 1 - r) / r^2, Taylor to degree 13 overall
    return _D_E2 + r * (_D_E3 + r * (_D_E4 + r * (_D_E5 + r * (_D_E6 + r * (
        _D_E7 + r * (_D_E8 + r * (_D_E9 + r * (_D_E10 + r * (_D_E11 + r * (
            _D_E12 + r * _D_E13))))))))))


@_jit
def _exp_core_f64(x):
    _always_inline()
    xc = x if x < _D_EXP_HI else _D_EXP_HI
    xc = xc if xc > _D_EXP_LO else _D_EXP_LO
    t = xc * _D_INVLN2 + _D_SHIFT
    k = t - _D_SHIFT
    r = (xc - k * _D_LN2HI) - k * _D_LN2LO
    p = 1.0 + (r + r * r * _expq_f64(r))
    s1, s2 = _scale2_f64(_f64_bits(t) - _D_SHIFT_BITS)
    return p * s1 * s2


@_jit
def _exp_f64(x):
    _always_inline()
    y = _exp_core_f64(x)
    return y if x == x else x


@_jit
def _expm1_core_f64(x):
    _always_inline()
    xc = x if x < _D_EXP_HI else _D_EXP_HI
    xc = xc if xc > _D_EM1_LO else _D_EM1_LO
    t = xc * _D_INVLN2 + _D_SHIFT
    k = t - _D_SHIFT
    r = (xc - k * _D_LN2HI) - k * _D_LN2LO
    p = r + r * r * _expq_f64(r)
    ki = _f64_bits(t) - _D_SHIFT_BITS
    s1, s2 = _scale2_f64(ki)
    s = s1 * s2
    small = s * p + (s - 1.0)
    big = (p + 1.0) * s1 * s2
    return small if ki < 56 else big


@_jit
def _expm1_f64(x):
    _always_inline()
    y = _expm1_core_f64(x)
    y = y if x == x else x
    return y if x != 0.0 else x


@_jit
def _log_core_f64(x, kadj):
    _always_inline()
    ix = _f64_bits(x) - _D_SQRTH_BITS
    k = (ix >> 52) + kadj
    m = _bits_f64((ix & 0x000FFFFFFFFFFFFF) + _D_SQRTH_BITS)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    hfsq = 0.5 * f * f
    R = z * (_D_L1 + z * (_D_L2 + z * (_D_L3 + z * (_D_L4 + z * (_D_L5 + z * (
        _D_L6 + z * (_D_L7 + z * (_D_L8 + z * (_D_L9 + z * (_D_L10 + z * _D_L11))))))))))
    kf = D(k)
    return kf * _D_LN2HI - ((hfsq - (s * (hfsq + R) + kf * _D_LN2LO)) - f)


@_jit
def _log_f64(x):
    _always_inline()
    tiny = x < _D_TINY
    xs = x * _D_TWO54 if tiny else x
    y = _log_core_f64(xs, -54 if tiny else 0)
    y = y if x < _D_INF else x
    y = y if x >= 0.0 else _D_NAN
    return y if x != 0.0 else -_D_INF


@_jit
def _log1p_f64(x):
    _always_inline()
    u = 1.0 + x
    c = (x - (u - 1.0)) / u
    uu = u if u > 0.0 else 1.0
    uu = uu if uu < _D_INF else 1.0
    y = _log_core_f64(uu, 0) + c
    y = y if x < _D_INF else x
    y = y if x >= -1.0 else _D_NAN
    y = y if x != -1.0 else -_D_INF
    return y if x != 0.0 else x


@_jit
def _tanh_f64(x):
    _always_inline()
    ax = abs(x)
    axc = ax if ax < _D_TANH_SAT else _D_TANH_SAT
    e = _expm1_core_f64(-2.0 * axc)      # in (-1, 0]
    t = -e / (e + 2.0)
    t = -t if x < 0.0 else t
    y = t if ax > _D_TANH_TINY else x
    return y if x == x else x


@_jit
def _sigmoid_f64(x):
    _always_inline()
    e = _exp_core_f64(-abs(x))
    y = (1.0 if x >= 0.0 else e) / (1.0 + e)
    return y if x == x else x


@_jit
def _softplus_f64(x):
    _always_inline()
    e = _exp_core_f64(-abs(x))
    u = 1.0 + e
    c = (e - (u - 1.0)) / u
    lg = _log_core_f64(u, 0) + c
    m = x if x > 0.0 else 0.0
    y = m + lg
    return y if x == x else x


# erfc(x) = exp(-x^2) * t * Q(s) for x >= 0, t = c / (c + x), s = A t - B in [-1, 1] over
# x in [0, x_max] (beyond: erfc underflows to 0); Q = erfcx(x) / t is smooth in t there, and
# its Chebyshev interpolant (60-digit mpmath values at Chebyshev nodes) is stored in the power
# basis of s, which is well conditioned here (sum of |coefficients| ~ 1, Q in [0.2, 1]).
# float32 (c = 2, x_max = 10.5, degree 11, interpolation error < 1e-10; coefficients rounded to
# float32) works in float32 (8 lanes a vector op): x^2 = xh^2 + (x - xh)(x + xh) with xh^2
# exact, the second part added to the exp's reduced argument; m * exp(r) as m + m * expm1(r);
# 2^k applied last (one rounding into subnormals). float64 (c = 3, x_max = 27.5, degree 24,
# interpolation error < 1e-19) gets exp(-x^2) as exp(-xh^2) * exp(d), xh = x with the low 27
# mantissa bits cleared (xh^2 exact), d = (xh - x)(xh + x), |d| < 3e-5 (exp(d) by Taylor).
# x < 0: erfc(x) = 2 - erfc(-x) (a result in (1, 2], no cancellation).
_EF_XMAX = 10.5
_EF_A, _EF_B = 2.380952380952381, 1.380952380952381
(_EF_0, _EF_1, _EF_2, _EF_3, _EF_4, _EF_5, _EF_6, _EF_7, _EF_8, _EF_9, _EF_10, _EF_11) = (
    0.5694087225176777, 0.32718793118798545, 0.10352098834446, 0.006307933235961975,
    -0.006327286136316576, -0.0006721188156401057, 0.0006249674055164271,
    3.514622509892883e-06, -7.088171258589489e-05, 1.2838276047375538e-05,
    5.676404406121547e-06, -2.2853926318452133e-06)
_ED_XMAX = 27.5
_ED_A, _ED_B = 2.2181818181818183, 1.2181818181818183
_ED_SPLIT_MASK = ~((1 << 27) - 1)
(_ED_0, _ED_1, _ED_2, _ED_3, _ED_4, _ED_5, _ED_6, _ED_7, _ED_8, _ED_9, _ED_10, _ED_11, _ED_12,
 _ED_13, _ED_14, _ED_15, _ED_16, _ED_17, _ED_18, _ED_19, _ED_20, _ED_21, _ED_22, _ED_23,
 _ED_24) = (
    0.3889717993518312, 0.30324641989851053, 0.1867172905906444, 0.08797277920352535,
    0.029176511317919953, 0.005058996679467361, -0.0006135475274177199,
    -0.0005422202418644995, -3.814311196873043e-05, 4.7666039172797493e-05,
    7.697886572743653e-06, -4.9750454275818425e-06, -9.094049670475335e-07,
    6.401406913010697e-07, 7.636326802201206e-08, -9.264961008069627e-08,
    4.4953662482245343e-10, 1.327282767549711e-08, -2.2633303455497894e-09,
    -1.640890297693268e-09, 6.574781310232421e-10, 1.444914354344818e-10,
    -1.14713615279711e-10, -6.019223674215657e-12, 1.027161830102016e-11)


_FE_XMAX = F(_EF_XMAX)
_FE_A, _FE_B = F(_EF_A), F(_EF_B)
(_FE_0, _FE_1, _FE_2, _FE_3, _FE_4, _FE_5, _FE_6, _FE_7, _FE_8, _FE_9, _FE_10, _FE_11) = (
    F(c) for c in (_EF_0, _EF_1, _EF_2, _EF_3, _EF_4, _EF_5, _EF_6, _EF_7, _EF_8, _EF_9,
                   _EF_10, _EF_11))
_FE_SPLIT_MASK = np.int32(~((1 << 12) - 1))


@_jit
def _erfc_f32(x):
    _always_inline()
    ax = abs(x)
    ax = ax if ax < _FE_XMAX else _FE_XMAX       # nan too; restored below
    # t = 2 / (2 + ax) with the rounding error of 2 + ax put back (Fast2Sum)
    u = _F_2 + ax
    ue = ((_F_2 - u) + ax) if ax < _F_2 else ((ax - u) + _F_2)
    t0 = _F_2 / u
    t = t0 - (t0 * t0) * (ue * _F_HALF)        # ue / u = ue * t0 / 2 to ~2^-24
    s = t * _FE_A - _FE_B
    q = _FE_0 + s * (_FE_1 + s * (_FE_2 + s * (_FE_3 + s * (_FE_4 + s * (_FE_5 + s * (
        _FE_6 + s * (_FE_7 + s * (_FE_8 + s * (_FE_9 + s * (_FE_10 + s * _FE_11))))))))))
    # exp(-x^2) = exp(a + b): a = -xh^2 exact (xh: 12 significant bits), b = -(x - xh)(x + xh)
    xh = _bits_f32(_f32_bits(ax) & _FE_SPLIT_MASK)
    a = -(xh * xh)
    b = (xh - ax) * (xh + ax)
    tt = (a + b) * _F_INVLN2 + _F_SHIFT
    k = tt - _F_SHIFT
    r = ((a - k * _F_LN2HI) + b) - k * _F_LN2LO
    e = _F_E2 + r * (_F_E3 + r * (_F_E4 + r * (_F_E5 + r * (_F_E6 + r * _F_E7))))
    m = t * q
    s1, s2 = _scale2_f32(_f32_bits(tt) - _F_SHIFT_BITS)
    h = (m + m * (r + r * r * e)) * s1 * s2    # m * exp(r) * 2^k
    y = _F_2 - h if x < _F_0 else h
    return y if x == x else x


@_jit
def _erfc_f64(x):
    _always_inline()
    ax = abs(x)
    ax = ax if ax < _ED_XMAX else _ED_XMAX
    # t = 3 / (3 + ax) with the rounding error of 3 + ax put back (Fast2Sum, the larger
    # addend first): near 0 a relative error e of t moves the result by ~3.4 e
    u = 3.0 + ax
    ue = ((3.0 - u) + ax) if ax < 3.0 else ((ax - u) + 3.0)
    t0 = 3.0 / u
    t = t0 - t0 * (ue / u)
    s = t * _ED_A - _ED_B
    q = _ED_0 + s * (_ED_1 + s * (_ED_2 + s * (_ED_3 + s * (_ED_4 + s * (_ED_5 + s * (
        _ED_6 + s * (_ED_7 + s * (_ED_8 + s * (_ED_9 + s * (_ED_10 + s * (_ED_11 + s * (
            _ED_12 + s * (_ED_13 + s * (_ED_14 + s * (_ED_15 + s * (_ED_16 + s * (
                _ED_17 + s * (_ED_18 + s * (_ED_19 + s * (_ED_20 + s * (_ED_21 + s * (
                    _ED_22 + s * (_ED_23 + s * _ED_24)))))))))))))))))))))))
    xh = _bits_f64(_f64_bits(ax) & _ED_SPLIT_MASK)
    d = (xh - ax) * (xh + ax)
    tq = t * q
    m = tq + tq * (d * (1.0 + d * (0.5 + d * (_D_E3 + d * _D_E4))))     # tq * exp(d)
    h = _exp_core_f64(-xh * xh) * m
    y = 2.0 - h if x < 0.0 else h
    return y if x == x else x


@_jit
def _erf_f32(x):
    _always_inline()
    return F(math.erf(D(x)))


@_jit
def _erf_f64(x):
    _always_inline()
    return math.erf(x)


# --------------------------------------------------------------------------- public API
def _py_float(x):
    a = np.asarray(x)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    return a


def _ret(a):
    return a[()] if a.ndim == 0 else a


def tanh(x):
    """tanh; float32 -> float32, float64 -> float64 (NumPy outside compiled code)."""
    return _ret(np.tanh(_py_float(x)))


def exp(x):
    """exp; float32 -> float32, float64 -> float64."""
    with np.errstate(over="ignore"):
        return _ret(np.exp(_py_float(x)))


def expm1(x):
    """expm1; float32 -> float32, float64 -> float64."""
    with np.errstate(over="ignore"):
        return _ret(np.expm1(_py_float(x)))


def log(x):
    """Natural log; float32 -> float32, float64 -> float64."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _ret(np.log(_py_float(x)))


def log1p(x):
    """log(1 + x); float32 -> float32, float64 -> float64."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _ret(np.log1p(_py_float(x)))


def sigmoid(x):
    """1 / (1 + exp(-x)) without overflow or nan; keeps the float dtype."""
    a = _py_float(x)
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(-np.abs(a))
        r = a.dtype.type(1) / (a.dtype.type(1) + e)
        return _ret(np.where(a >= 0, r, e * r).astype(a.dtype))


def softplus(x):
    """log(1 + exp(x)) computed stably (= np.logaddexp(0, x)); keeps the float dtype."""
    a = _py_float(x)
    return _ret(np.logaddexp(a.dtype.type(0), a))


def erf(x):
    """Error function (libm; not vectorised); keeps the float dtype."""
    a = _py_float(x)
    return _ret(np.vectorize(math.erf, otypes=[a.dtype])(a))


def erfc(x):
    """Complementary error function 1 - erf(x), accurate in both tails (vectorised); keeps the
    float dtype."""
    a = _py_float(x)
    return _ret(np.vectorize(math.erfc, otypes=[a.dtype])(a))


def _register(pyfunc, impl32, impl64):
    # inline='always' splices the one-line lambda into the caller's Numba IR (leaving only the
    # call to the alwaysinline helper); otherwise the lambda is an extra opaque call.
    @overload(pyfunc, target="cpu", inline="always")
    def _ol(x):
        if isinstance(x, types.Float):
            if x.bitwidth == 32:
                return lambda x: impl32(x)
            return lambda x: impl64(x)
        if isinstance(x, (types.Integer, types.Boolean)):
            return lambda x: impl64(D(x))
        return None
    return _ol


_register(tanh, _tanh_f32, _tanh_f64)
_register(exp, _exp_f32, _exp_f64)
_register(expm1, _expm1_f32, _expm1_f64)
_register(log, _log_f32, _log_f64)
_register(log1p, _log1p_f32, _log1p_f64)
_register(sigmoid, _sigmoid_f32, _sigmoid_f64)
_register(softplus, _softplus_f32, _softplus_f64)
_register(erfc, _erfc_f32, _erfc_f64)
_register(erf, _erf_f32, _erf_f64)
