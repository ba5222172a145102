"""The sequence ops' own lowerings (their generic rule; a target may register its own:
``codegen/<target>/lowerings/sequence.py``): loops over LoD offsets inside the segment's
function.

Each lowering asks for the offsets it needs with ``ctx.lod(slot, level)`` (an ``int64`` array
bound at run time from the input's LoD) and loops over sequences, one iteration per sequence,
on threads when the data is large (iterations write disjoint rows). The semantics are those of
the references in ``pdjit.ops.sequence`` (Fluid's): empty sequences give ``pad_value`` rows in
``sequence_pool`` and nothing elsewhere. Every shape the references check is checked here too;
a mismatch raises ``ValueError`` and the step re-runs the references, which give the precise
error. A lowering returns ``None`` (run the reference) for dtypes or attributes it does not
cover. The generated source holds no variable name and no size.
"""
from __future__ import annotations

from pdjit.framework.registry import EMPTY_VAR_NAME

POOLTYPES = ("AVERAGE", "SUM", "SQRT", "MAX", "LAST", "FIRST")
_BAD = "raise ValueError('pdjit: the LoD does not fit the data')"


def _shape_like(ctx, rows: str, local: str, rank: int) -> str:
    """Source of the shape ``(rows,) + local.shape[1:]``."""
    return ctx.tuple_src([rows] + [f"{local}.shape[{d}]" for d in range(1, rank)])


def _seq_header(ctx, offs: str, s: str, b: str, e: str) -> list:
    return [f"{b} = {offs}[{s}]", f"{e} = {offs}[{s} + 1]"]


def _check_offsets(offs: str, n: str, rows: str) -> list:
    """``n`` = the number of sequences; the offsets must end at ``rows``."""
    return [f"{n} = {offs}.shape[0] - 1",
            f"if {n} < 0 or {offs}[{n}] != {rows}:",
            f"    {_BAD}"]


# ---- sequence_pool ---------------------------------------------------------------------------
def pool_spec(ctx):
    """``(index, pad)`` of a lowerable ``sequence_pool`` (else ``None``): whether MaxIndex is
    computed (-1, and for MAX the rows of the maxima: only when something reads it) and the
    empty sequences' value as a literal."""
    pooltype = ctx.attrs["pooltype"]
    if pooltype not in POOLTYPES or ctx.dtype("X").kind != "f" or ctx.rank("X") < 1:
        return None
    pad = repr(float(ctx.attrs["pad_value"]))
    index = ctx.has_output("MaxIndex") and (pooltype == "MAX" or ctx.used("MaxIndex"))
    return index, pad


def pool(ctx):
    """Out[s] = AVERAGE/SUM/SQRT/MAX/LAST/FIRST of the rows of sequence s (pad_value if empty);
    MaxIndex[s] = the first row of each maximum for MAX, -1 otherwise."""
    spec = pool_spec(ctx)
    if spec is None:
        return None
    index, pad = spec
    pooltype = ctx.attrs["pooltype"]
    r = ctx.rank("X")
    X, offs, T = ctx.inp("X"), ctx.lod("X"), ctx.T("X")
    n, w, x2, o2, m2, s, b, e, k, i = (ctx.tmp(h) for h in "nwxomsbeki")
    lines = _check_offsets(offs, n, f"{X}.shape[0]") + [
        f"{w} = {ctx.prod(X, 1, r)}",
        f"{x2} = {X}.reshape(({X}.shape[0], {w}))",
        f"{o2} = np.empty(({n}, {w}), {T})",
    ] + ([f"{m2} = np.full(({n}, {w}), -1, np.int32)"] if index else [])
    body = _seq_header(ctx, offs, s, b, e) + [
        f"if {e} == {b}:",
        f"    for {k} in range({w}):",
        f"        {o2}[{s}, {k}] = {T}({pad})",
        "    continue",
    ]
    # 1-D row views: the inner loops over features vectorise (2-D indexing measured ~2x
    # slower on the accumulation)
    acc, row, mrow = ctx.tmp("acc"), ctx.tmp("row"), ctx.tmp("mrow")
    if pooltype in ("AVERAGE", "SUM", "SQRT"):
        body += [f"{acc} = {o2}[{s}]",
                 f"{row} = {x2}[{b}]",
                 f"for {k} in range({w}):",
                 f"    {acc}[{k}] = {row}[{k}]",
                 f"for {i} in range({b} + 1, {e}):",
                 f"    {row} = {x2}[{i}]",
                 f"    for {k} in range({w}):",
                 f"        {acc}[{k}] += {row}[{k}]"]
        if pooltype != "SUM":  # divide in float64, round once: as the reference does
            div = f"({e} - {b})" if pooltype == "AVERAGE" else f"math.sqrt({e} - {b})"
            body += [f"for {k} in range({w}):",
                     f"    {acc}[{k}] = {T}({acc}[{k}] / {div})"]
    elif pooltype == "MAX":
        body += [f"{acc} = {o2}[{s}]",
                 f"{mrow} = {m2}[{s}]",
                 f"{row} = {x2}[{b}]",
                 f"for {k} in range({w}):",
                 f"    {acc}[{k}] = {row}[{k}]",
                 f"    {mrow}[{k}] = {b}",
                 f"for {i} in range({b} + 1, {e}):",
                 f"    {row} = {x2}[{i}]",
                 f"    for {k} in range({w}):",
                 f"        if {row}[{k}] > {acc}[{k}]:",
                 f"            {acc}[{k}] = {row}[{k}]",
                 f"            {mrow}[{k}] = {i}"]
    else:
        last = f"{e} - 1" if pooltype == "LAST" else b
        body += [f"for {k} in range({w}):",
                 f"    {o2}[{s}, {k}] = {x2}[{last}, {k}]"]
    lines += ctx.loop(s, n, body, size=f"{x2}.size")
    lines.append(f"{ctx.out('Out')} = {o2}.reshape({_shape_like(ctx, n, X, r)})")
    if index:
        lines.append(f"{ctx.out('MaxIndex')} = {m2}.reshape({_shape_like(ctx, n, X, r)})")
    return lines


def pool_grad_ok(ctx) -> bool:
    """Whether a ``sequence_pool_grad`` is lowerable (float data of one dtype, a known pool
    type, MaxIndex given for MAX)."""
    pooltype = ctx.attrs["pooltype"]
    if pooltype not in POOLTYPES or ctx.dtype("X").kind != "f" or ctx.rank("X") < 1 or \
            ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return False
    return not (pooltype == "MAX" and not ctx.has_input("MaxIndex"))


def pool_grad(ctx):
    """X@GRAD: Out@GRAD spread over each sequence's rows (scaled for AVERAGE and SQRT), or put
    on the row MaxIndex / the last / the first row names; zeros elsewhere."""
    if not pool_grad_ok(ctx):
        return None
    pooltype = ctx.attrs["pooltype"]
    r = ctx.rank("X")
    X, G, offs, T = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.lod("X"), ctx.T("X")
    n, w, g2, d2, s, b, e, k, i, c, j = (ctx.tmp(h) for h in "nwgdsbekicj")
    out = ctx.out("X@GRAD", shape=f"{X}.shape", zero=True)
    lines = _check_offsets(offs, n, f"{X}.shape[0]") + [
        f"{w} = {ctx.prod(X, 1, r)}",
        f"if {G}.shape[0] != {n} or {G}.size != {n} * {w}:",
        f"    {_BAD}",
        f"{g2} = {G}.reshape(({n}, {w}))",
        f"{d2} = {out}.reshape(({X}.shape[0], {w}))",
    ]
    body = _seq_header(ctx, offs, s, b, e) + [f"if {e} == {b}:", "    continue"]
    size = f"{d2}.size"
    if pooltype in ("AVERAGE", "SUM", "SQRT"):
        scale = {"SUM": "1.0", "AVERAGE": f"1.0 / ({e} - {b})",
                 "SQRT": f"1.0 / math.sqrt({e} - {b})"}[pooltype]
        grow, drow = ctx.tmp("grow"), ctx.tmp("drow")
        body += [f"{c} = {scale}",
                 f"{grow} = {g2}[{s}]",
                 f"for {i} in range({b}, {e}):",
                 f"    {drow} = {d2}[{i}]",
                 f"    for {k} in range({w}):",
                 f"        {drow}[{k}] = {T}({grow}[{k}] * {c})"]
    elif pooltype == "MAX":
        M = ctx.inp("MaxIndex")
        lines += [f"if {M}.size != {n} * {w}:", f"    {_BAD}"]
        m2 = ctx.tmp("mi")
        lines.append(f"{m2} = {M}.reshape(({n}, {w}))")
        body += [f"for {k} in range({w}):",
                 f"    {j} = {m2}[{s}, {k}]",
                 f"    if {j} >= 0:",
                 f"        if {j} >= {X}.shape[0]:",
                 f"            {_BAD}",
                 f"        {d2}[{j}, {k}] += {g2}[{s}, {k}]"]
        size = None  # MaxIndex may name any row: no threads
    else:
        row = f"{e} - 1" if pooltype == "LAST" else b
        body += [f"for {k} in range({w}):",
                 f"    {d2}[{row}, {k}] = {g2}[{s}, {k}]"]
    return lines + ctx.loop(s, n, body, size=size)


# ---- sequence_softmax ------------------------------------------------------------------------
def _column_checks(ctx, X: str) -> list:
    if ctx.rank("X") == 2:
        return [f"if {X}.shape[1] != 1:", f"    {_BAD}"]
    return []


def softmax(ctx):
    """Out = softmax of X's values within each sequence (X is [N] or [N, 1])."""
    if ctx.dtype("X").kind != "f" or ctx.rank("X") not in (1, 2):
        return None
    X, offs, T = ctx.inp("X"), ctx.lod("X"), ctx.T("X")
    n, x1, o1, s, b, e, i, m, t = (ctx.tmp(h) for h in "nxosbeimt")
    out = ctx.out("Out", shape=f"{X}.shape")
    lines = _check_offsets(offs, n, f"{X}.shape[0]") + _column_checks(ctx, X) + [
        f"{x1} = {X}.reshape({X}.size)",
        f"{o1} = {out}.reshape({X}.size)",
    ]
    body = _seq_header(ctx, offs, s, b, e) + [
        f"if {e} == {b}:",
        "    continue",
        f"{m} = {x1}[{b}]",
        f"for {i} in range({b} + 1, {e}):",
        f"    {m} = max({m}, {x1}[{i}])",
        f"{t} = {T}(0)",
        f"for {i} in range({b}, {e}):",
        f"    {o1}[{i}] = _m.exp({x1}[{i}] - {m})",
        f"    {t} += {o1}[{i}]",
        f"for {i} in range({b}, {e}):",
        f"    {o1}[{i}] = {o1}[{i}] / {t}",
    ]
    return lines + ctx.loop(s, n, body, size=f"{x1}.size")


def softmax_grad(ctx):
    """X@GRAD = Out * (Out@GRAD - sum over the sequence of Out * Out@GRAD)."""
    if ctx.dtype("X").kind != "f" or ctx.rank("X") not in (1, 2) or \
            ctx.dtype("Out") != ctx.dtype("X") or ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    X, O, G = ctx.inp("X"), ctx.inp("Out"), ctx.inp("Out@GRAD")
    offs, T = ctx.lod("X"), ctx.T("X")
    n, o1, g1, d1, s, b, e, i, t = (ctx.tmp(h) for h in "nogdsbeit")
    out = ctx.out("X@GRAD", shape=f"{X}.shape")
    lines = _check_offsets(offs, n, f"{X}.shape[0]") + [
        f"if {O}.shape != {X}.shape or {G}.shape != {X}.shape:",
        f"    {_BAD}",
        f"{o1} = {O}.reshape({O}.size)",
        f"{g1} = {G}.reshape({G}.size)",
        f"{d1} = {out}.reshape({X}.size)",
    ]
    body = _seq_header(ctx, offs, s, b, e) + [
        f"{t} = {T}(0)",
        f"for {i} in range({b}, {e}):",
        f"    {t} += {o1}[{i}] * {g1}[{i}]",
        f"for {i} in range({b}, {e}):",
        f"    {d1}[{i}] = {o1}[{i}] * ({g1}[{i}] - {t})",
    ]
    return lines + ctx.loop(s, n, body, size=f"{o1}.size")


# ---- sequence_expand_as ----------------------------------------------------------------------
def expand_as(ctx):
    """Out = row i of X repeated for each row of sequence i of Y (last level)."""
    r = ctx.rank("X")
    if r < 1:
        return None
    X, offs, T = ctx.inp("X"), ctx.lod("Y"), ctx.T("X")
    n, w, x2, o2, s, b, e, i, k = (ctx.tmp(h) for h in "nwxosbeik")
    out = ctx.out("Out")
    lines = [f"{n} = {offs}.shape[0] - 1",
             f"if {n} != {X}.shape[0]:",
             f"    {_BAD}",
             f"{w} = {ctx.prod(X, 1, r)}",
             f"{x2} = {X}.reshape(({n}, {w}))",
             f"{out} = np.empty({_shape_like(ctx, f'{offs}[{n}]', X, r)}, {T})",
             f"{o2} = {out}.reshape(({offs}[{n}], {w}))"]
    body = _seq_header(ctx, offs, s, b, e) + [
        f"for {i} in range({b}, {e}):",
        f"    for {k} in range({w}):",
        f"        {o2}[{i}, {k}] = {x2}[{s}, {k}]",
    ]
    return lines + ctx.loop(s, n, body, size=f"{o2}.size")


def expand_as_grad(ctx):
    """X@GRAD[i] = the sum of Out@GRAD's rows of sequence i of Y (0 when empty)."""
    r = ctx.rank("X")
    if r < 1 or ctx.dtype("X").kind != "f" or ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    X, G, offs = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.lod("Y")
    n, w, g2, d2, s, b, e, i, k = (ctx.tmp(h) for h in "nwgdsbeik")
    out = ctx.out("X@GRAD", shape=f"{X}.shape", zero=True)
    lines = [f"{n} = {offs}.shape[0] - 1",
             f"if {n} != {X}.shape[0]:",
             f"    {_BAD}",
             f"{w} = {ctx.prod(X, 1, r)}",
             f"if {G}.shape[0] != {offs}[{n}] or {G}.size != {offs}[{n}] * {w}:",
             f"    {_BAD}",
             f"{g2} = {G}.reshape(({offs}[{n}], {w}))",
             f"{d2} = {out}.reshape(({n}, {w}))"]
    body = _seq_header(ctx, offs, s, b, e) + [
        f"for {i} in range({b}, {e}):",
        f"    for {k} in range({w}):",
        f"        {d2}[{s}, {k}] += {g2}[{i}, {k}]",
    ]
    return lines + ctx.loop(s, n, body, size=f"{g2}.size")


# ---- sequence_expand -------------------------------------------------------------------------
def _expand_setup(ctx, X, r, ref, xo, n, xs, w, st):
    """Checks, the X offsets (given or one row per sequence) and the first output row of each
    sequence's copies (``st``); ``n`` = the number of sequences of the reference level."""
    return [
        f"{n} = {ref}.shape[0] - 1",
        f"{w} = {ctx.prod(X, 1, r)}",
        f"if {xo}.shape[0] > 0:",
        f"    if {xo}.shape[0] != {ref}.shape[0] and {n} > 0:",
        f"        {_BAD}",
        f"    if {xo}[{xo}.shape[0] - 1] != {X}.shape[0]:",
        f"        {_BAD}",
        f"    {xs} = {xo}.copy()",
        "else:",
        f"    if {n} > 0 and {X}.shape[0] != {n}:",
        f"        {_BAD}",
        f"    {xs} = np.arange({X}.shape[0] + 1)",
        f"{st} = np.zeros(max({n}, 0) + 1, np.int64)",
        f"for {w}_s in range({n}):",
        f"    {st}[{w}_s + 1] = {st}[{w}_s] + ({ref}[{w}_s + 1] - {ref}[{w}_s]) * "
        f"({xs}[{w}_s + 1] - {xs}[{w}_s])",
    ]


def expand(ctx):
    """Out = each sequence of X (each row without LoD) repeated as often as the matching
    sequence of Y's level ``ref_level`` is long; X as it is when that level is empty."""
    r = ctx.rank("X")
    if r < 1:
        return None
    X, T = ctx.inp("X"), ctx.T("X")
    ref, xo = ctx.lod("Y", ctx.attrs["ref_level"]), ctx.lod("X", optional=True)
    n, xs, w, st, x2, o2, s, j, i, k, q, ln = (ctx.tmp(h) for h in
                                                ("n", "xs", "w", "st", "x", "o", "s", "j", "i",
                                                 "k", "q", "ln"))
    out = ctx.out("Out")
    lines = _expand_setup(ctx, X, r, ref, xo, n, xs, w, st) + [
        f"{x2} = {X}.reshape(({X}.shape[0], {w}))",
        f"if {n} < 1:",
        f"    {out} = {X}.copy()",
        "else:",
        f"    {out} = np.empty({_shape_like(ctx, f'{st}[{n}]', X, r)}, {T})",
        f"    {o2} = {out}.reshape(({st}[{n}], {w}))",
    ]
    body = [f"{ln} = {xs}[{s} + 1] - {xs}[{s}]",
            f"for {j} in range({ref}[{s} + 1] - {ref}[{s}]):",
            f"    {q} = {st}[{s}] + {j} * {ln}",
            f"    for {i} in range({ln}):",
            f"        for {k} in range({w}):",
            f"            {o2}[{q} + {i}, {k}] = {x2}[{xs}[{s}] + {i}, {k}]"]
    lines += ["    " + line for line in ctx.loop(s, n, body, size=f"{o2}.size")]
    return lines


def expand_grad(ctx):
    """X@GRAD = for each sequence of X, the sum of the gradients of its copies."""
    r = ctx.rank("X")
    if r < 1 or ctx.dtype("X").kind != "f" or ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    X, G, T = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.T("X")
    ref, xo = ctx.lod("Y", ctx.attrs["ref_level"]), ctx.lod("X", optional=True)
    n, xs, w, st, g2, d2, s, j, i, k, q, ln = (ctx.tmp(h) for h in
                                                ("n", "xs", "w", "st", "g", "d", "s", "j", "i",
                                                 "k", "q", "ln"))
    out = ctx.out("X@GRAD")
    lines = _expand_setup(ctx, X, r, ref, xo, n, xs, w, st) + [
        f"if {n} < 1:",
        f"    if {G}.shape != {X}.shape:",
        f"        {_BAD}",
        f"    {out} = {G}.copy()",
        "else:",
        f"    if {G}.shape[0] != {st}[{n}] or {G}.size != {st}[{n}] * {w}:",
        f"        {_BAD}",
        f"    {g2} = {G}.reshape(({st}[{n}], {w}))",
        f"    {out} = np.zeros({X}.shape, {T})",
        f"    {d2} = {out}.reshape(({X}.shape[0], {w}))",
    ]
    body = [f"{ln} = {xs}[{s} + 1] - {xs}[{s}]",
            f"for {j} in range({ref}[{s} + 1] - {ref}[{s}]):",
            f"    {q} = {st}[{s}] + {j} * {ln}",
            f"    for {i} in range({ln}):",
            f"        for {k} in range({w}):",
            f"            {d2}[{xs}[{s}] + {i}, {k}] += {g2}[{q} + {i}, {k}]"]
    lines += ["    " + line for line in ctx.loop(s, n, body, size=f"{g2}.size")]
    return lines


# ---- sequence_reverse ------------------------------------------------------------------------
def _reverse(ctx, src_slot: str, out_slot: str):
    r = ctx.rank("X")
    if r < 1 or ctx.dtype(src_slot) != ctx.dtype("X"):
        return None
    X, S, offs = ctx.inp("X"), ctx.inp(src_slot), ctx.lod("X")
    n, w, x2, o2, s, b, e, i, k = (ctx.tmp(h) for h in "nwxosbeik")
    out = ctx.out(out_slot, shape=f"{X}.shape")
    lines = _check_offsets(offs, n, f"{X}.shape[0]") + [
        f"if {S}.shape != {X}.shape:",
        f"    {_BAD}",
        f"{w} = {ctx.prod(X, 1, r)}",
        f"{x2} = {S}.reshape(({X}.shape[0], {w}))",
        f"{o2} = {out}.reshape(({X}.shape[0], {w}))",
    ]
    body = _seq_header(ctx, offs, s, b, e) + [
        f"for {i} in range({b}, {e}):",
        f"    for {k} in range({w}):",
        f"        {o2}[{i}, {k}] = {x2}[{b} + {e} - 1 - {i}, {k}]",
    ]
    return lines + ctx.loop(s, n, body, size=f"{x2}.size")


def reverse(ctx):
    """Y = the rows of each sequence of X in reverse order."""
    return _reverse(ctx, "X", "Y")


def reverse_grad(ctx):
    """X@GRAD = Y@GRAD with each sequence's rows reversed back."""
    return _reverse(ctx, "Y@GRAD", "X@GRAD")


# ---- sequence_pad / sequence_pad_grad --------------------------------------------------------
def pad(ctx):
    """Out[s, :len_s] = sequence s, the rest PadValue (one value or one time step); Length[s]
    = len_s. padded_length -1 pads to the longest sequence."""
    r = ctx.rank("X")
    if r < 2 or ctx.dtype("PadValue") != ctx.dtype("X"):
        return None
    X, P, offs, T = ctx.inp("X"), ctx.inp("PadValue"), ctx.lod("X"), ctx.T("X")
    padded = int(ctx.attrs["padded_length"])
    n, w, x2, p1, o3, ln, s, b, e, t, k, top = (ctx.tmp(h) for h in (
        "n", "w", "x", "p", "o", "ln", "s", "b", "e", "t", "k", "top"))
    same_step = ""
    if ctx.rank("PadValue") == r - 1:  # a whole time step is allowed: its dims must match
        same_step = " and ".join(f"{P}.shape[{d - 1}] == {X}.shape[{d}]" for d in range(1, r))
    ok = f"{P}.size == 1" + (f" or ({same_step})" if same_step else "")
    lines = _check_offsets(offs, n, f"{X}.shape[0]") + [
        f"if not ({ok}):",
        f"    {_BAD}",
        f"{top} = 0",
        f"for {s} in range({n}):",
        f"    {top} = max({top}, {offs}[{s} + 1] - {offs}[{s}])",
        f"{t} = {top} if {padded} == -1 else {padded}",
        f"if {t} < {top}:",
        f"    {_BAD}",
        f"{w} = {ctx.prod(X, 1, r)}",
        f"{x2} = {X}.reshape(({X}.shape[0], {w}))",
        f"{p1} = {P}.reshape({P}.size)",
    ]
    out = ctx.out("Out")
    shape = ctx.tuple_src([n, t] + [f"{X}.shape[{d}]" for d in range(1, r)])
    lines += [
        f"{out} = np.empty({shape}, {T})",
        f"{o3} = {out}.reshape(({n}, {t}, {w}))",
        f"{ln} = np.empty({n}, np.int64)",
    ]
    j, q = ctx.tmp("j"), ctx.tmp("q")
    body = _seq_header(ctx, offs, s, b, e) + [
        f"{ln}[{s}] = {e} - {b}",
        f"for {j} in range({t}):",
        f"    if {j} < {e} - {b}:",
        f"        for {k} in range({w}):",
        f"            {o3}[{s}, {j}, {k}] = {x2}[{b} + {j}, {k}]",
        "    else:",
        f"        for {k} in range({w}):",
        f"            {q} = 0 if {p1}.size == 1 else {k}",
        f"            {o3}[{s}, {j}, {k}] = {p1}[{q}]",
    ]
    lines += ctx.loop(s, n, body, size=f"{o3}.size")
    if ctx.has_output("Length"):
        lines.append(f"{ctx.out('Length')} = {ln}")
    return lines


def pad_grad(ctx):
    """X@GRAD[row] = Out@GRAD[s, row - start of s] for each row of sequence s."""
    r = ctx.rank("X")
    if r < 2 or ctx.rank("Out@GRAD") != r + 1:
        return None
    X, G, offs, T = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.lod("X"), ctx.T("X")
    n, w, g3, d2, s, b, e, j, k = (ctx.tmp(h) for h in "nwgdsbejk")
    out = ctx.out("X@GRAD", shape=f"{X}.shape")
    same = " or ".join(f"{G}.shape[{d + 1}] != {X}.shape[{d}]" for d in range(1, r))
    lines = _check_offsets(offs, n, f"{X}.shape[0]") + [
        f"if {G}.shape[0] != {n} or {same}:",
        f"    {_BAD}",
        f"{w} = {ctx.prod(X, 1, r)}",
        f"{g3} = {G}.reshape(({n}, {G}.shape[1], {w}))",
        f"{d2} = {out}.reshape(({X}.shape[0], {w}))",
    ]
    body = _seq_header(ctx, offs, s, b, e) + [
        f"if {e} - {b} > {G}.shape[1]:",
        f"    {_BAD}",
        f"for {j} in range({e} - {b}):",
        f"    for {k} in range({w}):",
        f"        {d2}[{b} + {j}, {k}] = {T}({g3}[{s}, {j}, {k}])",
    ]
    return lines + ctx.loop(s, n, body, size=f"{d2}.size")


# ---- sequence_concat / sequence_concat_grad ----------------------------------------------------
def _concat_setup(ctx, count: int, n: str, st: str, rows) -> list:
    """Each input's offsets, the same number of sequences in each, ending at its rows; ``st``:
    the first output row of each sequence."""
    offs = [ctx.lod("X", i=i) for i in range(count)]
    lines = [f"{n} = {offs[0]}.shape[0] - 1"]
    for o, rws in zip(offs, rows):
        lines += [f"if {o}.shape[0] != {n} + 1 or {o}[{n}] != {rws}:", f"    {_BAD}"]
    total = " + ".join(f"({o}[{st}_i + 1] - {o}[{st}_i])" for o in offs)
    lines += [f"{st} = np.zeros({n} + 1, np.int64)",
              f"for {st}_i in range({n}):",
              f"    {st}[{st}_i + 1] = {st}[{st}_i] + {total}"]
    return lines, offs


def concat(ctx):
    """Sequence s of Out = sequence s of X[0], then of X[1], ..."""
    count = len(ctx.op.input("X"))
    r = ctx.rank("X")
    if count < 1 or r < 1 or any(ctx.rank("X", i) != r or ctx.dtype("X", i) != ctx.dtype("X")
                                 for i in range(count)):
        return None
    xs = [ctx.inp("X", i) for i in range(count)]
    T = ctx.T("X")
    n, st, w, o2, s, q, j, k = (ctx.tmp(h) for h in ("n", "st", "w", "o", "s", "q", "j", "k"))
    lines, offs = _concat_setup(ctx, count, n, st, [f"{x}.shape[0]" for x in xs])
    for x in xs[1:]:
        for d in range(1, r):
            lines += [f"if {x}.shape[{d}] != {xs[0]}.shape[{d}]:", f"    {_BAD}"]
    lines += [f"{w} = {ctx.prod(xs[0], 1, r)}"]
    views = [ctx.tmp("x") for _ in xs]
    lines += [f"{v} = {x}.reshape(({x}.shape[0], {w}))" for v, x in zip(views, xs)]
    out = ctx.out("Out")
    lines += [f"{out} = np.empty({_shape_like(ctx, f'{st}[{n}]', xs[0], r)}, {T})",
              f"{o2} = {out}.reshape(({st}[{n}], {w}))"]
    body = [f"{q} = {st}[{s}]"]
    for v, o in zip(views, offs):
        body += [f"for {j} in range({o}[{s}], {o}[{s} + 1]):",
                 f"    for {k} in range({w}):",
                 f"        {o2}[{q}, {k}] = {v}[{j}, {k}]",
                 f"    {q} += 1"]
    return lines + ctx.loop(s, n, body, size=f"{o2}.size")


def concat_grad(ctx):
    """X@GRAD[i] = the rows of Out@GRAD that came from X[i]."""
    count = len(ctx.op.input("X"))
    r = ctx.rank("X")
    if count < 1 or r < 1 or len(ctx.op.output("X@GRAD")) != count or \
            any(ctx.rank("X", i) != r for i in range(count)):
        return None
    xs = [ctx.inp("X", i) for i in range(count)]
    G = ctx.inp("Out@GRAD")
    n, st, w, g2, s, q, j, k = (ctx.tmp(h) for h in ("n", "st", "w", "g", "s", "q", "j", "k"))
    lines, offs = _concat_setup(ctx, count, n, st, [f"{x}.shape[0]" for x in xs])
    lines += [f"{w} = {ctx.prod(G, 1, ctx.rank('Out@GRAD'))}",
              f"if {G}.shape[0] != {st}[{n}]:",
              f"    {_BAD}",
              f"{g2} = {G}.reshape(({G}.shape[0], {w}))"]
    views = []
    for i, x in enumerate(xs):
        if ctx.op.output("X@GRAD")[i] == EMPTY_VAR_NAME:
            views.append(None)
            continue
        d, v = ctx.out("X@GRAD", i, shape=f"{x}.shape"), ctx.tmp("d")
        lines += [f"if {x}.size != {x}.shape[0] * {w}:", f"    {_BAD}",
                  f"{v} = {d}.reshape(({x}.shape[0], {w}))"]
        views.append(v)
    body = [f"{q} = {st}[{s}]"]
    for v, o in zip(views, offs):
        body += [f"for {j} in range({o}[{s}], {o}[{s} + 1]):"]
        if v is not None:
            body += [f"    for {k} in range({w}):",
                     f"        {v}[{j}, {k}] = {g2}[{q}, {k}]"]
        body += [f"    {q} += 1"]
    return lines + ctx.loop(s, n, body, size=f"{g2}.size")


# ---- lod_reset -------------------------------------------------------------------------------
def lod_reset(ctx):
    """Out = a copy of X (the new LoD is the op's ``out_lod``). Declined when Y has no LoD: then
    the LoD comes from Y's values, which only the reference reads."""
    if ctx.has_input("Y") and \
            ctx.op.block._find_var_recursive(ctx.op.input("Y")[0]).lod_level == 0:
        return None
    return [f"{ctx.out('Out')} = {ctx.inp('X')}.copy()"]


def lod_reset_grad(ctx):
    """X@GRAD = a copy of Out@GRAD in X's dtype."""
    G = ctx.inp("Out@GRAD")
    return [f"if {G}.shape != {ctx.inp('X')}.shape:", f"    {_BAD}",
            f"{ctx.out('X@GRAD')} = {G}.astype({ctx.T('X')})"]


# ---- lstm / gru / sequence_conv: host lines calling the kernels of cpu.lib.lod_rnn -----------
_ACT_CODES = {"identity": 0, "": 0, "sigmoid": 1, "tanh": 2, "relu": 3}  # cpu.lib.lod_rnn's codes


