"""Pointwise convolutions (1x1, stride 1, no padding, one group, NCHW) on pdjit's packed GEMM
(:mod:`.pgemm`): ``y[n] = W @ x[n]`` with ``W`` ([M, C]) a weight packed once and each
sample's image ``x[n]`` ([C, H * W]) read in place, the epilogue (a bias per output channel,
a residual, a clamp) applied to each tile while it is in registers.

Two orientations of the tile, picked by the plane's size and the channels
(:func:`_choice`):

- :func:`.pgemm.pointwise_rows`: tiles of ``MR`` output channels by ``NR`` pixels, ``W``
  packed by blocks of ``MR`` rows (the layout of :func:`.pgemm.pack_a`), for planes of
  :data:`ROWS_MIN_PLANE` pixels or more of at most :data:`ROWS_MAX_CHANNELS` input channels
  and images of at most :data:`ROWS_MAX_BYTES` (each block of pixels that stays in the L2
  cache swept under every tile, the image read in place, the outputs written by rows);
- :func:`.pgemm.pointwise_cols`: the product transposed, tiles of ``MR`` pixels by ``NR``
  output channels, ``W^T`` packed in panels as :func:`.pgemm.packed_weight` packs a product's
  weight, the tile stored into the channels' rows by scatters, for planes of at most
  :data:`COLS_MAX_PLANE` pixels (7x7: 49 pixels fill vectors of ``NR`` badly), and 14x14
  ones whose output channels fill one panel and are at most half the input channels.

The other shapes stay with the kernels of :func:`.conv._fwd_range` (OpenBLAS per sample or
the taps kernel), which measured as fast or faster there.

The lowering (``pdjit.codegen.cpu.lowerings.conv``) calls :func:`pointwise_range` with the
filter packed by :func:`pointwise_weight` where the filter is a weight (a parameter no op of
the program writes): the packed copy is kept beside the array (:mod:`pdjit.codegen.params`)
and made again after a run that may write it (training). Compiled code (a native driver, an
ahead-of-time artifact) packs once per run, where the batch is large enough for the copy not
to count (:data:`NATIVE_MIN_PIXELS`), else runs :func:`.conv._fwd_range`. A one-sample call
from the host driver is split over threads (:func:`_split`, for ``conv.split_work``): on
the row tiles by whole panels of pixels (by a parallel loop where it is ready), else by whole
tiles of the packed filter's output channels; a batch by samples.

Measured alone (``benchmarks/bench_pointwise.py --rounds 3``: one thread, float32, bias +
relu, medians of thread time on the shared 2-vCPU machine at load 0.9, ms, the packed kernel
/ :func:`.conv._fwd_range`, batch 1 then 16): the transposed tiles on 7x7 planes: ResNet-50
2048->512 0.80 / 1.00 and 13.1 / 17.4, 512->2048 0.81 / 1.02 and 12.1 / 17.2; MobileNetV2
160->960 0.119 / 0.144 and 2.16 / 2.40, 960->160 0.121 / 0.153 and 2.04 / 2.46, 320->1280
0.309 / 0.378 and 4.72 / 6.25; 14x14 384->64 0.066 / 0.091 and 1.21 / 1.59. The row tiles:
MobileNetV2 112x112 16->96 0.43 / 0.47 and 8.7 / 9.9, 56x56 24->144 0.189 / 0.225 and 3.21 /
3.49, 28x28 32->192 0.082 / 0.098 and 1.39 / 1.38 (left: ResNet-50 56x56 64->256 0.89 / 0.83
and 17.6 / 15.1, MobileNetV2 112x112 32->16 0.179 / 0.164). Whole models through the
Predictor, one thread, the packed kernels switched on and off (:data:`_PACKED`) in one
process by turns, medians of thread time at load 1.0-1.3: MobileNetV2 7.36 / 7.75 ms at
batch 1, 153 / 158 at batch 16; ResNet-50 66.1 / 69.5 at batch 1, 1026 / 1026 at batch 16.
"""
import numba
import numpy as np
from numba.core import types
from numba.extending import overload, register_jitable

from pdjit.codegen import params
from pdjit.codegen.cpu.lib import conv as _conv
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import JOBS, compile_cost, jobs, pjit
from pdjit.codegen.cpu.lib.pgemm import (
    MR,
    NV,
    pack_a,
    pack_scaled,
    pointwise_cols,
    pointwise_rows,
    rows_by_pixels,
)

__all__ = ["pointwise_range", "pointwise_range_cols", "pointwise_range_rows",
           "pointwise_weight"]

#: planes of at most this many pixels take the transposed tiles (:func:`.pgemm.pointwise_cols`)
COLS_MAX_PLANE = 100
#: planes of at most this many pixels (14x14) take the transposed tiles where the output
#: channels fill one panel of ``NR`` and are at most half the input channels (a compression
#: read once: MobileNetV2's 384 -> 64 in the model 0.063-0.077 ms against 0.089-0.102 at
#: batch 1, 2.14 against 2.60 at batch 16). Each panel reads the whole image: with ResNet-50's
#: 1024 -> 256 and 1024 -> 512 (4 and 8 panels) on them too the model took as long at batch 1
#: (66.8 / 66.9 ms) and 3 % longer at batch 16 (966 / 936 ms, on and off by turns in one
#: process); the expansions 64 -> 384 and 96 -> 576 (short sums, many scatters) were slower
COLS_WIDE_PLANE = 256
#: the output channels of a panel of the transposed tiles (float32)
_NR = NV * 16
#: planes of at least this many pixels (28x28 and up) take :func:`.pgemm.pointwise_rows`
#: where the input channels are at most :data:`ROWS_MAX_CHANNELS` and a sample's image at
#: most :data:`ROWS_MAX_BYTES`
ROWS_MIN_PLANE = 512
#: the most input channels :func:`.pgemm.pointwise_rows` serves: short sums over many pixels
#: (MobileNetV2's 112x112 16 -> 96, 56x56 24 -> 144 and 28x28 32 -> 192, 8-25 % faster than
#: OpenBLAS per sample in the model at batch 16). With the image swept by blocks of pixels
#: (:data:`.pgemm._BLOCK_BYTES`) it measured faster on ResNet-50's 56x56 64 -> 64 and 64 ->
#: 256 and 28x28 128 -> 512 too (alone, one thread, ms against OpenBLAS per sample, batch 1
#: then 16: 0.24 / 0.26 and 5.2 / 7.1, 0.98 / 1.17 and 18.5 / 24.8, 1.06 / 1.11 and 16.7 /
#: 18.2; in the model those layers 17-22 % faster at batch 16, the model 1273 -> 1239 ms), but
#: taking them compiles this kernel for ResNet-50 as well: its cold first result went from
#: 4.7-4.8 s to 5.8-5.9 s (7.8-8.5 -> 9.8 s of CPU; ``bench_coldstart.py --models
#: resnet50``), past the 5 s a cold start may take. Measured again in the model with this
#: limit at 128 (ResNet-50's expansions on the row tiles, on and off by turns in one process:
#: 0.990x and 1.002x at batch 1 on one and two threads, 0.998x and 1.008x at batch 16): no
#: faster there, where those layers wait on memory (their residual and output), so not taken
#: even off the first result's path. Compressions and more input channels lost at batch 16 anyway
#: (56x56 256 -> 64 20.7 / 17.5, 28x28 512 -> 128 19.0 / 17.0, 192 -> 32 3.1 / 2.6, 56x56 144
#: -> 24 7.9 / 5.7) though they won at batch 1 (1.05 / 1.08, 1.10 / 1.30, 0.11 / 0.16, 0.21 /
#: 0.24)
ROWS_MAX_CHANNELS = 32
#: the largest image (bytes of one sample) :func:`.pgemm.pointwise_rows` is picked for
ROWS_MAX_BYTES = 1 << 20
#: the fewest output and input channels the packed kernels serve
MIN_CHANNELS = 16
#: compiled code, which packs the filter at each run, runs the packed kernels from this many
#: pixels (samples x plane) on: packing took 0.5-0.7 ns a value (2048x512, 512x2048, 256x1024,
#: one thread), the product ~0.017 ns a multiply-add, so the copy costs at most ~8 % of it
#: from 512 pixels (7x7 planes from batch 11, 14x14 from 3), where the packed kernels gain
#: 20-40 %
NATIVE_MIN_PIXELS = 512
#: whether the packed kernels serve pointwise convolutions (a switch for benchmarks, tests)
_PACKED = [True]


@register_jitable
def _choice(m_, c_, p_) -> int:
    """Which kernel serves ``m_`` output and ``c_`` input channels (float32) over planes of
    ``p_`` pixels: 1 :func:`.pgemm.pointwise_rows`, 2 :func:`.pgemm.pointwise_cols`, 0 those
    of :func:`.conv._fwd_range` (where they measured as fast or faster: most planes of 14x14,
    and those of 28x28 and up of more than 32 input channels, on OpenBLAS or the taps
    kernel)."""
    if m_ < MIN_CHANNELS or c_ < MIN_CHANNELS:
        return 0
    if p_ <= COLS_MAX_PLANE:
        return 2
    if p_ <= COLS_WIDE_PLANE and m_ == _NR and c_ >= 2 * m_:
        return 2
    if p_ >= ROWS_MIN_PLANE and c_ <= ROWS_MAX_CHANNELS and c_ * p_ * 4 <= ROWS_MAX_BYTES:
        return 1
    return 0


@register_jitable
def _packed_size(m_, c_, p_) -> int:
    """The values of the filter packed for planes of ``p_`` pixels (0: not packed)."""
    k = _choice(m_, c_, p_)
    if k == 2:
        return ((m_ + _NR - 1) // _NR) * c_ * _NR
    return ((m_ + MR - 1) // MR) * c_ * MR if k == 1 else 0


def usable(m: int, c: int, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, dh: int,
           dw: int, groups: int, p: int = -1) -> str:
    """The entry a convolution of this filter ([m, c, kh, kw]), geometry and plane of ``p``
    pixels (-1: unknown) calls (what the lowering knows before any run): ``""`` where the
    packed kernels never serve it, else ``pointwise_range`` or, the plane known, the name that
    says which kernel serves (``pointwise_range_rows``, ``_cols``; ``""`` for neither)."""
    if not (kh == 1 and kw == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0 and
            groups == 1 and m >= MIN_CHANNELS and c >= MIN_CHANNELS):
        return ""
    if p < 1:
        return "pointwise_range"
    return ("", "pointwise_range_rows", "pointwise_range_cols")[_choice(m, c, p)]


def _pack(w, p_):
    """``w`` packed by NumPy (no kernel to compile): blocks of ``MR`` rows
    (:func:`.pgemm.pack_a`) or panels of ``NR`` rows of ``W`` (``W^T``'s columns,
    :func:`.pgemm.pack_b`), each ``C`` steps of the block's values, zero past ``M``."""
    m = w.shape[0]
    w2 = w.reshape(m, w.size // m)
    step = _NR if _choice(m, w2.shape[1], p_) == 2 else MR
    wp = np.zeros((-(-m // step) * step, w2.shape[1]), w.dtype)
    wp[:m] = w2
    return np.ascontiguousarray(
        wp.reshape(-1, step, w2.shape[1]).transpose(0, 2, 1)).reshape(-1)


def pointwise_weight(w, p_, n_=1):
    """The filter ``w`` ([M, C, 1, 1], float32) packed for planes of ``p_`` pixels (see the
    module docstring), kept beside ``w`` (:func:`pdjit.codegen.params.derived`: until the
    array goes or a run may write it); an empty array where the packed kernels do not serve
    (:func:`_choice`, another dtype, the switch off). ``n_``: the batch (read by compiled
    code only)."""
    if w.dtype != np.float32 or w.ndim != 4 or not _PACKED[0] or type(w) is not np.ndarray:
        return np.empty(0, w.dtype)
    k = _choice(w.shape[0], w.size // max(1, w.shape[0]), p_)
    if k == 0:
        return np.empty(0, w.dtype)
    return params.derived(w, ("pointwise", k), lambda: _pack(w, p_))


@overload(pointwise_weight)
def _pointwise_weight_native(w, p_, n_=1):
    """In compiled code (a native driver, an ahead-of-time artifact: once per run of the
    driver, whatever blocks of samples it calls :func:`pointwise_range` for): ``w`` packed
    where the batch of ``n_`` samples has :data:`NATIVE_MIN_PIXELS` pixels or more (the copy
    of ``M * C`` values then a few per cent of the product at most), else empty (the kernels
    of :func:`.conv._fwd_range`)."""
    if not (isinstance(w, types.Array) and w.dtype == types.float32 and w.ndim == 4):
        def none(w, p_, n_=1):
            return np.empty(0, w.dtype)
        return none

    def impl(w, p_, n_=1):
        m_ = w.shape[0]
        c_ = w.size // m_ if m_ > 0 else 0
        k = _choice(m_, c_, p_)
        if k == 0 or n_ * p_ < NATIVE_MIN_PIXELS or w.shape[2] != 1 or w.shape[3] != 1:
            return np.empty(0, w.dtype)
        w2 = np.ascontiguousarray(w).reshape((m_, c_))
        packed = np.empty(_packed_size(m_, c_, p_), w.dtype)
        if k == 2:
            pack_scaled(w2, True, 1.0, packed)
        else:
            pack_a(w2, packed)
        return packed
    return impl


@register_jitable
def _fits(x, ap, y, bias, res) -> bool:
    m_, c_ = y.shape[1], x.shape[1]
    p_ = y.shape[2] * y.shape[3]
    return ap.size != 0 and ap.size == _packed_size(m_, c_, p_) and \
        x.shape[2] * x.shape[3] == p_ and x.shape[0] == y.shape[0] and \
        (bias.size == 0 or bias.size == m_) and \
        (res.size == 0 or res.size == y.size)


def pointwise_range(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """``y[n] = clamp(conv(x[n], w) + bias[m] + res, lo, hi)`` for the samples ``n0 .. n1``
    (the arguments of :func:`.conv._fwd_range`, with ``ap`` the filter packed by
    :func:`pointwise_weight`): on the packed kernels where ``ap`` is not empty and fits, else
    :func:`.conv._fwd_range`."""
    if ap.size and x.dtype == np.float32 and _fits(x, ap, y, bias, res):
        if _choice(y.shape[1], x.shape[1], y.shape[2] * y.shape[3]) == 2:
            pointwise_cols(x, ap, y, n0, n1, bias, lo, hi, res)
        else:
            pointwise_rows(x, ap, y, n0, n1, bias, lo, hi, res)
        return
    _conv._fwd_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)


@overload(pointwise_range)
def _pointwise_range_native(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi,
                            res):
    """In compiled code: as in Python (``ap`` empty where compiled code's
    :func:`pointwise_weight` packed nothing)."""
    if not (isinstance(x, types.Array) and x.dtype == types.float32):
        def other(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
            _conv._fwd_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi,
                             res)
        return other

    def impl(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
        if ap.size and _fits(x, ap, y, bias, res):
            lo_, hi_ = float(lo), float(hi)
            if _choice(y.shape[1], x.shape[1], y.shape[2] * y.shape[3]) == 2:
                pointwise_cols(x, ap, y, n0, n1, bias, lo_, hi_, res)
            else:
                pointwise_rows(x, ap, y, n0, n1, bias, lo_, hi_, res)
            return
        _conv._fwd_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)
    return impl


def _packed(x, ap, y, bias, res) -> bool:
    """Whether a one-sample :func:`pointwise_range` call runs on the packed kernels."""
    return bool(ap.size) and x.dtype == np.float32 and x.shape[0] == 1 and \
        _fits(x, ap, y, bias, res)


def _tile_bounds(parts, m_, c_, p_):
    """``(first channels of at most parts ranges then the end, the end of each range's packed
    rows, whether the tiles are transposed)`` of a one-sample call on the packed kernels of
    ``m_`` output and ``c_`` input channels over ``p_`` pixels: the tiles of the packed filter
    (``MR`` rows, or panels of ``NR`` for the transposed tiles) dealt out evenly, each range at
    least ``conv._PART_ROWS`` channels' worth of them and the last at least
    :data:`MIN_CHANNELS` channels (so that every part takes the kernel the whole takes); None
    where there is one range. (By ranges of 6 tiles MobileNetV2's 16 -> 96 at 112x112 split
    36 / 60 and ran 0.37 ms on two threads against 0.49 on one.)"""
    cols = _choice(m_, c_, p_) == 2
    step = _NR if cols else MR
    tiles = -(-m_ // step)
    k = min(parts, tiles // -(-max(MIN_CHANNELS, _conv._PART_ROWS) // step))
    while k >= 2 and m_ - tiles * (k - 1) // k * step < MIN_CHANNELS:
        k -= 1  # (the last part would be too small for the packed kernels)
    if k < 2:
        return None
    bounds = [tiles * i // k * step for i in range(k)] + [m_]
    return bounds, [-(-b // step) * step for b in bounds[1:]], cols


def _pixel_bounds(parts, p_):
    """The first pixel of each of at most ``parts`` ranges of a plane of ``p_`` pixels on the
    row tiles (panels of ``NR`` pixels dealt out evenly, the last one short where ``p_`` is
    no multiple of ``NR``), then the end; None where there is one range."""
    units = -(-p_ // _NR)
    k = min(parts, units)
    if k < 2:
        return None
    return np.array([units * i // k * _NR for i in range(k)] + [p_], np.int64)


def _split(parts, work, x, w, ap, y, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """A one-sample :func:`pointwise_range` split over at most ``parts`` ranges: on the row
    tiles by ranges of its pixels (:func:`.pgemm.rows_by_pixels`, by a parallel loop where
    ready: each part reads only its pixels of the image, mostly what the layer before wrote
    on the same thread where that layer split by pixels too); else of its output channels
    (``conv.split_work``; :func:`.conv.split_channels` says when): on the packed kernels by
    :func:`_tile_bounds`, each part's slice of ``ap`` the packed rows of its
    channels, by a parallel loop (:func:`_by_channels`, where ready) or on ``run_parts``'
    helpers; else :func:`.conv._fwd_range`'s parts. Each output is summed as the whole call
    sums it (in order of the input channels, whatever the tile's other rows), so the result
    is the same, bit for bit, however it is split. Whether it split the call."""
    rest = (sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)
    if not _packed(x, ap, y, bias, res):
        return _conv.split_channels(_conv._fwd_range, parts, work, (x, w, y, *rest))
    p_ = y.shape[2] * y.shape[3]
    if work >= _conv._TEAM_MIN_WORK and _choice(y.shape[1], x.shape[1], p_) == 1:
        pixels = _pixel_bounds(parts, p_)
        if pixels is not None and team.run(rows_by_pixels, (x, ap, y, pixels, bias, float(lo),
                                                             float(hi), res)):
            return True
    found = _tile_bounds(parts, y.shape[1], x.shape[1], p_)
    if found is None:
        return False
    bounds, ends, cols = found
    if work >= _conv._TEAM_MIN_WORK:
        call = (x, ap, y, np.array(bounds, np.int64), np.array(ends, np.int64), cols, bias,
                float(lo), float(hi), res)
        if team.run(_by_channels, call):
            return True
    if work < _conv._CHANNELS_MIN_WORK:
        return False
    c_ = x.shape[1]
    calls = [(x, w[a:b], ap[a * c_:end * c_], y[:, a:b], 0, 1, sh, sw, pt, pl, dh, dw, groups,
              bias[a:b] if bias.size else bias, lo, hi, res[a * p_:b * p_] if res.size else res)
             for a, b, end in zip(bounds, bounds[1:], ends)]
    _conv.run_parts(pointwise_range, calls, len(calls) - 1)
    return True


@pjit
def _by_channels(x, ap, y, bounds, ends, cols, bias, lo, hi, res):
    """The packed kernels of one sample, ranges ``bounds`` of output channels (their packed
    rows up to ``ends``) in parallel (:func:`_split`)."""
    c_ = x.shape[1]
    for p in numba.prange(bounds.shape[0] - 1):
        a, b = bounds[p], bounds[p + 1]
        ys, bs, rs = _conv._part_out(y, bias, res, a, b)
        aps = ap[a * c_:ends[p] * c_]
        if cols:
            pointwise_cols(x, aps, ys, _conv._plain(0), _conv._plain(1), bs, lo, hi, rs)
        else:
            pointwise_rows(x, aps, ys, _conv._plain(0), _conv._plain(1), bs, lo, hi, rs)


_conv.CHANNEL_SPLITS[pointwise_range] = _split


#: :func:`pointwise_range` under the names a lowering calls where the sizes it knows say which
#: kernel serves (:func:`_choice`), so that a plan's compile jobs name that kernel alone
pointwise_range_rows = pointwise_range_cols = pointwise_range


def _jobs(T, kinds=(1, 2)):
    """The packed kernels of ``kinds`` (float32), else :func:`.conv._fwd_range`'s."""
    if np.dtype(T) != np.float32:
        return JOBS["conv._fwd_range"](T)
    ep = ((T, 1), float, float, (T, 1))
    k = []
    if 1 in kinds:
        k.append((pointwise_rows, ((T, 4), (T, 1), (T, 4), int, int) + ep))
    if 2 in kinds:
        k.append((pointwise_cols, ((T, 4), (T, 1), (T, 4), int, int) + ep))
    return k


jobs("pointwise_range")(_jobs)
jobs("pointwise_range_rows")(lambda T: _jobs(T, (1,)))
jobs("pointwise_range_cols")(lambda T: _jobs(T, (2,)))
# compile time (CPU seconds, a cold compile alone in a fresh process, the machine at load ~8:
# 0.70-0.76 s each; 0.41 s for the second after the first)
compile_cost(0.75, pointwise_rows, pointwise_cols)
compile_cost(1.6, _by_channels)
# (the split of a one-sample call by a parallel loop: compiled ahead by warmup only, see
# lib.team.ready)
jobs("pointwise._by_channels (warmup)")(lambda T: [] if np.dtype(T) != np.float32 else [
    (_by_channels, ((T, 4), (T, 1), (T, 4), (np.int64, 1), (np.int64, 1), bool, (T, 1), float,
                    float, (T, 1))),
    (rows_by_pixels, ((T, 4), (T, 1), (T, 4), (np.int64, 1), (T, 1), float, float, (T, 1)))])
compile_cost(0.9, rows_by_pixels)
