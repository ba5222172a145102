"""The 3x3 stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray,
"Fast Algorithms for Convolutional Neural Networks", 2015), NCHW float32.

Each 2x2 block of outputs of one sample and output channel ``m`` is
``A^T [sum_c (G g[m, c] G^T) * (B^T d[c] B)] A``, ``d[c]`` the 4x4 block of input channel
``c`` under it (tiles 2 apart, overlapping by 2; zero outside the image) and ``*``
elementwise: with ``U = G g G^T`` and ``V = B^T d B`` taken apart into their 16 elements
``xi``, the sum is 16 matrix products ``M_xi [M, tiles] = U_xi [M, C] @ V_xi [C, tiles]``, 16
multiply-adds per 4 outputs and input channel where the direct convolution makes 36.

- ``U`` (:func:`transformed`): made once per filter, kept beside the array as pgemm's packed
  weights are (:func:`pdjit.codegen.params.derived`: by the array's identity, made again
  after a run that may write it); a part of a one-sample convolution that the host driver
  splits over threads by output channels (``conv.split_work``) takes its rows of the whole
  filter's ``U`` (:func:`conv3x3_rows`). ``[16, M, C]``: each ``U_xi``
  the left operand of pgemm's micro-kernel as it stands (rows read by broadcast), the rows
  of the next block prefetched into L2 while a block computes.
- ``V`` and the products, by blocks of whole tile rows (:func:`block_tiles`: ``V`` and ``M``
  of a block stay in the L2 cache) in a buffer kept per thread: the input transform writes
  each ``V_xi`` in panels of 32 tiles (16 for a block of fewer, which :func:`takes` leaves
  to the taps kernel), the micro-kernel's right operand (16 tiles a
  step, vector code: :func:`_tiles_in`), the 16 products run by pgemm's register-blocked
  micro-kernel (:func:`pdjit.codegen.cpu.lib.pgemm._micro_kernel`), and the output transform
  (:func:`_tiles_out`) applies the convolution's epilogue ``minimum(maximum(y + bias[m] +
  res, lo), hi)`` as it stores the outputs of the image (those past the plane, of a last
  tile that sticks out, are not stored).

The results differ from the direct sum's (the taps kernel's) by rounding only: the
transforms add and subtract inputs (and filter taps scaled by 1/2, 1/4) before the products,
so that the error grows with the range of the values within a tile, and the sums over the
channels are 16 short ones instead of one long. Measured on unit-normal data and filters
against a float64 sum (batch 1, 56x56 64->64 to 7x7 512->512): the largest error 3.6e-7 -
8.2e-7 of the largest output (the taps kernel: 1.2e-6 - 2.9e-6), every output within rtol
1e-4.

Measured, one thread, against the taps kernel (ms, taps / Winograd, each filter run again and
again, load ~0.5): batch 1, 56x56 64->64 1.68 / 0.97, 28x28 128->128 1.48 / 0.96, 14x14
256->256 1.54 / 1.21, 7x7 512->512 2.07 / 1.78; batch 16: 28.2 / 18.4, 24.8 / 17.3, 26.2 /
16.7, 33.4 / 19.1. Inside ResNet-50 at batch 1, where each layer's filter comes from beyond
the caches, the 7x7 layers' did not pay: see :data:`_MIN_TILES`.
"""
import threading

import llvmlite.ir as ir
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic, register_jitable

from pdjit.codegen import params
from pdjit.codegen.cpu.lib._jit import by_address, compile_cost, jit, jit_o3
from pdjit.codegen.cpu.lib.pgemm import _micro_kernel
from pdjit.codegen.cpu.lib.tile import _edge_load, _masked, _offset, _splat, _store, _vectors

__all__ = ["may_take", "takes", "transformed", "conv3x3", "conv3x3_rows"]

#: the products' register blocks (rows: output channels, by vectors of tiles): 8 rows by 2
#: vectors (panels of 32 tiles) for blocks of 32 tiles or more, else 16 rows by one vector
#: (panels of 16: a 7x7 plane has 16 tiles). Measured one thread, batch 1, ms (64x56x56,
#: 128x28x28, 256x14x14, 512x7x7, load ~2.7): 14x1 1.12 1.16 1.27 1.34, 16x1 1.00 1.08 1.24
#: 1.43, 8x2 0.97 0.97 1.04 2.18, 12x2 1.01 0.94 1.04 2.06, 6x4 1.11 0.94 1.76 3.42
_wm16 = _micro_kernel(16, 1, 0)
_wm32 = _micro_kernel(8, 2, 0)
NR = 32
LANES = 16
#: bytes of a block's ``V`` and products together (kept in the L2 cache), and the fewest tiles
#: of a block (the transformed filters are read once per block)
BLOCK_BYTES = 1 << 20
MIN_BLOCK_TILES = 64
#: blocks of rows of the transformed filters prefetched ahead of the products (into L2).
#: Measured inside ResNet-50 at batch 1, its five 14x14 256->256 layers (ms): 9.6 without,
#: 8.1 one block ahead into L1, 7.7 into L2, 8.5 four blocks ahead into L2
PREFETCH_BLOCKS = 1
#: counts of calls, for tests that assert which kernel ran
CALLS = [0]


def counted_lanes(builder, i64, lanes, first, count):
    """``(mask, whole)`` of a vector of ``lanes`` from lane ``first`` (a Python int) of which
    ``count`` (an i64 value) count: ``mask`` the lanes ``first + l < count``, compared in
    32-bit lanes (one mask register a vector), ``whole`` whether that is all of them."""
    i32 = ir.IntType(32)
    ivty = ir.VectorType(i32, lanes)
    idx = ir.Constant(ivty, [first + k for k in range(lanes)])
    mask = builder.icmp_signed("<", idx, _splat(builder, ivty, builder.trunc(count, i32)))
    return mask, builder.icmp_signed(">=", count, ir.Constant(i64, first + lanes))


def input_transform(builder, d):
    """``V = B^T d B`` of a tile's 4x4 inputs ``d[i][j]`` (vectors; ``i`` the row): its
    elements ``[i][j]``, B^T's rows ``d0 - d2, d1 + d2, d2 - d1, d1 - d3`` applied down the
    columns, then across the rows."""
    add, sub = builder.fadd, builder.fsub
    t = [[sub(d[0][j], d[2][j]) for j in range(4)], [add(d[1][j], d[2][j]) for j in range(4)],
         [sub(d[2][j], d[1][j]) for j in range(4)], [sub(d[1][j], d[3][j]) for j in range(4)]]
    return [[sub(r[0], r[2]), add(r[1], r[2]), sub(r[2], r[1]), sub(r[1], r[3])] for r in t]


def output_transform(builder, m):
    """``Y = A^T M A`` of a tile's 16 products ``m[4 i + j]`` (vectors), ``A^T = [[1, 1, 1,
    0], [0, 1, -1, -1]]``: ``[[y00, y01], [y10, y11]]`` (by output rows)."""
    add, sub = builder.fadd, builder.fsub
    c0 = [add(add(m[4 * i], m[4 * i + 1]), m[4 * i + 2]) for i in range(4)]  # (column 0)
    c1 = [sub(sub(m[4 * i + 1], m[4 * i + 2]), m[4 * i + 3]) for i in range(4)]
    return [[add(add(c[0], c[1]), c[2]) for c in (c0, c1)],
            [sub(sub(c[1], c[2]), c[3]) for c in (c0, c1)]]


@intrinsic
def _tiles_in(typingctx, x, r0, rows, w_, col0, cnt, v, d0, cs):
    """``V = B^T d B`` of ``cnt`` tiles (one vector's lanes at most) of one channel and tile
    row, ``d`` a tile's 4x4 inputs read in place: rows ``k < 4`` at ``x[r0 + k * w_ ..]``
    (those whose bit ``k`` of ``rows`` is clear: zero, outside the image), tile ``l``'s
    columns from ``col0 + 2 l`` (those outside ``0 .. w_``: zero); element ``xi`` of tile
    ``l`` stored at ``v[d0 + xi * cs + l]``. Each row's inputs are split into even and odd
    columns (two masked loads and a shuffle each, from ``col0`` and ``col0 + 2``), combined
    down the rows, then across."""
    if not all(isinstance(a, types.Array) and a.ndim == 1 for a in (x, v)) or \
            x.dtype != v.dtype or x.dtype not in (types.float32, types.float64):
        return None
    sig = types.void(x, r0, rows, w_, col0, cnt, v, d0, cs)

    def codegen(context, builder, signature, args):
        at = signature.args
        xp = context.make_array(at[0])(context, builder, args[0]).data
        vp = context.make_array(at[6])(context, builder, args[6]).data
        r0v, rowsv, wv, c0v, cntv, d0v, csv = (_offset(context, builder, at[i], args[i])
                                               for i in (1, 2, 3, 4, 5, 7, 8))
        fty, size, lanes, vty, i64, zero, _ = _vectors(context, builder, at[0].dtype)
        ity = ir.VectorType(ir.IntType(32), lanes)
        even = ir.Constant(ity, [2 * k for k in range(lanes)])
        odd = ir.Constant(ity, [2 * k + 1 for k in range(lanes)])
        mload, mstore = _masked(builder, vty, "load"), _masked(builder, vty, "store")
        i32 = ir.Constant(ir.IntType(32), size)
        i32t = ir.IntType(32)
        ivty = ir.VectorType(i32t, lanes)  # (32-bit lanes: one mask register a vector)
        idx = ir.Constant(ivty, list(range(lanes)))
        wvec = _splat(builder, ivty, builder.trunc(wv, i32t))
        zvec = ir.Constant(ivty, [0] * lanes)
        masks = {}  # by the first column's offset: the columns inside the row
        for off in (0, lanes, 2, lanes + 2):
            col = builder.add(idx, _splat(builder, ivty, builder.trunc(
                builder.add(c0v, ir.Constant(i64, off)), i32t)))
            masks[off] = builder.and_(builder.icmp_signed(">=", col, zvec),
                                      builder.icmp_signed("<", col, wvec))
        cols = [[], [], [], []]  # per input column 0..3 of the tiles: the four rows
        for k in range(4):
            bit = builder.and_(builder.lshr(rowsv, ir.Constant(i64, k)), ir.Constant(i64, 1))
            inside = _splat(builder, ir.VectorType(ir.IntType(1), lanes),
                            builder.icmp_signed("!=", bit, ir.Constant(i64, 0)))
            row = builder.add(builder.add(r0v, builder.mul(wv, ir.Constant(i64, k))), c0v)
            for shift in (0, 2):
                half = []
                for h in (0, lanes):
                    p = builder.gep(xp, [builder.add(row, ir.Constant(i64, shift + h))])
                    half.append(builder.call(mload, [
                        builder.bitcast(p, vty.as_pointer()), i32,
                        builder.and_(masks[shift + h], inside), zero]))
                cols[shift].append(builder.shuffle_vector(half[0], half[1], even))
                cols[shift + 1].append(builder.shuffle_vector(half[0], half[1], odd))
        v = input_transform(builder, [[cols[j][i] for j in range(4)] for i in range(4)])
        mask, whole = counted_lanes(builder, i64, lanes, 0, cntv)
        for i, out in enumerate(v):
            for j in range(4):
                off = builder.add(d0v, builder.mul(csv, ir.Constant(i64, 4 * i + j)))
                p = builder.bitcast(builder.gep(vp, [off]), vty.as_pointer())
                _store(builder, mstore, out[j], p, i32, mask, whole)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _tiles_out(typingctx, mo, k0, ms, cnt, b, y, o0, ld, cols, two, res, lo, hi):
    """``Y = A^T M A`` of the tiles ``k0 .. k0 + cnt`` of one output channel and tile row
    (element ``xi`` of tile ``k0 + l`` at ``mo[k0 + xi * ms + l]``, readable a vector past
    it), plus ``b``, plus ``res`` at the outputs' places (where not empty), clamped to ``lo,
    hi`` (float64, infinite: none; NaN kept), stored: the tiles' two output rows (``two``
    false: the first alone) at ``y[o0 ..]`` and ``y[o0 + ld ..]``, their first ``cols``
    columns at most."""
    if not all(isinstance(a, types.Array) and a.ndim == 1 for a in (mo, y, res)) or \
            len({mo.dtype, y.dtype, res.dtype}) != 1 or \
            mo.dtype not in (types.float32, types.float64):
        return None
    sig = types.void(mo, k0, ms, cnt, b, y, o0, ld, cols, two, res, lo, hi)

    def codegen(context, builder, signature, args):
        at = signature.args
        et = at[0].dtype
        mp = context.make_array(at[0])(context, builder, args[0]).data
        yp = context.make_array(at[5])(context, builder, args[5]).data
        resa = context.make_array(at[10])(context, builder, args[10])
        k0v, msv, cntv, o0v, ldv, colv = (_offset(context, builder, at[i], args[i])
                                          for i in (1, 2, 3, 6, 7, 8))
        fty, size, lanes, vty, i64, zero, _ = _vectors(context, builder, et)
        twov = context.cast(builder, args[9], at[9], types.boolean)
        bv = _splat(builder, vty, context.cast(builder, args[4], at[4], et))
        lov, hiv = (_splat(builder, vty, context.cast(builder, args[i], at[i], et))
                    for i in (11, 12))
        m = []
        for xi in range(16):
            off = builder.add(k0v, builder.mul(msv, ir.Constant(i64, xi)))
            p = builder.bitcast(builder.gep(mp, [off]), vty.as_pointer())
            m.append(builder.load(p, align=size))
        add = builder.fadd
        ys = [[add(y, bv) for y in row] for row in output_transform(builder, m)]
        ity = ir.VectorType(ir.IntType(32), lanes)
        halves = [ir.Constant(ity, [(k // 2) + (k % 2) * lanes + h * lanes // 2
                                    for k in range(lanes)]) for h in range(2)]
        limit = builder.add(cntv, cntv)  # the columns stored
        limit = builder.select(builder.icmp_signed("<", colv, limit), colv, limit)
        mload, mstore = _masked(builder, vty, "load"), _masked(builder, vty, "store")
        i32 = ir.Constant(ir.IntType(32), size)
        has_res = builder.icmp_signed("!=", cgutils.unpack_tuple(builder, resa.shape)[0],
                                      ir.Constant(i64, 0))
        for r in range(2):
            cond = twov if r else ir.Constant(ir.IntType(1), 1)
            with builder.if_then(cond):
                row = o0v if r == 0 else builder.add(o0v, ldv)
                for h in range(2):
                    x = builder.shuffle_vector(ys[r][0], ys[r][1], halves[h])
                    mask, whole = counted_lanes(builder, i64, lanes, h * lanes, limit)
                    off = builder.add(row, ir.Constant(i64, h * lanes))
                    acc = cgutils.alloca_once_value(builder, x)
                    with builder.if_then(has_res):
                        p = builder.bitcast(builder.gep(resa.data, [off]), vty.as_pointer())
                        builder.store(add(x, _edge_load(builder, mload, p, i32, mask, whole,
                                                        zero)), acc)
                    x = builder.load(acc)
                    x = builder.select(builder.fcmp_unordered(">=", x, lov), x, lov)
                    x = builder.select(builder.fcmp_unordered("<=", x, hiv), x, hiv)
                    p = builder.bitcast(builder.gep(yp, [off]), vty.as_pointer())
                    _store(builder, mstore, x, p, i32, mask, whole)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _prefetch(typingctx, a, a0, n, step):
    """Prefetch ``a[a0 + k * step]`` for ``k < n`` into the caches (a hint: nothing read)."""
    if not isinstance(a, types.Array) or a.ndim != 1:
        return None
    sig = types.void(a, a0, n, step)

    def codegen(context, builder, signature, args):
        at = signature.args
        ap = context.make_array(at[0])(context, builder, args[0]).data
        a0v, nv, sv = (_offset(context, builder, at[i], args[i]) for i in (1, 2, 3))
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        with cgutils.for_range(builder, nv) as loop:
            off = builder.add(a0v, builder.mul(loop.index, sv))
            p = builder.bitcast(builder.gep(ap, [off]), i8p)
            builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@jit
def _filter_transform(w, ut):
    """``ut[i * 4 + j, m, c] = (G w[m, c] G^T)[i, j]`` (float64 sums, stored as ``ut``'s) for
    ``G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]``."""
    m_, c_ = w.shape[0], w.shape[1]
    t = np.empty((4, 3))
    for m in range(m_):
        for c in range(c_):
            for k in range(3):  # G g: the rows of the transformed filter by columns
                g0, g1, g2 = float(w[m, c, 0, k]), float(w[m, c, 1, k]), float(w[m, c, 2, k])
                t[0, k] = g0
                t[1, k] = 0.5 * (g0 + g1 + g2)
                t[2, k] = 0.5 * (g0 - g1 + g2)
                t[3, k] = g2
            for i in range(4):  # (G g) G^T
                g0, g1, g2 = t[i, 0], t[i, 1], t[i, 2]
                ut[i * 4, m, c] = g0
                ut[i * 4 + 1, m, c] = 0.5 * (g0 + g1 + g2)
                ut[i * 4 + 2, m, c] = 0.5 * (g0 - g1 + g2)
                ut[i * 4 + 3, m, c] = g2


def _make(w4):
    ut = np.empty((16, w4.shape[0], w4.shape[1]), w4.dtype)
    _filter_transform(w4, ut)
    return ut


def transformed(w):
    """The transformed filter (``[16, M, C]``) of ``w`` (a C-contiguous ``[M, C, 3, 3]``
    array), kept beside it (:func:`pdjit.codegen.params.derived`: by the array's identity,
    made again after a run that may write it). A part of a one-sample convolution split over
    its output channels takes rows of the whole filter's (:func:`conv3x3_rows`)."""
    return params.derived(w, "winograd", lambda: _make(w))


#: the convolutions on Winograd (else the taps kernel): from ``_MIN_TILES`` tiles per call
#: (samples times tiles per plane), ``_MIN_IN`` input and ``_MIN_OUT`` output channels. The
#: transformed filters are 16/9 the filter's size and read once per block of tiles: with few
#: tiles the products wait for them. Measured inside ResNet-50 at batch 1, one thread (the
#: layers' weights read from beyond L2 as in any model's run; ms per layer, taps / Winograd,
#: load ~1.5): 56x56 64->64 (784 tiles) 2.1 / 1.2, 28x28 128->128 (196) 1.7 / 1.2, 14x14
#: 256->256 (49) 1.65 / 1.55, 7x7 512->512 (16) 2.2 / 2.45. Alone, the same filter run
#: again (warm caches), batch 1: 7x7 512->512 2.22 / 1.79, 8x8 64->64 (16 tiles) 0.045 /
#: 0.033, 4x4 128->128 (4) 0.055 / 0.080, 4x4 512->512 0.68 / 1.43 (a panel of 16 tiles for
#: 4); batch 16 of 4x4 512->512 10.6 / 6.0. Few output channels do not pay (the transforms'
#: work is per input and per output channel, the products' per pair): 32x32 16->16 0.040 /
#: 0.041, 14x14 64->16 0.045 / 0.050, 8x8 16->16 0.006 / 0.008; 56x56 16->64 0.39 / 0.34,
#: 32x32 32->32 0.146 / 0.134
_MIN_TILES = 32
_MIN_IN = 16
_MIN_OUT = 32
#: ... and from ``_MIN_TILES_NEAR`` tiles where the transformed filter is at most
#: ``_NEAR_BYTES`` (it stays in the L2 cache). Alone, batch 1 (16 tiles), one thread, ms,
#: by turns in one process, Winograd / the kernel taken before: 7x7 128->32 0.074 / 0.130
#: (taps), 64->96 0.071 / 0.099, 64->64 0.054 / 0.080, 32->128 0.056 / 0.071 (transposed
#: tiles on the patches); DenseNet-121 at batch 1 on two threads 5 % faster (with the split
#: by rows of :func:`.conv.split_channels` for 32 output channels), one thread the same.
_MIN_TILES_NEAR = 16
_NEAR_BYTES = 512 << 10


@register_jitable
def enough_tiles(tiles, m, c):
    """Whether ``tiles`` tiles (the whole call's) of a filter of ``m`` output and ``c``
    input channels are enough for Winograd's kernel to pay."""
    return tiles >= _MIN_TILES or tiles >= _MIN_TILES_NEAR and 16 * 4 * m * c <= _NEAR_BYTES


def may_take(m: int, c: int, kh: int, kw: int, strides, dilations, groups: int) -> bool:
    """Whether :func:`takes` may take a filter of ``m`` output and ``c`` input channels (per
    group) of ``kh x kw`` with these strides, dilations and groups, whatever the image (the
    sizes a lowering knows: it then names the entry whose compile jobs include this
    kernel's)."""
    return kh == 3 and kw == 3 and tuple(strides) == (1, 1) and tuple(dilations) == (1, 1) \
        and groups == 1 and m >= _MIN_OUT and c >= _MIN_IN


def takes(x, w, y, n, sh, sw, pt, pl, dh, dw, groups) -> bool:
    """Whether :func:`conv3x3` serves the convolution of ``n`` samples (a 3x3 stride-1
    filter on float32 data, paddings not past the filter's reach, C-contiguous arrays, the
    sizes above)."""
    if x.dtype != np.float32 or w.dtype != np.float32 or y.dtype != np.float32 or \
            groups != 1 or sh != 1 or sw != 1 or dh != 1 or dw != 1 or \
            w.shape[2] != 3 or w.shape[3] != 3:
        return False
    oh, ow = y.shape[2], y.shape[3]
    return 0 <= pt <= 2 and 0 <= pl <= 2 and oh + 2 - x.shape[2] - pt >= 0 and \
        ow + 2 - x.shape[3] - pl >= 0 and \
        enough_tiles(n * ((oh + 1) // 2) * ((ow + 1) // 2), w.shape[0], w.shape[1]) \
        and w.shape[0] >= _MIN_OUT and w.shape[1] >= _MIN_IN and \
        x.flags.c_contiguous and y.flags.c_contiguous and w.flags.c_contiguous


def conv3x3(x, w, y, n0, n1, pt, pl, bias, lo, hi, res):
    """``y[n] = minimum(maximum(conv(x[n], w) + bias[m] + res, lo), hi)`` for the samples
    ``n0..n1`` by F(2x2, 3x3) (a convolution that :func:`takes` takes)."""
    conv3x3_rows(x, transformed(w), 0, y, n0, n1, pt, pl, bias, lo, hi, res)


def conv3x3_rows(x, ut, row, y, n0, n1, pt, pl, bias, lo, hi, res):
    """:func:`conv3x3` of the filter whose transform ``ut`` holds ``y``'s output channels
    from row ``row`` on (``y``, ``bias``, ``res``: those channels'): a part of a
    convolution split over its output channels (``conv.split_work``)."""
    CALLS[0] += 1
    need = scratch_size.py_func(x.shape[1], y.shape[1], y.shape[2], y.shape[3], n1 - n0)
    _wino_range(x, ut, row, y, n0, n1, pt, pl, bias, float(lo), float(hi), res,
                _scratch(need), 0, -1)


_SCRATCH = threading.local()


def _scratch(n: int):
    """This thread's buffer for a block's ``V`` and products, of ``n`` values or more: kept
    from call to call (made zero, then holding finite values of earlier blocks: the padding
    tiles that the products compute and never store hold no NaN nor denormal). Measured: a
    fresh megabyte per call cost ResNet-50 at batch 1 ~1 ms (its pages faulted in), and at two
    threads, whose faults wait for each other, 9 ms."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.buf = np.zeros(n, np.float32)
    return buf


@jit
def block_tiles(c_, m_, tw):
    """Tile rows per block: ``V`` (``16 C`` values per tile) and the products (``16 M``)
    within :data:`BLOCK_BYTES`, at least :data:`MIN_BLOCK_TILES` tiles or one tile row."""
    return max(1, max(MIN_BLOCK_TILES, BLOCK_BYTES // (64 * (c_ + m_))) // max(1, tw))


@jit
def _block_geometry(c_, m_, oh_, ow_, n):
    """``(tile rows per block, tiles per panel, the most tiles of a block's panels)``."""
    tw = (ow_ + 1) // 2
    kb = min(n * ((oh_ + 1) // 2), block_tiles(c_, m_, tw))
    nr = NR if kb * tw >= NR else LANES
    return kb, nr, (kb * tw + nr - 1) // nr * nr


@jit
def scratch_size(c_, m_, oh_, ow_, n):
    """The values of :func:`_wino_range`'s buffer for ``n`` samples: a block's ``V`` and
    products, each with a vector's slack."""
    tmax = _block_geometry(c_, m_, oh_, ow_, n)[2]
    return 16 * (c_ * tmax + 16) + 16 * (m_ * tmax + 16) + LANES


@by_address
@jit_o3
def _wino_range(x, ut, row, y, n0, n1, pt, pl, bias, lo, hi, res, scratch, t0, t1):
    """:func:`conv3x3`'s kernel: ``ut`` the transformed filters (``[16, M_all, C]``), ``y``'s
    channels from row ``row`` of it, ``scratch`` (:func:`scratch_size` values or more, no NaN
    nor denormal) for a block's ``V`` and products; the rows of tiles ``t0 .. t1`` (counted
    over the samples ``n0 .. n1``, each ``ceil(OH / 2)`` of them; ``t1 < 0``: all), each tile
    the same sums whatever the range (a part of a convolution split by rows of its output)."""
    c_, h_, w_ = x.shape[1], x.shape[2], x.shape[3]
    m_, oh_, ow_ = y.shape[1], y.shape[2], y.shape[3]
    mt = ut.shape[1]
    if ut.shape[0] != 16 or ut.shape[2] != c_ or row < 0 or row + m_ > mt or \
            x.shape[0] != y.shape[0] or n0 < 0 or n1 > x.shape[0] or \
            (bias.size != 0 and bias.size != m_) or (res.size != 0 and res.size != y.size) or \
            scratch.size < scratch_size(c_, m_, oh_, ow_, n1 - n0):
        raise ValueError("pdjit: convolution operands do not fit each other")
    if n1 <= n0 or oh_ == 0 or ow_ == 0:
        return
    th, tw = (oh_ + 1) // 2, (ow_ + 1) // 2
    nrows = (n1 - n0) * th if t1 < 0 else t1
    if t0 < 0 or nrows > (n1 - n0) * th:
        raise ValueError("pdjit: convolution operands do not fit each other")
    kb, nr, tmax = _block_geometry(c_, m_, oh_, ow_, n1 - n0)
    nv = 16 * (c_ * tmax + 16)
    v = scratch[:nv]
    mo = scratch[nv:]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    utf = ut.reshape(ut.size)
    none = bias[:0]
    has_bias = bias.size != 0
    for r0 in range(t0, nrows, kb):
        r1 = min(nrows, r0 + kb)
        tb = (r1 - r0) * tw
        tp = (tb + nr - 1) // nr * nr
        cs = c_ * tp + 16  # (each V_xi on other cache sets than the last)
        # ---- input transform: V_xi[c, t] into panels of NR tiles
        for r in range(r0, r1):
            n = n0 + r // th
            ty = r % th
            base = (r - r0) * tw
            iy = 2 * ty - pt
            rows = 0
            for k in range(4):
                if 0 <= iy + k < h_:
                    rows |= 1 << k
            for c in range(c_):
                s0 = ((n * c_ + c) * h_ + iy) * w_
                tx = 0
                while tx < tw:
                    t = base + tx
                    j = t // nr
                    qo = t - j * nr
                    seg = min(tw - tx, nr - qo, LANES)
                    _tiles_in(xf, s0, rows, w_, 2 * tx - pl, seg, v, (j * c_ + c) * nr + qo, cs)
                    tx += seg
        # ---- the 16 products M_xi [m_, tp] = U_xi [m_, c_] @ V_xi [c_, tp]
        ms = m_ * tp + 16
        mr = 8 if nr == NR else 16
        nblk = (m_ + mr - 1) // mr
        for xi in range(16):
            for m0 in range(0, m_, mr):
                # the rows of U that PREFETCH_BLOCKS blocks of rows on read, from memory while
                # these compute (a model's weights come from beyond the caches)
                ahead = xi * nblk + m0 // mr + PREFETCH_BLOCKS
                if ahead < 16 * nblk:
                    pm = ahead % nblk * mr
                    _prefetch(utf, ((ahead // nblk) * mt + row + pm) * c_,
                              min(mr, m_ - pm) * c_ // LANES, LANES)
                for j in range(tp // nr):
                    if nr == NR:
                        _wm32(utf, (xi * mt + row + m0) * c_, c_, min(8, m_ - m0), c_, v,
                              xi * cs + j * c_ * nr, mo, xi * ms + m0 * tp + j * nr, tp,
                              min(nr, tb - j * nr), none, 0, none, -np.inf, np.inf)
                    else:
                        _wm16(utf, (xi * mt + row + m0) * c_, c_, min(16, m_ - m0), c_, v,
                              xi * cs + j * c_ * nr, mo, xi * ms + m0 * tp + j * nr, tp,
                              min(nr, tb - j * nr), none, 0, none, -np.inf, np.inf)
        # ---- output transform, epilogue, stores
        for r in range(r0, r1):
            n = n0 + r // th
            ty = r % th
            base = (r - r0) * tw
            two = 2 * ty + 1 < oh_
            for m in range(m_):
                b = bias[m] if has_bias else np.float32(0.0)
                o = ((n * m_ + m) * oh_ + 2 * ty) * ow_
                mb = m * tp + base
                for u in range(0, tw, LANES):
                    _tiles_out(mo, mb + u, ms, min(LANES, tw - u), b, yf, o + 2 * u, ow_,
                               ow_ - 2 * u, two, res, lo, hi)


def jobs(T):
    """The compile jobs of :func:`conv3x3` for data of NumPy type ``T`` (float32 only: other
    types stay on the taps kernel; ``conv._fwd_range_3x3``'s include them)."""
    if np.dtype(T) != np.float32:
        return []
    return [(_filter_transform, ((T, 4), (T, 3))),
            (_wino_range, ((T, 4), (T, 3), int, (T, 4), int, int, int, int, (T, 1), float, float,
                           (T, 1), (T, 1), int, int))]


# compile time (CPU seconds, cold, alone in a fresh process, load ~1): 1.14 s and 0.45 s
compile_cost(1.2, _wino_range)
compile_cost(0.45, _filter_transform)
