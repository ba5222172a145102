"""``reverse`` (Fluid 1.8's op): ``X`` with the order of its elements reversed along each axis
in ``axis``; its gradient is the same reversal of ``Out@GRAD`` (the op is its own grad op, as
in Fluid). Natively a reversed view copied to a contiguous array."""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    GradOpSpec,
    Ints,
    Opaque,
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
