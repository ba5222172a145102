"""Kernels that add a residual as they store their output also take the residual in the
output's own buffer (the memory plan gives a convolution's or a product's output the buffer of
a residual that dies there): each path of each kernel, with ``res`` a view of ``y`` holding
the residual, gives the values it gives with the residual in an array of its own, bit for bit
(the plan moves memory, never arithmetic), and a NumPy oracle's.

The paths: the taps kernel storing in place (a 1x1 image read in place; every sample under
each panel; channels that are no multiple of its tile rows, which compute aside then) and
computing aside (planes that are no multiple of a vector), its split by positions; a 1x1
product by BLAS; im2col + BLAS; Winograd's; the packed GEMM's rows and transposed tiles;
the NHWC kernels; a product by a weight (packed, and a few rows by BLAS)."""
import numpy as np
import pytest

from pdjit.codegen.cpu.lib import channels_last, conv, pgemm, pointwise
from pdjit.codegen.cpu.lib._jit import may_share

RNG = np.random.default_rng(57)
F32 = np.float32
INF = np.inf


def _conv_oracle(x, w, sh, pt, bias, res, lo, hi):
    """float64 convolution (stride ``sh`` both ways, padding ``pt`` all round) + bias +
    residual, clamped."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pt), (pt, pt)))
    oh, ow = (h + 2 * pt - kh) // sh + 1, (wd + 2 * pt - kw) // sh + 1
    y = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + sh * oh:sh, j:j + sh * ow:sh]
            y += np.einsum("mc,nchw->nmhw", w[:, :, i, j].astype(np.float64), patch)
    y += bias.astype(np.float64)[None, :, None, None]
    y += res.reshape(y.shape)
    return np.minimum(np.maximum(y, lo), hi)


def _both(run, shape, res):
    """``run(y, res)`` with the residual in an array of its own, then in ``y``'s buffer (a
    view of it, as the memory plan passes it): both results."""
    apart = np.full(shape, np.nan, F32)
    run(apart, res.copy())
    inplace = res.reshape(shape).copy()
    view = inplace.reshape(inplace.size)
    assert may_share(view, inplace)
    run(inplace, view)
    return apart, inplace


def test_arrays_that_may_share_memory():
    a = np.zeros(100, F32)
    m = a.reshape(10, 10)
    assert may_share(a, a[50:]) and may_share(m[:, 3], a[13:14])
    assert not may_share(a[:50], a[50:]) and not may_share(a, np.zeros(3, F32))
    assert not may_share(a[::-1][:50], a[:50]) and may_share(a[::-1][:50], a[50:51])
    assert not may_share(a[:0], a)


# (N, C, M, H, kernel, stride, pad): a 1x1 image in place, every sample under each panel
# (more output channels than positions), channels no multiple of the tile's rows (aside), a
# plane of 14x14 (aside: no multiple of a vector), a 3x3 stride-2 (planes prepared), a 1x1
# on BLAS (14x14, 32+ channels), im2col + BLAS (a plane under 16 outputs), Winograd
CONVS = [(2, 24, 64, 16, 1, 1, 0), (2, 16, 272, 4, 1, 1, 0), (1, 8, 20, 16, 1, 1, 0),
         (1, 16, 40, 14, 1, 1, 0), (1, 8, 24, 15, 3, 2, 1), (2, 40, 64, 14, 1, 1, 0),
         (2, 8, 16, 3, 3, 1, 1), (1, 16, 32, 12, 3, 1, 1)]


@pytest.mark.parametrize("n,c,m,h,k,s,p", CONVS)
def test_convolution_paths(n, c, m, h, k, s, p):
    x = RNG.standard_normal((n, c, h, h)).astype(F32)
    w = (RNG.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(F32)
    bias = RNG.standard_normal(m).astype(F32)
    oh = (h + 2 * p - k) // s + 1
    res = RNG.standard_normal(n * m * oh * oh).astype(F32)
    apart, inplace = _both(lambda y, r: conv._fwd_range(x, w, y, 0, n, s, s, p, p, 1, 1, 1,
                                                        bias, 0.0, INF, r),
                           (n, m, oh, oh), res)
    np.testing.assert_array_equal(inplace, apart)
    np.testing.assert_allclose(apart, _conv_oracle(x, w, s, p, bias, res, 0.0, INF),
                               rtol=1e-4, atol=1e-4)


def test_the_taps_kernels_split_by_positions():
    """Parts of output positions (a one-sample split over threads), each with the residual
    in its own positions of ``y``: the whole call's values."""
    x = RNG.standard_normal((1, 24, 16, 16)).astype(F32)
    w = (RNG.standard_normal((16, 24, 1, 1)) / 5).astype(F32)
    bias = RNG.standard_normal(16).astype(F32)
    res = RNG.standard_normal(16 * 256).astype(F32)

    def parts(y, r):
        for qa, qb in ((0, 96), (96, 256)):
            conv._taps_range(x, w, y, 0, 1, 1, 1, 0, 0, 1, 1, 1, bias, -INF, INF, r, qa, qb)

    apart, inplace = _both(parts, (1, 16, 16, 16), res)
    np.testing.assert_array_equal(inplace, apart)
    whole = np.empty((1, 16, 16, 16), F32)
    conv._fwd_range(x, w, whole, 0, 1, 1, 1, 0, 0, 1, 1, 1, bias, -INF, INF, res)
    np.testing.assert_array_equal(apart, whole)


@pytest.mark.parametrize("h", [7, 32])   # the transposed tiles (49 pixels), the rows
def test_the_packed_pointwise_kernels(h):
    c = 48 if h == 7 else 24
    x = RNG.standard_normal((2, c, h, h)).astype(F32)
    w = (RNG.standard_normal((72, c, 1, 1)) / 7).astype(F32)
    bias = RNG.standard_normal(72).astype(F32)
    res = RNG.standard_normal(2 * 72 * h * h).astype(F32)
    ap = pointwise.pointwise_weight(w, h * h)
    assert ap.size
    apart, inplace = _both(lambda y, r: pointwise.pointwise_range(
        x, w, ap, y, 0, 2, 1, 1, 0, 0, 1, 1, 1, bias, 0.0, 6.0, r), (2, 72, h, h), res)
    np.testing.assert_array_equal(inplace, apart)
    np.testing.assert_allclose(apart, _conv_oracle(x, w, 1, 0, bias, res, 0.0, 6.0),
                               rtol=1e-4, atol=1e-4)


def test_the_nhwc_kernels():
    x = RNG.standard_normal((2, 9, 9, 24)).astype(F32)
    bias = RNG.standard_normal(24).astype(F32)
    res = RNG.standard_normal(2 * 9 * 9 * 24).astype(F32)
    w1 = (RNG.standard_normal((24, 24, 1, 1)) / 5).astype(F32)
    bp = channels_last.pointwise_nhwc_weight(w1)
    apart, inplace = _both(lambda y, r: channels_last.pointwise_nhwc(
        x, bp, y, 0, 2, bias, -INF, INF, r, r[:0]), (2, 9, 9, 24), res)
    np.testing.assert_array_equal(inplace, apart)
    want = _conv_oracle(x.transpose(0, 3, 1, 2), w1, 1, 0, bias,
                        res.reshape(2, 9, 9, 24).transpose(0, 3, 1, 2), -INF, INF)
    np.testing.assert_allclose(apart.transpose(0, 3, 1, 2), want, rtol=1e-4, atol=1e-4)
    wd = RNG.standard_normal((24, 1, 3, 3)).astype(F32)
    wt = channels_last.depthwise_nhwc_weight(wd)
    apart, inplace = _both(lambda y, r: channels_last.depthwise_nhwc(
        x, wt, y, 0, 2, 1, 1, 1, 1, 1, 1, 3, 3, bias, 0.0, 6.0, r, r[:0]), (2, 9, 9, 24), res)
    np.testing.assert_array_equal(inplace, apart)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = sum(xp[:, i:i + 9, j:j + 9, :] * wd[:, 0, i, j] for i in range(3) for j in range(3))
    want = np.clip(want + bias + res.reshape(want.shape), 0.0, 6.0)
    np.testing.assert_allclose(apart, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [3, 40])   # a few rows by BLAS, then the packed tiles
def test_a_product_by_a_weight(rows):
    x = RNG.standard_normal((rows, 33)).astype(F32)
    w = (RNG.standard_normal((33, 50)) / 6).astype(F32)
    bias = RNG.standard_normal(50).astype(F32)
    res = RNG.standard_normal(rows * 50).astype(F32)
    bp = pgemm.packed_weight(w, False, rows)
    apart, inplace = _both(lambda y, r: pgemm.weight_rows(
        x, w, False, bp, 0, rows, y, 1, bias, r, -INF, INF), (rows, 50), res)
    np.testing.assert_array_equal(inplace, apart)
    want = x.astype(np.float64) @ w + bias + res.reshape(rows, 50)
    np.testing.assert_allclose(apart, want, rtol=1e-4, atol=1e-4)
