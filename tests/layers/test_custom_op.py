"""User-defined ops: defined once in Python, they fuse, differentiate, serialise and test."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.custom import define_op
from pdjit.framework import registry
from pdjit.testing import check_grad, check_output


@pytest.fixture(scope="module")
def softsign():
    layer = define_op(
        "test_softsign", attrs={"k": 1.0},
        reference=lambda X, k: X / (k + np.abs(X)),
        emit="{X} / ({T}({k}) + abs({X}))",
        grad=lambda X, dOut, k: dOut * k / (k + np.abs(X)) ** 2,
        grad_emit="{Out@GRAD} * {T}({k}) / (({T}({k}) + abs({X})) * ({T}({k}) + abs({X})))")
    yield layer
    registry.unregister_op("test_softsign")
    registry.unregister_op("test_softsign_grad")


def test_custom_op_output_and_gradient(softsign):
    x = np.linspace(-3, 3, 10).reshape(2, 5)
    check_output("test_softsign", {"X": x}, {"k": 2.0}, {"Out": x / (2 + np.abs(x))},
                 batch_unknown=True)
    check_grad("test_softsign", {"X": x + 0.05}, {"k": 2.0}, ["X"])


def test_custom_op_fuses_serialises_and_trains(softsign):
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 2
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        h = fluid.layers.scale(softsign(fluid.layers.fc(x, 8), k=1.5), scale=2.0)
        loss = fluid.layers.mean(fluid.layers.square_error_cost(fluid.layers.fc(h, 1), y))
        fluid.optimizer.SGD(0.1).minimize(loss)
    exe = fluid.Executor()
    report = exe.explain(main, feed={"x": 0, "y": 0}, fetch_list=[loss])
    fused = [line for line in report.splitlines() if "group elementwise" in line]
    assert any("test_softsign#" in line and "scale#" in line for line in fused)
    assert any("test_softsign_grad#" in line for line in fused)
    again = fluid.Program.parse_from_string(main.serialize_to_string())
    assert "test_softsign" in [op.type for op in again.global_block().ops]
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(32, 3)).astype(np.float32)
    ys = xs.sum(1, keepdims=True).astype(np.float32)
    losses = [float(exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss], scope=scope)[0][0])
              for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_define_op_refuses_a_taken_name_and_bad_attributes():
    with pytest.raises(ValueError, match="already registered"):
        define_op("relu", reference=lambda X: X)
    with pytest.raises(TypeError, match="attribute 'k'"):
        define_op("test_bad_attr", attrs={"k": object()}, reference=lambda X, k: X)
