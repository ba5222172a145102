"""``fluid.layers.py_func``: a user's NumPy function as an op, forward and backward, in a
program that trains; its errors."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerTypeError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")


def tanh(x):
    return np.tanh(np.array(x))


def tanh_grad(y, dy):          # x skipped: reads the output and its gradient
    return np.array(dy) * (1 - np.square(np.array(y)))


def test_py_func_forward_backward_and_training():
    main, startup = fluid.Program(), fluid.Program()
    seen = []
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 3], "float32")
        h = fluid.layers.fc(x, 4)
        y = main.current_block().create_var(name="y", dtype="float32", shape=[-1, 4])
        fluid.layers.py_func(tanh, h, y, backward_func=tanh_grad,
                             skip_vars_in_backward_input=h)
        logged = main.current_block().create_var(name="logged", dtype="float32", shape=[1])
        fluid.layers.py_func(lambda v: (seen.append(np.array(v).shape) or
                                        np.array([np.array(v).sum()], np.float32)), y, logged)
        loss = fluid.layers.mean(fluid.layers.square(fluid.layers.fc(y, 1)))
        fluid.optimizer.SGD(0.2).minimize(loss)
        with pytest.raises(LayerTypeError, match=r"py_func: arguments 'func'"):
            fluid.layers.py_func(3, x, y)
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    xv = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    losses = []
    for _ in range(4):
        lv, yv, s = exe.run(main, feed={"x": xv}, fetch_list=[loss, y, logged], scope=scope)
        losses.append(float(np.asarray(lv).reshape(-1)[0]))
    assert seen and seen[0] == (5, 4)
    np.testing.assert_allclose(s, [yv.sum()], rtol=1e-5)
    assert losses[-1] < losses[0]


def test_py_func_gradient_by_finite_differences():
    from pdjit.testing.program_grad import check_program_grad

    def build():
        x = fluid.data("x", [2, 3], "float64")
        x.stop_gradient = False
        y = fluid.default_main_program().current_block().create_var(
            name="y", dtype="float64", shape=[2, 3])
        fluid.layers.py_func(tanh, x, y, backward_func=lambda x_, y_, dy: np.array(dy) * (
            1 - np.tanh(np.array(x_)) ** 2))
        return y, [x]

    check_program_grad(build, {"x": np.random.default_rng(1).normal(size=(2, 3))})
