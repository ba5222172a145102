"""The paths the pooling entry points pick (``pdjit.codegen.cpu.lib.pool``): an average over
whole planes runs ``_mean_planes``, 2x2 max windows of stride 2 inside the image ``_max22``,
3x3 max windows at stride 1 or 2 ``_max33``, every other pool ``_fwd_planes``;
``pool2d_bwd`` writes a global average's gradient at once and spreads any other window's.
Against NumPy written here, through the kernels' host and native (compiled caller) entries and
the compiled executor (strict: native code), gradients against finite differences."""
import numba
import numpy as np
import pytest

from pdjit.codegen.cpu import lib as nnlib
from pdjit.codegen.cpu.lib import pool as pk
from pdjit.codegen.cpu.lib._jit import caller
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import check_output

RNG = np.random.default_rng(5)


def np_windows(size, osize, k, s, p, adaptive):
    """Per output index: (first, end) read and the window's length before clipping."""
    out = []
    for o in range(osize):
        if adaptive:
            lo, hi = o * size // osize, -(-(o + 1) * size // osize)
            out.append((lo, hi, hi - lo))
        else:
            lo = o * s - p
            hi = min(lo + k, size + p)
            out.append((max(lo, 0), min(hi, size), hi - lo))
    return out


def np_pool(x, oshape, k, s, p, is_max, exclusive, adaptive):
    n, c, h, w = x.shape
    y = np.zeros((n, c) + oshape)
    for i, (h0, h1, hl) in enumerate(np_windows(h, oshape[0], k, s, p, adaptive)):
        for j, (w0, w1, wl) in enumerate(np_windows(w, oshape[1], k, s, p, adaptive)):
            win = x[:, :, h0:h1, w0:w1].astype(np.float64)
            if is_max:
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = (h1 - h0) * (w1 - w0) if exclusive or adaptive else hl * wl
                y[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return y


def np_pool_bwd(x, y, dy, k, s, p, is_max, exclusive, adaptive):
    """Each dy element to its window's first maximum (row-major), or spread over the window."""
    n, c, h, w = x.shape
    dx = np.zeros(x.shape)
    for i, (h0, h1, hl) in enumerate(np_windows(h, y.shape[2], k, s, p, adaptive)):
        for j, (w0, w1, wl) in enumerate(np_windows(w, y.shape[3], k, s, p, adaptive)):
            for b in range(n):
                for ch in range(c):
                    g = float(dy[b, ch, i, j])
                    if is_max:
                        win = x[b, ch, h0:h1, w0:w1]
                        a = np.flatnonzero(win == y[b, ch, i, j])[0]
                        dx[b, ch, h0 + a // (w1 - w0), w0 + a % (w1 - w0)] += g
                    else:
                        cnt = (h1 - h0) * (w1 - w0) if exclusive or adaptive else hl * wl
                        dx[b, ch, h0:h1, w0:w1] += g / cnt
    return dx


@caller
def _native_fwd(x, y, k, s, p, is_max, exclusive, adaptive):
    nnlib.pool2d_fwd(x, y, k, k, s, s, p, p, is_max, exclusive, adaptive)


@caller
def _native_bwd(x, y, dy, dx, k, s, p, is_max, exclusive, adaptive):
    nnlib.pool2d_bwd(x, y, dy, dx, k, k, s, s, p, p, is_max, exclusive, adaptive)


# (x shape, out shape, k, s, p, is_max, exclusive, adaptive, the forward kernel)
CASES = [
    ((2, 3, 5, 6), (1, 1), 1, 1, 0, False, True, True, "_mean_planes"),     # adaptive 1x1
    ((2, 3, 5, 5), (1, 1), 5, 1, 0, False, False, False, "_mean_planes"),   # global average
    ((2, 3, 5, 5), (1, 1), 5, 1, 0, True, True, False, "_fwd_planes"),      # global max
    ((2, 3, 3, 3), (1, 1), 3, 1, 1, False, False, False, "_avg33"),         # padded: not whole
    ((2, 3, 7, 9), (3, 4), 2, 2, 0, True, True, False, "_max22"),           # 2x2 max
    ((2, 3, 7, 7), (4, 4), 3, 2, 1, False, False, False, "_avg33"),         # 3x3/s2 padded avg
    ((2, 3, 7, 7), (4, 4), 3, 2, 1, True, True, False, "_max33"),          # 3x3/s2 padded max
    ((2, 3, 5, 5), (3, 3), 2, 2, 0, True, True, False, "_fwd_planes"),     # 2x2, a partial window
    ((2, 3, 7, 5), (3, 2), 1, 1, 0, False, True, True, "_fwd_planes"),     # adaptive 3x2
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[-1]}-{i}" for i, c in enumerate(CASES)])
def test_entries_pick_the_kernel_and_match_numpy(monkeypatch, case):
    xshape, oshape, k, s, p, is_max, exclusive, adaptive, kernel = case
    # distinct values: one maximum per window
    x = (RNG.permutation(int(np.prod(xshape))).reshape(xshape) / 7.0).astype(np.float32)
    ran = []
    split_work = pk.split_work

    def spy(fn, *args, **kw):
        ran.append(fn.py_func.__name__)
        return split_work(fn, *args, **kw)
    monkeypatch.setattr(pk, "split_work", spy)
    y = np.empty(xshape[:2] + oshape, np.float32)
    nnlib.pool2d_fwd(x, y, k, k, s, s, p, p, is_max, exclusive, adaptive)
    assert ran == [kernel]
    want = np_pool(x, oshape, k, s, p, is_max, exclusive, adaptive)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    yn = np.empty_like(y)
    _native_fwd(x, yn, k, s, p, is_max, exclusive, adaptive)
    np.testing.assert_array_equal(yn, y)  # the native entry: the same kernel, the same values
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    dx = np.full(xshape, np.nan, np.float32)  # overwritten, not added to
    nnlib.pool2d_bwd(x, y, dy, dx, k, k, s, s, p, p, is_max, exclusive, adaptive)
    np.testing.assert_allclose(dx, np_pool_bwd(x, y, dy, k, s, p, is_max, exclusive, adaptive),
                               rtol=1e-6, atol=1e-6)
    dxn = np.full(xshape, np.nan, np.float32)
    _native_bwd(x, y, dy, dxn, k, s, p, is_max, exclusive, adaptive)
    np.testing.assert_array_equal(dxn, dx)


def test_misfits_are_refused():
    x = np.zeros((2, 3, 4, 4), np.float32)
    with pytest.raises(ValueError, match="pooling operands do not fit"):
        nnlib.pool2d_fwd(x, np.empty((2, 4, 1, 1), np.float32), 4, 4, 1, 1, 0, 0, False, True,
                         False)
    with pytest.raises(ValueError, match="pooling operands do not fit"):
        nnlib.pool2d_bwd(x, np.zeros((2, 3, 1, 1), np.float32), np.zeros((2, 3, 2, 1),
                         np.float32), np.empty_like(x), 4, 4, 1, 1, 0, 0, False, True, False)
    with pytest.raises(ValueError, match="pooling operands do not fit"):  # the kernel itself
        pk._mean_planes(x, np.empty((2, 2, 1, 1), np.float32), 0, 6)


@pytest.mark.parametrize("attrs", [dict(global_pooling=True, ksize=[1, 1]),
                                   dict(adaptive=True, ksize=[1, 1]),
                                   dict(ksize=[4, 5], exclusive=False)])
def test_global_average_pool_in_the_executor(attrs):
    """The op and its gradient through the compiled executor (native code asserted) and
    finite differences: the paths of a ResNet's last pool."""
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    check_output("pool2d", {"X": x}, dict(attrs, pooling_type="avg"),
                 {"Out": want.astype(np.float32)})
    check_grad("pool2d", {"X": x}, dict(attrs, pooling_type="avg"), ["X"])


@caller
def _native_mean(x, y):
    nnlib.pool2d_mean(x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_average_entries_match_numpy(dtype):
    """``pool2d_mean`` / ``pool2d_mean_bwd`` (what a global average pool's lowering calls),
    through the host entry and a compiled caller, against NumPy's means; the gradient fills
    each plane with its dy over the plane's size, overwriting dx."""
    x = RNG.standard_normal((3, 5, 7, 6)).astype(dtype)
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    y = np.full((3, 5, 1, 1), np.nan, dtype)
    nnlib.pool2d_mean(x, y)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    yn = np.full_like(y, np.nan)
    _native_mean(x, yn)
    np.testing.assert_array_equal(yn, y)
    dy = RNG.standard_normal(y.shape).astype(dtype)
    dx = np.full(x.shape, np.nan, dtype)
    nnlib.pool2d_mean_bwd(dy, dx)
    np.testing.assert_allclose(dx, np.broadcast_to(dy.astype(np.float64) / 42, x.shape),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="pooling operands do not fit"):
        nnlib.pool2d_mean(x, np.empty((3, 4, 1, 1), dtype))
    with pytest.raises(ValueError, match="pooling operands do not fit"):
        nnlib.pool2d_mean(x, np.empty((3, 5, 2, 1), dtype))
    with pytest.raises(ValueError, match="pooling operands do not fit"):
        nnlib.pool2d_mean_bwd(np.zeros((3, 5, 2, 1), dtype), dx)


# (x shape, k, s, p, ceil mode): 3x3 max pools of the plane kernel; odd sizes, a plane of one
# pixel (only padding around it), more than one vector of outputs a row, partial last windows
PLANE_CASES = [((2, 3, 112, 112), 3, 2, 1, False), ((1, 2, 7, 9), 3, 1, 1, False),
               ((2, 2, 13, 21), 3, 2, 1, True), ((1, 3, 5, 5), 3, 2, 0, True),
               ((2, 2, 1, 1), 3, 1, 1, False), ((1, 2, 35, 40), 3, 2, 0, False),
               ((1, 1, 40, 37), 3, 1, 0, False)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", PLANE_CASES, ids=[str(c[0]) for c in PLANE_CASES])
def test_3x3_max_pools_by_planes_match_numpy(case, dtype):
    """The 3x3 max pools at stride 1 and 2 (``tile.pool_plane_kernel`` inside ``_max33``)
    against NumPy's max over each window's part inside the image, bit for bit, through the
    host and the native entries: a NaN in a window makes its max NaN."""
    xshape, k, s, p, ceil = case
    n, c, h, w = xshape
    oh = (h + 2 * p - k + (s - 1 if ceil else 0)) // s + 1
    ow = (w + 2 * p - k + (s - 1 if ceil else 0)) // s + 1
    x = RNG.standard_normal(xshape).astype(dtype)
    x[0, 0, min(2, h - 1), min(3, w - 1)] = np.nan
    want = np.empty((n, c, oh, ow), dtype)
    for i in range(oh):
        for j in range(ow):
            win = x[:, :, max(i * s - p, 0):i * s - p + k, max(j * s - p, 0):j * s - p + k]
            want[:, :, i, j] = win.max(axis=(2, 3))
    y = np.full((n, c, oh, ow), 7.0, dtype)
    nnlib.pool2d_fwd(x, y, k, k, s, s, p, p, True, True, False)
    np.testing.assert_array_equal(y, want)
    yn = np.full_like(y, 7.0)
    _native_fwd(x, yn, k, s, p, True, True, False)
    np.testing.assert_array_equal(yn, want)
    assert any(sig[0].dtype == numba.from_dtype(np.dtype(dtype))  # compiled, not interpreted
               for sig in pk._max33.signatures)


@caller
def _native_max(x, y22, y33, sh, pt, pl):
    nnlib.pool2d_max22(x, y22)
    nnlib.pool2d_max33(x, y33, sh, pt, pl)


def test_the_max_pool_entries_of_fixed_windows_match_numpy():
    """``pool2d_max22`` and ``pool2d_max33`` (what the lowering calls for those windows), from
    the host and from compiled code, against NumPy's max over each window's part inside the
    image; a size that leaves a partial 2x2 window (ceil mode) takes the general kernel and
    still matches."""
    for h, w in ((6, 8), (5, 7)):
        x = RNG.standard_normal((2, 3, h, w)).astype(np.float32)
        oh, ow = -(-(h - 2) // 2) + 1, -(-(w - 2) // 2) + 1  # ceil mode: partial windows
        full = 2 * oh <= h
        y22 = np.full((2, 3, oh, ow), 7.0, np.float32)
        want22 = np.empty_like(y22)
        for i in range(oh):
            for j in range(ow):
                want22[:, :, i, j] = x[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2].max(axis=(2, 3))
        sh, pt, pl = (2, 1, 0) if full else (1, 1, 1)
        oh3, ow3 = (h + 2 * pt - 3) // sh + 1, (w + 2 * pl - 3) // sh + 1
        want33 = np.empty((2, 3, oh3, ow3), np.float32)
        for i in range(oh3):
            for j in range(ow3):
                want33[:, :, i, j] = x[:, :, max(i * sh - pt, 0):i * sh - pt + 3,
                                       max(j * sh - pl, 0):j * sh - pl + 3].max(axis=(2, 3))
        y33 = np.full_like(want33, 7.0)
        nnlib.pool2d_max22(x, y22)
        nnlib.pool2d_max33(x, y33, sh, pt, pl)
        np.testing.assert_array_equal(y22, want22)
        np.testing.assert_array_equal(y33, want33)
        n22, n33 = np.full_like(y22, 7.0), np.full_like(y33, 7.0)
        _native_max(x, n22, n33, sh, pt, pl)
        np.testing.assert_array_equal(n22, want22)
        np.testing.assert_array_equal(n33, want33)


# (x shape): 2x2 max pools of stride 2 by vectors (``tile.max22_plane`` inside ``_max22``):
# rows of fewer outputs than a vector, of more (a masked last vector), of whole vectors, an
# odd last row and column that no window reads
MAX22_CASES = [(2, 3, 8, 8), (1, 2, 24, 24), (2, 1, 9, 71), (1, 2, 6, 64), (2, 1, 2, 2),
               (3, 2, 5, 35)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xshape", MAX22_CASES, ids=[str(c) for c in MAX22_CASES])
def test_2x2_max_pools_by_vectors_match_numpy(xshape, dtype):
    """Against a max over each window taken in the kernel's order (each column's two rows,
    then the two columns; NumPy's ``maximum`` semantics): bit for bit, through the host and
    the native entries; a NaN in a window makes its max NaN, a window of ``-0.0`` and ``0.0``
    keeps the one it takes first, ``-inf`` stays."""
    n, c, h, w = xshape
    oh, ow = h // 2, w // 2
    x = RNG.standard_normal(xshape).astype(dtype)
    x[-1, -1, h - 1, w - 1] = np.nan  # outside every window where h or w is odd
    x[0, 0, 0, 1] = np.nan
    x[-1, -1, :2, :2] = [[-0.0, 0.0], [0.0, -0.0]]
    if oh * ow > 1:
        x[-1, -1, 2 * oh - 2:2 * oh, 2 * ow - 2:2 * ow] = -np.inf

    def first_max(a, b):  # b replaces a where larger or NaN, unless a is NaN
        return np.where(np.isnan(a) | ~((b > a) | np.isnan(b)), a, b)

    cols = first_max(x[:, :, 0:2 * oh:2, :2 * ow], x[:, :, 1:2 * oh:2, :2 * ow])
    want = first_max(cols[..., 0::2], cols[..., 1::2])
    assert np.isnan(want[0, 0, 0, 0]) and np.signbit(want[-1, -1, 0, 0])
    y = np.full((n, c, oh, ow), 7.0, dtype)
    nnlib.pool2d_max22(x, y)
    np.testing.assert_array_equal(y, want)
    assert np.array_equal(np.signbit(y), np.signbit(want))
    yn = np.full_like(y, 7.0)
    _native_max(x, yn, np.empty((n, c, 0, 0), dtype), 1, 0, 0)
    np.testing.assert_array_equal(yn, want)
    assert any(sig[0].dtype == numba.from_dtype(np.dtype(dtype))  # compiled, not interpreted
               for sig in pk._max22.signatures)


def test_pools_of_one_sample_by_planes_on_the_team(monkeypatch):
    """A pool from ``conv._TEAM_MIN_WORK`` runs by ranges of planes on a parallel loop
    (``pool._planes_by_team``) where two threads are free: ResNet-50's stem pool (3x3 stride
    2, padded), a 2x2 max and a 2x2 average pool of odd planes, Inception-v3's max pool
    (above ``split_work``'s threshold: its helpers would refuse a host driver's recording)
    and its branch pools (3x3 averages, not exclusive, at stride 1; exclusive at stride 2);
    each is one thread's result bit for bit and NumPy's."""
    from pdjit.codegen.cpu.lib import conv, team

    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    ran = []
    real = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: ran.append(call[-1]) or
                        real(loop, call))
    cases = [((1, 64, 112, 112), 3, 2, 1, True, True), ((1, 128, 57, 57), 2, 2, 0, True, True),
             ((1, 128, 57, 57), 2, 2, 0, False, True), ((1, 64, 147, 147), 3, 2, 0, True, True),
             ((1, 288, 35, 35), 3, 1, 1, False, False), ((1, 96, 35, 35), 3, 2, 1, False, True)]
    assert 64 * 73 * 73 * 9 >= conv._PARALLEL_MIN_WORK
    for xshape, k, s, p, is_max, exclusive in cases:
        x = RNG.standard_normal(xshape).astype(np.float32)
        oh = (xshape[2] + 2 * p - k) // s + 1
        want = np_pool(x, (oh, oh), k, s, p, is_max, exclusive, False)
        got = {}
        for threads in (2, 1):
            monkeypatch.setattr(conv, "loop_threads", lambda threads=threads: threads)
            ran.clear()
            y = np.full((1, xshape[1], oh, oh), 7.0, np.float32)
            nnlib.pool2d_fwd(x, y, k, k, s, s, p, p, is_max, exclusive, False)
            assert ran == ([2] if threads == 2 else [])
            got[threads] = y
        assert np.array_equal(got[2], got[1])
        np.testing.assert_allclose(got[2], want, rtol=1e-6, atol=1e-6)


@caller
def _native_nhwc(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive):
    nnlib.pool2d_nhwc(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive)


# (x shape NCHW, k, s, p, is_max, exclusive, ceil): channels that fill no vector, odd planes,
# padding, partial windows (ceil mode), strides 1, 2 and 3, 2x2 and 5x5 windows
NHWC_CASES = [((2, 5, 9, 11), 3, 2, 1, True, True, False),
              ((1, 37, 8, 8), 3, 1, 1, False, False, False),
              ((1, 37, 8, 8), 3, 1, 1, False, True, False),
              ((2, 16, 7, 7), 2, 2, 0, True, True, True),
              ((1, 20, 13, 12), 3, 2, 0, False, True, True),
              ((1, 3, 10, 10), 5, 3, 2, False, False, False),
              ((3, 64, 6, 5), 2, 2, 0, False, True, False)]


@pytest.mark.parametrize("case", NHWC_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pools_of_channels_last_images_match_numpy(case, dtype):
    """``pool2d_nhwc`` (a pool inside a chain of channels-last convolutions) against the NumPy
    oracle on the NCHW image: max and average (exclusive or not), through its host and native
    entries; a NaN in a window makes its max NaN; a misfit is refused."""
    xshape, k, s, p, is_max, exclusive, ceil = case
    x = RNG.standard_normal(xshape).astype(dtype)
    if is_max:
        x[0, 1, 2, 3] = np.nan
    oh, ow = ((d + 2 * p - k + (s - 1 if ceil else 0)) // s + 1 for d in xshape[2:])
    want = np_pool(x, (oh, ow), k, s, p, is_max, exclusive, False)
    xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    for entry in (nnlib.pool2d_nhwc, _native_nhwc):
        y = np.full((xshape[0], oh, ow, xshape[1]), 7.0, dtype)
        entry(xl, y, k, k, s, s, p, p, is_max, exclusive)
        np.testing.assert_allclose(y.transpose(0, 3, 1, 2), want, rtol=1e-6, atol=1e-6)
    if is_max:
        assert np.isnan(want[0, 1]).any() and \
            np.array_equal(np.isnan(y.transpose(0, 3, 1, 2)), np.isnan(want))
    assert any(sig[0].dtype == numba.from_dtype(np.dtype(dtype))
               for sig in pk._nhwc_rows.signatures)
    with pytest.raises(ValueError, match="do not fit"):
        nnlib.pool2d_nhwc(xl, np.empty((xshape[0], oh, ow, xshape[1] + 1), dtype), k, k, s, s,
                          p, p, is_max, exclusive)


def test_channels_last_pools_of_one_sample_on_the_team(monkeypatch):
    """A channels-last pool from ``conv._TEAM_MIN_WORK`` runs by ranges of output rows on a
    parallel loop where two threads are free (Inception-v3's 3x3 pools): one thread's bits."""
    from pdjit.codegen.cpu.lib import conv, team

    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    ran = []
    real = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: ran.append(loop) or real(loop, call))
    for xshape, k, s, p, is_max, exclusive in [((1, 288, 35, 35), 3, 1, 1, False, False),
                                               ((1, 192, 71, 71), 3, 2, 0, True, True)]:
        x = RNG.standard_normal(xshape).astype(np.float32)
        xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        oh = (xshape[2] + 2 * p - k) // s + 1
        got = {}
        for threads in (2, 1):
            monkeypatch.setattr(conv, "loop_threads", lambda threads=threads: threads)
            ran.clear()
            y = np.full((1, oh, oh, xshape[1]), 7.0, np.float32)
            nnlib.pool2d_nhwc(xl, y, k, k, s, s, p, p, is_max, exclusive)
            assert ran == ([pk._nhwc_by_team] if threads == 2 else [])
            got[threads] = y
        assert np.array_equal(got[2], got[1])
        np.testing.assert_allclose(got[2].transpose(0, 3, 1, 2),
                                   np_pool(x, (oh, oh), k, s, p, is_max, exclusive, False),
                                   rtol=1e-6, atol=1e-6)
