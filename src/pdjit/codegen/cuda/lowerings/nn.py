"""Softmax with cross entropy (and its gradient) and dropout (:mod:`pdjit.ops.nn`) on the
device: a row or an element per thread; softmax over the last axis is the op definition's own
row loop."""
from __future__ import annotations

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.ops.nn import (
    _flat,
    _swce_lowerable,
    dropout_alias,
    dropout_grad_start,
    dropout_lowerable,
)


@lowering("softmax_with_cross_entropy")
def _swce_lower(ctx):
    if not _swce_lowerable(ctx, "Logits"):
        return None
    return _swce_device_lines(ctx)


def _swce_device_lines(ctx):
    """The device target's lines: ``_cu.softmax_xent_rows`` (a label out of range raises on
    the host after a check on the device: the references then name it)."""
    X, L, r = ctx.inp("Logits"), ctx.inp("Label"), ctx.rank("Logits")
    lead = [f"{X}.shape[{d}]" for d in range(r - 1)]
    sm = ctx.out("Softmax", shape=f"{X}.shape")
    loss = ctx.out("Loss", shape=ctx.tuple_src(lead + ["1"]))
    n, rows, lab = ctx.tmp("n"), ctx.tmp("r"), ctx.tmp("b")
    return [f"{n} = {X}.shape[{r - 1}]",
            f"{rows} = {X}.size // {n} if {n} else {ctx.prod(X, 0, r - 1)}",
            f"{lab} = {L}.reshape({L}.size)",
            f"_rt.check({lab}.size == {rows})",
            f"_cu.softmax_xent_rows({X}.reshape({X}.size), {lab}, {sm}.reshape({sm}.size), "
            f"{loss}.reshape({loss}.size), {rows}, {n}, {int(ctx.attrs['ignore_index'])})"]


@lowering("softmax_with_cross_entropy_grad")
def _swce_grad_lower(ctx):
    if not _swce_lowerable(ctx, "Softmax") or not ctx.has_output("Logits@GRAD"):
        return None
    return _swce_grad_device_lines(ctx)


def _swce_grad_device_lines(ctx):
    """Logits@GRAD on a device target: a row per thread (a label out of range, which the
    forward refused, leaves the row without its one-hot term)."""
    sm, L, g, T = ctx.inp("Softmax"), ctx.inp("Label"), ctx.inp("Loss@GRAD"), ctx.T("Softmax")
    r = ctx.rank("Softmax")
    out = ctx.out("Logits@GRAD", shape=f"{sm}.shape")
    s2, o2, lab, gf, i, j, k = (ctx.tmp(h) for h in "sobgijk")
    ign = int(ctx.attrs["ignore_index"])
    body = [f"{k} = {lab}[{i}]",
            f"for {j} in range({s2}.shape[1]):",
            f"    {o2}[{i}, {j}] = {T}(0) if {k} == {ign} else {s2}[{i}, {j}] * {gf}[{i}]",
            f"if {k} != {ign} and 0 <= {k} < {s2}.shape[1]:",
            f"    {o2}[{i}, {k}] = ({s2}[{i}, {k}] - {T}(1)) * {gf}[{i}]"]
    return [f"{s2} = {ctx.as_rows(sm, r)}",
            f"{lab} = {L}.reshape({L}.size)",
            f"{gf} = {g}.reshape({g}.size)",
            f"_rt.check({lab}.size == {s2}.shape[0] and {gf}.size == {s2}.shape[0])",
            f"{o2} = {out}.reshape({s2}.shape)"] + ctx.device_loop(i, f"{s2}.shape[0]", body)


@lowering("dropout", host=True)
def _dropout_lower(ctx):
    if not dropout_lowerable(ctx):
        return None
    alias = dropout_alias(ctx)
    return alias if alias is not None else _dropout_device_lines(ctx)


def _dropout_device_lines(ctx):
    """Dropout on a device target: one thread per element draws element ``i`` of the run's
    stream (``_m.uniform01``: the numbers the reference and the cpu target draw). Not with a
    ``Seed`` input (its value picks the key: the host)."""
    if ctx.has_input("Seed"):
        return None
    X, a, T = ctx.inp("X"), ctx.attrs, ctx.T("X")
    p = float(a["dropout_prob"])
    upscale = a["dropout_implementation"] == "upscale_in_train"
    out = ctx.out("Out", shape=f"{X}.shape")
    mask = ctx.out("Mask", shape=f"{X}.shape") if ctx.has_output("Mask") else \
        ctx.tmp("mask")
    lines = [] if ctx.has_output("Mask") else [f"{mask} = _cu.empty({X}.shape, np.uint8)"]
    x, o, m, i, q, pp = (ctx.tmp(h) for h in ("x", "o", "m", "i", "q", "p"))
    lines += [f"{x} = {_flat(X)}", f"{o} = {_flat(out)}", f"{m} = {_flat(mask)}",
              f"{q} = {T}(1.0 - {p!r})", f"{pp} = {p!r}"]
    if a["is_test"]:
        body = [f"{o}[{i}] = {x}[{i}]" if upscale else f"{o}[{i}] = {x}[{i}] * {q}",
                f"{m}[{i}] = 1"]
    else:
        key = ctx.rng_key()
        body = [f"if _m.uniform01({key}, {i}) >= {pp}:",
                f"    {m}[{i}] = 1",
                f"    {o}[{i}] = {x}[{i}] / {q}" if upscale else f"    {o}[{i}] = {x}[{i}]",
                "else:",
                f"    {m}[{i}] = 0",
                f"    {o}[{i}] = {T}(0)"]
    return lines + ctx.device_loop(i, f"{x}.size", body)


@lowering("dropout_grad", host=True)
def _dropout_grad_lower(ctx):
    """dX = dOut * Mask (/ (1 - p)): one thread per element."""
    start = dropout_grad_start(ctx)
    if start is None:
        return None
    G, dx, upscale = start
    a = ctx.attrs
    p, T = float(a["dropout_prob"]), ctx.T("Out@GRAD")
    g, m, d, i, q = (ctx.tmp(h) for h in ("g", "m", "d", "i", "q"))
    lines = [f"{g} = {_flat(G)}", f"{d} = {_flat(dx)}", f"{q} = {T}(1.0 - {p!r})"]
    if a["is_test"]:
        body = [f"{d}[{i}] = {g}[{i}]" if upscale else f"{d}[{i}] = {g}[{i}] * {q}"]
    else:
        lines.append(f"{m} = {_flat(ctx.inp('Mask'))}")
        v = f"{g}[{i}] * {T}({m}[{i}])"
        body = [f"{d}[{i}] = ({v} / {q} if {q} > 0 else {T}(0))" if upscale and p < 1.0
                else f"{d}[{i}] = {T}(0)" if upscale else f"{d}[{i}] = {v}"]
    return lines + ctx.device_loop(i, f"{g}.size", body)
