"""A pdjit compile runs two of Numba's front-end passes (closure-like inlining, post-inference
rewrites) only where they can change the function (nnlib._jit). Observed by counting the
passes' runs (Numba's own pass classes, spied on); values checked against NumPy."""
from functools import reduce

import numba
import numpy as np
import pytest
from numba.core import typed_passes, untyped_passes
from numba.core.rewrites import rewrite_registry

from pdjit.codegen.cpu.lib import _jit


@pytest.fixture
def runs(monkeypatch):
    """Runs of Numba's InlineClosureLikes ("closures") and NopythonRewrites ("rewrites") on
    the functions named ``_...`` in this file while the test runs (not on what they compile
    nested, such as NumPy's implementations)."""
    numba.njit(lambda: 1)()
    seen = []
    for name, cls in (("closures", untyped_passes.InlineClosureLikes),
                      ("rewrites", typed_passes.NopythonRewrites)):
        def spy(self, state, _original=cls.run_pass, _name=name):
            if state.func_id.func_name in _MINE:
                seen.append(_name)
            return _original(self, state)

        monkeypatch.setattr(cls, "run_pass", spy)

    def take():
        got = sorted(seen)
        seen.clear()
        return got

    return take


_MINE = {"_loop", "_arrayexpr", "_closure", "_const_list", "_reduce", "_ploop"}


def _pdjit(fn):
    return numba.njit(pipeline_class=_jit.PdjitCompiler)(fn)


def _loop(a, out):
    for i in range(a.size):
        out[i] = a[i] * 2.0 + 1.0


def test_plain_kernel_skips_both_passes_user_code_keeps_them(runs):
    a = np.linspace(-1.0, 1.0, 7)
    out = np.empty_like(a)
    _pdjit(_loop)(a, out)
    np.testing.assert_allclose(out, a * 2.0 + 1.0)
    assert runs() == []
    numba.njit(_loop)(a, out)  # a user's function: Numba's pipeline as it is
    assert runs() == ["closures", "rewrites"]


def _arrayexpr(a, b, out):
    out[:] = a * b + 1.0


def _closure(a):
    def scale(v):
        return v * 3.0

    s = 0.0
    for i in range(a.size):
        s += scale(a[i])
    return s


def _const_list():
    return np.array([1.0, 2.5, 4.0])


def _reduce(a):
    return reduce(lambda x, y: x + y, a, 0.0)


def test_passes_run_where_they_apply(runs):
    a, b = np.arange(5.0), np.linspace(0.5, 2.5, 5)
    out = np.empty_like(a)
    _pdjit(_arrayexpr)(a, b, out)  # an array expression: the rewrites fuse it into one loop
    np.testing.assert_allclose(out, a * b + 1.0)
    assert runs() == ["rewrites"]
    assert _pdjit(_closure)(a) == pytest.approx(3.0 * a.sum())  # a closure: inlined
    assert runs() == ["closures"]
    np.testing.assert_allclose(_pdjit(_const_list)(), [1.0, 2.5, 4.0])  # a constant list
    assert runs() == ["closures", "rewrites"]
    assert _pdjit(_reduce)(a) == pytest.approx(a.sum())  # reduce (and its lambda): inlined
    assert runs() == ["closures"]


def test_numba_rewrites_are_the_known_ones():
    # Numba's internal this relies on: the post-inference rewrites registered, and which of
    # them _rewrites_may_apply can ask through their match (a new one would make the pass run
    # always in pdjit compiles: correct, but the saving gone)
    assert set(rewrite_registry.rewrites["after-inference"]) <= set(_jit._known_rewrites())
    assert untyped_passes.InlineClosureLikes in _jit._LEANER
    assert typed_passes.NopythonRewrites in _jit._LEANER


def _ploop(a, out):
    for i in numba.prange(a.size):
        out[i] = a[i] - 0.5


def test_parallel_kernel_keeps_numbas_pipeline(runs):
    a = np.linspace(0.0, 1.0, 9)
    out = np.empty_like(a)
    numba.njit(parallel=True, pipeline_class=_jit.PdjitCompiler)(_ploop)(a, out)
    np.testing.assert_allclose(out, a - 0.5)
    assert runs() == ["closures", "rewrites"]
