"""A LeNet-like CNN (conv-bn-relu-pool, fc, softmax with cross entropy, Momentum) trained on
CUDAPlace(0): the same numbers as CPUPlace() (the startup program draws the same weights on
the device), every step of the plan on the device, the values there between runs."""
import numpy as np

import pdjit as fluid
from pdjit.codegen.cuda import device
from pdjit.testing.op_test import assert_native

R = np.random.RandomState(7)
XS = R.randn(2, 2, 1, 5, 5).astype("float32")   # 2 steps of 2 images 1x5x5
YS = R.randint(0, 3, (2, 2, 1)).astype("int64")
PARAMS = ("conv2d_0.w_0", "conv2d_0.b_0", "batch_norm_0.w_0", "batch_norm_0.b_0",
          "batch_norm_0.w_1", "batch_norm_0.w_2", "fc_0.w_0", "fc_0.b_0")


def _lenet():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 5
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [1, 5, 5], dtype="float32")
        y = fluid.layers.data("y", [1], dtype="int64")
        c = fluid.layers.conv2d(x, num_filters=2, filter_size=3, padding=1)
        h = fluid.layers.batch_norm(c, act="relu")
        p = fluid.layers.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
        logits = fluid.layers.fc(p, 3)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, y))
        fluid.optimizer.Momentum(0.1, 0.9).minimize(loss)
    return main, startup, loss


def _train(place):
    main, startup, loss = _lenet()
    scope = fluid.Scope()
    exe = fluid.Executor(place, strict=True)
    exe.run(startup, scope=scope)
    device.reset_transfers()
    losses = [exe.run(main, feed={"x": XS[i], "y": YS[i]}, fetch_list=[loss], scope=scope)[0]
              for i in range(2)]
    t = device.transfers()
    params = {n: np.asarray(scope.find_var(n).get_tensor()) for n in PARAMS}
    return losses, params, exe, scope, main, t


def test_lenet_trains_like_the_cpu():
    want, want_params, _, _, _, _ = _train(fluid.CPUPlace())
    got, got_params, exe, scope, main, t = _train(fluid.CUDAPlace(0))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want_params["conv2d_0.w_0"], _train_free_weights())  # it moved
    for n, w in want_params.items():
        np.testing.assert_allclose(got_params[n], w, rtol=1e-5, atol=1e-6, err_msg=n)
    # one device step per run: conv, batch norm (running statistics in place), pooling and
    # their gradients, the updates; no op on the host, no host round trip inside the step
    steps = [s for (pid, _), (_, plan) in exe._plans.items() if pid == id(main)
             for s in plan.walk()]
    assert [s.kind for s in steps] == ["native"], [s.describe() for s in steps]
    assert steps[0].device is not None  # on the device
    assert assert_native(exe) >= 1
    # copies: the two feeds in and the loss out per run, nothing else
    assert t["h2d"] == 2 * 2 and t["d2h"] == 2, t
    for n in PARAMS:
        assert device.is_device_array(scope.find_var(n).value), n


def _train_free_weights():
    """The conv filter the startup program draws, before any step (on the host)."""
    main, startup, _ = _lenet()
    scope = fluid.Scope()
    fluid.Executor(fluid.CPUPlace()).run(startup, scope=scope)
    return np.asarray(scope.find_var("conv2d_0.w_0").get_tensor())
