"""Fluid 1.8's ``center_loss`` and its gradient.

``Loss[i] = |X[i] - Centers[Label[i]]|^2 / 2`` (``[N, 1]``), ``SampleCenterDiff = X -
Centers[Label]``. With ``need_update`` the op also moves the centres (``CentersOut``, which
Fluid binds to the ``Centers`` parameter itself): ``c_k += rate * sum over the samples of class
k of (x_i - c_k) / (1 + their count)``, ``rate`` being ``CenterUpdateRate``. The gradient reaches
``X`` only: ``SampleCenterDiff * Loss@GRAD``. Runs its NumPy reference (``emit`` is ``None``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    Bool,
    GradOpSpec,
    Int,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

_ATTRS = {"cluster_num": Int(2, low=2, high=4), "need_update": Bool(False)}


def _infer(X, Label, Centers, CenterUpdateRate, **_):
    check_dtype(X, FLOATS, "center_loss: input X")
    if X.ndim != 2 or Centers.ndim != 2:
        raise ShapeMismatch(f"center_loss: expected X [N, D] and Centers [classes, D], got "
                            f"{list(X.shape)} and {list(Centers.shape)}")
    return {"SampleCenterDiff": X, "Loss": VarMeta((X.shape[0], 1), X.dtype),
            "CentersOut": Centers}


def _ref(X, Label, Centers, CenterUpdateRate, *, cluster_num, need_update):
    lab = Label.reshape(-1).astype(np.int64)
    if lab.size != X.shape[0]:
        raise ShapeMismatch(f"center_loss: expected one label per row ({X.shape[0]}), got "
                            f"{lab.size}")
    if lab.size and (lab.min() < 0 or lab.max() >= Centers.shape[0]):
        bad = lab[(lab < 0) | (lab >= Centers.shape[0])][0]
        raise IndexError(f"center_loss: label {bad} out of range [0, {Centers.shape[0]})")
    diff = X.astype(np.float64) - Centers.astype(np.float64)[lab]
    loss = 0.5 * (diff ** 2).sum(axis=1, keepdims=True)
    centers = Centers.astype(np.float64).copy()
    if need_update:
        acc = np.zeros(centers.shape)
        np.add.at(acc, lab, diff)
        count = np.bincount(lab, minlength=centers.shape[0]).reshape(-1, 1)
        centers += float(CenterUpdateRate.reshape(-1)[0]) * acc / (1.0 + count)
    return {"SampleCenterDiff": diff.astype(X.dtype), "Loss": loss.astype(X.dtype),
            "CentersOut": centers.astype(Centers.dtype)}


def _grad_ref(SampleCenterDiff, **kw):
    g = kw["Loss@GRAD"].reshape(-1, 1)
    return {"X@GRAD": (SampleCenterDiff * g).astype(SampleCenterDiff.dtype)}


register_op(
    "center_loss", inputs=["X", "Label", "Centers", "CenterUpdateRate"],
    outputs=["SampleCenterDiff~", "Loss", "CentersOut"], attrs=_ATTRS, traits=[OPAQUE],
    infer_shape=_infer, reference=_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "center_loss_grad", {"SampleCenterDiff": op.output("SampleCenterDiff"),
                             "Loss@GRAD": [grad_var_name(v) for v in op.output("Loss")]},
        {"X@GRAD": [grad_var_name(v) for v in op.input("X")]})],
    doc="Half the squared distance of each sample to its class centre; moves the centres.")
register_op(
    "center_loss_grad", inputs=["SampleCenterDiff", "Loss@GRAD"], outputs=["X@GRAD?"],
    traits=[OPAQUE], infer_shape=lambda SampleCenterDiff, **_: {"X@GRAD": SampleCenterDiff},
    reference=_grad_ref, emit=None, grad=None, doc="X@GRAD = SampleCenterDiff * Loss@GRAD.")
