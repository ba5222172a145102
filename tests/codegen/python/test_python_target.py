"""The ``python`` target: a third target made of one folder (``codegen/python/``) and one
registry line, running the same kernel descriptions as the CPU through the shared sequential
loops, call sites and host driver, interpreted by Python. Checked against NumPy written here."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.target import BUILTIN, get_target
from pdjit.framework.errors import ReferenceStepWarning
from pdjit.runtime.place import Place
from pdjit.runtime.plan import NativeStep, ReferenceStep


class PythonPlace(Place):
    kind = "python"

    def __repr__(self):
        return "PythonPlace()"


def _steps(exe, cls):
    return [s for _, plan in exe._plans.values() for s in plan.walk() if isinstance(s, cls)]


def test_the_python_target_runs_the_kernels_of_the_cpu_target_interpreted():
    target = get_target("python")
    assert BUILTIN["python"] == "pdjit.codegen.python.target"
    assert (target.name, target.native_drivers, target.parallel_variants, target.device) == \
        ("python", False, False, False)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [-1, 3, 4], append_batch_size=False)
        b = fluid.layers.data("b", [4], append_batch_size=False)
        y = fluid.layers.tanh(fluid.layers.relu(x * 2.0 + 1.0) + b)    # a row leaf
        s = fluid.layers.reduce_sum(y, dim=1)                            # a reduction
        m = fluid.layers.reduce_mean(fluid.layers.sigmoid(x))            # into one value
        p = fluid.layers.softmax(x)                                      # opaque: reference
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 3, 4)).astype(np.float32)
    B = np.linspace(-1, 1, 4).astype(np.float32)
    fetch = [y, s, m, p]
    exe = fluid.Executor(PythonPlace())
    with pytest.warns(ReferenceStepWarning, match="softmax.*no lowering for target python"):
        got = exe.run(main, feed={"x": X, "b": B}, fetch_list=fetch, scope=fluid.Scope())

    ref_y = np.tanh(np.maximum(X * np.float32(2) + np.float32(1), 0) + B)
    e = np.exp(X - X.max(-1, keepdims=True))
    want = [ref_y, ref_y.sum(1), (1 / (1 + np.exp(-X.astype(np.float64)))).mean(),
            e / e.sum(-1, keepdims=True)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)
        assert g.dtype == np.float32

    kernels = [k for st in _steps(exe, NativeStep) for k in st.compiled.kernels]
    assert len(kernels) >= 2 and all(st.fallbacks == 0 for st in _steps(exe, NativeStep))
    for k in kernels:  # plain Python functions, in modules of this target
        assert "target python" in k.text and "numba" not in k.text
        assert not hasattr(k.fn, "signatures")
    refs = [st.op.type for st in _steps(exe, ReferenceStep)]
    assert refs == ["softmax"]  # its lowering is written for other targets only
    assert "target python" in exe.explain(main, feed={"x": X, "b": B}, fetch_list=fetch)
