"""The Executor: runs a program's global block in a Scope (seed 004).

``mode='compiled'`` (the default) lowers the block once per program version into a plan of
Numba-compiled functions in which chains of ops are fused (``pdjit.runtime.plan``), and on
every run only binds values and calls them. ``mode='reference'`` interprets ops one by one with
their NumPy references: the debugging mode and the oracle the compiled mode is tested against.
The mode comes from the ``mode`` argument, else the ``PDJIT_EXECUTOR`` environment variable.

Guarantees of ``run``: feeds and fetches are checked against the program before anything runs
(errors name the variable, expected vs got); an op that fails raises an ``OpRunError`` naming
it and where the user created it; persistable results reach the Scope only after the whole run
succeeded; fetched arrays are copies that alias nothing the executor or the Scope holds.

Run-time checks (``pdjit.runtime.checks``), read from the environment once per Executor:
``PDJIT_CHECK_NAN_INF=1`` / ``FLAGS_check_nan_inf=1`` stops a run at the first op whose output
holds NaN or Inf (``NanInfError``; off by default; measured on an MLP training step: +7 %
compiled, +16 % in reference mode); an op output larger than ``PDJIT_MAX_ALLOC_BYTES``
(default: the available memory) is refused before it is allocated (``AllocationLimitError``).
A stopped run commits nothing to the Scope.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import weakref

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import PdjitError, as_pdjit_error
from pdjit.framework.program import Block, Program, default_main_program
from pdjit.passes import verify
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime import checks, dataset_run, feed_fetch, generator_loader, interpreter, profile
from pdjit.runtime.checks import env_flag
from pdjit.runtime.context import Env
from pdjit.runtime.dataset_run import FetchHandler  # noqa: F401 (fluid.executor's name)
from pdjit.runtime.place import CPUPlace, Place
from pdjit.runtime.scope import Scope, global_scope, scope_guard  # noqa: F401 (fluid.executor's)
from pdjit.runtime.tensor import LoDTensor, device_holder

# also Fluid's ``fluid.executor`` module (pdjit.MOVED)
__all__ = ["Executor", "Scope", "global_scope", "scope_guard", "FetchHandler"]

VarType = pb.VarType
_NONE = object()
_EXECUTORS = itertools.count()


def _forget(programs, kind) -> None:
    """Drop the plans an executor (``kind``) left on ``programs``."""
    for program in list(programs.keys()):
        cache = program.__dict__.get("_run_cache_dict", {})
        for k in [k for k in cache if k[0] == kind]:
            del cache[k]
MODES = ("compiled", "reference")


def _default_mode() -> str:
    mode = os.environ.get("PDJIT_EXECUTOR", "compiled").strip().lower()
    if mode not in MODES:
        raise ValueError(f"PDJIT_EXECUTOR={mode!r}: expected one of {MODES}")
    return mode


def _default_memory_optim() -> bool:
    return env_flag("PDJIT_MEMORY_OPTIM", False)


COLD_RUNS = ("reference", "compile")
#: the most values a program's persistable variables, and the most its other variables per
#: sample (a dimension left open counts 1), may hold for its first runs to be interpreted while
#: its kernels compile (``cold_runs="reference"``): the references' time per run grows with
#: both (measured, one run by the references: a 10-layer MLP training step at batch 32, 0.13 M
#: and 0.05 M values, 5 ms; bench_compile's small CNN's training step, 0.03 M and 0.07 M, 36
#: ms; ResNet-50 inference at batch 1, 25.6 M and 37.7 M, 1.3 s; SqueezeNet holds 1.2 M and
#: 9.9 M). A larger model compiles first, as its interpreted runs would be too slow to serve
#: while it compiles.
COLD_RUN_VALUES = 1_000_000
#: an interpreted run longer than this makes the next one wait for the compiled plan
COLD_RUN_MAX_S = 0.05
#: the most runs of a plan interpreted while it compiles: the next one waits for it (a loop
#: that measures its speed after a few runs then meets the compiled plan)
COLD_RUN_MAX_RUNS = 12


def _values_held(program) -> int:
    """How many values ``program``'s variables hold, by their declared shapes (a dimension left
    open counts 1): the larger of the persistable ones' and the others'."""
    held = [0, 0]
    for block in program.blocks:
        for var in block.vars.values():
            if var.type == VarType.LOD_TENSOR:
                n = 1
                for d in var.shape or ():
                    n *= d if d > 0 else 1
                held[var.persistable] += n
    return max(held)


class _ColdPlan:
    """A compiled plan whose kernels forked workers compile (``compiled``: a
    ``compiler.Background``) while its runs are interpreted; ``runs``: how many were;
    ``wait``: the next run waits for the plan (an interpreted run took longer than
    :data:`COLD_RUN_MAX_S`, or there were :data:`COLD_RUN_MAX_RUNS`)."""
    __slots__ = ("plan", "compiled", "runs", "wait")

    def __init__(self, plan, compiled):
        self.plan, self.compiled, self.runs, self.wait = plan, compiled, 0, False



def build_plan(*args, **kwargs):
    """:func:`pdjit.runtime.plan.build_plan`, imported with the first plan: the code generator
    and Numba are loaded then, not by ``import pdjit``."""
    from pdjit.runtime.plan import build_plan as build

    return build(*args, **kwargs)

class Executor:
    """Runs programs in a Scope. ``strict=True`` (or ``PDJIT_STRICT=1``) makes native code that
    falls back to the NumPy references an error (:class:`FallbackError`) instead of a warning
    (:class:`FallbackWarning`, once per plan step); ops planned as reference steps (no
    lowering) are not fallbacks.

    ``memory_optim=True`` (or ``PDJIT_MEMORY_OPTIM=1``) builds plans whose native steps reuse
    the buffers of dead intermediates and free each one after its last use
    (``pdjit.codegen.memplan``): a lower peak memory; ``explain()`` shows the assignment.
    Off by default for an Executor, on for a Predictor (``Config.enable_memory_optim(False)``
    turns it off there); measured with ``benchmarks/bench_memory.py`` it never slowed a run
    (0.91-1.00x of the time, 0.21-0.86x of the peak traced memory).

    ``native_drivers=True`` (or ``PDJIT_NATIVE_DRIVERS=1``) also compiles each native step's
    driver into one native function (seconds of compile time per program the first time, then
    from the disk cache) and runs whichever of the two drivers measures faster for each batch
    size: no Python between the kernels of a small batch. ``"auto"`` (the default unless
    ``PDJIT_NATIVE_DRIVERS`` is set) does that only for an inference plan (one that writes no
    persistable variable: a ``clone(for_test=True)``, a loaded inference model) once it ran
    ``pdjit.codegen.cpu.tiers.HOT_RUNS`` (100) times: a program run a few times, and a training
    program, keep the host drivers and compile nothing more; one being served gets the
    native drivers (measured on LeNet-5 at batch 1: 46 us per run with the host driver, 30 us
    with the native one). ``"background"`` (the Predictor's): every native step's driver is
    built on a thread of its own after the step's second run, never in a run, the host driver
    serving until it is ready. Both build one only for a step it can speed up (a few short
    kernel calls: ``pdjit.codegen.cpu.tiers.DRIVER_MAX_CALLS``). ``False``
    (``PDJIT_NATIVE_DRIVERS=0``): never.

    ``native_loops=False`` runs each ``while`` loop step by step (each iteration runs the
    body's compiled plan) instead of as one native loop: to tell whether a wrong result comes
    from a native loop, and to compare the two.

    ``cold_runs="reference"`` (the default): a small program (at most
    :data:`COLD_RUN_VALUES` values in its persistable variables, and in its others per sample)
    whose kernels are not all in the disk cache yet runs on the ops' NumPy references while
    forked workers compile them; its compiled plan takes over at the first run after they are
    done (or at the run after an interpreted one that took over :data:`COLD_RUN_MAX_S`, or
    after :data:`COLD_RUN_MAX_RUNS` interpreted runs: that run waits for it). The first runs'
    results are then the references': equal to the compiled code's up to rounding (as
    ``mode="reference"``'s are). A larger program's first plan leaves its library kernels that
    have a stand-in to a worker compiling beside its first runs (``compiler.stand_ins``),
    NumPy's calls serving meanwhile (the same to rounding). ``cold_runs="compile"`` (or
    ``PDJIT_COLD_RUNS=compile``): every run waits for its compiled plan and kernels (what
    ``strict`` mode and a device place always do): results that do not depend on what the
    cache held."""

    def __init__(self, place: Place | None = None, mode: str | None = None,
                 strict: bool | None = None, memory_optim: bool | None = None,
                 native_drivers: bool | str | None = None, native_loops: bool = True,
                 cold_runs: str | None = None):
        self.place = place if place is not None else CPUPlace()
        if not isinstance(self.place, Place):
            raise TypeError(f"Executor: place must be CPUPlace() or CUDAPlace(i), got {place!r}")
        # the target that runs this place's plans (cuda: a GPU, or the CUDA simulator); the
        # code generator loads with the first executor, not with ``import pdjit``
        from pdjit.codegen.target import get_target, target_name

        self._target = get_target(target_name(self.place))
        threads = self._target.run_threads()  # the host's thread control
        self._numpy_blas = threads.numpy_blas  # (a plan whose steps call NumPy's BLAS)
        # each run's threads capped at the cores other processes leave free (a host plan's)
        self._begin_run = threads.begin_run
        self._run_choice = threads.RunChoice
        self._target.require(f"Executor({self.place!r})")
        self.mode = mode.lower() if mode else _default_mode()
        self.memory_optim = bool(memory_optim) if memory_optim is not None else \
            _default_memory_optim()
        # part of every cache key, cheap to hash: the plans an executor builds are its own (they
        # hold per-step state, and follow the settings of when they were built)
        if native_drivers is None:
            native_drivers = "auto" if not os.environ.get("PDJIT_NATIVE_DRIVERS", "").strip() \
                else env_flag("PDJIT_NATIVE_DRIVERS", False)
        elif native_drivers not in ("auto", "background"):
            native_drivers = bool(native_drivers)
        self.native_drivers = native_drivers
        self.native_loops = bool(native_loops)
        self._kind = (next(_EXECUTORS), self.mode, repr(self.place), self.memory_optim,
                      self.native_drivers, self.native_loops)
        self.strict = bool(strict) if strict is not None else \
            os.environ.get("PDJIT_STRICT", "0").strip() not in ("", "0")
        # NaN/Inf checking and the allocation limit, read once (pdjit.runtime.checks)
        self.checks = checks.settings()
        self._on_device = self._target.device and self.mode == "compiled"
        if self.mode not in MODES:
            raise ValueError(f"Executor: mode {mode!r} is not one of {MODES}")
        self._runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        weakref.finalize(self, _forget, self._runs, self._kind)
        if cold_runs is None:
            cold_runs = os.environ.get("PDJIT_COLD_RUNS", "").strip() or "reference"
        cold_runs = cold_runs.lower() if isinstance(cold_runs, str) else cold_runs
        if cold_runs not in COLD_RUNS:
            raise ValueError(f"Executor: cold_runs {cold_runs!r} (or PDJIT_COLD_RUNS) is not "
                             f"one of {COLD_RUNS}")
        self.cold_runs = cold_runs
        self._interpreter = None  # the reference-mode executor of runs whose plan compiles
        self._cold_lock = threading.Lock()  # one thread at a time takes a compiled plan over

    def close(self) -> None:
        """Forget the compiled plans of every program this executor ran."""
        _forget(self._runs, self._kind)

    # -- the public entry point -----------------------------------------------------------------
    def run(self, program: Program | None = None, feed=None, fetch_list=None,
            feed_var_name: str = "feed", fetch_var_name: str = "fetch", scope: Scope | None = None,
            return_numpy: bool = True, use_program_cache: bool = True):
        # every exception leaves as a PdjitError (pdjit.framework.errors.named_errors), with no
        # wrapper call on the hot path: the body runs inside the try
        written = None
        try:
            program = program if program is not None else default_main_program()
            replicas = False
            if not isinstance(program, Program):
                as_program = getattr(program, "_as_program", None)  # a CompiledProgram
                if as_program is None:
                    raise TypeError(f"Executor.run: program must be a Program, got "
                                    f"{type(program).__name__}")
                replicas = getattr(program, "_is_data_parallel", False)
                program = as_program()
            if type(feed) is not dict:  # (a plain dict: the common case, checked first)
                if isinstance(feed, (list, tuple)):  # one dict per place, as loaders yield
                    feed = feed_fetch.merge_place_feeds(feed, replicas)
                elif feed is None:
                    feed = {}
                elif not isinstance(feed, dict):
                    raise TypeError(f"Executor.run: feed must be a dict of name -> value (or "
                                    f"a list of one such dict per place), got "
                                    f"{type(feed).__name__}")
            if type(fetch_list) is not list and (
                    isinstance(fetch_list, str) or (fetch_list is not None
                                                    and not isinstance(fetch_list, (list, tuple)))):
                fetch_list = [fetch_list]
            scope = scope if scope is not None else global_scope()
            if generator_loader.READERS in program.__dict__:  # a started py_reader's batch
                feed = generator_loader.pending_feed(program, feed)
            try:
                feed_names = tuple([k if type(k) is str else k.name for k in feed])
                fetch_names = tuple([f if type(f) is str else f.name for f in fetch_list or ()])
            except AttributeError:  # let the checking versions say what was wrong
                feed_names = feed_fetch.feed_names_of(feed)
                fetch_names = feed_fetch.fetch_names_of(fetch_list)
            run, plan, in_order = self._prepare(program, feed_names, fetch_names, feed_var_name,
                                                fetch_var_name)
            if run.unfed:  # a data variable read but not fed: named here, before any op runs
                run.check_unfed(scope)

            # feeds checked against their VarDescs (dtype, rank, known dims) before anything runs;
            # in the run's column order (a saved model's feed ops may order them otherwise)
            check = feed_fetch.check_feed_spec
            if in_order:
                feed_values = [check(spec, v) for spec, v in zip(run.feed_specs, feed.values())]
            else:
                by_name = {(k if type(k) is str else k.name): v for k, v in feed.items()}
                feed_values = [check(spec, by_name[n])
                               for n, spec in zip(run.feed_names, run.feed_specs)]

            counts = program.__dict__.get("_run_counts")  # runs of this program by executor
            if counts is None:
                counts = program._run_counts = {}
            run_index = counts.get(self._kind, 0)
            if not run_index:
                self._runs[program] = True  # a program this executor ran (weakly): its plans
            counts[self._kind] = run_index + 1
            env = Env(scope, run.block, fetched_scopes=run.fetched_scopes)
            values = env.values
            if self._on_device:
                for name, value in zip(run.feed_names, feed_values):
                    if type(value) is np.ndarray:  # copied in once
                        value = self._target.to_device(value)
                    values[name] = value
            else:
                values.update(zip(run.feed_names, feed_values))
            params = sys.modules.get("pdjit.codegen.params") if run.param_writes else None
            if params is not None:
                # arrays the run may change in place: what was derived from them is made
                # again, before the run and after it, failed or not (another thread may derive
                # from them meanwhile)
                written = params, scope, values, run.param_writes
                _forget_derived(written)
            if plan is not None:
                choice = None
                if not self._on_device:
                    # every free core or the caller's thread alone, as measured for this plan
                    # and batch size (threads.RunChoice)
                    choice = plan.threads_choice
                    if choice is None:
                        choice = plan.threads_choice = self._run_choice(
                            plan.drivers_settled, plan.threads_measured)
                    try:
                        batch = feed_values[0].shape[0]
                    except (IndexError, AttributeError, TypeError):  # (none, a scalar, a LoD)
                        batch = 0
                    if choice.tiny_left > 0 and batch == choice.tiny_key:
                        choice.tiny_left -= 1  # (too short a run for threads to matter)
                        choice = None
                    elif (cap := choice.begin(batch)) is choice.KEEP:
                        choice = None
                    else:
                        self._begin_run(cap)
                        t0 = time.perf_counter()
                if plan.blas:
                    with self._numpy_blas():
                        plan.run(self, env, run_index)
                else:
                    plan.run(self, env, run_index)
                if choice is not None:
                    choice.end(batch, time.perf_counter() - t0)
                # a fresh array nothing else holds goes to the user as it is (once)
                fresh = plan.fresh if return_numpy else ()
            else:
                if self.mode == "compiled":  # its plan compiles meanwhile
                    self._interpret(run.cold, run.block, env, run_index)
                else:
                    self.run_block(run.block, env, run_index)
                fresh = ()
            results = []
            given = None
            get = env.get
            for name in run.fetch_names:
                value = get(name)
                if value is None:
                    raise PdjitError(f"fetch: variable {name!r} has no value after the run")
                if name in fresh and type(value) is np.ndarray and (given is None
                                                                    or name not in given):
                    given = given or set()
                    given.add(name)
                    results.append(value)
                else:
                    results.append(_to_user(value, return_numpy))
            persistables = run.persistables
            if persistables:  # commit: only after the whole run succeeded
                for name, value in values.items():
                    if name in persistables:
                        scope.var(name).value = value
            return results
        except PdjitError:
            raise
        except Exception as e:
            raise as_pdjit_error(e, "Executor.run") from e
        finally:
            if written is not None:
                _forget_derived(written)


    def train_from_dataset(self, program: Program | None = None, dataset=None,
                           scope: Scope | None = None, thread: int = 0, debug: bool = False,
                           fetch_list=None, fetch_info=None, print_period: int = 100,
                           fetch_handler=None):
        """Fluid 1.x's trainer loop: run ``program`` once per batch of ``dataset`` (made by
        ``fluid.DatasetFactory``), printing ``fetch_list`` (labelled by ``fetch_info``) every
        ``print_period`` batches (``pdjit.runtime.dataset_run``). Returns None."""
        dataset_run.run_from_dataset(self, program, dataset, scope, thread, False, debug,
                                     fetch_list, fetch_info, print_period, fetch_handler)

    def infer_from_dataset(self, program: Program | None = None, dataset=None,
                           scope: Scope | None = None, thread: int = 0, debug: bool = False,
                           fetch_list=None, fetch_info=None, print_period: int = 100,
                           fetch_handler=None):
        """:meth:`train_from_dataset` without updates: ``program`` runs without its backward
        and optimizer ops."""
        dataset_run.run_from_dataset(self, program, dataset, scope, thread, True, debug,
                                     fetch_list, fetch_info, print_period, fetch_handler)

    def _plan(self, run):
        return self._cached(run.program, ("plan", run.fetch_names),
                            lambda: build_plan(run.program, run.fetch_names,
                                               sub_plan=self._block_plan, place=self.place,
                                               memory_optim=self.memory_optim,
                                               native_drivers=self.native_drivers,
                                               native_loops=self.native_loops,
                                               checks=self.checks, strict=self.strict))

    def _block_plan(self, block: Block, scopes: tuple = ()):
        """The compiled plan of a sub-block, built once per program content (and per set of
        fetched step scopes: fetching them keeps every value of every run of the block)."""
        return self._cached(block.program, ("block", block.idx, scopes),
                            lambda: build_plan(block.program, scopes, block=block,
                                               sub_plan=self._block_plan, place=self.place,
                                               memory_optim=self.memory_optim,
                                               native_drivers=self.native_drivers,
                                               native_loops=self.native_loops,
                                               checks=self.checks, strict=self.strict))

    def _cached(self, program: Program, key, build):
        """``build()``'s result, kept on ``program`` under its content key (computed once per
        program version), this executor's mode and place, and ``key``: a run looks it up in
        O(1), and the cache goes away with the program."""
        cache = program._run_cache()
        full = (self._kind, key)
        hit = cache.get(full, _NONE)
        if hit is _NONE:
            hit = cache[full] = build()
        return hit

    @property
    def _plans(self) -> dict:
        """The compiled plans of the programs this executor ran that are still alive:
        ``{key: (program run, plan)}`` (for introspection and tests)."""
        out = {}
        for program in list(self._runs.keys()):
            for (kind, key), value in list(program._run_cache().items()):
                if kind == self._kind and key[0] == "run" and value[1] is not None:
                    out[(id(program), key)] = (value[0].program, value[1])
        return out

    def settled(self, batch: int) -> bool:
        """Whether this executor's runs of batch size ``batch`` are served as they will go on
        being served (a benchmark's warm-up runs until then; ``threads.marks`` says whether a
        run in between was): its programs' plans built (no run interpreted while they
        compile), no kernel compiling beside the runs (``compiler.compiling_beside``) nor on a
        thread of this process (``threads.BACKGROUND``: a driver's tier-up, a loop's parallel
        variant, a recording's native calls), every plan's driver trials over and its threads
        chosen for that batch size (``threads.RunChoice``); the plans that never ran it (a
        startup program's) aside."""
        from pdjit.codegen import compiler

        if compiler.compiling_beside() or self._target.run_threads().BACKGROUND[0]:
            return False
        ran = False
        for _, plan in self._plans.values():
            choice = plan.threads_choice
            if not self._on_device and (choice is None or batch not in choice.keys):
                continue
            ran = True
            if not plan.drivers_settled(batch) or \
                    (choice is not None and not choice.settled(batch)):
                return False
        return ran

    def explain(self, program: Program | None = None, feed=None, fetch_list=None) -> str:
        """The fusion groups (with the reasons ops were not fused), the plan's steps (the plans
        of control-flow ops' sub-blocks indented under them) and the generated source for
        running ``program`` with these feeds and fetches."""
        program = program if program is not None else default_main_program()
        run = self._prepare(program, feed_fetch.feed_names_of(feed or {}),
                               feed_fetch.fetch_names_of(fetch_list), "feed", "fetch")[0]
        self._runs[program] = True  # its plans show in _plans, as if it had run
        return self._plan(run).report()

    def _prepare(self, program, feed_names, fetch_names, feed_var, fetch_var):
        """(run program, compiled plan or None, whether the feeds come in the run's column
        order), built once per program content and names: a repeated run finds them in O(1)
        and re-checks only its feed values."""
        cache = program._run_cache()
        key = (self._kind, ("run", feed_names, fetch_names, feed_var, fetch_var))
        hit = cache.get(key)
        if hit is None:
            verify.verify_for_run(program)
            run = feed_fetch.prepare(program, feed_names, fetch_names, feed_var, fetch_var)
            # outputs too large to allocate, known before the run: refused before any op runs
            checks.check_static(run.program.global_block(), self.checks.limit)
            hit = cache[key] = (run, self._first_plan(run) if self.mode == "compiled" else None,
                                run.feed_names == feed_names)
        elif hit[1] is None and self.mode == "compiled":  # its plan compiles (_first_plan)
            with self._cold_lock:  # (another thread may be taking it over)
                cold = hit[0].cold
                if cold is None:  # taken over since this thread looked
                    return cache.get(key, hit)
                if cold.wait or cold.compiled.done():
                    cold.compiled.wait()
                    hit[0].cold = None
                    hit = cache[key] = (hit[0], cold.plan, hit[2])
        return hit

    def _first_plan(self, run):
        """``run``'s compiled plan; or None while forked workers compile its kernels and its
        runs are interpreted (``cold_runs="reference"``: see the class docstring; a program too
        large to interpret plans at once, its kernels that have a stand-in compiled beside
        its runs)."""
        if self.cold_runs != "reference" or self.strict or self._target.device:
            return self._plan(run)
        from pdjit.codegen.compiler import compile_later, stand_ins

        if _values_held(run.program) > COLD_RUN_VALUES:
            with stand_ins():  # (the kernels that have a stand-in compile beside its runs)
                return self._plan(run)
        with compile_later() as compiled:
            plan = self._plan(run)
        if compiled.done():  # nothing left to compile (or no worker could be forked)
            return plan
        run.cold = _ColdPlan(plan, compiled)  # (the run's own: this executor's cache entry)
        return None

    def _interpret(self, cold, block, env: Env, run_index: int) -> None:
        """A run of a plan still compiling (:meth:`_first_plan`), by the references; one that
        takes over :data:`COLD_RUN_MAX_S`, or the last of :data:`COLD_RUN_MAX_RUNS`, makes the
        next run wait for the compiled plan."""
        if self._interpreter is None:
            self._interpreter = Executor(self.place, mode="reference", strict=self.strict,
                                         native_drivers=False, cold_runs=self.cold_runs)
            self._interpreter.checks = self.checks
        t0 = time.perf_counter()
        self._interpreter.run_block(block, env, run_index)
        if cold is None:  # (taken over by another thread since this run looked)
            return
        cold.runs += 1
        cold.wait = cold.wait or time.perf_counter() - t0 > COLD_RUN_MAX_S or \
            cold.runs >= COLD_RUN_MAX_RUNS

    # -- interpretation -------------------------------------------------------------------------
    # the reference interpreter (pdjit.runtime.interpreter): one op with its NumPy reference
    # (the runner protocol plan steps and references use: pdjit.runtime.context.Runner)
    def run_op(self, op, op_idx: int, env: Env, run_index: int) -> None:
        if self._target.device:
            _inputs_to_host(op, env, self._target)
        interpreter.run_op(self, op, op_idx, env, run_index)

    def run_block(self, block: Block, env: Env, run_index: int) -> None:
        if self.mode == "compiled" and block.idx != 0:  # a sub-block: its own compiled plan
            self._block_plan(block, env.fetched_scopes).run(self, env, run_index)
            return
        recorder = profile.active  # fluid.profiler: each op timed
        for op_idx, op in enumerate(block.ops):
            opdef = registry.lookup(op.type)
            if opdef is not None and opdef.has(registry.FEED_FETCH):
                continue  # the run binds feeds and reads fetches by name
            if recorder is None:
                self.run_op(op, op_idx, env, run_index)
                continue
            t0 = time.perf_counter()
            try:
                self.run_op(op, op_idx, env, run_index)
            finally:
                recorder.add(op.type, time.perf_counter() - t0)

def _inputs_to_host(op, env: Env, target) -> None:
    """Before ``op`` runs on the host (its reference), its inputs that live on the device are
    copied over (counted); control-flow ops see their values as they are (a ``while`` reads
    its condition each iteration, its body's plan launches device kernels)."""
    opdef = registry.lookup(op.type)
    if opdef is None or opdef.has(registry.CONTROL_FLOW) or opdef.has(registry.FEED_FETCH):
        return
    for name in set(op.input_arg_names):
        v = env.get(name)
        if target.is_device_array(v):
            env.set(name, target.to_host(v))
        elif isinstance(v, LoDTensor) and target.is_device_array(v._array):
            env.set(name, LoDTensor._wrap(target.to_host(v._array), v._lod))


def _forget_derived(written) -> None:
    """What was derived from the arrays of ``names`` (``written``: the params module, the
    scope, the run's values, the names) is made again when next asked for."""
    params, scope, values, names = written
    if not params.any_derived():
        return
    arrays = [values.get(n) for n in names]
    for n in names:
        sv = scope.find_var(n)
        arrays.append(None if sv is None else sv.value)
    params.written(arrays)


def _to_user(value, return_numpy: bool):
    """A fetched value as the user gets it: a copy; with ``return_numpy=False`` a LoDTensor
    (with an empty LoD for a dense value, as Fluid gives). A value in a device's memory (any
    device target's: a scope may hold another executor's) is copied out."""
    target = device_holder(value)
    if target is not None:  # copied out (return_numpy=False: stays there)
        return target.to_host(value) if return_numpy else LoDTensor._wrap(value, [])
    if isinstance(value, LoDTensor):
        target = device_holder(value._array)
        if target is not None:
            if return_numpy:
                return target.to_host(value._array)
            return value
        if return_numpy:
            return np.array(value, copy=True)
        return LoDTensor._wrap(np.array(value, copy=True), list(value._lod))
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True) if return_numpy else \
            LoDTensor._wrap(np.array(value, copy=True), [])
    if isinstance(value, list):
        return [_to_user(v, return_numpy) for v in value]
    return value
