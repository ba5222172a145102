"""The ``cpu`` target: kernel descriptions rendered as Numba functions on the host.

- ``target``: rendering of loop kernels, their call sites, the host and native drivers;
- ``lib``: the library kernels that lowerings call as ``_nn.<function>`` (hand-written Numba);
- ``rt``: the helpers generated code calls as ``_rt`` (broadcast checks, the GEMM);
- ``mathfuncs``: the math functions generated code calls as ``_m``;
- ``threads``: the CPU's thread pools, OpenBLAS control and allocator tuning.
"""
