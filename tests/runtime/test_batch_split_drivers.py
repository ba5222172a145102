"""A native driver run on slices of the batch, one per loop thread (``tiers.SplitDriver``):
tried beside the host and the native driver for a large batch when the step's ops keep batch
rows independent, never for a step whose ops mix rows, never on one thread. Oracles: NumPy
written here, and the unsplit native driver run on the same slices."""
import threading

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu import tiers as tiers_mod

pytestmark = pytest.mark.usefixtures("counted_trials")

BATCH = 32  # >= tiers.SPLIT_MIN_BATCH


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _mlp():
    """softmax(2 * relu(x @ w0 + b0) + 0.5), for inference."""
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 7
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [6])
        h = fluid.layers.fc(x, 5, act="relu", param_attr=fluid.ParamAttr(name="w0"),
                            bias_attr=fluid.ParamAttr(name="b0"))
        y = fluid.layers.softmax(fluid.layers.scale(h, 2.0, bias=0.5))
    return main.clone(for_test=True), startup, y


def _want(scope, xv):
    w0, b0 = (np.asarray(scope.find_var(n).value) for n in ("w0", "b0"))
    return _softmax(2.0 * np.maximum(xv @ w0 + b0, 0) + 0.5)


def _steps(exe, program):
    return [s for (pid, _), (_, plan) in exe._plans.items() if pid == id(program)
            for s in plan.steps if s.kind == "native"]


@pytest.fixture
def two_threads(monkeypatch):
    """Two loop threads and two free cores whatever the machine has, and the split driver
    picked whenever it is one of the candidates (the trial's timing is the machine's, not the
    test's)."""
    monkeypatch.setattr(threads, "max_loop_threads", lambda: 2)
    monkeypatch.setattr(threads, "free_cores", lambda: 2)
    monkeypatch.setattr(threads, "CHOICE_AFTER", 1 << 30)  # no plan-wide thread trials
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(lambda m: len(m) - 1))


def _served(program, startup, fetch, batch=BATCH, runs=8, seed=0):
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=True, strict=True)
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(seed)
    for _ in range(runs):  # the trials: host, native (and split) drivers, 4 runs each
        xv = rng.standard_normal((batch, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[fetch], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    return exe, scope


def test_a_row_wise_step_runs_on_slices_of_the_batch(two_threads, monkeypatch):
    """The split driver is tried and picked for a large batch: each of two threads runs the
    native driver on half the rows, the result is the unsplit driver's on the same slices
    (bit for bit) and NumPy's; with a core busy it runs unsplit; a small batch is never
    split."""
    program, startup, y = _mlp()
    exe, scope = _served(program, startup, y, runs=12)
    (step,) = _steps(exe, program)
    assert step.tiers.split_rows == (0,) and step.tiers.split_why == ""
    sp = step.tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.parts == 2 and sp.runs > 0
    assert "native split x2" in step.describe() and step.tiers.drivers()[BATCH] == "native split x2"
    seen, native = [], step.native.fn
    sp.fn = lambda *a: (seen.append((threading.current_thread().name, a[0].shape[0])),
                        native(*a))[1]
    xv = np.random.default_rng(5).standard_normal((BATCH, 6)).astype("float32")
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    assert sorted(seen) == [("MainThread", BATCH // 2), ("pdjit-split", BATCH // 2)]
    args = [xv] + [np.asarray(scope.find_var(n).value) for n in step.args[1:]]
    halves = [native(xv[lo:lo + BATCH // 2], *args[1:])[0] for lo in (0, BATCH // 2)]
    np.testing.assert_array_equal(out, np.concatenate(halves))
    # (this model's products take the same BLAS path at either size: the same bits unsplit)
    np.testing.assert_array_equal(out, native(*args)[0])
    np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    seen.clear()  # another process keeps a core busy: the whole batch on this thread
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    assert seen == [("MainThread", BATCH)]
    np.testing.assert_array_equal(out, native(*args)[0])
    for _ in range(8):  # a batch below SPLIT_MIN_BATCH: host and native drivers only
        xv = np.random.default_rng(6).standard_normal((3, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert step.tiers.picked[3] in (step.native.fn, step.compiled.fn)


def test_a_split_untried_for_busy_cores_is_tried_again_once_they_are_free(two_threads,
                                                                          monkeypatch):
    """While another process keeps a core busy, the split driver's trial runs unsplit: the
    pick (here the native driver) is kept only until the cores are free again; the next
    trial then measures the split driver and it serves."""
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(lambda m: 1))
    program, startup, y = _mlp()
    # (the trial runs the split driver again when it ran unsplit, UNSPLIT_REDOS times)
    exe, scope = _served(program, startup, y, runs=12 + tiers_mod.UNSPLIT_REDOS)
    (step,) = _steps(exe, program)
    retry = step.tiers.picked[BATCH]
    assert isinstance(retry, tiers_mod.Retry) and retry.fn is step.native.fn
    assert step.tiers.drivers()[BATCH].startswith("native (split to be tried")
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(lambda m: len(m) - 1))
    rng = np.random.default_rng(9)
    for k in range(14):
        if k == 1:  # a second later, both cores free: the pick is dropped, trials again
            retry.after = 0
            monkeypatch.setattr(threads, "free_cores", lambda: 2)
        xv = rng.standard_normal((BATCH, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
        assert (BATCH in step.tiers.picked) == (k == 0 or k >= 13)
    sp = step.tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.runs == 4  # its trial runs


def test_a_split_run_left_unsplit_by_a_busy_core_is_not_its_time(two_threads, monkeypatch):
    """A split run of the trial that found a core busy (and so ran unsplit) is run again
    rather than taken as the split driver's time: a short burst of another process's work
    does not decide the pick."""
    program, startup, y = _mlp()
    exe, scope = _served(program, startup, y, runs=2)  # the native driver built, trial begun
    (step,) = _steps(exe, program)
    rng = np.random.default_rng(5)
    unsplit = 0
    for _ in range(40):
        if BATCH in step.tiers.picked:
            break
        times = step.tiers._trials.get(BATCH)
        split_turn = times is not None and len(times) == 3 and \
            len(times[2]) < min(len(times[0]), len(times[1]))
        busy = split_turn and unsplit < 3  # the split's turn, three times: a core busy
        unsplit += busy
        monkeypatch.setattr(threads, "free_cores", (lambda: 1) if busy else (lambda: 2))
        xv = rng.standard_normal((BATCH, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert unsplit == 3
    sp = step.tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver)  # picked (two_threads: the last candidate)
    assert sp.runs == tiers_mod.DriverTiers._WARM + tiers_mod.DriverTiers._TIMED  # all split


def test_a_split_that_loses_its_trial_is_tried_again_a_few_times(two_threads, monkeypatch):
    """The split driver measured slower: the pick is dropped for another trial once the
    cores are free, SPLIT_RETRIES times, then kept."""
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(lambda m: 1))
    monkeypatch.setattr(tiers_mod, "RETRY_AFTER", 0.0)
    program, startup, y = _mlp()
    exe, scope = _served(program, startup, y, runs=12)
    (step,) = _steps(exe, program)
    rng = np.random.default_rng(4)
    for _ in range(tiers_mod.SPLIT_RETRIES):
        assert isinstance(step.tiers.picked[BATCH], tiers_mod.Retry)
        for _ in range(13):  # the run that drops the pick, then a trial
            xv = rng.standard_normal((BATCH, 6)).astype("float32")
            (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
            np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert step.tiers.picked[BATCH] is step.native.fn
    assert step.tiers._split[1][0].runs == 4 * (1 + tiers_mod.SPLIT_RETRIES)


def test_a_split_step_serves_concurrent_runs(two_threads):
    """Runs from several threads through one Executor on a step picked to split: each gets
    NumPy's answer (a run finding the helper thread busy runs its slices itself)."""
    program, startup, y = _mlp()
    exe, scope = _served(program, startup, y, runs=12)
    (step,) = _steps(exe, program)
    assert isinstance(step.tiers.picked[BATCH], tiers_mod.SplitDriver)
    errors = []

    def serve(k):
        rng = np.random.default_rng(100 + k)
        try:
            for _ in range(15):
                xv = rng.standard_normal((BATCH, 6)).astype("float32")
                (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
                np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    ts = [threading.Thread(target=serve, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors[0]
    assert step.tiers.picked[BATCH].runs >= 60


def test_a_bad_parameter_is_reported_as_without_the_split(two_threads):
    """A parameter replaced by one of the wrong shape fails in the split driver as it does
    without native drivers: the references name the op."""
    program, startup, y = _mlp()
    exe, scope = _served(program, startup, y, runs=12)
    (step,) = _steps(exe, program)
    assert isinstance(step.tiers.picked[BATCH], tiers_mod.SplitDriver)
    xv = np.ones((BATCH, 6), np.float32)
    messages = []
    for e in (exe, fluid.Executor(native_drivers=False, strict=True)):
        s2 = fluid.Scope()
        for n in ("w0", "b0"):
            s2.var(n).value = np.asarray(scope.find_var(n).value)
        s2.var("w0").value = np.ones((7, 5), np.float32)
        with pytest.raises(Exception) as info:
            e.run(program, feed={"x": xv}, fetch_list=[y], scope=s2)
        messages.append((type(info.value), str(info.value)))
    assert messages[0] == messages[1]
    assert "mul" in messages[0][1]


def test_a_step_that_mixes_rows_is_not_split(two_threads):
    """x - mean(x over the batch): the step's rows depend on other rows, so only the host and
    the native driver are tried, and the answer is NumPy's."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [6])
        y = fluid.layers.relu(fluid.layers.elementwise_sub(
            x, fluid.layers.reduce_mean(x, dim=[0], keep_dim=True)))
    scope, exe = fluid.Scope(), fluid.Executor(native_drivers=True, strict=True)
    rng = np.random.default_rng(2)
    for _ in range(10):
        xv = rng.standard_normal((BATCH, 6)).astype("float32")
        (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, np.maximum(xv - xv.mean(0, keepdims=True), 0),
                                   rtol=1e-5, atol=1e-6)
    steps = _steps(exe, main)
    assert steps and all(s.native is not None for s in steps)
    assert any("reduce_mean" in s.tiers.split_why for s in steps)
    for s in steps:
        assert s.tiers.split_rows is None and s.tiers.split_why
        assert s.tiers.picked[BATCH] in (s.native.fn, s.compiled.fn)


def test_one_thread_means_no_split(monkeypatch):
    """PDJIT_NUM_THREADS=1: the rows are independent, but the batch is never split."""
    monkeypatch.setenv("PDJIT_NUM_THREADS", "1")
    monkeypatch.setattr(threads, "_default_threads", None)
    monkeypatch.setattr(threads, "_applied", None)
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(lambda m: len(m) - 1))
    assert threads.loop_threads() == 1
    program, startup, y = _mlp()
    exe, _ = _served(program, startup, y)
    (step,) = _steps(exe, program)
    assert step.tiers.split_rows == (0,)
    assert step.tiers.picked[BATCH] is step.native.fn  # (the last of two candidates)


def test_run_parts_runs_the_parts_at_once_and_in_order():
    """``threads.run_parts``: results in order, the first part on this thread and another on
    a helper; an exception is the first failing part's, raised once every part ended; with
    no helper allowed every part runs here."""
    names = []

    def part(k, fail=False):
        names.append((k, threading.current_thread().name))
        if fail:
            raise ValueError(f"part {k}")
        return k * 10

    assert threads.run_parts(part, [(0,), (1,)], most=1) == [0, 10]
    assert dict(names) == {0: "MainThread", 1: "pdjit-split"}
    names.clear()
    with pytest.raises(ValueError, match="part 1"):
        threads.run_parts(part, [(0,), (1, True), (2, True)], most=1)
    assert sorted(k for k, _ in names) == [0, 1, 2]
    names.clear()
    assert threads.run_parts(part, [(0,), (1,), (2,)], most=0) == [0, 10, 20]
    assert {n for _, n in names} == {"MainThread"}


def _host_driven(batch, seed):
    """The MLP run at ``batch`` through the Executor with native drivers until its step's
    drivers are settled (each result checked against NumPy): ``(exe, program, scope, y,
    rng, step)``."""
    program, startup, y = _mlp()
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers="background", strict=True)
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(seed)
    for _ in range(tiers_mod.BACKGROUND_RUNS + 10):
        xv = rng.standard_normal((batch, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    (step,) = _steps(exe, program)
    return exe, program, scope, y, rng, step


def test_the_slices_replay_the_host_driver_on_their_threads(two_threads, monkeypatch):
    """Each thread's slices are recorded and replayed on that thread (``codegen/cpu/replay``:
    a recording serves the thread it was made on), giving NumPy's values."""
    from pdjit.codegen.cpu import replay

    monkeypatch.setattr(tiers_mod, "DRIVER_MAX_CALLS", 0)
    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)
    monkeypatch.setattr(replay, "TRIAL_RUNS", 0)  # (too short to time: served at once)
    exe, program, scope, y, rng, step = _host_driven(BATCH, 4)
    rp = step.tiers.replay
    for _ in range(replay.AFTER_RUNS + 3):
        xv = rng.standard_normal((BATCH, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    (chunk,) = tiers_mod.HOST_CHUNK_ROWS
    by = {k[3] for k in rp.recordings if k[1][0][0] == chunk}
    assert len(by) == 2 and rp.replays > 0, (rp.off, rp.why, list(rp.recordings))


def test_a_step_without_a_native_driver_runs_the_host_driver_on_slices(two_threads,
                                                                       monkeypatch):
    """A step whose native driver would not pay (here: more kernel calls than
    ``DRIVER_MAX_CALLS`` allows, as a CNN's whole-model step) but whose ops keep batch rows
    independent: at a large batch the host driver itself is tried on slices of the batch,
    each slice on its own thread with its kernels on that thread alone (no split inside a
    slice), each slice by ``HOST_CHUNK_ROWS`` rows a call; the result is the host driver's on
    the same rows and NumPy's. A small batch runs the host driver as before, with no trial."""
    monkeypatch.setattr(tiers_mod, "DRIVER_MAX_CALLS", 0)
    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)
    exe, program, scope, y, rng, step = _host_driven(BATCH, 3)
    tiers = step.tiers
    assert isinstance(tiers.native, tiers_mod.HostSlices) and step.native is None
    assert "would not pay" in tiers.native_failed
    sp = tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.parts == 2 and sp.runs > 0
    (chunk,) = tiers_mod.HOST_CHUNK_ROWS
    assert sp.chunk == chunk and BATCH // 2 > chunk
    name = f"host split x2 by {chunk} rows"
    assert tiers.drivers()[BATCH] == name and name in step.describe()
    seen, host = [], tiers.native.host
    tiers.native.host = lambda *a: (seen.append((threading.current_thread().name,
                                                 a[0].shape[0], threads.loop_threads())),
                                    host(*a))[1]
    xv = rng.standard_normal((BATCH, 6)).astype("float32")
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    # calls of `chunk` rows on the two threads (each at least one), nothing split again
    assert len(seen) == BATCH // chunk and {s[1:] for s in seen} == {(chunk, 1)}
    assert {s[0] for s in seen} == {"MainThread", "pdjit-split"}
    assert threads.loop_threads() == 2  # (restored after the slice)
    args = [xv] + [np.asarray(scope.find_var(n).value) for n in step.args[1:]]
    parts = [host(xv[lo:lo + chunk], *args[1:])[0] for lo in range(0, BATCH, chunk)]
    np.testing.assert_array_equal(out, np.concatenate(parts))
    np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    seen.clear()  # a batch below HOST_SPLIT_MIN_BATCH: the host driver, no trial, no pick
    small = tiers_mod.HOST_SPLIT_MIN_BATCH - 1
    for _ in range(4):
        xv = rng.standard_normal((small, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert seen == [] and small not in tiers.picked and tiers.settled(small)
    # from HOST_SPLIT_MIN_BATCH (below the native drivers' SPLIT_MIN_BATCH) it is tried too,
    # a slice of one row where the batch has no more
    least = tiers_mod.HOST_SPLIT_MIN_BATCH
    assert least == 2 < tiers_mod.SPLIT_MIN_BATCH
    for _ in range(10):
        xv = rng.standard_normal((least, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert tiers.drivers()[least] == name and tiers.settled(least)
    seen.clear()
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    assert sorted(seen) == [("MainThread", 1, 1), ("pdjit-split", 1, 1)]
    np.testing.assert_array_equal(out, np.concatenate([host(xv[r:r + 1], *args[1:])[0]
                                                       for r in range(least)]))
    # a batch of 3: a row a slice, then the last row on the host driver with both threads
    # (the slices not a row apart)
    rest = []
    (sp,) = tiers._split[1]
    assert sp.rest == tiers._host_fn  # (the host driver, replayed where recorded)
    sp.rest = lambda *a: (rest.append((threading.current_thread().name, a[0].shape[0],
                                       threads.loop_threads())), host(*a))[1]
    for _ in range(10):
        xv = rng.standard_normal((3, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert tiers.drivers()[3] == name
    seen.clear(), rest.clear()
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    assert sorted(seen) == [("MainThread", 1, 1), ("pdjit-split", 1, 1)]
    assert rest == [("MainThread", 1, 2)]
    np.testing.assert_array_equal(out, np.concatenate([host(xv[r:r + 1], *args[1:])[0]
                                                       for r in range(3)]))


def test_each_size_of_call_of_the_host_drivers_slices_is_a_candidate(two_threads,
                                                                     monkeypatch):
    """With more than one size in ``HOST_CHUNK_ROWS``, the trial has a split driver for each
    (the best size depends on the model: its activations beside its weights); the one picked
    runs its slices by its own size of call, and gives the host driver's values on those
    rows and NumPy's."""
    monkeypatch.setattr(tiers_mod, "HOST_CHUNK_ROWS", (4, 1))
    monkeypatch.setattr(tiers_mod, "DRIVER_MAX_CALLS", 0)
    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)
    seen_times = []
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(
        lambda t: (seen_times.append(len(t)), len(t) - 1)[1]))  # (the last: a row a call)
    exe, program, scope, y, rng, step = _host_driven(BATCH, 6)
    tiers = step.tiers
    for _ in range(4):  # (a candidate more than the host driver and one split: 4 more runs)
        xv = rng.standard_normal((BATCH, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert seen_times == [3]  # the host driver and two split drivers
    assert [sp.chunk for sp in tiers._split[1]] == [4, 1]
    sp = tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.chunk == 1 and sp.runs > 0
    assert tiers.drivers()[BATCH] == "host split x2 by 1 rows"
    seen, host = [], tiers.native.host
    tiers.native.host = lambda *a: (seen.append(a[0].shape[0]), host(*a))[1]
    xv = rng.standard_normal((BATCH, 6)).astype("float32")
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    per = -(-BATCH // 2 // tiers_mod.HOST_MAX_CHUNKS)  # (at most HOST_MAX_CHUNKS calls a slice)
    assert seen == [per] * (BATCH // per)
    args = [xv] + [np.asarray(scope.find_var(n).value) for n in step.args[1:]]
    np.testing.assert_array_equal(out, np.concatenate(
        [host(xv[lo:lo + per], *args[1:])[0] for lo in range(0, BATCH, per)]))
    np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)


def test_on_one_thread_the_host_driver_is_tried_by_calls_of_a_few_rows(monkeypatch):
    """On one loop thread, a step without a native driver whose ops keep batch rows
    independent is tried, from a batch of more than ``HOST_CHUNK_ROWS`` rows, against itself
    run by calls of that many rows one after another (the activations of a few rows stay in
    the caches); the result is the host driver's on the same rows and NumPy's. A batch of at
    most that many rows runs the host driver, picked without a trial."""
    monkeypatch.setattr(threads, "max_loop_threads", lambda: 1)
    monkeypatch.setattr(threads, "CHOICE_AFTER", 1 << 30)
    monkeypatch.setattr(tiers_mod, "DRIVER_MAX_CALLS", 0)
    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)
    # the chunked driver picked whenever it is a candidate (the trial's timing is the
    # machine's, not the test's)
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(lambda t: len(t) - 1))
    (chunk,) = tiers_mod.HOST_CHUNK_ROWS
    batch = 2 * chunk + 1  # (two whole calls and one of a row)
    exe, program, scope, y, rng, step = _host_driven(batch, 5)
    tiers = step.tiers
    assert isinstance(tiers.native, tiers_mod.HostSlices) and step.native is None
    sp = tiers.picked[batch]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.parts == 1 and sp.runs > 0
    assert tiers.drivers()[batch] == f"host by {chunk} rows" and tiers.settled(batch)
    seen, host = [], tiers.native.host
    tiers.native.host = lambda *a: (seen.append((threading.current_thread().name,
                                                 a[0].shape[0])), host(*a))[1]
    xv = rng.standard_normal((batch, 6)).astype("float32")
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    assert seen == [("MainThread", chunk), ("MainThread", chunk), ("MainThread", 1)]
    args = [np.asarray(scope.find_var(n).value) for n in step.args[1:]]
    parts = [host(xv[lo:lo + chunk], *args)[0] for lo in range(0, batch, chunk)]
    np.testing.assert_array_equal(out, np.concatenate(parts))
    np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    seen.clear()  # a batch of `chunk` rows: nothing to cut, the host driver picked at once
    xv = rng.standard_normal((chunk, 6)).astype("float32")
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
    np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)
    assert seen == [] and not isinstance(tiers.picked[chunk], tiers_mod.SplitDriver)
    assert tiers.drivers()[chunk] == "host" and tiers.settled(chunk)


def test_a_large_batch_is_run_in_at_most_a_few_calls_a_slice(monkeypatch):
    """By ``HOST_CHUNK_ROWS`` rows a call, but in at most ``HOST_MAX_CHUNKS`` calls a slice
    (each call pays the host driver's own time again): more rows a call for a large batch;
    the outputs are the calls' concatenated, the arguments not sliced passed whole."""
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    rows_seen = []

    def fn(x, w):
        rows_seen.append(x.shape[0])
        return (x * w, x[:, :1])

    (chunk,), most = tiers_mod.HOST_CHUNK_ROWS, tiers_mod.HOST_MAX_CHUNKS
    x, w = np.arange(300.0).reshape(100, 3), np.array([1.0, 2.0, 3.0])
    one = tiers_mod.SplitDriver(fn, (0,), 1, chunk)
    out = one(x, w)
    per = -(-100 // most)
    assert per > chunk and rows_seen == [per] * (100 // per) + [100 % per]
    np.testing.assert_array_equal(out[0], x * w)
    np.testing.assert_array_equal(out[1], x[:, :1])
    rows_seen.clear()
    assert one(x[:2 * chunk], w)[0].shape == (2 * chunk, 3) and rows_seen == [chunk, chunk]
    rows_seen.clear()  # two slices of 50 rows: each in `most` calls at most
    out = tiers_mod.SplitDriver(fn, (0,), 2, chunk)(x, w)
    assert sorted(rows_seen) == sorted(([-(-50 // most)] * (50 // -(-50 // most))
                                        + [50 % -(-50 // most)]) * 2)
    np.testing.assert_array_equal(out[0], x * w)
    rows_seen.clear()  # a batch of `chunk` rows or fewer on one thread: not cut
    assert not one.splits(chunk) and one(x[:chunk], w)[0].shape == (chunk, 3)
    assert rows_seen == [chunk]


def test_the_threads_of_a_split_by_chunks_share_its_calls(monkeypatch):
    """The calls of a split by chunks are taken in turn: a thread whose core runs slower makes
    fewer of them (here the caller's: its first call lasts until the helper has made every
    other one, or 10 s) rather than half, each thread makes at least one, and the outputs keep
    the rows' order; a call that fails stops the taking and its error is raised."""
    import time

    monkeypatch.setattr(threads, "slice_threads", lambda: 2)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    (chunk,) = tiers_mod.HOST_CHUNK_ROWS[:1]
    x, w = np.arange(48.0).reshape(16, 3), np.array([1.0, 2.0, 3.0])
    main, by, calls = threading.get_ident(), [], 16 // chunk

    def fn(x, w):
        me = threading.get_ident()
        by.append(me)
        deadline = time.monotonic() + 10
        while me == main and len(by) < calls and time.monotonic() < deadline:
            time.sleep(0.001)
        return (x * w,)

    two = tiers_mod.SplitDriver(fn, (0,), 2, chunk)
    (out,) = two(x, w)
    np.testing.assert_array_equal(out, x * w)
    assert len(by) == calls and by.count(main) == 1 and two.runs == 1

    def failing(x, w):
        if x[0, 0] == 3.0 * chunk:  # the second call
            raise ValueError("the second call")
        return (x * w,)

    with pytest.raises(ValueError, match="the second call"):
        tiers_mod.SplitDriver(failing, (0,), 2, chunk)(x, w)


def test_a_chunked_driver_without_free_cores_runs_by_its_chunks_on_the_caller(monkeypatch):
    """A driver of two slices by chunks whose cores are not free (another process keeps one
    busy: ``slice_threads`` 1) runs the whole batch by its chunks on the caller's thread, as
    a one-part driver does, and does not count the run as split; a driver without chunks runs
    the batch at once, as before."""
    monkeypatch.setattr(threads, "slice_threads", lambda: 1)
    callers, rows_seen = set(), []

    def fn(x, w):
        callers.add(threading.get_ident())
        rows_seen.append(x.shape[0])
        return (x * w,)

    (chunk,) = tiers_mod.HOST_CHUNK_ROWS[:1]
    x, w = np.arange(48.0).reshape(16, 3), np.array([1.0, 2.0, 3.0])
    two = tiers_mod.SplitDriver(fn, (0,), 2, chunk)
    (out,) = two(x, w)
    np.testing.assert_array_equal(out, x * w)
    assert rows_seen == [chunk] * (16 // chunk) and callers == {threading.get_ident()}
    assert two.runs == 0
    rows_seen.clear()
    (out,) = tiers_mod.SplitDriver(fn, (0,), 2)(x, w)
    np.testing.assert_array_equal(out, x * w)
    assert rows_seen == [16]
    monkeypatch.setattr(threads, "slice_threads", lambda: 2)
    rows_seen.clear()
    (out,) = two(x, w)  # (the cores free again: two slices, each by its chunks)
    np.testing.assert_array_equal(out, x * w)
    assert rows_seen == [chunk] * (16 // chunk) and two.runs == 1


def test_a_split_by_chunks_tried_while_a_core_is_busy_is_timed_by_its_chunks(two_threads,
                                                                             monkeypatch):
    """A trial of the host driver's slices while another process keeps a core busy: the
    split drivers by chunks run the batch by their chunks on the caller's thread and those
    times count (no infinite time, as for a native split driver that cannot split); the one
    picked serves so, by its chunks, and the drivers are tried again once the cores are free,
    when it splits. Every result is NumPy's."""
    monkeypatch.setattr(tiers_mod, "DRIVER_MAX_CALLS", 0)
    monkeypatch.setattr(tiers_mod, "TIER_UP_THREAD", False)
    monkeypatch.setattr(tiers_mod, "RETRY_AFTER", 1e6)  # (only runs bring the next trial)
    free = [1]
    monkeypatch.setattr(threads, "free_cores", lambda: free[0])
    seen_times = []
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(
        lambda t: (seen_times.append(list(t)), len(t) - 1)[1]))  # (the last: a split one)
    exe, program, scope, y, rng, step = _host_driven(BATCH, 7)
    tiers = step.tiers
    (times,) = seen_times
    assert len(times) == 1 + len(tiers_mod.HOST_CHUNK_ROWS) and max(times) < float("inf")
    retry = tiers.picked[BATCH]
    assert isinstance(retry, tiers_mod.Retry) and isinstance(retry.fn, tiers_mod.SplitDriver)
    assert retry.fn.runs == 0 and "drivers to be tried when the cores are free" in \
        tiers.drivers()[BATCH]
    seen, host = [], tiers.native.host
    tiers.native.host = lambda *a: (seen.append((threading.current_thread().name,
                                                 a[0].shape[0])), host(*a))[1]

    def run():
        xv = rng.standard_normal((BATCH, 6)).astype("float32")
        (out,) = exe.run(program, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, _want(scope, xv), rtol=1e-5, atol=1e-6)

    run()
    chunk = retry.fn.chunk
    assert seen == [("MainThread", chunk)] * (BATCH // chunk)
    free[0] = 2  # the cores free: the pick dropped at its next check, the drivers tried again
    trial = 3 * (tiers_mod.DriverTiers._WARM + tiers_mod.DriverTiers._TIMED)  # (runs)
    for _ in range(tiers_mod.RETRY_RUNS + trial):
        run()
    sp = tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.runs > 0 and len(seen_times) == 2
    seen.clear()
    run()
    assert {name for name, _ in seen} == {"MainThread", "pdjit-split"}
