"""``fluid.install_check.run_check()``: a short self-test of an installation.

It builds a tiny linear regression (``fc`` + ``square_error_cost`` + ``mean``, trained with
``SGD``) in programs and a scope of its own, trains it a few steps with the compiled executor
(strict: any fallback to the NumPy references is a failure), checks that the loss is finite and
falls, that the same steps through ``CompiledProgram(...).with_data_parallel`` give the same
losses, and that the reference executor agrees. It prints what it does and ``Your pdjit works
well on CPU.``, or raises ``RuntimeError`` saying what failed.
"""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["run_check"]

_STEPS = 5


def _build(fluid):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 1
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 4], "float32")
        y = fluid.data("y", [-1, 1], "float32")
        pred = fluid.layers.fc(x, 1)
        loss = fluid.layers.mean(fluid.layers.square_error_cost(pred, y))
        fluid.optimizer.SGD(learning_rate=0.1).minimize(loss)
    return main, startup, loss


def _train(fluid, program, startup, loss, executor, feeds) -> list:
    scope = fluid.Scope()
    executor.run(startup, scope=scope)
    return [float(np.asarray(executor.run(program, feed=f, fetch_list=[loss],
                                          scope=scope)[0]).reshape(-1)[0]) for f in feeds]


def run_check() -> None:
    """Train a tiny program and check the results; prints ``Your pdjit works well on CPU.``
    or raises ``RuntimeError``."""
    import pdjit as fluid

    print("Running verify pdjit program ... ")
    rng = np.random.default_rng(0)
    w = np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    feeds = []
    for _ in range(_STEPS):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        feeds.append({"x": x, "y": x @ w + np.float32(0.25)})
    try:
        main, startup, loss = _build(fluid)
        compiled = _train(fluid, main, startup, loss, fluid.Executor(fluid.CPUPlace(),
                                                                     strict=True), feeds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "one replica" is expected here
            parallel = fluid.CompiledProgram(main).with_data_parallel(loss_name=loss.name)
            replica = _train(fluid, parallel, startup, loss,
                             fluid.Executor(fluid.CPUPlace(), strict=True), feeds)
        reference = _train(fluid, main, startup, loss,
                           fluid.Executor(fluid.CPUPlace(), mode="reference"), feeds)
    except Exception as e:
        raise RuntimeError(f"pdjit install check failed: building or running a tiny training "
                           f"program raised {type(e).__name__}: {e}") from e
    if not all(np.isfinite(compiled)):
        raise RuntimeError(f"pdjit install check failed: the losses are not finite: {compiled}")
    if not compiled[-1] < compiled[0]:
        raise RuntimeError(f"pdjit install check failed: the loss did not fall in {_STEPS} "
                           f"SGD steps: {compiled}")
    if compiled != replica:
        raise RuntimeError(f"pdjit install check failed: CompiledProgram gave losses "
                           f"{replica}, the program {compiled}")
    if not np.allclose(compiled, reference, rtol=1e-4, atol=1e-6):
        raise RuntimeError(f"pdjit install check failed: compiled losses {compiled} differ "
                           f"from the reference executor's {reference}")
    print("Your pdjit works well on CPU.")
