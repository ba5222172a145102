"""Places: where a program runs. ``CPUPlace`` runs now; ``CUDAPlace`` names a GPU target."""
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
    """Whether this installation can run programs on ``CUDAPlace``: not yet (the CUDA target
    is being built), so Fluid scripts that test it take their CPU path."""
    return False
