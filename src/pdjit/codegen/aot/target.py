"""The ``aot`` target: the code of an ahead-of-time build (:mod:`pdjit.aot`).

It is built on the ``cpu`` target (``base``): its lowerings, rendering, call sites, host and
native drivers and module texts are the CPU target's, reached through the registry, so a kernel
of an artifact is the JIT executor's kernel (the same text, the same cache key, compiled once
for both). What differs is declared here: the code is generated for one thread, without
parallel variants (an artifact has no thread pool; ``--threads N`` splits a batch across
instances' threads or gives them to OpenBLAS, never to ``prange``).
"""
from __future__ import annotations

from pdjit.codegen.target import Target, register_target

NAME = "aot"


class AotTarget(Target):
    """The CPU target's code, for one thread."""
    name = NAME
    base = "cpu"
    parallel_variants = False

    def threads(self) -> tuple:
        """No parallel loop, and host drivers that run their loops on one thread."""
        return 1, 1


TARGET = register_target(AotTarget())
