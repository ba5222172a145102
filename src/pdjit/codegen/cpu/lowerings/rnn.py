"""``rnn`` and ``rnn_grad`` (:mod:`pdjit.ops.rnn`) on the CPU.

Natively (float32 / float64, weights and states of the input's dtype) both ops are host lines
calling ``_nn.rnn_forward_at`` / ``_nn.rnn_backward``: one compiled time loop per dtype for
every mode and size (a large batch split into slices on the loop threads). The forward reads the
weights where they lie (an address table of the WeightList's arrays, no copy per run); the
backward takes them flattened into one array. With dropout the masks
are drawn natively from the run's key (the numbers the reference draws). ``rnn_grad`` skips the
input gradient (a GEMM over every step) when nothing reads ``Input@GRAD`` (a data input).
"""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.codegen.lowering import weight_var
from pdjit.framework.registry import EMPTY_VAR_NAME
from pdjit.ops.rnn import _NATIVE, _dropping, _mode


# ---- the native forward ------------------------------------------------------------------------
def _flat_weights(ctx, lines, n) -> str:
    ws = [ctx.inp("WeightList", i) for i in range(n)]
    wf = ctx.tmp("wf")
    lines.append(f"{wf} = np.concatenate(({''.join(f'{w}.reshape({w}.size), ' for w in ws)}))")
    return wf


def _weight_table(ctx, lines, n, x) -> str:
    """The (address, size) table of the WeightList where its arrays lie (no copy per run),
    and of its matrices packed transposed where that pays: kept from run to run where no op
    of the program writes them (``_nn.rnn_weight_table``; a native driver then takes the
    table as an argument, ``LowerContext.derived``)."""
    ws = [ctx.inp("WeightList", i) for i in range(n)]
    half = n // 2
    kept = all(weight_var(ctx.op, ctx.op.input("WeightList")[i]) is not None
               for i in range(half))
    if kept:
        dv = ctx.derived("rnn_weight_table", [[("WeightList", i) for i in range(half)],
                                              [("WeightList", i) for i in range(half, n)]],
                         (0, 0, True))
        if dv is not None:
            return dv
    wt = ctx.tmp("wt")
    lines.append(f"{wt} = {ctx.lib_fn('rnn_weight_table')}("
                 f"({''.join(f'{w}, ' for w in ws[:half])}), "
                 f"({''.join(f'{w}, ' for w in ws[half:])}), {x}.shape[0], {x}.shape[1], "
                 f"{kept})")
    return wt


def _lens_line(ctx, lines, x) -> str:
    ln = ctx.tmp("lens")
    if ctx.has_input("SequenceLength"):
        sl = ctx.inp("SequenceLength")
        lines += [f"{ln} = {sl}.astype(np.int64).reshape({sl}.size)",
                  f"if {ln}.size != {x}.shape[1] or ({ln}.size > 0 and ({ln}.min() < 0 or "
                  f"{ln}.max() > {x}.shape[0])):",
                  "    raise ValueError('rnn: SequenceLength does not fit Input')"]
    else:
        lines.append(f"{ln} = np.empty(0, np.int64)")
    return ln


def _native_ok(ctx, n_states, n_weights) -> bool:
    t = ctx.dtype("Input")
    if t not in _NATIVE:
        return False
    return (all(ctx.dtype("PreState", i) == t for i in range(n_states))
            and all(ctx.dtype("WeightList", i) == t for i in range(n_weights)))


@lowering("rnn", host=True)
def _rnn_lower(ctx):
    a = ctx.attrs
    code, G = _mode(a["mode"], "rnn")
    L, D, H = int(a["num_layers"]), 2 if a["is_bidirec"] else 1, int(a["hidden_size"])
    ns, nw = (2 if code == 0 else 1), 4 * L * D
    if len(ctx.op.input("PreState")) != ns or len(ctx.op.input("WeightList")) != nw \
            or not _native_ok(ctx, ns, nw):
        return None  # the reference names what does not fit
    lines = []
    x, T = ctx.inp("Input"), ctx.T("Input")
    h0 = ctx.inp("PreState", 0)
    c0 = ctx.inp("PreState", 1) if code == 0 else h0
    save = ctx.has_output("Reserve") and ctx.used("Reserve")
    wt = _weight_table(ctx, lines, nw, x)
    ln = _lens_line(ctx, lines, x)
    out = ctx.out("Out", shape=f"({x}.shape[0], {x}.shape[1], {D * H})")
    hn = ctx.out("State", 0, shape=f"{h0}.shape")
    cn = ctx.out("State", 1, shape=f"{h0}.shape") if code == 0 else hn
    # bytes per (step, sequence), in elements of the variable's dtype (Paddle declares uint8)
    per = (L * D * (G + 2) * H + (L - 1) * D * H) * ctx.dtype("Input").itemsize
    item = ctx.dtype("Reserve").itemsize if ctx.has_output("Reserve") else 1
    res = ctx.out("Reserve", shape=f"(({x}.shape[0] * {x}.shape[1] * {per} + {item - 1}) // "
                                   f"{item},)" if save else "(0,)") \
        if ctx.has_output("Reserve") else None
    p = float(a["dropout_prob"])
    if _dropping(p, a["is_test"], L):
        # the masks: the draws of the run's stream (``_nn.dropout_fwd`` on zeros draws what
        # the reference draws), kept in DropoutState for the gradient
        shape = f"({(L - 1) * D * H} * {x}.shape[0] * {x}.shape[1],)"
        dm = _out_or_scratch(ctx, lines, "DropoutState", 0, shape, "np.uint8")
        z, zo = ctx.tmp("z"), ctx.tmp("zo")
        lines += [f"{z} = np.zeros({dm}.size, {T})", f"{zo} = np.empty({dm}.size, {T})",
                  f"{ctx.lib_fn('dropout_fwd')}("
                  f"{z}, {ctx.rng_key()}, {p!r}, True, False, {zo}, {dm})"]
        scale = repr(1.0 / (1.0 - p))
    else:
        if ctx.has_output("DropoutState"):
            ctx.out("DropoutState", shape="(0,)")
        dm, scale = "np.empty(0, np.uint8)", "1.0"
    rf = ctx.tmp("rf")
    lines.append(f"{rf} = {res}.view({T})" if save else f"{rf} = np.empty(0, {T})")
    lines.append(f"{ctx.lib_fn('rnn_forward_at')}("
                 f"{x}, {h0}, {c0}, {wt}, {ln}, {code}, {L}, {D}, {save}, "
                 f"{dm}, {scale}, {out}, {hn}, {cn}, {rf})")
    return lines


def _out_or_scratch(ctx, lines, slot, i, shape, T) -> str:
    names = ctx.op.output(slot)
    if i < len(names) and names[i] != EMPTY_VAR_NAME:
        return ctx.out(slot, i, shape=shape)
    t = ctx.tmp("s")
    lines.append(f"{t} = np.empty({shape}, {T})")
    return t


@lowering("rnn_grad", host=True)
def _rnn_grad_lower(ctx):
    a = ctx.attrs
    code, G = _mode(a["mode"], "rnn_grad")
    L, D, H = int(a["num_layers"]), 2 if a["is_bidirec"] else 1, int(a["hidden_size"])
    ns, nw = (2 if code == 0 else 1), 4 * L * D
    if len(ctx.op.input("PreState")) != ns or len(ctx.op.input("WeightList")) != nw \
            or not _native_ok(ctx, ns, nw) or not ctx.has_input("Reserve") \
            or not ctx.has_input("Out@GRAD") or len(ctx.op.input("State@GRAD")) != ns:
        return None
    dropping = _dropping(a["dropout_prob"], a["is_test"], L)
    if dropping and not ctx.has_input("DropoutState"):
        return None
    lines = []
    x, T = ctx.inp("Input"), ctx.T("Input")
    h0 = ctx.inp("PreState", 0)
    wf = _flat_weights(ctx, lines, nw)
    ln = _lens_line(ctx, lines, x)
    rf = ctx.tmp("rf")
    lines.append(f"{rf} = {ctx.inp('Reserve')}.view({T})")
    if dropping:
        dm, scale = ctx.inp("DropoutState"), repr(1.0 / (1.0 - float(a["dropout_prob"])))
    else:
        dm, scale = "np.empty(0, np.uint8)", "1.0"
    dout = ctx.inp("Out@GRAD")
    states = []
    for i in range(ns):  # a gradient written @EMPTY@ (no consumer): zeros
        if ctx.op.input("State@GRAD")[i] == EMPTY_VAR_NAME:
            z = ctx.tmp("z")
            lines.append(f"{z} = np.zeros({h0}.shape, {T})")
            states.append(z)
        else:
            states.append(ctx.inp("State@GRAD", i))
    dhn = states[0]
    dcn = states[1] if code == 0 else dhn
    names = ctx.op.output("Input@GRAD")
    if names and names[0] != EMPTY_VAR_NAME and ctx.used("Input@GRAD"):
        dx = ctx.out("Input@GRAD", shape=f"{x}.shape")
    else:  # nothing reads it: the kernel skips the GEMM
        dx = ctx.tmp("dx")
        lines.append(f"{dx} = np.empty((0, 0, 0), {T})")
    dh0 = _out_or_scratch(ctx, lines, "PreState@GRAD", 0, f"{h0}.shape", T)
    dc0 = _out_or_scratch(ctx, lines, "PreState@GRAD", 1, f"{h0}.shape", T) if code == 0 \
        else dh0
    dw = ctx.tmp("dw")
    lines.append(f"{dw} = np.empty({wf}.size, {T})")
    lines.append(f"{ctx.lib_fn('rnn_backward')}("
                 f"{x}, {wf}, {ln}, {code}, {L}, {D}, {H}, {rf}, {dm}, "
                 f"{scale}, {dout}, {dhn}, {dcn}, {dx}, {dh0}, {dc0}, {dw})")
    pos = ctx.tmp("p")
    lines.append(f"{pos} = 0")
    for i in range(nw):
        w = ctx.inp("WeightList", i)
        names = ctx.op.output("WeightList@GRAD")
        if i < len(names) and names[i] != EMPTY_VAR_NAME:
            g = ctx.out("WeightList@GRAD", i, shape=f"{w}.shape")
            lines.append(f"{g}.reshape({g}.size)[:] = {dw}[{pos}:{pos} + {w}.size]")
        lines.append(f"{pos} += {w}.size")
    return lines
