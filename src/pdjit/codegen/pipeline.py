"""The compile pipeline: one block of a program to a plan description, in named stages.

``compile_block`` runs the stages in this order; each is a function below whose docstring says
what it assumes and guarantees, and ``PDJIT_DUMP_AFTER=<stage>,...`` (or ``all``) prints what a
stage produced (:func:`pdjit.passes.dump_after`):

1. ``prune`` — the ops the block's live values need (feeds and fetches left out);
2. ``fusion`` — the ops partitioned into fusion groups and segments for the target
   (:func:`pdjit.passes.fusion.partition`), and ``generate`` — each native segment's driver
   and kernels generated (:class:`pdjit.codegen.lowering.SegmentGen`); a lowering that
   declines sends its op back to ``fusion`` as a reference op, so the two run as a loop;
3. ``memory_plan`` — with ``memory_optim``, each driver's intermediates given reused buffers
   (:mod:`pdjit.codegen.memplan`); then every kernel is compiled (``precompile``);
4. ``native_loops`` — a loop op whose body is one lowerable segment as one native function
   (:mod:`pdjit.codegen.loops`);
5. ``steps`` — the plan description: one :class:`NativeSegment` per native segment (its
   compiled host driver and, per ``native_drivers``, its native driver or how to build one),
   one :class:`NativeLoop` per native loop, one :class:`HostOp` per op run by its reference
   (a control-flow op with the sub-blocks its ``ControlFlow`` declaration names).

The program-wide check (``pdjit.passes.verify``) runs once per program before any block is
compiled (the Executor's ``_prepare``). The description is plain data: compiled handles,
argument and output names, op lists, split and driver facts. The runtime
(:mod:`pdjit.runtime.plan`) executes it; the target supplies what differs per target (device
transfers, driver tiers: ``Target.step_tiers``). The pipeline runs no program and names no op.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from pdjit.codegen.compiler import compile_function, precompile
from pdjit.codegen.loops import native_loop
from pdjit.codegen.lowering import Declined, SegmentGen
from pdjit.framework import registry
from pdjit.framework.errors import (
    FallbackError,
    FallbackWarning,
    ReferenceStepWarning,
    describe_op,
    user_stacklevel,
)
from pdjit.passes import batch_rows, dump_after
from pdjit.passes import prune as prune_pass
from pdjit.passes.fusion import REFERENCE, classify, live_names, partition
from pdjit.proto import framework_pb2 as pb

#: the stages, in order (the names ``PDJIT_DUMP_AFTER`` knows)
STAGES = ("prune", "fusion", "generate", "memory_plan", "native_loops", "steps")


# ---- the plan description ----------------------------------------------------------------------
def no_split():
    return None, "the plan has no native drivers"


@dataclass
class NativeSegment:
    """A native segment's step: ``compiled`` (its host driver: ``fn``, ``name``, ``text``,
    ``calls_blas``, ``group_lines``, ``memory_plan``) called with ``args`` (``expected``:
    their ``(dtype, ndim)``), LoD offsets for ``lod_requests`` and a key per random op of
    ``rng_ops``, returning ``outputs``. ``ops``: ``[(op, op_idx)]`` in order (what the
    references run on a fallback), ``groups``: those of each fusion group. ``batch_arg``: the
    argument whose dim 0 is the batch; ``params``: the arguments that are persistables the step
    does not write. ``native``: the segment as one native function, built with the plan;
    ``build_native()``: builds it later (the step got hot under ``tier_mode``); ``split()``:
    ``(indices of the arguments whose rows are the batch's, or None; why not)``."""
    kind: ClassVar[str] = "native"
    compiled: Any
    args: list
    expected: list
    outputs: list
    ops: list
    groups: list
    description: str
    block: Any
    lod_requests: list = field(default_factory=list)
    batch_arg: int = 0
    params: list = field(default_factory=list)
    rng_ops: list = field(default_factory=list)
    native: Any = None
    build_native: Callable | None = None
    tier_mode: Any = False
    split: Callable = no_split


@dataclass
class NativeLoop:
    """A loop op run as one native function: ``compiled`` (the loop of ``loop``, a
    :class:`pdjit.codegen.loops.LoopGen`: its ``args``, ``expected``, ``outputs``, ``limit``)
    for the op ``op`` (index ``op_idx``) whose body is ``body`` (block index); ``rng_ops``:
    ``[(op, index in the body)]`` of the body's random ops; ``step_scopes``: the op's step
    scopes output (left empty by a native run); ``module_groups``: ``(line of the compiled
    module, op types)`` per group of the body, as the generator placed them."""
    kind: ClassVar[str] = "native_loop"
    compiled: Any
    loop: Any
    op: Any
    op_idx: int
    description: str
    body: int
    rng_ops: list
    step_scopes: list
    control: Any
    module_groups: list = field(default_factory=list)

    @property
    def args(self) -> list:
        return self.loop.args

    @property
    def expected(self) -> list:
        return self.loop.expected

    @property
    def outputs(self) -> list:
        return self.loop.outputs

    @property
    def ops(self) -> list:
        return [(self.op, self.op_idx)]


@dataclass
class HostOp:
    """An op run by its NumPy reference (``why``): a control-flow op's ``control`` is its
    ``ControlFlow`` declaration and ``sub_blocks`` the blocks it runs (each with a plan of
    its own)."""
    kind: ClassVar[str] = "reference"
    op: Any
    op_idx: int
    why: str
    control: Any = None
    sub_blocks: tuple = ()


@dataclass
class PlanDescription:
    """A block's plan as data: its ``steps`` in order, the fusion partition (``partition_text``),
    every generated ``(name, source)``, the ``fresh`` values (a new array only native code made
    and nothing else holds after the run) and the block's index."""
    steps: list
    partition_text: str
    sources: list
    fresh: frozenset
    block_idx: int


# ---- the stages ----------------------------------------------------------------------------------
def prune(program, block, fetch_names, keep_outputs: bool = False) -> tuple:
    """``(ops, live)``: the ops of ``block`` that the values live after it need (``fetch_names``,
    persistables, names other blocks read; a sub-block whose step scopes are read keeps every
    value it writes), feeds and fetches left out. ``keep_outputs``: every op's outputs are live
    (NaN/Inf checking stores and checks each one).

    Assumes a verified program. Guarantees: ``ops`` keep their block order; every value in
    ``live`` that an op of the block writes is written by one of ``ops``."""
    live = live_names(program, block, fetch_names)
    if block.idx != 0 and _step_scopes_read(program, block, fetch_names):
        # each run's env is kept and read (for the backward pass): it must hold every value
        live.update(n for op in block.ops for n in op.output_arg_names
                    if n != registry.EMPTY_VAR_NAME)
    ops = [op for op in prune_pass.prune(block, live) if not _is_feed_fetch(op)]
    if keep_outputs:
        live = live | {n for op in ops for n in op.output_arg_names
                       if n != registry.EMPTY_VAR_NAME}
    dump_after("prune", lambda: "\n".join(repr(op) for op in ops))
    return ops, live


def fusion(block, ops, live, target, declined: set):
    """The partition of ``ops`` into fusion groups and segments for ``target``; an op in
    ``declined`` (its lowering declined) is a reference op.

    Assumes ``ops`` and ``live`` from :func:`prune`. Guarantees (``passes.fusion``): the
    groups hold every op once, in the ops' order; a native segment holds only ops the target
    lowers; every refusal to fuse has its reason in ``describe()``."""
    return partition(block, ops, live, declined, target)


def generate(part, block, live, target, threads: tuple) -> list:
    """A :class:`SegmentGen` (source generated, kernels made) per native segment of ``part``,
    None per reference one; raises :class:`Declined` naming an op whose lowering declines.

    Assumes the partition of :func:`fusion`. Guarantees: each driver reads its ``args`` and
    returns its ``outputs`` (the values a later segment or ``live`` needs); kernels are keyed
    by content (equal kernels are one compiled function); nothing is compiled yet but what a
    lowering's library needs. ``threads``: ``(threads a parallel loop may use, threads a
    host driver may run loops on)`` the code is generated for."""
    num_threads, loop_threads = threads
    inference = not _writes_persistable(block, [op for seg in part.segments
                                                for g in seg.groups for op in g.ops])
    gens = []
    for si, seg in enumerate(part.segments):
        if not seg.native:
            gens.append(None)
            continue
        later = set(live)
        for other in part.segments[si + 1:]:
            for g in other.groups:
                for op in g.ops:
                    later.update(op.input_arg_names)
        gen = SegmentGen(seg, block, later, parallel=num_threads > 1,
                         parallel_loops=loop_threads > 1, target=target.name,
                         inference=inference)
        gen.generate()
        gens.append(gen)
    return gens


def memory_plan(gens, memory_optim: bool) -> None:
    """With ``memory_optim``: each driver reuses and releases its intermediates' buffers by
    liveness (before compiling: the plan switches some calls to in-place variants). Then
    every kernel is compiled, ahead of its first call where the target predicts its types.

    Assumes generated drivers. Guarantees: a driver's arguments and outputs are unchanged; a
    buffer is reused only after its last reader (``memplan``)."""
    if memory_optim:
        for gen in gens:
            if gen is not None:
                gen.plan_memory()
        dump_after("memory_plan", lambda: "\n".join(
            f"== memory plan: segment {k} ==\n{g.memory_plan.describe('  ')}"
            for k, g in enumerate(gens) if g is not None and g.memory_plan is not None))
    precompile([job for gen in gens if gen is not None for job in gen.jobs])


def native_loops(program, part, gens, index, target, fetch_names, threads: tuple,
                 enabled: bool = True) -> dict:
    """``{segment index: NativeLoop or why not}`` for each reference segment whose op is a
    loop (``enabled=False``, the Executor's ``native_loops=False``: none runs natively, for
    debugging and comparison).

    Assumes the loop op declares ``ControlFlow(LOOP)``. Guarantees (``codegen.loops``): a
    native loop's function never writes its inputs, stops past the iteration bound with
    ``LIMIT_MESSAGE``, and draws each iteration's random numbers as the reference does."""
    out = {}
    for si, (seg, gen) in enumerate(zip(part.segments, gens)):
        if gen is not None:
            continue
        op = seg.groups[0].nodes[0].op
        opdef = registry.lookup(op.type)
        if opdef is None or opdef.control is None or opdef.control.kind != registry.LOOP:
            continue
        if not enabled:
            out[si] = "native_loops=False"
            continue
        if not target.native_drivers:
            out[si] = (f"the {target.name} target runs the loop on the host, launching the "
                       f"body's kernels, reading the condition each iteration")
            continue
        loop, why = native_loop(program, op, target.name, parallel=threads[0] > 1,
                                fetched=fetch_names)
        if loop is None:
            out[si] = why
            continue
        control = opdef.control
        compiled = compile_function(loop.source("loop"), "loop",
                                    parallel=loop.body.uses_prange, target=target.name,
                                    calls=loop.body.calls)
        body = program.block(op.attr(control.body))
        at = {id(o): i for i, o in enumerate(body.ops)}
        scopes = [n for n in op.output(control.step_scopes) if n != registry.EMPTY_VAR_NAME] \
            if control.step_scopes else []
        groups = [(compiled.first_line + line - 1, ops)
                  for line, ops in loop.body.group_lines(first=loop.body_line)]
        out[si] = NativeLoop(compiled, loop, op, index[id(op)],
                             "; ".join(g.describe() for g in loop.body.segment.groups),
                             body.idx, [(o, at[id(o)]) for o in loop.rng_ops], scopes, control,
                             groups)
    dump_after("native_loops", lambda: "\n".join(
        f"segment {si}: " + (v.description if isinstance(v, NativeLoop) else f"not: {v}")
        for si, v in sorted(out.items())))
    return out


def steps(program, block, ops, part, gens, loops, index, target, memory_optim: bool,
          native_drivers, strict: bool, threads: tuple) -> tuple:
    """``(steps, sources)``: the plan description's steps in order, and every generated
    ``(name, source)``. A native segment's host driver is built here (and, with
    ``native_drivers=True``, its native driver); ``"auto"`` (an inference block: one that
    writes no persistable) and ``"background"`` give each step how to build its native driver
    once hot. On a device target, an op with a CPU lowering but none for the target runs on the
    host: named in a warning once, an error in ``strict`` mode."""
    hot = native_drivers == "background" or \
        (native_drivers == "auto" and not _writes_persistable(block, ops))
    tiers = target.native_drivers and (native_drivers is True or hot)
    # which steps' native drivers may run on slices of the batch: analysed once a step of
    # this plan has a native driver (most plans never get one)
    states = functools.cache(lambda: _row_states(block, ops)) if tiers else None
    out, sources = [], []
    for si, (seg, gen) in enumerate(zip(part.segments, gens)):
        if gen is None:
            loop = loops.get(si, "")
            if isinstance(loop, NativeLoop):
                out.append(loop)
                sources.append((loop.compiled.name, loop.compiled.text))
                continue
            node = seg.groups[0].nodes[0]
            op, op_idx = node.op, index[id(node.op)]
            why = node.why_not + (f"; not a native loop: {loop}" if loop else "")
            named = False
            if target.device:
                host_why = _host_op(op, op_idx, target.name, why, strict)
                named, why = host_why != why, host_why
            opdef = registry.lookup(op.type)
            out.append(HostOp(op, op_idx, why, opdef.control if opdef is not None else None,
                              tuple(op.sub_block_indices())))
            if not named:  # (a host op of a device plan was named already)
                _warn_reference_step(op, node.why_not)
            continue
        compiled = target.host_driver(gen, memory_optim=memory_optim)
        groups = [[(op, index[id(op)]) for op in g.ops] for g in seg.groups]
        step_ops = [o for g in groups for o in g]
        step = NativeSegment(
            compiled, gen.args, gen.expected, gen.outputs, step_ops, groups,
            "; ".join(g.describe() for g in seg.groups), block, gen.lod_requests,
            _batch_arg(block, gen.args), _param_args(block, gen),
            [(op, index[id(op)]) for op in gen.rng_requests], tier_mode=native_drivers)
        if tiers:
            if native_drivers is True:
                step.native = _native_driver(gen, target, threads)
            elif hot:
                # built once hot: on one thread whatever the process's setting, so that one
                # compile (cached by content) serves every thread count; with more threads a
                # batch runs on slices of it (tiers.SplitDriver), and its trial against the
                # host driver (which runs parallel loop variants) keeps the faster
                step.build_native = functools.partial(_native_driver, gen, target, (1, 1),
                                                      derived=True)
            if gen.rng_requests or gen.lod_requests:
                step.split = lambda: (None, "its ops draw random numbers or read LoD offsets")
            else:
                step.split = lambda states=states, step_ops=step_ops, gen=gen: \
                    _split_rows(states(), step_ops, gen.args, gen.outputs)  # noqa: E731
        out.append(step)
        sources.append((compiled.name, compiled.text))
        if step.native is not None:
            sources.append((step.native.name, step.native.text))
    return out, sources


def compile_block(program, block=None, fetch_names=(), target=None, memory_optim: bool = False,
                  native_drivers: bool | str = False, keep_outputs: bool = False,
                  strict: bool = False, threads: tuple | None = None,
                  run_native_loops: bool = True) -> PlanDescription:
    """Run the stages on one block of ``program`` (the global block unless ``block``) for
    ``target`` (a :class:`pdjit.codegen.target.Target`; None: the host's) and return its
    :class:`PlanDescription`. Live after the block: ``fetch_names``, persistables, names other
    blocks read and, for a sub-block, every name it writes that is declared outside it.
    ``native_drivers``: False, True, ``"auto"`` or ``"background"`` (see :func:`steps`);
    a device target gets no memory plan and no native drivers. ``threads``: ``(threads a
    parallel loop may use, threads a host driver may run loops on)`` to generate the code for
    (None: ``target.threads()``, this process's setting; ``(1, 1)``: no parallel loop, as
    ahead-of-time code, which has no thread pool, wants). ``run_native_loops=False``: no loop op
    runs as one native function (each iteration runs the body's plan)."""
    from pdjit.codegen.target import host_target

    target = target if target is not None else host_target()
    if target.device:
        memory_optim = native_drivers = False
    target.prepare()
    threads = tuple(threads) if threads is not None else target.threads()
    block = program.global_block() if block is None else block
    ops, live = prune(program, block, fetch_names, keep_outputs)
    index = {id(op): i for i, op in enumerate(block.ops)}
    declined: set = set()
    while True:  # an op whose lowering declines runs its reference: partition again
        part = fusion(block, ops, live, target, declined)
        try:
            gens = generate(part, block, live, target, threads)
            break
        except Declined as d:
            declined.add(id(d.op))
    dump_after("fusion", part.describe)
    dump_after("generate", lambda: "\n\n".join(g.source("segment") for g in gens if g))
    memory_plan(gens, memory_optim)
    loops = native_loops(program, part, gens, index, target, fetch_names, threads,
                         run_native_loops)
    out, sources = steps(program, block, ops, part, gens, loops, index, target, memory_optim,
                         native_drivers, strict, threads)
    dump_after("steps", lambda: "\n".join(_outline(s) for s in out))
    return PlanDescription(out, part.describe(), sources, _fresh_names(part, gens, block),
                           block.idx)


def memory_lines(steps_, indent: str) -> list:
    """The memory plan of each native step's driver (when built with one): which
    intermediates share which slot buffer, and which are freed after which group."""
    lines = []
    for s in steps_:
        mp = s.compiled.memory_plan if s.kind == "native" else None
        if mp is not None:
            lines.append(f"{indent}== memory plan: {s.compiled.name} ==")
            lines.append(mp.describe(indent + "  "))
    return lines


# ---- helpers ------------------------------------------------------------------------------------
def _outline(step) -> str:
    """One line of the ``steps`` dump."""
    if step.kind == "reference":
        subs = f" (sub-blocks {list(step.sub_blocks)})" if step.sub_blocks else ""
        return f"reference {step.op.type}#{step.op_idx}{subs}: {step.why}"
    if step.kind == "native_loop":
        return f"native loop {step.op.type}#{step.op_idx} {step.compiled.name}: " \
               f"{step.description}"
    native = " + native driver" if step.native is not None else \
        " (native driver when hot)" if step.build_native is not None else ""
    return f"native {step.compiled.name}{native}: {step.description}"


_warned: set = set()
_BY_DESIGN = (registry.CONTROL_FLOW, registry.FEED_FETCH, registry.RANDOM, registry.SIDE_EFFECT)


def _warn_reference_step(op, why: str) -> None:
    """Say once per op type and reason that a compiled plan runs an op's reference. Control
    flow (its sub-blocks are what compiles), feed/fetch, random ops (initializers, dropout:
    they draw from the run's random stream) and side-effect ops (``print``) run that way by
    design and are not named."""
    opdef = registry.lookup(op.type)
    if opdef is not None and any(opdef.has(t) for t in _BY_DESIGN):
        return
    if (op.type, why) not in _warned:
        _warned.add((op.type, why))
        warnings.warn(f"op {op.type!r} runs its NumPy reference in compiled plans: {why}",
                      ReferenceStepWarning, stacklevel=user_stacklevel())


def _step_scopes_read(program, block, fetched=()) -> bool:
    """Whether some op reads, or the run fetches, the step scopes of an op that runs ``block``
    (a ``STEP_SCOPES`` output of the op owning it)."""
    scopes = set()
    for b in program.blocks:
        for op in b.ops:
            opdef = registry.lookup(op.type)
            if opdef is not None and opdef.has(registry.CONTROL_FLOW) and \
                    block.idx in op.sub_block_indices():
                for n in op.output_arg_names:
                    v = op.block._find_var_recursive(n)
                    if v is not None and v.type == pb.VarType.STEP_SCOPES:
                        scopes.add(n)
    return bool(scopes) and (bool(scopes & set(fetched)) or any(
        n in scopes for b in program.blocks for op in b.ops for n in op.input_arg_names))


def _host_op(op, op_idx: int, target: str, why: str, strict: bool) -> str:
    """The reason a device plan runs ``op`` on the host; an op that has a lowering on the host
    target but none for ``target`` is named in a warning (once per op type), or refused in
    strict mode. Ops that run their reference on every target (control flow, feed/fetch,
    random ops, ops without any lowering) are not named."""
    from pdjit.codegen.target import host_target

    opdef = registry.lookup(op.type)
    by_design = opdef is None or any(opdef.has(t) for t in _BY_DESIGN)
    if by_design or classify(op, host_target()).kind == REFERENCE:
        return why
    why = f"{why}: runs on the host, its inputs copied from the device"
    if strict:
        raise FallbackError(f"no {target} lowering: the op would run on the host (strict "
                            f"mode)", op.type, op.block.idx, op_idx, op.location())
    key = (op.type, target)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(describe_op(op.type, op.block.idx, op_idx, op.location()) +
                      f": no {target} lowering ({why})", FallbackWarning,
                      stacklevel=user_stacklevel())
    return why


def _writes_persistable(block, ops) -> bool:
    """Whether one of ``ops`` writes a persistable variable (a parameter, an optimizer's
    state, a batch norm's moving statistics): a training program, not inference."""
    for op in ops:
        for n in op.output_arg_names:
            v = block._find_var_recursive(n)
            if v is not None and v.persistable:
                return True
    return False


def _param_args(block, gen) -> list:
    """The indices of ``gen``'s arguments that are persistables it does not write."""
    out = []
    for i, n in enumerate(gen.args):
        v = block._find_var_recursive(n)
        if v is not None and v.persistable and n not in gen.defined:
            out.append(i)
    return out


def _batch_arg(block, names) -> int:
    """The index of the first argument whose leading dim is known only at run time (the batch),
    else 0."""
    for i, n in enumerate(names):
        v = block._find_var_recursive(n)
        if v is not None and v.shape and v.shape[0] < 0:
            return i
    return 0


def _native_driver(gen, target, threads: tuple, derived: bool = False):
    """The segment of ``gen`` as one native function (None when a lowering declines to be
    compiled code, or the native driver would bind other values); ``derived``: taking the
    values its lowerings derive from weights as arguments (a driver only the plan calls: not
    one an ahead-of-time artifact compiles)."""
    ngen = SegmentGen(gen.segment, gen.block, gen.needed_after,
                      parallel=threads[0] > 1, native=True, target=target.name,
                      derived_args=derived, inference=gen.inference)
    try:
        ngen.generate()
    except Declined:
        return None
    if list(ngen.args) != list(gen.args) or list(ngen.outputs) != list(gen.outputs) or \
            ngen.lod_requests or len(ngen.rng_requests) != len(gen.rng_requests):
        return None
    return target.native_driver(ngen)


def _row_states(block, ops) -> dict:
    """:func:`pdjit.passes.batch_rows.row_states` of ``ops``: a value no op wrote carries the
    batch when it is not persistable and its declared dim 0 is unknown (a feed); otherwise it
    is a constant (a parameter)."""
    def unwritten(name):
        v = block._find_var_recursive(name)
        if v is not None and not v.persistable and v.shape and v.shape[0] < 0:
            return batch_rows.BATCH
        return batch_rows.CONST

    return batch_rows.row_states(block, ops, unwritten)


def _split_rows(states, step_ops, args, outputs) -> tuple:
    """``(indices of the args sliced by rows, "")`` when the step's driver may run on slices
    of the batch, else ``(None, why not)``."""
    BATCH, CONST, NONE = batch_rows.BATCH, batch_rows.CONST, batch_rows.NONE
    first_read, last_write = {}, {}
    for op, i in step_ops:
        why, read, wrote = states[id(op)]
        if why:
            return None, f"op {op.type}#{i}: {why}"
        for n, v in read.items():
            first_read.setdefault(n, v)
        last_write.update(wrote)
    for n in outputs:
        if last_write.get(n) != BATCH:
            return None, f"output {n!r} does not carry the batch rows"
    rows = []
    for k, n in enumerate(args):
        v = first_read.get(n, CONST)
        if v == NONE:
            return None, f"input {n!r} is a value a split run does not keep"
        if v == BATCH:
            rows.append(k)
    if not rows:
        return None, "no input carries the batch"
    return tuple(rows), ""


def _fresh_names(part, gens, block) -> frozenset:
    """Values whose last writer is a native, non-view op and that are not persistable."""
    last_writer_native: dict = {}
    for seg, gen in zip(part.segments, gens):
        for g in seg.groups:
            for op in g.ops:
                opdef = registry.lookup(op.type)
                makes_new = gen is not None and opdef is not None and \
                    not opdef.has(registry.VIEW)
                for n in op.output_arg_names:
                    last_writer_native[n] = makes_new
    return frozenset(n for n, new in last_writer_native.items()
                     if new and not ((v := block._find_var_recursive(n)) is not None
                                     and v.persistable))


def _is_feed_fetch(op) -> bool:
    opdef = registry.lookup(op.type)
    return opdef is not None and opdef.has(registry.FEED_FETCH)
