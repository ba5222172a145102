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


def _cuda_target():
    """The target that runs ``CUDAPlace`` programs; None where it cannot even be loaded."""
    from pdjit.codegen.target import get_target

    try:
        return get_target(CUDAPlace.kind)
    except Exception:  # noqa: BLE001 - no numba.cuda here: no GPU either
        return None


def is_compiled_with_cuda() -> bool:
    """Whether this installation runs programs on a CUDA GPU: ``numba.cuda`` imports and finds
    a GPU with its driver. The CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) does not count: it
    runs ``CUDAPlace`` programs (that is how the cuda target is tested without a GPU) but
    thousands of times slower, so a Fluid script that picks its place with this function stays
    on the CPU there; tests ask for ``CUDAPlace(0)`` explicitly."""
    target = _cuda_target()
    return target is not None and target.available() and not target.simulated()


class NoDeviceError(RuntimeError):
    """A CUDA place was asked for where there is no such GPU."""


def _gpu_count() -> int:
    target = _cuda_target()
    return 0 if target is None else target.device_count()


def cuda_places(device_ids=None) -> list:
    """Fluid's ``fluid.cuda_places``: a ``CUDAPlace`` per GPU id in ``device_ids`` (an int or a
    list; default: the ids in ``FLAGS_selected_gpus``, else every GPU here). A GPU that is not
    here (none at all, or an id past the last) is a :class:`NoDeviceError` naming it."""
    import os

    count = _gpu_count()
    if device_ids is None:
        text = os.environ.get("FLAGS_selected_gpus", "").strip()
        if text:
            try:
                device_ids = [int(t) for t in text.split(",") if t.strip()]
            except ValueError:
                raise ValueError(f"cuda_places: FLAGS_selected_gpus must be GPU ids separated "
                                 f"by commas, got {text!r}") from None
        else:
            device_ids = list(range(count)) if count else [0]
    elif not isinstance(device_ids, (list, tuple)):
        device_ids = [device_ids]
    for i in device_ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"cuda_places: GPU ids must be non-negative ints, got {i!r}")
        if i >= count:
            target = _cuda_target()
            why = (target.unavailable_reason() if target is not None else
                   "the cuda target cannot be loaded") if not count else \
                f"this machine has {count} GPU(s), ids 0..{count - 1}"
            raise NoDeviceError(f"cuda_places: CUDAPlace({i}) needs GPU {i}, which is not "
                                f"here: {why}. Use fluid.cpu_places() (or CPUPlace()) instead")
    return [CUDAPlace(i) for i in device_ids]


def cuda_pinned_places(device_count=None) -> list:
    """Fluid's ``fluid.cuda_pinned_places``: ``device_count`` ``CUDAPinnedPlace``s (default:
    ``CPU_NUM``, else 1); pinned host memory is host memory here."""
    import os

    if device_count is None:
        device_count = int(os.environ.get("CPU_NUM", "1").strip() or "1")
    if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count <= 0:
        raise ValueError(f"cuda_pinned_places: device_count must be a positive int, got "
                         f"{device_count!r}")
    return [CUDAPinnedPlace() for _ in range(device_count)]
