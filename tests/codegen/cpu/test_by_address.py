"""A library kernel declared ``by_address`` (``cpu.lib._jit``) is called through a symbol of
its own from pdjit's compiles instead of being linked into each caller: the caller's code
holds a call and no copy of the kernel, gives the values NumPy gives, raises the kernel's
errors, is kept on disk with the symbols it needs and loads in a fresh process before the
kernel was compiled there; a user's Numba function and an ahead-of-time library link the
kernel as Numba does. The kernels are written to a module of the test's own (its disk cache
beside it, as a generated kernel's)."""
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from pdjit.codegen import diskcache
from pdjit.codegen.cpu.lib._jit import kernel_symbol

MODULE = textwrap.dedent('''
    import numba
    import numpy as np

    from pdjit.codegen.cpu.lib._jit import OPTIONS, PdjitCompiler, by_address
    from pdjit.codegen.diskcache import cached

    kernel = cached(numba.njit(**OPTIONS, pipeline_class=PdjitCompiler))


    @by_address
    @kernel
    def scaled(x, s, out):
        if x.shape != out.shape:
            raise ValueError("scaled: x and out differ in shape")
        for i in range(x.size):
            out[i] = x[i] * s


    @kernel
    def caller(x, out):
        scaled(x, 2.0, out)
        scaled(out, 3.0, out)
        return out.sum()


    def aot_entry(x, out):
        caller(x, out)
        return 0
''')


@pytest.fixture
def mod(tmp_path, monkeypatch):
    name = f"byaddr_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    yield module
    sys.modules.pop(name, None)


def _linked(library) -> set:
    found, todo = set(), list(library._linking_libraries)
    while todo:
        lib = todo.pop()
        if lib.name not in found:
            found.add(lib.name)
            todo += lib._linking_libraries
    return found


def test_a_pdjit_compile_calls_the_kernel_by_its_symbol(mod):
    x = np.arange(7, dtype=np.float64) - 2.5
    out = np.empty_like(x)
    assert mod.caller(x, out) == pytest.approx(float(np.sum(x * 6.0)))
    np.testing.assert_array_equal(out, x * 2.0 * 3.0)
    sig = next(iter(mod.caller.overloads))
    library = mod.caller.overloads[sig].library
    callee = next(iter(mod.scaled.overloads.values()))
    symbol = kernel_symbol(mod.scaled, callee.signature.args)
    assert list(diskcache.needs_of(library)) == [symbol]
    assert callee.library.name not in _linked(library)  # no copy of the kernel
    ir = mod.caller.inspect_llvm(sig)
    assert f"declare i32 @{symbol}(" in ir
    assert callee.fndesc.llvm_func_name not in ir
    with pytest.raises(ValueError, match="scaled: x and out differ in shape"):
        mod.caller(x, np.empty(3))


def test_a_users_function_links_the_kernel(mod):
    scaled = mod.scaled

    @numba.njit
    def users(x, out):
        scaled(x, 0.5, out)

    x = np.linspace(-1, 1, 5)
    out = np.empty_like(x)
    users(x, out)
    np.testing.assert_array_equal(out, x * 0.5)
    library = users.overloads[next(iter(users.overloads))].library
    assert diskcache.needs_of(library) == {}
    assert next(iter(scaled.overloads.values())).library.name in _linked(library)


def test_a_caller_loads_from_disk_in_a_process_that_compiled_nothing(mod, tmp_path):
    x = np.arange(5, dtype=np.float64)
    mod.caller(x, np.empty_like(x))  # compiled here, saved beside the module
    script = textwrap.dedent(f'''
        import sys
        import numpy as np
        sys.path.insert(0, {str(tmp_path)!r})
        import {mod.__name__} as m
        x = np.arange(5, dtype=np.float64)
        out = np.empty_like(x)
        total = m.caller(x, out)
        hits = sum(m.caller.stats.cache_hits.values())
        misses = sum(m.caller.stats.cache_misses.values())
        print(total, list(out), hits, misses, sum(m.scaled.stats.cache_hits.values()))
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    total, rest = done.stdout.split(" ", 1)
    assert float(total) == float(np.sum(x * 6.0))
    assert rest.split("]")[1].split() == ["1", "0", "1"]  # caller and kernel both loaded


def test_an_entry_whose_symbols_cannot_be_defined_is_a_miss(mod):
    x = np.arange(3, dtype=np.float64)
    mod.caller(x, np.empty_like(x))
    sig = next(iter(mod.caller.overloads))
    impl = mod.caller._cache._impl
    data, needs = impl.reduce(mod.caller.overloads[sig])
    assert [how[:2] for _, how in needs] == [(mod.__name__, "scaled")]
    bogus = ((needs[0][0] + "0", (mod.__name__, "no_such_kernel", ())),)
    assert impl.rebuild(mod.caller.targetctx, (data, bogus)) is None
    assert impl.rebuild(mod.caller.targetctx, data) is None  # (an entry of another layout)


def test_an_ahead_of_time_object_holds_the_kernel(mod):
    from numba.core import types

    from pdjit.codegen.aot.numba_aot import compile_object

    arr = types.Array(types.float64, 1, "C")
    obj, ir = compile_object(mod.aot_entry, (arr, arr), "pdjit_test_entry")
    assert obj
    symbols = [line for line in ir.splitlines() if "@pdjit.kernel." in line and
               line.startswith(("declare", "define"))]
    assert len(symbols) == 1 and symbols[0].startswith("define"), symbols
