"""Loss ops: ``sigmoid_cross_entropy_with_logits``, ``bce_loss``, ``huber_loss``,
``smooth_l1_loss``, ``kldiv_loss`` and their gradients.

Types, slots, attributes and grad makers are PaddlePaddle 3.3.1's legacy ops (``smooth_l1_loss``,
gone from 3.3.1, is Fluid 1.x's); the numbers were compared with Paddle while writing them:

- ``sigmoid_cross_entropy_with_logits`` (X, Label, optional pos_weight of X's shape -> Out of
  X's shape): ``Out = softplus(X) - X * Label``; with pos_weight Paddle's form
  ``(1 - Label) * X + pos_weight * softplus(-X)``. Elements whose label truncates to
  ``ignore_index`` (default -100) give 0. ``normalize`` divides every element by the number of
  labels further than 1e-6 from ``ignore_index`` (0 of them: NaN, as Paddle). Its grad reads X,
  Label, pos_weight and Out@GRAD: ``(sigmoid(X) - Label) * dOut`` (with pos_weight
  ``((1 - Label) - pos_weight * sigmoid(-X)) * dOut``), 0 where ignored, normalised alike.
- ``bce_loss`` (X probabilities in [0, 1], Label): ``-(Label * max(log X, -100) + (1 - Label) *
  max(log(1 - X), -100))``; its grad ``dOut * (X - Label) / max((1 - X) * X, 1e-12)``. The
  reference refuses X outside [0, 1] (as Paddle's kernel); compiled code does not check.
- ``huber_loss`` (X, Y, ``delta``): ``Residual = Y - X`` (intermediate) and ``Out = r^2 / 2``
  where ``|r| <= delta``, else ``delta * (|r| - delta / 2)``, of X's shape. Its grad reads
  Residual and Out@GRAD: ``Y@GRAD = dOut * clip(r, -delta, delta)``, ``X@GRAD = -Y@GRAD``.
- ``smooth_l1_loss`` (Fluid 1.x: X, Y of rank >= 2, InsideWeight and OutsideWeight together or
  not at all, ``sigma``): ``Diff = (X - Y) * InsideWeight`` (intermediate), elementwise
  ``e = 0.5 * (sigma * d)^2`` where ``|d| < 1 / sigma^2``, else ``|d| - 0.5 / sigma^2``, times
  OutsideWeight, summed per sample: ``Out`` is ``[N, 1]``. Its grad reads the weights, Diff and
  Out@GRAD. Fluid 1.x's grad kernel leaves InsideWeight out of X@GRAD; here it is in (the
  derivative; both agree without weights).
- ``kldiv_loss`` (X log-probabilities, Target, ``reduction``, ``log_target``): elementwise
  ``Target * (log Target - X)`` where Target > 0, else 0 (``log_target``:
  ``exp(Target) * (Target - X)``), then ``none`` (X's shape), ``sum``, ``mean`` (over every
  element) or ``batchmean`` (divided by ``X.shape[0]``), the last three 0-d as in Paddle 3.3.1.
  Its grad reads X, Target and Loss@GRAD: ``-Target * dLoss`` (0 where Target <= 0; with
  ``log_target`` ``-exp(Target) * dLoss``), divided as the reduction divides.

Natively (float32 and float64): the two elementwise ones and their gradients are templates
that fuse with their neighbours (with ``normalize``, which needs a count over the whole tensor,
host lines); huber, smooth_l1 and kldiv and their gradients are host lines of NumPy array
expressions (no compilation; valid under Numba too, for native drivers).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    ELEMENTWISE,
    OPAQUE,
    Bool,
    Float,
    Int,
    Opaque,
    Str,
    default_grad,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
F64 = np.float64


def _f32(value) -> str:
    """A FLOAT attribute as the float32 value Paddle stores, as a Python literal."""
    return repr(float(np.float32(value)))


def _same_meta(op: str, ref_name: str, ref, name: str, meta) -> None:
    """``meta`` (input ``name``) must have the shape and dtype of ``ref`` (input ``ref_name``)."""
    if meta is None:
        return
    if meta.dtype != ref.dtype:
        raise ShapeMismatch(f"{op}: expected {name} of {ref_name}'s dtype {ref.dtype}, got "
                            f"{meta.dtype}")
    if len(meta.shape) != len(ref.shape) or any(
            a >= 0 and b >= 0 and a != b for a, b in zip(meta.shape, ref.shape)):
        raise ShapeMismatch(f"{op}: expected {name} of {ref_name}'s shape {list(ref.shape)}, "
                            f"got {list(meta.shape)}")


def _same_values(op: str, x: np.ndarray, name: str, v) -> None:
    if v is not None and v.shape != x.shape:
        raise ShapeMismatch(f"{op}: expected {name} of shape {list(x.shape)}, got "
                            f"{list(v.shape)}")


def _softplus(z: np.ndarray) -> np.ndarray:
    """log(1 + exp(z)) without overflow (float64)."""
    return np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))


def _native(dtypes_, *slots) -> bool:
    return all(np.dtype(dtypes_[s]) in _NATIVE for s in slots if s in dtypes_)


# ---- sigmoid_cross_entropy_with_logits --------------------------------------------------------
_SCE_ATTRS = {"normalize": Bool(False), "ignore_index": Int(-100, low=-100, high=-1)}


def _sce_infer(X, Label, pos_weight=None, **_):
    check_dtype(X, FLOATS, "sigmoid_cross_entropy_with_logits: input X")
    _same_meta("sigmoid_cross_entropy_with_logits", "X", X, "Label", Label)
    _same_meta("sigmoid_cross_entropy_with_logits", "X", X, "pos_weight", pos_weight)
    return {"Out": X}


def _sce_mask(label, ignore_index, normalize):
    """(kept: labels not truncating to ignore_index, the normaliser or None)."""
    kept = np.trunc(label) != ignore_index
    if not normalize:
        return kept, None
    return kept, float(np.count_nonzero(np.abs(label - ignore_index) > 1e-6))


def _divide(v: np.ndarray, norm) -> np.ndarray:
    if norm is None:
        return v
    with np.errstate(invalid="ignore", divide="ignore"):
        return v / norm


def _sce_ref(X, Label, pos_weight=None, *, normalize, ignore_index):
    op = "sigmoid_cross_entropy_with_logits"
    _same_values(op, X, "Label", Label)
    _same_values(op, X, "pos_weight", pos_weight)
    x, lab = X.astype(F64), Label.astype(F64)
    if pos_weight is None:
        out = _softplus(x) - x * lab
    else:
        out = (1 - lab) * x + pos_weight.astype(F64) * _softplus(-x)
    kept, norm = _sce_mask(lab, ignore_index, normalize)
    return {"Out": _divide(np.where(kept, out, 0.0), norm).astype(X.dtype)}


def _sce_grad_ref(X, Label, pos_weight=None, *, normalize, ignore_index, **kw):
    g = kw["Out@GRAD"]
    op = "sigmoid_cross_entropy_with_logits_grad"
    for name, v in (("Label", Label), ("pos_weight", pos_weight), ("Out@GRAD", g)):
        _same_values(op, X, name, v)
    x, lab = X.astype(F64), Label.astype(F64)
    if pos_weight is None:
        d = 1 / (1 + np.exp(-x)) - lab
    else:
        d = (1 - lab) - pos_weight.astype(F64) / (1 + np.exp(x))
    kept, norm = _sce_mask(lab, ignore_index, normalize)
    return {"X@GRAD": _divide(np.where(kept, d * g, 0.0), norm).astype(X.dtype)}


def _ignored(label: str) -> str:
    return f"np.trunc({label}) == {{T}}({{ignore_index}})"


def _sce_normalized_lower(grad: bool):
    """Host lines for ``normalize``: the elementwise value over the whole tensor, then the
    division by the count of kept labels (NaN when there is none, as Paddle's 0 / 0)."""
    def lower(ctx):
        X, L, T = ctx.inp("X"), ctx.inp("Label"), ctx.T("X")
        pw = ctx.inp("pos_weight") if ctx.has_input("pos_weight") else None
        kept, cnt, v, e, sig = (ctx.tmp(h) for h in ("kept", "cnt", "v", "e", "sig"))
        ig = f"{T}({int(ctx.attrs['ignore_index'])})"
        lines = [f"{kept} = np.trunc({L}) != {ig}",
                 f"{cnt} = np.sum(np.abs({L} - {ig}) > {T}(1e-6))",
                 f"{e} = np.exp(-np.abs({X}))"]
        if grad:
            lines.append(f"{sig} = np.where({X} >= {T}(0), {T}(1) / ({T}(1) + {e}), "
                         f"{e} / ({T}(1) + {e}))")
            g = ctx.inp("Out@GRAD")
            value = f"(({T}(1) - {L}) - {pw} * ({T}(1) - {sig})) * {g}" if pw else \
                f"({sig} - {L}) * {g}"
            out = ctx.out("X@GRAD")
        else:
            value = f"({T}(1) - {L}) * {X} + {pw} * (np.maximum(-{X}, {T}(0)) + np.log1p({e}))" \
                if pw else f"np.maximum({X}, {T}(0)) + np.log1p({e}) - {X} * {L}"
            out = ctx.out("Out")
        return lines + [f"{v} = {value}",
                        f"{out} = np.where({kept}, {v}, {T}(0)) * ({T}(1) / {T}({cnt}) "
                        f"if {cnt} > 0 else {T}(np.nan))"]
    return lower


_SCE_NORMALIZED = Opaque(_sce_normalized_lower(False), host=True)
_SCE_GRAD_NORMALIZED = Opaque(_sce_normalized_lower(True), host=True)


def _sce_emit(dtypes_, *, normalize=False, **_):
    if not _native(dtypes_, "X", "Label", "pos_weight"):
        return None
    if normalize:  # a count over the whole tensor: host lines, not a fusable template
        return _SCE_NORMALIZED
    if "pos_weight" in dtypes_:
        value = "({T}(1) - {Label}) * {X} + {pos_weight} * _m.softplus(-{X})"
    else:
        value = "_m.softplus({X}) - {X} * {Label}"
    return f"{{T}}(0) if {_ignored('{Label}')} else {value}"


def _sce_grad_emit(dtypes_, *, normalize=False, **_):
    if not _native(dtypes_, "X", "Label", "pos_weight", "Out@GRAD"):
        return None
    if normalize:
        return _SCE_GRAD_NORMALIZED
    if "pos_weight" in dtypes_:
        value = "(({T}(1) - {Label}) - {pos_weight} * _m.sigmoid(-{X})) * {Out@GRAD}"
    else:
        value = "(_m.sigmoid({X}) - {Label}) * {Out@GRAD}"
    return f"{{T}}(0) if {_ignored('{Label}')} else {value}"


register_op(
    "sigmoid_cross_entropy_with_logits", inputs=["X", "Label", "pos_weight?"], outputs=["Out"],
    attrs=_SCE_ATTRS, traits=[ELEMENTWISE], infer_shape=_sce_infer, reference=_sce_ref,
    emit=_sce_emit,
    grad=default_grad("sigmoid_cross_entropy_with_logits_grad",
                      fwd_inputs=("X", "Label", "pos_weight")),
    domain={"Label": "positive"},
    doc="Out = softplus(X) - X * Label (0 where Label is ignore_index), optionally weighted "
        "by pos_weight and normalised by the count of kept labels.")

register_op(
    "sigmoid_cross_entropy_with_logits_grad",
    inputs=["X", "Label", "pos_weight?", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=_SCE_ATTRS, traits=[ELEMENTWISE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_sce_grad_ref, emit=_sce_grad_emit, grad=None,
    doc="X@GRAD = (sigmoid(X) - Label) * Out@GRAD (gradient of "
        "sigmoid_cross_entropy_with_logits).")


# ---- bce_loss --------------------------------------------------------------------------------
def _bce_infer(X, Label):
    check_dtype(X, FLOATS, "bce_loss: input X")
    _same_meta("bce_loss", "X", X, "Label", Label)
    return {"Out": X}


def _bce_ref(X, Label):
    _same_values("bce_loss", X, "Label", Label)
    if X.size and not (np.all(X >= 0) and np.all(X <= 1)):
        bad = X[~((X >= 0) & (X <= 1))].reshape(-1)[0]
        raise ShapeMismatch(f"bce_loss: expected X (probabilities) in [0, 1], got {bad}")
    x, lab = X.astype(F64), Label.astype(F64)
    with np.errstate(divide="ignore"):
        out = -(lab * np.maximum(np.log(x), -100.0) + (1 - lab) * np.maximum(np.log1p(-x),
                                                                            -100.0))
    return {"Out": out.astype(X.dtype)}


def _bce_grad_ref(X, Label, **kw):
    g = kw["Out@GRAD"]
    _same_values("bce_loss_grad", X, "Label", Label)
    _same_values("bce_loss_grad", X, "Out@GRAD", g)
    x, lab = X.astype(F64), Label.astype(F64)
    return {"X@GRAD": (g * (x - lab) / np.maximum((1 - x) * x, 1e-12)).astype(X.dtype)}


register_op(
    "bce_loss", inputs=["X", "Label"], outputs=["Out"], traits=[ELEMENTWISE],
    infer_shape=_bce_infer, reference=_bce_ref,
    emit=lambda dtypes_, **_: (
        "-({Label} * max(_m.log({X}), {T}(-100)) + ({T}(1) - {Label}) * "
        "max(_m.log({T}(1) - {X}), {T}(-100)))") if _native(dtypes_, "X", "Label") else None,
    grad=default_grad("bce_loss_grad", fwd_inputs=("X", "Label")),
    domain={"X": "unit"},
    doc="Out = -(Label * log X + (1 - Label) * log(1 - X)), each log at least -100.")

register_op(
    "bce_loss_grad", inputs=["X", "Label", "Out@GRAD"], outputs=["X@GRAD?"],
    traits=[ELEMENTWISE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_bce_grad_ref,
    emit=lambda dtypes_, **_: (
        "{Out@GRAD} * ({X} - {Label}) / max(({T}(1) - {X}) * {X}, {T}(1e-12))")
    if _native(dtypes_, "X", "Label", "Out@GRAD") else None,
    grad=None, doc="X@GRAD = Out@GRAD * (X - Label) / max((1 - X) * X, 1e-12).")


# ---- huber_loss ------------------------------------------------------------------------------
_DELTA = {"delta": Float(1.0, low=0.1, high=2.0)}


def _huber_infer(X, Y, **_):
    check_dtype(X, FLOATS, "huber_loss: input X")
    _same_meta("huber_loss", "X", X, "Y", Y)
    return {"Out": X, "Residual": X}


def _huber_ref(X, Y, *, delta):
    _same_values("huber_loss", X, "Y", Y)
    r = Y.astype(F64) - X.astype(F64)
    d = float(np.float32(delta))
    a = np.abs(r)
    out = np.where(a <= d, 0.5 * r * r, d * (a - 0.5 * d))
    return {"Out": out.astype(X.dtype), "Residual": r.astype(X.dtype)}


def _huber_lower(ctx):
    if not all(ctx.dtype(s) in _NATIVE for s in ("X", "Y")):
        return None
    X, Y, T = ctx.inp("X"), ctx.inp("Y"), ctx.T("X")
    r, a, d = ctx.out("Residual") if ctx.has_output("Residual") else ctx.tmp("r"), \
        ctx.tmp("abs"), _f32(ctx.attrs["delta"])
    return [f"{r} = {Y} - {X}", f"{a} = np.abs({r})",
            f"{ctx.out('Out')} = np.where({a} <= {T}({d}), {T}(0.5) * {r} * {r}, "
            f"{T}({d}) * ({a} - {T}({d}) * {T}(0.5)))"]


def _huber_grad_ref(Residual, *, delta, **kw):
    g = kw["Out@GRAD"]
    _same_values("huber_loss_grad", Residual, "Out@GRAD", g)
    d = float(np.float32(delta))
    dy = (g.astype(F64) * np.clip(Residual.astype(F64), -d, d)).astype(Residual.dtype)
    return {"X@GRAD": -dy, "Y@GRAD": dy}


def _huber_grad_lower(ctx):
    if not all(ctx.dtype(s) in _NATIVE for s in ("Residual", "Out@GRAD")):
        return None
    R, G, T, d = ctx.inp("Residual"), ctx.inp("Out@GRAD"), ctx.T("Residual"), \
        _f32(ctx.attrs["delta"])
    t = ctx.tmp("t")
    lines = [f"{t} = {G} * np.minimum(np.maximum({R}, {T}(-{d})), {T}({d}))"]
    if ctx.has_output("X@GRAD"):
        lines.append(f"{ctx.out('X@GRAD')} = -{t}")
    if ctx.has_output("Y@GRAD"):
        lines.append(f"{ctx.out('Y@GRAD')} = {t}")
    return lines


register_op(
    "huber_loss", inputs=["X", "Y"], outputs=["Out", "Residual~"], attrs=_DELTA,
    traits=[OPAQUE], infer_shape=_huber_infer, reference=_huber_ref,
    emit=Opaque(_huber_lower, host=True),
    grad=default_grad("huber_loss_grad", fwd_inputs=(), fwd_outputs=("Residual",),
                      wrt=("X", "Y")),
    doc="Residual = Y - X; Out = r^2 / 2 where |r| <= delta, else delta * (|r| - delta / 2).")

register_op(
    "huber_loss_grad", inputs=["Residual", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs=_DELTA, traits=[OPAQUE],
    infer_shape=lambda Residual, **_: {"X@GRAD": Residual, "Y@GRAD": Residual},
    reference=_huber_grad_ref, emit=Opaque(_huber_grad_lower, host=True), grad=None,
    doc="Y@GRAD = Out@GRAD * clip(Residual, -delta, delta); X@GRAD = -Y@GRAD.")


# ---- smooth_l1_loss (Fluid 1.x) --------------------------------------------------------------
_SIGMA = {"sigma": Float(1.0, low=0.5, high=3.0)}


def _sl1_infer(X, Y, InsideWeight=None, OutsideWeight=None, **_):
    op = "smooth_l1_loss"
    check_dtype(X, FLOATS, f"{op}: input X")
    if X.ndim < 2:
        raise ShapeMismatch(f"{op}: expected X of rank >= 2 (a batch of samples), got shape "
                            f"{list(X.shape)}")
    _same_meta(op, "X", X, "Y", Y)
    if (InsideWeight is None) != (OutsideWeight is None):
        raise ShapeMismatch(f"{op}: expected InsideWeight and OutsideWeight together (both or "
                            f"neither), got only "
                            f"{'InsideWeight' if OutsideWeight is None else 'OutsideWeight'}")
    _same_meta(op, "X", X, "InsideWeight", InsideWeight)
    _same_meta(op, "X", X, "OutsideWeight", OutsideWeight)
    return {"Diff": X, "Out": X.with_(shape=(X.shape[0], 1))}


def _sl1_ref(X, Y, InsideWeight=None, OutsideWeight=None, *, sigma):
    op = "smooth_l1_loss"
    for name, v in (("Y", Y), ("InsideWeight", InsideWeight), ("OutsideWeight", OutsideWeight)):
        _same_values(op, X, name, v)
    if (InsideWeight is None) != (OutsideWeight is None):
        raise ShapeMismatch(f"{op}: expected InsideWeight and OutsideWeight together")
    s2 = float(np.float32(sigma)) ** 2
    d = X.astype(F64) - Y.astype(F64)
    if InsideWeight is not None:
        d = d * InsideWeight
    a = np.abs(d)
    e = np.where(a < 1 / s2, 0.5 * d * d * s2, a - 0.5 / s2)
    if OutsideWeight is not None:
        e = e * OutsideWeight
    n = X.shape[0]
    return {"Diff": d.astype(X.dtype), "Out": e.reshape(n, -1).sum(axis=1).reshape(n, 1)
            .astype(X.dtype)}


def _sl1_lower(ctx):
    slots = [s for s in ("X", "Y", "InsideWeight", "OutsideWeight") if ctx.has_input(s)]
    if not all(ctx.dtype(s) in _NATIVE for s in slots):
        return None
    X, Y, T = ctx.inp("X"), ctx.inp("Y"), ctx.T("X")
    s2 = float(np.float32(ctx.attrs["sigma"])) ** 2
    weighted = ctx.has_input("InsideWeight") and ctx.has_input("OutsideWeight")
    d = ctx.out("Diff") if ctx.has_output("Diff") else ctx.tmp("d")
    a, e, n = ctx.tmp("abs"), ctx.tmp("e"), ctx.tmp("n")
    lines = [f"{d} = ({X} - {Y}) * {ctx.inp('InsideWeight')}" if weighted else
             f"{d} = {X} - {Y}", f"{a} = np.abs({d})",
             f"{e} = np.where({a} < {T}({1 / s2!r}), {T}({0.5 * s2!r}) * {d} * {d}, "
             f"{a} - {T}({0.5 / s2!r}))"]
    if weighted:
        lines.append(f"{e} = {e} * {ctx.inp('OutsideWeight')}")
    return lines + [f"{n} = {X}.shape[0]",
                    f"{ctx.out('Out')} = {e}.reshape(({n}, {e}.size // max({n}, 1)))"
                    f".sum(axis=1).reshape(({n}, 1))"]


def _sl1_grad_ref(Diff, InsideWeight=None, OutsideWeight=None, *, sigma, **kw):
    g = kw["Out@GRAD"]
    op = "smooth_l1_loss_grad"
    n = Diff.shape[0]
    if g.shape != (n, 1):
        raise ShapeMismatch(f"{op}: expected Out@GRAD of shape [{n}, 1], got {list(g.shape)}")
    s2 = float(np.float32(sigma)) ** 2
    d = Diff.astype(F64)
    dd = np.where(np.abs(d) < 1 / s2, s2 * d, np.sign(d))
    for name, w in (("InsideWeight", InsideWeight), ("OutsideWeight", OutsideWeight)):
        if w is not None:
            _same_values(op, Diff, name, w)
            dd = dd * w
    dx = (dd * g.astype(F64).reshape((n,) + (1,) * (Diff.ndim - 1))).astype(Diff.dtype)
    return {"X@GRAD": dx, "Y@GRAD": -dx}


def _sl1_grad_lower(ctx):
    slots = [s for s in ("Diff", "InsideWeight", "OutsideWeight", "Out@GRAD")
             if ctx.has_input(s)]
    if not all(ctx.dtype(s) in _NATIVE for s in slots):
        return None
    D, G, T = ctx.inp("Diff"), ctx.inp("Out@GRAD"), ctx.T("Diff")
    s2 = float(np.float32(ctx.attrs["sigma"])) ** 2
    t, n = ctx.tmp("t"), ctx.tmp("n")
    lines = [f"{t} = np.where(np.abs({D}) < {T}({1 / s2!r}), {T}({s2!r}) * {D}, np.sign({D}))"]
    for w in ("InsideWeight", "OutsideWeight"):
        if ctx.has_input(w):
            lines.append(f"{t} = {t} * {ctx.inp(w)}")
    lines += [f"{n} = {D}.shape[0]",
              f"{t} = ({t}.reshape(({n}, {t}.size // max({n}, 1))) * {G}.reshape(({n}, 1)))"
              f".reshape({D}.shape)"]
    if ctx.has_output("X@GRAD"):
        lines.append(f"{ctx.out('X@GRAD')} = {t}")
    if ctx.has_output("Y@GRAD"):
        lines.append(f"{ctx.out('Y@GRAD')} = -{t}")
    return lines


def _sl1_grad(op):
    maker = default_grad("smooth_l1_loss_grad", fwd_inputs=("InsideWeight", "OutsideWeight"),
                         fwd_outputs=("Diff",), wrt=("X", "Y"))
    return maker(op)


register_op(
    "smooth_l1_loss", inputs=["X", "Y", "InsideWeight?", "OutsideWeight?"],
    outputs=["Diff~", "Out"], attrs=_SIGMA, traits=[OPAQUE], infer_shape=_sl1_infer,
    reference=_sl1_ref, emit=Opaque(_sl1_lower, host=True), grad=_sl1_grad,
    doc="Out[n] = sum of smooth L1 of (X - Y) * InsideWeight, times OutsideWeight, over "
        "sample n's elements (Fluid 1.x).")

register_op(
    "smooth_l1_loss_grad", inputs=["InsideWeight?", "OutsideWeight?", "Diff", "Out@GRAD"],
    outputs=["X@GRAD?", "Y@GRAD?"], attrs=_SIGMA, traits=[OPAQUE],
    infer_shape=lambda Diff, **_: {"X@GRAD": Diff, "Y@GRAD": Diff},
    reference=_sl1_grad_ref, emit=Opaque(_sl1_grad_lower, host=True), grad=None,
    doc="X@GRAD = Out@GRAD[n] * d smooth_l1(Diff) * InsideWeight * OutsideWeight; "
        "Y@GRAD = -X@GRAD.")


# ---- kldiv_loss ------------------------------------------------------------------------------
_REDUCTIONS = ("none", "batchmean", "mean", "sum")
_KL_ATTRS = {"reduction": Str("mean", choices=_REDUCTIONS, one_of=_REDUCTIONS),
             "log_target": Bool(False)}


def _check_reduction(reduction) -> None:
    if reduction not in _REDUCTIONS:
        raise ShapeMismatch(f"kldiv_loss: expected reduction 'none', 'batchmean', 'mean' or "
                            f"'sum', got {reduction!r}")


def _kl_infer(X, Target, *, reduction, **_):
    check_dtype(X, FLOATS, "kldiv_loss: input X")
    _same_meta("kldiv_loss", "X", X, "Target", Target)
    _check_reduction(reduction)
    return {"Loss": X if reduction == "none" else X.with_(shape=())}


def _kl_divisor(x: np.ndarray, reduction: str) -> float:
    if reduction == "batchmean":
        return float(x.shape[0]) if x.ndim else 1.0
    return float(x.size) if reduction == "mean" else 1.0


def _kl_ref(X, Target, *, reduction, log_target):
    _same_values("kldiv_loss", X, "Target", Target)
    _check_reduction(reduction)
    x, t = X.astype(F64), Target.astype(F64)
    if log_target:
        e = np.exp(t) * (t - x)
    else:
        e = np.where(t > 0, t * (np.log(np.where(t > 0, t, 1.0)) - x), 0.0)
    if reduction != "none":
        with np.errstate(invalid="ignore", divide="ignore"):
            e = np.asarray(e.sum() / _kl_divisor(x, reduction))
    return {"Loss": e.astype(X.dtype)}


def _kl_divisor_src(X: str, reduction: str, rank: int) -> str:
    if reduction == "batchmean":
        return f"{X}.shape[0]" if rank else "1"
    return f"{X}.size" if reduction == "mean" else "1"


def _kl_lower(ctx):
    if not all(ctx.dtype(s) in _NATIVE for s in ("X", "Target")):
        return None
    X, Tg, T = ctx.inp("X"), ctx.inp("Target"), ctx.T("X")
    reduction = ctx.attrs["reduction"]
    if reduction not in _REDUCTIONS:
        return None  # the reference's error
    e = ctx.tmp("e")
    if ctx.attrs["log_target"]:
        lines = [f"{e} = np.exp({Tg}) * ({Tg} - {X})"]
    else:
        lines = [f"{e} = np.where({Tg} > {T}(0), {Tg} * (np.log(np.where({Tg} > {T}(0), {Tg}, "
                 f"{T}(1))) - {X}), {T}(0))"]
    if reduction == "none":
        return lines + [f"{ctx.out('Loss')} = {e}"]
    out = ctx.out("Loss", shape="()")
    div = _kl_divisor_src(X, reduction, ctx.rank("X"))
    return lines + [f"{out}.reshape(1)[0] = {e}.sum() / {T}({div})"]


def _kl_grad_ref(X, Target, *, reduction, log_target, **kw):
    g = kw["Loss@GRAD"]
    _same_values("kldiv_loss_grad", X, "Target", Target)
    _check_reduction(reduction)
    want = X.shape if reduction == "none" else ()
    if g.shape != want and not (reduction != "none" and g.size == 1):
        raise ShapeMismatch(f"kldiv_loss_grad: expected Loss@GRAD of shape {list(want)}, got "
                            f"{list(g.shape)}")
    t = Target.astype(F64)
    d = -np.exp(t) if log_target else -np.where(t > 0, t, 0.0)
    gv = g.astype(F64) if reduction == "none" else float(g.reshape(-1)[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"X@GRAD": (d * gv / _kl_divisor(X, reduction)).astype(X.dtype)}


def _kl_grad_lower(ctx):
    if not all(ctx.dtype(s) in _NATIVE for s in ("X", "Target", "Loss@GRAD")):
        return None
    X, Tg, G, T = ctx.inp("X"), ctx.inp("Target"), ctx.inp("Loss@GRAD"), ctx.T("X")
    reduction = ctx.attrs["reduction"]
    if reduction not in _REDUCTIONS:
        return None
    if reduction != "none" and ctx.rank("Loss@GRAD") > 1:
        return None
    d = f"-np.exp({Tg})" if ctx.attrs["log_target"] else \
        f"-np.where({Tg} > {T}(0), {Tg}, {T}(0))"
    if reduction == "none":
        return [f"{ctx.out('X@GRAD')} = {d} * {G}"]
    div = _kl_divisor_src(X, reduction, ctx.rank("X"))
    return [f"{ctx.out('X@GRAD')} = {d} * ({G}.reshape(1)[0] / {T}({div}))"]


register_op(
    "kldiv_loss", inputs=["X", "Target"], outputs=["Loss"], attrs=_KL_ATTRS, traits=[OPAQUE],
    infer_shape=_kl_infer, reference=_kl_ref, emit=Opaque(_kl_lower, host=True),
    grad=default_grad("kldiv_loss_grad", fwd_inputs=("X", "Target"), grad_outputs=("Loss",)),
    domain={"Target": "positive"},
    doc="Loss = Target * (log Target - X) (0 where Target <= 0), reduced by `reduction`.")

register_op(
    "kldiv_loss_grad", inputs=["X", "Target", "Loss@GRAD"], outputs=["X@GRAD?"],
    attrs=_KL_ATTRS, traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_kl_grad_ref, emit=Opaque(_kl_grad_lower, host=True), grad=None,
    doc="X@GRAD = -Target * Loss@GRAD (0 where Target <= 0), divided as the reduction divides.")



# ---- log_loss (Fluid 1.x) ----------------------------------------------------------------------
def _log_loss_infer(Predicted, Labels, *, epsilon):
    check_dtype(Predicted, FLOATS, "log_loss: input Predicted")
    _same_meta("log_loss", "Predicted", Predicted, "Labels", Labels)
    if Predicted.ndim != 2 or Predicted.shape[1] not in (1, -1):
        raise ShapeMismatch(f"log_loss: expected Predicted of shape [N, 1], got "
                            f"{list(Predicted.shape)}")
    return {"Loss": Predicted.with_(lod_level=0)}


def _log_loss_ref(Predicted, Labels, *, epsilon):
    _same_values("log_loss", Predicted, "Labels", Labels)
    p, lab = Predicted, Labels.astype(Predicted.dtype)
    e, one = Predicted.dtype.type(epsilon), Predicted.dtype.type(1)
    with np.errstate(all="ignore"):
        loss = -lab * np.log(p + e) - (one - lab) * np.log(one - p + e)
    return {"Loss": loss.astype(Predicted.dtype)}


def _log_loss_grad_ref(Predicted, Labels, *, epsilon, **kw):
    g = kw["Loss@GRAD"]
    _same_values("log_loss_grad", Predicted, "Labels", Labels)
    _same_values("log_loss_grad", Predicted, "Loss@GRAD", g)
    p, lab = Predicted, Labels.astype(Predicted.dtype)
    e, one = Predicted.dtype.type(epsilon), Predicted.dtype.type(1)
    with np.errstate(all="ignore"):
        d = g * (-lab / (p + e) + (one - lab) / (one - p + e))
    return {"Predicted@GRAD": d.astype(Predicted.dtype)}


_LOG_LOSS_ATTRS = {"epsilon": Float(1e-4, low=1e-6, high=1e-2)}

register_op(
    "log_loss", inputs=["Predicted", "Labels"], outputs=["Loss"], attrs=_LOG_LOSS_ATTRS,
    traits=[ELEMENTWISE], infer_shape=_log_loss_infer, reference=_log_loss_ref,
    emit=lambda dtypes_, **_: (
        "-{Labels} * _m.log({Predicted} + {T}({epsilon})) - ({T}(1) - {Labels}) * "
        "_m.log({T}(1) - {Predicted} + {T}({epsilon}))")
    if _native(dtypes_, "Predicted", "Labels") else None,
    grad=default_grad("log_loss_grad", fwd_inputs=("Predicted", "Labels"),
                      grad_outputs=("Loss",), wrt=("Predicted",)),
    domain={"Predicted": "unit"},
    doc="Loss = -Labels * log(Predicted + epsilon) - (1 - Labels) * log(1 - Predicted + "
        "epsilon), elementwise over [N, 1] (Fluid 1.x's log_loss).")

register_op(
    "log_loss_grad", inputs=["Predicted", "Labels", "Loss@GRAD"], outputs=["Predicted@GRAD?"],
    attrs=_LOG_LOSS_ATTRS, traits=[ELEMENTWISE],
    infer_shape=lambda Predicted, **_: {"Predicted@GRAD": Predicted},
    reference=_log_loss_grad_ref,
    emit=lambda dtypes_, **_: (
        "{Loss@GRAD} * (-{Labels} / ({Predicted} + {T}({epsilon})) + ({T}(1) - {Labels}) / "
        "({T}(1) - {Predicted} + {T}({epsilon})))")
    if _native(dtypes_, "Predicted", "Labels", "Loss@GRAD") else None,
    grad=None,
    doc="Predicted@GRAD = Loss@GRAD * (-Labels / (Predicted + epsilon) + (1 - Labels) / "
        "(1 - Predicted + epsilon)).")
