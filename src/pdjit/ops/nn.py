"""Neural-network ops: softmax, the cross entropies, accuracy, dropout, embedding lookup.

Numerics follow PaddlePaddle 3.3.1's CPU kernels (measured against PaddlePaddle itself):

- ``softmax`` (and the softmax inside ``softmax_with_cross_entropy``) subtracts the row max and
  then clips the shifted logits at -64 before ``exp``, as Paddle's CPU kernel does. So no
  probability is below ``exp(-64) / n`` (about 1.6e-28) and a hard-label loss is at most about
  ``64 + log(n)``; ``[1000, 0, -1000]`` gives a loss of 64 for class 1, as in Paddle.
  ``numeric_stable_mode`` does not change the CPU result (Paddle's CPU kernel ignores it too).
- ``cross_entropy``/``cross_entropy2`` take probabilities: ``log(0) = -inf`` is replaced by
  ``-1e20`` (Paddle's ``TolerableValue``), so a zero probability on the true class gives a loss
  of ``1e20`` and a soft label of 0 on a zero probability contributes 0, never NaN.
- Hard labels equal to ``ignore_index`` give a loss of 0; soft labels ignore ``ignore_index``.
  Any other label outside ``[0, classes)`` is an ``IndexError`` naming the value and the range.
- ``accuracy`` gives 0-d outputs: Accuracy float32, Correct and Total int32.
- ``dropout`` keeps an element when its uniform draw ``u >= dropout_prob``; with
  ``downgrade_in_infer`` training leaves kept values as they are and test mode multiplies by
  ``1 - p``; with ``upscale_in_train`` training divides kept values by ``1 - p`` (zeros when
  ``p == 1``) and test mode is the identity. In test mode Mask is all ones (Paddle leaves it
  unset). In compiled plans dropout draws the same stream as the reference (each target's
  lowering: ``codegen/<target>/lowerings/nn.py``), its key passed in per run; in test mode
  where Out = X and only later ops of the segment read Out (Mask unread), Out is X itself, no
  copy.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import random as prandom
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    RANDOM,
    Bool,
    Float,
    Int,
    Long,
    Opaque,
    Passthrough,
    Rewrite,
    RowSoftmax,
    RowWise,
    Str,
    default_grad,
    register_op,
)
from pdjit.ops._common import FLOATS, INDEX, check_dtype, norm_axis

_TOLERABLE = 1e20  # Paddle's kApproInf: what log(0) = -inf becomes in the cross entropies
_CLIP = -64.0  # Paddle's CPU softmax clips (x - max) at this value before exp
_IGNORE = {"ignore_index": Int(-100, low=-100, high=3)}


def _dims_agree(a: int, b: int) -> bool:
    return a == b or a < 0 or b < 0


def _shape_agrees(got, want) -> bool:
    return len(got) == len(want) and all(_dims_agree(a, b) for a, b in zip(got, want))


def check_ids(ids: np.ndarray, n: int, what: str, ignore: int | None = None) -> None:
    """IndexError naming the first id outside ``[0, n)`` (``ignore`` is allowed)."""
    bad = (ids < 0) | (ids >= n)
    if ignore is not None:
        bad &= ids != ignore
    if np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        extra = f" or ignore_index={ignore}" if ignore is not None else ""
        raise IndexError(f"{what} holds {int(ids[where])} at index {list(where)}: expected a "
                         f"value in [0, {n}){extra}")


def _tolerable_log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log(p)
    return np.clip(lg, -_TOLERABLE, _TOLERABLE).astype(p.dtype, copy=False)


def _log_softmax(x: np.ndarray, axis: int):
    """(softmax, log_softmax) along ``axis`` with Paddle's CPU clipping of shifted logits."""
    shifted = np.maximum(x - x.max(axis=axis, keepdims=True), np.asarray(_CLIP, x.dtype))
    e = np.exp(shifted)
    s = e.sum(axis=axis, keepdims=True)
    return (e / s).astype(x.dtype, copy=False), (shifted - np.log(s)).astype(x.dtype, copy=False)


# ---- softmax ----------------------------------------------------------------------------------
def _softmax_infer(X, *, axis):
    check_dtype(X, FLOATS, "input X")
    norm_axis(axis, X.ndim)
    return {"Out": X}


def _softmax_ref(X, *, axis):
    if X.ndim == 0:
        return {"Out": np.ones_like(X)}
    return {"Out": _log_softmax(X, norm_axis(axis, X.ndim))[0]}


def _partial4(ctx, acc: str, init: str, combine: str, at, n: str, j: str) -> list:
    """Source of ``acc = combine(...combine(init, at(0))..., at(n - 1))`` with four partial
    results (independent chains run faster than one); ``combine`` formats ``{a}``, ``{b}``,
    ``at(k)`` gives the element at index source ``k``."""
    p = [ctx.tmp(acc + "p") for _ in range(4)]
    c = lambda a, b: combine.format(a=a, b=b)  # noqa: E731
    return [f"{p[0]} = {p[1]} = {p[2]} = {p[3]} = {init}",
            f"{j} = 0",
            f"while {j} + 4 <= {n}:"] + \
        [f"    {p[k]} = {c(p[k], at(f'{j} + {k}' if k else j))}" for k in range(4)] + \
        [f"    {j} += 4",
         f"while {j} < {n}:",
         f"    {p[0]} = {c(p[0], at(j))}",
         f"    {j} += 1",
         f"{acc} = {c(c(p[0], p[1]), c(p[2], p[3]))}"]


def _softmax_passes(ctx, src, dst, n: str, j: str, m: str, s: str, T: str) -> list:
    """Source of softmax over one row in separate passes: the max of the row read through
    ``src`` (index source -> element source), ``dst = exp(max(src - max, -64))`` (Paddle's CPU
    clip), the sum of ``dst``, ``dst / sum``; the element-wise passes vectorise, the reductions
    keep four partial results. The row's max and sum are left in ``m`` and ``s``."""
    return (_partial4(ctx, m, f"{T}(-math.inf)", "max({a}, {b})", src, n, ctx.tmp("k"))
            + [f"for {j} in range({n}):",
               f"    {dst(j)} = _m.exp(max({src(j)} - {m}, {T}({_CLIP})))"]
            + _partial4(ctx, s, f"{T}(0)", "{a} + {b}", dst, n, ctx.tmp("k"))
            + [f"for {j} in range({n}):", f"    {dst(j)} = {dst(j)} / {s}"])


def _pre_axis_post(ctx, local: str, rank: int, axis: int) -> str:
    """Source of the 3-D view ``(prod(dims before axis), dim axis, prod(dims after))``."""
    return f"{local}.reshape(({ctx.prod(local, 0, axis)}, {local}.shape[{axis}], " \
           f"{ctx.prod(local, axis + 1, rank)}))"


def _softmax_lower(ctx):
    """Softmax over the last axis row by row: the first pass over a row reads X (or computes
    it: a prologue, see ``ctx.row_input``) into Out and takes the max, then exp and sum, then
    the scaling, all while the row is in cache; rows on threads when large. Another axis: a
    target's own lowering (none: the reference)."""
    r = ctx.rank("X")
    if r == 0 or ctx.dtype("X").kind != "f":
        return None
    T = ctx.T("X")
    axis = ctx.attrs["axis"] % r
    if axis == r - 1:
        rows = ctx.row_input("X")
        if rows is None:
            return None
        out = ctx.out("Out", shape=rows.shape)
        o2, i, j, m, s, v = (ctx.tmp(h) for h in ("o", "i", "j", "m", "s", "v"))
        n = rows.cols
        at = lambda k: f"{o2}[{i}, {k}]"  # noqa: E731
        # separate passes over the row (in cache): the loads (and prologue), the max, exp in
        # place, the sum, the scaling; the element-wise ones vectorise, the reductions keep
        # four partial results
        body = rows.begin(i) + [f"for {j} in range({n}):"]
        body += ["    " + line for line in rows.load(i, j, v)] + [f"    {at(j)} = {v}"]
        body += _softmax_passes(ctx, at, at, n, j, m, s, T)
        return rows.setup + [f"{o2} = {out}.reshape(({rows.rows}, {n}))"] + \
            ctx.loop(i, rows.rows, body, size=f"{out}.size", work=SOFTMAX_WORK)
    return None


#: an element of softmax's rows costs about this many elementwise ops (five passes, an exp):
#: its rows split over threads from 64 K elements, where two threads took 38 us against 69-96
#: on one (512 rows of 128, a BERT-like encoder's attention at batch 1); 32 K took as long
SOFTMAX_WORK = 16


# softmax over the last axis reads X row by row: an elementwise chain computing X (a scale and
# an attention mask's add) may run inside its first pass (a prologue; pdjit.passes.fusion)
_softmax_lower.row_prologue = lambda attrs, rank: "X" if rank and \
    attrs["axis"] % rank == rank - 1 else None


register_op(
    "softmax", inputs=["X"], outputs=["Out"],
    attrs={"axis": Int(-1, low=-1, high=1, axis_of="X")},
    row_wise=RowWise(axes=("axis",)),
    traits=[OPAQUE], infer_shape=_softmax_infer, reference=_softmax_ref,
    emit=Opaque(_softmax_lower),
    form=lambda op: RowSoftmax("X", "Out", int(op.all_attrs().get("axis", -1))),
    grad=default_grad("softmax_grad", fwd_inputs=(), fwd_outputs=("Out",)),
    doc="Out = exp(X - max) / sum(exp(X - max)) along axis.")


# ---- cross_entropy / cross_entropy2 (X holds probabilities) --------------------------------------
def _hard_label_meta(X, Label, what):
    check_dtype(Label, INDEX, f"hard {what}")
    lead = X.shape[:-1]
    if not (_shape_agrees(Label.shape, lead + (1,)) or _shape_agrees(Label.shape, lead)):
        raise ShapeMismatch(f"hard labels must have shape {list(lead + (1,))} (or "
                            f"{list(lead)}) for X of shape {list(X.shape)}, got "
                            f"{list(Label.shape)}")


def _ce_infer(X, Label, *, soft_label, ignore_index):
    check_dtype(X, FLOATS, "input X")
    if X.ndim < 2:
        raise ShapeMismatch(f"X must have rank >= 2 (classes in the last dim), got shape "
                            f"{list(X.shape)}")
    if soft_label:
        if Label.dtype != X.dtype or not _shape_agrees(Label.shape, X.shape):
            raise ShapeMismatch(f"soft labels must match X: expected {X.dtype}"
                                f"{list(X.shape)}, got {Label.dtype}{list(Label.shape)}")
        return {"Y": X.with_(shape=X.shape[:-1] + (1,))}
    _hard_label_meta(X, Label, "Label")
    return {"Y": X.with_(shape=Label.shape)}


def _pick(X, Label, ignore_index):
    """X's entry at each row's label (0 where ignored), shaped like X.shape[:-1] + (1,)."""
    lab = Label.reshape(X.shape[:-1] + (1,)).astype(np.int64)
    check_ids(lab, X.shape[-1], "Label", ignore_index)
    ignored = lab == ignore_index
    picked = np.take_along_axis(X, np.where(ignored, 0, lab), axis=-1)
    return np.where(ignored, np.zeros((), X.dtype), picked).astype(X.dtype, copy=False), ignored


def _ce_ref(X, Label, *, soft_label, ignore_index):
    if soft_label:
        y = -(Label * _tolerable_log(X)).sum(axis=-1, keepdims=True)
        return {"Y": y.astype(X.dtype, copy=False)}
    picked, ignored = _pick(X, Label, ignore_index)
    y = np.where(ignored, np.zeros((), X.dtype), -_tolerable_log(picked))
    return {"Y": y.astype(X.dtype, copy=False).reshape(Label.shape)}


register_op(
    "cross_entropy", inputs=["X", "Label"], outputs=["Y"],
    attrs={"soft_label": Bool(False), **_IGNORE},
    traits=[OPAQUE], infer_shape=_ce_infer, reference=_ce_ref, emit=None,
    grad=default_grad("cross_entropy_grad", fwd_inputs=("X", "Label"), grad_outputs=("Y",)),
    doc="Y = -log(X[label]) (hard) or -sum(Label * log(X)) (soft); X holds probabilities.")


def _ce2_infer(X, Label, *, ignore_index):
    check_dtype(X, FLOATS, "input X")
    if X.ndim < 2:
        raise ShapeMismatch(f"X must have rank >= 2 (classes in the last dim), got shape "
                            f"{list(X.shape)}")
    check_dtype(Label, INDEX, "Label")
    want = X.shape[:-1] + (1,)
    if not _shape_agrees(Label.shape, want):
        raise ShapeMismatch(f"Label must have shape {list(want)} for X of shape "
                            f"{list(X.shape)}, got {list(Label.shape)}")
    # XShape carries X's shape for the backward pass and holds no data (last dim 0, as Paddle).
    return {"Y": X.with_(shape=want), "MatchX": X.with_(shape=want),
            "XShape": X.with_(shape=X.shape + (0,))}


def _ce2_ref(X, Label, *, ignore_index):
    picked, ignored = _pick(X, Label, ignore_index)
    y = np.where(ignored, np.zeros((), X.dtype), -_tolerable_log(picked)).astype(X.dtype)
    return {"Y": y, "MatchX": picked, "XShape": np.empty(X.shape + (0,), X.dtype)}


def _tolerable_neg_log(p: str, T: str) -> str:
    """Source of ``-log(p)`` as :func:`_tolerable_log` clips it: ``1e20`` for ``p == 0``."""
    return (f"{T}(-math.log({p})) if {p} > 0 else ({T}({_TOLERABLE}) if {p} == 0 "
            f"else {T}(math.nan))")


def _ce2_lower(ctx):
    """Row by row: MatchX = X[label], Y = -log(MatchX) (0 for ignored rows). A label out of
    range raises: the references then report it."""
    r = ctx.rank("X")
    if r < 2 or ctx.dtype("X").kind != "f":
        return None
    X, L, T = ctx.inp("X"), ctx.inp("Label"), ctx.T("X")
    lead = ctx.tuple_src([f"{X}.shape[{d}]" for d in range(r - 1)] + ["1"])
    y, mx = ctx.out("Y", shape=lead), ctx.out("MatchX", shape=lead)
    if ctx.has_output("XShape"):
        ctx.out("XShape", shape=ctx.tuple_src([f"{X}.shape[{d}]" for d in range(r)] + ["0"]))
    x2, lab, yf, mf, i, k, v = (ctx.tmp(h) for h in "xlymikv")
    ign = int(ctx.attrs["ignore_index"])
    return [
        f"{x2} = {ctx.as_rows(X, r)}",
        f"{lab} = {L}.reshape({L}.size)",
        f"_rt.check({lab}.size == {x2}.shape[0])",
        f"{yf} = {y}.reshape({y}.size)",
        f"{mf} = {mx}.reshape({mx}.size)",
        f"for {i} in range({x2}.shape[0]):",
        f"    {k} = {lab}[{i}]",
        f"    if {k} == {ign}:",
        f"        {yf}[{i}] = {T}(0)",
        f"        {mf}[{i}] = {T}(0)",
        "    else:",
        f"        _rt.check(0 <= {k} < {x2}.shape[1])",
        f"        {v} = {x2}[{i}, {k}]",
        f"        {mf}[{i}] = {v}",
        f"        {yf}[{i}] = {_tolerable_neg_log(v, T)}",
    ]


def _ce2_grad_lower(ctx):
    """X@GRAD: zeros, and -dY / MatchX at each row's label (0 on ignored rows)."""
    if not ctx.has_output("X@GRAD") or ctx.dtype("MatchX").kind != "f":
        return None
    xs = ctx.shape("XShape")
    r = len(xs) - 1
    if r < 2:
        return None
    XS, L, M, G = ctx.inp("XShape"), ctx.inp("Label"), ctx.inp("MatchX"), ctx.inp("Y@GRAD")
    dx = ctx.out("X@GRAD", shape=ctx.tuple_src([f"{XS}.shape[{d}]" for d in range(r)]),
                 zero=True)
    d2, lab, mf, gf, i, k = (ctx.tmp(h) for h in "dlmgik")
    ign = int(ctx.attrs["ignore_index"])
    return [
        f"{d2} = {ctx.as_rows(dx, r)}",
        f"{lab} = {L}.reshape({L}.size)",
        f"{mf} = {M}.reshape({M}.size)",
        f"{gf} = {G}.reshape({G}.size)",
        f"_rt.check({lab}.size == {d2}.shape[0] and {mf}.size == {d2}.shape[0] and "
        f"{gf}.size == {d2}.shape[0])",
        f"for {i} in range({d2}.shape[0]):",
        f"    {k} = {lab}[{i}]",
        f"    if {k} != {ign}:",
        f"        _rt.check(0 <= {k} < {d2}.shape[1])",
        f"        {d2}[{i}, {k}] = -{gf}[{i}] / {mf}[{i}]",
    ]


register_op(
    "cross_entropy2", inputs=["X", "Label"], outputs=["Y", "XShape~", "MatchX~"],
    attrs=dict(_IGNORE), traits=[OPAQUE], infer_shape=_ce2_infer, reference=_ce2_ref,
    emit=Opaque(_ce2_lower),
    grad=default_grad("cross_entropy_grad2", fwd_inputs=("Label",),
                      fwd_outputs=("XShape", "MatchX"), grad_outputs=("Y",)),
    doc="Hard-label cross entropy of probabilities: Y = -log(MatchX), MatchX = X[label].")


# ---- softmax_with_cross_entropy --------------------------------------------------------------
def _swce_infer(Logits, Label, *, soft_label, ignore_index, axis, **_):
    check_dtype(Logits, FLOATS, "input Logits")
    ax = norm_axis(axis, Logits.ndim)
    loss_shape = Logits.shape[:ax] + (1,) + Logits.shape[ax + 1:]
    if soft_label:
        if Label.dtype != Logits.dtype or not _shape_agrees(Label.shape, Logits.shape):
            raise ShapeMismatch(f"soft labels must match Logits: expected {Logits.dtype}"
                                f"{list(Logits.shape)}, got {Label.dtype}{list(Label.shape)}")
    else:
        check_dtype(Label, INDEX, "hard Label")
        if not _shape_agrees(Label.shape, loss_shape):
            raise ShapeMismatch(f"hard labels must have shape {list(loss_shape)} (Logits "
                                f"{list(Logits.shape)} with 1 at axis {axis}), got "
                                f"{list(Label.shape)}")
    return {"Softmax": Logits, "Loss": Logits.with_(shape=loss_shape)}


def _swce_ref(Logits, Label, *, soft_label, use_softmax, ignore_index, axis, **_):
    ax = norm_axis(axis, Logits.ndim)
    x = np.moveaxis(Logits, ax, -1)
    if use_softmax:
        sm, logp = _log_softmax(x, -1)
    else:  # Logits already hold probabilities
        sm, logp = x, _tolerable_log(x)
    if soft_label:
        loss = -(np.moveaxis(Label, ax, -1) * logp).sum(axis=-1, keepdims=True)
    else:
        lab = np.moveaxis(Label, ax, -1).astype(np.int64)
        check_ids(lab, x.shape[-1], "Label", ignore_index)
        ignored = lab == ignore_index
        picked = np.take_along_axis(logp, np.where(ignored, 0, lab), axis=-1)
        loss = np.where(ignored, np.zeros((), Logits.dtype), -picked)
    return {"Softmax": np.moveaxis(sm, -1, ax).astype(Logits.dtype, copy=True),
            "Loss": np.moveaxis(loss, -1, ax).astype(Logits.dtype, copy=False)}


def _swce_lowerable(ctx, x_slot) -> bool:
    """Hard labels over the last axis, with the softmax: the case training loops use."""
    r = ctx.rank(x_slot)
    return (r >= 1 and not ctx.attrs["soft_label"] and ctx.attrs["use_softmax"]
            and ctx.attrs["axis"] in (-1, r - 1) and ctx.dtype(x_slot).kind == "f")


def _swce_lower(ctx):
    """The labels checked first (a label out of range raises: the references then report
    it); then row by row, on threads when large, softmax in separate passes (the max over the
    Logits row, the clipped exp into Softmax, the sum, the scaling: see ``_softmax_passes``)
    and Loss = log(sum) - shifted[label] (0 on ignored rows)."""
    if not _swce_lowerable(ctx, "Logits"):
        return None
    X, L, T, r = ctx.inp("Logits"), ctx.inp("Label"), ctx.T("Logits"), ctx.rank("Logits")
    lead = [f"{X}.shape[{d}]" for d in range(r - 1)]
    sm = ctx.out("Softmax", shape=f"{X}.shape")
    loss = ctx.out("Loss", shape=ctx.tuple_src(lead + ["1"]))
    x2, s2, lab, lf, i, j, m, s, k, n, c = (ctx.tmp(h) for h in "xsblfijmknc")
    ign = int(ctx.attrs["ignore_index"])
    body = _softmax_passes(ctx, lambda c: f"{x2}[{i}, {c}]", lambda c: f"{s2}[{i}, {c}]",
                           n, j, m, s, T)
    body += [f"{k} = {lab}[{i}]",
             f"if {k} == {ign}:",
             f"    {lf}[{i}] = {T}(0)",
             "else:",
             f"    {lf}[{i}] = {T}(math.log({s})) - max({x2}[{i}, {k}] - {m}, {T}({_CLIP}))"]
    return [
        f"{x2} = {ctx.as_rows(X, r)}",
        f"{n} = {x2}.shape[1]",
        f"{lab} = {L}.reshape({L}.size)",
        f"_rt.check({lab}.size == {x2}.shape[0])",
        f"for {c} in range({lab}.size):",  # not the row loop's index: that one may be prange
        f"    _rt.check({lab}[{c}] == {ign} or 0 <= {lab}[{c}] < {n})",
        f"{s2} = {sm}.reshape({x2}.shape)",
        f"{lf} = {loss}.reshape({loss}.size)",
    ] + ctx.loop(i, f"{x2}.shape[0]", body, size=f"{x2}.size", work=SOFTMAX_WORK)


def _swce_grad_lower(ctx):
    """Logits@GRAD = (Softmax - onehot(Label)) * Loss@GRAD per row; 0 on ignored rows."""
    if not _swce_lowerable(ctx, "Softmax") or not ctx.has_output("Logits@GRAD"):
        return None
    sm, L, g, T = ctx.inp("Softmax"), ctx.inp("Label"), ctx.inp("Loss@GRAD"), ctx.T("Softmax")
    r = ctx.rank("Softmax")
    out = ctx.out("Logits@GRAD", shape=f"{sm}.shape")
    s2, o2, lab, gf, i, j, k = (ctx.tmp(h) for h in "sobgijk")
    ign = int(ctx.attrs["ignore_index"])
    return [
        f"{s2} = {ctx.as_rows(sm, r)}",
        f"{lab} = {L}.reshape({L}.size)",
        f"{gf} = {g}.reshape({g}.size)",
        f"_rt.check({lab}.size == {s2}.shape[0] and {gf}.size == {s2}.shape[0])",
        f"{o2} = {out}.reshape({s2}.shape)",
        f"for {i} in range({s2}.shape[0]):",
        f"    {k} = {lab}[{i}]",
        f"    if {k} == {ign}:",
        f"        for {j} in range({s2}.shape[1]):",
        f"            {o2}[{i}, {j}] = {T}(0)",
        "    else:",
        f"        _rt.check(0 <= {k} < {s2}.shape[1])",
        f"        for {j} in range({s2}.shape[1]):",
        f"            {o2}[{i}, {j}] = {s2}[{i}, {j}] * {gf}[{i}]",
        f"        {o2}[{i}, {k}] = ({s2}[{i}, {k}] - {T}(1)) * {gf}[{i}]",
    ]


register_op(
    "softmax_with_cross_entropy", inputs=["Logits", "Label"], outputs=["Softmax", "Loss"],
    attrs={"soft_label": Bool(False), "use_softmax": Bool(True),
           "numeric_stable_mode": Bool(True), **_IGNORE,
           "axis": Int(-1, low=-1, high=1, axis_of=("Logits", "Softmax"))},
    traits=[OPAQUE], infer_shape=_swce_infer, reference=_swce_ref,
    emit=Opaque(_swce_lower),
    grad=default_grad("softmax_with_cross_entropy_grad", fwd_inputs=("Label",),
                      fwd_outputs=("Softmax",), grad_outputs=("Loss",), wrt=("Logits",)),
    doc="Softmax = softmax(Logits, axis); Loss = cross entropy of Softmax against Label, "
        "computed as -log_softmax.")


# ---- accuracy ----------------------------------------------------------------------------------
def _acc_infer(Out, Indices, Label):
    check_dtype(Indices, INDEX, "Indices")
    check_dtype(Label, INDEX, "Label")
    if Indices.ndim != 2 or not _shape_agrees(Out.shape, Indices.shape):
        raise ShapeMismatch(f"Out and Indices must be [N, k] of one shape, got Out "
                            f"{list(Out.shape)} and Indices {list(Indices.shape)}")
    if Label.ndim != 2 or not _shape_agrees(Label.shape, (Indices.shape[0], 1)):
        raise ShapeMismatch(f"Label must have shape [{Indices.shape[0]}, 1] for Indices of "
                            f"shape {list(Indices.shape)}, got {list(Label.shape)}")
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    return {"Accuracy": Out.with_(shape=(), dtype=f32), "Correct": Out.with_(shape=(), dtype=i32),
            "Total": Out.with_(shape=(), dtype=i32)}


def _acc_ref(Out, Indices, Label):
    total = Indices.shape[0]
    correct = int(np.any(Indices == Label.reshape(-1, 1), axis=1).sum()) if total else 0
    acc = correct / total if total else 0.0
    return {"Accuracy": np.asarray(acc, np.float32), "Correct": np.asarray(correct, np.int32),
            "Total": np.asarray(total, np.int32)}


def _acc_lower(ctx):
    """Count the rows whose label is among their top-k indices."""
    I, L = ctx.inp("Indices"), ctx.inp("Label")
    # the lines allocate: the dtypes are the op's (float32, int32, int32), whatever a loaded
    # program declared for the variables
    acc, cor, tot = (ctx.out(s_) for s_ in ("Accuracy", "Correct", "Total"))
    lab, n, i, j, c = (ctx.tmp(h) for h in "lnijc")
    return [
        f"{acc} = np.empty((), np.float32)",
        f"{cor} = np.empty((), np.int32)",
        f"{tot} = np.empty((), np.int32)",
        f"{lab} = {L}.reshape({L}.size)",
        f"{n} = {I}.shape[0]",
        f"_rt.check({lab}.size == {n})",
        f"{c} = 0",
        f"for {i} in range({n}):",
        f"    for {j} in range({I}.shape[1]):",
        f"        if {I}[{i}, {j}] == {lab}[{i}]:",
        f"            {c} += 1",
        "            break",
        f"{cor}[()] = {c}",
        f"{tot}[()] = {n}",
        f"{acc}[()] = np.float32({c} / {n}) if {n} > 0 else np.float32(0)",
    ]


register_op(
    "accuracy", inputs=["Out", "Indices", "Label"],
    # (PaddlePaddle's layer declares Correct float32; its kernel, as this op, writes int32)
    outputs=["Accuracy", "Correct^", "Total^"],
    traits=[OPAQUE], infer_shape=_acc_infer, reference=_acc_ref, emit=Opaque(_acc_lower),
    grad=None,
    doc="Correct = rows whose Label is among the top-k Indices; Accuracy = Correct / Total.")


# ---- dropout -------------------------------------------------------------------------------------
_DROPOUT_IMPLS = ("downgrade_in_infer", "upscale_in_train")


def _dropout_infer(X, Seed=None, *, dropout_prob, dropout_implementation, **_):
    check_dtype(X, FLOATS, "input X")
    if not 0.0 <= dropout_prob <= 1.0:
        raise ShapeMismatch(f"dropout_prob must be in [0, 1], got {dropout_prob}")
    if dropout_implementation not in _DROPOUT_IMPLS:
        raise ShapeMismatch(f"dropout_implementation must be one of {list(_DROPOUT_IMPLS)}, got "
                            f"{dropout_implementation!r}")
    if Seed is not None and Seed.shape not in ((1,), (-1,), ()):
        raise ShapeMismatch(f"Seed must hold one value: expected shape [1], got "
                            f"{list(Seed.shape)}")
    return {"Out": X, "Mask": X.with_(dtype=np.dtype(np.uint8))}


def _dropout_key(Seed, seed, fix_seed, ctx) -> int:
    if Seed is not None and int(Seed.reshape(-1)[0]):
        return prandom.op_key(int(Seed.reshape(-1)[0]), 0, 0, 0, 0)  # the Seed input wins
    if ctx is not None:
        return ctx.rng_key()
    return prandom.op_key(seed if fix_seed else 0, 0, 0, 0, 0)


def _dropout_ref(X, Seed=None, *, dropout_prob, is_test, dropout_implementation, seed, fix_seed,
                 ctx=None):
    p = float(dropout_prob)
    upscale = dropout_implementation == "upscale_in_train"
    if is_test:
        out = X.copy() if upscale else X * np.asarray(1.0 - p, X.dtype)
        return {"Out": out.astype(X.dtype, copy=False), "Mask": np.ones(X.shape, np.uint8)}
    u = prandom.uniform01(_dropout_key(Seed, seed, fix_seed, ctx), X.size).reshape(X.shape)
    keep = u >= p
    if upscale:
        kept = X / np.asarray(1.0 - p, X.dtype) if p < 1.0 else np.zeros_like(X)
    else:
        kept = X
    out = np.where(keep, kept, np.zeros((), X.dtype))
    return {"Out": out.astype(X.dtype, copy=False), "Mask": keep.astype(np.uint8)}


_F32_F64 = (np.dtype(np.float32), np.dtype(np.float64))


def _flat(local: str) -> str:
    return f"{local}.reshape({local}.size)"


def dropout_lowerable(ctx) -> bool:
    """Float32/float64 data, an integer ``Seed`` if any: what the targets lower."""
    return ctx.dtype("X") in _F32_F64 and \
        not (ctx.has_input("Seed") and ctx.dtype("Seed").kind not in "iu")


def dropout_grad_start(ctx):
    """``(Out@GRAD, X@GRAD, upscale)`` of a lowerable ``dropout_grad`` (float32/float64, X@GRAD
    wanted; X@GRAD allocated by the driver), else ``None``."""
    G = ctx.inp("Out@GRAD")
    if ctx.dtype("Out@GRAD") not in _F32_F64 or not ctx.has_output("X@GRAD"):
        return None
    dx = ctx.out("X@GRAD", shape=f"{G}.shape")
    return G, dx, ctx.attrs["dropout_implementation"] == "upscale_in_train"


def dropout_alias(ctx) -> list | None:
    """In test mode with Out = X (upscale_in_train, or a zero probability) and Out read only
    by later ops of the segment, Mask unread: the line binding Out to X, no copy (0.32 ms for
    the 1 M elements of the transformer benchmark's FFN); else None."""
    X = ctx.inp("X")
    a = ctx.attrs
    name = ctx.op.output("Out")[0]
    if a["is_test"] and (a["dropout_implementation"] == "upscale_in_train"
                         or float(a["dropout_prob"]) == 0.0) \
            and name not in ctx.gen.needed_after \
            and not (ctx.has_output("Mask") and ctx.used("Mask")):
        # Out = X exactly, read only by later ops of this segment: X itself (the memory plan
        # sees the alias), never fetched or stored, so nobody can write through it
        return [f"{ctx.out('Out')} = {X}"]
    return None


def _dropout_inference(op):
    """In test mode: X itself (upscale_in_train) or X scaled by 1 - dropout_prob."""
    a = op.all_attrs()
    if not a.get("is_test", False):
        return None
    p = float(a.get("dropout_prob", 0.5))
    if a.get("dropout_implementation", "downgrade_in_infer") == "upscale_in_train" or p == 0.0:
        return Passthrough("X", "Out")
    return Rewrite("scale", {"X": op.input("X")}, {"Out": op.output("Out")},
                   {"scale": 1.0 - p, "bias": 0.0, "bias_after_scale": True})


register_op(
    "dropout", inputs=["X", "Seed?"], outputs=["Out", "Mask~"],
    attrs={"dropout_prob": Float(0.5, low=0.0, high=1.0, at_least=0.0, at_most=1.0),
           "is_test": Bool(False),
           "dropout_implementation": Str("downgrade_in_infer", choices=_DROPOUT_IMPLS,
                                         one_of=_DROPOUT_IMPLS),
           # runtime extra attrs in Paddle; declared so a fixed seed can be recorded
           "seed": Int(0, low=0, high=1000), "fix_seed": Bool(False)},
    traits=[OPAQUE, RANDOM], infer_shape=_dropout_infer, reference=_dropout_ref,
    emit=Opaque(),
    grad=default_grad("dropout_grad", fwd_inputs=(), fwd_outputs=("Mask",)),
    inference=_dropout_inference,
    doc="Out = X where a uniform draw >= dropout_prob else 0, scaled per "
        "dropout_implementation; Mask (uint8) records what was kept.")


# ---- lookup_table_v2 (embedding) ---------------------------------------------------------------
def _lookup_infer(Ids, W, **_):
    check_dtype(Ids, INDEX, "Ids")
    check_dtype(W, FLOATS, "table W")
    if W.ndim != 2:
        raise ShapeMismatch(f"W must be a 2-D table [rows, width], got shape {list(W.shape)}")
    return {"Out": W.with_(shape=Ids.shape + (W.shape[1],), lod_level=Ids.lod_level)}


def _lookup_ref(Ids, W, *, padding_idx, **_):
    ids = Ids.astype(np.int64)
    pad = ids == padding_idx if padding_idx != -1 else np.zeros(ids.shape, bool)
    check_ids(np.where(pad, 0, ids), W.shape[0], "Ids")
    out = W[np.where(pad, 0, ids)]
    out[pad] = 0
    return {"Out": out.astype(W.dtype, copy=False)}


register_op(
    "lookup_table_v2", inputs=["Ids", "W"], outputs=["Out"],
    row_wise=RowWise(batch=("Ids",), const=("W",)),
    attrs={"padding_idx": Long(-1, low=-1, high=3),
           # runtime extra attrs in Paddle, written by Fluid's embedding layer
           "is_sparse": Bool(False), "is_distributed": Bool(False),
           "remote_prefetch": Bool(False)},
    traits=[OPAQUE], infer_shape=_lookup_infer, reference=_lookup_ref,
    emit=Opaque(),
    grad=default_grad("lookup_table_v2_grad", fwd_inputs=("W", "Ids"), wrt=("W",)),
    doc="Out[..., :] = W[Ids[...], :]; rows for padding_idx (unless -1) are zeros.")


# ---- gradients ---------------------------------------------------------------------------------
# Slots and formulas are Paddle 3.3.1's CPU grad kernels (checked numerically against Paddle):
# each grad op reads what its Paddle counterpart reads, so a program differentiated here has the
# same grad ops as one differentiated by Paddle.
def _same_size(g: np.ndarray, want: tuple, what: str) -> None:
    if g.size != int(np.prod(want, dtype=np.int64)):
        raise ShapeMismatch(f"{what} must have the forward output's shape: expected "
                            f"{list(want)}, got {list(g.shape)}")


def _softmax_grad_infer(Out, **_):
    return {"X@GRAD": Out}


def _softmax_grad_ref(Out, *, axis, **kw):
    g = kw["Out@GRAD"]
    _same_size(g, Out.shape, "softmax_grad: Out@GRAD")
    if Out.ndim == 0:  # softmax of a scalar is the constant 1
        return {"X@GRAD": np.zeros_like(Out)}
    g = g.reshape(Out.shape)
    ax = norm_axis(axis, Out.ndim)
    # dX = Out * (dOut - sum(dOut * Out)) along axis: the softmax Jacobian applied to dOut
    dx = Out * (g - (g * Out).sum(axis=ax, keepdims=True))
    return {"X@GRAD": dx.astype(Out.dtype, copy=False)}


def _softmax_grad_lower(ctx):
    """Row by row over the softmax axis: one dot product, then one scaled difference (another
    axis than the last: a target's own lowering; none: the reference)."""
    r = ctx.rank("Out")
    if r == 0 or ctx.dtype("Out").kind != "f" or ctx.dtype("Out@GRAD") != ctx.dtype("Out"):
        return None
    axis = ctx.attrs["axis"] % r
    O, G, T = ctx.inp("Out"), ctx.inp("Out@GRAD"), ctx.T("Out")
    dx = ctx.out("X@GRAD", shape=f"{O}.shape")
    o2, g2, d2, i, j, s = (ctx.tmp(h) for h in ("o", "g", "d", "i", "j", "s"))
    head = [f"if {G}.size != {O}.size: raise ValueError('pdjit: softmax_grad shapes differ')"]
    if axis == r - 1:
        prod = lambda k: f"{o2}[{i}, {k}] * {g2}[{i}, {k}]"  # noqa: E731
        return head + [
            f"{o2} = {O}.reshape(({ctx.prod(O, 0, r - 1)}, {O}.shape[{r - 1}]))",
            f"{g2} = {G}.reshape({o2}.shape)",
            f"{d2} = {dx}.reshape({o2}.shape)",
        ] + ctx.loop(i, f"{o2}.shape[0]", _partial4(ctx, s, f"{T}(0)", "{a} + {b}", prod,
                                                     f"{o2}.shape[1]", ctx.tmp("k")) + [
            f"for {j} in range({o2}.shape[1]):",
            f"    {d2}[{i}, {j}] = {o2}[{i}, {j}] * ({g2}[{i}, {j}] - {s})",
        ], size=f"{O}.size")
    return None


register_op(
    "softmax_grad", inputs=["Out", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs={"axis": Int(-1, low=-1, high=1, axis_of="Out")}, traits=[OPAQUE],
    infer_shape=_softmax_grad_infer,
    reference=_softmax_grad_ref, emit=Opaque(_softmax_grad_lower), grad=None,
    doc="dX = Out * (dOut - sum(dOut * Out, axis)).")


def _x_grad_infer(X, **_):
    return {"X@GRAD": X}


def _ce_grad_ref(X, Label, *, soft_label, ignore_index, **kw):
    lead = X.shape[:-1] + (1,)
    dy = kw["Y@GRAD"]
    _same_size(dy, lead, "cross_entropy_grad: Y@GRAD")
    dy = dy.reshape(lead)
    with np.errstate(divide="ignore", invalid="ignore"):
        if soft_label:  # d(-sum(L * log X))/dX = -L / X (Paddle: no TolerableValue here)
            dx = -Label * dy / X
        else:
            picked, ignored = _pick(X, Label, ignore_index)
            lab = np.where(ignored, 0, Label.reshape(lead).astype(np.int64))
            dx = np.zeros_like(X)
            np.put_along_axis(dx, lab, np.where(ignored, np.zeros((), X.dtype), -dy / picked),
                              axis=-1)
    return {"X@GRAD": dx.astype(X.dtype, copy=False)}


register_op(
    "cross_entropy_grad", inputs=["X", "Label", "Y@GRAD"], outputs=["X@GRAD?"],
    attrs={"soft_label": Bool(False), **_IGNORE}, traits=[OPAQUE], infer_shape=_x_grad_infer,
    reference=_ce_grad_ref, emit=None, grad=None,
    doc="dX = -dY / X at each row's label (hard; 0 elsewhere and on ignored rows) or "
        "-Label * dY / X (soft).")


def _ce2_grad_infer(XShape, **_):
    # XShape is X's shape with a trailing 0 (it holds no data): X@GRAD gets X's shape back
    return {"X@GRAD": XShape.with_(shape=XShape.shape[:-1])}


def _ce2_grad_ref(XShape, Label, MatchX, *, ignore_index, **kw):
    x_shape = XShape.shape[:-1]
    lead = x_shape[:-1] + (1,)
    dy = kw["Y@GRAD"]
    _same_size(dy, lead, "cross_entropy_grad2: Y@GRAD")
    lab = Label.reshape(lead).astype(np.int64)
    check_ids(lab, x_shape[-1], "Label", ignore_index)
    ignored = lab == ignore_index
    dx = np.zeros(x_shape, MatchX.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = np.where(ignored, np.zeros((), MatchX.dtype),
                       -dy.reshape(lead) / MatchX.reshape(lead))
    np.put_along_axis(dx, np.where(ignored, 0, lab), val.astype(MatchX.dtype, copy=False), axis=-1)
    return {"X@GRAD": dx}


register_op(
    "cross_entropy_grad2", inputs=["XShape", "Label", "MatchX", "Y@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_IGNORE), traits=[OPAQUE], infer_shape=_ce2_grad_infer,
    reference=_ce2_grad_ref, emit=Opaque(_ce2_grad_lower), grad=None,
    doc="dX = -dY / MatchX at each row's label, 0 elsewhere and on ignored rows; X's shape "
        "comes from XShape.")


def _swce_grad_infer(Softmax, **_):
    return {"Logits@GRAD": Softmax}


def _swce_grad_ref(Label, Softmax, *, soft_label, use_softmax, ignore_index, axis, **kw):
    ax = norm_axis(axis, Softmax.ndim)
    sm = np.moveaxis(Softmax, ax, -1)
    lead = sm.shape[:-1] + (1,)
    dl = kw["Loss@GRAD"]
    _same_size(dl, lead, "softmax_with_cross_entropy_grad: Loss@GRAD")
    dl = np.moveaxis(dl.reshape(Softmax.shape[:ax] + (1,) + Softmax.shape[ax + 1:]), ax, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if soft_label:
            lab = np.moveaxis(Label, ax, -1)
            # Paddle's kernel assumes each soft label sums to 1: softmax - label, not
            # softmax * sum(label) - label
            dx = (sm - lab) * dl if use_softmax else -lab / sm * dl
        else:
            lab = np.moveaxis(Label, ax, -1).astype(np.int64).reshape(lead)
            check_ids(lab, sm.shape[-1], "Label", ignore_index)
            ignored = lab == ignore_index
            safe = np.where(ignored, 0, lab)
            if use_softmax:  # softmax - one_hot(label)
                dx = sm.copy()
                np.put_along_axis(dx, safe, np.take_along_axis(sm, safe, axis=-1) - 1, axis=-1)
            else:  # Softmax holds the probabilities themselves: -1 / p at the label
                dx = np.zeros_like(sm)
                np.put_along_axis(dx, safe, -1 / np.take_along_axis(sm, safe, axis=-1), axis=-1)
            dx = np.where(ignored, np.zeros((), sm.dtype), dx * dl)
    return {"Logits@GRAD": np.ascontiguousarray(np.moveaxis(dx, -1, ax))
            .astype(Softmax.dtype, copy=False)}


register_op(
    "softmax_with_cross_entropy_grad", inputs=["Label", "Softmax", "Loss@GRAD"],
    outputs=["Logits@GRAD?"],
    attrs={"soft_label": Bool(False), "use_softmax": Bool(True),
           "numeric_stable_mode": Bool(True), **_IGNORE,
           "axis": Int(-1, low=-1, high=1, axis_of=("Logits", "Softmax"))},
    traits=[OPAQUE], infer_shape=_swce_grad_infer, reference=_swce_grad_ref,
    emit=Opaque(_swce_grad_lower), grad=None,
    doc="dLogits = (Softmax - onehot(Label)) * dLoss (hard; 0 on ignored rows) or "
        "(Softmax - Label) * dLoss (soft); with use_softmax=False, -Label / Softmax * dLoss.")


def _dropout_grad_infer(Mask, **kw):
    return {"X@GRAD": kw["Out@GRAD"]}


def _dropout_grad_ref(Mask, *, dropout_prob, is_test, dropout_implementation, **kw):
    g = kw["Out@GRAD"]
    p = float(dropout_prob)
    upscale = dropout_implementation == "upscale_in_train"
    if is_test:  # the forward was a fixed scaling: 1 (upscale) or 1 - p (downgrade)
        dx = g.copy() if upscale else g * np.asarray(1.0 - p, g.dtype)
        return {"X@GRAD": dx.astype(g.dtype, copy=False)}
    if Mask.shape != g.shape:
        raise ShapeMismatch(f"dropout_grad: Mask must have Out@GRAD's shape: expected "
                            f"{list(g.shape)}, got {list(Mask.shape)}")
    keep = Mask.astype(g.dtype)
    if upscale:
        dx = g * keep / np.asarray(1.0 - p, g.dtype) if p < 1.0 else np.zeros_like(g)
    else:
        dx = g * keep
    return {"X@GRAD": dx.astype(g.dtype, copy=False)}


register_op(
    "dropout_grad", inputs=["Mask", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs={"dropout_prob": Float(0.5, low=0.0, high=1.0, at_least=0.0, at_most=1.0),
           "is_test": Bool(False),
           "dropout_implementation": Str("downgrade_in_infer", choices=_DROPOUT_IMPLS,
                                         one_of=_DROPOUT_IMPLS),
           "seed": Int(0, low=0, high=1000), "fix_seed": Bool(False)},
    traits=[OPAQUE], infer_shape=_dropout_grad_infer, reference=_dropout_grad_ref,
    emit=Opaque(),
    grad=None,
    doc="dX = dOut * Mask (scaled by 1 / (1 - p) with upscale_in_train); in test mode the "
        "forward's fixed scale.")


def _lookup_grad_infer(W, Ids, **_):
    return {"W@GRAD": W}


def _lookup_grad_ref(W, Ids, *, padding_idx, **kw):
    g = kw["Out@GRAD"]
    ids = Ids.astype(np.int64).reshape(-1)
    width = W.shape[1]
    _same_size(g, (ids.size, width), "lookup_table_v2_grad: Out@GRAD")
    pad = ids == padding_idx if padding_idx != -1 else np.zeros(ids.shape, bool)
    check_ids(np.where(pad, 0, ids), W.shape[0], "Ids")
    dw = np.zeros(W.shape, W.dtype)
    # a row looked up several times collects every lookup's gradient; padding rows get none
    np.add.at(dw, ids[~pad], g.reshape(ids.size, width)[~pad])
    return {"W@GRAD": dw}


register_op(
    "lookup_table_v2_grad", inputs=["W", "Ids", "Out@GRAD"], outputs=["W@GRAD?"],
    attrs={"padding_idx": Long(-1, low=-1, high=3), "is_sparse": Bool(False),
           "is_distributed": Bool(False), "remote_prefetch": Bool(False)},
    traits=[OPAQUE], infer_shape=_lookup_grad_infer, reference=_lookup_grad_ref,
    emit=Opaque(),
    grad=None,
    doc="W@GRAD (dense) = sum of Out@GRAD rows over the lookups of each row; padding_idx's "
        "row stays zero.")
