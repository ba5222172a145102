"""Convolution kernels: 2-D convolution, its two gradients, and so the transposed convolution.

One geometry describes them all: an image ``x`` of ``[N, C, H, W]`` convolved with a filter
``w`` of ``[M, C/groups, KH, KW]`` gives ``y`` of ``[N, M, OH, OW]``, with strides ``sh, sw``,
top/left paddings ``pt, pl`` (the bottom/right ones follow from the sizes) and dilations
``dh, dw``. Three primitives cover the forward and backward passes of both ``conv2d``
(``y = conv(x, w)``) and ``conv2d_transpose`` (its output is ``conv``'s input gradient):

- :func:`conv2d_fwd`: ``y = conv(x, w)``;
- :func:`conv2d_bwd_data`: ``dx = conv^T(dy, w)`` (``dx`` overwritten);
- :func:`conv2d_bwd_filter`: ``dw = d conv / d w`` contracted with ``dy`` (``dw`` overwritten).

Each works on NCHW arrays (:func:`nchw`, :func:`nhwc_into` shuffle NHWC data on the way).
A sample is lowered to a matrix product: its patches are copied into ``col`` (``[C/groups *
KH * KW, OH * OW]`` per group, "im2col") and multiplied by the filter with BLAS; a filter with
one input channel per group and few output channels (depthwise) runs as direct loops instead,
where a product of such thin matrices would cost more than it computes. Batches of several
samples run on threads when large (the kernels release the GIL; in a native loop's compiled
driver, on its own thread).
"""
import numba
import numpy as np
from numba.extending import overload

from pdjit.codegen.nnlib._jit import jit, jobs
from pdjit.runtime.threads import loop_threads

__all__ = ["split_work", "conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_filter", "nchw", "nhwc_into",
           "nchw_empty"]

U = numba.uint64

# below this many multiply-adds a batch is not worth the threads' wake-up
_PARALLEL_MIN_WORK = 1 << 21


@jit
def _cols(ow_, w_, sw, off):
    """``lo, hi``: the output columns ``lo..hi`` whose input column ``ow * sw + off`` lies in
    ``0..w_``."""
    lo = 0
    while lo < ow_ and lo * sw + off < 0:
        lo += 1
    hi = ow_
    while hi > lo and (hi - 1) * sw + off >= w_:
        hi -= 1
    return lo, hi


# Indices are unsigned (U) in the inner loops: Numba then drops its negative-index wraparound,
# and the loops vectorise (2-4x faster copies, measured).
@jit
def _im2col(x, c0, cg, kh_, kw_, sh, sw, pt, pl, dh, dw, oh_, ow_, cf, rs, at):
    """Patches of channels ``c0..c0+cg`` of one sample ``x`` ([C, H, W]) into the flat
    ``cf``: patch row ``r`` (of ``cg * kh * kw``) at ``r * rs + at``, ``oh * ow`` values."""
    h_, w_ = x.shape[1], x.shape[2]
    xf = x.reshape(x.size)
    for c in range(cg):
        for i in range(kh_):
            for j in range(kw_):
                r = (c * kh_ + i) * kw_ + j
                off = j * dw - pl
                lo, hi = _cols(ow_, w_, sw, off)
                for oh in range(oh_):
                    ih = oh * sh - pt + i * dh
                    d0 = U(r * rs + at + oh * ow_)
                    if ih < 0 or ih >= h_:
                        for ow in range(ow_):
                            cf[d0 + U(ow)] = 0
                        continue
                    s0 = U(((c0 + c) * h_ + ih) * w_ + off + lo * sw)
                    for ow in range(lo):
                        cf[d0 + U(ow)] = 0
                    dd = d0 + U(lo)
                    if sw == 1:
                        for k in range(U(hi - lo)):
                            cf[dd + k] = xf[s0 + k]
                    else:
                        for k in range(U(hi - lo)):
                            cf[dd + k] = xf[s0 + k * U(sw)]
                    for ow in range(hi, ow_):
                        cf[d0 + U(ow)] = 0


@jit
def _col2im(cf, rs, at, c0, cg, kh_, kw_, sh, sw, pt, pl, dh, dw, oh_, ow_, dx):
    """Add the patches of the flat ``cf`` (laid out as :func:`_im2col` writes them) back
    into channels ``c0..c0+cg`` of one sample ``dx``."""
    h_, w_ = dx.shape[1], dx.shape[2]
    df = dx.reshape(dx.size)
    for c in range(cg):
        for i in range(kh_):
            for j in range(kw_):
                r = (c * kh_ + i) * kw_ + j
                off = j * dw - pl
                lo, hi = _cols(ow_, w_, sw, off)
                for oh in range(oh_):
                    ih = oh * sh - pt + i * dh
                    if ih < 0 or ih >= h_:
                        continue
                    s0 = U(r * rs + at + oh * ow_ + lo)
                    d0 = U(((c0 + c) * h_ + ih) * w_ + off + lo * sw)
                    if sw == 1:
                        for k in range(U(hi - lo)):
                            df[d0 + k] += cf[s0 + k]
                    else:
                        for k in range(U(hi - lo)):
                            df[d0 + k * U(sw)] += cf[s0 + k]


@jit
def _phase_planes(xf, xb, h_, w_, xs, sh, sw, hq, wq, pt, pl):
    """The zero-padded plane of the channel at ``xf[xb:]`` ([h_, w_]), split by stride phase:
    plane ``(pr, pc)`` of ``xs`` ([sh * sw, hq, wq]) holds the padded pixels at rows
    ``rq * sh + pr`` and columns ``t * sw + pc``, so a strided tap reads a contiguous run."""
    for pr in range(sh):
        for pc in range(sw):
            # the columns t whose source column t * sw + pc - pl lies in the image
            t_lo = min(max(0, -((pc - pl) // sw)), wq)
            t_hi = min(max(t_lo, (w_ - 1 - pc + pl) // sw + 1), wq)
            for rq in range(hq):
                ih = rq * sh + pr - pt
                base = U(((pr * sw + pc) * hq + rq) * wq)
                if ih < 0 or ih >= h_:
                    for t in range(U(wq)):
                        xs[base + t] = 0
                    continue
                for t in range(U(t_lo)):
                    xs[base + t] = 0
                src = U(xb + ih * w_ + t_lo * sw + pc - pl)
                for t in range(U(t_hi - t_lo)):
                    xs[base + U(t_lo) + t] = xf[src + t * U(sw)]
                for t in range(U(t_hi), U(wq)):
                    xs[base + t] = 0


@jit
def _direct_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` by direct loops (one input channel
    per group: a product of such thin matrices costs more than it computes).

    Each input plane is padded and split by stride phase once (``_phase_planes``); then tap
    ``(i, j)`` of output ``(oh, k)`` reads one plane at ``oh * wq + k`` plus a fixed offset, so
    every tap is one long contiguous loop over the whole plane (rows of ``wq`` columns, the
    extra ones dropped on the way out), and a 3x3 filter's nine taps are one pass (4x the
    per-row loops of small planes, measured)."""
    h_, w_ = x.shape[2], x.shape[3]
    m_, cg, kh_, kw_ = w.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    mg = m_ // groups
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    wf = w.reshape(w.size)
    hq = oh_ + ((kh_ - 1) * dh) // sh
    wq = ow_ + ((kw_ - 1) * dw) // sw
    xs = np.empty(sh * sw * hq * wq, x.dtype)
    # tap (i, j) reads plane ((i*dh) % sh, (j*dw) % sw) at row oh + (i*dh) // sh and column
    # k + (j*dw) // sw: flat offset tap[i * kw + j] + oh * wq + k
    tap = np.empty(kh_ * kw_, np.uint64)
    for i in range(kh_):
        for j in range(kw_):
            plane = ((i * dh) % sh) * sw + (j * dw) % sw
            tap[i * kw_ + j] = U((plane * hq + (i * dh) // sh) * wq + (j * dw) // sw)
    span = U((oh_ - 1) * wq + ow_) if oh_ > 0 and ow_ > 0 else U(0)
    acc = np.empty(span, x.dtype)
    nine = kh_ * kw_ == 9
    for n in range(n0, n1):
        for m in range(m_):
            g = m // mg
            yb = (n * m_ + m) * oh_ * ow_
            for c in range(cg):
                _phase_planes(xf, (n * x.shape[1] + g * cg + c) * h_ * w_, h_, w_, xs, sh, sw,
                              hq, wq, pt, pl)
                wb = (m * cg + c) * kh_ * kw_
                if nine:
                    a0, a1, a2 = wf[wb], wf[wb + 1], wf[wb + 2]
                    b0, b1, b2 = wf[wb + 3], wf[wb + 4], wf[wb + 5]
                    c0, c1, c2 = wf[wb + 6], wf[wb + 7], wf[wb + 8]
                    t0, t1, t2, t3, t4 = tap[0], tap[1], tap[2], tap[3], tap[4]
                    t5, t6, t7, t8 = tap[5], tap[6], tap[7], tap[8]
                    for q in range(span):
                        acc[q] = (a0 * xs[t0 + q] + a1 * xs[t1 + q] + a2 * xs[t2 + q]
                                  + b0 * xs[t3 + q] + b1 * xs[t4 + q] + b2 * xs[t5 + q]
                                  + c0 * xs[t6 + q] + c1 * xs[t7 + q] + c2 * xs[t8 + q])
                else:
                    for q in range(span):
                        acc[q] = 0
                    for t in range(kh_ * kw_):
                        wv = wf[wb + t]
                        s = tap[t]
                        for q in range(span):
                            acc[q] += wv * xs[s + q]
                for oh in range(oh_):
                    dst = U(yb + oh * ow_)
                    src = U(oh * wq)
                    if c == 0:
                        for k in range(U(ow_)):
                            yf[dst + k] = acc[src + k]
                    else:
                        for k in range(U(ow_)):
                            yf[dst + k] += acc[src + k]


def use_direct(cg, mg) -> bool:
    """Whether the direct loops serve a filter of ``cg`` input and ``mg`` output channels per
    group (one input channel, few outputs: depthwise), rather than im2col + BLAS."""
    return cg == 1 and mg <= 4


# A block of samples shares one matrix product: their patches sit side by side in ``col``
# ([K, nb * P]), so a product over small images is wide enough for BLAS (a thin
# [M/groups, K] x [K, P] per sample of a few hundred columns runs far below its peak). The
# block stays small, because wider products and buffers that leave the cache lose again
# (measured: [6, 25] x [25, 36864] took 3.6x longer than 64 products of 576 columns).
# The loops below copy element by element through flat views with unsigned offsets rather
# than assigning slices of 2-D arrays: the same speed, a quarter of the compile time.
_BLOCK_COLS = 2048
_COL_ELEMS = 1 << 16


@jit
def _block(n, k_, p_):
    """How many samples (of ``n``) share one product."""
    return max(1, min(n, _BLOCK_COLS // max(p_, 1), _COL_ELEMS // max(k_ * p_, 1)))


@jit
def _fwd_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1``."""
    m_, cg, kh_, kw_ = w.shape
    mg = m_ // groups
    oh_, ow_ = y.shape[2], y.shape[3]
    p_, k_ = oh_ * ow_, cg * kh_ * kw_
    nb = _block(n1 - n0, k_, p_)
    w2 = w.reshape((m_, k_))
    yf = y.reshape(y.size)
    for b0 in range(n0, n1, nb):
        b1 = min(b0 + nb, n1)
        width = (b1 - b0) * p_
        cols = np.empty((k_, width), x.dtype)
        cf = cols.reshape(cols.size)
        for g in range(groups):
            for n in range(b0, b1):
                _im2col(x[n], g * cg, cg, kh_, kw_, sh, sw, pt, pl, dh, dw, oh_, ow_, cf, width,
                        (n - b0) * p_)
            rf = np.dot(w2[g * mg:(g + 1) * mg], cols).reshape(mg * width)
            for n in range(b0, b1):
                for m in range(mg):
                    src = U(m * width + (n - b0) * p_)
                    dst = U((n * m_ + g * mg + m) * p_)
                    for k in range(U(p_)):
                        yf[dst + k] = rf[src + k]


@jit
def _gather_dy(dy, b0, b1, g, mg, p_, width):
    """``[mg, width]``: ``dy[n, g * mg + m]`` of the samples ``b0..b1`` side by side."""
    m_ = dy.shape[1]
    d2 = np.empty((mg, width), dy.dtype)
    df = dy.reshape(dy.size)
    f2 = d2.reshape(d2.size)
    for n in range(b0, b1):
        for m in range(mg):
            src = U((n * m_ + g * mg + m) * p_)
            dst = U(m * width + (n - b0) * p_)
            for k in range(U(p_)):
                f2[dst + k] = df[src + k]
    return d2


@jit
def _bwd_data_range(dy, w, dx, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """``dx[n] = conv^T(dy[n], w)`` for the samples ``n0..n1``."""
    m_, cg, kh_, kw_ = w.shape
    mg = m_ // groups
    oh_, ow_ = dy.shape[2], dy.shape[3]
    p_, k_ = oh_ * ow_, cg * kh_ * kw_
    nb = _block(n1 - n0, k_, p_)
    w2 = w.reshape((m_, k_))
    dxf = dx.reshape(dx.size)
    per = dx.size // max(dx.shape[0], 1)
    for k in range(U(n0 * per), U(n1 * per)):
        dxf[k] = 0
    for b0 in range(n0, n1, nb):
        b1 = min(b0 + nb, n1)
        width = (b1 - b0) * p_
        for g in range(groups):
            d2 = _gather_dy(dy, b0, b1, g, mg, p_, width)
            cf = np.dot(w2[g * mg:(g + 1) * mg].T, d2).reshape(k_ * width)
            for n in range(b0, b1):
                _col2im(cf, width, (n - b0) * p_, g * cg, cg, kh_, kw_, sh, sw, pt, pl, dh,
                        dw, oh_, ow_, dx[n])


@jit
def _bwd_filter_range(x, dy, dwt, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """``dwt = sum over the samples n0..n1 of dy[n] @ col(x[n])^T``, per group."""
    m_, cg, kh_, kw_ = dwt.shape
    mg = m_ // groups
    oh_, ow_ = dy.shape[2], dy.shape[3]
    p_, k_ = oh_ * ow_, cg * kh_ * kw_
    nb = _block(n1 - n0, k_, p_)
    dwf = dwt.reshape(dwt.size)
    for k in range(dwf.size):
        dwf[k] = 0
    for b0 in range(n0, n1, nb):
        b1 = min(b0 + nb, n1)
        width = (b1 - b0) * p_
        cols = np.empty((k_, width), x.dtype)
        cf = cols.reshape(cols.size)
        for g in range(groups):
            for n in range(b0, b1):
                _im2col(x[n], g * cg, cg, kh_, kw_, sh, sw, pt, pl, dh, dw, oh_, ow_, cf, width,
                        (n - b0) * p_)
            d2 = _gather_dy(dy, b0, b1, g, mg, p_, width)
            part = np.dot(d2, cols.T).reshape(mg * k_)
            base = U(g * mg * k_)
            for k in range(U(mg * k_)):
                dwf[base + k] += part[k]


# ---- the entry points: whole batches, split over threads when large ---------------------------
_pool = [None]


def _parts(n: int, work: int) -> int:
    """How many threads a batch of ``n`` samples and ``work`` multiply-adds is split over."""
    if n < 2 or work < _PARALLEL_MIN_WORK:
        return 1
    return max(1, min(n, loop_threads()))


def _threads():
    """The threads library kernels split large batches over (kernels release the GIL)."""
    if _pool[0] is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool[0] = ThreadPoolExecutor(thread_name_prefix="pdjit-nn")
    return _pool[0]


def _split(fn, parts, n, *args, head=3):
    """Run ``fn(<head args>, n0, n1, <other args>)`` over ``parts`` slices of ``0..n``, on
    threads (this one takes the first slice)."""
    lead, tail = args[:head], args[head:]
    futures = [_threads().submit(fn, *lead, p * n // parts, (p + 1) * n // parts, *tail)
               for p in range(1, parts)]
    fn(*lead, 0, n // parts, *tail)
    for f in futures:
        f.result()


def split_work(fn, n, work, *args, head=2):
    """``fn(<head args>, 0, n, <other args>)``, split over threads when ``work`` (about the
    multiply-adds or reads) is large: for library kernels over independent items."""
    parts = _parts(n, work)
    if parts == 1:
        fn(*args[:head], 0, n, *args[head:])
    else:
        _split(fn, parts, n, *args, head=head)


_MISFIT = "pdjit: convolution operands do not fit each other"


def _fits(image, out, w, groups) -> bool:
    """Whether an image [N, C, H, W], an output [N, M, OH, OW] and a filter [M, C/groups, KH,
    KW] fit (the kernels index without bounds checks: a misfit must not reach them)."""
    return groups >= 1 and w.shape[0] % groups == 0 and image.shape[1] == w.shape[1] * groups \
        and out.shape[1] == w.shape[0] and image.shape[0] == out.shape[0] and \
        min(w.shape[2], w.shape[3]) >= 1


def conv2d_fwd(x, w, y, sh, sw, pt, pl, dh, dw, groups):
    """``y = conv(x, w)`` (NCHW): ``y`` is written, not read."""
    if not _fits(x, y, w, groups):
        raise ValueError(_MISFIT)
    fn = _direct_range if use_direct(w.shape[1], w.shape[0] // groups) else _fwd_range
    split_work(fn, x.shape[0], y.size * w[0].size, x, w, y, sh, sw, pt, pl, dh, dw, groups,
               head=3)


def conv2d_bwd_data(dy, w, dx, sh, sw, pt, pl, dh, dw, groups):
    """``dx = conv^T(dy, w)`` (NCHW): the gradient of ``conv`` for its input; ``dx`` is
    overwritten. (It is also the transposed convolution of ``dy``.)"""
    if not _fits(dx, dy, w, groups):
        raise ValueError(_MISFIT)
    split_work(_bwd_data_range, dy.shape[0], dy.size * w[0].size, dy, w, dx, sh, sw, pt, pl,
               dh, dw, groups, head=3)


def conv2d_bwd_filter(x, dy, dwt, sh, sw, pt, pl, dh, dw, groups):
    """``dwt`` = the gradient of ``conv(x, w)`` for ``w``, contracted with ``dy`` (NCHW);
    ``dwt`` (shaped like the filter) is overwritten."""
    if not _fits(x, dy, dwt, groups):
        raise ValueError(_MISFIT)
    n = x.shape[0]
    parts = _parts(n, dy.size * dwt[0].size)
    if parts == 1:
        _bwd_filter_range(x, dy, dwt, 0, n, sh, sw, pt, pl, dh, dw, groups)
        return
    acc = np.empty((parts,) + dwt.shape, dwt.dtype)
    futures = [_threads().submit(_bwd_filter_range, x, dy, acc[p], p * n // parts,
                               (p + 1) * n // parts, sh, sw, pt, pl, dh, dw, groups)
               for p in range(parts)]
    for f in futures:
        f.result()
    np.sum(acc, axis=0, out=dwt)


def _range_types(T):
    """Argument types of the ``*_range`` kernels: three 4-D arrays, a range, the geometry."""
    return ((T, 4), (T, 4), (T, 4)) + (int,) * 9


jobs("conv2d_fwd")(lambda T: [(_fwd_range, _range_types(T))])
jobs("conv2d_bwd_data")(lambda T: [(_bwd_data_range, _range_types(T))])
jobs("conv2d_bwd_filter")(lambda T: [(_bwd_filter_range, _range_types(T))])


_fits_native = jit(_fits)
_use_direct_native = jit(use_direct)


# inside compiled code (a native loop's driver): the whole batch on this thread
@overload(conv2d_fwd)
def _conv2d_fwd_native(x, w, y, sh, sw, pt, pl, dh, dw, groups):
    def impl(x, w, y, sh, sw, pt, pl, dh, dw, groups):
        if not _fits_native(x, y, w, groups):
            raise ValueError(_MISFIT)
        if _use_direct_native(w.shape[1], w.shape[0] // groups):
            _direct_range(x, w, y, 0, x.shape[0], sh, sw, pt, pl, dh, dw, groups)
        else:
            _fwd_range(x, w, y, 0, x.shape[0], sh, sw, pt, pl, dh, dw, groups)
    return impl


@overload(conv2d_bwd_data)
def _conv2d_bwd_data_native(dy, w, dx, sh, sw, pt, pl, dh, dw, groups):
    def impl(dy, w, dx, sh, sw, pt, pl, dh, dw, groups):
        if not _fits_native(dx, dy, w, groups):
            raise ValueError(_MISFIT)
        _bwd_data_range(dy, w, dx, 0, dy.shape[0], sh, sw, pt, pl, dh, dw, groups)
    return impl


@overload(conv2d_bwd_filter)
def _conv2d_bwd_filter_native(x, dy, dwt, sh, sw, pt, pl, dh, dw, groups):
    def impl(x, dy, dwt, sh, sw, pt, pl, dh, dw, groups):
        if not _fits_native(x, dy, dwt, groups):
            raise ValueError(_MISFIT)
        _bwd_filter_range(x, dy, dwt, 0, x.shape[0], sh, sw, pt, pl, dh, dw, groups)
    return impl


# ---- NHWC: the same, with the layout shuffled on the way in and out ------------------------------
@jit
def nchw(x):
    """A C-contiguous NCHW copy of the NHWC array ``x``."""
    return np.ascontiguousarray(x.transpose((0, 3, 1, 2)))


@jit
def nhwc_into(src, dst):
    """Write the NCHW array ``src`` into the NHWC array ``dst``."""
    n_, c_, h_, w_ = src.shape
    for n in range(n_):
        for h in range(h_):
            for w in range(w_):
                for c in range(c_):
                    dst[n, h, w, c] = src[n, c, h, w]


@jit
def nchw_empty(a):
    """An uninitialised NCHW array for the NHWC array ``a``."""
    return np.empty((a.shape[0], a.shape[3], a.shape[1], a.shape[2]), a.dtype)
