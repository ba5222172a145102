"""Convolutions on channels-last (NHWC) images, float32: the layout the inference pass
``channels_last`` (:mod:`pdjit.passes.layout`) gives the chains of convolutions these kernels
serve, so that the image is converted once at the chain's ends instead of at each op.

- :func:`pointwise_nhwc`: a 1x1 stride-1 unpadded convolution of one group is the product
  ``y[p, :] = x[p, :] @ W^T`` over the pixels ``p`` (each pixel's channels contiguous): the
  packed GEMM's tile (:mod:`.pgemm`) reads ``MR`` pixels' rows in place and ``W^T`` packed
  once in panels of output channels, the epilogue (a bias per output channel, a residual, a
  clamp, then hard_swish or hard_sigmoid: :func:`.tile.gate_of`) applied in registers. Two
  tiles by the output channels (:func:`panel_of`): 6 pixels by 64 channels, or 12 pixels by
  32 where 32-wide panels waste fewer lanes (MobileNetV2's projections to 16, 24, 32 and 96
  channels).
- :func:`depthwise_nhwc`: one filter per channel (``groups`` = channels, one output channel
  each), any window, stride, padding and dilation: tiles of 6 neighbouring output pixels by
  32 channels kept in vector registers over all the taps (:func:`_dw_kernel`, LLVM IR; for
  3x3 filters at stride 1 and 2 each image column of a filter row loaded once for all the
  tile's pixels that read it), the pixels of the padded border one at a time over their taps
  in the image, the epilogue applied before the one store.
- :func:`conv_nhwc`: any other convolution of one group (3x3, and 1x1 at stride 2: ResNet's
  layers onto 14x14 and 7x7 planes): pgemm's tile reading each step's tap in the image (a
  zero-padded copy of the rows a call reads where the window reaches past the image), 7
  pixels of an output row by 64 output channels, the filter packed in panels of the taps'
  channels (:func:`conv_nhwc_weight`), each panel taken by chunks that stay in the L1 cache
  while every tile reads them (:data:`CONV_CHUNK_BYTES`); bias, residual and clamp in
  registers, stored by rows. A 1x1 unpadded window at a stride gathers the pixels it reads
  and runs the 1x1 layers' product on them (:func:`_gathered_pointwise`).
- :func:`winograd_nhwc`: a 3x3 stride-1 convolution by Winograd's F(2x2, 3x3) (the transforms
  of :mod:`.winograd`): each tile's 4x4 inputs are 16 vectors of its pixels' channels, so
  both transforms are vector adds across the channels, and the 16 products run on pgemm's
  tile over the transformed filter packed once, as the 1x1 layers' do. Alone, one thread, ms,
  against :func:`conv_nhwc`: ResNet-50's 14x14 256 -> 256 at batch 1 3.4 / 7.1, 7x7 512 ->
  512 6.6 / 9.8; at batch 16 53 / 117 and 64 / 120 (the NCHW Winograd kernel 76 and 81).

Each takes the samples ``n0 .. n1`` (``Opaque.blocked``); one sample is split over threads by
rows of pixels or panels of output channels (:func:`_split_pointwise`,
:func:`_split_depthwise`, :func:`_split_conv`, for ``conv.split_work``). A weight (a
parameter no op of the program writes) is rearranged once (:func:`pointwise_nhwc_weight`,
:func:`depthwise_nhwc_weight`, :func:`conv_nhwc_weight`, kept beside the array,
:func:`pdjit.codegen.params.derived`); compiled code (a native driver, an ahead-of-time
artifact) rearranges it at each call (``@overload``), a copy of the filter's size.
"""
import llvmlite.ir as ir
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic, overload, register_jitable

from pdjit.codegen import params
from pdjit.codegen.cpu import replay
from pdjit.codegen.cpu.lib import conv as _conv
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib import winograd as _wino
from pdjit.codegen.cpu.lib._jit import by_address, compile_beside, compile_cost, jit, jobs, pjit
from pdjit.codegen.cpu.lib.pgemm import (
    MR,
    NV,
    PREFETCH_ROWS,
    _micro_kernel,
    _micro_spread,
    _packed_rows,
    chunk_epilogue,
    run_chunks,
    spread_share,
)
from pdjit.codegen.cpu.lib.tile import (
    PREFETCH_FILLS_L1,
    _edge_load,
    _masked,
    _offset,
    _splat,
    _store,
    _vectors,
    gate_of,
    gated,
    sum_passes,
)
from pdjit.codegen.cpu.threads import numpy_blas_calls

__all__ = ["MAX_PLANE", "conv_nhwc", "conv_nhwc_weight", "depthwise_nhwc",
           "depthwise_nhwc_weight", "panel_of", "pointwise_nhwc", "pointwise_nhwc_weight",
           "winograd_nhwc", "winograd_nhwc_weight"]

#: the narrow tile: ``NARROW_MR`` pixels by ``NARROW_NV`` vectors of output channels
NARROW_MR, NARROW_NV = 12, 2
_narrow = _micro_kernel(NARROW_MR, NARROW_NV, PREFETCH_ROWS, gate=True)
_WIDE_NR, _NARROW_NR = NV * 16, NARROW_NV * 16  # (float32)
#: the largest planes (input and output pixels) the channels-last kernels take in a model
#: (``lowerings.conv.channels_last``): MobileNetV2 at batch 16, one thread, ms, NCHW kernels /
#: these: 1x1 at 14x14 384->64 with a residual 3.6-4.4 / 1.3-1.5, 7x7 960->160 3.1 / 1.9,
#: depthwise 14x14 stride 2 0.86 / 0.49, 7x7 0.61 / 0.54; but on larger planes the NCHW
#: kernels win (1x1 112x112 16->96 9.2 / 16.2, depthwise 28x28 1.43 / 2.04, 56x56 7.1 / 8.7)
MAX_PLANE = 196
#: the fewest pixels of each part of one sample split over threads (two tiles of pixels)
SPLIT_MIN_PIXELS = 2 * NARROW_MR


@register_jitable
def panel_of(m: int) -> int:
    """The output channels of a panel for ``m`` output channels: 32 where 32-wide panels
    leave a smaller share of their lanes empty than 64-wide ones, else 64."""
    wide, narrow = -m % _WIDE_NR, -m % _NARROW_NR  # (the empty lanes, compared as shares)
    return _NARROW_NR if narrow * (m + wide) < wide * (m + narrow) else _WIDE_NR


def _pack_panels(w2, nr):
    """``w2`` ([M, K]) as panels of ``nr`` of its rows, each ``K`` steps of ``nr`` values,
    zero past ``M``."""
    m, k = w2.shape
    wp = np.zeros((-(-m // nr) * nr, k), w2.dtype)
    wp[:m] = w2
    return np.ascontiguousarray(wp.reshape(-1, nr, k).transpose(0, 2, 1)).reshape(-1)


def pointwise_nhwc_weight(w):
    """The filter ``w`` ([M, C, 1, 1], float32) packed for :func:`pointwise_nhwc` in panels of
    :func:`panel_of` output channels, kept beside ``w``."""
    m = w.shape[0]
    return params.derived(w, ("pointwise_nhwc",), lambda: _pack_panels(
        np.ascontiguousarray(w).reshape(m, w.size // max(1, m)), panel_of(m)))


replay.declare("derived", pointwise_nhwc_weight)


@jit
def _pack_native(w, nr, out):
    m = w.shape[0]
    k = w.size // m if m > 0 else 0
    wf = np.ascontiguousarray(w).reshape(w.size)
    for j in range((m + nr - 1) // nr):
        for kk in range(k):
            base = (j * k + kk) * nr
            for q in range(nr):
                r = j * nr + q
                out[base + q] = wf[r * k + kk] if r < m else 0


@overload(pointwise_nhwc_weight)
def _pointwise_nhwc_weight_native(w):
    def impl(w):
        m = w.shape[0]
        nr = panel_of(m)
        out = np.empty(((m + nr - 1) // nr) * nr * (w.size // max(1, m)), w.dtype)
        _pack_native(w, nr, out)
        return out
    return impl


@jit
def _rows(x2, bp, y2, r0, r1, bias, lo, hi, res, gate, p0, p1):
    """Rows (pixels) ``r0 .. r1`` of ``y2 = gate(clamp(x2 @ W^T + bias + res, lo, hi))``
    (``x2`` [P, C], ``y2`` [P, M], ``res`` ``y2``'s shape flat or empty), their output channels
    of the panels ``p0 .. p1`` (-1: to the last), ``W^T`` packed in panels of
    :func:`panel_of` output channels by :func:`pointwise_nhwc_weight` (64-wide panels:
    :func:`.pgemm.pack_b`'s layout of ``W^T``, run by the product's own rows)."""
    p_, k = x2.shape
    m = y2.shape[1]
    if panel_of(m) == _WIDE_NR:  # (the wide panels are the product's own: its rows)
        _packed_rows(x2, bp, m, bias, y2, r0, r1, res, lo, hi, gate, p0, p1)
        return
    nr, mr = _NARROW_NR, NARROW_MR
    npan = (m + nr - 1) // nr
    p1 = npan if p1 < 0 else min(p1, npan)
    if bp.shape[0] != npan * nr * k or y2.shape[0] != p_ or r0 < 0 or r1 > p_ or \
            (bias.shape[0] != 0 and bias.shape[0] != m) or \
            (res.shape[0] != 0 and res.shape[0] != y2.size):
        raise ValueError("pdjit: pointwise_nhwc: the operands do not fit")
    xf = x2.reshape(x2.size)
    yf = y2.reshape(y2.size)
    # a block of pixels kept in L2 (256 KiB) while every panel passes over it (as the
    # product's rows go, with the narrow tile)
    mc = max(mr, (262144 // max(1, k * 4)) // mr * mr)
    for i0 in range(r0, r1, mc):
        i1 = min(r1, i0 + mc)
        for j in range(p0, p1):
            n0 = j * nr
            for i in range(i0, i1, mr):
                _narrow(xf, i * k, k, min(mr, i1 - i), k, bp, j * k * nr, yf, i * m + n0, m,
                        min(nr, m - n0), bias, n0, res, lo, hi, gate)


@by_address
@jit
def pointwise_nhwc(x, bp, y, n0, n1, bias, lo, hi, res, gate):
    """``y[n] = gate(clamp(conv1x1(x[n], W) + bias + res[n], lo, hi))`` for the samples ``n0
    .. n1`` (``x`` [N, H, W, C], ``y`` [N, H, W, M], C-contiguous; ``W`` [M, C, 1, 1] packed
    by :func:`pointwise_nhwc_weight` into ``bp``; ``bias`` [M] or empty; ``res`` ``y``'s
    shape flat or empty; ``lo``, ``hi`` the clamp, infinite: none; ``gate`` hard_swish or
    hard_sigmoid after it, :func:`.tile.gate_of`'s array, empty: none)."""
    p = x.shape[1] * x.shape[2]
    if y.shape[0] != x.shape[0] or y.shape[1] * y.shape[2] != p or n0 < 0 or \
            n1 > x.shape[0]:
        raise ValueError("pdjit: pointwise_nhwc: the operands do not fit")
    _rows(x.reshape((x.shape[0] * p, x.shape[3])), bp,
          y.reshape((y.shape[0] * p, y.shape[3])), n0 * p, n1 * p, bias, float(lo), float(hi),
          res, gate, 0, -1)


def _split_pointwise(parts, work, x, bp, y, bias, lo, hi, res, gate):
    """One sample of :func:`pointwise_nhwc` in parts on ``parts`` threads (each output
    summed as one call sums it: the same bits): by a parallel loop where it is ready
    (``lib.team``; :func:`.team.plan`: by panels of output channels where the packed weight
    is larger than the image, else by ranges of pixels), else by ranges of pixels on
    ``run_parts``' helpers from ``_CHANNELS_MIN_WORK`` multiply-adds; whether it split.
    Measured in MobileNetV2 at batch 1 on two threads (us, two runs each, by pixels / by
    panels): 7x7 160 -> 960 43.7, 42.6 / 43.0, 41.8; 960 -> 160 47.6, 46.9 / 46.4, 45.8; 960
    -> 320 83.7, 78.4 / 80.3, 78.0; 320 -> 1280 110.7, 106.1 / 106.4, 104.3."""
    p = x.shape[1] * x.shape[2]
    if x.shape[0] != 1 or p < 2 * SPLIT_MIN_PIXELS or work < _conv._TEAM_MIN_WORK:
        return False
    x2 = x.reshape(p, x.shape[3])
    y2 = y.reshape(p, y.shape[3])
    parts = min(parts, p // SPLIT_MIN_PIXELS)
    call = (x2, bp, y2, bias, float(lo), float(hi), res, gate)
    m = y.shape[3]
    if team.run(_pixel_parts, call + team.plan(
            parts, -(-p // NARROW_MR), -(-m // panel_of(m)),
            BY_PANELS[0] and bp.size > PANELS_OVER_IMAGE * x2.size)):
        return True
    if work < _conv._CHANNELS_MIN_WORK or team.standing_in(_pixel_blocks):
        return False
    blocks = -(-p // NARROW_MR)  # (a multiple of both tiles' rows)
    run_chunks(_pixel_blocks, blocks, parts, min(blocks, 4 * parts), *call)
    return True


#: whether a one-sample pointwise convolution may split by panels of its output channels
#: (:func:`_split_pointwise`; a switch for benchmarks, tests)
BY_PANELS = [True]
#: a one-sample pointwise convolution splits by panels where its packed weight is more than
#: this many times its image, else by ranges of pixels. By pixels, each thread reads the whole
#: weight (clean lines, from the shared cache); by panels, each reads the whole image, half of
#: it just written by the other core (each line fetched from that core's cache), and the layer
#: after it (a depthwise one by rows, another 1x1 by pixels) reads half its input from there
#: too. In MobileNetV2 at batch 1 on two threads (its replayed kernels timed one by one, us,
#: by panels / by pixels): 14x14 64 -> 384 (weight twice the image) 38 / 38, the depthwise
#: layer after it 22 / 18; 96 -> 576 (2.9 times) 75 / 74, the depthwise after it 30 / 25; its
#: 7x7 layers (weights 3-26 times their image) lost 6-19 us each by pixels (49 pixels: 5
#: blocks, 3 and 2 a thread). The model, five runs taking turns with the split by panels
#: wherever the weight outweighs the image: 3.41-3.61 ms against 3.55-3.77, faster in each
#: pair. ResNet-50's 14x14 256 -> 1024 (5.2 times) stays by panels
PANELS_OVER_IMAGE = 4


@numpy_blas_calls
def _pointwise_numpy(x, bp, y, n0, n1, bias, lo, hi, res, gate):
    """:func:`pointwise_nhwc` by NumPy's calls, while a worker compiles it beside the runs
    (``replay.STAND_INS``): one product per panel of the packed filter (BLAS), then the
    bias, the residual, the clamp and the gate (not replayed: a recording of it is
    refused)."""
    replay.refuse("pointwise_nhwc's kernel compiles beside the runs")
    k, m = x.shape[3], y.shape[3]
    nr = panel_of(m)
    npan = -(-m // nr)
    x2 = x[n0:n1].reshape(-1, k)
    panels = bp.reshape(npan, k, nr)
    if k <= x2.shape[0]:  # (the filter unpacked, or the product's panels put in place: the
        out = x2 @ panels.transpose(1, 0, 2).reshape(k, npan * nr)  # smaller copy)
    else:
        out = np.matmul(x2, panels).transpose(1, 0, 2).reshape(x2.shape[0], npan * nr)
    out = _conv.epilogue_numpy(out[:, :m].reshape(n1 - n0, *y.shape[1:]), y, n0, n1, bias,
                               lo, hi, res, 3)
    if gate.size:  # (tile.gate_of's values: a, b, lo, hi, scale)
        a, b, glo, ghi, scale = (gate.dtype.type(v) for v in gate[:5])
        t = np.minimum(np.maximum(out * a + b, glo), ghi)
        out = out * t / scale if scale != 0 else t
    y[n0:n1] = out


replay.STAND_INS[pointwise_nhwc] = _pointwise_numpy


@jit
def _pixel_blocks(x2, bp, y2, bias, lo, hi, res, gate, b0, b1):
    _rows(x2, bp, y2, b0 * NARROW_MR, min(x2.shape[0], b1 * NARROW_MR), bias, lo, hi, res,
          gate, 0, -1)


@pjit
def _pixel_parts(x2, bp, y2, bias, lo, hi, res, gate, bounds, pans):
    """:func:`_split_pointwise`'s parts, one per thread of a parallel loop: part ``k`` the
    pixels of the blocks of ``NARROW_MR`` ``bounds[g, k] .. bounds[g, k + 1]`` of the panels
    ``pans[g] .. pans[g + 1]`` for every ``g`` (:func:`.team.plan`)."""
    for k in numba.prange(bounds.shape[1] - 1):
        for g in range(bounds.shape[0]):
            if pans[g + 1] > pans[g] and bounds[g, k + 1] > bounds[g, k]:
                _rows(x2, bp, y2, bounds[g, k] * NARROW_MR,
                      min(x2.shape[0], bounds[g, k + 1] * NARROW_MR), bias, lo, hi, res, gate,
                      pans[g], pans[g + 1])


_conv.CHANNEL_SPLITS[pointwise_nhwc] = _split_pointwise


# ---- depthwise ---------------------------------------------------------------------------------
def depthwise_nhwc_weight(w):
    """The filter ``w`` ([C, 1, KH, KW]) as ``[KH * KW, C]`` (each tap's channels
    contiguous), kept beside ``w``."""
    return params.derived(w, ("depthwise_nhwc",), lambda: np.ascontiguousarray(
        w.reshape(w.shape[0], -1).T))


replay.declare("derived", depthwise_nhwc_weight)


@overload(depthwise_nhwc_weight)
def _depthwise_nhwc_weight_native(w):
    def impl(w):
        return np.ascontiguousarray(np.ascontiguousarray(w).reshape(
            (w.shape[0], w.shape[2] * w.shape[3])).T)
    return impl


#: the depthwise tile: ``DW_R`` neighbouring output pixels by ``DW_NV`` vectors of channels.
#: A 14x14 plane padded by one has rows of 12 pixels off the border (7x7 planes: 5; 14x14 at
#: stride 2: 6), two tiles of 6 where tiles of 8 computed 16 (alone, batch 16, one thread,
#: 3x3 by taps, ms, tiles of 8 / 6 pixels: 14x14 384 channels 0.81-0.83 / 0.61-0.65, 7x7 960
#: channels 0.42-0.47 / 0.33-0.38, 14x14 576 at stride 2 0.30-0.33 / 0.23-0.29; 6 pixels by
#: 3 or 4 vectors measured the same as by 2)
DW_R, DW_NV = 6, 2


def _dw_kernel(npix: int, nv: int, kw_: int = 0, sw_: int = 0, whole: bool = False):
    """The intrinsic of a depthwise tile of ``npix`` output pixels of one row by ``nv`` vectors
    of channels:

    ``tile(x, x0, xr, xj, xs, nrows, kw, w, w0, wr, y, y0, ys, pixels, cols, bias, b0, res,
    lo, hi, gate)``: ``y[y0 + p*ys + q] = gate(clamp(bias[b0 + q] + sum over i < nrows, j <
    kw of x[x0 + i*xr + j*xj + p*xs + q] * w[w0 + i*wr + j*cs + q] + res[y0 + p*ys + q], lo,
    hi))`` (``gate``: :func:`.tile.gate_of`'s array, empty: none)
    for ``p < pixels`` (at most ``npix``), ``q < cols`` (at most ``nv`` vectors; ``cs`` =
    ``ys``, the channels), every tap of every pixel in the image (the caller's border loop
    takes the others). The ``npix * nv`` sums stay in registers over the taps (each tap loads
    ``nv`` vectors of the filter and ``npix * nv`` of the image), in tap order, each a fused
    multiply-add; then the residual, the clamp, the gate and one store (loads and stores
    masked only in a tile of fewer than ``nv`` whole vectors of channels). Pixels past
    ``pixels`` read the last one again (never stored). ``bias``, ``res`` empty: none.

    With ``kw_`` and ``sw_`` (a filter row of ``kw_`` taps one column apart, pixels ``sw_``
    columns apart: the caller passes ``kw == kw_``, ``xs == sw_ * xj``) each column of the
    image that the tile's pixels read in a filter row is loaded once and multiplied into
    every sum that reads it (3x3, stride 1, six pixels: 8 columns loaded for 18 products,
    not 18), the filter row's ``kw_`` taps held in registers; the same products in the same
    order. Pixels past ``pixels`` read the last column again.

    ``whole``: the caller passes ``cols == nv * lanes`` alone (the tile's code made once,
    unmasked); else the tile is made twice, unmasked for such a call and masked for others
    (AMD's Zen 1 and 2 run a masked store as dozens of micro-ops)."""
    def codegen(context, builder, signature, args):
        at = signature.args
        (x0, xr, xj, xs, nrows, kw, w0, wr, y0, ys, pixels, cols, b0) = (
            _offset(context, builder, at[i], args[i])
            for i in (1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 13, 14, 16))
        xa, wa, ya, ba, ra = (context.make_array(at[i])(context, builder, args[i])
                              for i in (0, 7, 10, 15, 17))
        fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)

        def const(v):
            return ir.Constant(i64, v)

        i32t = ir.IntType(32)
        m32 = ir.VectorType(i32t, lanes)
        colv = _splat(builder, m32, builder.trunc(cols, i32t))
        masks = [builder.icmp_signed("<", ir.Constant(m32, [v * lanes + k for k in range(lanes)]),
                                     colv) for v in range(nv)]
        mload, mstore = _masked(builder, vty, "load"), _masked(builder, vty, "store")
        align = ir.Constant(i32t, size)

        def body(masked: bool):
            """The tile, its loads and stores masked (the last channels of a row) or not."""
            def load(arr, off, v):
                p = builder.bitcast(builder.gep(arr.data, [builder.add(off, const(v * lanes))]),
                                    vty.as_pointer())
                if masked:
                    return builder.call(mload, [p, align, masks[v], zero])
                return builder.load(p, align=size)

            has_bias = builder.icmp_signed("!=", cgutils.unpack_tuple(builder, ba.shape)[0],
                                           const(0))
            acc = []
            for v in range(nv):
                start = cgutils.alloca_once_value(builder, zero)
                with builder.if_then(has_bias):  # (an empty bias: nothing to read)
                    builder.store(load(ba, b0, v), start)
                start = builder.load(start)
                acc.append([cgutils.alloca_once_value(builder, start) for _ in range(npix)])
            last = builder.sub(pixels, const(1))
            poff = [builder.mul(builder.select(builder.icmp_signed("<", const(p), pixels),
                                               const(p), last), xs) for p in range(npix)]
            def fma_into(p, v, xv, wv):
                builder.store(builder.call(fma, [xv, wv, builder.load(acc[v][p])]), acc[v][p])

            def by_taps(xi, wi, ps, vs):  # each tap's pixels loaded for it
                with cgutils.for_range(builder, kw) as taps:
                    xt = builder.add(xi, builder.mul(taps.index, xj))
                    wv = {v: load(wa, builder.add(wi, builder.mul(taps.index, ys)), v) for v in vs}
                    for p in ps:
                        xp = builder.add(xt, poff[p])
                        for v in vs:
                            fma_into(p, v, load(xa, xp, v), wv[v])

            def by_columns(xi, wi, ps, vs):  # each column of the row loaded once (see above)
                kmax = builder.add(builder.mul(last, const(sw_)), const(kw_ - 1))
                wv = [{v: load(wa, builder.add(wi, builder.mul(const(j), ys)), v) for v in vs}
                      for j in range(kw_)]
                for k in range(ps[0] * sw_, ps[-1] * sw_ + kw_):
                    kk = builder.select(builder.icmp_signed("<=", const(k), kmax), const(k), kmax)
                    xk = builder.add(xi, builder.mul(kk, xj))
                    xv = {v: load(xa, xk, v) for v in vs}
                    for p in ps:
                        if 0 <= k - p * sw_ < kw_:
                            for v in vs:
                                fma_into(p, v, xv[v], wv[k - p * sw_][v])

            # (by passes of pixels and vectors that fit the registers: .tile.sum_passes)
            for p0, p1, v0, v1 in sum_passes(npix, nv):
                with cgutils.for_range(builder, nrows) as rows:
                    (by_columns if kw_ else by_taps)(builder.add(x0, builder.mul(rows.index, xr)),
                                                     builder.add(w0, builder.mul(rows.index, wr)),
                                                     range(p0, p1), range(v0, v1))
            has_res = builder.icmp_signed("!=", cgutils.unpack_tuple(builder, ra.shape)[0],
                                          const(0))
            lov, hiv = (_splat(builder, vty, context.cast(builder, args[i], at[i], at[0].dtype))
                        for i in (18, 19))
            has_gate, gv = gate_of(context, builder, at[20], args[20], vty)
            for p in range(npix):
                with builder.if_then(builder.icmp_signed("<", const(p), pixels)):
                    yp = builder.add(y0, builder.mul(const(p), ys))
                    for v in range(nv):
                        with builder.if_then(has_res):
                            builder.store(builder.fadd(builder.load(acc[v][p]), load(ra, yp, v)),
                                          acc[v][p])
                        val = builder.load(acc[v][p])
                        val = builder.select(builder.fcmp_unordered(">=", val, lov), val, lov)
                        val = builder.select(builder.fcmp_unordered("<=", val, hiv), val, hiv)
                        val = gated(builder, has_gate, gv, val)
                        ptr = builder.bitcast(builder.gep(ya.data, [builder.add(yp, const(
                            v * lanes))]), vty.as_pointer())
                        _store(builder, mstore, val, ptr, align, masks[v] if masked else None)

        if whole:
            body(False)
            return context.get_dummy_value()
        with builder.if_else(builder.icmp_signed("<=", const(nv * lanes), cols)) as (all_, part):
            with all_:
                body(False)
            with part:
                body(True)
        return context.get_dummy_value()

    @intrinsic
    def tile(typingctx, x, x0, xr, xj, xs, nrows, kw, w, w0, wr, y, y0, ys, pixels, cols, bias,
             b0, res, lo, hi, gate):
        arrays = (x, w, y, bias, res, gate)
        if not all(isinstance(a, types.Array) and a.ndim == 1 for a in arrays) or \
                len({a.dtype for a in arrays}) != 1 or \
                x.dtype not in (types.float32, types.float64):
            return None
        return types.void(x, x0, xr, xj, xs, nrows, kw, w, w0, wr, y, y0, ys, pixels, cols,
                          bias, b0, res, lo, hi, gate), codegen
    return tile


_dw_tile = _dw_kernel(DW_R, DW_NV)
#: the tiles of 3x3 and 5x5 filters (no dilation) at stride 1 and 2, by columns loaded once:
#: a 5x5 tile loads 10 columns for 150 products at stride 1 where by taps it loaded 150
#: (alone, one thread, us, by taps / by columns: [1, 14, 14, 240] 43.7 / 26.1, [1, 7, 7, 576]
#: 31.6 / 24.2, [1, 28, 28, 96] at stride 2 16.7 / 13.6; the same bits). The two 5x5 tiles
#: add ~0.2 s to :func:`_dw_rows`' compile (0.8 -> 1.0 s alone). They take whole vectors
#: of channels alone (made once, unmasked): a row's last, partial tile goes by taps
_dw_tile_3s1 = _dw_kernel(DW_R, DW_NV, 3, 1, whole=True)
_dw_tile_3s2 = _dw_kernel(DW_R, DW_NV, 3, 2, whole=True)
_dw_tile_5s1 = _dw_kernel(DW_R, DW_NV, 5, 1, whole=True)
_dw_tile_5s2 = _dw_kernel(DW_R, DW_NV, 5, 2, whole=True)
#: the tile of a pixel of the padded border (its taps in the image): ``DW_EDGE_NV`` vectors
DW_EDGE_NV = 4
_dw_edge = _dw_kernel(1, DW_EDGE_NV)


@by_address
@jit
def _dw_rows(x, wt, kh, kw, y, n0, n1, o0, o1, sh, sw, pt, pl, dh, dw, bias, lo, hi, res,
             gate):
    """Output rows ``o0 .. o1`` of the samples ``n0 .. n1`` of :func:`depthwise_nhwc`: the
    pixels whose every tap is in the image by tiles of ``DW_R`` (:func:`_dw_kernel`), the
    others (the padded border) one at a time, over the taps in the image."""
    h_, w_, c_ = x.shape[1], x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[1], y.shape[2]
    if wt.shape[0] != kh * kw or wt.shape[1] != c_ or y.shape[3] != c_ or \
            y.shape[0] != x.shape[0] or (bias.size != 0 and bias.size != c_) or \
            (res.size != 0 and res.size != y.size) or n0 < 0 or n1 > x.shape[0] or \
            o0 < 0 or o1 > oh_ or kh < 1 or kw < 1:
        raise ValueError("pdjit: depthwise_nhwc: the operands do not fit")
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    wf = wt.reshape(wt.size)
    nc = DW_NV * (64 // x.itemsize)
    # the output columns whose every tap is in the image: a .. b
    a = min(ow_, max(0, -(-pl // sw)))
    b = max(a, min(ow_, (w_ - 1 + pl - (kw - 1) * dw) // sw + 1)) \
        if w_ - 1 + pl - (kw - 1) * dw >= 0 else a
    ne = DW_EDGE_NV * (64 // x.itemsize)
    # 3x3 and 5x5 filters without dilation at stride 1 or 2: the tiles by columns (kinds 1, 2
    # and 3, 4)
    kind = (sw + (2 if kw == 5 else 0) if sw <= 2 else 0) if kw in (3, 5) and dw == 1 else 0
    # a tile's strides: image rows and columns a tap apart, pixels apart; filter rows apart
    xr, xj, xs, wr = dh * w_ * c_, dw * c_, sw * c_, kw * c_
    for n in range(n0, n1):
        for oh in range(o0, o1):
            # the filter rows in the image: i0 .. i1
            top = oh * sh - pt
            i0 = 0 if top >= 0 else min(kh, -(top // dh))
            i1 = i0
            while i1 < kh and top + i1 * dh < h_:
                i1 += 1
            yb = (n * oh_ + oh) * ow_ * c_
            xrow = (n * h_ + top + i0 * dh) * w_
            for q in range(a, b, DW_R):
                for c0 in range(0, c_, nc):
                    x0, w0, y0 = (xrow + q * sw - pl) * c_ + c0, i0 * kw * c_ + c0, \
                        yb + q * c_ + c0
                    npix, cols = min(DW_R, b - q), min(nc, c_ - c0)
                    # (the same arguments for each tile: an intrinsic is no value to pick;
                    # the tiles by columns take whole vectors alone)
                    if cols < nc:
                        _dw_tile(xf, x0, xr, xj, xs, i1 - i0, kw, wf, w0, wr, yf, y0, c_,
                                 npix, cols, bias, c0, res, lo, hi, gate)
                    elif kind == 1:
                        _dw_tile_3s1(xf, x0, xr, xj, xs, i1 - i0, kw, wf, w0, wr, yf, y0, c_,
                                     npix, cols, bias, c0, res, lo, hi, gate)
                    elif kind == 2:
                        _dw_tile_3s2(xf, x0, xr, xj, xs, i1 - i0, kw, wf, w0, wr, yf, y0, c_,
                                     npix, cols, bias, c0, res, lo, hi, gate)
                    elif kind == 3:
                        _dw_tile_5s1(xf, x0, xr, xj, xs, i1 - i0, kw, wf, w0, wr, yf, y0, c_,
                                     npix, cols, bias, c0, res, lo, hi, gate)
                    elif kind == 4:
                        _dw_tile_5s2(xf, x0, xr, xj, xs, i1 - i0, kw, wf, w0, wr, yf, y0, c_,
                                     npix, cols, bias, c0, res, lo, hi, gate)
                    else:
                        _dw_tile(xf, x0, xr, xj, xs, i1 - i0, kw, wf, w0, wr, yf, y0, c_,
                                 npix, cols, bias, c0, res, lo, hi, gate)
            for k in range(ow_ - (b - a)):  # the border: columns 0 .. a, b .. ow_
                ow = k if k < a else k - a + b
                left = ow * sw - pl
                j0 = 0 if left >= 0 else min(kw, -(left // dw))
                j1 = j0
                while j1 < kw and left + j1 * dw < w_:
                    j1 += 1
                for c0 in range(0, c_, ne):
                    _dw_edge(xf, (xrow + left + j0 * dw) * c_ + c0, dh * w_ * c_, dw * c_, 0,
                             i1 - i0, j1 - j0, wf, (i0 * kw + j0) * c_ + c0, kw * c_, yf,
                             yb + ow * c_ + c0, c_, 1, min(ne, c_ - c0), bias, c0, res, lo, hi,
                             gate)


def depthwise_nhwc(x, wt, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res,
                   gate):
    """``y[n] = gate(clamp(depthwise(x[n]) + bias + res[n], lo, hi))`` for the samples ``n0
    .. n1``: ``x`` [N, H, W, C], ``y`` [N, OH, OW, C], the filter ([C, 1, KH, KW]) as
    :func:`depthwise_nhwc_weight` gives it (``wt``), strides, top/left pads and dilations as
    the convolution's (the bottom/right pads follow from ``y``'s size); ``gate`` as
    :func:`pointwise_nhwc`'s."""
    replay.kernel_call(_dw_rows, x, wt, kh, kw, y, n0, n1, 0, y.shape[1], sh, sw, pt, pl, dh,
                       dw, bias, float(lo), float(hi), res, gate)


replay.declare("leaves", depthwise_nhwc)


@overload(depthwise_nhwc)
def _depthwise_nhwc_native(x, wt, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi,
                           res, gate):
    def impl(x, wt, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res, gate):
        _dw_rows(x, wt, kh, kw, y, n0, n1, 0, y.shape[1], sh, sw, pt, pl, dh, dw, bias,
                 float(lo), float(hi), res, gate)
    return impl


def _split_depthwise(parts, work, x, wt, y, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi,
                     res, gate):
    """One sample of :func:`depthwise_nhwc` in ranges of its output rows on ``parts``
    threads (as :func:`_split_pointwise`); whether it split."""
    rows = y.shape[1]
    if x.shape[0] != 1 or rows < 2 or work < _conv._TEAM_MIN_WORK:
        return False
    parts = min(parts, rows)
    call = (x, wt, kh, kw, y, sh, sw, pt, pl, dh, dw, bias, float(lo), float(hi), res, gate)
    if team.run(_dw_parts, call + (parts,)):
        return True
    if work < _conv._CHANNELS_MIN_WORK:
        return False
    run_chunks(_dw_part, rows, parts, min(rows, 4 * parts), *call)
    return True


def _dw_part(x, wt, kh, kw, y, sh, sw, pt, pl, dh, dw, bias, lo, hi, res, gate, o0, o1):
    _dw_rows(x, wt, kh, kw, y, 0, 1, o0, o1, sh, sw, pt, pl, dh, dw, bias, lo, hi, res, gate)


@pjit
def _dw_parts(x, wt, kh, kw, y, sh, sw, pt, pl, dh, dw, bias, lo, hi, res, gate, parts):
    """:func:`_split_depthwise`'s ranges of output rows, one per thread of a parallel loop."""
    rows = y.shape[1]
    for k in numba.prange(parts):
        _dw_rows(x, wt, kh, kw, y, 0, 1, k * rows // parts, (k + 1) * rows // parts, sh, sw,
                 pt, pl, dh, dw, bias, lo, hi, res, gate)


_conv.CHANNEL_SPLITS[depthwise_nhwc] = _split_depthwise


# ---- other convolutions of one group ---------------------------------------------------------
#: conv_nhwc's tile: 7 pixels of an output row (ResNet's rows of 56, 28, 14 and 7 pixels
#: fill whole tiles) by 4 vectors of output channels (panels of 64), each step of the sum
#: reading its tap's channels where the image holds them (pgemm's tile reading the taps,
#: stored by rows: no transposes); its 28 sums and 4 vectors of weights fill the 32 vector
#: registers, the image's values broadcast from memory. Measured alone against ONNX Runtime's
#: NCHWc kernels (one thread, batch 1, by turns in one process, ms), this tile / 7 by 48 / 6
#: by 64 / ONNX Runtime: 3x3 14x14 256 -> 256 2.42 / 2.64 / 2.88 / 2.26; 28x28 128 -> 128
#: 1.69 / 1.95 / 1.80 / 1.79; 56x56 64 -> 64 2.10 / 3.32 / 2.43 / 2.09; 7x7 512 -> 512 2.08 /
#: 2.12 / 3.11 / 2.27; stride 2 14x14 512 -> 512 2.08 / 2.30 / 3.17 / 2.25
_CONV_MR, _CONV_NR = 7, NV * 16
#: a row's last pixels, where they are at most this many, take a tile of this many pixels
#: (one of 7 took as long for 1, 2 or 3 as for 7), and the last 8 two (Inception's 17x17 rows:
#: 7 + 7 + 3, its 8x8 rows 4 + 4). Alone, one thread, us, 7-pixel tiles alone / with these
#: (ONNX Runtime's node by turns): 1x7 160 -> 160 on 17x17 1904 / 1225 (946), 3x1 384 -> 384
#: on 8x8 883 / 523 (485), 3x3 stride 2 192 -> 320 onto 8x8 933 / 664 (663); rows of whole
#: tiles (ResNet's 56, 28, 14 and 7) as before
_CONV_TAIL = 4
#: no rows fetched ahead (the tiles before a chunk's first fetch it between them): the 7x4
#: tile's 28 sums, 4 filter vectors and a broadcast need 33 of the 32 vector registers, and
#: each instruction more in its step counts on a core shared with another thread. Alone at
#: batch 1, one thread, a 2-vCPU Intel Xeon, against ONNX Runtime's node by turns, with the
#: rows ahead and a prefetch of the share at every step / without, the share's in its first
#: steps only: 3x3 14x14 256 -> 256 1.09-1.10x / 1.01x, stride 2 28x28 256 -> 256 1.13x /
#: 1.05x, 1x1 stride 2 28x28 512 -> 1024 1.04x / 0.99x, 7x7 512 -> 512 0.84x / 0.86x
_conv_tile = _micro_kernel(_CONV_MR, NV, 0, taps=True, spread=True)
_conv_tail = _micro_kernel(_CONV_TAIL, NV, 0, taps=True, spread=True)
#: the bytes of a panel's rows (of the filter packed by conv_nhwc_weight) that every tile of
#: the output rows reads before the next rows are read: they stay in the L1 cache, the sums so
#: far read back from the output (cheap: channels-last, by rows). Measured alone on a 2-vCPU
#: Intel Xeon (one thread, batch 1, ms, tiles of 7 pixels by 48 channels, against ONNX
#: Runtime's NCHWc kernels by turns in one process): 3x3 14x14 256 -> 256 3.1 / 2.3 with 256
#: KiB, 1.9 / 1.7 with 32 KiB, 2.5 / 1.9 with 64 KiB, 3.0 / 2.4 with 16 KiB; 7x7 512 -> 512
#: 3.3 / 3.0, 2.2 / 2.2, 2.4 / 2.2, 2.6 / 2.7
CONV_CHUNK_BYTES = 1 << 15
#: the bytes of the image's rows under one block of output rows: an image larger than this
#: (a stride-2 layer's: four times its output) is swept by blocks of output rows, each under
#: every chunk of every panel before the next, rather than whole under each chunk (a 56x56
#: image of 128 channels, 1.6 MB, read again from beyond the L2 cache for each of its 9 chunks
#: of each panel)
CONV_BLOCK_BYTES = 1 << 19
#: each tile after a chunk's first fetches its share of the next chunk's lines into the L2
#: cache, a line in each of its first steps, so that the filter streams from memory while the
#: tiles sum (where the first three tiles each fetched the whole next chunk, a line each step
#: at four times the rate, the fetches queued behind each other and a 7x7 plane's seven tiles a
#: chunk had waited for them). Measured alone, one thread, batch 1, the filter one of 40 copies
#: (read from memory, as a model's are), by turns, spread / the first three: 3x3 7x7 512 -> 512
#: 0.83-0.85x, 14x14 256 -> 256 0.93-0.95x, stride 2 14x14 512 -> 512 0.89x; 28x28 128 -> 128
#: 1.02x, 56x56 64 -> 64 0.99-1.04x
#: Not where a prefetch fills the L1 cache too (:data:`.tile.PREFETCH_FILLS_L1`): there each
#: evicts a line of the chunk the tiles are reading, all of a 32 KiB L1. Measured on a 2-vCPU
#: AMD EPYC (Zen 4), medians of ResNet-50's processes by turns, the fetches / none: batch 1 one
#: thread 70.4-73.5 / 68.6-70.0 ms, two threads 36.9-37.7 / 35.2-35.7, batch 16 two threads
#: 597-619 / 540-556 ms; its 3x3 stride-2 14x14 512 -> 512 alone (the filter in L3) 3.8 / 2.2
#: ms, two rows of its seven 1.06 / 0.61. (The 1x1 layers' tiles, ``pgemm._micro_spread``,
#: keep theirs: without them too, batch 16 two threads 615-627 ms against 558-594.)


@register_jitable
def _packed_conv(w, nr):
    """``w`` ([M, C, KH, KW]) packed in panels of ``nr`` output channels, each ``KH * KW * C``
    rows of ``nr`` (row ``(ty * KW + tx) * C + c``: the tap's channels in the image's order),
    zero past ``M`` (NumPy's copies: called from Python, nothing to compile in a cold
    process; compiled code compiles the same lines)."""
    m, c, kh, kw = w.shape
    npan = (m + nr - 1) // nr
    wt = np.zeros((npan * nr, kh, kw, c), w.dtype)
    wt[:m] = w.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(wt.reshape(npan, nr, kh * kw * c).transpose(0, 2, 1)).reshape(-1)


def conv_nhwc_weight(w):
    """The filter ``w`` ([M, C, KH, KW], float32) packed for :func:`conv_nhwc` (panels of 64
    output channels), kept beside ``w``."""
    return params.derived(w, ("conv_nhwc",), lambda: _packed_conv(w, _CONV_NR))


replay.declare("derived", conv_nhwc_weight)


@overload(conv_nhwc_weight)
def _conv_nhwc_weight_native(w):
    def impl(w):
        return _packed_conv(w, _CONV_NR)
    return impl


@by_address
@jit
def _conv_rows(x, bp, kh, kw, y, n0, n1, o0, o1, sh, sw, pt, pl, dh, dw, bias, lo, hi, res,
               p0, p1):
    """The output rows ``o0 .. o1`` of the samples ``n0 .. n1`` of :func:`conv_nhwc`, their
    output channels of the panels ``p0 .. p1`` (-1: to the last). The image rows they read go
    to a zero-padded copy where they reach past the image (else the tiles read the image in
    place); each panel's rows are taken by chunks of :data:`CONV_CHUNK_BYTES` that every tile
    of a block of output rows (:data:`CONV_BLOCK_BYTES`) reads in turn (the residual added
    with the first, the bias and clamp with the last)."""
    n, h, w_, c = x.shape
    oh, ow, m = y.shape[1], y.shape[2], y.shape[3]
    nr, mr = _CONV_NR, _CONV_MR
    k = kh * kw * c
    npan = (m + nr - 1) // nr
    p1 = npan if p1 < 0 else min(p1, npan)
    if y.shape[0] != n or bp.size != npan * nr * k or n0 < 0 or n1 > n or o0 < 0 or \
            o1 > oh or (bias.size != 0 and bias.size != m) or \
            (res.size != 0 and res.size != y.size) or min(kh, kw, sh, sw, dh, dw) < 1 or \
            x.itemsize != 4:  # (float32: the tile's 4 vectors make the panels' 64 columns)
        raise ValueError("pdjit: conv_nhwc: the operands do not fit")
    if o1 <= o0 or n1 <= n0 or p1 <= p0:
        return
    if kh == 1 and kw == 1 and pt == 0 and pl == 0:  # (ResNet's stride-2 projections)
        _gathered_pointwise(x, bp, y, n0, n1, o0, o1, sh, sw, bias, lo, hi, res, p0, p1)
        return
    r0 = o0 * sh - pt  # the first image row read, and the rows and columns read
    rows = (o1 - 1 - o0) * sh + (kh - 1) * dh + 1
    cols = (ow - 1) * sw + (kw - 1) * dw + 1
    # a strided window that covers its stride (3x3 stride 2): the rows read copied into one
    # plane per phase of the stride (the rows and columns of each remainder by it), where each
    # tap reads a tile's pixels next to each other, as at stride 1
    phased = (sh > 1 or sw > 1) and dh == 1 and dw == 1 and kh >= sh and kw >= sw
    inside = r0 >= 0 and r0 + rows <= h and pl == 0 and cols <= w_ and not phased
    wp = w_ if inside else cols  # (the row stride of what the tiles read)
    hq, wq = -(-rows // sh), -(-cols // sw)  # (a phase's plane)
    off = np.empty(k, np.int64)
    for t in range(kh * kw):
        ty, tx = t // kw, t % kw
        if phased:
            at = (((ty % sh) * sw + tx % sw) * hq * wq + (ty // sh) * wq + tx // sw) * c
        else:
            at = (ty * dh * wp + tx * dw) * c
        for ci in range(c):
            off[t * c + ci] = at + ci
    xf = x.reshape(x.size)
    xp = xf if inside else np.empty((sh * sw * hq * wq if phased else rows * cols) * c, x.dtype)
    # where a tile's output row starts, and its pixels' stride, in what the tiles read
    row_step, px_step = (wq * c, c) if phased else (sh * wp * c, sw * c)
    yf = y.reshape(y.size)
    kc = max(1, CONV_CHUNK_BYTES // (nr * x.itemsize))
    lanes = 64 // x.itemsize
    # blocks of output rows whose image rows fit CONV_BLOCK_BYTES (all of them where they do)
    ob = max(1, (CONV_BLOCK_BYTES // (wp * c * x.itemsize) - (kh - 1) * dh) // sh)
    ob = o1 - o0 if ob >= o1 - o0 else ob
    for s in range(n0, n1):
        xb = ((s * h + r0) * w_) * c if inside else 0
        if not inside:
            for i in range(rows):
                ii = r0 + i
                for jj in range(cols):
                    xx = jj - pl
                    d = ((((i % sh) * sw + jj % sw) * hq + i // sh) * wq + jj // sw) * c \
                        if phased else (i * cols + jj) * c
                    if 0 <= ii < h and 0 <= xx < w_:
                        xp[d:d + c] = x[s, ii, xx]
                    else:
                        xp[d:d + c] = 0
        yb = s * oh * ow * m
        for b0 in range(o0, o1, ob):
            b1 = min(o1, b0 + ob)
            tiles = (b1 - b0) * ((ow + mr - 1) // mr)  # (a chunk's)
            for j in range(p0, p1):
                width = min(nr, m - j * nr)
                for k0 in range(0, k, kc):
                    k1 = min(k, k0 + kc)
                    bs, rs, lo_, hi_ = chunk_epilogue(k0, k1 == k, bias, res, yf, lo, hi)
                    t = 0
                    for oy in range(b0, b1):
                        a_row = xb + (oy - o0) * row_step
                        ox = 0
                        while ox < ow:
                            pfb, pfl = spread_share(t, tiles, kc * NV, (j * k + k0) * nr,
                                                    (j * k + k1) * nr, lanes)
                            if PREFETCH_FILLS_L1:  # (they evict the chunk: see CONV_BLOCK_BYTES)
                                pfl = 0
                            px = _CONV_TAIL if ow - ox == mr + 1 else min(mr, ow - ox)
                            if px <= _CONV_TAIL:
                                _conv_tail(xp, a_row + ox * px_step, px_step, px, k1 - k0,
                                           bp, (j * k + k0) * nr, yf,
                                           yb + (oy * ow + ox) * m + j * nr, m, width, bs,
                                           j * nr, rs, lo_, hi_, off, k0, pfb, pfl)
                            else:
                                _conv_tile(xp, a_row + ox * px_step, px_step, px, k1 - k0,
                                           bp, (j * k + k0) * nr, yf,
                                           yb + (oy * ow + ox) * m + j * nr, m, width, bs,
                                           j * nr, rs, lo_, hi_, off, k0, pfb, pfl)
                            t += 1
                            ox += px


@register_jitable
def _gathered_pointwise(x, bp, y, n0, n1, o0, o1, sh, sw, bias, lo, hi, res, p0, p1):
    """:func:`_conv_rows` of a 1x1 unpadded window: the pixels that the output rows ``o0 ..
    o1`` of the samples ``n0 .. n1`` read gathered into rows of their channels, then pgemm's
    product on them, the 1x1 layers' (:func:`pointwise_nhwc`; the filter's panels of 64 output
    channels are its layout of a 1x1 filter too), all the samples' rows in one product where
    the output rows are whole planes (a batch of small planes: the filter read once a block
    of rows, not once a sample). Measured alone on a 2-vCPU Sapphire Rapids class Xeon, one
    thread, ms, by turns, the tiles reading the image in place / gathered: ResNet-50's
    stride-2 projections at batch 1, 56x56 256 -> 512 1.35-1.42 / 1.42-1.45, 28x28 512 -> 1024
    1.31-1.38 / 1.15-1.26, 14x14 1024 -> 2048 1.46-1.49 / 1.29-1.31 (ONNX Runtime's NCHWc
    kernel, another run: 1.21, 1.15, 1.31); at batch 16 27.0-28.0 / 25.7-25.9, 24.6-25.9 /
    21.2-21.8, 21.8-26.0 / 19.6-20.1."""
    n, h, w_, c = x.shape
    oh, ow, m = y.shape[1], y.shape[2], y.shape[3]
    if (oh - 1) * sh >= h or (ow - 1) * sw >= w_:
        raise ValueError("pdjit: conv_nhwc: the operands do not fit")
    rows = (o1 - o0) * ow
    xs = np.empty(((n1 - n0) * rows, c), x.dtype)
    for s in range(n0, n1):
        for oy in range(o0, o1):
            for ox in range(ow):
                xs[((s - n0) * (o1 - o0) + oy - o0) * ow + ox] = x[s, oy * sh, ox * sw]
    y2 = y.reshape((n * oh * ow, m))
    # the samples' rows in one product where they follow one another in y (whole planes),
    # else a product per sample
    step = n1 - n0 if (o0 == 0 and o1 == oh) or n1 - n0 == 1 else 1
    for s in range(n0, n1, step):
        q0 = (s * oh + o0) * ow
        r = step * rows
        rs = res[q0 * m:(q0 + r) * m] if res.size != 0 else res
        _packed_rows(xs[(s - n0) * rows:(s - n0) * rows + r], bp, m, bias, y2[q0:q0 + r], 0, r,
                     rs, lo, hi, bias[:0], p0, p1)


def conv_nhwc(x, bp, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
    """``y[n] = clamp(conv(x[n], W) + bias + res[n], lo, hi)`` for the samples ``n0 .. n1``
    of a convolution of one group, any window, stride, padding and dilation: ``x`` [N, H, W,
    C], ``y`` [N, OH, OW, M], ``W`` ([M, C, KH, KW]) packed by :func:`conv_nhwc_weight` into
    ``bp``, strides, top/left pads and dilations as the convolution's (the bottom/right pads
    follow from ``y``'s size); ``bias``, ``res``, ``lo``, ``hi`` as :func:`pointwise_nhwc`'s.
    Each output sums its products in the packed rows' order (tap by tap, each tap's channels
    in order), each a fused multiply-add, the residual added to the first chunk's sum (a 1x1
    unpadded window: after the whole sum, as :func:`pointwise_nhwc`'s); until the kernel is
    ready (:func:`_conv_ready`), NumPy's calls (:func:`_conv_numpy`)."""
    if not _conv_ready():
        _conv_numpy(x, bp, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res)
        return
    replay.kernel_call(_conv_rows, x, bp, kh, kw, y, n0, n1, 0, y.shape[1], sh, sw, pt, pl, dh,
                       dw, bias, float(lo), float(hi), res, 0, -1)


#: a call of :func:`_conv_rows` of the types warmup compiles it for (:func:`_conv_ready`)
_CONV_CALL: list = []


def _conv_ready() -> bool:
    """Whether :func:`_conv_rows` may serve :func:`conv_nhwc`: compiled ahead by ``pdjit
    warmup`` and the background warmup, loaded from the disk cache from a process's few first
    runs on, as ``lib.team`` makes its parallel loops ready. Until then :func:`_conv_numpy`
    serves: its compile (3.2 s of CPU, the largest of a ResNet-50's channels-last kernels) stays
    out of a cold process's first results."""
    if not _CONV_CALL:
        a4, a1 = np.empty((1, 1, 1, 1), np.float32), np.empty(0, np.float32)
        _CONV_CALL.append((a4, a1, 0, 0, a4, *(0,) * 10, a1, 0.0, 0.0, a1, 0, 0))
    return team.ready(_conv_rows, _CONV_CALL[0])


@numpy_blas_calls
def _conv_numpy(x, bp, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
    """:func:`conv_nhwc` by NumPy's calls: the samples' patches in the packed rows' order (tap
    by tap, each tap's channels), one product by the packed filter (BLAS), then the bias, the
    residual and the clamp (not replayed: a recording of it is refused)."""
    replay.refuse("conv_nhwc's kernel is not ready")
    n, h, w_, c = x.shape
    oh, ow, m = y.shape[1], y.shape[2], y.shape[3]
    k, npan = kh * kw * c, -(-m // _CONV_NR)
    pb = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt)
    pr = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - w_ - pl)
    xp = np.pad(x[n0:n1], ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    patches = np.concatenate(
        [xp[:, ty * dh:ty * dh + (oh - 1) * sh + 1:sh, tx * dw:tx * dw + (ow - 1) * sw + 1:sw]
         for ty in range(kh) for tx in range(kw)], axis=3).reshape(-1, k)
    # (a product per panel of the packed filter, each [K, 64] contiguous: no copy of it)
    out = np.matmul(patches, bp.reshape(npan, k, _CONV_NR)).transpose(1, 0, 2).reshape(
        patches.shape[0], npan * _CONV_NR)[:, :m]
    y[n0:n1] = _conv.epilogue_numpy(out.reshape(n1 - n0, oh, ow, m), y, n0, n1, bias, lo, hi,
                                    res, 3)


replay.declare("leaves", conv_nhwc)


@overload(conv_nhwc)
def _conv_nhwc_native(x, bp, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
    def impl(x, bp, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
        _conv_rows(x, bp, kh, kw, y, n0, n1, 0, y.shape[1], sh, sw, pt, pl, dh, dw, bias,
                   float(lo), float(hi), res, 0, -1)
    return impl


def _split_conv(parts, work, x, bp, y, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
    """One sample of :func:`conv_nhwc` in parts on ``parts`` threads (as
    :func:`_split_pointwise`: on a parallel loop by :func:`.team.plan`, by panels of output
    channels where the packed weight outweighs the image, else by ranges of output rows; else
    by ranges of output rows on ``run_parts``' helpers); whether it split."""
    rows = y.shape[1]
    if x.shape[0] != 1 or rows < 2 or work < _conv._TEAM_MIN_WORK or not _conv_ready():
        return False
    parts = min(parts, rows)
    call = (x, bp, kh, kw, y, sh, sw, pt, pl, dh, dw, bias, float(lo), float(hi), res)
    npan = -(-y.shape[3] // _CONV_NR)
    if team.run(_conv_parts, call + team.plan(parts, rows, npan, BY_PANELS[0] and
                                              bp.size > x.size)):
        return True
    if work < _conv._CHANNELS_MIN_WORK:
        return False
    run_chunks(_conv_part, rows, parts, min(rows, 4 * parts), *call)
    return True


def _conv_part(x, bp, kh, kw, y, sh, sw, pt, pl, dh, dw, bias, lo, hi, res, o0, o1):
    _conv_rows(x, bp, kh, kw, y, 0, 1, o0, o1, sh, sw, pt, pl, dh, dw, bias, lo, hi, res, 0, -1)


@pjit
def _conv_parts(x, bp, kh, kw, y, sh, sw, pt, pl, dh, dw, bias, lo, hi, res, bounds, pans):
    """:func:`_split_conv`'s parts, one per thread of a parallel loop: part ``k`` the output
    rows ``bounds[g, k] .. bounds[g, k + 1]`` of the panels ``pans[g] .. pans[g + 1]`` for
    every ``g`` (:func:`.team.plan`)."""
    for k in numba.prange(bounds.shape[1] - 1):
        for g in range(bounds.shape[0]):
            if pans[g + 1] > pans[g] and bounds[g, k + 1] > bounds[g, k]:
                _conv_rows(x, bp, kh, kw, y, 0, 1, bounds[g, k], bounds[g, k + 1], sh, sw, pt,
                           pl, dh, dw, bias, lo, hi, res, pans[g], pans[g + 1])


_conv.CHANNEL_SPLITS[conv_nhwc] = _split_conv


# ---- what a new plan's compile worker compiles ahead (pdjit.codegen.cpu.lib._jit.JOBS) ------
def _ep(T):
    return ((T, 1), float, float, (T, 1), (T, 1))


# (with the kernel of its splits on run_parts' helpers: compiled in a run where two cores
# were free, ResNet-50's first at two, 0.44 s)
jobs("pointwise_nhwc")(lambda T: [] if np.dtype(T) != np.float32 else [
    (pointwise_nhwc, ((T, 4), (T, 1), (T, 4), int, int) + _ep(T)),
    (_pixel_blocks, ((T, 2), (T, 1), (T, 2)) + _ep(T) + (int, int))])
jobs("depthwise_nhwc")(lambda T: [(_dw_rows, ((T, 4), (T, 2), int, int, (T, 4)) + (int,) * 10
                                   + _ep(T))])
# (the splits of one sample by parallel loops, and conv_nhwc's kernel, which NumPy's calls
# stand in for until it is ready: compiled ahead by warmup only, see team.ready)
jobs("channels_last (warmup)")(lambda T: [] if np.dtype(T) != np.float32 else [
    (_conv_rows, ((T, 4), (T, 1), int, int, (T, 4)) + (int,) * 10 + _ep(T)[:4] + (int, int)),
    (_pixel_parts, ((T, 2), (T, 1), (T, 2)) + _ep(T) + ((np.int64, 2), (np.int64, 1))),
    (_dw_parts, ((T, 4), (T, 2), int, int, (T, 4)) + (int,) * 6 + _ep(T) + (int,)),
    (_conv_parts, ((T, 4), (T, 1), int, int, (T, 4)) + (int,) * 6 + _ep(T)[:4]
     + ((np.int64, 2), (np.int64, 1)))])
compile_cost(1.3, pointwise_nhwc)  # (its gated tiles: +0.1 s)
compile_beside(pointwise_nhwc, _pixel_blocks)  # (_pointwise_numpy; no split meanwhile)
compile_cost(1.1, _dw_rows)
compile_cost(1.6, _pixel_parts, _dw_parts, _conv_parts)
compile_cost(3.2, _conv_rows)


# ---- 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) on channels-last images ------------
# The transforms of :mod:`.winograd` (its module says the algorithm and its rounding), laid out
# for NHWC: a tile's 4x4 inputs are 16 vectors of its pixels' channels, contiguous in the
# image, so both transforms are vector adds across the channels (no shuffles, no strided
# reads), ``V_xi`` is [tiles, C] (the products' left operand by rows, read in place) and each
# product ``M_xi [tiles, M] = V_xi @ U_xi^T`` runs on pgemm's tile over ``U_xi^T`` packed in
# panels of 64 output channels (:func:`winograd_nhwc_weight`), as the 1x1 layers' products do.

def _counted(context, builder, dtype, cntv):
    """``(vector type, element bytes, i64, zero vector, masked load, masked store, alignment,
    mask, whole)`` for vectors of ``dtype`` (:func:`.tile._vectors`) of which ``cntv`` (an i64)
    lanes count: ``mask`` its first ``cntv`` lanes, ``whole`` whether that is all of them."""
    _, size, lanes, vty, i64, zero, _ = _vectors(context, builder, dtype)
    return (vty, size, i64, zero, _masked(builder, vty, "load"), _masked(builder, vty, "store"),
            ir.Constant(ir.IntType(32), size),
            *_wino.counted_lanes(builder, i64, lanes, 0, cntv))


@intrinsic
def _wnhwc_in(typingctx, x, base, rs, cs, rows, cols, cnt, v, d0, vs):
    """``V = B^T d B`` of one tile for a vector of channels: ``d[i][j]`` the ``cnt`` values
    (one vector's lanes at most) at ``x[base + i * rs + j * cs ..]``, zero where bit ``i`` of
    ``rows`` or bit ``j`` of ``cols`` is clear (outside the image: never read); element ``xi``
    stored at ``v[d0 + xi * vs ..]`` (``cnt`` lanes)."""
    if not all(isinstance(a, types.Array) and a.ndim == 1 for a in (x, v)) or \
            x.dtype != v.dtype or x.dtype != types.float32:
        return None
    sig = types.void(x, base, rs, cs, rows, cols, cnt, v, d0, vs)

    def codegen(context, builder, signature, args):
        at = signature.args
        xp = context.make_array(at[0])(context, builder, args[0]).data
        vp = context.make_array(at[7])(context, builder, args[7]).data
        bv, rsv, csv, rowsv, colsv, cntv, d0v, vsv = (
            _offset(context, builder, at[i], args[i]) for i in (1, 2, 3, 4, 5, 6, 8, 9))
        vty, size, i64, zero, mload, mstore, align, mask, whole = _counted(
            context, builder, at[0].dtype, cntv)

        def const(k):
            return ir.Constant(i64, k)

        def bit(word, k):
            return builder.icmp_signed("!=", builder.and_(word, const(1 << k)), const(0))

        d = [[None] * 4 for _ in range(4)]
        for i in range(4):
            for j in range(4):
                inside = builder.and_(bit(rowsv, i), bit(colsv, j))
                off = builder.add(bv, builder.add(builder.mul(rsv, const(i)),
                                                  builder.mul(csv, const(j))))
                with builder.if_else(inside) as (yes, no):
                    with yes:
                        p = builder.bitcast(builder.gep(xp, [off]), vty.as_pointer())
                        got = _edge_load(builder, mload, p, align, mask, whole, zero)
                        from_yes = builder.block
                    with no:
                        from_no = builder.block
                phi = builder.phi(vty)
                phi.add_incoming(got, from_yes)
                phi.add_incoming(zero, from_no)
                d[i][j] = phi
        v = _wino.input_transform(builder, d)
        for i, out in enumerate(v):
            for j in range(4):
                off = builder.add(d0v, builder.mul(vsv, const(4 * i + j)))
                p = builder.bitcast(builder.gep(vp, [off]), vty.as_pointer())
                _store(builder, mstore, out[j], p, align, mask, whole)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _wnhwc_out(typingctx, mo, m0, ms, cnt, bias, b0, y, o0, rs, cs, rows, cols, res, lo, hi):
    """``Y = A^T M A`` of one tile for a vector of channels (element ``xi`` at ``mo[m0 + xi *
    ms ..]``, a whole vector readable), plus ``bias[b0 ..]`` (empty: none), plus ``res`` at
    the outputs' places (empty: none), clamped to ``lo, hi`` (infinite: none; NaN kept), the
    ``cnt`` lanes stored at ``y[o0 + a * rs + b * cs ..]`` for the tile's output rows ``a <
    rows`` and columns ``b < cols`` (1 or 2 each: a tile past the plane's last row or column
    stores the ones inside)."""
    if not all(isinstance(a, types.Array) and a.ndim == 1 for a in (mo, bias, y, res)) or \
            len({mo.dtype, bias.dtype, y.dtype, res.dtype}) != 1 or mo.dtype != types.float32:
        return None
    sig = types.void(mo, m0, ms, cnt, bias, b0, y, o0, rs, cs, rows, cols, res, lo, hi)

    def codegen(context, builder, signature, args):
        at = signature.args
        mp = context.make_array(at[0])(context, builder, args[0]).data
        biasa = context.make_array(at[4])(context, builder, args[4])
        yp = context.make_array(at[6])(context, builder, args[6]).data
        resa = context.make_array(at[12])(context, builder, args[12])
        m0v, msv, cntv, b0v, o0v, rsv, csv, rowsv, colsv = (
            _offset(context, builder, at[i], args[i]) for i in (1, 2, 3, 5, 7, 8, 9, 10, 11))
        vty, size, i64, zero, mload, mstore, align, mask, whole = _counted(
            context, builder, at[0].dtype, cntv)

        def const(k):
            return ir.Constant(i64, k)

        m = []
        for xi in range(16):
            off = builder.add(m0v, builder.mul(msv, const(xi)))
            m.append(builder.load(builder.bitcast(builder.gep(mp, [off]), vty.as_pointer()),
                                  align=size))
        add = builder.fadd
        ys = _wino.output_transform(builder, m)
        nb = cgutils.unpack_tuple(builder, biasa.shape)[0]
        with builder.if_else(builder.icmp_signed("!=", nb, const(0))) as (yes, no):
            with yes:
                p = builder.bitcast(builder.gep(biasa.data, [b0v]), vty.as_pointer())
                bvec = _edge_load(builder, mload, p, align, mask, whole, zero)
                from_yes = builder.block
            with no:
                from_no = builder.block
        bias_v = builder.phi(vty)
        bias_v.add_incoming(bvec, from_yes)
        bias_v.add_incoming(zero, from_no)
        has_res = builder.icmp_signed("!=", cgutils.unpack_tuple(builder, resa.shape)[0],
                                      const(0))
        lov, hiv = (_splat(builder, vty, context.cast(builder, args[i], at[i], at[0].dtype))
                    for i in (13, 14))
        for b in range(2):
            for a in range(2):
                cond = builder.and_(builder.icmp_signed("<", const(a), rowsv),
                                    builder.icmp_signed("<", const(b), colsv))
                with builder.if_then(cond):
                    off = builder.add(o0v, builder.add(builder.mul(rsv, const(a)),
                                                       builder.mul(csv, const(b))))
                    acc = cgutils.alloca_once_value(builder, add(ys[a][b], bias_v))
                    with builder.if_then(has_res):
                        p = builder.bitcast(builder.gep(resa.data, [off]), vty.as_pointer())
                        builder.store(add(builder.load(acc), _edge_load(
                            builder, mload, p, align, mask, whole, zero)), acc)
                    x = builder.load(acc)
                    x = builder.select(builder.fcmp_unordered(">=", x, lov), x, lov)
                    x = builder.select(builder.fcmp_unordered("<=", x, hiv), x, hiv)
                    p = builder.bitcast(builder.gep(yp, [off]), vty.as_pointer())
                    _store(builder, mstore, x, p, align, mask, whole)
        return context.get_dummy_value()

    return sig, codegen


#: tiles of a block of :func:`_wino_range`: its ``V`` and products (``16 (C + M)`` values a
#: tile) within :data:`.winograd.BLOCK_BYTES`, at least :data:`.winograd.MIN_BLOCK_TILES` (the
#: transformed filter is read once per block)
@register_jitable
def _wino_block_most(c_: int, m_: int) -> int:
    return max(_wino.MIN_BLOCK_TILES, _wino.BLOCK_BYTES // (64 * (c_ + m_)))


@register_jitable
def _wino_block(c_: int, m_: int, tiles: int) -> int:
    tb = _wino_block_most(c_, m_)
    blocks = (tiles + tb - 1) // tb
    return (tiles + blocks - 1) // max(1, blocks)  # (even blocks)


@register_jitable
def wino_scratch_size(c_: int, m_: int, tiles: int) -> int:
    """The values of :func:`_wino_range`'s buffer for ``tiles`` tiles of ``c_`` input and
    ``m_`` output channels: a block's ``V`` and products, a vector of slack after each."""
    tb = _wino_block(c_, m_, tiles)
    return 16 * (tb * c_ + 16) + 16 * (tb * m_ + 16) + 16


@by_address
@jit
def _wino_range(x, up, y, n0, n1, pt, pl, bias, lo, hi, res, scratch, q0, q1, s0, s1):
    """:func:`winograd_nhwc`'s kernel for the samples ``n0 .. n1``, the output channels of the
    panels ``q0 .. q1`` of ``up`` and the tiles ``s0 .. s1`` of those samples (counted from
    the first tile of sample ``n0``, a row of tiles after another; -1: to the last; a part of a
    sample split over threads: each output the same sums whatever the part), ``scratch`` of
    :func:`wino_scratch_size` values for ``s1 - s0`` tiles or more (finite values: its padding
    lanes are transformed, never stored). By blocks of tiles: the input transform of a block
    into ``V`` [16, tiles, C], the 16 products into [16, tiles, M], the output transform with
    the epilogue into the image."""
    c_, h_, w_ = x.shape[3], x.shape[1], x.shape[2]
    oh_, ow_, m_ = y.shape[1], y.shape[2], y.shape[3]
    nr = _WIDE_NR
    npan = (m_ + nr - 1) // nr
    psize = npan * c_ * nr
    q1 = npan if q1 < 0 else min(q1, npan)
    th, tw = (oh_ + 1) // 2, (ow_ + 1) // 2
    per = th * tw
    s1 = (n1 - n0) * per if s1 < 0 else min(s1, (n1 - n0) * per)
    s0 = max(s0, 0)
    tiles = s1 - s0
    if up.shape[0] != 16 * psize or x.shape[0] != y.shape[0] or n0 < 0 or n1 > x.shape[0] or \
            q0 < 0 or (bias.shape[0] != 0 and bias.shape[0] != m_) or \
            (res.shape[0] != 0 and res.shape[0] != y.size) or \
            scratch.shape[0] < wino_scratch_size(c_, m_, tiles) or \
            oh_ + 2 < h_ + pt or ow_ + 2 < w_ + pl or pt < 0 or pl < 0 or pt > 2 or pl > 2:
        raise ValueError("pdjit: winograd_nhwc: the operands do not fit")
    if tiles <= 0 or q0 >= q1:
        return
    tb = _wino_block(c_, m_, tiles)
    vs, ms = tb * c_ + 16, tb * m_ + 16
    v = scratch[:16 * vs]
    mo = scratch[16 * vs:]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    none = bias[:0]
    lanes = 16
    ch0, ch1 = q0 * nr, min(q1 * nr, m_)
    for t0 in range(s0, s1, tb):
        nt = min(tb, s1 - t0)
        for t in range(nt):  # the input transform
            n = n0 + (t0 + t) // per
            r = (t0 + t) % per
            iy, ix = 2 * (r // tw) - pt, 2 * (r % tw) - pl
            rows, cols = 0, 0
            for k in range(4):
                if 0 <= iy + k < h_:
                    rows |= 1 << k
                if 0 <= ix + k < w_:
                    cols |= 1 << k
            base = ((n * h_ + iy) * w_ + ix) * c_
            for c0 in range(0, c_, lanes):
                _wnhwc_in(xf, base + c0, w_ * c_, c_, rows, cols, min(lanes, c_ - c0), v,
                          t * c_ + c0, vs)
        ntiles = (nt + MR - 1) // MR
        for xi in range(16):  # the products, each panel under every tile of the block
            for j in range(q0, q1):
                here = xi * psize + j * c_ * nr
                ahead = here + c_ * nr if j + 1 < q1 else (xi + 1) * psize + q0 * c_ * nr
                for i in range(0, nt, MR):
                    pfb, pfl = spread_share(i // MR, ntiles, c_ * NV, here, ahead, lanes)
                    _micro_spread(v, xi * vs + i * c_, c_, min(MR, nt - i), c_, up, here, mo,
                                 xi * ms + i * m_ + j * nr, m_, min(nr, m_ - j * nr), none, 0,
                                 none, -np.inf, np.inf, pfb, pfl)
        for t in range(nt):  # the output transform, the epilogue, the stores
            n = n0 + (t0 + t) // per
            r = (t0 + t) % per
            oy, ox = 2 * (r // tw), 2 * (r % tw)
            o = ((n * oh_ + oy) * ow_ + ox) * m_
            for c0 in range(ch0, ch1, lanes):
                _wnhwc_out(mo, t * m_ + c0, ms, min(lanes, ch1 - c0), bias, c0, yf, o + c0,
                           ow_ * m_, m_, min(2, oh_ - oy), min(2, ow_ - ox), res, lo, hi)


def _wino_pack(w):
    """``U_xi^T`` ([C, M]) of each of the 16 transformed filters of ``w`` packed as pgemm's
    right operand (panels of 64 output channels), one after another."""
    ut = _wino._make(np.ascontiguousarray(w))
    return np.concatenate([_pack_panels(ut[xi], _WIDE_NR) for xi in range(16)])


def winograd_nhwc_weight(w):
    """The filter ``w`` ([M, C, 3, 3], float32) transformed and packed for
    :func:`winograd_nhwc`, kept beside ``w`` (:func:`pdjit.codegen.params.derived`)."""
    return params.derived(w, ("winograd_nhwc",), lambda: _wino_pack(w))


replay.declare("derived", winograd_nhwc_weight)


#: calls of :func:`winograd_nhwc` (for tests that assert which kernel ran)
WINO_CALLS = [0]


def winograd_nhwc(x, up, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
    """``y[n] = clamp(conv3x3(x[n], W) + bias + res[n], lo, hi)`` for the samples ``n0 ..
    n1``, stride 1, no dilation, top/left pads ``pt``, ``pl`` of at most 2 (the bottom/right
    ones follow from ``y``'s size) by Winograd's F(2x2, 3x3): ``x`` [N, H, W, C], ``y`` [N, OH,
    OW, M] (float32, C-contiguous), ``W`` ([M, C, 3, 3]) transformed and packed by
    :func:`winograd_nhwc_weight` into ``up``; ``bias``, ``res``, ``lo``, ``hi`` as
    :func:`pointwise_nhwc`'s. The arguments are :func:`conv_nhwc`'s."""
    if sh != 1 or sw != 1 or dh != 1 or dw != 1 or kh != 3 or kw != 3:
        raise ValueError("pdjit: winograd_nhwc: a 3x3 filter of stride 1, no dilation")
    want = 16 * -(-y.shape[3] // _WIDE_NR) * _WIDE_NR * x.shape[3]
    if up.shape != (want,):
        raise ValueError(f"pdjit: winograd_nhwc: the operands do not fit: a transformed filter "
                         f"of {want} values expected, got {up.shape}")
    WINO_CALLS[0] += 1
    if not _wino_ready():
        _wino_numpy(x, up, y, n0, n1, pt, pl, bias, lo, hi, res)
        return
    tiles = (n1 - n0) * ((y.shape[1] + 1) // 2) * ((y.shape[2] + 1) // 2)
    scratch = _wino._scratch(wino_scratch_size(x.shape[3], y.shape[3], tiles))
    replay.kernel_call(_wino_range, x, up, y, n0, n1, pt, pl, bias, float(lo), float(hi), res,
                       scratch, 0, -1, 0, -1)


replay.declare("leaves", winograd_nhwc)

#: a call of :func:`_wino_range` of the types warmup compiles it for (:func:`_wino_ready`)
_WINO_CALL: list = []


def _wino_ready() -> bool:
    """Whether :func:`_wino_range` may serve :func:`winograd_nhwc`: compiled ahead by ``pdjit
    warmup`` and the background warmup, loaded from the disk cache from a process's few first
    runs on (as :func:`_conv_ready`); until then :func:`_wino_numpy` serves, so that its
    compile stays out of a cold process's first results."""
    if not _WINO_CALL:
        a4, a1 = np.empty((1, 1, 1, 1), np.float32), np.empty(0, np.float32)
        _WINO_CALL.append((a4, a1, a4, 0, 0, 0, 0, a1, 0.0, 0.0, a1, a1, 0, 0, 0, 0))
    return team.ready(_wino_range, _WINO_CALL[0])


@numpy_blas_calls
def _wino_numpy(x, up, y, n0, n1, pt, pl, bias, lo, hi, res):
    """:func:`winograd_nhwc` by NumPy's calls: the same transforms on whole arrays of tiles,
    a product per panel of each packed ``U_xi^T`` (BLAS), then the bias, the residual and the
    clamp (not replayed: a recording of it is refused)."""
    replay.refuse("winograd_nhwc's kernel is not ready")
    n, h, w_, c = x.shape
    oh, ow, m = y.shape[1], y.shape[2], y.shape[3]
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    npan = -(-m // _WIDE_NR)
    xp = np.zeros((n1 - n0, 2 * th + 2, 2 * tw + 2, c), x.dtype)
    hh, ww = min(h, 2 * th + 2 - pt), min(w_, 2 * tw + 2 - pl)
    xp[:, pt:pt + hh, pl:pl + ww] = x[n0:n1, :hh, :ww]
    d = [[xp[:, i:i + 2 * th:2, j:j + 2 * tw:2] for j in range(4)] for i in range(4)]
    t = [[d[0][j] - d[2][j] for j in range(4)], [d[1][j] + d[2][j] for j in range(4)],
         [d[2][j] - d[1][j] for j in range(4)], [d[1][j] - d[3][j] for j in range(4)]]
    v = [f(r) for r in t for f in (lambda r: r[0] - r[2], lambda r: r[1] + r[2],
                                   lambda r: r[2] - r[1], lambda r: r[1] - r[3])]
    panels = up.reshape(16, npan, c, _WIDE_NR)
    mo = [np.matmul(v[xi].reshape(-1, c), panels[xi]).transpose(1, 0, 2).reshape(
        -1, npan * _WIDE_NR)[:, :m].reshape(n1 - n0, th, tw, m) for xi in range(16)]
    c0 = [mo[4 * i] + mo[4 * i + 1] + mo[4 * i + 2] for i in range(4)]
    c1 = [mo[4 * i + 1] - mo[4 * i + 2] - mo[4 * i + 3] for i in range(4)]
    out = np.empty((n1 - n0, th, 2, tw, 2, m), x.dtype)
    for b, cb in enumerate((c0, c1)):
        out[:, :, 0, :, b] = cb[0] + cb[1] + cb[2]
        out[:, :, 1, :, b] = cb[1] - cb[2] - cb[3]
    out = out.reshape(n1 - n0, 2 * th, 2 * tw, m)[:, :oh, :ow]
    y[n0:n1] = _conv.epilogue_numpy(out, y, n0, n1, bias, lo, hi, res, 3)


# Inside compiled code (a native driver, an ahead-of-time artifact) a weight derived from a
# filter is made at each call, and a transformed filter costs more than Winograd saves at batch
# 1 (in native code, one thread: 256 x 256 channels 6.5 ms, 512 x 512 27 ms, against 1.8 and
# 10.5 for the direct kernel's packing; the 14x14 and 7x7 layers' products take 3.4 and 6.5
# ms, the direct kernel's 7.1 and 9.8): there these layers run on the direct kernel, its filter
# packed for it, as the NCHW Winograd layers run on the taps kernel in compiled code.
@overload(winograd_nhwc_weight)
def _winograd_nhwc_weight_native(w):
    def impl(w):
        return conv_nhwc_weight(w)
    return impl


@overload(winograd_nhwc)
def _winograd_nhwc_native(x, up, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
    def impl(x, up, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
        conv_nhwc(x, up, y, n0, n1, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res)
    return impl


def _split_wino(parts, work, x, up, y, sh, sw, pt, pl, dh, dw, kh, kw, bias, lo, hi, res):
    """One sample of :func:`winograd_nhwc` in parts on ``parts`` threads (as
    :func:`_split_conv`: on a parallel loop by :func:`.team.plan`, by panels of output channels
    where the transformed filter outweighs the image, each part transforming the whole input,
    else by ranges of tiles, each part transforming its own; else by panels, or ranges of
    tiles where the panels are fewer than the parts, on ``run_parts``' helpers); whether it
    split. Each output the same sums as in one call."""
    m_ = y.shape[3]
    npan = -(-m_ // _WIDE_NR)
    tiles = ((y.shape[1] + 1) // 2) * ((y.shape[2] + 1) // 2)
    parts = min(parts, tiles)
    if x.shape[0] != 1 or parts < 2 or work < _conv._TEAM_MIN_WORK or not _wino_ready():
        return False
    # (a part's range of tiles needs at most a whole block's buffer, or all its tiles')
    need = wino_scratch_size(x.shape[3], m_, min(tiles, _wino_block_most(x.shape[3], m_)))
    scratch = _wino._scratch(need * parts)[:need * parts].reshape(parts, need)
    call = (x, up, y, pt, pl, bias, float(lo), float(hi), res, scratch)
    if team.run(_wino_parts, call + team.plan(parts, tiles, npan, BY_PANELS[0] and
                                              up.size > x.size)):
        return True
    if work < _conv._CHANNELS_MIN_WORK:
        return False
    by_panels = npan >= parts
    units = npan if by_panels else tiles
    starts = [units * k // parts for k in range(parts)]  # (a range's buffer: its own)

    def part(p0, p1):
        q0, q1, s0, s1 = (p0, p1, 0, -1) if by_panels else (0, -1, p0, p1)
        _wino_range(x, up, y, 0, 1, pt, pl, bias, float(lo), float(hi), res,
                    scratch[starts.index(p0)], q0, q1, s0, s1)

    run_chunks(part, units, parts, parts)
    return True


@pjit
def _wino_parts(x, up, y, pt, pl, bias, lo, hi, res, scratch, bounds, pans):
    """:func:`_split_wino`'s parts, one per thread of a parallel loop: part ``k`` the tiles
    ``bounds[g, k] .. bounds[g, k + 1]`` of the panels ``pans[g] .. pans[g + 1]`` for every
    ``g`` (:func:`.team.plan`), on ``scratch[k]``."""
    for k in numba.prange(bounds.shape[1] - 1):
        for g in range(bounds.shape[0]):
            if pans[g + 1] > pans[g] and bounds[g, k + 1] > bounds[g, k]:
                _wino_range(x, up, y, 0, 1, pt, pl, bias, lo, hi, res, scratch[k], pans[g],
                            pans[g + 1], bounds[g, k], bounds[g, k + 1])


_conv.CHANNEL_SPLITS[winograd_nhwc] = _split_wino
# (the kernel, which NumPy's calls stand in for until it is ready, and the split of one sample
# by a parallel loop: compiled ahead by warmup only, see team.ready)
jobs("channels_last.winograd (warmup)")(lambda T: [] if np.dtype(T) != np.float32 else [
    (_wino_range, ((T, 4), (T, 1), (T, 4), int, int, int, int) + _ep(T)[:4] + ((T, 1), int,
                                                                               int, int, int)),
    (_wino_parts, ((T, 4), (T, 1), (T, 4), int, int) + _ep(T)[:4] + ((T, 2), (np.int64, 2),
                                                                    (np.int64, 1)))])
compile_cost(1.5, _wino_range)
compile_cost(1.5, _wino_parts)
