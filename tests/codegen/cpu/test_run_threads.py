"""Each run's threads are capped at the cores other processes leave free
(``threads.begin_run``): with a thread count asked for, a run on a machine with a busy core
runs its BLAS calls, parallel loops and split batches on the caller's thread, and gives the
same results as a run on every thread. Checked with ``free_cores`` forced, never by timing."""
import time

import numba
import numpy as np
import pytest
from conv_oracle import conv_ref

import pdjit as fluid
from pdjit.codegen.cpu import replay, threads
from pdjit.codegen.cpu.lib import conv as convlib
from pdjit.codegen.cpu.lib import pointwise, team
from pdjit.codegen.cpu.lib import rnn as rnnlib
from pdjit.testing import assert_native


@pytest.fixture
def two_asked(monkeypatch):
    """``set_num_threads(2)`` for the test (Numba's count and OpenBLAS's restored after);
    ``free[0]``: the free cores ``free_cores`` reports."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    free = [2]
    saved_numba = numba.get_num_threads()
    monkeypatch.setattr(threads, "_applied", 2)
    monkeypatch.setattr(threads, "TINY_RUN_S", 0.0)  # the models here are small: trials anyway
    monkeypatch.setattr(threads, "LONG_TRIAL_S", float("inf"))  # (fake seconds: the full trial)
    monkeypatch.setattr(threads, "free_cores", lambda: free[0])
    # (a recording's native calls compiled in its run, not on a thread: a trial of threads
    # waits while a compile goes on beside the runs, and these tests count their runs)
    monkeypatch.setattr(replay, "NATIVE_THREAD", False)
    applied = []
    monkeypatch.setattr(threads, "_setters", [[applied.append]])  # OpenBLAS's count, recorded
    threads._run_blas[0] = threads._run_local.loops = threads._run_local.key = None
    yield free, applied
    threads._run_blas[0] = threads._run_local.loops = threads._run_local.key = None
    numba.set_num_threads(saved_numba)


def test_begin_run_caps_the_counts_at_the_free_cores(two_asked):
    # (BLAS runs on one thread in every run: pdjit's own threads split the work)
    free, applied = two_asked
    threads.begin_run()
    assert applied == [1] and numba.get_num_threads() == 2 and threads.loop_threads() == 2
    free[0] = 1                                        # another process took a core
    threads.begin_run()
    assert applied == [1] and numba.get_num_threads() == 1
    assert threads.gemm_threads(1 << 30) == 1 and threads.loop_threads() == 1
    n = numba.get_num_threads()
    threads.begin_run()                                # unchanged: nothing set again
    assert applied == [1] and numba.get_num_threads() == n
    free[0] = 2
    threads.begin_run()
    assert applied == [1] and numba.get_num_threads() == 2
    assert threads.gemm_threads(1 << 30) == 2


def _model():
    """A 2-layer bidirectional LSTM over [B, 5, 6] and a 3x3 convolution over [B, 3, 7, 7]."""
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 3
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[5, 6], dtype="float32")
        img = L.data(name="img", shape=[3, 7, 7], dtype="float32")
        h0 = L.fill_constant_batch_size_like(x, [4, -1, 8], "float32", 0.0, input_dim_idx=0,
                                             output_dim_idx=1)
        seq, _, _ = L.lstm(x, h0, h0, max_len=5, hidden_size=8, num_layers=2,
                           is_bidirec=True, is_test=True)
        feat = L.relu(L.conv2d(img, num_filters=5, filter_size=3, padding=1))
    return main, startup, [seq, feat]


def test_threaded_and_serial_runs_agree(two_asked, monkeypatch):
    free, _ = two_asked
    monkeypatch.setattr(rnnlib, "SPLIT_MIN_WORK", 0)         # tiny shapes split too
    monkeypatch.setattr(convlib, "_PARALLEL_MIN_WORK", 0)
    slices = []
    real_threads = rnnlib._threads
    monkeypatch.setattr(rnnlib, "_threads", lambda *a: slices.append(real_threads(*a)) or
                        slices[-1])
    main, startup, fetch = _model()
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((4, 5, 6)).astype("float32"),
            "img": rng.standard_normal((4, 3, 7, 7)).astype("float32")}
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    outs = {}
    for n in (2, 1, 2):
        free[0] = n
        outs[n] = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
        assert slices[-1] == n and numba.get_num_threads() == n
    assert_native(exe)
    ref = fluid.Executor(mode="reference").run(main, feed=feed, fetch_list=fetch, scope=scope)
    for a, b, r in zip(outs[2], outs[1], ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)


def test_run_choice_keeps_the_faster_setting_and_tries_again(two_asked, monkeypatch):
    """A plan's runs on every free core against runs on one thread, on a fake clock: the
    faster by its best timed run is kept, tried again after the runs and the seconds of its
    interval (doubled while it keeps winning, 8x where it wins clearly; a first pick that won
    by a little after ``CHOICE_FIRST_RETRY_S`` seconds), and no trial while a core is busy or
    while the plan's own driver trials go on."""
    free, _ = two_asked
    now = [0.0]
    ready = [False]
    choice = threads.RunChoice(ready=lambda key: ready[0], clock=lambda: now[0])

    def run(cost_wide, cost_narrow):
        cap = choice.begin(16)
        choice.end(16, cost_narrow if cap == 1 else cost_wide)
        return cap

    caps = [run(1.0, 2.0) for _ in range(threads.CHOICE_AFTER + 1)]
    assert caps == [None] * len(caps)                  # warming up, then not ready
    assert choice.picks() == {16: "not chosen"}
    ready[0] = True
    caps = [run(1.0, 2.0) for _ in range(threads.CHOICE_AFTER)]
    assert caps == [None] * len(caps)                  # asked again after as many runs
    caps = [run(1.0, 0.9) for _ in range(2 * (threads.CHOICE_RUNS + 1))]
    assert caps == [None, 1] * (threads.CHOICE_RUNS + 1)   # alternating, the first untimed
    assert choice.picks() == {16: "one thread"}        # one thread was faster (not clearly)
    caps = [run(1.0, 2.0) for _ in range(3 * threads.CHOICE_RETRY_RUNS)]
    assert set(caps) == {1}                            # kept: the seconds have not passed
    assert threads.CHOICE_FIRST_RETRY_S < threads.CHOICE_RETRY_S
    now[0] += threads.CHOICE_FIRST_RETRY_S             # (a first pick by a little: soon)
    free[0] = 1                                        # a core busy: nothing chosen
    assert run(1.0, 2.0) is None and choice.picks() == {16: "one thread"}
    free[0] = 2
    caps = [run(1.0, 2.0) for _ in range(2 * (threads.CHOICE_RUNS + 1))]
    assert caps == [None, 1] * (threads.CHOICE_RUNS + 1)   # a new trial: now wide wins
    assert choice.picks() == {16: "every free core"}
    assert choice.begin(1) is None                     # another batch size: its own warm-up
    assert choice.keys[16].interval == threads.CHOICE_RETRY_RUNS   # (the pick changed)

    def again(cost_wide, cost_narrow, check=False, full=True):
        """The pick's runs and seconds, then a trial: a check (one timed run of each, the
        pick's first) where the last pick won clearly, a full trial where it did not or the
        check found no clear win; the interval after it."""
        st = choice.keys[16]
        assert st.check == check
        assert set(run(1.0, 2.0) for _ in range(st.interval)) == {None}
        now[0] += threads.CHOICE_RETRY_S * st.interval / threads.CHOICE_RETRY_RUNS
        n = 2 * (threads.CHOICE_RUNS + 1) * full + 2 * check
        caps = [run(cost_wide, cost_narrow) for _ in range(n)]
        assert caps == [None, 1] * (n // 2)
        assert choice.picks()[16] == "every free core"
        return st.interval

    r = threads.CHOICE_RETRY_RUNS
    assert again(1.0, 2.0, check=True, full=False) == 8 * r  # kept by a clear win, checked:
    # tried again 8x as late, by one run of each
    assert again(1.0, 1.1, check=True) == 16 * r   # no clear win: a full trial; kept: 2x
    assert again(1.0, 2.0) == 64 * r     # (at most 64x)
    assert choice.keys[16].check
    st = choice.keys[16]     # a check the other setting wins: a full trial, which it wins too
    assert set(run(1.0, 2.0) for _ in range(st.interval)) == {None}
    now[0] += threads.CHOICE_RETRY_S * st.interval / threads.CHOICE_RETRY_RUNS
    caps = [run(2.0, 1.0) for _ in range(2 + 2 * (threads.CHOICE_RUNS + 1))]
    assert caps == [None, 1] * (threads.CHOICE_RUNS + 2)
    assert choice.picks()[16] == "one thread" and st.interval == r and st.check
    assert set(run(2.0, 1.0) for _ in range(st.interval)) == {1}
    now[0] += threads.CHOICE_RETRY_S * st.interval / threads.CHOICE_RETRY_RUNS
    assert [run(2.0, 1.0) for _ in range(2)] == [1, None]   # a check: the pick's run first
    assert choice.picks()[16] == "one thread" and st.interval == 8 * r
    # a first pick by a clear win: tried again 8x as late too
    for _ in range(threads.CHOICE_AFTER):
        choice.begin(4), choice.end(4, 1.0)
    for _ in range(2 * (threads.CHOICE_RUNS + 1)):
        choice.end(4, 2.0 if choice.begin(4) == 1 else 1.0)
    assert choice.picks()[4] == "every free core" and choice.keys[4].interval == 8 * r


def test_a_run_after_a_pause_is_no_sample_of_a_trial(two_asked, monkeypatch):
    """A trial's run that begins ``RESTED_S`` or more after the process's last run (slow
    whatever its threads: its data out of the caches, an idle core woken) runs as the pick
    does, untimed, and the trial goes on with the runs after it: a check after a clear win is
    not lost to it (a full trial would follow). Counted among the trial's ``WARMING_REDOS``."""
    now = [0.0]
    choice = threads.RunChoice(clock=lambda: now[0])

    def run(cost_wide, cost_narrow, paused=False):
        if paused:  # (the last run ended, and began, a second ago)
            monkeypatch.setattr(threads, "_ran", [time.perf_counter() - 1.0])
            monkeypatch.setattr(threads, "_began", [time.perf_counter() - 1.1, 0.01])
        cap = choice.begin(16)
        choice.end(16, cost_narrow if cap == 1 else cost_wide)
        return cap

    for _ in range(threads.CHOICE_AFTER):
        run(1.0, 2.0)
    st = choice.keys[16]
    assert run(50.0, 50.0, paused=True) is None and st.trial and st.times == ([], [])
    assert st.redos == 1
    caps = [run(1.0, 2.0) for _ in range(2 * (threads.CHOICE_RUNS + 1))]
    assert caps == [None, 1] * (threads.CHOICE_RUNS + 1)
    assert choice.picks() == {16: "every free core"} and st.check
    r = threads.CHOICE_RETRY_RUNS
    assert st.interval == 8 * r
    assert set(run(1.0, 2.0) for _ in range(st.interval)) == {None}
    now[0] += threads.CHOICE_RETRY_S * st.interval / r
    # the check's first run after a pause (50 ms where the pick takes 1): not timed
    assert run(50.0, 2.0, paused=True) is None and st.trial
    assert [run(1.0, 2.0) for _ in range(2)] == [None, 1]   # the check, won clearly again
    assert not st.trial and st.interval == 64 * r and choice.picks() == {16: "every free core"}
    # where every run follows a pause, the trial times them after WARMING_REDOS of them
    monkeypatch.setattr(threads, "WARMING_REDOS", 2)
    now[0] += threads.CHOICE_RETRY_S * 64
    st.left = 0
    caps = [run(1.0, 2.0, paused=True) for _ in range(4)]
    assert caps == [None, None, None, 1] and not st.trial   # two untimed, then the check


def test_threads_the_driver_trials_measured_are_picked_without_a_trial(two_asked):
    """Where ``measured(key, seconds)`` says the plan's driver trials measured its threads for
    runs like its fastest (most of it on slices of the batch on every free core), the first
    pick is every free core with no one-thread run, kept as a clear win: the next trial,
    after 8x the runs and seconds, is a check (one run of each). Where it does not, a full
    trial, as before."""
    now = [0.0]
    asked, measured = [], [True]
    choice = threads.RunChoice(ready=lambda key: True, clock=lambda: now[0],
                               measured=lambda key, s: asked.append((key, s)) or measured[0])

    def run(key, cost_wide, cost_narrow):
        cap = choice.begin(key)
        choice.end(key, cost_narrow if cap == 1 else cost_wide)
        return cap

    # (the run before the first trial was slow: a recording; its fastest run is asked about)
    caps = [run(16, 1.0 + 0.5 * (k == threads.CHOICE_AFTER - 1), 2.0)
            for k in range(threads.CHOICE_AFTER + 8)]
    assert caps == [None] * len(caps)
    assert choice.picks() == {16: "every free core"} and asked == [(16, 1.0)]
    st = choice.keys[16]
    assert st.check and st.interval == 8 * threads.CHOICE_RETRY_RUNS
    caps = [run(16, 1.0, 2.0) for _ in range(st.left)]
    now[0] += 8 * threads.CHOICE_RETRY_S
    caps = [run(16, 1.0, 2.0) for _ in range(2)]
    assert caps == [None, 1]                           # the check: one run of each
    assert choice.picks() == {16: "every free core"} and len(asked) == 1
    measured[0] = False
    caps = [run(4, 1.0, 2.0) for _ in range(threads.CHOICE_AFTER + 2 * (threads.CHOICE_RUNS + 1))]
    assert caps == [None] * threads.CHOICE_AFTER + [None, 1] * (threads.CHOICE_RUNS + 1)
    assert choice.picks()[4] == "every free core" and asked[1:] == [(4, 1.0)]


def test_a_run_that_loads_a_kernel_is_no_sample_of_a_trial(two_asked):
    """A trial's timed run in which a kernel was loaded (``threads.LOADS`` moved: a loop or
    a kernel compiled ahead loaded from disk, tens of ms) is not counted: the run of that
    setting is timed again, and the pick is the one the runs without loads say."""
    choice = threads.RunChoice(ready=lambda key: True)
    for _ in range(threads.CHOICE_AFTER):
        choice.begin(16), choice.end(16, 1.0)
    loaded = []
    while choice.picks().get(16) != "every free core" and len(loaded) < 40:
        cap = choice.begin(16)
        if cap is None and not loaded:      # the first wide run loads a kernel: slow
            threads.LOADS[0] += 1
            loaded.append(cap)
            choice.end(16, 9.0)
            continue
        loaded.append(cap)
        choice.end(16, 2.0 if cap == 1 else 1.0)
    assert choice.picks() == {16: "every free core"}, loaded
    assert choice.keys[16].times[0] == [] or 9.0 not in choice.keys[16].times[0]


def test_a_run_served_as_it_will_not_be_for_long_is_no_sample(two_asked):
    """A trial's timed run shorter than ``LONG_TRIAL_S`` that moved ``threads.WARMING`` (a host
    replay's driver runs before its recording, its trial) or ``threads.PY_REPLAYS`` (its
    replays from Python before its calls go native) is not counted: that setting runs again
    until its runs are served as they will be, and the pick is the one the settled runs say
    (the wide setting's first runs from Python took twice a native one's time: one process in
    three picked one thread). Up to ``WARMING_REDOS`` a trial; a run of ``LONG_TRIAL_S`` or
    more is counted where only ``PY_REPLAYS`` moved (a long run's replay from Python costs it
    little), not where ``WARMING`` did (a host driver's run of ResNet-50 at batch 1 on two
    threads took twice a served one: one process in four picked one thread)."""
    choice = threads.RunChoice(ready=lambda key: True)
    for _ in range(threads.CHOICE_AFTER):
        choice.begin(16), choice.end(16, 0.001)
    warming = {None: 6, 1: 4}  # each setting's runs still from Python
    caps = []
    while choice.picks().get(16) != "every free core" and len(caps) < 60:
        cap = choice.begin(16)
        caps.append(cap)
        if warming[cap]:
            warming[cap] -= 1
            (threads.WARMING if warming[cap] % 2 else threads.PY_REPLAYS)[0] += 1
            choice.end(16, 0.004 if cap is None else 0.0025)
            continue
        choice.end(16, 0.002 if cap == 1 else 0.001)
    assert choice.picks() == {16: "every free core"}, caps
    # the wide setting ran until it settled, then the narrow one, then by turns
    assert caps[:8] == [None] * 7 + [1], caps
    assert choice.keys[16].times == ([0.001] * 4, [0.002] * 4)

    # never settling: counted after WARMING_REDOS runs, long or short; a long run's replays
    # from Python at once
    long = threads.LONG_TRIAL_S
    for seconds, moved, redos in ((0.001, threads.WARMING, threads.WARMING_REDOS),
                                  (0.001, threads.PY_REPLAYS, threads.WARMING_REDOS),
                                  (long, threads.WARMING, threads.WARMING_REDOS),
                                  (long, threads.PY_REPLAYS, 0)):
        choice = threads.RunChoice(ready=lambda key: True)
        for _ in range(threads.CHOICE_AFTER):
            choice.begin(32), choice.end(32, seconds)
        for _ in range(redos + 1):
            choice.begin(32)
            moved[0] += 1
            choice.end(32, seconds)
        assert len(choice.keys[32].times[0]) == 1 and choice.keys[32].redos == redos


def test_a_clear_win_of_long_runs_is_taken_from_two_runs_of_each(two_asked, monkeypatch):
    """Runs of ``LONG_TRIAL_S`` or more are tried one timed run of each setting at a time; a
    clear win is taken only once each setting ran ``LONG_TRIAL_CONFIRM`` times (its best): a
    wide run slowed once by what no count tracks does not put the plan on one thread."""
    monkeypatch.setattr(threads, "LONG_TRIAL_S", 0.05)
    choice = threads.RunChoice(ready=lambda key: True)
    for _ in range(threads.CHOICE_AFTER):
        choice.begin(1), choice.end(1, 0.06)
    caps = []
    while choice.picks().get(1, "not chosen") in ("not chosen", "on trial"):
        cap = choice.begin(1)
        caps.append(cap)
        # the first timed wide run slowed 5x, once; else 60 ms wide, 90 on one thread
        choice.end(1, 0.3 if caps == [None] else 0.09 if cap == 1 else 0.06)
    assert choice.picks() == {1: "every free core"}
    assert choice.keys[1].times == ([0.3, 0.06], [0.09, 0.09])
    assert caps == [None, 1, None, 1]


def test_a_compile_beside_the_runs_holds_the_trial_and_spoils_its_samples(two_asked):
    """While a compile goes on beside the runs (``threads.background``: a parallel variant or
    a native driver compiled on a thread of this process, on a core the runs share) a due
    trial times no run; a timed run in which such a compile started or ended is no sample:
    the pick is the one the undisturbed runs say."""
    choice = threads.RunChoice(ready=lambda key: True)
    for _ in range(threads.CHOICE_AFTER):
        choice.begin(16), choice.end(16, 1.0)
    with threads.background():
        assert threads.BACKGROUND[0] == 1
        for _ in range(4 * (threads.CHOICE_RUNS + 1)):   # the wide runs slowed by the compile
            cap = choice.begin(16)
            assert cap is None
            choice.end(16, 9.0)
        assert choice.picks() == {16: "not chosen"} and choice.keys[16].times == ([], [])
    assert threads.BACKGROUND[0] == 0
    spoiled = False
    while choice.picks()[16] in ("not chosen", "on trial"):
        cap = choice.begin(16)
        if cap is None and not spoiled:  # a compile starts (and ends) in this wide run
            spoiled = True
            with threads.background():
                pass
            choice.end(16, 9.0)
            continue
        choice.end(16, 2.0 if cap == 1 else 1.0)
    assert spoiled and choice.picks() == {16: "every free core"}
    assert 9.0 not in choice.keys[16].times[0]


def test_short_runs_beside_a_compile_go_on_one_thread(two_asked):
    """A plan of short runs (its fastest under ``BESIDE_ONE_S``) runs on the caller's thread
    while a compile beside the runs keeps one of the two free cores (a loop's part on the
    other would wait for the compile's time slice); its pick before and after is untouched,
    a plan of long runs keeps every free core, and so does a short one where cores are left
    beside the compile."""
    free, _ = two_asked
    short, long_ = 0.5 * threads.BESIDE_ONE_S, 2 * threads.BESIDE_ONE_S
    choice = threads.RunChoice(ready=lambda key: True)
    for key, seconds in ((1, short), (16, long_)):
        while choice.picks().get(key, "not chosen") in ("not chosen", "on trial"):
            cap = choice.begin(key)
            choice.end(key, seconds * (2 if cap == 1 else 1))
    assert choice.picks() == {1: "every free core", 16: "every free core"}
    left = choice.keys[1].left
    with threads.background():
        assert [choice.begin(1) for _ in range(3)] == [1, 1, 1]
        assert choice.begin(16) is None
        free[0] = 3
        assert choice.begin(1) is None
        free[0] = 2
    assert choice.keys[1].left == left - 1  # (only the run where a core was left counted)
    assert choice.begin(1) is None and choice.picks()[1] == "every free core"


def test_a_served_plan_measures_its_threads(two_asked):
    """Through the Executor: after its warm-up runs a plan's threads are on trial, then
    picked; every run's result is the same."""
    main, startup, fetch = _model()
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((2, 5, 6)).astype("float32"),
            "img": rng.standard_normal((2, 3, 7, 7)).astype("float32")}
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    assert not exe.settled(2)  # (no plan of the main program yet)
    first = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
    settled = []  # (Executor.settled before each run: not while its threads are not chosen)
    # (runs under SHORT_TRIAL_S are timed SHORT_TRIAL_RUNS times as often: threads.trial_runs)
    for _ in range(threads.CHOICE_AFTER
                   + 2 * (threads.CHOICE_RUNS * threads.SHORT_TRIAL_RUNS + 1)):
        settled.append(exe.settled(2))
        got = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
        for a, b in zip(got, first):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    (choice,) = [p.threads_choice for _, p in exe._plans.values()
                 if 2 in (p.threads_choice or threads.RunChoice()).keys]
    assert choice.picks()[2] in ("every free core", "one thread")
    assert not settled[0] and settled[-1] and exe.settled(2), settled
    assert settled.index(True) > threads.CHOICE_AFTER  # (not before the trial's pick)
    assert not exe.settled(3)  # (a batch size not run: its threads not chosen)
    with threads.background():  # (a compile beside the runs)
        assert not exe.settled(2)
    assert exe.settled(2)


def test_run_choice_settled_says_whether_a_trial_is_on_or_due(two_asked):
    """``RunChoice.settled``: not before a pick nor during a trial; after a pick, and where
    nothing is to choose (one free core), yes."""
    free, _ = two_asked
    choice = threads.RunChoice(ready=lambda key: True)
    states = []
    while choice.picks().get(1, "not chosen") in ("not chosen", "on trial"):
        states.append((choice.picks().get(1, "not chosen"), choice.settled(1)))
        cap = choice.begin(1)
        choice.end(1, 0.002 if cap == 1 else 0.001)
    assert {s for _, s in states} == {False} and ("on trial", False) in states
    assert choice.settled(1) and not choice.settled(16)
    free[0] = 1
    assert choice.settled(16)


# (a native driver built with two threads asked for is compiled parallel=True whatever it
# holds: Numba says when it found no loop to run in parallel)
@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPerformanceWarning")
def test_the_thread_trial_waits_for_the_drivers_trial(two_asked):
    """A plan with native drivers: its threads are not measured while its steps still try
    their drivers (``Plan.drivers_settled``), then they are."""
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[6], dtype="float32")
        y = L.relu(L.fc(x, 5))
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=True, strict=True)
    exe.run(startup, scope=scope)
    xv = np.random.default_rng(2).standard_normal((4, 6)).astype("float32")
    w, b = (np.asarray(scope.find_var(p.name).get_tensor())  # (names by the layer's counter)
            for p in sorted(main.global_block().all_parameters(), key=lambda p: len(p.shape),
                            reverse=True))
    seen = []  # (the drivers' trial, then the threads': runs this short are timed more often)
    for _ in range(120):
        (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(out, np.maximum(xv @ w + b, 0), rtol=1e-5, atol=1e-6)
        (plan,) = [p for _, p in exe._plans.values()
                   if 4 in (p.threads_choice or threads.RunChoice()).keys]
        seen.append((plan.drivers_settled(4), plan.threads_choice.picks()[4]))
    assert seen[0] == (False, "not chosen")
    settled = [s for s, _ in seen].index(True)
    assert all(p == "not chosen" for _, p in seen[:settled + 1])
    assert seen[-1][1] in ("every free core", "one thread")


def test_a_tiny_plan_keeps_the_thread_settings_and_is_timed_again_later(monkeypatch):
    """A run shorter than ``TINY_RUN_S``: the next ``TINY_RUNS`` runs of its plan and batch
    size are ``KEEP`` (no cap set, no trial, untimed), then one is timed again; a longer run
    goes back to the choice."""
    monkeypatch.setattr(threads, "TINY_RUNS", 3)
    choice = threads.RunChoice(ready=lambda key: True)
    assert choice.begin(8) is not choice.KEEP          # the first run: settings applied
    choice.end(8, threads.TINY_RUN_S / 2)                 # it was tiny
    assert [choice.begin(8) for _ in range(3)] == [choice.KEEP] * 3
    cap = choice.begin(8)                                # timed again
    assert cap is not choice.KEEP
    choice.end(8, threads.TINY_RUN_S * 10)              # no longer tiny
    assert choice.begin(8) is not choice.KEEP
    assert choice.begin(4) is not choice.KEEP          # another batch size: its own
    # two tiny batch sizes taking turns: each keeps its settings for its own count of runs
    choice = threads.RunChoice(ready=lambda key: True)
    for k in (8, 4):
        choice.begin(k)
        choice.end(k, threads.TINY_RUN_S / 2)
    assert [choice.begin(k) for _ in range(3) for k in (8, 4)] == [choice.KEEP] * 6
    assert choice.begin(8) is not choice.KEEP and choice.begin(4) is not choice.KEEP


def test_a_tiny_run_gives_up_the_thread_trial(two_asked, monkeypatch):
    """A trial whose run turns out shorter than ``TINY_RUN_S`` ends there: no pick, the
    next runs keep the thread settings (timing such runs every run cost more than they
    could gain: a 3-op program)."""
    monkeypatch.setattr(threads, "TINY_RUN_S", 1e-3)
    choice = threads.RunChoice(ready=lambda key: True)
    for _ in range(threads.CHOICE_AFTER):
        assert choice.begin(8) is not choice.KEEP
        choice.end(8, 1.0)                               # long runs: warming up
    choice.begin(8)
    assert choice.picks() == {8: "on trial"}
    choice.end(8, 1e-5)                                  # a tiny run
    assert choice.picks() == {8: "not chosen"}
    assert choice.begin(8) is choice.KEEP


def test_tiny_runs_through_the_executor_give_the_same_results():
    """A 3-op program's runs (tiny) through the Executor: the same values every run, its
    choice keeping the thread settings after the first."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        y = fluid.layers.relu(fluid.layers.scale(x, 2.0) + 1.0)
    exe = fluid.Executor(strict=True)
    xv = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    for _ in range(10):
        (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y])
        np.testing.assert_allclose(out, np.maximum(2 * xv + 1, 0), rtol=1e-6)
    (plan,) = [p for _, p in exe._plans.values() if p.threads_choice is not None]
    assert plan.threads_choice.tiny_key == 3 and plan.threads_choice.tiny_left > 0
    assert_native(exe)


def test_runs_of_microseconds_are_timed_more_often():
    """A trial whose runs mostly take under ``SHORT_TRIAL_S``: ``SHORT_TRIAL_RUNS`` times the
    timed runs (a first run that compiled does not change that); longer ones the asked
    count."""
    short, more = threads.SHORT_TRIAL_S, threads.SHORT_TRIAL_RUNS
    assert threads.trial_runs([short * 50, short / 10, short / 20], 1, 3) == (1, 3 * more)
    assert threads.trial_runs([short * 2, short * 3, short / 2], 1, 3) == (1, 3)


def test_long_runs_are_tried_one_run_of_each_at_a_time(two_asked, monkeypatch):
    """Runs of ``LONG_TRIAL_S`` or more: the run choice tries each setting one timed run at a
    time, untimed runs none, a clear win taken from ``LONG_TRIAL_CONFIRM`` of each (a trial of
    four runs); the drivers' trial one of each (``trial_runs``)."""
    monkeypatch.setattr(threads, "LONG_TRIAL_S", 0.5)
    assert threads.trial_runs([0.6, 0.7], 1, 3) == (0, 1)
    assert threads.trial_runs([0.6, 0.01], 1, 3) == (1, 3)   # a short one: the full trial
    assert threads.trial_runs([], 1, 3) == (1, 3)
    choice = threads.RunChoice(ready=lambda key: True)
    caps = []
    for _ in range(threads.CHOICE_AFTER):
        caps.append(choice.begin(16))
        choice.end(16, 1.0)
    for _ in range(2 * threads.LONG_TRIAL_CONFIRM):
        cap = choice.begin(16)
        choice.end(16, 2.0 if cap == 1 else 1.0)
        caps.append(cap)
    assert caps[threads.CHOICE_AFTER:] == [None, 1] * threads.LONG_TRIAL_CONFIRM
    assert choice.picks() == {16: "every free core"}


@pytest.mark.parametrize("wide, narrow, runs, pick", [
    # one run each within CHOICE_CLEAR_WIN: timed again, the best of up to CHOICE_RUNS each
    ([1.0, 1.5, 1.5], [1.02, 1.6, 1.6], 3, "every free core"),
    ([1.0, 1.5, 1.5], [0.98, 0.9, 0.95], 3, "one thread"),
    # clear once the wide setting's second run is in: decided once the narrow one's is in
    ([1.0, 0.6], [1.02, 1.02], 2, "every free core")])
def test_long_runs_close_by_one_each_are_timed_again(two_asked, monkeypatch, wide, narrow, runs,
                                                      pick):
    """Long runs (``LONG_TRIAL_S``) whose first pair lies within ``CHOICE_CLEAR_WIN`` decide
    nothing: each setting runs again, until the best of each differ by that much or each ran
    ``CHOICE_RUNS`` times; the best of each decides (ResNet-50 at batch 1 on two threads, the
    machine's second core slow for seconds: one wide run took 73 ms, one narrow 74; served,
    38 against 70)."""
    monkeypatch.setattr(threads, "LONG_TRIAL_S", 0.5)
    choice = threads.RunChoice(ready=lambda key: True)
    for _ in range(threads.CHOICE_AFTER):
        choice.begin(16), choice.end(16, 1.0)
    caps = []
    while choice.picks().get(16) in ("not chosen", "on trial") and len(caps) < 20:
        cap = choice.begin(16)
        caps.append(cap)
        done = caps.count(cap) - 1
        choice.end(16, (narrow if cap == 1 else wide)[done])
    assert caps == ([None, 1] * 3)[:int(2 * runs)]
    assert choice.picks() == {16: pick}
    assert choice.keys[16].times == (wide, narrow)


def test_a_background_warmup_this_process_started_is_no_busy_core(monkeypatch):
    """The CPU time of a background warmup this process started (idle cores only: it gives
    way) counts as this process's own in ``free_cores``' accounting, while it runs and once
    it is reaped (then through ``os.times``), never twice."""
    import subprocess
    import sys

    from pdjit.codegen import diskcache

    burn = ("import sys, time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.4: pass\n"
            "print('burnt', flush=True)\nsys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    monkeypatch.setattr(diskcache, "_background", [proc])
    _, mine0 = threads._cpu_seconds()
    assert proc.stdout.readline().strip() == "burnt"  # it has burnt its 0.4 s and waits
    _, mine1 = threads._cpu_seconds()
    proc.stdin.close()
    proc.wait()
    proc.stdout.close()
    _, mine2 = threads._cpu_seconds()
    assert 0.3 < mine1 - mine0 < 1.5     # (the interpreter's start and our own ms besides)
    assert abs(mine2 - mine1) < 0.2      # reaped: counted once, in os.times' children


def _conv_params(main, scope, residual):
    """The filter of each convolution of ``main`` and the bias each adds (an elementwise_add's
    Y other than the variable ``residual``, which a residual connection adds; None: none), as
    arrays."""
    ops = main.global_block().ops
    names = [op.input("Filter")[0] for op in ops if op.type.endswith("conv2d")] + \
        [op.input("Y")[0] for op in ops
         if op.type == "elementwise_add" and (residual is None or
                                              op.input("Y")[0] != residual.name)]
    arrays = [np.asarray(scope.find_var(n).get_tensor()) for n in names]
    k = sum(op.type.endswith("conv2d") for op in ops)
    return arrays[:k], arrays[k:]


def _channel_parts(monkeypatch) -> list:
    """One-sample convolutions split by channels whatever their work, on the team's loops
    from the first run; the list each split's channel bounds are appended to."""
    monkeypatch.setattr(convlib, "_CHANNELS_MIN_WORK", 0)
    monkeypatch.setattr(convlib, "_TEAM_MIN_WORK", 0)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
    parts = []
    real = convlib._channel_bounds
    monkeypatch.setattr(convlib, "_channel_bounds",
                        lambda *a: parts.append(real(*a)) or parts[-1])
    return parts


def test_one_sample_convolutions_split_by_output_channels(two_asked, monkeypatch, blas_same):
    """At batch 1 a convolution's output channels are split over the threads (whole groups;
    multiples of 32 channels, of 16 for the taps kernel): a 3x3 convolution by taps with a
    residual connection, a 1x1 one by BLAS, a depthwise and a grouped one, a 3x3 stride-2 one
    of 32 channels by taps (a stem's: two parts), each with its bias and clamp fused; the
    results match a NumPy oracle and are the one-thread run's bit for bit (where this
    machine's BLAS sums the parts of a product as the whole: ``blas_same``)."""
    free, _ = two_asked
    parts = _channel_parts(monkeypatch)
    # (the 1x1 convolution on the kernels of conv._fwd_range: the packed GEMM's parts are
    # test_pointwise_convolutions_split_by_channels_and_samples')
    monkeypatch.setattr(pointwise, "_PACKED", [False])
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 5
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[32, 8, 8], dtype="float32")
        a = L.conv2d(x, num_filters=64, filter_size=1, act="relu")                   # BLAS
        b = L.conv2d(a, num_filters=64, filter_size=3, padding=1)                     # taps
        r = L.relu(L.elementwise_add(b, a))                                           # residual
        d = L.conv2d(r, num_filters=64, filter_size=3, padding=1, groups=64,
                     act="relu6")                                                     # depthwise
        g = L.conv2d(d, num_filters=96, filter_size=3, stride=2, padding=1, groups=4)  # grouped
        t = L.conv2d(r, num_filters=32, filter_size=3, stride=2, padding=1, act="relu")  # taps
    names = [v.name for v in (a, r, d, g, t)]  # (b not fetched: the conv takes its epilogue)
    feed = {"x": np.random.default_rng(2).standard_normal((1, 32, 8, 8)).astype("float32")}
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    outs, split, bounds = {}, {}, {}
    # two threads on run_parts' helpers (the parallel loops not on disk), then by the parallel
    # loops (compiled at their first ask if need be), then one thread
    for run, n in (("helpers", 2), ("team", 2), ("one", 1)):
        free[0] = n
        monkeypatch.setattr(team, "COMPILE", run == "team")
        parts.clear()
        outs[run] = exe.run(main, feed=feed, fetch_list=names, scope=scope)
        split[run] = [len(p) - 1 for p in parts if p is not None]
        bounds[run] = [p for p in parts if p is not None]
    assert split == {"helpers": [2, 2, 2, 2, 2], "team": [2, 2, 2, 2, 2], "one": []}
    assert bounds["helpers"][-1] == bounds["team"][-1] == [0, 16, 32]  # (the last conv's)
    assert all(team._READY[(loop, np.dtype(np.float32))] for loop in (
        convlib._gemm_by_channels, convlib._taps_by_channels, convlib._direct_by_channels))
    assert_native(exe)
    # (the 1x1 convolution's parts are BLAS products of rows of its filter, and every result
    # after it depends on it)
    for run in ("helpers", "team"):
        for u, v in zip(outs[run], outs["one"]):
            blas_same(u, v)
    outs[2] = outs["team"]
    w, bias = _conv_params(main, scope, a)
    ya = np.maximum(conv_ref(feed["x"], w[0], bias[0], 1, 0, 1), 0)
    yb = conv_ref(ya, w[1], bias[1], 1, 1, 1)
    yr = np.maximum(yb + ya, 0)
    yd = np.clip(conv_ref(yr, w[2], bias[2], 1, 1, 64), 0, 6)
    yg = conv_ref(yd, w[3], bias[3], 2, 1, 4)
    yt = np.maximum(conv_ref(yr, w[4], bias[4], 2, 1, 1), 0)
    for got, want in zip(outs[2], (ya, yr, yd, yg, yt)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_one_sample_convolution_before_an_epilogue_of_its_own_splits_too(two_asked,
                                                                        monkeypatch):
    """A convolution whose stores cannot take the elementwise ops after it (hard_swish: the
    epilogue kernel runs on its output block by block) is split over the threads at batch 1
    as one without them is (the blocked call goes through ``split_work``): the taps kernel of
    a 3x3 one by its output channels; the result matches NumPy and the one-thread run's bit
    for bit."""
    free, _ = two_asked
    parts = _channel_parts(monkeypatch)
    monkeypatch.setattr(team, "COMPILE", True)
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 7
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[8, 10, 10], dtype="float32")
        y = L.conv2d(x, num_filters=64, filter_size=3, padding=1, stride=2, act="hard_swish")
    feed = {"x": np.random.default_rng(3).standard_normal((1, 8, 10, 10)).astype("float32")}
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    outs, split = {}, {}
    for run, n in (("two", 2), ("one", 1)):
        free[0] = n
        parts.clear()
        (outs[run],) = exe.run(main, feed=feed, fetch_list=[y], scope=scope)
        split[run] = [len(p) - 1 for p in parts if p is not None]
    assert_native(exe)
    assert split == {"two": [2], "one": []}
    np.testing.assert_array_equal(outs["two"], outs["one"])
    w, bias = _conv_params(main, scope, None)
    v = conv_ref(feed["x"], w[0], bias[0], 2, 1, 1)
    np.testing.assert_allclose(outs["one"], v * np.clip(v + 3, 0, 6) / 6, rtol=1e-4, atol=1e-4)


def _by_pixels_runs(free, monkeypatch, main, startup, feed, fetch):
    """``main``'s fetches run on two threads (the parallel loops compiled at their first ask),
    checked to be the one-thread run's bit for bit; and the ranges of output positions that
    each run split a convolution into (``_taps_by_pixels``), by run."""
    monkeypatch.setattr(convlib, "_TEAM_MIN_WORK", 0)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
    ranges = []
    real = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: (
        loop is convlib._taps_by_pixels and ranges.append(call[3].tolist())) or real(loop, call))
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    outs, split = {}, {}
    for run, n in (("team", 2), ("one", 1)):
        free[0] = n
        monkeypatch.setattr(team, "COMPILE", run == "team")
        ranges.clear()
        outs[run] = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
        split[run] = list(ranges)
    assert_native(exe)
    for u, v in zip(outs["team"], outs["one"]):
        assert np.array_equal(u, v)
    return outs["team"], split, scope


def test_one_sample_1x1_convolutions_split_by_output_positions(two_asked, monkeypatch):
    """At batch 1 a 1x1 convolution that the taps kernel computes on its image in place is
    split over ranges of output positions (16 output channels make no two parts of channels):
    one with its bias and relu6 fused, one with a residual connection and relu; each the
    one-thread run's bit for bit, and a NumPy oracle's."""
    free, _ = two_asked
    monkeypatch.setattr(pointwise, "_PACKED", [False])  # (the packed GEMM's own splits)
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 9
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[24, 12, 8], dtype="float32")
        a = L.conv2d(x, num_filters=16, filter_size=1, act="relu6")
        b = L.conv2d(a, num_filters=16, filter_size=1)
        r = L.relu(L.elementwise_add(b, a))
    feed = {"x": np.random.default_rng(4).standard_normal((1, 24, 12, 8)).astype("float32")}
    outs, split, scope = _by_pixels_runs(free, monkeypatch, main, startup, feed, [a, r])
    assert split == {"team": [[0, 48, 96], [0, 48, 96]], "one": []}
    w, bias = _conv_params(main, scope, a)
    ya = np.clip(conv_ref(feed["x"], w[0], bias[0], 1, 0, 1), 0, 6)
    yr = np.maximum(conv_ref(ya, w[1], bias[1], 1, 0, 1) + ya, 0)
    for got, want in zip(outs, (ya, yr)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_one_sample_convolutions_of_prepared_planes_split_by_output_positions(two_asked,
                                                                              monkeypatch):
    """At batch 1 a convolution whose planes the taps kernel prepares (a stem's 3x3 stride 2, a
    5x5) is split over ranges of output positions where each part gets four vectors or more,
    each part preparing the rows its positions read; a 4x4 output (one vector) by channels. Each
    the one-thread run's bit for bit, and a NumPy oracle's."""
    free, _ = two_asked
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 3
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[3, 32, 32], dtype="float32")
        s = L.conv2d(x, num_filters=32, filter_size=3, stride=2, padding=1, act="relu6")
        f = L.conv2d(s, num_filters=16, filter_size=5, padding=2, act="relu")
        t = L.conv2d(f, num_filters=32, filter_size=3, stride=4, padding=1)
    feed = {"x": np.random.default_rng(6).standard_normal((1, 3, 32, 32)).astype("float32")}
    outs, split, scope = _by_pixels_runs(free, monkeypatch, main, startup, feed, [s, f, t])
    assert split == {"team": [[0, 128, 256], [0, 128, 256]], "one": []}
    w, bias = _conv_params(main, scope, None)
    ys = np.clip(conv_ref(feed["x"], w[0], bias[0], 2, 1, 1), 0, 6)
    yf = np.maximum(conv_ref(ys, w[1], bias[1], 1, 2, 1), 0)
    yt = conv_ref(yf, w[2], bias[2], 4, 1, 1)
    for got, want in zip(outs, (ys, yf, yt)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_pointwise_convolutions_split_by_channels_and_samples(two_asked, monkeypatch):
    """1x1 convolutions on weights run on the packed GEMM (``lib.pointwise``): at batch 1 split
    over whole tiles of the packed filter's output channels (both orientations: a 32x32 plane
    on the row tiles, 19 -> 150 channels with bias + residual + relu6 fused; a 7x7 plane on the
    transposed tiles, 150 -> 140 with bias + relu), at batch 3 over the samples; every result
    the one-thread run's bit for bit, and a NumPy oracle's."""
    free, _ = two_asked
    monkeypatch.setattr(convlib, "_CHANNELS_MIN_WORK", 0)
    monkeypatch.setattr(convlib, "_TEAM_MIN_WORK", 0)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "LOOK_AGAIN_S", 0.0)
    monkeypatch.setattr(convlib, "_PARALLEL_MIN_WORK", 0)
    # (the row tiles' split by pixels, which a loop made ready elsewhere would take first:
    # test_pointwise_conv.py)
    monkeypatch.setattr(pointwise, "_pixel_bounds", lambda parts, p_: None)
    parts = []  # the ranges of each split call, by run_parts' helpers or a parallel loop
    real = pointwise._tile_bounds
    monkeypatch.setattr(pointwise, "_tile_bounds", lambda *a: parts.append(real(*a)) or parts[-1])
    samples = []
    real_split = convlib._split
    monkeypatch.setattr(convlib, "_split", lambda fn, k, n, *a, head=3: samples.append(
        (getattr(fn, "__name__", ""), k, n)) or real_split(fn, k, n, *a, head=head))
    L = fluid.layers
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 7
    with fluid.program_guard(main, startup):
        x = L.data(name="x", shape=[19, 32, 32], dtype="float32")
        r = L.data(name="r", shape=[150, 32, 32], dtype="float32")
        s = L.data(name="s", shape=[150, 7, 7], dtype="float32")
        a = L.relu6(L.elementwise_add(L.conv2d(x, num_filters=150, filter_size=1), r))
        b = L.conv2d(s, num_filters=140, filter_size=1, act="relu")
    rng = np.random.default_rng(4)
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=False, strict=True)
    exe.run(startup, scope=scope)
    w, bias = _conv_params(main, scope, r)
    for batch in (1, 3):
        feed = {k: rng.standard_normal((batch,) + tuple(v.shape[1:])).astype("float32")
                for k, v in (("x", x), ("r", r), ("s", s))}
        outs, split = {}, {}
        # two threads (batch 1: on run_parts' helpers, the parallel loop not on disk, then by
        # the parallel loop, compiled at its first ask if need be), then one
        for run, n in (("helpers", 2), ("team", 2), ("one", 1)):
            free[0] = n
            monkeypatch.setattr(team, "COMPILE", run == "team")
            parts.clear()
            samples.clear()
            outs[run] = exe.run(main, feed=feed, fetch_list=[a, b], scope=scope)
            split[run] = [len(c[0]) - 1 for c in parts if c is not None] + samples
        assert split == ({"helpers": [2, 2], "team": [2, 2], "one": []} if batch == 1 else
                         {"helpers": [("pointwise_range", 2, 3)] * 2,
                          "team": [("pointwise_range", 2, 3)] * 2, "one": []}), split
        if batch == 1:
            assert team._READY[(pointwise._by_channels, np.dtype(np.float32))]
        assert_native(exe)
        for run in ("helpers", "team"):
            for u, v in zip(outs[run], outs["one"]):
                assert np.array_equal(u, v)
        outs[2] = outs["team"]
        ya = np.clip(conv_ref(feed["x"], w[0], bias[0], 1, 0, 1) + feed["r"], 0, 6)
        yb = np.maximum(conv_ref(feed["s"], w[1], bias[1], 1, 0, 1), 0)
        for got, want in zip(outs[2], (ya, yb)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    report = exe.explain(main, feed=feed, fetch_list=[a, b])
    assert "pointwise_range_rows" in report and "pointwise_range_cols" in report, report


@pytest.mark.parametrize("shape,perm", [((6, 5, 3, 4), (0, 2, 1, 3)), ((1, 7, 4, 3), (0, 2, 1, 3)),
                                        ((5, 9), (1, 0)), ((1, 1, 6), (2, 0, 1))])
def test_a_large_permuted_copy_is_split_over_threads(monkeypatch, shape, perm):
    """A transpose's copy of many values goes in slices of its first output axis of two values
    or more, one per thread (the threshold lowered here): NumPy's values, C-contiguous."""
    from pdjit.codegen.cpu.lib import indexing

    calls = []
    run_parts = indexing.run_parts
    monkeypatch.setattr(indexing, "PERMUTE_SPLIT_MIN", 1)
    monkeypatch.setattr(indexing, "loop_threads", lambda: 3)
    monkeypatch.setattr(indexing, "run_parts",
                        lambda fn, parts, most: calls.append(len(parts)) or
                        run_parts(fn, parts, most))
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = np.transpose(x, perm)
    got = np.empty(want.shape, x.dtype)
    indexing._copy_permuted(got, x, perm)
    np.testing.assert_array_equal(got, want)
    assert got.flags.c_contiguous and got.dtype == x.dtype
    axis_len = next(d for d in want.shape if d >= 2)
    assert calls == [min(3, axis_len)]


def test_transpose_ops_copy_through_the_library(fresh_programs):
    """transpose2 and its gradient lower to ``_nn.permute_into`` on the CPU: NumPy's values."""
    x = fluid.layers.data("x", [3, 4, 5], append_batch_size=False, stop_gradient=False)
    y = fluid.layers.transpose(x, [1, 2, 0])
    loss = fluid.layers.reduce_sum(y * fluid.layers.assign(
        np.arange(60, dtype=np.float32).reshape(4, 5, 3)))
    g, = fluid.backward.gradients(loss, [x])
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    xv = np.random.default_rng(4).standard_normal((3, 4, 5)).astype(np.float32)
    got_y, got_g = exe.run(feed={"x": xv}, fetch_list=[y, g])
    assert_native(exe)
    src = exe.explain(feed={"x": xv}, fetch_list=[y, g])
    assert src.count("_nn.permute_into(") == 2, src
    np.testing.assert_array_equal(got_y, xv.transpose(1, 2, 0))
    np.testing.assert_array_equal(got_g, np.arange(60, dtype=np.float32).reshape(4, 5, 3)
                                  .transpose(2, 0, 1))
    # (in a native driver, compiled code's copy: tests/io/test_onnx_rnn.py's native-driver
    # test runs transposes there)


def test_softmax_rows_split_from_fewer_elements_than_elementwise_loops(two_asked):
    """An element of softmax's rows costs ~16 elementwise ops: its loop runs on the threads
    from ``INFERENCE_PARALLEL_MIN_SIZE // SOFTMAX_WORK`` elements in an inference program
    (64 rows of 128), where an elementwise loop would run on one. The values are a NumPy
    oracle's, and the one-thread run's bit for bit."""
    from pdjit.codegen.cpu.target import INFERENCE_PARALLEL_MIN_SIZE as MIN_SIZE
    from pdjit.ops.nn import SOFTMAX_WORK

    free, _ = two_asked
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[64, 128], dtype="float32",
                              append_batch_size=False)
        y = fluid.layers.softmax(x * 2.0)
    assert 64 * 128 >= MIN_SIZE // SOFTMAX_WORK and 64 * 128 < MIN_SIZE
    xv = np.random.default_rng(8).standard_normal((64, 128)).astype(np.float32)
    exe = fluid.Executor(native_drivers=False, strict=True)
    outs = {}
    for n in (2, 1):
        free[0] = n
        (outs[n],) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=fluid.Scope())
    (step,) = [s for _, p in exe._plans.values() for s in p.walk() if s.kind == "native"]
    assert f">= {MIN_SIZE // SOFTMAX_WORK}:" in step.compiled.text
    assert "numba.prange" in step.compiled.text and "parallel=True" in step.compiled.text
    assert_native(exe)
    assert np.array_equal(outs[2], outs[1])
    e = np.exp(2.0 * xv.astype(np.float64) - (2.0 * xv).max(axis=1, keepdims=True))
    np.testing.assert_allclose(outs[2], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_an_inference_block_runs_its_loops_on_the_threads_from_fewer_elements(two_asked):
    """A block that writes no persistable (inference) runs an elementwise loop on the threads
    from ``INFERENCE_PARALLEL_MIN_SIZE`` elements, a training block (its optimizer writes
    the parameters) from ``PARALLEL_MIN_SIZE``; the values are NumPy's either way."""
    from pdjit.codegen.cpu.target import INFERENCE_PARALLEL_MIN_SIZE, PARALLEL_MIN_SIZE

    free, _ = two_asked
    assert INFERENCE_PARALLEL_MIN_SIZE < PARALLEL_MIN_SIZE
    rng = np.random.default_rng(9)
    xv = rng.standard_normal((4, 64)).astype(np.float32)
    for train in (False, True):
        main, startup = fluid.Program(), fluid.Program()
        with fluid.program_guard(main, startup):
            x = fluid.layers.data(name="x", shape=[4, 64], dtype="float32",
                                  append_batch_size=False)
            h = fluid.layers.fc(x, 8, param_attr=fluid.ParamAttr(name="w"), bias_attr=False)
            y = fluid.layers.relu(h * 2.0 + 1.0)  # (no math function: a lower threshold)
            if train:
                fluid.optimizer.SGD(0.1).minimize(fluid.layers.mean(y))
        exe = fluid.Executor(native_drivers=False, strict=True)
        scope = fluid.Scope()
        exe.run(startup, scope=scope)
        w = np.array(scope.find_var("w").get_tensor())
        got, = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(got, np.maximum((xv @ w) * 2.0 + 1.0, 0.0),
                                   rtol=1e-5, atol=1e-6)
        texts = [s.compiled.text for _, p in exe._plans.values() for s in p.walk()
                 if s.kind == "native"]
        want = PARALLEL_MIN_SIZE if train else INFERENCE_PARALLEL_MIN_SIZE
        other = INFERENCE_PARALLEL_MIN_SIZE if train else PARALLEL_MIN_SIZE
        assert any(f">= {want}:" in t for t in texts), texts
        assert not any(f">= {other}:" in t for t in texts)
