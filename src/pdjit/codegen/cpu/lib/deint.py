"""Splitting a run of values by the parity of their index, in vector registers.

``deint(src, s0, dst, d0, d1, nv)`` writes, for ``k < nv * lanes`` (a vector: 64 bytes, 16
float32 or 8 float64):

    dst[d0 + k] = src[s0 + 2 * k]        dst[d1 + k] = src[s0 + 2 * k + 1]

Each step loads two vectors of ``src`` and writes their even and their odd elements, one
shuffle each. The convolution's taps kernel (:func:`conv._fwd_taps`) splits an image's rows
this way at stride 2. (The same copy as a Numba loop ran at a quarter of the speed: its
stride-2 loads are not turned into shuffles, measured 0.23 ms for [64, 24, 16, 16] float32
against 0.05 ms.)

Written as LLVM IR (a Numba intrinsic), as :mod:`pdjit.codegen.cpu.lib.tile`. The offsets are
signed 64-bit element offsets that the caller keeps in bounds (no checks here).
"""
import llvmlite.ir as ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from pdjit.codegen.cpu.lib.tile import TILE_BYTES

__all__ = ["deint", "vcopy", "copy_run", "zero_run"]


def _split(typingctx, src, s0, dst, d0, d1, nv):
    """The typing and code of :func:`deint`."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)):
        return None
    if src.dtype != dst.dtype or src.dtype not in (types.float32, types.float64):
        return None
    if not all(isinstance(t, types.Integer) for t in (s0, d0, d1, nv)):
        return None
    sig = types.void(src, s0, dst, d0, d1, nv)

    def codegen(context, builder, signature, args):
        at = signature.args
        sptr = context.make_array(at[0])(context, builder, args[0]).data
        dptr = context.make_array(at[2])(context, builder, args[2]).data
        s0v, d0v, d1v, nvv = (context.cast(builder, args[i], at[i], types.int64)
                              for i in (1, 3, 4, 5))
        fty = context.get_value_type(at[0].dtype)
        size = context.get_abi_sizeof(fty)
        lanes = TILE_BYTES // size
        vty = ir.VectorType(fty, lanes)
        i64 = ir.IntType(64)
        ity = ir.VectorType(ir.IntType(32), lanes)
        first = ir.Constant(ity, [2 * k for k in range(lanes)])  # the even lanes of the pair
        second = ir.Constant(ity, [2 * k + 1 for k in range(lanes)])
        with cgutils.for_range(builder, nvv) as loop:
            k = builder.mul(loop.index, ir.Constant(i64, lanes))
            s = builder.add(s0v, builder.add(k, k))
            a = builder.load(builder.bitcast(builder.gep(sptr, [s]), vty.as_pointer()),
                             align=size)
            b = builder.load(builder.bitcast(
                builder.gep(sptr, [builder.add(s, ir.Constant(i64, lanes))]),
                vty.as_pointer()), align=size)
            for base, mask in ((d0v, first), (d1v, second)):
                p = builder.gep(dptr, [builder.add(base, k)])
                builder.store(builder.shuffle_vector(a, b, mask),
                              builder.bitcast(p, vty.as_pointer()), align=size)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def deint(typingctx, src, s0, dst, d0, d1, nv):
    return _split(typingctx, src, s0, dst, d0, d1, nv)


@intrinsic
def vcopy(typingctx, src, s0, dst, d0, nv):
    """``dst[d0 + k] = src[s0 + k]`` for ``k < nv * lanes``: whole vectors, no remainder loop
    (a Numba loop over one vector's worth of values ran as scalars)."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)):
        return None
    if src.dtype != dst.dtype or src.dtype not in (types.float32, types.float64):
        return None
    if not all(isinstance(t, types.Integer) for t in (s0, d0, nv)):
        return None
    sig = types.void(src, s0, dst, d0, nv)

    def codegen(context, builder, signature, args):
        at = signature.args
        sptr = context.make_array(at[0])(context, builder, args[0]).data
        dptr = context.make_array(at[2])(context, builder, args[2]).data
        s0v, d0v, nvv = (context.cast(builder, args[i], at[i], types.int64) for i in (1, 3, 4))
        fty = context.get_value_type(at[0].dtype)
        size = context.get_abi_sizeof(fty)
        lanes = TILE_BYTES // size
        vty = ir.VectorType(fty, lanes)
        with cgutils.for_range(builder, nvv) as loop:
            k = builder.mul(loop.index, ir.Constant(ir.IntType(64), lanes))
            v = builder.load(builder.bitcast(builder.gep(sptr, [builder.add(s0v, k)]),
                                             vty.as_pointer()), align=size)
            builder.store(v, builder.bitcast(builder.gep(dptr, [builder.add(d0v, k)]),
                                             vty.as_pointer()), align=size)
        return context.get_dummy_value()

    return sig, codegen


# ---- runs copied or zeroed by one libc call: no loop for Numba to lower nor LLVM to vectorise --
# A Numba copy loop (a range iterator, an index cast, a load and a store per element, then
# LLVM's vectoriser over it) is a good part of a kernel's compile time; the convolution kernels
# have a dozen. ``memcpy``/``memset`` run as fast on the long runs and as fast within noise on
# the short ones (rows of 8-32 values).
def _run_fits(arrays, ints) -> bool:
    return all(isinstance(a, types.Array) and a.layout == "C" for a in arrays) and \
        all(isinstance(t, types.Integer) for t in ints)


def _count(context, builder, ty, value, item):
    """``value`` (of Numba type ``ty``) elements of ``item`` bytes as a byte count, 0 when it is
    not positive."""
    n = context.cast(builder, value, ty, types.int64)
    zero = ir.Constant(n.type, 0)
    n = builder.select(builder.icmp_signed(">", n, zero), n, zero)
    return builder.mul(n, ir.Constant(n.type, item))


@intrinsic
def copy_run(typingctx, src, s0, dst, d0, n):
    """``dst[d0 + k] = src[s0 + k]`` for ``k < n`` (flat C-contiguous arrays of one dtype, the
    runs not overlapping, nothing done for ``n <= 0``)."""
    if not _run_fits((src, dst), (s0, d0, n)) or src.dtype != dst.dtype:
        return None
    sig = types.void(src, s0, dst, d0, n)

    def codegen(context, builder, signature, args):
        at = signature.args
        sp = context.make_array(at[0])(context, builder, args[0]).data
        dp = context.make_array(at[2])(context, builder, args[2]).data
        item = context.get_abi_sizeof(context.get_data_type(at[0].dtype))
        s = builder.gep(sp, [context.cast(builder, args[1], at[1], types.int64)])
        d = builder.gep(dp, [context.cast(builder, args[3], at[3], types.int64)])
        size = _count(context, builder, at[4], args[4], item)
        cgutils.raw_memcpy(builder, d, s, size, 1, align=item)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def zero_run(typingctx, dst, d0, n):
    """``dst[d0 + k] = 0`` for ``k < n`` (a flat C-contiguous array; nothing for ``n <= 0``)."""
    if not _run_fits((dst,), (d0, n)):
        return None
    sig = types.void(dst, d0, n)

    def codegen(context, builder, signature, args):
        at = signature.args
        dp = context.make_array(at[0])(context, builder, args[0]).data
        item = context.get_abi_sizeof(context.get_data_type(at[0].dtype))
        d = builder.gep(dp, [context.cast(builder, args[1], at[1], types.int64)])
        size = _count(context, builder, at[2], args[2], item)
        cgutils.memset(builder, d, size, 0)
        return context.get_dummy_value()

    return sig, codegen
