"""Launch configurations of the ``cuda`` target's kernels and the per-dtype kernel factory,
shared by the modules of :mod:`pdjit.codegen.cuda.lib` (and re-exported there: ``_cu.grid``).
"""
from __future__ import annotations

import functools
import os

import numpy as np

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")
#: threads per block of elementwise and reduction kernels
TPB = 16 if SIMULATOR else 256
#: at most this many blocks per grid-stride launch
MAX_BLOCKS = 1 if SIMULATOR else 65535
#: the GEMM's tile (TILE x TILE threads per block)
TILE = 8 if SIMULATOR else 16


def threads_per_block() -> int:
    return TPB


def grid(n: int) -> tuple:
    """(blocks, threads) of a grid-stride launch over ``n`` elements."""
    return (max(1, min(MAX_BLOCKS, -(-int(n) // TPB))), TPB)


def blocks(nout: int) -> tuple:
    """(blocks, threads) of a reduction: one block per output, grid-stride over outputs."""
    return (max(1, min(MAX_BLOCKS, int(nout))), TPB)


_NB_TYPES = {np.dtype(np.float32): np.float32, np.dtype(np.float64): np.float64}


def per_dtype(make):
    """A kernel factory made once per float dtype (any spelling of it) and the rest of its
    arguments: ``make(nbtype, *rest)`` returns the ``cuda.jit`` kernel (a closure over the
    dtype's shared-memory tiles, so not disk-cached)."""
    made: dict = {}

    @functools.wraps(make)
    def kernel(dtype, *rest):
        key = (np.dtype(dtype), *rest)
        k = made.get(key)
        if k is None:
            k = made[key] = make(_NB_TYPES[key[0]], *rest)
        return k
    return kernel
