"""Gradients of ``scatter_nd_add`` and ``strided_slice`` (``pdjit.ops.manip``) by finite
differences, and their outputs against NumPy indexing written here."""
import numpy as np

from pdjit.testing import check_output
from pdjit.testing.grad_check import check_grad

RNG = np.random.default_rng(17)


def test_scatter_nd_add_output_and_grad():
    x = RNG.normal(size=(3, 2, 2))
    idx = np.array([[[0, 1], [2, 0]], [[0, 1], [1, 1]]], np.int64)      # [2, 2, k=2]
    upd = RNG.normal(size=(2, 2, 2))
    want = x.copy()
    for i in range(2):
        for j in range(2):
            want[idx[i, j, 0], idx[i, j, 1]] += upd[i, j]
    ins = {"X": x, "Index": idx, "Updates": upd}
    check_output("scatter_nd_add", ins, expected={"Out": want})
    check_grad("scatter_nd_add", ins, inputs_to_check=("X", "Updates"))


def test_strided_slice_output_and_grad():
    x = RNG.normal(size=(4, 5))
    attrs = {"axes": [0, 1], "starts": [3, 0], "ends": [-5, 5], "strides": [-2, 2]}
    check_output("strided_slice", {"Input": x}, attrs, {"Out": x[3:-5:-2, 0:5:2]})
    check_grad("strided_slice", {"Input": x}, attrs, inputs_to_check=("Input",))
    dec = dict(attrs, decrease_axis=[0], starts=[1, 0], ends=[2, 5], strides=[1, 2])
    check_output("strided_slice", {"Input": x}, dec, {"Out": x[1, 0:5:2]})
