"""The ``cuda`` target's lowerings of opaque ops, one module per family of ops: each registers
its functions with ``@lowering("op_type", ...)`` (or lists with ``generic`` the ops whose own
target-neutral ``Opaque.lower`` runs here); the target imports them all at its first lookup
(:class:`pdjit.codegen.target.Lowerings`). Their lines run in the host driver and call the
launchers of :mod:`pdjit.codegen.cuda.lib` as ``_cu``. Ops without an entry run their
references on the host."""
from pdjit.codegen.target import Lowerings

LOWERINGS = Lowerings(__name__)
lowering, generic = LOWERINGS.lowering, LOWERINGS.generic
