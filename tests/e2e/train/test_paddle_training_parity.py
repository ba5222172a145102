"""Training parity with PaddlePaddle: fit-a-line, 10 SGD steps, same losses (1e-5).

Oracles (tests/fixtures/paddle/, written by PaddlePaddle 3.3.1 in legacy mode): the initial
parameters, the per-step predictions, losses and gradients Paddle computed, and Paddle's own
serialized training program.
"""
import pathlib

import numpy as np
import pytest

import pdjit as fluid

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "paddle"
STEPS = np.load(FIXTURES / "fit_a_line_steps.npz")


def _init_scope(scope, names):
    for n in names:
        scope.var(n).value = STEPS[f"init/{n}"].copy()


@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_pdjit_built_fit_a_line_gives_paddles_losses(mode):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[1], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        y_predict = fluid.layers.fc(input=x, size=1, act=None)
        cost = fluid.layers.square_error_cost(input=y_predict, label=y)
        avg_cost = fluid.layers.mean(cost)
        fluid.optimizer.SGD(learning_rate=0.01).minimize(avg_cost)
    scope, exe = fluid.Scope(), fluid.Executor(mode=mode)
    exe.run(startup, scope=scope)
    _init_scope(scope, ["fc_0.w_0", "fc_0.b_0"])
    for step in range(10):
        pred, loss, gw = exe.run(main, feed={"x": STEPS["feed/x"], "y": STEPS["feed/y"]},
                                 fetch_list=[y_predict, avg_cost, "fc_0.w_0@GRAD"], scope=scope)
        assert loss.shape == (1,)  # Fluid 1.x's [1]; Paddle 3.3.1 gives the same value 0-d
        np.testing.assert_allclose(pred, STEPS["step/y_predict"][step], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss, STEPS["step/avg_cost"][step], rtol=1e-5)
        np.testing.assert_allclose(gw, STEPS["step/fc_0.w_0@GRAD"][step], rtol=1e-5, atol=1e-6)
    for n in ("fc_0.w_0", "fc_0.b_0"):
        np.testing.assert_allclose(scope.find_var(n).value, STEPS[f"final/{n}"], rtol=1e-5)


@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_paddles_own_training_program_runs_as_it_is(mode):
    main = fluid.Program.parse_from_string((FIXTURES / "fit_a_line_main.pb").read_bytes())
    lr = next(v.name for v in main.list_vars() if v.name.startswith("learning_rate"))
    scope, exe = fluid.Scope(), fluid.Executor(mode=mode)
    _init_scope(scope, ["fc_0.w_0", "fc_0.b_0"])
    scope.var(lr).value = STEPS["init/learning_rate_0"].copy()
    for step in range(10):
        (loss,) = exe.run(main, feed={"x": STEPS["feed/x"], "y": STEPS["feed/y"]},
                          fetch_list=["mean_0.tmp_0"], scope=scope)
        np.testing.assert_allclose(loss, STEPS["step/avg_cost"][step], rtol=1e-5)
    np.testing.assert_allclose(scope.find_var("fc_0.w_0").value, STEPS["final/fc_0.w_0"],
                               rtol=1e-5)


def test_pdjit_training_program_matches_paddles_op_sequence():
    """The backward and update ops pdjit appends are Paddle's, in Paddle's order."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[1], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        y_predict = fluid.layers.fc(input=x, size=1, act=None)
        avg_cost = fluid.layers.mean(fluid.layers.square_error_cost(input=y_predict, label=y))
        fluid.optimizer.SGD(learning_rate=0.01).minimize(avg_cost)
    paddle = fluid.Program.parse_from_string((FIXTURES / "fit_a_line_main.pb").read_bytes())
    ours = [op.type for op in main.global_block().ops]
    theirs = [op.type for op in paddle.global_block().ops]
    # pdjit's layers.mean emits Fluid 1.x's `mean` op where paddle.mean emits reduce_mean
    ours = ["reduce_mean" if t == "mean" else "reduce_mean_grad" if t == "mean_grad" else t
            for t in ours]
    assert ours == theirs
    roles = [op.attr("op_role") for op in main.global_block().ops]
    assert roles == [op.attr("op_role") for op in paddle.global_block().ops]
