"""The Fluid 1.8 layers of issue 16's indexing and building ops: built into a program, run
compiled and strictly (no fallback, no reference step), checked with NumPy written here."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.layers.inputs import data
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(161)


def _run(main, feed, fetch):
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    got = exe.run(main, feed=feed, fetch_list=fetch)
    steps = [s for _, plan in exe._plans.values() for s in plan.walk()]
    assert not [s.describe() for s in steps if s.kind == "reference"]
    assert_native(exe, "layers")
    return got


def _op_types(main):
    return [op.type for op in main.global_block().ops]


def test_expand_layer(fresh_programs):
    main, _ = fresh_programs
    x = data("x", [3], dtype="float64")  # [-1, 3]
    a = fluid.layers.expand(x, [2, 2])
    n = fluid.layers.fill_constant([1], "int32", 3)
    b = fluid.layers.expand(x, [n, 1])
    assert a.shape == (-1, 6) and b.shape == (-1, -1)
    xv = RNG.normal(size=(2, 3))
    av, bv = _run(main, {"x": xv}, [a, b])
    np.testing.assert_array_equal(av, np.tile(xv, (2, 2)))
    np.testing.assert_array_equal(bv, np.tile(xv, (3, 1)))
    assert _op_types(main).count("expand") == 2
    with pytest.raises(TypeError, match="expand: expand_times"):
        fluid.layers.expand(x, 2)


def test_where_layers(fresh_programs):
    main, _ = fresh_programs
    c = data("c", [2, 3], dtype="bool", append_batch_size=False)
    x = data("x", [2, 3], dtype="float64", append_batch_size=False)
    y = data("y", [2, 3], dtype="float64", append_batch_size=False)
    idx = fluid.layers.where(c)
    sel = fluid.layers.where(c, x, y)
    cv = np.array([[True, False, True], [False, False, True]])
    xv, yv = RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))
    iv, sv = _run(main, {"c": cv, "x": xv, "y": yv}, [idx, sel])
    np.testing.assert_array_equal(iv, [[0, 0], [0, 2], [1, 2]])
    assert iv.dtype == np.int64 and idx.shape == (-1, 2)
    np.testing.assert_array_equal(sv, [[xv[0, 0], yv[0, 1], xv[0, 2]],
                                       [yv[1, 0], yv[1, 1], xv[1, 2]]])
    assert _op_types(main) == ["where_index", "where"]
    with pytest.raises(TypeError, match="both x and y"):
        fluid.layers.where(c, x)


def test_cumsum_gather_nd_scatter_argsort(fresh_programs):
    main, _ = fresh_programs
    x = data("x", [3, 4], dtype="float64", append_batch_size=False)
    ids = data("ids", [2, 1], dtype="int64", append_batch_size=False)
    upd = data("upd", [2, 4], dtype="float64", append_batch_size=False)
    cs = fluid.layers.cumsum(x)
    cs0 = fluid.layers.cumsum(x, axis=0, exclusive=True, reverse=True)
    g = fluid.layers.gather_nd(x, ids)
    sc = fluid.layers.scatter(x, fluid.layers.reshape(ids, [-1]), upd, overwrite=False)
    srt, order = fluid.layers.argsort(x, axis=1, descending=True)
    xv = np.round(RNG.normal(size=(3, 4)), 1)
    iv = np.array([[2], [0]], np.int64)
    uv = RNG.normal(size=(2, 4))
    got = _run(main, {"x": xv, "ids": iv, "upd": uv}, [cs, cs0, g, sc, srt, order])
    want_cs0 = np.zeros_like(xv)
    want_cs0[0], want_cs0[1] = xv[1] + xv[2], xv[2]
    sc_want = xv.copy()
    sc_want[[2, 0]] = uv
    ord_want = np.array([sorted(range(4), key=lambda j, r=r: (-r[j], j)) for r in xv])
    for a, w in zip(got, [np.cumsum(xv, 1), want_cs0, xv[[2, 0]], sc_want,
                          np.take_along_axis(xv, ord_want, 1), ord_want]):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)
    assert [op.attr("axis") for op in main.global_block().ops if op.type == "cumsum"] == [-1, 0]


def test_range_and_like_layers(fresh_programs):
    main, _ = fresh_programs
    x = data("x", [2, 3], dtype="float32", append_batch_size=False)
    end = fluid.layers.fill_constant([1], "int32", 7)
    r1 = fluid.layers.range(1, end, 2, "int64")
    r2 = fluid.layers.range(0.0, 1.0, 0.25, "float32")
    z, o = fluid.layers.zeros_like(x), fluid.layers.ones_like(x)
    xv = RNG.normal(size=(2, 3)).astype(np.float32)
    a, b, zv, ov = _run(main, {"x": xv}, [r1, r2, z, o])
    np.testing.assert_array_equal(a, [1, 3, 5])
    assert a.dtype == np.int64
    np.testing.assert_array_equal(b, np.array([0, 0.25, 0.5, 0.75], np.float32))
    np.testing.assert_array_equal(zv, np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(ov, np.ones((2, 3), np.float32))
    assert "fill_any_like" in _op_types(main) and "fill_zeros_like" in _op_types(main)


def test_training_through_the_index_layers(fresh_programs):
    """SGD on a parameter read through expand, cumsum, gather_nd and where: the first loss is
    NumPy's and the loss falls (the gradients themselves are checked op by op)."""
    main, startup = fresh_programs
    ids = data("ids", [2, 1], dtype="int64", append_batch_size=False)
    c = data("c", [2, 6], dtype="bool", append_batch_size=False)
    w = fluid.layers.create_parameter([3, 3], "float64", name="w",
                                      default_initializer=fluid.initializer.Constant(0.5))
    e = fluid.layers.expand(w, [1, 2])              # [3, 6]
    s = fluid.layers.cumsum(e, axis=1)              # [3, 6]
    picked = fluid.layers.gather_nd(s, ids)         # [2, 6]
    chosen = fluid.layers.where(c, picked, fluid.layers.zeros_like(picked))
    loss = fluid.layers.mean(fluid.layers.square(chosen))
    fluid.optimizer.SGD(learning_rate=0.01).minimize(loss)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    iv = np.array([[2], [0]], np.int64)
    cv = RNG.random((2, 6)) > 0.3
    losses = [float(exe.run(main, feed={"ids": iv, "c": cv}, fetch_list=[loss])[0][0])
              for _ in range(3)]
    assert losses[2] < losses[1] < losses[0]
    # the first step's loss, from NumPy
    s0 = np.cumsum(np.tile(np.full((3, 3), 0.5), (1, 2)), axis=1)
    np.testing.assert_allclose(losses[0], np.mean(np.where(cv, s0[[2, 0]], 0) ** 2), rtol=1e-12)
    assert_native(exe, "training")
