"""Threads where they win: large elementwise loops run on every core by default, their parallel
variant compiled only when a run first reaches the size; BLAS stays on one thread."""
import numpy as np

import pdjit as fluid
from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu.target import PARALLEL_MIN_SIZE
from pdjit.testing import assert_native


def test_default_threads_every_core_for_loops_one_for_blas(monkeypatch):
    import threading

    import numba

    monkeypatch.delenv("PDJIT_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_applied", None)
    monkeypatch.setattr(threads, "_default_threads", None)  # (the variable is read once)
    # no run's cap on this thread (an earlier test's plan may have kept its runs on one thread)
    monkeypatch.setattr(threads, "_run_local", threading.local())

    assert threads.get_num_threads() == 1
    assert threads.max_loop_threads() == numba.config.NUMBA_NUM_THREADS
    monkeypatch.setattr(threads, "free_cores", lambda: 1)   # another process keeps a core busy
    assert threads.loop_threads() == 1 and threads.blas_threads() == 1
    monkeypatch.setattr(threads, "free_cores", lambda: 64)
    assert threads.loop_threads() == numba.config.NUMBA_NUM_THREADS
    monkeypatch.setenv("PDJIT_NUM_THREADS", "1")
    monkeypatch.setattr(threads, "_default_threads", None)  # read again, as a new process does
    assert threads.loop_threads() == threads.max_loop_threads() == 1


def test_the_parallel_variant_compiles_only_when_a_run_reaches_its_size(monkeypatch):
    monkeypatch.delenv("PDJIT_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_applied", None)
    monkeypatch.setattr(threads, "_default_threads", None)
    if threads.max_loop_threads() < 2:
        import pytest
        pytest.skip("one core: no parallel loops")
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[-1], dtype="float32", append_batch_size=False)
        y = fluid.layers.tanh(x * 3.0) - x
    exe = fluid.Executor()
    small = np.linspace(-1, 1, 100, dtype=np.float32)
    (got,) = exe.run(main, feed={"x": small}, fetch_list=[y], scope=fluid.Scope())
    np.testing.assert_allclose(got, np.tanh(small * 3) - small, rtol=1e-6, atol=1e-6)
    (step,) = [s for _, p in exe._plans.values() for s in p.walk() if s.kind == "native"]
    ns = step.compiled.fn.__globals__
    (lazy,) = [ns[g] for g, _ in step.compiled.lazy]
    assert lazy.fn is None                      # small: the serial kernel ran, nothing more
    big = np.linspace(-1, 1, PARALLEL_MIN_SIZE + 7, dtype=np.float32)
    for _ in range(2):   # the serial kernel serves while the variant compiles, then the variant
        (got,) = exe.run(main, feed={"x": big}, fetch_list=[y], scope=fluid.Scope())
        np.testing.assert_allclose(got, np.tanh(big * 3) - big, rtol=1e-6, atol=1e-6)
        assert lazy.compiling is not None          # (a thread of its own: no run waited)
        lazy.compiling.join(300)
        assert lazy.fn is not None and lazy.failed is None
    assert lazy.fn.signatures and "parallel=True" in step.compiled.text
    assert_native(exe)


def test_the_users_numpy_blas_keeps_its_threads(monkeypatch):
    from pdjit.codegen.cpu.threads import _openblas, _site

    seen = []

    class Spy(threads.numpy_blas):
        __slots__ = ()

        def __enter__(self):
            out = super().__enter__()
            seen.append(get())          # inside a run: pdjit's count
            return out

    monkeypatch.setattr(threads, "numpy_blas", Spy)

    set_, get = _openblas(__import__("os").path.join(_site(np), "numpy.libs"))
    if set_ is None or get is None:
        import pytest
        pytest.skip("NumPy's BLAS is not an OpenBLAS with a thread count")
    before = get()
    set_(2)
    try:
        main = fluid.Program()
        with fluid.program_guard(main, fluid.Program()):
            x = fluid.layers.data(name="x", shape=[4], dtype="float32")
            y = fluid.layers.fc(x, 3)
        exe = fluid.Executor()
        scope = fluid.Scope()
        exe.run(fluid.default_startup_program(), scope=scope)
        exe.run(main.clone(), feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[y.name],
                scope=_with_params(main, scope))
        assert seen == [threads.get_num_threads()]   # pdjit's count while its GEMMs ran
        assert get() == 2                            # the user's count again afterwards
    finally:
        set_(before)


def _with_params(main, scope):
    for v in main.global_block().all_parameters():
        scope.var(v.name).value = np.ones(v.shape, np.float32)
    return scope


def test_a_blocked_epilogue_of_one_sample_runs_its_parallel_variant(monkeypatch,
                                                                    background_compiles):
    """A product by a weight over one sample's sequence, its bias and gelu the epilogue of its
    blocks: the host driver cannot split one sample by samples, so a block of
    ``parallel_min_elements`` (a math function: 16x fewer; an inference block's threshold)
    runs the epilogue's parallel
    variant (compiled when first reached; here in the run, ``LAZY_THREAD`` off), the memory
    plan's in-place variant of it too; a smaller block runs the serial kernel."""
    import math

    from pdjit.codegen.cpu import target
    from pdjit.codegen.cpu.target import INFERENCE_PARALLEL_MIN_SIZE, MATH_WORK

    monkeypatch.setattr(target, "LAZY_THREAD", False)
    fluid.set_num_threads(2)
    try:
        if threads.max_loop_threads() < 2:
            import pytest
            pytest.skip("one core: no parallel loops")
        main, startup = fluid.Program(), fluid.Program()
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            x = fluid.layers.data(name="x", shape=[-1, -1, 32], dtype="float32",
                                  append_batch_size=False)
            y = fluid.layers.fc(x, 1024, num_flatten_dims=2, act="gelu")
        scope = fluid.Scope()
        exe = fluid.Executor(memory_optim=True)
        exe.run(startup, scope=scope)
        w, b = (np.asarray(scope.find_var(n).get_tensor()) for n in ("fc_0.w_0", "fc_0.b_0"))
        erf = np.vectorize(math.erf)
        lazies = []
        # below, at the threshold (an inference block's: the program writes no persistable)
        for rows in (2, INFERENCE_PARALLEL_MIN_SIZE // MATH_WORK // 1024):
            xv = np.random.default_rng(rows).normal(size=(1, rows, 32)).astype(np.float32)
            (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
            h = xv.astype(np.float64) @ w + b
            np.testing.assert_allclose(got, 0.5 * h * (1 + erf(h / math.sqrt(2))), rtol=1e-5,
                                       atol=1e-5)
            (step,) = [s for _, p in exe._plans.values() for s in p.walk()
                       if s.kind == "native" and "split_work(K" in s.compiled.text]
            ns = step.compiled.fn.__globals__
            (lazy,) = [ns[g] for g, _ in step.compiled.lazy]
            # the blocked call is given the parallel variant
            assert f", {lazy_name(ns, lazy)}, " in \
                step.compiled.text.split("split_work(K")[1].split("\n")[0]
            lazies.append((lazy, lazy.fn))
        (small, before), (big, after) = lazies
        assert small is big and before is None     # the small block: the serial kernel
        assert after is not None and big.failed is None and after.signatures
        assert background_compiles == [1]  # (its compile: work beside the runs)
        assert_native(exe)
        # the same bits as one thread's serial epilogue
        fluid.set_num_threads(1)
        (one,) = fluid.Executor(memory_optim=True).run(main, feed={"x": xv}, fetch_list=[y],
                                                       scope=scope)
        np.testing.assert_array_equal(got, one)
    finally:
        fluid.set_num_threads(1)


def lazy_name(ns: dict, lazy) -> str:
    return next(g for g, v in ns.items() if v is lazy)


def test_a_blocked_kernel_gives_its_parallel_variant_only_a_whole_batch():
    """The blocked kernel's parallel epilogue runs only where the call has the whole batch: a
    part of a batch split over threads by samples runs the serial epilogue (a team started in
    each part would fight the others for the cores: an encoder at batch 16 on two threads
    took 156-180 ms a run against 130); a batch of one sample calls the op through
    ``split_work`` with the op's work (which may split the sample). The generated source run
    with stand-ins."""
    from pdjit.codegen.cpu.target import blocked_kernel, parallel_min_elements
    from pdjit.codegen.kernel import FULL, Leaf, LoopKernel

    k = LoopKernel(2, [Leaf(2, 0, (-1, 8), FULL)], ["e1 = _m.tanh(x0)"],
                   [("e1", "float32", frozenset({0}))], 0, form="flat", math=("tanh",))
    per = parallel_min_elements(k)
    ns, calls = {}, []
    exec(blocked_kernel(k, "F", 0, 0, parallel=True), ns)  # noqa: S102 - generated here
    ns["F"] = lambda b0, b1: calls.append(("F", b0, b1))
    ns["E"] = lambda *a: calls.append(("E", a[-1]))

    def EP(serial, *a):  # noqa: N802 - the parallel variant's stand-in
        calls.append(("EP", a[-1]))

    class Lib:  # (the library's stand-in: split_work runs the op whole, recorded)
        @staticmethod
        def split_work(fn, n, work, *args, head=2):
            calls.append(("split_work", n, work))
            fn(*args[:head], 0, n, *args[head:])
    ns["_nn"] = Lib

    x, out = np.zeros(4 * per, np.float32), np.zeros(4 * per, np.float32)
    ns["kernel"](0, 4, 4, EP, 99, x, out, x.size)          # the whole batch: the variant
    assert [c[0] for c in calls] == ["F", "EP"] * 4
    calls.clear()
    ns["kernel"](2, 4, 4, EP, 99, x, out, x.size)          # a thread's part: the serial kernel
    assert [c[0] for c in calls] == ["F", "E"] * 2 and calls[1] == ("E", per)
    calls.clear()
    small = np.zeros(per // 2, np.float32)
    ns["kernel"](0, 4, 4, EP, 99, small, small, small.size)  # a block below the size: serial
    assert [c[0] for c in calls] == ["F", "E"]
    calls.clear()
    one = np.zeros(per, np.float32)
    ns["kernel"](0, 1, 1, EP, 99, one, one, one.size)  # one sample: through split_work
    assert calls == [("split_work", 1, 99), ("F", 0, 1), ("EP", per)]


def _no_team_yet(monkeypatch) -> list:
    """No thread has a team yet, and taking a team's ids records the thread that asks (in the
    list returned) instead of starting OpenMP's threads."""
    import threading

    asked = []
    monkeypatch.setattr(threads, "_thread_ids",
                        [lambda: asked.append(threading.get_native_id()) or []])
    monkeypatch.setattr(threads, "_teams", {})
    monkeypatch.setattr(threads, "_team_owner", [None])
    return asked

def test_a_thread_kept_to_one_thread_starts_no_team(monkeypatch):
    """``place_team`` on a thread whose loops run on it alone (``one_thread``: a slice of a
    batch split over threads; a one-thread run) neither takes the ids of a team for it (which
    starts OpenMP's threads for that thread: more threads than cores, after which OpenMP stops
    every team's polling) nor sets any mask; the same thread's loops on every core do."""
    import threading

    import pytest

    if threads._getcpu is None:
        pytest.skip("no getcpu: teams are not placed")
    asked = _no_team_yet(monkeypatch)
    seen = []

    def work():  # (a fresh thread: no run's cap, no team known)
        with threads.one_thread():
            threads.place_team()
        seen.append(list(asked))
        threads.place_team()
        seen.append(list(asked))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [[], [t.native_id]]
    assert list(threads._teams) == [t.native_id]


def test_a_team_is_placed_once_the_loop_that_names_it_is_ready(monkeypatch):
    """While the loop that takes a team's ids is neither compiled nor on disk
    (``lib.team.thread_ids`` gives None: it is compiled ahead, never in a run) ``place_team``
    keeps no team and asks again at its next call; once it gives ids, the team is kept."""
    import threading

    import pytest

    if threads._getcpu is None:
        pytest.skip("no getcpu: teams are not placed")
    _no_team_yet(monkeypatch)
    ready, asked = [False], []

    def ids():
        asked.append(ready[0])
        return [] if ready[0] else None

    monkeypatch.setattr(threads, "_thread_ids", [ids])
    seen = []

    def work():
        threads.place_team()
        seen.append(dict(threads._teams))
        ready[0] = True
        threads.place_team()
        threads.place_team()  # (kept: not asked again)
        seen.append(list(threads._teams))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert asked == [False, True] and seen == [{}, [t.native_id]]


def test_the_loop_that_names_a_team_is_not_compiled_in_a_run(monkeypatch):
    """``lib.team.thread_ids`` without its loop compiled or on disk: None, and nothing
    compiled (``COMPILE`` off, as outside tests); it looks on disk again only after
    ``LOOK_AGAIN_S``."""
    from pdjit.codegen.cpu.lib import team

    if team._GETTID is None:
        import pytest
        pytest.skip("no gettid: no ids to take")
    looked = []
    monkeypatch.setattr(team, "COMPILE", False)
    monkeypatch.setattr(team, "_READY", {})
    monkeypatch.setattr(team, "_on_disk", lambda loop, sig: looked.append(sig) or False)
    monkeypatch.setattr(team._ids, "overloads", {})
    compiled = []
    monkeypatch.setattr(team._ids, "compile", lambda sig: compiled.append(sig))
    assert team.thread_ids() is None and team.thread_ids() is None
    assert len(looked) == 1 and not compiled


def test_work_splits_over_the_cores_from_one_thread_at_a_time(monkeypatch):
    """The first thread that starts a team owns it while it lives: on another thread a run's
    loops and splits stay on that thread (``begin_run``, ``loop_threads``; no team started)
    but slices of a batch, each on a helper kept to one thread (``slice_threads``);
    once the owner has ended, the next thread's work splits and starts its own team."""
    import threading

    import numba
    import pytest

    if threads._getcpu is None or numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("no getcpu, or one thread: no teams")
    asked = _no_team_yet(monkeypatch)
    monkeypatch.setattr(threads, "free_cores", lambda: 2)
    monkeypatch.setattr(threads, "max_loop_threads", lambda: 2)
    seen = []
    go = threading.Event()

    def look(name):
        threads.begin_run()
        threads.place_team()
        seen.append((name, numba.get_num_threads(), threads.loop_threads(),
                     threads.slice_threads(), threads.other_team()))

    def owner():
        look("owner")
        go.wait()

    first = threading.Thread(target=owner)
    first.start()
    while not seen:
        go.wait(0.01)
    second = threading.Thread(target=look, args=("other",))
    second.start()
    second.join()
    go.set()
    first.join()
    assert seen == [("owner", 2, 2, 2, False), ("other", 1, 1, 2, True)]
    assert asked == [first.native_id]  # (no team for the other thread)
    third = threading.Thread(target=look, args=("next",))  # (the owner has ended)
    third.start()
    third.join()
    assert seen[-1] == ("next", 2, 2, 2, False) and asked == [first.native_id, third.native_id]


def test_a_replay_keeps_its_thread_on_the_core_its_team_was_placed_off(monkeypatch):
    """``hold_caller``: a thread whose team is placed is watched: ``release_caller`` after its
    run looks at the core it ended on, and no mask changes while it ends on the core its team
    was placed off. Once it ended one on another (moved during the run), each later run keeps
    it on that core (its mask that core alone), and ``release_caller`` gives its mask back. A
    thread with no team, or in a one-thread run, is left as it is. A recording's replay with
    parallel loops does both around its calls."""
    import os
    import threading

    import pytest

    from pdjit.codegen.cpu import replay

    if threads._getcpu is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("no getcpu, or one core: nothing to hold")
    monkeypatch.setattr(threads, "_teams", {})
    monkeypatch.setattr(threads, "MOVED", [0])
    seen = []

    def work():
        before = os.sched_getaffinity(0)
        seen.append(threads.hold_caller())  # (no team: left alone)
        cpu, other = sorted(before)[:2]
        team = threads._teams[threading.get_native_id()] = [[], cpu]
        with threads.one_thread():
            seen.append(threads.hold_caller())  # (a one-thread run: left alone)
        os.sched_setaffinity(0, {cpu})  # (the run's end seen on the core its team is off)
        watched = threads.hold_caller()
        threads.release_caller(watched)
        seen.append((watched is threads._WATCH, os.sched_getaffinity(0), threads.MOVED[0]))
        team[1] = other  # (a run that ends on the other core: the thread moved)
        threads.release_caller(threads.hold_caller())
        os.sched_setaffinity(0, before)
        team[1] = cpu
        held = threads.hold_caller()
        seen.append((held, os.sched_getaffinity(0), threads._getcpu(), threads.MOVED[0]))
        threads.release_caller(held)
        seen.append(os.sched_getaffinity(0) == before)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    cpu = sorted(os.sched_getaffinity(0))[0]
    assert seen == [None, None, (True, {cpu}, 0), (os.sched_getaffinity(0), {cpu}, cpu, 1),
                    True]

    calls = []
    monkeypatch.setattr(threads, "place_team", lambda: calls.append("place"))
    monkeypatch.setattr(threads, "hold_caller", lambda: calls.append("hold") or "mask")
    monkeypatch.setattr(threads, "release_caller", lambda m: calls.append(("release", m)))
    rec = replay.Recording.__new__(replay.Recording)
    rec.teams, rec.parts, rec.ops, rec.outputs = {0}, [], [], ("out",)
    assert rec.replay([]) == ("out",)
    assert calls == ["place", "hold", ("release", "mask")]
