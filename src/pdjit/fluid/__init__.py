"""The Fluid facade: the modules that give PaddlePaddle Fluid's user API its shape over pdjit's
layers.

- :mod:`~pdjit.fluid.api`: the public names of ``import pdjit as fluid`` (loaded at their first
  use);
- :mod:`~pdjit.fluid.core` (``fluid.core``), :mod:`~pdjit.fluid.compiled_program`
  (``fluid.compiler``: ``CompiledProgram`` and its strategies), :mod:`~pdjit.fluid.profiler`,
  :mod:`~pdjit.fluid.metrics` (host-side metrics), :mod:`~pdjit.fluid.install_check`;
- :mod:`~pdjit.fluid.predictor`: Paddle Inference's predictor (``pdjit.inference``).

Fluid's module paths reach them through ``pdjit.MOVED`` (``pdjit.compiler`` is
``pdjit.fluid.compiled_program``). Importing this package imports none of them.
"""
