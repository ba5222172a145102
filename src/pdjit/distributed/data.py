"""Each rank its part of the data: seeded epoch orders split between the ranks.

Every rank computes the same permutation of the samples for an epoch (from ``seed`` and the
epoch number), and takes its own part of it, so the ranks together see every sample of the
epoch once, and no two see the same one. With a global batch of ``B`` samples split into
``nranks`` parts of ``B / nranks``, one step of the ranks together computes what one process
computes on the whole batch (the transpiled program averages the gradients).
"""
from __future__ import annotations

import numpy as np


def _rank_size(rank, nranks):
    if rank is None or nranks is None:
        from pdjit.distributed import fleet
        rank = fleet.worker_index() if rank is None else rank
        nranks = fleet.worker_num() if nranks is None else nranks
    rank, nranks = int(rank), int(nranks)
    if nranks < 1 or not 0 <= rank < nranks:
        raise ValueError(f"expected 0 <= rank < nranks, got rank {rank}, nranks {nranks}")
    return rank, nranks


def epoch_order(n: int, epoch: int = 0, seed: int = 0, shuffle: bool = True) -> np.ndarray:
    """The order of the ``n`` samples in ``epoch``: the same on every rank."""
    if int(n) < 0:
        raise ValueError(f"epoch_order: the number of samples must be >= 0, got {n}")
    if not shuffle:
        return np.arange(int(n))
    return np.random.default_rng([int(seed), int(epoch)]).permutation(int(n))


def shard_indices(n: int, epoch: int = 0, seed: int = 0, shuffle: bool = True, rank=None,
                  nranks=None) -> np.ndarray:
    """This rank's samples of ``epoch``: rank ``r`` takes every ``nranks``-th sample of the
    epoch's order from position ``r``; the last ``n % nranks`` samples are left out so every
    rank has as many (and runs as many steps: a rank with one step more would wait for its
    peers)."""
    rank, nranks = _rank_size(rank, nranks)
    order = epoch_order(n, epoch, seed, shuffle)
    usable = len(order) - len(order) % nranks
    return order[:usable][rank::nranks]


def shard_batches(n: int, global_batch_size: int, epoch: int = 0, seed: int = 0,
                  shuffle: bool = True, rank=None, nranks=None):
    """The index arrays of this rank's part of each global batch of ``epoch``: the epoch's
    order in global batches of ``global_batch_size`` (an incomplete last one is dropped), each
    split into ``nranks`` consecutive parts of ``global_batch_size / nranks``."""
    rank, nranks = _rank_size(rank, nranks)
    b = int(global_batch_size)
    if b < nranks or b % nranks:
        raise ValueError(f"shard_batches: the global batch size {b} must be a positive "
                         f"multiple of the number of ranks {nranks}")
    order = epoch_order(n, epoch, seed, shuffle)
    part = b // nranks
    for start in range(0, len(order) - b + 1, b):
        yield order[start + rank * part:start + (rank + 1) * part]


def split_batch(batch, rank=None, nranks=None):
    """This rank's consecutive part of a global batch: an array, or a tuple/list/dict of arrays
    with the same first dimension (divisible by ``nranks``)."""
    rank, nranks = _rank_size(rank, nranks)
    if isinstance(batch, dict):
        return {k: split_batch(v, rank, nranks) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(split_batch(v, rank, nranks) for v in batch)
    a = np.asarray(batch)
    if a.ndim == 0 or a.shape[0] % nranks:
        first = a.shape[0] if a.ndim else "none: a scalar"
        raise ValueError(f"split_batch: the batch's first dimension ({first}) must be divisible "
                         f"by the number of ranks {nranks}")
    part = a.shape[0] // nranks
    return a[rank * part:(rank + 1) * part]
