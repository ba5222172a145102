"""Normalisation kernels (batch, instance and group norm): statistics, normalisation, gradients.

Every kernel sees its data as a 4-D view ``(A, P, C, R)`` of a C-contiguous array with ``C``
channels: ``NCHW`` data ``(N, C, *S)`` as ``(N, 1, C, prod(S))`` and ``NHWC`` data
``(N, *S, C)`` as ``(N, prod(S), C, 1)``; so one compilation per dtype serves both layouts,
every rank and all three ops (the per-op bookkeeping on a few values per channel is in the
lowerings' host lines). Channel-last data (``R == 1``) is walked as ``(A, P, C)`` rows so the
loop over channels is contiguous (and vectorised); otherwise the inner loop runs over ``R``.

Statistics belong to groups of elements, ``stat[k, g]`` (float64 arrays ``(K, G)``):
``k = a`` when they are taken per sample (instance and group norm, ``K = A``) and ``k = 0``
when over the whole batch (batch norm, ``K = 1``); ``g = c // cpg`` with ``cpg`` channels per
group (1 for batch and instance norm, ``G = C / cpg``). Sums accumulate in float64 per
``(k, c)``, then per group; variances are biased (divided by the count) and taken in two
passes. ``inv`` is ``1 / sqrt(var + eps)``. Outputs are arguments (the driver allocates them).
The kernels that sum (:func:`_stats_k`, :func:`_grad_k`) are compiled with reassociation
allowed, so LLVM vectorises the float64 sums over a channel's values (4x faster than ordered
sums: 360 -> 85 us for the statistics of [32, 16, 32, 32] float32); each pass can work on a
range of samples, so large data is split over threads (:data:`_NORM_PARALLEL_MIN`).

Layer norm (:func:`layer_norm_fwd`, :func:`layer_norm_bwd`) sees its data as rows: ``x`` of
``(M, N)``, each row normalised over its ``N`` values with ``scale[j]``/``bias[j]`` per column
(ones and zeros when the op has none). Per row, two passes take the mean and the biased
variance (sums in float64; the kernels are compiled with reassociation allowed, so LLVM
vectorises the sums over the row), and a third writes ``y``; the backward pass reads each row
twice. Rows are split over threads when the data is large (as the convolution kernels do); in a
native loop's compiled driver they run on its own thread.
"""
import numba
import numpy as np
from numba.extending import overload

from pdjit.codegen.nnlib._jit import OPTIONS, PdjitCompiler, jit, jobs
from pdjit.codegen.nnlib.conv import _plain, _threads, split_work
from pdjit.runtime.threads import free_cores, loop_threads

_F64 = np.dtype(np.float64)

#: sums may be reassociated (vectorised): the kernels that sum over a channel's or a row's
#: values (at pdjit's LLVM level: O1 vectorises such a sum as O3 does, measured 1M float32
#: 0.080 vs 0.078 ms)
_rjit = numba.njit(**OPTIONS, fastmath={"reassoc", "contract"}, pipeline_class=PdjitCompiler)

__all__ = ["norm_stats", "norm_apply", "norm_grad", "layer_norm_fwd", "layer_norm_bwd"]

_MISFIT_STATS = "pdjit: the norm statistics do not fit the data"


# ---- batch, instance and group norm -------------------------------------------------------------
# One kernel per entry point, with a ``mode``: 0 runs the whole computation on this thread; the
# others run one pass over the samples ``a0..a1``, so large data is split over threads (each
# slice sums into its own float64 partials ``(K, C)``, added up afterwards: the sums of mode 0 in
# another order). One function each rather than a function per pass: every Numba function costs
# its own compilation (measured: four more small ones added 1.3 s to a cold start). Their
# scratch arrays are all ``np.zeros`` of a 2-tuple shape: Numba compiles an allocation for each
# distinct argument signature it meets (np.empty((K, C)), np.zeros(C)... one each).
@_rjit
def _stats_k(x, per_sample, cpg, mean, var, acc, mc, mode, a0, a1):
    """Mode 0: ``mean[k, g]`` and biased ``var[k, g]`` of the groups of ``x``. Mode 1: ``acc[k,
    c] +=`` the sums of the values of the samples ``a0..a1``; mode 2: the sums of their squared
    deviations from ``mc[k, c]`` (``acc`` and ``mc`` are unread in mode 0)."""
    A, P, C, R = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape != (K, C // cpg) or var.shape != mean.shape:
        raise ValueError(_MISFIT_STATS)
    n = P * R * cpg * (1 if per_sample else A)
    if mode == 0:
        mean[:, :] = 0.0
        var[:, :] = 0.0
        if n == 0:
            return
        acc = np.zeros((K, C))
        mc = np.zeros((K, C))
        a0, a1 = 0, A
    elif acc.shape != (K, C) or mc.shape != (K, C):
        raise ValueError(_MISFIT_STATS)
    x3 = x.reshape((A, P, C * R))  # indexed [a, p, c] when R == 1
    for sq in range(1 if mode == 2 else 0, 1 if mode == 1 else 2):
        for a in range(a0, a1):
            k = a if per_sample else 0
            for p in range(P):
                if R == 1:
                    if sq:
                        for c in range(C):
                            d = x3[a, p, c] - mc[k, c]
                            acc[k, c] += d * d
                    else:
                        for c in range(C):
                            acc[k, c] += x3[a, p, c]
                else:
                    for c in range(C):
                        xr = x[a, p, c]
                        t = 0.0
                        if sq:
                            m = mc[k, c]
                            for r in range(R):
                                d = xr[r] - m
                                t += d * d
                        else:
                            for r in range(R):
                                t += xr[r]
                        acc[k, c] += t
        if mode == 0:
            out = var if sq else mean
            for k in range(K):
                for c in range(C):
                    out[k, c // cpg] += acc[k, c]
            out /= n
            if not sq:
                for k in range(K):
                    for c in range(C):
                        mc[k, c] = mean[k, c // cpg]
                acc[:, :] = 0.0


@jit
def _apply_k(x, mean, inv, scale, bias, per_sample, cpg, relu, y, a0, a1):
    """Samples ``a0..a1``: ``y = (x - mean[k, g]) * inv[k, g] * scale[c] + bias[c]``, computed
    as ``x * s + b`` per channel (as Paddle's CPU kernel does), then ``max(y, 0)`` with
    ``relu``."""
    A, P, C, R = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape != (K, C // cpg) or inv.shape != mean.shape:
        raise ValueError(_MISFIT_STATS)
    if scale.shape[0] != C or bias.shape[0] != C or y.shape != x.shape:
        raise ValueError("pdjit: norm_apply: Scale, Bias or Y do not fit X")
    s = np.zeros((K, C))
    b = np.zeros((K, C))
    for k in range(K):
        for c in range(C):
            g = c // cpg
            s[k, c] = inv[k, g] * scale[c]
            b[k, c] = bias[c] - mean[k, g] * s[k, c]
    x3 = x.reshape((A, P, C * R))  # indexed [a, p, c] when R == 1
    y3 = y.reshape((A, P, C * R))
    for a in range(a0, a1):
        k = a if per_sample else 0
        for p in range(P):
            if R == 1:
                for c in range(C):
                    v = x3[a, p, c] * s[k, c] + b[k, c]
                    if relu and v < 0.0:
                        v = 0.0
                    y3[a, p, c] = v
            else:
                for c in range(C):
                    sc = s[k, c]
                    bc = b[k, c]
                    for r in range(R):
                        v = x[a, p, c, r] * sc + bc
                        if relu and v < 0.0:
                            v = 0.0
                        y[a, p, c, r] = v


@_rjit
def _grad_k(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias, s1, s2,
            mode, a0, a1):
    """The gradients of :func:`norm_apply` (without relu): ``dscale[c] = sum(dy * xhat)``,
    ``dbias[c] = sum(dy)`` and, with ``batch_stats`` (the statistics are those of ``x``),
    ``dx = inv * (g - mean(g) - xhat * mean(g * xhat))`` over each group where
    ``g = dy * scale[c]``; without (fixed statistics) ``dx = inv * g``.

    Mode 0 computes it all. Mode 1 adds the sums of the samples ``a0..a1`` to ``s1[k, c]``
    (``dy``) and ``s2[k, c]`` (``dy * (x - mean)``); mode 2 takes the sums of all samples in
    ``s1``, ``s2`` and writes ``dx`` of the samples ``a0..a1`` (and, with ``a0 == 0``,
    ``dscale`` and ``dbias``)."""
    A, P, C, R = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape != (K, C // cpg) or inv.shape != mean.shape:
        raise ValueError(_MISFIT_STATS)
    if scale.shape[0] != C or dscale.shape[0] != C or dbias.shape[0] != C or \
            dy.shape != x.shape or dx.shape != x.shape:
        raise ValueError("pdjit: norm_grad: Scale, Y@GRAD or the gradients do not fit X")
    if mode == 0:
        s1 = np.zeros((K, C))
        s2 = np.zeros((K, C))
        a0, a1 = 0, A
    elif s1.shape != (K, C) or s2.shape != (K, C):
        raise ValueError("pdjit: norm_grad: the partial sums do not fit X")
    mc = np.zeros((K, C))  # each channel's group mean
    for k in range(K):
        for c in range(C):
            mc[k, c] = mean[k, c // cpg]
    x3 = x.reshape((A, P, C * R))  # indexed [a, p, c] when R == 1
    g3 = dy.reshape((A, P, C * R))
    d3 = dx.reshape((A, P, C * R))
    if mode != 2:
        for a in range(a0, a1):
            k = a if per_sample else 0
            for p in range(P):
                if R == 1:
                    for c in range(C):
                        d = g3[a, p, c]
                        s1[k, c] += d
                        s2[k, c] += d * (x3[a, p, c] - mc[k, c])
                else:
                    for c in range(C):
                        m = mc[k, c]
                        xr = x[a, p, c]
                        gr = dy[a, p, c]
                        t = 0.0
                        u = 0.0
                        for r in range(R):
                            d = gr[r]
                            t += d
                            u += d * (xr[r] - m)
                        s1[k, c] += t
                        s2[k, c] += u
        if mode == 1:
            return
    # dx = cg * dy + cx * (x - mean) + c0, per (k, c)
    sg = np.zeros((K, C // cpg))   # sum over the group of g
    sgx = np.zeros((K, C // cpg))  # sum over the group of g * xhat
    ds = np.zeros((1, C))
    db = np.zeros((1, C))
    for k in range(K):
        for c in range(C):
            g = c // cpg
            db[0, c] += s1[k, c]
            ds[0, c] += s2[k, c] * inv[k, g]
            sg[k, g] += s1[k, c] * scale[c]
            sgx[k, g] += s2[k, c] * inv[k, g] * scale[c]
    if a0 == 0:
        for c in range(C):
            dscale[c] = ds[0, c]
            dbias[c] = db[0, c]
    n = P * R * cpg * (1 if per_sample else A)
    cg = np.zeros((K, C))
    cx = np.zeros((K, C))
    c0 = np.zeros((K, C))
    for k in range(K):
        for c in range(C):
            g = c // cpg
            iv = inv[k, g]
            cg[k, c] = iv * scale[c]
            if batch_stats:
                cx[k, c] = -iv * iv * sgx[k, g] / n
                c0[k, c] = -iv * sg[k, g] / n
    for a in range(a0, a1):
        k = a if per_sample else 0
        for p in range(P):
            if R == 1:
                for c in range(C):
                    d3[a, p, c] = cg[k, c] * g3[a, p, c] + cx[k, c] * (x3[a, p, c] - mc[k, c]) \
                        + c0[k, c]
            else:
                for c in range(C):
                    gc = cg[k, c]
                    xc = cx[k, c]
                    zc = c0[k, c]
                    m = mc[k, c]
                    xr = x[a, p, c]
                    gr = dy[a, p, c]
                    dr = dx[a, p, c]
                    for r in range(R):
                        dr[r] = gc * gr[r] + xc * (xr[r] - m) + zc


#: from this many elements the samples are split over the free cores' threads. Measured on the
#: 2-vCPU machine (one thread vs two, us, stats / apply / grad): [32, 16, 32, 32] 85/94/215 vs
#: 192/124/273, [32, 128, 4, 4] 18/15/35 vs 152/81/186, [64, 32, 32, 32] 335/374/908 vs
#: 327/271/642, [64, 64, 32, 32] 689/837/2244 vs 502/525/1486; while another process kept a
#: core busy two threads lost at every size ([128, 64, 32, 32] 1618/1743/4441 vs
#: 1774/1925/4796), hence ``free_cores``
_NORM_PARALLEL_MIN = 1 << 21
_NONE = np.zeros((0, 0))  # the partial sums that mode 0 does not read


def _norm_parts(x) -> int:
    """How many slices of samples the data ``x`` (4-D) is split into."""
    a = x.shape[0]
    if a < 2 or x.size < _NORM_PARALLEL_MIN:
        return 1
    return max(1, min(a, loop_threads(), free_cores()))


def _on_parts(fn, parts, n, per_part, *args):
    """``fn(*args, *per_part(p), lo, hi)`` for ``parts`` slices ``lo..hi`` of ``0..n``, on the
    library threads (this one takes the first slice)."""
    def bounds(p):
        return p * n // parts, (p + 1) * n // parts
    futures = [_threads().submit(fn, *args, *per_part(p), *bounds(p)) for p in range(1, parts)]
    fn(*args, *per_part(0), *bounds(0))
    for f in futures:
        f.result()


def _group_sums(acc, cpg):
    """``(parts, K, C)`` partial sums -> ``(K, C / cpg)`` sums per group."""
    tot = acc.sum(axis=0)
    return tot if cpg == 1 else tot.reshape(tot.shape[0], -1, cpg).sum(axis=2)


def norm_stats(x, per_sample, cpg, mean, var):
    """``mean[k, g]`` and biased ``var[k, g]`` (float64 ``(K, G)``) of the groups of ``x``
    (``(A, P, C, R)``; see the module's docstring)."""
    A, P, C, R = x.shape
    parts = _norm_parts(x)
    if parts == 1:
        _stats_k(x, per_sample, cpg, mean, var, _NONE, _NONE, 0, 0, A)
        return
    K = A if per_sample else 1
    n = P * R * max(cpg, 1) * (1 if per_sample else A)
    acc = np.zeros((parts, K, C))
    mc = np.zeros((K, C))
    _on_parts(_stats_k, parts, A, lambda p: (acc[p], mc, 1), x, per_sample, cpg, mean, var)
    mean[:, :] = _group_sums(acc, cpg) / n
    mc[:, :] = np.repeat(mean, cpg, axis=1)
    acc[:] = 0.0
    _on_parts(_stats_k, parts, A, lambda p: (acc[p], mc, 2), x, per_sample, cpg, mean, var)
    var[:, :] = _group_sums(acc, cpg) / n


def norm_apply(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
    """``y = (x - mean[k, g]) * inv[k, g] * scale[c] + bias[c]``, computed as ``x * s + b``
    per channel (as Paddle's CPU kernel does), then ``max(y, 0)`` with ``relu``."""
    parts = _norm_parts(x)
    if parts == 1:
        _apply_k(x, mean, inv, scale, bias, _plain(per_sample), _plain(cpg), _plain(relu), y,
                 _plain(0), x.shape[0])
    else:
        _on_parts(_apply_k, parts, x.shape[0], lambda p: (), x, mean, inv, scale, bias,
                  per_sample, cpg, relu, y)


def norm_grad(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
    """The gradients of :func:`norm_apply` (without relu): see :func:`_grad_k`."""
    A, _, C, _ = x.shape
    parts = _norm_parts(x)
    if parts == 1:
        _grad_k(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias, _NONE,
                _NONE, 0, 0, A)
        return
    K = A if per_sample else 1
    s1 = np.zeros((parts, K, C))
    s2 = np.zeros((parts, K, C))
    args = (x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias)
    _on_parts(_grad_k, parts, A, lambda p: (s1[p], s2[p], 1), *args)
    t1, t2 = s1.sum(axis=0), s2.sum(axis=0)
    _on_parts(_grad_k, parts, A, lambda p: (t1, t2, 2), *args)


# inside compiled code (a native loop's driver): everything on this thread; constants passed
# on as plain values (see conv._plain)
@overload(norm_stats)
def _norm_stats_native(x, per_sample, cpg, mean, var):
    def impl(x, per_sample, cpg, mean, var):
        none = np.zeros((0, 0))
        _stats_k(x, _plain(per_sample), _plain(cpg), mean, var, none, none, _plain(0),
                 _plain(0), x.shape[0])
    return impl


@overload(norm_apply)
def _norm_apply_native(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
    def impl(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
        _apply_k(x, mean, inv, scale, bias, _plain(per_sample), _plain(cpg), _plain(relu), y,
                 _plain(0), x.shape[0])
    return impl


@overload(norm_grad)
def _norm_grad_native(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
    def impl(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
        none = np.zeros((0, 0))
        _grad_k(x, dy, mean, inv, scale, _plain(per_sample), _plain(cpg), _plain(batch_stats),
                dx, dscale, dbias, none, none, _plain(0), _plain(0), x.shape[0])
    return impl


# what the lowerings pass: 4-D views of the data, float64 statistics (K, G), per-channel
# parameters of the data's type
_S = ((_F64, 2), (_F64, 2), int, int, int)  # partial sums, mode, range
jobs("norm_stats")(lambda T: [(_stats_k, ((T, 4), bool, int, (_F64, 2), (_F64, 2)) + _S)])
jobs("norm_apply")(lambda T: [(_apply_k, ((T, 4), (_F64, 2), (_F64, 2), (T, 1), (T, 1), bool,
                                          int, bool, (T, 4), int, int))])
jobs("norm_grad")(lambda T: [(_grad_k, ((T, 4), (T, 4), (_F64, 2), (_F64, 2), (T, 1), bool, int,
                                        bool, (T, 4), (T, 1), (T, 1)) + _S)])


# ---- layer norm: rows of (M, N) ----------------------------------------------------------------

# below this many elements the rows run on one thread: measured on 2 busy cores, two threads
# lost at [4096, 256] (379 us against 309 us) and won at [4096, 1024] (9.5 ms against 11 ms)
_LN_PARALLEL_MIN = 1 << 21


@_rjit
def _ln_fwd_rows(x, scale, bias, eps, y, mean, var, r0, r1):
    """Rows ``r0..r1``: ``mean[i]``, biased ``var[i]`` and ``y[i] = (x[i] - mean[i]) /
    sqrt(var[i] + eps) * scale + bias``: statistics in float64, ``y`` in ``x``'s type."""
    n = x.shape[1]
    t = np.empty(2, x.dtype)  # mean and 1 / std rounded to x's type
    for i in range(r0, r1):
        xr = x[i]
        s = 0.0
        for j in range(n):
            s += xr[j]
        m = s / n
        q = 0.0
        for j in range(n):
            d = xr[j] - m
            q += d * d
        v = q / n
        mean[i] = m
        var[i] = v
        t[0] = m
        t[1] = 1.0 / np.sqrt(v + eps)
        mt = t[0]
        it = t[1]
        yr = y[i]
        for j in range(n):  # in the data's type: twice the lanes of float64 for float32
            yr[j] = (xr[j] - mt) * it * scale[j] + bias[j]


@_rjit
def _ln_bwd_rows(x, dy, mean, var, scale, eps, want_dx, dx, acc, r0, r1):
    """Rows ``r0..r1`` of the gradients: ``acc[0, j] += sum(dy * xhat)`` and ``acc[1, j] +=
    sum(dy)`` over the rows (float64), and with ``want_dx`` ``dx = inv * (g - mean(g) - xhat *
    mean(g * xhat))`` per row, ``g = dy * scale``, ``xhat = (x - mean) * inv`` (products in
    ``x``'s type, sums in float64)."""
    n = x.shape[1]
    ds = acc[0]
    db = acc[1]
    t = np.empty(4, x.dtype)  # per-row coefficients rounded to x's type
    for i in range(r0, r1):
        xr = x[i]
        gr = dy[i]
        t[0] = mean[i]
        t[1] = 1.0 / np.sqrt(np.float64(var[i]) + eps)
        m = t[0]
        inv = t[1]
        sg = 0.0
        sgx = 0.0
        for j in range(n):
            d = gr[j]
            xh = (xr[j] - m) * inv
            g = d * scale[j]
            sg += g
            sgx += g * xh
            ds[j] += d * xh
            db[j] += d
        if want_dx:
            t[2] = sg / n
            t[3] = sgx / n
            a = t[2]
            b = t[3]
            dr = dx[i]
            for j in range(n):
                xh = (xr[j] - m) * inv
                dr[j] = inv * (gr[j] * scale[j] - a - xh * b)


_LN_MISFIT = "pdjit: layer_norm: Scale, Bias, Y or the statistics do not fit X's rows"


@jit
def _ln_fwd_fits(x, scale, bias, y, mean, var) -> bool:
    m, n = x.shape
    return scale.shape[0] == n and bias.shape[0] == n and y.shape == x.shape and \
        mean.shape[0] == m and var.shape[0] == m


@jit
def _ln_bwd_fits(x, dy, mean, var, scale, want_dx, dx, dscale, dbias) -> bool:
    m, n = x.shape
    return dy.shape == x.shape and mean.shape[0] == m and var.shape[0] == m and \
        scale.shape[0] == n and dscale.shape[0] == n and dbias.shape[0] == n and \
        (not want_dx or dx.shape == x.shape)


def _ln_parts(rows: int, size: int) -> int:
    if rows < 2 or size < _LN_PARALLEL_MIN:
        return 1
    return max(1, min(rows, loop_threads()))


def layer_norm_fwd(x, scale, bias, eps, y, mean, var):
    """Layer norm of the rows of ``x`` ``(M, N)``: writes ``y`` ``(M, N)`` and the row
    statistics ``mean``, ``var`` ``(M,)`` (biased variance); ``eps`` is added to the variance."""
    if not _ln_fwd_fits(x, scale, bias, y, mean, var):
        raise ValueError(_LN_MISFIT)
    m = x.shape[0]
    if _ln_parts(m, x.size) == 1:
        _ln_fwd_rows(x, scale, bias, eps, y, mean, var, 0, m)
    else:
        split_work(_ln_fwd_rows, m, 1 << 30, x, scale, bias, eps, y, mean, var, head=7)


def layer_norm_bwd(x, dy, mean, var, scale, eps, want_dx, dx, dscale, dbias):
    """Gradients of :func:`layer_norm_fwd` through the row statistics ``mean``, ``var`` (those
    the forward pass wrote): ``dx`` (written only with ``want_dx``), ``dscale[j] = sum_i dy *
    xhat`` and ``dbias[j] = sum_i dy`` (overwritten)."""
    if not _ln_bwd_fits(x, dy, mean, var, scale, want_dx, dx, dscale, dbias):
        raise ValueError(_LN_MISFIT)
    m, n = x.shape
    parts = _ln_parts(m, x.size)
    acc = np.zeros((parts, 2, n))
    if parts == 1:
        _ln_bwd_rows(x, dy, mean, var, scale, eps, want_dx, dx, acc[0], 0, m)
    else:
        from pdjit.codegen.nnlib.conv import _threads

        futures = [_threads().submit(_ln_bwd_rows, x, dy, mean, var, scale, eps, want_dx, dx,
                                     acc[p], p * m // parts, (p + 1) * m // parts)
                   for p in range(parts)]
        for f in futures:
            f.result()
    total = acc.sum(axis=0)
    dscale[:] = total[0]
    dbias[:] = total[1]


# inside compiled code (a native loop's driver): every row on this thread
@overload(layer_norm_fwd)
def _layer_norm_fwd_native(x, scale, bias, eps, y, mean, var):
    def impl(x, scale, bias, eps, y, mean, var):
        if not _ln_fwd_fits(x, scale, bias, y, mean, var):
            raise ValueError(_LN_MISFIT)
        _ln_fwd_rows(x, scale, bias, _plain(eps), y, mean, var, _plain(0), x.shape[0])
    return impl


@overload(layer_norm_bwd)
def _layer_norm_bwd_native(x, dy, mean, var, scale, eps, want_dx, dx, dscale, dbias):
    def impl(x, dy, mean, var, scale, eps, want_dx, dx, dscale, dbias):
        if not _ln_bwd_fits(x, dy, mean, var, scale, want_dx, dx, dscale, dbias):
            raise ValueError(_LN_MISFIT)
        acc = np.zeros((2, x.shape[1]))
        _ln_bwd_rows(x, dy, mean, var, scale, _plain(eps), _plain(want_dx), dx, acc, _plain(0),
                     x.shape[0])
        for j in range(x.shape[1]):
            dscale[j] = acc[0, j]
            dbias[j] = acc[1, j]
    return impl


jobs("layer_norm_fwd")(lambda T: [(_ln_fwd_rows, ((T, 2), (T, 1), (T, 1), float, (T, 2),
                                                  (T, 1), (T, 1), int, int))])
jobs("layer_norm_bwd")(lambda T: [(_ln_bwd_rows, ((T, 2), (T, 2), (T, 1), (T, 1), (T, 1), float,
                                                  bool, (T, 2), (_F64, 2), int, int))])
