"""Metric ops: ``auc`` (Paddle's legacy streaming AUC op).

``auc`` keeps histograms of the positive-class probability, one for positive labels (``label >
0``) and one for negative labels (``label == 0``; other labels are not counted), over
``num_thresholds + 1`` buckets: a probability ``p`` falls in bucket ``int(p * num_thresholds)``,
computed in the input's precision as Paddle's CPU kernel does. The positive-class probability
is the last column of ``Predict`` (``[N, 2]``: column 1; ``[N, 1]``: column 0) and must lie in
``[0, 1]``.

Two layouts of the statistics, chosen by ``slide_steps``:

- ``slide_steps == 0`` (the global AUC): ``StatPos``/``StatNeg`` hold at least
  ``num_thresholds + 1`` counts (the layer makes them ``[1, num_thresholds + 1]``) that every
  batch adds to.
- ``slide_steps = s > 0`` (the AUC of the last ``s`` batches): ``(s + 1) * (num_thresholds + 1)
  + 1`` counts: ``s`` per-batch histograms (a ring), their sum, and the number of batches seen
  (the last element, which picks the ring slot the next batch overwrites).

``AUC`` (a 0-d float64) is the area under the ROC curve of the summed histogram, by the
trapezoid rule from the highest bucket down, divided by ``positives * negatives`` (left as the
raw area when either is zero). ``curve`` is recorded (``"ROC"`` or ``"PR"``) but, as in Paddle's
CPU kernel, the ROC area is what is computed. ``InsTagWeight`` (optional; the layer never sets
it, as Paddle's legacy layer does not): a first value of 0 marks the batch as padding, which
adds nothing to the histograms (with ``slide_steps > 0`` the window still moves on by one
batch). Paddle's kernel leaves the AUC output unwritten for such a batch with
``slide_steps == 0``; here it is the AUC of the unchanged statistics.

The op updates its statistics in place (``StatPosOut`` is the ``StatPos`` variable in programs
the layer builds). It has no lowering: compiled plans run its reference as a step of its own (a
few thousand integer counts per batch; a native kernel would not be measurably faster).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import OPAQUE, Int, Str, VarMeta, register_op
from pdjit.ops._common import FLOATS, INDEX, check_dtype

_CURVES = ("ROC", "PR")
_I64 = np.dtype(np.int64)


def _stat_size(num_thresholds: int, slide_steps: int) -> int:
    buckets = num_thresholds + 1
    return buckets if slide_steps == 0 else (slide_steps + 1) * buckets + 1


def _check_attrs(curve, num_thresholds, slide_steps) -> None:
    if curve not in _CURVES:
        raise ShapeMismatch(f"curve must be one of {list(_CURVES)}, got {curve!r}")
    if num_thresholds < 1:
        raise ShapeMismatch(f"num_thresholds must be >= 1, got {num_thresholds}")
    if slide_steps < 0:
        raise ShapeMismatch(f"slide_steps must be >= 0, got {slide_steps}")


def _known_size(shape) -> int | None:
    return None if any(d < 0 for d in shape) else int(np.prod(shape, dtype=np.int64))


def _auc_infer(Predict: VarMeta, Label: VarMeta, StatPos: VarMeta, StatNeg: VarMeta,
               InsTagWeight=None, *, curve, num_thresholds, slide_steps):
    _check_attrs(curve, num_thresholds, slide_steps)
    check_dtype(Predict, FLOATS, "Predict")
    check_dtype(Label, INDEX, "Label")
    if Predict.ndim != 2 or Predict.shape[1] not in (1, 2, -1):
        raise ShapeMismatch(f"Predict must be [N, 2] or [N, 1] (binary classification), got "
                            f"{list(Predict.shape)}")
    if Label.ndim not in (1, 2) or (Label.ndim == 2 and Label.shape[1] not in (1, -1)):
        raise ShapeMismatch(f"Label must be [N, 1] or [N], got {list(Label.shape)}")
    n, m = Predict.shape[0], Label.shape[0]
    if n >= 0 and m >= 0 and n != m:
        raise ShapeMismatch(f"Label must have one row per row of Predict: expected {n} rows, "
                            f"got {m}")
    want = _stat_size(num_thresholds, slide_steps)
    for slot, meta in (("StatPos", StatPos), ("StatNeg", StatNeg)):
        check_dtype(meta, (_I64,), slot)
        size = _known_size(meta.shape)
        if size is not None and (size != want if slide_steps else size < want):
            raise ShapeMismatch(
                f"{slot} must hold {want} counts for num_thresholds={num_thresholds}, "
                f"slide_steps={slide_steps}, got shape {list(meta.shape)}")
    if InsTagWeight is not None:
        check_dtype(InsTagWeight, FLOATS, "InsTagWeight")
    return {"AUC": Predict.with_(shape=(), dtype=np.dtype(np.float64), lod_level=0),
            "StatPosOut": StatPos.with_(lod_level=0), "StatNegOut": StatNeg.with_(lod_level=0)}


def roc_area(pos: np.ndarray, neg: np.ndarray) -> float:
    """The trapezoid area under the ROC curve of bucket histograms, from the highest bucket
    down, normalised by positives * negatives when both are non-zero."""
    tp = np.concatenate([[0.0], np.cumsum(pos[::-1], dtype=np.float64)])
    fp = np.concatenate([[0.0], np.cumsum(neg[::-1], dtype=np.float64)])
    area = float(np.sum(np.abs(np.diff(fp)) * (tp[1:] + tp[:-1]) / 2.0))
    if tp[-1] > 0 and fp[-1] > 0:
        area = area / tp[-1] / fp[-1]
    return area


def _auc_ref(Predict, Label, StatPos, StatNeg, InsTagWeight=None, *, curve, num_thresholds,
             slide_steps):
    _check_attrs(curve, num_thresholds, slide_steps)
    buckets = num_thresholds + 1
    if Predict.ndim != 2 or Predict.shape[1] not in (1, 2):
        raise ShapeMismatch(f"Predict must be [N, 2] or [N, 1], got {list(Predict.shape)}")
    p = Predict[:, -1]
    labels = Label.reshape(-1).astype(np.int64)
    if labels.size != p.size:
        raise ShapeMismatch(f"Label must have one value per row of Predict: expected {p.size}, "
                            f"got {labels.size} (shape {list(Label.shape)})")
    bad = ~((p >= 0) & (p <= 1))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"Predict must hold probabilities in [0, 1]: row {i} has {p[i]!r}")
    want = _stat_size(num_thresholds, slide_steps)
    stats = []
    for slot, s in (("StatPos", StatPos), ("StatNeg", StatNeg)):
        if (s.size != want) if slide_steps else (s.size < want):
            raise ShapeMismatch(f"{slot} must hold {want} counts for num_thresholds="
                                f"{num_thresholds}, slide_steps={slide_steps}, got shape "
                                f"{list(s.shape)}")
        stats.append(s.reshape(-1).astype(np.int64, copy=True))
    pos, neg = stats
    fake = InsTagWeight is not None and InsTagWeight.size > 0 and \
        float(InsTagWeight.reshape(-1)[0]) == 0.0
    # the bucket in the input's precision: float32 * float32 for float32 probabilities
    bins = (p * p.dtype.type(num_thresholds)).astype(np.int64)
    batch_pos = np.bincount(bins[labels > 0], minlength=buckets).astype(np.int64)
    batch_neg = np.bincount(bins[labels == 0], minlength=buckets).astype(np.int64)
    if fake:
        batch_pos[:] = 0
        batch_neg[:] = 0
    if slide_steps == 0:
        pos[:buckets] += batch_pos
        neg[:buckets] += batch_neg
        total = slice(0, buckets)
    else:
        seen = slide_steps * buckets + buckets  # the batch counter's index
        cur = slice((int(pos[seen]) % slide_steps) * buckets,
                    (int(pos[seen]) % slide_steps + 1) * buckets)
        total = slice(slide_steps * buckets, seen)
        for stat, batch in ((pos, batch_pos), (neg, batch_neg)):
            stat[total] -= stat[cur]  # the oldest batch leaves the window
            stat[cur] = batch
            stat[total] += batch
    auc = roc_area(pos[total], neg[total])
    if slide_steps:
        pos[seen] += 1
        neg[seen] += 1
    return {"AUC": np.asarray(auc, np.float64), "StatPosOut": pos.reshape(StatPos.shape),
            "StatNegOut": neg.reshape(StatNeg.shape)}


register_op(
    "auc", inputs=["Predict", "Label", "StatPos", "StatNeg", "InsTagWeight?"],
    outputs=["AUC", "StatPosOut", "StatNegOut"],
    attrs={"curve": Str("ROC", choices=_CURVES, one_of=_CURVES),
           "num_thresholds": Int((2 << 12) - 1, low=1, high=64, at_least=1),
           "slide_steps": Int(1, low=0, high=3, at_least=0)},
    traits=[OPAQUE], infer_shape=_auc_infer, reference=_auc_ref, emit=None, grad=None,
    doc="Streaming area under the ROC curve from bucketed positive/negative histograms.")
