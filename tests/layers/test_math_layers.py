"""Layers over the elementwise and creation ops, and the initializers, run end to end."""
import math

import numpy as np
import pytest
from scipy import stats

import pdjit as fluid
from pdjit import initializer as init


def _run(main, feed, fetch, startup=None):
    scope, exe = fluid.Scope(), fluid.Executor()
    if startup is not None:
        exe.run(startup, scope=scope)
    return exe.run(main, feed=feed, fetch_list=fetch, scope=scope), scope


def test_elementwise_layers_and_activation(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3, 4], dtype="float32")
    b = fluid.layers.data(name="b", shape=[3], dtype="float32", append_batch_size=False)
    y = fluid.layers.elementwise_add(x, b, axis=1, act="relu")
    z = fluid.layers.elementwise_mul(y, y)
    w = fluid.layers.leaky_relu(fluid.layers.scale(x, scale=-1.0, bias=0.5), alpha=0.1)
    c = fluid.layers.clip(x, -0.5, 0.5)
    k = fluid.layers.cast(x, "float64")
    xv = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    bv = np.array([0.1, -5.0, 0.3], np.float32)
    (yy, zz, ww, cc, kk), _ = _run(main, {"x": xv, "b": bv}, [y, z, w, c, k])
    want_y = np.maximum(xv + bv[None, :, None], 0)
    np.testing.assert_allclose(yy, want_y, rtol=1e-6)
    np.testing.assert_allclose(zz, want_y * want_y, rtol=1e-6)
    s = -xv + 0.5
    np.testing.assert_allclose(ww, np.where(s > 0, s, 0.1 * s), rtol=1e-6)
    np.testing.assert_array_equal(cc, np.clip(xv, -0.5, 0.5))
    assert kk.dtype == np.float64


def test_comparison_and_logical_layers(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[4], dtype="int64")
    limit = fluid.layers.fill_constant_batch_size_like(x, shape=[-1, 4], dtype="int64", value=5)
    lt = fluid.layers.less_than(x, limit)
    ge = fluid.layers.greater_equal(x, limit)
    both = fluid.layers.logical_and(lt, fluid.layers.logical_not(ge))
    xv = np.array([[1, 5, 9, 4], [6, 0, 5, 7]], np.int64)
    (a, b, c), _ = _run(main, {"x": xv}, [lt, ge, both])
    np.testing.assert_array_equal(a, xv < 5)
    np.testing.assert_array_equal(b, xv >= 5)
    np.testing.assert_array_equal(c, xv < 5)
    assert lt.stop_gradient


def test_fill_constant_assign_create_global_var(fresh_programs):
    main, startup = fresh_programs
    f = fluid.layers.fill_constant([2, 2], "int64", 7)
    big = fluid.layers.fill_constant([1], "int64", 2 ** 40 + 1)
    arr = np.array([[1.5, 2.5], [-1.0, 0.25]], np.float32)
    a = fluid.layers.assign(arr)
    g = fluid.layers.create_global_var([3], 2.5, "float32", persistable=True, name="gv")
    copy = fluid.layers.assign(g)
    (ff, bb, aa, cc), scope = _run(main, {}, [f, big, a, copy], startup)
    np.testing.assert_array_equal(ff, np.full((2, 2), 7))
    assert bb[0] == 2 ** 40 + 1
    np.testing.assert_array_equal(aa, arr)
    np.testing.assert_array_equal(cc, [2.5, 2.5, 2.5])
    np.testing.assert_array_equal(scope.find_var("gv").value, [2.5, 2.5, 2.5])
    assert fluid.layers.zeros([2], "float32").shape == (2,)
    assert fluid.layers.ones([2, 1], "int32").dtype == np.int32


def _init_values(initializer, shape, seed=17):
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = seed
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        fluid.layers.create_parameter(shape, "float32", name="p", default_initializer=initializer)
    _, scope = _run(main, {}, [], startup)
    return scope.find_var("p").value


def test_constant_and_uniform_and_normal_initializers():
    np.testing.assert_array_equal(_init_values(init.Constant(0.75), [3, 2]), np.full((3, 2), 0.75))
    u = _init_values(init.Uniform(-0.3, 0.2), [100, 100]).reshape(-1).astype(np.float64)
    assert u.min() >= -0.3 and u.max() < 0.2
    assert stats.kstest(u, stats.uniform(-0.3, 0.5).cdf).pvalue > 1e-3
    n = _init_values(init.Normal(0.5, 0.1), [100, 100]).reshape(-1).astype(np.float64)
    assert stats.kstest(n, stats.norm(0.5, 0.1).cdf).pvalue > 1e-3
    t = _init_values(init.TruncatedNormal(0.0, 1.0), [100, 100])
    assert np.abs(t).max() <= 2.0


@pytest.mark.parametrize("shape,fan_in,fan_out", [([64, 32], 64, 32), ([8, 4, 3, 3], 36, 72)])
def test_xavier_and_msra_use_fluid_fans(shape, fan_in, fan_out):
    assert init.compute_fans(shape) == (fan_in, fan_out)
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    x = _init_values(init.Xavier(), shape).reshape(-1).astype(np.float64)
    assert np.abs(x).max() <= limit and np.abs(x).max() > 0.9 * limit
    assert stats.kstest(x, stats.uniform(-limit, 2 * limit).cdf).pvalue > 1e-4
    xn = _init_values(init.Xavier(uniform=False), shape).reshape(-1).astype(np.float64)
    assert stats.kstest(xn, stats.norm(0, math.sqrt(2.0 / (fan_in + fan_out))).cdf).pvalue > 1e-4
    m = _init_values(init.MSRA(), shape).reshape(-1).astype(np.float64)
    assert np.abs(m).max() <= math.sqrt(6.0 / fan_in)
    mn = _init_values(init.MSRA(uniform=False), shape).reshape(-1).astype(np.float64)
    assert stats.kstest(mn, stats.norm(0, math.sqrt(2.0 / fan_in)).cdf).pvalue > 1e-4


def test_initializer_and_param_attr_errors():
    with pytest.raises(ValueError, match="expected low <= high"):
        init.Uniform(1.0, 0.0)
    with pytest.raises(TypeError, match="initializer must be an Initializer"):
        fluid.ParamAttr(initializer="xavier")
    with pytest.raises(ValueError, match="unknown dims"):
        with fluid.program_guard(fluid.Program(), fluid.Program()):
            fluid.layers.create_parameter([-1, 3], "float32")
