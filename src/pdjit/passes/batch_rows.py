"""Which values of a block carry the batch row by row: the analysis behind splitting a batch
across threads (an AOT artifact's ``pdjit compile --threads N``, ``pdjit.aot.batch_split``; a
JIT native driver's slices, ``pdjit.runtime.plan``).

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
0, a ``VIEW`` whose declared output keeps dim 0 unknown and the row's size, or one of the opaque
ops of :data:`ROW_WISE` with its attributes checked (``mul``, ``matmul`` with a constant right
operand, convolutions and pools, ``batch_norm`` in test mode, ``softmax`` on another axis...).
Anything else is refused, with the reason: unknown means not separable.
"""
from __future__ import annotations

from pdjit.framework import registry

__all__ = ["row_states", "ROW_WISE", "BATCH", "CONST", "NONE"]

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


def _tensor_args_absent(op, *slots):
    for s in slots:
        _require(not _names(op, s), f"{s} is given as a tensor")


# ---- the opaque ops known to be row-wise, with their attributes checked --------------------
def _mul(op, ctx):
    _only(op, ctx, ("X",), ("Y",))
    _require(ctx.state[_one(op, "X")] == BATCH, "its X does not carry the batch")
    _require(int(_attr(op, "x_num_col_dims", 1)) >= 1, "x_num_col_dims < 1")
    return {"Out": BATCH}


def _matmul(op, ctx):
    x, y = _one(op, "X"), _one(op, "Y")
    rx, ry = ctx.rank(x), ctx.rank(y)
    _require(int(_attr(op, "head_number", 1)) == 1, "head_number != 1")
    if ctx.state[x] == BATCH and ctx.state[y] == BATCH:
        # a batched product (attention): both carry the batch on dim 0, the product is over
        # the last two axes
        _require(rx == ry >= 3, f"X of rank {rx} times Y of rank {ry}, both carrying the "
                                "batch: expected equal ranks >= 3")
        return {"Out": BATCH}
    _only(op, ctx, ("X",), ("Y",))
    _require(ctx.state[x] == BATCH, "its X does not carry the batch")
    trans = bool(_attr(op, "trans_x", False) or _attr(op, "transpose_X", False))
    _require(ry <= 2 and (rx >= 3 or (rx == 2 and not trans)),
             f"X of rank {rx} (transposed: {trans}) times Y of rank {ry} mixes rows")
    return {"Out": BATCH}


def _conv(op, ctx):
    _only(op, ctx, ("Input",), ("Filter", "Bias"))
    return {"Output": BATCH}


def _pool(op, ctx):
    _only(op, ctx, ("X",))
    return {s: BATCH for s in op.output_names}


def _batch_norm(op, ctx):
    _require(bool(_attr(op, "is_test", False)) or bool(_attr(op, "use_global_stats", False)),
             "is_test and use_global_stats are false (batch statistics)")
    _require(not bool(_attr(op, "trainable_statistics", False)), "trainable_statistics")
    _only(op, ctx, ("X",), ("Scale", "Bias", "Mean", "Variance", "MomentumTensor"))
    return {s: (BATCH if s == "Y" else NONE) for s in op.output_names}


def _layer_norm(op, ctx):
    _require(int(_attr(op, "begin_norm_axis", 1)) >= 1, "begin_norm_axis < 1")
    _only(op, ctx, ("X",), ("Scale", "Bias"))
    return {s: (BATCH if s == "Y" else NONE) for s in op.output_names}


def _per_sample_norm(op, ctx):
    _only(op, ctx, ("X",), ("Scale", "Bias"))
    return {s: (BATCH if s == "Y" else NONE) for s in op.output_names}


def _axis_not_0(slot="X", attr="axis", default=-1):
    def rule(op, ctx):
        _only(op, ctx, (slot,))
        x = _one(op, slot)
        if attr is not None:
            _require(not _axis0(_attr(op, attr, default), ctx.rank(x)),
                     f"{attr}={_attr(op, attr, default)} is the batch axis")
        _tensor_args_absent(op, "AxisTensor", "K")
        return {s: (NONE if s == "XShape" else BATCH) for s in op.output_names}
    return rule


def _top_k(op, ctx):
    _only(op, ctx, ("X",))
    _tensor_args_absent(op, "K")
    _require(ctx.rank(_one(op, "X")) >= 2, "a rank-1 input: top k over the batch")
    return {s: BATCH for s in op.output_names}


def _arg(op, ctx):
    _require(not bool(_attr(op, "flatten", False)), "flatten")
    return _axis_not_0()(op, ctx)


def _cumsum(op, ctx):
    _require(not bool(_attr(op, "flatten", False)), "flatten")
    return _axis_not_0()(op, ctx)


def _concat(op, ctx):
    _tensor_args_absent(op, "AxisTensor")
    xs = _names(op, "X")
    _require(all(ctx.state[n] == BATCH for n in xs), "a part that does not carry the batch")
    _require(not _axis0(_attr(op, "axis", 0), ctx.rank(xs[0])), "concatenates on the batch axis")
    return {"Out": BATCH}


def _split(op, ctx):
    _tensor_args_absent(op, "AxisTensor", "SectionsTensorList")
    return _axis_not_0()(op, ctx)


def _transpose(op, ctx):
    _only(op, ctx, ("X",))
    perm = list(_attr(op, "axis", []))
    _require(bool(perm) and int(perm[0]) == 0, f"axis={perm} moves the batch axis")
    return {s: (NONE if s == "XShape" else BATCH) for s in op.output_names}


def _slice(op, ctx):
    _tensor_args_absent(op, "StartsTensor", "EndsTensor", "StartsTensorList",
                        "EndsTensorList")
    _only(op, ctx, ("Input",))
    r = ctx.rank(_one(op, "Input"))
    for a in list(_attr(op, "axes", [])) + list(_attr(op, "decrease_axis", [])):
        _require(not _axis0(a, r), "slices the batch axis")
    return {"Out": BATCH}


def _pad(op, ctx):
    _only(op, ctx, ("X",))
    p = list(_attr(op, "paddings", []))
    _require(len(p) >= 2 and int(p[0]) == 0 and int(p[1]) == 0, "pads the batch axis")
    return {"Out": BATCH}


def _lookup(op, ctx):
    _only(op, ctx, ("Ids",), ("W",))
    return {"Out": BATCH}


def _slot_x(op, ctx, const=()):
    _only(op, ctx, ("X",), const)
    return {s: BATCH for s in op.output_names}


def _one_hot(op, ctx):
    _tensor_args_absent(op, "depth_tensor")
    return _slot_x(op, ctx)


#: the opaque ops known to be row-wise (each rule checks the op's attributes and slots)
ROW_WISE = {
    "mul": _mul, "matmul": _matmul, "matmul_v2": _matmul,
    "conv2d": _conv, "depthwise_conv2d": _conv, "conv2d_transpose": _conv,
    "depthwise_conv2d_transpose": _conv, "pool2d": _pool, "max_pool2d_with_index": _pool,
    "batch_norm": _batch_norm, "layer_norm": _layer_norm, "group_norm": _per_sample_norm,
    "instance_norm": _per_sample_norm,
    "softmax": _axis_not_0(), "log_softmax": _axis_not_0(), "norm": _axis_not_0(),
    "arg_max": _arg, "arg_min": _arg, "cumsum": _cumsum, "top_k": _top_k,
    "top_k_v2": _axis_not_0(), "concat": _concat, "split": _split,
    "transpose": _transpose, "transpose2": _transpose, "slice": _slice, "pad": _pad,
    "lookup_table": _lookup, "lookup_table_v2": _lookup, "one_hot_v2": _one_hot,
    "assign": lambda op, ctx: _slot_x(op, ctx),
    "affine_channel": lambda op, ctx: _slot_x(op, ctx, ("Scale", "Bias")),
    "prelu": lambda op, ctx: _slot_x(op, ctx, ("Alpha",)),
}


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
    if op.type == "squeeze2":
        axes = list(_attr(op, "axes", []))
        _require(bool(axes), "squeeze2 with no axes squeezes a batch of 1 too")
        _require(not any(_axis0(a, len(ctx.shape(x))) for a in axes), "squeezes the batch axis")
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
    if op.type in ROW_WISE:
        return ROW_WISE[op.type]
    d = op.opdef
    if d is None:
        return None
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

