"""``gru_unit`` and ``lstm_unit`` (``pdjit.layers.rnn_units``) against NumPy steps written here
from the parameters the startup program made, and their gradients by finite differences."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.op_test import assert_native
from pdjit.testing.program_grad import check_program_grad

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(8)
H = 3


def sig(z):
    return 1 / (1 + np.exp(-z))


def np_gru(x, h, w, b, origin):
    flat = w.reshape(-1)
    w_ur, w_c = flat[:2 * H * H].reshape(H, 2 * H), flat[2 * H * H:].reshape(H, H)
    g = x + b
    ur = sig(g[:, :2 * H] + h @ w_ur)
    u, r = ur[:, :H], ur[:, H:]
    c = np.tanh(g[:, 2 * H:] + (r * h) @ w_c)
    new = u * h + (1 - u) * c if origin else (1 - u) * h + u * c
    return new, r * h, np.concatenate([u, r, c], 1)


def test_gru_unit_and_lstm_unit_against_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 3 * H], "float64")
        h = fluid.data("h", [-1, H], "float64")
        c = fluid.data("c", [-1, H], "float64")
        xt = fluid.data("xt", [-1, 2], "float64")
        g1 = fluid.layers.gru_unit(x, h, 3 * H)
        g2 = fluid.layers.gru_unit(x, h, 3 * H, origin_mode=True,
                                   bias_attr=fluid.ParamAttr(
                                       initializer=fluid.initializer.Constant(0.25)))
        lh, lc = fluid.layers.lstm_unit(xt, h, c, forget_bias=0.5)
        with pytest.raises(LayerInputError, match=r"gru_unit: argument 'size' must be 3 \*"):
            fluid.layers.gru_unit(x, h, 8)
    scope = Scope()
    exe = Executor()
    exe.run(startup, scope=scope)
    params = {p.name: np.asarray(scope.find_var(p.name).value)
              for p in main.global_block().all_parameters()}
    feed = {"x": RNG.normal(size=(2, 3 * H)), "h": RNG.normal(size=(2, H)),
            "c": RNG.normal(size=(2, H)), "xt": RNG.normal(size=(2, 2))}
    got = exe.run(main, feed=feed, fetch_list=[*g1, *g2, lh, lc], scope=scope)
    assert_native(exe, "rnn units")
    assert sorted(params) == ["fc_0.b_0", "fc_0.w_0", "gru_unit_0.b_0", "gru_unit_0.w_0",
                              "gru_unit_1.b_0", "gru_unit_1.w_0"]
    assert params["gru_unit_0.w_0"].shape == (H, 3 * H)
    assert params["gru_unit_1.b_0"].shape == (1, 3 * H) and (params["gru_unit_1.b_0"] == .25).all()
    want = [*np_gru(feed["x"], feed["h"], params["gru_unit_0.w_0"], params["gru_unit_0.b_0"],
                    False),
            *np_gru(feed["x"], feed["h"], params["gru_unit_1.w_0"], params["gru_unit_1.b_0"],
                    True)]
    gates = np.concatenate([feed["xt"], feed["h"]], 1) @ params["fc_0.w_0"] + params["fc_0.b_0"]
    i, f, o, g = (gates[:, k * H:(k + 1) * H] for k in range(4))
    cell = sig(f + 0.5) * feed["c"] + sig(i) * np.tanh(g)
    want += [sig(o) * np.tanh(cell), cell]
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-10, err_msg=f"output {k}")


def test_gru_unit_gradient():
    def build():
        x = fluid.data("x", [2, 3 * H], "float64")
        h = fluid.data("h", [2, H], "float64")
        x.stop_gradient = h.stop_gradient = False
        return fluid.layers.gru_unit(x, h, 3 * H)[0], [x, h]

    check_program_grad(build, {"x": RNG.normal(size=(2, 3 * H)), "h": RNG.normal(size=(2, H))})
