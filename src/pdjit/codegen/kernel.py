"""Target-neutral kernel descriptions: what a fusion group computes, before any target renders
it.

A :class:`LoopKernel` describes an elementwise or reduction group: its leaves (the arrays it
reads, each with its broadcast placement against the group's iteration shape), the scalar
statements of one element (from the ops' emit templates, attribute values replaced by run-time
parameters ``p0, p1, ...``), the values it stores, an optional reduction, and the one loop form
chosen at build time from the static shapes. It names no variable and no size: two groups that
compute the same thing on the same dtypes and ranks have equal descriptions, and every target
renders equal descriptions to equal kernel text, which is the kernel's cache key.

Placements of a leaf (its build-time shape against the group's, ``-1`` matching only ``-1``):

- ``full``: the group's shape;
- ``row``: the group's last ``row_rank`` dims (leading dims absent or 1): repeated over rows;
- ``scalar``: one element, broadcast everywhere;
- ``mid``: a block of middle dims ``[a, b)`` of the group, 1s (or nothing) around it: a
  per-channel operand (a bias or a batch-norm scale on axis 1 of an image);
- ``strided``: anything else (a broadcast known only at run time...).

Loop forms: ``flat`` (full and scalar leaves: one loop), ``row`` (some rows: a loop over rows
and one over the row), ``mid`` (mid leaves of one block: a loop over (outer, channel) pairs,
the channel's values loaded once, and a contiguous inner loop), ``strided`` (a loop nest with
per-leaf strides), and for reductions ``reduce_all``, ``reduce_rows`` (a suffix of axes),
``reduce_block`` (a contiguous block of axes) and ``reduce_strided``.
"""
from __future__ import annotations

from dataclasses import dataclass

FULL, ROW, SCALAR, MID, STRIDED = "full", "row", "scalar", "mid", "strided"
FLAT_FORMS = ("flat", "row", "mid")


@dataclass(frozen=True)
class Leaf:
    rank: int
    offset: int            # where the leaf's dims start among the group's
    shape: tuple           # build-time shape (-1: known at run time)
    place: str             # FULL, ROW, SCALAR or STRIDED


@dataclass
class ReduceSpec:
    """``acc = init; acc = combine(acc, x)...; out = finalize(acc, n)`` over ``axes``."""
    init: str              # templates with ``{acc}``, ``{n}`` left to fill
    combine: str
    finalize: str
    axes: tuple            # reduced axes of the iteration shape (sorted)
    keep_dim: bool
    dtype: str             # the output's NumPy type name
    x: str                 # the scalar expression reduced
    cone: frozenset = frozenset()   # leaf ids ``x`` depends on
    identity: bool = True  # False: an empty extent into a non-empty output is an error
    # ``combine`` over two partial results ``{acc}`` and ``{x}`` (a target that reduces in
    # parallel merges its partials with it; the CPU's loops never do)
    merge: str = ""


@dataclass
class LoopKernel:
    rank: int
    leaves: list
    body: list             # statements of one element, over x<leaf>, p<param>, e<k>
    stores: list           # [(scalar expression, NumPy type name, leaf ids of its cone)]
    nparams: int
    form: str = "flat"
    row_rank: int = 0
    mid: tuple = ()        # the ``mid`` form's block of dims [a, b)
    reduce: ReduceSpec | None = None
    math: tuple = ()       # the math helpers (``_m.<name>``) its statements call, sorted


def place_leaf(shape: tuple, offset: int, group: tuple) -> tuple:
    """(placement, detail) of a leaf of build-time ``shape`` at ``offset`` in ``group``: the
    row rank of a ``row`` leaf, the block ``(a, b)`` of a ``mid`` one."""
    rank, r = len(group), len(shape)
    if all(d == 1 for d in shape) and not (r == rank and tuple(shape) == tuple(group)):
        return SCALAR, 0
    if r == rank and tuple(shape) == tuple(group):
        return FULL, 0
    if r and offset + r == rank:
        lead = 0
        while lead < r and shape[lead] == 1:
            lead += 1
        k = r - lead
        if k and tuple(shape[lead:]) == tuple(group[rank - k:]) and rank - k > 0:
            return ROW, k
    if r and offset + r <= rank:
        lead = 0
        while lead < r and shape[lead] == 1:
            lead += 1
        end = r
        while end > lead and shape[end - 1] == 1:
            end -= 1
        a, b = offset + lead, offset + end
        if end > lead and b < rank and tuple(shape[lead:end]) == tuple(group[a:b]) \
                and -1 not in shape[lead:end]:
            return MID, (a, b)
    return STRIDED, 0


def choose_form(kernel: LoopKernel, row_ranks: list) -> str:
    """The one loop form for this kernel, from its leaves' placements."""
    places = [leaf.place for leaf in kernel.leaves]
    full = {i for i, p in enumerate(places) if p == FULL}
    covered = all(cone & full for _, _, cone in kernel.stores)
    red = kernel.reduce
    if red is not None:
        if STRIDED in places or ROW in places or MID in places or not full or not covered or \
                not red.cone & full:
            return "reduce_strided"
        axes, rank = red.axes, kernel.rank
        if len(axes) == rank:
            return "reduce_all"
        if axes != tuple(range(axes[0], axes[-1] + 1)):
            return "reduce_strided"
        return "reduce_rows" if axes[-1] == rank - 1 else "reduce_block"
    if STRIDED in places or not full or not covered:
        return "strided"
    rows = {k for k, p in zip(row_ranks, places) if p == ROW}
    mids = {k for k, p in zip(row_ranks, places) if p == MID}
    if mids:
        if len(mids) > 1 or rows:
            return "strided"
        kernel.mid = mids.pop()
        return "mid"
    if len(rows) > 1:
        return "strided"
    if rows:
        kernel.row_rank = rows.pop()
        return "row"
    return "flat"
