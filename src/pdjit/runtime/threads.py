"""How many threads pdjit's compiled code uses.

Generated code calls BLAS (``np.dot`` inside Numba goes to SciPy's bundled OpenBLAS, in the
host driver to NumPy's; both are set). Measured
on a 2-vCPU machine (``benchmarks/bench_executor.py --only mlp``), an MLP forward at batch 128
took 0.37 ms with one BLAS thread and 4.0 ms with two: threads fight over too few cores. So the
default is one thread; ``set_num_threads(n)`` or ``PDJIT_NUM_THREADS=n`` asks for more. With
more than one thread, elementwise loops are also compiled with ``prange`` and run in parallel
when they are large enough (decided at run time, in the generated code); that compiles about
three times slower, one more reason it is not the default. Set it before building programs:
plans already compiled keep their loops.
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

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
    return _applied if _applied is not None else default_num_threads()


def default_num_threads() -> int:
    env = os.environ.get("PDJIT_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"PDJIT_NUM_THREADS={env!r}: expected a positive int") from None
    return 1


def ensure_applied() -> None:
    """Apply the default once, before the first compiled plan runs."""
    if _applied is None:
        set_num_threads(default_num_threads())
