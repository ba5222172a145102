"""Op definitions hold semantics only (issue 33): no file under ``src/pdjit/ops/`` switches on
the target (``ctx.target``), imports a code generation module, names a target (``"cpu"``,
``"cuda"``, any folder of ``codegen/`` with a ``target.py``), names a target's kernel modules
(``codegen.cpu``, ``nnlib``...) or calls a target library's kernels (``_nn.``, ``_cu.``) in the
lines it writes; subfolders of ``ops/`` included.
Each target's lowerings live in ``codegen/<target>/lowerings/``.

``KNOWN`` lists the files not moved yet, each with its reason; it only shrinks (a listed file
that no longer offends fails the test, so a fixed file is taken off it).
"""
from __future__ import annotations

import pathlib
import re

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "pdjit"
OPS = SRC / "ops"
# the targets: each folder of codegen/ that holds a target module (read from the file tree, so
# a new target is covered without importing the code generator into a framework test)
TARGETS = sorted(d.name for d in (SRC / "codegen").iterdir() if (d / "target.py").is_file())
_ALT = "|".join(TARGETS)

PATTERNS = {
    "ctx.target": re.compile(r"\bctx\.target\b"),
    "codegen import": re.compile(r"^\s*(from|import)\s+pdjit\.codegen\b", re.M),
    "target name": re.compile(rf"""["']({_ALT})["']"""),
    "target library call": re.compile(r"\b_(nn|cu)\.[a-z_]"),
    "kernel module name": re.compile(rf"\bcodegen\.({_ALT})\b|\b(nnlib|cuda_lib)\b"),
}

# file -> reason; only shrinks
KNOWN: dict = {}


def _code(text: str) -> str:
    """``text`` without comment lines (docstrings may describe what a target does)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _offences() -> dict:
    found = {}
    for path in sorted(OPS.rglob("*.py")):
        text = _code(path.read_text())
        hits = sorted(what for what, pat in PATTERNS.items() if pat.search(text))
        if hits:
            found[path.relative_to(OPS).as_posix()] = hits
    return found


def test_the_scan_knows_the_targets():
    assert {"cpu", "cuda", "python"} <= set(TARGETS), TARGETS


def test_op_definitions_name_no_target():
    found = _offences()
    new = {f: hits for f, hits in found.items() if f not in KNOWN}
    assert not new, f"target code in op definitions (move it to codegen/<target>/lowerings/): " \
                    f"{new}"


def test_known_offenders_only_shrink():
    gone = sorted(set(KNOWN) - set(_offences()))
    assert not gone, f"no longer offending: take {gone} off KNOWN"
