"""How many threads pdjit's compiled code uses.

Two kinds of threads, set apart because they were measured apart on a 2-vCPU machine:

- Large elementwise loops (the ``flat`` and ``row`` forms, at least ``PARALLEL_MIN_SIZE``
  elements) run on every core by default: their parallel variant (``numba.prange``) is compiled
  when a run first reaches that size, and the chain benchmark then runs near the all-core
  memory bound. Numba's OpenMP threading layer is told not to spin while it waits
  (``OMP_WAIT_POLICY=passive``, set when pdjit is imported unless already set): spinning
  threads cost ~8 ms per call when the other core is busy.
- BLAS calls (``np.dot``; SciPy's OpenBLAS inside Numba, NumPy's in the host driver) and the
  loops of opaque lowerings stay on one thread by default: an MLP forward at batch 128 took
  0.37 ms with one BLAS thread and 4.0 ms with two (threads fight over too few cores).

``set_num_threads(n)`` or ``PDJIT_NUM_THREADS=n`` sets both to ``n``. Set it before building
programs: plans already compiled keep their loops.
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

# before the OpenMP runtime loads (Numba loads it at the first parallel loop): waiting threads
# sleep rather than spin
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_applied = None


def _openblas_setters() -> list:
    """``set_num_threads`` functions of the OpenBLAS libraries pdjit's GEMMs use: SciPy's
    (``np.dot`` inside Numba) and NumPy's (``np.dot`` in the host driver)."""
    try:
        import scipy
        import scipy.linalg.cython_blas  # noqa: F401 - loads the library Numba calls
    except ImportError:
        return []
    site = os.path.dirname(os.path.dirname(scipy.__file__))
    libs = glob.glob(os.path.join(site, "scipy.libs", "*openblas*")) + \
        glob.glob(os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs",
                               "*openblas*"))
    setters = []
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                    "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_int], None
                setters.append(fn)
                break
    return setters


def set_num_threads(n: int) -> bool:
    """Use ``n`` threads in BLAS calls of compiled code; False if that BLAS cannot be set."""
    global _applied
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    setters = _openblas_setters()
    for fn in setters:
        fn(n)
    import numba

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    _applied = n
    return bool(setters)


def get_num_threads() -> int:
    """Threads for BLAS calls and opaque lowerings' loops (default 1)."""
    return _applied if _applied is not None else default_num_threads()


def loop_threads() -> int:
    """Threads for large elementwise loops: the number asked for, else every core Numba
    may use."""
    if _applied is not None or os.environ.get("PDJIT_NUM_THREADS"):
        return get_num_threads()
    import numba

    return numba.config.NUMBA_NUM_THREADS


def default_num_threads() -> int:
    env = os.environ.get("PDJIT_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"PDJIT_NUM_THREADS={env!r}: expected a positive int") from None
    return 1


def ensure_applied() -> None:
    """Apply the default once, before the first compiled plan runs: one BLAS thread, every
    core for large elementwise loops."""
    global _default_applied
    if _applied is None and not _default_applied:
        _default_applied = True
        for fn in _openblas_setters():
            fn(default_num_threads())
        import numba

        numba.set_num_threads(min(loop_threads(), numba.config.NUMBA_NUM_THREADS))


_default_applied = False
