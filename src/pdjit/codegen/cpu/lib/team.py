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
import threading

import llvmlite.ir as ir
import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu.lib._jit import compile_cost, pjit

__all__ = ["ready", "thread_ids", "wait_compiled"]

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


def thread_ids() -> list:
    """The kernel ids of the threads that run the calling thread's parallel loops (itself
    among them where it takes a part): one loop of as many parts as Numba has threads, each
    part taking its thread's id. Empty where the ids cannot be taken."""
    if _GETTID is None:
        return []
    n = numba.config.NUMBA_NUM_THREADS
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        out = np.zeros(n, np.int64)
        _ids(out)
    finally:
        numba.set_num_threads(before)
    return sorted({int(t) for t in out if t > 0})


_READY: dict = {}  # (parallel loop, data type) -> True once compiled, False while compiling


#: the parallel loops a split asks for are compiled from the process's run of this number on:
#: the first runs compile the plan's own kernels (a compile on a thread of the process competes
#: with them for the GIL: ResNet-50's cold first result took 8.4 s with the loops compiling
#: during it, 3.4 s without), and a script that runs once never compiles them
AFTER_RUNS = 3


def ready(loop, args) -> bool:
    """Whether the parallel loop ``loop`` (a kernel's split over the team) is compiled for
    ``args`` (by their data type): at the first ask from the process's :data:`AFTER_RUNS`-th
    run on it is compiled (or loaded from the disk cache) on a thread of its own while the
    caller goes on, splitting as before; a run never waits for it. A loop that fails to
    compile is never used."""
    key = (loop, args[0].dtype)
    state = _READY.get(key)
    if state is None and threads.runs[0] < AFTER_RUNS:
        return False
    if state is None:
        _READY[key] = False
        sig = tuple(numba.typeof(a) for a in args)

        def work():
            try:
                loop.compile(sig)
            except Exception:  # noqa: BLE001 - the split on run_parts' helpers serves
                return
            _READY[key] = True
        # (not a daemon: Python waits for it at exit rather than stop it inside LLVM)
        t = threading.Thread(target=work, name="pdjit-team-compile")
        threads.compiling.append(t)
        t.start()
        return False
    return state


def wait_compiled() -> None:
    """Wait until the parallel loops asked for so far are compiled (tests, benchmarks)."""
    for t in list(threads.compiling):
        t.join()
