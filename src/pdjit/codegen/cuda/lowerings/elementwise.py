"""The gradients of the binary elementwise ops (:mod:`pdjit.ops.elementwise`) on the device."""
from __future__ import annotations

import ast

import numpy as np

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.ops.elementwise import _GRAD_SRC, _aligned_dims


def _arithmetic(*templates) -> bool:
    """Whether gradient templates are plain arithmetic of ``{g}``, ``{x}``, ``{y}`` (operators
    only: no function or method, which a device kernel's lines may not have)."""
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.operator,
               ast.unaryop)
    for src in templates:
        tree = ast.parse(src.format(g="g", x="x", y="y", T="T"), mode="eval")
        if not all(isinstance(n, allowed) for n in ast.walk(tree)):
            return False
    return True


def _ew_grad_device_lines(ctx, wanted):
    """The gradients on a device target where X has Out's shape and Y's dims are a block
    ``[start, start + rank)`` of Out's (a bias, a per-channel scale, or Out's shape itself):
    Out viewed as ``(pre, mid, post)``, X@GRAD one thread per element, Y@GRAD one thread per
    element of Y summing over ``pre`` and ``post``. Other broadcasts: None (the host)."""
    R = ctx.rank("Out@GRAD")
    ax = _aligned_dims(ctx, "Y", R)
    if ax is None or ctx.rank("X") != R:
        return None
    ry = ctx.rank("Y")
    start = R - ry if ctx.attrs["axis"] == -1 or ry == R else ctx.attrs["axis"]
    g, X, Y, T = ctx.inp("Out@GRAD"), ctx.inp("X"), ctx.inp("Y"), ctx.T("Out@GRAD")
    pre, mid, post = (ctx.tmp(h) for h in ("pre", "mid", "post"))
    gf, xf, yf = ctx.tmp("g"), ctx.tmp("x"), ctx.tmp("y")
    lines = [f"_rt.check({X}.shape == {g}.shape)"]
    lines += [f"_rt.check({Y}.shape[{j}] == {g}.shape[{start + j}])" for j in range(ry)]
    lines += [f"{pre} = {ctx.prod(g, 0, start)}", f"{mid} = {ctx.prod(g, start, start + ry)}",
              f"{post} = {ctx.prod(g, start + ry, R)}", f"{gf} = {g}.reshape({g}.size)",
              f"{xf} = {X}.reshape({X}.size)", f"{yf} = {Y}.reshape({Y}.size)"]
    for slot, src, neg in wanted:
        d = ctx.out(f"{slot}@GRAD", shape=f"{ctx.inp(slot)}.shape")
        df, i = ctx.tmp("d"), ctx.tmp("i")
        lines.append(f"{df} = {d}.reshape({d}.size)")
        if slot == "X":
            v = src.format(g=f"{gf}[{i}]", x=f"{xf}[{i}]", y=f"{yf}[({i} // {post}) % {mid}]",
                           T=T)
            lines += ctx.device_loop(i, f"{df}.size",
                                     [f"{df}[{i}] = {'-(' + v + ')' if neg else v}"])
            continue
        p, q, e, acc = ctx.tmp("p"), ctx.tmp("q"), ctx.tmp("e"), ctx.tmp("acc")
        v = src.format(g=f"{gf}[{e}]", x=f"{xf}[{e}]", y=f"{yf}[{i}]", T=T)
        body = [f"{acc} = {T}(0)",
                f"for {p} in range({pre}):",
                f"    for {q} in range({post}):",
                f"        {e} = ({p} * {mid} + {i}) * {post} + {q}",
                f"        {acc} += {v}",
                f"{df}[{i}] = {'-' if neg else ''}{acc}"]
        lines += ctx.device_loop(i, f"{df}.size", body)
    return lines


def _ew_grad_lower(op_type):
    """Float32 and float64 where the broadcast is one ``_ew_grad_device_lines`` covers and the
    op's gradient templates are plain arithmetic."""
    (dx_src, dx_neg), (dy_src, dy_neg) = _GRAD_SRC[op_type]
    arithmetic = _arithmetic(dx_src, dy_src)

    def lower(ctx):
        if not arithmetic:
            return None
        ft = (np.dtype(np.float32), np.dtype(np.float64))
        dt = ctx.dtype("Out@GRAD")
        if dt not in ft or ctx.dtype("X") != dt or ctx.dtype("Y") != dt:
            return None
        wanted = [(slot, src, neg) for slot, src, neg in
                  (("X", dx_src, dx_neg), ("Y", dy_src, dy_neg))
                  if ctx.has_output(f"{slot}@GRAD")]
        return _ew_grad_device_lines(ctx, wanted)
    return lower


for _name in _GRAD_SRC:
    lowering(f"{_name}_grad", host=True)(_ew_grad_lower(_name))
