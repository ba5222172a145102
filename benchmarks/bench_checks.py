"""The cost of the run-time checks (``pdjit.runtime.checks``) on an MLP training step.

    python benchmarks/bench_checks.py [repeats]

784-256-256-10 MLP, batch 64, SGD, in both executor modes. For each mode three executors on
their own Scopes run the same program: NaN/Inf checking off, on (``PDJIT_CHECK_NAN_INF=1``), and
off without an allocation limit (``PDJIT_MAX_ALLOC_BYTES=0``); their runs are interleaved (off,
on, no limit, off, ...) and the median and the minimum time of each are printed.
"""
import os
import statistics
import sys
import time

import numpy as np

import pdjit as fluid


def build():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [784], dtype="float32")
        y = fluid.layers.data("y", [1], dtype="int64")
        h = fluid.layers.fc(x, 256, act="relu")
        h = fluid.layers.fc(h, 256, act="relu")
        p = fluid.layers.fc(h, 10, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(p, y))
        fluid.optimizer.SGD(0.01).minimize(loss)
    return main, startup, loss


def main(repeats: int = 200) -> None:
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((64, 784)).astype("float32"),
            "y": rng.integers(0, 10, (64, 1)).astype("int64")}
    variants = {"off": ("0", ""), "on": ("1", ""), "no limit": ("0", "0")}
    for mode in ("compiled", "reference"):
        prog, startup, loss = build()
        exes = {}
        for name, (nan_inf, limit) in variants.items():
            os.environ["PDJIT_CHECK_NAN_INF"], os.environ["PDJIT_MAX_ALLOC_BYTES"] = \
                nan_inf, limit
            exe = fluid.Executor(fluid.CPUPlace(), mode=mode)
            scope = fluid.Scope()
            exe.run(startup, scope=scope)
            for _ in range(5):  # compile, warm up
                exe.run(prog, feed=feed, fetch_list=[loss], scope=scope)
            exes[name] = (exe, scope)
        times = {name: [] for name in exes}
        for _ in range(repeats):
            for name, (exe, scope) in exes.items():
                t = time.perf_counter()
                exe.run(prog, feed=feed, fetch_list=[loss], scope=scope)
                times[name].append(time.perf_counter() - t)
        for stat in (statistics.median, min):
            ms = {name: stat(t) * 1e3 for name, t in times.items()}
            print(f"{mode} ({stat.__name__}): NaN/Inf check off {ms['off']:.3f} ms, on "
                  f"{ms['on']:.3f} ms ({(ms['on'] / ms['off'] - 1) * 100:+.1f} %); without "
                  f"the allocation limit {ms['no limit']:.3f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
