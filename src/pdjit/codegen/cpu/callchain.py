"""A replayed recording's kernel calls as one native function: :func:`build` compiles a run of
calls (:class:`Call`: a compiled kernel of a Numba dispatcher and the arguments it was recorded
with, :func:`native`) into a function of no arguments that makes each call in turn with those
arguments as constants (each array's address, shape and strides) and returns 0, or ``k + 1``
where call ``k`` failed (raised), leaving the calls after it undone.

A replay (``pdjit.codegen.cpu.replay``) otherwise calls each kernel from Python: its dispatcher
resolves the arguments' types and unboxes each one, a microsecond or more a call with the
caches cold from the kernel before; MobileNetV2 at batch 1 makes 55 such calls a run, the
BERT-like encoder 60. Only the calls go native, not the kernels: each is called where Numba
compiled it (its address in the process), so the function compiles in tens of milliseconds
whatever the kernels' size (MobileNetV2's 55 calls ~0.1 s). The arrays must outlive the
function and stay where they are (a recording holds them); a call whose arguments change from
run to run (an input passed in place), or of a kind not taken here, stays in Python.
"""
from __future__ import annotations

import ctypes
import gc
import itertools
from typing import NamedTuple

import llvmlite.ir as ir
import numpy as np
from numba.core import types
from numba.core.compiler_lock import global_compiler_lock
from numba.core.dispatcher import Dispatcher
from numba.core.registry import cpu_target

__all__ = ["Call", "Unsupported", "build", "finish", "native", "prepare"]

_names = itertools.count()


class Unsupported(Exception):
    """A call :func:`build` does not take (it stays in Python)."""


class Call(NamedTuple):
    """A kernel call :func:`build` takes: the compiled kernel, its argument types, whether it
    runs without the GIL, the arguments."""
    cres: object
    sig: tuple
    nogil: bool
    args: tuple


def native(fn, args) -> Call:
    """The :class:`Call` of the compiled kernel that the dispatcher ``fn`` runs for ``args``
    (:class:`Unsupported`: not a dispatcher, an argument not an array, an int, a float or a
    bool, no compiled version for their types)."""
    if not isinstance(fn, Dispatcher):
        raise Unsupported(f"{fn!r} is no kernel")
    for a in args:
        if not isinstance(a, (np.ndarray, int, float, bool, np.integer, np.floating, np.bool_)):
            raise Unsupported(f"an argument of type {type(a).__name__}")
    sig = tuple(fn.typeof_pyval(a) for a in args)
    cres = fn.overloads.get(sig)
    if cres is None or cres.objectmode:
        raise Unsupported(f"no compiled {fn.__name__} for {sig}")
    return Call(cres, sig, bool(fn.targetoptions.get("nogil")), tuple(args))


_ARRAY_FIELDS = ("meminfo", "parent", "nitems", "itemsize", "data", "shape", "strides")


def _flatten(t):
    if isinstance(t, tuple):
        for u in t:
            yield from _flatten(u)
    else:
        yield t


def _constants(ctx, ty, a) -> list:
    """The LLVM constants the argument ``a`` of Numba type ``ty`` is passed as (a struct's
    members one by one, as Numba's calling convention flattens them): an array its address,
    shape and strides (no owner), a number itself."""
    model = ctx.data_model_manager[ty]
    flat = list(_flatten(model.get_argument_type()))
    if isinstance(ty, types.Array):
        if tuple(getattr(model, "_fields", ())) != _ARRAY_FIELDS or \
                len(flat) != 5 + 2 * a.ndim or not a.flags.aligned:
            raise Unsupported(f"an array of type {ty}")
        values = [None, None, a.size, a.itemsize, a.ctypes.data, *a.shape, *a.strides]
        out = []
        for t, v in zip(flat, values):
            if isinstance(t, ir.PointerType):
                out.append(ir.Constant(t, None) if v is None else
                           ir.Constant(ir.IntType(64), v).inttoptr(t))
            elif isinstance(t, ir.IntType) and v is not None:
                out.append(ir.Constant(t, int(v)))
            else:
                raise Unsupported(f"an array of type {ty}")
        return out
    if len(flat) == 1 and isinstance(ty, (types.Integer, types.Boolean)) and \
            isinstance(flat[0], ir.IntType):
        w = flat[0].width  # (the bits as the callee reads them: an unsigned one as signed)
        v = int(a) & ((1 << w) - 1)
        return [ir.Constant(flat[0], v - (1 << w) if w > 1 and v >> (w - 1) else v)]
    if len(flat) == 1 and isinstance(ty, types.Float) and \
            isinstance(flat[0], (ir.FloatType, ir.DoubleType)):
        return [ir.Constant(flat[0], float(a))]
    raise Unsupported(f"an argument of type {ty}")


def _function(module, name, calls) -> None:
    """Define ``i64 name()`` in ``module``: the ``calls`` in turn (:func:`build`)."""
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(i64, []), name=name)
    entry = fn.append_basic_block("entry")
    body = fn.append_basic_block("calls")
    builder = ir.IRBuilder(body)
    for k, (cres, sig, _, args) in enumerate(calls):
        cctx = cres.target_context
        fnty = cctx.call_conv.get_function_type(cres.fndesc.restype, cres.fndesc.argtypes)
        packed = [c for ty, a in zip(sig, args) for c in _constants(cctx, ty, a)]
        if [c.type for c in packed] != list(fnty.args[2:]):
            raise Unsupported(f"the arguments of {cres.fndesc.llvm_func_name}")
        addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        if not addr:
            raise Unsupported(f"no address for {cres.fndesc.llvm_func_name}")
        with builder.goto_block(entry):  # (the return slot and the error's, allocated once)
            ret = builder.alloca(fnty.args[0].pointee)
            exc = builder.alloca(fnty.args[1].pointee)
        builder.store(ir.Constant(fnty.args[0].pointee, None), ret)
        callee = builder.inttoptr(ir.Constant(i64, addr), fnty.as_pointer())
        code = builder.call(callee, [ret, exc] + packed)
        failed = builder.icmp_signed("!=", code, ir.Constant(code.type, 0))
        with builder.if_then(failed, likely=False):
            builder.ret(ir.Constant(i64, k + 1))
    builder.ret(ir.Constant(i64, 0))
    with builder.goto_block(entry):
        builder.branch(body)


def build(chains) -> list:
    """The native function of each list of :class:`Call` in ``chains``, all compiled as one
    library (MobileNetV2's three runs of calls: ~0.1 s): a ``ctypes`` function of no arguments
    returning 0, or ``k + 1`` where call ``k`` raised (the Python state untouched: the caller
    makes that call again from Python, which raises its error); None for a list it cannot take
    (:class:`Unsupported`). It releases the GIL while it runs where every kernel of it does
    (Numba's ``nogil``: a predictor on each of several threads runs at once), else holds it.
    Each function keeps the library (``.library``). :func:`prepare`, then :func:`finish`."""
    return finish(prepare(chains))


def prepare(chains):
    """What :func:`finish` compiles into :func:`build`'s functions: the library's module made
    (Python's work, with the GIL: ~30 ms for MobileNetV3-large's 84 calls, its garbage
    collector held off, which took 45 ms more among a model's objects)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with global_compiler_lock:
            lib = cpu_target.target_context.codegen().create_library("pdjit_callchain")
            module = lib.create_ir_module("pdjit_callchain")
            names = []
            for calls in chains:
                name = f"pdjit_callchain_{next(_names)}"
                try:
                    _function(module, name, calls)
                except Unsupported:
                    module.globals.pop(name, None)
                    name = None
                names.append(name)
            if any(names):
                lib.add_ir_module(module)
    finally:
        if collecting:
            gc.enable()
    return lib, names, chains


def finish(prepared) -> list:
    """:func:`build`'s functions from what :func:`prepare` made: LLVM's optimisation and code
    generation (~90 ms for MobileNetV3-large's 84 calls), which run without the GIL, so that
    this may run on a thread beside the runs that replay the calls from Python."""
    lib, names, chains = prepared
    if not any(names):
        return names
    with global_compiler_lock:
        lib.finalize()
    out = []
    for name, calls in zip(names, chains):
        chain = None
        if name is not None:
            kind = ctypes.CFUNCTYPE if all(c.nogil for c in calls) else ctypes.PYFUNCTYPE
            chain = kind(ctypes.c_int64)(lib.get_pointer_to_function(name))
            chain.library = lib
        out.append(chain)
    return out
