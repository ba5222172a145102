"""Fluid 1.x's linear-chain CRF: ``linear_chain_crf`` (with ``linear_chain_crf_grad``) and
``crf_decoding``, with Fluid 1.8's op names, slots and semantics.

- ``Emission`` holds the unscaled scores of the ``D`` tags, as rows ``[N, D]`` with a LoD
  (level 0: the sequences) or, with the ``Length`` input (``int64``, one length per sequence,
  ``[B]`` or ``[B, 1]``), as a padded batch ``[B, S, D]`` whose sequence ``b`` is its first
  ``Length[b]`` steps. ``Transition [D + 2, D]``: row 0 the start weights ``a``, row 1 the end
  weights ``b``, rows ``2 + i`` the weights ``w[i, j]`` of tag ``i`` followed by tag ``j``.
  ``Label`` (``int64``) holds a tag per row: ``[N, 1]`` with a LoD, ``[B, S]`` or ``[B, S, 1]``
  padded.
- ``linear_chain_crf``: a label sequence ``s`` of length ``L`` scores
  ``a[s_1] + b[s_L] + sum_l x_l[s_l] + sum_{l>1} w[s_{l-1}, s_l]``; ``LogLikelihood[i, 0]``
  (``[sequences, 1]``) is ``log Z - score(labels)``, the **negative** log-likelihood of
  sequence ``i`` (``Z``: the sum of ``exp(score)`` over all tag paths; 0 for an empty
  sequence), as Fluid's kernel computes it. The intermediates, which the gradient reads:
  ``EmissionExps = exp(Emission - the maximum of its row)`` (every row), ``TransitionExps =
  exp(Transition)``, ``Alpha`` the forward vectors, each row normalised to sum 1 (zeros on
  padding). A LoD form takes its sequences from Label's LoD (as Fluid does).
- ``linear_chain_crf_grad``: ``Emission@GRAD[t] = g * (P(tag at t) - onehot(label_t))`` and
  ``Transition@GRAD`` the same for the start, end and pair marginals, with ``g`` the sequence's
  ``LogLikelihood@GRAD``.
- ``crf_decoding``: ``ViterbiPath`` (``int64``) the best tag path of each sequence
  (``[N, 1]`` with Emission's LoD, or ``[B, S]`` padded with zeros); ties go to the lowest
  tag. With ``Label`` the output is 1 where the decoded tag equals the label and 0 elsewhere.
  Not differentiable.

Each target lowers the ops its own way (``codegen/<target>/lowerings/crf.py``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    SEQUENCE,
    GradOpSpec,
    Opaque,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import check_dtype

INT64 = np.dtype(np.int64)
INDEX = (np.dtype(np.int32), INT64)
FLOAT = (np.dtype(np.float32), np.dtype(np.float64))
TRAITS = (SEQUENCE, OPAQUE)


# ---- shapes -----------------------------------------------------------------------------------
def _check_metas(op, Emission, Transition, Label, Length):
    """``(padded, D)``: the form of the op's inputs, checked."""
    check_dtype(Emission, FLOAT, f"{op}: input Emission")
    check_dtype(Transition, (Emission.dtype,), f"{op}: input Transition")
    padded = Length is not None
    if padded:
        check_dtype(Length, INDEX, f"{op}: input Length")
    if Emission.ndim != (3 if padded else 2):
        form = "[B, S, D] (with Length)" if padded else "[N, D] (a LoD tensor, no Length)"
        raise ShapeMismatch(f"{op}: input Emission of shape {list(Emission.shape)}: expected "
                            f"{form}")
    d = Emission.shape[-1]
    t = Transition.shape
    if len(t) != 2 or (t[1] >= 0 and t[0] >= 0 and t[0] != t[1] + 2) or \
            (d >= 0 and t[1] >= 0 and t[1] != d):
        raise ShapeMismatch(f"{op}: input Transition of shape {list(t)}: expected [D + 2, D] "
                            f"with D = {d}, the tag count (Emission's last dim)")
    if Label is not None:
        check_dtype(Label, INDEX, f"{op}: input Label")
        lab = Label.shape
        if padded:
            ok = len(lab) == 2 or (len(lab) == 3 and lab[2] in (1, -1))
            want = "[B, S] or [B, S, 1]"
        else:
            ok = len(lab) == 2 and lab[1] in (1, -1)
            want = "[N, 1]"
        if not ok:
            raise ShapeMismatch(f"{op}: input Label of shape {list(lab)}: expected {want}")
    return padded, d


def _crf_infer(Emission, Transition, Label, Length=None, **_):
    padded, _d = _check_metas("linear_chain_crf", Emission, Transition, Label, Length)
    seqs = Emission.shape[0] if padded else -1
    plain = dict(lod_level=0)
    return {"Alpha": Emission.with_(**plain), "EmissionExps": Emission.with_(**plain),
            "TransitionExps": Transition.with_(**plain),
            "LogLikelihood": VarMeta((seqs, 1), Emission.dtype)}


def _crf_grad_infer(Emission, Transition, **_):
    return {"Emission@GRAD": Emission, "Transition@GRAD": Transition}


def _decode_infer(Emission, Transition, Label=None, Length=None, **_):
    padded, _d = _check_metas("crf_decoding", Emission, Transition, Label, Length)
    if padded:
        return {"ViterbiPath": VarMeta(Emission.shape[:2], INT64)}
    return {"ViterbiPath": VarMeta((Emission.shape[0], 1), INT64, lod_level=1)}


# ---- the sequences ---------------------------------------------------------------------------
def _sequences(op, x, ctx, lod_slot, Length):
    """``(rows [R, D], [(begin, end)])``: the emission as rows and its sequences."""
    if Length is not None:
        if x.ndim != 3:
            raise ShapeMismatch(f"{op}: input Emission of shape {list(x.shape)}: expected "
                                f"[B, S, D] with Length")
        lens = np.asarray(Length).reshape(-1)
        b, s = x.shape[:2]
        if lens.shape[0] != b:
            raise ShapeMismatch(f"{op}: input Length holds {lens.shape[0]} lengths: expected "
                                f"one per sequence of Emission, {b}")
        if lens.size and (lens.min() < 0 or lens.max() > s):
            raise ShapeMismatch(f"{op}: input Length {lens.tolist()}: expected lengths in "
                                f"0..{s} (Emission's padded length)")
        return x.reshape(b * s, x.shape[2]), [(i * s, i * s + int(n)) for i, n in
                                               enumerate(lens)]
    if x.ndim != 2:
        raise ShapeMismatch(f"{op}: input Emission of shape {list(x.shape)}: expected [N, D] "
                            f"without Length")
    lod = ctx.input_lod(lod_slot) if ctx is not None else []
    if not lod:
        raise ShapeMismatch(f"{op}: input {lod_slot} must be a LoD tensor (the sequences): "
                            f"expected LoD offsets (lod_level 1), got a tensor without LoD, "
                            f"and no Length input")
    offs = [int(o) for o in lod[0]]
    if offs[0] != 0 or offs[-1] != x.shape[0] or any(a > b for a, b in zip(offs, offs[1:])):
        raise ShapeMismatch(f"{op}: input {lod_slot}'s LoD {offs}: expected offsets from 0 to "
                            f"Emission's {x.shape[0]} rows")
    return x, list(zip(offs[:-1], offs[1:]))


def _labels(op, Label, rows: int, D: int) -> np.ndarray:
    lab = np.asarray(Label).reshape(-1)
    if lab.shape[0] != rows:
        raise ShapeMismatch(f"{op}: input Label holds {lab.shape[0]} labels: expected one per "
                            f"row of Emission, {rows}")
    return lab.astype(np.int64)


def _check_transition(op, w, D):
    if w.shape != (D + 2, D):
        raise ShapeMismatch(f"{op}: input Transition of shape {list(w.shape)}: expected "
                            f"{[D + 2, D]} (D = {D} tags)")


def _check_range(op, lab, D, spans):
    for b, e in spans:
        bad = (lab[b:e] < 0) | (lab[b:e] >= D)
        if bad.any():
            raise IndexError(f"{op}: label {int(lab[b:e][bad][0])} is out of range: expected a "
                             f"tag in 0..{D - 1}")


def _unit(v: np.ndarray, op: str) -> tuple:
    t = float(v.sum())
    if not t > 0.0:
        raise ValueError(f"{op}: the probabilities of all tag paths underflow to 0 (scores "
                         f"too far apart for the type)")
    return v / t, t


# ---- references -------------------------------------------------------------------------------
def _crf_ref(Emission, Transition, Label, Length=None, *, ctx=None, **_):
    op = "linear_chain_crf"
    x, spans = _sequences(op, Emission, ctx, "Label", Length)
    D = x.shape[1]
    _check_transition(op, Transition, D)
    lab = _labels(op, Label, x.shape[0], D)
    _check_range(op, lab, D, spans)
    x64, w = x.astype(np.float64), Transition.astype(np.float64)
    rmax = x64.max(axis=1, keepdims=True) if D else np.zeros((x.shape[0], 1))
    eexp = np.exp(x64 - rmax)
    wexp = np.exp(w)
    alpha = np.zeros_like(x64)
    nll = np.zeros((len(spans), 1))
    for i, (b, e) in enumerate(spans):
        if e == b:
            continue
        alpha[b], t = _unit(wexp[0] * eexp[b], op)
        logz = rmax[b, 0] + np.log(t)
        for k in range(b + 1, e):
            alpha[k], t = _unit(eexp[k] * (alpha[k - 1] @ wexp[2:]), op)
            logz += rmax[k, 0] + np.log(t)
        logz += np.log(alpha[e - 1] @ wexp[1])
        s = lab[b:e]
        score = w[0, s[0]] + w[1, s[-1]] + x64[np.arange(b, e), s].sum() + \
            w[2 + s[:-1], s[1:]].sum()
        nll[i, 0] = logz - score
    T = Emission.dtype
    return {"Alpha": alpha.reshape(Emission.shape).astype(T),
            "EmissionExps": eexp.reshape(Emission.shape).astype(T),
            "TransitionExps": wexp.astype(T), "LogLikelihood": nll.astype(T)}


def _crf_grad_ref(Emission, Transition, Label, Alpha, EmissionExps, TransitionExps,
                  Length=None, *, ctx=None, **kw):
    op = "linear_chain_crf_grad"
    x, spans = _sequences(op, EmissionExps, ctx, "Label", Length)
    D = x.shape[1]
    _check_transition(op, TransitionExps, D)
    lab = _labels(op, Label, x.shape[0], D)
    _check_range(op, lab, D, spans)
    g = np.asarray(kw["LogLikelihood@GRAD"], np.float64).reshape(-1)
    if g.shape[0] != len(spans):
        raise ShapeMismatch(f"{op}: LogLikelihood@GRAD holds {g.shape[0]} values: expected one "
                            f"per sequence, {len(spans)}")
    eexp = x.astype(np.float64)
    wexp = TransitionExps.astype(np.float64)
    alpha = np.asarray(Alpha, np.float64).reshape(x.shape)
    dx, dw = np.zeros_like(eexp), np.zeros_like(wexp)
    for i, (b, e) in enumerate(spans):
        L = e - b
        if L == 0:
            continue
        beta = np.zeros((L, D))
        beta[L - 1], _ = _unit(wexp[1].copy(), op)
        for k in range(L - 2, -1, -1):
            beta[k], _ = _unit(wexp[2:] @ (eexp[b + k + 1] * beta[k + 1]), op)
        marg = alpha[b:e] * beta
        marg /= marg.sum(axis=1, keepdims=True)
        s = lab[b:e]
        onehot = np.zeros((L, D))
        onehot[np.arange(L), s] = 1.0
        dx[b:e] = g[i] * (marg - onehot)
        dw[0] += g[i] * (marg[0] - onehot[0])
        dw[1] += g[i] * (marg[-1] - onehot[-1])
        for k in range(1, L):
            p = alpha[b + k - 1][:, None] * wexp[2:] * (eexp[b + k] * beta[k])[None, :]
            dw[2:] += g[i] * p / p.sum()
            dw[2 + s[k - 1], s[k]] -= g[i]
    return {"Emission@GRAD": dx.reshape(Emission.shape).astype(Emission.dtype),
            "Transition@GRAD": dw.astype(Transition.dtype)}


def _decode_ref(Emission, Transition, Label=None, Length=None, *, ctx=None, **_):
    op = "crf_decoding"
    x, spans = _sequences(op, Emission, ctx, "Emission", Length)
    D = x.shape[1]
    _check_transition(op, Transition, D)
    w = Transition.astype(np.float64)
    x64 = x.astype(np.float64)
    path = np.zeros(x.shape[0], np.int64)
    for b, e in spans:
        if e == b:
            continue
        best = w[0] + x64[b]
        back = []
        for k in range(b + 1, e):
            cand = best[:, None] + w[2:]           # [from, to]
            arg = np.argmax(cand, axis=0)          # the first (lowest) tag on ties
            back.append(arg)
            best = cand[arg, np.arange(D)] + x64[k]
        tag = int(np.argmax(best + w[1]))
        path[e - 1] = tag
        for k in range(e - 1, b, -1):
            tag = int(back[k - b - 1][tag])
            path[k - 1] = tag
    if Label is not None:
        lab = _labels(op, Label, x.shape[0], D)
        inside = np.zeros(x.shape[0], bool)
        for b, e in spans:
            inside[b:e] = True
        path = np.where(inside & (path == lab), 1, 0).astype(np.int64)
    shape = Emission.shape[:2] if Length is not None else (x.shape[0], 1)
    return {"ViterbiPath": path.reshape(shape)}


# ---- registration -----------------------------------------------------------------------------
def _crf_grad_maker(op):
    ins = {s: op.input(s) for s in ("Emission", "Transition", "Label", "Length")
           if op.input(s)}
    ins.update({s: op.output(s) for s in ("Alpha", "EmissionExps", "TransitionExps")})
    ins["LogLikelihood@GRAD"] = [grad_var_name(n) for n in op.output("LogLikelihood")]
    outs = {"Emission@GRAD": [grad_var_name(n) for n in op.input("Emission")],
            "Transition@GRAD": [grad_var_name(n) for n in op.input("Transition")]}
    return [GradOpSpec("linear_chain_crf_grad", ins, outs, {})]


def _no_lod(*slots):
    return lambda lods, **_: {s: [] for s in slots}


register_op(
    "linear_chain_crf", inputs=["Emission", "Transition", "Label", "Length?"],
    outputs=["Alpha~", "EmissionExps~", "TransitionExps~", "LogLikelihood"], attrs={},
    traits=TRAITS, infer_shape=_crf_infer, reference=_crf_ref,
    emit=Opaque(), grad=_crf_grad_maker,
    out_lod=_no_lod("Alpha", "EmissionExps", "TransitionExps", "LogLikelihood"),
    doc="LogLikelihood [sequences, 1] = log Z - score(Label): the negative log-likelihood of "
        "each sequence's labels under a linear-chain CRF with emission scores Emission and "
        "Transition [D + 2, D] (start row, end row, then tag-to-tag weights); sequences from "
        "Label's LoD, or padded with Length.")
register_op(
    "linear_chain_crf_grad",
    inputs=["Emission", "Transition", "Label", "Alpha", "EmissionExps", "TransitionExps",
            "Length?", "LogLikelihood@GRAD"],
    outputs=["Emission@GRAD?", "Transition@GRAD?"], attrs={}, traits=TRAITS,
    infer_shape=_crf_grad_infer, reference=_crf_grad_ref,
    emit=Opaque(), grad=None,
    out_lod=lambda lods, **_: {"Emission@GRAD": lods.get("Emission", []),
                               "Transition@GRAD": []})
register_op(
    "crf_decoding", inputs=["Emission", "Transition", "Label?", "Length?"],
    outputs=["ViterbiPath"], attrs={}, traits=TRAITS, infer_shape=_decode_infer,
    reference=_decode_ref, emit=Opaque(), grad=None,
    out_lod=lambda lods, **_: {"ViterbiPath": [] if "Length" in lods
                               else lods.get("Emission", [])},
    doc="ViterbiPath (int64) = the best tag path of each sequence of Emission under the CRF "
        "weights Transition [D + 2, D]; with Label, 1 where it equals the label, else 0.")
