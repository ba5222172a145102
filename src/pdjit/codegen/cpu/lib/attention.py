"""Attention's core in one kernel: ``out = softmax(alpha * q @ k^T + mask) @ v`` over the last
axis, for every matrix of a batch (the op ``scaled_dot_product_attention`` that the inference
pass ``fuse_attention`` builds from a program's products, mask add and softmax).

Each matrix of the batch (a head of a sample) is computed by one thread from start to end:
``alpha * k^T`` packed into panels (``pgemm.pack_scaled``'s layout: the scale applied as it
packs, as the unfused product applies it), the scores ``q @ (alpha k^T)`` of a block of query
rows on pdjit's packed GEMM tile (:data:`pgemm._micro`) into a buffer of the thread's that
stays in its cache, the mask added and the softmax taken row by row there (the max,
``exp(max(x - max, -64))``, the sum, the division: the max and the sum over whole vectors,
:func:`_row_reduction`), then ``v`` packed and the block's rows of ``out`` computed from the
buffer. No scores tensor of the whole batch is written or read again, and nothing is
transposed: every operand is read in place through its strides (``q``, ``k``, ``v`` and
``out`` may be the heads' views of a ``[batch, seq, heads, dim]`` projection; a broadcast
dim, of the mask or of an operand, is a stride of 0).
"""
import math

import llvmlite.ir as ir
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic, overload, register_jitable

from pdjit.codegen.cpu import mathfuncs as _m
from pdjit.codegen.cpu import replay, threads
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import by_address, compile_cost, jit, jobs, pjit
from pdjit.codegen.cpu.lib.conv import split_work
from pdjit.codegen.cpu.lib.pgemm import MR, NV, _micro, _panel_row, packed_b_size
from pdjit.codegen.cpu.lib.tile import TILE_BYTES, _splat, _vectors

__all__ = ["scaled_attention"]

#: Paddle's CPU softmax clips ``x - max`` at this value before the exponential
CLIP = -64.0
#: the scores of a block of query rows kept in a thread's buffer (bytes: in its L2 cache)
_BLOCK_BYTES = 1 << 17
#: multiply-adds from which the batch's matrices are split over the loop threads
TEAM_MIN_WORK = 1 << 20


@jit
def _at(st, row, h):
    """The offset of matrix ``h`` (C order over the batch dims ``st[5, :-2]``) in operand
    ``row`` of the strides table ``st``."""
    nl = st.shape[1] - 2
    o = 0
    for i in range(nl - 1, -1, -1):
        o += (h % st[5, i]) * st[row, i]
        h //= st[5, i]
    return o


@by_address
@jit
def _heads(qf, kf, vf, mf, of, st, alpha, sq, sk, d, dv, h0, h1):
    """Matrices ``h0 .. h1`` of the batch (see the module): the operands flat from their
    first elements, their strides in the table ``st`` (rows q, k, v, mask, out: the batch
    dims', 0 where broadcast, then the rows' and the columns'; row 5: the batch dims); the
    columns of q, the mask and out unit; ``mf`` empty: no mask."""
    ldq, skn, skd, svn, svd = st[0, -2], st[1, -2], st[1, -1], st[2, -2], st[2, -1]
    ldm, ldo = st[3, -2], st[4, -2]
    nr = NV * (TILE_BYTES // qf.itemsize)
    kp = np.empty(packed_b_size(d, sk, qf.itemsize), qf.dtype)
    vp = np.empty(packed_b_size(sk, dv, qf.itemsize), qf.dtype)
    rb = max(MR, min(sq, (_BLOCK_BYTES // max(1, sk * qf.itemsize)) // MR * MR))
    s = np.empty(rb * sk, qf.dtype)
    none = qf[:0]
    clip = np.empty(1, qf.dtype)  # (in the data's type)
    clip[0] = CLIP
    lo = -np.inf
    hi = np.inf
    kpan = (sk + nr - 1) // nr
    vpan = (dv + nr - 1) // nr
    for h in range(h0, h1):
        qo, ko, vo, mo, oo = _at(st, 0, h), _at(st, 1, h), _at(st, 2, h), _at(st, 3, h), \
            _at(st, 4, h)
        for j in range(kpan):  # alpha * k^T: panel j holds keys n0 .. n0 + w, a row per dim
            n0 = j * nr
            w = min(nr, sk - n0)
            for c in range(d):
                _panel_row(kf, ko + n0 * skn + c * skd, skn, w, alpha, kp, (j * d + c) * nr)
        for j in range(vpan):  # v: panel j holds dims n0 .. n0 + w, a row per key
            n0 = j * nr
            w = min(nr, dv - n0)
            for c in range(sk):
                _panel_row(vf, vo + c * svn + n0 * svd, svd, w, 1.0, vp, (j * sk + c) * nr)
        for r0 in range(0, sq, rb):
            rows = min(rb, sq - r0)
            for j in range(kpan):
                n0 = j * nr
                for i in range(0, rows, MR):
                    _micro(qf, qo + (r0 + i) * ldq, ldq, min(MR, rows - i), d, kp,
                           j * d * nr, s, i * sk + n0, sk, min(nr, sk - n0), none, n0, none,
                           lo, hi)
            for i in range(rows):
                mo_ = mo + (r0 + i) * ldm
                _softmax_row(s[i * sk:(i + 1) * sk], mf[mo_:mo_ + sk] if mf.size else mf,
                             clip[0])
            for j in range(vpan):
                n0 = j * nr
                for i in range(0, rows, MR):
                    _micro(s, i * sk, sk, min(MR, rows - i), sk, vp, j * sk * nr, of,
                           oo + (r0 + i) * ldo + n0, ldo, min(nr, dv - n0), none, n0, none,
                           lo, hi)


def _row_reduction(kind: str):
    """An intrinsic ``f(x, n)``: the max (``kind`` "max") or the sum ("sum") of ``x[:n]`` (a
    1-D float array; ``n`` a multiple of a vector's lanes, 64 bytes), one vector accumulator
    over the row, its lanes combined at the end. (Numba's loops at pdjit's level keep a
    reduction scalar, four partial results at best: 0.14 ns an element where this takes
    0.03-0.05 on rows of 128-512.) The max ignores a NaN as the scalar chains do (the row's
    softmax is NaN all the same); the sum adds in another order than a scalar loop."""
    @intrinsic
    def reduce_row(typingctx, x, n):
        if not isinstance(x, types.Array) or x.ndim != 1 or \
                x.dtype not in (types.float32, types.float64):
            return None

        def codegen(context, builder, signature, args):
            at = signature.args[0]
            fty, size, lanes, vty, i64, zero, _ = _vectors(context, builder, at.dtype)
            data = context.make_array(at)(context, builder, args[0]).data
            start = zero if kind == "sum" else \
                _splat(builder, vty, ir.Constant(fty, float("-inf")))
            acc = cgutils.alloca_once_value(builder, start)
            count = builder.udiv(args[1], ir.Constant(i64, lanes))
            with cgutils.for_range(builder, count) as loop:
                p = builder.gep(data, [builder.mul(loop.index, ir.Constant(i64, lanes))])
                v = builder.load(builder.bitcast(p, vty.as_pointer()), align=size)
                a = builder.load(acc)
                if kind == "max":
                    r = builder.select(builder.fcmp_ordered(">", v, a), v, a)
                else:
                    r = builder.fadd(a, v)
                builder.store(r, acc)
            el = "f32" if size == 4 else "f64"
            if kind == "max":
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(fty, [vty]),
                                                    f"llvm.vector.reduce.fmax.v{lanes}{el}")
                return builder.call(fn, [builder.load(acc)], fastmath=("nnan", "nsz"))
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(fty, [fty, vty]),
                                                f"llvm.vector.reduce.fadd.v{lanes}{el}")
            return builder.call(fn, [ir.Constant(fty, -0.0), builder.load(acc)],
                                fastmath=("reassoc",))
        return x.dtype(x, types.intp), codegen
    return reduce_row


_row_max, _row_sum = _row_reduction("max"), _row_reduction("sum")


@jit
def _softmax_row(x, m, clip):
    """Softmax of the row ``x`` in place, the row ``m`` added first where it is not empty: the
    max (a vector's lanes of partial results, :func:`_row_reduction`; the rest one by one),
    ``exp(max(x - max, clip))``, their sum (the same), the division. (Rows as views, indexed
    from 0: loops that vectorise.)"""
    n = x.shape[0]
    if m.shape[0]:
        for j in range(n):
            x[j] = x[j] + m[j]
    nb = n - n % (TILE_BYTES // x.itemsize)
    mx = _row_max(x, nb)  # (-inf and 0 for no whole vector)
    for j in range(nb, n):
        mx = max(mx, x[j])
    for j in range(n):
        x[j] = _m.exp(max(x[j] - mx, clip))
    t = _row_sum(x, nb)
    for j in range(nb, n):
        t = t + x[j]
    for j in range(n):
        x[j] = x[j] / t


@pjit
def _heads_parts(qf, kf, vf, mf, of, st, alpha, sq, sk, d, dv, n, parts):
    """:func:`_heads` of the ``n`` matrices of the batch in ``parts`` ranges, one per thread
    of a parallel loop (``lib.team``)."""
    for p in numba.prange(parts):
        _heads(qf, kf, vf, mf, of, st, alpha, sq, sk, d, dv, p * n // parts,
               (p + 1) * n // parts)


def _operand(x, lead):
    """``(flat, strides)``: ``x`` (non-negative strides; else a copy) as a flat view of the
    memory from its first element (no copy), and its strides in elements over the batch dims
    ``lead`` (NumPy's broadcasting: 0 where ``x`` has 1 or no such dim) and its last two (0
    along rows where it has one)."""
    size = x.itemsize
    if any(s < 0 or s % size for s in x.strides):
        x = _copy(x)
    b = x.base
    if x.flags.c_contiguous:
        flat = x.reshape(-1)
    elif isinstance(b, np.ndarray) and b.dtype == x.dtype and b.flags.c_contiguous and \
            b.ctypes.data == x.ctypes.data:  # (a view from its base's start: a transpose's)
        flat = b.reshape(-1)
    else:
        extent = 1 + sum((n - 1) * s // size for n, s in zip(x.shape, x.strides))
        flat = np.lib.stride_tricks.as_strided(x, shape=(extent,), strides=(size,))
    if not flat.flags.writeable:  # (one compiled kernel for every operand)
        return _operand(_copy(x), lead)
    sh, st = x.ndim - 2 - len(lead), x.strides
    out = [st[i + sh] // size if i + sh >= 0 and x.shape[i + sh] != 1 else 0
           for i in range(len(lead))]
    return flat, out + [st[-2] // size if x.shape[-2] != 1 else 0, st[-1] // size]


def _unit_rows(x):
    """``x`` with unit strides along its last dim (a copy where it has not)."""
    return x if x.shape[-1] <= 1 or x.strides[-1] == x.itemsize else _copy(x)


def _copy(x, dtype=None):
    """A C-contiguous copy of ``x`` (of ``dtype``: cast), made again at each replay of a
    recording (:func:`scaled_attention` is declared ``"leaves"``)."""
    c = np.empty(x.shape, x.dtype if dtype is None else dtype)
    replay.kernel_call(_copy_into, c, x)
    return c


def _copy_into(dst, src):
    dst[...] = src


def scaled_attention(q, k, v, mask, alpha, out):
    """``out = softmax(alpha * q @ k^T + mask) @ v`` over the last two dims of every matrix
    of the batch (see the module): ``q`` ``[..., Sq, D]``, ``k`` ``[..., Sk, D]``, ``v``
    ``[..., Sk, Dv]``, ``out`` ``[..., Sq, Dv]`` (written), all of one float dtype, their
    batch dims broadcast (NumPy's rule) to ``out``'s, any strides (views); ``mask`` broadcast
    to ``[..., Sq, Sk]``, or ``None``.
    The matrices split over the loop threads from :data:`TEAM_MIN_WORK` multiply-adds, by
    the parallel loop where it is ready (else over ``split_work``'s helpers), each as one
    thread computes it."""
    lead, (sq, d), (sk, dv) = out.shape[:-2], q.shape[-2:], v.shape[-2:]
    fits = q.shape[:-2] == k.shape[:-2] == v.shape[:-2] == lead
    if not fits:
        try:
            fits = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], lead) == lead
        except ValueError:
            fits = False
    if not fits or k.shape[-2:] != (sk, d) or out.shape[-2:] != (sq, dv) or \
            not q.dtype == k.dtype == v.dtype == out.dtype or q.dtype.kind != "f":
        raise ValueError(
            f"pdjit: scaled_attention: q {list(q.shape)}, k {list(k.shape)}, v "
            f"{list(v.shape)} and out {list(out.shape)} do not fit: expected [..., Sq, D], "
            f"[..., Sk, D], [..., Sk, Dv], [..., Sq, Dv] of one float dtype")
    if min(sq, sk, d, dv) == 0 or not all(n for n in lead):
        replay.kernel_call(_numpy_into, out, q, k, v, mask, alpha)
        return
    target = out
    if out.strides[-1] != out.itemsize and dv > 1:
        out = np.empty(out.shape, out.dtype)
    qf, qs = _operand(_unit_rows(q), lead)
    kf, ks = _operand(k, lead)
    vf, vs = _operand(v, lead)
    of, os_ = _operand(out, lead)
    if mask is None:
        mf, ms = np.empty(0, q.dtype), [0] * (len(lead) + 2)
    else:
        m = mask if isinstance(mask, np.ndarray) and mask.dtype == q.dtype else \
            _copy(np.asarray(mask), q.dtype)
        scores = lead + (sq, sk)
        if m.ndim > len(scores) or any(a != 1 and a != b for a, b in zip(m.shape[::-1],
                                                                         scores[::-1])):
            raise ValueError(f"pdjit: scaled_attention: the mask {list(m.shape)} does not "
                             f"broadcast to the scores {list(scores)}")
        if m.ndim < 2:
            m = m.reshape((1,) * (2 - m.ndim) + m.shape)
        if m.shape[-1] != sk or m.strides[-1] != m.itemsize:
            m = _copy(np.broadcast_to(m, m.shape[:-1] + (sk,)))
        mf, ms = _operand(m, lead)
    st = np.array([qs, ks, vs, ms, os_, list(lead) + [0, 0]], np.int64)
    n = math.prod(lead)
    call = (qf, kf, vf, mf, of, st, float(alpha), sq, sk, d, dv)
    work = n * sq * sk * (d + dv)
    parts = min(threads.loop_threads(), n) if work >= TEAM_MIN_WORK else 1
    if parts < 2:
        replay.kernel_call(_heads, *call, 0, n)
    elif not team.run(_heads_parts, call + (n, parts)):
        split_work(_heads, n, work, *call, head=len(call))  # (on helpers until it is ready)
    if out is not target:
        replay.kernel_call(_copy_into, target, out)


replay.declare("leaves", scaled_attention)


# ---- inside compiled code (a native driver: one thread, its slice of the batch) ---------------
@intrinsic
def _span(typingctx, x, extent):
    """A 1-D C-contiguous array of ``extent`` elements from ``x``'s first element, sharing its
    memory (and its reference): ``_flat``'s view in compiled code."""
    if not isinstance(x, types.Array):
        return None
    rt = types.Array(x.dtype, 1, "C")

    def codegen(context, builder, signature, args):
        # (imported here: numba.np.arrayobj takes ~13 ms to import, at compile time only)
        from numba.np.arrayobj import populate_array

        src = context.make_array(signature.args[0])(context, builder, args[0])
        out = context.make_array(rt)(context, builder)
        size = context.get_constant(types.intp, context.get_abi_sizeof(
            context.get_data_type(x.dtype)))
        populate_array(out, data=src.data, shape=[args[1]], strides=[size], itemsize=size,
                       meminfo=src.meminfo)
        context.nrt.incref(builder, signature.args[0], args[0])
        return out._getvalue()
    return rt(x, types.intp), codegen


@register_jitable
def _operand_native(x, st, row, shape, nl):
    """:func:`_operand` in compiled code: ``x``'s flat view (its strides non-negative, as
    views' are), its strides written into row ``row`` of the table ``st``."""
    r = x.ndim
    size = x.itemsize
    extent = 1
    for i in range(r):
        extent += (x.shape[i] - 1) * (x.strides[i] // size)
    sh = r - (nl + 2)  # x's dim of batch dim i: i + sh
    for i in range(nl):
        st[row, i] = x.strides[i + sh] // size if i + sh >= 0 and x.shape[i + sh] != 1 else 0
    st[row, nl] = x.strides[r - 2] // size if r >= 2 and x.shape[r - 2] != 1 else 0
    st[row, nl + 1] = x.strides[r - 1] // size
    return _span(x, extent)


@register_jitable
def _operands_native(q, k, v, out):
    """``(sq, d, sk, dv, whether there is anything to compute)`` (no keys: ``out`` zeroed)."""
    r = q.ndim
    sq, d, sk, dv = q.shape[r - 2], q.shape[r - 1], k.shape[r - 2], v.shape[r - 1]
    if k.shape[r - 1] != d or v.shape[r - 2] != sk or out.shape[r - 2] != sq or \
            out.shape[r - 1] != dv:
        raise ValueError("pdjit: scaled_attention: q, k, v and out do not fit")
    for i in range(r - 2):
        for x in (q.shape[i], k.shape[i], v.shape[i]):
            if x != out.shape[i] and x != 1:
                raise ValueError("pdjit: scaled_attention: the batch dims do not broadcast")
    if sk == 0:
        out[...] = 0
    return sq, d, sk, dv, sq != 0 and dv != 0 and sk != 0 and out.size != 0


def _mask_rows(mask, sk):
    """A mask of rank 2 or more whose rows are ``sk`` contiguous values: ``mask`` itself, or
    a copy with its keys broadcast, its rows made contiguous."""


@overload(_mask_rows)
def _mask_rows_native(mask, sk):
    if mask.ndim < 2:
        pad = (1,) * (2 - mask.ndim)
        return lambda mask, sk: _mask_rows(np.ascontiguousarray(mask).reshape(pad + mask.shape),
                                           sk)

    def impl(mask, sk):
        last = mask.ndim - 1
        if mask.shape[last] == sk and mask.strides[last] == mask.itemsize:
            return mask
        return np.ascontiguousarray(np.broadcast_to(mask, mask.shape[:-1] + (sk,)))
    return impl


@overload(scaled_attention)
def _attention_native(q, k, v, mask, alpha, out):
    """One thread (a native driver's slice of the batch runs on its own); the same bits."""
    def run(q, k, v, mf, st, alpha, out, sq, sk, d, dv):
        r = out.ndim
        nl = r - 2
        n = 1
        for i in range(nl):
            st[5, i] = out.shape[i]
            n *= out.shape[i]
        qc = q if q.strides[q.ndim - 1] == q.itemsize else np.ascontiguousarray(q)
        qf = _operand_native(qc, st, 0, out.shape, nl)
        kf = _operand_native(k, st, 1, out.shape, nl)
        vf = _operand_native(v, st, 2, out.shape, nl)
        oc = out if out.strides[r - 1] == out.itemsize else np.empty(out.shape, out.dtype)
        of = _operand_native(oc, st, 4, out.shape, nl)
        _heads(qf, kf, vf, mf, of, st, alpha, sq, sk, d, dv, 0, n)
        if oc is not out:
            out[...] = oc
    run = register_jitable(run)

    if isinstance(mask, (types.NoneType, types.Omitted)) or mask is None:
        def impl(q, k, v, mask, alpha, out):
            sq, d, sk, dv, some = _operands_native(q, k, v, out)
            if some:
                st = np.zeros((6, out.ndim), np.int64)
                run(q, k, v, np.empty(0, q.dtype), st, alpha, out, sq, sk, d, dv)
        return impl

    def impl_mask(q, k, v, mask, alpha, out):
        sq, d, sk, dv, some = _operands_native(q, k, v, out)
        if not some:
            return
        r, mr = out.ndim, mask.ndim
        if mr > r:
            raise ValueError("pdjit: scaled_attention: the mask does not broadcast to the "
                             "scores")
        for i in range(mr):
            want = sk if i == mr - 1 else (sq if i == mr - 2 else out.shape[r - mr + i])
            if mask.shape[i] != 1 and mask.shape[i] != want:
                raise ValueError("pdjit: scaled_attention: the mask does not broadcast to "
                                 "the scores")
        st = np.zeros((6, r), np.int64)
        mf = _operand_native(_mask_rows(mask, sk), st, 3, out.shape, r - 2)
        run(q, k, v, mf, st, alpha, out, sq, sk, d, dv)
    return impl_mask


def _numpy_into(out, q, k, v, mask, alpha):
    out[...] = _numpy(q, k, v, mask, alpha)


def _numpy(q, k, v, mask, alpha):
    """The same in NumPy (empty operands)."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(alpha)
    if mask is not None:
        s = s + mask
    e = np.exp(np.maximum(s - s.max(axis=-1, keepdims=True, initial=-np.inf),
                          q.dtype.type(CLIP))) if s.size else s
    return np.matmul(e / e.sum(axis=-1, keepdims=True), v) if s.size else \
        np.zeros(q.shape[:-1] + v.shape[-1:], q.dtype)


def _types(T):
    a = (T, 1)
    return (a, a, a, a, a, (np.int64, 2), float, int, int, int, int)


jobs("scaled_attention")(lambda T: [(_heads, _types(T) + (int, int))])
# (its split over the team: compiled ahead by warmup only, see lib.team.ready)
jobs("scaled_attention (warmup)")(lambda T: [(_heads_parts, _types(T) + (int, int))])
compile_cost(1.5, _heads, _heads_parts)

