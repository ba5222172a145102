"""The cuda target renders the same kernel descriptions as the cpu target: every loop form of
elementwise chains and reductions, launched on device arrays, against NumPy written here."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cuda import device
from pdjit.codegen.cuda import target as cuda_target
from pdjit.codegen.kernel import LoopKernel
from pdjit.testing.op_test import assert_native

R = np.random.RandomState(7)


def _run(build, feed, strict=True):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        fetch = build()
    exe = fluid.Executor(fluid.CUDAPlace(0), strict=strict)
    got = exe.run(main, feed=feed, fetch_list=fetch)
    assert assert_native(exe) >= 1
    kinds = {(s.kind, s.device is not None) for _, plan in exe._plans.values()
             for s in plan.walk()}
    assert ("native", True) in kinds, kinds
    return got, exe


def _data(name, shape, dtype="float32"):
    return fluid.layers.data(name, shape, dtype=dtype, append_batch_size=False)


def _forms(exe) -> set:
    return {line.split("# form ")[1] for _, plan in exe._plans.values()
            for _, text in plan.sources for line in text.splitlines() if "# form " in line}


X3 = R.randn(2, 3, 4).astype("float32")
ROW = R.randn(4).astype("float32")      # a row leaf
MID = R.randn(3).astype("float32")      # a mid leaf (axis 1)
FORMS = {
    "flat": (lambda X, B: fluid.layers.sigmoid(fluid.layers.scale(X, scale=1.5, bias=-0.25)),
             None, lambda x, b: 1 / (1 + np.exp(-(1.5 * x - 0.25)))),
    "row": (lambda X, B: fluid.layers.tanh(fluid.layers.elementwise_add(X, B)), ROW,
            lambda x, b: np.tanh(x + b)),
    "mid": (lambda X, B: fluid.layers.relu(fluid.layers.elementwise_mul(X, B, axis=1)), MID,
            lambda x, b: np.maximum(x * b[None, :, None], 0)),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_elementwise_forms(form, transfers):
    build_fn, other, want = FORMS[form]
    feed = {"x": X3} if other is None else {"x": X3, "b": other}

    def build():
        X = _data("x", [2, 3, 4])
        B = None if other is None else _data("b", list(other.shape))
        return [build_fn(X, B)]

    (got,), exe = _run(build, feed)
    np.testing.assert_allclose(got, want(X3, other), rtol=1e-6, atol=1e-6)
    assert _forms(exe) == {form}
    t = transfers()
    assert t["h2d"] == len(feed) and t["d2h"] == 1, t   # feeds in once, the fetch out once


def test_strided_broadcast_and_math_helpers():
    x = (R.rand(3, 1, 5) + 0.5).astype("float64")
    y = (R.rand(1, 4, 5) + 0.5).astype("float64")

    def build():
        X, Y = _data("x", [3, 1, 5], "float64"), _data("y", [1, 4, 5], "float64")
        s = fluid.layers.elementwise_add(X, Y)
        return [fluid.layers.log(s), fluid.layers.sqrt(s), fluid.layers.exp(-s),
                fluid.layers.softplus(s)]

    (lg, sq, ex, sp), exe = _run(build, {"x": x, "y": y})
    s = x + y
    np.testing.assert_allclose(lg, np.log(s), rtol=1e-12)
    np.testing.assert_allclose(sq, np.sqrt(s), rtol=1e-12)
    np.testing.assert_allclose(ex, np.exp(-s), rtol=1e-12)
    np.testing.assert_allclose(sp, np.logaddexp(0, s), rtol=1e-12)
    assert "strided" in _forms(exe)


@pytest.mark.parametrize("dim,keep", [(None, False), ([1, 2], False), ([1], True), ([0, 2], False)])
def test_reductions(dim, keep):
    x = R.randn(3, 4, 5).astype("float32")

    def build():
        X = _data("x", [3, 4, 5])
        e = fluid.layers.elementwise_mul(X, X)
        return [fluid.layers.reduce_sum(e, dim=dim, keep_dim=keep),
                fluid.layers.reduce_max(X, dim=dim, keep_dim=keep),
                fluid.layers.reduce_mean(X, dim=dim, keep_dim=keep)]

    (s, mx, mn), exe = _run(build, {"x": x})
    axis = None if dim is None else tuple(dim)
    np.testing.assert_allclose(s, (x * x).sum(axis=axis, keepdims=keep).astype("float32"),
                               rtol=1e-5)
    np.testing.assert_allclose(mx, x.max(axis=axis, keepdims=keep), rtol=0)
    np.testing.assert_allclose(mn, x.mean(axis=axis, keepdims=keep), rtol=1e-5, atol=1e-7)
    forms = _forms(exe)
    assert forms & {"reduce_all", "reduce_rows", "reduce_block", "reduce_strided"}, forms


def test_reduction_over_more_elements_than_a_block():
    # several strides of the block's threads per output, and several outputs per block
    x = R.randn(9, 70).astype("float32")

    def build():
        X = _data("x", [9, 70])
        return [fluid.layers.reduce_sum(X, dim=1), fluid.layers.reduce_min(X)]

    (s, mn), _ = _run(build, {"x": x})
    np.testing.assert_allclose(s, x.sum(1), rtol=1e-5, atol=1e-5)
    assert mn == x.min()


def test_bad_feed_shape_is_a_clear_error():
    def build():
        X, B = _data("x", [2, 3]), _data("b", [3])
        return [fluid.layers.elementwise_add(X, B)]

    with pytest.raises(Exception, match="x"):
        _run(build, {"x": np.zeros((2, 4), "float32"), "b": np.zeros(3, "float32")})


def test_render_is_the_same_description():
    """The cuda target renders the description the cpu target renders: the same statements,
    a grid-stride loop instead of a range."""
    from pdjit.codegen.cpu import target as cpu
    from pdjit.codegen.kernel import FULL, Leaf

    k = LoopKernel(1, [Leaf(1, 0, (-1,), FULL)], ["e1 = _m.exp(x0)"], [("e1", "np.float32",
                                                                       frozenset({0}))], 0)
    src_cpu, src_cuda = cpu.render(k), cuda_target.render(k)
    assert "e1 = _m.exp(x0)" in src_cpu and "e1 = _m.exp(x0)" in src_cuda
    assert "cuda.grid(1)" in src_cuda and "cuda.gridsize(1)" in src_cuda
    assert device.is_device_array(device.to_device(np.zeros(3)))


def test_nan_inf_check_names_the_op(monkeypatch):
    monkeypatch.setenv("PDJIT_CHECK_NAN_INF", "1")

    def build():
        X = _data("x", [2, 3])
        return [fluid.layers.scale(fluid.layers.log(X), scale=2.0)]

    with pytest.raises(Exception, match="log"):
        _run(build, {"x": np.array([[1, 2, 3], [4, -1, 6]], "float32")})
