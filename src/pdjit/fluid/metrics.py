"""Fluid's host-side metrics: ``Accuracy``, ``Precision``, ``Recall``, ``Auc``,
``ChunkEvaluator``, ``EditDistance``, ``CompositeMetric``.

They run in Python on the NumPy values a program fetched, accumulating over mini-batches as
Fluid 1.x's ``fluid.metrics`` do: ``update(...)`` adds a batch, ``eval()`` gives the metric so
far, ``reset()`` starts over. A metric's state is its public attributes (``get_config()`` shows
them). ``Auc`` here is the host-side one; the ``auc`` layer (``fluid.layers.auc``) computes the
same statistics inside a program.
"""
from __future__ import annotations

import copy
import numbers

import numpy as np

__all__ = ["MetricBase", "CompositeMetric", "Precision", "Recall", "Accuracy",
           "ChunkEvaluator", "EditDistance", "Auc"]


def _is_number(x) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool) or \
        (isinstance(x, np.ndarray) and x.size == 1 and x.dtype.kind in "iuf") or \
        isinstance(x, (np.integer, np.floating))


def _is_number_or_array(x) -> bool:
    return _is_number(x) or isinstance(x, np.ndarray)


def _need_array(metric: str, arg: str, value) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{metric}.update: {arg!r} must be a numpy ndarray, got "
                         f"{type(value).__name__}")
    return value


def _same_rows(metric: str, preds: np.ndarray, labels: np.ndarray) -> None:
    n, m = (preds.shape[0] if preds.ndim else 1), (labels.shape[0] if labels.ndim else 1)
    if n != m:
        raise ValueError(f"{metric}.update: preds and labels must have one row per sample: "
                         f"got {n} rows of preds (shape {list(preds.shape)}) and {m} of labels "
                         f"(shape {list(labels.shape)})")


class MetricBase:
    """The base of the metrics: a name, and state in public attributes that ``reset()``
    zeroes (ints to 0, floats to 0.0, arrays to zeros of their shape, anything else to None).
    Subclasses implement ``update`` and ``eval``."""

    def __init__(self, name=None):
        self._name = str(name) if name is not None else self.__class__.__name__

    def __str__(self) -> str:
        return self._name

    def _states(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def reset(self) -> None:
        for attr, value in self._states().items():
            if isinstance(value, (bool, np.bool_)):
                setattr(self, attr, False)
            elif isinstance(value, (int, np.integer)):
                setattr(self, attr, 0)
            elif isinstance(value, (float, np.floating)):
                setattr(self, attr, 0.0)
            elif isinstance(value, np.ndarray):
                setattr(self, attr, np.zeros_like(value))
            else:
                setattr(self, attr, None)

    def get_config(self) -> dict:
        return {"name": self._name, "states": copy.deepcopy(self._states())}

    def update(self, preds, labels):
        raise NotImplementedError(f"{type(self).__name__} does not implement update()")

    def eval(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement eval()")


class CompositeMetric(MetricBase):
    """Several metrics updated with the same ``(preds, labels)``; ``eval()`` gives their
    results in the order they were added."""

    def __init__(self, name=None):
        super().__init__(name)
        self._metrics = []

    def add_metric(self, metric) -> None:
        if not isinstance(metric, MetricBase):
            raise ValueError(f"CompositeMetric.add_metric: expected a MetricBase, got "
                             f"{type(metric).__name__}")
        self._metrics.append(metric)

    def update(self, preds, labels) -> None:
        for m in self._metrics:
            m.update(preds, labels)

    def reset(self) -> None:
        for m in self._metrics:
            m.reset()

    def eval(self) -> list:
        return [m.eval() for m in self._metrics]


def _binary(metric: str, preds, labels):
    preds = _need_array(metric, "preds", preds)
    labels = _need_array(metric, "labels", labels)
    _same_rows(metric, preds, labels)
    p = np.rint(preds).astype(np.int32).reshape(preds.shape[0] if preds.ndim else 1, -1)
    lab = labels.reshape(labels.shape[0] if labels.ndim else 1, -1)
    if p.shape[1] != 1 or lab.shape[1] != 1:
        raise ValueError(f"{metric}.update: expected one prediction and one label per sample "
                         f"(shape [N] or [N, 1]), got preds {list(preds.shape)} and labels "
                         f"{list(labels.shape)}")
    return p[:, 0], lab[:, 0]


class Precision(MetricBase):
    """Binary precision ``tp / (tp + fp)``: ``preds`` are probabilities of class 1 (rounded to
    the nearest integer; 1 is a positive prediction), ``labels`` 0/1; shape ``[N, 1]`` or
    ``[N]``. 0.0 before any positive prediction."""

    def __init__(self, name=None):
        super().__init__(name)
        self.tp = 0
        self.fp = 0

    def update(self, preds, labels) -> None:
        p, lab = _binary("Precision", preds, labels)
        positive = p == 1
        self.tp += int(np.sum(positive & (lab == 1)))
        self.fp += int(np.sum(positive & (lab != 1)))

    def eval(self) -> float:
        predicted = self.tp + self.fp
        return float(self.tp) / predicted if predicted else 0.0


class Recall(MetricBase):
    """Binary recall ``tp / (tp + fn)`` over the samples labelled 1 (``preds`` rounded as in
    :class:`Precision`). 0.0 before any sample labelled 1."""

    def __init__(self, name=None):
        super().__init__(name)
        self.tp = 0
        self.fn = 0

    def update(self, preds, labels) -> None:
        p, lab = _binary("Recall", preds, labels)
        actual = lab == 1
        self.tp += int(np.sum(actual & (p == 1)))
        self.fn += int(np.sum(actual & (p != 1)))

    def eval(self) -> float:
        actual = self.tp + self.fn
        return float(self.tp) / actual if actual else 0.0


class Accuracy(MetricBase):
    """A weighted mean of per-batch accuracies: ``update(value, weight)`` with a batch's
    accuracy (``layers.accuracy``'s output) and its weight (usually the batch size)."""

    def __init__(self, name=None):
        super().__init__(name)
        self.value = 0.0
        self.weight = 0.0

    def update(self, value, weight) -> None:
        if not _is_number_or_array(value):
            raise ValueError(f"Accuracy.update: 'value' must be a number or a numpy ndarray, "
                             f"got {type(value).__name__}")
        if not _is_number(weight):
            raise ValueError(f"Accuracy.update: 'weight' must be a number, got "
                             f"{type(weight).__name__}")
        weight = float(np.asarray(weight).reshape(-1)[0])
        if weight < 0:
            raise ValueError(f"Accuracy.update: 'weight' can not be negative, got {weight}")
        value = np.asarray(value, np.float64)  # a fetched float32 accuracy: sum in float64
        self.value += (float(value) if value.ndim == 0 else value) * weight
        self.weight += weight

    def eval(self):
        if self.weight == 0:
            raise ValueError("Accuracy.eval: no data yet (update() was never called with a "
                             "non-zero weight: add the outputs of layers.accuracy to it)")
        return self.value / self.weight


class ChunkEvaluator(MetricBase):
    """Precision, recall and F1 of chunk detection from counts accumulated over batches
    (``layers.chunk_eval``'s ``num_infer_chunks``, ``num_label_chunks``,
    ``num_correct_chunks``). ``eval()`` gives ``(precision, recall, f1)``; each is 0 where its
    denominator is."""

    def __init__(self, name=None):
        super().__init__(name)
        self.num_infer_chunks = 0
        self.num_label_chunks = 0
        self.num_correct_chunks = 0

    def update(self, num_infer_chunks, num_label_chunks, num_correct_chunks) -> None:
        counts = {"num_infer_chunks": num_infer_chunks, "num_label_chunks": num_label_chunks,
                  "num_correct_chunks": num_correct_chunks}
        for arg, value in counts.items():
            if not _is_number_or_array(value):
                raise ValueError(f"ChunkEvaluator.update: {arg!r} must be a number or a numpy "
                                 f"ndarray, got {type(value).__name__}")
            if np.any(np.asarray(value) < 0):
                raise ValueError(f"ChunkEvaluator.update: {arg!r} can not be negative, got "
                                 f"{value!r}")
        total = lambda v: int(np.sum(v))  # noqa: E731  (a [1] array from chunk_eval, or an int)
        self.num_infer_chunks += total(num_infer_chunks)
        self.num_label_chunks += total(num_label_chunks)
        self.num_correct_chunks += total(num_correct_chunks)

    def eval(self):
        precision = float(self.num_correct_chunks) / self.num_infer_chunks \
            if self.num_infer_chunks else 0.0
        recall = float(self.num_correct_chunks) / self.num_label_chunks \
            if self.num_label_chunks else 0.0
        f1 = 2 * precision * recall / (precision + recall) if self.num_correct_chunks else 0.0
        return precision, recall, f1


class EditDistance(MetricBase):
    """The mean edit distance per sequence and the fraction of sequences with a non-zero
    distance, from ``layers.edit_distance``'s outputs: ``update(distances, seq_num)`` with the
    batch's per-sequence distances and its number of sequences. ``eval()`` gives
    ``(avg_distance, avg_instance_error)``."""

    def __init__(self, name=None):
        super().__init__(name)
        self.total_distance = 0.0
        self.seq_num = 0
        self.instance_error = 0

    def update(self, distances, seq_num) -> None:
        distances = _need_array("EditDistance", "distances", distances)
        if not _is_number(seq_num):
            raise ValueError(f"EditDistance.update: 'seq_num' must be a number, got "
                             f"{type(seq_num).__name__}")
        seq_num = int(np.asarray(seq_num).reshape(-1)[0])
        if distances.size != seq_num:
            raise ValueError(f"EditDistance.update: expected one distance per sequence: "
                             f"seq_num={seq_num}, got {distances.size} distances")
        right = int(np.sum(distances == 0))
        self.seq_num += seq_num
        self.instance_error += seq_num - right
        self.total_distance += float(np.sum(distances))

    def eval(self):
        if self.seq_num == 0:
            raise ValueError("EditDistance.eval: no data yet (update() was never called with "
                             "sequences: add the outputs of layers.edit_distance to it)")
        return self.total_distance / self.seq_num, self.instance_error / float(self.seq_num)


class Auc(MetricBase):
    """The area under the ROC curve, from histograms of the positive-class probability
    (``preds[:, 1]`` of ``[N, 2]`` softmax outputs; ``[N, 1]``: column 0) over
    ``num_thresholds + 1`` buckets, as the ``auc`` op computes it. A non-zero label is
    positive. 0.0 until both classes were seen."""

    def __init__(self, name=None, curve="ROC", num_thresholds=4095):
        super().__init__(name)
        if curve not in ("ROC", "PR"):
            raise ValueError(f"Auc: curve must be 'ROC' or 'PR', got {curve!r}")
        if int(num_thresholds) < 1:
            raise ValueError(f"Auc: num_thresholds must be >= 1, got {num_thresholds}")
        self._curve = curve
        self._num_thresholds = int(num_thresholds)
        self._stat_pos = np.zeros(self._num_thresholds + 1, np.int64)
        self._stat_neg = np.zeros(self._num_thresholds + 1, np.int64)

    def reset(self) -> None:
        super().reset()
        self._stat_pos[:] = 0
        self._stat_neg[:] = 0

    def get_config(self) -> dict:
        config = super().get_config()
        config["states"].update(stat_pos=self._stat_pos.copy(), stat_neg=self._stat_neg.copy())
        return config

    def update(self, preds, labels) -> None:
        preds = _need_array("Auc", "preds", preds)
        labels = _need_array("Auc", "labels", labels)
        _same_rows("Auc", preds, labels)
        if preds.ndim != 2 or preds.shape[1] not in (1, 2):
            raise ValueError(f"Auc.update: preds must be [N, 2] (or [N, 1]) probabilities, got "
                             f"shape {list(preds.shape)}")
        p = preds[:, -1].astype(np.float64)
        bad = ~((p >= 0) & (p <= 1))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"Auc.update: preds must be probabilities in [0, 1]: row {i} has "
                             f"{p[i]!r}")
        lab = labels.reshape(labels.shape[0], -1)[:, 0] if labels.ndim else labels.reshape(1)
        bins = (p * self._num_thresholds).astype(np.int64)
        n = self._num_thresholds + 1
        self._stat_pos += np.bincount(bins[lab != 0], minlength=n)
        self._stat_neg += np.bincount(bins[lab == 0], minlength=n)

    def eval(self) -> float:
        tp = np.concatenate([[0.0], np.cumsum(self._stat_pos[::-1], dtype=np.float64)])
        fp = np.concatenate([[0.0], np.cumsum(self._stat_neg[::-1], dtype=np.float64)])
        area = float(np.sum(np.diff(fp) * (tp[1:] + tp[:-1]) / 2.0))
        return float(area / tp[-1] / fp[-1]) if tp[-1] > 0 and fp[-1] > 0 else 0.0
