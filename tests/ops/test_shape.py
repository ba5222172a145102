"""Shape and indexing ops against NumPy written here: reshape(2), transpose(2), concat, split,
slice, squeeze2, unsqueeze2, stack, gather, one_hot_v2."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdjit.framework import registry
from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.runtime.executor import Executor
from pdjit.testing import build_op_program, check_output, run_op

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(concat|gather|one_hot_v2|reshape2|slice|squeeze2|unsqueeze2"
    r")' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(3)
DTYPES = ["float32", "float64", "int64"]


def _x(dtype, shape):
    return RNG.uniform(-5, 5, size=shape).astype(dtype)


def _out_shape(op, inputs, attrs, **kw):
    _, _, outs = build_op_program(op, inputs, attrs, **kw)
    return {k: [v.shape for v in vs] for k, vs in outs.items()}


def _run_error(op, inputs, attrs, match):
    prog, feed, outs = build_op_program(op, inputs, attrs)
    with pytest.raises(OpRunError, match=match):
        Executor().run(prog, feed=feed, fetch_list=[v for vs in outs.values() for v in vs])


# ---- reshape ---------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["reshape2", "reshape"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,target,want", [
    ((2, 3, 4), [6, 4], (6, 4)), ((2, 3, 4), [0, -1], (2, 12)), ((2, 3, 4), [-1], (24,)),
    ((2, 3, 4), [0, 0, 2, 2], (2, 3, 2, 2)), ((2, 3, 4), [0, 0, 0, -1], (2, 3, 4, 1)),
    ((1, 1), [], ()), ((4, 6), [0, 2, -1], (4, 2, 3))])
def test_reshape(op, dtype, shape, target, want):
    x = _x(dtype, shape)
    outputs = {"XShape": 1} if op == "reshape2" else None
    got = check_output(op, {"X": x}, {"shape": target}, {"Out": x.reshape(want)},
                       batch_unknown=len(shape) > 1, outputs=outputs)
    if op == "reshape2":
        assert got["XShape"].shape == (0,) + shape and got["XShape"].dtype == x.dtype


@pytest.mark.parametrize("in_shape,target,want", [
    ((2, 8), [-1, 4], (-1, 4)), ((2, 3), [0, 3], (-1, 3)), ((2, 3, 4), [0, -1], (-1, 12)),
    ((2, 3, 4), [-1, 12], (-1, 12)), ((2, 3, 4), [6, 4], (6, 4)),
    ((2, 3, 4), [0, 3, 4], (-1, 3, 4))])
def test_reshape_unknown_batch_at_build_time(in_shape, target, want):
    got = _out_shape("reshape2", {"X": np.zeros(in_shape, np.float32)}, {"shape": target},
                     batch_unknown=True, outputs={"XShape": 1})
    assert got["Out"] == [want] and got["XShape"] == [(0, -1) + in_shape[1:]]


@pytest.mark.parametrize("target,match", [
    ([5, -1], "divide by 5"), ([-1, -1], "at most one -1"), ([5, 5], r"elements as X \(24\), "
                                                                     r"got 25"),
    ([0, 0, 0, 0, 2], "rank 3"), ([2, -2, 6], "got -2")])
def test_reshape_bad_shape(target, match):
    with pytest.raises(OpShapeError, match=match):
        build_op_program("reshape2", {"X": np.zeros((2, 3, 4), np.float32)}, {"shape": target})


def test_reshape_shape_tensors_override_the_attr():
    x = _x("float32", (2, 3, 4))
    ins = {"X": x, "ShapeTensor": [np.array([0], np.int32), np.array([-1], np.int32)]}
    check_output("reshape2", ins, {"shape": [-1, -1]}, {"Out": x.reshape(2, 12)})
    assert _out_shape("reshape2", ins, {})["Out"] == [(-1, -1)]
    ins = {"X": x, "Shape": np.array([4, 6], np.int64)}
    check_output("reshape2", ins, {}, {"Out": x.reshape(4, 6)})
    _run_error("reshape2", {"X": x, "Shape": np.array([5, 6], np.int64)}, {},
               r"reshape2.*elements as X \(24\), got 30")


@settings(max_examples=25, deadline=None)
@given(dims=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_reshape_hypothesis(dims, data):
    x = np.arange(int(np.prod(dims)), dtype=np.float64).reshape(dims)
    target = list(data.draw(st.permutations(dims)))
    target = [d if data.draw(st.booleans()) else 0 if d == dims[i] and i < len(dims) else d
              for i, d in enumerate(target)]
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    want = [dims[i] if t == 0 else t for i, t in enumerate(target)]
    check_output("reshape2", {"X": x}, {"shape": target}, {"Out": x.reshape(want)},
                 batch_unknown=True)


# ---- transpose -------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["transpose2", "transpose"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,perm", [((3, 4), [1, 0]), ((2, 3, 4), [2, 0, 1]),
                                        ((2, 3, 4), [-1, 0, 1]), ((5,), [0]), ((), []),
                                        ((2, 1, 1, 6), [0, 3, 1, 2]), ((3, 1, 5), [1, 0, 2]),
                                        ((2, 1, 4, 3), [0, 2, 1, 3])])
def test_transpose(op, dtype, shape, perm):
    x = _x(dtype, shape)
    check_output(op, {"X": x}, {"axis": perm}, {"Out": np.transpose(x, perm)},
                 batch_unknown=len(shape) > 1,
                 outputs={"XShape": 1} if op == "transpose2" else None)


def test_a_transpose_moving_only_unit_axes_is_a_view(fresh_programs):
    """A channels-last ``[N, 1, 1, C]`` back to ``[N, C, 1, 1]`` (the order of the values
    unchanged) and ``[N, 4, 1, 6]`` to ``[N, 1, 4, 6]``: the driver views its input, no
    copy; a permutation that reorders axes of more than one value copies. Against NumPy,
    native code asserted."""
    import pdjit as fluid
    from pdjit.testing import assert_native

    x = fluid.layers.data("x", [1, 1, 6])
    x2 = fluid.layers.data("x2", [4, 1, 6])
    ys = [fluid.layers.transpose(x, [0, 3, 1, 2]), fluid.layers.transpose(x2, [0, 2, 1, 3]),
          fluid.layers.transpose(x2, [0, 3, 1, 2])]
    exe = Executor(strict=True)
    xv, xv2 = _x("float32", (3, 1, 1, 6)), _x("float32", (3, 4, 1, 6))
    got = exe.run(fluid.default_main_program(), feed={"x": xv, "x2": xv2}, fetch_list=ys)
    assert_native(exe)
    np.testing.assert_array_equal(got[0], xv.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(got[1], xv2.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(got[2], xv2.transpose(0, 3, 1, 2))
    texts = "\n".join(s.compiled.text for _, plan in exe._plans.values() for s in plan.walk()
                      if s.kind == "native")
    assert texts.count("_nn.permute_into(") == 1 and texts.count(".reshape((") >= 2


@pytest.mark.parametrize("perm", [[0, 0, 1], [0, 1], [0, 1, 3]])
def test_transpose_bad_perm(perm):
    with pytest.raises(OpShapeError, match="transpose2"):
        build_op_program("transpose2", {"X": np.zeros((2, 3, 4), np.float32)}, {"axis": perm})


# ---- concat / stack / split ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("n", [1, 3])
def test_concat(dtype, axis, n):
    xs = [_x(dtype, (2, 1 + i, 3) if axis == 1 else (2, 3, 3)) for i in range(n)]
    check_output("concat", {"X": xs}, {"axis": axis}, {"Out": np.concatenate(xs, axis)},
                 batch_unknown=axis != 0)


def test_concat_axis_tensor_and_errors():
    xs = [_x("float32", (2, 3)), _x("float32", (2, 3))]
    check_output("concat", {"X": xs, "AxisTensor": np.array([1], np.int32)}, {},
                 {"Out": np.concatenate(xs, 1)})
    assert _out_shape("concat", {"X": xs, "AxisTensor": np.array([1], np.int32)}, {})["Out"] \
        == [(-1, -1)]
    with pytest.raises(OpShapeError, match=r"expected input 1 to match input 0 \[2, 3\] in dim "
                                           r"1, got \[2, 2\]"):
        build_op_program("concat", {"X": [xs[0], xs[1][:, :2]]}, {"axis": 0})
    with pytest.raises(OpShapeError, match="dtype"):
        build_op_program("concat", {"X": [xs[0], xs[1].astype(np.float64)]}, {"axis": 0})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_stack(dtype, axis):
    xs = [_x(dtype, (2, 3)) for _ in range(3)]
    check_output("stack", {"X": xs}, {"axis": axis}, {"Y": np.stack(xs, axis)},
                 batch_unknown=True)


def test_stack_errors():
    with pytest.raises(OpShapeError, match=r"expected input 1 to match"):
        build_op_program("stack", {"X": [np.zeros((2, 3)), np.zeros((1, 3))]})
    with pytest.raises(OpShapeError, match="axis=3 is out of range"):
        build_op_program("stack", {"X": [np.zeros((2, 3)), np.zeros((2, 3))]}, {"axis": 3})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attrs,sizes", [
    ({"num": 2, "axis": 2}, [2, 2]), ({"num": 3, "axis": 1}, [1, 1, 1]),
    ({"sections": [1, -1], "axis": 1}, [1, 2]), ({"sections": [0, 3, 1], "axis": -1}, [0, 3, 1]),
    ({"num": 2, "axis": 0}, [1, 1])])
def test_split(dtype, attrs, sizes):
    x = _x(dtype, (2, 3, 4))
    want = np.split(x, np.cumsum(sizes)[:-1], axis=attrs["axis"])
    check_output("split", {"X": x}, attrs, {"Out": want}, outputs={"Out": len(sizes)},
                 batch_unknown=attrs["axis"] != 0)


def test_split_unknown_dim_and_errors():
    x = np.zeros((2, 3, 4), np.float32)
    got = _out_shape("split", {"X": x}, {"sections": [1, -1], "axis": 0}, batch_unknown=True,
                     outputs={"Out": 2})
    assert got["Out"] == [(1, 3, 4), (-1, 3, 4)]
    with pytest.raises(OpShapeError, match="size 4 to divide by num=3"):
        build_op_program("split", {"X": x}, {"num": 3, "axis": 2}, outputs={"Out": 3})
    with pytest.raises(OpShapeError, match=r"add up to the dim's size 3, got \[1, 1\]"):
        build_op_program("split", {"X": x}, {"sections": [1, 1], "axis": 1}, outputs={"Out": 2})
    with pytest.raises(OpShapeError, match="2 results for 3 variables"):
        build_op_program("split", {"X": x}, {"num": 2, "axis": 2}, outputs={"Out": 3})


# ---- slice -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axes,starts,ends,index", [
    ([1, 2], [1, -3], [100, -1], np.s_[:, 1:, 1:3]), ([1], [2], [1], np.s_[:, 2:1]),
    ([1], [-100], [2], np.s_[:, :2]), ([2], [5], [7], np.s_[:, :, 4:4]),
    ([0, 2], [0, 1], [1, 3], np.s_[0:1, :, 1:3])])
def test_slice(dtype, axes, starts, ends, index):
    x = _x(dtype, (2, 3, 4))
    check_output("slice", {"Input": x}, {"axes": axes, "starts": starts, "ends": ends},
                 {"Out": x[index]}, batch_unknown=0 not in axes)


def test_slice_decrease_axis_and_tensor_bounds():
    x = _x("float64", (2, 3, 4))
    check_output("slice", {"Input": x}, {"axes": [0, 1], "starts": [1, 1], "ends": [2, 2],
                                         "decrease_axis": [0, 1]}, {"Out": x[1, 1]})
    got = check_output("slice", {"Input": x}, {"axes": [0, 1, 2], "starts": [1, 1, 1],
                                               "ends": [2, 2, 2], "decrease_axis": [0, 1, 2]},
                       {"Out": np.asarray(x[1, 1, 1])})
    assert got["Out"].shape == ()
    ins = {"Input": x, "StartsTensor": np.array([1], np.int64)}
    check_output("slice", ins, {"axes": [1], "starts": [0], "ends": [3], "infer_flags": [-1]},
                 {"Out": x[:, 1:3]})
    assert _out_shape("slice", ins, {"axes": [1], "ends": [3]})["Out"] == [(2, -1, 4)]
    ins = {"Input": x, "EndsTensorList": [np.array([2], np.int32)]}
    check_output("slice", ins, {"axes": [2], "starts": [1]}, {"Out": x[:, :, 1:2]})
    assert _out_shape("slice", {"Input": x}, {"axes": [0], "starts": [0], "ends": [1],
                                              "decrease_axis": [0]},
                      batch_unknown=True)["Out"] == [(3, 4)]


def test_slice_errors():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(OpShapeError, match="axes=3 is out of range"):
        build_op_program("slice", {"Input": x}, {"axes": [3], "starts": [0], "ends": [1]})
    with pytest.raises(OpShapeError, match="decreased axis 1 must have size 1: expected 1, got 2"):
        build_op_program("slice", {"Input": x}, {"axes": [1], "starts": [0], "ends": [2],
                                                 "decrease_axis": [1]})
    with pytest.raises(OpShapeError, match="starts and ends of length 2"):
        build_op_program("slice", {"Input": x}, {"axes": [0, 1], "starts": [0], "ends": [1, 1]})


# ---- squeeze2 / unsqueeze2 -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axes,want", [
    ((2, 1, 3, 1), [1], (2, 3, 1)), ((2, 1, 3, 1), [], (2, 3)), ((2, 1, 3, 1), [-1, 1], (2, 3)),
    ((2, 1, 3), [0, 1], (2, 3)), ((2, 3), [], (2, 3)), ((1,), [], ())])
def test_squeeze2(dtype, shape, axes, want):
    x = _x(dtype, shape)
    got = check_output("squeeze2", {"X": x}, {"axes": axes}, {"Out": x.reshape(want)},
                       batch_unknown=shape[0] != 1 and 0 not in axes, outputs={"XShape": 1})
    assert got["XShape"].shape == (0,) + shape


def test_squeeze2_unknown_dims_and_errors():
    x = np.zeros((1, 2, 1), np.float32)
    assert _out_shape("squeeze2", {"X": x}, {"axes": []}, batch_unknown=True)["Out"] == [(-1, 2)]
    # a dim unknown at build time that the user names is assumed to be 1, as in Paddle
    assert _out_shape("squeeze2", {"X": x}, {"axes": [0]}, batch_unknown=True)["Out"] == [(2, 1)]
    with pytest.raises(OpShapeError, match="axes=3 is out of range"):
        build_op_program("squeeze2", {"X": x}, {"axes": [3]})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axes,want", [
    ([0, 4], (1, 2, 3, 4, 1)), ([3, 1], (2, 1, 3, 4, 1)), ([-1, -1], (2, 3, 4, 1, 1)),
    ([-1, 0, -3], (1, 2, 3, 1, 4, 1)), ([1, 1], (2, 1, 1, 3, 4)), ([], (2, 3, 4))])
def test_unsqueeze2(dtype, axes, want):
    x = _x(dtype, (2, 3, 4))
    check_output("unsqueeze2", {"X": x}, {"axes": axes}, {"Out": x.reshape(want)},
                 batch_unknown=True, outputs={"XShape": 1})


def test_unsqueeze2_tensor_axes_and_errors():
    x = _x("float32", (2, 3))
    check_output("unsqueeze2", {"X": x, "AxesTensor": np.array([0, 3], np.int32)}, {},
                 {"Out": x.reshape(1, 2, 3, 1)})
    check_output("unsqueeze2", {"X": np.float32(2)}, {"axes": [0]}, {"Out": np.array([2.0],
                                                                                     np.float32)})
    with pytest.raises(OpShapeError, match=r"axis 4 is out of range .* expected -3..2"):
        build_op_program("unsqueeze2", {"X": x}, {"axes": [4]})


def test_view_traits():
    for op in ("reshape2", "reshape", "squeeze2", "unsqueeze2"):
        assert registry.get(op).has(registry.VIEW)
        assert isinstance(registry.get(op).emit, registry.Opaque)
    for op in ("transpose2", "concat", "split", "slice", "stack", "gather", "one_hot_v2"):
        assert registry.get(op).has(registry.OPAQUE)
    assert registry.get("one_hot_v2").grad is None
    for op in ("reshape2", "reshape", "transpose2", "transpose", "squeeze2", "unsqueeze2",
               "concat", "split", "slice", "stack", "gather"):
        grad = registry.get(op).grad
        assert grad is not None and grad is not registry.NO_GRAD_YET, op


# ---- gather ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
@pytest.mark.parametrize("axis,index", [(0, [1, 0, 1]), (1, [2, 0]), (-1, [3]), (1, [-1, 0])])
def test_gather(dtype, idx_dtype, axis, index):
    x = _x(dtype, (2, 3, 4))
    idx = np.array(index, idx_dtype)
    n = x.shape[axis]
    want = np.take(x, [i + n if i < 0 else i for i in index], axis=axis)
    check_output("gather", {"X": x, "Index": idx}, {"axis": axis}, {"Out": want},
                 batch_unknown=True)


def test_gather_index_shapes_and_axis_tensor():
    x = _x("float32", (2, 3, 4))
    check_output("gather", {"X": x, "Index": np.array([[2], [0]])}, {"axis": 1},
                 {"Out": x[:, [2, 0]]})
    check_output("gather", {"X": x, "Index": np.array(2)}, {"axis": 1}, {"Out": x[:, 2]})
    check_output("gather", {"X": x, "Index": np.array([1]), "Axis": np.array([2])}, {},
                 {"Out": x[:, :, [1]]})
    with pytest.raises(OpShapeError, match=r"expected Index of rank 0 or 1 .*got shape \[2, 2\]"):
        build_op_program("gather", {"X": x, "Index": np.zeros((2, 2), np.int64)})
    with pytest.raises(OpShapeError, match="expected dtype int32, int64, got float32"):
        build_op_program("gather", {"X": x, "Index": np.zeros(2, np.float32)})


@pytest.mark.parametrize("bad", [2, -3, 100])
def test_gather_out_of_range_index_is_a_run_error(bad):
    x = _x("float32", (2, 3))
    _run_error("gather", {"X": x, "Index": np.array([0, bad])}, {"axis": 0},
               rf"op 'gather'.*index {bad} is out of range .* expected -2 <= index < 2")


# ---- one_hot_v2 ------------------------------------------------------------------------------
@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
@pytest.mark.parametrize("shape", [(5,), (3, 1), (2, 3)])
@pytest.mark.parametrize("dtype_code,np_dtype", [(5, np.float32), (6, np.float64),
                                                 (3, np.int64)])
def test_one_hot_v2(idx_dtype, shape, dtype_code, np_dtype):
    ids = RNG.integers(0, 4, size=shape).astype(idx_dtype)
    want = np.eye(4, dtype=np_dtype)[ids]  # appends the one-hot dim
    check_output("one_hot_v2", {"X": ids}, {"depth": 4, "dtype": dtype_code}, {"Out": want},
                 batch_unknown=True)


def test_one_hot_v2_range_and_depth_tensor():
    ids = np.array([3, -1, 1], np.int64)
    check_output("one_hot_v2", {"X": ids}, {"depth": 3, "allow_out_of_range": True},
                 {"Out": np.array([[0, 0, 0], [0, 0, 0], [0, 1, 0]], np.float32)})
    check_output("one_hot_v2", {"X": ids[2:], "depth_tensor": np.array([5], np.int32)}, {},
                 {"Out": np.eye(5, dtype=np.float32)[[1]]})
    _run_error("one_hot_v2", {"X": ids}, {"depth": 3},
               r"op 'one_hot_v2'.*index 3 is out of range: expected 0 <= index < depth = 3")
    _run_error("one_hot_v2", {"X": ids[1:]}, {"depth": 3}, r"index -1 is out of range")
    with pytest.raises(OpShapeError, match="expected depth >= 1"):
        build_op_program("one_hot_v2", {"X": ids}, {})
    with pytest.raises(OpShapeError, match="expected dtype int32, int64"):
        build_op_program("one_hot_v2", {"X": ids.astype(np.float32)}, {"depth": 3})


def test_reference_never_mutates_inputs():
    x = _x("float64", (2, 3))
    keep = x.copy()
    for op, attrs in [("reshape2", {"shape": [3, 2]}), ("transpose2", {"axis": [1, 0]}),
                      ("squeeze2", {}), ("unsqueeze2", {"axes": [0]})]:
        run_op(op, {"X": x}, attrs)
    np.testing.assert_array_equal(x, keep)
