"""Control flow: ops that own sub-blocks, pick between branch values, and tensor arrays.

PaddlePaddle's legacy op types, slots and attributes, so programs are interchangeable:

- ``conditional_block`` (Cond*, Input* -> Out*, Scope; ``sub_block``, ``is_scalar_condition``)
  runs its sub-block once when the condition holds;
- ``while`` (X*, Condition -> Out*, StepScopes; ``sub_block``, ``is_test``) runs its sub-block
  while the condition variable, re-read before every iteration, is true;
- ``select_input`` / ``select_output`` pick a branch value by an int32 mask (``cond``'s merge);
- ``split_lod_tensor`` / ``merge_lod_tensor`` (Fluid 1.x, for ``IfElse``): the rows of X where
  the mask is true / false, and the rows put back in their original order;
- tensor arrays: ``write_to_array``, ``read_from_array``, ``lod_array_length``,
  ``tensor_array_to_tensor``. A ``LOD_TENSOR_ARRAY`` value at run time is a Python list of
  arrays (or LoD tensors).

Sub-blocks run through ``ctx.run_block`` in a child env (``ctx.env.child(block)``): reads fall
back to the enclosing envs, writes go to the env of the block that declares the variable, and a
sub-block's own variables are dropped afterwards unless a step scope keeps them (see
``pdjit.runtime.context.StepScopes``, the contract the gradient ops rely on). The references
of ``CONTROL_FLOW`` ops receive raw values (LoD tensors as they are, ``None`` for an input that
holds no value yet) and return ``None`` for an output they leave untouched. A loop passes
each iteration's number to ``ctx.run_block``: random ops in its body draw other numbers in every
iteration (``pdjit.framework.random.op_key``), as Fluid's do.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import limits
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    BRANCH,
    CONTROL_FLOW,
    LOOP,
    OPAQUE,
    SEQUENCE,
    BlockAttr,
    Bool,
    ControlFlow,
    Int,
    Select,
    Strs,
    VarMeta,
    register_op,
)
from pdjit.ops.control_flow_grad import GRAD_MAKERS as _GRADS
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType


def _data(value) -> np.ndarray:
    """The array of a runtime value (a LoD tensor's data, an array as it is)."""
    return value if isinstance(value, np.ndarray) else np.asarray(value)


def _lod_of(value) -> list:
    lod = getattr(value, "lod", None)
    return lod() if callable(lod) else []


def _describe(value) -> str:
    if value is None:
        return "no value"
    if isinstance(value, list):
        return f"a tensor array of {len(value)} elements"
    a = _data(value)
    return f"{a.dtype} tensor of shape {list(a.shape)}"


# Written by Paddle's layers on both ops (memory-reuse hints of its executor); kept, not used.
_SKIP_DOC = "names Paddle's executor must not free early; recorded only"


# ---- conditional_block ------------------------------------------------------------------------
def _scalar_condition(value, what: str) -> bool:
    if value is None:
        raise ValueError(f"{what} holds no value")
    a = _data(value)
    if a.dtype != np.bool_ or a.size != 1:
        raise TypeError(f"{what} must be a bool tensor of one element: expected bool[1], got "
                        f"{_describe(value)}")
    return bool(a.reshape(-1)[0])


def _cond_block_ref(Cond, Input, *, sub_block, is_scalar_condition, ctx):
    op, env = ctx.op, ctx.env
    if is_scalar_condition:
        if len(Cond) != 1:
            raise ValueError(f"a scalar condition takes one Cond variable, got {len(Cond)}")
        run = _scalar_condition(Cond[0], f"Cond {op.input('Cond')[0]!r}")
    else:
        for n, c in zip(op.input("Cond"), Cond):
            if c is None:
                raise ValueError(f"Cond {n!r} holds no value")
        run = all(_data(c).size != 0 for c in Cond)  # Paddle: every Cond tensor is non-empty
    scopes = ctx.new_step_scopes()
    if run:
        child = env.child(ctx.program.block(sub_block))
        child.saved = dict(zip(op.input("Input"), Input))
        ctx.run_block(sub_block, child)
        scopes.append(child)
    return {"Out": [env.get(n) for n in op.output("Out")], "Scope": scopes}


register_op(
    "conditional_block", inputs=["Cond*", "Input*?"], outputs=["Out*?", "Scope"],
    attrs={"sub_block": BlockAttr(), "is_scalar_condition": Bool(False),
           "skip_eager_deletion_vars": Strs([], doc=_SKIP_DOC)},
    traits=[CONTROL_FLOW], infer_shape=lambda **_: {}, reference=_cond_block_ref, emit=None,
    grad=_GRADS["conditional_block"],
    control=ControlFlow(BRANCH, body="sub_block", condition="Cond", step_scopes="Scope",
                        scalar_condition="is_scalar_condition"),
    doc="Runs sub_block once if the condition holds: the one bool element of Cond when "
        "is_scalar_condition, else when every Cond tensor is non-empty. Scope gets a "
        "StepScopes holding the run's env (empty if the block did not run).")


# ---- while --------------------------------------------------------------------------------------
def _while_ref(X, Condition, *, sub_block, is_test, ctx):
    op, env = ctx.op, ctx.env
    cond_names = op.input("Condition")
    if len(cond_names) != 1:
        raise ValueError(f"while takes one Condition variable, got {len(cond_names)}")
    cond_name = cond_names[0]
    x_names = op.input("X")
    block = ctx.program.block(sub_block)
    scopes = ctx.new_step_scopes()
    iteration = 0
    bound = limits.bound(limits.MAX_LOOP_ITERATIONS)
    while _scalar_condition(env.get(cond_name), f"Condition {cond_name!r}"):
        if iteration >= bound:
            raise limits.loop_limit_error(op, getattr(ctx, "op_idx", None), sub_block,
                                          cond_name, iteration, bound)
        step = env.child(block)
        step.saved = {n: env.get(n) for n in x_names}
        ctx.run_block(sub_block, step, iteration)  # random ops draw anew in each iteration
        iteration += 1
        if not is_test:
            scopes.append(step)
    return {"Out": [env.get(n) for n in op.output("Out")], "StepScopes": scopes}


register_op(
    "while", inputs=["X*?", "Condition*"], outputs=["Out*?", "StepScopes"],
    attrs={"sub_block": BlockAttr(), "is_test": Bool(False),
           "skip_eager_deletion_vars": Strs([], doc=_SKIP_DOC)},
    traits=[CONTROL_FLOW], infer_shape=lambda **_: {}, reference=_while_ref, emit=None,
    grad=_GRADS["while"],
    control=ControlFlow(LOOP, body="sub_block", condition="Condition",
                        step_scopes="StepScopes", keeps_no_scopes="is_test"),
    doc="Runs sub_block while Condition (a bool[1] re-read before each iteration) is true. "
        "StepScopes gets one env per iteration unless is_test.")


# ---- select_input / select_output ----------------------------------------------------------------
def _mask_index(mask, n: int, what: str) -> int:
    if mask is None:
        raise ValueError("Mask holds no value")
    m = _data(mask)
    if m.size != 1 or m.dtype.kind not in "iub":
        raise TypeError(f"Mask must be an integer tensor of one element, got {_describe(mask)}")
    i = int(m.reshape(-1)[0])
    if not 0 <= i < n:
        raise IndexError(f"Mask is {i}: expected an index into the {n} {what}")
    return i


def _merged_meta(metas):
    metas = [m for m in metas if m is not None]
    if not metas:
        return None
    first = metas[0]
    shape = list(first.shape)
    for m in metas[1:]:
        if len(m.shape) != len(shape):
            return first.with_(shape=(-1,) * len(first.shape))  # ranks differ: all unknown
        shape = [a if a == b else -1 for a, b in zip(shape, m.shape)]
    return first.with_(shape=tuple(shape))


def _select_input_infer(X, Mask):
    meta = _merged_meta(X)
    return {"Out": meta} if meta is not None else {}


def _select_input_ref(X, Mask, ctx):
    i = _mask_index(Mask, len(X), "inputs X")
    if X[i] is None:
        raise ValueError(f"X[{i}] ({ctx.op.input('X')[i]!r}), selected by Mask, holds no value")
    return {"Out": X[i]}


register_op(
    "select_input", inputs=["X*", "Mask"], outputs=["Out"],
    traits=[CONTROL_FLOW], select=Select(index="Mask", choices="X", gather=True, out="Out"),
    infer_shape=_select_input_infer, reference=_select_input_ref,
    emit=None, grad=_GRADS["select_input"],
    doc="Out = X[Mask] (Mask an int32 of one element); the other inputs may hold no value.")


def _select_output_ref(X, Mask, ctx):
    n = len(ctx.op.output("Out"))
    i = _mask_index(Mask, n, "outputs Out")
    if X is None:
        raise ValueError(f"X ({ctx.op.input('X')[0]!r}) holds no value")
    return {"Out": [X if j == i else None for j in range(n)]}


register_op(
    "select_output", inputs=["X", "Mask"], outputs=["Out*"],
    traits=[CONTROL_FLOW], select=Select(index="Mask", choices="Out", gather=False, value="X"),
    infer_shape=lambda X, Mask: {},  # outputs keep their declared metas
    reference=_select_output_ref, emit=None, grad=_GRADS["select_output"],
    doc="Out[Mask] = X (Mask an int32 of one element); the other outputs are left untouched.")


# ---- split_lod_tensor / merge_lod_tensor (Fluid 1.x, IfElse) ------------------------------------
def _flag_mask(Mask, n: int, what: str) -> np.ndarray:
    m = _data(Mask).reshape(-1)
    if m.dtype != np.bool_:
        raise TypeError(f"Mask must be a bool tensor, got {_describe(Mask)}")
    if m.size != n:
        raise ShapeMismatch(f"Mask has {m.size} elements: expected one per {what}, {n}")
    return m


def _sub_lod(lod, start: int, end: int, level: int):
    """(lengths of sequences [start, end) of ``level`` and of every level below it, (first row,
    end row)): the part of a LoD that those sequences span."""
    lengths = []
    for offsets in lod[level:]:
        lengths.append([offsets[i + 1] - offsets[i] for i in range(start, end)])
        start, end = offsets[start], offsets[end]
    return lengths, (start, end)


def _offsets(levels) -> list:
    out = []
    for lengths in levels:
        offs = [0]
        for n in lengths:
            offs.append(offs[-1] + n)
        out.append(offs)
    return out


def _append(levels: list, lengths: list) -> None:
    while len(levels) < len(lengths):
        levels.append([])
    for acc, more in zip(levels, lengths):
        acc.extend(more)


def _take(X, ranges) -> np.ndarray:
    if not ranges:
        return np.empty((0,) + X.shape[1:], X.dtype)
    return np.ascontiguousarray(np.concatenate([X[a:b] for a, b in ranges]))


def _split_infer(X, Mask, *, level):
    out = X.with_(shape=(-1,) + tuple(X.shape[1:]), lod_level=max(X.lod_level - level, 0))
    return {"OutTrue": out, "OutFalse": out}


def _split_ref(X, Mask, *, level, ctx):
    if X.ndim == 0:
        raise ShapeMismatch("X must have a row dimension, got a 0-d tensor")
    lod = ctx.input_lod("X")
    if not lod:  # dense: one mask value per row
        m = _flag_mask(Mask, X.shape[0], "row of X")
        return {"OutTrue": np.ascontiguousarray(X[m]), "OutFalse": np.ascontiguousarray(X[~m])}
    if not 0 <= level < len(lod):
        raise ShapeMismatch(f"level {level} is out of range for X's LoD of {len(lod)} level(s)")
    m = _flag_mask(Mask, len(lod[level]) - 1, f"sequence of X at LoD level {level}")
    ranges, levels = {True: [], False: []}, {True: [], False: []}
    for i, flag in enumerate(m.tolist()):
        lengths, rows = _sub_lod(lod, i, i + 1, level)
        _append(levels[flag], lengths)
        ranges[flag].append(rows)
    for slot, flag in (("OutTrue", True), ("OutFalse", False)):
        ctx.set_output_lod(slot, _offsets(levels[flag]) if ranges[flag] else [])
    return {"OutTrue": _take(X, ranges[True]), "OutFalse": _take(X, ranges[False])}


register_op(
    "split_lod_tensor", inputs=["X", "Mask"], outputs=["OutTrue", "OutFalse"],
    attrs={"level": Int(0, choices=(0,))},
    traits=[OPAQUE, SEQUENCE], infer_shape=_split_infer, reference=_split_ref, emit=None,
    grad=_GRADS["split_lod_tensor"],
    doc="OutTrue = the rows of X where Mask is true, OutFalse = the others, in order. With a "
        "LoD, Mask has one value per sequence of LoD level `level` and whole sequences move "
        "(their LoD below `level` kept).")


def _merge_infer(X, Mask, InTrue, InFalse, *, level):
    rows = Mask.shape[0] if Mask.shape and not X.lod_level else -1
    lod_level = (min(level, X.lod_level) + InTrue.lod_level) if X.lod_level else 0
    return {"Out": InTrue.with_(shape=(rows,) + tuple(InTrue.shape[1:]), lod_level=lod_level)}


def _merge_ref(X, Mask, InTrue, InFalse, *, level, ctx):
    if InTrue.shape[1:] != InFalse.shape[1:] or InTrue.dtype != InFalse.dtype:
        raise ShapeMismatch(f"InTrue and InFalse must agree beyond the rows: got "
                            f"{InTrue.dtype}{list(InTrue.shape)} and "
                            f"{InFalse.dtype}{list(InFalse.shape)}")
    x_lod = ctx.input_lod("X")
    m = _data(Mask).reshape(-1)
    if not x_lod:  # dense: one mask value per row
        m = _flag_mask(Mask, m.size, "row")
        nt, nf = int(m.sum()), m.size - int(m.sum())
        if InTrue.shape[0] != nt or InFalse.shape[0] != nf:
            raise ShapeMismatch(f"Mask selects {nt} true and {nf} false rows: expected InTrue "
                                f"and InFalse with those rows, got {list(InTrue.shape)} and "
                                f"{list(InFalse.shape)}")
        out = np.empty((m.size,) + InTrue.shape[1:], InTrue.dtype)
        out[m] = InTrue
        out[~m] = InFalse
        return {"Out": out}
    if not 0 <= level <= len(x_lod):
        raise ShapeMismatch(f"level {level} is out of range for X's LoD of {len(x_lod)} "
                            f"level(s)")
    m = _flag_mask(Mask, m.size, "sequence")
    src = {True: (InTrue, ctx.input_lod("InTrue")), False: (InFalse, ctx.input_lod("InFalse"))}
    taken = {True: 0, False: 0}
    levels, parts = [], []
    for flag in m.tolist():
        value, lod = src[flag]
        i = taken[flag]
        count = len(lod[0]) - 1 if lod else value.shape[0]
        if i >= count:
            raise ShapeMismatch(f"Mask selects more {'true' if flag else 'false'} sequences "
                                f"than In{'True' if flag else 'False'} holds ({count})")
        lengths, (a, b) = _sub_lod(lod, i, i + 1, 0) if lod else ([], (i, i + 1))
        _append(levels, lengths)
        parts.append(value[a:b])
        taken[flag] = i + 1
    out = np.concatenate(parts) if parts else np.empty((0,) + InTrue.shape[1:], InTrue.dtype)
    ctx.set_output_lod("Out", [list(lv) for lv in x_lod[:level]] + _offsets(levels))
    return {"Out": np.ascontiguousarray(out, dtype=InTrue.dtype)}


register_op(
    "merge_lod_tensor", inputs=["X", "Mask", "InTrue", "InFalse"], outputs=["Out"],
    attrs={"level": Int(0, choices=(0,))},
    traits=[OPAQUE, SEQUENCE], infer_shape=_merge_infer, reference=_merge_ref, emit=None,
    grad=_GRADS["merge_lod_tensor"],
    doc="Out = the rows of InTrue and InFalse put back where Mask is true / false (split_lod_"
        "tensor's inverse; with a LoD on X, whole sequences, X's LoD above `level` kept).")


# ---- tensor arrays ------------------------------------------------------------------------------
def _index(I, what: str) -> int:
    a = _data(I)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"I must be an integer tensor of one element, got {_describe(I)}")
    i = int(a.reshape(-1)[0])
    if i < 0:
        raise IndexError(f"I is {i}: {what} needs a non-negative index")
    return i


def _array_meta(X):
    return X.with_(type=VarType.LOD_TENSOR_ARRAY)


def _write_ref(X, I, ctx):
    i = _index(I, "write_to_array")
    name = ctx.op.output("Out")[0]
    current = ctx.env.get(name)
    if current is not None and not isinstance(current, list):
        raise TypeError(f"Out {name!r} holds {_describe(current)}, not a tensor array")
    arr = list(current or ())
    if i >= len(arr):
        arr.extend([None] * (i + 1 - len(arr)))
    lod = ctx.input_lod("X")
    arr[i] = ctx.with_lod(X, lod) if lod else X
    return {"Out": arr}


register_op(
    "write_to_array", inputs=["X", "I"], outputs=["Out"],
    traits=[OPAQUE], infer_shape=lambda X, I: {"Out": _array_meta(X)}, reference=_write_ref,
    emit=None, grad=_GRADS["write_to_array"],
    doc="Out[I] = X in the tensor array Out (grown as needed; other elements kept).")


def _array(X, what="X") -> list:
    if not isinstance(X, list):
        raise TypeError(f"{what} must be a tensor array, got {_describe(X)}")
    return X


def _read_ref(X, I, ctx, X_W=None):
    arr = _array(X)
    i = _index(I, "read_from_array")
    if i >= len(arr):
        raise IndexError(f"I is {i}: out of range for tensor array {ctx.op.input('X')[0]!r} of "
                         f"{len(arr)} element(s)")
    v = arr[i]
    if v is None:
        raise ValueError(f"element {i} of tensor array {ctx.op.input('X')[0]!r} was never "
                         f"written")
    lod = _lod_of(v)
    if lod:
        ctx.set_output_lod("Out", lod)
    return {"Out": np.array(_data(v), copy=True)}


register_op(
    "read_from_array", inputs=["X", "I", "X_W?"], outputs=["Out"],
    traits=[OPAQUE],
    infer_shape=lambda X, I, X_W=None: {"Out": X.with_(type=VarType.LOD_TENSOR)},
    reference=_read_ref, emit=None, grad=_GRADS["read_from_array"],
    doc="Out = X[I] of the tensor array X (an IndexError when I is out of range).")


register_op(
    "lod_array_length", inputs=["X"], outputs=["Out"],
    traits=[OPAQUE], infer_shape=lambda X: {"Out": VarMeta((1,), np.int64)},
    reference=lambda X: {"Out": np.array([len(_array(X))], np.int64)}, emit=None, grad=None,
    doc="Out = the number of elements of the tensor array X (int64[1]).")


def _ta2t_infer(X, *, axis, use_stack):
    shape = list(X.shape)
    rank = len(shape) + (1 if use_stack else 0)
    if rank == 0:
        return {"OutIndex": VarMeta((-1,), np.int32)}
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise ShapeMismatch(f"axis {axis} is out of range for elements of rank {len(shape)}")
    if use_stack:
        shape.insert(ax, -1)
    else:
        shape[ax] = -1
    return {"Out": X.with_(shape=tuple(shape), type=VarType.LOD_TENSOR, lod_level=0),
            "OutIndex": VarMeta((-1,), np.int32)}


def _ta2t_ref(X, *, axis, use_stack, ctx):
    arr = _array(X)
    if not arr:
        raise ValueError(f"tensor array {ctx.op.input('X')[0]!r} is empty: nothing to "
                         f"{'stack' if use_stack else 'concatenate'}")
    missing = [i for i, v in enumerate(arr) if v is None]
    if missing:
        raise ValueError(f"elements {missing} of tensor array {ctx.op.input('X')[0]!r} were "
                         f"never written")
    items = [_data(v) for v in arr]
    rank = items[0].ndim + (1 if use_stack else 0)
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise ShapeMismatch(f"axis {axis} is out of range for elements of rank {items[0].ndim}")
    for i, a in enumerate(items[1:], 1):
        same = a.shape == items[0].shape if use_stack else (
            a.ndim == items[0].ndim
            and a.shape[:ax] + a.shape[ax + 1:] == items[0].shape[:ax] + items[0].shape[ax + 1:])
        if not same or a.dtype != items[0].dtype:
            raise ShapeMismatch(f"element {i} is {a.dtype}{list(a.shape)}: expected elements "
                                f"that {'stack' if use_stack else 'concatenate'} with element "
                                f"0, {items[0].dtype}{list(items[0].shape)}")
    if use_stack:
        out = np.stack(items, axis=ax)
        index = np.ones(len(items), np.int32)
    else:
        out = np.concatenate(items, axis=ax)
        index = np.array([a.shape[ax] for a in items], np.int32)
    return {"Out": out, "OutIndex": index}


register_op(
    "tensor_array_to_tensor", inputs=["X"], outputs=["Out", "OutIndex"],
    attrs={"axis": Int(0), "use_stack": Bool(False)},
    traits=[OPAQUE], infer_shape=_ta2t_infer, reference=_ta2t_ref, emit=None,
    grad=_GRADS["tensor_array_to_tensor"],
    doc="Out = the elements of the tensor array X concatenated (or stacked) along axis; "
        "OutIndex = each element's size along axis (1s when stacked).")
