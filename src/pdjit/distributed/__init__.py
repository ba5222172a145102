"""Data-parallel training across processes on MPI (``pdjit.distributed.fleet``).

Imported on first use of ``pdjit.distributed`` (not by ``import pdjit`` itself; the collective ops
themselves are built-in: programs written by PaddlePaddle's collective transpiler run without
it, on one rank).

- :mod:`~pdjit.distributed.fleet`: ``init``, ``distributed_optimizer(opt).minimize(loss)``,
  ``worker_index``, ``worker_num``, ``barrier_worker``, ``save_persistables`` /
  ``save_inference_model`` on rank 0;
- :class:`~pdjit.distributed.transpiler.GradAllReduce`: the program pass;
- :mod:`~pdjit.distributed.data`: ``shard_indices``, ``shard_batches``, ``split_batch``;
- ``python -m pdjit.distributed.launch --nproc_per_node N train.py``: runs ``mpiexec``;
- :mod:`~pdjit.distributed.comm`: the MPI communicator (time-bounded waits, abort on failure).
"""
from pdjit.distributed import fleet
from pdjit.distributed.data import (
    epoch_order,
    shard_batches,
    shard_indices,
    split_batch,
)
from pdjit.distributed.transpiler import GradAllReduce
from pdjit.ops.collective import CollectiveError

__all__ = ["fleet", "GradAllReduce", "CollectiveError", "epoch_order", "shard_indices",
           "shard_batches", "split_batch"]
