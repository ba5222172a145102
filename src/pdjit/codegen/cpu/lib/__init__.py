"""Library kernels: hand-written Numba functions that op lowerings call for loop nests that are
not generated from templates (convolution, pooling, normalisation, interpolation, padding).

A lowering names them with ``ctx.lib_fn("<function>")``: ``_nn.<function>`` in its lines,
and recorded, so that a plan's compile jobs follow from the functions its lowerings named
(``library_jobs``), not from its lines' text. The same name resolves in the host driver (plain
Python calling the compiled dispatcher), in a generated kernel and in a native loop (Numba
compiles the call in). Each function is compiled once per type signature and kept
in Numba's on-disk cache: its sizes, strides, paddings... are arguments, so one compilation
serves every layer and program.

Write them with :data:`jit` (or :data:`pjit` for ``numba.prange`` loops), take outputs as
arguments (the driver allocates them), and keep them target-neutral in meaning: one function
per operation and data layout, documented with what it computes. Every file of this package
is part of the hash that invalidates generated modules (``compiler.deps_hash``).

Submodules, one per op family, each re-exported here: ``attention``, ``channels_last``,
``conv``, ``crf``, ``gemm``, ``image``, ``indexing``, ``lod_rnn``, ``norm``, ``pgemm``,
``pointwise``, ``pool``, ``rnn``.
"""
import numpy as np

from pdjit.codegen.cpu.lib._jit import BESIDE, JOBS, cost_of, jit, pjit  # noqa: F401
from pdjit.codegen.cpu.lib.attention import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.channels_last import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.conv import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.crf import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.gemm import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.image import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.indexing import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.lod_rnn import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.norm import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.pgemm import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.pointwise import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.pool import *  # noqa: F401,F403
from pdjit.codegen.cpu.lib.rnn import *  # noqa: F401,F403


def library_jobs(names, dtype) -> list:
    """``(dispatcher, argument types)`` of the library kernels that calls of the entry points
    ``names`` run (``"<entry>"``, or ``"<module>.<function>"`` for a function a module
    declares jobs for under that dotted name), for float data of ``dtype``: compile jobs for
    a new plan."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        return []
    found = []
    for name in dict.fromkeys(names):
        maker = JOBS.get(name)
        if maker is not None:
            found += maker(dtype)
    return found
