"""The channels-last (NHWC) convolution kernels (``pdjit.codegen.cpu.lib.channels_last``)
against NumPy oracles written here (naive loops over the taps): 1x1 on both tile widths,
depthwise and other convolutions of one group over windows, strides, paddings and
dilations, channel counts that are no multiple of a vector, each piece of the epilogue
(hard_swish and hard_sigmoid after the clamp too), ranges of samples; the one-sample splits
over threads give the same bits as one call; compiled code (rearranging the filter at each
call) the same values."""
import itertools

import numpy as np
import pytest

from pdjit.codegen.cpu.lib import channels_last as cl
from pdjit.codegen.cpu.lib._jit import caller

RNG = np.random.default_rng(48)
INF = np.inf
E = np.empty(0, np.float32)
#: the gates (``tile.gate_of``: a, b, lo, hi, scale) of hard_swish and of hard_sigmoid
HARD_SWISH = np.array([1.0, 3.0, 0.0, 6.0, 6.0], np.float32)
HARD_SIGMOID = np.array([0.2, 0.5, 0.0, 1.0, 0.0], np.float32)


def _epilogue(y, bias, res, lo, hi, gate=E):
    if bias.size:
        y = y + bias.astype(np.float64)
    if res.size:
        y = y + res.reshape(y.shape)
    y = np.minimum(np.maximum(y, lo), hi)
    if gate.size:  # x * min(max(x * a + b, lo), hi) / scale, or the min-max alone
        a, b, glo, ghi, scale = gate.astype(np.float64)
        t = np.minimum(np.maximum(y * a + b, glo), ghi)
        y = y * t / scale if scale else t
    return y


def _pointwise_oracle(x, w, bias, res, lo, hi, gate=E):
    y = np.einsum("nhwc,mc->nhwm", x.astype(np.float64),
                  w.reshape(w.shape[0], -1).astype(np.float64))
    return _epilogue(y, bias, res, lo, hi, gate)


def _window_sums(x, kh, kw, stride, pads, dil, m, tap):
    """``sum over the window's taps (a, b) inside the image of tap(x[:, ih, iw, :], a, b)``
    for each output pixel ([N, OH, OW, m], float64); ``x`` [N, H, W, C], pads (top, bottom,
    left, right)."""
    n, h, wd, c = x.shape
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, pads, dil
    oh = (h + pt + pb - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + pl + pr - (dw * (kw - 1) + 1)) // sw + 1
    y = np.zeros((n, oh, ow, m))
    for i in range(oh):
        for j in range(ow):
            for a in range(kh):
                for b in range(kw):
                    ih, iw = i * sh - pt + a * dh, j * sw - pl + b * dw
                    if 0 <= ih < h and 0 <= iw < wd:
                        y[:, i, j, :] += tap(x[:, ih, iw, :].astype(np.float64), a, b)
    return y


def _depthwise_oracle(x, w, stride, pads, dil, bias, res, lo, hi, gate=E):
    """``x`` [N, H, W, C], ``w`` [C, 1, KH, KW]; pads (top, bottom, left, right)."""
    y = _window_sums(x, *w.shape[2:], stride, pads, dil, w.shape[0],
                     lambda v, a, b: v * w[:, 0, a, b])
    return _epilogue(y, bias, res, lo, hi, gate)


def _conv_oracle(x, w, stride, pads, dil, bias, res, lo, hi):
    """``x`` [N, H, W, C], ``w`` [M, C, KH, KW] (one group); pads (top, bottom, left,
    right)."""
    y = _window_sums(x, *w.shape[2:], stride, pads, dil, w.shape[0],
                     lambda v, a, b: v @ w[:, :, a, b].T.astype(np.float64))
    return _epilogue(y, bias, res, lo, hi)


@pytest.fixture
def conv_kernel(monkeypatch):
    """``conv_nhwc`` on its kernel from the first call (else NumPy's stand-in serves until the
    kernel is compiled ahead and loaded, ``channels_last._conv_ready``)."""
    monkeypatch.setattr(cl, "_conv_ready", lambda: True)


def _cases(m, shape):
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(int(np.prod(shape))).astype(np.float32)
    return [(E, E, -INF, INF, E), (bias, E, -INF, INF, E), (E, res, -INF, INF, E),
            (E, E, 0.0, INF, E), (bias, res, 0.0, 6.0, E), (bias, E, -INF, INF, HARD_SWISH),
            (bias, res, -INF, INF, HARD_SIGMOID), (E, E, -1.0, 2.0, HARD_SWISH)]


@pytest.mark.parametrize("n,c,m,h,wd", [
    (1, 5, 7, 3, 5),      # narrow panels (32), a partial one; 15 pixels: a partial tile
    (2, 16, 24, 4, 4),    # narrow (24 of 32)
    (1, 37, 69, 5, 5),    # wide panels (64): two, the second 5 wide
    (3, 19, 96, 2, 7),    # 96: three narrow panels
    (2, 33, 128, 7, 7),   # two wide panels
])
def test_pointwise_against_numpy(n, c, m, h, wd):
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
    bp = cl.pointwise_nhwc_weight(w)
    nr = cl.panel_of(m)
    assert bp.size == -(-m // nr) * nr * c
    assert cl.pointwise_nhwc_weight(w) is bp     # kept beside the filter
    for bias, res, lo, hi, gate in _cases(m, (n, h, wd, m)):
        y = np.full((n, h, wd, m), np.nan, np.float32)
        cl.pointwise_nhwc(x, bp, y, 0, n, bias, lo, hi, res, gate)
        np.testing.assert_allclose(y, _pointwise_oracle(x, w, bias, res, lo, hi, gate),
                                   rtol=1e-4, atol=1e-4)
    if n > 1:  # a range of samples leaves the others alone
        y = np.full((n, h, wd, m), np.nan, np.float32)
        cl.pointwise_nhwc(x, bp, y, 1, 2, E, -INF, INF, E, E)
        np.testing.assert_allclose(y[1], _pointwise_oracle(x, w, E, E, -INF, INF)[1],
                                   rtol=1e-4, atol=1e-4)
        assert np.isnan(y[0]).all() and np.isnan(y[2:]).all()


def test_panel_width_follows_the_waste():
    assert [cl.panel_of(m) for m in (16, 24, 32, 64, 96, 128, 144, 160)] == \
        [32, 32, 32, 64, 32, 64, 32, 32]


@pytest.mark.parametrize("c,h,wd,k,stride,pads,dil", [
    (16, 7, 9, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (37, 9, 8, 3, (2, 2), (1, 1, 1, 1), (1, 1)),    # channels past a vector: masked
    (5, 6, 6, 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    (48, 11, 10, 5, (2, 1), (2, 1, 0, 2), (1, 1)),  # unequal strides and pads
    (20, 9, 9, 3, (1, 1), (2, 2, 2, 2), (2, 2)),    # dilated
    (32, 12, 13, 3, (1, 1), (0, 0, 0, 0), (1, 1)),  # no padding: no border
    (3, 1, 1, 3, (1, 1), (1, 1, 1, 1), (1, 1)),     # a 1x1 plane: all border
    (70, 4, 20, 3, (1, 2), (1, 1, 1, 1), (1, 1)),   # rows of more than one tile
    (96, 14, 14, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # MobileNetV2's: rows of two whole tiles
    (40, 7, 7, 3, (2, 2), (0, 1, 0, 1), (1, 1)),    # stride 2, padded after: a partial tile
    (40, 14, 14, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # MobileNetV3's 5x5: by columns, 2 tiles
    (33, 15, 15, 5, (2, 2), (2, 2, 2, 2), (1, 1)),  # 5x5 at stride 2 by columns
    (24, 13, 14, 5, (3, 3), (2, 2, 2, 2), (1, 1)),  # ... at stride 3: by taps
    (24, 13, 14, 3, (3, 3), (1, 1, 1, 1), (1, 1)),  # 3x3 at stride 3: by taps
])
def test_depthwise_against_numpy(c, h, wd, k, stride, pads, dil):
    n = 2
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = RNG.standard_normal((c, 1, k, k)).astype(np.float32)
    want0 = _depthwise_oracle(x, w, stride, pads, dil, E, E, -INF, INF)
    oh, ow = want0.shape[1:3]
    wt = cl.depthwise_nhwc_weight(w)
    assert wt.shape == (k * k, c) and cl.depthwise_nhwc_weight(w) is wt
    geo = (stride[0], stride[1], pads[0], pads[2], dil[0], dil[1], k, k)
    for bias, res, lo, hi, gate in _cases(c, (n, oh, ow, c)):
        y = np.full((n, oh, ow, c), np.nan, np.float32)
        cl.depthwise_nhwc(x, wt, y, 0, n, *geo, bias, lo, hi, res, gate)
        np.testing.assert_allclose(y, _depthwise_oracle(x, w, stride, pads, dil, bias, res, lo,
                                                         hi, gate), rtol=1e-4, atol=1e-4)
    y = np.full((n, oh, ow, c), np.nan, np.float32)
    cl.depthwise_nhwc(x, wt, y, 1, 2, *geo, E, -INF, INF, E, E)
    np.testing.assert_allclose(y[1], want0[1], rtol=1e-4, atol=1e-4)
    assert np.isnan(y[0]).all()


@pytest.mark.parametrize("c,m,h,wd,k,stride,pads,dil", [
    (3, 16, 9, 9, 3, (2, 2), (1, 1, 1, 1), (1, 1)),      # a stem: 3 channels, rows of 5
    (37, 69, 14, 14, 3, (1, 1), (1, 1, 1, 1), (1, 1)),   # two panels, the second 5 wide
    (16, 128, 10, 10, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # rows of a tile and a partial one
    (20, 50, 11, 9, 5, (2, 1), (2, 1, 0, 2), (1, 1)),    # unequal strides and pads
    (8, 24, 9, 9, 3, (1, 1), (2, 2, 2, 2), (2, 2)),      # dilated
    (33, 70, 14, 14, 1, (2, 2), (0, 0, 0, 0), (1, 1)),   # 1x1 stride 2: the image in place
    (24, 40, 8, 12, 3, (1, 1), (0, 0, 0, 0), (1, 1)),    # unpadded: in place, whole rows
    (5, 9, 1, 1, 3, (1, 1), (1, 1, 1, 1), (1, 1)),       # a 1x1 plane: all padding
])
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "stand-in"])
def test_conv_against_numpy(monkeypatch, kernel, c, m, h, wd, k, stride, pads, dil):
    monkeypatch.setattr(cl, "_conv_ready", lambda: kernel)
    n = 2
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = RNG.standard_normal((m, c, k, k)).astype(np.float32)
    want0 = _conv_oracle(x, w, stride, pads, dil, E, E, -INF, INF)
    oh, ow = want0.shape[1:3]
    bp = cl.conv_nhwc_weight(w)
    assert bp.size == -(-m // 64) * 64 * c * k * k and cl.conv_nhwc_weight(w) is bp
    geo = (stride[0], stride[1], pads[0], pads[2], dil[0], dil[1], k, k)
    for bias, res, lo, hi, _ in _cases(m, (n, oh, ow, m))[:5]:
        y = np.full((n, oh, ow, m), np.nan, np.float32)
        cl.conv_nhwc(x, bp, y, 0, n, *geo, bias, lo, hi, res)
        np.testing.assert_allclose(y, _conv_oracle(x, w, stride, pads, dil, bias, res, lo, hi),
                                   rtol=1e-4, atol=1e-4)
    y = np.full((n, oh, ow, m), np.nan, np.float32)
    cl.conv_nhwc(x, bp, y, 1, 2, *geo, E, -INF, INF, E)
    np.testing.assert_allclose(y[1], want0[1], rtol=1e-4, atol=1e-4)
    assert np.isnan(y[0]).all()


def test_conv_sums_across_chunks_of_the_filter_rows(conv_kernel):
    """A long sum (3x3 over 400 channels: 3600 rows of 64, 29 chunks) reads back the sums of
    the chunks before it from the output; the residual added once, the clamp at the end."""
    x = RNG.standard_normal((1, 7, 7, 400)).astype(np.float32)
    w = (RNG.standard_normal((60, 400, 3, 3)) * 0.05).astype(np.float32)
    bias = RNG.standard_normal(60).astype(np.float32)
    res = RNG.standard_normal(7 * 7 * 60).astype(np.float32)
    bp = cl.conv_nhwc_weight(w)
    y = np.empty((1, 7, 7, 60), np.float32)
    cl.conv_nhwc(x, bp, y, 0, 1, 1, 1, 1, 1, 1, 1, 3, 3, bias, -0.5, 0.5, res)
    want = _conv_oracle(x, w, (1, 1), (1, 1, 1, 1), (1, 1), bias, res, -0.5, 0.5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert 0 < (want == 0.5).mean() < 1  # (the clamp bites)


@pytest.mark.parametrize("c,k,stride,pads", [
    (64, 3, (2, 2), (1, 1, 1, 1)),  # by phases of the stride, by blocks of output rows
    (64, 3, (1, 1), (1, 1, 1, 1)),  # by blocks of output rows
    (64, 5, (2, 3), (2, 1, 2, 0)),  # phases of unequal strides and pads
])
def test_conv_of_an_image_past_a_block(conv_kernel, c, k, stride, pads):
    """An image larger than ``CONV_BLOCK_BYTES`` (48x48 of 64 channels: 576 KiB) is swept by
    blocks of output rows, each under every chunk of the filter; a strided window's image is
    read from planes of the stride's phases; every output row the same, whole or by ranges of
    rows (as threads split a sample)."""
    x = RNG.standard_normal((1, 48, 48, c)).astype(np.float32)
    assert x.nbytes > cl.CONV_BLOCK_BYTES
    w = (RNG.standard_normal((70, c, k, k)) * 0.05).astype(np.float32)
    bias = RNG.standard_normal(70).astype(np.float32)
    want = _conv_oracle(x, w, stride, pads, (1, 1), bias, E, 0.0, INF)
    oh, ow = want.shape[1:3]
    bp = cl.conv_nhwc_weight(w)
    y = np.full((1, oh, ow, 70), np.nan, np.float32)
    cl.conv_nhwc(x, bp, y, 0, 1, *stride, pads[0], pads[2], 1, 1, k, k, bias, 0.0, INF, E)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    parts = np.full_like(y, np.nan)
    for o0, o1 in ((0, 3), (3, oh - 2), (oh - 2, oh)):
        cl._conv_rows(x, bp, k, k, parts, 0, 1, o0, o1, *stride, pads[0], pads[2], 1, 1, bias,
                      0.0, INF, E, 0, -1)
    np.testing.assert_array_equal(parts, y)


@pytest.mark.parametrize("c,m,h,wd,kh,kw,pads,dil", [
    (24, 70, 17, 17, 7, 1, (3, 3, 0, 0), (1, 1)),   # Inception's 7x1 on 17x17
    (24, 70, 17, 17, 1, 7, (0, 0, 3, 3), (1, 1)),   # ... and its 1x7
    (40, 64, 8, 8, 3, 1, (1, 1, 0, 0), (1, 1)),     # its 3x1 on 8x8
    (16, 30, 9, 15, 3, 1, (2, 2, 0, 0), (2, 1)),    # dilated; rows of 7 + 4 + 4 pixels
    (64, 70, 48, 48, 1, 3, (0, 0, 1, 1), (1, 1)),   # past a block of rows (CONV_BLOCK_BYTES)
])
def test_a_window_one_row_or_column_wide(conv_kernel, c, m, h, wd, kh, kw, pads, dil):
    """Windows of one row or one column (Inception's 1x7, 7x1, 1x3, 3x1 layers), on rows of
    whole tiles and of a short last one (17: 7 + 7 + 3; 8 and 15 end in two of 4): the
    oracle's values with each epilogue, whole and by ranges of output rows (as threads split
    a sample: the same bits)."""
    n = 2
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = (RNG.standard_normal((m, c, kh, kw)) * 0.1).astype(np.float32)
    oh, ow = _conv_oracle(x, w, (1, 1), pads, dil, E, E, -INF, INF).shape[1:3]
    bp = cl.conv_nhwc_weight(w)
    geo = (1, 1, pads[0], pads[2], dil[0], dil[1], kh, kw)
    for bias, res, lo, hi, _ in _cases(m, (n, oh, ow, m))[:5]:
        y = np.full((n, oh, ow, m), np.nan, np.float32)
        cl.conv_nhwc(x, bp, y, 0, n, *geo, bias, lo, hi, res)
        np.testing.assert_allclose(y, _conv_oracle(x, w, (1, 1), pads, dil, bias, res, lo, hi),
                                   rtol=1e-4, atol=1e-4)
        parts = np.full_like(y, np.nan)
        for o0, o1 in ((0, 2), (2, oh - 3), (oh - 3, oh)):
            cl._conv_rows(x, bp, kh, kw, parts, 0, n, o0, o1, 1, 1, pads[0], pads[2], dil[0],
                          dil[1], bias, float(lo), float(hi), res, 0, -1)
        np.testing.assert_array_equal(parts, y)


def test_a_strided_1x1_conv_gathers_its_pixels(conv_kernel):
    """A 1x1 unpadded window at a stride (ResNet's projections) gathers the pixels its outputs
    read and runs the 1x1 layers' product on them: against NumPy with a bias, a residual (in
    another buffer and in the output's own) and a clamp, odd planes and a last panel 22 wide;
    ranges of output rows and of panels (as threads split a sample) give the whole call's
    bits; an output plane larger than the stride allows is refused."""
    n, h, wd, c, m = 2, 15, 13, 96, 150
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = (RNG.standard_normal((m, c, 1, 1)) * 0.1).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    oh, ow = 8, 7
    res = RNG.standard_normal(n * oh * ow * m).astype(np.float32)
    bp = cl.conv_nhwc_weight(w)
    geo = (2, 2, 0, 0, 1, 1, 1, 1)
    want = _conv_oracle(x, w, (2, 2), (0, 0, 0, 0), (1, 1), bias, res, -1.0, 1.5)
    assert want.shape == (n, oh, ow, m) and 0 < (want == 1.5).mean() < 0.5
    one = np.full((n, oh, ow, m), np.nan, np.float32)
    cl.conv_nhwc(x, bp, one, 0, n, *geo, bias, -1.0, 1.5, res)
    np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-4)
    inplace = res.reshape(one.shape).copy()
    cl.conv_nhwc(x, bp, inplace, 0, n, *geo, bias, -1.0, 1.5, inplace.reshape(-1))
    np.testing.assert_array_equal(inplace, one)
    parts = np.full_like(one, np.nan)
    for (o0, o1), (p0, p1) in itertools.product(((0, 3), (3, oh)), ((0, 1), (1, 3))):
        cl._conv_rows(x, bp, 1, 1, parts, 0, n, o0, o1, 2, 2, 0, 0, 1, 1, bias, -1.0, 1.5,
                      res, p0, p1)
    np.testing.assert_array_equal(parts, one)
    with pytest.raises(ValueError, match="do not fit"):
        cl._conv_rows(x, bp, 1, 1, np.empty((n, oh + 1, ow, m), np.float32), 0, n, 0, oh, 2,
                      2, 0, 0, 1, 1, bias, -1.0, 1.5, E, 0, -1)


def test_one_sample_splits_give_the_same_bits(conv_kernel):
    x = RNG.standard_normal((1, 14, 14, 40)).astype(np.float32)
    w = RNG.standard_normal((72, 40, 1, 1)).astype(np.float32)
    bias = RNG.standard_normal(72).astype(np.float32)
    res = RNG.standard_normal(14 * 14 * 72).astype(np.float32)
    bp = cl.pointwise_nhwc_weight(w)
    one = np.empty((1, 14, 14, 72), np.float32)
    cl.pointwise_nhwc(x, bp, one, 0, 1, bias, 0.0, 6.0, res, HARD_SWISH)
    two = np.full_like(one, np.nan)
    assert cl._split_pointwise(2, 1 << 30, x, bp, two, bias, 0.0, 6.0, res, HARD_SWISH)
    np.testing.assert_array_equal(two, one)

    d = RNG.standard_normal((40, 1, 3, 3)).astype(np.float32)
    wt = cl.depthwise_nhwc_weight(d)
    geo = (1, 1, 1, 1, 1, 1, 3, 3)
    one = np.empty((1, 14, 14, 40), np.float32)
    cl.depthwise_nhwc(x, wt, one, 0, 1, *geo, bias[:40], 0.0, 6.0, E, HARD_SIGMOID)
    two = np.full_like(one, np.nan)
    assert cl._split_depthwise(2, 1 << 30, x, wt, two, *geo, bias[:40], 0.0, 6.0, E,
                               HARD_SIGMOID)
    np.testing.assert_array_equal(two, one)
    # too little work: not split (the caller runs it whole)
    assert not cl._split_depthwise(2, 10, x, wt, two, *geo, bias[:40], 0.0, 6.0, E, E)

    # a 3x3 stride-2 filter on a padded copy; a 1x1 stride-2 one reads the image in place,
    # each part from its own first row
    for k, pad in ((3, 1), (1, 0)):
        f = RNG.standard_normal((72, 40, k, k)).astype(np.float32)
        bp = cl.conv_nhwc_weight(f)
        geo = (2, 2, pad, pad, 1, 1, k, k)
        one = np.empty((1, 7, 7, 72), np.float32)
        cl.conv_nhwc(x, bp, one, 0, 1, *geo, bias, 0.0, 6.0, E)
        np.testing.assert_allclose(one, _conv_oracle(x, f, (2, 2), (pad,) * 4, (1, 1), bias, E,
                                                     0.0, 6.0), rtol=1e-4, atol=1e-4)
        two = np.full_like(one, np.nan)
        assert cl._split_conv(2, 1 << 30, x, bp, two, *geo, bias, 0.0, 6.0, E)
        np.testing.assert_array_equal(two, one)
        assert not cl._split_conv(2, 10, x, bp, two, *geo, bias, 0.0, 6.0, E)


@pytest.mark.parametrize("n,c,m,h,wd", [(2, 5, 7, 3, 5), (1, 37, 69, 5, 5), (3, 19, 96, 2, 7)])
def test_pointwise_stand_in_while_its_kernel_compiles(monkeypatch, n, c, m, h, wd):
    """While a worker compiles ``pointwise_nhwc`` beside the runs (``team.standing_in``),
    ``split_work`` runs NumPy's calls in its place (``replay.STAND_INS``), unsplit, a
    recording refused: against the oracle, each piece of the epilogue, both panel widths."""
    from pdjit.codegen.cpu.lib import conv, team

    calls = []
    monkeypatch.setattr(team, "standing_in", lambda k: k is cl.pointwise_nhwc)
    monkeypatch.setattr(conv, "_split", lambda *a, **k: calls.append(a))
    monkeypatch.setitem(conv.CHANNEL_SPLITS, cl.pointwise_nhwc, lambda *a: calls.append(a))
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
    bp = cl.pointwise_nhwc_weight(w)
    for bias, res, lo, hi, gate in _cases(m, (n, h, wd, m)):
        y = np.full((n, h, wd, m), np.nan, np.float32)
        conv.split_work(cl.pointwise_nhwc, n, 1 << 40, x, bp, y, bias, lo, hi, res, gate,
                        head=3)
        np.testing.assert_allclose(y, _pointwise_oracle(x, w, bias, res, lo, hi, gate),
                                   rtol=1e-4, atol=1e-4)
    assert not calls  # (neither split over samples nor over a sample's channels)
    assert not cl._split_pointwise(2, 1 << 40, x[:1], bp, y[:1], E, -INF, INF, E, E)


def test_a_conv_waits_for_its_kernel_on_numpys_calls(monkeypatch):
    """Until its kernel is ready ``conv_nhwc`` runs NumPy's calls (nothing compiled in a cold
    process's first results) and splits nothing; a host driver's recording is refused."""
    calls = []
    monkeypatch.setattr(cl, "_conv_ready", lambda: False)
    monkeypatch.setattr(cl, "_conv_rows", lambda *a: calls.append(a))
    x = RNG.standard_normal((1, 9, 9, 12)).astype(np.float32)
    w = RNG.standard_normal((20, 12, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(20).astype(np.float32)
    res = RNG.standard_normal(5 * 5 * 20).astype(np.float32)
    bp = cl.conv_nhwc_weight(w)
    y = np.full((1, 5, 5, 20), np.nan, np.float32)
    assert not cl._split_conv(2, 1 << 30, x, bp, y, 2, 2, 1, 1, 1, 1, 3, 3, bias, 0.0, 6.0, res)
    cl.conv_nhwc(x, bp, y, 0, 1, 2, 2, 1, 1, 1, 1, 3, 3, bias, 0.0, 6.0, res)
    assert not calls
    np.testing.assert_allclose(y, _conv_oracle(x, w, (2, 2), (1, 1, 1, 1), (1, 1), bias, res,
                                               0.0, 6.0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hw,c,m,parts,by_panels", [
    (7, 160, 960, 2, True), (7, 96, 320, 2, True), (7, 24, 200, 3, True), (14, 8, 40, 2, False),
    (14, 64, 384, 2, False)])
def test_a_sample_split_by_panels_or_pixels_on_the_team_gives_one_calls_bits(
        team_loops, monkeypatch, hw, c, m, parts, by_panels):
    """One sample on a parallel loop: by panels of output channels where the packed weight
    is more than ``PANELS_OVER_IMAGE`` times the image (each part its own panels, every pixel,
    the panels left over by pixels: 15 wide panels on two threads, 10 narrow ones, 7 narrow
    ones on two threads of three, 49 pixels being too few for three), else by ranges of
    pixels (a 14x14 image of 8 channels into 40; of 64 into 384, the weight twice the image);
    either way the one call's bits, against NumPy, the residual in another buffer and in the
    output's own."""
    x = RNG.standard_normal((1, hw, hw, c)).astype(np.float32)
    w = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(hw * hw * m).astype(np.float32)
    bp = cl.pointwise_nhwc_weight(w)
    one = np.empty((1, hw, hw, m), np.float32)
    cl.pointwise_nhwc(x, bp, one, 0, 1, bias, 0.0, 6.0, res, HARD_SWISH)
    np.testing.assert_allclose(one, _pointwise_oracle(x, w, bias, res, 0.0, 6.0, HARD_SWISH),
                               rtol=1e-4, atol=1e-4)
    for panels in (True, False):
        monkeypatch.setattr(cl, "BY_PANELS", [panels])
        for in_place in (False, True):
            got = res.reshape(one.shape).copy() if in_place else np.full_like(one, np.nan)
            team_loops.clear()
            assert cl._split_pointwise(parts, 1 << 30, x, bp, got, bias, 0.0, 6.0,
                                       got.reshape(-1) if in_place else res, HARD_SWISH)
            (loop, pans, ran), = team_loops
            assert loop is cl._pixel_parts and ran
            # (by panels: a group of the parts' own panels each, then the panels left)
            assert (pans.size > 3) == (panels and by_panels)
            np.testing.assert_array_equal(got, one)


@pytest.mark.parametrize("hw,c,m,parts", [(7, 64, 200, 2), (28, 16, 24, 2), (7, 48, 150, 3)])
def test_a_conv_split_by_panels_or_rows_on_the_team_gives_one_calls_bits(
        team_loops, monkeypatch, hw, c, m, parts):
    """One sample of ``conv_nhwc`` (3x3, padded) on a parallel loop: by panels of output
    channels where the packed filter outweighs the image (4 panels of 64 on two threads; 3 on
    three), else by ranges of output rows (28 rows of a 16-channel image into 24); the one
    call's bits either way, the residual in another buffer and in the output's own."""
    x = RNG.standard_normal((1, hw, hw, c)).astype(np.float32)
    w = RNG.standard_normal((m, c, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(hw * hw * m).astype(np.float32)
    bp = cl.conv_nhwc_weight(w)
    geo = (1, 1, 1, 1, 1, 1, 3, 3)
    one = np.empty((1, hw, hw, m), np.float32)
    cl.conv_nhwc(x, bp, one, 0, 1, *geo, bias, 0.0, 6.0, res)
    np.testing.assert_allclose(one, _conv_oracle(x, w, (1, 1), (1, 1, 1, 1), (1, 1), bias, res,
                                                 0.0, 6.0), rtol=1e-4, atol=1e-4)
    by_panels = bp.size > x.size
    for panels in (True, False):
        monkeypatch.setattr(cl, "BY_PANELS", [panels])
        for in_place in (False, True):
            got = res.reshape(one.shape).copy() if in_place else np.full_like(one, np.nan)
            team_loops.clear()
            assert cl._split_conv(parts, 1 << 30, x, bp, got, *geo, bias, 0.0, 6.0,
                                  got.reshape(-1) if in_place else res)
            (loop, pans, ran), = team_loops
            assert loop is cl._conv_parts and ran
            assert (pans.size > 3) == (panels and by_panels)
            np.testing.assert_array_equal(got, one)


def test_compiled_code_packs_a_conv_filter_at_each_call():
    @caller
    def conv(x, w, y, bias):
        bp = cl.conv_nhwc_weight(w)
        cl.conv_nhwc(x, bp, y, 0, x.shape[0], 2, 2, 1, 1, 1, 1, 3, 3, bias, 0.0, np.inf,
                     bias[:0])

    x = RNG.standard_normal((2, 9, 9, 10)).astype(np.float32)
    for m in (20, 70):  # (one partial panel; a whole one and a partial one)
        w = RNG.standard_normal((m, 10, 3, 3)).astype(np.float32)
        bias = RNG.standard_normal(m).astype(np.float32)
        y = np.empty((2, 5, 5, m), np.float32)
        conv(x, w, y, bias)
        np.testing.assert_allclose(y, _conv_oracle(x, w, (2, 2), (1, 1, 1, 1), (1, 1), bias, E,
                                                   0.0, INF), rtol=1e-4, atol=1e-4)


def test_compiled_code_rearranges_the_filter_at_each_call():
    @caller
    def both(x, w, d, y1, y2, bias):
        bp = cl.pointwise_nhwc_weight(w)
        cl.pointwise_nhwc(x, bp, y1, 0, x.shape[0], bias, 0.0, np.inf, bias[:0], bias[:0])
        wt = cl.depthwise_nhwc_weight(d)
        cl.depthwise_nhwc(x, wt, y2, 0, x.shape[0], 2, 2, 1, 1, 1, 1, 3, 3, bias[:0],
                          -np.inf, np.inf, bias[:0], np.array((1.0, 3.0, 0.0, 6.0, 6.0), x.dtype))

    x = RNG.standard_normal((2, 6, 7, 24)).astype(np.float32)
    for m in (24, 64):  # a narrow and a wide panel
        w = RNG.standard_normal((m, 24, 1, 1)).astype(np.float32)
        d = RNG.standard_normal((24, 1, 3, 3)).astype(np.float32)
        bias = RNG.standard_normal(m).astype(np.float32)
        y1 = np.empty((2, 6, 7, m), np.float32)
        y2 = np.empty((2, 3, 4, 24), np.float32)
        both(x, w, d, y1, y2, bias)
        np.testing.assert_allclose(y1, _pointwise_oracle(x, w, bias, E, 0.0, INF), rtol=1e-4,
                                   atol=1e-4)
        np.testing.assert_allclose(y2, _depthwise_oracle(x, d, (2, 2), (1, 1, 1, 1), (1, 1), E,
                                                         E, -INF, INF, HARD_SWISH),
                                   rtol=1e-4, atol=1e-4)


def test_global_average_pool_against_numpy():
    from pdjit.codegen.cpu.lib import pool

    for n, h, wd, c in [(2, 7, 5, 37), (1, 1, 1, 16), (3, 14, 14, 96)]:
        x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
        y = np.full((n, 1, 1, c), np.nan, np.float32)
        pool.pool2d_mean_nhwc(x, y)
        np.testing.assert_allclose(y, x.astype(np.float64).mean(axis=(1, 2), keepdims=True),
                                   rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        pool.pool2d_mean_nhwc(x, np.empty((3, 1, 1, c + 1), np.float32))


def _gate_f32(y, gate):
    """The gate in float32 as the reference kernels of hard_swish and hard_sigmoid compute it
    (each step rounded; NumPy's maximum and minimum keep a NaN)."""
    a, b, lo, hi, scale = gate
    t = np.minimum(np.maximum(y * a + b, lo), hi)
    return y * t / scale if scale else t


def test_gates_keep_nans_infinities_and_signed_zeros():
    """A gate applied in the stores gives the reference's bits where the sums are NaN, plus
    or minus infinity, -0.0, or at the gate's kinks (-3, 3 for hard_swish; -2.5, 2.5 for
    hard_sigmoid): each kernel's ungated output, gated in float32 by NumPy, bit for bit."""
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -3.0, 3.0, -2.5, 2.5, 6.0, -6.0,
                        1e-30, -1e30], np.float32)
    x = np.zeros((1, 4, 4, 16), np.float32)
    x.reshape(-1, 16)[:, 0] = np.resize(special, 16)   # channel 0 carries the specials
    w = np.zeros((40, 16, 1, 1), np.float32)
    w[:, 0, 0, 0] = 1.0                                 # every output: channel 0 alone
    bp = cl.pointwise_nhwc_weight(w)
    wt = cl.depthwise_nhwc_weight(np.ones((16, 1, 1, 1), np.float32))  # (1x1: x itself)
    geo = (1, 1, 0, 0, 1, 1, 1, 1)
    nz = np.full(16, -0.0, np.float32)  # (a bias of -0.0: the depthwise sums keep -0.0)
    for gate in (HARD_SWISH, HARD_SIGMOID):
        for run, m in ((lambda y, g: cl.pointwise_nhwc(x, bp, y, 0, 1, E, -INF, INF, E, g), 40),
                       (lambda y, g: cl.depthwise_nhwc(x, wt, y, 0, 1, *geo, nz, -INF, INF, E,
                                                       g), 16)):
            plain = np.empty((1, 4, 4, m), np.float32)
            run(plain, E)
            assert np.isnan(plain).any() and np.isinf(plain).any()  # (they reach the gate)
            assert m == 40 or np.signbit(plain[plain == 0]).any()
            got = np.empty_like(plain)
            run(got, gate)
            with np.errstate(invalid="ignore"):
                want = _gate_f32(plain, gate)
            assert np.array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("n,c,m,h,wd,pads", [
    (2, 16, 32, 14, 14, (1, 1, 1, 1)),   # ResNet's padding, one panel, 49 tiles a sample
    (2, 20, 40, 7, 9, (1, 1, 1, 1)),     # odd planes (tiles past the last row and column),
                                         # channels no multiple of a vector
    (1, 33, 70, 6, 5, (2, 2, 1, 0)),     # pads of 2 and of none, two panels (64 + 6)
    (3, 16, 130, 5, 6, (0, 0, 0, 0)),    # unpadded: a 3x4 output, three panels
    (2, 24, 32, 1, 1, (1, 1, 1, 1)),     # a 1x1 plane: one tap inside
    (2, 16, 32, 30, 30, (1, 1, 1, 1)),   # 450 tiles: two blocks
])
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "stand-in"])
def test_winograd_against_numpy(monkeypatch, kernel, n, c, m, h, wd, pads):
    """``winograd_nhwc`` (3x3, stride 1, F(2x2, 3x3)) against the direct sum in float64,
    each piece of the epilogue, a range of samples; the transformed filter packed once; its
    kernel, and NumPy's calls that stand in for it until it is compiled ahead."""
    monkeypatch.setattr(cl, "_wino_ready", lambda: kernel)
    ran = []
    if not kernel:
        monkeypatch.setattr(cl, "_wino_range", lambda *a: ran.append(a))
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = RNG.standard_normal((m, c, 3, 3)).astype(np.float32)
    want0 = _conv_oracle(x, w, (1, 1), pads, (1, 1), E, E, -INF, INF)
    oh, ow = want0.shape[1:3]
    up = cl.winograd_nhwc_weight(w)
    assert up.size == 16 * -(-m // 64) * 64 * c and cl.winograd_nhwc_weight(w) is up
    geo = (1, 1, pads[0], pads[2], 1, 1, 3, 3)
    calls = cl.WINO_CALLS[0]
    for bias, res, lo, hi, _ in _cases(m, (n, oh, ow, m))[:5]:
        y = np.full((n, oh, ow, m), np.nan, np.float32)
        cl.winograd_nhwc(x, up, y, 0, n, *geo, bias, lo, hi, res)
        np.testing.assert_allclose(y, _conv_oracle(x, w, (1, 1), pads, (1, 1), bias, res, lo,
                                                   hi), rtol=1e-4, atol=1e-4)
    assert cl.WINO_CALLS[0] == calls + 5
    y = np.full((n, oh, ow, m), np.nan, np.float32)
    cl.winograd_nhwc(x, up, y, n - 1, n, *geo, E, -INF, INF, E)
    np.testing.assert_allclose(y[n - 1], want0[n - 1], rtol=1e-4, atol=1e-4)
    assert np.isnan(y[:n - 1]).all()
    assert not ran


def test_winograd_refuses_what_it_does_not_compute():
    x = np.zeros((1, 6, 6, 16), np.float32)
    w = np.zeros((32, 16, 3, 3), np.float32)
    up = cl.winograd_nhwc_weight(w)
    y = np.zeros((1, 3, 3, 32), np.float32)
    with pytest.raises(ValueError, match="stride 1"):
        cl.winograd_nhwc(x, up, y, 0, 1, 2, 2, 1, 1, 1, 1, 3, 3, E, -INF, INF, E)
    with pytest.raises(ValueError, match="do not fit"):  # a filter of other channels
        cl.winograd_nhwc(x, up[:-1], np.zeros((1, 6, 6, 32), np.float32), 0, 1, 1, 1, 1, 1,
                         1, 1, 3, 3, E, -INF, INF, E)


@pytest.mark.parametrize("hw,c,m,parts,by", [
    (14, 32, 256, 2, "panels"),   # the transformed filter outweighs the image: by panels
    (7, 48, 150, 3, "panels"),    # three panels (64 + 64 + 22) on three threads
    (40, 16, 24, 2, "tiles"),     # one panel (ResNet-50's 64 channels on 56x56 alike): tiles
    (29, 20, 70, 3, "tiles"),     # an odd plane (a last row and column of half tiles), 2 panels
])
def test_a_winograd_sample_split_gives_one_calls_bits(team_loops, monkeypatch, hw, c, m,
                                                      parts, by):
    """One sample of ``winograd_nhwc`` split over threads, on a parallel loop and on
    ``run_parts``' helpers: by panels of output channels where the transformed filter
    outweighs the image, else by ranges of tiles (one panel cannot split by panels); the one
    call's bits, the residual in another buffer and in the output's own; too little work, or
    the kernel not ready, is not split."""
    monkeypatch.setattr(cl, "_wino_ready", lambda: True)
    x = RNG.standard_normal((1, hw, hw, c)).astype(np.float32)
    w = RNG.standard_normal((m, c, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(m).astype(np.float32)
    res = RNG.standard_normal(hw * hw * m).astype(np.float32)
    up = cl.winograd_nhwc_weight(w)
    geo = (1, 1, 1, 1, 1, 1, 3, 3)
    one = np.empty((1, hw, hw, m), np.float32)
    cl.winograd_nhwc(x, up, one, 0, 1, *geo, bias, 0.0, 6.0, res)
    np.testing.assert_allclose(one, _conv_oracle(x, w, (1, 1), (1, 1, 1, 1), (1, 1), bias, res,
                                                 0.0, 6.0), rtol=1e-4, atol=1e-4)
    npan, tiles = -(-m // 64), ((hw + 1) // 2) ** 2
    real, ranges = cl._wino_range, []

    def recorded(*a):  # (the helpers' calls: the parallel loop calls the kernel in itself)
        ranges.append(a[-4:])
        return real(*a)

    for on_team in (True, False):
        if not on_team:  # (the parallel loop compiled first: it calls the kernel it finds)
            monkeypatch.setattr(cl.team, "ready", lambda loop, args: False)
            monkeypatch.setattr(cl, "_wino_range", recorded)
        for in_place in (False, True):
            got = res.reshape(one.shape).copy() if in_place else np.full_like(one, np.nan)
            team_loops.clear()
            ranges.clear()
            assert cl._split_wino(parts, 1 << 30, x, up, got, *geo, bias, 0.0, 6.0,
                                  got.reshape(-1) if in_place else res)
            (loop, pans, ran), = team_loops
            assert loop is cl._wino_parts and ran == on_team and pans[-1] == npan
            np.testing.assert_array_equal(got, one)
            if on_team:
                assert not ranges
                continue
            assert len(ranges) == parts
            if by == "panels":
                assert sorted(q for q0, q1, _, _ in ranges for q in range(q0, q1)) == \
                    list(range(npan)) and all(r[2:] == (0, -1) for r in ranges)
            else:
                assert sorted(t for _, _, s0, s1 in ranges for t in range(s0, s1)) == \
                    list(range(tiles)) and all(r[:2] == (0, -1) for r in ranges)
    assert not cl._split_wino(parts, 10, x, up, one, *geo, bias, 0.0, 6.0, res)
    monkeypatch.setattr(cl, "_wino_ready", lambda: False)
    assert not cl._split_wino(parts, 1 << 30, x, up, one, *geo, bias, 0.0, 6.0, res)


def test_compiled_code_runs_a_winograd_layer_on_the_direct_kernel():
    """In compiled code (where a derived weight is made at each call) a layer lowered to
    ``winograd_nhwc`` runs the direct kernel on its filter packed for it: the same values."""
    @caller
    def conv(x, w, y, bias):
        up = cl.winograd_nhwc_weight(w)
        cl.winograd_nhwc(x, up, y, 0, x.shape[0], 1, 1, 1, 1, 1, 1, 3, 3, bias, 0.0, np.inf,
                         bias[:0])

    x = RNG.standard_normal((2, 9, 7, 20)).astype(np.float32)
    for m in (40, 70):  # (one partial panel; a whole one and a partial one)
        w = RNG.standard_normal((m, 20, 3, 3)).astype(np.float32)
        bias = RNG.standard_normal(m).astype(np.float32)
        y = np.empty((2, 9, 7, m), np.float32)
        conv(x, w, y, bias)
        np.testing.assert_allclose(y, _conv_oracle(x, w, (1, 1), (1, 1, 1, 1), (1, 1), bias, E,
                                                   0.0, INF), rtol=1e-4, atol=1e-4)
