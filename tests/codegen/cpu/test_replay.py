"""A host driver's kernel calls recorded and replayed (``pdjit.codegen.cpu.replay``).

Oracle: a small CNN (a strided 3x3 convolution, a depthwise one, a pointwise one with a
residual, an average pool, a softmax layer) computed in NumPy here from the scope's
parameters. Replayed runs must give it for inputs the recording never saw, give the host
driver's own bits, leave earlier results alone, follow a parameter given a new array or
written by a run, and serve no other thread; a recording that misses a kernel call is caught
by its check and never kept; a driver the recorder does not know is never replayed.
"""
import gc
import math
import threading

import numba
import numpy as np
import pytest
from conv_oracle import conv_ref

import pdjit as fluid
from pdjit.codegen import params
from pdjit.codegen.cpu import replay, threads
from pdjit.codegen.cpu.lib import conv as convlib
from pdjit.codegen.cpu.lib import pointwise, team
from pdjit.testing import assert_native

RNG = np.random.default_rng(68)
HW = 12


@pytest.fixture(autouse=True)
def _untimed(monkeypatch):
    """A recording serves its key at once (no timed trial against the driver: the runs here
    are too short to time; the trial has a test of its own), and a plan's runs keep the
    threads they are given (no trial of one thread against several, and the free cores as
    they were: either would make runs of another key)."""
    monkeypatch.setattr(replay, "TRIAL_RUNS", 0)
    # (the cores other processes leave free, read once: a key holds the loop threads, which
    # would change with them, and a test's runs be counted again under a new key)
    free = threads.free_cores()
    monkeypatch.setattr(threads, "free_cores", lambda: free)
    monkeypatch.setattr(threads.RunChoice, "begin", lambda self, key: None)
    monkeypatch.setattr(threads.RunChoice, "end", lambda self, key, seconds: None)


def _program():
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 5
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = L.data("img", [3, HW, HW])
        c1 = L.conv2d(img, 16, 3, stride=2, padding=1, act="relu")
        dw = L.conv2d(c1, 16, 3, padding=1, groups=16, act="relu")
        y = L.elementwise_add(L.conv2d(dw, 24, 1), L.conv2d(c1, 24, 1))
        p = L.pool2d(y, pool_type="avg", global_pooling=True)
        out = L.fc(p, 10, act="softmax")
    return main.clone(for_test=True), startup, out


def _oracle(x, v):
    def conv(t, i, stride=1, pad=0, groups=1):
        return conv_ref(t, v[f"conv2d_{i}.w_0"], v[f"conv2d_{i}.b_0"], stride, pad, groups)

    c1 = np.maximum(conv(x, 0, stride=2, pad=1), 0)
    dw = np.maximum(conv(c1, 1, pad=1, groups=16), 0)
    y = conv(dw, 2) + conv(c1, 3)
    z = y.mean(axis=(2, 3)) @ v["fc_0.w_0"] + v["fc_0.b_0"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _executor():
    main, startup, out = _program()
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers="auto")  # (an inference plan: its step has tiers)
    exe.run(startup, scope=scope)
    for name in list(scope.local_var_names()):
        a = scope.find_var(name).value
        if isinstance(a, np.ndarray) and a.dtype == np.float32 and name.endswith(("w_0", "b_0")):
            scope.find_var(name).value = (RNG.standard_normal(a.shape) * 0.3).astype(np.float32)
    return exe, main, scope, out


def _values(scope):
    return {n: np.asarray(scope.find_var(n).value, np.float64) for n in scope.local_var_names()
            if n.endswith(("w_0", "b_0"))}


def _replays(exe, some=True):
    found = [s.tiers.replay for _, plan in exe._plans.values() for s in plan.walk()
             if getattr(s, "tiers", None) is not None and s.tiers.replay is not None]
    assert found or not some, "no step of the plan has a host replay"
    return found


def _run(exe, main, scope, out, x):
    return exe.run(main, feed={"img": x}, fetch_list=[out], scope=scope)[0]


def _image(b=2):
    return RNG.standard_normal((b, 3, HW, HW)).astype(np.float32)


def _settle(exe, main, scope, out, b=2):
    """Run until a recording serves (the parallel loops a run loads from the disk cache, one
    a run, each invalidate the recordings made before it)."""
    for _ in range(40):
        before = sum(r.replays for r in _replays(exe, some=False))
        _run(exe, main, scope, out, _image(b))
        if sum(r.replays for r in _replays(exe)) > before:
            return
    raise AssertionError(f"never replayed: {[r.why for r in _replays(exe)]}")


def test_replayed_runs_give_the_oracle_and_the_drivers_bits(monkeypatch):
    monkeypatch.setattr(replay, "NATIVE_AFTER", 2)  # (its calls native from its 2nd run)
    monkeypatch.setattr(replay, "NATIVE_THREAD", False)  # (compiled in that run)
    exe, main, scope, out = _executor()
    _settle(exe, main, scope, out)
    xs = [_image() for _ in range(5)]
    got = [_run(exe, main, scope, out, x) for x in xs]
    kept = [g.copy() for g in got]
    (rp,) = _replays(exe)
    assert rp.off is None and rp.recordings and rp.replays > len(xs)
    assert_native(exe)
    # (its kernel calls made by native calls, each a run of them: callchain's)
    assert any(type(p) is tuple for rec in rp.recordings.values() for p in rec.parts or ())
    ops = [fn for rec in rp.recordings.values() for fn, *_ in rec.ops]
    # (the 1x1 convolutions' entry point replayed as the packed kernel it ends in)
    assert {pointwise.pointwise_rows, pointwise.pointwise_cols} & set(ops) and not any(
        replay._kind_of(fn) == "leaves" for fn in ops), ops
    v = _values(scope)
    for x, g, k in zip(xs, got, kept):
        np.testing.assert_allclose(g, _oracle(x.astype(np.float64), v), rtol=2e-4, atol=1e-6)
        np.testing.assert_array_equal(g, k)  # (a later run wrote no earlier result)
    monkeypatch.setattr(rp, "off", "compared")  # the host driver itself
    for x, g in zip(xs, got):
        np.testing.assert_array_equal(_run(exe, main, scope, out, x), g)


def test_a_recording_goes_native_after_its_runs_with_the_drivers_bits(monkeypatch):
    """Its runs of kernel calls made by native calls (``callchain``) once it has served
    ``NATIVE_AFTER`` runs, not before: that run starts their compile on a thread of its own
    and is served from Python, as are the runs while it lasts; the first run after it ends
    checks and takes them (two more replays: it moves ``threads.LOADS``, no sample of a trial
    of threads). The results the host driver's, bit for bit."""
    monkeypatch.setattr(replay, "NATIVE_AFTER", 5)
    exe, main, scope, out = _executor()
    _settle(exe, main, scope, out)
    (rp,) = _replays(exe)
    (rec,) = rp.recordings.values()
    xs = [_image() for _ in range(8)]
    got = []
    for x in xs:
        loads = threads.LOADS[0]
        got.append(_run(exe, main, scope, out, x))
        if rec.runs < replay.NATIVE_AFTER:
            assert rec.parts is None and rec.building is None, rec.runs
        elif rec.runs == replay.NATIVE_AFTER:  # (the compile under way, the run from Python)
            assert rec.parts is None and rec.building is not None, rec.runs
            thread = rec.building[0]
            assert thread is not None and thread is not threading.current_thread()
            thread.join()
        else:  # (taken at the first run after it: that one moved LOADS, none after)
            assert rec.parts is not None and rec.building is None, rec.runs
            assert (threads.LOADS[0] != loads) == (rec.runs == replay.NATIVE_AFTER + 1)
    assert rec.runs > replay.NATIVE_AFTER + 1 and any(type(p) is tuple for p in rec.parts)
    monkeypatch.setattr(rp, "off", "compared")  # the host driver itself
    for x, g in zip(xs, got):
        np.testing.assert_array_equal(_run(exe, main, scope, out, x), g)


def test_a_new_key_goes_native_sooner_once_a_recording_of_its_step_did(monkeypatch):
    """Once a recording of a step went native (the step is served), a new key's recording
    (another batch size here; the same program at other threads, another slice of a batch, or
    one made again after a kernel became ready) makes its calls native at its
    ``HOT_NATIVE_AFTER``-th run, not after ``NATIVE_AFTER``; its results the oracle's."""
    monkeypatch.setattr(replay, "NATIVE_AFTER", 6)
    monkeypatch.setattr(replay, "NATIVE_THREAD", False)  # (compiled in the run)
    exe, main, scope, out = _executor()
    _settle(exe, main, scope, out)
    (rp,) = _replays(exe)
    (rec,) = rp.recordings.values()
    assert not rp.hot
    for _ in range(replay.NATIVE_AFTER):
        _run(exe, main, scope, out, _image())
    assert rec.parts is not None and rp.hot
    v = _values(scope)
    for _ in range(replay.AFTER_RUNS + 2 * replay.TRIAL_RUNS + 2):
        x = _image(3)
        np.testing.assert_allclose(_run(exe, main, scope, out, x),
                                   _oracle(x.astype(np.float64), v), rtol=2e-4, atol=1e-6)
    new = next(r for k, r in rp.recordings.items() if k[1][0][0] == 3)
    assert new.native_after == replay.HOT_NATIVE_AFTER <= new.runs < replay.NATIVE_AFTER
    assert new.parts is not None and any(type(p) is tuple for p in new.parts)


def test_a_hurried_recording_goes_native_at_its_next_run(monkeypatch):
    """``HostReplay.hurry`` (the step is served and a trial of its plan's threads is due:
    ``DriverTiers.settled`` says so): a recording still replayed from Python makes its calls
    native at its next run, not at its ``NATIVE_AFTER``-th; its results the oracle's."""
    monkeypatch.setattr(replay, "NATIVE_THREAD", False)  # (compiled in that run)
    exe, main, scope, out = _executor()
    _settle(exe, main, scope, out)
    (rp,) = _replays(exe)
    (rec,) = rp.recordings.values()
    assert rec.parts is None and rec.runs + 2 < replay.NATIVE_AFTER and not rp.hot
    rp.hurry()
    assert rp.hot and rec.native_after == max(rec.runs + 1, replay.HOT_NATIVE_AFTER)
    x = _image()
    loads = threads.LOADS[0]
    got = _run(exe, main, scope, out, x)
    assert rec.parts is not None and any(type(p) is tuple for p in rec.parts)
    assert threads.LOADS[0] != loads  # (the run that compiled them: no sample of a trial)
    np.testing.assert_allclose(got, _oracle(x.astype(np.float64), _values(scope)), rtol=2e-4,
                               atol=1e-6)


def test_runs_served_as_they_will_not_be_for_long_move_warming(monkeypatch):
    """A key's driver runs before it is recorded and its recording's trial against the driver
    move ``threads.WARMING`` (the run that records moves ``threads.LOADS``), the recording's
    replays from Python before its calls go native ``threads.PY_REPLAYS``: no samples of a
    trial of threads. The native replays after move none of them."""
    monkeypatch.setattr(replay, "NATIVE_AFTER", 5)
    monkeypatch.setattr(replay, "NATIVE_THREAD", False)  # (compiled in the run)
    monkeypatch.setattr(replay, "TRIAL_RUNS", 2)
    exe, main, scope, out = _executor()
    _settle(exe, main, scope, out)
    (rp,) = _replays(exe)
    seen = []  # (how the run was served, which counters moved)
    counters = (threads.WARMING, threads.PY_REPLAYS, threads.LOADS)
    for _ in range(2 * (replay.AFTER_RUNS + 2 * replay.TRIAL_RUNS + replay.NATIVE_AFTER)):
        before = [c[0] for c in counters]
        _run(exe, main, scope, out, _image(3))  # (a new batch size: a key of its own)
        rec = next((r for k, r in rp.recordings.items() if k[1][0][0] == 3), None)
        how = "driver" if rec is None else "native" if rec.parts is not None else "python"
        seen.append((how, "".join("wpl"[i] for i, c in enumerate(counters)
                                  if c[0] != before[i])))
    hows = [h for h, _ in seen]
    assert hows[:replay.AFTER_RUNS] == ["driver"] * replay.AFTER_RUNS, seen
    assert "python" in hows and hows[-1] == "native", seen
    first = hows.index("native")  # (its run made the calls native: LOADS)
    assert all(m == "w" for _, m in seen[:replay.AFTER_RUNS]), seen
    assert all(m for _, m in seen[:first + 1]), seen
    after = [m for _, m in seen[replay.AFTER_RUNS + 1:first]]  # (after the recording's run)
    assert any("w" in m for m in after) and after[-1] == "p", seen  # its trial, then Python
    assert not any(m for _, m in seen[first + 1:]), seen


def test_a_new_batch_size_is_recorded_apart():
    exe, main, scope, out = _executor()
    _settle(exe, main, scope, out)
    for b in (3, 3, 3, 3, 3, 2):
        x = _image(b)
        np.testing.assert_allclose(_run(exe, main, scope, out, x),
                                   _oracle(x.astype(np.float64), _values(scope)),
                                   rtol=2e-4, atol=1e-6)
    (rp,) = _replays(exe)
    assert {k[1][0][0] for k in rp.recordings} == {2, 3}


def test_a_parameter_given_a_new_array_or_written_is_followed():
    exe, main, scope, out = _executor()
    x = _image()
    _settle(exe, main, scope, out)
    (rp,) = _replays(exe)
    served = rp.replays
    w = scope.find_var("conv2d_2.w_0")
    w.value = (w.value * -2.0).astype(np.float32)  # a new array
    np.testing.assert_allclose(_run(exe, main, scope, out, x),
                               _oracle(x.astype(np.float64), _values(scope)),
                               rtol=2e-4, atol=1e-6)
    assert rp.replays == served  # (the recording named the old array: the driver ran)
    _settle(exe, main, scope, out)  # (recorded again, on the new array)
    before = params.generation()
    w.value[...] *= 0.5   # written in place, then said so (as a run writing it does)
    params.derived(w.value, ("test",), lambda: 0)
    params.written([w.value])
    assert params.generation() != before
    served = rp.replays
    np.testing.assert_allclose(_run(exe, main, scope, out, x),
                               _oracle(x.astype(np.float64), _values(scope)),
                               rtol=2e-4, atol=1e-6)
    assert rp.replays == served


def test_no_replay_on_another_thread():
    exe, main, scope, out = _executor()
    _settle(exe, main, scope, out)
    (rp,) = _replays(exe)
    served = rp.replays
    x = _image()
    got = []
    t = threading.Thread(target=lambda: got.append(_run(exe, main, scope, out, x)))
    t.start()
    t.join()
    np.testing.assert_allclose(got[0], _oracle(x.astype(np.float64), _values(scope)),
                               rtol=2e-4, atol=1e-6)
    assert rp.replays == served


def test_parallel_loops_are_recorded_and_replayed(monkeypatch):
    """Every convolution split over two threads by a parallel loop (its threshold at 0): the
    loops' calls recorded below ``split_work`` and replayed, the oracle's values, one thread's
    bits."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    monkeypatch.setattr(team, "COMPILE", True)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(convlib, "_TEAM_MIN_WORK", 0)
    monkeypatch.setattr(convlib, "_CHANNELS_MIN_WORK", 0)
    monkeypatch.setattr(threads, "free_cores", lambda: 2)
    monkeypatch.setattr(threads, "_applied", 2)
    leaves = []
    real = replay._Recorder.leaf
    monkeypatch.setattr(replay._Recorder, "leaf", lambda self, fn, args, team=False:
                        leaves.append(fn) or real(self, fn, args, team))
    saved = numba.get_num_threads()
    threads._run_local.loops = threads._run_local.key = None
    try:
        exe, main, scope, out = _executor()
        x = _image(1)
        got = [_run(exe, main, scope, out, x) for _ in range(7)]
        (rp,) = _replays(exe)
        assert rp.off is None and rp.replays, rp.why
        assert any(getattr(f, "__name__", "").endswith(("_parts", "_by_channels", "_by_pixels"))
                   for f in leaves), leaves
        np.testing.assert_allclose(got[-1], _oracle(x.astype(np.float64), _values(scope)),
                                   rtol=2e-4, atol=1e-6)
        monkeypatch.setattr(threads, "free_cores", lambda: 1)  # one thread: its own recording
        one = [_run(exe, main, scope, out, x) for _ in range(6)]
        np.testing.assert_array_equal(one[-1], got[-1])
        assert {k[2] for k in rp.recordings} == {1, 2}
    finally:
        numba.set_num_threads(saved)
        threads._run_local.loops = threads._run_local.key = None


# ---- the recorder on drivers written here ---------------------------------------------------
@numba.njit(cache=False)
def _double(x, out):
    for i in range(x.size):
        out.flat[i] = 2 * x.flat[i]


def _hidden(x, out):  # its kernel call is below an entry point, through no hook
    _double(x, out)


class _Driver:
    def __init__(self, source, **ns):
        self.source = source
        g = {"np": np, "_double": _double, **ns}
        exec(source, g)  # noqa: S102
        self.fn = g["segment"]


_SOURCE = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    {call}(a0, s1)
    s2 = s1.reshape((s1.size, ))
    return (s2, a1)
"""


def _serve(drv, runs=6):
    rp = replay.HostReplay(drv, params=[1])
    w = np.ones(3, np.float32)
    outs = []
    for i in range(runs):
        x = np.full((2, 2), i, np.float32)
        outs.append(rp.call([x, w]))
        np.testing.assert_array_equal(outs[-1][0], 2 * x.reshape(-1))
        np.testing.assert_array_equal(outs[-1][1], w)
    return rp, outs


def test_a_kernel_call_of_the_driver_is_replayed():
    owner = threads._team_owner[0]
    rp, outs = _serve(_Driver(_SOURCE.format(call="_double")))
    assert rp.off is None and rp.replays == 6 - replay.AFTER_RUNS - 1
    assert outs[-1][1] is not outs[-2][1]  # (copies: no run's result is another's)
    assert threads._team_owner[0] is owner  # (no parallel loop: no team started for it)


def test_the_driver_is_rewritten_for_the_recorder_a_run_before_its_recording():
    """The last driver run before a key's recording rewrites the driver for the recorder, so
    that the run that records does not do that too (each a cold run's share); the runs'
    results stay the driver's."""
    rp = replay.HostReplay(_Driver(_SOURCE.format(call="_double")), params=[1])
    w = np.ones(3, np.float32)
    rewritten = []
    for i in range(replay.AFTER_RUNS + 2):
        x = np.full((2, 2), i, np.float32)
        got = rp.call([x, w])
        np.testing.assert_array_equal(got[0], 2 * x.reshape(-1))
        rewritten.append((rp._capture is not None, bool(rp.recordings)))
    assert rewritten == [(False, False)] * (replay.AFTER_RUNS - 1) + [
        (True, False), (True, True), (True, True)]


def test_a_trial_against_the_driver_takes_no_sample_beside_a_background_compile(monkeypatch):
    """A recording's trial against its driver times no run that begins while a compile goes
    on beside the runs (``threads.BACKGROUND``: its own calls going native on their thread)
    nor one that loaded a kernel (``threads.LOADS`` moved); those runs are served all the
    same, and the next ones are timed."""
    monkeypatch.setattr(replay, "TRIAL_RUNS", 2)
    rp = replay.HostReplay(_Driver(_SOURCE.format(call="_double")), params=[1])
    w = np.ones(3, np.float32)

    def run(i):
        x = np.full((2, 2), i, np.float32)
        np.testing.assert_array_equal(rp.call([x, w])[0], 2 * x.reshape(-1))

    for i in range(replay.AFTER_RUNS + 1):
        run(i)
    (rec,) = rp.recordings.values()
    assert rec.trial == ([], [])
    monkeypatch.setattr(threads, "BACKGROUND", [1])
    for i in range(3):
        run(i)
    assert rec.trial == ([], [])
    monkeypatch.setattr(threads, "BACKGROUND", [0])
    run(0)
    assert len(rec.trial[0]) == 1 and rec.trial[1] == []


def test_a_run_that_records_is_no_sample_of_a_trial_of_threads():
    """The run that records a replay (the driver's run, then the recording's to check it)
    moves ``threads.LOADS``, so a run-choice trial times that setting again; plain and
    replayed runs do not."""
    rp = replay.HostReplay(_Driver(_SOURCE.format(call="_double")), params=[1])
    w = np.ones(3, np.float32)
    moved = []
    for i in range(replay.AFTER_RUNS + 3):
        before = threads.LOADS[0]
        rp.call([np.full((2, 2), i, np.float32), w])
        moved.append(threads.LOADS[0] != before)
    assert moved == [False] * replay.AFTER_RUNS + [True, False, False]
    assert rp.replays == 2


def _split_asked(x, out):
    """Asks how many threads its work may start on, as a split kernel does; then ``_double``."""
    threads.loop_threads()
    replay.kernel_call(_double, x, out)


replay.declare("leaves", _split_asked)


def test_a_run_that_a_busy_core_narrowed_is_not_kept(monkeypatch):
    """A run in which work started on fewer free cores than the run began with (another
    process took a core meanwhile: ``threads.NARROWED`` moved) is not kept as a recording: it
    would replay the narrowed calls after the core is free again. Recorded once the cores
    stay free; a run that began with the core busy is recorded (for one thread: its key)."""
    free = [2]
    monkeypatch.setattr(threads, "max_loop_threads", lambda: 2)
    monkeypatch.setattr(threads, "free_cores", lambda: free[0])
    monkeypatch.setattr(replay, "RETRY_RUNS", 1)
    monkeypatch.setattr(threads._run_local, "free", None, raising=False)
    rp = replay.HostReplay(_Driver(_SOURCE.format(call="_split_asked"),
                                   _split_asked=_split_asked), params=[1])
    w = np.ones(3, np.float32)

    recorder, later = replay._Recorder, [2]

    def recording_from_here(*args):  # (the cores free from the recording's start on)
        free[0] = later[0]
        return recorder(*args)

    monkeypatch.setattr(replay, "_Recorder", recording_from_here)

    def run(at_start, in_run):
        free[0], later[0] = at_start, in_run
        threads._run_local.free = at_start  # (as threads.begin_run leaves it)
        x = np.full((2, 2), 3, np.float32)
        np.testing.assert_array_equal(rp.call([x, w])[0], 2 * x.reshape(-1))

    for _ in range(replay.AFTER_RUNS + 1):
        run(2, 1)  # (the recording's run: a core taken)
    assert not rp.recordings and "busy core" in rp.why, rp.why
    for _ in range(replay.AFTER_RUNS + 2):
        run(2, 2)
    assert [k[2] for k in rp.recordings] == [2]
    for _ in range(replay.AFTER_RUNS + 2):
        run(1, 1)
    assert sorted(k[2] for k in rp.recordings) == [1, 2]


@numba.njit(cache=False)
def _add_pair(pair, out):
    for i in range(out.size):
        out.flat[i] = pair[0].flat[i] + pair[1].flat[i]


def test_buffers_in_a_tuple_argument_and_an_input_returned():
    src = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    s2 = np.empty(a0.shape, np.float32)
    _add_pair((s1, a0), s2)
    return (s2, a0)
"""
    rp = replay.HostReplay(_Driver(src, _add_pair=_add_pair), params=[1])
    w = np.ones(3, np.float32)
    for i in range(6):
        x = np.full((2, 2), i, np.float32)
        s2, back = rp.call([x, w])
        np.testing.assert_array_equal(s2, 3 * x)
        np.testing.assert_array_equal(back, x)
    (rec,) = rp.recordings.values()
    assert rp.replays == 2 and rec.copies and not rec.uses  # (the input is an output too)


def _spin(seconds):
    t = replay.time.perf_counter()
    while replay.time.perf_counter() - t < seconds:
        pass


def test_the_faster_of_replay_and_driver_serves(monkeypatch):
    monkeypatch.setattr(replay, "TRIAL_RUNS", 2)
    slow = {}
    real = replay.Recording.run
    monkeypatch.setattr(replay.Recording, "run",
                        lambda self, v: _spin(slow["replay"]) or real(self, v))
    for host, rep, served in ((0.005, 0.0, 6), (0.0, 0.005, 0)):
        slow["replay"] = rep
        drv = _Driver(_SOURCE.format(call="_double"))
        g = drv.fn.__globals__  # (the driver slowed in its own namespace)
        g.update(_spin=_spin, _host=host)
        exec("def slowed(*v):\n    _spin(_host)\n    return segment(*v)\n", g)  # noqa: S102
        drv.fn = g["slowed"]
        rp, _ = _serve(drv, runs=14)
        (rec,) = rp.recordings.values()
        assert rec.trial is None and rec.lost == (rep > 0)
        assert rp.replays == 2 + served  # (the trial's two, then every run or none)


def _inner(x, out):  # an entry point declared leaves, its kernel through the hook
    replay.kernel_call(_double, x, out)


def _outer(x, out):  # another, calling the first through the hook (as split_work calls one)
    replay.kernel_call(_inner, x, out)


replay.declare("leaves", _inner, _outer)


def test_a_leaves_entry_below_another_is_recorded_by_its_kernels():
    """An entry point declared leaves that another calls through the hook (as ``split_work``
    calls ``pointwise_range``): the recording holds the kernel below both, not a call of the
    inner entry made again; the replays give the driver's values."""
    rp, _ = _serve(_Driver(_SOURCE.format(call="_outer"), _outer=_outer))
    (rec,) = rp.recordings.values()
    assert rp.replays and [fn for fn, *_ in rec.ops] == [_double]


def test_a_declared_function_is_forgotten_once_gone():
    """A declaration goes with its function (a generated host function with its program)."""
    def gone(x, out):
        replay.kernel_call(_double, x, out)

    replay.declare("leaves", gone)
    key = id(gone)
    assert replay._kind_of(gone) == "leaves"
    del gone
    gc.collect()
    assert key not in replay._KINDS


def test_a_kernel_call_the_recorder_missed_is_caught(monkeypatch):
    monkeypatch.setattr(replay, "RETRY_RUNS", 0)
    replay.declare("leaves", _hidden)  # (wrongly: its call goes through no hook)
    rp, _ = _serve(_Driver(_SOURCE.format(call="_hidden"), _hidden=_hidden),
                   runs=(replay.AFTER_RUNS + 1) * replay.MAX_FAILURES)
    assert rp.replays == 0 and not rp.recordings
    assert rp.off == "its replay differed from the driver's run"  # (after MAX_FAILURES)


@numba.njit(cache=False)
def _mul(x, w, out):
    for i in range(out.size):
        out.flat[i] = x.flat[i] * w.flat[i % w.size]


def _scaled(x, w, out):  # a weight derived, then a kernel: as a library entry point does
    w3 = params.derived(w, ("test_replay", "tripled"), lambda: 3 * w)
    replay.kernel_call(_mul, x, w3, out)


replay.declare("leaves", _scaled)


def test_a_value_derived_from_what_is_no_parameter_is_not_recorded():
    """A filter computed in the graph (a driver's buffer) is no parameter: a value derived
    from it (a transformed filter kept by the array's identity) would go stale."""
    src = """def segment(a0, a1):
    s0 = np.empty(a1.shape, np.float32)
    _double(a1, s0)
    s1 = np.empty(a0.shape, np.float32)
    _scaled(a0, {w}, s1)
    return (s1, s0)
"""
    for w in ("a1", "s0"):  # (a1 here an input: no parameter either)
        rp = replay.HostReplay(_Driver(src.format(w=w), _scaled=_scaled), params=[])
        for i in range(7):
            x = np.full((2, 2), i, np.float32)
            wv = np.full((2, 2), i + 1, np.float32)  # (an input here: new values each run)
            s1, s0 = rp.call([x, wv])
            np.testing.assert_array_equal(s1, x * 3 * (wv if w == "a1" else 2 * wv))
        assert bool(rp.recordings) is False and rp.why == \
            "a value derived from an array that is no parameter"
    rp = replay.HostReplay(_Driver(src.format(w="a1"), _scaled=_scaled), params=[1])
    wv = np.full((2, 2), 2, np.float32)  # (a parameter: the same array every run)
    for i in range(7):
        x = np.full((2, 2), i, np.float32)
        np.testing.assert_array_equal(rp.call([x, wv])[0], x * 6)
    assert rp.recordings and rp.replays == 7 - replay.AFTER_RUNS - 1


def test_the_counts_of_keys_stay_bounded():
    rp = replay.HostReplay(_Driver(_SOURCE.format(call="_double")), params=[1])
    w = np.ones(3, np.float32)
    for n in range(1, 400):
        rp.call([np.zeros((n, 1), np.float32), w])
    assert len(rp._runs) <= 257
    for _ in range(6):
        rp.call([np.full((2, 2), 5, np.float32), w])
    assert rp.replays == 6 - replay.AFTER_RUNS - 1


@pytest.mark.parametrize("line, why", [
    ("for i in range(2):\n        pass", "a For statement"),
    ("s1[0] += 0", "an assignment into a value"),
    ("t = [v for v in (1, 2)]", "a ListComp"),
    ("if a1 is not None:\n        for i in range(2):\n            pass", "a For statement"),
    ("if a1 is not None:\n        t = (lambda: 1)()", "a Lambda"),
])
def test_a_driver_the_recorder_does_not_know_is_not_replayed(line, why):
    src = _SOURCE.format(call="_double").replace("    return", f"    {line}\n    return")
    rp, _ = _serve(_Driver(src))
    assert rp.replays == 0 and rp.off == f"its source has {why}"


def test_a_value_read_from_an_array_a_copy_or_a_write_is_not_recorded():
    read = _SOURCE.format(call="_double").replace("    return", "    n = s1[0, 0]\n    return")
    copy = _SOURCE.format(call="_double").replace("s1.reshape((s1.size, ))", "s1.T.reshape(-1)")
    fill = _SOURCE.format(call="_double").replace(
        "    return", "    t = np.empty(2, np.float32)\n    t.fill(0)\n    return")
    to_int = _SOURCE.format(call="_double").replace(
        "    return", "    k = int(a0[0:1, 0:1].reshape(()))\n    return")
    for src, why in ((read, "a value read from an array"), (copy, "reshape made a copy"),
                     (fill, "a call of 'ndarray.fill'"), (to_int, "a value read from an array")):
        rp, _ = _serve(_Driver(src), runs=5)
        assert rp.replays == 0 and not rp.recordings and rp.why == why


def test_buffers_share_memory_only_where_their_lives_do_not_meet():
    a, b, c = (np.empty(1000, np.float32) for _ in range(3))

    def k(*_):
        return None

    ops = [(k, (a,), None, None), (k, (a, b), None, None), (k, (b, c), None, None)]
    ops2, outs, arena = replay._planned(ops, (c,), [a, b, c])
    na, nb = ops2[1][1]
    nc = ops2[2][1][1]
    assert np.shares_memory(nc, arena) and outs[0] is not c and np.shares_memory(outs[0], nc)
    assert not np.may_share_memory(na, nb) and not np.may_share_memory(nb, nc)
    assert np.may_share_memory(na, nc)  # a is dead when c is first written
    assert arena.nbytes < 3 * 4000  # (two buffers' room, 64-byte aligned)


def test_the_arrays_of_an_argument():
    a, b = np.zeros(2), np.ones(3)
    got = list(replay._arrays((1, 2.5, None, _double, [a, {"k": (b,)}], np.float32(1))))
    assert len(got) == 2 and got[0] is a and got[1] is b
    with pytest.raises(TypeError, match="an argument of type object"):
        list(replay._arrays((a, object())))  # (it might hold arrays the recording misses)


def test_a_numpy_function_of_the_driver_is_made_again():
    """A NumPy function in the driver's lines (a concat's ``np.concatenate``, a constant's
    ``np.array``) is called again at each replay, its new result copied into the recorded
    one."""
    src = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    c = np.array(a1.shape[0], np.float32)
    s2 = np.concatenate((s1, a0))
    s3 = np.empty(s2.shape, np.float32)
    _double(s2, s3)
    return (s3, c)
"""
    rp = replay.HostReplay(_Driver(src), params=[1])
    w = np.ones(3, np.float32)
    for i in range(7):
        x = np.full((2, 2), i, np.float32)
        s3, c = rp.call([x, w])
        np.testing.assert_array_equal(s3, 2 * np.concatenate((2 * x, x)))
        assert c == 3
    assert rp.replays == 7 - replay.AFTER_RUNS - 1


def _replayed(src, shape, want, runs=7, **ns):
    """A host replay of driver ``src`` (its second argument a parameter) served ``runs`` runs
    on new inputs of ``shape``, each run's results those of ``want(x)``."""
    rp = replay.HostReplay(_Driver(src, **ns), params=[1])
    w = np.ones(3, np.float32)
    for _ in range(runs):
        x = RNG.standard_normal(shape).astype(np.float32)
        for got, expected in zip(rp.call([x, w]), want(x)):
            np.testing.assert_array_equal(got, expected)
    return rp


def test_a_concat_and_a_copy_are_written_into_the_recorded_arrays():
    """A concat and an array's ``copy`` made again at each replay write into the arrays the
    recording keeps for them (one copy a replay, not a new array copied over it), and a
    transpose's ``permute_into`` (declared ``"leaves"``) is recorded as the copy it made: the
    driver's values at every run, and the recorded calls are the forms that write (their
    result the array a later call reads)."""
    from pdjit.codegen.cpu.lib import indexing

    src = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    s2 = np.concatenate((s1, a0), 1)
    s3 = np.empty((s2.shape[1], s2.shape[0]), np.float32)
    permute_into(s2, (1, 0), s3)
    s4 = s3.copy()
    s5 = np.empty(s4.shape, np.float32)
    _double(s4, s5)
    return (s5, s3)
"""
    def want(x):
        t = np.concatenate((2 * x, x), 1).T
        return 2 * t, t

    rp = _replayed(src, (2, 3), want, permute_into=indexing.permute_into)
    assert rp.replays == 7 - replay.AFTER_RUNS - 1
    (rec,) = rp.recordings.values()
    made = {getattr(f, "__name__", f): (args, kwargs, out) for f, args, kwargs, out in rec.ops}
    assert set(made) == {"_double", "concatenate", "_copy_permuted", "_copy_into"}, made
    joined, moved, copy = made["concatenate"], made["_copy_permuted"], made["_copy_into"]
    # (each writes the array it returns or is given: the op's result, poisoned before a
    # recording's check)
    assert joined[1]["out"] is joined[2] and copy[0][0] is copy[2]
    # (the transpose reads the concat, the copy the transpose's result)
    assert np.shares_memory(moved[0][1], joined[2]) and moved[0][2] == (1, 0)
    assert np.shares_memory(copy[0][1], moved[0][0])


def test_a_form_writing_into_an_array_that_writes_nothing_is_caught(monkeypatch):
    """The array a call made again writes into is poisoned before a new recording's check like
    any result: a form that leaves it as the recording's run wrote it is caught there (the
    check's run has the recording's inputs: what it holds then is right), never kept."""
    monkeypatch.setattr(replay, "_copy_into", lambda out, a: out)
    src = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    s2 = s1.copy()
    _double(a0, s1)
    s3 = np.empty(s2.shape, np.float32)
    _double(s2, s3)
    return (s3, a1)
"""
    rp = _replayed(src, (2, 3), lambda x: (4 * x,))
    assert rp.replays == 0 and not rp.recordings
    assert rp.why == "its replay differed from the driver's run"


_DENSE = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    s2 = np.empty(a0.shape, np.float32)
    _double(s1, s2)
    c1 = np.concatenate((s1, s2), axis={axis})
    s3 = np.empty(c1.shape, np.float32)
    _double(c1, s3)
    c2 = np.concatenate((c1, s3), axis={axis})
    s4 = np.empty(c2.shape, np.float32)
    _double(c2, s4)
    {after}
    return (s4, a1)
"""


def _dense(x, axis):
    c1 = np.concatenate((2 * x, 4 * x), axis)
    return 2 * np.concatenate((c1, 2 * c1), axis)


def _dense_replay(shape, axis=1, after=""):
    return _replayed(_DENSE.format(axis=axis, after=after), shape, lambda x: (_dense(x, axis),))


def test_concats_of_one_sample_are_elided_their_parts_written_in_place():
    """A concat whose result is each part in one run (a batch of one along the channels) of
    parts read by nothing after it: the calls making the parts write them into the result,
    a concat of a concat into the last result (a DenseNet block); the driver's values."""
    rp = _dense_replay((1, 2, 3))
    assert rp.replays == 7 - replay.AFTER_RUNS - 1
    (rec,) = rp.recordings.values()
    names = [getattr(f, "__name__", f) for f, _, _, _ in rec.ops]
    assert "concatenate" not in names and names.count("_joined") == 2, names
    last = [out for f, _, _, out in rec.ops if f is replay._joined][-1]
    doubles = [args for f, args, _, _ in rec.ops if f is _double]
    # (s1, s2 and s3 written where the last concat's result holds them)
    for args, at in zip(doubles[:3], (0, 2, 4)):
        assert np.may_share_memory(args[1], last)
        assert replay._address(args[1]) == replay._address(last) + at * 3 * 4


@pytest.mark.parametrize("shape, axis, after", [
    ((2, 2, 3), 1, ""),                  # two samples: each part is two runs of the result
    ((1, 2, 3), 1, "_double(s2, s1)"),   # a part written after the concat
    ((1, 2, 3), 1, "_double(s1, s4)"),   # a part read after it
])
def test_a_concat_whose_parts_cannot_be_written_in_place_stays(shape, axis, after):
    rp = _dense_replay(shape, axis, after)
    (rec,) = rp.recordings.values()
    names = [getattr(f, "__name__", f) for f, _, _, _ in rec.ops]
    assert "concatenate" in names, names


def test_an_elided_concat_that_is_not_safe_is_caught_by_the_check(monkeypatch):
    """A new recording's check runs on poisoned buffers: a concat elided against the rule (a
    part read after it, here hidden from the elision) leaves that reader NaN, the check sees
    the replay differ, and nothing is kept."""
    elided = replay._elided

    def blind(ops, *rest):  # (the calls after the concat not shown to it)
        k = next(i for i, op in enumerate(ops) if op[0] is np.concatenate)
        return elided(ops[:k + 1], *rest) + list(ops[k + 1:])

    monkeypatch.setattr(replay, "_elided", blind)
    src = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    s2 = np.empty(a0.shape, np.float32)
    _double(s1, s2)
    c1 = np.concatenate((s1, s2), axis=1)
    s3 = np.empty(c1.shape, np.float32)
    _double(c1, s3)
    s4 = np.empty(a0.shape, np.float32)
    _double(s1, s4)
    return (s3, s4)
"""
    rp = _replayed(src, (1, 2, 3), lambda x: (2 * np.concatenate((2 * x, 4 * x), 1), 4 * x))
    assert rp.replays == 0 and not rp.recordings
    assert rp.why == "its replay differed from the driver's run"


_SPLIT = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    s2 = s1[:, :2].copy()
    s3 = s1[:, 2:].copy()
    {between}
    s4 = np.empty(s2.shape, np.float32)
    _double(s2, s4)
    s5 = np.empty(s3.shape, np.float32)
    _double(s3, s5)
    return ({outs})
"""


def _split_replay(shape, between="", outs="s4, s5"):
    def want(x):
        return tuple({"s4": 4 * x[:, :2], "s5": 4 * x[:, 2:], "s2": 2 * x[:, :2]}[n]
                     for n in outs.split(", "))
    return _replayed(_SPLIT.format(between=between, outs=outs), shape, want)


def test_copies_of_a_part_of_one_sample_are_elided_their_readers_read_the_source():
    """A ``split`` of a batch of one along the channels copies runs of its input: where
    nothing writes the input while a copy is read, the calls after it read the input's run
    instead, and the copies are gone from the recording; the driver's values."""
    rp = _split_replay((1, 4, 3))
    assert rp.replays == 7 - replay.AFTER_RUNS - 1
    (rec,) = rp.recordings.values()
    names = [getattr(f, "__name__", f) for f, _, _, _ in rec.ops]
    assert names == ["_double"] * 3, names
    (_, made), (read2, _), (read3, _) = (args for f, args, _, _ in rec.ops)
    assert replay._address(read2) == replay._address(made)
    assert replay._address(read3) == replay._address(made) + 2 * 3 * 4


@pytest.mark.parametrize("shape, between, outs, kept", [
    ((2, 4, 3), "", "s4, s5", 2),                 # two samples: a part is no run of the input
    ((1, 4, 3), "_double(a0, s1)", "s4, s5", 2),  # the input written while a copy is read
    ((1, 4, 3), "", "s4, s5, s2", 1),             # a copy is an output (the other goes)
])
def test_a_copy_its_source_cannot_stand_for_stays(shape, between, outs, kept):
    rp = _split_replay(shape, between, outs)
    assert rp.replays == 7 - replay.AFTER_RUNS - 1
    (rec,) = rp.recordings.values()
    names = [getattr(f, "__name__", f) for f, _, _, _ in rec.ops]
    assert names.count("_copy_into") == kept, names


def test_shape_values_written_into_arrays_and_counters_are_replayed():
    """``v[i] = x`` (a shape's dims written into a tensor, a constant filled) made again at
    each replay; ``t += n`` on a number (a channel shuffle's offsets) computed; an array's
    ``copy`` made again on the array as the recording moves it; an array changed in place by
    ``+=`` refused."""
    src = """def segment(a0, a1):
    s1 = np.empty(2, np.int32)
    s1[0] = a0.shape[0]
    s1[1] = a0.shape[1]
    off = 1
    off += a0.shape[1]
    s2 = np.empty(a0.shape, np.float32)
    _double(a0, s2)
    s3 = s2.copy()
    s4 = np.empty(off, np.float32)
    s4.reshape(s4.size)[:] = np.float32(off)
    return (s1, s3, s4)
"""
    rp = replay.HostReplay(_Driver(src), params=[1])
    w = np.ones(3, np.float32)
    for i in range(7):
        x = np.full((2, 3), i, np.float32)
        s1, s3, s4 = rp.call([x, w])
        np.testing.assert_array_equal(s1, [2, 3])
        np.testing.assert_array_equal(s3, 2 * x)
        np.testing.assert_array_equal(s4, np.full(4, 4, np.float32))
    assert rp.why is None and rp.replays == 7 - replay.AFTER_RUNS - 1
    inplace = src.replace("    s3 = s2.copy()", "    s2 += a0\n    s3 = s2.copy()")
    rp = replay.HostReplay(_Driver(inplace), params=[1])
    for i in range(5):
        x = np.full((2, 3), i, np.float32)
        np.testing.assert_array_equal(rp.call([x, w])[1], 3 * x)
    assert rp.replays == 0 and rp.why == "a value changed in place"


def test_an_array_of_constants_and_shapes_is_made_once():
    """``np.array`` of literals (an epilogue's gate) and of shapes (a batched product's
    dims): made at the recording and kept by the kernel calls that read it, no op of the
    recording; each replay gives the driver's values. One of an input's values is refused."""
    src = """def segment(a0, a1):
    g = np.array((3.0, 0.5), np.float32)
    d = np.array((a0.shape[0], a0.shape[1]), np.float32)
    s1 = np.empty(a0.shape, np.float32)
    _mul(a0, g, s1)
    s2 = np.empty(a0.shape, np.float32)
    _mul(s1, d, s2)
    return (s2.reshape((s2.size, )), a1)
"""
    rp = replay.HostReplay(_Driver(src, _mul=_mul), params=[1])
    w = np.ones(3, np.float32)
    for i in range(7):
        x = np.full((2, 3), i, np.float32)
        flat = x.reshape(-1)  # (_mul: the factors by flat index, cyclically)
        np.testing.assert_array_equal(rp.call([x, w])[0],
                                      flat * np.resize([3.0, 0.5], 6) * np.resize([2.0, 3.0], 6))
    assert rp.why is None and rp.replays == 7 - replay.AFTER_RUNS - 1
    (rec,) = rp.recordings.values()
    assert [op[0] for op in rec.ops] == [_mul, _mul]
    reading = src.replace("(a0.shape[0], a0.shape[1])", "(a0[0, 0], a0.shape[1])")
    rp = replay.HostReplay(_Driver(reading, _mul=_mul), params=[1])
    for i in range(5):
        x = np.full((2, 3), i, np.float32)
        rp.call([x, w])
    assert rp.replays == 0 and rp.why is not None


def test_arithmetic_on_an_array_is_refused():
    """``a0 * 2`` in the driver's lines would be computed once, at the recording."""
    src = _SOURCE.format(call="_double").replace(
        "    return (s2, a1)", "    s3 = a0 * 2\n    return (s3.reshape((s3.size, )), a1)")
    rp, _ = _serve(_Driver(src), runs=5)
    assert rp.replays == 0 and rp.why == "arithmetic on an array, or its truth"


@pytest.mark.parametrize("lines, why", [
    ("    p = [a0]\n    p += [a0]\n", "a value changed in place"),  # (a list calls may hold)
    ("    t = s1[0:1, 0:1] and a1\n", "arithmetic on an array, or its truth"),  # (a branch)
    ("    t = a1 if s1[0:1, 0:1] else s1\n", "arithmetic on an array, or its truth"),
    ("    a0[0, 0] = 1.0\n", "a value written into an input or a parameter"),
])
def test_what_a_recording_would_freeze_or_miss_is_refused(lines, why):
    src = _SOURCE.format(call="_double").replace("    s2 =", lines + "    s2 =")
    drv = _Driver(src)
    rp = replay.HostReplay(drv, params=[1])
    w = np.ones(3, np.float32)
    for i in range(5):
        x = np.full((2, 2), i, np.float32)
        want = drv.fn(x.copy(), w)[0]
        np.testing.assert_array_equal(rp.call([x, w])[0], want)
    assert rp.replays == 0 and rp.why == why


def test_an_identity_test_and_a_deleted_name_are_no_values():
    src = _SOURCE.format(call="_double").replace(
        "    s2 =", "    t = a1 is not None\n    u = t\n    del u\n    s2 =")
    rp, _ = _serve(_Driver(src))
    assert rp.why is None and rp.replays == 6 - replay.AFTER_RUNS - 1
    deleting = _SOURCE.format(call="_double").replace("    s2 =", "    del s1[0]\n    s2 =")
    assert replay._source_why(replay.ast.parse(deleting)) == "an assignment into a value"


def test_a_pools_kernels_are_replayed_not_its_entry():
    """A max pool (3x3, stride 2, padded) and a global average pool: their entry points are
    declared leaves, so a recording replays the kernels below them (not the entries' Python),
    giving NumPy's results and the driver's bits."""
    from pdjit.codegen.cpu.lib import pool

    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = L.data("img", [8, 21, 20])
        mp = L.pool2d(img, 3, "max", pool_stride=2, pool_padding=1)
        gp = L.pool2d(mp, pool_type="avg", global_pooling=True)
    main = main.clone(for_test=True)
    exe, scope = fluid.Executor(native_drivers="auto"), fluid.Scope()
    exe.run(startup, scope=scope)

    def run(x):
        return exe.run(main, feed={"img": x}, fetch_list=[mp, gp], scope=scope)

    def image():
        return RNG.standard_normal((1, 8, 21, 20)).astype(np.float32)

    for _ in range(40):
        run(image())
        if any(r.replays for r in _replays(exe)):
            break
    (rp,) = _replays(exe)
    assert rp.replays, rp.why
    ops = [fn for rec in rp.recordings.values() for fn, *_ in rec.ops]
    entries = {pool.pool2d_fwd, pool.pool2d_max33, pool.pool2d_mean}
    assert ops and not entries & set(ops), ops
    x = image()
    got_mp, got_gp = run(x)
    padded = np.full((1, 8, 23, 22), -np.inf)
    padded[:, :, 1:22, 1:21] = x
    want = np.stack([[padded[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3))
                      for j in range(10)] for i in range(11)]).transpose(2, 3, 0, 1)
    np.testing.assert_array_equal(got_mp, want.astype(np.float32))
    np.testing.assert_allclose(got_gp, want.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    before = rp.off
    rp.off = "compared"  # the host driver itself
    try:
        for a, b in zip(run(x), (got_mp, got_gp)):
            np.testing.assert_array_equal(a, b)
    finally:
        rp.off = before


# (the memory plan would give the parts' buffers to s5 and s6: the parts die with the concat's
# result, and the later values are of their size)
_SQUEEZE = """def segment(a0, a1):
    # group 0: opaque [k] rank 0
    s1 = np.empty(a0.shape, np.float32)
    _double(a0, s1)
    # group 1: opaque [k] rank 0
    s2 = np.empty(a0.shape, np.float32)
    _double(s1, s2)
    # group 2: opaque [concat] rank 0
    c3 = np.concatenate((s1, s2), axis=1)
    # group 3: opaque [k] rank 0
    s4 = np.empty(c3.shape, np.float32)
    _double(c3, s4)
    # group 4: opaque [k] rank 0
    s5 = np.empty(a0.shape, np.float32)
    _double(a0, s5)
    # group 5: opaque [k] rank 0
    s6 = np.empty(a0.shape, np.float32)
    _double(s5, s6)
    return (s4, s6)
"""


@pytest.mark.parametrize("keep", [True, False])
def test_the_memory_plan_leaves_a_concats_parts_their_buffers(monkeypatch, keep):
    """The driver's memory plan gives no later value the buffer of a concat's part (each keeps
    its own allocation), so that a replay writes the parts into the concat's result (a
    SqueezeNet fire module); where the plan let a later value take one (``keep`` off), the
    concat stays a copy. The driver's values either way."""
    from pdjit.codegen import memplan

    if not keep:
        monkeypatch.setattr(memplan, "_joined_parts", lambda nodes: set())
    lines = _SQUEEZE.splitlines()
    groups = [i + 1 for i, line in enumerate(lines) if line.strip().startswith("# group")]
    src, plan = memplan._plan_driver(_SQUEEZE, None, None, None, groups)
    parts = {t.local for t, why in plan.kept if why.startswith("a part of a concat")}
    slotted = {t.local for _, ts in plan.slots for t in ts}
    assert parts == ({"s1", "s2"} if keep else set())
    assert bool(slotted & {"s1", "s2"}) is not keep, plan.describe()

    def want(x):
        return 2 * np.concatenate((2 * x, 4 * x), 1), 4 * x

    rp = _replayed(src, (1, 2, 3), want, math=math, _mp=memplan)
    (rec,) = rp.recordings.values()
    names = [getattr(f, "__name__", f) for f, _, _, _ in rec.ops]
    assert names.count("_joined" if keep else "concatenate") == 1, names


def test_a_convolutions_entry_is_replayed_as_the_kernels_it_calls():
    """``conv._fwd_range`` (the host's entry for the convolutions the packed kernels leave) is
    declared ``"leaves"``: a recording holds the kernels it called (a 1x1 filter of few
    channels on a small plane: im2col + BLAS, then the epilogue), not a Python call between
    native chains; with the residual in the output's own buffer, the call that copies it first
    is made again at each replay. The oracle's values at every run."""
    from pdjit.codegen.cpu.lib import conv as convlib

    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    empty = np.empty(0, np.float32)
    src = """def segment(a0, a1):
    s1 = np.empty(a0.shape, np.float32)
    _fwd_range(a0, W, s1, 0, a0.shape[0], 1, 1, 0, 0, 1, 1, 1, B, 0.0, math.inf, E)
    s2 = np.empty(a0.shape, np.float32)
    _double(s1, s2)
    _fwd_range(a0, W, s2, 0, a0.shape[0], 1, 1, 0, 0, 1, 1, 1, B, -math.inf, math.inf,
               s2.reshape(s2.size))
    return (s1, s2)
"""

    def want(x):
        y = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x) + b[None, :, None, None]
        return np.maximum(y, 0), np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x) + \
            b[None, :, None, None] + 2 * np.maximum(y, 0)

    rp = replay.HostReplay(_Driver(src, _fwd_range=convlib._fwd_range, W=w, B=b, E=empty,
                                   math=math), params=[1])
    param = np.ones(3, np.float32)
    for _ in range(7):
        x = RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)
        for g, e in zip(rp.call([x, param]), want(x)):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    (rec,) = rp.recordings.values()
    got = [getattr(f, "__name__", f) for f, _, _, _ in rec.ops]
    assert got == ["_fwd_blas", "_bias_clamp_range", "_double", "_blas_range"], got
    assert rp.replays
