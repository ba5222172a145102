"""A training script the tests run on N ranks (``mpiexec``) or one process.

``--mode dist``: fleet on MPI, each rank fed its consecutive part of every global batch;
``--mode single``: one process, the whole global batch, no fleet. A two-layer MLP trained with
Adam for ``--steps`` steps (``--clip``: gradient clipping by global norm, tight enough to clip),
the parameters written to ``--out`` (an .npz, rank 0 only). In dist mode each rank initialises
its parameters from another seed: only the startup program's broadcast makes them equal.
``--fail-rank R --fail-step S``: rank R raises at step S. ``--die``: it exits without a word
instead. ``--other-program``: the last rank builds a wider model (a program that differs).
``--stall``: the last rank sleeps 30 s before its second step. ``--save DIR``: after training,
``fleet.save_persistables`` to DIR/persist and ``fleet.save_inference_model`` to DIR/infer
(rank 0 writes; each rank prints whether it wrote). ``--transpile``: the plain optimizer and
``GradAllReduce`` directly (no fleet.minimize, so no comparison of the programs there).
"""
import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--mode", default="dist")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--clip", action="store_true")
p.add_argument("--nofuse", action="store_true")
p.add_argument("--fuse-num", type=int, default=8)
p.add_argument("--out")
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--fail-step", type=int, default=-1)
p.add_argument("--die", action="store_true")
p.add_argument("--other-program", action="store_true")
p.add_argument("--stall", action="store_true")
p.add_argument("--save")
p.add_argument("--transpile", action="store_true")
a = p.parse_args()

import numpy as np  # noqa: E402

import pdjit as fluid  # noqa: E402
from pdjit.framework import unique_name  # noqa: E402

rank, nranks = 0, 1
if a.mode == "dist":
    from pdjit.distributed import fleet, split_batch
    fleet.init(is_collective=True)
    rank, nranks = fleet.worker_index(), fleet.worker_num()

main, startup = fluid.Program(), fluid.Program()
main.random_seed = 7
startup.random_seed = 90 + (rank if a.mode == "dist" else 0)
width = 16 if not (a.other_program and rank == nranks - 1) else 17
with unique_name.guard(), fluid.program_guard(main, startup):
    x = fluid.layers.data(name="x", shape=[8], dtype="float32")
    y = fluid.layers.data(name="y", shape=[3], dtype="float32")
    h = fluid.layers.fc(x, width, act="tanh")
    h = fluid.layers.fc(h, 12, act="relu")
    out = fluid.layers.fc(h, 3)
    loss = fluid.layers.mean(fluid.layers.square_error_cost(out, y))
    clip = fluid.clip.GradientClipByGlobalNorm(0.05) if a.clip else None
    opt = fluid.optimizer.Adam(0.05, grad_clip=clip)
    if a.mode == "dist" and a.transpile:
        from pdjit.distributed import GradAllReduce
        opt.minimize(loss)
        GradAllReduce(nrings=1).transpile(startup, main, nranks)
    elif a.mode == "dist":
        s = fleet.DistributedStrategy()
        s.fuse_all_reduce_ops = not a.nofuse
        s.fuse_grad_size_in_num = a.fuse_num
        fleet.distributed_optimizer(opt, s).minimize(loss)
    else:
        opt.minimize(loss)

exe = fluid.Executor(fluid.CPUPlace(), strict=True)
scope = fluid.Scope()
exe.run(startup, scope=scope)
rng = np.random.default_rng(3)
for step in range(a.steps):
    gx = rng.normal(size=(12, 8)).astype(np.float32)
    gy = rng.normal(size=(12, 3)).astype(np.float32)
    if a.stall and rank == nranks - 1 and step == 1:
        time.sleep(30)  # not taking part: the others time out
    if rank == a.fail_rank and step == a.fail_step:
        if a.die:
            os._exit(3)
        raise RuntimeError(f"rank {rank} fails on purpose at step {step}")
    feed = {"x": gx, "y": gy} if a.mode == "single" else \
        dict(zip(("x", "y"), split_batch((gx, gy))))
    (lv,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    print(f"rank {rank} step {step} loss {float(lv[0]):.6f}", flush=True)
if a.out and rank == 0:
    params = {p.name: np.array(scope.find_var(p.name).value)
              for p in main.global_block().all_parameters()}
    np.savez(a.out, **params)
if a.save and a.mode == "dist":
    wrote = fleet.save_persistables(exe, os.path.join(a.save, "persist"), main, scope=scope)
    wrote_model = fleet.save_inference_model(exe, os.path.join(a.save, "infer"), ["x"], [out],
                                             main_program=main, scope=scope)
    print(f"rank {rank} saved {wrote} {wrote_model}", flush=True)
