"""arg_max / arg_min compiled natively (strict: no reference fallback) against NumPy written
here: every axis of a 3-D tensor, keepdims, flatten, 0-d, ties (the first one), NaN (the first
NaN, as np.argmax), integer inputs, int32 output; an empty axis is an error."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import assert_native, build_op_program

rng = np.random.default_rng(7)
X3 = rng.integers(-3, 4, (3, 4, 5)).astype(np.float32)   # small integers: many ties


def run_op(op_type, inputs, attrs, mode="compiled", batch_unknown=False):
    """The op alone in a program, compiled, strict; its step must have run native code."""
    assert mode == "compiled"
    prog, feed, outs = build_op_program(op_type, inputs, attrs, batch_unknown)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    (got,) = exe.run(prog, feed=feed, fetch_list=outs["Out"], scope=fluid.Scope())
    assert_native(exe, op_type)
    return {"Out": got}


def _want(fn, x, axis, keepdims=False, flatten=False):
    if flatten or x.ndim == 0:
        r = np.asarray(fn(x.reshape(-1)))
        return r.reshape((1,) * x.ndim if keepdims else ())
    return np.asarray(fn(x, axis=axis)) if not keepdims else \
        np.expand_dims(fn(x, axis=axis), axis)


@pytest.mark.parametrize("op, fn", [("arg_max", np.argmax), ("arg_min", np.argmin)])
@pytest.mark.parametrize("axis, keepdims, flatten", [(0, False, False), (1, True, False),
                                                     (-1, False, False), (2, True, False),
                                                     (0, False, True), (1, True, True)])
def test_matches_numpy(op, fn, axis, keepdims, flatten):
    got = run_op(op, {"X": X3}, {"axis": axis, "keepdims": keepdims, "flatten": flatten},
                 mode="compiled")["Out"]
    want = _want(fn, X3, axis, keepdims, flatten)
    assert got.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op, fn", [("arg_max", np.argmax), ("arg_min", np.argmin)])
def test_nan_ints_bool_int32_and_0d(op, fn):
    x = rng.standard_normal((4, 6))
    x[1, 3], x[1, 5], x[2, 0] = np.nan, np.nan, np.nan
    got = run_op(op, {"X": x}, {"axis": 1}, mode="compiled")["Out"]
    np.testing.assert_array_equal(got, fn(x, axis=1))
    for v in (rng.integers(-5, 5, (3, 7)).astype(np.int32),
              rng.integers(0, 3, (3, 7)).astype(np.uint8)):
        got = run_op(op, {"X": v}, {"axis": 0, "dtype": 2}, mode="compiled")["Out"]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, fn(v, axis=0))
    got = run_op(op, {"X": np.array(2.5)}, {"axis": 0}, mode="compiled")["Out"]
    assert got.shape == () and got == 0


def test_an_empty_axis_is_an_error_naming_the_op():
    # the batch axis, empty at run time (declared -1): the native code refuses, the reference
    # raises the error
    with pytest.raises(Exception, match="arg_max.*non-empty"):
        run_op("arg_max", {"X": np.zeros((0, 3), np.float32)}, {"axis": 0}, mode="compiled",
               batch_unknown=True)
