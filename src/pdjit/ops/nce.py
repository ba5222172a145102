"""Fluid 1.8's ``nce`` (noise-contrastive estimation) and ``nce_grad``.

For each sample ``i`` the op scores its ``num_true`` true classes (``Label [N, num_true]``) and
``num_neg_samples`` negative classes drawn from the sampler (``sampler`` 0: uniform over
``num_total_classes``; 1: log-uniform, class ``v`` with probability ``log((v + 2) / (v + 1)) /
log(num_total_classes + 1)``), or the fixed ``custom_neg_classes`` when given (the same for
every sample). With ``o = sigmoid(Weight[c] . x + Bias[c])`` and ``b = num_neg_samples *
q(c)`` (``q`` the sampler's probability of ``c``): ``Cost[i] = SampleWeight[i] * (sum over true
c of -log(o / (o + b)) + sum over negatives of -log(b / (o + b)))``. ``SampleLabels`` holds the
classes (true first), ``SampleLogits`` their ``o``; the grad op reads both. The draws come from
the run's random stream (``seed`` fixes them). Runs its NumPy reference (``emit`` is ``None``);
the ``custom_dist`` sampler (2) is refused.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import random as prandom
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    RANDOM,
    REQUIRED,
    Bool,
    GradOpSpec,
    Int,
    Ints,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

INT64 = np.dtype(np.int64)
_ATTRS = {"num_total_classes": Int(REQUIRED, low=4, high=8),
          "num_neg_samples": Int(10, low=1, high=3),
          "custom_neg_classes": Ints([], choices=([], [0, 1])),
          "sampler": Int(0, one_of=(0, 1, 2), choices=(0, 1)),
          "seed": Int(0, low=0, high=0),
          "is_sparse": Bool(False), "remote_prefetch": Bool(False), "is_test": Bool(False)}


def _prob(classes: np.ndarray, sampler: int, total: int) -> np.ndarray:
    if sampler == 0:
        return np.full(classes.shape, 1.0 / total)
    return np.log((classes + 2.0) / (classes + 1.0)) / np.log(total + 1.0)


def _infer(Input, Label, Weight, Bias=None, SampleWeight=None, *, num_neg_samples,
           custom_neg_classes, **_):
    check_dtype(Input, FLOATS, "nce: input Input")
    if Label.dtype != INT64:
        raise ShapeMismatch(f"nce: expected Label of dtype int64, got {Label.dtype}")
    if Input.ndim != 2 or Weight.ndim != 2 or Label.ndim != 2:
        raise ShapeMismatch(f"nce: expected Input [N, D], Label [N, num_true] and Weight "
                            f"[classes, D], got {list(Input.shape)}, {list(Label.shape)} and "
                            f"{list(Weight.shape)}")
    neg = len(custom_neg_classes) if custom_neg_classes else num_neg_samples
    width = Label.shape[1] + neg if Label.shape[1] >= 0 else -1
    return {"Cost": VarMeta((Input.shape[0], 1), Input.dtype),
            "SampleLogits": VarMeta((Input.shape[0], width), Input.dtype),
            "SampleLabels": VarMeta((Input.shape[0], width), INT64)}


def _samples(Label, n, *, num_total_classes, num_neg_samples, custom_neg_classes, sampler, ctx):
    if sampler not in (0, 1):
        raise ShapeMismatch(f"nce: sampler {sampler}: only 0 (uniform) and 1 (log-uniform) are "
                            f"supported")
    if custom_neg_classes:
        neg = np.tile(np.asarray(custom_neg_classes, np.int64), (n, 1))
    else:
        u = prandom.uniform01(ctx.rng_key(), n * num_neg_samples).reshape(n, num_neg_samples)
        if sampler == 0:
            neg = np.floor(u * num_total_classes).astype(np.int64)
        else:
            neg = (np.exp(u * np.log(num_total_classes + 1.0)).astype(np.int64) - 1)
        neg = np.clip(neg, 0, num_total_classes - 1)
    return np.concatenate([Label.astype(np.int64), neg], axis=1)


def _check(labels, Weight, total):
    if labels.size and (labels.min() < 0 or labels.max() >= min(total, Weight.shape[0])):
        bad = labels[(labels < 0) | (labels >= min(total, Weight.shape[0]))][0]
        raise IndexError(f"nce: class {bad} out of range [0, {min(total, Weight.shape[0])})")


def _ref(Input, Label, Weight, Bias=None, SampleWeight=None, *, num_total_classes,
         num_neg_samples, custom_neg_classes, sampler, ctx, **_):
    n = Input.shape[0]
    labels = _samples(Label, n, num_total_classes=num_total_classes,
                      num_neg_samples=num_neg_samples, custom_neg_classes=custom_neg_classes,
                      sampler=sampler, ctx=ctx)
    _check(labels, Weight, num_total_classes)
    z = np.einsum("nd,nkd->nk", Input.astype(np.float64), Weight.astype(np.float64)[labels])
    if Bias is not None:
        z = z + Bias.reshape(-1).astype(np.float64)[labels]
    o = 1.0 / (1.0 + np.exp(-z))
    b = num_neg_samples * _prob(labels, sampler, num_total_classes)
    true = np.arange(labels.shape[1]) < Label.shape[1]
    cost = np.where(true, -np.log(o / (o + b)), -np.log(b / (o + b))).sum(axis=1)
    if SampleWeight is not None:
        cost = cost * SampleWeight.reshape(-1)
    return {"Cost": cost.reshape(-1, 1).astype(Input.dtype),
            "SampleLogits": o.astype(Input.dtype), "SampleLabels": labels}


def _grad_ref(Input, Label, Weight, SampleLogits, SampleLabels, Bias=None, SampleWeight=None, *,
              num_total_classes, num_neg_samples, sampler, **kw):
    g = kw["Cost@GRAD"].reshape(-1, 1).astype(np.float64)
    if SampleWeight is not None:
        g = g * SampleWeight.reshape(-1, 1)
    o, labels = SampleLogits.astype(np.float64), SampleLabels
    b = num_neg_samples * _prob(labels, sampler, num_total_classes)
    true = np.arange(labels.shape[1]) < Label.shape[1]
    dz = np.where(true, -b * (1 - o) / (o + b), o * (1 - o) / (o + b)) * g
    out = {"Input@GRAD": np.einsum("nk,nkd->nd", dz, Weight.astype(np.float64)[labels])
           .astype(Input.dtype)}
    dw = np.zeros(Weight.shape)
    np.add.at(dw, labels.reshape(-1),
              (dz[:, :, None] * Input.astype(np.float64)[:, None, :]).reshape(-1, Weight.shape[1]))
    out["Weight@GRAD"] = dw.astype(Weight.dtype)
    if Bias is not None:
        db = np.zeros(Bias.size)
        np.add.at(db, labels.reshape(-1), dz.reshape(-1))
        out["Bias@GRAD"] = db.reshape(Bias.shape).astype(Bias.dtype)
    return out


def _grad(op):
    ins = {s: op.input(s) for s in ("Input", "Label", "Weight", "Bias", "SampleWeight")
           if op.input(s)}
    ins.update(SampleLogits=op.output("SampleLogits"), SampleLabels=op.output("SampleLabels"))
    ins["Cost@GRAD"] = [grad_var_name(n) for n in op.output("Cost")]
    outs = {f"{s}@GRAD": [grad_var_name(n) for n in op.input(s)]
            for s in ("Input", "Weight", "Bias") if op.input(s)}
    return [GradOpSpec("nce_grad", ins, outs,
                       {k: v for k, v in op.all_attrs().items() if k in _ATTRS})]


register_op(
    "nce", inputs=["Input", "Label", "Weight", "Bias?", "SampleWeight?"],
    outputs=["Cost", "SampleLogits~", "SampleLabels~"], attrs=_ATTRS, traits=[OPAQUE, RANDOM],
    infer_shape=_infer, reference=_ref, emit=None, grad=_grad,
    doc="Noise-contrastive estimation loss over true and sampled negative classes.")
register_op(
    "nce_grad",
    inputs=["Input", "Label", "Weight", "SampleLogits", "SampleLabels", "Bias?", "SampleWeight?",
            "Cost@GRAD"],
    outputs=["Input@GRAD?", "Weight@GRAD?", "Bias@GRAD?"], attrs=dict(_ATTRS), traits=[OPAQUE],
    infer_shape=lambda Input, Weight, Bias=None, **_: {
        "Input@GRAD": Input, "Weight@GRAD": Weight, **({"Bias@GRAD": Bias} if Bias else {})},
    reference=_grad_ref, emit=None, grad=None, doc="Gradients of nce.")
