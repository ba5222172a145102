"""The threads of Numba's parallel loops (its threading layer's team: OpenMP's, or the work
queue's) as the kernels see them: :func:`thread_ids` names them, so that
``pdjit.codegen.cpu.threads.place_team`` can keep them off the core of the thread that starts
the loops, as it keeps ``run_parts``' helpers.

A split over the team runs in native code from start to end: no thread of it takes the GIL,
and a team thread that finished a loop polls for the next one for a while (OpenMP's
``GOMP_SPINCOUNT``, set when pdjit is imported) before it sleeps. On the 2-vCPU machine this
project is measured on, a parallel loop of two parts took 1.8-4 us more than its parts while
the team polled, against 53-74 us when its threads slept (OpenMP's passive wait: a sleeping
core's wake-up) and 55-80 us for a ``run_parts`` split (the wake-up, then the GIL handed from
thread to thread, each hand-over another wake-up). Left to the scheduler, the team's thread
often shared the starting thread's core, and every loop then waited for its polling to end.
"""
import platform
import time

import llvmlite.ir as ir
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from pdjit.codegen.cpu import replay, threads
from pdjit.codegen.cpu.lib._jit import compile_cost, jobs, pjit

__all__ = ["plan", "polling", "ready", "run", "thread_ids"]

#: Linux's number of the ``gettid`` system call on this machine (None: no ids taken)
_GETTID = {"x86_64": 186, "amd64": 186, "aarch64": 178, "arm64": 178}.get(
    platform.machine().lower())


@intrinsic
def _gettid(typingctx):
    """The calling thread's kernel id (Linux's ``gettid``)."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            i64, [i64], var_arg=True), "syscall")
        return builder.call(fn, [ir.Constant(i64, _GETTID)])
    return types.int64(), codegen


@pjit
def _ids(out):
    for p in numba.prange(out.shape[0]):
        out[p] = _gettid()


compile_cost(0.6, _ids)
# (compiled ahead by warmup: compiled at a first split it held that run 0.24 s)
jobs("team._ids (warmup)")(lambda T: [(_ids, ((np.int64, 1),))])


def thread_ids() -> list | None:
    """The kernel ids of the threads that run the calling thread's parallel loops (itself
    among them where it takes a part): one loop of as many parts as Numba has threads, each
    part taking its thread's id. Empty where the ids cannot be taken; None while that loop is
    neither compiled nor on disk (compiled ahead as the others are, see :func:`ready`: compiled
    in a run, where a generated kernel's parallel variant first served, it held that run
    0.26 s), looked for again every :data:`LOOK_AGAIN_S`."""
    if _GETTID is None:
        return []
    n = numba.config.NUMBA_NUM_THREADS
    out = np.zeros(n, np.int64)
    if not _found(_ids, (numba.typeof(out),), (_ids, out.dtype)):
        return None
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        _ids(out)
    finally:
        numba.set_num_threads(before)
    return sorted({int(t) for t in out if t > 0})


threads._thread_ids[0] = thread_ids

_READY: dict = {}  # (parallel loop, data type) -> True (ready), None (failed), or when to look
#: whether a loop found on disk in no process's cache is compiled at its first ask, in the run
#: (tests; else ``pdjit warmup`` and the background warmup compile them: see :func:`ready`)
COMPILE = False
#: the parallel loops of the splits are used from the process's run of this number on
AFTER_RUNS = 3
#: how often a loop not on disk yet is looked for again (seconds)
LOOK_AGAIN_S = 2.0
#: the share of the process's shortest run (``threads.shortest_run``) that one run's loads
#: may take before the next loop waits for the next run (the first load of a run never waits)
LOAD_SHARE = 1.0
_loaded = [0, 0.0]  # the run that loaded a loop last, the seconds its loads took


def ready(loop, args) -> bool:
    """Whether the parallel loop ``loop`` (a kernel's split over the team) may serve ``args``
    (by their data type); until it may, the caller splits as before, on ``run_parts``'
    helpers. The loops are compiled ahead, not in a run (each recompiles its kernel: 0.7-2.4 s
    of CPU; on a thread of the process it held the GIL from the runs, and ResNet-50's cold
    first result took 8.4 s against 3.4): by ``pdjit warmup`` and the background warmup that
    a process starts for a cache directory (``diskcache.start_background_warmup``), since
    they are library jobs. A run from the process's :data:`AFTER_RUNS`-th on loads those
    found on disk (~10-70 ms each), one, then more while their loads took less than
    :data:`LOAD_SHARE` of the process's shortest run (four in one run held a short run
    0.29 s; but every load makes the host drivers' recordings stale, and a model whose runs
    take half a second recorded again and redid its drivers' trials for ten runs and more:
    DenseNet-121 at batch 16 on two threads loaded one loop a run in 13 of its first 20).
    A loop not there is looked for again every :data:`LOOK_AGAIN_S`; one that fails to load
    is never used. (A kernel too costly to compile in a first run
    that has a slower stand-in, ``pointwise.conv_cols``, is made ready the same way.)"""
    key = (loop, args[0].dtype)
    state = _READY.get(key, 0.0)
    if state is True:
        return True
    run = threads.runs[0]
    if state is None or run < AFTER_RUNS or \
            _loaded[0] == run and not COMPILE and \
            _loaded[1] >= LOAD_SHARE * threads.shortest_run():
        return False
    sig = tuple(numba.typeof(a) for a in args)
    if not _found(loop, sig, key):
        return False
    if _loaded[0] != run:
        _loaded[:] = run, 0.0
    threads.LOADS[0] += 1  # (this run is no sample of a trial of the run's threads)
    t0 = time.perf_counter()
    try:
        loop.compile(sig)
    except Exception:  # noqa: BLE001 - the split on run_parts' helpers serves
        _READY[key] = None
        return False
    finally:
        _loaded[1] += time.perf_counter() - t0
    _READY[key] = True
    replay.VERSION[0] += 1  # (a host driver's recordings made before name its stand-in)
    return True


_beside: set = set()  # the kernels a caller has run the stand-in of (standing_in)


def standing_in(kernel) -> bool:
    """Whether the callers of the library ``kernel`` run its stand-in: a worker compiles it
    beside the runs (``compiler.compiling``, the kernels ``_jit.compile_beside`` declares). The run
    whose call loads it from the disk cache after is no sample of a trial of its threads
    (``threads.LOADS``)."""
    from pdjit.codegen import compiler

    if compiler.compiling(kernel):
        _beside.add(kernel)
        return True
    if kernel in _beside:
        _beside.discard(kernel)
        threads.LOADS[0] += 1
    return False


replay.STANDING[0] = lambda fn: standing_in(fn)  # (this module's, as it is at the call)


def run(loop, call) -> bool:
    """``loop(*call)`` on the team where the loop is :func:`ready` for ``call``, its threads
    first kept off the caller's core (``threads.place_team``): whether it ran (else the caller
    splits as before)."""
    if not ready(loop, call):
        return False
    threads.place_team()
    loop(*call)
    _ended[0] = time.perf_counter()
    rec = replay.recording()
    if rec is not None:
        rec.leaf(loop, call, team=True)
    return True


#: how long after a parallel loop its team's threads surely still poll for the next one
#: (``GOMP_SPINCOUNT``: ~0.2-0.3 ms on an Intel Xeon, ~0.7 ms on an AMD EPYC Zen 4:
#: ``threads.TEAM_SPINS``)
POLLING_S = 1e-4
_ended = [-1.0]  # when the last loop :func:`run` ran ended (``time.perf_counter``)


def polling() -> bool:
    """Whether a loop :func:`run` ran ended less than :data:`POLLING_S` ago: the team's threads
    then still poll, so that one more loop costs a few microseconds, not a sleeping thread's
    wake-up (tens). A host replay makes its calls in the order of the recording's run, each
    sooner: what held there holds at each replay."""
    return time.perf_counter() - _ended[0] < POLLING_S


def plan(parts, units, npan, by_panels) -> tuple:
    """``(bounds, pans)``: a kernel's work of ``units`` (output rows, blocks of pixels) by
    ``npan`` panels of output channels in ``parts`` parts, part ``p`` computing the units
    ``bounds[g, p] .. bounds[g, p + 1]`` of the panels ``pans[g] .. pans[g + 1]`` for every
    ``g`` (each output by one part).

    ``by_panels`` (where the weights outweigh the input): each part its own whole panels,
    every unit of them, then the panels left over by ranges of units, so that each part reads
    its share of the weights and all of the input. Else by ranges of units (its share of the
    input, all of the weights); where they do not split evenly, the first half of the panels
    gives the first parts one unit more (7 rows of 11 panels on two threads: 38 and 39 of 77
    tiles, not 44 and 33)."""
    even = np.array([units * i // parts for i in range(parts + 1)], np.int64)
    if by_panels and npan >= parts:
        q = npan // parts
        bounds = np.zeros((parts + 1, parts + 1), np.int64)
        for p in range(parts):
            bounds[p, p + 1:] = units
        bounds[parts] = even
        return bounds, np.array([q * g for g in range(parts + 1)] + [npan], np.int64)
    ceil = np.array([-(-units * i // parts) for i in range(parts + 1)], np.int64)
    return np.stack([ceil, even]), np.array(
        [0, npan // 2 if (ceil != even).any() else npan, npan], np.int64)


def _found(loop, sig, key) -> bool:
    """Whether the loop ``loop`` is compiled for ``sig`` in this process or on disk (or may
    be compiled: ``COMPILE``); one not there is looked for on disk again only after
    :data:`LOOK_AGAIN_S` (``_READY[key]``: when)."""
    if COMPILE or sig in loop.overloads:
        return True
    state = _READY.get(key, 0.0)
    if type(state) is float and time.monotonic() < state:
        return False
    if _on_disk(loop, sig):
        return True
    _READY[key] = time.monotonic() + LOOK_AGAIN_S
    return False


def _on_disk(loop, sig) -> bool:
    from pdjit.codegen import compiler

    return compiler._is_cached(compiler.LibraryKernel(loop), sig)
