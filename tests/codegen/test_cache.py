"""The on-disk compile cache across processes: hits, invalidation, damaged entries."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import pdjit as fluid
    from pdjit.codegen.compiler import kernel_stats
    scale, act = float(sys.argv[1]), sys.argv[2]
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        y = getattr(fluid.layers, act)(fluid.layers.scale(x, scale=scale)) * 3.0
    exe = fluid.Executor()
    (out,) = exe.run(main, feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[y],
                     scope=fluid.Scope())
    (prog, plan), = exe._plans.values()
    (kernel,) = plan.steps[0].compiled.kernels
    stats = kernel_stats()
    print(json.dumps({"hits": stats["loaded"], "misses": stats["compiled"],
                      "module": kernel.name, "out": out.tolist()}))
""")


def _run(tmp_path, scale, act="sigmoid"):
    env = dict(os.environ, PDJIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CACHE_DIR", None)   # numba's compiled code must sit beside the modules
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(scale), act], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_disk_without_compiling(tmp_path):
    first = _run(tmp_path, 2.0)
    assert first["misses"] == 1 and first["hits"] == 0
    second = _run(tmp_path, 2.0)
    assert second["misses"] == 0 and second["hits"] == 1  # no compile happened
    assert second["module"] == first["module"] and second["out"] == first["out"]
    # another constant is a run-time argument of the same kernel: nothing compiles
    rescaled = _run(tmp_path, 2.5)
    assert rescaled["module"] == first["module"] and rescaled["misses"] == 0
    assert np.allclose(rescaled["out"], 3 / (1 + np.exp(-2.5)))
    changed = _run(tmp_path, 2.0, "tanh")                  # another computation compiles
    assert changed["module"] != first["module"] and changed["misses"] == 1


def test_damaged_cache_entry_is_rebuilt_not_a_crash(tmp_path):
    first = _run(tmp_path, 1.5)
    pycache = pathlib.Path(tmp_path / "cache" / "__pycache__")
    damaged = list(pycache.glob(f"{first['module']}*.nbc"))
    assert damaged
    for f in damaged:
        f.write_bytes(f.read_bytes()[:20])                 # truncate the compiled code
    again = _run(tmp_path, 1.5)
    assert again["out"] == first["out"]
    healed = _run(tmp_path, 1.5)
    assert healed["misses"] == 0 and healed["hits"] == 1


POOL_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import pdjit as fluid
    from pdjit.codegen import compiler
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 2
    with fluid.program_guard(main, startup):
        h = fluid.layers.data(name="x", shape=[6], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        for act in ("relu", "tanh", "sigmoid", None):
            h = fluid.layers.fc(h, 6, act=act)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(
            fluid.layers.fc(h, 3), label))
        fluid.optimizer.Adam(0.01).minimize(loss)
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((4, 6)).astype(np.float32),
            "label": rng.integers(0, 3, (4, 1)).astype(np.int64)}
    losses = {}
    for mode in ("compiled", "reference"):
        exe, scope = fluid.Executor(mode=mode), fluid.Scope()
        exe.run(startup, scope=scope)
        losses[mode] = [float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0][0])
                        for _ in range(3)]
    print(json.dumps({"losses": losses, "stats": compiler.kernel_stats(),
                      "by_worker": compiler._by_worker[0]}))
""")


def _pool_run(tmp_path, workers):
    env = dict(os.environ, PDJIT_CACHE_DIR=str(tmp_path / f"cache{workers}"),
               PDJIT_COMPILE_WORKERS=str(workers))
    env.pop("NUMBA_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", POOL_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_compile_worker_shares_the_work_and_the_results_are_the_same(tmp_path):
    alone, pooled = _pool_run(tmp_path, 0), _pool_run(tmp_path, 1)
    for got in (alone, pooled):
        np.testing.assert_allclose(got["losses"]["compiled"], got["losses"]["reference"],
                                   rtol=1e-5)
    assert alone["losses"]["compiled"] == pooled["losses"]["compiled"]
    # every kernel compiled once, here or in the worker, and the worker's loaded from disk
    assert alone["stats"]["compiled"] == alone["stats"]["kernels"]
    assert pooled["stats"]["kernels"] == alone["stats"]["kernels"]
    assert pooled["stats"]["compiled"] + pooled["stats"]["loaded"] >= pooled["stats"]["kernels"]
    assert pooled["stats"]["loaded"] == 0   # nothing was on disk before: all compiled fresh
    assert alone["by_worker"] == 0 and 0 < pooled["by_worker"] < pooled["stats"]["kernels"]


TWICE = ("def twice(x, out):\n    for i in range(x.size):\n        out[i] = x[i] * 2\n"
         "    return out\n")


def test_an_entry_holding_another_signatures_code_is_recompiled(tmp_path, monkeypatch):
    """Two data files of one function swapped (what a lost race between two processes updating
    one index could leave): each loads cleanly, but holds the other signature's machine code.
    Calling it would be undefined behaviour; the cache notices and compiles again."""
    import threading

    import pytest

    from pdjit.codegen import compiler

    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path))
    barrier, got = threading.Barrier(4), []

    def ask():   # threads asking for one text at once share one module and dispatcher
        barrier.wait()
        got.append(compiler.compile_function(TWICE, "twice"))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = got[0]
    assert len(got) == 4 and all(g is c for g in got)
    a32, a64 = np.arange(5, dtype=np.float32), np.arange(5, dtype=np.float64)
    c.fn(a32, np.empty_like(a32))
    c.fn(a64, np.empty_like(a64))
    files = sorted(pathlib.Path(c.fn._cache._cache_path).glob(f"{c.name}.*.nbc"))
    assert len(files) == 2
    first, second = (f.read_bytes() for f in files)
    files[0].write_bytes(second)
    files[1].write_bytes(first)
    for table in (compiler._compiled, compiler._modules, sys.modules):  # as a new process
        table.pop(c.name, None)
    fresh = compiler.compile_function(TWICE, "twice")
    assert fresh is not c
    with pytest.warns(compiler.CacheWarning, match="holds code for"):
        out = fresh.fn(a32, np.empty_like(a32))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, a32 * 2)
    assert sum(fresh.fn.stats.cache_misses.values()) == 1       # compiled again, not loaded


def test_the_compile_worker_is_forked_only_beside_idle_cores(monkeypatch):
    """By default a worker is used on a multi-core Linux machine whose last minute's load
    average is below its number of cores, not on a saturated one; PDJIT_COMPILE_WORKERS
    decides where set."""
    from pdjit.codegen import compiler

    monkeypatch.delenv("PDJIT_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(compiler.sys, "platform", "linux")
    monkeypatch.setattr(compiler.os, "cpu_count", lambda: 2)
    for load, want in ((0.0, 1), (1.5, 1), (1.99, 1), (2.0, 0), (5.5, 0)):
        monkeypatch.setattr(compiler.os, "getloadavg", lambda v=load: (v, v, v))
        assert compiler.compile_workers() == want, load
    monkeypatch.setattr(compiler.os, "cpu_count", lambda: 1)
    monkeypatch.setattr(compiler.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert compiler.compile_workers() == 0
    monkeypatch.setattr(compiler.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("PDJIT_COMPILE_WORKERS", "1")
    monkeypatch.setattr(compiler.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert compiler.compile_workers() == 1


def test_a_targets_declared_dependencies_are_in_its_kernels_text(tmp_path, monkeypatch):
    """``Target.dependencies``: the source of each module a target's generated code calls is
    in ``deps_hash(target)``, hence in its kernels' text and cache key: editing one gives new
    kernels; another target's dependencies do not count."""
    from pdjit.codegen import compiler, target

    (tmp_path / "pdjit_dep_probe.py").write_text("K = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Probe(target.Target):
        name = "dep_probe"
        dependencies = ("pdjit_dep_probe",)

    monkeypatch.setitem(target._TARGETS, "dep_probe", Probe())
    monkeypatch.setattr(compiler, "_DEPS", {})
    first = compiler.deps_hash("dep_probe")
    assert first == compiler.deps_hash("dep_probe") != compiler.deps_hash("cpu")
    (tmp_path / "pdjit_dep_probe.py").write_text("K = 2\n")
    compiler._DEPS.clear()   # (as in a new process)
    assert compiler.deps_hash("dep_probe") != first
    # the CPU's kernels name the hash of the CPU's dependencies
    cpu = compiler.module_text("def kernel(x):\n    return x\n", "kernel")
    assert f"deps {compiler.deps_hash('cpu')[:16]};" in cpu
