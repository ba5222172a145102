"""Indexing kernels: gathers, scatters, tiling, scans and sorts that op lowerings call.

Every kernel sees its data through a few canonical views, so one compilation per dtype serves
every rank, axis and op:

- *rows* ``(A, N, B)``: the axis that is indexed (``N``) with everything before it folded into
  ``A`` and everything after it into ``B`` (``take_rows``, ``scatter_rows``, ``cumsum_rows``,
  ``argsort_rows``, ``put_along_rows``). ``lookup_table`` is ``A = 1``; ``index_select`` along
  ``dim`` and ``gather_nd`` (after ``nd_rows`` made linear row numbers) are the same call.
- *flat arrays with their dims as ``int64`` arrays* (``tile_nd``, ``untile_nd``,
  ``nonzero_index``, ``others_product``, ``extreme_share``): the rank is a value, not a
  type.

Indices arrive as ``int64``. ``wrap`` lets ``-N <= i < 0`` count from the end (Paddle 3.x's
``index_select``, ``gather_nd``, ``scatter``); any other index out of range raises
``IndexError``: the plan then re-runs the op's NumPy reference, which raises the error that
names the op and the index. Outputs are arguments (the driver allocates them).
"""
import math

import llvmlite.ir as ir
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic, overload, register_jitable

from pdjit.codegen.cpu import replay
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import compile_cost, jit, jobs, pjit
from pdjit.codegen.cpu.lib.tile import PLANE_BYTES, _offset, _vectors
from pdjit.codegen.cpu.threads import loop_threads, run_parts

__all__ = ["take_rows", "scatter_rows", "nd_rows", "tile_nd", "untile_nd", "cumsum_rows",
           "nonzero_index", "argsort_rows", "put_along_rows", "range_size", "range_fill",
           "mask_take", "mask_put", "others_product",
           "extreme_share", "permute_into"]

#: ``pad`` value meaning "no padding row"
NO_PAD = -(2 ** 63)


@jit
def _row(i, n, wrap):
    """Index ``i`` into ``0..n-1`` (negative ones from the end with ``wrap``), else -1."""
    if i < 0 and wrap:
        i += n
    if i < 0 or i >= n:
        return -1
    return i


@jit
def _checked_rows(idx, n, pad, wrap):
    """``idx`` as rows ``0..n-1`` (``-1`` where the index equals ``pad``); raises for one out
    of range."""
    rows = np.empty(idx.shape[0], np.int64)
    for m in range(idx.shape[0]):
        if idx[m] == pad:
            rows[m] = -1
            continue
        i = _row(idx[m], n, wrap)
        if i < 0:
            raise IndexError("pdjit: an index is out of range")
        rows[m] = i
    return rows


@jit
def take_rows(x, idx, pad, wrap, out):
    """``out[a, m, :] = x[a, idx[m], :]``; rows whose index equals ``pad`` are zeros."""
    A, N, B = x.shape
    M = idx.shape[0]
    if out.shape[0] != A or out.shape[1] != M or out.shape[2] != B:
        raise ValueError("pdjit: take_rows: the output does not fit")
    rows = _checked_rows(idx, N, pad, wrap)
    for a in range(A):
        xa, oa = x[a], out[a]
        for m in range(M):
            dst = oa[m]  # rows through views: indices from range() vectorise
            if rows[m] < 0:
                for b in range(B):
                    dst[b] = 0
            else:
                src = xa[rows[m]]
                for b in range(B):
                    dst[b] = src[b]


@jit
def scatter_rows(out, idx, upd, mode, pad, wrap):
    """Rows of ``upd`` (``(A, M, B)``) into ``out`` (``(A, N, B)``) at ``idx``: ``mode`` 0
    assigns (the last of repeated indices wins), 1 zeroes the indexed rows then adds (Paddle's
    ``scatter`` with ``overwrite=False``), 2 adds, 3 only zeroes the indexed rows (``upd``
    unread). Indices equal to ``pad`` are skipped."""
    A, N, B = out.shape
    M = idx.shape[0]
    if mode != 3 and (upd.shape[0] != A or upd.shape[1] != M or upd.shape[2] != B):
        raise ValueError("pdjit: scatter_rows: the updates do not fit")
    rows = _checked_rows(idx, N, pad, wrap)
    for a in range(A):
        oa = out[a]
        if mode == 1 or mode == 3:
            for m in range(M):
                if rows[m] >= 0:
                    dst = oa[rows[m]]
                    for b in range(B):
                        dst[b] = 0
        if mode == 3:
            continue
        ua = upd[a]
        for m in range(M):
            if rows[m] < 0:
                continue
            dst, src = oa[rows[m]], ua[m]
            if mode == 0:
                for b in range(B):
                    dst[b] = src[b]
            else:
                for b in range(B):
                    dst[b] += src[b]


@jit
def nd_rows(index, dims, rows):
    """``rows[m]`` = the linear row number of ``index[m, :]`` into leading ``dims`` (C order,
    negative entries from the end): ``gather_nd``'s rows of ``X`` viewed as
    ``(prod(dims), rest)``."""
    M, K = index.shape
    if dims.shape[0] != K or rows.shape[0] != M:
        raise ValueError("pdjit: nd_rows: the shapes do not fit")
    for m in range(M):
        r = 0
        for k in range(K):
            i = _row(index[m, k], dims[k], True)
            if i < 0:
                raise IndexError("pdjit: nd_rows: an index is out of range")
            r = r * dims[k] + i
        rows[m] = r


@jit
def _strides(dims):
    R = dims.shape[0]
    st = np.ones(R, np.int64)
    for k in range(R - 2, -1, -1):
        st[k] = st[k + 1] * dims[k + 1]
    return st


@jit
def _next_index(c, dims, n):
    """Advance the index ``c[:n]`` over ``dims[:n]`` by one, the last place fastest."""
    i = n - 1
    while i >= 0:
        c[i] += 1
        if c[i] < dims[i]:
            break
        c[i] = 0
        i -= 1


@jit
def _check_tiling(x, xdims, out, odims):
    R = xdims.shape[0]
    if odims.shape[0] != R or R == 0:
        raise ValueError("pdjit: tile: the ranks do not fit")
    p, q = 1, 1
    for k in range(R):
        if xdims[k] < 1 or odims[k] % xdims[k] != 0:
            raise ValueError("pdjit: tile: the dims do not fit")
        p *= xdims[k]
        q *= odims[k]
    if x.shape[0] != p or out.shape[0] != q:
        raise ValueError("pdjit: tile: the sizes do not fit")


@jit
def _tiling_plan(xdims, odims):
    """(k, block): dims ``k..`` agree (a contiguous block of ``block`` elements in both), dim
    ``k - 1`` is the innermost one tiled."""
    R = xdims.shape[0]
    k = R
    block = 1
    while k > 0 and xdims[k - 1] == odims[k - 1]:
        k -= 1
        block *= odims[k]
    return k, block


@jit
def tile_nd(x, xdims, out, odims):
    """``out[c] = x[c % xdims]`` over flat C-order arrays of dims ``xdims`` and ``odims``
    (each ``odims[k]`` a multiple of ``xdims[k]``): ``tile``, and broadcasting (``expand_v2``,
    ``expand_as_v2``) where ``xdims[k]`` is 1. Copies whole blocks of the trailing dims that
    are not tiled."""
    _check_tiling(x, xdims, out, odims)
    if out.shape[0] == 0:
        return
    k, block = _tiling_plan(xdims, odims)
    if k == 0:
        for t in range(block):
            out[t] = x[t]
        return
    xs = _strides(xdims)
    inner_o, inner_x = odims[k - 1], xdims[k - 1]
    span = inner_x * block  # a whole copy of dims k-1.. of X: contiguous in X and in Out
    c = np.zeros(k, np.int64)  # the odometer over dims 0..k-2 (c[k-1] unused)
    o = 0
    for _ in range(out.shape[0] // (block * inner_o)):
        base = 0
        for i in range(k - 1):
            base += (c[i] % xdims[i]) * xs[i]
        if span == 1:  # one value broadcast along the last dim
            v = x[base]
            dst = out[o:o + inner_o]
            for t in range(inner_o):
                dst[t] = v
            o += inner_o
        else:  # through slices: indices from range() are known >= 0, so the copy vectorises
            src = x[base:base + span]
            for _ in range(inner_o // inner_x):
                dst = out[o:o + span]
                for t in range(span):
                    dst[t] = src[t]
                o += span
        _next_index(c, odims, k - 1)


@jit
def untile_nd(g, xdims, dx, odims):
    """The gradient of :func:`tile_nd`: ``dx[c % xdims] += g[c]`` (``dx`` is zeroed first)."""
    _check_tiling(dx, xdims, g, odims)
    dx[:] = 0
    if g.shape[0] == 0:
        return
    k, block = _tiling_plan(xdims, odims)
    if k == 0:
        for t in range(block):
            dx[t] = g[t]
        return
    xs = _strides(xdims)
    inner_o, inner_x = odims[k - 1], xdims[k - 1]
    span = inner_x * block
    c = np.zeros(k, np.int64)
    o = 0
    for _ in range(g.shape[0] // (block * inner_o)):
        base = 0
        for i in range(k - 1):
            base += (c[i] % xdims[i]) * xs[i]
        if span == 1:
            src = g[o:o + inner_o]
            acc = dx[base]
            for t in range(inner_o):
                acc += src[t]
            dx[base] = acc
            o += inner_o
        else:
            dst = dx[base:base + span]
            for _ in range(inner_o // inner_x):
                src = g[o:o + span]
                for t in range(span):
                    dst[t] += src[t]
                o += span
        _next_index(c, odims, k - 1)


@jit
def cumsum_rows(x, exclusive, reverse, out):
    """Running sums along ``N`` of ``(A, N, B)``: from the end with ``reverse``; each sum leaves
    out its own element with ``exclusive`` (the first is 0). Sums in the data's type."""
    A, N, B = x.shape
    if out.shape != x.shape:
        raise ValueError("pdjit: cumsum_rows: the output does not fit")
    for a in range(A):
        for k in range(N):
            n = N - 1 - k if reverse else k
            p = n + 1 if reverse else n - 1
            if k == 0:
                for b in range(B):
                    out[a, n, b] = 0 if exclusive else x[a, n, b]
            elif exclusive:
                for b in range(B):
                    out[a, n, b] = out[a, p, b] + x[a, p, b]
            else:
                for b in range(B):
                    out[a, n, b] = out[a, p, b] + x[a, n, b]


@jit
def nonzero_index(c, dims, out):
    """The coordinates (rows of ``out``, ``(count, R)`` int64) of the nonzero elements of the
    flat C-order array ``c`` of dims ``dims``, in order."""
    R = dims.shape[0]
    if out.shape[1] != R:
        raise ValueError("pdjit: nonzero_index: the output does not fit")
    st = _strides(dims)
    m = 0
    for i in range(c.shape[0]):
        if c[i] != 0:
            if m >= out.shape[0]:
                raise ValueError("pdjit: nonzero_index: more nonzeros than rows")
            r = i
            for k in range(R):
                out[m, k] = r // st[k]
                r -= out[m, k] * st[k]
            m += 1
    if m != out.shape[0]:
        raise ValueError("pdjit: nonzero_index: fewer nonzeros than rows")


@jit
def argsort_rows(x, descending, out, idx):
    """Stable sort of each ``x[a, :, b]``: ``out`` the sorted values, ``idx`` their positions
    (ascending, or descending with equal values kept in their order of appearance)."""
    A, N, B = x.shape
    if out.shape != x.shape or idx.shape != x.shape:
        raise ValueError("pdjit: argsort_rows: the outputs do not fit")
    col = np.empty(N, x.dtype)
    for a in range(A):
        for b in range(B):
            if descending:  # a stable ascending sort of the reversed column, read backwards
                for n in range(N):
                    col[n] = x[a, N - 1 - n, b]
            else:
                for n in range(N):
                    col[n] = x[a, n, b]
            order = np.argsort(col, kind="mergesort")
            for n in range(N):
                if descending:
                    i = N - 1 - order[N - 1 - n]
                else:
                    i = order[n]
                idx[a, n, b] = i
                out[a, n, b] = x[a, i, b]


@jit
def put_along_rows(g, idx, dx):
    """``dx[a, idx[a, n, b], b] = g[a, n, b]`` (``dx`` zeroed first): the gradient of a
    permutation along ``N`` (argsort's)."""
    A, N, B = dx.shape
    if g.shape != idx.shape or g.shape[0] != A or g.shape[2] != B:
        raise ValueError("pdjit: put_along_rows: the shapes do not fit")
    dx[:, :, :] = 0
    for a in range(A):
        for n in range(g.shape[1]):
            for b in range(B):
                i = idx[a, n, b]
                if i < 0 or i >= N:
                    raise IndexError("pdjit: put_along_rows: an index is out of range")
                dx[a, i, b] += g[a, n, b]


@jit
def range_size(start, end, step, integral):
    """The length of ``start, start + step, ...`` up to ``end`` (excluded), Paddle's rule:
    ``(|end - start| + |step| - 1) // |step|`` for integers, ``ceil(|(end - start) / step|)``
    in the data's type otherwise; 0 for a step pointing away from ``end``; a zero step
    raises."""
    if step == 0:
        raise ValueError("pdjit: range: the step is 0")
    if (start < end and step < 0) or (start > end and step > 0):
        return np.int64(0)
    if integral:
        return np.int64((abs(end - start) + abs(step) - 1) // abs(step))
    return np.int64(np.ceil(abs((end - start) / step)))


@jit
def range_fill(out, start, step):
    """``out[i] = start + step + ... + step`` (``i`` steps added one by one, as Paddle)."""
    v = start
    for i in range(out.shape[0]):
        out[i] = v
        v += step


@jit
def mask_take(x, mask, out):
    """``out`` = the elements of flat ``x`` where flat ``mask`` is nonzero, in order."""
    m = 0
    for i in range(x.shape[0]):
        if mask[i] != 0:
            if m >= out.shape[0]:
                raise ValueError("pdjit: mask_take: more selected elements than outputs")
            out[m] = x[i]
            m += 1
    if m != out.shape[0]:
        raise ValueError("pdjit: mask_take: fewer selected elements than outputs")


@jit
def mask_put(g, mask, dx):
    """The gradient of :func:`mask_take`: ``g``'s elements back where ``mask`` is nonzero,
    zeros elsewhere."""
    m = 0
    for i in range(dx.shape[0]):
        if mask[i] != 0:
            if m >= g.shape[0]:
                raise ValueError("pdjit: mask_put: fewer gradients than selected elements")
            dx[i] = g[m]
            m += 1
        else:
            dx[i] = 0
    if m != g.shape[0]:
        raise ValueError("pdjit: mask_put: more gradients than selected elements")


@jit
def _row_groups(dims, reduced):
    """Groups of flat C-order data of ``dims`` (rank >= 1) reduced over the dims where
    ``reduced`` is nonzero, by rows of the last dim: ``(base, step, ng)``, element ``j`` of row
    ``q`` in group ``base[q] + j * step`` (``step`` 0 when the last dim is reduced, else 1), and
    the number of groups."""
    r = dims.shape[0]
    gs = np.zeros(r, np.int64)  # each dim's stride in the group index (0 for reduced dims)
    ng = 1
    for k in range(r - 1, -1, -1):
        if reduced[k] == 0:
            gs[k] = ng
            ng *= dims[k]
    rows = 1
    for k in range(r - 1):
        rows *= dims[k]
    base = np.zeros(rows, np.int64)
    c = np.zeros(r, np.int64)
    gi = 0
    for q in range(rows):  # an odometer over the dims before the last
        base[q] = gi
        k = r - 2
        while k >= 0:
            c[k] += 1
            gi += gs[k]
            if c[k] < dims[k]:
                break
            gi -= gs[k] * dims[k]
            c[k] = 0
            k -= 1
    return base, gs[r - 1], ng


@jit
def _check_groups(x, dims, reduced, g, dx):
    n = 1
    ng = 1
    for k in range(dims.shape[0]):
        n *= dims[k]
        if reduced[k] == 0:
            ng *= dims[k]
    if (x.shape[0] != n or dx.shape[0] != n or g.shape[0] != ng or dims.shape[0] == 0
            or reduced.shape[0] != dims.shape[0]):
        raise ValueError("pdjit: a reduction's gradient: the shapes do not fit")
    return n


@jit
def others_product(x, dims, reduced, g, dx):
    """``reduce_prod``'s gradient over flat C-order ``x`` of ``dims``: ``dx[i] = g[grp(i)] *
    (before[i] * after[i])``, ``grp(i)`` the element's group (see :func:`_row_groups`),
    ``before``/``after`` the products of the group's elements before/after it in C order
    (exclusive running products: exact where ``x`` holds zeros, no division)."""
    n = _check_groups(x, dims, reduced, g, dx)
    if n == 0:
        return
    base, step, ng = _row_groups(dims, reduced)
    m = dims[dims.shape[0] - 1]
    run = np.ones(ng, x.dtype)
    for q in range(base.shape[0]):  # forward: dx = before
        b, o = base[q], q * m
        for j in range(m):
            dx[o + j] = run[b + j * step]
            run[b + j * step] *= x[o + j]
    run[:] = 1
    for q in range(base.shape[0] - 1, -1, -1):  # backward: times after, then the gradient
        b, o = base[q], q * m
        for j in range(m - 1, -1, -1):
            gi = b + j * step
            dx[o + j] = g[gi] * (dx[o + j] * run[gi])
            run[gi] *= x[o + j]


@jit
def extreme_share(x, out, g, dims, reduced, dx):
    """``reduce_max``/``reduce_min``'s gradient: ``dx[i] = g[grp(i)] * hit / count[grp(i)]``,
    ``hit`` 1 where ``x[i]`` equals its group's ``out`` (else 0), ``count`` the group's hits
    (``g / count`` where hit, ``g * 0 / count`` elsewhere: the same numbers)."""
    n = _check_groups(x, dims, reduced, g, dx)
    if n == 0:
        return
    base, step, ng = _row_groups(dims, reduced)
    if out.shape[0] != ng:
        raise ValueError("pdjit: extreme_share: Out does not fit")
    m = dims[dims.shape[0] - 1]
    count = np.zeros(ng, x.dtype)
    for q in range(base.shape[0]):
        b, o = base[q], q * m
        for j in range(m):
            if x[o + j] == out[b + j * step]:
                count[b + j * step] += 1
    share = np.empty(ng, x.dtype)
    zero = np.empty(ng, x.dtype)
    for gi in range(ng):
        share[gi] = g[gi] / count[gi]
        zero[gi] = g[gi] * 0 / count[gi]  # a signed zero, NaN for a group without hits
    for q in range(base.shape[0]):
        b, o = base[q], q * m
        for j in range(m):
            gi = b + j * step
            dx[o + j] = share[gi] if x[o + j] == out[gi] else zero[gi]


_I64 = np.dtype(np.int64)


@jobs("take_rows")
def _take_jobs(T):
    return [(take_rows, [(T, 3), (_I64, 1), int, bool, (T, 3)])]


@jobs("scatter_rows")
def _scatter_jobs(T):
    return [(scatter_rows, [(T, 3), (_I64, 1), (T, 3), int, int, bool])]


@jobs("tile_nd")
def _tile_jobs(T):
    return [(tile_nd, [(T, 1), (_I64, 1), (T, 1), (_I64, 1)])]


@jobs("untile_nd")
def _untile_jobs(T):
    return [(untile_nd, [(T, 1), (_I64, 1), (T, 1), (_I64, 1)])]


@jobs("cumsum_rows")
def _cumsum_jobs(T):
    return [(cumsum_rows, [(T, 3), bool, bool, (T, 3)])]


@jobs("others_product")
def _others_product_jobs(T):
    return [(others_product, [(T, 1), (_I64, 1), (_I64, 1), (T, 1), (T, 1)])]


@jobs("extreme_share")
def _extreme_share_jobs(T):
    return [(extreme_share, [(T, 1), (T, 1), (T, 1), (_I64, 1), (_I64, 1), (T, 1)])]

# compile times (CPU seconds, a cold compile of the signature its jobs predict, alone in a fresh
# process, 2 cores at load 5-26): the compile worker balances its groups by them
compile_cost(1.0, tile_nd, untile_nd, extreme_share, others_product)  # 0.95-1.03 s
compile_cost(0.45, cumsum_rows)
compile_cost(0.8, take_rows, scatter_rows)  # 0.72, 0.83 s


#: the fewest values of a permuted copy split over the loop threads (``run_parts``' helpers:
#: a hand-over costs tens of microseconds). [N, 128, 4, 64] float32 heads permuted (0, 2, 1, 3)
#: on 2 threads against NumPy's copy on one, ms, cache hot / flushed: 524,288 values 0.21 /
#: 0.62 vs 0.17 / 0.43; 1M 0.29 / 0.81 vs 0.33 / 0.73; 2M 0.45 / 1.38 vs 0.64 / 1.60; 4M 1.04
#: / 2.01 vs 1.45 / 2.51
PERMUTE_SPLIT_MIN = 1 << 21


def _copy_permuted(out, x, perm) -> None:
    """``out[...] = x.transpose(perm)`` by NumPy's copy: a large one in slices of the first
    output axis of at least two values, one per loop thread (NumPy's copy runs without the
    GIL); each value is copied as one thread copies it."""
    view = x.transpose(perm)
    parts = loop_threads() if view.size >= PERMUTE_SPLIT_MIN else 1
    axis = next((i for i, d in enumerate(view.shape) if d >= 2), None)
    if parts < 2 or axis is None:
        np.copyto(out, view)
        return
    n = view.shape[axis]
    parts = min(parts, n)
    cut = [slice(None)] * axis
    calls = []
    for p in range(parts):
        part = tuple(cut + [slice(p * n // parts, (p + 1) * n // parts)])
        calls.append((out[part], view[part]))
    run_parts(np.copyto, calls, parts - 1)


@intrinsic
def _block_transposed(typingctx, xs, x0, xr, ys, y0, yr):
    """``ys[y0 + j * yr + i] = xs[x0 + i * xr + j]`` for ``i, j < L``, ``L`` the lanes of one
    vector register (:data:`.tile.PLANE_BYTES`) of the arrays' dtype: ``L`` rows loaded as
    vectors, transposed in registers by ``log2(L)`` rounds of two-vector shuffles (each round
    swaps the off-diagonal blocks of half the size of the round before), stored as vectors."""
    if not (isinstance(xs, types.Array) and isinstance(ys, types.Array)) or \
            xs.dtype != ys.dtype or xs.dtype not in (types.float32, types.float64) or \
            not all(isinstance(t, types.Integer) for t in (x0, xr, y0, yr)):
        return None

    def codegen(context, builder, signature, args):
        at = signature.args
        xptr = context.make_array(at[0])(context, builder, args[0]).data
        yptr = context.make_array(at[3])(context, builder, args[3]).data
        x0v, xrv, y0v, yrv = (_offset(context, builder, at[i], args[i]) for i in (1, 2, 4, 5))
        _, size, lanes, vty, i64, _, _ = _vectors(context, builder, at[0].dtype, PLANE_BYTES)
        ity = ir.VectorType(ir.IntType(32), lanes)

        def at_(ptr, base, stride, k):
            p = builder.gep(ptr, [builder.add(base, builder.mul(stride, ir.Constant(i64, k)))])
            return builder.bitcast(p, vty.as_pointer())

        rows = [builder.load(at_(xptr, x0v, xrv, i), align=size) for i in range(lanes)]
        s = lanes // 2
        while s:
            low = ir.Constant(ity, [m if not m & s else lanes + m - s for m in range(lanes)])
            high = ir.Constant(ity, [m + s if not m & s else lanes + m for m in range(lanes)])
            for i in range(lanes):
                if not i & s:
                    a, b = rows[i], rows[i + s]
                    rows[i] = builder.shuffle_vector(a, b, low)
                    rows[i + s] = builder.shuffle_vector(a, b, high)
            s //= 2
        for j in range(lanes):
            builder.store(rows[j], at_(yptr, y0v, yrv, j), align=size)
        return context.get_dummy_value()

    return types.void(xs, x0, xr, ys, y0, yr), codegen


@intrinsic
def _copy_run(typingctx, xs, x0, ys, y0, n):
    """``ys[y0:y0 + n] = xs[x0:x0 + n]`` by ``memcpy`` (the arrays' memory apart)."""
    if not (isinstance(xs, types.Array) and isinstance(ys, types.Array)) or \
            xs.dtype != ys.dtype or not all(isinstance(t, types.Integer) for t in (x0, y0, n)):
        return None

    def codegen(context, builder, signature, args):
        at = signature.args
        xptr = context.make_array(at[0])(context, builder, args[0]).data
        yptr = context.make_array(at[2])(context, builder, args[2]).data
        x0v, y0v, nv = (_offset(context, builder, at[i], args[i]) for i in (1, 3, 4))
        size = context.get_abi_sizeof(context.get_value_type(at[0].dtype))
        cgutils.raw_memcpy(builder, builder.gep(yptr, [y0v]), builder.gep(xptr, [x0v]), nv,
                           size)
        return context.get_dummy_value()

    return types.void(xs, x0, ys, y0, n), codegen


@jit
def _swapped_range(x, y, nb, r_, s_, e_, s0, s1):
    """``y[b, j, i, :] = x[b, i, j, :]`` (``x`` [nb, r_, s_, e_], ``y`` [nb, s_, r_, e_],
    flat) for ``j`` in ``s0 .. s1``: where ``e_`` is 1, by blocks of one vector register's
    lanes square (:func:`_block_transposed`), the values at the edges one by one; else each
    run of ``e_`` values copied whole (:func:`_copy_run`)."""
    lanes = PLANE_BYTES // x.itemsize
    for b in range(nb):
        base = b * r_ * s_ * e_
        if e_ != 1:
            for j in range(s0, s1):
                for i in range(r_):
                    _copy_run(x, base + (i * s_ + j) * e_, y, base + (j * r_ + i) * e_, e_)
            continue
        for j0 in range(s0, s1, lanes):
            j1 = min(j0 + lanes, s1)
            for i0 in range(0, r_, lanes):
                i1 = min(i0 + lanes, r_)
                if j1 - j0 == lanes and i1 - i0 == lanes:
                    _block_transposed(x, base + i0 * s_ + j0, s_, y, base + j0 * r_ + i0, r_)
                else:
                    for j in range(j0, j1):
                        for i in range(i0, i1):
                            y[base + j * r_ + i] = x[base + i * s_ + j]


@register_jitable
def _swap_step(itemsize, e_) -> int:
    """The ``j`` by which :func:`_swapped_parts` splits: a block's (one register's lanes)
    where ``e_`` is 1, else one."""
    return PLANE_BYTES // itemsize if e_ == 1 else 1


@pjit
def _swapped_parts(x, y, nb, r_, s_, e_, parts):
    """:func:`_swapped_range` in ``parts`` ranges of ``j`` (multiples of :func:`_swap_step`
    but the last), one a thread of a parallel loop (``lib.team``)."""
    step = _swap_step(x.itemsize, e_)
    for p in numba.prange(parts):
        s0 = s_ * p // parts // step * step
        s1 = s_ if p == parts - 1 else s_ * (p + 1) // parts // step * step
        _swapped_range(x, y, nb, r_, s_, e_, s0, s1)


jobs("indexing._swapped_parts (warmup)")(lambda T: [
    (_swapped_parts, ((T, 1), (T, 1), int, int, int, int, int))])
compile_cost(1.0, _swapped_parts)


def _swapped_groups(shape, perm):
    """``(B, R, S, E)`` where ``perm`` keeps the first axes (``B`` values) and the last ones
    (``E`` values) and swaps the two groups of axes between them (``R`` and ``S`` values), as
    NCHW <-> NHWC images (``E`` 1) and a channel shuffle ([N, G, C / G, H, W] by (0, 2, 1, 3,
    4): ``E`` the planes) do; else None."""
    n = len(perm)
    a = next((i for i in range(n) if perm[i] != i), n)
    if a == n:
        return None
    b = perm[a]
    c = next(i for i in range(b, n + 1) if i == n or perm[a + i - b] != i)
    if list(perm) != [*range(a), *range(b, c), *range(a, b), *range(c, n)]:
        return None
    return (math.prod(shape[:a]), math.prod(shape[a:b]), math.prod(shape[b:c]),
            math.prod(shape[c:]))


#: the fewest values of a permuted copy that swaps two groups of axes
#: (:func:`_swapped_groups`) by :func:`_swapped_parts`: ``SWAP_MIN`` anywhere, ``SWAP_POLLING``
#: shortly after another parallel loop (``team.polling``: the team's threads still poll). A
#: parallel loop after a long kernel of one thread wakes the team's sleeping thread (~50-70
#: us), which a small copy does not repay: a bidirectional LSTM classifier at batch 1, [1, 64,
#: 128] into [64, 1, 128] after a recurrent layer's 2.9 ms, 77 us by the loop against 12 by
#: NumPy's copy; MobileNetV3-small's [1, 96, 14, 14] into NHWC 8 us after a convolution's
#: loop, 11 against 28-33
SWAP_MIN, SWAP_POLLING = 1 << 15, 1 << 12


def permute_into(x, perm, out) -> None:
    """``out[...] = x.transpose(perm)`` (``out`` C-contiguous, of the permuted shape: a
    transpose op's result, as Paddle's kernel lays it out anew). Where the permutation swaps
    two groups of axes (NCHW <-> NHWC, a channel shuffle: :func:`_swapped_groups`) and the
    values are floats, on the loop threads by :func:`_swapped_parts` (once its loop is ready:
    ``lib.team``): blocks transposed in registers, or runs of the axes after the groups copied
    whole; else :func:`_copy_permuted`. Declared ``"leaves"``: a host replay makes the same
    calls, the parallel loop's from its native chain. MobileNetV2's [1, 192, 14, 14] into
    NHWC after the layer that wrote it, two threads: 47-52 us a run by NumPy's copy made again
    from Python, 16 us this way. Alone, cache hot, us, NumPy's copy on one thread / this on
    one / on two: [1, 192, 14, 14] into NHWC 10.1 / 7.3 / 5.5, [1, 144, 28, 28] 40.3 / 17.0 /
    10.9, [1, 96, 56, 56] 171 / 119 / 27; ShuffleNetV2's shuffle of [1, 2, 58, 28, 28] 8.5 /
    9.9 / 6.2, [16, 128, 4, 64] heads (0, 2, 1, 3) 174 / 171 / 94."""
    if x.size >= (SWAP_POLLING if team.polling() else SWAP_MIN) and \
            x.dtype in (np.float32, np.float64) and \
            x.flags.c_contiguous and out.flags.c_contiguous and out.dtype == x.dtype:
        groups = _swapped_groups(x.shape, perm)
        if groups is not None:
            nb, r_, s_, e_ = groups
            parts = max(1, min(loop_threads(), s_ // _swap_step(x.itemsize, e_)))
            if team.run(_swapped_parts, (x.reshape(x.size), out.reshape(out.size), nb, r_,
                                         s_, e_, parts)):
                return
    replay.kernel_call(_copy_permuted, out, x, perm)


replay.declare("leaves", permute_into)


@overload(permute_into)
def _permute_into_native(x, perm, out):
    """In compiled code (a native driver): NumPy's copy on its own thread."""
    def impl(x, perm, out):
        t = x.transpose(perm).copy()
        out.reshape(out.size)[:] = t.reshape(t.size)
    return impl
