"""pdjit's own matrix product on a packed right operand: ``c = a @ b`` where ``b`` (``[K, N]``)
was rearranged into panels of ``NR`` columns (:func:`pack_b`), each panel ``K`` rows of ``NR``
contiguous values, zero-padded past ``N``.

The micro-kernel (:func:`_micro`, LLVM IR with explicit vectors as in :mod:`.tile`) keeps a
block of ``MR`` rows by ``NR`` columns of ``c`` in vector registers over the whole sum: each
step ``k`` loads the panel's ``NR`` values of row ``k`` (``NV`` vectors), prefetches the row
:data:`PREFETCH_ROWS` ahead and broadcasts ``MR`` values of ``a``; the epilogue (a bias per
column, a residual of ``c``'s shape, a clamp: :func:`weight_rows`) is applied to the sums and
the block stored once (masked on the last columns, rows past ``M`` not stored), so ``c`` is
never zeroed (nor read, but by a sum by chunks). The driver walks blocks of rows of ``a`` that
stay in the L2 cache and, for each, every panel (a long one by chunks of its rows,
:data:`PANEL_WHOLE_BYTES`; short ones by groups, each tile over a group's panels in turn,
:data:`GROUP_BYTES`). The sums run in order of ``k``, each a fused multiply-add.

Weights (a product's right operand that is a parameter no op of the program writes, see
``pdjit.codegen.cpu.lowerings.matmul``) are packed once: :func:`packed_weight` keeps the packed
copy beside the array (by its identity, weakly) and makes it again after a run that may write
the array in place (:mod:`pdjit.codegen.params`); it is never a value of the Scope, so it
never reaches a fetch or a saved model. A weight changed in place through a NumPy view of the
Scope's array, outside any program, is not seen: give the Scope a new array
(``Tensor.set``). Compiled code (a native driver, an ahead-of-time artifact) packs at each call
and runs the same kernel, bit for bit.

The same generator (:func:`_micro_kernel`) makes the tiles of pointwise convolutions
(:func:`pointwise_rows`: the filter packed by blocks of ``MR`` rows, the image in place as the
right operand; ``pointwise.pointwise_cols`` and ``conv_cols``: the product transposed, the
filter packed as a weight, the tile transposed as it is stored), which :mod:`.pointwise` picks
between.

Measured against OpenBLAS 0.3.31 (``np.dot``, one thread, float32, the shapes of a BERT-like
encoder, medians of thread time, load 10-12): 128x256x256 0.109 / 0.123 ms, 128x256x1024 0.448
/ 0.504, 128x1024x256 0.447 / 0.515, 2048x256x1024 7.19 / 8.32, 2048x1024x256 7.02 / 7.85.
"""

import llvmlite.ir as ir
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic, overload, register_jitable

from pdjit.codegen import params
from pdjit.codegen.cpu import replay, rt, threads
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import (
    blas_gemm,
    by_address,
    compile_cost,
    jit,
    jobs,
    may_share,
    pjit,
)
from pdjit.codegen.cpu.lib.tile import (
    PASS_ROWS,
    TILE_BYTES,
    _clamp,
    _edge_load,
    _masked,
    _offset,
    _prefetch,
    _splat,
    _store,
    _vectors,
    gate_of,
    gated,
    sum_passes,
)

__all__ = ["pack_a", "pack_b", "pack_scaled", "packed_batches", "packed_gemm",
           "packed_b_size", "packed_rows_size", "packed_weight", "panel_width",
           "pointwise_rows", "pointwise_rows_prologue", "rows_by_pixels",
           "rows_by_pixels_prologue", "weight_gemm", "weight_rows",
           "weight_split_work"]

#: rows of a block of ``c`` (broadcast values of ``a``) and vectors of columns per panel: 24
#: accumulators of the 32 vector registers of AVX-512 (with fewer registers the tile sums by
#: passes: :data:`.tile.PASS_ROWS`)
MR, NV = 6, 4
_U = numba.uint64
#: the fewest multiply-adds a product is split over threads for (where threads are given)
SPLIT_MIN_WORK = 1 << 22
#: the fewest rows of a product on the packed GEMM: a block of ``MR`` rows costs the same for
#: one row as for ``MR`` (a matrix-vector product is BLAS's)
PACKED_MIN_ROWS = 16


def panel_width(dtype) -> int:
    """``NR``: the columns of a panel, ``NV`` vectors of :data:`TILE_BYTES`."""
    return NV * (TILE_BYTES // np.dtype(dtype).itemsize)


@register_jitable
def packed_b_size(k: int, n: int, itemsize: int) -> int:
    """The values of a ``[k, n]`` right operand of ``itemsize``-byte values packed by
    :func:`pack_b`: whole panels of ``NR`` columns (:func:`panel_width`)."""
    nr = NV * (TILE_BYTES // itemsize)
    return (n + nr - 1) // nr * k * nr


def _micro_kernel(mr: int, nv: int, pf: int = 0, conv: bool = False, trans: bool = False,
                  far: bool = False, gate: bool = False, taps: bool = False,
                  copy: bool = False, spread: bool = False, astep: int = 0):
    """The intrinsic of a tile of ``mr`` rows by ``nv`` vectors of columns of a product.

    ``micro(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo, hi)``
    (:func:`_micro`, the right operand packed): ``c[c0 + r*ldc + q] = clamp(sum_k a[a0 +
    r*lda + k] * bp[b0 + k*NR + q] + bias[n0 + q] + res[c0 + r*ldc + q], lo, hi)`` for ``r <
    rows`` (at most ``mr``), ``q < cols`` (at most ``NR``), ``pf`` rows of the panel ahead
    prefetched.

    ``conv``: ``micro(a, a0, rows, kk, b, b0, ldb, c, c0, ldc, cols, bias, m0, res, lo,
    hi)`` (:func:`_conv_micro`, the left operand packed by :func:`pack_a`, the right one read
    in place): ``c[c0 + r*ldc + q] = clamp(sum_k a[a0 + k*mr + r] * b[b0 + k*ldb + q] +
    bias[m0 + r] + res[c0 + r*ldc + q], lo, hi)``, ``b``'s rows loaded under the columns'
    mask (nothing read past ``cols``); ``pf``: the next panel's row prefetched into L2.
    ``astep`` (with ``conv``; 0: ``mr``): the values a step ``k`` of the packed left operand
    holds, ``a[a0 + k*astep + r]``: a tile of fewer rows than the blocks it reads
    (:data:`_conv_micro_tail`).

    ``trans``: ``micro(a, a0, ka, rows, kk, bp, b0, c, c0, ldq, cols, bias, n0, res, lo,
    hi)`` (:func:`_convt_micro`): as :func:`_micro` with ``a``'s rows and ``c``'s columns
    transposed, ``a[a0 + r + k*ka]`` for ``a[a0 + r*lda + k]`` and ``c[c0 + r + q*ldq]`` for
    ``c[c0 + r*ldc + q]`` (the residual too): ``c``'s columns transposed in registers into
    rows of the tile's rows (:func:`_store_transposed`, once per tile, after the whole sum;
    ``mr`` at most :data:`_TRANS_ROWS`).

    ``far`` (not with ``conv``): one more argument, ``pfo``: each step prefetches the panel's
    values ``pfo`` past the row it loads into the L2 cache (rather than ``pf`` rows ahead into
    L1), so that a tile can fetch the next chunk of a panel that the tiles after it read;
    ``pfo`` 0: none (a tile whose rows an earlier tile brought in: its loop then has no
    prefetch to issue).

    ``taps`` (with ``far`` or ``spread``): two more arguments, ``off`` (int64) and ``k0``:
    ``a[a0 + r*ka + off[k0 + k]]`` for ``a[a0 + r + k*ka]`` (``trans``) or ``a[a0 + r*lda +
    k]``, the left operand read where each step ``k`` of the sum finds it (a convolution's
    image, ``off`` the offsets of its taps, ``ka``/``lda`` the stride between the tile's
    pixels), not from patches.

    ``spread`` (a plain or gated tile, or one reading the taps; not ``far``): two more
    arguments after the others, ``pfb`` and ``pfl``: each step ``k < pfl`` also prefetches
    line ``k`` of the lines from ``bp[pfb]`` into the L2 cache (a tile's share of the panel's
    next chunk, which the tiles of this one fetch between them, a line each a step; ``pfl``
    0: none).

    ``gate`` (neither ``conv``, ``trans`` nor ``far``): one more argument, ``gate``, an array
    of the data's type applied after the clamp (:func:`.tile.gate_of`: hard_swish or
    hard_sigmoid; empty: none).

    ``copy`` (with ``conv``): two more arguments, ``pk`` and ``pk0``: each row ``k`` of ``b``
    the tile loads is also stored whole (``nv`` vectors, zero past ``cols``) at ``pk[pk0 +
    k*nv*lanes]``, so that the tiles after it read the panel packed (``ldb`` its width).

    ``bias``, ``res`` empty: no add; ``clamp`` as :func:`.tile.clamp_run` (``lo``, ``hi``
    float64, infinite: none). All arrays flat and C-contiguous; offsets the caller's to keep
    in bounds. The sums run in order of ``k``, each a fused multiply-add, in vector registers
    (allocas LLVM promotes) until the one store of the tile."""
    if gate and (conv or trans or far):
        raise ValueError("pdjit: a gated tile is a plain one")
    if taps and not (far or spread):
        raise ValueError("pdjit: a tile reading the taps is a far or spread one")
    if copy and not conv:
        raise ValueError("pdjit: a tile copying its panel reads the right operand in place")
    if spread and (conv or trans or far):
        raise ValueError("pdjit: a tile spreading its prefetches is a plain, gated or taps one")
    if astep and (not conv or astep < mr):
        raise ValueError("pdjit: a step of the packed rows is a conv tile's, at least its rows")
    if trans and mr > _TRANS_ROWS:
        raise ValueError(f"pdjit: a transposed tile has at most {_TRANS_ROWS} rows, not {mr}")

    def codegen(context, builder, signature, args):
        at = signature.args
        if conv:  # a, a0, rows, kk, b, b0, ldb, c, c0, ldc, cols, bias, m0, res, lo, hi
            ia, ib, ic, ibias, ires, ilo = 0, 4, 7, 11, 13, 14
            a0v, rowsv, kkv, b0v, ldbv, c0v, ldcv, colsv, n0v = (
                _offset(context, builder, at[i], args[i]) for i in (1, 2, 3, 5, 6, 8, 9, 10, 12))
            if copy:
                pkptr = context.make_array(at[16])(context, builder, args[16]).data
                pk0v = _offset(context, builder, at[17], args[17])
        else:  # a, a0, lda (trans: ka), rows, kk, bp, b0, c, c0, ldc (ldq), cols, bias, n0,
            # res, lo, hi (far: pfo)
            ia, ib, ic, ibias, ires, ilo = 0, 5, 7, 11, 13, 14
            a0v, ldav, rowsv, kkv, b0v, c0v, ldcv, colsv, n0v = (
                _offset(context, builder, at[i], args[i]) for i in (1, 2, 3, 4, 6, 8, 9, 10, 12))
            pfov = _offset(context, builder, at[16], args[16]) if far else None
        more = 17 if far or gate else 16  # (the index of the arguments after those)
        if taps:
            offp = context.make_array(at[more])(context, builder, args[more]).data
            k0v = _offset(context, builder, at[more + 1], args[more + 1])
            more += 2
        if spread:  # the first value of the tile's share of lines to prefetch, and how many
            pfbv, pflv = (_offset(context, builder, at[i], args[i]) for i in (more, more + 1))
        ptr = [context.make_array(at[i])(context, builder, args[i]) for i in (ia, ib, ic, ibias)]
        aptr, bptr, cptr, biasa = ptr[0].data, ptr[1].data, ptr[2].data, ptr[3]
        fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)
        nr = nv * lanes

        def const(v):
            return ir.Constant(i64, v)

        # the columns' masks (compared in 32-bit lanes: one mask register a vector)
        i32t = ir.IntType(32)
        m32 = ir.VectorType(i32t, lanes)
        idx = ir.Constant(m32, list(range(lanes)))
        colvec = _splat(builder, m32, builder.trunc(colsv, i32t))
        masks = []
        for v in range(nv):
            q = builder.add(idx, _splat(builder, m32, ir.Constant(i32t, v * lanes)))
            masks.append(builder.icmp_signed("<", q, colvec))
        mload, mstore = _masked(builder, vty, "load"), _masked(builder, vty, "store")
        i32 = ir.Constant(ir.IntType(32), size)
        in_cols = [builder.icmp_signed("<=", const((v + 1) * lanes), colsv)  # (vector v whole)
                   for v in range(nv)]

        def cell(r, v):  # (not ``trans``: its stores are :func:`_store_transposed`'s)
            off = builder.add(builder.add(c0v, builder.mul(ldcv, const(r))), const(v * lanes))
            return off, builder.bitcast(builder.gep(cptr, [off]), vty.as_pointer())

        acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)]
               for _ in range(mr)]
        if not conv:
            # rows past ``rows`` read the last row again (never stored)
            last = builder.sub(rowsv, const(1))
            arow = []
            for r in range(mr):
                rr = builder.select(builder.icmp_signed("<", const(r), rowsv), const(r), last)
                arow.append(builder.add(a0v, builder.mul(rr, ldav) if taps or not trans
                                        else rr))
        def sums(masked: bool):
            """The loops over ``k`` of the tile's fused multiply-adds, one per pass
            (:func:`.tile.sum_passes`; the first makes the prefetches) (``masked``: conv's
            rows of b loaded under the columns' mask); a far tile's given ``pfo`` 0, loops
            without its prefetches."""
            for i, part in enumerate(sum_passes(mr, nv)):
                if far and i == 0:
                    with builder.if_else(builder.icmp_signed("==", pfov, const(0))) as (
                            near, ahead):
                        with near:
                            steps(masked, False, part, True)
                        with ahead:
                            steps(masked, True, part, True)
                else:
                    steps(masked, bool(pf) and i == 0, part, i == 0)

        def steps(masked: bool, fetch: bool, part, first: bool):
            """The steps ``k`` of the sum of the rows and vectors ``part`` (``fetch``: each
            prefetching the panel's row ahead; ``first``: the first pass, which makes the
            prefetches and the copies); a spread tile's first ``pfl`` each fetching a line
            of its share, then the rest (a step that kept fetching the share's last line
            again took an instruction count the multiply-adds need on a core shared with
            another thread)."""
            if not (spread and first):
                with cgutils.for_range(builder, kkv) as loop:
                    step(loop.index, masked, fetch, False, part, first)
                return
            n1 = builder.select(builder.icmp_signed("<", pflv, kkv), pflv, kkv)
            with cgutils.for_range_slice(builder, const(0), n1, const(1), inc=True) as (k, _):
                step(k, masked, fetch, True, part, first)
            with cgutils.for_range_slice(builder, n1, kkv, const(1), inc=True) as (k, _):
                step(k, masked, fetch, False, part, first)

        def step(k, masked: bool, fetch: bool, share: bool, part, first: bool):
            r0, r1, v0, v1 = part
            if conv:  # row k of b in place
                base = builder.add(b0v, builder.mul(k, ldbv))
                for v in range(nv if pf and first else 0):  # the next panel's row k, into L2
                    _prefetch(builder, bptr, builder.add(base, const(nr + v * lanes)),
                              locality=2)
                abase = builder.add(a0v, builder.mul(k, const(astep or mr)))
            else:
                base = builder.add(b0v, builder.mul(k, const(nr)))
                if share:  # line k of the tile's share
                    _prefetch(builder, bptr, builder.add(pfbv, builder.mul(k, const(lanes))),
                              locality=2)
                # the panel's row pf steps ahead (far: pfo values past, into L2)
                ahead = builder.add(base, pfov) if far else builder.add(base, const(pf * nr))
                for v in range(nv if fetch else 0):
                    _prefetch(builder, bptr, builder.add(ahead, const(v * lanes)),
                              locality=2 if far else 3)
            if taps:  # where step k's tap starts
                tapk = builder.load(builder.gep(offp, [builder.add(k0v, k)]))
            bv = {}
            for v in range(v0, v1):
                p = builder.bitcast(builder.gep(bptr, [builder.add(base, const(v * lanes))]),
                                    vty.as_pointer())
                bv[v] = (builder.call(mload, [p, i32, masks[v], zero]) if masked else
                         builder.load(p, align=size))
            if copy and r0 == 0:  # the row packed for the tiles after this one
                pkb = builder.add(pk0v, builder.mul(k, const(nr)))
                for v in range(v0, v1):
                    q = builder.gep(pkptr, [builder.add(pkb, const(v * lanes))])
                    builder.store(bv[v], builder.bitcast(q, vty.as_pointer()), align=4)
            for r in range(r0, r1):
                ai = builder.add(abase, const(r)) if conv else builder.add(
                    arow[r], tapk if taps else builder.mul(k, ldav) if trans else k)
                wb = _splat(builder, vty, builder.load(builder.gep(aptr, [ai])))
                for v in range(v0, v1):
                    builder.store(builder.call(fma, [wb, bv[v], builder.load(acc[r][v])]),
                                  acc[r][v])

        resa = context.make_array(at[ires])(context, builder, args[ires])
        has_res = builder.icmp_signed("!=", cgutils.unpack_tuple(builder, resa.shape)[0],
                                      const(0))
        if conv:  # the residual under the next tile of columns, read by its epilogue, fetched
            # while this one sums (each tile's epilogue had waited for its own: ResNet-50's
            # 56x56 64 -> 256 with its residual at batch 4, one thread, 2.87 -> 2.16 ms)
            with builder.if_then(has_res):
                for r in range(mr):
                    for v in range(nv):
                        _prefetch(builder, resa.data, builder.add(cell(r, v)[0], const(nr)))
        if conv:  # b read in place: a tile of all ``nr`` columns loads them whole (the masks,
            # rebuilt at each step, took a port the multiply-adds need), the last one masked
            with builder.if_else(builder.icmp_signed("==", colsv, const(nr))) as (whole, part):
                with whole:
                    sums(False)
                with part:
                    sums(True)
        else:  # b packed, zero past its columns
            sums(False)
        nbias = cgutils.unpack_tuple(builder, biasa.shape)[0]
        has_bias = builder.icmp_signed("!=", nbias, const(0))
        with builder.if_then(has_bias):
            if conv:  # a bias per row
                for r in range(mr):
                    with builder.if_then(builder.icmp_signed("<", const(r), rowsv)):
                        b = _splat(builder, vty, builder.load(builder.gep(
                            biasa.data, [builder.add(n0v, const(r))])))
                        for v in range(nv):
                            builder.store(builder.fadd(builder.load(acc[r][v]), b), acc[r][v])
            else:  # a bias per column (the last vector's load masked: it holds N values)
                for v in range(nv):
                    p = builder.gep(biasa.data, [builder.add(n0v, const(v * lanes))])
                    b = _edge_load(builder, mload, builder.bitcast(p, vty.as_pointer()), i32,
                                   masks[v], in_cols[v], zero)
                    for r in range(mr):
                        builder.store(builder.fadd(builder.load(acc[r][v]), b), acc[r][v])
        lov, hiv = (_splat(builder, vty, context.cast(builder, args[i], at[i],
                                                      at[0].dtype)) for i in (ilo, ilo + 1))
        if gate:
            has_gate, gv = gate_of(context, builder, at[16], args[16], vty)
        if trans:
            _store_transposed(context, builder, [[builder.load(acc[r][v]) for v in range(nv)]
                                                 for r in range(mr)], cptr, resa.data, has_res,
                              c0v, ldcv, rowsv, colsv, lov, hiv)
            return context.get_dummy_value()
        for r in range(mr):
            with builder.if_then(builder.icmp_signed("<", const(r), rowsv)):
                for v in range(nv):
                    off, cp = cell(r, v)
                    x = builder.load(acc[r][v])
                    with builder.if_then(has_res):
                        p = builder.gep(resa.data, [off])
                        rv = _edge_load(builder, mload, builder.bitcast(p, vty.as_pointer()),
                                        i32, masks[v], in_cols[v], zero)
                        builder.store(builder.fadd(x, rv), acc[r][v])
                    x = builder.load(acc[r][v])
                    x = builder.select(builder.fcmp_unordered(">=", x, lov), x, lov)
                    x = builder.select(builder.fcmp_unordered("<=", x, hiv), x, hiv)
                    if gate:
                        x = gated(builder, has_gate, gv, x)
                    _store(builder, mstore, x, cp, i32, masks[v], in_cols[v])
        return context.get_dummy_value()

    def typed(arrays, floats, dtype):
        return all(isinstance(x, types.Array) and x.ndim == 1 for x in arrays) and \
            len({x.dtype for x in arrays}) == 1 and dtype in (types.float32, types.float64) \
            and all(isinstance(t, types.Float) for t in floats)

    if copy:
        @intrinsic
        def micro(typingctx, a, a0, rows, kk, b, b0, ldb, c, c0, ldc, cols, bias, m0, res, lo,
                  hi, pk, pk0):
            if not typed((a, b, c, bias, res, pk), (lo, hi), a.dtype):
                return None
            return types.void(a, a0, rows, kk, b, b0, ldb, c, c0, ldc, cols, bias, m0, res, lo,
                              hi, pk, pk0), codegen
        return micro

    if conv:
        @intrinsic
        def micro(typingctx, a, a0, rows, kk, b, b0, ldb, c, c0, ldc, cols, bias, m0, res, lo,
                  hi):
            if not typed((a, b, c, bias, res), (lo, hi), a.dtype):
                return None
            return types.void(a, a0, rows, kk, b, b0, ldb, c, c0, ldc, cols, bias, m0, res, lo,
                              hi), codegen
        return micro

    if gate and spread:
        @intrinsic
        def micro(typingctx, a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
                  hi, gate, pfb, pfl):
            if not typed((a, bp, c, bias, res, gate), (lo, hi), a.dtype):
                return None
            return types.void(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res,
                              lo, hi, gate, pfb, pfl), codegen
        return micro

    if gate:
        @intrinsic
        def micro(typingctx, a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
                  hi, gate):
            if not typed((a, bp, c, bias, res, gate), (lo, hi), a.dtype):
                return None
            return types.void(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res,
                              lo, hi, gate), codegen
        return micro

    if taps and spread:
        @intrinsic
        def micro(typingctx, a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
                  hi, off, k0, pfb, pfl):
            if not typed((a, bp, c, bias, res), (lo, hi), a.dtype) or not (
                    isinstance(off, types.Array) and off.ndim == 1 and off.dtype == types.int64):
                return None
            return types.void(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res,
                              lo, hi, off, k0, pfb, pfl), codegen
        return micro

    if spread:
        @intrinsic
        def micro(typingctx, a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
                  hi, pfb, pfl):
            if not typed((a, bp, c, bias, res), (lo, hi), a.dtype):
                return None
            return types.void(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res,
                              lo, hi, pfb, pfl), codegen
        return micro

    if taps:
        @intrinsic
        def micro(typingctx, a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
                  hi, pfo, off, k0):
            if not typed((a, bp, c, bias, res), (lo, hi), a.dtype) or not (
                    isinstance(off, types.Array) and off.ndim == 1 and off.dtype == types.int64):
                return None
            return types.void(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res,
                              lo, hi, pfo, off, k0), codegen
        return micro

    if far:
        @intrinsic
        def micro(typingctx, a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
                  hi, pfo):
            if not typed((a, bp, c, bias, res), (lo, hi), a.dtype):
                return None
            return types.void(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res,
                              lo, hi, pfo), codegen
        return micro

    @intrinsic
    def micro(typingctx, a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
              hi):
        if not typed((a, bp, c, bias, res), (lo, hi), a.dtype):
            return None
        return types.void(a, a0, lda, rows, kk, bp, b0, c, c0, ldc, cols, bias, n0, res, lo,
                          hi), codegen
    return micro


#: the transposed tiles (``trans``) of at most this many rows store their columns as rows of
#: this many values (:func:`_store_transposed`)
_TRANS_ROWS = 8


def _transposed(builder, vecs, rows: int):
    """The columns of the ``len(vecs)`` (at most ``rows``, a power of two no larger than a
    vector's lanes) vectors ``vecs`` (rows past them undefined), as vectors of ``rows`` lanes:
    ``out[q][r] = vecs[r][q]``. Three rounds of two-vector shuffles for eight rows, each round
    merging pairs of blocks of rows, then the halves split off (on AVX-512 each shuffle is one
    two-source permute)."""
    vty = vecs[0].type
    lanes = vty.count
    undef = ir.Constant(vty, ir.Undefined)
    i32 = ir.IntType(32)
    # level b: block[j][h] holds rows j*b .. j*b+b-1 of columns h*(lanes/b) .., lane i being
    # row j*b + i % b of column h*(lanes/b) + i // b
    blocks = [[vecs[r] if r < len(vecs) else undef] for r in range(rows)]
    b = 1
    while b < rows:
        b2, half = 2 * b, lanes // (2 * b)
        merged = []
        for j in range(len(blocks) // 2):
            out = []
            for h in range(b2):
                mask = []
                for i in range(lanes):
                    rr, col = i % b2, h * half + i // b2
                    src = rr // b
                    mask.append(src * lanes + (col % (2 * half)) * b + rr % b)
                out.append(builder.shuffle_vector(blocks[2 * j][h // 2],
                                                  blocks[2 * j + 1][h // 2],
                                                  ir.Constant(ir.VectorType(i32, lanes), mask)))
            merged.append(out)
        blocks, b = merged, b2
    per = lanes // rows  # columns a vector of the last level holds
    return [builder.shuffle_vector(blocks[0][q // per], undef, ir.Constant(
        ir.VectorType(i32, rows), [q % per * rows + r for r in range(rows)]))
        for q in range(lanes)]


def _store_transposed(context, builder, tile, cptr, rptr, has_res, c0, ldq, rows, cols, lo,
                      hi):
    """The epilogue of a transposed tile (``tile[r][v]``: its sums, bias added, of row ``r``
    (an output pixel) and vector ``v`` of columns (output channels)): column ``q`` (of
    ``cols``) to ``c[c0 + q*ldq + r]`` for ``r < rows``, plus the residual at the same place
    of ``rptr`` where ``has_res``, clamped to ``lo``, ``hi`` (splat vectors): the tile's
    columns transposed in registers into contiguous rows of :data:`_TRANS_ROWS` values, each
    stored (and its residual loaded) under the mask of the tile's rows. (Stored by scatters
    and the residual read by gathers, the tiles took 5-18 % longer: one thread, batch 4, ms,
    ResNet-50's 256 -> 1024 at 14x14 with its residual 2.20 -> 1.86, 512 -> 2048 at 7x7 1.90
    -> 1.80, 1024 -> 256 at 14x14 1.85 -> 1.76.)"""
    vty = tile[0][0].type
    lanes = vty.count
    fty = vty.element
    i64, i32 = ir.IntType(64), ir.IntType(32)
    rty = ir.VectorType(fty, _TRANS_ROWS)
    mload, mstore = _masked(builder, rty, "load"), _masked(builder, rty, "store")
    m32 = ir.VectorType(i32, _TRANS_ROWS)
    in_rows = builder.icmp_signed("<", ir.Constant(m32, list(range(_TRANS_ROWS))),
                                  _splat(builder, m32, builder.trunc(rows, i32)))
    none = ir.Constant(ir.VectorType(ir.IntType(1), _TRANS_ROWS), [0] * _TRANS_ROWS)
    full = builder.icmp_signed(">=", rows, ir.Constant(i64, _TRANS_ROWS))  # (every row)
    zero = ir.Constant(rty, [ir.Constant(fty, 0.0)] * _TRANS_ROWS)
    lo8, hi8 = (builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(
        m32, list(range(_TRANS_ROWS)))) for v in (lo, hi))
    align = ir.Constant(i32, context.get_abi_sizeof(fty))
    for v in range(len(tile[0])):
        columns = _transposed(builder, [tile[r][v] for r in range(len(tile))], _TRANS_ROWS)
        for q, x in enumerate(columns):
            col = v * lanes + q
            mask = builder.select(builder.icmp_signed("<", ir.Constant(i64, col), cols),
                                  in_rows, none)
            at = builder.add(c0, builder.mul(ldq, ir.Constant(i64, col)))
            rp = builder.bitcast(builder.gep(rptr, [at]), rty.as_pointer())
            whole = builder.and_(builder.icmp_signed("<", ir.Constant(i64, col), cols), full)
            rv = _edge_load(builder, mload, rp, align, builder.select(has_res, mask, none),
                            builder.and_(whole, has_res), zero)
            x = _clamp(builder, has_res, x, rv, lo8, hi8)
            cp = builder.bitcast(builder.gep(cptr, [at]), rty.as_pointer())
            _store(builder, mstore, x, cp, align, mask, whole)


#: the panel's rows ahead of the sum that each step prefetches: weights read from beyond the
#: L2 cache (a model's are, one product after another); measured on the 36 products of a
#: BERT-like encoder run back to back (6 layers of d 256, ffn 1024, 128 rows; load 7-9):
#: 9.9-10.2 ms without, 8.9-9.1 (4 rows), 8.9-9.0 (8), 8.8-9.2 (16); 2048 rows: 133 / 122 /
#: 120 / 123 ms
PREFETCH_ROWS = 8
_micro = _micro_kernel(MR, NV, PREFETCH_ROWS)


@intrinsic
def _panel_row(typingctx, src, s0, step, w, scale, dst, d0):
    """``dst[d0 + q] = scale * src[s0 + q * step]`` for ``q < w``, ``0`` for ``w <= q < NR``
    (one row of a panel: ``NV`` vectors stored whole, the values loaded under a mask, gathered
    where ``step`` is not 1). Offsets the caller's to keep in bounds."""
    if not all(isinstance(x, types.Array) and x.ndim == 1 for x in (src, dst)) or \
            src.dtype != dst.dtype or src.dtype not in (types.float32, types.float64):
        return None
    sig = types.void(src, s0, step, w, scale, dst, d0)

    def codegen(context, builder, signature, args):
        at = signature.args
        et = at[0].dtype
        sptr = context.make_array(at[0])(context, builder, args[0]).data
        dptr = context.make_array(at[5])(context, builder, args[5]).data
        s0v, stepv, wv, d0v = (_offset(context, builder, at[i], args[i]) for i in (1, 2, 3, 6))
        sc = context.cast(builder, args[4], at[4], et)
        fty, size, lanes, vty, i64, zero, _ = _vectors(context, builder, et)
        ivty = ir.VectorType(i64, lanes)
        idx = ir.Constant(ivty, list(range(lanes)))
        wvec = _splat(builder, ivty, wv)
        scv = _splat(builder, vty, sc)
        mload = _masked(builder, vty, "load")
        i32 = ir.Constant(ir.IntType(32), size)
        pty = fty.as_pointer()
        gty = ir.VectorType(pty, lanes)
        mty = ir.VectorType(ir.IntType(1), lanes)
        el = "f32" if size == 4 else "f64"
        gather = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [gty, ir.IntType(32), mty, vty]),
            f"llvm.masked.gather.v{lanes}{el}.v{lanes}p0")
        unit = builder.icmp_signed("==", stepv, ir.Constant(i64, 1))
        stepvec = _splat(builder, ivty, stepv)
        for v in range(NV):
            q = builder.add(idx, _splat(builder, ivty, ir.Constant(i64, v * lanes)))
            mask = builder.icmp_signed("<", q, wvec)
            out = cgutils.alloca_once(builder, vty)
            with builder.if_else(unit) as (yes, no):
                with yes:
                    p = builder.gep(sptr, [builder.add(s0v, ir.Constant(i64, v * lanes))])
                    builder.store(builder.call(mload, [builder.bitcast(p, vty.as_pointer()),
                                                       i32, mask, zero]), out)
                with no:
                    offs = builder.add(_splat(builder, ivty, s0v), builder.mul(q, stepvec))
                    addr = builder.add(_splat(builder, ivty, builder.ptrtoint(sptr, i64)),
                                       builder.mul(offs, _splat(builder, ivty,
                                                                ir.Constant(i64, size))))
                    ptrs = builder.inttoptr(addr, gty)
                    builder.store(builder.call(gather, [ptrs, i32, mask, zero]), out)
            p = builder.gep(dptr, [builder.add(d0v, ir.Constant(i64, v * lanes))])
            builder.store(builder.fmul(builder.load(out), scv),
                          builder.bitcast(p, vty.as_pointer()), align=size)
        return context.get_dummy_value()

    return sig, codegen


@jit
def pack_b(b, out):
    """``b`` ([K, N], C-contiguous) into panels: ``out[(j * K + k) * NR + q] = b[k, j * NR +
    q]`` (0 past N); ``out`` holds ``ceil(N / NR) * K * NR`` values."""
    pack_scaled(b, False, 1.0, out)


@jit
def pack_scaled(b, trans, alpha, out):
    """:func:`pack_b` of ``alpha * b`` (``alpha * b.T`` where ``trans``) for a C-contiguous
    2-D ``b``: also an operand packed for one product (attention's keys and values)."""
    K = b.shape[0] if not trans else b.shape[1]
    N = b.shape[1] if not trans else b.shape[0]
    nr = NV * (64 // b.itemsize)
    npan = (N + nr - 1) // nr
    if out.shape[0] != npan * K * nr:
        raise ValueError("pdjit: pack_b: the packed buffer does not fit")
    bf = b.reshape(b.size)
    ld = b.shape[1]
    for j in range(npan):
        n0 = j * nr
        w = min(nr, N - n0)
        for k in range(K):
            if trans:  # column k of b's rows n0 .. n0 + w
                _panel_row(bf, n0 * ld + k, ld, w, alpha, out, (j * K + k) * nr)
            else:
                _panel_row(bf, k * ld + n0, 1, w, alpha, out, (j * K + k) * nr)


@jit
def packed_batches(a, b, tb, alpha, c, i0, i1):
    """``c[i] = a[i] @ (alpha * op(b[i]))`` for ``i0 <= i < i1`` (3-D C-contiguous operands,
    ``op`` transposes where ``tb``): each ``b[i]`` packed (:func:`pack_scaled`) into one
    buffer, then :func:`packed_gemm`. ``alpha`` scales the packed values: a product rounded
    once more than ``alpha * (a @ b)`` where ``alpha`` is not a power of two."""
    K = a.shape[2]
    N = b.shape[1] if tb else b.shape[2]
    bp = np.empty(packed_b_size(K, N, a.itemsize), a.dtype)
    bias = np.empty(0, a.dtype)
    for i in range(i0, i1):
        pack_scaled(b[i], tb, alpha, bp)
        packed_gemm(a[i], bp, N, bias, c[i])


@pjit
def batches_by_team(a, b, tb, alpha, c, parts):
    """:func:`packed_batches` of the whole batch in ``parts`` ranges of products, one per
    thread of a parallel loop (``lib.team``; each product as one thread computes it)."""
    n = c.shape[0]
    for p in numba.prange(parts):
        packed_batches(a, b, tb, alpha, c, p * n // parts, (p + 1) * n // parts)


@jit
def packed_gemm(a, bp, n, bias, c):
    """``c = a @ b + bias`` for ``a`` [M, K] and ``b`` [K, n] packed into ``bp``
    (:func:`pack_b`); ``bias`` [n] or empty; ``c`` [M, n]: all C-contiguous."""
    _packed_rows(a, bp, n, bias, c, 0, a.shape[0], bias[:0], -np.inf, np.inf)


#: one row's tile: ``NV`` accumulators, no reduction across lanes; its panel's rows fetched
#: ahead only with AVX-512 (where the tile sums in one pass: ``tile.PASS_ROWS`` 0). With AVX2
#: each step's 4 prefetches take load slots the panel's 8 loads need: :func:`packed_vector`
#: alone on a 2-vCPU AMD EPYC of the Zen 1 kind, one thread, in a compiled loop, with / without
#: them, us: 384 x 128 2.89-2.97 / 2.68-2.69, 384 x 64 1.50-1.52 / 1.36-1.37, 1024 x 256
#: 16.9-18.3 / 17.6-17.7, 4096 x 1024 (from memory) 962-964 / 830-839
_micro1 = _micro_kernel(1, NV, PREFETCH_ROWS if not PASS_ROWS else 0)
#: the tile of :func:`_packed_rows`, each a share of the next panel fetched into the L2 cache as
#: it sums (a tile spread, :func:`_micro_kernel`), so that the weight streams from memory
#: while the tiles sum rather than by the panel's first tile alone, 8 rows ahead. Measured
#: alone, one thread, batch 1, the weight one of 40 copies (read from memory, as a model's
#: are), by turns, spread / not: ResNet-50's 1x1 layers 7x7 512 -> 2048 0.88x, 2048 -> 512
#: 0.90x, 14x14 256 -> 1024 and 1024 -> 256 0.98x
_micro_spread = _micro_kernel(MR, NV, PREFETCH_ROWS, spread=True)
#: the rows of the last tile of a block that :data:`_micro_tail` sums: a tile of fewer rows
#: than ``MR`` cost what a whole one does (its rows past the last computed again, unstored)
TAIL_ROWS = 4
#: the tile of :func:`_packed_rows` for a block's last ``TAIL_ROWS`` rows or fewer (spread as
#: the whole one): ``TAIL_ROWS / MR`` of its multiply-adds. Measured alone (AMD EPYC Zen 4,
#: one thread, float32, 256 x 1024 packed, us, whole tiles / this): 16 rows (a recurrent
#: step at batch 16) 83 / 74, 13 rows 83 / 74
_micro_tail = _micro_kernel(TAIL_ROWS, NV, PREFETCH_ROWS, spread=True)


@register_jitable
def spread_share(t, tiles, lines, here, ahead, lanes):
    """``(pfb, pfl)`` of a spread tile (:func:`_micro_kernel`): tile ``t`` of the ``tiles``
    that read a chunk (or panel) starting at ``bp[here]``, the ``lines`` lines of the next
    one starting at ``bp[ahead]`` fetched by the tiles after the first, an even share each
    (the first, and any past the lines: none)."""
    share = -(-lines // max(1, tiles - 1))
    if t >= 1 and (t - 1) * share < lines:
        return ahead + (t - 1) * share * lanes, min(share, lines - (t - 1) * share)
    return here, 0


#: the tile with a gate after its clamp (:func:`_packed_rows`; spread as the plain one)
_micro_gated = _micro_kernel(MR, NV, PREFETCH_ROWS, gate=True, spread=True)


@jit
def packed_vector(a, bp, n, bias, c):
    """``c[:n] = a @ b + bias`` for one row ``a`` ([K]; ``b`` [K, n] packed into ``bp``,
    :func:`pack_b`; ``bias`` [n] or empty): panel by panel, a vector of columns per
    accumulator, each weight read once. A recurrent step's ``W_hh h`` for one sequence, on
    ``W_hh`` packed transposed (float32, one core: 384 x 128 in 1.5 us against 2.3 by rows of
    ``W_hh`` side by side, ``rnn._gemv_kernel``; 1024 x 256 9.0 against 11.7)."""
    K = a.shape[0]
    nr = NV * (64 // a.itemsize)
    if bp.shape[0] != packed_b_size(K, n, a.itemsize) or c.shape[0] < n or \
            (bias.shape[0] != 0 and bias.shape[0] != n):
        raise ValueError("pdjit: packed_vector: the operands do not fit")
    for j in range((n + nr - 1) // nr):
        n0 = j * nr
        _micro1(a, 0, K, 1, K, bp, j * K * nr, c, n0, n, min(nr, n - n0), bias, n0, c[:0],
                -np.inf, np.inf)


#: the most bytes of the left operand's rows that :func:`_packed_rows` keeps in the L2 cache
#: as one block under every panel (more: blocks of 256 KiB). Measured alone, one thread,
#: against blocks of 256 KiB (the cache flushed / hot): ResNet-50's 1x1 layers channels-last
#: at batch 1, 7x7 2048 -> 512 0.86x / 0.93x, 14x14 1024 -> 512 0.95x / 0.97x, 1024 -> 256
#: 0.96x / 0.98-0.99x; 28x28 512 -> 256 (1.6 MB of rows) 1.04x / 1.02x with 512 KiB or more
ROWS_WHOLE_BYTES = 1 << 20
#: a panel of more than ``PANEL_WHOLE_BYTES`` (a sum of more than 1024 rows, float32) is read
#: by chunks of ``PANEL_CHUNK_BYTES`` of its rows that every tile of a block of rows sums in
#: turn before the next chunk (the sums so far read back from ``c``), rather than whole by
#: each tile from beyond the L2 cache. Measured on a 2-vCPU AMD EPYC (Zen 3, AVX2, 512 KiB of
#: L2), one thread, GFLOP/s, whole / by chunks of 32 KiB: 196 x 2304 x 256 59, 48, 45 / 66,
#: 64, 67; ResNet-50's 7x7 2048 -> 512 1x1 channels-last 1.97, 2.11, 1.54, 1.86 / 1.44,
#: 1.45, 1.43 ms; but by chunks a sum of 256 rows lost (2048 x 256 x 256 76, 69, 72 / 61, 64,
#: 63) and one of 1024 neither lost nor won
PANEL_WHOLE_BYTES = 1 << 18
PANEL_CHUNK_BYTES = 1 << 15
#: whole panels of up to ``GROUP_BYTES`` in all are summed by each tile in turn, a tile's rows
#: of ``c`` stored whole (in order, a line after the other) rather than each panel by every
#: tile of the block before the next (each row a panel's width at a time, ``c`` crossed once a
#: panel: where ``c`` outgrew the L2 cache, its lines came back from memory partly written).
#: Measured on a 2-vCPU Sapphire Rapids class Xeon (2 MiB of L2), one thread, ResNet-50's 1x1
#: layers channels-last at batch 1 alone, by turns in one process, ms, a panel at a time /
#: groups: 56x56 64 -> 256 (3.2 MB out) 0.74 / 0.64-0.66, 28x28 128 -> 512 0.59 / 0.56-0.58,
#: 14x14 256 -> 1024 0.57-0.59 / 0.56; all the panels as one group: 7x7 512 -> 2048 (4 MiB of
#: filter, read again by each tile) 0.59 / 1.28; in the model (per layer, one thread) the
#: four 56x56 64 -> 256 layers 0.75-0.84 / 0.62-0.67 ms; against ONNX Runtime's NCHWc
#: kernel in one process (a chain of six), 56x56 1.19x -> 1.07x its time
GROUP_BYTES = 1 << 18
#: panels go by groups only where a block of rows of ``c`` is larger than this (else one at a
#: time, the next fetched while the tiles sum this one): grouped, MobileNetV2's 1x1 layers at
#: batch 1 (14x14 and 7x7 planes, 0.3 MB out or less, each filter read from memory) took ~4 %
#: more in all (the model 5.1-5.4 -> 5.5-5.7 ms, one thread, by turns)
GROUP_MIN_OUT_BYTES = 1 << 20


@register_jitable
def chunk_epilogue(k0, last, bias, res, c, lo, hi):
    """``(bias, res, lo, hi)`` of a tile's sum over the chunk of rows from ``k0`` of a sum
    taken by chunks, its output flat in ``c``: the residual with the first chunk, the sums so
    far (``c``) with the others; the bias and the clamp with the last (a gate too)."""
    bs = bias if last else bias[:0]
    rs = res if k0 == 0 else c
    if last:
        return bs, rs, lo, hi
    return bs, rs, -np.inf, np.inf


@jit
def _packed_rows(a, bp, n, bias, c, r0, r1, res, lo, hi, gate=None, p0=0, p1=-1):
    """Rows ``r0 .. r1`` of ``c = gate(minimum(maximum(a @ b + bias + res, lo), hi))`` (``b``
    packed into ``bp``; ``bias`` [n] or empty, ``res`` c's shape flat, or empty; ``gate`` as
    :func:`.tile.gate_of`'s, empty or None: none): a part of :func:`packed_gemm` for one thread, or
    with the epilogue of :func:`weight_rows`; their columns of ``b``'s panels ``p0 .. p1``
    alone (-1: to the last)."""
    M, K = a.shape
    nr = NV * (64 // a.itemsize)
    npan = (n + nr - 1) // nr
    p1 = npan if p1 < 0 else min(p1, npan)
    if bp.shape[0] != npan * K * nr or c.shape[0] != M or c.shape[1] != n or \
            (bias.shape[0] != 0 and bias.shape[0] != n) or r0 < 0 or r1 > M or \
            (res.shape[0] != 0 and res.shape[0] != M * n):
        raise ValueError("pdjit: packed_gemm: the operands do not fit")
    af = a.reshape(a.size)
    cf = c.reshape(c.size)
    # a block of rows of a kept in L2 while every panel passes over it: all of them where
    # they fit ROWS_WHOLE_BYTES (each panel then read from memory once), else 256 KiB
    if (r1 - r0) * K * a.itemsize <= ROWS_WHOLE_BYTES:
        mc = max(MR, r1 - r0)
    else:
        mc = max(MR, (262144 // max(1, K * a.itemsize)) // MR * MR)
    lanes = 64 // a.itemsize
    kc = K if K * nr * a.itemsize <= PANEL_WHOLE_BYTES else \
        max(1, PANEL_CHUNK_BYTES // (nr * a.itemsize))
    # whole panels are taken by groups of GROUP_BYTES, each tile summing every panel of a
    # group in turn (its rows of c stored whole, in order); chunked ones one at a time
    g = max(1, GROUP_BYTES // (K * nr * a.itemsize)) if kc == K and \
        min(mc, r1 - r0) * n * a.itemsize > GROUP_MIN_OUT_BYTES else 1
    for i0 in range(r0, r1, mc):
        i1 = min(r1, i0 + mc)
        tiles = (i1 - i0 + MR - 1) // MR
        for j0 in range(p0, p1, g):
            j1 = min(p1, j0 + g)
            for k0 in range(0, K, kc):
                k1 = min(K, k0 + kc)
                last = k1 == K
                bs, rs, lo_, hi_ = chunk_epilogue(k0, last, bias, res, cf, lo, hi)
                # the group's (or chunk's) successor fetched by the calls after the first
                nxt = j1 * K * nr if last else (j0 * K + k1) * nr
                ahead = 0 if last and j1 == p1 else (k1 - k0) * NV * (j1 - j0)
                for i in range(i0, i1, MR):
                    for j in range(j0, j1):
                        n0 = j * nr
                        b0 = (j * K + k0) * nr
                        pfb, pfl = spread_share((i - i0) // MR * (j1 - j0) + j - j0,
                                                tiles * (j1 - j0), ahead, b0, nxt, lanes)
                        if gate is None and i1 - i <= TAIL_ROWS:  # (pruned as below)
                            _micro_tail(af, i * K + k0, K, i1 - i, k1 - k0, bp, b0, cf,
                                        i * n + n0, n, min(nr, n - n0), bs, n0, rs, lo_, hi_,
                                        pfb, pfl)
                        elif gate is None:  # (pruned where compiled for no gate)
                            _micro_spread(af, i * K + k0, K, min(MR, i1 - i), k1 - k0, bp, b0,
                                          cf, i * n + n0, n, min(nr, n - n0), bs, n0, rs, lo_,
                                          hi_, pfb, pfl)
                        else:
                            _micro_gated(af, i * K + k0, K, min(MR, i1 - i), k1 - k0, bp, b0,
                                         cf, i * n + n0, n, min(nr, n - n0), bs, n0, rs, lo_,
                                         hi_, gate if last else gate[:0], pfb, pfl)


def run_chunks(fn, n, parts, chunks, *args):
    """``fn(*args, n0, n1)`` over ``chunks`` ranges of ``0..n``, taken in turn by ``parts``
    threads (this one among them) as each finishes its last: a thread the OS leaves waiting
    (another process on its core) takes fewer, where a fixed split would wait for its share."""
    ranges = iter([(k * n // chunks, (k + 1) * n // chunks) for k in range(chunks)])

    def work():
        for n0, n1 in ranges:  # the iterator is shared: each range goes to one thread
            fn(*args, n0, n1)

    threads.run_parts(work, [()] * parts, parts - 1)  # (helpers kept off this core)


# ---- weights packed once -------------------------------------------------------------------
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_EMPTY = {t: np.empty(0, t) for t in _FLOATS}  # dtype -> an empty bias


def _pack(w, trans: bool):
    b = np.ascontiguousarray(w)
    K, N = b.shape[::-1] if trans else b.shape
    bp = np.empty(packed_b_size(K, N, b.itemsize), b.dtype)
    pack_scaled(b, trans, 1.0, bp)
    return bp


def packed_weight(w, trans: bool = False, rows: int = PACKED_MIN_ROWS):
    """``w`` ([K, N]; ``w.T`` where ``trans``) packed into panels (:func:`pack_b`) for a
    product of ``rows`` rows: made at the first ask and kept beside the array
    (:func:`pdjit.codegen.params.derived`: until the array goes or a run may write it); an
    empty array for fewer than ``PACKED_MIN_ROWS`` rows (such products run by BLAS)."""
    if rows < PACKED_MIN_ROWS:
        return np.empty(0, w.dtype)
    return params.derived(w, ("packed", bool(trans)), lambda: _pack(w, trans))


replay.declare("derived", packed_weight)


@overload(packed_weight)
def _packed_weight_native(w, trans=False, rows=PACKED_MIN_ROWS):
    """In compiled code: ``w`` packed at each call (for ``PACKED_MIN_ROWS`` rows or more; a
    native driver the plan builds once its step is hot takes it from the host instead:
    ``LowerContext.derived``)."""
    def impl(w, trans=False, rows=PACKED_MIN_ROWS):
        if rows < PACKED_MIN_ROWS:
            return np.empty(0, w.dtype)
        k = w.shape[1] if trans else w.shape[0]
        n = w.shape[0] if trans else w.shape[1]
        bp = np.empty(packed_b_size(k, n, w.itemsize), w.dtype)
        pack_scaled(w, trans, 1.0, bp)
        return bp
    return impl


@by_address
@jit
def _weight_rows(x, w, trans, bp, n0, n1, out, r, bias, res, lo, hi):
    """Rows ``n0 * r .. n1 * r`` (samples ``n0 .. n1`` of ``r`` rows each) of
    ``out = minimum(maximum(x @ w + bias + res, lo), hi)`` (``w.T`` where ``trans``), ``w``
    packed into ``bp`` (:func:`packed_weight`), ``bias`` [out's columns] or empty, ``res``
    out's shape flat or empty: a product by a weight with its epilogue, by blocks of samples
    (``Opaque.blocked``). Fewer than ``PACKED_MIN_ROWS`` rows: one BLAS call, then the
    epilogue."""
    _weight_row_range(x, w, trans, bp, n0 * r, n1 * r, out, bias, res, lo, hi)


@jit
def _weight_row_range(x, w, trans, bp, lo_, hi_, out, bias, res, lo, hi):
    """Rows ``lo_ .. hi_`` of :func:`weight_rows`."""
    n = out.shape[1]
    if x.shape[0] != out.shape[0] or x.shape[1] != (w.shape[1] if trans else w.shape[0]) or \
            n != (w.shape[0] if trans else w.shape[1]) or lo_ < 0 or hi_ > x.shape[0]:
        raise ValueError("pdjit: matrix product operands do not fit each other")
    if hi_ - lo_ >= PACKED_MIN_ROWS:
        _packed_rows(x, bp, n, bias, out, lo_, hi_, res, lo, hi)
        return
    if hi_ <= lo_:
        return
    # (a residual in out's own buffer: its rows read before the product writes over them)
    rs, r0 = res, 0
    if res.shape[0] != 0 and may_share(res, out):
        rs, r0 = res[lo_ * n:hi_ * n].copy(), lo_ * n
    if trans:
        blas_gemm(x[lo_:hi_], w.T, out[lo_:hi_])
    else:
        blas_gemm(x[lo_:hi_], w, out[lo_:hi_])
    t = out.dtype.type
    tlo, thi = t(lo), t(hi)
    for i in range(lo_, hi_):
        for j in range(n):
            v = out[i, j]
            if bias.shape[0] != 0:
                v = v + bias[j]
            if res.shape[0] != 0:
                v = v + rs[i * n + j - r0]
            v = v if v >= tlo or v != v else tlo
            out[i, j] = v if v <= thi or v != v else thi


def weight_rows(x, w, trans, bp, n0, n1, out, r, bias, res, lo, hi):
    """:func:`_weight_rows` (see there); a call over every row of one sample (a host driver's
    whole batch of one, which ``split_work`` cannot split by samples) of ``SPLIT_MIN_WORK``
    multiply-adds or more is split by blocks of rows over the loop threads where
    :func:`split_threads` gives it more than one: by a parallel loop (:func:`_row_parts`,
    ``lib.team``) where it is ready, else on ``run_parts``' helpers. One thread / two by
    the helpers / two by the loop, ms (2-vCPU machine, float32): 128x256x1024 0.37 / 0.31 /
    0.19, 128x256x256 0.093 / 0.105 / 0.051."""
    rows = (n1 - n0) * r
    if n1 - n0 == 1 and rows == x.shape[0] and rows >= max(2 * MR, PACKED_MIN_ROWS):
        nt = split_threads(rows * x.shape[1] * out.shape[1])
        if nt > 1 and _split_rows(x, bp, out, bias, res, lo, hi, min(nt, -(-rows // MR))):
            return
    replay.kernel_call(_weight_rows, x, w, trans, bp, n0, n1, out, r, bias, res, lo, hi)


replay.declare("leaves", weight_rows)


def _split_batch(parts, x, w, trans, bp, out, r, bias, res, lo, hi) -> bool:
    """``conv.split_work``'s split of :func:`weight_rows` over a batch (the arguments without
    the sample range): every row of the batch as one product in ``parts`` ranges of blocks of
    ``MR`` rows (:func:`_split_rows`: by a parallel loop where it is ready), rather than ranges
    of samples on ``run_parts``' helpers, whose threads and the parallel loops' (polling for
    their next loop) took turns on the second core. The same bits as one thread's call.
    Measured: a BERT-like encoder at batch 16 on two threads, 169 -> 137 ms in
    ``bench_models.py`` (ONNX Runtime 124-140; one thread 242-244)."""
    rows = x.shape[0]
    if out.shape[0] != rows or rows < max(2 * MR, PACKED_MIN_ROWS) or bp.size == 0:
        return False
    if not _split_rows(x, bp, out, bias, res, lo, hi, min(parts, -(-rows // MR))):
        replay.kernel_call(_weight_rows, x, w, trans, bp, 0, rows // r, out, r, bias, res, lo,
                           hi)
    return True


def split_threads(work: int) -> int:
    """Threads for a product on the packed GEMM of ``work`` multiply-adds, split by blocks of
    rows (:func:`_split_rows`): the loop threads from ``SPLIT_MIN_WORK``, whether or not a
    thread count was asked for (a parallel loop's split costs a few microseconds and no BLAS
    threads fight; ``threads.gemm_threads``' threshold is NumPy's threaded BLAS's: with it,
    a BERT-like encoder's 128 x 256 x 256 products at batch 1 ran on one thread unless a
    thread count was asked for)."""
    return threads.loop_threads() if work >= SPLIT_MIN_WORK else 1


def _split_rows(x, bp, out, bias, res, lo, hi, parts) -> bool:
    """``out = clamp(x @ b + bias + res, lo, hi)`` (``b`` packed into ``bp``, every row of
    ``x``) in ``parts`` ranges of blocks of ``MR`` rows: by a parallel loop
    (:func:`_row_parts`) where it is ready, else on ``run_parts``' helpers where
    ``threads.gemm_threads`` splits a product of its size (below it the helpers' hand-overs
    cost more than they save), each part on the packed kernel whatever its rows: the same bits
    as one thread's call. Whether it split (else nothing is computed).

    Not by ranges of ``b``'s panels (each part its share of the weight, all of ``x``): on a
    2-vCPU AMD EPYC (Zen 3) two threads took 0.69-0.83 ms that way for 128x256x1024 against
    0.48-0.61 by rows (one thread 0.97-1.06), and a BERT-like encoder at batch 1, by turns,
    15.3-18.6 ms against 10.8-13.4 in one hour, alike in another (10.3-10.6, 10.3-12.2); on
    an Intel Xeon panels were 1-2.5 % faster."""
    call = (x, bp, out, bias, res, float(lo), float(hi), parts)
    if team.run(_row_parts, call):
        return True
    if threads.gemm_threads(x.shape[0] * x.shape[1] * out.shape[1]) < 2:
        return False
    blocks = -(-x.shape[0] // MR)
    run_chunks(_row_blocks, blocks, parts, min(blocks, 4 * parts), *call[:7])
    return True


def _row_blocks(x, bp, out, bias, res, lo, hi, b0, b1):
    """Blocks ``b0 .. b1`` of ``MR`` rows of :func:`_split_rows` (one helper's part). Every
    argument passed: a call from Python that leaves a default out is typed again at each call
    (Numba's dispatcher finds its compiled code only for the arguments given: ~60-100 us and
    the GIL held, against ~1 us)."""
    _packed_rows(x, bp, out.shape[1], bias, out, b0 * MR, min(x.shape[0], b1 * MR), res, lo,
                 hi, None, 0, -1)


@pjit
def _row_parts(x, bp, out, bias, res, lo, hi, parts):
    """:func:`weight_rows` of a whole sample split into ``parts`` ranges of blocks of ``MR``
    rows, one per thread of a parallel loop (``lib.team``: native threads, no GIL; each part
    on the packed kernel whatever its rows, the same bits as one thread's call)."""
    m, n = x.shape[0], out.shape[1]
    blocks = (m + MR - 1) // MR
    for p in numba.prange(parts):
        r0 = (p * blocks // parts) * MR
        r1 = min(m, ((p + 1) * blocks // parts) * MR)
        _packed_rows(x, bp, n, bias, out, r0, r1, res, lo, hi)


@overload(weight_rows)
def _weight_rows_native(x, w, trans, bp, n0, n1, out, r, bias, res, lo, hi):
    def impl(x, w, trans, bp, n0, n1, out, r, bias, res, lo, hi):
        _weight_rows(x, w, trans, bp, n0, n1, out, r, bias, res, lo, hi)
    return impl


def weight_split_work(x, w) -> int:
    """The work (multiply-adds) by which a host driver splits :func:`weight_rows` over the
    loop threads: the product's own when :func:`split_threads` gives it more than one thread,
    else 0 (one thread)."""
    work = x.shape[0] * w.size
    return work if split_threads(work) > 1 else 0


replay.declare("pure", weight_split_work)


def weight_gemm(a, w, trans=False):
    """``a @ w`` (``a @ w.T`` where ``trans``) for a weight ``w`` (a 2-D parameter no op of the
    program writes) and a C-contiguous matrix ``a`` of ``PACKED_MIN_ROWS`` rows or more: on
    ``w`` packed once (:func:`packed_weight`), its rows split over the loop threads where
    :func:`split_threads` gives it more than one; other operands as
    :func:`pdjit.codegen.cpu.rt.gemm` computes them."""
    wt = w.T if trans else w
    if a.dtype != w.dtype or a.dtype not in _FLOATS or a.ndim != 2 or w.ndim != 2 or \
            not a.flags.c_contiguous or a.shape[1] != wt.shape[0] or \
            type(w) is not np.ndarray or a.shape[0] < PACKED_MIN_ROWS:
        return rt.gemm(a, wt)
    m, n = a.shape[0], wt.shape[1]
    nt = split_threads(m * a.shape[1] * n)
    c = np.empty((m, n), a.dtype)
    bias = _EMPTY[a.dtype]
    bp = packed_weight(w, trans)
    if not (nt > 1 and m >= 2 * MR and
            _split_rows(a, bp, c, bias, bias, -np.inf, np.inf, min(nt, m // MR))):
        packed_gemm(a, bp, n, bias, c)
    return c


@overload(weight_gemm)
def _weight_gemm_native(a, w, trans=False):
    """In compiled code (a native driver, an ahead-of-time artifact): the same products as
    the host's, ``w`` packed at each call (as BLAS packs its operands at each call)."""
    floats = (types.float32, types.float64)
    if isinstance(a, types.Array) and isinstance(w, types.Array) and a.layout == "C" and \
            w.layout == "C" and a.dtype == w.dtype and a.dtype in floats and \
            a.ndim == 2 and w.ndim == 2:
        def impl(a, w, trans=False):
            m, k = a.shape
            n = w.shape[0] if trans else w.shape[1]
            if m < PACKED_MIN_ROWS or k != (w.shape[1] if trans else w.shape[0]):
                return np.dot(a, w.T) if trans else np.dot(a, w)
            bp = np.empty(packed_b_size(k, n, a.itemsize), a.dtype)
            pack_scaled(w, trans, 1.0, bp)
            c = np.empty((m, n), a.dtype)
            packed_gemm(a, bp, n, np.empty(0, a.dtype), c)
            return c
        return impl

    def blas(a, w, trans=False):
        return np.dot(a, w.T) if trans else np.dot(a, w)
    return blas


# ---- pointwise (1x1) convolutions: the weight packed, the image read in place ----------------
#: the tile of :func:`pointwise_rows`: ``MR`` output channels by ``NV`` vectors of pixels
_conv_micro = _micro_kernel(MR, NV, 0, conv=True)
#: ... and the narrower tile of a block's last columns where they fill one vector (a 28x28
#: plane: 12 panels of 64 pixels and one of 16, which the full tile computed as a whole
#: panel; a tile of two vectors as well, for tails of 17-32 pixels, gained 1-4 % alone on
#: 27x27 and 55x55 planes: not kept)
_conv_micro1 = _micro_kernel(MR, 1, 0, conv=True)
#: ... and the last tile of output channels where it holds ``TAIL_ROWS`` rows or fewer (16
#: channels: tiles of 6, 6 and 4), on its block of ``MR`` rows a step (the rows past ``M``
#: zero): ``TAIL_ROWS / MR`` of a whole tile's multiply-adds. Measured alone (AMD EPYC Zen 4,
#: one thread, batch 1, bias + relu, us, whole tiles / this, processes by turns): 55x55 64 ->
#: 16 67 / 62, 128 -> 16 130 / 119, 112x112 32 -> 16 143 / 134, 27x27 256 -> 32 131 / 125
_conv_micro_tail = _micro_kernel(TAIL_ROWS, NV, 0, conv=True, astep=MR)
#: ... and the first tile of a block, which stores the panels it reads for the tiles after it
#: and fetches the next panel's rows into L2 as it reads each row (the image's rows lie a
#: plane apart, one page each: no hardware prefetcher follows them). Measured alone, batch 1,
#: one thread, a 2-vCPU Intel Xeon, against ONNX Runtime's node by turns, without / with:
#: 56x56 256 -> 64 1.36-1.46x / 1.27-1.37x, 256 -> 128 1.33-1.34x / 1.27x, 28x28 512 -> 128
#: 1.08x / 1.07x; fetched by every tile of an unpacked block's first row (64 input
#: channels): 56x56 64 -> 256 1.51x / 1.47x, 64 -> 64 1.54x / 1.57x, not kept
_copy_micro = _micro_kernel(MR, NV, 1, conv=True, copy=True)
#: the bytes of the image's columns :func:`pointwise_rows` sweeps under every tile of output
#: channels before the next block of pixels (the L2 cache's share of the image: half of a
#: megabyte; blocks of 256 KiB and 1 MiB measured within noise of it on 56x56 and 28x28
#: planes of 64-512 channels)
_BLOCK_BYTES = 1 << 19


@register_jitable
def packed_rows_size(m: int, k: int) -> int:
    """The values of an ``[m, k]`` matrix packed by :func:`pack_a`."""
    return -(-m // MR) * k * MR


@jit
def pack_a(w, out):
    """``w`` ([M, K], C-contiguous) by blocks of ``MR`` rows, each ``K`` steps of ``MR``
    values: ``out[(i * K + k) * MR + r] = w[i * MR + r, k]`` (0 past ``M``); ``out`` holds
    ``ceil(M / MR) * K * MR`` values (the left operand of :func:`pointwise_rows`)."""
    m_, k_ = w.shape
    if out.shape[0] != (m_ + MR - 1) // MR * k_ * MR:
        raise ValueError("pdjit: pack_a: the packed buffer does not fit")
    pack_rows(w, MR, out)


@jit
def pack_a_of_transpose(a, out):
    """:func:`pack_a` of ``a.T`` (``a`` [K, M], C-contiguous): ``out[(i * K + k) * MR + r] =
    a[k, i * MR + r]`` (0 past ``M``), each row of ``a`` read once, a block's ``MR`` values
    at a time (a product's left operand that is the transpose of an array: a weight's
    gradient ``dY^T @ X``)."""
    k_, m_ = a.shape
    nb = (m_ + MR - 1) // MR
    if out.shape[0] != nb * k_ * MR:
        raise ValueError("pdjit: pack_a: the packed buffer does not fit")
    af = a.reshape(a.size)
    for i in range(nb):
        m0 = i * MR
        w = min(MR, m_ - m0)
        for k in range(k_):
            base = (i * k_ + k) * MR
            src = k * m_ + m0
            for r in range(w):
                out[base + r] = af[src + r]
            for r in range(w, MR):
                out[base + r] = 0


@register_jitable
def pack_rows(w, step, out):
    """:func:`pack_a` by blocks of ``step`` rows (``out`` sized by the caller): ``out[(i * K
    + k) * step + r] = w[i * step + r, k]``, 0 past ``M``."""
    m_, k_ = w.shape
    for i in range((m_ + step - 1) // step):
        for r in range(step):
            m = i * step + r
            base = i * k_ * step + r
            if m < m_:
                for k in range(k_):
                    out[base + k * step] = w[m, k]
            else:
                for k in range(k_):
                    out[base + k * step] = 0


@register_jitable
def _rows_check(x, ap, y, n0, n1, bias, res, scale, shift) -> None:
    """The operands of :func:`pointwise_rows` (and its prologue's vectors) fit each other."""
    m_, c_ = y.shape[1], x.shape[1]
    nb = (m_ + MR - 1) // MR
    if x.shape[0] != y.shape[0] or x.shape[2] * x.shape[3] != y.shape[2] * y.shape[3] or \
            ap.shape[0] != nb * c_ * MR or (bias.shape[0] != 0 and bias.shape[0] != m_) or \
            (res.shape[0] != 0 and res.shape[0] != y.size) or n0 < 0 or n1 > x.shape[0] or \
            (scale.shape[0] != 0 and scale.shape[0] != c_) or \
            (shift.shape[0] != 0 and shift.shape[0] != c_):
        raise ValueError("pdjit: pointwise convolution operands do not fit")


@register_jitable
def _has_prologue(scale, shift, plo, phi) -> bool:
    """Whether ``scale``, ``shift``, ``plo``, ``phi`` ask for a prologue
    (:func:`pointwise_rows_prologue`): a vector, or a finite bound."""
    return scale.shape[0] != 0 or shift.shape[0] != 0 or plo != -np.inf or phi != np.inf


@register_jitable
def _rows_samples(x, ap, y, n0, n1, bias, lo, hi, res, scale, shift, plo, phi) -> None:
    """The samples ``n0 .. n1`` of :func:`pointwise_rows`, through the prologue of
    :func:`pointwise_rows_prologue` where there is one (every panel packed then)."""
    m_, c_ = y.shape[1], x.shape[1]
    p_ = y.shape[2] * y.shape[3]
    _rows_check(x, ap, y, n0, n1, bias, res, scale, shift)
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    buf = _panels_buffer(xf, c_, m_, p_, _has_prologue(scale, shift, plo, phi))
    for n in range(n0, n1):
        _rows_pixels(xf, ap, yf, n, c_, m_, p_, 0, p_, bias, lo, hi, res, buf, scale, shift,
                     plo, phi)


@by_address
@jit
def pointwise_rows(x, ap, y, n0, n1, bias, lo, hi, res):
    """``y[n] = clamp(W @ x[n] + bias[:, None] + res[n], lo, hi)`` for the samples ``n0 ..
    n1``: a 1x1 stride-1 unpadded convolution of one group (``x`` [N, C, H, W], ``y`` [N, M,
    H, W], C-contiguous) by the filter ``W`` [M, C] packed into ``ap`` (:func:`pack_a`);
    ``bias`` [M] or empty, ``res`` ``y``'s shape flat or empty; ``lo``, ``hi`` the clamp
    (infinite: none), all applied to each tile in registers.

    Each sample's image is the right operand (rows of ``C``, ``H * W`` contiguous pixels: no
    im2col), swept by blocks of pixels whose columns fit :data:`_BLOCK_BYTES` (the whole plane
    where it fits), each block under every tile of ``MR`` output channels in turn while it
    stays in the L2 cache, so that the outputs are written by rows of the block (a panel of
    one tile's pixels under every tile writes to all the rows at once: 1.5-2x slower at batch
    16), except where the tiles are few (:data:`PANEL_MAX_TILES`): there each panel goes
    under every tile while it is in the L1 cache. The first tile of a block reads the image
    in place and stores each panel it loads packed (:func:`_rows_pixels`); the tiles after it
    read the packed panels."""
    none = np.empty(0, x.dtype)
    _rows_samples(x, ap, y, n0, n1, bias, lo, hi, res, none, none, -np.inf, np.inf)


@by_address
@jit
def pointwise_rows_prologue(x, ap, y, n0, n1, bias, lo, hi, res, scale, shift, plo, phi):
    """:func:`pointwise_rows` of the image seen through a per-channel affine and clamp,
    ``clamp(x[n, c] * scale[c] + shift[c], plo, phi)`` (``scale``, ``shift`` [C] or empty:
    none; infinite bounds: no clamp; an inference program's batch norm and relu before a 1x1
    convolution), applied as each panel of the image is packed (:func:`_pack_prologue`): the
    image so transformed is never stored whole."""
    _rows_samples(x, ap, y, n0, n1, bias, lo, hi, res, scale, shift, plo, phi)


#: the most tiles of output channels (``MR`` each) for which :func:`_rows_pixels` takes its
#: pixels a panel at a time, each panel under every tile while it is in the L1 cache, rather
#: than by blocks of :data:`_BLOCK_BYTES` (so few output rows written at once cost nothing).
#: Measured alone, one thread, by turns in processes of their own, us, blocks / panels:
#: MobileNetV2's 112x112 32 -> 16 at batch 1 565, 527 / 468, 476; 56x56 96 -> 24 486, 468 /
#: 449, 457; 144 -> 24 862, 872 / 688, 688; 28x28 144 -> 32 322, 258 / 292, 237; 192 -> 32
#: 441, 393 / 324, 321; at batch 16, ms, 32 -> 16 19.8, 15.4 / 16.3, 13.9, 144 -> 24 16.4,
#: 17.5 / 16.1, 16.3, 192 -> 32 9.8, 7.7 / 7.5, 8.2. With more tiles blocks won or tied (16
#: tiles, 112x112 16 -> 96: 2118, 1905 / 2221, 2202; 56x56 64 -> 64 822, 824 / 1025, 871)
PANEL_MAX_TILES = 6


@register_jitable
def _block_pixels(c_: int, m_: int, itemsize: int) -> int:
    """The pixels of a block of :func:`_rows_pixels` (a multiple of its tile's columns) for
    ``c_`` input and ``m_`` output channels: one panel where the tiles are few
    (:data:`PANEL_MAX_TILES`), else as many as :data:`_BLOCK_BYTES` of the image hold."""
    nr = NV * (64 // itemsize)
    if (m_ + MR - 1) // MR <= PANEL_MAX_TILES:
        return nr
    return max(nr, _BLOCK_BYTES // (c_ * itemsize) // nr * nr)


#: the fewest tiles of output channels (``MR`` each) and input channels for which
#: :func:`_rows_pixels` packs the image's panels: with fewer tiles the first one's stores cost
#: about what the others save (measured alone, one thread, the image just written, packed / in
#: place: MobileNetV2's 112x112 32 -> 16 1.16x at batch 1, 1.04x at batch 4; 56x56 96 -> 24
#: 1.09x, 0.92x; 144 -> 24 0.93x, 1.02x; 28x28 192 -> 32 0.89x, 0.91x); with fewer input
#: channels the panel's rows in place span few pages (in ResNet-50 at batch 1, one thread, by
#: turns in one process: 56x56 64 -> 64 1.45x, 64 -> 256 0.98-1.07x; 28x28 128 -> 512
#: 0.76-1.15x, 0.92x in all; 256 and 512 channels 0.83-0.98x)
PACK_MIN_TILES, PACK_MIN_CHANNELS = 5, 128


@register_jitable
def _panels_buffer(xf, c_: int, m_: int, p_: int, always: bool):
    """Room for one block of :func:`_rows_pixels`' packed panels, 64 bytes of slack to align
    them; empty where the tiles of output channels or the input channels are too few to pay
    for the packing (:data:`PACK_MIN_TILES`, :data:`PACK_MIN_CHANNELS`), unless ``always``
    (a prologue, applied as the panels are packed)."""
    if not always and ((m_ + MR - 1) // MR < PACK_MIN_TILES or c_ < PACK_MIN_CHANNELS):
        return np.empty(0, xf.dtype)
    nr = NV * (64 // xf.itemsize)
    span = min(_block_pixels(c_, m_, xf.itemsize), -(-p_ // nr) * nr)
    return np.empty(span * c_ + 64 // xf.itemsize, xf.dtype)


@register_jitable
def _pack_prologue(xf, x0, p_, cols, c_, buf, pk0, nr, scale, shift, plo, phi):
    """Panel ``x0 ..`` (``cols`` pixels of ``c_`` rows ``p_`` apart) packed into ``buf`` at
    ``pk0`` (rows ``nr`` apart) through the prologue ``clamp(x * scale[c] + shift[c], plo,
    phi)`` of :func:`pointwise_rows_prologue` (a product, then a sum, each rounded, as the
    elementwise ops it replaces compute them; a NaN stays NaN)."""
    ns, nt = scale.shape[0] != 0, shift.shape[0] != 0
    one, zero = xf.dtype.type(1), xf.dtype.type(0)
    lo_, hi_ = xf.dtype.type(plo), xf.dtype.type(phi)
    for k in range(c_):
        a = scale[k] if ns else one
        b = shift[k] if nt else zero
        s0 = _U(x0 + k * p_)  # (unsigned: no wraparound of negative indices, so that the
        d0 = _U(pk0 + k * nr)  # loop vectorises)
        for j in range(_U(cols)):
            v = xf[s0 + j] * a + b
            if v < lo_:
                v = lo_
            if v > hi_:
                v = hi_
            buf[d0 + j] = v


@register_jitable
def _rows_pixels(xf, ap, yf, n, c_, m_, p_, q_lo, q_hi, bias, lo, hi, res, buf, scale, shift,
                 plo, phi):
    """Pixels ``q_lo .. q_hi`` (``q_lo`` a multiple of ``NR``) of sample ``n`` of
    :func:`pointwise_rows` (flat operands): the pixels by blocks whose columns of the image fit
    :data:`_BLOCK_BYTES` (the whole range where it does), every tile of output channels swept
    over one block before the next. The block's first tile reads the image in place (rows
    ``p_`` apart) and stores each panel of ``NR`` pixels it loads into ``buf``
    (:func:`_panels_buffer`; empty: no packing), ``C`` rows of ``NR`` values one after
    another; the tiles after it read those. Measured alone, batch 1, one thread, against every
    tile reading the image in place: ResNet-50's 56x56 256 -> 64 0.80x, 256 -> 128 0.79x, 64
    -> 256 0.82x, 28x28 512 -> 128 0.80x, 512 -> 256 0.77-0.99x, 128 -> 512 0.87-1.0x, 56x56
    64 -> 64 0.87-1.03x (rows of the image far apart: each tile's panel of 64 rows of 256
    bytes spanned as many pages; packed, the rows follow one another); in ResNet-50 these ops
    took 0.94-0.98x their time (one process, both ways by turns), the model 0.967x at batch 1
    and 0.966x at batch 16 on one thread (alternating processes). Each output's sum is the
    whole call's, bit for bit.

    A prologue (``scale``, ``shift`` not both empty or finite ``plo``, ``phi``: see
    :func:`pointwise_rows_prologue`) packs every panel (``buf`` never empty), transformed, by
    :func:`_pack_prologue` before its first tile; every tile then reads the packed panel."""
    nb = (m_ + MR - 1) // MR
    lanes = 64 // xf.itemsize
    nr = NV * lanes
    pb = _block_pixels(c_, m_, xf.itemsize)
    xb, yb = n * c_ * p_, n * m_ * p_
    packed = buf.shape[0] != 0
    pro = _has_prologue(scale, shift, plo, phi)
    sh = (-(buf.ctypes.data // xf.itemsize)) % lanes if packed else 0  # (64-byte aligned)
    for b0 in range(q_lo, q_hi, pb):
        b1 = q_hi if q_hi - b0 < pb else b0 + pb
        for i in range(nb):
            m0 = i * MR
            rows = m_ - m0 if m_ - m0 < MR else MR
            a0 = i * c_ * MR
            for q0 in range(b0, b1, nr):
                cols = b1 - q0 if b1 - q0 < nr else nr
                c0 = yb + m0 * p_ + q0
                pk0 = sh + (q0 - b0) * c_  # (this panel's packed rows)
                if pro and i == 0:
                    _pack_prologue(xf, xb + q0, p_, cols, c_, buf, pk0, nr, scale, shift, plo,
                                   phi)
                elif packed and i == 0:
                    _copy_micro(ap, a0, rows, c_, xf, xb + q0, p_, yf, c0, p_, cols, bias, m0,
                                res, lo, hi, buf, pk0)
                    continue
                # the panel packed by the block's first tile, else the image in place (a last
                # panel of one vector: a narrower tile); each tile at a call site of its own,
                # its operand and row stride fixed there: against one site for both operands
                # (a selected array and stride), measured alone, one thread, batch 1, by turns
                # in one process: ResNet-50's 56x56 64 -> 64 0.74x, 64 -> 256 0.88x, 256 -> 64
                # 0.93x, 256 -> 128 0.96x, 28x28 128 -> 512 0.89x; in the models (their
                # recorded calls on either kernel, by turns) ResNet-50's 17 such layers 0.99x,
                # MobileNetV2 0.94x
                if rows <= TAIL_ROWS and cols > lanes:  # (one call site: the last tile)
                    _conv_micro_tail(ap, a0, rows, c_, buf if packed else xf,
                                     pk0 if packed else xb + q0, nr if packed else p_, yf, c0,
                                     p_, cols, bias, m0, res, lo, hi)
                elif packed:
                    if cols <= lanes:
                        _conv_micro1(ap, a0, rows, c_, buf, pk0, nr, yf, c0, p_, cols, bias, m0,
                                     res, lo, hi)
                    else:
                        _conv_micro(ap, a0, rows, c_, buf, pk0, nr, yf, c0, p_, cols, bias, m0,
                                    res, lo, hi)
                elif cols <= lanes:
                    _conv_micro1(ap, a0, rows, c_, xf, xb + q0, p_, yf, c0, p_, cols, bias, m0,
                                 res, lo, hi)
                else:
                    _conv_micro(ap, a0, rows, c_, xf, xb + q0, p_, yf, c0, p_, cols, bias, m0,
                                res, lo, hi)


@pjit
def rows_by_pixels(x, ap, y, bounds, bias, lo, hi, res):
    """:func:`pointwise_rows` of one sample in the ranges of pixels ``bounds`` (multiples of
    ``NR`` but the end), one per thread of a parallel loop (``lib.team``): each part reads its
    own pixels of the image and the whole packed filter, and writes its pixels of every
    output channel (its panels packed in a buffer of its own); the same bits as one call."""
    c_, m_, p_ = x.shape[1], y.shape[1], y.shape[2] * y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    none = np.empty(0, xf.dtype)
    for p in numba.prange(bounds.shape[0] - 1):
        buf = _panels_buffer(xf, c_, m_, bounds[p + 1] - bounds[p], False)
        _rows_pixels(xf, ap, yf, 0, c_, m_, p_, bounds[p], bounds[p + 1], bias, lo, hi, res,
                     buf, none, none, -np.inf, np.inf)


@pjit
def rows_by_pixels_prologue(x, ap, y, bounds, bias, lo, hi, res, scale, shift, plo, phi):
    """:func:`rows_by_pixels` of :func:`pointwise_rows_prologue`: each part packs its own
    panels through the prologue."""
    c_, m_, p_ = x.shape[1], y.shape[1], y.shape[2] * y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for p in numba.prange(bounds.shape[0] - 1):
        buf = _panels_buffer(xf, c_, m_, bounds[p + 1] - bounds[p], True)
        _rows_pixels(xf, ap, yf, 0, c_, m_, p_, bounds[p], bounds[p + 1], bias, lo, hi, res,
                     buf, scale, shift, plo, phi)


#: the transposed tile (``pointwise.pointwise_cols``, ``conv_cols``): ``MR`` pixels by ``NV``
#: vectors of output channels
_convt_micro = _micro_kernel(MR, NV, PREFETCH_ROWS, trans=True, far=True)


# ---- what a new plan's compile worker compiles ahead (pdjit.codegen.cpu.lib._jit.JOBS) ------
def _pack_job(T):
    return (pack_scaled, ((T, 2), bool, float, (T, 1)))


jobs("packed_weight")(lambda T: [_pack_job(T)])
jobs("weight_gemm")(lambda T: [_pack_job(T),
                               (packed_gemm, ((T, 2), (T, 1), int, (T, 1), (T, 2)))])
jobs("weight_rows")(lambda T: [_pack_job(T), (_weight_rows, (
    (T, 2), (T, 2), bool, (T, 1), int, int, (T, 2), int, (T, 1), (T, 1), float, float))])
# (its split over the team: compiled ahead by warmup only, see lib.team.ready)
jobs("weight_rows (warmup)")(lambda T: [
    (_row_parts, ((T, 2), (T, 1), (T, 2), (T, 1), (T, 1), float, float, int)),
    # (the helpers' split where the team's is not ready: _row_blocks)
    (_packed_rows, ((T, 2), (T, 1), int, (T, 1), (T, 2), int, int, (T, 1), float, float, None,
                    int, int)),
    (batches_by_team, ((T, 3), (T, 3), bool, float, (T, 3), int))])
jobs("batched_gemm")(lambda T: [(packed_batches, ((T, 3), (T, 3), bool, float, (T, 3), int,
                                                  int))])
# compile time (CPU seconds, a cold compile of the signature its job predicts, alone in a
# fresh process, load ~1): the compile worker balances its groups by it
compile_cost(1.5, _weight_rows)  # its packed tile and BLAS tail: 1.51 s
compile_cost(0.2, pack_scaled)  # 0.18 s
compile_cost(0.65, _row_parts, batches_by_team)
