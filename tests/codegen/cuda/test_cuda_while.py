"""A ``while`` program on CUDAPlace(0): the loop runs on the host, reading its condition each
iteration, and launches the body's device kernels; it matches the CPU."""
import numpy as np

import pdjit as fluid
from pdjit.codegen.cuda import device


def _program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [3, 4], append_batch_size=False)
        i = fluid.layers.fill_constant([1], "int64", 0)
        n = fluid.layers.fill_constant([1], "int64", 4)
        acc = fluid.layers.fill_constant([3, 4], "float32", 0.0)
        cond = fluid.layers.less_than(i, n)
        loop = fluid.layers.While(cond)
        with loop.block():
            y = fluid.layers.tanh(fluid.layers.elementwise_add(acc, x) * 0.5)
            fluid.layers.assign(y, acc)
            fluid.layers.increment(i, in_place=True)
            fluid.layers.less_than(i, n, cond=cond)
        total = fluid.layers.reduce_sum(acc)
    return main, acc, total, i


def test_while_matches_the_cpu_and_numpy():
    x = np.random.RandomState(3).randn(3, 4).astype("float32")
    want = np.zeros((3, 4), "float32")
    for _ in range(4):
        want = np.tanh((want + x) * np.float32(0.5))
    results = {}
    for place in (fluid.CPUPlace(), fluid.CUDAPlace(0)):
        main, acc, total, i = _program()
        exe = fluid.Executor(place, strict=True)
        device.reset_transfers()
        results[repr(place)] = exe.run(main, feed={"x": x}, fetch_list=[acc, total, i])
        if place.kind == "cuda":
            t = device.transfers()
            steps = [s for _, plan in exe._plans.values() for s in plan.walk()]
            kinds = [(s.kind, s.device is not None) for s in steps]
            assert ("native", True) in kinds and all(k != "native_loop" for k, _ in kinds), \
                kinds
            loop = next(s for s in steps if s.kind == "reference" and s.op.type == "while")
            assert "runs the loop on the host" in loop.describe()
            # the feed in once, the three fetches out; the body's values stay on the device
            assert t["h2d"] == 1 and t["d2h"] == 3, t
    cpu, gpu = results["CPUPlace()"], results["CUDAPlace(0)"]
    np.testing.assert_allclose(gpu[0], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gpu[1], cpu[1], rtol=1e-5)
    assert int(gpu[2][0]) == 4 == int(cpu[2][0])
