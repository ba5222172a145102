"""The Fluid 1.x layers of pdjit.layers.shape_ops: built into a program, run, checked with NumPy."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.layers import shape_ops as L
from pdjit.layers.inputs import data

# op 'reshape2' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(reshape2)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(11)


def _run(main, feed, fetch):
    return fluid.Executor(fluid.CPUPlace()).run(main, feed=feed, fetch_list=fetch)


def _op_types(main):
    return [op.type for op in main.global_block().ops]


@pytest.mark.parametrize("layer,fn", [("reduce_sum", np.sum), ("reduce_mean", np.mean),
                                      ("reduce_max", np.max), ("reduce_min", np.min),
                                      ("reduce_prod", np.prod)])
@pytest.mark.parametrize("dim,keep", [(None, False), (1, False), ([1, 2], True), (-1, True),
                                      ([0, 1, 2], False)])
def test_reductions(fresh_programs, layer, fn, dim, keep):
    main, _ = fresh_programs
    x = data("x", [3, 4])
    out = getattr(L, layer)(x, dim=dim, keep_dim=keep)
    xv = RNG.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    axis = None if dim is None else tuple(dim) if isinstance(dim, list) else dim
    want = fn(xv.astype(np.float64), axis=axis, keepdims=keep)
    got, = _run(main, {"x": xv}, [out])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got.dtype == np.float32 and _op_types(main) == [layer]
    assert len(out.shape) == max(np.ndim(want), 1)  # a full reduction: Fluid 1.x's [1]
    assert got.ndim == len(out.shape)


def test_mean_and_sums(fresh_programs):
    main, _ = fresh_programs
    a, b, c = (data(n, [3]) for n in "abc")
    m = L.mean(a)
    s = L.sums([a, b, c])
    av, bv, cv = (RNG.normal(size=(2, 3)).astype(np.float32) for _ in range(3))
    mv, sv = _run(main, {"a": av, "b": bv, "c": cv}, [m, s])
    assert mv.shape == (1,) and m.shape == (1,)  # Fluid 1.x declares a scalar [1]
    np.testing.assert_allclose(mv, av.mean(), rtol=1e-6)
    np.testing.assert_allclose(sv, av + bv + cv, rtol=1e-6)
    assert s.shape == (-1, 3)


def test_reshape_transpose_squeeze_unsqueeze(fresh_programs):
    main, _ = fresh_programs
    x = data("x", [3, 4])
    r = L.reshape(x, [0, -1], act="relu")
    t = L.transpose(x, perm=[0, 2, 1])
    u = L.unsqueeze(x, axes=[1])
    s = L.squeeze(u, axes=[1])
    assert r.shape == (-1, 12) and t.shape == (-1, 4, 3) and u.shape == (-1, 1, 3, 4)
    assert s.shape == (-1, 3, 4)
    assert _op_types(main) == ["reshape2", "relu", "transpose2", "unsqueeze2", "squeeze2"]
    xv = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    rv, tv, uv, sv = _run(main, {"x": xv}, [r, t, u, s])
    np.testing.assert_array_equal(rv, np.maximum(xv.reshape(2, 12), 0))
    np.testing.assert_array_equal(tv, xv.transpose(0, 2, 1))
    np.testing.assert_array_equal(uv, xv[:, None])
    np.testing.assert_array_equal(sv, xv)
    xshape = main.global_block().ops[0].output("XShape")
    assert main.global_block().var(xshape[0]).shape == (0, -1, 3, 4)


def test_reshape_with_variable_dims(fresh_programs):
    main, _ = fresh_programs
    x = data("x", [6])
    n = data("n", [1], append_batch_size=False, dtype="int32")
    r = L.reshape(x, [n, -1])
    r2 = L.reshape(x, [3, 4], actual_shape=data("s", [2], append_batch_size=False,
                                                dtype="int64"))
    assert r.shape == (-1, -1) and r2.shape == (-1, -1)
    xv = np.arange(12, dtype=np.float32).reshape(2, 6)
    rv, r2v = _run(main, {"x": xv, "n": np.array([4], np.int32),
                          "s": np.array([6, 2], np.int64)}, [r, r2])
    np.testing.assert_array_equal(rv, xv.reshape(4, 3))
    np.testing.assert_array_equal(r2v, xv.reshape(6, 2))


def test_concat_split_stack(fresh_programs):
    main, _ = fresh_programs
    a, b = data("a", [2]), data("b", [3])
    c = L.concat([a, b], axis=1)
    p1, p2 = L.split(c, [1, -1], dim=1)
    q = L.split(c, 5)  # along the last dim (Fluid's default dim=-1)
    st = L.stack([a, a], axis=1)
    assert c.shape == (-1, 5) and p2.shape == (-1, 4) and len(q) == 5
    assert st.shape == (-1, 2, 2)
    av, bv = RNG.normal(size=(4, 2)).astype(np.float32), RNG.normal(size=(4, 3)).astype(np.float32)
    cv, p1v, p2v, q0, stv = _run(main, {"a": av, "b": bv}, [c, p1, p2, q[0], st])
    cw = np.concatenate([av, bv], 1)
    np.testing.assert_array_equal(cv, cw)
    np.testing.assert_array_equal(p1v, cw[:, :1])
    np.testing.assert_array_equal(p2v, cw[:, 1:])
    np.testing.assert_array_equal(q0, cw[:, :1])
    np.testing.assert_array_equal(stv, np.stack([av, av], 1))


def test_slice_gather_one_hot(fresh_programs):
    main, _ = fresh_programs
    x = data("x", [4, 5])
    ids = data("ids", [1], dtype="int64")
    sl = L.slice(x, axes=[1, 2], starts=[1, -3], ends=[3, 100])
    g = L.gather(x, L.reshape(ids, [-1]))
    oh = L.one_hot(ids, depth=5)
    assert sl.shape == (-1, 2, 3) and oh.shape == (-1, 5) and oh.dtype == np.float32  # Fluid 1.x
    xv = RNG.normal(size=(3, 4, 5)).astype(np.float32)
    iv = np.array([[2], [0]], np.int64)
    slv, gv, ohv = _run(main, {"x": xv, "ids": iv}, [sl, g, oh])
    np.testing.assert_array_equal(slv, xv[:, 1:3, 2:])
    np.testing.assert_array_equal(gv, xv[[2, 0]])
    np.testing.assert_array_equal(ohv, np.eye(5, dtype=np.float32)[iv[:, 0]])


def test_gather_out_of_range_names_the_op(fresh_programs):
    main, _ = fresh_programs
    x, ids = data("x", [2]), data("ids", [-1], append_batch_size=False, dtype="int64")
    g = L.gather(x, ids)
    with pytest.raises(OpRunError, match=r"gather.*index 5 is out of range"):
        _run(main, {"x": np.zeros((3, 2), np.float32), "ids": np.array([5])}, [g])


def test_argmax_argmin_topk(fresh_programs):
    main, _ = fresh_programs
    x = data("x", [5])
    mx, mn = L.argmax(x, axis=1), L.argmin(x, axis=-1)
    vals, idx = L.topk(x, k=2)
    assert mx.dtype == np.int64 and vals.shape == (-1, 2) and idx.dtype == np.int64
    assert _op_types(main) == ["arg_max", "arg_min", "top_k_v2"]
    xv = np.stack([RNG.permutation(5) for _ in range(3)]).astype(np.float32)
    mxv, mnv, vv, iv = _run(main, {"x": xv}, [mx, mn, vals, idx])
    np.testing.assert_array_equal(mxv, xv.argmax(1))
    np.testing.assert_array_equal(mnv, xv.argmin(1))
    order = np.argsort(-xv, axis=1)[:, :2]
    np.testing.assert_array_equal(iv, order)
    np.testing.assert_array_equal(vv, np.take_along_axis(xv, order, 1))


def test_layer_errors(fresh_programs):
    x = data("x", [3, 4])
    with pytest.raises(TypeError, match="reshape"):
        L.reshape(np.zeros(3), [3])
    with pytest.raises(TypeError, match="concat"):
        L.concat([x, "y"])
    with pytest.raises(OpShapeError, match=r"reshape2.*divide by 5"):
        L.reshape(x, [0, -1, 5])
    with pytest.raises(ValueError, match="transpose: perm must have one entry per dim"):
        L.transpose(x, [1, 0])
    with pytest.raises(OpShapeError, match="split.*divide by num=5"):
        L.split(x, 5, dim=2)
    with pytest.raises(OpShapeError, match="reduce_sum.*dim=3 is out of range"):
        L.reduce_sum(x, dim=3)
