"""Fusion partition: a block's ops -> groups -> segments (program -> plan).

Assumes: the ops are pruned, in program order, registered, and their variables' shapes and
dtypes were inferred (``-1`` = known at run time). Guarantees:

- every op is in exactly one :class:`Group`, groups keep program order;
- an ``elementwise`` group holds ops with an ``emit`` template whose outputs all have the group's
  build-time shape; a ``reduction`` group is such a chain (possibly empty) ending in one
  reduction whose input the chain computes; an ``opaque`` group is one op lowered as a call;
  a ``reference`` group is one op that runs its NumPy reference;
- ``Group.stored`` lists the values a group must write to memory: those read by another group,
  fetched, persistable, or read from another block. Everything else stays in registers;
- an ``opaque`` group may also be a *prologue*: an elementwise chain whose values nothing but
  the opaque op after it reads, that op being row-wise (its ``Opaque.lower`` function carries
  :data:`ROW_PROLOGUE`); the chain is then evaluated element by element inside the op's own
  pass over each row (``nodes``: the chain, then the op), so its result never reaches memory;
- a :class:`Segment` is a maximal run of lowerable groups: one native function;
- every time an op does not join the group before it, ``Partition.log`` says why.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pdjit.framework import limits, registry, scalars
from pdjit.framework.program import Block, Operator
from pdjit.proto import framework_pb2 as pb

ELEMENTWISE, REDUCTION, OPAQUE, REFERENCE = "elementwise", "reduction", "opaque", "reference"

#: the attribute of an ``Opaque.lower`` function declaring a row-wise lowering:
#: ``lower.row_prologue(attrs, rank) -> slot or None``: the input slot that the lowering reads
#: only through ``ctx.row_input(slot)`` (rows of its last axis, each element read once, in a
#: first loop over the row) for these attributes and an input of ``rank`` dims; ``None``: not
#: row-wise for them. The partition may then fuse the elementwise chain computing that input
#: into the op as a prologue.
ROW_PROLOGUE = "row_prologue"


@dataclass
class Node:
    """An op with its lowering decided: kind, and the template / Reduce / Opaque to emit."""
    op: Operator
    kind: str
    lowering: object = None
    why_not: str = ""

    @property
    def label(self) -> str:
        return f"{self.op.type}#{self.op.idx}"


@dataclass
class Group:
    kind: str
    nodes: list
    shape: tuple = ()
    stored: list = field(default_factory=list)

    @property
    def ops(self) -> list:
        return [n.op for n in self.nodes]

    def describe(self) -> str:
        ops = ", ".join(n.label for n in self.nodes)
        text = f"{self.kind} [{ops}]"
        if self.kind in (ELEMENTWISE, REDUCTION):
            text += f" shape {list(self.shape)}"
        if self.stored:
            text += f" stores {self.stored}"
        if self.kind == REFERENCE:
            text += f" ({self.nodes[0].why_not})"
        return text


@dataclass
class Segment:
    groups: list

    @property
    def native(self) -> bool:
        return self.groups[0].kind != REFERENCE


@dataclass
class Partition:
    segments: list
    log: list

    def describe(self) -> str:
        lines = []
        for i, seg in enumerate(self.segments):
            lines.append(f"segment {i} ({'native' if seg.native else 'reference'}):")
            lines += [f"  group {g.kind}: {g.describe()}" for g in seg.groups]
        if self.log:
            lines.append("not fused:")
            lines += [f"  {reason}" for reason in self.log]
        return "\n".join(lines)


def _dense(block: Block, name: str):
    v = block._find_var_recursive(name)
    if v is None or v.type != pb.VarType.LOD_TENSOR or v.dtype is None:
        return None
    return v


def classify(op: Operator, target=None) -> Node:
    """Decide how ``op`` lowers for ``target``, from its definition's traits and ``emit``.
    ``target``: the code generation target (its ``name`` and ``lowering(op_type, opaque)``,
    the lowering it runs for an opaque op); ``None``: the op definitions' own rules alone."""
    opdef = registry.lookup(op.type)
    if opdef is None:
        return Node(op, REFERENCE, why_not="not registered")
    if opdef.emit is None:
        return Node(op, REFERENCE, why_not="no emit rule: runs its reference")
    block = op.block
    if scalars.demoted(op):  # (1,) declared []: the reference stores it as declared
        return Node(op, REFERENCE, why_not="an output declared [] that it computes [1]")
    dtypes = {}
    for slot in opdef.inputs + opdef.outputs:
        names = op.input(slot.name) if slot in opdef.inputs else op.output(slot.name)
        names = [n for n in names if n != registry.EMPTY_VAR_NAME]
        if not names:
            continue
        vs = [_dense(block, n) for n in names]
        if any(v is None for v in vs):
            return Node(op, REFERENCE, why_not=f"slot {slot.name} is not a dense tensor")
        dtypes[slot.name] = vs[0].dtype
    attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
    emit = opdef.emit
    if callable(emit) and not isinstance(emit, registry.Opaque):
        emit = emit(dtypes, **attrs)
    if emit is None:
        return Node(op, REFERENCE, why_not="emit declines these dtypes/attributes")
    if isinstance(emit, registry.Reduce):
        return Node(op, REDUCTION, emit)
    if isinstance(emit, registry.Opaque):
        low = emit if target is None else target.lowering(op.type, emit)
        if low is None or low.lower is None:
            name = "" if target is None else f" {target.name}"
            return Node(op, REFERENCE, why_not=f"no lowering for target{name}")
        return Node(op, OPAQUE, low)
    if isinstance(emit, str) and opdef.has(registry.ELEMENTWISE):
        if any(s.duplicable for s in opdef.inputs) or len(opdef.outputs) != 1:
            return Node(op, REFERENCE, why_not="elementwise emit needs single-value slots")
        return Node(op, ELEMENTWISE, emit)
    return Node(op, REFERENCE, why_not=f"emit of type {type(emit).__name__} does not fit its "
                                       f"traits")


def out_shape(op: Operator) -> tuple:
    v = op.block._find_var_recursive(op.output_arg_names[0])
    return tuple(v.shape)


#: kernel calls in one driver (a segment): its generated function stays a size Python's and
#: Numba's compilers take in time linear in the program
MAX_SEGMENT_GROUPS = 256


def partition(block: Block, ops: list, live_out: set, declined=frozenset(),
              target=None) -> Partition:
    """Group ``ops`` (pruned, in order) for ``target``. ``live_out``: names needed after the
    block's ops run (fetched, persistable, read by other blocks). ``declined``: ids of ops whose
    lowering declined their ranks/dtypes when the code generator tried; they run their
    reference."""
    log: list = []
    groups: list = []
    open_group: Group | None = None
    max_fused, max_groups = limits.bound(limits.MAX_FUSED_OPS), MAX_SEGMENT_GROUPS
    readers: dict = {}   # name -> ids of the ops reading it
    for op in ops:
        for n in op.input_arg_names:
            readers.setdefault(n, set()).add(id(op))

    def close():
        nonlocal open_group
        if open_group is not None:
            groups.append(open_group)
            open_group = None

    for op in ops:
        node = classify(op, target)
        if id(op) in declined:
            node = Node(op, REFERENCE, why_not="its lowering declines these ranks/dtypes")
        if node.kind == REFERENCE:
            if open_group is not None:
                log.append(f"{node.label}: {node.why_not}")
            close()
            groups.append(Group(REFERENCE, [node]))
            continue
        if node.kind == ELEMENTWISE:
            shape = out_shape(node.op)
            if open_group is not None and open_group.kind == ELEMENTWISE:
                if open_group.shape == shape and _connected(open_group, node.op):
                    if len(open_group.nodes) < max_fused:
                        open_group.nodes.append(node)
                        continue
                    log.append(f"{node.label}: the open group holds {max_fused} ops, the most "
                               f"one kernel fuses (PDJIT_MAX_FUSED_OPS; compile cost grows "
                               f"faster than the group)")
                    close()
                    open_group = Group(ELEMENTWISE, [node], shape)
                    continue
                log.append(f"{node.label}: output shape {list(shape)} differs from the open "
                           f"group's {list(open_group.shape)}" if open_group.shape != shape
                           else f"{node.label}: reads nothing the open group reads or computes "
                                f"(its -1 dims may be other sizes)")
            elif open_group is not None:
                log.append(f"{node.label}: the group before it ended at a {open_group.kind} op")
            close()
            open_group = Group(ELEMENTWISE, [node], shape)
            continue
        if node.kind == REDUCTION:
            x = node.op.input(node.lowering.x)
            if open_group is not None and open_group.kind == ELEMENTWISE and len(x) == 1 \
                    and x[0] in _defined(open_group) and \
                    tuple(_var(block, x[0]).shape) == open_group.shape:
                open_group.nodes.append(node)
                open_group.kind = REDUCTION
            else:
                if open_group is not None:
                    log.append(f"{node.label}: its input is not computed by the open group")
                close()
                open_group = Group(REDUCTION, [node], tuple(_var(block, x[0]).shape))
            close()
            continue
        if open_group is not None and open_group.kind == ELEMENTWISE:
            why = _prologue_refusal(block, open_group, node, readers, live_out)
            if why is None:  # the chain runs inside the op's row loop
                open_group.nodes.append(node)
                open_group.kind = OPAQUE
                close()
                continue
            log.append(f"{node.label}: {why}")
        elif open_group is not None:
            log.append(f"{node.label}: opaque ops are calls of their own")
        close()
        groups.append(Group(OPAQUE, [node]))
    close()
    _mark_stored(groups, live_out)
    segments: list = []
    for g in groups:
        if g.kind == REFERENCE or not segments or not segments[-1].native or \
                len(segments[-1].groups) >= max_groups:
            segments.append(Segment([g]))
        else:
            segments[-1].groups.append(g)
    return Partition(segments, log)


def _prologue_refusal(block: Block, group: Group, node: Node, readers: dict,
                      live_out: set) -> str | None:
    """Why the elementwise ``group`` cannot run inside opaque ``node``'s row loop (None: it
    can): the op must be row-wise for its attributes (:data:`ROW_PROLOGUE`), read the
    group's result of the group's shape through that slot, and be the only reader of every
    value the group computes."""
    rows = getattr(node.lowering.lower, ROW_PROLOGUE, None)
    if rows is None:
        return "opaque ops are calls of their own"
    opdef = registry.get(node.op.type)
    slot = rows(opdef.attr_values(node.op.all_attrs()), len(group.shape))
    if slot is None or not group.shape:
        return "no prologue: the op is not row-wise for these attributes and rank"
    names = node.op.input(slot)
    defined = _defined(group)
    if len(names) != 1 or names[0] not in defined:
        return f"no prologue: its {slot} is not computed by the open group"
    if tuple(_var(block, names[0]).shape) != group.shape:
        return f"no prologue: its {slot} does not have the open group's shape"
    ids = {id(n.op) for n in group.nodes}
    for n in defined:
        if n in live_out:
            return f"no prologue: {n} is needed after the block (fetched, persistable...)"
        others = readers.get(n, set()) - ids - {id(node.op)}
        if others:
            return f"no prologue: {n} is also read by another op"
        if n != names[0] and n in node.op.input_arg_names:
            return f"no prologue: the op reads {n} besides its {slot}"
    return None


def _connected(group: Group, op: Operator) -> bool:
    """Whether ``op`` reads a value ``group`` reads or computes: only then do equal build-time
    shapes with ``-1`` dims stand for equal run-time shapes (a batch of tokens and a batch of
    sequences are both ``[-1, D]``)."""
    names = {n for node in group.nodes for n in node.op.input_arg_names} | _defined(group)
    return any(n in names for n in op.input_arg_names)


def _var(block: Block, name: str):
    return block._find_var_recursive(name)


def _defined(group: Group) -> set:
    return {n for node in group.nodes for n in node.op.output_arg_names}


def _mark_stored(groups: list, live_out: set) -> None:
    readers: dict = {}
    for gi, g in enumerate(groups):
        for node in g.nodes:
            for n in node.op.input_arg_names:
                readers.setdefault(n, set()).add(gi)
    for gi, g in enumerate(groups):
        last_def: dict = {}
        for node in g.nodes:
            for n in node.op.output_arg_names:
                if n != registry.EMPTY_VAR_NAME:
                    last_def[n] = node
        if g.kind == REFERENCE:
            g.stored = list(last_def)
            continue
        final = g.nodes[-1]
        g.stored = [n for n, node in last_def.items()
                    if n in live_out or readers.get(n, set()) - {gi}
                    or (g.kind != ELEMENTWISE and node is final)]


def live_names(program, block: Block, targets) -> set:
    """Names a block's run must leave in memory: targets, persistables, other blocks' reads
    and, for a sub-block, every name it writes that is declared outside it (the parent reads
    it after the control-flow op, or the next iteration does)."""
    live = set(targets)
    live.update(v.name for v in block.vars.values() if v.persistable)
    if block.idx != 0:
        live.update(n for op in block.ops for n in op.output_arg_names
                    if n != registry.EMPTY_VAR_NAME and not block.has_var(n))
    for b in program.blocks:
        if b is not block:
            for op in b.ops:
                live.update(op.input_arg_names)
                if block.idx in op.sub_block_indices():
                    # the op running this block reads what it outputs, the gradients of its
                    # inputs a grad block leaves (and, for an op with state links, each run's
                    # states, or the gradients of the ex-states) from the block's env
                    live.update(op.output_arg_names)
                    live.update(registry.grad_var_name(n) for n in op.input_arg_names)
                    opdef = registry.lookup(op.type)
                    links = opdef.control.state_links \
                        if opdef is not None and opdef.control is not None else None
                    if links and op.has_attr(links[0]) and op.has_attr(links[1]):
                        live.update(op.attr(links[1]))
                        live.update(registry.grad_var_name(n) for n in op.attr(links[0]))
    return live


def numpy_type_name(dtype) -> str:
    d = np.dtype(dtype)
    return "np.bool_" if d == np.bool_ else f"np.{d.name}"
