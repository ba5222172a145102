"""Pooling kernels (NCHW): max and average pooling over 2-D windows, their gradients, and max
pooling that records where each maximum came from.

The window of output ``(oh, ow)`` along one axis (PaddlePaddle's rule, see ``pdjit.ops.pool``):

- adaptive: ``[floor(oh * H / OH), ceil((oh + 1) * H / OH))``;
- otherwise it starts at ``oh * stride - pad_before`` and ends ``k`` later, but not past
  ``H + pad_before``; the part inside the image is read. An average divides by the number of
  elements read (``exclusive`` or adaptive) or by the window's length before that clipping.

The first maximum of a window wins (its position is the ``mask``; its input gets the gradient);
a NaN in a window makes its max NaN, as NumPy's ``max`` does.
The windows of each axis are worked out once per call; the planes (sample, channel) of a large
input are split over threads.
"""
import numba
import numpy as np
from numba.extending import overload, register_jitable

from pdjit.codegen.cpu import replay
from pdjit.codegen.cpu.lib import conv as _conv
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import by_address, compile_cost, jit, jit_sum, jobs, pjit
from pdjit.codegen.cpu.lib.conv import _cols, _plain, split_work
from pdjit.codegen.cpu.lib.tile import avg22_plane, max22_plane, pool_plane_kernel

__all__ = ["pool2d_fwd", "pool2d_max22", "pool2d_avg22", "pool2d_max33", "pool2d_avg33",
           "pool2d_bwd",
           "pool2d_mean",
           "pool2d_mean_nhwc", "pool2d_nhwc",
           "pool2d_mean_bwd", "max_pool2d_index_fwd", "max_pool2d_index_bwd"]

U = numba.uint64


@register_jitable
def _span(o, size, osize, k, s, p, adaptive):
    """Window ``o`` along one axis: ``(first, end)`` read and the window's length for a
    non-exclusive average."""
    if adaptive:
        lo = (o * size) // osize
        hi = -((-(o + 1) * size) // osize)
        return lo, hi, hi - lo
    lo = o * s - p
    hi = lo + k
    if hi > size + p:
        hi = size + p
    return (lo if lo > 0 else 0), (hi if hi < size else size), hi - lo


_pool33, _pool33s2 = pool_plane_kernel(3, 1), pool_plane_kernel(3, 2)
_mean33, _mean33s2 = pool_plane_kernel(3, 1, mean=True), pool_plane_kernel(3, 2, mean=True)


@register_jitable
def _path(x, y, kh, kw, sh, sw, pt, pl, is_max, adaptive) -> int:
    """The kernel that computes a pool: 1, :func:`_max22` (2x2 max windows of stride 2 that
    all lie inside the image: no padding, no partial window; LeNet's, VGG's) or, averages,
    :func:`_avg22` (DenseNet's transitions); 2, :func:`_max33` (3x3 max windows at stride 1
    or 2, padded or not: ResNet's, GoogLeNet's, ShuffleNet's) or, averages, 3,
    :func:`_avg33` (Inception's branches); 0, :func:`_fwd_planes` (any other). (The entry
    points send an average over whole planes to :func:`_mean_planes`.)"""
    if adaptive:
        return 0
    if kh == 2 and kw == 2 and sh == 2 and sw == 2 and pt == 0 and pl == 0 and \
            2 * y.shape[2] <= x.shape[2] and 2 * y.shape[3] <= x.shape[3]:
        return 1
    if kh == 3 and kw == 3 and sh == sw and (sh == 1 or sh == 2) and pt >= 0 and pl >= 0:
        return 2 if is_max else 3
    return 0


@jit
def _max33(x, y, q0, q1, sh, pt, pl):
    """The planes ``q0..q1`` of ``y`` = the max pool of ``x``'s 3x3 windows at stride ``sh`` (1
    or 2; :func:`_path` 2): a plane at a time by vectors of outputs (a plane kernel of
    ``tile.pool_plane_kernel``; ResNet-50's [1, 64, 112, 112] pool, one thread: 1.45 ms by
    :func:`_fwd_planes`'s passes, 0.24 ms)."""
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for q in range(q0, q1):
        if sh == 1:
            _pool33(xf, q * h_ * w_, h_, w_, yf, q * oh_ * ow_, oh_, ow_, pt, pl)
        else:
            _pool33s2(xf, q * h_ * w_, h_, w_, yf, q * oh_ * ow_, oh_, ow_, pt, pl)


@jit
def _avg33(x, y, q0, q1, sh, pt, pl, exclusive):
    """:func:`_max33`'s average (:func:`_path` 3): each window's inputs inside the image summed
    in float32 and divided by their count (``exclusive``) or the window's length
    (``tile.pool_plane_kernel``'s ``mean``). Inception-v3's [1, 288, 35, 35] branch pool
    (stride 1, padded by 1), one thread: 1.26 ms by :func:`_fwd_planes`'s passes in float64,
    0.15 ms; [16, 256, 35, 35] 18.0 / 2.5 ms."""
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for q in range(q0, q1):
        if sh == 1:
            _mean33(xf, q * h_ * w_, h_, w_, yf, q * oh_ * ow_, oh_, ow_, pt, pl, exclusive)
        else:
            _mean33s2(xf, q * h_ * w_, h_, w_, yf, q * oh_ * ow_, oh_, ow_, pt, pl, exclusive)


@by_address
@jit
def _fwd_planes(x, y, q0, q1, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """The planes ``q0..q1`` (sample, channel) of ``y`` = the pool of ``x``'s, any windows, by
    passes over output rows (the entry points send the windows :func:`_path` names to their
    own kernels, and an average over whole planes to :func:`_mean_planes`: each a kernel of
    its own, so that a program compiles only the ones its pools take)."""
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    # per output row and column: the first and end input read, the window's length; then
    # per window column j the output columns lo..hi whose input column lies in the image
    sp = np.empty(3 * (oh_ + ow_) + 2 * kw, np.int64)
    ha, hb, hl = sp[:oh_], sp[oh_:2 * oh_], sp[2 * oh_:3 * oh_]
    wa, wb, wl = sp[3 * oh_:3 * oh_ + ow_], sp[3 * oh_ + ow_:3 * oh_ + 2 * ow_], \
        sp[3 * oh_ + 2 * ow_:3 * (oh_ + ow_)]
    los, his = sp[3 * (oh_ + ow_):3 * (oh_ + ow_) + kw], sp[3 * (oh_ + ow_) + kw:]
    for o in range(oh_):
        ha[o], hb[o], hl[o] = _span(o, h_, oh_, kh, sh, pt, adaptive)
    for o in range(ow_):
        wa[o], wb[o], wl[o] = _span(o, w_, ow_, kw, sw, pl, adaptive)
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    acc = np.empty(ow_, np.float64)
    if not adaptive:
        for j in range(kw):
            los[j], his[j] = _cols(ow_, w_, sw, j - pl)
    for q in range(q0, q1):
        xb = q * h_ * w_
        yb = q * oh_ * ow_
        for oh in range(oh_):
            for ow in range(ow_):
                acc[ow] = -np.inf if is_max else 0.0
            for h in range(ha[oh], hb[oh]):
                row = U(xb + h * w_)
                if adaptive:  # windows of their own sizes: element by element
                    for ow in range(ow_):
                        for w in range(U(wa[ow]), U(wb[ow])):
                            v = xf[row + w]
                            if is_max:
                                acc[ow] = v if v > acc[ow] or v != v else acc[ow]
                            else:
                                acc[ow] += v
                    continue
                # one window column at a time, over the whole output row: long, branch-free
                # inner loops (a window's own loops are too short to run fast)
                for j in range(kw):
                    lo, hi = los[j], his[j]
                    start = row + U(lo * sw + j - pl)
                    if is_max:
                        for k in range(U(hi - lo)):
                            v = xf[start + k * U(sw)]
                            a = acc[U(lo) + k]
                            acc[U(lo) + k] = v if v > a or v != v else a
                    else:
                        for k in range(U(hi - lo)):
                            acc[U(lo) + k] += xf[start + k * U(sw)]
            for ow in range(ow_):
                v = acc[ow]
                if not is_max:
                    if exclusive or adaptive:
                        v = v / ((hb[oh] - ha[oh]) * (wb[ow] - wa[ow]))
                    else:
                        v = v / (hl[oh] * wl[ow])
                yf[U(yb + oh * ow_ + ow)] = v


# ---- the common windows, without the general kernel's per-row passes --------------------------
# Measured at batch 64, one thread (float32, ms, general passes / these): LeNet's 2x2 max pools
# [64, 6, 24, 24] 0.151 / 0.032, [64, 16, 8, 8] 0.082 / 0.022, [64, 6, 28, 28] 0.199 / 0.055;
# a global average of [64, 32, 8, 8] 0.43 / 0.038. (Each output row's four-input windows read
# one by one ran 0.091 for the first: rows of 12 outputs are too short for a vector loop.)
# Each is a kernel of its own that the entry points pick, and the lowerings call the entry of
# the kernel the op's attributes take (pool2d_max22, pool2d_max33, pool2d_mean), so a plan's
# compile jobs name that kernel alone: measured cold, float32, CPU, one process, the kernel
# holding the 2x2, the 3x3 and the general paths 1.2 s, the 2x2 one alone 0.43 s, the 3x3 one
# alone 0.21 s.


@register_jitable
def _is_whole(h_, w_, oh_, ow_, kh, kw, pt, pl, adaptive) -> bool:
    """One window over the whole plane (a global pool)."""
    return oh_ == 1 and ow_ == 1 and (adaptive or (kh == h_ and kw == w_ and pt == 0 and
                                                   pl == 0))


@jit
def _max22(x, y, q0, q1):
    """The max pool of 2x2 windows of stride 2 inside the image, plane by plane
    (:func:`tile.max22_plane`: vectors of outputs). A NaN propagates (NumPy's ``max``), as in
    the general passes (the same values)."""
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for q in range(q0, q1):
        max22_plane(xf, q * h_ * w_, w_, yf, q * oh_ * ow_, oh_, ow_)


@jit
def _avg22(x, y, q0, q1):
    """:func:`_max22`'s average (:func:`tile.avg22_plane`; every window whole: exclusive or
    not, a quarter of its sum). DenseNet's [1, 128, 56, 56], one thread: 0.355 ms by the
    general passes, 0.03 ms."""
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for q in range(q0, q1):
        avg22_plane(xf, q * h_ * w_, w_, yf, q * oh_ * ow_, oh_, ow_)


@jit_sum
def _mean_planes(x, y, q0, q1):
    """The mean of each whole plane ``q0..q1`` (``y`` holds one value per plane), summed in
    float64 in vector lanes (MobileNet's [64, 32, 8, 8] at batch 64: 13.6 us; 38 us with four
    scalar chains of additions)."""
    if y.size != x.shape[0] * x.shape[1] or q0 < 0 or q1 > y.size:
        raise ValueError(_MISFIT)
    p_ = x.shape[2] * x.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for q in range(q0, q1):
        b = U(q * p_)
        s = 0.0
        for k in range(U(p_)):
            s += xf[b + k]
        yf[q] = s / p_


_MISFIT = "pdjit: pooling operands do not fit each other"


def pool2d_fwd(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """``y`` = the max (``is_max``) or average pool of ``x``. The path is picked here, so a
    program compiles only the kernels its pools take: :func:`_mean_planes` for an average over
    whole planes (a ResNet's global pool), else :func:`_fwd_planes`."""
    if x.shape[:2] != y.shape[:2]:
        raise ValueError(_MISFIT)
    planes = x.shape[0] * x.shape[1]
    if not is_max and _is_whole(x.shape[2], x.shape[3], y.shape[2], y.shape[3], kh, kw, pt, pl,
                                adaptive):
        split_work(_mean_planes, planes, x.size, x, y)
        return
    # (about a multiply-add per window element: the threshold of split_work)
    path = _path(x, y, kh, kw, sh, sw, pt, pl, is_max, adaptive)
    if path == 1:
        if not _by_team(_planes_by_team, y.size * 4, (x, y, path, 2, 0, 0, is_max, True), planes):
            split_work(_max22 if is_max else _avg22, planes, y.size * 4, x, y)
    elif path == 2:
        if not _by_team(_planes_by_team, y.size * 9, (x, y, path, sh, pt, pl, True, True),
                        planes):
            split_work(_max33, planes, y.size * 9, x, y, sh, pt, pl)
    elif path == 3:
        if not _by_team(_planes_by_team, y.size * 9, (x, y, path, sh, pt, pl, False, exclusive),
                        planes):
            split_work(_avg33, planes, y.size * 9, x, y, sh, pt, pl, exclusive)
    else:
        split_work(_fwd_planes, planes, y.size * kh * kw, x, y, kh, kw, sh, sw, pt, pl, is_max,
                   exclusive, adaptive)


def _by_team(loop, work, call, units) -> bool:
    """A pool of ``work`` enough for a parallel loop's threads (``conv._TEAM_MIN_WORK``: a few
    microseconds a split, where ``split_work``'s helpers take tens a part), on the team by
    ranges of its ``units`` (planes: :func:`_planes_by_team`; output rows:
    :func:`_nhwc_by_team`), ``loop(*call, parts)``, where the loop is ready: whether it ran.
    ResNet-50's stem pool at batch 1 ([1, 64, 112, 112], 1.8 M window reads) on one of two
    threads took 0.43 ms against 0.21 on one thread (the stem's output read from the other
    core's cache); on the team the model's run at batch 1 on two threads took 21.26 ms
    against 21.42 (medians of 8 turns in one process). A larger pool too: Inception-v3's
    [1, 64, 147, 147] max pool (3.1 M) split on ``split_work``'s helpers, and a host driver's
    recording refuses those, so that every two-thread run of the model went op by op from
    Python."""
    if units < 2 or work < _conv._TEAM_MIN_WORK:
        return False
    parts = min(units, _conv.loop_threads())
    return parts > 1 and team.run(loop, call + (parts,))


@pjit
def _planes_by_team(x, y, path, sh, pt, pl, is_max, exclusive, parts):
    """:func:`pool2d_fwd`'s ``path`` (:func:`_path`) 1 (2x2 windows of stride 2, max or
    average), 2 or 3 (3x3 max or average windows of stride ``sh``) in ``parts`` ranges of
    planes, one a thread of a parallel loop (``lib.team``)."""
    n = x.shape[0] * x.shape[1]
    for p in numba.prange(parts):
        q0, q1 = p * n // parts, (p + 1) * n // parts
        if path == 2:
            _max33(x, y, q0, q1, sh, pt, pl)
        elif path == 3:
            _avg33(x, y, q0, q1, sh, pt, pl, exclusive)
        elif is_max:
            _max22(x, y, q0, q1)
        else:
            _avg22(x, y, q0, q1)


def pool2d_max22(x, y):
    """:func:`pool2d_fwd` of 2x2 max windows of stride 2, unpadded: what the lowering calls
    when the op's attributes say so (its compile jobs then name :func:`_max22`)."""
    pool2d_fwd(x, y, 2, 2, 2, 2, 0, 0, True, True, False)


def pool2d_avg22(x, y):
    """:func:`pool2d_max22`'s average (its compile jobs name :func:`_avg22`)."""
    pool2d_fwd(x, y, 2, 2, 2, 2, 0, 0, False, True, False)


def pool2d_max33(x, y, sh, pt, pl):
    """:func:`pool2d_fwd` of 3x3 max windows at stride ``sh`` (1 or 2, both axes), paddings
    ``pt`` (top) and ``pl`` (left): what the lowering calls when the op's attributes say so
    (its compile jobs then name :func:`_max33`)."""
    pool2d_fwd(x, y, 3, 3, sh, sh, pt, pl, True, True, False)


def pool2d_avg33(x, y, sh, pt, pl, exclusive):
    """:func:`pool2d_max33`'s average, dividing by the count of the window's inputs inside the
    image where ``exclusive`` (its compile jobs name :func:`_avg33`)."""
    pool2d_fwd(x, y, 3, 3, sh, sh, pt, pl, False, exclusive, False)


# (the kernel each entry runs for float arrays; what the attributes promise, the sizes must
# allow too: a window past the image (ceil mode) runs _fwd_planes, compiled at its call)
jobs("pool2d_fwd")(lambda T: [(_fwd_planes, ((T, 4), (T, 4)) + (int,) * 8 + (bool,) * 3)])
jobs("pool2d_max22")(lambda T: [(_max22, ((T, 4), (T, 4), int, int))])
jobs("pool2d_avg22")(lambda T: [(_avg22, ((T, 4), (T, 4), int, int))])
jobs("pool2d_max33")(lambda T: [(_max33, ((T, 4), (T, 4)) + (int,) * 5)])
jobs("pool2d_avg33")(lambda T: [(_avg33, ((T, 4), (T, 4)) + (int,) * 5 + (bool,))])
jobs("pool._planes_by_team (warmup)")(lambda T: [
    (_planes_by_team, ((T, 4), (T, 4), int, int, int, int, bool, bool, int))])


@overload(pool2d_fwd)
def _pool2d_fwd_native(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    def impl(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
        if x.shape[:2] != y.shape[:2]:
            raise ValueError(_MISFIT)
        planes = x.shape[0] * x.shape[1]
        if not is_max and _is_whole(x.shape[2], x.shape[3], y.shape[2], y.shape[3], kh, kw, pt,
                                    pl, adaptive):
            _mean_planes(x, y, _plain(0), planes)
            return
        # plain values, not the literals compiled code passes (see conv._plain)
        path = _path(x, y, kh, kw, sh, sw, pt, pl, is_max, adaptive)
        if path == 1:
            if is_max:
                _max22(x, y, _plain(0), planes)
            else:
                _avg22(x, y, _plain(0), planes)
        elif path == 2:
            _max33(x, y, _plain(0), planes, _plain(sh), _plain(pt), _plain(pl))
        elif path == 3:
            _avg33(x, y, _plain(0), planes, _plain(sh), _plain(pt), _plain(pl),
                   _plain(exclusive))
        else:
            _fwd_planes(x, y, _plain(0), planes, _plain(kh), _plain(kw), _plain(sh),
                        _plain(sw), _plain(pt), _plain(pl), _plain(is_max), _plain(exclusive),
                        _plain(adaptive))
    return impl


@overload(pool2d_max22)
def _pool2d_max22_native(x, y):
    def impl(x, y):
        pool2d_fwd(x, y, 2, 2, 2, 2, 0, 0, True, True, False)
    return impl


@overload(pool2d_avg22)
def _pool2d_avg22_native(x, y):
    def impl(x, y):
        pool2d_fwd(x, y, 2, 2, 2, 2, 0, 0, False, True, False)
    return impl


@overload(pool2d_max33)
def _pool2d_max33_native(x, y, sh, pt, pl):
    def impl(x, y, sh, pt, pl):
        pool2d_fwd(x, y, 3, 3, sh, sh, pt, pl, True, True, False)
    return impl


@overload(pool2d_avg33)
def _pool2d_avg33_native(x, y, sh, pt, pl, exclusive):
    def impl(x, y, sh, pt, pl, exclusive):
        pool2d_fwd(x, y, 3, 3, sh, sh, pt, pl, False, exclusive, False)
    return impl


def pool2d_mean(x, y):
    """``y`` [N, C, 1, 1] = the mean of each plane of ``x`` [N, C, H, W]: a global average pool,
    what the lowering calls when the op's attributes and static shape say every window is a
    whole plane (so a program's compile jobs name :func:`_mean_planes`, not the windows
    kernel that :func:`pool2d_fwd` also holds)."""
    if x.shape[:2] != y.shape[:2] or y.shape[2:] != (1, 1):
        raise ValueError(_MISFIT)
    split_work(_mean_planes, x.shape[0] * x.shape[1], x.size, x, y)


jobs("pool2d_mean")(lambda T: [(_mean_planes, ((T, 4), (T, 4), int, int))])
# (a host driver's recording replays the kernel calls below them: ``split_work``'s and the
# parallel loops' own, not these entries' Python)
replay.declare("leaves", pool2d_fwd, pool2d_max22, pool2d_avg22, pool2d_max33, pool2d_avg33,
               pool2d_mean)


@overload(pool2d_mean)
def _pool2d_mean_native(x, y):
    def impl(x, y):
        if x.shape[:2] != y.shape[:2] or y.shape[2] != 1 or y.shape[3] != 1:
            raise ValueError(_MISFIT)
        _mean_planes(x, y, _plain(0), x.shape[0] * x.shape[1])
    return impl


@jit_sum
def pool2d_mean_nhwc(x, y):
    """``y`` [N, 1, 1, C] = the mean of each channel of ``x`` [N, H, W, C] over its plane: a
    global average pool of a channels-last image (the pixels summed in order, each a
    contiguous row of channels)."""
    n_, h_, w_, c_ = x.shape
    if y.shape[0] != n_ or y.shape[1] != 1 or y.shape[2] != 1 or y.shape[3] != c_:
        raise ValueError(_MISFIT)
    p_ = h_ * w_
    xf = x.reshape((n_, p_, c_))
    t = x.dtype.type
    inv = t(1.0 / p_) if p_ > 0 else t(np.nan)
    for n in range(n_):
        acc = np.zeros(c_, x.dtype)
        for q in range(p_):
            for c in range(c_):
                acc[c] += xf[n, q, c]
        for c in range(c_):
            y[n, 0, 0, c] = acc[c] * inv


jobs("pool2d_mean_nhwc")(lambda T: [(pool2d_mean_nhwc, ((T, 4), (T, 4)))])


@jit
def _nhwc_rows(x, y, r0, r1, kh, kw, sh, sw, pt, pl, is_max, exclusive):
    """The output rows ``r0 .. r1`` (a sample's rows one after another: row ``n * OH + oh``)
    of ``y`` [N, OH, OW, C] = the max (``is_max``) or average pool of ``x`` [N, H, W, C] over
    ``kh x kw`` windows at strides ``sh, sw``, top and left paddings ``pt, pl`` (the windows
    of :func:`_span`; an average divides by the inputs read where ``exclusive``, else by the
    window's length). Per output row, its window's input rows are combined first, a long
    vector loop over each row's pixels and channels (``col``: one value per input column and
    channel), then each output pixel combines its window's columns of ``col``, a vector loop
    over its channels (three rows or columns in one pass: a 3x3 window's, inside the image):
    a 3x3 window reads 6 rows of channels an output pixel, not 9 (sums in that order: the
    columns' rows, then the columns). A NaN in a window makes its max NaN."""
    n_, h_, w_, c_ = x.shape
    oh_, ow_ = y.shape[1], y.shape[2]
    t = x.dtype.type
    wc = w_ * c_
    col = np.empty(wc, x.dtype)
    for r in range(r0, r1):
        n, oh = r // oh_, r % oh_
        h0, h1, hl = _span(oh, h_, oh_, kh, sh, pt, False)
        if h1 - h0 == 3:
            _combine3(col, x[n, h0].reshape(wc), x[n, h0 + 1].reshape(wc),
                      x[n, h0 + 2].reshape(wc), is_max, t(1))
        else:
            col[:] = -np.inf if is_max else 0
            for h in range(h0, h1):
                _combine(col, x[n, h].reshape(wc), is_max)
        for ow in range(ow_):
            w0, w1, wl = _span(ow, w_, ow_, kw, sw, pl, False)
            cnt = t(1) if is_max else t((h1 - h0) * (w1 - w0) if exclusive else hl * wl)
            out = y[n, oh, ow]
            if w1 - w0 == 3:
                _combine3(out, col[w0 * c_:(w0 + 1) * c_], col[(w0 + 1) * c_:(w0 + 2) * c_],
                          col[(w0 + 2) * c_:(w0 + 3) * c_], is_max, cnt)
                continue
            out[:] = -np.inf if is_max else 0
            for w in range(w0, w1):
                _combine(out, col[w * c_:(w + 1) * c_], is_max)
            if not is_max:
                for c in range(c_):
                    out[c] = out[c] / cnt


@register_jitable
def _combine(acc, row, is_max):
    """``acc`` = its max with ``row`` (a NaN wins) or its sum with it, element by element."""
    if is_max:
        for k in range(acc.size):
            v, a = row[k], acc[k]
            acc[k] = v if v > a or v != v else a
    else:
        for k in range(acc.size):
            acc[k] += row[k]


@register_jitable
def _combine3(out, a, b, d, is_max, cnt):
    """``out`` = the max of ``a``, ``b``, ``d`` (a NaN wins), or their sum over ``cnt``,
    element by element."""
    if is_max:
        for k in range(out.size):
            m = a[k]
            v = b[k]
            m = v if v > m or v != v else m
            v = d[k]
            out[k] = v if v > m or v != v else m
    else:
        for k in range(out.size):
            out[k] = (a[k] + b[k] + d[k]) / cnt


@pjit
def _nhwc_by_team(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, parts):
    """:func:`_nhwc_rows` in ``parts`` ranges of output rows, one a thread of a parallel loop
    (``lib.team``)."""
    rows = y.shape[0] * y.shape[1]
    for p in numba.prange(parts):
        _nhwc_rows(x, y, p * rows // parts, (p + 1) * rows // parts, kh, kw, sh, sw, pt, pl,
                   is_max, exclusive)


def pool2d_nhwc(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive):
    """``y`` [N, OH, OW, C] = the max (``is_max``) or average pool of ``x`` [N, H, W, C] over
    ``kh x kw`` windows (not adaptive, not global: see :func:`pool2d_mean_nhwc`), the output's
    size taken from ``y`` (ceil mode): a pool inside a chain of channels-last convolutions
    (the inference pass ``channels_last``) reads and writes their images as they are, no
    conversion around it. On the team by ranges of output rows where the work pays for it."""
    if x.shape[0] != y.shape[0] or x.shape[3] != y.shape[3]:
        raise ValueError(_MISFIT)
    rows = y.shape[0] * y.shape[1]
    work = y.size * kh * kw
    if not _by_team(_nhwc_by_team, work, (x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive),
                    rows):
        split_work(_nhwc_rows, rows, work, x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive)


jobs("pool2d_nhwc")(lambda T: [(_nhwc_rows, ((T, 4), (T, 4)) + (int,) * 8 + (bool,) * 2)])
jobs("pool._nhwc_by_team (warmup)")(lambda T: [
    (_nhwc_by_team, ((T, 4), (T, 4)) + (int,) * 6 + (bool,) * 2 + (int,))])
replay.declare("leaves", pool2d_nhwc)


@overload(pool2d_nhwc)
def _pool2d_nhwc_native(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive):
    def impl(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive):
        if x.shape[0] != y.shape[0] or x.shape[3] != y.shape[3]:
            raise ValueError(_MISFIT)
        _nhwc_rows(x, y, _plain(0), y.shape[0] * y.shape[1], kh, kw, sh, sw, pt, pl, is_max,
                   exclusive)
    return impl


@jit
def pool2d_mean_bwd(dy, dx):
    """``dx`` [N, C, H, W] (overwritten) = the gradient of :func:`pool2d_mean` contracted with
    ``dy`` [N, C, 1, 1]: each plane filled with its ``dy`` over the plane's size (the values of
    :func:`pool2d_bwd`'s whole-plane average)."""
    if dy.shape[0] != dx.shape[0] or dy.shape[1] != dx.shape[1] or dy.shape[2] != 1 or \
            dy.shape[3] != 1:
        raise ValueError(_MISFIT)
    size = dx.shape[2] * dx.shape[3]
    p_ = U(size)
    gf = dy.reshape(dy.size)
    df = dx.reshape(dx.size)
    for q in range(U(dy.size)):
        share = gf[q] / size
        for k in range(p_):
            df[q * p_ + k] = share


jobs("pool2d_mean_bwd")(lambda T: [(pool2d_mean_bwd, ((T, 4), (T, 4)))])


@jit
def pool2d_bwd(x, y, dy, dx, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """``dx`` (overwritten) = the gradient of :func:`pool2d_fwd` contracted with ``dy``: each
    ``dy`` element added to its window's first maximum, or spread over its window (an average
    over whole planes: written at once)."""
    if dy.shape != y.shape or dx.shape != x.shape or x.shape[:2] != y.shape[:2]:
        raise ValueError(_MISFIT)
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    p_ = U(h_ * w_)
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    gf = dy.reshape(dy.size)
    df = dx.reshape(dx.size)
    planes = U(x.shape[0] * x.shape[1])
    # (_is_whole's test written out: a helper is a compilation of its own, ~0.05 s)
    if not is_max and oh_ == 1 and ow_ == 1 and (adaptive or (kh == h_ and kw == w_ and
                                                              pt == 0 and pl == 0)):
        for q in range(planes):
            share = gf[q] / (h_ * w_)
            for k in range(p_):
                df[q * p_ + k] = share
        return
    for k in range(U(dx.size)):
        df[k] = 0
    for q in range(planes):
        xb = q * p_
        yb = q * U(oh_ * ow_)
        for oh in range(oh_):
            h0, h1, hl = _span(oh, h_, oh_, kh, sh, pt, adaptive)
            for ow in range(ow_):
                w0, w1, wl = _span(ow, w_, ow_, kw, sw, pl, adaptive)
                at = yb + U(oh * ow_ + ow)
                g = gf[at]
                if is_max:  # the first maximum of the window gets it
                    m = yf[at]
                    found = False
                    for h in range(h0, h1):
                        row = xb + U(h * w_)
                        for w in range(w0, w1):
                            if xf[row + U(w)] == m:
                                df[row + U(w)] += g
                                found = True
                                break
                        if found:
                            break
                else:
                    if exclusive or adaptive:
                        share = g / ((h1 - h0) * (w1 - w0))
                    else:
                        share = g / (hl * wl)
                    for h in range(h0, h1):
                        row = xb + U(h * w_)
                        for w in range(w0, w1):
                            df[row + U(w)] += share


jobs("pool2d_bwd")(lambda T: [(pool2d_bwd, ((T, 4),) * 4 + (int,) * 6 + (bool,) * 3)])


@jit
def max_pool2d_index_fwd(x, y, mask, kh, kw, sh, sw, pt, pl, adaptive):
    """``y`` = the max pool of ``x`` and ``mask`` = each maximum's index ``h * W + w`` in its
    plane."""
    if mask.shape != y.shape or x.shape[:2] != y.shape[:2]:
        raise ValueError(_MISFIT)
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                h0, h1, _ = _span(oh, h_, oh_, kh, sh, pt, adaptive)
                for ow in range(ow_):
                    w0, w1, _ = _span(ow, w_, ow_, kw, sw, pl, adaptive)
                    acc = -np.inf
                    at = -1
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            v = x[n, c, h, w]
                            if v > acc or (v != v and acc == acc):  # the first NaN wins
                                acc = v
                                at = h * w_ + w
                    y[n, c, oh, ow] = acc
                    mask[n, c, oh, ow] = at


@jit
def max_pool2d_index_bwd(mask, dy, dx):
    """``dx`` (overwritten): each ``dy`` element added at the input position its ``mask``
    names (a position outside the plane is an error)."""
    n_, c_, h_, w_ = dx.shape
    if mask.shape != dy.shape or mask.shape[:2] != dx.shape[:2]:
        raise ValueError(_MISFIT)
    for n in range(n_):
        for c in range(c_):
            for oh in range(dy.shape[2]):
                for ow in range(dy.shape[3]):
                    if mask[n, c, oh, ow] >= h_ * w_:
                        raise ValueError("pdjit: a max-pool mask points outside its plane")
    dx[:] = 0
    for n in range(n_):
        for c in range(c_):
            for oh in range(dy.shape[2]):
                for ow in range(dy.shape[3]):
                    at = mask[n, c, oh, ow]
                    if at >= 0:
                        dx[n, c, at // w_, at % w_] += dy[n, c, oh, ow]

# compile times (CPU seconds, a cold compile of the signature its jobs predict, alone in a fresh
# process, 2 cores at load 5-26): the compile worker balances its groups by them
compile_cost(1.2, _fwd_planes)
compile_cost(0.8, pool2d_bwd)
compile_cost(0.5, _max22, _max33, _mean_planes, pool2d_mean_bwd, pool2d_mean_nhwc)  # 0.42-0.57 s
