"""Fluid's module paths (``pdjit.optimizer``, ``pdjit.core``, ``pdjit.inference``...) name the
modules that live where their layer is (``pdjit.MOVED``): every way of reaching one gives the
one module object, and no module name the layout keeps unique occurs twice."""
from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

import pdjit
from pdjit import MOVED

SRC = pathlib.Path(pdjit.__file__).resolve().parents[1]

# each spelling a Fluid script or a pdjit user writes, run in a fresh interpreter (the first
# import of each name goes through the finder, not through an attribute set before)
_FRESH = """
import importlib, sys
import pdjit.optimizer
from pdjit.optimizer import SGD
from pdjit.initializer import Constant
from pdjit.executor import Executor, global_scope, scope_guard
from pdjit.dataset import DatasetError
from pdjit.inference import Config
from pdjit import nets
import pdjit as fluid
out = []
for name, real in pdjit.MOVED.items():
    a = importlib.import_module("pdjit." + name)
    b = importlib.import_module(real)
    out.append(a is b and getattr(fluid, name) is b and sys.modules["pdjit." + name] is b
               and b.__spec__.name == real and b.__name__ == real)
print(all(out), SGD.__module__, Constant.__module__, Executor.__module__, Config.__module__,
      DatasetError.__module__, nets.__name__, fluid.layers.clip.__name__)
"""


def test_every_spelling_of_a_moved_module_gives_the_one_module():
    out = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "True", "pdjit.layers.optimizer", "pdjit.layers.initializer", "pdjit.runtime.executor",
        "pdjit.fluid.predictor", "pdjit.io.dataset", "pdjit.layers.nets",
        "clip"]   # fluid.layers.clip stays the layer, not the gradient-clip module


def test_the_facade_names_and_unknown_names():
    import pdjit as fluid

    assert fluid.compiler.CompiledProgram.__module__ == "pdjit.fluid.compiled_program"
    assert fluid.backward.append_backward is fluid.append_backward
    assert fluid.core.EOFException.__name__ == "EOFException"
    assert fluid.clip.GradientClipByGlobalNorm.__module__ == "pdjit.layers.grad_clip"
    assert set(MOVED) <= set(dir(fluid))
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pdjit.no_such_module")
    with pytest.raises(AttributeError, match="no_such_name"):
        fluid.no_such_name  # noqa: B018


def _modules(root: pathlib.Path) -> list:
    return [p for p in root.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")] + \
        [p for p in root.rglob("*") if p.is_dir() and (p / "__init__.py").exists()]


def test_moved_names_are_no_files_and_the_layout_names_each_module_once():
    pkg = SRC / "pdjit"
    for name in MOVED:   # a file there would be shadowed by the finder
        assert not (pkg / f"{name}.py").exists() and not (pkg / name).is_dir(), name
    # family modules mirror each other by design (ops/conv.py, layers/conv.py, lowerings/conv.py,
    # the targets' lib/conv.py); these names are kept to one module each
    unique = ("compiler", "reader", "inference", "inference_model", "executor", "dataset",
              "backward", "io", "core", "predictor", "generator_loader", "data_feeder")
    found: dict = {}
    for p in _modules(pkg):
        stem = p.stem if p.is_file() else p.name
        if stem in unique:
            found.setdefault(stem, []).append(str(p.relative_to(pkg)))
    assert {k: v for k, v in found.items() if len(v) > 1} == {}
