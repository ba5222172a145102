"""The forward convolution's algorithms are kernels of their own, picked in Python from the
shapes (``conv._fwd_kernel``) and in compiled code by the same rules (``conv._fwd_native``):
each path reached, against a NumPy loop oracle written here; the kernel that ran is asserted
compiled (native) for the call's types. Also the run intrinsics the kernels fill with."""
import numba
import numpy as np
import pytest

from pdjit.codegen.cpu.lib import conv
from pdjit.codegen.cpu.lib._jit import caller
from pdjit.codegen.cpu.lib.deint import copy_run, zero_run


def oracle(x, w, stride, pad, dil, groups):
    """conv(x, w) by loops over every output and tap (NCHW, zero padding)."""
    n_, c_, h_, w_ = x.shape
    m_, cg, kh, kw = w.shape
    mg = m_ // groups
    oh = (h_ + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w_ + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n_, m_, oh, ow))
    for n in range(n_):
        for m in range(m_):
            g = m // mg
            for i in range(oh):
                for j in range(ow):
                    s = 0.0
                    for c in range(cg):
                        for a in range(kh):
                            for b in range(kw):
                                r = i * stride[0] - pad[0] + a * dil[0]
                                q = j * stride[1] - pad[1] + b * dil[1]
                                if 0 <= r < h_ and 0 <= q < w_:
                                    s += x[n, g * cg + c, r, q] * w[m, c, a, b]
                    y[n, m, i, j] = s
    return y


# (image, filter, stride, pad, dilation, groups, the kernel's name)
CASES = [
    ((2, 3, 8, 8), (8, 3, 3, 3), 1, 1, 1, 1, "_fwd_taps"),     # 64 outputs a plane
    ((2, 3, 8, 8), (2, 3, 3, 3), 1, 1, 1, 1, "_fwd_taps"),     # fewer than 4 rows: aside
    ((2, 4, 8, 8), (6, 4, 1, 1), 1, 0, 1, 1, "_fwd_taps"),     # 1x1: the image its own plane
    ((2, 2, 8, 16), (4, 2, 3, 3), 2, 1, 1, 1, "_fwd_taps"),    # stride 2 onto 4x8 planes
    ((2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, 1, "_fwd_taps"),     # 42 outputs: a part vector
    ((1, 40, 5, 5), (14, 40, 3, 3), 1, 1, 1, 1, "_fwd_taps"),  # 360 taps in blocks; 6-row tiles
    ((2, 600, 4, 4), (30, 600, 1, 1), 1, 0, 1, 1, "_fwd_taps"),  # panels of rows, 2 samples
    ((2, 40, 4, 4), (32, 40, 1, 1), 1, 0, 1, 1, "_fwd_gemm"),  # 1x1, 32+ channels: BLAS
    ((2, 64, 3, 3), (64, 32, 1, 1), 1, 0, 1, 2, "_fwd_gemm"),  # the same by groups
    ((3, 40, 4, 4), (32, 40, 1, 1), 1, 0, 1, 1, "_fwd_gemm"),  # 3 samples, a small plane
    ((3, 40, 16, 17), (32, 40, 1, 1), 1, 0, 1, 1, "_fwd_taps"),  # 3 samples of 272: taps
    ((1, 40, 16, 16), (32, 40, 1, 1), 1, 0, 1, 1, "_fwd_taps"),  # a plane of 256 read in place
    ((1, 40, 17, 17), (32, 40, 1, 1), 1, 0, 1, 1, "_fwd_gemm"),  # 289: copied by taps, so BLAS
    ((3, 8, 4, 4), (40, 4, 1, 1), 1, 0, 1, 2, "_fwd_taps"),    # 1x1 by panels over samples
    ((3, 8, 4, 4), (16, 4, 1, 1), 1, 0, 1, 2, "_fwd_taps"),    # 1x1 sample by sample
    ((2, 3, 3, 4), (4, 3, 3, 3), 1, 1, 1, 1, "_fwd_blas"),     # 12 outputs: im2col + BLAS
    ((1, 4, 5, 5), (6, 2, 3, 3), 2, 1, 2, 2, "_fwd_blas"),     # groups, dilation, stride
    ((2, 4, 8, 8), (4, 1, 3, 3), 1, 1, 1, 4, "_direct_range"),  # depthwise: by planes
    ((1, 3, 19, 21), (3, 1, 3, 3), 2, 1, 1, 3, "_direct_range"),  # stride 2, odd sizes
    ((2, 2, 9, 18), (4, 1, 5, 5), 1, 2, 1, 2, "_direct_range"),  # 5x5, two outputs a channel
    ((1, 3, 11, 20), (3, 1, 5, 5), 2, 2, 1, 3, "_direct_range"),  # 5x5 stride 2
    ((1, 2, 9, 9), (2, 1, 7, 7), 1, 3, 1, 2, "_direct_range"),  # 7x7
    ((1, 2, 10, 12), (2, 1, 7, 7), 2, 0, 1, 2, "_direct_range"),  # 7x7 stride 2, no padding
    ((1, 2, 1, 1), (2, 1, 3, 3), 1, 1, 1, 2, "_direct_range"),  # a 1x1 image: padding alone
    ((1, 3, 8, 9), (3, 1, 3, 3), 1, 2, 2, 3, "_direct_range"),  # dilated: the phase planes
    ((1, 2, 9, 9), (2, 1, 3, 3), 3, 1, 1, 2, "_direct_range"),  # stride 3: the phase planes
]


def _geometry(case):
    xs, ws, s, p, d, groups, _ = case
    return (s, s, p, p, d, d, groups)


def _arrays(case, seed=0):
    rng = np.random.default_rng(seed)
    xs, ws, s, p, d, groups, _ = case
    x = rng.normal(size=xs)
    w = rng.normal(size=ws)
    want = oracle(x, w, (s, s), (p, p), (d, d), groups)
    return x, w, want


def _compiled(fn):
    """The compiled kernel that entry ``fn`` runs (``_fwd_taps``: ``_taps_range``)."""
    return conv._taps_range if fn is conv._fwd_taps else fn


def _native(fn, x, w):
    """Whether ``fn`` holds compiled code for float64 arrays like ``x`` and ``w``."""
    fn = _compiled(fn)
    arr = numba.types.Array(numba.types.float64, 4, "C")
    return any(sig[:3] == (arr, arr, arr) for sig in fn.signatures)


@pytest.mark.parametrize("case", CASES, ids=[c[-1] + str(i) for i, c in enumerate(CASES)])
def test_each_forward_algorithm_is_picked_and_right(case):
    x, w, want = _arrays(case)
    y = np.full(want.shape, np.nan)
    kernel = getattr(conv, case[-1])
    s, p = case[2], case[3]
    assert conv._fwd_kernel(x, w, y, case[5], s, s, p, p) is kernel
    conv.conv2d_fwd(x, w, y, *_geometry(case))
    np.testing.assert_allclose(y, want, rtol=1e-11, atol=1e-11)
    assert _native(kernel, x, w)
    if kernel is not conv._direct_range:  # the host-blocked entry: a block of samples
        y2 = np.full(want.shape, np.nan)
        y2[:1] = 0
        conv._fwd_range(x, w, y2, 1, x.shape[0], *_geometry(case), *_none(x))
        np.testing.assert_allclose(y2[1:], want[1:], rtol=1e-11, atol=1e-11)
        assert np.all(y2[:1] == 0)  # samples outside the range untouched


@caller
def _fwd_compiled(x, w, y, sh, sw, pt, pl, dh, dw, groups):
    conv.conv2d_fwd(x, w, y, sh, sw, pt, pl, dh, dw, groups)


@caller
def _range_compiled(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    conv._fwd_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)


def _none(x):
    """The epilogue arguments that ask for none: an empty bias, no bounds, no residual."""
    return np.empty(0, x.dtype), -np.inf, np.inf, np.empty(0, x.dtype)


def test_compiled_callers_pick_the_same_algorithms():
    """One compiled function serves every path (the pick happens at run time there)."""
    for case in CASES:
        x, w, want = _arrays(case, seed=1)
        y = np.full(want.shape, np.nan)
        _fwd_compiled(x, w, y, *_geometry(case))
        np.testing.assert_allclose(y, want, rtol=1e-11, atol=1e-11)
        assert _native(getattr(conv, case[-1]), x, w)
    for case in (CASES[0], CASES[8], CASES[13]):  # the host-blocked entry's overload
        x, w, want = _arrays(case, seed=2)
        y = np.full(want.shape, np.nan)
        _range_compiled(x, w, y, 0, x.shape[0], *_geometry(case), *_none(x))
        np.testing.assert_allclose(y, want, rtol=1e-11, atol=1e-11)


@caller
def _runs(src, dst, s0, d0, n, z0, zn):
    copy_run(src, s0, dst, d0, n)
    zero_run(dst, z0, zn)


def test_copy_and_zero_runs():
    src = np.arange(10.0, dtype=np.float32)
    dst = np.full(12, -1.0, np.float32)
    _runs(src, dst, 2, 3, 5, 9, 2)
    want = np.full(12, -1.0, np.float32)
    want[3:8] = src[2:7]
    want[9:11] = 0
    np.testing.assert_array_equal(dst, want)
    for n in (0, -3):  # nothing copied nor zeroed
        _runs(src, dst, 0, 0, n, 0, n)
        np.testing.assert_array_equal(dst, want)


# ---- the epilogue the forward kernels apply as they store ----------------------------------------
# (image, filter, stride, pad, groups, the kernel's name, the path inside it)
EPI_CASES = [
    ((2, 16, 16, 16), (16, 1, 3, 3), 1, 1, 16, "_direct_range", "planes"),
    ((2, 24, 16, 16), (24, 1, 3, 3), 2, 1, 24, "_direct_range", "planes, stride 2"),
    ((1, 3, 7, 5), (3, 1, 3, 3), 1, 1, 3, "_direct_range", "odd plane"),
    ((1, 3, 7, 5), (3, 1, 5, 5), 2, 2, 3, "_direct_range", "5x5 stride 2"),
    ((1, 3, 9, 8), (3, 1, 2, 2), 1, 0, 3, "_direct_range", "2x2: phase planes"),
    ((2, 3, 32, 32), (16, 3, 3, 3), 2, 1, 1, "_fwd_taps", "stride 2 rows"),
    ((2, 16, 8, 8), (24, 16, 1, 1), 1, 0, 1, "_fwd_taps", "1x1 plain"),
    ((1, 3, 9, 9), (6, 3, 3, 3), 1, 1, 1, "_fwd_taps", "six rows"),
    ((2, 3, 8, 8), (2, 3, 3, 3), 1, 1, 1, "_fwd_taps", "aside"),
    ((2, 4, 8, 8), (8, 2, 3, 3), 1, 1, 2, "_fwd_taps", "groups"),
    ((2, 3, 3, 5), (5, 3, 3, 3), 1, 1, 1, "_fwd_blas", "BLAS, then a pass"),
    ((2, 32, 4, 4), (32, 32, 1, 1), 1, 0, 1, "_fwd_gemm", "1x1 by BLAS, per sample"),
    ((1, 40, 5, 5), (16, 40, 3, 3), 1, 1, 1, "_fwd_taps", "8 rows, taps in blocks"),
    ((1, 3, 23, 23), (16, 3, 3, 3), 2, 0, 1, "_fwd_taps", "11x11: the last vector aside"),
    ((2, 3, 16, 20), (14, 3, 3, 3), 1, 1, 1, "_fwd_taps", "14 rows: the last tile overlapping"),
]
# (bias?, lo, hi): relu6, a bias alone, relu without a bias, narrow bounds
EPILOGUES = [(True, 0.0, 6.0), (True, -np.inf, np.inf), (False, 0.0, np.inf),
             (True, -0.3, 0.1)]


def _fast_oracle(x, w, s, p, groups):
    """conv(x, w) in float64 by a product per filter tap (NCHW, zero padding)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - kh) // s + 1, (wd + 2 * p - kw) // s + 1
    wg = w.astype(np.float64).reshape(groups, m // groups, cg, kh, kw)
    y = np.zeros((n, groups, m // groups, oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s]
            y += np.einsum("gmc,ngchw->ngmhw", wg[:, :, :, i, j],
                           win.reshape(n, groups, cg, oh, ow))
    return y.reshape(n, m, oh, ow)


def _epi_arrays(case, seed, dtype):
    xs, ws, s, p, groups, _, _ = case
    rng = np.random.default_rng(seed)
    x = rng.normal(size=xs).astype(dtype)
    x[0, 0, 2, 3] = np.nan  # a NaN output or two: NumPy's maximum/minimum keep them
    w = rng.normal(size=ws).astype(dtype)
    want = _fast_oracle(np.nan_to_num(x), w, s, p, groups)
    return x, w, np.full(want.shape, np.nan, dtype), rng.normal(size=ws[0]).astype(dtype) * 2, \
        want


def _numpy_epilogue(y, bias, lo, hi, res=None):
    """The elementwise ops the epilogue replaces, in y's dtype as their kernel computes."""
    v = y + bias[None, :, None, None] if bias.size else y.copy()
    v = v + res if res is not None else v
    return np.minimum(np.maximum(v, y.dtype.type(lo)), y.dtype.type(hi))


def _bits(a):
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _with_epilogue_ran(fn, dtype):
    arr = numba.types.Array(numba.from_dtype(np.dtype(dtype)), 4, "C")
    return any(sig[:3] == (arr, arr, arr) and len(sig) >= 15
               for sig in _compiled(fn).signatures)


@pytest.mark.parametrize("case", EPI_CASES, ids=[c[-1] for c in EPI_CASES])
def test_the_epilogue_is_the_elementwise_ops_bit_for_bit(case, blas_same):
    """``y = minimum(maximum(conv + bias[m] (+ res), lo), hi)`` as the kernel stores (float32,
    on samples 1.. of the batch; ``res`` a residual of y's shape, for the taps and BLAS paths)
    equals the convolution (same kernel, no epilogue) followed by NumPy's float32 adds and
    clamp, bit for bit (NaNs included); the convolution against a NumPy oracle. (The taps
    kernel's wide tiles of 8 rows apply it as they store where their sums are whole and no
    residual is added, a pass over the stored outputs the rest.)"""
    xs, ws, s, p, groups, name, _ = case
    x, w, y, b, want = _epi_arrays(case, 3, np.float32)
    geo = (s, s, p, p, 1, 1, groups)
    kernel = getattr(conv, name)
    assert conv._fwd_kernel(x, w, y, groups, s, s, p, p) is kernel
    plain = y.copy()
    conv.conv2d_fwd(x, w, plain, *geo)
    nan = np.isnan(plain)
    assert nan.any() and not nan.all()
    np.testing.assert_allclose(plain[~nan], want[~nan], rtol=2e-4, atol=2e-4)
    entry = conv._direct_range if name == "_direct_range" else conv._fwd_range
    res = np.random.default_rng(4).normal(size=y.shape).astype(np.float32)
    empty = np.empty(0, np.float32)
    for with_res in (False, True) if name != "_direct_range" else (False,):
        for with_bias, lo, hi in EPILOGUES:
            bias = b if with_bias else empty
            got = y.copy()
            got[:1] = 7.0
            extra = (res.reshape(-1) if with_res else empty,) if name != "_direct_range" else ()
            entry(x, w, got, 1, x.shape[0], *geo, bias, lo, hi, *extra)
            expect = _numpy_epilogue(plain, bias, lo, hi, res if with_res else None)
            if name == "_fwd_blas":  # (the range's BLAS products: other shapes than plain's)
                blas_same(got[1:], expect[1:], msg=(with_bias, lo, hi))
            else:
                assert np.array_equal(_bits(got[1:]), _bits(expect[1:])), (with_bias, lo, hi)
            assert np.all(got[:1] == 7.0)  # samples outside the range untouched
    if name != "_fwd_blas":  # (im2col + BLAS has no epilogue of its own: a pass after it)
        assert _with_epilogue_ran(kernel, np.float32)


# (image, filter, groups, output positions per range[, (stride, padding, dilation)]) of one
# sample: 1x1 convolutions that the taps kernel computes on the image in place, then ones whose
# planes it prepares (each range the rows its positions read)
PIXEL_CASES = [
    ((1, 32, 8, 8), (16, 32, 1, 1), 1, (0, 16, 48, 64)),   # ranges of 1 and 2 vectors
    ((1, 6, 16, 16), (2, 6, 1, 1), 1, (0, 128, 256)),     # fewer than 4 rows: aside
    ((1, 8, 32, 32), (8, 8, 1, 1), 1, (0, 512, 1024)),    # rows 4 KiB apart: aside
    ((1, 8, 4, 8), (12, 4, 1, 1), 2, (0, 16, 32)),        # two groups
    ((1, 20, 4, 12), (9, 20, 1, 1), 1, (0, 32, 48)),      # 6-row tiles, the last overlapping
    ((1, 4, 15, 13), (8, 4, 3, 3), 1, (0, 16, 32, 56), (2, 1, 1)),  # stride 2, 7 columns
    ((1, 3, 9, 9), (6, 3, 3, 3), 1, (0, 16, 48, 81), (1, 1, 1)),    # ranges within rows
    ((1, 3, 20, 20), (8, 3, 7, 7), 1, (0, 32, 64, 100), (2, 3, 1)),  # a stem's 7x7 stride 2
    ((1, 2, 12, 12), (4, 2, 3, 3), 1, (0, 64, 144), (1, 2, 2)),     # dilated
    ((1, 3, 12, 32), (8, 3, 3, 3), 1, (0, 16, 64, 96), (2, 1, 1)),  # stride 2 by row halves
    ((1, 8, 9, 9), (8, 4, 3, 3), 2, (0, 32, 81), (1, 1, 1)),        # two groups, 3x3
]


@pytest.mark.parametrize("case", PIXEL_CASES, ids=[str(c[3:]) for c in PIXEL_CASES])
def test_ranges_of_output_positions_give_the_whole_calls_bits(case):
    """The taps kernel split by ranges of output positions (``_taps_by_pixels``, the parallel
    loop of a one-sample convolution) computes each range as the whole call does, preparing
    only the rows of its planes the range reads: the same bits with a bias, a clamp and a
    residual, and each output against a NumPy oracle (float32: the parallel loop compiled for
    the type the models use, ~6 s of CPU for each type)."""
    xs, ws, groups, bounds = case[:4]
    s, pad, d = case[4] if len(case) > 4 else (1, 0, 1)
    dtype = np.float32
    rng = np.random.default_rng(11)
    x, w = rng.normal(size=xs).astype(dtype), rng.normal(size=ws).astype(dtype)
    bias = rng.normal(size=ws[0]).astype(dtype)
    geo = (s, s, pad, pad, d, d, groups)
    want = oracle(x.astype(np.float64), w.astype(np.float64), (s, s), (pad, pad), (d, d),
                  groups)
    assert bounds[-1] == want.shape[2] * want.shape[3]
    assert conv._fwd_kernel(x, w, np.empty(want.shape, dtype), groups, s, s, pad, pad) is \
        conv._fwd_taps
    res = rng.normal(size=want.shape).astype(dtype)
    other = rng.normal(size=xs).astype(dtype)

    def by_ranges(out, ranges, epilogue):
        # (the buffers a range's call allocates may be those the call before freed: that one
        # prepared the planes of another image, so rows a range reads but did not prepare
        # would hold wrong values, not the right ones by chance)
        conv._fwd_taps(other, w, np.empty_like(out), 0, 1, *geo, *epilogue)
        conv._taps_by_pixels(x, w, out, np.array(ranges, np.int64), *geo, *epilogue)

    for epilogue in ((bias, 0.0, 6.0, res.reshape(-1)),
                     (bias[:0], -np.inf, np.inf, res.reshape(-1)[:0])):
        whole, parts = np.full(want.shape, np.nan, dtype), np.full(want.shape, np.nan, dtype)
        conv._fwd_taps(x, w, whole, 0, 1, *geo, *epilogue)
        by_ranges(parts, bounds, epilogue)
        assert np.array_equal(_bits(parts), _bits(whole))
        for inner in (bounds[1:], bounds[:-1]):  # positions outside the ranges untouched
            some = np.full(want.shape, np.nan, dtype)
            by_ranges(some, inner, epilogue)
            flat, wf = some.reshape(ws[0], -1), whole.reshape(ws[0], -1)
            assert np.isnan(flat[:, :inner[0]]).all() and np.isnan(flat[:, inner[-1]:]).all()
            assert np.array_equal(_bits(flat[:, inner[0]:inner[-1]]),
                                  _bits(wf[:, inner[0]:inner[-1]]))
        expect = want + (epilogue[0][None, :, None, None] + res if epilogue[0].size else 0)
        np.testing.assert_allclose(parts, np.clip(expect, epilogue[1], epilogue[2]),
                                   rtol=1e-4, atol=1e-4)
