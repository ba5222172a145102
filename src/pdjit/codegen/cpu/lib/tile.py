"""A register-blocked micro-kernel for the convolution's taps path (:func:`conv._fwd_range`).

``tile(wf, w0, wk, kk, xs, xb, tap, df, d0, ds, q0, more)`` computes a block of ``MR`` output
rows by ``NV`` vectors of positions (a vector: 64 bytes, 16 float32 or 8 float64):

    df[d0 + r * ds + q0 + q] = sum over k < kk of wf[w0 + r * wk + k] * xs[xb + tap[k] + q0 + q]

for ``r < MR`` and ``q < NV * lanes``, added to what ``df`` holds there where ``more`` is true
(a block of taps after the first: the caller splits long sums into blocks whose inputs stay in
the L1 cache). The ``MR * NV`` sums stay in vector registers over all ``kk`` taps and are
stored once; each tap loads ``NV`` vectors of inputs and broadcasts ``MR`` weights. Every
output sums its products in tap order, each a fused multiply-add. The caller applies an
epilogue (:func:`clamp_run`) to a strip of tiles while it is in cache: measured, a tile that
stored through the epilogue itself made the whole kernel 15-40 % slower (a larger function,
two store paths per tile), even where no epilogue was asked for.

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

__all__ = ["tile_kernel", "roll_kernel", "clamp_run", "TILE_BYTES"]

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


def _splat(builder, vty, x):
    """The vector of type ``vty`` with ``x`` in every lane."""
    undef = ir.Constant(vty, ir.Undefined)
    mask = ir.Constant(ir.VectorType(ir.IntType(32), vty.count), [0] * vty.count)
    return builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(ir.IntType(64), 0)),
                                  undef, mask)


def _clamp(builder, add, x, b, lo, hi):
    """``minimum(maximum(x + b, lo), hi)`` as NumPy computes it (no add where ``add`` is false;
    a NaN stays NaN, ``-0.0`` kept against ``0.0``: selects of unordered-or-ordered compares,
    see :func:`clamp_run`), of scalars or of vectors alike."""
    x = builder.select(add, builder.fadd(x, b), x)
    x = builder.select(builder.fcmp_unordered(">=", x, lo), x, lo)
    return builder.select(builder.fcmp_unordered("<=", x, hi), x, hi)


def _clamper(context, builder, et, vty, add, lo, hi):
    """``(apply(x, b), splat(v))``: :func:`_clamp` of vector ``x`` with the bias vector ``b``,
    ``lo``, ``hi`` (LLVM values of Numba types ``types.float64``) converted to the element type
    ``et``, as ``T(lo)`` does; and :func:`_splat` to vectors of ``vty``."""
    def splat(x):
        return _splat(builder, vty, x)

    lov, hiv = (splat(context.cast(builder, v, types.float64, et)) for v in (lo, hi))

    def apply(x, b):
        return _clamp(builder, add, x, b, lov, hiv)

    return apply, splat


def _flag(context, builder, ty, value):
    return context.cast(builder, value, ty, types.boolean)


def _epilogue_types(bias, c0, ep, add, lo, hi) -> bool:
    return isinstance(bias, types.Array) and isinstance(c0, types.Integer) and \
        all(isinstance(t, (types.Boolean, types.Integer)) for t in (ep, add)) and \
        all(isinstance(t, types.Float) for t in (lo, hi))


def _tile_sums(context, builder, at, args, mr: int, nv: int):
    """The tile's ``mr x nv`` sums (see the module docstring), in vector registers (allocas
    LLVM promotes) over all ``kk`` taps: ``(acc[r][v], cell(r, v), size)``, ``cell(r, v)``
    the vector pointer of output row ``r``'s vector ``v``."""
    wptr = context.make_array(at[0])(context, builder, args[0]).data
    xptr = context.make_array(at[4])(context, builder, args[4]).data
    tptr = context.make_array(at[6])(context, builder, args[6]).data
    dptr = context.make_array(at[7])(context, builder, args[7]).data
    w0v, wkv, kkv = (_offset(context, builder, at[i], args[i]) for i in (1, 2, 3))
    xbv, d0v, dsv, q0v = (_offset(context, builder, at[i], args[i]) for i in (5, 8, 9, 10))
    fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)
    dq = builder.add(d0v, q0v)

    def row(r):
        return builder.add(dq, builder.mul(dsv, ir.Constant(i64, r)))

    def cell(r, v):
        p = builder.gep(dptr, [builder.add(row(r), ir.Constant(i64, v * lanes))])
        return builder.bitcast(p, vty.as_pointer())

    acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)] for _ in range(mr)]
    with builder.if_then(_flag(context, builder, at[11], args[11])):  # more: df's sums so far
        for r in range(mr):
            for v in range(nv):
                builder.store(builder.load(cell(r, v), align=size), acc[r][v])
    xq = builder.add(xbv, q0v)
    i8p, i32 = ir.IntType(8).as_pointer(), lambda v: ir.Constant(ir.IntType(32), v)
    prefetch = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p] + [ir.IntType(32)] * 3),
        "llvm.prefetch.p0")
    with cgutils.for_range(builder, kkv) as loop:
        k = loop.index
        t = builder.load(builder.gep(tptr, [k]))
        base = builder.add(xq, context.cast(builder, t, at[6].dtype, types.int64))
        xv = []
        for v in range(nv):
            p = builder.gep(xptr, [builder.add(base, ir.Constant(i64, v * lanes))])
            xv.append(builder.load(builder.bitcast(p, vty.as_pointer()), align=size))
            if nv > 1:  # the same tap's vectors of the next strip, which the caller's next
                # tile reads (measured: ResNet-50's convolutions at batch 1, 89.6 -> 83.1 ms)
                q = builder.gep(xptr, [builder.add(base, ir.Constant(i64, (v + nv) * lanes))])
                builder.call(prefetch, [builder.bitcast(q, i8p), i32(0), i32(3), i32(1)])
        for r in range(mr):
            wi = builder.add(builder.add(w0v, builder.mul(wkv, ir.Constant(i64, r))), k)
            w = builder.load(builder.gep(wptr, [wi]))
            wb = _splat(builder, vty, w)
            for v in range(nv):
                builder.store(builder.call(fma, [wb, xv[v], builder.load(acc[r][v])]),
                              acc[r][v])
    return acc, cell, size


def _tile_types(wf, xs, df, tap) -> bool:
    return isinstance(wf, types.Array) and isinstance(xs, types.Array) and \
        isinstance(df, types.Array) and isinstance(tap, types.Array) and \
        wf.dtype == xs.dtype == df.dtype and wf.dtype in (types.float32, types.float64) and \
        isinstance(tap.dtype, types.Integer)


def tile_kernel(mr: int, nv: int):
    """The intrinsic for tiles of ``mr`` rows by ``nv`` vectors (see the module docstring)."""
    @intrinsic
    def tile(typingctx, wf, w0, wk, kk, xs, xb, tap, df, d0, ds, q0, more):
        if not _tile_types(wf, xs, df, tap) or not isinstance(more, types.Boolean):
            return None

        def codegen(context, builder, signature, args):
            acc, cell, size = _tile_sums(context, builder, signature.args, args, mr, nv)
            for r in range(mr):
                for v in range(nv):
                    builder.store(builder.load(acc[r][v]), cell(r, v), align=size)
            return context.get_dummy_value()

        return types.void(wf, w0, wk, kk, xs, xb, tap, df, d0, ds, q0, more), codegen

    return tile


def roll_kernel(kh: int, kw: int):
    """A depthwise filter of ``kh x kw`` taps down a column of one vector of positions:

        df[d0 + o * os + q] = sum over i < kh, j < kw of
                              wf[w0 + i * kw + j] * xs[b0 + j * cs + (o + i) * rs + q]

    for output rows ``o < no`` and ``q`` one vector's lanes (``roll(..., bias, c0, ep, add, lo,
    hi)``: with ``ep`` true each sum stored through the epilogue ``minimum(maximum(sum +
    bias[c0], lo), hi)``, no add where ``add`` is false: see :func:`clamp_run`). Each input
    row's ``kw`` vectors are loaded once and serve the ``kh`` output rows that read them (the
    sums of those rows stay in registers, rolled down a row per step), where a loop over the
    outputs loads every input ``kh`` times. Each output sums its products in tap order (row by
    row), the first a product, the rest fused multiply-adds. Offsets are signed 64-bit element
    offsets that the caller keeps in bounds (``no + kh - 1`` input rows are read)."""

    @intrinsic
    def roll(typingctx, wf, w0, xs, b0, cs, rs, no, df, d0, os_, bias, c0, ep, add, lo, hi):
        if not (isinstance(wf, types.Array) and isinstance(xs, types.Array)
                and isinstance(df, types.Array)):
            return None
        if wf.dtype != xs.dtype or wf.dtype != df.dtype or \
                wf.dtype not in (types.float32, types.float64):
            return None
        if not all(isinstance(t, types.Integer) for t in (w0, b0, cs, rs, no, d0, os_)) or \
                not _epilogue_types(bias, c0, ep, add, lo, hi) or bias.dtype != wf.dtype:
            return None
        sig = types.void(wf, w0, xs, b0, cs, rs, no, df, d0, os_, bias, c0, ep, add, lo, hi)

        def codegen(context, builder, signature, args):
            at = signature.args
            wptr = context.make_array(at[0])(context, builder, args[0]).data
            xptr = context.make_array(at[2])(context, builder, args[2]).data
            dptr = context.make_array(at[7])(context, builder, args[7]).data
            w0v, b0v, csv, rsv, nov, d0v, osv = (_offset(context, builder, at[i], args[i])
                                                 for i in (1, 3, 4, 5, 6, 8, 9))
            fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)
            wb = [_splat(builder, vty, builder.load(builder.gep(
                wptr, [builder.add(w0v, ir.Constant(i64, t))]))) for t in range(kh * kw)]
            # the epilogue (ep): + bias[c0] (add), clamped, as each output row is stored
            bptr = context.make_array(at[10])(context, builder, args[10]).data
            c0v = _offset(context, builder, at[11], args[11])
            ep = _flag(context, builder, at[12], args[12])
            add = _flag(context, builder, at[13], args[13])
            apply, splat = _clamper(context, builder, at[0].dtype, vty, add, *(
                context.cast(builder, args[i], at[i], types.float64) for i in (14, 15)))
            nobias = cgutils.alloca_once_value(builder, ir.Constant(fty, 0.0))
            bvec = splat(builder.load(builder.select(add, builder.gep(bptr, [c0v]), nobias)))
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
                    p = builder.bitcast(builder.gep(dptr, [builder.add(d0v, builder.mul(o, osv))]),
                                        vty.as_pointer())
                    with builder.if_else(ep) as (yes, no):
                        with yes:
                            builder.store(apply(sums[kh - 1], bvec), p, align=size)
                        with no:
                            builder.store(sums[kh - 1], p, align=size)
                for i in range(1, kh):
                    builder.store(sums[i - 1], acc[i])
            return context.get_dummy_value()

        return sig, codegen

    return roll


@intrinsic
def clamp_run(typingctx, df, d0, n, bv, add, rs, r0, lo, hi):
    """``df[d0 + q] = minimum(maximum(df[d0 + q] + bv + rs[r0 + q], lo), hi)`` for ``q < n``
    (no ``bv`` where ``add`` is false, no ``rs`` where it is empty): a convolution's epilogue
    over a run of outputs just stored, ``rs`` the residual connection (a value of the outputs'
    shape, flat) added after the bias (see ``conv._bias_clamp``), in vectors of
    :data:`TILE_BYTES` (a loop over NumPy's scalar ``maximum`` / ``minimum`` does not
    vectorise at pdjit's LLVM level), the last few elements one by one. Each result is
    NumPy's: the same float additions in the same order, then ``maximum`` (a NaN stays NaN,
    ``-0.0`` kept against ``0.0``: the select of an unordered-or-greater-or-equal compare) and
    ``minimum`` likewise; ``lo`` and ``hi`` (floats, not NaN) are converted to the element type
    first, as ``T(lo)`` does. The offsets are the caller's to keep in bounds."""
    if not isinstance(df, types.Array) or df.dtype not in (types.float32, types.float64):
        return None
    if not isinstance(rs, types.Array) or rs.dtype != df.dtype or rs.ndim != 1:
        return None
    if not all(isinstance(t, types.Integer) for t in (d0, n, r0)) or \
            not isinstance(bv, (types.Float, types.Integer)) or \
            not isinstance(add, (types.Boolean, types.Integer)) or \
            not all(isinstance(t, (types.Float, types.Integer)) for t in (lo, hi)):
        return None
    sig = types.void(df, d0, n, bv, add, rs, r0, lo, hi)

    def codegen(context, builder, signature, args):
        at = signature.args
        et = at[0].dtype
        darr = context.make_array(at[0])(context, builder, args[0])
        rarr = context.make_array(at[5])(context, builder, args[5])
        dptr, rptr = darr.data, rarr.data
        d0v, nv, r0v = (_offset(context, builder, at[i], args[i]) for i in (1, 2, 6))
        b, lo_, hi_ = (context.cast(builder, args[i], at[i], et) for i in (3, 7, 8))
        flag = context.cast(builder, args[4], at[4], types.boolean)
        fty, size, lanes, vty, i64, zero, _ = _vectors(context, builder, et)
        bvec, lovec, hivec = (_splat(builder, vty, v) for v in (b, lo_, hi_))
        res = builder.icmp_signed("!=", cgutils.unpack_tuple(builder, rarr.shape)[0],
                                  ir.Constant(i64, 0))
        added = ir.Constant(ir.IntType(1), 0)  # (the bias added above: _clamp adds nothing)
        nvec = builder.sdiv(nv, ir.Constant(i64, lanes))
        done = builder.mul(nvec, ir.Constant(i64, lanes))

        def one(k, ptr, bias, lo, hi, residual):
            """Element or vector ``k`` (``ptr`` its pointer type's cast)."""
            p = ptr(builder.gep(dptr, [builder.add(d0v, k)]))
            x = builder.load(p, align=size)
            x = builder.select(flag, builder.fadd(x, bias), x)
            if residual:
                x = builder.fadd(x, builder.load(ptr(builder.gep(rptr, [builder.add(r0v, k)])),
                                                 align=size))
            builder.store(_clamp(builder, added, x, bias, lo, hi), p, align=size)

        def vector(p):
            return builder.bitcast(p, vty.as_pointer())

        with builder.if_else(res) as (yes, no):
            for residual, block in ((True, yes), (False, no)):
                with block:
                    with cgutils.for_range(builder, nvec) as loop:
                        one(builder.mul(loop.index, ir.Constant(i64, lanes)), vector, bvec,
                            lovec, hivec, residual)
                    with cgutils.for_range(builder, builder.sub(nv, done)) as loop:
                        one(builder.add(done, loop.index), lambda p: p, b, lo_, hi_, residual)
        return context.get_dummy_value()

    return sig, codegen
