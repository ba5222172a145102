"""The reductions' gradients, ``mean_grad`` and ``sum`` (:mod:`pdjit.ops.reduce`) on the
device: one thread per output element."""
from __future__ import annotations

import numpy as np

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.ops.reduce import reduce_grad_axes, sum_operands


def _make_reduce_grad_lower(kind):
    """The gradient of a reduction of ``kind`` (``"total"``, ``"average"``, ``"extreme"``,
    ``"product"``, given where it is registered)."""
    def lower(ctx):
        axes = reduce_grad_axes(ctx)
        if axes is None:
            return None
        return _reduce_grad_device_lines(ctx, kind, axes)
    return lower


def _reduce_grad_device_lines(ctx, kind: str, axes) -> list | None:
    """A reduction's gradient on a device target: one thread per element of X, unravelling
    its index into the kept coordinates (its group's element of Out@GRAD) and, for max/min,
    visiting its group to count the hits of the extreme (the reference's rule and
    operations: ``g / n``, ``g * hit / count``); for prod, the products of its group's
    elements before it and after it in C order, each in the order the CPU's running products
    take (``g * (before * after)``: exact where X holds zeros, no division)."""
    if kind == "extreme" and \
            (not ctx.has_input("Out") or ctx.dtype("Out") != ctx.dtype("X")):
        return None
    X, g, T = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X")
    r = ctx.rank("X")
    lines: list = []

    def flat(local):
        t = ctx.tmp("f")
        lines.append(f"{t} = {local}.reshape({local}.size)")
        return t
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    x1, g1, dx1 = flat(X), flat(g), flat(dx)
    dims = [ctx.tmp("d") for _ in range(r)]
    lines += [f"{d} = {X}.shape[{i}]" for i, d in enumerate(dims)]
    kept = " * ".join("1" if d in axes else dims[d] for d in range(r))
    lines.append(f"_rt.check({g}.size == {kept})")
    i = ctx.tmp("i")
    body = [f"t_ = {i}", "k_ = 0", "w_ = 1"]
    for d in range(r - 1, -1, -1):  # the coordinates of element i, the kept ones' flat index
        body += [f"q{d} = t_ % {dims[d]}", f"t_ = t_ // {dims[d]}"]
        if d not in axes:
            body += [f"k_ += q{d} * w_", f"w_ *= {dims[d]}"]
    if kind == "total":
        body.append(f"{dx1}[{i}] = {g1}[k_]")
    elif kind == "average":
        n = " * ".join(dims[d] for d in axes) or "1"
        body.append(f"{dx1}[{i}] = {T}({g1}[k_] / max({n}, 1))")
    elif kind == "product":
        m = " * ".join(dims[d] for d in axes) or "1"
        idx = _group_index(r, axes, dims)
        own = "0"
        for d in axes:  # the element's place in its group (C order over the reduced dims)
            own = f"({own}) * {dims[d]} + q{d}"
        body += [f"s_ = {own}", f"b_ = {T}(1)", "for e_ in range(s_):", "    t_ = e_"]
        body += _group_coords(axes, dims) + [f"    b_ *= {x1}[{idx}]",
                                             f"a_ = {T}(1)",
                                             f"for e_ in range({m} - 1, s_, -1):", "    t_ = e_"]
        body += _group_coords(axes, dims) + [f"    a_ *= {x1}[{idx}]",
                                             f"{dx1}[{i}] = {g1}[k_] * (b_ * a_)"]
    else:
        o1 = flat(ctx.inp("Out"))
        lines.append(f"_rt.check({o1}.size == {g1}.size)")
        m = " * ".join(dims[d] for d in axes) or "1"
        body += [f"o_ = {o1}[k_]", "cnt = 0", f"for e_ in range({m}):", "    t_ = e_"]
        for d in reversed(axes):  # the group's element e_: the reduced coordinates from e_
            body += [f"    p{d} = t_ % {dims[d]}", f"    t_ = t_ // {dims[d]}"]
        idx, stride = [], []
        for d in range(r - 1, -1, -1):
            coord = f"p{d}" if d in axes else f"q{d}"
            idx.append(coord + "".join(f" * {s}" for s in stride))
            stride.append(dims[d])
        body += [f"    if {x1}[{' + '.join(idx)}] == o_:", "        cnt += 1",
                 f"if {x1}[{i}] == o_:",
                 f"    {dx1}[{i}] = {T}({g1}[k_] / cnt)",
                 "else:", f"    {dx1}[{i}] = {T}(0)"]
    return lines + ctx.device_loop(i, f"{dx1}.size", body)


def _group_coords(axes, dims) -> list:
    """Kernel lines (in a loop body) unravelling ``t_``, an element's place in its group, into
    the reduced coordinates ``p{d}``."""
    lines = []
    for d in reversed(axes):
        lines += [f"    p{d} = t_ % {dims[d]}", f"    t_ = t_ // {dims[d]}"]
    return lines


def _group_index(r: int, axes, dims) -> str:
    """Source of the flat index of the group element at reduced coordinates ``p{d}`` and the
    thread's kept coordinates ``q{d}``."""
    idx, stride = [], []
    for d in range(r - 1, -1, -1):
        coord = f"p{d}" if d in axes else f"q{d}"
        idx.append(coord + "".join(f" * {s}" for s in stride))
        stride.append(dims[d])
    return " + ".join(idx)


lowering("reduce_sum_grad", host=True)(_make_reduce_grad_lower("total"))
lowering("reduce_mean_grad", host=True)(_make_reduce_grad_lower("average"))
lowering("reduce_max_grad", "reduce_min_grad", host=True)(_make_reduce_grad_lower("extreme"))
lowering("reduce_prod_grad", host=True)(_make_reduce_grad_lower("product"))


@lowering("mean_grad", host=True)
def _mean_grad_lower(ctx):
    """One kernel writes every element."""
    if ctx.dtype("X").kind != "f" or not ctx.has_output("X@GRAD"):
        return None
    X, g, T = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X")
    out = ctx.out("X@GRAD", shape=f"{X}.shape")
    o, gf, n, i = ctx.tmp("o"), ctx.tmp("g"), ctx.tmp("n"), ctx.tmp("i")
    return [f"_rt.check({g}.size == 1)", f"{o} = {out}.reshape({out}.size)",
            f"{gf} = {g}.reshape(1)", f"{n} = {X}.size"] + \
        ctx.device_loop(i, f"{o}.size", [f"{o}[{i}] = {gf}[0] / {T}({n})"])


@lowering("sum", host=True)
def _sum_lower(ctx):
    """One kernel adding left to right, as the reference."""
    operands = sum_operands(ctx)
    if operands is None:
        return None
    xs, out, lines = operands
    n = len(xs)
    if ctx.dtype("X") not in (np.dtype(t) for t in ("float32", "float64", "int32", "int64")):
        return None
    flats = [ctx.tmp("f") for _ in range(n + 1)]
    lines += [f"{f} = {a}.reshape({a}.size)" for f, a in zip(flats, [out] + xs)]
    i = ctx.tmp("i")
    total = " + ".join(f"{f}[{i}]" for f in flats[1:])
    return lines + ctx.device_loop(i, f"{flats[0]}.size",
                                   [f"{flats[0]}[{i}] = {total}"])
