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

__all__ = ["tile_kernel", "TILE_BYTES"]

#: the width of one vector of the tile, in bytes (an AVX-512 register)
TILE_BYTES = 64


def _offset(context, builder, ty, value):
    """``value`` of Numba type ``ty`` as a 64-bit integer."""
    return context.cast(builder, value, ty, types.int64)


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
            fty = context.get_value_type(at[0].dtype)
            size = context.get_abi_sizeof(fty)
            lanes = TILE_BYTES // size
            vty = ir.VectorType(fty, lanes)
            i64 = ir.IntType(64)
            zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * lanes)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vty, [vty] * 3),
                f"llvm.fma.v{lanes}{'f32' if size == 4 else 'f64'}")
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
