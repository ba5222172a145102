"""Cold start as a new user meets it: fresh processes, caches emptied as a new user's are.

    python benchmarks/bench_coldstart.py [--models resnet50,lenet,cnn,mlp10] [--timeout 900]

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
steady latency (median of 20 after them); ONNX Runtime beside them (import, session, first
result) on the same model exported by ``pdjit.io.onnx_export``. The small CNN
(conv-bn-relu-pool x2, fc; Adam) and the 10-layer MLP of ``bench_compile.py``: the first
training step; ``jax.jit``'s first call of the same MLP step beside it. ONNX Runtime and jax
run only where installed (the ``compare`` extra).

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
    steady = []
    for _ in range(20):
        t = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[loss])
        steady.append(time.perf_counter() - t)
    return {"import_s": t_import, "load_s": t_load, "first_s": first, "first_cpu_s": first_cpu,
            "steady_ms": statistics.median(steady) * 1e3}


def child_jax_mlp() -> dict:
    t0 = time.perf_counter()
    r = _bench_compile().child_jax(10)
    return {"import_s": r["import_s"], "first_s": time.perf_counter() - t0,
            "first_cpu_s": _cpu(),
            "first_call_s": r["first_s"], "steady_ms": r["warm_ms"]}


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
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, rest = args.child[0], args.child[1:]
        fn = {"prepare": child_prepare, "predictor": child_predictor, "ort": child_ort,
              "train": child_train, "jax": child_jax_mlp}[kind]
        print(json.dumps(fn(*rest)), flush=True)
        return
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
          "within 2x+0.1 s | steady ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, who, r in rows:
        if "error" in r:
            print(f"| {m} | {who} | error: {r['error'][:300]} |")
            continue

        def f(k, d=2, r=r):
            return f"{r[k]:.{d}f}" if k in r else "-"
        ok = "-" if "next10_ok" not in r else ("yes" if r["next10_ok"] else "NO")
        print(f"| {m} | {who} | {f('import_s')} | {f('load_s')} | {f('first_s')} | "
              f"{f('first_cpu_s')} | "
              f"{f('next10_max_s', 3)} | {ok} | {f('steady_ms', 3)} |")


if __name__ == "__main__":
    main()
