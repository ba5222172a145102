"""Define an op in Python — squareplus, (x + sqrt(x * x + b)) / 2, a smooth relu — and use
it like a built-in.

It fuses with its neighbours (see the fusion report: squareplus sits inside the fused group),
differentiates (a model with it trains), and is tested with pdjit.testing in a few lines.
"""
import argparse

# --help answers here, before numpy and pdjit are imported
argparse.ArgumentParser(description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import numpy as np  # noqa: E402

import pdjit as fluid  # noqa: E402
from pdjit.custom import define_op  # noqa: E402
from pdjit.testing import check_output  # noqa: E402
from pdjit.testing.grad_check import check_grad  # noqa: E402

squareplus = define_op(
    "squareplus", attrs={"b": 4.0},
    reference=lambda X, b: (X + np.sqrt(X * X + b)) / 2,
    emit="({X} + np.sqrt({X} * {X} + {T}({b}))) * {T}(0.5)",
    grad=lambda X, dOut, b, **_: dOut * 0.5 * (1 + X / np.sqrt(X * X + b)),
    grad_emit="{Out@GRAD} * {T}(0.5) * ({T}(1) + {X} / np.sqrt({X} * {X} + {T}({b})))",
    doc="Out = (X + sqrt(X * X + b)) / 2")

# 1. test it like any op: against NumPy, and its gradient against finite differences
x = np.linspace(-3, 3, 12).reshape(3, 4)
check_output("squareplus", {"X": x}, {"b": 2.0}, {"Out": (x + np.sqrt(x * x + 2.0)) / 2})
check_grad("squareplus", {"X": x}, {"b": 2.0}, ["X"])
print("squareplus: output and gradient checked")

# 2. use it in a program: it fuses with the ops around it
main, startup = fluid.Program(), fluid.Program()
startup.random_seed = 3
with fluid.program_guard(main, startup):
    inp = fluid.layers.data(name="x", shape=[4], dtype="float32")
    label = fluid.layers.data(name="y", shape=[1], dtype="float32")
    hidden = fluid.layers.fc(inp, 16)
    act = fluid.layers.scale(squareplus(hidden, b=1.5), scale=0.5)
    pred = fluid.layers.fc(act, 1)
    loss = fluid.layers.mean(fluid.layers.square_error_cost(pred, label))
    fluid.optimizer.Adam(0.05).minimize(loss)

exe = fluid.Executor()
report = exe.explain(main, feed={"x": None, "y": None}, fetch_list=[loss])
print("\n".join(line for line in report.splitlines() if "squareplus" in line and "group" in line))

# 3. train with it
rng = np.random.default_rng(0)
xs = rng.normal(size=(64, 4)).astype(np.float32)
ys = (np.sin(xs).sum(axis=1, keepdims=True)).astype(np.float32)
exe.run(startup)
for step in range(60):
    (value,) = exe.run(main, feed={"x": xs, "y": ys}, fetch_list=[loss])
    if step in (0, 59):
        print(f"step {step}: loss {float(value[0]):.4f}")
