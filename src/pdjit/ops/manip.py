"""Fluid 1.8's ``reverse``, ``unique`` and ``unique_with_counts`` ops.

``reverse``: ``X`` with the order of its elements reversed along each axis in ``axis``; its
gradient is the same reversal of ``Out@GRAD`` (the op is its own grad op, as in Fluid).
Natively a reversed view copied to a contiguous array. ``unique*``: see below."""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    GradOpSpec,
    Int,
    Ints,
    Opaque,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import NUMERIC, check_dtype


def _axes(axis, rank: int) -> list:
    out = []
    for a in axis:
        if not -rank <= a < rank:
            raise ShapeMismatch(f"reverse: axis {a} out of range for rank {rank}: expected "
                                f"values in [{-rank}, {rank})")
        out.append(a % rank)
    return sorted(set(out))


def _infer(X, *, axis):
    check_dtype(X, NUMERIC + (np.dtype(np.bool_),), "reverse: input X")
    if not axis:
        raise ShapeMismatch("reverse: expected a non-empty axis list, got []")
    _axes(axis, X.ndim)
    return {"Out": X}


def _ref(X, *, axis):
    return {"Out": np.flip(X, _axes(axis, X.ndim)).copy()}


def _lower(ctx):
    r = ctx.rank("X")
    try:
        axes = _axes(ctx.attrs["axis"], r)
    except ShapeMismatch:
        return None
    index = ", ".join("::-1" if d in axes else ":" for d in range(r))
    return [f"{ctx.out('Out')} = np.ascontiguousarray({ctx.inp('X')}[{index}])"]


register_op(
    "reverse", inputs=["X"], outputs=["Out"],
    attrs={"axis": Ints(REQUIRED, choices=([0], [-1], [0, 1]))}, traits=[OPAQUE],
    infer_shape=_infer, reference=_ref, emit=Opaque(_lower, host=True),
    grad=lambda op: [GradOpSpec("reverse", {"X": [grad_var_name(n) for n in op.output("Out")]},
                                {"Out": [grad_var_name(n) for n in op.input("X")]},
                                {"axis": list(op.attr("axis"))})],
    doc="Out = X reversed along each axis in axis.")


# ---- unique / unique_with_counts (Fluid 1.8's first forms) -------------------------------------
# Out: the distinct values of the 1-D X in the order they first appear; Index [X.size]: for each
# element, the position of its value in Out; Count: how often each value of Out occurs. The
# sizes follow the values: the reference computes them (no gradient; integer outputs).
_UNIQUE_ATTRS = {"dtype": Int(2, one_of=(2, 3), choices=(2, 3))}    # int32 / int64 codes


def _unique_infer(X, *, dtype, with_counts=False):
    check_dtype(X, NUMERIC, "unique: input X")
    if X.ndim != 1:
        raise ShapeMismatch(f"unique: expected a 1-D X, got {list(X.shape)}")
    index_dtype = np.dtype(np.int32 if dtype == 2 else np.int64)
    out = {"Out": VarMeta((-1,), X.dtype), "Index": VarMeta(X.shape, index_dtype)}
    if with_counts:
        out["Count"] = VarMeta((-1,), index_dtype)
    return out


def _unique_ref(X, *, dtype):
    values, first, inverse, counts = np.unique(X, return_index=True, return_inverse=True,
                                               return_counts=True)
    order = np.argsort(first, kind="stable")            # first appearance order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    index_dtype = np.int32 if dtype == 2 else np.int64
    return {"Out": values[order], "Index": rank[inverse.reshape(-1)].astype(index_dtype),
            "Count": counts[order].astype(index_dtype)}


register_op(
    "unique", inputs=["X"], outputs=["Out", "Index"], attrs=_UNIQUE_ATTRS, traits=[OPAQUE],
    infer_shape=_unique_infer,
    reference=lambda X, *, dtype: {k: v for k, v in _unique_ref(X, dtype=dtype).items()
                                   if k != "Count"},
    emit=None, grad=None, doc="The distinct values of X in order of first appearance, and "
                              "each element's position among them.")
register_op(
    "unique_with_counts", inputs=["X"], outputs=["Out", "Index", "Count"], attrs=_UNIQUE_ATTRS,
    traits=[OPAQUE], infer_shape=lambda X, *, dtype: _unique_infer(X, dtype=dtype,
                                                                    with_counts=True),
    reference=_unique_ref, emit=None, grad=None,
    doc="unique, with how often each distinct value occurs.")
