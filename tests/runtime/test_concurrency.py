"""Running programs from several Python threads (issue 20).

What pdjit guarantees, and what these tests hold it to:

- **Inference from many threads through one Executor, one Scope, one program** is safe: runs
  that only read the Scope's parameters (no op writes a persistable variable) give exactly the
  results of the same runs made one after another, whether the threads start before or after
  the program was first compiled (concurrent first runs may each build the plan; every kernel
  is compiled once per process, shared by content under a lock). Each run gets its own values:
  feeds, intermediates and fetched arrays are never shared between concurrent runs.
- **Training in several threads, each on its own Scope**, with one Executor and one program
  shared by all of them, gives each thread exactly the losses it gets when run alone: a run
  writes its persistable results (parameters, optimizer state) back to its own Scope only, and
  only once the whole run has succeeded.
- Kernels release the GIL (``nogil``), so threads running native code overlap on several cores.
- **Not guaranteed:** two threads updating the same Scope's parameters at once (two trainers,
  or a trainer and a reader of its parameters), which race as they do in Fluid; random ops
  (``dropout``, ``uniform_random``...) of an unseeded program in runs made concurrently,
  whose streams follow the executor's run count of the program and so depend on the order
  the runs start in (a seeded program draws the same numbers in every run).

A memory check too long for CI (30,000 runs with varying batch sizes keep the process's RSS
flat) runs with ``PDJIT_STRESS=1``.
"""
import os
import threading

import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import assert_native

THREADS = 8


def _mlp(train: bool):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 7
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[8], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        h = fluid.layers.fc(x, 16, act="relu")
        h = fluid.layers.fc(h, 16, act="tanh")
        prob = fluid.layers.fc(h, 4, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(prob, label))
        if train:
            fluid.optimizer.Momentum(0.1, momentum=0.9).minimize(loss)
    return main, startup, prob, loss


def _batch(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 8)).astype(np.float32),
            "label": rng.integers(0, 4, (n, 1)).astype(np.int64)}


def _in_threads(work, n=THREADS):
    """``work(i)`` in ``n`` threads started together; their results, or the first error."""
    barrier, results, errors = threading.Barrier(n), [None] * n, []

    def body(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


def test_inference_from_eight_threads_through_one_executor_and_scope():
    main, startup, prob, _ = _mlp(train=False)
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    feeds = [[_batch(100 * i + k, 1 + (i + k) % 5) for k in range(6)] for i in range(THREADS)]

    exe = fluid.Executor(strict=True)        # cold: the threads' first runs compile the plan
    got = _in_threads(lambda i: [exe.run(main, feed=f, fetch_list=[prob], scope=scope)[0]
                                 for f in feeds[i]])
    assert_native(exe)
    serial_exe = fluid.Executor(strict=True)
    for i in range(THREADS):
        for f, out in zip(feeds[i], got[i]):
            (want,) = serial_exe.run(main, feed=f, fetch_list=[prob], scope=scope)
            assert out.shape == want.shape and np.array_equal(out, want), (i, f["x"].shape)
    # the scope's parameters were only read
    w = scope.find_var("fc_0.w_0").get_tensor()
    fresh = fluid.Scope()
    fluid.Executor().run(startup, scope=fresh)
    assert np.array_equal(np.asarray(w), np.asarray(fresh.find_var("fc_0.w_0").get_tensor()))


def test_training_in_threads_on_separate_scopes_matches_each_serial_run():
    main, startup, _, loss = _mlp(train=True)
    exe = fluid.Executor(strict=True)
    steps = 5

    def train(i):
        scope = fluid.Scope()
        # the same initial parameters in every scope: the program is seeded, so every run of
        # its startup draws the same numbers, on this executor as on any other
        exe.run(startup, scope=scope)
        feed = _batch(1000 * i, 4 + i % 3)      # each thread its own data and batch size
        return [float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0][0])
                for _ in range(steps)]

    got = _in_threads(train, n=4)
    assert_native(exe)
    for i, losses in enumerate(got):
        assert losses == train(i), i          # exactly: same kernels, same order of updates
        assert losses[-1] < losses[0]


@pytest.mark.skipif(os.environ.get("PDJIT_STRESS") != "1",
                    reason="a 30,000-run memory check: PDJIT_STRESS=1 runs it")
def test_thirty_thousand_runs_with_varying_batch_sizes_keep_memory_flat():
    import gc

    def rss_mib():
        with open("/proc/self/status") as f:
            line = next(s for s in f if s.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    main, startup, prob, _ = _mlp(train=False)
    scope, exe = fluid.Scope(), fluid.Executor(strict=True)
    exe.run(startup, scope=scope)
    feeds = [_batch(n, n) for n in range(1, 33)]
    for f in feeds:                            # every batch size once: compiled, warmed
        exe.run(main, feed=f, fetch_list=[prob], scope=scope)
    gc.collect()
    before = rss_mib()
    for k in range(30000):
        exe.run(main, feed=feeds[(k * 7) % len(feeds)], fetch_list=[prob], scope=scope)
    gc.collect()
    after = rss_mib()
    print(f"\nRSS before {before:.1f} MiB, after 30,000 runs {after:.1f} MiB")
    assert_native(exe)
    assert after - before < 16, (before, after)
