"""The inference pass ``channels_last``: chains of convolutions switched to channels-last (NHWC)
images where the target has kernels for them, the layout converted once at each chain's ends.

A target says which convolutions it runs faster on NHWC images (``target.channels_last(op)``,
asked of the op as the program has it; the CPU target: convolutions onto small planes whose
filter is a weight, see ``pdjit.codegen.cpu.lib.channels_last``). Without a target that asks,
the pass changes nothing. In the global block:

1. Each op that declares a :class:`~pdjit.framework.registry.Layout` and that the target asks
   for is *switched*: its layout attribute set to channels-last. One whose declaration says
   it follows (``follow``: a concat along the channels, reading images alone) is switched where
   an image it reads is made by an op of step 1 or 2: the chain runs on through it (a
   SqueezeNet fire module's join). In step 3 it counts as a conversion does: a concat of
   NHWC images copies them, where the parts of an NCHW one are written in place (a DenseNet
   block, a concat of each layer's output to the one before, stays NCHW). One whose
   declaration says it joins (``join``: a pool) is switched where the target asks for it and
   the image it reads is made by an op of step 1 or 2: the chain runs on through it (or ends
   in it, a global pool's one value per channel converted back); in step 3 it counts neither
   as switched nor as a conversion.
2. An op declared ``ELEMENTWISE`` that reads an image made by an op of step 1 or 2 (a bias
   add, an activation, a residual add, a squeeze-and-excitation scaling by a pooled
   [N, C, 1, 1] value) runs on NHWC images as it does on NCHW ones (its other images of its
   output's shape converted too), but for a per-channel operand of an op declared
   ``BROADCAST`` (Fluid's ``axis`` rule: a vector over the channels at ``axis`` 1 moves to
   ``axis`` 3; a one-element operand broadcasts anywhere). Any other operand keeps the op out.
3. The ops of steps 1-2, connected by the values they pass on, form chains. A chain is kept
   where it switches at least :data:`MIN_SWITCHED` ops and at least :data:`PER_CONVERSION`
   of them per conversion it needs (of a value of more than one pixel per channel: one of a
   single pixel is the same array in either layout) and per op that follows; the others go
   back as they were.
4. Each value a kept chain makes gets an NHWC variable of its own (``<name>.nhwc``), and so
   does a rank-4 constant a member broadcasts (a bias of shape [1, C, 1, 1]: a parameter of
   its own, the value permuted; the original stays for other readers); where the
   NCHW value is needed too (read by an op outside the chain, by another block, fetched,
   persistable), a ``transpose`` right after its op writes it under its own name. A value the
   chain reads from outside is transposed to NHWC once, before its first reader.

Every fetched value, saved variable and value read outside the chain keeps its name, layout
and value; the images inside a chain are new variables nothing outside reads.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import registry
from pdjit.framework.program import Program
from pdjit.framework.registry import EMPTY_VAR_NAME
from pdjit.passes.inference import _check_args, _finish, _insert_like, _new_name, _Uses

__all__ = ["channels_last", "MIN_SWITCHED", "PER_CONVERSION"]

#: the fewest switched ops a chain keeps, and the switched ops it needs per conversion
MIN_SWITCHED, PER_CONVERSION = 2, 2
_TO_LAST, _TO_FIRST = [0, 2, 3, 1], [0, 3, 1, 2]
_CHANNELS_AXIS = 3  # (of an NHWC image: a per-channel operand's ``axis`` there)


def _real(names) -> list:
    return [n for n in names if n != EMPTY_VAR_NAME]


def channels_last(program: Program, params: dict, target=None):
    """The pass (see the module); ``target`` answers ``channels_last(op) -> bool`` (None or
    a target without it: the program unchanged)."""
    _check_args("channels_last", program, params)
    prog = program.clone()
    params = dict(params)
    ask = getattr(target, "channels_last", None)
    if ask is not None:
        _rewrite(prog, params, ask)
    return _finish("channels_last", prog, params)


def _rank4(block, name) -> bool:
    v = block._find_var_recursive(name)
    return v is not None and len(v.shape) == 4


def _members(block, uses: _Uses, constant, ask) -> tuple:
    """``({op index: what}, {value: op index})``: the ops of steps 1-2 (``what``: "switch",
    "same", or the new ``axis`` of a broadcast operand) and the op that makes each of their
    NHWC values; ``constant(name)``: whether a value is a constant (:func:`_constants`)."""
    member, made = {}, {}
    for i, op in enumerate(block.ops):
        opdef = registry.lookup(op.type)
        if opdef is None or op.sub_block_indices():
            continue
        outs = _real(op.output_arg_names)
        if any(len(uses.writers.get(n, ())) != 1 for n in outs):
            continue
        if opdef.layout is not None:
            lay = opdef.layout
            images = [n for s in lay.inputs for n in _real(op.input(s))]
            if lay.is_last(op) or not images or not all(_rank4(block, n) for n in images):
                continue
            if lay.follow:  # (inside a chain only, reading images alone: see Layout)
                if not lay.is_first(op) or not any(n in made for n in images) or \
                        len(_real(op.input_arg_names)) != len(images) or \
                        not all(_rank4(block, n) for n in _real(op.output_arg_names)):
                    continue
                member[i] = "follow"
            elif len(images) != 1 or not ask(op):
                continue
            elif lay.join:  # (inside a chain only: see Layout)
                if not lay.is_first(op) or images[0] not in made:
                    continue
                member[i] = "join"
            else:
                member[i] = "switch"
        elif opdef.has(registry.ELEMENTWISE) and not opdef.has(registry.SIDE_EFFECT) and \
                not opdef.has(registry.RANDOM) and not opdef.has(registry.SEQUENCE):
            what = _elementwise(block, op, opdef, made, constant)
            if what is None:
                continue
            member[i] = what
        else:
            continue
        for n in outs:
            made[n] = i
    return member, made


def _constants(uses: _Uses, params: dict):
    """Whether a name is a constant: a persistable with a value that no op writes."""
    return lambda n: n in params and not uses.writers.get(n)


def _elementwise(block, op, opdef, made, constant):
    """What an elementwise op that reads a chain's image is in the chain (see
    :func:`_members`), or None where it cannot run on NHWC images."""
    ins, outs = _real(op.input_arg_names), _real(op.output_arg_names)
    if not any(n in made for n in ins) or not outs:
        return None
    shape = tuple(block._find_var_recursive(outs[0]).shape)
    if len(shape) != 4 or any(tuple(block._find_var_recursive(n).shape) != shape
                              for n in outs):
        return None
    what = "same"
    for n in ins:
        v = block._find_var_recursive(n)
        if v is None:
            return None
        if n in made:  # (an image of the chain: this one, or one that broadcasts to it)
            if len(v.shape) != 4 or any(d not in (1, e) for d, e in zip(v.shape, shape)):
                return None
            continue
        size = int(np.prod(v.shape)) if all(d >= 0 for d in v.shape) else -1
        if size == 1 or tuple(v.shape) == shape:  # (an image from outside: converted)
            continue
        if len(v.shape) == 4 and constant(n) and \
                all(d in (1, e) for d, e in zip(v.shape, shape)):
            continue  # (a constant that broadcasts: a permuted copy of its value)
        if not opdef.has(registry.BROADCAST) or len(v.shape) != 1 or \
                int(op.all_attrs().get("axis", -1)) != 1 or shape[1] < 0 or \
                v.shape[0] != shape[1]:
            return None
        what = _CHANNELS_AXIS
    return what


def _chains(block, member, made) -> list:
    """The members grouped into chains (connected by the values they pass each other)."""
    parent = {i: i for i in member}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in member:
        for n in _real(block.ops[i].input_arg_names):
            j = made.get(n)
            if j is not None and j < i:
                parent[find(i)] = find(j)
    groups: dict = {}
    for i in member:
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _rewrite(prog: Program, params: dict, ask) -> None:
    block = prog.global_block()
    uses = _Uses(prog)
    constant = _constants(uses, params)
    member, made = _members(block, uses, constant, ask)
    keep = set()
    for chain in _chains(block, member, made):
        ops = set(chain)
        into, out = _boundary(block, uses, ops, made)
        switched = sum(1 for i in chain if member[i] == "switch")
        # (a concat of NHWC images copies them: see step 1; a value of one pixel per channel,
        # a global pool's, is the same array either way)
        copies = sum(1 for n in into | out if _pixels(block, n) != 1) + \
            sum(1 for i in chain if member[i] == "follow")
        if switched >= MIN_SWITCHED and switched >= PER_CONVERSION * copies:
            keep |= ops
    if not keep:
        return
    made = {n: i for n, i in made.items() if i in keep}
    _, outside = _boundary(block, uses, keep, made)
    taken = {n for b in prog.blocks for n in b.vars} | set(uses.readers) | set(uses.writers)
    last: dict = {}  # NCHW name -> its NHWC variable

    def nhwc_var(name):
        v = block._find_var_recursive(name)
        new = _new_name(taken, f"{name}.nhwc")
        block.create_var(name=new, shape=[v.shape[k] for k in _TO_LAST], dtype=v.dtype)
        last[name] = new
        return new

    old_ops = list(block.ops)
    at = 0  # where old op k is now
    for k, op in enumerate(old_ops):
        i = at + k
        if k not in keep:
            continue
        images = _images(block, op)
        for n in dict.fromkeys(_real(op.input_arg_names)):
            if n in last:
                op._rename_input(n, last[n])
            elif member[k] != "switch" and constant(n) and \
                    len((v := block._find_var_recursive(n)).shape) == 4 and \
                    int(np.prod(v.shape)) > 1:
                new = _new_name(taken, f"{n}.nhwc")
                block.create_var(name=new, shape=[v.shape[a] for a in _TO_LAST],
                                 dtype=v.dtype, persistable=True)
                params[new] = np.ascontiguousarray(np.transpose(params[n], _TO_LAST))
                last[n] = new
                op._rename_input(n, new)
            elif n in images:  # (an image from outside the chain)
                src = nhwc_var(n)
                _insert_like(block, i, op, "transpose", {"X": [n]}, {"Out": [src]},
                             {"axis": _TO_LAST})
                at += 1
                i += 1
                op._rename_input(n, src)
        what = member[k]
        if what in ("switch", "follow", "join"):
            lay = registry.lookup(op.type).layout
            op._set_attr(lay.attr, lay.last)
        elif what == _CHANNELS_AXIS:
            op._set_attr("axis", _CHANNELS_AXIS)
        for n in _real(op.output_arg_names):
            new = nhwc_var(n)
            op._rename_output(n, new)
            if n in outside:
                _insert_like(block, i + 1, op, "transpose", {"X": [new]}, {"Out": [n]},
                             {"axis": _TO_FIRST})
                at += 1
    for n in last:  # NCHW values the chains made that nothing needs any more
        if n in made and n not in outside:
            block._remove_var(n)


def _pixels(block, name) -> int:
    """The pixels of the rank-4 value ``name`` (NCHW), -1 where not known."""
    v = block._find_var_recursive(name)
    h, w = (v.shape[2], v.shape[3]) if v is not None and len(v.shape) == 4 else (-1, -1)
    return h * w if h >= 0 and w >= 0 else -1


def _images(block, op) -> set:
    """The images ``op`` (a member) reads: the names in the image slots of an op that declares
    a layout, else the inputs of its output's shape (rank 4)."""
    lay = registry.lookup(op.type).layout
    if lay is not None:
        return {n for s in lay.inputs for n in _real(op.input(s))}
    out = block._find_var_recursive(_real(op.output_arg_names)[0])
    return {n for n in _real(op.input_arg_names)
            if tuple(block._find_var_recursive(n).shape) == tuple(out.shape)}


def _boundary(block, uses: _Uses, ops: set, made: dict) -> tuple:
    """``(images the ops read from outside them, values of theirs needed NCHW outside)``."""
    into, out = set(), set()
    for i in ops:
        op = block.ops[i]
        into |= {n for n in _images(block, op) if made.get(n) not in ops}
        for n in _real(op.output_arg_names):
            readers = uses.readers.get(n, [])
            if n in uses.pinned or any(bi != block.idx or j not in ops for bi, j in readers):
                out.add(n)
    return into, out
