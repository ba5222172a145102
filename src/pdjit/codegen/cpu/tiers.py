"""The CPU's choice of driver for a native step, run by run (the plan step of the ``cpu``
target, :meth:`pdjit.codegen.cpu.target.CpuTarget.step_tiers`).

A native step's host driver (plain Python calling its kernels) serves first. Its driver
compiled as one native function (``pdjit.codegen.cpu.target.NativeDriver``) is either built
with the plan (``native_drivers=True``) or built once the step is hot, on a thread of its own
(``"auto"``: an inference plan's step after :data:`HOT_RUNS` runs; ``"background"``: every
step after :data:`BACKGROUND_RUNS`), and only where it can pay (:data:`DRIVER_MAX_CALLS`,
:data:`DRIVER_CALL_MAX_S`). Then each batch size's first runs time the host driver, the native
one and, for a large batch whose rows the step's ops keep independent, the native one on
slices of the batch (:class:`SplitDriver`), and the fastest serves that size; a split driver
that lost while a core was busy is tried again later (:class:`Retry`).

:class:`DriverTiers` holds that state for one step; the runtime's step calls
:meth:`DriverTiers.call` with the run's arguments and knows nothing else of it.
"""
from __future__ import annotations

import gc
import threading
import time

import numba
import numpy as np
from numba.core.errors import NumbaError

from pdjit.codegen.cpu import threads
from pdjit.codegen.lowering import Declined

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
# A step's first runs are seldom its steady ones (the first compiles or loads its kernels, the
# next may still meet a lazy first use: a GRU classifier's second run at batch 1 took 12-92 ms,
# its later ones 0.3 ms), so a step of few enough calls whose host driver has not yet run fast
# enough is timed up to HOST_MORE_RUNS more runs before its native driver is given up.
HOST_MORE_RUNS = 8
#: the generations a tier-up collects once its compile is done (0 and 1: not a full collection)
YOUNG = 1

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
#: ... and the host driver on slices (:class:`HostSlices`: a CNN's whole-model step, kernels of
#: milliseconds) from this one, a slice of one row where the batch has no more: MobileNetV2 on
#: two threads, by turns in one process, batch 4 18.0 against 20.6 ms, batch 8 34.7 against
#: 41.8; ResNet-50 batch 4 161 against 171; the encoder at batch 4 the same. Batches of 2 and
#: 3 split each kernel by samples on ``run_parts``' helpers (a hand-over of the GIL and a
#: wake-up a kernel, tens of microseconds); ms on two threads, slices / each kernel split, by
#: turns in one process: MobileNetV2 4.72 / 7.01 at batch 2, 8.25 / 12.04 at 3 (a row a slice,
#: then the last on every thread: ``SplitDriver``'s ``rest``), the encoder 7.20 / 10.12 and
#: 12.44 / 17.97, ResNet-50 34.6 / 37.0 and 57.3 / 73.1
HOST_SPLIT_MIN_BATCH = 2
#: ... each slice run by at most this many rows a call, one call after another (the whole
#: network on a few rows while their activations stay in the caches, not each layer on the
#: whole slice through the memory): at batch 16, by turns in one process, ms (whole slices /
#: calls of 4 rows): two threads, ResNet-50 630 / 607, MobileNetV2 68.0 / 65.7, the encoder
#: 114.7 / 114.4; one thread (the host driver itself against its calls of 4 rows) MobileNetV2
#: 134 / 127 (ResNet-50, whose weights are read again at each call, 1175 / 1189: the trial
#: keeps the host driver there). The best size depends on the model, so the trial has a
#: candidate for each size here: at batch 16 on two threads (a 2-vCPU AMD EPYC, 1 MiB of L2 a
#: core, 32 MiB of L3; by turns in one process, calls of 1 / 2 / 4 rows) MobileNetV2 41.1 /
#: 42.0 / 46.0 ms (its activations are large beside its weights: one row's stay in the L3
#: that the two threads share), the encoder 76.2 / 72.9 / 69.0, ResNet-50 473 / 457 / 422 (its
#: 100 MB of weights read again at each call)
HOST_CHUNK_ROWS = (4, 1)
#: ... and in at most this many calls (a larger batch by more rows a call: each call pays the
#: host driver's own time again)
HOST_MAX_CHUNKS = 8



def _NO_SPLIT():  # noqa: N802 - a constant's role (a step's ``split`` when not asked)
    return None, "the plan has no native drivers"


class DriverTiers:
    """The drivers of one native step (``step``: its ``compiled`` host driver, ``groups``,
    ``batch_arg``, and ``call_host(values[, replay])``, the host driver as the run calls it)
    and which serves each batch size. ``native``: the native driver built with the plan, or None;
    ``build``: builds it once the step is hot (None: never), after ``hot_runs`` runs;
    ``split()``: ``(indices of the arguments sliced by rows, or None; why not)``."""

    def __init__(self, step, native=None, build=None, hot_runs: int = 0, split=None,
                 replay=None):
        self.step = step
        self._batch_arg = step.batch_arg
        self.native = native
        # a native driver built once the step is hot: ``_hot`` builds it (None: not this
        # step), after ``_hot_runs`` more runs
        self._hot, self._hot_runs = build, hot_runs
        self._more_runs = HOST_MORE_RUNS  # runs still timed before it would not pay
        self._host_best = float("inf")  # the host driver's best run while the step warms up
        self.tiering = None  # the thread compiling it, while it does
        self.native_failed = None  # why the native driver was given up, if it was
        self._split_info = split if split is not None else _NO_SPLIT
        self.replay = replay  # the host driver's calls recorded and replayed, or None
        self._split = None                 # (native driver, its SplitDrivers)
        self._unsettled_runs: dict = {}    # batch size -> its trial's runs not counted (LOADS)
        self._warming_runs: dict = {}      # ... (threads.WARMING)
        self._unsplit_runs: dict = {}      # batch size -> its trial's split runs that did not
        self._split_tries: dict = {}       # batch size -> trials the split driver lost
        self._unfair_tries: dict = {}      # batch size -> ... lost while a core was busy
        self._trials: dict = {}            # batch size -> ([host], [native], [split] times)
        self._turns: dict = {}             # batch size -> each driver's runs in its trial
        self.picked: dict = {}             # batch size -> the driver chosen for it
        self._picked_s: dict = {}          # batch size -> its pick's best time in the trial

    def call(self, values):
        """The step's results for the run's arguments ``values``, from the driver that serves
        their batch size (or the next one on trial)."""
        if self.native is not None:
            a = values[self._batch_arg] if values else None
            key = a.shape[0] if a is not None and a.ndim else 0
            if key < HOST_SPLIT_MIN_BATCH and isinstance(self.native, HostSlices):
                return self.host(values)  # (as without it: nothing to slice)
            fn = self.picked.get(key)
            if fn is not None:
                return fn(*values)
            return self.pick(values, key)
        if self._hot is None:
            return self.host(values)
        self._hot_runs -= 1
        t0 = time.perf_counter()
        results = self.host(values)
        self._host_best = min(self._host_best, time.perf_counter() - t0)
        if self._hot_runs <= 0:
            self._tier_up(values)
        return results

    def host(self, values):
        """The host driver on ``values``: replayed where it was recorded for their key
        (:mod:`.replay`; the step's ``call_host`` says when: not under a profiler)."""
        r = self.replay
        return self.step.call_host(values) if r is None else self.step.call_host(values, r)

    def _host_fn(self, *values):
        return self.host(values)

    @property
    def native_driver(self):
        """The step's native driver, once it has one (None: the host driver serves, maybe on
        slices of the batch)."""
        return None if isinstance(self.native, HostSlices) else self.native

    def settled(self, batch: int) -> bool:
        """Whether no driver of this step is still to be tried for this batch size (one
        compiling or waiting to be built, a trial going on, a split driver to be tried
        again): ``threads.RunChoice`` measures a plan's threads only then. It asks when a
        trial is due, in a plan served run after run: a settled step's host replays make
        their calls native now (``HostReplay.hurry``), whose replays from Python are no
        samples of that trial."""
        if self._hot is not None or self.tiering is not None and self.tiering.is_alive():
            return False
        if self.native is not None and \
                (batch >= HOST_SPLIT_MIN_BATCH or not isinstance(self.native, HostSlices)):
            fn = self.picked.get(batch)
            if fn is None or isinstance(fn, Retry):
                return False
        if self.replay is not None:
            self.replay.hurry()
        return True

    def split_seconds(self, batch: int) -> float:
        """The time of a run of this step at this batch size spent in slices of the batch on
        every free core, as its trial measured it: its pick's best time where the pick splits
        the batch over two threads or more and won against the step's drivers on every thread
        (0.0 otherwise): ``threads.RunChoice`` need not try such a step on one thread."""
        fn = self.picked.get(batch)
        if isinstance(fn, SplitDriver) and fn.parts > 1 and fn.runs:
            return self._picked_s.get(batch, 0.0)
        return 0.0

    def describe(self) -> str:
        """What the step's description adds: the driver of each batch size, or why the
        native driver was given up."""
        if self.native is not None and self.picked:
            return f" (driver by batch size: {self.drivers()})"
        if self.native_failed:
            return f" (native driver given up: {self.native_failed})"
        return ""

    def _tier_up(self, values) -> None:
        """The step is hot: build its native driver and compile it for the arguments of this
        run (on a thread of its own when :data:`TIER_UP_THREAD`); once it is ready, it is
        measured against the host driver per batch size like one built with the plan."""
        build, self._hot = self._hot, None
        if build is None:  # (another thread got here first)
            return
        calls = len(self.step.groups)
        if calls <= DRIVER_MAX_CALLS and self._host_best > DRIVER_CALL_MAX_S * calls and \
                self._more_runs > 0:  # not fast yet: timed once more
            self._more_runs -= 1
            self._hot, self._hot_runs = build, 1
            return
        if calls > DRIVER_MAX_CALLS or self._host_best > DRIVER_CALL_MAX_S * calls:
            self.native_failed = (f"it would not pay: {calls} kernel calls, the host driver's "
                                  f"best run {self._host_best * 1e3:.3f} ms")
            if self.split_rows is not None:
                self.native = HostSlices(self._host_fn)
            return
        try:  # the types this run passes: what the driver is compiled for ahead
            sig = tuple(numba.typeof(v) for v in values)
        except (TypeError, ValueError):
            sig = None

        def work():
            try:
                with threads.background():
                    nd = build()
                    if nd is not None and sig is not None:
                        nd.compile(values, sig)
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
            # of two kept the host driver. The young generations only: the compile's objects
            # are there, and a full collection holds the GIL through every object the process
            # has (Numba's included: ~1 s after a GRU classifier's driver compiled, loaded
            # machine), during which a serving run waits (one of its 0.3 ms runs took 93 ms)
            gc.collect(YOUNG)
            self.native = nd

        if not TIER_UP_THREAD:
            return work()
        # not a daemon: the interpreter waits for it at exit rather than unloading LLVM
        # under a compile that runs without the GIL
        self.tiering = threading.Thread(target=work, name="pdjit-tier-up", daemon=False)
        self.tiering.start()

    # how many runs of a batch size each driver gets before one is chosen: the first of each
    # compiles or loads, the rest are timed (runs of threads.LONG_TRIAL_S or more: one each,
    # after the first: :meth:`_lengths`)
    _WARM, _TIMED = 1, 3

    def _lengths(self, times) -> tuple:
        """``(untimed, timed)`` runs of each driver of a trial whose runs so far took
        ``times`` (``threads.trial_runs``; long runs: one timed each), the first run of each
        never timed: a driver's first runs at a batch size are its slowest (MobileNetV2 at
        batch 16 on two threads, where runs are long: the split driver's first run, its slices
        new shapes to their replays and packed weights, took 110-223 ms against the host
        driver's 51, and the host driver served at 63.0 ms a run against the split's 49.7)."""
        warm, timed = threads.trial_runs([t for ts in times for t in ts if t != float("inf")],
                                         self._WARM, self._TIMED)
        return max(warm, 1), timed

    def _need(self, times) -> tuple:
        """``(untimed, runs)``: the untimed runs of each driver of a trial and all its runs
        (:meth:`_lengths`); where runs are long (one timed each) and their times so far give a
        clear win (``threads.CHOICE_CLEAR_WIN``), ``threads.LONG_TRIAL_CONFIRM`` timed each,
        as the run choice's trial takes one: a driver's one run slowed by what no count tracks
        would pick another for the next trials' worth of runs (a split driver at batch 16: a
        run on one core)."""
        warm, timed = self._lengths(times)
        confirm = threads.LONG_TRIAL_CONFIRM
        if timed >= confirm or any(len(t) <= warm for t in times):
            return warm, warm + timed
        bests = sorted(min(t[warm:]) for t in times)
        if bests[-1] == float("inf") or len(bests) < 2 or \
                bests[1] < threads.CHOICE_CLEAR_WIN * bests[0]:
            return warm, warm + timed
        return warm, warm + confirm

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

    def _split_drivers(self, nd) -> list:
        """The native driver ``nd`` run on slices of the batch: one split driver, or one for
        each size of call of the host driver's slices (:data:`HOST_CHUNK_ROWS`); none where
        this step's may not be."""
        if self.split_rows is None or nd.parallel:
            return []
        if self._split is None or self._split[0] is not nd:
            parts = threads.max_loop_threads()
            if isinstance(nd, HostSlices):
                splits = [SplitDriver(nd.fn, self.split_rows, parts, chunk, self._host_fn)
                          for chunk in HOST_CHUNK_ROWS]
            else:
                splits = [SplitDriver(nd.fn, self.split_rows, parts)] if parts > 1 else []
            self._split = (nd, splits)
        return self._split[1]

    def pick(self, values, key):
        """Run the next trial for batch size ``key`` (none chosen yet) among the host driver,
        the native one and (a large batch, when the step's rows are independent) the native
        one on slices of the batch. Safe to call from several threads at once (a served
        model): a trial's bookkeeping may then be lost, never the run."""
        nd = self.native
        if nd is None:  # (given up by another thread's trial)
            return self.host(values)
        least = HOST_SPLIT_MIN_BATCH if isinstance(nd, HostSlices) else SPLIT_MIN_BATCH
        splits = self._split_drivers(nd) if key >= least else []
        host = self._host_fn
        if isinstance(nd, HostSlices):  # the host driver, or it on slices of the batch
            splits = [sp for sp in splits if sp.splits(key)]
            if not splits:  # (nothing to slice at this size)
                self.picked[key] = host
                return host(*values)
            drivers = (host, *splits)
        else:
            drivers = (host, nd.fn, *splits)
        times, turns = self._trials.get(key), self._turns.get(key)
        if times is None or len(times) != len(drivers) or turns is None or \
                len(turns) != len(drivers):
            times = self._trials[key] = tuple([] for _ in drivers)
            turns = self._turns[key] = [0] * len(drivers)
        # the drivers by turns, each run counted (a run not timed too: the others' first runs
        # go on meanwhile), among those still short of their timed runs
        _, need = self._need(times)
        which = min([k for k in range(len(drivers)) if len(times[k]) < need] or
                    range(len(drivers)), key=turns.__getitem__)
        turns[which] += 1
        split = drivers[which] if isinstance(drivers[which], SplitDriver) else None
        split_runs = split.runs if split is not None else 0
        loads = threads.sample_mark()  # (a compile beside the runs: no sample either)
        warming = threads.WARMING[0]
        t0 = time.perf_counter()
        if which:
            try:
                results = drivers[which](*values)
            except Exception as e:  # noqa: BLE001 - judged by what the host driver does
                results = self.step.compiled.fn(*values)  # raises too: the inputs' fault
                # the host driver got through: the native one does not compile, or is wrong
                # here; the host driver serves from now on
                self.native_failed = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                self.native = None
                self.picked.clear()
                return results
        else:
            results = host(*values)
        elapsed = time.perf_counter() - t0
        if threads.LOADS[0] != loads:  # (a kernel loaded, a replay recorded: no sample)
            unsettled = self._unsettled_runs.get(key, 0) + 1
            self._unsettled_runs[key] = unsettled
            if unsettled <= UNSETTLED_REDOS * len(drivers):
                return results
        elif threads.WARMING[0] != warming and elapsed < threads.LONG_TRIAL_S:
            # (served as it will not be for long: the host driver's runs before its replay's
            # recording, the recording's trial; run again, as a run choice's trial does: an
            # LSTM classifier's host driver, its two directions on two threads, lost to the
            # native driver's 5.1 ms, one after the other)
            warmed = self._warming_runs.get(key, 0) + 1
            self._warming_runs[key] = warmed
            if warmed <= threads.WARMING_REDOS:
                return results
        # (the split driver ran unsplit: a core was busy)
        if split is not None and split.runs == split_runs:
            redo = self._unsplit_runs.get(key, 0) + 1
            self._unsplit_runs[key] = redo
            # (one by chunks ran them on this thread, as a one-part driver does: a time of
            # what it does while the core is busy, counted; it is tried again once the cores
            # are free, below)
            if not split.chunk:
                if redo <= UNSPLIT_REDOS:  # not a time of the split: it runs again at its turn
                    return results
                # no time of the split either: a split driver that never split in its trial
                # is no candidate (under another process's load, LeNet's child picked "native
                # split x2" from unsplit times, native ones by another name, then ran 0 of 40
                # runs split)
                elapsed = float("inf")
        times[which].append(elapsed)
        warm, need = self._need(times)
        if all(len(t) >= need for t in times):
            # each driver's best timed run: what other processes do on a shared machine only
            # adds time (with medians of three, one LeNet benchmark process of two kept the
            # native driver at batch 64, 0.53 ms, over the split one, 0.33 ms)
            bests = [min(t[warm:]) for t in times]
            fastest = self._fastest(bests)
            best = drivers[fastest]
            self._picked_s[key] = bests[fastest]
            unsplit = self._unsplit_runs.get(key, 0) > UNSPLIT_REDOS
            if len(self.picked) > 64:
                self.picked.clear()
                self._picked_s.clear()
            if splits and not isinstance(best, SplitDriver):
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
                    best = Retry(best, self, key, RETRY_AFTER, RETRY_RUNS * 2 ** min(k, 5))
                elif tries < SPLIT_RETRIES:
                    self._split_tries[key] = tries + 1
                    best = Retry(best, self, key, RETRY_AFTER * 4 ** tries,
                                 RETRY_RUNS * 4 ** tries)
            elif splits and best.chunk and self._unsplit_runs.get(key, 0):
                # a split by chunks picked from runs a busy core kept on this thread: the
                # drivers tried again once the cores are free
                k = self._unfair_tries.get(key, 0)
                self._unfair_tries[key] = k + 1
                best = Retry(best, self, key, RETRY_AFTER, RETRY_RUNS * 2 ** min(k, 5))
            elif splits:
                self._unfair_tries.pop(key, None)
            self._unsplit_runs.pop(key, None)
            self._unsettled_runs.pop(key, None)
            self._warming_runs.pop(key, None)
            self.picked[key] = best
            self._trials.pop(key, None)
            self._turns.pop(key, None)
        return results

    @staticmethod
    def _fastest(times) -> int:
        """The driver to keep: the least time (the first of equals)."""
        return min(range(len(times)), key=times.__getitem__)

    def drivers(self) -> dict:
        """The driver that serves each batch size tried so far: ``"host"``, ``"native"`` or
        ``"native split xN"`` (on N slices of the batch at once)."""
        nd = self.native

        def name(fn):
            if isinstance(fn, Retry):
                again = "drivers" if isinstance(fn.fn, SplitDriver) else "split"
                return f"{name(fn.fn)} ({again} to be tried when the cores are free)"
            if isinstance(fn, SplitDriver):
                by = f" by {fn.chunk} rows" if fn.chunk else ""
                if fn.parts < 2:
                    return f"host{by}"
                return f"{'host' if isinstance(nd, HostSlices) else 'native'} split " \
                    f"x{fn.parts}{by}"
            return "native" if nd is not None and fn is nd.fn else "host"
        return {k: name(fn) for k, fn in sorted(self.picked.items())}


class HostSlices:
    """What stands for a step's native driver where none pays (many or long kernel calls:
    a CNN's whole-model step) but the step's ops keep batch rows independent: the host driver
    itself, run on slices of a batch of :data:`HOST_SPLIT_MIN_BATCH` or more at once
    (:class:`SplitDriver`), each slice's kernels on its own thread alone
    (``threads.one_thread``): each core runs the whole network on its rows, with no
    hand-over between layers and its activations in its own caches; each slice by
    few rows a call, a split driver for each size of :data:`HOST_CHUNK_ROWS` (on one
    thread: the whole batch by such calls). At batch 16 on two threads, the two drivers by
    turns in one process, medians (ms, split / host driver with each kernel split over the
    threads): MobileNetV2 69.8 / 73.7, a 6-layer BERT-like encoder 119 / 124, ResNet-50 637 /
    640 (each of its kernels splits well); by 4 rows a call 65.7, 114.4 and 607."""
    parallel = False

    def __init__(self, host):
        self.host = host

    def fn(self, *values):
        with threads.one_thread():
            return self.host(*values)


class SplitDriver:
    """A native driver run on ``parts`` contiguous slices of the batch at once
    (``threads.run_parts``): the arguments at ``rows`` sliced on dim 0, the others whole, each
    output the slices' outputs concatenated; with ``chunk``, by ``chunk`` rows a call (more
    where a slice would make more than :data:`HOST_MAX_CHUNKS` calls), the ``parts`` threads
    each making the next call none has made yet (:meth:`_shared`; one part: the caller's
    thread alone, by such calls).
    A batch that does not split here (too small, the row arguments' leading dims differ, an
    output without the slice's rows) runs the driver unsplit, which then does what it does
    with it; so does a run of several parts while other processes keep a core busy
    (``threads.slice_threads``, at most the free cores: a slice waiting for a busy core would
    hold up the run) or a run kept on one thread (``threads.RunChoice``). ``runs``: the runs
    that were split. ``rest``: a driver of the whole step on every thread (the host driver,
    each kernel split over the threads) that takes a batch's last row where the parts would
    otherwise be one row apart, after them (a batch of 3 on two threads: a row a part, then
    one on both). A driver by chunks that cannot split for want of free cores runs the whole
    batch by its chunks on the caller's thread (as a one-part driver does; not counted in
    ``runs``): MobileNetV2 at batch 16 with another process keeping a core busy took 105 ms
    a run unsplit at once and 82 ms by chunks of 4 rows, as on one thread."""

    def __init__(self, fn, rows, parts: int, chunk: int = 0, rest=None):
        self.fn, self.rows, self.parts, self.chunk = fn, tuple(rows), parts, chunk
        self.rest = rest
        self.runs = 0

    def splits(self, b: int) -> bool:
        """Whether a batch of ``b`` rows is split (the cores free)."""
        return min(self.parts, b // self._least) >= 2 or self.parts < 2 and 0 < self.chunk < b

    @property
    def _least(self) -> int:
        """The fewest rows of a part: one for the host driver's slices (a step of many or long
        kernels, :class:`HostSlices`), two for a native driver's."""
        return 1 if self.chunk else 2

    def _sliced(self, values, lo: int, hi: int) -> list:
        """``values`` with the row arguments cut to rows ``lo .. hi`` (the others as they are:
        a step's parameters, a hundred of them)."""
        cut = list(values)
        for i in self.rows:
            cut[i] = values[i][lo:hi]
        return cut

    def _shared(self, calls, parts: int) -> list:
        """``[fn(*args) for args in calls]`` on ``parts`` threads at once: each makes one of the
        first ``parts`` calls, then the next call none has taken yet, so that a core that runs
        slower than the other (another process's work on it, a busy neighbour of the virtual
        machine) makes fewer of them rather than holding up the run with a fixed share. At
        batch 16 on two threads, by turns in one process against fixed halves (a 2-vCPU AMD
        EPYC, ms): with another process busy 30 % of the time on a core, MobileNetV2 67.3 /
        73.1 (one row a call), ResNet-50 612 / 668 (four); quiet, 59.2 / 59.0 and 541 / 540.
        A failed call stops the taking and is raised once every thread is done."""
        taken, lock, failed = iter(range(parts, len(calls))), threading.Lock(), []

        def take(k):
            done = []
            while k is not None and not failed:
                try:
                    done.append((k, self.fn(*calls[k])))
                except BaseException:
                    failed.append(k)
                    raise
                with lock:
                    k = next(taken, None)
            return done

        outs = [None] * len(calls)
        for done in threads.run_parts(take, [(p,) for p in range(min(parts, len(calls)))],
                                      parts - 1):
            for k, out in done:
                outs[k] = out
        return outs

    def __call__(self, *values):
        rows = self.rows
        lead = values[rows[0]]
        b = lead.shape[0] if lead.ndim else 0
        parts = 1 if self.parts < 2 else min(self.parts, b // self._least,
                                             threads.slice_threads())
        # (fewer cores free than parts: unsplit, but by its chunks still where it has them)
        busy = parts < 2 <= self.parts
        if not self.splits(b) or busy and not self.chunk or \
                any(values[i].ndim == 0 or values[i].shape[0] != b for i in rows):
            return self.fn(*values)
        odd = self.rest is not None and parts > 1 and b % parts == 1 and b > parts
        cuts = [(b - odd) * p // parts for p in range(parts + 1)]
        if self.chunk:  # each part's rows by calls of `chunk` rows (at most HOST_MAX_CHUNKS)
            pieces = [[(a, min(a + step, hi)) for a in range(lo, hi, step)]
                      for lo, hi in zip(cuts, cuts[1:])
                      for step in (max(self.chunk, -(-(hi - lo) // HOST_MAX_CHUNKS)),)]
        else:
            pieces = [[(lo, hi)] for lo, hi in zip(cuts, cuts[1:])]
        calls = [[self._sliced(values, lo, hi) for lo, hi in part] for part in pieces]
        if not self.chunk:
            outs = threads.run_parts(self.fn, [part[0] for part in calls], parts - 1)
        else:  # (the parts' calls in the rows' order)
            calls = [c for part in calls for c in part]
            outs = self._shared(calls, parts) if parts > 1 else [self.fn(*c) for c in calls]
        if odd:  # the last row, on every thread
            outs.append(self.rest(*self._sliced(values, b - 1, b)))
            pieces.append([(b - 1, b)])
        for got, (lo, hi) in zip(outs, [r for part in pieces for r in part]):
            if any(r.ndim == 0 or r.shape[0] != hi - lo for r in got):
                return self.fn(*values)  # (not rows after all: the whole batch at once)
        if not busy:
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
#: runs of a batch size's driver trial in which a kernel was loaded or a host replay recorded
#: (``threads.LOADS`` moved: the recording run replays to check itself, about twice a run's
#: time) that are run again rather than timed, for each candidate of the trial, before the
#: trial takes such runs' times
UNSETTLED_REDOS = 8
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


class Retry:
    """The driver ``fn`` picked for a batch size over its split driver (or a split one by
    chunks picked from runs a busy core kept on the caller's thread): it serves, and the
    first run at least ``wait`` seconds or ``runs`` runs after the pick (then
    :data:`RETRY_AFTER` seconds or :data:`RETRY_RUNS` runs after each check) that finds the
    cores free drops the pick, so that the next run of that size tries the drivers again."""
    __slots__ = ("fn", "owner", "key", "after", "runs")

    def __init__(self, fn, owner, key, wait: float = RETRY_AFTER, runs: int = RETRY_RUNS):
        self.fn, self.owner, self.key = fn, owner, key  # owner: the DriverTiers (``picked``)
        self.after = time.monotonic() + wait
        self.runs = runs

    def __call__(self, *values):
        self.runs -= 1
        now = time.monotonic()
        if self.runs <= 0 or now >= self.after:
            self.after, self.runs = now + RETRY_AFTER, RETRY_RUNS
            if threads.free_cores() >= 2 and self.owner.picked.get(self.key) is self:
                self.owner.picked.pop(self.key, None)
        return self.fn(*values)


