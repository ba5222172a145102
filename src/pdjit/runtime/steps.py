"""The steps a plan runs, each made from one node of a plan description
(:mod:`pdjit.codegen.pipeline`): :class:`NativeStep` (a native segment's driver, on any
target), :class:`LoopStep` (a whole loop in one native function) and :class:`ReferenceStep`
(one op's NumPy reference). A step runs through a runner (:class:`pdjit.runtime.context.Runner`:
run an op, run a block); what differs per target sits behind the target
(:class:`pdjit.codegen.target.Target`): its device memory (``to_device``, ``lod_offsets``)
and the choice among a step's drivers (``step_tiers``: the CPU's host driver, native driver
and batch splitting). The runtime never asks which target it is.

A native step that fails (a shape that does not fit, a damaged cache) re-runs its ops with their
references on the same, untouched values: that gives the precise error naming the op, or the
right answer. Nothing a native step computes reaches the env before it returned. Random ops
draw with keys bound at run time (``RunContext.rng_key``): a native step passes each one's key;
a native loop passes the key without its own iteration and derives each iteration's in the
generated code.

Run-time checks (``pdjit.runtime.checks``): a native step whose outputs' sizes depend on its
inputs' shapes checks them against the allocation limit before its native code runs (once per
new tuple of input shapes); with NaN/Inf checking on, its outputs are checked after it
returned, and on NaN/Inf its ops re-run with their references to name the first op that
produced it.
"""
from __future__ import annotations

import operator
import warnings
import weakref

import numpy as np
from numba.core.errors import NumbaError

from pdjit.codegen import pipeline
from pdjit.codegen.compiler import CACHE_ERRORS
from pdjit.codegen.loops import LIMIT_MESSAGE
from pdjit.framework import limits
from pdjit.framework.errors import FallbackError, FallbackWarning, describe_op, user_stacklevel
from pdjit.runtime import checks as run_checks
from pdjit.runtime import profile
from pdjit.runtime.context import RunContext, StepScopes
from pdjit.runtime.lod_flow import LoDFlow, LoDUnavailable
from pdjit.runtime.scope import LAYOUT as scope_layout
from pdjit.runtime.tensor import LoDTensor

_NOTHING = object()
#: the fewest parameters for which a step keeps them from run to run (``NativeStep.run``):
#: with fewer, looking them up costs less than checking the kept ones (a 3-op program with
#: none took 8.5 us a run with the check against 7.3 without)
KEEP_MIN_PARAMS = 8


class ReferenceStep:
    kind = "reference"
    device = None  # (runs on the host)
    tiers = None   # (no drivers to pick among)

    def __init__(self, op, op_idx: int, why: str, sub_plans=()):
        self.op, self.op_idx, self.why = op, op_idx, why
        self.sub_plans = list(sub_plans)   # [(block idx, Plan)] of a control-flow op

    def run(self, runner, env, run_index) -> None:
        runner.run_op(self.op, self.op_idx, env, run_index)

    def describe(self) -> str:
        return f"reference {self.op.type}#{self.op_idx} ({self.why})"


class NativeStep:
    """A native segment (``node``: a :class:`pdjit.codegen.pipeline.NativeSegment`) run by
    its driver on the ``target``: a device target's inputs are copied to the device once (the
    device copy replaces the host value in the env, so later steps and the Scope hold it) and
    its outputs stay there; the target's ``step_tiers`` (the CPU's) picks among the step's
    drivers run by run. ``guard``: the allocation check of its run-time shapes (None: every
    output size was checked when the plan was built); ``nan_inf``: outputs checked."""
    kind = "native"
    sub_plans = ()  # (no sub-blocks: a control-flow op's run as a reference step or a loop)

    def __init__(self, node, target, guard=None, nan_inf: bool = False):
        self.compiled, self.args, self.expected = node.compiled, node.args, node.expected
        self.outputs, self.ops, self.description = node.outputs, node.ops, node.description
        self.groups = node.groups or [node.ops]  # the ops of each group, naming what failed
        self.rng_ops = list(node.rng_ops)  # [(op, op_idx)]: a key argument each
        self.batch_arg = node.batch_arg
        self.guard, self.nan_inf, self.target = guard, nan_inf, target
        self.device = target if target.device else None
        # the arguments that are parameters (persistables the step does not write): an array
        # seen and checked last run is passed on without its checks again
        self._params = frozenset(node.params)
        self._checked = [_NOTHING] * len(self.args)  # (a missing input, None, never matches)
        self._bind = [(n, dt, nd) for n, (dt, nd) in zip(self.args, self.expected)]
        self._varying = [i for i in range(len(self.args)) if i not in self._params]
        self._param_list = sorted(self._params)
        # argument i's place in the parameters' arrays followed by the other arguments'
        place = {i: k for k, i in enumerate(self._param_list + self._varying)}
        self._order = [place[i] for i in range(len(self.args))]
        self._param_names = frozenset(self.args[i] for i in self._param_list)
        # (the Scope (weakly), its layout then, the parameters' ScopeVars, their arrays): the
        # parameters as a run of a block's top-level env found them (see run), for a step of
        # enough of them to pay for the check
        self._kept = None
        self._keeps = len(self._param_list) >= KEEP_MIN_PARAMS
        self._guard_seen: dict = {}
        self.fallbacks = 0                 # how many runs fell back to the references
        self.retired = None                # why the native code was given up, if it was
        self.last_fallback = None          # (op, op_idx, reason) of the latest fallback
        # LoD: inputs that are LoDTensors run natively; lod_flow gives the outputs their LoD
        # and binds the offsets arguments that sequence lowerings asked for
        self.lod_flow = LoDFlow(self.ops, node.lod_requests)
        self.tiers = target.step_tiers(self, node.native, node.build_native, node.tier_mode,
                                       node.split)

    @property
    def params(self) -> frozenset:
        """The indices of its arguments that are parameters (persistables it does not
        write)."""
        return self._params

    @property
    def native(self):
        """The step's native driver, once it has one (None: the host driver serves)."""
        return self.tiers.native_driver if self.tiers is not None else None

    def call_host(self, values, replay=None):
        """The host driver on ``values`` (``fluid.profiler``: each group of it timed), through
        ``replay`` where given (its ``call(values)``: the driver's kernel calls recorded and
        replayed, ``pdjit.codegen.cpu.replay``)."""
        if profile.active is not None:
            return profile.timed_groups(self, values)
        if replay is not None:
            return replay.call(values)
        return self.compiled.fn(*values)

    def run(self, runner, env, run_index) -> None:
        top = env.parent is None
        arg_lods, fresh_param = None, False  # (a parameter not the array checked last run)
        if self.device is not None:
            bound = self._bind_device(runner, env, run_index)
            if bound is None:
                return
            values, arg_lods = bound
            fresh_param = True
        else:
            # the parameters as the Scope held them last run, where nothing moved them: passed
            # on without a lookup each (at batch 1 the lookups of a model's hundred or more
            # weights, ~0.5 us each from cold caches: MobileNetV3-small 2-3 % faster without)
            keeps = top and self._keeps
            kept = self._kept if keeps else None
            if kept is not None and kept[0]() is env.scope and kept[1] == scope_layout[0] and \
                    self._param_names.isdisjoint(env.values):
                now = [sv.value for sv in kept[2]]
                if not all(map(operator.is_, now, kept[3])):
                    kept = None
            else:
                kept = None
            indices = self._varying if kept is not None else range(len(self._bind))
            values = [None] * len(self._bind)
            kept_vars = [] if keeps and kept is None else None  # (the parameters' ScopeVars)
            # the args: the run's env, else the Scope (a block's top-level env has no parent:
            # its lookups are inlined here, the same as Env.get)
            local, find, get = env.values.get, env.scope.find_var, env.get
            checked, bind, params = self._checked, self._bind, self._params
            for i in indices:
                name, dtype, ndim = bind[i]
                if top:
                    a = local(name, _NOTHING)
                    if a is _NOTHING:
                        sv = find(name)
                        a = None if sv is None else sv.value
                        if kept_vars is not None and i in params:
                            kept_vars.append(sv)
                    elif i in params:
                        kept_vars = None  # (a parameter the run itself wrote: no shortcut)
                else:
                    a = get(name)
                if a is checked[i]:  # the same parameter array as last run: checked then
                    values[i] = a
                    continue
                if type(a) is not np.ndarray:
                    if not isinstance(a, LoDTensor) or a._array is None:
                        return self._fallback(runner, env, run_index, self._reader(name),
                                              f"input {name!r} holds {type(a).__name__}, "
                                              f"not a dense tensor")
                    if a._lod:
                        arg_lods = arg_lods or {}
                        arg_lods[name] = a._lod
                    a = a._array
                    if i in params:
                        kept_vars = None  # (the Scope holds the LoDTensor, not its array)
                if a.dtype != dtype or a.ndim != ndim:
                    if a.size == 1 and a.ndim + ndim == 1 and a.dtype == dtype:
                        a = a.reshape((1,) if ndim else ())  # one value, declared [] or [1]
                    else:
                        return self._mismatch(runner, env, run_index, name, a, dtype, ndim)
                if i in params:
                    fresh_param = True
                if not a.flags.c_contiguous or not a.flags.writeable:
                    a = np.array(a, order="C")
                    if i in params:
                        kept_vars = None  # (a copy each run: not the Scope's array)
                elif i in params:
                    checked[i] = a
                values[i] = a
            if kept is not None:  # (the parameters put in their places by one C-level pass)
                merged = now + [values[i] for i in self._varying]
                values = list(map(merged.__getitem__, self._order))
            elif kept_vars is not None:
                self._kept = (weakref.ref(env.scope), scope_layout[0], kept_vars,
                              [values[i] for i in self._param_list])
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
                    return self._fallback(runner, env, run_index, misfit[:2], misfit[2])
                seen[key] = True
        if self.retired is not None:
            return self._fallback(runner, env, run_index, self.ops[0],
                                  f"its native code was given up: {self.retired}")
        lods = None
        if arg_lods is not None or self.lod_flow.always:
            try:
                lods, extra = self.lod_flow.resolve(arg_lods or {})
            except LoDUnavailable as e:
                return self._fallback(runner, env, run_index, self.ops[0],
                                      f"a LoD it needs is unknown: {e}")
            values += self.target.lod_offsets(extra)
        if self.rng_ops:
            values += [np.uint64(RunContext(runner, env, op, i, run_index).rng_key())
                       for op, i in self.rng_ops]
        try:
            tiers = self.tiers
            if tiers is not None:
                results = tiers.call(values)
            elif profile.active is not None:  # fluid.profiler: each group of the driver timed
                results = profile.timed_groups(self, values)
            else:
                results = self.compiled.fn(*values)
        except NumbaError as e:  # the code does not compile: never try again (it is slow)
            self.retired = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return self._fallback(runner, env, run_index, self._failing(e),
                                  f"its native code does not compile ({self.retired})")
        except CACHE_ERRORS as e:
            if not _is_cache_damage(e):
                error = self._native_error(e)
                if error is not None:
                    raise error from None
                return self._fallback(runner, env, run_index, self._failing(e),
                                      f"{type(e).__name__}: {e}")
            self.compiled.reload_clean()
            results = self.compiled.fn(*values)
        except Exception as e:  # noqa: BLE001 - any failure: the references say what it was
            error = self._native_error(e)
            if error is not None:
                raise error from None
            return self._fallback(runner, env, run_index, self._failing(e),
                                  f"{type(e).__name__}: {e}")
        if self.nan_inf:  # NaN/Inf: the references name the first op that produced it
            host = results if self.device is None else [self.device.to_host(r) for r in results]
            run_checks.pinpoint(runner, env, run_index, self.ops, self.outputs, host)
        if lods is not None:
            try:
                results = [LoDFlow.attach(n, v, lods) for n, v in zip(self.outputs, results)]
            except LoDUnavailable as e:
                return self._fallback(runner, env, run_index, self.ops[0],
                                      f"an output's LoD is unknown: {e}")
        if top:  # (Env.set of a top-level env: its own values)
            env.values.update(zip(self.outputs, results))
        else:
            set_ = env.set
            for name, value in zip(self.outputs, results):
                set_(name, value)

    def _bind_device(self, runner, env, run_index):
        """``(arguments, their LoDs or None)`` on the device target (a host input copied
        there once: the copy replaces it in the env); None after a fallback."""
        values, arg_lods, device = [], None, self.device
        get = env.get
        for name, dtype, ndim in self._bind:
            a = get(name)
            lod = None
            if isinstance(a, LoDTensor):
                if a._array is None:
                    return self._fallback(runner, env, run_index, self._reader(name),
                                          f"input {name!r} is an empty LoDTensor")
                lod = a._lod
                if lod:
                    arg_lods = arg_lods or {}
                    arg_lods[name] = lod
                a = a._array
            on_device = device.is_device_array(a)
            if not on_device and type(a) is not np.ndarray:
                return self._fallback(runner, env, run_index, self._reader(name),
                                      f"input {name!r} holds {type(a).__name__}, not a dense "
                                      f"tensor")
            if np.dtype(a.dtype) != dtype or a.ndim != ndim:
                return self._mismatch(runner, env, run_index, name, a, dtype, ndim)
            if not on_device:  # copied once: the device copy serves every later reader
                a = device.to_device(a)
                env.set(name, LoDTensor._wrap(a, lod) if lod else a)
            values.append(a)
        return values, arg_lods

    def _mismatch(self, runner, env, run_index, name, a, dtype, ndim):
        return self._fallback(runner, env, run_index, self._reader(name),
                              f"input {name!r} is {np.dtype(a.dtype)} of rank {a.ndim}; the "
                              f"plan was built for {np.dtype(dtype)} of rank {ndim}")

    def _native_error(self, exc):
        """The pdjit error that native code's ``exc`` stands for, raised as it is instead of
        running the references again (None: the references say what went wrong)."""
        return None

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

    def _fallback(self, runner, env, run_index, culprit, reason: str) -> None:
        """Run the ops with their references on the untouched values; say so once (a
        warning), or, in strict mode, raise once the references got through."""
        self.fallbacks += 1
        op, op_idx = culprit
        self.last_fallback = (op, op_idx, reason)
        for o, i in self.ops:
            runner.run_op(o, i, env, run_index)
        what = f"native code fell back to the NumPy references: {reason}"
        if runner.strict:
            raise FallbackError(f"{what} (strict mode)", op.type, op.block.idx, op_idx,
                                op.location())
        if self.fallbacks == 1:
            warnings.warn(describe_op(op.type, op.block.idx, op_idx, op.location()) + ": " +
                          what, FallbackWarning, stacklevel=user_stacklevel())

    def describe(self) -> str:
        tail = f" ({self.fallbacks} fallback(s), last: {self.last_fallback[2]})" \
            if self.fallbacks else ""
        head = "device native" if self.device is not None else "native"
        if self.retired:
            return f"{head} {self.compiled.name} RETIRED ({self.retired}): " \
                   f"{self.description}{tail}"
        if self.tiers is not None:
            tail += self.tiers.describe()
        return f"{head} {self.compiled.name}: {self.description}{tail}"


class LoopStep(NativeStep):
    """A loop op run as one native function (``node``: a
    :class:`pdjit.codegen.pipeline.NativeLoop`): the condition and the body run in native
    code, no Python per iteration. Any mismatch or failure re-runs the loop op's reference on
    the untouched values (the generated loop never writes its inputs)."""
    kind = "native_loop"

    def __init__(self, node, target, nan_inf: bool = False):
        loop = node.loop
        seg = pipeline.NativeSegment(node.compiled, node.args, node.expected, node.outputs,
                                     node.ops, [], node.description, None,
                                     rng_ops=node.rng_ops)
        super().__init__(seg, target, nan_inf=nan_inf)
        self.op, self.op_idx, self.body_idx = node.op, node.op_idx, node.body
        self.control = node.control
        self.limit = loop.limit  # the iteration bound the loop was generated with
        self.step_scopes = node.step_scopes

    def run(self, runner, env, run_index) -> None:
        get = env.get
        for name in self.args:
            if get(name) is None:  # a value no op wrote before the loop (the body writes it
                # before it reads it): native code takes arrays only, the loop op's reference
                # takes that, by design (not a fallback)
                return runner.run_op(self.op, self.op_idx, env, run_index)
        before = self.fallbacks
        super().run(runner, env, run_index)
        if self.fallbacks == before:  # ran natively: no iteration's scope was kept
            for name in self.step_scopes:
                env.set(name, StepScopes())

    def _native_error(self, exc):
        """The loop ran past its iteration bound: the error the loop op's reference raises
        there (running the loop again with the references would only take longer)."""
        if isinstance(exc, ValueError) and str(exc) == LIMIT_MESSAGE:
            cond = self.op.input(self.control.condition)[0]
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
