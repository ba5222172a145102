"""A host driver's kernel calls recorded once and replayed: the Python between a served
model's kernels taken out of its steady runs.

A host driver (``target.HostDriver``: plain Python calling the step's kernels) decides, at each
run, what it asked for: the shapes of its intermediates and their buffers, which kernel and
which split over the threads serve each op (``lib.conv.split_work``), the weights packed for
them. At batch 1 those decisions take a large share of a small model's run (by turns in one
process, ms, by the driver / replayed: MobileNetV2 on two threads 3.15 / 2.67, on one 4.04 /
3.58; ResNet-50 on two threads 22.8 / 21.9; the BERT-like encoder 4.28 / 3.97). For
arguments of the same shapes and parameters, on as many loop threads, every decision comes out
the same; so :class:`HostReplay` runs the driver once more with a recorder (every call its
lines make, and below the library's entry points that only pick and split, each kernel call
they end in), then serves later runs by calling those kernels again: its inputs passed in (or
copied into its own buffers), its outputs copied out, its intermediates in one arena planned
by their lives (:func:`_planned`), each run of calls with the same arguments at every run made
by one native call (:mod:`.callchain`: MobileNetV2 at batch 1 on two threads 2.8 % faster, the
BERT-like encoder 1.7 %). A key is the inputs' shapes, the loop threads and the
thread: slices of a batch (``tiers.HostSlices``) replay each on its own thread.

What a recording holds is checked, never assumed:
- a driver is recorded only if its source is made of the statements drivers are made of
  (assignments to names, ``v[i] = x`` (made again at each replay), ``t += n`` on numbers,
  calls, ``del``, ``if``, ``raise``, ``return``), and a recording is kept only if every call
  its run made is one the recorder knows: a kernel (a Numba dispatcher, a parallel variant), an
  entry point of the library declared (:func:`declare`) ``"leaves"`` (its effect is the kernel
  calls below it, each made through a hook: ``lib.team.run``, :func:`kernel_call`),
  ``"derived"`` (a value derived from parameters: kept; any value ``params.derived`` gives
  during the run must come from a parameter's memory) or ``"pure"`` (a value of shapes and
  thread counts), another entry point of the library, a NumPy function returning arrays (a concat's
  ``np.concatenate``) or an array's ``copy`` (called again at each replay, what it returns
  copied into what it returned then; a concat and a ``copy`` write there directly),
  ``np.empty``, views, the shape arithmetic, ``np.array`` of constants and
  shapes (made once, kept); anything else
  (a kernel returning a scalar, a value read from an array, a ``reshape`` that copies, a split
  on ``run_parts``' helpers, a parallel variant not compiled yet, an argument of an unknown
  kind) leaves the driver's run as it was and keeps nothing, and the key is recorded again
  after :data:`RETRY_RUNS` runs;
- a recording is replayed once on the run's inputs, its arena and the arrays it copies
  results into filled with NaN first, and kept only if it gives the driver's outputs bit for
  bit (a kernel call it missed leaves NaN); once it has served :data:`NATIVE_AFTER` runs
  (:data:`HOT_NATIVE_AFTER` where one of the step's recordings went native before), its
  runs of kernel calls are compiled native on a thread of their own (the runs meanwhile
  replayed from Python) and taken at the first run after, kept only if a run so, poisoned the
  same way, gives the bits of a replay from Python; after :data:`MAX_FAILURES` recordings of
  a step fail their first check (or go stale), its driver serves for good;
- then its runs are timed against the driver's, by turns (:data:`TRIAL_RUNS` each), and the
  faster serves its key (a step of a few small kernels gains nothing: its inputs and outputs
  are copied);
- it serves while every parameter is the array it was made with, no value derived from a
  parameter was dropped (``params.generation``: a run that writes it) and no library kernel
  became ready (:data:`VERSION`: it may name the slower path that served until then); a
  recording is made only after :data:`AFTER_RUNS` runs of its key with none becoming ready,
  the driver rewritten for the recorder at the last of them (a run's cost each, where both
  in one run took a cold MobileNetV3-large's ~130 ms against its 7 ms runs).

``PDJIT_REPLAY=0`` turns it off; ``PDJIT_REPLAY_NATIVE=0`` makes its calls from Python.
"""
from __future__ import annotations

import ast
import bisect
import gc
import hashlib
import math
import operator
import os
import threading
import time
import types as pytypes
import weakref

import numpy as np
from numba.core.dispatcher import Dispatcher

from pdjit.codegen import memplan, params, pysource
from pdjit.codegen.cpu import callchain, threads
from pdjit.codegen.driver import bdim, check

#: replay host drivers (``PDJIT_REPLAY=0``: never)
ENABLED = os.environ.get("PDJIT_REPLAY", "1") != "0"
#: host-driver runs of one key (shapes and threads), with no library kernel becoming ready
#: meanwhile (a process loads its parallel loops one a run), before its recording is made
AFTER_RUNS = 3
#: runs of a key before it is recorded again, where its recording was not kept (a parallel
#: variant not compiled yet, a split on run_parts' helpers, ...)
RETRY_RUNS = 50
_NEVER = -(1 << 62)  # (a key's count of host runs that never reaches its recording)
#: make a kept recording's runs of kernel calls one native call each (``callchain``;
#: ``PDJIT_REPLAY_NATIVE=0``: never) ...
NATIVE = os.environ.get("PDJIT_REPLAY_NATIVE", "1") != "0"
#: ... once it has served this many runs: compiling them takes 10-100 ms (MobileNetV2's 55
#: calls ~0.1 s) for a few microseconds saved a call, so not for a program run a few times (a
#: script, a test), and on a thread beside the runs (:data:`NATIVE_THREAD`)
NATIVE_AFTER = 32
#: ... or this many, where a recording of the same step went native before (the step is
#: served, and its new key is the same program at other threads, another slice of the batch,
#: or made again after a kernel became ready): a run choice's one-thread trial of ResNet-18 at
#: batch 1 waited 38 runs of 25 ms for its new key's calls to go native (its runs from Python
#: are no samples), a benchmark's whole window
HOT_NATIVE_AFTER = 2
#: whether those native calls compile on a thread of their own (off: in the run; tests)
NATIVE_THREAD = True
#: timed runs each of a new recording and of the driver before the faster serves its key
TRIAL_RUNS = 3
#: recordings of a step that may fail their check or go stale (its parameters new arrays at
#: each run) before its driver serves for good
MAX_FAILURES = 3
#: the recordings a step keeps (one per key: its inputs' shapes, the loop threads, the
#: thread), the oldest dropped
MAX_KEYS = 8
#: the most bytes a recording's own buffers may hold (they stay allocated between runs; a
#: batch large enough to need more spends little of its run between kernels)
MAX_BYTES = 64 << 20
#: bumped when a library kernel becomes ready (``lib.team.ready``): a recording made before
#: may name the slower path that served until then
VERSION = [0]

_KINDS: dict = {}   # id(function) -> (kind, a weak reference to the function)
_local = threading.local()


def declare(kind: str, *fns) -> None:
    """Declare how the recorder treats calls of the library entry points ``fns``:
    ``"leaves"`` (their effect is the kernel calls below them: recorded, not the call),
    ``"derived"`` (a value derived from parameters: its result kept) or ``"pure"`` (a value of
    the arguments' shapes and the thread counts: computed, nothing recorded). A declaration
    holds its function weakly: it lasts as long as the function (a module's, or a generated
    one's program), so a function made for the call (a bound method, a lambda) is not one to
    declare."""
    if kind not in ("leaves", "derived", "pure"):
        raise ValueError(f"pdjit: replay: no kind {kind!r}")
    for f in fns:  # (a generated host function goes with its program)
        _KINDS[id(f)] = (kind, weakref.ref(f, _forget(_KINDS, id(f))))


def _forget(table, key):
    """The callback that drops ``table[key]`` once its function is gone."""
    return lambda _: table.pop(key, None)


def _kind_of(f):
    """What ``f`` is declared (:func:`declare`), or None."""
    kind = _KINDS.get(id(f))
    return kind[0] if kind is not None and kind[1]() is f else None


def recording():
    """The recorder of the driver running on this thread when it records kernel calls below
    an entry point declared ``"leaves"`` (None otherwise)."""
    rec = getattr(_local, "rec", None)
    return rec if rec is not None and rec.below == "leaves" else None


def refuse(why: str) -> None:
    """What a driver being recorded on this thread just did cannot be replayed (``why``)."""
    rec = getattr(_local, "rec", None)
    if rec is not None and rec.why is None:
        rec.why = why


# ---- which drivers: their source ------------------------------------------------------------
_STATEMENTS = (ast.Assign, ast.AugAssign, ast.Expr, ast.Delete, ast.If, ast.Raise, ast.Return,
               ast.Pass)


def _source_why(tree) -> str | None:
    """Why a driver's statements are not what the recorder knows (None: they are; its
    expressions are :class:`_Calls`' to check as it rewrites them)."""
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if len(fns) != 1 or len(tree.body) != 1:
        return "not one function"
    todo = list(fns[0].body)  # (statements lie in the body and its ifs' branches alone)
    while todo:
        node = todo.pop()
        if not isinstance(node, _STATEMENTS):
            return f"a {type(node).__name__} statement"
        if isinstance(node, ast.If):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Assign) and not all(
                isinstance(t, ast.Name) or isinstance(t, ast.Tuple) and
                all(isinstance(e, ast.Name) for e in t.elts) for t in node.targets) and not (
                len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript)):
            return "an assignment into a value"
        elif isinstance(node, ast.AugAssign) and not isinstance(node.target, ast.Name) or \
                isinstance(node, ast.Delete) and not all(
                    isinstance(t, ast.Name) for t in node.targets):
            return "an assignment into a value"
    return None


def _at(node) -> dict:
    """``node``'s position, as the keywords of a node :class:`_Calls` makes in its place (each
    made with one, where ``ast.fix_missing_locations`` walked the whole tree for them after:
    ~27 ms of the ~104 that MobileNetV3-large's driver of 1,000 lines took to rewrite)."""
    return {"lineno": node.lineno, "col_offset": node.col_offset,
            "end_lineno": node.end_lineno, "end_col_offset": node.end_col_offset}


def _rp(name: str, args: list, at: dict):
    """``name(*args)`` at the position ``at`` (:func:`_at`): a call of the recorder's."""
    return ast.Call(func=ast.Name(name, ast.Load(), **at), args=args, keywords=[], **at)


class _Calls(ast.NodeTransformer):
    """Every call ``f(args)`` of the driver as ``_rp_call(f, args)``, every subscript ``v[i]``
    as ``_rp_item(v, i)``, every operand of arithmetic and comparisons through
    ``_rp_number``, ``v[i] = x`` as ``_rp_setitem(x, v, i)``, ``t += n`` as
    ``t = _rp_aug("Add", t, n)``; ``why``: the first expression met that the recorder does
    not know (a lambda, a comprehension, ...), else None."""

    def __init__(self):
        self.why = None
        self._methods = {}  # node type -> its visit_ method, or None

    def _unknown(self, node):
        self.why = self.why or f"a {type(node).__name__}"
        return node

    visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = \
        visit_NamedExpr = visit_Await = visit_Yield = _unknown

    # (``ast.NodeTransformer``'s walk, faster: a node type's method looked up once, names,
    # constants and contexts not walked into, each method returning one node; with ``_at``
    # MobileNetV3-large's driver rewritten in 56 ms, not 104, DenseNet-121's in 91, not 150)
    def visit(self, node):
        t = type(node)
        if t in _LEAVES:
            return node
        try:
            method = self._methods[t]
        except KeyError:
            method = self._methods[t] = getattr(self, "visit_" + t.__name__, None)
        return self.generic_visit(node) if method is None else method(node)

    def generic_visit(self, node):
        for field in node._fields:
            old = getattr(node, field, None)
            if type(old) is list:
                old[:] = [self.visit(v) if isinstance(v, ast.AST) else v for v in old]
            elif isinstance(old, ast.AST):
                setattr(node, field, self.visit(old))
        return node

    def visit_Call(self, node):  # noqa: N802 - ast's name
        self.generic_visit(node)
        at = _at(node)
        return ast.Call(func=ast.Name("_rp_call", ast.Load(), **at),
                        args=[node.func, *node.args], keywords=node.keywords, **at)

    def visit_Subscript(self, node):  # noqa: N802 - ast's name
        self.generic_visit(node)
        at = _at(node)
        return _rp("_rp_item", [node.value, _index(node.slice, at)], at)

    def _operands(self, node):
        """Arithmetic, comparisons and truth tests: their operands through ``_rp_number``
        (an identity test reads no value)."""
        self.generic_visit(node)
        if isinstance(node, ast.Compare) and \
                any(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops):
            return node
        for field in _OPERANDS[type(node)]:
            v = getattr(node, field)
            setattr(node, field, [_number(e) for e in v] if isinstance(v, list) else _number(v))
        return node

    visit_BinOp = visit_UnaryOp = visit_Compare = visit_BoolOp = visit_IfExp = visit_If = \
        _operands

    def visit_Assign(self, node):  # noqa: N802 - ast's name
        t = node.targets[0]
        if not isinstance(t, ast.Subscript):
            self.generic_visit(node)
            return node
        # ``v[i] = x``: ``_rp_setitem(x, v, i)``, a call made again at each replay
        at = _at(node)
        args = [self.visit(node.value), self.visit(t.value), _index(self.visit(t.slice), at)]
        return ast.Expr(_rp("_rp_setitem", args, at), **at)

    def visit_AugAssign(self, node):  # noqa: N802 - ast's name
        # ``t += x``: ``t = _rp_aug("Add", t, x)`` (``operator.iadd``: in place where ``t``
        # is an array, which is refused)
        self.generic_visit(node)
        at = _at(node)
        value = _rp("_rp_aug", [ast.Constant(type(node.op).__name__, **at),
                                  ast.Name(node.target.id, ast.Load(), **at), node.value], at)
        return ast.Assign(targets=[ast.Name(node.target.id, ast.Store(), **at)], value=value,
                          **at)


#: the nodes :class:`_Calls` leaves as they are, without looking into them
_LEAVES = frozenset((ast.Name, ast.Constant, ast.Load, ast.Store, ast.Del))
#: the fields of the nodes :meth:`_Calls._operands` checks
_OPERANDS = {ast.BinOp: ("left", "right"), ast.UnaryOp: ("operand",),
             ast.Compare: ("left", "comparators"), ast.BoolOp: ("values",),
             ast.IfExp: ("test",), ast.If: ("test",)}


def _number(e):
    """``e`` as ``_rp_number(e)``: arithmetic and comparisons of the driver's lines are on
    numbers (shapes), an array there (a value computed once) is refused."""
    return _rp("_rp_number", [e], _at(e))


def _index(s, at: dict):
    """A subscript's index as an expression (a slice as ``slice(...)``), what it makes at the
    position ``at``."""
    if isinstance(s, ast.Slice):
        none = ast.Constant(None, **at)
        return _rp("_rp_slice", [s.lower or none, s.upper or none, s.step or none], at)
    if isinstance(s, ast.Tuple):
        return ast.Tuple([_index(e, at) for e in s.elts], ast.Load(), **at)
    return s


_IN_PLACE = {"Add": operator.iadd, "Sub": operator.isub, "Mult": operator.imul,
             "FloorDiv": operator.ifloordiv, "Mod": operator.imod, "Div": operator.itruediv,
             "BitOr": operator.ior, "BitAnd": operator.iand, "LShift": operator.ilshift,
             "RShift": operator.irshift, "Pow": operator.ipow, "BitXor": operator.ixor,
             "MatMult": operator.imatmul}


def _aug(op, t, x):
    """``t op= x`` as the driver computes it; on anything but numbers and tuples (an array, a
    list changed in place, which recorded calls may hold) refused."""
    if not all(isinstance(v, (int, float, np.generic, tuple)) for v in (t, x)):
        refuse("a value changed in place")
    return _IN_PLACE[op](t, x)


def _setitem(x, v, i) -> None:
    """``v[i] = x`` (a value written into an array: a shape's dims, a constant; ``x``
    evaluated first, as Python does), recorded as a call made again at each replay; into
    another object, an input or a parameter refused (the recording runs on copies of its
    inputs)."""
    v[i] = x
    rec = _local.rec
    if not isinstance(v, np.ndarray):
        refuse(f"an assignment into a {type(v).__name__}")
    elif any(np.may_share_memory(v, a) for a in rec.params + rec.inputs):
        refuse("a value written into an input or a parameter")
    elif rec.why is None:
        rec.ops.append((operator.setitem, (v, i, x), None, None))


def _num(x):
    if isinstance(x, np.ndarray):
        refuse("arithmetic on an array, or its truth")
    return x


def _item(v, i):
    out = v[i]
    if isinstance(v, np.ndarray) and not (isinstance(out, np.ndarray) and (
            out.size == 0 or np.may_share_memory(out, v))):
        refuse("a value read from an array")
    return out


# ---- recording ------------------------------------------------------------------------------
_VIEWS = frozenset(("reshape", "transpose", "view", "ravel"))
_COPIES = frozenset(("copy", "astype"))  # (array methods that return a new array)
_PURE_CALLS = (math.prod, min, max, int, len, abs, ValueError)


class _Recorder:
    """What a driver's run being recorded did: :meth:`call` makes each call of its lines
    (through ``_rp_call``), the hooks below the entry points declared ``"leaves"`` add the
    kernel calls they make (:meth:`leaf`, :meth:`below_leaves`), and :func:`refuse` says why
    the run cannot be replayed."""

    def __init__(self, params, inputs):
        self.ops = []       # (fn, args, kwargs, recorded result or None)
        self.inputs = inputs  # the buffers the run's inputs were copied into
        self.teams = set()  # the ops that are parallel loops (their threads placed first)
        self.allocs = []    # the arrays np.empty gave the driver
        self.bytes = 0      # ... their bytes
        self.params = params  # the parameters (the arrays derived values may come from)
        self.why = None     # why nothing is kept
        self.below = None   # what the entry point being called is ("leaves", ...), if any

    def leaf(self, fn, args, team: bool = False) -> None:
        """A kernel call below an entry point declared ``"leaves"``, just made (``team``: a
        parallel loop's)."""
        if self.why is None:
            if team:
                self.teams.add(len(self.ops))
            self.ops.append((fn, args, None, None))

    def below_leaves(self, fn, args) -> None:
        """``fn(*args)`` below an entry point declared ``"leaves"``, recorded: a kernel as a
        leaf, another entry point declared ``"leaves"`` by the kernel calls below it, any
        other Python function as a call made again (not the kernel calls below it)."""
        if _is_kernel(fn):
            fn(*args)
        elif getattr(fn, "takes_serial", False):  # (a parallel variant, as :meth:`call`)
            fn(*args)
            if fn.fn is not None:
                self.leaf(fn.fn, args[1:], team=True)
            elif getattr(fn, "failed", None) is not None:  # (never compiled: the serial one)
                self.leaf(args[0], args[1:])
            else:
                refuse("a parallel variant not compiled yet")
            return
        else:
            if _kind_of(fn) == "leaves":
                self._entry("leaves", fn, args, {})
                return
            self._under("call", fn, args, {})
        self.leaf(fn, args)

    def _under(self, kind, f, args, kwargs):
        """``f(*args, **kwargs)`` called as an entry point of ``kind`` (what the hooks below
        it see), then back to what was being called."""
        before, self.below = self.below, kind
        try:
            return f(*args, **kwargs)
        finally:
            self.below = before

    def derived_from(self, array) -> None:
        """A value derived from ``array`` is taken (``params.derived``): kept by the
        recording, so ``array`` must be a parameter's memory, never the driver's."""
        if not any(a is array or np.may_share_memory(a, array) for a in self.params) or \
                any(np.may_share_memory(a, array) for a in self.allocs):
            refuse("a value derived from an array that is no parameter")

    def call(self, f, args, kwargs):
        """``f(*args, **kwargs)``, a call of the driver's lines, recorded by what ``f`` is."""
        if self.why is not None:  # (nothing kept: the run goes on as the driver's)
            return f(*args, **kwargs)
        kind = _kind_of(f)
        if kind is not None:
            return self._entry(kind, f, args, kwargs)
        if f is np.empty:
            out = f(*args, **kwargs)
            self.allocs.append(out)
            self.bytes += out.nbytes
            if self.bytes > 4 * MAX_BYTES:  # (what it keeps until the run ends)
                refuse(f"its buffers hold more than {4 * MAX_BYTES} bytes")
            return out
        if f in _PURE_CALLS or isinstance(f, type) and issubclass(f, np.generic):
            # (shape arithmetic, a constant of a NumPy type)
            if any(isinstance(a, np.ndarray) for a in args):
                refuse("a value read from an array")
            return f(*args, **kwargs)
        if f is np.array and _constant((args, kwargs)):
            # (an array of constants and shapes: the same at every run of the key, made once
            # and kept by the calls that read it, not made again from Python at each replay:
            # MobileNetV3-small's 23 hard_swish gates)
            return f(*args, **kwargs)
        owner = getattr(f, "__self__", None)
        if isinstance(owner, np.ndarray) and getattr(f, "__name__", "") in _VIEWS:
            out = f(*args, **kwargs)
            if not (isinstance(out, np.ndarray) and
                    (out.size == 0 or np.may_share_memory(out, owner))):
                refuse(f"{f.__name__} made a copy")
            return out
        if isinstance(owner, np.ndarray) and getattr(f, "__name__", "") in _COPIES:
            # (made again at each replay, on the array as the recording moves it)
            out = f(*args, **kwargs)
            self._result(getattr(np.ndarray, f.__name__), (owner, *args), kwargs, out)
            return out
        if _is_kernel(f):
            out = f(*args, **kwargs)
            self._result(f, args, kwargs, out)
            return out
        if getattr(f, "takes_serial", False):  # (a parallel variant: its kernel once ready)
            if f.fn is None:
                refuse("a parallel variant not compiled yet")
                return f(*args, **kwargs)
            out = f(*args, **kwargs)
            self.teams.add(len(self.ops))
            self._result(f.fn, args[1:], kwargs, out)
            return out
        module = getattr(f, "__module__", None) or ""
        if module.startswith("pdjit.codegen.") or module == "numpy":  # an entry point, or
            # a NumPy function (a concat's np.concatenate): made again at each replay
            out = self._under("call", f, args, kwargs)
            self._result(f, args, kwargs, out)
            return out
        refuse(f"a call of {getattr(f, '__qualname__', f)!r}")
        return f(*args, **kwargs)

    def _entry(self, kind, f, args, kwargs):
        out = self._under(kind, f, args, kwargs)
        if kind == "leaves" and out is not None:
            refuse(f"{f.__qualname__} returned a value")
        return out

    def _result(self, f, args, kwargs, out) -> None:
        """A call made again at each replay: what it returned (None, an array or a tuple of
        arrays) is what later calls read, the new results copied into it."""
        if out is not None and not isinstance(out, np.ndarray) and not (
                isinstance(out, tuple) and all(isinstance(o, np.ndarray) for o in out)):
            refuse(f"{getattr(f, '__qualname__', f)!r} returned a {type(out).__name__}")
        if self.why is None:
            self.ops.append(_writing_into(f, args, kwargs, out) or (f, args, kwargs, out))


def _writing_into(f, args, kwargs, out):
    """A call made again at each replay (:meth:`_Recorder._result`) as a call that writes its
    result into ``out`` (what it returned when recorded, kept by the recording) and returns
    it, so that each replay copies once, not twice (a new array, then copied over ``out``): a
    concat (``np.concatenate(..., out=out)``), an array's ``copy``; else None. ``out`` stays
    the op's result: the check of a new recording poisons it first, as any result a call is
    to write."""
    if not isinstance(out, np.ndarray) or not out.flags.c_contiguous:
        return None
    kwargs = kwargs or {}
    if f is np.concatenate and "out" not in kwargs and "dtype" not in kwargs:
        return (f, args, {**kwargs, "out": out}, out)
    if f is np.ndarray.copy and len(args) == 1 and not kwargs:  # (order C: out's layout)
        return (_copy_into, (out, args[0]), None, out)
    return None


def _copy_into(out, a):
    """``out[...] = a``; ``out``."""
    np.copyto(out, a)
    return out


def _is_kernel(f) -> bool:
    return isinstance(f, Dispatcher)


class Recording:
    """What one key's runs replay: ``ops`` (``(fn, args, kwargs, result)``) in order on the
    inputs at ``inputs`` (indices of the run's arguments) and the parameters ``fixed`` (the
    arrays at the indices ``at``, passed as they were); ``outputs`` copied out. An input that
    the ops read only as a whole argument is passed in its place (``uses``: ``(op, position,
    input)``); any other is copied into its buffer (``copies``: ``(input, buffer)``)."""

    def __init__(self, ops, teams, inputs, fixed, at, outputs, made):
        self.ops, self.fixed, self.outputs, self.made = ops, fixed, outputs, made
        self.teams = frozenset(teams)  # the ops that are parallel loops
        self.get = operator.itemgetter(*at) if len(at) > 1 else (
            (lambda v, i=at[0]: (v[i],)) if at else (lambda v: ()))
        self.thread = threading.get_ident()
        # (replayed, by the driver) times while it is tried
        self.trial = ([], []) if TRIAL_RUNS else None
        self.lost = False      # the driver was faster: it serves the key
        self.copies, self.uses = [], {}  # uses: op -> [(position, input)]
        for i, buf in inputs:
            uses = _uses(ops, outputs, buf)
            if uses is None:
                self.copies.append((i, buf))
            else:
                for k, pos in uses:
                    self.uses.setdefault(k, []).append((pos, i))
        # the ops in parts, each an op made from Python (its index) or a run of ops made by
        # one native call (callchain: (first op, end, the call)); None: all from Python
        self.parts = None
        self.runs = 0          # runs served (the native calls made at native_after)
        self.native_after = NATIVE_AFTER
        self.poison = None     # fills its buffers with NaN (the check of the native calls)
        self.building = None   # the native calls' compile: [thread, runs, chains] (native)

    def fits(self, values) -> bool:
        return self.made == _state() and self.thread == threading.get_ident() and \
            all(map(operator.is_, self.get(values), self.fixed))

    def run(self, values):
        for i, buf in self.copies:
            np.copyto(buf, values[i])
        self.runs += 1
        if self.parts is None and NATIVE and self.poison is not None:
            if self.runs == self.native_after:
                self.native()
            if self.built():
                self._go_native_checked(values)
            elif self.runs < self.native_after or self.building is not None:
                threads.PY_REPLAYS[0] += 1  # (from Python until then)
        return tuple([np.array(o) for o in self.replay(values)])

    def native(self) -> None:
        """Start compiling each run of two or more ops that are kernel calls with the same
        arguments at every run (no input passed in place, nothing returned to copy) into one
        native call (:mod:`.callchain`, all compiled at once): their module made here, LLVM's
        work on a thread of its own (``callchain.finish``, without the GIL), so that no run
        waits for it (MobileNetV3-large's 84 calls: ~90 ms of ~120); the run after it ends
        checks and takes them (:meth:`_go_native_checked`). With ``NATIVE_THREAD`` off (tests),
        compiled here."""
        runs, run = [], []  # (runs of (op, call)), the run so far
        for k, (fn, args, kwargs, out) in enumerate(self.ops):
            call = None
            if not kwargs and out is None and k not in self.uses:
                try:
                    call = callchain.native(fn, args)
                except callchain.Unsupported:
                    pass
            if call is not None:
                run.append((k, call))
                continue
            if len(run) > 1:
                runs.append(run)
            run = []
        if len(run) > 1:
            runs.append(run)
        if not runs:
            return
        try:
            prepared = callchain.prepare([[c for _, c in r] for r in runs])
        except Exception:  # noqa: BLE001 - the calls from Python serve
            return
        building = [None, runs, None]

        def work():
            try:
                with threads.background():
                    building[2] = callchain.finish(prepared)
            except Exception:  # noqa: BLE001 - the calls from Python serve
                pass

        if NATIVE_THREAD:
            # (not a daemon: the interpreter waits for it at exit rather than unloading LLVM
            # under a compile that runs without the GIL)
            building[0] = threading.Thread(target=work, name="pdjit-callchain", daemon=False)
            building[0].start()
        else:
            work()
        self.building = building

    def built(self) -> bool:
        """Whether :meth:`native`'s compile has ended (its native calls ready, or none)."""
        return self.building is not None and (
            self.building[0] is None or not self.building[0].is_alive())

    def go_native(self) -> bool:
        """The native calls :meth:`native` compiled (:meth:`built`) made the recording's
        parts: whether any were."""
        _, runs, chains = self.building
        self.building = None
        starts = {r[0][0]: (r[-1][0] + 1, chain) for r, chain in zip(runs, chains or ())
                  if chain is not None}
        if not starts:
            return False
        parts, k = [], 0
        while k < len(self.ops):
            if k in starts:
                end, chain = starts[k]
                parts.append((k, end, chain))
                k = end
            else:
                parts.append(k)
                k += 1
        self.parts = parts
        return True

    def _go_native_checked(self, values) -> None:
        """:meth:`go_native`, kept only where a replay by the native calls, its buffers filled
        with NaN first, gives the bits of one from Python on the same values (as the
        recording's own check: a call it missed would leave NaN)."""
        # (two more replays in this run: no sample of a trial, threads.LOADS)
        threads.LOADS[0] += 1
        want = [np.array(o) for o in self.replay(values)]
        try:
            if not self.go_native():
                return
            self.poison()
            got = self.replay(values)
            if all(g.tobytes() == w.tobytes() for g, w in zip(got, want)):
                return
        except Exception:  # noqa: BLE001 - the calls from Python serve
            pass
        self.parts = None

    def replay(self, values):
        if not self.teams:
            return self._replay(values)
        # its loops' threads kept off this thread's core, as team.run does, once a run (a look
        # at the core each loop cost MobileNetV2 ~50 us a run on two threads), and this thread
        # kept on its core for the run (threads.hold_caller)
        threads.place_team()
        held = threads.hold_caller()
        try:
            return self._replay(values)
        finally:
            threads.release_caller(held)

    def _replay(self, values):
        parts = self.parts
        if parts is None:
            self._ops(values, 0, len(self.ops))
            return self.outputs
        for part in parts:
            if type(part) is int:
                self._ops(values, part, part + 1)
                continue
            k0, k1, chain = part
            failed = chain()
            if failed:  # (that op again from Python: it raises its error, else the rest go on)
                self._ops(values, k0 + failed - 1, k1)
        return self.outputs

    def _ops(self, values, k0, k1) -> None:
        """The ops ``k0 .. k1`` made from Python."""
        uses = self.uses
        for k in range(k0, k1):
            fn, args, kwargs, out = self.ops[k]
            if k in uses:
                args = list(args)
                for pos, i in uses[k]:
                    args[pos] = values[i]
            got = fn(*args, **kwargs) if kwargs else fn(*args)
            if out is None or got is out:
                continue
            if type(out) is tuple:
                for o, g in zip(out, got):
                    if g is not o:
                        np.copyto(o, g)
            else:
                np.copyto(out, got)

def _poisoner(arena, ops, theirs):
    """What fills a recording's buffers with NaN before a check: its arena and what its calls
    returned (unless an input's memory, or a parameter's: ``theirs``)."""
    returned = [o for _, _, _, out in ops for o in _results(out)
                if o.flags.writeable and not any(np.may_share_memory(o, b) for b in theirs)]

    def poisoned() -> None:
        _poison(arena)  # (its bytes 0xFF: NaN in every float, -1 in every int)
        for o in returned:
            _poison(o)
    return poisoned


def _uses(ops, outputs, buf):
    """``(op, position)`` of each argument of ``ops`` that is ``buf`` (None where another
    argument, a result or an output shares its memory: then it is copied into ``buf``)."""
    found = []
    for k, (_, args, kwargs, out) in enumerate(ops):
        for pos, a in enumerate(args):
            if a is buf:
                found.append((k, pos))
            elif any(np.may_share_memory(x, buf) for x in _arrays(a)):
                return None
        if any(np.may_share_memory(x, buf) for x in _arrays((kwargs, out))):
            return None
    if any(np.may_share_memory(x, buf) for x in outputs):
        return None
    return found


_SCALARS = (bool, int, float, complex, str, bytes, np.generic, np.dtype, type, slice,
            type(Ellipsis), type(None))


def _arrays(x):
    """The arrays in a recorded argument or result (in tuples, lists, dicts); an argument of
    another kind than a scalar or a kernel raises ``TypeError`` (it may hold arrays the
    recording would not move)."""
    if isinstance(x, np.ndarray):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _arrays(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _arrays(v)
    elif not isinstance(x, _SCALARS) and not _is_kernel(x) and \
            not isinstance(x, pytypes.FunctionType) and not getattr(x, "takes_serial", False):
        raise TypeError(f"an argument of type {type(x).__name__}")


def _constant(x) -> bool:
    """Whether a recorded argument holds no array (and nothing of a kind :func:`_arrays` does
    not know): literals and shapes."""
    try:
        return not any(_arrays(x))
    except TypeError:
        return False


def _poison(a) -> None:
    """``a`` filled with what no kernel's result is likely to be (NaN, a dtype's largest)."""
    k = a.dtype.kind
    a.fill(np.nan if k in "fc" else True if k == "b" else np.iinfo(a.dtype).max if k in "iu"
           else 0)


def _results(out) -> tuple:
    """The arrays a recorded call returned."""
    return () if out is None else out if type(out) is tuple else (out,)


def _address(a) -> int:
    return a.__array_interface__["data"][0]


def _finder(starts, ends):
    """``find(x)``: the index of the span (``starts[i]`` .. ``ends[i]``, sorted, apart) that
    holds array ``x``'s first byte, or None (an empty array: None)."""
    def find(x):
        if not x.nbytes:
            return None
        at = _address(x)
        i = bisect.bisect_right(starts, at) - 1
        return i if i >= 0 and at < ends[i] else None
    return find


def _bounds(x) -> tuple:
    """The first byte of array ``x`` and the byte past its last."""
    lo = hi = _address(x)
    for n, st in zip(x.shape, x.strides):
        lo, hi = (lo + (n - 1) * st, hi) if st < 0 else (lo, hi + (n - 1) * st)
    return lo, hi + x.itemsize


def _joined(parts, axis, out):
    """What an elided concat leaves in a recording (:func:`_elided`): its parts already wrote
    ``out``; ``out``, the op's result (poisoned before a new recording's check like any)."""
    return out


def _elided(ops, outs, allocs, theirs):
    """``ops`` with the concats whose parts can be written in place elided: a concat along an
    axis after which its result is one run of each part in turn (the axes before it all of
    size 1: a batch of one along the channels) of parts that are each a whole buffer of the
    driver's (``allocs``) or the whole result of an earlier call, no output, none of the
    run's inputs or parameters (``theirs``), not read or written after the concat and not
    the same memory twice. Every earlier call's reference to a part becomes a view of that
    part's run of the result, so that the calls making a part write it where the concat
    would copy it; the concat becomes :func:`_joined`. A concat of a concat (a DenseNet block:
    each layer's output joined to all before it) then writes the first into the second's
    result, and so on: every layer's output is written once, into the last result, instead
    of copied again by every concat after it."""
    if not any(op[0] is np.concatenate for op in ops):
        return ops
    ops = list(ops)
    spans = {}  # start address -> (end, the buffer or result)
    for a in list(allocs) + [o for op in ops for o in _results(op[3])]:
        if a.nbytes:
            spans.setdefault(_address(a), (_address(a) + a.nbytes, a))
    starts = sorted(spans)
    find = _finder(starts, [spans[a][0] for a in starts])
    refs: dict = {}  # start of a span -> the ops that reference its memory, in order

    def span_of(x):
        i = find(x)
        return None if i is None else starts[i]

    for j, op in enumerate(ops):
        for x in _arrays(op[1:]):
            sp = span_of(x)
            if sp is not None and (not refs.get(sp) or refs[sp][-1] != j):
                refs.setdefault(sp, []).append(j)
    alien = [_bounds(x) for x in list(_arrays(outs)) + list(theirs) if x.nbytes]
    dest = {}  # start of a part's span -> (the result it is written into, at which byte)
    for k, (fn, args, kwargs, out) in enumerate(ops):
        if fn is not np.concatenate or not isinstance(out, np.ndarray) or \
                not isinstance(args[0], (tuple, list)) or len(args) > 2:
            continue
        axis = args[1] if len(args) > 1 else (kwargs or {}).get("axis", 0)
        if axis is None or set(kwargs or {}) - {"axis", "out"} or not out.flags.c_contiguous:
            continue
        parts = list(args[0])
        axis %= out.ndim
        if math.prod(out.shape[:axis]) != 1 or not all(
                isinstance(p, np.ndarray) and p.nbytes and p.dtype == out.dtype and
                p.flags.c_contiguous for p in parts):
            continue
        at = [_address(p) for p in parts]
        if len(set(at)) < len(at) or any(  # (each a whole span, read by no call after)
                span_of(p) != a or spans[a][0] != a + p.nbytes or refs[a][-1] > k
                for p, a in zip(parts, at)) or any(
                lo < a + p.nbytes and a < hi for p, a in zip(parts, at) for lo, hi in alien):
            continue
        off = 0
        for p, a in zip(parts, at):
            dest[a] = (out, off)
            off += p.nbytes
        ops[k] = (_joined, (tuple(parts), axis, out), None, out)
    return _relocated(ops, span_of, dest) if dest else ops


def _relocated(ops, span_of, dest):
    """``ops`` with every array in a span moved by :func:`_elided` (``dest``: its start ->
    ``(result, byte)``, a result that may itself be moved) a view of the last result it goes
    into, the same view for the same array."""
    views: dict = {}

    def relocated(x):
        if id(x) not in views:
            start = span_of(x)
            if start not in dest:
                return x
            at, off = start, 0
            while at in dest:  # (a part of a result that is itself a part)
                base, byte = dest[at]
                off += byte
                at = _address(base)
            views[id(x)] = np.ndarray(x.shape, x.dtype, base, off + _address(x) - start,
                                      x.strides)
        return views[id(x)]

    return [_mapped(op, relocated) for op in ops]


def _views(ops, outs, theirs):
    """``ops`` with the copies elided whose source can stand for their result: a copy
    (:func:`_copy_into`) of a C-contiguous array into a result of the same shape and type
    that no call before it references and no larger array holds (a part of an elided
    concat), from memory that is none of the outputs, the run's inputs or the parameters
    (``theirs``) and that no call references from the copy to the last call that reads the
    result (the driver may reuse the source's memory after that). Those calls read a view of
    the source where they read the copy (a ``split`` of a batch of one along the channels:
    ShuffleNet's halves after each channel shuffle); the source's buffer then lives as long
    as the copy was read (:func:`_planned`)."""
    if not any(op[0] is _copy_into for op in ops):
        return ops
    ops = list(ops)
    alien = [_bounds(x) for x in list(_arrays(outs)) + list(theirs) if x.nbytes]

    def spans_of(op) -> list:
        return [b for b in map(_bounds, _arrays(op[1:])) if b[0] < b[1]]

    spans = [spans_of(op) for op in ops]  # each call's arrays' bytes

    def touching(j0, j1, lo, hi) -> list:
        return [j for j in range(j0, j1) if any(a < hi and lo < b for a, b in spans[j])]

    k = 0
    while k < len(ops):
        fn, args, _, out = ops[k]
        if fn is not _copy_into or not isinstance(out, np.ndarray) or out is not args[0]:
            k += 1
            continue
        src = args[1]
        lo, hi = _bounds(src)
        olo, ohi = _bounds(out)
        if not src.nbytes or src.shape != out.shape or src.dtype != out.dtype or \
                not src.flags.c_contiguous or not out.flags.c_contiguous or any(
                a < h and l < b for a, b in alien for l, h in ((lo, hi), (olo, ohi))) or \
                touching(0, k, olo, ohi):
            k += 1
            continue
        reads = touching(k + 1, len(ops), olo, ohi)  # (the calls after it, only then)
        if touching(k + 1, max(reads, default=k) + 1, lo, hi) or any(
                not olo <= a < b <= ohi for j in reads for a, b in spans[j]
                if a < ohi and olo < b):
            k += 1
            continue
        moved = _in_source(src, olo, ohi)
        del ops[k], spans[k]
        ops[k:] = [_mapped(op, moved) for op in ops[k:]]
        for j in reads:  # (the only calls whose bytes moved: one earlier now)
            spans[j - 1] = spans_of(ops[j - 1])
    return ops


def _in_source(src, lo, hi):
    """``moved(x)``: an array whose first byte is in ``lo .. hi`` (an elided copy's result) as
    the same view of ``src`` (what it copied), the same view for the same array; any other
    as it is."""
    views: dict = {}

    def moved(x):
        at = _address(x)
        if not lo <= at < hi:
            return x
        if id(x) not in views:
            views[id(x)] = np.ndarray(x.shape, x.dtype, src, at - lo, x.strides)
        return views[id(x)]
    return moved


def _planned(ops, outs, allocs):
    """``ops`` and ``outs`` with the buffers the driver allocated (``allocs``) moved into one
    arena, each at an offset no buffer alive at the same time takes (alive from the first op
    that reads or writes it to the last; the outputs' to the end): ``(ops, outs, arena)``.
    Recorded as they were allocated, every buffer would stay apart from the others, where the
    driver's runs reuse the memory of those it dropped, still in the caches (MobileNetV2 at
    batch 1 on one thread took 6 % longer replayed on its recorded buffers than by its
    driver). An argument of a kind it does not know raises ``TypeError``."""
    bufs = sorted((_address(a), _address(a) + a.nbytes) for a in allocs if a.nbytes)
    root = _finder([b[0] for b in bufs], [b[1] for b in bufs])
    life = {}  # buffer -> [first op, last op]

    for k, (_, args, kwargs, out) in enumerate(ops):
        for a in _arrays((args, kwargs, out)):
            j = root(a)
            if j is not None:
                life.setdefault(j, [k, k])[1] = k
    for a in _arrays(outs):
        j = root(a)
        if j is not None:
            life.setdefault(j, [len(ops), len(ops)])[1] = len(ops)
    placed, offset = [], {}  # (start, end, first op, last op); buffer -> its offset
    for j in sorted(life, key=lambda j: (life[j][0], -(bufs[j][1] - bufs[j][0]))):
        size = -(-(bufs[j][1] - bufs[j][0]) // 64) * 64
        first, last = life[j]
        at = 0
        for s0, s1, _, _ in sorted(p for p in placed if p[2] <= last and first <= p[3]):
            if at + size <= s0:
                break
            at = max(at, s1)
        placed.append((at, at + size, first, last))
        offset[j] = at
    total = max((p[1] for p in placed), default=0)
    raw = np.empty(total + 64, np.uint8)
    base = -_address(raw) % 64
    arena = raw[base:base + total]

    def moved(x):
        j = root(x)
        return x if j is None else np.ndarray(
            x.shape, x.dtype, arena, offset[j] + _address(x) - bufs[j][0], x.strides)

    return [_mapped(op, moved) for op in ops], _mapped(outs, moved), arena


def _mapped(x, fn):
    """``x`` (a recorded call, an argument) with each array in it (in tuples, lists, dicts)
    as ``fn`` gives it."""
    if isinstance(x, np.ndarray):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_mapped(v, fn) for v in x)
    if isinstance(x, dict):
        return {n: _mapped(v, fn) for n, v in x.items()}
    return x


def _state() -> tuple:
    return VERSION[0], params.generation()


class HostReplay:
    """Recordings of one step's host driver (``compiled``: its ``fn`` and ``source``), by key;
    ``params``: the indices of its arguments that are parameters (the others, the inputs, are
    passed or copied into each recording's buffers). :meth:`call` serves a run."""

    def __init__(self, compiled, params):
        self.compiled, self.params = compiled, frozenset(params)
        self.off = None if ENABLED else "PDJIT_REPLAY=0"
        self.why = None  # why the last recording was not kept
        self._capture = self._capture_of = None  # (the rewritten driver, of which function)
        self._inputs = None          # the indices of the arguments that are not parameters
        self._runs: dict = {}        # key -> host runs since the library's state changed
        self._state = None           # the library's state (_state) at the last run
        self._lock = threading.Lock()  # (recordings and counts changed by one thread at once)
        self._failures = 0           # recordings that failed their check, or went stale
        self.recordings: dict = {}   # key -> Recording
        self.replays = 0             # runs served by a recording
        self.hot = False             # whether a recording of it went native

    def call(self, values):
        """The step's results for ``values``: a recording's, else the host driver's."""
        if self.off is not None:
            return self.compiled.fn(*values)
        key = self._key(values)
        if key is None:
            return self.compiled.fn(*values)
        rec = self.recordings.get(key)
        if rec is not None:
            if rec.fits(values):
                if rec.trial is None:
                    return self.compiled.fn(*values) if rec.lost else self._replay(rec, values)
                return self._trial(rec, values)
            # a parameter given a new array, a value derived from one made again, a kernel
            # ready: every recording is as stale (and holds what it named)
            with self._lock:
                self.recordings.clear()
            self._failed("its parameters are new arrays at most runs")
        state = _state()
        if state != self._state:  # (kernels still becoming ready: a recording would not last)
            with self._lock:
                self._state = state
                self._runs = {k: min(n, 0) for k, n in list(self._runs.items())[-64:]}
        runs = self._runs.get(key, 0) + 1
        if runs <= AFTER_RUNS:
            if runs > 0:  # (the driver until the key is recorded: threads.WARMING)
                threads.WARMING[0] += 1
            if len(self._runs) > 256:  # (keys of shapes seen once, of threads long gone)
                with self._lock:
                    self._runs = {}
            self._runs[key] = runs
            out = self.compiled.fn(*values)
            if runs == AFTER_RUNS:  # (the driver rewritten a run ahead of its recording: a
                self._capture_fn()  # cold run of each no more than twice a warm one's + 0.1 s)
            return out
        self._runs[key] = 0
        return self._record(key, values)

    def hurry(self) -> None:
        """The step is served run after run (a trial of its plan's threads is due): its
        recordings make their calls native at their next run, its new ones at their
        :data:`HOT_NATIVE_AFTER`-th (ResNet-18 at batch 1 on two threads: the trial's
        two-thread runs waited 37 runs for its first recording to reach its 32nd)."""
        self.hot = True
        for rec in list(self.recordings.values()):
            if rec.parts is None and rec.native_after > rec.runs + 1:
                rec.native_after = max(rec.runs + 1, HOT_NATIVE_AFTER)

    def _failed(self, why: str) -> None:
        """A recording failed its check or went stale; after :data:`MAX_FAILURES` the step's
        driver serves for good (``why``)."""
        self._failures += 1
        if self._failures >= MAX_FAILURES:
            self.off = why

    def _replay(self, rec, values):
        try:
            out = rec.run(values)
        except Exception as e:  # noqa: BLE001 - the driver says what is wrong
            self.off = f"its replay raised {type(e).__name__}: {e}"
            with self._lock:
                self.recordings.clear()
            return self.compiled.fn(*values)
        self.replays += 1
        if not self.hot and rec.parts is not None:
            self.hot = True  # (its next recordings go native sooner: HOT_NATIVE_AFTER)
        return out

    def _trial(self, rec, values):
        """One timed run of a new recording's trial, by turns replayed and by the driver; once
        each has :data:`TRIAL_RUNS`, the faster by its best run serves the key (a step of a
        few small kernels may run no faster replayed: its inputs and outputs are copied). A
        run beside a compile on another thread (``threads.BACKGROUND``: its calls going
        native, which a trial of threads hurries), or that loaded a kernel, is no sample: timed
        so, MobileNetV2's replays at batch 1 on two threads lost to its driver and the driver
        served for good, 5.5 ms a run against 4.0."""
        threads.WARMING[0] += 1  # (by turns until one serves)
        times = rec.trial
        which = len(times[0]) > len(times[1])
        loads = threads.sample_mark()
        t0 = time.perf_counter()
        out = self.compiled.fn(*values) if which else self._replay(rec, values)
        if loads == threads.LOADS[0]:
            times[which].append(time.perf_counter() - t0)
        if len(times[1]) >= TRIAL_RUNS:
            rec.lost = min(times[0]) > min(times[1])
            rec.trial = None
        return out

    def _key(self, values):
        """The key of a run's arguments: the inputs' shapes, the loop threads now and the
        thread (slices of a batch run on threads of their own at once: each its recording;
        None: an input that is not an array, a random op's key)."""
        inputs = self._inputs
        if inputs is None or inputs[0] != len(values):
            inputs = self._inputs = [len(values)] + [
                i for i in range(len(values)) if i not in self.params]
        shapes = []
        for i in inputs[1:]:
            v = values[i]
            if type(v) is not np.ndarray:
                return None
            shapes.append(v.shape)
        return len(values), tuple(shapes), threads.loop_threads(), threading.get_ident()

    def _record(self, key, values):
        threads.LOADS[0] += 1  # (a run that records, then replays to check: no sample of a
        # trial of the run's threads, see threads.LOADS)
        fn = self._capture_fn()
        if fn is None:
            return self.compiled.fn(*values)
        inputs = [(i, np.array(values[i], order="C")) for i in self._inputs[1:]]
        at = [i for i in range(len(values)) if i in self.params]
        fixed = [values[i] for i in at]
        args = list(values)
        for i, buf in inputs:
            args[i] = buf
        made = _state()
        rec = _Recorder(fixed, [b for _, b in inputs])
        narrowed = threads.NARROWED[0]
        _local.rec = rec
        try:
            outs = fn(*args)
        finally:
            _local.rec = None
        why = rec.why
        if why is None and threads.NARROWED[0] != narrowed:
            why = "a busy core kept a split from its threads while it was recorded"
        if why is None and (not isinstance(outs, tuple) or
                            not all(isinstance(o, np.ndarray) for o in outs)):
            why = "its results are not a tuple of arrays"
        expected = tuple(np.array(o) for o in outs) if isinstance(outs, tuple) else outs
        if why is None:
            why = self._verify(rec, values, inputs, fixed, at, outs, expected, made, key)
        if why is not None:
            self.why = why
            if self._runs.get(key) == 0:  # (not for good: recorded again after as many runs)
                self._runs[key] = -RETRY_RUNS
        return expected

    def _verify(self, rec, values, inputs, fixed, at, outs, expected, made, key):
        """Replay ``rec`` on the run's ``values`` with its buffers and the results it copies
        into poisoned, and keep it where it gives the driver's outputs ``expected`` bit for
        bit (None; else why not)."""
        theirs = [b for _, b in inputs] + fixed
        try:
            ops, outs, arena = _planned(_views(_elided(rec.ops, outs, rec.allocs, theirs),
                                               outs, theirs), outs, rec.allocs)
        except TypeError as e:
            self.off = f"a call it records takes {e}"
            return self.off
        own = arena.nbytes + sum(b.nbytes for _, b in inputs)
        if own > MAX_BYTES:
            self._runs[key] = _NEVER
            return f"its buffers would hold {own} bytes"
        poisoned = _poisoner(arena, ops, theirs)
        poisoned()
        r = Recording(ops, rec.teams, inputs, fixed, at, outs, made)
        try:
            got = r.run(values)
        except Exception as e:  # noqa: BLE001 - the driver's own run gave the results
            self._failed(f"its replay raised {type(e).__name__}: {e}")
            return f"its replay raised {type(e).__name__}"
        if not all(g.dtype == e.dtype and g.shape == e.shape and g.tobytes() == e.tobytes()
                   for g, e in zip(got, expected)):
            self._failed("its replay differed from the driver's run")
            return "its replay differed from the driver's run"
        r.poison = poisoned  # (for the check of its native calls, later)
        if self.hot:
            r.native_after = HOT_NATIVE_AFTER
        if made != _state():
            return "a kernel became ready while it was recorded"
        with self._lock:
            while len(self.recordings) >= MAX_KEYS:
                self.recordings.pop(next(iter(self.recordings)), None)
            self.recordings[key] = r
        return None

    def _capture_fn(self):
        """The driver's function with every call made through the recorder (None: its source
        is not one the recorder knows; :attr:`off` says why). Its code is kept on disk by the
        source (``pysource.compile_rewritten``: ResNet-50's driver takes ~50 ms to rewrite)."""
        fn = self.compiled.fn
        if self._capture is not None and self._capture_of is fn:
            return self._capture
        source = getattr(self.compiled, "source", None)
        if source is None or not isinstance(fn, pytypes.FunctionType):
            self.off = "no driver source"
            return None
        collecting = gc.isenabled()
        gc.disable()  # (a large source's syntax tree: collections would double the time)
        try:
            code = pysource.compile_rewritten(source, f"<pdjit replay {_tag()}>", _rewritten)
        finally:
            if collecting:
                gc.enable()
        if isinstance(code, str):
            self.off = f"its source has {code}"
            return None
        ns = dict(fn.__globals__)
        ns.update(_rp_call=_call, _rp_item=_item, _rp_slice=slice, _rp_setitem=_setitem,
                  _rp_aug=_aug, _rp_number=_num)
        exec(code, ns)  # noqa: S102
        self._capture = ns[code.co_names[0]]  # (its one statement defines the function)
        self._capture_of = fn
        return self._capture


def _rewritten(source: str):
    """The code of ``source`` (one function) with every call made through the recorder, or
    why its source is not one the recorder knows."""
    tree = ast.parse(source)
    why = _source_why(tree)
    if why is not None:
        return why
    calls = _Calls()
    tree = calls.visit(tree)
    if calls.why is not None:
        return calls.why
    return compile(tree, f"<pdjit replay {tree.body[0].name}>", "exec")


_TAG: list = []


def _tag() -> str:
    """This module's version (its text's hash): what a kept rewritten code depends on."""
    if not _TAG:
        with open(__file__, "rb") as f:
            _TAG.append(hashlib.sha256(f.read()).hexdigest()[:16])
    return _TAG[0]


def _call(f, *args, **kwargs):
    return _local.rec.call(f, args, kwargs)


def _on_helpers() -> None:
    if recording() is not None:
        refuse("a split on run_parts' helpers")


def _on_derived(array) -> None:
    rec = getattr(_local, "rec", None)
    if rec is not None and rec.why is None:
        rec.derived_from(array)


#: library kernels that a host call runs by a stand-in while a worker compiles them beside the
#: runs (``lib.team.standing_in``): ``{kernel: stand-in}``, the stand-in taking the kernel's
#: arguments and refusing a recording (the library's modules register theirs)
STAND_INS: dict = {}


#: ``[lib.team.standing_in]``, set by the library (which this module sits below)
STANDING: list = [lambda fn: False]


def standing_in(fn) -> bool:
    """Whether a host call of ``fn`` runs its stand-in (:data:`STAND_INS`) now."""
    return fn in STAND_INS and STANDING[0](fn)


def kernel_call(fn, *args) -> None:
    """``fn(*args)`` (a kernel, or a Python function calling kernels) below an entry point
    declared ``"leaves"``: recorded where a driver is being recorded (each direct kernel call
    there must come this way, else a recording misses it); a kernel's stand-in while it
    compiles beside the runs (:func:`standing_in`)."""
    alt = STAND_INS.get(fn)
    if alt is not None and STANDING[0](fn):  # (standing_in)
        alt(*args)
        return
    rec = recording()
    if rec is None:
        fn(*args)
    else:
        rec.below_leaves(fn, args)


declare("pure", bdim, check, memplan.numel)
threads.on_helpers[0] = _on_helpers
params.on_derived[0] = _on_derived
