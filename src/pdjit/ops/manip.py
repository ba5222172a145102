"""Fluid 1.8's ``reverse``, ``unique``, ``unique_with_counts``, ``scatter_nd_add``,
``strided_slice``, ``mean_iou``, ``sampling_id``, ``unfold``, ``cvm`` and ``random_crop`` ops
(each described above its
definition; all but ``reverse`` run their NumPy references).

``reverse``: ``X`` with the order of its elements reversed along each axis in ``axis``; its
gradient is the same reversal of ``Out@GRAD`` (the op is its own grad op, as in Fluid).
Natively a reversed view copied to a contiguous array. ``unique*``: see below."""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    RANDOM,
    REQUIRED,
    Bool,
    Float,
    GradOpSpec,
    Int,
    Ints,
    Opaque,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, NUMERIC, check_dtype


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


# ---- scatter_nd_add ----------------------------------------------------------------------------
# Out = X, then Out[Index[i]] += Updates[i] for every index tuple i (Index [..., k] ints address
# X's first k axes; Updates has Index.shape[:-1] + X.shape[k:]). Gradients: X@GRAD = Out@GRAD,
# Updates@GRAD = Out@GRAD at the indices (gather_nd).
def _snd_infer(X, Index, Updates):
    check_dtype(Index, (np.dtype(np.int32), np.dtype(np.int64)), "scatter_nd_add: Index")
    k = Index.shape[-1] if Index.ndim else -1
    if Index.ndim < 1 or k > X.ndim:
        raise ShapeMismatch(f"scatter_nd_add: expected Index [..., k] with k <= rank of X "
                            f"({X.ndim}), got {list(Index.shape)}")
    if Updates.dtype != X.dtype:
        raise ShapeMismatch(f"scatter_nd_add: expected Updates of X's dtype {X.dtype}, got "
                            f"{Updates.dtype}")
    return {"Out": X}


def _snd_where(X_shape, Index, Updates_shape):
    k = Index.shape[-1]
    want = tuple(Index.shape[:-1]) + tuple(X_shape[k:])
    if tuple(Updates_shape) != want:
        raise ShapeMismatch(f"scatter_nd_add: expected Updates of shape {list(want)}, got "
                            f"{list(Updates_shape)}")
    idx = Index.reshape(-1, k).astype(np.int64)
    for a in range(k):
        bad = (idx[:, a] < -X_shape[a]) | (idx[:, a] >= X_shape[a])
        if bad.any():
            raise IndexError(f"scatter_nd_add: index {idx[bad][0].tolist()} out of range for "
                             f"shape {list(X_shape)}")
    return tuple(idx[:, a] for a in range(k))


def _snd_ref(X, Index, Updates):
    where = _snd_where(X.shape, Index, Updates.shape)
    out = X.copy()
    k = Index.shape[-1]
    np.add.at(out, where, Updates.reshape((-1,) + X.shape[k:]))
    return {"Out": out}


def _snd_grad_ref(Index, Updates, **kw):
    g = kw["Out@GRAD"]
    where = _snd_where(g.shape, Index, Updates.shape)
    return {"X@GRAD": g.copy(), "Updates@GRAD": g[where].reshape(Updates.shape)}


register_op(
    "scatter_nd_add", inputs=["X", "Index", "Updates"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=_snd_infer, reference=_snd_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "scatter_nd_add_grad",
        {"Index": op.input("Index"), "Updates": op.input("Updates"),
         "Out@GRAD": [grad_var_name(n) for n in op.output("Out")]},
        {"X@GRAD": [grad_var_name(n) for n in op.input("X")],
         "Updates@GRAD": [grad_var_name(n) for n in op.input("Updates")]})],
    doc="Out = X with Updates added at the index tuples of Index.")
register_op(
    "scatter_nd_add_grad", inputs=["Index", "Updates", "Out@GRAD"],
    outputs=["X@GRAD?", "Updates@GRAD?"], traits=[OPAQUE],
    infer_shape=lambda Index, Updates, **kw: {"X@GRAD": kw["Out@GRAD"], "Updates@GRAD": Updates},
    reference=_snd_grad_ref, emit=None, grad=None, doc="Gradients of scatter_nd_add.")


# ---- strided_slice -----------------------------------------------------------------------------
# Python's slice start:end:stride along each of axes (negative values count from the end,
# bounds clamped), then the axes of decrease_axis (each of size 1) dropped.
_SS_ATTRS = {"axes": Ints(REQUIRED, choices=([0], [1])),
             "starts": Ints(REQUIRED, choices=([0], [1])),
             "ends": Ints(REQUIRED, choices=([3], [-1])),
             "strides": Ints(REQUIRED, choices=([1], [2])),
             "infer_flags": Ints([]), "decrease_axis": Ints([])}


def _ss_index(rank, axes, starts, ends, strides):
    if not len(axes) == len(starts) == len(ends) == len(strides):
        raise ShapeMismatch(f"strided_slice: expected axes, starts, ends and strides of one "
                            f"length, got {axes}, {starts}, {ends}, {strides}")
    index = [slice(None)] * rank
    for a, s, e, st in zip(axes, starts, ends, strides):
        if not -rank <= a < rank or st == 0:
            raise ShapeMismatch(f"strided_slice: axis {a} of rank {rank} with stride {st}: "
                                f"expected an axis in range and a non-zero stride")
        index[a % rank] = slice(s, e, st)
    return tuple(index)


def _ss_infer(Input, *, axes, starts, ends, strides, decrease_axis, **_):
    index = _ss_index(Input.ndim, axes, starts, ends, strides)
    shape = []
    for d, (n, sl) in enumerate(zip(Input.shape, index)):
        if d in [x % max(Input.ndim, 1) for x in decrease_axis]:
            continue
        shape.append(n if sl == slice(None) else (len(range(*sl.indices(n))) if n >= 0 else -1))
    return {"Out": Input.with_(shape=tuple(shape))}


def _ss_ref(Input, *, axes, starts, ends, strides, decrease_axis, **_):
    out = Input[_ss_index(Input.ndim, axes, starts, ends, strides)]
    drop = sorted({d % Input.ndim for d in decrease_axis})
    if any(out.shape[d] != 1 for d in drop):
        raise ShapeMismatch(f"strided_slice: decrease_axis {decrease_axis}: expected those "
                            f"axes of size 1, got {list(out.shape)}")
    return {"Out": np.ascontiguousarray(out.reshape([n for d, n in enumerate(out.shape)
                                                     if d not in drop]))}


def _ss_grad_ref(Input, *, axes, starts, ends, strides, decrease_axis, **kw):
    g = kw["Out@GRAD"]
    index = _ss_index(Input.ndim, axes, starts, ends, strides)
    dx = np.zeros(Input.shape, g.dtype)
    dx[index] = g.reshape(dx[index].shape)
    return {"Input@GRAD": dx}


register_op(
    "strided_slice", inputs=["Input"], outputs=["Out"], attrs=_SS_ATTRS, traits=[OPAQUE],
    infer_shape=_ss_infer, reference=_ss_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "strided_slice_grad",
        {"Input": op.input("Input"), "Out@GRAD": [grad_var_name(n) for n in op.output("Out")]},
        {"Input@GRAD": [grad_var_name(n) for n in op.input("Input")]},
        {k: v for k, v in op.all_attrs().items() if k in _SS_ATTRS})],
    doc="Input[start:end:stride] along axes (Python's slice rules).")
register_op(
    "strided_slice_grad", inputs=["Input", "Out@GRAD"], outputs=["Input@GRAD?"],
    attrs=dict(_SS_ATTRS), traits=[OPAQUE], infer_shape=lambda Input, **_: {"Input@GRAD": Input},
    reference=_ss_grad_ref, emit=None, grad=None,
    doc="Input@GRAD: Out@GRAD in the sliced positions, 0 elsewhere.")


# ---- mean_iou ----------------------------------------------------------------------------------
# Per class c: correct = elements with prediction = label = c; wrong = elements where exactly
# one of prediction and label is c. OutMeanIou = mean over classes with correct + wrong > 0 of
# correct / (correct + wrong) (float32 [1]); OutWrong, OutCorrect int32 [num_classes].
def _miou_infer(Predictions, Labels, *, num_classes):
    check_dtype(Predictions, (np.dtype(np.int32), np.dtype(np.int64)), "mean_iou: Predictions")
    return {"OutMeanIou": VarMeta((1,), np.float32),
            "OutWrong": VarMeta((num_classes,), np.int32),
            "OutCorrect": VarMeta((num_classes,), np.int32)}


def _miou_ref(Predictions, Labels, *, num_classes):
    p, lab = Predictions.reshape(-1).astype(np.int64), Labels.reshape(-1).astype(np.int64)
    if p.size != lab.size:
        raise ShapeMismatch(f"mean_iou: expected Labels with Predictions' {p.size} elements, got "
                            f"{lab.size}")
    for name, v in (("prediction", p), ("label", lab)):
        if v.size and (v.min() < 0 or v.max() >= num_classes):
            raise IndexError(f"mean_iou: {name} {v[(v < 0) | (v >= num_classes)][0]} out of "
                             f"range [0, {num_classes})")
    hit = p == lab
    correct = np.bincount(lab[hit], minlength=num_classes)
    wrong = np.bincount(lab[~hit], minlength=num_classes) + \
        np.bincount(p[~hit], minlength=num_classes)
    total = correct + wrong
    valid = total > 0
    iou = (correct[valid] / total[valid]).sum() / max(int(valid.sum()), 1)
    return {"OutMeanIou": np.array([iou], np.float32), "OutWrong": wrong.astype(np.int32),
            "OutCorrect": correct.astype(np.int32)}


register_op(
    "mean_iou", inputs=["Predictions", "Labels"], outputs=["OutMeanIou", "OutWrong", "OutCorrect"],
    attrs={"num_classes": Int(REQUIRED, low=4, high=5)}, traits=[OPAQUE],
    infer_shape=_miou_infer, reference=_miou_ref, emit=None, grad=None,
    domain={"Predictions": "positive", "Labels": "positive"},
    doc="Mean intersection-over-union of predicted and true classes.")


# ---- sampling_id -------------------------------------------------------------------------------
# For each row of X (probabilities), r ~ Uniform[min, max) from the run's stream: the first
# column whose running sum exceeds r (the last column when none does). Out int64 [N].
def _sid_ref(X, *, min, max, seed, ctx, **_):  # noqa: A002 - the op's attribute names
    from pdjit.framework import random as prandom

    r = min + (max - min) * prandom.uniform01(ctx.rng_key(), X.shape[0])
    above = np.cumsum(X.astype(np.float64), axis=1) > r[:, None]
    ids = np.where(above.any(axis=1), above.argmax(axis=1), X.shape[1] - 1)
    return {"Out": ids.astype(np.int64)}


register_op(
    "sampling_id", inputs=["X"], outputs=["Out"],
    attrs={"min": Float(0.0, low=0.0, high=0.0), "max": Float(1.0, low=1.0, high=1.0),
           "seed": Int(0, low=0, high=0)},
    traits=[OPAQUE, RANDOM],
    infer_shape=lambda X, **_: {"Out": VarMeta((X.shape[0],), np.int64)},
    reference=_sid_ref, emit=None, grad=None,
    doc="A column of each row drawn with the row's probabilities.")


# ---- unfold (im2col) ---------------------------------------------------------------------------
# X [N, C, H, W] -> Y [N, C * kh * kw, L]: column l (output positions row by row) holds the
# patch at that position, its values in (channel, kernel row, kernel column) order; paddings
# [top, left, bottom, right], dilations spread the kernel taps.
_UNFOLD_ATTRS = {"kernel_sizes": Ints(REQUIRED, choices=([2, 2], [1, 2])),
                 "strides": Ints([1, 1], choices=([1, 1], [2, 1])),
                 "paddings": Ints([0, 0, 0, 0], choices=([0, 0, 0, 0], [1, 0, 1, 0])),
                 "dilations": Ints([1, 1], choices=([1, 1],))}


def _unfold_index(X_shape, kernel_sizes, strides, paddings, dilations):
    from pdjit.ops.sequence_fluid import _im2seq_index

    index, per, padded = _im2seq_index(X_shape, kernel_sizes, strides, paddings, dilations)
    n = X_shape[0]
    return index.reshape(n, per, -1).transpose(0, 2, 1), padded      # [N, C*kh*kw, L]


def _unfold_infer(X, *, kernel_sizes, strides, paddings, dilations):
    check_dtype(X, FLOATS, "unfold: input X")
    if X.ndim != 4 or len(kernel_sizes) != 2 or len(paddings) != 4:
        raise ShapeMismatch(f"unfold: expected X [N, C, H, W], 2 kernel sizes and 4 paddings, "
                            f"got {list(X.shape)}, {kernel_sizes}, {paddings}")
    c = X.shape[1] * kernel_sizes[0] * kernel_sizes[1] if X.shape[1] >= 0 else -1
    return {"Y": VarMeta((X.shape[0], c, -1), X.dtype)}


def _pad4(X, p):
    return np.pad(X, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))


def _unfold_ref(X, **a):
    index, _ = _unfold_index(X.shape, a["kernel_sizes"], a["strides"], a["paddings"],
                             a["dilations"])
    return {"Y": _pad4(X, a["paddings"]).reshape(-1)[index]}


def _unfold_grad_ref(X, **kw):
    g = kw["Y@GRAD"]
    p = kw["paddings"]
    index, (hp, wp) = _unfold_index(X.shape, kw["kernel_sizes"], kw["strides"], p,
                                    kw["dilations"])
    if g.shape != index.shape:
        raise ShapeMismatch(f"unfold_grad: expected Y@GRAD of shape {list(index.shape)}, got "
                            f"{list(g.shape)}")
    padded = np.zeros(X.shape[0] * X.shape[1] * hp * wp)
    np.add.at(padded, index.reshape(-1), g.reshape(-1))
    padded = padded.reshape(X.shape[0], X.shape[1], hp, wp)
    return {"X@GRAD": padded[:, :, p[0]:p[0] + X.shape[2], p[1]:p[1] + X.shape[3]]
            .astype(X.dtype)}


register_op(
    "unfold", inputs=["X"], outputs=["Y"], attrs=_UNFOLD_ATTRS, traits=[OPAQUE],
    infer_shape=_unfold_infer, reference=_unfold_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "unfold_grad", {"X": op.input("X"), "Y@GRAD": [grad_var_name(n) for n in op.output("Y")]},
        {"X@GRAD": [grad_var_name(n) for n in op.input("X")]},
        {k: v for k, v in op.all_attrs().items() if k in _UNFOLD_ATTRS})],
    doc="The kernel-sized patches of X as columns (im2col).")
register_op(
    "unfold_grad", inputs=["X", "Y@GRAD"], outputs=["X@GRAD?"], attrs=dict(_UNFOLD_ATTRS),
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_unfold_grad_ref,
    emit=None, grad=None, doc="X@GRAD: each column's gradient added back where it was read.")


# ---- cvm (continuous_value_model) --------------------------------------------------------------
# X [N, D] starts with a show and a click count. use_cvm: Y = X with those replaced by
# log(show + 1) and log(click + 1) - log(show + 1); else Y = X without them. The gradient is
# Fluid's: Y@GRAD in the other columns, and the first two columns of X@GRAD set to CVM's values.
def _cvm_infer(X, CVM, *, use_cvm):
    check_dtype(X, FLOATS, "cvm: input X")
    if X.ndim != 2 or (X.shape[1] >= 0 and X.shape[1] < 2):
        raise ShapeMismatch(f"cvm: expected X [N, D >= 2], got {list(X.shape)}")
    width = X.shape[1] if use_cvm or X.shape[1] < 0 else X.shape[1] - 2
    return {"Y": X.with_(shape=(X.shape[0], width))}


def _cvm_ref(X, CVM, *, use_cvm):
    if not use_cvm:
        return {"Y": X[:, 2:].copy()}
    y = X.astype(np.float64).copy()
    y[:, 0] = np.log(X[:, 0] + 1.0)
    y[:, 1] = np.log(X[:, 1] + 1.0) - y[:, 0]
    return {"Y": y.astype(X.dtype)}


def _cvm_grad_ref(X, CVM, *, use_cvm, **kw):
    g = kw["Y@GRAD"]
    dx = np.zeros(X.shape, X.dtype)
    dx[:, 2:] = g[:, 2:] if use_cvm else g
    dx[:, :2] = CVM.reshape(X.shape[0], -1)[:, :2]
    return {"X@GRAD": dx}


register_op(
    "cvm", inputs=["X", "CVM"], outputs=["Y"], attrs={"use_cvm": Bool(True)}, traits=[OPAQUE],
    infer_shape=_cvm_infer, reference=_cvm_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "cvm_grad", {"X": op.input("X"), "CVM": op.input("CVM"),
                     "Y@GRAD": [grad_var_name(n) for n in op.output("Y")]},
        {"X@GRAD": [grad_var_name(n) for n in op.input("X")]},
        {"use_cvm": op.attr("use_cvm")})],
    domain={"X": "positive"},
    doc="The show/click columns of X as logs (use_cvm) or dropped.")
register_op(
    "cvm_grad", inputs=["X", "CVM", "Y@GRAD"], outputs=["X@GRAD?"],
    attrs={"use_cvm": Bool(True)}, traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_cvm_grad_ref, emit=None, grad=None, doc="Fluid's gradient of cvm.")


# ---- random_crop -------------------------------------------------------------------------------
# The last len(shape) axes of X cropped to shape at offsets drawn per leading-axis element from
# the run's random stream (startup_seed fixes them); SeedOut carries a seed for a next crop.
def _crop_infer(X, Seed=None, *, shape, startup_seed):
    if len(shape) > X.ndim:
        raise ShapeMismatch(f"random_crop: shape {shape} has more axes than X {list(X.shape)}")
    lead = X.ndim - len(shape)
    return {"Out": X.with_(shape=tuple(X.shape[:lead]) + tuple(shape)),
            "SeedOut": VarMeta((1,), np.int64)}


def _crop_ref(X, Seed=None, *, shape, startup_seed, ctx):
    from pdjit.framework import random as prandom

    lead = X.ndim - len(shape)
    tail = X.shape[lead:]
    if any(s > t for s, t in zip(shape, tail)):
        raise ShapeMismatch(f"random_crop: shape {shape} larger than X's last axes {list(tail)}")
    batch = int(np.prod(X.shape[:lead], dtype=np.int64))
    key = prandom.op_key(int(Seed.reshape(-1)[0]), 0, 0, 0, 0) if Seed is not None and \
        int(Seed.reshape(-1)[0]) else (prandom.op_key(startup_seed, 0, 0, 0, 0) if startup_seed
                                       else ctx.rng_key())
    u = prandom.uniform01(key, batch * len(shape)).reshape(batch, len(shape))
    starts = np.floor(u * (np.asarray(tail) - np.asarray(shape) + 1)).astype(np.int64)
    flat = X.reshape((batch,) + tuple(tail))
    out = np.stack([flat[b][tuple(slice(s, s + n) for s, n in zip(starts[b], shape))]
                    for b in range(batch)]) if batch else np.zeros((0,) + tuple(shape), X.dtype)
    seed_out = np.array([int(prandom.bits(key, 1)[0] >> np.uint64(33)) + 1], np.int64)
    return {"Out": out.reshape(X.shape[:lead] + tuple(shape)), "SeedOut": seed_out}


register_op(
    "random_crop", inputs=["X", "Seed?"], outputs=["Out", "SeedOut"],
    attrs={"shape": Ints(REQUIRED, choices=([1], [2])), "startup_seed": Int(0, low=0, high=0)},
    traits=[OPAQUE, RANDOM], infer_shape=_crop_infer, reference=_crop_ref, emit=None, grad=None,
    doc="The last axes of X cropped to shape at random offsets per instance.")
