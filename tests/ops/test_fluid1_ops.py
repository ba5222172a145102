"""Fluid 1.x's ``cos_sim``, ``log_loss`` and ``is_empty`` (ops and layers) against NumPy written
here, gradients against finite differences; log_loss and is_empty run natively."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import OpShapeError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_output
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(5)


def _cos(x, y):
    x2, y2 = x.reshape(len(x), -1), y.reshape(len(y), -1)
    num = (x2 * y2).sum(1)
    xn, yn = np.sqrt((x2 ** 2).sum(1)), np.sqrt((y2 ** 2).sum(1))
    return (num / (xn * yn)).reshape(-1, 1), xn.reshape(-1, 1), yn.reshape(-1, 1)


@pytest.mark.parametrize("y_rows", [3, 1])
def test_cos_sim_forward_and_gradient(y_rows):
    x = RNG.normal(size=(3, 2, 2))
    y = RNG.normal(size=(y_rows, 2, 2))
    out, xn, yn = _cos(x, np.broadcast_to(y, x.shape) if y_rows == 1 else y)
    for dt in (np.float32, np.float64):
        tol = 1e-5 if dt == np.float32 else 1e-12
        check_output("cos_sim", {"X": x.astype(dt), "Y": y.astype(dt)}, {},
                     {"Out": out.astype(dt), "XNorm": xn.astype(dt),
                      "YNorm": yn[:y_rows].astype(dt)}, rtol=tol, atol=tol)
    check_grad("cos_sim", {"X": x, "Y": y}, {}, ["X", "Y"])


def test_cos_sim_refuses_mismatched_inputs():
    with pytest.raises(OpShapeError, match="1 row or X's 3 rows"):
        build_op_program("cos_sim", {"X": np.ones((3, 4)), "Y": np.ones((2, 4))}, {})
    with pytest.raises(OpShapeError, match="one rank, at least 2"):
        build_op_program("cos_sim", {"X": np.ones(4), "Y": np.ones(4)}, {})


def test_log_loss_forward_gradient_and_native():
    p = RNG.uniform(0.05, 0.95, size=(5, 1))
    lab = (RNG.uniform(size=(5, 1)) > 0.5).astype(np.float64)
    eps = float(np.float32(1e-3))  # a FLOAT attribute: float32
    want = -lab * np.log(p + eps) - (1 - lab) * np.log(1 - p + eps)
    for dt in (np.float32, np.float64):
        tol = 2e-5 if dt == np.float32 else 1e-12
        check_output("log_loss", {"Predicted": p.astype(dt), "Labels": lab.astype(dt)},
                     {"epsilon": eps}, {"Loss": want.astype(dt)}, rtol=tol, atol=tol)
    check_grad("log_loss", {"Predicted": p, "Labels": lab}, {"epsilon": eps}, ["Predicted"],
               output_name="Loss")
    prog, feed, outs = build_op_program("log_loss", {"Predicted": p.astype(np.float32),
                                                     "Labels": lab.astype(np.float32)},
                                        {"epsilon": eps})
    exe = Executor(strict=True)
    got, = exe.run(prog, feed=feed, fetch_list=outs["Loss"], scope=Scope())
    assert_native(exe, "log_loss")
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_is_empty_and_the_layers_train():
    """is_empty on empty and non-empty tensors (compiled, native); a program with cos_sim and
    log_loss layers trains: the recommender's cosine score fitted by a log loss."""
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 3
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        u = fluid.layers.data("u", [4])
        m = fluid.layers.data("m", [4])
        rating = fluid.layers.data("rating", [1])
        empty = fluid.layers.is_empty(u)
        usr = fluid.layers.fc(u, 6, act="tanh")
        mov = fluid.layers.fc(m, 6, act="tanh")
        sim = fluid.layers.cos_sim(X=usr, Y=mov)
        prob = fluid.layers.scale(sim, scale=0.45, bias=0.5)        # in (0.05, 0.95)
        loss = fluid.layers.mean(fluid.layers.log_loss(prob, rating, epsilon=1e-4))
        fluid.optimizer.Adam(0.05).minimize(loss)
    assert empty.shape == (1,) and empty.dtype == np.bool_ and sim.shape == (-1, 1)
    uv = RNG.normal(size=(16, 4)).astype(np.float32)
    mv = RNG.normal(size=(16, 4)).astype(np.float32)
    rv = ((uv * mv).sum(1, keepdims=True) > 0).astype(np.float32)
    exe, scope = fluid.Executor(strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    losses = []
    for _ in range(40):
        lv, ev = exe.run(main, feed={"u": uv, "m": mv, "rating": rv}, fetch_list=[loss, empty],
                         scope=scope)
        losses.append(lv[0])
    assert ev.shape == (1,) and not ev[0]
    assert losses[-1] < 0.7 * losses[0], losses
    test = main.clone(for_test=True)
    ev, = exe.run(test, feed={"u": np.zeros((0, 4), np.float32),
                              "m": np.zeros((0, 4), np.float32),
                              "rating": np.zeros((0, 1), np.float32)},
                  fetch_list=[empty.name], scope=scope)
    assert ev.shape == (1,) and ev[0]


@pytest.mark.parametrize("y_rows", [4, 1])
def test_cos_sim_and_its_gradient_run_natively(y_rows):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.data("x", [4, 3], "float64")
        y = fluid.data("y", [y_rows, 3], "float64")
        x.stop_gradient = y.stop_gradient = False
        sim = fluid.layers.cos_sim(x, y)
        loss = fluid.layers.reduce_sum(sim * sim)
        gx, gy = fluid.gradients([loss], [x, y])
    feed = {"x": RNG.normal(size=(4, 3)), "y": RNG.normal(size=(y_rows, 3))}
    exe = Executor(strict=True)
    got = exe.run(main, feed=feed, fetch_list=[sim, gx, gy], scope=Scope())
    assert_native(exe)
    steps = [s for _, plan in exe._plans.values() for s in plan.walk()]
    assert not [s for s in steps if s.kind == "reference"], [s.describe() for s in steps]
    want = Executor(mode="reference").run(main, feed=feed, fetch_list=[sim, gx, gy],
                                          scope=Scope())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
    c, _, _ = _cos(feed["x"], np.broadcast_to(feed["y"], (4, 3)))
    np.testing.assert_allclose(got[0], c, rtol=1e-12)
