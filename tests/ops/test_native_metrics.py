"""cross_entropy2 (and its gradient), top_k / top_k_v2 and accuracy run natively: against
NumPy written here (ties, the smallest, zero probabilities, ignored labels)."""
import numpy as np
import pytest

from pdjit.framework.errors import FallbackWarning
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import build_op_program, check_output, run_op

RNG = np.random.default_rng(11)


def _np_topk(x, k, largest):
    """Stable order: among equal values the lower index first."""
    keys = -x if largest else x
    idx = np.argsort(keys, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, idx, axis=-1), idx.astype(np.int64)


@pytest.mark.parametrize("largest", [True, False])
def test_top_k_v2_with_ties(largest):
    x = RNG.integers(0, 4, size=(3, 2, 7)).astype(np.float32)  # many ties
    out, idx = _np_topk(x, 3, largest)
    check_output("top_k_v2", {"X": x}, {"k": 3, "largest": largest},
                 {"Out": out, "Indices": idx}, batch_unknown=True)
    xi = RNG.integers(-5, 5, size=(4, 6)).astype(np.int64)
    out, idx = _np_topk(xi, 2, largest)
    check_output("top_k_v2", {"X": xi}, {"k": 2, "largest": largest},
                 {"Out": out, "Indices": idx})


def test_top_k_with_a_nan_falls_back_to_the_reference():
    """A NaN makes the native selection give up: the step runs the reference (which orders
    NaN as its sort does), visibly."""
    x = np.array([[1.0, np.nan, 3.0]], np.float32)
    want = run_op("top_k", {"X": x}, {"k": 2}, mode="reference")
    prog, feed, outs = build_op_program("top_k", {"X": x}, {"k": 2})
    exe = Executor(mode="compiled", strict=False)
    with pytest.warns(FallbackWarning):
        got = exe.run(prog, feed=feed, fetch_list=outs["Out"] + outs["Indices"],
                      scope=Scope())
    np.testing.assert_array_equal(got[1], want["Indices"])
    np.testing.assert_array_equal(got[0], want["Out"])


def test_cross_entropy2_and_its_gradient():
    p = RNG.uniform(0.1, 1.0, size=(4, 5))
    p /= p.sum(-1, keepdims=True)
    p[1, 2] = 0.0
    lab = np.array([[0], [2], [-100], [4]], np.int64)  # a zero probability, an ignored row
    picked = np.array([p[0, 0], p[1, 2], 0.0, p[3, 4]])[:, None]
    y = np.where(lab == -100, 0.0, -np.log(np.where(picked > 0, picked, 1.0)))
    y[1, 0] = 1e20
    check_output("cross_entropy2", {"X": p, "Label": lab}, {},
                 {"Y": y, "MatchX": picked}, batch_unknown=True)
    q = p.copy()
    q[1, 2] = 0.3
    check_grad("cross_entropy2", {"X": q, "Label": lab}, {}, ["X"], "Y")


def test_accuracy_counts_rows_whose_label_is_in_the_top_k():
    idx = np.array([[1, 3], [0, 2], [4, 1]], np.int64)
    lab = np.array([[3], [1], [4]], np.int64)
    check_output("accuracy", {"Out": np.zeros((3, 2), np.float32), "Indices": idx,
                              "Label": lab},
                 {}, {"Accuracy": np.asarray(2 / 3, np.float32),
                      "Correct": np.asarray(2, np.int32), "Total": np.asarray(3, np.int32)})
