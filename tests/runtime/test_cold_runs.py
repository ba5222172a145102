"""``Executor(cold_runs=...)``: the first runs of a small program whose kernels are not on disk
yet run on the ops' NumPy references while forked workers compile them, then its compiled plan
takes over. Checked in a fresh process (an empty cache directory, no other Python thread: a
worker is forked only then) against a reference-mode executor run beside it, step by step of a
training loop: bit for bit while interpreted, to rounding once compiled (native steps, kernels
the workers compiled); with
``cold_runs="compile"``, in strict mode and for a program too large to interpret, the first run
waits for its compiled plan."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from pdjit import Executor
from pdjit.runtime import executor as executor_mod

SCRIPT = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import pdjit as fluid
    from pdjit.codegen import compiler
    from pdjit.runtime import executor as executor_mod

    def build(width, scale):
        main, startup = fluid.Program(), fluid.Program()
        startup.random_seed = 3
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            x = fluid.layers.data(name="x", shape=[6], dtype="float32")
            y = fluid.layers.data(name="y", shape=[1], dtype="float32")
            h = fluid.layers.fc(x, width, act="tanh")
            h = fluid.layers.scale(h, scale=scale, bias=0.125)
            p = fluid.layers.fc(h, 1)
            loss = fluid.layers.mean(fluid.layers.square(p - y))
            fluid.optimizer.SGD(learning_rate=0.05).minimize(loss)
        return main, startup, loss

    def planned(exe, program):
        return any(p is program for p, _ in exe._plans.values())

    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((16, 6)).astype(np.float32),
            "y": rng.standard_normal((16, 1)).astype(np.float32)}
    out = {}
    main, startup, loss = build(24, 1.171875)
    ref, exe = fluid.Executor(mode="reference"), fluid.Executor()
    s_ref, s_exe = fluid.Scope(), fluid.Scope()
    ref.run(startup, scope=s_ref)
    exe.run(startup, scope=s_exe)
    out["startup_equal"] = all(
        np.array_equal(s_ref.find_var(n).value, s_exe.find_var(n).value)
        for n in ("fc_0.w_0", "fc_1.w_0"))
    interpreted, compiled, gaps = [], [], []
    t_end = time.monotonic() + 120
    while len(compiled) < 3 and time.monotonic() < t_end:
        (a,) = ref.run(main, feed=feed, fetch_list=[loss], scope=s_ref)
        (b,) = exe.run(main, feed=feed, fetch_list=[loss], scope=s_exe)
        was = planned(exe, main)  # (a run takes the compiled plan over before it runs)
        (compiled if was else interpreted).append((float(a.ravel()[0]), float(b.ravel()[0])))
        if not was:
            time.sleep(0.02)
    out["interpreted"], out["compiled"] = interpreted, compiled
    out["worker_kernels"] = compiler._by_worker[0]
    out["steps_native"] = [s.kind for p, plan in exe._plans.values() if p is main
                           for s in plan.steps]
    # a program too large to interpret, strict mode, cold_runs="compile": planned at once
    executor_mod.COLD_RUN_VALUES = 100
    waits = {}
    for name, kw, width in (("large", {}, 32), ("strict", {"strict": True}, 40),
                            ("compile", {"cold_runs": "compile"}, 48)):
        m, s, l = build(width, 0.5 + width / 1024)
        e, sc = fluid.Executor(**kw), fluid.Scope()
        e.run(s, scope=sc)
        e.run(m, feed=feed, fetch_list=[l], scope=sc)
        waits[name] = planned(e, m)
    out["waits"] = waits
    print("RESULT " + json.dumps(out))
""")


def _run(tmp_path, script: str) -> dict:
    """What ``script`` prints after ``RESULT `` (JSON), run in a fresh process: with
    ``tmp_path``, in empty caches there, non-strict, with cold runs on and compile workers
    allowed (not the suite's xdist setting); without, in the suite's environment."""
    env = None
    if tmp_path is not None:
        env = dict(os.environ, PDJIT_CACHE_DIR=str(tmp_path / "cache"),
                   NUMBA_CACHE_DIR=str(tmp_path / "numba"), PDJIT_STRICT="0",
                   PDJIT_AUTO_WARMUP="0", PDJIT_COLD_RUNS="reference")
        env.pop("PDJIT_COMPILE_WORKERS", None)
        env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_first_runs_interpreted_while_workers_compile(tmp_path):
    out = _run(tmp_path, SCRIPT)
    assert out["startup_equal"]  # the counter-based random stream: the same weights
    # the first run was interpreted: the reference's values, bit for bit, at every such step;
    # at most COLD_RUN_MAX_RUNS of them (the next waits for the compiled plan)
    assert 1 <= len(out["interpreted"]) <= executor_mod.COLD_RUN_MAX_RUNS, out
    assert all(a == b for a, b in out["interpreted"])
    # then the compiled plan: the same training to rounding, its kernels from the workers
    assert len(out["compiled"]) == 3, out
    for a, b in out["compiled"]:
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6)
    assert out["worker_kernels"] > 0
    assert "native" in out["steps_native"]
    assert out["waits"] == {"large": True, "strict": True, "compile": True}


def test_cold_runs_setting_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="cold_runs"):
        Executor(cold_runs="later")
    monkeypatch.setenv("PDJIT_COLD_RUNS", "soon")
    with pytest.raises(ValueError, match="PDJIT_COLD_RUNS"):
        Executor()
    # an interpreted run of an executor given its setting: the setting, not the environment's
    from pdjit import Program, Scope
    from pdjit.runtime.context import Env

    block = Program().global_block()
    Executor(cold_runs="reference")._interpret(None, block, Env(Scope(), block), 0)
    monkeypatch.setenv("PDJIT_COLD_RUNS", "Compile")
    assert Executor().cold_runs == "compile"
    monkeypatch.delenv("PDJIT_COLD_RUNS")
    assert Executor().cold_runs == "reference"


WORKERS_SCRIPT = textwrap.dedent("""
    import json, os, signal, time
    from pdjit.codegen import compiler

    # Ctrl-C as a terminal delivers it: an "ignore" this process may have inherited (a test
    # runner's worker ignoring SIGINT, a module of an earlier test that set it) would keep the
    # forked worker from ending, whatever pdjit does
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Job:  # a compile job whose compile takes long, in Python
        name, cost, affinity = "slow", 1.0, None
        class fn:
            @staticmethod
            def compile(sig):
                time.sleep(30)

    out = {}
    # Ctrl-C (SIGINT to the process group) ends a worker: none is left compiling its
    # other jobs for this process to wait for at exit
    (pid,), rd = compiler._fork_workers([[(Job, ())], [(Job, ())]], 1, refresh=False)
    os.close(rd)
    time.sleep(0.5)
    os.kill(pid, signal.SIGINT)
    t0 = time.monotonic()
    while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < t0 + 10:
        time.sleep(0.01)
    out["sigint_s"] = time.monotonic() - t0
    # children the kernel reaps (SIGCHLD ignored): waiting for them is no error
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    bg = compiler.Background()
    for _ in range(2):
        child = os.fork()
        if child == 0:
            os._exit(0)
        bg.pids.append(child)
    time.sleep(0.3)
    bg.wait()
    out["reaped_elsewhere"] = bg.pids
    print("RESULT " + json.dumps(out))
""")


def test_workers_end_on_an_interrupt_and_may_be_reaped_elsewhere():
    out = _run(None, WORKERS_SCRIPT)
    assert out["sigint_s"] < 5, out
    assert out["reaped_elsewhere"] == []


DETACHED_SCRIPT = textwrap.dedent("""
    import os, time
    from pdjit.codegen import compiler

    compiler._drain = lambda rd, todo, swallow: time.sleep(20)  # (the worker's long compile)
    compiler._fork_workers([[]], 1, refresh=False)
    print("RESULT {}", flush=True)
    os._exit(0)  # (a rank that dies: no wait for the worker at exit)
""")


def test_a_process_that_exits_is_not_held_by_its_compile_worker():
    """The worker forked to compile keeps none of its parent's output pipes: a caller reading
    them (as ``mpiexec`` watches a rank) sees the parent end when it exits, not when the
    worker's 20 s compile ends."""
    t0 = time.monotonic()
    assert _run(None, DETACHED_SCRIPT) == {}
    assert time.monotonic() - t0 < 15


THREADS_SCRIPT = textwrap.dedent("""
    import json, threading, time
    import numpy as np
    import pdjit as fluid
    from pdjit.codegen import compiler
    from pdjit.runtime import executor as executor_mod, feed_fetch

    def planned(exe, program):
        return any(p is program for p, _ in exe._plans.values())

    out = {}
    # a program of several control-flow blocks: one set of workers for its plan's kernels
    # and its blocks' (at most one per core, two at most)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        zero = fluid.layers.fill_constant([1], "float32", 0.0)
        pred = fluid.layers.less_than(zero, fluid.layers.reduce_sum(x))
        outs = [fluid.layers.cond(pred, lambda k=k: fluid.layers.tanh(x * (k + 1.5)),
                                  lambda k=k: fluid.layers.sigmoid(x - k) * 2.0)
                for k in range(3)]
        y = fluid.layers.sums(outs)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    feed = {"x": np.arange(8, dtype=np.float32).reshape(2, 4) / 7}
    executor_mod.COLD_RUN_MAX_S = 1e9  # (no slow first run makes the next one wait)
    exe.run(main, feed=feed, fetch_list=[y], scope=scope)
    out["cold"] = not planned(exe, main)
    out["workers"] = max(len(bg.pids) for bg in compiler._background)
    # two threads running one executor: one takes the compiled plan over while the other is
    # between its look-up (no plan yet) and its interpreted run
    real = feed_fetch.check_feed_spec
    paused, go = threading.Event(), threading.Event()

    def check(spec, v):
        if threading.current_thread().name == "B" and not go.is_set():
            paused.set()
            go.wait()
        return real(spec, v)

    feed_fetch.check_feed_spec = check
    errors, got = [], []

    def other():
        try:
            got.append(exe.run(main, feed=feed, fetch_list=[y], scope=scope)[0])
        except Exception as e:
            errors.append(repr(e))

    t = threading.Thread(target=other, name="B")
    t.start()
    paused.wait()
    out["paused_cold"] = not planned(exe, main)
    t_end = time.monotonic() + 120
    while not planned(exe, main) and time.monotonic() < t_end:
        exe.run(main, feed=feed, fetch_list=[y], scope=scope)
        time.sleep(0.02)
    go.set()
    t.join()
    out["taken_over"] = planned(exe, main)
    out["errors"] = errors
    (want,) = fluid.Executor(mode="reference").run(main, feed=feed, fetch_list=[y],
                                                   scope=fluid.Scope())
    out["close"] = bool(got) and bool(np.allclose(got[0], want, rtol=1e-5))
    print("RESULT " + json.dumps(out))
""")


def test_two_threads_and_control_flow_blocks_while_compiling(tmp_path):
    out = _run(tmp_path, THREADS_SCRIPT)
    assert out["cold"], out
    assert 1 <= out["workers"] <= min(2, os.cpu_count() or 1), out
    assert out["paused_cold"] and out["taken_over"], out
    assert out["errors"] == [] and out["close"], out


def test_no_worker_when_fork_fails(monkeypatch, tmp_path):
    """A fork refused (a limit on processes or memory: EAGAIN, ENOMEM) forks no worker: the
    kernels compile at their first calls, as without workers, instead of the run failing."""
    import errno

    from pdjit.codegen import compiler

    class Job:  # a compile job whose compile costs nothing
        def __init__(self, i):
            self.name, self.parallel, self.cost = f"job{i}", False, 0.0
            self.affinity = ("own", self.name)
            self.fn = type("Fn", (), {"overloads": {}, "_cache": None,
                                      "compile": lambda self, sig: None})()

    def no_fork():
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(compiler.threading, "active_count", lambda: 1)
    monkeypatch.setenv("PDJIT_COMPILE_WORKERS", "1")
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path))
    jobs = [(Job(i), [("float32", 1)]) for i in range(4)]
    assert compiler.precompile(jobs) == 0
    with compiler.compile_later() as later:
        compiler.precompile(jobs)
    assert later.pids == [] and later.done()


SHARED_SCRIPT = textwrap.dedent("""
    import json, os, time
    import numpy as np
    import pdjit as fluid
    from pdjit.codegen import compiler

    def planned(exe, program):
        return any(p is program for p, _ in exe._plans.values())

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[5], dtype="float32")
        y = fluid.layers.fc(fluid.layers.fc(x, 9, act="tanh"), 2, act="sigmoid")
    scope = fluid.Scope()
    fluid.Executor(cold_runs="compile").run(startup, scope=scope)
    feed = {"x": np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)}
    first, second = fluid.Executor(cold_runs="Reference"), fluid.Executor()
    a = first.run(main, feed=feed, fetch_list=[y], scope=scope)[0]
    b = second.run(main, feed=feed, fetch_list=[y], scope=scope)[0]
    out = {"cold": [not planned(first, main), not planned(second, main)],
           "workers": sum(len(bg.pids) for bg in compiler._background),
           "equal": bool(np.array_equal(a, b))}
    t_end = time.monotonic() + 120
    while not (planned(first, main) and planned(second, main)) and time.monotonic() < t_end:
        for e in (first, second):
            e.run(main, feed=feed, fetch_list=[y], scope=scope)
        time.sleep(0.02)
    c = second.run(main, feed=feed, fetch_list=[y], scope=scope)[0]
    out["taken_over"] = [planned(first, main), planned(second, main)]
    out["close"] = bool(np.allclose(a, c, rtol=1e-5))
    print("RESULT " + json.dumps(out))
""")


def test_a_second_executor_waits_for_the_workers_already_compiling_its_kernels(tmp_path):
    """Two executors on one program in a cold cache: the second forks no workers of its own
    (the first's compile its kernels; ``cold_runs`` in any case); both interpret until those
    are done, then run their compiled plans."""
    out = _run(tmp_path, SHARED_SCRIPT)
    assert out["cold"] == [True, True] and out["equal"], out
    assert 1 <= out["workers"] <= 2, out
    assert out["taken_over"] == [True, True] and out["close"], out


STAND_IN_SCRIPT = textwrap.dedent("""
    import json, os, time
    import numpy as np
    import pdjit as fluid
    from pdjit.codegen import compiler
    from pdjit.codegen.cpu.lib import conv
    from pdjit.runtime import executor as executor_mod

    executor_mod.COLD_RUN_VALUES = 0  # (every program too large to interpret: stand-ins)
    os.environ["PDJIT_COMPILE_WORKERS"] = "1"  # (a worker whatever the machine's load)
    calls = [0]
    numpy_taps = conv._taps_numpy
    def counted(*args):
        calls[0] += 1
        numpy_taps(*args)
    conv._taps_numpy = counted
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[3, 20, 20], dtype="float32")
        y = fluid.layers.conv2d(x, 16, 5, stride=2, padding=2, act="relu")
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((2, 3, 20, 20)).astype(np.float32)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    w = np.array(scope.find_var("conv2d_0.w_0").value, np.float64)
    b = np.array(scope.find_var("conv2d_0.b_0").value, np.float64)
    xp = np.pad(xv.astype(np.float64), ((0, 0), (0, 0), (2, 2), (2, 2)))
    want = np.zeros((2, 16, 10, 10))
    for i in range(5):
        for j in range(5):
            want += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + 20:2, j:j + 20:2], w[:, :, i, j])
    want = np.maximum(want + b.reshape(1, -1, 1, 1), 0)
    out = {"runs": []}
    t_end = time.monotonic() + 120
    while time.monotonic() < t_end:
        (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        out["runs"].append([calls[0], compiler.compiling(conv._taps_range),
                            len(conv._taps_range.overloads),
                            float(np.abs(got - want).max() / np.abs(want).max())])
        if not compiler.compiling(conv._taps_range) and len(out["runs"]) > 1:
            (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
            out["after"] = [calls[0], len(conv._taps_range.overloads),
                            float(np.abs(got - want).max() / np.abs(want).max())]
            break
        time.sleep(0.05)
    print("RESULT " + json.dumps(out))
""")


def test_large_program_runs_stand_ins_while_a_worker_compiles(tmp_path):
    """A program too large for the references (``COLD_RUN_VALUES`` set to 0) plans at once,
    but the taps kernel of its convolution is left to a worker forked beside its runs
    (``compiler.stand_ins``): the first runs take its NumPy stand-in (``conv._taps_numpy``),
    then, the worker done, the kernel loaded from the disk cache; both against NumPy written
    in the script."""
    out = _run(tmp_path, STAND_IN_SCRIPT)
    runs = out["runs"]
    assert runs[0][:3] == [1, True, 0], runs  # the first run: the stand-in, the worker busy
    assert all(r[3] < 1e-5 for r in runs), runs
    calls, loaded, err = out["after"]  # the worker done: the kernel itself, no stand-in more
    assert calls == runs[-1][0] and loaded == 1 and err < 1e-5, out
