"""Reductions (reduce_*, mean, sum), arg_max/arg_min and top_k against NumPy written here."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdjit.framework import registry
from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.testing import build_op_program, check_output, run_op

# op 'top_k_v2' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(top_k_v2)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(7)


def _x(dtype, shape):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-4, 5, size=shape).astype(dtype)
    return RNG.uniform(-2, 2, size=shape).astype(dtype)


def _axes(dim, ndim):
    """The axes NumPy reduces for Paddle's dim attr (empty or all: every axis)."""
    axes = tuple(sorted({d % ndim for d in dim})) if ndim else ()
    return tuple(range(ndim)) if not axes or len(axes) == ndim else axes


def _np_reduce(op, x, dim, keep):
    axes = _axes(dim, x.ndim)
    if op == "reduce_sum":
        out = np.sum(x.astype(np.float64 if x.dtype.kind == "f" else np.int64), axis=axes,
                     keepdims=keep)
        return out.astype(np.int64 if x.dtype == np.int32 else x.dtype)
    if op == "reduce_mean":
        if x.dtype.kind == "i":  # C integer division truncates toward zero
            s, n = np.sum(x, axis=axes, keepdims=keep, dtype=np.int64), \
                int(np.prod([x.shape[a] for a in axes]))
            return (np.trunc(s / n)).astype(x.dtype)
        return np.mean(x.astype(np.float64), axis=axes, keepdims=keep).astype(x.dtype)
    fn = {"reduce_max": np.max, "reduce_min": np.min, "reduce_prod": np.prod}[op]
    return np.asarray(fn(x.astype(np.float64) if x.dtype.kind == "f" else x, axis=axes,
                         keepdims=keep)).astype(x.dtype)


REDUCES = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"]
# axes at either end of the shape: small kernels over rows or over columns (for each op and
# dtype), which these shapes and both keep_dim share
CASES = [((5,), [0]), ((3, 4), [1]), ((3, 4), [-2]), ((2, 3, 4), []),
         ((2, 3, 4), [0, 1, 2]), ((2, 3, 4), [-1, 1]), ((), [0])]
# axes around a kept one ((2, 3, 4) over [0, 2]): a strided loop nest into the output, a
# kernel of its own for each op, dtype and keep_dim; the loop nest is the same for all, so
# each op once (an accumulation and a finish of its own), every dtype and keep_dim among them,
# integer and float mean both (the integer one truncates)
AROUND = [("reduce_sum", "float32", False), ("reduce_mean", "int64", True),
          ("reduce_mean", "float32", False), ("reduce_max", "float64", True),
          ("reduce_min", "int64", False), ("reduce_prod", "float64", True)]


@pytest.mark.parametrize("op", REDUCES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape,dim", CASES)
@pytest.mark.parametrize("keep", [False, True])
def test_reduce_matches_numpy(op, dtype, shape, dim, keep):
    _check_reduce(op, dtype, shape, dim, keep)


@pytest.mark.parametrize("op,dtype,keep", AROUND)
def test_reduce_around_a_kept_axis_matches_numpy(op, dtype, keep):
    _check_reduce(op, dtype, (2, 3, 4), [0, 2], keep)


def _check_reduce(op, dtype, shape, dim, keep):
    x = _x(dtype, shape)
    if op == "reduce_prod" and dtype != "int64":
        x = (x / 2 + np.sign(x)).astype(dtype)  # keep products away from 0 and overflow
    want = _np_reduce(op, x, dim, keep)
    check_output(op, {"X": x}, {"dim": dim, "keep_dim": keep}, {"Out": want},
                 rtol=1e-5 if dtype == "float32" else None,
                 batch_unknown=len(shape) > 1 and 0 not in _axes(dim, len(shape)))


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_all_gives_0d(op):
    x = _x("float64", (3, 4))
    got = check_output(op, {"X": x}, {"dim": [1], "reduce_all": True},
                       {"Out": _np_reduce(op, x, [], False)}, batch_unknown=True)
    assert got["Out"].shape == ()


def test_reduce_keeps_unknown_dims_and_int_sum_widens():
    prog, _, outs = build_op_program("reduce_sum", {"X": np.ones((2, 3, 4), np.int32)},
                                     {"dim": [2]}, batch_unknown=True)
    assert outs["Out"][0].shape == (-1, 3) and outs["Out"][0].dtype == np.int64
    check_output("reduce_sum", {"X": np.array([[True, False, True]])}, {"dim": [1]},
                 {"Out": np.array([2], np.int64)})
    check_output("reduce_sum", {"X": np.arange(6, dtype=np.float32).reshape(2, 3)},
                 {"dim": [1], "out_dtype": 6}, {"Out": np.array([3.0, 12.0])})


def test_integer_mean_truncates_toward_zero():
    x = np.array([[-1, -2, -2], [1, 2, 2]], np.int64)
    check_output("reduce_mean", {"X": x}, {"dim": [1]}, {"Out": np.array([-1, 1], np.int64)})


def test_sum_of_empty_axis_is_zero_but_max_is_an_error():
    check_output("reduce_sum", {"X": np.zeros((0, 3), np.float32)}, {"dim": [0]},
                 {"Out": np.zeros(3, np.float32)})
    with pytest.raises(OpShapeError, match="non-empty"):
        build_op_program("reduce_max", {"X": np.zeros((0, 3), np.float32)}, {"dim": [0]})


@pytest.mark.parametrize("dim,match", [([2], "expected -2..1"), ([1, -1], "twice")])
def test_reduce_bad_dim(dim, match):
    with pytest.raises(OpShapeError, match=match):
        build_op_program("reduce_sum", {"X": np.ones((2, 3), np.float32)}, {"dim": dim})


def test_reduce_emit_templates():
    emit = registry.get("reduce_mean").emit
    assert emit({"X": np.dtype("float32"), "Out": np.dtype("float32")}).finalize == \
        "{acc} / {T}({n})"
    assert "inf" in registry.get("reduce_max").emit({"Out": np.dtype("float64")}).init
    assert str(np.iinfo(np.int32).max) in registry.get("reduce_min").emit(
        {"Out": np.dtype("int32")}).init
    assert registry.get("reduce_sum").has(registry.REDUCTION)
    assert registry.get("sum").has(registry.OPAQUE) and registry.get("sum").emit.host


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       data=st.data(), op=st.sampled_from(REDUCES), keep=st.booleans())
def test_reduce_hypothesis(shape, data, op, keep):
    dim = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape),
                             unique_by=lambda d: d % len(shape)))
    x = _x("float64", tuple(shape))
    check_output(op, {"X": x}, {"dim": dim, "keep_dim": keep},
                 {"Out": _np_reduce(op, x, dim, keep)})


# ---- mean and sum ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4), ()])
def test_mean_is_0d(dtype, shape):
    x = _x(dtype, shape)
    check_output("mean", {"X": x}, {}, {"Out": np.asarray(np.mean(x, dtype=np.float64),
                                                          dtype)},
                 rtol=1e-5 if dtype == "float32" else None, batch_unknown=len(shape) > 1)


def test_mean_refuses_ints():
    with pytest.raises(OpShapeError, match="expected dtype"):
        build_op_program("mean", {"X": np.ones((2, 3), np.int64)})


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_sum_adds_inputs(dtype, n):
    xs = [_x(dtype, (3, 4)) for _ in range(n)]
    want = xs[0].copy()
    for x in xs[1:]:
        want = want + x
    got = check_output("sum", {"X": xs}, {}, {"Out": want}, batch_unknown=True)
    assert not np.shares_memory(got["Out"], xs[0])  # a new array, not X[0] updated in place


def test_sum_shape_mismatch():
    with pytest.raises(OpShapeError, match=r"expected X\[1\] of shape \[2, 3\], got \[2, 2\]"):
        build_op_program("sum", {"X": [np.ones((2, 3), np.float32), np.ones((2, 2), np.float32)]})


# ---- arg_max / arg_min -------------------------------------------------------------------------
@pytest.mark.parametrize("op,fn", [("arg_max", np.argmax), ("arg_min", np.argmin)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 4), 1), ((3, 4), -2), ((2, 3, 4), 1)])
@pytest.mark.parametrize("keep", [False, True])
def test_arg_matches_numpy(op, fn, dtype, shape, axis, keep):
    x = _x(dtype, shape)
    want = fn(x, axis=axis)
    if keep:
        want = np.expand_dims(want, axis)
    check_output(op, {"X": x}, {"axis": axis, "keepdims": keep}, {"Out": want.astype(np.int64)},
                 batch_unknown=len(shape) > 1 and axis % len(shape) != 0)


def test_arg_flatten_dtype_and_ties():
    x = np.array([[1, 3, 3, 0], [2, 2, 1, 2]], np.float32)
    check_output("arg_max", {"X": x}, {"axis": 0, "flatten": True}, {"Out": np.array(1)})
    check_output("arg_max", {"X": x}, {"axis": 0, "flatten": True, "keepdims": True},
                 {"Out": np.array([[1]])})
    check_output("arg_min", {"X": x}, {"axis": 1, "dtype": 2}, {"Out": np.array([3, 2], np.int32)})
    check_output("arg_max", {"X": np.float32(2.0)}, {"axis": 0}, {"Out": np.array(0)})
    with pytest.raises(OpShapeError, match="expected dtype 2"):
        build_op_program("arg_max", {"X": x}, {"axis": 0, "dtype": 5})
    with pytest.raises(OpShapeError, match="missing required"):
        build_op_program("arg_max", {"X": x}, {})
    assert registry.get("arg_max").grad is None


# ---- top_k / top_k_v2 --------------------------------------------------------------------------
def _np_topk(x, k, axis=-1, largest=True):
    # distinct values in the tests, so any correct sort gives these indices
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


def _distinct(dtype, shape):
    return RNG.permutation(int(np.prod(shape))).reshape(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape,k", [((6,), 1), ((3, 5), 2), ((2, 3, 4), 4)])
def test_top_k(dtype, shape, k):
    x = _distinct(dtype, shape)
    out, idx = _np_topk(x, k)
    check_output("top_k", {"X": x}, {"k": k}, {"Out": out, "Indices": idx},
                 batch_unknown=len(shape) > 1)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_v2(dtype, axis, largest):
    x = _distinct(dtype, (3, 4, 5))
    out, idx = _np_topk(x, 2, axis, largest)
    check_output("top_k_v2", {"X": x}, {"k": 2, "axis": axis, "largest": largest},
                 {"Out": out, "Indices": idx}, batch_unknown=axis != 0)


def test_top_k_tensor_k_ties_and_errors():
    x = np.array([[1, 3, 3, 0], [2, 2, 1, 2]], np.float32)
    # ties keep the lower index first
    check_output("top_k_v2", {"X": x, "K": np.array([3], np.int32)}, {},
                 {"Out": np.array([[3, 3, 1], [2, 2, 2]], np.float32),
                  "Indices": np.array([[1, 2, 0], [0, 1, 3]])})
    check_output("top_k_v2", {"X": np.array([5, 1, 1, 7], np.uint8)}, {"k": 2, "largest": False},
                 {"Out": np.array([1, 1], np.uint8), "Indices": np.array([1, 2])})
    with pytest.raises(OpShapeError, match="expected 1 <= k <= 4"):
        build_op_program("top_k", {"X": x}, {"k": 5})
    prog, feed, outs = build_op_program("top_k_v2", {"X": x, "K": np.array([9], np.int32)})
    from pdjit.runtime.executor import Executor
    with pytest.raises(OpRunError, match=r"top_k_v2.*expected 1 <= k <= 4"):
        Executor().run(prog, feed=feed, fetch_list=outs["Out"])


def test_top_k_unknown_last_dim_is_allowed():
    prog, _, outs = build_op_program("top_k", {"X": np.zeros((3, 4), np.float32)}, {"k": 2},
                                     batch_unknown=True)
    assert outs["Out"][0].shape == (-1, 2) and outs["Indices"][0].dtype == np.int64
    assert run_op("top_k", {"X": np.float32(3)}, {"k": 1})["Indices"].shape == ()
