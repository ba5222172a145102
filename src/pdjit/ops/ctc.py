"""Connectionist temporal classification: Fluid 1.8's ``warpctc`` (the CTC loss, with
``warpctc_grad``) and ``ctc_align`` (the collapse step of greedy decoding), over one-level LoD
tensors.

- ``warpctc(Logits [T_total, K] LoD, Label [L_total, 1] int32 LoD; blank, norm_by_times) ->
  Loss [S, 1], WarpCTCGrad [T_total, K]``: for each sequence ``i``, ``Loss[i] = -log p(label_i |
  logits_i)``, the probability summed over every alignment of the label (blanks anywhere,
  repeats collapsed) under per-step softmaxes of the logits; computed with the forward and
  backward recursions in log space. ``WarpCTCGrad`` is the gradient of each loss with respect
  to its logits (``softmax - posterior of each class``), divided by the sequence's length with
  ``norm_by_times`` (which, as in Fluid, scales only the gradient). A label that no alignment
  fits (longer than the steps allow) gives an infinite loss and a zero gradient.
  ``warpctc_grad`` multiplies ``WarpCTCGrad`` by each sequence's ``Loss@GRAD``.
- ``ctc_align(Input [T_total, 1] ints LoD; blank, merge_repeated) -> Output``: per sequence,
  repeated tokens merged (with ``merge_repeated``) and blanks removed; Output's LoD holds the
  new lengths. (Where every sequence comes out empty Fluid writes a single ``-1`` row; here the
  output is empty, its LoD all zeros, so that rows and LoD agree.)

Both run their NumPy references as plan steps of their own (``emit`` is ``None``); the padded
(``LogitsLength`` / ``InputLength``) forms of Fluid 1.8 are not supported: the layers say so.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    SEQUENCE,
    Bool,
    GradOpSpec,
    Int,
    ValueDependentLoD,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, INDEX, check_dtype
from pdjit.ops.sequence_fluid import one_level_offsets as _offsets

TRAITS = (SEQUENCE, OPAQUE)
NEG_INF = -np.inf


def _lse(*terms):
    m = np.max(terms, axis=0)
    with np.errstate(invalid="ignore"):
        out = m + np.log(np.sum([np.exp(t - m) for t in terms], axis=0))
    return np.where(np.isneginf(m), NEG_INF, out)


def _log_softmax(z):
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def ctc_one(logits: np.ndarray, label: np.ndarray, blank: int):
    """(-log p, d(-log p)/d logits) of one sequence, float64."""
    t_len, k = logits.shape
    if t_len == 0:
        return (0.0 if label.size == 0 else np.inf), np.zeros((0, k))
    logy = _log_softmax(logits)
    ext = np.full(2 * label.size + 1, blank, dtype=np.int64)
    ext[1::2] = label
    s_len = ext.size
    skip = np.zeros(s_len, bool)          # s may come from s - 2
    skip[2:] = (ext[2:] != blank) & (ext[2:] != ext[:-2])
    alpha = np.full((t_len, s_len), NEG_INF)
    alpha[0, 0] = logy[0, ext[0]]
    if s_len > 1:
        alpha[0, 1] = logy[0, ext[1]]
    for t in range(1, t_len):
        prev = alpha[t - 1]
        s1 = np.concatenate([[NEG_INF], prev[:-1]])
        s2 = np.where(skip, np.concatenate([[NEG_INF, NEG_INF], prev[:-2]]), NEG_INF)
        alpha[t] = _lse(prev, s1, s2) + logy[t, ext]
    beta = np.full((t_len, s_len), NEG_INF)
    beta[-1, -1] = logy[-1, ext[-1]]
    if s_len > 1:
        beta[-1, -2] = logy[-1, ext[-2]]
    skip_next = np.zeros(s_len, bool)     # s may go to s + 2
    skip_next[:-2] = skip[2:]
    for t in range(t_len - 2, -1, -1):
        nxt = beta[t + 1]
        s1 = np.concatenate([nxt[1:], [NEG_INF]])
        s2 = np.where(skip_next, np.concatenate([nxt[2:], [NEG_INF, NEG_INF]]), NEG_INF)
        beta[t] = _lse(nxt, s1, s2) + logy[t, ext]
    ends = [alpha[-1, -1]] + ([alpha[-1, -2]] if s_len > 1 else [])
    logp = float(_lse(*ends))
    if not np.isfinite(logp):
        return np.inf, np.zeros((t_len, k))
    gamma = alpha + beta - logy[:, ext]          # log of the posterior mass per (t, s) * p
    post = np.zeros((t_len, k))
    for c in np.unique(ext):
        post[:, c] = np.exp(_lse(*[gamma[:, s] for s in np.nonzero(ext == c)[0]]) - logp)
    return -logp, np.exp(logy) - post


# ---- warpctc ---------------------------------------------------------------------------------
def _ctc_infer(Logits, Label, *, blank, norm_by_times):
    check_dtype(Logits, FLOATS, "warpctc: input Logits")
    check_dtype(Label, INDEX, "warpctc: input Label")
    if Logits.ndim != 2:
        raise ShapeMismatch(f"warpctc: expected Logits of rank 2 ([steps, classes]), got "
                            f"{list(Logits.shape)}")
    if Logits.shape[1] >= 0 and not 0 <= blank < Logits.shape[1]:
        raise ShapeMismatch(f"warpctc: expected blank in [0, {Logits.shape[1]}), got {blank}")
    return {"Loss": VarMeta((-1, 1), Logits.dtype),
            "WarpCTCGrad": Logits.with_(lod_level=max(Logits.lod_level, 1))}


def _ctc_ref(Logits, Label, *, blank, norm_by_times, ctx):
    op = "warpctc"
    x_offs = _offsets(ctx, "Logits", Logits.shape[0], op)
    y_offs = _offsets(ctx, "Label", Label.shape[0], op)
    if len(x_offs) != len(y_offs):
        raise ShapeMismatch(f"{op}: expected as many label sequences as logit sequences "
                            f"({len(x_offs) - 1}), got {len(y_offs) - 1}")
    k = Logits.shape[1]
    if not 0 <= blank < k:
        raise ShapeMismatch(f"{op}: expected blank in [0, {k}), got {blank}")
    labels = Label.reshape(-1)
    bad = (labels < 0) | (labels >= k) | (labels == blank)
    if bad.any():
        raise ShapeMismatch(f"{op}: label {labels[bad][0]}: expected classes in [0, {k}) other "
                            f"than blank {blank}")
    loss = np.zeros((len(x_offs) - 1, 1))
    grad = np.zeros(Logits.shape)
    for i in range(len(x_offs) - 1):
        a, b = x_offs[i], x_offs[i + 1]
        nll, g = ctc_one(Logits[a:b].astype(np.float64), labels[y_offs[i]:y_offs[i + 1]], blank)
        loss[i, 0] = nll
        grad[a:b] = g / (b - a) if norm_by_times and b > a else g
    return {"Loss": loss.astype(Logits.dtype), "WarpCTCGrad": grad.astype(Logits.dtype)}


def _ctc_grad_ref(WarpCTCGrad, Logits, ctx, **kw):
    g = kw["Loss@GRAD"]
    offs = _offsets(ctx, "Logits", Logits.shape[0], "warpctc_grad")
    if g.size != len(offs) - 1:
        raise ShapeMismatch(f"warpctc_grad: expected Loss@GRAD with one value per sequence "
                            f"({len(offs) - 1}), got {list(g.shape)}")
    per_row = np.repeat(g.reshape(-1), np.diff(offs))
    return {"Logits@GRAD": (WarpCTCGrad * per_row[:, None]).astype(Logits.dtype)}


_CTC_ATTRS = {"blank": Int(0, low=0, high=0), "norm_by_times": Bool(False)}
register_op(
    "warpctc", inputs=["Logits", "Label"], outputs=["WarpCTCGrad~", "Loss"],
    attrs=_CTC_ATTRS, traits=TRAITS, infer_shape=_ctc_infer, reference=_ctc_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "warpctc_grad", {"WarpCTCGrad": op.output("WarpCTCGrad"), "Logits": op.input("Logits"),
                         "Loss@GRAD": [grad_var_name(n) for n in op.output("Loss")]},
        {"Logits@GRAD": [grad_var_name(n) for n in op.input("Logits")]},
        {"norm_by_times": op.attr("norm_by_times")})],
    out_lod=lambda lods, **_: {"Loss": [], "WarpCTCGrad": lods["Logits"]},
    doc="Loss = -log p(Label | softmax(Logits)) per sequence (CTC); WarpCTCGrad its gradient.")
register_op(
    "warpctc_grad", inputs=["WarpCTCGrad", "Logits", "Loss@GRAD"], outputs=["Logits@GRAD?"],
    attrs={"norm_by_times": Bool(False)}, traits=TRAITS,
    infer_shape=lambda Logits, **_: {"Logits@GRAD": Logits}, reference=_ctc_grad_ref,
    emit=None, grad=None, out_lod=lambda lods, **_: {"Logits@GRAD": lods["Logits"]},
    doc="Logits@GRAD = WarpCTCGrad times each sequence's Loss@GRAD.")


# ---- ctc_align -------------------------------------------------------------------------------
def _align_infer(Input, *, blank, merge_repeated, padding_value):
    check_dtype(Input, INDEX, "ctc_align: input Input")
    return {"Output": Input.with_(shape=(-1,) + tuple(Input.shape[1:]), lod_level=1)}


def _align_ref(Input, *, blank, merge_repeated, padding_value, ctx):
    offs = _offsets(ctx, "Input", Input.shape[0], "ctc_align")
    ids = Input.reshape(-1)
    keep = ids != blank
    if merge_repeated:
        first = np.ones(ids.size, bool)
        first[1:] = ids[1:] != ids[:-1]
        first[offs[:-1][offs[:-1] < ids.size]] = True   # a sequence's first token is new
        keep &= first
    kept = [int(keep[a:b].sum()) for a, b in zip(offs[:-1], offs[1:])]
    ctx.set_output_lod("Output", [[0] + np.cumsum(kept, dtype=np.int64).tolist()])
    return {"Output": ids[keep].reshape(-1, 1).astype(Input.dtype)}


def _align_lod(lods, **_):
    raise ValueDependentLoD("ctc_align's LoD depends on the tokens")


register_op(
    "ctc_align", inputs=["Input"], outputs=["Output"],
    attrs={"blank": Int(0, low=0, high=2), "merge_repeated": Bool(True),
           "padding_value": Int(0, low=0, high=0)},
    traits=TRAITS, infer_shape=_align_infer, reference=_align_ref, emit=None, grad=None,
    out_lod=_align_lod,
    doc="Per sequence: repeated tokens merged (merge_repeated) and blanks removed.")
