"""pdjit keeps large freed blocks in the heap (glibc) before its first compiled plan runs."""
import os
import subprocess
import sys

import pytest

CHILD = """
import ctypes, os
import numpy as np
import pdjit as fluid
from pdjit.codegen.cpu import malloc
x = fluid.layers.data("x", [4])
y = fluid.layers.relu(x)
exe = fluid.Executor()
exe.run(fluid.default_main_program(), feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[y])
print("tuned" if malloc.applied[0] else "untouched")
# with the threshold raised, a freed 8 MiB block is reused from the heap, not unmapped
a = np.empty(8 << 18, np.float32); addr = a.ctypes.data; del a
b = np.empty(8 << 18, np.float32)
print("reused" if b.ctypes.data == addr else "fresh")
# a block above the largest threshold glibc takes (32 MiB) comes from the heap too: freed, its
# pages stay with the process (not unmapped, to be mapped and zeroed again at the next run)
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
a = np.ones(48 << 18, np.float32)
r0 = resident()
del a
print("large-kept" if r0 - resident() < 24 << 20 else "large-returned")
# a run's freed peak above glibc's old 128 MiB trim threshold stays too (when the machine has
# the memory): 160 MiB in blocks of 2 MiB (below NumPy's huge-page advice), freed, taken again
import resource
if malloc.trim_threshold() > 160 << 20:
    blocks = [np.ones(1 << 19, np.float32) for _ in range(80)]
    del blocks
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [np.ones(1 << 19, np.float32) for _ in range(80)]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    print("kept" if faults < 4000 else f"faulted-{faults}")
else:
    print("kept")
"""


def _run(env):
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_blocks_stay_in_the_heap_unless_turned_off():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert _run({**env, "PDJIT_MALLOC_TUNE": "1"}) == ["tuned", "reused", "large-kept", "kept"]
    assert _run({**env, "PDJIT_MALLOC_TUNE": "0"})[0] == "untouched"
    assert _run({**env, "MALLOC_TRIM_THRESHOLD_": "1000000"})[0] == "untouched"
