"""layer_norm, gelu and their gradients against NumPy; the layers; a step of training.

The expected values are NumPy formulas written here, in float64: layer norm over the rows
``(prod(shape[:axis]), prod(shape[axis:]))`` with the biased variance (what Paddle 3.3.1's
kernel computes; Mean and Variance have X's leading dims), gelu from ``math.erf`` or the tanh
form. Native execution is asserted wherever compiled output is compared.
"""
import math

import numpy as np
import pytest

import pdjit as fluid
from pdjit import layers
from pdjit.codegen.cpu.lib import norm as nnlib_norm
from pdjit.framework.errors import OpShapeError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_output
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(16)
GRADS = {"X@GRAD": 1, "Scale@GRAD": 1, "Bias@GRAD": 1}
EPS32 = float(np.float32(1e-5))  # the float32 attribute's value


# ---- NumPy oracle ------------------------------------------------------------------------------
def np_layer_norm(x, axis, eps=1e-5, scale=None, bias=None):
    """(y, mean, var) in float64; mean and var of shape x.shape[:axis]."""
    lead = x.shape[:axis]
    rows = np.asarray(x, np.float64).reshape(int(np.prod(lead)), -1)
    mean = rows.sum(1) / rows.shape[1]
    var = ((rows - mean[:, None]) ** 2).sum(1) / rows.shape[1]
    y = (rows - mean[:, None]) / np.sqrt(var[:, None] + float(np.float32(eps)))
    if scale is not None:
        y = y * np.asarray(scale, np.float64)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return y.reshape(x.shape), mean.reshape(lead), var.reshape(lead)


def np_layer_norm_grad(x, dy, axis, scale, eps=1e-5):
    """(dx, dscale, dbias) through the batch statistics, written from the chain rule."""
    n = int(np.prod(x.shape[axis:]))
    rows = np.asarray(x, np.float64).reshape(-1, n)
    g = np.asarray(dy, np.float64).reshape(-1, n)
    mu = rows.mean(1, keepdims=True)
    sigma = np.sqrt(rows.var(1, keepdims=True) + float(np.float32(eps)))
    xhat = (rows - mu) / sigma
    w = np.ones(n) if scale is None else np.asarray(scale, np.float64)
    gx = g * w  # d loss / d xhat
    dx = (gx - gx.mean(1, keepdims=True) - xhat * (gx * xhat).mean(1, keepdims=True)) / sigma
    return dx.reshape(x.shape), (g * xhat).sum(0), g.sum(0)


_erf = np.vectorize(math.erf)


def np_gelu(x, approximate):
    x = np.asarray(x, np.float64)
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def np_gelu_deriv(x, approximate):
    x = np.asarray(x, np.float64)
    if approximate:
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (x + 0.044715 * x ** 3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    return 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)


# ---- layer_norm --------------------------------------------------------------------------------
LN_CASES = [((6, 8), 1, "float32", "both"), ((2, 3, 4), 2, "float64", "both"),
            ((2, 3, 5), 1, "float32", "none"), ((3, 2, 2, 3), 2, "float32", "scale"),
            ((4, 7), 1, "float64", "bias")]


@pytest.mark.parametrize("shape,axis,dtype,params", LN_CASES)
def test_layer_norm(shape, axis, dtype, params):
    x = RNG.normal(1.5, 2.0, shape).astype(dtype)
    n = int(np.prod(shape[axis:]))
    scale = RNG.uniform(0.5, 1.5, n).astype(dtype) if params in ("both", "scale") else None
    bias = RNG.uniform(-1, 1, n).astype(dtype) if params in ("both", "bias") else None
    y, mean, var = np_layer_norm(x, axis, 1e-5, scale, bias)
    inputs = {"X": x, "Scale": scale, "Bias": bias}
    check_output("layer_norm", {k: v for k, v in inputs.items() if v is not None},
                 {"begin_norm_axis": axis},
                 {"Y": y.astype(dtype), "Mean": mean.astype(dtype), "Variance": var.astype(dtype)},
                 batch_unknown={"X"}, atol=2e-6 if dtype == "float32" else None)


def test_layer_norm_runs_natively_and_defaults_to_axis_1():
    """One op through ``Executor(strict=True)``: native code only, Paddle's defaults."""
    x = RNG.normal(size=(5, 4, 3)).astype("float32")
    prog, feed, outs = build_op_program("layer_norm", {"X": x})
    exe = Executor(strict=True)
    y, mean, var = exe.run(prog, feed=feed, fetch_list=[outs[s][0] for s in
                                                        ("Y", "Mean", "Variance")],
                           scope=Scope())
    assert_native(exe)
    want_y, want_m, want_v = np_layer_norm(x, 1)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(mean, want_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, want_v, rtol=1e-5, atol=1e-6)
    assert mean.shape == (5,) and var.dtype == np.float32


@pytest.mark.parametrize("shape,axis,dtype,affine", [((4, 6), 1, "float32", True),
                                                     ((2, 3, 4), 2, "float64", False)])
def test_layer_norm_grad_op(shape, axis, dtype, affine):
    x = RNG.normal(size=shape).astype(dtype)
    dy = RNG.normal(size=shape).astype(dtype)
    n = int(np.prod(shape[axis:]))
    scale = RNG.uniform(0.5, 1.5, n).astype(dtype) if affine else None
    bias = RNG.uniform(-1, 1, n).astype(dtype) if affine else None
    _, mean, var = np_layer_norm(x, axis)
    dx, ds, db = np_layer_norm_grad(x, dy, axis, scale)
    inputs = {"X": x, "Mean": mean.astype(dtype), "Variance": var.astype(dtype), "Y@GRAD": dy}
    expected = {"X@GRAD": dx.astype(dtype)}
    outputs = {"X@GRAD": 1}
    if affine:
        inputs.update(Scale=scale, Bias=bias)
        expected.update({"Scale@GRAD": ds.astype(dtype), "Bias@GRAD": db.astype(dtype)})
        outputs = GRADS
    check_output("layer_norm_grad", inputs, {"begin_norm_axis": axis}, expected, outputs=outputs,
                 rtol=1e-4 if dtype == "float32" else None,
                 atol=1e-5 if dtype == "float32" else None)


def test_layer_norm_rows_split_over_threads(monkeypatch):
    """Large data runs its rows on several threads (the threshold lowered here): same values."""
    monkeypatch.setattr(nnlib_norm, "_LN_PARALLEL_MIN", 64)
    monkeypatch.setattr(nnlib_norm, "loop_threads", lambda: 3)
    splits = []
    split_work = nnlib_norm.split_work
    monkeypatch.setattr(nnlib_norm, "split_work",
                        lambda *a, **k: splits.append(a[1]) or split_work(*a, **k))
    shape = (7, 4, 16)
    x = RNG.normal(0.5, 2.0, shape).astype("float32")
    dy = RNG.normal(size=shape).astype("float32")
    scale, bias = RNG.uniform(0.5, 1.5, 16).astype("float32"), np.zeros(16, "float32")
    y, mean, var = np_layer_norm(x, 2, 1e-5, scale, bias)
    check_output("layer_norm", {"X": x, "Scale": scale, "Bias": bias}, {"begin_norm_axis": 2},
                 {"Y": y.astype("float32"), "Mean": mean.astype("float32"),
                  "Variance": var.astype("float32")}, atol=2e-6, modes=["compiled"])
    dx, ds, db = np_layer_norm_grad(x, dy, 2, scale)
    check_output("layer_norm_grad", {"X": x, "Scale": scale, "Bias": bias,
                                     "Mean": mean.astype("float32"),
                                     "Variance": var.astype("float32"), "Y@GRAD": dy},
                 {"begin_norm_axis": 2}, {"X@GRAD": dx.astype("float32"),
                                          "Scale@GRAD": ds.astype("float32"),
                                          "Bias@GRAD": db.astype("float32")},
                 outputs=GRADS, rtol=1e-4, atol=1e-5, modes=["compiled"])
    assert splits == [28], splits  # the forward pass split its 28 rows


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_rows_on_a_parallel_loop_equal_one_thread(monkeypatch, dtype):
    """Rows split over the threads of a parallel loop (``lib.team``; the threshold lowered,
    the loop compiled at its first ask): one thread's bits, and NumPy's values."""
    from pdjit.codegen.cpu.lib import team

    x = RNG.normal(0.5, 2.0, (37, 50)).astype(dtype)
    scale, bias = RNG.uniform(0.5, 1.5, 50).astype(dtype), RNG.normal(size=50).astype(dtype)

    def run():
        y, mean, var = np.empty_like(x), np.empty(37, dtype), np.empty(37, dtype)
        nnlib_norm.layer_norm_fwd(x, scale, bias, 1e-5, y, mean, var)
        return y, mean, var

    one = run()
    monkeypatch.setattr(nnlib_norm, "_LN_TEAM_MIN", 64)
    monkeypatch.setattr(nnlib_norm, "loop_threads", lambda: 2)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
    monkeypatch.setattr(team, "COMPILE", True)
    two = run()
    assert team._READY[(nnlib_norm._ln_fwd_parts, np.dtype(dtype))] is True
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    y, mean, var = np_layer_norm(x, 1, 1e-5, scale, bias)
    tol = 2e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(two[0], y, rtol=tol * 10, atol=tol * 10)
    np.testing.assert_allclose(two[1], mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(two[2], var, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape,axis,slots", [((3, 4), 1, ("X", "Scale", "Bias")),
                                              ((2, 3, 4), 2, ("X", "Scale", "Bias")),
                                              ((2, 2, 3), 1, ("X",)),
                                              ((3, 2, 2), 2, ("X", "Bias"))])
def test_layer_norm_grad_finite_differences(shape, axis, slots):
    x = RNG.normal(size=shape)
    n = int(np.prod(shape[axis:]))
    inputs = {"X": x, "Scale": RNG.uniform(0.5, 1.5, n), "Bias": RNG.uniform(-1, 1, n)}
    inputs = {k: v for k, v in inputs.items() if k in slots}
    check_grad("layer_norm", inputs, {"begin_norm_axis": axis}, slots, "Y",
               max_relative_error=1e-5, atol=1e-6)


def test_layer_norm_bad_input_is_refused():
    x = np.ones((2, 3, 4), "float32")
    with pytest.raises(OpShapeError, match=r"layer_norm: Scale must have shape \[12\].*got \[4\]"):
        build_op_program("layer_norm", {"X": x, "Scale": np.ones(4, "float32")})
    with pytest.raises(OpShapeError, match=r"layer_norm: Bias must have shape \[4\].*got \[12\]"):
        build_op_program("layer_norm", {"X": x, "Bias": np.ones(12, "float32")},
                         {"begin_norm_axis": 2})
    for axis in (0, 3):
        with pytest.raises(OpShapeError, match=rf"layer_norm: begin_norm_axis must lie in 1..2 "
                                               rf"for X of rank 3 .*got {axis}"):
            build_op_program("layer_norm", {"X": x}, {"begin_norm_axis": axis})
    with pytest.raises(OpShapeError, match=r"layer_norm: epsilon must lie in \[0, 0.001\]"):
        build_op_program("layer_norm", {"X": x}, {"epsilon": 0.01})
    with pytest.raises(OpShapeError, match="layer_norm: X: expected dtype"):
        build_op_program("layer_norm", {"X": x.astype("int32")})


# ---- gelu --------------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu(approximate, dtype):
    x = np.concatenate([RNG.normal(0, 3, 40), [0.0, -8.0, 8.0, -1e-3]]).astype(dtype)
    x = x.reshape(4, 11)
    check_output("gelu", {"X": x}, {"approximate": approximate},
                 {"Out": np_gelu(x, approximate).astype(dtype)},
                 atol=1e-6 if dtype == "float32" else 1e-12)
    dy = RNG.normal(size=x.shape).astype(dtype)
    # float32: the two terms of the derivative cancel for x near -3 (a few ulp of 0.5 apart)
    check_output("gelu_grad", {"X": x, "Out@GRAD": dy}, {"approximate": approximate},
                 {"X@GRAD": (np_gelu_deriv(x, approximate) * dy).astype(dtype)},
                 outputs={"X@GRAD": 1}, atol=1e-5 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-5), ("float64", 1e-13)])
def test_gelu_exact_form_keeps_its_tails(dtype, rtol):
    """The kernel's vectorised erfc against math.erfc in float64, tails included: relative
    error, not only absolute (1 + erf would cancel below -3). What remains is the rounding of
    the argument X / sqrt 2 in the data type (erfc's relative sensitivity is 2 a^2 there)."""
    x = np.linspace(-10, 10, 4001).astype(dtype).reshape(1, -1)
    prog, feed, outs = build_op_program("gelu", {"X": x})
    exe = Executor(strict=True)
    (got,) = exe.run(prog, feed=feed, fetch_list=[outs["Out"][0]], scope=Scope())
    assert_native(exe)
    v = x.astype(np.float64)
    want = v * 0.5 * np.vectorize(math.erfc)(-v / math.sqrt(2))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-37)


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_grad_finite_differences(approximate):
    check_grad("gelu", {"X": RNG.normal(0, 2, (3, 5))}, {"approximate": approximate}, ("X",),
               "Out", max_relative_error=1e-6, atol=1e-8)


# ---- layers and a step of training -------------------------------------------------------------
def test_layer_norm_and_gelu_layers_train_one_step_natively(fresh_programs):
    """data -> layer_norm (axis 2) -> gelu -> mean, one SGD step: the new scale and bias equal
    the NumPy chain rule's, and every step of both programs ran native code."""
    main, startup = fresh_programs
    x = layers.data("x", [3, 8], dtype="float32")
    h = layers.layer_norm(x, begin_norm_axis=2, epsilon=1e-5)
    loss = layers.mean(layers.gelu(h))
    fluid.optimizer.SGD(learning_rate=0.5).minimize(loss)
    assert [op.type for op in main.global_block().ops][:3] == ["layer_norm", "gelu", "mean"]
    assert {p.name for p in main.global_block().all_parameters()} == {"layer_norm_0.w_0",
                                                                      "layer_norm_0.b_0"}
    xv = RNG.normal(0.5, 2.0, (4, 3, 8)).astype("float32")
    exe, scope = Executor(strict=True), Scope()
    exe.run(startup, scope=scope)
    scale0 = np.array(scope.find_var("layer_norm_0.w_0").get_tensor())
    np.testing.assert_array_equal(scale0, np.ones(8, "float32"))
    (lv,) = exe.run(main, feed={"x": xv}, fetch_list=[loss], scope=scope)
    assert_native(exe)
    y, _, _ = np_layer_norm(xv, 2)  # scale 1, bias 0 at the start
    np.testing.assert_allclose(lv, np_gelu(y, False).mean(), rtol=1e-5)
    dy = np_gelu_deriv(y, False) / y.size
    _, dscale, dbias = np_layer_norm_grad(xv, dy, 2, np.ones(8))
    np.testing.assert_allclose(np.array(scope.find_var("layer_norm_0.w_0").get_tensor()),
                               1 - 0.5 * dscale, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(scope.find_var("layer_norm_0.b_0").get_tensor()),
                               -0.5 * dbias, rtol=1e-5, atol=1e-6)


def test_layer_norm_layer_options_and_errors(fresh_programs):
    x = layers.data("x", [2, 6], dtype="float64")
    y = layers.layer_norm(x, scale=False, shift=True, begin_norm_axis=1, act="relu")
    block = fluid.default_main_program().global_block()
    ln = [op for op in block.ops if op.type == "layer_norm"][0]
    assert ln.input("Scale") == [] and ln.input("Bias") == ["layer_norm_0.b_0"]
    assert block.var("layer_norm_0.b_0").shape == (12,) and y.dtype == x.dtype
    assert block.ops[-1].type == "relu"
    assert ln.attr("begin_norm_axis") == 1 and ln.attr("epsilon") == pytest.approx(1e-5)
    with pytest.raises(ValueError, match=r"layer_norm: begin_norm_axis must be an int in 1..2 "
                                         r"for input 'x'"):
        layers.layer_norm(x, begin_norm_axis=3)
    with pytest.raises(ValueError, match="param_attr must not be False when scale is True"):
        layers.layer_norm(x, param_attr=False)
    with pytest.raises(TypeError, match="layer_norm: argument 'input' must have dtype"):
        layers.layer_norm(layers.data("k", [3], dtype="int64"))
    g = layers.gelu(x, approximate=True)
    assert block.ops[-1].type == "gelu" and block.ops[-1].attr("approximate") is True
    assert g.shape == x.shape


def test_layer_norm_and_gelu_in_a_native_while_loop(fresh_programs):
    """The host lines of layer_norm compile inside a native loop's driver, gelu fuses there."""
    main, startup = fresh_programs
    x = layers.data("x", [3, 5], append_batch_size=False)
    i, n = layers.fill_constant([1], "int64", 0), layers.fill_constant([1], "int64", 3)
    h = layers.scale(x, scale=1.0)
    cond = layers.less_than(i, n)
    loop = layers.While(cond, is_test=True)
    with loop.block():
        layers.increment(i, value=1.0, in_place=True)
        y = layers.gelu(layers.layer_norm(h, scale=False, shift=False)) * 2.0
        layers.assign(y, h)
        layers.less_than(i, n, cond=cond)
    xv = RNG.normal(size=(3, 5)).astype("float32")
    exe = Executor(strict=True)
    (got,) = exe.run(main, feed={"x": xv}, fetch_list=[h], scope=Scope())
    assert "native_loop" in [s.kind for _, plan in exe._plans.values() for s in plan.steps]
    assert_native(exe)
    want = xv.astype(np.float64)
    for _ in range(3):
        want = np_gelu(np_layer_norm(want, 1)[0], False) * 2
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
