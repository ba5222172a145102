"""The cuda target's tests: on the CUDA simulator where there is no GPU (``tests/conftest.py``
turns it on before numba is imported), on the GPU where there is one."""
import sys

import pytest

from pdjit.codegen.cuda import device

if not device.available():  # pragma: no cover - numba.cuda missing or no simulator/GPU
    pytest.skip(f"CUDA unavailable: {device.unavailable_reason()}", allow_module_level=True)


@pytest.fixture(autouse=True)
def _short_thread_turns():
    """On the simulator each thread of a block is a Python thread, and the block's manager
    polls them in a loop that keeps the GIL for its whole turn: at Python's default switch
    interval (5 ms) most of a test's time went to that loop. 0.5 ms a turn while a test runs:
    test_cuda_sequence and test_cuda_train 20.7 / 15.6 s -> 8.0 / 6.7 s (CPU 23 -> 7 s)."""
    if not device.simulator():
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.fixture
def transfers():
    """Counts host<->device copies from zero for the test."""
    device.reset_transfers()
    return device.transfers
