"""Fluid 1.8's ranking and recommendation losses: ``rank_loss``, ``margin_rank_loss``,
``teacher_student_sigmoid_loss`` (elementwise or whole-array NumPy lines) and ``bpr_loss``
(a loop over each row's classes), with their gradient ops.

Semantics, slots and attributes are Fluid 1.8's:

- ``rank_loss(Label, Left, Right) -> Out``: ``log(1 + exp(o)) - Label * o`` with
  ``o = Left - Right`` (RankNet); its grad op writes ``Left@GRAD`` and ``Right@GRAD``.
- ``margin_rank_loss(X1, X2, Label) -> Out, Activated``: ``max(0, margin - Label * (X1 - X2))``;
  ``Activated`` (1 where the hinge is open, else 0) is what the grad op reads.
- ``teacher_student_sigmoid_loss(X, Label) -> Y``: the label encodes a click ``z`` and an
  optional teacher value ``z'``: ``-2`` (no teacher, no click) gives ``softplus(x)``, ``-1`` (no
  teacher, click) ``softplus(x) - x``, ``z' `` or ``1 + z'`` (teacher, no click / click) give
  ``2 softplus(x) - x * label``. Fluid's gradient clips ``x`` into the soft-max bounds and is 0
  at or beyond them (the forward does not clip).
- ``bpr_loss(X [N, C], Label [N, 1] int64) -> Y [N, 1]``: the mean over the ``C - 1`` negative
  classes ``j`` of ``log(1 + exp(X[j] - X[label]))`` (Bayesian personalised ranking).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    ELEMENTWISE,
    OPAQUE,
    Float,
    Opaque,
    VarMeta,
    default_grad,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

F64 = np.float64
_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def _softplus(z):
    return np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))


def _sigmoid(z):
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


def _same(op: str, ref_name: str, ref, pairs) -> None:
    for name, meta in pairs:
        if meta is None:
            continue
        if meta.dtype != ref.dtype:
            raise ShapeMismatch(f"{op}: expected {name} of {ref_name}'s dtype {ref.dtype}, got "
                                f"{meta.dtype}")
        if len(meta.shape) != len(ref.shape) or any(
                a >= 0 and b >= 0 and a != b for a, b in zip(meta.shape, ref.shape)):
            raise ShapeMismatch(f"{op}: expected {name} of {ref_name}'s shape "
                                f"{list(ref.shape)}, got {list(meta.shape)}")


def _same_values(op: str, ref_name: str, ref, **others) -> None:
    for name, v in others.items():
        if v.shape != ref.shape:
            raise ShapeMismatch(f"{op}: expected {name} of {ref_name}'s shape "
                                f"{list(ref.shape)}, got {list(v.shape)}")


def _native(*slots):
    def emit_if(template):
        def emit(dtypes_, **_):
            ok = all(np.dtype(dtypes_[s]) in _NATIVE for s in slots if s in dtypes_)
            return template if ok else None
        return emit
    return emit_if


# ---- rank_loss -------------------------------------------------------------------------------
def _rank_infer(Label, Left, Right):
    check_dtype(Left, FLOATS, "rank_loss: input Left")
    _same("rank_loss", "Left", Left, [("Label", Label), ("Right", Right)])
    return {"Out": Left}


def _rank_ref(Label, Left, Right):
    _same_values("rank_loss", "Left", Left, Label=Label, Right=Right)
    o = Left.astype(F64) - Right.astype(F64)
    return {"Out": (_softplus(o) - Label.astype(F64) * o).astype(Left.dtype)}


def _rank_grad_ref(Label, Left, Right, **kw):
    g = kw["Out@GRAD"]
    _same_values("rank_loss_grad", "Left", Left, Label=Label, Right=Right, **{"Out@GRAD": g})
    d = g.astype(F64) * (_sigmoid(Left.astype(F64) - Right.astype(F64)) - Label.astype(F64))
    return {"Left@GRAD": d.astype(Left.dtype), "Right@GRAD": (-d).astype(Left.dtype)}


def _rank_grad_lower(ctx):
    if not all(ctx.dtype(s) in _NATIVE for s in ("Label", "Left", "Right", "Out@GRAD")):
        return None
    L, A, B, G, T = (ctx.inp("Label"), ctx.inp("Left"), ctx.inp("Right"), ctx.inp("Out@GRAD"),
                     ctx.T("Left"))
    o, e, d = ctx.tmp("o"), ctx.tmp("e"), ctx.tmp("d")
    lines = [f"{o} = {A} - {B}", f"{e} = np.exp(-np.abs({o}))",
             f"{d} = {G} * (np.where({o} >= {T}(0), {T}(1) / ({T}(1) + {e}), "
             f"{e} / ({T}(1) + {e})) - {L})"]
    if ctx.has_output("Left@GRAD"):
        lines.append(f"{ctx.out('Left@GRAD')} = {d}")
    if ctx.has_output("Right@GRAD"):
        lines.append(f"{ctx.out('Right@GRAD')} = -{d}")
    return lines


register_op(
    "rank_loss", inputs=["Label", "Left", "Right"], outputs=["Out"], traits=[ELEMENTWISE],
    infer_shape=_rank_infer, reference=_rank_ref,
    emit=_native("Left", "Right", "Label")(
        "_m.softplus({Left} - {Right}) - {Label} * ({Left} - {Right})"),
    grad=default_grad("rank_loss_grad", fwd_inputs=("Label", "Left", "Right"),
                      wrt=("Left", "Right")),
    doc="Out = log(1 + exp(Left - Right)) - Label * (Left - Right).")
register_op(
    "rank_loss_grad", inputs=["Label", "Left", "Right", "Out@GRAD"],
    outputs=["Left@GRAD?", "Right@GRAD?"], traits=[OPAQUE],
    infer_shape=lambda Left, **_: {"Left@GRAD": Left, "Right@GRAD": Left},
    reference=_rank_grad_ref, emit=Opaque(_rank_grad_lower, host=True),
    grad=None, doc="Left@GRAD = -Right@GRAD = Out@GRAD * (sigmoid(Left - Right) - Label).")


# ---- margin_rank_loss ------------------------------------------------------------------------
_MARGIN = {"margin": Float(0.1, low=0.0, high=1.0)}


def _margin_infer(X1, X2, Label, **_):
    check_dtype(X1, FLOATS, "margin_rank_loss: input X1")
    _same("margin_rank_loss", "X1", X1, [("X2", X2), ("Label", Label)])
    return {"Out": X1, "Activated": X1}


def _margin_ref(X1, X2, Label, *, margin):
    _same_values("margin_rank_loss", "X1", X1, X2=X2, Label=Label)
    h = -Label.astype(F64) * (X1.astype(F64) - X2.astype(F64)) + float(np.float32(margin))
    return {"Out": np.maximum(h, 0).astype(X1.dtype), "Activated": (h > 0).astype(X1.dtype)}


def _margin_grad_ref(Label, Activated, **kw):
    g = kw["Out@GRAD"]
    _same_values("margin_rank_loss_grad", "Activated", Activated, Label=Label,
                 **{"Out@GRAD": g})
    d = g.astype(F64) * Activated.astype(F64) * Label.astype(F64)
    return {"X1@GRAD": (-d).astype(Activated.dtype), "X2@GRAD": d.astype(Activated.dtype)}


def _margin_lower(ctx):
    if not all(ctx.dtype(s) in _NATIVE for s in ("X1", "X2", "Label")):
        return None
    X1, X2, L, T = ctx.inp("X1"), ctx.inp("X2"), ctx.inp("Label"), ctx.T("X1")
    h = ctx.tmp("h")
    m = repr(float(np.float32(ctx.attrs["margin"])))
    lines = [f"{h} = {T}({m}) - {L} * ({X1} - {X2})",
             f"{ctx.out('Out')} = np.maximum({h}, {T}(0))"]
    if ctx.has_output("Activated"):
        lines.append(f"{ctx.out('Activated')} = np.where({h} > {T}(0), {T}(1), {T}(0))")
    return lines


def _margin_grad_lower(ctx):
    if not all(ctx.dtype(s) in _NATIVE for s in ("Label", "Activated", "Out@GRAD")):
        return None
    L, A, G = ctx.inp("Label"), ctx.inp("Activated"), ctx.inp("Out@GRAD")
    d = ctx.tmp("d")
    lines = [f"{d} = {G} * {A} * {L}"]
    if ctx.has_output("X1@GRAD"):
        lines.append(f"{ctx.out('X1@GRAD')} = -{d}")
    if ctx.has_output("X2@GRAD"):
        lines.append(f"{ctx.out('X2@GRAD')} = {d}")
    return lines


register_op(
    "margin_rank_loss", inputs=["X1", "X2", "Label"], outputs=["Out", "Activated~"],
    attrs=_MARGIN, traits=[OPAQUE], infer_shape=_margin_infer, reference=_margin_ref,
    emit=Opaque(_margin_lower, host=True),
    grad=default_grad("margin_rank_loss_grad", fwd_inputs=("Label",),
                      fwd_outputs=("Activated",), wrt=("X1", "X2")),
    doc="Out = max(0, margin - Label * (X1 - X2)); Activated = 1 where that is > 0.")
register_op(
    "margin_rank_loss_grad", inputs=["Label", "Activated", "Out@GRAD"],
    outputs=["X1@GRAD?", "X2@GRAD?"], attrs=dict(_MARGIN), traits=[OPAQUE],
    infer_shape=lambda Activated, **_: {"X1@GRAD": Activated, "X2@GRAD": Activated},
    reference=_margin_grad_ref, emit=Opaque(_margin_grad_lower, host=True),
    grad=None, doc="X2@GRAD = -X1@GRAD = Out@GRAD * Activated * Label.")


# ---- teacher_student_sigmoid_loss ------------------------------------------------------------
_TS_ATTRS = {"soft_max_up_bound": Float(15.0, low=1.0, high=15.0),
             "soft_max_lower_bound": Float(-15.0, low=-15.0, high=-1.0)}


def _ts_infer(X, Label, **_):
    check_dtype(X, FLOATS, "teacher_student_sigmoid_loss: input X")
    _same("teacher_student_sigmoid_loss", "X", X, [("Label", Label)])
    return {"Y": X}


def _ts_ref(X, Label, **_):
    _same_values("teacher_student_sigmoid_loss", "X", X, Label=Label)
    x, lab = X.astype(F64), Label.astype(F64)
    sp = _softplus(x)
    y = np.where(lab < -1, sp, np.where(lab < 0, sp - x, 2 * sp - x * lab))
    return {"Y": y.astype(X.dtype)}


def _ts_grad_ref(X, Label, *, soft_max_up_bound, soft_max_lower_bound, **kw):
    g = kw["Y@GRAD"]
    _same_values("teacher_student_sigmoid_loss_grad", "X", X, Label=Label, **{"Y@GRAD": g})
    up, lo = float(np.float32(soft_max_up_bound)), float(np.float32(soft_max_lower_bound))
    s = np.clip(X.astype(F64), lo, up)
    lab = Label.astype(F64)
    p = _sigmoid(s)
    d = np.where(lab < -1, -p, np.where(lab < 0, 1 - p, lab - 2 * p))
    d = np.where((s >= up) | (s <= lo), 0.0, d)
    return {"X@GRAD": (-d * g.astype(F64)).astype(X.dtype)}


_TS_S = "min(max({X}, {T}({soft_max_lower_bound})), {T}({soft_max_up_bound}))"
_TS_P = f"_m.sigmoid({_TS_S})"
register_op(
    "teacher_student_sigmoid_loss", inputs=["X", "Label"], outputs=["Y"], attrs=_TS_ATTRS,
    traits=[ELEMENTWISE], infer_shape=_ts_infer, reference=_ts_ref,
    emit=_native("X", "Label")(
        "_m.softplus({X}) if {Label} < {T}(-1) else (_m.softplus({X}) - {X} if {Label} < {T}(0) "
        "else {T}(2) * _m.softplus({X}) - {X} * {Label})"),
    grad=default_grad("teacher_student_sigmoid_loss_grad", fwd_inputs=("X", "Label"),
                      grad_outputs=("Y",)),
    doc="Y = softplus(X) (label < -1), softplus(X) - X (label < 0), else "
        "2 softplus(X) - X * label.")
register_op(
    "teacher_student_sigmoid_loss_grad", inputs=["X", "Label", "Y@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_TS_ATTRS), traits=[ELEMENTWISE],
    infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_ts_grad_ref,
    emit=_native("X", "Label", "Y@GRAD")(
        f"{{T}}(0) if {_TS_S} >= {{T}}({{soft_max_up_bound}}) or "
        f"{_TS_S} <= {{T}}({{soft_max_lower_bound}}) else -{{Y@GRAD}} * "
        f"(-{_TS_P} if {{Label}} < {{T}}(-1) else (({{T}}(1) - {_TS_P}) if {{Label}} < {{T}}(0) "
        f"else {{Label}} - {{T}}(2) * {_TS_P}))"),
    grad=None, doc="X@GRAD of teacher_student_sigmoid_loss (0 at or beyond the soft-max bounds).")


# ---- bpr_loss --------------------------------------------------------------------------------
def _bpr_infer(X, Label):
    check_dtype(X, FLOATS, "bpr_loss: input X")
    if len(X.shape) < 2:
        raise ShapeMismatch(f"bpr_loss: expected X of rank >= 2 ([N, C]), got {list(X.shape)}")
    if Label.dtype != np.dtype(np.int64):
        raise ShapeMismatch(f"bpr_loss: expected Label of dtype int64, got {Label.dtype}")
    if list(Label.shape[:-1]) != list(X.shape[:-1]) and all(
            d >= 0 for d in list(Label.shape[:-1]) + list(X.shape[:-1])):
        raise ShapeMismatch(f"bpr_loss: expected Label of shape {list(X.shape[:-1]) + [1]}, "
                            f"got {list(Label.shape)}")
    return {"Y": VarMeta(tuple(X.shape[:-1]) + (1,), X.dtype, X.lod_level)}


def _rows(X, Label, op):
    x = X.reshape(-1, X.shape[-1]).astype(F64)
    lab = Label.reshape(-1)
    if lab.size != x.shape[0]:
        raise ShapeMismatch(f"{op}: expected one label per row of X ({x.shape[0]}), got "
                            f"{lab.size}")
    if lab.size and (lab.min() < 0 or lab.max() >= x.shape[1]):
        bad = lab[(lab < 0) | (lab >= x.shape[1])][0]
        raise IndexError(f"{op}: label {bad} out of range [0, {x.shape[1]})")
    return x, lab


def _bpr_ref(X, Label):
    x, lab = _rows(X, Label, "bpr_loss")
    c = x.shape[1]
    v = x - x[np.arange(x.shape[0]), lab][:, None]          # X[j] - X[label]
    sp = _softplus(v)
    sp[np.arange(x.shape[0]), lab] = 0.0
    y = sp.sum(axis=1) / (c - 1)
    return {"Y": y.reshape(X.shape[:-1] + (1,)).astype(X.dtype)}


def _bpr_grad_ref(X, Label, **kw):
    g = kw["Y@GRAD"]
    x, lab = _rows(X, Label, "bpr_loss_grad")
    n, c = x.shape
    rows = np.arange(n)
    s = _sigmoid(x - x[rows, lab][:, None]) * (g.reshape(-1, 1).astype(F64) / (c - 1))
    s[rows, lab] = 0.0
    s[rows, lab] = -s.sum(axis=1)
    return {"X@GRAD": s.reshape(X.shape).astype(X.dtype)}


def _bpr_lower(ctx):
    if ctx.dtype("X") not in _NATIVE:
        return None
    r = ctx.rank("X")
    X, L, T = ctx.inp("X"), ctx.inp("Label"), ctx.T("X")
    shape = ctx.tuple_src([f"{X}.shape[{d}]" for d in range(r - 1)] + ["1"])
    y = ctx.out("Y", shape=shape)
    x2, lab, yf, i, j, k, s, v = (ctx.tmp(h) for h in ("x", "l", "y", "i", "j", "k", "s", "v"))
    return [
        f"{x2} = {ctx.as_rows(X, r)}",
        f"{lab} = {L}.reshape({L}.size)",
        f"{yf} = {y}.reshape({y}.size)",
        f"_rt.check({lab}.size == {x2}.shape[0])",
        f"for {i} in range({x2}.shape[0]):",
        f"    {k} = {lab}[{i}]",
        f"    _rt.check(0 <= {k} < {x2}.shape[1])",
        f"    {s} = {T}(0)",
        f"    for {j} in range({x2}.shape[1]):",
        f"        if {j} != {k}:",
        f"            {v} = {x2}[{i}, {j}] - {x2}[{i}, {k}]",
        f"            {s} += max({v}, {T}(0)) + np.log1p(np.exp(-abs({v})))",
        f"    {yf}[{i}] = {s} / {T}({x2}.shape[1] - 1)",
    ]


def _bpr_grad_lower(ctx):
    if ctx.dtype("X") not in _NATIVE or not ctx.has_output("X@GRAD"):
        return None
    r = ctx.rank("X")
    X, L, G, T = ctx.inp("X"), ctx.inp("Label"), ctx.inp("Y@GRAD"), ctx.T("X")
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    x2, d2, lab, gf, i, j, k, s, w = (ctx.tmp(h) for h in "xdlgijksw")
    return [
        f"{x2} = {ctx.as_rows(X, r)}",
        f"{d2} = {ctx.as_rows(dx, r)}",
        f"{lab} = {L}.reshape({L}.size)",
        f"{gf} = {G}.reshape({G}.size)",
        f"_rt.check({lab}.size == {x2}.shape[0] and {gf}.size == {x2}.shape[0])",
        f"for {i} in range({x2}.shape[0]):",
        f"    {k} = {lab}[{i}]",
        f"    _rt.check(0 <= {k} < {x2}.shape[1])",
        f"    {s} = {T}(0)",
        f"    for {j} in range({x2}.shape[1]):",
        f"        if {j} == {k}:",
        "            continue",
        f"        {w} = {gf}[{i}] / ({T}({x2}.shape[1] - 1) * "
        f"({T}(1) + np.exp({x2}[{i}, {k}] - {x2}[{i}, {j}])))",
        f"        {d2}[{i}, {j}] = {w}",
        f"        {s} += {w}",
        f"    {d2}[{i}, {k}] = -{s}",
    ]


register_op(
    "bpr_loss", inputs=["X", "Label"], outputs=["Y"], traits=[OPAQUE],
    infer_shape=_bpr_infer, reference=_bpr_ref, emit=Opaque(_bpr_lower),
    grad=default_grad("bpr_loss_grad", fwd_inputs=("X", "Label"), grad_outputs=("Y",)),
    doc="Y[i] = mean over j != Label[i] of log(1 + exp(X[i, j] - X[i, Label[i]])).")
register_op(
    "bpr_loss_grad", inputs=["X", "Label", "Y@GRAD"], outputs=["X@GRAD?"], traits=[OPAQUE],
    infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_bpr_grad_ref,
    emit=Opaque(_bpr_grad_lower), grad=None, doc="X@GRAD of bpr_loss.")
