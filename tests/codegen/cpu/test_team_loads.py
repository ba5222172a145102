"""When the team's parallel loops load in a process (``lib.team.ready``): from its
``AFTER_RUNS``-th run, in one run as many as load in less than ``LOAD_SHARE`` of the process's
shortest run (``threads.shortest_run``), the first of a run whatever it takes."""
import time

import numpy as np
import pytest

from pdjit.codegen.cpu import replay, threads
from pdjit.codegen.cpu.lib import team


class _Clock:
    def __init__(self):
        self.t = 50.0

    def monotonic(self):
        return self.t

    perf_counter = monotonic


class _Loop:
    """A parallel loop on disk whose load takes ``seconds`` of the fake clock."""

    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.overloads, self.loads = clock, seconds, {}, 0

    def compile(self, sig):
        self.clock.t += self.seconds
        self.loads += 1


@pytest.fixture
def loads(monkeypatch):
    """A process at its AFTER_RUNS-th run, every loop on disk, on a fake clock: returns
    ``(clock, ask)``; ``ask(loops)`` asks whether each may serve float32 arguments."""
    clock = _Clock()
    monkeypatch.setattr(team, "time", clock)
    monkeypatch.setattr(team, "_READY", {})
    monkeypatch.setattr(team, "COMPILE", False)
    monkeypatch.setattr(team, "_loaded", [0, 0.0])
    monkeypatch.setattr(team, "_on_disk", lambda loop, sig: True)
    monkeypatch.setattr(threads, "runs", [team.AFTER_RUNS])
    monkeypatch.setattr(threads, "_began", [None, float("inf")])
    monkeypatch.setattr(replay, "VERSION", [0])  # (a load makes recordings stale: not others')
    args = (np.zeros(4, np.float32),)
    return clock, lambda loops: [team.ready(loop, args) for loop in loops]


def test_a_process_of_long_runs_loads_every_loop_in_one_run(loads):
    clock, ask = loads
    threads._began[1] = 1.0  # (runs of a second)
    loops = [_Loop(clock, 0.05) for _ in range(6)]
    threads.runs[0] = team.AFTER_RUNS - 1
    assert ask(loops) == [False] * 6  # (not before the AFTER_RUNS-th run)
    threads.runs[0] += 1
    assert ask(loops) == [True] * 6
    assert [loop.loads for loop in loops] == [1] * 6
    assert ask(loops) == [True] * 6 and [loop.loads for loop in loops] == [1] * 6


def test_short_runs_load_one_loop_a_run(loads):
    clock, ask = loads
    threads._began[1] = 0.005
    loops = [_Loop(clock, 0.03) for _ in range(3)]
    assert ask(loops) == [True, False, False]   # (the first of a run, whatever it takes)
    threads.runs[0] += 1
    assert ask(loops) == [True, True, False]
    threads.runs[0] += 1
    assert ask(loops) == [True, True, True]
    assert [loop.loads for loop in loops] == [1, 1, 1]


def test_a_runs_loads_stop_at_their_share_of_the_shortest_run(loads, monkeypatch):
    clock, ask = loads
    threads._began[1] = 0.1
    loops = [_Loop(clock, 0.03) for _ in range(6)]
    # 0.03, 0.06, 0.09 s loaded: each under 0.1 s, so a fourth loads; then 0.12
    assert ask(loops) == [True] * 4 + [False] * 2
    threads.runs[0] += 1
    assert ask(loops) == [True] * 6
    loops = [_Loop(clock, 0.03) for _ in range(6)]
    monkeypatch.setattr(team, "LOAD_SHARE", 0.5)
    threads.runs[0] += 1
    assert ask(loops) == [True] * 2 + [False] * 4


def test_the_shortest_run_is_the_least_time_from_one_runs_start_to_the_next(monkeypatch):
    monkeypatch.setattr(threads, "_began", [None, float("inf")])
    threads.begin_run()
    assert threads.shortest_run() == float("inf")  # (one run: none known)
    time.sleep(0.02)
    threads.begin_run()
    first = threads.shortest_run()
    assert 0.02 <= first < 1.0
    time.sleep(0.04)
    threads.begin_run()
    assert threads.shortest_run() == first  # (a longer one: the least stands)
    threads.begin_run()
    assert threads.shortest_run() < 0.02
