"""Segment -> Python source for one Numba-compiled function (the CPU loop skeleton).

A segment's function takes the arrays it reads from outside (``a0, a1, ...``) and returns the
arrays it stores that are needed after it. Each group becomes:

- elementwise / reduction: a loop nest over the group's iteration shape, the broadcast of its
  inputs' run-time shapes (Fluid's ``axis`` alignment is fixed at compile time, sizes are not:
  the code specialises on ranks and dtypes only). Every input's shape is checked against the
  iteration shape before the loop, so no index can leave an array; a flat loop serves the
  common case where every input has the full shape (it vectorises), a strided loop nest the
  broadcasting case. Values used only inside the group stay scalars;
- opaque: the lines the op's ``Opaque.lower`` gives (a library call such as ``np.dot``).

A shape problem raises ``ValueError`` inside the native code; the executor then re-runs the
segment with the op references, which either report the precise error or give the answer.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework import registry
from pdjit.passes.fusion import OPAQUE, REDUCTION, Group, Segment, numpy_type_name


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


# Below this many elements a parallel loop loses to its thread start-up (measured: the
# break-even of numba's prange on 2 cores is ~1e3-1e4 elements; at 6.5e4 two threads win).
PARALLEL_MIN_SIZE = 65536


def _may_be_a_row(shape: tuple, offset: int, group_shape: tuple) -> bool:
    """Whether a leaf of build-time ``shape`` (placed at ``offset``) is one row repeated over
    the group: it ends at the group's last dim and lacks, or has size 1 at, an earlier dim the
    group has. Only then is the row loop worth compiling (it costs ~a third of a kernel's
    compile time); a leaf that turns out 1-sized only at run time takes the strided nest."""
    rank, r = len(group_shape), len(shape)
    if not r or offset + r != rank or rank < 2:
        return False
    return r < rank or any(shape[j] == 1 and group_shape[j] != 1 for j in range(r - 1))


class Declined(Exception):
    """An opaque op's lowering returned None: the op must run its reference instead."""

    def __init__(self, op):
        super().__init__(op.type)
        self.op = op


class LowerContext:
    """What an ``Opaque.lower`` sees: value names, ranks, dtypes, attributes, fresh names."""

    def __init__(self, gen: "SegmentGen", node):
        self.gen, self.node, self.op = gen, node, node.op
        opdef = registry.get(self.op.type)
        self.attrs = {k: v for k, v in self.op.all_attrs().items() if k in opdef.attrs}
        # inputs mean the values before the op: bind them now, before any output is defined
        # (an in-place op such as an optimizer update writes ParamOut into Param's name)
        self._inputs = {n: gen.read(n) for n in self.op.input_arg_names
                        if n != registry.EMPTY_VAR_NAME}

    def has_input(self, slot: str) -> bool:
        return bool([n for n in self.op.input(slot) if n != registry.EMPTY_VAR_NAME])

    def has_output(self, slot: str) -> bool:
        return bool([n for n in self.op.output(slot) if n != registry.EMPTY_VAR_NAME])

    def inp(self, slot: str, i: int = 0) -> str:
        return self._inputs[self.op.input(slot)[i]]

    def out(self, slot: str, i: int = 0) -> str:
        return self.gen.define(self.op.output(slot)[i])

    def _var(self, name):
        return self.op.block._find_var_recursive(name)

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

    def loop(self, var: str, count: str, body: list, size: str | None = None) -> list:
        """Source of ``for var in range(count): body``, run on threads (``numba.prange``) when
        ``size`` (an element count) is large; iterations must write disjoint memory."""
        indented = ["    " + line for line in body]
        if not (self.gen.parallel and size):
            return [f"for {var} in range({count}):"] + indented
        self.gen.uses_prange = True
        return ([f"if {size} >= {PARALLEL_MIN_SIZE}:", f"    for {var} in numba.prange({count}):"]
                + ["    " + line for line in indented]
                + ["else:", f"    for {var} in range({count}):"]
                + ["    " + line for line in indented])

    def lod(self, slot: str, level: int = -1, i: int = 0, optional: bool = False) -> str:
        """The local name of an ``int64`` array of the offsets of input ``slot``'s LoD at
        ``level`` (``-1``: the last level), bound at run time from the LoD the value has when
        this op runs. Without that LoD the step runs the references (which raise the clear
        error), unless ``optional``: then the array is empty."""
        return self.gen.lod_arg(self.op, self.op.input(slot)[i], level, optional)



class SegmentGen:
    """Builds the source of one segment's function."""

    def __init__(self, segment: Segment, block, needed_after: set, parallel: bool = False):
        self.segment, self.block, self.parallel = segment, block, parallel
        self.uses_prange = False      # whether a parallel loop was emitted
        self.needed_after = needed_after
        self.lines: list = []
        self.args: list = []          # env names, in argument order
        self.current: dict = {}       # env name -> local array holding its latest value
        self.counter = 0
        self.expected: list = []      # (dtype, ndim) per argument
        self.defined: set = set()     # env names this segment writes (in place ones included)
        self.lod_requests: list = []  # (op, env name, level, optional) per offsets argument

    # -- names ---------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def read(self, name: str) -> str:
        """The local array holding ``name``'s current value (an argument if not yet defined)."""
        local = self.current.get(name)
        if local is None:
            local = f"a{len(self.args)}"
            self.args.append(name)
            v = self.block._find_var_recursive(name)
            self.expected.append((v.dtype, len(v.shape)))
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

    def define(self, name: str) -> str:
        local = self.fresh("s")
        self.current[name] = local
        self.defined.add(name)
        return local

    def emit(self, line: str, indent: int = 1) -> None:
        self.lines.append("    " * indent + line)

    # -- the function --------------------------------------------------------------------------
    def generate(self) -> None:
        for gi, group in enumerate(self.segment.groups):
            # name- and size-free, so equal kernels share one cache entry across programs
            ops = ", ".join(node.op.type for node in group.nodes)
            self.emit(f"# group {gi}: {group.kind} [{ops}] rank {len(group.shape)}")
            if group.kind == OPAQUE:
                self._opaque(group)
            else:
                self._loop_group(group)
        self.outputs = [n for n in self.current if n in self.needed_after and n in self.defined]

    def source(self, fn_name: str) -> str:
        params = [f"a{i}" for i in range(len(self.args))] + \
            [f"lod{k}" for k in range(len(self.lod_requests))]
        head = f"def {fn_name}({', '.join(params)}):"
        ret = "    return (" + "".join(f"{self.current[n]}, " for n in self.outputs) + ")"
        return "\n".join([head] + self.lines + [ret])

    # -- opaque ops ----------------------------------------------------------------------------
    def _opaque(self, group: Group) -> None:
        node = group.nodes[0]
        lines = node.lowering.lower(LowerContext(self, node))
        if lines is None:
            raise Declined(node.op)
        for line in lines:
            self.emit(line)

    # -- loop nests ----------------------------------------------------------------------------
    def _loop_group(self, group: Group) -> None:
        rank = len(group.shape)
        reduce_node = group.nodes[-1] if group.kind == REDUCTION else None
        chain = group.nodes[:-1] if reduce_node else group.nodes

        # 1. walk the chain symbolically: leaves (array, offset), scalar expressions per value
        leaves: list = []              # (local array, rank, offset)
        static: list = []              # each leaf's build-time shape (-1: known at run time)
        leaf_index: dict = {}
        exprs: dict = {}               # env name -> scalar expression (a local scalar name)
        body: list = []                # statements of the element computation
        cones: dict = {}               # env name -> set of leaf ids it depends on

        def leaf(name, offset):
            local = self.read(name)
            key = (local, offset)
            if key not in leaf_index:
                v = self.block._find_var_recursive(name)
                leaf_index[key] = len(leaves)
                leaves.append((local, len(v.shape), offset))
                static.append(tuple(v.shape))
            return leaf_index[key]

        def value_of(name, offset):
            if name in exprs:
                return exprs[name], cones[name]
            lid = leaf(name, offset)
            return f"x{lid}", {lid}

        for node in chain:
            op = node.op
            opdef = registry.get(op.type)
            out_name = op.output_arg_names[0]
            subst, cone = {}, set()
            for slot in opdef.inputs:
                names = [n for n in op.input(slot.name) if n != registry.EMPTY_VAR_NAME]
                if not names:
                    continue
                off = self._offset(op, opdef, slot.name, rank)
                expr, c = value_of(names[0], off)
                subst[slot.name] = expr
                cone |= c
            attrs = {k: literal(v) for k, v in op.all_attrs().items() if k in opdef.attrs}
            t = numpy_type_name(self.block._find_var_recursive(out_name).dtype)
            local = self.fresh("e")
            body.append(f"{local} = {node.lowering.format(T=t, **attrs, **subst)}")
            exprs[out_name], cones[out_name] = local, cone

        if reduce_node is not None:
            x_name = reduce_node.op.input("X")[0]
            red_expr, red_cone = value_of(x_name, 0)
        # 2. iteration dims: broadcast of the leaves, checked
        dims = [f"d{self.fresh('')}" for _ in range(rank)]
        for d in range(rank):
            self.emit(f"{dims[d]} = 1")
        for local, r, off in leaves:
            for j in range(r):
                self.emit(f"{dims[off + j]} = _rt.bdim({dims[off + j]}, {local}.shape[{j}])")
        total = self.fresh("n")
        self.emit(f"{total} = " + (" * ".join(dims) if dims else "1"))
        # values stored by the group must have the full shape (their own inputs cover it)
        stored_chain = [n for n in group.stored if n in exprs]
        for name in stored_chain:
            for d in range(rank):
                cover = [f"{loc}.shape[{d - off}] == {dims[d]}"
                         for lid, (loc, r, off) in enumerate(leaves)
                         if lid in cones[name] and off <= d < off + r]
                cond = " or ".join([f"{dims[d]} == 1"] + cover)
                self.emit(f"if not ({cond}): raise ValueError('pdjit: fused value of a smaller "
                          f"shape')")
        shape_tuple = "(" + "".join(f"{d}, " for d in dims) + ")"
        flat = {}
        for name in stored_chain:
            arr = self.define(name)
            t = numpy_type_name(self.block._find_var_recursive(name).dtype)
            self.emit(f"{arr} = np.empty({shape_tuple}, {t})")
            flat[name] = f"{arr}f"
            self.emit(f"{arr}f = {arr}.reshape({total})")
        for lid, (local, _, _) in enumerate(leaves):
            self.emit(f"L{lid} = {local}.reshape({local}.size)")
        loads = [f"x{lid} = L{lid}[IDX{lid}]" for lid in range(len(leaves))]
        stores = [f"{flat[n]}[o] = {exprs[n]}" for n in stored_chain]
        if reduce_node is None:
            rows = any(_may_be_a_row(shape, off, group.shape)
                       for shape, (_, _, off) in zip(static, leaves))
            self._emit_loops(leaves, dims, total, body, loads, stores, reduce=None,
                             row_path=rows)
            return
        self._reduction(reduce_node, leaves, dims, total, body, loads, stores, red_expr)

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

    def _emit_loops(self, leaves, dims, total, body, loads, stores, reduce, flat_ok=True,
                    row_path=False):
        """The flat loop (every input full-size), the row loop when ``row_path`` (see
        ``_row_path``) and the strided loop nest (any broadcasting)."""
        full = " and ".join(f"{loc}.size == {total}" for loc, _, _ in leaves) or "True"
        if not flat_ok:
            full = "False"
        self.emit(f"if {full}:")
        flat_body = [line.replace(f"IDX{lid}", "o") for lid, line in enumerate(loads)] + \
            body + stores + (reduce["flat"] if reduce else [])
        if self.parallel and reduce is None:
            # threads pay off only on large arrays: decided here, at run time, by size
            self.uses_prange = True
            self.emit(f"if {total} >= {PARALLEL_MIN_SIZE}:", 2)
            self.emit(f"for o in numba.prange({total}):", 3)
            for line in flat_body:
                self.emit(line, 4)
            self.emit("else:", 2)
            self.emit(f"for o in range({total}):", 3)
            for line in flat_body:
                self.emit(line, 4)
        else:
            self.emit(f"for o in range({total}):", 2)
            for line in flat_body:
                self.emit(line, 3)
        rank = len(dims)
        row_leaves = [lid for lid, (_, r, off) in enumerate(leaves) if r and off + r == rank]
        if row_path and reduce is None and rank >= 2 and row_leaves:
            self._row_path(leaves, dims, total, body, loads, stores)
        self.emit("else:")
        # element strides of each leaf along each iteration dim (0 where it broadcasts)
        for lid, (loc, r, off) in enumerate(leaves):
            for j in range(r):
                later = " * ".join(f"{loc}.shape[{k}]" for k in range(j + 1, r)) or "1"
                self.emit(f"st{lid}_{off + j} = 0 if {loc}.shape[{j}] == 1 else {later}", 2)
        if reduce:
            for line in reduce["setup"]:
                self.emit(line, 2)
        self.emit("o = 0", 2)
        for d in range(rank):
            ind = 2 + d
            self.emit(f"for i{d} in range({dims[d]}):", ind)
            for lid, (_, r, off) in enumerate(leaves):
                prev = f"b{lid}_{d - 1}" if d > 0 else "0"
                step = f" + i{d} * st{lid}_{d}" if off <= d < off + r else ""
                self.emit(f"b{lid}_{d} = {prev}{step}", ind + 1)
            if reduce:
                for line in reduce["index"](d):
                    self.emit(line, ind + 1)
        ind = 2 + rank
        for lid, line in enumerate(loads):
            self.emit(line.replace(f"IDX{lid}", f"b{lid}_{rank - 1}" if rank else "0"), ind)
        for line in body + stores + (reduce["nested"] if reduce else []):
            self.emit(line, ind)
        self.emit("o += 1", ind)

    def _row_path(self, leaves, dims, total, body, loads, stores) -> None:
        """Rows of the last dim, each input either full-size or one row repeated (a bias):
        unit-stride inner loops that vectorise, where the strided nest would not."""
        last = dims[-1]
        cond = " and ".join(
            f"({loc}.size == {total} or ({loc}.size == {last} and {loc}.shape[{r - 1}] == {last}))"
            if off + r == len(dims) and r else f"{loc}.size == {total}"
            for loc, r, off in leaves)
        self.emit(f"elif {last} > 0 and {cond}:")
        self.emit(f"for r in range({total} // {last}):", 2)
        for lid, (loc, _, _) in enumerate(leaves):
            self.emit(f"rb{lid} = r * {last} if {loc}.size == {total} else 0", 3)
        self.emit(f"ob = r * {last}", 3)
        self.emit(f"for k in range({last}):", 3)
        self.emit("o = ob + k", 4)
        for lid, line in enumerate(loads):
            self.emit(line.replace(f"IDX{lid}", f"rb{lid} + k"), 4)
        for line in body + stores:
            self.emit(line, 4)

    def _reduction(self, node, leaves, dims, total, body, loads, stores, x_expr) -> None:
        red = node.lowering
        rank = len(dims)
        axes = tuple(range(rank)) if red.axes is None else \
            tuple(sorted({a % max(rank, 1) for a in red.axes}))
        out_name = node.op.output("Out")[0]
        t = numpy_type_name(self.block._find_var_recursive(out_name).dtype)
        fmt = dict(T=t)
        kept = [d for d in range(rank) if d not in axes]
        out_dims = [(dims[d] if d in kept else "1") for d in range(rank)] if red.keep_dim \
            else [dims[d] for d in kept]
        out = self.define(out_name)
        acc = self.fresh("acc")
        count = self.fresh("m")
        out_total = " * ".join(dims[d] for d in kept) or "1"
        self.emit(f"{count} = ({total} // ({out_total})) if ({out_total}) > 0 else 0")
        init = red.init.format(**fmt)
        combine = red.combine.format(acc="{acc}", x=x_expr, **fmt)
        finalize = red.finalize.format(acc="{acc}", n=count, **fmt)
        shape = "(" + "".join(f"{d}, " for d in out_dims) + ")"
        if not kept:  # reduce everything: accumulate in a register
            self.emit(f"{acc} = {init}")
            reduce = {"flat": [f"{acc} = {combine.format(acc=acc)}"], "setup": [],
                      "nested": [f"{acc} = {combine.format(acc=acc)}"], "index": lambda d: []}
            self._emit_loops(leaves, dims, total, body, loads, stores, reduce)
            self.emit(f"{out} = np.empty({shape}, {t})")
            self.emit(f"{out}.reshape(1)[0] = {finalize.format(acc=acc)}")
            return
        self.emit(f"{out} = np.empty({shape}, {t})")
        self.emit(f"{acc} = {out}.reshape({out}.size)")
        self.emit(f"{acc}[:] = {init}")
        ostride = {}
        for i, d in enumerate(kept):
            ostride[d] = " * ".join(dims[k] for k in kept[i + 1:]) or "1"
        item = f"{acc}[q{rank - 1 if rank else 0}]"
        reduce = {
            "flat": [f"{acc}[oq] = {combine.format(acc=acc + '[oq]')}"],
            "setup": [],
            "nested": [f"{item} = {combine.format(acc=item)}"],
            "index": lambda d: [f"q{d} = {f'q{d - 1}' if d else '0'}"
                                f"{f' + i{d} * ({ostride[d]})' if d in ostride else ''}"],
        }
        # the flat path needs the output index of element o: decompose o only when reducing
        # a suffix of dims (then oq = o // reduced_count), else use the nested path
        suffix = axes == tuple(range(rank - len(axes), rank))
        if suffix:
            reduce["flat"] = [f"oq = o // {count} if {count} > 0 else 0"] + reduce["flat"]
            self._emit_loops(leaves, dims, total, body, loads, stores, reduce)
        else:
            self._emit_loops(leaves, dims, total, body, loads, stores, reduce, flat_ok=False)
        self.emit(f"for k in range({acc}.size):")
        self.emit(f"{acc}[k] = {finalize.format(acc=acc + '[k]')}", 2)
