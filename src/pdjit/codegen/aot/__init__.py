"""The ``aot`` target: ahead-of-time builds, on the ``cpu`` target (its ``base``).

- ``target``: the :class:`~pdjit.codegen.target.Target`: the CPU target's kernels, lowerings,
  drivers and module texts (so the JIT executor, the predictor and an artifact share kernels
  and their cache entries), generated for one thread (no ``prange``: an artifact has no
  thread pool);
- ``entry``: the plan descriptions of a program's blocks for this target, what of them an
  artifact can run, and the entry function that runs them (control flow from the ops'
  ``ControlFlow`` and ``Select`` declarations);
- ``numba_aot``: that function compiled by Numba's ahead-of-time code generation into an
  object file.

The artifact around the object (the C runtime and model API, the parameters, the link, the
loader) is made by :mod:`pdjit.aot`, the layer above.
"""
