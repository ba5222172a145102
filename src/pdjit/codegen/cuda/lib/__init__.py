"""What the ``cuda`` target's host drivers call (``_cu`` in a driver): device allocation, launch
configurations, and the library kernels of the opaque ops' cuda lowerings (GEMM, batched GEMM,
softmax rows, softmax with cross entropy rows, and convolution as an implicit GEMM in
:mod:`pdjit.codegen.cuda.lib.conv`).

Launch configurations: elementwise kernels are grid-stride loops (:func:`grid`: enough blocks
to cover the elements, at most :data:`MAX_BLOCKS`), reductions one block per output element
(:func:`blocks`). Under the simulator every thread is a Python thread, so blocks are small and
few there; the kernels are written for any configuration (grid-stride loops), and the tests
run them with several iterations per thread.

The module-level kernels are compiled with numba-cuda's disk cache where this file allows it
(``mathfuncs.kernel``); the GEMM kernels are closures over their dtype and tile (one per dtype):
compiled once per process at their first launch, uncached (a closure's cache entry is keyed by
its name and argument types, not by the values it closes over).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from pdjit.codegen import driver
from pdjit.codegen.cuda.lib.launch import (  # noqa: F401 - the drivers' _cu.grid, ...
    MAX_BLOCKS,
    SIMULATOR,
    TILE,
    TPB,
    blocks,
    grid,
    per_dtype,
    threads_per_block,
)
from pdjit.codegen.cuda.mathfuncs import kernel as _cached


def empty(shape, dtype):
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return cuda.device_array(tuple(int(d) for d in shape), dtype=np.dtype(dtype))


def zeros(shape, dtype):
    a = empty(shape, dtype)
    if a.size:
        _fill[grid(a.size)](a.reshape(a.size), 0)
    return a


def full(shape, value, dtype):
    """A device array of ``shape`` holding ``value`` everywhere (filled on the device)."""
    a = empty(shape, dtype)
    if a.size:
        _fill[grid(a.size)](a.reshape(a.size), value)
    return a


def copy(a):
    """A new device array holding a copy of device array ``a`` (on the device)."""
    d = empty(a.shape, a.dtype)
    if a.size:
        d.copy_to_device(a)
    return d


@_cached
def _fill(a, v):
    i = cuda.grid(1)
    gs = cuda.gridsize(1)
    while i < a.shape[0]:
        a[i] = v
        i += gs






# ---- GEMM ----------------------------------------------------------------------------------------
@per_dtype
def _gemm_kernel(nbtype):
    tile = TILE

    def gemm(A, B, C):
        # C[M, N] = A[M, K] @ B[K, N]; A and B any strides (transposed views), tiles of A and
        # B staged in shared memory
        sa = cuda.shared.array((tile, tile), nbtype)
        sb = cuda.shared.array((tile, tile), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * tile + ty
        col = cuda.blockIdx.x * tile + tx
        m = C.shape[0]
        n = C.shape[1]
        kk = A.shape[1]
        acc = nbtype(0)
        for t0 in range(0, kk, tile):
            k = t0 + tx
            sa[ty, tx] = A[row, k] if row < m and k < kk else nbtype(0)
            k = t0 + ty
            sb[ty, tx] = B[k, col] if col < n and k < kk else nbtype(0)
            cuda.syncthreads()
            for q in range(tile):
                acc += sa[ty, q] * sb[q, tx]
            cuda.syncthreads()
        if row < m and col < n:
            C[row, col] = acc

    return cuda.jit(gemm)


def gemm(a, b):
    """``a @ b`` of two 2-D device arrays of one float dtype (transposed views welcome): a new
    C-contiguous device array. The host driver's ``_rt.gemm`` on the cuda target."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"pdjit: gemm of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if np.dtype(a.dtype) != np.dtype(b.dtype):
        raise ValueError("pdjit: gemm of two dtypes")
    m, n = a.shape[0], b.shape[1]
    c = empty((m, n), a.dtype)
    if m and n:
        if a.shape[1] == 0:
            _fill[grid(c.size)](c.reshape(c.size), 0)
            return c
        g = (-(-n // TILE), -(-m // TILE))
        _gemm_kernel(a.dtype)[g, (TILE, TILE)](a, b, c)
    return c


# ---- batched GEMM -------------------------------------------------------------------------------
#: at most this many batch dims after merging neighbours that broadcast alike (a product with
#: more raises ValueError: the plan then runs the op's reference)
BATCH_DIMS = 3


@per_dtype
def _bgemm_kernel(nbtype):
    tile = TILE

    def bgemm(A, B, C, ta, tb, alpha, n0, n1, n2, k0, k1, k2, sa0, sa1, sa2, sb0, sb1, sb2,
              nred):
        # C[z] = alpha * sum over the reduced batch dims of op(A[ka]) @ op(B[kb]): one block
        # per TILE x TILE tile of C[z], z on the grid's third axis (grid-stride); the batch is
        # up to three merged dims n0..n2, kept in C (k* = 1) or reduced (summed: the gradient
        # of an operand the forward broadcast); sa*/sb*: A's and B's batch strides (0 where
        # they broadcast)
        sa = cuda.shared.array((tile, tile), nbtype)
        sb = cuda.shared.array((tile, tile), nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * tile + ty
        col = cuda.blockIdx.x * tile + tx
        m = C.shape[1]
        n = C.shape[2]
        kk = A.shape[1] if ta else A.shape[2]
        z = cuda.blockIdx.z
        while z < C.shape[0]:
            t = z
            i2 = 0
            i1 = 0
            i0 = 0
            if k2:
                i2 = t % n2
                t //= n2
            if k1:
                i1 = t % n1
                t //= n1
            if k0:
                i0 = t % n0
            acc = nbtype(0)
            for r in range(nred):
                u = r
                j2 = i2
                j1 = i1
                j0 = i0
                if not k2:
                    j2 = u % n2
                    u //= n2
                if not k1:
                    j1 = u % n1
                    u //= n1
                if not k0:
                    j0 = u % n0
                ka = j0 * sa0 + j1 * sa1 + j2 * sa2
                kb = j0 * sb0 + j1 * sb1 + j2 * sb2
                for t0 in range(0, kk, tile):
                    k = t0 + tx
                    v = nbtype(0)
                    if row < m and k < kk:
                        v = A[ka, k, row] if ta else A[ka, row, k]
                    sa[ty, tx] = v
                    k = t0 + ty
                    v = nbtype(0)
                    if col < n and k < kk:
                        v = B[kb, col, k] if tb else B[kb, k, col]
                    sb[ty, tx] = v
                    cuda.syncthreads()
                    for q in range(tile):
                        acc += sa[ty, q] * sb[q, tx]
                    cuda.syncthreads()
            if row < m and col < n:
                C[z, row, col] = acc * alpha
            z += cuda.gridDim.z

    return cuda.jit(bgemm)


def _batch_plan(it, da, db, dc) -> list:
    """The batch dims ``it`` of a product as at most :data:`BATCH_DIMS` merged dims ``[size,
    kept in C, A's stride, B's stride]`` (outer first): dims of 1 dropped, neighbours merged
    where they broadcast alike and their strides chain."""
    shape = [int(d) for d in it]
    dims = {k: [int(x) for x in d] for k, d in (("a", da), ("b", db), ("c", dc))}
    for k, d in dims.items():
        if len(d) != len(shape) or any(x != 1 and x != n for x, n in zip(d, shape)):
            raise ValueError(f"pdjit: batched_gemm: the batch dims {d} of {k} do not "
                             f"broadcast to {shape}")
    stride = {}
    for k, d in dims.items():
        s, acc = [0] * len(d), 1
        for i in range(len(d) - 1, -1, -1):
            s[i] = acc if d[i] != 1 else 0
            acc *= d[i]
        stride[k] = s
    plan: list = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        kept = dims["c"][i] == n
        sa, sb = stride["a"][i], stride["b"][i]
        if plan:
            pn, pk, psa, psb = plan[-1]
            if pk == kept and psa == sa * n and psb == sb * n:
                plan[-1] = [pn * n, kept, sa, sb]
                continue
        plan.append([n, kept, sa, sb])
    if len(plan) > BATCH_DIMS:
        raise ValueError(f"pdjit: batched_gemm on the device: at most {BATCH_DIMS} batch dims "
                         f"that broadcast differently, got {shape} (X {dims['a']}, Y "
                         f"{dims['b']})")
    return [[1, True, 0, 0]] * (BATCH_DIMS - len(plan)) + plan


def batched_gemm(a, b, ta, tb, alpha, it, da, db, dc, c) -> None:
    """``c[kc] = alpha * sum op(a[ka]) @ op(b[kb])`` on the device, the contract of the CPU's
    ``_nn.batched_gemm``: 3-D device arrays ``(batch, rows, cols)``, batch dims ``it`` (host
    ``int64`` vectors; ``da``, ``db``, ``dc`` aligned with it, 1 where broadcast); where ``c``
    lacks a batch dim of ``it`` the products are summed into it. One launch: a tiled
    shared-memory GEMM per batch, the batch on the grid's third axis."""
    plan = _batch_plan(it, da, db, dc)
    if np.dtype(a.dtype) != np.dtype(b.dtype) or np.dtype(a.dtype) != np.dtype(c.dtype):
        raise ValueError("pdjit: batched_gemm of several dtypes")
    m, n = c.shape[1], c.shape[2]
    kx = a.shape[1] if ta else a.shape[2]
    ky = b.shape[2] if tb else b.shape[1]
    if kx != ky or (a.shape[2] if ta else a.shape[1]) != m or \
            (b.shape[1] if tb else b.shape[2]) != n:
        raise ValueError(f"pdjit: batched_gemm: the matrices do not fit: {tuple(a.shape)} "
                         f"(transposed {bool(ta)}), {tuple(b.shape)} (transposed {bool(tb)}) "
                         f"into {tuple(c.shape)}")
    nc = int(c.shape[0])
    nred = 1
    for size, kept, _, _ in plan:
        nred *= 1 if kept else size
    if nc * nred != int(np.prod([int(d) for d in it])) and nc:
        raise ValueError("pdjit: batched_gemm: the output's batches do not fit")
    if not (m and n and nc):
        return
    (n0, k0, sa0, sb0), (n1, k1, sa1, sb1), (n2, k2, sa2, sb2) = plan
    g = (-(-n // TILE), -(-m // TILE), max(1, min(nc, MAX_BLOCKS)))
    _bgemm_kernel(c.dtype)[g, (TILE, TILE)](
        a, b, c, bool(ta), bool(tb), float(alpha), n0, n1, n2, bool(k0), bool(k1), bool(k2),
        sa0, sa1, sa2, sb0, sb1, sb2, nred)


class _DeviceRT:
    """``_rt`` as a cuda host driver sees it: the shape helpers, and the GEMM on the device."""
    bdim, check = staticmethod(driver.bdim), staticmethod(driver.check)
    gemm = staticmethod(gemm)


RT = _DeviceRT()


# ---- rows: softmax, softmax with cross entropy ---------------------------------------------------
@cuda.jit(device=True, inline="always")
def _softmax_row(x, out, b, nc):
    """``out[b:b+nc]`` = softmax of ``x[b:b+nc]``; returns the row's max and sum of exp."""
    m = x[b]
    for c in range(1, nc):
        v = x[b + c]
        if v > m:
            m = v
    s = 0.0
    for c in range(nc):
        e = math.exp(x[b + c] - m)
        out[b + c] = e
        s += e
    for c in range(nc):
        out[b + c] = out[b + c] / s
    return m, s


@_cached
def _softmax_rows(x, out, nr, nc):
    """One thread per row (grid-stride over rows): max, sum of exp, scaled."""
    r = cuda.grid(1)
    gs = cuda.gridsize(1)
    while r < nr:
        _softmax_row(x, out, r * nc, nc)
        r += gs


def softmax_rows(x, out, nr: int, nc: int) -> None:
    """``out`` (flat) = softmax of each of ``nr`` rows of ``nc`` elements of ``x`` (flat)."""
    if nr and nc:
        _softmax_rows[grid(nr)](x, out, nr, nc)


@_cached
def _softmax_xent_rows(x, label, sm, loss, nr, nc, ignore_index):
    """Per row: softmax into ``sm`` and ``-log(softmax[label])`` into ``loss`` (0 where the
    label is ``ignore_index``)."""
    r = cuda.grid(1)
    gs = cuda.gridsize(1)
    while r < nr:
        b = r * nc
        m, s = _softmax_row(x, sm, b, nc)
        lab = label[r]
        if lab == ignore_index:
            loss[r] = 0
        else:
            loss[r] = -(x[b + lab] - m - math.log(s))
        r += gs


@_cached
def _check_labels(label, nc, ignore_index, bad):
    i = cuda.grid(1)
    gs = cuda.gridsize(1)
    while i < label.shape[0]:
        v = label[i]
        if v != ignore_index and (v < 0 or v >= nc):
            bad[0] = 1
        i += gs


def softmax_xent_rows(x, label, sm, loss, nr: int, nc: int, ignore_index: int) -> None:
    """Softmax and cross entropy with hard labels over ``nr`` rows of ``nc`` classes (flat
    arrays). A label outside ``[0, nc)`` (and not ``ignore_index``) raises ``ValueError`` (the
    plan then runs the op's reference, which names the op and the label)."""
    if not nr:
        return
    bad = zeros(1, np.int32)
    _check_labels[grid(nr)](label, nc, ignore_index, bad)
    if int(bad.copy_to_host()[0]):
        raise ValueError("pdjit: a label is out of range")
    if nc:
        _softmax_xent_rows[grid(nr)](x, label, sm, loss, nr, nc, ignore_index)


# ---- convolution as an implicit GEMM (its own module) ------------------------------------------
from pdjit.codegen.cuda.lib.conv import (  # noqa: E402, F401 - the drivers' _cu.conv2d_*
    conv2d_bwd_data,
    conv2d_bwd_filter,
    conv2d_fwd,
)
