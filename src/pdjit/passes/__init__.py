"""Passes over a block: program -> program (prune) and program -> plan (fusion partition).

Passes never run code and never name an op: they read op definitions' traits and ``emit``.
``PDJIT_DUMP_AFTER=<pass>`` (comma-separated, or ``all``) prints what a pass produced, to
stderr: the compile pipeline's stages (``prune``, ``fusion``, ``generate``, ``memory_plan``,
``native_loops``, ``steps``: :mod:`pdjit.codegen.pipeline`) and the inference passes
(``pdjit.passes.inference``): ``test_mode``, ``remove_noops``, ``fold_batch_norm``,
``affine_elementwise``, ``fold_constants`` and ``channels_last``.
"""
from __future__ import annotations

import os
import sys


def dump_after(pass_name: str, text_fn) -> None:
    """Print ``text_fn()`` if the user asked to see the output of ``pass_name``."""
    wanted = os.environ.get("PDJIT_DUMP_AFTER", "")
    if not wanted:
        return
    names = {w.strip() for w in wanted.split(",")}
    if pass_name in names or "all" in names:
        print(f"==== pdjit: after pass {pass_name} ====\n{text_fn()}", file=sys.stderr)
