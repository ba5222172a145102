"""``mul`` / ``matmul_v2`` by blocks of samples (``Opaque.blocked``): the bias add and the
activation after an fc run on each block of the product's rows in the same compiled call.
Small shapes with the size rule lowered (``BLOCKED_MIN_WORK``), against NumPy written here,
native execution asserted."""
import math
import re

import numpy as np
import pytest

import pdjit as fluid
import pdjit.codegen.cpu.lowerings.matmul as mm
from pdjit.testing import assert_native

RNG = np.random.default_rng(16)


@pytest.fixture(autouse=True)
def blas(monkeypatch):
    """The products by BLAS calls (by weights they run on the weights packed once:
    tests/codegen/cpu/test_packed_gemm.py)."""
    monkeypatch.setattr(mm, "_weight", lambda ctx, xn: False)


@pytest.fixture
def blocked(monkeypatch):
    monkeypatch.setattr(mm, "BLOCKED_MIN_WORK", 1)


def _calls(source: str, fn: str) -> int:
    """How many calls of ``fn`` a generated source makes (a host function makes them through
    the replay recorder's hook: ``_kc(fn, ...)``)."""
    return len(re.findall(rf"_kc\({re.escape(fn)},|{re.escape(fn)}\(", source))


def _erf_gelu(v):
    return 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))


def _params(names):
    scope = fluid.global_scope()
    return [np.asarray(scope.find_var(n).get_tensor()).copy() for n in names]


def test_fc_bias_activation_by_blocks_forward(fresh_programs, blocked):
    """fc (rank 3, num_flatten_dims=2) + bias + gelu, fc (rank 2) + bias + relu, and a
    matmul_v2 + elementwise_add: each one call computing row blocks then its chain."""
    main, startup = fresh_programs
    x3 = fluid.layers.data("x3", [6, 5, 8], append_batch_size=False)
    x2 = fluid.layers.data("x2", [7, 8], append_batch_size=False)
    b = fluid.layers.data("b", [7, 12], append_batch_size=False)
    h = fluid.layers.fc(x3, 12, num_flatten_dims=2, act="gelu", name="f3")
    r = fluid.layers.fc(x2, 12, act="relu", name="f2")
    w = fluid.layers.create_parameter([8, 12], "float32", name="wm")
    m = fluid.layers.elementwise_add(fluid.layers.matmul(x2, w), b)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    feed = {"x3": RNG.normal(size=(6, 5, 8)).astype(np.float32),
            "x2": RNG.normal(size=(7, 8)).astype(np.float32),
            "b": RNG.normal(size=(7, 12)).astype(np.float32)}
    got_h, got_r, got_m = exe.run(main, feed=feed, fetch_list=[h, r, m])
    assert_native(exe)
    report = exe.explain(main, feed=feed, fetch_list=[h, r, m])
    assert _calls(report, "_nn.gemm_rows") == 3, report
    w3, b3, w2, b2, wm = _params(["f3.w_0", "f3.b_0", "f2.w_0", "f2.b_0", "wm"])
    x3v = feed["x3"].astype(np.float64)
    want_h = _erf_gelu(x3v.reshape(30, 8) @ w3 + b3).reshape(6, 5, 12)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_r, np.maximum(feed["x2"] @ w2 + b2, 0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_m, feed["x2"] @ wm + feed["b"], rtol=1e-4, atol=1e-5)


def test_fc_bias_relu_by_blocks_training_step(fresh_programs, blocked):
    """One SGD step of fc + bias + relu -> fc -> mean: the loss and the updated parameters
    against the gradients written out in NumPy (the first product by blocks)."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [9, 6], append_batch_size=False)
    h = fluid.layers.fc(x, 10, act="relu", name="fa")
    loss = fluid.layers.mean(fluid.layers.fc(h, 3, name="fb"))
    fluid.optimizer.SGD(learning_rate=0.5).minimize(loss)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    names = ["fa.w_0", "fa.b_0", "fb.w_0", "fb.b_0"]
    w1, b1, w2, b2 = _params(names)
    b1 += RNG.normal(size=b1.shape).astype(np.float32)  # some units off, some on
    fluid.global_scope().find_var("fa.b_0").get_tensor().set(b1, fluid.CPUPlace())
    xv = RNG.normal(size=(9, 6)).astype(np.float32)
    got_loss, = exe.run(main, feed={"x": xv}, fetch_list=[loss])
    assert_native(exe)
    assert _calls(exe.explain(main, feed={"x": xv}, fetch_list=[loss]), "_nn.gemm_rows")
    z1 = xv.astype(np.float64) @ w1 + b1
    a1 = np.maximum(z1, 0)
    z2 = a1 @ w2 + b2
    dz2 = np.full(z2.shape, 1.0 / z2.size)
    dz1 = (dz2 @ w2.T) * (z1 > 0)
    # the mean of 27 terms of magnitude ~1 may be near zero: float32 rounding is relative to
    # the terms, not to their mean
    np.testing.assert_allclose(got_loss, z2.mean(), rtol=1e-5, atol=1e-6 * np.abs(z2).max())
    want = [w1 - 0.5 * xv.T @ dz1, b1 - 0.5 * dz1.sum(0), w2 - 0.5 * a1.T @ dz2,
            b2 - 0.5 * dz2.sum(0)]
    for got, w in zip(_params(names), want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-6)


def test_small_products_stay_one_gemm(fresh_programs):
    """Below the size rule an fc stays one GEMM then its chain."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [4, 8], append_batch_size=False)
    y = fluid.layers.fc(x, 3, act="relu")
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    feed = {"x": np.ones((4, 8), np.float32)}
    report = exe.explain(main, feed=feed, fetch_list=[y])
    assert not _calls(report, "_nn.gemm_rows") and "_rt.gemm(" in report


def test_blocks_of_few_rows_stay_one_gemm(fresh_programs, blocked):
    """A matrix X times a wide Y (blocks of 64 rows of 1024 columns) stays one GEMM: each
    block's BLAS call would pack all of Y again."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [2, 8], append_batch_size=False)
    y = fluid.layers.fc(x, 1024, act="relu")
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    report = exe.explain(main, feed={"x": np.ones((2, 8), np.float32)}, fetch_list=[y])
    assert not _calls(report, "_nn.gemm_rows") and "_rt.gemm(" in report


def test_unknown_batch_counts_as_eight(fresh_programs):
    """The size rule at its default: [-1, 64, 512] x [512, 128] is 8 * 4.2M multiply-adds with
    the unknown batch counted as ``UNKNOWN_BATCH`` (blocks of 8 samples, 512 rows): by
    blocks; run at batch 2."""
    assert mm.UNKNOWN_BATCH * 64 * 512 * 128 >= mm.BLOCKED_MIN_WORK > 64 * 512 * 128
    assert 64 * (mm.BLOCK_OUTPUT_ELEMS // (64 * 128)) >= mm.BLOCKED_MIN_ROWS
    main, startup = fresh_programs
    x = fluid.layers.data("x", [64, 512])
    y = fluid.layers.fc(x, 128, num_flatten_dims=2, act="relu", name="big")
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    feed = {"x": RNG.normal(size=(2, 64, 512)).astype(np.float32)}
    got, = exe.run(main, feed=feed, fetch_list=[y])
    assert_native(exe)
    assert _calls(exe.explain(main, feed=feed, fetch_list=[y]), "_nn.gemm_rows")
    w, b = _params(["big.w_0", "big.b_0"])
    want = np.maximum(feed["x"].astype(np.float64) @ w + b, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
