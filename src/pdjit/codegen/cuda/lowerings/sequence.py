"""The sequence ops of :mod:`pdjit.ops.sequence` on the device (pool, softmax, expand,
expand_as, with their gradients).

A lowering's lines are the host driver's: they check sizes against the host offsets and
launch grid-stride kernels (``ctx.device_loop``) that read the offsets' device copy.
``ctx.lod`` names an ``Offsets`` here (``.host``, ``.dev``:
:func:`pdjit.codegen.cuda.device.offsets`), copied to the device once per offsets array. One
thread per (sequence, feature) where the features are independent, one per sequence otherwise;
the kernels' own locals have fixed names (their text never depends on the driver's names)."""
from __future__ import annotations

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.ops.sequence_lower import (
    _BAD,
    _check_offsets,
    _column_checks,
    _shape_like,
    pool_grad_ok,
    pool_spec,
)


def _dev_offsets(ctx, slot: str, lines: list, level: int = -1, optional: bool = False):
    """(host offsets, device offsets) of input ``slot``'s LoD level, bound by ``lines``."""
    L = ctx.lod(slot, level, optional=optional)
    h, d = ctx.tmp("oh"), ctx.tmp("od")
    lines += [f"{h} = {L}.host", f"{d} = {L}.dev"]
    return h, d


_SK = ["s_ = t_ // w_", "k_ = t_ % w_"]  # the (sequence, feature) of thread t_


def _dev_pool(ctx, index: bool, pad: str):
    X, T, r = ctx.inp("X"), ctx.T("X"), ctx.rank("X")
    pooltype = ctx.attrs["pooltype"]
    lines: list = []
    oh, od = _dev_offsets(ctx, "X", lines)
    n, w, x2, o2, m2 = (ctx.tmp(h) for h in "nwxom")
    lines += _check_offsets(oh, n, f"{X}.shape[0]") + [
        f"{w} = {ctx.prod(X, 1, r)}",
        f"{x2} = {X}.reshape(({X}.shape[0], {w}))",
        f"{o2} = _cu.empty(({n}, {w}), {T})",
    ] + ([f"{m2} = _cu.full(({n}, {w}), -1, np.int32)"] if index else [])
    body = [f"b_ = {od}[s_]", f"e_ = {od}[s_ + 1]",
            "if e_ == b_:", f"    {o2}[s_, k_] = {T}({pad})", "else:"]
    if pooltype in ("AVERAGE", "SUM", "SQRT"):
        body += ["    acc_ = " + f"{x2}[b_, k_]",
                 "    for i_ in range(b_ + 1, e_):",
                 f"        acc_ += {x2}[i_, k_]"]
        if pooltype == "SUM":
            body.append(f"    {o2}[s_, k_] = acc_")
        else:  # divided in float64, rounded once: as the cpu and the reference do
            div = "(e_ - b_)" if pooltype == "AVERAGE" else "math.sqrt(e_ - b_)"
            body.append(f"    {o2}[s_, k_] = {T}(acc_ / {div})")
    elif pooltype == "MAX":
        body += [f"    acc_ = {x2}[b_, k_]",
                 "    j_ = b_",
                 "    for i_ in range(b_ + 1, e_):",
                 f"        if {x2}[i_, k_] > acc_:",
                 f"            acc_ = {x2}[i_, k_]",
                 "            j_ = i_",
                 f"    {o2}[s_, k_] = acc_"] + ([f"    {m2}[s_, k_] = j_"] if index else [])
    else:
        last = "e_ - 1" if pooltype == "LAST" else "b_"
        body.append(f"    {o2}[s_, k_] = {x2}[{last}, k_]")
    lines += ctx.device_loop("t_", f"{n} * {w}", _SK + body, before=[f"w_ = {w}"])
    lines.append(f"{ctx.out('Out')} = {o2}.reshape({_shape_like(ctx, n, X, r)})")
    if index:
        lines.append(f"{ctx.out('MaxIndex')} = {m2}.reshape({_shape_like(ctx, n, X, r)})")
    return lines


def _dev_pool_grad(ctx):
    X, G, T, r = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X"), ctx.rank("X")
    pooltype = ctx.attrs["pooltype"]
    lines: list = []
    oh, od = _dev_offsets(ctx, "X", lines)
    n, w, g2, d2 = (ctx.tmp(h) for h in "nwgd")
    out = ctx.out("X@GRAD", shape=f"{X}.shape", zero=True)
    lines += _check_offsets(oh, n, f"{X}.shape[0]") + [
        f"{w} = {ctx.prod(X, 1, r)}",
        f"if {G}.shape[0] != {n} or {G}.size != {n} * {w}:",
        f"    {_BAD}",
        f"{g2} = {G}.reshape(({n}, {w}))",
        f"{d2} = {out}.reshape(({X}.shape[0], {w}))",
    ]
    body = [f"b_ = {od}[s_]", f"e_ = {od}[s_ + 1]", "if e_ > b_:"]
    if pooltype in ("AVERAGE", "SUM", "SQRT"):
        scale = {"SUM": "1.0", "AVERAGE": "1.0 / (e_ - b_)",
                 "SQRT": "1.0 / math.sqrt(e_ - b_)"}[pooltype]
        body += [f"    c_ = {scale}",
                 f"    g_ = {g2}[s_, k_]",
                 "    for i_ in range(b_, e_):",
                 f"        {d2}[i_, k_] = {T}(g_ * c_)"]
    elif pooltype == "MAX":
        # MaxIndex may name any row (the cpu's += over rows): added atomically; a row out of
        # range is skipped (a kernel cannot raise; the forward op never writes one)
        M = ctx.inp("MaxIndex")
        m2 = ctx.tmp("mi")
        lines += [f"if {M}.size != {n} * {w}:", f"    {_BAD}",
                  f"{m2} = {M}.reshape(({n}, {w}))"]
        body += [f"    j_ = {m2}[s_, k_]",
                 "    if j_ >= 0 and j_ < nx_:",
                 f"        cuda.atomic.add({d2}, (j_, k_), {g2}[s_, k_])"]
    else:
        row = "e_ - 1" if pooltype == "LAST" else "b_"
        body.append(f"    {d2}[{row}, k_] = {g2}[s_, k_]")
    return lines + ctx.device_loop("t_", f"{n} * {w}", _SK + body,
                                   before=[f"w_ = {w}", f"nx_ = {X}.shape[0]"])


def _dev_softmax(ctx):
    X, T = ctx.inp("X"), ctx.T("X")
    lines: list = []
    oh, od = _dev_offsets(ctx, "X", lines)
    n, x1, o1 = (ctx.tmp(h) for h in "nxo")
    out = ctx.out("Out", shape=f"{X}.shape")
    lines += _check_offsets(oh, n, f"{X}.shape[0]") + _column_checks(ctx, X) + [
        f"{x1} = {X}.reshape({X}.size)",
        f"{o1} = {out}.reshape({X}.size)",
    ]
    body = [f"b_ = {od}[s_]", f"e_ = {od}[s_ + 1]",
            "if e_ > b_:",
            f"    m_ = {x1}[b_]",
            "    for i_ in range(b_ + 1, e_):",
            f"        m_ = max(m_, {x1}[i_])",
            f"    t_ = {T}(0)",
            "    for i_ in range(b_, e_):",
            f"        {o1}[i_] = _m.exp({x1}[i_] - m_)",
            f"        t_ += {o1}[i_]",
            "    for i_ in range(b_, e_):",
            f"        {o1}[i_] = {o1}[i_] / t_"]
    return lines + ctx.device_loop("s_", n, body)


def _dev_softmax_grad(ctx):
    X, O, G, T = ctx.inp("X"), ctx.inp("Out"), ctx.inp("Out@GRAD"), ctx.T("X")
    lines: list = []
    oh, od = _dev_offsets(ctx, "X", lines)
    n, o1, g1, d1 = (ctx.tmp(h) for h in "nogd")
    out = ctx.out("X@GRAD", shape=f"{X}.shape")
    lines += _check_offsets(oh, n, f"{X}.shape[0]") + [
        f"if {O}.shape != {X}.shape or {G}.shape != {X}.shape:",
        f"    {_BAD}",
        f"{o1} = {O}.reshape({O}.size)",
        f"{g1} = {G}.reshape({G}.size)",
        f"{d1} = {out}.reshape({X}.size)",
    ]
    body = [f"b_ = {od}[s_]", f"e_ = {od}[s_ + 1]",
            f"t_ = {T}(0)",
            "for i_ in range(b_, e_):",
            f"    t_ += {o1}[i_] * {g1}[i_]",
            "for i_ in range(b_, e_):",
            f"    {d1}[i_] = {o1}[i_] * ({g1}[i_] - t_)"]
    return lines + ctx.device_loop("s_", n, body)


def _dev_expand_as(ctx):
    X, T, r = ctx.inp("X"), ctx.T("X"), ctx.rank("X")
    lines: list = []
    oh, od = _dev_offsets(ctx, "Y", lines)
    n, w, x2, o2 = (ctx.tmp(h) for h in "nwxo")
    out = ctx.out("Out")
    lines += [f"{n} = {oh}.shape[0] - 1",
              f"if {n} != {X}.shape[0]:",
              f"    {_BAD}",
              f"{w} = {ctx.prod(X, 1, r)}",
              f"{x2} = {X}.reshape(({n}, {w}))",
              f"{out} = _cu.empty({_shape_like(ctx, f'{oh}[{n}]', X, r)}, {T})",
              f"{o2} = {out}.reshape(({oh}[{n}], {w}))"]
    body = [f"v_ = {x2}[s_, k_]",
            f"for i_ in range({od}[s_], {od}[s_ + 1]):",
            f"    {o2}[i_, k_] = v_"]
    return lines + ctx.device_loop("t_", f"{n} * {w}", _SK + body, before=[f"w_ = {w}"])


def _dev_expand_as_grad(ctx):
    X, G, T, r = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X"), ctx.rank("X")
    lines: list = []
    oh, od = _dev_offsets(ctx, "Y", lines)
    n, w, g2, d2 = (ctx.tmp(h) for h in "nwgd")
    out = ctx.out("X@GRAD", shape=f"{X}.shape")
    lines += [f"{n} = {oh}.shape[0] - 1",
              f"if {n} != {X}.shape[0]:",
              f"    {_BAD}",
              f"{w} = {ctx.prod(X, 1, r)}",
              f"if {G}.shape[0] != {oh}[{n}] or {G}.size != {oh}[{n}] * {w}:",
              f"    {_BAD}",
              f"{g2} = {G}.reshape(({oh}[{n}], {w}))",
              f"{d2} = {out}.reshape(({n}, {w}))"]
    body = [f"acc_ = {T}(0)",
            f"for i_ in range({od}[s_], {od}[s_ + 1]):",
            f"    acc_ += {g2}[i_, k_]",
            f"{d2}[s_, k_] = acc_"]
    return lines + ctx.device_loop("t_", f"{n} * {w}", _SK + body, before=[f"w_ = {w}"])


def _dev_expand_setup(ctx, X, r, lines):
    """The device expand's host lines: the checks of ``_expand_setup`` on the host offsets;
    ``xs`` (X's offsets, or one row per sequence) and ``st`` (the first output row of each
    sequence's copies) on the host each run, their device copies made once per offsets (and
    row count). Returns (n, w, st host, xs device, st device, ref device)."""
    ref = ctx.lod("Y", ctx.attrs["ref_level"])
    xo = ctx.lod("X", optional=True)
    n, w, rh, xh, xs, st, xsd, std, rd = (ctx.tmp(h) for h in
                                          ("n", "w", "rh", "xh", "xs", "st", "xsd", "std", "rd"))
    lines += [
        f"{rh} = {ref}.host",
        f"{xh} = {xo}.host",
        f"{rd} = {ref}.dev",
        f"{n} = {rh}.shape[0] - 1",
        f"{w} = {ctx.prod(X, 1, r)}",
        f"if {xh}.shape[0] > 0:",
        f"    if {xh}.shape[0] != {rh}.shape[0] and {n} > 0:",
        f"        {_BAD}",
        f"    if {xh}[{xh}.shape[0] - 1] != {X}.shape[0]:",
        f"        {_BAD}",
        f"    {xs} = {xh}",
        "else:",
        f"    if {n} > 0 and {X}.shape[0] != {n}:",
        f"        {_BAD}",
        f"    {xs} = np.arange({X}.shape[0] + 1, dtype=np.int64)",
        f"{st} = np.zeros(max({n}, 0) + 1, np.int64)",
        f"if {n} > 0:",
        f"    {st}[1:] = np.cumsum(np.diff({rh}) * np.diff({xs}))",
        f"    {xsd}, {std} = {ref}.derived(('expand', {xo}, {X}.shape[0]), "
        f"lambda: ({xs}, {st}))",
    ]
    return n, w, st, xsd, std, rd


_EXPAND_LOOP = ["x0_ = xs_[s_]", "ln_ = xs_[s_ + 1] - x0_",
                "for j_ in range(rf_[s_ + 1] - rf_[s_]):",
                "    q_ = st_[s_] + j_ * ln_",
                "    for i_ in range(ln_):"]


def _dev_expand(ctx):
    X, T, r = ctx.inp("X"), ctx.T("X"), ctx.rank("X")
    lines: list = []
    n, w, st, xsd, std, rd = _dev_expand_setup(ctx, X, r, lines)
    x2, o2 = ctx.tmp("x"), ctx.tmp("o")
    out = ctx.out("Out")
    lines += [f"{x2} = {X}.reshape(({X}.shape[0], {w}))",
              f"if {n} < 1:",
              f"    {out} = _cu.copy({X})",
              "else:",
              f"    {out} = _cu.empty({_shape_like(ctx, f'{st}[{n}]', X, r)}, {T})",
              f"    {o2} = {out}.reshape(({st}[{n}], {w}))"]
    body = _SK + _EXPAND_LOOP + [f"        {o2}[q_ + i_, k_] = {x2}[x0_ + i_, k_]"]
    before = [f"w_ = {w}", f"xs_ = {xsd}", f"st_ = {std}", f"rf_ = {rd}"]
    lines += ["    " + line for line in ctx.device_loop("t_", f"{n} * {w}", body, before)]
    return lines


def _dev_expand_grad(ctx):
    X, G, T, r = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X"), ctx.rank("X")
    lines: list = []
    n, w, st, xsd, std, rd = _dev_expand_setup(ctx, X, r, lines)
    g2, d2 = ctx.tmp("g"), ctx.tmp("d")
    out = ctx.out("X@GRAD")
    lines += [f"if {n} < 1:",
              f"    if {G}.shape != {X}.shape:",
              f"        {_BAD}",
              f"    {out} = _cu.copy({G})",
              "else:",
              f"    if {G}.shape[0] != {st}[{n}] or {G}.size != {st}[{n}] * {w}:",
              f"        {_BAD}",
              f"    {g2} = {G}.reshape(({st}[{n}], {w}))",
              f"    {out} = _cu.zeros({X}.shape, {T})",
              f"    {d2} = {out}.reshape(({X}.shape[0], {w}))"]
    # each (sequence of X, feature) one thread: the rows it adds to are its own
    body = _SK + _EXPAND_LOOP + [f"        {d2}[x0_ + i_, k_] += {g2}[q_ + i_, k_]"]
    before = [f"w_ = {w}", f"xs_ = {xsd}", f"st_ = {std}", f"rf_ = {rd}"]
    lines += ["    " + line for line in ctx.device_loop("t_", f"{n} * {w}", body, before)]
    return lines


@lowering("sequence_pool")
def _pool(ctx):
    spec = pool_spec(ctx)
    return None if spec is None else _dev_pool(ctx, *spec)


@lowering("sequence_pool_grad")
def _pool_grad(ctx):
    return _dev_pool_grad(ctx) if pool_grad_ok(ctx) else None


@lowering("sequence_softmax")
def _softmax(ctx):
    if ctx.dtype("X").kind != "f" or ctx.rank("X") not in (1, 2):
        return None
    return _dev_softmax(ctx)


@lowering("sequence_softmax_grad")
def _softmax_grad(ctx):
    if ctx.dtype("X").kind != "f" or ctx.rank("X") not in (1, 2) or \
            ctx.dtype("Out") != ctx.dtype("X") or ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    return _dev_softmax_grad(ctx)


def _grad_ok(ctx) -> bool:
    return ctx.rank("X") >= 1 and ctx.dtype("X").kind == "f" and \
        ctx.dtype("Out@GRAD") == ctx.dtype("X")


@lowering("sequence_expand_as")
def _expand_as(ctx):
    return _dev_expand_as(ctx) if ctx.rank("X") >= 1 else None


@lowering("sequence_expand_as_grad")
def _expand_as_grad(ctx):
    return _dev_expand_as_grad(ctx) if _grad_ok(ctx) else None


@lowering("sequence_expand")
def _expand(ctx):
    return _dev_expand(ctx) if ctx.rank("X") >= 1 else None


@lowering("sequence_expand_grad")
def _expand_grad(ctx):
    return _dev_expand_grad(ctx) if _grad_ok(ctx) else None
