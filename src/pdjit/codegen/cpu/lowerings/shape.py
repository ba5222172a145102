"""The tiling ops of :mod:`pdjit.ops.shape` (expand, tile, expand_v2, expand_as_v2) and their
gradients on the CPU: ``_nn.tile_nd`` / ``_nn.untile_nd`` over the flat arrays, the dims as
run-time arguments; transpose(2) and its gradient: ``_nn.permute_into`` (into the array the
driver allocates)."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.ops.shape import _TILING, _transpose_grad_lower, _transpose_lower


def _tiling_lower(op):
    t_slot, l_slot, attr, _ = _TILING[op]

    def lower(ctx):
        X = ctx.inp("X")
        r = ctx.rank("Out")
        rx = ctx.rank("X")
        if r == 0 or r < rx:
            return None
        lines = []
        if t_slot and ctx.has_input(t_slot):
            t = ctx.tmp("v")
            lines.append(f"{t} = {ctx.inp(t_slot)}.astype(np.int64)")
            vals = [f"{t}[{i}]" for i in range(_tensor_count_src(ctx, t_slot))]
        elif l_slot and ctx.has_input(l_slot):
            vals = [f"np.int64({ctx.inp(l_slot, i)}.reshape({ctx.inp(l_slot, i)}.size)[0])"
                    for i in range(len(ctx.op.input(l_slot)))]
        elif op == "expand_as_v2" and not ctx.attrs[attr]:
            if not ctx.has_input("Y"):
                return None
            Yl = ctx.inp("Y")
            vals = [f"{Yl}.shape[{i}]" for i in range(ctx.rank("Y"))]
        else:
            vals = [repr(int(v)) for v in ctx.attrs[attr]]
        if len(vals) > r:
            return None
        xd = ["1"] * (r - rx) + [f"{X}.shape[{i}]" for i in range(rx)]
        vals = ["1"] * (r - len(vals)) + vals
        if _TILING[op][3]:  # broadcast: -1 keeps X's dim; X's dim must be 1 or the target
            od = [f"({d} if {v} == -1 else {v})" if op == "expand_v2" else v
                  for d, v in zip(xd, vals)]
            lines += [f"_rt.check({d} == 1 or {d} == {o})" for d, o in zip(xd, od)
                      if d != "1"]
            # a new leading dim needs a size (-1 keeps only an existing dim)
            lines += [f"_rt.check({v} >= 1)" for v in vals[:r - rx]
                      if not v.lstrip("-").isdigit()]
        else:
            lines += [f"_rt.check({v} >= 1)" for v in vals if not v.isdigit()]
            od = [f"{d} * {v}" if v != "1" else d for d, v in zip(xd, vals)]
        dims = [ctx.tmp("d") for _ in od]
        lines += [f"{d} = {o}" for d, o in zip(dims, od)]
        out = ctx.out("Out")
        lines.append(f"{out} = np.empty({ctx.tuple_src(dims)}, {ctx.T('X')})")
        lines.append(f"{ctx.lib_fn('tile_nd')}("
                     f"{X}.reshape({X}.size), np.array({ctx.tuple_src(xd)}, "
                     f"np.int64), {out}.reshape({out}.size), np.array({ctx.tuple_src(dims)}, "
                     f"np.int64))")
        return lines

    return lower


def _tensor_count_src(ctx, slot) -> int:
    shape = ctx.shape(slot)
    return shape[0] if shape else 1


def _untile_lower(ctx):
    """The gradient of any of the four: the sum of Out@GRAD over the copies of X."""
    if ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    X, g = ctx.inp("X"), ctx.inp("Out@GRAD")
    r, rx = ctx.rank("Out@GRAD"), ctx.rank("X")
    if r == 0 or r < rx:
        return None
    xd = ["1"] * (r - rx) + [f"{X}.shape[{i}]" for i in range(rx)]
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    od = ctx.tuple_src(f"{g}.shape[{i}]" for i in range(r))
    return [f"{ctx.lib_fn('untile_nd')}("
            f"{g}.reshape({g}.size), np.array({ctx.tuple_src(xd)}, np.int64), "
            f"{dx}.reshape({dx}.size), np.array({od}, np.int64))"]


for _op in _TILING:
    lowering(_op, host=True)(_tiling_lower(_op))
    lowering(f"{_op}_grad", host=True)(_untile_lower)


def _permuted(ctx, X, perm, slot) -> list:
    """The lines writing output ``slot`` (allocated by the driver) = ``X`` permuted by
    ``_nn.permute_into`` (two groups of axes swapped, NCHW <-> NHWC or a channel shuffle: on
    the loop threads by a parallel loop; else NumPy's copy)."""
    out = ctx.out(slot, shape=ctx.tuple_src(f"{X}.shape[{p}]" for p in perm))
    return [f"{ctx.lib_fn('permute_into')}({X}, {ctx.tuple_src(perm)}, {out})"]


@lowering("transpose2", host=True)
@lowering("transpose", host=True)
def _transpose(ctx):
    return _transpose_lower(ctx, _permuted)


@lowering("transpose2_grad", host=True)
@lowering("transpose_grad", host=True)
def _transpose_grad(ctx):
    return _transpose_grad_lower(ctx, _permuted)
