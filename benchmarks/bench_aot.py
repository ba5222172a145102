"""A corpus model compiled ahead of time (``pdjit.aot``) against pdjit's JIT and ONNX Runtime.

    python benchmarks/bench_aot.py [--model lenet|mobilenet|...] [--repeat N] [--rounds R]
                                   [--threads N] [--processes P]

The corpus model (default LeNet: ``tests/fixtures/paddle/models/lenet``, saved by PaddlePaddle;
``mobilenet`` is the MobileNet-like one, [B, 3, 32, 32]) is compiled
into an artifact directory (build time reported), and exported to ONNX
(``pdjit.io.onnx_export.to_onnx``) for ONNX Runtime.

1. Process start to first result, each in a new process (``python -c``), median of ``--rounds``:
   the artifact through its loader (import NumPy + the loader, ``load()``, ``run``); pdjit's
   predictor with a warm kernel cache (``make_predictor`` + ``run``, as ``pdjit bench
   --startup``: the cache was filled by a run just before); ONNX Runtime (import, session,
   first run), 1 intra-op thread.
2. Latency at batch 1 and 64, in ``--rounds`` rounds: each round starts each engine in a
   process of its own (libraries in one process disturb each other, see bench_cnn.py; the
   order alternates between rounds), ``--repeat`` timed calls after warm-up, each call's wall
   and thread CPU time. pdjit's predictor at its defaults; the artifact through its Python
   loader (``model.run``: ctypes, the library writing the outputs into the arrays it returns);
   ONNX Runtime with 1 intra-op thread; and the artifact through C (a small C program timing
   ``pdjit_model_run``). Outputs are checked against pdjit's predictor. The table gives the
   best min over the rounds and the median of the rounds' medians; below it, every round's
   min / median / median CPU per contender, and the loader's own cost: its process also
   times the library's run called bare through ctypes, alternating with ``model.run``
   (loader - bare: what the loader adds; bare vs the C program: what the Python process
   costs). How to read a slow number: a round whose median is far above its min while its
   CPU time stays near the min was preempted (another process on the core); one whose CPU
   time rose with it (min too) ran slower on its core: the host was busy (other VMs, the
   neighbour's caches) when every contender of that round is slow, the contender's own code
   when only it is. The load average is printed before each table.
3. ``--processes P`` (> 1): the C timing again in P processes at each batch, each process's min,
   median and median thread CPU time (the same reading).

``--threads N`` (default 1): every contender's thread count in the latency runs: the artifact
built with ``--threads N``, ONNX Runtime's intra-op threads, pdjit's loop threads, and
OpenBLAS's (``OPENBLAS_NUM_THREADS``, for the JIT and the artifact alike).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "fixtures" / "paddle" / "models"

STARTUP = {
    "aot loader": ("import sys, numpy as np\nsys.path.insert(0, sys.argv[1])\n"
                   "import model_aot\nx = np.load(sys.argv[2])\n"
                   "m = model_aot.load()\nm.run({m.input_names[0]: x})\n"),
    "pdjit JIT (warm cache)": ("import sys, numpy as np\n"
                               "from pdjit.tools.run import make_predictor\n"
                               "x = np.load(sys.argv[2])\n"
                               "p = make_predictor(sys.argv[3])\np.run([x])\n"),
    "onnxruntime": ("import sys, numpy as np\nimport onnxruntime as ort\n"
                    "x = np.load(sys.argv[2])\nso = ort.SessionOptions()\n"
                    "so.intra_op_num_threads = 1\n"
                    "s = ort.InferenceSession(sys.argv[4], so, "
                    "providers=['CPUExecutionProvider'])\n"
                    "s.run(None, {s.get_inputs()[0].name: x})\n"),
}


BENCH_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "model.h"
static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
int main(int argc, char **argv) {
    int64_t batch = atoll(argv[1]);
    int repeat = atoi(argv[2]);
    pdjit_model *m;
    char err[512];
    if (pdjit_model_create(NULL, batch, &m, err, sizeof err)) { puts(err); return 1; }
    if (pdjit_model_set_threads(m, atoi(argv[3]))) { puts("set_threads"); return 1; }
    int64_t shape[8], count = 1;
    int nd = pdjit_input_ndim(0);
    for (int d = 0; d < nd; d++) {
        shape[d] = pdjit_input_shape(0)[d] < 0 ? batch : pdjit_input_shape(0)[d];
        count *= shape[d];
    }
    const int64_t *shapes[1] = {shape};
    float *x = malloc(sizeof(float) * count);
    for (int64_t k = 0; k < count; k++) x[k] = (float)((k * 7919) % 2001) / 1000.f - 1.f;
    const void *data[1] = {x};
    int dtypes[1] = {PDJIT_FLOAT32}, ndims[1] = {nd};
    double *t = malloc(sizeof(double) * repeat), *c = malloc(sizeof(double) * repeat);
    for (int i = 0; i < 5 + repeat; i++) {
        double a = now(CLOCK_MONOTONIC), ac = now(CLOCK_THREAD_CPUTIME_ID);
        if (pdjit_model_run(m, 1, data, dtypes, ndims, shapes)) return 1;
        double b = now(CLOCK_MONOTONIC), bc = now(CLOCK_THREAD_CPUTIME_ID);
        if (i >= 5) { t[i - 5] = b - a; c[i - 5] = bc - ac; }
    }
    qsort(t, repeat, sizeof(double), cmp);
    qsort(c, repeat, sizeof(double), cmp);
    printf("{\"median_ms\": %.6f, \"min_ms\": %.6f, \"cpu_median_ms\": %.6f}\n",
           t[repeat / 2], t[0], c[repeat / 2]);
    return 0;
}
"""


THREADS = int(os.environ.get("BENCH_THREADS", "1"))


def _timed(fns: dict, repeat: int) -> dict:
    """Each of ``fns`` called ``repeat`` times after 5 warm-up calls, alternating: median and
    min wall ms and median thread CPU ms per name."""
    for fn in fns.values():
        for _ in range(5):
            fn()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            c, t = time.thread_time(), time.perf_counter()
            fn()
            t2, c2 = time.perf_counter(), time.thread_time()
            wall[k].append((t2 - t) * 1e3)
            cpu[k].append((c2 - c) * 1e3)
    return {k: {"median_ms": statistics.median(wall[k]), "min_ms": min(wall[k]),
                "cpu_median_ms": statistics.median(cpu[k])} for k in fns}


def _bare_call(m, x):
    """The library's run on ``x`` called through ctypes with arguments prepared once (the
    outputs into the instance's own buffers): the loader's run less the loader."""
    import ctypes

    i64 = ctypes.c_int64
    codes = {np.dtype(d): i for i, d in enumerate(
        ["float32", "float64", "int32", "int64", "uint8", "int8", "bool", "int16", "float16"])}
    data = (ctypes.c_void_p * 1)(x.ctypes.data)
    dtypes = (ctypes.c_int * 1)(codes[x.dtype])
    ndims = (ctypes.c_int * 1)(x.ndim)
    dims = (i64 * max(x.ndim, 1))(*x.shape)
    shapes = (ctypes.POINTER(i64) * 1)(ctypes.cast(dims, ctypes.POINTER(i64)))
    run, h = m._lib.pdjit_model_run, m._h

    def bare():
        if run(h, 1, data, dtypes, ndims, shapes) != 0:
            raise RuntimeError(m._lib.pdjit_model_error(h).decode())
    return bare


def child(engine: str, batch: int, repeat: int, tmp: str) -> None:
    with open(os.path.join(tmp, "model.json")) as f:
        info = json.load(f)
    shape = [batch if d < 0 else d for d in info["shape"]]
    x = np.random.default_rng(batch).standard_normal(shape).astype(np.float32)
    extra = {}
    if engine == "aot loader":
        sys.path.insert(0, tmp)
        import model_aot

        m = model_aot.load(max_batch=batch, threads=THREADS)
        name = m.input_names[0]

        def fn():
            return m.run({name: x})[0]
        extra["bare"] = _bare_call(m, x)
    elif engine == "pdjit JIT":
        from pdjit.tools.run import make_predictor

        p = make_predictor(info["path"])

        def fn():
            return p.run([x])[0]
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        s = ort.InferenceSession(os.path.join(tmp, "model.onnx"), so,
                                 providers=["CPUExecutionProvider"])
        name = s.get_inputs()[0].name

        def fn():
            return s.run(None, {name: x})[0]
    out = fn()
    res = _timed({"run": fn, **extra}, repeat)
    np.save(os.path.join(tmp, f"out_{engine.replace(' ', '_')}_{batch}.npy"), out)
    print(json.dumps({**res.pop("run"), **{f"{k}_{q}": v for k, r in res.items()
                                           for q, v in r.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--child", nargs=4, metavar=("ENGINE", "BATCH", "REPEAT", "TMP"))
    args = ap.parse_args()
    if args.child:
        engine, batch, repeat, tmp = args.child
        child(engine, int(batch), int(repeat), tmp)
        return
    from pdjit.aot import compile_model
    from pdjit.io.inference_model import load_model
    from pdjit.io.onnx_export import to_onnx

    model_path = str(MODELS / args.model)
    with tempfile.TemporaryDirectory(prefix="pdjit-bench-aot-") as tmp:
        t0 = time.perf_counter()
        spec = compile_model(model_path, os.path.join(tmp, "model_aot"), batch=1,
                             threads=args.threads)
        build = time.perf_counter() - t0
        print(f"artifact build (warm Numba cache): {build:.2f} s "
              f"({', '.join(f'{k} {v:.2f} s' for k, v in spec.timings.items())})")
        m = load_model(model_path)
        onnx_path = os.path.join(tmp, "model.onnx")
        with open(onnx_path, "wb") as f:
            f.write(to_onnx(m.program, m.params, m.feed_names, m.fetch_names))
        shape = spec.inputs[0][2]
        with open(os.path.join(tmp, "model.json"), "w") as f:
            json.dump({"path": model_path, "shape": shape}, f)
        x = np.random.default_rng(0).standard_normal(
            [1 if d < 0 else d for d in shape]).astype(np.float32)
        xp = os.path.join(tmp, "x.npy")
        np.save(xp, x)
        argv = [tmp, xp, model_path, onnx_path]
        subprocess.run([sys.executable, "-c", STARTUP["pdjit JIT (warm cache)"], *argv],
                       check=True)  # fills the kernel cache
        samples = {k: [] for k in STARTUP}
        for r in range(args.rounds):
            order = list(STARTUP) if r % 2 == 0 else list(reversed(STARTUP))
            for k in order:
                t = time.perf_counter()
                subprocess.run([sys.executable, "-c", STARTUP[k], *argv], check=True)
                samples[k].append(time.perf_counter() - t)
        print(f"\n## process start to first result ({args.model}, batch 1), median of "
              f"{args.rounds}")
        print("| contender | seconds | vs warm JIT |\n|---|---|---|")
        jit = statistics.median(samples["pdjit JIT (warm cache)"])
        for k, v in samples.items():
            print(f"| {k} | {statistics.median(v):.3f} | {statistics.median(v) / jit:.2f}x |")
        art = os.path.join(tmp, "model_aot")
        with open(os.path.join(art, "bench_c.c"), "w") as f:
            f.write(BENCH_C)
        subprocess.run("cc -O2 -I. bench_c.c -L. -lmodel -Wl,-rpath,'$ORIGIN' -o bench_c",
                       shell=True, cwd=art, check=True)
        env = dict(os.environ, BENCH_THREADS=str(args.threads),
                   OPENBLAS_NUM_THREADS=str(args.threads),
                   PDJIT_NUM_THREADS=str(args.threads))
        def c_timing(batch, rep):
            return json.loads(subprocess.run(
                [os.path.join(art, "bench_c"), str(batch), str(rep), str(args.threads)],
                capture_output=True, text=True, check=True, env=env).stdout)

        engines = ["aot through C", "pdjit JIT", "aot loader", "onnxruntime"]
        for batch in (1, 64):
            rep = args.repeat if batch == 1 else max(args.repeat // 4, 10)
            load0 = os.getloadavg()
            rounds = {k: [] for k in engines}
            for r in range(args.rounds):
                for engine in (engines if r % 2 == 0 else engines[::-1]):
                    if engine == "aot through C":
                        rounds[engine].append(c_timing(batch, rep))
                        continue
                    out = subprocess.run([sys.executable, __file__, "--child", engine,
                                          str(batch), str(rep), tmp], capture_output=True,
                                         text=True, check=True, env=env).stdout
                    rounds[engine].append(json.loads(out.strip().splitlines()[-1]))
            ref = np.load(os.path.join(tmp, f"out_pdjit_JIT_{batch}.npy"))
            for engine in ("aot_loader", "onnxruntime"):
                got = np.load(os.path.join(tmp, f"out_{engine}_{batch}.npy"))
                assert np.allclose(got, ref, rtol=1e-4, atol=1e-5), engine
            print(f"\n## latency, {args.model} batch {batch}, {args.threads} thread(s) "
                  f"({args.rounds} round(s) of {rep} runs, own process each; load average "
                  f"{load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after)")
            print("| contender | median ms (median of rounds) | min ms (best round) | "
                  "vs pdjit JIT | vs onnxruntime |\n|---|---|---|---|---|")
            med = {k: statistics.median(r["median_ms"] for r in v) for k, v in rounds.items()}
            for k in engines[1:2] + engines[:1] + engines[2:]:
                best = min(r["min_ms"] for r in rounds[k])
                print(f"| {k} | {med[k]:.4f} | {best:.4f} | {med[k] / med['pdjit JIT']:.2f}x | "
                      f"{med[k] / med['onnxruntime']:.2f}x |")
            print("\nper round (ms), min / median / median thread CPU:")
            for k in engines:
                print(f"- {k}: " + ", ".join(f"{r['min_ms']:.4f} / {r['median_ms']:.4f} / "
                                             f"{r['cpu_median_ms']:.4f}" for r in rounds[k]))
            print("- the loader's run called bare through ctypes, in the loader's process: "
                  + ", ".join(f"{r['bare_min_ms']:.4f} / {r['bare_median_ms']:.4f} / "
                              f"{r['bare_cpu_median_ms']:.4f}" for r in rounds["aot loader"]))
            over = [r["median_ms"] - r["bare_median_ms"] for r in rounds["aot loader"]]
            print("- the loader over its bare call (median - median): "
                  + ", ".join(f"{o * 1e3:+.1f} us" for o in over))
            if args.processes > 1:
                runs = [c_timing(batch, rep) for _ in range(args.processes)]
                print(f"\nthe artifact through C in {args.processes} processes (ms): "
                      "min / median / median CPU time")
                print(", ".join(f"{r['min_ms']:.4f} / {r['median_ms']:.4f} / "
                                f"{r['cpu_median_ms']:.4f}" for r in runs))


if __name__ == "__main__":
    main()
