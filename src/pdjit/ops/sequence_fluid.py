"""Fluid 1.8's remaining one-level sequence ops: ``sequence_enumerate``, ``sequence_reshape``,
``sequence_slice``, ``sequence_scatter``, ``im2sequence``, ``row_conv`` and
``add_position_encoding``, with the gradients of all but the first (see the comments above each
op for the last three).

Slots and attributes are Fluid 1.8's; as in Fluid, each needs a one-level LoD on its sequence
input (``X``; ``Ids`` for ``sequence_scatter``):

- ``sequence_enumerate(X [N, 1] ints; win_size, pad_value) -> Out [N, win_size]``: row ``t`` of a
  sequence holds its ids ``t .. t + win_size - 1``, ``pad_value`` past the sequence's end; Out
  keeps X's LoD. No gradient (integer ids).
- ``sequence_reshape(X [N, D]; new_dim) -> Out [N * D / new_dim, new_dim]``: each sequence's
  rows re-cut into rows of ``new_dim`` (its length times ``D`` must divide by ``new_dim``); the
  LoD scales with it.
- ``sequence_slice(X, Offset [S, 1], Length [S, 1] int64) -> Out``: rows ``Offset[i] ..
  Offset[i] + Length[i] - 1`` of sequence ``i``; Out's LoD holds the lengths.
- ``sequence_scatter(X [S, D], Ids [M, 1] int64 with S sequences, Updates [M, 1]) -> Out``:
  ``Out = X``, then ``Out[i, Ids[j]] += Updates[j]`` for each row ``j`` of sequence ``i``.

They run their NumPy references as plan steps of their own (no native lowering: ``emit`` is
``None``); Out's LoD follows from the values (``sequence_slice``) or X's width
(``sequence_reshape``), so the references set it.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    SEQUENCE,
    Float,
    GradOpSpec,
    Int,
    Ints,
    ValueDependentLoD,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, INDEX, NUMERIC, check_dtype

TRAITS = (SEQUENCE, OPAQUE)
INT64 = np.dtype(np.int64)


def one_level_offsets(ctx, slot: str, rows: int, op: str) -> np.ndarray:
    """The offsets of input ``slot``'s one-level LoD (``rows`` rows), or ``ShapeMismatch``."""
    lod = ctx.input_lod(slot) if ctx is not None else []
    if len(lod) != 1:
        raise ShapeMismatch(f"{op}: expected input {slot} with a one-level LoD, got "
                            f"{len(lod)} levels")
    offs = np.asarray(lod[0], dtype=np.int64)
    if offs[-1] != rows:
        raise ShapeMismatch(f"{op}: input {slot}'s LoD ends at {offs[-1]}: expected its number "
                            f"of rows {rows}")
    return offs


def _g(names) -> list:
    return [grad_var_name(n) for n in names]


def _need_level(meta: VarMeta, slot: str, op: str) -> None:
    if meta.lod_level not in (0, 1):  # 0: a feed may still bring one level
        raise ShapeMismatch(f"{op}: expected input {slot} of LoD level 1, got "
                            f"{meta.lod_level}")


# ---- sequence_enumerate ----------------------------------------------------------------------
def _enum_infer(X, *, win_size, pad_value):
    check_dtype(X, INDEX, "sequence_enumerate: input X")
    _need_level(X, "X", "sequence_enumerate")
    if win_size < 1:
        raise ShapeMismatch(f"sequence_enumerate: expected win_size >= 1, got {win_size}")
    if X.ndim != 2 or X.shape[1] not in (1, -1):
        raise ShapeMismatch(f"sequence_enumerate: expected X of shape [N, 1], got "
                            f"{list(X.shape)}")
    return {"Out": X.with_(shape=(X.shape[0], win_size))}


def _enum_ref(X, *, win_size, pad_value, ctx):
    if X.ndim != 2 or X.shape[1] != 1:
        raise ShapeMismatch(f"sequence_enumerate: expected X of shape [N, 1], got "
                            f"{list(X.shape)}")
    offs = one_level_offsets(ctx, "X", X.shape[0], "sequence_enumerate")
    ids = X[:, 0]
    out = np.full((X.shape[0], win_size), pad_value, dtype=X.dtype)
    ends = np.repeat(offs[1:], np.diff(offs))          # each row's sequence end
    rows = np.arange(X.shape[0])
    for k in range(win_size):
        ok = rows + k < ends
        out[ok, k] = ids[rows[ok] + k]
    return {"Out": out}


register_op(
    "sequence_enumerate", inputs=["X"], outputs=["Out"],
    attrs={"win_size": Int(REQUIRED, low=1, high=4), "pad_value": Int(0, low=0, high=3)},
    traits=TRAITS, infer_shape=_enum_infer, reference=_enum_ref, emit=None, grad=None,
    out_lod=lambda lods, **_: {"Out": lods["X"]},
    doc="Out[t] = the win_size ids of X's sequence from row t on, pad_value past its end.")


# ---- sequence_reshape ------------------------------------------------------------------------
def _reshape_infer(X, *, new_dim):
    check_dtype(X, NUMERIC, "sequence_reshape: input X")
    _need_level(X, "X", "sequence_reshape")
    if new_dim < 1:
        raise ShapeMismatch(f"sequence_reshape: expected new_dim >= 1, got {new_dim}")
    if X.ndim != 2:
        raise ShapeMismatch(f"sequence_reshape: expected X of rank 2, got {list(X.shape)}")
    return {"Out": X.with_(shape=(-1, new_dim), lod_level=1)}


def _reshape_ref(X, *, new_dim, ctx):
    offs = one_level_offsets(ctx, "X", X.shape[0], "sequence_reshape")
    d = X.shape[1]
    sizes = np.diff(offs) * d
    if np.any(sizes % new_dim):
        i = int(np.nonzero(sizes % new_dim)[0][0])
        raise ShapeMismatch(f"sequence_reshape: sequence {i} holds {sizes[i]} values: expected "
                            f"a multiple of new_dim {new_dim}")
    ctx.set_output_lod("Out", [(offs * d // new_dim).tolist()])
    return {"Out": X.reshape(-1, new_dim).copy()}


def _reshape_lod(lods, **_):
    raise ValueDependentLoD("sequence_reshape's LoD scales with X's width")


def _reshape_grad_ref(X, **kw):
    g = kw["Out@GRAD"]
    if g.size != X.size:
        raise ShapeMismatch(f"sequence_reshape_grad: expected Out@GRAD of {X.size} values, got "
                            f"{list(g.shape)}")
    return {"X@GRAD": g.reshape(X.shape).astype(X.dtype, copy=True)}


register_op(
    "sequence_reshape", inputs=["X"], outputs=["Out"],
    attrs={"new_dim": Int(REQUIRED, low=1, high=4)}, traits=TRAITS,
    infer_shape=_reshape_infer, reference=_reshape_ref, emit=None,
    grad=lambda op: [GradOpSpec("sequence_reshape_grad",
                                {"X": op.input("X"), "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))})],
    out_lod=_reshape_lod,
    doc="Each sequence of X re-cut into rows of new_dim values; the LoD scales with it.")
register_op(
    "sequence_reshape_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"], traits=TRAITS,
    infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_reshape_grad_ref, emit=None,
    grad=None, out_lod=lambda lods, **_: {"X@GRAD": lods["X"]},
    doc="X@GRAD = Out@GRAD in X's shape.")


# ---- sequence_slice --------------------------------------------------------------------------
def _slice_infer(X, Offset, Length):
    _need_level(X, "X", "sequence_slice")
    for name, m in (("Offset", Offset), ("Length", Length)):
        if m.dtype != INT64:
            raise ShapeMismatch(f"sequence_slice: expected {name} of dtype int64, got "
                                f"{m.dtype}")
    return {"Out": X.with_(shape=(-1,) + tuple(X.shape[1:]), lod_level=1)}


def _slice_rows(X, Offset, Length, ctx, op):
    offs = one_level_offsets(ctx, "X", X.shape[0], op)
    n = len(offs) - 1
    off, length = Offset.reshape(-1), Length.reshape(-1)
    if off.size != n or length.size != n:
        raise ShapeMismatch(f"{op}: expected Offset and Length with one value per sequence "
                            f"({n}), got {off.size} and {length.size}")
    lens = np.diff(offs)
    bad = (off < 0) | (length < 0) | (off + length > lens)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        raise ShapeMismatch(f"{op}: sequence {i} (length {lens[i]}): expected 0 <= offset and "
                            f"offset + length <= {lens[i]}, got offset {off[i]}, length "
                            f"{length[i]}")
    rows = np.concatenate([np.arange(offs[i] + off[i], offs[i] + off[i] + length[i])
                           for i in range(n)] or [np.zeros(0, np.int64)]).astype(np.int64)
    return rows, length


def _slice_ref(X, Offset, Length, ctx):
    rows, length = _slice_rows(X, Offset, Length, ctx, "sequence_slice")
    ctx.set_output_lod("Out", [[0] + np.cumsum(length).astype(int).tolist()])
    return {"Out": X[rows]}


def _slice_lod(lods, **_):
    raise ValueDependentLoD("sequence_slice's LoD comes from Length's values")


def _slice_grad_ref(X, Offset, Length, ctx, **kw):
    g = kw["Out@GRAD"]
    rows, _ = _slice_rows(X, Offset, Length, ctx, "sequence_slice_grad")
    if g.shape[0] != rows.size:
        raise ShapeMismatch(f"sequence_slice_grad: expected Out@GRAD of {rows.size} rows, got "
                            f"{g.shape[0]}")
    dx = np.zeros(X.shape, X.dtype)
    dx[rows] = g
    return {"X@GRAD": dx}


register_op(
    "sequence_slice", inputs=["X", "Offset", "Length"], outputs=["Out"], traits=TRAITS,
    infer_shape=_slice_infer, reference=_slice_ref, emit=None,
    grad=lambda op: [GradOpSpec("sequence_slice_grad",
                                {"X": op.input("X"), "Offset": op.input("Offset"),
                                 "Length": op.input("Length"),
                                 "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))})],
    out_lod=_slice_lod,
    doc="Rows Offset[i] .. Offset[i] + Length[i] - 1 of each sequence i of X.")
register_op(
    "sequence_slice_grad", inputs=["X", "Offset", "Length", "Out@GRAD"], outputs=["X@GRAD?"],
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_slice_grad_ref,
    emit=None, grad=None, out_lod=lambda lods, **_: {"X@GRAD": lods["X"]},
    doc="X@GRAD: Out@GRAD at the sliced rows, 0 elsewhere.")


# ---- sequence_scatter ------------------------------------------------------------------------
def _scatter_infer(X, Ids, Updates):
    check_dtype(X, FLOATS + (np.dtype(np.int32), INT64), "sequence_scatter: input X")
    if Ids.dtype != INT64:
        raise ShapeMismatch(f"sequence_scatter: expected Ids of dtype int64, got {Ids.dtype}")
    if Updates.dtype != X.dtype:
        raise ShapeMismatch(f"sequence_scatter: expected Updates of X's dtype {X.dtype}, got "
                            f"{Updates.dtype}")
    if X.ndim != 2:
        raise ShapeMismatch(f"sequence_scatter: expected X of rank 2, got {list(X.shape)}")
    return {"Out": X.with_(lod_level=0)}


def _scatter_plan(X, Ids, Updates, ctx, op):
    offs = one_level_offsets(ctx, "Ids", Ids.shape[0], op)
    n = len(offs) - 1
    if n != X.shape[0]:
        raise ShapeMismatch(f"{op}: expected one sequence of Ids per row of X ({X.shape[0]}), "
                            f"got {n}")
    ids = Ids.reshape(-1)
    if Updates is not None and Updates.size != ids.size:
        raise ShapeMismatch(f"{op}: expected Updates with one value per id ({ids.size}), got "
                            f"{list(Updates.shape)}")
    if ids.size and (ids.min() < 0 or ids.max() >= X.shape[1]):
        bad = ids[(ids < 0) | (ids >= X.shape[1])][0]
        raise IndexError(f"{op}: id {bad} out of range [0, {X.shape[1]})")
    return np.repeat(np.arange(n), np.diff(offs)), ids


def _scatter_ref(X, Ids, Updates, ctx):
    rows, ids = _scatter_plan(X, Ids, Updates, ctx, "sequence_scatter")
    out = X.copy()
    np.add.at(out, (rows, ids), Updates.reshape(-1).astype(X.dtype))
    return {"Out": out}


def _scatter_grad_ref(X, Ids, ctx, **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape:
        raise ShapeMismatch(f"sequence_scatter_grad: expected Out@GRAD of X's shape "
                            f"{list(X.shape)}, got {list(g.shape)}")
    rows, ids = _scatter_plan(X, Ids, None, ctx, "sequence_scatter_grad")
    return {"X@GRAD": g.copy(), "Updates@GRAD": g[rows, ids].reshape(-1, 1).astype(g.dtype)}


register_op(
    "sequence_scatter", inputs=["X", "Ids", "Updates"], outputs=["Out"], traits=TRAITS,
    infer_shape=_scatter_infer, reference=_scatter_ref, emit=None,
    grad=lambda op: [GradOpSpec("sequence_scatter_grad",
                                {"X": op.input("X"), "Ids": op.input("Ids"),
                                 "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X")),
                                 "Updates@GRAD": _g(op.input("Updates"))})],
    out_lod=lambda lods, **_: {"Out": []},
    doc="Out = X; Out[i, Ids[j]] += Updates[j] for the rows j of Ids' sequence i.")
register_op(
    "sequence_scatter_grad", inputs=["X", "Ids", "Out@GRAD"],
    outputs=["X@GRAD?", "Updates@GRAD?"], traits=TRAITS,
    infer_shape=lambda X, Ids, **_: {"X@GRAD": X,
                                     "Updates@GRAD": Ids.with_(shape=(Ids.shape[0], 1),
                                                               dtype=X.dtype)},
    reference=_scatter_grad_ref, emit=None, grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": [], "Updates@GRAD": lods["Ids"]},
    doc="X@GRAD = Out@GRAD; Updates@GRAD[j] = Out@GRAD[i, Ids[j]].")


# ---- im2sequence -----------------------------------------------------------------------------
# X [N, C, H, W] -> Out [N * oh * ow, C * kh * kw]: each image's patches (row by row of the
# output grid), a patch's values in (channel, kernel row, kernel column) order; Out's LoD has
# one sequence of oh * ow rows per image. paddings: [up, left, down, right].
_IM2SEQ_ATTRS = {"kernels": Ints(REQUIRED, choices=([2, 2], [1, 2])),
                 "strides": Ints([1, 1], choices=([1, 1], [2, 1])),
                 "paddings": Ints([0, 0, 0, 0], choices=([0, 0, 0, 0], [1, 0, 0, 1])),
                 "out_stride": Ints([1, 1], choices=([1, 1],))}


def _im2seq_grid(h, w, kernels, strides, paddings, dilations=(1, 1)):
    oh = (h + paddings[0] + paddings[2] - (dilations[0] * (kernels[0] - 1) + 1)) // strides[0] + 1
    ow = (w + paddings[1] + paddings[3] - (dilations[1] * (kernels[1] - 1) + 1)) // strides[1] + 1
    return oh, ow


def _im2seq_infer(X, *, kernels, strides, paddings, out_stride):
    check_dtype(X, FLOATS, "im2sequence: input X")
    if X.ndim != 4 or len(kernels) != 2 or len(strides) != 2 or len(paddings) != 4:
        raise ShapeMismatch(f"im2sequence: expected X [N, C, H, W], 2 kernels, 2 strides and 4 "
                            f"paddings, got {list(X.shape)}, {kernels}, {strides}, {paddings}")
    c = X.shape[1]
    return {"Out": VarMeta((-1, c * kernels[0] * kernels[1] if c >= 0 else -1), X.dtype, 1)}


def _im2seq_index(shape, kernels, strides, paddings, dilations=(1, 1)):
    """For each (output row, column) of Out, the flat index into the zero-padded X."""
    n, c, h, w = shape
    oh, ow = _im2seq_grid(h, w, kernels, strides, paddings, dilations)
    if oh < 1 or ow < 1:
        raise ShapeMismatch(f"image {h}x{w} with paddings {paddings} is smaller than the "
                            f"kernel {kernels} (dilations {list(dilations)})")
    hp, wp = h + paddings[0] + paddings[2], w + paddings[1] + paddings[3]
    i, j = np.meshgrid(np.arange(oh) * strides[0], np.arange(ow) * strides[1], indexing="ij")
    ch, ki, kj = np.meshgrid(np.arange(c), np.arange(kernels[0]), np.arange(kernels[1]),
                             indexing="ij")
    rows = i.reshape(-1, 1) + ki.reshape(1, -1) * dilations[0]
    cols = j.reshape(-1, 1) + kj.reshape(1, -1) * dilations[1]
    per_image = (ch.reshape(1, -1) * hp + rows) * wp + cols          # [oh * ow, c * kh * kw]
    base = np.arange(n).reshape(n, 1, 1) * (c * hp * wp)
    return (base + per_image[None]).reshape(n * oh * ow, -1), oh * ow, (hp, wp)


def _pad_image(X, paddings):
    return np.pad(X, ((0, 0), (0, 0), (paddings[0], paddings[2]), (paddings[1], paddings[3])))


def _im2seq_ref(X, *, kernels, strides, paddings, out_stride, ctx):
    index, per, _ = _im2seq_index(X.shape, kernels, strides, paddings)
    ctx.set_output_lod("Out", [list(range(0, X.shape[0] * per + 1, per))])
    return {"Out": _pad_image(X, paddings).reshape(-1)[index]}


def _im2seq_grad_ref(X, *, kernels, strides, paddings, out_stride, **kw):
    g = kw["Out@GRAD"]
    index, _, (hp, wp) = _im2seq_index(X.shape, kernels, strides, paddings)
    if g.shape != index.shape:
        raise ShapeMismatch(f"im2sequence_grad: expected Out@GRAD of shape "
                            f"{list(index.shape)}, got {list(g.shape)}")
    padded = np.zeros(X.shape[0] * X.shape[1] * hp * wp)
    np.add.at(padded, index.reshape(-1), g.reshape(-1))
    padded = padded.reshape(X.shape[0], X.shape[1], hp, wp)
    dx = padded[:, :, paddings[0]:paddings[0] + X.shape[2], paddings[1]:paddings[1] + X.shape[3]]
    return {"X@GRAD": dx.astype(X.dtype)}


def _im2seq_lod(lods, **_):
    raise ValueDependentLoD("im2sequence's LoD follows X's image size")


register_op(
    "im2sequence", inputs=["X"], outputs=["Out"], attrs=_IM2SEQ_ATTRS, traits=TRAITS,
    infer_shape=_im2seq_infer, reference=_im2seq_ref, emit=None,
    grad=lambda op: [GradOpSpec("im2sequence_grad",
                                {"X": op.input("X"), "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))},
                                {k: v for k, v in op.all_attrs().items() if k in _IM2SEQ_ATTRS})],
    out_lod=_im2seq_lod,
    doc="Each image's kernel-sized patches as the rows of one sequence.")
register_op(
    "im2sequence_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_IM2SEQ_ATTRS), traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_im2seq_grad_ref, emit=None, grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": []},
    doc="X@GRAD: each patch's gradient added back where the patch was read.")


# ---- row_conv --------------------------------------------------------------------------------
# Out[t] = sum over k < K of X[t + k] * Filter[k] (elementwise over the D columns), the rows
# t + k within t's sequence (lookahead convolution, DeepSpeech 2).
def _row_conv_infer(X, Filter):
    check_dtype(X, FLOATS, "row_conv: input X")
    if X.ndim != 2 or Filter.ndim != 2 or (X.shape[1] >= 0 and Filter.shape[1] >= 0
                                           and X.shape[1] != Filter.shape[1]):
        raise ShapeMismatch(f"row_conv: expected X [T, D] and Filter [K, D], got "
                            f"{list(X.shape)} and {list(Filter.shape)}")
    return {"Out": X}


def _row_conv_ref(X, Filter, ctx):
    offs = one_level_offsets(ctx, "X", X.shape[0], "row_conv")
    out = np.zeros(X.shape, np.result_type(X, Filter))
    for s, e in zip(offs[:-1], offs[1:]):
        for k in range(Filter.shape[0]):
            if e - s - k > 0:
                out[s:e - k] += X[s + k:e] * Filter[k]
    return {"Out": out.astype(X.dtype)}


def _row_conv_grad_ref(X, Filter, ctx, **kw):
    g = kw["Out@GRAD"]
    offs = one_level_offsets(ctx, "X", X.shape[0], "row_conv_grad")
    dx, dw = np.zeros(X.shape), np.zeros(Filter.shape)
    for s, e in zip(offs[:-1], offs[1:]):
        for k in range(Filter.shape[0]):
            if e - s - k > 0:
                dx[s + k:e] += g[s:e - k] * Filter[k]
                dw[k] += (g[s:e - k] * X[s + k:e]).sum(axis=0)
    return {"X@GRAD": dx.astype(X.dtype), "Filter@GRAD": dw.astype(Filter.dtype)}


register_op(
    "row_conv", inputs=["X", "Filter"], outputs=["Out"], traits=TRAITS,
    infer_shape=_row_conv_infer, reference=_row_conv_ref, emit=None,
    grad=lambda op: [GradOpSpec("row_conv_grad",
                                {"X": op.input("X"), "Filter": op.input("Filter"),
                                 "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X")),
                                 "Filter@GRAD": _g(op.input("Filter"))})],
    out_lod=lambda lods, **_: {"Out": lods["X"]},
    doc="Out[t] = sum_k X[t + k] * Filter[k] within t's sequence (lookahead convolution).")
register_op(
    "row_conv_grad", inputs=["X", "Filter", "Out@GRAD"], outputs=["X@GRAD?", "Filter@GRAD?"],
    traits=TRAITS, infer_shape=lambda X, Filter, **_: {"X@GRAD": X, "Filter@GRAD": Filter},
    reference=_row_conv_grad_ref, emit=None, grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": lods["X"], "Filter@GRAD": []},
    doc="Gradients of row_conv.")


# ---- add_position_encoding -------------------------------------------------------------------
# Out = alpha * X + beta * PE, PE[pos, k] = sin(pos / 10000^(k / (half - 1))) for k < half and
# cos(...) for the second half (half = D / 2; pos / 10000 when half is 1); pos counts from 0 in
# each sequence: the rows of a LoD X [T, D], or axis 1 of a dense X [N, T, D].
_PE_ATTRS = {"alpha": Float(1.0, low=0.5, high=2.0), "beta": Float(1.0, low=0.5, high=2.0)}


def _pe_infer(X, **_):
    check_dtype(X, FLOATS, "add_position_encoding: input X")
    if X.ndim not in (2, 3) or (X.shape[-1] >= 0 and X.shape[-1] % 2):
        raise ShapeMismatch(f"add_position_encoding: expected X [N, T, D] or a LoD X [T, D] "
                            f"with D even, got {list(X.shape)}")
    return {"Out": X}


def _pe_table(length: int, d: int) -> np.ndarray:
    half = d // 2
    pos = np.arange(length, dtype=np.float64).reshape(-1, 1)
    k = np.arange(half, dtype=np.float64).reshape(1, -1)
    val = pos / np.power(10000.0, k / (half - 1)) if half > 1 else pos / 10000.0
    return np.concatenate([np.sin(val), np.cos(val)], axis=1)


def _pe_positions(X, ctx):
    if X.ndim == 3:
        return None
    offs = one_level_offsets(ctx, "X", X.shape[0], "add_position_encoding")
    return np.arange(X.shape[0]) - np.repeat(offs[:-1], np.diff(offs))


def _pe_ref(X, *, alpha, beta, ctx):
    if X.shape[-1] % 2:
        raise ShapeMismatch(f"add_position_encoding: expected an even size D, got "
                            f"{X.shape[-1]}")
    a, b = float(np.float32(alpha)), float(np.float32(beta))
    pos = _pe_positions(X, ctx)
    if pos is None:
        pe = _pe_table(X.shape[1], X.shape[2])[None]
    else:
        pe = _pe_table(int(pos.max()) + 1 if pos.size else 0, X.shape[1])[pos]
    return {"Out": (a * X.astype(np.float64) + b * pe).astype(X.dtype)}


def _pe_grad_ref(X, *, alpha, beta, **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape:
        raise ShapeMismatch(f"add_position_encoding_grad: expected Out@GRAD of X's shape "
                            f"{list(X.shape)}, got {list(g.shape)}")
    return {"X@GRAD": (g * np.asarray(np.float32(alpha), g.dtype)).astype(X.dtype)}


register_op(
    "add_position_encoding", inputs=["X"], outputs=["Out"], attrs=_PE_ATTRS, traits=TRAITS,
    infer_shape=_pe_infer, reference=_pe_ref, emit=None,
    grad=lambda op: [GradOpSpec("add_position_encoding_grad",
                                {"X": op.input("X"), "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))},
                                {k: op.attr(k) for k in _PE_ATTRS})],
    out_lod=lambda lods, **_: {"Out": lods["X"]},
    doc="Out = alpha * X + beta * the sinusoidal position encoding.")
register_op(
    "add_position_encoding_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_PE_ATTRS), traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_pe_grad_ref, emit=None, grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": lods["X"]}, doc="X@GRAD = alpha * Out@GRAD.")
