"""pdjit: PaddlePaddle-Fluid-style programs, executed by a compiler.

``import pdjit as fluid`` gives Fluid's user API: build a program with ``fluid.layers``, run it
with ``fluid.Executor(fluid.CPUPlace())``.

The public names live in :mod:`pdjit.fluid.api` and load at their first use (``fluid.layers``,
``fluid.Executor``...): importing a low layer (``pdjit.framework``) loads nothing above it.

Fluid's module paths (``fluid.optimizer``, ``fluid.initializer``, ``fluid.core``,
``fluid.compiler``...) name modules that live where the layer they belong to is (:data:`MOVED`):
``import pdjit.optimizer``, ``from pdjit.optimizer import SGD`` and ``pdjit.optimizer`` give the
module ``pdjit.layers.optimizer`` itself (one module object under both names, in
``sys.modules`` too), imported at its first use.
"""
import importlib as _importlib
import sys as _sys
import threading as _threading
from importlib.machinery import ModuleSpec as _ModuleSpec

from pdjit.version import __version__  # noqa: F401

_lock = _threading.RLock()
_loading = []


# Sub-packages reached as attributes (``pdjit.static.save_inference_model(...)`` right after
# ``import pdjit``), imported on first use.
_LAZY_SUBMODULES = ("static", "io", "distributed")

#: ``pdjit.<name>`` (Fluid's module path, or pdjit's own public one) -> the module it names
MOVED = {
    # the Fluid facade (pdjit/fluid/)
    "compiler": "pdjit.fluid.compiled_program",
    "core": "pdjit.fluid.core",
    "inference": "pdjit.fluid.predictor",
    "install_check": "pdjit.fluid.install_check",
    "metrics": "pdjit.fluid.metrics",
    "profiler": "pdjit.fluid.profiler",
    # the builders beside the layers
    "clip": "pdjit.layers.grad_clip",
    "custom": "pdjit.layers.custom",
    "initializer": "pdjit.layers.initializer",
    "nets": "pdjit.layers.nets",
    "optimizer": "pdjit.layers.optimizer",
    "param_attr": "pdjit.layers.param_attr",
    "regularizer": "pdjit.layers.regularizer",
    # Fluid modules that are one of pdjit's layers' modules
    "backward": "pdjit.passes.backward",
    "data_feeder": "pdjit.runtime.data_feeder",
    "dataset": "pdjit.io.dataset",
    "executor": "pdjit.runtime.executor",
}


class _MovedFinder:
    """Finds and loads ``pdjit.<name>`` for the names of :data:`MOVED`: the module it loads is
    the real module, imported under its own name first, so both names give one object."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return _ModuleSpec(fullname, _MovedFinder)

    @staticmethod
    def create_module(spec):
        real = _importlib.import_module(MOVED[spec.name.rpartition(".")[2]])
        spec.loader_state = real.__spec__
        return real

    @staticmethod
    def exec_module(module):
        # the import system gave the module the alias's spec: it keeps its own
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, type) and f.__name__ == "_MovedFinder" and
           getattr(f, "__module__", None) == __name__ for f in _sys.meta_path):
    _sys.meta_path.insert(0, _MovedFinder)


def _load():
    with _lock:
        if _loading:  # a name asked for while pdjit.fluid.api itself imports: not there yet
            return None
        _loading.append(True)
        try:
            api = _importlib.import_module("pdjit.fluid.api")
        finally:
            _loading.clear()
        globals().update({k: v for k, v in vars(api).items()
                          if not k.startswith("__") or k == "__all__"})
        return api


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES or name in MOVED:
        return _importlib.import_module(f"pdjit.{name}")  # also sets the attribute
    api = None if name.startswith("__") and name != "__all__" else _load()
    if api is None or not hasattr(api, name):
        raise AttributeError(f"module 'pdjit' has no attribute {name!r}")
    return getattr(api, name)


def __dir__():
    _load()
    return sorted(set(globals()) | set(_LAZY_SUBMODULES) | set(MOVED))
