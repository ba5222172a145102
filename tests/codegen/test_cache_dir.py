"""One cache directory holds everything pdjit compiles: generated and library kernels.

A directory copied elsewhere (new paths, new file times) is reused without compiling;
``NUMBA_CACHE_DIR`` and the package's own directory receive nothing; ``clear_cache()`` empties
all of it, the library kernels' code included.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pdjit

SCRIPT = textwrap.dedent("""
    import json, os, pathlib, sys
    import numpy as np
    import pdjit as fluid
    from numba.core.dispatcher import Dispatcher
    from pdjit.codegen import compiler
    from numba.core.registry import cpu_target
    from numba.core.runtime import nrtdynmod
    refreshes, runtime_compiles = [], []
    ctx = cpu_target.target_context
    ctx.refresh = lambda f=ctx.refresh: refreshes.append(1) or f()
    nrtdynmod.create_nrt_module = (
        lambda c, f=nrtdynmod.create_nrt_module: runtime_compiles.append(1) or f(c))
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[2, 4, 4], dtype="float32")
        y = fluid.layers.pool2d(fluid.layers.sigmoid(x), pool_size=2, pool_type="max",
                                pool_stride=2)
    xv = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 2, 4, 4)
    (out,) = fluid.Executor().run(main, feed={"x": xv}, fetch_list=[y], scope=fluid.Scope())
    lib = {"compiled": 0, "loaded": 0}
    for name, mod in list(sys.modules.items()):
        if name.startswith(("pdjit.codegen.cpu.lib", "pdjit.codegen.cpu.mathfuncs")):
            for fn in vars(mod).values():
                if isinstance(fn, Dispatcher):
                    lib["compiled"] += sum(fn.stats.cache_misses.values())
                    lib["loaded"] += sum(fn.stats.cache_hits.values())
    d = compiler.cache_dir()
    files = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    gen = compiler.kernel_stats()
    if sys.argv[1] == "clear":
        fluid.clear_cache()
    left = sorted(str(p) for p in d.rglob("*")) if d.exists() else []
    print(json.dumps({"out": out.tolist(), "gen": gen, "lib": lib, "refreshes": len(refreshes),
                      "runtime_compiles": len(runtime_compiles), "files": files, "left": left}))
""")


def _run(cache: pathlib.Path, numba_dir: pathlib.Path, what: str = "keep") -> dict:
    env = dict(os.environ, PDJIT_CACHE_DIR=str(cache), NUMBA_CACHE_DIR=str(numba_dir),
               PDJIT_COMPILE_WORKERS="0", PDJIT_STRICT="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, what], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _package_cache_files() -> set:
    pkg = pathlib.Path(pdjit.__file__).parent
    return {p for pat in ("*.nbi", "*.nbc") for p in pkg.rglob(pat)}


def test_a_copied_cache_is_reused_and_clear_cache_empties_all_of_it(tmp_path):
    before, t0 = _package_cache_files(), time.time()
    xv = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 2, 4, 4)
    s = 1 / (1 + np.exp(-xv))
    want = s.reshape(2, 2, 2, 2, 2, 2).max(axis=(3, 5))
    first = _run(tmp_path / "a", tmp_path / "numba")
    np.testing.assert_allclose(first["out"], want, rtol=1e-6)
    assert first["gen"]["compiled"] >= 1 and first["lib"]["compiled"] >= 1, first
    assert any(f.startswith("lib/") and f.endswith(".nbi") for f in first["files"]), first
    # nothing of pdjit's went where Numba would have put it
    assert not (tmp_path / "numba").exists() or not list((tmp_path / "numba").rglob("*.nb*"))
    assert not {p for p in _package_cache_files() - before if p.stat().st_mtime >= t0}
    # copied elsewhere (every path and every file time new), and the original removed
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copyfile)
    shutil.rmtree(tmp_path / "a")
    again = _run(tmp_path / "b", tmp_path / "numba", "clear")
    assert again["out"] == first["out"]
    assert again["gen"]["compiled"] == 0 and again["gen"]["loaded"] >= 1, again
    assert again["lib"]["compiled"] == 0 and again["lib"]["loaded"] >= 1, again
    # loading compiled code does not refresh Numba's target context (~0.5 s: every registry
    # of Numba's implementations imported and installed); compiling does
    assert first["refreshes"] >= 1 and again["refreshes"] == 0, (first, again)
    # Numba's runtime functions too: compiled by the first process, read back by the next
    assert any(f.startswith("lib/") and "/runtime-" in f for f in first["files"]), first
    assert first["runtime_compiles"] == 1 and again["runtime_compiles"] == 0, (first, again)
    assert again["files"] == first["files"]
    assert again["left"] == [], again["left"]      # clear_cache(): nothing left, library too
    assert not (tmp_path / "b").exists()


WARMUP = textwrap.dedent("""
    import os, sys
    from pdjit import cli
    from pdjit.codegen.cpu import lib as nnlib
    from pdjit.codegen.cpu import mathfuncs
    keep = {"untile_nd": nnlib.JOBS["untile_nd"]}   # one cheap entry point of the library
    nnlib.JOBS.clear()
    nnlib.JOBS.update(keep)
    mathfuncs.__all__ = ["exp"]                     # and one math function
    code = cli.main(["warmup", "--dtype", "float32", "--no-programs", *sys.argv[1:]])
    print("policy", os.sched_getscheduler(0) == os.SCHED_IDLE)
    raise SystemExit(code)
""")


def test_warmup_compiles_the_library_into_the_cache_once(tmp_path):
    env = dict(os.environ, PDJIT_CACHE_DIR=str(tmp_path), PDJIT_COMPILE_WORKERS="0")
    outs = []
    for extra in (["--background"], []):
        proc = subprocess.run([sys.executable, "-c", WARMUP, *extra], capture_output=True,
                              text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert "2 compiled, 0 already cached" in outs[0], outs[0]
    assert "0 compiled, 2 already cached" in outs[1], outs[1]   # a new process: from disk
    if hasattr(os, "SCHED_IDLE"):  # --background: on idle cores only
        assert "policy True" in outs[0] and "policy False" in outs[1], outs
    (lib,) = (tmp_path / "lib").iterdir()
    assert (lib / ".warmup-started").exists() and (lib / ".warmup-done").exists()
    assert str(tmp_path / "lib") + os.sep in outs[0]
    assert list((tmp_path / "lib").glob("*/indexing.*.nbi"))
    assert list((tmp_path / "lib").glob("*/mathfuncs._exp_f32*.nbi"))
    assert list((tmp_path / "lib").glob("*/runtime-*.pickle"))  # Numba's runtime functions


def test_a_damaged_runtime_file_is_compiled_again(tmp_path):
    """The library folder's copy of Numba's runtime functions, damaged, is compiled anew
    (not loaded, not a crash), and the next process reads the new copy back."""
    env = dict(os.environ, PDJIT_CACHE_DIR=str(tmp_path), PDJIT_COMPILE_WORKERS="0",
               PDJIT_AUTO_WARMUP="0")
    script = textwrap.dedent("""
        import numpy as np
        from numba.core.runtime import nrtdynmod
        from pdjit.codegen.cpu.lib import indexing
        calls = []
        nrtdynmod.create_nrt_module = (
            lambda c, f=nrtdynmod.create_nrt_module: calls.append(1) or f(c))
        dx = np.full(3, np.nan, np.float32)   # (a cheap library kernel)
        indexing.untile_nd(np.arange(6, dtype=np.float32), np.array([3]), dx, np.array([6]))
        assert dx.tolist() == [3.0, 5.0, 7.0], dx
        print("compiles", len(calls))
    """)

    def run():
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "compiles 1" in run()
    (path,) = (tmp_path / "lib").glob("*/runtime-*.pickle")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "compiles 1" in run()     # damaged: compiled again, and saved
    assert "compiles 0" in run()     # read back



def test_warmup_refuses_a_dtype_it_cannot_compile_for(capsys):
    from pdjit import cli

    assert cli.main(["warmup", "--dtype", "int8"]) == 2
    assert "--dtype 'int8': expected float32 or float64" in capsys.readouterr().err


AUTO = textwrap.dedent("""
    import json, sys
    import numpy as np
    from pdjit.codegen import compiler, diskcache
    from pdjit.codegen.cpu import lib as nnlib
    started = []
    class FakePopen:
        def __init__(self, argv, env, **kw):
            started.append({"argv": argv[1:], "cache": env["PDJIT_CACHE_DIR"],
                            "auto": env["PDJIT_AUTO_WARMUP"], "session": kw["start_new_session"]})
    diskcache.subprocess.Popen = FakePopen
    compiler._harden_libraries()
    seen = []
    # a generated kernel that calls no library code: nothing started
    c = compiler.compile_function("def kernel(x, y):\\n    for i in range(x.size):\\n"
                                  "        y[i] = x[i] + 1\\n", "kernel")
    c.fn(np.zeros(3, np.float32), np.zeros(3, np.float32))
    seen.append(len(started))
    (fn, types), = nnlib.JOBS["untile_nd"](np.dtype("float32"))
    for dt in ("float32", "float64"):  # two library compiles: one warmup started
        fn.compile(tuple(compiler._numba_type((dt if t[0].kind == "f" else t[0], t[1]))
                         for t in types))
        seen.append(len(started))
    print(json.dumps({"seen": seen, "started": started}))
""")


def test_a_library_compile_starts_one_background_warmup_per_cache(tmp_path, monkeypatch):
    """The first library kernel a process compiles into a cold cache starts the background
    warmup (detached, that cache, no warmup of its own); a second compile, a generated kernel,
    a folder whose warmup was started before or ``PDJIT_AUTO_WARMUP=0`` start none."""
    env = dict(os.environ, PDJIT_CACHE_DIR=str(tmp_path), PDJIT_COMPILE_WORKERS="0",
               PDJIT_AUTO_WARMUP="1")
    proc = subprocess.run([sys.executable, "-c", AUTO], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    on = json.loads(proc.stdout.strip().splitlines()[-1])
    assert on["seen"] == [0, 1, 1], on
    assert on["started"] == [{"argv": ["-m", "pdjit.cli", "warmup", "--background"],
                              "cache": str(tmp_path), "auto": "0", "session": True}]
    (marker,) = tmp_path.glob("lib/*/.warmup-started")
    # here, in this process: the folder's warmup started before (its marker): none started;
    # a fresh folder with PDJIT_AUTO_WARMUP=0: none, and no marker
    from pdjit.codegen import diskcache

    started = []
    monkeypatch.setattr(diskcache, "_background", [])
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path))
    assert diskcache.library_dir() == marker.parent
    assert diskcache.start_background_warmup(popen=lambda *a, **k: started.append(a)) is None
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setenv("PDJIT_AUTO_WARMUP", "0")
    assert diskcache.start_background_warmup(popen=lambda *a, **k: started.append(a)) is None
    assert started == [] and not (tmp_path / "other").exists()
    monkeypatch.setenv("PDJIT_AUTO_WARMUP", "1")  # and with it on, one start
    assert diskcache.start_background_warmup(popen=lambda *a, **k: started.append(a) or 7) == 7
    assert len(started) == 1 and (diskcache.library_dir() / ".warmup-started").exists()


def test_warmup_programs_leave_kernels_that_programs_of_other_sizes_share():
    """The common programs' generated kernels are keyed by content, not size: a training
    step of an MLP of other widths, batch and depth built from the same layers compiles no
    generated kernel after them (the suite's cache directory: loaded or compiled here)."""
    import pdjit as fluid
    from pdjit.codegen.compiler import kernel_stats
    from pdjit.tools.warmup import warm_programs

    runs = dict(warm_programs())
    assert set(runs) == {"mlp-sgd", "mlp-momentum", "mlp-adam", "mlp-adam-predictor",
                         "mlp-softmax-adam", "mlp-softmax-adam-predictor", "cnn-adam",
                         "cnn-adam-predictor", "residual-predictor"}
    assert all(np.all(np.isfinite(v)) for v in runs.values())
    # softmax outputs: rows sum to one (an independent check that the kernels computed)
    np.testing.assert_allclose(runs["residual-predictor"].sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(runs["mlp-softmax-adam-predictor"].sum(axis=1), 1.0, rtol=1e-5)
    before = kernel_stats()
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[20], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        h = fluid.layers.fc(fluid.layers.fc(x, 32, act="relu"), 16, act="relu")
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(
            fluid.layers.fc(fluid.layers.fc(h, 16, act="tanh"), 5), label))
        fluid.optimizer.Adam(learning_rate=1e-2).minimize(loss)
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((7, 20)).astype(np.float32),
            "label": rng.integers(0, 5, (7, 1)).astype(np.int64)}
    (first,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    (second,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    assert second.item() < first.item()  # Adam's step lowered the loss
    after = kernel_stats()
    assert after["kernels"] == before["kernels"], (before, after)  # every kernel shared


def test_precompile_refreshes_numbas_registries_once_before_its_fork(monkeypatch):
    """The compile worker is forked after Numba's registries are installed here (a compile's
    first step), so it does not spend its first ~0.7 s installing them again."""
    import threading

    from numba.core.registry import cpu_target

    from pdjit.codegen import compiler

    if not hasattr(os, "fork") or threading.active_count() > 1:
        pytest.skip("no compile worker in this process (no fork, or other threads)")
    events = []

    class Job:  # a compile job whose compile costs nothing (in this process or the worker)
        def __init__(self, i):
            self.name, self.parallel, self.cost = f"job{i}", False, 0.0
            self.affinity = ("own", self.name)
            self.fn = type("Fn", (), {"overloads": {}, "_cache": None,
                                      "compile": lambda self, sig: None})()

    real_fork = os.fork
    monkeypatch.setenv("PDJIT_COMPILE_WORKERS", "1")
    monkeypatch.setattr(cpu_target.target_context, "refresh",
                        lambda: events.append("refresh"))
    monkeypatch.setattr(os, "fork", lambda: events.append("fork") or real_fork())
    taken = compiler.precompile([(Job(i), [("float32", 1)]) for i in range(4)])
    assert events == ["refresh", "fork"], events
    assert 0 <= taken <= 4


def test_precompile_keeps_the_jobs_of_one_affinity_in_one_process(monkeypatch, tmp_path):
    """Jobs that share helpers (one affinity: a library module's kernels) are compiled by one
    process, this one or the worker, never split between them (each would compile the
    helpers); the count the worker took is its share of the jobs."""
    import threading

    from pdjit.codegen import compiler

    if not hasattr(os, "fork") or threading.active_count() > 1:
        pytest.skip("no compile worker in this process (no fork, or other threads)")
    log = tmp_path / "log"

    class Job:  # a compile job that notes which process compiled it
        def __init__(self, i, affinity):
            self.name, self.parallel, self.affinity = f"job{i}", False, affinity
            self.cost = 1.0
            self.fn = type("Fn", (), {"overloads": {}, "_cache": None, "compile": lambda _, sig:
                                      time.sleep(0.02) or  # (both processes take some)
                                      log.open("a").write(f"{affinity} {os.getpid()}\n")})()

    monkeypatch.setenv("PDJIT_COMPILE_WORKERS", "1")
    jobs = [Job(i, a) for i, a in enumerate("aabbbac")]
    taken = compiler.precompile([(j, [("float32", 1)]) for j in jobs])
    rows = [line.split() for line in log.read_text().splitlines()]
    assert sorted(a for a, _ in rows) == sorted("aabbbac")
    by = {}
    for a, pid in rows:
        by.setdefault(a, set()).add(pid)
    assert all(len(pids) == 1 for pids in by.values()), by
    assert taken == sum(1 for _, pid in rows if pid != str(os.getpid()))


BLAS_SCRIPT = textwrap.dedent("""
    import json, sys
    import numba
    import numpy as np
    from pdjit.codegen import diskcache
    loaded = diskcache.load_blas_bindings()
    before = "scipy.linalg" in sys.modules

    @numba.njit
    def dot(a, b):
        return np.dot(a, b)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    got = dot(a.astype(np.float32), b.astype(np.float32))
    after_run = "scipy.linalg" in sys.modules
    import scipy.linalg
    from scipy.linalg import cython_blas
    same = cython_blas is sys.modules[diskcache.BLAS_MODULE]
    lu_ok = bool(np.allclose(scipy.linalg.lu_factor(a[:3, :3])[0].shape, (3, 3)))
    print(json.dumps({"loaded": loaded, "before": before, "after_run": after_run,
                      "err": float(np.abs(got - a @ b).max()), "same": same, "lu": lu_ok}))
""")


def test_blas_bindings_load_without_scipy_linalgs_package():
    """Numba's compiled BLAS calls find SciPy's BLAS module that pdjit loaded from its file
    alone (``scipy.linalg``'s package is not run for them); the product is right (NumPy in
    float64 the oracle), and ``scipy.linalg`` imported afterwards works and holds the same
    module."""
    proc = subprocess.run([sys.executable, "-c", BLAS_SCRIPT], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["loaded"] and not got["before"] and not got["after_run"]
    assert got["err"] < 1e-5 and got["same"] and got["lu"]
