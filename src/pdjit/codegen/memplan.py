"""The memory plan of a host driver: intermediate buffers reused and released by liveness.

A host driver (``pdjit.codegen.cpu.target.HostDriver``) is straight-line Python: one block of
statements per fusion group, each group's outputs allocated with ``np.empty`` / ``np.zeros``
(the kernels take their outputs as arguments) or made by a library call or a view. Left alone,
every local lives until the driver returns, so a segment's peak memory is the sum of all its
intermediates. :func:`plan_driver` rewrites the driver's source (``Executor(memory_optim=
True)``; the plan's ``report()`` shows what it decided):

1. **Liveness.** For every local, the last top-level statement that touches it. An array
   reached through another local (``reshape``, ``.T``, slicing, a view op's lowering, a kernel
   that might return one of its arguments) is an alias: a buffer lives until the last touch of
   any local that may point into it. The analysis is conservative: an expression it does not
   know to make a new array (a call it does not know, a method it does not know) may alias
   every array it reads; what is known to be fresh (``np.empty``, ``_rt.gemm``, ``.copy()``,
   a reduction, arithmetic) aliases nothing; ``.shape`` / ``.size`` / ``.dtype`` never alias.
2. **In place.** An elementwise kernel's output takes the buffer of one of its full-shape
   leaves (same dtype) when nothing reads that buffer after the kernel: the target's loop
   forms that read each such leaf at the very element they then write (``inplace_forms`` of
   the target; the lowering lists the candidates) make that exact. A convolution's output and
   the bias + activation after it then share one buffer. An op computed by a library kernel
   that adds a residual as it stores (a convolution, a product by a weight) takes the
   residual's buffer likewise: those kernels read each residual value before they write over
   it (``conv._taps_range``).
3. **Slots.** Every other top-level ``X = np.empty(shape, dtype)`` / ``np.zeros`` (a
   *tenant*) whose buffer never leaves the driver is given a slot by interval colouring over
   the tenants' live ranges: tenants of one slot have the same dtype, live ranges that do not
   overlap, and build-time sizes within 1.25x of each other (a larger buffer would sit half
   idle, a smaller one is allocated again anyway), so a later tenant takes the buffer of a
   dead one. A slot is a 1-D buffer sized at run time as the largest of its tenants (sizes
   depend on the batch): the first tenant allocates as before and becomes the slot; a later
   one views the slot's first elements, or, when the slot is smaller than it or more than
   twice its size, drops the slot's buffer and allocates its own. Small allocations of a size
   fixed at build time (bn's saved statistics) keep their ``np.empty``.
4. **Release.** Every other array local is ``del``-ed right after its last touch, and a slot
   after its last tenant's, so the memory returns to the allocator at once; an array read only
   for its shape after some point has its shape (size...) bound to locals of their own there
   and is released.

Never freed or reused: the driver's arguments (a native step's fallback re-runs the references
on them, untouched), and any buffer that a returned value may point into (the outputs, which
later steps, fallbacks and the user read); a tenant whose buffer may escape keeps its own
``np.empty``.

Slot buffers live for one call of the driver, never across calls: executors may be shared by
threads, and buffers kept between runs would raise the memory held between runs, the thing
this plan lowers (measured, ``benchmarks/bench_memory.py``: with glibc's heap kept by
``pdjit.codegen.cpu.malloc`` a fresh ``np.empty`` costs ~0.2 us, so keeping buffers has little
time to win). Native loop bodies (``pdjit.codegen.loops``) are not rewritten: Numba already
releases every array at the end of its liveness in compiled code, and a loop's carried
values are rebound every iteration.
"""
from __future__ import annotations

import ast
import hashlib
import math
import operator
import os
import pickle
import re
import sys
from dataclasses import dataclass, field

from pdjit.framework.files import read_checked, write_checked

# attributes whose value is a size, never an array that aliases the receiver's buffer
_SCALAR_ATTRS = frozenset({"shape", "size", "ndim", "dtype", "itemsize", "nbytes", "strides"})
# (module, function) calls known to return a new array (when given no ``out``)
_FRESH_FUNCS = frozenset({("np", f) for f in (
    "empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like",
    "arange", "eye", "identity")} | {("_rt", "gemm"), ("np", "dot"), ("np", "matmul")})
# methods known to return a new array when called with at most one positional argument and no
# ``out`` (an axis); ``copy`` and ``astype`` (without ``copy=``) always copy
_FRESH_METHODS = frozenset({"copy", "astype", "sum", "max", "min", "mean", "prod", "any",
                            "all", "argmax", "argmin", "cumsum", "cumprod", "tolist", "item"})
# methods whose result is a view of the receiver (or, for some, a copy when it cannot be one)
_VIEW_METHODS = frozenset({"reshape", "view", "transpose", "ravel", "squeeze", "swapaxes",
                           "__getitem__"})
# calls whose result is a size or a flag when their arguments are
_SCALAR_FUNCS = frozenset({"max", "min", "int", "float", "bool", "len", "abs", "range"})
# methods that write an array in place and keep no reference to their arguments
_INPLACE_METHODS = frozenset({"fill", "sort", "partition", "setflags", "itemset"})
# an allocation of fewer elements than this, of a size known at build time, keeps its own
# np.empty (freed after its last use): a slot's bookkeeping would cost more than it saves
SMALL = 4096


def numel(shape) -> int:
    """The element count of ``shape`` (an int or a sequence of ints); a negative dim raises
    ``ValueError`` as ``np.empty`` does (the executor then runs the references)."""
    if not isinstance(shape, (tuple, list)):
        shape = (shape,)
    n = 1
    for d in shape:
        d = operator.index(d)
        if d < 0:
            raise ValueError("pdjit: negative dimensions are not allowed")
        n *= d
    return n


@dataclass
class Tenant:
    """A driver-allocated output placed in a slot."""
    local: str          # the driver's local bound by the allocation
    stmt: int           # its top-level statement
    end: int            # the last top-level statement touching any local that may alias it
    dtype: str          # the dtype's source text
    zero: bool          # np.zeros: the buffer it takes is zeroed
    label: str          # the program variable it holds (for reports)
    estimate: int       # elements per sample at build time (-1 dims as 1), or 0 if unknown
    dynamic: bool       # whether some dim is unknown until run time (the batch)
    slot: int | None = None


@dataclass
class MemoryPlan:
    """What :func:`plan_driver` decided for one driver (``describe()`` shows it)."""
    slots: list = field(default_factory=list)      # [(dtype text, [Tenant])]
    released: dict = field(default_factory=dict)   # statement -> [what is freed after it]
    group_of: list = field(default_factory=list)   # statement -> group index
    kept: list = field(default_factory=list)       # [(Tenant, why)] allocations left as they were
    inplace: list = field(default_factory=list)    # [(statement, output, the leaf it overwrites)]
    group_lines: list = field(default_factory=list)  # group -> its first line in the new source
    # [(output, leaf, {old global: new})]: the in-place rewrites that switched a call to a
    # kernel variant, in order (replayed on the generator when the plan is read back)
    variants: list = field(default_factory=list)

    def describe(self, indent: str = "") -> str:
        lines = []
        for k, (dtype, tenants) in enumerate(self.slots):
            who = ", ".join(f"{t.label} (groups {self.group_of[t.stmt]}-"
                            f"{self.group_of[min(t.end, len(self.group_of) - 1)]})"
                            for t in tenants)
            lines.append(f"{indent}slot {k} [{dtype.removeprefix('np.')}]: {who}")
        for stmt, out, leaf in self.inplace:
            lines.append(f"{indent}in place: {out} over {leaf} (group {self.group_of[stmt]})")
        by_group: dict = {}
        for stmt, shown in sorted(self.released.items()):
            by_group.setdefault(self.group_of[stmt], []).extend(shown)
        for g, labels in by_group.items():
            lines.append(f"{indent}released after group {g}: {', '.join(labels)}")
        for t, why in self.kept:
            lines.append(f"{indent}own buffer: {t.label} ({why})")
        return "\n".join(lines) or f"{indent}(nothing to reuse or release)"

    @property
    def tenants(self) -> int:
        return sum(len(ts) for _, ts in self.slots)


# ---- analysis ------------------------------------------------------------------------------------
def _names(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _store_targets(target) -> list:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _store_targets(t)]
    if isinstance(target, ast.Starred):
        return _store_targets(target.value)
    return []   # a subscript or attribute store writes into an array: no new binding


def _dotted(func):
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id, func.attr
    return None


class _Aliases:
    """Which tenant buffers each local may point into (a fixpoint over every binding)."""

    def __init__(self, nodes, locals_: set, scalars: set, tenants: dict):
        """``nodes``: every node of the driver's statements (:func:`_flat`)."""
        self.locals, self.scalars = locals_, scalars
        self.bufs: dict = {n: set() for n in locals_}
        for name, stmt in tenants.items():
            self.bufs[name].add(stmt)
        bindings = []   # (target names, value expr or None, extra locals merged in)
        for node in nodes:
            if isinstance(node, ast.Assign):
                if getattr(node, "_pdjit_tenant", False):
                    continue
                names = [n for t in node.targets for n in _store_targets(t)]
                if isinstance(node.value, ast.Call) and not self._is_view(node.value):
                    # a call may make a new array: a buffer of its own (besides aliases)
                    for n in names:
                        if n in self.bufs:
                            self.bufs[n].add(("new", id(node)))
                bindings.append((names, node.value))
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                bindings.append((_store_targets(node.target), node.value))
            elif isinstance(node, ast.NamedExpr):
                bindings.append((_store_targets(node.target), node.value))
            elif isinstance(node, (ast.For, ast.comprehension)):
                bindings.append((_store_targets(node.target), node.iter))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                bindings.append((_store_targets(node.optional_vars), node.context_expr))
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                # obj.method(args): a method that might keep a reference to its arguments
                d = _dotted(node.value.func)
                if d is not None and d[0] in locals_ and d[1] not in _INPLACE_METHODS:
                    bindings.append(([d[0]], node.value))
        changed = True
        while changed:
            changed = False
            for names, value in bindings:
                got = self.of(value)
                for n in names:
                    if n in self.bufs and not got <= self.bufs[n]:
                        self.bufs[n] |= got
                        changed = True

    def of(self, e) -> set:
        """The tenant buffers the value of expression ``e`` may point into."""
        if e is None or isinstance(e, ast.Constant):
            return set()
        if isinstance(e, ast.Name):
            return set(self.bufs.get(e.id, ())) if e.id not in self.scalars else set()
        if isinstance(e, ast.Attribute):
            return set() if e.attr in _SCALAR_ATTRS else self.of(e.value)
        if isinstance(e, (ast.BinOp, ast.UnaryOp, ast.Compare)):
            return set()   # arithmetic makes a new array (or a scalar)
        if isinstance(e, ast.Subscript):
            return self.of(e.value)   # a view, or an element; fancy indexing copies
        if isinstance(e, ast.Call):
            return self._call(e)
        out = set()   # tuples, conditionals, comprehensions...: whatever they mention
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr):
                out |= self.of(child)
        return out

    def _is_view(self, e: ast.Call) -> bool:
        """A method call that may return a view of its receiver (and nothing new)."""
        return isinstance(e.func, ast.Attribute) and e.func.attr in _VIEW_METHODS and \
            not self._fresh(e)

    def _fresh(self, e: ast.Call) -> bool:
        kws = {k.arg for k in e.keywords}
        d = _dotted(e.func)
        if d is not None and d in _FRESH_FUNCS and "out" not in kws and \
                (d[1] not in ("dot", "matmul") or len(e.args) <= 2):
            return True
        return isinstance(e.func, ast.Attribute) and e.func.attr in _FRESH_METHODS and \
            "out" not in kws and "copy" not in kws and len(e.args) <= 1

    def _call(self, e: ast.Call) -> set:
        if self._fresh(e):
            return set()
        if isinstance(e.func, ast.Name) and e.func.id in _SCALAR_FUNCS:
            return set()
        out = self.of(e.func.value) if isinstance(e.func, ast.Attribute) else set()
        for a in e.args:
            out |= self.of(a)
        for k in e.keywords:
            out |= self.of(k.value)
        return out


def _scalar_names(nodes, params: set) -> set:
    """Locals bound only to sizes, shapes and flags (never arrays): nothing to release
    (``nodes``: every node of the driver's statements, :func:`_flat`)."""
    scalars: set = set()

    def scalar(e) -> bool:
        if isinstance(e, ast.Constant):
            return True
        if isinstance(e, ast.Name):
            return e.id in scalars
        if isinstance(e, ast.Attribute):
            return e.attr in _SCALAR_ATTRS and e.attr != "strides" or \
                (isinstance(e.value, ast.Name) and e.value.id == "math")
        if isinstance(e, ast.Subscript):
            return scalar(e.value) and scalar(e.slice)
        if isinstance(e, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp,
                          ast.Tuple)):
            return all(scalar(c) for c in ast.iter_child_nodes(e)
                       if isinstance(c, ast.expr))
        if isinstance(e, ast.Call):
            d = _dotted(e.func)
            ok = (isinstance(e.func, ast.Name) and e.func.id in _SCALAR_FUNCS) or \
                d == ("_rt", "bdim") or (d is not None and d[0] == "math")
            return ok and all(scalar(a) for a in e.args) and not e.keywords
        return False

    binds: dict = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in _store_targets(t):
                    binds.setdefault(n, []).append(node.value if isinstance(t, ast.Name)
                                                   else None)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.NamedExpr, ast.AnnAssign,
                               ast.comprehension, ast.withitem)):
            tgt = getattr(node, "target", None) or getattr(node, "optional_vars", None)
            for n in _store_targets(tgt) if tgt is not None else ():
                binds.setdefault(n, []).append(None)   # may be anything
    changed = True
    while changed:
        changed = False
        for n, values in binds.items():
            if n not in scalars and n not in params and \
                    all(v is not None and scalar(v) for v in values):
                scalars.add(n)
                changed = True
    return scalars


def _joined_parts(nodes) -> set:
    """The locals a statement (``nodes``: each statement's, :func:`_flat`) joins by
    ``np.concatenate((a, b, ...), ...)``. Each keeps a buffer of its own: a replay of the driver
    (``pdjit.codegen.cpu.replay``) has the calls that make a part write it into the concat's
    result, in place, where the part's memory is a buffer no other value takes after the
    concat; a slot's next tenant would take it (and the replay plans its own reuse: SqueezeNet
    1.1's eight concats copied 0.53 of its 4.2 ms at batch 1 on two threads)."""
    out = set()
    for ns in nodes:
        for node in ns:
            if isinstance(node, ast.Call) and _dotted(node.func) == ("np", "concatenate") and \
                    node.args and isinstance(node.args[0], (ast.Tuple, ast.List)):
                out.update(e.id for e in node.args[0].elts if isinstance(e, ast.Name))
    return out


def _tenant_call(stmt):
    """``(name, shape expr, dtype text, zero)`` when ``stmt`` is ``X = np.empty(shape, dt)`` or
    ``np.zeros``, else None."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and
            isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    d = _dotted(call.func)
    if d not in (("np", "empty"), ("np", "zeros")) or len(call.args) != 2 or call.keywords:
        return None
    shape = call.args[0]
    if any(isinstance(x, ast.Constant) and x.value == 0
           for x in (shape.elts if isinstance(shape, ast.Tuple) else (shape,))):
        return None   # always empty (a kernel's "no bias" argument): nothing to reuse
    return stmt.targets[0].id, shape, ast.unparse(call.args[1]), d[1] == "zeros"


# ---- the plan ------------------------------------------------------------------------------------
def _flat(node) -> list:
    """Every node under ``node`` (``ast.walk``'s order), once: the analyses each go over these
    lists rather than walking the tree again (a large model's driver: ~10,000 nodes)."""
    return list(ast.walk(node))


def _touches(nodes, locals_: set):
    """(locals a statement mentions, those it reads for more than their shape/size/dtype);
    ``nodes``: the statement's nodes (:func:`_flat`)."""
    meta_only = set()
    for node in nodes:
        if isinstance(node, ast.Attribute) and node.attr in _SCALAR_ATTRS and \
                isinstance(node.value, ast.Name):
            meta_only.add(id(node.value))
    touched, data = set(), set()
    for node in nodes:
        if isinstance(node, ast.Name) and node.id in locals_:
            touched.add(node.id)
            if id(node) not in meta_only:
                data.add(node.id)
    return touched, data


class _Liveness:
    """Per local: the statement of its last touch, of its last read of more than its shape
    (after which a Meta of it serves), of its first top-level binding; which locals are
    released (Meta or del) and where each may-alias set ends."""

    def __init__(self, stmts, nodes, locals_, params, returned, scalars):
        """``nodes``: each statement's nodes (:func:`_flat`)."""
        self.last, self.data_last, self.bound_at = {}, {}, {}
        for i, st in enumerate(stmts):
            touched, data = _touches(nodes[i], locals_)
            for n in touched:
                self.last[n] = i
            for n in data:
                self.data_last[n] = i
            if isinstance(st, ast.Assign):
                for t in st.targets:
                    for n in _store_targets(t):
                        self.bound_at.setdefault(n, i)
        final = len(stmts) - 1
        self.releasable = {n for n, i in self.last.items()
                           if n not in params and n not in returned and n not in scalars and
                           n in self.bound_at and
                           self.bound_at[n] <= self.data_last.get(n, -1) and i < final}
        self.metas = {n for n in self.releasable if self.data_last[n] < self.last[n]}
        self.end_of = {n: (self.data_last[n] if n in self.metas else i)
                       for n, i in self.last.items()}


def _first_call_with(stmts, start: int, out: set, leaf: set):
    """The first statement after ``start`` that passes one of the names ``out`` (an output's
    buffer: its array, views of it) and one of ``leaf`` (an input's buffer) to one call: where
    an output meets the input whose buffer it may take (not a check of its shape before)."""
    for j in range(start + 1, len(stmts)):
        for node in ast.walk(stmts[j]):
            if isinstance(node, ast.Call):
                names = {a.id for a in node.args if isinstance(a, ast.Name)}
                if names & out and names & leaf:
                    return j
    return None


#: the plans of drivers without in-place candidates, in the cache directory (see plan_driver)
PLAN_DIR = "memplan"


def plan_driver(source: str, labels: dict | None = None, estimates: dict | None = None,
                inplace: dict | None = None, groups=()):
    """:func:`_plan_driver`, its result kept in the cache directory (``<cache dir>/memplan``,
    keyed by the arguments and this module's file: a later process reads the plan of a large
    model's driver instead of making it again (ResNet-50's: 40-60 ms of a warm start). A plan
    whose in-place rewrites switched calls to kernel variants (``inplace``'s callbacks, which
    register them with the generator) is read back only by calling the same callbacks in the
    same order (:func:`_replay`)."""
    path = _plan_path(source, labels, estimates, groups, inplace)
    got = _read_plan(path) if path is not None else None
    if got is not None:
        got = _replay(got, inplace or {})
    if got is None:
        got = _plan_driver(source, labels, estimates, inplace, groups)
        if path is not None:
            write_checked(path, pickle.dumps(got, protocol=pickle.HIGHEST_PROTOCOL))
    return got


def _replay(got, inplace: dict):
    """``got`` (a plan read back) once its kernel-variant rewrites are made again on the
    generator (``inplace``'s callbacks, in the plan's order); the new source's globals renamed
    where a callback named a variant otherwise than when it was planned (it does not: the
    generator is in the same state for the same arguments). None, with no callback called,
    where the plan names a rewrite the offers do not make."""
    src, plan = got
    for local, leaf, _ in plan.variants:
        offer = inplace.get(local)
        if offer is None or len(offer) < 3 or offer[2] is None or leaf not in offer[0]:
            return None
    moved = {}
    for local, leaf, renames in plan.variants:
        now = inplace[local][2](leaf)
        moved.update({new: now[old] for old, new in renames.items()
                      if old in now and now[old] != new})
    if moved:
        src = re.sub(r"\b(" + "|".join(map(re.escape, moved)) + r")\b",
                     lambda m: moved[m.group(1)], src)
    return src, plan


def _plan_path(source, labels, estimates, groups, inplace=None):
    """Where the plan of these arguments is kept (None: arguments that have no stable text)."""
    from pdjit.codegen.diskcache import cache_dir

    try:
        st = os.stat(__file__)
        offers = sorted((k, list(v[0]), list(v[1]), len(v) > 2 and v[2] is not None)
                        for k, v in (inplace or {}).items())
        key = repr((source, sorted((labels or {}).items()), sorted((estimates or {}).items()),
                    list(groups), offers, st.st_size, st.st_mtime_ns, sys.version_info[:2]))
    except (OSError, TypeError):
        return None
    return cache_dir() / PLAN_DIR / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.pickle"


def _read_plan(path):
    """The ``(source, MemoryPlan)`` kept at ``path``, or None (none there, or not right)."""
    payload = read_checked(path)
    if payload is None:
        return None
    try:
        got = pickle.loads(payload)
    except Exception:  # noqa: BLE001 - a file that is not right is planned again
        return None
    ok = isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], str) and \
        isinstance(got[1], MemoryPlan)
    return got if ok else None


def _plan_driver(source: str, labels: dict | None = None, estimates: dict | None = None,
                 inplace: dict | None = None, groups=()):
    """``(new source, MemoryPlan)`` for the driver function ``source`` (one ``def`` whose last
    statement returns its outputs). ``labels``: local -> the program variable it holds;
    ``estimates``: local -> (elements per sample at build time, unknown dims as 1; whether
    some dim is unknown until run time) (best-fit slot choice; small fixed sizes keep their
    own allocation);
    ``inplace``: a kernel's output allocation -> (the leaves of its size and dtype whose
    buffer it may take when nothing reads them after the kernel, the kernel's other
    arguments, optionally ``variant(leaf) -> {old global: new}``: the renames that make the
    kernel call write the leaf itself; without one the call writes it as it is); the output
    then views the leaf's buffer in the allocation's shape.
    ``groups``: the 1-based line of ``source`` where each fusion group begins (a comment line
    between statements, as the generator records them: ``SegmentGen.group_lines``); the
    plan's ``group_lines`` says where each begins in the new source."""
    labels, estimates, inplace = labels or {}, estimates or {}, inplace or {}
    tree = ast.parse(source)
    fn = tree.body[0]
    stmts = fn.body
    params = {a.arg for a in fn.args.args}
    returned = _names(stmts[-1]) if isinstance(stmts[-1], ast.Return) else set()
    locals_ = set(params)
    binds_count: dict = {}
    nodes = [_flat(st) for st in stmts]
    every = [node for ns in nodes for node in ns]
    for node in every:
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            locals_.add(node.id)
            if isinstance(node.ctx, ast.Store):
                binds_count[node.id] = binds_count.get(node.id, 0) + 1
    scalars = _scalar_names(every, params)

    # which statement belongs to which group (where the generator says each begins)
    lines = source.splitlines()
    starts = {line: g for g, line in enumerate(groups)}
    group_at, g = [], 0
    for n in range(1, len(lines) + 1):
        g = starts.get(n, g)
        group_at.append(g)
    plan = MemoryPlan(group_of=[group_at[st.lineno - 1] for st in stmts])

    cands: dict = {}   # local -> (stmt index, shape, dtype, zero)
    for i, st in enumerate(stmts):
        got = _tenant_call(st)
        if got is not None and binds_count.get(got[0]) == 1 and got[0] not in params:
            cands[got[0]] = (i,) + got[1:]
            st._pdjit_tenant = True

    def analyse(again=()):  # (again after statements are rewritten: their nodes listed anew)
        for j in again:
            nodes[j] = _flat(stmts[j])
        return (_Liveness(stmts, nodes, locals_, params, returned, scalars),
                _Aliases([node for ns in nodes for node in ns], locals_, scalars,
                         {n: c[0] for n, c in cands.items()}))

    live, aliases = analyse()

    view_of = {}   # Y -> X for the top-level views Y = X.reshape(...) and the like
    for st in stmts:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and \
                isinstance(st.targets[0], ast.Name) and isinstance(st.value, ast.Call) and \
                isinstance(st.value.func, ast.Attribute) and \
                st.value.func.attr in _VIEW_METHODS and isinstance(st.value.func.value, ast.Name):
            view_of.setdefault(st.targets[0].id, st.value.func.value.id)

    def label_of(local):
        if local in labels:
            return labels[local]
        for y, x in view_of.items():   # the program variable a view of it holds
            if x == local and y in labels:
                return labels[y]
        for n, bufs in aliases.bufs.items():
            if n in labels and bufs == aliases.bufs[local]:
                return labels[n]
        return local

    # in place: a kernel's output takes the buffer of a leaf of its size (an elementwise
    # kernel's full-shape leaf, a convolution's residual) that nothing reads after the kernel
    rewritten: dict = {}   # statement -> its new source
    renamed: set = set()   # call statements switched to in-place kernel variants
    # The analyses are made again once, after every rewrite, not after each (a ResNet-50's
    # driver: 17 rewrites, 12 ms an analysis). Those made before stay right for the checks:
    # a rewrite joins an output's buffer to its leaf's, whose other names all end at or
    # before its call, which comes before any later call that reads the output; a buffer
    # taken once is not offered again (two outputs of one call offered the same leaf).
    taken: set = set()
    for local in sorted((n for n in inplace if n in cands), key=lambda n: cands[n][0]):
        i = cands[local][0]
        full, others, variant = (tuple(inplace[local]) + (None,))[:3]
        outs = {n for n, bs in aliases.bufs.items() if i in bs}  # the output's names
        for leaf in full:
            bufs = aliases.bufs.get(leaf, set())
            if len(bufs) != 1 or bufs & taken:
                continue
            buf = next(iter(bufs))
            users = [n for n, bs in aliases.bufs.items() if buf in bs]
            call = _first_call_with(stmts, i, outs, set(users))
            if call is None or any(n in returned or n in params or
                                   live.end_of.get(n, -1) > call for n in users) or \
                    any(buf in aliases.bufs.get(m, ()) for m in others):
                continue
            shape = cands[local][1]
            text = f"{local} = {leaf}.reshape({ast.unparse(shape)})"
            stmts[i].value = ast.Call(ast.Attribute(ast.Name(leaf, ast.Load()), "reshape",
                                                    ast.Load()), [shape], [])
            stmts[i]._pdjit_tenant = False
            del cands[local]
            rewritten[i] = text
            if variant is not None:   # the kernel variant that writes the leaf itself
                renames = variant(leaf)
                _Rename(renames).visit(stmts[call])
                renamed.add(call)
                plan.variants.append((local, leaf, dict(renames)))
            plan.inplace.append((i, label_of(local), label_of(leaf)))
            taken.add(buf)
            break
    if taken:
        live, aliases = analyse(again=list(rewritten) + list(renamed))

    joined = _joined_parts(nodes)
    tenants = []
    for local, (i, _, dtype, zero) in sorted(cands.items(), key=lambda kv: kv[1][0]):
        users = [n for n, bufs in aliases.bufs.items() if i in bufs]
        est = estimates.get(local) or next((estimates[n] for n in users if n in estimates),
                                           (0, True))
        t = Tenant(local, i, max(live.end_of.get(n, i) for n in users), dtype, zero,
                   label_of(local), est[0], est[1])
        escaped = [n for n in users if n in returned]
        parts = [n for n in users if n in joined]
        if escaped:
            plan.kept.append((t, f"returned as {label_of(escaped[0])}"))
        elif parts:
            plan.kept.append((t, f"a part of a concat ({label_of(parts[0])})"))
        elif not est[1] and est[0] < SMALL:
            continue   # small, of a size fixed at build time: a slot saves nothing
        else:
            tenants.append(t)

    # interval colouring: a tenant takes a free slot of its dtype whose buffer fits it (the
    # build-time size estimates within 1.25x: a buffer larger than its tenant holds memory
    # idle, a smaller one is allocated again anyway), the closest in size, else opens a new
    # one
    slots = []   # [dtype, [tenants], capacity estimate, dynamic]
    for t in tenants:
        free = [sl for sl in slots if sl[0] == t.dtype and sl[1][-1].end < t.stmt and
                _fits(sl[2], sl[3], t.estimate, t.dynamic)]
        if free:
            pick = min(free, key=lambda sl: (abs(math.log((sl[2] or 1) / (t.estimate or 1))),
                                             -sl[1][-1].end))
            pick[1].append(t)
            pick[2] = max(pick[2], t.estimate)
        else:
            slots.append([t.dtype, [t], t.estimate, t.dynamic])
    slots = [sl for sl in slots if len(sl[1]) > 1]   # a slot of one tenant reuses nothing
    for k, sl in enumerate(slots):
        for t in sl[1]:
            t.slot = k
    plan.slots = [(sl[0], sl[1]) for sl in slots]
    slot_bufs = {t.stmt for _, ts in plan.slots for t in ts}

    # fresh names for the plan's own locals
    prefix = "_mp"
    while any(n.startswith(prefix) for n in locals_):
        prefix += "_"
    slot_var = [f"{prefix}M{k}" for k in range(len(plan.slots))]

    # an array read only for its shape after some point: its shape (size, dtype...) bound to
    # locals of their own there, read from them after, and the array released
    subst: dict = {}    # (local, attribute) -> the local holding it
    origin: dict = {}   # that local -> (local, attribute)
    read_attrs: dict = {}   # local -> [(statement, attribute read of it)]
    for j, ns in enumerate(nodes):
        for node in ns:
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                read_attrs.setdefault(node.value.id, []).append((j, node.attr))
    for n in sorted(live.metas, key=_natural):
        attrs = {a for j, a in read_attrs.get(n, ()) if j > live.data_last[n]}
        if "shape" in attrs:
            attrs.add("size")
        for a in sorted(attrs):
            subst[(n, a)] = f"{prefix}_{n}_{a}"
            origin[subst[(n, a)]] = (n, a)
    changed = set(renamed)
    since = {n: live.data_last[n] for n in live.metas}
    for j in sorted({j for n in live.metas for j, a in read_attrs.get(n, ())
                     if j > since[n] and (n, a) in subst}):   # (the statements reading them)
        sub = _Substitute(subst, since, j)
        sub.visit(stmts[j])
        if sub.changed:
            changed.add(j)

    # after each statement: shapes kept, then deletes
    after: dict = {}
    for n in sorted(live.metas, key=_natural):
        keep, gone = after.setdefault(live.data_last[n], ([], []))
        keep += [(v, f"{n}.{a}") for (m, a), v in subst.items() if m == n]
        gone.append(n)
    for n in sorted(live.releasable - live.metas, key=_natural):
        after.setdefault(live.last[n], ([], []))[1].append(n)
    for k, (_, ts) in enumerate(plan.slots):
        after.setdefault(ts[-1].end, ([], []))[1].append(slot_var[k])
    for i, (_, del_ns) in sorted(after.items()):
        shown = [f"{labels[n]} (shape kept)" if n in live.metas else labels[n]
                 for n in del_ns if n in labels and not aliases.bufs.get(n, set()) & slot_bufs]
        shown += [f"slot {slot_var.index(n)}" for n in del_ns if n in slot_var]
        if shown:
            plan.released[i] = shown

    # the new source: tenants rewritten, shapes kept and deletes after the statements
    by_stmt = {t.stmt: t for _, ts in plan.slots for t in ts}
    first = {ts[0].stmt for _, ts in plan.slots}
    counter = [0]

    def tmp():
        counter[0] += 1
        return f"{prefix}{counter[0]}"

    def text(i, st):
        if i in rewritten:
            return [rewritten[i]]
        if i in changed:
            return ast.unparse(st).splitlines()
        return [line[st.col_offset:] for line in lines[st.lineno - 1:st.end_lineno]]

    def copy(a: int, b: int) -> None:
        """``lines[a:b]`` as they are (comments between statements: where groups begin)."""
        for j in range(a, b):
            if j + 1 in starts:
                plan.group_lines[starts[j + 1]] = len(out) + j - a + 1
        out.extend(lines[a:b])

    plan.group_lines = [0] * len(groups)
    out = []
    copy(0, stmts[0].lineno - 1)
    prev_end = stmts[0].lineno - 1
    for i, st in enumerate(stmts):
        copy(prev_end, st.lineno - 1)               # comments between statements
        ind = " " * st.col_offset
        t = by_stmt.get(i)
        if t is None:
            out += [ind + line for line in text(i, st)]
        else:
            body = text(i, st) if i in first else None
            out += [ind + line for line in _tenant_lines(t, st.value.args[0], origin, subst,
                                                          slot_var[t.slot], body, tmp)]
        prev_end = st.end_lineno
        keep, gone = after.get(i, ((), ()))
        out += [f"{ind}{v} = {src}" for v, src in keep]
        if gone:
            out.append(ind + "del " + ", ".join(gone))
    copy(prev_end, len(lines))
    return "\n".join(out), plan


class _Rename(ast.NodeTransformer):
    """Rename the globals ``renames`` names (old -> new)."""

    def __init__(self, renames: dict):
        self.renames = renames

    def visit_Name(self, node):
        if node.id in self.renames:
            node.id = self.renames[node.id]
        return node


class _Substitute(ast.NodeTransformer):
    """In statement ``j``: ``X.attr`` -> the local holding it, for the arrays ``X`` released
    before ``j`` (``since``: X -> the statement after which it is released)."""

    def __init__(self, subst: dict, since: dict, j: int):
        self.subst, self.since, self.j, self.changed = subst, since, j, False

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in self.subst and \
                self.j > self.since[node.value.id]:
            self.changed = True
            return ast.copy_location(ast.Name(self.subst[(node.value.id, node.attr)],
                                              ast.Load()), node)
        return self.generic_visit(node)


def _fits(capacity: int, dynamic: bool, estimate: int, tenant_dynamic: bool) -> bool:
    """Whether a slot of ``capacity`` (elements per sample when ``dynamic``) suits a tenant."""
    if not capacity or not estimate:
        return True   # unknown: let the run-time check decide
    return dynamic == tenant_dynamic and 4 * capacity <= 5 * estimate <= 25 * capacity // 4


def _natural(name: str):
    m = re.match(r"(\D*)(\d*)$", name)
    return (m.group(1), int(m.group(2) or 0)) if m else (name, 0)


def _tenant_lines(t: Tenant, shape, origin: dict, subst: dict, slot: str, first, tmp) -> list:
    """The lines binding tenant ``t`` (its allocation's ``shape`` expression) to its share of
    the slot buffer ``slot``; ``first``: the allocation's own lines (the slot's first tenant
    allocates as before and becomes the slot's buffer, flat)."""
    x, dt = t.local, t.dtype
    kind, n, dims = None, None, None   # Y.size / Y.shape: sizes that cannot be negative
    if isinstance(shape, ast.Attribute) and shape.attr in ("size", "shape") and \
            isinstance(shape.value, ast.Name):
        kind, n, dims = shape.attr, f"{shape.value.id}.size", f"{shape.value.id}.shape"
    elif isinstance(shape, ast.Name) and origin.get(shape.id, (None, None))[1] in ("size",
                                                                                  "shape"):
        y, kind = origin[shape.id]
        n, dims = subst[(y, "size")], shape.id
    if first is not None:
        return first + [f"{slot} = {x}" if kind == "size" else f"{slot} = {x}.reshape({x}.size)"]
    if kind is not None:
        lines = [f"if not {n} <= {slot}.size <= 2 * {n}:", f"    {slot} = None",
                 f"    {slot} = np.empty({n}, {dt})",
                 f"{x} = {slot}[:{n}]" if kind == "size" else
                 f"{x} = {slot}[:{n}].reshape({dims})"]
    else:
        s, n = tmp(), tmp()
        # a tuple: its product (a negative one makes np.empty raise as it would have, other
        # negative dims make reshape raise); anything else through numel, which checks
        count = f"math.prod({s})" if isinstance(shape, ast.Tuple) else f"_mp.numel({s})"
        lines = [f"{s} = {ast.unparse(shape)}", f"{n} = {count}",
                 f"if not 0 <= {n} <= {slot}.size <= 2 * {n}:", f"    {slot} = None",
                 f"    {slot} = np.empty({n}, {dt})", f"{x} = {slot}[:{n}].reshape({s})"]
    if t.zero:
        lines.append(f"{x}.fill(0)")
    return lines
