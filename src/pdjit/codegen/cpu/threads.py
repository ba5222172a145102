"""How many threads pdjit's compiled code uses.

Two kinds of threads, set apart because they were measured apart on a 2-vCPU machine:

- Large elementwise loops (the ``flat``, ``row`` and ``mid`` forms, at least
  ``PARALLEL_MIN_SIZE`` elements) run on every core by default: their parallel variant
  (``numba.prange``) is compiled when a run first reaches that size, and the chain benchmark
  then runs near the all-core memory bound. The threads of Numba's OpenMP threading layer
  poll for their next loop for ~0.2-0.7 ms (by the CPU) before they sleep (``GOMP_SPINCOUNT``,
  :data:`TEAM_SPINS`, set when pdjit is imported unless the user set it or
  ``OMP_WAIT_POLICY``), and are kept off the core of the thread that starts the loops
  (:func:`place_team`): a loop then starts in microseconds, not in the tens of an idle core's
  wake-up (their unbounded default polling, with a thread left on the caller's core, cost
  ~8 ms per call when the other core was busy).
- BLAS calls (``np.dot``; SciPy's OpenBLAS inside Numba, NumPy's in the host driver, set
  only while a plan runs: the user's own NumPy keeps its threads) run on one thread in every
  run, whatever count is asked for (:func:`blas_threads`): an MLP forward at batch 128 took
  0.37 ms with one BLAS thread and 4.0 ms with two (threads fight over too few cores), and
  OpenBLAS's workers spin after each call, holding up pdjit's own splits. The loops of opaque
  lowerings stay on one thread by default.
- Except a large GEMM from a host driver (``_rt.gemm``, ``_nn.batched_gemm``): from
  ``GEMM_PARALLEL_MIN_WORK`` multiply-adds (M*N*K, 2**25) it runs on every core
  (``gemm_threads``). Measured on the 2-vCPU machine, float32, NumPy's OpenBLAS, medians of 7
  (1 vs 2 threads, ms): 128x64x256 0.045/0.032, 128x256x256 0.17/0.10, 512x256x256
  0.66/0.35, 1024x256x256 1.30/0.68, 1024x256x1024 5.4/2.8; with a busy process on the
  other core the small products lose with two (128x64x256 0.045/0.060, 256x128x256
  0.17/0.20) and the large still mostly win (512x512x512 4.7/3.0, 1024x1024x256 9.2/5.8).
  The MLP's products (at most 128x256x256, 8.4M) stay on one thread; the transformer
  encoder layer's projections (1024x256x256) and feed-forward products (1024x256x1024) go
  on every core. A batched product (attention's 32 products of 128x64x128) of that much
  work in all is split over the loop threads, each part a compiled loop of one-thread
  ``np.dot`` (NumPy's ``matmul`` holds the GIL, and BLAS threads per 1M-multiply-add slice
  gain little): 0.74 -> 0.45 ms for [32,128,64] x [32,64,128]. Only free cores count
  (``free_cores``: other processes' CPU time over the last ~0.1 s): while another process
  kept a core busy, two OpenBLAS threads took 4-8 ms for a 1.3 ms product, and the whole
  encoder layer 60 ms against 24 ms on one thread. After a multi-threaded call NumPy's
  OpenBLAS workers are stopped (they spin for 50 ms and more otherwise, taking the core
  from the next parallel loop); starting them again costs ~50 us.
- The library kernels of the vision ops (``pdjit.codegen.cpu.lib``) split a large batch into
  slices, one per loop thread, each slice on one BLAS thread (the kernels release the GIL):
  a 3x3 convolution of [32, 32, 16, 16] took 3.9 ms on one thread and 2.05 ms on two. (With
  OpenBLAS's own threads on instead, concurrent calls serialise: no gain.)

- A native driver (a whole segment as one Numba function, ``codegen.cpu.tiers``) whose ops keep
  batch rows independent may run on contiguous slices of its batch at once, one slice per loop
  thread (:func:`run_parts`; the driver releases the GIL): LeNet-5 at batch 64 took 0.53 ms on
  one thread and 0.34 ms on two slices of 32 (driver calls alone, 2-vCPU machine). Its library
  kernels then run each slice on one thread, as they do in any native driver. The helper
  threads are kept off the core of the thread that hands them their slices (left to the
  scheduler, both slices often ran on one core, one after the other).
- A convolution of one sample (batch 1) is split over its output channels instead
  (``lib.conv.split_channels``), and a product by a weight of one sample over its rows
  (``lib.pgemm.weight_rows``): by a parallel loop (``lib.team``: native threads, no GIL,
  from 2 M multiply-adds) once that loop is on disk (compiled by ``pdjit warmup`` or the
  background warmup, loaded from a process's third run on: ``lib.team.ready``), else on
  :func:`run_parts`' helpers from 16 M: ResNet-50 at batch 1 took 78 ms on one
  thread and 51 ms on two by the helpers, 43 ms by the loops; MobileNetV2 7.8-8.4 and
  7.0-7.3 ms.

``set_num_threads(n)`` or ``PDJIT_NUM_THREADS=n`` sets the loop threads and the host driver's
GEMMs to ``n`` (every GEMM, whatever its size; one means no split batches either). Set it
before building programs: plans already compiled keep their loops.

Every count is a most, not a promise: each run (``begin_run``, called by the Executor before a
plan runs) and each split decision in it (``loop_threads``, ``blas_threads``,
``gemm_threads``) uses at most the cores other processes leave free (``free_cores``), so that
a multi-threaded setting on a machine whose cores are busy runs as one thread does: the
caller's thread does the work rather than wait for a thread that waits for a busy core. (The
split helpers wait on locks, OpenMP's threads poll for a bounded time; but a split call
still ends with its slowest part, and on a busy core that part waits for a scheduler slice,
milliseconds, at every step of a recurrent model.) Where the cores are free,
each plan measures for each batch size whether its runs are faster on them or on the caller's
thread alone, and keeps the faster (``RunChoice``): threads that do not pay for their wake-ups
on small work, or lose to a core another process keeps half busy, are not used.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import threading
import time

import numpy as np

#: how long a thread of the parallel loops' team polls for its next loop before it sleeps, in
#: OpenMP's (libgomp's) count of polls: ~0.2-0.3 ms on the 2-vCPU Intel Xeon (a loop started
#: 0.2 ms after the last found the team polling, 0.4 ms after, asleep); a poll's pause is
#: longer on an AMD EPYC of the Zen 4 kind: there a loop started 0.6 ms after the last took
#: 8 us, 0.8 ms after, 41 us (asleep), so that a ``run_parts`` helper started within ~0.7 ms
#: of a parallel loop shares its core with the polling thread. Set before the OpenMP
#: runtime loads (Numba loads it at the first parallel loop), unless the user set its wait
#: policy or count (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``).
TEAM_SPINS = 30000
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = str(TEAM_SPINS)

_applied = None


def _openblas(libs_dir: str) -> tuple:
    """(set, get) thread-count functions of the OpenBLAS bundled in ``libs_dir`` (None each
    when there is none)."""
    for path in glob.glob(os.path.join(libs_dir, "*openblas*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pre in ("scipy_openblas_", "openblas_"):
            for suf in ("64_", ""):
                set_ = getattr(lib, f"{pre}set_num_threads{suf}", None)
                get = getattr(lib, f"{pre}get_num_threads{suf}", None)
                if set_ is not None:
                    set_.argtypes, set_.restype = [ctypes.c_int], None
                    if get is not None:
                        get.argtypes, get.restype = [], ctypes.c_int
                    return set_, get
    return None, None


def _site(module) -> str:
    return os.path.dirname(os.path.dirname(module.__file__))


def _openblas_setters() -> list:
    """``set_num_threads`` of the OpenBLAS that SciPy (and so Numba's ``np.dot``) uses. The
    library is found without importing ``scipy.linalg`` (a quarter of a second at start-up):
    loading it by path here is what SciPy's BLAS module links to when it loads later."""
    import importlib.util

    spec = importlib.util.find_spec("scipy")
    if spec is None or not spec.submodule_search_locations:
        return []
    site = os.path.dirname(list(spec.submodule_search_locations)[0])
    set_, _ = _openblas(os.path.join(site, "scipy.libs"))
    return [set_] if set_ is not None else []


_numpy_blas = None


class numpy_blas:  # noqa: N801 - used as a context manager, like a function
    """NumPy's OpenBLAS (the host driver's GEMMs) at pdjit's BLAS thread count for the run
    (:func:`blas_threads`) while a plan runs, and at the user's own count again afterwards."""
    __slots__ = ("prev",)

    def __enter__(self):
        global _numpy_blas
        if _numpy_blas is None:
            _numpy_blas = _openblas(os.path.join(_site(np), "numpy.libs"))
        set_, get = _numpy_blas
        self.prev = None
        if set_ is not None and get is not None:
            want = blas_threads()
            have = get()
            if have != want:
                set_(want)
                self.prev = have
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            _numpy_blas[0](self.prev)
        return False


def numpy_blas_calls(fn):
    """``fn`` (NumPy's calls standing in for a library kernel) with NumPy's OpenBLAS at the
    run's BLAS thread count (:class:`numpy_blas`): a plan of library kernels runs outside
    it, and OpenBLAS's workers, at the machine's core count, spun on the other core after
    each product (a cold SqueezeNet's stand-ins kept it busy, the worker compiling their
    kernels beside the runs waited 40 s)."""
    @functools.wraps(fn)
    def calls(*args):
        with numpy_blas():
            return fn(*args)
    return calls


def set_num_threads(n: int) -> bool:
    """Use ``n`` threads in parallel loops, split work and host GEMMs (compiled code's BLAS
    outside a run too; a run keeps it on one: :func:`blas_threads`); False if that BLAS
    cannot be set."""
    global _applied
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    setters = _openblas_setters_cached()
    for fn in setters:
        fn(n)
    import numba

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    _applied = n
    _run_blas[0] = n
    _run_local.loops = _run_local.key = None
    return bool(setters)


def get_num_threads() -> int:
    """Threads for BLAS calls and opaque lowerings' loops (default 1)."""
    return _applied if _applied is not None else default_num_threads()


#: multiply-adds (M*N*K) from which one host-driver GEMM uses every core when no thread count
#: was asked for (see the module docstring for the measurements)
GEMM_PARALLEL_MIN_WORK = 1 << 25

#: a list to record ``(work, threads)`` of every ``gemm_threads`` decision in (tests), or None
gemm_trace = None


def asked_threads() -> bool:
    """Whether a thread count was asked for (``set_num_threads`` or ``PDJIT_NUM_THREADS``,
    read once, with :func:`default_num_threads`: every run asks)."""
    if _applied is not None:
        return True
    if _default_threads is None:
        default_num_threads()
    return _env_asked


def gemm_threads(work: int) -> int:
    """BLAS threads for one GEMM of ``work`` multiply-adds: the count asked for when there is
    one, else every core Numba may use, from ``GEMM_PARALLEL_MIN_WORK`` (one thread below it);
    either at most the cores other processes leave free (``free_cores``)."""
    if asked_threads():
        n = min(get_num_threads(), _usable())
    elif work >= GEMM_PARALLEL_MIN_WORK:
        import numba

        n = max(1, min(numba.config.NUMBA_NUM_THREADS, _usable()))
    else:
        n = 1
    if gemm_trace is not None:
        gemm_trace.append((int(work), n))
    return n


def sched_times():
    """``(thread id, seconds on a core, seconds runnable but waiting for one)`` of the calling
    thread and the split helpers (``run_parts``) together, from the scheduler's own counts
    (Linux's ``/proc/self/task/<id>/schedstat``: nanoseconds, not ticks; ~1 us per thread), or
    None where that cannot be read."""
    me = native_id()
    run = wait = 0
    for tid in (me, *list(_helper_tids)):
        try:
            fields = _proc_read(f"/proc/self/task/{tid}/schedstat").split()
            run += int(fields[0])
            wait += int(fields[1])
        except (OSError, ValueError, IndexError):
            if tid == me:
                return None
            # (a helper gone: its counts are no longer anyone's)
    return me, run * 1e-9, wait * 1e-9


_proc_fds: dict = {}  # a /proc file's path -> a descriptor kept open on it (``_proc_read``)


def _proc_read(path: str) -> bytes:
    """The first 256 bytes of the ``/proc`` file ``path``, read again from its start on a
    descriptor kept open: ~0.8 us, where opening, reading and closing ``/proc/self/task/<id>/
    schedstat`` took ~9 us alone and 70-90 us inside a run on two threads (by turns in one
    process, runs on two threads with the descriptors kept / the files opened at each read:
    MobileNetV2 at batch 2 0.977-0.993x, at batch 1 0.989-0.992x, a BERT-like encoder at
    batch 1 0.987x). A file that cannot be read (its thread gone) is opened again once."""
    for _ in range(2):
        fd = _proc_fds.get(path)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            kept = _proc_fds.setdefault(path, fd)
            if kept != fd:  # (another thread opened it meanwhile)
                os.close(fd)
                fd = kept
        try:
            return os.pread(fd, 256, 0)
        except OSError:
            if _proc_fds.get(path) == fd:
                del _proc_fds[path]
                os.close(fd)
    raise OSError(f"{path}: cannot be read")


def _forget_proc_fds() -> None:
    """In a forked child: the kept descriptors name the parent's threads."""
    for fd in _proc_fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _proc_fds.clear()


#: the share of its time that this process's running threads (the caller of ``free_cores``
#: and the split helpers) may wait for a core over a window of at least ``WAITED_WINDOW``
#: seconds (and at least ``WAITED_MIN`` seconds of waits) before a core counts as busy
#: whatever ``/proc/stat`` says. Measured on the 2-vCPU machine, LeNet at batch 64 run split,
#: 60 runs at a time: 0-3% with the other core idle; 27-31% while the two slices shared one
#: core or another process ran a burst (split runs 0.54 ms then, against 0.33). In a drivers'
#: trial under another process's tests, the main thread waited 10-20% of the trial, and every
#: driver ran slow (host 0.79 ms, split 0.73, native 0.57 against 0.52 / 0.36 / 0.53), the
#: split most: it waits for both cores. The window is short (the scheduler counts in
#: nanoseconds), so that a trial of a few milliseconds is judged on its own waits.
WAITED_SHARE, WAITED_MIN, WAITED_WINDOW = 0.05, 0.0005, 0.005
#: ... unless this process's threads together ran on more than all but this share of a core
#: of every core over the window: then they waited for each other (a split's hand-offs, each
#: wake-up ~0.1-0.2 ms on this machine's virtual cores), not for another process. DenseNet-121
#: at batch 16 on two threads, each kernel split over the team's threads and the split
#: helpers, windows of 5-12 ms: with the other core idle, the caller waited 6-35 % of them
#: while the process ran 1.09-1.48 cores (8 windows of 10 counted a core busy without this
#: test, 2 with it, and the split driver tried after such a run ran on one thread in every
#: trial: 0.85-1.2 s against 0.4-0.5 split); with a busy loop on the other core, 0.52-1.02
#: cores (15 windows of 15 still counted busy)
OWN_BUSY_SLACK = 0.8
#: this process's CPU seconds, every thread's (``CLOCK_PROCESS_CPUTIME_ID``: nanoseconds)
_process_seconds = time.process_time

_CORES = os.cpu_count() or 1
# [(time, busy seconds of every core, this process's cpu seconds), others]
_load = [None, 0.0]
#: a process that asked for the free cores last this many seconds ago or more was idle since:
#: the busy time of that window is another time's. A benchmark's other contenders, run between
#: this process's rounds, had made the 2-thread runs of a BERT-like encoder at batch 1 one-thread
#: runs for the first tenth of a second of each round (``bench_models.py``: 17.3 and 19.1 ms,
#: one thread 19.5 and 18.3; with the window dropped 11.2-14.2 ms, ONNX Runtime 9.5-12.6); with a
#: busy loop on the other core, 2 threads took 0.88-1.01x the one-thread runs
IDLE_S = 0.25
_asked = [float("-inf")]  # when free_cores was last asked
# [(time, sched_times(), process CPU seconds) of the last window's start, whether our threads
# waited in it]
_waits = [None, False]


def _cpu_seconds() -> tuple:
    """(busy seconds of every core since boot, or None where unknown; CPU seconds of this
    process and of the children it waited for)."""
    try:
        fields = _proc_read("/proc/stat").split(b"\n", 1)[0].split()
        ticks = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal
        busy = (sum(int(v) for v in fields[1:4]) + sum(int(v) for v in fields[6:9])) / ticks
    except (OSError, ValueError, IndexError):
        return None, 0.0
    t = os.times()
    # (with the children this process waited for: a compile worker it forked is not
    # another process keeping a core busy once it has ended; and the background warmups it
    # started, which run on idle cores only and give way to this process's threads: counted
    # busy, a 2-thread run fell back to one thread while one compiled)
    return busy, t.user + t.system + t.children_user + t.children_system + \
        _warmup_seconds(ticks)


_warmups: dict = {}  # pid of a background warmup this process started -> its CPU seconds


def _warmup_seconds(ticks) -> float:
    """CPU seconds of the background warmups this process started (``pdjit.codegen.diskcache
    .start_background_warmup``) and has not reaped, each as last read from
    ``/proc/<pid>/stat`` (its own and its ended children's). (A reaped one is counted in
    ``os.times``' children already.)"""
    from pdjit.codegen import diskcache

    total = 0.0
    for proc in diskcache._background:
        if proc.returncode is not None:
            continue
        seconds = _warmups.get(proc.pid, 0.0)
        try:
            with open(f"/proc/{proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            seconds = sum(int(v) for v in fields[11:15]) / ticks  # utime stime cutime cstime
            _warmups[proc.pid] = seconds
        except (OSError, ValueError, IndexError):
            pass
        total += seconds
    return total


def free_cores() -> int:
    """The cores that other processes leave free: the machine's cores less the cores they kept
    busy over the last tenth of a second or so (``/proc/stat``'s busy time less the CPU time
    of this process and of the children it waited for, sampled at most every 0.1 s: a ~7 us
    read), and at most all but one while this process's threads waited for a core more than
    ``WAITED_SHARE`` of their time over the last few milliseconds (``sched_times``, read at
    most every ``WAITED_WINDOW``: ``/proc/stat`` counts 10 ms ticks, rounds a fraction of a
    core to none and has nothing to say in a process's first tenth of a second, while another
    process's burst already slows every thread of ours); every core where that cannot be read.
    A thread that waits for a busy core holds up every thread of a split product (measured: a
    1024x256x256 GEMM went from 1.3 ms on one thread to 4-8 ms on two while another process
    kept a core busy). A window this process was idle through (:data:`IDLE_S`) is dropped: the
    count of the last window it ran in stands. (``/proc/loadavg``'s count of running tasks is
    no use: on this machine it counted one more than ``ps`` showed running.)"""
    cores = _CORES
    now = time.monotonic()
    last = _load[0]
    idle = now - _asked[0] > IDLE_S
    _asked[0] = now
    if last is None or now - last[0] >= 0.1:
        busy, mine = _cpu_seconds()
        if busy is None:
            return cores
        if last is not None and not idle:
            # (a window this process was idle through says what other processes did then, not
            # now: dropped, the last window's count stands until the next one closes)
            _load[1] = max(0.0, (busy - last[1]) - (mine - last[2])) / (now - last[0])
        _load[0] = (now, busy, mine)
    w = _waits[0]
    if w is None or now - w[0] >= WAITED_WINDOW:
        sched, own = sched_times(), _process_seconds()
        if sched is None:
            _waits[1] = False
        elif w is not None and w[1][0] == sched[0]:  # (another thread's counts: no window)
            ran, waited = sched[1] - w[1][1], sched[2] - w[1][2]
            # (waits while this process's own threads kept the cores busy are no other
            # process's: its team's threads, polling after a parallel loop, beside a split's
            # helpers, or more parts than cores)
            _waits[1] = waited >= WAITED_MIN and waited > WAITED_SHARE * (ran + waited) and \
                own - w[2] < (cores - OWN_BUSY_SLACK) * (now - w[0])
        _waits[0] = None if sched is None else (now, sched, own)
    others = max(_load[1], 1.0) if _waits[1] else _load[1]
    return max(1, cores - int(others + 0.5))


def numpy_gemm(a, b, n: int):
    """``np.dot(a, b)`` with NumPy's OpenBLAS on ``n`` threads for this call, its count before
    afterwards, and its worker threads stopped: they would spin for tens of milliseconds
    after the call (seen running 50 ms later), taking the core from the next parallel loop
    and showing as a busy core to ``free_cores``. (Starting them again at the next large
    product costs tens of microseconds; the products given more than one thread take 0.65 ms
    or more on one.)"""
    return with_numpy_blas(n, np.dot, a, b, stop_workers=True)


_numpy_blas_stop = None


def with_numpy_blas(n: int, fn, *args, stop_workers: bool = False):
    """``fn(*args)`` with NumPy's OpenBLAS on ``n`` threads (its count before afterwards;
    ``stop_workers``: its worker threads stopped after the call, when the library says how)."""
    global _numpy_blas, _numpy_blas_stop
    if _numpy_blas is None:
        _numpy_blas = _openblas(os.path.join(_site(np), "numpy.libs"))
    set_, get = _numpy_blas
    if set_ is None or get is None:
        return fn(*args)
    have = get()
    if have == n:
        return fn(*args)
    set_(n)
    try:
        return fn(*args)
    finally:
        set_(have)
        if stop_workers and n > 1 and have == 1:
            if _numpy_blas_stop is None:
                _numpy_blas_stop = _openblas_stop(os.path.join(_site(np), "numpy.libs")) or False
            if _numpy_blas_stop:
                _numpy_blas_stop()


def _openblas_stop(libs_dir: str):
    """The function that stops the worker threads of the OpenBLAS in ``libs_dir`` (they start
    again at its next multi-threaded call), or None."""
    for path in glob.glob(os.path.join(libs_dir, "*openblas*")):
        try:
            fn = getattr(ctypes.CDLL(path), "blas_thread_shutdown_", None)
        except OSError:
            continue
        if fn is not None:
            fn.argtypes, fn.restype = [], ctypes.c_int
            return fn
    return None


def max_loop_threads() -> int:
    """The most threads parallel loops and split batches may use: the number asked for, else
    every core Numba may use. What plans are built for (whether a loop gets a parallel
    variant); how many run now is :func:`loop_threads`."""
    if asked_threads():
        return get_num_threads()
    if _numba_threads[0] is None:
        import numba

        _numba_threads[0] = numba.config.NUMBA_NUM_THREADS  # (fixed once Numba is imported)
    return _numba_threads[0]


_numba_threads = [None]


def _usable(slices: bool = False) -> int:
    """The cores work started now may use: the free cores, at most the cap of the run in
    progress on this thread (``begin_run``'s ``cap``: a run that a :class:`RunChoice` keeps on
    the caller's thread); one on a thread that may not start a team while another has one
    (:func:`other_team`), but for ``slices`` of a batch (each on a thread alone)."""
    cap = getattr(_run_local, "cap", None)
    if cap is not None and cap <= 1 or not slices and other_team():
        return 1  # (the free cores not counted: a one-thread run asks at every kernel call)
    n = free_cores()
    if n < getattr(_run_local, "free", 0) and (cap is None or cap > n):
        NARROWED[0] += 1
    return n if cap is None or cap >= n else cap


#: the times work started on fewer free cores than its run began with (:func:`_usable`: a
#: core another process took meanwhile, or one our own threads waited for): a host replay's
#: recording made meanwhile is not kept (it would replay the narrowed calls at every run after
#: the core is free again: an LSTM classifier at batch 1 on two threads, recorded while its
#: threads waited for a core, ran its two directions one after the other for good, 5.3-5.5 ms
#: a run against 2.9-3.1)
NARROWED = [0]


def loop_threads() -> int:
    """Threads for a parallel loop or a split batch started now: :func:`max_loop_threads`, at
    most the cores other processes leave free (``free_cores``) and the run's cap. A part of the
    work handed to a thread that waits for a busy core holds up the whole call: the call then
    runs on the caller's thread instead."""
    most = max_loop_threads()
    return 1 if most <= 1 else max(1, min(most, _usable()))


def slice_threads() -> int:
    """Threads for slices of a batch started now, each slice on a helper kept to one thread
    (``tiers.SplitDriver``): :func:`loop_threads`, on a thread that may not start a team
    (:func:`other_team`) too."""
    if not other_team():
        return loop_threads()
    most = max_loop_threads()
    return 1 if most <= 1 else max(1, min(most, _usable(slices=True)))


def blas_threads() -> int:
    """BLAS threads for the calls of a run (compiled code's ``np.dot``, the host driver's
    NumPy BLAS): one, whatever the count asked for. pdjit's threads split the work themselves
    (batches and a sample's convolution channels over :func:`run_parts`, products over
    :func:`gemm_threads`, whose NumPy workers are stopped after each call); OpenBLAS's own
    workers spin for a while after every call, taking the core from the next split: with
    ``set_num_threads(2)`` and two BLAS threads in the run, ResNet-50 at batch 1 (its
    convolutions split by output channels) took 98-160 ms a run, against 52 ms with BLAS on
    one thread and 80 ms on one thread in all."""
    return 1


# what ``begin_run`` last applied: [compiled code's BLAS threads]; Numba's count is per thread
_run_blas = [None]
_run_local = threading.local()


def native_id() -> int:
    """The calling thread's kernel id, kept in its thread-local state (``threading
    .get_native_id`` asks the system each time: ~0.17 us, twice for each kernel a run splits)."""
    try:
        return _run_local.tid
    except AttributeError:
        tid = _run_local.tid = threading.get_native_id()
        return tid


def begin_run(cap: int | None = None) -> None:
    """Before a plan runs on the calling thread: compiled code's BLAS (SciPy's OpenBLAS: one
    process-wide count) at :func:`blas_threads` and Numba's parallel loops on this thread at
    :func:`loop_threads`, each set only when it changed (a quarter and one microsecond);
    ``cap``: at most this many threads in the run (None: no cap but the free cores).

    Measured on the 2-vCPU machine with another process keeping one core busy, batch 1,
    ``set_num_threads(2)`` against one thread, medians: a GRU classifier (one layer, 128
    hidden, 32 steps) 0.21 ms on one thread and 16-54 ms on two; a 2-layer bidirectional LSTM
    classifier (256 hidden, 64 steps) 24 ms and 173 ms. A thread of a split call (two
    OpenBLAS threads for each step's small product, a parallel loop's half) that the busy
    core keeps waiting holds up every step; with the counts capped at the free cores each
    run, the two-thread runs are the one-thread runs."""
    runs[0] += 1
    now = time.perf_counter()
    if _began[0] is not None and now - _began[0] < _began[1]:
        _began[1] = now - _began[0]
    _began[0] = now
    if not _default_applied and _applied is None:
        ensure_applied()
    local = _run_local
    local.cap = cap
    # (a run kept on one thread needs no count of the free cores: read each run otherwise)
    # (another thread's team: every loop and split of this thread's runs on it alone)
    free = 1 if cap == 1 or other_team() else free_cores()
    local.free = free  # (fewer free cores later in the run: NARROWED)
    key = (cap, free, _applied)
    if getattr(local, "key", None) == key and _run_blas[0] == local.blas:
        return  # (as the last run on this thread: ~1 us a run)
    usable = free if cap is None or cap >= free else max(1, cap)  # (_usable)
    n = blas_threads()
    if n != _run_blas[0]:
        for fn in _openblas_setters_cached():
            fn(n)
        _run_blas[0] = n
    loops = max(1, min(max_loop_threads(), usable))  # (loop_threads)
    if loops > 1:
        place_team(discover=False)  # (the caller may have moved since its last run)
    if getattr(local, "loops", None) != loops:
        import numba

        numba.set_num_threads(min(loops, numba.config.NUMBA_NUM_THREADS))
        local.loops = loops
    local.key, local.blas = key, n


class one_thread:  # noqa: N801 - a context manager, used as a statement
    """Work on this thread that must not split itself over threads (a slice of a batch that
    is already split, one slice a thread): meanwhile the run's cap is one thread (the library
    kernels' splits, ``gemm_threads``) and so is Numba's count for this thread's parallel
    loops; both are restored after."""
    __slots__ = ("cap", "loops")

    def __enter__(self):
        import numba

        local = _run_local
        self.cap, self.loops = getattr(local, "cap", None), numba.get_num_threads()
        local.cap = 1
        if self.loops != 1:
            numba.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        import numba

        _run_local.cap = self.cap
        if self.loops != 1:
            numba.set_num_threads(self.loops)
        return False


#: runs of a plan at one batch size before its threads are measured (the first compiles or
#: loads kernels; the plan's driver trials, ``pdjit.codegen.cpu.tiers.DriverTiers``, are waited for
#: through ``RunChoice.ready``)
CHOICE_AFTER = 4
#: timed runs of each setting in a trial (after an untimed one of each)
CHOICE_RUNS = 3
#: runs and seconds (both) from a pick to the next trial; doubled at each trial that keeps the
#: pick, up to 64x
CHOICE_RETRY_RUNS, CHOICE_RETRY_S = 32, 2.0
#: ... but the seconds after a first pick that won by less than :data:`CHOICE_CLEAR_WIN`: a
#: trial that something outside disturbed (both settings slow while it ran) is tried again
#: soon. ShuffleNetV2 at batch 1 on two threads, 1 process in 22: its trial timed two threads
#: at 5.2-8.2 ms and one at 4.7-7.4, picked one thread, and kept it for the next 2 s at 4.7 ms
#: a run where two threads ran 2.7-3.6 in the others. The trial again costs about one run
#: (half its runs the slower way, by less than that margin)
CHOICE_FIRST_RETRY_S = 0.25
#: ... multiplied by 8 instead where the pick won again by this ratio of best times or more:
#: each trial runs half its runs the slower way (MobileNetV2 at batch 1 on two threads: 8.1 ms
#: a one-thread run against 5.1), and one that wins by that much seldom loses before a core
#: gets busy, which ``begin_run`` sees run by run
CHOICE_CLEAR_WIN = 1.25


#: a run that begins this long or more after the process's last run (its start, or its end
#: where a :class:`RunChoice` timed it) is no sample of a trial: it runs as the pick does,
#: untimed. After a pause a run is slow whatever its threads (its data out of the caches, an
#: idle virtual core woken, the team's threads asleep): MobileNetV2 at batch 1 took 15-17 ms
#: on two threads and 24-26 on one after 0.3 s idle, 41-44 after 1 s, against 4.0-4.5 and
#: 7.0-7.5 (ONNX Runtime on two threads 19-26 and 56 against 4.1-4.4). In a benchmark taking
#: rounds with other processes, a check timed the first run of a round on two threads against
#: the next on one, found no clear win and ran a full trial in the timed runs: 5.8-9.6 ms
#: runs in those rounds against 4.0-4.4 in the others. (Counted among a trial's
#: :data:`WARMING_REDOS`: a process whose every run follows a pause times them after that.)
RESTED_S = 0.25
_ran = [float("-inf")]  # when the last run a RunChoice timed ended (time.perf_counter)


def _rested() -> bool:
    """Whether the process ran no run for :data:`RESTED_S` (see there)."""
    last = max(_ran[0], _began[0] if _began[0] is not None else float("-inf"))
    return time.perf_counter() - last >= RESTED_S


#: runs from this long on are tried one timed run of each setting at a time, none untimed: at
#: ResNet-50's batch 16 (about a second a run) the run choice's trial took 8 runs (a step's
#: driver trial 12 more, where it has a native driver), half of them on the slower setting;
#: at that length a run's noise is small beside the differences a trial is for; where the two
#: runs are within :data:`CHOICE_CLEAR_WIN` of each other each setting runs again, up to
#: :data:`CHOICE_RUNS` (on a machine whose second core slows for seconds at a time, a wide run
#: of ResNet-50 at batch 1 took 73 ms, a narrow one 74: a pick by one run each is a coin toss)
LONG_TRIAL_S = 0.05
#: ... and a clear win of such a trial is taken only from this many timed runs of each
#: setting (the best of them): one run slowed by what no count tracks (the host, a collection)
#: decided it otherwise. Measured: ResNet-50 at batch 1 on two threads (36-40 ms a run, 66-69 on
#: one thread) timed its one wide run at 197 ms in one process of four, picked one thread
#: clearly and ran on it for the next 256 runs
LONG_TRIAL_CONFIRM = 2


def trial_runs(times, warm: int, timed: int) -> tuple:
    """``(untimed, timed)`` runs of each candidate of a trial whose runs so far took
    ``times`` seconds: ``(warm, timed)``; ``(0, 1)`` where every one took
    :data:`LONG_TRIAL_S` or more (a first run that compiled is long whatever the work);
    :data:`SHORT_TRIAL_RUNS` times more timed runs where most took under
    :data:`SHORT_TRIAL_S` (a best of three runs of a microsecond is one
    cache miss from the wrong pick: a 3-op program kept its host driver, 1.1 us a call, over
    its native one, 0.7 us, in some processes)."""
    if not times:
        return warm, timed
    if min(times) >= LONG_TRIAL_S:
        return 0, 1
    if sorted(times)[len(times) // 2] < SHORT_TRIAL_S:
        return warm, timed * SHORT_TRIAL_RUNS
    return warm, timed


#: trials whose runs mostly take under SHORT_TRIAL_S time SHORT_TRIAL_RUNS times as many runs
SHORT_TRIAL_S = 1e-4
SHORT_TRIAL_RUNS = 8


#: a run shorter than this cannot pay for waking a second thread: the next TINY_RUNS runs of
#: its plan and batch size leave the thread settings as they are (``RunChoice.KEEP``: no run
#: cap, no choice, no timing; a 3-op program's run 8.5 -> 6.7 us), then one is timed again
TINY_RUN_S = 50e-6
TINY_RUNS = 256


#: kernels loaded (or compiled) within runs so far (``lib.team.ready``: a parallel loop, or a
#: kernel compiled ahead that replaces a slower one, loaded from disk in a run), host replays
#: recorded (``replay.HostReplay``: the driver's run, then the recording's to check it) and
#: recordings whose calls were made native (``replay.Recording._go_native_checked``: a compile
#: and two more replays): a run that did any of these is no sample of a :class:`RunChoice`
#: trial, nor of a driver trial (``tiers``). Measured where one was: ResNet-50 at batch 1 on
#: two threads had its one timed wide run take a 75 ms load, 157 ms against 84 on one thread,
#: and ran on one thread from then on: 80 ms against 48; the BERT-like encoder at batch 16 on
#: two threads had its one timed wide run record, 233 ms, against a plain run on one thread,
#: and in some processes ran its next 30 runs on one thread: ~197 ms against 95-140; the same
#: encoder's one timed wide run made two recordings native (0.16 and 0.22 s), 393 ms against
#: 177 on one thread, and in about one process of five it ran on one thread from then on:
#: ~170 ms against ~85
LOADS = [0]
#: compiles going on beside the runs, on threads of this process (:func:`background`: a
#: loop's parallel variant, a step's native driver; up to seconds each with a cold cache, on
#: one of the cores the runs' threads share): a run that begins while one goes on is not timed
#: by a trial, and ``LOADS`` moves as each starts and ends
BACKGROUND = [0]
_background_lock = threading.Lock()
#: runs served as they will not be served for long: a host replay's driver runs before its
#: recording and its recording's trial against the driver (``WARMING``), and its replays from
#: Python before its calls go native (``PY_REPLAYS``) (:mod:`.replay`). A :class:`RunChoice`
#: trial's run that moved ``WARMING``, or ``PY_REPLAYS`` and was shorter than
#: :data:`LONG_TRIAL_S` (a long run's replay from Python costs it little), is no sample (up to
#: :data:`WARMING_REDOS` a trial), so that a trial compares each setting as it will run;
#: a driver trial (``tiers``) skips the short runs that moved ``WARMING`` alike. Measured
#: where a long run's ``WARMING`` counted: ResNet-50 at batch 1 on two threads (38 ms a run
#: served, 70 on one thread) timed its one wide run while the host driver still served (73-151
#: ms), and in one process of four ran on one thread for the next 256 runs. Where short runs
#: were counted: MobileNetV3-small at batch 1 on two threads, each setting's first runs on
#: its own recording, the wide ones still from Python (2.5-4.1 ms against 1.25 once native,
#: one thread 2.1-3.1 against 2.2): about one process of three picked one thread and ran
#: 2.2-2.6 ms a run for the next seconds against 1.25-1.3. (A driver trial does not wait for
#: the replays to go native: a small program's trial would run its host driver some 30 runs
#: longer, past the warm-up after which a benchmark times it.)
WARMING = [0]
PY_REPLAYS = [0]
#: a plan whose fastest run took less than this runs on the caller's thread alone while a
#: compile of this process beside the runs (:data:`BACKGROUND`) leaves it fewer than two free
#: cores: a parallel loop's part given to a thread the compile keeps off its core waits for
#: the scheduler's next slice, 4-8 ms. Measured: MobileNetV3-small at batch 1 on two threads
#: (1.2-1.5 ms a run, 2.0 on one thread), the runs beside its recordings' native builds (two
#: of ~0.15 s): one in three took 5.5 or 9.7 ms
BESIDE_ONE_S = 0.05
#: a trial's runs not counted for those, at most (then counted: a setting whose replay never
#: settles is timed as it runs); a recording's calls go native at its 32nd run
WARMING_REDOS = 96


def marks() -> tuple:
    """The counts a run moves where it is served as later runs will not be (a kernel loaded,
    a compile beside it begun or ended, a driver run before a recording, a replay from Python
    before its calls go native): equal before and after a run that was none of these."""
    return LOADS[0], WARMING[0], PY_REPLAYS[0]


def sample_mark():
    """What a trial's timed run compares ``LOADS`` with when it ends: the run is a sample
    where ``LOADS[0]`` is still this (None where a compile goes on beside the runs,
    :data:`BACKGROUND`: never)."""
    return None if BACKGROUND[0] else LOADS[0]


@contextlib.contextmanager
def background():
    """Around a compile on a thread of this process beside its runs: the runs it overlaps
    are no samples of a trial (:data:`BACKGROUND`)."""
    with _background_lock:
        BACKGROUND[0] += 1
        LOADS[0] += 1
    try:
        yield
    finally:
        with _background_lock:
            BACKGROUND[0] -= 1
            LOADS[0] += 1


class _Choice:
    __slots__ = ("warm", "pick", "trial", "times", "timing", "left", "until", "interval",
                 "tiny", "loads", "check", "warming", "replays", "redos", "least")

    def __init__(self):
        self.tiny = 0                  # runs left that keep the settings (but RunChoice.tiny_left)
        self.warm = CHOICE_AFTER       # runs before the first trial
        self.pick = None               # None: none yet; 0: every free core; 1: one thread
        self.trial = False
        self.times = ([], [])          # a trial's run times on every free core, on one thread
        self.timing = -1               # the setting of the run in progress when timed
        self.left, self.until = 0, 0.0  # the pick's runs and deadline before the next trial
        self.interval = CHOICE_RETRY_RUNS
        self.loads = 0                 # LOADS when the timed run began
        self.check = False             # the last pick won clearly: its next trial is a check
        self.warming = 0               # WARMING when the timed run began
        self.replays = 0               # PY_REPLAYS then
        self.redos = 0                 # the trial's runs not counted for them
        self.least = float("inf")      # the least time of a run so far


class RunChoice:
    """Whether the runs of one plan go on every free core or on the caller's thread alone, by
    measurement, per batch size. After :data:`CHOICE_AFTER` runs, a trial alternates runs of
    each (an untimed one, then :data:`CHOICE_RUNS` timed) and keeps the faster by its best
    time; trials repeat while the plan serves (after :data:`CHOICE_RETRY_RUNS` runs and
    :data:`CHOICE_RETRY_S` seconds, twice as long each time the pick stays, eight times where
    it won by :data:`CHOICE_CLEAR_WIN` or more, the first pick too, up to 64x; a first pick by
    less than that after :data:`CHOICE_FIRST_RETRY_S` seconds instead). The trial after
    a clear win is a check: one timed run of the pick, then one of the other setting; where the
    pick wins clearly again it stays, else a full trial follows at once (a full trial runs four
    of its eight runs the slower way: MobileNetV2 at batch 1 on two threads, 10 ms one-thread
    runs among 7.5 ms ones). A trial's run that follows a pause of :data:`RESTED_S` or more
    in the process's runs is no sample (run as the pick, untimed). It
    decides only when more than one thread may run (threads asked for, or loops on every core,
    and two cores free); otherwise every run goes as :func:`begin_run` sets it. Work too small
    to pay for its threads, a core another process keeps half busy (``free_cores`` rounds that
    to free): the one-thread runs are faster and are kept. While a compile of this process
    beside the runs holds a core, a plan of short runs runs on the caller's thread
    (:data:`BESIDE_ONE_S`), its counts untouched.

    ``begin(key)`` returns the cap for the run (None: the free cores; 1: the caller's thread;
    :data:`KEEP`: a run too short for threads to matter, see :data:`TINY_RUN_S`: run it as
    the thread's settings are, untimed), ``end(key, seconds)`` takes the run's time. Each
    batch size counts its tiny runs down; while ``tiny_left`` is positive, the runs of batch
    size ``tiny_key`` (the latest tiny one) are such runs: a caller may count them down itself
    instead of calling ``begin`` (a 3-op program's run is ~8 us).
    ``ready(key)``: whether a trial may start (the plan's own driver trials are over: a run
    kept on one thread would run a split driver unsplit); asked only when one is due, else
    again :data:`CHOICE_AFTER` runs later. ``measured(key, seconds)``: whether the plan's
    driver trials measured its threads for runs like its fastest so far (of ``seconds``):
    most of the run splits its batch over every free core, faster than its drivers on every
    thread, so that a one-thread run has little to win; the first pick is then every free
    core without a trial, a clear one (checked later as such). ResNet-50 at batch 16 on two
    threads: the trial's two one-thread runs took 1.27 and 1.11 s among 0.57 s ones. Safe
    under concurrent runs (a sample lost at worst)."""
    __slots__ = ("keys", "clock", "ready", "measured", "tiny_key", "tiny_left")
    KEEP = False

    def __init__(self, ready=None, measured=None, clock=time.monotonic):
        self.keys: dict = {}
        self.clock = clock
        self.ready = ready
        self.measured = measured
        self.tiny_key, self.tiny_left = None, 0  # the latest tiny key, its runs still kept

    def begin(self, key):
        if self.tiny_left > 0 and key == self.tiny_key:
            self.tiny_left -= 1
            return self.KEEP
        st = self.keys.get(key)
        if st is None:
            if len(self.keys) > 64:
                self.keys.clear()
            st = self.keys[key] = _Choice()
        if st.tiny > 0:  # another key's tiny runs (batch sizes taking turns): its count moves
            self._count_tiny(key, st.tiny - 1)  # to the shortcut
            return self.KEEP
        st.timing = -1
        if BACKGROUND[0] and st.least < BESIDE_ONE_S and free_cores() - BACKGROUND[0] < 2:
            return 1  # (a compile beside the runs holds a core: see BESIDE_ONE_S)
        if st.warm > 0:
            st.warm -= 1
            return 1 if st.pick == 1 else None
        if not st.trial:
            st.left -= 1
            if st.pick is not None and (st.left > 0 or self.clock() < st.until):
                return None if st.pick == 0 else 1  # (a busy core: begin_run caps it)
        if max(max_loop_threads(), get_num_threads()) < 2 or free_cores() < 2:
            return None  # (one thread whatever the pick: nothing to choose)
        if BACKGROUND[0]:  # (a compile beside the runs: the trial waits for it to end)
            return 1 if st.pick == 1 else None
        if not st.trial:
            if self.ready is not None and not self.ready(key):
                st.warm = CHOICE_AFTER  # (asked again then)
                return 1 if st.pick == 1 else None
            if st.pick is None and self.measured is not None and self.measured(key, st.least):
                self._choose(st, 0, clear=True)
                return None
            st.trial, st.times, st.redos = True, ([], []), 0
        if st.redos < WARMING_REDOS and _rested():  # (after a pause: no sample, as the pick)
            st.redos += 1
            return 1 if st.pick == 1 else None
        first = st.pick if st.check else 0  # (a check times the pick first: it is warm)
        which = first if len(st.times[0]) == len(st.times[1]) else \
            int(len(st.times[0]) > len(st.times[1]))
        st.timing, st.loads, st.warming, st.replays = which, LOADS[0], WARMING[0], PY_REPLAYS[0]
        return None if which == 0 else 1

    def end(self, key, seconds: float) -> None:
        _ran[0] = time.perf_counter()
        st = self.keys.get(key)
        if st is None:
            return
        if seconds < st.least:
            st.least = seconds
        if seconds < TINY_RUN_S:  # (a trial of a tiny run is given up: nothing to choose)
            st.trial, st.timing = False, -1
            self._count_tiny(key, TINY_RUNS)
            return
        if not st.trial or st.timing < 0:
            return
        if LOADS[0] != st.loads:  # (a kernel loaded in the run: no sample; timed again)
            st.timing = -1
            return
        if st.redos < WARMING_REDOS and (WARMING[0] != st.warming or (
                PY_REPLAYS[0] != st.replays and seconds < LONG_TRIAL_S)):
            st.redos += 1  # (served as it will not be for long: that setting runs again)
            st.timing = -1
            return
        wide, narrow = st.times
        st.times[st.timing].append(seconds)
        st.timing = -1
        skip, need = (0, 1) if st.check else trial_runs(wide + narrow, 1, CHOICE_RUNS)
        if len(wide) >= skip + need and len(narrow) >= skip + need:
            best_wide, best_narrow = min(wide[skip:]), min(narrow[skip:])
            pick = 1 if best_narrow < best_wide else 0
            clear = max(best_wide, best_narrow) >= CHOICE_CLEAR_WIN * min(best_wide, best_narrow)
            if not clear and not st.check and need < CHOICE_RUNS and \
                    min(len(wide), len(narrow)) < skip + CHOICE_RUNS:
                return  # (long runs close by one each: timed again, up to CHOICE_RUNS each)
            if clear and not st.check and need < LONG_TRIAL_CONFIRM and \
                    min(len(wide), len(narrow)) < skip + LONG_TRIAL_CONFIRM:
                return  # (a clear win of long runs by one each: each timed again first)
            if st.check and not (clear and pick == st.pick):  # (a full trial, at once)
                st.check, st.times = False, ([], [])
                return
            self._choose(st, pick, clear)

    def _choose(self, st, pick: int, clear: bool) -> None:
        """``pick`` kept until the next trial, a check where it won clearly."""
        st.check = clear
        seconds = CHOICE_RETRY_S
        if st.pick is None:  # (the first pick)
            st.interval = CHOICE_RETRY_RUNS * (8 if clear else 1)
            if not clear:
                seconds = CHOICE_FIRST_RETRY_S
        elif pick == st.pick:
            st.interval = min(st.interval * (8 if clear else 2), CHOICE_RETRY_RUNS * 64)
        else:
            st.interval = CHOICE_RETRY_RUNS
        st.pick, st.trial = pick, False
        st.left = st.interval
        st.until = self.clock() + seconds * st.interval / CHOICE_RETRY_RUNS

    def _count_tiny(self, key, runs: int) -> None:
        """``runs`` tiny runs of ``key`` to keep, counted by the shortcut (``tiny_key``,
        ``tiny_left``); the key it counted for so far keeps its count in its own state."""
        old = self.keys.get(self.tiny_key) if self.tiny_key != key else None
        if old is not None:
            old.tiny = self.tiny_left
        st = self.keys.get(key)
        if st is not None:
            st.tiny = 0
        self.tiny_key, self.tiny_left = key, runs

    def settled(self, key) -> bool:
        """Whether the runs of ``key`` go on as now: no trial on or due before a pick, or
        nothing to choose (one thread, no two free cores, runs too short for threads)."""
        st = self.keys.get(key)
        if (self.tiny_left > 0 and key == self.tiny_key) or (st is not None and st.tiny > 0):
            return True
        if max(max_loop_threads(), get_num_threads()) < 2 or free_cores() < 2:
            return st is None or not st.trial
        return st is not None and not st.trial and st.pick is not None

    def picks(self) -> dict:
        """``{key: "every free core" | "one thread" | "on trial" | ...}`` (explain, tests)."""
        def name(st):
            if st.trial:
                return "on trial"
            return {None: "not chosen", 0: "every free core", 1: "one thread"}[st.pick]
        return {k: name(st) for k, st in self.keys.items()}


_setters = [None]


def _openblas_setters_cached() -> list:
    if _setters[0] is None:
        _setters[0] = _openblas_setters()
    return _setters[0]


def default_num_threads() -> int:
    """``PDJIT_NUM_THREADS``, else 1 (read once: every plan run asks)."""
    global _default_threads, _env_asked
    if _default_threads is None:
        _env_asked = bool(os.environ.get("PDJIT_NUM_THREADS"))
        _default_threads = _read_default_threads()
    return _default_threads


_default_threads = None
_env_asked = False  # (whether PDJIT_NUM_THREADS was set, read with _default_threads)


def _read_default_threads() -> int:
    env = os.environ.get("PDJIT_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"PDJIT_NUM_THREADS={env!r}: expected a positive int") from None
    return 1


def ensure_applied() -> None:
    """Apply the default once, before the first compiled plan runs: one BLAS thread, every
    core for large elementwise loops."""
    global _default_applied
    if _applied is None and not _default_applied:
        _default_applied = True
        for fn in _openblas_setters_cached():
            fn(default_num_threads())
        _run_blas[0] = default_num_threads()
        import numba

        numba.set_num_threads(min(max_loop_threads(), numba.config.NUMBA_NUM_THREADS))


_default_applied = False


# ---- helper threads for the slices of a split batch ------------------------------------------
class _Helper:
    """A thread that runs one job at a time, handed over through two locks (a lock handover is
    a few microseconds; a ``concurrent.futures`` round trip costs tens)."""

    def __init__(self):
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.job = self.result = None
        t = threading.Thread(target=self._loop, name="pdjit-split", daemon=True)
        t.start()  # (returns once the thread runs: its id is known)
        self.tid, self.off = t.native_id, None
        _helper_tids.append(self.tid)

    def _loop(self) -> None:
        while True:
            self.go.acquire()
            fn, args = self.job
            self.job = None
            try:
                self.result = (True, fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
                self.result = (False, e)
            self.done.release()

    def start(self, fn, args, cpu=None) -> None:
        """Run ``fn(*args)`` on this helper, off core ``cpu`` (the caller's: None, anywhere)."""
        if cpu != self.off:
            self.off = cpu
            allowed = _allowed()
            try:
                os.sched_setaffinity(self.tid, allowed - {cpu} if len(allowed) > 1 and
                                     cpu in allowed else allowed)
            except (OSError, ValueError):  # (a thread gone, a mask refused: left as it was)
                pass
        self.job = (fn, args)
        self.go.release()

    def wait(self):
        self.done.acquire()
        result, self.result = self.result, None
        return result


_idle: list = []       # helpers waiting for a job
_helpers = [0]         # how many exist
_helper_tids: list = []  # their kernel thread ids (``sched_times``)
_helpers_lock = threading.Lock()


def _forget_helpers() -> None:  # a forked child has none of its parent's threads
    _idle.clear()
    _helpers[0] = 0
    _helper_tids.clear()
    _cpus[0] = None
    _teams.clear()
    _forget_proc_fds()
    _run_local.__dict__.pop("tid", None)  # (the forking thread's: the child's main thread)


os.register_at_fork(after_in_child=_forget_helpers)


def _take_helper(most: int):
    """An idle helper, else a new one while fewer than ``most`` exist, else None."""
    try:
        return _idle.pop()
    except IndexError:
        pass
    with _helpers_lock:
        if _helpers[0] >= most:
            return None
        _helpers[0] += 1
    return _Helper()


_cpus = [None]  # the cores this process may run on


def _allowed() -> set:
    if _cpus[0] is None:
        _cpus[0] = set(os.sched_getaffinity(0))
    return _cpus[0]


def _sched_getcpu():
    """The C library's ``sched_getcpu`` (the core the calling thread runs on), or None where
    there is none, or where helpers cannot be placed (no ``os.sched_setaffinity``)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [], ctypes.c_int
    return fn


_getcpu = _sched_getcpu()


# ---- the threads of Numba's parallel loops ---------------------------------------------------
_teams: dict = {}  # a thread's kernel id -> [the ids of its loops' other threads, their core]
#: the runs this process has begun (:func:`begin_run`)
runs = [0]
#: ``lib.team.thread_ids``, set when that module loads (it names a thread's team)
_thread_ids = [None]
_began = [None, float("inf")]  # when the last run began, the shortest run so far


def shortest_run() -> float:
    """The least time from one run's start to the next's in this process so far, in seconds
    (a bound on its shortest run, whatever its threads: runs of the same model at another
    batch size, another plan's; inf before two runs)."""
    return _began[1]


def place_team(discover: bool = True) -> None:
    """Keep the threads that run the calling thread's parallel loops (``lib.team``) off the
    core it runs on, as :func:`run_parts` keeps its helpers: a loop's threads poll for work
    for a while before they sleep (``TEAM_SPINS``), and one left on the caller's core made
    each loop wait for its polling to end (a 2-part loop took 75-690 us, its parts 1 us; a
    10-layer MLP's training step with its optimizer's parallel loops 0.59 ms against 0.54).
    Their ids are taken at the first call on each thread (one loop; not with ``discover``
    false: then only a team already known is placed), then each call costs a look at the
    core (~1 us) and, where the caller moved, their masks set again. Not on a thread whose
    loops run on it alone (:class:`one_thread`, a one-thread run): it has no team to place,
    and taking the ids would start one (OpenMP's threads for that thread, more threads than
    cores: OpenMP then stops its threads' polling, and every loop of every thread waits for
    a sleeping thread to wake; a BERT-like encoder at batch 1 on two threads took 7.1 ms
    instead of 4.0 after runs at batch 4, whose slices ran a loop variant on a helper)."""
    if _getcpu is None or getattr(_run_local, "cap", None) == 1:
        return
    me = native_id()
    team = _teams.get(me)
    if team is None and (not discover or other_team()):
        return
    cpu = _getcpu()
    if team is not None and team[1] == cpu:
        return
    if team is None:
        if _thread_ids[0] is None:  # (no team: lib.team, which names it, is not loaded)
            return
        ids = _thread_ids[0]()
        if ids is None:  # (the loop that takes them is not ready: asked again at the next call)
            return
        team = _teams[me] = [[t for t in ids if t != me], None]
        _team_owner[0] = (me, threading.current_thread())
    allowed = _allowed()
    if len(allowed) > 1 and cpu in allowed:
        for tid in team[0]:
            try:
                os.sched_setaffinity(tid, allowed - {cpu})
            except (OSError, ValueError):  # (a thread gone, a mask refused: left as it was)
                pass
    team[1] = cpu


def hold_caller():
    """Keep the calling thread on the core :func:`place_team` placed its team off, for the
    length of a run whose parallel loops follow one another in native code (a recording's
    replay, ``replay.Recording``), and return what :func:`release_caller` takes after the run
    (None: nothing to do). Between two loops the caller waits for the team at each loop's end,
    sleeping once its polling ends; woken by a team thread, the scheduler may move it onto
    that thread's core, and every later loop of the run then shared one core (MobileNetV2 at
    batch 1 on two threads: one process in ten ran 14 of 100 runs so, each thread waiting
    42 ms in all for the other).

    Holding costs three system calls a run, the first after the thread waited in a loop
    ~15-30 us (a system call takes ~2 us otherwise), so a thread is held only once one of its
    runs ended on another core than its team was placed off (:data:`MOVED`): until then
    :func:`release_caller` only looks at the core (~1 us). MobileNetV2 at batch 1 on two
    threads, its 4 ms runs watched / held at every run by turns in one process: 0.990-1.001x
    in six processes (median 0.995x)."""
    team = _teams.get(native_id())
    if team is None or team[1] is None or getattr(_run_local, "cap", None) == 1:
        return None
    if not getattr(_run_local, "moved", False):
        return _WATCH
    try:
        mask = os.sched_getaffinity(0)
        if len(mask) < 2 or team[1] not in mask:
            return None
        os.sched_setaffinity(0, {team[1]})
    except OSError:  # (a mask refused: left as it was)
        return None
    return mask


#: :func:`hold_caller`'s word for a run not held: its end looks where the thread runs
_WATCH = object()
#: the threads seen moved off the core their team was placed off at the end of a run, and
#: held since (:func:`hold_caller`)
MOVED = [0]


def release_caller(mask) -> None:
    """After the run :func:`hold_caller` began: the calling thread's mask before it again;
    or, for a run not held, whether the thread ended it on another core than its team was
    placed off (held from its next run)."""
    if mask is _WATCH:
        team = _teams.get(native_id())
        if team is not None and team[1] is not None and _getcpu() != team[1]:
            _run_local.moved = True
            MOVED[0] += 1
        return
    if mask is not None:
        try:
            os.sched_setaffinity(0, mask)
        except OSError:
            pass


#: (native id, thread) of the thread whose work splits over the cores: the first that started
#: a team (:func:`place_team`), while it lives
_team_owner = [None]


def other_team() -> bool:
    """Whether another thread, still alive, has a team of OpenMP threads: this one's work
    then runs on it alone (but slices of a batch, each on a helper kept to one thread). OpenMP
    keeps a pool of threads for each thread that starts loops; with more of its threads than
    cores it stops their polling (libgomp's throttled count, 100 spins), and every loop of
    every thread then waits for a sleeping thread to wake: a BERT-like encoder at batch 1 on
    two threads took 7.3 ms from a second thread against 4.1 from the main thread,
    MobileNetV2 5.7 against 3.1 (one thread: 6.9 and 3.8); split on ``run_parts``' helpers
    instead, the encoder took 24.6 ms."""
    owner = _team_owner[0]
    return owner is not None and owner[0] != native_id() and \
        owner[1].is_alive()


#: called as :func:`run_parts` starts (``pdjit.codegen.cpu.replay``: a host driver's recording
#: does not record its helpers' kernel calls)
on_helpers = [None]


def run_parts(fn, parts: list, most: int | None = None) -> list:
    """``[fn(*args) for args in parts]``, ``parts[1:]`` on helper threads at once (at most
    ``most`` of them, default ``loop_threads() - 1``, which is also the most helpers made in
    the process; a part finding every helper busy, as under concurrent runs, runs on this
    thread after its own), ``parts[0]`` on this thread. Every part has ended when this returns
    or raises (the exception of the first part that failed)."""
    if on_helpers[0] is not None:
        on_helpers[0]()
    most = loop_threads() - 1 if most is None else most
    helped = []
    # the helpers are kept off this thread's core: on the 2-vCPU machine the scheduler woke
    # the helper on the core of the thread that woke it, window after window, so that the two
    # halves of LeNet's batch ran one after the other on one core (0.545 ms a run, more than
    # the whole batch on one thread, 0.50) while the other core idled; kept apart, 0.33-0.36
    cpu = _getcpu() if _getcpu is not None and len(parts) > 1 else None
    if cpu is not None and cpu < 0:
        cpu = None
    for args in parts[1:1 + max(most, 0)]:
        h = _take_helper(most)
        if h is None:
            break
        h.start(fn, args, cpu)
        helped.append(h)
    results = [None] * len(parts)
    errors = []  # (part, exception)
    for k in [0, *range(1 + len(helped), len(parts))]:  # this thread's parts
        try:
            results[k] = fn(*parts[k])
        except BaseException as e:  # noqa: BLE001 - raised once the helpers are done
            errors.append((k, e))
    for j, h in enumerate(helped):
        ok, value = h.wait()
        _idle.append(h)
        if ok:
            results[1 + j] = value
        else:
            errors.append((1 + j, value))
    if errors:
        raise min(errors, key=lambda ke: ke[0])[1]
    return results
