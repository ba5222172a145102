"""``compile_model``: a saved inference model to an AOT artifact directory (see ``pdjit.aot``)."""
from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numba
import numpy as np

from pdjit.aot import batch_split, csource, loader
from pdjit.aot.numba_aot import compile_object, pointer
from pdjit.codegen import pipeline
from pdjit.codegen.target import get_target
from pdjit.framework import limits, registry
from pdjit.framework.dtypes import to_numpy
from pdjit.framework.errors import PdjitError, ReferenceStepWarning
from pdjit.io.inference_model import load_model
from pdjit.passes.inference import optimize
from pdjit.proto import framework_pb2 as pb

SYMBOL = "pdjit_entry"
_ALIGN = 64


class AotError(PdjitError):
    """A model that cannot be compiled ahead of time (the message names the op or the value),
    or a toolchain that is missing or failed."""


@dataclass
class Spec:
    """What the C side needs to know: inputs/outputs ``(name, dtype, shape with -1)``, the byte
    offsets of the parameters in the params blob (in entry argument order), and its size and
    checksum."""
    inputs: list
    outputs: list
    param_names: list
    param_offsets: list
    params_bytes: int
    params_hash: int
    symbol: str = SYMBOL
    timings: dict = field(default_factory=dict)
    # the build's options (``compile_model``'s keywords): batch, fixed_batch, threads,
    # embed_params, cpu; the C source, the loader and the link read them from here
    options: dict = field(default_factory=dict)
    # what the user should know about the build (``pdjit compile`` prints them): ops saved in
    # training mode that the inference passes switched to their inference form
    notes: list = field(default_factory=list)


def checksum(blob: bytes) -> int:
    """The parameters' checksum model.c recomputes: over the blob's 64-bit words ``w_i``,
    the XOR of ``w_i * K1 + i * K2`` (mod 2**64)."""
    w = np.frombuffer(blob, np.uint64)
    i = np.arange(w.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = w * np.uint64(0x9E3779B97F4A7C15) + i * np.uint64(0xBF58476D1CE4E5B9)
    return int(np.bitwise_xor.reduce(mixed)) if w.size else 0


def _driven(op) -> bool:
    """Whether the entry drives ``op`` itself (``_Entry``): a branch or a loop (whose body
    could not become one native loop), declared by ``registry.ControlFlow``, and ``cond``'s
    merges, declared by ``registry.Select``."""
    d = op.opdef
    return d is not None and (d.control is not None or d.select is not None)


def _is_loop(op) -> bool:
    d = op.opdef
    return d is not None and d.control is not None and d.control.kind == registry.LOOP


def _scalar_condition(op) -> bool:
    """Whether a control op's condition is one bool element (a loop's always is)."""
    c = op.opdef.control
    return c.kind == registry.LOOP or bool(c.scalar_condition and op.has_attr(
        c.scalar_condition) and op.attr(c.scalar_condition))


class _Plan:
    """A block's plan description (:class:`pdjit.codegen.pipeline.PlanDescription`: its
    ``steps`` and ``block_idx``), and the plans of the blocks its control-flow ops run
    (``sub_plans(step)``), built alike."""

    def __init__(self, desc, built: dict):
        self.steps, self.block_idx, self._built = desc.steps, desc.block_idx, built

    def sub_plans(self, step) -> list:
        """``[(block idx, _Plan)]`` of a host op's sub-blocks (those built)."""
        return [(b, self._built[b]) for b in getattr(step, "sub_blocks", ())
                if b in self._built]

    def walk(self):
        """Every step of this plan and of its sub-plans, depth first."""
        for step in self.steps:
            yield step
            for _, sub in self.sub_plans(step):
                yield from sub.walk()


def _refuse_step(plan, step) -> str | None:
    """Why ``step`` (of ``plan``) cannot be compiled ahead of time, or None (for a
    control-flow op the entry drives, the first refusal in its sub-blocks' plans)."""
    if step.kind == "reference":
        if not _driven(step.op):
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
    if op.opdef.select is not None:
        return None
    want = list(op.sub_block_indices())
    subs = dict(plan.sub_plans(step))
    if sorted(subs) != sorted(want):
        return f"{where}: the plans of its sub-blocks {want} were not built"
    slot = op.opdef.control.condition
    if slot is None:  # a loop that counts its own runs (a recurrent op): the entry cannot drive it
        return f"{where}: a loop without a condition input is not compiled ahead of time"
    if _scalar_condition(op):
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
            why = _refuse_step(subs[b], sub)
            if why is not None:
                return f"{why} (in block {b} of {where})"
    return None


def _build_plans(program, fetch_names):
    """The global block's plan description (the compile pipeline's, every native step's
    driver as one function) and, under each control-flow op's step, the plans of its
    sub-blocks built the same way (``_Plan.sub_plans``)."""
    built: dict = {}
    target = get_target("aot")   # the CPU's kernels, for one thread: no prange

    def build(block, fetched):
        plan = _Plan(pipeline.compile_block(program, block, fetched, target=target,
                                            native_drivers=True), built)
        for step in plan.steps:
            for b in getattr(step, "sub_blocks", ()):
                if b not in built:
                    built[b] = None  # (a block being built: no recursion back into it)
                    built[b] = build(program.block(b), ())
        return plan

    return build(program.global_block(), fetch_names)


def compile_model(model_path, out_dir, batch: int = 1, cpu: str = "host",
                  params_file: str | None = None, *, fixed_batch: bool = False,
                  threads: int = 1, embed_params: bool = False,
                  prefix: str = csource.DEFAULT_PREFIX) -> Spec:
    """Compile the saved model at ``model_path`` (any layout ``pdjit.io.inference_model.load_model``
    reads) into ``out_dir`` (see ``pdjit.aot``). ``batch``: the batch the instances' memory is
    sized for at creation by default. ``cpu``: ``host`` (this machine's instruction set) or
    ``generic``. ``fixed_batch``: runs take 1 to ``batch`` rows and memory never grows (else
    any batch, memory re-sized after a bigger one). ``threads``, ``embed_params``: see
    ``pdjit.aot``. ``prefix``: of the C ABI's names (``PREFIX_model_create``; the library
    ``libPREFIX.so``, the header ``PREFIX.h``; default ``pdjit``: ``libmodel.so``,
    ``model.h``), for a program that links several artifacts.
    Raises :class:`AotError` for a model it cannot compile, naming the op."""
    if not isinstance(batch, int) or batch < 1:
        raise AotError(f"batch: expected an int >= 1, got {batch!r}")
    try:
        csource.check_prefix(prefix)
    except ValueError as e:
        raise AotError(str(e)) from None
    cc = shutil.which("cc")
    if cc is None:
        raise AotError("no C compiler: 'cc' is not on PATH")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):   # before the long part
        raise AotError(f"output {str(out_dir)!r}: expected a directory, got a file")
    t0 = time.perf_counter()
    model = load_model(model_path, params_file)
    notes = _training_mode_ops(model.program)
    program, params = optimize(model.program, model.params)
    gb = program.global_block()
    for n in model.feed_names:   # before the plan, whose refusal would name an op reading it
        v = gb._find_var_recursive(n)
        if v is not None and getattr(v, "lod_level", 0):
            raise AotError(f"{model_path}: cannot compile ahead of time: input {n!r} is a LoD "
                           f"tensor (lod_level {v.lod_level}); sequences are not compiled "
                           "ahead of time yet")
    with warnings.catch_warnings():
        # a step that runs its reference is refused below, naming the op: no warning too
        warnings.simplefilter("ignore", ReferenceStepWarning)
        plan = _build_plans(program, model.fetch_names)
    for step in plan.steps:
        why = _refuse_step(plan, step)
        if why is not None:
            raise AotError(f"{model_path}: cannot compile ahead of time: {why}")
    t_plan = time.perf_counter()

    def desc(name):
        v = gb._find_var_recursive(name)
        if v is None:
            raise AotError(f"{model_path}: variable {name!r} is not declared")
        return v

    def spec(n, what):
        """(name, dtype name, declared dims) of an input or output the ABI can carry."""
        v = desc(n)
        dtype = np.dtype(to_numpy(v.dtype)).name
        if dtype not in csource.DTYPES:
            raise AotError(f"{what} {n!r}: dtype {dtype} is not supported (expected one of "
                           f"{csource.DTYPES})")
        if what == "input" and getattr(v, "lod_level", 0):
            raise AotError(f"input {n!r} is a LoD tensor (lod_level {v.lod_level}): sequences "
                           "are not compiled ahead of time yet")
        if len(v.shape) > 8:   # model.c's shape tables hold 8 dims
            raise AotError(f"{what} {n!r}: rank {len(v.shape)} is not supported (expected at "
                           "most 8)")
        return n, dtype, [int(d) for d in v.shape]

    inputs = [spec(n, "input") for n in model.feed_names]
    outputs = [spec(n, "output") for n in model.fetch_names]
    # the parameters the steps read (in sub-blocks too), in first-use order
    used = []
    for n in _reads(plan):
        if n in params and n not in used and n not in model.feed_names:
            used.append(n)
    blob, offsets, values = bytearray(), [], []
    for n in used:
        a = np.ascontiguousarray(params[n])
        pad = (-len(blob)) % _ALIGN
        blob += b"\0" * pad
        offsets.append(len(blob))
        blob += a.tobytes()
        values.append((n, a))
    blob += b"\0" * ((-len(blob)) % _ALIGN)
    split, why_not = batch_split.analyse(program, plan, model.feed_names, model.fetch_names)
    spec = Spec(inputs, outputs, used, offsets, len(blob), checksum(bytes(blob)),
                options={"batch": batch, "fixed_batch": bool(fixed_batch),
                         "threads": threads, "embed_params": bool(embed_params), "cpu": cpu,
                         "batch_split": split, "batch_split_why_not": why_not,
                         "prefix": prefix,
                         "warm_up": not _has_loop(plan)})
    spec.notes = notes
    func, argtypes = _entry(program, plan, spec, values)
    t_src = time.perf_counter()
    try:
        obj, _ = compile_object(func, argtypes, SYMBOL, cpu=cpu)
    except numba.core.errors.NumbaError as e:
        raise AotError(f"{model_path}: cannot compile ahead of time: {_culprit(plan, e)}") \
            from None
    t_obj = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    _write_params(os.path.join(out_dir, "model.params"), spec, bytes(blob))
    _link(out_dir, obj, spec, cc, bytes(blob))
    with open(os.path.join(out_dir, "__init__.py"), "w") as f:
        f.write(loader.source(spec))
    _loader_bytecode(os.path.join(out_dir, "__init__.py"))
    with open(os.path.join(out_dir, "example.c"), "w") as f:
        f.write(csource.example_c(prefix))
    t_end = time.perf_counter()
    spec.timings = {"load+plan": t_plan - t0, "numba_aot": t_obj - t_src,
                    "link": t_end - t_obj, "total": t_end - t0}
    return spec


def _loader_bytecode(path) -> None:
    """The loader's bytecode for this Python, beside it in ``__pycache__``, checked against the
    source's hash (not its mtime: still valid in a copy of the directory, and recompiled if the
    source is edited): a process that may not write bytecode (PYTHONDONTWRITEBYTECODE, a
    read-only directory) would otherwise compile the loader at every start (4-12 ms here).
    Another Python version compiles it as usual."""
    import importlib.util
    import py_compile

    try:
        py_compile.compile(path, cfile=importlib.util.cache_from_source(path), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except (py_compile.PyCompileError, NotImplementedError, OSError) as e:  # a speed-up only
        warnings.warn(f"{path}: the loader's bytecode was not written ({e})", stacklevel=3)


def _has_loop(plan) -> bool:
    """Whether the plan (or a sub-plan) has a ``while``: such a model is not run on zeros at
    creation to size its memory (its loop need not end on zeros: "double until the sum
    reaches 100" never does)."""
    return any(step.kind == "native_loop" or
               (step.kind == "reference" and _is_loop(step.op)) for step in plan.walk())


def _training_mode_ops(program) -> list:
    """A note for each op the saved program runs in training mode (``is_test`` False, e.g. a
    random ``dropout``): the inference passes run it in its inference form, as
    ``pdjit.inference``'s predictor and Paddle Inference do, where ``Executor.run`` on the saved
    program would not."""
    notes = []
    for b in program.blocks:
        for i, op in enumerate(b.ops):
            if op.has_attr("is_test") and op.attr("is_test") is False:
                notes.append(f"op {op.type!r} (#{i}, block {b.idx}) was saved in training mode "
                             "(is_test=False): compiled in its inference form, as "
                             "pdjit.inference's predictor runs it")
    return notes


def _reads(plan):
    """The names the plan's steps read, in plan order, sub-plans at their op."""
    for step in plan.steps:
        if step.kind == "reference":
            yield from step.op.input_arg_names
            for _, sub in plan.sub_plans(step):
                yield from _reads(sub)
        else:
            yield from step.args


def _writes(plan) -> list:
    """The names the plan's steps write (in sub-plans too), in plan order."""
    out = []
    for step in plan.steps:
        if step.kind != "reference":
            out += step.outputs
            continue
        sel = step.op.opdef.select if step.op.opdef is not None else None
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
        sel, control = op.opdef.select, op.opdef.control
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
            if _scalar_condition(op):
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
        else:  # pragma: no cover - _refuse_step lets no other op through
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


def _entry(program, plan, spec, values):
    """The entry function (compiled below) and its argument types."""
    from numba.core import types as nt

    gen = _Entry(program)
    top = _Scope({}, {})
    args, argtypes = [], []

    for k, (name, dtype, shape) in enumerate(spec.inputs):
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
            for name, _, _ in spec.outputs]
    meta_len = max(1, sum(len(s) for _, _, s in spec.outputs))
    body.append(f"mt = numba.carray(meta, ({meta_len},))")
    body.append("big = False")
    k = 0
    for i, (name, dtype, shape) in enumerate(spec.outputs):
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


def _culprit(plan, exc) -> str:
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


def _write_params(path, spec, blob: bytes) -> None:
    head = b"PDJITPRM" + struct.pack("<4Q", 1, len(spec.param_offsets), spec.params_bytes,
                                     spec.params_hash)
    with open(path, "wb") as f:
        f.write(head + blob)


def _openblas_files() -> list:
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "*.so*")))
    if not any("openblas" in os.path.basename(f) for f in found):
        raise AotError(f"NumPy's OpenBLAS was not found in {libs} (the library links it)")
    return found


def _place(src: str, dst: str) -> None:
    """``dst``: the file ``src`` (NumPy's BLAS, 28 MB with what it needs), a hard link where
    the file system allows one (no space taken; the artifact's directory still holds a file
    of its own, moved or deleted with it), else a copy."""
    try:
        if os.path.lexists(dst):
            os.unlink(dst)
        os.link(src, dst)
    except OSError:  # another device, a file system without links, a protected file
        shutil.copy2(src, dst)


def _link(out_dir, obj: bytes, spec: Spec, cc: str, blob: bytes) -> None:
    """Link ``libmodel.so`` (``csource.files``: ``libPREFIX.so``) from the entry's object and
    the C of ``csource.build_files`` (``blob``: the parameters, for a build that embeds them;
    ``csource.extra_sources`` may add files, e.g. an assembler file that includes the blob).
    Only the API is exported (``csource.version_script``), and the library's own
    references to it bind to itself (``-Bsymbolic``: another artifact loaded before it with the
    same names, e.g. ``RTLD_GLOBAL``, does not take its calls)."""
    libs = _openblas_files()
    for f in libs:
        dst = os.path.join(out_dir, os.path.basename(f))
        if not os.path.exists(dst) or os.path.getsize(dst) != os.path.getsize(f):
            _place(f, dst)
    blas = next(os.path.basename(f) for f in libs if "openblas" in os.path.basename(f))
    prefix = csource.options(spec)["prefix"]
    libname, header = csource.files(prefix)
    with open(os.path.join(out_dir, header), "w") as f:
        f.write(csource.header(prefix))
    with tempfile.TemporaryDirectory(prefix="pdjit-aot-") as tmp:
        paths = {}
        files = csource.build_files(spec) + csource.extra_sources(spec, blob, tmp)
        for name, text in files:
            paths[name] = os.path.join(tmp, name)
            with open(paths[name], "w") as f:
                f.write(text)
        script = os.path.join(tmp, "exports.map")
        with open(script, "w") as f:
            f.write(csource.version_script(prefix))
        o = os.path.join(tmp, "entry.o")
        with open(o, "wb") as f:
            f.write(obj)
        out = os.path.join(out_dir, libname)
        units = [p for name, p in paths.items() if not name.endswith(".h")]
        cmd = [cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{out_dir}", f"-I{tmp}",
               *units, o, "-o", out, f"-L{out_dir}",
               f"-l:{blas}", "-lm", "-ldl", "-lpthread", "-Wl,-rpath,$ORIGIN",
               "-Wl,--no-undefined", f"-Wl,--version-script={script}",
               f"-Wl,-soname,{libname}", "-Wl,-Bsymbolic"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise AotError(f"linking {out} failed ({' '.join(cmd)}):\n{r.stderr[-4000:]}")
