"""Constants, copies and random initialisers against NumPy formulas and statistics."""
import math

import numpy as np
import pytest
from scipy import stats

from pdjit.framework import dtypes
from pdjit.framework import random as prandom
from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.testing import build_op_program, check_output, run_op


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_fill_constant(dtype):
    code = dtypes.to_code(dtype)
    check_output("fill_constant", {}, {"shape": [2, 3], "dtype": code, "value": 1.0},
                 {"Out": np.ones((2, 3), dtype)})
    check_output("fill_constant", {}, {"shape": [], "dtype": code, "value": 0.0},
                 {"Out": np.zeros((), dtype)})


def test_fill_constant_str_value_is_exact():
    big = 2 ** 40 + 3  # not representable in float32
    check_output("fill_constant", {}, {"shape": [1], "dtype": 3, "value": 0.0,
                                       "str_value": str(big)}, {"Out": np.array([big])})


def test_fill_constant_shape_tensor():
    check_output("fill_constant", {"ShapeTensor": np.array([2, 2], np.int64)},
                 {"dtype": 5, "value": 3.0}, {"Out": np.full((2, 2), 3.0, np.float32)})
    check_output("fill_constant", {"ValueTensor": np.array([7.0], np.float32)},
                 {"shape": [3], "dtype": 5}, {"Out": np.full(3, 7.0, np.float32)})


def test_fill_constant_batch_size_like():
    x = np.zeros((5, 2), np.float32)
    check_output("fill_constant_batch_size_like", {"Input": x},
                 {"shape": [-1, 3], "dtype": 3, "value": 4.0}, {"Out": np.full((5, 3), 4)},
                 batch_unknown=True)
    check_output("fill_constant_batch_size_like", {"Input": x},
                 {"shape": [3, -1], "input_dim_idx": 1, "output_dim_idx": 1, "dtype": 5},
                 {"Out": np.zeros((3, 2), np.float32)})
    with pytest.raises(OpShapeError, match="input_dim_idx=4 is out of range"):
        build_op_program("fill_constant_batch_size_like", {"Input": x},
                         {"shape": [-1, 3], "input_dim_idx": 4})


def test_assign_copies():
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    out = check_output("assign", {"X": x}, {}, {"Out": x}, batch_unknown=True)["Out"]
    assert out is not x


@pytest.mark.parametrize("arr", [np.array([[1.5, -2.0], [3.25, 0.0]], np.float32),
                                 np.array([1, -2, 2 ** 40], np.int64),
                                 np.array([True, False]), np.array([3], np.int32)])
def test_assign_value(arr):
    values = [bool(v) if arr.dtype == bool else v for v in arr.reshape(-1).tolist()]
    check_output("assign_value", {}, {"shape": list(arr.shape), "dtype": dtypes.to_code(arr.dtype),
                                      "values": values}, {"Out": arr})


def test_assign_value_legacy_attrs_and_count_check():
    check_output("assign_value", {}, {"shape": [2], "dtype": 5, "fp32_values": [1.0, 2.0]},
                 {"Out": np.array([1, 2], np.float32)})
    with pytest.raises(OpRunError, match="expected 4 values for shape"):
        run_op("assign_value", {}, {"shape": [2, 2], "dtype": 5, "values": [1.0]})


def test_uniform_random_statistics_and_range():
    out = run_op("uniform_random", {}, {"shape": [200, 100], "min": -2.0, "max": 3.0,
                                        "seed": 11})["Out"]
    assert out.dtype == np.float32 and out.min() >= -2.0 and out.max() < 3.0
    assert stats.kstest(out.reshape(-1).astype(np.float64), stats.uniform(-2, 5).cdf).pvalue > 1e-3
    again = run_op("uniform_random", {}, {"shape": [200, 100], "min": -2.0, "max": 3.0,
                                          "seed": 11})["Out"]
    np.testing.assert_array_equal(out, again)  # a fixed seed draws the same numbers


def test_gaussian_random_statistics():
    out = run_op("gaussian_random", {}, {"shape": [20000], "mean": 1.0, "std": 2.0, "seed": 3,
                                         "dtype": 6})["Out"]
    assert out.dtype == np.float64
    assert stats.kstest(out, stats.norm(1.0, 2.0).cdf).pvalue > 1e-3


def test_truncated_gaussian_random_stays_in_bounds():
    out = run_op("truncated_gaussian_random", {}, {"shape": [20000], "mean": 0.5, "std": 1.5,
                                                   "seed": 5})["Out"]
    assert out.min() >= 0.5 - 2 * 1.5 and out.max() <= 0.5 + 2 * 1.5
    want = stats.truncnorm(-2, 2, loc=0.5, scale=1.5)
    assert stats.kstest(out.astype(np.float64), want.cdf).pvalue > 1e-3


def test_random_stream_is_counter_based():
    """Element i depends only on (key, i): any chunk of the stream can be drawn on its own."""
    key = prandom.op_key(0, 1234, 0, 2, 5)
    whole = prandom.bits(key, 1000)
    np.testing.assert_array_equal(prandom.bits(key, 300, offset=700), whole[700:])
    u = prandom.uniform01(key, 100000)
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01
    # unseeded: each run its own key; a seeded program: the same key in every run, one per op
    assert prandom.op_key(0, 0, 0, 2, 5) != prandom.op_key(0, 0, 0, 2, 6)
    assert prandom.op_key(0, 1234, 0, 2, 5) == prandom.op_key(0, 1234, 0, 2, 6)
    assert prandom.op_key(0, 1234, 0, 2, 5) != prandom.op_key(0, 1234, 0, 3, 5)
    assert prandom.op_key(9, 1, 0, 0, 0) == prandom.op_key(9, 2, 3, 4, 5)  # op seed wins
    # mix64 against its defining arithmetic, written independently here
    x = 12345
    z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 % 2 ** 64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB % 2 ** 64
    assert prandom.mix64_int(x) == z ^ (z >> 31)


def test_random_ops_refuse_integer_dtypes_and_bad_ranges():
    with pytest.raises(OpShapeError, match="expected a float type, got int64"):
        build_op_program("uniform_random", {}, {"shape": [2], "dtype": 3})
    with pytest.raises(OpRunError, match="expected min <= max"):
        run_op("uniform_random", {}, {"shape": [2], "min": 1.0, "max": 0.0})
    assert math.isfinite(run_op("gaussian_random", {}, {"shape": [1]})["Out"][0])
