"""The ``cpu`` target's lowerings of opaque ops, one module per family of ops: each registers
its functions with ``@lowering("op_type", ...)``; the target imports them all at its first
lookup (:class:`pdjit.codegen.target.Lowerings`). Their lines call the kernels of
:mod:`pdjit.codegen.cpu.lib` as ``_nn``. Ops without an entry here run their definition's own
``Opaque.lower`` (the target declares ``generic_lowerings``)."""
from pdjit.codegen.target import Lowerings

LOWERINGS = Lowerings(__name__)
lowering = LOWERINGS.lowering
