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

from pdjit.codegen.nnlib._jit import jit, jobs
from pdjit.codegen.nnlib.conv import split_work
from pdjit.runtime.threads import loop_threads

__all__ = ["norm_stats", "norm_apply", "norm_grad", "layer_norm_fwd", "layer_norm_bwd"]


@jit
def norm_stats(x, per_sample, cpg, mean, var):
    """``mean[k, g]`` and biased ``var[k, g]`` of the groups of ``x``."""
    A, P, C, R = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape != (K, C // cpg) or var.shape != mean.shape:
        raise ValueError("pdjit: the norm statistics do not fit the data")
    mean[:, :] = 0.0
    var[:, :] = 0.0
    n = P * R * cpg * (1 if per_sample else A)
    if n == 0:
        return
    acc = np.zeros((K, C))
    x3 = x.reshape((A, P, C * R))  # indexed [a, p, c] when R == 1
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            if R == 1:
                for c in range(C):
                    acc[k, c] += x3[a, p, c]
            else:
                for c in range(C):  # four partial sums: independent chains run faster
                    t0 = t1 = t2 = t3 = 0.0
                    r = 0
                    while r + 4 <= R:
                        t0 += x[a, p, c, r]
                        t1 += x[a, p, c, r + 1]
                        t2 += x[a, p, c, r + 2]
                        t3 += x[a, p, c, r + 3]
                        r += 4
                    while r < R:
                        t0 += x[a, p, c, r]
                        r += 1
                    acc[k, c] += (t0 + t1) + (t2 + t3)
    for k in range(K):
        for c in range(C):
            mean[k, c // cpg] += acc[k, c]
    mean /= n
    mc = np.empty((K, C))  # each channel's group mean
    for k in range(K):
        for c in range(C):
            mc[k, c] = mean[k, c // cpg]
    acc[:, :] = 0.0
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            if R == 1:
                for c in range(C):
                    d = x3[a, p, c] - mc[k, c]
                    acc[k, c] += d * d
            else:
                for c in range(C):
                    m = mc[k, c]
                    t0 = t1 = t2 = t3 = 0.0
                    r = 0
                    while r + 4 <= R:
                        d0 = x[a, p, c, r] - m
                        d1 = x[a, p, c, r + 1] - m
                        d2 = x[a, p, c, r + 2] - m
                        d3 = x[a, p, c, r + 3] - m
                        t0 += d0 * d0
                        t1 += d1 * d1
                        t2 += d2 * d2
                        t3 += d3 * d3
                        r += 4
                    while r < R:
                        d0 = x[a, p, c, r] - m
                        t0 += d0 * d0
                        r += 1
                    acc[k, c] += (t0 + t1) + (t2 + t3)
    for k in range(K):
        for c in range(C):
            var[k, c // cpg] += acc[k, c]
    var /= n


@jit
def norm_apply(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
    """``y = (x - mean[k, g]) * inv[k, g] * scale[c] + bias[c]``, computed as ``x * s + b``
    per channel (as Paddle's CPU kernel does), then ``max(y, 0)`` with ``relu``."""
    A, P, C, R = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape != (K, C // cpg) or inv.shape != mean.shape:
        raise ValueError("pdjit: the norm statistics do not fit the data")
    if scale.shape[0] != C or bias.shape[0] != C or y.shape != x.shape:
        raise ValueError("pdjit: norm_apply: Scale, Bias or Y do not fit X")
    s = np.empty((K, C))
    b = np.empty((K, C))
    for k in range(K):
        for c in range(C):
            g = c // cpg
            s[k, c] = inv[k, g] * scale[c]
            b[k, c] = bias[c] - mean[k, g] * s[k, c]
    x3 = x.reshape((A, P, C * R))  # indexed [a, p, c] when R == 1
    y3 = y.reshape((A, P, C * R))
    for a in range(A):
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


@jit
def norm_grad(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
    """The gradients of :func:`norm_apply` (without relu): ``dscale[c] = sum(dy * xhat)``,
    ``dbias[c] = sum(dy)`` and, with ``batch_stats`` (the statistics are those of ``x``),
    ``dx = inv * (g - mean(g) - xhat * mean(g * xhat))`` over each group where
    ``g = dy * scale[c]``; without (fixed statistics) ``dx = inv * g``."""
    A, P, C, R = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape != (K, C // cpg) or inv.shape != mean.shape:
        raise ValueError("pdjit: the norm statistics do not fit the data")
    if scale.shape[0] != C or dscale.shape[0] != C or dbias.shape[0] != C or \
            dy.shape != x.shape or dx.shape != x.shape:
        raise ValueError("pdjit: norm_grad: Scale, Y@GRAD or the gradients do not fit X")
    mc = np.empty((K, C))  # each channel's group mean
    for k in range(K):
        for c in range(C):
            mc[k, c] = mean[k, c // cpg]
    s1 = np.zeros((K, C))  # sum(dy)
    s2 = np.zeros((K, C))  # sum(dy * (x - mean))
    x3 = x.reshape((A, P, C * R))  # indexed [a, p, c] when R == 1
    g3 = dy.reshape((A, P, C * R))
    d3 = dx.reshape((A, P, C * R))
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            if R == 1:
                for c in range(C):
                    d = g3[a, p, c]
                    s1[k, c] += d
                    s2[k, c] += d * (x3[a, p, c] - mc[k, c])
            else:
                for c in range(C):  # two partial sums of each
                    m = mc[k, c]
                    t0 = t1 = u0 = u1 = 0.0
                    r = 0
                    while r + 2 <= R:
                        d0 = dy[a, p, c, r]
                        d1 = dy[a, p, c, r + 1]
                        t0 += d0
                        t1 += d1
                        u0 += d0 * (x[a, p, c, r] - m)
                        u1 += d1 * (x[a, p, c, r + 1] - m)
                        r += 2
                    if r < R:
                        d0 = dy[a, p, c, r]
                        t0 += d0
                        u0 += d0 * (x[a, p, c, r] - m)
                    s1[k, c] += t0 + t1
                    s2[k, c] += u0 + u1
    # dx = cg * dy + cx * (x - mean) + c0, per (k, c)
    sg = np.zeros(mean.shape)   # sum over the group of g
    sgx = np.zeros(mean.shape)  # sum over the group of g * xhat
    for c in range(C):
        dscale[c] = 0.0
        dbias[c] = 0.0
    for k in range(K):
        for c in range(C):
            g = c // cpg
            dbias[c] += s1[k, c]
            dscale[c] += s2[k, c] * inv[k, g]
            sg[k, g] += s1[k, c] * scale[c]
            sgx[k, g] += s2[k, c] * inv[k, g] * scale[c]
    n = P * R * cpg * (1 if per_sample else A)
    cg = np.empty((K, C))
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
    for a in range(A):
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
                    for r in range(R):
                        dx[a, p, c, r] = gc * dy[a, p, c, r] + xc * (x[a, p, c, r] - m) + zc


# what the lowerings pass: 4-D views of the data, float64 statistics (K, G), per-channel
# parameters of the data's type
_F64 = np.dtype(np.float64)
jobs("norm_stats")(lambda T: [(norm_stats, ((T, 4), bool, int, (_F64, 2), (_F64, 2)))])
jobs("norm_apply")(lambda T: [(norm_apply, ((T, 4), (_F64, 2), (_F64, 2), (T, 1), (T, 1), bool,
                                            int, bool, (T, 4)))])
jobs("norm_grad")(lambda T: [(norm_grad, ((T, 4), (T, 4), (_F64, 2), (_F64, 2), (T, 1), bool,
                                          int, bool, (T, 4), (T, 1), (T, 1)))])


# ---- layer norm: rows of (M, N) ----------------------------------------------------------------
#: sums over a row may be reassociated (vectorised): the row kernels of layer norm
_rjit = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})

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
        _ln_fwd_rows(x, scale, bias, eps, y, mean, var, 0, x.shape[0])
    return impl


@overload(layer_norm_bwd)
def _layer_norm_bwd_native(x, dy, mean, var, scale, eps, want_dx, dx, dscale, dbias):
    def impl(x, dy, mean, var, scale, eps, want_dx, dx, dscale, dbias):
        if not _ln_bwd_fits(x, dy, mean, var, scale, want_dx, dx, dscale, dbias):
            raise ValueError(_LN_MISFIT)
        acc = np.zeros((2, x.shape[1]))
        _ln_bwd_rows(x, dy, mean, var, scale, eps, want_dx, dx, acc, 0, x.shape[0])
        for j in range(x.shape[1]):
            dscale[j] = acc[0, j]
            dbias[j] = acc[1, j]
    return impl


jobs("layer_norm_fwd")(lambda T: [(_ln_fwd_rows, ((T, 2), (T, 1), (T, 1), float, (T, 2),
                                                  (T, 1), (T, 1), int, int))])
jobs("layer_norm_bwd")(lambda T: [(_ln_bwd_rows, ((T, 2), (T, 2), (T, 1), (T, 1), (T, 1), float,
                                                  bool, (T, 2), (_F64, 2), int, int))])
