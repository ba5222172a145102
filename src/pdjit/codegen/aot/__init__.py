"""The ``aot`` target: ahead-of-time builds, on the ``cpu`` target (its ``base``).

- ``target``: the :class:`~pdjit.codegen.target.Target`: the CPU target's kernels, lowerings,
  drivers and module texts (so the JIT executor, the predictor and an artifact share kernels
  and their cache entries), generated for one thread (no ``prange``: an artifact has no
  thread pool).
"""
