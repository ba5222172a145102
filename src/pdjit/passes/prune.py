"""Prune: keep only the ops a run needs.

Assumes: ``ops`` is a block's op list in program order. Guarantees: the kept ops (returned in
their original order) are exactly those that produce, transitively, a fetched variable or a
persistable variable, plus every op whose definition has a side effect, owns sub-blocks, or is
not registered (what an unknown op does is unknown, so it stays).
"""
from __future__ import annotations

from pdjit.framework import registry
from pdjit.framework.program import Block

_ALWAYS_KEEP = (registry.SIDE_EFFECT, registry.CONTROL_FLOW, registry.FEED_FETCH)


def prune(block: Block, targets) -> list:
    needed = set(targets)
    keep = []
    for op in reversed(block.ops):
        opdef = registry.lookup(op.type)
        writes_persistable = any(
            (v := block._find_var_recursive(n)) is not None and v.persistable
            for n in op.output_arg_names)
        if (opdef is None or any(opdef.has(t) for t in _ALWAYS_KEEP) or writes_persistable
                or any(n in needed for n in op.output_arg_names)):
            keep.append(op)
            needed.update(op.input_arg_names)
    keep.reverse()
    return keep
