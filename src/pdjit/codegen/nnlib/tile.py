"""A register-blocked micro-kernel for the convolution's taps path (:func:`conv._fwd_range`).

``tile(wf, w0, wk, kk, xs, xb, tap, df, d0, ds, q0)`` computes a block of ``MR`` output rows by
``NV`` vectors of positions (a vector: 64 bytes, 16 float32 or 8 float64):

    df[d0 + r * ds + q0 + q] = sum over k < kk of wf[w0 + r * wk + k] * xs[xb + tap[k] + q0 + q]

for ``r < MR`` and ``q < NV * lanes``. The ``MR * NV`` sums stay in vector registers over all
``kk`` taps and are stored once, where the kernel it replaced (``_rows4``) loaded and stored
its partial sums every four taps; each tap loads ``NV`` vectors of inputs and broadcasts
``MR`` weights. Every output sums its products in tap order, each a fused multiply-add (as
``_rows4`` with its "contract" fast-math flag did: the same values).

Written as LLVM IR (a Numba intrinsic) with explicit vector types: Numba's loop vectoriser
keeps no accumulator of a loop over taps in registers (the sums live in the output array,
which might alias the inputs), and scalar accumulators for the SLP vectoriser to pack took
seconds to compile. The IR has no loop to vectorise, so it compiles in a fraction of the time
``_rows4`` took. The offsets are signed 64-bit element offsets that the caller keeps in bounds
(no checks here: the caller sizes ``xs``, ``df`` and ``tap``).
"""
import llvmlite.ir as ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["tile_kernel", "roll_kernel", "TILE_BYTES"]

#: the width of one vector of the tile, in bytes (an AVX-512 register)
TILE_BYTES = 64


def _offset(context, builder, ty, value):
    """``value`` of Numba type ``ty`` as a 64-bit integer."""
    return context.cast(builder, value, ty, types.int64)


def _vectors(context, builder, dtype):
    """``(element type, its bytes, lanes, vector type, i64, zero vector, llvm.fma of
    vectors)`` for vectors of :data:`TILE_BYTES` of ``dtype``."""
    fty = context.get_value_type(dtype)
    size = context.get_abi_sizeof(fty)
    lanes = TILE_BYTES // size
    vty = ir.VectorType(fty, lanes)
    zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * lanes)
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vty, [vty] * 3),
        f"llvm.fma.v{lanes}{'f32' if size == 4 else 'f64'}")
    return fty, size, lanes, vty, ir.IntType(64), zero, fma


def tile_kernel(mr: int, nv: int):
    """The intrinsic for tiles of ``mr`` rows by ``nv`` vectors (see the module docstring)."""

    @intrinsic
    def tile(typingctx, wf, w0, wk, kk, xs, xb, tap, df, d0, ds, q0):
        if not (isinstance(wf, types.Array) and isinstance(xs, types.Array)
                and isinstance(df, types.Array) and isinstance(tap, types.Array)):
            return None
        if wf.dtype != xs.dtype or wf.dtype != df.dtype or \
                wf.dtype not in (types.float32, types.float64) or \
                not isinstance(tap.dtype, types.Integer):
            return None
        sig = types.void(wf, w0, wk, kk, xs, xb, tap, df, d0, ds, q0)

        def codegen(context, builder, signature, args):
            at = signature.args
            wf_, w0_, wk_, kk_, xs_, xb_, tap_, df_, d0_, ds_, q0_ = args
            wptr = context.make_array(at[0])(context, builder, wf_).data
            xptr = context.make_array(at[4])(context, builder, xs_).data
            tptr = context.make_array(at[6])(context, builder, tap_).data
            dptr = context.make_array(at[7])(context, builder, df_).data
            w0v, wkv, kkv = (_offset(context, builder, at[i], args[i]) for i in (1, 2, 3))
            xbv, d0v, dsv, q0v = (_offset(context, builder, at[i], args[i]) for i in (5, 8, 9, 10))
            fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)
            acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)]
                   for _ in range(mr)]
            mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
            undef = ir.Constant(vty, ir.Undefined)
            xq = builder.add(xbv, q0v)
            with cgutils.for_range(builder, kkv) as loop:
                k = loop.index
                t = builder.load(builder.gep(tptr, [k]))
                base = builder.add(xq, context.cast(builder, t, at[6].dtype, types.int64))
                xv = []
                for v in range(nv):
                    p = builder.gep(xptr, [builder.add(base, ir.Constant(i64, v * lanes))])
                    xv.append(builder.load(builder.bitcast(p, vty.as_pointer()), align=size))
                for r in range(mr):
                    wi = builder.add(builder.add(w0v, builder.mul(wkv, ir.Constant(i64, r))), k)
                    w = builder.load(builder.gep(wptr, [wi]))
                    wb = builder.shuffle_vector(builder.insert_element(undef, w,
                                                                       ir.Constant(i64, 0)),
                                                undef, mask)
                    for v in range(nv):
                        builder.store(builder.call(fma, [wb, xv[v], builder.load(acc[r][v])]),
                                      acc[r][v])
            dq = builder.add(d0v, q0v)
            for r in range(mr):
                row = builder.add(dq, builder.mul(dsv, ir.Constant(i64, r)))
                for v in range(nv):
                    p = builder.gep(dptr, [builder.add(row, ir.Constant(i64, v * lanes))])
                    builder.store(builder.load(acc[r][v]), builder.bitcast(p, vty.as_pointer()),
                                  align=size)
            return context.get_dummy_value()

        return sig, codegen

    return tile


def roll_kernel(kh: int, kw: int):
    """A depthwise filter of ``kh x kw`` taps down a column of one vector of positions:

        df[d0 + o * os + q] = sum over i < kh, j < kw of
                              wf[w0 + i * kw + j] * xs[b0 + j * cs + (o + i) * rs + q]

    for output rows ``o < no`` and ``q`` one vector's lanes. Each input row's ``kw`` vectors
    are loaded once and serve the ``kh`` output rows that read them (the sums of those rows
    stay in registers, rolled down a row per step), where a loop over the outputs loads every
    input ``kh`` times. Each output sums its products in tap order (row by row), the first a
    product, the rest fused multiply-adds. Offsets are signed 64-bit element offsets that the
    caller keeps in bounds (``no + kh - 1`` input rows are read)."""

    @intrinsic
    def roll(typingctx, wf, w0, xs, b0, cs, rs, no, df, d0, os_):
        if not (isinstance(wf, types.Array) and isinstance(xs, types.Array)
                and isinstance(df, types.Array)):
            return None
        if wf.dtype != xs.dtype or wf.dtype != df.dtype or \
                wf.dtype not in (types.float32, types.float64):
            return None
        if not all(isinstance(t, types.Integer) for t in (w0, b0, cs, rs, no, d0, os_)):
            return None
        sig = types.void(wf, w0, xs, b0, cs, rs, no, df, d0, os_)

        def codegen(context, builder, signature, args):
            at = signature.args
            wptr = context.make_array(at[0])(context, builder, args[0]).data
            xptr = context.make_array(at[2])(context, builder, args[2]).data
            dptr = context.make_array(at[7])(context, builder, args[7]).data
            w0v, b0v, csv, rsv, nov, d0v, osv = (_offset(context, builder, at[i], args[i])
                                                 for i in (1, 3, 4, 5, 6, 8, 9))
            fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)
            mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
            undef = ir.Constant(vty, ir.Undefined)
            wb = []
            for t in range(kh * kw):
                w = builder.load(builder.gep(wptr, [builder.add(w0v, ir.Constant(i64, t))]))
                wb.append(builder.shuffle_vector(
                    builder.insert_element(undef, w, ir.Constant(i64, 0)), undef, mask))
            # acc[i]: the sums of the output row that reads the current input row as its
            # row i (rows 0..i-1 summed)
            acc = [cgutils.alloca_once_value(builder, zero) for _ in range(kh)]
            rows = builder.add(nov, ir.Constant(i64, kh - 1))
            with cgutils.for_range(builder, rows) as loop:
                r = loop.index
                base = builder.add(b0v, builder.mul(r, rsv))
                xv = []
                for j in range(kw):
                    p = builder.gep(xptr, [builder.add(base, builder.mul(csv,
                                                                         ir.Constant(i64, j)))])
                    xv.append(builder.load(builder.bitcast(p, vty.as_pointer()), align=size))
                sums = []
                for i in range(kh):
                    s = builder.fmul(wb[i * kw], xv[0]) if i == 0 else \
                        builder.call(fma, [wb[i * kw], xv[0], builder.load(acc[i])])
                    for j in range(1, kw):
                        s = builder.call(fma, [wb[i * kw + j], xv[j], s])
                    sums.append(s)
                # the row that took its last input row is done: output r - (kh - 1)
                o = builder.sub(r, ir.Constant(i64, kh - 1))
                with builder.if_then(builder.icmp_signed(">=", o, ir.Constant(i64, 0))):
                    p = builder.gep(dptr, [builder.add(d0v, builder.mul(o, osv))])
                    builder.store(sums[kh - 1], builder.bitcast(p, vty.as_pointer()),
                                  align=size)
                for i in range(1, kh):
                    builder.store(sums[i - 1], acc[i])
            return context.get_dummy_value()

        return sig, codegen

    return roll
