"""Fluid 1.8's remaining activation layers (``pdjit.layers.activation``): outputs against
NumPy written here, gradients against finite differences of the same NumPy functions, all in one
compiled program (strict mode: native code asserted), plus the reference executor."""
import math

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError, LayerTypeError
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.op_test import assert_native

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

# values away from every kink of the functions below; attributes exact in float32 (attributes
# are float32, as in Fluid)
X = np.array([[-2.7, -1.3, -0.45, -0.2, 0.1, 0.35],
              [0.55, 0.9, 1.2, 1.7, 2.6, 3.1]])
_erf = np.vectorize(math.erf)


def _round(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


# layer name -> (layer call, NumPy forward, input transform, differentiable)
CASES = {
    "brelu": (lambda x: fluid.layers.brelu(x, t_min=-1.0, t_max=2.0),
              lambda v: np.clip(v, -1.0, 2.0), None, True),
    "soft_relu": (lambda x: fluid.layers.soft_relu(x, threshold=40.0),
                  lambda v: np.log1p(np.exp(v)), None, True),
    "stanh": (lambda x: fluid.layers.stanh(x, scale_a=0.75, scale_b=1.5),
              lambda v: 1.5 * np.tanh(0.75 * v), None, True),
    "hard_shrink": (lambda x: fluid.layers.hard_shrink(x, threshold=0.5),
                    lambda v: np.where(np.abs(v) > 0.5, v, 0.0), None, True),
    "softshrink": (lambda x: fluid.layers.softshrink(x, alpha=0.375),
                   lambda v: np.where(v > 0.375, v - 0.375, np.where(v < -0.375, v + 0.375, 0.0)),
                   None, True),
    "thresholded_relu": (lambda x: fluid.layers.thresholded_relu(x, threshold=1.0),
                         lambda v: np.where(v > 1.0, v, 0.0), None, True),
    "logsigmoid": (fluid.layers.logsigmoid, lambda v: np.log(1 / (1 + np.exp(-v))), None, True),
    "softsign": (fluid.layers.softsign, lambda v: v / (1 + np.abs(v)), None, True),
    "tanh_shrink": (fluid.layers.tanh_shrink, lambda v: v - np.tanh(v), None, True),
    "sin": (fluid.layers.sin, np.sin, None, True),
    "cos": (fluid.layers.cos, np.cos, None, True),
    "acos": (fluid.layers.acos, np.arccos, lambda v: v * 0.3, True),
    "asin": (fluid.layers.asin, np.arcsin, lambda v: v * 0.3, True),
    "atan": (fluid.layers.atan, np.arctan, None, True),
    "erf": (fluid.layers.erf, _erf, None, True),
    "pow": (lambda x: fluid.layers.pow(x, factor=2.5), lambda v: v ** 2.5,
            lambda v: np.abs(v) + 0.1, True),
    "round": (fluid.layers.round, _round, None, False),
}


@pytest.fixture(scope="module")
def program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ins, outs, feed = {}, {}, {}
        w = fluid.data("w", [2, 6], "float64")
        total = []
        for name, (layer, _, tr, diff) in CASES.items():
            x = fluid.data(f"x_{name}", [2, 6], "float64")
            x.stop_gradient = False
            ins[name], outs[name] = x, layer(x)
            feed[x.name] = tr(X) if tr else X
            if diff:
                total.append(fluid.layers.reduce_sum(outs[name] * w))
        loss = fluid.layers.sums(total)
        names = [n for n, c in CASES.items() if c[3]]
        grads = dict(zip(names, gradients([loss], [ins[n] for n in names])))
    feed["w"] = np.random.default_rng(3).uniform(0.5, 1.5, (2, 6))
    return main, feed, outs, grads


@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_activations_and_gradients(program, mode):
    main, feed, outs, grads = program
    exe = Executor(mode=mode)
    fetch = list(outs.values()) + list(grads.values())
    got = exe.run(main, feed=feed, fetch_list=fetch, scope=Scope())
    if mode == "compiled":
        assert_native(exe, "activations")
    got_out = dict(zip(outs, got[:len(outs)]))
    got_grad = dict(zip(grads, got[len(outs):]))
    h = 1e-6
    for name, (_, fn, tr, diff) in CASES.items():
        v = tr(X) if tr else X
        np.testing.assert_allclose(got_out[name], fn(v), rtol=1e-12, atol=1e-12, err_msg=name)
        assert got_out[name].dtype == np.float64 and got_out[name].shape == (2, 6)
        if diff:
            numeric = (fn(v + h) - fn(v - h)) / (2 * h) * feed["w"]
            np.testing.assert_allclose(got_grad[name], numeric, rtol=1e-6, atol=1e-8,
                                       err_msg=f"d{name}/dx")


def test_round_halves_away_from_zero_and_layer_errors():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [4], "float32")
        y = fluid.layers.round(x)
        with pytest.raises(LayerInputError, match=r"brelu: expected t_min <= t_max"):
            fluid.layers.brelu(x, t_min=2.0, t_max=1.0)
        with pytest.raises(LayerTypeError, match=r"pow: argument 'factor'"):
            fluid.layers.pow(x, factor=x)
    got, = Executor().run(main, feed={"x": np.array([-2.5, -0.5, 0.5, 1.5], np.float32)},
                          fetch_list=[y], scope=Scope())
    np.testing.assert_array_equal(got, np.array([-3.0, -1.0, 1.0, 2.0], np.float32))
