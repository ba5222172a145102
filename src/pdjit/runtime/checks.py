"""Run-time checks: NaN/Inf in op outputs, and a limit on the size of one op output.

**NaN/Inf.** ``PDJIT_CHECK_NAN_INF=1`` (or PaddlePaddle's ``FLAGS_check_nan_inf=1``) makes a
run stop at the first op whose output holds NaN or Inf: :class:`NanInfError` (an
``OpRunError``) names the op (type, block, index, the user's line that created it), the output
slot and variable, and how many NaN and Inf values it holds. Both executor modes check:

- ``reference`` mode (and reference steps of compiled plans, and the ops a control-flow op's
  reference runs in its sub-blocks) checks every floating-point output of every op after its
  reference ran, before the value reaches the run's env;
- ``compiled`` mode checks the outputs of each native step after its native code returned
  (values fused inside a step that are never stored are seen only through what they feed);
  when one holds NaN/Inf, the step's ops are run again with their references from the step's
  untouched inputs, with the check on, which pinpoints the first op that produced it. A native
  loop's outputs are checked the same way, its pinpointing runs the loop op's reference
  (whose body runs its own plan, with the check on).

A run stopped this way commits nothing to the Scope (the executor writes persistables only after
the whole run succeeded). Off by default, and free when off: the flags are read once, when an
Executor is made; a plan step tests one attribute per run. The check itself is one sum per
floating-point output (a finite sum proves every element finite: any NaN or Inf makes it NaN or
Inf); only an output that fails it is counted element by element. Measured cost
(``python benchmarks/bench_checks.py``: a 784-256-256-10 MLP training step, batch 64, SGD,
median of 300 interleaved runs of executors with the check off and on, in one process, on a
shared 2-core machine): compiled 1.04 vs 1.11 ms (+7 %: one native step, 35 outputs checked);
reference 1.96 vs 2.27 ms (+16 %: every op's outputs, 4-6 us each). The allocation check
measured 1.04 vs 1.04 ms compiled (one dict lookup per native step) and 1.96 vs 1.87 ms
reference (a memo lookup per op) against executors without a limit.

**Allocation limit.** An op whose output would take more bytes than the limit raises
:class:`AllocationLimitError` (an ``OpRunError`` and a ``MemoryError``) naming the op, the
output variable, its shape, the bytes and the limit, before anything is allocated. The limit is
``PDJIT_MAX_ALLOC_BYTES`` when set, else the memory the machine has available when the Executor
is made (``MemAvailable`` of ``/proc/meminfo``, else ``os.sysconf`` free pages); either is
lowered to what the process's ``RLIMIT_AS`` and its cgroup's memory limit (``memory.max``)
leave it; ``0`` turns the check off. Output sizes come from the ops' ``infer_shape``:

- shapes of the global block's outputs known before the run (``fill_constant([1e9, 1e9])``,
  a random op's ``shape``) are checked when the run is prepared, before any op runs (in both
  modes; a sub-block's op is checked when it runs: a branch that does not run allocates
  nothing);
- shapes that depend on fed sizes (a broadcast of ``[N, 1]`` and ``[1, N]``) are computed
  from the input shapes the first time a plan step (or, in reference mode, an op) sees them,
  and remembered per input shapes: a later run with the same shapes costs one tuple of shapes
  and a dict lookup per native step. Shapes that depend on tensor values (a ``ShapeTensor``)
  are not known before the op runs and are not checked; nor are the outputs of the ops inside
  a native loop's body (the loop is one native function), nor scratch memory inside a kernel.

**Run-time shapes.** The same ``infer_shape`` pass, on the run-time shapes, must accept them:
compiled code is built for ranks, and an elementwise kernel would broadcast shapes that an op
refuses (``huber_loss`` of ``[2, 1]`` and ``[1, 2]``). Before an op's reference runs, shapes its
``infer_shape`` refuses (a ``ShapeMismatch``) are an ``OpRunError`` naming the op and saying
why; a native step whose shapes an op refuses runs its ops' references instead, which raise
that error. Both are remembered per input shapes with the allocation check (limit or not), so
both modes fail alike for every op, whether or not its reference checks shapes itself.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import AllocationLimitError, NanInfError, ShapeMismatch
from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType
NAN_INF_FLAGS = ("PDJIT_CHECK_NAN_INF", "FLAGS_check_nan_inf")
LIMIT_ENV = "PDJIT_MAX_ALLOC_BYTES"
# dense tensors: a SELECTED_ROWS variable declares the full height but holds only some rows
_TENSORS = (VarType.LOD_TENSOR,)
_SKIP = (registry.CONTROL_FLOW, registry.FEED_FETCH)
_MEMO_MAX = 256  # input-shape signatures remembered per step or op


def env_flag(name: str, default: bool) -> bool:
    """A 0/1 switch from the environment variable ``name``."""
    v = os.environ.get(name, "").strip().lower()
    if v == "":
        return default
    if v in ("0", "false", "off", "no"):
        return False
    if v in ("1", "true", "on", "yes"):
        return True
    raise ValueError(f"{name}={v!r}: expected 0 or 1")


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read(64).strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:  # "max": no limit
        return None


def _status_bytes(key: bytes) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmSize``) in bytes."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_memory_room() -> int | None:
    """Bytes this process may still allocate under its own limits, or None when none is set:
    ``RLIMIT_AS`` (less the address space in use) and the cgroup's memory limit (v2
    ``memory.max`` less ``memory.current``; v1 ``memory.limit_in_bytes`` less usage)."""
    rooms = []
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            used = _status_bytes(b"VmSize:") or 0
            rooms.append(max(soft - used, 0))
    except (ImportError, OSError, ValueError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit = _read_int(limit_file)
        if limit is not None and 0 < limit < 1 << 60:  # (v1 says "no limit" with a huge one)
            rooms.append(max(limit - (_read_int(usage_file) or 0), 0))
            break
    return min(rooms) if rooms else None


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (``MemAvailable``, within the process's
    ``RLIMIT_AS`` and cgroup limit), or None if unknown."""
    room = process_memory_room()
    free = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    known = [v for v in (free, room) if v is not None]
    return min(known) if known else None


def alloc_limit() -> int | None:
    """The byte limit of one op output: ``PDJIT_MAX_ALLOC_BYTES`` (``0``: no limit), else the
    available memory; either way no more than ``RLIMIT_AS`` and the cgroup's memory limit
    leave this process. None: no limit."""
    v = os.environ.get(LIMIT_ENV, "").strip()
    if v:
        try:
            n = int(float(v))
        except ValueError:
            raise ValueError(f"{LIMIT_ENV}={v!r}: expected a number of bytes") from None
        if n < 0:
            raise ValueError(f"{LIMIT_ENV}={v!r}: expected a number of bytes >= 0")
        if not n:
            return None
        room = process_memory_room()
        return n if room is None else min(n, room)
    return available_memory()


@dataclass(frozen=True)
class Settings:
    """What an executor checks: ``nan_inf`` (bool) and ``limit`` (bytes per output, or None)."""
    nan_inf: bool = False
    limit: int | None = None


def settings() -> Settings:
    """The settings from the environment (read once per executor)."""
    return Settings(any(env_flag(n, False) for n in NAN_INF_FLAGS), alloc_limit())


OFF = Settings()


# -- NaN / Inf --------------------------------------------------------------------------------
def _array(value):
    """The ndarray of a float value to check, else None."""
    if type(value) is not np.ndarray:
        value = getattr(value, "_array", None)  # a LoDTensor's array
        if not isinstance(value, np.ndarray):
            return None
    return value if value.dtype.kind in "fc" and value.size else None


def counts(value) -> tuple | None:
    """``(nan, inf)`` counts of a floating-point value holding some, else None."""
    a = _array(value)
    if a is None:
        return None
    with np.errstate(all="ignore"):
        if np.isfinite(a.sum()):
            return None  # a finite sum: every element is finite
    nan, inf = int(np.count_nonzero(np.isnan(a))), int(np.count_nonzero(np.isinf(a)))
    return (nan, inf) if nan or inf else None


def nan_inf_error(op, op_idx: int, slot: str, name: str, found: tuple, size: int,
                  note: str = "") -> NanInfError:
    nan, inf = found
    return NanInfError(f"output {slot!r} (variable {name!r}) holds {nan} NaN and {inf} Inf "
                       f"of {size} values{note} (PDJIT_CHECK_NAN_INF)",
                       op.type, op.block.idx, op_idx, op.location(), var_name=name,
                       nan_count=nan, inf_count=inf)


def check_output(op, op_idx: int, slot: str, name: str, value) -> None:
    """Raise :class:`NanInfError` if ``value`` (output ``slot`` of ``op``, variable ``name``)
    holds NaN or Inf; a list (a tensor array) is checked element by element."""
    if isinstance(value, list):
        for v in value:
            check_output(op, op_idx, slot, name, v)
        return
    found = counts(value)
    if found is not None:
        raise nan_inf_error(op, op_idx, slot, name, found, np.asarray(value).size)


def first_bad(names, values):
    """``(name, (nan, inf), size)`` of the first of ``values`` holding NaN/Inf, else None."""
    for name, value in zip(names, values):
        found = counts(value)
        if found is not None:
            return name, found, np.asarray(value).size
    return None


def pinpoint(runner, env, run_index, ops, names, values) -> None:
    """After native code produced NaN/Inf in one of ``values`` (of ``names``): run ``ops``
    ((op, index) pairs) with their references from the untouched inputs in ``env``, with the
    check on, so that the first op producing NaN/Inf raises; raise for the step's writer of
    the variable if the references produced none."""
    bad = first_bad(names, values)
    if bad is None:
        return
    for op, i in ops:
        runner.run_op(op, i, env, run_index)
    name, found, size = bad
    op, i = next(((o, i) for o, i in reversed(ops) if name in o.output_arg_names), ops[-1])
    opdef = registry.lookup(op.type)
    slot = next((s.name for s in opdef.outputs if name in op.output(s.name)), "?") \
        if opdef is not None else "?"
    raise nan_inf_error(op, i, slot, name, found, size,
                        " in native code (its NumPy reference gave none)")


# -- allocation limit -------------------------------------------------------------------------
def _nbytes(shape, dtype) -> int | None:
    """Bytes of a tensor of ``shape`` (None when a dim is unknown)."""
    n = 1
    for d in shape:
        if d < 0:
            return None
        n *= int(d)
    return n * np.dtype(dtype).itemsize


def _limit_error(op, op_idx, slot, name, shape, dtype, nbytes, limit) -> AllocationLimitError:
    return AllocationLimitError(
        f"output {slot!r} (variable {name!r}) of shape {list(shape)} and dtype "
        f"{np.dtype(dtype).name} would take {nbytes} bytes ({nbytes / 2**30:.3g} GiB), more "
        f"than the limit of {limit} bytes ({limit / 2**30:.3g} GiB; {LIMIT_ENV} sets it)",
        op.type, op.block.idx, op_idx, op.location(), var_name=name, shape=tuple(shape),
        nbytes=nbytes, limit=limit)


def _output_vars(op, opdef):
    """(slot, variable name, VarDesc) of each tensor output of ``op``."""
    block = op.block
    for slot in opdef.outputs:
        for n in op.output(slot.name):
            if n == registry.EMPTY_VAR_NAME:
                continue
            v = block._find_var_recursive(n)
            if v is not None and v.type in _TENSORS and v.dtype is not None:
                yield slot.name, n, v


def _skipped(opdef) -> bool:
    return opdef is None or any(opdef.has(t) for t in _SKIP)


def check_static(block, limit, ops=None) -> None:
    """Raise :class:`AllocationLimitError` for the first op of ``block`` (or of ``ops``,
    ``(op, index)`` pairs) whose output's declared shape, fully known, exceeds ``limit``."""
    if not limit:
        return
    pairs = ops if ops is not None else list(enumerate_ops(block))
    for op, i in pairs:
        opdef = registry.lookup(op.type)
        if _skipped(opdef):
            continue
        for slot, n, v in _output_vars(op, opdef):
            nb = _nbytes(v.shape, v.dtype)
            if nb is not None and nb > limit:
                raise _limit_error(op, i, slot, n, v.shape, v.dtype, nb, limit)


def enumerate_ops(block):
    for i, op in enumerate(block.ops):
        yield op, i


def _run_sizes(pairs, known: dict, misfits: list | None = None) -> list:
    """Propagate run-time shapes through ``pairs`` with their ``infer_shape``: ``known`` maps
    names to run-time VarMetas (updated). Returns ``[(op, index, slot, name, shape, dtype,
    bytes)]`` of the outputs whose size became known; stops at the first op whose inputs do
    not fit (its own code then says what is wrong), appending ``(op, index, reason)`` of it
    to ``misfits`` (when given) if its ``infer_shape`` refused the run-time shapes."""
    out = []
    for op, i in pairs:
        opdef = registry.lookup(op.type)
        if _skipped(opdef):
            continue
        block = op.block

        def meta_of(n, block=block):
            m = known.get(n)
            if m is None:
                v = block._find_var_recursive(n)
                m = None if v is None else v.meta()
            return m

        try:
            result = opdef.infer_op(op, meta_of)
        except ShapeMismatch as e:
            if misfits is not None:
                misfits.append((op, i, f"its inputs' run-time shapes do not fit it: {e}"))
            return out
        except (ValueError, TypeError, IndexError, KeyError, AttributeError):
            return out
        for slot in opdef.outputs:
            res = result.get(slot.name)
            if res is None:
                continue
            res = res if isinstance(res, (list, tuple)) else [res]
            for n, meta in zip(op.output(slot.name), res):
                if n == registry.EMPTY_VAR_NAME or meta is None:
                    continue
                known[n] = meta
                v = block._find_var_recursive(n)
                if v is None or v.type not in _TENSORS:
                    continue
                nb = _nbytes(meta.shape, meta.dtype)
                if nb is not None:
                    out.append((op, i, slot.name, n, meta.shape, meta.dtype, nb))
    return out


def _meta_of(block, name, value):
    """The run-time VarMeta of ``value`` (an ndarray), or None for other values."""
    if type(value) is not np.ndarray:
        value = getattr(value, "_array", None)
        if not isinstance(value, np.ndarray):
            return None
    v = block._find_var_recursive(name)
    if v is None:
        return registry.VarMeta(value.shape, value.dtype, 0, VarType.LOD_TENSOR, name)
    return registry.VarMeta(value.shape, value.dtype, v.lod_level, v.type, name)


def _raise_over(sizes, limit) -> None:
    for op, i, slot, n, shape, dtype, nb in sizes:
        if nb > limit:
            raise _limit_error(op, i, slot, n, shape, dtype, nb, limit)


class StepGuard:
    """The run-time checks of a native plan step (``ops``: its (op, index) pairs, ``args``:
    the env names of its arguments, in order), made once per new tuple of argument shapes
    (:func:`step_guard`): the step's ops' ``infer_shape`` must accept the shapes (native code
    is compiled for ranks and trusts the shapes fit: an op whose reference would refuse them,
    a ``huber_loss`` of ``[2, 1]`` and ``[1, 2]``, would broadcast them instead), and no
    output may exceed the allocation limit (``limit``; 0: none). Shapes known before the run
    are checked the same way, when the step first runs."""

    __slots__ = ("ops", "args", "limit", "block", "memo")

    def __init__(self, ops, args, limit: int, block):
        self.ops, self.args, self.limit, self.block = ops, list(args), limit, block
        self.memo: dict = {}

    def check(self, values):
        """Before the step's native code runs (``values``: the argument arrays, in order):
        raise :class:`AllocationLimitError` if an output would exceed the limit; return
        ``(op, index, reason)`` of the first op whose ``infer_shape`` refuses the run-time
        shapes (the step's references then run, and say what is wrong as in reference mode),
        else None."""
        key = tuple([v.shape for v in values[:len(self.args)]])
        if key in self.memo:
            return None
        known = {}
        for n, v in zip(self.args, values):
            m = _meta_of(self.block, n, v)
            if m is not None:
                known[n] = m
        misfits = []
        sizes = _run_sizes(self.ops, known, misfits)
        if self.limit:
            _raise_over(sizes, self.limit)
        if misfits:
            return misfits[0]
        if len(self.memo) >= _MEMO_MAX:
            self.memo.clear()
        self.memo[key] = True
        return None


def step_guard(ops, args, limit, block) -> StepGuard:
    """The :class:`StepGuard` of a native step's run-time shapes (``limit``: 0 for none).
    Sizes are checked when the step runs, from the shapes its ops compute, as the reference
    interpreter checks each op: a sub-block's op whose declared shape is beyond the limit
    (a branch that does not run, a declaration more specific than what the op computes)
    stops neither mode. (The executor checks the global block's declared sizes before either
    mode runs anything.)"""
    return StepGuard(ops, args, limit, block)


_OP_MEMO = "pdjit.runtime.checks.op_sizes"


def check_op(op, op_idx: int, inputs: dict, limit) -> str | None:
    """Before ``op``'s reference runs (``inputs``: slot -> value(s) as it will get them): raise
    if an output, sized by ``infer_shape`` from the input shapes, would exceed ``limit`` (None
    or 0: no limit); return why ``infer_shape`` refuses the input shapes (None: they fit), the
    reason a native step gives for the same shapes. Both are remembered per op and input
    shapes, with the program's other run caches."""
    shapes = []
    for slot_values in inputs.values():
        if isinstance(slot_values, list):
            shapes.append(tuple([getattr(v, "shape", None) for v in slot_values]))
        else:
            shapes.append(getattr(slot_values, "shape", None))
    memo = op.block.program._run_cache().setdefault((_OP_MEMO, "sizes"), {})
    key = (op.block.idx, op_idx, tuple(shapes))
    found = memo.get(key)
    if found is None:
        opdef = registry.lookup(op.type)
        known = {}
        for slot in opdef.inputs:
            names = [n for n in op.input(slot.name) if n != registry.EMPTY_VAR_NAME]
            vals = inputs.get(slot.name)
            if not slot.duplicable:
                vals = [vals]  # (a tensor array's list stays one value: not a tensor)
            elif not isinstance(vals, list):
                continue
            for n, v in zip(names, vals):
                m = _meta_of(op.block, n, v)
                if m is not None:
                    known[n] = m
        misfits = []
        sizes = _run_sizes([(op, op_idx)], known, misfits)
        found = (sizes, misfits[0][2] if misfits else None)
        if len(memo) >= 4096:
            memo.clear()
        memo[key] = found
    if limit:
        _raise_over(found[0], limit)
    return found[1]
