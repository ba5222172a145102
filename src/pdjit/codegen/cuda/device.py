"""Device memory for the ``cuda`` target: copies between host and device, counted.

Values of a plan run on ``CUDAPlace`` live on the device (``numba.cuda`` device arrays): the
executor copies feeds in once, fetches out once, and an op that runs on the host (no cuda
lowering) gets host copies of its inputs. Every copy goes through :func:`to_device` or
:func:`to_host`, which count them (:func:`transfers`), so a test can assert that values stay
on the device between the steps of a plan and between runs.

LoD offsets go to the device too (:func:`offsets`): once per host offsets array (the LoD of a
fed LoDTensor, or one a LoD rule made), whose device copy then serves every step and every
kernel that reads it for as long as the host array lives, and once per distinct values among
recent small offsets; so a run with one LoD input copies its offsets in at most once, and a
later run fed the same LoDTensor, or one with the same sequence lengths, copies none.

``numba.cuda`` is imported lazily (only a CUDA plan needs it). Under the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported) device arrays are host arrays in
disguise and kernels run as Python: slow, but the same code paths, which is how the target is
tested on machines without a GPU.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

_counts = {"h2d": 0, "d2h": 0, "h2d_bytes": 0, "d2h_bytes": 0}
_lock = threading.Lock()


def cuda():
    """The ``numba.cuda`` module (NVIDIA's ``numba-cuda`` when installed)."""
    from numba import cuda as _cuda

    return _cuda


def simulator() -> bool:
    """Whether kernels run in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


def available() -> bool:
    """Whether CUDA programs can run here: a GPU with its driver, or the simulator."""
    try:
        return bool(cuda().is_available())
    except Exception:  # noqa: BLE001 - no driver, no library: not available
        return False


def unavailable_reason() -> str:
    try:
        c = cuda()
    except Exception as e:  # noqa: BLE001
        return f"numba.cuda cannot be imported ({type(e).__name__}: {e})"
    if c.is_available():
        return ""
    return ("no CUDA GPU or driver was found (set NUMBA_ENABLE_CUDASIM=1 before importing "
            "numba to run on the CUDA simulator)")


def require(what: str) -> None:
    if not available():
        raise RuntimeError(f"{what}: CUDA is not available: {unavailable_reason()}")


def is_device_array(value) -> bool:
    """Whether ``value`` is a ``numba.cuda`` device array (the simulator's included)."""
    return hasattr(value, "copy_to_host") and hasattr(value, "shape")


def to_device(array: np.ndarray):
    """A device copy of host ``array`` (counted)."""
    a = np.ascontiguousarray(array)
    with _lock:
        _counts["h2d"] += 1
        _counts["h2d_bytes"] += a.nbytes
    return cuda().to_device(a)


def to_host(value) -> np.ndarray:
    """A host copy of device array ``value`` (counted); a host value is returned as it is."""
    if not is_device_array(value):
        return value
    with _lock:
        _counts["d2h"] += 1
        _counts["d2h_bytes"] += int(value.size) * np.dtype(value.dtype).itemsize
    return np.asarray(value.copy_to_host())


def empty(shape, dtype):
    """An uninitialised device array."""
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    return cuda().device_array(tuple(int(d) for d in shape), dtype=np.dtype(dtype))


def transfers() -> dict:
    """Host<->device copies made so far in this process: counts (``h2d``, ``d2h``) and
    bytes (``h2d_bytes``, ``d2h_bytes``)."""
    with _lock:
        return dict(_counts)


def reset_transfers() -> None:
    with _lock:
        for k in _counts:
            _counts[k] = 0


# ---- LoD offsets on the device ------------------------------------------------------------------
class Offsets:
    """One level of LoD offsets as a device plan's driver gets them: ``host`` (the ``int64``
    array the LoD rules and the driver's size checks read), ``dev`` (its device copy, what
    kernels read), and :meth:`derived` (device copies of arrays computed from it, made once)."""

    __slots__ = ("host", "dev", "_memo", "__weakref__")

    def __init__(self, host: np.ndarray, dev):
        self.host, self.dev, self._memo = host, dev, {}

    def derived(self, key, make):
        """Device copies (counted) of the host arrays ``make()`` returns (a tuple), made once
        per ``key`` for these offsets; ``key`` should hold what else ``make`` reads (kept
        alive with the copies, so an ``id`` in it is not reused)."""
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = tuple(to_device(a) for a in make())
        return hit


_offsets: dict = {}   # id(host offsets) -> (weak reference to them, Offsets)
#: offsets up to this many entries are also found by their values (a new LoDTensor fed each run
#: with the same sequence lengths, a LoD a rule made again): the last CONTENT_CACHE of them
CONTENT_MAX, CONTENT_CACHE = 4096, 64
_by_content: OrderedDict = OrderedDict()


def offsets(host: np.ndarray) -> Offsets:
    """The :class:`Offsets` of host offsets ``host``: copied to the device (counted) the first
    time these offsets, or offsets of the same values (up to :data:`CONTENT_MAX` entries, among
    the last :data:`CONTENT_CACHE`), are asked for; the same device copy afterwards (offsets
    are never written on the device)."""
    key = id(host)
    hit = _offsets.get(key)
    if hit is not None and hit[0]() is host:
        return hit[1]
    h = np.ascontiguousarray(host, dtype=np.int64)
    values = h.tobytes() if h.size <= CONTENT_MAX else None
    with _lock:
        off = _by_content.get(values) if values is not None else None
        if off is not None:
            _by_content.move_to_end(values)
    if off is None:
        off = Offsets(h, to_device(h))
        if values is not None:
            with _lock:
                _by_content[values] = off
                while len(_by_content) > CONTENT_CACHE:
                    _by_content.popitem(last=False)
    try:
        ref = weakref.ref(host, lambda r, k=key, cache=_offsets: _drop(cache, k, r))
    except TypeError:  # not weakly referenceable: not cached
        return off
    _offsets[key] = (ref, off)
    return off


def forget_offsets() -> None:
    """Drop every cached device copy of offsets (the next use copies them again)."""
    with _lock:
        _by_content.clear()
    _offsets.clear()


def _drop(cache: dict, key, ref) -> None:
    hit = cache.get(key)
    if hit is not None and hit[0] is ref:
        del cache[key]
