"""Collective ops for data-parallel training across processes (``pdjit.distributed``).

Types, slots and attributes are PaddlePaddle 3.3.1's legacy collective ops, so programs its
``GradAllReduce`` transpiler (and fleet's raw-program optimizer) writes run here:

- ``broadcast`` (``x`` -> ``out``, ``root``, ``ring_id``) and the 2.x name ``c_broadcast``
  (``X`` -> ``Out``, ``root``, ``ring_id``, ``use_calc_stream``): ``out`` is rank ``root``'s
  ``x`` on every rank (in place: ``x`` and ``out`` name the same variable in a transpiled
  program).
- ``all_reduce`` (``x`` -> ``out``, ``reduce_type``: 0 sum, 1 max, 2 min, 3 prod, 4 avg, as
  Paddle's ``ReduceOp``) and the 2.x names ``c_allreduce_sum`` / ``_max`` / ``_min`` / ``_prod``
  (``X`` -> ``Out``): the elementwise reduction of ``x`` over every rank.
- ``c_sync_calc_stream`` / ``c_sync_comm_stream`` (``X`` -> ``Out``, the same values): stream
  barriers on a GPU; on the CPU the collectives complete before they return, so these are
  identities.
- ``coalesce_tensor`` (``Input`` -> ``Output``, ``FusedOutput``): one flat buffer
  ``FusedOutput`` of ``dtype`` holding every input back to back, each one's extent rounded up
  to the alignment when ``use_align`` (``align_size`` bytes; -1: Paddle's CPU chunk, 4 KiB),
  and ``Output[i]`` a view of its part with ``Input[i]``'s shape. ``copy_data``: the parts hold
  the inputs' values; ``set_constant``: every element is ``constant``; neither: zeros (Paddle
  leaves the memory as it finds it). The gaps of the alignment are zeros.
- ``depend`` (``X``, ``Dep`` -> ``Out``): ``Out`` is ``X``; ``Dep`` only orders the op after
  its writer (fleet writes it after a fused all-reduce).

In Paddle a fused bucket works by aliasing: the gradient ops write into the views the
``coalesce_tensor`` made, so the buffer holds the gradients when its ``all_reduce`` runs. pdjit's
kernels produce fresh arrays instead, so an ``all_reduce`` whose ``x`` is the ``FusedOutput`` of a
``coalesce_tensor`` of its block first gathers the current value of each of that op's
``Output`` variables into the buffer, and after the reduction rebinds each of them to its
(reduced) part: the bucket means the same in both layouts, written before the backward ops as
Paddle writes it or after them.

The communication goes through the *current communicator* (:func:`set_communicator`, which
``pdjit.distributed.fleet.init`` calls); with none the job has one rank and every collective is
the identity. A communicator provides ``rank``, ``size``, ``allreduce(array, op, ring_id)``
(returns a new array), ``broadcast(array, root, ring_id)`` (returns a new array) and may raise
:class:`CollectiveError`. These ops have no native lowering: in a compiled plan each is a
reference step of its own between native steps (a side effect: never pruned, reordered or
fused; not a fallback in strict mode).

They are registered with the built-in ops (a program PaddlePaddle's collective transpiler wrote
loads with ``import pdjit`` alone).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import PdjitError, ShapeMismatch
from pdjit.framework.registry import SIDE_EFFECT, Bool, Float, Int, Ints, register_op

SUM, MAX, MIN, PROD, AVG = 0, 1, 2, 3, 4
REDUCE_NAMES = {SUM: "sum", MAX: "max", MIN: "min", PROD: "prod", AVG: "avg"}
CPU_ALIGN_BYTES = 4096  # Paddle's minimum CPU chunk: the alignment of use_align on a CPU


class CollectiveError(PdjitError, RuntimeError):
    """A collective could not complete: a peer failed, left, timed out or disagrees."""


_current = None


def set_communicator(comm) -> None:
    """Make ``comm`` the communicator the collective ops use (``None``: one rank)."""
    global _current
    _current = comm


def current_communicator():
    """The communicator the collective ops use, or ``None`` (one rank: identities)."""
    return _current


class _Local:
    """One rank: every collective is the identity (returns a copy)."""
    rank, size = 0, 1

    def allreduce(self, array, op=SUM, ring_id=0):
        return np.array(array, copy=True)

    def broadcast(self, array, root=0, ring_id=0):
        if root != 0:
            raise CollectiveError(f"broadcast from root {root}: the job has one rank (0)")
        return np.array(array, copy=True)


_LOCAL = _Local()
_DEFS: list = []  # the definitions, registered by register()


def _comm(ctx=None):
    """The current communicator; on a communicator that can compare programs
    (``check_program(program)``), the first collective op each rank runs of each program
    (content and version) first compares the program with the other ranks': ranks running
    different programs stop there with a clear error instead of pairing unrelated
    collectives."""
    comm = _current if _current is not None else _LOCAL
    check = getattr(comm, "check_program", None)
    if check is not None and ctx is not None:
        check(ctx.op.block.program)
    return comm


def _dense(x, what):
    a = np.asarray(x)
    if a.dtype == object:
        raise ShapeMismatch(f"{what}: expected a dense tensor, got {type(x).__name__}")
    return np.ascontiguousarray(a)


# ---- broadcast ----------------------------------------------------------------------------------
def _check_root(root, what):
    size = _comm().size
    if not 0 <= int(root) < size:
        raise ShapeMismatch(f"{what}: root {root} is not a rank of the job (ranks 0..{size - 1})")


def _bcast_ref(x, *, root, ring_id, what, ctx=None):
    comm = _comm(ctx)
    _check_root(root, what)
    return comm.broadcast(_dense(x, what), int(root), int(ring_id))


_RING = {"ring_id": Int(0, low=0, high=0, at_least=0)}

_DEFS.append(dict(
    type="broadcast", inputs=["x"], outputs=["out"],
    attrs={**_RING, "root": Int(0, low=0, high=0, at_least=0)}, traits=[SIDE_EFFECT],
    infer_shape=lambda x, **_: {"out": x},
    reference=lambda x, *, root, ring_id, ctx=None: {
        "out": _bcast_ref(x, root=root, ring_id=ring_id, what="broadcast", ctx=ctx)},
    emit=None, grad=None,
    doc="out = x of rank root, on every rank (communicator ring ring_id)."))

_DEFS.append(dict(
    type="c_broadcast", inputs=["X"], outputs=["Out"],
    attrs={**_RING, "root": Int(0, low=0, high=0, at_least=0), "use_calc_stream": Bool(False)},
    traits=[SIDE_EFFECT], infer_shape=lambda X, **_: {"Out": X},
    reference=lambda X, *, root, ring_id, ctx=None: {
        "Out": _bcast_ref(X, root=root, ring_id=ring_id, what="c_broadcast", ctx=ctx)},
    emit=None, grad=None, doc="Out = X of rank root, on every rank (2.x name of broadcast)."))


# ---- all-reduce ---------------------------------------------------------------------------------
def _fused_members(ctx, name):
    """The ``coalesce_tensor`` op of ``ctx.op``'s block whose ``FusedOutput`` is ``name``."""
    for op in ctx.op.block.ops:
        if op.type == "coalesce_tensor" and name in op.output("FusedOutput"):
            return op
    return None


def _allreduce(x, op_kind, ring_id, what, ctx):
    if op_kind not in REDUCE_NAMES:
        raise ShapeMismatch(f"{what}: reduce_type must be one of {sorted(REDUCE_NAMES)} "
                            f"({', '.join(REDUCE_NAMES.values())}), got {op_kind}")
    comm = _comm(ctx)
    a = _dense(x, what)
    coalesce = None
    if ctx is not None:
        name = ctx.op.input_arg_names[0]
        coalesce = _fused_members(ctx, name)
    if coalesce is not None:  # a bucket: gather its members' current values
        members = coalesce.output("Output")
        attrs = coalesce.all_attrs()
        values = [np.asarray(ctx.env.get(m)) if ctx.env.get(m) is not None else None
                  for m in members]
        if any(v is None for v in values):
            missing = [m for m, v in zip(members, values) if v is None]
            raise ShapeMismatch(f"{what}: the bucket {name!r} has members without a value: "
                                f"{missing}")
        offsets, total = _layout([v.shape for v in values], a.dtype,
                                 attrs.get("use_align", True), attrs.get("align_size", -1))
        if total != a.size:
            raise ShapeMismatch(f"{what}: the bucket {name!r} holds {a.size} elements, its "
                                f"members need {total}")
        buf = np.array(a, copy=True)
        for v, off in zip(values, offsets):
            buf[off:off + v.size] = v.reshape(-1)
        out = comm.allreduce(buf, op_kind, int(ring_id))
        for m, v, off in zip(members, values, offsets):
            ctx.env.set(m, out[off:off + v.size].reshape(v.shape))
        return out
    return comm.allreduce(a, op_kind, int(ring_id))


_DEFS.append(dict(
    type="all_reduce", inputs=["x"], outputs=["out"],
    attrs={**_RING, "reduce_type": Int(SUM, choices=(SUM,), one_of=tuple(REDUCE_NAMES))},
    traits=[SIDE_EFFECT], infer_shape=lambda x, **_: {"out": x},
    reference=lambda x, *, reduce_type, ring_id, ctx=None: {
        "out": _allreduce(x, int(reduce_type), ring_id, "all_reduce", ctx)},
    emit=None, grad=None,
    doc="out = the reduction (reduce_type: 0 sum, 1 max, 2 min, 3 prod, 4 avg) of x over every "
        "rank."))

for _kind, _code in (("sum", SUM), ("max", MAX), ("min", MIN), ("prod", PROD)):
    _DEFS.append(dict(
        type=f"c_allreduce_{_kind}", inputs=["X"], outputs=["Out"],
        attrs={**_RING, "use_calc_stream": Bool(False), "use_model_parallel": Bool(False)},
        traits=[SIDE_EFFECT], infer_shape=lambda X, **_: {"Out": X},
        reference=(lambda code, t: lambda X, *, ring_id, ctx=None: {
            "Out": _allreduce(X, code, ring_id, t, ctx)})(_code, f"c_allreduce_{_kind}"),
        emit=None, grad=None,
        doc=f"Out = the {_kind} of X over every rank (2.x name of all_reduce)."))


# ---- stream synchronisation (identities on the CPU) -----------------------------------------
for _name, _attrs in (("c_sync_calc_stream", {}), ("c_sync_comm_stream", _RING)):
    _DEFS.append(dict(
        type=_name, inputs=["X*"], outputs=["Out*"], attrs=dict(_attrs),
        traits=[SIDE_EFFECT], infer_shape=lambda X, **_: {"Out": list(X)},
        reference=lambda X, **_: {"Out": list(X)}, emit=None, grad=None,
        doc="Out = X: the collectives of the CPU complete before they return."))

_DEFS.append(dict(
    type="depend", inputs=["X", "Dep*"], outputs=["Out"], attrs={}, traits=[SIDE_EFFECT],
    infer_shape=lambda X, **_: {"Out": X}, reference=lambda X, **_: {"Out": X},
    emit=None, grad=None, doc="Out = X, ordered after the writers of Dep."))


# ---- coalesce_tensor ---------------------------------------------------------------------------
def _layout(shapes, dtype, use_align, align_size):
    """(offset of each tensor in elements, total elements) of a fused buffer."""
    item = np.dtype(dtype).itemsize
    align = (int(align_size) if align_size and int(align_size) > 0 else CPU_ALIGN_BYTES) \
        if use_align else item
    if align % item:
        raise ShapeMismatch(f"coalesce_tensor: align_size {align} is not a multiple of the "
                            f"element size {item}")
    per = align // item
    offsets, at = [], 0
    for s in shapes:
        n = int(np.prod(s, dtype=np.int64))
        offsets.append(at)
        at += -(-max(n, 1) // per) * per if use_align else n
    return offsets, at


def _coalesce_infer(Input, *, dtype, use_align, align_size, **_):
    dt = dtypes.to_numpy(dtype)
    for i, m in enumerate(Input):
        if m.dtype != dt:
            raise ShapeMismatch(f"coalesce_tensor: Input[{i}] is {m.dtype}, expected the "
                                f"fused dtype {dt}")
    known = all(d >= 0 for m in Input for d in m.shape)
    total = _layout([m.shape for m in Input], dt, use_align, align_size)[1] if known else -1
    return {"Output": list(Input), "FusedOutput": Input[0].with_(shape=(total,), dtype=dt)
            if Input else None}


def _coalesce_ref(Input, *, dtype, copy_data, set_constant, constant, use_align, align_size,
                  **_):
    dt = dtypes.to_numpy(dtype)
    if not Input:
        raise ShapeMismatch("coalesce_tensor: expected at least one Input, got none")
    if copy_data and set_constant:
        raise ShapeMismatch("coalesce_tensor: copy_data and set_constant are exclusive, got "
                            "both true")
    arrays = [np.asarray(a) for a in Input]
    for i, a in enumerate(arrays):
        if a.dtype != dt:
            raise ShapeMismatch(f"coalesce_tensor: Input[{i}] is {a.dtype}, expected the fused "
                                f"dtype {dt}")
    offsets, total = _layout([a.shape for a in arrays], dt, use_align, align_size)
    fused = np.zeros(total, dt)
    views = []
    for a, off in zip(arrays, offsets):
        part = fused[off:off + a.size]
        if copy_data:
            part[...] = a.reshape(-1)
        elif set_constant:
            part[...] = constant
        views.append(part.reshape(a.shape))
    return {"Output": views, "FusedOutput": fused}


_DEFS.append(dict(
    type="coalesce_tensor", inputs=["Input*"], outputs=["Output*", "FusedOutput"],
    attrs={"dtype": Int(5), "copy_data": Bool(False), "set_constant": Bool(False),
           "persist_output": Bool(False), "constant": Float(0.0), "check_name": Bool(False),
           "use_align": Bool(True), "align_size": Int(-1), "size_of_dtype": Int(-1),
           "concated_shapes": Ints([]), "concated_ranks": Ints([])},
    traits=[SIDE_EFFECT], infer_shape=_coalesce_infer, reference=_coalesce_ref, emit=None,
    grad=None,
    doc="FusedOutput = one flat buffer of every Input (aligned parts); Output[i] = its part."))


_registered = False


def register() -> None:
    """Register the collective ops (once). ``pdjit.distributed`` calls it on import; a program
    with collective ops (written by PaddlePaddle's transpiler) runs after
    ``import pdjit.distributed``."""
    global _registered
    if not _registered:
        _registered = True
        for d in _DEFS:
            register_op(**d)


register()
