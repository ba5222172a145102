"""Gradients of control flow: ops with sub-blocks, branch selection, row split/merge, arrays.

Grad makers (wired into the forward definitions in ``control_flow.py``) and the grad ops they
use, under PaddlePaddle's legacy types and slots where Paddle has them:

- ``conditional_block`` -> ``conditional_block_grad`` (Cond, Input, Out, Out@GRAD, Scope ->
  Input@GRAD; ``sub_block`` is the grad block the backward pass builds; a variable both read
  and written by a branch that did not run passes its gradient through);
- ``while`` -> ``while_grad`` (X, Out, Out@GRAD, StepScopes -> X@GRAD);
- ``select_input`` -> ``select_input_grad`` (what Paddle's ``select_output`` does to the
  gradient), ``select_output`` -> ``select_input``; ``split_lod_tensor`` -> ``merge_lod_tensor``
  and back (Fluid 1.x's pairs);
- ``tensor_array_to_tensor`` -> ``tensor_array_to_tensor_grad``; ``write_to_array`` ->
  ``write_to_array_grad`` and ``read_from_array`` -> ``read_from_array_grad`` (Paddle reuses
  the forward array ops, which leave unwritten elements empty; these give zeros instead), and
  ``sum_array`` adds array gradients with several producers.

How a grad block runs (``pdjit.passes.backward`` builds it): in an env whose reads see, first,
the grad block's own values (the out-grads of the op are bound there under the names of the
grad op's ``Out@GRAD`` inputs), then the forward step's values (``StepScopes``: the sub-block's
own variables, and ``saved``, the op's inputs as that run started), then the env the grad op
runs in. The grad block leaves each wanted input gradient in the grad op's output variable of
that input (a variable of the enclosing block). A tensor-array gradient is a list with zeros
where nothing flowed (``None`` where the forward array had no element).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ProgramError, ShapeMismatch
from pdjit.framework.registry import (
    CONTROL_FLOW,
    EMPTY_VAR_NAME,
    OPAQUE,
    SUMS_ARRAYS,
    BlockAttr,
    Bool,
    GradOpSpec,
    Int,
    Strs,
    grad_var_name,
    register_op,
)


# ---- values ---------------------------------------------------------------------------------
def _zeros_like(v):
    """Zeros shaped like a runtime value (a list for a tensor array; LoD kept)."""
    if v is None:
        return None
    if isinstance(v, list):
        return [_zeros_like(e) for e in v]
    a = np.asarray(v)
    z = np.zeros(a.shape, a.dtype)
    lod = getattr(v, "lod", None)
    if callable(lod) and lod():
        return type(v)(z, lod())
    return z


def _add(a, b):
    """``a + b`` for runtime values; ``None`` counts as zero; arrays add element by element."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, list) or isinstance(b, list):
        a, b = list(a), list(b)
        n = max(len(a), len(b))
        a += [None] * (n - len(a))
        b += [None] * (n - len(b))
        return [_add(x, y) for x, y in zip(a, b)]
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape:
        raise ShapeMismatch(f"gradients to add have different shapes: {list(x.shape)} and "
                            f"{list(y.shape)}")
    for v in (a, b):  # a LoD tensor's gradient keeps its LoD
        lod = getattr(v, "lod", None)
        if callable(lod) and lod():
            return type(v)(x + y, lod())
    return x + y


def _by_name(op, slot: str, values) -> dict:
    """{variable name: value} for an input slot (the executor drops ``@EMPTY@`` places)."""
    names = [n for n in op.input(slot) if n != EMPTY_VAR_NAME]
    if values is None:
        values = []
    elif not isinstance(values, list) or len(names) == 1 and len(values) != 1:
        values = [values]
    return dict(zip(names, values))


def _written(block) -> set:
    return {n for op in block.ops for n in op.output_arg_names}


def _run_grad_block(ctx, grad_block, step, seeds: dict):
    """Run ``grad_block`` once for the forward run ``step`` (an env of its StepScopes); the
    grad block's env after the run."""
    fwd_block = ctx.program.block(grad_block.forward_block_idx)
    view = ctx.env.child(fwd_block)
    view.values.update({k: v for k, v in (getattr(step, "saved", None) or {}).items()
                        if v is not None})
    view.values.update(step.values)
    genv = view.child(grad_block)
    genv.values.update(seeds)
    ctx.run_block(grad_block.idx, genv)
    return genv


def _steps(value, what: str) -> list:
    if value is None:
        raise ValueError(f"{what} holds no value: run the forward op in the same run, with "
                         f"is_test false")
    if not isinstance(value, list):
        raise TypeError(f"{what} must hold step scopes, got {type(value).__name__}")
    return value


# ---- conditional_block ---------------------------------------------------------------------------
def _cond_grad_maker(op):
    outs = op.output("Out")
    return [GradOpSpec(
        "conditional_block_grad",
        {"Cond": op.input("Cond"), "Input": op.input("Input"), "Out": outs,
         "Out@GRAD": [grad_var_name(n) for n in outs], "Scope": op.output("Scope")},
        {"Input@GRAD": [grad_var_name(n) for n in op.input("Input")]},
        {"sub_block": op.attr("sub_block"),
         "is_scalar_condition": op.attr("is_scalar_condition")})]


def _cond_grad_ref(ctx, **kw):
    op = ctx.op
    grad_block = ctx.program.block(op.attr("sub_block"))
    scopes = _steps(kw.get("Scope"), f"Scope {op.input('Scope')[0]!r}")
    inputs = _by_name(op, "Input", kw.get("Input"))
    if scopes:
        seeds = {n: v for n, v in _by_name(op, "Out@GRAD", kw.get("Out@GRAD")).items()
                 if v is not None}
        _run_grad_block(ctx, grad_block, scopes[-1], seeds)
    written = _written(grad_block) if scopes else set()
    og_of = {o: ctx.env.get(g) for o, g in zip(op.input("Out"), op.input("Out@GRAD"))
             if g != EMPTY_VAR_NAME}
    out = []
    for x, gx in zip(op.input("Input"), op.output("Input@GRAD")):
        if gx == EMPTY_VAR_NAME:
            out.append(None)
        elif gx in written:
            out.append(ctx.env.get(gx))
        elif not scopes and og_of.get(x) is not None:
            out.append(og_of[x])  # the branch did not run: x kept its value, and its gradient
        else:  # the branch did not run, or nothing in it reached x: zeros
            out.append(_zeros_like(inputs.get(x)))
    return {"Input@GRAD": out}


register_op(
    "conditional_block_grad", inputs=["Cond*", "Input*", "Out*?", "Out@GRAD*?", "Scope"],
    outputs=["Input@GRAD*?"],
    attrs={"sub_block": BlockAttr(), "is_scalar_condition": Bool(False)},
    traits=[CONTROL_FLOW], infer_shape=lambda **_: {}, reference=_cond_grad_ref, emit=None,
    grad=None,
    doc="Input@GRAD of a conditional_block: its grad block run once in the branch's step scope "
        "(zeros when the branch did not run).")


# ---- while -------------------------------------------------------------------------------------
def _while_grad_maker(op):
    if op.attr("is_test"):
        raise ProgramError(f"{op._describe()}: built with is_test=True, it keeps no step scopes, "
                           f"so no gradient can flow through it; build it with is_test=False")
    outs = op.output("Out")
    return [GradOpSpec(
        "while_grad",
        {"X": op.input("X"), "Out": outs, "Out@GRAD": [grad_var_name(n) for n in outs],
         "StepScopes": op.output("StepScopes")},
        {"X@GRAD": [grad_var_name(n) for n in op.input("X")]},
        {"sub_block": op.attr("sub_block"), "is_test": op.attr("is_test")})]


def _while_grad_ref(ctx, **kw):
    op = ctx.op
    grad_block = ctx.program.block(op.attr("sub_block"))
    steps = _steps(kw.get("StepScopes"), f"StepScopes {op.input('StepScopes')[0]!r}")
    xs = _by_name(op, "X", kw.get("X"))
    outs = _by_name(op, "Out", kw.get("Out"))
    ogs = _by_name(op, "Out@GRAD", kw.get("Out@GRAD"))
    seed_of = {o: g for o, g in zip(op.input("Out"), op.input("Out@GRAD"))
               if g != EMPTY_VAR_NAME}
    sink_of = {x: g for x, g in zip(op.input("X"), op.output("X@GRAD"))
               if g != EMPTY_VAR_NAME}
    written = _written(grad_block)
    # the gradient of each output's value at the end of the step being differentiated
    carried = {o: ogs.get(g) if ogs.get(g) is not None else _zeros_like(outs.get(o))
               for o, g in seed_of.items()}
    acc: dict = {}  # loop-invariant inputs: their gradient summed over the steps
    for step in reversed(steps):
        _run_grad_block(ctx, grad_block, step, {seed_of[o]: v for o, v in carried.items()
                                                if v is not None})
        inside = {x: ctx.env.get(g) for x, g in sink_of.items() if g in written}
        for x, g in inside.items():
            if x not in carried:
                acc[x] = _add(acc.get(x), g)
        saved = getattr(step, "saved", None) or {}
        for o, value in list(carried.items()):
            if isinstance(value, list):   # a tensor array keeps its other elements' gradients
                carried[o] = _add(value, inside.get(o))
            elif inside.get(o) is not None:
                carried[o] = inside[o]
            else:   # nothing reached the step's start value (or o is only written): zeros
                carried[o] = _zeros_like(saved.get(o) if saved.get(o) is not None else value)
    out = []
    for x, g in zip(op.input("X"), op.output("X@GRAD")):
        if g == EMPTY_VAR_NAME:
            out.append(None)
        elif x in carried:
            out.append(carried[x])
        elif x in acc:
            out.append(acc[x])
        else:
            out.append(_zeros_like(xs.get(x)))
    return {"X@GRAD": out}


register_op(
    "while_grad", inputs=["X*", "Out*", "Out@GRAD*?", "StepScopes"], outputs=["X@GRAD*?"],
    attrs={"sub_block": BlockAttr(), "is_test": Bool(False), "original_output_grad": Strs([]),
           "skip_eager_deletion_vars": Strs([])},
    traits=[CONTROL_FLOW], infer_shape=lambda **_: {}, reference=_while_grad_ref, emit=None,
    grad=None,
    doc="X@GRAD of a while: its grad block run once per step scope, last step first; the "
        "gradient of a loop-carried variable passes from each step to the one before, that of "
        "a loop-invariant input is summed over the steps.")


# ---- branch selection and row split/merge ------------------------------------------------------
def _select_input_grad(op):
    (out,) = op.output("Out")
    return [GradOpSpec("select_input_grad",
                       {"X": op.input("X"), "Mask": op.input("Mask"),
                        "Out@GRAD": [grad_var_name(out)]},
                       {"X@GRAD": [grad_var_name(n) for n in op.input("X")]})]


def _select_input_grad_ref(ctx, **kw):
    names = ctx.op.output("X@GRAD")
    m = np.asarray(kw.get("Mask")).reshape(-1)
    i = int(m[0]) if m.size == 1 else -1
    if not 0 <= i < len(names):
        raise IndexError(f"Mask is {m.tolist()}: expected an index into the {len(names)} "
                         f"inputs X")
    xs = kw.get("X") or [None] * len(names)
    # zeros for the inputs not selected; none where that input holds no value (the branch of
    # a cond that did not run: its conditional_block_grad does not read it)
    return {"X@GRAD": [kw.get("Out@GRAD") if j == i else _zeros_like(xs[j])
                       for j in range(len(names))]}


register_op(
    "select_input_grad", inputs=["X*", "Mask", "Out@GRAD"], outputs=["X@GRAD*"],
    traits=[CONTROL_FLOW], infer_shape=lambda **_: {}, reference=_select_input_grad_ref,
    emit=None, grad=None,
    doc="X@GRAD[Mask] = Out@GRAD (Paddle's select_output on the gradient); zeros for the "
        "other inputs that hold a value, nothing for those that do not.")


def _select_output_grad(op):
    (x,) = op.input("X")
    return [GradOpSpec("select_input", {"X": [grad_var_name(n) for n in op.output("Out")],
                                        "Mask": op.input("Mask")},
                       {"Out": [grad_var_name(x)]})]


def _split_grad(op):
    return [GradOpSpec(
        "merge_lod_tensor",
        {"X": op.input("X"), "Mask": op.input("Mask"),
         "InTrue": [grad_var_name(n) for n in op.output("OutTrue")],
         "InFalse": [grad_var_name(n) for n in op.output("OutFalse")]},
        {"Out": [grad_var_name(n) for n in op.input("X")]}, {"level": op.attr("level")})]


def _merge_grad(op):
    return [GradOpSpec(
        "split_lod_tensor",
        {"X": [grad_var_name(n) for n in op.output("Out")], "Mask": op.input("Mask")},
        {"OutTrue": [grad_var_name(n) for n in op.input("InTrue")],
         "OutFalse": [grad_var_name(n) for n in op.input("InFalse")]},
        {"level": op.attr("level")})]


# ---- tensor arrays -----------------------------------------------------------------------------
def _index(I) -> int:
    return int(np.asarray(I).reshape(-1)[0])


def _write_grad_maker(op):
    (out,) = op.output("Out")
    return [GradOpSpec("write_to_array_grad",
                       {"X": op.input("X"), "I": op.input("I"), "Out@GRAD": [grad_var_name(out)]},
                       {"X@GRAD": [grad_var_name(n) for n in op.input("X")]})]


def _write_grad_ref(X, I, **kw):
    arr, i = kw.get("Out@GRAD"), _index(I)
    g = arr[i] if isinstance(arr, list) and i < len(arr) else None
    return {"X@GRAD": _zeros_like(X) if g is None else np.array(np.asarray(g), copy=True)}


register_op(
    "write_to_array_grad", inputs=["X", "I", "Out@GRAD?"], outputs=["X@GRAD"],
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_write_grad_ref,
    emit=None, grad=None,
    doc="X@GRAD = element I of the array gradient Out@GRAD (zeros where none flowed).")


def _read_grad_maker(op):
    (out,) = op.output("Out")
    return [GradOpSpec("read_from_array_grad",
                       {"X": op.input("X"), "I": op.input("I"), "Out@GRAD": [grad_var_name(out)]},
                       {"X@GRAD": [grad_var_name(n) for n in op.input("X")]})]


def _read_grad_ref(X, I, **kw):
    i = _index(I)
    g = kw.get("Out@GRAD")
    out = _zeros_like(list(X))
    out += [None] * (i + 1 - len(out))
    out[i] = np.array(np.asarray(g), copy=True)
    return {"X@GRAD": out}


register_op(
    "read_from_array_grad", inputs=["X", "I", "Out@GRAD"], outputs=["X@GRAD"],
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_read_grad_ref,
    emit=None, grad=None,
    doc="X@GRAD = an array like X of zeros but element I, which is Out@GRAD.")


def _ta2t_grad_maker(op):
    (out,) = op.output("Out")
    return [GradOpSpec("tensor_array_to_tensor_grad",
                       {"X": op.input("X"), "OutIndex": op.output("OutIndex"),
                        "Out@GRAD": [grad_var_name(out)]},
                       {"X@GRAD": [grad_var_name(n) for n in op.input("X")]},
                       {"axis": op.attr("axis"), "use_stack": op.attr("use_stack")})]


def _ta2t_grad_ref(X, OutIndex, *, axis, use_stack, **kw):
    g = np.asarray(kw["Out@GRAD"])
    items = [np.asarray(v) for v in X]
    rank = items[0].ndim + (1 if use_stack else 0)
    ax = axis + rank if axis < 0 else axis
    if use_stack:
        parts = [np.array(np.take(g, j, axis=ax)) for j in range(len(items))]
    else:
        bounds = np.cumsum([a.shape[ax] for a in items])[:-1]
        parts = [np.ascontiguousarray(p) for p in np.split(g, bounds, axis=ax)]
    return {"X@GRAD": parts}


register_op(
    "tensor_array_to_tensor_grad", inputs=["X", "OutIndex?", "Out@GRAD"], outputs=["X@GRAD"],
    attrs={"axis": Int(0), "use_stack": Bool(False)},
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_ta2t_grad_ref,
    emit=None, grad=None,
    doc="X@GRAD = Out@GRAD cut back into the array's elements (split or unstacked on axis).")


def _sum_array_ref(X):
    out = None
    for v in X:
        out = _add(out, list(v) if isinstance(v, list) else v)
    return {"Out": out}


register_op(
    "sum_array", inputs=["X*"], outputs=["Out"],
    traits=[OPAQUE, SUMS_ARRAYS], infer_shape=lambda X: {"Out": X[0]}, reference=_sum_array_ref,
    emit=None,
    grad=None,
    doc="Out = X[0] + X[1] + ... for tensor arrays, element by element (a missing element "
        "counts as zero; lengths may differ).")


#: forward op type -> its grad maker (``control_flow.py`` sets them as the ops' ``grad``)
GRAD_MAKERS = {
    "conditional_block": _cond_grad_maker,
    "while": _while_grad_maker,
    "select_input": _select_input_grad,
    "select_output": _select_output_grad,
    "split_lod_tensor": _split_grad,
    "merge_lod_tensor": _merge_grad,
    "write_to_array": _write_grad_maker,
    "read_from_array": _read_grad_maker,
    "tensor_array_to_tensor": _ta2t_grad_maker,
}
