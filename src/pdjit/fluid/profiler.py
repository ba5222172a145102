"""``fluid.profiler``: a table of the calls and times of what the executor ran.

As in Fluid 1.x::

    with fluid.profiler.profiler("CPU", sorted_key="total", profile_path="/tmp/profile"):
        for batch in reader():
            exe.run(main, feed=batch, fetch_list=[loss])

or ``start_profiler("CPU")`` ... ``stop_profiler("total", "/tmp/profile")``, and
``reset_profiler()`` to forget what was recorded so far (the first steps, say, which compile).
While profiling, every step of every compiled plan is timed (``pdjit.runtime.profile``), a
native step's host driver fusion group by fusion group: each event is named after its op
(``fused(elementwise_add+relu)`` for a group of several), an op run by its reference after
its type, a native loop ``while/loop``; a sub-block's steps are listed too, so a control-flow
op's time includes its body's. A group's first call includes the compilation of its kernel:
``reset_profiler()`` after a first batch leaves it out. The reference executor
(``mode="reference"``) times each op. ``stop_profiler`` prints the table (calls, total, min,
max, average in milliseconds, and each event's share of the events' total time), writes the
same text to ``profile_path`` and returns it. (Fluid writes a binary profile for its timeline
tool there; this file is the table as text.) When not profiling, nothing is timed.
"""
from __future__ import annotations

import contextlib

from pdjit.runtime import profile as _profile

__all__ = ["profiler", "start_profiler", "stop_profiler", "reset_profiler", "cuda_profiler"]

_STATES = ("CPU", "GPU", "All")
_SORT_KEYS = (None, "calls", "total", "max", "min", "ave")
_TRACER_OPTIONS = ("Default", "OpDetail", "AllOpDetail")
_state = "CPU"


def _check_state(state) -> None:
    if state not in _STATES:
        raise ValueError(f"profiler: state must be one of 'CPU', 'GPU', 'All', got {state!r}")


def _check_sorted_key(sorted_key) -> None:
    if sorted_key not in _SORT_KEYS:
        raise ValueError(f"profiler: sorted_key must be None, 'calls', 'total', 'max', 'min' "
                         f"or 'ave', got {sorted_key!r}")


def start_profiler(state="CPU", tracer_option="Default") -> None:
    """Start recording (``state``: ``'CPU'``, ``'GPU'`` or ``'All'``; every step's host-side
    time is what is recorded in each). Starting again while recording starts afresh."""
    global _state
    _check_state(state)
    if tracer_option not in _TRACER_OPTIONS:
        raise ValueError(f"profiler: tracer_option must be one of {_TRACER_OPTIONS}, got "
                         f"{tracer_option!r}")
    _state = state
    _profile.active = _profile.Recorder()


def reset_profiler() -> None:
    """Forget what was recorded so far (recording goes on)."""
    if _profile.active is not None:
        _profile.active.reset()


def report(recorder, sorted_key=None) -> str:
    """The table of ``recorder``'s events, sorted by ``sorted_key`` (descending; ``None``:
    in the order they first ran)."""
    _check_sorted_key(sorted_key)
    events = list(recorder.events.values())
    if sorted_key is not None:
        events.sort(key=lambda e: getattr(e, sorted_key), reverse=True)
    whole = sum(e.total for e in events) or 1.0
    order = {None: "in the order the events first ran"}.get(
        sorted_key, f"by {sorted_key} in descending order")
    width = max([len("Event")] + [len(e.name) for e in events]) + 2
    lines = ["-------------------------     Profiling Report     -------------------------",
             "", f"Place: {_state}", "Time unit: ms", f"Sorted {order}", "",
             f"{'Event':<{width}}{'Calls':>8}{'Total':>12}{'Min.':>12}{'Max.':>12}"
             f"{'Ave.':>12}{'Ratio.':>10}"]
    for e in events:
        lines.append(f"{e.name:<{width}}{e.calls:>8}{e.total * 1e3:>12.4f}"
                     f"{e.min * 1e3:>12.4f}{e.max * 1e3:>12.4f}{e.ave * 1e3:>12.4f}"
                     f"{e.total / whole:>10.4f}")
    return "\n".join(lines) + "\n"


def stop_profiler(sorted_key=None, profile_path="/tmp/profile") -> str:
    """Stop recording; print the table, write it to ``profile_path`` and return it (``""``
    when not recording)."""
    _check_sorted_key(sorted_key)
    recorder, _profile.active = _profile.active, None
    if recorder is None:
        return ""
    text = report(recorder, sorted_key)
    print(text)
    if profile_path:
        with open(profile_path, "w") as f:
            f.write(text)
    return text


@contextlib.contextmanager
def profiler(state="CPU", sorted_key=None, profile_path="/tmp/profile",
             tracer_option="Default"):
    """Record what runs inside the ``with`` block; on leaving it, ``stop_profiler``."""
    _check_state(state)
    _check_sorted_key(sorted_key)
    start_profiler(state, tracer_option)
    try:
        yield
    finally:
        stop_profiler(sorted_key, profile_path)


@contextlib.contextmanager
def cuda_profiler(output_file, output_mode=None, config=None):
    """Fluid's NVIDIA-profiler hook: there is no CUDA profiler to drive here, so it records
    with ``profiler("GPU")`` and writes the table to ``output_file``."""
    with profiler("GPU", "total", output_file):
        yield
