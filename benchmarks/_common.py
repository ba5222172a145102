"""What every benchmark here shares: interleaved timing and a markdown report."""
from __future__ import annotations

import atexit
import os
import shutil
import statistics
import tempfile
import time


def interleaved(contenders: dict, repeat: int, warmup: int = 2) -> dict:
    """Median milliseconds of each contender, measured in alternating rounds so that every
    contender sees the same noise; each runs ``warmup`` times first (compiles, caches)."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples = {k: [] for k in contenders}
    for _ in range(repeat):
        for k, fn in contenders.items():
            t = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def report(title: str, results: dict, base: str, digits: int = 4) -> None:
    """A markdown table of ``results`` (ms) with each one's ratio to ``results[base]``."""
    print(f"\n## {title}")
    print(f"| contender | median ms | vs {base} |")
    print("|---|---|---|")
    for k, v in results.items():
        print(f"| {k} | {v:.{digits}f} | {v / results[base]:.2f}x |")


def ort_session(model: bytes, threads: int):
    """An ONNX Runtime CPU session of ``model`` (serialized ONNX) on ``threads`` intra-op
    threads, sequential, every graph optimisation on: how the benchmarks run the ORT peer."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def time_calls(fn, repeat: int, warmup: int = 3) -> list:
    """Seconds of ``repeat`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def have(*mods) -> bool:
    """Whether every module named is installed (peers are optional)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in mods)


def table(title: str, header: list, rows: list) -> None:
    """A markdown table of string cells under a ``##`` title."""
    print(f"\n## {title}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def ms(v) -> str:
    """Milliseconds for a table cell (``-`` for none)."""
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def settle_pdjit(call) -> int:
    """Run ``call`` until pdjit's Executor serves it as it would a model run often: past
    its first runs (those a small program in a cold cache runs on the references while its
    kernels compile, ``executor.COLD_RUN_MAX_RUNS`` at most, do not count) and then
    ``tiers.HOT_RUNS`` runs of its compiled plan, the native driver compiled on its thread;
    returns how many warm-up calls remain for the driver trials (each driver's first runs of a
    batch size)."""
    import threading

    from pdjit.codegen.cpu import tiers
    from pdjit.runtime import executor

    for _ in range(executor.COLD_RUN_MAX_RUNS + tiers.HOT_RUNS + 2):
        call()
    for t in threading.enumerate():
        if t.name == "pdjit-tier-up":
            t.join()
    from pdjit.codegen.cpu import threads

    # (a trial of drivers that run in microseconds times more runs: threads.trial_runs)
    return 2 * (tiers.DriverTiers._WARM
                + tiers.DriverTiers._TIMED * threads.SHORT_TRIAL_RUNS) + 5


def private_cache() -> None:
    """A kernel cache of this run's own (``PDJIT_CACHE_DIR``, unless the caller set one),
    removed at exit: every run compiles as a fresh install would and leaves nothing behind."""
    if "PDJIT_CACHE_DIR" not in os.environ:
        os.environ["PDJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdjit-bench-")
        atexit.register(shutil.rmtree, os.environ["PDJIT_CACHE_DIR"], True)
