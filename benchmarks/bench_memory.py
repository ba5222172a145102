"""Peak memory and time per run with and without the memory plan (``memory_optim``).

    python benchmarks/bench_memory.py [--repeat N] [--only memory|executor|NAMES] [--batches ..]

The memory plan (``pdjit.codegen.memplan``) makes each native step's host driver reuse the
buffers of dead intermediates (slots by liveness) and free every other intermediate right
after its last use. Three programs built with pdjit layers, each run by two executors on the
same weights and feeds, ``Executor(memory_optim=False)`` and ``Executor(memory_optim=True)``:

1. lenet: LeNet-like inference on [B, 1, 28, 28]: conv 6@5x5 + relu, max-pool 2, conv 16@5x5
   + relu, max-pool 2, fc 120 + relu, fc 84 + relu, fc 10 + softmax (the test-mode clone).
2. resnet: ResNet-block-like inference on [B, 16, 16, 16]: two residual blocks of 16 channels
   (conv3x3-bn-relu, conv3x3-bn, + x, relu; bn in test mode), a strided block to 32 channels
   with a 1x1 projection, global average pooling, fc 10 + softmax.
3. mlp: one SGD training step of an MLP 256-512-512-512-10 (relu; softmax cross entropy,
   mean; fetching the loss) on [B, 256].

``--only executor``: the programs of ``bench_executor.py`` (an elementwise chain over 4M
float32, a 3-op program on [1, 16], an MLP 64-256-256-10 forward and SGD step at batch 128),
with and without the plan: what decides whether the plan is on by default.

Peak memory: ``tracemalloc`` (NumPy reports its array allocations to it) started after the
warm-up runs; the peak of one run minus what was traced just before it (feeds and weights
already allocated), the median over a few runs. Arrays that Numba-compiled code allocates
itself (NRT) are not traced, in both columns alike. Time: median ms per ``Executor.run`` with
tracemalloc off, the two executors interleaved (each round runs both), after warm-up.
Outputs of the two executors are checked to be identical first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc

import numpy as np

import pdjit as fluid

L = fluid.layers


# ---- programs -------------------------------------------------------------------------------
def lenet():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[1, 28, 28], dtype="float32")
        h = L.conv2d(x, 6, 5, act="relu")
        h = L.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
        h = L.conv2d(h, 16, 5, act="relu")
        h = L.pool2d(h, pool_size=2, pool_type="max", pool_stride=2)
        h = L.fc(h, 120, act="relu")
        h = L.fc(h, 84, act="relu")
        out = L.fc(h, 10, act="softmax")
    return main.clone(for_test=True), startup, out, \
        lambda b, rng: {"x": rng.standard_normal((b, 1, 28, 28)).astype(np.float32)}


def resnet():
    def conv_bn(x, c, stride, act, k=3):
        y = L.conv2d(x, c, k, stride=stride, padding=(k - 1) // 2, bias_attr=False)
        return L.batch_norm(y, act=act, is_test=True)

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        h = L.data(name="x", shape=[16, 16, 16], dtype="float32")
        for c, s in ((16, 1), (16, 1), (32, 2)):
            y = conv_bn(h, c, s, "relu")
            y = conv_bn(y, c, 1, None)
            short = h if s == 1 else conv_bn(h, c, s, None, k=1)
            h = L.relu(L.elementwise_add(y, short))
        h = L.pool2d(h, pool_type="avg", global_pooling=True)
        out = L.fc(h, 10, act="softmax")
    return main.clone(for_test=True), startup, out, \
        lambda b, rng: {"x": rng.standard_normal((b, 16, 16, 16)).astype(np.float32)}


def mlp():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[256], dtype="float32")
        label = L.data(name="label", shape=[1], dtype="int64")
        h = x
        for _ in range(3):
            h = L.fc(h, 512, act="relu")
        logits = L.fc(h, 10)
        loss = L.mean(L.softmax_with_cross_entropy(logits, label))
        fluid.optimizer.SGD(learning_rate=0.01).minimize(loss)

    def feed(b, rng):
        return {"x": rng.standard_normal((b, 256)).astype(np.float32),
                "label": rng.integers(0, 10, (b, 1)).astype(np.int64)}
    return main, startup, loss, feed


# the programs of benchmarks/bench_executor.py (what decides the default of memory_optim)
def chain():
    n = 4_194_304
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x, a, b, c = (L.data(name=k, shape=[n], dtype="float32", append_batch_size=False)
                      for k in "xabc")
        y = L.relu(L.tanh(x * a + b) * c - 0.25) + x * 0.5
    return main, fluid.Program(), y, \
        lambda b, rng: {k: rng.standard_normal(n).astype(np.float32) for k in "xabc"}


def overhead():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = L.data(name="x", shape=[16], dtype="float32")
        y = L.relu(L.scale(x, scale=2.0, bias=1.0)) * x
    return main, fluid.Program(), y, \
        lambda b, rng: {"x": rng.standard_normal((b, 16)).astype(np.float32)}


def _mlp64(train: bool):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[64], dtype="float32")
        h = L.fc(L.fc(x, 256, act="relu"), 256, act="relu")
        if not train:
            return main, startup, L.fc(h, 10, act="softmax"), \
                lambda b, rng: {"x": rng.standard_normal((b, 64)).astype(np.float32)}
        label = L.data(name="label", shape=[1], dtype="int64")
        loss = L.mean(L.softmax_with_cross_entropy(L.fc(h, 10), label))
        fluid.optimizer.SGD(0.01).minimize(loss)

    def feed(b, rng):
        return {"x": rng.standard_normal((b, 64)).astype(np.float32),
                "label": rng.integers(0, 10, (b, 1)).astype(np.int64)}
    return main, startup, loss, feed


PROGRAMS = {"lenet": (lenet, (1, 64)), "resnet": (resnet, (1, 64)), "mlp": (mlp, (1, 64, 256)),
            "chain": (chain, (1,)), "overhead": (overhead, (1,)),
            "mlp_forward": (lambda: _mlp64(False), (128,)),
            "train": (lambda: _mlp64(True), (128,))}
GROUPS = {"memory": "lenet,resnet,mlp", "executor": "chain,overhead,mlp_forward,train"}


# ---- measuring ------------------------------------------------------------------------------
class Runner:
    """One executor (with or without the memory plan) on its own scope, same weights."""

    def __init__(self, built, weights: dict, memory_optim: bool):
        self.main, _, self.out, _ = built
        self.exe = fluid.Executor(fluid.CPUPlace(), strict=True, memory_optim=memory_optim)
        self.scope = fluid.Scope()
        for name, value in weights.items():
            self.scope.var(name).value = value.copy()

    def __call__(self, feed):
        return self.exe.run(self.main, feed=feed, fetch_list=[self.out], scope=self.scope)[0]


def peak_bytes(run, feed, repeat: int) -> int:
    """The median over ``repeat`` runs of the traced peak of one run above what was traced
    before it."""
    peaks = []
    tracemalloc.start()
    try:
        for _ in range(repeat):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            run(feed)
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    return int(statistics.median(peaks))


def times_ms(runners: dict, feed, repeat: int) -> dict:
    samples = {k: [] for k in runners}
    for _ in range(repeat):
        for k, run in runners.items():
            t = time.perf_counter()
            run(feed)
            samples[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def kib(b: int) -> str:
    return f"{b / 1024:,.1f}"


def bench(name: str, batches, repeat: int) -> list:
    make, default_batches = PROGRAMS[name]
    built = make()
    main, startup, _, feed_of = built
    init = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    init.run(startup, scope=scope)
    weights = {n: np.array(v) for n in scope.local_var_names()
               if isinstance(v := scope.find_var(n).value, np.ndarray)}
    rows = []
    for b in batches or default_batches:
        rng = np.random.default_rng(b)
        feed = feed_of(b, rng)
        runners = {"off": Runner(built, weights, False), "on": Runner(built, weights, True)}
        got = {k: r(feed) for k, r in runners.items()}   # compiles; must agree exactly
        if not np.array_equal(got["off"], got["on"]):
            raise SystemExit(f"{name} batch {b}: outputs differ with the memory plan")
        for r in runners.values():
            for _ in range(2):
                r(feed)
        reps = max(3, repeat // (1 if b == 1 else 4))
        t = times_ms(runners, feed, reps)
        mem = {k: peak_bytes(r, feed, 3) for k, r in runners.items()}
        rows.append((name, b, mem["off"], mem["on"], t["off"], t["on"]))
        print(f"  {name} B={b}: peak {kib(mem['off'])} -> {kib(mem['on'])} KiB, "
              f"{t['off']:.3f} -> {t['on']:.3f} ms", file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200, help="timed runs at batch 1 (/4 above)")
    ap.add_argument("--only", default="memory",
                    help="programs, or a group: memory (lenet,resnet,mlp), executor (the "
                         "programs of bench_executor.py: chain,overhead,mlp_forward,train)")
    ap.add_argument("--batches", default="", help="override the batch sizes, e.g. 1,64")
    args = ap.parse_args()
    batches = tuple(int(b) for b in args.batches.split(",") if b) or None
    rows = []
    names = ",".join(GROUPS.get(k.strip(), k.strip()) for k in args.only.split(","))
    for name in names.split(","):
        rows += bench(name.strip(), batches, args.repeat)
    print("\n## Peak traced memory per run and time per run, memory plan off vs on")
    print("| program | batch | peak KiB off | peak KiB on | on/off | ms off | ms on | on/off |")
    print("|---|---|---|---|---|---|---|---|")
    for name, b, m0, m1, t0, t1 in rows:
        print(f"| {name} | {b} | {kib(m0)} | {kib(m1)} | {m1 / max(m0, 1):.2f} | "
              f"{t0:.3f} | {t1:.3f} | {t1 / t0:.2f} |")


if __name__ == "__main__":
    main()
