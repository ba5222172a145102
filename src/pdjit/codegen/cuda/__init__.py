"""The ``cuda`` target: the same kernel descriptions rendered as ``numba.cuda`` kernels.

- ``target``: rendering of loop kernels, their call sites (launches), the host driver;
- ``lib``: the launchers that lowerings call as ``_cu.<function>`` (GEMM, softmax rows, ...);
- ``mathfuncs``: the device math functions generated kernels call as ``np``/``_m``.

Importing this package imports nothing; its modules import ``numba.cuda``.
"""
