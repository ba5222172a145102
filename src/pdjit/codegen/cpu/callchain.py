"""A replayed recording's kernel calls as one native function: :func:`build` compiles a run of
calls (``(fn, args)``: a compiled kernel, a Numba dispatcher, and the arguments it was recorded
with) into a function of no arguments that makes each call in turn with those arguments as
constants (each array's address, shape and strides) and returns 0, or ``k + 1`` where call
``k`` failed (raised), leaving the calls after it undone.

A replay (``pdjit.codegen.cpu.replay``) otherwise calls each kernel from Python: its dispatcher
resolves the arguments' types and unboxes each one, a microsecond or more a call with the
caches cold from the kernel before; MobileNetV2 at batch 1 makes 55 such calls a run, the
BERT-like encoder 60. Only the calls go native, not the kernels: each is called where Numba
compiled it (its address in the process), so the function compiles in milliseconds whatever
the kernels' size. The arrays must outlive the function and stay where they are (a
recording holds them); a call whose arguments change from run to run (an input passed in
place), or of a kind not taken here, stays in Python.
"""
from __future__ import annotations

import ctypes
import itertools

import llvmlite.ir as ir
import numpy as np
from numba.core import types
from numba.core.compiler_lock import global_compiler_lock
from numba.core.dispatcher import Dispatcher
from numba.core.registry import cpu_target

__all__ = ["build", "native"]

_names = itertools.count()


class Unsupported(Exception):
    """A call :func:`build` does not take (it stays in Python)."""


def native(fn, args):
    """``(compile result, argument types)`` of the compiled kernel that the dispatcher ``fn``
    runs for ``args`` (:class:`Unsupported`: not a dispatcher, an argument not an array, an
    int, a float or a bool, no compiled version for their types)."""
    if not isinstance(fn, Dispatcher):
        raise Unsupported(f"{fn!r} is no kernel")
    for a in args:
        if not isinstance(a, (np.ndarray, int, float, bool, np.integer, np.floating)):
            raise Unsupported(f"an argument of type {type(a).__name__}")
    sig = tuple(fn.typeof_pyval(a) for a in args)
    cres = fn.overloads.get(sig)
    if cres is None or cres.objectmode:
        raise Unsupported(f"no compiled {fn.__name__} for {sig}")
    return cres, sig


def _value(ctx, builder, ty, a):
    """The LLVM value of the argument ``a`` of Numba type ``ty`` (an array: its address,
    shape and strides, no owner)."""
    if isinstance(ty, types.Array):
        if not a.flags.aligned:
            raise Unsupported("an unaligned array")
        ary = ctx.make_array(ty)(ctx, builder)
        intp = ctx.get_value_type(types.intp)
        data = builder.inttoptr(ir.Constant(intp, a.ctypes.data), ary.data.type)
        ctx.populate_array(ary, data=data, shape=[intp(int(s)) for s in a.shape],
                           strides=[intp(int(s)) for s in a.strides], itemsize=a.itemsize,
                           meminfo=None)
        return ary._getvalue()
    if isinstance(ty, (types.Integer, types.Float, types.Boolean)):
        return ctx.get_constant(ty, a.item() if isinstance(a, np.generic) else a)
    raise Unsupported(f"an argument of type {ty}")


@global_compiler_lock
def build(calls):
    """The native function of ``calls`` (``[(compile result, argument types, args)]``, as
    :func:`native` gives them, with the arguments): a ``ctypes`` function of no arguments
    returning 0, or ``k + 1`` where call ``k`` raised (the Python state untouched: the
    caller makes that call again from Python, which raises its error), called with the GIL
    held. The compiled library is kept on the function (``.library``)."""
    ctx = cpu_target.target_context
    lib = ctx.codegen().create_library("pdjit_callchain")
    module = lib.create_ir_module("pdjit_callchain")
    i64 = ir.IntType(64)
    name = f"pdjit_callchain_{next(_names)}"
    fn = ir.Function(module, ir.FunctionType(i64, []), name=name)
    entry = fn.append_basic_block("entry")
    body = fn.append_basic_block("calls")
    builder = ir.IRBuilder(body)
    for k, (cres, sig, args) in enumerate(calls):
        cctx = cres.target_context
        fnty = cctx.call_conv.get_function_type(cres.fndesc.restype, cres.fndesc.argtypes)
        addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
        if not addr:
            raise Unsupported(f"no address for {cres.fndesc.llvm_func_name}")
        values = [_value(cctx, builder, ty, a) for ty, a in zip(sig, args)]
        packed = list(cctx.call_conv._get_arg_packer(sig).as_arguments(builder, values))
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
    lib.add_ir_module(module)
    lib.finalize()
    chain = ctypes.PYFUNCTYPE(ctypes.c_int64)(lib.get_pointer_to_function(name))
    chain.library = lib
    return chain
