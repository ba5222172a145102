"""The decorators of the library kernels (Numba's options as generated kernels use them), the
compile jobs they declare, and the one BLAS product they call in compiled code
(:func:`blas_gemm`: here, so that every kernel module can import it without a cycle)."""
import contextlib
import copy
import functools
import gc
import threading
import weakref
from types import MethodType

import numba
from numba.core import (
    cgutils,
    compiler,
    errors,
    ir,
    targetconfig,
    typed_passes,
    types,
    untyped_passes,
)
from numba.core import codegen as numba_codegen
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.extending import intrinsic, overload, register_jitable
from numba.np import arrayobj as numba_arrayobj

from pdjit.codegen.diskcache import cached

# ---- LLVM optimisation level of pdjit's compiled code -------------------------------------------
# Numba optimises every function with LLVM at ``numba.config.OPT`` (3 unless the user set
# NUMBA_OPT), for the whole process. pdjit's code, the generated kernels and these library
# kernels, is compiled at a level of its own (:data:`OPT_LEVEL`) without touching the user's
# setting: its functions compile through :class:`PdjitCompiler`, which sets the level on this
# thread for the length of its compile, and the CPU codegen's pass builders read it there
# (nothing set: Numba's level). What a pdjit compile compiles in (NumPy overloads such as
# ``np.empty``, a ``prange`` loop's body, the library kernels that a generated kernel calls,
# each compiling with its own level) is pdjit's code too; a user's function that calls a
# library kernel keeps its level (the kernel is re-optimised inside it at the user's level).
# The level only changes LLVM's IR passes (the module pipeline); instruction selection stays at
# Numba's. A kernel whose speed needs O3 (a loop LLVM must vectorise itself) declares it with
# :data:`jit_o3`. Numba's disk cache does not key its entries by the level: a changed
# :data:`OPT_LEVEL` only applies to what is compiled anew (fresh caches to measure it).
#
# Below O3, a pdjit compile also skips Numba's per-function LLVM passes on the wrappers of its
# functions: Numba runs LLVM's function simplification pipeline on every function of every IR
# module it adds (a function's body; its CPython wrapper and, for a nested helper, its C
# wrapper, each a module of its own), then the module pipeline over the linked final module,
# which simplifies each function again. For a wrapper (argument unboxing around one call) the
# first round is repeated work: measured on the serial cold first step of bench_cnn's ResNet,
# those passes cost 0.16 of the 0.66 s of function passes, the LLVM total went 3.43 -> 3.32 s,
# the step's CPU time and LeNet's call time unchanged within noise (1%). Skipping the bodies'
# round too saved ~0.5 s of LLVM but made the step's CPU time 5% longer (LLVM's O1 module
# pipeline alone leaves code slower than two rounds of simplification): not done. An O3 kernel
# keeps all of them. Numba's internals this relies on (``CPUCodeLibrary._optimize_functions``
# per added module, the wrappers' symbol names) are pinned by tests/codegen/cpu/test_opt_level.py.
#
# A pdjit compile also emits no machine code for a library that has no CPython entry point (a
# helper compiled nested: a ``register_jitable`` function, a NumPy overload, a math function, a
# kernel without a CPython wrapper) until something asks for it. Numba finalizes every compiled
# function's library at once, which adds its module to the JIT engine and so has LLVM emit its
# machine code; but a helper's code only ever runs as the copy of its IR linked into each
# caller (the caller's machine code holds it), and a helper has no Python entry point to call.
# Its library is finalized (the module passes its callers link) without joining the
# engine; it joins it, and its code is emitted, at the first request for an address it defines
# (a C wrapper's) or for its object code (to cache it on disk). Measured on the small CNN's
# cold first training step (serial, fresh caches, load 12-25): machine code 1.03 -> 0.81 s
# of CPU, the step 7.0 -> 6.7 s; the code that runs is the same. Numba's internals this relies on
# (``CPUCodeLibrary._finalize_final_module``, ``get_pointer_to_function``,
# ``_get_compiled_object``, the codegen's ``set_env``) are pinned by test_opt_level.py.


#: LLVM optimisation level of pdjit's compiled code, chosen by measurement: on the cold first
#: step of bench_cnn's ResNet, serial, O1 spends ~15% less time in LLVM than O3 (7.3 -> 6.2 s;
#: machine code, at Numba's level, unchanged) with the step's CPU time and a LeNet forward's
#: unchanged within noise; O0 made that step ~25x slower. A kernel that gains from O3 declares
#: it (:data:`jit_o3`).
OPT_LEVEL = 1
_scope = threading.local()


def current_opt_level():
    """The LLVM level the pdjit compile running on this thread asked for, or ``None`` (Numba's
    own ``config.OPT`` applies)."""
    return getattr(_scope, "level", None)


def _scoped_pass_builder(original):
    def pass_builder(**kwargs):
        level = getattr(_scope, "level", None)
        if level is not None and "opt" not in kwargs:  # Numba's explicit levels stay
            kwargs["opt"] = level
        return original(**kwargs)

    pass_builder.pdjit_scoped = True
    return pass_builder


def function_passes_on() -> bool:
    """Whether a wrapper's IR module added on this thread now gets Numba's per-function LLVM
    passes (outside a pdjit compile, or in one at O3: yes; a body's module always does)."""
    return getattr(_scope, "function_passes", True)


def _wrappers_only(ll_module) -> bool:
    """Whether every function ``ll_module`` defines is a wrapper Numba made for a compiled
    function (its CPython or C entry point: names ``_ZN7cpython...``, ``cfunc....``)."""
    defined = [f.name for f in ll_module.functions if not f.is_declaration]
    return bool(defined) and all(n.startswith(("_ZN7cpython", "cfunc.")) for n in defined)


def _scoped_optimize_functions(library, ll_module):
    if function_passes_on() or not _wrappers_only(ll_module):
        return type(library)._optimize_functions(library, ll_module)
    # what Numba's pass does first, for the module passes later
    ll_module.data_layout = library._codegen._data_layout
    return None


#: env global name -> the deferred library that defines it (see :func:`_defer_emission`)
_deferred_envs = weakref.WeakValueDictionary()


def _may_defer(library) -> bool:
    """Whether ``library`` holds compiled IR (not machine code loaded from a cache: its final
    module is then empty) and no CPython wrapper (no function Python calls)."""
    defined = [f.name for f in library._final_module.functions if not f.is_declaration]
    return bool(defined) and getattr(library, "_compiled_object", None) is None and \
        not any(n.startswith("_ZN7cpython") for n in defined)


def _deferred_finalize_final_module(library):
    """Numba's ``_finalize_final_module``; for a library :func:`_may_defer` takes, the same
    minus joining the JIT engine (no machine code emitted yet)."""
    if not _may_defer(library):
        return type(library)._finalize_final_module(library)
    library._finalize_dynamic_globals()
    library._verify_declare_only_symbols()
    # (Numba's object cache finds the library of a module it emits through this attribute)
    library._final_module._CPUCodeLibrary__library = weakref.proxy(library)
    library._finalized = True
    library._pdjit_deferred = {}  # env name -> env, set on the engine once it joins
    for gv in library._final_module.global_variables:
        if gv.name.startswith("_ZN08NumbaEnv"):
            _deferred_envs[gv.name] = library
    return None


def _emit_deferred(library) -> None:
    """Add a deferred library's module to the JIT engine and emit its machine code (what
    Numba's finalization does at once), then set the environments it was given."""
    envs = getattr(library, "_pdjit_deferred", None)
    if envs is None:
        return
    library._pdjit_deferred = None
    codegen = library._codegen
    cleanup = codegen._add_module(library._final_module)
    if cleanup:
        weakref.finalize(library, cleanup)
    library._finalize_specific()
    for name, env in envs.items():
        _deferred_envs.pop(name, None)
        type(codegen).set_env(codegen, name, env)


def _deferred_get_pointer_to_function(library, name):
    if getattr(library, "_pdjit_deferred", None) is not None:
        if not any(f.name == name for f in library._final_module.functions
                   if not f.is_declaration):
            return 0  # (what Numba answers for a name the library does not define)
        _emit_deferred(library)
    return type(library).get_pointer_to_function(library, name)


def _deferred_get_compiled_object(library):
    _emit_deferred(library)
    return type(library)._get_compiled_object(library)


def _scoped_set_env(original):
    def set_env(env_name, env):
        library = _deferred_envs.get(env_name)
        if library is not None and getattr(library, "_pdjit_deferred", None) is not None:
            library._pdjit_deferred[env_name] = env  # set when its module joins the engine
            return None
        _deferred_envs.pop(env_name, None)
        return original(env_name, env)

    set_env.pdjit_scoped = True
    return set_env


def _defer_emission(library) -> None:
    """Have ``library`` (created in a pdjit compile) emit machine code only when asked for it,
    if it has no CPython entry point (see the comment above)."""
    if isinstance(library, numba_codegen.JITCodeLibrary):  # (not an ahead-of-time one)
        library._finalize_final_module = MethodType(_deferred_finalize_final_module, library)
        library.get_pointer_to_function = MethodType(_deferred_get_pointer_to_function, library)
        library._get_compiled_object = MethodType(_deferred_get_compiled_object, library)


# ---- the vector width of pdjit's loops ----------------------------------------------------------
# LLVM's loop vectoriser uses 256-bit vectors on Intel's AVX-512 cores unless a function asks
# for more (their tuning prefers 256 bits: the first AVX-512 server cores lowered their clock
# under 512-bit code). pdjit's own functions ask for 512 (``"prefer-vector-width"="512"``) on a
# CPU with AVX-512 other than those first cores (:data:`NARROW_CPUS`; Numba's CPU name, as the
# user may set it, decides): measured on a Sapphire Rapids class Xeon, one thread, a loop of
# the exact gelu (``mathfuncs.erfc``) over 512 x 1024 float32 values 0.60 -> 0.43 ms, a
# bias + relu loop memory bound either way (0.14 ms). The explicit vectors of the library's
# tiles (:mod:`.tile`) are 512-bit already; other compiles in the process keep LLVM's choice.
#: LLVM's names of the AVX-512 cores whose clock drops under 512-bit code
NARROW_CPUS = frozenset({"skylake-avx512", "cascadelake", "cooperlake", "knl", "knm"})
_WIDE_ATTR = '"prefer-vector-width"="512"'


def target_cpu() -> tuple:
    """``(name, features)`` of the CPU Numba compiles for, as LLVM writes them
    (``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` where set, as Numba's code generator reads
    them, else the host's; ``"generic"`` and ``""`` where LLVM knows none)."""
    import llvmlite.binding as ll
    from numba.core import config

    name, features = config.CPU_NAME, config.CPU_FEATURES
    try:
        name = name or ll.get_host_cpu_name()
    except RuntimeError:
        name = "generic"
    try:
        features = features if features is not None else \
            ll.get_host_cpu_features().flatten()
    except RuntimeError:  # (LLVM knows no features of this host)
        features = ""
    return name, features


@functools.cache
def wide_vectors() -> bool:
    """Whether pdjit's functions ask LLVM for 512-bit loop vectors (see above)."""
    name, features = target_cpu()
    return "+avx512f" in features.split(",") and name not in NARROW_CPUS and name != "generic"


def _wide_add_ir_module(library, ir_module):
    """Numba's ``add_ir_module``, each function ``ir_module`` defines marked with
    :data:`_WIDE_ATTR` (a string attribute, which llvmlite's attribute set does not list)."""
    for fn in ir_module.functions:
        if fn.blocks:
            set.add(fn.attributes, _WIDE_ATTR)
    return type(library).add_ir_module(library, ir_module)


def _scoped_create_library(original):
    def create_library(name, **kwargs):
        library = original(name, **kwargs)
        if hasattr(library, "_optimize_functions"):
            library._optimize_functions = MethodType(_scoped_optimize_functions, library)
        if getattr(_scope, "level", None) is not None:
            _defer_emission(library)
            if wide_vectors() and isinstance(library, numba_codegen.CPUCodeLibrary):
                library.add_ir_module = MethodType(_wide_add_ir_module, library)
        return library

    create_library.pdjit_scoped = True
    return create_library


def _scope_pass_builder(codegen) -> None:
    """``codegen``'s pass builder reads the level of the pdjit compile on its thread."""
    builder = getattr(codegen, "_pass_builder", None)
    if builder is not None and not getattr(builder, "pdjit_scoped", False):
        codegen._pass_builder = _scoped_pass_builder(builder)


def _scope_codegen(targetctx) -> None:
    codegen = targetctx.codegen()
    _scope_pass_builder(codegen)
    create = getattr(codegen, "create_library", None)
    if create is not None and not getattr(create, "pdjit_scoped", False):
        codegen.create_library = _scoped_create_library(create)
    set_env = getattr(codegen, "set_env", None)
    if set_env is not None and not getattr(set_env, "pdjit_scoped", False):
        codegen.set_env = _scoped_set_env(set_env)


@contextlib.contextmanager
def llvm_level(codegen, level: int = OPT_LEVEL):
    """LLVM's passes of ``codegen`` at ``level`` on this thread while the block runs, as a pdjit
    compile sets them (its pass builder read through :func:`_scoped_pass_builder`): for a code
    generator no pdjit compile sets up, the ahead-of-time one (``pdjit.codegen.aot.numba_aot``),
    whose module is an entry function with every kernel it calls linked in, optimised at
    Numba's O3 otherwise. Measured against Numba's level by turns (batch 1, warm caches, one
    thread): MobileNetV2's artifact 14.5 -> 12.8 s to build (medians of 6), ResNet-50's 15.9
    -> 13.8 (of 2); the same bits, their runs 0.99-1.03x."""
    _scope_pass_builder(codegen)
    before = getattr(_scope, "level", None)
    _scope.level = level
    try:
        yield
    finally:
        _scope.level = before


# ---- a leaner pass pipeline -----------------------------------------------------------------
# Two of Numba's front-end passes changed nothing in any function of a cold ResNet training
# step: the untyped pass inlining closure-likes (closures, reduce, stencils, ``np.array`` of a
# list built in a loop) and the typed post-inference rewrites (array expressions into one loop,
# string-literal getitem/setitem, ``np.array`` of a constant list). Each re-runs Numba's IR
# post-processing (variable lifetimes) first, whatever it finds. In a pdjit compile (its own
# functions and what they compile nested, such as NumPy's implementations; not a parallel
# one) each runs only where a cheap look at the IR says it can apply. Measured on the serial
# cold first step of bench_cnn's ResNet (fresh caches, 3 runs each): Numba's passes other
# than type inference and lowering 1.60 -> 1.31 s, the step's CPU time unchanged within noise.


def _exprs(func_ir):
    for block in func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign):
                yield stmt.value


def _closure_likes_may_apply(func_ir) -> bool:
    """Whether Numba's ``InlineClosureLikes`` can change ``func_ir``: a ``make_function``
    (closure or lambda), a ``build_list`` (``np.array`` of a list built in a loop), or a
    global naming ``functools.reduce`` or a stencil."""
    for value in _exprs(func_ir):
        if isinstance(value, ir.Expr) and value.op in ("make_function", "build_list"):
            return True
        if isinstance(value, (ir.Global, ir.FreeVar)) and (
                value.value is functools.reduce or type(value.value).__name__ == "StencilFunc"):
            return True
    return False


@functools.cache
def _known_rewrites() -> dict:
    """Numba's post-inference rewrites and how to tell one can apply without running it:
    ``"match"`` (its ``match`` reads the typed IR only) or ``"build_list"`` (it needs the
    lifetimes the pass adds first, and applies only to a list built in place)."""
    from numba.core.inline_closurecall import RewriteArrayOfConsts
    from numba.core.rewrites.static_getitem import (
        RewriteStringLiteralGetitems,
        RewriteStringLiteralSetitems,
    )
    from numba.np.ufunc.array_exprs import RewriteArrayExprs

    return {RewriteArrayExprs: "match", RewriteStringLiteralGetitems: "match",
            RewriteStringLiteralSetitems: "match", RewriteArrayOfConsts: "build_list"}


def _rewrites_may_apply(state) -> bool:
    """Whether Numba's ``NopythonRewrites`` can change the typed IR of ``state`` (a rewrite
    this module does not know: yes)."""
    from numba.core.rewrites import rewrite_registry

    known = _known_rewrites()
    blocks = list(state.func_ir.blocks.values())
    for cls in rewrite_registry.rewrites["after-inference"]:
        how = known.get(cls)
        if how is None:
            return True
        if how == "build_list":
            if any(isinstance(v, ir.Expr) and v.op == "build_list"
                   for v in _exprs(state.func_ir)):
                return True
            continue
        rewrite = cls(state)
        if any(rewrite.match(state.func_ir, b, state.typemap, state.calltypes) for b in blocks):
            return True
    return False


@register_pass(mutates_CFG=True, analysis_only=False)
class InlineClosureLikesWhereAny(FunctionPass):
    """Numba's ``InlineClosureLikes`` where :func:`_closure_likes_may_apply`."""

    _name = "pdjit_inline_closure_likes_where_any"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        if not _closure_likes_may_apply(state.func_ir):
            return False
        return untyped_passes.InlineClosureLikes().run_pass(state)


@register_pass(mutates_CFG=True, analysis_only=False)
class NopythonRewritesWhereAny(FunctionPass):
    """Numba's ``NopythonRewrites`` where :func:`_rewrites_may_apply`."""

    _name = "pdjit_nopython_rewrites_where_any"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        if not _rewrites_may_apply(state):
            return False
        return typed_passes.NopythonRewrites().run_pass(state)


_LEANER = {untyped_passes.InlineClosureLikes: InlineClosureLikesWhereAny,
           typed_passes.NopythonRewrites: NopythonRewritesWhereAny}


def _leaner(pm):
    pm.passes[:] = [(_LEANER.get(p, p), what) for p, what in pm.passes]
    return pm


def _scoped_pipeline(original):
    def define(state, name=None):
        pm = original(state) if name is None else original(state, name)
        if getattr(_scope, "level", None) is None or state.flags.auto_parallel.enabled:
            return pm  # not pdjit's, or a parallel one (its parfor passes as Numba has them)
        return _leaner(pm)

    define.pdjit_scoped = True
    return staticmethod(define)


def _scope_pipelines() -> None:
    """Numba's untyped and typed pipelines, as any compiler builds them on this thread, with
    the two passes above only where they apply while a pdjit compile runs (not otherwise)."""
    builder = compiler.DefaultPassBuilder
    for name in ("define_untyped_pipeline", "define_typed_pipeline"):
        if not getattr(getattr(builder, name), "pdjit_scoped", False):
            setattr(builder, name, _scoped_pipeline(getattr(builder, name)))


_scope_pipelines()


# ---- Numba's compile flags as dictionary keys ---------------------------------------------------
# Type inference looks up every call of an overloaded function (NumPy's implementations, pdjit's
# ``@overload``s, the math functions) in a cache keyed by the compile's flags
# (``numba.core.targetconfig.TargetConfig``), each time the call is resolved (several times per
# call site). Numba hashes flags by the sorted names of their options (a constant of the class)
# and compares two by building a dictionary of every option's value through its property, each
# time: measured on tests/ops/test_elementwise.py (serial, cold cache) 20% of all CPU time went
# to building those dictionaries. Here the hash is computed once per class, and two flags of a
# class are compared by the options set on either (an option set on neither has its default on
# both): the same answers, for every compile of the process (pdjit's or not).


def _flag_hash(self):
    cls = type(self)
    found = _FLAG_HASHES.get(cls)
    if found is None:
        found = _FLAG_HASHES[cls] = hash(tuple(sorted(cls.options)))
    return found


def _fast_flag_equality(original):
    def equal(self, other):
        if type(other) is not type(self):
            return original(self, other)
        mine, theirs = self._values, other._values
        if self is other or mine == theirs:
            return True
        # (an option set on neither side has its default on both; a name that is no option of
        # the class, copied from another kind of flags, is not one of Numba's values either)
        options = type(self).options
        keys = (mine.keys() | theirs.keys()) & options.keys()
        return ({k: mine.get(k, options[k].default) for k in keys} ==
                {k: theirs.get(k, options[k].default) for k in keys})

    equal.pdjit_fast = True
    return equal


_FLAG_HASHES: dict = {}


def _fast_flag_keys() -> None:
    config = targetconfig.TargetConfig
    if not getattr(config.__eq__, "pdjit_fast", False):
        config.__eq__ = _fast_flag_equality(config.__eq__)
        config.__hash__ = _flag_hash


_fast_flag_keys()


# ---- the error of a slice assigned from an array of another shape --------------------------------
# Numba lowers ``a[i:j] = b`` (``b`` an array) with a check of the two shapes whose error, on the
# CPU, formats both shapes into its message (f-strings of ``str(int)`` and ``', '.join``): that
# compiles Numba's string machinery for each rank of the shapes, and every function with such
# an assignment links it and has LLVM optimise and emit it again. Measured on this project's
# 2-vCPU Intel Xeon, one function of one such assignment: 8.3 s for the first in a process
# (1.3 s with the error below), 5.8 s for the first of rank 2 (0.45 s), 0.8-1.7 s for each
# later one (0.3-0.4 s, against 0.2 s for a function with a loop instead); a cold compile of
# the RNN's forward kernel spent a fifth of its time there (profiled). A pdjit compile (its
# nested compiles included) raises the ValueError of Numba's generic target, without the
# shapes (pdjit's kernels check their arrays' shapes before: this error is a kernel's bug);
# the check and the copy are Numba's own. (The shapes as the error's arguments, not formatted,
# failed to box in pdjit's compiled code.) Numba's module global is swapped for the
# length of the outermost pdjit compile only (Numba's global compiler lock is held: no other
# compile runs meanwhile): other code compiled in the process keeps Numba's message. Pinned by
# tests/codegen/cpu/test_opt_level.py.


def _shape_mismatch(src_shapes, index_shape):
    """The trampoline a pdjit compile's slice assignments call on a shape mismatch (compiled
    code only: its overload below)."""
    raise NotImplementedError


@overload(_shape_mismatch)
def _shape_mismatch_impl(src_shapes, index_shape):
    def impl(src_shapes, index_shape):
        raise ValueError("cannot assign slice from input of different size")
    return impl


_numba_shape_mismatch = numba_arrayobj.raise_with_shape_context


# ---- Python's cyclic garbage collector during a compile ------------------------------------------
# A Numba compile allocates a great many small objects (IR, types, llvmlite's IR), enough to
# run CPython's collector hundreds of times, and every tenth young collection or so a full one
# that walks every object of the process (Numba, NumPy, the user's). Measured on the serial cold
# first step of bench_cnn's ResNet: 0.9-1.2 s of ~9.5 s CPU in the collector (0.8-0.9 s of it
# in ~full collections); with the collector paused for the length of each outermost pdjit
# compile (its nested compiles included) and resumed after, 0.3-0.4 s, the process's peak
# memory unchanged (300 MB: what a compile leaves in cycles is collected once it resumes).
# A collector the user turned off stays off.


class PdjitCompiler(compiler.Compiler):
    """Numba's default pipeline, its LLVM passes at :attr:`opt_level` (and Numba's per-function
    passes on wrappers skipped below O3; two front-end passes only where they apply) for the
    length of the compile (on this thread, nested compiles included unless they set their
    own), Python's cyclic garbage collector paused and slice assignments given a cheaper
    shape error (above) while the outermost one runs."""

    opt_level = OPT_LEVEL

    def _compile_core(self):
        _scope_codegen(self.state.targetctx)
        before = getattr(_scope, "level", None), function_passes_on()
        # (outermost: no pdjit compile below it on this thread; a level set by llvm_level, an
        # ahead-of-time entry's, is none: a kernel compiled while it links gets it all)
        outermost = not getattr(_scope, "compiling", False)
        pause = outermost and gc.isenabled()
        _scope.level = self.opt_level
        _scope.function_passes = self.opt_level >= 3
        if pause:
            gc.disable()
        if outermost:
            _scope.compiling = True
            numba_arrayobj.raise_with_shape_context = _shape_mismatch
        try:
            return super()._compile_core()
        finally:
            _scope.level, _scope.function_passes = before
            if outermost:
                _scope.compiling = False
                numba_arrayobj.raise_with_shape_context = _numba_shape_mismatch
            if pause:
                gc.enable()


class PdjitCompilerO3(PdjitCompiler):
    """:class:`PdjitCompiler` at LLVM's O3, for kernels whose loops LLVM must vectorise."""

    opt_level = 3


def _typed_by_value(decorator):
    """``decorator``'s functions, typed by the values of their arguments when compiled code
    calls them, never by a constant's own value: Numba types a constant argument (``1`` or
    ``False`` in a native driver's call, or an argument passed on by an ``overload``) as a
    literal and compiles a specialisation of the callee per value, where the host driver
    (Python calling it: ``int64``, ``bool``, ``float64``) uses the one compiled (or cached)
    for every value. A literal's specialisation compiled the whole kernel again (a GRU's
    recurrence, ~10 s of CPU, in its native driver)."""
    def apply(fn):
        dispatcher = decorator(fn)
        dispatcher.get_call_template = MethodType(_unliteral_call_template, dispatcher)
        return dispatcher
    return apply


def _unliteral_call_template(self, args, kws):
    args = tuple(types.unliteral(a) for a in args)
    kws = {k: types.unliteral(v) for k, v in kws.items()}
    return type(self).get_call_template(self, args, kws)


#: Numba's options of pdjit's kernels: no GIL, NumPy's error model (division by zero gives inf),
#: no C-callable wrapper (Numba compiles one per function for ``cfunc``-style addresses, which
#: pdjit never takes: measured ~0.02 s of compile per function, of ~0.08 s); cached on disk by
#: :func:`cached` (pdjit's own cache, under ``PDJIT_CACHE_DIR``: ``pdjit.codegen.diskcache``)
OPTIONS = dict(nogil=True, error_model="numpy", no_cfunc_wrapper=True)
#: a library kernel: :data:`OPTIONS`, LLVM at :data:`OPT_LEVEL`
jit = _typed_by_value(cached(numba.njit(**OPTIONS, pipeline_class=PdjitCompiler)))
#: the same, with ``numba.prange`` loops on threads
pjit = _typed_by_value(cached(numba.njit(**OPTIONS, parallel=True,
                                          pipeline_class=PdjitCompiler)))
#: :data:`jit` at LLVM's O3 (a kernel that needs LLVM's loop vectoriser)
jit_o3 = _typed_by_value(cached(numba.njit(**OPTIONS, pipeline_class=PdjitCompilerO3)))
#: :data:`jit` with sums that may be reassociated (vectorised: each of several partial sums in
#: vector lanes, added up at the end; at pdjit's level O1 vectorises such a sum as O3 does,
#: measured 1M float32 0.080 vs 0.078 ms): the kernels that sum over a channel, a row, a plane
jit_sum = _typed_by_value(cached(numba.njit(**OPTIONS, fastmath={"reassoc", "contract"},
                                            pipeline_class=PdjitCompiler)))
#: :data:`jit_o3` with a product and the sum after it fused into one multiply-add (LLVM's
#: ``contract``; nothing reassociated: each sum in its written order, the loop vectoriser's
#: body and its remainder alike)
jit_fma = _typed_by_value(cached(numba.njit(**OPTIONS, fastmath={"contract"},
                                            pipeline_class=PdjitCompilerO3)))
#: a function that calls library kernels, compiled as a generated kernel is (:data:`OPTIONS`, LLVM
#: at :data:`OPT_LEVEL`), not cached: the tests' compiled callers (measured, a caller of two
#: pooling kernels: 1.8-2.4 s of CPU to compile against 3.3-3.5 s with ``numba.njit``'s O3)
caller = numba.njit(**OPTIONS, pipeline_class=PdjitCompiler)


# ---- large kernels called by address -----------------------------------------------------------
# Numba links a called function's IR into its caller's library, where LLVM optimises it and
# emits its machine code again: a native segment calling the convolution's kernel re-emits the
# whole kernel (the rnn's forward ~8 s of CPU, the taps kernel ~2.4 s), and so does every
# library kernel calling another (a team loop around its part). A kernel declared with
# :func:`by_address` is instead called through a symbol of its own, published in LLVM's symbol
# table of the process with the address of its compiled code (each signature once, when it is
# compiled or loaded): a pdjit compile calling it compiles the call alone. A caller kept on
# disk records the symbols it needs (``diskcache.needs_of``); loading it compiles or loads
# those kernels first. Code that must hold its callees links them as Numba does: an
# ahead-of-time library (no process to find the symbol in), and any compile that is not
# pdjit's (a user's function, which Numba's own disk cache may keep without the record).
# Declare it on kernels whose work per call dwarfs a call (a layer's loop nest, a team's part),
# and that are large to compile: a call by address is never inlined. Numba's internals this
# relies on (the user-function implementations of ``BaseContext._defns``, keyed by a compiled
# overload's entry point; ``add_linking_libs``; ``declare_function``'s attributes) are pinned
# by tests/codegen/cpu/test_by_address.py.


def by_address(dispatcher):
    """``dispatcher`` (a library kernel of this package), called by address from pdjit's
    compiles (see above)."""
    dispatcher.add_overload = MethodType(_add_overload_by_address, dispatcher)
    return dispatcher


def kernel_symbol(dispatcher, argtypes) -> str:
    """The symbol under which ``dispatcher``'s code for ``argtypes`` is published: the same
    in every process for the same kernel and types."""
    import hashlib

    fn = dispatcher.py_func
    key = f"{fn.__module__}:{fn.__qualname__}:{tuple(argtypes)}"
    return "pdjit.kernel." + hashlib.sha256(key.encode()).hexdigest()[:32]


def _add_overload_by_address(self, cres):
    type(self).add_overload(self, cres)
    if cres.objectmode or not isinstance(cres.library, numba_codegen.JITCodeLibrary):
        return
    import llvmlite.binding as ll
    from numba.core.base import OverloadSelector

    argtypes = tuple(cres.signature.args)
    symbol = kernel_symbol(self, argtypes)
    ll.add_symbol(symbol, cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name))
    impl = _call_by_address(cres, symbol, (self.py_func.__module__, self.py_func.__qualname__,
                                           argtypes))
    chosen = OverloadSelector()
    chosen.append(impl, impl.signature)
    self.targetctx._defns[cres.entry_point] = chosen


def _call_by_address(cres, symbol, how):
    """The implementation of a call of ``cres`` (Numba's ``imputils.user_function``), calling
    ``symbol`` in a pdjit compile for the JIT, else the function linked in."""
    from numba.core.imputils import fix_returning_optional, impl_ret_new_ref

    fndesc, library = cres.fndesc, cres.library
    published = copy.copy(fndesc)  # (declared under the symbol, with the same attributes)
    published.mangled_name = symbol

    def imp(context, builder, sig, args):
        if getattr(context, "aot_mode", False) or getattr(_scope, "level", None) is None:
            fn = context.declare_function(builder.module, fndesc)
            context.add_linking_libs((library,))
        else:
            fn = context.declare_function(builder.module, published)
            vars(context.active_code_library).setdefault("_pdjit_needs", {})[symbol] = how
        status, ret = context.call_conv.call_function(builder, fn, fndesc.restype,
                                                      fndesc.argtypes, args)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        ret = fix_returning_optional(context, builder, sig, status, ret)
        return impl_ret_new_ref(context, builder, fndesc.restype, ret)

    imp.signature = fndesc.argtypes
    imp.libs = ()
    return imp


#: entry point name -> ``jobs(T)``: the compiled functions a call of it runs for float arrays
#: of NumPy type ``T`` and their argument types ((dtype, ndim) per C-contiguous array, ``int``,
#: ``bool``, ``float``); what a new plan's compile worker can compile ahead (a wrong guess
#: only costs the worker's time)
JOBS: dict = {}


def jobs(name: str):
    """Declare the compile jobs of entry point ``name`` (a decorator of ``jobs(T)``)."""
    def register(fn):
        JOBS[name] = fn
        return fn
    return register


#: library kernel (a dispatcher) -> its declared compile time, CPU seconds (:func:`compile_cost`)
COSTS: dict = {}
#: the compile time of a kernel that declares none (the lighter ones measured 0.4-1 s)
DEFAULT_COST = 0.8


def compile_cost(seconds: float, *kernels) -> None:
    """Declare the compile time of the library ``kernels``: the CPU seconds of a cold compile
    of the signature their jobs predict, alone in a fresh process (its helpers included). The
    compile worker balances its groups of jobs by it (``compiler.precompile``)."""
    for k in kernels:
        COSTS[k] = seconds


def cost_of(kernel) -> float:
    """The declared compile time of library ``kernel`` (:func:`compile_cost`)."""
    return COSTS.get(kernel, DEFAULT_COST)


#: the library kernels a program's first plan compiles beside its runs (:func:`compile_beside`)
BESIDE: set = set()


def compile_beside(*kernels) -> None:
    """Declare that every host caller of the library ``kernels`` runs a stand-in while
    ``team.standing_in`` says so (``replay.STAND_INS``): a program's first plan then has a
    worker compile them beside its first runs (``compiler.stand_ins``) instead of before
    them."""
    BESIDE.update(kernels)


# ---- arrays in one buffer ------------------------------------------------------------------------
@register_jitable
def may_share(a, b) -> bool:
    """Whether arrays ``a`` and ``b`` may share memory: their spans (first to last element,
    by their strides) overlap. A kernel whose output may be given the buffer of an input (the
    memory plan's in-place residual: ``conv._taps_range``) takes a path that reads that input
    before it writes over it."""
    if a.size == 0 or b.size == 0:
        return False
    la = ha = a.ctypes.data
    lb = hb = b.ctypes.data
    for i in range(a.ndim):
        d = (a.shape[i] - 1) * a.strides[i]
        la, ha = (la + d, ha) if d < 0 else (la, ha + d)
    for i in range(b.ndim):
        d = (b.shape[i] - 1) * b.strides[i]
        lb, hb = (lb + d, hb) if d < 0 else (lb, hb + d)
    return la < hb + b.itemsize and lb < ha + a.itemsize


# ---- one BLAS product for compiled code ----------------------------------------------------------
# ``np.dot`` in compiled code is a Numba overload compiled anew for every signature it meets
# (layouts, with ``out`` or not, dtype): 0.1-0.4 s each (a vector/matrix dispatch, checks
# compiled as functions of their own, copies of strided operands); a cold ResNet training step
# compiled six. ``blas_gemm`` is one GEMM call written as LLVM IR where it is used, next to
# nothing to compile per signature (measured, three products in one function, float32 or
# float64, fresh process: 0.27 s of compile with np.dot, 0.05 s with blas_gemm).
_INT_MAX = 2 ** 31 - 1  # BLAS takes C ints


def _gemm_fits(a, b, out) -> bool:
    return all(isinstance(t, types.Array) and t.ndim == 2 for t in (a, b, out)) and \
        a.dtype == b.dtype == out.dtype and a.dtype in (types.float32, types.float64) and \
        a.layout in "CF" and b.layout in "CF" and out.layout == "C" and out.mutable


def _gemm_codegen(context, builder, sig, args):
    from numba.np.arrayobj import make_array
    from numba.np.linalg import call_xxdot, call_xxgemm, call_xxgemv, ensure_blas

    ensure_blas()
    aty, bty, oty = sig.args
    a, b, o = (make_array(t)(context, builder, v) for t, v in zip(sig.args, args))
    (m, k), (k2, n), (m2, n2) = (cgutils.unpack_tuple(builder, x.shape) for x in (a, b, o))
    misfit = builder.or_(builder.icmp_signed("!=", k, k2), builder.or_(
        builder.icmp_signed("!=", m, m2), builder.icmp_signed("!=", n, n2)))
    with builder.if_then(misfit, likely=False):
        context.call_conv.return_user_exc(
            builder, ValueError, ("pdjit: blas_gemm: a (m, k) @ b (k, n) does not fit out "
                                  "(m, n)",))
    big = context.get_constant(types.intp, _INT_MAX)
    too_big = builder.or_(builder.icmp_signed(">", m, big), builder.or_(
        builder.icmp_signed(">", n, big), builder.icmp_signed(">", k, big)))
    with builder.if_then(too_big, likely=False):
        context.call_conv.return_user_exc(
            builder, OverflowError, ("pdjit: blas_gemm: a dimension does not fit a C int",))
    zero = context.get_constant(types.intp, 0)
    empty = builder.or_(builder.icmp_signed("==", m, zero), builder.icmp_signed("==", n, zero))
    one = context.get_constant(types.intp, 1)
    with builder.if_else(builder.icmp_signed("==", k, zero), likely=False) as (no_k, some_k):
        with no_k:  # a sum of nothing: zeros
            cgutils.memset(builder, o.data, builder.mul(o.itemsize, o.nitems), 0)
        with some_k, builder.if_then(builder.not_(empty), likely=True):
            # a product with one row or one column is a matrix-vector product (BLAS's gemv
            # or dot are faster there than gemm), as np.dot does
            row, col = builder.icmp_signed("==", m, one), builder.icmp_signed("==", n, one)
            with builder.if_else(col) as (one_col, cols):
                with one_col, builder.if_else(row) as (dot, mv):
                    with dot:
                        call_xxdot(context, builder, False, aty.dtype, k, a.data, b.data,
                                   o.data)
                    with mv:
                        call_xxgemv(context, builder, aty.layout == "C", aty, (m, k), a.data,
                                    b.data, o.data)
                with cols, builder.if_else(row) as (vm, mm):
                    with vm:  # out row = b.T @ a row
                        call_xxgemv(context, builder, bty.layout != "C", bty, (k2, n),
                                    b.data, a.data, o.data)
                    with mm:
                        call_xxgemm(context, builder, aty, (m, k), a.data, bty, (k2, n),
                                    b.data, oty, (m2, n2), o.data)
    return context.get_dummy_value()


@intrinsic
def blas_gemm(typingctx, a, b, out):
    """``out[:, :] = a @ b`` in compiled code (not callable from Python: use ``np.dot``
    there): 2-D float32 or float64 arrays of one dtype, ``a`` and ``b`` C- or F-contiguous
    (``x.T`` of a C-contiguous ``x`` is passed to BLAS transposed, nothing copied), ``out``
    C-contiguous, writable and not overlapping them; one BLAS ``xgemm`` call. Shapes that do
    not fit raise ``ValueError``; other types fail to compile with a message naming them."""
    if not _gemm_fits(a, b, out):
        raise errors.TypingError(
            "pdjit: blas_gemm takes 2-D float32/float64 arrays of one dtype, a and b C- or "
            f"F-contiguous, out C-contiguous and writable; got a {a}, b {b}, out {out}")
    return types.none(a, b, out), _gemm_codegen
