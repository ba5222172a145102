"""Batched matrix products (``matmul``/``matmul_v2``/``bmm`` of any rank, their gradients) and
the element kernels of attention (dropout with its counter-based random stream).

``batched_gemm`` sees every operand as a 3-D C-contiguous array ``(batch, rows, cols)``: the
lowerings flatten the batch dims in their host lines and pass the batch dims themselves as
``int64`` vectors, so one compilation per dtype serves every rank, size, broadcast and
transpose. Each product of 2-D slices is one BLAS call (``np.dot``; the transposes are views,
which BLAS reads as they are).
"""
import numpy as np

from pdjit.codegen.nnlib._jit import jit, jobs

__all__ = ["batched_gemm", "dropout_fwd", "dropout_bwd"]


@jit
def _dot(a, b, ta, tb, out):
    """``out = op(a) @ op(b)`` on 2-D slices (``op`` transposes when asked)."""
    if ta:
        if tb:
            np.dot(a.T, b.T, out)
        else:
            np.dot(a.T, b, out)
    elif tb:
        np.dot(a, b.T, out)
    else:
        np.dot(a, b, out)


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


@jit
def batched_gemm(a, b, ta, tb, alpha, it, da, db, dc, c):
    """``c[kc] (+)= alpha * op(a[ka]) @ op(b[kb])`` for every index of the batch dims ``it``,
    where ``ka``, ``kb``, ``kc`` are that index in ``a``'s, ``b``'s and ``c``'s batch dims
    ``da``, ``db``, ``dc`` (aligned with ``it``, 1 where broadcast). When ``c`` has fewer
    batches than ``it`` (a gradient of a broadcast operand) the products are summed into it.
    """
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
    if c.shape[0] == nb:  # one product per output matrix, written in place
        for i in range(nb):
            ci = c[_at(i, it, dc)]
            _dot(a[_at(i, it, da)], b[_at(i, it, db)], ta, tb, ci)
            if alpha != 1.0:
                ci *= alpha
        return
    c[:] = 0
    tmp = np.empty((m, n), c.dtype)
    for i in range(nb):
        _dot(a[_at(i, it, da)], b[_at(i, it, db)], ta, tb, tmp)
        ci = c[_at(i, it, dc)]
        if alpha != 1.0:
            ci += tmp * alpha
        else:
            ci += tmp


_I64 = np.dtype(np.int64)
jobs("batched_gemm")(lambda T: [(batched_gemm, ((T, 3), (T, 3), bool, bool, float, (_I64, 1),
                                                (_I64, 1), (_I64, 1), (_I64, 1), (T, 3)))])


# ---- dropout -----------------------------------------------------------------------------------
# The stream of pdjit.framework.random: element i of a draw is mix64(key + (i + 1) * GOLDEN)
# (splitmix64's finaliser, uint64 arithmetic wrapping), its top 53 bits a float64 in [0, 1).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


@jit
def _uniform01(key, i):
    """Element ``i`` of the stream of ``key`` (a uint64) as a float64 in [0, 1)."""
    x = key + np.uint64(i + 1) * _GOLDEN
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    x = x ^ (x >> _S31)
    return np.float64(x >> _S11) * (1.0 / 9007199254740992.0)


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
