"""Sequence ops over LoD tensors: ``sequence_pool``, ``sequence_softmax``, ``sequence_expand``,
``sequence_expand_as``, ``sequence_concat``, ``sequence_pad``/``sequence_unpad``,
``sequence_mask``, ``sequence_reverse``, ``lod_reset``, and their gradients.

Slots, attribute names, types and defaults are PaddlePaddle 3.3.1's legacy ops where it still
has them (``sequence_pool``, ``sequence_softmax``, ``sequence_expand``, ``sequence_mask``,
``lod_reset``), Fluid 1.8's otherwise. Semantics (Fluid's):

- A sequence op reads the *last* LoD level of its LoD input: sequence ``i`` is rows
  ``offs[i]:offs[i+1]``. Empty sequences are allowed everywhere: ``sequence_pool`` gives
  ``pad_value`` for them (and ``MaxIndex`` -1), the others simply produce no rows for them.
- ``sequence_pool`` drops the last LoD level (Out keeps the levels above it); ``MaxIndex``
  (int32, Out's shape) holds, for ``MAX``, the row of X each maximum came from (the first one on
  ties), and -1 elsewhere. ``sequence_softmax``/``sequence_reverse``/``lod_reset_grad`` keep X's
  LoD; ``sequence_expand`` gives Out one level when X has a LoD and none when it has not (as
  Paddle's kernel does); ``sequence_expand_as`` and ``sequence_unpad`` give one level;
  ``sequence_pad`` and ``sequence_mask`` give none.
- ``lod_reset`` takes the LoD from Y's LoD when Y has one, from Y's data (offsets) when it has
  none, else from ``target_lod``; ``append`` adds the new level below X's levels.

Every op declares ``out_lod`` (registry.py), so the output LoD is known from input LoDs alone,
except ``sequence_unpad``'s and ``lod_reset``'s from Y's data (``ValueDependentLoD``).

Fluid 1.x's LoD recurrent ops and ``sequence_conv`` (Paddle 3.3.1's legacy slots, attributes
and defaults; numbers compared with Paddle in ``tests/ops/test_lod_rnn.py``):

- ``lstm``: Input ``[rows, 4H]`` holds each row's projected gates in the order {c~, i, f, o};
  ``Weight [H, 4H]``, ``Bias [1, 4H]`` (+ the peepholes ``W_ic, W_fc, W_oc`` as ``[1, 7H]``
  with ``use_peepholes``). Per sequence (from its end with ``is_reverse``), from ``H0``/``C0``
  (one row per sequence; zeros when absent; H0 needs C0): ``g = x + b + h_prev W``,
  ``i = act_g(g_i + c_prev W_ic)``, ``f = act_g(g_f + c_prev W_fc)``, ``c = act_cand(g_c) * i +
  c_prev * f``, ``o = act_g(g_o + c W_oc)``, ``h = o * act_cell(c)``; the first step of a
  sequence without C0 has no peephole terms for i and f. Hidden and Cell ``[rows, H]`` keep
  Input's LoD; ``BatchGate`` (the activated gates) and ``BatchCellPreAct`` (``act_cell(c)``)
  are in Paddle's batch order (sequences by length, longest first; see ``_batch_order``).
  ``lstm_grad`` reads ``Cell@GRAD`` when it is given, which Paddle's does not (there a loss of
  Cell has no gradient); a program from Paddle, without it, gets Paddle's numbers.
- ``gru``: Input ``[rows, 3H]`` holds the gates {u, r, c}; ``Weight [H, 3H]`` is, in memory,
  the ``[H, 2H]`` weight of u and r, then the ``[H, H]`` weight of the candidate;
  ``u, r = act_g(g_ur + h_prev W_ur)``, ``c = act(g_c + (r * h_prev) W_c)``, ``h = (1 - u) *
  h_prev + u * c`` (``origin_mode``: ``u * h_prev + (1 - u) * c``). BatchGate,
  BatchResetHiddenPrev (``r * h_prev``) and BatchHidden are in batch order.
- Activations: sigmoid (its input clamped to [-40, 13], as Paddle's kernels do), tanh, relu,
  identity. Empty sequences produce no rows.
- ``sequence_conv``: ``Out[t] = [X[t + contextStart], ..., X[t + contextStart +
  contextLength - 1]] @ Filter``, rows outside t's sequence zero, or with
  ``paddingTrainable`` rows of PaddingData ``[up + down, D]`` (``up = max(0, -contextStart)``
  rows used above the sequence, then ``down`` below); ``contextStride`` must be 1.
Natively (float32/float64) each target lowers them its own way
(``codegen/<target>/lowerings/sequence.py``).

Malformed input (no LoD where one is needed, a ``ref_level`` out of range, sequence counts or
lengths that do not match rows) raises ``ShapeMismatch`` saying what was expected and got; the
executor adds the op's name and where it was created.

Gradients use Paddle's grad slots, with two additions so that a grad op never depends on a
gradient variable carrying a LoD: ``sequence_unpad_grad`` also reads ``Length``, and
``sequence_reverse_grad`` (Paddle reuses ``sequence_reverse`` itself) reads X for its LoD.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    SEQUENCE,
    Bool,
    Float,
    GradOpSpec,
    Int,
    Ints,
    Opaque,
    Str,
    ValueDependentLoD,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops import sequence_lower as _lower
from pdjit.ops._common import FLOATS, INDEX, NUMERIC, check_dtype

INT32 = np.dtype(np.int32)
INT64 = np.dtype(np.int64)
TRAITS = (SEQUENCE, OPAQUE)
POOLTYPES = ("AVERAGE", "SUM", "SQRT", "MAX", "LAST", "FIRST")
#: the lowerings written for the device target too (``sequence_lower``: kernels reading the
#: offsets' device copy)


# ---- LoD helpers -----------------------------------------------------------------------------
def _in_lod(ctx, slot: str, i: int = 0) -> list:
    return ctx.input_lod(slot, i) if ctx is not None else []


def _need_lod(lod, slot: str) -> list:
    if not lod:
        raise ShapeMismatch(f"input {slot} must be a LoD tensor: expected LoD offsets "
                            f"(lod_level >= 1), got a tensor without LoD")
    return lod


def _offsets(lod, slot: str, rows: int) -> np.ndarray:
    """The last level of ``lod`` (required) as int64 offsets, checked against ``rows``."""
    offs = _need_lod(lod, slot)[-1]
    if offs[-1] != rows:
        raise ShapeMismatch(f"input {slot}: its LoD's last level ends at {offs[-1]}: expected "
                            f"the number of rows {rows}")
    return np.asarray(offs, dtype=np.int64)


def _seg_ids(offs: np.ndarray) -> np.ndarray:
    """For each row, the index of the sequence holding it."""
    return np.repeat(np.arange(len(offs) - 1), np.diff(offs))


def _rows_meta(x: VarMeta, **kw) -> VarMeta:
    return x.with_(shape=(-1,) + tuple(x.shape[1:]), **kw)


def _rank_at_least(x: VarMeta, n: int, slot: str) -> None:
    if x.ndim < n:
        raise ShapeMismatch(f"input {slot} of shape {list(x.shape)}: expected rank >= {n}, got "
                            f"rank {x.ndim}")


def _copy_attrs(op, names) -> dict:
    return {k: v for k, v in op.all_attrs().items() if k in names}


def _g(names) -> list:
    return [grad_var_name(n) for n in names]


# ---- sequence_pool ---------------------------------------------------------------------------
def _pool_infer(X, *, pooltype, **_):
    check_dtype(X, FLOATS, "input X")
    _rank_at_least(X, 1, "X")
    if pooltype not in POOLTYPES:
        raise ShapeMismatch(f"pooltype {pooltype!r}: expected one of {', '.join(POOLTYPES)}")
    out = _rows_meta(X, lod_level=max(X.lod_level - 1, 0))
    return {"Out": out, "MaxIndex": out.with_(dtype=INT32)}


def _pool_lod(lods, **_):
    up = _need_lod(lods["X"], "X")[:-1]
    return {"Out": up, "MaxIndex": up}


def _pool_ref(X, *, pooltype, pad_value, ctx, **_):
    if pooltype not in POOLTYPES:
        raise ShapeMismatch(f"pooltype {pooltype!r}: expected one of {', '.join(POOLTYPES)}")
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    n = len(offs) - 1
    lens = np.diff(offs)
    full = lens > 0
    starts = offs[:-1][full]
    out = np.full((n,) + X.shape[1:], pad_value, dtype=X.dtype)
    index = np.full(out.shape, -1, dtype=np.int32)
    if starts.size:
        acc = np.float64 if X.dtype == np.float64 else np.float32
        if pooltype in ("AVERAGE", "SUM", "SQRT"):
            s = np.add.reduceat(X.astype(acc, copy=False), starts, axis=0)
            shape = (-1,) + (1,) * (X.ndim - 1)
            if pooltype == "AVERAGE":
                s = s / lens[full].reshape(shape)
            elif pooltype == "SQRT":
                s = s / np.sqrt(lens[full]).reshape(shape)
            out[full] = s
        elif pooltype == "MAX":
            m = np.maximum.reduceat(X, starts, axis=0)
            seg = np.repeat(np.arange(len(starts)), lens[full])
            rows = np.arange(X.shape[0]).reshape((-1,) + (1,) * (X.ndim - 1))
            cand = np.where(X == m[seg], rows, X.shape[0])
            out[full] = m
            index[full] = np.minimum.reduceat(cand, starts, axis=0)
        elif pooltype == "LAST":
            out[full] = X[offs[1:][full] - 1]
        else:
            out[full] = X[starts]
    return {"Out": out, "MaxIndex": index}


def _pool_grad_maker(op):
    ins = {"X": op.input("X"), "Out@GRAD": _g(op.output("Out"))}
    if op.attr("pooltype") == "MAX":
        ins["MaxIndex"] = op.output("MaxIndex")
    return [GradOpSpec("sequence_pool_grad", ins, {"X@GRAD": _g(op.input("X"))},
                       _copy_attrs(op, ("is_test", "pooltype", "pad_value")))]


def _pool_grad_infer(X, **_):
    return {"X@GRAD": X}


def _pool_grad_ref(X, MaxIndex, *, pooltype, ctx, **kw):
    g = kw["Out@GRAD"]
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    n = len(offs) - 1
    if g.shape != (n,) + X.shape[1:]:
        raise ShapeMismatch(f"Out@GRAD of shape {list(g.shape)}: expected "
                            f"{[n] + list(X.shape[1:])} (one row per sequence)")
    dx = np.zeros(X.shape, dtype=X.dtype)
    lens = np.diff(offs)
    if pooltype == "MAX":
        if MaxIndex is None or MaxIndex.shape != g.shape:
            raise ShapeMismatch(f"MaxIndex: expected shape {list(g.shape)}, got "
                                f"{None if MaxIndex is None else list(MaxIndex.shape)}")
        width = int(np.prod(X.shape[1:], dtype=np.int64))
        flat_i = MaxIndex.reshape(n, width)
        cols = np.broadcast_to(np.arange(width), flat_i.shape)
        ok = flat_i >= 0
        if np.any(flat_i[ok] >= X.shape[0]):
            raise IndexError(f"MaxIndex holds a row >= {X.shape[0]} (X's rows)")
        dflat = dx.reshape(X.shape[0], width)
        np.add.at(dflat, (flat_i[ok], cols[ok]), g.reshape(n, width)[ok])
    elif pooltype in ("LAST", "FIRST"):
        full = lens > 0
        rows = offs[1:][full] - 1 if pooltype == "LAST" else offs[:-1][full]
        dx[rows] = g[full]
    else:
        scale = {"SUM": np.ones(n), "AVERAGE": 1.0 / np.maximum(lens, 1),
                 "SQRT": 1.0 / np.sqrt(np.maximum(lens, 1))}[pooltype]
        seg = _seg_ids(offs)
        dx[...] = g[seg] * scale[seg].reshape((-1,) + (1,) * (X.ndim - 1))
    return {"X@GRAD": dx}


register_op(
    "sequence_pool", inputs=["X"], outputs=["Out", "MaxIndex~"],
    attrs={"is_test": Bool(False), "pooltype": Str("AVERAGE", choices=POOLTYPES),
           "pad_value": Float(0.0, low=-2.0, high=2.0)},
    traits=TRAITS, infer_shape=_pool_infer, reference=_pool_ref,
    emit=Opaque(_lower.pool),
    grad=_pool_grad_maker, out_lod=_pool_lod,
    doc="One row per sequence of X's last LoD level: AVERAGE, SUM, SQRT (sum/sqrt(len)), MAX, "
        "LAST or FIRST of its rows; pad_value for an empty sequence.")
register_op(
    "sequence_pool_grad", inputs=["X", "MaxIndex?", "Out@GRAD"], outputs=["X@GRAD"],
    attrs={"is_test": Bool(False), "pooltype": Str("AVERAGE", choices=POOLTYPES),
           "pad_value": Float(0.0)},
    traits=TRAITS, infer_shape=_pool_grad_infer, reference=_pool_grad_ref,
    emit=Opaque(_lower.pool_grad), grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": lods["X"]})


# ---- sequence_softmax ------------------------------------------------------------------------
def _check_column(X: VarMeta, slot="X") -> None:
    if not (X.ndim == 1 or (X.ndim == 2 and X.shape[1] in (1, -1))):
        raise ShapeMismatch(f"input {slot} of shape {list(X.shape)}: expected [N] or [N, 1]")


def _softmax_infer(X):
    check_dtype(X, FLOATS, "input X")
    _check_column(X)
    return {"Out": X}


def _seq_sum(v: np.ndarray, offs: np.ndarray) -> np.ndarray:
    """Per-sequence sums of a 1-D array (0 for an empty sequence)."""
    out = np.zeros(len(offs) - 1, dtype=v.dtype)
    full = np.diff(offs) > 0
    if full.any():
        out[full] = np.add.reduceat(v, offs[:-1][full])
    return out


def _softmax_ref(X, ctx):
    if X.ndim == 2 and X.shape[1] != 1:
        raise ShapeMismatch(f"input X of shape {list(X.shape)}: expected [N] or [N, 1]")
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    x = X.reshape(-1)
    seg = _seg_ids(offs)
    full = np.diff(offs) > 0
    m = np.zeros(len(offs) - 1, dtype=X.dtype)
    if full.any():
        m[full] = np.maximum.reduceat(x, offs[:-1][full])
    e = np.exp(x - m[seg])
    out = e / _seq_sum(e, offs)[seg]
    return {"Out": out.astype(X.dtype, copy=False).reshape(X.shape)}


def _softmax_grad_ref(Out, X, ctx, **kw):
    g = kw["Out@GRAD"]
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    if g.shape != Out.shape:
        raise ShapeMismatch(f"Out@GRAD of shape {list(g.shape)}: expected {list(Out.shape)}")
    o, gf = Out.reshape(-1), g.reshape(-1)
    seg = _seg_ids(offs)
    dx = o * (gf - _seq_sum(o * gf, offs)[seg])
    return {"X@GRAD": dx.astype(X.dtype, copy=False).reshape(X.shape)}


register_op(
    "sequence_softmax", inputs=["X"], outputs=["Out"], attrs={},
    traits=TRAITS, infer_shape=_softmax_infer, reference=_softmax_ref,
    emit=Opaque(_lower.softmax),
    grad=lambda op: [GradOpSpec("sequence_softmax_grad",
                                {"Out": op.output("Out"), "Out@GRAD": _g(op.output("Out")),
                                 "X": op.input("X")},
                                {"X@GRAD": _g(op.input("X"))})],
    out_lod=lambda lods, **_: {"Out": _need_lod(lods["X"], "X")},
    doc="Softmax of X ([N] or [N, 1]) within each sequence of its last LoD level.")
register_op(
    "sequence_softmax_grad", inputs=["Out", "Out@GRAD", "X"], outputs=["X@GRAD"], attrs={},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_softmax_grad_ref,
    emit=Opaque(_lower.softmax_grad), grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": lods["X"]})


# ---- sequence_expand / sequence_expand_as ----------------------------------------------------
def _expand_plan(x_lod, y_lod, x_rows, ref_level):
    """(row index into X for each output row, output LoD) of ``sequence_expand``."""
    y_lod = _need_lod(y_lod, "Y")
    if not (ref_level == -1 or 0 <= ref_level < len(y_lod)):
        raise ShapeMismatch(f"ref_level={ref_level}: expected -1 or 0..{len(y_lod) - 1} (Y has "
                            f"{len(y_lod)} LoD level(s))")
    ref = np.asarray(y_lod[ref_level], dtype=np.int64)
    if len(x_lod) > 1:
        raise ShapeMismatch(f"input X has {len(x_lod)} LoD levels: expected at most 1")
    if len(ref) <= 1:
        return np.arange(x_rows), x_lod
    if x_lod:
        x_offs = np.asarray(x_lod[0], dtype=np.int64)
        if len(x_offs) != len(ref):
            raise ShapeMismatch(f"X has {len(x_offs) - 1} sequences and Y's level {ref_level} "
                                f"{len(ref) - 1}: expected equal counts")
    else:
        if x_rows != len(ref) - 1:
            raise ShapeMismatch(f"X (without LoD) has {x_rows} rows and Y's level {ref_level} "
                                f"has {len(ref) - 1} sequences: expected one row per sequence")
        x_offs = np.arange(x_rows + 1, dtype=np.int64)
    repeats = np.diff(ref)
    xlens = np.diff(x_offs)
    pieces = [np.tile(np.arange(x_offs[i], x_offs[i + 1]), int(r))
              for i, r in enumerate(repeats) if r > 0 and xlens[i] > 0]
    index = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    out_lod = []
    if x_lod:
        out_lod = [[0] + np.cumsum(np.repeat(xlens, repeats)).tolist()]
    return index, out_lod


def _expand_infer(X, Y, **_):
    check_dtype(X, NUMERIC, "input X")
    _rank_at_least(X, 1, "X")
    return {"Out": _rows_meta(X, lod_level=min(X.lod_level, 1))}


def _expand_ref(X, Y, *, ref_level, ctx):
    index, _ = _expand_plan(_in_lod(ctx, "X"), _in_lod(ctx, "Y"), X.shape[0], ref_level)
    return {"Out": X[index]}


def _expand_lod(lods, *, ref_level):
    x_lod = lods["X"]
    rows = x_lod[0][-1] if x_lod else len(_need_lod(lods["Y"], "Y")[ref_level]) - 1
    return {"Out": _expand_plan(x_lod, lods["Y"], rows, ref_level)[1]}


def _expand_grad_ref(X, Y, *, ref_level, ctx, **kw):
    g = kw["Out@GRAD"]
    index, _ = _expand_plan(_in_lod(ctx, "X"), _in_lod(ctx, "Y"), X.shape[0], ref_level)
    if g.shape != (len(index),) + X.shape[1:]:
        raise ShapeMismatch(f"Out@GRAD of shape {list(g.shape)}: expected "
                            f"{[len(index)] + list(X.shape[1:])}")
    dx = np.zeros(X.shape, dtype=g.dtype)
    np.add.at(dx, index, g)
    return {"X@GRAD": dx.astype(X.dtype, copy=False)}


def _xy_grad(grad_type, attrs=()):
    def maker(op):
        return [GradOpSpec(grad_type, {"X": op.input("X"), "Y": op.input("Y"),
                                       "Out@GRAD": _g(op.output("Out"))},
                           {"X@GRAD": _g(op.input("X"))}, _copy_attrs(op, attrs))]
    return maker


register_op(
    "sequence_expand", inputs=["X", "Y"], outputs=["Out"],
    attrs={"ref_level": Int(-1, choices=(-1,))},
    traits=TRAITS, infer_shape=_expand_infer, reference=_expand_ref,
    emit=Opaque(_lower.expand),
    grad=_xy_grad("sequence_expand_grad", ("ref_level",)), out_lod=_expand_lod,
    doc="Repeat each sequence of X (each row, when X has no LoD) as many times as the "
        "matching sequence of Y's LoD level ref_level is long.")
register_op(
    "sequence_expand_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD"],
    attrs={"ref_level": Int(-1)},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_expand_grad_ref,
    emit=Opaque(_lower.expand_grad), grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": lods["X"]})


def _expand_as_offsets(y_lod, x_rows):
    ref = np.asarray(_need_lod(y_lod, "Y")[-1], dtype=np.int64)
    if x_rows != len(ref) - 1:
        raise ShapeMismatch(f"X has {x_rows} rows and Y has {len(ref) - 1} sequences: expected "
                            f"one row of X per sequence of Y")
    return ref


def _expand_as_ref(X, Y, ctx):
    ref = _expand_as_offsets(_in_lod(ctx, "Y"), X.shape[0])
    return {"Out": np.repeat(X, np.diff(ref), axis=0)}


def _expand_as_grad_ref(X, Y, ctx, **kw):
    g = kw["Out@GRAD"]
    ref = _expand_as_offsets(_in_lod(ctx, "Y"), X.shape[0])
    if g.shape != (int(ref[-1]),) + X.shape[1:]:
        raise ShapeMismatch(f"Out@GRAD of shape {list(g.shape)}: expected "
                            f"{[int(ref[-1])] + list(X.shape[1:])}")
    dx = np.zeros(X.shape, dtype=g.dtype)
    full = np.diff(ref) > 0
    if full.any():
        dx[full] = np.add.reduceat(g, ref[:-1][full], axis=0)
    return {"X@GRAD": dx.astype(X.dtype, copy=False)}


register_op(
    "sequence_expand_as", inputs=["X", "Y"], outputs=["Out"], attrs={},
    traits=TRAITS, infer_shape=lambda X, Y: {"Out": _rows_meta(X, lod_level=1)},
    reference=_expand_as_ref, emit=Opaque(_lower.expand_as),
    grad=_xy_grad("sequence_expand_as_grad"),
    out_lod=lambda lods, **_: {"Out": [list(_need_lod(lods["Y"], "Y")[-1])]},
    doc="Row i of X repeated as many times as sequence i of Y (last LoD level) is long; Out "
        "takes that level as its LoD.")
register_op(
    "sequence_expand_as_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD"], attrs={},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_expand_as_grad_ref,
    emit=Opaque(_lower.expand_as_grad), grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": lods["X"]})


# ---- sequence_concat -------------------------------------------------------------------------
def _concat_infer(X):
    if not X:
        raise ShapeMismatch("input X: expected at least one tensor, got none")
    for i, x in enumerate(X):
        check_dtype(x, NUMERIC, f"input X[{i}]")
        _rank_at_least(x, 1, f"X[{i}]")
        if x.dtype != X[0].dtype or len(x.shape) != len(X[0].shape) or any(
                a != b and a != -1 and b != -1 for a, b in zip(x.shape[1:], X[0].shape[1:])):
            raise ShapeMismatch(f"X[{i}] is {x.dtype}{list(x.shape)} and X[0] "
                                f"{X[0].dtype}{list(X[0].shape)}: expected the same dtype and "
                                f"the same dims after the first")
    return {"Out": _rows_meta(X[0], lod_level=1)}


def _concat_offsets(lods, rows) -> list:
    """Each input's last-level offsets, all with the same number of sequences."""
    offs = [_offsets(lod, f"X[{i}]", r) for i, (lod, r) in enumerate(zip(lods, rows))]
    for i, o in enumerate(offs):
        if len(o) != len(offs[0]):
            raise ShapeMismatch(f"X[{i}] has {len(o) - 1} sequences and X[0] "
                                f"{len(offs[0]) - 1}: expected the same number of sequences")
    return offs


def _concat_index(offs):
    """Rows of the stacked inputs in output order (sequence by sequence, input by input)."""
    base = np.cumsum([0] + [int(o[-1]) for o in offs])
    pieces = [np.arange(base[k] + o[i], base[k] + o[i + 1])
              for i in range(len(offs[0]) - 1) for k, o in enumerate(offs)]
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)


def _concat_ref(X, ctx):
    offs = _concat_offsets([_in_lod(ctx, "X", i) for i in range(len(X))],
                           [x.shape[0] for x in X])
    for i, x in enumerate(X):
        if x.shape[1:] != X[0].shape[1:] or x.dtype != X[0].dtype:
            raise ShapeMismatch(f"X[{i}] is {x.dtype}{list(x.shape)} and X[0] "
                                f"{X[0].dtype}{list(X[0].shape)}: expected the same dtype and "
                                f"dims after the first")
    return {"Out": np.concatenate(X, axis=0)[_concat_index(offs)]}


def _concat_lod(lods, **_):
    offs = _concat_offsets(lods["X"], [_need_lod(lod, f"X[{i}]")[-1][-1]
                                       for i, lod in enumerate(lods["X"])])
    return {"Out": [np.sum([np.asarray(o) for o in offs], axis=0).tolist()]}


def _concat_grad_ref(X, ctx, **kw):
    g = kw["Out@GRAD"]
    offs = _concat_offsets([_in_lod(ctx, "X", i) for i in range(len(X))],
                           [x.shape[0] for x in X])
    index = _concat_index(offs)
    if g.shape[0] != len(index):
        raise ShapeMismatch(f"Out@GRAD has {g.shape[0]} rows: expected {len(index)}")
    stacked = np.zeros((len(index),) + g.shape[1:], dtype=g.dtype)
    stacked[index] = g
    cuts = np.cumsum([x.shape[0] for x in X])[:-1]
    return {"X@GRAD": [p.astype(x.dtype, copy=False) for p, x in
                       zip(np.split(stacked, cuts, axis=0), X)]}


register_op(
    "sequence_concat", inputs=["X*"], outputs=["Out"], attrs={},
    traits=TRAITS, infer_shape=_concat_infer, reference=_concat_ref,
    emit=Opaque(_lower.concat),
    grad=lambda op: [GradOpSpec("sequence_concat_grad",
                                {"X": op.input("X"), "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))})],
    out_lod=_concat_lod,
    doc="Sequence i of Out is sequence i of X[0], then of X[1]...; every X has a LoD with the "
        "same number of sequences.")
register_op(
    "sequence_concat_grad", inputs=["X*", "Out@GRAD"], outputs=["X@GRAD*"], attrs={},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": list(X)}, reference=_concat_grad_ref,
    emit=Opaque(_lower.concat_grad), grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": list(lods["X"])})


# ---- sequence_pad / sequence_unpad -----------------------------------------------------------
def _pad_infer(X, PadValue, *, padded_length):
    check_dtype(X, NUMERIC, "input X")
    _rank_at_least(X, 2, "X")
    step = tuple(X.shape[1:])
    if PadValue.dtype != X.dtype:
        raise ShapeMismatch(f"PadValue is {PadValue.dtype}: expected X's dtype {X.dtype}")
    if PadValue.shape not in ((), (1,)) and not (
            len(PadValue.shape) == len(step)
            and all(a == b or -1 in (a, b) for a, b in zip(PadValue.shape, step))):
        raise ShapeMismatch(f"PadValue of shape {list(PadValue.shape)}: expected [1] or X's "
                            f"time-step shape {list(step)}")
    length = padded_length if padded_length > 0 else -1
    return {"Out": X.with_(shape=(-1, length) + step, lod_level=0),
            "Length": VarMeta((-1,), INT64)}


def _pad_lengths(lod, rows, padded_length):
    offs = _offsets(lod, "X", rows)
    lens = np.diff(offs)
    longest = int(lens.max()) if lens.size else 0
    if padded_length == -1:
        padded_length = longest
    elif padded_length < longest:
        raise ShapeMismatch(f"padded_length={padded_length} is shorter than the longest "
                            f"sequence ({longest}): expected -1 or >= {longest}")
    return offs, lens, padded_length


def _pad_ref(X, PadValue, *, padded_length, ctx):
    offs, lens, width = _pad_lengths(_in_lod(ctx, "X"), X.shape[0], padded_length)
    n = len(lens)
    step = X.shape[1:]
    if PadValue.size == 1:
        pad = PadValue.reshape(())
    elif PadValue.shape == step:
        pad = PadValue
    else:
        raise ShapeMismatch(f"PadValue of shape {list(PadValue.shape)}: expected [1] or X's "
                            f"time-step shape {list(step)}")
    out = np.empty((n, width) + step, dtype=X.dtype)
    out[...] = pad
    seg = _seg_ids(offs)
    pos = np.arange(X.shape[0]) - offs[seg]
    out[seg, pos] = X
    return {"Out": out, "Length": lens.astype(np.int64)}


def _pad_grad_ref(X, ctx, **kw):
    g = kw["Out@GRAD"]
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    if g.ndim != X.ndim + 1 or g.shape[0] != len(offs) - 1 or g.shape[2:] != X.shape[1:]:
        raise ShapeMismatch(f"Out@GRAD of shape {list(g.shape)}: expected [{len(offs) - 1}, "
                            f"padded_length] + {list(X.shape[1:])}")
    seg = _seg_ids(offs)
    return {"X@GRAD": g[seg, np.arange(X.shape[0]) - offs[seg]].astype(X.dtype, copy=False)}


register_op(
    "sequence_pad", inputs=["X", "PadValue"], outputs=["Out", "Length"],
    attrs={"padded_length": Int(-1, choices=(-1,))},
    traits=TRAITS, infer_shape=_pad_infer, reference=_pad_ref, emit=Opaque(_lower.pad),
    grad=lambda op: [GradOpSpec("sequence_pad_grad",
                                {"X": op.input("X"), "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))},
                                _copy_attrs(op, ("padded_length",)))],
    out_lod=lambda lods, **_: {"Out": [], "Length": []},
    doc="Out[i, :len_i] = sequence i of X, the rest PadValue (a scalar or one time step); "
        "Length[i] = len_i (int64). padded_length -1 pads to the longest sequence.")
register_op(
    "sequence_pad_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"],
    attrs={"padded_length": Int(-1)},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_pad_grad_ref,
    emit=Opaque(_lower.pad_grad), grad=None, out_lod=lambda lods, **_: {"X@GRAD": lods["X"]})


def _unpad_lengths(X, Length) -> np.ndarray:
    lens = np.asarray(Length).reshape(-1).astype(np.int64)
    if lens.size != X.shape[0]:
        raise ShapeMismatch(f"Length holds {lens.size} lengths and X has {X.shape[0]} padded "
                            f"sequences: expected one length per sequence")
    bad = (lens < 0) | (lens > X.shape[1])
    if bad.any():
        i = int(np.argmax(bad))
        raise ShapeMismatch(f"Length[{i}] = {int(lens[i])}: expected 0 <= length <= "
                            f"{X.shape[1]} (X's padded length)")
    return lens


def _unpad_infer(X, Length):
    check_dtype(X, NUMERIC, "input X")
    check_dtype(Length, INDEX, "input Length")
    _rank_at_least(X, 2, "X")
    return {"Out": X.with_(shape=(-1,) + tuple(X.shape[2:]), lod_level=1)}


def _unpad_mask(X, lens):
    return np.arange(X.shape[1])[None, :] < lens[:, None]


def _unpad_ref(X, Length, ctx):
    lens = _unpad_lengths(X, Length)
    out = X[_unpad_mask(X, lens)]
    ctx.set_output_lod("Out", [[0] + np.cumsum(lens).tolist()])
    return {"Out": out}


def _unpad_lod(lods, **_):
    raise ValueDependentLoD("sequence_unpad's LoD comes from Length's values")


def _unpad_grad_ref(X, Length, **kw):
    g = kw["Out@GRAD"]
    lens = _unpad_lengths(X, Length)
    mask = _unpad_mask(X, lens)
    if g.shape != (int(lens.sum()),) + X.shape[2:]:
        raise ShapeMismatch(f"Out@GRAD of shape {list(g.shape)}: expected "
                            f"{[int(lens.sum())] + list(X.shape[2:])}")
    dx = np.zeros(X.shape, dtype=X.dtype)
    dx[mask] = g
    return {"X@GRAD": dx}


register_op(
    "sequence_unpad", inputs=["X", "Length"], outputs=["Out"], attrs={},
    traits=TRAITS, infer_shape=_unpad_infer, reference=_unpad_ref, emit=None,
    grad=lambda op: [GradOpSpec("sequence_unpad_grad",
                                {"X": op.input("X"), "Length": op.input("Length"),
                                 "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))})],
    out_lod=_unpad_lod,
    doc="The first Length[i] steps of each padded sequence X[i], stacked, with a one-level LoD.")
register_op(
    "sequence_unpad_grad", inputs=["X", "Length", "Out@GRAD"], outputs=["X@GRAD"], attrs={},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_unpad_grad_ref,
    emit=None, grad=None, out_lod=lambda lods, **_: {"X@GRAD": []})


# ---- sequence_mask ---------------------------------------------------------------------------
_MASK_DTYPES = (0, 2, 3, 5, 6)  # bool, int32, int64, float32, float64


def _mask_infer(X, MaxLenTensor, *, maxlen, out_dtype):
    check_dtype(X, INDEX, "input X")
    if MaxLenTensor is not None:
        check_dtype(MaxLenTensor, INDEX, "input MaxLenTensor")
    try:
        dt = dtypes.to_numpy(out_dtype)
    except TypeError as e:
        raise ShapeMismatch(f"out_dtype: {e}") from None
    last = maxlen if maxlen >= 0 and MaxLenTensor is None else -1
    return {"Y": VarMeta(tuple(X.shape) + (last,), dt)}


def _mask_ref(X, MaxLenTensor, *, maxlen, out_dtype):
    if MaxLenTensor is not None:
        if MaxLenTensor.size != 1:
            raise ShapeMismatch(f"MaxLenTensor holds {MaxLenTensor.size} values: expected 1")
        maxlen = int(MaxLenTensor.reshape(-1)[0])
        if maxlen < 0:
            raise ShapeMismatch(f"MaxLenTensor = {maxlen}: expected a length >= 0")
    elif maxlen < 0:
        maxlen = int(X.max()) if X.size else 0
    y = np.arange(maxlen) < X[..., None]
    return {"Y": y.astype(dtypes.to_numpy(out_dtype))}


register_op(
    "sequence_mask", inputs=["X", "MaxLenTensor?"], outputs=["Y"],
    attrs={"maxlen": Int(-1, choices=(-1, 5)),
           "out_dtype": Int(REQUIRED, choices=_MASK_DTYPES, doc="VarType code of Y")},
    traits=TRAITS, infer_shape=_mask_infer, reference=_mask_ref, emit=None, grad=None,
    out_lod=lambda lods, **_: {"Y": []},
    doc="Y[..., j] = j < X[...] for j < maxlen (MaxLenTensor's value if given; max(X) when "
        "maxlen < 0), in out_dtype.")


# ---- sequence_reverse ------------------------------------------------------------------------
def _reverse_index(offs):
    seg = _seg_ids(offs)
    rows = np.arange(int(offs[-1]))
    return offs[seg] + offs[seg + 1] - 1 - rows


def _reverse_ref(X, ctx):
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    return {"Y": X[_reverse_index(offs)]}


def _reverse_grad_ref(X, ctx, **kw):
    g = kw["Y@GRAD"]
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    if g.shape != X.shape:
        raise ShapeMismatch(f"Y@GRAD of shape {list(g.shape)}: expected {list(X.shape)}")
    return {"X@GRAD": g[_reverse_index(offs)].astype(X.dtype, copy=False)}


def _reverse_infer(X):
    check_dtype(X, NUMERIC, "input X")
    _rank_at_least(X, 1, "X")
    return {"Y": X}


register_op(
    "sequence_reverse", inputs=["X"], outputs=["Y"], attrs={},
    traits=TRAITS, infer_shape=_reverse_infer, reference=_reverse_ref,
    emit=Opaque(_lower.reverse),
    grad=lambda op: [GradOpSpec("sequence_reverse_grad",
                                {"X": op.input("X"), "Y@GRAD": _g(op.output("Y"))},
                                {"X@GRAD": _g(op.input("X"))})],
    out_lod=lambda lods, **_: {"Y": _need_lod(lods["X"], "X")},
    doc="The rows of each sequence of X (last LoD level) in reverse order; Y keeps X's LoD.")
register_op(
    "sequence_reverse_grad", inputs=["X", "Y@GRAD"], outputs=["X@GRAD"], attrs={},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_reverse_grad_ref,
    emit=Opaque(_lower.reverse_grad), grad=None, out_lod=lambda lods, **_: {"X@GRAD": lods["X"]})


# ---- lod_reset -------------------------------------------------------------------------------
def _lod_reset_infer(X, Y, *, target_lod, append):
    _rank_at_least(X, 1, "X")
    if Y is None and not target_lod:
        raise ShapeMismatch("lod_reset needs input Y or a non-empty target_lod: expected one, "
                            "got neither")
    if Y is not None and Y.lod_level > 0:
        level = Y.lod_level
    else:
        if Y is not None:
            check_dtype(Y, INDEX, "input Y (offsets)")
        level = X.lod_level + 1 if append else 1
    return {"Out": X.with_(lod_level=level)}


def _new_lod(x_lod, level0, append, rows) -> list:
    level0 = [int(v) for v in level0]
    if len(level0) < 1 or level0[0] != 0 or any(b < a for a, b in zip(level0, level0[1:])):
        raise ShapeMismatch(f"the new LoD level {level0}: expected offsets starting at 0 that "
                            f"never decrease")
    if level0[-1] != rows:
        raise ShapeMismatch(f"the new LoD level {level0} ends at {level0[-1]}: expected the "
                            f"number of rows of X, {rows}")
    if not append or not x_lod:
        return [level0]
    lod = [list(lv) for lv in x_lod[:-1]] + [list(x_lod[-1])]
    # appending: X's levels stay above; its last level must count the new level's sequences
    if lod[-1][-1] != len(level0) - 1:
        raise ShapeMismatch(f"append: X's LoD's last level ends at {lod[-1][-1]}: expected the "
                            f"number of sequences of the new level, {len(level0) - 1}")
    return lod + [level0]


def _lod_reset_lod(lods, *, target_lod, append):
    if "Y" in lods:
        if lods["Y"]:
            return {"Out": lods["Y"]}
        raise ValueDependentLoD("lod_reset takes the LoD from Y's values")
    rows = int(target_lod[-1]) if target_lod else 0
    return {"Out": _new_lod(lods["X"], target_lod, append, rows)}


def _lod_reset_ref(X, Y, *, target_lod, append, ctx):
    x_lod = _in_lod(ctx, "X")
    if Y is not None:
        y_lod = _in_lod(ctx, "Y")
        if y_lod:
            if y_lod[-1][-1] != X.shape[0]:
                raise ShapeMismatch(f"Y's LoD ends at {y_lod[-1][-1]}: expected the number of "
                                    f"rows of X, {X.shape[0]}")
            return {"Out": X.copy()}
        if Y.dtype not in INDEX or Y.ndim > 2 or (Y.ndim == 2 and Y.shape[0] != 1
                                                  and Y.shape[1] != 1):
            raise ShapeMismatch(f"Y (offsets) is {Y.dtype}{list(Y.shape)}: expected a 1-D "
                                f"int32/int64 tensor")
        level0 = Y.reshape(-1).tolist()
    elif target_lod:
        level0 = list(target_lod)
    else:
        raise ShapeMismatch("lod_reset needs input Y or a non-empty target_lod: expected one, "
                            "got neither")
    ctx.set_output_lod("Out", _new_lod(x_lod, level0, append, X.shape[0]))
    return {"Out": X.copy()}


def _lod_reset_grad_ref(X, **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape:
        raise ShapeMismatch(f"Out@GRAD of shape {list(g.shape)}: expected {list(X.shape)}")
    return {"X@GRAD": g.astype(X.dtype, copy=True)}


register_op(
    "lod_reset", inputs=["X", "Y?"], outputs=["Out"],
    attrs={"target_lod": Ints([], doc="level-0 offsets when Y is not given"),
           "append": Bool(False)},
    traits=TRAITS, infer_shape=_lod_reset_infer, reference=_lod_reset_ref,
    emit=Opaque(_lower.lod_reset),
    grad=lambda op: [GradOpSpec("lod_reset_grad",
                                {"X": op.input("X"), "Out@GRAD": _g(op.output("Out"))},
                                {"X@GRAD": _g(op.input("X"))})],
    out_lod=_lod_reset_lod,
    doc="X's data with a new LoD: Y's LoD, else Y's values as offsets, else target_lod; "
        "append keeps X's levels above the new one.")
register_op(
    "lod_reset_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD"], attrs={},
    traits=TRAITS, infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_lod_reset_grad_ref,
    emit=Opaque(_lower.lod_reset_grad), grad=None, out_lod=lambda lods, **_: {"X@GRAD": lods["X"]})


# ---- lstm / gru / sequence_conv: Fluid 1.x's LoD recurrent ops -------------------------------
RNN_ACTIVATIONS = ("sigmoid", "tanh", "relu", "identity")
_F32_64 = (np.dtype(np.float32), np.dtype(np.float64))


def _sigmoid(v):
    # PaddlePaddle's recurrent kernels clamp sigmoid's input to [-40, 13]
    return 1.0 / (1.0 + np.exp(-np.clip(v, -40.0, 13.0)))


_ACT = {"sigmoid": _sigmoid, "tanh": np.tanh, "relu": lambda v: np.maximum(v, 0.0),
        "identity": lambda v: v, "": lambda v: v}
_DACT = {"sigmoid": lambda y: y * (1.0 - y), "tanh": lambda y: 1.0 - y * y,
         "relu": lambda y: (y > 0).astype(y.dtype), "identity": np.ones_like,
         "": np.ones_like}


def _check_acts(**acts) -> None:
    for name, value in acts.items():
        if value not in _ACT:
            raise ShapeMismatch(f"attribute {name}={value!r}: expected one of "
                                f"{', '.join(RNN_ACTIVATIONS)}")


def _batch_order(offs: np.ndarray, reverse: bool):
    """PaddlePaddle's batch order of a LoD batch: ``(order, starts, rows)``. The sequences
    sorted by length, longest first (ties in order); time step ``t`` is the block
    ``starts[t]:starts[t + 1]`` of batch rows, one per sequence alive at ``t``; ``rows[i]`` is
    the row of the input batch row ``i`` holds (reversed sequences run from their end)."""
    lens = np.diff(offs)
    order = np.argsort(-lens, kind="stable")
    longest = int(lens.max()) if lens.size else 0
    alive = [order[lens[order] > t] for t in range(longest)]
    starts = np.cumsum([0] + [len(a) for a in alive]).astype(np.int64)
    pieces = [offs[a] + (lens[a] - 1 - t if reverse else t) for t, a in enumerate(alive)]
    rows = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)
    return order, starts, rows


def _dim_is(have, want) -> bool:
    return have == -1 or want == -1 or have == want


def _check_2d(meta: VarMeta, slot: str, shape, op: str, dtype=None) -> None:
    if dtype is not None and meta.dtype != dtype:
        raise ShapeMismatch(f"{op}: input {slot} is {meta.dtype}: expected {dtype} (the "
                            f"dtype of the data)")
    if meta.ndim != 2 or not all(_dim_is(h, w) for h, w in zip(meta.shape, shape)):
        raise ShapeMismatch(f"{op}: input {slot} of shape {list(meta.shape)}: expected "
                            f"{list(shape)}")


def _rnn_metas(Input: VarMeta, Weight: VarMeta, gates: int, op: str):
    check_dtype(Input, FLOATS, f"{op}: input Input")
    if Weight.dtype != Input.dtype:
        raise ShapeMismatch(f"{op}: Weight is {Weight.dtype}: expected Input's dtype "
                            f"{Input.dtype}")
    if Weight.ndim != 2:
        raise ShapeMismatch(f"{op}: input Weight of shape {list(Weight.shape)}: expected "
                            f"[H, {gates}H]")
    h = Weight.shape[0]
    _check_2d(Weight, "Weight", (h, gates * h if h != -1 else -1), op)
    _check_2d(Input, "Input", (-1, gates * h if h != -1 else -1), op)
    rows = Input.with_(shape=(Input.shape[0], h))
    return h, rows


def _rnn_arrays(op, Input, Weight, gates, offs_lod, **optional):
    """Checks the run-time shapes: H, and the offsets of Input's last LoD level."""
    h = Weight.shape[0] if Weight.ndim == 2 else -1
    if Weight.ndim != 2 or Weight.shape[1] != gates * h:
        raise ShapeMismatch(f"{op}: input Weight of shape {list(Weight.shape)}: expected "
                            f"[H, {gates}H]")
    if Input.ndim != 2 or Input.shape[1] != gates * h:
        raise ShapeMismatch(f"{op}: input Input of shape {list(Input.shape)}: expected "
                            f"[rows, {gates * h}] ({gates}H with H={h} from Weight)")
    offs = _offsets(offs_lod, "Input", Input.shape[0])
    for slot, (value, shape) in optional.items():
        if value is not None and value.shape != shape:
            raise ShapeMismatch(f"{op}: input {slot} of shape {list(value.shape)}: expected "
                                f"{list(shape)}")
    return h, offs


# ---- lstm --------------------------------------------------------------------------------------
def _lstm_infer(Input, Weight, Bias, H0=None, C0=None, *, use_peepholes, gate_activation,
                cell_activation, candidate_activation, **_):
    _check_acts(gate_activation=gate_activation, cell_activation=cell_activation,
                candidate_activation=candidate_activation)
    h, rows = _rnn_metas(Input, Weight, 4, "lstm")
    width = (7 if use_peepholes else 4) * h if h != -1 else -1
    _check_2d(Bias, "Bias", (1, width), "lstm", Input.dtype)
    if H0 is not None and C0 is None:
        raise ShapeMismatch("lstm: input H0 is given without C0: expected both or neither (as "
                            "Paddle's lstm)")
    for slot, v in (("H0", H0), ("C0", C0)):
        if v is not None:
            _check_2d(v, slot, (-1, h), "lstm", Input.dtype)
    lod = rows.with_(lod_level=Input.lod_level)
    batch = rows.with_(lod_level=0)
    return {"Hidden": lod, "Cell": lod,
            "BatchGate": batch.with_(shape=(Input.shape[0], Input.shape[1])),
            "BatchCellPreAct": batch}


def _lstm_arrays(Input, Weight, Bias, H0, C0, use_peepholes, ctx, op="lstm"):
    lod = _in_lod(ctx, "Input")
    n = len(lod[-1]) - 1 if lod else 0
    h = Weight.shape[0] if Weight.ndim == 2 else -1
    return _rnn_arrays(op, Input, Weight, 4, lod,
                       Bias=(Bias, (1, (7 if use_peepholes else 4) * h)),
                       H0=(H0, (n, h)), C0=(C0, (n, h)))


def _lstm_ref(Input, Weight, Bias, H0=None, C0=None, *, use_peepholes, is_reverse,
              gate_activation, cell_activation, candidate_activation, ctx, **_):
    h, offs = _lstm_arrays(Input, Weight, Bias, H0, C0, use_peepholes, ctx)
    act_g, act_c, act_a = _ACT[gate_activation], _ACT[cell_activation], _ACT[candidate_activation]
    order, starts, rows = _batch_order(offs, is_reverse)
    b = Bias.reshape(-1)
    gate = Input[rows] + b[:4 * h]
    cb = np.zeros((len(rows), h), Input.dtype)
    hb = np.zeros_like(cb)
    cact = np.zeros_like(cb)
    for t in range(len(starts) - 1):
        p, q = starts[t], starts[t + 1]
        m = q - p
        hp = hb[starts[t - 1]:starts[t - 1] + m] if t else (
            H0[order[:m]] if H0 is not None else None)
        cp = cb[starts[t - 1]:starts[t - 1] + m] if t else (
            C0[order[:m]] if C0 is not None else None)
        g = gate[p:q]
        if hp is not None:
            g += hp @ Weight
        gi, gf, go = g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:]
        if use_peepholes and cp is not None:
            gi = gi + cp * b[4 * h:5 * h]
            gf = gf + cp * b[5 * h:6 * h]
        a, i, f = act_a(g[:, :h]), act_g(gi), act_g(gf)
        c = a * i + (cp * f if cp is not None else 0.0)
        o = act_g(go + c * b[6 * h:] if use_peepholes else go)
        gate[p:q] = np.concatenate([a, i, f, o], axis=1)
        cb[p:q], cact[p:q] = c, act_c(c)
        hb[p:q] = o * cact[p:q]
    hidden, cell = np.empty_like(hb), np.empty_like(cb)
    hidden[rows], cell[rows] = hb, cb
    return {"Hidden": hidden, "Cell": cell, "BatchGate": gate.astype(Input.dtype),
            "BatchCellPreAct": cact}


def _lstm_grad_ref(Input, Weight, Bias, Hidden, Cell, BatchGate, BatchCellPreAct, H0=None,
                   C0=None, *, use_peepholes, is_reverse, gate_activation, cell_activation,
                   candidate_activation, ctx, **kw):
    h, offs = _lstm_arrays(Input, Weight, Bias, H0, C0, use_peepholes, ctx, "lstm_grad")
    rows_n = Input.shape[0]
    dh_in, dc_in = kw["Hidden@GRAD"], kw.get("Cell@GRAD")
    for slot, v, shape in (("Hidden", Hidden, (rows_n, h)), ("Cell", Cell, (rows_n, h)),
                           ("BatchGate", BatchGate, (rows_n, 4 * h)),
                           ("BatchCellPreAct", BatchCellPreAct, (rows_n, h)),
                           ("Hidden@GRAD", dh_in, (rows_n, h)), ("Cell@GRAD", dc_in, (rows_n, h))):
        if v is not None and v.shape != shape:
            raise ShapeMismatch(f"lstm_grad: input {slot} of shape {list(v.shape)}: expected "
                                f"{list(shape)}")
    dg_act, dc_act, da_act = (_DACT[gate_activation], _DACT[cell_activation],
                              _DACT[candidate_activation])
    order, starts, rows = _batch_order(offs, is_reverse)
    b = Bias.reshape(-1)
    dhb = dh_in[rows].astype(np.float64)
    dcb = dc_in[rows].astype(np.float64) if dc_in is not None else np.zeros_like(dhb)
    cb = Cell[rows]
    hb = Hidden[rows]
    dg = np.zeros((len(rows), 4 * h))
    hprev = np.zeros((len(rows), h))
    dpeep = np.zeros(3 * h)
    dh0 = np.zeros(H0.shape) if H0 is not None else None
    dc0 = np.zeros(C0.shape) if C0 is not None else None
    for t in range(len(starts) - 2, -1, -1):
        p, q = starts[t], starts[t + 1]
        m = q - p
        pp = starts[t - 1] if t else 0
        cp = cb[pp:pp + m] if t else (C0[order[:m]] if C0 is not None else None)
        g = BatchGate[p:q]
        a, i, f, o = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:]
        ac = BatchCellPreAct[p:q]
        dh = dhb[p:q]
        dgo = dh * ac * dg_act(o)
        dc = dcb[p:q] + dh * o * dc_act(ac)
        if use_peepholes:
            dc = dc + dgo * b[6 * h:]
            dpeep[2 * h:] += (dgo * cb[p:q]).sum(0)
        dgi = dc * a * dg_act(i)
        dg[p:q, :h] = dc * i * da_act(a)
        dg[p:q, h:2 * h] = dgi
        dg[p:q, 3 * h:] = dgo
        if cp is not None:
            dgf = dc * cp * dg_act(f)
            dg[p:q, 2 * h:3 * h] = dgf
            dcp = dc * f
            if use_peepholes:
                dcp = dcp + dgi * b[4 * h:5 * h] + dgf * b[5 * h:6 * h]
                dpeep[:h] += (dgi * cp).sum(0)
                dpeep[h:2 * h] += (dgf * cp).sum(0)
            if t:
                dcb[pp:pp + m] += dcp
            else:
                dc0[order[:m]] = dcp
        if t:
            dhb[pp:pp + m] += dg[p:q] @ Weight.T
            hprev[p:q] = hb[pp:pp + m]
        elif H0 is not None:
            dh0[order[:m]] = dg[p:q] @ Weight.T
            hprev[p:q] = H0[order[:m]]
    dx = np.empty((len(rows), 4 * h))
    dx[rows] = dg
    db = np.concatenate([dg.sum(0)] + ([dpeep] if use_peepholes else [])).reshape(Bias.shape)
    T = Input.dtype
    out = {"Input@GRAD": dx.astype(T), "Weight@GRAD": (hprev.T @ dg).astype(T),
           "Bias@GRAD": db.astype(T)}
    if H0 is not None:
        out["H0@GRAD"] = dh0.astype(T)
    if C0 is not None:
        out["C0@GRAD"] = dc0.astype(T)
    return out


def _lstm_grad_maker(op):
    ins = {s: op.input(s) for s in ("Input", "H0", "C0", "Weight", "Bias") if op.input(s)}
    ins.update({s: op.output(s) for s in ("Hidden", "Cell", "BatchGate", "BatchCellPreAct")})
    ins["Hidden@GRAD"] = _g(op.output("Hidden"))
    ins["Cell@GRAD"] = _g(op.output("Cell"))
    outs = {f"{s}@GRAD": _g(op.input(s)) for s in ("Input", "H0", "C0", "Weight", "Bias")
            if op.input(s)}
    return [GradOpSpec("lstm_grad", ins, outs, _copy_attrs(op, _LSTM_ATTRS))]


def _lstm_grad_infer(Input, Weight, Bias, H0=None, C0=None, **_):
    out = {"Input@GRAD": Input, "Weight@GRAD": Weight, "Bias@GRAD": Bias}
    if H0 is not None:
        out["H0@GRAD"] = H0
    if C0 is not None:
        out["C0@GRAD"] = C0
    return out


def _rnn_lod(lods, *, slots, grad=False, **_):
    lod = _need_lod(lods["Input"], "Input")
    if grad:
        return {"Input@GRAD": lod, "Weight@GRAD": [], "Bias@GRAD": [], "H0@GRAD": [],
                "C0@GRAD": []}
    return {s: (lod if s in ("Hidden", "Cell") else []) for s in slots}


_LSTM_ATTRS = {"use_peepholes": Bool(True), "is_reverse": Bool(False), "is_test": Bool(False),
               "gate_activation": Str("sigmoid", choices=RNN_ACTIVATIONS),
               "cell_activation": Str("tanh", choices=RNN_ACTIVATIONS),
               "candidate_activation": Str("tanh", choices=RNN_ACTIVATIONS)}
_LSTM_OUTS = ("Hidden", "Cell", "BatchGate", "BatchCellPreAct")
register_op(
    "lstm", inputs=["Input", "H0?", "C0?", "Weight", "Bias"],
    outputs=["Hidden", "Cell", "BatchGate~", "BatchCellPreAct~"], attrs=dict(_LSTM_ATTRS),
    traits=TRAITS, infer_shape=_lstm_infer, reference=_lstm_ref,
    emit=Opaque(), grad=_lstm_grad_maker,
    out_lod=lambda lods, **_: _rnn_lod(lods, slots=_LSTM_OUTS),
    doc="Fluid's dynamic LSTM over each sequence of Input ([rows, 4H], gates {c~, i, f, o} "
        "already projected): Hidden and Cell [rows, H], with peepholes (Bias [1, 7H]) or not "
        "([1, 4H]), optionally reversed and started from H0/C0 [sequences, H].")
register_op(
    "lstm_grad",
    inputs=["Input", "H0?", "C0?", "Weight", "Bias", "Hidden", "Cell", "BatchGate",
            "BatchCellPreAct", "Hidden@GRAD", "Cell@GRAD?"],
    outputs=["Input@GRAD?", "H0@GRAD?", "C0@GRAD?", "Weight@GRAD?", "Bias@GRAD?"],
    attrs=dict(_LSTM_ATTRS), traits=TRAITS, infer_shape=_lstm_grad_infer,
    reference=_lstm_grad_ref, emit=Opaque(), grad=None,
    out_lod=lambda lods, **_: _rnn_lod(lods, slots=(), grad=True))


# ---- gru ---------------------------------------------------------------------------------------
def _gru_infer(Input, Weight, H0=None, Bias=None, *, activation, gate_activation, **_):
    _check_acts(activation=activation, gate_activation=gate_activation)
    h, rows = _rnn_metas(Input, Weight, 3, "gru")
    if Bias is not None:
        _check_2d(Bias, "Bias", (1, 3 * h if h != -1 else -1), "gru", Input.dtype)
    if H0 is not None:
        _check_2d(H0, "H0", (-1, h), "gru", Input.dtype)
    batch = rows.with_(lod_level=0)
    return {"Hidden": rows.with_(lod_level=Input.lod_level),
            "BatchGate": batch.with_(shape=(Input.shape[0], Input.shape[1])),
            "BatchResetHiddenPrev": batch, "BatchHidden": batch}


def _gru_arrays(Input, Weight, H0, Bias, ctx, op="gru"):
    lod = _in_lod(ctx, "Input")
    n = len(lod[-1]) - 1 if lod else 0
    h = Weight.shape[0] if Weight.ndim == 2 else -1
    return _rnn_arrays(op, Input, Weight, 3, lod, Bias=(Bias, (1, 3 * h)), H0=(H0, (n, h)))


def _gru_split(Weight):
    h = Weight.shape[0]
    flat = Weight.reshape(-1)
    return flat[:2 * h * h].reshape(h, 2 * h), flat[2 * h * h:].reshape(h, h)


def _gru_ref(Input, Weight, H0=None, Bias=None, *, activation, gate_activation, is_reverse,
             origin_mode, ctx, **_):
    h, offs = _gru_arrays(Input, Weight, H0, Bias, ctx)
    act, act_g = _ACT[activation], _ACT[gate_activation]
    order, starts, rows = _batch_order(offs, is_reverse)
    wg, ws = _gru_split(Weight)
    gate = Input[rows] + (Bias.reshape(-1) if Bias is not None else 0)
    hb = np.zeros((len(rows), h), Input.dtype)
    rhp = np.zeros_like(hb)
    for t in range(len(starts) - 1):
        p, q = starts[t], starts[t + 1]
        m = q - p
        hp = hb[starts[t - 1]:starts[t - 1] + m] if t else (
            H0[order[:m]] if H0 is not None else np.zeros((m, h), Input.dtype))
        g = gate[p:q]
        g[:, :2 * h] = act_g(g[:, :2 * h] + hp @ wg)
        rhp[p:q] = g[:, h:2 * h] * hp
        g[:, 2 * h:] = act(g[:, 2 * h:] + rhp[p:q] @ ws)
        u, c = g[:, :h], g[:, 2 * h:]
        hb[p:q] = u * hp + (1 - u) * c if origin_mode else (1 - u) * hp + u * c
    hidden = np.empty_like(hb)
    hidden[rows] = hb
    return {"Hidden": hidden, "BatchGate": gate.astype(Input.dtype),
            "BatchResetHiddenPrev": rhp, "BatchHidden": hb}


def _gru_grad_ref(Input, Weight, BatchGate, BatchResetHiddenPrev, BatchHidden, H0=None,
                  Bias=None, *, activation, gate_activation, is_reverse, origin_mode, ctx, **kw):
    h, offs = _gru_arrays(Input, Weight, H0, Bias, ctx, "gru_grad")
    rows_n = Input.shape[0]
    dh_in = kw["Hidden@GRAD"]
    for slot, v, shape in (("BatchGate", BatchGate, (rows_n, 3 * h)),
                           ("BatchResetHiddenPrev", BatchResetHiddenPrev, (rows_n, h)),
                           ("BatchHidden", BatchHidden, (rows_n, h)),
                           ("Hidden@GRAD", dh_in, (rows_n, h))):
        if v.shape != shape:
            raise ShapeMismatch(f"gru_grad: input {slot} of shape {list(v.shape)}: expected "
                                f"{list(shape)}")
    dact, dact_g = _DACT[activation], _DACT[gate_activation]
    order, starts, rows = _batch_order(offs, is_reverse)
    wg, ws = _gru_split(Weight)
    dhb = dh_in[rows].astype(np.float64)
    dg = np.zeros((len(rows), 3 * h))
    hprev = np.zeros((len(rows), h))
    dh0 = np.zeros(H0.shape) if H0 is not None else None
    for t in range(len(starts) - 2, -1, -1):
        p, q = starts[t], starts[t + 1]
        m = q - p
        pp = starts[t - 1] if t else 0
        has_prev = t > 0 or H0 is not None
        hp = BatchHidden[pp:pp + m] if t else (
            H0[order[:m]] if H0 is not None else np.zeros((m, h)))
        g = BatchGate[p:q]
        u, r, c = g[:, :h], g[:, h:2 * h], g[:, 2 * h:]
        dh = dhb[p:q]
        if origin_mode:
            du, dc, dhp = dh * (hp - c), dh * (1 - u), dh * u
        else:
            du, dc, dhp = dh * (c - hp), dh * u, dh * (1 - u)
        dg[p:q, :h] = du * dact_g(u)
        dg[p:q, 2 * h:] = dc * dact(c)
        if not has_prev:
            continue
        drhp = dg[p:q, 2 * h:] @ ws.T
        dg[p:q, h:2 * h] = drhp * hp * dact_g(r)
        dhp = dhp + drhp * r + dg[p:q, :2 * h] @ wg.T
        hprev[p:q] = hp
        if t:
            dhb[pp:pp + m] += dhp
        else:
            dh0[order[:m]] = dhp
    dx = np.empty_like(dg)
    dx[rows] = dg
    dw = np.concatenate([(hprev.T @ dg[:, :2 * h]).reshape(-1),
                         (BatchResetHiddenPrev.T @ dg[:, 2 * h:]).reshape(-1)])
    T = Input.dtype
    out = {"Input@GRAD": dx.astype(T), "Weight@GRAD": dw.reshape(Weight.shape).astype(T)}
    if Bias is not None:
        out["Bias@GRAD"] = dg.sum(0).reshape(Bias.shape).astype(T)
    if H0 is not None:
        out["H0@GRAD"] = dh0.astype(T)
    return out


def _gru_grad_maker(op):
    ins = {s: op.input(s) for s in ("Input", "H0", "Weight", "Bias") if op.input(s)}
    ins.update({s: op.output(s) for s in _GRU_OUTS})
    ins["Hidden@GRAD"] = _g(op.output("Hidden"))
    outs = {f"{s}@GRAD": _g(op.input(s)) for s in ("Input", "H0", "Weight", "Bias")
            if op.input(s)}
    return [GradOpSpec("gru_grad", ins, outs, _copy_attrs(op, _GRU_ATTRS))]


def _gru_grad_infer(Input, Weight, H0=None, Bias=None, **_):
    out = {"Input@GRAD": Input, "Weight@GRAD": Weight}
    if Bias is not None:
        out["Bias@GRAD"] = Bias
    if H0 is not None:
        out["H0@GRAD"] = H0
    return out


_GRU_ATTRS = {"activation": Str("tanh", choices=RNN_ACTIVATIONS),
              "gate_activation": Str("sigmoid", choices=RNN_ACTIVATIONS),
              "is_reverse": Bool(False), "origin_mode": Bool(False), "is_test": Bool(False)}
_GRU_OUTS = ("Hidden", "BatchGate", "BatchResetHiddenPrev", "BatchHidden")
register_op(
    "gru", inputs=["Input", "H0?", "Weight", "Bias?"],
    outputs=["BatchGate~", "BatchResetHiddenPrev~", "BatchHidden~", "Hidden"],
    attrs=dict(_GRU_ATTRS), traits=TRAITS, infer_shape=_gru_infer, reference=_gru_ref,
    emit=Opaque(), grad=_gru_grad_maker,
    out_lod=lambda lods, **_: _rnn_lod(lods, slots=_GRU_OUTS),
    doc="Fluid's dynamic GRU over each sequence of Input ([rows, 3H], gates {u, r, c} already "
        "projected): Hidden [rows, H]; h = (1 - u) * h_prev + u * c, or u * h_prev + "
        "(1 - u) * c with origin_mode; Weight [H, 3H] holds the [H, 2H] update/reset weight "
        "then the [H, H] candidate weight.")
register_op(
    "gru_grad",
    inputs=["Input", "H0?", "Weight", "Bias?", "Hidden", "BatchGate", "BatchResetHiddenPrev",
            "BatchHidden", "Hidden@GRAD"],
    outputs=["Input@GRAD?", "H0@GRAD?", "Weight@GRAD?", "Bias@GRAD?"],
    attrs=dict(_GRU_ATTRS), traits=TRAITS, infer_shape=_gru_grad_infer,
    reference=_gru_grad_ref, emit=Opaque(), grad=None,
    out_lod=lambda lods, **_: _rnn_lod(lods, slots=(), grad=True))


# ---- sequence_conv -------------------------------------------------------------------------------
def _pads(context_start: int, context_length: int) -> tuple:
    """(rows of padding above, below) a sequence that the context windows reach."""
    return max(0, -context_start), max(0, context_start + context_length - 1)


def _conv_check(X, Filter, PaddingData, *, contextLength, contextStart, contextStride,
                paddingTrainable, op="sequence_conv", **_):
    if contextStride != 1:
        raise ShapeMismatch(f"{op}: contextStride={contextStride}: expected 1 (the only stride "
                            f"sequence_conv supports)")
    if contextLength < 1:
        raise ShapeMismatch(f"{op}: contextLength={contextLength}: expected >= 1")
    if X.ndim != 2:
        raise ShapeMismatch(f"{op}: input X of shape {list(X.shape)}: expected [rows, D]")
    d = X.shape[1]
    want = contextLength * d if d != -1 else -1
    if Filter.ndim != 2 or not _dim_is(Filter.shape[0], want):
        raise ShapeMismatch(f"{op}: input Filter of shape {list(Filter.shape)}: expected "
                            f"[contextLength * D, O] = [{want}, O]")
    if paddingTrainable:
        if PaddingData is None:
            raise ShapeMismatch(f"{op}: paddingTrainable=True needs input PaddingData: got "
                                f"none")
        up, down = _pads(contextStart, contextLength)
        if PaddingData.ndim != 2 or not (_dim_is(PaddingData.shape[0], up + down)
                                         and _dim_is(PaddingData.shape[1], d)):
            raise ShapeMismatch(f"{op}: input PaddingData of shape {list(PaddingData.shape)}: "
                                f"expected [{up + down}, {d}] (rows above and below the "
                                f"windows reach, D)")


def _conv_infer(X, Filter, PaddingData=None, **attrs):
    check_dtype(X, FLOATS, "sequence_conv: input X")
    if Filter.dtype != X.dtype:
        raise ShapeMismatch(f"sequence_conv: Filter is {Filter.dtype}: expected X's dtype "
                            f"{X.dtype}")
    if PaddingData is not None and PaddingData.dtype != X.dtype:
        raise ShapeMismatch(f"sequence_conv: PaddingData is {PaddingData.dtype}: expected X's "
                            f"dtype {X.dtype}")
    _conv_check(X, Filter, PaddingData, **attrs)
    return {"Out": X.with_(shape=(X.shape[0], Filter.shape[1]))}


def _conv_cols(X, offs, pad, length, start):
    """The context window of every row, side by side: [rows, length * D]."""
    rows, d = X.shape
    up, _ = _pads(start, length)
    cols = np.zeros((rows, length, d), X.dtype)
    seg = _seg_ids(offs)
    b, e = offs[seg], offs[seg + 1]
    t = np.arange(rows)
    for j in range(length):
        r = t + start + j
        inside = (r >= b) & (r < e)
        cols[inside, j] = X[r[inside]]
        if pad is not None:
            above, below = r < b, r >= e
            cols[above, j] = pad[(r - b + up)[above]]
            cols[below, j] = pad[(up + r - e)[below]]
    return cols


def _conv_ref(X, Filter, PaddingData=None, *, ctx, **attrs):
    _conv_check(X, Filter, PaddingData, **attrs)
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    pad = PaddingData if attrs["paddingTrainable"] else None
    cols = _conv_cols(X, offs, pad, attrs["contextLength"], attrs["contextStart"])
    return {"Out": (cols.reshape(X.shape[0], cols.shape[1] * cols.shape[2]) @ Filter)
            .astype(X.dtype)}


def _conv_grad_ref(X, Filter, PaddingData=None, *, ctx, **kw):
    attrs = {k: kw[k] for k in _CONV_ATTRS}
    _conv_check(X, Filter, PaddingData, op="sequence_conv_grad", **attrs)
    g = kw["Out@GRAD"]
    if g.shape != (X.shape[0], Filter.shape[1]):
        raise ShapeMismatch(f"sequence_conv_grad: Out@GRAD of shape {list(g.shape)}: expected "
                            f"{[X.shape[0], Filter.shape[1]]}")
    offs = _offsets(_in_lod(ctx, "X"), "X", X.shape[0])
    length, start = attrs["contextLength"], attrs["contextStart"]
    trained = attrs["paddingTrainable"]
    cols = _conv_cols(X, offs, PaddingData if trained else None, length, start)
    dcols = (g @ Filter.T).reshape(X.shape[0], length, X.shape[1])
    dx = np.zeros(X.shape)
    dpad = np.zeros(PaddingData.shape) if PaddingData is not None else None
    up, _ = _pads(start, length)
    seg = _seg_ids(offs)
    b, e = offs[seg], offs[seg + 1]
    t = np.arange(X.shape[0])
    for j in range(length):
        r = t + start + j
        inside = (r >= b) & (r < e)
        np.add.at(dx, r[inside], dcols[inside, j])
        if trained:
            above, below = r < b, r >= e
            np.add.at(dpad, (r - b + up)[above], dcols[above, j])
            np.add.at(dpad, (up + r - e)[below], dcols[below, j])
    out = {"X@GRAD": dx.astype(X.dtype),
           "Filter@GRAD": (cols.reshape(X.shape[0], length * X.shape[1]).T @ g)
           .astype(Filter.dtype)}
    if PaddingData is not None:
        out["PaddingData@GRAD"] = dpad.astype(PaddingData.dtype)
    return out


def _conv_grad_maker(op):
    ins = {s: op.input(s) for s in ("X", "Filter", "PaddingData") if op.input(s)}
    ins["Out@GRAD"] = _g(op.output("Out"))
    outs = {"X@GRAD": _g(op.input("X")), "Filter@GRAD": _g(op.input("Filter"))}
    if op.input("PaddingData") and op.attr("paddingTrainable"):
        outs["PaddingData@GRAD"] = _g(op.input("PaddingData"))
    return [GradOpSpec("sequence_conv_grad", ins, outs, _copy_attrs(op, _CONV_ATTRS))]


def _conv_grad_infer(X, Filter, PaddingData=None, **_):
    out = {"X@GRAD": X, "Filter@GRAD": Filter}
    if PaddingData is not None:
        out["PaddingData@GRAD"] = PaddingData
    return out


_CONV_ATTRS = {"contextLength": Int(REQUIRED, choices=(1, 2, 3)),
               "contextStart": Int(0, choices=(-2, -1, 0, 1)),
               "contextStride": Int(1, choices=(1,)),
               "paddingTrainable": Bool(False)}
register_op(
    "sequence_conv", inputs=["X", "PaddingData?", "Filter"], outputs=["Out"],
    attrs=dict(_CONV_ATTRS), traits=TRAITS, infer_shape=_conv_infer, reference=_conv_ref,
    emit=Opaque(), grad=_conv_grad_maker,
    out_lod=lambda lods, **_: {"Out": _need_lod(lods["X"], "X")},
    doc="Out[t] = the contextLength rows t + contextStart... of t's sequence, side by side, "
        "times Filter [contextLength * D, O]; rows outside the sequence are zeros, or rows of "
        "PaddingData (those above first) with paddingTrainable.")
register_op(
    "sequence_conv_grad", inputs=["X", "PaddingData?", "Filter", "Out@GRAD"],
    outputs=["X@GRAD?", "PaddingData@GRAD?", "Filter@GRAD?"], attrs=dict(_CONV_ATTRS),
    traits=TRAITS, infer_shape=_conv_grad_infer, reference=_conv_grad_ref,
    emit=Opaque(), grad=None,
    out_lod=lambda lods, **_: {"X@GRAD": lods["X"], "Filter@GRAD": [],
                               "PaddingData@GRAD": []})
