"""The compiled executor side by side with what a user would otherwise pick.

    python benchmarks/bench_executor.py [--repeat N] [--only chain,overhead,mlp,coldstart]

Each benchmark runs every contender in this one process (coldstart: in fresh processes),
interleaved, and reports medians and ratios. Peers that are not installed are skipped:
jax (`jax.jit`) and PaddlePaddle's legacy executor (`paddlepaddle`, FLAGS_enable_pir_api=0).

1. chain: relu(tanh(x*a+b)*c-0.25)+x*0.5 on 4 float32 inputs of 4,194,304 elements through
   Executor.run at pdjit's default threads (every core for large elementwise loops), against
   the memory-bound loop out = x+a+b+c (numba; one thread, and prange on every core) and
   NumPy op by op with preallocated outputs.
2. overhead: Executor.run of a 3-op program on a [1, 16] float32 feed, against NumPy op by op;
   the default Executor (an inference plan: its native driver once it ran 100 times, the
   warm-up included) and one with the host drivers only (``native_drivers=False``).
3. mlp: forward of an MLP 64-256-256-10 (relu, softmax) at batch 128, against NumPy with `@`.
4. coldstart: whole-process time to the first result of a small MLP, disk cache warm vs cold.
5. train: one SGD step of the MLP 64-256-256-10 (batch 128, softmax cross entropy, fetching
   the loss) against the same step written by hand in NumPy; jax.jit where installed.
"""
from __future__ import annotations

import os

# NumPy's BLAS gets one thread as pdjit's does (its measured default): two threads on this
# 2-vCPU kind of machine make BLAS-bound work ~10x slower; compare like with like.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
from _common import interleaved, private_cache, report, settle_pdjit


# ---- 1. elementwise chain ----
def bench_chain(repeat: int) -> None:
    import numba

    import pdjit as fluid

    n = 4_194_304
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x, a, b, c = (fluid.layers.data(name=k, shape=[n], dtype="float32",
                                        append_batch_size=False) for k in "xabc")
        y = fluid.layers.relu(fluid.layers.tanh(x * a + b) * c - 0.25) + x * 0.5
    rng = np.random.default_rng(0)
    feed = {k: rng.standard_normal(n).astype(np.float32) for k in "xabc"}
    exe, scope = fluid.Executor(), fluid.Scope()

    @numba.njit(error_model="numpy")
    def membound(x, a, b, c, out):
        for i in range(x.size):
            out[i] = x[i] + a[i] + b[i] + c[i]

    @numba.njit(error_model="numpy", parallel=True)
    def membound_all(x, a, b, c, out):
        for i in numba.prange(x.size):
            out[i] = x[i] + a[i] + b[i] + c[i]

    out = np.empty(n, np.float32)
    t1, t2 = np.empty(n, np.float32), np.empty(n, np.float32)

    def numpy_ops():
        np.multiply(feed["x"], feed["a"], out=t1)
        np.add(t1, feed["b"], out=t1)
        np.tanh(t1, out=t1)
        np.multiply(t1, feed["c"], out=t1)
        np.subtract(t1, np.float32(0.25), out=t1)
        np.maximum(t1, np.float32(0), out=t1)
        np.multiply(feed["x"], np.float32(0.5), out=t2)
        np.add(t1, t2, out=out)

    contenders = {
        "pdjit Executor.run": lambda: exe.run(main, feed=feed, fetch_list=[y], scope=scope),
        "memory bound x+a+b+c (numba, 1 thread)":
            lambda: membound(feed["x"], feed["a"], feed["b"], feed["c"], out),
        "memory bound x+a+b+c (numba prange, all cores)":
            lambda: membound_all(feed["x"], feed["a"], feed["b"], feed["c"], out),
        "NumPy op by op (out=)": numpy_ops,
    }
    try:
        import jax
        import jax.numpy as jnp

        f = jax.jit(lambda x, a, b, c: jnp.maximum(jnp.tanh(x * a + b) * c - 0.25, 0) + x * 0.5)
        dev = [jax.device_put(feed[k]) for k in "xabc"]
        contenders["jax.jit"] = lambda: f(*dev).block_until_ready()
    except ImportError:
        pass
    res = interleaved(contenders, repeat)
    report("elementwise chain, 4 x 4,194,304 float32 (20 B/element moved); pdjit at its "
           "default threads (every core for large elementwise loops)", res,
           "memory bound x+a+b+c (numba prange, all cores)")
    gbps = 20 * n / (res["pdjit Executor.run"] * 1e-3) / 1e9
    print(f"pdjit: {gbps:.1f} GB/s effective; "
          f"{res['NumPy op by op (out=)'] / res['pdjit Executor.run']:.2f}x faster than NumPy")


# ---- 2. per-run overhead ----
def bench_overhead(repeat: int) -> None:
    import pdjit as fluid

    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[16], dtype="float32")
        y = fluid.layers.relu(fluid.layers.scale(x, scale=2.0, bias=1.0)) * x
    feed = {"x": np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)}
    exe, scope = fluid.Executor(), fluid.Scope()
    host = fluid.Executor(native_drivers=False)
    xv = feed["x"]

    def numpy_ops():
        t = xv * np.float32(2.0) + np.float32(1.0)
        return np.maximum(t, 0) * xv

    contenders = {"pdjit Executor.run": lambda: exe.run(main, feed=feed, fetch_list=[y],
                                                        scope=scope),
                  "pdjit Executor.run, host drivers only":
                      lambda: host.run(main, feed=feed, fetch_list=[y], scope=scope),
                  "NumPy op by op": numpy_ops}
    # the default executor's plan is hot: its native driver compiled (on its thread) and tried
    for _ in range(settle_pdjit(contenders["pdjit Executor.run"])):
        contenders["pdjit Executor.run"]()
    res = interleaved(contenders, repeat * 50)
    report("executor overhead: 3-op program on a [1, 16] float32 feed", res, "NumPy op by op")
    print(f"pdjit per run: {res['pdjit Executor.run'] * 1e3:.1f} us")


# ---- 3. MLP forward ----
def bench_mlp(repeat: int) -> None:
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[64], dtype="float32")
        h = fluid.layers.fc(x, 256, act="relu")
        h = fluid.layers.fc(h, 256, act="relu")
        p = fluid.layers.fc(h, 10, act="softmax")
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    w = [scope.find_var(f"fc_{i}.{k}_0").value for i in range(3) for k in "wb"]
    xv = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    feed = {"x": xv}

    def numpy_mlp():
        h = np.maximum(xv @ w[0] + w[1], 0)
        h = np.maximum(h @ w[2] + w[3], 0)
        z = h @ w[4] + w[5]
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    contenders = {"pdjit Executor.run": lambda: exe.run(main, feed=feed, fetch_list=[p],
                                                        scope=scope),
                  "NumPy with @": numpy_mlp}
    for _ in range(settle_pdjit(contenders["pdjit Executor.run"])):  # as it serves: hot
        contenders["pdjit Executor.run"]()
    res = interleaved(contenders, repeat * 5)
    report("MLP forward 64-256-256-10, batch 128", res, "NumPy with @")


# ---- 4. cold start ----
COLD = textwrap.dedent("""
    import numpy as np
    import pdjit as fluid
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[32], dtype="float32")
        p = fluid.layers.fc(fluid.layers.fc(x, 64, act="relu"), 10, act="softmax")
    exe = fluid.Executor()
    exe.run(startup)
    exe.run(main, feed={"x": np.ones((4, 32), np.float32)}, fetch_list=[p])
""")


def bench_coldstart(repeat: int) -> None:
    def run(cache):
        env = dict(os.environ, PDJIT_CACHE_DIR=cache)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", COLD], check=True, env=env)
        return (time.perf_counter() - t) * 1e3

    cold, warm = [], []
    for _ in range(max(3, repeat // 4)):
        with tempfile.TemporaryDirectory() as d:
            cold.append(run(d))
            warm.append(run(d))
    res = {"warm disk cache": statistics.median(warm), "cold cache": statistics.median(cold)}
    report("cold start: process start to first result of a small MLP", res, "cold cache")


def bench_train(repeat: int) -> None:
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[64], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        h = fluid.layers.fc(x, 256, act="relu")
        h = fluid.layers.fc(h, 256, act="relu")
        logits = fluid.layers.fc(h, 10)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, label))
        fluid.optimizer.SGD(0.01).minimize(loss)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((128, 64)).astype(np.float32)
    yv = rng.integers(0, 10, (128, 1)).astype(np.int64)
    feed = {"x": xv, "label": yv}
    p = [scope.find_var(f"fc_{i}.{k}_0").value.copy() for i in range(3) for k in "wb"]
    onehot = np.eye(10, dtype=np.float32)[yv[:, 0]]

    def numpy_step():
        w0, b0, w1, b1, w2, b2 = p
        a0 = xv @ w0 + b0
        h0 = np.maximum(a0, 0)
        a1 = h0 @ w1 + b1
        h1 = np.maximum(a1, 0)
        z = h1 @ w2 + b2
        e = np.exp(z - z.max(axis=1, keepdims=True))
        s = e / e.sum(axis=1, keepdims=True)
        loss_v = -np.log(s[np.arange(128), yv[:, 0]]).mean()
        dz = (s - onehot) / 128
        dh1 = (dz @ w2.T) * (a1 > 0)
        dh0 = (dh1 @ w1.T) * (a0 > 0)
        for param, g in ((w2, h1.T @ dz), (b2, dz.sum(0)), (w1, h0.T @ dh1),
                         (b1, dh1.sum(0)), (w0, xv.T @ dh0), (b0, dh0.sum(0))):
            param -= np.float32(0.01) * g
        return loss_v

    contenders = {"pdjit Executor.run": lambda: exe.run(main, feed=feed, fetch_list=[loss],
                                                        scope=scope),
                  "NumPy by hand": numpy_step}
    try:
        import jax
        import jax.numpy as jnp

        def jloss(params, x, y):
            w0, b0, w1, b1, w2, b2 = params
            h = jax.nn.relu(x @ w0 + b0)
            h = jax.nn.relu(h @ w1 + b1)
            z = h @ w2 + b2
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), y, axis=1))

        @jax.jit
        def jstep(params, x, y):
            value, grads = jax.value_and_grad(jloss)(params, x, y)
            return value, [q - 0.01 * g for q, g in zip(params, grads)]

        state = {"p": [jax.device_put(q) for q in p]}
        jx, jy = jax.device_put(xv), jax.device_put(yv)

        def jax_step():
            value, state["p"] = jstep(state["p"], jx, jy)
            return float(value)

        contenders["jax.jit"] = jax_step
    except ImportError:
        pass
    res = interleaved(contenders, repeat * 5)
    report("training step, MLP 64-256-256-10, batch 128, SGD (one BLAS thread)", res,
           "NumPy by hand")


BENCHES = {"chain": bench_chain, "overhead": bench_overhead, "mlp": bench_mlp,
           "coldstart": bench_coldstart, "train": bench_train}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--only", default=",".join(BENCHES))
    args = ap.parse_args()
    private_cache()
    for name in args.only.split(","):
        BENCHES[name](args.repeat)


if __name__ == "__main__":
    main()
