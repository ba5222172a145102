"""Compiled plans: a block's plan description, executed every run.

``build_plan`` runs the compile pipeline (:func:`pdjit.codegen.pipeline.compile_block`:
prune, fusion, generate, memory plan, native loops, steps) and makes each node of its
plain-data description a step (:mod:`pdjit.runtime.steps`): a native segment, a native loop,
or an op run by its reference (a control-flow op's sub-blocks get plans of their own through
the ``sub_plan`` callback, shown indented under the op by :meth:`Plan.report`). A
:class:`Plan` runs its steps in order through a runner (the Executor).

Run-time checks (``pdjit.runtime.checks``, settings from the executor): a native step checks
output sizes against the allocation limit and, with NaN/Inf checking on, its outputs (then
every op's output is stored).
"""
from __future__ import annotations

import os
import sys
import time

from pdjit.codegen import pipeline
from pdjit.codegen.target import get_target, target_name
from pdjit.runtime import checks as run_checks
from pdjit.runtime import profile
from pdjit.runtime.steps import LoopStep, NativeStep, ReferenceStep

__all__ = ["LoopStep", "NativeStep", "Plan", "ReferenceStep", "build_plan"]

#: the least share of a run taken by steps that split its batch over every free core, each
#: measured so against its drivers on every thread, for a plan's threads to need no trial of
#: their own (``Plan.threads_measured``)
THREADS_MEASURED_SHARE = 0.8


class Plan:
    """The steps of one block (``block_idx``), run in order. ``fresh``: names whose final
    value is a new array made by native code (not a view, not persistable) that nothing else
    holds after the run: the executor may hand it to the user without copying. ``blas``:
    whether a step may call the host's BLAS (a driver that says so, or a sub-block's plan)."""

    def __init__(self, steps, partition_text, sources, compile_seconds, fresh=frozenset(),
                 block_idx: int = 0):
        self.steps = steps
        self.blas = any(s.compiled.calls_blas if s.kind == "native" else bool(s.sub_plans)
                        for s in steps)
        self.fresh = fresh
        self.partition_text = partition_text
        self.sources = sources
        self.compile_seconds = compile_seconds
        self.block_idx = block_idx
        self.threads_choice = None  # the target's choice of threads per run (the executor's)

    def run(self, runner, env, run_index) -> None:
        recorder = profile.active
        if recorder is not None:  # fluid.profiler: each step timed
            return profile.run_timed(recorder, self.steps, runner, env, run_index)
        for step in self.steps:
            step.run(runner, env, run_index)

    def walk(self):
        """Every step of this plan and of its sub-plans, depth first."""
        for step in self.steps:
            yield step
            for _, sub in step.sub_plans:
                yield from sub.walk()

    def drivers_settled(self, batch: int) -> bool:
        """Whether no native step of this plan still has its drivers to try for this batch
        size (``threads.RunChoice`` measures the plan's threads only then)."""
        for s in self.walk():
            if s.tiers is not None and not s.tiers.settled(batch):
                return False
        return True

    def threads_measured(self, batch: int, seconds: float) -> bool:
        """Whether this plan's steps that split a batch of this size over every free core
        (their driver trials measured that against their drivers on every thread) took
        :data:`THREADS_MEASURED_SHARE` or more of a run of ``seconds``: a one-thread run
        (``threads.RunChoice``'s trial) has little left to win there."""
        split = 0.0
        for s in self.walk():
            if s.tiers is not None:
                split += s.tiers.split_seconds(batch)
        return split >= THREADS_MEASURED_SHARE * seconds

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
            for idx, sub in s.sub_plans:
                lines.append(f"{indent}    -- sub-block {idx} --")
                lines += sub._outline(indent + "    ")
        return lines + pipeline.memory_lines(self.steps, indent)

    def _plans(self):
        yield self
        for s in self.steps:
            for _, sub in s.sub_plans:
                yield from sub._plans()


def build_plan(program, fetch_names=(), block=None, sub_plan=None, place=None,
               memory_optim: bool = False, native_drivers: bool | str = False,
               checks=None, strict: bool = False, native_loops: bool = True) -> Plan:
    """The :class:`Plan` of one block of ``program`` (the global block unless ``block``), from
    its description (:func:`pdjit.codegen.pipeline.compile_block`, which says what is live
    after the block and what ``memory_optim``, ``native_drivers`` and ``native_loops`` (its
    ``run_native_loops``) do). ``sub_plan(block) -> Plan`` gives the plans of control-flow
    ops' sub-blocks (None: not shown). ``place`` chooses the target (``None``: the CPU).
    ``checks``: the executor's ``pdjit.runtime.checks.Settings`` (NaN/Inf checking, the
    allocation limit). ``strict``: on a device target, an op that would run on the host
    although it has a lowering for the CPU is an error (:class:`FallbackError`) rather than a
    warning."""
    t0 = time.perf_counter()
    checks = checks if checks is not None else run_checks.OFF
    target = get_target(target_name(place))
    block = program.global_block() if block is None else block
    desc = pipeline.compile_block(program, block, fetch_names, target, memory_optim,
                                  native_drivers, keep_outputs=checks.nan_inf, strict=strict,
                                  run_native_loops=native_loops)
    steps = []
    for node in desc.steps:
        if node.kind == "reference":
            subs = [(b, sub_plan(program.block(b))) for b in node.sub_blocks] \
                if sub_plan is not None else []
            steps.append(ReferenceStep(node.op, node.op_idx, node.why, subs))
        elif node.kind == "native_loop":
            steps.append(LoopStep(node, target, nan_inf=checks.nan_inf))
        else:
            guard = run_checks.step_guard(node.ops, node.args, checks.limit, block)
            steps.append(NativeStep(node, target, guard, nan_inf=checks.nan_inf))
    plan = Plan(steps, desc.partition_text, desc.sources, time.perf_counter() - t0,
                desc.fresh, desc.block_idx)
    if os.environ.get("PDJIT_DUMP"):
        print(plan.report(), file=sys.stderr)
    return plan
