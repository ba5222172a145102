"""Softmax (another axis than the last), its gradient, and dropout (:mod:`pdjit.ops.nn`) on
the CPU, through the kernels of :mod:`pdjit.codegen.cpu.lib`; softmax over the last axis and
its gradient are the op definitions' own row loops."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.ops.nn import (
    _CLIP,
    _flat,
    _pre_axis_post,
    _softmax_grad_lower,
    _softmax_lower,
    dropout_alias,
    dropout_grad_start,
    dropout_lowerable,
)


@lowering("softmax")
def _softmax(ctx):
    """Another axis ``a`` than the last: the data as ``(pre, n, post)`` through
    ``_nn.softmax_axis`` (one compilation per dtype for every rank and axis)."""
    r = ctx.rank("X")
    if r == 0 or ctx.attrs["axis"] % r == r - 1 or ctx.dtype("X").kind != "f":
        return _softmax_lower(ctx)  # (the rows; or None)
    T = ctx.T("X")
    axis = ctx.attrs["axis"] % r
    X = ctx.inp("X")
    out = ctx.out("Out", shape=f"{X}.shape")
    x3, o3 = ctx.tmp("x"), ctx.tmp("o")
    return [f"{x3} = {_pre_axis_post(ctx, X, r, axis)}", f"{o3} = {out}.reshape({x3}.shape)",
            f"{ctx.lib_fn('softmax_axis')}({x3}, {o3}, {T}({_CLIP}))"]


_softmax.row_prologue = _softmax_lower.row_prologue


@lowering("softmax_grad")
def _softmax_grad(ctx):
    """Another axis than the last: ``_nn.softmax_axis_grad`` on the data as
    ``(pre, n, post)``."""
    r = ctx.rank("Out")
    if r == 0 or ctx.dtype("Out").kind != "f" or ctx.dtype("Out@GRAD") != ctx.dtype("Out"):
        return None
    axis = ctx.attrs["axis"] % r
    if axis == r - 1:
        return _softmax_grad_lower(ctx)
    O, G = ctx.inp("Out"), ctx.inp("Out@GRAD")
    dx = ctx.out("X@GRAD", shape=f"{O}.shape")
    o2, g2, d2 = (ctx.tmp(h) for h in ("o", "g", "d"))
    for h in ("i", "j", "s"):  # the names the row loop takes: later names do not depend on the axis
        ctx.tmp(h)
    return [
        f"if {G}.size != {O}.size: raise ValueError('pdjit: softmax_grad shapes differ')",
        f"{o2} = {_pre_axis_post(ctx, O, r, axis)}",
        f"{g2} = {G}.reshape({o2}.shape)",
        f"{d2} = {dx}.reshape({o2}.shape)",
        f"{ctx.lib_fn('softmax_axis_grad')}({o2}, {g2}, {d2})",
    ]


@lowering("dropout", host=True)
def _dropout(ctx):
    """One library call: the random stream generated in the kernel from the run's key (the
    key the reference draws with: bit-identical Out and Mask); a non-zero ``Seed`` input
    value picks the key instead (``_nn.dropout_key``)."""
    if not dropout_lowerable(ctx):
        return None
    alias = dropout_alias(ctx)
    if alias is not None:
        return alias
    X, a = ctx.inp("X"), ctx.attrs
    out = ctx.out("Out", shape=f"{X}.shape")
    if ctx.has_output("Mask"):
        mask, lines = ctx.out("Mask", shape=f"{X}.shape"), []
    else:
        mask = ctx.tmp("mask")
        lines = [f"{mask} = np.empty({X}.shape, np.uint8)"]
    key = "np.uint64(0)" if a["is_test"] else ctx.rng_key()
    if ctx.has_input("Seed") and not a["is_test"]:
        seed = ctx.inp("Seed")
        key = f"np.uint64({ctx.lib_fn('dropout_key')}({_flat(seed)}, {key}))"
    upscale = a["dropout_implementation"] == "upscale_in_train"
    return lines + [f"{ctx.lib_fn('dropout_fwd')}({_flat(X)}, {key}, {float(a['dropout_prob'])!r}, "
                    f"{upscale}, {bool(a['is_test'])}, {_flat(out)}, {_flat(mask)})"]


@lowering("dropout_grad", host=True)
def _dropout_grad(ctx):
    """dX = dOut * Mask (/ (1 - p)): one elementwise library call."""
    start = dropout_grad_start(ctx)
    if start is None:
        return None
    G, dx, upscale = start
    a = ctx.attrs
    return [f"{ctx.lib_fn('dropout_bwd')}({_flat(G)}, {_flat(ctx.inp('Mask'))}, "
            f"{float(a['dropout_prob'])!r}, {upscale}, {bool(a['is_test'])}, {_flat(dx)})"]


@lowering("scaled_dot_product_attention", host=True)
def _attention(ctx):
    """``_nn.scaled_attention`` on the operands' permuted views (no copy) and the result written
    through the inverse of ``out_perm`` (float32/float64)."""
    if ctx.dtype("Q").kind != "f" or ctx.dtype("Q").itemsize not in (4, 8):
        return None
    r = ctx.rank("Q")
    views, perms = [], {}
    for slot in ("Q", "K", "V"):
        p = [int(a) for a in ctx.attrs[f"{slot.lower()}_perm"]] or list(range(r))
        if sorted(p) != list(range(r)) or ctx.rank(slot) != r:
            return None  # an error the reference reports
        perms[slot] = p
        x = ctx.inp(slot)
        views.append(x if p == list(range(r)) else f"{x}.transpose({ctx.tuple_src(p)})")
    o = [int(a) for a in ctx.attrs["out_perm"]] or list(range(r))
    if sorted(o) != list(range(r)):
        return None
    Q, V = ctx.inp("Q"), ctx.inp("V")
    res = [f"{Q}.shape[{perms['Q'][i]}]" for i in range(r - 1)] + \
        [f"{V}.shape[{perms['V'][r - 1]}]"]
    out = ctx.out("Out", shape=ctx.tuple_src([res[a] for a in o]))
    inv = sorted(range(r), key=lambda i: o[i])
    mask = ctx.inp("Mask") if ctx.has_input("Mask") else "None"
    view = out if o == list(range(r)) else f"{out}.transpose({ctx.tuple_src(inv)})"
    return [f"{ctx.lib_fn('scaled_attention')}({', '.join(views)}, {mask}, "
            f"{float(ctx.attrs['alpha'])!r}, {view})"]
