"""Whether a model's batch may be split across threads (``pdjit compile --threads N``).

:func:`analyse` decides, at build time, whether every output row of the model depends only on
the same rows of its batch-carrying inputs (the inputs whose declared dim 0 is ``-1``), so that
running slices of the batch on separate threads (each with an arena of its own) gives the
outputs of one run over the whole batch: the global block's ops in order, by the row analysis
of :mod:`pdjit.passes.batch_rows`, and every output ``batch`` with a declared shape
``[-1, known...]``.
"""
from __future__ import annotations

from pdjit.framework import registry
from pdjit.passes.batch_rows import BATCH, CONST, declared_shape, row_states

__all__ = ["analyse"]


def analyse(program, plan, feed_names, fetch_names) -> tuple:
    """``(True, "")`` when the batch may be split, else ``(False, why)`` (why names the op or
    the variable). ``plan`` is not read: the ops of the program's global block, in order,
    decide (the plan computes the same values)."""
    block = program.global_block()
    feeds = {}
    try:
        for n in feed_names:
            s = declared_shape(block, n)
            feeds[n] = BATCH if s and s[0] == -1 else CONST
    except ValueError as e:
        return False, str(e)
    if BATCH not in feeds.values():
        return False, "no input has a batch dimension (a leading -1)"
    ops = [(i, op) for i, op in enumerate(block.ops)
           if op.opdef is None or not op.opdef.has(registry.FEED_FETCH)]
    states = row_states(block, [op for _, op in ops], lambda n: feeds.get(n, CONST))
    written = {}
    for i, op in ops:
        why, _, wrote = states[id(op)]
        if why:
            return False, f"op {op.type!r} (#{i}): {why}"
        written.update(wrote)
    for n in fetch_names:
        if written.get(n, feeds.get(n, CONST)) != BATCH:
            return False, f"output {n!r} does not carry the batch rows"
        try:
            s = declared_shape(block, n)
        except ValueError as e:
            return False, f"output {n!r}: {e}"
        if not s or s[0] != -1 or any(d < 0 for d in s[1:]):
            return False, f"output {n!r}: declared shape {list(s)} (a split run needs " \
                          "[-1, known...])"
    return True, ""
