"""Cold compile time: the first training step of a deep MLP, pdjit against jax.jit.

    python benchmarks/bench_compile.py [--n 10,30,100] [--no-jax] [--no-pdjit] [--timeout 900]
    python benchmarks/bench_compile.py --breakdown [--models cnn,resnet50,mlp10]

``--breakdown``: where a cold first result's time goes, for the small CNN (conv-bn-relu-pool
x2, fc; Adam; first training step, batch 32 of 1x28x28), ResNet-50 inference (Fluid layers at
its real size, batch 1 of 3x224x224) and the 10-layer MLP below (first training step). Each
model runs in a fresh process twice: with empty caches (a new PDJIT_CACHE_DIR and
NUMBA_CACHE_DIR, Numba cache files under the installed package deleted) and again with the
caches that run left. The compile worker is off (PDJIT_COMPILE_WORKERS=0) so that every
compile happens in the measured process: the parts are `import pdjit`, building the program
(layers, startup run), plan building (``Plan.compile_seconds``: lowering, no Numba), Numba's
time per dispatcher (its own time, nested compiles counted where they happen) split into
library kernels (``pdjit.codegen.cpu.lib``, ``mathfuncs``), generated kernels (one row each) and
loads from the disk cache, and the rest of the first run (Python, the kernels themselves).

The model: N fc layers of width 64 (input width 64; activations relu, tanh, sigmoid, none in
turn; after every third layer h = h + scale(h, 0.5)), an fc to 10 classes, softmax cross
entropy, mean, Adam(1e-3); batch 32 of fixed random float32 data. Each measurement runs in a
fresh process with empty caches (PDJIT_CACHE_DIR, NUMBA_CACHE_DIR new temp dirs; Numba cache
files left in the installed pdjit package are deleted first). It times `import pdjit`, the
first exe.run of the main program (lowering + Numba compilation; its wall time and its CPU time,
this process's and its compile worker's: the CPU time hardly depends on what else the machine
runs; a program this small runs its first runs on the ops' references while forked workers
compile its kernels, see ``Executor(cold_runs=...)``: then the first run's CPU time is the
process's own) and the median of 20 warm runs once the compiled plan took over;
jax: the first call of a jitted step (trace + XLA compile, JAX_PLATFORMS=cpu) and 20 warm calls.
Last, N+2 layers (N=10 when in the list, else the smallest N) in a fresh process that reuses
the N-layer run's caches: how much compiled code a slightly different program loads.
"""
from __future__ import annotations

import argparse
import importlib.metadata
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

ACTS = ["relu", "tanh", "sigmoid", None]
WARM = 20  # warm steps after the first: their median is the warm time
WIDTH, CLASSES, BATCH = 64, 10, 32


def data(np):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((BATCH, WIDTH)).astype(np.float32),
            rng.integers(0, CLASSES, (BATCH, 1)).astype(np.int64))


def child_pdjit(n: int) -> dict:
    t = time.perf_counter()
    import pdjit as fluid
    t_import = time.perf_counter() - t
    import numpy as np

    main, startup, loss = _mlp(fluid, n)
    xv, yv = data(np)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    feed = {"x": xv, "label": yv}
    cpu = _cpu_s()
    t = time.perf_counter()
    exe.run(main, feed=feed, fetch_list=[loss])
    times = [time.perf_counter() - t]
    cpu = _cpu_s() - cpu
    # the runs the references serve while the plan's kernels compile (a small program in a
    # cold cache: Executor's cold_runs), until the compiled plan takes over
    interpreted, deadline = 0, time.monotonic() + 600
    while not any(p is main for p, _ in exe._plans.values()) and time.monotonic() < deadline:
        exe.run(main, feed=feed, fetch_list=[loss])
        interpreted += 1
    for _ in range(WARM):
        t = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[loss])
        times.append(time.perf_counter() - t)
    from pdjit.codegen import compiler
    stats = compiler.kernel_stats() if hasattr(compiler, "kernel_stats") else None
    return {"n": n, "ops": len(main.global_block().ops), "import_s": t_import,
            "first_s": times[0], "first_cpu_s": cpu,
            "warm_ms": statistics.median(times[1:]) * 1e3, "kernel_stats": stats,
            "interpreted_runs": interpreted}


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that ended (a compile worker)."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def child_jax(n: int) -> dict:
    t = time.perf_counter()
    import jax
    import jax.numpy as jnp
    t_import = time.perf_counter() - t
    import numpy as np

    rng = np.random.default_rng(1)
    sizes = [WIDTH] * (n + 1) + [CLASSES]
    params = [(jnp.asarray(rng.uniform(-1, 1, (a, b)).astype(np.float32) * np.sqrt(6 / (a + b))),
               jnp.zeros(b, jnp.float32)) for a, b in zip(sizes[:-1], sizes[1:])]
    acts = {"relu": jax.nn.relu, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, None: lambda h: h}

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params[:-1]):
            h = acts[ACTS[i % 4]](h @ w + b)
            if i % 3 == 2:
                h = h + 0.5 * h
        w, b = params[-1]
        logp = jax.nn.log_softmax(h @ w + b)
        return -jnp.mean(jnp.take_along_axis(logp, y, axis=1))

    @jax.jit
    def step(params, state, x, y):  # Adam as Paddle's adam op does it
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        m, v, b1p, b2p = state
        lr_t = 1e-3 * jnp.sqrt(1 - b2p) / (1 - b1p)
        tm = jax.tree_util.tree_map
        m = tm(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = tm(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        params = tm(lambda p, m, v: p - lr_t * m / (jnp.sqrt(v) + 1e-8 * jnp.sqrt(1 - b2p)),
                    params, m, v)
        return params, (m, v, b1p * 0.9, b2p * 0.999), loss

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    state = (zeros, zeros, jnp.float32(0.9), jnp.float32(0.999))
    xv, yv = data(np)
    x, y = jnp.asarray(xv), jnp.asarray(yv.astype(np.int32))
    times = []
    for _ in range(1 + WARM):
        t = time.perf_counter()
        params, state, loss = step(params, state, x, y)
        loss.block_until_ready()
        times.append(time.perf_counter() - t)
    return {"n": n, "import_s": t_import, "first_s": times[0],
            "warm_ms": statistics.median(times[1:]) * 1e3}


# ---- --breakdown -------------------------------------------------------------------------------
class _NumbaTimes:
    """Numba's time per dispatcher in this process: each ``Dispatcher.compile`` call's own
    time (its nested compiles subtracted), as a compile (a cache miss) or a disk-cache load."""

    def __init__(self):
        from numba.core import dispatcher

        self.rows: dict = {}   # (kind, name) -> [seconds, count]
        self._stack: list = []
        original = dispatcher.Dispatcher.compile
        times = self

        def compile(disp, sig):  # noqa: A001 - Numba's name
            misses = sum(disp._cache_misses.values())
            hits = sum(disp._cache_hits.values())
            times._stack.append(0.0)
            t = time.perf_counter()
            try:
                return original(disp, sig)
            finally:
                total = time.perf_counter() - t
                nested = times._stack.pop()
                if times._stack:
                    times._stack[-1] += total
                how = "compile" if sum(disp._cache_misses.values()) > misses else \
                    "load" if sum(disp._cache_hits.values()) > hits else None
                if how is not None:
                    mod = disp.py_func.__module__
                    kind = "generated" if mod.startswith("pdjit_gen_") else \
                        "library" if mod.startswith("pdjit.") else "other"
                    key = (how, kind, f"{mod}.{disp.py_func.__qualname__}")
                    row = times.rows.setdefault(key, [0.0, 0])
                    row[0] += total - nested
                    row[1] += 1

        dispatcher.Dispatcher.compile = compile

    def summary(self) -> dict:
        out: dict = {}
        for (how, kind, _name), (sec, n) in self.rows.items():
            agg = out.setdefault(f"{how}_{kind}_s", 0.0)
            out[f"{how}_{kind}_s"] = agg + sec
            out[f"{how}_{kind}_n"] = out.get(f"{how}_{kind}_n", 0) + n
        out["generated"] = sorted(((name.split(".", 1)[0][10:22] + "." + name.split(".")[-1],
                                    round(sec, 3)) for (how, kind, name), (sec, _) in
                                   self.rows.items() if how == "compile" and kind == "generated"),
                                  key=lambda r: -r[1])
        out["library"] = sorted(((name.replace("pdjit.codegen.", ""), round(sec, 3))
                                 for (how, kind, name), (sec, _) in self.rows.items()
                                 if how == "compile" and kind == "library"), key=lambda r: -r[1])
        return out


def _small_cnn(fluid):
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[1, 28, 28], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        h = x
        for c in (8, 16):
            h = fluid.layers.conv2d(h, num_filters=c, filter_size=3, padding=1, bias_attr=False)
            h = fluid.layers.batch_norm(h, act="relu")
            h = fluid.layers.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
        logits = fluid.layers.fc(h, CLASSES)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, label))
        fluid.optimizer.Adam(learning_rate=1e-3).minimize(loss)
    return main, startup, loss


def _resnet50(fluid):
    """ResNet-50 (bottleneck blocks 3, 4, 6, 3), inference: batch_norm with is_test."""
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1

    def conv_bn(x, c, k, stride=1, act=None):
        x = fluid.layers.conv2d(x, num_filters=c, filter_size=k, stride=stride,
                                padding=(k - 1) // 2, bias_attr=False)
        return fluid.layers.batch_norm(x, act=act, is_test=True)

    def bottleneck(x, c, stride, project):
        h = conv_bn(x, c, 1, act="relu")
        h = conv_bn(h, c, 3, stride, act="relu")
        h = conv_bn(h, c * 4, 1)
        short = conv_bn(x, c * 4, 1, stride) if project else x
        return fluid.layers.relu(fluid.layers.elementwise_add(h, short))

    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[3, 224, 224], dtype="float32")
        h = conv_bn(x, 64, 7, 2, act="relu")
        h = fluid.layers.pool2d(h, pool_size=3, pool_type="max", pool_stride=2, pool_padding=1)
        for stage, (c, n) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
            for i in range(n):
                h = bottleneck(h, c, 2 if stage and i == 0 else 1, i == 0)
        h = fluid.layers.pool2d(h, pool_type="avg", global_pooling=True)
        out = fluid.layers.fc(h, 1000, act="softmax")
    return main, startup, out


def _mlp(fluid, n):
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        h = fluid.layers.data(name="x", shape=[WIDTH], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        for i in range(n):
            h = fluid.layers.fc(h, WIDTH, act=ACTS[i % 4])
            if i % 3 == 2:
                h = h + fluid.layers.scale(h, scale=0.5)
        logits = fluid.layers.fc(h, CLASSES)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, label))
        fluid.optimizer.Adam(learning_rate=1e-3).minimize(loss)
    return main, startup, loss


BREAKDOWN_MODELS = ("cnn", "resnet50", "mlp10")


def child_breakdown(model: str) -> dict:
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    import pdjit as fluid
    t_import = time.perf_counter() - t0
    import numpy as np

    from pdjit.runtime import plan as plan_mod

    numba_times = _NumbaTimes()
    plan_seconds = []
    plan_init = plan_mod.Plan.__init__

    def record(self, steps, partition_text, sources, compile_seconds, *a, **k):
        plan_seconds.append(compile_seconds)
        plan_init(self, steps, partition_text, sources, compile_seconds, *a, **k)

    plan_mod.Plan.__init__ = record
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    if model == "cnn":
        main, startup, out = _small_cnn(fluid)
        feed = {"x": rng.standard_normal((BATCH, 1, 28, 28)).astype(np.float32),
                "label": rng.integers(0, CLASSES, (BATCH, 1)).astype(np.int64)}
    elif model == "resnet50":
        main, startup, out = _resnet50(fluid)
        feed = {"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    else:
        main, startup, out = _mlp(fluid, 10)
        feed = {"x": rng.standard_normal((BATCH, WIDTH)).astype(np.float32),
                "label": rng.integers(0, CLASSES, (BATCH, 1)).astype(np.int64)}
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    t_program = time.perf_counter() - t
    startup_plans = sum(plan_seconds)
    numba_startup = sum(s for s, _ in numba_times.rows.values())
    t = time.perf_counter()
    exe.run(main, feed=feed, fetch_list=[out])
    t_first = time.perf_counter() - t
    total = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[out])
        times.append(time.perf_counter() - t)
    s = numba_times.summary()
    numba_first = sum(sec for sec, _ in numba_times.rows.values()) - numba_startup
    plans = sum(plan_seconds) - startup_plans
    return {"model": model, "ops": len(main.global_block().ops), "import_s": t_import,
            "program_startup_s": t_program, "first_run_s": t_first,
            "plan_build_s": plans, "numba_in_first_run_s": numba_first,
            "first_run_rest_s": t_first - plans - numba_first,
            "to_first_result_s": total, "cpu_s": time.process_time() - cpu0,
            "steady_ms": min(times) * 1e3, **s}


def breakdown(args) -> None:
    models = args.models.split(",")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("JAX_COMPILATION", "PDJIT_CACHE", "NUMBA_CACHE"))}
    base["PDJIT_COMPILE_WORKERS"] = "0"
    base["PDJIT_AUTO_WARMUP"] = "0"  # no background warmup beside the measurements
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pdjit-bench-breakdown-"))
    print(f"numba {importlib.metadata.version('numba')}, {os.cpu_count()} CPUs; "
          f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    results = {}
    try:
        for m in models:
            env = {**base, "PDJIT_CACHE_DIR": str(tmp / f"pdjit-{m}"),
                   "NUMBA_CACHE_DIR": str(tmp / f"numba-{m}")}
            purge_package_cache()
            for run in ("cold", "warm"):
                results[(m, run)] = spawn("breakdown", m, env, args.timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    cols = [("import_s", "import"), ("program_startup_s", "program + startup"),
            ("plan_build_s", "plan build"), ("compile_library_s", "library compile"),
            ("compile_generated_s", "generated compile"), ("compile_other_s", "other compile"),
            ("load_library_s", "library load"), ("load_generated_s", "generated load"),
            ("first_run_rest_s", "first run rest"), ("to_first_result_s", "to first result"),
            ("cpu_s", "CPU"), ("steady_ms", "steady ms")]
    print("\n## cold start breakdown, seconds (fresh process; compile worker off)")
    print("| model | caches | " + " | ".join(c for _, c in cols) + " | compiles (lib/gen) |")
    print("|---|---|" + "---|" * len(cols) + "---|")
    for (m, run), r in results.items():
        if "error" in r:
            print(f"| {m} | {run} | error: {r['error'][:200]} |")
            continue
        cells = [f"{r.get(k, 0.0):.2f}" for k, _ in cols]
        print(f"| {m} ({r['ops']} ops) | {run} | " + " | ".join(cells) +
              f" | {r.get('compile_library_n', 0)}/{r.get('compile_generated_n', 0)} |")
    for (m, run), r in results.items():
        if run != "cold" or "error" in r:
            continue
        print(f"\n{m}, cold: library kernels compiled (own seconds): "
              + ", ".join(f"{n} {s:.2f}" for n, s in r["library"]))
        print(f"{m}, cold: generated kernels compiled (own seconds): "
              + ", ".join(f"{n} {s:.2f}" for n, s in r["generated"]))


def spawn(kind: str, n, env: dict, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--n", str(n)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{kind} N={n}: > {timeout:g} s timeout", "timeout": True}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        return {"error": f"{kind} N={n} exited {p.returncode}:\n{tail}"}
    return json.loads(lines[-1])


def purge_package_cache() -> tuple[pathlib.Path | None, int]:
    """Delete Numba cache files under the installed pdjit package, without importing it."""
    spec = importlib.util.find_spec("pdjit")
    if spec is None or not spec.submodule_search_locations:
        return None, 0
    pkg = pathlib.Path(list(spec.submodule_search_locations)[0])
    files = [f for pat in ("*.nbi", "*.nbc") for f in pkg.rglob(f"__pycache__/{pat}")]
    for f in files:
        f.unlink(missing_ok=True)
    return pkg, len(files)


def fmt(r: dict | None, key: str, digits: int) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return "> timeout" if r.get("timeout") else "error"
    return f"{r[key]:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="10,30,100", help="comma-separated layer counts")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-pdjit", action="store_true")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    ap.add_argument("--breakdown", action="store_true",
                    help="where a cold first result's time goes (see the module's docstring)")
    ap.add_argument("--models", default=",".join(BREAKDOWN_MODELS),
                    help="--breakdown's models: " + ",".join(BREAKDOWN_MODELS))
    ap.add_argument("--child", choices=["pdjit", "jax", "breakdown"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "breakdown":
        print(json.dumps(child_breakdown(args.n)), flush=True)
        return
    if args.child:
        fn = child_pdjit if args.child == "pdjit" else child_jax
        print(json.dumps(fn(int(args.n))), flush=True)
        return
    if args.breakdown:
        breakdown(args)
        return
    ns = [int(s) for s in args.n.split(",")]
    base = 10 if 10 in ns else ns[0]  # the row the others are compared with; reuse's source
    jax_ok = not args.no_jax and importlib.util.find_spec("jax") is not None
    jax_v = importlib.metadata.version("jax") if jax_ok else "not run"
    print(f"numba {importlib.metadata.version('numba')}, jax {jax_v}, {os.cpu_count()} CPUs")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION")}
    base_env["PDJIT_AUTO_WARMUP"] = "0"  # no background warmup beside the measurements
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pdjit-bench-compile-"))
    pd, jx, caches, purged, pkg = {}, {}, {}, 0, None
    try:
        for n in ns:
            if not args.no_pdjit:
                caches[n] = {"PDJIT_CACHE_DIR": str(tmp / f"pdjit-{n}"),
                             "NUMBA_CACHE_DIR": str(tmp / f"numba-{n}")}
                for d in caches[n].values():
                    os.makedirs(d)
                pkg, k = purge_package_cache()
                purged += k
                pd[n] = spawn("pdjit", n, {**base_env, **caches[n]}, args.timeout)
            if jax_ok:
                jx[n] = spawn("jax", n, {**base_env, "JAX_PLATFORMS": "cpu"}, args.timeout)
        reuse = None
        if caches:
            reuse = spawn("pdjit", base + 2, {**base_env, **caches[base]}, args.timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if pkg is not None:
        print(f"deleted {purged} Numba cache files (*.nbi, *.nbc) under {pkg} before cold runs")
    ref = pd.get(base)
    print("\n## cold first training step (fresh process, empty caches), Adam, batch 32")
    print(f"| N | ops | pdjit first s | pdjit first CPU s | jax first s | pdjit/jax | "
          f"pdjit vs N={base} | pdjit warm ms | jax warm ms | pdjit import s | "
          "pdjit kernel_stats |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        p, j = pd.get(n), jx.get(n)
        ok_p, ok_j, ok_ref = (r is not None and "error" not in r for r in (p, j, ref))
        ratio = f"{p['first_s'] / j['first_s']:.1f}x" if ok_p and ok_j else "-"
        vs = f"{p['first_s'] / ref['first_s']:.2f}x" if ok_p and ok_ref else "-"
        print(f"| {n} | {p['ops'] if ok_p else '-'} | {fmt(p, 'first_s', 2)} | "
              f"{fmt(p, 'first_cpu_s', 2) if ok_p and 'first_cpu_s' in p else '-'} | "
              f"{fmt(j, 'first_s', 2)} | {ratio} | {vs} | {fmt(p, 'warm_ms', 2)} | "
              f"{fmt(j, 'warm_ms', 2)} | {fmt(p, 'import_s', 2)} | "
              f"{p.get('kernel_stats') if ok_p else '-'} |")
    if reuse is not None:
        first = fmt(reuse, "first_s", 2) + (" s" if "error" not in reuse else "")
        print(f"\nN={base + 2} reusing the N={base} run's caches: first step {first}, "
              f"ops {reuse.get('ops', '-')}, kernel_stats {reuse.get('kernel_stats', '-')}")
    errors = [r for r in [*pd.values(), *jx.values(), reuse] if r and "error" in r]
    for r in errors:
        print(f"\n{r['error']}")


if __name__ == "__main__":
    main()
