"""The Executor's per-run path: ``native_drivers="auto"`` (an inference plan run often gets its
driver as one native function), the driver trials' fallbacks, and feeds bound in the run's
column order. Oracles: NumPy written here."""
import numba
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu import tiers as tiers_mod
from pdjit.codegen.target import get_target
from pdjit.framework.errors import AllocationLimitError, FeedError

pytestmark = pytest.mark.usefixtures("counted_trials")


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _mlp():
    """main: softmax(2 * relu(x @ w0 + b0) + 0.5); test: its clone for inference."""
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 7
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [6])
        h = fluid.layers.fc(x, 5, act="relu", param_attr=fluid.ParamAttr(name="w0"),
                            bias_attr=fluid.ParamAttr(name="b0"))
        y = fluid.layers.softmax(fluid.layers.scale(h, 2.0, bias=0.5))
    return main, startup, x, y


def _want(scope, xv):
    w0, b0 = (np.asarray(scope.find_var(n).value) for n in ("w0", "b0"))
    return _softmax(2.0 * np.maximum(xv @ w0 + b0, 0) + 0.5)


def _steps(exe, program):
    return [s for (pid, _), (_, plan) in exe._plans.items() if pid == id(program)
            for s in plan.steps if s.kind == "native"]


def test_the_default_is_auto_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv("PDJIT_NATIVE_DRIVERS", raising=False)
    assert fluid.Executor().native_drivers == "auto"
    monkeypatch.setenv("PDJIT_NATIVE_DRIVERS", "0")
    assert fluid.Executor().native_drivers is False
    monkeypatch.setenv("PDJIT_NATIVE_DRIVERS", "1")
    assert fluid.Executor().native_drivers is True
    assert fluid.Executor(native_drivers="auto").native_drivers == "auto"
    assert fluid.Executor(native_drivers=0).native_drivers is False


def test_an_inference_plan_gets_its_native_driver_once_hot(monkeypatch, background_compiles):
    """After HOT_RUNS runs the native driver is compiled (as work beside the runs, which
    trials do not time), timed against the host driver and one of them picked per batch
    size; every run gives NumPy's answer; a bad feed is still refused with its clear error
    and leaves the scope as it was."""
    monkeypatch.setattr(tiers_mod, "HOT_RUNS", 3)
    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)  # hot in the run that counts
    main, startup, x, y = _mlp()
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers="auto", strict=True)
    exe.run(startup, scope=scope)
    assert all(s.tiers is None for s in _steps(exe, startup))  # it writes persistables
    rng = np.random.default_rng(0)
    for k in range(12):
        xv = rng.standard_normal((2, 6)).astype("float32")
        (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
        steps = _steps(exe, main)
        assert steps
        if k < 2:  # not hot yet: the host driver only
            assert all(s.native is None and s.tiers._hot is not None for s in steps)
    for s in steps:
        assert s.native is not None and s.tiers._hot is None
        assert s.native.fn.signatures  # compiled, and ran
        assert list(s.tiers.picked) == [2]
        assert "driver by batch size" in s.describe()
    assert background_compiles and set(background_compiles) == {1}
    before = {n: np.array(scope.find_var(n).value) for n in ("w0", "b0")}
    with pytest.raises(FeedError, match=r"'x' expects dtype float32, got float64"):
        exe.run(main, feed={"x": np.ones((2, 6))}, fetch_list=[y], scope=scope)
    with pytest.raises(FeedError, match=r"'x' expects shape \[-1, 6\].*got \[2, 5\]"):
        exe.run(main, feed={"x": np.ones((2, 5), np.float32)}, fetch_list=[y], scope=scope)
    for n, v in before.items():
        np.testing.assert_array_equal(scope.find_var(n).value, v)
    xv = rng.standard_normal((3, 6)).astype("float32")  # a new batch size: new trials
    (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
    np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)


def test_a_hot_step_compiles_its_native_driver_on_a_thread(monkeypatch):
    """By default the native driver is built and compiled on a thread of its own: the run that
    made the step hot returns on the host driver, runs meanwhile give NumPy's answer, and once
    the thread is done the native driver is compiled for the types that run passed."""
    monkeypatch.setattr(tiers_mod, "HOT_RUNS", 2)
    main, startup, x, y = _mlp()
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers="auto", strict=True)
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(1)
    threads_seen = []
    for _ in range(12):
        xv = rng.standard_normal((3, 6)).astype("float32")
        (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
        threads_seen += [s.tiers.tiering for s in _steps(exe, main)
                         if s.tiers.tiering is not None]
        if len(threads_seen) == 1:
            threads_seen[0].join(60)  # (the runs before the join were served meanwhile)
    assert len({id(t) for t in threads_seen}) == 1 and threads_seen[0].name == "pdjit-tier-up"
    (step,) = _steps(exe, main)
    assert step.native is not None and len(step.native.fn.signatures) == 1
    assert list(step.tiers.picked) == [3]


class _Clock:
    """``time`` as the tiers see it: runs of the fake step below advance it by their length."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _Step:
    """A native step of ``calls`` kernel calls whose host runs take ``lengths`` seconds (the
    last one from then on), timed on ``clock``."""

    def __init__(self, calls, lengths, clock):
        self.groups, self.lengths, self.clock, self.batch_arg = [None] * calls, lengths, clock, 0
        self.runs = 0

    def call_host(self, values):
        self.clock.now += self.lengths[min(self.runs, len(self.lengths) - 1)]
        self.runs += 1
        return values


class _Native:
    parallel = False

    def __init__(self, built):
        self.fn = self
        built.append(self)

    def compile(self, values, sig):
        self.sig = sig


def test_a_step_whose_first_runs_are_slow_is_timed_longer_before_its_driver_is_given_up(
        monkeypatch):
    """A hot step's host runs decide whether its native driver can pay (at most
    DRIVER_CALL_MAX_S a call): first runs that are slow (a lazy first use) do not decide it
    alone; a step that stays slow, or has too many calls, gets none, and no build starts.
    The garbage its compile left is collected, not the whole heap."""
    clock = _Clock()
    collected = []
    monkeypatch.setattr(tiers_mod, "time", clock)
    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)
    monkeypatch.setattr(tiers_mod, "gc", type("gc", (), {"collect": collected.append}))
    x = [np.zeros((1, 4), np.float32)]
    per_call = tiers_mod.DRIVER_CALL_MAX_S
    cases = {  # (kernel calls, host run lengths) -> runs until a native driver is built
        "slow first runs": (3, [50 * per_call, 20 * per_call, 10 * per_call, per_call], 4),
        "always slow": (3, [4 * per_call], None),
        "too many calls": (tiers_mod.DRIVER_MAX_CALLS + 1, [per_call / 10], None),
    }
    for name, (calls, lengths, want) in cases.items():
        built = []
        step = _Step(calls, lengths, clock)
        t = tiers_mod.DriverTiers(step, build=lambda built=built: _Native(built), hot_runs=2)
        runs = 0
        while t.native is None and t.native_failed is None and runs < 50:
            assert t.call(x) is x
            runs += 1
            if t.native is None and t.native_failed is None:  # (still timed)
                assert not t.settled(1), name
        if want is None:
            assert t.native is None and not built, name
            assert "it would not pay" in t.native_failed, name
            assert runs == (2 if calls > tiers_mod.DRIVER_MAX_CALLS
                            else 2 + tiers_mod.HOST_MORE_RUNS), name
            assert t.settled(1), name
        else:
            assert runs == want and built == [t.native] and t.native_failed is None, name
            assert t.native.sig == (numba.typeof(x[0]),), name
    # once the driver compiled: the young generations collected, never the whole heap (a
    # full collection holds the GIL through all of Numba's objects while runs wait)
    assert collected == [1]


def test_a_hot_steps_native_driver_is_one_compile_for_every_thread_count(monkeypatch):
    """A native driver built once hot (the Predictor's "background") is the same function at
    two threads as at one (one compile, cached by content, serves both), and runs serially:
    every run gives NumPy's answer, the native one included."""
    from pdjit.codegen.cpu import threads

    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)
    monkeypatch.setattr(threads, "_applied", threads._applied)  # (asked for or not, after)
    main, startup, x, y = _mlp()
    infer = main.clone(for_test=True)
    scope = fluid.Scope()
    fluid.Executor(strict=True).run(startup, scope=scope)
    xv = np.random.default_rng(3).standard_normal((2, 6)).astype("float32")
    names = []
    old = fluid.get_num_threads()
    try:
        for n in (2, 1):
            fluid.set_num_threads(n)
            exe = fluid.Executor(native_drivers="background", strict=True)
            for _ in range(tiers_mod.BACKGROUND_RUNS + 8):
                (out,) = exe.run(infer, feed={"x": xv}, fetch_list=[y], scope=scope)
                np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
            (step,) = _steps(exe, infer)
            assert step.native is not None and not step.native.parallel, step.describe()
            assert step.native.fn.signatures  # compiled, and ran in the trial
            names.append(step.native.name)
            exe.close()
    finally:
        fluid.set_num_threads(old)
    assert names[0] == names[1]


def test_a_training_plan_keeps_its_host_drivers(monkeypatch):
    """A program that writes persistables (parameters, optimizer state) is no inference
    plan: "auto" compiles nothing more for it however often it runs."""
    monkeypatch.setattr(tiers_mod, "HOT_RUNS", 2)
    main, startup, x, y = _mlp()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        label = fluid.layers.data("label", [1], dtype="int64")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(y, label))
        fluid.optimizer.SGD(0.1).minimize(loss)
    scope, exe = fluid.Scope(), fluid.Executor(native_drivers="auto", strict=True)
    exe.run(startup, scope=scope)
    xv = np.random.default_rng(1).standard_normal((4, 6)).astype("float32")
    lv = np.array([[0], [1], [2], [3]], np.int64)
    losses = [exe.run(main, feed={"x": xv, "label": lv}, fetch_list=[loss], scope=scope)[0]
              for _ in range(6)]
    assert losses[-1] < losses[0]
    steps = _steps(exe, main)
    assert steps and all(s.native is None and s.tiers is None for s in steps)


class _Broken:
    """A native driver that fails where the host driver does not."""
    name = "broken"
    parallel = False

    def fn(self, *args):
        raise RuntimeError("a wrong native driver")


def test_a_native_driver_that_fails_where_the_host_one_works_is_given_up():
    main, startup, x, y = _mlp()
    infer = main.clone(for_test=True)
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    xv = np.random.default_rng(2).standard_normal((2, 6)).astype("float32")
    exe.run(infer, feed={"x": xv}, fetch_list=[y], scope=scope)
    (step,) = _steps(exe, infer)
    assert step.tiers is None  # (no native drivers: the CPU's tiers given one by hand)
    step.tiers = get_target("cpu").step_tiers(step, native=_Broken())
    for _ in range(3):  # host trial, then the native trial: it fails, the host one serves
        (out,) = exe.run(infer, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert step.native is None and step.fallbacks == 0
    assert "RuntimeError: a wrong native driver" in step.describe()
    # inputs that the host driver refuses too are the inputs' fault: the native driver stays
    step.tiers.native = _Broken()
    step.tiers._trials[2] = ([1.0], [])  # the next trial run of batch size 2 is the native
    step.tiers._turns[2] = [1, 0]        # driver's (its turn: the host driver ran once)
    good, step.compiled = step.compiled, _Failing()
    values = [xv if i == step.batch_arg else None for i in range(len(step.args))]
    with pytest.raises(ValueError, match="host refuses"):
        step.tiers.call(values)
    assert step.native is not None
    step.compiled = good


class _Failing:
    def fn(self, *args):
        raise ValueError("host refuses")


def test_feeds_bind_by_the_saved_models_column_order(tmp_path):
    """A saved inference model fixes its feeds' order (its feed ops' columns): a feed dict
    in another order binds each value to its own variable."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        a = fluid.layers.data("a", [3])
        b = fluid.layers.data("b", [3])
        out = fluid.layers.elementwise_sub(a, fluid.layers.scale(b, 3.0))
    exe, scope = fluid.Executor(strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    fluid.io.save_inference_model(str(tmp_path), ["a", "b"], [out], exe, main_program=main,
                                  scope=scope)
    program, feeds, fetches = fluid.io.load_inference_model(str(tmp_path), exe, scope=scope)
    assert feeds == ["a", "b"]
    av, bv = (np.arange(6, dtype=np.float32).reshape(2, 3) + k for k in (0, 10))
    for feed in ({"a": av, "b": bv}, {"b": bv, "a": av}):
        (got,) = exe.run(program, feed=feed, fetch_list=fetches, scope=scope)
        np.testing.assert_allclose(got, av - 3 * bv)


def test_a_replaced_parameter_is_checked_against_the_allocation_limit(monkeypatch):
    """A native step checks its outputs' sizes once per new tuple of its inputs' shapes; a
    parameter replaced by an array of another shape is checked again (not the memo of the
    shapes it had)."""
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", str(1 << 20))
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [6])
        y = fluid.layers.fc(x, 5, param_attr=fluid.ParamAttr(name="w1"), bias_attr=False)
    scope, exe = fluid.Scope(), fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    xv = np.random.default_rng(4).standard_normal((100, 6)).astype("float32")
    for _ in range(2):
        (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, xv @ scope.find_var("w1").value, rtol=1e-5)
    scope.var("w1").value = np.ones((6, 5000), np.float32)  # the output: 100 x 5000 x 4 B
    with pytest.raises(AllocationLimitError, match=r"\[100, 5000\].*limit of 1048576 bytes"):
        exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
    assert [s.kind for s in _steps(exe, main)] == ["native"]
