"""One Python function, compiled by Numba's ahead-of-time code generation into an object file.

Everything here that touches Numba's internals is in this file (and pinned by
``tests/codegen/aot/test_aot_numba_internals.py``):

- ``cpu_target.target_context.with_aot_codegen(name, cpu_name=...)``: a target context whose
  code library (``AOTCodeLibrary``) emits position-independent object code;
- ``compile_extra(typingctx, targetctx, func, args, return_type, flags, locals, library)`` with
  ``Flags`` ``no_compile``, ``no_cpython_wrapper``, ``no_cfunc_wrapper`` and ``nrt``: the
  function and every function it calls (their IR linked into the library) without Python
  wrappers;
- ``nrtdynmod.create_nrt_module``: NRT's inline helpers (``NRT_incref``/``NRT_decref``,
  ``NRT_MemInfo_data_fast``) as IR; the rest of NRT is provided in C by ``pdjit.aot.csource``;
- the compiled function keeps Numba's internal calling convention: ``int32 status =
  fn(<ret>* ret, void **excinfo, args...)``, status 0 on success; it is renamed to the symbol
  asked for and every other function of the object is hidden.
"""
from __future__ import annotations

import contextlib

import numba
from numba.core import types

from pdjit.codegen.diskcache import link_called_kernels

_SCALARS = {"int64": types.int64, "int32": types.int32}


class InternalsMoved(RuntimeError):
    """The Numba internals this route relies on are not where they were (another version)."""


def _internals():
    try:
        from llvmlite.binding import Linkage
        from numba.core.compiler import Flags, compile_extra
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target
        from numba.core.runtime import nrtdynmod
    except ImportError as e:  # pragma: no cover - depends on the installed Numba
        raise InternalsMoved(f"pdjit.aot: Numba {numba.__version__}'s ahead-of-time internals "
                             f"moved ({e}); pdjit.aot was written for Numba 0.68") from e
    for obj, attr in ((cpu_target.target_context, "with_aot_codegen"),
                      (nrtdynmod, "create_nrt_module")):
        if not hasattr(obj, attr):
            raise InternalsMoved(f"pdjit.aot: Numba {numba.__version__} has no {attr} on "
                                 f"{type(obj).__name__}; pdjit.aot was written for Numba 0.68")
    return Flags, compile_extra, global_compiler_lock, cpu_target, nrtdynmod, Linkage


def pointer(dtype) -> types.Type:
    """The Numba type of a pointer to ``dtype``'s elements."""
    import numpy as np

    return types.CPointer(numba.from_dtype(np.dtype(dtype)))


def compile_object(func, argtypes, symbol: str, cpu: str = "host", scope=None) -> tuple:
    """``(object code, llvm IR text)`` of ``func`` (a plain Python function whose globals hold
    the Numba dispatchers it calls) compiled for ``argtypes``, returning ``int32``, exported as
    ``symbol`` with Numba's internal calling convention. ``cpu``: ``host`` or ``generic``;
    ``scope``: given the code generator, the context manager its compile runs under (a
    target's ``llvm_scope``: LLVM's passes at the target's level; None: Numba's)."""
    if cpu not in ("host", "generic"):
        raise ValueError(f"pdjit.aot: cpu must be 'host' or 'generic', got {cpu!r}")
    Flags, compile_extra, lock, cpu_target, nrtdynmod, Linkage = _internals()
    ctx = cpu_target.target_context.with_aot_codegen(symbol, cpu_name=cpu)
    codegen = ctx.codegen()
    if type(codegen).__name__ != "AOTCPUCodegen":
        raise InternalsMoved(f"pdjit.aot: with_aot_codegen gave {type(codegen).__name__}, "
                             "expected AOTCPUCodegen")
    flags = Flags()
    flags.no_compile = True
    flags.no_cpython_wrapper = True
    flags.no_cfunc_wrapper = True
    flags.nrt = True
    with lock, (contextlib.nullcontext() if scope is None else scope(codegen)):
        library = codegen.create_library(symbol)
        nrt_module, _ = nrtdynmod.create_nrt_module(ctx)
        library.add_ir_module(nrt_module)
        cres = compile_extra(cpu_target.typing_context, ctx, func, tuple(argtypes),
                             types.int32, flags, locals={}, library=library)
        llvm_func = cres.library.get_function(cres.fndesc.llvm_func_name)
        llvm_func.name = symbol
        link_called_kernels(library, ctx)
        for fn in library._final_module.functions:
            if fn.name.startswith("__excinfo_unwrap_args"):
                fn.linkage = "linkonce_odr"
        library.finalize()
        for fn in library.get_defined_functions():
            if fn.name == symbol:
                continue
            if fn.linkage in (Linkage.private, Linkage.internal):
                fn.visibility = "default"
            else:
                fn.visibility = "hidden"
        obj = library.emit_native_object()
        ir = str(library._final_module)
    return obj, ir
