"""Checks that must agree between the compiled and the reference executor: NaN in max-pool
windows follows NumPy (a NaN makes the window's max NaN) in every kernel path."""
import numpy as np

import pdjit as fluid
from pdjit.testing.op_test import assert_native


def test_max_pool_propagates_nan_in_every_kernel_path():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[1, 4, 6], dtype="float32")
        outs = [fluid.layers.pool2d(x, pool_size=2, pool_stride=2, pool_type="max"),  # 2x2 path
                fluid.layers.pool2d(x, pool_size=3, pool_stride=1, pool_type="max"),  # general
                fluid.layers.adaptive_pool2d(x, pool_size=[2, 3], pool_type="max")]   # adaptive
    xv = np.arange(48, dtype=np.float32).reshape(2, 1, 4, 6)
    xv[0, 0, 0, 1] = np.nan
    xv[1, 0, 2, 4], xv[1, 0, 3, 5] = np.nan, np.inf  # [NaN, inf] in one window: NaN
    want = []  # NumPy: the max of each window
    for k, s in ((2, 2), (3, 1)):
        oh, ow = (4 - k) // s + 1, (6 - k) // s + 1
        want.append(np.array([[[[xv[n, 0, i * s:i * s + k, j * s:j * s + k].max()
                                 for j in range(ow)] for i in range(oh)]] for n in range(2)]))
    want.append(np.array([[[[xv[n, 0, i * 2:i * 2 + 2, j * 2:j * 2 + 2].max() for j in range(3)]
                            for i in range(2)]] for n in range(2)]))
    exe = fluid.Executor(mode="compiled", strict=True)
    for mode_exe in (fluid.Executor(mode="reference"), exe):
        got = mode_exe.run(main, feed={"x": xv}, fetch_list=outs, scope=fluid.Scope())
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert np.isnan(want[0]).sum() == 2 and np.isnan(want[1]).sum() == 6
    assert_native(exe)
