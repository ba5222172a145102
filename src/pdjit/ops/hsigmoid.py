"""Fluid 1.8's ``hierarchical_sigmoid`` (the ``hsigmoid`` layer) and its gradient.

Each class is a leaf of a binary tree whose inner nodes are rows of ``W`` (and ``Bias``). The
default tree numbers class ``c`` as ``code = c + num_classes``: its path has
``floor(log2(code))`` nodes, node ``j`` being row ``(code >> (j + 1)) - 1`` with the bit
``(code >> j) & 1``. A custom tree gives, per sample, the rows (``PathTable``, ended by a
negative entry) and bits (``PathCode``). With ``z_j = clip(W[row_j] . x + Bias[row_j], -40,
40)``: ``Out = sum_j softplus(z_j) - bit_j * z_j`` over the path, plus ``log 2`` for each of the
``code_length - path_length`` unused positions of ``PreOut`` (Fluid's kernel adds them: a
constant that no gradient sees). ``PreOut [N, code_length]`` holds ``softplus(z)`` (0 padded
before the softplus), which the grad op reads: ``dz_j = (sigmoid(z_j) - bit_j) * Out@GRAD``.
``code_length`` is the bit length of ``num_classes - 1`` (default tree) or ``PathTable``'s
width. Runs its NumPy reference (``emit`` is ``None``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    Bool,
    GradOpSpec,
    Int,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

INT64 = np.dtype(np.int64)
_ATTRS = {"num_classes": Int(REQUIRED, low=2, high=6), "is_sparse": Bool(False),
          "remote_prefetch": Bool(False)}


def _paths(Label, PathTable, PathCode, num_classes, rows_w):
    """(rows [N, L], bits [N, L], valid [N, L]) of each sample's path."""
    lab = Label.reshape(-1).astype(np.int64)
    if PathTable is not None:
        if PathCode is None or PathCode.shape != PathTable.shape:
            raise ShapeMismatch("hierarchical_sigmoid: expected PathCode of PathTable's shape, "
                                f"got {None if PathCode is None else list(PathCode.shape)} and "
                                f"{list(PathTable.shape)}")
        rows = PathTable.astype(np.int64)
        valid = np.cumprod(rows >= 0, axis=1).astype(bool)
        bits = PathCode.astype(np.int64)
    else:
        if lab.size and (lab.min() < 0 or lab.max() >= num_classes):
            bad = lab[(lab < 0) | (lab >= num_classes)][0]
            raise IndexError(f"hierarchical_sigmoid: label {bad} out of range "
                             f"[0, {num_classes})")
        length = int(num_classes - 1).bit_length()
        code = (lab + num_classes).reshape(-1, 1)
        j = np.arange(length).reshape(1, -1)
        plen = np.array([int(c).bit_length() - 1 for c in code.reshape(-1)]).reshape(-1, 1)
        valid = j < plen
        rows = (code >> (j + 1)) - 1
        bits = (code >> j) & 1
    if valid.any() and (rows[valid].max() >= rows_w):
        raise IndexError(f"hierarchical_sigmoid: tree node {rows[valid].max()} out of range for "
                         f"W with {rows_w} rows")
    return np.where(valid, rows, 0), bits, valid


def _infer(X, W, Label, PathTable=None, PathCode=None, Bias=None, *, num_classes, **_):
    check_dtype(X, FLOATS, "hierarchical_sigmoid: input X")
    if X.ndim != 2 or W.ndim != 2:
        raise ShapeMismatch(f"hierarchical_sigmoid: expected X [N, D] and W [nodes, D], got "
                            f"{list(X.shape)} and {list(W.shape)}")
    length = PathTable.shape[1] if PathTable is not None else int(num_classes - 1).bit_length()
    return {"Out": VarMeta((X.shape[0], 1), X.dtype),
            "PreOut": VarMeta((X.shape[0], length), X.dtype),
            "W_Out": W}


def _pre(X, W, Bias, rows, valid):
    z = np.einsum("nd,nld->nl", X.astype(np.float64), W.astype(np.float64)[rows])
    if Bias is not None:
        z = z + Bias.reshape(-1).astype(np.float64)[rows]
    return np.where(valid, np.clip(z, -40.0, 40.0), 0.0)


def _ref(X, W, Label, PathTable=None, PathCode=None, Bias=None, *, num_classes, **_):
    rows, bits, valid = _paths(Label, PathTable, PathCode, num_classes, W.shape[0])
    z = _pre(X, W, Bias, rows, valid)
    soft = np.log1p(np.exp(z))
    out = soft.sum(axis=1) - np.where(valid, bits * z, 0.0).sum(axis=1)
    return {"Out": out.reshape(-1, 1).astype(X.dtype), "PreOut": soft.astype(X.dtype),
            "W_Out": W.copy()}


def _grad_ref(X, W, Label, PreOut, PathTable=None, PathCode=None, Bias=None, *, num_classes,
              **kw):
    g = kw["Out@GRAD"].reshape(-1, 1).astype(np.float64)
    rows, bits, valid = _paths(Label, PathTable, PathCode, num_classes, W.shape[0])
    dz = np.where(valid, (1.0 - np.exp(-PreOut.astype(np.float64)) - bits) * g, 0.0)
    dx = np.einsum("nl,nld->nd", dz, W.astype(np.float64)[rows])
    dw = np.zeros(W.shape)
    np.add.at(dw, rows[valid], (dz[:, :, None] * X.astype(np.float64)[:, None, :])[valid])
    out = {"X@GRAD": dx.astype(X.dtype), "W@GRAD": dw.astype(W.dtype)}
    if Bias is not None:
        db = np.zeros(Bias.size)
        np.add.at(db, rows[valid], dz[valid])
        out["Bias@GRAD"] = db.reshape(Bias.shape).astype(Bias.dtype)
    return out


def _grad(op):
    ins = {s: op.input(s) for s in ("X", "W", "Label", "PathTable", "PathCode", "Bias")
           if op.input(s)}
    ins["PreOut"] = op.output("PreOut")
    ins["Out@GRAD"] = [grad_var_name(n) for n in op.output("Out")]
    outs = {f"{s}@GRAD": [grad_var_name(n) for n in op.input(s)]
            for s in ("X", "W", "Bias") if op.input(s)}
    return [GradOpSpec("hierarchical_sigmoid_grad", ins, outs,
                       {k: v for k, v in op.all_attrs().items() if k in _ATTRS})]


register_op(
    "hierarchical_sigmoid",
    inputs=["X", "W", "Label", "PathTable?", "PathCode?", "Bias?"],
    outputs=["Out", "PreOut~", "W_Out?~"], attrs=_ATTRS, traits=[OPAQUE],
    infer_shape=_infer, reference=_ref, emit=None, grad=_grad,
    doc="Hierarchical sigmoid loss of each sample over its class's path in a binary tree.")
register_op(
    "hierarchical_sigmoid_grad",
    inputs=["X", "W", "Label", "PreOut", "PathTable?", "PathCode?", "Bias?", "Out@GRAD"],
    outputs=["X@GRAD?", "W@GRAD?", "Bias@GRAD?"], attrs=dict(_ATTRS), traits=[OPAQUE],
    infer_shape=lambda X, W, Bias=None, **_: {"X@GRAD": X, "W@GRAD": W,
                                              **({"Bias@GRAD": Bias} if Bias else {})},
    reference=_grad_ref, emit=None, grad=None, doc="Gradients of hierarchical_sigmoid.")
