"""The cuda target's tests: on the CUDA simulator where there is no GPU (``tests/conftest.py``
turns it on before numba is imported), on the GPU where there is one."""
import pytest

from pdjit.codegen.cuda import device

if not device.available():  # pragma: no cover - numba.cuda missing or no simulator/GPU
    pytest.skip(f"CUDA unavailable: {device.unavailable_reason()}", allow_module_level=True)


@pytest.fixture
def transfers():
    """Counts host<->device copies from zero for the test."""
    device.reset_transfers()
    return device.transfers
