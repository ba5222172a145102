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
The forward pass picks one of four kernels by shape (:func:`_fwd_kernel`): a filter with one
input channel per group and few output channels (depthwise) runs as direct loops; a 1x1
convolution of 32+ channels onto small planes is one BLAS product per sample with the image
read in place (:func:`_fwd_gemm`); any other plane of 16+ outputs is read through a table of
tap offsets by register-blocked tiles, no im2col and no BLAS (:func:`_fwd_taps`, see
:func:`_use_taps`); the smallest planes copy their patches into ``col`` (``[C/groups * KH *
KW, OH * OW]`` per group, "im2col") for one BLAS product per block of samples. Each forward
kernel but im2col applies the epilogue ``minimum(maximum(y + bias[m] + residual, lo), hi)``
while the outputs are in cache (:func:`_fwd_range`; the direct loops take no residual). In the
host's entry by blocks of samples (:func:`_fwd_range`) a 3x3 stride-1 float32 filter of 32+
output and 16+ input channels onto 32+ tiles of 2x2 outputs (in the whole batch) runs by
Winograd's F(2x2, 3x3) instead (:mod:`.winograd`: 2.25x fewer multiply-adds; compiled
code, a native driver or an ahead-of-time artifact, keeps the taps kernel, whose results
differ from it by rounding). The input gradient of a stride-1 convolution is that forward
pass over ``dy`` with the flipped, transposed filter where it takes the taps or the direct
loops (:func:`by_forward`), and the filter gradient over planes of many outputs reads the
same taps planes (:func:`_dots44`).
Batches of several samples run on threads when large (the kernels release the GIL; in a
native loop's compiled driver, on its own thread). A 1x1 convolution whose filter is a weight
may run on pdjit's packed GEMM instead (:mod:`.pointwise`, which falls back to
:func:`_fwd_range` for the shapes it leaves here).
"""
import numba
import numpy as np
from numba.extending import overload, register_jitable

from pdjit.codegen.cpu import replay
from pdjit.codegen.cpu.lib import team, winograd
from pdjit.codegen.cpu.lib._jit import (
    blas_gemm,
    by_address,
    compile_beside,
    compile_cost,
    jit,
    jobs,
    may_share,
    pjit,
)
from pdjit.codegen.cpu.lib.deint import copy_run, deint, vcopy, zero_run
from pdjit.codegen.cpu.lib.tile import TILE_BYTES, clamp_run, plane_kernel, tile_kernel
from pdjit.codegen.cpu.threads import loop_threads, numpy_blas_calls, run_parts
from pdjit.codegen.diskcache import cached

__all__ = ["split_work", "conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_data_by_taps",
           "conv2d_bwd_filter", "conv2d_bwd_filter_by_blas", "nchw", "nhwc_into",
           "nchw_empty"]

U = numba.uint64

# below this many multiply-adds a batch is not worth the threads' wake-up
_PARALLEL_MIN_WORK = 1 << 21


@register_jitable
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
@register_jitable
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


@register_jitable
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


@register_jitable
def _phase_planes(xf, xb, h_, w_, xs, sh, sw, hq, wq, pt, pl, zero):
    """The zero-padded plane of the channel at ``xf[xb:]`` ([h_, w_]), split by stride phase:
    plane ``(pr, pc)`` of ``xs`` ([sh * sw, hq, wq]) holds the padded pixels at rows
    ``rq * sh + pr`` and columns ``t * sw + pc``, so a strided tap reads a contiguous run.

    The padding sits at the same places for every plane of one geometry: it is written only
    when ``zero`` (the first plane into ``xs``); later planes copy the pixels alone (2-3 short
    loops a row were most of a small plane's time)."""
    for pr in range(sh):
        for pc in range(sw):
            # the columns t whose source column t * sw + pc - pl lies in the image
            t_lo = min(max(0, -((pc - pl) // sw)), wq)
            t_hi = min(max(t_lo, (w_ - 1 - pc + pl) // sw + 1), wq)
            for rq in range(hq):
                ih = rq * sh + pr - pt
                base = U(((pr * sw + pc) * hq + rq) * wq)
                if ih < 0 or ih >= h_:
                    if zero:
                        for t in range(U(wq)):
                            xs[base + t] = 0
                    continue
                if zero:
                    for t in range(U(t_lo)):
                        xs[base + t] = 0
                    for t in range(U(t_hi), U(wq)):
                        xs[base + t] = 0
                src = U(xb + ih * w_ + t_lo * sw + pc - pl)
                if sw == 1:
                    for t in range(U(t_hi - t_lo)):
                        xs[base + U(t_lo) + t] = xf[src + t]
                else:
                    for t in range(U(t_hi - t_lo)):
                        xs[base + U(t_lo) + t] = xf[src + t * U(sw)]


@register_jitable
def _bias_clamp(df, d0, ds, rows, p_, bias, c0, lo, hi, res, e0):
    """A convolution's epilogue on ``rows`` output channels just computed:
    ``df[d0 + r * ds + q] = minimum(maximum(df[...] + bias[c0 + r] + res[e0 + r * ds + q],
    lo), hi)`` for ``q < p_`` (no add where ``bias`` or ``res``, the residual, is empty). The
    same float additions and NumPy ``maximum`` / ``minimum`` (a NaN stays NaN) as the
    elementwise kernel of ``add -> add -> relu6`` it replaces, so the same values, while the
    rows are still in L1."""
    nb = bias.size > 0
    for r in range(rows):
        clamp_run(df, d0 + r * ds, p_, bias[c0 + r] if nb else df.dtype.type(0), nb, res,
                  e0 + r * ds, lo, hi)


@register_jitable
def _has_epilogue(bias, lo, hi) -> bool:
    """Whether a kernel's epilogue arguments ask for anything (a bias, a finite bound)."""
    return bias.size > 0 or lo > -np.inf or hi < np.inf


#: the direct and taps kernels' Numba options: a library kernel's, with fastmath "contract" so
#: that ``a * b + c`` is one fused multiply-add (as in BLAS); nothing is reassociated: every
#: output sums its products in the filter's order (the depthwise 3x3 pass: 2x faster, its
#: 17 vector operations per 16 outputs become 9)
_fma_jit = cached(numba.njit(nogil=True, error_model="numpy", fastmath={"contract"},
                             no_cfunc_wrapper=True))


# the depthwise filters that go straight from the image plane (tile.plane_kernel): square, of
# these sizes, at stride 1 or 2, dilation 1 (MobileNet's, EfficientNet's, ShuffleNet's)
_plane33, _plane33s2 = plane_kernel(3, 3, 1), plane_kernel(3, 3, 2)
_plane55, _plane55s2 = plane_kernel(5, 5, 1), plane_kernel(5, 5, 2)
_plane77, _plane77s2 = plane_kernel(7, 7, 1), plane_kernel(7, 7, 2)


@register_jitable
def _by_planes(kh_, kw_, sh, sw, dh, dw) -> bool:
    """Whether :func:`_planes` serves a depthwise filter of this geometry."""
    return kh_ == kw_ and (kh_ == 3 or kh_ == 5 or kh_ == 7) and sh == sw and \
        (sh == 1 or sh == 2) and dh == 1 and dw == 1


@register_jitable
def _planes(x, w, y, n0, n1, sh, pt, pl, groups, bias, lo, hi):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` of a depthwise filter that
    :func:`_by_planes` takes, one output plane at a time by its plane kernel, the epilogue
    applied as each vector is stored. Measured against copying each plane padded (one thread,
    batch 1, MobileNetV2's layers): 1.5-2.3x faster at stride 1, 1.1-2.1x at stride 2."""
    h_, w_ = x.shape[2], x.shape[3]
    m_, kh_ = w.shape[0], w.shape[2]
    oh_, ow_ = y.shape[2], y.shape[3]
    mg = m_ // groups
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    wf = w.reshape(w.size)
    ep = _has_epilogue(bias, lo, hi)
    nb = bias.size > 0
    for n in range(n0, n1):
        for m in range(m_):
            xb = (n * x.shape[1] + m // mg) * h_ * w_
            yb = (n * m_ + m) * oh_ * ow_
            wb = m * kh_ * kh_
            a = (wf, wb, xf, xb, h_, w_, yf, yb, oh_, ow_, pt, pl, bias, m, ep, nb, lo, hi)
            if kh_ == 3:
                if sh == 1:
                    _plane33(*a)
                else:
                    _plane33s2(*a)
            elif kh_ == 5:
                if sh == 1:
                    _plane55(*a)
                else:
                    _plane55s2(*a)
            elif sh == 1:
                _plane77(*a)
            else:
                _plane77s2(*a)


@by_address
@_fma_jit
def _direct_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` by direct loops (one input channel
    per group: a product of such thin matrices costs more than it computes), each output
    plane then through the epilogue ``minimum(maximum(y + bias[m], lo), hi)`` (see
    :func:`_bias_clamp`; ``bias`` empty and infinite bounds: none).

    The common depthwise filters go by :func:`_planes`. Any other geometry: each input plane
    is padded and split by stride phase once (``_phase_planes``); then tap ``(i, j)`` of
    output ``(oh, k)`` reads one plane at ``oh * wq + k`` plus a fixed offset, so every tap is
    one long contiguous loop over the whole plane (rows of ``wq`` columns, the extra ones
    dropped on the way out)."""
    h_, w_ = x.shape[2], x.shape[3]
    m_, cg, kh_, kw_ = w.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    if cg == 1 and _by_planes(kh_, kw_, sh, sw, dh, dw):
        _planes(x, w, y, n0, n1, sh, pt, pl, groups, bias, lo, hi)
        return
    mg = m_ // groups
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    wf = w.reshape(w.size)
    hw = h_ * w_
    hq = oh_ + ((kh_ - 1) * dh) // sh
    wq = ow_ + ((kw_ - 1) * dw) // sw
    xs = np.empty(sh * sw * hq * wq, x.dtype)
    zero = x.dtype.type(0)
    none = np.empty(0, x.dtype)  # no residual
    # tap (i, j) reads plane ((i*dh) % sh, (j*dw) % sw) at row oh + (i*dh) // sh and column
    # k + (j*dw) // sw: flat offset tap[i * kw + j] + oh * wq + k
    tap = np.empty(kh_ * kw_, np.uint64)
    for i in range(kh_):
        for j in range(kw_):
            plane = ((i * dh) % sh) * sw + (j * dw) % sw
            tap[i * kw_ + j] = U((plane * hq + (i * dh) // sh) * wq + (j * dw) // sw)
    span = U((oh_ - 1) * wq + ow_) if oh_ > 0 and ow_ > 0 else U(0)
    into = wq == ow_ and cg == 1
    acc = np.empty(U(0) if into else span, x.dtype)
    buf = yf if into else acc
    first = True
    ep = _has_epilogue(bias, lo, hi)
    nb = bias.size > 0
    for n in range(n0, n1):
        for m in range(m_):
            g = m // mg
            yb = (n * m_ + m) * oh_ * ow_
            for c in range(cg):
                xb = (n * x.shape[1] + g * cg + c) * hw
                _phase_planes(xf, xb, h_, w_, xs, sh, sw, hq, wq, pt, pl, first)
                first = False
                wb = (m * cg + c) * kh_ * kw_
                # straight into the output where its rows are the span's
                o = U(yb) if into else U(0)
                for q in range(span):
                    buf[o + q] = 0
                for t in range(kh_ * kw_):
                    wv = wf[wb + t]
                    s = tap[t]
                    for q in range(span):
                        buf[o + q] += wv * xs[s + q]
                for oh in range(0 if into else oh_):  # rows of their own
                    dst = U(yb + oh * ow_)
                    src = U(oh * wq)
                    if c == 0:
                        for k in range(U(ow_)):
                            yf[dst + k] = acc[src + k]
                    else:
                        for k in range(U(ow_)):
                            yf[dst + k] += acc[src + k]
            if ep:  # the plane just computed, in L1
                clamp_run(yf, yb, oh_ * ow_, bias[m] if nb else zero, nb, none, yb, lo, hi)


@register_jitable
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
#: the filter gradient by taps (no im2col, no BLAS) from this many outputs per channel
_TAPS_DW_MIN = 256
#: ... and from this many where a group's gradient has at most _TAPS_DW_SMALL_ROWS rows
#: (output channels) and _TAPS_DW_SMALL values (rows x taps). Measured (one thread, float32,
#: batch 32, ms, taps / im2col + BLAS): 14x14 8->16 3x3 0.27 / 0.37, 16->16 0.55 / 0.83;
#: 10x10 6->16 5x5 0.38 / 0.48; 8x8 16->16 3x3 0.28 / 0.36; 12x12 3->16 3x3 0.08 / 0.11;
#: 14x14 stride 2 16->16 0.76 / 0.92, 1x1 64->16 0.33 / 0.35; batch 1, 14x14 16->16 0.019 /
#: 0.028. With more rows or values BLAS won or tied: 8x8 1x1 stride 2 32->64 0.24 / 0.20;
#: 10x10 16->32 3x3 (4608 values) 0.70 / 0.63, 32->32 1.39 / 1.28; 14x14 64->64 3x3 7.3 /
#: 6.0, 1x1 256->64 4.1 / 3.1
_TAPS_DW_MIN_SMALL = 64
_TAPS_DW_SMALL_ROWS = 16
_TAPS_DW_SMALL = 2560
#: the bytes of weights the taps kernel keeps in cache while it sweeps a panel's positions
_PANEL_BYTES = 1 << 17
#: the bytes of inputs (the planes the taps of a sample read: the image itself for a 1x1
#: filter) up to which the taps kernel sweeps all of a block of rows' positions before the
#: next block's (the inputs stay in the L2 cache; the outputs are written a few rows at a
#: time, where a panel of many rows strip by strip writes to as many rows at once: a 1x1
#: convolution of 16 -> 96 channels over 112x112 ran ~4x slower that way; a 3 -> 64 3x3
#: stride-2 one onto 112x112, 0.9 MB of planes for 27 x 12544 taps x positions, 651 ->
#: 446 us on one thread)
_PLANE_BYTES = 1 << 20
#: the bytes of inputs one strip of the taps kernel's sums reads per block of taps
_STRIP_BYTES = 24 << 10
#: the bytes of a panel's outputs the taps kernel stores before it applies their epilogue
_EPILOGUE_BYTES = 16 << 10


@register_jitable
def _block(n, k_, p_):
    """How many samples (of ``n``) share one product."""
    # (by comparisons: the min/max builtins each compile an overload of their own)
    nb = n
    if p_ > 0:
        a = _BLOCK_COLS // p_
        b = _COL_ELEMS // (k_ * p_) if k_ > 0 else n
        nb = a if a < nb else nb
        nb = b if b < nb else nb
    return nb if nb > 1 else 1


# ---- the product without im2col --------------------------------------------------------------
# BLAS runs far below its peak on the thin products of a convolution with few output channels
# per group (an [M/groups, K] filter of M/groups = 6..32), and the im2col copy before it costs
# as much again (measured: 60% of a LeNet layer at batch 64); with panels, strips and blocks of
# taps (see the kernel) it serves every plane of 16+ outputs. The kernel below reads the image
# through a table of row offsets instead ("taps"): output row ``m`` of a sample is the sum over
# ``k`` of ``w2[m, k]`` times the ``P`` values at ``xs[tap[k]:]``, where ``xs`` holds each input
# channel once per filter column (and stride phase of rows), so the ``P`` inputs of one filter
# tap are contiguous and in output order, and the output rows of a sample are written in place
# (a 1x1 unpadded stride-1 convolution reads the image itself). The output positions are the
# innermost loop, in register tiles of 8 (6, 4) output rows by 3 (4) vectors of positions
# (:mod:`pdjit.codegen.cpu.lib.tile`). _fwd_range builds the planes and the tap table and calls
# the kernel.

# the tiles of the taps path (see pdjit.codegen.cpu.lib.tile): rows x vectors of positions
_tile44, _tile41 = tile_kernel(4, 4), tile_kernel(4, 1)
_tile64, _tile61 = tile_kernel(6, 4), tile_kernel(6, 1)
_tile83, _tile81 = tile_kernel(8, 3), tile_kernel(8, 1)
#: ... the wide one of 8 rows with the epilogue (bias, clamp) applied as it stores (see
#: _taps_range; a network's first layer of 16, 32 or 64 channels: the other tiles' sums go
#: through a pass after them, one tile less to compile)
_tile83e = tile_kernel(8, 3, epilogue=True)


@register_jitable
def _tiles(rb, wide, wp, wo, wk, kk, xs, xb, tap, t0, df, do, ds, q0, more):
    """The tile of ``rb`` rows (8, 6 or 4) by its strip of vectors (``wide``: 3 for 8 rows,
    else 4) or by one vector."""
    if rb == 8:
        if wide:
            _tile83(wp, wo, wk, kk, xs, xb, tap, t0, df, do, ds, q0, more)
        else:
            _tile81(wp, wo, wk, kk, xs, xb, tap, t0, df, do, ds, q0, more)
    elif rb == 6:
        if wide:
            _tile64(wp, wo, wk, kk, xs, xb, tap, t0, df, do, ds, q0, more)
        else:
            _tile61(wp, wo, wk, kk, xs, xb, tap, t0, df, do, ds, q0, more)
    elif wide:
        _tile44(wp, wo, wk, kk, xs, xb, tap, t0, df, do, ds, q0, more)
    else:
        _tile41(wp, wo, wk, kk, xs, xb, tap, t0, df, do, ds, q0, more)


@register_jitable
def _use_taps(mg, k_, p_) -> bool:
    """Whether the taps kernel serves ``mg`` output channels per group, ``k_`` products per
    output and ``p_`` outputs per channel, rather than im2col + BLAS.

    Measured with the register-blocked tiles (one thread, float32, batch 32, ms, taps / BLAS):
    faster from planes of 16 outputs on, whatever the channels: 8x8 1x1 32->64 0.076 / 0.180,
    8x8 3x3 64->64 1.66 / 2.75, 8x8 1x1 128->128 0.58 / 0.88, 16x16 3x3 32->32 1.71 / 3.19,
    16x16 1x1 512->64 10.5 / 12.0, 4x4 3x3 32->32 0.17 / 0.34, 4x4 3x3 128->128 2.27 / 3.49,
    4x4 1x1 256->512 1.17 / 1.58; slower on 2x2 planes (the span is padded to 16 outputs):
    3x3 256->256 9.8 / 3.2, stride 2 from 4x4 128->256 3.1 / 1.3. Planes of 16-63 outputs
    that are no multiple of 16 (part of the last vector wasted) mostly won too (5x5 3x3
    32->32 0.28 / 0.49, 7x7 3x3 64->64 1.65 / 2.30; 5x5 1x1 128->128 0.44 / 0.42) but stay
    with BLAS, whose im2col tests cover such shapes. (With the earlier kernel, which stored
    its sums every four taps, BLAS won on 8x8 planes of 64+ channels and on 4x4.)"""
    return p_ >= 16


@register_jitable
def _tap_offsets(tap, k_, zero, kw_, kh_, sh, dh, pp, ow_):
    """``tap[k]``: where tap ``k = (c, i, j)`` of a ``kh_ x kw_`` filter starts in the phase
    planes (``sh`` phases of ``pp`` elements per kernel column and channel); taps from ``k_``
    on (padding up to a vector's width) read the zero plane at ``zero``. By counters: a loop
    the vectoriser leaves alone (a third of the code of a kernel otherwise)."""
    c = i = j = 0
    for tk in range(tap.size):
        tap[tk] = zero if tk >= k_ else \
            ((c * kw_ + j) * sh + (i * dh) % sh) * pp + ((i * dh) // sh) * ow_
        j += 1
        if j == kw_:
            j = 0
            i += 1
            if i == kh_:
                i = 0
                c += 1


@by_address
@jit
def _fwd_blas(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` by im2col of blocks of samples and
    one BLAS product per block and group (where :func:`_use_taps` says no)."""
    m_, cg, kh_, kw_ = w.shape
    mg = m_ // groups
    oh_, ow_ = y.shape[2], y.shape[3]
    p_, k_ = oh_ * ow_, cg * kh_ * kw_
    yf = y.reshape(y.size)
    nb = _block(n1 - n0, k_, p_)
    w2 = w.reshape((m_, k_))
    for b0 in range(n0, n1, nb):
        b1 = b0 + nb if b0 + nb < n1 else n1
        width = (b1 - b0) * p_
        cf = np.empty(k_ * width, x.dtype)
        cols = cf.reshape((k_, width))
        r2 = np.empty(mg * width, x.dtype).reshape((mg, width))
        for g in range(groups):
            for n in range(b0, b1):
                _im2col(x[n], g * cg, cg, kh_, kw_, sh, sw, pt, pl, dh, dw, oh_, ow_, cf,
                        width, (n - b0) * p_)
            blas_gemm(w2[g * mg:(g + 1) * mg], cols, r2)
            rf = r2.reshape(mg * width)
            for n in range(b0, b1):
                for m in range(mg):
                    src = U(m * width + (n - b0) * p_)
                    dst = U((n * m_ + g * mg + m) * p_)
                    for k in range(U(p_)):
                        yf[dst + k] = rf[src + k]


# The taps kernel, one for convolutions with and without an epilogue: where its
# arguments ask for none it is as fast as a kernel compiled without one (measured, one
# thread, float32: 1.608 vs 1.647 ms, 10.35 vs 10.38 ms), and a program that needs both
# compiles one kernel (two cost ~1.1 s more of CPU, cold).
def _fwd_taps(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` by taps: :func:`_taps_range` of
    whole planes. Not a compiled function of its own: one that calls ``_taps_range``
    optimises and generates its code again (the caller's module links the callee's), 1.4 s of
    CPU cold for nothing; compiled code calls ``_taps_range`` through the overload below.
    While a worker compiles it beside the runs, :func:`_taps_numpy` stands in."""
    if replay.standing_in(_taps_range):
        _taps_numpy(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)
        return
    _taps_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res, 0, -1)


def epilogue_numpy(out, y, n0, n1, bias, lo, hi, res, axis):
    """The NumPy stand-ins' epilogue, in place: ``out`` (the values of ``y[n0:n1]``) plus
    ``bias`` along its channel ``axis``, plus ``res`` (flat as ``y``) of those samples, then
    ``minimum(maximum(..., lo), hi)`` (empty ``bias``, ``res`` and infinite bounds: none)."""
    if bias.size:
        shape = [1] * out.ndim
        shape[axis] = -1
        out += bias.reshape(shape)
    if res.size:
        out += res.reshape(y.shape)[n0:n1]
    if lo > -np.inf:
        np.maximum(out, lo, out=out)
    if hi < np.inf:
        np.minimum(out, hi, out=out)
    return out


@numpy_blas_calls
def _taps_numpy(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """:func:`_fwd_taps` by NumPy's calls, what serves while a worker compiles the taps kernel
    beside a program's first runs (``team.standing_in``: its compile, ~2.4 s of CPU, was most
    of a cold ResNet-50's first result for its stem alone), and the stand-in of the other
    convolution kernels that have one: the samples' patches by strided views of the padded
    image, one BLAS product per group, then the epilogue
    ``minimum(maximum(y + bias[m] + res, lo), hi)`` (the same to rounding; not replayed: a
    recording of it is refused)."""
    replay.refuse("the taps kernel compiles beside the runs")
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    m_, cg, kh_, kw_ = w.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    k = n1 - n0
    if k <= 0 or oh_ <= 0 or ow_ <= 0:
        return
    mg = m_ // groups
    hp = max(h_ + pt, (oh_ - 1) * sh + (kh_ - 1) * dh + 1)
    wp = max(w_ + pl, (ow_ - 1) * sw + (kw_ - 1) * dw + 1)
    xp = np.zeros((k, c_, hp, wp), x.dtype)
    xp[:, :, pt:pt + h_, pl:pl + w_] = x[n0:n1]
    cols = np.empty((k, c_, kh_, kw_, oh_, ow_), x.dtype)
    for i in range(kh_):
        for j in range(kw_):
            cols[:, :, i, j] = xp[:, :, i * dh:i * dh + (oh_ - 1) * sh + 1:sh,
                                  j * dw:j * dw + (ow_ - 1) * sw + 1:sw]
    cols = cols.reshape(k, groups, cg * kh_ * kw_, oh_ * ow_)
    out = np.matmul(w.reshape(1, groups, mg, cg * kh_ * kw_), cols)
    y[n0:n1] = epilogue_numpy(out.reshape(k, m_, oh_, ow_), y, n0, n1, bias, lo, hi, res, 1)


def _taps_range_numpy(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res, qa,
                      qb):
    """:func:`_taps_range` of whole planes (its host calls': ``qa, qb = 0, -1``) by
    :func:`_taps_numpy`."""
    if qa != 0 or qb != -1:
        raise ValueError("pdjit: the taps kernel's stand-in takes whole planes")
    _taps_numpy(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)


def _direct_numpy(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi):
    """:func:`_direct_range` by NumPy's calls (:func:`_taps_numpy`, no residual)."""
    _taps_numpy(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi,
                np.empty(0, x.dtype))


@by_address
@jit
def _taps_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res, qa, qb):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` by taps (tiles of :mod:`.tile`),
    where :func:`_use_taps` says so, each output then stored through
    ``minimum(maximum(y + bias[m] + res, lo), hi)`` (as :func:`_bias_clamp` computes it,
    written out here; ``bias`` and ``res``, flat as ``y``, empty and infinite bounds: none).

    ``xs`` holds one plane per input channel ``c``, filter column ``j`` and row phase ``r``
    of the stride: ``hq`` rows (``ho * sh + r - pt`` of the image) of ``ow`` values (columns
    ``o * sw + j * dw - pl``, zero outside the image), so tap ``(c, i, j)`` reads plane
    ``(c, j, (i * dh) % sh)`` from row ``(i * dh) // sh`` on: ``P`` contiguous values in
    output order (``kw`` copies of the image where im2col makes ``kh * kw``). Where needed
    the filter is copied with its rows padded to a multiple of 4 taps (zero weights on a zero
    plane) and, below 4 output channels per group, to 4 rows (computed aside).

    Only the output positions ``qa..qb`` of each plane are computed where ``qb >= 0``
    (multiples of 16 but the plane's end; only the rows of the planes they read are
    prepared): a part of a one-sample convolution split by positions (:func:`_by_pixels`).
    Each output is the sum it is in the whole call, in the same order."""
    h_, w_ = x.shape[2], x.shape[3]
    m_, cg, kh_, kw_ = w.shape
    c_ = x.shape[1]
    mg = m_ // groups
    oh_, ow_ = y.shape[2], y.shape[3]
    p_, k_ = oh_ * ow_, cg * kh_ * kw_
    if n1 <= n0 or p_ == 0:
        return
    yf = y.reshape(y.size)
    xf = x.reshape(x.size)
    mq = mg if mg > 4 else 4
    # the filter, its rows padded (per group) to mq rows with zeros where there are fewer than 4
    wf = w.reshape(w.size)
    wp = wf if mq == mg else np.empty(groups * mq * k_, w.dtype)
    for gm in range(groups * mq if mq != mg else 0):
        m = gm % mq
        if m < mg:
            copy_run(wf, (gm // mq * mg + m) * k_, wp, gm * k_, k_)
        else:
            zero_run(wp, gm * k_, k_)
    # a 1x1 unpadded stride-1 convolution of whole vectors: the image is its own plane
    plain = kh_ == 1 and kw_ == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0 and \
        oh_ == h_ and ow_ == w_ and p_ % 16 == 0
    # otherwise the outputs are computed up to a multiple of 16 (reading on into the next
    # plane, and past the last into a zero tail): a pass over the taps for the last few
    # outputs cost 30% of a [16, 150] x [150, 100] product
    span = p_ if plain else (p_ + 15) // 16 * 16
    qz = span if qb < 0 else qb  # the positions computed: qa..qz
    qy = qz if qz < p_ else p_  # ... and stored (the rest of a span is padding)
    hq = oh_ + ((kh_ - 1) * dh) // sh
    pp = hq * ow_
    # the rows of the planes that the positions qa..qz read: all of them for the whole span;
    # for a range, its own output rows and the filter's reach below them (a split by
    # positions prepares each part's share of the planes, not every part all of them)
    ra, rz = 0, hq
    if qb >= 0:
        ra = qa // ow_
        rz = (qz - 1) // ow_ + 1 + ((kh_ - 1) * dh) // sh
        rz = rz if rz < hq else hq
    one = kh_ // kh_  # not the literal 1: the im2col the BLAS path compiles serves
    zero = cg * kw_ * sh * pp  # the zero tail
    if plain:
        xs = xf
    else:
        xs = np.empty(zero + span, x.dtype)
        zero_run(xs, zero, span)
    tap = np.empty(k_, np.int64)
    _tap_offsets(tap, k_, zero, kw_, kh_, sh, dh, pp, ow_)
    # stride 2 (dilation 1) onto half the columns of an even width, in whole vectors (the
    # first layer of a MobileNet): the planes' rows by vector copies (see below); row2 holds
    # an image row's even columns, then its odd ones, each between margins of 16 zeros.
    # MobileNet's 3->16 32x32 layer at batch 64, one thread: 0.253 ms by _im2col, 0.200 this way
    nrv = ow_ * x.itemsize // TILE_BYTES
    rows2 = not plain and sh == 2 and sw == 2 and dh == 1 and dw == 1 and kh_ > 1 and \
        w_ == 2 * ow_ and nrv * TILE_BYTES == ow_ * x.itemsize and 0 <= pl <= 32 and \
        kw_ <= pl + 32 and pt >= 0
    row2 = np.empty(2 * ow_ + 64 if rows2 else 0, x.dtype)
    zero_run(row2, 0, row2.size)
    vw = TILE_BYTES // x.itemsize
    # a residual in y's own buffer (the memory plan's in place): the sums stored in place
    # would write over it before the epilogue reads it, so each strip's share of it is kept
    # aside first (rk); rows stored twice (a last block overlapping the one before) would read
    # it after their first epilogue: those compute aside
    shared = res.size > 0 and may_share(res, y)
    # a plane of no whole number of vectors is stored in place but for its last vector,
    # which each strip computes into ``tl`` (a row's vector) and copies out: computing the
    # whole span aside and copying it out cost SqueezeNet's 3 -> 64 stem onto 111x111 a third
    # of its time. Rows 4 KiB apart, fewer than 4, or a residual in y's buffer: the whole
    # span computed aside at a padded stride, then copied out
    tail = span != p_ and not shared and mg >= 4
    ds = p_ if tail else span
    near = True
    # Rows whose starts lie within a cache line of a multiple of 4 KiB apart stall each
    # other's stores and loads: a [16, 144] x [144, 1024] product ran at 23 GMAC/s with rows
    # 1024 float32 apart and at 53 with 1152. Rows a few lines off a multiple do not
    # (ResNet-50's and MobileNet's 56x56 planes, 12544 bytes apart: 4 KiB * 3 + 256;
    # computed aside, their 1x1 convolutions took 1.4-1.7x as long, the copy out included).
    while near:  # (inline: a function of its own costs a compile)
        near = False
        for j in range(1, 4):
            d = j * ds * x.itemsize
            near = near or (d >= 4096 and (d % 4096 < 64 or d % 4096 > 4096 - 64))
        if near:
            ds = span if ds < span else ds + 16
    tail = tail and ds == p_
    # tiles of rb rows by nv vectors of positions (24 sums in registers; 4 rows by 4
    # below 6 rows), then by 1 vector for the rest of the span
    rb = 8 if mq % 8 == 0 else 6 if mq >= 6 else 4
    nv = 3 if rb == 8 else 4
    aside = ds != p_ or mg < 4 or (shared and mq % rb != 0)
    acc = np.empty(mq * ds if aside else 0, x.dtype)
    qw = p_ - p_ % vw if tail and p_ - p_ % vw < qz else qz  # (whole vectors in place)
    tl = np.empty(mq * vw if tail else 0, x.dtype)
    df = acc if aside else yf
    # rows per panel: their weights about _PANEL_BYTES
    mp = (_PANEL_BYTES // (k_ * x.itemsize)) // rb * rb
    mp = mp if mp > rb else rb
    if (cg * p_ if plain else zero + span) * x.itemsize <= _PLANE_BYTES:  # see _PLANE_BYTES
        mp = rb
    # taps per block: a strip's inputs about _STRIP_BYTES; all of them where the last
    # block of rows overlaps the one before, or where they are at most half a block more (a
    # short second block reloads the sums for little: LeNet's 6 -> 16 5x5 layer, 150 taps,
    # one block of 150 rather than 128 and 22, 4% faster)
    kc = _STRIP_BYTES // (nv * TILE_BYTES)
    kc = kc if mq % rb == 0 and 2 * k_ > 3 * kc else k_
    # the epilogue: on a run of about _EPILOGUE_BYTES of a panel's outputs once they are
    # stored, while they are in cache (rows a block overlapping the one before stored again
    # get it again); per strip, its calls made LeNet's 1 -> 6 5x5 layer 10% slower. Computed
    # aside: as copied out
    zero_ = x.dtype.type(0)
    nb = bias.size > 0
    # (_has_epilogue's test written out: no helper of its own to compile)
    ep = nb or lo > -np.inf or hi < np.inf or res.size > 0
    epr = ep and not aside
    keep = epr and shared
    # the epilogue applied by the wide tiles of 8 rows as they store (_tile83e), where their
    # sums are whole (one block of taps) and no residual is added: no pass over those stored
    # outputs (SqueezeNet's 3 -> 64 stem onto 112x112 with its bias and relu, one thread:
    # 594 -> 500 us)
    fuse = epr and res.size == 0 and kc == k_ and rb == 8
    rk = np.empty(_EPILOGUE_BYTES // x.itemsize + mq * nv * vw if keep else 0, x.dtype)
    # a 1x1 convolution reading the image in place, stored in place, whose filter is
    # larger than a sample's image (more output channels than positions): every sample of
    # the range under each panel of rows in turn (the panel's weights read once from
    # memory for the batch, not once per sample). A larger image stays in the L2 cache
    # for all the panels of one sample instead (56x56 64 -> 256 at batch 16, one thread:
    # 29 ms batched, 21 sample by sample)
    batched = plain and not aside and mq > p_
    ns = n1 - n0 if batched else 1
    for n in range(n0, n1 if not batched else n0 + 1):
        for g in range(groups):
            xb = 0
            if plain:
                xb = (n * c_ + g * cg) * p_
            elif rows2:
                # stride 2 onto rows of whole vectors: each image row split by column
                # parity once (deint, into a buffer between zero margins), and each plane's
                # row a copy of whole vectors from it (columns outside the image read the
                # margins): no short strided loops
                for r in range(2):
                    for ho in range(ra, rz):
                        ih = 2 * ho + r - pt
                        inside = 0 <= ih < h_
                        for c in range(cg):
                            if inside:
                                deint(xf, ((n * c_ + g * cg + c) * h_ + ih) * w_, row2, 16,
                                      ow_ + 48, nrv)
                            for j in range(kw_):
                                d = ((c * kw_ + j) * 2 + r) * pp + ho * ow_
                                if inside:
                                    e = j - pl
                                    vcopy(row2, (e % 2) * (ow_ + 32) + 16 + e // 2, xs, d, nrv)
                                else:
                                    for k in range(U(ow_)):
                                        xs[U(d) + k] = 0
            else:
                for r in range(sh if kh_ > 1 else 1):  # a 1x1 filter reads phase 0 only
                    _im2col(x[n], g * cg, cg, one, kw_, sh, sw, pt - r - ra * sh, pl, dh, dw,
                            rz - ra, ow_, xs, sh * pp, r * pp + ra * ow_)
            y0 = (n * m_ + g * mg) * p_
            d0 = 0 if aside else y0
            # by panels of rows whose weights stay in the L2 cache (mp rows, a multiple of
            # rb), each swept strip by strip of nv vectors of positions, each strip's sums
            # by blocks of kc taps whose inputs stay in the L1 cache while every block of
            # rb rows of the panel reads them (its sums so far reloaded from df: the same
            # values as summed in one go), then the epilogue of a few strips at a time while
            # they are in cache.
            # In a panel, blocks of rb rows, the last overlapping the ones before when rb
            # does not divide mg (rows computed twice cost less than a pass of their own;
            # then the taps are not split, which would add a block's sums twice to them).
            for ps in range(((mq + mp - 1) // mp) * ns):  # (a panel, then a sample under it)
                p0, s = (ps // ns) * mp, ps % ns
                p1 = p0 + mp if p0 + mp < mq else mq
                r0 = p0 if p1 < mq or p0 < mq - rb else mq - rb  # rows the strips store
                xbs, d0s = xb + s * c_ * p_, d0 + s * m_ * p_  # sample n + s (batched)
                q0 = qe = qa  # qe: the first position whose epilogue is still to apply
                run = _EPILOGUE_BYTES // ((p1 - r0) * x.itemsize)
                rq = run + nv * vw  # (rk: a row's positions qe .. q0)
                while q0 < qz:
                    wide = q0 + nv * vw <= qw
                    width = nv * vw if wide else vw
                    last = q0 >= qw  # (tail: the plane's last vector, through tl)
                    if keep:  # (whole vectors: not aside, no tail)
                        for r in range(r0, p1):
                            vcopy(res, d0s + r * ds + q0, rk, (r - r0) * rq + q0 - qe,
                                  width // vw)
                    fz = fuse and wide  # (the wide strips come first: the pass below
                    for k0 in range(0, k_, kc):  # takes the rest of the span)
                        k1 = k0 + kc if k0 + kc < k_ else k_
                        for m4 in range(p0, p1, rb):
                            mr = m4 if m4 < mq - rb else mq - rb
                            if last:
                                _tiles(rb, wide, wp, (g * mq + mr) * k_ + k0, k_, k1 - k0,
                                       xs, xbs, tap, k0, tl, mr * vw - q0, vw, q0, k0 > 0)
                            elif fz:  # (8 rows by 3 vectors, all the taps)
                                _tile83e(wp, (g * mq + mr) * k_, k_, k_, xs, xbs, tap, 0, df,
                                         d0s + mr * ds, ds, q0, False, bias, g * mg + mr, nb,
                                         lo, hi)
                            else:
                                _tiles(rb, wide, wp, (g * mq + mr) * k_ + k0, k_, k1 - k0,
                                       xs, xbs, tap, k0, df, d0s + mr * ds, ds, q0, k0 > 0)
                    if last:
                        for r in range(r0, p1):
                            copy_run(tl, r * vw, df, d0s + r * ds + q0, p_ - q0)
                    q0 += width
                    if fz:
                        qe = q0
                    elif epr and (q0 - qe >= run or q0 >= qz):
                        qs = q0 if q0 < qy else qy
                        for r in range(r0, p1):
                            at = d0s + r * ds + qe
                            clamp_run(df, at, qs - qe, bias[g * mg + r] if nb else zero_, nb,
                                      rk if keep else res, (r - r0) * rq if keep else at,
                                      lo, hi)
                        qe = q0
            if aside:  # the epilogue on the sums, then stored (a residual in y: read first)
                for mr in range(mg):
                    sa, da = U(mr * ds + qa), U(y0 + mr * p_ + qa)
                    if ep:  # (here, not by _bias_clamp: no helper of its own to compile)
                        clamp_run(acc, sa, qy - qa, bias[g * mg + mr] if nb else zero_, nb,
                                  res, da, lo, hi)
                    for q in range(U(qy - qa)):
                        yf[da + q] = acc[sa + q]




#: a reduction kernel's options: sums reassociated (vectorised: each of the 16 sums runs in
#: vector lanes, added up at the end); called from compiled code only, so without the CPython
#: and C wrappers Numba would compile for it
_sum_jit = cached(numba.njit(nogil=True, error_model="numpy",
                             fastmath={"contract", "reassoc"}, no_cpython_wrapper=True,
                             no_cfunc_wrapper=True))


@_sum_jit
def _dots44(a, a0, a1, a2, a3, b, b0, b1, b2, b3, n):
    """The 16 dot products of ``n`` values, ``a[ar:]`` with ``b[bt:]`` for rows ``r, t < 4``
    (offsets ``a0..a3``, ``b0..b3``), as a tuple in row-major order: a 4x4 block of the
    filter gradient, dy's rows against the image's taps, each pair of runs loaded once."""
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = a.dtype.type(0)
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = a.dtype.type(0)
    p0, p1, p2, p3 = U(a0), U(a1), U(a2), U(a3)
    q0, q1, q2, q3 = U(b0), U(b1), U(b2), U(b3)
    for q in range(U(n)):
        u0, u1, u2, u3 = a[p0 + q], a[p1 + q], a[p2 + q], a[p3 + q]
        v0, v1, v2, v3 = b[q0 + q], b[q1 + q], b[q2 + q], b[q3 + q]
        s00 += u0 * v0
        s01 += u0 * v1
        s02 += u0 * v2
        s03 += u0 * v3
        s10 += u1 * v0
        s11 += u1 * v1
        s12 += u1 * v2
        s13 += u1 * v3
        s20 += u2 * v0
        s21 += u2 * v1
        s22 += u2 * v2
        s23 += u2 * v3
        s30 += u3 * v0
        s31 += u3 * v1
        s32 += u3 * v2
        s33 += u3 * v3
    return (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)


@register_jitable
def _gather_dy(dy, b0, b1, g, mg, p_, width):
    """``[mg, width]``: ``dy[n, g * mg + m]`` of the samples ``b0..b1`` side by side."""
    m_ = dy.shape[1]
    d2 = np.empty(mg * width, dy.dtype).reshape((mg, width))
    df = dy.reshape(dy.size)
    f2 = d2.reshape(d2.size)
    for n in range(b0, b1):
        for m in range(mg):
            src = U((n * m_ + g * mg + m) * p_)
            dst = U(m * width + (n - b0) * p_)
            for k in range(U(p_)):
                f2[dst + k] = df[src + k]
    return d2


@by_address
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
    per = dx.size // dx.shape[0] if dx.shape[0] > 0 else 0
    zero_run(dxf, n0 * per, (n1 - n0) * per)
    for b0 in range(n0, n1, nb):
        b1 = b0 + nb if b0 + nb < n1 else n1
        width = (b1 - b0) * p_
        for g in range(groups):
            d2 = _gather_dy(dy, b0, b1, g, mg, p_, width)
            c2 = np.empty(k_ * width, dy.dtype).reshape((k_, width))
            blas_gemm(w2[g * mg:(g + 1) * mg].T, d2, c2)
            cf = c2.reshape(k_ * width)
            for n in range(b0, b1):
                _col2im(cf, width, (n - b0) * p_, g * cg, cg, kh_, kw_, sh, sw, pt, pl, dh,
                        dw, oh_, ow_, dx[n])


@register_jitable
def _dw_by_taps(p_, mg, k_) -> bool:
    """Whether the filter gradient of ``mg`` output channels per group, ``k_`` taps and ``p_``
    outputs per channel runs by taps (:func:`_bwd_filter_range`; see :data:`_TAPS_DW_MIN`,
    :data:`_TAPS_DW_MIN_SMALL`) rather than im2col + BLAS (:func:`_bwd_filter_blas`)."""
    return mg >= 4 and k_ >= 4 and (p_ >= _TAPS_DW_MIN or (
        p_ >= _TAPS_DW_MIN_SMALL and mg <= _TAPS_DW_SMALL_ROWS and mg * k_ <= _TAPS_DW_SMALL))


@by_address
@jit
def _bwd_filter_range(x, dy, dwt, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """``dwt = sum over the samples n0..n1 of dy[n] @ col(x[n])^T``, per group, where
    :func:`_dw_by_taps` says so (4+ rows and taps): each sample's image is copied into the
    taps kernel's planes (``kw`` copies of each channel per row phase of the stride, see
    :func:`_fwd_taps`), and each 4x4 block of the gradient is 16 dot products of dy's rows with
    the planes' runs (:func:`_dots44`); the last blocks overlap the ones before them where 4
    does not divide the rows or taps (their repeated sums dropped). The other shapes go by
    :func:`_bwd_filter_blas`, a kernel of its own: a program whose shapes all take this one
    (a small CNN's) compiles no im2col + BLAS path (~0.6 s of CPU cold)."""
    m_, cg, kh_, kw_ = dwt.shape
    mg = m_ // groups
    oh_, ow_ = dy.shape[2], dy.shape[3]
    p_, k_ = oh_ * ow_, cg * kh_ * kw_
    if mg < 4 or k_ < 4:  # (its 4x4 blocks index without bounds checks)
        raise ValueError("pdjit: the taps filter gradient needs 4 or more rows and taps")
    dwf = dwt.reshape(dwt.size)
    zero_run(dwf, 0, dwf.size)
    hq = oh_ + ((kh_ - 1) * dh) // sh
    pp = hq * ow_
    xs = np.empty(cg * kw_ * sh * pp, x.dtype)
    tap = np.empty(k_, np.int64)
    _tap_offsets(tap, k_, 0, kw_, kh_, sh, dh, pp, ow_)
    one = kh_ // kh_  # as in _fwd_taps: the same compiled im2col
    dyf = dy.reshape(dy.size)
    for n in range(n0, n1):
        for g in range(groups):
            for r in range(sh if kh_ > 1 else 1):
                _im2col(x[n], g * cg, cg, one, kw_, sh, sw, pt - r, pl, dh, dw, hq, ow_, xs,
                        sh * pp, r * pp)
            d0 = (n * m_ + g * mg) * p_
            for m4 in range(0, mg, 4):
                mr = m4 if m4 < mg - 4 else mg - 4
                for k4 in range(0, k_, 4):
                    kr = k4 if k4 < k_ - 4 else k_ - 4
                    s = _dots44(dyf, d0 + mr * p_, d0 + (mr + 1) * p_, d0 + (mr + 2) * p_,
                                d0 + (mr + 3) * p_, xs, tap[kr], tap[kr + 1], tap[kr + 2],
                                tap[kr + 3], p_)
                    for r in range(m4 - mr, 4):
                        base = (g * mg + mr + r) * k_ + kr
                        for t in range(k4 - kr, 4):
                            dwf[base + t] += s[r * 4 + t]


@jit
def _bwd_filter_blas(x, dy, dwt, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """``dwt = sum over the samples n0..n1 of dy[n] @ col(x[n])^T``, per group, by im2col and
    BLAS per block of samples (the shapes :func:`_dw_by_taps` leaves out)."""
    m_, cg, kh_, kw_ = dwt.shape
    mg = m_ // groups
    oh_, ow_ = dy.shape[2], dy.shape[3]
    p_, k_ = oh_ * ow_, cg * kh_ * kw_
    dwf = dwt.reshape(dwt.size)
    zero_run(dwf, 0, dwf.size)
    nb = _block(n1 - n0, k_, p_)
    for b0 in range(n0, n1, nb):
        b1 = b0 + nb if b0 + nb < n1 else n1
        width = (b1 - b0) * p_
        cf = np.empty(k_ * width, x.dtype)
        cols = cf.reshape((k_, width))
        for g in range(groups):
            for n in range(b0, b1):
                _im2col(x[n], g * cg, cg, kh_, kw_, sh, sw, pt, pl, dh, dw, oh_, ow_, cf, width,
                        (n - b0) * p_)
            d2 = _gather_dy(dy, b0, b1, g, mg, p_, width)
            # long sums (many columns): the transposed product, [K, M/groups], took 0.72x the
            # time of d2 @ cols.T for [16, 1024] x [1024, 144] (and 1.1-1.3x for 64-192
            # columns); one call site for both (a second cost 0.2 s more compile)
            tr = width >= 512
            part = np.empty(k_ * mg, x.dtype).reshape((k_, mg) if tr else (mg, k_))
            blas_gemm(cols if tr else d2, d2.T if tr else cols.T, part)
            for m in range(mg):
                base = U((g * mg + m) * k_)
                for k in range(k_):
                    dwf[base + U(k)] += part[k, m] if tr else part[m, k]


@jit
def _bias_clamp_range(y, n0, n1, bias, lo, hi, res):
    """:func:`_bias_clamp` on the samples ``n0..n1`` of ``y`` ([N, M, OH, OW]), after the
    BLAS path (which has no epilogue of its own)."""
    m_, p_ = y.shape[1], y.shape[2] * y.shape[3]
    yf = y.reshape(y.size)
    for n in range(n0, n1):
        _bias_clamp(yf, n * m_ * p_, p_, m_, p_, bias, 0, lo, hi, res, n * m_ * p_)


#: a 1x1 convolution (stride 1, no padding) of at least this many output and input channels
#: per group onto planes of at most _GEMM_PLANE outputs is one BLAS product per sample and
#: group, the image read in place: measured (one thread, float32, batch 1, GFLOP/s, the taps
#: kernel / OpenBLAS) 14x14 256->1024 130 / 162, 14x14 1024->256 128 / 159, 28x28 128->512
#: 143 / 161 (measured again since: 100 / 98, see _TAPS_PLANE), 7x7 2048->512 98 / 114; on
#: larger planes or fewer channels the taps kernel (epilogue in L1) won or tied: 56x56
#: 256->64 147 / 120, 112x112 16->96 85 / 64. Over more
#: than _GEMM_SAMPLES samples at once (where BLAS packs the filter again for each) only planes
#: of at most _GEMM_PLANE_MANY outputs: at batch 16, ms, 28x28 512->128 13.2 / 19.0, 512->256
#: 26.6 / 28.4, 128->512 12.4 / 13.6; 14x14 256->1024 13.3 / 11.1, 1024->512 25.5 / 23.6;
#: 7x7 2048->512 16.2 / 13.7
_GEMM_CHANNELS = 32
_GEMM_PLANE = 1024
#: ... except planes of whole vectors (a multiple of 16 positions, which the taps kernel reads
#: in place) of at least this many positions: measured (one thread, float32, bias + relu6,
#: ms, BLAS / taps) at batch 1, 28x28 144 -> 32 0.103 / 0.068, 256 -> 128 0.540 / 0.484,
#: 256 -> 512 2.008 / 1.920, 64 -> 512 0.539 / 0.539; 16x16 512 -> 64 0.201 / 0.156; 32x32
#: 256 -> 256 1.384 / 1.261; at batch 16, 16x16 512 -> 32 3.19 / 1.26, 256 -> 512 11.6 / 11.9;
#: where the taps kernel copies the image first BLAS stays ahead (14x14 144 -> 32 0.019 /
#: 0.037, 18x18 even), and on smaller planes (12x12 64 -> 64 0.012 / 0.013)
_TAPS_PLANE = 256
_GEMM_SAMPLES = 2
_GEMM_PLANE_MANY = 256


@register_jitable
def _use_gemm(x, w, y, sh, sw, pt, pl, groups, n) -> bool:
    """Whether :func:`_fwd_gemm` serves the convolution of ``n`` samples (see
    :data:`_GEMM_CHANNELS`)."""
    m_, cg, kh_, kw_ = w.shape
    p_ = y.shape[2] * y.shape[3]
    return kh_ == 1 and kw_ == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0 and \
        y.shape[2] == x.shape[2] and y.shape[3] == x.shape[3] and \
        p_ <= (_GEMM_PLANE if n <= _GEMM_SAMPLES else _GEMM_PLANE_MANY) and \
        (p_ < _TAPS_PLANE or p_ % 16 != 0) and \
        m_ // groups >= _GEMM_CHANNELS and cg >= _GEMM_CHANNELS


@by_address
@jit
def _fwd_gemm(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` of a 1x1 convolution that
    :func:`_use_gemm` takes: per sample and group one BLAS product of the filter and the
    image's channels in place, then the sample's epilogue while it is in cache (see
    :func:`_fwd_taps`'s). A residual in ``y``'s own buffer is copied a sample at a time
    before the product writes over it."""
    m_, cg = w.shape[0], w.shape[1]
    mg = m_ // groups
    p_ = y.shape[2] * y.shape[3]
    w2 = w.reshape((m_, cg))
    yf = y.reshape(y.size)
    ep = _has_epilogue(bias, lo, hi) or res.size > 0
    keep = res.size > 0 and may_share(res, y)
    rk = np.empty(m_ * p_ if keep else 0, y.dtype)
    for n in range(n0, n1):
        xn = x[n].reshape((x.shape[1], p_))
        yn = y[n].reshape((m_, p_))
        if keep:
            copy_run(res, n * m_ * p_, rk, 0, m_ * p_)
        for g in range(groups):
            blas_gemm(w2[g * mg:(g + 1) * mg], xn[g * cg:(g + 1) * cg], yn[g * mg:(g + 1) * mg])
        if ep:
            _bias_clamp(yf, n * m_ * p_, p_, m_, p_, bias, 0, lo, hi, rk if keep else res,
                        0 if keep else n * m_ * p_)


def _fwd_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """``y[n] = conv(x[n], w)`` for the samples ``n0..n1`` (a filter that :func:`use_direct`
    does not take), then the epilogue ``minimum(maximum(y + bias[m] + res, lo), hi)``
    (``bias`` and ``res``, the residual connection flat as ``y``, empty and infinite bounds:
    none): a 3x3 stride-1 float32 filter by Winograd's F(2x2, 3x3) where
    :func:`.winograd.takes` says so (results within rounding of the taps kernel's, by a
    larger rounding error: see :mod:`.winograd`), else the taps kernel or im2col + BLAS, as
    :func:`_use_taps` picks. Each is a kernel of its own, so that a program compiles only the
    ones its shapes take. (Compiled code, :func:`_fwd_range_native`, runs the taps.) Declared
    ``"leaves"``: a recording replays the kernel it calls (in a native chain with the calls
    around it: MobileNetV3's squeeze-and-excitation products were Python calls between two
    chains)."""
    ep = _has_epilogue(bias, lo, hi) or res.size > 0
    if ep and res.size and res.size != y.size:
        raise ValueError(_MISFIT)
    call = replay.kernel_call
    if _use_gemm(x, w, y, sh, sw, pt, pl, groups, n1 - n0):
        call(_fwd_gemm, x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)
        return
    # (Winograd or not by the whole batch's size, not the range's: a batch split over
    # threads takes the kernel the whole takes, the same bits)
    if winograd.takes(x, w, y, x.shape[0], sh, sw, pt, pl, dh, dw, groups):
        call(winograd.conv3x3, x, w, y, n0, n1, pt, pl, bias, lo, hi, res)
        return
    if _use_taps(w.shape[0] // groups, w[0].size, y.shape[2] * y.shape[3]):
        call(_taps_range, x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res,
             0, -1)
        return
    if res.size and may_share(res, y):  # (a residual in y's buffer: read before written)
        call(_blas_range, x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)
        return
    call(_fwd_blas, x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups)
    if ep:
        call(_bias_clamp_range, y, n0, n1, bias, lo, hi, res)


def _blas_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """:func:`_fwd_range` by im2col + BLAS with a residual in ``y``'s own buffer, copied
    first (a call a recording makes again: the copy is made at each run)."""
    res = res.copy()
    _fwd_blas(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups)
    _bias_clamp_range(y, n0, n1, bias, lo, hi, res)


replay.declare("leaves", _fwd_range)


# ---- the entry points: whole batches, split over threads when large ---------------------------
def _parts(n: int, work: int) -> int:
    """How many threads a batch of ``n`` samples and ``work`` multiply-adds is split over."""
    if n < 2 or work < _PARALLEL_MIN_WORK:
        return 1
    return max(1, min(n, loop_threads()))


def _split(fn, parts, n, *args, head=3):
    """Run ``fn(<head args>, n0, n1, <other args>)`` over ``parts`` slices of ``0..n``, on
    threads (this one takes the first slice; the others on helpers kept off its core:
    ``threads.run_parts``)."""
    lead, tail = args[:head], args[head:]
    run_parts(fn, [(*lead, p * n // parts, (p + 1) * n // parts, *tail) for p in range(parts)],
              parts - 1)


def split_work(fn, n, work, *args, head=2):
    """``fn(<head args>, 0, n, <other args>)``, split over threads when ``work`` (about the
    multiply-adds or reads) is large: for library kernels over independent items (an entry of
    :data:`BATCH_SPLITS` by its own parts). A forward
    convolution of one sample (a kernel of :data:`_BY_CHANNELS`, or an entry of
    :data:`CHANNEL_SPLITS` by its own parts) is split over its output channels instead
    (:func:`split_channels`). A convolution on Winograd's kernel has its filter transformed
    once, before the threads take their parts. A kernel compiled beside the runs runs its
    stand-in, unsplit (``replay.STAND_INS``)."""
    if replay.standing_in(fn):
        replay.kernel_call(fn, *args[:head], 0, n, *args[head:])
        return
    if n > 1:
        parts = _parts(n, work)
        if parts > 1:
            own = BATCH_SPLITS.get(fn)
            if own is not None and own(parts, *args):  # (an entry of another module: its parts)
                return
            if _on_winograd(fn, args):
                winograd.transformed(args[1])  # (once, before the threads ask for it)
            _split(fn, parts, n, *args, head=head)
            return
    elif n == 1 and work >= min(_TEAM_MIN_WORK, _CHANNELS_MIN_WORK):
        # (the free cores asked only for a sample something splits: a blocked kernel's own
        # call, a pooling, run whole)
        own = CHANNEL_SPLITS.get(fn)
        if own is not None or fn in _BY_CHANNELS:
            threads = loop_threads()
            if threads > 1:
                if own is not None:  # (an entry of another module: its own parts)
                    if own(threads, work, *args):
                        return
                elif split_channels(fn, threads, work, args):
                    return
    replay.kernel_call(fn, *args[:head], 0, n, *args[head:])


replay.declare("leaves", split_work)


def _on_winograd(fn, args) -> bool:
    """Whether ``fn(*args)`` (``split_work``'s arguments) is :func:`_fwd_range` on Winograd's
    kernel (asked only where the call is split)."""
    return fn is _fwd_range and winograd.takes(*args[:3], args[0].shape[0], *args[3:10])


#: the fewest multiply-adds of a one-sample convolution split over threads: handing a part to
#: a thread costs tens of microseconds on the 2-vCPU machine (waking an idle core, the inputs
#: read from the other core's cache), so that MobileNetV2's 1x1 convolutions of 5-11 M
#: multiply-adds (0.1-0.25 ms) took longer split (14x14 64 -> 384: 0.10 ms whole, 0.15 split);
#: 112x112 16 -> 96 (19 M) 0.55 / 0.49, ResNet-50's 56x56 64 -> 64 (13 M) 0.195 / 0.17
_CHANNELS_MIN_WORK = 1 << 24
#: a one-sample convolution split over threads: output channels per part are a multiple of
#: this (whole tiles of the taps kernel; and each part, as the whole, has the 32 channels
#: from which a 1x1 convolution runs as one BLAS product, _GEMM_CHANNELS, so that every part
#: takes the kernel the whole takes)
_PART_ROWS = 32
#: ... and of a filter wider than 1x1 off Winograd's kernel (the taps kernel's parts, whose
#: tiles are of 4-8 rows): MobileNetV2's stem (3 -> 32, 3x3 stride 2, 112x112) split in two
#: at batch 1, 0.58 -> 0.38 ms, where 32 channels made one part
_TAPS_PART_ROWS = 16


def _channel_bounds(parts, w, groups, unit=_PART_ROWS):
    """The first output channel of each of at most ``parts`` ranges of a filter's output
    channels (whole groups, else multiples of ``unit`` channels; the last range takes the
    channels left over), then the end; None where there is one range."""
    m_ = w.shape[0]
    unit = m_ // groups if groups > 1 else unit
    units = m_ // unit
    k = min(parts, units)
    if k < 2:
        return None
    return [units * i // k * unit for i in range(k)] + [m_]


#: the fewest multiply-adds of a one-sample convolution split over the threads of a parallel
#: loop (``_by_team``): a split costs a few microseconds while the team polls for work, so
#: that MobileNetV2's depthwise layers of 0.25-1.4 M multiply-adds (30-60 us) gain from it too
#: (the model at batch 1 on two threads 2.2 % faster than from 2 M, the median of 30 ratios
#: of runs taking turns in one process). From 128 K rather than 256 K, the layers between
#: (replayed calls timed in the model at batch 1 on two threads, us, whole / split):
#: MobileNetV2's depthwise 14x14 576 at stride 2 33.5 / 21.4, ShuffleNetV2's eight depthwise
#: layers of 116 channels onto 14x14 and its 14x14 channel shuffle, 197 / 127 in all
_TEAM_MIN_WORK = 1 << 17


def _by_pixels(kernel, parts, args) -> bool:
    """Run ``split_work``'s call of a one-sample forward convolution (``args``; ``kernel``: the
    kernel it runs, :func:`_picked`) in at most ``parts`` ranges of its output positions on the
    threads of a parallel loop, where the taps kernel computes it: whether it did. Every part
    reads the whole filter and its own positions of the image. A 1x1 convolution that reads
    its image in place (stride 1, no padding, whole vectors) splits from two ranges of
    :data:`_PIXEL_UNIT` positions: by output channels each part would read the whole image,
    and a filter of few channels (MobileNetV2's 32 -> 16 at 112x112) makes one part of 32
    channels or parts of unequal sizes (16 -> 96: 32 and 64). Any other splits from
    :data:`_PIXEL_PARTS` ranges a thread (parts within a range of each other in size): each
    part prepares the rows of the kernel's planes its positions read, where each part of a
    split by channels would prepare all of them (ResNet-50's 3x3 stride-2 128 -> 128 at 56x56:
    2.5 MB). One on Winograd's kernel splits by rows of its output (:func:`_wino_by_rows`).
    The same bits as one call (:func:`_taps_range`, :func:`.winograd._wino_range`)."""
    if kernel is winograd.conv3x3_rows:
        return _wino_by_rows(parts, args)
    x, w, y = args[:3]
    g = args[3:10]  # sh, sw, pt, pl, dh, dw, groups
    p_ = y.shape[2] * y.shape[3]
    units = p_ // _PIXEL_UNIT
    plain = w.shape[2] * w.shape[3] == 1 and g[:4] == (1, 1, 0, 0) and \
        y.shape[2:] == x.shape[2:] and p_ % _PIXEL_UNIT == 0
    if kernel is not _fwd_taps or x.dtype not in _TEAM_TYPES or \
            units < (2 if plain else _PIXEL_PARTS * min(parts, units)):
        return False
    k = min(parts, units)
    b = np.array([units * i // k * _PIXEL_UNIT for i in range(k)] + [p_], np.int64)
    return team.run(_taps_by_pixels, (x, w, y, b, *g, args[10], float(args[11]),
                                      float(args[12]), args[13]))


#: a one-sample convolution on Winograd's kernel splits by rows of its output where each part
#: gets this many tiles or more (ResNet-50's 56x56 and 28x28 layers: 392 and 98 tiles a part
#: on two threads); on fewer by output channels, each part transforming the whole image (with
#: ResNet-50's 14x14 layers by rows too, 21-28 tiles a part, the model was 0.5 % slower)
_WINO_ROW_TILES = 64


def _wino_by_rows(parts, args, min_tiles=_WINO_ROW_TILES) -> bool:
    """Run ``split_work``'s call of a one-sample convolution on Winograd's kernel in at most
    ``parts`` ranges of its rows of tiles (:func:`_wino_split`), each of ``min_tiles`` tiles
    or more: each part transforms only
    the rows of the image its tiles read (a split by channels transforms all of it in every
    part) and computes every output channel there, reading mostly the positions that a split
    by positions of the layer before wrote on the same thread. Measured on two threads,
    ResNet-50 at batch 1 with it on and off by turns in one process: its 3x3 layers of 56x56
    and 28x28 ~0.1 ms faster each, the model 0.6-1.3 % faster. Whether it did."""
    y = args[2]
    th, tw = (y.shape[2] + 1) // 2, (y.shape[3] + 1) // 2
    k = min(parts, th)
    if k < 2 or th // k * tw < min_tiles:
        return False
    b = [th * i // k for i in range(k + 1)]
    return _wino_split(args, [(0, y.shape[1], r0, r1) for r0, r1 in zip(b, b[1:])])


def _picked(fn, args):
    """The kernel that ``fn(*args)`` (``split_work``'s call of a one-sample forward
    convolution) runs: ``fn``, or the one :func:`_fwd_range` picks, as it picks it."""
    if fn is not _fwd_range:
        return fn
    x, w, y = args[:3]
    g = args[3:10]  # sh, sw, pt, pl, dh, dw, groups
    if _use_gemm(x, w, y, *g[:4], g[6], 1):
        return _fwd_gemm
    if winograd.takes(x, w, y, 1, *g):
        return winograd.conv3x3_rows
    if _use_taps(w.shape[0] // g[6], w[0].size, y.shape[2] * y.shape[3]):
        return _fwd_taps
    return fn


#: a range of :func:`_by_pixels` is a multiple of this many output positions (whole tiles'
#: vectors of float32 and of float64)
_PIXEL_UNIT = 16
#: ... and a convolution whose image the taps kernel prepares splits by positions from this
#: many such units a part (the last part takes what is left over: 28x28 outputs in two parts
#: of 384 and 400; ResNet-50's 7x7 ones, 3 units, split by channels)
_PIXEL_PARTS = 4


def split_channels(fn, parts, work, args) -> bool:
    """``fn(*args)`` (a forward kernel of :data:`_BY_CHANNELS`, ``split_work``'s arguments:
    one sample) split into at most ``parts`` ranges of its output channels
    (:func:`_channel_bounds`): by a parallel loop (:func:`_by_team`) from
    :data:`_TEAM_MIN_WORK` multiply-adds, else from :data:`_CHANNELS_MIN_WORK` on
    ``run_parts``' helpers (:func:`_channel_calls`). Whether it did."""
    kernel = _picked(fn, args)
    wino = kernel is winograd.conv3x3_rows
    if work >= _TEAM_MIN_WORK and _by_pixels(kernel, parts, args):
        return True
    w = args[1]
    taps = w.shape[2] * w.shape[3] > 1 and not wino
    bounds = _channel_bounds(parts, w, args[9], _TAPS_PART_ROWS if taps else _PART_ROWS)
    if bounds is None:  # too few channels to split: Winograd's kernel by rows of enough
        # tiles (DenseNet's 14x14 128 -> 32 on two threads 0.15 -> 0.10 ms; its 7x7 ones,
        # 8 tiles a part, took longer split than whole)
        return wino and work >= _TEAM_MIN_WORK and \
            _wino_by_rows(parts, args, winograd._MIN_TILES_NEAR)
    if work >= _TEAM_MIN_WORK and _by_team(kernel, args, bounds):
        return True
    if work < _CHANNELS_MIN_WORK:  # (the helpers' hand-over costs more than it saves)
        return False
    calls = _channel_calls(bounds, *args)
    if wino:  # each part its rows of the whole filter's transform
        ut = winograd.transformed(args[1])
        calls = [(c[0], ut, a, c[2], 0, 1, c[7], c[8], *c[12:]) for a, c in zip(bounds, calls)]
        fn = winograd.conv3x3_rows
    run_parts(fn, calls, len(calls) - 1)
    return True


def _by_team(kernel, args, bounds) -> bool:
    """Run ``split_work``'s call of a one-sample forward convolution (``args``; ``kernel``: the
    kernel it runs, :func:`_picked`) over the ranges ``bounds`` of its output channels
    (:func:`_channel_bounds`) on the threads of a parallel loop (:mod:`.team`: native threads,
    no GIL; each part the views :func:`_channel_calls` makes, the same bits as one thread):
    whether it did (not for a kernel without such a loop, nor before the loop is compiled)."""
    x, w, y = args[:3]
    g = args[3:10]  # sh, sw, pt, pl, dh, dw, groups
    if x.dtype not in _TEAM_TYPES:
        return False
    run = _TEAM_RUNS.get(kernel)
    if run is None:
        return False
    if run is _wino_parts:
        return _wino_split(args, [(a, b, 0, -1) for a, b in zip(bounds, bounds[1:])])
    b = np.array(bounds, np.int64)
    bias, lo, hi = args[10], float(args[11]), float(args[12])
    if run is _direct_by_channels:
        call = (x, w, y, b, *g, bias, lo, hi)
    else:
        call = (x, w, y, b, *g, bias, lo, hi, args[13])
    return team.run(run, call)


def _wino_split(args, parts) -> bool:
    """Run ``split_work``'s call of a one-sample convolution on Winograd's kernel (``args``)
    in ``parts`` ((first output channel, end, first row of tiles, end) each) on the threads
    of a parallel loop (:func:`_wino_parts`), the filter transformed once: whether it did."""
    x, w, y = args[:3]
    ut = winograd.transformed(w)
    need = winograd.scratch_size.py_func(x.shape[1], max(b - a for a, b, _, _ in parts),
                                         y.shape[2], y.shape[3], 1)
    call = (x, ut, y, np.array(parts, np.int64), args[5], args[6], args[10], float(args[11]),
            float(args[12]), args[13], winograd._scratch(need * len(parts)), need)
    if not team.run(_wino_parts, call):
        return False
    winograd.CALLS[0] += 1
    return True


_TEAM_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


@register_jitable
def _part_out(y, bias, res, a, b):
    """Output channels ``a..b`` of a one-sample convolution: its output, bias and residual
    (flat as the output), as views of the whole's."""
    p_ = y.shape[2] * y.shape[3]
    return (y[0, a:b].reshape((1, b - a, y.shape[2], y.shape[3])),
            bias[a:b] if bias.shape[0] else bias[:0], res[a * p_:b * p_] if res.shape[0] else
            res[:0])


@register_jitable
def _part(x, w, y, groups, bias, res, a, b):
    """Output channels ``a..b`` of a one-sample convolution: its image (the channels of those
    groups), filter, output, groups, bias and residual, as views of the whole's."""
    m_, cg = w.shape[0], w.shape[1]
    mg = m_ // groups
    xs = x
    g = 1
    if groups > 1:
        xc = x[0, a // mg * cg:b // mg * cg]
        xs = xc.reshape((1, xc.shape[0], x.shape[2], x.shape[3]))
        g = (b - a) // mg
    ys, bs, rs = _part_out(y, bias, res, a, b)
    return xs, w[a:b], ys, _plain(g), bs, rs


@pjit
def _taps_by_channels(x, w, y, bounds, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """:func:`_fwd_taps` of one sample, ranges ``bounds`` of output channels in parallel."""
    for p in numba.prange(bounds.shape[0] - 1):
        xs, ws, ys, g, bs, rs = _part(x, w, y, groups, bias, res, bounds[p], bounds[p + 1])
        _fwd_taps(xs, ws, ys, _plain(0), _plain(1), sh, sw, pt, pl, dh, dw, g, bs, lo, hi, rs)


@pjit
def _taps_by_pixels(x, w, y, bounds, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """:func:`_fwd_taps` of one sample, ranges ``bounds`` of output positions in parallel."""
    for p in numba.prange(bounds.shape[0] - 1):
        _taps_range(x, w, y, _plain(0), _plain(1), sh, sw, pt, pl, dh, dw, groups, bias, lo, hi,
                    res, bounds[p], bounds[p + 1])


@pjit
def _gemm_by_channels(x, w, y, bounds, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """:func:`_fwd_gemm` of one sample, ranges ``bounds`` of output channels in parallel."""
    for p in numba.prange(bounds.shape[0] - 1):
        xs, ws, ys, g, bs, rs = _part(x, w, y, groups, bias, res, bounds[p], bounds[p + 1])
        _fwd_gemm(xs, ws, ys, _plain(0), _plain(1), sh, sw, pt, pl, dh, dw, g, bs, lo, hi, rs)


@pjit
def _direct_by_channels(x, w, y, bounds, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi):
    """:func:`_direct_range` of one sample, ranges ``bounds`` of output channels (whole
    groups) in parallel."""
    for p in numba.prange(bounds.shape[0] - 1):
        xs, ws, ys, g, bs, _ = _part(x, w, y, groups, bias, bias[:0], bounds[p],
                                     bounds[p + 1])
        _direct_range(xs, ws, ys, _plain(0), _plain(1), sh, sw, pt, pl, dh, dw, g, bs, lo, hi)


@pjit
def _wino_parts(x, ut, y, parts, pt, pl, bias, lo, hi, res, scratch, need):
    """Winograd's kernel (:func:`.winograd.conv3x3_rows`) of one sample in parallel parts:
    ``parts[p]`` = (first output channel, end, first row of tiles, end (-1: the last)), each
    part with its rows of the whole filter's transform ``ut`` and its own ``need`` values of
    ``scratch`` (a split by output channels, or by rows of the output: :func:`_wino_split`)."""
    for p in numba.prange(parts.shape[0]):
        a, b = parts[p, 0], parts[p, 1]
        ys, bs, rs = _part_out(y, bias, res, a, b)
        winograd._wino_range(x, ut, a, ys, _plain(0), _plain(1), pt, pl, bs, lo, hi, rs,
                             scratch[p * need:(p + 1) * need], parts[p, 2], parts[p, 3])


#: the kernels split by :func:`_by_team`, and the parallel loop that splits each
_TEAM_RUNS = {_fwd_taps: _taps_by_channels, _fwd_gemm: _gemm_by_channels,
              _direct_range: _direct_by_channels, winograd.conv3x3_rows: _wino_parts}


def _channel_calls(bounds, x, w, y, sh, sw, pt, pl, dh, dw, groups, *epilogue):
    """The arguments of a forward kernel's calls (``fn(x, w, y, 0, 1, <geometry>, [bias, lo,
    hi, [res]])``) for the ranges ``bounds`` (:func:`_channel_bounds`) of the output channels
    of a one-sample convolution; each range's image, filter, output, bias and residual are
    views of the whole's (contiguous: one sample).
    Each output is the sum the whole call computes, in the same order (the kernels sum each
    output over the taps in order whatever the rows around it; Winograd's parts take rows of
    the whole filter's transform: ``split_work``), so the result does not depend on the
    split.

    Measured on the 2-vCPU machine, ResNet-50's convolutions at batch 1, 1 vs 2 parts (ms):
    3x3 64 -> 64 56x56 1.72 / 1.05, 1x1 64 -> 256 56x56 0.80 / 0.47, 3x3 512 -> 512 7x7
    2.29 / 1.38, the 7x7/2 stem 1.61 / 1.15, 1x1 2048 -> 512 7x7 (BLAS) 1.18 / 0.66."""
    m_, cg = w.shape[0], w.shape[1]
    mg = m_ // groups
    p_ = y.shape[2] * y.shape[3]
    calls = []
    for a, b in zip(bounds, bounds[1:]):
        xs = x[:, a // mg * cg:b // mg * cg] if groups > 1 else x
        tail = list(epilogue)
        if tail and tail[0].size:  # the bias, per channel
            tail[0] = tail[0][a:b]
        if len(tail) > 3 and tail[3].size:  # the residual, flat as y
            tail[3] = tail[3][a * p_:b * p_]
        calls.append((xs, w[a:b], y[:, a:b], 0, 1, sh, sw, pt, pl, dh, dw,
                      (b - a) // mg if groups > 1 else 1, *tail))
    return calls


_MISFIT = "pdjit: convolution operands do not fit each other"


def _fits(image, out, w, groups) -> bool:
    """Whether an image [N, C, H, W], an output [N, M, OH, OW] and a filter [M, C/groups, KH,
    KW] fit (the kernels index without bounds checks: a misfit must not reach them)."""
    return groups >= 1 and w.shape[0] % groups == 0 and image.shape[1] == w.shape[1] * groups \
        and out.shape[1] == w.shape[0] and image.shape[0] == out.shape[0] and \
        min(w.shape[2], w.shape[3]) >= 1


def _fwd_kernel(x, w, y, groups, sh=1, sw=1, pt=0, pl=0):
    """The forward kernel that serves a filter ``w`` onto outputs ``y``: the direct loops
    (:func:`use_direct`), a BLAS product per sample (:func:`_use_gemm`), the taps
    (:func:`_use_taps`) or im2col + BLAS."""
    m_, cg, kh_, kw_ = w.shape
    if use_direct(cg, m_ // groups):
        return _direct_range
    if _use_gemm(x, w, y, sh, sw, pt, pl, groups, x.shape[0]):
        return _fwd_gemm
    return _fwd_taps if _use_taps(m_ // groups, cg * kh_ * kw_, y.shape[2] * y.shape[3]) \
        else _fwd_blas


#: the forward kernels whose one-sample calls :func:`split_work` splits over output channels
_BY_CHANNELS = frozenset((_fwd_range, _fwd_taps, _fwd_gemm, _fwd_blas, _direct_range))
#: other entries whose one-sample calls :func:`split_work` splits over output channels: ``{fn:
#: split(threads, work, *args)}``, ``split`` running the call in at most ``threads`` parts
#: where that pays, and returning whether it did (the entries of other modules register
#: here: :mod:`.pointwise`; see :func:`split_channels`)
CHANNEL_SPLITS: dict = {}
#: entries whose batches :func:`split_work` splits by their own parts rather than by samples on
#: ``run_parts``' helpers: ``{fn: split(threads, *args)}`` (``fn``'s arguments without the
#: sample range), ``split`` running the whole batch in at most ``threads`` parts where it can,
#: and returning whether it did (:mod:`.pgemm`: a product by a weight, by blocks of rows on a
#: parallel loop)
BATCH_SPLITS: dict = {}


def conv2d_fwd(x, w, y, sh, sw, pt, pl, dh, dw, groups):
    """``y = conv(x, w)`` (NCHW): ``y`` is written, not read."""
    if not _fits(x, y, w, groups):
        raise ValueError(_MISFIT)
    fn = _fwd_kernel(x, w, y, groups, sh, sw, pt, pl)
    e = np.empty(0, x.dtype)
    none = () if fn is _fwd_blas else (e, -np.inf, np.inf) if fn is _direct_range else \
        (e, -np.inf, np.inf, e)
    split_work(fn, x.shape[0], y.size * w[0].size, x, w, y, sh, sw, pt, pl, dh, dw, groups,
               *none, head=3)


@register_jitable
def by_forward(w, p_, sh, sw, pt, pl, dh, dw, groups) -> bool:
    """Whether ``conv^T(dy, w)`` onto planes of ``p_`` pixels runs as the forward convolution
    of ``dy`` with the flipped, transposed filter (:func:`_flip_into`): for stride 1 (the
    image gradient is then a plain correlation of ``dy``) with top/left paddings of at most
    the filter's reach, where that forward convolution takes the taps kernel or the direct
    loops (which skip the im2col/col2im copies that BLAS needs around them).

    Measured on the ResNet's 16->16 3x3 32x32 layer at batch 32, one thread: 5.1 ms by
    BLAS + col2im, 1.9 ms this way."""
    m_, cg, kh_, kw_ = w.shape
    if sh != 1 or sw != 1 or pt > (kh_ - 1) * dh or pl > (kw_ - 1) * dw or pt < 0 or pl < 0:
        return False
    mg = m_ // groups
    # (the taps kernel computes 4 output channels per group at least: not for fewer)
    return use_direct(mg, cg) or (cg >= 4 and _use_taps(cg, mg * kh_ * kw_, p_))


@jit
def _flip_into(w, groups, wt):
    """``wt[g * cg + c, m, KH-1-i, KW-1-j] = w[g * mg + m, c, i, j]``: the filter ([M, C/groups,
    KH, KW]) of the convolution whose output is ``conv``'s stride-1 transposed convolution
    ([C, M/groups, KH, KW]; its paddings: ``(KH-1) * dh - pt`` and ``(KW-1) * dw - pl``)."""
    m_, cg, kh_, kw_ = w.shape
    mg = m_ // groups
    for g in range(groups):
        for m in range(mg):
            for c in range(cg):
                for i in range(kh_):
                    for j in range(kw_):
                        wt[g * cg + c, m, kh_ - 1 - i, kw_ - 1 - j] = w[g * mg + m, c, i, j]


def _flipped(w, groups):
    """:func:`_flip_into` in NumPy (the host's call: no kernel to compile)."""
    m_, cg, kh_, kw_ = w.shape
    mg = m_ // groups
    v = w.reshape(groups, mg, cg, kh_, kw_)[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(v).reshape(groups * cg, mg, kh_, kw_)


def conv2d_bwd_data(dy, w, dx, sh, sw, pt, pl, dh, dw, groups):
    """``dx = conv^T(dy, w)`` (NCHW): the gradient of ``conv`` for its input; ``dx`` is
    overwritten. (It is also the transposed convolution of ``dy``.)"""
    if not _fits(dx, dy, w, groups):
        raise ValueError(_MISFIT)
    if by_forward(w, dx.shape[2] * dx.shape[3], sh, sw, pt, pl, dh, dw, groups):
        _, _, kh_, kw_ = w.shape
        conv2d_fwd(dy, _flipped(w, groups), dx, 1, 1, (kh_ - 1) * dh - pt, (kw_ - 1) * dw - pl,
                   dh, dw, groups)
        return
    split_work(_bwd_data_range, dy.shape[0], dy.size * w[0].size, dy, w, dx, sh, sw, pt, pl,
               dh, dw, groups, head=3)


def conv2d_bwd_filter(x, dy, dwt, sh, sw, pt, pl, dh, dw, groups):
    """``dwt`` = the gradient of ``conv(x, w)`` for ``w``, contracted with ``dy`` (NCHW);
    ``dwt`` (shaped like the filter) is overwritten."""
    if not _fits(x, dy, dwt, groups):
        raise ValueError(_MISFIT)
    n = x.shape[0]
    m_, cg, kh_, kw_ = dwt.shape
    fn = _bwd_filter_range if _dw_by_taps(dy.shape[2] * dy.shape[3], m_ // groups,
                                          cg * kh_ * kw_) else _bwd_filter_blas
    parts = _parts(n, dy.size * dwt[0].size)
    if parts == 1:
        fn(x, dy, dwt, 0, n, sh, sw, pt, pl, dh, dw, groups)
        return
    acc = np.empty((parts,) + dwt.shape, dwt.dtype)
    run_parts(fn, [(x, dy, acc[p], p * n // parts, (p + 1) * n // parts, sh, sw, pt, pl, dh,
                    dw, groups) for p in range(parts)], parts - 1)
    np.sum(acc, axis=0, out=dwt)


def _range_types(T):
    """Argument types of the ``*_range`` kernels: three 4-D arrays, a range, the geometry."""
    return ((T, 4), (T, 4), (T, 4)) + (int,) * 9


def _epilogue_types(T):
    """Argument types of the forward kernels with an epilogue (:func:`_direct_range`; with
    :func:`_residual_types`, :func:`_fwd_taps`): the ``*_range`` ones, then a 1-D bias and two
    bounds."""
    return _range_types(T) + ((T, 1), float, float)


def _residual_types(T):
    """Argument types of the taps kernel: :func:`_epilogue_types`, then a flat residual."""
    return _epilogue_types(T) + ((T, 1),)


def _taps_types(T):
    """Argument types of :func:`_taps_range`: :func:`_residual_types`, then the range of
    output positions."""
    return _residual_types(T) + (int, int)


# (the kernels most programs' shapes take: a stride-1 input gradient runs as the forward
# kernel over dy, see by_forward; small forward planes (im2col + BLAS), depthwise filters
# (direct loops) and the filter gradients that _dw_by_taps leaves to BLAS compile on their
# first call)
jobs("conv2d_fwd")(lambda T: [(_taps_range, _taps_types(T))])
jobs("conv2d_bwd_data")(lambda T: [(_bwd_data_range, _range_types(T)),
                                   (_taps_range, _taps_types(T))])
jobs("conv2d_bwd_filter")(lambda T: [(_bwd_filter_range, _range_types(T))])  # (the taps)
#: :func:`conv2d_bwd_filter` itself, under the name a lowering calls when the sizes it knows
#: say that the gradient runs by im2col + BLAS (:func:`_dw_by_taps` says no), so that its
#: compile jobs name that kernel, not the taps one (~1.9 s of CPU cold, for nothing)
conv2d_bwd_filter_by_blas = conv2d_bwd_filter
jobs("conv2d_bwd_filter_by_blas")(lambda T: [(_bwd_filter_blas, _range_types(T))])
#: :func:`conv2d_bwd_data` itself, under the name a lowering calls when the sizes it knows say
#: that the gradient runs as the taps kernel over dy (:func:`by_forward`), so that its compile
#: jobs name that kernel alone (the other sizes' :func:`_bwd_data_range`: ~1 s of CPU cold)
conv2d_bwd_data_by_taps = conv2d_bwd_data
jobs("conv2d_bwd_data_by_taps")(lambda T: [(_taps_range, _taps_types(T))])
# a convolution by blocks of samples with a fused bias / residual / clamp (the lowerings call
# ``_nn.conv._fwd_range`` or ``_nn.conv._direct_range``): the taps kernel, and the BLAS
# product of the 1x1 convolutions of many channels (the blocks of a ResNet); the im2col path
# of small planes compiles on its first call
jobs("conv._fwd_range")(lambda T: [(_taps_range, _taps_types(T)),
                                   (_fwd_gemm, _residual_types(T))])
#: :func:`_fwd_range` itself, under the name a lowering calls for a filter that Winograd may
#: take (:func:`.winograd.may_take`), so that only such programs compile its kernels (1.6 s of
#: CPU cold: not for LeNet's 5x5 filters)
_fwd_range_3x3 = _fwd_range
jobs("conv._fwd_range_3x3")(lambda T: [(_taps_range, _taps_types(T))] + winograd.jobs(T))
jobs("conv._direct_range")(lambda T: [(_direct_range, _epilogue_types(T))])


@jit
def _subsample_rows(x, sh, sw, out, r0, r1):
    """Rows ``r0 .. r1`` of ``out`` (its ``N * C * OH`` rows of ``OW``) = ``x[:, :, ::sh,
    ::sw]``'s (:func:`subsample`)."""
    h_, w_ = x.shape[2], x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    for r in range(r0, r1):
        src = U((r // oh * h_ + r % oh * sh) * w_)
        dst = U(r * ow)
        for j in range(U(ow)):
            of[dst + j] = xf[src + j * U(sw)]


@pjit
def _subsample_by_team(x, sh, sw, out, parts):
    """:func:`_subsample_rows` of every row in ``parts`` ranges, one a thread of a parallel
    loop (``lib.team``)."""
    rows = out.shape[0] * out.shape[1] * out.shape[2]
    for p in numba.prange(parts):
        _subsample_rows(x, sh, sw, out, p * rows // parts, (p + 1) * rows // parts)


@register_jitable
def _subsample_fits(x, sh, sw, out) -> bool:
    n_, c_, h_, w_ = x.shape
    oh, ow = out.shape[2], out.shape[3]
    return out.shape[0] == n_ and out.shape[1] == c_ and sh >= 1 and sw >= 1 and \
        (oh == 0 or (oh - 1) * sh < h_) and (ow == 0 or (ow - 1) * sw < w_)


#: the fewest values a :func:`subsample` copies on the parallel loops' threads (each value read
#: from beyond the L2 cache costs more than the multiply-add of ``_TEAM_MIN_WORK``)
SUBSAMPLE_TEAM_MIN = 1 << 16
_SUBSAMPLE_MISFIT = "pdjit: subsample: the output does not fit the image"


def subsample(x, sh, sw, out):
    """``out[...] = x[:, :, ::sh, ::sw]`` ([N, C, H, W]), its first ``OH`` rows of ``OW``
    columns (``out``'s, C-contiguous): the image a 1x1 unpadded convolution of strides ``sh,
    sw`` reads, which then runs as a stride-1 one on the row tiles of the packed GEMM (the
    convolution lowering's ``_subsampled``, which allocates ``out`` in the driver). A copy of
    :data:`SUBSAMPLE_TEAM_MIN` values or more is split by rows over the parallel loops'
    threads where their loop is ready. ResNet-50's 56x56 256-channel shortcut at batch 1 (a
    copy from beyond the L2 cache), in the model on two threads: 93-137 us returning a new
    array (copied into the driver's by its replay), 69 us split into the driver's."""
    if not _subsample_fits(x, sh, sw, out):
        raise ValueError(_SUBSAMPLE_MISFIT)
    rows = out.shape[0] * out.shape[1] * out.shape[2]
    if out.size >= SUBSAMPLE_TEAM_MIN:
        parts = min(rows, loop_threads())
        if parts > 1 and team.run(_subsample_by_team, (x, sh, sw, out, parts)):
            return
    replay.kernel_call(_subsample_rows, x, sh, sw, out, 0, rows)


replay.declare("leaves", subsample)


@overload(subsample)
def _subsample_native(x, sh, sw, out):
    def impl(x, sh, sw, out):
        if not _subsample_fits(x, sh, sw, out):
            raise ValueError(_SUBSAMPLE_MISFIT)
        _subsample_rows(x, _plain(sh), _plain(sw), out, _plain(0),
                        out.shape[0] * out.shape[1] * out.shape[2])
    return impl


jobs("conv.subsample")(lambda T: [(_subsample_rows, ((T, 4), int, int, (T, 4), int, int))])
compile_cost(0.4, _subsample_rows)
# the kernels of the other shapes (forward, filter gradient): compiled ahead by ``pdjit warmup``
# only (names no lowering calls, so no plan's compile worker spends time on them)
jobs("conv2d_fwd (warmup)")(lambda T: [(_fwd_blas, _range_types(T))])
jobs("conv2d_bwd_filter (warmup)")(lambda T: [(_bwd_filter_blas, _range_types(T))])


def _team_jobs(T) -> list:
    """The compile jobs of :func:`_by_team`'s parallel loops for data of NumPy type ``T``
    (compiled ahead by ``pdjit warmup`` and the background warmup only: see
    :func:`.team.ready`)."""
    split = ((T, 4), (T, 4), (T, 4), (np.int64, 1)) + (int,) * 7 + ((T, 1), float, float)
    found = [(_taps_by_channels, split + ((T, 1),)), (_taps_by_pixels, split + ((T, 1),)),
             (_gemm_by_channels, split + ((T, 1),)), (_direct_by_channels, split)]
    found.append((_subsample_by_team, ((T, 4), int, int, (T, 4), int)))
    if np.dtype(T) == np.float32:
        found.append((_wino_parts, ((T, 4), (T, 3), (T, 4), (np.int64, 2), int, int,
                                    (T, 1), float, float, (T, 1), (T, 1), int)))
    return found


jobs("conv._by_team (warmup)")(_team_jobs)


_fits_native = register_jitable(_fits)
replay.declare("pure", _fits_native)


@register_jitable
def _plain(v):
    """``v`` as a plain value. A constant that compiled code passes (generated code writes the
    geometry as numbers: literal types) would compile the kernel it reaches again, for that
    constant: every ``_range`` kernel is called with plain ints and arrays only (measured:
    a native caller's ``0`` first sample compiled ``_fwd_range`` a second time, ~3 s)."""
    return v


@register_jitable
def _geometry(sh, sw, pt, pl, dh, dw, groups):
    """The geometry arguments as plain ints (see :func:`_plain`)."""
    return (_plain(sh), _plain(sw), _plain(pt), _plain(pl), _plain(dh), _plain(dw),
            _plain(groups))


@register_jitable
def _fwd_native(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups):
    """The forward kernel that :func:`_fwd_kernel` picks, called from compiled code."""
    g = _geometry(sh, sw, pt, pl, dh, dw, groups)
    m_, cg, kh_, kw_ = w.shape
    none, lo, hi = np.empty(0, x.dtype), _plain(-np.inf), _plain(np.inf)
    if use_direct(cg, m_ // groups):
        _direct_range(x, w, y, _plain(n0), _plain(n1), *g, none, lo, hi)
    elif _use_gemm(x, w, y, sh, sw, pt, pl, groups, n1 - n0):
        _fwd_gemm(x, w, y, _plain(n0), _plain(n1), *g, none, lo, hi, none)
    elif _use_taps(m_ // groups, cg * kh_ * kw_, y.shape[2] * y.shape[3]):
        _fwd_taps(x, w, y, _plain(n0), _plain(n1), *g, none, lo, hi, none)
    else:
        _fwd_blas(x, w, y, _plain(n0), _plain(n1), *g)


# inside compiled code (a native loop's driver): the whole batch on this thread, the taps
# kernel with the epilogue (which applies none where its arguments ask for none).
# As in Python, the taps or BLAS (a depthwise filter's caller calls _direct_range itself: its
# kernel is not compiled into every caller of this one, ~2.3 s cold)
@overload(_fwd_range)
def _fwd_range_native(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    def impl(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
        g = _geometry(sh, sw, pt, pl, dh, dw, groups)
        m_, cg, kh_, kw_ = w.shape
        lo_, hi_ = _plain(float(lo)), _plain(float(hi))
        if res.size and res.size != y.size:
            raise ValueError(_MISFIT)
        if _use_gemm(x, w, y, sh, sw, pt, pl, groups, n1 - n0):
            _fwd_gemm(x, w, y, _plain(n0), _plain(n1), *g, bias, lo_, hi_, res)
        elif _use_taps(m_ // groups, cg * kh_ * kw_, y.shape[2] * y.shape[3]):
            _fwd_taps(x, w, y, _plain(n0), _plain(n1), *g, bias, lo_, hi_, res)
        else:
            rs = res.copy() if res.size > 0 and may_share(res, y) else res
            _fwd_blas(x, w, y, _plain(n0), _plain(n1), *g)
            if _has_epilogue(bias, lo_, hi_) or res.size > 0:
                _bias_clamp_range(y, _plain(n0), _plain(n1), bias, lo_, hi_, rs)
    return impl


@overload(_fwd_taps)
def _fwd_taps_native(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    def impl(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
        _taps_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res,
                    _plain(0), _plain(-1))
    return impl


@overload(conv2d_fwd)
def _conv2d_fwd_native(x, w, y, sh, sw, pt, pl, dh, dw, groups):
    def impl(x, w, y, sh, sw, pt, pl, dh, dw, groups):
        if not _fits_native(x, y, w, groups):
            raise ValueError(_MISFIT)
        _fwd_native(x, w, y, 0, x.shape[0], sh, sw, pt, pl, dh, dw, groups)
    return impl


@overload(conv2d_bwd_data)
def _conv2d_bwd_data_native(dy, w, dx, sh, sw, pt, pl, dh, dw, groups):
    def impl(dy, w, dx, sh, sw, pt, pl, dh, dw, groups):
        if not _fits_native(dx, dy, w, groups):
            raise ValueError(_MISFIT)
        m_, cg, kh_, kw_ = w.shape
        if by_forward(w, dx.shape[2] * dx.shape[3], sh, sw, pt, pl, dh, dw, groups):
            wt = np.empty((cg * groups, m_ // groups, kh_, kw_), w.dtype)
            _flip_into(w, groups, wt)
            _fwd_native(dy, wt, dx, 0, dy.shape[0], sh, sw, (kh_ - 1) * dh - pt,
                        (kw_ - 1) * dw - pl, dh, dw, groups)
            return
        _bwd_data_range(dy, w, dx, _plain(0), dy.shape[0],
                        *_geometry(sh, sw, pt, pl, dh, dw, groups))
    return impl


@overload(conv2d_bwd_filter)
def _conv2d_bwd_filter_native(x, dy, dwt, sh, sw, pt, pl, dh, dw, groups):
    def impl(x, dy, dwt, sh, sw, pt, pl, dh, dw, groups):
        if not _fits_native(x, dy, dwt, groups):
            raise ValueError(_MISFIT)
        m_, cg, kh_, kw_ = dwt.shape
        g = _geometry(sh, sw, pt, pl, dh, dw, groups)
        if _dw_by_taps(dy.shape[2] * dy.shape[3], m_ // groups, cg * kh_ * kw_):
            _bwd_filter_range(x, dy, dwt, _plain(0), x.shape[0], *g)
        else:
            _bwd_filter_blas(x, dy, dwt, _plain(0), x.shape[0], *g)
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

# compile times (CPU seconds, a cold compile of the signature its jobs predict, alone in a fresh
# process, 2 cores at load 5-26): the compile worker balances its groups by them
compile_cost(2.4, _taps_range, _direct_range)  # 2.25-2.5, 2.35 s
compile_beside(_taps_range, _direct_range)
replay.STAND_INS[_taps_range] = _taps_range_numpy
replay.STAND_INS[_direct_range] = _direct_numpy
compile_cost(1.9, _bwd_filter_range)
compile_cost(1.25, _bwd_data_range, _fwd_blas)  # 1.23, 1.26 s
compile_cost(0.7, _fwd_gemm)
# (each parallel loop compiles its kernel into it again: 2.1, 1.6, 0.7 s; Winograd's ~1.3)
compile_cost(2.1, _taps_by_channels, _taps_by_pixels)
compile_cost(1.6, _direct_by_channels)
compile_cost(0.7, _gemm_by_channels)
compile_cost(1.3, _wino_parts)


# (pgemm is loaded before this module ends: winograd imports it)
from pdjit.codegen.cpu.lib import pgemm as _pgemm  # noqa: E402

BATCH_SPLITS[_pgemm.weight_rows] = _pgemm._split_batch
