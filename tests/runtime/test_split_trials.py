"""How the split native driver's trial stays fair on a shared machine: the helper thread kept off
the caller's core (``threads.run_parts``), a core counted busy while this process's threads
wait for one (``threads.free_cores``), and a split that lost its trial tried again after a
number of runs, with a loss on a busy core not counted (``tiers.Retry``). Timings and the
scheduler's counts are faked here: the oracles are the counts written in each test."""
import os
import threading
import time

import numpy as np
import pytest
from test_batch_split_drivers import _mlp, _want

import pdjit as fluid
from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu import tiers as tiers_mod

pytestmark = pytest.mark.usefixtures("counted_trials")

BATCH = 32  # >= tiers.SPLIT_MIN_BATCH


# ---- the helpers' cores ----------------------------------------------------------------------
def test_the_helper_is_kept_off_the_callers_core(monkeypatch):
    """Each run hands the helper its part with the helper's cores set to every allowed core
    but the caller's; the mask is set again only when the caller's core changed."""
    calls = []
    for h in threads._idle:
        h.off = None
    monkeypatch.setattr(threads, "_getcpu", lambda: cpu[0])
    monkeypatch.setattr(threads, "_allowed", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, mask: calls.append((tid, mask)),
                        raising=False)
    cpu = [2]
    assert threads.run_parts(lambda k: k * 10, [(0,), (1,)], most=1) == [0, 10]
    ((tid, mask),) = calls
    assert tid in threads._helper_tids and mask == {0, 1, 3}
    threads.run_parts(lambda k: k, [(0,), (1,)], most=1)
    assert len(calls) == 1  # the same core: nothing to set
    cpu[0] = 0
    threads.run_parts(lambda k: k, [(0,), (1,)], most=1)
    assert calls[1] == (tid, {1, 2, 3})
    monkeypatch.setattr(threads, "_allowed", lambda: {0})  # one core allowed: left there
    cpu[0] = 3
    threads.run_parts(lambda k: k, [(0,), (1,)], most=1)
    assert calls[2] == (tid, {0})


@pytest.mark.skipif(threads._getcpu is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_getcpu and two cores")
def test_the_helper_really_runs_off_the_callers_core():
    """On this machine: the helper's cores, as the kernel reports them, exclude the core the
    caller ran on when it handed the part over."""
    import threading

    for h in threads._idle:  # (a mask another test faked is not the kernel's)
        h.off = None
    seen = {}

    def part(k):
        seen[k] = threading.get_native_id()

    threads.run_parts(part, [(0,), (1,)], most=1)
    assert seen[0] == threading.get_native_id() != seen[1]
    helper_cpus = os.sched_getaffinity(seen[1])
    assert helper_cpus and helper_cpus < os.sched_getaffinity(0)


# ---- free_cores: the scheduler's waits ---------------------------------------------------------
class _Clock:
    def __init__(self):
        self.t = 100.0

    def monotonic(self):
        return self.t


@pytest.fixture
def fake_load(monkeypatch):
    """free_cores on a fake clock, fake /proc/stat totals and fake scheduler counts: returns a
    function ``sample(dt, others, ran, waited, tid=1, own=None)`` that advances the clock by
    ``dt`` seconds, in which other processes used ``others`` cores, the threads that ask (the
    caller and the split helpers) ran ``ran`` and waited ``waited`` seconds and all of this
    process's threads ran ``own`` seconds (``ran`` where None), and returns free_cores()."""
    clock, state = _Clock(), {"busy": 1000.0, "mine": 10.0, "run": 5.0, "wait": 1.0, "tid": 1,
                              "own": 20.0}
    monkeypatch.setattr(threads, "time", clock)
    monkeypatch.setattr(threads, "_CORES", 2)
    monkeypatch.setattr(threads, "_load", [None, 0.0])
    monkeypatch.setattr(threads, "_asked", [float("-inf")])
    monkeypatch.setattr(threads, "_waits", [None, False])
    monkeypatch.setattr(threads, "_cpu_seconds", lambda: (state["busy"], state["mine"]))
    monkeypatch.setattr(threads, "sched_times",
                        lambda: (state["tid"], state["run"], state["wait"]))
    monkeypatch.setattr(threads, "_process_seconds", lambda: state["own"])

    def sample(dt, others, ran, waited, tid=1, own=None):
        clock.t += dt
        state["own"] += ran if own is None else own
        state["mine"] += ran
        state["busy"] += ran + others * dt
        state["run"] += ran
        state["wait"] += waited
        state["tid"] = tid
        return threads.free_cores()

    threads.free_cores()  # the first sample: no window yet
    return sample


def test_free_cores_counts_a_core_busy_while_this_process_waits_for_one(fake_load):
    assert fake_load(0.2, others=0.0, ran=0.2, waited=0.0) == 2       # quiet
    assert fake_load(0.2, others=1.0, ran=0.2, waited=0.0) == 1       # /proc/stat sees it
    # another process's burst below /proc/stat's rounding (0.3 of a core), while our threads
    # waited for a core a fifth of their time: a core is busy
    assert fake_load(0.2, others=0.3, ran=0.2, waited=0.05) == 1
    assert fake_load(0.2, others=0.3, ran=0.2, waited=0.0) == 2
    # waits under the share, or under the least that counts: not a busy core
    share = threads.WAITED_SHARE
    assert fake_load(0.2, others=0.0, ran=0.2, waited=0.2 * share * 0.9) == 2
    assert fake_load(0.01, others=0.0, ran=0.0, waited=0.0) == 2     # (under 0.1 s: cached)
    assert fake_load(0.2, others=0.0, ran=0.0001, waited=threads.WAITED_MIN / 2) == 2
    # counts of another thread than the last sample's say nothing about the window
    assert fake_load(0.2, others=0.0, ran=0.2, waited=0.1, tid=2) == 2
    assert fake_load(0.2, others=0.0, ran=0.2, waited=0.1, tid=2) == 1


def test_free_cores_drops_a_window_this_process_was_idle_through(fake_load):
    """A window this process was idle through (no ask for IDLE_S seconds: another process's
    work between a served model's requests, a benchmark's other contenders) says nothing of
    the cores now: dropped, the count of the last window this process ran in stands until the
    next one closes; the scheduler's waits still count a busy core at once."""
    assert fake_load(0.2, others=0.0, ran=0.2, waited=0.0) == 2
    assert fake_load(1.0, others=1.0, ran=0.0, waited=0.0) == 2    # another's burst, dropped
    assert fake_load(0.15, others=1.0, ran=0.15, waited=0.0) == 1   # busy beside this one
    assert fake_load(1.0, others=0.0, ran=0.0, waited=0.0) == 1     # still the last count
    assert fake_load(0.15, others=0.0, ran=0.15, waited=0.0) == 2
    assert fake_load(1.0, others=0.0, ran=0.005, waited=0.003) == 1   # waited: busy at once
    assert fake_load(0.15, others=0.0, ran=0.15, waited=0.0) == 2
    # a window shorter than IDLE_S counts, whatever this process did in it
    assert fake_load(threads.IDLE_S * 0.8, others=1.0, ran=0.0, waited=0.0) == 1


def test_free_cores_judges_waits_over_milliseconds(fake_load):
    """The waits are judged over windows of WAITED_WINDOW (a trial of a few ms has a
    reading of its own), /proc/stat's busy cores over a tenth of a second."""
    w = threads.WAITED_WINDOW
    assert fake_load(1.2 * w, others=0.0, ran=0.004, waited=0.002) == 1
    assert fake_load(0.5 * w, others=0.0, ran=0.002, waited=0.0) == 1   # (the same window)
    assert fake_load(1.2 * w, others=0.0, ran=0.006, waited=0.0) == 2
    assert fake_load(1.2 * w, others=0.0, ran=0.006, waited=0.0001) == 2


def test_waits_while_this_process_kept_every_core_busy_are_its_own(fake_load):
    """Waits in a window in which this process's threads ran on (nearly) every core are its
    threads waiting for each other (a split's hand-offs, its team polling beside the split
    helpers): no core counts busy for them; the same waits while they ran on one core do."""
    w, slack = threads.WAITED_WINDOW * 1.2, threads.OWN_BUSY_SLACK
    assert fake_load(w, others=0.0, ran=w, waited=0.25 * w, own=1.45 * w) == 2
    assert fake_load(w, others=0.0, ran=w, waited=0.25 * w, own=(2 - slack) * w * 1.01) == 2
    assert fake_load(w, others=0.0, ran=w, waited=0.25 * w, own=(2 - slack) * w * 0.99) == 1
    assert fake_load(w, others=0.0, ran=w, waited=0.25 * w, own=1.0 * w) == 1
    assert fake_load(w, others=0.0, ran=w, waited=0.0, own=1.0 * w) == 2


def test_sched_times_reads_this_threads_counts():
    got = threads.sched_times()
    if got is None:
        pytest.skip("no /proc/self/task/<id>/schedstat here")
    tid, ran, waited = got
    assert tid == threading.get_native_id() and ran > 0 and waited >= 0


def _spin(seconds: float) -> None:
    """Work on a core for ``seconds`` of this thread's CPU time."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


def test_sched_times_reads_fresh_counts_from_a_kept_file():
    """The file is opened once and read again from its start: each read is the counts of
    now (20 ms of work between two reads shows), and another thread reads its own."""
    first = threads.sched_times()
    if first is None:
        pytest.skip("no /proc/self/task/<id>/schedstat here")
    path = f"/proc/self/task/{first[0]}/schedstat"
    fd = threads._proc_fds[path]
    _spin(0.02)
    second = threads.sched_times()
    assert threads._proc_fds[path] == fd  # (the same descriptor)
    assert 0.015 < second[1] - first[1] < 1.0

    box = {}

    def other():
        box["got"] = threads.sched_times()
        box["tid"] = threading.get_native_id()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert box["got"][0] == box["tid"] != first[0]
    assert box["got"][1] < second[1]  # (a thread that barely ran)
    # the thread gone (the system's too, not only Python's), its file cannot be read: an
    # error, and no descriptor kept for it
    gone = f"/proc/self/task/{box['tid']}/schedstat"
    deadline = time.monotonic() + 2.0
    while os.path.exists(os.path.dirname(gone)) and time.monotonic() < deadline:
        time.sleep(0.01)
    if gone in threads._proc_fds and not os.path.exists(os.path.dirname(gone)):
        with pytest.raises(OSError):
            threads._proc_read(gone)
        assert gone not in threads._proc_fds


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_reads_its_own_counts():
    """The kept descriptors name the parent's threads: a forked child drops them and reads
    its own (its main thread's id is its pid, its counts start near zero)."""
    if threads.sched_times() is None:
        pytest.skip("no /proc/self/task/<id>/schedstat here")
    _spin(0.05)
    parent_ran = threads.sched_times()[1]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once
        try:
            got = threads.sched_times()
            busy, _ = threads._cpu_seconds()
            os.write(w, repr((got[0], os.getpid(), got[1], busy is not None)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        tid, child_pid, child_ran, busy_read = eval(f.read())  # noqa: S307 - our own repr
    os.waitpid(pid, 0)
    assert tid == child_pid and busy_read
    assert child_ran < parent_ran


# ---- the split driver's trials -----------------------------------------------------------------
class _Served:
    """An inference MLP served with native drivers at batch BATCH; ``run(n)`` runs it n times,
    checking every answer against NumPy."""

    def __init__(self):
        self.program, startup, self.y = _mlp()
        self.scope = fluid.Scope()
        self.exe = fluid.Executor(native_drivers=True, strict=True)
        self.exe.run(startup, scope=self.scope)
        self.rng = np.random.default_rng(0)

    def run(self, n: int) -> None:
        for _ in range(n):
            xv = self.rng.standard_normal((BATCH, 6)).astype("float32")
            (out,) = self.exe.run(self.program, feed={"x": xv}, fetch_list=[self.y],
                                  scope=self.scope)
            np.testing.assert_allclose(out, _want(self.scope, xv), rtol=1e-5, atol=1e-6)

    @property
    def step(self):
        (s,) = [s for (pid, _), (_, plan) in self.exe._plans.items()
                if pid == id(self.program) for s in plan.steps if s.kind == "native"]
        return s


TRIAL = 3 * (tiers_mod.DriverTiers._WARM + tiers_mod.DriverTiers._TIMED)  # runs of a trial


@pytest.fixture
def machine(monkeypatch):
    """Two loop threads; ``machine["free"]``: what free_cores says; ``machine["at_pick"]``:
    what it says from the trial's pick on (None: the same); the trial picks
    ``machine["pick"]`` (1: the native driver, 2: the split one), not the timings."""
    m = {"free": 2, "at_pick": None, "pick": 1}
    monkeypatch.setattr(threads, "max_loop_threads", lambda: 2)
    monkeypatch.setattr(threads, "free_cores", lambda: m["free"])

    def fastest(times):
        if m["at_pick"] is not None:
            m["free"] = m["at_pick"]
        pick = min(m["pick"], len(times) - 1)
        while times[pick] == float("inf"):  # (no time: never the least)
            pick -= 1
        return pick

    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest", staticmethod(fastest))
    monkeypatch.setattr(tiers_mod, "RETRY_AFTER", 1e6)  # only runs bring a retry here
    return m


def test_a_lost_split_is_tried_again_after_a_number_of_runs(machine):
    """A fair loss (the cores free at the pick): the next trial comes RETRY_RUNS runs later,
    then 4x as many, long before RETRY_AFTER seconds; the split wins the second one."""
    s = _Served()
    s.run(TRIAL)
    step = s.step
    retry = step.tiers.picked[BATCH]
    assert isinstance(retry, tiers_mod.Retry) and retry.fn is step.native.fn
    assert step.tiers._split_tries[BATCH] == 1 and retry.runs == tiers_mod.RETRY_RUNS
    s.run(tiers_mod.RETRY_RUNS - 1)
    assert step.tiers.picked[BATCH] is retry  # not yet
    s.run(1)
    assert BATCH not in step.tiers.picked  # dropped: the next run begins a trial
    s.run(TRIAL)  # lost again: 4x as many runs to the next
    retry = step.tiers.picked[BATCH]
    assert step.tiers._split_tries[BATCH] == 2 and retry.runs == 4 * tiers_mod.RETRY_RUNS
    s.run(4 * tiers_mod.RETRY_RUNS)
    machine["pick"] = 2
    s.run(TRIAL)
    sp = step.tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.runs == 3 * 4  # its trials' runs


def test_a_picked_split_tells_the_plan_its_threads_were_measured(machine):
    """A step whose trial picked its split driver (run split, on every free core, against its
    drivers on every thread) reports its best trial time as split time
    (``DriverTiers.split_seconds``); the plan counts its threads measured for runs of which
    such time is THREADS_MEASURED_SHARE or more (``Plan.threads_measured``, which the
    executor's run choice asks before its first trial); a step that picked another driver
    reports none."""
    from pdjit.runtime import plan as plan_mod

    machine["pick"] = 2
    s = _Served()
    s.run(TRIAL)
    step = s.step
    sp = step.tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.runs
    split = step.tiers.split_seconds(BATCH)
    assert split > 0.0 and split == step.tiers._picked_s[BATCH]
    assert step.tiers.split_seconds(BATCH + 1) == 0.0  # (a size not tried)
    (plan,) = [p for (pid, _), (_, p) in s.exe._plans.items() if pid == id(s.program)]
    share = plan_mod.THREADS_MEASURED_SHARE
    assert plan.threads_measured(BATCH, split / share * 0.99)
    assert not plan.threads_measured(BATCH, split / share * 1.01)
    assert plan.threads_choice.measured == plan.threads_measured
    # (settled, asked when a trial of the threads is due, hurries the step's replays native)
    assert step.tiers.settled(BATCH) and step.tiers.replay.hot
    machine["pick"] = 1
    other = _Served()
    other.run(TRIAL)
    assert other.step.tiers.picked[BATCH] is not None
    assert other.step.tiers.split_seconds(BATCH) == 0.0


def test_a_split_lost_while_a_core_is_busy_does_not_count(machine):
    """A trial that ends with a core busy (free_cores 1 at the pick) is not a fair loss: any
    number of them leave the tries at none and the next trial 2x more runs away each time
    (up to 32x RETRY_RUNS; once the cores are free again); fair losses then count,
    SPLIT_RETRIES of them keep the pick."""
    s = _Served()
    machine["at_pick"] = 1
    for k in range(7):
        s.run(TRIAL)
        step = s.step
        retry = step.tiers.picked[BATCH]
        wait = tiers_mod.RETRY_RUNS * 2 ** min(k, 5)
        assert isinstance(retry, tiers_mod.Retry)
        assert step.tiers._split_tries.get(BATCH, 0) == 0 and retry.runs == wait
        s.run(wait)  # with a core busy: the pick stays
        assert step.tiers.picked[BATCH] is retry and retry.runs == tiers_mod.RETRY_RUNS
        machine["free"] = 2
        s.run(tiers_mod.RETRY_RUNS)  # free again: dropped
        assert BATCH not in step.tiers.picked
    machine["at_pick"] = None
    for k in range(tiers_mod.SPLIT_RETRIES):  # fair losses
        s.run(TRIAL)
        assert step.tiers._split_tries[BATCH] == k + 1
        s.run(4 ** k * tiers_mod.RETRY_RUNS)
    s.run(TRIAL)
    assert step.tiers.picked[BATCH] is step.native.fn  # kept
    assert step.tiers._unfair_tries[BATCH] == 7


def test_a_split_that_ran_unsplit_is_no_candidate(machine, monkeypatch):
    """A core busy all through the trial: the split driver's runs are redone UNSPLIT_REDOS
    times, then its unsplit runs count as no time at all (it is not picked); once the cores
    are free it is tried and wins."""
    s = _Served()
    machine["free"], machine["pick"] = 1, 2
    seen = []
    fastest = tiers_mod.DriverTiers._fastest
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest",
                        staticmethod(lambda t: (seen.append(list(t)), fastest(t))[1]))
    s.run(TRIAL + tiers_mod.UNSPLIT_REDOS)
    step = s.step
    ((host, native, split),) = seen
    assert split == float("inf") and host < split and native < split
    retry = step.tiers.picked[BATCH]
    assert isinstance(retry, tiers_mod.Retry) and retry.fn is step.native.fn
    assert step.tiers._split[1][0].runs == 0 and step.tiers._split_tries.get(BATCH, 0) == 0
    machine["free"] = 2
    s.run(tiers_mod.RETRY_RUNS + TRIAL)
    sp = step.tiers.picked[BATCH]
    assert isinstance(sp, tiers_mod.SplitDriver) and sp.runs == 4
    assert BATCH not in step.tiers._unfair_tries  # (a win forgets the busy-core losses)


def test_a_trial_run_that_was_not_steady_is_run_again(machine, monkeypatch):
    """A trial's run in which a kernel was loaded or a host replay recorded (``threads.LOADS``
    moved) is run again at the driver's next turn rather than timed, up to UNSETTLED_REDOS
    runs a trial for each of its candidates; past that, such runs are timed (a trial always
    ends)."""
    from pdjit.codegen.cpu import replay

    monkeypatch.setattr(tiers_mod, "UNSETTLED_REDOS", 1)  # (3 candidates: 3 runs again)
    monkeypatch.setattr(replay, "ENABLED", False)  # (only the split's runs move LOADS here)
    unsteady = [2]  # the split driver's next runs that move LOADS
    call = tiers_mod.SplitDriver.__call__

    def split_call(self, *values):
        if unsteady[0] > 0:
            unsteady[0] -= 1
            threads.LOADS[0] += 1
        return call(self, *values)

    monkeypatch.setattr(tiers_mod.SplitDriver, "__call__", split_call)
    seen = []
    fastest = tiers_mod.DriverTiers._fastest
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest",
                        staticmethod(lambda t: (seen.append(list(t)), fastest(t))[1]))
    machine["pick"] = 2
    s = _Served()
    s.run(TRIAL + 1)
    step = s.step
    assert BATCH not in step.tiers.picked and not seen  # two runs not counted: not yet
    s.run(1)
    assert len(seen) == 1 and isinstance(step.tiers.picked[BATCH], tiers_mod.SplitDriver)
    assert step.tiers.picked[BATCH].runs == 4 + 2  # (its timed runs and the two run again)
    # every split run unsteady: UNSETTLED_REDOS of them run again, then they count
    unsteady[0] = 1 << 30
    step.tiers.picked.clear()
    s.run(TRIAL + 2)
    assert BATCH not in step.tiers.picked
    s.run(1)
    assert len(seen) == 2 and isinstance(step.tiers.picked[BATCH], tiers_mod.SplitDriver)


def test_a_trial_run_served_as_it_will_not_be_for_long_is_run_again(machine, monkeypatch):
    """A trial's short run that moved ``threads.WARMING`` (the host driver's replay still
    from Python, its recording's trial) is run again at the driver's next turn rather than
    timed, up to ``threads.WARMING_REDOS`` runs a trial; past that such runs are timed."""
    from pdjit.codegen.cpu import replay

    monkeypatch.setattr(replay, "ENABLED", False)  # (only the host runs here move WARMING)
    monkeypatch.setattr(threads, "WARMING_REDOS", 4)
    warming = [3]  # the host driver's next runs in a trial that move WARMING
    host = tiers_mod.DriverTiers.host

    def host_warming(self, values):
        if warming[0] > 0 and self._trials.get(BATCH) is not None:
            warming[0] -= 1
            threads.WARMING[0] += 1
        return host(self, values)

    monkeypatch.setattr(tiers_mod.DriverTiers, "host", host_warming)
    seen = []
    fastest = tiers_mod.DriverTiers._fastest
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest",
                        staticmethod(lambda t: (seen.append(list(t)), fastest(t))[1]))
    s = _Served()
    s.run(TRIAL + 2)
    step = s.step
    assert BATCH not in step.tiers.picked and not seen and warming[0] == 0  # three run again
    s.run(1)
    assert len(seen) == 1 and BATCH in step.tiers.picked
    # every host run warming: WARMING_REDOS of them run again, then they count
    warming[0] = 1 << 30
    step.tiers.picked.clear()
    s.run(TRIAL + 3)
    assert len(seen) == 1
    s.run(1)
    assert len(seen) == 2 and BATCH in step.tiers.picked


@pytest.mark.parametrize("clear", [False, True])
def test_a_trial_of_long_runs_times_each_drivers_second_run(machine, monkeypatch, clear):
    """Where runs are long (``threads.LONG_TRIAL_S``: one timed run each) a driver's first run
    at a batch size is still not timed (its slowest: a split driver's slices are new shapes
    to their replays and packed weights); the drivers take turns, one run each, and the pick
    comes after two runs of each, or, where one of them wins clearly
    (``threads.CHOICE_CLEAR_WIN``), after three (``threads.LONG_TRIAL_CONFIRM`` timed): one
    slowed run does not decide it."""
    monkeypatch.setattr(threads, "LONG_TRIAL_S", 0.0)
    # (every win clear, or none: the drivers' real times decide nothing here)
    monkeypatch.setattr(threads, "CHOICE_CLEAR_WIN", 1.0 if clear else float("inf"))
    seen = []
    fastest = tiers_mod.DriverTiers._fastest
    monkeypatch.setattr(tiers_mod.DriverTiers, "_fastest",
                        staticmethod(lambda t: (seen.append(list(t)), fastest(t))[1]))
    s = _Served()
    runs = 3 * (1 + (threads.LONG_TRIAL_CONFIRM if clear else 1))
    s.run(runs - 1)  # (the host, native and split drivers, by turns: not yet)
    step = s.step
    assert BATCH not in step.tiers.picked and not seen
    s.run(1)
    (times,) = seen
    assert len(times) == 3 and BATCH in step.tiers.picked


def test_retry_checks_after_runs_or_seconds(monkeypatch):
    """``Retry`` alone: it serves with its driver, and drops its pick at the check that
    finds the cores free, ``runs`` runs or ``wait`` seconds after it was made."""
    free = [2]
    monkeypatch.setattr(threads, "free_cores", lambda: free[0])

    class Step:
        picked: dict = {}

    step = Step()
    r = tiers_mod.Retry(lambda v: v + 1, step, 7, wait=1e6, runs=3)
    step.picked[7] = r
    assert [r(1), r(2)] == [2, 3] and step.picked[7] is r
    free[0] = 1
    assert r(3) == 4 and step.picked[7] is r  # the third run: a core busy, kept
    assert r.runs == tiers_mod.RETRY_RUNS
    free[0] = 2
    for _ in range(tiers_mod.RETRY_RUNS - 1):
        r(0)
    assert step.picked[7] is r
    r(0)
    assert 7 not in step.picked
    step.picked[7] = r = tiers_mod.Retry(lambda v: v, step, 7, wait=0.0, runs=10 ** 6)
    r(0)
    assert 7 not in step.picked  # the seconds came first
