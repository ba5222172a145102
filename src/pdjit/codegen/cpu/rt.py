"""Helpers the generated code calls: from kernels (compiled with them by Numba) and from the
host driver (plain Python), with one meaning in both.

``bdim``, ``check`` (the shape helpers of every target's call sites, defined in
:mod:`pdjit.codegen.driver`) and ``gemm`` are plain Python functions that Numba also compiles
(``overload``), so the same line runs in a Python driver, in a kernel and inside a native loop.

Keep this file small and stable: generated modules embed a hash of it, so that a change here
invalidates Numba's on-disk cache of every generated module that uses it.
"""
import numpy as np
from numba.extending import overload

from pdjit.codegen.cpu import threads
from pdjit.codegen.driver import bdim, check


def gemm(a, b):
    """The matrix product of two 2-D arrays (BLAS): every lowering multiplies through here. In
    a host driver a large product runs on every free core unless a thread count was asked for
    (``threads.gemm_threads``, ``threads.numpy_gemm``); compiled code calls ``np.dot`` at the
    plan's BLAS count."""
    work = a.size * b.shape[-1]
    if work < threads.GEMM_PARALLEL_MIN_WORK and threads.gemm_trace is None:
        return np.dot(a, b)  # small: NumPy's BLAS at the plan's count (one thread by default)
    n = threads.gemm_threads(work)
    return np.dot(a, b) if n == 1 else threads.numpy_gemm(a, b, n)


# Not ``inline="always"``: Numba's inlining re-runs its untyped passes on the callee at every
# call site, which made typing a broadcast kernel's call sites cost more than the rest of its
# compile. The calls sit outside the loops, and LLVM inlines the small callees anyway.
@overload(bdim)
def _bdim_native(acc, d):
    return bdim


@overload(check)
def _check_native(cond):
    return check


@overload(gemm)
def _gemm_native(a, b):
    def impl(a, b):
        return np.dot(a, b)
    return impl
