"""The ``python`` target: the same kernel descriptions run by the Python interpreter, compiled
by nothing. Slow, and meant to be: a reference for what the generated kernels compute, and the
smallest example of a target (this folder and one line in ``codegen.target.BUILTIN``).

- ``target``: the :class:`~pdjit.codegen.target.Target` (the shared sequential loops and call
  sites, a host driver with this folder's helpers);
- ``mathfuncs``: the math functions kernels call as ``_m``, in NumPy.
"""
