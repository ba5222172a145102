"""The convolution's input gradient (``conv2d_bwd_data``, also the transposed convolution)
against NumPy written here: ``dy`` scattered back through every filter tap.

Stride-1 gradients whose forward twin takes the taps kernel or the direct loops run as the
forward convolution of ``dy`` with the flipped, transposed filter (``conv.by_forward``); the
others keep im2col + BLAS + col2im. Both, from the host and from compiled code (the overload a
native loop or an AOT artifact calls)."""
import numba
import numpy as np
import pytest

from pdjit.codegen.nnlib import conv


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


@numba.njit(cache=False)
def _native_bwd_data(dy, w, dx, sh, sw, pt, pl, dh, dw, groups):
    conv.conv2d_bwd_data(dy, w, dx, sh, sw, pt, pl, dh, dw, groups)


def test_input_gradient_from_compiled_code():
    """The overload compiled code calls (one thread, the whole batch): each path against the
    scatter oracle."""
    for case in (CASES[1], CASES[4], CASES[7]):
        dy, w, want, geo = _case(case, np.float64)
        dx = np.full(want.shape, np.nan)
        _native_bwd_data(dy, w, dx, *geo)
        np.testing.assert_allclose(dx, want, rtol=1e-11, atol=1e-10)


def test_misfit_is_an_error_not_a_crash():
    dy, w, want, geo = _case(CASES[0], np.float32)
    with pytest.raises(ValueError, match="do not fit"):
        conv.conv2d_bwd_data(dy, w[:, :8], np.empty(want.shape, np.float32), *geo)
