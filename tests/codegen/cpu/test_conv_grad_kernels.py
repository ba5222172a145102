"""The convolution's gradient kernels against NumPy written here.

The input gradient (``conv2d_bwd_data``, also the transposed convolution): ``dy`` scattered
back through every filter tap.

Stride-1 gradients whose forward twin takes the taps kernel or the direct loops run as the
forward convolution of ``dy`` with the flipped, transposed filter (``conv.by_forward``); the
others keep im2col + BLAS + col2im. Both, from the host and from compiled code (the overload a
native loop or an AOT artifact calls)."""
import numba
import numpy as np
import pytest

from pdjit.codegen.cpu.lib import conv
from pdjit.codegen.cpu.lib._jit import caller


def scatter_oracle(dy, w, hw, strides, pads, dils, groups):
    """``dx`` ([N, C, H, W] with ``hw = (H, W)``): each tap ``(a, e)`` of the filter ([M,
    C/groups, KH, KW]) adds ``w[:, :, a, e]^T @ dy`` at the input pixels it read."""
    n, m, oh, ow = dy.shape
    _, cg, kh, kw = w.shape
    (sh, sw), (pt, pl), (dh, dw) = strides, pads, dils
    mg = m // groups
    hp = max(hw[0] + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(hw[1] + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    big = np.zeros((n, cg * groups, hp, wp))
    for g in range(groups):
        d = dy[:, g * mg:(g + 1) * mg].astype(np.float64)
        for a in range(kh):
            for e in range(kw):
                wt = w[g * mg:(g + 1) * mg, :, a, e].astype(np.float64)  # [mg, cg]
                big[:, g * cg:(g + 1) * cg, a * dh:a * dh + (oh - 1) * sh + 1:sh,
                    e * dw:e * dw + (ow - 1) * sw + 1:sw] += np.einsum("nmhw,mc->nchw", d, wt)
    return big[:, :, pt:pt + hw[0], pl:pl + hw[1]]


def _out(size, k, s, p0, p1, d):
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


# (n, c, h, w, m, kh, kw, strides, paddings [t, b, l, r], dilations, groups, by_forward)
CASES = [
    (2, 16, 16, 16, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),   # the ResNet's, smaller
    (1, 8, 9, 13, 6, 3, 3, (1, 1), (1, 3, 2, 0), (2, 2), 2, True),      # groups, dilation, pads
    (2, 4, 12, 12, 5, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),     # valid: dx wider than dy
    (1, 8, 11, 10, 4, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),     # 1x1
    (2, 6, 10, 9, 6, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 6, True),      # depthwise: direct loops
    (1, 3, 12, 12, 3, 5, 4, (1, 1), (4, 0, 1, 2), (1, 2), 3, True),     # depthwise, odd pads
    (2, 6, 10, 9, 12, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 6, False),    # multiplier 2: BLAS
    (2, 8, 12, 12, 8, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1, False),    # stride 2
    (1, 8, 12, 12, 8, 3, 3, (1, 1), (3, 0, 0, 0), (1, 1), 1, False),    # padding past the reach
    (1, 2, 12, 12, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, False),    # 2 image channels
]


def _case(case, dtype):
    n, c, h, wd, m, kh, kw, strides, pads, dils, groups, _ = case
    r = np.random.default_rng(abs(hash(case[:11])) % 2**32)
    oh = _out(h, kh, strides[0], pads[0], pads[1], dils[0])
    ow = _out(wd, kw, strides[1], pads[2], pads[3], dils[1])
    dy = r.normal(size=(n, m, oh, ow)).astype(dtype)
    w = r.normal(size=(m, c // groups, kh, kw)).astype(dtype)
    want = scatter_oracle(dy, w, (h, wd), strides, (pads[0], pads[2]), dils, groups)
    geo = (*strides, pads[0], pads[2], *dils, groups)
    return dy, w, want, geo


@pytest.mark.parametrize("case", CASES)
def test_input_gradient_against_scatter(case):
    """Every path of the host's entry (all of ``dx`` written: it starts as NaN; float64, the
    kernels the forward tests compile too), and the path it takes is the one the case names."""
    dy, w, want, geo = _case(case, np.float64)
    assert conv.by_forward(w, case[2] * case[3], *geo) == case[-1]
    dx = np.full(want.shape, np.nan)
    conv.conv2d_bwd_data(dy, w, dx, *geo)
    np.testing.assert_allclose(dx, want, rtol=1e-11, atol=1e-10)


def test_flipped_filter():
    """The transposed filter the forward path convolves with: [C, M/groups, KH, KW], flipped
    in both axes, per group; the compiled twin agrees with the host's NumPy one."""
    r = np.random.default_rng(0)
    w = r.normal(size=(6, 2, 3, 2))
    got = conv._flipped(w, 3)
    assert got.shape == (6, 2, 3, 2)
    for g in range(3):
        for m in range(2):
            for c in range(2):
                np.testing.assert_array_equal(got[g * 2 + c, m], w[g * 2 + m, c, ::-1, ::-1])
    into = np.full_like(got, np.nan)
    conv._flip_into(w, 3, into)
    np.testing.assert_array_equal(into, got)


@caller
def _native_grads(dy, w, dx, x, dwt, sh, sw, pt, pl, dh, dw, groups):
    conv.conv2d_bwd_data(dy, w, dx, sh, sw, pt, pl, dh, dw, groups)
    conv.conv2d_bwd_filter(x, dy, dwt, sh, sw, pt, pl, dh, dw, groups)


def test_gradients_from_compiled_code():
    """The overloads compiled code calls (one thread, the whole batch; one compiled function
    for both gradients: each links the library kernels into itself): the input gradient on
    each path against the scatter oracle, the filter gradient (both paths, the taps one for
    planes of 256+ outputs) against test_conv_bwd_filter's patches oracle. Literal geometry
    (as generated code writes it) must not compile the kernels again."""
    kernels = (conv._taps_range, conv._fwd_blas, conv._direct_range, conv._bwd_data_range,
               conv._bwd_filter_range, conv._bwd_filter_blas)
    before = {fn: set(fn.signatures) for fn in kernels}
    r = np.random.default_rng(1)
    for case in (CASES[1], CASES[4], CASES[7], CASES[0]):
        dy, w, want, geo = _case(case, np.float64)
        x = r.normal(size=want.shape)
        dx, dwt = np.full(want.shape, np.nan), np.full(w.shape, np.nan)
        _native_grads(dy, w, dx, x, dwt, *geo)
        np.testing.assert_allclose(dx, want, rtol=1e-11, atol=1e-10)
        np.testing.assert_allclose(dwt, patches_oracle(x, dy, w.shape, geo[:2], geo[2:4],
                                                       geo[4:6], geo[6]), rtol=1e-11,
                                   atol=1e-10)
    for fn in kernels:  # what this test's compiled function added
        for sig in set(fn.signatures) - before[fn]:
            assert all(not isinstance(t, numba.types.Literal) for t in sig), (fn, sig)


def test_misfit_is_an_error_not_a_crash():
    dy, w, want, geo = _case(CASES[0], np.float32)
    with pytest.raises(ValueError, match="do not fit"):
        conv.conv2d_bwd_data(dy, w[:, :8], np.empty(want.shape, np.float32), *geo)


# ---- the filter gradient: for each filter tap, the image pixels it read (a strided slice of the
# zero-padded image) contracted with dy. Planes of conv._TAPS_DW_MIN outputs or more (or of
# conv._TAPS_DW_MIN_SMALL where a group's gradient is small: see conv._TAPS_DW_MIN_SMALL),
# with 4+ output channels per group and 4+ products per output, run without im2col or BLAS
# (16 dot products at a time of dy's rows with the taps planes, the last blocks overlapping);
# the others through im2col + BLAS, a kernel of their own.
def patches_oracle(x, dy, wshape, strides, pads, dils, groups):
    n, c, h, wd = x.shape
    m, cg, kh, kw = wshape
    _, _, oh, ow = dy.shape
    (sh, sw), (pt, pl), (dh, dw) = strides, pads, dils
    xp = np.zeros((n, c, pt + h + (oh - 1) * sh + (kh - 1) * dh + 1,
                   pl + wd + (ow - 1) * sw + (kw - 1) * dw + 1))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    out = np.zeros(wshape)
    mg = m // groups
    for g in range(groups):
        d = dy[:, g * mg:(g + 1) * mg].astype(np.float64)
        for a in range(kh):
            for e in range(kw):
                seen = xp[:, g * cg:(g + 1) * cg, a * dh:a * dh + (oh - 1) * sh + 1:sh,
                          e * dw:e * dw + (ow - 1) * sw + 1:sw]
                out[g * mg:(g + 1) * mg, :, a, e] = np.einsum("nmhw,nchw->mc", d, seen)
    return out


# (n, c, h, w, m, kh, kw, strides, paddings [t, b, l, r], dilations, groups, taps)
DW_CASES = [
    (2, 4, 18, 18, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),     # the ResNet's, smaller
    (2, 3, 17, 16, 6, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),     # 6 rows, 27 taps: overlaps
    (1, 5, 33, 35, 7, 3, 3, (2, 2), (1, 0, 1, 1), (1, 1), 1, True),     # stride 2: row phases
    (1, 8, 24, 30, 10, 3, 2, (1, 2), (2, 1, 0, 1), (2, 3), 2, True),    # groups, dilation, pads
    (2, 5, 16, 17, 4, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),     # 1x1: 5 taps
    (1, 2, 19, 19, 3, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, False),    # 3 rows: BLAS
    (2, 8, 8, 8, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),       # 64 outputs, 8 x 72
    (1, 24, 8, 8, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, False),    # 64, 16 x 216: BLAS
    (1, 4, 8, 8, 20, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, False),     # 64, 20 rows: BLAS
    (2, 4, 7, 7, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, False),      # 49 outputs: BLAS
]


def _dw_case(case):
    n, c, h, wd, m, kh, kw, strides, pads, dils, groups, _ = case
    r = np.random.default_rng(abs(hash(case[:11])) % 2**32)
    oh = (h + pads[0] + pads[1] - dils[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[2] + pads[3] - dils[1] * (kw - 1) - 1) // strides[1] + 1
    x, dy = r.normal(size=(n, c, h, wd)), r.normal(size=(n, m, oh, ow))
    wshape = (m, c // groups, kh, kw)
    want = patches_oracle(x, dy, wshape, strides, (pads[0], pads[2]), dils, groups)
    return x, dy, want, (*strides, pads[0], pads[2], *dils, groups)


@pytest.mark.parametrize("case", DW_CASES)
def test_filter_gradient_against_patches(case):
    """Each path of the host's entry (all of ``dw`` written: it starts as NaN), and the path
    the case names is the one its shape selects."""
    x, dy, want, geo = _dw_case(case)
    m, cg, kh, kw = want.shape
    p, mg, k = dy.shape[2] * dy.shape[3], m // geo[-1], cg * kh * kw
    taps = mg >= 4 and k >= 4 and (p >= conv._TAPS_DW_MIN or (
        p >= conv._TAPS_DW_MIN_SMALL and mg <= conv._TAPS_DW_SMALL_ROWS and
        mg * k <= conv._TAPS_DW_SMALL))
    assert taps == case[-1]
    dwt = np.full(want.shape, np.nan)
    conv.conv2d_bwd_filter(x, dy, dwt, *geo)
    np.testing.assert_allclose(dwt, want, rtol=1e-11, atol=1e-10)


def test_batch_split_over_threads_sums_the_parts(monkeypatch):
    """A batch large enough to split: each thread's partial gradient summed."""
    monkeypatch.setattr(conv, "loop_threads", lambda: 2)
    monkeypatch.setattr(conv, "_PARALLEL_MIN_WORK", 0)
    x, dy, want, geo = _dw_case((6, 4, 20, 20, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True))
    assert conv._parts(x.shape[0], dy.size * want[0].size) == 2
    dwt = np.full(want.shape, np.nan)
    conv.conv2d_bwd_filter(x, dy, dwt, *geo)
    np.testing.assert_allclose(dwt, want, rtol=1e-11, atol=1e-10)
