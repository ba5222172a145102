"""The ``range`` op of :mod:`pdjit.ops.creation` on the CPU: its size and values from the
kernels of :mod:`pdjit.codegen.cpu.lib`."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering


@lowering("range", host=True)
def _range_lower(ctx):
    S, E, St = (ctx.inp(s) for s in ("Start", "End", "Step"))
    out, T = ctx.out("Out"), ctx.T("Start")
    s, e, st = ctx.tmp("s"), ctx.tmp("e"), ctx.tmp("st")
    integral = ctx.dtype("Start").kind in "iu"
    return [f"{s} = {S}.reshape({S}.size)[0]", f"{e} = {E}.reshape({E}.size)[0]",
            f"{st} = {St}.reshape({St}.size)[0]",
            f"{out} = np.empty(({ctx.lib_fn('range_size')}({s}, {e}, {st}, {integral}),), {T})",
            f"{ctx.lib_fn('range_fill')}({out}, {s}, {st})"]
