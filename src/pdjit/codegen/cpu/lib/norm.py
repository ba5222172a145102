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
import threading

import numba
import numpy as np
from numba.extending import overload, register_jitable

from pdjit.codegen.cpu import replay
from pdjit.codegen.cpu.lib import team
from pdjit.codegen.cpu.lib._jit import compile_cost, jit, jit_sum, jobs, pjit
from pdjit.codegen.cpu.lib.conv import _TEAM_TYPES, _plain, split_work
from pdjit.codegen.cpu.threads import free_cores, loop_threads, run_parts

_F64 = np.dtype(np.float64)


__all__ = ["norm_stats", "norm_apply", "norm_grad", "layer_norm_fwd", "layer_norm_bwd"]

_MISFIT_STATS = "pdjit: the norm statistics do not fit the data"


# ---- batch, instance and group norm -------------------------------------------------------------
# Three small kernels do the passes over the data: :func:`_stats_k` sums per (k, c) (the
# statistics' two passes and the gradient's sums), :func:`_apply_k` writes ``y = x * s + b``
# per channel and :func:`_grad_k` writes ``dx``. The bookkeeping on a few values per channel
# (group sums, coefficients) is NumPy in the host entry points (and loops in the native ones).
# Each pass works on a range of samples ``a0..a1``, so large data is split over threads (each
# slice sums into partials of its own, added up afterwards). They take no scratch arrays of
# their own and call no NumPy function: every Numba function (and every signature of a NumPy
# overload such as ``np.zeros``) costs a compilation of its own, measured on the cold first step
# of bench_cnn's ResNet (fresh caches, serial): the former kernels that did it all (modes, group
# sums, their scratch ``np.zeros``) compiled in 2.1 s; these in about a third of it.
# ``K`` (rows of the per-channel arrays) is 1 (statistics over the batch) or ``A`` (per sample).


@jit_sum
def _stats_k(x, dy, mc, s1, s2, mode, a0, a1):
    """Float64 sums over the values of channel ``c`` of the samples ``a0..a1`` (``k = a`` when
    ``s1`` has a row per sample, else 0): mode 0 ``s1[k, c] += sum(x)``, mode 1 ``s1[k, c] +=
    sum((x - mc[k, c])**2)``, mode 2 ``s1[k, c] += sum(dy)`` and ``s2[k, c] += sum(dy * (x -
    mc[k, c]))`` (``dy`` and ``s2`` are read in mode 2 only, ``mc`` in modes 1 and 2)."""
    A, P, C = x.shape[0], x.shape[1], x.shape[2]
    K = s1.shape[0]
    if (K != 1 and K != A) or s1.shape[1] != C or s2.shape[0] != K or s2.shape[1] != C or \
            mc.shape[0] != K or mc.shape[1] != C or dy.shape != x.shape or \
            a0 < 0 or a1 > A:
        raise ValueError(_MISFIT_STATS)
    for a in range(a0, a1):
        k = a if K > 1 else 0
        for p in range(P):
            if x.ndim == 3:  # channel-last rows (compiled for 3-D views only)
                if mode == 0:
                    for c in range(C):
                        s1[k, c] += x[a, p, c]
                elif mode == 1:
                    for c in range(C):
                        d = x[a, p, c] - mc[k, c]
                        s1[k, c] += d * d
                else:
                    for c in range(C):
                        d = dy[a, p, c]
                        s1[k, c] += d
                        s2[k, c] += d * (x[a, p, c] - mc[k, c])
            else:
                R = x.shape[3]
                for c in range(C):
                    xr = x[a, p, c]
                    m = mc[k, c]
                    t = 0.0
                    if mode == 0:
                        for r in range(R):
                            t += xr[r]
                    elif mode == 1:
                        for r in range(R):
                            d = xr[r] - m
                            t += d * d
                    else:
                        gr = dy[a, p, c]
                        u = 0.0
                        for r in range(R):
                            d = gr[r]
                            t += d
                            u += d * (xr[r] - m)
                        s2[k, c] += u
                    s1[k, c] += t


@jit
def _apply_k(x, s, b, relu, y, a0, a1):
    """Samples ``a0..a1``: ``y = x * s[k, c] + b[k, c]`` (float64 coefficients), then ``max(y,
    0)`` with ``relu``."""
    A, P, C = x.shape[0], x.shape[1], x.shape[2]
    K = s.shape[0]
    if (K != 1 and K != A) or s.shape[1] != C or b.shape[0] != K or b.shape[1] != C or \
            y.shape != x.shape or a0 < 0 or a1 > A:
        raise ValueError("pdjit: norm_apply: Scale, Bias or Y do not fit X")
    for a in range(a0, a1):
        k = a if K > 1 else 0
        for p in range(P):
            if x.ndim == 3:
                for c in range(C):
                    v = x[a, p, c] * s[k, c] + b[k, c]
                    if relu and v < 0.0:
                        v = 0.0
                    y[a, p, c] = v
            else:
                for c in range(C):
                    sc = s[k, c]
                    bc = b[k, c]
                    xr = x[a, p, c]
                    yr = y[a, p, c]
                    for r in range(x.shape[3]):
                        v = xr[r] * sc + bc
                        if relu and v < 0.0:
                            v = 0.0
                        yr[r] = v


@jit_sum
def _grad_k(x, dy, mc, cg, cx, c0, dx, a0, a1):
    """Samples ``a0..a1``: ``dx = cg[k, c] * dy + cx[k, c] * (x - mc[k, c]) + c0[k, c]``."""
    A, P, C = x.shape[0], x.shape[1], x.shape[2]
    K = cg.shape[0]
    if (K != 1 and K != A) or cg.shape[1] != C or cx.shape != cg.shape or \
            c0.shape != cg.shape or mc.shape != cg.shape or dy.shape != x.shape or \
            dx.shape != x.shape or a0 < 0 or a1 > A:
        raise ValueError("pdjit: norm_grad: Scale, Y@GRAD or the gradients do not fit X")
    for a in range(a0, a1):
        k = a if K > 1 else 0
        for p in range(P):
            if x.ndim == 3:
                for c in range(C):
                    dx[a, p, c] = cg[k, c] * dy[a, p, c] + cx[k, c] * (x[a, p, c] - mc[k, c]) \
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
                    for r in range(x.shape[3]):
                        dr[r] = gc * gr[r] + xc * (xr[r] - m) + zc


def _view(x):
    """The view the kernels take of ``(A, P, C, R)`` data: ``(A, P, C)`` when ``R == 1``
    (channel-last rows: the loop over channels is the inner one), else itself. The kernels
    branch on ``x.ndim``, which Numba knows when it compiles: each view compiles only its own
    loops (NCHW data, a ResNet's, never compiles the channel-last ones)."""
    return x.reshape(x.shape[:3]) if x.ndim == 4 and x.shape[3] == 1 else x


#: from this many elements the samples are split over the free cores' threads. Measured on the
#: 2-vCPU machine (one thread vs two, us, stats / apply / grad): [32, 16, 32, 32] 85/94/215 vs
#: 192/124/273, [32, 128, 4, 4] 18/15/35 vs 152/81/186, [64, 32, 32, 32] 335/374/908 vs
#: 327/271/642, [64, 64, 32, 32] 689/837/2244 vs 502/525/1486; while another process kept a
#: core busy two threads lost at every size ([128, 64, 32, 32] 1618/1743/4441 vs
#: 1774/1925/4796), hence ``free_cores``
_NORM_PARALLEL_MIN = 1 << 21


def _norm_parts(x) -> int:
    """How many slices of samples the data ``x`` (4-D) is split into."""
    a = x.shape[0]
    if a < 2 or x.size < _NORM_PARALLEL_MIN:
        return 1
    return max(1, min(a, loop_threads(), free_cores()))


def _on_parts(fn, parts, n, per_part, *args):
    """``fn(*args, *per_part(p), lo, hi)`` for ``parts`` slices ``lo..hi`` of ``0..n``, on
    ``threads.run_parts``' helpers (this thread takes the first slice)."""
    run_parts(fn, [(*args, *per_part(p), p * n // parts, (p + 1) * n // parts)
                   for p in range(parts)], parts - 1)


def _passes(fn, parts, n, per_part, *args):
    """:func:`_on_parts`, or the one call on this thread."""
    if parts == 1:
        fn(*args, *per_part(0), 0, n)
    else:
        _on_parts(fn, parts, n, per_part, *args)


def _stat_rows(x, per_sample, cpg, mean, other) -> int:
    """``K`` of statistics ``(K, C / cpg)`` that fit ``x`` (else ``ValueError``)."""
    A, _, C, _ = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape != (K, C // cpg) or other.shape != mean.shape:
        raise ValueError(_MISFIT_STATS)
    return K


def _per_channel(stat, cpg):
    """``(K, G)`` values per group -> ``(K, C)`` float64 values per channel (C-contiguous)."""
    stat = np.ascontiguousarray(stat, dtype=np.float64)
    return stat if cpg == 1 else np.repeat(stat, cpg, axis=1)


def _group_sums(acc, cpg):
    """``(K, C)`` sums per channel -> ``(K, C / cpg)`` sums per group."""
    return acc if cpg == 1 else acc.reshape(acc.shape[0], -1, cpg).sum(axis=2)


_scratch = threading.local()


def _zeros(count, k, c):
    """``count`` float64 zero arrays ``(k, c)``, each from a 64-byte boundary: partial sums that
    the kernels load and store for every row of channel-last data (NumPy's small arrays start
    at 16 bytes; measured, [64, 256, 32, 1] statistics: 180 us when the sums were aligned,
    270-350 us in the processes where they were not). Kept per thread and shape and zeroed
    for each call (finding an array's address costs ~1.5 us): what a call returns must not
    keep them."""
    cache = getattr(_scratch, "sums", None)
    if cache is None:
        cache = _scratch.sums = {}
    key = (count, k, c)
    hit = cache.get(key)
    if hit is None:
        row = -(-k * c // 8) * 8  # whole 64-byte lines
        buf = np.empty(count * row + 8)
        at = (-buf.ctypes.data % 64) // 8
        hit = cache[key] = (buf, [buf[at + i * row:at + i * row + k * c].reshape(k, c)
                                  for i in range(count)])
    hit[0][:] = 0.0
    return hit[1]


def _total(parts):
    """The sum of the slices' partial sums."""
    return parts[0] if len(parts) == 1 else np.sum(parts, axis=0)


def _count(x, per_sample, cpg) -> int:
    """The number of values per group."""
    A, P, _, R = x.shape
    return P * R * cpg * (1 if per_sample else A)


def norm_stats(x, per_sample, cpg, mean, var):
    """``mean[k, g]`` and biased ``var[k, g]`` (float64 ``(K, G)``) of the groups of ``x``
    (``(A, P, C, R)``; see the module's docstring)."""
    K = _stat_rows(x, per_sample, cpg, mean, var)
    A, _, C, _ = x.shape
    n = _count(x, per_sample, cpg)
    if n == 0:
        mean[:, :] = 0.0
        var[:, :] = 0.0
        return
    parts = _norm_parts(x)
    acc = _zeros(parts, K, C)
    x = _view(x)
    _passes(_stats_k, parts, A, lambda p: (acc[p], acc[p], 0), x, x, acc[0])
    mean[:, :] = _group_sums(_total(acc), cpg) / n
    mc = _per_channel(mean, cpg)
    acc = _zeros(parts, K, C)
    _passes(_stats_k, parts, A, lambda p: (acc[p], acc[p], 1), x, x, mc)
    var[:, :] = _group_sums(_total(acc), cpg) / n


def norm_apply(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
    """``y = (x - mean[k, g]) * inv[k, g] * scale[c] + bias[c]``, computed as ``x * s + b``
    per channel (as Paddle's CPU kernel does), then ``max(y, 0)`` with ``relu``."""
    _stat_rows(x, per_sample, cpg, mean, inv)
    C = x.shape[2]
    if scale.shape[0] != C or bias.shape[0] != C or y.shape != x.shape:
        raise ValueError("pdjit: norm_apply: Scale, Bias or Y do not fit X")
    s = _per_channel(inv, cpg) * scale.astype(np.float64)  # (exact: the products as before)
    b = bias.astype(np.float64) - _per_channel(mean, cpg) * s
    _passes(_apply_k, _norm_parts(x), x.shape[0], lambda p: (), _view(x), s, b, bool(relu),
            _view(y))


def norm_grad(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
    """The gradients of :func:`norm_apply` (without relu): ``dscale[c] = sum(dy * xhat)``,
    ``dbias[c] = sum(dy)`` and, with ``batch_stats`` (the statistics are those of ``x``),
    ``dx = inv * (g - mean(g) - xhat * mean(g * xhat))`` over each group where
    ``g = dy * scale[c]``; without (fixed statistics) ``dx = inv * g``. As ``dx = cg * dy + cx
    * (x - mean) + c0`` per (k, c), from the sums ``s1 = sum(dy)``, ``s2 = sum(dy * (x -
    mean))`` per (k, c) (float64)."""
    K = _stat_rows(x, per_sample, cpg, mean, inv)
    A, _, C, _ = x.shape
    if scale.shape[0] != C or dscale.shape[0] != C or dbias.shape[0] != C or \
            dy.shape != x.shape or dx.shape != x.shape:
        raise ValueError("pdjit: norm_grad: Scale, Y@GRAD or the gradients do not fit X")
    if x.size == 0:
        dscale[:] = 0
        dbias[:] = 0
        return
    parts = _norm_parts(x)
    n = _count(x, per_sample, cpg)
    mc = _per_channel(mean, cpg)
    acc = _zeros(2 * parts, K, C)  # s1 and s2 of each slice
    x, dy, dx = _view(x), _view(dy), _view(dx)
    _passes(_stats_k, parts, A, lambda p: (acc[2 * p], acc[2 * p + 1], 2), x, dy, mc)
    s1, s2 = _total(acc[0::2]), _total(acc[1::2])
    ic = _per_channel(inv, cpg)
    t2 = s2 * ic  # sum(dy * xhat) per (k, c)
    dbias[:] = s1[0] if K == 1 else s1.sum(axis=0)
    dscale[:] = t2[0] if K == 1 else t2.sum(axis=0)
    sc = scale.astype(np.float64)  # (exact; products of one dtype are the faster NumPy calls)
    cg = ic * sc
    if batch_stats:  # cx = -inv**2 * sum(g * xhat) / n, c0 = -inv * sum(g) / n per group
        cx = _per_channel(_group_sums(t2 * sc, cpg), cpg) * (-ic * ic / n)
        c0 = _per_channel(_group_sums(s1 * sc, cpg), cpg) * (-ic / n)
    else:
        cx = c0 = np.zeros((K, C))
    _passes(_grad_k, parts, A, lambda p: (), x, dy, mc, cg, cx, c0, dx)


# inside compiled code (a native loop's driver): everything on this thread, the bookkeeping in
# loops; constants passed on as plain values (see conv._plain)
@register_jitable
def _native_rows(x, per_sample, cpg, mean, other) -> int:
    A, P, C, R = x.shape
    K = A if per_sample else 1
    if cpg < 1 or C % cpg != 0 or mean.shape[0] != K or mean.shape[1] != C // cpg or \
            other.shape[0] != K or other.shape[1] != C // cpg:
        raise ValueError(_MISFIT_STATS)
    return K


@register_jitable
def _native_channels(stat, cpg, out):
    """``out[k, c] = stat[k, c // cpg]``."""
    for k in range(out.shape[0]):
        for c in range(out.shape[1]):
            out[k, c] = stat[k, c // cpg]


@overload(norm_stats)
def _norm_stats_native(x, per_sample, cpg, mean, var):
    def impl(x, per_sample, cpg, mean, var):
        K = _native_rows(x, per_sample, cpg, mean, var)
        A, P, C, R = x.shape
        n = P * R * cpg * (1 if per_sample else A)
        acc = np.zeros((K, C))
        mc = np.zeros((K, C))
        for sq in range(2):
            out = var if sq else mean
            out[:, :] = 0.0
            if n == 0:
                continue
            if R == 1:  # channel-last rows, as the host entry point views them
                v = x.reshape((A, P, C))
                _stats_k(v, v, mc, acc, acc, _plain(sq), _plain(0), A)
            else:
                _stats_k(x, x, mc, acc, acc, _plain(sq), _plain(0), A)
            for k in range(K):
                for c in range(C):
                    out[k, c // cpg] += acc[k, c]
                    acc[k, c] = 0.0
            for k in range(K):
                for g in range(C // cpg):
                    out[k, g] /= n
            _native_channels(mean, cpg, mc)
    return impl


@overload(norm_apply)
def _norm_apply_native(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
    def impl(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
        K = _native_rows(x, per_sample, cpg, mean, inv)
        C = x.shape[2]
        if scale.shape[0] != C or bias.shape[0] != C or y.shape != x.shape:
            raise ValueError("pdjit: norm_apply: Scale, Bias or Y do not fit X")
        s = np.zeros((K, C))
        b = np.zeros((K, C))
        for k in range(K):
            for c in range(C):
                s[k, c] = inv[k, c // cpg] * scale[c]
                b[k, c] = bias[c] - mean[k, c // cpg] * s[k, c]
        A, P, _, R = x.shape
        if R == 1:
            _apply_k(x.reshape((A, P, C)), s, b, _plain(relu), y.reshape((A, P, C)), _plain(0),
                     A)
        else:
            _apply_k(x, s, b, _plain(relu), y, _plain(0), A)
    return impl


@overload(norm_grad)
def _norm_grad_native(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
    def impl(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
        K = _native_rows(x, per_sample, cpg, mean, inv)
        A, P, C, R = x.shape
        if scale.shape[0] != C or dscale.shape[0] != C or dbias.shape[0] != C or \
                dy.shape != x.shape or dx.shape != x.shape:
            raise ValueError("pdjit: norm_grad: Scale, Y@GRAD or the gradients do not fit X")
        mc = np.zeros((K, C))
        _native_channels(mean, cpg, mc)
        s1 = np.zeros((K, C))
        s2 = np.zeros((K, C))
        cl = R == 1  # channel-last rows
        if cl:
            _stats_k(x.reshape((A, P, C)), dy.reshape((A, P, C)), mc, s1, s2, _plain(2),
                     _plain(0), A)
        else:
            _stats_k(x, dy, mc, s1, s2, _plain(2), _plain(0), A)
        G = C // cpg
        sg = np.zeros((K, G))   # sums over each group of g = dy * scale
        sgx = np.zeros((K, G))  # and of g * xhat
        for c in range(C):
            dscale[c] = 0.0
            dbias[c] = 0.0
        for k in range(K):
            for c in range(C):
                iv = inv[k, c // cpg]
                dbias[c] += s1[k, c]
                dscale[c] += s2[k, c] * iv
                sg[k, c // cpg] += s1[k, c] * scale[c]
                sgx[k, c // cpg] += s2[k, c] * iv * scale[c]
        n = P * R * cpg * (1 if per_sample else A)
        cg = np.zeros((K, C))
        cx = np.zeros((K, C))
        c0 = np.zeros((K, C))
        for k in range(K):
            for c in range(C):
                iv = inv[k, c // cpg]
                cg[k, c] = iv * scale[c]
                if batch_stats:
                    cx[k, c] = -iv * iv * sgx[k, c // cpg] / n
                    c0[k, c] = -iv * sg[k, c // cpg] / n
        if cl:
            _grad_k(x.reshape((A, P, C)), dy.reshape((A, P, C)), mc, cg, cx, c0,
                    dx.reshape((A, P, C)), _plain(0), A)
        else:
            _grad_k(x, dy, mc, cg, cx, c0, dx, _plain(0), A)
    return impl


# what the lowerings pass: 4-D views of the data, float64 statistics (K, G), per-channel
# parameters of the data's type; what the host entry points run on them
_C2 = (_F64, 2)


def _sums_job(T):
    return _stats_k, ((T, 4), (T, 4), _C2, _C2, _C2, int, int, int)


jobs("norm_stats")(lambda T: [_sums_job(T)])
jobs("norm_apply")(lambda T: [(_apply_k, ((T, 4), _C2, _C2, bool, (T, 4), int, int))])
jobs("norm_grad")(lambda T: [_sums_job(T),
                             (_grad_k, ((T, 4), (T, 4)) + (_C2,) * 4 + ((T, 4), int, int))])


# ---- layer norm: rows of (M, N) ----------------------------------------------------------------

# below this many elements the rows run on one thread: measured on 2 busy cores, two threads
# lost at [4096, 256] (379 us against 309 us) and won at [4096, 1024] (9.5 ms against 11 ms)
_LN_PARALLEL_MIN = 1 << 21


@jit_sum
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


@jit_sum
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
    statistics ``mean``, ``var`` ``(M,)`` (biased variance); ``eps`` is added to the variance.
    Rows split over the loop threads: by a parallel loop (:func:`_ln_fwd_parts`, ``lib.team``)
    from :data:`_LN_TEAM_MIN` values where it is ready, else from :data:`_LN_PARALLEL_MIN` on
    ``run_parts``' helpers; each row computed as one thread computes it."""
    if not _ln_fwd_fits(x, scale, bias, y, mean, var):
        raise ValueError(_LN_MISFIT)
    m = x.shape[0]
    if m >= 2 and x.size >= _LN_TEAM_MIN and x.dtype in _TEAM_TYPES:
        parts = min(m, loop_threads())
        call = (x, scale, bias, float(eps), y, mean, var, parts)
        if parts > 1 and team.run(_ln_fwd_parts, call):
            return
    if _ln_parts(m, x.size) == 1:
        replay.kernel_call(_ln_fwd_rows, x, scale, bias, eps, y, mean, var, 0, m)
    else:
        split_work(_ln_fwd_rows, m, 1 << 30, x, scale, bias, eps, y, mean, var, head=7)


replay.declare("leaves", layer_norm_fwd)


#: the fewest values of a layer norm whose rows go to a parallel loop's threads: a split costs
#: a few microseconds while the team polls (a BERT-like encoder's [2048, 256] took 0.58 ms on
#: one thread; its [128, 256] of one sample 0.04 ms)
_LN_TEAM_MIN = 1 << 15


@pjit
def _ln_fwd_parts(x, scale, bias, eps, y, mean, var, parts):
    """:func:`_ln_fwd_rows` of every row in ``parts`` ranges, one per thread of a parallel
    loop (``lib.team``: native threads, no GIL)."""
    m = x.shape[0]
    for p in numba.prange(parts):
        _ln_fwd_rows(x, scale, bias, eps, y, mean, var, p * m // parts, (p + 1) * m // parts)


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
        run_parts(_ln_bwd_rows, [(x, dy, mean, var, scale, eps, want_dx, dx, acc[p],
                                  p * m // parts, (p + 1) * m // parts) for p in range(parts)],
                  parts - 1)
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
# (its split over the team: compiled ahead by warmup only, see lib.team.ready)
jobs("layer_norm_fwd (warmup)")(lambda T: [(_ln_fwd_parts, ((T, 2), (T, 1), (T, 1), float,
                                                            (T, 2), (T, 1), (T, 1), int))])
jobs("layer_norm_bwd")(lambda T: [(_ln_bwd_rows, ((T, 2), (T, 2), (T, 1), (T, 1), (T, 1), float,
                                                  bool, (T, 2), (_F64, 2), int, int))])

# compile times (CPU seconds, a cold compile of the signature its jobs predict, alone in a fresh
# process, 2 cores at load 5-26): the compile worker balances its groups by them
compile_cost(0.5, _ln_fwd_rows, _ln_bwd_rows)  # 0.45, 0.51 s
compile_cost(0.6, _ln_fwd_parts)
compile_cost(0.4, _stats_k, _apply_k, _grad_k)  # 0.37-0.42 s
