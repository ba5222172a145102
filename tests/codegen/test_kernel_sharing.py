"""Kernels shared by content: identical layers, constants and programs compile one kernel; the
loop form is chosen at build time; the target is part of every kernel."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import compiler
from pdjit.codegen.target import get_target
from pdjit.framework.errors import FallbackWarning
from pdjit.passes.fusion import OPAQUE, REFERENCE, partition
from pdjit.runtime.plan import NativeStep


def _native_steps(exe):
    return [s for _, plan in exe._plans.values() for s in plan.walk()
            if isinstance(s, NativeStep)]


def _kernels(exe) -> set:
    return {k.name for s in _native_steps(exe) for k in s.compiled.kernels}


def _assert_native(exe):
    steps = _native_steps(exe)
    assert steps and all(s.fallbacks == 0 and s.retired is None for s in steps)


def _mlp(layers: int, act="tanh", optimizer=True):
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 3
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        h = fluid.layers.data(name="x", shape=[8], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        for _ in range(layers):
            h = fluid.layers.fc(h, 8, act=act)
        logits = fluid.layers.fc(h, 3)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, label))
        if optimizer:
            fluid.optimizer.Adam(1e-2).minimize(loss)
    return main, startup, loss


def _train(layers):
    main, startup, loss = _mlp(layers)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((5, 8)).astype(np.float32),
            "label": rng.integers(0, 3, (5, 1)).astype(np.int64)}
    (first,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    for _ in range(5):
        (last,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    assert last < first  # it trains
    return exe, main   # (plans live as long as their program)


def test_k_identical_layers_compile_the_kernels_of_two():
    (two, _p2), (six, _p6) = _train(2), _train(6)
    _assert_native(two)
    _assert_native(six)
    assert _kernels(six) == _kernels(two)
    # ... and one kernel object per distinct text in the process: the second program compiled
    # nothing new
    assert len(_kernels(two)) == len({k for k in _kernels(two)})


def test_scale_by_different_constants_shares_one_kernel():
    outs, kernels = [], []
    x_v = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    for factor, bias in ((0.5, 0.0), (2.0, 1.5), (-3.25, 0.25)):
        main = fluid.Program()
        with fluid.program_guard(main, fluid.Program()):
            x = fluid.layers.data(name="x", shape=[4], dtype="float32")
            y = fluid.layers.scale(x, scale=factor, bias=bias)
        exe = fluid.Executor()
        (got,) = exe.run(main, feed={"x": x_v}, fetch_list=[y], scope=fluid.Scope())
        np.testing.assert_allclose(got, x_v * np.float32(factor) + np.float32(bias), rtol=1e-6)
        _assert_native(exe)
        outs.append(got)
        kernels.append(_kernels(exe))
    assert len(kernels[0]) == 1 and kernels[0] == kernels[1] == kernels[2]


def test_kernel_stats_count_distinct_kernels():
    before = compiler.kernel_stats()
    _train(3)  # noqa: F841
    after = compiler.kernel_stats()
    assert after["kernels"] >= before["kernels"]
    assert after["compiled"] + after["loaded"] >= after["kernels"] - before["kernels"]


def _explain(build, feed):
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        out = build()
    feed = {k: v for k, v in feed.items() if main.global_block().has_var(k)}
    exe = fluid.Executor()
    (got,) = exe.run(main, feed=feed, fetch_list=[out], scope=fluid.Scope())
    _assert_native(exe)
    return got, exe.explain(main, feed=feed, fetch_list=[out])


RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)
ROW = RNG.standard_normal(5).astype(np.float32)
COL = RNG.standard_normal(3).astype(np.float32)
MID = RNG.standard_normal(4).astype(np.float32)


def _data(name, shape):
    return fluid.layers.data(name=name, shape=shape, dtype="float32", append_batch_size=False)


@pytest.mark.parametrize("case", ["flat", "row", "mid", "strided", "reduce_all", "reduce_rows",
                                  "reduce_block", "reduce_strided"])
def test_one_loop_form_per_kernel_chosen_from_static_shapes(case):
    L = fluid.layers
    feeds = {"x": X, "r": ROW, "c": COL, "m": MID}
    builds = {
        "flat": (lambda: L.tanh(_data("x", [-1, 4, 5]) * 2.0), lambda: np.tanh(X * 2)),
        "row": (lambda: L.elementwise_add(_data("x", [-1, 4, 5]), _data("r", [5])),
                lambda: X + ROW),
        # a per-channel operand on a middle axis (a bias after a convolution)
        "mid": (lambda: L.relu(L.elementwise_add(_data("x", [-1, 4, 5]), _data("m", [4]),
                                                 axis=1)),
                lambda: np.maximum(X + MID[:, None], 0)),
        "strided": (lambda: L.elementwise_mul(_data("x", [-1, 4, 5]), _data("c", [-1]),
                                              axis=0),
                    lambda: X * COL[:, None, None]),
        "reduce_all": (lambda: L.reduce_sum(L.exp(_data("x", [-1, 4, 5]))),
                       lambda: np.exp(X).sum()),
        "reduce_rows": (lambda: L.reduce_max(_data("x", [-1, 4, 5]), dim=[1, 2]),
                        lambda: X.max(axis=(1, 2))),
        "reduce_block": (lambda: L.reduce_mean(_data("x", [-1, 4, 5]) * 3.0, dim=[0, 1]),
                         lambda: (X * 3).mean(axis=(0, 1))),
        "reduce_strided": (lambda: L.reduce_sum(_data("x", [-1, 4, 5]), dim=[0, 2],
                                                keep_dim=True),
                           lambda: X.sum(axis=(0, 2), keepdims=True)),
    }
    build, want = builds[case]
    got, report = _explain(build, feeds)
    np.testing.assert_allclose(got, want(), rtol=2e-5, atol=1e-5)
    assert f"# form {case}\n" in report


def test_a_run_time_broadcast_outside_the_form_falls_back_visibly_and_right():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = _data("x", [-1, 4])
        y = _data("y", [-1, 4])
        z = x * y + 1.0
    exe = fluid.Executor(strict=False)
    xv = RNG.standard_normal((3, 4)).astype(np.float32)
    yv = RNG.standard_normal((1, 4)).astype(np.float32)  # the -1 turns out to be 1
    with pytest.warns(FallbackWarning, match="operand shapes do not fit the kernel's loop form"):
        (got,) = exe.run(main, feed={"x": xv, "y": yv}, fetch_list=[z], scope=fluid.Scope())
    np.testing.assert_allclose(got, xv * yv + 1, rtol=1e-6)
    (step,) = _native_steps(exe)
    assert step.fallbacks == 1   # the flat form refused the shapes; the references computed
    (got,) = exe.run(main, feed={"x": xv, "y": xv}, fetch_list=[z], scope=fluid.Scope())
    np.testing.assert_allclose(got, xv * xv + 1, rtol=1e-6)
    assert step.fallbacks == 1   # equal shapes run natively


def test_the_target_is_part_of_every_kernel_and_chosen_by_the_place():
    _, report = _explain(lambda: fluid.layers.relu(_data("x", [-1, 4, 5])), {"x": X})
    assert "target cpu" in report
    with pytest.raises(NotImplementedError, match="no code generation target 'tpu'"):
        get_target("tpu")


def test_an_opaque_op_without_a_lowering_for_the_target_runs_its_reference():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = _data("x", [-1, 5])
        r = fluid.layers.relu(x)
        y = fluid.layers.cumsum(r, axis=1)   # lowered for the cpu target only
    block = main.global_block()
    fetched = {y.name, r.name}
    cpu = partition(block, list(block.ops), fetched, target=get_target("cpu"))
    other = partition(block, list(block.ops), fetched, target=get_target("cuda"))
    kinds = lambda part: [g.kind for s in part.segments for g in s.groups]  # noqa: E731
    assert kinds(cpu) == ["elementwise", OPAQUE]
    assert kinds(other) == ["elementwise", REFERENCE]
    assert "no lowering for target cuda" in other.describe()
