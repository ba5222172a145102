"""Select and join ops: concat, stack, split, slice, gather, one_hot_v2; and the indexing ops
NLP programs use: lookup_table (v1), index_select, gather_nd, scatter, where, where_index,
masked_select, cumsum, argsort; all with their gradients where one flows.

Semantics follow PaddlePaddle 3.3.1's legacy ops (slots, attributes, defaults and grad ops
checked against it). Index-taking ops check every index and raise a clear error for one out of
range; they never read outside an array. Ops reading tensor-valued attributes (``AxisTensor``,
``StartsTensor``...) give ``-1`` for the dims those values decide; the reference reads the values
at run time.

Natively: concat, stack, split, slice (with attribute axes and bounds; tensor-valued ones run the
references) as views and copies in host lines; the index-taking ops through each target's
lowerings (``codegen/<target>/lowerings/indexing.py``); where as an elementwise template, so it
fuses.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    ELEMENTWISE,
    EMPTY_VAR_NAME,
    OPAQUE,
    REQUIRED,
    Bool,
    GradOpSpec,
    Int,
    Ints,
    Layout,
    Long,
    Longs,
    Opaque,
    RowWise,
    Str,
    Strs,
    default_grad,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import (
    FLOATS,
    INDEX,
    NUMERIC,
    broadcast_shapes,
    check_dtype,
    int_values,
    norm_axis,
    prod_known,
    reduce_to_shape,
)

_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


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


def _concat_lower(ctx):
    """``np.concatenate`` of the inputs along a build-time axis (AxisTensor: the reference)."""
    if ctx.has_input("AxisTensor"):
        return None
    n = len(ctx.op.input("X"))
    r = ctx.rank("X")
    if r == 0 or any(ctx.dtype("X", i) != ctx.dtype("X") or ctx.rank("X", i) != r
                     for i in range(n)):
        return None
    a = norm_axis(ctx.attrs["axis"], r)
    xs = ctx.tuple_src(ctx.inp("X", i) for i in range(n))
    return [f"{ctx.out('Out')} = np.concatenate({xs}, axis={a})"]


register_op(
    "concat", inputs=["X*", "AxisTensor?"], outputs=["Out"],
    row_wise=RowWise(every=True, axes=("axis",)),
    attrs={"axis": Int(0, low=-2, high=2, axis_of="X")},
    traits=[OPAQUE], infer_shape=_concat_infer, reference=_concat_ref,
    emit=Opaque(_concat_lower, host=True),
    grad=default_grad("concat_grad", fwd_inputs=("X", "AxisTensor")),
    # (along the channels of NCHW images, axis 1; of NHWC ones, axis 3)
    layout=Layout(inputs=("X",), outputs=("Out",), attr="axis", first=1, last=3, follow=True),
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


register_op("stack", inputs=["X*"], outputs=["Y"],
            attrs={"axis": Int(0, low=-2, high=2, axis_of="X", axis_extra=1)},
            traits=[OPAQUE], infer_shape=_stack_infer, reference=_stack_ref,
            emit=Opaque(lambda ctx: _stack_lower(ctx), host=True),
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
    row_wise=RowWise(axes=("axis",)),
    attrs={"sections": Ints([]), "num": Int(0, low=0, high=3, at_least=0),
           "axis": Int(0, low=-2, high=2, axis_of="X")},
    traits=[OPAQUE], infer_shape=_split_infer, reference=_split_ref,
    emit=Opaque(lambda ctx: _split_lower(ctx), host=True),
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


def _bound_src(v, dim: str) -> str:
    """Source of a Python-style slice bound ``v`` clamped into ``[0, dim]``."""
    v = int(v)
    return f"min(max({v} + {dim}, 0), {dim})" if v < 0 else f"min({v}, {dim})"


def _slice_lower_parts(ctx):
    """(lines binding the clamped bounds, the index source, dims before and after
    decrease_axis) of a slice with attribute bounds; None for tensor-valued bounds."""
    if any(ctx.has_input(s) for s in ("StartsTensor", "EndsTensor", "StartsTensorList",
                                      "EndsTensorList")):
        return None
    a = ctx.attrs
    r = ctx.rank("Input")
    if r == 0 or len(a["starts"]) != len(a["axes"]) or len(a["ends"]) != len(a["axes"]):
        return None
    X = ctx.inp("Input")
    axes = [norm_axis(int(x), r) for x in a["axes"]]
    if len(set(axes)) != len(axes):
        return None
    dec = {norm_axis(int(x), r) for x in a["decrease_axis"]}
    if not dec <= set(axes):
        return None
    lines, index, full = [], [":"] * r, [f"{X}.shape[{i}]" for i in range(r)]
    for ax, st, en in zip(axes, a["starts"], a["ends"]):
        d, s, e = f"{X}.shape[{ax}]", ctx.tmp("s"), ctx.tmp("e")
        lines += [f"{s} = {_bound_src(st, d)}", f"{e} = max({_bound_src(en, d)}, {s})"]
        index[ax] = f"{s}:{e}"
        full[ax] = f"{e} - {s}"
    kept = [full[i] for i in range(r) if i not in dec]
    for ax in sorted(dec):
        lines.append(f"_rt.check({full[ax]} == 1)")
    return lines, ", ".join(index), full, kept


def _slice_lower(ctx):
    parts = _slice_lower_parts(ctx)
    if parts is None:
        return None  # tensor bounds: the reference
    lines, index, _, kept = parts
    X = ctx.inp("Input")
    return lines + [f"{ctx.out('Out')} = {X}[{index}].copy().reshape({ctx.tuple_src(kept)})"]


register_op(
    "slice", inputs=["Input", "StartsTensor?", "EndsTensor?", "StartsTensorList*?",
                     "EndsTensorList*?"], outputs=["Out"],
    row_wise=RowWise(batch=("Input",), axes=("axes", "decrease_axis")),
    attrs={"axes": Ints(REQUIRED, choices=([0], [1], [0, 1])), "starts": Ints([]), "ends": Ints([]),
           "infer_flags": Ints([]),
           "decrease_axis": Ints([])},
    traits=[OPAQUE], infer_shape=_slice_infer, reference=_slice_ref,
    emit=Opaque(_slice_lower, host=True),
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
    attrs={"axis": Int(0, low=-2, high=2, axis_of="X")}, traits=[OPAQUE],
    infer_shape=_gather_infer,
    reference=_gather_ref, emit=Opaque(),
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
    "one_hot_v2", inputs=["X", "depth_tensor?"], outputs=["Out"], row_wise=RowWise(),
    attrs={"depth": Int(-1, low=1, high=8), "dtype": Int(5, choices=(5, 6, 3)),
           "allow_out_of_range": Bool(False)},
    traits=[OPAQUE], infer_shape=_one_hot_infer, reference=_one_hot_ref,
    emit=Opaque(lambda ctx: _one_hot_lower(ctx), flat=True), grad=None,
    doc="Out = X's values one-hot encoded in a new last dim of size depth.")


# ---- gradients -------------------------------------------------------------------------------
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


def _concat_grad_lower(ctx):
    """Each X@GRAD a copy of its piece of Out@GRAD along the axis."""
    if ctx.has_input("AxisTensor"):
        return None
    xs, gs = ctx.op.input("X"), ctx.op.output("X@GRAD")
    r = ctx.rank("X")
    if len(gs) != len(xs) or r == 0 or ctx.rank("Out@GRAD") != r:
        return None
    a = norm_axis(ctx.attrs["axis"], r)
    g, at = ctx.inp("Out@GRAD"), ctx.tmp("at")
    lines = [f"{at} = 0"]
    for i, name in enumerate(gs):
        x = ctx.inp("X", i)
        if name != EMPTY_VAR_NAME:
            if ctx.dtype("X@GRAD", i) != ctx.dtype("Out@GRAD"):
                return None
            index = ", ".join([":"] * a + [f"{at}:{at} + {x}.shape[{a}]"])
            lines.append(f"{ctx.out('X@GRAD', i)} = {g}[{index}].copy()")
        lines.append(f"{at} += {x}.shape[{a}]")
    lines.append(f"_rt.check({at} == {g}.shape[{a}])")
    return lines


register_op(
    "concat_grad", inputs=["X*", "AxisTensor?", "Out@GRAD"], outputs=["X@GRAD*?"],
    attrs={"axis": Int(0)}, traits=[OPAQUE], infer_shape=_same_metas("X"),
    reference=_concat_grad_ref, emit=Opaque(_concat_grad_lower, host=True), grad=None,
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
    traits=[OPAQUE], infer_shape=_same_metas("X"), reference=_stack_grad_ref,
    emit=Opaque(lambda ctx: _stack_grad_lower(ctx), host=True),
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
    traits=[OPAQUE], infer_shape=_same_metas("Input"), reference=_slice_grad_ref,
    emit=Opaque(lambda ctx: _slice_grad_lower(ctx), host=True),
    grad=None, doc="Input@GRAD = zeros with Out@GRAD written at the slice; slice's gradient.")


def _slice_grad_lower(ctx):
    parts = _slice_lower_parts(ctx)
    if parts is None or not ctx.has_output("Input@GRAD") \
            or ctx.dtype("Out@GRAD") != ctx.dtype("Input"):
        return None
    lines, index, full, _ = parts
    X, g = ctx.inp("Input"), ctx.inp("Out@GRAD")
    dx = ctx.out("Input@GRAD", shape=f"{X}.shape", zero=True)
    return lines + [f"{dx}[{index}] = {g}.reshape({ctx.tuple_src(full)})"]


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
    reference=_gather_grad_ref, emit=Opaque(),
    grad=None,
    doc="X@GRAD = zeros with Out@GRAD's slices added at Index along axis (repeated indices "
        "add up); gather's gradient.")


# ==== issue 16: the indexing ops NLP programs use, natively ======================================
# Each lowers to host lines calling the kernels of ``pdjit.codegen.cpu.lib.indexing`` on a
# ``(A, N, B)`` view of its data (the indexed axis in the middle) or on flat arrays with their
# dims as values, so one compilation per dtype serves every shape, rank and axis. Every index is
# checked by the kernels; one out of range makes the plan re-run the reference, which raises
# the IndexError naming the op.
_NO_PAD = -(2 ** 63)


def _check_index(idx: np.ndarray, n: int, what: str, wrap: bool) -> np.ndarray:
    """``idx`` as int64 in ``0..n-1`` (``-n..-1`` counted from the end with ``wrap``)."""
    idx = np.asarray(idx).astype(np.int64)
    low = -n if wrap else 0
    bad = (idx < low) | (idx >= n)
    if np.any(bad):
        raise IndexError(f"{what}: index {int(idx[bad].reshape(-1)[0])} is out of range: "
                         f"expected {low} <= index < {n}")
    return np.where(idx < 0, idx + n, idx)


# ---- lookup_table (v1) -----------------------------------------------------------------------
_LOOKUP_ATTRS = {
    "padding_idx": Long(-1, low=-1, high=3), "is_sparse": Bool(False),
    "is_distributed": Bool(False), "remote_prefetch": Bool(False), "is_test": Bool(False),
    "entry_config": Str(""), "entry": Str("none"), "table_class": Str("none"),
    "table_names": Strs([]), "trainer_id": Int(0), "slot": Int(0), "grad_inplace": Bool(False),
    "epmap": Strs([]), "height_sections": Longs([])}


def _lookup_check(W, Ids, op):
    check_dtype(Ids, INDEX, f"{op}: Ids")
    check_dtype(W, FLOATS, f"{op}: W")
    if W.ndim != 2:
        raise ShapeMismatch(f"{op}: expected W a 2-D table [rows, width], got shape "
                            f"{list(W.shape)}")
    if Ids.ndim < 1 or Ids.shape[-1] not in (1, -1):
        raise ShapeMismatch(f"{op}: expected Ids with a last dim of 1 ([N, 1]), got shape "
                            f"{list(Ids.shape)}")


def _lookup_v1_infer(W, Ids, **_):
    _lookup_check(W, Ids, "lookup_table")
    return {"Out": W.with_(shape=Ids.shape[:-1] + (W.shape[1],), lod_level=Ids.lod_level)}


def _lookup_ids(W, Ids, padding_idx, op):
    """(flat ids, padding mask), every id not padding checked against W's rows."""
    if Ids.ndim < 1 or Ids.shape[-1] != 1:
        raise ShapeMismatch(f"{op}: expected Ids with a last dim of 1 ([N, 1]), got shape "
                            f"{list(Ids.shape)}")
    ids = Ids.astype(np.int64).reshape(-1)
    pad = ids == padding_idx if padding_idx != -1 else np.zeros(ids.shape, bool)
    _check_index(ids[~pad], W.shape[0], f"{op}: Ids", False)
    return ids, pad


def _lookup_v1_ref(W, Ids, *, padding_idx, **_):
    ids, pad = _lookup_ids(W, Ids, padding_idx, "lookup_table")
    out = W[np.where(pad, 0, ids)]
    out[pad] = 0
    return {"Out": out.reshape(Ids.shape[:-1] + (W.shape[1],))}


register_op(
    "lookup_table", inputs=["W", "Ids"], outputs=["Out"], attrs=dict(_LOOKUP_ATTRS),
    row_wise=RowWise(batch=("Ids",), const=("W",)),
    traits=[OPAQUE], infer_shape=_lookup_v1_infer, reference=_lookup_v1_ref,
    emit=Opaque(),
    grad=default_grad("lookup_table_grad", fwd_inputs=("W", "Ids"), wrt=("W",)),
    doc="Out[n, :] = W[Ids[n, 0], :] (Ids of shape [..., 1]); rows for padding_idx (unless -1) "
        "are zeros. is_sparse is ignored: the gradient is dense.")


def _lookup_v1_grad_ref(W, Ids, *, padding_idx, **kw):
    g = kw["Out@GRAD"]
    ids, pad = _lookup_ids(W, Ids, padding_idx, "lookup_table_grad")
    if g.size != ids.size * W.shape[1]:
        raise ShapeMismatch(f"lookup_table_grad: expected Out@GRAD of shape "
                            f"{list(Ids.shape[:-1]) + [W.shape[1]]}, got {list(g.shape)}")
    dw = np.zeros(W.shape, W.dtype)
    np.add.at(dw, ids[~pad], g.reshape(ids.size, W.shape[1])[~pad])
    return {"W@GRAD": dw}


register_op(
    "lookup_table_grad", inputs=["W", "Ids", "Out@GRAD"], outputs=["W@GRAD?"],
    attrs=dict(_LOOKUP_ATTRS), traits=[OPAQUE], infer_shape=_same_metas("W"),
    reference=_lookup_v1_grad_ref, emit=Opaque(), grad=None,
    doc="W@GRAD (dense) = the sum of the Out@GRAD rows of each row's lookups; padding_idx's "
        "row stays zero.")


# ---- index_select ----------------------------------------------------------------------------
def _index_vector(Index, op):
    check_dtype(Index, INDEX, f"{op}: Index")
    if Index.ndim not in (1, 2) or (Index.ndim == 2 and Index.shape[1] not in (1, -1)):
        raise ShapeMismatch(f"{op}: expected Index of rank 1 (or [N, 1]), got shape "
                            f"{list(Index.shape)}")


def _index_select_infer(X, Index, *, dim):
    _index_vector(Index, "index_select")
    d = norm_axis(dim, X.ndim, "index_select: dim")
    return {"Out": X.with_(shape=X.shape[:d] + (Index.shape[0],) + X.shape[d + 1:])}


def _index_select_ref(X, Index, *, dim):
    d = norm_axis(dim, X.ndim, "index_select: dim")
    idx = _check_index(Index.reshape(-1), X.shape[d], "index_select: Index", True)
    return {"Out": np.take(X, idx, axis=d)}


register_op(
    "index_select", inputs=["X", "Index"], outputs=["Out"], attrs={"dim": Int(0, low=-2, high=1,
                                                                               axis_of="X")},
    traits=[OPAQUE], infer_shape=_index_select_infer, reference=_index_select_ref,
    emit=Opaque(),
    grad=default_grad("index_select_grad", fwd_inputs=("X", "Index")),
    doc="Out = X's slices at Index along dim (negative indices count from the end).")


def _index_select_grad_ref(X, Index, *, dim, **kw):
    g = kw["Out@GRAD"]
    d = norm_axis(dim, X.ndim, "index_select_grad: dim")
    idx = _check_index(Index.reshape(-1), X.shape[d], "index_select_grad: Index", True)
    want = X.shape[:d] + (idx.size,) + X.shape[d + 1:]
    if g.shape != want:
        raise ShapeMismatch(f"index_select_grad: expected Out@GRAD of shape {list(want)}, got "
                            f"{list(g.shape)}")
    dx = np.zeros(X.shape, X.dtype)
    np.add.at(np.moveaxis(dx, d, 0), idx, np.moveaxis(g, d, 0))
    return {"X@GRAD": dx}


register_op(
    "index_select_grad", inputs=["X", "Index", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs={"dim": Int(0)}, traits=[OPAQUE], infer_shape=_same_metas("X"),
    reference=_index_select_grad_ref, emit=Opaque(),
    grad=None, doc="X@GRAD = zeros with Out@GRAD's slices added at Index along dim (a negative "
                   "index's slice too: Paddle 3.3.1's CPU grad kernel drops those, which "
                   "finite differences contradict).")


# ---- gather_nd -------------------------------------------------------------------------------
def _gather_nd_infer(X, Index):
    check_dtype(Index, INDEX, "gather_nd: Index")
    if Index.ndim < 1:
        raise ShapeMismatch("gather_nd: expected Index of rank >= 1, got a 0-d tensor")
    k = Index.shape[-1]
    if k < 0:
        raise ShapeMismatch(f"gather_nd: Index's last dim (the depth of each index) must be "
                            f"known when the program is built, got shape {list(Index.shape)}")
    if k > X.ndim:
        raise ShapeMismatch(f"gather_nd: expected Index's last dim <= X's rank {X.ndim}, got "
                            f"{k} (Index {list(Index.shape)}, X {list(X.shape)})")
    return {"Out": X.with_(shape=Index.shape[:-1] + X.shape[k:])}


def _gather_nd_rows(X, Index, op):
    """(X as rows [prod(X.shape[:k]), rest], the row of each index, Out's shape)."""
    k = Index.shape[-1]
    if k > X.ndim:
        raise ShapeMismatch(f"{op}: expected Index's last dim <= X's rank {X.ndim}, got {k}")
    lead = X.shape[:k]
    idx = Index.reshape(-1, k).astype(np.int64)
    rows = np.zeros(idx.shape[0], np.int64)
    for j in range(k):
        col = _check_index(idx[:, j], lead[j], f"{op}: Index[..., {j}]", True)
        rows = rows * lead[j] + col
    return X.reshape((int(np.prod(lead, dtype=np.int64)), -1) if X.size else
                     (int(np.prod(lead, dtype=np.int64)), int(np.prod(X.shape[k:])))), rows, \
        Index.shape[:-1] + X.shape[k:]


def _gather_nd_ref(X, Index):
    x2, rows, shape = _gather_nd_rows(X, Index, "gather_nd")
    return {"Out": x2[rows].reshape(shape)}


register_op(
    "gather_nd", inputs=["X", "Index"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=_gather_nd_infer, reference=_gather_nd_ref,
    emit=Opaque(),
    grad=default_grad("gather_nd_grad", fwd_inputs=("X", "Index")),
    doc="Out[i...] = X[Index[i..., :]] (an index of depth k picks a slice X[j0, ..., jk-1]; "
        "negative entries count from the end).")


def _gather_nd_grad_ref(X, Index, **kw):
    g = kw["Out@GRAD"]
    x2, rows, shape = _gather_nd_rows(X, Index, "gather_nd_grad")
    if g.shape != tuple(shape):
        raise ShapeMismatch(f"gather_nd_grad: expected Out@GRAD of shape {list(shape)}, got "
                            f"{list(g.shape)}")
    dx = np.zeros(x2.shape, X.dtype)
    np.add.at(dx, rows, g.reshape(rows.size, x2.shape[1]))
    return {"X@GRAD": dx.reshape(X.shape)}


register_op(
    "gather_nd_grad", inputs=["X", "Index", "Out@GRAD"], outputs=["X@GRAD?"], traits=[OPAQUE],
    infer_shape=_same_metas("X"), reference=_gather_nd_grad_ref,
    emit=Opaque(), grad=None,
    doc="X@GRAD = zeros with Out@GRAD's slices added where Index picked them.")


# ---- scatter ---------------------------------------------------------------------------------
def _scatter_infer(X, Ids, Updates, **_):
    _index_vector(Ids, "scatter")
    if X.ndim < 1 or Updates.ndim != X.ndim:
        raise ShapeMismatch(f"scatter: expected Updates of X's rank {X.ndim}, got shape "
                            f"{list(Updates.shape)} (X {list(X.shape)})")
    _merge_dims([(-1,) + tuple(X.shape[1:]), (-1,) + tuple(Updates.shape[1:])],
                "scatter: Updates' dims after the first vs X's")
    if Updates.dtype != X.dtype:
        raise ShapeMismatch(f"scatter: expected Updates of X's dtype {X.dtype}, got "
                            f"{Updates.dtype}")
    return {"Out": X}


def _scatter_plan(X, Ids, Updates, op):
    ids = _check_index(Ids.reshape(-1), X.shape[0], f"{op}: Ids", True)
    if Updates is not None and (Updates.shape[0] != ids.size or Updates.shape[1:] != X.shape[1:]):
        raise ShapeMismatch(f"{op}: expected Updates of shape {[ids.size] + list(X.shape[1:])} "
                            f"(one row per id), got {list(Updates.shape)}")
    return ids


def _scatter_ref(X, Ids, Updates, *, overwrite):
    ids = _scatter_plan(X, Ids, Updates, "scatter")
    out = X.copy()
    if overwrite:
        for m, i in enumerate(ids):  # the last of repeated ids wins
            out[i] = Updates[m]
    else:
        out[ids] = 0
        np.add.at(out, ids, Updates)
    return {"Out": out}


register_op(
    "scatter", inputs=["X", "Ids", "Updates"], outputs=["Out"],
    attrs={"overwrite": Bool(True)}, traits=[OPAQUE], infer_shape=_scatter_infer,
    reference=_scatter_ref, emit=Opaque(),
    grad=default_grad("scatter_grad", fwd_inputs=("Ids", "Updates"), wrt=("X", "Updates")),
    doc="Out = X with row Ids[m] replaced by Updates[m] (overwrite: the last repeat wins; "
        "otherwise the rows at Ids are zeroed, then every update added).")


def _scatter_grad_infer(Ids, Updates, **kw):
    return {"X@GRAD": kw["Out@GRAD"], "Updates@GRAD": Updates}


def _scatter_grad_ref(Ids, Updates, *, overwrite, **kw):
    g = kw["Out@GRAD"]
    ids = _scatter_plan(g, Ids, Updates, "scatter_grad")
    dx = g.copy()
    dx[ids] = 0
    return {"X@GRAD": dx, "Updates@GRAD": g[ids].astype(Updates.dtype)}


register_op(
    "scatter_grad", inputs=["Ids", "Updates", "Out@GRAD"], outputs=["X@GRAD?", "Updates@GRAD?"],
    attrs={"overwrite": Bool(True)}, traits=[OPAQUE], infer_shape=_scatter_grad_infer,
    reference=_scatter_grad_ref, emit=Opaque(), grad=None,
    doc="X@GRAD = Out@GRAD with the rows at Ids zeroed; Updates@GRAD = Out@GRAD's rows at Ids.")


# ---- where / where_index / masked_select -----------------------------------------------------
def _where_infer(Condition, X, Y):
    if Condition.dtype != np.dtype(bool):
        raise ShapeMismatch(f"where: expected Condition of dtype bool, got {Condition.dtype}")
    if X.dtype != Y.dtype:
        raise ShapeMismatch(f"where: expected X and Y of one dtype, got {X.dtype} and {Y.dtype}")
    shape = _merge_dims([Condition.shape, X.shape, Y.shape], "where: Condition, X and Y")
    return {"Out": X.with_(shape=tuple(shape))}


def _where_ref(Condition, X, Y):
    _merge_dims([Condition.shape, X.shape, Y.shape], "where: Condition, X and Y")
    return {"Out": np.where(Condition, X, Y)}


register_op(
    "where", inputs=["Condition", "X", "Y"], outputs=["Out"], traits=[ELEMENTWISE],
    infer_shape=_where_infer, reference=_where_ref, emit="({X} if {Condition} else {Y})",
    grad=default_grad("where_grad", fwd_inputs=("Condition", "X", "Y"), wrt=("X", "Y")),
    doc="Out = X where Condition else Y (Condition, X, Y of one shape).")


def _where_grad_infer(Condition, X, Y, **_):
    return {"X@GRAD": X, "Y@GRAD": Y}


def _where_grad_ref(Condition, X, Y, **kw):
    g = kw["Out@GRAD"]
    zero = np.zeros((), g.dtype)
    return {"X@GRAD": np.where(Condition, g, zero).astype(X.dtype),
            "Y@GRAD": np.where(Condition, zero, g).astype(Y.dtype)}


def _where_grad_lower(ctx):
    c, g, X, Y = (ctx.inp(s) for s in ("Condition", "Out@GRAD", "X", "Y"))
    i = ctx.tmp("i")
    body = []
    for slot, src, when in (("X@GRAD", X, True), ("Y@GRAD", Y, False)):
        if ctx.has_output(slot):
            d, T = ctx.out(slot, shape=f"{src}.shape"), ctx.T(slot)
            body.append(f"    {d}[{i}] = {g}[{i}] if {'' if when else 'not '}{c}[{i}] else "
                        f"{T}(0)")
    return [f"for {i} in range({g}.shape[0]):"] + body


register_op(
    "where_grad", inputs=["Condition", "X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    traits=[OPAQUE], infer_shape=_where_grad_infer, reference=_where_grad_ref,
    emit=Opaque(_where_grad_lower, flat=True), grad=None,
    doc="X@GRAD = Out@GRAD where Condition else 0; Y@GRAD the other way round.")


def _where_index_infer(Condition):
    return {"Out": Condition.with_(shape=(-1, Condition.ndim), dtype=np.dtype(np.int64),
                                   lod_level=0)}


def _where_index_ref(Condition):
    return {"Out": np.argwhere(Condition).astype(np.int64).reshape(-1, Condition.ndim)}


register_op(
    "where_index", inputs=["Condition"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=_where_index_infer, reference=_where_index_ref,
    emit=Opaque(), grad=None,
    doc="Out = the coordinates [n, rank] (int64, C order) of Condition's true elements.")


def _masked_select_infer(X, Mask):
    if Mask.dtype != np.dtype(bool):
        raise ShapeMismatch(f"masked_select: expected Mask of dtype bool, got {Mask.dtype}")
    broadcast_shapes(X.shape, Mask.shape)  # X and Mask broadcast together (NumPy's rule)
    return {"Y": X.with_(shape=(-1,), lod_level=0)}


def _masked_select_ref(X, Mask):
    broadcast_shapes(X.shape, Mask.shape)
    xb, mb = np.broadcast_arrays(X, Mask)
    return {"Y": xb[mb]}


register_op(
    "masked_select", inputs=["X", "Mask"], outputs=["Y"], traits=[OPAQUE],
    infer_shape=_masked_select_infer, reference=_masked_select_ref,
    emit=Opaque(),
    grad=default_grad("masked_select_grad", fwd_inputs=("X", "Mask"), grad_outputs=("Y",)),
    doc="Y = X's elements where Mask is true (X and Mask broadcast together, NumPy's rule), in "
        "C order, as a 1-D tensor.")


def _masked_select_grad_ref(X, Mask, **kw):
    g = kw["Y@GRAD"]
    full = broadcast_shapes(X.shape, Mask.shape)
    mb = np.broadcast_to(Mask, full)
    if g.size != int(mb.sum()):
        raise ShapeMismatch(f"masked_select_grad: expected Y@GRAD of {int(mb.sum())} "
                            f"elements (Mask's true count), got {g.size}")
    dx = np.zeros(full, X.dtype)
    dx[mb] = g.reshape(-1)
    return {"X@GRAD": reduce_to_shape(dx, X.shape, -1, full).astype(X.dtype)}


register_op(
    "masked_select_grad", inputs=["X", "Mask", "Y@GRAD"], outputs=["X@GRAD?"], traits=[OPAQUE],
    infer_shape=_same_metas("X"), reference=_masked_select_grad_ref,
    emit=Opaque(), grad=None,
    doc="X@GRAD = Y@GRAD's elements back where Mask is true, zeros elsewhere, summed over the "
        "dims X was broadcast along.")


# ---- cumsum ----------------------------------------------------------------------------------
_CUMSUM_ATTRS = {"axis": Int(-1, low=-2, high=1, axis_of="X"), "flatten": Bool(False),
                 "exclusive": Bool(False), "reverse": Bool(False)}


def _cumsum_infer(X, *, axis, flatten, **_):
    check_dtype(X, NUMERIC, "cumsum: X")
    if flatten:
        return {"Out": X.with_(shape=(prod_known(X.shape),))}
    norm_axis(axis, X.ndim, "cumsum: axis")
    return {"Out": X}


def _np_cumsum(x, axis, exclusive, reverse):
    """Running sums in NumPy (the reference): flips around ``np.cumsum``."""
    if reverse:
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=axis)),
                              np.take(out, range(x.shape[axis] - 1), axis=axis)], axis=axis) \
            if x.shape[axis] else out
    return np.ascontiguousarray(np.flip(out, axis) if reverse else out)


def _cumsum_ref(X, *, axis, flatten, exclusive, reverse):
    x = X.reshape(-1) if flatten else X
    a = 0 if flatten else norm_axis(axis, X.ndim, "cumsum: axis")
    if x.ndim == 0:
        return {"Out": x.copy()}
    return {"Out": _np_cumsum(x, a, exclusive, reverse)}


register_op(
    "cumsum", inputs=["X"], outputs=["Out"], attrs=dict(_CUMSUM_ATTRS), traits=[OPAQUE],
    row_wise=RowWise(axes=("axis",), check=lambda v: "flatten" if v.attr("flatten") else None),
    infer_shape=_cumsum_infer, reference=_cumsum_ref,
    emit=Opaque(),
    grad=default_grad("cumsum_grad", fwd_inputs=("X",)),
    doc="Out = the running sums of X along axis (of X flattened with flatten); from the end "
        "with reverse; each leaving out its own element with exclusive.")


def _cumsum_grad_ref(X, *, axis, flatten, exclusive, reverse, **kw):
    g = kw["Out@GRAD"]
    if g.size != X.size:
        raise ShapeMismatch(f"cumsum_grad: expected Out@GRAD of {X.size} elements (X's), got "
                            f"shape {list(g.shape)}")
    g = g.reshape(-1) if flatten else g.reshape(X.shape)
    a = 0 if flatten else norm_axis(axis, X.ndim, "cumsum_grad: axis")
    if g.ndim == 0:
        return {"X@GRAD": g.copy()}
    # each X element reaches the sums after it (before it, reversed): the opposite running sum
    return {"X@GRAD": _np_cumsum(g, a, exclusive, not reverse).reshape(X.shape)}


register_op(
    "cumsum_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"], attrs=dict(_CUMSUM_ATTRS),
    traits=[OPAQUE], infer_shape=_same_metas("X"), reference=_cumsum_grad_ref,
    emit=Opaque(), grad=None,
    doc="X@GRAD = the running sums of Out@GRAD in the opposite direction.")


# ---- argsort ---------------------------------------------------------------------------------
_ARGSORT_ATTRS = {"axis": Int(-1, low=-2, high=1, axis_of="X"), "descending": Bool(False),
                  "stable": Bool(False)}


def _argsort_infer(X, *, axis, **_):
    check_dtype(X, NUMERIC, "argsort: X")
    if X.ndim:
        norm_axis(axis, X.ndim, "argsort: axis")
    return {"Out": X, "Indices": X.with_(dtype=np.dtype(np.int64))}


def _argsort_ref(X, *, axis, descending, stable):
    if X.ndim == 0:
        return {"Out": X.copy(), "Indices": np.zeros((), np.int64)}
    a = norm_axis(axis, X.ndim, "argsort: axis")
    if descending:  # stable: equal values keep their order of appearance
        n = X.shape[a]
        rev = np.flip(np.argsort(np.flip(X, a), axis=a, kind="stable"), a)
        idx = n - 1 - rev
    else:
        idx = np.argsort(X, axis=a, kind="stable")
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    return {"Out": np.take_along_axis(X, idx, axis=a), "Indices": idx}


register_op(
    "argsort", inputs=["X"], outputs=["Out", "Indices"], attrs=dict(_ARGSORT_ATTRS),
    traits=[OPAQUE], infer_shape=_argsort_infer, reference=_argsort_ref,
    emit=Opaque(),
    grad=default_grad("argsort_grad", fwd_inputs=("X",), fwd_outputs=("Indices",)),
    doc="Out = X sorted along axis (descending with descending), Indices = where each came "
        "from; the sort is stable (equal values keep their order) whatever stable says.")


def _argsort_grad_ref(X, Indices, *, axis, **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape or Indices.shape != X.shape:
        raise ShapeMismatch(f"argsort_grad: expected Indices and Out@GRAD of X's shape "
                            f"{list(X.shape)}, got {list(Indices.shape)} and {list(g.shape)}")
    if X.ndim == 0:
        return {"X@GRAD": g.copy()}
    a = norm_axis(axis, X.ndim, "argsort_grad: axis")
    _check_index(Indices, X.shape[a], "argsort_grad: Indices", False)
    dx = np.zeros(X.shape, X.dtype)
    np.put_along_axis(dx, Indices, g, axis=a)
    return {"X@GRAD": dx}


register_op(
    "argsort_grad", inputs=["X", "Indices", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_ARGSORT_ATTRS), traits=[OPAQUE], infer_shape=_same_metas("X"),
    reference=_argsort_grad_ref, emit=Opaque(), grad=None,
    doc="X@GRAD[Indices] = Out@GRAD along axis: the sort's permutation undone.")


# ---- split and gather natively ---------------------------------------------------------------
def _split_lower(ctx):
    """Each piece a copy of its slice of X (attribute axis and sections; tensor-valued ones run
    the reference)."""
    if ctx.has_input("AxisTensor") or ctx.has_input("SectionsTensorList"):
        return None
    a = ctx.attrs
    r = ctx.rank("X")
    if r == 0:
        return None
    ax = norm_axis(a["axis"], r)
    X, outs = ctx.inp("X"), ctx.op.output("Out")
    dim = f"{X}.shape[{ax}]"
    if a["num"] > 0:
        num = int(a["num"])
        if len(outs) != num:
            return None
        lines = [f"_rt.check({dim} % {num} == 0)"]
        sizes = [f"({dim} // {num})"] * num
    else:
        sec = [int(v) for v in a["sections"]]
        if not sec or len(outs) != len(sec) or sec.count(-1) > 1 or min(sec) < -1:
            return None
        known = sum(v for v in sec if v >= 0)
        lines = [f"_rt.check({dim} {'>=' if -1 in sec else '=='} {known})"]
        sizes = [str(v) if v >= 0 else f"({dim} - {known})" for v in sec]
    at = ctx.tmp("at")
    lines.append(f"{at} = 0")
    for i, (name, size) in enumerate(zip(outs, sizes)):
        if name != EMPTY_VAR_NAME:
            index = ", ".join([":"] * ax + [f"{at}:{at} + {size}"])
            lines.append(f"{ctx.out('Out', i)} = {X}[{index}].copy()")
        lines.append(f"{at} += {size}")
    return lines


# ---- stack and one_hot_v2 natively -------------------------------------------------------------
def _stack_lower(ctx):
    n = len(ctx.op.input("X"))
    r = ctx.rank("X")
    if any(ctx.dtype("X", i) != ctx.dtype("X") or ctx.rank("X", i) != r for i in range(n)):
        return None
    a = norm_axis(ctx.attrs["axis"], r + 1)
    xs = ctx.tuple_src(ctx.inp("X", i) for i in range(n))
    return [f"{ctx.out('Y')} = np.stack({xs}, axis={a})"]


def _stack_grad_lower(ctx):
    xs, gs = ctx.op.input("X"), ctx.op.output("X@GRAD")
    r = ctx.rank("X")
    if len(gs) != len(xs) or ctx.rank("Y@GRAD") != r + 1:
        return None
    a = norm_axis(ctx.attrs["axis"], r + 1)
    g = ctx.inp("Y@GRAD")
    lines = [f"_rt.check({g}.shape[{a}] == {len(xs)})"]
    for i, name in enumerate(gs):
        if name != EMPTY_VAR_NAME:
            if ctx.dtype("X@GRAD", i) != ctx.dtype("Y@GRAD"):
                return None
            index = ", ".join([":"] * a + [str(i)] + [":"] * (r - a))
            lines.append(f"{ctx.out('X@GRAD', i)} = {g}[{index}].copy()")
    return lines


def _one_hot_lower(ctx):
    """Zeros, then a 1 at each id (flat arrays); an id out of range raises unless allowed
    (then its row stays zero), and the reference names the op."""
    if ctx.has_input("depth_tensor"):
        return None
    depth = int(ctx.attrs["depth"])
    if depth < 1:
        return None
    X, i, v = ctx.inp("X"), ctx.tmp("i"), ctx.tmp("v")
    out = ctx.out("Out", shape=f"{X}.shape + ({depth},)", zero=True)
    bad = "continue" if ctx.attrs["allow_out_of_range"] else \
        "raise IndexError('pdjit: one_hot_v2: an id is out of range')"
    return [f"for {i} in range({X}.shape[0]):",
            f"    {v} = {X}[{i}]",
            f"    if {v} < 0 or {v} >= {depth}:",
            f"        {bad}",
            f"    {out}[{i} * {depth} + {v}] = 1"]
