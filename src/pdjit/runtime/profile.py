"""Timing of plan steps, off by default: what ``fluid.profiler`` reports.

While a :class:`Recorder` is :data:`active` (``pdjit.profiler.start_profiler``), every step a
plan runs (``pdjit.runtime.plan.Plan.run``: a native kernel driver, a native loop, an op run
with its reference, a control-flow op with its sub-block's plan) and every op the reference
executor interprets is timed with ``time.perf_counter`` and counted under an event name:
the op type for a step of one op, ``fused(<op types>)`` for a native step of several ops
(``fused(a+b+...+z: N ops)`` for more than four),
``while/loop(...)`` for a native loop. Steps of a sub-block are recorded too, so a
control-flow op's time also holds its body's. When no recorder is active a plan pays one
global read per run.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

#: the recorder steps report to, or None (not profiling)
active: "Recorder | None" = None


@dataclass
class Event:
    """Calls and times (seconds) of one event name."""
    name: str
    calls: int = 0
    total: float = 0.0
    min: float = float("inf")
    max: float = 0.0

    @property
    def ave(self) -> float:
        return self.total / self.calls if self.calls else 0.0


class Recorder:
    """Events by name; thread-safe (executors may run in threads)."""

    def __init__(self):
        self.events: dict = {}
        self._lock = threading.Lock()
        self.started = time.perf_counter()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            e = self.events.get(name)
            if e is None:
                e = self.events[name] = Event(name)
            e.calls += 1
            e.total += seconds
            if seconds < e.min:
                e.min = seconds
            if seconds > e.max:
                e.max = seconds

    def reset(self) -> None:
        with self._lock:
            self.events = {}
            self.started = time.perf_counter()


def step_name(step) -> str:
    """The event name of a plan step (cached on it)."""
    name = getattr(step, "_profile_name", None)
    if name is None:
        ops = getattr(step, "ops", None)
        if ops is None:  # a reference step: one op
            name = step.op.type
        else:
            types = [op.type for op, _ in ops]
            if step.kind == "native_loop":
                name = f"{types[0]}/loop"
            elif len(types) == 1:
                name = types[0]
            elif len(types) <= 4:
                name = f"fused({'+'.join(types)})"
            else:  # a long chain: its ends and its size
                name = f"fused({'+'.join(types[:2])}+...+{types[-1]}: {len(types)} ops)"
        try:
            step._profile_name = name
        except AttributeError:
            pass
    return name


def run_timed(recorder: Recorder, steps, executor, env, run_index) -> None:
    """Run ``steps`` as ``Plan.run`` does, each timed into ``recorder``."""
    clock = time.perf_counter
    for step in steps:
        t0 = clock()
        try:
            step.run(executor, env, run_index)
        finally:
            recorder.add(step_name(step), clock() - t0)
