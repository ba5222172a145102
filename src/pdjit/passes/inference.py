"""Inference passes: rewrites of a program that only predicts, with the values of its parameters.

Each pass is ``fn(program, params) -> (program, params)``: ``params`` maps the names of
persistable variables to their values (``np.ndarray``). A pass never changes what it is given:
it returns a new program (``Program.clone``) and a new dict (the arrays it leaves alone are
shared, new values are new arrays). It keeps the ``feed``/``fetch`` ops and the names of fed and
fetched variables, and what every fetch gives stays the same (to rounding: folding computes the
new weights in float64 and stores them in the weight's dtype). In pipeline order
(:data:`INFERENCE_PASSES`; ``PDJIT_DUMP_AFTER=<name>`` prints a pass's result):

``test_mode``
    Each op's test-mode attribute (declared ``test_mode``: ``is_test``) set true, in every
    block: dropout stops dropping, batch norm uses its running statistics.
``remove_noops``
    An op whose definition says it passes a value through at inference
    (:class:`~pdjit.framework.registry.Passthrough`: dropout in test mode with
    ``upscale_in_train``, ``scale`` by 1 with bias 0, ``assign``, so whole chains of them) goes:
    its readers read its input instead. When its output must keep its name (fetched,
    persistable, read by a sub-block or a control-flow op) the op that produced its input
    writes that name instead, when that is safe; otherwise the op stays. An op that becomes
    another (:class:`~pdjit.framework.registry.Rewrite`: dropout in test mode with
    ``downgrade_in_infer`` is a ``scale`` by ``1 - dropout_prob``) is replaced.
``fold_batch_norm``
    An op linear in a constant weight by output channel
    (:class:`~pdjit.framework.registry.ChannelLinear`: convolutions, transposed ones, ``mul``,
    ``matmul``/``matmul_v2`` with a 2-D weight) followed by a chain of per-channel affine ops
    with constant coefficients (:class:`~pdjit.framework.registry.ChannelAffine`: per-channel
    bias adds and multiplies, batch norm with running statistics) on the same channel axis,
    one of them scaling, becomes the op with a new weight and one addition (the op declared
    ``ADDITION``) of a new bias. New weights get new names (the old weight may be shared);
    each value in the chain must be read by the next op only.
``affine_elementwise``
    What stays of those affine ops that runs apart from its neighbours (declared ``OPAQUE``:
    a batch norm after a concatenation or a pooling, before its relu in a pre-activation
    network; ``affine_channel``) becomes a multiplication and an addition along its channel
    axis (the ops declared ``MULTIPLICATION`` and ``ADDITION``), which the code generator
    fuses with the elementwise ops around them.
``fold_constants``
    Ops of the global block whose inputs are all constants (persistables with values in
    ``params`` that no op writes, or results of ops folded before them), and that have no side
    effect, no randomness, no control flow, no LoD, run once here with their NumPy references;
    the results that other ops still read become persistable variables with values in
    ``params``. An op without inputs (``fill_constant``) is folded only into the ops that read
    it: when one of its readers stays, so does it (a constant built at run time costs less than
    one stored in the model).

``fuse_attention``
    Attention's core (a product, an optional mask add, a softmax over the last axis, a
    product) as one op, the transposes of the heads' layout around it taken into it
    (:mod:`pdjit.passes.attention`; only with a ``target`` that runs it as one kernel).
``channels_last``
    Chains of convolutions that the target runs faster on channels-last (NHWC) images
    switched to them, converted once at each chain's ends (:mod:`pdjit.passes.layout`; only
    with a ``target``: the Predictor's and the ahead-of-time compiler's).

After ``fold_batch_norm``, ``affine_elementwise`` and ``fold_constants``, parameters no op
reads any more are dropped from ``params`` and from the program (:func:`prune_unused_params`).

The names that must survive a pass: persistables, what feed and fetch ops read and write, what
control-flow ops (and ops the registry does not know) read and write, names used in more than
one block, and, in a program without fetch ops, every variable that no op reads (it may be a
result), an op's intermediate outputs aside. The passes read op definitions
(``OpDef.inference``, traits, attributes, references) and never name an op type.
"""
from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Callable

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import PdjitError
from pdjit.framework.program import Block, Program
from pdjit.framework.registry import (
    EMPTY_VAR_NAME,
    ChannelAffine,
    ChannelLinear,
    Passthrough,
    Rewrite,
)
from pdjit.passes import dump_after
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType
_CARRIED_ATTRS = ("op_role", "op_namescope", "op_callstack", "op_device")
_NOT_CONSTANT = (registry.SIDE_EFFECT, registry.RANDOM, registry.CONTROL_FLOW,
                 registry.FEED_FETCH, registry.SEQUENCE)

__all__ = ["INFERENCE_PASSES", "optimize", "test_mode", "remove_noops", "fold_batch_norm",
           "affine_elementwise", "fold_constants", "prune_unused_params"]


# ---- who reads and writes what ----------------------------------------------------------------
def _owns_blocks(op) -> bool:
    return bool(op.sub_block_indices())


class _Uses:
    """Every op's reads and writes of every name, in every block, and the names that must
    keep their name and their value (``pinned``). Built again after each rewrite, or brought
    up to date with :meth:`update` after a rewrite of one block."""

    def __init__(self, program: Program):
        self.readers: dict = defaultdict(list)  # name -> [(block idx, op index)], in order
        self.writers: dict = defaultdict(list)
        self.blocks: dict = defaultdict(set)
        self.pinned: set = set()
        self.intermediate: set = set()
        self.has_results = False
        for b in program.blocks:
            self.pinned.update(n for n, v in b.vars.items() if v.persistable)
            for i, op in enumerate(b.ops):
                self._add_op(b, i, op)
        if not self.has_results:  # no fetch op says what the results are: any unread value
            self.pinned.update(n for n in self.writers  # may be one
                               if not self.readers.get(n) and n not in self.intermediate)

    def _add_op(self, b: Block, i: int, op) -> tuple:
        """Record ``op`` (index ``i`` of block ``b``); its (inputs, outputs)."""
        opdef = registry.lookup(op.type)
        ins = [n for n in op.input_arg_names if n != EMPTY_VAR_NAME]
        outs = [n for n in op.output_arg_names if n != EMPTY_VAR_NAME]
        for n in ins:
            self.readers[n].append((b.idx, i))
            self.blocks[n].add(b.idx)
        for n in outs:
            self.writers[n].append((b.idx, i))
            self.blocks[n].add(b.idx)
        if opdef is None or opdef.has(registry.CONTROL_FLOW) or \
                opdef.has(registry.FEED_FETCH) or _owns_blocks(op):
            self.pinned.update(ins)
            self.pinned.update(outs)
        if opdef is not None:
            if opdef.has(registry.FEED_FETCH) and any(
                    (v := b._find_var_recursive(n)) is not None
                    and v.type == VarType.FETCH_LIST for n in outs):
                self.has_results = True
            for slot in opdef.outputs:
                if slot.intermediate:
                    self.intermediate.update(op.output(slot.name))
        return ins, outs

    def update(self, program: Program, b: Block, before: list, changed=()) -> None:
        """What building the table again would give after a rewrite of block ``b`` alone,
        whose ops were ``before`` (the list, in order) and are now ``b.ops``: ops of
        ``before`` no longer there are gone, ops new in ``b.ops`` added, and the ops in
        ``changed`` (still there) read and write other names now. Costs a pass over the
        table's names, not over every op of the program."""
        now = {id(op): k for k, op in enumerate(b.ops)}
        redo = {id(op) for op in changed}
        where = [None if id(op) in redo else now.get(id(op)) for op in before]
        # the ops before the first one that moved or went keep their entries, and so do
        # those after the last one when as many ops went as came
        lo = next((k for k, w in enumerate(where) if w != k), len(where))
        hi = next((k for k in range(len(where) - 1, -1, -1) if where[k] != k), -1)
        same_tail = len(b.ops) == len(before)
        touched, bi0 = set(), b.idx
        for table in (self.readers, self.writers):
            for n, entries in table.items():
                # entries are in order: those of block ``bi0`` together
                if not entries or (entries[-1][0] == bi0 and entries[-1][1] < lo) or \
                        (same_tail and entries[0][0] == bi0 and entries[0][1] > hi) or \
                        all(bi != bi0 or j < lo or (same_tail and j > hi)
                            for bi, j in entries):
                    continue
                table[n] = [(bi, j if bi != bi0 else where[j]) for bi, j in entries
                            if bi != bi0 or where[j] is not None]
                if len(table[n]) != len(entries):
                    touched.add(n)
        kept = {id(op) for op, k in zip(before, where) if k is not None}
        for k, op in enumerate(b.ops):
            if id(op) in kept:
                continue
            ins, outs = self._add_op(b, k, op)
            touched.update(ins)
            touched.update(outs)
        for n in touched:
            for table in (self.readers, self.writers):
                if n in table:
                    table[n].sort()
            self.blocks[n] = {bi for bi, _ in self.readers.get(n, ())} | \
                {bi for bi, _ in self.writers.get(n, ())}
            if any((v := blk.vars.get(n)) is not None and v.persistable
                   for blk in program.blocks):
                self.pinned.add(n)
            elif not self.has_results and self.writers.get(n) and not self.readers.get(n) \
                    and n not in self.intermediate:
                self.pinned.add(n)

    def local(self, name: str, block_idx: int) -> bool:
        """Only ops of block ``block_idx`` read or write ``name``."""
        return self.blocks.get(name, set()) <= {block_idx}

    def dead(self, name: str) -> bool:
        """Nothing reads ``name`` and it need not survive."""
        return name == EMPTY_VAR_NAME or (not self.readers.get(name) and name not in self.pinned)

    def mentioned(self, name: str) -> bool:
        return bool(self.blocks.get(name))


def _single(names) -> str | None:
    names = [n for n in names if n != EMPTY_VAR_NAME]
    return names[0] if len(names) == 1 else None


def _ancestors(block: Block) -> set:
    out, b = set(), block.parent_block
    while b is not None:
        out.add(b.idx)
        b = b.parent_block
    return out


def _drop_vars(program: Program, names, params: dict | None = None) -> None:
    """Forget the variables ``names`` (which no op mentions any more)."""
    for n in names:
        for b in program.blocks:
            if n in b.vars:
                b._remove_var(n)
        if params is not None:
            params.pop(n, None)


def _mentioned_names(program: Program) -> set:
    return {n for b in program.blocks for op in b.ops
            for n in op.input_arg_names + op.output_arg_names}


def _carried(op) -> dict:
    return {k: v for k, v in op.all_attrs().items() if k in _CARRIED_ATTRS}


def _insert_like(block: Block, index: int, like, type_: str, inputs, outputs, attrs):
    """Insert an op that stands for ``like``: its role, name scope, device and creation stack."""
    new = block._insert_op(index, type_, inputs, outputs, {**attrs, **_carried(like)})
    if not like.has_attr("op_callstack"):  # as saved models have it: no stack of ours
        new._remove_attr("op_callstack")
    return new


def _new_name(taken: set, base: str) -> str:
    """``base``, or ``base_<k>`` with the first ``k`` not in ``taken``; added to ``taken``."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _check_args(fn: str, program, params) -> None:
    if not isinstance(program, Program):
        raise TypeError(f"{fn}: program must be a pdjit Program, got {type(program).__name__}")
    if not isinstance(params, dict):
        raise TypeError(f"{fn}: params must be a dict of name -> np.ndarray, got "
                        f"{type(params).__name__}")


def _finish(name: str, program: Program, params: dict):
    for b in program.blocks:  # each variable's producing op, as the rewrites left them
        for op in b.ops:
            for n in op.output_arg_names:
                v = b._find_var_recursive(n)
                if v is not None:
                    v.op = op
    program._bump()
    dump_after(name, lambda: str(program))
    return program, params


# ---- test_mode --------------------------------------------------------------------------------
def test_mode(program: Program, params: dict):
    """Each op's test-mode attribute (its ``test_mode`` declaration; ``is_test`` for an op that
    declares none but carries it) set true, in every block."""
    _check_args("test_mode", program, params)
    prog = program.clone()
    for b in prog.blocks:
        for op in b.ops:
            opdef = registry.lookup(op.type)
            attr = registry.test_mode_of(op.type)
            declared = opdef is not None and opdef.test_mode is not None
            if (declared or op.has_attr(attr)) and op.all_attrs().get(attr) is not True:
                op._set_attr(attr, True)
    prog._is_test = True
    return _finish("test_mode", prog, dict(params))


test_mode.__test__ = False  # a pass, not a test (pytest collects ``test_*`` names it imports)


# ---- remove_noops -----------------------------------------------------------------------------
def remove_noops(program: Program, params: dict):
    """Remove the ops that pass a value through at inference; replace those that become
    another op (see the module's documentation)."""
    _check_args("remove_noops", program, params)
    prog = program.clone()
    while _remove_one_noop(prog):
        pass
    return _finish("remove_noops", prog, dict(params))


def _remove_one_noop(prog: Program) -> bool:
    uses = _Uses(prog)
    for b in prog.blocks:
        for i, op in enumerate(b.ops):
            spec = registry.inference_of(op)
            if isinstance(spec, Passthrough) and _drop_passthrough(prog, b, i, op, spec, uses):
                return True
            if isinstance(spec, Rewrite) and _rewrite(prog, b, i, op, spec, uses):
                return True
    return False


def _dead_outputs(op, keep: set, uses: _Uses) -> list | None:
    """The names ``op`` writes besides ``keep``, when nothing needs them (else ``None``)."""
    others = [n for n in op.output_arg_names if n not in keep and n != EMPTY_VAR_NAME]
    if not all(uses.dead(n) for n in others):
        return None
    return [n for n in others if len(uses.writers[n]) == 1]


def _drop_passthrough(prog, b, i, op, spec: Passthrough, uses: _Uses) -> bool:
    x, o = _single(op.input(spec.x)), _single(op.output(spec.out))
    if x is None or o is None:
        return False
    dead = _dead_outputs(op, {o}, uses)
    if dead is None:
        return False
    if x == o:  # in place: the value is already there
        b._remove_op(i)
        _drop_vars(prog, dead)
        return True
    # x keeps its value wherever o is read: written before the op, once, here or in an
    # ancestor block (or never: fed, or a parameter)
    xw = uses.writers[x]
    x_stable = not xw or (len(xw) == 1 and (
        (xw[0][0] == b.idx and xw[0][1] < i) or xw[0][0] in _ancestors(b)))
    o_after = all(bi == b.idx and j > i for bi, j in uses.readers[o])
    o_once = uses.writers[o] == [(b.idx, i)]
    if x_stable and o_once and o_after and o not in uses.pinned and uses.local(o, b.idx):
        b._remove_op(i)
        for op2 in b.ops[i:]:
            op2._rename_input(o, x)
        _drop_vars(prog, dead + [o])
        return True
    # o must keep its name: the op that wrote x writes o instead
    if (len(xw) == 1 and xw[0][0] == b.idx and xw[0][1] < i and x not in uses.pinned
            and uses.local(x, b.idx) and o_once and o_after and uses.local(o, b.idx)
            and all(j > xw[0][1] for _, j in uses.readers[x])):
        b._remove_op(i)
        for op2 in b.ops[xw[0][1]:]:
            op2._rename_input(x, o)
            op2._rename_output(x, o)
        _drop_vars(prog, dead + [x])
        return True
    return False


def _rewrite(prog, b, i, op, spec: Rewrite, uses: _Uses) -> bool:
    if spec.type == op.type:
        return False  # a rewrite into itself would never end
    kept = {n for names in spec.outputs.values() for n in names}
    dead = _dead_outputs(op, kept, uses)
    if dead is None:
        return False
    _insert_like(b, i, op, spec.type, spec.inputs, spec.outputs, spec.attrs)
    b._remove_op(i + 1)
    _drop_vars(prog, dead)
    return True


# ---- fold_batch_norm --------------------------------------------------------------------------
def fold_batch_norm(program: Program, params: dict, overwrite: bool = False):
    """Fold per-channel affine chains (batch norm with running statistics, bias adds) into
    the weight of the convolution or product before them (see the module's documentation).
    ``overwrite``: the caller hands the arrays of ``params`` over (nothing else holds them: a
    model just loaded), and a weight that only the folded op reads is scaled in its own
    memory (no new array: a ResNet-50's 100 MB of weights not written twice)."""
    _check_args("fold_batch_norm", program, params)
    prog, params = program.clone(), dict(params)
    at, uses = (0, 0), _Uses(prog)  # brought up to date by each fold
    taken = {n for b in prog.blocks for n in b.vars} | set(params)
    while at is not None:
        at = _fold_one_chain(prog, params, at, uses, taken, overwrite)
    _prune_params(prog, params)
    return _finish("fold_batch_norm", prog, params)


def _fold_one_chain(prog: Program, params: dict, start, uses: _Uses, taken: set,
                    overwrite: bool = False):
    """Fold the first chain from op ``start`` (block index, op index) on; where it was (the
    next search starts there: a fold rewrites its op and the chain after it, never an op
    before it, whose chains end before the product it folded into), or None. ``uses``
    describes ``prog`` and is kept up to date; ``taken``: the names in use, new ones added."""
    for b in prog.blocks:
        if b.idx < start[0]:
            continue
        for i, op in enumerate(b.ops):
            if b.idx == start[0] and i < start[1]:
                continue
            spec = registry.inference_of(op)
            if isinstance(spec, ChannelLinear) and \
                    _fold_chain(prog, b, i, op, spec, uses, params, taken, overwrite):
                return (b.idx, i)
    return None


def _rank(block: Block, name: str) -> int | None:
    v = block._find_var_recursive(name)
    return len(v.shape) if v is not None and v.type == VarType.LOD_TENSOR else None


def _constant(prog_block: Block, name: str, uses: _Uses, params: dict,
              writers_ok: Callable = lambda w: False) -> bool:
    """``name`` is a persistable with a value in ``params`` that no op changes."""
    v = prog_block._find_var_recursive(name)
    return (v is not None and v.persistable and isinstance(params.get(name), np.ndarray)
            and all(writers_ok(w) for w in uses.writers.get(name, ())))


def _affine_step(b: Block, j: int, op, spec: ChannelAffine, uses: _Uses, params: dict):
    """``(a, b)`` of the affine op ``op`` (index ``j``), when its coefficients are constants
    and its other outputs are not needed; else ``None``."""
    values = {}
    for slot in spec.params:
        names = [n for n in op.input(slot) if n != EMPTY_VAR_NAME]
        if not names:
            values[slot] = None
            continue
        if len(names) != 1:
            return None
        n = names[0]
        in_place = any(src == slot and op.output(s) == [n] for s, src in spec.passes.items())
        if not _constant(b, n, uses, params, lambda w, ok=in_place: ok and w == (b.idx, j)):
            return None
        values[slot] = np.asarray(params[n], np.float64)
    for slot, names in op.outputs.items():
        if slot == spec.out:
            continue
        for n in names:
            passes = slot in spec.passes and op.input(spec.passes[slot]) == [n]
            if not passes and not uses.dead(n):
                return None
    return spec.coefficients(values)


def _fold_chain(prog, b: Block, i: int, op, spec: ChannelLinear, uses: _Uses,
                params: dict, taken: set, overwrite: bool = False) -> bool:
    w, t0 = _single(op.input(spec.weight)), _single(op.output(spec.out))
    if w is None or t0 is None or not _constant(b, w, uses, params):
        return False
    wv = params[w]
    rank = _rank(b, t0)
    if wv.dtype.kind != "f" or rank is None or not -rank <= spec.axis < rank:
        return False
    axis = spec.axis % rank
    chain, cur, last = [], t0, i  # chain: [(index, op, (a, b))]
    while True:
        rd = uses.readers.get(cur, [])
        if cur in uses.pinned or not uses.local(cur, b.idx) or len(rd) != 1 or \
                len(uses.writers[cur]) != 1 or rd[0][1] <= last:
            break
        j = rd[0][1]
        nxt = b.ops[j]
        aff = registry.inference_of(nxt)
        if not isinstance(aff, ChannelAffine) or _single(nxt.input(aff.x)) != cur:
            break
        out = _single(nxt.output(aff.out))
        if out is None or len(uses.writers[out]) != 1 or _rank(b, out) != rank or \
                not -rank <= aff.axis < rank or aff.axis % rank != axis:
            break
        coef = _affine_step(b, j, nxt, aff, uses, params)
        if coef is None:
            break
        chain.append((j, nxt, coef))
        cur, last = out, j
    if not any(a is not None for _, _, (a, _) in chain):
        return False  # nothing scales: a bias add stays as it is
    # y = ((x * a1 + b1) * a2 + b2)...: one scale and one bias per channel
    sizes = {np.size(v) for _, _, coef in chain for v in coef if v is not None}
    sizes.discard(1)
    c = prog_c = b._find_var_recursive(t0).shape[axis]
    if len(sizes) > 1 or (sizes and prog_c > 0 and sizes != {prog_c}):
        return False
    c = sizes.pop() if sizes else (prog_c if prog_c > 0 else None)
    if c is None:
        return False
    scale, bias = np.ones(c), np.zeros(c)
    for _, _, (a_k, b_k) in chain:
        if a_k is not None:
            a_k = np.broadcast_to(np.asarray(a_k, np.float64).reshape(-1), (c,))
            scale, bias = scale * a_k, bias * a_k
        if b_k is not None:
            bias = bias + np.broadcast_to(np.asarray(b_k, np.float64).reshape(-1), (c,))
    # (the products in float64, rounded once to the weight's dtype: ``scale_weight``), in
    # the weight's own memory where the caller allows it and nothing else reads the weight
    own = overwrite and uses.readers.get(w) == [(b.idx, i)] and not uses.writers.get(w) and \
        isinstance(wv, np.ndarray) and wv.flags.c_contiguous and wv.flags.writeable
    new_w = spec.scale_weight(wv, scale, wv) if own else spec.scale_weight(np.asarray(wv), scale)
    if new_w is None or new_w.shape != wv.shape:
        return False
    # the rewrite: the op reads a new weight; one bias add writes the chain's result
    final, gb, before = cur, prog.global_block(), list(b.ops)
    w_name = _new_name(taken, f"{w}.folded")
    params[w_name] = np.ascontiguousarray(new_w, dtype=wv.dtype)
    wvar = gb.create_var(name=w_name, shape=wv.shape, dtype=wv.dtype, persistable=True,
                         stop_gradient=True)
    wvar.is_parameter = b._find_var_recursive(w).is_parameter
    b_name = _new_name(taken, f"{w}.folded_bias")
    params[b_name] = bias.astype(wv.dtype)
    gb.create_var(name=b_name, shape=(c,), dtype=wv.dtype, persistable=True, stop_gradient=True)
    op._set_slot("input", spec.weight, [w_name])
    gone = {n for _, o, _ in chain for n in o.input_arg_names + o.output_arg_names}
    for j, _, _ in reversed(chain):
        b._remove_op(j)
    add = _elementwise(registry.ADDITION)
    _insert_like(b, i + 1, chain[-1][1], add.type,
                 {add.inputs[0].name: [t0], add.inputs[1].name: [b_name]},
                 {add.outputs[0].name: [final]}, {"axis": -1 if axis == rank - 1 else axis})
    uses.update(prog, b, before, changed=[op])
    _drop_vars(prog, [n for n in gone if not uses.mentioned(n) and n not in params])
    return True


# ---- affine_elementwise -----------------------------------------------------------------------
def affine_elementwise(program: Program, params: dict):
    """Each op that runs apart from its neighbours (declared ``OPAQUE``) but is a per-channel
    affine with constant coefficients at inference (a batch norm with running statistics
    that folded into nothing: after a concatenation or a pooling, before its relu in a
    pre-activation network) becomes ``X * a + b`` by the ops declared ``MULTIPLICATION``
    and ``ADDITION`` with broadcast, which compile together with the elementwise ops around
    them. ``a`` and ``b`` are new parameters in X's dtype (computed in float64, rounded once);
    a factor of ones or a shift of zeros is left out."""
    _check_args("affine_elementwise", program, params)
    prog, params = program.clone(), dict(params)
    uses = _Uses(prog)
    taken = {n for b in prog.blocks for n in b.vars} | set(params)
    for b in prog.blocks:
        i = 0
        while i < len(b.ops):
            i += _affine_ops(prog, b, i, uses, params, taken)
    _prune_params(prog, params)
    return _finish("affine_elementwise", prog, params)


def _affine_ops(prog: Program, b: Block, i: int, uses: _Uses, params: dict, taken: set) -> int:
    """Rewrite op ``i`` of ``b`` when it is such an affine; how many ops now stand there."""
    op = b.ops[i]
    spec, opdef = registry.inference_of(op), registry.lookup(op.type)
    if not isinstance(spec, ChannelAffine) or not opdef.has(registry.OPAQUE):
        return 1
    x, out = _single(op.input(spec.x)), _single(op.output(spec.out))
    xv = b._find_var_recursive(x) if x is not None else None
    rank = _rank(b, x) if x is not None else None
    if out is None or rank is None or not -rank <= spec.axis < rank or \
            np.dtype(xv.dtype).kind != "f":
        return 1
    coef = _affine_step(b, i, op, spec, uses, params)
    c = xv.shape[spec.axis % rank]
    if coef is None or c <= 0:
        return 1
    vectors = []
    for v, skip in zip(coef, (1.0, 0.0)):
        if v is not None:
            v = np.asarray(v, np.float64).reshape(-1)
            if v.size not in (1, c):
                return 1
            v = np.broadcast_to(v, (c,)).astype(xv.dtype)
        vectors.append(None if v is None or np.all(v == skip) else v)
    steps = [(d, v, what) for d, v, what in zip(
        (_elementwise(registry.MULTIPLICATION), _elementwise(registry.ADDITION)), vectors,
        ("scale", "shift")) if v is not None]
    if not steps:
        return 1  # x itself: ``remove_noops`` is where such an op would go
    axis = -1 if spec.axis % rank == rank - 1 else spec.axis % rank
    before, gone = list(b.ops), set(op.input_arg_names + op.output_arg_names)
    cur = x
    for k, (d, v, what) in enumerate(steps):
        p_name = _new_name(taken, f"{out}.{what}")
        params[p_name] = v
        prog.global_block().create_var(name=p_name, shape=(c,), dtype=xv.dtype,
                                       persistable=True, stop_gradient=True)
        dst = out
        if k < len(steps) - 1:
            dst = _new_name(taken, f"{out}.scaled")
            b.create_var(name=dst, shape=xv.shape, dtype=xv.dtype, lod_level=xv.lod_level)
        _insert_like(b, i + k, op, d.type, {d.inputs[0].name: [cur], d.inputs[1].name: [p_name]},
                     {d.outputs[0].name: [dst]}, {"axis": axis})
        cur = dst
    b._remove_op(i + len(steps))
    uses.update(prog, b, before)
    _drop_vars(prog, [n for n in gone if not uses.mentioned(n) and n not in params])
    return len(steps)


def _elementwise(trait: str):
    """The op declared ``trait`` (``Out = X op Y``, its first two inputs and its output) with
    Fluid's ``axis`` broadcast (``BROADCAST``)."""
    found = registry.having(trait, registry.BROADCAST)
    if not found:
        raise PdjitError(f"inference passes: no op is declared {trait} with BROADCAST")
    return found[0]


# ---- fold_constants ---------------------------------------------------------------------------
def _takes_ctx(opdef) -> bool:
    return "ctx" in inspect.signature(opdef.reference).parameters


def fold_constants(program: Program, params: dict):
    """Run the global block's ops on constants once, here (see the module's documentation)."""
    _check_args("fold_constants", program, params)
    prog, params = program.clone(), dict(params)
    gb, uses = prog.global_block(), _Uses(prog)
    known: dict = {}   # name -> value computed here
    folded: list = []  # (op index, op, is a pure creator)
    for i, op in enumerate(gb.ops):
        opdef = registry.lookup(op.type)
        if opdef is None or any(opdef.has(t) for t in _NOT_CONSTANT) or _owns_blocks(op) or \
                _takes_ctx(opdef):
            continue
        ins = [n for n in op.input_arg_names if n != EMPTY_VAR_NAME]
        outs = [n for n in op.output_arg_names if n != EMPTY_VAR_NAME]
        if not outs or any(n in ins or len(uses.writers[n]) != 1 for n in outs):
            continue
        if any((v := gb._find_var_recursive(n)) is None or v.type != VarType.LOD_TENSOR
               for n in outs):
            continue
        if not all(n in known or _constant(gb, n, uses, params) for n in ins):
            continue
        values = _evaluate(op, opdef, lambda n: known[n] if n in known else params[n])
        if values is None:
            continue
        known.update(values)
        folded.append((i, op, not ins))
    # what stays reads some of the folded values: those become parameters (or, made by an op
    # without inputs, keep their op)
    gone = {i for i, _, _ in folded}
    needed = set(uses.pinned)
    for b in prog.blocks:
        for k, op in enumerate(b.ops):
            if b.idx != 0 or k not in gone:
                needed.update(op.input_arg_names)
    keep = set()
    for i, op, creator in folded:
        if creator and any(n in needed for n in op.output_arg_names):
            keep.add(i)
    for i, op, _ in folded:
        if i in keep:
            continue
        for n in op.output_arg_names:
            if n in needed and n in known:
                v = gb._find_var_recursive(n)
                v.persistable, v.stop_gradient = True, True
                v.shape, v.dtype = known[n].shape, known[n].dtype
                params[n] = np.array(known[n])  # its own array, never a view of another
    for i in sorted(gone - keep, reverse=True):
        gb._remove_op(i)
    still = _mentioned_names(prog)
    _drop_vars(prog, [n for i, op, _ in folded if i not in keep
                      for n in op.output_arg_names if n not in still])
    _prune_params(prog, params)
    return _finish("fold_constants", prog, params)


def _evaluate(op, opdef, value_of) -> dict | None:
    """``{output name: value}`` of ``op`` run with its NumPy reference, or ``None`` when the
    reference refuses these values or gives something other than arrays."""
    inputs = {}
    for slot in opdef.inputs:
        vals = [value_of(n) for n in op.input(slot.name) if n != EMPTY_VAR_NAME]
        inputs[slot.name] = vals if slot.duplicable else (vals[0] if vals else None)
    attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
    try:
        with np.errstate(all="ignore"):
            result = opdef.call_reference(inputs, attrs)
    except (PdjitError, ValueError, IndexError, KeyError, TypeError, ArithmeticError):
        return None  # left for run time, where the error names the op
    out = {}
    for slot in opdef.outputs:
        names = op.output(slot.name)
        if not any(n != EMPTY_VAR_NAME for n in names):
            continue
        if slot.name not in result:
            return None
        vals = result[slot.name]
        vals = list(vals) if slot.duplicable else [vals]
        if len(vals) != len(names):
            return None
        for n, v in zip(names, vals):
            if n == EMPTY_VAR_NAME:
                continue
            if not isinstance(v, np.ndarray):
                return None
            out[n] = v
    return out


# ---- unused parameters ------------------------------------------------------------------------
def _prune_params(prog: Program, params: dict) -> None:
    used = _mentioned_names(prog)
    _drop_vars(prog, [n for n in list(params) if n not in used], params)


def prune_unused_params(program: Program, params: dict):
    """Drop the parameters no op of any block reads or writes, from ``params`` and from the
    program's variables."""
    _check_args("prune_unused_params", program, params)
    prog, params = program.clone(), dict(params)
    _prune_params(prog, params)
    prog._bump()
    return prog, params


# ---- the pipeline -----------------------------------------------------------------------------
# (the layout pass uses this module's helpers: imported once they are defined)
from pdjit.passes.attention import fuse_attention  # noqa: E402
from pdjit.passes.layout import channels_last  # noqa: E402

INFERENCE_PASSES = [
    ("test_mode", test_mode),
    ("remove_noops", remove_noops),
    ("fold_batch_norm", fold_batch_norm),
    ("affine_elementwise", affine_elementwise),
    ("fold_constants", fold_constants),
    ("fuse_attention", fuse_attention),
    ("channels_last", channels_last),
]


def optimize(program: Program, params: dict, passes=None, overwrite: bool = False,
             target=None):
    """Apply the inference passes (all, or those named in ``passes``) in pipeline order;
    returns ``(program, params)``, new ones, the given ones unchanged (with ``overwrite``,
    the given arrays may be reused for results: the caller hands them over, see
    :func:`fold_batch_norm`). ``target``: the target the program will run on, for the
    passes that ask it (``fuse_attention``, ``channels_last``; None: they change nothing)."""
    _check_args("optimize", program, params)
    known = [n for n, _ in INFERENCE_PASSES]
    if passes is not None:
        if isinstance(passes, str):
            passes = [p.strip() for p in passes.split(",") if p.strip()]
        unknown = [p for p in passes if p not in known]
        if unknown:
            raise ValueError(f"optimize: unknown inference pass(es) {unknown}: expected names "
                             f"from {known}")
    wanted = set(known if passes is None else passes)
    for name, fn in INFERENCE_PASSES:
        if name in wanted:
            kw = {}
            taken = inspect.signature(fn).parameters
            if overwrite and "overwrite" in taken:
                kw["overwrite"] = True
            if "target" in taken:
                kw["target"] = target
            program, params = fn(program, params, **kw)
    if not wanted:
        program, params = program.clone(), dict(params)
    return program, params
