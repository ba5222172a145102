"""The cuda target on a GPU: memory bandwidth of a fused chain, an MLP training step and LeNet
inference against ``jax.jit`` on the same GPU.

    python benchmarks/bench_cuda.py [--n-log2 26] [--repeat 20] [--only chain|mlp|lenet]

1. chain: a fused elementwise chain (``relu(x * a + b) * sigmoid(x) + y``, float32, one
   kernel) over N = 2^26 elements, timed with CUDA events around the plan's device step, as
   a fraction of the bandwidth a plain copy kernel reaches in the same run (bytes read +
   written per second); the issue's goal is >= 70 %.
2. mlp: one SGD training step of an MLP 784-512-512-10 (relu, softmax cross entropy, mean)
   at batch 256: ``Executor(CUDAPlace(0)).run`` (feeds copied in, the loss copied out) vs a
   ``jax.jit`` step with the same sizes (inputs from host arrays, ``block_until_ready``).
3. lenet: LeNet-5 inference at batch 64 (conv 6@5x5, pool, conv 16@5x5, pool, fc 120-84-10,
   softmax) vs ``jax.jit``; the plan's host ops (ops without a cuda lowering, if any: conv and
   pool have device kernels now) are counted and printed, as they would decide the number.

Times: median ms over ``--repeat`` runs after warm-up. Without a GPU (no driver, or the CUDA
simulator) the script says so and exits with status 2: the numbers need real hardware.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np


def _gpu_or_exit():
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0"):
        print("bench_cuda: NUMBA_ENABLE_CUDASIM is set: the simulator is no GPU; unset it and "
              "run on a machine with an NVIDIA GPU", file=sys.stderr)
        sys.exit(2)
    from pdjit.codegen.cuda import device

    if not device.available():
        print(f"bench_cuda: no CUDA GPU here ({device.unavailable_reason()}); the numbers of "
              f"this benchmark need one", file=sys.stderr)
        sys.exit(2)
    return device.cuda()


def _median_ms(fn, repeat: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _event_ms(cuda, fn, repeat: int) -> float:
    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeat):
        e0, e1 = cuda.event(), cuda.event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


# ---- 1. the fused chain vs a copy ----------------------------------------------------------------
cuda = None  # numba.cuda, once a GPU was found


def _copy(a, b):
    """The bound: a grid-stride copy, one read and one write per element."""
    i = cuda.grid(1)
    s = cuda.gridsize(1)
    while i < a.shape[0]:
        b[i] = a[i]
        i += s


def bench_chain(cuda, n_log2: int, repeat: int) -> None:
    import pdjit as fluid

    n = 1 << n_log2
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data("x", [n], append_batch_size=False)
        y = fluid.layers.data("y", [n], append_batch_size=False)
        out = fluid.layers.relu(fluid.layers.scale(x, 1.5, bias=0.25)) * \
            fluid.layers.sigmoid(x) + y
    exe = fluid.Executor(fluid.CUDAPlace(0), strict=True)
    r = np.random.RandomState(0)
    feed = {"x": r.randn(n).astype("float32"), "y": r.randn(n).astype("float32")}
    exe.run(main, feed=feed, fetch_list=[out])
    (step,) = [s for _, plan in exe._plans.values() for s in plan.walk()]
    dx, dy = cuda.to_device(feed["x"]), cuda.to_device(feed["y"])
    args = [dx if a == "x" else dy for a in step.args]
    chain_ms = _event_ms(cuda, lambda: step.compiled.fn(*args), repeat)
    chain_bytes = 3 * n * 4  # two reads, one write

    globals()["cuda"] = cuda  # the kernel below reads it as a global
    copy = cuda.jit(_copy)
    dst = cuda.device_array_like(dx)
    from pdjit.codegen.cuda import lib as cuda_lib

    copy_ms = _event_ms(cuda, lambda: copy[cuda_lib.grid(n)](dx, dst), repeat)
    copy_gbs = 2 * n * 4 / copy_ms / 1e6
    chain_gbs = chain_bytes / chain_ms / 1e6
    print(f"chain  N=2^{n_log2}: fused kernel {chain_ms:.3f} ms = {chain_gbs:.0f} GB/s; copy "
          f"kernel {copy_ms:.3f} ms = {copy_gbs:.0f} GB/s; chain/copy = "
          f"{chain_gbs / copy_gbs:.0%} (goal >= 70 %)")


# ---- 2. MLP training step ------------------------------------------------------------------------
def _jax_gpu():
    try:
        import jax
    except ImportError:
        return None, "jax is not installed"
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        return None, f"jax has no GPU backend ({e})"
    return (jax, gpus[0]) if gpus else (None, "jax sees no GPU")


def bench_mlp(repeat: int, batch: int = 256, sizes=(784, 512, 512, 10)) -> None:
    import pdjit as fluid

    sizes = list(sizes)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [sizes[0]])
        y = fluid.layers.data("y", [1], dtype="int64")
        h = x
        for width in sizes[1:-1]:
            h = fluid.layers.fc(h, width, act="relu")
        logits = fluid.layers.fc(h, sizes[-1])
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, y))
        fluid.optimizer.SGD(0.01).minimize(loss)
    r = np.random.RandomState(0)
    xb = r.randn(batch, sizes[0]).astype("float32")
    yb = r.randint(0, sizes[-1], (batch, 1)).astype("int64")
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CUDAPlace(0))
    exe.run(startup, scope=scope)
    ms = _median_ms(lambda: exe.run(main, feed={"x": xb, "y": yb}, fetch_list=[loss],
                                    scope=scope), repeat)
    line = f"mlp    {'-'.join(map(str, sizes))} SGD step, batch {batch}: pdjit cuda {ms:.2f} ms"
    jax, dev = _jax_gpu()
    if jax is None:
        print(f"{line}; jax: {dev}")
        return
    import jax.numpy as jnp

    params = [(jnp.asarray(r.randn(a, b).astype("float32") * 0.05), jnp.zeros(b, "float32"))
              for a, b in zip(sizes[:-1], sizes[1:])]

    def loss_fn(ps, xv, yv):
        h = xv
        for w, b in ps[:-1]:
            h = jnp.maximum(h @ w + b, 0)
        z = h @ ps[-1][0] + ps[-1][1]
        logp = z - jax.scipy.special.logsumexp(z, axis=1, keepdims=True)
        return -jnp.mean(jnp.take_along_axis(logp, yv, axis=1))

    @jax.jit
    def step(ps, xv, yv):
        val, grads = jax.value_and_grad(loss_fn)(ps, xv, yv)
        return [(w - 0.01 * gw, b - 0.01 * gb) for (w, b), (gw, gb) in zip(ps, grads)], val

    state = {"p": jax.device_put(params, dev)}

    def run():
        state["p"], val = step(state["p"], xb, yb)
        val.block_until_ready()

    print(f"{line}; jax.jit {_median_ms(run, repeat):.2f} ms")


# ---- 3. LeNet inference --------------------------------------------------------------------------
def bench_lenet(repeat: int, batch: int = 64) -> None:
    import pdjit as fluid

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = fluid.layers.data("img", [1, 28, 28])
        c1 = fluid.layers.conv2d(img, 6, 5, act="relu")
        p1 = fluid.layers.pool2d(c1, 2, pool_stride=2)
        c2 = fluid.layers.conv2d(p1, 16, 5, act="relu")
        p2 = fluid.layers.pool2d(c2, 2, pool_stride=2)
        f1 = fluid.layers.fc(p2, 120, act="relu")
        f2 = fluid.layers.fc(f1, 84, act="relu")
        prob = fluid.layers.fc(f2, 10, act="softmax")
    xb = np.random.RandomState(1).randn(batch, 1, 28, 28).astype("float32")
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CUDAPlace(0), strict=False)
    exe.run(startup, scope=scope)
    ms = _median_ms(lambda: exe.run(main, feed={"img": xb}, fetch_list=[prob], scope=scope),
                    repeat)
    host = sorted({s.op.type for _, plan in exe._plans.values() for s in plan.walk()
                   if s.kind == "reference" and "on the host" in s.describe()})
    line = f"lenet  batch {batch} inference: pdjit cuda {ms:.2f} ms (host ops: {host or 'none'})"
    jax, dev = _jax_gpu()
    if jax is None:
        print(f"{line}; jax: {dev}")
        return
    import jax.numpy as jnp
    from jax import lax

    r = np.random.RandomState(2)
    w = {"c1": r.randn(6, 1, 5, 5), "c2": r.randn(16, 6, 5, 5), "f1": r.randn(256, 120),
         "f2": r.randn(120, 84), "f3": r.randn(84, 10)}
    w = jax.device_put({k: jnp.asarray(v.astype("float32") * 0.1) for k, v in w.items()}, dev)

    def pool(v):
        return lax.reduce_window(v, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    @jax.jit
    def net(p, v):
        v = pool(jnp.maximum(lax.conv(v, p["c1"], (1, 1), "VALID"), 0))
        v = pool(jnp.maximum(lax.conv(v, p["c2"], (1, 1), "VALID"), 0))
        v = v.reshape(v.shape[0], -1)
        v = jnp.maximum(v @ p["f1"], 0)
        v = jnp.maximum(v @ p["f2"], 0)
        return jax.nn.softmax(v @ p["f3"])

    print(f"{line}; jax.jit {_median_ms(lambda: net(w, xb).block_until_ready(), repeat):.2f} "
          f"ms")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-log2", type=int, default=26)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", choices=["chain", "mlp", "lenet"])
    args = ap.parse_args(argv)
    cuda = _gpu_or_exit()
    print(f"device: {cuda.get_current_device().name}")
    if args.only in (None, "chain"):
        bench_chain(cuda, args.n_log2, args.repeat)
    if args.only in (None, "mlp"):
        bench_mlp(args.repeat)
    if args.only in (None, "lenet"):
        bench_lenet(args.repeat)


if __name__ == "__main__":
    main()
