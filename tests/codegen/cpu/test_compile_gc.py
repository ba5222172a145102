"""Python's cyclic garbage collector is paused for the length of an outermost pdjit compile
(nnlib._jit.PdjitCompiler) and resumed after, whatever the compile's outcome; a collector the
user turned off stays off, user functions compile with it as it is. Observed where Numba's
compiler runs a function's pipeline (``CompilerBase._compile_core``); values against NumPy."""
import gc

import numba
import numpy as np
import pytest
from numba.core import compiler, errors

from pdjit.codegen.cpu.lib import _jit


@pytest.fixture
def collector(monkeypatch):
    """Whether the collector was on when Numba compiled each function named ``_...`` here."""
    seen = {}
    original = compiler.CompilerBase._compile_core

    def spy(self):
        name = self.state.func_id.func_name
        if name.startswith("_"):
            seen[name] = gc.isenabled()
        return original(self)

    monkeypatch.setattr(compiler.CompilerBase, "_compile_core", spy)
    was = gc.isenabled()
    gc.enable()
    yield seen
    if not was:
        gc.disable()


def _inner(a):
    return a.sum() * 2.0


def _outer(a):
    return _inner_k(a) + 1.0


_inner_k = numba.njit(pipeline_class=_jit.PdjitCompiler)(_inner)


def test_paused_during_pdjit_compile_nested_included(collector):
    a = np.arange(6.0)
    assert numba.njit(pipeline_class=_jit.PdjitCompiler)(_outer)(a) == pytest.approx(
        a.sum() * 2.0 + 1.0)
    assert collector == {"_outer": False, "_inner": False}
    assert gc.isenabled()


def _user(a):
    return a.max() - 1.0


def test_user_functions_compile_with_the_collector_as_it_is(collector):
    a = np.linspace(0.0, 3.0, 4)
    assert numba.njit(_user)(a) == pytest.approx(2.0)
    assert collector == {"_user": True}
    assert gc.isenabled()


def _bad(a):
    return a.no_such_attribute


def test_resumed_after_a_failed_compile(collector):
    with pytest.raises(errors.TypingError, match="no_such_attribute"):
        numba.njit(pipeline_class=_jit.PdjitCompiler)(_bad)(np.zeros(2))
    assert collector == {"_bad": False}
    assert gc.isenabled()


def _scaled(a):
    return a.sum() * 3.0


def test_collector_turned_off_by_the_user_stays_off(collector):
    gc.disable()
    a = np.arange(3.0)
    assert numba.njit(pipeline_class=_jit.PdjitCompiler)(_scaled)(a) == pytest.approx(9.0)
    assert collector == {"_scaled": False}
    assert not gc.isenabled()
