"""Fluid 1.8's ``py_func``: an op that calls a Python function of the user's.

The ``py_func`` layer registers the forward function (and the backward one, if any) in
:data:`CALLABLES` and writes their positions into the op (``forward_callable_id``,
``backward_callable_id``; -1: none). Running the op calls the function with one
:class:`~pdjit.runtime.tensor.LoDTensor` per ``X`` (as Fluid passes them; ``np.array(t)``
gives the values) and takes one result per ``Out``: arrays, LoD tensors or numbers, cast to the
dtype the output variable declares. The grad op is another ``py_func`` that calls the backward
function with ``X``, ``Out`` and the gradients of ``Out`` (leaving out ``backward_skip_vars``)
and writes the gradients of ``X``. The op always runs as a reference step of its own (the
function is Python); its outputs keep the shapes the user declared. A program holding a
``py_func`` runs in the process that built it (the functions are not serialised).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    SIDE_EFFECT,
    GradOpSpec,
    Int,
    Strs,
    grad_var_name,
    register_op,
)

#: the functions py_func ops call, by position (forward_callable_id / backward_callable_id)
CALLABLES: list = []


def register_callable(fn) -> int:
    """Keep ``fn`` for py_func ops; return its id."""
    CALLABLES.append(fn)
    return len(CALLABLES) - 1


_ATTRS = {"forward_callable_id": Int(-1, low=-1, high=-1),
          "backward_callable_id": Int(-1, low=-1, high=-1),
          "backward_skip_vars": Strs([])}


def _ref(X=None, *, forward_callable_id, ctx, **_):
    if not 0 <= forward_callable_id < len(CALLABLES):
        raise ShapeMismatch(f"py_func: no function {forward_callable_id} is registered in this "
                            f"process (a py_func program runs where it was built)")
    args = [ctx.with_lod(np.asarray(x), ctx.input_lod("X", i)) for i, x in enumerate(X or [])]
    res = CALLABLES[forward_callable_id](*args)
    names = ctx.op.output("Out")
    res = [] if res is None else (list(res) if isinstance(res, (list, tuple)) else [res])
    if len(res) != len(names):
        raise ShapeMismatch(f"py_func: the function returned {len(res)} values for "
                            f"{len(names)} outputs")
    out = []
    for name, r in zip(names, res):
        v = ctx.op.block._find_var_recursive(name)
        out.append(np.asarray(np.array(r), dtype=v.dtype if v is not None and v.dtype else None))
    return {"Out": out}


def _grad(op):
    bwd = op.attr("backward_callable_id")
    if bwd < 0:
        return []
    skip = set(op.attr("backward_skip_vars") or [])
    ins = [n for n in op.input("X") + op.output("Out") if n not in skip]
    ins += [grad_var_name(n) for n in op.output("Out")]
    return [GradOpSpec("py_func", {"X": ins},
                       {"Out": [grad_var_name(n) for n in op.input("X")]},
                       {"forward_callable_id": bwd, "backward_callable_id": -1})]


register_op(
    "py_func", inputs=["X*?"], outputs=["Out*?"], attrs=_ATTRS, traits=[OPAQUE, SIDE_EFFECT],
    infer_shape=lambda **_: {}, reference=_ref, emit=None, grad=_grad,
    doc="Calls a registered Python function on X's values to make Out.")
