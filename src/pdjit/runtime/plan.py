"""Compiled plans: a block lowered to steps, built once per program version, run every time.

``build_plan`` runs the pipeline — prune, partition into fusion groups and segments, generate
and compile one native function per segment — and returns a :class:`Plan`. A plan is a list of
steps: :class:`NativeStep` (one Numba function) and :class:`ReferenceStep` (one op's NumPy
reference, for ops without ``emit``). Feed and fetch are bound by the executor directly.

A native step that fails (a shape that does not fit, a damaged cache) re-runs its ops with their
references on the same, untouched values: that gives the precise error naming the op, or the
right answer. Nothing a native step computes reaches the env before it returned.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
from numba.core.errors import NumbaError

from pdjit.codegen.compiler import CACHE_ERRORS, compile_function
from pdjit.codegen.lowering import Declined, SegmentGen
from pdjit.framework import registry
from pdjit.passes import dump_after
from pdjit.passes.fusion import live_names, partition
from pdjit.passes.prune import prune
from pdjit.runtime import threads


class ReferenceStep:
    def __init__(self, op, op_idx: int, why: str):
        self.op, self.op_idx, self.why = op, op_idx, why

    def run(self, executor, env, run_index) -> None:
        executor._run_op(self.op, self.op_idx, env, run_index)

    def describe(self) -> str:
        return f"reference {self.op.type}#{self.op_idx} ({self.why})"


class NativeStep:
    def __init__(self, compiled, args, expected, outputs, ops, description):
        self.compiled, self.args, self.expected, self.outputs = compiled, args, expected, outputs
        self.ops = ops                     # [(op, op_idx)] for the reference fallback
        self.description = description
        self.fallbacks = 0                 # how many runs fell back to the references
        self.retired = None                # why the native code was given up, if it was

    def run(self, executor, env, run_index) -> None:
        values = []
        get = env.get
        for name, (dtype, ndim) in zip(self.args, self.expected):
            a = get(name)
            if type(a) is not np.ndarray or a.dtype != dtype or a.ndim != ndim:
                return self._fallback(executor, env, run_index)
            if not a.flags.c_contiguous or not a.flags.writeable:
                a = np.array(a, order="C")
            values.append(a)
        if self.retired is not None:
            return self._fallback(executor, env, run_index)
        try:
            results = self.compiled.fn(*values)
        except NumbaError as e:  # the code does not compile: never try again (it is slow)
            self.retired = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            return self._fallback(executor, env, run_index)
        except CACHE_ERRORS as e:
            if not _is_cache_damage(e):
                return self._fallback(executor, env, run_index)
            self.compiled.reload_clean()
            results = self.compiled.fn(*values)
        except Exception:  # noqa: BLE001 - any failure: the references say what it was
            return self._fallback(executor, env, run_index)
        set_ = env.set
        for name, value in zip(self.outputs, results):
            set_(name, value)

    def _fallback(self, executor, env, run_index) -> None:
        self.fallbacks += 1
        for op, op_idx in self.ops:
            executor._run_op(op, op_idx, env, run_index)

    def describe(self) -> str:
        if self.retired:
            return f"native {self.compiled.name} RETIRED ({self.retired}): {self.description}"
        return f"native {self.compiled.name}: {self.description}"


def _is_cache_damage(e: Exception) -> bool:
    import pickle

    return isinstance(e, (pickle.UnpicklingError, EOFError))


class Plan:
    """``fresh``: names whose final value is a new array made by native code (not a view, not
    persistable) that nothing else holds after the run: the executor may hand it to the user
    without copying."""

    def __init__(self, steps, partition_text, sources, compile_seconds, fresh=frozenset()):
        self.steps = steps
        self.fresh = fresh
        self.partition_text = partition_text
        self.sources = sources
        self.compile_seconds = compile_seconds

    def run(self, executor, env, run_index) -> None:
        for step in self.steps:
            step.run(executor, env, run_index)

    def report(self) -> str:
        lines = ["== fusion ==", self.partition_text, "== steps =="]
        lines += [f"  {s.describe()}" for s in self.steps]
        for name, text in self.sources:
            lines += [f"== generated source: {name} ==", text]
        return "\n".join(lines)


def build_plan(program, fetch_names) -> Plan:
    """Lower ``program``'s global block (feed/fetch ops excluded) into a plan."""
    t0 = time.perf_counter()
    threads.ensure_applied()
    block = program.global_block()
    kept = prune(block, fetch_names)
    ops = [op for op in kept if not _is_feed_fetch(op)]
    dump_after("prune", lambda: "\n".join(repr(op) for op in ops))
    index = {id(op): i for i, op in enumerate(block.ops)}
    live = live_names(program, block, fetch_names)
    declined: set = set()
    while True:  # generate every segment's source; an op whose lowering declines runs its
        part = partition(block, ops, live, declined)  # reference, and we partition again
        try:
            gens = _generate(part, block, live)
            break
        except Declined as d:
            declined.add(id(d.op))
    dump_after("fusion", part.describe)
    steps, sources = [], []
    for seg, gen in zip(part.segments, gens):
        if gen is None:
            node = seg.groups[0].nodes[0]
            steps.append(ReferenceStep(node.op, index[id(node.op)], node.why_not))
            continue
        compiled = compile_function(gen.source("segment"), "segment", parallel=gen.uses_prange)
        seg_ops = [(op, index[id(op)]) for g in seg.groups for op in g.ops]
        desc = "; ".join(g.describe() for g in seg.groups)
        steps.append(NativeStep(compiled, gen.args, gen.expected, gen.outputs, seg_ops, desc))
        sources.append((compiled.name, compiled.text))
    plan = Plan(steps, part.describe(), sources, time.perf_counter() - t0,
                _fresh_names(part, gens, block))
    if os.environ.get("PDJIT_DUMP"):
        print(plan.report(), file=sys.stderr)
    return plan


def _generate(part, block, live) -> list:
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
        gen = SegmentGen(seg, block, later, parallel=threads.get_num_threads() > 1)
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
