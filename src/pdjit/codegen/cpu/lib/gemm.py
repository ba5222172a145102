"""Batched matrix products (``matmul``/``matmul_v2``/``bmm`` of any rank, their gradients) and
the other kernels of attention: softmax over an inner axis and its gradient, dropout with its
counter-based random stream.

``batched_gemm`` sees every operand as a 3-D C-contiguous array ``(batch, rows, cols)``: the
lowerings flatten the batch dims in their host lines and pass the batch dims themselves as
``int64`` vectors, so one function serves every rank, size, broadcast and transpose. Called
from a host driver (plain Python) it is ``np.matmul`` on the operands viewed with their batch
dims (NumPy's loop of BLAS calls, transposes as strided views: nothing to compile), except a
batch without broadcasting whose left operand is not transposed and has ``PACKED_MIN_ROWS``
rows or more (attention's ``Q K^T`` and ``P V``): pdjit's packed GEMM, each right operand
packed (and scaled) once for its product (:func:`pgemm.packed_batches`; measured, one thread,
load ~13, ``[4|64, 128, 64] x [.., 64, 128]^T`` 0.086 / 1.11 ms against ``np.matmul``'s
0.093 / 1.68, ``[4|64, 128, 128] x [.., 128, 64]`` 0.071 / 1.08 against 0.073 / 1.31); inside
compiled code (a native driver, a kernel) it is ``_batched_gemm_native``, a compiled loop of
one BLAS call (:func:`blas_gemm`) per 2-D slice, compiled once per dtype. From the host, a
batch without broadcasting of ``threads.GEMM_PARALLEL_MIN_WORK`` multiply-adds in all is split
over the loop threads (``threads.gemm_threads``), each part that compiled loop on one BLAS
thread; one on the packed GEMM from :data:`TEAM_MIN_WORK`, by a parallel loop.
Measured on the attention products ``[8, 4, 128, 64] x [8, 4, 64, 128]`` and
``[8, 4, 128, 128] x [8, 4, 128, 64]`` float32, one BLAS thread: the compiled loop takes
0.95-1.11x ``np.matmul``'s time and 0.93-1.01x a Python loop of ``np.dot`` per slice (2-core
machine under load, medians of 40 runs).
"""
import math

import numba
import numpy as np
from numba.extending import overload

from pdjit.codegen.cpu import replay, rt, threads
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import blas_gemm, jit, jit_fma, jobs, pjit
from pdjit.codegen.cpu.lib.pgemm import (
    _EMPTY,
    _FLOATS,
    NV,
    PACKED_MIN_ROWS,
    _micro1,
    _weight_rows,
    batches_by_team,
    packed_batches,
    packed_gemm,
    packed_weight,
    run_chunks,
    weight_rows,
)

__all__ = ["blas_gemm", "batched_gemm", "gemm_rows", "gemm_split_work", "weight_vector",
           "dropout_fwd", "dropout_bwd", "dropout_key", "softmax_axis", "softmax_axis_grad"]


@jit
def _dot(a, b, ta, tb, out):
    """``out = op(a) @ op(b)`` on 2-D slices (``op`` transposes when asked)."""
    if ta:
        if tb:
            blas_gemm(a.T, b.T, out)
        else:
            blas_gemm(a.T, b, out)
    elif tb:
        blas_gemm(a, b.T, out)
    else:
        blas_gemm(a, b, out)


@jit
def _at(n, it, dims):
    """The flat index in an array of batch dims ``dims`` of iteration ``n`` over batch dims
    ``it`` (``dims`` aligned with ``it``; a dim of 1 is broadcast)."""
    k = 0
    stride = 1
    for d in range(it.shape[0] - 1, -1, -1):
        i = n % it[d]
        n //= it[d]
        if dims[d] != 1:
            k += i * stride
        stride *= dims[d]
    return k


def batched_gemm(a, b, ta, tb, alpha, it, da, db, dc, c):
    """``c[kc] (+)= alpha * op(a[ka]) @ op(b[kb])`` for every index of the batch dims ``it``,
    where ``ka``, ``kb``, ``kc`` are that index in ``a``'s, ``b``'s and ``c``'s batch dims
    ``da``, ``db``, ``dc`` (aligned with ``it``, 1 where broadcast). When ``c`` has fewer
    batches than ``it`` (a gradient of a broadcast operand) the products are summed into it.
    (The host's version: ``np.matmul``; compiled code calls ``_batched_gemm_native``.)"""
    # (plain lists and math.prod: NumPy's reductions over these few dims cost microseconds)
    shape = tuple(it.tolist())
    dal, dbl = da.tolist(), db.tolist()
    for d, x in ((dal, a), (dbl, b), (dc.tolist(), c)):
        if math.prod(d) != x.shape[0] or any(k != 1 and k != n for k, n in zip(d, shape)):
            raise ValueError("pdjit: batched_gemm: batch dims do not broadcast")
    x = a.reshape(tuple(dal) + a.shape[1:])
    y = b.reshape(tuple(dbl) + b.shape[1:])
    x = np.swapaxes(x, -1, -2) if ta else x
    y = np.swapaxes(y, -1, -2) if tb else y
    if x.shape[-1] != y.shape[-2] or c.shape[1:] != (x.shape[-2], y.shape[-1]):
        raise ValueError("pdjit: batched_gemm: the matrices do not fit")
    nb = math.prod(shape)
    work = nb * x.shape[-2] * x.shape[-1] * y.shape[-1]
    nt = threads.gemm_threads(work)
    whole = c.shape[0] == nb and dal == list(shape) == dbl
    if nt > 1 and nb > 1 and whole:
        _split_batches(a, b, ta, tb, alpha, c, min(nt, nb))
        return
    if nt > 1:
        threads.with_numpy_blas(nt, _host_matmul, x, y, alpha, shape, dc, c, stop_workers=True)
    elif whole and _packs(a, b, ta, c):
        parts = min(threads.loop_threads(), nb) if work >= TEAM_MIN_WORK else 1
        if parts < 2 or not _by_team(a, b, tb, alpha, c, parts):
            packed_batches(a, b, tb, alpha, c, 0, nb)
    else:
        _host_matmul(x, y, alpha, shape, dc, c)


#: multiply-adds from which a batch of products on the packed GEMM below
#: ``threads.GEMM_PARALLEL_MIN_WORK`` is split over the loop threads by a parallel loop where
#: it is ready (``lib.team``: a split costs a few microseconds while the team polls for work;
#: no BLAS threads), with no thread count asked as with one: a BERT-like encoder's attention
#: products at batch 1 (4 heads of 128 x 64 x 128, 4.2 M each: 45 -> 25 us on two threads
#: alone). With ``pgemm.split_threads`` for its other products, the encoder at batch 1 through
#: the Predictor without a thread count took 4.11 ms a run against 5.06 (by turns in one
#: process; the same bits), as fast as with two threads asked for
TEAM_MIN_WORK = 1 << 20


def _packs(a, b, ta, c) -> bool:
    """Whether a batch of products without broadcasting runs on the packed GEMM: ``a`` not
    transposed, of ``PACKED_MIN_ROWS`` rows or more, float32/float64 operands alike, all
    C-contiguous."""
    return not ta and a.shape[1] >= PACKED_MIN_ROWS and a.dtype == b.dtype == c.dtype and \
        a.dtype in (np.float32, np.float64) and a.flags.c_contiguous and \
        b.flags.c_contiguous and c.flags.c_contiguous


def _host_matmul(x, y, alpha, shape, dc, c):
    """``np.matmul`` of the operands viewed with their batch dims into ``c``."""
    if c.shape[0] == int(np.prod(shape)):
        np.matmul(x, y, out=c.reshape(shape + c.shape[1:]))
    else:  # summed over the batch dims c does not have
        r = np.matmul(x, y)
        axes = tuple(k for k, (d, n) in enumerate(zip(dc, shape)) if d == 1 and n != 1)
        c[...] = r.sum(axis=axes).reshape(c.shape)
    if alpha != 1.0:
        c *= c.dtype.type(alpha)


def _range_gemm(a, b, ta, tb, alpha, c, n0, n1):
    """Products ``n0 .. n1`` of a batch without broadcasting (compiled loops, no GIL: the
    packed GEMM where :func:`_packs`, else a BLAS call per product)."""
    if _packs(a, b, ta, c):
        packed_batches(a, b, tb, alpha, c, n0, n1)
        return
    d = np.array([n1 - n0], np.int64)
    _batched_gemm_native(a[n0:n1], b[n0:n1], ta, tb, alpha, d, d, d, d, c[n0:n1])


def _split_batches(a, b, ta, tb, alpha, c, parts):
    """A large batch of products over ``parts`` threads, each running the compiled loop of
    one-thread ``np.dot`` on the chunks of the batch it takes (``np.matmul`` holds the GIL;
    see ``pdjit.codegen.cpu.threads``)."""
    n = c.shape[0]
    if _packs(a, b, ta, c) and _by_team(a, b, tb, alpha, c, parts):
        return
    run_chunks(_range_gemm, n, parts, min(n, 4 * parts), a, b, ta, tb, alpha, c)


def _by_team(a, b, tb, alpha, c, parts) -> bool:
    """A batch of products on the packed GEMM in ``parts`` ranges by a parallel loop where it
    is ready (``lib.team``): whether it ran."""
    return team.run(batches_by_team, (a, b, bool(tb), float(alpha), c, parts))


@jit
def gemm_rows(x, y, n0, n1, out, r):
    """Rows ``n0 * r .. n1 * r`` of ``out = x @ y`` (2-D C-contiguous operands): samples
    ``n0 .. n1`` of a product whose samples are ``r`` rows each, one BLAS call on one thread.
    What a ``mul``/``matmul`` by blocks computes before its epilogue (``Opaque.blocked``)."""
    if x.shape[1] != y.shape[0] or out.shape[0] != x.shape[0] or out.shape[1] != y.shape[1]:
        raise ValueError("pdjit: matrix product operands do not fit each other")
    lo, hi = n0 * r, n1 * r
    if hi > lo:
        blas_gemm(x[lo:hi], y, out[lo:hi])


def gemm_split_work(x, y) -> int:
    """The work (multiply-adds) by which a host driver splits a blocked GEMM over the loop
    threads (``split_work``): the product's own when ``threads.gemm_threads`` gives it more than
    one thread (large, on free cores), else 0 (one thread). (Each block's product then runs
    on one BLAS thread, as every BLAS call in a run: ``threads.blas_threads``; concurrent
    multi-threaded OpenBLAS calls from the loop threads fought: 1.5 -> 68 ms for
    1024x256x256.)"""
    work = x.shape[0] * x.shape[1] * y.shape[1]
    return work if threads.gemm_threads(work) > 1 else 0


# ---- a few samples' product by a weight: a classifier's last layer at batch 1 to 4 ------------
#: the fewest values of a weight whose product by a few rows :func:`weight_vector` takes from
#: BLAS (a weight read from beyond the L2 cache at each run, where a second core's bandwidth
#: pays)
VECTOR_MIN_VALUES = 1 << 18
#: the most rows it takes: each row's outputs are updated while the weight's rows are in the L1
#: cache, the weight streamed once. Measured (one thread, float32, us, this / BLAS, MobileNetV3's
#: 576 x 1024 and 1024 x 1000, the weight from memory at each call): 2 rows 144 / 340, 307 /
#: 510; 4 rows 179 / 336, 398 / 542; 8 rows 276 / 372, 533 / 611, but with the weight in the
#: caches 339 / 301 (16 rows 657 / 447): from 8 rows BLAS's blocked product paid, and the
#: packed GEMM more (:func:`weight_vector`; on an AMD EPYC Zen 4, one thread, the weight in the
#: caches, us, packed / this: 1 row 44 / 35, 74 / 53; 4 rows 43 / 100, 74 / 140, where two
#: threads split this one by columns)
VECTOR_MAX_ROWS = 4


@jit_fma
def _vector_cols(x, wf, y, n, n0, n1):
    """``y[:, n0:n1]`` = columns ``n0 .. n1`` of ``x @ w`` (``w`` ``[K, n]`` flat, ``x`` ``[M,
    K]``): ``w``'s rows four at a time, each a stream of contiguous values read once for every
    row of ``x``, the outputs updated in the L1 cache. Each output sums its products in the
    order of ``K``, each a fused multiply-add, whatever its range and the other rows: every
    split of the columns, and each row alone, gives one call's bits."""
    m_, k_ = x.shape
    w = n1 - n0
    for m in range(m_):
        ym = y[m, n0:n1]
        for j in range(w):
            ym[j] = 0.0
    k = 0
    while k + 4 <= k_:
        b = k * n
        r0 = wf[b + n0:b + n1]
        r1 = wf[b + n + n0:b + n + n1]
        r2 = wf[b + 2 * n + n0:b + 2 * n + n1]
        r3 = wf[b + 3 * n + n0:b + 3 * n + n1]
        for m in range(m_):
            x0, x1, x2, x3 = x[m, k], x[m, k + 1], x[m, k + 2], x[m, k + 3]
            ym = y[m, n0:n1]
            for j in range(w):
                ym[j] = x3 * r3[j] + (x2 * r2[j] + (x1 * r1[j] + (x0 * r0[j] + ym[j])))
        k += 4
    while k < k_:
        r = wf[k * n + n0:k * n + n1]
        for m in range(m_):
            xk = x[m, k]
            ym = y[m, n0:n1]
            for j in range(w):
                ym[j] = xk * r[j] + ym[j]
        k += 1


@pjit
def _vector_parts(x, w, y, parts):
    """``y = x @ w`` (``x`` ``[M, K]``, ``w`` ``[K, N]``, ``y`` ``[M, N]``, C-contiguous) in
    ``parts`` ranges of columns (multiples of 16 but the end), one a thread of a parallel loop
    (``lib.team``): each part streams its share of every row of ``w``; the same bits as one
    part."""
    n = w.shape[1]
    wf = w.reshape(w.size)
    for p in numba.prange(parts):
        n0 = n * p // parts // 16 * 16
        n1 = n if p == parts - 1 else n * (p + 1) // parts // 16 * 16
        _vector_cols(x, wf, y, n, n0, n1)


@pjit
def _vector_panels(x, bp, y, parts):
    """``y = x @ w`` for one row ``x`` (``[1, K]``; ``w`` ``[K, N]`` packed into panels of
    ``NR`` columns by :func:`.pgemm.pack_b`, ``bp``; ``y`` ``[1, N]``) in ``parts`` ranges of
    whole panels, one a thread of a parallel loop (``lib.team``): each part streams its panels,
    each ``K`` rows of ``NR`` contiguous values, on pgemm's one-row tile (each output's
    products summed in the order of ``K``, each a fused multiply-add: the bits of
    :func:`_vector_cols`, whatever the split)."""
    k_ = x.shape[1]
    n = y.shape[1]
    nr = NV * (64 // x.itemsize)
    panels = (n + nr - 1) // nr
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    for p in numba.prange(parts):
        for j in range(panels * p // parts, panels * (p + 1) // parts):
            n0 = j * nr
            _micro1(xf, 0, k_, 1, k_, bp, j * k_ * nr, yf, n0, n, min(nr, n - n0), yf[:0], n0,
                    yf[:0], -np.inf, np.inf)


def _blas_into(x, w, trans, out):
    out[...] = rt.gemm(x, w.T if trans else w)


def weight_vector(x, w, trans, out):
    """``out = x @ w`` (``w.T`` where ``trans``; 2-D operands) for a weight ``w`` (a parameter
    no op of the program writes) and rows of ``x`` that are a batch's samples (the lowering's
    ``_vector_weight``: a classifier's last layer). At most :data:`VECTOR_MAX_ROWS` rows by a
    weight of :data:`VECTOR_MIN_VALUES` or more (float, C-contiguous, not transposed) run
    :func:`_vector_parts` by ranges of columns over the loop threads (one part on one; one row
    on one thread is BLAS's gemv, which streams a weight from memory faster: on an AMD EPYC
    Zen 4, float32, us, this / BLAS, MobileNetV3's 576 x 1024 150-160 / 92-104 and 1024 x
    1000 240-270 / 165-180, in the caches 36 / 30 and 58 / 51) once its loop is ready
    (``lib.team``: compiled ahead); one row on more threads :func:`_vector_panels`, by whole
    panels of the weight packed once (``pgemm.packed_weight``), so that each thread streams
    one contiguous run of memory rather than a strided share of every row (MobileNetV2's
    1280 x 1000 at batch 1 on two threads, in the model, its calls timed in processes by
    turns: 183-242 -> 118-139 us; the model 0.98x ONNX Runtime side by side in one process,
    1.00-1.03x before). More rows (float32 or float64), the packed
    GEMM on the weight packed once (BLAS packs it again at every call) once its kernel is
    ready the same way, from ``PACKED_MIN_ROWS`` rows by ``pgemm.weight_rows`` (split by
    blocks of rows over the loop threads where it pays); any other product is BLAS's
    (``rt.gemm``). Measured (2-vCPU machine, float32, a weight from memory at each call, us,
    BLAS one thread / this on one / on two): ResNet-50's 2048 x 1000 188 / 192 / 149; from
    the L3 cache, MobileNetV2's 1280 x 1000 49 / 53 / 38. More rows (AMD EPYC Zen 4, one
    thread, the weight in the caches / from memory, us, BLAS / packed): MobileNetV3's 576 x
    1024 at 16 rows 399 / 207 and 454 / 283, 1024 x 1000 440 / 328 and 700 / 423; ResNet-50's
    2048 x 1000 949 / 685 and 1525 / 1018; at 8 rows 311 / 103 and 451 / 229, 294 / 182 and
    530 / 223, 667 / 394."""
    m = x.shape[0]
    if x.ndim == 2 and w.ndim == 2 and x.dtype == w.dtype == out.dtype and \
            x.dtype.kind == "f" and x.shape[1] == w.shape[1 if trans else 0] and \
            out.shape == (m, w.shape[0 if trans else 1]) and x.flags.c_contiguous and \
            w.flags.c_contiguous and out.flags.c_contiguous and w.size >= VECTOR_MIN_VALUES:
        if not trans and 1 <= m <= VECTOR_MAX_ROWS:
            parts = max(1, min(threads.loop_threads(), w.shape[1] // 16))
            if m == 1 and parts > 1 and type(w) is np.ndarray and \
                    team.run(_vector_panels, (x, packed_weight(w), out, parts)):
                return
            if m * parts > 1 and team.run(_vector_parts, (x, w, out, parts)):
                return
        elif m > VECTOR_MAX_ROWS and x.dtype in _FLOATS and type(w) is np.ndarray:
            none = _EMPTY[x.dtype]
            # (once its kernel is on disk, compiled ahead as a parallel loop is, ``team.ready``:
            # compiled in a run, it held a first result 1.2 s; till then BLAS)
            if m >= PACKED_MIN_ROWS:  # (split over the loop threads where it pays)
                if team.ready(_weight_rows, (x, w, trans, none, 0, 1, out, m, none, none,
                                             -np.inf, np.inf)):
                    weight_rows(x, w, trans, packed_weight(w, trans), 0, 1, out, m, none, none,
                                -np.inf, np.inf)
                    return
            elif team.ready(packed_gemm, (x, none, out.shape[1], none, out)):
                replay.kernel_call(packed_gemm, x, packed_weight(w, trans), out.shape[1], none,
                                   out)
                return
    replay.kernel_call(_blas_into, x, w, trans, out)


replay.declare("leaves", weight_vector)


@overload(weight_vector)
def _weight_vector_native(x, w, trans, out):
    """In compiled code: BLAS's product, as :func:`rt.gemm` there."""
    def impl(x, w, trans, out):
        if trans:
            out[:, :] = np.dot(x, w.T)
        else:
            out[:, :] = np.dot(x, w)
    return impl


# (compiled ahead by ``pdjit warmup`` and the background warmup only: see ``team.ready``)
jobs("gemm._vector_parts (warmup)")(lambda T: [
    (_vector_parts, ((T, 2), (T, 2), (T, 2), int)),
    (_vector_panels, ((T, 2), (T, 1), (T, 2), int))])


@overload(batched_gemm)
def _batched_gemm_compiled(a, b, ta, tb, alpha, it, da, db, dc, c):
    def impl(a, b, ta, tb, alpha, it, da, db, dc, c):
        _batched_gemm_native(a, b, ta, tb, alpha, it, da, db, dc, c)
    return impl


@jit
def _batched_gemm_native(a, b, ta, tb, alpha, it, da, db, dc, c):
    """``batched_gemm`` in compiled code: one :func:`blas_gemm` per product of 2-D slices."""
    nb = 1
    for d in range(it.shape[0]):
        nb *= it[d]
        if (da[d] != 1 and da[d] != it[d]) or (db[d] != 1 and db[d] != it[d]) or \
                (dc[d] != 1 and dc[d] != it[d]):
            raise ValueError("pdjit: batched_gemm: batch dims do not broadcast")
    m = a.shape[2] if ta else a.shape[1]
    k = a.shape[1] if ta else a.shape[2]
    kb = b.shape[2] if tb else b.shape[1]
    n = b.shape[1] if tb else b.shape[2]
    if k != kb or c.shape[1] != m or c.shape[2] != n:
        raise ValueError("pdjit: batched_gemm: the matrices do not fit")
    # one product per output matrix, written in place; or (fewer output matrices than
    # products: a gradient of a broadcast operand) each product into a buffer, then summed
    direct = c.shape[0] == nb
    if not direct:
        c[:] = 0
    tmp = np.empty((1, 1) if direct else (m, n), c.dtype)
    for i in range(nb):
        ci = c[_at(i, it, dc)]
        dst = ci if direct else tmp
        _dot(a[_at(i, it, da)], b[_at(i, it, db)], ta, tb, dst)
        if direct:
            if alpha != 1.0:
                ci *= alpha
        elif alpha != 1.0:
            ci += tmp * alpha
        else:
            ci += tmp



# ---- softmax over an inner axis ----------------------------------------------------------------
# The data as (pre, n, post): softmax over n, the post values side by side so the inner loops
# are contiguous; one compilation per dtype serves every rank and axis. (The last axis, post
# 1, is a generated row loop instead: it may carry a prologue, see pdjit.passes.fusion.)
@jit
def softmax_axis(x, out, clip):
    """``out = exp(max(x - max_n x, clip)) / sum_n(...)`` over axis 1 of 3-D ``x``."""
    P, N, Q = x.shape
    if out.shape != x.shape:
        raise ValueError("pdjit: softmax: Out does not fit X")
    m = np.empty(Q, x.dtype)
    s = np.empty(Q, x.dtype)
    for p in range(P):
        m[:] = -np.inf
        for k in range(N):
            for q in range(Q):
                m[q] = max(m[q], x[p, k, q])
        s[:] = 0
        for k in range(N):
            for q in range(Q):
                e = np.exp(max(x[p, k, q] - m[q], clip))
                out[p, k, q] = e
                s[q] += e
        for k in range(N):
            for q in range(Q):
                out[p, k, q] = out[p, k, q] / s[q]


@jit
def softmax_axis_grad(o, g, dx):
    """``dx = o * (g - sum_n(g * o))`` over axis 1 of 3-D ``o`` (the softmax) and ``g``."""
    P, N, Q = o.shape
    if g.shape != o.shape or dx.shape != o.shape:
        raise ValueError("pdjit: softmax_grad: Out@GRAD or X@GRAD do not fit Out")
    s = np.empty(Q, o.dtype)
    for p in range(P):
        s[:] = 0
        for k in range(N):
            for q in range(Q):
                s[q] += o[p, k, q] * g[p, k, q]
        for k in range(N):
            for q in range(Q):
                dx[p, k, q] = o[p, k, q] * (g[p, k, q] - s[q])


# ---- dropout -----------------------------------------------------------------------------------
# The stream of pdjit.framework.random: element i of a draw is mix64(key + (i + 1) * GOLDEN)
# (splitmix64's finaliser, uint64 arithmetic wrapping), its top 53 bits a float64 in [0, 1).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


@jit
def _mix64(x):
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@jit
def _uniform01(key, i):
    """Element ``i`` of the stream of ``key`` (a uint64) as a float64 in [0, 1)."""
    x = _mix64(key + np.uint64(i + 1) * _GOLDEN)
    return np.float64(x >> _S11) * (1.0 / 9007199254740992.0)


@jit
def dropout_key(seed, run_key):
    """The key of a dropout with a ``Seed`` input (a 1-element integer array): a non-zero
    seed gives ``mix64(mix64(seed) ^ 0x5EED)`` (``random.op_key`` of a fixed seed), zero the
    run's key ``run_key``."""
    if seed.shape[0] < 1:
        raise ValueError("pdjit: dropout: Seed holds no value")
    if seed[0] == 0:
        return run_key
    return _mix64(_mix64(np.uint64(seed[0])) ^ np.uint64(0x5EED))


@jit
def _keep_scale(p, like):
    """``1 - p`` rounded to the data's type (as the reference computes it)."""
    q = np.empty(1, like.dtype)
    q[0] = 1.0 - p
    return q[0]


@jit
def dropout_fwd(x, key, p, upscale, is_test, out, mask):
    """Dropout of the flat array ``x`` into ``out`` and ``mask`` (uint8): element ``i`` is
    kept when its draw from the stream of ``key`` is ``>= p``; kept values are divided by
    ``1 - p`` with ``upscale`` (upscale_in_train), else left as they are. In test mode
    (``is_test``) nothing is drawn: ``out`` is ``x`` (upscale) or ``x * (1 - p)``, ``mask`` all
    ones."""
    if out.shape[0] != x.shape[0] or mask.shape[0] != x.shape[0]:
        raise ValueError("pdjit: dropout: Out or Mask do not fit X")
    q = _keep_scale(p, x)
    if is_test:
        for i in range(x.shape[0]):
            out[i] = x[i] if upscale else x[i] * q
            mask[i] = 1
        return
    zero = x.dtype.type(0)
    for i in range(x.shape[0]):
        if _uniform01(key, i) >= p:
            mask[i] = 1
            out[i] = x[i] / q if upscale else x[i]
        else:
            mask[i] = 0
            out[i] = zero


@jit
def dropout_bwd(g, mask, p, upscale, is_test, dx):
    """``dx = g * mask`` (divided by ``1 - p`` with ``upscale``; zeros when ``p == 1``); in
    test mode the forward's fixed scale: ``g`` (upscale) or ``g * (1 - p)``."""
    if dx.shape[0] != g.shape[0] or (not is_test and mask.shape[0] != g.shape[0]):
        raise ValueError("pdjit: dropout_grad: Mask or X@GRAD do not fit Out@GRAD")
    q = _keep_scale(p, g)
    if is_test:
        for i in range(g.shape[0]):
            dx[i] = g[i] if upscale else g[i] * q
        return
    zero = g.dtype.type(0)
    for i in range(g.shape[0]):
        v = g[i] * g.dtype.type(mask[i])
        if upscale:
            dx[i] = v / q if p < 1.0 else zero
        else:
            dx[i] = v
