"""The MPI communicator behind the collective ops, with time-bounded waits.

Every collective is started non-blocking (``Iallreduce``, ``Ibcast``, ``Ibarrier``,
``Iallgather``) and waited for by polling that sleeps between polls: a rank waiting for its
peers yields the processor (several ranks may share a core), and a wait that lasts longer
than the timeout (``PDJIT_DIST_TIMEOUT`` seconds, default 300) ends with a
:class:`~pdjit.ops.collective.CollectiveError` naming the collective, the rank and the
timeout, instead of hanging: a peer that died, left early or runs another program is noticed.

A rank that fails (an exception nobody catches) aborts the whole job (``MPI_Abort``) after
printing its traceback and a line naming the rank, so the other ranks stop at once rather than
wait for it (:func:`install_abort_hook`). A rank that dies (killed, ``os._exit``) is noticed by
MPICH's process manager, which ends the others.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

from pdjit.ops.collective import AVG, MAX, MIN, PROD, REDUCE_NAMES, SUM, CollectiveError

DEFAULT_TIMEOUT = 300.0


def default_timeout() -> float:
    raw = os.environ.get("PDJIT_DIST_TIMEOUT", "")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"PDJIT_DIST_TIMEOUT: expected a number of seconds, got {raw!r}") \
            from None
    if not value > 0:
        raise ValueError(f"PDJIT_DIST_TIMEOUT: expected a positive number of seconds, got "
                         f"{raw!r}")
    return value


_NP_REDUCE = {SUM: np.add, MAX: np.maximum, MIN: np.minimum, PROD: np.multiply, AVG: np.add}


class MPICommunicator:
    """The ranks of an ``mpi4py`` communicator (``COMM_WORLD`` by default)."""

    def __init__(self, comm=None, timeout: float | None = None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self._ops = {SUM: MPI.SUM, MAX: MPI.MAX, MIN: MPI.MIN, PROD: MPI.PROD, AVG: MPI.SUM}
        self.calls = 0  # collectives started (the benchmark and tests count them)
        self._checked: set = set()

    def __repr__(self):
        return f"MPICommunicator(rank {self.rank} of {self.size}, timeout {self.timeout:g} s)"

    # -- waiting --------------------------------------------------------------------------------
    def _wait(self, req, what: str) -> None:
        t0 = time.monotonic()
        polls = 0
        try:
            while not req.Test():
                polls += 1
                waited = time.monotonic() - t0
                if waited > self.timeout:
                    raise CollectiveError(
                        f"{what}: rank {self.rank} of {self.size} waited {waited:.1f} s for "
                        f"its peers (timeout {self.timeout:g} s, PDJIT_DIST_TIMEOUT): a rank "
                        f"failed, left early, or runs a different program")
                if polls > 64:  # then yield the core between polls
                    time.sleep(0 if waited < 0.002 else min(0.001, waited / 50))
        except self.MPI.Exception as e:
            raise CollectiveError(f"{what}: rank {self.rank} of {self.size}: MPI error: "
                                  f"{e.Get_error_string()}") from None
        self.calls += 1

    # -- collectives ------------------------------------------------------------------------------
    def _native(self, a) -> bool:
        try:
            from mpi4py.util.dtlib import from_numpy_dtype
            from_numpy_dtype(a.dtype)
            return a.dtype.kind in "fiu"
        except (KeyError, ValueError, TypeError):
            return False

    def allreduce(self, array, op=SUM, ring_id=0):
        a = np.ascontiguousarray(array)
        what = f"all_reduce ({REDUCE_NAMES[op]}) of {a.size} {a.dtype} value(s), ring {ring_id}"
        if self.size == 1:
            return np.array(a, copy=True)
        if self._native(a):
            out = np.empty_like(a)
            self._wait(self.comm.Iallreduce(a, out, op=self._ops[op]), what)
        else:  # no MPI type (float16, bool): every rank's bytes, reduced here in rank order
            parts = self._allgather_bytes(a, what)
            out = parts[0].copy()
            for p in parts[1:]:
                out = _NP_REDUCE[op](out, p).astype(a.dtype)
        if op == AVG:
            out = (out / self.size).astype(a.dtype) if a.dtype.kind != "f" else \
                np.divide(out, a.dtype.type(self.size), out=out)
        return out

    def broadcast(self, array, root=0, ring_id=0):
        a = np.ascontiguousarray(array)
        out = np.array(a, copy=True)
        if self.size == 1:
            return out
        what = f"broadcast of {a.size} {a.dtype} value(s) from rank {root}, ring {ring_id}"
        buf = out.view(np.uint8).reshape(-1)
        self._wait(self.comm.Ibcast(buf, root=int(root)), what)
        return out

    def barrier(self, what: str = "barrier") -> None:
        if self.size > 1:
            self._wait(self.comm.Ibarrier(), what)

    def _allgather_bytes(self, a, what):
        raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        out = np.empty((self.size, raw.size), np.uint8)
        self._wait(self.comm.Iallgather(raw, out), what)
        return [out[r].view(a.dtype).reshape(a.shape) for r in range(self.size)]

    def check_same(self, what: str, digest: bytes) -> None:
        """Every rank must pass the same 32-byte ``digest``; else a :class:`CollectiveError`
        listing which ranks hold which (the first 12 hex digits)."""
        d = np.frombuffer(hashlib.sha256(digest).digest(), np.uint8)
        if self.size == 1:
            return
        parts = self._allgather_bytes(d, f"comparing the {what} of every rank")
        groups: dict = {}
        for r, p in enumerate(parts):
            groups.setdefault(bytes(p).hex()[:12], []).append(r)
        if len(groups) > 1:
            mine = bytes(parts[self.rank]).hex()[:12]
            listing = "; ".join(f"ranks {rs} have {h}" for h, rs in groups.items())
            raise CollectiveError(f"the ranks run different {what}s ({listing}; rank "
                                  f"{self.rank} has {mine}): every rank must build the same "
                                  f"program (same layers, same order, same attributes)")

    def check_program(self, program) -> None:
        """Compare ``program`` with the other ranks' (once per program content; the collective
        ops call it before their first collective of each program)."""
        if self.size == 1:
            return
        key = program.content_key()
        if key not in self._checked:
            self.check_same("program", program_fingerprint(program))
            self._checked.add(key)

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


def install_abort_hook(comm: MPICommunicator) -> None:
    """After an uncaught exception on this rank, print it and a line naming the rank, then
    abort the job so the other ranks stop at once (only when the job has several ranks)."""
    if comm.size <= 1 or getattr(sys.excepthook, "_pdjit_abort", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)
            sys.stderr.write(f"pdjit.distributed: rank {comm.rank} of {comm.size} failed "
                             f"({exc_type.__name__}: {exc}); aborting the job\n")
            sys.stderr.flush()
            sys.stdout.flush()
            time.sleep(0.3)  # lets the process manager forward the output before the abort
        finally:
            comm.abort(1)

    hook._pdjit_abort = True
    sys.excepthook = hook


def program_fingerprint(program) -> bytes:
    """The bytes of ``program``'s ``ProgramDesc`` without what differs between identical
    programs built on different ranks (the call stacks of ops), serialised deterministically."""
    from pdjit.proto import framework_pb2 as pb

    desc = pb.ProgramDesc()
    desc.CopyFrom(program.desc)
    for block in desc.blocks:
        for op in block.ops:
            keep = [a for a in op.attrs if a.name != "op_callstack"]
            del op.attrs[:]
            op.attrs.extend(keep)
    return desc.SerializeToString(deterministic=True)
