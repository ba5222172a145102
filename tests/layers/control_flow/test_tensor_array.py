"""Tensor arrays (``LOD_TENSOR_ARRAY``: a list of arrays at run time) against Python lists."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.proto import framework_pb2 as pb

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(assign|lod_array_length|read_from_array|tensor_array_to_tensor"
    r"|write_to_array)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
MODES = ["reference", "compiled"]


def _run(mode, main, feed, fetch, scope=None):
    return fluid.Executor(mode=mode).run(main, feed=feed, fetch_list=fetch,
                                         scope=scope or fluid.Scope())


def _i(v):
    return L.fill_constant([1], "int64", v)


@pytest.mark.parametrize("mode", MODES)
def test_write_read_length_concat_stack(mode, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[2, 3], dtype="float32", append_batch_size=False)
    arr = L.create_array("float32")
    assert arr.type == pb.VarType.LOD_TENSOR_ARRAY
    L.array_write(x, _i(0), array=arr)
    L.array_write(x * 2.0, _i(1), array=arr)
    L.array_write(x - 1.0, _i(2), array=arr)
    n = L.array_length(arr)
    r1 = L.array_read(arr, _i(1))
    cat0, idx0 = L.tensor_array_to_tensor(arr, axis=0)
    cat1, idx1 = L.tensor_array_to_tensor(arr, axis=1)
    stk, sidx = L.tensor_array_to_tensor(arr, axis=1, use_stack=True)
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    items = [xv, xv * 2, xv - 1]
    got = _run(mode, main, {"x": xv}, [n, r1, cat0, idx0, cat1, idx1, stk, sidx, arr])
    gn, gr1, gc0, gi0, gc1, gi1, gs, gsi, garr = got
    assert gn.tolist() == [3] and gn.dtype == np.int64
    np.testing.assert_array_equal(gr1, items[1])
    np.testing.assert_array_equal(gc0, np.concatenate(items, 0))
    np.testing.assert_array_equal(gc1, np.concatenate(items, 1))
    np.testing.assert_array_equal(gs, np.stack(items, 1))
    assert gi0.tolist() == [2, 2, 2] and gi1.tolist() == [3, 3, 3] and gsi.tolist() == [1, 1, 1]
    assert gi0.dtype == np.int32
    assert isinstance(garr, list) and len(garr) == 3
    for g, w in zip(garr, items):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("mode", MODES)
def test_array_written_in_a_while_loop(mode, fresh_programs):
    """Collect x, x+1, ..., x+n-1 in a loop; read them back and concatenate."""
    main, _ = fresh_programs
    x = L.data(name="x", shape=[1, 2], dtype="float64", append_batch_size=False)
    n = L.data(name="n", shape=[1], dtype="int64", append_batch_size=False)
    arr = L.create_array("float64")
    i = _i(0)
    c = L.less_than(i, n)
    loop = L.While(c)
    with loop.block():
        L.array_write(x + L.cast(i, "float64"), i, array=arr)
        L.increment(i)
        L.less_than(i, n, cond=c)
    length = L.array_length(arr)
    last = L.array_read(arr, length - 1)
    cat, _ = L.tensor_array_to_tensor(arr, axis=0)
    xv = np.array([[0.5, -1.0]])
    for nv in (1, 4):
        gl, glast, gcat = _run(mode, main, {"x": xv, "n": np.array([nv], np.int64)},
                               [length, last, cat])
        assert gl.tolist() == [nv]
        np.testing.assert_allclose(glast, xv + (nv - 1))
        np.testing.assert_allclose(gcat, np.concatenate([xv + k for k in range(nv)], 0))


@pytest.mark.parametrize("mode", MODES)
def test_array_as_while_loop_var_and_assign_copies_arrays(mode, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
    arr = L.array_write(x, _i(0))
    copy = L.assign(arr)
    assert copy.type == pb.VarType.LOD_TENSOR_ARRAY
    three = _i(3)

    def body(i, a):
        L.array_write(L.array_read(a, i) * 2.0, i + 1, array=a)
        return [i + 1, a]

    _, arr_out = L.while_loop(lambda i, a: L.less_than(i, three), body, [_i(0), arr])
    n_copy = L.array_length(copy)
    n_out = L.array_length(arr_out)
    out, _ = L.tensor_array_to_tensor(arr_out, axis=0, use_stack=True)
    xv = np.array([1.0, -2.0], np.float32)
    g_copy, g_out, g = _run(mode, main, {"x": xv}, [n_copy, n_out, out])
    assert g_copy.tolist() == [1] and g_out.tolist() == [4]
    np.testing.assert_allclose(g, np.stack([xv * 2 ** k for k in range(4)]))


@pytest.mark.parametrize("mode", MODES)
def test_unwritten_array_is_empty_and_reads_out_of_range_fail(mode, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
    k = L.data(name="k", shape=[1], dtype="int64", append_batch_size=False)
    empty = L.create_array("float32")
    n_empty = L.array_length(empty)
    arr = L.array_write(x, _i(0))
    L.array_write(x, _i(2), array=arr)  # element 1 is never written
    r = L.array_read(arr, k)
    xv = np.ones(2, np.float32)
    (g,) = _run(mode, main, {"x": xv, "k": np.array([0], np.int64)}, [n_empty])
    assert g.tolist() == [0]
    (g,) = _run(mode, main, {"x": xv, "k": np.array([2], np.int64)}, [r])
    np.testing.assert_array_equal(g, xv)
    with pytest.raises(fluid.OpRunError,
                       match=r"read_from_array.*I is 5: out of range .* of 3 element"):
        _run(mode, main, {"x": xv, "k": np.array([5], np.int64)}, [r])
    with pytest.raises(fluid.OpRunError, match=r"read_from_array.*element 1 .*never written"):
        _run(mode, main, {"x": xv, "k": np.array([1], np.int64)}, [r])
    with pytest.raises(fluid.OpRunError, match=r"read_from_array.*non-negative"):
        _run(mode, main, {"x": xv, "k": np.array([-1], np.int64)}, [r])


def test_array_layers_refuse_non_arrays(fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
    with pytest.raises(TypeError, match="tensor array"):
        L.array_read(x, _i(0))
    with pytest.raises(TypeError, match="tensor array"):
        L.array_length(x)
    with pytest.raises(TypeError, match="tensor array"):
        L.array_write(x, _i(0), array=x)


@pytest.mark.parametrize("mode", MODES)
def test_increment_not_in_place(mode, fresh_programs):
    main, _ = fresh_programs
    i = L.data(name="i", shape=[1], dtype="float32", append_batch_size=False)
    j = L.increment(i, value=2.5, in_place=False)
    assert j.name != i.name
    k = L.increment(i, value=-1.0)
    assert k is i
    gj, gi = _run(mode, main, {"i": np.array([1.0], np.float32)}, [j, i])
    np.testing.assert_allclose(gj, [3.5])
    np.testing.assert_allclose(gi, [0.0])
