"""Data-parallel training of an MLP on scikit-learn's handwritten digits, on 2 MPI processes.

Each epoch's global batches are split between the processes (``pdjit.distributed.shard_batches``:
a seeded order the ranks agree on); ``fleet.distributed_optimizer`` makes the program average
the gradients over the processes (fused all-reduce buckets) and start every process from rank
0's parameters. Rank 0 shows a progress bar with the running loss and accuracy (of its part
of each batch), prints the test accuracy, saves the inference model (``--save DIR``) and, with
``--plot FILE.png``, a figure of the curves.

    python examples/distributed_digits.py [--nproc 2] [--epochs 15] [--plot curves.png]

run as it is, it starts itself on ``--nproc`` processes through
``python -m pdjit.distributed.launch`` (needs MPI: the distributed extra,
``pip install -e '.[distributed]'``); under ``mpiexec``
(``mpiexec -n 2 python examples/distributed_digits.py``) it trains directly.
"""
import argparse
import os
import sys

from _training import Progress, add_plot_argument, check_plot_path, save_plot


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="processes to start (default 2)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=64, help="the global batch size")
    ap.add_argument("--save", help="directory for rank 0's inference model")
    add_plot_argument(ap)
    args = ap.parse_args(argv)
    if args.plot:
        check_plot_path(ap, args.plot)  # before any training
    if args.nproc < 1:
        ap.error(f"--nproc must be >= 1, got {args.nproc}")
    if args.batch_size < args.nproc or args.batch_size % args.nproc:
        ap.error(f"--batch-size {args.batch_size} must be a multiple of --nproc {args.nproc}")
    return args


def _under_mpi() -> bool:
    return any(k in os.environ for k in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"))


if __name__ == "__main__":
    ARGS = parse_args()  # --help answers here, before numpy and pdjit are imported
    try:
        import mpi4py  # noqa: F401 (MPI itself starts in each rank, not here)
    except ImportError:
        sys.exit("distributed_digits.py needs MPI (mpi4py and an MPI runtime): install the "
                 "distributed extra, pip install -e '.[distributed]'")
    if not _under_mpi():  # start this script on --nproc processes, one compute thread each
        import subprocess
        sys.exit(subprocess.call([sys.executable, "-m", "pdjit.distributed.launch",
                                  "--nproc_per_node", str(ARGS.nproc), "--threads", "1",
                                  os.path.abspath(__file__), *sys.argv[1:]]))

import numpy as np  # noqa: E402

import pdjit as fluid  # noqa: E402
from pdjit.distributed import fleet, shard_batches  # noqa: E402


def load(seed=0):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64).reshape(-1, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def build():
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 1
    with fluid.program_guard(main, startup):
        image = fluid.layers.data(name="image", shape=[64], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        hidden = fluid.layers.fc(input=image, size=128, act="relu")
        hidden = fluid.layers.fc(input=hidden, size=64, act="relu")
        prediction = fluid.layers.fc(input=hidden, size=10, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(input=prediction, label=label))
        accuracy = fluid.layers.accuracy(input=prediction, label=label)
        test_program = main.clone(for_test=True)
        opt = fleet.distributed_optimizer(fluid.optimizer.Adam(learning_rate=0.01))
        opt.minimize(loss)
    return main, startup, test_program, image, prediction, loss, accuracy


def main(args):
    fleet.init(is_collective=True)
    rank, nranks = fleet.worker_index(), fleet.worker_num()
    (x_train, y_train), (x_test, y_test) = load()
    main_prog, startup, test_prog, image, prediction, loss, accuracy = build()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)  # rank 0's initial parameters on every rank
    steps = -(-len(x_train) // args.batch_size)
    progress = Progress(args.epochs * steps, f"rank 0 of {nranks}", enabled=rank == 0)
    for epoch in range(args.epochs):
        for idx in shard_batches(len(x_train), args.batch_size, epoch=epoch, seed=0):
            value, acc = exe.run(main_prog, feed={"image": x_train[idx], "label": y_train[idx]},
                                 fetch_list=[loss, accuracy])
            progress.step(value[0], acc[0])
        progress.end_epoch()
    progress.close()
    (acc,) = exe.run(test_prog, feed={"image": x_test, "label": y_test}, fetch_list=[accuracy])
    progress.test_accuracy = float(acc[0])
    fleet.barrier_worker()
    if rank == 0:
        print(f"{nranks} processes, {args.epochs} epochs, global batch {args.batch_size}")
        print(f"final training loss (rank 0's part): {np.mean(progress.losses[-10:]):.4f}")
        print(f"test accuracy: {float(acc[0]):.4f}")
        if args.plot:
            save_plot(args.plot, [progress], f"Data-parallel MLP on the 8x8 digits, {nranks} "
                                             f"processes (rank 0's part of each batch)")
    if args.save:
        fleet.save_inference_model(exe, args.save, ["image"], [prediction],
                                   main_program=test_prog)


if __name__ == "__main__":
    main(ARGS)
