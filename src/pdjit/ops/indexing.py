"""Select and join ops: concat, stack, split, slice, gather, one_hot_v2.

Semantics follow PaddlePaddle 3.3.1's legacy ops. Index-taking ops check every index and raise
a clear error for one out of range; they never read outside an array. Ops reading
tensor-valued attributes (``AxisTensor``, ``StartsTensor``...) give ``-1`` for the dims those
values decide; the reference reads the values at run time.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    Bool,
    GradOpSpec,
    Int,
    Ints,
    default_grad,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import INDEX, check_dtype, int_values, norm_axis


def _merge_dims(shapes, what, skip_axis=None) -> list:
    """One shape from several that must agree (``-1`` matches anything); ``skip_axis`` is free."""
    out = list(shapes[0])
    for i, s in enumerate(shapes[1:], 1):
        if len(s) != len(out):
            raise ShapeMismatch(f"{what}: expected input {i} of rank {len(out)} like input 0 "
                                f"{list(shapes[0])}, got {list(s)}")
        for j, d in enumerate(s):
            if j == skip_axis:
                continue
            if -1 not in (d, out[j]) and d != out[j]:
                raise ShapeMismatch(f"{what}: expected input {i} to match input 0 "
                                    f"{list(shapes[0])} in dim {j}, got {list(s)}")
            out[j] = d if out[j] == -1 else out[j]
    return out




# ---- concat / stack / split ------------------------------------------------------------------
def _check_same_dtype(X, what):
    for i, m in enumerate(X[1:], 1):
        if m.dtype != X[0].dtype:
            raise ShapeMismatch(f"{what}: expected every input of dtype {X[0].dtype}, got "
                                f"{m.dtype} at input {i}")


def _concat_infer(X, AxisTensor=None, *, axis):
    if not X:
        raise ShapeMismatch("concat: expected at least one input in X, got none")
    _check_same_dtype(X, "concat")
    if X[0].ndim == 0:
        raise ShapeMismatch("concat: expected inputs of rank >= 1, got a 0-d tensor")
    if AxisTensor is not None:  # the axis is known at run time only: every dim may change
        for i, m in enumerate(X):
            if m.ndim != X[0].ndim:
                raise ShapeMismatch(f"concat: expected input {i} of rank {X[0].ndim}, got "
                                    f"{list(m.shape)}")
        return {"Out": X[0].with_(shape=(-1,) * X[0].ndim)}
    a = norm_axis(axis, X[0].ndim, "axis")
    out = _merge_dims([m.shape for m in X], "concat", skip_axis=a)
    out[a] = -1 if any(m.shape[a] < 0 for m in X) else sum(m.shape[a] for m in X)
    return {"Out": X[0].with_(shape=tuple(out))}


def _concat_ref(X, AxisTensor=None, *, axis):
    if AxisTensor is not None:
        axis = int_values(AxisTensor)[0]
    a = norm_axis(axis, X[0].ndim, "axis")
    _merge_dims([x.shape for x in X], "concat", skip_axis=a)
    return {"Out": np.concatenate(X, axis=a)}


register_op(
    "concat", inputs=["X*", "AxisTensor?"], outputs=["Out"], attrs={"axis": Int(0, low=-2,
                                                                              high=2)},
    traits=[OPAQUE], infer_shape=_concat_infer, reference=_concat_ref, emit=None,
    grad=default_grad("concat_grad", fwd_inputs=("X", "AxisTensor")),
    doc="Out = the inputs joined along axis (AxisTensor overrides axis).")


def _stack_infer(X, *, axis):
    if not X:
        raise ShapeMismatch("stack: expected at least one input in X, got none")
    _check_same_dtype(X, "stack")
    out = _merge_dims([m.shape for m in X], "stack")
    a = norm_axis(axis, len(out) + 1, "axis")
    return {"Y": X[0].with_(shape=tuple(out[:a] + [len(X)] + out[a:]))}


def _stack_ref(X, *, axis):
    _merge_dims([x.shape for x in X], "stack")
    return {"Y": np.stack(X, axis=norm_axis(axis, X[0].ndim + 1, "axis"))}


register_op("stack", inputs=["X*"], outputs=["Y"], attrs={"axis": Int(0, low=-2, high=2)},
            traits=[OPAQUE], infer_shape=_stack_infer, reference=_stack_ref, emit=None,
            grad=default_grad("stack_grad", grad_outputs=("Y",)),
            doc="Y = the inputs (of one shape) stacked along a new axis.")


def _split_sizes(dim, num, sections, where) -> list:
    """The sizes of the pieces (``-1`` where unknown until run time)."""
    if num > 0:
        if dim >= 0 and dim % num:
            raise ShapeMismatch(f"{where}: expected the dim's size {dim} to divide by num={num}")
        return [dim // num if dim >= 0 else -1] * num
    if not sections:
        raise ShapeMismatch(f"{where}: expected num > 0 or non-empty sections, got neither")
    sizes = [int(s) for s in sections]
    unknown = [i for i, s in enumerate(sizes) if s == -1]
    if len(unknown) > 1 or any(s < -1 for s in sizes):
        raise ShapeMismatch(f"{where}: expected sections >= 0 with at most one -1, got {sizes}")
    known = sum(s for s in sizes if s >= 0)
    if dim >= 0 and (known > dim if unknown else known != dim):
        raise ShapeMismatch(f"{where}: expected sections to add up to the dim's size {dim}, "
                            f"got {sizes}")
    if dim >= 0 and unknown:
        sizes[unknown[0]] = dim - known
    return sizes


def _split_infer(X, AxisTensor=None, SectionsTensorList=None, *, num, sections, axis):
    n = num if num > 0 else len(SectionsTensorList or []) or len(sections)
    if n == 0:
        raise ShapeMismatch("split: expected num > 0 or non-empty sections, got neither")
    if AxisTensor is not None:
        return {"Out": [X.with_(shape=(-1,) * X.ndim)] * n}
    a = norm_axis(axis, X.ndim, "axis")
    where = f"split of X {list(X.shape)} along axis {a}"
    if SectionsTensorList:
        sizes = [-1] * len(SectionsTensorList)
    else:
        sizes = _split_sizes(X.shape[a], num, sections, where)
    return {"Out": [X.with_(shape=X.shape[:a] + (s,) + X.shape[a + 1:]) for s in sizes]}


def _split_ref(X, AxisTensor=None, SectionsTensorList=None, *, num, sections, axis):
    if AxisTensor is not None:
        axis = int_values(AxisTensor)[0]
    if SectionsTensorList:
        sections = int_values(SectionsTensorList)
    a = norm_axis(axis, X.ndim, "axis")
    sizes = _split_sizes(X.shape[a], num, sections, f"split of X {list(X.shape)} along axis {a}")
    return {"Out": [np.ascontiguousarray(p)
                    for p in np.split(X, np.cumsum(sizes)[:-1], axis=a)]}


register_op(
    "split", inputs=["X", "AxisTensor?", "SectionsTensorList*?"], outputs=["Out*"],
    attrs={"sections": Ints([]), "num": Int(0, low=0, high=3), "axis": Int(0, low=-2, high=2)},
    traits=[OPAQUE], infer_shape=_split_infer, reference=_split_ref, emit=None,
    grad=lambda op: _split_grad(op),
    doc="Out = X cut along axis into num equal pieces, or pieces of the sizes in sections "
        "(one -1 takes the rest).")


# ---- slice -----------------------------------------------------------------------------------
def _clamp_range(start, end, dim):
    """Python-style bounds of a step-1 slice, clamped into [0, dim] (Paddle's rule)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    return start, max(end, start)


def _slice_plan(shape, axes, starts, ends, decrease_axis, runtime, unknown=()):
    """(out dims before decreasing, kept axes); ``unknown`` lists axes whose bounds are tensors."""
    rank = len(shape)
    axes = [norm_axis(int(a), rank, "axes") for a in axes]
    if not unknown and (len(starts) != len(axes) or len(ends) != len(axes)):
        raise ShapeMismatch(f"slice: expected starts and ends of length {len(axes)} (one per "
                            f"axis), got {len(starts)} and {len(ends)}")
    out = list(shape)
    for i, a in enumerate(axes):
        if i in unknown or shape[a] < 0:
            out[a] = -1
        else:
            s, e = _clamp_range(int(starts[i]), int(ends[i]), shape[a])
            out[a] = e - s
    dec = {norm_axis(int(a), rank, "decrease_axis") for a in decrease_axis}
    for a in sorted(dec):
        if a not in axes:
            raise ShapeMismatch(f"slice: decrease_axis {list(decrease_axis)} must name sliced "
                                f"axes {axes}: expected a subset, got axis {a}")
        if out[a] not in (1, -1) or (runtime and out[a] != 1):
            raise ShapeMismatch(f"slice: decreased axis {a} must have size 1: expected 1, got "
                                f"{out[a]}")
    return axes, out, [a for a in range(rank) if a not in dec]


def _slice_infer(Input, StartsTensor=None, EndsTensor=None, StartsTensorList=None,
                 EndsTensorList=None, *, axes, starts, ends, infer_flags, decrease_axis):
    from_tensor = (StartsTensor is not None or EndsTensor is not None or bool(StartsTensorList)
                   or bool(EndsTensorList))
    unknown = set(range(len(axes))) if from_tensor else \
        {i for i, f in enumerate(infer_flags) if f == -1}
    _, out, keep = _slice_plan(Input.shape, axes, starts, ends, decrease_axis, False, unknown)
    return {"Out": Input.with_(shape=tuple(out[a] for a in keep))}


def _slice_index(shape, StartsTensor, EndsTensor, StartsTensorList, EndsTensorList, *, axes,
                 starts, ends, decrease_axis):
    """(the index of the slice into an array of ``shape``, its shape before decrease_axis, the
    shape after), with tensor-valued bounds read."""
    starts = int_values(StartsTensorList) if StartsTensorList else \
        int_values(StartsTensor) if StartsTensor is not None else starts
    ends = int_values(EndsTensorList) if EndsTensorList else \
        int_values(EndsTensor) if EndsTensor is not None else ends
    axes_n, out, keep = _slice_plan(shape, axes, starts, ends, decrease_axis, True)
    index = [slice(None)] * len(shape)
    for i, a in enumerate(axes_n):
        index[a] = slice(*_clamp_range(int(starts[i]), int(ends[i]), shape[a]))
    return tuple(index), tuple(out), tuple(out[a] for a in keep)


def _slice_ref(Input, StartsTensor=None, EndsTensor=None, StartsTensorList=None,
               EndsTensorList=None, *, axes, starts, ends, infer_flags, decrease_axis):
    index, _, out = _slice_index(Input.shape, StartsTensor, EndsTensor, StartsTensorList,
                                 EndsTensorList, axes=axes, starts=starts, ends=ends,
                                 decrease_axis=decrease_axis)
    return {"Out": np.ascontiguousarray(Input[index]).reshape(out)}


register_op(
    "slice", inputs=["Input", "StartsTensor?", "EndsTensor?", "StartsTensorList*?",
                     "EndsTensorList*?"], outputs=["Out"],
    attrs={"axes": Ints(REQUIRED, choices=([0], [1], [0, 1])), "starts": Ints([]), "ends": Ints([]),
           "infer_flags": Ints([]),
           "decrease_axis": Ints([])},
    traits=[OPAQUE], infer_shape=_slice_infer, reference=_slice_ref, emit=None,
    grad=default_grad("slice_grad", fwd_inputs=("Input", "StartsTensor", "EndsTensor",
                                                "StartsTensorList", "EndsTensorList"),
                      wrt=("Input",)),
    doc="Out = Input[starts:ends] along axes (Python-style bounds, clamped); decrease_axis "
        "drops those size-1 axes.")


# ---- gather / one_hot_v2 ---------------------------------------------------------------------
def _gather_infer(X, Index, Axis=None, *, axis):
    check_dtype(Index, INDEX, "input Index")
    if Index.ndim > 2 or (Index.ndim == 2 and Index.shape[1] not in (1, -1)):
        raise ShapeMismatch(f"gather: expected Index of rank 0 or 1 (or [N, 1]), got shape "
                            f"{list(Index.shape)}")
    if X.ndim == 0:
        raise ShapeMismatch("gather: expected X of rank >= 1, got a 0-d tensor")
    mid = () if Index.ndim == 0 else (Index.shape[0],)
    if Axis is not None:
        return {"Out": X.with_(shape=(-1,) * (X.ndim - 1 + len(mid)))}
    a = norm_axis(axis, X.ndim, "axis")
    return {"Out": X.with_(shape=X.shape[:a] + mid + X.shape[a + 1:])}


def _gather_plan(X, Index, Axis, axis, what="gather"):
    """(the axis gathered along, the indices as int64 in 0..n-1), every index checked."""
    if Axis is not None:
        axis = int_values(Axis)[0]
    a = norm_axis(axis, X.ndim, "axis")
    n = X.shape[a]
    idx = Index.reshape(-1) if Index.ndim == 2 else Index
    bad = (idx < -n) | (idx >= n)
    if np.any(bad):  # negative indices count from the end (Paddle 3.x); beyond that: an error
        raise IndexError(f"{what}: index {int(idx[bad].reshape(-1)[0])} is out of range for "
                         f"axis {a} of size {n}: expected -{n} <= index < {n}")
    idx = idx.astype(np.int64)
    return a, np.where(idx < 0, idx + n, idx)


def _gather_ref(X, Index, Axis=None, *, axis):
    a, idx = _gather_plan(X, Index, Axis, axis)
    return {"Out": np.take(X, idx, axis=a)}


register_op(
    "gather", inputs=["X", "Index", "Axis?"], outputs=["Out"],
    attrs={"axis": Int(0, low=-2, high=2)}, traits=[OPAQUE], infer_shape=_gather_infer,
    reference=_gather_ref, emit=None,
    grad=default_grad("gather_grad", fwd_inputs=("X", "Index", "Axis")),
    doc="Out = X's slices at Index along axis (Axis, a 1-element tensor, overrides axis).")


def _one_hot_infer(X, depth_tensor=None, *, depth, dtype, allow_out_of_range):
    check_dtype(X, INDEX, "input X")
    if depth_tensor is None and depth < 1:
        raise ShapeMismatch(f"one_hot_v2: expected depth >= 1 (or a depth_tensor), got {depth}")
    try:
        out = dtypes.to_numpy(dtype)
    except TypeError as e:
        raise ShapeMismatch(f"one_hot_v2: dtype: {e}") from None
    return {"Out": X.with_(shape=X.shape + (depth if depth_tensor is None else -1,), dtype=out)}


def _one_hot_ref(X, depth_tensor=None, *, depth, dtype, allow_out_of_range):
    if depth_tensor is not None:
        depth = int_values(depth_tensor)[0]
    bad = (X < 0) | (X >= depth)
    if np.any(bad) and not allow_out_of_range:
        raise IndexError(f"one_hot_v2: index {int(X[bad].reshape(-1)[0])} is out of range: "
                         f"expected 0 <= index < depth = {depth}")
    # out-of-range rows stay all zero when allowed (Fluid's allow_out_of_range)
    out = (X[..., None] == np.arange(depth)).astype(dtypes.to_numpy(dtype))
    return {"Out": out}


register_op(
    "one_hot_v2", inputs=["X", "depth_tensor?"], outputs=["Out"],
    attrs={"depth": Int(-1, low=1, high=8), "dtype": Int(5, choices=(5, 6, 3)),
           "allow_out_of_range": Bool(False)},
    traits=[OPAQUE], infer_shape=_one_hot_infer, reference=_one_hot_ref, emit=None, grad=None,
    doc="Out = X's values one-hot encoded in a new last dim of size depth.")


# ---- gradients ---------------------------------------------------------------------------------
# Paddle's grad ops and slots: concat_grad (X, AxisTensor?, Out@GRAD -> X@GRAD list), split's
# gradient is a plain ``concat`` of the Out@GRADs, stack_grad (X, Y@GRAD -> X@GRAD list),
# slice_grad (the forward inputs and attrs + Out@GRAD -> Input@GRAD), gather_grad (X, Index,
# Axis?, Out@GRAD -> X@GRAD). Each reads only shapes from the forward inputs.
def _same_metas(slot):
    """infer_shape of a grad op whose ``slot@GRAD`` output(s) mirror forward input ``slot``."""
    return lambda **kw: {f"{slot}@GRAD": kw[slot]}


def _concat_grad_ref(X, AxisTensor=None, *, axis, **kw):
    g = kw["Out@GRAD"]
    if AxisTensor is not None:
        axis = int_values(AxisTensor)[0]
    a = norm_axis(axis, X[0].ndim, "axis")
    sizes = [x.shape[a] for x in X]
    if g.ndim != X[0].ndim or g.shape[a] != sum(sizes):
        raise ShapeMismatch(f"concat_grad: expected Out@GRAD with {sum(sizes)} entries along "
                            f"axis {a} (the inputs' {sizes}), got shape {list(g.shape)}")
    pieces = np.split(g, np.cumsum(sizes)[:-1], axis=a)
    return {"X@GRAD": [np.ascontiguousarray(p, dtype=x.dtype) for p, x in zip(pieces, X)]}


register_op(
    "concat_grad", inputs=["X*", "AxisTensor?", "Out@GRAD"], outputs=["X@GRAD*?"],
    attrs={"axis": Int(0)}, traits=[OPAQUE], infer_shape=_same_metas("X"),
    reference=_concat_grad_ref, emit=None, grad=None,
    doc="X@GRAD[i] = the piece of Out@GRAD that X[i] filled along axis; concat's gradient.")


def _split_grad(op):
    """split's gradient joins the Out@GRADs again: a ``concat`` along the same axis, as in
    Paddle. An output nobody used has no gradient; the backward pass binds zeros for it."""
    ins = {"X": [grad_var_name(n) for n in op.output("Out")]}
    if op.input("AxisTensor"):
        ins["AxisTensor"] = op.input("AxisTensor")
    # Paddle copies num and sections too; pdjit's concat declares axis only, and needs no more
    return [GradOpSpec("concat", ins, {"Out": [grad_var_name(n) for n in op.input("X")]},
                       {"axis": op.attr("axis")})]


def _stack_grad_ref(X, *, axis, **kw):
    g = kw["Y@GRAD"]
    a = norm_axis(axis, X[0].ndim + 1, "axis")
    if g.ndim != X[0].ndim + 1 or g.shape[a] != len(X):
        raise ShapeMismatch(f"stack_grad: expected Y@GRAD of rank {X[0].ndim + 1} with "
                            f"{len(X)} entries along axis {a}, got shape {list(g.shape)}")
    return {"X@GRAD": [np.ascontiguousarray(np.take(g, i, axis=a), dtype=x.dtype)
                       for i, x in enumerate(X)]}


register_op(
    "stack_grad", inputs=["X*", "Y@GRAD"], outputs=["X@GRAD*?"], attrs={"axis": Int(0)},
    traits=[OPAQUE], infer_shape=_same_metas("X"), reference=_stack_grad_ref, emit=None,
    grad=None, doc="X@GRAD[i] = Y@GRAD's entry i along axis; stack's gradient.")


def _slice_grad_ref(Input, StartsTensor=None, EndsTensor=None, StartsTensorList=None,
                    EndsTensorList=None, *, axes, starts, ends, infer_flags, decrease_axis, **kw):
    g = kw["Out@GRAD"]
    index, full, out = _slice_index(Input.shape, StartsTensor, EndsTensor, StartsTensorList,
                                    EndsTensorList, axes=axes, starts=starts, ends=ends,
                                    decrease_axis=decrease_axis)
    if g.shape != out:
        raise ShapeMismatch(f"slice_grad: expected Out@GRAD of shape {list(out)} (the slice's), "
                            f"got {list(g.shape)}")
    dx = np.zeros(Input.shape, Input.dtype)
    # decrease_axis dropped size-1 axes from Out: put them back before writing the slice
    dx[index] = g.reshape(full)
    return {"Input@GRAD": dx}


register_op(
    "slice_grad", inputs=["Input", "StartsTensor?", "EndsTensor?", "StartsTensorList*?",
                          "EndsTensorList*?", "Out@GRAD"], outputs=["Input@GRAD?"],
    attrs={"axes": Ints(REQUIRED, choices=([0], [1], [0, 1])), "starts": Ints([]), "ends": Ints([]),
           "infer_flags": Ints([]),
           "decrease_axis": Ints([])},
    traits=[OPAQUE], infer_shape=_same_metas("Input"), reference=_slice_grad_ref, emit=None,
    grad=None, doc="Input@GRAD = zeros with Out@GRAD written at the slice; slice's gradient.")


def _gather_grad_ref(X, Index, Axis=None, *, axis, **kw):
    g = kw["Out@GRAD"]
    a, idx = _gather_plan(X, Index, Axis, axis, "gather_grad")
    want = X.shape[:a] + idx.shape + X.shape[a + 1:]
    if g.shape != want:
        raise ShapeMismatch(f"gather_grad: expected Out@GRAD of shape {list(want)} (gather's "
                            f"output), got {list(g.shape)}")
    dx = np.zeros(X.shape, X.dtype)
    # an index taken several times receives the sum of its rows' gradients: add.at
    # accumulates repeats where plain fancy assignment would keep only the last
    moved = np.moveaxis(dx, a, 0)
    # (a 0-d Index took one slice and dropped the axis: g already has that slice's shape)
    np.add.at(moved, idx, np.moveaxis(g, a, 0) if idx.ndim else g)
    return {"X@GRAD": dx}


register_op(
    "gather_grad", inputs=["X", "Index", "Axis?", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs={"axis": Int(0)}, traits=[OPAQUE], infer_shape=_same_metas("X"),
    reference=_gather_grad_ref, emit=None, grad=None,
    doc="X@GRAD = zeros with Out@GRAD's slices added at Index along axis (repeated indices "
        "add up); gather's gradient.")
