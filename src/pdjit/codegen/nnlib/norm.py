"""Normalisation kernels: batch, instance and group norm, forward and backward.

Every kernel sees its data as a 4-D view ``(A, P, C, R)`` of a C-contiguous array with ``C``
channels: ``NCHW`` data ``(N, C, *S)`` as ``(N, 1, C, prod(S))`` and ``NHWC`` data
``(N, *S, C)`` as ``(N, prod(S), C, 1)``; so one compilation per dtype serves both layouts and
every rank.

Statistics are those of groups of elements, ``stat[k, g]``: ``k = a`` when they are taken per
sample (instance and group norm) and ``k = 0`` when over the whole batch (batch norm);
``g = c // cpg`` with ``cpg`` channels per group (1 for batch and instance norm). Sums
accumulate in float64; variances are biased (divided by the count) and taken in two passes.
``inv`` is ``1 / sqrt(var + epsilon)``. Outputs are arguments (the driver allocates them);
sizes and attributes are arguments too.
"""
import numpy as np

from pdjit.codegen.nnlib._jit import jit

__all__ = ["batch_norm_fwd", "batch_norm_bwd", "instance_norm_fwd", "instance_norm_bwd",
           "group_norm_fwd", "group_norm_bwd"]


@jit
def _check_params(x, scale, bias):
    c = x.shape[2]
    if scale.shape[0] != c or bias.shape[0] != c:
        raise ValueError("pdjit: Scale and Bias must hold one value per channel of X")


@jit
def _stats(x, per_sample, cpg, mean, var):
    """``mean``, ``var`` (float64 ``(K, G)``) of ``x``'s groups."""
    A, P, C, R = x.shape
    mean[:, :] = 0.0
    var[:, :] = 0.0
    n = P * R * cpg * (1 if per_sample else A)
    if n == 0:
        return
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            for c in range(C):
                s = 0.0
                for r in range(R):
                    s += x[a, p, c, r]
                mean[k, c // cpg] += s
    mean /= n
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            for c in range(C):
                m = mean[k, c // cpg]
                s = 0.0
                for r in range(R):
                    d = x[a, p, c, r] - m
                    s += d * d
                var[k, c // cpg] += s
    var /= n


@jit
def _apply(x, mean, inv, scale, bias, per_sample, cpg, relu, y):
    """``y = (x - mean) * inv * scale[c] + bias[c]`` (then ``max(y, 0)`` with ``relu``)."""
    A, P, C, R = x.shape
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            for c in range(C):
                g = c // cpg
                s = inv[k, g] * scale[c]
                b = bias[c] - mean[k, g] * s
                for r in range(R):
                    v = x[a, p, c, r] * s + b
                    if relu and v < 0.0:
                        v = 0.0
                    y[a, p, c, r] = v


@jit
def _grad(x, dy, mean, inv, scale, per_sample, cpg, batch_stats, dx, dscale, dbias):
    """The gradients of ``_apply`` (without relu): ``dscale[c] = sum(dy * xhat)``,
    ``dbias[c] = sum(dy)`` and, with ``batch_stats`` (the statistics are those of ``x``),
    ``dx = inv * (g - mean(g) - xhat * mean(g * xhat))`` over each group where
    ``g = dy * scale[c]``, else (fixed statistics) ``dx = inv * g``."""
    A, P, C, R = x.shape
    K, G = mean.shape
    sg = np.zeros((K, G))
    sgx = np.zeros((K, G))
    ds = np.zeros(C)
    db = np.zeros(C)
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            for c in range(C):
                g = c // cpg
                m = mean[k, g]
                s1 = 0.0
                s2 = 0.0
                for r in range(R):
                    d = dy[a, p, c, r]
                    s1 += d
                    s2 += d * (x[a, p, c, r] - m)
                s2 *= inv[k, g]
                db[c] += s1
                ds[c] += s2
                sg[k, g] += s1 * scale[c]
                sgx[k, g] += s2 * scale[c]
    n = P * R * cpg * (1 if per_sample else A)
    for a in range(A):
        k = a if per_sample else 0
        for p in range(P):
            for c in range(C):
                g = c // cpg
                m = mean[k, g]
                iv = inv[k, g]
                sc = scale[c]
                if batch_stats:
                    c1 = sg[k, g] / n
                    c2 = sgx[k, g] / n
                    for r in range(R):
                        xh = (x[a, p, c, r] - m) * iv
                        dx[a, p, c, r] = iv * (sc * dy[a, p, c, r] - c1 - xh * c2)
                else:
                    for r in range(R):
                        dx[a, p, c, r] = iv * sc * dy[a, p, c, r]
    for c in range(C):
        dscale[c] = ds[c]
        dbias[c] = db[c]


@jit
def _copy(src, dst):
    s = src.reshape(src.size)
    d = dst.reshape(dst.size)
    for i in range(s.size):
        d[i] = s[i]


@jit
def batch_norm_fwd(x, scale, bias, mean, variance, momentum, epsilon, batch_stats, relu,
                   y, mean_out, variance_out, saved_mean, saved_inv):
    """Batch norm of ``x`` (4-D view) per channel. With ``batch_stats``: the batch mean and
    biased variance normalise, ``mean_out = momentum * mean + (1 - momentum) * batch_mean``
    (likewise ``variance_out``), ``saved_mean``/``saved_inv`` get the batch mean and
    ``1 / sqrt(var + epsilon)``; a batch of one value per channel leaves ``y = x``, the running
    statistics as they are and zeros saved (Paddle's CPU kernel). Without: ``mean`` and
    ``variance`` normalise, are copied to ``mean_out``/``variance_out`` and saved."""
    _check_params(x, scale, bias)
    A, P, C, R = x.shape
    if mean.shape[0] != C or variance.shape[0] != C:
        raise ValueError("pdjit: Mean and Variance must hold one value per channel of X")
    m = np.empty((1, C))
    iv = np.empty((1, C))
    if batch_stats:
        if A * P * R == 1:
            _copy(x, y)
            for c in range(C):
                mean_out[c] = mean[c]
                variance_out[c] = variance[c]
                saved_mean[c] = 0.0
                saved_inv[c] = 0.0
            return
        v = np.empty((1, C))
        _stats(x, False, 1, m, v)
        for c in range(C):
            mean_out[c] = mean[c] * momentum + m[0, c] * (1.0 - momentum)
            variance_out[c] = variance[c] * momentum + v[0, c] * (1.0 - momentum)
            iv[0, c] = 1.0 / np.sqrt(v[0, c] + epsilon)
    else:
        for c in range(C):
            m[0, c] = mean[c]
            iv[0, c] = 1.0 / np.sqrt(variance[c] + epsilon)
            mean_out[c] = mean[c]
            variance_out[c] = variance[c]
    for c in range(C):
        saved_mean[c] = m[0, c]
        saved_inv[c] = iv[0, c]
    _apply(x, m, iv, scale, bias, False, 1, relu, y)


@jit
def batch_norm_bwd(x, dy, scale, saved_mean, saved_inv, mean, variance, epsilon, batch_stats,
                   dx, dscale, dbias):
    """Gradients of :func:`batch_norm_fwd` (without relu) with respect to ``x``, ``scale`` and
    ``bias``: with ``batch_stats`` through the batch statistics ``saved_mean``/``saved_inv``,
    else with the fixed ``mean``/``variance``."""
    A, P, C, R = x.shape
    m = np.empty((1, C))
    iv = np.empty((1, C))
    if batch_stats:
        if A * P * R == 1:  # the forward pass copied x
            _copy(dy, dx)
            for c in range(C):
                dscale[c] = 0.0
                dbias[c] = 0.0
            return
        for c in range(C):
            m[0, c] = saved_mean[c]
            iv[0, c] = saved_inv[c]
    else:
        for c in range(C):
            m[0, c] = mean[c]
            iv[0, c] = 1.0 / np.sqrt(variance[c] + epsilon)
    _grad(x, dy, m, iv, scale, False, 1, batch_stats, dx, dscale, dbias)


@jit
def instance_norm_fwd(x, scale, bias, epsilon, y, saved_mean, saved_inv):
    """Instance norm: statistics per (sample, channel); ``saved_mean``/``saved_inv`` (``N*C``)
    get the mean and ``1 / sqrt(var + epsilon)``."""
    _check_params(x, scale, bias)
    N, C = x.shape[0], x.shape[2]
    m = np.empty((N, C))
    v = np.empty((N, C))
    _stats(x, True, 1, m, v)
    iv = 1.0 / np.sqrt(v + epsilon)
    for a in range(N):
        for c in range(C):
            saved_mean[a * C + c] = m[a, c]
            saved_inv[a * C + c] = iv[a, c]
    _apply(x, m, iv, scale, bias, True, 1, False, y)


@jit
def instance_norm_bwd(x, dy, scale, saved_mean, saved_inv, dx, dscale, dbias):
    """Gradients of :func:`instance_norm_fwd` through its saved statistics."""
    N, C = x.shape[0], x.shape[2]
    m = np.empty((N, C))
    iv = np.empty((N, C))
    for a in range(N):
        for c in range(C):
            m[a, c] = saved_mean[a * C + c]
            iv[a, c] = saved_inv[a * C + c]
    _grad(x, dy, m, iv, scale, True, 1, True, dx, dscale, dbias)


@jit
def group_norm_fwd(x, scale, bias, groups, epsilon, y, mean, var):
    """Group norm: statistics per (sample, group of ``C / groups`` channels); ``mean`` and
    ``var`` (``(N, groups)``) get the mean and the variance itself."""
    _check_params(x, scale, bias)
    N, C = x.shape[0], x.shape[2]
    if groups < 1 or C % groups != 0:
        raise ValueError("pdjit: groups must divide the channels of X")
    m = np.empty((N, groups))
    v = np.empty((N, groups))
    _stats(x, True, C // groups, m, v)
    for a in range(N):
        for g in range(groups):
            mean[a, g] = m[a, g]
            var[a, g] = v[a, g]
    _apply(x, m, 1.0 / np.sqrt(v + epsilon), scale, bias, True, C // groups, False, y)


@jit
def group_norm_bwd(x, dy, scale, mean, var, groups, epsilon, dx, dscale, dbias):
    """Gradients of :func:`group_norm_fwd` through its statistics ``mean``/``var``."""
    N, C = x.shape[0], x.shape[2]
    if groups < 1 or C % groups != 0:
        raise ValueError("pdjit: groups must divide the channels of X")
    m = np.empty((N, groups))
    iv = np.empty((N, groups))
    for a in range(N):
        for g in range(groups):
            m[a, g] = mean[a, g]
            iv[a, g] = 1.0 / np.sqrt(var[a, g] + epsilon)
    _grad(x, dy, m, iv, scale, True, C // groups, True, dx, dscale, dbias)
