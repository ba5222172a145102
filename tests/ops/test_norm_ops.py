"""batch_norm, instance_norm, group_norm and their gradients against NumPy; the layers.

The expected values are NumPy formulas written here (statistics in float64 over the channel
groups of the data moved to NCHW). They include what Paddle 3.3.1's CPU kernels do, measured
with Paddle: the running variance moves with the *biased* batch variance, SavedVariance holds
``1 / sqrt(var + epsilon)``, group_norm's Variance the variance itself, and a batch of one value
per channel passes X through.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit import layers
from pdjit.framework.errors import OpShapeError, ProgramError
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_output
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(7)
GRADS = {"X@GRAD": 1, "Scale@GRAD": 1, "Bias@GRAD": 1}


# ---- NumPy oracle ------------------------------------------------------------------------------
def chan(x, layout):
    return x.ndim - 1 if layout == "NHWC" and x.ndim > 2 else 1


def grouped(a, ch, groups):
    """``a`` (float64) as ``(N, G, C / G, rest)``, channels moved to dim 1."""
    a = np.moveaxis(np.asarray(a, np.float64), ch, 1)
    return a.reshape(a.shape[0], groups, a.shape[1] // groups, -1)


def ungrouped(v, like, ch):
    moved = np.moveaxis(np.empty(like.shape), ch, 1).shape
    return np.moveaxis(v.reshape(moved), 1, ch)


def per_channel(v, x, ch):
    shape = [1] * x.ndim
    shape[ch] = -1
    return np.asarray(v, np.float64).reshape(shape)


def np_norm(x, ch, groups, per_sample, eps, scale=None, bias=None, stats=None):
    """(y float64, mean, var) with mean/var shaped to broadcast over ``grouped(x)``;
    ``eps`` as the float32 attribute holds it."""
    eps = float(np.float32(eps))
    v = grouped(x, ch, groups)
    axes = (2, 3) if per_sample else (0, 2, 3)
    mean, var = stats if stats is not None else (v.mean(axes, keepdims=True),
                                                 v.var(axes, keepdims=True))
    y = ungrouped((v - mean) / np.sqrt(var + eps), x, ch)
    if scale is not None:
        y = y * per_channel(scale, x, ch)
    if bias is not None:
        y = y + per_channel(bias, x, ch)
    return y, mean, var


def np_norm_grad(x, dy, ch, groups, per_sample, mean, inv, scale, batch_stats):
    v, g = grouped(x, ch, groups), grouped(dy, ch, groups)
    axes = (2, 3) if per_sample else (0, 2, 3)
    xhat = (v - mean) * inv
    if scale is not None:
        g = g * grouped(np.broadcast_to(per_channel(scale, x, ch), x.shape), ch, groups)
    if batch_stats:
        dx = inv * (g - g.mean(axes, keepdims=True) - xhat * (g * xhat).mean(axes, keepdims=True))
    else:
        dx = inv * g
    others = tuple(i for i in range(x.ndim) if i != ch)
    dscale = (dy * ungrouped(xhat, x, ch)).sum(others)
    return ungrouped(dx, x, ch), dscale, dy.astype(np.float64).sum(others)


def params(c, dtype):
    return (RNG.uniform(0.5, 1.5, c).astype(dtype), RNG.uniform(-1, 1, c).astype(dtype),
            RNG.uniform(-0.5, 0.5, c).astype(dtype), RNG.uniform(0.5, 2, c).astype(dtype))


# ---- batch_norm --------------------------------------------------------------------------------
BN_CASES = [((2, 3, 4, 5), "NCHW", "float32"), ((2, 4, 5, 3), "NHWC", "float64"),
            ((5, 3), "NCHW", "float32"), ((1, 3, 7), "NCHW", "float64"),
            ((2, 3, 2, 3, 2), "NCHW", "float32"), ((1, 5, 3), "NHWC", "float32")]


@pytest.mark.parametrize("shape,layout,dtype", BN_CASES)
def test_batch_norm_training(shape, layout, dtype):
    x = RNG.normal(1.0, 2.0, shape).astype(dtype)
    ch = chan(x, layout)
    c = shape[ch]
    scale, bias, mean, var = params(c, dtype)
    eps, momentum = 1e-4, 0.8
    y, bm, bv = np_norm(x, ch, c, False, eps, scale, bias)
    m = float(np.float32(momentum))
    bm, bv = bm.reshape(c), bv.reshape(c)
    check_output("batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                                "Variance": var},
                 {"epsilon": eps, "momentum": momentum, "data_layout": layout},
                 {"Y": y.astype(dtype), "MeanOut": (m * mean + (1 - m) * bm).astype(dtype),
                  "VarianceOut": (m * var + (1 - m) * bv).astype(dtype),
                  "SavedMean": bm.astype(dtype),
                  "SavedVariance": (1 / np.sqrt(bv + np.float32(eps))).astype(dtype)},
                 batch_unknown={"X"})


@pytest.mark.parametrize("attrs", [{"is_test": True}, {"use_global_stats": True},
                                   {"is_test": True, "data_layout": "NHWC"}])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_norm_global_statistics(attrs, dtype):
    shape = (3, 4, 2, 5) if attrs.get("data_layout") != "NHWC" else (3, 2, 5, 4)
    x = RNG.normal(size=shape).astype(dtype)
    ch = chan(x, attrs.get("data_layout", "NCHW"))
    scale, bias, mean, var = params(4, dtype)
    stats = (per_channel(mean, np.empty((1, 4)), 1)[:, :, None, None],
             per_channel(var, np.empty((1, 4)), 1)[:, :, None, None])
    y, _, _ = np_norm(x, ch, 4, False, 1e-5, scale, bias, stats)
    inv = 1 / np.sqrt(var.astype(np.float64) + np.float32(1e-5))
    check_output("batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                                "Variance": var}, attrs,
                 {"Y": y.astype(dtype), "MeanOut": mean, "VarianceOut": var,
                  "SavedMean": mean, "SavedVariance": inv.astype(dtype)}, batch_unknown={"X"})


def test_batch_norm_trainable_statistics_momentum_tensor_and_relu():
    x = RNG.normal(size=(4, 3, 5)).astype("float32")
    scale, bias, mean, var = params(3, "float32")
    y, bm, bv = np_norm(x, 1, 3, False, 1e-5, scale, bias)
    mt = np.array([0.25], "float32")  # replaces momentum
    check_output("batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                                "Variance": var, "MomentumTensor": mt},
                 {"is_test": True, "trainable_statistics": True, "fuse_with_relu": True},
                 {"Y": np.maximum(y, 0).astype("float32"),
                  "MeanOut": (0.25 * mean + 0.75 * bm.reshape(3)).astype("float32"),
                  "VarianceOut": (0.25 * var + 0.75 * bv.reshape(3)).astype("float32")})


@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1, 1)])
def test_batch_norm_one_value_per_channel_passes_x_through(shape):
    x = RNG.normal(size=shape).astype("float64")
    scale, bias, mean, var = params(3, "float64")
    zeros = np.zeros(3)
    check_output("batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                                "Variance": var}, {},
                 {"Y": x, "MeanOut": mean, "VarianceOut": var, "SavedMean": zeros,
                  "SavedVariance": zeros})
    check_output("batch_norm_grad", {"X": x, "Scale": scale, "Bias": bias, "SavedMean": zeros,
                                     "SavedVariance": zeros, "Y@GRAD": x * 2}, {},
                 {"X@GRAD": x * 2, "Scale@GRAD": zeros, "Bias@GRAD": zeros}, outputs=GRADS)


def test_batch_norm_without_scale_and_bias():
    x = RNG.normal(size=(3, 2, 4)).astype("float32")
    _, _, mean, var = params(2, "float32")
    y, _, _ = np_norm(x, 1, 2, False, 1e-5)
    check_output("batch_norm", {"X": x, "Mean": mean, "Variance": var}, {},
                 {"Y": y.astype("float32")})


@pytest.mark.parametrize("shape,layout,attrs", [
    ((2, 3, 2, 3), "NCHW", {}), ((2, 2, 3, 3), "NHWC", {}), ((4, 3), "NCHW", {}),
    ((2, 3, 2, 3), "NCHW", {"use_global_stats": True}),
    ((2, 2, 3, 3), "NHWC", {"is_test": True})])
def test_batch_norm_grad_op(shape, layout, attrs):
    x = RNG.normal(size=shape).astype("float32")
    dy = RNG.normal(size=shape).astype("float32")
    ch = chan(x, layout)
    scale, bias, mean, var = params(3, "float32")
    batch = not attrs
    if batch:
        v = grouped(x, ch, 3)
        m, vr = v.mean((0, 2, 3), keepdims=True), v.var((0, 2, 3), keepdims=True)
    else:
        m, vr = (mean.astype(np.float64).reshape(1, 3, 1, 1),
                 var.astype(np.float64).reshape(1, 3, 1, 1))
    inv = 1 / np.sqrt(vr + np.float32(1e-5))
    dx, ds, db = np_norm_grad(x, dy, ch, 3, False, m, inv, scale, batch)
    saved_mean = m.reshape(3).astype("float32") if batch else np.zeros(3, "float32")
    saved_inv = inv.reshape(3).astype("float32") if batch else np.zeros(3, "float32")
    check_output("batch_norm_grad",
                 {"X": x, "Scale": scale, "Bias": bias, "MeanOut": mean, "VarianceOut": var,
                  "SavedMean": saved_mean, "SavedVariance": saved_inv, "Y@GRAD": dy},
                 dict(attrs, data_layout=layout),
                 {"X@GRAD": dx.astype("float32"), "Scale@GRAD": ds.astype("float32"),
                  "Bias@GRAD": db.astype("float32")}, outputs=GRADS, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,attrs", [((3, 2, 2, 2), {}), ((3, 2, 2), {"data_layout": "NHWC"}),
                                         ((2, 3, 2), {"use_global_stats": True})])
def test_batch_norm_grad_finite_differences(shape, attrs):
    x = RNG.normal(size=shape)
    c = shape[chan(x, attrs.get("data_layout", "NCHW"))]
    scale, bias, mean, var = params(c, "float64")
    check_grad("batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                              "Variance": var}, attrs, ("X", "Scale", "Bias"), "Y",
               max_relative_error=1e-5, atol=1e-6)


def test_batch_norm_bad_input_is_refused():
    x = np.ones((2, 3, 4), "float32")
    ok = {"X": x, "Scale": np.ones(3, "float32"), "Bias": np.zeros(3, "float32"),
          "Mean": np.zeros(3, "float32"), "Variance": np.ones(3, "float32")}
    with pytest.raises(OpShapeError, match=r"epsilon must lie in \[0, 0.001\], got 0.01"):
        build_op_program("batch_norm", ok, {"epsilon": 0.01})
    with pytest.raises(OpShapeError, match=r"Scale must have shape \[4\].*got \[3\]"):
        build_op_program("batch_norm", ok, {"data_layout": "NHWC"})
    with pytest.raises(OpShapeError, match="data_layout must be 'NCHW' or 'NHWC', got 'NCW'"):
        build_op_program("batch_norm", ok, {"data_layout": "NCW"})
    with pytest.raises(OpShapeError, match=r"X must have rank 2..5, got shape \[3\]"):
        build_op_program("batch_norm", dict(ok, X=np.ones(3, "float32")))
    prog, _, _ = build_op_program("batch_norm", ok, {"fuse_with_relu": True})
    with pytest.raises(ProgramError, match="fuse_with_relu=True has no gradient"):
        gradients([prog.global_block().var("out_y_0")], [prog.global_block().var("x_0")])


# ---- instance_norm -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dtype,affine", [((2, 3, 4, 5), "float32", True),
                                                ((1, 4, 7), "float64", True),
                                                ((3, 2), "float32", True),
                                                ((2, 3, 2, 2, 3), "float64", False)])
def test_instance_norm(shape, dtype, affine):
    x = RNG.normal(2.0, 3.0, shape).astype(dtype)
    c = shape[1]
    scale, bias, _, _ = params(c, dtype)
    inputs = {"X": x, "Scale": scale, "Bias": bias} if affine else {"X": x}
    y, m, v = np_norm(x, 1, c, True, 1e-3, *((scale, bias) if affine else ()))
    check_output("instance_norm", inputs, {"epsilon": 1e-3},
                 {"Y": y.astype(dtype), "SavedMean": m.reshape(-1).astype(dtype),
                  "SavedVariance": (1 / np.sqrt(v + np.float32(1e-3))).reshape(-1).astype(dtype)},
                 batch_unknown={"X"})


def test_instance_norm_grad_op():
    x, dy = RNG.normal(size=(2, 3, 5)).astype("float32"), RNG.normal(size=(2, 3, 5))
    dy = dy.astype("float32")
    scale, bias, _, _ = params(3, "float32")
    v = grouped(x, 1, 3)
    m, inv = v.mean((2, 3), keepdims=True), 1 / np.sqrt(v.var((2, 3), keepdims=True) + 1e-5)
    dx, ds, db = np_norm_grad(x, dy, 1, 3, True, m, inv, scale, True)
    check_output("instance_norm_grad",
                 {"X": x, "Scale": scale, "Bias": bias, "SavedMean": m.reshape(-1),
                  "SavedVariance": inv.reshape(-1), "Y@GRAD": dy}, {},
                 {"X@GRAD": dx.astype("float32"), "Scale@GRAD": ds.astype("float32"),
                  "Bias@GRAD": db.astype("float32")}, outputs=GRADS, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,affine", [((2, 3, 2, 3), True), ((1, 2, 5), False)])
def test_instance_norm_grad_finite_differences(shape, affine):
    x = RNG.normal(size=shape)
    scale, bias, _, _ = params(shape[1], "float64")
    inputs = {"X": x, "Scale": scale, "Bias": bias} if affine else {"X": x}
    check_grad("instance_norm", inputs, {}, tuple(inputs), "Y", max_relative_error=1e-5,
               atol=1e-6)


# ---- group_norm --------------------------------------------------------------------------------
GN_CASES = [((2, 6, 3, 4), "NCHW", 3, "float32"), ((2, 4, 5, 6), "NHWC", 2, "float64"),
            ((1, 4, 3), "NCHW", 4, "float32"), ((3, 6), "NCHW", 2, "float64"),
            ((2, 3, 2, 2), "NCHW", 1, "float32")]


@pytest.mark.parametrize("shape,layout,groups,dtype", GN_CASES)
def test_group_norm(shape, layout, groups, dtype):
    x = RNG.normal(-1.0, 2.0, shape).astype(dtype)
    ch = chan(x, layout)
    scale, bias, _, _ = params(shape[ch], dtype)
    y, m, v = np_norm(x, ch, groups, True, 1e-5, scale, bias)
    n = shape[0]
    check_output("group_norm", {"X": x, "Scale": scale, "Bias": bias},
                 {"groups": groups, "data_layout": layout},
                 {"Y": y.astype(dtype), "Mean": m.reshape(n, groups).astype(dtype),
                  "Variance": v.reshape(n, groups).astype(dtype)}, batch_unknown={"X"})


def test_group_norm_without_scale():
    x = RNG.normal(size=(2, 4, 3)).astype("float32")
    _, bias, _, _ = params(4, "float32")
    y, _, _ = np_norm(x, 1, 2, True, 1e-5, None, bias)
    check_output("group_norm", {"X": x, "Bias": bias}, {"groups": 2}, {"Y": y.astype("float32")})


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_group_norm_grad_op(layout):
    shape = (2, 4, 3, 2) if layout == "NCHW" else (2, 3, 2, 4)
    x = RNG.normal(size=shape).astype("float32")
    dy = RNG.normal(size=shape).astype("float32")
    ch = chan(x, layout)
    scale, bias, _, _ = params(4, "float32")
    y, m, v = np_norm(x, ch, 2, True, 1e-5, scale, bias)
    dx, ds, db = np_norm_grad(x, dy, ch, 2, True, m, 1 / np.sqrt(v + np.float32(1e-5)), scale,
                              True)
    check_output("group_norm_grad",
                 {"X": x, "Y": y.astype("float32"), "Scale": scale, "Bias": bias,
                  "Mean": m.reshape(2, 2).astype("float32"),
                  "Variance": v.reshape(2, 2).astype("float32"), "Y@GRAD": dy},
                 {"groups": 2, "data_layout": layout},
                 {"X@GRAD": dx.astype("float32"), "Scale@GRAD": ds.astype("float32"),
                  "Bias@GRAD": db.astype("float32")}, outputs=GRADS, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,layout,groups,slots", [
    ((2, 4, 3), "NCHW", 2, ("X", "Scale", "Bias")), ((2, 3, 4), "NHWC", 2, ("X", "Scale")),
    ((1, 4, 2, 2), "NCHW", 4, ("X", "Bias"))])  # no Scale: Paddle's kernel gets dX wrong here
def test_group_norm_grad_finite_differences(shape, layout, groups, slots):
    x = RNG.normal(size=shape)
    scale, bias, _, _ = params(shape[chan(x, layout)], "float64")
    inputs = {"X": x, "Scale": scale, "Bias": bias}
    inputs = {k: v for k, v in inputs.items() if k in slots}
    check_grad("group_norm", inputs, {"groups": groups, "data_layout": layout}, slots, "Y",
               max_relative_error=1e-5, atol=1e-6)


def test_group_norm_groups_must_divide_channels():
    x = np.ones((2, 6, 3), "float32")
    with pytest.raises(OpShapeError, match=r"groups=4 must divide the 6 channels"):
        build_op_program("group_norm", {"X": x}, {"groups": 4})
    with pytest.raises(OpShapeError, match="groups must be >= 1, got -1"):
        build_op_program("group_norm", {"X": x})


# ---- layers ------------------------------------------------------------------------------------
def _moving_stats(main):
    return [main.global_block().var(n) for n in ("batch_norm_0.w_1", "batch_norm_0.w_2")]


def test_batch_norm_layer_trains_moving_statistics_and_tests_with_them(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [3, 2, 2])
    y = layers.batch_norm(x, act="relu", momentum=0.5)
    loss = layers.mean(layers.fc(y, size=1))
    test = main.clone(for_test=True)
    fluid.optimizer.SGD(0.5).minimize(loss)
    names = {p.name: p for p in main.global_block().all_parameters()}
    assert {"batch_norm_0.w_0", "batch_norm_0.b_0"} <= set(names)
    for v in _moving_stats(main):
        assert v.persistable and not v.trainable and v.stop_gradient
    block = main.global_block()
    grad_outs = {n for op in block.ops for n in op.output_arg_names if n.endswith("@GRAD")}
    assert "batch_norm_0.w_0@GRAD" in grad_outs
    assert not any("batch_norm_0.w_1" in n or "batch_norm_0.w_2" in n for n in grad_outs)
    assert "fill_zeros_like" not in [op.type for op in block.ops]
    updated = {op.input("Param")[0] for op in block.ops if op.type == "sgd"}
    assert not updated & {"batch_norm_0.w_1", "batch_norm_0.w_2"}
    (bn,) = [op for op in test.global_block().ops if op.type == "batch_norm"]
    assert bn.attr("is_test")

    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    xs = [RNG.normal(1.0, 2.0, (4, 3, 2, 2)).astype("float32") for _ in range(2)]
    m, v = np.zeros(3), np.ones(3)
    for xv in xs:
        scale0 = np.array(scope.find_var("batch_norm_0.w_0").value)
        exe.run(main, feed={"x": xv}, fetch_list=[loss], scope=scope)
        m = 0.5 * m + 0.5 * xv.mean((0, 2, 3))
        v = 0.5 * v + 0.5 * xv.var((0, 2, 3))
        np.testing.assert_allclose(scope.find_var("batch_norm_0.w_1").value, m, rtol=1e-5,
                                   atol=1e-6)  # (a mean near zero: float32 rounding)
        np.testing.assert_allclose(scope.find_var("batch_norm_0.w_2").value, v, rtol=1e-5)
        assert not np.allclose(scope.find_var("batch_norm_0.w_0").value, scale0)  # trained
    assert_native(exe)

    (got,) = exe.run(test, feed={"x": xs[0]}, fetch_list=[y.name], scope=scope)
    scale, bias = (scope.find_var(f"batch_norm_0.{n}").value for n in ("w_0", "b_0"))
    want = np_norm(xs[0], 1, 3, False, 1e-5, scale, bias,
                   (m.reshape(1, 3, 1, 1), v.reshape(1, 3, 1, 1)))[0]
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scope.find_var("batch_norm_0.w_1").value, m, rtol=1e-5, atol=1e-6)
    assert_native(exe)


def test_batch_norm_layer_options_and_gradients(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [2, 3, 4], stop_gradient=False)
    mom = layers.fill_constant([1], "float32", 0.3)
    y = layers.batch_norm(x, data_layout="NHWC", momentum=mom, param_attr=False,
                          moving_mean_name="mm", moving_variance_name="mv")
    (bn,) = [op for op in main.global_block().ops if op.type == "batch_norm"]
    assert bn.input("MomentumTensor") == [mom.name] and not bn.input("Scale")
    assert bn.input("Mean") == bn.output("MeanOut") == ["mm"]
    assert bn.output("VarianceOut") == ["mv"] and bn.attr("data_layout") == "NHWC"
    (dx,) = gradients([layers.mean(y)], [x])
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    xv = RNG.normal(size=(3, 2, 3, 4)).astype("float32")
    got_y, got_dx = exe.run(main, feed={"x": xv}, fetch_list=[y, dx], scope=scope)
    want, bm, _ = np_norm(xv, 3, 4, False, 1e-5)
    np.testing.assert_allclose(got_y, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_dx, np.zeros_like(xv), atol=1e-4)  # d(sum of normalised)/dx
    np.testing.assert_allclose(scope.find_var("mm").value, 0.7 * bm.reshape(4), rtol=1e-5)
    assert_native(exe)


def test_instance_and_group_norm_layers(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [4, 3])
    a = layers.instance_norm(x)
    b = layers.group_norm(x, groups=2, act="relu")
    c = layers.group_norm(x, groups=4, param_attr=fluid.ParamAttr(name="gs"), bias_attr=True)
    params_ = {p.name for p in main.global_block().all_parameters()}
    assert params_ == {"instance_norm_0.w_0", "instance_norm_0.b_0", "gs", "group_norm_1.b_0"}
    ops = [op for op in main.global_block().ops if op.type == "group_norm"]
    assert not ops[0].input("Scale") and ops[1].input("Scale") == ["gs"]
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    xv = RNG.normal(size=(2, 4, 3)).astype("float32")
    got = exe.run(main, feed={"x": xv}, fetch_list=[a, b, c], scope=scope)
    np.testing.assert_allclose(got[0], np_norm(xv, 1, 4, True, 1e-5)[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], np.maximum(np_norm(xv, 1, 2, True, 1e-5)[0], 0),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2], np_norm(xv, 1, 4, True, 1e-5)[0], rtol=1e-4, atol=1e-5)
    assert_native(exe)
    with pytest.raises(ValueError, match="groups must be a positive int dividing the 4"):
        layers.group_norm(x, groups=3)


def test_batch_norm_in_a_native_while_loop(fresh_programs):
    """The host lines (a branch included) also compile inside a native loop's driver."""
    main, startup = fresh_programs
    x = layers.data("x", [2, 3, 4], append_batch_size=False)
    i, n = layers.fill_constant([1], "int64", 0), layers.fill_constant([1], "int64", 3)
    h = layers.scale(x, scale=1.0)
    cond = layers.less_than(i, n)
    loop = layers.While(cond, is_test=True)
    with loop.block():
        layers.increment(i, value=1.0, in_place=True)
        y = layers.batch_norm(h, momentum=0.5) * 2.0 + 1.0
        code = fluid.framework.dtypes.to_code(y.dtype)  # h = y, as a lowerable cast
        main.current_block().append_op("cast", inputs={"X": [y.name]}, outputs={"Out": [h.name]},
                                       attrs={"in_dtype": code, "out_dtype": code})
        layers.less_than(i, n, cond=cond)
    xv = RNG.normal(size=(2, 3, 4)).astype("float32")
    got, exes = {}, {}
    for mode in ("compiled", "reference"):
        exe = exes[mode] = Executor(mode=mode)
        scope = Scope()
        exe.run(startup, scope=scope)
        got[mode] = exe.run(main, feed={"x": xv}, fetch_list=[h, "batch_norm_0.w_1"],
                            scope=scope)
    assert "native_loop" in [s.kind for _, plan in exes["compiled"]._plans.values()
                             for s in plan.steps]
    assert_native(exes["compiled"])
    m, hv = np.zeros(3), xv.astype(np.float64)
    for _ in range(3):
        m = 0.5 * m + 0.5 * hv.mean((0, 2))
        hv = np_norm(hv, 1, 3, False, 1e-5)[0] * 2 + 1
    for mode, (gh, gm) in got.items():
        np.testing.assert_allclose(gh, hv, rtol=1e-4, atol=1e-4, err_msg=mode)
        np.testing.assert_allclose(gm, m, rtol=1e-5, atol=1e-6, err_msg=mode)


# ---- the threaded path of the batch/instance/group norm kernels ---------------------------------
@pytest.fixture
def norm_threads(monkeypatch):
    """Large-data mode at small sizes: the samples split over 3 slices on the library threads;
    yields the count of threaded kernel runs."""
    from pdjit.codegen.cpu.lib import norm as nk

    runs = [0]
    on_parts = nk._on_parts

    def spy(*args, **kw):
        runs[0] += 1
        return on_parts(*args, **kw)
    monkeypatch.setattr(nk, "_NORM_PARALLEL_MIN", 0)
    monkeypatch.setattr(nk, "loop_threads", lambda: 3)
    monkeypatch.setattr(nk, "free_cores", lambda: 3)
    monkeypatch.setattr(nk, "_on_parts", spy)
    yield runs


@pytest.mark.parametrize("view,per_sample,cpg", [((5, 1, 6, 7), False, 1), ((4, 6, 5, 1), False, 1),
                                                 ((4, 1, 6, 5), True, 2), ((3, 4, 6, 1), True, 3)])
def test_norm_kernels_threaded_match_serial_and_numpy(norm_threads, monkeypatch, view, per_sample,
                                                      cpg):
    """The kernels on (A, P, C, R) views: threaded against the one-thread kernels and NumPy."""
    from pdjit.codegen.cpu import lib as nnlib
    from pdjit.codegen.cpu.lib import norm as nk

    a, p, c, r = view
    x = RNG.normal(1.0, 2.0, view).astype("float32")
    dy = RNG.normal(size=view).astype("float32")
    scale, bias, _, _ = params(c, "float32")
    k, g = (a if per_sample else 1), c // cpg
    # NumPy: (A, P, C, R) -> groups of (k, g)
    v = np.moveaxis(x.astype(np.float64), 2, 1).reshape(a, g, -1)
    axes = (2,) if per_sample else (0, 2)
    want_m = v.mean(axes).reshape(k, g)
    want_v = v.var(axes).reshape(k, g)
    got = {}
    for mode in ("threads", "serial"):
        m, var = np.empty((k, g)), np.empty((k, g))
        y, dx = np.empty_like(x), np.empty_like(x)
        ds, db = np.empty(c, np.float32), np.empty(c, np.float32)
        before = norm_threads[0]
        if mode == "serial":  # the same entry points, every pass one call on this thread
            monkeypatch.setattr(nk, "_NORM_PARALLEL_MIN", 1 << 40)
        nnlib.norm_stats(x, per_sample, cpg, m, var)
        inv = 1 / np.sqrt(var + 1e-5)
        nnlib.norm_apply(x, m, inv, scale, bias, per_sample, cpg, True, y)
        nnlib.norm_grad(x, dy, m, inv, scale, per_sample, cpg, True, dx, ds, db)
        assert norm_threads[0] - before == (5 if mode == "threads" else 0)  # 2 passes, 1, 2
        got[mode] = (m, var, y, dx, ds, db)
    for t, s in zip(got["threads"], got["serial"]):
        np.testing.assert_allclose(t, s, rtol=1e-6, atol=1e-6)
    m, var, y, dx, ds, db = got["threads"]
    np.testing.assert_allclose(m, want_m, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, want_v, rtol=1e-12, atol=1e-12)
    # y, dx and the parameter gradients against the NumPy formulas, channel by channel
    mc = np.repeat(want_m, cpg, axis=1)[:, None, :, None]
    ic = np.repeat(1 / np.sqrt(want_v + 1e-5), cpg, axis=1)[:, None, :, None]
    if not per_sample:
        mc, ic = mc[0], ic[0]
    xhat = (x - mc) * ic
    sc, bi = scale[None, None, :, None], bias[None, None, :, None]
    np.testing.assert_allclose(y, np.maximum(xhat * sc + bi, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ds, (dy * xhat).sum((0, 1, 3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, dy.astype(np.float64).sum((0, 1, 3)), rtol=1e-5, atol=1e-5)
    gg = np.moveaxis(dy * sc, 2, 1).reshape(a, g, -1)
    xh = np.moveaxis(np.broadcast_to(xhat, view), 2, 1).reshape(a, g, -1)
    ig = np.moveaxis(np.broadcast_to(ic, view), 2, 1).reshape(a, g, -1)
    want_dx = ig * (gg - gg.mean(axes, keepdims=True) - xh * (gg * xh).mean(axes, keepdims=True))
    want_dx = np.moveaxis(want_dx.reshape(a, c, p, r), 1, 2)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-5)


def test_norm_kernels_threaded_refuse_misfits(norm_threads):
    from pdjit.codegen.cpu import lib as nnlib

    x = np.zeros((4, 1, 6, 5), np.float32)
    with pytest.raises(ValueError, match="statistics do not fit"):
        nnlib.norm_stats(x, False, 4, np.empty((1, 1)), np.empty((1, 1)))
    with pytest.raises(ValueError, match="norm_apply: Scale, Bias or Y do not fit X"):
        nnlib.norm_apply(x, np.zeros((1, 6)), np.ones((1, 6)), np.ones(5, np.float32),
                         np.zeros(6, np.float32), False, 1, False, np.empty_like(x))
    with pytest.raises(ValueError, match="norm_grad: Scale, Y@GRAD or the gradients do not fit"):
        nnlib.norm_grad(x, x[:3], np.zeros((1, 6)), np.ones((1, 6)), np.ones(6, np.float32),
                        False, 1, True, np.empty_like(x), np.empty(6, np.float32),
                        np.empty(6, np.float32))


@pytest.mark.parametrize("shape,layout", [((4, 3, 2, 5), "NCHW"), ((5, 2, 3, 3), "NHWC")])
def test_batch_norm_ops_on_threads(norm_threads, shape, layout):
    """batch_norm and its grad op in compiled plans (native code asserted by check_output)
    with the kernels' threaded path, against NumPy."""
    x = RNG.normal(1.0, 2.0, shape).astype("float32")
    dy = RNG.normal(size=shape).astype("float32")
    ch = chan(x, layout)
    c = shape[ch]
    scale, bias, mean, var = params(c, "float32")
    y, bm, bv = np_norm(x, ch, c, False, 1e-5, scale, bias)
    check_output("batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                                "Variance": var}, {"data_layout": layout},
                 {"Y": y.astype("float32"), "SavedMean": bm.reshape(c).astype("float32")},
                 outputs={"Y": 1, "SavedMean": 1})
    inv = 1 / np.sqrt(bv + np.float32(1e-5))
    dx, ds, db = np_norm_grad(x, dy, ch, c, False, bm, inv, scale, True)
    check_output("batch_norm_grad",
                 {"X": x, "Scale": scale, "Bias": bias, "MeanOut": mean, "VarianceOut": var,
                  "SavedMean": bm.reshape(c).astype("float32"),
                  "SavedVariance": inv.reshape(c).astype("float32"), "Y@GRAD": dy},
                 {"data_layout": layout},
                 {"X@GRAD": dx.astype("float32"), "Scale@GRAD": ds.astype("float32"),
                  "Bias@GRAD": db.astype("float32")}, outputs=GRADS, rtol=1e-4, atol=1e-5)
    assert norm_threads[0] > 0


# ---- the conv-bn block's filter gradient (the ResNet benchmark's hot path) -----------------------
@pytest.mark.parametrize("hw,stride,k", [(24, 1, 3), (8, 1, 3), (32, 2, 1)])
def test_conv_filter_gradient_long_and_short_sums(hw, stride, k):
    """The filter gradient kernel computes the transposed product for 512+ columns per block (a
    24x24 plane) and the plain one below: both against NumPy."""
    from pdjit.codegen.cpu import lib as nnlib

    pad = k // 2
    x = RNG.normal(size=(3, 2, hw, hw)).astype("float32")
    oh = (hw + 2 * pad - k) // stride + 1
    dy = RNG.normal(size=(3, 4, oh, oh)).astype("float32")
    got = np.empty((4, 2, k, k), np.float32)
    nnlib.conv2d_bwd_filter(x, dy, got, stride, stride, pad, pad, 1, 1, 1)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    want = np.empty((4, 2, k, k))
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * oh:stride]
            want[:, :, i, j] = np.einsum("nmhw,nchw->mc", dy, patch)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
