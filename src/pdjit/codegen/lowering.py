"""Segment -> a host driver calling one compiled kernel per fusion group.

Each group of a segment becomes a kernel whose text is a function of the group alone (op types
and emit rules, dtypes, ranks, the loop form; never variable names, sizes or numeric attribute
values, which are run-time arguments), so identical layers, programs and processes share one
compiled kernel (``pdjit.codegen.compiler``):

- elementwise / reduction groups: a :class:`~pdjit.codegen.kernel.LoopKernel` description,
  rendered by the target (``pdjit.codegen.cpu.target``) with one loop form chosen from the static
  shapes. The kernel takes its outputs as arguments; the driver computes the run-time shape,
  checks it, allocates, and calls;
- opaque groups: the lines the op's ``Opaque.lower`` gives, as a kernel of their own (inputs as
  parameters, outputs returned), or, for a ``host`` lowering (library calls such as GEMM, and
  views), as lines of the driver itself: nothing to compile.

The driver's lines are valid Python (a plan runs them as a Python function: nothing compiles
but the kernels) and valid under Numba (a native loop compiles them inside its ``while``).

A shape problem raises ``ValueError``; the executor then re-runs the segment with the op
references, which either report the precise error or give the answer.
"""
from __future__ import annotations

import ast
import functools
import math
import re
import string

import numpy as np

from pdjit.codegen import memplan
from pdjit.codegen.compiler import Compiled, HostFunction, compile_function, kernel_cost
from pdjit.codegen.kernel import (
    FLAT_FORMS,
    FULL,
    Leaf,
    LoopKernel,
    ReduceSpec,
    choose_form,
    place_leaf,
)
from pdjit.codegen.target import get_target
from pdjit.framework import registry, scalars
from pdjit.framework.errors import ShapeMismatch
from pdjit.passes.fusion import (
    ELEMENTWISE,
    OPAQUE,
    REDUCTION,
    ROW_PROLOGUE,
    Group,
    Segment,
    numpy_type_name,
)
from pdjit.proto import framework_pb2 as pb

# attribute types passed to kernels as run-time arguments rather than written into their text
_NUMERIC_ATTRS = (pb.AttrType.FLOAT, pb.AttrType.FLOAT64)
_RESERVED = re.compile(r"a\d*")


def _unreserved(hint: str) -> str:
    """A hint for a fresh local that cannot produce a parameter's name (``a<n>``)."""
    return hint + "_" if _RESERVED.fullmatch(hint) else hint


def literal(value) -> str:
    """A Python literal for an attribute value inside generated code."""
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            return "math.nan"
        if math.isinf(v):
            return "math.inf" if v > 0 else "-math.inf"
        return repr(v)
    if isinstance(value, (list, tuple)):
        return "(" + "".join(literal(v) + ", " for v in value) + ")"
    return repr(value)


# names a device kernel's lines use that are not the driver's arrays
_KERNEL_NAMES = frozenset({"np", "math", "_m", "cuda", "range", "int", "float", "bool", "abs",
                           "min", "max", "True", "False", "None", "if", "else", "elif", "and",
                           "or", "not", "for", "in", "while", "return", "is", "pass"})


def weight_var(op, name: str):
    """The variable ``name`` (an input of ``op``) where it is a weight: persistable and written
    by no op of the program (a value derived from it, packed or transformed, made once stays
    valid from run to run); else None."""
    v = op.block._find_var_recursive(name)
    if v is None or not v.persistable or name in op.block.program.written_names():
        return None
    return v


def _channel_vector(op, spec, var, made: set, shape: tuple, dt, axis: int):
    """``("scale", name)`` or ``("shift", name)`` where ``op`` (declared
    :class:`~pdjit.framework.registry.ChannelAffine`, ``spec``) multiplies or adds a vector
    ``name`` of one value per channel along ``axis`` of an input of ``shape`` (any shape the
    declaration reads as ``[C]``: ``[1, C, 1, 1]``), a value of type ``dt`` not made in
    ``made``; else None. ``var`` finds a variable by name."""
    if len(spec.params) != 1 or spec.axis % len(shape) != axis % len(shape):
        return None
    (slot,) = spec.params
    ys = [n for n in op.input(slot) if n != registry.EMPTY_VAR_NAME]
    v = var(ys[0]) if len(ys) == 1 and ys[0] not in made else None
    m = shape[axis]
    if v is None or m < 1 or math.prod(v.shape) != m or np.dtype(v.dtype) != dt:
        return None
    # (a probe of the vector's own shape: the declaration says whether values of that shape
    # are one per channel)
    probe = np.arange(1.0, m + 1.0)
    try:
        coef = spec.coefficients({slot: probe.reshape(v.shape)})
    except Exception:  # noqa: BLE001 - a declaration that does not take a probe
        return None
    if coef is None or (coef[0] is None) == (coef[1] is None):
        return None
    got = coef[0] if coef[0] is not None else coef[1]
    if not np.array_equal(np.asarray(got, np.float64), probe):
        return None
    return ("scale" if coef[0] is not None else "shift"), ys[0]


class Declined(Exception):
    """An opaque op's lowering returned None: the op must run its reference instead."""

    def __init__(self, op):
        super().__init__(op.type)
        self.op = op


def _lowered(node, ctx) -> "list | None":
    """An opaque lowering's lines, or None where it declines. A lowering that finds the op's
    declared shapes inconsistent (``ShapeMismatch``: a damaged or hand-edited program) declines
    too: the op's reference then says what is wrong, naming the op."""
    try:
        return node.lowering.lower(ctx)
    except ShapeMismatch:
        return None


class ChannelEpilogue:
    """What an opaque op computed by blocks may apply as it stores its output (see
    ``LowerContext.channel_epilogue``): ``minimum(maximum(out + bias[c] + residual, lo), hi)``
    per channel ``c``, then ``gate`` where there is one; ``bias``: the name of the bias vector
    (None: no add); ``residual``: the name of a value of the output's shape added after it
    (None: none); ``gate``: a :class:`~pdjit.framework.registry.Gate` applied last (None:
    none); ``names``: the values of the elementwise ops it replaces, in order (the last is the
    result; the first is the bias add's where there is one, the residual's add the next, the
    gate's last)."""

    def __init__(self, names: list, bias: str | None, lo: float, hi: float,
                 residual: str | None = None, gate: "registry.Gate | None" = None):
        self.names, self.bias, self.lo, self.hi = names, bias, lo, hi
        self.residual, self.gate = residual, gate

    def without_residual(self) -> "ChannelEpilogue | None":
        """The part before the residual's add (None: nothing)."""
        if self.residual is None:
            return self
        if self.bias is None:
            return None
        return ChannelEpilogue(self.names[:1], self.bias, -math.inf, math.inf)

    def without_gate(self) -> "ChannelEpilogue | None":
        """The part before the gate (None: nothing)."""
        if self.gate is None:
            return self
        if len(self.names) == 1:
            return None
        return ChannelEpilogue(self.names[:-1], self.bias, self.lo, self.hi, self.residual)


class ChannelPrologue:
    """What an opaque op may apply to its input ``name`` as it reads it (see
    ``LowerContext.channel_prologue``): ``minimum(maximum(source * scale[c] + shift[c], lo),
    hi)`` per channel ``c`` of ``source``, the value the elementwise ops before the op compute
    from it; ``scale``, ``shift``: the names of the vectors (None: no product, no sum)."""

    def __init__(self, source: str, name: str, scale: str | None, shift: str | None,
                 lo: float, hi: float):
        self.source, self.name = source, name
        self.scale, self.shift, self.lo, self.hi = scale, shift, lo, hi


class LowerContext:
    """What an ``Opaque.lower`` sees: value names, ranks, dtypes, attributes, fresh names."""

    def __init__(self, gen: "SegmentGen", node, prologue: "Prologue | None" = None):
        self.gen, self.node, self.op = gen, node, node.op
        opdef = registry.get(self.op.type)
        self.attrs = opdef.attr_values(self.op.all_attrs())
        self.prologue = prologue
        # inputs mean the values before the op: bind them now, before any output is defined
        # (an in-place op such as an optimizer update writes ParamOut into Param's name); a
        # value a prologue computes row by row is never an array
        fed = prologue.name if prologue is not None else None
        # (a value an offered channel prologue computes is read as its source)
        self.pre_offer = pre = getattr(gen, "prologue_offer", None)
        through = pre.name if pre is not None and pre.name in self.op.input_arg_names else None
        self._inputs = {n: gen.read(n) for n in self.op.input_arg_names
                        if n != registry.EMPTY_VAR_NAME and n != fed and n != through}
        if through is not None:
            self._inputs[through] = gen.read(pre.source)
        self.offer = None      # a ChannelEpilogue the op may apply (see channel_epilogue)
        self.taken = False
        self.residual = None   # (the flat view passed, the local of the value) once taken
        self.library_calls: list = []  # the library functions named by lib_fn, in order

    def channel_epilogue(self, T: str, lines: list, residual: bool = False,
                         gate: bool = False) -> list:
        """Source of ``[bias, lo, hi]`` (``residual``: ``[bias, lo, hi, res]``; ``gate``:
        then ``g``) for an ``Opaque.blocked`` lowering whose function stores its output
        ``out`` of channels ``c`` (the axis its lowering declares: ``Opaque.channel_axis``) as
        ``g(minimum(maximum(out + bias[c] + res, lo), hi))`` (``bias``, ``res`` empty:
        no add; ``res`` a value of ``out``'s shape, flat; ``lo``, ``hi``: floats; ``g`` an
        array of type ``T``, a :class:`~pdjit.framework.registry.Gate`'s values, empty: none).
        Where the elementwise ops after the op start with such a per-channel add, a residual
        add (where the function takes one), a clamp and a gate (where it takes one; declared:
        ``ChannelAffine``, ``ADDITION``, ``Clamp``, ``Gate``) that nothing else needs the
        values between, calling this takes them (no kernel computes them again: the op's
        output holds their result); else the arguments ask for nothing (an empty bias,
        residual and gate of NumPy type ``T``, infinite bounds). Lines that bind them are
        appended to ``lines``."""
        off = self.offer
        if off is not None and not gate:
            off = self.offer = off.without_gate()
        if off is not None and not residual:
            off = self.offer = off.without_residual()
        if off is None or off.bias is None or (residual and off.residual is None):
            e = self.tmp("nb")
            lines.append(f"{e} = np.empty(0, {T})")
        tail = [e] if residual and (off is None or off.residual is None) else []
        if gate and (off is None or off.gate is None):
            g = self.tmp("ng")
            lines.append(f"{g} = np.empty(0, {T})")
        if off is None:
            return [e, literal(-math.inf), literal(math.inf)] + tail + ([g] if gate else [])
        self.taken = True
        b = self.gen.read(off.bias) if off.bias is not None else e
        if off.bias is not None and len(self.gen.block._find_var_recursive(off.bias).shape) != 1:
            b, src = self.tmp("nb"), b  # (a bias of shape [1, C, 1, 1]: its values as a vector)
            lines.append(f"{b} = {src}.reshape({src}.size)")
        if residual and off.residual is not None:
            r = self.tmp("res")
            src = self.gen.read(off.residual)
            lines.append(f"{r} = {src}.reshape({src}.size)")
            tail = [r]
            self.residual = (r, src)
        if gate and off.gate is not None:
            g = self.tmp("g")
            lines.append(f"{g} = np.array(({', '.join(literal(v) for v in off.gate.values())}"
                         f"), {T})")
        return [b, literal(off.lo), literal(off.hi)] + tail + ([g] if gate else [])

    def channel_prologue(self, slot: str, T: str, lines: list) -> list | None:
        """Source of ``[scale, shift, lo, hi]`` for a lowering that declares
        ``Opaque.channel_prologue`` (the input ``slot`` it names for this op), whose function
        reads that input as ``minimum(maximum(x * scale[c] + shift[c], lo), hi)`` per channel
        ``c`` (``scale``, ``shift`` arrays of type ``T``, empty: none; ``lo``, ``hi`` floats):
        where the code generator offered the elementwise ops before the op that compute the
        input so, ``ctx.inp(slot)`` is already their source and calling this takes them (they
        never run); else None. A lowering whose declaration names the slot for the op must
        call this. Lines that bind the vectors are appended to ``lines``."""
        off = self.pre_offer
        if off is None or self.op.input(slot) != [off.name]:
            return None
        self.gen.prologue_offer = None  # (taken)
        vecs = []
        for v in (off.scale, off.shift):
            t = self.tmp("pv")
            if v is None:
                lines.append(f"{t} = np.empty(0, {T})")
            else:
                src = self.gen.read(v)
                lines.append(f"{t} = {src}.reshape({src}.size)")
            vecs.append(t)
        return vecs + [literal(off.lo), literal(off.hi)]

    @property
    def _target(self):
        """The :class:`~pdjit.codegen.target.Target` object of the driver being generated."""
        return self.gen.target

    @property
    def lib(self) -> str:
        """The name the target's library of kernels has in the lines (``_nn``, ``_cu``)."""
        return self._target.library

    def lib_fn(self, name: str) -> str:
        """How the lines name the function ``name`` of the target's library (``"pad3d"``, or
        ``"conv._fwd_range"``: a function of one of its modules), recorded in
        ``library_calls``: the code generator predicts the library kernels to compile from
        the functions a lowering named, never from its lines' text."""
        self.library_calls.append(name)
        return f"{self._target.library}.{name}"

    def derived(self, name: str, args: list, consts: tuple = ()) -> "str | None":
        """Where the driver is a native one built to take derived values
        (``SegmentGen.derived_args``): the argument holding ``name(*args, *consts)``, a function
        of the target's library deriving a value from weights (:func:`weight_var`): ``args``
        the op's inputs, ``(slot, index)`` each, or a list of them for a tuple of arrays;
        ``consts`` Python values. The host computes it before each call from the weights'
        arrays, kept while they are the same arrays: no compiled code makes it again at each
        run. Else None (the lines compute the value themselves)."""
        if not self.gen.derived_args:
            return None
        names = [[self.op.input(s)[i] for s, i in a] if isinstance(a, list)
                 else self.op.input(a[0])[a[1]] for a in args]
        flat = [n for a in names for n in (a if isinstance(a, list) else [a])]
        if any(weight_var(self.op, n) is None for n in flat):
            return None
        return self.gen.derived_arg(name, names, consts)

    @property
    def device(self) -> bool:
        """Whether the lines are for a device target (values in device memory; the host
        driver only launches)."""
        return self._target.device

    def has_input(self, slot: str) -> bool:
        return bool([n for n in self.op.input(slot) if n != registry.EMPTY_VAR_NAME])

    def has_output(self, slot: str) -> bool:
        return bool([n for n in self.op.output(slot) if n != registry.EMPTY_VAR_NAME])

    def inp(self, slot: str, i: int = 0) -> str:
        return self._inputs[self.op.input(slot)[i]]

    def out(self, slot: str, i: int = 0, shape: str | None = None, zero: bool = False) -> str:
        """The local name of output ``slot``'s value. With ``shape`` (a source expression over
        the op's inputs and offsets, e.g. ``f"{X}.shape"``) the driver allocates the array (of
        the output variable's dtype; zeroed with ``zero``) and passes it in: the lines only
        write it (destination passing). Without, the lines must bind the name themselves (a
        view, or a size known only from values inside the kernel)."""
        name = self.op.output(slot)[i]
        if shape is None:
            return self.gen.define(name)
        return self.gen.define_out(name, shape, numpy_type_name(self._var(name).dtype), zero)

    def out_or_scratch(self, slot: str, shape: str, T: str, lines: list) -> str:
        """Output ``slot`` allocated by the driver (``out(slot, shape=shape)``) when the op
        binds it, else a scratch array of that shape and NumPy type ``T`` made by a line
        appended to ``lines``: for library kernels that write every output they compute."""
        if self.has_output(slot):
            return self.out(slot, shape=shape)
        t = self.tmp("u")
        lines.append(f"{t} = np.empty({shape}, {T})")
        return t

    def whole_batch(self, slot: str, spec) -> list:
        """The lines of ``spec``, what the op's ``Opaque.blocked`` lowering returned (with
        nothing offered: no epilogue), that compute output ``slot`` for the whole batch: for a
        plain lowering that runs the same kernels as its blocked form."""
        lines, fn, before, after, work = spec
        y = self.gen.current[self.op.output(slot)[0]]
        return list(lines) + [self.gen.batch_call(y, fn, before, after, work)]

    def _var(self, name):
        return self.op.block._find_var_recursive(name)

    def shape(self, slot: str, i: int = 0) -> tuple:
        """The build-time shape of slot ``slot``'s value (``-1``: known at run time)."""
        names = self.op.input(slot) or self.op.output(slot)
        return tuple(self._var(names[i]).shape)

    def rank(self, slot: str, i: int = 0) -> int:
        names = self.op.input(slot) or self.op.output(slot)
        return len(self._var(names[i]).shape)

    def dtype(self, slot: str, i: int = 0) -> np.dtype:
        names = self.op.input(slot) or self.op.output(slot)
        return self._var(names[i]).dtype

    def T(self, slot: str, i: int = 0) -> str:  # noqa: N802 - mirrors the templates' {T}
        return numpy_type_name(self.dtype(slot, i))

    @staticmethod
    def prod(local: str, lo: int, hi: int) -> str:
        """Source for the product of ``local.shape[lo:hi]`` (``1`` when empty)."""
        return " * ".join(f"{local}.shape[{i}]" for i in range(lo, hi)) or "1"

    def as_rows(self, local: str, rank: int) -> str:
        """Source viewing ``local`` (of ``rank`` >= 1) as rows of its last axis: a 2-D array."""
        return f"{local}.reshape(({self.prod(local, 0, rank - 1)}, {local}.shape[{rank - 1}]))"

    @staticmethod
    def tuple_src(items) -> str:
        return "(" + "".join(f"{i}, " for i in items) + ")"

    def tmp(self, hint: str = "t") -> str:
        return self.gen.fresh(hint)

    def used(self, slot: str, i: int = 0) -> bool:
        """Whether output ``slot``'s value is read after this op (by a later op of the segment
        or after the segment): a lowering may skip computing an unused output."""
        name = self.op.output(slot)[i]
        if name in self.gen.needed_after:
            return True
        ops = [op for g in self.gen.segment.groups for op in g.ops]
        at = next(k for k, op in enumerate(ops) if op is self.op)
        return any(name in op.input_arg_names for op in ops[at + 1:])

    def loop(self, var: str, count: str, body: list, size: str | None = None,
             work: int = 1) -> list:
        """Source of ``for var in range(count): body``, run on threads (``numba.prange``) when
        ``size`` (an element count) is large and a thread count above one was asked for;
        iterations must write disjoint memory. (Not by default: the kernel is then compiled
        with ``parallel=True``, which cost 1.7 s more for a softmax's first run, measured.)
        ``work``: an element's cost in elementwise ops (the target's ``parallel_min_size`` is
        for those), so that loops of costlier elements split from fewer."""
        if self._target.device:  # the iterations are a kernel's threads
            return self.device_loop(var, count, body)
        indented = ["    " + line for line in body]
        if not (self.gen.parallel and size):
            return [f"for {var} in range({count}):"] + indented
        self.gen.uses_prange = True
        return ([f"if {size} >= {max(1, self.gen.parallel_min_size // work)}:",
                 f"    for {var} in numba.prange({count}):"]
                + ["    " + line for line in indented]
                + ["else:", f"    for {var} in range({count}):"]
                + ["    " + line for line in indented])

    def rng_key(self) -> str:
        """The local name of this op's random stream key for the current run (a ``np.uint64``
        bound at run time: the key the op's reference would draw with, see
        ``RunContext.rng_key``), for a ``RANDOM`` op generating its numbers in its lines
        (``pdjit.framework.random``: element ``i`` from ``mix64(key + (i + 1) * GOLDEN)``)."""
        return self.gen.rng_arg(self.op)

    def row_input(self, slot: str) -> "RowInput":
        """How a row-wise lowering (one that declares ``row_prologue``, see
        :data:`ROW_PROLOGUE`) reads input ``slot``: as rows of its last axis, each row's
        elements read once, in order, in a first loop over the row. Either the array's rows,
        or, when the fusion partition gave the op a prologue, the elementwise chain that
        computes the value, evaluated element by element inside that loop (the value never
        exists as an array)."""
        if self.prologue is not None and self.op.input(slot)[0] == self.prologue.name:
            return self.prologue.row_input(self)
        X = self.inp(slot)
        r = self.rank(slot)
        x2 = self.tmp("x")
        return RowInput([f"{x2} = {self.as_rows(X, r)}"], f"{X}.shape", f"{x2}.shape[0]",
                        f"{x2}.shape[1]", lambda i: [],
                        lambda i, j, var: [f"{var} = {x2}[{i}, {j}]"])

    def device_loop(self, var: str, count: str, body: list, before=()) -> list:
        """Driver lines running ``for var in range(count): body`` on a device target as one
        grid-stride kernel (``before``: scalar lines each thread runs first). The lines read
        and write the driver's arrays by name (each becomes a kernel parameter, renamed so
        the kernel's text does not depend on the driver's local names); iterations must write
        disjoint elements (lines of ``before`` writing an element write the same value in
        every thread), and may call only what a kernel can (``math``, ``_m``, ``np``'s
        scalar functions)."""
        lines = list(before) + list(body)
        assigned = {var} | {name for line in lines
                            for name in re.findall(r"(?<![.\w])([A-Za-z_]\w*)\s*[+\-*/]?=(?!=)",
                                                   line)}
        assigned |= {m for line in lines for m in re.findall(r"\bfor\s+(\w+)\s+in\b", line)}
        params: list = []
        for line in lines:
            for m in re.finditer(r"(?<![.\w])([A-Za-z_]\w*)\b", line):
                name = m.group(1)
                if name in assigned or name in _KERNEL_NAMES or name in params or \
                        line[m.end():].lstrip().startswith("("):
                    continue
                params.append(name)
        rename = {p: f"k{i}" for i, p in enumerate(params)}

        def sub(line):
            return re.sub(r"(?<![.\w])([A-Za-z_]\w*)\b",
                          lambda m: rename.get(m.group(1), m.group(1)), line)

        n = self.tmp("n")
        target = self._target
        src = target.loop_kernel(var, list(rename.values()), [sub(line) for line in before],
                                 [sub(line) for line in body])
        g = self.device_kernel(src)
        return [f"{n} = {count}", f"if {n} > 0:", "    " + target.launch(g, n, params + [n])]

    def device_kernel(self, source: str) -> str:
        """The global name under which the driver launches ``source`` (``def kernel(...)``),
        compiled by the plan's target (a device target's lowering: its own kernels), in one
        statement of the lines returned."""
        g = self.gen._kernel(source)
        self.gen._named(g)
        return g

    def lod(self, slot: str, level: int = -1, i: int = 0, optional: bool = False) -> str:
        """The local name of an ``int64`` array of the offsets of input ``slot``'s LoD at
        ``level`` (``-1``: the last level), bound at run time from the LoD the value has when
        this op runs. Without that LoD the step runs the references (which raise the clear
        error), unless ``optional``: then the array is empty."""
        return self.gen.lod_arg(self.op, self.op.input(slot)[i], level, optional)



@functools.lru_cache(maxsize=None)
def template_math(template: str) -> frozenset:
    """The math helpers an emit template calls (``_m.<name>``: the code generator's math
    module, see ``registry``'s ``emit``), read from the template's syntax tree with its
    placeholders as names: what a kernel made of it needs compiled besides its loops."""
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    try:
        tree = ast.parse(template.format(**{f: "v_" for f in fields}).strip(), mode="eval")
    except (SyntaxError, ValueError, KeyError, IndexError, AttributeError):
        return frozenset()  # not an expression: its kernel is compiled as any other
    return frozenset(node.attr for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                     and node.value.id == "_m")


def loop_kernel_cost(k: LoopKernel) -> dict:
    """The compile job fields of the loop kernel ``k`` (``compile_function``'s ``cost`` and
    ``math``), from its description: its statements and stores (a reduction's three) and the
    math helpers they call."""
    n = len(k.body) + len(k.stores) + (3 if k.reduce is not None else 0)
    return {"cost": kernel_cost(n, k.math), "math": k.math}


def template_attrs(node, opdef, param) -> dict:
    """The attribute values an elementwise node's template names, as source: a float of a
    numeric attribute becomes a run-time argument (``param(literal) -> local``: kernels that
    differ only in it share), anything else a literal."""
    fields = {f for _, f, _, _ in string.Formatter().parse(node.lowering) if f}
    attrs = {}
    for k, v in opdef.attr_values(node.op.all_attrs()).items():
        if k not in fields:
            continue
        if opdef.attrs[k].type in _NUMERIC_ATTRS and isinstance(v, float):
            attrs[k] = param(literal(v))
        else:
            attrs[k] = literal(v)
    return attrs


class RowInput:
    """What ``LowerContext.row_input`` gives: ``setup`` lines (before any loop), ``shape`` (a
    source tuple of the value's full shape, over the op's inputs: for ``ctx.out(shape=...)``),
    ``rows`` and ``cols`` (source of the row count and length), ``begin(i)`` (lines to put at
    the start of row ``i``'s body) and ``load(i, j, var)`` (lines binding scalar ``var`` to
    element ``j`` of row ``i``)."""

    def __init__(self, setup, shape, rows, cols, begin, load):
        self.setup, self.shape, self.rows, self.cols = setup, shape, rows, cols
        self.begin, self.load = begin, load


class Prologue:
    """An elementwise chain (fusion nodes) computing value ``name`` of ``rank`` dims, which a
    row-wise opaque op reads row by row: its leaves are read straight from their arrays
    (broadcast by strides of 0), its statements run per element in the op's row loop."""

    def __init__(self, gen: "SegmentGen", nodes: list, name: str, rank: int):
        self.gen, self.nodes, self.name, self.rank = gen, nodes, name, rank

    def row_input(self, ctx) -> RowInput:
        gen, r = self.gen, self.rank
        scope = ctx.gen
        leaves: list = []      # (kernel local of the leaf array, its rank, its offset)
        leaf_shapes: list = []  # their build-time shapes
        leaf_of: dict = {}
        exprs: dict = {}
        body: list = []
        for node in self.nodes:
            op = node.op
            opdef = registry.get(op.type)
            subst = {}
            for slot in opdef.inputs:
                names = [n for n in op.input(slot.name) if n != registry.EMPTY_VAR_NAME]
                if not names:
                    continue
                name = names[0]
                if name in exprs:
                    subst[slot.name] = exprs[name]
                    continue
                off = gen._offset(op, opdef, slot.name, r)
                key = (name, off)
                if key not in leaf_of:
                    shape = tuple(gen.block._find_var_recursive(name).shape)
                    leaf_of[key] = len(leaves)
                    leaves.append((scope.read(name), len(shape), off))
                    leaf_shapes.append(shape)
                subst[slot.name] = f"pv{leaf_of[key]}"
            attrs = template_attrs(node, opdef, scope._param)
            out = op.output_arg_names[0]
            t = numpy_type_name(gen.block._find_var_recursive(out).dtype)
            local = ctx.tmp("pe")
            body.append(f"{local} = {node.lowering.format(T=t, **attrs, **subst)}")
            scope.math |= template_math(node.lowering)
            exprs[out] = local
        if self.name not in exprs:
            return None
        covering = [[(loc, d - off) for loc, rl, off in leaves if off <= d < off + rl]
                    for d in range(r)]
        if any(not c for c in covering):
            return None
        dims = []
        for cov in covering:
            acc = f"{cov[0][0]}.shape[{cov[0][1]}]"
            for loc, k in cov[1:]:
                acc = f"_rt.bdim({acc}, {loc}.shape[{k}])"
            dims.append(acc)
        pd = [ctx.tmp("pd") for _ in range(r)]
        setup = [f"{n} = {e}" for n, e in zip(pd, dims)]
        strides = []           # per leaf: {dim: stride local}
        flats = []
        for loc, rl, off in leaves:
            f = ctx.tmp("pf")
            setup.append(f"{f} = {loc}.reshape({loc}.size)")
            flats.append(f)
            st = {}
            for k in range(rl):
                name = ctx.tmp("ps")
                inner = " * ".join(f"{loc}.shape[{q}]" for q in range(k + 1, rl)) or "1"
                setup.append(f"{name} = {inner} if {loc}.shape[{k}] != 1 else 0")
                st[off + k] = name
            strides.append(st)
        rows = " * ".join(pd[:-1]) or "1"
        idx = [ctx.tmp("pi") for _ in range(r - 1)]
        offs = [ctx.tmp("po") for _ in leaves]

        # row i's index in each leading dim: (i // (product of the dims after it)) % dim
        # (no variable reassigned: the row loop may be a parallel one)
        div = [ctx.tmp("pq") for _ in range(r - 1)]
        for d in range(r - 2, -1, -1):
            setup.append(f"{div[d]} = " + (f"{div[d + 1]} * {pd[d + 1]}" if d < r - 2 else "1"))

        def begin(i):
            lines = [f"{idx[d]} = ({i} // {div[d]}) % {pd[d]}" for d in range(r - 1)]
            for li, o in enumerate(offs):
                terms = [f"{idx[d]} * {strides[li][d]}" for d in range(r - 1) if d in strides[li]]
                lines.append(f"{o} = {' + '.join(terms) or '0'}")
            return lines

        # along a row, a leaf is contiguous (its last dim is the row's) or one value (it has
        # no such dim, or it is 1): known from its build-time shape where that is static, so
        # the loop over the row reads it without a stride (and vectorises)
        steps = []
        for li, (_, rl, _off) in enumerate(leaves):
            last = strides[li].get(r - 1)
            d = leaf_shapes[li][rl - 1] if last is not None else 1
            steps.append(None if d == 1 else "1" if d > 1 else last)

        def load(i, j, var):
            lines = []
            for li, (f, o) in enumerate(zip(flats, offs)):
                step = steps[li]
                at = o if step is None else f"{o} + {j}" if step == "1" else \
                    f"{o} + {j} * {step}"
                lines.append(f"pv{li} = {f}[{at}]")
            return lines + body + [f"{var} = {exprs[self.name]}"]

        return RowInput(setup, ctx.tuple_src(dims), rows, pd[-1], begin, load)


class _KernelScope:
    """The names an opaque lowering sees when its lines become a kernel of their own: inputs
    are the kernel's parameters, outputs its locals, returned to the driver."""

    def __init__(self, gen: "SegmentGen"):
        self.gen = gen
        self.target = gen.target      # the target rendering the driver (and this kernel)
        self.block, self.segment, self.needed_after = gen.block, gen.segment, gen.needed_after
        self.parallel, self.parallel_min_size = gen.parallel, gen.parallel_min_size
        self.uses_prange = False
        self.params: list = []        # kernel parameter -> the driver's local
        self.kinds: list = []         # per parameter: "array", "lod", "rng" or "number"
        self.param_of: dict = {}
        self.current: dict = {}
        self.driver_local: dict = {}  # env name read -> the driver's local holding it
        self.defined: list = []       # env names the kernel allocates, in definition order
        self.dests: list = []         # (env name, param, shape, dtype, zero): driver-allocated
        self.math: set = set()        # the math helpers its lines call (a prologue's templates)
        self.counter = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{_unreserved(hint)}{self.counter}"

    def _param(self, driver_local: str, kind: str = "number") -> str:
        """The kernel parameter bound to ``driver_local`` (a ``kind`` of value: ``"number"``,
        a numeric attribute's literal, unless the caller says otherwise)."""
        p = self.param_of.get(driver_local)
        if p is None:
            p = self.param_of[driver_local] = f"a{len(self.params)}"
            self.params.append(driver_local)
            self.kinds.append(kind)
        return p

    def read(self, name: str) -> str:
        local = self.current.get(name)
        if local is None:
            outer = self.driver_local[name] = self.gen.read(name)
            local = self.current[name] = self._param(outer, "array")
        return local

    def define(self, name: str) -> str:
        local = self.current[name] = self.fresh("s")
        if name not in self.defined:
            self.defined.append(name)
        return local

    def lod_arg(self, op, name: str, level: int, optional: bool) -> str:
        return self._param(self.gen.lod_arg(op, name, level, optional), "lod")

    def rng_arg(self, op) -> str:
        return self._param(self.gen.rng_arg(op), "rng")

    def define_out(self, name: str, shape: str, dtype: str, zero: bool) -> str:
        """An output the driver allocates: a parameter after the inputs."""
        local = self.current[name] = self.fresh("d")
        self.dests.append((name, local, shape, dtype, zero))
        return local


class SegmentGen:
    """Builds one segment: a host driver (a function valid both as Python and under Numba) that
    calls one kernel per group, each compiled once per distinct text and shared by every
    segment, program and process that needs it.

    After :meth:`generate`: ``lines`` (the driver's body), ``args`` (env names read, in
    parameter order ``a0, a1...``), ``expected`` ((dtype, ndim) per argument), ``outputs``
    (env names returned), ``calls`` ((global name, Compiled) of the kernels it calls),
    ``lazy`` ((global name, source) of parallel variants compiled at their first call),
    ``lod_requests`` (offsets arguments ``lod0...``, bound at run time), ``rng_requests`` (the
    op of each random key argument ``rng0...``, after the offsets, bound at run time).

    ``parallel``: opaque lowerings may loop on threads (``ctx.loop``), and in a native driver
    the flat and row loop kernels do too; ``parallel_loops`` (default: ``parallel``): a host
    driver calls a parallel variant of its flat and row loop kernels above the target's
    ``parallel_min_size`` elements, compiled when first called. ``native``: the driver will be
    compiled by Numba (a loop body): no lazily compiled variants; with ``derived_args`` it
    takes the values its lowerings derive from weights as arguments (``derived_requests``,
    after the random keys: ``dv0...``; ``LowerContext.derived``), which its caller computes.
    ``target``: the name of the target that renders the kernels.
    """

    def __init__(self, segment: Segment, block, needed_after: set, parallel: bool = False,
                 native: bool = False, target: str = "cpu", parallel_loops: bool | None = None,
                 derived_args: bool = False, inference: bool = False):
        self.segment, self.block, self.parallel = segment, block, parallel
        self.parallel_loops = parallel if parallel_loops is None else parallel_loops
        self.target = get_target(target)
        # (elements from which a loop runs on threads: the target's threshold for an
        # inference block where it has one of its own)
        self.inference = inference
        self.parallel_min_size = (inference and self.target.inference_parallel_min_size) or \
            self.target.parallel_min_size
        self.native = native
        self.uses_prange = False      # whether a parallel loop was emitted (native drivers)
        self.calls_blas = False       # whether the driver's lines call the host's BLAS
        self.needed_after = needed_after
        self.lines: list = []
        self.args: list = []          # env names, in argument order
        self.current: dict = {}       # env name -> local array holding its latest value
        self.counter = 0
        self.expected: list = []      # (dtype, ndim) per argument
        self.defined: set = set()     # env names this segment writes (in place ones included)
        self.lod_requests: list = []  # (op, env name, level, optional) per offsets argument
        self.rng_requests: list = []  # the op per random key argument (rng0...)
        # (library function, indices of the arguments it reads, constants) per derived
        # value argument (dv0...): ``LowerContext.derived``, a native driver's only
        self.derived_args = native and derived_args
        self.derived_requests: list = []
        self.calls: list = []         # (global name, Compiled)
        self.lazy: list = []          # (global name, kernel source): parallel variants
        self.jobs: list = []          # (Compiled, predicted argument types): see precompile
        self.device_jobs: list = []   # the same, of a target that compiles at first launch
        self.meta: dict = {}          # local -> (dtype, ndim) it will hold
        self.flats: dict = {}         # local -> a local holding its 1-D view
        self.labels: dict = {}        # local -> the env name whose value it holds
        self.inplace: dict = {}       # output local -> (leaves it may overwrite, other leaves,
        #                               leaf -> renames of the call's kernels: see _note_inplace)
        self._epilogues: dict = {}    # global of a blocked kernel -> the Compiled it calls
        self._at = 0                  # the index of the group being generated
        self._rest = None             # (see _blocked) the ops left of the next group
        self._taken: list = []
        # the elementwise ops before the next group's op that it may apply as it reads
        self.prologue_offer: ChannelPrologue | None = None  # (see _channel_prologue)
        self.memory_plan = None       # after plan_memory(): what the memory plan decided
        self._planned = None          # ... and the rewritten driver
        self._globals: dict = {}      # module name -> global name
        self._uses: dict = {}         # global -> statements of the driver calling it (_named)
        self._group_at: list = []     # (index in ``lines``, the group's op types) per group
        # groups whose lines run the previous group's opaque op (it applies their ops as it
        # stores): a profiler times the two as one (``driver.HostDriver.timed``)
        self.joined: set = set()

    # -- names ---------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{_unreserved(hint)}{self.counter}"

    def read(self, name: str) -> str:
        """The local array holding ``name``'s current value (an argument if not yet defined)."""
        local = self.current.get(name)
        if local is None:
            local = f"a{len(self.args)}"
            self.args.append(name)
            v = self.block._find_var_recursive(name)
            self.expected.append((v.dtype, len(v.shape)))
            self.meta[local] = self.expected[-1]
            self.current[name] = local
        return local

    def lod_arg(self, op, name: str, level: int, optional: bool) -> str:
        """The argument holding ``name``'s offsets at ``level`` as ``op`` sees them."""
        key = (op, name, level, optional)
        for k, req in enumerate(self.lod_requests):
            if req[0] is op and req[1:] == key[1:]:
                return f"lod{k}"
        self.lod_requests.append(key)
        return f"lod{len(self.lod_requests) - 1}"

    def rng_arg(self, op) -> str:
        """The argument holding ``op``'s random key for the current run."""
        for k, o in enumerate(self.rng_requests):
            if o is op:
                return f"rng{k}"
        self.rng_requests.append(op)
        return f"rng{len(self.rng_requests) - 1}"

    def derived_arg(self, fn: str, names: list, consts: tuple) -> "str | None":
        """The argument holding ``fn``'s value derived from the segment's arguments ``names``
        (a name, or a list of names: a tuple), see ``LowerContext.derived``; None where one
        of them is not an argument (a value the segment computes)."""
        if any(n in self.defined or n not in self.args
               for a in names for n in (a if isinstance(a, list) else [a])):
            return None
        index = self.args.index
        where = tuple(tuple(map(index, a)) if isinstance(a, list) else index(a) for a in names)
        key = (fn, where, tuple(consts))
        if key not in self.derived_requests:
            self.derived_requests.append(key)
        return f"dv{self.derived_requests.index(key)}"

    def define(self, name: str) -> str:
        local = self.fresh("s")
        self.current[name] = local
        self.defined.add(name)
        self.labels[local] = name
        v = self.block._find_var_recursive(name)
        if v is not None and v.dtype is not None:
            self.meta[local] = (v.dtype, len(v.shape))
        return local

    def define_out(self, name: str, shape: str, dtype: str, zero: bool) -> str:
        """An output allocated here (host lines write into it)."""
        local = self.define(name)
        mod = self.target.alloc_module  # a device target allocates there
        self.emit(f"{local} = {mod}.{'zeros' if zero else 'empty'}({shape}, {dtype})")
        return local

    def emit(self, line: str, indent: int = 1) -> None:
        self.lines.append("    " * indent + line)

    def flat(self, local: str) -> str:
        """A 1-D view of the C-contiguous array ``local``, made once per driver."""
        f = self.flats.get(local)
        if f is None:
            f = self.flats[local] = self.fresh("f")
            self.emit(f"{f} = {local}.reshape({local}.size)")
        return f

    def _kernel(self, source: str, parallel: bool = False, argtypes=None, cost=None,
                math=()) -> str:
        """The global name under which the driver calls the compiled ``source``;
        ``argtypes``: the argument types its call will most likely have ((dtype, ndim) per
        array, ``float``/``int`` per scalar, ``"lod"`` per offsets array); ``cost`` and
        ``math``: its compile job's estimated time and the math helpers it calls
        (:func:`loop_kernel_cost`)."""
        compiled = compile_function(source, "kernel", parallel=parallel,
                                    target=self.target.name, cost=cost, math=math)
        if argtypes is not None:
            if self.target.precompile:
                self.jobs.append((compiled, tuple(argtypes)))
            else:  # compiled at the first launch; the types are kept (PTX checks)
                self.device_jobs.append((compiled, tuple(argtypes)))
        g = self._globals.get(compiled.name)
        if g is None:
            g = self._globals[compiled.name] = f"K{len(self.calls)}"
            self.calls.append((g, compiled))
        return g

    def _named(self, *names) -> None:
        """One more statement of the driver calls each of the globals ``names`` (``None``:
        nothing): which kernels and parallel variants a rewritten driver still calls
        (:meth:`used_calls`)."""
        for g in names:
            if g is not None:
                self._uses[g] = self._uses.get(g, 0) + 1

    # -- the driver ----------------------------------------------------------------------------
    def generate(self) -> None:
        groups = self.segment.groups
        blocks = None  # an opaque op computed by blocks, waiting for its epilogue group
        for gi, group in enumerate(groups):
            self._at = gi
            ops = ", ".join(node.op.type for node in group.nodes)
            self._group_at.append((len(self.lines), ops))
            self.emit(f"# group {gi}: {group.kind} [{ops}] rank {len(group.shape)}")
            if group.kind == OPAQUE:
                nxt = groups[gi + 1] if gi + 1 < len(groups) else None
                blocks = self._blocked(group, nxt, gi)
                if blocks is None:
                    self._opaque(group)
                if self.prologue_offer is not None:
                    raise AssertionError(f"pdjit: the lowering of {group.nodes[0].label} "
                                         f"declares a channel prologue it did not take")
            elif blocks is None and (pro := self._channel_prologue(groups, gi)) is not None:
                self.prologue_offer = pro
                self.emit(f"# (read through by the {groups[gi + 1].nodes[0].op.type} after "
                          f"it: applied as it reads its input)")
            else:
                rest = self._rest if blocks is not None else None
                if blocks is not None:
                    self.joined.add(gi)
                if rest is not None and not rest.nodes:  # the op took the whole group
                    self.emit(f"# (taken by the {groups[gi - 1].nodes[0].op.type}: applied as "
                              f"it stores)")
                    self._whole_batch(blocks)
                else:
                    if rest is not None:
                        self.emit(f"# (its {', '.join(self._taken)} taken by the "
                                  f"{groups[gi - 1].nodes[0].op.type})")
                    self._loop_group(rest if rest is not None else group, blocks)
                blocks = None
            self._as_declared(group)
        self.outputs = [n for n in self.current if n in self.needed_after and n in self.defined]

    def _as_declared(self, group: Group) -> None:
        """View each output that ``group``'s ops compute 0-d and the program declares ``[1]``
        (``pdjit.framework.scalars``) as ``(1,)``, as soon as it is computed."""
        for node in group.nodes:
            for name in scalars.promoted(node.op):
                local = self.current.get(name)
                if local is None or name not in self.defined:
                    continue
                view = self.define(name)
                self.emit(f"{view} = {local}.reshape((1,))")

    def group_lines(self, first: int = 2) -> list:
        """``(line, op types)`` per group: the line where the group's code begins (its
        ``# group`` comment) in ``source()`` (the memory plan's rewritten driver, once
        planned) when the driver's first line after its ``def`` is line ``first``, and its
        ops' types joined by commas."""
        if self._planned is not None:
            at = self.memory_plan.group_lines
        else:
            at = [k + 2 for k, _ in self._group_at]
        return [(first - 2 + line, ops) for line, (_, ops) in zip(at, self._group_at)]

    def source(self, fn_name: str) -> str:
        if self._planned is not None:
            head, rest = self._planned.split("\n", 1)
            return f"def {fn_name}({head.split('(', 1)[1]}\n{rest}"
        params = [f"a{i}" for i in range(len(self.args))] + \
            [f"lod{k}" for k in range(len(self.lod_requests))] + \
            [f"rng{k}" for k in range(len(self.rng_requests))] + \
            [f"dv{k}" for k in range(len(self.derived_requests))]
        head = f"def {fn_name}({', '.join(params)}):"
        ret = "    return (" + "".join(f"{self.current[n]}, " for n in self.outputs) + ")"
        return "\n".join([head] + self.lines + [ret])

    # -- an opaque op by blocks, its epilogue after each ----------------------------------------
    def _blocked(self, group: Group, nxt: Group | None, gi: int = -1):
        """When ``group``'s op can be computed by blocks of samples and the elementwise group
        ``nxt`` reads its output: emit the op's preparing lines and return ``(output name,
        fn, before, after, work)`` for ``_loop_group`` to call with its epilogue (else
        None, nothing emitted). Where the op takes the per-channel add and clamp that start
        ``nxt`` (``LowerContext.channel_epilogue``), the name is that of their result (which
        the op's output array then holds) and ``self._rest`` the group of the ops left (else
        None)."""
        self._rest = None
        node = group.nodes[0]
        low = node.lowering
        # (only a loop group takes an epilogue: not a reduction, nor an opaque group, which
        # may be a prologue with a shape of its own)
        if len(group.nodes) > 1 or nxt is None or nxt.kind in (REDUCTION, OPAQUE) or \
                low.blocked is None or \
                not low.host or not self.target.block_forms:
            return None
        outs = [n for n in node.op.output_arg_names if n != registry.EMPTY_VAR_NAME]
        if len(outs) != 1 or len(nxt.shape) < 2 or \
                tuple(self.block._find_var_recursive(outs[0]).shape) != tuple(nxt.shape) or \
                not any(outs[0] in n.op.input_arg_names for n in nxt.nodes):
            return None
        ctx = LowerContext(self, node)
        axis = low.channel_axis(node.op) if callable(low.channel_axis) else low.channel_axis
        ctx.offer = self._channel_epilogue(outs[0], nxt, gi + 1, axis) \
            if gi >= 0 else None
        spec = low.blocked(ctx)
        if spec is None:
            return None
        self.calls_blas |= low.blas
        lines, fn, before, after, work = spec
        for line in lines:
            self.emit(line)
        # (the call of fn, by blocks, is written elsewhere: its kernels are jobs too)
        self.jobs += self.target.library_jobs(ctx.library_calls, self._float_dtype(node.op))
        name = outs[0]
        if ctx.taken:
            off = ctx.offer
            y = self.current[name]
            for n in off.names:  # their values: the op's output array
                self.current[n] = y
                self.defined.add(n)
            name = off.names[-1]
            self._rest = Group(nxt.kind, nxt.nodes[len(off.names):], nxt.shape,
                               stored=list(nxt.stored))
            self._taken = [n.op.type for n in nxt.nodes[:len(off.names)]]
            self._residual_inplace(ctx, y, before + after)
        return name, fn, list(before), list(after), work

    def _residual_inplace(self, ctx, y: str, args: list) -> None:
        """For the memory plan: the output ``y`` of an op computed by blocks that took a
        residual add (``ctx.residual``) may take the residual's buffer when nothing reads it
        after the op: the library functions that take a residual read each of its values
        before they write over it (tested per kernel). Not where the ops left after it in
        the group (its epilogue kernel, called after each block) read the residual too."""
        if ctx.residual is None or self.native or \
                any(ctx.offer.residual in n.op.input_arg_names for n in self._rest.nodes):
            return
        view, src = ctx.residual
        others = [a for a in args if a.isidentifier() and a not in (y, view)]
        self.inplace[y] = ([src], others)

    def _whole_batch(self, blocks) -> None:
        """The op of ``blocks`` (see :meth:`_blocked`) for the whole batch, nothing after it
        (its epilogue taken)."""
        name, fn, before, after, work = blocks
        self.emit(self.batch_call(self.current[name], fn, before, after, work))

    def batch_call(self, y: str, fn: str, before: list, after: list, work: str) -> str:
        """The line calling the function ``fn`` of an ``Opaque.blocked`` lowering (arguments
        ``before``, the range of samples, ``after``) for every sample of its output ``y``: on
        threads by samples when large (a host driver)."""
        if self.native:  # (an int constant would be a literal type: a compile per value)
            args = [f"int({a})" if re.fullmatch(r"-?\d+", a) else a
                    for a in before + ["0", f"{y}.shape[0]"] + after]
            return f"{fn}({', '.join(args)})"
        return (f"{self.target.library}.split_work({fn}, {y}.shape[0], {work}, "
                f"{', '.join(before + after)}, head={len(before)})")

    def _channel_epilogue(self, name: str, nxt: Group, at: int, axis: int = 1):
        """The :class:`ChannelEpilogue` an op whose output ``name`` ([N, C, ...]; channels on
        ``axis``: the op's ``blocked`` rule declares another as its ``channel_axis``, a product's
        last) the group ``nxt`` (the segment's group ``at``) reads may take: its first op adding
        a bias per channel (declared ``ChannelAffine`` with the values of its one parameter slot
        as the additive term, along that axis), then, if it is next, an op declared ``ADDITION`` of
        that sum and a value of its shape made before ``nxt`` (a residual connection), then an
        op declared ``Clamp`` of the sum, then one declared ``Gate`` (hard_swish); any of the
        four may be missing. Each value but the last must be read by the next op alone (not
        stored, not read after); None where nothing fits."""
        var = self.block._find_var_recursive
        out = var(name)
        if out is None or len(out.shape) < 2 or not nxt.nodes:
            return None
        axis %= len(out.shape)
        if out.shape[axis] < 1:
            return None
        dt = np.dtype(out.dtype)

        def sole_reader(value, k) -> bool:  # read by node k of nxt alone
            return value not in nxt.stored and not self._read_after(value, at) and \
                not any(value in nd.op.input_arg_names for i, nd in enumerate(nxt.nodes)
                        if i != k)

        def same(value) -> bool:
            v = var(value)
            return v is not None and np.dtype(v.dtype) == dt and \
                tuple(v.shape) == tuple(out.shape)

        def declared(k):
            op = nxt.nodes[k].op
            return op, registry.inference_of(op)

        made = {o for nd in nxt.nodes for o in nd.op.output_arg_names}

        def channel_bias(op, spec):
            """The bias vector's name where ``op`` adds one per channel to ``name``."""
            if not isinstance(spec, registry.ChannelAffine):
                return None
            outs = op.output(spec.out)
            if op.input(spec.x) != [name] or len(outs) != 1 or not same(outs[0]) or \
                    not sole_reader(name, 0):
                return None
            found = _channel_vector(op, spec, var, made, tuple(out.shape), dt, axis)
            return found[1] if found is not None and found[0] == "shift" else None

        def residual_of(op, cur, k):
            """The value ``op`` adds to ``cur`` where it is a residual connection: declared an
            addition, of a value of ``cur``'s shape made before ``nxt``."""
            d = registry.lookup(op.type)
            if d is None or registry.ADDITION not in d.traits:
                return None
            ins = [n for n in op.input_arg_names if n != registry.EMPTY_VAR_NAME]
            outs = op.output_arg_names
            if len(ins) != 2 or ins.count(cur) != 1 or len(outs) != 1 or not same(outs[0]):
                return None
            other = ins[1 - ins.index(cur)]
            return other if same(other) and other not in made and sole_reader(cur, k) else None

        names, bias, residual, cur, k = [], None, None, name, 0
        op, spec = declared(0)
        bias = channel_bias(op, spec)
        if bias is not None:
            cur = op.output(spec.out)[0]
            names, k = [cur], 1
            if k == len(nxt.nodes):
                return ChannelEpilogue(names, bias, -math.inf, math.inf)
            op, spec = declared(k)
        residual = residual_of(op, cur, k)
        if residual is not None:
            cur = op.output_arg_names[0]
            names.append(cur)
            k += 1
            if k == len(nxt.nodes):
                return ChannelEpilogue(names, bias, -math.inf, math.inf, residual)
            op, spec = declared(k)
        lo, hi = -math.inf, math.inf

        def applies(spec, bounds) -> bool:  # (an op of the kind, on cur, its one output)
            return op.input(spec.x) == [cur] and \
                not any(math.isnan(v) for v in bounds) and \
                len(op.output(spec.out)) == 1 and same(op.output(spec.out)[0]) and \
                sole_reader(cur, k)

        if isinstance(spec, registry.Clamp) and applies(spec, (spec.lo, spec.hi)):
            cur = op.output(spec.out)[0]
            names.append(cur)
            lo, hi = float(spec.lo), float(spec.hi)
            k += 1
            if k == len(nxt.nodes):
                return ChannelEpilogue(names, bias, lo, hi, residual)
            op, spec = declared(k)
        if isinstance(spec, registry.Gate) and applies(spec, spec.values()):
            names.append(op.output(spec.out)[0])
            return ChannelEpilogue(names, bias, lo, hi, residual, spec)
        return ChannelEpilogue(names, bias, lo, hi, residual) if names else None

    def _channel_prologue(self, groups: list, at: int) -> ChannelPrologue | None:
        """The :class:`ChannelPrologue` the op of the group after the elementwise group ``at``
        of ``groups`` applies (its lowering's ``Opaque.channel_prologue`` names the input slot
        for that op; a host lowering, a target of blocked forms) where that group is a
        per-channel product by a vector, a per-channel sum of one (declared
        ``ChannelAffine``, along the input's axis 1) and a clamp (declared ``Clamp``), in that
        order, each optional but not all missing, computing that input from a value made
        before it: every value it computes read by the next of its ops alone, the last by the
        op alone (not stored for later, not fetched). None where it does not fit."""
        group = groups[at]
        nxt = groups[at + 1] if at + 1 < len(groups) else None
        if nxt is None or nxt.kind != OPAQUE or len(nxt.nodes) != 1 or \
                not self.target.block_forms or not nxt.nodes[0].lowering.host or \
                len(group.shape) < 2 or not 1 <= len(group.nodes) <= 3:
            return None
        rule = nxt.nodes[0].lowering.channel_prologue
        slot = rule(nxt.nodes[0].op) if rule is not None else None
        if slot is None:
            return None
        var = self.block._find_var_recursive
        made = {o for nd in group.nodes for o in nd.op.output_arg_names}
        specs = [registry.inference_of(nd.op) for nd in group.nodes]
        if not isinstance(specs[0], (registry.ChannelAffine, registry.Clamp)) or \
                len(group.nodes[0].op.input(specs[0].x)) != 1:
            return None
        source = cur = group.nodes[0].op.input(specs[0].x)[0]
        src = var(source)
        if src is None or source in made or tuple(src.shape) != tuple(group.shape):
            return None
        dt = np.dtype(src.dtype)
        names, coef, lo, hi = [], {}, -math.inf, math.inf
        for k, (nd, spec) in enumerate(zip(group.nodes, specs)):
            op = nd.op
            outs = op.output(spec.out) if spec is not None else []
            out = var(outs[0]) if len(outs) == 1 else None
            if out is None or op.input(spec.x) != [cur] or \
                    tuple(out.shape) != tuple(src.shape) or np.dtype(out.dtype) != dt:
                return None
            if cur != source and (self._read_after(cur, at) or any(
                    cur in o.op.input_arg_names for o in group.nodes[k + 1:])):
                return None  # (a value between the ops that something else reads)
            if isinstance(spec, registry.ChannelAffine):
                found = _channel_vector(op, spec, var, made, src.shape, dt, 1)
                if found is None or found[0] in coef or found[0] == "scale" and coef:
                    return None  # (one product, then one sum)
                coef[found[0]] = found[1]
            elif isinstance(spec, registry.Clamp) and k == len(group.nodes) - 1 and \
                    not any(math.isnan(v) for v in (spec.lo, spec.hi)):
                lo, hi = float(spec.lo), float(spec.hi)
            else:
                return None
            cur = outs[0]
            names.append(cur)
        last = names[-1]
        if nxt.nodes[0].op.input(slot) != [last] or self._read_after(last, at + 1) or \
                any(n in nxt.nodes[0].op.input_arg_names for n in names[:-1]):
            return None
        return ChannelPrologue(source, last, coef.get("scale"), coef.get("shift"), lo, hi)

    # -- opaque ops ----------------------------------------------------------------------------
    def _opaque(self, group: Group) -> None:
        node = group.nodes[-1]
        if len(group.nodes) > 1:  # an elementwise chain feeding a row-wise op, in its loop
            return self._opaque_prologue(group)
        # library calls and views: lines of the driver itself (on a device target every
        # opaque lowering is: its lines launch the target's library kernels)
        if node.lowering.host or self.target.device:
            ctx = LowerContext(self, node)
            lines = _lowered(node, ctx)
            if lines is None:
                raise Declined(node.op)
            self.calls_blas |= node.lowering.blas
            for line in lines:
                self.emit(line)
            self.jobs += self.target.library_jobs(ctx.library_calls, self._float_dtype(node.op))
            return
        scope = _KernelScope(self)
        lines = _lowered(node, LowerContext(scope, node))
        if lines is None:
            raise Declined(node.op)
        self._kernel_call(node, scope, lines)

    def _opaque_prologue(self, group: Group) -> None:
        """A row-wise opaque op whose input the elementwise chain before it computes: one
        kernel, the chain evaluated per element inside the op's first pass over each row."""
        node = group.nodes[-1]
        chain = group.nodes[:-1]
        if self.target.device:  # the chain as a kernel of its own, then the op
            name = [n for n in node.op.input_arg_names if n in
                    {o for c in chain for o in c.op.output_arg_names}]
            self._loop_group(Group(ELEMENTWISE, chain, group.shape, stored=name))
            return self._opaque(Group(OPAQUE, [node]))
        slot = getattr(node.lowering.lower, ROW_PROLOGUE)(
            registry.get(node.op.type).attr_values(node.op.all_attrs()), len(group.shape))
        name = node.op.input(slot)[0]
        scope = _KernelScope(self)
        pro = Prologue(self, chain, name, len(group.shape))
        lines = _lowered(node, LowerContext(scope, node, pro))
        if lines is None or any(x is None for x in lines):
            raise Declined(node.op)
        self._kernel_call(node, scope, lines)

    def _kernel_call(self, node, scope, lines) -> None:
        """The driver's lines calling the kernel made of an opaque lowering's ``lines``."""
        outs = [n for n in scope.defined if n not in {d[0] for d in scope.dests}]
        params = [f"a{i}" for i in range(len(scope.params))] + [d[1] for d in scope.dests]
        src = "\n".join([f"def kernel({', '.join(params)}):"]
                        + ["    " + line for line in lines]
                        + ["    return (" + "".join(f"{scope.current[n]}, " for n in outs) + ")"])
        flat = node.lowering.flat
        if flat and outs:
            raise ValueError(f"{node.op.type}: a flat Opaque lowering must let the driver "
                             f"allocate its outputs (ctx.out(slot, shape=...))")
        # the outputs the driver allocates, their shapes over the driver's locals
        dests = []
        for name, _, shape, dtype, zero in scope.dests:
            shape = re.sub(r"\ba(\d+)\b", lambda m: scope.params[int(m.group(1))], shape)
            local = self.define(name)
            self.emit(f"{local} = np.{'zeros' if zero else 'empty'}({shape}, {dtype})")
            dests.append(local)
        argtypes = []
        kinds = scope.kinds + ["array"] * len(dests)
        for a, kind in zip(scope.params + dests, kinds):
            if kind == "lod":
                argtypes.append("lod")
            elif kind == "rng":
                argtypes.append(None)  # a uint64 scalar: compiled at the first call
            elif kind == "number":  # a numeric attribute
                argtypes.append(float)
            else:
                dt, nd = self.meta.get(a, (None, None))
                argtypes.append((dt, 1 if flat else nd) if dt is not None else None)
        g = self._kernel(src, parallel=scope.uses_prange,
                         argtypes=None if any(t is None for t in argtypes) else argtypes,
                         cost=kernel_cost(len(lines), scope.math), math=tuple(scope.math))
        self.uses_prange |= scope.uses_prange
        args = scope.params + dests
        if flat:  # every array 1-D: one kernel for every rank
            args = [a if kind in ("lod", "rng") else self.flat(a) for a, kind in zip(args, kinds)]
        targets = [self.define(n) for n in outs]
        call = f"{g}({', '.join(args)})"
        self._named(g)
        self.emit(f"({''.join(t + ', ' for t in targets)}) = {call}" if targets else call)

    def _float_dtype(self, op):
        """The dtype of ``op``'s first floating-point input (float64 when it has none)."""
        for name in op.input_arg_names:
            v = self.block._find_var_recursive(name)
            if v is not None and v.dtype is not None and np.dtype(v.dtype).kind == "f":
                return v.dtype
        return np.dtype(np.float64)

    # -- loop groups ---------------------------------------------------------------------------
    def _loop_group(self, group: Group, blocks=None) -> None:
        """Lines of a loop group's kernel call; with ``blocks`` (from :meth:`_blocked`) the
        call also computes the opaque op before it, block by block (or, when this group's
        form does not allow it, the op for the whole batch first)."""
        rank = len(group.shape)
        reduce_node = group.nodes[-1] if group.kind == REDUCTION else None
        chain = group.nodes[:-1] if reduce_node else group.nodes

        # walk the chain symbolically: leaves, scalar expressions per value, run-time params
        leaves: list = []              # Leaf
        locals_: list = []             # the driver's local array of each leaf
        row_ranks: list = []
        leaf_index: dict = {}
        exprs: dict = {}               # env name -> scalar expression (a local scalar name)
        cones: dict = {}               # env name -> leaf ids it depends on
        body: list = []
        params: list = []              # the parameters' values, as literals for the driver

        def value_of(name, offset, reader):
            if name in exprs:
                return exprs[name], cones[name]
            local = self.read(name)
            key = (local, offset)
            if key not in leaf_index:
                shape = tuple(self.block._find_var_recursive(name).shape)
                if offset < 0 or offset + len(shape) > rank:  # declared ranks that disagree
                    raise Declined(reader)  # (a damaged program): the reference names it
                place, k = place_leaf(shape, offset, group.shape)
                leaf_index[key] = len(leaves)
                leaves.append(Leaf(len(shape), offset, shape, place))
                locals_.append(local)
                row_ranks.append(k)
            lid = leaf_index[key]
            return f"x{lid}", frozenset({lid})

        def param(src):  # a run-time argument: kernels that differ only in it share
            params.append(src)
            return f"p{len(params) - 1}"

        counter = 0
        math_fns: set = set()          # the math helpers the statements call
        for node in chain:
            op = node.op
            opdef = registry.get(op.type)
            out_name = op.output_arg_names[0]
            subst, cone = {}, frozenset()
            for slot in opdef.inputs:
                names = [n for n in op.input(slot.name) if n != registry.EMPTY_VAR_NAME]
                if not names:
                    continue
                expr, c = value_of(names[0], self._offset(op, opdef, slot.name, rank), op)
                subst[slot.name] = expr
                cone |= c
            attrs = template_attrs(node, opdef, param)
            t = numpy_type_name(self.block._find_var_recursive(out_name).dtype)
            counter += 1
            local = f"e{counter}"
            body.append(f"{local} = {node.lowering.format(T=t, **attrs, **subst)}")
            math_fns |= template_math(node.lowering)
            exprs[out_name], cones[out_name] = local, cone

        stored_chain = [n for n in group.stored if n in exprs]
        stores = [(exprs[n], numpy_type_name(self.block._find_var_recursive(n).dtype), cones[n])
                  for n in stored_chain]
        spec = None
        if reduce_node is not None:
            red = reduce_node.lowering
            x_expr, x_cone = value_of(reduce_node.op.input(red.x)[0], 0, reduce_node.op)
            out_name = reduce_node.op.output(red.out)[0]
            t = numpy_type_name(self.block._find_var_recursive(out_name).dtype)
            axes = tuple(range(rank)) if red.axes is None or not rank else \
                tuple(sorted({a % rank for a in red.axes}))
            spec = ReduceSpec(red.init.format(T=t),
                              red.combine.format(acc="{acc}", x=x_expr, T=t),
                              red.finalize.format(acc="{acc}", n="{n}", T=t),
                              axes, red.keep_dim, t, x_expr, x_cone, red.identity,
                              red.combine.format(acc="{acc}", x="{x}", T=t))
            for template in (red.init, red.combine, red.finalize):
                math_fns |= template_math(template)
        kernel = LoopKernel(rank, leaves, body, stores, len(params), reduce=spec,
                            math=tuple(sorted(math_fns)))
        kernel.form = choose_form(kernel, row_ranks)
        self.emit(f"# form {kernel.form}")
        leaf_dtypes = [self.meta.get(loc, (None,))[0] for loc in locals_]
        unknown = any(d is None for d in leaf_dtypes)  # (np.dtype == None holds for float64)
        argtypes = None if unknown else self.target.argtypes(kernel, leaf_dtypes)
        y = self.current.get(blocks[0]) if blocks is not None else None
        ok = blocks is not None and spec is None and kernel.form in self.target.block_forms and \
            y in locals_ and kernel.leaves[locals_.index(y)].place == FULL and \
            (kernel.form != "mid" or kernel.mid[0] >= 1)
        # a native driver's epilogue writes the op's output in place where nothing else reads
        # it (a host driver's memory plan decides that: _note_inplace)
        inplace = self._epilogue_inplace(kernel, locals_, stored_chain, blocks[0]) \
            if ok and self.native else None
        kname = self._kernel(self.target.render(kernel, inplace=inplace), argtypes=argtypes,
                             **loop_kernel_cost(kernel))
        pname = None
        if kernel.form in FLAT_FORMS and self.target.parallel_variants:
            if self.native and self.parallel:
                kname = self._kernel(self.target.render(kernel, parallel=True, inplace=inplace),
                                     parallel=True, **loop_kernel_cost(kernel))
                self.uses_prange = True
            elif not self.native and self.parallel_loops:
                pname = f"P{len(self.lazy)}"
                self.lazy.append((pname, self.target.render(kernel, parallel=True)))
        store_locals = [self.define(n) for n in stored_chain]
        red_local = self.define(reduce_node.op.output(reduce_node.lowering.out)[0]) \
            if spec is not None else None
        if blocks is not None:
            if ok:
                g = self._epilogue(kernel, kname, locals_, store_locals, params, blocks, inplace,
                                   pname)
                # the op's operands are read block by block during the call: only its output
                # may be overwritten in place
                self._note_inplace(kernel, locals_, store_locals, stored_chain,
                                   {"call": g, "parallel": pname, "blocked": blocks,
                                    "argtypes": argtypes, "map": {}}, only=y)
                return
            _, fn, before, after, _ = blocks  # the whole batch, then this group as usual
            self.emit(f"{fn}({', '.join(before + ['0', f'{y}.shape[0]'] + after)})")
        for line in self.target.call_site(kernel, self.fresh, self.flats, locals_, store_locals,
                                          red_local, params, kname, pname,
                                          parallel_min_size=self.parallel_min_size):
            self.emit(line)
        self._named(kname, pname)
        if spec is None:
            self._note_inplace(kernel, locals_, store_locals, stored_chain,
                               {"call": kname, "parallel": pname, "argtypes": argtypes,
                                "map": {}})

    def _note_inplace(self, kernel, locals_, store_locals, stored, call: dict,
                      only=None) -> None:
        """For the memory plan (``memplan.plan_driver``'s ``inplace``): which leaves each
        stored output of this loop kernel could overwrite (a full-shape leaf of the output's
        dtype: the target's ``inplace_forms`` read it at the very element they then write), the
        kernel's other leaves, and how to switch the call to the kernel's variant that writes
        that leaf (``call``: the globals the driver calls, the argument types)."""
        if self.native or kernel.form not in self.target.inplace_forms:
            return
        full = [(i, loc) for i, (loc, leaf) in enumerate(zip(locals_, kernel.leaves))
                if leaf.place == FULL]
        others = [loc for loc, leaf in zip(locals_, kernel.leaves) if leaf.place != FULL]
        for j, (name, loc) in enumerate(zip(stored, store_locals)):
            out = self.flats.get(loc)
            if out is None:
                continue
            dt = np.dtype(self.block._find_var_recursive(name).dtype)
            ok = {x: i for i, x in full if (only is None or x == only) and
                  self.meta.get(x, (None,))[0] is not None and np.dtype(self.meta[x][0]) == dt}
            self.inplace[out] = (list(ok), [x for _, x in full if x not in ok] + others,
                                 lambda leaf, j=j, ok=ok: self._inplace_variant(
                                     kernel, call, j, ok[leaf]))

    def _inplace_variant(self, kernel, call: dict, j: int, i: int) -> dict:
        """Register the variant of ``kernel`` that writes its stored value ``j`` into leaf
        ``i`` (besides those of earlier calls for the same group); the renames of the globals
        the group's call statement names, old -> new."""
        call["map"][j] = i
        mapping = dict(call["map"])
        renames = {}
        variant = self._kernel(self.target.render(kernel, inplace=mapping),
                               argtypes=call["argtypes"], **loop_kernel_cost(kernel))
        if call.get("blocked"):
            _, fn, before, after, _ = call["blocked"]
            epi = next(c for g, c in self.calls if g == variant)
            variant = self._register(self._blocked_fn(kernel, fn, len(before), len(after),
                                                      epi, bool(call.get("parallel"))))
            self._epilogues[variant] = epi
        renames[call["call"]] = variant
        call["call"] = variant
        if call.get("parallel"):
            p = f"P{len(self.lazy)}"
            self.lazy.append((p, self.target.render(kernel, parallel=True, inplace=mapping)))
            renames[call["parallel"]] = p
            call["parallel"] = p
        for old, new in renames.items():  # the call statement now names the variants
            self._uses[old] -= 1
            self._named(new)
        return renames

    def _register(self, compiled) -> str:
        """The global name under which the driver calls ``compiled`` (registered once)."""
        g = self._globals.get(compiled.name)
        if g is None:
            g = self._globals[compiled.name] = f"K{len(self.calls)}"
            self.calls.append((g, compiled))
        return g

    # -- the memory plan -----------------------------------------------------------------------
    def estimates(self) -> dict:
        """Per labelled local: (elements per sample of its variable, unknown dims as 1;
        whether a dim is unknown until run time)."""
        out = {}
        for local, name in self.labels.items():
            v = self.block._find_var_recursive(name)
            if v is not None and v.shape is not None:
                out[local] = (int(np.prod([max(d, 1) for d in v.shape], dtype=np.int64)),
                              any(d < 0 for d in v.shape))
        return out

    def plan_memory(self) -> None:
        """Rewrite the driver (a host driver: not a native loop body) to reuse and release
        its intermediates' buffers by liveness (``pdjit.codegen.memplan``), before its
        kernels are compiled: kernels the rewritten driver no longer calls are not compiled.
        ``memory_plan`` says what was decided; ``source()`` gives the rewritten driver."""
        if self.native:
            raise ValueError("a native loop body keeps its driver as generated")
        if self.memory_plan is not None:
            return
        planned, self.memory_plan = memplan.plan_driver(
            self.source("segment"), self.labels, self.estimates(), self.inplace,
            [line for line, _ in self.group_lines()])
        self._planned = planned
        self.calls = self.used_calls()
        keep = {id(c) for _, c in self.calls}
        self.jobs = [(c, t) for c, t in self.jobs
                     if not isinstance(c, Compiled) or id(c) in keep]
        self.lazy = [(g, src) for g, src in self.lazy if self._uses.get(g, 0) > 0]

    def used_calls(self) -> list:
        """The ``calls`` some statement of the driver calls (counted as the statements are
        generated, and as the memory plan switches them to in-place variants), and the kernels
        its blocked kernels call."""
        used = {g for g, n in self._uses.items() if n > 0}
        epis = {id(self._epilogues[g]) for g in used if g in self._epilogues}
        return [(g, c) for g, c in self.calls if g in used or id(c) in epis]

    def _read_after(self, name: str, at: int) -> bool:
        """Whether value ``name`` may be read after the segment's group ``at`` (by a later op
        of the segment, after the segment: a later segment, a sub-block, a fetch) or must stay
        in memory (a persistable variable)."""
        v = self.block._find_var_recursive(name)
        if name in self.needed_after or v is None or v.persistable:
            return True
        last = self.__dict__.get("_last_read")
        if last is None:  # the last group of the segment reading each name, once
            last = self._last_read = {n: k for k, g in enumerate(self.segment.groups)
                                      for op in g.ops for n in op.input_arg_names}
        return last.get(name, -1) > at

    def _epilogue_inplace(self, kernel, locals_, stored, name: str):
        """``{store j: leaf i}``: the epilogue kernel (a loop group after an opaque op computed
        by blocks, see :meth:`_blocked`) writes its first stored value of the op's output's
        dtype into the op's output ``name`` (leaf ``i``, read at the very element it writes:
        ``inplace_forms``) when nothing reads that output after the group; else None."""
        if kernel.form not in self.target.inplace_forms or \
                self._read_after(name, self._at):
            return None
        y = self.current[name]
        dt = self.meta.get(y, (None,))[0]
        if dt is None:
            return None
        for j, n in enumerate(stored):
            if np.dtype(self.block._find_var_recursive(n).dtype) == np.dtype(dt):
                return {j: locals_.index(y)}
        return None

    def _epilogue(self, kernel, kname, locals_, store_locals, params, blocks,
                  inplace=None, pname=None) -> None:
        """One compiled call: the opaque op's blocks of samples, each followed by this loop
        kernel on it; on threads by blocks when large (a host driver), a large block's
        epilogue by its parallel variant ``pname``. ``inplace``: ``{store j: leaf i}``, the
        kernel is the variant writing stored value ``j`` into leaf ``i`` (whose local then
        holds that value too)."""
        name, fn, before, after, work = blocks
        y = self.current[name]
        lines, args = self.target.call_site(kernel, self.fresh, self.flats, locals_,
                                            store_locals, None, params, None, inplace=inplace,
                                            parallel_min_size=self.parallel_min_size)
        for line in lines:
            self.emit(line)
        epi = next(c for g, c in self.calls if g == kname)
        g = self._register(self._blocked_fn(kernel, fn, len(before), len(after), epi,
                                            pname is not None))
        self._epilogues[g] = epi
        rest = [f"{y}.shape[0]"] + ([pname, work] if pname else []) + before + after + args
        self._named(g, pname)
        if self.native:
            self.emit(f"{g}(0, {y}.shape[0], {', '.join(rest)})")
        else:
            self.emit(f"{self.target.library}.split_work({g}, {y}.shape[0], {work}, "
                      f"{', '.join(rest)}, head=0)")
        return g

    def _blocked_fn(self, kernel, fn: str, nbefore: int, nafter: int, epi,
                    parallel: bool = False):
        """The loop over blocks of samples calling the opaque op's ``fn`` then the epilogue
        kernel ``epi`` on each: compiled in a native driver (no Python between kernels there);
        in a host driver a :class:`HostFunction` (Python calling both compiled functions), so
        no copy of the library kernel is compiled into it; ``parallel``: it takes the
        epilogue's parallel variant (a host driver's)."""
        src = self.target.blocked_kernel(kernel, fn, nbefore, nafter, parallel,
                                         host=not self.native,
                                         parallel_min_size=self.parallel_min_size)
        if self.native:
            return compile_function(src, "kernel", target=self.target.name, calls=[("E", epi)])
        return HostFunction(src, "kernel", calls=[("E", epi)], target=self.target.name)

    def _offset(self, op, opdef, slot: str, rank: int) -> int:
        """Where ``slot``'s dims start within the op's output dims."""
        names = op.input(slot)
        r = len(self.block._find_var_recursive(names[0]).shape)
        if r == rank:
            return 0
        if "axis" in opdef.attrs and opdef.has(registry.BROADCAST):
            axis = op.attr("axis")
            return rank - r if axis == -1 else axis
        return rank - r
