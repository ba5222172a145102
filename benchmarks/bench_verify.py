"""What the program verifier costs (``pdjit.verify``, run once per program content before a run
is planned, and when a model file is parsed).

    python benchmarks/bench_verify.py

Times ``verify`` on a 10-layer MLP's training program (forward, backward, SGD updates) and on
the corpus models (``tests/fixtures/paddle/models``), median of 50 runs each, beside the time
to parse the model's bytes; and the executor's first run of the training program (verify +
plan + compile + run) for scale.
"""
import glob
import os
import statistics
import time

import numpy as np

import pdjit as fluid
from pdjit.framework.program import Program

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "paddle", "models")


def median_ms(fn, repeat=50) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def mlp_training(layers=10, width=64):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[width], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        h = x
        for _ in range(layers):
            h = fluid.layers.fc(h, size=width, act="relu")
        logits = fluid.layers.fc(h, size=10)
        loss = fluid.layers.mean(fluid.layers.softmax_with_cross_entropy(logits, label))
        fluid.optimizer.SGD(0.01).minimize(loss)
    return main, startup, loss


def main():
    prog, startup, loss = mlp_training()
    nops = sum(len(b.ops) for b in prog.blocks)
    print(f"10-layer MLP training program ({nops} ops): verify "
          f"{median_ms(lambda: fluid.verify(prog)):.3f} ms")
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    feed = {"x": np.ones((32, 64), np.float32), "label": np.zeros((32, 1), np.int64)}
    t = time.perf_counter()
    exe.run(prog, feed=feed, fetch_list=[loss], scope=scope)
    print(f"  first run of it (verify + plan + compile or cache load + run): "
          f"{(time.perf_counter() - t) * 1e3:.1f} ms")
    later = median_ms(lambda: exe.run(prog, feed=feed, fetch_list=[loss], scope=scope), 20)
    print(f"  a later run: {later:.3f} ms")
    for path in sorted(glob.glob(os.path.join(MODELS, "*.pdmodel"))):
        data = open(path, "rb").read()
        p = Program.parse_from_string(data)
        fluid.verify(p)
        nops = sum(len(b.ops) for b in p.blocks)
        print(f"{os.path.basename(path):22s} {len(data):6d} bytes {nops:3d} ops: verify "
              f"{median_ms(lambda p=p: fluid.verify(p)):.3f} ms, parse "
              f"{median_ms(lambda d=data: Program.parse_from_string(d)):.3f} ms")


if __name__ == "__main__":
    main()
