"""Which way imports point (DESIGN.md): each module under ``src/pdjit`` imports only modules of
its own layer and of the layers below it, ``codegen/`` has no import cycle, and importing a low
layer in a fresh interpreter loads nothing above it (nor Numba).

The imports are read from the source (``ast``), not run: module-level imports (what importing
the module runs) and function-level ones (what calling a function may run, e.g. a lazy import)
are checked separately. A function-level import of a higher layer is allowed only where
``LAZY_UP`` lists it with its reason. ``KNOWN_UP`` lists the violations the redesign of issue 33
has not removed yet, each with a reason: this list only shrinks (an entry that no longer occurs
fails the test, so a fixed violation is taken off it).
"""
from __future__ import annotations

import ast
import functools
import os
import pathlib
import subprocess
import sys

import pytest

from pdjit import MOVED

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "pdjit"

# DESIGN.md's order, lowest first
ORDER = ("framework", "ops", "passes", "codegen", "runtime", "builders", "io", "top")

# module (or package: every module under it) -> layer; the longest matching prefix decides,
# and every module must match one (a new package-level module is placed here on purpose)
LAYER_OF = {
    "pdjit.version": "framework",
    "pdjit.proto": "framework",
    "pdjit.framework": "framework",
    "pdjit.ops": "ops",
    "pdjit.passes": "passes",
    "pdjit.codegen": "codegen",
    "pdjit.runtime": "runtime",
    # layers: the user's builders (layers, optimizers, initializers, ParamAttr, regularizers,
    # gradient clipping, nets, custom ops)
    "pdjit.layers": "builders",
    # io: programs, parameters, inference models and ahead-of-time artifacts on disk
    "pdjit.io": "io",
    "pdjit.aot": "io",
    # cli, testing and the Fluid facade that re-exports the public names
    "pdjit": "top",
    "pdjit.fluid": "top",
    "pdjit.cli": "top",
    "pdjit.testing": "top",
    "pdjit.tools": "top",
    "pdjit.static": "top",
    "pdjit.distributed": "top",
}

# (importer, imported): function-level imports of a higher layer that are by design
LAZY_UP = {
    ("pdjit.framework.registry", "pdjit.ops"):
        "the op registry loads the built-in op definitions at its first lookup",
}

# (importer, imported): violations not yet removed (issue 33), each with its reason. Only
# shrinks.
KNOWN_UP: dict = {}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = LAYER_OF.get(".".join(parts[:n]))
        if found is not None:
            return found
    raise AssertionError(f"{module}: in no layer of LAYER_OF (place it there)")


def _target(name: str) -> str | None:
    """The pdjit module ``name`` denotes (a module, or the module an attribute lives in; a
    Fluid module path of ``pdjit.MOVED`` denotes the module it names)."""
    if name != "pdjit" and not name.startswith("pdjit."):
        return None
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in MOVED:
        name = ".".join([MOVED[parts[1]]] + parts[2:])
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(module: str) -> list:
    """``(imported module, lazy, line)`` for every pdjit import of ``module``: ``import``
    statements and ``importlib.import_module("...")`` with a literal name; ``lazy``: inside a
    function."""
    path = MODULES[module]
    is_pkg = path.name == "__init__.py"
    found = []

    def add(name, lazy, line):
        t = _target(name)
        if t is not None and t != module:
            found.append((t, lazy, line))

    def walk(node, lazy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue  # never runs
            if isinstance(child, ast.Import):
                for a in child.names:
                    add(a.name, lazy, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base if is_pkg else base[:-1]
                    base = base[:len(base) - child.level + 1]
                    src = ".".join(base + ([child.module] if child.module else []))
                else:
                    src = child.module
                for a in child.names:
                    full = f"{src}.{a.name}"
                    add(full if full in MODULES else src, lazy, child.lineno)
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and \
                    child.func.attr == "import_module" and child.args and \
                    isinstance(child.args[0], ast.Constant) and \
                    isinstance(child.args[0].value, str):
                add(child.args[0].value, lazy, child.lineno)
            walk(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda)))

    walk(ast.parse(path.read_text(), str(path)), False)
    return found


@functools.cache
def edges_of() -> dict:
    """Every module's :func:`imports` (parsed once, when a test first asks: not while the
    suite is collected)."""
    return {m: imports(m) for m in MODULES}


def test_every_module_is_in_a_layer():
    for m in MODULES:
        layer(m)


def test_no_module_imports_a_higher_layer():
    rank = {name: i for i, name in enumerate(ORDER)}
    bad, seen = [], set()
    for m, edges in edges_of().items():
        for t, lazy, line in edges:
            if rank[layer(t)] <= rank[layer(m)]:
                continue
            seen.add((m, t))
            if (m, t) in KNOWN_UP or (lazy and (m, t) in LAZY_UP):
                continue
            how = "a function-level" if lazy else "a module-level"
            bad.append(f"{MODULES[m].relative_to(SRC)}:{line}: {how} import of {t} "
                       f"({layer(m)} imports {layer(t)})")
    assert not bad, "imports against DESIGN.md's order:\n" + "\n".join(bad)
    stale = sorted(set(KNOWN_UP) - seen) + \
        sorted(k for k in LAZY_UP if k not in seen)
    assert not stale, f"listed imports that no longer occur (take them off the list): {stale}"


# (shared codegen module, target module) imports not yet removed (issue 33); only shrinks
SHARED_TO_TARGET: dict = {}


# (runtime module, target module): the runtime names a target's module; only shrinks (the
# runtime reaches targets through codegen.target's Target objects)
RUNTIME_TO_TARGET: dict = {}


def test_the_runtime_reaches_targets_through_the_target_interface():
    targets = {p.parent.name for p in (PKG / "codegen").glob("*/target.py")}
    bad, seen = [], set()
    for m, edges in edges_of().items():
        if not m.startswith("pdjit.runtime"):
            continue
        for t, _, line in edges:
            tp = t.split(".")
            if len(tp) > 2 and tp[:2] == ["pdjit", "codegen"] and tp[2] in targets:
                seen.add((m, t))
                if (m, t) not in RUNTIME_TO_TARGET:
                    bad.append(f"{m}:{line} imports {t}")
    assert not bad, f"the runtime imports a target's module: {bad}"
    stale = sorted(set(RUNTIME_TO_TARGET) - seen)
    assert not stale, f"listed imports that no longer occur (take them off the list): {stale}"


def _cycles(nodes: set, edges: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def test_codegen_has_no_import_cycle():
    """Module-level and function-level imports together: a target never imports another
    target's modules, and the shared modules never import a target's."""
    nodes = {m for m in MODULES if m.startswith("pdjit.codegen")}
    edges = {m: sorted({t for t, _, _ in edges_of()[m] if t in nodes}) for m in nodes}
    assert not _cycles(nodes, edges), f"import cycles in codegen/: {_cycles(nodes, edges)}"


def test_targets_do_not_import_each_other():
    """A target is a folder ``codegen/<name>/`` with a ``target`` module. No target imports
    another's modules, and the shared modules of ``codegen/`` import none (but those listed
    in ``SHARED_TO_TARGET``)."""
    targets = {p.parent.name for p in (PKG / "codegen").glob("*/target.py")}
    assert {"cpu", "cuda", "python", "aot"} <= targets
    bad = []
    for m, edges in edges_of().items():
        parts = m.split(".")
        if len(parts) < 3 or parts[:2] != ["pdjit", "codegen"] or parts[2] not in targets:
            continue
        for t, _, line in edges:
            tp = t.split(".")
            if len(tp) > 2 and tp[:2] == ["pdjit", "codegen"] and tp[2] in targets and \
                    tp[2] != parts[2]:
                bad.append(f"{m}:{line} imports {t}")
    assert not bad, bad
    seen = set()
    for m, edges in edges_of().items():
        parts = m.split(".")
        if len(parts) != 3 or parts[:2] != ["pdjit", "codegen"] or parts[2] in targets:
            continue
        for t, _, line in edges:
            tp = t.split(".")
            if len(tp) > 2 and tp[:2] == ["pdjit", "codegen"] and tp[2] in targets:
                seen.add((m, t))
                if (m, t) not in SHARED_TO_TARGET:
                    bad.append(f"{m}:{line} imports {t}")
    assert not bad, f"shared codegen modules import a target's: {bad}"
    stale = sorted(set(SHARED_TO_TARGET) - seen)
    assert not stale, f"listed imports that no longer occur (take them off the list): {stale}"


# a fresh interpreter imports each layer; what it loaded must hold nothing of a higher layer
_FRESH = """
import sys
import {module}
mods = sorted(m for m in sys.modules if m == "pdjit" or m.startswith("pdjit."))
print("numba" in sys.modules)
print(" ".join(mods))
"""


def _fresh_import(module: str) -> tuple:
    env_path = str(SRC)
    out = subprocess.run([sys.executable, "-c", _FRESH.format(module=module)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": env_path})
    assert out.returncode == 0, out.stderr
    numba_line, mods = out.stdout.strip().splitlines()
    return numba_line == "True", mods.split()


# a layer imported alone: (module, whether it may load numba); KNOWN_LOADS: the higher layers it
# still loads through a KNOWN_UP entry (shrinks with it)
ALONE = [("pdjit.version", False), ("pdjit.framework", False), ("pdjit.passes", False),
         ("pdjit.ops", True), ("pdjit.codegen.lowering", True), ("pdjit.runtime.executor", True),
         ("pdjit.layers", False), ("pdjit.io", False)]
KNOWN_LOADS: dict = {}


@pytest.mark.parametrize("module,numba_ok", ALONE)
def test_a_layer_imports_without_the_layers_above(module, numba_ok):
    """A fresh interpreter that imports ``module`` (a layer) has loaded no module of a layer
    above it; ``import pdjit.framework`` (or the package itself) does not load Numba."""
    numba_loaded, mods = _fresh_import(module)
    rank = {name: i for i, name in enumerate(ORDER)}
    own = rank[layer(module)]
    above = sorted({layer(m) for m in mods if m in MODULES and m != "pdjit" and
                    rank[layer(m)] > own} - KNOWN_LOADS.get(module, set()))
    assert numba_ok or not numba_loaded, f"import {module} loaded numba"
    assert not above, f"import {module} loaded higher layers: {above}"


def test_the_package_still_gives_the_public_names():
    """The Fluid facade loads on first use: ``import pdjit as fluid; fluid.layers.fc``."""
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys, pdjit as fluid\n"
         "assert 'pdjit.layers' not in sys.modules\n"
         "print(fluid.layers.fc.__module__, fluid.Executor.__name__, fluid.__version__,"
         " 'append_backward' in dir(fluid), len(fluid.__all__) > 30)"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["pdjit.layers.nn", "Executor", "0.1.0", "True", "True"]


def test_the_layer_table_names_real_modules():
    for name in LAYER_OF:
        assert name in MODULES or any(m.startswith(name + ".") for m in MODULES), name
