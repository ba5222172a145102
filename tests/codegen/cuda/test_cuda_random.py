"""Dropout on the device draws the numbers of pdjit's one counter-based stream: the same mask
as the cpu target (and the references) for the same program seed and run."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cuda import mathfuncs as cuda_math
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
    kinds = {(s.kind, s.device is not None) for _, plan in exe._plans.values()
             for s in plan.walk()}
    assert kinds == {("native", True)}, kinds
    np.testing.assert_array_equal(gy != 0, cy != 0)     # the same draws
    np.testing.assert_allclose(gy, cy, rtol=1e-6)
    np.testing.assert_allclose(gg, cg, rtol=1e-6, atol=1e-6)
    kept = cy != 0
    assert 0.4 < kept.mean() < 0.9
    scale = 1 / np.float32(0.65) if impl == "upscale_in_train" else 1
    np.testing.assert_allclose(gy[kept], x[kept] * scale, rtol=1e-6)


def _random_program():
    main = fluid.Program()
    main.random_seed = 23
    b = main.global_block()
    outs = [b.create_var(name="u", shape=[4, 8], dtype="float32"),
            b.create_var(name="g", shape=[5, 7], dtype="float32"),
            b.create_var(name="g64", shape=[3, 4], dtype="float64")]
    b.append_op(type="uniform_random", outputs={"Out": [outs[0]]},
                attrs={"shape": [4, 8], "min": -2.0, "max": 3.0, "dtype": 5})
    b.append_op(type="gaussian_random", outputs={"Out": [outs[1]]},
                attrs={"shape": [5, 7], "mean": 1.0, "std": 2.0, "dtype": 5})
    b.append_op(type="gaussian_random", outputs={"Out": [outs[2]]},
                attrs={"shape": [3, 4], "mean": 0.0, "std": 1.0, "dtype": 6})
    return main, outs


def test_uniform_and_gaussian_random_draw_the_cpu_numbers():
    """Two runs on each place: the device draws the cpu target's numbers; an unseeded program
    new ones in each run, a seeded one the same (the stream of the stream tests above, mapped
    as pdjit.framework.random documents)."""
    main, outs = _random_program()
    for seed in (0, 23):
        main.random_seed = seed
        cpu = fluid.Executor(fluid.CPUPlace())
        dev = fluid.Executor(fluid.CUDAPlace(0), strict=True)
        want = [cpu.run(main, fetch_list=outs) for _ in range(2)]
        got = [dev.run(main, fetch_list=outs) for _ in range(2)]
        kinds = {(s.kind, s.device is not None) for _, plan in dev._plans.values()
                 for s in plan.walk()}
        assert kinds == {("native", True)}, kinds
        for g_run, w_run in zip(got, want):
            for k, (g, w) in enumerate(zip(g_run, w_run)):
                assert g.dtype == w.dtype and g.shape == w.shape
                if k == 0:  # uniform: the stream's numbers scaled, exactly
                    np.testing.assert_array_equal(g, w)
                else:  # gaussian: through log and cos, whose last bit the device's math
                    # and the cpu's compiled libm may round apart (seen: 1 in 12 float64)
                    np.testing.assert_allclose(g, w, rtol=4 * np.finfo(g.dtype).eps, atol=0)
        u = got[0][0]
        assert (u >= -2.0).all() and (u < 3.0).all() and len(np.unique(u)) == u.size
        assert (got[0][0] != got[1][0]).all() if not seed else \
            np.array_equal(got[0][0], got[1][0])
    # the uniform numbers are the stream's: u = -2 + 5 * uniform01(key, i) for one key, so
    # (u + 2) / 5 lies within float32 rounding of numbers in [0, 1)
    assert 0.0 <= ((u + 2.0) / 5.0).min() and ((u + 2.0) / 5.0).max() < 1.0
