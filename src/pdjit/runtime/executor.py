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
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import OpRunError, PdjitError, UnregisteredOpError
from pdjit.framework.program import Block, Program, default_main_program
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime import feed_fetch
from pdjit.runtime.context import Env, RunContext
from pdjit.runtime.place import CPUPlace, Place
from pdjit.runtime.plan import build_plan
from pdjit.runtime.scope import Scope, global_scope
from pdjit.runtime.tensor import LoDTensor, check_offsets

VarType = pb.VarType
MODES = ("compiled", "reference")


def _default_mode() -> str:
    mode = os.environ.get("PDJIT_EXECUTOR", "compiled").strip().lower()
    if mode not in MODES:
        raise ValueError(f"PDJIT_EXECUTOR={mode!r}: expected one of {MODES}")
    return mode


class Executor:
    """Runs programs in a Scope. ``strict=True`` (or ``PDJIT_STRICT=1``) makes native code that
    falls back to the NumPy references an error (:class:`FallbackError`) instead of a warning
    (:class:`FallbackWarning`, once per plan step); ops planned as reference steps (no
    lowering) are not fallbacks."""

    def __init__(self, place: Place | None = None, mode: str | None = None,
                 strict: bool | None = None):
        self.place = place if place is not None else CPUPlace()
        if not isinstance(self.place, Place):
            raise TypeError(f"Executor: place must be CPUPlace() or CUDAPlace(i), got {place!r}")
        if self.place.kind != "cpu":
            raise NotImplementedError(f"Executor: {self.place!r} is not supported yet; use "
                                      f"CPUPlace()")
        self.mode = mode.lower() if mode else _default_mode()
        self.strict = bool(strict) if strict is not None else \
            os.environ.get("PDJIT_STRICT", "0").strip() not in ("", "0")
        if self.mode not in MODES:
            raise ValueError(f"Executor: mode {mode!r} is not one of {MODES}")
        self._prepared: dict = {}
        self._plans: dict = {}
        self._block_plans: dict = {}   # sub-block plans: (program id, version, block idx)
        self._runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def close(self) -> None:
        self._prepared.clear()
        self._plans.clear()
        self._block_plans.clear()

    # -- the public entry point -----------------------------------------------------------------
    def run(self, program: Program | None = None, feed=None, fetch_list=None,
            feed_var_name: str = "feed", fetch_var_name: str = "fetch", scope: Scope | None = None,
            return_numpy: bool = True, use_program_cache: bool = True):
        program = program if program is not None else default_main_program()
        if not isinstance(program, Program):
            raise TypeError(f"Executor.run: program must be a Program, got "
                            f"{type(program).__name__}")
        if feed is not None and not isinstance(feed, dict):
            raise TypeError(f"Executor.run: feed must be a dict of name -> value, got "
                            f"{type(feed).__name__}")
        if isinstance(fetch_list, (str,)) or (fetch_list is not None
                                              and not isinstance(fetch_list, (list, tuple))):
            fetch_list = [fetch_list]
        scope = scope if scope is not None else global_scope()
        feed = feed or {}
        try:
            feed_names = tuple([k if type(k) is str else k.name for k in feed])
            fetch_names = tuple([f if type(f) is str else f.name for f in fetch_list or ()])
        except AttributeError:  # let the checking versions say what was wrong
            feed_names = feed_fetch.feed_names_of(feed)
            fetch_names = feed_fetch.fetch_names_of(fetch_list)
        run, plan = self._prepare(program, feed_names, fetch_names, feed_var_name,
                                  fetch_var_name)

        gb = run.program.global_block()
        by_name = {(k if type(k) is str else k.name): v for k, v in feed.items()}
        feed_values = [feed_fetch.check_feed_spec(spec, by_name[n])
                       for n, spec in zip(run.feed_names, run.feed_specs)]

        run_index = self._runs.get(program, 0)
        self._runs[program] = run_index + 1
        env = Env(scope, gb)
        if plan is not None:
            values = env.values
            for name, value in zip(run.feed_names, feed_values):
                values[name] = value
            plan.run(self, env, run_index)
            fetched = [env.get(n) for n in run.fetch_names]
            if return_numpy:  # a fresh array nothing else holds goes to the user as it is
                given = set()
                for i, n in enumerate(run.fetch_names):
                    v = fetched[i]
                    if n in plan.fresh and n not in given and type(v) is np.ndarray:
                        fetched[i] = _Owned(v)
                        given.add(n)
        else:
            env.set(run.feed_var, feed_values)
            env.set(run.fetch_var, [None] * len(run.fetch_names))
            self._run_block(gb, env, run_index)
            fetched = env.get(run.fetch_var)
        results = []
        for name, value in zip(run.fetch_names, fetched):
            if value is None:
                raise PdjitError(f"fetch: variable {name!r} has no value after the run")
            results.append(_to_user(value, return_numpy))
        for name, value in env.values.items():  # commit: only after the whole run succeeded
            if name in run.persistables:
                scope.var(name).value = value
        return results

    def _plan(self, run):
        key = (id(run.program), run.program.version)
        hit = self._plans.get(key)
        if hit is not None and hit[0] is run.program:
            return hit[1]
        plan = build_plan(run.program, run.fetch_names, sub_plan=self._block_plan,
                          place=self.place)
        self._plans[key] = (run.program, plan)
        return plan

    def _block_plan(self, block: Block):
        """The compiled plan of a sub-block, built once per program version."""
        program = block.program
        key = (id(program), program.version, block.idx)
        hit = self._block_plans.get(key)
        if hit is not None and hit[0] is program:
            return hit[1]
        plan = build_plan(program, (), block=block, sub_plan=self._block_plan,
                          place=self.place)
        self._block_plans[key] = (program, plan)
        return plan

    def explain(self, program: Program | None = None, feed=None, fetch_list=None) -> str:
        """The fusion groups (with the reasons ops were not fused), the plan's steps (the plans
        of control-flow ops' sub-blocks indented under them) and the generated source for
        running ``program`` with these feeds and fetches."""
        program = program if program is not None else default_main_program()
        run, _ = self._prepare(program, feed_fetch.feed_names_of(feed or {}),
                               feed_fetch.fetch_names_of(fetch_list), "feed", "fetch")
        return self._plan(run).report()

    def _prepare(self, program, feed_names, fetch_names, feed_var, fetch_var):
        """(run program, compiled plan or None), built once per program version and names."""
        key = (id(program), program.version, feed_names, fetch_names, feed_var, fetch_var)
        hit = self._prepared.get(key)
        if hit is not None and hit[0] is program:
            return hit[1], hit[2]
        run = feed_fetch.prepare(program, feed_names, fetch_names, feed_var, fetch_var)
        plan = self._plan(run) if self.mode == "compiled" else None
        self._prepared[key] = (program, run, plan)
        return run, plan

    # -- interpretation -------------------------------------------------------------------------
    def _run_block(self, block: Block, env: Env, run_index: int) -> None:
        if self.mode == "compiled" and block.idx != 0:  # a sub-block: its own compiled plan
            self._block_plan(block).run(self, env, run_index)
            return
        for op_idx, op in enumerate(block.ops):
            self._run_op(op, op_idx, env, run_index)

    def _run_op(self, op, op_idx: int, env: Env, run_index: int) -> None:
        opdef = registry.lookup(op.type)
        if opdef is None:
            raise UnregisteredOpError(f"{op._describe()}: op type {op.type!r} is not registered "
                                      f"in pdjit, so the program cannot run")
        ctx = RunContext(self, env, op, op_idx, run_index)
        raw = opdef.has(registry.FEED_FETCH) or opdef.has(registry.CONTROL_FLOW)
        inputs = {}
        for slot in opdef.inputs:
            names = [n for n in op.input(slot.name) if n != registry.EMPTY_VAR_NAME]
            values = []
            for n in names:
                value = env.get(n)
                if value is None:
                    var = op.block._find_var_recursive(n)
                    if var is not None and var.type == VarType.LOD_TENSOR_ARRAY:
                        value = []  # a tensor array nothing has written to yet is empty
                    elif opdef.has(registry.CONTROL_FLOW):
                        values.append(None)  # control flow decides what a missing value means
                        continue
                    else:
                        raise _op_error(op, op_idx, f"input {slot.name!r} reads variable {n!r}, "
                                        f"which holds no value (run the startup program, or "
                                        f"feed it)")
                if not raw:  # in_lods[slot][i]: the LoD of the slot's i-th value ([]: none)
                    slot_lods = ctx.in_lods.setdefault(slot.name, [])
                    slot_lods.append(value.lod() if isinstance(value, LoDTensor) else [])
                    if isinstance(value, LoDTensor):
                        value = np.asarray(value)
                values.append(value)
            inputs[slot.name] = values if slot.duplicable else (values[0] if values else None)
        attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
        try:
            with np.errstate(all="ignore"):
                result = opdef.call_reference(inputs, attrs, ctx)
        except PdjitError as e:
            if isinstance(e, OpRunError):
                raise
            raise _op_error(op, op_idx, str(e)) from e
        except (ValueError, IndexError, KeyError, TypeError, ArithmeticError, MemoryError) as e:
            raise _op_error(op, op_idx, f"{type(e).__name__}: {e}") from e
        self._store_outputs(op, op_idx, opdef, result, ctx, env, raw)

    def _store_outputs(self, op, op_idx, opdef, result, ctx, env, raw) -> None:
        block = op.block
        first_lod = next((lod for lods in ctx.in_lods.values() for lod in lods if lod), None)
        rule = {}  # output LoDs from the op's out_lod rule (registry.py)
        if opdef.out_lod is not None and not raw:
            lods = {s.name: ctx.in_lods.get(s.name, []) if s.duplicable
                    else ctx.input_lod(s.name) for s in opdef.inputs
                    if any(n != registry.EMPTY_VAR_NAME for n in op.input(s.name))}
            try:
                rule = opdef.call_out_lod(lods, op.all_attrs())
            except registry.ValueDependentLoD:
                rule = {}
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise _op_error(op, op_idx, str(e)) from e
        for slot in opdef.outputs:
            names = op.output(slot.name)  # may hold @EMPTY@ placeholders: matched by position
            if not any(n != registry.EMPTY_VAR_NAME for n in names):
                continue
            if slot.name not in result:
                if slot.dispensable or slot.intermediate:
                    continue
                raise _op_error(op, op_idx, f"internal: the reference gave no output "
                                f"{slot.name!r}")
            values = result[slot.name]
            values = list(values) if slot.duplicable else [values]
            if len(values) != len(names):
                raise _op_error(op, op_idx, f"internal: output {slot.name!r} binds {len(names)} "
                                f"variables, the reference gave {len(values)} values")
            for i, (n, value) in enumerate(zip(names, values)):
                if n == registry.EMPTY_VAR_NAME or (raw and value is None):
                    continue  # (a control-flow op's None: that output is left untouched)
                if not raw and isinstance(value, np.ndarray):
                    var = block._find_var_recursive(n)
                    lod = ctx.out_lods.get(slot.name, {}).get(i)
                    if lod is None and slot.name in rule:
                        lod = rule[slot.name][i] if slot.duplicable else rule[slot.name]
                    if lod is None and first_lod and var is not None and var.lod_level and \
                            value.ndim and value.shape[0] == first_lod[-1][-1]:
                        lod = first_lod
                    if lod:
                        try:
                            value = LoDTensor._wrap(value, check_offsets(
                                lod, value.shape[0] if value.ndim else 1, "its LoD"))
                        except ValueError as e:
                            raise _op_error(op, op_idx, f"output {slot.name!r}: {e}") from e
                env.set(n, value)


def _op_error(op, op_idx, reason) -> OpRunError:
    return OpRunError(reason, op.type, op.block.idx, op_idx, op.location())


class _Owned:
    """A fetched array no one else holds: handed over without a copy."""
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def _to_user(value, return_numpy: bool):
    """A fetched value as the user gets it: a copy; with ``return_numpy=False`` a LoDTensor
    (with an empty LoD for a dense value, as Fluid gives)."""
    if type(value) is _Owned:
        return value.array if return_numpy else LoDTensor._wrap(value.array, [])
    if isinstance(value, LoDTensor):
        if return_numpy:
            return np.array(value, copy=True)
        return LoDTensor._wrap(np.array(value, copy=True), list(value._lod))
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True) if return_numpy else \
            LoDTensor._wrap(np.array(value, copy=True), [])
    if isinstance(value, list):
        return [_to_user(v, return_numpy) for v in value]
    return value
