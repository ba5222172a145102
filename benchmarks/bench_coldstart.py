"""Cold start as a new user meets it: fresh processes, caches emptied as a new user's are.

    python benchmarks/bench_coldstart.py [--models resnet50,lenet,cnn,mlp10] [--timeout 900]
    python benchmarks/bench_coldstart.py --paddle-models DIR [--models squeezenet,...]


Every figure is a new Python process timed from its first line (``import`` included), with
three states of pdjit's one cache directory (``PDJIT_CACHE_DIR``, which holds everything pdjit
compiles, library kernels included; ``NUMBA_CACHE_DIR`` points at an empty directory too):

- **cold**: empty, as after ``pip install`` on a new machine;
- **warmup**: after ``pdjit warmup`` (the library kernels compiled once per installation, e.g.
  in a container image; or what the background warmup that the first process compiling
  library kernels starts leaves: the benchmark's processes run with ``PDJIT_AUTO_WARMUP=0``
  so that none runs beside a measurement), the model's own kernels not;
- **warm**: what the cold run left.

Models: ResNet-50 inference (Fluid layers at its real size, batch 1 of 3x224x224, random
weights, saved with ``save_inference_model``) and LeNet-5 (the test fixture exported by
PaddlePaddle), each through the Predictor: load + first result, then the next 10 runs one by
one (each must stay within 2x the steady latency plus 0.1 s: no run waits on a compile) and the
steady latency (median of 20 once no kernel compiles beside the runs); ONNX Runtime beside
them (import, session, first result) on the same model exported by ``pdjit.io.onnx_export``.
The small CNN (conv-bn-relu-pool x2, fc; Adam) and the 10-layer MLP of ``bench_compile.py``:
the first training step; ``jax.jit``'s first call of the same MLP step beside it. ONNX
Runtime and jax run only where installed (the ``compare`` extra).

``--paddle-models DIR``: instead, public models exported by PaddlePaddle beforehand
(``benchmarks/export_paddle_models.py DIR``, run with paddle installed: every ``<name>.pdmodel``
there, or those of ``--models``), each through the Predictor in two processes: **cold** (empty
caches, one thread: ``set_cpu_math_library_num_threads(1)``) and **warm, 2 threads** (the cold
run's cache, two threads: what compiles again for the new thread count shows in ``compiled``).
Each: load + first result (wall, CPU), the next 10 runs (the worst as a ratio of the bar, 2x the
steady latency plus 0.1 s: at most 1 passes; beside it the same in CPU seconds of the calling
thread, which a loaded machine hardly changes but a compile in a run would), then runs until
pdjit serves the model as it will go on serving it (``Executor.settled``: no compile beside the
runs, every driver trial and thread trial over; ``settle``: the CPU seconds from the start to
then, at most ``--settle-cpu``), the steady latency (median of 20 after that), the kernels
compiled (not loaded from the disk cache) by the first result and in all, and the largest
difference from Paddle's output for the exported input (relative to its largest magnitude).

Besides wall seconds, each first result's CPU seconds (``first CPU s``: the process's own and
its waited-for children's, the compile worker's included), which hardly depend on what else
the machine runs. Python's own bytecode cache is as after ``pip install`` (which compiles it):
the children run without ``PYTHONDONTWRITEBYTECODE`` after one process has imported the
packages they use (with it set, every import compiles its source again: ~0.3 s more per
process).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
LENET = HERE.parent / "tests" / "fixtures" / "paddle" / "models" / "lenet"
MODELS = ("resnet50", "lenet", "cnn", "mlp10")


def _bench_compile():
    sys.path.insert(0, str(HERE))
    import bench_compile

    return bench_compile


# ---- children: each prints one JSON line ----------------------------------------------------
def _cpu() -> float:
    """CPU seconds of this process and of its children waited for (the compile worker)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ru.ru_utime + ru.ru_stime


def child_prepare(tmp: str) -> dict:
    """Save ResNet-50 as an inference model and both models as ONNX (not timed)."""
    import numpy as np

    import pdjit as fluid
    from pdjit import static
    from pdjit.io.inference_model import load_model

    main, startup, out = _bench_compile()._resnet50(fluid)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    x = main.global_block().var("x")
    static.save_inference_model(os.path.join(tmp, "resnet50"), [x], [out], exe, program=main,
                                scope=scope)
    np.save(os.path.join(tmp, "x_resnet50.npy"),
            np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    np.save(os.path.join(tmp, "x_lenet.npy"),
            np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32))
    onnx = {}
    if importlib.util.find_spec("onnx") is not None:
        from pdjit.io.onnx_export import to_onnx

        for name, path in (("resnet50", os.path.join(tmp, "resnet50")), ("lenet", str(LENET))):
            m = load_model(path)
            with open(os.path.join(tmp, f"{name}.onnx"), "wb") as f:
                f.write(to_onnx(m.program, m.params, m.feed_names, m.fetch_names))
            onnx[name] = True
    return {"onnx": onnx}


def child_predictor(model: str, tmp: str) -> dict:
    t0 = time.perf_counter()
    import pdjit
    from pdjit import inference
    t_import = time.perf_counter() - t0
    import numpy as np

    path = os.path.join(tmp, "resnet50") if model == "resnet50" else str(LENET)
    x = np.load(os.path.join(tmp, f"x_{model}.npy"))
    config = inference.Config(path + ".pdmodel", path + ".pdiparams")
    pred = inference.create_predictor(config)
    t_load = time.perf_counter() - t0
    pred.run([x])
    first, first_cpu = time.perf_counter() - t0, _cpu()
    runs = []
    for _ in range(10):
        t = time.perf_counter()
        pred.run([x])
        runs.append(time.perf_counter() - t)
    from pdjit.codegen import compiler

    t = time.perf_counter()  # (the steady speed: once no kernel compiles beside the runs)
    while compiler.compiling_beside() and time.perf_counter() - t < 120:
        pred.run([x])
    for _ in range(5):
        pred.run([x])
    steady = []
    for _ in range(20):
        t = time.perf_counter()
        pred.run([x])
        steady.append(time.perf_counter() - t)
    st = statistics.median(steady)
    assert pdjit is not None
    return {"import_s": t_import, "load_s": t_load, "first_s": first, "first_cpu_s": first_cpu,
            "next10_max_s": max(runs), "steady_ms": st * 1e3,
            "next10_ok": all(r <= 2 * st + 0.1 for r in runs)}


def _tiers(exe):
    """The driver tiers of every native step of the executor's plans."""
    out = []
    for _, plan in exe._plans.values():
        for step in plan.walk():
            t = getattr(step, "tiers", None)
            if t is not None:
                out.append(t)
    return out


def child_paddle(name: str, directory: str, nthreads: str, settle_cpu: str) -> dict:
    t0 = time.perf_counter()
    import pdjit
    from pdjit import inference
    from pdjit.codegen import compiler
    t_import = time.perf_counter() - t0
    import numpy as np

    io = np.load(os.path.join(directory, f"{name}_io.npz"))
    x, want = io["x"], io["y"]
    path = os.path.join(directory, name)
    config = inference.Config(path + ".pdmodel", path + ".pdiparams")
    config.set_cpu_math_library_num_threads(int(nthreads))
    pred = inference.create_predictor(config)
    t_load = time.perf_counter() - t0
    got = pred.run([x])[0]  # (the first output: the one saved; GoogLeNet has two more)
    first, first_cpu = time.perf_counter() - t0, _cpu()
    compiled_first = compiler.kernel_stats()["compiled"]
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    runs, runs_cpu = [], []  # wall, and CPU of this thread (a compile in a run shows there)
    for _ in range(10):
        t, c = time.perf_counter(), time.thread_time()
        pred.run([x])
        runs.append(time.perf_counter() - t)
        runs_cpu.append(time.thread_time() - c)
    exe, batch = pred._exe, x.shape[0]
    n_settle, settled = 0, exe.settled(batch)
    while not settled and _cpu() < float(settle_cpu):
        pred.run([x])
        n_settle += 1
        settled = exe.settled(batch)
        if not settled and n_settle % 50 == 0:
            time.sleep(0.05)  # (a tier-up thread's compile, not only runs)
    settle_s, settle_cpu_s = time.perf_counter() - t0, _cpu()
    steady, steady_cpu = [], []
    for _ in range(20):
        t, c = time.perf_counter(), time.thread_time()
        pred.run([x])
        steady.append(time.perf_counter() - t)
        steady_cpu.append(time.thread_time() - c)
    st, st_cpu = statistics.median(steady), statistics.median(steady_cpu)
    tiers = _tiers(exe)
    assert pdjit is not None
    return {"import_s": t_import, "load_s": t_load, "first_s": first, "first_cpu_s": first_cpu,
            "next10_max_s": max(runs), "steady_ms": st * 1e3,
            "next10_ratio": max(r / (2 * st + 0.1) for r in runs),
            "next10_ok": all(r <= 2 * st + 0.1 for r in runs),
            "next10_cpu_ratio": max(r / (2 * st_cpu + 0.1) for r in runs_cpu),
            "steady_cpu_ms": st_cpu * 1e3,
            "settled": settled, "settle_s": settle_s, "settle_cpu_s": settle_cpu_s,
            "settle_runs": n_settle, "compiled_first": compiled_first,
            "compiled": compiler.kernel_stats()["compiled"], "rel_err": err,
            "native_steps": sum(t.native_driver is not None for t in tiers), "steps": len(tiers),
            "given_up": sorted({(t.native_failed or "")[:60] for t in tiers} - {""})}


def child_ort(model: str, tmp: str) -> dict:
    t0 = time.perf_counter()
    import numpy as np
    import onnxruntime as ort
    t_import = time.perf_counter() - t0
    sess = ort.InferenceSession(os.path.join(tmp, f"{model}.onnx"),
                                providers=["CPUExecutionProvider"])
    t_session = time.perf_counter() - t0
    x = np.load(os.path.join(tmp, f"x_{model}.npy"))
    name = sess.get_inputs()[0].name
    sess.run(None, {name: x})
    first, first_cpu = time.perf_counter() - t0, _cpu()
    steady = []
    for _ in range(20):
        t = time.perf_counter()
        sess.run(None, {name: x})
        steady.append(time.perf_counter() - t)
    return {"import_s": t_import, "load_s": t_session, "first_s": first, "first_cpu_s": first_cpu,
            "steady_ms": statistics.median(steady) * 1e3}


def child_train(model: str) -> dict:
    t0 = time.perf_counter()
    import pdjit as fluid
    t_import = time.perf_counter() - t0
    import numpy as np

    bc = _bench_compile()
    rng = np.random.default_rng(0)
    if model == "cnn":
        main, startup, loss = bc._small_cnn(fluid)
        feed = {"x": rng.standard_normal((bc.BATCH, 1, 28, 28)).astype(np.float32),
                "label": rng.integers(0, bc.CLASSES, (bc.BATCH, 1)).astype(np.int64)}
    else:
        main, startup, loss = bc._mlp(fluid, 10)
        feed = {"x": rng.standard_normal((bc.BATCH, bc.WIDTH)).astype(np.float32),
                "label": rng.integers(0, bc.CLASSES, (bc.BATCH, 1)).astype(np.int64)}
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    t_load = time.perf_counter() - t0
    exe.run(main, feed=feed, fetch_list=[loss])
    first, first_cpu = time.perf_counter() - t0, _cpu()
    # the steps the references serve while the kernels compile in forked workers (a small
    # program in a cold cache: Executor's cold_runs), until the compiled plan takes over
    interpreted, deadline = 0, time.monotonic() + 600
    while not any(p is main for p, _ in exe._plans.values()) and time.monotonic() < deadline:
        exe.run(main, feed=feed, fetch_list=[loss])
        interpreted += 1
    compiled_s = time.perf_counter() - t0
    steady = []
    for _ in range(20):
        t = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[loss])
        steady.append(time.perf_counter() - t)
    return {"import_s": t_import, "load_s": t_load, "first_s": first, "first_cpu_s": first_cpu,
            "steady_ms": statistics.median(steady) * 1e3, "interpreted": interpreted,
            "compiled_s": compiled_s}


def child_jax_mlp() -> dict:
    t0 = time.perf_counter()
    r = _bench_compile().child_jax(10)
    return {"import_s": r["import_s"], "first_s": time.perf_counter() - t0,
            "first_cpu_s": _cpu(),
            "first_call_s": r["first_s"], "steady_ms": r["warm_ms"]}


def paddle_models(args) -> None:
    d = pathlib.Path(args.paddle_models).resolve()
    names = sorted(p.stem for p in d.glob("*.pdmodel"))
    if args.models != ",".join(MODELS):
        names = [m for m in args.models.split(",") if m]
    base = {**{k: v for k, v in os.environ.items()
               if not k.startswith(("PDJIT_CACHE", "NUMBA_CACHE"))
               and k != "PYTHONDONTWRITEBYTECODE"}, "PDJIT_AUTO_WARMUP": "0"}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pdjit-bench-paddle-"))
    print("| model | process | load avg | first result s (CPU) | next 10: worst s, / bar "
          "(CPU / bar) | steady ms (CPU) | settled s (CPU) | compiled first/all | "
          "native steps | rel err |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    try:
        for m in names:
            env = {**base, "PDJIT_CACHE_DIR": str(tmp / f"cache-{m}"),
                   "NUMBA_CACHE_DIR": str(tmp / f"numba-{m}")}
            for who, nthreads in (("cold, 1 thread", 1), ("warm, 2 threads", 2)):
                load = os.getloadavg()[0]
                r = spawn(["paddle", m, str(d), str(nthreads), str(args.settle_cpu)], env,
                          args.timeout)
                if "error" in r:
                    print(f"| {m} | {who} | {load:.2f} | error: {r['error'][:300]} |",
                          flush=True)
                    continue
                settle = f"{r['settle_s']:.1f} ({r['settle_cpu_s']:.1f})" + \
                    ("" if r["settled"] else " NOT settled")
                given = f"; given up: {r['given_up']}" if r["given_up"] else ""
                print(f"| {m} | {who} | {load:.2f} | {r['first_s']:.1f} "
                      f"({r['first_cpu_s']:.1f}) | {r['next10_max_s']:.3f}, "
                      f"{r['next10_ratio']:.2f} ({r['next10_cpu_ratio']:.2f}) | "
                      f"{r['steady_ms']:.1f} ({r['steady_cpu_ms']:.1f}) | {settle} | "
                      f"{r['compiled_first']}/{r['compiled']} | "
                      f"{r['native_steps']}/{r['steps']}{given} | {r['rel_err']:.1e} |",
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- the parent --------------------------------------------------------------------------------
def spawn(args: list, env: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", *args]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{args}: > {timeout:g} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"error": f"{args} exited {p.returncode}: " +
                " | ".join(p.stderr.strip().splitlines()[-5:])}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=",".join(MODELS))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--paddle-models", metavar="DIR",
                    help="models exported by export_paddle_models.py (see the docstring)")
    ap.add_argument("--settle-cpu", type=float, default=120,
                    help="--paddle-models: CPU seconds a process may run until settled")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, rest = args.child[0], args.child[1:]
        fn = {"prepare": child_prepare, "predictor": child_predictor, "ort": child_ort,
              "paddle": child_paddle,
              "train": child_train, "jax": child_jax_mlp}[kind]
        print(json.dumps(fn(*rest)), flush=True)
        return
    if args.paddle_models:
        return paddle_models(args)
    models = [m for m in args.models.split(",") if m]
    # no background warmup from the cold runs (it would run on beside the next measurement):
    # the "warmup" state is what it leaves
    base = {**{k: v for k, v in os.environ.items()
               if not k.startswith(("PDJIT_CACHE", "NUMBA_CACHE", "JAX_COMPILATION"))
               and k != "PYTHONDONTWRITEBYTECODE"},
            "PDJIT_AUTO_WARMUP": "0"}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pdjit-bench-coldstart-"))
    # Python's bytecode cache as an installed package has it (see the module's docstring)
    prime = ["numpy", "pdjit", "pdjit.ops", "pdjit.inference", "pdjit.codegen.compiler",
             "pdjit.codegen.cpu.lib", "scipy.linalg", "onnx", "onnxruntime", "jax"]
    subprocess.run([sys.executable, "-c", "import importlib.util\n"
                    f"for m in {prime!r}:\n"
                    "    if importlib.util.find_spec(m.split('.')[0]) is not None:\n"
                    "        __import__(m)\n"],
                   env={**base, "PDJIT_CACHE_DIR": str(tmp / "prime-cache")}, capture_output=True)
    load0 = os.getloadavg()
    rows = []
    try:
        prep_env = {**base, "PDJIT_CACHE_DIR": str(tmp / "prep-cache"),
                    "NUMBA_CACHE_DIR": str(tmp / "prep-numba")}
        prep = spawn(["prepare", str(tmp)], prep_env, args.timeout)
        if "error" in prep:
            raise SystemExit(f"preparing the models failed: {prep['error']}")
        warmed = tmp / "warmed"
        t = time.perf_counter()
        w = subprocess.run([sys.executable, "-m", "pdjit.cli", "warmup"], capture_output=True,
                           text=True, env={**base, "PDJIT_CACHE_DIR": str(warmed),
                                           "NUMBA_CACHE_DIR": str(tmp / "numba-w")})
        print(f"pdjit warmup: {time.perf_counter() - t:.1f} s wall: {w.stdout.strip()}")
        for m in models:
            cache = tmp / f"cache-{m}"
            after_warmup = tmp / f"warmup-{m}"
            shutil.copytree(warmed, after_warmup)
            kind = ["predictor", m, str(tmp)] if m in ("resnet50", "lenet") else ["train", m]
            for state, d in (("cold", cache), ("warmup", after_warmup), ("warm", cache)):
                env = {**base, "PDJIT_CACHE_DIR": str(d),
                       "NUMBA_CACHE_DIR": str(tmp / f"numba-{m}-{state}")}
                rows.append((m, f"pdjit, {state}", spawn(kind, env, args.timeout)))
            if m in prep["onnx"] and importlib.util.find_spec("onnxruntime") is not None:
                rows.append((m, "ONNX Runtime", spawn(["ort", m, str(tmp)], base,
                                                       args.timeout)))
            if m == "mlp10" and importlib.util.find_spec("jax") is not None:
                rows.append((m, "jax.jit", spawn(["jax"], {**base, "JAX_PLATFORMS": "cpu"},
                                                 args.timeout)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()
    print(f"\n## cold start, fresh processes ({os.cpu_count()} CPUs; load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after)")
    print("| model | run | import s | load s | first result s | first CPU s | next 10 max s | "
          "within 2x+0.1 s | steady ms | interpreted runs, compiled plan at s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, who, r in rows:
        if "error" in r:
            print(f"| {m} | {who} | error: {r['error'][:300]} |")
            continue

        def f(k, d=2, r=r):
            return f"{r[k]:.{d}f}" if k in r else "-"
        ok = "-" if "next10_ok" not in r else ("yes" if r["next10_ok"] else "NO")
        print(f"| {m} | {who} | {f('import_s')} | {f('load_s')} | {f('first_s')} | "
              f"{f('first_cpu_s')} | "
              f"{f('next10_max_s', 3)} | {ok} | {f('steady_ms', 3)} | "
              f"{r.get('interpreted', '-')}, {f('compiled_s')} |")


if __name__ == "__main__":
    main()
