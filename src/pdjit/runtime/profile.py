"""Timing of plan steps, off by default: what ``fluid.profiler`` reports.

While a :class:`Recorder` is :data:`active` (``pdjit.profiler.start_profiler``), every step a
plan runs (``pdjit.runtime.plan.Plan.run``: a native kernel driver, a native loop, an op run
with its reference, a control-flow op with its sub-block's plan) and every op the reference
executor interprets is timed with ``time.perf_counter`` and counted under an event name:
the op type for one op, ``fused(<op types>)`` for a fusion group of several ops
(``fused(a+b+...+z: N ops)`` for more than four), ``while/loop`` for a native loop. A native
step with a host driver is timed group by group: while profiling it runs a copy of its driver
that reports as each fusion group (a kernel call, a library call) starts
(``HostDriver.timed``), so each group is an event of its own; a group whose ops the previous
group's opaque op applies as it stores (a convolution's bias and activation) is timed with it,
under the types of both (``fused(conv2d+elementwise_add+relu)``). Steps of a sub-block are
recorded too, so a control-flow op's time also holds its body's. When no recorder is active
a plan pays one global read per run and a native step one more.
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
        self.groups_recorded = 0   # events recorded by timed drivers (their steps are not)

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


def ops_name(types) -> str:
    """The event name of ops of these types run together."""
    if len(types) == 1:
        return types[0]
    if len(types) <= 4:
        return f"fused({'+'.join(types)})"
    return f"fused({'+'.join(types[:2])}+...+{types[-1]}: {len(types)} ops)"


def step_name(step) -> str:
    """The event name of a plan step (cached on it)."""
    name = getattr(step, "_profile_name", None)
    if name is None:
        ops = getattr(step, "ops", None)
        if ops is None:  # a reference step: one op
            name = step.op.type
        elif step.kind == "native_loop":
            name = f"{ops[0][0].type}/loop"
        else:
            name = ops_name([op.type for op, _ in ops])
        try:
            step._profile_name = name
        except AttributeError:
            pass
    return name


def run_timed(recorder: Recorder, steps, executor, env, run_index) -> None:
    """Run ``steps`` as ``Plan.run`` does, each timed into ``recorder`` (a step whose driver
    timed its groups is not recorded again as a whole)."""
    clock = time.perf_counter
    for step in steps:
        seen = recorder.groups_recorded
        t0 = clock()
        try:
            step.run(executor, env, run_index)
        finally:
            if recorder.groups_recorded == seen:
                recorder.add(step_name(step), clock() - t0)


def timed_groups(step, values):
    """Call ``step``'s host driver on ``values`` with each fusion group timed into the active
    recorder (the timed copy of the driver is built once per step); a driver that cannot be
    timed is called as it is."""
    timed = getattr(step, "_profile_timed", None)
    if timed is None:
        compiled = step.compiled
        lines = getattr(compiled, "group_lines", None)
        if not lines or len(lines) != len(step.groups) or not hasattr(compiled, "timed"):
            timed = step._profile_timed = (compiled.fn, None, None)
        else:
            types = [[op.type for op, _ in g] for g in step.groups]
            joined = compiled.joined
            # a group run by the previous group's call (a convolution applying its epilogue
            # as it stores): the two ops' time under both names, at the later group's tick
            names = [ops_name(types[k - 1] + t if k in joined else t)
                     for k, t in enumerate(types)]
            state = [0.0]
            clock = time.perf_counter

            def tick(k, names=names, state=state):
                now = clock()
                recorder = active
                if recorder is not None:
                    recorder.add(names[k - 1], now - state[0])
                    recorder.groups_recorded += 1
                state[0] = now
            timed = step._profile_timed = (compiled.timed(tick), tick, state)
    fn, tick, state = timed
    if tick is None:
        return fn(*values)
    state[0] = time.perf_counter()
    results = fn(*values)
    tick(len(step.groups))
    return results
