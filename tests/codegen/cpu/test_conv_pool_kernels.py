"""The fast paths of the convolution and pooling library kernels (``pdjit.codegen.cpu.lib``)
against NumPy written here: 2x2 stride-2 and whole-plane pools, on sizes that leave rows and
columns out, through the compiled executor (strict: native code) and through the kernels'
native entry points (the ones a native loop and the AOT artifact call)."""
import numpy as np
import pytest

from pdjit.codegen.cpu import lib as nnlib
from pdjit.codegen.cpu.lib._jit import caller
from pdjit.testing.op_test import check_output

RNG = np.random.default_rng(11)


def np_pool22(x, is_max):
    """2x2 windows of stride 2, floor mode: the rows and columns past the last full window
    dropped."""
    n, c, h, w = x.shape
    v = x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2)
    return v.max(axis=(3, 5)) if is_max else v.astype(np.float64).mean(axis=(3, 5))


@pytest.mark.parametrize("dtype", [np.float32])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape", [(3, 2, 7, 9), (2, 3, 24, 24), (1, 1, 2, 34)])
def test_pool_2x2_stride_2(dtype, kind, shape):
    x = RNG.standard_normal(shape).astype(dtype)
    want = np_pool22(x, kind == "max").astype(dtype)
    check_output("pool2d", {"X": x}, dict(pooling_type=kind, ksize=[2, 2], strides=[2, 2],
                                          paddings=[0, 0]), {"Out": want})


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("attrs", [dict(global_pooling=True, ksize=[1, 1]),
                                   dict(adaptive=True, ksize=[1, 1]),
                                   dict(ksize=[5, 6])])
def test_pool_whole_plane(kind, attrs):
    x = RNG.standard_normal((3, 4, 5, 6)).astype(np.float32)
    want = x.max(axis=(2, 3)) if kind == "max" else x.astype(np.float64).mean(axis=(2, 3))
    check_output("pool2d", {"X": x}, dict(attrs, pooling_type=kind),
                 {"Out": want.astype(np.float32)[:, :, None, None]})


@caller
def _native_pool(x, y, k, s, is_max, adaptive):
    nnlib.pool2d_fwd(x, y, k, k, s, s, 0, 0, is_max, True, adaptive)


def test_native_entry_takes_the_same_paths():
    """Called from compiled code, the pool gives what the host call gives, bit for bit."""
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    for k, s, adaptive, oshape in ((2, 2, False, (4, 4)), (1, 1, True, (1, 1)),
                                   (3, 2, False, (4, 3))):
        for is_max in (True, False):
            a = np.empty((2, 3) + oshape, np.float32)
            b = np.empty_like(a)
            if adaptive:
                _native_pool(x, a, 1, 1, is_max, True)
                nnlib.pool2d_fwd(x, b, 1, 1, 1, 1, 0, 0, is_max, True, True)
            else:
                _native_pool(x, a, k, s, is_max, False)
                nnlib.pool2d_fwd(x, b, k, k, s, s, 0, 0, is_max, True, False)
            np.testing.assert_array_equal(a, b)
    want = np_pool22(x, True)
    _native_pool(x, a := np.empty((2, 3, 4, 4), np.float32), 2, 2, True, False)
    np.testing.assert_array_equal(a, want)


def np_conv(x, w, stride, pad, groups):
    """NCHW convolution in float64 by windows: each filter tap one product over all outputs."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    mg = m // groups
    y = np.zeros((n, m, oh, ow))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                win = xp[:, g * cg:(g + 1) * cg, i:i + stride * oh:stride, j:j + stride * ow:stride]
                y[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", win,
                                                       w[g * mg:(g + 1) * mg, :, i, j])
    return y


# the taps path's tiles: 6-row blocks (6, 18 rows), 4-row blocks overlapping (5, 7 rows),
# fewer than 4 rows (padded), spans of whole 4-vector tiles and of 1-vector tails, 1x1 planes
# read in place, strides and paddings, groups
TAPS_CASES = [
    ((3, 1, 28, 28), (6, 1, 5, 5), 1, 0, 1),
    ((2, 6, 14, 14), (16, 6, 5, 5), 1, 0, 1),
    ((2, 3, 23, 21), (18, 3, 3, 3), 2, 1, 1),
    ((2, 4, 10, 10), (5, 4, 3, 3), 1, 1, 1),
    ((2, 4, 11, 11), (14, 2, 3, 3), 1, 0, 2),
    ((2, 16, 16, 16), (24, 16, 1, 1), 1, 0, 1),
    ((2, 8, 8, 8), (3, 8, 1, 1), 1, 0, 1),
    ((1, 2, 12, 12), (2, 2, 5, 5), 1, 2, 1),
    # depthwise, stride 1 onto planes as wide as the image (flat offsets), and not
    ((2, 6, 10, 9), (6, 1, 3, 3), 1, 1, 6),
    ((1, 3, 7, 7), (3, 1, 5, 5), 1, 2, 3),
    ((2, 4, 6, 5), (4, 1, 3, 3), 1, 1, 4),
    ((2, 4, 8, 8), (4, 1, 3, 3), 1, 0, 4),
    ((2, 4, 9, 8), (4, 1, 3, 3), 2, 1, 4),
    # depthwise stride 2 over an even width (columns split by parity): MobileNet's layer,
    # no padding (a copy shifted right), 5x5 taps, two outputs per channel, planes whose
    # halves are no multiple of a vector
    ((2, 24, 16, 16), (24, 1, 3, 3), 2, 1, 24),
    ((2, 3, 7, 10), (3, 1, 3, 3), 2, 0, 3),
    ((1, 2, 11, 6), (2, 1, 5, 5), 2, 2, 2),
    ((2, 2, 5, 4), (4, 1, 3, 3), 2, 1, 2),
    # stride 2 onto half an even width of whole vectors (the taps planes' rows copied from
    # rows split by parity): MobileNet's first layer, 4x4 taps (shifts -1..1), 2x2 unpadded
    ((2, 3, 32, 32), (16, 3, 3, 3), 2, 1, 1),
    ((1, 2, 32, 32), (8, 2, 4, 4), 2, 1, 1),
    ((1, 2, 32, 32), (4, 2, 2, 2), 2, 0, 1),
]


# (float64, 8 lanes a vector: its 4-row tiles, 1-vector tails and same-width depthwise planes
# run in tests/codegen/cpu/test_conv_grad_kernels.py, the input gradient by the forward kernel)
@pytest.mark.parametrize("dtype,xshape,wshape,stride,pad,groups",
                         [(np.float32,) + c for c in TAPS_CASES])
def test_conv_taps_tiles(dtype, xshape, wshape, stride, pad, groups):
    x = RNG.standard_normal(xshape).astype(dtype)
    w = RNG.standard_normal(wshape).astype(dtype)
    want = np_conv(x, w, stride, pad, groups)
    rtol, atol = (1e-4, 1e-4) if dtype == np.float32 else (1e-10, 1e-10)
    check_output("conv2d", {"Input": x, "Filter": w},
                 dict(strides=[stride, stride], paddings=[pad, pad], groups=groups,
                      dilations=[1, 1]), {"Output": want.astype(dtype)}, rtol=rtol, atol=atol)


def test_depthwise_border_sees_no_other_row():
    """The flat depthwise path reads each plane at one offset per tap: a pixel past a row's
    end must read the zero padding, not the next row's first pixel (an inf there would make
    the far border inf or NaN)."""
    x = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    x[0, 0, 2, 0] = np.inf   # first column
    x[0, 1, 3, 5] = -np.inf  # last column
    w = RNG.uniform(0.5, 1.5, (2, 1, 3, 3)).astype(np.float32)
    y = np.empty((1, 2, 5, 6), np.float32)
    nnlib.conv2d_fwd(x, w, y, 1, 1, 1, 1, 1, 1, 2)
    want = np_conv(x, w, 1, 1, 2)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert np.isfinite(y[0, 0, :, 2:]).all() and np.isfinite(y[0, 1, :, :4]).all()


@caller
def _native_conv(x, w, y, s, p, groups):
    nnlib.conv2d_fwd(x, w, y, s, s, p, p, 1, 1, groups)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_stride2_halves(dtype):
    """Stride-2 depthwise over even widths (the columns split by parity, one copy per filter
    column) against NumPy, float32 (16 lanes) and float64 (8), with infinities in the first
    and last columns that only the padding may meet; float32 through the native entry too
    (bit for bit the host's; float64 there would compile the whole forward kernel, ~5 s)."""
    for xshape, k, pad in (((2, 3, 12, 14), 3, 1), ((1, 2, 9, 6), 3, 0), ((1, 2, 8, 10), 5, 2)):
        x = RNG.standard_normal(xshape).astype(dtype)
        c = xshape[1]
        x[0, 0, 3, 0] = np.inf
        x[0, 1, 4, -1] = -np.inf
        w = RNG.uniform(0.5, 1.5, (c, 1, k, k)).astype(dtype)
        oh, ow = (xshape[2] + 2 * pad - k) // 2 + 1, (xshape[3] + 2 * pad - k) // 2 + 1
        want = np_conv(x, w, 2, pad, c)
        a = np.empty((xshape[0], c, oh, ow), dtype)
        nnlib.conv2d_fwd(x, w, a, 2, 2, pad, pad, 1, 1, c)
        if dtype == np.float32:
            b = np.empty_like(a)
            _native_conv(x, w, b, 2, pad, c)
            np.testing.assert_array_equal(a, b)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(a, want, rtol=tol, atol=tol)
        # a border output that reads no infinity stays finite: none leaked across a row
        assert np.isfinite(a).sum() == np.isfinite(want).sum()


def np_conv_pads(x, w, stride, pt, pb, pl, pr, groups):
    """As np_conv, with the four paddings apart (the bottom and right ones may differ)."""
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    return np_conv(xp, w, stride, 0, groups)


# stride-2 depthwise where half the columns make half a vector (float32 width 16, float64
# width 8): the rows split by parity too, quarters read in place where a filter column keeps
# every pixel (the outputs straight into y); and beside them shapes that take the columns-only
# split (height no multiple of 4, fewer output columns than half the width). (xshape, k, pt,
# pb, pl, multiplier)
QUADS = [
    ((2, 3, 16, 16), 3, 1, 1, 1, 1),   # MobileNet's layer
    ((1, 2, 12, 16), 5, 2, 2, 2, 1),   # shifts -1..1, two columns copied
    ((1, 2, 8, 16), 4, 1, 1, 1, 2),    # an even filter, two outputs per channel
    ((1, 2, 8, 16), 3, 1, 3, 1, 1),    # a bottom padding of 3: an output row more
    ((1, 2, 8, 16), 3, 0, 1, 0, 1),    # no top or left padding
    ((1, 2, 14, 16), 3, 1, 1, 1, 1),   # height 14: columns-only split
    ((1, 2, 8, 16), 3, 0, 0, 0, 1),    # 7 output columns: columns-only split
    ((1, 2, 9, 224), 3, 1, 1, 1, 1),   # wide planes: two columns of vectors a loop,
    ((1, 3, 6, 130), 3, 1, 1, 1, 1),   # ... and an odd column left over
]


# the NumPy oracle adds inf and -inf where a window holds both (NaN, as the kernels give)
@pytest.mark.filterwarnings("ignore:invalid value encountered in add:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_stride2_quads(dtype):
    """Stride-2 depthwise by quarter planes against NumPy, infinities in the first and last
    rows and columns that only the padding may meet; float32 through the native entry too,
    bit for bit the host's."""
    for xshape, k, pt, pb, pl, mult in QUADS:
        xshape = xshape[:3] + (xshape[3] * 8 // np.dtype(dtype).itemsize // 2,)
        x = RNG.standard_normal(xshape).astype(dtype)
        n, c, h, wd = xshape
        x[0, 0, 3, 0] = np.inf
        x[0, 1, 4, -1] = -np.inf
        x[-1, -1, 0, 5] = np.inf
        x[-1, 0, -1, 2] = -np.inf
        w = RNG.uniform(0.5, 1.5, (c * mult, 1, k, k)).astype(dtype)
        oh, ow = (h + pt + pb - k) // 2 + 1, (wd + 2 * pl - k) // 2 + 1
        want = np_conv_pads(x, w, 2, pt, pb, pl, pl, c)
        assert want.shape[2:] == (oh, ow)
        a = np.empty((n, c * mult, oh, ow), dtype)
        nnlib.conv2d_fwd(x, w, a, 2, 2, pt, pl, 1, 1, c)
        if dtype == np.float32:
            b = np.empty_like(a)
            _native_conv_pads(x, w, b, pt, pl, c)
            np.testing.assert_array_equal(a, b)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(a, want, rtol=tol, atol=tol)
        assert np.isfinite(a).sum() == np.isfinite(want).sum()


@caller
def _native_conv_pads(x, w, y, pt, pl, groups):
    nnlib.conv2d_fwd(x, w, y, 2, 2, pt, pl, 1, 1, groups)


def np_conv_dil(x, w, pt, pb, pl, pr, dh, dw, groups):
    """Stride-1 NCHW convolution in float64 with dilations and four paddings, by taps."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = h + pt + pb - (kh - 1) * dh, wd + pl + pr - (kw - 1) * dw
    mg = m // groups
    y = np.zeros((n, m, oh, ow))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                win = xp[:, g * cg:(g + 1) * cg, i * dh:i * dh + oh, j * dw:j * dw + ow]
                y[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", win,
                                                       w[g * mg:(g + 1) * mg, :, i, j])
    return y


@caller
def _native_conv_dil(x, w, y, pt, pl, dh, dw, groups):
    nnlib.conv2d_fwd(x, w, y, 1, 1, pt, pl, dh, dw, groups)


# stride-1 3x3 depthwise onto planes as wide as the image, rows of whole vectors (the input
# rows rolled down a column of vectors, each loaded once for the three output rows reading
# it): (xshape at float32, pt, pb, pl, dh, dw, multiplier); the width halves for float64
ROLLED = [
    ((2, 3, 16, 16), 1, 1, 1, 1, 1, 1),   # MobileNet's layer
    ((1, 2, 6, 32), 1, 1, 1, 1, 1, 2),    # two vectors a row, two outputs per channel
    ((1, 2, 7, 16), 0, 2, 1, 1, 1, 1),    # all the vertical padding below
    ((1, 2, 7, 16), 2, 0, 2, 1, 2, 1),    # ... above; column dilation 2
    ((1, 2, 9, 16), 2, 2, 2, 2, 2, 1),    # dilation 2 both ways: the per-tap loop
]


# the NumPy oracle adds inf and -inf where a window holds both (NaN, as the kernels give)
@pytest.mark.filterwarnings("ignore:invalid value encountered in add:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_rolled_rows(dtype):
    """Stride-1 3x3 depthwise over rows of whole vectors against NumPy, with infinities in the
    first and last rows and columns that only the padding may meet; float32 through the
    native entry too, bit for bit the host's."""
    for xshape, pt, pb, pl, dh, dw, mult in ROLLED:
        n, c, h, wd = xshape[:3] + (xshape[3] * 4 // np.dtype(dtype).itemsize,)
        x = RNG.standard_normal((n, c, h, wd)).astype(dtype)
        x[0, 0, 3, 0] = np.inf
        x[0, 1, 4, -1] = -np.inf
        x[-1, -1, 0, 5] = np.inf
        x[-1, 0, -1, 2] = -np.inf
        w = RNG.uniform(0.5, 1.5, (c * mult, 1, 3, 3)).astype(dtype)
        want = np_conv_dil(x, w, pt, pb, pl, 2 * dw - pl, dh, dw, c)
        assert want.shape[3] == wd
        a = np.empty(want.shape, dtype)
        nnlib.conv2d_fwd(x, w, a, 1, 1, pt, pl, dh, dw, c)
        if dtype == np.float32:
            b = np.empty_like(a)
            _native_conv_dil(x, w, b, pt, pl, dh, dw, c)
            np.testing.assert_array_equal(a, b)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(a, want, rtol=tol, atol=tol)
        assert np.isfinite(a).sum() == np.isfinite(want).sum()


# the taps kernel's NumPy stand-in (conv._taps_numpy, what serves while a worker compiles the
# kernel beside a program's first runs): (xshape, wshape, stride, pad, dilation, groups)
STAND_IN = [
    ((3, 3, 20, 18), (8, 3, 7, 7), 2, 3, 1, 1),    # a stem: 7x7 stride 2
    ((3, 6, 9, 11), (9, 2, 3, 3), 1, 1, 1, 3),     # groups, odd sizes
    ((3, 4, 12, 12), (5, 4, 3, 3), 1, 2, 2, 1),    # dilation 2
    ((3, 2, 8, 7), (3, 2, 2, 4), 2, 0, 1, 1),      # an even, oblong filter, no padding
]


@pytest.mark.parametrize("xshape,wshape,stride,pad,dil,groups", STAND_IN)
def test_taps_stand_in(xshape, wshape, stride, pad, dil, groups):
    """``_taps_numpy`` against NumPy written here: samples 1..2 of 3 (the others untouched),
    with and without the epilogue (bias, a residual, a clamp), the residual also in the
    output's own buffer."""
    conv = nnlib.conv
    x = RNG.standard_normal(xshape).astype(np.float32)
    w = RNG.standard_normal(wshape).astype(np.float32)
    if dil == 1:
        want = np_conv(x, w, stride, pad, groups)
    else:
        want = np_conv_dil(x, w, pad, pad, pad, pad, dil, dil, groups)
    bias = RNG.standard_normal(wshape[0]).astype(np.float32)
    res = RNG.standard_normal(want.shape).astype(np.float32)
    empty = np.empty(0, np.float32)
    for b, r, lo, hi in ((empty, empty, -np.inf, np.inf), (bias, res, 0.0, 6.0)):
        y = np.full(want.shape, 7.5, np.float32)
        conv._taps_numpy(x, w, y, 1, 3, stride, stride, pad, pad, dil, dil, groups, b, lo, hi,
                         r.reshape(-1) if r.size else r)
        expect = want + (b.reshape(1, -1, 1, 1) if b.size else 0) + (r if r.size else 0)
        expect = np.minimum(np.maximum(expect, lo), hi)
        assert (y[0] == 7.5).all()
        np.testing.assert_allclose(y[1:], expect[1:], rtol=1e-4, atol=1e-4)
    y = res.copy()  # (the residual in y's buffer: read before it is written over)
    conv._taps_numpy(x, w, y, 0, 3, stride, stride, pad, pad, dil, dil, groups, bias, -1.0, 2.0,
                     y.reshape(-1))
    expect = np.minimum(np.maximum(want + bias.reshape(1, -1, 1, 1) + res, -1.0), 2.0)
    np.testing.assert_allclose(y, expect, rtol=1e-4, atol=1e-4)


def test_direct_stand_in_through_split_work(monkeypatch):
    """While a worker compiles the depthwise kernel beside the runs, ``split_work`` runs its
    stand-in (``replay.STAND_INS``: ``_taps_numpy``, no residual), unsplit, and so does a
    generated host kernel's direct call (``replay.kernel_call``): a depthwise filter with two
    outputs per channel, stride 2, bias and clamp, against NumPy."""
    from pdjit.codegen.cpu import replay

    conv = nnlib.conv
    calls = []
    monkeypatch.setattr(nnlib.team, "standing_in", lambda k: k is conv._direct_range)
    monkeypatch.setattr(conv, "_split", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(conv, "split_channels", lambda *a: calls.append(a))
    x = RNG.standard_normal((2, 6, 11, 10)).astype(np.float32)
    w = RNG.standard_normal((12, 1, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(12).astype(np.float32)
    want = np.minimum(np.maximum(np_conv(x, w, 2, 1, 6) + bias.reshape(1, -1, 1, 1), 0.0), 2.0)
    for call in (lambda y: conv.split_work(conv._direct_range, 2, 1 << 40, x, w, y, 2, 2, 1, 1,
                                           1, 1, 6, bias, 0.0, 2.0, head=3),
                 lambda y: replay.kernel_call(conv._direct_range, x, w, y, 0, 2, 2, 2, 1, 1, 1,
                                              1, 6, bias, 0.0, 2.0)):
        y = np.full((2, 12, 6, 5), np.nan, np.float32)
        call(y)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert not calls
