"""pdjit: PaddlePaddle-Fluid-style programs, executed by a compiler.

``import pdjit as fluid`` gives Fluid's user API: build a program with ``fluid.layers``, run it
with ``fluid.Executor(fluid.CPUPlace())``.

The public names live in :mod:`pdjit._api` and load at their first use (``fluid.layers``,
``fluid.Executor``...): importing a low layer (``pdjit.framework``) loads nothing above it.
"""
import importlib as _importlib
import threading as _threading

from pdjit.version import __version__  # noqa: F401

_lock = _threading.RLock()
_loading = []


# Sub-packages reached as attributes (``pdjit.static.save_inference_model(...)`` right after
# ``import pdjit``), imported on first use.
_LAZY_SUBMODULES = ("static", "inference", "io", "distributed")


def _load():
    with _lock:
        if _loading:  # a name asked for while pdjit._api itself imports: not there yet
            return None
        _loading.append(True)
        try:
            api = _importlib.import_module("pdjit._api")
        finally:
            _loading.clear()
        globals().update({k: v for k, v in vars(api).items()
                          if not k.startswith("__") or k == "__all__"})
        return api


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"pdjit.{name}")  # also sets the attribute
    api = None if name.startswith("__") and name != "__all__" else _load()
    if api is None or not hasattr(api, name):
        raise AttributeError(f"module 'pdjit' has no attribute {name!r}")
    return getattr(api, name)


def __dir__():
    _load()
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
