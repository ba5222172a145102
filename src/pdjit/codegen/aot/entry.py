"""The entry of an ahead-of-time build: the plan descriptions of a program's blocks (the compile
pipeline's, for the ``aot`` target: every native step's driver one native function), checked
step by step for what an artifact can run, and one Python function that runs them, compiled by
Numba's ahead-of-time code generation with the drivers it calls (:mod:`.numba_aot`).

The entry takes the inputs and parameters as raw pointers and sizes, wraps them as arrays
(``numba.carray``), calls the steps' drivers in plan order with the values in locals, and copies
the fetched values into the caller's buffers. Control flow comes from the plan description: a
host op with a ``ControlFlow`` declaration (a branch, or a loop whose body did not become one
native loop) is Python control flow around the steps of its sub-blocks' plans, and an op
declaring ``Select`` (``cond``'s merges) picks by its mask; no op is known by its type or its
slot names.
"""
from __future__ import annotations

import re

import numba
import numpy as np

from pdjit.codegen import pipeline
from pdjit.codegen.aot.numba_aot import pointer
from pdjit.codegen.aot.target import NAME
from pdjit.codegen.target import get_target
from pdjit.framework import limits, registry
from pdjit.framework.dtypes import to_numpy
from pdjit.framework.errors import AotError
from pdjit.proto import framework_pb2 as pb

__all__ = ["AotPlan", "build_plans", "refuse_step", "has_loop", "reads", "entry", "culprit"]


def _select(op):
    """The ``registry.Select`` declaration of ``op`` (``cond``'s merges), or None."""
    return op.opdef.select if op.opdef is not None else None


def _driven(step) -> bool:
    """Whether the entry drives the host op ``step`` itself (``_Entry``): a branch or a loop
    (whose body could not become one native loop), as the description's ``control`` (the op's
    ``registry.ControlFlow``) says, or a merge the op declares by ``registry.Select``."""
    return step.control is not None or _select(step.op) is not None


def _is_loop(step) -> bool:
    return step.control is not None and step.control.kind == registry.LOOP


def _scalar_condition(step) -> bool:
    """Whether a control step's condition is one bool element (a loop's always is)."""
    c, op = step.control, step.op
    return c.kind == registry.LOOP or bool(c.scalar_condition and op.has_attr(
        c.scalar_condition) and op.attr(c.scalar_condition))


class AotPlan:
    """A block's plan description (:class:`pdjit.codegen.pipeline.PlanDescription`: its
    ``steps`` and ``block_idx``), and the plans of the blocks its control-flow ops run
    (``sub_plans(step)``), built alike."""

    def __init__(self, desc, built: dict):
        self.steps, self.block_idx, self._built = desc.steps, desc.block_idx, built

    def sub_plans(self, step) -> list:
        """``[(block idx, AotPlan)]`` of a host op's sub-blocks (those built)."""
        return [(b, self._built[b]) for b in getattr(step, "sub_blocks", ())
                if b in self._built]

    def walk(self):
        """Every step of this plan and of its sub-plans, depth first."""
        for step in self.steps:
            yield step
            for _, sub in self.sub_plans(step):
                yield from sub.walk()


def refuse_step(plan, step) -> str | None:
    """Why ``step`` (of ``plan``) cannot be compiled ahead of time, or None (for a
    control-flow op the entry drives, the first refusal in its sub-blocks' plans)."""
    if step.kind == "reference":
        if not _driven(step):
            return f"op {step.op.type!r} (#{step.op_idx}) has no native lowering ({step.why})"
        return _refuse_control(plan, step)
    if step.kind not in ("native", "native_loop"):
        op, i = step.ops[0]
        return f"op {op.type!r} (#{i}) runs as a {step.kind} step (not compiled ahead of time)"
    op, i = step.ops[0]
    code = step.native if step.kind == "native" else step.compiled
    if code is None:
        return f"op {op.type!r} (#{i}): its step has no native driver"
    if step.rng_ops:
        return f"op {step.rng_ops[0][0].type!r}: random ops are not compiled ahead of time"
    if getattr(step, "lod_requests", None) or any(
            o.opdef is not None and o.opdef.out_lod is not None for o, _ in step.ops):
        return f"op {op.type!r} (#{i}): LoD inputs are not compiled ahead of time"
    if code.parallel:
        return f"op {op.type!r} (#{i}): a parallel driver (build with one thread)"
    return None


def _refuse_control(plan, step) -> str | None:
    op, where = step.op, f"op {step.op.type!r} (#{step.op_idx})"
    if _select(op) is not None:
        return None
    want = list(op.sub_block_indices())
    subs = dict(plan.sub_plans(step))
    if sorted(subs) != sorted(want):
        return f"{where}: the plans of its sub-blocks {want} were not built"
    slot = step.control.condition
    if slot is None:  # a loop that counts its own runs (a recurrent op): the entry cannot drive it
        return f"{where}: a loop without a condition input is not compiled ahead of time"
    if _scalar_condition(step):
        conds = op.input(slot)
        if len(conds) != 1:
            return f"{where}: a scalar condition takes one {slot}, got {len(conds)}"
        cond = conds[0]
        v = op.block._find_var_recursive(cond)
        got = "undeclared" if v is None else np.dtype(to_numpy(v.dtype)).name
        if got != "bool":
            return f"{where}: its condition {cond!r} must be bool, got {got}"
    for b in want:
        for sub in subs[b].steps:
            why = refuse_step(subs[b], sub)
            if why is not None:
                return f"{why} (in block {b} of {where})"
    return None


def build_plans(program, fetch_names) -> AotPlan:
    """The global block's plan description (the compile pipeline's for the ``aot`` target,
    every native step's driver as one function) and, under each control-flow op's step, the
    plans of its sub-blocks built the same way (``AotPlan.sub_plans``)."""
    built: dict = {}
    target = get_target(NAME)   # the CPU's kernels, for one thread: no prange

    def build(block, fetched):
        plan = AotPlan(pipeline.compile_block(program, block, fetched, target=target,
                                              native_drivers=True), built)
        for step in plan.steps:
            for b in getattr(step, "sub_blocks", ()):
                if b not in built:
                    built[b] = None  # (a block being built: no recursion back into it)
                    built[b] = build(program.block(b), ())
        return plan

    return build(program.global_block(), fetch_names)


def has_loop(plan) -> bool:
    """Whether the plan (or a sub-plan) has a ``while``: such a model is not run on zeros at
    creation to size its memory (its loop need not end on zeros: "double until the sum
    reaches 100" never does)."""
    return any(step.kind == "native_loop" or
               (step.kind == "reference" and _is_loop(step)) for step in plan.walk())



def reads(plan):
    """The names the plan's steps read, in plan order, sub-plans at their op."""
    for step in plan.steps:
        if step.kind == "reference":
            yield from step.op.input_arg_names
            for _, sub in plan.sub_plans(step):
                yield from reads(sub)
        else:
            yield from step.args


def _writes(plan) -> list:
    """The names the plan's steps write (in sub-plans too), in plan order."""
    out = []
    for step in plan.steps:
        if step.kind != "reference":
            out += step.outputs
            continue
        sel = _select(step.op)
        if sel is not None:
            out += step.op.output(sel.out if sel.gather else sel.choices)
        for _, sub in plan.sub_plans(step):
            out += _writes(sub)
    return [n for n in out if n != registry.EMPTY_VAR_NAME]


class _Scope:
    """The entry's view of one block while its code is generated: the Python variable holding
    each name's latest value (``vars``), the flags of names that may hold no value yet
    (``flags``: a branch that did not run, a loop that ran no iteration), and the names whose
    variables belong to an enclosing block (``bound``: written in place, so that the value is
    there after the branch or loop)."""

    def __init__(self, vars_, flags, bound=frozenset()):
        self.vars, self.flags, self.bound = dict(vars_), dict(flags), frozenset(bound)

    def child(self, bound):
        return _Scope(self.vars, self.flags, bound)


class _Entry:
    """The source of the entry function: the plan's steps in order, control flow as Python
    control flow around them (compiled by Numba with the rest)."""

    def __init__(self, program):
        self.program, self.lines, self.ns = program, [], {"numba": numba, "np": np,
                                                          "_truth": _truth, "_nonempty": _nonempty,
                                                          "_index": _index}
        self.count = 0

    def fresh(self, prefix="v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def read(self, scope, name, indent: int, what: str) -> str:
        if name not in scope.vars:
            raise AotError(f"{what} reads {name!r}, which is neither fed, a parameter nor "
                           "computed before it")
        flag = scope.flags.pop(name, None)
        if flag is not None:   # checked once: known to hold a value from here on in this block
            self.emit(indent, f"if not {flag}:")
            self.emit(indent + 1, f"raise ValueError('pdjit: {_quote(name)} holds no value "
                                  f"(read by {_quote(what)})')")
        return scope.vars[name]

    def write(self, scope, name, expr: str, indent: int) -> None:
        if name in scope.bound:   # an enclosing block's variable: assigned in place
            self.emit(indent, f"{scope.vars[name]} = {expr}")
            flag = scope.flags.pop(name, None)
            if flag is not None:
                self.emit(indent, f"{flag} = True")
            return
        var = self.fresh()
        self.emit(indent, f"{var} = {expr}")
        scope.vars[name] = var
        scope.flags.pop(name, None)

    def prepare(self, scope, names, block, indent: int, what: str) -> None:
        """Give every name a branch or loop may write a variable of ``scope`` before it: its
        current one, or an empty array of its declared dtype and rank and a flag saying it
        holds no value yet."""
        for n in names:
            if n in scope.vars:
                continue
            v = block._find_var_recursive(n)
            if v is None or v.type not in (pb.VarType.LOD_TENSOR, pb.VarType.SELECTED_ROWS):
                kind = "not declared" if v is None else f"a {pb.VarType.Type.Name(v.type)}"
                raise AotError(f"{what} writes {n!r}, which is {kind} (only dense tensors are "
                               "compiled ahead of time)")
            dtype = np.dtype(to_numpy(v.dtype))
            self.ns[f"D_{dtype.name}"] = dtype.type
            var, flag = self.fresh(), self.fresh("f")
            shape = "(" + "0, " * len(v.shape) + ")"
            self.emit(indent, f"{var} = np.empty({shape}, D_{dtype.name})")
            self.emit(indent, f"{flag} = False")
            scope.vars[n], scope.flags[n] = var, flag

    def plan(self, plan, scope, indent: int) -> None:
        block = self.program.block(plan.block_idx)
        for step in plan.steps:
            if step.kind == "reference":
                self.control(plan, step, scope, block, indent)
                continue
            op, i = step.ops[0]
            what = f"op {op.type} (#{i}, block {block.idx})"
            fn = step.native.fn if step.kind == "native" else step.compiled.fn
            name = self.fresh("S")
            self.ns[name] = fn
            args = [self.read(scope, n, indent, what) for n in step.args]
            res = self.fresh("r")
            self.emit(indent, f"{res} = {name}({', '.join(args)})")
            for k, n in enumerate(step.outputs):
                self.write(scope, n, f"{res}[{k}]", indent)

    def control(self, plan, step, scope, block, indent: int) -> None:
        op = step.op
        what = f"op {op.type} (#{step.op_idx}, block {block.idx})"
        subs = dict(plan.sub_plans(step))
        sel, control = _select(op), step.control
        if sel is not None and sel.gather:
            choices = op.input(sel.choices)
            xs = [self.read_maybe(scope, n, what) for n in choices]
            m = self.fresh("m")
            mask = self.read(scope, op.input(sel.index)[0], indent, what)
            self.emit(indent, f"{m} = _index({mask}, {len(xs)})")
            out = self.fresh()
            self.emit(indent, f"{out} = {xs[0][0]}")
            for k, (var, flag) in enumerate(xs):
                self.emit(indent, f"{'if' if k == 0 else 'elif'} {m} == {k}:")
                if flag is not None:
                    self.emit(indent + 1, f"if not {flag}:")
                    self.emit(indent + 2, f"raise ValueError('pdjit: {_quote(choices[k])} "
                                          f"holds no value (selected by {_quote(what)})')")
                self.emit(indent + 1, f"{out} = {var}")
            self.write(scope, op.output(sel.out)[0], out, indent)
        elif sel is not None:
            outs = list(op.output(sel.choices))
            x = self.read(scope, op.input(sel.value)[0], indent, what)
            m = self.fresh("m")
            mask = self.read(scope, op.input(sel.index)[0], indent, what)
            self.emit(indent, f"{m} = _index({mask}, {len(outs)})")
            self.prepare(scope, outs, block, indent, what)
            for k, n in enumerate(outs):
                self.emit(indent, f"if {m} == {k}:")
                self.write(scope.child({n}), n, x, indent + 1)
        elif control is not None:
            b = op.attr(control.body)
            sub, sub_block = subs[b], self.program.block(b)
            conds = [self.read(scope, n, indent, what) for n in op.input(control.condition)]
            outer = [n for n in dict.fromkeys(_writes(sub)) if not sub_block.has_var(n)]
            self.prepare(scope, outer, block, indent, what)
            if _scalar_condition(step):
                test = f"_truth({conds[0]})"
            else:
                test = " and ".join(f"_nonempty({c})" for c in conds) or "True"
            # a loop re-reads its condition's variable (the body writes it) before each run,
            # and stops past PDJIT_MAX_LOOP_ITERATIONS (read when the model is built)
            loop = control.kind == registry.LOOP
            if loop:
                count, limit = self.fresh("n"), limits.bound(limits.MAX_LOOP_ITERATIONS)
                self.emit(indent, f"{count} = 0")
            self.emit(indent, f"{'while' if loop else 'if'} {test}:")
            if loop:
                self.emit(indent + 1, f"if {count} >= {limit}:")
                self.emit(indent + 2, f"raise ValueError('pdjit: {_quote(what)}: the loop still "
                                      f"holds its condition after {limit} iterations, the "
                                      f"bound PDJIT_MAX_LOOP_ITERATIONS={limit} when the "
                                      f"model was built')")
                self.emit(indent + 1, f"{count} += 1")
            self.emit(indent + 1, "pass")
            # a value the body may not have written yet is checked where the body reads it
            self.plan(sub, scope.child(outer), indent + 1)
        else:  # pragma: no cover - refuse_step lets no other op through
            raise AotError(f"{what}: not compiled ahead of time")

    def read_maybe(self, scope, name, what: str):
        """(variable, flag or None) of a value that may hold none (a branch that did not
        run): select_input checks the one it picks."""
        if name not in scope.vars:
            raise AotError(f"{what} reads {name!r}, which no step computes")
        return scope.vars[name], scope.flags.get(name)


def _quote(s: str) -> str:
    return s.replace("\\", "\\\\").replace("'", "\\'")


@numba.njit(cache=False)
def _truth(a):
    """The one element of a condition as a bool (Paddle's scalar condition)."""
    if a.size != 1:
        raise ValueError("pdjit: a condition must hold exactly one element")
    return bool(a.flat[0])


@numba.njit(cache=False)
def _nonempty(a):
    return a.size != 0


@numba.njit(cache=False)
def _index(a, n):
    """The mask of select_input/select_output: one integer in [0, n)."""
    if a.size != 1:
        raise ValueError("pdjit: a mask must hold exactly one element")
    i = int(a.flat[0])
    if i < 0 or i >= n:
        raise ValueError("pdjit: a mask is out of range")
    return i


def entry(program, plan: AotPlan, inputs: list, outputs: list, values: list) -> tuple:
    """``(the entry function, its argument types)``: ``entry(p0, n0_0.., w0.., q0, c0..,
    meta)`` wraps each input ``(name, dtype name, dims)`` of ``inputs`` (a pointer and its
    dims) and each parameter ``(name, array)`` of ``values`` (a pointer: its shape is the
    array's), runs ``plan``, checks each output of ``outputs`` against its buffer ``q`` of
    ``c`` elements (its dims written to ``meta``), copies it there and returns 0; 2: an output
    of another rank than declared, 3: a buffer too small (nothing copied). Compile it with
    :func:`.numba_aot.compile_object`."""
    from numba.core import types as nt

    gen = _Entry(program)
    top = _Scope({}, {})
    args, argtypes = [], []

    for k, (name, dtype, shape) in enumerate(inputs):
        dims = [f"n{k}_{d}" for d in range(len(shape))]
        args += [f"p{k}"] + dims
        argtypes += [pointer(dtype)] + [nt.int64] * len(shape)
        gen.write(top, name, f"numba.carray(p{k}, ({''.join(d + ', ' for d in dims)}))", 1)
    for k, (name, value) in enumerate(values):
        args.append(f"w{k}")
        argtypes.append(pointer(value.dtype))
        dims = "".join(f"{int(d)}, " for d in value.shape)
        gen.write(top, name, f"numba.carray(w{k}, ({dims}))", 1)
    gen.plan(plan, top, 1)
    body = []
    outs = [gen.read(top, name, 1, f"output {name!r}") if name in top.vars else None
            for name, _, _ in outputs]
    meta_len = max(1, sum(len(s) for _, _, s in outputs))
    body.append(f"mt = numba.carray(meta, ({meta_len},))")
    body.append("big = False")
    k = 0
    for i, (name, dtype, shape) in enumerate(outputs):
        if outs[i] is None:
            raise AotError(f"output {name!r}: nothing computes it")
        args += [f"q{i}", f"c{i}"]
        argtypes += [pointer(dtype), nt.int64]
        o = outs[i]
        if len(shape):
            body.append(f"if {o}.ndim != {len(shape)}:")
            body.append("    return 2")
        for d in range(len(shape)):
            body.append(f"mt[{k + d}] = {o}.shape[{d}]")
        k += len(shape)
        body.append(f"if {o}.size > c{i}:")
        body.append("    big = True")
    body.append("if big:")
    body.append("    return 3")
    for i, o in enumerate(outs):
        body.append(f"d{i} = numba.carray(q{i}, ({o}.size,))")
        body.append(f"for t, x in enumerate({o}.flat):")
        body.append(f"    d{i}[t] = x")
    body.append("return 0")
    args.append("meta")
    argtypes.append(nt.CPointer(nt.int64))
    src = f"def entry({', '.join(args)}):\n" + "".join(f"{line}\n" for line in gen.lines) + \
        "".join(f"    {line}\n" for line in body)
    exec(compile(src, "<pdjit aot entry>", "exec"), gen.ns)  # noqa: S102
    gen.ns["entry"].pdjit_source = src
    return gen.ns["entry"], argtypes


def culprit(plan, exc) -> str:
    """Which op's code Numba refused: the generated module and line its message names, looked
    up in the group map the generator recorded for each step's compiled driver."""
    text = str(exc)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and
                  "Failed in nopython" not in ln), type(exc).__name__)
    first = re.sub(r"\x1b\[[0-9;]*m", "", first)
    for m in re.finditer(r'(pdjit_gen_[0-9a-f]+)\.py", line (\d+)', text):
        for step in plan.walk():   # sub-blocks' steps too
            if step.kind == "native" and step.native is not None:
                code, groups = step.native, step.native.module_groups
            elif step.kind == "native_loop":
                code, groups = step.compiled, step.module_groups
            else:
                continue
            if code.name != m.group(1):
                continue
            ops = [ops for at, ops in groups if at <= int(m.group(2))]
            if ops:
                return f"op(s) [{ops[-1]}] have no code Numba compiles without Python " \
                       f"({first})"
    return f"Numba could not compile the model's native code ({first})"
