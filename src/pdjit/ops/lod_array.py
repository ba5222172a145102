"""Fluid 1.x's dynamic-RNN ops: a LoD tensor's sequences ranked by length, cut into a tensor
array of time steps, and put back; memories shrunk as sequences end.

Op types, slots and attributes are Fluid 1.8's, so its ``DynamicRNN`` programs load and run:

- ``lod_rank_table`` (X -> Out; ``level``): the sequences of X's LoD level ``level`` as
  ``(index, length)`` items sorted by length, longest first, ties in their original order
  (a stable sort); the levels above ``level`` are kept as the table's coarse LoD. The value is a
  :class:`LoDRankTable`.
- ``max_sequence_len`` (RankTable -> Out): the longest length, int64 ``[1]`` (0 when no
  sequence).
- ``lod_tensor_to_array`` (X, RankTable -> Out): element ``t`` of the array holds, in rank order,
  the ``t``-th step (a row, with its sub-sequences below the table's level) of every sequence
  longer than ``t``. A gradient (X without LoD) is split by the table's own lengths.
- ``array_to_lod_tensor`` (X, RankTable -> Out): the inverse: each sequence's steps gathered
  back, sequences in their original order, Out's LoD the table's coarse LoD plus the lengths.
- ``shrink_rnn_memory`` (X, RankTable, I -> Out): the first rows of X, one per sequence longer
  than step ``I`` (with a LoD on X: its first such sequences); ``shrink_rnn_memory_grad`` puts
  the gradient back in those rows, zeros below.
- ``reorder_lod_tensor_by_rank`` (X, RankTable -> Out): X's sequences (rows when X has no LoD)
  in the table's order; ``reorder_lod_tensor_by_rank_grad`` (X = Out@GRAD, RankTable -> Out =
  X@GRAD) restores the original order.
- ``rnn_memory_helper`` (X -> Out; ``dtype``): Out = X (how Fluid's ``StaticRNN`` hands a
  memory to the next step); ``rnn_memory_helper_grad`` gives zeros when no gradient flowed.

All run their NumPy references (they move rows between host containers; the sub-blocks that
compute on the rows compile).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    SEQUENCE,
    GradOpSpec,
    Int,
    Opaque,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops.control_flow import _sub_lod
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType


@dataclass(frozen=True)
class LoDRankTable:
    """The runtime value of a ``LOD_RANK_TABLE`` variable: ``items`` ``((index, length), ...)``
    longest first, ``level`` the LoD level ranked, ``coarse_lod`` the levels above it."""
    level: int
    items: tuple
    coarse_lod: tuple = ()

    @property
    def lengths_in_order(self) -> list:
        """The lengths by original sequence index."""
        out = [0] * len(self.items)
        for index, length in self.items:
            out[index] = length
        return out


def _table(value, op_type: str) -> LoDRankTable:
    if not isinstance(value, LoDRankTable):
        raise TypeError(f"{op_type}: RankTable must be a rank table (made by lod_rank_table), "
                        f"got {type(value).__name__}")
    return value


def _step(I, op_type: str) -> int:
    a = np.asarray(I)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"{op_type}: I must be an integer tensor of one element, got "
                        f"{a.dtype}{list(a.shape)}")
    return int(a.reshape(-1)[0])


def _offsets(lengths) -> list:
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + int(n))
    return offs


def _rows(X, ranges, tail) -> np.ndarray:
    if not ranges:
        return np.zeros((0,) + tuple(tail), X.dtype)
    return np.ascontiguousarray(np.concatenate([X[a:b] for a, b in ranges]))


# ---- lod_rank_table / max_sequence_len ----------------------------------------------------------
def _rank_ref(X, *, level, ctx):
    lod = ctx.input_lod("X")
    if not lod:
        raise ShapeMismatch("lod_rank_table: X must be a LoD tensor (lod_level >= 1), got a "
                            "tensor without LoD")
    if not 0 <= level < len(lod):
        raise ShapeMismatch(f"lod_rank_table: level {level} is out of range for X's LoD of "
                            f"{len(lod)} level(s)")
    offs = lod[level]
    items = [(i, int(offs[i + 1] - offs[i])) for i in range(len(offs) - 1)]
    items.sort(key=lambda it: -it[1])  # stable: ties keep their order
    return {"Out": LoDRankTable(level, tuple(items),
                                tuple(tuple(int(o) for o in lv) for lv in lod[:level]))}


register_op(
    "lod_rank_table", inputs=["X"], outputs=["Out"], attrs={"level": Int(0)},
    traits=[OPAQUE, SEQUENCE], infer_shape=lambda X, level: {}, reference=_rank_ref,
    emit=None, grad=None,
    doc="Out = the sequences of X's LoD level `level` ranked by length, longest first (a "
        "stable sort), with the levels above kept.")


def _max_len_ref(RankTable):
    t = _table(RankTable, "max_sequence_len")
    return {"Out": np.array([t.items[0][1] if t.items else 0], np.int64)}


register_op(
    "max_sequence_len", inputs=["RankTable"], outputs=["Out"],
    traits=[OPAQUE], infer_shape=lambda RankTable: {"Out": VarMeta((1,), np.int64)},
    reference=_max_len_ref, emit=None, grad=None,
    doc="Out = the length of the longest sequence of the rank table (int64[1]).")


# ---- lod_tensor_to_array / array_to_lod_tensor -------------------------------------------------
def _l2a_ref(X, RankTable, ctx):
    t = _table(RankTable, "lod_tensor_to_array")
    lod = ctx.input_lod("X")
    if not lod:  # a gradient: rows in the table's sequences, one level
        lod = list(t.coarse_lod) + [_offsets(t.lengths_in_order)]
    level = t.level
    if level >= len(lod):
        raise ShapeMismatch(f"lod_tensor_to_array: X's LoD has {len(lod)} level(s), the rank "
                            f"table ranks level {level}")
    if len(lod[level]) - 1 != len(t.items):
        raise ShapeMismatch(f"lod_tensor_to_array: X has {len(lod[level]) - 1} sequences at "
                            f"LoD level {level}, the rank table {len(t.items)}")
    steps = t.items[0][1] if t.items else 0
    out = []
    for s in range(steps):
        ranges, levels = [], []
        for index, length in t.items:
            if s >= length:
                break
            start = lod[level][index] + s
            lengths, rows = _sub_lod(lod, start, start + 1, level + 1)
            for k, more in enumerate(lengths):
                if k == len(levels):
                    levels.append([])
                levels[k].extend(more)
            ranges.append(rows)
        value = _rows(X, ranges, X.shape[1:])
        out.append(ctx.with_lod(value, [_offsets(lv) for lv in levels]) if levels else value)
    return {"Out": out}


def _l2a_grad(op):
    return [GradOpSpec("array_to_lod_tensor",
                       {"X": [grad_var_name(n) for n in op.output("Out")],
                        "RankTable": op.input("RankTable")},
                       {"Out": [grad_var_name(n) for n in op.input("X")]})]


register_op(
    "lod_tensor_to_array", inputs=["X", "RankTable"], outputs=["Out"],
    traits=[OPAQUE, SEQUENCE],
    infer_shape=lambda X, RankTable: {"Out": X.with_(type=VarType.LOD_TENSOR_ARRAY,
                                                     shape=(-1,) + tuple(X.shape[1:]))},
    reference=_l2a_ref, emit=None, grad=_l2a_grad,
    doc="Out[t] = the t-th step of every sequence of X longer than t, in the rank table's "
        "order (sub-sequences below the ranked level kept as the element's LoD).")


def _a2l_ref(X, RankTable, ctx):
    t = _table(RankTable, "array_to_lod_tensor")
    if not isinstance(X, list):
        raise TypeError(f"array_to_lod_tensor: X must be a tensor array, got "
                        f"{type(X).__name__}")
    if not X:
        raise ValueError("array_to_lod_tensor: the tensor array X is empty")
    missing = [i for i, v in enumerate(X) if v is None]
    if missing:
        raise ValueError(f"array_to_lod_tensor: elements {missing} of X were never written")
    data = [np.asarray(v) for v in X]
    lods = [v.lod() if callable(getattr(v, "lod", None)) else [] for v in X]
    for i, a in enumerate(data[1:], 1):
        if a.shape[1:] != data[0].shape[1:] or a.dtype != data[0].dtype:
            raise ShapeMismatch(f"array_to_lod_tensor: element {i} is {a.dtype}"
                                f"{list(a.shape)}, element 0 {data[0].dtype}"
                                f"{list(data[0].shape)}: they must agree beyond the rows")
    ranges, levels, lengths = [], [], []
    for rank in sorted(range(len(t.items)), key=lambda r: t.items[r][0]):
        length = t.items[rank][1]
        if length > len(data):
            raise ShapeMismatch(f"array_to_lod_tensor: sequence {t.items[rank][0]} has "
                                f"{length} steps, the array {len(data)} elements")
        lengths.append(length)
        for s in range(length):
            sub, rows = _sub_lod(lods[s], rank, rank + 1, 0) if lods[s] else ([], (rank, rank + 1))
            for k, more in enumerate(sub):
                if k == len(levels):
                    levels.append([])
                levels[k].extend(more)
            ranges.append((s, rows))
    parts = [data[s][a:b] for s, (a, b) in ranges]
    out = np.ascontiguousarray(np.concatenate(parts)) if parts else \
        np.zeros((0,) + data[0].shape[1:], data[0].dtype)
    ctx.set_output_lod("Out", [list(lv) for lv in t.coarse_lod] + [_offsets(lengths)]
                       + [_offsets(lv) for lv in levels])
    return {"Out": out}


def _a2l_grad(op):
    return [GradOpSpec("lod_tensor_to_array",
                       {"X": [grad_var_name(n) for n in op.output("Out")],
                        "RankTable": op.input("RankTable")},
                       {"Out": [grad_var_name(n) for n in op.input("X")]})]


register_op(
    "array_to_lod_tensor", inputs=["X", "RankTable"], outputs=["Out"],
    traits=[OPAQUE, SEQUENCE],
    infer_shape=lambda X, RankTable: {"Out": X.with_(type=VarType.LOD_TENSOR,
                                                     lod_level=X.lod_level + 1)},
    reference=_a2l_ref, emit=None, grad=_a2l_grad,
    doc="Out = the steps in the tensor array X gathered back into their sequences, in the "
        "sequences' original order (lod_tensor_to_array's inverse).")


# ---- shrink_rnn_memory ---------------------------------------------------------------------------
def _running(t: LoDRankTable, step: int) -> int:
    """How many sequences are longer than ``step`` (they come first in rank order)."""
    return sum(1 for _, length in t.items if length > step)


def _shrink_ref(X, RankTable, I, ctx):
    t = _table(RankTable, "shrink_rnn_memory")
    n = _running(t, _step(I, "shrink_rnn_memory"))
    lod = ctx.input_lod("X")
    if lod and len(lod[0]) - 1 > n:
        lengths, (_, height) = _sub_lod(lod, 0, n, 0)
        ctx.set_output_lod("Out", [_offsets(lv) for lv in lengths])
    else:
        height = min(n, X.shape[0]) if not lod else X.shape[0]
        ctx.set_output_lod("Out", lod)
    return {"Out": np.array(X[:height], copy=True)}


def _shrink_grad(op):
    return [GradOpSpec("shrink_rnn_memory_grad",
                       {"X": op.input("X"),
                        "Out@GRAD": [grad_var_name(n) for n in op.output("Out")]},
                       {"X@GRAD": [grad_var_name(n) for n in op.input("X")]})]


register_op(
    "shrink_rnn_memory", inputs=["X", "RankTable", "I"], outputs=["Out"],
    traits=[OPAQUE, SEQUENCE],
    infer_shape=lambda X, RankTable, I: {"Out": X.with_(shape=(-1,) + tuple(X.shape[1:]))},
    reference=_shrink_ref, emit=None, grad=_shrink_grad,
    doc="Out = the first rows of X, one per sequence longer than step I (X's first such "
        "sequences when X has a LoD).")


def _shrink_grad_ref(X, ctx, **kw):
    g = kw.get("Out@GRAD")
    dx = np.zeros(X.shape, X.dtype)
    if g is not None:
        g = np.asarray(g)
        dx[:g.shape[0]] = g
    ctx.set_output_lod("X@GRAD", ctx.input_lod("X"))
    return {"X@GRAD": dx}


register_op(
    "shrink_rnn_memory_grad", inputs=["X", "Out@GRAD?"], outputs=["X@GRAD"],
    traits=[OPAQUE, SEQUENCE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_shrink_grad_ref, emit=None, grad=None,
    doc="X@GRAD = Out@GRAD in X's first rows, zeros in the others (all zeros without it).")


# ---- reorder_lod_tensor_by_rank ------------------------------------------------------------------
def _pieces(X, lod):
    """(row range, LoD lengths below level 0) of each sequence of level 0; rows without LoD."""
    if not lod:
        return [((i, i + 1), []) for i in range(X.shape[0])]
    out = []
    for i in range(len(lod[0]) - 1):
        lengths, rows = _sub_lod(lod, i, i + 1, 0)
        out.append((rows, lengths))
    return out


def _gather_pieces(X, pieces, order, ctx, slot):
    ranges, levels = [], []
    for i in order:
        rows, lengths = pieces[i]
        ranges.append(rows)
        for k, more in enumerate(lengths):
            if k == len(levels):
                levels.append([])
            levels[k].extend(more)
    ctx.set_output_lod(slot, [_offsets(lv) for lv in levels])
    return _rows(X, ranges, X.shape[1:])


def _reorder_ref(X, RankTable, ctx):
    t = _table(RankTable, "reorder_lod_tensor_by_rank")
    pieces = _pieces(X, ctx.input_lod("X"))
    bad = [index for index, _ in t.items if index >= len(pieces)]
    if bad:
        raise ShapeMismatch(f"reorder_lod_tensor_by_rank: the rank table names sequence "
                            f"{bad[0]}, X has {len(pieces)} sequences (rows when it has no LoD)")
    return {"Out": _gather_pieces(X, pieces, [index for index, _ in t.items], ctx, "Out")}


def _reorder_grad(op):
    return [GradOpSpec("reorder_lod_tensor_by_rank_grad",
                       {"X": [grad_var_name(n) for n in op.output("Out")],
                        "RankTable": op.input("RankTable")},
                       {"Out": [grad_var_name(n) for n in op.input("X")]})]


register_op(
    "reorder_lod_tensor_by_rank", inputs=["X", "RankTable"], outputs=["Out"],
    traits=[OPAQUE, SEQUENCE], infer_shape=lambda X, RankTable: {"Out": X},
    reference=_reorder_ref, emit=None, grad=_reorder_grad,
    doc="Out = X's sequences (its rows when X has no LoD) in the rank table's order.")


def _reorder_grad_ref(X, RankTable, ctx):
    t = _table(RankTable, "reorder_lod_tensor_by_rank_grad")
    pieces = _pieces(X, ctx.input_lod("X"))
    if len(pieces) < len(t.items):
        raise ShapeMismatch(f"reorder_lod_tensor_by_rank_grad: X has {len(pieces)} sequences, "
                            f"the rank table {len(t.items)}")
    # piece r of X is the sequence of original index items[r].index: restore that order
    order = sorted(range(len(t.items)), key=lambda r: t.items[r][0])
    return {"Out": _gather_pieces(X, pieces, order, ctx, "Out")}


register_op(
    "reorder_lod_tensor_by_rank_grad", inputs=["X", "RankTable"], outputs=["Out"],
    traits=[OPAQUE, SEQUENCE], infer_shape=lambda X, RankTable: {"Out": X},
    reference=_reorder_grad_ref, emit=None, grad=None,
    doc="Out = X (the gradient of a reorder_lod_tensor_by_rank's Out) with its sequences put "
        "back in their original order.")


# ---- rnn_memory_helper -------------------------------------------------------------------------
_DTYPE_DOC = "the memory's data type (Fluid writes it; the value keeps X's)"


def _helper_grad(op):
    return [GradOpSpec("rnn_memory_helper_grad",
                       {"Out@GRAD": [grad_var_name(n) for n in op.output("Out")],
                        "X": op.input("X"), "Out": op.output("Out")},
                       {"X@GRAD": [grad_var_name(n) for n in op.input("X")]},
                       {"dtype": op.attr("dtype")})]


def _helper_lower(ctx):
    """A copy of X (a dense memory; LoD values and arrays stay with the reference)."""
    return [f"{ctx.out('Out')} = {ctx.inp('X')}.copy()"]


register_op(
    "rnn_memory_helper", inputs=["X"], outputs=["Out"],
    attrs={"dtype": Int(int(VarType.FP32), doc=_DTYPE_DOC)},
    traits=[OPAQUE], infer_shape=lambda X, dtype: {"Out": X},
    reference=lambda X: {"Out": np.array(X, copy=True)},
    emit=Opaque(_helper_lower, host=True), grad=_helper_grad,
    doc="Out = X.")


def _helper_grad_ref(X, **kw):
    g = kw.get("Out@GRAD")
    return {"X@GRAD": np.zeros(X.shape, X.dtype) if g is None else np.array(g, copy=True)}


register_op(
    "rnn_memory_helper_grad", inputs=["Out@GRAD?", "X", "Out?"], outputs=["X@GRAD"],
    attrs={"dtype": Int(int(VarType.FP32), doc=_DTYPE_DOC)},
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_helper_grad_ref, emit=None, grad=None,
    doc="X@GRAD = Out@GRAD (zeros like X when no gradient flowed).")
