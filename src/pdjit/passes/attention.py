"""The inference pass ``fuse_attention``: attention's core as one op where the target runs it as
one kernel (``target.fuses_attention(dtype)``; without a target that says so, the pass changes
nothing).

In the global block, a softmax over the last axis (an op whose ``form`` is a
:class:`~pdjit.framework.registry.RowSoftmax`) whose input is a product ``P1 = alpha * Q @
op(Y)`` (a :class:`~pdjit.framework.registry.Product`, Q not transposed), or such a product
plus a mask (an op declared ``ADDITION`` and ``BROADCAST`` whose other operand broadcasts to
the scores by NumPy's rule), and whose output is the left operand of a product ``P2 = P @
op(V)`` (not transposed, ``alpha`` 1), becomes one ``scaled_dot_product_attention`` op (the
op declaring ``ATTENTION``, its slots and attributes named by its ``form``:
:mod:`pdjit.ops.attention`). Q, K and V have one rank (3 or more) and the same batch dims,
the same float dtype. A permutation of axes (:class:`~pdjit.framework.registry.Permute`) that
makes Q, K or V from another value, and one that P2's result goes through, go into the op's
``*_perm`` attributes when nothing else reads their values, and so does a product of Q or K
by a constant (:class:`~pdjit.framework.registry.Scale`: ``paddle.nn``'s ``q * head_dim **
-0.5``) into ``alpha`` (the scores rounded once fewer): the heads are read in the
projections' layout and the result written in the layout its next product reads, with no
copy. Each value the op takes over (the scores,
the softmax, the permuted operands) must be read by the next op alone, written once and not
needed after (fetched, persistable, read by another block). The pass reads op definitions
and names no op type nor slot.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import registry
from pdjit.framework.program import Program
from pdjit.framework.registry import Permute, Product, RowSoftmax, Scale
from pdjit.passes.inference import (
    _check_args,
    _drop_vars,
    _finish,
    _insert_like,
    _mentioned_names,
    _single,
    _Uses,
)

__all__ = ["fuse_attention"]


def fuse_attention(program: Program, params: dict, target=None):
    """The pass (see the module); ``target`` answers ``fuses_attention(dtype) -> bool`` (None
    or a target without it: the program unchanged)."""
    _check_args("fuse_attention", program, params)
    prog = program.clone()
    params = dict(params)
    ask = getattr(target, "fuses_attention", None)
    built = registry.having(registry.ATTENTION)
    if ask is not None and built:
        _rewrite(prog, ask, built[0])
    return _finish("fuse_attention", prog, params)


def _form(op):
    d = registry.lookup(op.type)
    return d.form(op) if d is not None and d.form is not None and not op.sub_block_indices() \
        else None


class _Block:
    """The global block's ops by the values they write, with who reads what."""

    def __init__(self, prog: Program):
        self.block = prog.global_block()
        self.uses = _Uses(prog)

    def var(self, name):
        return self.block._find_var_recursive(name)

    def writer(self, name):
        """The op of this block that alone writes ``name`` (else None)."""
        w = self.uses.writers.get(name, ())
        return self.block.ops[w[0][1]] if len(w) == 1 and w[0][0] == self.block.idx else None

    def only_for(self, name, reader) -> bool:
        """``name`` is written once, read by ``reader`` alone and not needed after it."""
        r = self.uses.readers.get(name, ())
        return len(r) == 1 and self.block.ops[r[0][1]] is reader and \
            name not in self.uses.pinned and self.uses.local(name, self.block.idx) and \
            len(self.uses.writers.get(name, ())) == 1

    def others_dead(self, op, kept) -> bool:
        """The outputs of ``op`` other than ``kept`` are not needed."""
        return all(self.uses.dead(n) for n in op.output_arg_names if n != kept)


def _one(op, slot):
    return _single(op.input(slot))


def _out(op, slot):
    return _single(op.output(slot))


def _source(g: _Block, name, reader, rank, scales: bool = False):
    """``(value, perm, factor, ops)``: the value ``name`` is made from by ops that only
    ``reader`` needs (to remove): products by a constant (where ``scales``: their ``factor``
    multiplies the scores) down to a permutation of axes (``perm``), or ``name`` itself."""
    factor, ops = 1.0, []
    while True:
        op = g.writer(name)
        f = _form(op) if op is not None else None
        if f is None or not g.only_for(name, reader) or not g.others_dead(op, name) or \
                _out(op, f.out) != name or _one(op, f.x) is None or g.var(_one(op, f.x)) is None:
            break
        if isinstance(f, Scale) and scales:
            factor *= float(np.dtype(g.var(name).dtype).type(f.factor))
        elif isinstance(f, Permute) and len(f.perm) == rank:
            return _one(op, f.x), [int(a) % rank for a in f.perm], factor, ops + [op]
        else:
            break
        name, reader = _one(op, f.x), op
        ops.append(op)
    return name, list(range(rank)), factor, ops


def _broadcasts(mask_shape, scores_shape) -> bool:
    if len(mask_shape) > len(scores_shape):
        return False
    return all(a == 1 or a == b for a, b in zip(mask_shape[::-1], scores_shape[::-1]))


def _match(g: _Block, sm, ask):
    """The rewrite around softmax op ``sm``: ``(P2, (q, k, v, mask, out), (alpha, q_perm,
    k_perm, v_perm, out_perm), ops to remove)``, or None. The new op takes P2's place: what it
    reads is written once (or never: a feed, a parameter), so it holds there what the ops it
    replaces read."""
    f = _form(sm)
    if not isinstance(f, RowSoftmax):
        return None
    x, p = _one(sm, f.x), _out(sm, f.out)
    if x is None or p is None or not g.others_dead(sm, p) or g.var(x) is None or \
            f.axis % max(1, len(g.var(x).shape)) != len(g.var(x).shape) - 1:
        return None
    # P2: the only reader of the softmax, taking it as its left operand
    readers = g.uses.readers.get(p, ())
    if len(readers) != 1 or readers[0][0] != g.block.idx:
        return None
    p2 = g.block.ops[readers[0][1]]
    f2 = _form(p2)
    if not isinstance(f2, Product) or f2.trans_x or f2.alpha != 1.0 or _one(p2, f2.x) != p or \
            not g.only_for(p, p2):
        return None
    # the scores: P1, or P1 + mask
    s_op, mask = g.writer(x), None
    if s_op is None or not g.only_for(x, sm):
        return None
    fs = _form(s_op)
    if not isinstance(fs, Product):
        d = registry.lookup(s_op.type)  # (an ADDITION op: Out = X + Y, its first slots)
        if d is None or not (d.has(registry.ADDITION) and d.has(registry.BROADCAST)) or \
                len(d.inputs) != 2 or _out(s_op, d.outputs[0].name) != x or \
                not g.others_dead(s_op, x):
            return None
        a, b = _one(s_op, d.inputs[0].name), _one(s_op, d.inputs[1].name)
        axis = int(s_op.all_attrs().get("axis", -1))
        if a is None or b is None or a == b:
            return None
        p1 = g.writer(a)
        va, vb = g.var(a), g.var(b)
        if p1 is None or va is None or vb is None or not g.only_for(a, s_op) or \
                (axis != -1 and axis != len(va.shape) - len(vb.shape)) or \
                not _broadcasts(list(vb.shape), list(va.shape)) or \
                (vb.shape and vb.shape[-1] == 1 and va.shape[-1] != 1):
            return None  # (a mask's last dim is the keys': the kernel reads its rows whole)
        fs, s_op, mask, x = _form(p1), (s_op, p1), b, a
        if not isinstance(fs, Product):
            return None
    else:
        p1 = s_op
        s_op = (p1,)
    if fs.trans_x or _out(p1, fs.out) != x or not g.others_dead(p1, x):
        return None
    q, k, v = _one(p1, fs.x), _one(p1, fs.y), _one(p2, f2.y)
    if q is None or k is None or v is None:
        return None
    vq, vk, vv, vx = g.var(q), g.var(k), g.var(v), g.var(x)
    if any(t is None for t in (vq, vk, vv, vx)):
        return None
    r = len(vq.shape)
    if r < 3 or len(vk.shape) != r or len(vv.shape) != r or len(vx.shape) != r or \
            not vq.dtype == vk.dtype == vv.dtype == vx.dtype or \
            (mask is not None and g.var(mask).dtype != vq.dtype) or \
            vq.dtype is None or np.dtype(vq.dtype).kind != "f" or not ask(np.dtype(vq.dtype)):
        return None
    q, qp, qs, qops = _source(g, q, p1, r, scales=True)
    k, kp, ks, kops = _source(g, k, p1, r, scales=True)
    v, vp, _, vops = _source(g, v, p2, r)
    remove = [sm, p2, *s_op, *qops, *kops, *vops]
    if not fs.trans_y:  # K given as [..., D, Sk]: a key a column
        kp = kp[:-2] + [kp[-1], kp[-2]]
    if f2.trans_y:
        vp = vp[:-2] + [vp[-1], vp[-2]]
    shapes = [[g.var(n).shape[a] for a in pr] for n, pr in ((q, qp), (k, kp), (v, vp))]
    if any(len(s) != r for s in shapes) or not _same_batch(shapes) or \
            any(len(g.uses.writers.get(n, ())) > 1 for n in (q, k, v, mask) if n is not None):
        return None
    out = _out(p2, f2.out)
    if out is None or not g.others_dead(p2, out):
        return None
    op_perm, moved = list(range(r)), None
    outs_readers = g.uses.readers.get(out, ())
    if len(outs_readers) == 1 and outs_readers[0][0] == g.block.idx:
        t = g.block.ops[outs_readers[0][1]]
        ft = _form(t)
        if isinstance(ft, Permute) and len(ft.perm) == r and g.only_for(out, t) and \
                _one(t, ft.x) == out and _out(t, ft.out) is not None and \
                len(g.uses.writers.get(_out(t, ft.out), ())) == 1 and \
                g.others_dead(t, _out(t, ft.out)):
            op_perm = [int(a) % r for a in ft.perm]
            out = _out(t, ft.out)
            remove.append(t)
            moved = t
    # the new op reads q, k, v and the mask where P2 was and writes ``out`` there: nothing
    # between the op that read a value and P2 may write it (a cache updated after P1), nor
    # may anything between P2 and the taken-over permutation read or write ``out``
    ops = g.block.ops
    at = {id(op): i for i, op in enumerate(ops)}
    p2_at = at[id(p2)]
    read_at = [(q, at[id(qops[-1] if qops else p1)]), (k, at[id(kops[-1] if kops else p1)]),
               (v, at[id(vops[-1] if vops else p2)])]
    if mask is not None:
        read_at.append((mask, at[id(s_op[0])]))
    for name, i0 in read_at:
        if any(name in ops[i].output_arg_names for i in range(i0 + 1, p2_at)):
            return None
    if moved is not None:
        if any(out in ops[i].input_arg_names or out in ops[i].output_arg_names
               for i in range(p2_at + 1, at[id(moved)])):
            return None
    return p2, (q, k, v, mask, out), (fs.alpha * qs * ks, qp, kp, vp, op_perm), remove


def _same_batch(shapes) -> bool:
    q, k, v = shapes
    ok = lambda a, b: a == b or a < 0 and b < 0  # noqa: E731 - an unknown batch: the same one
    return all(ok(a, b) and ok(a, c) for a, b, c in zip(q[:-2], k[:-2], v[:-2])) and \
        (q[-1] == k[-1] or q[-1] < 0 and k[-1] < 0) and (k[-2] == v[-2] or k[-2] < 0 and v[-2] < 0)


def _rewrite(prog: Program, ask, built) -> None:
    core = built.form(None)  # the built op's slots and attributes
    g = _Block(prog)
    gone: set = set()  # the values the removed ops wrote
    changed = True
    while changed:
        changed = False
        for sm in list(g.block.ops):
            found = _match(g, sm, ask)
            if found is None:
                continue
            p2, (q, k, v, mask, out), (alpha, *perms), remove = found
            r = len(perms[0])
            attrs = {core.alpha: float(alpha)}
            for name, p in zip(core.perms, perms):
                attrs[name] = [] if p == list(range(r)) else p
            ins = {core.q: [q], core.k: [k], core.v: [v]}
            if mask is not None:
                ins[core.mask] = [mask]
            before = list(g.block.ops)
            at = g.block.ops.index(p2)
            _insert_like(g.block, at, p2, built.type, ins, {core.out: [out]}, attrs)
            for op in remove:
                gone.update(op.output_arg_names)
                g.block._remove_op(g.block.ops.index(op))
            g.uses.update(prog, g.block, before)
            changed = True
            break
    used = _mentioned_names(prog)
    _drop_vars(prog, [n for n in gone if n not in used and n not in g.uses.pinned])
