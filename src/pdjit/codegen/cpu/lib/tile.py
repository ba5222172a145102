"""A register-blocked micro-kernel for the convolution's taps path (:func:`conv._fwd_range`).

``tile(wf, w0, wk, kk, xs, xb, tap, t0, df, d0, ds, q0, more)`` computes a block of ``MR``
output rows by ``NV`` vectors of positions (a vector: 64 bytes, 16 float32 or 8 float64):

    df[d0 + r * ds + q0 + q] = sum over k < kk of
                               wf[w0 + r * wk + k] * xs[xb + tap[t0 + k] + q0 + q]

for ``r < MR`` and ``q < NV * lanes``, added to what ``df`` holds there where ``more`` is true
(a block of taps after the first: the caller splits long sums into blocks whose inputs stay in
the L1 cache). The ``MR * NV`` sums stay in vector registers over all ``kk`` taps (by passes
where they do not fit: :data:`PASS_ROWS`) and are
stored once; each tap loads ``NV`` vectors of inputs and broadcasts ``MR`` weights. Every
output sums its products in tap order, each a fused multiply-add. The caller applies an
epilogue (:func:`clamp_run`) to a few strips of tiles while they are in cache: measured, a tile
that stored through the epilogue itself made the whole kernel 15-40 % slower (a larger function,
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

from pdjit.codegen.cpu.lib._jit import target_cpu

__all__ = ["tile_kernel", "plane_kernel", "pool_plane_kernel", "max22_plane", "avg22_plane",
           "clamp_run", "TILE_BYTES", "PASS_ROWS", "sum_passes"]

#: the width of one vector of the tile, in bytes (an AVX-512 register; two AVX2 registers)
TILE_BYTES = 64


def _features(features: str | None = None) -> set:
    """The CPU features Numba compiles for (``_jit.target_cpu``), or ``features``, as a set of
    ``"+avx2"``-style names."""
    return set((target_cpu()[1] if features is None else features).split(","))


def _pass_rows(features: str | None = None) -> int:
    """:data:`PASS_ROWS` for the CPU of ``features`` (see :func:`_features`)."""
    have = _features(features)
    return 0 if "+avx512f" in have else 6 if "+avx" in have else 3


def _prefetch_fills_l1(name: str | None = None) -> bool:
    """:data:`PREFETCH_FILLS_L1` for the CPU of LLVM's ``name`` (default: the one Numba compiles
    for, ``_jit.target_cpu``)."""
    return (target_cpu()[0] if name is None else name).startswith("znver")


def _plane_bytes(features: str | None = None) -> int:
    """:data:`PLANE_BYTES` for the CPU of ``features`` (see :func:`_features`)."""
    have = _features(features)
    return 64 if "+avx512f" in have else 32 if "+avx" in have else 16


#: How many rows of one vector (of :data:`TILE_BYTES`) one pass over a tile's sum keeps in
#: registers: 0, all of the tile at once, with AVX-512's 32 registers of 64 bytes; with AVX2's
#: 16 registers of 32 bytes a vector takes two, and a tile of more than 6 (12 registers, the
#: rest for the loads and a broadcast) sums by passes over its ``k`` of at most 6 rows by one
#: vector each (:func:`sum_passes`), each sum in the same order of ``k`` as in one pass (the
#: same bits). Measured on a 2-vCPU AMD EPYC (Zen 1, AVX2), ``pgemm.weight_gemm`` float32, one
#: thread: the 6 x 4 tile in one pass (48 registers' worth: spilled) 13-18 GFLOP/s, by passes
#: 24-35, OpenBLAS's ``sgemm`` 28-35. Numba's cache keys compiled code by the CPU's features, so
#: a cache copied to another kind of machine compiles its own.
PASS_ROWS = _pass_rows()

#: Whether a prefetch that asks for the L2 cache (``_prefetch``'s ``locality`` 2) fills the L1
#: cache too, as on AMD's Zen cores (Intel's keep it out of L1). Numba's cache keys compiled
#: code by the CPU's name, so a cache copied to another kind of machine compiles its own.
PREFETCH_FILLS_L1 = _prefetch_fills_l1()

#: The width in bytes of the vectors of the kernels that stream over an image plane with no
#: register tile and no packed layout (:func:`plane_kernel`): one register of the CPU. Their
#: loops hold a filter's taps, a vector of sums per filter row and a row's loads at once, which
#: in vectors of 64 bytes took twice the 16 registers of an AVX2 CPU and spilled.
PLANE_BYTES = _plane_bytes()


def sum_passes(mr: int, nv: int) -> list:
    """The passes over the sum of a tile of ``mr`` rows by ``nv`` vectors (see
    :data:`PASS_ROWS`): ``(r0, r1, v0, v1)``, rows ``r0 .. r1`` by vectors ``v0 .. v1`` each."""
    if not PASS_ROWS or mr * nv <= PASS_ROWS:
        return [(0, mr, 0, nv)]
    if mr <= PASS_ROWS:  # whole rows, by groups of vectors
        parts = -(-nv // (PASS_ROWS // mr))
        vb = [nv * i // parts for i in range(parts + 1)]
        return [(0, mr, vb[i], vb[i + 1]) for i in range(parts)]
    parts = -(-mr // PASS_ROWS)  # rows in parts of as even sizes as may be, a vector each
    rb = [mr * i // parts for i in range(parts + 1)]
    return [(rb[i], rb[i + 1], v, v + 1) for v in range(nv) for i in range(parts)]


def _offset(context, builder, ty, value):
    """``value`` of Numba type ``ty`` as a 64-bit integer."""
    return context.cast(builder, value, ty, types.int64)


def _vectors(context, builder, dtype, nbytes: int = TILE_BYTES):
    """``(element type, its bytes, lanes, vector type, i64, zero vector, llvm.fma of
    vectors)`` for vectors of ``nbytes`` (:data:`TILE_BYTES`) of ``dtype``."""
    fty = context.get_value_type(dtype)
    size = context.get_abi_sizeof(fty)
    lanes = nbytes // size
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


def _prefetch(builder, ptr, at, write: bool = False, locality: int = 3):
    """Prefetch the cache line of element ``at`` (an i64) of ``ptr`` (``locality`` 3: into
    every cache level; 2: the L2 cache and beyond), for a write where ``write`` is true (no
    fault on any address: a prefetch past an array's end costs nothing but the fetch)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p] + [i32] * 3), "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(builder.gep(ptr, [at]), i8p)] +
                 [ir.Constant(i32, v) for v in (int(write), locality, 1)])


def _clamp(builder, add, x, b, lo, hi):
    """``minimum(maximum(x + b, lo), hi)`` as NumPy computes it (no add where ``add`` is false;
    a NaN stays NaN, ``-0.0`` kept against ``0.0``: selects of unordered-or-ordered compares,
    see :func:`clamp_run`), of scalars or of vectors alike."""
    x = builder.select(add, builder.fadd(x, b), x)
    x = builder.select(builder.fcmp_unordered(">=", x, lo), x, lo)
    return builder.select(builder.fcmp_unordered("<=", x, hi), x, hi)


#: the values of a gate array (see :func:`gate_of`), in order
GATE_VALUES = 5


def _where(builder, cond, make, other):
    """``make()`` (emitted in a branch taken where ``cond``, an i1, holds), else ``other``."""
    with builder.if_else(cond) as (yes, no):
        with yes:
            got = make()
            yb = builder.block
        with no:
            nb = builder.block
    phi = builder.phi(other.type)
    phi.add_incoming(got, yb)
    phi.add_incoming(other, nb)
    return phi


def gate_of(context, builder, ty, value, vty):
    """The gate an epilogue applies after its clamp, from a kernel's argument ``value`` (an
    array of Numba type ``ty``, of the data's type): empty, none; else ``(a, b, lo, hi,
    scale)``, for ``t = minimum(maximum(x * a + b, lo), hi)`` then ``x * t / scale``
    (``scale`` not 0: hard_swish) or ``t`` (hard_sigmoid), each value splat to vectors of
    ``vty``. Returns ``(has, values)`` for :func:`gated` (``has``: an i1)."""
    arr = context.make_array(ty)(context, builder, value)
    n = cgutils.unpack_tuple(builder, arr.shape)[0]
    has = builder.icmp_signed(">=", n, ir.Constant(n.type, GATE_VALUES))
    zero = ir.Constant(vty.element, 0.0)
    # (an empty array's pointer is not read: its values are zeros, and unused)
    return has, [_splat(builder, vty, _where(builder, has, lambda i=i: builder.load(
        builder.gep(arr.data, [ir.Constant(ir.IntType(64), i)])), zero))
        for i in range(GATE_VALUES)]


def gated(builder, has, gate, x):
    """``x`` through the gate of :func:`gate_of` where ``has``, as the reference kernels of
    hard_swish and hard_sigmoid compute it (a multiply, then an add; NumPy's ``maximum`` and
    ``minimum``; then ``x * t`` and the division, each rounded): ``x`` itself where not."""
    a, b, lo, hi, scale = gate

    def apply():
        t = _clamp(builder, ir.Constant(ir.IntType(1), 1), builder.fmul(x, a), b, lo, hi)
        zero = ir.Constant(scale.type, [ir.Constant(scale.type.element, 0.0)] *
                           scale.type.count)
        swish = builder.fdiv(builder.fmul(x, t), scale)
        return builder.select(builder.fcmp_ordered("!=", scale, zero), swish, t)

    return _where(builder, has, apply, x)


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
    dptr = context.make_array(at[8])(context, builder, args[8]).data
    w0v, wkv, kkv = (_offset(context, builder, at[i], args[i]) for i in (1, 2, 3))
    t0v, xbv, d0v, dsv, q0v = (_offset(context, builder, at[i], args[i])
                               for i in (7, 5, 9, 10, 11))
    fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype)
    dq = builder.add(d0v, q0v)

    def row(r):
        return builder.add(dq, builder.mul(dsv, ir.Constant(i64, r)))

    def cell(r, v):
        p = builder.gep(dptr, [builder.add(row(r), ir.Constant(i64, v * lanes))])
        return builder.bitcast(p, vty.as_pointer())

    acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)] for _ in range(mr)]
    with builder.if_then(_flag(context, builder, at[12], args[12])):  # more: df's sums so far
        for r in range(mr):
            for v in range(nv):
                builder.store(builder.load(cell(r, v), align=size), acc[r][v])
    xq = builder.add(xbv, q0v)
    for r0, r1, v0, v1 in sum_passes(mr, nv):
        with cgutils.for_range(builder, kkv) as loop:
            k = loop.index
            t = builder.load(builder.gep(tptr, [builder.add(t0v, k)]))
            base = builder.add(xq, context.cast(builder, t, at[6].dtype, types.int64))
            xv = {}
            for v in range(v0, v1):
                p = builder.gep(xptr, [builder.add(base, ir.Constant(i64, v * lanes))])
                xv[v] = builder.load(builder.bitcast(p, vty.as_pointer()), align=size)
                if nv > 1 and r0 == 0:  # the same tap's vectors of the next strip, which the
                    # caller's next tile reads (measured: ResNet-50's convolutions at batch
                    # 1, 89.6 -> 83.1 ms)
                    _prefetch(builder, xptr,
                              builder.add(base, ir.Constant(i64, (v + nv) * lanes)))
            for r in range(r0, r1):
                wi = builder.add(builder.add(w0v, builder.mul(wkv, ir.Constant(i64, r))), k)
                w = builder.load(builder.gep(wptr, [wi]))
                wb = _splat(builder, vty, w)
                for v in range(v0, v1):
                    builder.store(builder.call(fma, [wb, xv[v], builder.load(acc[r][v])]),
                                  acc[r][v])
    return acc, cell, size


def _tile_types(wf, xs, df, tap) -> bool:
    return isinstance(wf, types.Array) and isinstance(xs, types.Array) and \
        isinstance(df, types.Array) and isinstance(tap, types.Array) and \
        wf.dtype == xs.dtype == df.dtype and wf.dtype in (types.float32, types.float64) and \
        isinstance(tap.dtype, types.Integer)


def tile_kernel(mr: int, nv: int, epilogue: bool = False):
    """The intrinsic for tiles of ``mr`` rows by ``nv`` vectors (see the module docstring).

    ``epilogue``: five more arguments, ``bias, b0, add, lo, hi``: each sum stored through
    ``minimum(maximum(sum + bias[b0 + r], lo), hi)`` (row ``r`` of the tile; no add where
    ``add`` is false; the bias converted to the data's type, as :func:`clamp_run` takes
    it), the values :func:`clamp_run` gives on the stored sums, for a tile whose sums are
    whole (no ``more`` after it)."""
    def codegen(context, builder, signature, args):
        at = signature.args
        acc, cell, size = _tile_sums(context, builder, at, args, mr, nv)
        if epilogue:
            et = at[0].dtype
            fty, _, _, vty, i64, _, _ = _vectors(context, builder, et)
            add = _flag(context, builder, at[15], args[15])
            lo, hi = (context.cast(builder, args[i], at[i], types.float64) for i in (16, 17))
            apply, splat = _clamper(context, builder, et, vty, add, lo, hi)
            bptr = context.make_array(at[13])(context, builder, args[13]).data
            b0v = _offset(context, builder, at[14], args[14])
        for r in range(mr):
            if epilogue:  # (the bias read only where it is added: it may be empty)
                at_ = builder.gep(bptr, [builder.add(b0v, ir.Constant(i64, r))])
                b = splat(_where(builder, add, lambda p=at_: context.cast(
                    builder, builder.load(p), at[13].dtype, et), ir.Constant(fty, 0)))
            for v in range(nv):
                x = builder.load(acc[r][v])
                builder.store(apply(x, b) if epilogue else x, cell(r, v), align=size)
        return context.get_dummy_value()

    if epilogue:
        @intrinsic
        def tile(typingctx, wf, w0, wk, kk, xs, xb, tap, t0, df, d0, ds, q0, more, bias, b0,
                 add, lo, hi):
            if not _tile_types(wf, xs, df, tap) or not isinstance(t0, types.Integer) or \
                    not isinstance(more, types.Boolean) or not isinstance(bias, types.Array) \
                    or not isinstance(bias.dtype, types.Float) or \
                    not isinstance(b0, types.Integer) or \
                    not isinstance(add, (types.Boolean, types.Integer)) or \
                    not all(isinstance(t, (types.Float, types.Integer)) for t in (lo, hi)):
                return None
            return types.void(wf, w0, wk, kk, xs, xb, tap, t0, df, d0, ds, q0, more, bias, b0,
                              add, lo, hi), codegen
        return tile

    @intrinsic
    def tile(typingctx, wf, w0, wk, kk, xs, xb, tap, t0, df, d0, ds, q0, more):
        if not _tile_types(wf, xs, df, tap) or not isinstance(t0, types.Integer) or \
                not isinstance(more, types.Boolean):
            return None
        return types.void(wf, w0, wk, kk, xs, xb, tap, t0, df, d0, ds, q0, more), codegen

    return tile


def _masked(builder, vty, name: str):
    """``llvm.masked.load`` or ``llvm.masked.store`` of vectors ``vty``."""
    mty = ir.VectorType(ir.IntType(1), vty.count)
    el = "f32" if vty.element == ir.FloatType() else "f64"
    if name == "load":
        fty = ir.FunctionType(vty, [vty.as_pointer(), ir.IntType(32), mty, vty])
    else:
        fty = ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), ir.IntType(32), mty])
    return cgutils.get_or_insert_function(builder.module, fty,
                                          f"llvm.masked.{name}.v{vty.count}{el}.p0")


def _store(builder, store, value, p, align, mask=None, whole=None) -> None:
    """Store the vector ``value`` at ``p``: every lane where ``mask`` is None, else its lanes
    in ``mask`` by ``store`` (a :func:`_masked` store), unless ``whole`` (an i1, where given)
    holds at run time. AMD's Zen 1 and 2 run a masked store as dozens of micro-ops: a tile's
    vectors, all whole but at a product's last columns, store plainly."""
    if mask is None:
        builder.store(value, p, align=align.constant)
    elif whole is None:
        builder.call(store, [value, p, align, mask])
    else:
        with builder.if_else(whole) as (yes, no):
            with yes:
                builder.store(value, p, align=align.constant)
            with no:
                builder.call(store, [value, p, align, mask])


def _edge_load(builder, load, p, align, mask, whole, fill):
    """The vector at ``p``: loaded plainly where ``whole`` (an i1) holds, else its lanes in
    ``mask`` by ``load`` (a :func:`_masked` load), ``fill`` in the others."""
    with builder.if_else(whole) as (yes, no):
        with yes:
            plain = builder.load(p, align=align.constant)
            from_yes = builder.block
        with no:
            masked = builder.call(load, [p, align, mask, fill])
            from_no = builder.block
    got = builder.phi(fill.type)
    got.add_incoming(plain, from_yes)
    got.add_incoming(masked, from_no)
    return got


def _plane_loops(builder, xptr, geo, vty, align, kh: int, kw: int, stride: int, fill, combine,
                 put, rows_first: bool = False):
    """The loops of a filter of ``kh x kw`` taps at stride ``stride`` (1 or 2) over one plane
    (:func:`plane_kernel`, :func:`pool_plane_kernel`): ``geo`` the LLVM i64 values ``(b0, h, w,
    oh, ow, pt, pl, size)`` (``size``: the elements of the array the plane lies in), ``align``
    the elements' alignment (an i32 constant); each output vector starts at ``fill`` (also
    what a lane outside the image reads), takes its taps in order by ``combine(tap, x, acc)``
    and is stored by ``put(row, q0, value, mask, whole)`` (as :func:`_store` takes them:
    ``mask`` None, every lane; else ``whole``, whether the vector lies inside the row after
    all). ``rows_first`` (an associative ``combine`` that ignores
    ``tap``, whose ``fill`` it returns its other operand for: a max pool's): each input row's
    taps are combined first, once for all the output rows that read it, then the rows, in the
    same order (a chain of ``kh`` combines a row of outputs instead of ``kh * kw``: a max
    pool's steps were bound by that chain's latency. 3x3 max pools at stride 2, one thread,
    us: [1, 64, 112, 112] 159 -> 109 (ResNet's, padded by 1: 159 -> 108), [1, 128, 55, 55]
    79 -> 53, [1, 256, 27, 27] 41 -> 26).

    The outputs go by columns of vectors (several side by side: ``by_columns``), down the
    rows; a tap's inputs are one load (stride 2: the even or odd lanes of a pair of loads,
    picked by a shuffle; one pair serves two neighbouring taps), masked only in the columns
    at the image's edges, so the plane is read in place: no padded copy (a row above or below
    the image reads ``fill``). Each input row is loaded once for all the output rows that read
    it (their partial results stay in registers, rolled down an output row per step): at
    stride 2 this measured 1.1-1.4x faster than loading each output row's inputs
    (MobileNetV2's depthwise layers of stride 2, float32, one thread, batch 1)."""
    b0v, hv, wv, ohv, owv, ptv, plv, size = geo
    lanes = vty.count
    i64 = ir.IntType(64)
    i32 = ir.IntType(32)
    load = _masked(builder, vty, "load")
    # masks compared in 32-bit lanes: one mask register a vector (64-bit compares made two
    # halves, spilled and joined again at each step of the row loop)
    ity = ir.VectorType(i32, lanes)
    bty = ir.VectorType(ir.IntType(1), lanes)
    iota = ir.Constant(ity, list(range(lanes)))

    def c(v):
        return ir.Constant(i64, v)

    def inside(col, lo_, hi_):
        """The lanes whose columns ``col + lane`` lie in ``[lo_, hi_)``."""
        cols = builder.add(_splat(builder, ity, builder.trunc(col, i32)), iota)
        return builder.and_(
            builder.icmp_signed(">=", cols, _splat(builder, ity, builder.trunc(lo_, i32))),
            builder.icmp_signed("<", cols, _splat(builder, ity, builder.trunc(hi_, i32))))

    def row(ih, masked):
        """Input row ``ih``: its first element's index (a row outside the image: row 0's, where
        the loads are not masked) and whether it lies in the image (``masked``: as a mask of
        every lane and as the flag, else the flag)."""
        ok = builder.and_(builder.icmp_signed(">=", ih, c(0)), builder.icmp_signed("<", ih, hv))
        if masked:
            return builder.add(b0v, builder.mul(ih, wv)), (_splat(builder, bty, ok), ok)
        return builder.add(b0v, builder.mul(builder.select(ok, ih, c(0)), wv)), ok

    def vload(at_, mask, ok):
        """The vector at ``xptr[at_:]``: its lanes in ``mask`` (:func:`load_mask`'s) and in
        the row ``ok`` (:func:`row`'s); ``mask`` None: every lane, ``fill`` where the flag
        ``ok`` is false."""
        p = builder.bitcast(builder.gep(xptr, [at_]), vty.as_pointer())
        if mask is None:
            return builder.select(ok, builder.load(p, align=align.constant), fill)
        (lanes_in, whole), (row_in, row_ok) = mask, ok
        return _edge_load(builder, load, p, align, builder.and_(lanes_in, row_in),
                          builder.and_(whole, row_ok), fill)

    def load_mask(col):
        """A masked column's load at input column ``col``: the lanes inside the image, and
        whether all are (an i1: the load is then a plain one where its row is in the image).
        In a column at the image's edge only one of a row's loads passes the edge, and AMD's
        Zen 1 runs a masked load as several micro-ops: masking them all made the edge columns
        2-4x slower than the others. Measured, depthwise 3x3 with bias and relu6 (one thread,
        batch 1, MobileNetV2's NCHW layers, us, all masked / this): [1, 32, 112, 112] 548 /
        444, at stride 2 [1, 96, 112, 112] 839 / 617, [1, 144, 56, 56] 740 / 543, at stride 2
        467 / 288, [1, 192, 28, 28] 363 / 240, at stride 2 231 / 130."""
        return inside(col, c(0), wv), in_image(col, builder.add(col, c(lanes - 1)))

    def in_image(first, last):
        """Whether the input columns ``first .. last`` all lie in the image (an i1)."""
        return builder.and_(builder.icmp_signed(">=", first, c(0)),
                            builder.icmp_signed("<", last, wv))

    def ahead(ih, cols_):
        """Prefetch the elements ``col`` of the input row :data:`PLANE_AHEAD` after ``ih``."""
        at_ = builder.add(b0v, builder.mul(wv, builder.add(ih, c(PLANE_AHEAD))))
        for col in cols_:
            _prefetch(builder, xptr, builder.add(at_, col))

    def in_row(q0):
        """Whether the vector of outputs ``q0 ..`` lies inside its row (an i1)."""
        return builder.icmp_signed("<=", builder.add(q0, c(lanes)), owv)

    def out_masks(q0, masked: bool):
        """``put``'s ``mask`` and ``whole`` for the vector of outputs ``q0 ..`` (unmasked:
        None, None)."""
        return (inside(q0, c(0), owv), in_row(q0)) if masked else (None, None)

    def column(q):
        """The first output of column ``q``: the last column of a plane at least a vector
        wide ends at its edge (overlapping the one before: the same values stored again), so
        that only a plane narrower than a vector stores through a mask."""
        q0 = builder.mul(q, c(lanes))
        return builder.select(builder.icmp_signed("<", owv, c(lanes)), q0,
                              builder.select(builder.icmp_signed(">", builder.add(q0, c(lanes)),
                                                                 owv),
                                             builder.sub(owv, c(lanes)), q0))

    nq = builder.sdiv(builder.add(owv, c(lanes - 1)), c(lanes))
    # the input columns the loads of the output vector at q0 read, first and last
    if stride == 1:
        def span(q0):
            return builder.sub(q0, plv), builder.add(builder.sub(q0, plv), c(kw - 1 + lanes - 1))
    else:  # (the lanes used: an odd filter's last pair past its last tap's even lanes)
        def span(q0):
            first = builder.sub(builder.mul(q0, c(2)), plv)
            return first, builder.add(first, c(kw - 1 + 2 * (lanes - 1)))

    def whole(q0):
        """Whether every load and store of the column of output vectors at ``q0`` is plain:
        every lane it uses inside the image and the plane (an i1). At stride 2 an odd
        filter's last pair of loads reads one column more than its taps use: past the row's
        end, the next row's first element, which the plane's last row may read only where
        the array goes on (else the column goes masked): a 28x28 plane at stride 2, padded
        by 1, had both its columns masked for that one column (MobileNetV2's 192 channels,
        one thread, the image rewritten before each call, 156-166 -> 126-130 us)."""
        first, last = span(q0)
        ok = builder.and_(in_image(first, last), builder.and_(
            in_row(q0), builder.icmp_signed(">", hv, c(0))))  # (a row 0 to read)
        if stride == 1 or kw % 2 == 0:
            return ok
        past = builder.icmp_signed("<", builder.add(last, c(1)), wv)
        goes_on = builder.icmp_signed("<", builder.add(b0v, builder.mul(hv, wv)), size)
        return builder.and_(ok, builder.or_(past, goes_on))

    def alone(body, q0):
        """``body([q0], masked)``: plain loads and stores where every lane lies inside the
        image and the plane, else masked (a load's and a store's mask only where the column
        passes the edge). AMD's Zen 1 and 2 run a masked store as dozens of micro-ops: a
        depthwise 3x3 layer masked throughout ran 2-3x slower there."""
        with builder.if_else(whole(q0)) as (yes, no):
            with yes:
                body([q0], False)
            with no:
                body([q0], True)

    def by_columns(body, groups):
        """``body(qs, masked)`` for each column of output vectors (``qs`` their first
        outputs), several at a time in one loop: the first of the sizes ``groups`` that the
        columns left fill (else one, :func:`alone`), masked where one of them is (each load
        and store then plain or masked at run time, :func:`_edge_load`, :func:`_store`).
        Going down the rows with a row's columns together reads each input row once, along
        the row, where a column at a time went down the whole plane once per column (and
        with one chain of fused multiply-adds a column). Measured on depthwise 3x3 layers
        with bias and relu6 right after the 1x1 layer that writes their input, as in
        MobileNetV2, the L3 cache flushed before (batch 1, us), one thread: at stride 1 (by
        4, else 2; against pairs only where both are plain) [1, 32, 112, 112] 144 -> 125,
        [1, 144, 56, 56] 182 -> 144, [1, 192, 28, 28] 59 -> 59; at stride 2 (by 2; against
        one at a time) [1, 96, 112, 112] 350 -> 246, [1, 144, 56, 56] 84 -> 74, [1, 192, 28,
        28] 31 -> 31 (by 4: 250, 92 and 41, its larger loop slower even where it takes only
        single columns); two threads, each half the channels after a 1x1 layer
        split by pixels: 71 -> 66, 132 -> 103, 42 -> 39 at stride 1, 180 -> 142 and 59 -> 55
        at stride 2. ResNet's 3x3 max pool at stride 2, [1, 64, 112, 112], one thread: 181 ->
        169 (processes by turns: 225-300 -> 140-190). Filters of more than 3x3 taps go a
        column at a time (a row's taps then take as long as its chain; in groups, 5x5 at
        stride 2 [1, 72, 56, 56] 73 -> 80, 7x7 [1, 64, 56, 56] 141 -> 170)."""
        if not groups:
            with cgutils.for_range(builder, nq) as qloop:
                alone(body, column(qloop.index))
            return
        # (one loop, each step a group of columns or one: each body compiled once)
        kv = cgutils.alloca_once_value(builder, c(0))
        test = builder.append_basic_block("columns.test")
        step = builder.append_basic_block("columns.step")
        done = builder.append_basic_block("columns.done")
        builder.branch(test)
        builder.position_at_end(test)
        builder.cbranch(builder.icmp_signed("<", builder.load(kv), nq), step, done)
        builder.position_at_end(step)
        k = builder.load(kv)

        def take(sizes):
            if not sizes:
                alone(body, column(k))
                builder.store(builder.add(k, c(1)), kv)
                return
            g = sizes[0]
            with builder.if_else(builder.icmp_signed("<=", builder.add(k, c(g)), nq)) as (
                    yes, no):
                with yes:
                    qs = [column(builder.add(k, c(i))) for i in range(g)]
                    plain = whole(qs[0])
                    for q in qs[1:]:
                        plain = builder.and_(plain, whole(q))
                    with builder.if_else(plain) as (all_plain, some_masked):
                        with all_plain:
                            body(qs, False)
                        with some_masked:
                            body(qs, True)
                    builder.store(builder.add(k, c(g)), kv)
                with no:
                    take(sizes[1:])

        take(tuple(groups))
        builder.branch(test)
        builder.position_at_end(done)

    def fresh_sums(n: int):
        """``n`` slots of partial sums for one column of a body, each set to ``fill`` where the
        body begins (a body runs again for each column)."""
        acc = [cgutils.alloca_once_value(builder, fill) for _ in range(n)]
        for a in acc:
            builder.store(fill, a)
        return acc

    def store_and_roll(t, n: int, done, order=None):
        """The end of row step ``t`` of a body whose columns ``done`` (each ``(q0, store
        mask, whole, slots, sums)``) hold ``n`` partial sums: the last stored as output row
        ``t - n + 1`` where that is a row (put in the outputs' order by ``order``, None:
        already in it), the others rolled down a slot for the next step."""
        o = builder.sub(t, c(n - 1))
        with builder.if_then(builder.icmp_signed(">=", o, c(0))):
            for q0, smask, stored, _, sums in done:
                last = sums[n - 1]
                put(o, q0, last if order is None else builder.shuffle_vector(last, last, order),
                    smask, stored)
        for _, _, _, acc, sums in done:
            for i in range(1, n):
                builder.store(sums[i - 1], acc[i])

    if stride == 1:
        def rows1(qs, masked):
            per = []  # each column's: q0, input columns, store masks, load masks, partial sums
            for q0 in qs:
                cols = [builder.sub(builder.add(q0, c(j)), plv) for j in range(kw)]
                acc = fresh_sums(kh)
                per.append((q0, cols, out_masks(q0, masked),
                            [load_mask(col) if masked else None for col in cols], acc))
            with cgutils.for_range(builder, builder.add(ohv, c(kh - 1))) as loop:
                r = loop.index  # output row r - i reads this input row as its row i
                ih = builder.sub(r, ptv)
                base, ok = row(ih, masked)
                done = []
                for q0, cols, (smask, stored), lmask, acc in per:
                    ahead(ih, (cols[0], builder.add(cols[kw - 1], c(lanes - 1))))
                    xv = [vload(builder.add(base, cols[j]), lmask[j], ok) for j in range(kw)]
                    if rows_first:
                        xv = [_fold(combine, xv)]
                    sums = []
                    for i in range(kh):
                        s_ = builder.load(acc[i]) if i else fill
                        if rows_first:
                            s_ = combine(i * kw, xv[0], s_) if i else xv[0]
                        else:
                            for j in range(kw):
                                s_ = combine(i * kw + j, xv[j], s_)
                        sums.append(s_)
                    done.append((q0, smask, stored, acc, sums))
                store_and_roll(r, kh, done)

        by_columns(rows1, (4, 2) if kh * kw <= 9 else ())
        return
    # stride 2: step t reads input rows 2t and 2t + 1 (less the top padding); output row
    # t - u takes their taps 2u and 2u + 1, so each input row is loaded once for every output
    # row that reads it (the partial sums roll down an output row per step, as at stride 1).
    # A row's taps j and j + 1 are the even and odd lanes of one pair of vectors loaded at
    # column 2 * q0 + j - pl (j even)
    even, odd, order = _deinterleave(lanes, 4 if vty.element == ir.FloatType() else 8)
    steps = (kh + 1) // 2

    def rows2(qs, masked):
        per = []  # each column's: q0, store masks, load columns, load masks, partial sums
        for q0 in qs:
            cols = [[builder.add(builder.sub(builder.add(builder.mul(q0, c(2)), c(j)), plv),
                                 c(h2 * lanes)) for h2 in range(2)] for j in range(0, kw, 2)]
            lmask = [[load_mask(cc) if masked else None for cc in pair] for pair in cols]
            acc = fresh_sums(steps)
            per.append((q0, out_masks(q0, masked), cols, lmask, acc))
        with cgutils.for_range(builder, builder.add(ohv, c(steps - 1))) as loop:
            t = loop.index
            done = []
            rows = [[] for _ in per]  # per column, per input row of the step, each tap's inputs
            for e in range(2):
                ih = builder.sub(builder.add(builder.mul(t, c(2)), c(e)), ptv)
                base, ok = row(ih, masked)
                for k_, (_, _, cols, lmask, _) in enumerate(per):
                    ahead(ih, (cols[0][0], cols[0][1], builder.add(cols[-1][1], c(lanes - 1))))
                    xv = []
                    for p_, pair in enumerate(cols):
                        lo_, hi_ = (vload(builder.add(base, pair[h2]), lmask[p_][h2], ok)
                                    for h2 in range(2))
                        xv.append(builder.shuffle_vector(lo_, hi_, even))
                        if 2 * p_ + 1 < kw:
                            xv.append(builder.shuffle_vector(lo_, hi_, odd))
                    rows[k_].append([_fold(combine, xv)] if rows_first else xv)
            for k_, (q0, (smask, stored), _, _, acc) in enumerate(per):
                sums = []
                for u in range(steps):
                    acc_u = builder.load(acc[u]) if u else fill
                    for e in range(2):
                        i = 2 * u + e
                        if i < kh and rows_first:
                            acc_u = rows[k_][e][0] if i == 0 else combine(i * kw, rows[k_][e][0],
                                                                          acc_u)
                        elif i < kh:
                            for j in range(kw):
                                acc_u = combine(i * kw + j, rows[k_][e][j], acc_u)
                    sums.append(acc_u)
                done.append((q0, smask, stored, acc, sums))
            store_and_roll(t, steps, done, order)

    by_columns(rows2, (2,) if kh * kw <= 9 else ())


#: how many rows ahead :func:`_plane_loops` prefetches the input rows it will read and the
#: output rows it will write (:func:`_row_out`). A plane goes by columns of vectors down its
#: rows, so every step reads and writes new cache lines a row apart, which the hardware's
#: prefetchers did not fetch in time on planes larger than the L1 cache. Measured on planes
#: that the layer before has just written (as in a model), one thread, us, without / with:
#: depthwise 3x3 [1, 32, 112, 112] 208 -> 114, [1, 96, 112, 112] at stride 2 414 -> 140,
#: [1, 144, 56, 56] 223 -> 121, at stride 2 159 -> 53, [1, 192, 28, 28] 58 -> 43; ResNet's
#: 3x3 max pool [1, 64, 112, 112] 364 -> 150
PLANE_AHEAD, OUT_AHEAD = 16, 8


def _deinterleave(lanes: int, size: int):
    """The shuffles of a stride-2 plane kernel: ``(even, odd, order)``, the lanes of a pair
    of vectors (``lanes`` elements of ``size`` bytes each) that give a tap's inputs for the
    even and the odd taps, and the shuffle that puts a vector of sums back in the outputs'
    order (None: already in it). In vectors of 32 bytes (AVX) the pair's even elements are
    picked within each 16-byte half, as AVX's one-instruction shuffles do; every tap's inputs
    then lie in the same mixed order, and so do the sums, set in order once before their
    store (picked in order, each pair took two more cross-half permutes: on Zen 1, a
    depthwise 3x3 layer at stride 2 was bound by its shuffles)."""
    ity = ir.VectorType(ir.IntType(32), lanes)
    if lanes * size != 32:
        return (*(ir.Constant(ity, [2 * t + o for t in range(lanes)]) for o in (0, 1)), None)
    half = 16 // size  # (elements in a 16-byte half)
    picked = [k * half + 2 * i + h * lanes for k in range(lanes // half) for h in range(2)
              for i in range(half // 2)]  # (the elements of the pair at each lane, even taps)
    order = [picked.index(next(e for e in picked if e // 2 == q)) for q in range(lanes)]
    return (*(ir.Constant(ity, [e + o for e in picked]) for o in (0, 1)),
            ir.Constant(ity, order) if order != list(range(lanes)) else None)


def _row_out(builder, dptr, d0v, owv, row, q0, vty):
    """The vector pointer of outputs ``q0 ..`` of output row ``row`` of a plane ``ow`` wide at
    ``dptr[d0:]``; the same vector :data:`OUT_AHEAD` rows on prefetched for writing."""
    i64 = ir.IntType(64)
    at_ = builder.add(d0v, builder.add(builder.mul(row, owv), q0))
    on = builder.add(at_, builder.mul(owv, ir.Constant(i64, OUT_AHEAD)))
    for e in (0, vty.count - 1):
        _prefetch(builder, dptr, builder.add(on, ir.Constant(i64, e)), write=True)
    return builder.bitcast(builder.gep(dptr, [at_]), vty.as_pointer())


def _fold(combine, xs):
    """``xs`` combined left to right (``combine`` ignores the tap: see ``rows_first``)."""
    acc = xs[0]
    for x in xs[1:]:
        acc = combine(0, x, acc)
    return acc


def plane_kernel(kh: int, kw: int, stride: int):
    """A depthwise filter of ``kh x kw`` taps at stride ``stride`` (1 or 2, dilation 1) over one
    image plane, straight from the unpadded plane into the output plane:

        df[d0 + o * ow + q] = sum over i < kh, j < kw of wf[w0 + i * kw + j] *
                              xs[b0 + (o * s + i - pt) * w + q * s + j - pl]

    for ``o < oh``, ``q < ow``, a tap outside the ``h x w`` image reading zero
    (``plane(wf, w0, xs, b0, h, w, df, d0, oh, ow, pt, pl, bias, c0, ep, add, lo, hi)``; with
    ``ep`` true each sum stored through the epilogue ``minimum(maximum(sum + bias[c0], lo),
    hi)``, no add where ``add`` is false: see :func:`clamp_run`), by :func:`_plane_loops`
    (masked loads, no padded copy: its copies and their selects took most of a depthwise
    layer's time). Each output sums its products in tap order, every one a fused multiply-add
    onto zero first. The offsets are the caller's to keep in bounds; masked-off lanes read and
    write nothing."""

    @intrinsic
    def plane(typingctx, wf, w0, xs, b0, h, w, df, d0, oh, ow, pt, pl, bias, c0, ep, add, lo,
              hi):
        if not (isinstance(wf, types.Array) and isinstance(xs, types.Array)
                and isinstance(df, types.Array)):
            return None
        if wf.dtype != xs.dtype or wf.dtype != df.dtype or \
                wf.dtype not in (types.float32, types.float64):
            return None
        if not all(isinstance(t, types.Integer) for t in (w0, b0, h, w, d0, oh, ow, pt, pl)) or \
                not _epilogue_types(bias, c0, ep, add, lo, hi) or bias.dtype != wf.dtype:
            return None
        sig = types.void(wf, w0, xs, b0, h, w, df, d0, oh, ow, pt, pl, bias, c0, ep, add, lo,
                         hi)

        def codegen(context, builder, signature, args):
            at = signature.args
            wptr = context.make_array(at[0])(context, builder, args[0]).data
            xptr = context.make_array(at[2])(context, builder, args[2]).data
            dptr = context.make_array(at[6])(context, builder, args[6]).data
            w0v, b0v, hv, wv, d0v, ohv, owv, ptv, plv = (
                _offset(context, builder, at[i], args[i]) for i in (1, 3, 4, 5, 7, 8, 9, 10, 11))
            fty, size, lanes, vty, i64, zero, fma = _vectors(context, builder, at[0].dtype,
                                                             PLANE_BYTES)
            store = _masked(builder, vty, "store")
            align = ir.Constant(ir.IntType(32), size)
            wb = [_splat(builder, vty, builder.load(builder.gep(
                wptr, [builder.add(w0v, ir.Constant(i64, t))]))) for t in range(kh * kw)]
            bptr = context.make_array(at[12])(context, builder, args[12]).data
            c0v = _offset(context, builder, at[13], args[13])
            ep = _flag(context, builder, at[14], args[14])
            add = _flag(context, builder, at[15], args[15])
            apply, splat = _clamper(context, builder, at[0].dtype, vty, add, *(
                context.cast(builder, args[i], at[i], types.float64) for i in (16, 17)))
            nobias = cgutils.alloca_once_value(builder, ir.Constant(fty, 0.0))
            bvec = splat(builder.load(builder.select(add, builder.gep(bptr, [c0v]), nobias)))

            def put(row, q0, s, smask, stored):
                p = _row_out(builder, dptr, d0v, owv, row, q0, vty)
                with builder.if_else(ep) as (yes, no):
                    with yes:
                        _store(builder, store, apply(s, bvec), p, align, smask, stored)
                    with no:
                        _store(builder, store, s, p, align, smask, stored)

            xsize = context.make_array(at[2])(context, builder, args[2]).nitems
            _plane_loops(builder, xptr, (b0v, hv, wv, ohv, owv, ptv, plv, xsize), vty, align,
                         kh, kw,
                         stride, zero, lambda t, x, s: builder.call(fma, [wb[t], x, s]), put)
            return context.get_dummy_value()

        return sig, codegen

    return plane


def _larger(builder, x, m):
    """``x`` where it replaces the max so far ``m`` (larger, or NaN), unless ``m`` is NaN:
    NumPy's ``max`` taken in order (the first of equal values kept, ``-0.0`` before ``0.0``)."""
    take = builder.and_(builder.fcmp_unordered(">", x, m), builder.fcmp_ordered("ord", m, m))
    return builder.select(take, x, m)


def pool_plane_kernel(k: int, stride: int, mean: bool = False):
    """The max pool of ``k x k`` windows at stride ``stride`` (1 or 2) over one plane:
    ``pool(xs, b0, h, w, df, d0, oh, ow, pt, pl)`` writes ``df[d0 + o * ow + q]`` = the max of
    the window's inputs inside the ``h x w`` image at ``xs[b0:]`` (rows ``o * s - pt`` on,
    columns ``q * s - pl`` on), ``-inf`` where there are none, by :func:`_plane_loops`. As
    NumPy's ``max``: a NaN in a window makes its max NaN; otherwise the first of equal values
    is kept (``-0.0`` before ``0.0``).

    ``mean``: the average pool, ``pool(xs, b0, h, w, df, d0, oh, ow, pt, pl, exclusive)``: the
    window's inputs inside the image summed (each input row's taps first, then the rows: the
    same sums, in another order than a window's own) and divided by their count where
    ``exclusive``, else by the window's length, clipped at the padding past the image
    (``pdjit.ops.pool``'s rule: ``min(o * s - pt + k, h + pt) - (o * s - pt)`` rows)."""

    def codegen(context, builder, signature, args):
        at = signature.args
        xptr = context.make_array(at[0])(context, builder, args[0]).data
        dptr = context.make_array(at[4])(context, builder, args[4]).data
        b0v, hv, wv, d0v, ohv, owv, ptv, plv = (
            _offset(context, builder, at[i], args[i]) for i in (1, 2, 3, 5, 6, 7, 8, 9))
        fty, size, lanes, vty, i64, zero, _ = _vectors(context, builder, at[0].dtype,
                                                       PLANE_BYTES)
        store = _masked(builder, vty, "store")
        align = ir.Constant(ir.IntType(32), size)
        if mean:
            excl = builder.icmp_signed("!=", _offset(context, builder, at[10], args[10]),
                                       ir.Constant(i64, 0))
            divisor = _window_counts(builder, vty, hv, wv, ptv, plv, k, stride, excl)

        def put(row, q0, s, smask, stored):
            if mean:
                s = builder.fdiv(s, divisor(row, q0))
            _store(builder, store, s, _row_out(builder, dptr, d0v, owv, row, q0, vty), align,
                   smask, stored)

        xsize = context.make_array(at[0])(context, builder, args[0]).nitems
        fill = zero if mean else _splat(builder, vty, ir.Constant(fty, float("-inf")))

        def combine(t, x, m):
            return builder.fadd(m, x) if mean else _larger(builder, x, m)

        _plane_loops(builder, xptr, (b0v, hv, wv, ohv, owv, ptv, plv, xsize), vty, align,
                     k, k, stride, fill, combine, put, rows_first=True)
        return context.get_dummy_value()

    def typed(xs, df, ints):
        return isinstance(xs, types.Array) and isinstance(df, types.Array) and \
            xs.dtype == df.dtype and xs.dtype in (types.float32, types.float64) and \
            all(isinstance(t, (types.Integer, types.Boolean)) for t in ints)

    if mean:
        @intrinsic
        def pool(typingctx, xs, b0, h, w, df, d0, oh, ow, pt, pl, exclusive):
            if not typed(xs, df, (b0, h, w, d0, oh, ow, pt, pl, exclusive)):
                return None
            return types.void(xs, b0, h, w, df, d0, oh, ow, pt, pl, exclusive), codegen
        return pool

    @intrinsic
    def pool(typingctx, xs, b0, h, w, df, d0, oh, ow, pt, pl):
        if not typed(xs, df, (b0, h, w, d0, oh, ow, pt, pl)):
            return None
        return types.void(xs, b0, h, w, df, d0, oh, ow, pt, pl), codegen

    return pool


def _window_counts(builder, vty, hv, wv, ptv, plv, k: int, stride: int, excl):
    """``divisor(row, q0)``: the vector of an average pool's divisors for the outputs ``q0 ..``
    of output row ``row`` (i64 values) of ``k x k`` windows at ``stride`` over an ``h x w``
    image padded by ``pt`` rows and ``pl`` columns before it: per axis, the window's inputs
    inside the image where ``excl`` (an i1), else its length clipped at the padding past the
    image (``pdjit.ops.pool``'s rule); the rows' count times the columns'."""
    ity = ir.VectorType(ir.IntType(32), vty.count)

    def splat(v):  # (an i64 value in every lane, as i32)
        return _splat(builder, ity, builder.trunc(v, ity.element))

    def const(v):
        return ir.Constant(ity, [v] * vty.count)

    def smin(a, b):
        return builder.select(builder.icmp_signed("<", a, b), a, b)

    def count(first, size, pad):
        """The count along one axis of the windows starting at ``first`` (vectors)."""
        end = builder.add(first, const(k))
        inside = builder.sub(smin(end, size), builder.select(
            builder.icmp_signed(">", first, const(0)), first, const(0)))
        length = builder.sub(smin(end, builder.add(size, pad)), first)
        return builder.select(splat_excl, inside, length)

    splat_excl = _splat(builder, ir.VectorType(ir.IntType(1), vty.count), excl)
    step, iota = const(stride), ir.Constant(ity, list(range(vty.count)))
    h, w, pt, pl = splat(hv), splat(wv), splat(ptv), splat(plv)

    def divisor(row, q0):
        rows = count(builder.sub(builder.mul(splat(row), step), pt), h, pt)
        cols = count(builder.sub(builder.mul(builder.add(splat(q0), iota), step), pl), w, pl)
        return builder.sitofp(builder.mul(rows, cols), vty)

    return divisor


def _pool22_plane(mean: bool):
    """The max (``mean``: average) pool of 2x2 windows at stride 2 over one plane whose
    windows all lie inside it: ``pool(xs, b0, w, df, d0, oh, ow)`` writes ``df[d0 + o * ow +
    q]`` = the max (as :func:`_larger` takes it) or the mean of ``xs[b0 + (2 * o + i) * w +
    2 * q + j]`` for ``i, j < 2``, for ``o < oh``, ``q < ow`` (``2 * ow <= w``): each column's
    two rows, then the two columns (the mean: ``((x00 + x10) + (x01 + x11)) * 0.25``). Per
    output row, a vector of outputs from two vectors of each input row: the rows combined,
    then the even and odd lanes of the pair (shuffles); the last vector masked. (The same
    loops in Numba stayed scalar: 2-4x slower on LeNet's and VGG's pools.) The offsets are
    the caller's to keep in bounds."""

    @intrinsic
    def pool(typingctx, xs, b0, w, df, d0, oh, ow):
        return _pool22_intrinsic(xs, b0, w, df, d0, oh, ow, mean)
    return pool


def _pool22_intrinsic(xs, b0, w, df, d0, oh, ow, mean):
    if not (isinstance(xs, types.Array) and isinstance(df, types.Array)) or \
            xs.dtype != df.dtype or xs.dtype not in (types.float32, types.float64):
        return None
    if not all(isinstance(t, types.Integer) for t in (b0, w, d0, oh, ow)):
        return None
    sig = types.void(xs, b0, w, df, d0, oh, ow)

    def codegen(context, builder, signature, args):
        at = signature.args
        xptr = context.make_array(at[0])(context, builder, args[0]).data
        dptr = context.make_array(at[3])(context, builder, args[3]).data
        b0v, wv, d0v, ohv, owv = (_offset(context, builder, at[i], args[i])
                                  for i in (1, 2, 4, 5, 6))
        fty, size, lanes, vty, i64, zero, _ = _vectors(context, builder, at[0].dtype)
        load, store = _masked(builder, vty, "load"), _masked(builder, vty, "store")
        align = ir.Constant(ir.IntType(32), size)
        i32 = ir.IntType(32)
        i32s = ir.VectorType(i32, lanes)
        iota = ir.Constant(i32s, list(range(lanes)))
        even = ir.Constant(i32s, [2 * t for t in range(lanes)])
        odd = ir.Constant(i32s, [2 * t + 1 for t in range(lanes)])
        quarter = _splat(builder, vty, ir.Constant(fty, 0.25))

        def c(v):
            return ir.Constant(i64, v)

        def ptr(base, at_):
            return builder.bitcast(builder.gep(base, [at_]), vty.as_pointer())

        def below(start, end):
            """The lanes ``start + lane < end`` (compared in 32-bit lanes: one mask register)."""
            return builder.icmp_signed(
                "<", builder.add(_splat(builder, i32s, builder.trunc(start, i32)), iota),
                _splat(builder, i32s, builder.trunc(end, i32)))

        def vector(r0, q0, masked):
            """Outputs ``q0..q0 + lanes`` of the row whose inputs start at ``r0``."""
            halves = []
            for h2 in range(2):
                col = builder.add(builder.mul(q0, c(2)), c(h2 * lanes))
                rows = []
                for i in range(2):
                    at_ = builder.add(builder.add(r0, builder.mul(wv, c(i))), col)
                    if masked:
                        mask = below(col, builder.mul(owv, c(2)))
                        rows.append(builder.call(load, [ptr(xptr, at_), align, mask, zero]))
                    else:
                        rows.append(builder.load(ptr(xptr, at_), align=size))
                halves.append(builder.fadd(rows[0], rows[1]) if mean else
                              _larger(builder, rows[1], rows[0]))
            odds = builder.shuffle_vector(halves[0], halves[1], odd)
            evens = builder.shuffle_vector(halves[0], halves[1], even)
            if mean:
                return builder.fmul(builder.fadd(evens, odds), quarter)
            return _larger(builder, odds, evens)

        nfull = builder.sdiv(owv, c(lanes))
        done = builder.mul(nfull, c(lanes))
        with cgutils.for_range(builder, ohv) as oloop:
            o = oloop.index
            r0 = builder.add(b0v, builder.mul(builder.mul(o, c(2)), wv))
            y0 = builder.add(d0v, builder.mul(o, owv))
            with cgutils.for_range(builder, nfull) as qloop:
                q0 = builder.mul(qloop.index, c(lanes))
                builder.store(vector(r0, q0, False), ptr(dptr, builder.add(y0, q0)),
                              align=size)
            with builder.if_then(builder.icmp_signed("<", done, owv)):
                builder.call(store, [vector(r0, done, True), ptr(dptr, builder.add(y0, done)),
                                     align, below(done, owv)])
        return context.get_dummy_value()

    return sig, codegen


max22_plane = _pool22_plane(False)
avg22_plane = _pool22_plane(True)


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
