"""pdjit's documented bounds on program size, each raised by an environment variable.

A program beyond one is refused with a :class:`ProgramLimitError` naming the bound and its
variable before anything walks, allocates or compiles it:

``PDJIT_MAX_BLOCKS`` (10,000)
    blocks in one program.
``PDJIT_MAX_OPS_PER_BLOCK`` (100,000)
    ops in one block.
``PDJIT_MAX_BLOCK_DEPTH`` (64)
    blocks nested inside one another (``parent_idx`` chains, and sub-block attributes of ops):
    the executors, the verifier and the backward pass stay within Python's recursion limit.
``PDJIT_MAX_FUSED_OPS`` (128)
    ops fused into one elementwise kernel: a longer chain becomes several kernels, so compile
    time and memory grow linearly with the program (not a refusal).
``PDJIT_MAX_LOOP_ITERATIONS`` (unset: no bound)
    iterations of one ``while`` op in one run: an ``OpRunError`` naming the loop beyond it.
"""
from __future__ import annotations

import os

from pdjit.framework.errors import ProgramLimitError

MAX_BLOCKS = ("PDJIT_MAX_BLOCKS", 10_000)
MAX_OPS_PER_BLOCK = ("PDJIT_MAX_OPS_PER_BLOCK", 100_000)
MAX_BLOCK_DEPTH = ("PDJIT_MAX_BLOCK_DEPTH", 64)
MAX_FUSED_OPS = ("PDJIT_MAX_FUSED_OPS", 128)
MAX_LOOP_ITERATIONS = ("PDJIT_MAX_LOOP_ITERATIONS", None)


def bound(which: tuple):
    """The value of bound ``which`` (one of the pairs above): its environment variable when
    set (a positive integer), else its default."""
    env, default = which
    text = os.environ.get(env)
    if not text:
        return default
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ProgramLimitError(f"{env}={text!r}: expected a positive integer")
    return n


def exceeded(what: str, got: int, which: tuple, limit: int) -> ProgramLimitError:
    """The error for ``what`` being ``got``, beyond ``limit`` of bound ``which``."""
    return ProgramLimitError(f"{what}: {got}, more than the bound {limit} ({which[0]}; set it "
                             f"higher to accept such programs)")
