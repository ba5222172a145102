"""Places: where a program runs. ``CPUPlace`` runs on the ``cpu`` target, ``CUDAPlace`` on the
``cuda`` target (``numba.cuda``: a GPU, or the CUDA simulator)."""
from __future__ import annotations


class Place:
    kind = "cpu"

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(vars(self).items()))))


class CPUPlace(Place):
    kind = "cpu"

    def __repr__(self):
        return "CPUPlace()"


class CUDAPlace(Place):
    kind = "cuda"

    def __init__(self, device_id: int = 0):
        if not isinstance(device_id, int) or device_id < 0:
            raise ValueError(f"CUDAPlace: device_id must be a non-negative int, got {device_id!r}")
        self.device_id = device_id

    def __repr__(self):
        return f"CUDAPlace({self.device_id})"


class CUDAPinnedPlace(Place):
    kind = "cpu"

    def __repr__(self):
        return "CUDAPinnedPlace()"


def is_compiled_with_cuda() -> bool:
    """Whether this installation runs programs on a CUDA GPU: ``numba.cuda`` imports and finds
    a GPU with its driver. The CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) does not count: it
    runs ``CUDAPlace`` programs (that is how the cuda target is tested without a GPU) but
    thousands of times slower, so a Fluid script that picks its place with this function stays
    on the CPU there; tests ask for ``CUDAPlace(0)`` explicitly."""
    from pdjit.codegen.cuda import device

    return device.available() and not device.simulator()
