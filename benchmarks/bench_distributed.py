"""Data-parallel training on MPI: the fused all-reduce against raw mpi4py, and the training
throughput of 1 against 2 processes.

    python benchmarks/bench_distributed.py [--steps 60] [--repeat 50] [--batch 256]

1. All-reduce of the gradients of a model (the digits MLP: 64x256, 256, 256x128, 128, 128x10,
   10, float32) on 2 processes: pdjit's fused bucket (a program of ``coalesce_tensor`` +
   ``all_reduce``, run by the Executor as the transpiled training program runs it: the members
   gathered into the buffer, reduced, rebound) against one ``mpi4py`` ``Allreduce`` of a buffer
   of the same bytes, and against one ``Allreduce`` per gradient (what the unfused layout does).
   Median microseconds of ``--repeat`` calls, and the bandwidth (bytes reduced per second).
2. Training throughput: the digits MLP with Adam, global batch ``--batch``, ``--steps`` timed
   steps after 5 warm-up steps, with 1 process and with 2 processes (each its half of every
   batch; one compute thread each), in samples per second, and their ratio.

Each part runs in processes of its own started through ``mpiexec`` (MPICH, yielding wait).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = [(64, 256), (256,), (256, 128), (128,), (128, 10), (10,)]


def _allreduce_part(repeat: int) -> dict:
    import numpy as np
    from mpi4py import MPI

    import pdjit as fluid
    from pdjit.distributed import fleet

    comm = fleet.init(is_collective=True)
    rng = np.random.default_rng(comm.rank)
    grads = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        block = main.global_block()
        names = [f"g{i}" for i in range(len(grads))]
        for n, g in zip(names, grads):
            block.create_var(name=n, shape=g.shape, dtype="float32")
        block.create_var(name="fused", dtype="float32")
        block.append_op("coalesce_tensor", inputs={"Input": names},
                        outputs={"Output": names, "FusedOutput": ["fused"]},
                        attrs={"copy_data": True, "dtype": 5})
        block.append_op("all_reduce", inputs={"x": ["fused"]}, outputs={"out": ["fused"]})
    exe = fluid.Executor(strict=True)
    feed = dict(zip(names, grads))
    got = exe.run(main, feed=feed, fetch_list=names)
    want = [comm.comm.allreduce(g, op=MPI.SUM) for g in grads]
    assert all(np.allclose(a, b, rtol=1e-5) for a, b in zip(got, want))
    nbytes = sum(g.nbytes for g in grads)
    flat = np.concatenate([g.ravel() for g in grads])
    out = np.empty_like(flat)

    def timed(fn):
        ts = []
        for _ in range(repeat):
            comm.comm.Barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_fused = timed(lambda: exe.run(main, feed=feed, fetch_list=[]))
    t_raw = timed(lambda: comm.comm.Allreduce(flat, out, op=MPI.SUM))
    outs = [np.empty_like(g) for g in grads]
    t_each = timed(lambda: [comm.comm.Allreduce(g, o, op=MPI.SUM) for g, o in zip(grads, outs)])
    return {"bytes": nbytes, "pdjit_fused_us": t_fused * 1e6, "mpi4py_one_us": t_raw * 1e6,
            "mpi4py_per_grad_us": t_each * 1e6, "rank": comm.rank}


def _train_part(steps: int, batch: int) -> dict:
    import numpy as np

    import pdjit as fluid
    from pdjit.distributed import fleet, split_batch

    fleet.init(is_collective=True)
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        image = fluid.layers.data(name="image", shape=[64], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        h = fluid.layers.fc(image, 256, act="relu")
        h = fluid.layers.fc(h, 128, act="relu")
        pred = fluid.layers.fc(h, 10, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(pred, label))
        fleet.distributed_optimizer(fluid.optimizer.Adam(0.001)).minimize(loss)
    exe = fluid.Executor()
    exe.run(startup)
    rng = np.random.default_rng(0)
    x = rng.random((batch, 64), dtype=np.float32)
    y = rng.integers(0, 10, (batch, 1)).astype(np.int64)
    feed = dict(zip(("image", "label"), split_batch((x, y))))
    for _ in range(5):
        exe.run(main, feed=feed, fetch_list=[loss])
    fleet.barrier_worker()
    t0 = time.perf_counter()
    for _ in range(steps):
        exe.run(main, feed=feed, fetch_list=[loss])
    fleet.barrier_worker()
    took = time.perf_counter() - t0
    return {"samples_per_s": steps * batch / took, "rank": fleet.worker_index(),
            "nranks": fleet.worker_num()}


def _launch(n: int, *args) -> dict:
    from pdjit.distributed.launch import find_mpiexec, yielding_env

    p = subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, __file__, *args],
                       capture_output=True, text=True, env=yielding_env(threads=1),
                       timeout=600)
    if p.returncode:
        raise SystemExit(f"the {n}-process run failed:\n{p.stderr[-3000:]}")
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    return next(r for r in rows if r["rank"] == 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--part", choices=("allreduce", "train"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.part:  # one rank of a part: rank 0 reports
        r = _allreduce_part(a.repeat) if a.part == "allreduce" else \
            _train_part(a.steps, a.batch)
        if r["rank"] == 0:
            print(json.dumps(r), flush=True)
        return
    r = _launch(2, "--part", "allreduce", "--repeat", str(a.repeat))
    mb = r["bytes"] / 1e6
    print(f"all-reduce of the MLP's gradients, 2 processes, {r['bytes']} bytes "
          f"({len(SHAPES)} tensors), median of {a.repeat}:")
    for key, what in (("pdjit_fused_us", "pdjit fused bucket (coalesce_tensor + all_reduce)"),
                      ("mpi4py_one_us", "mpi4py Allreduce, one buffer of the same bytes"),
                      ("mpi4py_per_grad_us", "mpi4py Allreduce per gradient")):
        print(f"  {what:52s} {r[key]:9.1f} us  {mb / (r[key] / 1e6) / 1e3:7.2f} GB/s")
    print(f"  pdjit fused / raw one-buffer time: {r['pdjit_fused_us'] / r['mpi4py_one_us']:.2f}")
    one = _launch(1, "--part", "train", "--steps", str(a.steps), "--batch", str(a.batch))
    two = _launch(2, "--part", "train", "--steps", str(a.steps), "--batch", str(a.batch))
    print(f"training throughput, digits MLP, global batch {a.batch}, {a.steps} steps, "
          f"1 thread per process (cores here: {os.cpu_count()}):")
    print(f"  1 process : {one['samples_per_s']:9.0f} samples/s")
    print(f"  2 processes: {two['samples_per_s']:9.0f} samples/s")
    print(f"  ratio 2/1 : {two['samples_per_s'] / one['samples_per_s']:.2f}")


if __name__ == "__main__":
    main()
