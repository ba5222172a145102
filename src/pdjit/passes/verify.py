"""The program verifier: a program is checked after it is parsed and before it is planned.

``verify(program)`` walks every block, variable and op and raises a :class:`ProgramError` (an
:class:`UnregisteredOpError` for an unknown op type) naming the block, the op's index and type,
what is wrong, and what was expected vs got. What it checks:

- blocks: at least one; block ``i`` says ``idx == i``; block 0 has parent ``-1``, every other
  block a parent before it; no block reachable from itself through the ``BLOCK``/``BLOCKS``
  attributes of its ops (a ``while``/``conditional_block`` whose ``sub_block`` is its own block
  or an ancestor of it); every such index names a block of the program;
- variables: a name (text, not bytes that are not UTF-8), a known ``VarType``; a tensor's data
  type one pdjit computes with, its dims ``>= -1``, its ``lod_level`` in 0..16;
- ops: the type registered; every input and output slot the definition requires present, a
  slot that takes one variable given at most one; every variable named exists in the op's block
  or an ancestor, with a type the op can use (the feed/fetch holders only for feed and fetch ops,
  step scopes only for control flow); attributes of their declared proto types (INT for LONG
  and the like accepted: the values are the same) and within the ranges the registry declares
  (``at_least``/``at_most``/``less_than`` bounds, a NaN outside every bound; ``one_of``
  enumerations; ``axis_of``: an axis of the named inputs' declared rank; ``valid``);
  a required attribute present; a missing attribute that has a default is given it (the
  program's version changes only then). Attributes the definition does not declare
  (``use_mkldnn``, ``op_device``...) are accepted as they are. Feed and fetch ops only in the
  global block;
- size: blocks, ops per block and nesting depth within ``pdjit.framework.limits`` (a
  :class:`ProgramLimitError` naming the bound and its environment variable);
- declared vs inferred (check, don't trust): each op's ``infer_shape`` runs again on its
  inputs' declarations, and its (non-intermediate) tensor outputs must be declared with the
  dtype it computes, its rank (``[]``, ``[1]`` and ``[0]`` are one for this: PaddlePaddle
  declares a scalar or an empty state either way) and every dim known in both equal; inputs
  that do not fit the op are refused here, before either executor runs anything.

``verify_for_run(program)`` is what the executor calls before it plans a run: the same checks,
once per program content (nothing when the program was verified at its current version, e.g.
when a model file was loaded).
"""
from __future__ import annotations

from pdjit.framework import dtypes, limits, registry
from pdjit.framework.attrs import attr_type_name
from pdjit.framework.errors import (
    ProgramError,
    ShapeMismatch,
    UnregisteredOpError,
    describe_op,
    named_errors,
)
from pdjit.framework.program import Program
from pdjit.framework.variable import _TENSOR_HOLDERS, _tensor_desc
from pdjit.proto import framework_pb2 as pb

__all__ = ["verify", "verify_for_run"]

VarType = pb.VarType


class A:
    """The attribute type codes as plain ints (the enum wrapper's lookups cost a call each)."""
    locals().update({k: int(v) for k, v in pb.AttrType.items()})


MAX_LOD_LEVEL = 16
_VAR_TYPES = frozenset(VarType.Type.values())
_HOLDER_TYPES = frozenset({VarType.FEED_MINIBATCH, VarType.FETCH_LIST, VarType.FEED_LIST})
_STEP_SCOPES = int(VarType.STEP_SCOPES)
_STRING, _STRINGS, _BLOCK, _BLOCKS = A.STRING, A.STRINGS, A.BLOCK, A.BLOCKS
# proto types that hold the same values: a file may store one where pdjit declares the other
_SAME_VALUES = {A.INT: {A.LONG}, A.LONG: {A.INT}, A.FLOAT: {A.FLOAT64}, A.FLOAT64: {A.FLOAT},
                A.INTS: {A.LONGS}, A.LONGS: {A.INTS}, A.FLOATS: {A.FLOAT64S},
                A.FLOAT64S: {A.FLOATS}, A.BOOLEAN: {A.INT, A.LONG}}
_LISTS = frozenset({A.INTS, A.LONGS, A.FLOATS, A.FLOAT64S, A.BOOLEANS, A.STRINGS, A.BLOCKS,
                    A.SCALARS, A.VARS})


@named_errors("pdjit.verify")
def verify(program, *, registered: bool = True, fill_defaults: bool = True,
           shapes: bool = True):
    """Check ``program``; raise :class:`ProgramError` naming what is malformed. Returns it.

    ``registered=False`` accepts op types pdjit does not know (to inspect a program), checking
    what it can of them; ``fill_defaults=False`` leaves missing attributes missing;
    ``shapes=False`` trusts the declared output ``VarDesc``s instead of inferring them again."""
    if not isinstance(program, Program):
        as_program = getattr(program, "_as_program", None)  # a CompiledProgram
        if as_program is None:
            raise TypeError(f"verify: expected a Program, got {type(program).__name__}")
        program = as_program()
    blocks = program.blocks
    if not blocks:
        raise ProgramError("program: it has no blocks (expected at least the global block)")
    n = len(blocks)
    for i, b in enumerate(blocks):
        _check_block_header(b, i, n)
    _check_size(blocks)
    for b in blocks:
        _check_vars(b)
    for b in blocks:
        for i, op in enumerate(b.ops):
            _check_op(program, b, i, op, registered, fill_defaults)
        _check_scratch_reads(b)
    _check_no_cycles(program)
    if shapes:
        for b in blocks:
            for i, op in enumerate(b.ops):
                _check_inferred(b, i, op)
    program.__dict__["_verified_version"] = program.version
    return program


def verify_for_run(program) -> None:
    """Check ``program`` before the executor builds a run of it: :func:`verify`, once per
    program content (the result is kept with the program's compiled runs)."""
    if program.__dict__.get("_verified_version") == program.version:
        return  # verified as it is now (when it was parsed, or by an earlier run)
    cache = program._run_cache()
    if cache.get(_VERIFIED) is None:
        verify(program)
        program._run_cache()[_VERIFIED] = True  # (a new content if defaults were filled in)


_VERIFIED = ("verify", ("verified",))  # the (kind, key) form of the executor's entries


# -- blocks ---------------------------------------------------------------------------------------
def _check_block_header(b, i: int, n: int) -> None:
    if b.idx != i:
        raise ProgramError(f"block at position {i}: its idx is {b.idx}, expected {i}")
    parent = b.parent_idx
    if i == 0:
        if parent != -1:
            raise ProgramError(f"block 0 (the global block): parent_idx is {parent}, expected -1")
    elif not 0 <= parent < i:
        raise ProgramError(f"block {i}: parent_idx is {parent}, expected a block before it "
                           f"(0..{i - 1})")
    fwd = b.forward_block_idx
    if fwd != -1 and not 0 <= fwd < n:
        raise ProgramError(f"block {i}: forward_block_idx is {fwd}, expected -1 or a block "
                           f"index in 0..{n - 1}")


def _check_size(blocks) -> None:
    """The program's size within the bounds (blocks, ops per block, nesting depth through
    ``parent_idx``), before anything walks it."""
    max_blocks = limits.bound(limits.MAX_BLOCKS)
    if len(blocks) > max_blocks:
        raise limits.exceeded("program: blocks", len(blocks), limits.MAX_BLOCKS, max_blocks)
    max_ops = limits.bound(limits.MAX_OPS_PER_BLOCK)
    max_depth = limits.bound(limits.MAX_BLOCK_DEPTH)
    depth = []
    for i, b in enumerate(blocks):
        if len(b.ops) > max_ops:
            raise limits.exceeded(f"block {i}: ops", len(b.ops), limits.MAX_OPS_PER_BLOCK,
                                  max_ops)
        depth.append(0 if i == 0 else depth[b.parent_idx] + 1)
        if depth[-1] > max_depth:
            raise limits.exceeded(f"block {i}: nesting depth (blocks between it and the global "
                                  f"block)", depth[-1], limits.MAX_BLOCK_DEPTH, max_depth)


def _ancestors(program, idx: int) -> list:
    out, seen = [], set()
    while idx >= 0 and idx not in seen:
        seen.add(idx)
        out.append(idx)
        idx = program.blocks[idx].parent_idx
    return out


def _check_no_cycles(program) -> None:
    """No block reaches itself through its ops' sub-block attributes, and no chain of them is
    deeper than the nesting bound (walked without recursion: depth is what it checks)."""
    edges = {b.idx: [(i, op, s) for i, op in enumerate(b.ops) for s in op.sub_block_indices()]
             for b in program.blocks}
    max_depth = limits.bound(limits.MAX_BLOCK_DEPTH)
    state = {}  # 1: on the current path, 2: done
    for b in program.blocks:
        if state.get(b.idx) is not None:
            continue
        state[b.idx] = 1
        path, stack = [b.idx], [iter(edges[b.idx])]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            i, op, s = nxt
            idx = path[-1]
            if state.get(s) == 1:
                loop = " -> ".join(str(p) for p in path + [s])
                raise ProgramError(f"{describe_op(op.type, idx, i, None)}: sub-block {s} "
                                   f"leads back to itself (blocks {loop}); expected the "
                                   f"sub-blocks to form a tree")
            if state.get(s) is None:
                if len(path) > max_depth:
                    raise limits.exceeded(f"{describe_op(op.type, idx, i, None)}: sub-block "
                                          f"{s} nests blocks", len(path),
                                          limits.MAX_BLOCK_DEPTH, max_depth)
                state[s] = 1
                path.append(s)
                stack.append(iter(edges[s]))


# -- variables ------------------------------------------------------------------------------------
def _check_vars(b) -> None:
    for key, v in b.vars.items():
        name = v.desc.name
        if not isinstance(name, str) or not isinstance(key, str):
            raise ProgramError(f"block {b.idx}: a variable's name {name!r} is not valid UTF-8 "
                               f"text")
        if not name:
            raise ProgramError(f"block {b.idx}: a variable has an empty name")
        where = f"block {b.idx}, variable {name!r}"
        t = v.desc.type.type
        if t not in _VAR_TYPES:
            raise ProgramError(f"{where}: unknown variable type {t} (expected one of "
                               f"VarType.Type)")
        if t not in _TENSOR_HOLDERS:
            continue
        td = _tensor_desc(v.desc.type)
        if td is None:
            raise ProgramError(f"{where}: a {dtypes.type_name(t)} without a tensor description "
                               f"(data type and dims)")
        if td.data_type not in dtypes._CODE_TO_NP:
            raise ProgramError(f"{where}: data type {dtypes.type_name(td.data_type)} is not one "
                               f"pdjit computes with (expected one of "
                               f"{sorted(dtypes.type_name(c) for c in dtypes._CODE_TO_NP)})")
        bad = [d for d in td.dims if d < -1]
        if bad:
            raise ProgramError(f"{where}: dims {list(td.dims)}: expected every dim >= -1 (-1: "
                               f"unknown until run time), got {bad[0]}")
        lod = v.lod_level
        if not 0 <= lod <= MAX_LOD_LEVEL:
            raise ProgramError(f"{where}: lod_level {lod}, expected 0..{MAX_LOD_LEVEL}")


# -- ops ------------------------------------------------------------------------------------------
def _check_op(program, b, i: int, op, registered: bool, fill_defaults: bool) -> None:
    t = op.desc.type

    def fail(msg, cls=ProgramError):
        return cls(f"{describe_op(t if isinstance(t, str) else repr(t), b.idx, i, None)}: {msg}")

    if not isinstance(t, str) or not t:
        raise fail(f"op type {t!r} is not valid text")
    opdef = registry.lookup(t)
    if opdef is None and registered:
        raise fail(f"op type {t!r} is not registered in pdjit, so the program cannot run",
                   UnregisteredOpError)
    if opdef is not None and opdef.has(registry.FEED_FETCH) and b.idx != 0:
        raise fail(f"a feed/fetch op inside sub-block {b.idx}: feeds and fetches move values "
                   f"between a run and the global block (block 0) only")
    _check_slots(b, op, opdef, fail)
    _check_attrs(program, b, op, opdef, fail, fill_defaults)


def _check_scratch_reads(b) -> None:
    """An output declared intermediate (``~``: an op's scratch for its gradient, such as an
    ``rnn``'s ``Reserve``, laid out by each executor its own way) is read only by backward ops
    (``op_role``) and fetched; a forward op of the block reading one is refused, naming both
    ops."""
    scratch = {}
    for i, op in enumerate(b.ops):
        opdef = registry.lookup(op.type)
        if opdef is None:
            continue
        role = op.attr("op_role") if op.has_attr("op_role") else 0
        if not (isinstance(role, int) and role & registry.OP_ROLE_BACKWARD) and \
                not opdef.has(registry.FEED_FETCH):
            for n in op.input_arg_names:
                w = scratch.get(n)
                if w is not None:
                    raise ProgramError(
                        f"{describe_op(op.type, b.idx, i, None)}: input {n!r} is the "
                        f"intermediate output of {describe_op(w[0], b.idx, w[1], None)} (its "
                        f"scratch for the backward pass, not a result a forward op may read)")
        for slot in opdef.outputs:
            for n in op.output(slot.name) if slot.name in op.output_names else ():
                if slot.intermediate:
                    scratch[n] = (op.type, i)
                else:
                    scratch.pop(n, None)


def _check_slots(b, op, opdef, fail) -> None:
    control = opdef is not None and opdef.has(registry.CONTROL_FLOW)
    feed_fetch = opdef is not None and opdef.has(registry.FEED_FETCH)
    for which, given, slots in (("input", op._inputs, opdef.inputs if opdef else ()),
                                ("output", op._outputs, opdef.outputs if opdef else ())):
        for slot_name, names in given.items():
            if not isinstance(slot_name, str):
                raise fail(f"an {which} slot name {slot_name!r} is not valid UTF-8 text")
            for n in names:
                if not isinstance(n, str):
                    raise fail(f"{which} {slot_name!r}: variable name {n!r} is not valid UTF-8 "
                               f"text")
                if n == registry.EMPTY_VAR_NAME:
                    continue
                v = b._find_var_recursive(n)
                if v is None:
                    if not n:
                        raise fail(f"{which} {slot_name!r}: an empty variable name")
                    raise fail(f"{which} {slot_name!r}: variable {n!r} is not defined in block "
                               f"{b.idx} or its ancestors")
                vt = v.desc.type.type
                if vt in _HOLDER_TYPES and not feed_fetch:
                    raise fail(f"{which} {slot_name!r}: variable {n!r} is a "
                               f"{dtypes.type_name(vt)} (a feed/fetch holder), which only feed "
                               f"and fetch ops use; expected a tensor")
                if vt == _STEP_SCOPES and not control:
                    raise fail(f"{which} {slot_name!r}: variable {n!r} is a STEP_SCOPES, which "
                               f"only control-flow ops use; expected a tensor")
        for slot in slots:
            names = given.get(slot.name)
            if not names:
                if not slot.dispensable and not slot.intermediate:
                    raise fail(f"{which} slot {slot.name!r} is required but "
                               f"{'empty' if names is not None else 'absent'}")
                continue
            if len(names) > 1 and not slot.duplicable:
                raise fail(f"{which} slot {slot.name!r} takes one variable, got {len(names)}: "
                           f"{names}")
    written = {}  # one op writes a variable once: which write would win is undefined
    for slot_name, names in op._outputs.items():
        for n in names:
            if n == registry.EMPTY_VAR_NAME:
                continue
            if n in written:
                raise fail(f"output {slot_name!r}: variable {n!r} is written by output "
                           f"{written[n]!r} of the same op too (expected each output variable "
                           f"once)")
            written[n] = slot_name


def _check_attrs(program, b, op, opdef, fail, fill_defaults: bool) -> None:
    types = {}
    for a in op.desc.attrs:
        name, t = a.name, a.type
        if type(name) is not str:
            raise fail(f"an attribute name {name!r} is not valid UTF-8 text")
        types[name] = t
        if t == _STRING:
            if type(a.s) is not str:
                raise fail(f"attribute {name!r}: the string {a.s!r} is not valid UTF-8 text")
        elif t == _STRINGS:
            if name != "op_callstack" and not all(type(s) is str for s in a.strings):
                raise fail(f"attribute {name!r}: a string of {list(a.strings)!r} is not valid "
                           f"UTF-8 text")
        elif t == _BLOCK:
            _check_sub_block(program, b, name, a.block_idx, fail)
        elif t == _BLOCKS:
            for s in a.blocks_idx:
                _check_sub_block(program, b, name, s, fail)
    missing = []
    for declared in (registry.COMMON_ATTRS, opdef.attrs if opdef is not None else {}):
        for name, spec in declared.items():
            got = types.get(name)
            if got is None:
                if declared is not registry.COMMON_ATTRS:
                    if spec.default is registry.REQUIRED:
                        raise fail(f"attribute {name!r} ({attr_type_name(spec.type)}) is "
                                   f"required but absent")
                    missing.append((name, spec))
                continue
            if got != spec.type and got not in _SAME_VALUES.get(spec.type, ()):
                raise fail(f"attribute {name!r}: expected {attr_type_name(spec.type)}, got "
                           f"{attr_type_name(got)} ({op._attrs.get(name)!r})")
            if spec.checked:
                _check_range(name, spec, op._attrs.get(name), fail, b, op)
    if fill_defaults:
        for name, spec in missing:
            op._set_attr(name, spec.default, spec.type)


def _declared_rank(b, op, slots):
    """The largest declared rank of the variables in input ``slots`` of ``op`` (None: none)."""
    ranks = []
    for slot in slots:
        for n in op.input(slot):
            v = b._find_var_recursive(n) if n != registry.EMPTY_VAR_NAME else None
            if v is not None and v.desc.type.type in _TENSOR_HOLDERS:
                td = _tensor_desc(v.desc.type)
                if td is not None:
                    ranks.append(len(td.dims))
    return max(ranks) if ranks else None


def _check_range(name, spec, value, fail, b=None, op=None) -> None:
    low, high, below, one_of = spec.at_least, spec.at_most, spec.less_than, spec.one_of
    values = value if spec.type in _LISTS else [value]
    for v in values:
        if one_of is not None and v not in one_of:
            raise fail(f"attribute {name!r}: expected one of {list(one_of)}, got {value!r}")
        if type(v) in (str, bytes, bool) or not isinstance(v, (int, float)):
            continue
        # written so that a NaN is outside every bound
        if (low is not None and not v >= low) or (high is not None and not v <= high) or \
                (below is not None and not v < below):
            bounds = [f">= {low}" if low is not None else "",
                      f"<= {high}" if high is not None else "",
                      f"< {below}" if below is not None else ""]
            raise fail(f"attribute {name!r}: expected {' and '.join(x for x in bounds if x)}, "
                       f"got {value!r}")
    if spec.valid is not None:
        problem = spec.valid(value)
        if problem:
            raise fail(f"attribute {name!r}: {problem}")
    if spec.axis_of is not None and op is not None:
        r = _declared_rank(b, op, spec.axis_of)
        if r is None:
            return
        r = max(r + spec.axis_extra, 1)
        for v in values:
            if isinstance(v, (int, float)) and not -r <= v < r:
                inputs = " and ".join(repr(s) for s in spec.axis_of)
                raise fail(f"attribute {name!r}: {value!r} is not an axis of input {inputs} "
                           f"(rank {r - spec.axis_extra}): expected {-r}..{r - 1}")


def _check_sub_block(program, b, name, s, fail) -> None:
    n = len(program.blocks)
    if not 0 <= s < n:
        raise fail(f"attribute {name!r}: block index {s} out of range, expected 1..{n - 1} "
                   f"(the program has {n} blocks)")
    ancestors = _ancestors(program, b.idx)
    if s in ancestors:
        what = "its own block" if s == b.idx else f"block {s}, an ancestor of block {b.idx}"
        raise fail(f"attribute {name!r}: sub-block {s} is {what}; expected a block below it "
                   f"(a block reachable from itself would run forever)")


# -- declared vs inferred ----------------------------------------------------------------------
_CHECKED_OUTPUT = int(VarType.LOD_TENSOR)


def _compatible(declared, inferred) -> bool:
    """Whether declared dims may describe a value of the inferred dims: one rank (``[]`` and
    ``[1]`` are one thing: a scalar, and PaddlePaddle declares an empty state ``[]`` where it
    is ``[0]``), and every dim known in both equal (``-1``: anything)."""
    declared, inferred = tuple(declared), tuple(inferred)
    if len(declared) != len(inferred):
        return {declared, inferred} <= {(), (1,), (-1,), (0,)}
    return all(d == g or d < 0 or g < 0 for d, g in zip(declared, inferred))


class _NotTensors(Exception):
    """An input is not a tensor (a reader, scopes, a raw holder)."""


def _check_inferred(b, i: int, op) -> None:
    """Infer ``op``'s outputs again from its inputs' declarations (its ``infer_shape``) and
    compare them with the declared output variables: a file may declare what the op does not
    compute, and the compiled plan trusts declarations."""
    opdef = registry.lookup(op.desc.type)
    if opdef is None or opdef.has(registry.CONTROL_FLOW) or opdef.has(registry.FEED_FETCH):
        return
    t = op.desc.type

    def fail(msg):
        return ProgramError(f"{describe_op(t, b.idx, i, None)}: {msg}")

    def declared(n):
        v = b._find_var_recursive(n)
        if v is not None and v.desc.type.type not in _TENSOR_HOLDERS:
            raise _NotTensors
        return None if v is None else v.meta()

    try:
        result = opdef.infer_op(op, declared)
    except _NotTensors:
        return  # an op over readers, scopes or raw holders: nothing to compare
    except ShapeMismatch as e:
        raise fail(f"its inputs as declared do not fit it: {e}") from None
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError,
            ZeroDivisionError) as e:
        raise fail(f"its inputs and attributes as declared do not fit it: "
                   f"{type(e).__name__}: {e}") from e
    if not isinstance(result, dict):
        return
    for slot in opdef.outputs:
        res = result.get(slot.name)
        if res is None or slot.intermediate:  # intermediates: the op's own scratch for its grad
            continue
        res = res if isinstance(res, (list, tuple)) else [res]
        for n, meta in zip(op.output(slot.name), res):
            if n == registry.EMPTY_VAR_NAME or not isinstance(meta, registry.VarMeta):
                continue
            v = b._find_var_recursive(n)
            if v is None or v.desc.type.type != _CHECKED_OUTPUT or \
                    int(meta.type) != _CHECKED_OUTPUT:
                continue
            td = _tensor_desc(v.desc.type)
            if td is None:
                continue
            declared = dtypes._CODE_TO_NP.get(td.data_type)
            if declared is not None and declared != meta.dtype and not slot.loose_dtype:
                raise fail(f"output {slot.name!r}: variable {n!r} is declared "
                           f"{dtypes.dtype_str(declared)}, but the op computes "
                           f"{dtypes.dtype_str(meta.dtype)} from its inputs (declared "
                           f"{dtypes.dtype_str(declared)} vs inferred "
                           f"{dtypes.dtype_str(meta.dtype)})")
            if not _compatible(td.dims, meta.shape):
                raise fail(f"output {slot.name!r}: variable {n!r} is declared of shape "
                           f"{list(td.dims)}, but the op computes shape {list(meta.shape)} from "
                           f"its inputs (declared {list(td.dims)} vs inferred "
                           f"{list(meta.shape)}; -1 matches any size)")
