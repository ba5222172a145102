"""Pooling kernels (NCHW): max and average pooling over 2-D windows, their gradients, and max
pooling that records where each maximum came from.

The window of output ``(oh, ow)`` along one axis (PaddlePaddle's rule, see ``pdjit.ops.pool``):

- adaptive: ``[floor(oh * H / OH), ceil((oh + 1) * H / OH))``;
- otherwise it starts at ``oh * stride - pad_before`` and ends ``k`` later, but not past
  ``H + pad_before``; the part inside the image is read. An average divides by the number of
  elements read (``exclusive`` or adaptive) or by the window's length before that clipping.

The first maximum of a window wins (its position is the ``mask``; its input gets the gradient).
The windows of each axis are worked out once per call; the planes (sample, channel) of a large
input are split over threads.
"""
import numba
import numpy as np
from numba.extending import overload, register_jitable

from pdjit.codegen.nnlib._jit import jit, jobs
from pdjit.codegen.nnlib.conv import _cols, _plain, split_work

__all__ = ["pool2d_fwd", "pool2d_bwd", "max_pool2d_index_fwd", "max_pool2d_index_bwd"]

U = numba.uint64


@register_jitable
def _spans(osize, size, k, s, p, adaptive):
    """Per output index along one axis: (first, end) read, and the window's length for a
    non-exclusive average."""
    a = np.empty(osize, np.int64)
    b = np.empty(osize, np.int64)
    length = np.empty(osize, np.int64)
    for o in range(osize):
        if adaptive:
            lo = (o * size) // osize
            hi = -((-(o + 1) * size) // osize)
            a[o], b[o], length[o] = lo, hi, hi - lo
        else:
            lo = o * s - p
            hi = min(lo + k, size + p)
            a[o], b[o], length[o] = max(lo, 0), min(hi, size), hi - lo
    return a, b, length


@jit
def _fwd_planes(x, y, q0, q1, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """The planes ``q0..q1`` (sample, channel) of ``y`` = the pool of ``x``'s: the max pool of
    2x2 windows of stride 2 inside the image and the average over whole planes by loops of
    their own (see :func:`_shape_of`), any other windows by passes over output rows."""
    kind = _shape_of(x, y, kh, kw, sh, sw, pt, pl, adaptive)
    if kind == 1 and is_max:
        _max22(x, y, q0, q1)
        return
    if kind == 2 and not is_max:
        _mean_planes(x, y, q0, q1)
        return
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    ha, hb, hl = _spans(oh_, h_, kh, sh, pt, adaptive)
    wa, wb, wl = _spans(ow_, w_, kw, sw, pl, adaptive)
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    acc = np.empty(ow_, np.float64)
    # each window column j: the output columns lo..hi whose input column lies in the image
    los = np.empty(max(kw, 1), np.int64)
    his = np.empty(max(kw, 1), np.int64)
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
                                acc[ow] = v if v > acc[ow] else acc[ow]
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
                            acc[U(lo) + k] = v if v > a else a
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
# Inlined into _fwd_planes (register_jitable), the one compiled entry (what a plan's compile
# worker compiles ahead): its cold compile went from 1.6-1.7 s to 2.4-2.6 s (CPU; the 2x2 max
# 0.6 of it); as kernels of their own dispatched from it, 3.0 s.


@register_jitable
def _shape_of(x, y, kh, kw, sh, sw, pt, pl, adaptive) -> int:
    """Which loops compute the windows: 1 for 2x2 windows of stride 2 that all lie inside
    the image (no padding, no partial window: max pools of LeNet, VGG, ...), 2 for one window
    over the whole plane (a global pool), 0 for the general passes."""
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    if oh_ == 1 and ow_ == 1 and (adaptive or (kh == h_ and kw == w_ and pt == 0 and pl == 0)):
        return 2
    if not adaptive and kh == 2 and kw == 2 and sh == 2 and sw == 2 and pt == 0 and pl == 0 \
            and 2 * oh_ <= h_ and 2 * ow_ <= w_:
        return 1
    return 0


@register_jitable
def _max22(x, y, q0, q1):
    """The max pool of 2x2 windows of stride 2 inside the image: per output row, the two
    input rows combined first (one contiguous loop), then pairs of columns. NaN is skipped
    and the first maximum wins, from -inf, as in the general passes (the same values)."""
    h_, w_ = x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    lowest = x.dtype.type(-np.inf)
    n2 = U(2 * ow_)
    rm = np.empty(2 * ow_, x.dtype)
    for q in range(q0, q1):
        for oh in range(oh_):
            r0 = U((q * h_ + 2 * oh) * w_)
            r1 = r0 + U(w_)
            d = U((q * oh_ + oh) * ow_)
            for j in range(n2):
                m = lowest
                v = xf[r0 + j]
                m = v if v > m else m
                v = xf[r1 + j]
                rm[j] = v if v > m else m
            for k in range(U(ow_)):
                m = rm[2 * k]
                v = rm[2 * k + 1]
                yf[d + k] = v if v > m else m


@register_jitable
def _mean_planes(x, y, q0, q1):
    """The mean of each whole plane, in float64, over four running sums (four chains of
    additions, not one: the adds' latency bounded the single sum)."""
    p_ = x.shape[2] * x.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    p4 = U(p_ // 4 * 4)
    for q in range(q0, q1):
        b = U(q * p_)
        s0 = s1 = s2 = s3 = 0.0
        for k in range(U(0), p4, U(4)):
            s0 += xf[b + k]
            s1 += xf[b + k + U(1)]
            s2 += xf[b + k + U(2)]
            s3 += xf[b + k + U(3)]
        for k in range(p4, U(p_)):
            s0 += xf[b + k]
        yf[q] = ((s0 + s1) + (s2 + s3)) / p_


_MISFIT = "pdjit: pooling operands do not fit each other"


def pool2d_fwd(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """``y`` = the max (``is_max``) or average pool of ``x``."""
    if x.shape[:2] != y.shape[:2]:
        raise ValueError(_MISFIT)
    planes = x.shape[0] * x.shape[1]
    # (about a multiply-add per window element: the threshold of split_work)
    split_work(_fwd_planes, planes, y.size * kh * kw, x, y, kh, kw, sh, sw, pt, pl, is_max,
               exclusive, adaptive)


jobs("pool2d_fwd")(lambda T: [(_fwd_planes, ((T, 4), (T, 4)) + (int,) * 8 + (bool,) * 3)])


@overload(pool2d_fwd)
def _pool2d_fwd_native(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    def impl(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
        if x.shape[:2] != y.shape[:2]:
            raise ValueError(_MISFIT)
        # plain values, not the literals compiled code passes (see conv._plain)
        _fwd_planes(x, y, _plain(0), x.shape[0] * x.shape[1], _plain(kh), _plain(kw),
                    _plain(sh), _plain(sw), _plain(pt), _plain(pl), _plain(is_max),
                    _plain(exclusive), _plain(adaptive))
    return impl


@jit
def pool2d_bwd(x, y, dy, dx, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """``dx`` (overwritten) = the gradient of :func:`pool2d_fwd` contracted with ``dy``."""
    if dy.shape != y.shape or dx.shape != x.shape or x.shape[:2] != y.shape[:2]:
        raise ValueError(_MISFIT)
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    ha, hb, hl = _spans(oh_, h_, kh, sh, pt, adaptive)
    wa, wb, wl = _spans(ow_, w_, kw, sw, pl, adaptive)
    dx[:] = 0
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                h0, h1 = ha[oh], hb[oh]
                for ow in range(ow_):
                    w0, w1 = wa[ow], wb[ow]
                    g = dy[n, c, oh, ow]
                    if is_max:
                        m = y[n, c, oh, ow]
                        done = False
                        for h in range(h0, h1):
                            for w in range(w0, w1):
                                if not done and x[n, c, h, w] == m:
                                    dx[n, c, h, w] += g
                                    done = True
                    else:
                        if exclusive or adaptive:
                            share = g / ((h1 - h0) * (w1 - w0))
                        else:
                            share = g / (hl[oh] * wl[ow])
                        for h in range(h0, h1):
                            for w in range(w0, w1):
                                dx[n, c, h, w] += share


jobs("pool2d_bwd")(lambda T: [(pool2d_bwd, ((T, 4),) * 4 + (int,) * 6 + (bool,) * 3)])


@jit
def max_pool2d_index_fwd(x, y, mask, kh, kw, sh, sw, pt, pl, adaptive):
    """``y`` = the max pool of ``x`` and ``mask`` = each maximum's index ``h * W + w`` in its
    plane."""
    if mask.shape != y.shape or x.shape[:2] != y.shape[:2]:
        raise ValueError(_MISFIT)
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    ha, hb, _ = _spans(oh_, h_, kh, sh, pt, adaptive)
    wa, wb, _ = _spans(ow_, w_, kw, sw, pl, adaptive)
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                for ow in range(ow_):
                    acc = -np.inf
                    at = -1
                    for h in range(ha[oh], hb[oh]):
                        for w in range(wa[ow], wb[ow]):
                            v = x[n, c, h, w]
                            if v > acc:
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
