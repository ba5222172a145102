"""The gradients of the binary elementwise ops (:mod:`pdjit.ops.elementwise`) on the CPU."""
from __future__ import annotations

import numpy as np

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.ops.elementwise import _GRAD_SRC, _aligned_dims, _fits


def _add_sub_bias_lines(ctx, sign):
    """The common bias case of add/sub: X has Out's shape, Y covers Out's trailing dims.
    dX = dOut and dY = the rows of dOut summed (negated for sub); ``None`` otherwise."""
    g_rank, y_rank, x_rank = ctx.rank("Out@GRAD"), ctx.rank("Y"), ctx.rank("X")
    axis = ctx.attrs["axis"]
    off = g_rank - y_rank if axis == -1 else axis
    if x_rank != g_rank or off + y_rank != g_rank:
        return None
    g_shape = ctx.shape("Out@GRAD")
    if not _fits(ctx.shape("X"), g_shape) or \
            not _fits(ctx.shape("Y"), g_shape[off:off + y_rank]):
        return None  # a broadcast inside X or Y (a size-1 dim): the general lines sum it
    X, Y, g = ctx.inp("X"), ctx.inp("Y"), ctx.inp("Out@GRAD")
    lines = [f"_rt.check({X}.size == {g}.size)"]
    lines += [f"_rt.check({Y}.shape[{j}] == {g}.shape[{off + j}])" for j in range(y_rank)]
    if ctx.has_output("X@GRAD"):
        lines.append(f"{ctx.out('X@GRAD')} = {g}.copy()")
    if ctx.has_output("Y@GRAD"):
        rows = f"{g}.reshape(({g}.size // max({Y}.size, 1), {Y}.size))"
        lines.append(f"{ctx.out('Y@GRAD')} = ({sign}{rows}.sum(axis=0)).reshape({Y}.shape)")
    return lines


def _dims_src(dims) -> str:
    return "np.array((" + "".join(f"{d}, " for d in dims) + "), np.int64)"


def _ew_grad_lower(op_type):
    """Native gradients of a binary elementwise op under any Fluid ``axis`` broadcast (float32
    and float64; other dtypes run the reference). An operand that may be smaller than Out is
    broadcast to Out's shape with ``_nn.tile_nd`` where a template reads it; each gradient is
    computed over Out's elements by the op's template and summed back over its operand's
    broadcast dims with ``_nn.untile_nd`` (a plain copy where the operand is Out's shape).
    Run-time checks refuse shapes that do not broadcast (the reference then names them).
    An op whose gradients pass ``dOut`` through (add, sub: both templates ``{g}``) takes the bias
    lines (row sums) where X is Out's shape and Y its trailing dims."""
    (dx_src, dx_neg), (dy_src, dy_neg) = _GRAD_SRC[op_type]
    passes_g = dx_src == dy_src == "{g}"  # dX = dOut, dY = +-dOut: an add or a subtraction

    def lower(ctx):
        if passes_g and ctx.dtype("X").kind == "f":
            lines = _add_sub_bias_lines(ctx, "-" if dy_neg else "")
            if lines is not None:
                return lines
        ft = (np.dtype(np.float32), np.dtype(np.float64))
        dt = ctx.dtype("Out@GRAD")
        if dt not in ft or ctx.dtype("X") != dt or ctx.dtype("Y") != dt:
            return None
        R = ctx.rank("Out@GRAD")
        if R == 0 or max(ctx.rank("X"), ctx.rank("Y")) != R:
            return None
        ax, ay = _aligned_dims(ctx, "X", R), _aligned_dims(ctx, "Y", R)
        if ax is None or ay is None:
            return None
        (xd, xs), (yd, ys) = ax, ay
        g, T = ctx.inp("Out@GRAD"), ctx.T("Out@GRAD")
        gs = ctx.shape("Out@GRAD")
        gd = [f"{g}.shape[{i}]" for i in range(R)]
        lines = []
        for i in range(R):  # each aligned pair equal or 1, and Out's dim their broadcast
            a, b, o = xd[i], yd[i], gd[i]
            lines.append(f"_rt.check(({a} == {o} or {a} == 1) and ({b} == {o} or {b} == 1) "
                         f"and ({a} == {o} or {b} == {o}))")
        full = {"X": _fits(xs, gs), "Y": _fits(ys, gs)}  # Out's shape: read as it is
        lines += [f"_rt.check({ctx.inp(slot)}.size == {g}.size)" for slot in full if full[slot]]
        dims = {"X": xd, "Y": yd}
        flat = {"g": f"{g}.reshape({g}.size)"}
        wanted = [(slot, src, neg) for slot, src, neg in
                  (("X", dx_src, dx_neg), ("Y", dy_src, dy_neg))
                  if ctx.has_output(f"{slot}@GRAD")]
        for slot, key in (("X", "x"), ("Y", "y")):
            if not any("{" + key + "}" in src for _, src, _ in wanted):
                continue
            v = ctx.inp(slot)
            if full[slot]:
                flat[key] = f"{v}.reshape({v}.size)"
            else:  # broadcast to Out's shape
                b = ctx.tmp(f"{key}b")
                lines += [f"{b} = np.empty({g}.size, {T})",
                          f"{ctx.lib_fn('tile_nd')}("
                          f"{v}.reshape({v}.size), {_dims_src(dims[slot])}, {b}, "
                          f"{_dims_src(gd)})"]
                flat[key] = b
        for slot, src, neg in wanted:
            d = ctx.out(f"{slot}@GRAD", shape=f"{ctx.inp(slot)}.shape")
            value = src.format(T=T, **flat)
            df = f"{d}.reshape({d}.size)"
            if full[slot]:
                lines.append(f"{df}[:] = {'-(' + value + ')' if neg else value}")
                continue
            if value != flat["g"]:
                t = ctx.tmp(f"d{slot.lower()}f")
                lines.append(f"{t} = {value}")
                value = t
            lines.append(f"{ctx.lib_fn('untile_nd')}({value}, {_dims_src(dims[slot])}, {df}, "
                         f"{_dims_src(gd)})")
            if neg:
                lines.append(f"{df}[:] = -{df}")
        return lines
    return lower


for _name in _GRAD_SRC:
    lowering(f"{_name}_grad", host=True)(_ew_grad_lower(_name))
