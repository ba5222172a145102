"""Dropout on the device draws the numbers of pdjit's one counter-based stream: the same mask
as the cpu target (and the references) for the same program seed and run."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import cuda_math
from pdjit.framework import random as prandom


def test_device_stream_is_the_stream():
    key = 0x0123456789ABCDEF
    want = prandom.uniform01(key, 40)
    got = np.array([cuda_math.uniform01(np.uint64(key), i) for i in range(40)])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("impl", ["upscale_in_train", "downgrade_in_infer"])
def test_dropout_and_grad_match_the_cpu(impl):
    x = np.random.RandomState(4).randn(6, 20).astype("float32")
    w = np.random.RandomState(5).randn(6, 20).astype("float32")

    def run(place):
        main, startup = fluid.Program(), fluid.Program()
        main.random_seed = 17
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            X = fluid.layers.data("x", [6, 20], append_batch_size=False)
            X.stop_gradient = False
            y = fluid.layers.dropout(X, 0.35, dropout_implementation=impl)
            W = fluid.layers.data("w", [6, 20], append_batch_size=False)
            loss = fluid.layers.mean(y * W)
            grads = fluid.gradients(loss, [X])
        exe = fluid.Executor(place, strict=True)
        return exe.run(main, feed={"x": x, "w": w}, fetch_list=[y, grads[0]]), exe

    (cy, cg), _ = run(fluid.CPUPlace())
    (gy, gg), exe = run(fluid.CUDAPlace(0))
    kinds = {type(s).__name__ for _, plan in exe._plans.values() for s in plan.walk()}
    assert kinds == {"DeviceStep"}, kinds
    np.testing.assert_array_equal(gy != 0, cy != 0)     # the same draws
    np.testing.assert_allclose(gy, cy, rtol=1e-6)
    np.testing.assert_allclose(gg, cg, rtol=1e-6, atol=1e-6)
    kept = cy != 0
    assert 0.4 < kept.mean() < 0.9
    scale = 1 / np.float32(0.65) if impl == "upscale_in_train" else 1
    np.testing.assert_allclose(gy[kept], x[kept] * scale, rtol=1e-6)
