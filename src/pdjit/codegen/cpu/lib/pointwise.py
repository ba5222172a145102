"""Pointwise convolutions (1x1, stride 1, no padding, one group, NCHW) on pdjit's packed GEMM
(:mod:`.pgemm`): ``y[n] = W @ x[n]`` with ``W`` ([M, C]) a weight packed once and each
sample's image ``x[n]`` ([C, H * W]) read in place, the epilogue (a bias per output channel,
a residual, a clamp) applied to each tile while it is in registers; and other convolutions of
one group onto small planes (7x7, 9x9: any filter, stride, padding) on the same transposed
tiles, over each sample's patches (im2col, ``K = C * kh * kw`` rows), where the taps kernel
of :func:`.conv._fwd_range` would waste much of its vectors of pixels (:func:`_kind`); and
onto long output rows where the output channels fill whole panels (a network's first layer,
a ResNet's stride-2 3x3 layers: :data:`TAPS_MIN_ROW`) or onto rows of whole tiles of 7 pixels
(a ResNet's last 3x3 layers: :data:`TAPS3_MIN_CHANNELS`), the tiles reading each step's tap in
a padded copy of the image, no patches (:func:`conv_taps`).

Two orientations of the tile, picked by the plane's size and the channels
(:func:`_choice`):

- :func:`.pgemm.pointwise_rows`: tiles of ``MR`` output channels by ``NR`` pixels, ``W``
  packed by blocks of ``MR`` rows (the layout of :func:`.pgemm.pack_a`), for the planes the
  other tiles do not take (each block of pixels that stays in the L2 cache swept under every
  tile, the image read in place, the outputs written by rows: :func:`_choice`);
- :func:`pointwise_cols`: the product transposed, tiles of pixels by panels of output
  channels (6 by 64 or 7 by 48), ``W^T`` packed in panels as :func:`.pgemm.packed_weight`
  packs a product's weight, the tile transposed in registers into the channels' rows, for planes
  of at most :data:`COLS_MAX_PLANE` pixels (7x7: 49 pixels fill vectors of ``NR`` badly).

Fewer than :data:`MIN_CHANNELS` channels stay with the kernels of :func:`.conv._fwd_range`
(OpenBLAS per sample or the taps kernel).

The lowering (``pdjit.codegen.cpu.lowerings.conv``) calls :func:`pointwise_range` with the
filter packed by :func:`pointwise_weight` where the filter is a weight (a parameter no op of
the program writes): the packed copy is kept beside the array (:mod:`pdjit.codegen.params`)
and made again after a run that may write it (training). Compiled code (a native driver, an
ahead-of-time artifact) packs once per run, where the batch is large enough for the copy not
to count (:data:`NATIVE_MIN_PIXELS`), else runs :func:`.conv._fwd_range`. A one-sample call
from the host driver is split over threads (:func:`_split`, for ``conv.split_work``): on
the row tiles by whole panels of pixels (by a parallel loop where it is ready), the
transposed tiles over the patches of a filter wider than 1x1 by ranges of output rows, else by
whole tiles of the packed filter's output channels; a batch by samples.

Measured alone (``benchmarks/bench_pointwise.py --rounds 3``: one thread, float32, bias +
relu, medians of thread time on the shared 2-vCPU machine at load 0.9, ms, the packed kernel
/ :func:`.conv._fwd_range`, batch 1 then 16): the transposed tiles on 7x7 planes: ResNet-50
2048->512 0.80 / 1.00 and 13.1 / 17.4, 512->2048 0.81 / 1.02 and 12.1 / 17.2; MobileNetV2
160->960 0.119 / 0.144 and 2.16 / 2.40, 960->160 0.121 / 0.153 and 2.04 / 2.46, 320->1280
0.309 / 0.378 and 4.72 / 6.25 (on 14x14 planes, 384->64 0.066 / 0.091 and 1.21 / 1.59, the
row tiles are faster still: :data:`COLS_WIDE_PLANE`). The row tiles:
MobileNetV2 112x112 16->96 0.43 / 0.47 and 8.7 / 9.9, 56x56 24->144 0.189 / 0.225 and 3.21 /
3.49, 28x28 32->192 0.082 / 0.098 and 1.39 / 1.38 (slower there: ResNet-50 56x56 64->256
0.89 / 0.83 and 17.6 / 15.1, MobileNetV2 112x112 32->16 0.179 / 0.164; faster on a machine
whose OpenBLAS runs its AVX2 kernel, with the image swept by blocks: :func:`_choice`). Whole
models through the Predictor, one thread, the packed kernels switched on and off
(:data:`_PACKED`) in one process by turns, medians of thread time at load 1.0-1.3:
MobileNetV2 7.36 / 7.75 ms at batch 1, 153 / 158 at batch 16; ResNet-50 66.1 / 69.5 at batch
1, 1026 / 1026 at batch 16.
"""
import threading
import weakref

import numba
import numpy as np
from numba.core import types
from numba.extending import overload, register_jitable

from pdjit.codegen import params
from pdjit.codegen.cpu import replay
from pdjit.codegen.cpu.lib import conv as _conv
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import (
    JOBS,
    by_address,
    compile_beside,
    compile_cost,
    jit,
    jobs,
    pjit,
)
from pdjit.codegen.cpu.lib.deint import copy_run, zero_run
from pdjit.codegen.cpu.lib.pgemm import (
    MR,
    NV,
    PREFETCH_ROWS,
    _convt_micro,
    _micro_kernel,
    _pack_prologue,
    pack_rows,
    pointwise_rows,
    pointwise_rows_prologue,
    rows_by_pixels,
    rows_by_pixels_prologue,
)
from pdjit.codegen.cpu.lib.winograd import enough_tiles, may_take

__all__ = ["conv_cols", "pointwise_cols", "pointwise_range", "pointwise_range_cols",
           "pointwise_range_prologue",
           "pointwise_range_patches", "pointwise_range_patches_3x3", "pointwise_range_rows",
           "pointwise_weight"]

#: planes of at most this many pixels take the transposed tiles (:func:`pointwise_cols`)
COLS_MAX_PLANE = 100
#: planes of at most this many pixels (14x14) take the transposed tiles over their patches
#: (a convolution wider than 1x1 or strided: :data:`PATCHES_WIDE_MIN_K`). A 1x1 one takes the
#: row tiles there, which read the image's panels packed (``pgemm._rows_pixels``): alone, one
#: thread, rows / transposed tiles, ms (``bench_pointwise.py --contenders rows,cols``):
#: ResNet-50's 14x14 1024 -> 256 1.08-1.14 / 1.34-1.76 at batch 1, 17.0-22.0 / 28.7-34.2 at
#: batch 16; 256 -> 1024 1.04-1.25 / 1.17-1.47, 16.8-21.3 / 21.2-26.9; MobileNetV2's 384 -> 64
#: 0.127 / 0.136, 2.20 / 2.66; 576 -> 96 0.261 / 0.377, 4.70 / 7.41
COLS_WIDE_PLANE = 256
#: ... and the fewest products per output of another convolution onto a 14x14 plane on them
#: (over its patches; whole panels of output channels): ResNet-50's 3x3 stride-2 256 -> 256
#: in the model 2.76 -> 2.61 ms, its 1x1 stride-2 512 -> 1024 shortcut 2.36 -> 2.20 (batch 1,
#: one thread, two predictors by turns in one process)
PATCHES_WIDE_MIN_K = 512
#: the output channels of a panel of the transposed tiles (float32): ``MR`` (6) pixels by
#: ``NV`` (4) vectors of channels (kind 2 of :func:`_kind`), or 7 pixels by 3 vectors (kind 3:
#: no pixel to spare on planes of 7x7 or 14x14; measured alone, one thread, batch 1, ms, kind 2
#: / 3: 7x7 512 -> 2048 1.04 / 0.94, 2048 -> 512 1.04 / 0.95, 960 -> 160 0.177 / 0.162, 3x3
#: 512 -> 512 on the patches 2.65 / 2.49; 14x14 256 -> 1024 1.03 / 1.06)
_NR = NV * 16
_NR3 = 48
#: the pixels of a tile of kind 3
_MR3 = 7
#: the share of kind 2's speed that kind 3's tiles reach on the same work (3 vectors of
#: channels to load per 21 multiply-adds against 4 per 24)
_KIND3_SPEED = 0.96
#: the pixels of a vector of the taps kernel's tiles (float32), which pads each plane to them
_TAP_LANES = 16
#: the transposed tiles take a convolution off the taps kernel where the share of their work
#: that is not padding is this much larger than the taps kernel's
_TAPS_MARGIN = 1.05
#: the bytes of a panel of the transposed tiles that its tiles of pixels sweep at a time
CHUNK_BYTES = 1 << 18
#: the tiles after a chunk's first that fetch the next chunk into the L2 cache as they sweep it
#: (the others find their rows in the cache and fetch none; the first chunk's first tile
#: fetches its rows ahead): measured alone, one thread, batch 1, a filter from memory at each
#: call, us, every tile / the next three: 14x14 1024 -> 256 451 / 426, 256 -> 1024 464 / 451;
#: 7x7 2048 -> 512 444 / 444, 512 -> 2048 427 / 426 (the second tile alone: 427, 450, 492, 480)
FAR_TILES = 3
#: the fewest output and input channels the packed kernels serve
MIN_CHANNELS = 16
#: a filter wider than 1x1 whose output channels fill whole panels of the transposed tiles
#: takes them reading its taps in the padded image (:func:`conv_taps`, no patches) where the
#: output rows have this many pixels or more (rows of fewer waste much of the tiles, which do
#: not cross a row). Measured alone (one thread, batch 1, us, the kernel that served before /
#: the tiles reading the taps / over the patches): ResNet-50's 7x7 stride-2 stem 1168 / 988 /
#: 1397, its 3x3 stride-2 128 at 56x56 1149 / 952 / 1090, ResNet-18's 64 -> 128 569 / 478 /
#: 577, 256 at 56x56 stride 2 4474 / 3774 / 4134, SqueezeNet's 3 -> 64 3x3 stride 2 310 / 278
#: / 323, 5x5 16 -> 64 at 28x28 182 / 163 / 211; but onto 14x14 planes behind the patches
#: (256 -> 512 3x3 stride 2 771 / 575), and 96 channels (two panels, a quarter empty: 7x7
#: stride 2 1719 / 1961)
TAPS_MIN_ROW = 28
#: ... and where each output sums this many products or more: shorter sums leave the tiles'
#: transposing stores a large share of the work, and the taps kernel of
#: :func:`.conv._fwd_range` (output pixels in the vectors, stored as they are) serves them.
#: Measured alone (one thread, batch 1, us, these tiles / that kernel): 3 -> 64 3x3 stride 2
#: from 224x224 (SqueezeNet's stem, 27 products) 649 / 475, padded 589 / 449, 3 -> 128 1310
#: / 827, stride 1 from 112x112 567 / 404; 5x5 from 3 channels (75) 995 / 1108, 3x3 from 8
#: (72) 1099 / 1135, 7x7 from 3 (147) 1583 / 1640, 3x3 from 32 (288) 201 / 248
TAPS_MIN_K = 48
#: ... and on tiles of 7 pixels by 48 channels (kind 3) onto shorter rows of whole tiles (7, 14
#: or 21 pixels), where the channels are a multiple of 48 or this many (a last panel part
#: empty). Measured alone (batch
#: 1, a filter from memory at each call, us, over the patches / reading the taps, one thread;
#: two threads, each split by rows): ResNet-50's 7x7 512 -> 512 3x3 1230 / 1115; 806 / 684,
#: its stride-2 14x14 -> 7x7 512 -> 512 1190 / 1125; 708 / 696, 28x28 -> 14x14 256 -> 256
#: 1117 / 1059; 614 / 560
TAPS3_MIN_CHANNELS = 4 * _NR3
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
    ``p_`` pixels: 1 :func:`.pgemm.pointwise_rows`, 2 :func:`pointwise_cols`, 0 those
    of :func:`.conv._fwd_range` (fewer than :data:`MIN_CHANNELS` channels).

    The row tiles take every plane the transposed tiles do not (larger than
    :data:`COLS_MAX_PLANE` pixels: 14x14 too, see :data:`COLS_WIDE_PLANE`), any
    number of channels (the image swept by blocks of pixels that stay in the L2 cache,
    :data:`.pgemm._BLOCK_BYTES`). Alone, one thread, batch 1 then 16, ms, against OpenBLAS
    per sample (its Haswell kernel on an AVX-512 machine; ``bench_pointwise.py --contenders
    rows,current``): ResNet-50's 56x56 64 -> 256 0.41 / 0.51 and 8.2 / 9.8, 256 -> 64 0.41 /
    0.46 and 7.8 / 8.5, 256 -> 128 0.80 / 0.88 and 14.9 / 16.0, 28x28 128 -> 512 0.41 / 0.51
    and 6.9 / 8.5, 512 -> 128 0.43 / 0.50 and 7.4 / 8.7; 14x14 short sums as fast (64 -> 384
    0.049 / 0.051, 128 -> 128 0.035 / 0.037). In the model (processes by turns, medians;
    against the row tiles from 28x28 only, up to 32 input channels): ResNet-50 0.95-0.98x at
    batch 1 on one thread, 0.96-0.99x on two, 0.96-0.98x at batch 16 on one; MobileNetV2
    0.97-0.99x, 0.95-0.97x and 0.96-0.98x; SqueezeNet's 13x13 layers at batch 1 (us) 256 ->
    48 61 -> 28, 384 -> 48 80 -> 39, 48 -> 192 37 -> 20, 64 -> 256 61 -> 33 (its 384 -> 64,
    512 -> 64 and 512 -> 1000 on the transposed tiles / on row tiles reading the image in
    place: 49 / 51, 59 / 65, 780 / 891; not measured with the panels packed, which serve them
    now). The kernel is then compiled for ResNet-50 as well: its cold first result
    3.3-3.4 -> 3.8 s (5.8 -> 6.5 s of CPU; ``bench_coldstart.py --models resnet50``)."""
    if m_ < MIN_CHANNELS or c_ < MIN_CHANNELS:
        return 0
    return 2 if p_ <= COLS_MAX_PLANE else 1


@register_jitable
def _cols_kind(m_, p_):
    """``(kind, share)``: which transposed tiles (2 or 3, see :data:`_NR`) serve ``m_``
    output channels over planes of ``p_`` pixels, and the share of their work that is not
    padding (kind 3's scaled by :data:`_KIND3_SPEED`)."""
    f2 = (p_ / ((p_ + MR - 1) // MR * MR)) * (m_ / ((m_ + _NR - 1) // _NR * _NR))
    f3 = _KIND3_SPEED * (p_ / ((p_ + _MR3 - 1) // _MR3 * _MR3)) * \
        (m_ / ((m_ + _NR3 - 1) // _NR3 * _NR3))
    return (3, f3) if f3 > f2 else (2, f2)


@register_jitable
def _taps_pays(m_, c_, kh, kw, ow_) -> int:
    """The transposed tiles (kind 2 or 3, :data:`_NR`) on which a convolution of ``m_``
    output and ``c_`` input channels, a ``kh x kw`` filter (wider than 1x1, at least
    :data:`TAPS_MIN_K` products an output) and output rows of ``ow_`` pixels runs reading its
    taps, rather than over its patches (0): kind 2 where the channels fill
    whole panels of 64 and the rows are long (:data:`TAPS_MIN_ROW`), kind 3 where shorter rows
    are whole tiles of 7 pixels (7x7, 14x14 planes) and the channels fill panels of 48 or
    leave little of them empty (:data:`TAPS3_MIN_CHANNELS`), and pack to another size than in
    panels of 64 (192, 384, ... channels do not: a filter packed for the patches of a plane
    whose rows were not given, :func:`pointwise_weight`, then fits the taps' kind too, and a
    call would take it for the wrong one)."""
    if kh * kw < 2 or m_ < 1 or c_ * kh * kw < TAPS_MIN_K:
        return 0
    if m_ % _NR == 0 and ow_ >= TAPS_MIN_ROW:
        return 2
    if ow_ > 0 and ow_ % _MR3 == 0 and ow_ < TAPS_MIN_ROW and \
            (m_ % _NR3 == 0 or m_ >= TAPS3_MIN_CHANNELS) and \
            (m_ + _NR3 - 1) // _NR3 * _NR3 != (m_ + _NR - 1) // _NR * _NR:
        return 3
    return 0


@register_jitable
def _kind(m_, k_, p_, in_place, taps=0) -> int:
    """Which kernel serves a convolution (float32, one group) of ``m_`` output channels,
    ``k_`` products per output (input channels times the filter's taps) and planes of ``p_``
    output pixels: for a 1x1 stride-1 unpadded one (``in_place``: the image is its own
    patches) :func:`_choice`, the transposed tiles as kind 2 or 3 (:func:`_cols_kind`); else
    the transposed tiles (:func:`conv_cols` on the image's patches) for planes of at most
    :data:`COLS_MAX_PLANE` pixels where less of their work is padding than of the taps
    kernel's (which pads each plane to whole vectors: 7x7 to 64), else 0
    (:func:`.conv._fwd_range`); and 14x14 planes of long sums onto whole panels
    (:data:`PATCHES_WIDE_MIN_K`). Measured alone (one thread, batch 1, ms, taps kernel /
    transposed tiles of kind 2 on the patches): ResNet-50's 7x7
    512 -> 512 3x3 2.91 / 2.34, 14x14 -> 7x7 stride 2 3x3 256 -> 512 1.47 / 1.16 and 1x1
    512 -> 1024 0.66 / 0.52; 9x9 160 -> 192 0.51 / 0.41; even or behind where a panel is
    part empty: 7x7 128 -> 32 0.068 / 0.070, 10x10 64 -> 96 0.128 / 0.136. ``taps``
    (:func:`_taps_pays`, a kind): any plane, those tiles reading the taps
    (:func:`conv_taps`)."""
    if in_place:
        k = _choice(m_, k_, p_)
        return _cols_kind(m_, p_)[0] if k == 2 else k
    if m_ < MIN_CHANNELS or k_ < MIN_CHANNELS or p_ < 1:
        return 0
    if taps:
        return taps
    if p_ > COLS_MAX_PLANE:  # 14x14: long sums onto whole panels
        return 2 if p_ <= COLS_WIDE_PLANE and m_ % _NR == 0 and \
            k_ >= PATCHES_WIDE_MIN_K else 0
    k, share = _cols_kind(m_, p_)
    return k if share > _TAPS_MARGIN * p_ / ((p_ + _TAP_LANES - 1) // _TAP_LANES * _TAP_LANES) \
        else 0


@register_jitable
def _step(kind) -> int:
    """The rows of the filter a block of its packed copy holds (``MR`` for kind 1, a panel's
    output channels for the transposed tiles)."""
    return MR if kind == 1 else _NR3 if kind == 3 else _NR


@register_jitable
def _packed_size(m_, k_, kind) -> int:
    """The values of an ``[m_, k_]`` filter packed for the kernel ``kind`` (0: none)."""
    step = _step(kind)
    return (m_ + step - 1) // step * k_ * step if kind else 0


@register_jitable
def _in_place(x, w, y, sh, sw, pt, pl) -> bool:
    """Whether the convolution of ``x`` by ``w`` into ``y`` is 1x1, stride 1, unpadded: the
    image its own patches."""
    return w.shape[2] == 1 and w.shape[3] == 1 and sh == 1 and sw == 1 and pt == 0 and \
        pl == 0 and x.shape[2] == y.shape[2] and x.shape[3] == y.shape[3]


def usable(m: int, c: int, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, dh: int,
           dw: int, groups: int, p: int = -1, q: int = -1, ow: int = -1) -> str:
    """The entry a convolution of this filter ([m, c, kh, kw]), geometry and plane of ``p``
    input and ``q`` output pixels in rows of ``ow`` (-1: unknown) calls (what the lowering
    knows before any run): ``""`` where the packed kernels never serve it, else
    ``pointwise_range`` or, the plane known, the name that says which kernel serves
    (``pointwise_range_rows``, ``_cols``; ``pointwise_range_patches`` and ``_3x3`` for other
    filters, over their patches or reading their taps, the latter where Winograd's kernel
    serves larger batches; ``""`` for neither)."""
    taps = _taps_pays(m, c, kh, kw, ow) if ow > 0 else 0  # (any input channels: a first layer)
    if groups != 1 or m < MIN_CHANNELS or c < MIN_CHANNELS and not taps:
        return ""
    if kh == 1 and kw == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0:
        if p < 1:
            return "pointwise_range"
        return ("", "pointwise_range_rows", "pointwise_range_cols")[_choice(m, c, p)]
    if q < 1 or _kind(m, c * kh * kw, q, False, taps) < 2:
        return ""
    if may_take(m, c, kh, kw, (sh, sw), (dh, dw), groups):
        return "pointwise_range_patches_3x3"
    return "pointwise_range_patches"


def _pack(w, step: int):
    """``w`` packed by NumPy (no kernel to compile): blocks of ``step`` rows of ``W`` ([M, K],
    ``K`` the products per output), each ``K`` steps of the block's values, zero past ``M``:
    ``MR`` rows (:func:`.pgemm.pack_a`) or panels of ``NR`` (``W^T``'s columns,
    :func:`.pgemm.pack_b`)."""
    m = w.shape[0]
    w2 = w.reshape(m, w.size // m)
    k_ = w2.shape[1]
    whole = m // step
    out = np.empty((-(-m // step), k_, step), w.dtype)
    rows = out.transpose(0, 2, 1)  # (a block's row r: one value every ``step``)
    blocks = w2[:whole * step].reshape(whole, step, k_)
    # row by row: each copy reads whole rows of W (a transposing copy that read W by columns
    # took 2-3x as long: 2.9 against 1.0 ms for 512 x 2048, a warm first result's packing
    # 30 against ~15 ms for ResNet-50)
    for r in range(step):
        rows[:whole, r] = blocks[:, r]
    if whole < out.shape[0]:
        out[whole] = 0
        rows[whole, :m - whole * step] = w2[whole * step:]
    return out.reshape(-1)


def pointwise_weight(w, p_, n_=1, in_place=True, tiles=0, ow=0):
    """The filter ``w`` ([M, C, kh, kw], float32) packed for planes of ``p_`` output pixels
    in rows of ``ow`` (see the module docstring; ``in_place``: a 1x1 stride-1 unpadded
    convolution), kept beside ``w`` (:func:`pdjit.codegen.params.derived`: until the array
    goes or a run may write it); an empty array where the packed kernels do not serve
    (:func:`_kind`, another dtype, the switch off), where Winograd's kernel takes the batch of
    ``n_`` samples of ``tiles`` tiles each (a 3x3 stride-1 filter; 0: never) and, for other
    filters (:func:`conv_cols`, :func:`conv_taps`), until their kernel is ready. The kernel
    is picked once per filter and call (:data:`_PICKS`)."""
    key = (id(w), p_, n_, in_place, tiles, ow)
    pick = _PICKS.get(key)
    if pick is None or pick[0]() is not w:
        pick = _pick(key, w, p_, n_, in_place, tiles, ow)
    k, taps = pick[1], pick[2]
    if k == 0 or not _PACKED[0] or \
            not in_place and not (_taps_ready() if taps else _patches_ready()):
        return np.empty(0, w.dtype)
    return params.derived(w, ("pointwise", k), lambda: _pack(w, _step(k)))


replay.declare("derived", pointwise_weight)


#: (id of a filter, the rest of a :func:`pointwise_weight` call) -> (a weak reference to the
#: filter, the kind of kernel, whether it reads the taps): what the filter's shape decides,
#: kept (asked at each convolution of each run: ~2 us in Python, 53 times a run of ResNet-50)
_PICKS: dict = {}


def _pick(key, w, p_, n_, in_place, tiles, ow) -> tuple:
    """:data:`_PICKS`' entry ``key`` for a call of :func:`pointwise_weight`, made and kept."""
    k, taps = 0, False
    if w.dtype == np.float32 and w.ndim == 4 and type(w) is np.ndarray:
        taps = _taps_pays(w.shape[0], w.shape[1], w.shape[2], w.shape[3], ow)  # (0: 1x1)
        k = _kind(w.shape[0], w.size // max(1, w.shape[0]), p_, in_place, taps)
        if tiles > 0 and enough_tiles(n_ * tiles, w.shape[0], w.shape[1]):
            k = 0
    if len(_PICKS) > 4096:
        _PICKS.clear()
    pick = _PICKS[key] = (weakref.ref(w), k, taps)
    return pick


@overload(pointwise_weight)
def _pointwise_weight_native(w, p_, n_=1, in_place=True, tiles=0, ow=0):
    """In compiled code (a native driver, an ahead-of-time artifact: once per run of the
    driver, whatever blocks of samples it calls :func:`pointwise_range` for): ``w`` packed
    where the batch of ``n_`` samples has :data:`NATIVE_MIN_PIXELS` pixels or more (the copy
    of ``M * K`` values then a few per cent of the product at most), else empty (the kernels
    of :func:`.conv._fwd_range`)."""
    if not (isinstance(w, types.Array) and w.dtype == types.float32 and w.ndim == 4):
        def none(w, p_, n_=1, in_place=True, tiles=0, ow=0):
            return np.empty(0, w.dtype)
        return none

    def impl(w, p_, n_=1, in_place=True, tiles=0, ow=0):
        m_ = w.shape[0]
        k_ = w.size // m_ if m_ > 0 else 0
        k = _kind(m_, k_, p_, in_place, _taps_pays(m_, w.shape[1], w.shape[2], w.shape[3], ow))
        if k == 0 or n_ * p_ < NATIVE_MIN_PIXELS or \
                tiles > 0 and enough_tiles(n_ * tiles, m_, w.shape[1]):
            return np.empty(0, w.dtype)
        w2 = np.ascontiguousarray(w).reshape((m_, k_))
        packed = np.empty(_packed_size(m_, k_, k), w.dtype)
        pack_rows(w2, _step(k), packed)
        return packed
    return impl


@register_jitable
def _packed_kind(x, w, ap, y, sh, sw, pt, pl, bias, res):
    """``(kind, in_place)``: the kernel (:func:`_kind`) that ``ap``, ``w`` packed, serves this
    call with (0: ``ap`` is not packed for it; one group: ``w``'s input channels are the
    image's), and whether the image is its own patches (:func:`_in_place`)."""
    m_ = y.shape[1]
    in_place = _in_place(x, w, y, sh, sw, pt, pl)
    if ap.size == 0 or m_ == 0 or w.shape[0] != m_ or w.shape[1] != x.shape[1] or \
            x.shape[0] != y.shape[0] or (bias.size != 0 and bias.size != m_) or \
            (res.size != 0 and res.size != y.size):
        return 0, in_place
    k_ = w.size // m_
    k = _kind(m_, k_, y.shape[2] * y.shape[3], in_place,
              _taps_pays(m_, w.shape[1], w.shape[2], w.shape[3], y.shape[3]))
    return (k if ap.size == _packed_size(m_, k_, k) else 0), in_place


@register_jitable
def _chunking(m_, k_, nr):
    """``(pixels a tile, panels, products a chunk)`` of the transposed tiles of panels of
    ``nr`` output channels over sums of ``k_`` products (a panel's chunk about
    :data:`CHUNK_BYTES`)."""
    chunks = (k_ * nr * 4 + CHUNK_BYTES - 1) // CHUNK_BYTES
    return (_MR3 if nr == _NR3 else MR, (m_ + nr - 1) // nr,
            (k_ + chunks - 1) // chunks if chunks > 1 else k_)


@register_jitable
def _chunk(k0, kc, k_, bias, res, yf, lo, hi):
    """``(end, bias, residual, lo, hi)`` of the chunk of products from ``k0``: the residual
    added with the first chunk (the chunks after it add to the sums so far, read back from
    ``yf``), the bias and clamp with the last."""
    k1 = k0 + kc if k0 + kc < k_ else k_
    last = k1 == k_
    return (k1, bias if last else bias[:0], res if k0 == 0 else yf, lo if last else -np.inf,
            hi if last else np.inf)


@register_jitable
def _cols_sample(src, xb, bp, nr, yf, yb, m_, k_, p_, bias, lo, hi, res, q0=0, q1=-1):
    """One sample of the transposed tiles: its patches ``src[xb:]`` (``k_`` rows of ``p_``
    pixels; with ``q0 .. q1`` (-1: ``p_``), only those output pixels, their patches ``k_``
    rows of ``q1 - q0`` from ``src[xb]`` on), its outputs ``yf[yb:]`` (``m_`` rows of
    ``p_``), ``bp`` the filter packed in
    panels of ``nr`` output channels (float32; 64: tiles of ``MR`` pixels, 48: of 7, see
    :data:`_NR`), each tile's pixels broadcast, its sums transposed in registers into the
    output's channel rows. A panel's rows are taken by chunks of about :data:`CHUNK_BYTES`
    that stay in the L2 cache while every tile of pixels reads them, the first chunk's first
    tile fetching its rows ahead and the :data:`FAR_TILES` after each chunk's first the next
    chunk, the other tiles nothing (the sums of the chunks
    before read back from the output; the residual added with the first chunk, the bias and
    clamp with the last): a panel of a long sum read whole by each tile came from beyond the
    L2 cache each time, the first tile's from memory. Each output sums its products in the
    order of ``K``, each a fused multiply-add."""
    mr, npan, kc = _chunking(m_, k_, nr)
    if q1 < 0:
        q1 = p_
    ps = q1 - q0  # (the patches' rows)
    alone = ps <= mr  # (one tile a chunk: it fetches its own rows ahead)
    for j in range(npan):
        m0 = j * nr
        cols = m_ - m0 if m_ - m0 < nr else nr
        for k0 in range(0, k_, kc):
            k1, bs, rs, lo_, hi_ = _chunk(k0, kc, k_, bias, res, yf, lo, hi)
            for i in range(q0, q1, mr):
                # (the next few tiles fetch the next chunk; the first tile of the first chunk
                # its rows ahead; the others find their rows in the cache)
                t = (i - q0) // mr
                pfo = (k1 - k0) * nr if 1 <= t <= FAR_TILES else PREFETCH_ROWS * nr \
                    if t == 0 and (alone or j == 0 and k0 == 0) else 0
                rows = q1 - i if q1 - i < mr else mr
                at = xb + i - q0 + k0 * ps
                if mr == MR:
                    _convt_micro(src, at, ps, rows, k1 - k0, bp, (j * k_ + k0) * nr, yf,
                                 yb + m0 * p_ + i, p_, cols, bs, m0, rs, lo_, hi_, pfo)
                else:
                    _convt_micro3(src, at, ps, rows, k1 - k0, bp, (j * k_ + k0) * nr, yf,
                                  yb + m0 * p_ + i, p_, cols, bs, m0, rs, lo_, hi_, pfo)


#: the tile of the transposed tiles' kind 3 (:data:`_NR`)
_convt_micro3 = _micro_kernel(_MR3, _NR3 // 16, PREFETCH_ROWS, trans=True, far=True)


@register_jitable
def _cols_check(x, bp, nr, y, n0, n1, k_, bias, res):
    """Raise where the operands of the transposed tiles do not fit (``k_`` products per
    output)."""
    m_ = y.shape[1]
    if x.itemsize != 4 or nr != _NR and nr != _NR3:
        raise ValueError("pdjit: transposed tiles: float32 panels of 48 or 64 output channels")
    if x.shape[0] != y.shape[0] or bp.shape[0] != (m_ + nr - 1) // nr * k_ * nr or \
            (bias.shape[0] != 0 and bias.shape[0] != m_) or \
            (res.shape[0] != 0 and res.shape[0] != y.size) or n0 < 0 or n1 > x.shape[0]:
        raise ValueError("pdjit: convolution operands do not fit the packed filter")


@jit
def pointwise_cols(x, bp, nr, y, n0, n1, bias, lo, hi, res):
    """:func:`.pgemm.pointwise_rows`' product transposed, ``y[n]^T = x[n]^T @ W^T`` (a 1x1
    stride-1 unpadded convolution of one group, ``x`` [N, C, H, W] read in place, ``y`` [N,
    M, H, W]), ``W`` packed into panels of ``nr`` output channels (:func:`_pack`), the bias,
    residual and clamp applied to each tile in registers (:func:`_cols_sample`): for planes
    whose pixels fill vectors badly (7x7: 49 of 64)."""
    m_, c_ = y.shape[1], x.shape[1]
    p_ = y.shape[2] * y.shape[3]
    _cols_check(x, bp, nr, y, n0, n1, c_, bias, res)
    if x.shape[2] * x.shape[3] != p_:
        raise ValueError("pdjit: pointwise convolution operands do not fit")
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for n in range(n0, n1):
        _cols_sample(xf, n * c_ * p_, bp, nr, yf, n * m_ * p_, m_, c_, p_, bias, lo, hi, res)


@jit
def conv_cols(x, bp, nr, y, n0, n1, kh, kw, sh, sw, pt, pl, dh, dw, bias, lo, hi, res):
    """:func:`pointwise_cols` over each sample's patches: ``y[n] = clamp(conv(x[n], W) +
    bias[:, None] + res[n], lo, hi)`` for the samples ``n0 .. n1``, ``W`` ([M, K], K = C *
    kh * kw) packed as there, one group, strides ``sh, sw``, top and left paddings ``pt,
    pl`` (the output's size says the rest), dilations ``dh, dw``; each sample's im2col ([K,
    oh * ow]) built once, then swept by the tiles. Compiled ahead by warmup only
    (:func:`_patches_ready`): with its im2col it compiles in 2.3x the time of
    :func:`pointwise_cols` (1.6 s of CPU against 0.7), which made ResNet-50's cold first
    result 1 s later."""
    m_, c_ = y.shape[1], x.shape[1]
    p_ = y.shape[2] * y.shape[3]
    k_ = c_ * kh * kw
    _cols_check(x, bp, nr, y, n0, n1, k_, bias, res)
    yf = y.reshape(y.size)
    col = np.empty(k_ * p_, x.dtype)
    for n in range(n0, n1):
        _conv._im2col(x[n], 0, c_, kh, kw, sh, sw, pt, pl, dh, dw, y.shape[2], y.shape[3], col,
                      p_, 0)
        _cols_sample(col, 0, bp, nr, yf, n * m_ * p_, m_, k_, p_, bias, lo, hi, res)


#: the tiles of the transposed kinds reading a convolution's image where each step of the sum
#: finds its tap (:func:`conv_taps`)
_convt_taps = _micro_kernel(MR, NV, PREFETCH_ROWS, trans=True, far=True, taps=True)
_convt_taps3 = _micro_kernel(_MR3, _NR3 // 16, PREFETCH_ROWS, trans=True, far=True, taps=True)


@register_jitable
def _padded(x, n, c0, c1, pt, pl, hp, wp, xp):
    """Channels ``c0 .. c1`` of sample ``n`` of ``x`` ([N, C, H, W]) into ``xp`` (``C`` planes
    of ``hp`` rows of ``wp`` values), its row ``ih`` at row ``ih + pt``, column ``iw`` at
    ``iw + pl``, zero around: every tap of the convolution then reads inside."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    xf = x.reshape(x.size)
    lo = pl if pl < wp else wp
    hi = pl + w_ if pl + w_ < wp else wp
    for c in range(c0, c1):
        for r in range(hp):
            d = (c * hp + r) * wp
            ih = r - pt
            if ih < 0 or ih >= h_ or hi <= lo:
                zero_run(xp, d, wp)
                continue
            zero_run(xp, d, lo)
            copy_run(xf, ((n * c_ + c) * h_ + ih) * w_ + lo - pl, xp, d + lo, hi - lo)
            zero_run(xp, d + hi, wp - hi)


@register_jitable
def _tap_table(c_, kh, kw, dh, dw, hp, wp):
    """Where tap ``(c, i, j)`` of a ``kh x kw`` filter starts in :func:`_padded`'s planes."""
    off = np.empty(c_ * kh * kw, np.int64)
    for c in range(c_):
        for i in range(kh):
            for j in range(kw):
                off[(c * kh + i) * kw + j] = c * hp * wp + i * dh * wp + j * dw
    return off


@register_jitable
def _taps_sample(xp, wp, off, bp, nr, yf, yb, m_, k_, ow_, p_, sh, sw, bias, lo, hi, res, r0,
                 r1, j0=0, j1=-1):
    """Output rows ``r0 .. r1`` of one sample (their output channels of the panels ``j0 ..
    j1``, -1: the last) on the transposed tiles reading its padded image
    ``xp`` (:func:`_padded`, rows ``wp`` values apart) at the taps ``off``
    (:func:`_tap_table`), as :func:`_cols_sample` reads its patches: tiles of ``MR`` (or 7)
    pixels of one output row (``sw`` apart in the image) by a panel of ``nr`` output
    channels, a panel's rows taken by chunks that stay in the L2 cache while every tile reads
    them; the same sums in the same order as :func:`_cols_sample` over the patches."""
    mr, npan, kc = _chunking(m_, k_, nr)
    for j in range(j0, npan if j1 < 0 else j1):
        m0 = j * nr
        cols = m_ - m0 if m_ - m0 < nr else nr
        for k0 in range(0, k_, kc):
            k1, bs, rs, lo_, hi_ = _chunk(k0, kc, k_, bias, res, yf, lo, hi)
            for r in range(r0, r1):
                for i in range(0, ow_, mr):
                    # (the chunk's first tile fetches its rows ahead; the others find them in
                    # the cache, and a loop without prefetches: on a 2-vCPU Intel Xeon, 3x3
                    # stride 2 56x56 128 -> 128 at batch 1 1.38x -> 1.21x ONNX Runtime's node
                    # by turns, 2.69 -> 2.41 ms; the stem unchanged)
                    pfo = PREFETCH_ROWS * nr if r == r0 and i == 0 else 0
                    rows = ow_ - i if ow_ - i < mr else mr
                    at = r * sh * wp + i * sw
                    c0 = yb + m0 * p_ + r * ow_ + i
                    if mr == MR:
                        _convt_taps(xp, at, sw, rows, k1 - k0, bp, (j * k_ + k0) * nr, yf, c0,
                                    p_, cols, bs, m0, rs, lo_, hi_, pfo, off, k0)
                    else:
                        _convt_taps3(xp, at, sw, rows, k1 - k0, bp, (j * k_ + k0) * nr, yf, c0,
                                     p_, cols, bs, m0, rs, lo_, hi_, pfo, off, k0)


@register_jitable
def _tap_planes(c_, y, kh, kw, sh, sw, dh, dw):
    """``(hp, wp, planes, taps)``: the rows and columns of the padded planes that a
    convolution onto ``y``'s planes reads, a buffer for ``c_`` of them (:func:`_padded`) and
    where each tap starts there (:func:`_tap_table`)."""
    hp = (y.shape[2] - 1) * sh + (kh - 1) * dh + 1
    wp = (y.shape[3] - 1) * sw + (kw - 1) * dw + 1
    return hp, wp, np.empty(c_ * hp * wp, y.dtype), _tap_table(c_, kh, kw, dh, dw, hp, wp)


@by_address
@jit
def conv_taps(x, bp, nr, y, n0, n1, kh, kw, sh, sw, pt, pl, dh, dw, bias, lo, hi, res):
    """:func:`conv_cols` without patches: each sample's image copied once into padded planes
    (:func:`_padded`: ``C`` values per pixel, where the patches hold ``C * kh * kw``), which
    the transposed tiles read tap by tap (:func:`_taps_sample`): for a filter much wider than
    the image is deep (a network's first layer: 7x7 stride 2 from 3 channels, patches 12x the
    image's size)."""
    m_, c_ = y.shape[1], x.shape[1]
    p_ = y.shape[2] * y.shape[3]
    k_ = c_ * kh * kw
    _cols_check(x, bp, nr, y, n0, n1, k_, bias, res)
    hp, wp, xp, off = _tap_planes(c_, y, kh, kw, sh, sw, dh, dw)
    yf = y.reshape(y.size)
    for n in range(n0, n1):
        _padded(x, n, 0, c_, pt, pl, hp, wp, xp)
        _taps_sample(xp, wp, off, bp, nr, yf, n * m_ * p_, m_, k_, y.shape[3], p_, sh, sw,
                     bias, lo, hi, res, 0, y.shape[2])


#: a call of :func:`conv_cols` of the types warmup compiles it for (:func:`_patches_ready`)
_PATCHES_CALL: list = []


def _patches_ready() -> bool:
    """Whether :func:`conv_cols` may serve: compiled ahead by ``pdjit warmup`` and the
    background warmup, loaded from the disk cache from a process's few first runs on, as
    ``lib.team`` makes its parallel loops ready; until then the taps kernel serves."""
    if not _PATCHES_CALL:
        a4, a1 = np.empty((1, 1, 1, 1), np.float32), np.empty(0, np.float32)
        _PATCHES_CALL.append((a4, a1, 0, a4, 0, 0, *(0,) * 8, a1, 0.0, 0.0, a1))
    return team.ready(conv_cols, _PATCHES_CALL[0])


def _taps_ready() -> bool:
    """Whether :func:`conv_taps` may serve (as :func:`_patches_ready` says of
    :func:`conv_cols`)."""
    if not _PATCHES_CALL:
        _patches_ready()
    return team.ready(conv_taps, _PATCHES_CALL[0])


@register_jitable
def _route(k, in_place, w, y) -> int:
    """Which kernel serves the packed kind ``k`` (:func:`_packed_kind`): 1
    :func:`pointwise_rows`, 2 :func:`pointwise_cols`, 3 :func:`conv_taps`, 4
    :func:`conv_cols`."""
    if k == 1:
        return 1
    if in_place:
        return 2
    return 3 if _taps_pays(w.shape[0], w.shape[1], w.shape[2], w.shape[3], y.shape[3]) else 4


@register_jitable
def _run_packed(k, in_place, x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, bias, lo, hi, res):
    """The packed kernel ``k`` that ``ap`` is packed for (:func:`_route`; in compiled code:
    :func:`pointwise_range` makes the same calls in Python)."""
    r = _route(k, in_place, w, y)
    if r == 1:
        pointwise_rows(x, ap, y, n0, n1, bias, lo, hi, res)
    elif r == 2:
        pointwise_cols(x, ap, _step(k), y, n0, n1, bias, lo, hi, res)
    elif r == 3:
        conv_taps(x, ap, _step(k), y, n0, n1, w.shape[2], w.shape[3], sh, sw, pt, pl, dh, dw,
                  bias, lo, hi, res)
    else:
        conv_cols(x, ap, _step(k), y, n0, n1, w.shape[2], w.shape[3], sh, sw, pt, pl, dh, dw,
                  bias, lo, hi, res)


def pointwise_range(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """``y[n] = clamp(conv(x[n], w) + bias[m] + res, lo, hi)`` for the samples ``n0 .. n1``
    (the arguments of :func:`.conv._fwd_range`, with ``ap`` the filter packed by
    :func:`pointwise_weight`): on the packed kernels where ``ap`` is not empty and fits, else
    :func:`.conv._fwd_range`. Declared ``"leaves"``: a recording replays the kernel it
    calls."""
    call = replay.kernel_call
    if ap.size and x.dtype == np.float32 and groups == 1:
        k, in_place = _packed_kind(x, w, ap, y, sh, sw, pt, pl, bias, res)
        if k:
            r = _route(k, in_place, w, y)
            if r <= 2 and team.standing_in(pointwise_rows if r == 1 else pointwise_cols):
                _conv._taps_numpy(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo,
                                  hi, res)
            elif r == 1:
                call(pointwise_rows, x, ap, y, n0, n1, bias, lo, hi, res)
            elif r == 2:
                call(pointwise_cols, x, ap, _step(k), y, n0, n1, bias, lo, hi, res)
            else:
                call(conv_taps if r == 3 else conv_cols, x, ap, _step(k), y, n0, n1,
                     w.shape[2], w.shape[3], sh, sw, pt, pl, dh, dw, bias, lo, hi, res)
            return
    call(_conv._fwd_range, x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)


replay.declare("leaves", pointwise_range)


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
        k, in_place = _packed_kind(x, w, ap, y, sh, sw, pt, pl, bias, res)
        if k and groups == 1:
            _run_packed(k, in_place, x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, bias,
                        float(lo), float(hi), res)
            return
        _conv._fwd_range(x, w, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)
    return impl


@jit
def prologue_into(x, n0, n1, scale, shift, plo, phi, out):
    """``out[n - n0] = clamp(x[n, c] * scale[c] + shift[c], plo, phi)`` for the samples ``n0
    .. n1`` of ``x`` ([N, C, ...], C-contiguous; ``scale``, ``shift`` empty: none; infinite
    bounds: no clamp): the prologue of :func:`pointwise_range_prologue` where no packed
    tile applies it, computed as :func:`.pgemm._pack_prologue` computes it."""
    c_ = x.shape[1]
    per = x[0].size if x.shape[0] else 0
    plane = per // c_ if c_ else 0
    if out.size != (n1 - n0) * per or (scale.size != 0 and scale.size != c_) or \
            (shift.size != 0 and shift.size != c_) or n0 < 0 or n1 > x.shape[0]:
        raise ValueError("pdjit: a convolution's prologue does not fit its image")
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    for n in range(n0, n1):
        _pack_prologue(xf, n * per, plane, plane, c_, of, (n - n0) * per, plane, scale, shift,
                       plo, phi)


def pointwise_range_prologue(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi,
                             res, scale, shift, plo, phi):
    """:func:`pointwise_range` of the image seen through ``clamp(x[n, c] * scale[c] +
    shift[c], plo, phi)`` (``scale``, ``shift`` [C] or empty: none; infinite bounds: no
    clamp): an inference program's batch norm and relu before a 1x1 convolution, applied on
    the row tiles as they pack the image's panels (:func:`.pgemm.pointwise_rows_prologue`,
    the transformed image never stored whole), elsewhere into a copy of the samples first
    (:func:`prologue_into`). Declared ``"leaves"``."""
    call = replay.kernel_call
    if ap.size and x.dtype == np.float32 and groups == 1 and \
            _packed_kind(x, w, ap, y, sh, sw, pt, pl, bias, res)[0] == 1:
        call(pointwise_rows_prologue, x, ap, y, n0, n1, bias, lo, hi, res, scale, shift, plo,
             phi)
        return
    xs = np.empty((n1 - n0,) + x.shape[1:], x.dtype)
    call(prologue_into, x, n0, n1, scale, shift, plo, phi, xs)
    per = y[0].size if y.shape[0] else 0
    pointwise_range(xs, w, ap, y[n0:n1], 0, n1 - n0, sh, sw, pt, pl, dh, dw, groups, bias, lo,
                    hi, res[n0 * per:n1 * per] if res.size else res)


replay.declare("leaves", pointwise_range_prologue)


@register_jitable
def _prologue_copy_then_range(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo,
                              hi, res, scale, shift, plo, phi):
    """In compiled code, :func:`pointwise_range_prologue` where no row tile applies the
    prologue: the samples through it first (:func:`prologue_into`), then the kernel."""
    xs = np.empty((n1 - n0, x.shape[1], x.shape[2], x.shape[3]), x.dtype)
    prologue_into(x, n0, n1, scale, shift, float(plo), float(phi), xs)
    per = y[0].size if y.shape[0] else 0
    pointwise_range(xs, w, ap, y[n0:n1], 0, n1 - n0, sh, sw, pt, pl, dh, dw, groups, bias, lo,
                    hi, res[n0 * per:n1 * per] if res.size else res)


@overload(pointwise_range_prologue)
def _pointwise_range_prologue_native(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias,
                                     lo, hi, res, scale, shift, plo, phi):
    """In compiled code: as in Python."""
    if not (isinstance(x, types.Array) and x.dtype == types.float32):
        return _prologue_copy_then_range

    def impl(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res, scale,
             shift, plo, phi):
        if ap.size and groups == 1 and \
                _packed_kind(x, w, ap, y, sh, sw, pt, pl, bias, res)[0] == 1:
            pointwise_rows_prologue(x, ap, y, n0, n1, bias, float(lo), float(hi), res, scale,
                                    shift, float(plo), float(phi))
            return
        _prologue_copy_then_range(x, w, ap, y, n0, n1, sh, sw, pt, pl, dh, dw, groups, bias,
                                  lo, hi, res, scale, shift, plo, phi)
    return impl


def _split_prologue(parts, work, x, w, ap, y, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi,
                    res, scale, shift, plo, phi):
    """A one-sample :func:`pointwise_range_prologue` split over at most ``parts`` ranges of
    its pixels on the row tiles, each part packing its own panels through the prologue
    (:func:`.pgemm.rows_by_pixels_prologue`, by a parallel loop where ready; the same bits as
    one call); whether it split the call (else it runs whole)."""
    kind, _ = _packed(x, w, ap, y, sh, sw, pt, pl, groups, bias, res)
    if kind != 1 or work < _conv._TEAM_MIN_WORK:
        return False
    pixels = _pixel_bounds(parts, y.shape[2] * y.shape[3])
    return pixels is not None and team.run(rows_by_pixels_prologue, (
        x, ap, y, pixels, bias, float(lo), float(hi), res, scale, shift, float(plo),
        float(phi)))


def _packed(x, w, ap, y, sh, sw, pt, pl, groups, bias, res):
    """:func:`_packed_kind` of a one-sample :func:`pointwise_range` call (0: not on the
    packed kernels)."""
    if not ap.size or x.dtype != np.float32 or x.shape[0] != 1 or groups != 1:
        return 0, False
    return _packed_kind(x, w, ap, y, sh, sw, pt, pl, bias, res)


def _tile_bounds(parts, m_, kind):
    """``(first channels of at most parts ranges then the end, the end of each range's packed
    rows, the transposed tiles' panel width or 0)`` of a one-sample call on the packed kernel
    ``kind`` (:func:`_kind`) of ``m_`` output channels: the tiles of the packed
    filter (``MR`` rows, or panels for the transposed tiles) dealt out evenly, each
    range at least ``conv._PART_ROWS`` channels' worth of them and the last at least
    :data:`MIN_CHANNELS` channels (so that every part takes the kernel the whole takes); None
    where there is one range. (By ranges of 6 tiles MobileNetV2's 16 -> 96 at 112x112 split
    36 / 60 and ran 0.37 ms on two threads against 0.49 on one.)"""
    step = _step(kind)
    tiles = -(-m_ // step)
    k = min(parts, tiles // -(-max(MIN_CHANNELS, _conv._PART_ROWS) // step))
    while k >= 2 and m_ - tiles * (k - 1) // k * step < MIN_CHANNELS:
        k -= 1  # (the last part would be too small for the packed kernels)
    if k < 2:
        return None
    bounds = [tiles * i // k * step for i in range(k)] + [m_]
    return bounds, [-(-b // step) * step for b in bounds[1:]], step if kind > 1 else 0


def _pixel_bounds(parts, p_):
    """The first pixel of each of at most ``parts`` ranges of a plane of ``p_`` pixels on the
    row tiles (panels of ``NR`` pixels dealt out evenly, the last one short where ``p_`` is
    no multiple of ``NR``), then the end; None where there is one range."""
    units = -(-p_ // _NR)
    k = min(parts, units)
    if k < 2:
        return None
    return np.array([units * i // k * _NR for i in range(k)] + [p_], np.int64)


#: the most a part of a one-sample call on the row tiles split by pixels may cost over an even
#: share (in tiles of ``NR`` pixels, a last one of one vector as a third of one) for the split
#: to go by pixels where its output channels can go by tiles instead: a 13x13 plane (3 panels,
#: the last of 41 pixels) split 1 : 2. Measured on SqueezeNet 1.1's last 1x1 layer (512 ->
#: 1000 at 13x13, two threads, in the model): by pixels 0.95 ms, by channels 0.62 (one thread
#: 1.24)
EVEN_PANELS = 1.15


def _even_panels(bounds) -> bool:
    """Whether the ranges of pixels ``bounds`` (:func:`_pixel_bounds`) cost the row tiles about
    as much each (:data:`EVEN_PANELS`)."""
    costs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        whole, tail = divmod(int(b - a), _NR)
        costs.append(whole + (0 if tail == 0 else 1 / 3 if tail <= _NR // NV else 1))
    return max(costs) <= EVEN_PANELS * sum(costs) / len(costs)


def _split(parts, work, x, w, ap, y, sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res):
    """A one-sample :func:`pointwise_range` split over at most ``parts`` ranges: on the row
    tiles by ranges of its pixels (:func:`.pgemm.rows_by_pixels`, by a parallel loop where
    ready: each part reads only its pixels of the image, mostly what the layer before wrote
    on the same thread where that layer split by pixels too) where they cost about the same
    (:func:`_even_panels`) or its channels cannot split; on the transposed tiles over
    the patches of a filter wider than 1x1 by ranges of its output rows (:func:`_cols_by_rows`,
    where ready: each part the patches of its rows alone); else of its output channels
    (``conv.split_work``; :func:`.conv.split_channels` says when): on the packed kernels by
    :func:`_tile_bounds`, each part's slice of ``ap`` the packed rows of its
    channels, by a parallel loop (:func:`_by_channels`, where ready) or on ``run_parts``'
    helpers; else :func:`.conv._fwd_range`'s parts. Each output is summed as the whole call
    sums it (in order of the input channels, whatever the tile's other rows), so the result
    is the same, bit for bit, however it is split. Whether it split the call."""
    rest = (sh, sw, pt, pl, dh, dw, groups, bias, lo, hi, res)
    kind, in_place = _packed(x, w, ap, y, sh, sw, pt, pl, groups, bias, res)
    if not kind:
        return _conv.split_channels(_conv._fwd_range, parts, work, (x, w, y, *rest))
    p_ = y.shape[2] * y.shape[3]
    k_ = w.size // w.shape[0]
    if work >= _conv._TEAM_MIN_WORK and kind == 1:
        pixels = _pixel_bounds(parts, p_)
        if pixels is not None and (_even_panels(pixels) or _tile_bounds(
                parts, y.shape[1], kind) is None) and team.run(
                    rows_by_pixels, (x, ap, y, pixels, bias, float(lo), float(hi), res)):
            return True
    geo = np.array([] if in_place else [w.shape[2], w.shape[3], sh, sw, pt, pl, dh, dw],
                   np.int64)
    if kind > 1 and w.shape[2] * w.shape[3] > 1 and work >= _conv._TEAM_MIN_WORK and \
            y.shape[2] >= 2:  # (a wider filter: reading its taps, or its patches)
        k = min(parts, y.shape[2])
        tail = (_step(kind), geo, bias, float(lo), float(hi), res)
        if _taps_pays(w.shape[0], w.shape[1], w.shape[2], w.shape[3], y.shape[3]) and team.run(
                _taps_parts, (x, ap, y) + _taps_plan(k, y, kind, ap.size > x[0].size) + tail):
            return True
        rows = np.array([y.shape[2] * i // k for i in range(k + 1)], np.int64)
        most = -(-y.shape[2] // k) * y.shape[3]
        if COLS_BY_ROWS and team.run(_cols_by_rows, (x, ap, y, rows) + tail +
                                     (_patch_scratch(k * k_ * most),)):
            return True
    found = _tile_bounds(parts, y.shape[1], kind)
    if found is None:
        return False
    bounds, ends, nr = found
    if work >= _conv._TEAM_MIN_WORK:
        call = (x, ap, y, np.array(bounds, np.int64), np.array(ends, np.int64), nr, geo,
                bias, float(lo), float(hi), res)
        if geo.size and k_ * p_ <= SHARED_PATCHES * x[0].size:  # (not much larger than the
            # image: built once by all the parts, then read by each)
            if team.run(_patches_by_channels, call + (_patch_scratch(k_ * p_),)):
                return True
        elif team.run(_by_channels, call):
            return True
    if work < _conv._CHANNELS_MIN_WORK:
        return False
    calls = [(x, ap[a * k_:end * k_], y[:, a:b], nr, geo, bias[a:b] if bias.size else bias,
              lo, hi, res[a * p_:b * p_] if res.size else res)
             for a, b, end in zip(bounds, bounds[1:], ends)]
    _conv.run_parts(_part, calls, len(calls) - 1)
    return True


@register_jitable
def _part(x, ap, y, nr, geo, bias, lo, hi, res):
    """One part of :func:`_split` (on ``run_parts``' helpers, or a thread of
    :func:`_by_channels`' loop): the kernel the whole call takes (``nr``: the transposed
    tiles' panel width, 0: the row tiles; ``geo``: the filter's ``kh, kw`` and the strides,
    top and left paddings and dilations as :func:`conv_cols` takes them, empty: the image its
    own patches), on the packed rows ``ap`` of the output channels ``y`` holds."""
    if nr and geo.size == 0:
        pointwise_cols(x, ap, nr, y, _conv._plain(0), _conv._plain(1), bias, lo, hi, res)
    elif nr:
        conv_cols(x, ap, nr, y, _conv._plain(0), _conv._plain(1), geo[0], geo[1], geo[2],
                  geo[3], geo[4], geo[5], geo[6], geo[7], bias, lo, hi, res)
    else:
        pointwise_rows(x, ap, y, _conv._plain(0), _conv._plain(1), bias, lo, hi, res)


@pjit
def _by_channels(x, ap, y, bounds, ends, nr, geo, bias, lo, hi, res):
    """The packed kernels of one sample, ranges ``bounds`` of output channels (their packed
    rows up to ``ends``) in parallel (:func:`_split`); ``nr``, ``geo``: as :func:`_part`'s."""
    k_ = x.shape[1] * (geo[0] * geo[1] if geo.size else 1)
    for p in numba.prange(bounds.shape[0] - 1):
        a, b = bounds[p], bounds[p + 1]
        ys, bs, rs = _conv._part_out(y, bias, res, a, b)
        _part(x, ap[a * k_:ends[p] * k_], ys, nr, geo, bs, lo, hi, rs)


#: a one-sample call on the patches split by output channels builds its patches once, shared
#: by the parts (:func:`_patches_by_channels`), where they are at most this many times the
#: image's size (strided filters); larger ones each part builds from the image, which it reads
#: from the other cores in a fraction of the time it would take to read their share of the
#: patches. Measured in ResNet-50 at batch 1 on two threads (both ways by turns in one
#: process, us): 3x3 stride 2 256 at 28x28 946 -> 851, 512 at 14x14 920 -> 870, 1x1 stride 2
#: 512 -> 1024 572 -> 547, 1024 -> 2048 590 -> 545; but 3x3 stride 1 512 at 7x7 (nine times
#: the image) 760 -> 880
SHARED_PATCHES = 3


@pjit
def _patches_by_channels(x, ap, y, bounds, ends, nr, geo, bias, lo, hi, res, col):
    """:func:`conv_cols` of one sample, ranges ``bounds`` of output channels in parallel
    (:func:`_split`), on patches that the parts build together first, each the rows of its
    share of the input channels, into ``col`` (``K * oh * ow`` values or more), where each
    part of :func:`_by_channels` builds all of them (see :data:`SHARED_PATCHES`)."""
    parts = bounds.shape[0] - 1
    c_ = x.shape[1]
    p_ = y.shape[2] * y.shape[3]
    k_ = c_ * geo[0] * geo[1]
    for p in numba.prange(parts):
        c0, c1 = c_ * p // parts, c_ * (p + 1) // parts
        _conv._im2col(x[0], c0, c1 - c0, geo[0], geo[1], geo[2], geo[3], geo[4], geo[5],
                      geo[6], geo[7], y.shape[2], y.shape[3], col, p_, c0 * geo[0] * geo[1] * p_)
    for p in numba.prange(parts):
        a, b = bounds[p], bounds[p + 1]
        ys, bs, rs = _conv._part_out(y, bias, res, a, b)
        bp = ap[a * k_:ends[p] * k_]
        _cols_check(x, bp, nr, ys, _conv._plain(0), _conv._plain(1), k_, bs, rs)
        _cols_sample(col, 0, bp, nr, ys.reshape(ys.size), 0, b - a, k_, p_, bs, lo, hi, rs)


#: a one-sample call on the transposed tiles over the patches of a filter wider than 1x1 split
#: over threads splits by ranges of its output rows (:func:`_cols_by_rows`), not of its output
#: channels (a switch for benchmarks, tests)
COLS_BY_ROWS = True


@pjit
def _cols_by_rows(x, ap, y, rows, nr, geo, bias, lo, hi, res, col):
    """:func:`conv_cols` of one sample, ranges ``rows`` of its output rows in parallel: each
    part builds the patches of its rows alone (from the image rows they read, into its share
    of ``col``) and computes every output channel of their pixels, so that no part builds
    patches another builds too. Each output is summed as the whole call sums it."""
    m_, c_ = y.shape[1], x.shape[1]
    ow = y.shape[3]
    p_ = y.shape[2] * ow
    k_ = c_ * geo[0] * geo[1]
    _cols_check(x, ap, nr, y, _conv._plain(0), _conv._plain(1), k_, bias, res)
    yf = y.reshape(y.size)
    parts = rows.shape[0] - 1
    most = 0
    for p in range(parts):
        most = max(most, (rows[p + 1] - rows[p]) * ow)
    for p in numba.prange(parts):
        r0, r1 = rows[p], rows[p + 1]
        q0, q1 = r0 * ow, r1 * ow
        part = col[p * k_ * most:(p + 1) * k_ * most]
        _conv._im2col(x[0], 0, c_, geo[0], geo[1], geo[2], geo[3], geo[4] - r0 * geo[2],
                      geo[5], geo[6], geo[7], r1 - r0, ow, part, q1 - q0, 0)
        _cols_sample(part, 0, ap, nr, yf, 0, m_, k_, p_, bias, lo, hi, res, q0, q1)


def _taps_plan(parts, y, kind, by_channels) -> tuple:
    """:func:`.team.plan` of :func:`_taps_parts` for ``parts`` parts of ``y``'s output rows
    and panels: ``by_channels`` where the packed filter is larger than the image (measured
    alone, two threads, batch 1, a filter from memory at each call, us, by rows / by panels:
    ResNet-50's 7x7 512 -> 512 687 / 593, stride 2 onto 7x7 712 / 620, onto 14x14 256 611 /
    580; where the image is the larger, by panels was behind: 128 -> 128 stride 2 onto 28x28
    563 / 583)."""
    return team.plan(parts, y.shape[2], -(-y.shape[1] // _step(kind)), by_channels)


@pjit
def _taps_parts(x, ap, y, rows, pans, nr, geo, bias, lo, hi, res):
    """:func:`conv_taps` of one sample in parallel parts, each the output rows ``rows[g, p]
    .. rows[g, p + 1]`` of the panels ``pans[g] .. pans[g + 1]`` for every ``g``
    (:func:`.team.plan`). The parts pad the image together first (each its share of the
    channels), then each computes its tiles, a panel's rows read once per range of rows. Each
    output is summed as the whole call sums it."""
    m_, c_ = y.shape[1], x.shape[1]
    k_ = c_ * geo[0] * geo[1]
    _cols_check(x, ap, nr, y, _conv._plain(0), _conv._plain(1), k_, bias, res)
    hp, wp, xp, off = _tap_planes(c_, y, geo[0], geo[1], geo[2], geo[3], geo[6], geo[7])
    yf = y.reshape(y.size)
    parts = rows.shape[1] - 1
    for p in numba.prange(parts):
        _padded(x, 0, c_ * p // parts, c_ * (p + 1) // parts, geo[4], geo[5], hp, wp, xp)
    for p in numba.prange(parts):
        for g in range(rows.shape[0]):
            if pans[g + 1] > pans[g] and rows[g, p + 1] > rows[g, p]:
                _taps_sample(xp, wp, off, ap, nr, yf, 0, m_, k_, y.shape[3],
                             y.shape[2] * y.shape[3], geo[2], geo[3], bias, lo, hi, res,
                             rows[g, p], rows[g, p + 1], pans[g], pans[g + 1])


_PATCHES = threading.local()


def _patch_scratch(n: int):
    """This thread's buffer for a split call's patches, of ``n`` values or more (kept from
    call to call: a fresh one's pages would fault in at each call)."""
    buf = getattr(_PATCHES, "buf", None)
    if buf is None or buf.size < n:
        buf = _PATCHES.buf = np.empty(n, np.float32)
    return buf


_conv.CHANNEL_SPLITS[pointwise_range] = _split
_conv.CHANNEL_SPLITS[pointwise_range_prologue] = _split_prologue


#: :func:`pointwise_range` under the names a lowering calls where the sizes it knows say which
#: kernel serves (:func:`_kind`), so that a plan's compile jobs name that kernel alone; the
#: patches (:func:`conv_cols`, compiled by warmup) name the kernels that serve until then,
#: the taps kernel's (and Winograd's, which takes a 3x3 stride-1 filter at larger batches)
pointwise_range_rows = pointwise_range_cols = pointwise_range_patches = \
    pointwise_range_patches_3x3 = pointwise_range


def _jobs(T, kinds=(1, 2)):
    """The packed kernels of ``kinds`` (float32), else :func:`.conv._fwd_range`'s."""
    if np.dtype(T) != np.float32:
        return JOBS["conv._fwd_range"](T)
    ep = ((T, 1), float, float, (T, 1))
    k = []
    if 1 in kinds:
        k.append((pointwise_rows, ((T, 4), (T, 1), (T, 4), int, int) + ep))
    if 2 in kinds:
        k.append((pointwise_cols, ((T, 4), (T, 1), int, (T, 4), int, int) + ep))
    return k


jobs("pointwise_range")(_jobs)
jobs("pointwise_range_rows")(lambda T: _jobs(T, (1,)))
jobs("pointwise_range_prologue")(lambda T: [
    (prologue_into, ((T, 4), int, int, (T, 1), (T, 1), float, float, (T, 4)))] + ([
        (pointwise_rows_prologue, ((T, 4), (T, 1), (T, 4), int, int, (T, 1), float, float,
                                   (T, 1), (T, 1), (T, 1), float, float))]
        if np.dtype(T) == np.float32 else JOBS["conv._fwd_range"](T)))
jobs("pointwise_range_cols")(lambda T: _jobs(T, (2,)))
jobs("pointwise_range_patches")(lambda T: JOBS["conv._fwd_range"](T))
jobs("pointwise_range_patches_3x3")(lambda T: JOBS["conv._fwd_range_3x3"](T))
jobs("pointwise.conv_cols (warmup)")(lambda T: [] if np.dtype(T) != np.float32 else [
    (fn, ((T, 4), (T, 1), int, (T, 4), int, int) + (int,) * 8 + ((T, 1), float, float, (T, 1)))
    for fn in (conv_cols, conv_taps)])
# compile time (CPU seconds, a cold compile alone in a fresh process, the machine at load ~8:
# 0.70-0.76 s each; 0.41 s for the second after the first; the row tiles' narrow tail adds
# ~0.2 s)
compile_cost(0.95, pointwise_rows, pointwise_rows_prologue)
compile_beside(pointwise_rows, pointwise_cols)  # (in pointwise_range: conv._taps_numpy)
compile_cost(0.2, prologue_into)
compile_cost(0.9, pointwise_cols)
compile_cost(1.6, conv_cols)
compile_cost(1.6, _by_channels)
# (the split of a one-sample call by a parallel loop: compiled ahead by warmup only, see
# lib.team.ready)
jobs("pointwise._by_channels (warmup)")(lambda T: [] if np.dtype(T) != np.float32 else [
    (_by_channels, ((T, 4), (T, 1), (T, 4), (np.int64, 1), (np.int64, 1), int,
                    (np.int64, 1), (T, 1), float, float, (T, 1))),
    (rows_by_pixels, ((T, 4), (T, 1), (T, 4), (np.int64, 1), (T, 1), float, float, (T, 1))),
    (rows_by_pixels_prologue, ((T, 4), (T, 1), (T, 4), (np.int64, 1), (T, 1), float, float,
                               (T, 1), (T, 1), (T, 1), float, float)),
    (_patches_by_channels, ((T, 4), (T, 1), (T, 4), (np.int64, 1), (np.int64, 1), int,
                            (np.int64, 1), (T, 1), float, float, (T, 1), (T, 1))),
    (_cols_by_rows, ((T, 4), (T, 1), (T, 4), (np.int64, 1), int, (np.int64, 1), (T, 1),
                     float, float, (T, 1), (T, 1))),
    (_taps_parts, ((T, 4), (T, 1), (T, 4), (np.int64, 2), (np.int64, 1), int,
                   (np.int64, 1), (T, 1), float, float, (T, 1)))])
compile_cost(0.9, rows_by_pixels, rows_by_pixels_prologue)
compile_cost(1.6, _patches_by_channels)
compile_cost(1.6, _cols_by_rows)
compile_cost(1.6, conv_taps, _taps_parts)
