"""Whether a model's batch may be split across threads (``pdjit compile --threads N``).

:func:`analyse` decides, at build time, whether every output row of the model depends only on
the same rows of its batch-carrying inputs, so that running slices of the batch on separate
threads (each with an arena of its own) gives the outputs of one run over the whole batch.
"""
from __future__ import annotations

__all__ = ["analyse"]


def analyse(program, plan, feed_names, fetch_names) -> tuple:
    """``(True, "")`` when the batch may be split, else ``(False, why)`` (why names the op)."""
    return False, "not analysed"
