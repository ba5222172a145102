"""Training on CUDAPlace(0): the same programs as on CPUPlace(), forward, backward and
optimizer updates on the device; parameters and optimizer state stay there between runs."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cuda import device
from pdjit.framework.errors import FallbackError
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing.op_test import assert_native

R = np.random.RandomState(0)
XS = R.randn(3, 6, 8).astype("float32")
YS = R.randint(0, 4, (3, 6, 1)).astype("int64")


def _mlp(optimizer):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 3
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [8], dtype="float32")
        y = fluid.layers.data("y", [1], dtype="int64")
        h = fluid.layers.fc(x, 8, act="relu")
        logits = fluid.layers.fc(h, 4)
        prob = fluid.layers.softmax(logits)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, y))
        optimizer().minimize(loss)
    return main, startup, loss, prob


def _train(place, optimizer, steps=3):
    main, startup, loss, prob = _mlp(optimizer)
    scope = fluid.Scope()
    exe = fluid.Executor(place, strict=True)
    exe.run(startup, scope=scope)
    device.reset_transfers()
    out = [exe.run(main, feed={"x": XS[i], "y": YS[i]}, fetch_list=[loss, prob], scope=scope)
           for i in range(steps)]
    params = {n: np.asarray(scope.find_var(n).get_tensor())
              for n in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0")}
    return out, params, exe, scope, main


OPTIMIZERS = {"sgd": lambda: fluid.optimizer.SGD(0.1),
              "momentum": lambda: fluid.optimizer.Momentum(0.1, 0.9),
              "adam": lambda: fluid.optimizer.Adam(0.01)}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_trains_like_the_cpu(name):
    want, want_params, _, _, _ = _train(fluid.CPUPlace(), OPTIMIZERS[name])
    got, got_params, exe, scope, main = _train(fluid.CUDAPlace(0), OPTIMIZERS[name])
    t = device.transfers()
    for (gl, gp), (wl, wp) in zip(got, want):
        np.testing.assert_allclose(gl, wl, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gp, wp, rtol=1e-5, atol=1e-6)
    for n, w in want_params.items():
        np.testing.assert_allclose(got_params[n], w, rtol=1e-5, atol=1e-6, err_msg=n)
    # one device step: no host op, no host round trip between the steps of the plan
    steps = [s for (pid, _), (_, plan) in exe._plans.items() if pid == id(main)
             for s in plan.walk()]
    assert [s.kind for s in steps] == ["native"], [s.describe() for s in steps]
    assert steps[0].device is not None  # on the device
    assert assert_native(exe) >= 1
    # copies: the two feeds of each run in, the two fetches out; the startup program drew the
    # weights on the device (uniform_random), parameters and optimizer state stay there
    assert t["h2d"] == 2 * 3 and t["d2h"] == 2 * 3, t
    assert device.is_device_array(scope.find_var("fc_0.w_0").value)
    assert device.is_device_array(scope.find_var("fc_1.b_0").value)


def test_return_numpy_false_gives_the_device_array():
    main, startup, loss, prob = _mlp(OPTIMIZERS["sgd"])
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CUDAPlace(0))
    exe.run(startup, scope=scope)
    device.reset_transfers()
    (t,) = exe.run(main, feed={"x": XS[0], "y": YS[0]}, fetch_list=[prob], scope=scope,
                   return_numpy=False)
    assert isinstance(t, LoDTensor) and device.is_device_array(t._array)
    assert device.transfers()["d2h"] == 0
    p = np.asarray(t)
    np.testing.assert_allclose(p.sum(-1), np.ones(6), rtol=1e-5)


def _program_with_host_op():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [4, 5], append_batch_size=False)
        y = fluid.layers.relu(x)
        z = fluid.layers.transpose(y, [1, 0])   # lowered for the cpu only
        w = fluid.layers.scale(z, scale=2.0)
    return main, w


def test_op_without_cuda_lowering_runs_on_the_host_with_a_warning():
    main, w = _program_with_host_op()
    x = R.randn(4, 5).astype("float32")
    exe = fluid.Executor(fluid.CUDAPlace(0), strict=False)
    with pytest.warns(Warning, match="transpose"):
        (got,) = exe.run(main, feed={"x": x}, fetch_list=[w])
    np.testing.assert_allclose(got, 2 * np.maximum(x, 0).T, rtol=1e-6)
    descs = [s.describe() for _, plan in exe._plans.values() for s in plan.walk()]
    assert any("transpose" in d and "runs on the host" in d for d in descs), descs


def test_strict_refuses_an_op_without_cuda_lowering():
    main, w = _program_with_host_op()
    exe = fluid.Executor(fluid.CUDAPlace(0), strict=True)
    with pytest.raises(FallbackError, match="transpose"):
        exe.run(main, feed={"x": np.zeros((4, 5), "float32")}, fetch_list=[w])


def test_is_compiled_with_cuda_is_false_on_the_simulator():
    assert fluid.is_compiled_with_cuda() == (device.available() and not device.simulator())
