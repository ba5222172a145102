"""Compiled plans: a block lowered to steps, built once per program version, run every time.

``build_plan`` runs the pipeline — prune, partition into fusion groups and segments, generate
and compile one native function per segment — and returns a :class:`Plan`. A plan is a list of
steps: :class:`NativeStep` (one Numba function), :class:`ReferenceStep` (one op's NumPy
reference, for ops without ``emit``) and :class:`LoopStep` (a whole ``while``-style loop in one
Numba function). Feed and fetch are bound by the executor directly.

Any block has a plan (the plan tree): a control-flow op's sub-blocks get plans of their own,
built through the ``sub_plan`` callback (the executor caches them per program version and
block) and shown indented under the op by :meth:`Plan.report`. A loop op whose body is fully
lowerable, whose step scopes nobody reads, becomes a :class:`LoopStep`; otherwise the op runs
its reference, which runs the body's plan once per iteration (``PDJIT_NATIVE_LOOPS=0`` forces
that, for debugging and comparison). The reason a loop is not native is in its step's
description. Random ops draw with keys bound at run time (``RunContext.rng_key``): a native
step passes each one's key; a native loop passes the key without its own iteration and derives
each iteration's in the generated code (``pdjit.codegen.loops``), so either way the numbers are
the reference's.

A native step that fails (a shape that does not fit, a damaged cache) re-runs its ops with their
references on the same, untouched values: that gives the precise error naming the op, or the
right answer. Nothing a native step computes reaches the env before it returned.

Run-time checks (``pdjit.runtime.checks``, settings from the executor): a native step whose
outputs' sizes depend on its inputs' shapes checks them against the allocation limit before its
native code runs (once per new tuple of input shapes); with NaN/Inf checking on, its outputs are
checked after it returned, and on NaN/Inf its ops re-run with their references to name the
first op that produced it; in that mode every op's output is stored (a value made and consumed
inside one fused loop is checked as the reference checks it).
"""
from __future__ import annotations

import functools
import gc
import os
import sys
import threading
import time
import warnings

import numba
import numpy as np
from numba.core.errors import NumbaError

from pdjit.codegen.compiler import CACHE_ERRORS, compile_function, precompile
from pdjit.codegen.cpu import malloc, threads
from pdjit.codegen.cuda import device
from pdjit.codegen.loops import LIMIT_MESSAGE, LoopGen, native_loop
from pdjit.codegen.lowering import Declined, SegmentGen
from pdjit.codegen.target import get_target, target_name
from pdjit.framework import limits, registry
from pdjit.framework.errors import (
    FallbackError,
    FallbackWarning,
    ReferenceStepWarning,
    describe_op,
    user_stacklevel,
)
from pdjit.passes import batch_rows, dump_after
from pdjit.passes.fusion import live_names, partition
from pdjit.passes.prune import prune
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime import checks as run_checks
from pdjit.runtime import profile
from pdjit.runtime.context import RunContext, StepScopes
from pdjit.runtime.lod_flow import LoDFlow, LoDUnavailable
from pdjit.runtime.tensor import LoDTensor


class ReferenceStep:
    kind = "reference"

    def __init__(self, op, op_idx: int, why: str, sub_plans=()):
        self.op, self.op_idx, self.why = op, op_idx, why
        self.sub_plans = list(sub_plans)   # [(block idx, Plan)] of a control-flow op

    def run(self, executor, env, run_index) -> None:
        executor.run_op(self.op, self.op_idx, env, run_index)

    def describe(self) -> str:
        return f"reference {self.op.type}#{self.op_idx} ({self.why})"


_NOTHING = object()


def _NO_SPLIT():  # noqa: N802 - a constant's role (a step's ``split`` when not asked)
    return None, "the plan has no native drivers"


# ``native_drivers="auto"`` (the Executor's default): after this many runs of a native step of
# an inference plan (one that writes no persistable variable) its driver is also compiled as
# one native function, and the faster of the two serves each batch size. The first runs of a
# program are often its only ones (a script, a test, one evaluation pass); a plan run this
# often is being served, and the Python between its kernels is then most of a small batch's
# time (LeNet at batch 1: 46 us with the host driver, 29 us with the native one). The
# price: compiling the driver, once per model and machine (LeNet: 10 s with every cache cold),
# else loading it from the disk cache (LeNet: 40 ms). It happens on a thread of its own
# (TIER_UP_THREAD) while the host driver goes on serving, so no run waits for it; the runs
# meanwhile share the interpreter with the compiler (slower, never stopped).
HOT_RUNS = 100
#: build and compile a hot step's native driver on a background thread (False: in the run
#: that made it hot, as tests that count runs want)
TIER_UP_THREAD = True
# ``native_drivers="background"`` (the Predictor's default): every native step's driver is
# built and compiled on that thread once the step ran BACKGROUND_RUNS times (the first compiles
# or loads the kernels, the others time the host driver), never in a run: a served model's
# first runs are not held up by it (a whole model's driver compiled in its second run took
# 12-115 s of CPU for public models).
BACKGROUND_RUNS = 2
# A native driver saves the Python between kernel calls, a few microseconds a call (LeNet at
# batch 1, 8 calls: 46 -> 29 us), and may run a batch on slices (LeNet at batch 64, 67 us a
# call: 0.54 -> 0.34 ms); its compile grows faster than the step (one function of all its
# kernels: 12-115 s of CPU for public models' whole-model steps). It is built only for a step
# of at most DRIVER_MAX_CALLS kernel calls whose host driver's best run took at most
# DRIVER_CALL_MAX_S a call (kernels that long dwarf the Python around them, and thread
# themselves: ResNet-50 at batch 1 is ~70 calls of ~1.7 ms).
DRIVER_MAX_CALLS = 24
DRIVER_CALL_MAX_S = 1e-3

# A native driver whose ops keep batch rows independent (each output row depends only on the
# same row of its batch inputs: ``pdjit.passes.batch_rows``, the analysis behind the AOT
# artifacts' ``--threads``) is also tried on contiguous slices of the batch, one per loop thread
# (``threads.max_loop_threads``: one means never), from this batch size on: LeNet-5 at batch 64
# took 0.53 ms on one thread and 0.34 ms on two slices (driver calls alone, 2-vCPU machine).
# Each slice computes its rows as a run of that slice alone would: a library call may then
# take another path than for the whole batch (OpenBLAS's sgemm has a small-matrix kernel up to
# 2**20 multiply-adds), so the last bits may differ from the unsplit driver's, as they differ
# between batch sizes.
SPLIT_MIN_BATCH = 16


class NativeStep:
    kind = "native"

    def __init__(self, compiled, args, expected, outputs, ops, description, lod_requests=(),
                 groups=None, native=None, batch_arg: int = 0, params=(), rng_ops=(),
                 guard=None, nan_inf: bool = False, split=None):
        # ``split()``: (the arguments whose rows are the batch's, sliced when the native
        # driver runs on slices of the batch, or None; why not), asked once a native driver
        # exists (``split_rows``, ``split_why``)
        self._split_info = split if split is not None else _NO_SPLIT
        self._split = None                 # (native driver, its _SplitDriver)
        self._unsplit_runs: dict = {}      # batch size -> its trial's split runs that did not
        self._split_tries: dict = {}       # batch size -> trials the split driver lost
        self._unfair_tries: dict = {}      # batch size -> ... lost while a core was busy
        # run-time checks: the allocation guard (None: every output size was checked when
        # the plan was built) and whether outputs are checked for NaN/Inf
        self.guard, self.nan_inf = guard, nan_inf
        self.compiled, self.args, self.expected, self.outputs = compiled, args, expected, outputs
        # [(op, op_idx)] of the random ops whose key for the run is an argument after the
        # offsets: the key their references would draw with (RunContext.rng_key), so native
        # code and the references give the same numbers
        self.rng_ops = list(rng_ops)
        # the driver compiled as one native function, when the plan was built with it: the
        # first runs of each batch size time both drivers, then the faster one serves that size
        self.native, self.batch_arg = native, batch_arg
        # a native driver built once the step is hot (``native_drivers="auto"``): ``hot``
        # builds it (None: not this step), after ``hot_runs`` more runs
        self._hot, self._hot_runs = None, 0
        self._host_best = float("inf")  # the host driver's best run while the step warms up
        self.tiering = None  # the thread compiling it, while it does
        # the arguments that are parameters (persistables the step does not write): an array
        # seen and checked last run is passed on without its checks again
        self._params = frozenset(params)
        self._checked = [_NOTHING] * len(args)  # (a missing input, None, never matches)
        self._bind = [(n, dt, nd) for n, (dt, nd) in zip(args, expected)]
        self._varying = [i for i in range(len(args)) if i not in self._params]
        self._guard_seen: dict = {}
        self._trials: dict = {}            # batch size -> ([host], [native], [split] times)
        self.picked: dict = {}             # batch size -> the driver chosen for it
        self.ops = ops                     # [(op, op_idx)] for the reference fallback
        self.groups = groups or [ops]      # the ops of each group, for naming what failed
        self.description = description
        self.fallbacks = 0                 # how many runs fell back to the references
        self.retired = None                # why the native code was given up, if it was
        self.last_fallback = None          # (op, op_idx, reason) of the latest fallback
        # LoD: inputs that are LoDTensors run natively; lod_flow gives the outputs their LoD
        # and binds the offsets arguments that sequence lowerings asked for
        self.lod_flow = LoDFlow(ops, lod_requests)

    def run(self, executor, env, run_index) -> None:
        values = []
        append = values.append
        # the args: the run's env, else the Scope (a block's top-level env has no parent: its
        # lookups are inlined here, the same as Env.get)
        top = env.parent is None
        local, find, get = env.values.get, env.scope.find_var, env.get
        arg_lods = None
        checked = self._checked
        fresh_param = False  # a parameter that is not the array checked last run
        i = -1
        for name, dtype, ndim in self._bind:
            i += 1
            if top:
                a = local(name, _NOTHING)
                if a is _NOTHING:
                    sv = find(name)
                    a = None if sv is None else sv.value
            else:
                a = get(name)
            if a is checked[i]:  # the same parameter array as last run: checked then
                append(a)
                continue
            if type(a) is not np.ndarray:
                if not isinstance(a, LoDTensor) or a._array is None:
                    return self._fallback(executor, env, run_index, self._reader(name),
                                          f"input {name!r} holds {type(a).__name__}, not a "
                                          f"dense tensor")
                if a._lod:
                    arg_lods = arg_lods or {}
                    arg_lods[name] = a._lod
                a = a._array
            if a.ndim != ndim and a.size == 1 and a.ndim + ndim == 1 and a.dtype == dtype:
                a = a.reshape((1,) if ndim else ())  # one value, declared [] or [1] (a view)
            if a.dtype != dtype or a.ndim != ndim:
                return self._fallback(executor, env, run_index, self._reader(name),
                                      f"input {name!r} is {a.dtype} of rank {a.ndim}; the "
                                      f"plan was built for {np.dtype(dtype)} of rank {ndim}")
            if i in self._params:
                fresh_param = True
            if not a.flags.c_contiguous or not a.flags.writeable:
                a = np.array(a, order="C")
            elif i in self._params:
                checked[i] = a
            append(a)
        if self.guard is not None:  # shapes that do not fit an op, an output too large for
            # the limit: refused before the call, checked once per new tuple of the other
            # args' shapes while the parameters stay the arrays they were
            seen = self._guard_seen
            if fresh_param or len(seen) > 256:
                seen.clear()
            key = tuple([values[j].shape for j in self._varying])
            if key not in seen:
                misfit = self.guard.check(values)
                if misfit is not None:
                    return self._fallback(executor, env, run_index, misfit[:2], misfit[2])
                seen[key] = True
        if self.retired is not None:
            return self._fallback(executor, env, run_index, self.ops[0],
                                  f"its native code was given up: {self.retired}")
        lods = None
        if arg_lods is not None or self.lod_flow.always:
            try:
                lods, extra = self.lod_flow.resolve(arg_lods or {})
            except LoDUnavailable as e:
                return self._fallback(executor, env, run_index, self.ops[0],
                                      f"a LoD it needs is unknown: {e}")
            values += extra
        if self.rng_ops:
            values += [np.uint64(RunContext(executor, env, op, i, run_index).rng_key())
                       for op, i in self.rng_ops]
        hot = self._hot is not None
        if hot:
            self._hot_runs -= 1
            t0 = time.perf_counter()
        try:
            if self.native is not None:
                results = self._call(values)
            elif profile.active is not None:  # fluid.profiler: each group of the driver timed
                results = profile.timed_groups(self, values)
            else:
                results = self.compiled.fn(*values)
        except NumbaError as e:  # the code does not compile: never try again (it is slow)
            self.retired = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return self._fallback(executor, env, run_index, self._failing(e),
                                  f"its native code does not compile ({self.retired})")
        except CACHE_ERRORS as e:
            if not _is_cache_damage(e):
                error = self._native_error(e)
                if error is not None:
                    raise error from None
                return self._fallback(executor, env, run_index, self._failing(e),
                                      f"{type(e).__name__}: {e}")
            self.compiled.reload_clean()
            results = self.compiled.fn(*values)
        except Exception as e:  # noqa: BLE001 - any failure: the references say what it was
            error = self._native_error(e)
            if error is not None:
                raise error from None
            return self._fallback(executor, env, run_index, self._failing(e),
                                  f"{type(e).__name__}: {e}")
        if hot:
            self._host_best = min(self._host_best, time.perf_counter() - t0)
            if self._hot_runs <= 0:
                self._tier_up(values)
        if self.nan_inf:  # NaN/Inf: the references name the first op that produced it
            run_checks.pinpoint(executor, env, run_index, self.ops, self.outputs, results)
        if lods is not None:
            try:
                results = [LoDFlow.attach(n, v, lods) for n, v in zip(self.outputs, results)]
            except LoDUnavailable as e:
                return self._fallback(executor, env, run_index, self.ops[0],
                                      f"an output's LoD is unknown: {e}")
        if top:  # (Env.set of a top-level env: its own values)
            env.values.update(zip(self.outputs, results))
        else:
            set_ = env.set
            for name, value in zip(self.outputs, results):
                set_(name, value)

    def _native_error(self, exc):
        """The pdjit error that native code's ``exc`` stands for, raised as it is instead of
        running the references again (None: the references say what went wrong)."""
        return None

    def _tier_up(self, values) -> None:
        """The step is hot: build its native driver and compile it for the arguments of this
        run (on a thread of its own when :data:`TIER_UP_THREAD`); once it is ready, it is
        measured against the host driver per batch size like one built with the plan."""
        build, self._hot = self._hot, None
        if build is None:  # (another thread got here first)
            return
        calls = len(self.groups)
        if calls > DRIVER_MAX_CALLS or self._host_best > DRIVER_CALL_MAX_S * calls:
            self.native_failed = (f"it would not pay: {calls} kernel calls, the host driver's "
                                  f"best run {self._host_best * 1e3:.3f} ms")
            return
        try:  # the types this run passes: what the driver is compiled for ahead
            sig = tuple(numba.typeof(v) for v in values)
        except (TypeError, ValueError):
            sig = None

        def work():
            try:
                nd = build()
                if nd is not None and sig is not None:
                    nd.fn.compile(sig)
            except (NumbaError, Declined) as e:  # the host driver goes on serving
                self.native_failed = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                return
            except Exception as e:  # noqa: BLE001 - a thread's error would be lost: keep it
                self.native_failed = f"{type(e).__name__}: {e}"
                return
            # what the compile left (the collector is paused while pdjit compiles) collected
            # here, before the drivers' trial, not by the serving runs: in a process that had
            # compiled LeNet cold, the trial's runs at batch 64 took 0.87 / 0.68 / 0.57 ms
            # (host / native / split) instead of 0.54 / 0.53 / 0.37, and one benchmark process
            # of two kept the host driver
            gc.collect()
            self.native = nd

        if not TIER_UP_THREAD:
            return work()
        # not a daemon: the interpreter waits for it at exit rather than unloading LLVM
        # under a compile that runs without the GIL
        self.tiering = threading.Thread(target=work, name="pdjit-tier-up", daemon=False)
        self.tiering.start()

    # how many runs of a batch size each driver gets before one is chosen: the first of each
    # compiles or loads, the rest are timed
    _WARM, _TIMED = 1, 3

    @property
    def split_rows(self):
        """The indices of the arguments sliced when the native driver runs on slices of the
        batch (None: its ops do not keep batch rows independent, ``split_why`` says why)."""
        if callable(self._split_info):
            self._split_info = self._split_info()
        return self._split_info[0]

    @property
    def split_why(self) -> str:
        self.split_rows  # noqa: B018 - resolves _split_info
        return self._split_info[1]

    def _split_driver(self, nd):
        """The native driver ``nd`` run on slices of the batch (None: this step's may not be)."""
        if self.split_rows is None or getattr(nd, "parallel", False):
            return None
        if self._split is None or self._split[0] is not nd:
            parts = threads.max_loop_threads()
            self._split = (nd, _SplitDriver(nd.fn, self.split_rows, parts)
                           if parts > 1 else None)
        return self._split[1]

    def _call(self, values):
        """Run the driver chosen for this batch size, or the next trial among the host
        driver, the native one and (a large batch, when the step's rows are independent) the
        native one on slices of the batch. Safe to call from several threads at once (a
        served model): a trial's bookkeeping may then be lost, never the run."""
        a = values[self.batch_arg] if values else None
        key = a.shape[0] if a is not None and a.ndim else 0
        fn = self.picked.get(key)
        if fn is not None:
            return fn(*values)
        nd = self.native
        if nd is None:  # (given up by another thread's trial)
            return self.compiled.fn(*values)
        split = self._split_driver(nd) if key >= SPLIT_MIN_BATCH else None
        drivers = (self.compiled.fn, nd.fn) if split is None else (self.compiled.fn, nd.fn, split)
        times = self._trials.get(key)
        if times is None or len(times) != len(drivers):
            times = self._trials[key] = tuple([] for _ in drivers)
        which = min(range(len(drivers)), key=lambda k: len(times[k]))
        split_runs = split.runs if which == 2 else 0
        t0 = time.perf_counter()
        if which:
            try:
                results = drivers[which](*values)
            except Exception as e:  # noqa: BLE001 - judged by what the host driver does
                results = self.compiled.fn(*values)  # raises too: the inputs' fault
                # the host driver got through: the native one does not compile, or is wrong
                # here; the host driver serves from now on
                self.native_failed = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                self.native = None
                self.picked.clear()
                return results
        else:
            results = self.compiled.fn(*values)
        elapsed = time.perf_counter() - t0
        if which == 2 and split.runs == split_runs:  # it ran unsplit: a core was busy
            redo = self._unsplit_runs.get(key, 0) + 1
            self._unsplit_runs[key] = redo
            if redo <= UNSPLIT_REDOS:  # not a time of the split: it runs again next time
                return results
            # no time of the split either: a split driver that never split in its trial is
            # no candidate (under another process's load, LeNet's child picked "native split
            # x2" from unsplit times, native ones by another name, then ran 0 of 40 runs split)
            elapsed = float("inf")
        times[which].append(elapsed)
        n = self._WARM + self._TIMED
        if all(len(t) >= n for t in times):
            # each driver's best timed run: what other processes do on a shared machine only
            # adds time (with medians of three, one LeNet benchmark process of two kept the
            # native driver at batch 64, 0.53 ms, over the split one, 0.33 ms)
            best = drivers[self._fastest([min(t[self._WARM:]) for t in times])]
            unsplit = self._unsplit_runs.get(key, 0) > UNSPLIT_REDOS
            if len(self.picked) > 64:
                self.picked.clear()
            if split is not None and best is not split:
                # the split driver ran unsplit or lost while a core was busy (another
                # process's burst: a trial is a few runs), or lost: tried again once the
                # cores are free; after a loss on free cores a few times only, later each time
                # (a loss on a busy core: the next trial after 2x more runs each time, up to
                # 32x, so that a load the trial keeps meeting costs few trials)
                unfair = unsplit or threads.free_cores() < 2
                tries = self._split_tries.get(key, 0)
                if unfair:
                    k = self._unfair_tries.get(key, 0)
                    self._unfair_tries[key] = k + 1
                    best = _Retry(best, self, key, RETRY_AFTER, RETRY_RUNS * 2 ** min(k, 5))
                elif tries < SPLIT_RETRIES:
                    self._split_tries[key] = tries + 1
                    best = _Retry(best, self, key, RETRY_AFTER * 4 ** tries,
                                  RETRY_RUNS * 4 ** tries)
            elif split is not None:
                self._unfair_tries.pop(key, None)
            self._unsplit_runs.pop(key, None)
            self.picked[key] = best
            self._trials.pop(key, None)
        return results

    @staticmethod
    def _fastest(times) -> int:
        """The driver to keep: the least time (the first of equals)."""
        return min(range(len(times)), key=times.__getitem__)

    def _reader(self, name: str):
        return next(((op, i) for op, i in self.ops if name in op.input_arg_names), self.ops[0])

    def _failing(self, exc):
        """The first op of the group whose kernel call raised ``exc`` (found from the line of
        the host driver in the traceback), else the step's first op."""
        lines = getattr(self.compiled, "group_lines", None)
        code = getattr(self.compiled, "filename", None)
        tb, lineno = exc.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == code:
                lineno = tb.tb_lineno
            tb = tb.tb_next
        if lines and lineno is not None:
            gi = max((k for k, at in enumerate(lines) if at <= lineno), default=0)
            if gi < len(self.groups) and self.groups[gi]:
                return self.groups[gi][0]
        return self.ops[0]

    def _fallback(self, executor, env, run_index, culprit, reason: str) -> None:
        """Run the ops with their references on the untouched values; say so once (a
        warning), or, in strict mode, raise once the references got through."""
        self.fallbacks += 1
        op, op_idx = culprit
        self.last_fallback = (op, op_idx, reason)
        for o, i in self.ops:
            executor.run_op(o, i, env, run_index)
        what = f"native code fell back to the NumPy references: {reason}"
        if executor.strict:
            raise FallbackError(f"{what} (strict mode)", op.type, op.block.idx, op_idx,
                                op.location())
        if self.fallbacks == 1:
            warnings.warn(describe_op(op.type, op.block.idx, op_idx, op.location()) + ": " +
                          what, FallbackWarning, stacklevel=user_stacklevel())

    def drivers(self) -> dict:
        """The driver that serves each batch size tried so far: ``"host"``, ``"native"`` or
        ``"native split xN"`` (on N slices of the batch at once)."""
        nd = self.native

        def name(fn):
            if isinstance(fn, _Retry):
                return f"{name(fn.fn)} (split to be tried when the cores are free)"
            return "native" if nd is not None and fn is nd.fn else \
                f"native split x{fn.parts}" if isinstance(fn, _SplitDriver) else "host"
        return {k: name(fn) for k, fn in sorted(self.picked.items())}

    def describe(self) -> str:
        tail = f" ({self.fallbacks} fallback(s), last: {self.last_fallback[2]})" \
            if self.fallbacks else ""
        if self.retired:
            return f"native {self.compiled.name} RETIRED ({self.retired}): " \
                   f"{self.description}{tail}"
        if self.native is not None and self.picked:
            tail += f" (driver by batch size: {self.drivers()})"
        elif getattr(self, "native_failed", None):
            tail += f" (native driver given up: {self.native_failed})"
        return f"native {self.compiled.name}: {self.description}{tail}"


class _SplitDriver:
    """A native driver run on ``parts`` contiguous slices of the batch at once
    (``threads.run_parts``): the arguments at ``rows`` sliced on dim 0, the others whole, each
    output the slices' outputs concatenated. A batch that does not split here (too small, the
    row arguments' leading dims differ, an output without the slice's rows) runs the driver
    unsplit, which then does what it does with it; so does a run while other processes keep
    a core busy (``threads.loop_threads``, at most the free cores: a slice waiting for a busy
    core would hold up the run) or a run kept on one thread (``threads.RunChoice``).
    ``runs``: the runs that were split."""

    def __init__(self, fn, rows, parts: int):
        self.fn, self.rows, self.parts = fn, tuple(rows), parts
        self._row_set = frozenset(rows)
        self.runs = 0

    def __call__(self, *values):
        rows = self.rows
        lead = values[rows[0]]
        b = lead.shape[0] if lead.ndim else 0
        parts = min(self.parts, b // 2, threads.loop_threads())
        if parts < 2 or any(values[i].ndim == 0 or values[i].shape[0] != b for i in rows):
            return self.fn(*values)
        cuts = [b * p // parts for p in range(parts + 1)]
        sliced = self._row_set
        calls = [[v[lo:hi] if i in sliced else v for i, v in enumerate(values)]
                 for lo, hi in zip(cuts, cuts[1:])]
        outs = threads.run_parts(self.fn, calls)
        for got, lo, hi in zip(outs, cuts, cuts[1:]):
            if any(r.ndim == 0 or r.shape[0] != hi - lo for r in got):
                return self.fn(*values)  # (not rows after all: the whole batch at once)
        self.runs += 1
        return tuple(np.concatenate([got[k] for got in outs]) for k in range(len(outs[0])))


#: seconds from the pick of a driver over the split one (which lost its trial, or ran
#: unsplit in it: other processes kept a core busy) to the first check for cores free enough
#: to try it again (4x longer at each of a batch size's next trials after a fair loss)
RETRY_AFTER = 1.0
#: runs of a split driver's trial that ran unsplit (a core busy) and are run again, before
#: the trial takes an unsplit run's time as the split's (a burst of another process's work
#: then does not decide the pick)
UNSPLIT_REDOS = 8
#: runs of that batch size from such a pick to the first check, when they come before
#: :data:`RETRY_AFTER` seconds (4x more at each of its next trials after a fair loss): a model
#: served often gets its split driver back a few tens of milliseconds after another process's
#: burst (LeNet at batch 64: 32 runs of 0.5 ms), not a second later. The price, while the
#: split keeps losing: a trial (12 runs, a few slower than the pick) 32, 64, ... 1024 runs
#: apart after losses on a busy core, 32, 128, 512 runs apart after losses on free cores
RETRY_RUNS = 32
#: trials of a batch size that the split driver may lose on free cores before the pick is
#: kept (a trial in which it ran unsplit, or that ended with a core busy, does not count)
SPLIT_RETRIES = 3


class _Retry:
    """The driver ``fn`` picked for a batch size over its split driver: it serves, and the
    first run at least ``wait`` seconds or ``runs`` runs after the pick (then
    :data:`RETRY_AFTER` seconds or :data:`RETRY_RUNS` runs after each check) that finds the
    cores free drops the pick, so that the next run of that size tries the drivers again."""
    __slots__ = ("fn", "step", "key", "after", "runs")

    def __init__(self, fn, step, key, wait: float = RETRY_AFTER, runs: int = RETRY_RUNS):
        self.fn, self.step, self.key = fn, step, key
        self.after = time.monotonic() + wait
        self.runs = runs

    def __call__(self, *values):
        self.runs -= 1
        now = time.monotonic()
        if self.runs <= 0 or now >= self.after:
            self.after, self.runs = now + RETRY_AFTER, RETRY_RUNS
            if threads.free_cores() >= 2 and self.step.picked.get(self.key) is self:
                self.step.picked.pop(self.key, None)
        return self.fn(*values)


def _row_states(block, ops) -> dict:
    """:func:`pdjit.passes.batch_rows.row_states` of ``ops``: a value no op wrote carries the
    batch when it is not persistable and its declared dim 0 is unknown (a feed); otherwise it
    is a constant (a parameter)."""
    def unwritten(name):
        v = block._find_var_recursive(name)
        if v is not None and not v.persistable and v.shape and v.shape[0] < 0:
            return batch_rows.BATCH
        return batch_rows.CONST

    return batch_rows.row_states(block, ops, unwritten)


def _split_rows(states, step_ops, args, outputs) -> tuple:
    """``(indices of the args sliced by rows, "")`` when the step's driver may run on slices
    of the batch, else ``(None, why not)``."""
    BATCH, CONST, NONE = batch_rows.BATCH, batch_rows.CONST, batch_rows.NONE
    first_read, last_write = {}, {}
    for op, i in step_ops:
        why, read, wrote = states[id(op)]
        if why:
            return None, f"op {op.type}#{i}: {why}"
        for n, v in read.items():
            first_read.setdefault(n, v)
        last_write.update(wrote)
    for n in outputs:
        if last_write.get(n) != BATCH:
            return None, f"output {n!r} does not carry the batch rows"
    rows = []
    for k, n in enumerate(args):
        v = first_read.get(n, CONST)
        if v == NONE:
            return None, f"input {n!r} is a value a split run does not keep"
        if v == BATCH:
            rows.append(k)
    if not rows:
        return None, "no input carries the batch"
    return tuple(rows), ""


class DeviceStep(NativeStep):
    """A native step of the ``cuda`` target: its driver launches device kernels on device
    arrays. A host input (a feed, the output of an op that ran on the host, a parameter the
    startup program made) is copied to the device once and the device copy replaces it in the
    env, so later steps, and the Scope after the run, hold the device array; outputs stay on
    the device (``pdjit.codegen.cuda.device`` counts every copy)."""

    def run(self, executor, env, run_index) -> None:
        values = []
        get = env.get
        arg_lods = None
        for name, (dtype, ndim) in zip(self.args, self.expected):
            a = get(name)
            lod = None
            if isinstance(a, LoDTensor):
                if a._array is None:
                    return self._fallback(executor, env, run_index, self._reader(name),
                                          f"input {name!r} is an empty LoDTensor")
                lod = a._lod
                if lod:
                    arg_lods = arg_lods or {}
                    arg_lods[name] = lod
                a = a._array
            on_device = device.is_device_array(a)
            if not on_device and type(a) is not np.ndarray:
                return self._fallback(executor, env, run_index, self._reader(name),
                                      f"input {name!r} holds {type(a).__name__}, not a dense "
                                      f"tensor")
            if np.dtype(a.dtype) != dtype or a.ndim != ndim:
                return self._fallback(executor, env, run_index, self._reader(name),
                                      f"input {name!r} is {np.dtype(a.dtype)} of rank {a.ndim}; "
                                      f"the plan was built for {np.dtype(dtype)} of rank {ndim}")
            if not on_device:  # copied once: the device copy serves every later reader
                a = device.to_device(a)
                env.set(name, LoDTensor._wrap(a, lod) if lod else a)
            values.append(a)
        if self.guard is not None:
            misfit = self.guard.check(values)
            if misfit is not None:
                return self._fallback(executor, env, run_index, misfit[:2], misfit[2])
        if self.retired is not None:
            return self._fallback(executor, env, run_index, self.ops[0],
                                  f"its native code was given up: {self.retired}")
        lods = None
        if arg_lods is not None or self.lod_flow.always:
            try:
                lods, extra = self.lod_flow.resolve(arg_lods or {})
            except LoDUnavailable as e:
                return self._fallback(executor, env, run_index, self.ops[0],
                                      f"a LoD it needs is unknown: {e}")
            # offsets as the driver reads them: host values, and their device copy (made
            # once per offsets array, counted)
            values += [device.offsets(h) for h in extra]
        if self.rng_ops:
            values += [np.uint64(RunContext(executor, env, op, i, run_index).rng_key())
                       for op, i in self.rng_ops]
        try:
            results = self.compiled.fn(*values)
        except NumbaError as e:  # the code does not compile: never try again (it is slow)
            self.retired = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return self._fallback(executor, env, run_index, self._failing(e),
                                  f"its device code does not compile ({self.retired})")
        except Exception as e:  # noqa: BLE001 - any failure: the references say what it was
            return self._fallback(executor, env, run_index, self._failing(e),
                                  f"{type(e).__name__}: {e}")
        if self.nan_inf:  # checked on host copies (counted): a debugging mode
            run_checks.pinpoint(executor, env, run_index, self.ops, self.outputs,
                                [device.to_host(r) for r in results])
        if lods is not None:
            try:
                results = [LoDFlow.attach(n, v, lods) for n, v in zip(self.outputs, results)]
            except LoDUnavailable as e:
                return self._fallback(executor, env, run_index, self.ops[0],
                                      f"an output's LoD is unknown: {e}")
        set_ = env.set
        for name, value in zip(self.outputs, results):
            set_(name, value)

    def describe(self) -> str:
        return "device " + super().describe()


class LoopStep(NativeStep):
    """A loop op run as one native function (``pdjit.codegen.loops``): the condition and the
    body run in native code, no Python per iteration. Any mismatch or failure re-runs the loop
    op's reference on the untouched values (the generated loop never writes its inputs)."""
    kind = "native_loop"

    def __init__(self, compiled, loop: LoopGen, op, op_idx: int, description,
                 nan_inf: bool = False):
        control = registry.get(op.type).control
        body = op.block.program.block(op.attr(control.body))
        index = {id(o): i for i, o in enumerate(body.ops)}
        # a body's random op: its key in the env the loop runs in is an argument; the loop
        # mixes in each iteration's number (loops.LoopGen)
        super().__init__(compiled, loop.args, loop.expected, loop.outputs, [(op, op_idx)],
                         description, rng_ops=[(o, index[id(o)]) for o in loop.rng_ops],
                         nan_inf=nan_inf)
        self.op, self.op_idx, self.body_idx = op, op_idx, op.attr(control.body)
        self.limit = loop.limit  # the iteration bound the loop was generated with
        self.step_scopes = [n for n in op.output(control.step_scopes)
                            if n != registry.EMPTY_VAR_NAME] if control.step_scopes else []

    def run(self, executor, env, run_index) -> None:
        get = env.get
        for name in self.args:
            if get(name) is None:  # a value no op wrote before the loop (the body writes it
                # before it reads it): native code takes arrays only, the loop op's reference
                # takes that, by design (not a fallback)
                return executor.run_op(self.op, self.op_idx, env, run_index)
        before = self.fallbacks
        super().run(executor, env, run_index)
        if self.fallbacks == before:  # ran natively: no iteration's scope was kept
            for name in self.step_scopes:
                env.set(name, StepScopes())

    def _native_error(self, exc):
        """The loop ran past its iteration bound: the error the loop op's reference raises
        there (running the loop again with the references would only take longer)."""
        if isinstance(exc, ValueError) and str(exc) == LIMIT_MESSAGE:
            cond = self.op.input(registry.get(self.op.type).control.condition)[0]
            return limits.loop_limit_error(self.op, self.op_idx, self.body_idx, cond,
                                           self.limit, self.limit)
        return None

    def describe(self) -> str:
        head = f"native loop {self.op.type}#{self.op_idx} over block {self.body_idx}"
        if self.retired:
            return f"{head} {self.compiled.name} RETIRED ({self.retired}): {self.description}"
        return f"{head} {self.compiled.name}: {self.description}"


def _is_cache_damage(e: Exception) -> bool:
    import pickle

    return isinstance(e, (pickle.UnpicklingError, EOFError))


class Plan:
    """``fresh``: names whose final value is a new array made by native code (not a view, not
    persistable) that nothing else holds after the run: the executor may hand it to the user
    without copying. ``block_idx``: the block the plan runs."""

    def __init__(self, steps, partition_text, sources, compile_seconds, fresh=frozenset(),
                 block_idx: int = 0):
        self.steps = steps
        # whether a step may call the host's BLAS (a GEMM or batched GEMM in a driver, or a
        # sub-block's plan)
        self.blas = any(getattr(s.compiled, "calls_blas", False)
                        if s.kind == "native" else bool(getattr(s, "sub_plans", ()))
                        for s in steps)
        self.fresh = fresh
        self.partition_text = partition_text
        self.sources = sources
        self.compile_seconds = compile_seconds
        self.block_idx = block_idx

    def run(self, executor, env, run_index) -> None:
        recorder = profile.active
        if recorder is not None:  # fluid.profiler: each step timed
            return profile.run_timed(recorder, self.steps, executor, env, run_index)
        for step in self.steps:
            step.run(executor, env, run_index)

    def walk(self):
        """Every step of this plan and of its sub-plans, depth first."""
        for step in self.steps:
            yield step
            for _, sub in getattr(step, "sub_plans", ()):
                yield from sub.walk()

    def drivers_settled(self, batch: int) -> bool:
        """Whether no native step of this plan still has its drivers to try for this batch
        size (a driver compiling or waiting to be built, a trial going on, a split driver to
        be tried again): ``threads.RunChoice`` measures the plan's threads only then."""
        for s in self.walk():
            if s.kind != "native":
                continue
            if getattr(s, "_hot", None) is not None or getattr(s, "tiering", None) is not None \
                    and s.tiering.is_alive():
                return False
            if getattr(s, "native", None) is not None:
                fn = s.picked.get(batch)
                if fn is None or isinstance(fn, _Retry):
                    return False
        return True

    def report(self) -> str:
        """The fusion groups and steps of this plan, its sub-plans indented under their
        control-flow op, then every generated source."""
        lines = self._outline("")
        for plan in self._plans():
            for name, text in plan.sources:
                where = f" (block {plan.block_idx})" if plan is not self else ""
                lines += [f"== generated source: {name}{where} ==", text]
        return "\n".join(lines)

    def _outline(self, indent: str) -> list:
        lines = [f"{indent}== fusion =="]
        lines += [indent + line for line in self.partition_text.splitlines()]
        lines.append(f"{indent}== steps ==")
        for s in self.steps:
            lines.append(f"{indent}  {s.describe()}")
            for idx, sub in getattr(s, "sub_plans", ()):
                lines.append(f"{indent}    -- sub-block {idx} --")
                lines += sub._outline(indent + "    ")
        lines += self._memory_lines(indent)
        return lines

    def _memory_lines(self, indent: str) -> list:
        """The memory plan of each native step's driver (when built with one): which
        intermediates share which slot buffer, and which are freed after which group."""
        lines = []
        for s in self.steps:
            mp = getattr(s.compiled, "memory_plan", None) if s.kind == "native" else None
            if mp is not None:
                lines.append(f"{indent}== memory plan: {s.compiled.name} ==")
                lines.append(mp.describe(indent + "  "))
        return lines

    def _plans(self):
        yield self
        for s in self.steps:
            for _, sub in getattr(s, "sub_plans", ()):
                yield from sub._plans()


def build_plan(program, fetch_names=(), block=None, sub_plan=None, place=None,
               memory_optim: bool = False, native_drivers: bool | str = False,
               checks=None, strict: bool = False) -> Plan:
    """Lower one block of ``program`` into a plan: the global block (feed/fetch ops excluded)
    unless ``block`` is given. ``sub_plan(block) -> Plan`` gives the plans of control-flow ops'
    sub-blocks (None: not shown). Live after the block: ``fetch_names``, persistables, names any
    other block reads and, for a sub-block, every name it writes that is declared outside it.
    ``place`` chooses the code generation target (``None``: the CPU). ``memory_optim``: each
    native step's driver reuses and releases its intermediates' buffers by liveness
    (``pdjit.codegen.memplan``; native loops are left as they are). ``native_drivers``: True:
    each native step also gets its driver as one compiled function, and runs whichever of the
    two measures faster on its first runs of each batch size (``NativeStep``); ``"auto"``: the
    same for the steps of a plan that writes no persistable variable, once a step ran
    :data:`HOT_RUNS` times, built on a thread of its own; ``"background"``: the same for every
    native step once it ran :data:`BACKGROUND_RUNS` times (both only where a native driver can
    pay: :data:`DRIVER_MAX_CALLS`). ``checks``: the
    executor's ``pdjit.runtime.checks.Settings`` (NaN/Inf checking, the allocation limit; an
    output whose size is known now and exceeds the limit is an error now). ``strict``: on a
    device target, an op that would run on the host although it has a lowering for the CPU
    (none for this target) is an error (:class:`FallbackError`) rather than a warning."""
    t0 = time.perf_counter()
    checks = checks if checks is not None else run_checks.OFF
    target = target_name(place)
    tgt = get_target(target)
    if tgt.device:  # a device target: no host memory plan, no native drivers
        memory_optim = native_drivers = False
    threads.ensure_applied()
    malloc.tune_malloc()
    block = program.global_block() if block is None else block
    live = live_names(program, block, fetch_names)
    if block.idx != 0 and _step_scopes_read(program, block, fetch_names):
        # each run's env is kept and read (for the backward pass): it must hold every value
        live.update(n for op in block.ops for n in op.output_arg_names
                    if n != registry.EMPTY_VAR_NAME)
    kept = prune(block, live)
    ops = [op for op in kept if not _is_feed_fetch(op)]
    if checks.nan_inf:  # every op's output stored and checked, as the reference checks them
        live = live | {n for op in ops for n in op.output_arg_names
                       if n != registry.EMPTY_VAR_NAME}
    dump_after("prune", lambda: "\n".join(repr(op) for op in ops))
    index = {id(op): i for i, op in enumerate(block.ops)}
    declined: set = set()
    while True:  # generate every segment's source; an op whose lowering declines runs its
        part = partition(block, ops, live, declined,  # reference: partition again
                         get_target(target))
        try:
            gens = _generate(part, block, live, target)
            break
        except Declined as d:
            declined.add(id(d.op))
    dump_after("fusion", part.describe)
    if memory_optim:  # before compiling: the plan switches some calls to in-place variants
        for gen in gens:
            if gen is not None:
                gen.plan_memory()
    precompile([job for gen in gens if gen is not None for job in gen.jobs])
    # "auto": the native steps of an inference plan get their native drivers once hot
    hot = native_drivers == "background" or \
        (native_drivers == "auto" and not _writes_persistable(block, ops))
    # which steps' native drivers may run on slices of the batch: analysed once a step of
    # this plan has a native driver (most plans never get one)
    states = functools.cache(lambda: _row_states(block, ops)) \
        if native_drivers and (native_drivers is True or hot) and tgt.native_drivers else None
    steps, sources = [], []
    for seg, gen in zip(part.segments, gens):
        if gen is None:
            node = seg.groups[0].nodes[0]
            op, op_idx = node.op, index[id(node.op)]
            loop, why_not = _native_loop(program, op, target, fetch_names)
            if loop is not None:
                compiled = compile_function(loop.source("loop"), "loop",
                                            parallel=loop.body.uses_prange,
                                            target=target, calls=loop.body.calls)
                desc = "; ".join(g.describe() for g in loop.body.segment.groups)
                steps.append(LoopStep(compiled, loop, op, op_idx, desc,
                                      nan_inf=checks.nan_inf))
                sources.append((compiled.name, compiled.text))
                continue
            why = node.why_not + (f"; not a native loop: {why_not}" if why_not else "")
            named = False
            if tgt.device:
                host_why = _host_op(op, op_idx, target, why, strict)
                named, why = host_why != why, host_why
            subs = [(b, sub_plan(program.block(b))) for b in op.sub_block_indices()] \
                if sub_plan is not None else []
            steps.append(ReferenceStep(op, op_idx, why, subs))
            if not named:  # (a host op of a device plan was named already)
                _warn_reference_step(op, node.why_not)
            continue
        compiled = gen.target.host_driver(gen, memory_optim=memory_optim)
        has_native = gen.target.native_drivers
        native = _native_driver(gen, target) \
            if native_drivers is True and has_native else None
        groups = [[(op, index[id(op)]) for op in g.ops] for g in seg.groups]
        desc = "; ".join(g.describe() for g in seg.groups)
        step_ops = [o for g in groups for o in g]
        if states is None:
            split = None
        elif gen.rng_requests or gen.lod_requests:
            split = lambda: (None, "its ops draw random numbers or read LoD offsets")  # noqa: E731
        else:
            split = lambda states=states, step_ops=step_ops, gen=gen: \
                _split_rows(states(), step_ops, gen.args, gen.outputs)  # noqa: E731
        step_cls = DeviceStep if tgt.device else NativeStep
        steps.append(step_cls(compiled, gen.args, gen.expected, gen.outputs,
                                step_ops, desc, gen.lod_requests, groups,
                                native=native, batch_arg=_batch_arg(block, gen.args),
                                params=_param_args(block, gen),
                                rng_ops=[(op, index[id(op)]) for op in gen.rng_requests],
                                guard=run_checks.step_guard(step_ops, gen.args, checks.limit,
                                                            block),
                                nan_inf=checks.nan_inf, split=split))
        if hot and has_native:
            steps[-1]._hot = lambda gen=gen: _native_driver(gen, target)
            steps[-1]._hot_runs = BACKGROUND_RUNS if native_drivers == "background" \
                else HOT_RUNS
        sources.append((compiled.name, compiled.text))
        if native is not None:
            sources.append((native.name, native.text))
    plan = Plan(steps, part.describe(), sources, time.perf_counter() - t0,
                _fresh_names(part, gens, block), block.idx)
    if memory_optim:
        dump_after("memory_plan", lambda: "\n".join(plan._memory_lines("")))
    if os.environ.get("PDJIT_DUMP"):
        print(plan.report(), file=sys.stderr)
    return plan


_warned: set = set()


_BY_DESIGN = (registry.CONTROL_FLOW, registry.FEED_FETCH, registry.RANDOM, registry.SIDE_EFFECT)


def _warn_reference_step(op, why: str) -> None:
    """Say once per op type and reason that a compiled plan runs an op's reference. Control
    flow (its sub-blocks are what compiles), feed/fetch, random ops (initializers, dropout:
    they draw from the run's random stream) and side-effect ops (``print``) run that way by
    design and are not named."""
    opdef = registry.lookup(op.type)
    if opdef is not None and any(opdef.has(t) for t in _BY_DESIGN):
        return
    if (op.type, why) not in _warned:
        _warned.add((op.type, why))
        warnings.warn(f"op {op.type!r} runs its NumPy reference in compiled plans: {why}",
                      ReferenceStepWarning, stacklevel=user_stacklevel())


def _step_scopes_read(program, block, fetched=()) -> bool:
    """Whether some op reads, or the run fetches, the step scopes of an op that runs ``block``
    (a ``STEP_SCOPES`` output of the op owning it)."""
    scopes = set()
    for b in program.blocks:
        for op in b.ops:
            opdef = registry.lookup(op.type)
            if opdef is not None and opdef.has(registry.CONTROL_FLOW) and \
                    block.idx in op.sub_block_indices():
                for n in op.output_arg_names:
                    v = op.block._find_var_recursive(n)
                    if v is not None and v.type == pb.VarType.STEP_SCOPES:
                        scopes.add(n)
    return bool(scopes) and (bool(scopes & set(fetched)) or any(
        n in scopes for b in program.blocks for op in b.ops for n in op.input_arg_names))


def _host_op(op, op_idx: int, target: str, why: str, strict: bool) -> str:
    """The reason a device plan runs ``op`` on the host; an op that has a CPU lowering but
    none for ``target`` is named in a warning (once per op type), or refused in strict mode.
    Ops that run their reference on every target (control flow, feed/fetch, random ops,
    ops without any lowering) are not named."""
    from pdjit.passes.fusion import REFERENCE, classify

    opdef = registry.lookup(op.type)
    by_design = opdef is None or any(opdef.has(t) for t in _BY_DESIGN)
    if by_design or classify(op, get_target("cpu")).kind == REFERENCE:
        return why
    why = f"{why}: runs on the host, its inputs copied from the device"
    if strict:
        raise FallbackError(f"no {target} lowering: the op would run on the host (strict "
                            f"mode)", op.type, op.block.idx, op_idx, op.location())
    key = (op.type, target)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(describe_op(op.type, op.block.idx, op_idx, op.location()) +
                      f": no {target} lowering ({why})", FallbackWarning,
                      stacklevel=user_stacklevel())
    return why


def _native_loop(program, op, target: str, fetched=()):
    """(LoopGen, "") when ``op`` is a loop that runs as one native function, else (None, why
    not; "" when it is no loop at all)."""
    opdef = registry.lookup(op.type)
    if opdef is None or opdef.control is None or opdef.control.kind != registry.LOOP:
        return None, ""
    if os.environ.get("PDJIT_NATIVE_LOOPS", "1") == "0":
        return None, "PDJIT_NATIVE_LOOPS=0"
    if not get_target(target).native_drivers:
        return None, (f"the {target} target runs the loop on the host, launching the body's "
                      f"kernels, reading the condition each iteration")
    return native_loop(program, op, target, parallel=threads.get_num_threads() > 1,
                       fetched=fetched)


def _writes_persistable(block, ops) -> bool:
    """Whether one of ``ops`` writes a persistable variable (a parameter, an optimizer's
    state, a batch norm's moving statistics): a training program, not inference."""
    for op in ops:
        for n in op.output_arg_names:
            v = block._find_var_recursive(n)
            if v is not None and v.persistable:
                return True
    return False


def _param_args(block, gen) -> list:
    """The indices of ``gen``'s arguments that are persistables it does not write."""
    out = []
    for i, n in enumerate(gen.args):
        v = block._find_var_recursive(n)
        if v is not None and v.persistable and n not in gen.defined:
            out.append(i)
    return out


def _batch_arg(block, names) -> int:
    """The index of the first argument whose leading dim is known only at run time (the batch),
    else 0."""
    for i, n in enumerate(names):
        v = block._find_var_recursive(n)
        if v is not None and v.shape and v.shape[0] < 0:
            return i
    return 0


def _native_driver(gen, target: str):
    """The segment of ``gen`` as one native function (None when a lowering declines to be
    compiled code, or the native driver would bind other values)."""
    ngen = SegmentGen(gen.segment, gen.block, gen.needed_after,
                      parallel=threads.get_num_threads() > 1, native=True, target=target)
    try:
        ngen.generate()
    except Declined:
        return None
    if list(ngen.args) != list(gen.args) or list(ngen.outputs) != list(gen.outputs) or \
            ngen.lod_requests or len(ngen.rng_requests) != len(gen.rng_requests):
        return None
    return gen.target.native_driver(ngen)


def _generate(part, block, live, target: str) -> list:
    """A SegmentGen (source ready) per native segment, None per reference one."""
    gens = []
    for si, seg in enumerate(part.segments):
        if not seg.native:
            gens.append(None)
            continue
        later = set(live)
        for other in part.segments[si + 1:]:
            for g in other.groups:
                for op in g.ops:
                    later.update(op.input_arg_names)
        gen = SegmentGen(seg, block, later, parallel=threads.get_num_threads() > 1,
                         parallel_loops=threads.max_loop_threads() > 1, target=target)
        gen.generate()
        gens.append(gen)
    return gens


def _fresh_names(part, gens, block) -> frozenset:
    """Values whose last writer is a native, non-view op and that are not persistable."""
    last_writer_native: dict = {}
    for seg, gen in zip(part.segments, gens):
        for g in seg.groups:
            for op in g.ops:
                opdef = registry.lookup(op.type)
                makes_new = gen is not None and opdef is not None and \
                    not opdef.has(registry.VIEW)
                for n in op.output_arg_names:
                    last_writer_native[n] = makes_new
    return frozenset(n for n, new in last_writer_native.items()
                     if new and not ((v := block._find_var_recursive(n)) is not None
                                     and v.persistable))


def _is_feed_fetch(op) -> bool:
    opdef = registry.lookup(op.type)
    return opdef is not None and opdef.has(registry.FEED_FETCH)
