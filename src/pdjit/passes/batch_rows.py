"""Which values of a block carry the batch row by row: the analysis behind splitting a batch
across threads (an AOT artifact's ``pdjit compile --threads N``, ``pdjit.aot.batch_split``; a
JIT native driver's slices, ``pdjit.codegen.cpu.tiers``).

:func:`row_states` walks a block's ops in order, giving every variable a state:

- ``batch``: dim 0 is the batch, and row ``i`` depends only on row ``i`` of the batch inputs;
- ``const``: does not depend on the batch inputs at all (parameters, inputs with a fixed dim 0,
  what ops compute from those alone);
- ``none``: an output nothing may read for a split run (a view's ``XShape``, a norm's
  statistics): reading it refuses the split.

An op whose inputs are all ``const`` gives ``const`` outputs (unless it is random). An op that
reads a ``batch`` value must be known row-wise, from what the op registry declares: an
``ELEMENTWISE`` op (broadcast placement checked: a batch input must line up with the output's
dim 0, a constant that lines up with it must have size 1 there), a ``REDUCTION`` that keeps dim
0, a ``VIEW`` whose declared output keeps dim 0 unknown and the row's size, or an op that
declares itself row-wise (:class:`~pdjit.framework.registry.RowWise`: its batch and constant
slots, the axes that must not be the batch's, and what else its attributes must satisfy;
``mul``, ``matmul`` with a constant right operand, convolutions and pools, ``batch_norm`` in
test mode, ``softmax`` on another axis...). The op's declaration comes before its traits.
Anything else is refused, with the reason: unknown means not separable.
"""
from __future__ import annotations

from pdjit.framework import registry

__all__ = ["row_states", "BATCH", "CONST", "NONE"]

BATCH, CONST, NONE = "batch", "const", "none"


class _Refuse(Exception):
    pass


def _attr(op, name, default=None):
    if op.has_attr(name):
        return op.attr(name)
    d = op.opdef
    spec = d.attrs.get(name) if d is not None else None
    if spec is not None and not spec.required:
        return spec.default
    return default


class _Ctx:
    def __init__(self, block, state):
        self.block, self.state = block, state

    def shape(self, name):
        v = self.block._find_var_recursive(name)
        if v is None or v.shape is None:
            raise _Refuse(f"variable {name!r} has no declared shape")
        return tuple(int(d) for d in v.shape)

    def rank(self, name):
        return len(self.shape(name))


def _names(op, slot):
    return [n for n in (op.input(slot) if slot in op.input_names else []) if n]


def _one(op, slot):
    names = _names(op, slot)
    if len(names) != 1:
        raise _Refuse(f"slot {slot!r}: expected one variable, got {len(names)}")
    return names[0]


def _axis0(axis, rank) -> bool:
    """Whether ``axis`` (negative counts from the end) is dim 0 of a rank-``rank`` value."""
    return rank > 0 and int(axis) % rank == 0


def _require(cond, why):
    if not cond:
        raise _Refuse(why)


def _only(op, ctx, batch_slots, const_slots=()):
    """The batch value is in ``batch_slots`` only; ``const_slots`` must not depend on it; no
    other slot may be bound."""
    for slot in op.input_names:
        for n in _names(op, slot):
            st = ctx.state[n]
            if slot in batch_slots:
                continue
            if slot in const_slots:
                _require(st == CONST, f"its {slot} ({n!r}) depends on the batch")
            else:
                raise _Refuse(f"input slot {slot} ({n!r}) is bound")


# ---- the ops that declare themselves row-wise (registry.RowWise) ------------------------------
class _View:
    """What a :class:`~pdjit.framework.registry.RowWise` check may ask of the op."""

    def __init__(self, op, ctx):
        self._op, self._ctx = op, ctx

    def attr(self, name):
        return _attr(self._op, name)

    def rank(self, slot):
        return self._ctx.rank(_names(self._op, slot)[0])

    def carries(self, slot):
        return any(self._ctx.state[n] == BATCH for n in _names(self._op, slot))


def _declared(decl):
    def rule(op, ctx):
        _only(op, ctx, decl.batch, decl.const)
        parts = [n for s in decl.batch for n in _names(op, s)]
        _require(bool(parts), f"none of its slots {list(decl.batch)} is bound")
        if decl.every:
            _require(all(ctx.state[n] == BATCH for n in parts),
                     "a part that does not carry the batch")
        rank = ctx.rank(parts[0])
        for a in decl.axes:
            value = _attr(op, a)
            axes = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
            _require(not any(_axis0(v, rank) for v in axes), f"{a}={value} is the batch axis")
        if decl.check is not None:
            why = decl.check(_View(op, ctx))
            _require(not why, why)
        return {s: (NONE if s in decl.drop else BATCH) for s in op.output_names}
    return rule


# ---- the trait rules -------------------------------------------------------------------------
def _elementwise(op, ctx):
    if _attr(op, "normalize", False):
        raise _Refuse("normalize=True divides by a count over the whole batch")
    outs = [n for s in op.output_names for n in op.output(s)]
    R = ctx.rank(outs[0])
    axis = int(_attr(op, "axis", -1)) if op.opdef.has(registry.BROADCAST) else -1
    for slot in op.input_names:
        for n in _names(op, slot):
            r = ctx.rank(n)
            start = R - r if (r == R or axis == -1) else axis
            if ctx.state[n] == BATCH:
                _require(start == 0 and r > 0, f"its {slot} ({n!r}) carries the batch on "
                                               f"output axis {start}, not 0")
            elif start == 0 and r > 0:
                d0 = ctx.shape(n)[0]
                _require(d0 == 1, f"its {slot} ({n!r}), constant, has {d0} rows on the batch "
                                  "axis (expected 1: a row per batch row would depend on the "
                                  "row's index)")
    return {s: BATCH for s in op.output_names}


def _reduction(op, ctx):
    x = _one(op, "X")
    _only(op, ctx, ("X",))
    if not op.has_attr("dim") and "dim" not in (op.opdef.attrs or {}):
        raise _Refuse("reduces over the whole input, the batch axis included")
    r = ctx.rank(x)
    dims = list(_attr(op, "dim", []) or [])
    _require(not bool(_attr(op, "reduce_all", False)) and dims,
             "reduces over every axis, the batch axis included")
    _require(not any(_axis0(d, r) for d in dims), f"dim={dims} reduces over the batch axis")
    return {s: BATCH for s in op.output_names}


def _view(op, ctx):
    x = _one(op, "X")
    for slot in op.input_names:
        _require(slot == "X" or not _names(op, slot), f"its shape comes from {slot}")
    xs = ctx.shape(x)
    for s in op.output_names:
        if s == "XShape":
            continue
        for n in op.output(s):
            os_ = ctx.shape(n)
            prod_in, prod_out = _prod(xs[1:]), _prod(os_[1:])
            _require(bool(xs) and xs[0] == -1 and bool(os_) and os_[0] == -1 and
                     prod_in is not None and prod_in == prod_out,
                     f"{list(xs)} -> {list(os_)} does not keep the rows (dim 0 unknown, the "
                     "rest known and of the same size)")
    return {s: (NONE if s == "XShape" else BATCH) for s in op.output_names}


def _prod(dims):
    p = 1
    for d in dims:
        if d < 0:
            return None
        p *= d
    return p


def _rule(op):
    d = op.opdef
    if d is None:
        return None
    if d.row_wise is not None:
        return _declared(d.row_wise)
    if d.has(registry.RANDOM) or d.has(registry.SIDE_EFFECT) or d.has(registry.CONTROL_FLOW) \
            or d.has(registry.SEQUENCE):
        return None
    if d.has(registry.ELEMENTWISE):
        return _elementwise
    if d.has(registry.REDUCTION):
        return _reduction
    if d.has(registry.VIEW):
        return _view
    return None


def row_states(block, ops, unwritten) -> dict:
    """For each of ``ops`` (in order), ``id(op) -> (why, reads, writes)``: why its output rows
    may not depend only on the same rows of its inputs ("" when they do), and the states of the
    values it reads and writes (``{name: state}``). ``unwritten(name)`` is the state of a value
    no op of ``ops`` wrote before it is read (a feed, a parameter). The outputs of an op that is
    refused are ``none``."""

    class _State(dict):
        def __missing__(self, name):
            return unwritten(name)

    state = _State()
    ctx = _Ctx(block, state)
    out = {}
    for op in ops:
        d = op.opdef
        read = {n: state[n] for s in op.input_names for n in _names(op, s)}
        why, outs = "", {}
        bad = next((n for n, v in read.items() if v == NONE), None)
        if bad is not None:
            why = f"reads {bad!r}, a value a split run does not keep"
        elif all(v == CONST for v in read.values()) and \
                (d is None or not d.has(registry.RANDOM)):
            outs = {s: CONST for s in op.output_names}
        else:
            rule = _rule(op)
            if rule is None:
                why = "is not known to keep batch rows independent"
            else:
                try:
                    outs = rule(op, ctx)
                except _Refuse as e:
                    why = str(e)
                except Exception as e:  # noqa: BLE001 - a malformed op: not separable
                    why = f"cannot analyse ({type(e).__name__}: {e})"
        wrote = {}
        for s in op.output_names:
            for n in op.output(s):
                if n:
                    state[n] = wrote[n] = outs.get(s, NONE)
        out[id(op)] = (why, read, wrote)
    return out


def declared_shape(block, name) -> tuple:
    """The declared shape of ``name`` (``ValueError`` naming it when it has none)."""
    try:
        return _Ctx(block, {}).shape(name)
    except _Refuse as e:
        raise ValueError(str(e)) from None

