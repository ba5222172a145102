"""Data-parallel training across processes on MPI (``pdjit.distributed.fleet``).

Not imported by ``import pdjit``: import ``pdjit.distributed`` explicitly (this registers the
collective ops, so programs written by PaddlePaddle's collective transpiler run too).

- :mod:`~pdjit.distributed.fleet`: ``init``, ``distributed_optimizer(opt).minimize(loss)``,
  ``worker_index``, ``worker_num``, ``barrier_worker``, ``save_persistables`` /
  ``save_inference_model`` on rank 0;
- :class:`~pdjit.distributed.transpiler.GradAllReduce`: the program pass;
- :mod:`~pdjit.distributed.data`: ``shard_indices``, ``shard_batches``, ``split_batch``;
- ``python -m pdjit.distributed.launch --nproc_per_node N train.py``: runs ``mpiexec``;
- :mod:`~pdjit.distributed.comm`: the MPI communicator (time-bounded waits, abort on failure).
"""
from pdjit.ops.collective import CollectiveError, register

register()

from pdjit.distributed import fleet  # noqa: E402
from pdjit.distributed.data import (  # noqa: E402
    epoch_order,
    shard_batches,
    shard_indices,
    split_batch,
)
from pdjit.distributed.transpiler import GradAllReduce  # noqa: E402

__all__ = ["fleet", "GradAllReduce", "CollectiveError", "epoch_order", "shard_indices",
           "shard_batches", "split_batch"]
