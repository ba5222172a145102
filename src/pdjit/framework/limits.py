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
``PDJIT_MAX_LOOP_ITERATIONS`` (100,000)
    iterations of one ``while`` op in one run: a ``LoopLimitError`` (an ``OpRunError``) naming
    the loop (op, block, index, the user's line, its condition) beyond it, in both executors
    and in a loop compiled as one native function, before anything of the run reaches the
    Scope. A loop whose condition never turns false ends there instead of hanging: 100,000
    iterations of a small body take ~0.2 s natively and ~20 s in reference mode, whose
    training loops also keep each iteration's scope for the backward pass (~1 KB an
    iteration for four small ops: 100 MB), far more than the decoding and recurrent loops
    Fluid programs run; a program that needs more sets it higher.
"""
from __future__ import annotations

import os

from pdjit.framework.errors import LoopLimitError, ProgramLimitError

MAX_BLOCKS = ("PDJIT_MAX_BLOCKS", 10_000)
MAX_OPS_PER_BLOCK = ("PDJIT_MAX_OPS_PER_BLOCK", 100_000)
MAX_BLOCK_DEPTH = ("PDJIT_MAX_BLOCK_DEPTH", 64)
MAX_FUSED_OPS = ("PDJIT_MAX_FUSED_OPS", 128)
MAX_LOOP_ITERATIONS = ("PDJIT_MAX_LOOP_ITERATIONS", 100_000)


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


def loop_limit_error(op, op_idx, body_idx: int, cond: str, iterations: int,
                     limit: int) -> LoopLimitError:
    """The error for loop op ``op`` (index ``op_idx`` of its block) whose condition ``cond``
    still holds after ``iterations`` iterations of its body block ``body_idx``, the bound
    ``limit`` of :data:`MAX_LOOP_ITERATIONS` (the same text in every executor)."""
    env = MAX_LOOP_ITERATIONS[0]
    return LoopLimitError(
        f"the loop (body block {body_idx}) still holds its condition {cond!r} after "
        f"{iterations} iterations, the bound {env}={limit} (a condition that never turns "
        f"false? else set {env} higher)", op.type, op.block.idx, op_idx, op.location())
