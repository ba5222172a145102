"""How the process allocates the large arrays compiled plans make.

A plan's driver allocates every intermediate array afresh on each run (``np.empty``). glibc's
``malloc`` serves large blocks with ``mmap`` and returns them to the system when freed, so
each run of a network touches new pages and pays a page fault for each (4 KiB): measured on a
2-vCPU machine, a ResNet-style training step (batch 32) took 67 ms this way and 47 ms with
large blocks kept in the heap; LeNet-5 inference at batch 64 took 2.2-2.5 ms and 1.2 ms.
Before the first compiled plan runs, pdjit therefore asks glibc to serve blocks from the heap
(``M_MMAP_THRESHOLD`` at its largest, 32 MiB, and no ``mmap`` for larger ones either:
``M_MMAP_MAX`` 0; where the heap cannot grow, glibc still maps) and to keep up to 1 GiB of
freed heap, at most an eighth of the machine's memory (``M_TRIM_THRESHOLD``): memory a run
frees stays with the process for the next run. Blocks above 32 MiB (MobileNetV2's 77 MB
activation at batch 16, ResNet-50's 51 MB ones) were otherwise mapped afresh at every run,
their pages zeroed by the kernel: MobileNetV2 at batch 16 on one thread took 140 ms a run that
way and 133 with them in the heap (medians of four alternating processes; 80 and 78 on two
threads, ResNet-50 677 and 676), 60 runs at batches 1, 16, 4 in turn 4.71 s and 3.75 s, the
process's peak memory 359 MB and 326 (what it holds between runs 291 MB and 326). The heap
freed at a run's end is its peak, less what a longer-lived block above it holds: with 128 MiB
kept, MobileNetV2 at batch 16 after runs at batch 1 (whose blocks sat
below its arrays) gave ~300 MB back at the end of every run and faulted 20,600 pages in at the
next (212-226 ms a run against 155-173 ms with them kept; the same runs without the batch 1
ones before kept them by chance).

Set ``PDJIT_MALLOC_TUNE=0`` to leave ``malloc`` as it is; glibc's own ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_MMAP_MAX_`` and ``MALLOC_TRIM_THRESHOLD_`` variables, when set, are left to rule.
Other C libraries are left alone.
"""
from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameters
_done = [False]
applied = [False]  # whether the thresholds were set


def tune_malloc() -> bool:
    """Apply the thresholds once; whether they were applied (glibc on Linux only)."""
    if _done[0]:
        return False
    _done[0] = True
    if os.environ.get("PDJIT_MALLOC_TUNE", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    if any(f"MALLOC_{v}_" in os.environ for v in ("MMAP_THRESHOLD", "MMAP_MAX",
                                                  "TRIM_THRESHOLD")):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's malloc takes no options
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied[0] = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold()))
    return applied[0]


def trim_threshold() -> int:
    """:data:`TRIM_THRESHOLD`, at most an eighth of the machine's physical memory."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return TRIM_THRESHOLD
    return max(128 << 20, min(TRIM_THRESHOLD, ram // 8))
