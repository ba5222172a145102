"""PaddlePaddle's static collective fleet API on MPI.

::

    import pdjit as fluid
    from pdjit.distributed import fleet

    fleet.init(is_collective=True)          # MPI (mpi4py); one rank without a launcher
    ... build the model ...
    opt = fleet.distributed_optimizer(fluid.optimizer.Adam(1e-3))
    opt.minimize(loss)                      # backward + updates, then the collective rewrite
    exe.run(fluid.default_startup_program())  # rank 0's initial parameters everywhere
    for batch in ...: exe.run(feed=my_shard_of(batch), fetch_list=[loss])
    fleet.save_persistables(exe, "ckpt")    # rank 0 writes, the others skip

Launch with ``python -m pdjit.distributed.launch --nproc_per_node N train.py`` or
``mpiexec -n N python train.py``. Without an MPI launcher (or without ``mpi4py``) the job has
one rank and the programs stay as they are.
"""
from __future__ import annotations

import os

from pdjit.distributed.comm import MPICommunicator, install_abort_hook, program_fingerprint
from pdjit.ops import collective

_comm = None


class DistributedStrategy:
    """The options of the collective rewrite (PaddlePaddle's names and defaults):
    ``fuse_all_reduce_ops`` (bucketed all-reduce), ``fuse_grad_size_in_num`` (gradients per
    bucket), ``fuse_grad_size_in_MB`` (bytes per bucket), ``nccl_comm_num`` (rings)."""

    def __init__(self):
        self.fuse_all_reduce_ops = True
        self.fuse_grad_size_in_num = 8
        self.fuse_grad_size_in_MB = 32
        self.nccl_comm_num = 1
        self.without_graph_optimization = True

    def __repr__(self):
        return (f"DistributedStrategy(fuse_all_reduce_ops={self.fuse_all_reduce_ops}, "
                f"fuse_grad_size_in_num={self.fuse_grad_size_in_num}, "
                f"fuse_grad_size_in_MB={self.fuse_grad_size_in_MB}, "
                f"nccl_comm_num={self.nccl_comm_num})")


def _launched_by_mpi() -> bool:
    return any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK",
                                         "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"))


def init(role_maker=None, is_collective: bool = True, strategy=None, timeout=None):
    """Join the job: the MPI world when launched by ``mpiexec`` (or the launcher), else one rank.

    ``timeout``: seconds a collective may wait for the peers (default ``PDJIT_DIST_TIMEOUT``
    or 300). Returns the communicator (``None`` for one rank without MPI)."""
    global _comm
    if not is_collective:
        raise NotImplementedError("fleet.init: only collective training (is_collective=True) is "
                                  "supported; the parameter-server mode is not")
    try:
        comm = MPICommunicator(timeout=timeout)
    except ImportError as e:
        if _launched_by_mpi():
            raise RuntimeError(f"fleet.init: the job was launched by MPI but mpi4py cannot be "
                               f"imported ({e}); install pdjit's 'distributed' extra "
                               f"(pip install mpi4py mpich)") from e
        comm = None
    _comm = comm
    collective.set_communicator(comm if comm is not None and comm.size > 1 else None)
    if comm is not None:
        install_abort_hook(comm)
    return comm


def worker_index() -> int:
    """This rank (0 without MPI)."""
    return _comm.rank if _comm is not None else 0


def worker_num() -> int:
    """The number of ranks (1 without MPI)."""
    return _comm.size if _comm is not None else 1


def is_first_worker() -> bool:
    return worker_index() == 0


def barrier_worker() -> None:
    """Wait until every rank got here (time-bounded)."""
    if _comm is not None:
        _comm.barrier("fleet.barrier_worker")


def communicator():
    return _comm


class DistributedOptimizer:
    """``optimizer``'s ``minimize`` followed by the collective rewrite of the programs."""

    def __init__(self, optimizer, strategy=None):
        if not hasattr(optimizer, "minimize"):
            raise TypeError(f"fleet.distributed_optimizer: expected an optimizer, got "
                            f"{type(optimizer).__name__}")
        self.inner_opt = optimizer
        self.user_defined_strategy = strategy if strategy is not None else DistributedStrategy()
        self.transpiler = None

    def __getattr__(self, name):
        return getattr(self.inner_opt, name)

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        from pdjit.distributed.transpiler import GradAllReduce
        from pdjit.framework.program import default_startup_program

        result = self.inner_opt.minimize(loss, startup_program, parameter_list, no_grad_set)
        main = loss.block.program
        startup = startup_program or default_startup_program()
        s = self.user_defined_strategy
        n = worker_num()
        if n > 1:
            self.transpiler = GradAllReduce(
                nrings=s.nccl_comm_num, fuse=s.fuse_all_reduce_ops,
                fuse_grad_size_in_num=s.fuse_grad_size_in_num,
                fuse_grad_size_in_MB=s.fuse_grad_size_in_MB)
            self.transpiler.transpile(startup, main, n)
            _comm.check_same("startup program", program_fingerprint(startup))
            _comm.check_same("main program", program_fingerprint(main))
        return result


def distributed_optimizer(optimizer, strategy=None) -> DistributedOptimizer:
    """Wrap ``optimizer`` so that its ``minimize`` also makes the programs data-parallel."""
    if strategy is not None and not isinstance(strategy, DistributedStrategy):
        raise TypeError(f"fleet.distributed_optimizer: strategy must be a DistributedStrategy, "
                        f"got {type(strategy).__name__}")
    return DistributedOptimizer(optimizer, strategy)


def save_persistables(executor, dirname, main_program=None, **kw) -> bool:
    """Rank 0 saves the persistable variables (every rank holds the same); the others skip.
    Returns whether this rank wrote."""
    if worker_index() != 0:
        return False
    from pdjit.io import save_persistables as save

    save(executor, dirname, main_program, **kw)
    return True


def save_inference_model(executor, dirname, feeded_var_names, target_vars, main_program=None,
                         **kw) -> bool:
    """Rank 0 saves the inference model (pruned to ``target_vars``: no collective op is left);
    the others skip. Returns whether this rank wrote."""
    if worker_index() != 0:
        return False
    from pdjit.io import save_inference_model as save

    save(dirname, feeded_var_names, target_vars, executor, main_program=main_program, **kw)
    return True
