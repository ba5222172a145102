"""pdjit's compiled code gets LLVM passes at pdjit's own level (nnlib._jit.OPT_LEVEL), without
Numba's per-function passes on wrappers below O3, while the user's Numba functions in the same
process keep Numba's ``config.OPT`` and passes. The levels are observed where Numba builds its
LLVM pass pipelines (``numba.core.codegen.create_pass_builder``), the per-function passes where
it runs them on an added module (``CPUCodeLibrary._optimize_functions``); the values are
checked against NumPy."""
import gc
import unittest.mock
import uuid

import numba
import numpy as np
import pytest
from numba.core import codegen as numba_codegen
from numba.core import config

from pdjit.codegen import compiler
from pdjit.codegen.cpu.lib import _jit


@pytest.fixture
def levels(monkeypatch):
    """The LLVM levels of the pass pipelines built while the test runs (Numba's cheap
    pre-inlining pass at level 0 left out)."""
    numba.njit(lambda: 1)()  # Numba's one-time runtime (NRT) compiles before: at its level
    seen = []
    original = numba_codegen.create_pass_builder

    def spy(tm, opt, **kwargs):
        seen.append(int(opt))
        return original(tm, opt, **kwargs)

    monkeypatch.setattr(numba_codegen, "create_pass_builder", spy)

    def take():
        got = {v for v in seen if v != 0}
        seen.clear()
        return got

    return take


def _sum_loop(a):
    s = 0.0
    for i in range(a.size):
        s += a[i] * 2.0
    return s


def test_pdjit_kernels_compile_at_pdjit_level_user_code_at_numba_level(levels):
    assert _jit.OPT_LEVEL != int(config.OPT)  # default 1 against Numba's 3: else nothing shown
    kernel = numba.njit(pipeline_class=_jit.PdjitCompiler)(_sum_loop)
    a = np.arange(7.0)
    assert kernel(a) == pytest.approx(2.0 * a.sum())
    assert levels() == {_jit.OPT_LEVEL}
    assert _jit.current_opt_level() is None  # the scope ended with the compile

    user = numba.njit(lambda a: np.zeros(3) + a.sum())
    np.testing.assert_allclose(user(a), np.full(3, a.sum()))
    assert levels() == {int(config.OPT)}

    # a user's function calling a pdjit kernel keeps its own level (the kernel, compiled
    # nested, at pdjit's)
    kernel2 = numba.njit(pipeline_class=_jit.PdjitCompiler)(lambda a: a.max() * 3.0)
    caller = numba.njit(lambda a: kernel2(a) + 1.0)
    assert caller(a) == pytest.approx(a.max() * 3.0 + 1.0)
    assert levels() == {_jit.OPT_LEVEL, int(config.OPT)}


def test_declared_o3_kernel(levels):
    kernel = numba.njit(pipeline_class=_jit.PdjitCompilerO3)(_sum_loop)
    a = np.linspace(0.0, 1.0, 9)
    assert kernel(a) == pytest.approx(2.0 * a.sum())
    assert levels() == {3}


def test_generated_kernels_use_pdjit_pipeline(levels, tmp_path, monkeypatch):
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path))
    tag = uuid.uuid4().hex[:8]  # a text of its own: compiled here, not found in a cache
    src = (f"def k_{tag}(x, out):\n"
           "    for i in range(x.size):\n"
           "        out[i] = math.exp(x[i]) + 1.0\n")
    text = compiler.module_text(src, f"k_{tag}")
    assert "pipeline_class=_PdjitCompiler" in text and "no_cfunc_wrapper=True" in text
    fn = compiler.compile_function(src, f"k_{tag}").fn
    x = np.linspace(-1.0, 1.0, 5).astype(np.float32)
    out = np.empty_like(x)
    fn(x, out)
    np.testing.assert_allclose(out, np.exp(x) + 1.0, rtol=1e-6)
    assert len(fn.signatures) == 1 and fn.nopython_signatures  # native code ran
    assert levels() == {_jit.OPT_LEVEL}
    # no C-callable wrapper was built for it (pdjit never takes a kernel's address)
    (cres,) = fn.overloads.values()
    names = {f.name for f in cres.library._final_module.functions}
    assert cres.fndesc.llvm_cfunc_wrapper_name not in names
    assert cres.fndesc.llvm_cpython_wrapper_name in names  # callable from Python


@pytest.fixture
def function_passes(monkeypatch):
    """The IR modules Numba ran its per-function passes on while the test ran (in
    ``CPUCodeLibrary.add_llvm_module``): (pdjit level then in force or ``None``, whether the
    module holds only a wrapper) each."""
    numba.njit(lambda: 1)()
    ran = []
    original = numba_codegen.CPUCodeLibrary._optimize_functions

    def spy(self, ll_module):
        ran.append((_jit.current_opt_level(), _jit._wrappers_only(ll_module)))
        return original(self, ll_module)

    monkeypatch.setattr(numba_codegen.CPUCodeLibrary, "_optimize_functions", spy)

    def take():
        got = set(ran)
        ran.clear()
        return got

    return take


def _scale_loop(a, out):
    for i in range(a.size):
        out[i] = a[i] * 3.0 - 1.0


def test_function_passes_skip_wrappers_in_pdjit_compiles_below_o3(function_passes):
    assert _jit.OPT_LEVEL < 3
    a = np.linspace(-2.0, 2.0, 6)
    out = np.empty_like(a)
    kernel = numba.njit(pipeline_class=_jit.PdjitCompiler)(_scale_loop)
    kernel(a, out)
    np.testing.assert_allclose(out, a * 3.0 - 1.0)
    assert function_passes() == {(_jit.OPT_LEVEL, False)}  # the body's module only
    assert _jit.function_passes_on()  # the scope ended with the compile
    # the names _wrappers_only knows a CPython wrapper by
    (cres,) = kernel.overloads.values()
    assert cres.fndesc.llvm_cpython_wrapper_name.startswith("_ZN7cpython")

    numba.njit(_scale_loop)(a, out)  # a user's function: Numba's passes on all its modules
    assert function_passes() == {(None, False), (None, True)}

    numba.njit(pipeline_class=_jit.PdjitCompilerO3)(_scale_loop)(a[::-1].copy(), out)
    np.testing.assert_allclose(out, a[::-1] * 3.0 - 1.0)
    assert function_passes() == {(3, False), (3, True)}  # an O3 kernel keeps them


def test_nested_helper_c_wrapper_skipped(function_passes):
    # a helper compiled nested (register_jitable: an overload) gets a C wrapper module of
    # its own, named cfunc.<body>
    seen = []
    original = numba.core.typed_passes.NativeLowering.run_pass

    def spy(self, state):
        ok = original(self, state)
        if state.func_id.func_name == "_helper":
            seen.append(state.cr.fndesc.llvm_cfunc_wrapper_name)
        return ok

    with unittest.mock.patch.object(numba.core.typed_passes.NativeLowering, "run_pass", spy):
        kernel = numba.njit(pipeline_class=_jit.PdjitCompiler)(lambda a: _helper(a) + 1.0)
        a = np.arange(4.0)
        assert kernel(a) == pytest.approx(a.sum() * 2.0 + 1.0)
    assert seen and all(n.startswith("cfunc.") for n in seen)
    assert all(not wrappers for level, wrappers in function_passes() if level is not None)


@numba.extending.register_jitable
def _helper(a):
    s = 0.0
    for i in range(a.size):
        s += a[i] * 2.0
    return s


def test_user_function_calling_pdjit_kernel_keeps_its_function_passes(function_passes):
    kernel = numba.njit(pipeline_class=_jit.PdjitCompiler)(lambda a: a.sum() * 0.5)
    caller = numba.njit(lambda a: kernel(a) + 2.0)
    a = np.arange(5.0)
    assert caller(a) == pytest.approx(a.sum() * 0.5 + 2.0)
    # the user's function gets them on all its modules; the kernel, compiled nested at
    # pdjit's level, on its body's only
    ran = function_passes()
    assert (None, True) in ran and (_jit.OPT_LEVEL, True) not in ran
    assert (_jit.OPT_LEVEL, False) in ran


@numba.extending.register_jitable
def _helper3(a):
    s = 0.0
    for i in range(a.size):
        s += a[i] * 3.0
    return s


def _twice_plus_one(x):
    return x * 2.0 + 1.0


def test_helpers_emit_machine_code_only_when_asked(monkeypatch):
    """A library compiled in a pdjit compile without a CPython entry point (a nested helper)
    does not join the JIT engine (no machine code) until an address it defines or its object
    code is asked for; the kernel that calls it runs its linked copy; a library with a CPython
    entry point joins at once. Values against NumPy / plain arithmetic."""
    import ctypes

    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    joined = []
    original = codegen._add_module
    monkeypatch.setattr(codegen, "_add_module", lambda m: (joined.append(m), original(m))[1])

    def in_engine(res):
        return any(m is res.library._final_module for m in joined)

    helper = numba.njit(no_cpython_wrapper=True, pipeline_class=_jit.PdjitCompiler)(
        _twice_plus_one)
    kernel = numba.njit(pipeline_class=_jit.PdjitCompiler)(
        lambda a: _helper3(a) + helper(a[0]))
    a = np.arange(1.0, 6.0)
    assert kernel(a) == pytest.approx(3.0 * a.sum() + 2.0 * a[0] + 1.0)
    (kres,) = kernel.overloads.values()
    (hres,) = helper.overloads.values()
    assert in_engine(kres)  # the kernel: machine code at once
    lib = hres.library
    assert not in_engine(hres) and lib._pdjit_deferred is not None
    # the names _may_defer tells a CPython wrapper by, and that the helper has none
    assert kres.fndesc.llvm_cpython_wrapper_name.startswith("_ZN7cpython")
    assert lib.get_pointer_to_function(hres.fndesc.llvm_cpython_wrapper_name) == 0
    assert lib._pdjit_deferred is not None  # (a name it does not define emits nothing)
    # its C wrapper's address: emitted now, and it runs
    addr = lib.get_pointer_to_function(hres.fndesc.llvm_cfunc_wrapper_name)
    assert addr and in_engine(hres) and lib._pdjit_deferred is None
    assert ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(addr)(3.0) == 7.0
    # object code for the disk cache: another helper's library, emitted on that request
    joined.clear()
    helper2 = numba.njit(no_cpython_wrapper=True, pipeline_class=_jit.PdjitCompiler)(
        lambda x: x * 5.0)
    kernel2 = numba.njit(pipeline_class=_jit.PdjitCompiler)(lambda x: helper2(x) - 1.0)
    assert kernel2(2.0) == 9.0
    (h2res,) = helper2.overloads.values()
    assert not in_engine(h2res)
    name, kind, (obj, bitcode) = h2res.library.serialize_using_object_code()
    assert kind == "object" and obj and bitcode
    assert in_engine(h2res)
    # a user's function: Numba's own finalization
    joined.clear()
    user_helper = numba.njit(no_cpython_wrapper=True)(lambda x: x * 7.0)
    assert numba.njit(lambda x: user_helper(x) + 1.0)(1.0) == 8.0
    (ures,) = user_helper.overloads.values()
    assert in_engine(ures)


def test_compile_flags_compare_and_hash_as_numba_defines_them():
    """Numba's flags (``TargetConfig``) are equal where every option's value (the set one, else
    its default) is; pdjit's faster comparison and hash give the same answers."""
    from numba.core.compiler import Flags
    from numba.core.targetconfig import Option, TargetConfig

    assert TargetConfig.__eq__.pdjit_fast

    def values(f):  # Numba's definition, written out here
        return {k: getattr(f, k) for k in type(f).options}

    settings = [{}, {"nrt": True}, {"nrt": False}, {"nrt": True, "boundscheck": False},
                {"boundscheck": True}, {"error_model": "numpy"}, {"error_model": "python"},
                {"fastmath": {"contract"}}, {"fastmath": {"contract", "reassoc"}},
                {"fastmath": False}, {"no_cfunc_wrapper": True, "nrt": True}]
    flags = []
    for s in settings:
        f = Flags()
        for k, v in s.items():
            setattr(f, k, v)
        flags.append(f)

    class Other(TargetConfig):  # another kind of flags, with options of its own
        nrt = Option(type=bool, default=False, doc="")
        extra = Option(type=int, default=0, doc="")

    other = Other()
    other.extra = 5
    flags += [Flags(copy_from=other), Other(), other]  # (a copy holds a name Flags lacks)
    pairs = [(a, b) for a in flags for b in flags]
    assert any(values(a) == values(b) and a._values != b._values for a, b in pairs)
    assert any(values(a) != values(b) for a, b in pairs)
    for a, b in pairs:
        assert (a == b) == (values(a) == values(b)), (a, b)
        if a == b:
            assert hash(a) == hash(b)
    for a in flags:
        assert hash(a) == hash(tuple(sorted(values(a))))
    assert TargetConfig.__eq__(flags[0], object()) is NotImplemented


def _assign_rows(a, b, i):
    a[i:i + 2] = b
    return a


def test_slice_assignments_of_pdjit_code_raise_a_cheap_shape_error_user_code_numbas():
    """A slice assigned from an array: the copy is right in both; on a shape mismatch pdjit's
    compiled code raises the ValueError of Numba's generic target (no string formatting
    compiled in: none of Numba's formatted message is in its LLVM IR), a user's
    function compiled after it keeps Numba's formatted message (the swap of Numba's trampoline
    ended with the compile)."""
    name = f"_assign_rows_{uuid.uuid4().hex}"  # a fresh function: compiled here, not cached
    fn = type(_assign_rows)(_assign_rows.__code__, _assign_rows.__globals__, name)
    kernel = numba.njit(pipeline_class=_jit.PdjitCompiler)(fn)
    a, b = np.zeros((5, 3)), np.arange(6.0).reshape(2, 3)
    want = a.copy()
    want[1:3] = b
    np.testing.assert_array_equal(kernel(a.copy(), b, 1), want)
    with pytest.raises(ValueError) as e:
        kernel(a.copy(), np.ones((3, 3)), 1)
    assert e.value.args == ("cannot assign slice from input of different size",)
    ir = next(iter(kernel.inspect_llvm().values()))
    assert "cannot assign slice from input of different size" in ir
    assert "cannot assign slice of shape" not in ir
    assert numba.np.arrayobj.raise_with_shape_context is _jit._numba_shape_mismatch

    user = numba.njit(type(_assign_rows)(_assign_rows.__code__, _assign_rows.__globals__,
                                         name + "_user"))
    np.testing.assert_array_equal(user(a.copy(), b, 1), want)
    with pytest.raises(ValueError, match=r"cannot assign slice of shape \(2, 3\) from input "
                                         r"of shape \(3, 3\)"):
        user(a.copy(), np.ones((3, 3)), 1)


def test_a_kernel_compiled_under_llvm_level_is_an_outermost_compile():
    """A pdjit kernel compiled while an ahead-of-time entry's level is set (``llvm_level``: a
    kernel its link compiles) gets what any outermost pdjit compile gets: the cheap shape
    error compiled in and the collector paused, both undone after."""
    from numba.core.registry import cpu_target

    name = f"_assign_rows_{uuid.uuid4().hex}"  # a fresh function: compiled here, not cached
    fn = type(_assign_rows)(_assign_rows.__code__, _assign_rows.__globals__, name)
    kernel = numba.njit(pipeline_class=_jit.PdjitCompiler)(fn)
    codegen = cpu_target.target_context.with_aot_codegen("pin_outer", cpu_name="host").codegen()
    a, b = np.zeros((5, 3)), np.arange(6.0).reshape(2, 3)
    collecting = gc.isenabled()
    with _jit.llvm_level(codegen):
        kernel.compile((numba.typeof(a), numba.typeof(b), numba.int64))
    with pytest.raises(ValueError) as e:
        kernel(a.copy(), np.ones((3, 3)), 1)
    assert e.value.args == ("cannot assign slice from input of different size",)
    assert numba.np.arrayobj.raise_with_shape_context is _jit._numba_shape_mismatch
    assert gc.isenabled() == collecting


def _gelu_like_loop(x, out):  # (a float32 loop the vectoriser takes: a math function inlined)
    for i in range(x.size):
        v = x[i]
        out[i] = v * np.float32(0.5) * (np.float32(1) + np.tanh(v * np.float32(0.79)))


@pytest.mark.parametrize("wide", [True, False])
def test_pdjit_functions_ask_for_wide_loop_vectors_user_functions_do_not(monkeypatch, wide):
    """Where ``wide_vectors`` holds, every function a pdjit compile defines carries LLVM's
    ``"prefer-vector-width"="512"`` (Intel's AVX-512 cores otherwise vectorise loops 256 bits
    wide); a user's Numba function never does; the values are the loop's either way."""
    here = _jit.wide_vectors()  # (this machine's own answer)
    monkeypatch.setattr(_jit, "wide_vectors", lambda: wide)
    # (a fresh function each time: Numba's cache of compiled libraries is per function object)
    kernel = numba.njit(pipeline_class=_jit.PdjitCompiler, error_model="numpy")(
        _copy_function(_gelu_like_loop))
    user = numba.njit(error_model="numpy")(_copy_function(_gelu_like_loop))
    x = np.linspace(-4, 4, 1001).astype(np.float32)
    want = (x * 0.5 * (1 + np.tanh(x * np.float32(0.79)))).astype(np.float32)
    for fn in (kernel, user):
        out = np.empty_like(x)
        fn(x, out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    (ir_k,), (ir_u,) = kernel.inspect_llvm().values(), user.inspect_llvm().values()
    assert (_jit._WIDE_ATTR in ir_k) == wide
    assert _jit._WIDE_ATTR not in ir_u
    if wide and here:  # (and the machine code: 512-bit registers)
        (asm,) = kernel.inspect_asm().values()
        assert "zmm" in asm


def _copy_function(fn):
    import types

    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + uuid.uuid4().hex[:8])


@pytest.mark.parametrize("name,features,wide", [
    ("sapphirerapids", "+avx512f,+avx2,+fma", True),
    ("znver4", "+avx2,+avx512f", True),
    ("skylake-avx512", "+avx512f,+avx2", False),   # the first AVX-512 server cores
    ("cascadelake", "+avx512f,+avx2", False),
    ("znver3", "+avx2,+fma,-avx512f", False),       # no AVX-512
    ("generic", "+avx512f", False),                 # a portable build (NUMBA_CPU_NAME=generic)
])
def test_which_cpus_get_wide_loop_vectors(monkeypatch, name, features, wide):
    monkeypatch.setattr(config, "CPU_NAME", name)
    monkeypatch.setattr(config, "CPU_FEATURES", features)
    assert _jit.wide_vectors.__wrapped__() is wide
