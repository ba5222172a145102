"""Visible fallbacks: native code that gives up warns once naming the op and why, strict mode
makes it an error, planned reference steps are named once, and the test kit sees sub-plans."""
import functools
import warnings

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import pipeline as pipeline_mod
from pdjit.custom import define_op
from pdjit.framework.errors import (
    FallbackError,
    FallbackWarning,
    OpRunError,
    ReferenceStepWarning,
)
from pdjit.testing import assert_native

RNG = np.random.default_rng(3)
X34 = RNG.standard_normal((3, 4)).astype(np.float32)
X14 = RNG.standard_normal((1, 4)).astype(np.float32)


def _data(name, shape, dtype="float32"):
    return fluid.layers.data(name=name, shape=shape, dtype=dtype, append_batch_size=False)


def _mul_program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x, y = _data("x", [-1, 4]), _data("y", [-1, 4])
        total = fluid.layers.create_global_var([1], 0.0, "float32", persistable=True,
                                               name="total")
        z = fluid.layers.elementwise_mul(x, y) + 1.0
        fluid.layers.assign(total + fluid.layers.reduce_sum(z), total)
    return main, startup, z


def test_a_fallback_warns_once_naming_the_op_and_the_reason():
    main, startup, z = _mul_program()
    exe, scope = fluid.Executor(strict=False), fluid.Scope()
    exe.run(startup, scope=scope)
    with pytest.warns(FallbackWarning) as caught:
        (got,) = exe.run(main, feed={"x": X34, "y": X14}, fetch_list=[z], scope=scope)
    np.testing.assert_allclose(got, X34 * X14 + 1, rtol=1e-6)  # the references' answer
    (w,) = [w for w in caught if issubclass(w.category, FallbackWarning)]
    text = str(w.message)
    assert "op 'elementwise_mul'" in text and "test_fallbacks.py" in text  # where it was made
    assert "loop form" in text                                            # why it fell back
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)                   # only once
        exe.run(main, feed={"x": X34, "y": X14}, fetch_list=[z], scope=scope)
    (step,) = [s for _, p in exe._plans.values() for s in p.walk()
               if s.kind == "native" and s.fallbacks]
    assert step.fallbacks == 2 and "2 fallback(s)" in step.describe()
    with pytest.raises(AssertionError, match="fell back"):
        assert_native(exe)


def test_strict_mode_makes_a_fallback_an_error_and_keeps_the_scope():
    main, startup, z = _mul_program()
    exe, scope = fluid.Executor(strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": X34, "y": X34}, fetch_list=[z], scope=scope)  # fits: native
    before = scope.find_var("total").value.copy()
    with pytest.raises(FallbackError, match=r"op 'elementwise_mul' .*loop form.*strict") as e:
        exe.run(main, feed={"x": X34, "y": X14}, fetch_list=[z], scope=scope)
    assert e.value.op_type == "elementwise_mul" and e.value.block_idx == 0
    np.testing.assert_array_equal(scope.find_var("total").value, before)  # nothing committed


def test_strict_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("PDJIT_STRICT", "1")
    assert fluid.Executor().strict
    monkeypatch.setenv("PDJIT_STRICT", "0")
    assert not fluid.Executor().strict
    assert fluid.Executor(strict=True).strict


def test_bad_input_in_strict_mode_is_the_ops_own_error_not_a_fallback():
    main, startup, z = _mul_program()
    exe, scope = fluid.Executor(strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    bad = RNG.standard_normal((2, 4)).astype(np.float32)
    with pytest.raises(OpRunError, match="elementwise_mul") as e:
        exe.run(main, feed={"x": X34, "y": bad}, fetch_list=[z], scope=scope)
    assert not isinstance(e.value, FallbackError)


@functools.cache
def _row_sort_layer():
    """An op with a NumPy reference and no emit rule (any built-in op may gain one), defined
    when a test first runs (not at collection: the registry-wide tests list the ops then)."""
    return define_op("test_fallback_sort", reference=lambda X: np.sort(X, axis=-1))


def _row_sort(x):
    return _row_sort_layer()(x)


def test_a_planned_reference_step_is_named_once_and_is_no_fallback(monkeypatch):
    monkeypatch.setattr(pipeline_mod, "_warned", set())
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = _data("x", [-1, 4])
        y = _row_sort(fluid.layers.relu(x)) * 2
    feed = {"x": X34}
    exe = fluid.Executor(strict=True)
    with pytest.warns(ReferenceStepWarning, match="'test_fallback_sort' runs its NumPy "
                                                  "reference"):
        (got,) = exe.run(main, feed=feed, fetch_list=[y], scope=fluid.Scope())
    np.testing.assert_array_equal(got, np.sort(np.maximum(X34, 0), axis=1) * 2)
    assert assert_native(exe) == 2                       # relu before, scale after: native
    kinds = [s.kind for _, p in exe._plans.values() for s in p.walk()]
    assert kinds == ["native", "reference", "native"]
    with warnings.catch_warnings():                      # named once per process
        warnings.simplefilter("error", ReferenceStepWarning)
        other = fluid.Program()
        with fluid.program_guard(other, fluid.Program()):
            _row_sort(_data("x", [-1, 4]))
        fluid.Executor().run(other, feed=feed, fetch_list=[other.global_block().ops[-1]
                                                           .output_arg_names[0]],
                             scope=fluid.Scope())


def test_the_native_check_walks_sub_plans():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x, y = _data("x", [-1, 4]), _data("y", [-1, 4])
        flag = fluid.layers.reduce_sum(x) > fluid.layers.reduce_sum(x) - 1.0   # always true
        out = fluid.layers.cond(flag, lambda: fluid.layers.elementwise_mul(x, y) + 1.0,
                                lambda: x * 0.0)
    exe = fluid.Executor(strict=False)
    (got,) = exe.run(main, feed={"x": X34, "y": X34}, fetch_list=[out], scope=fluid.Scope())
    np.testing.assert_allclose(got, X34 * X34 + 1, rtol=1e-6)
    assert assert_native(exe) >= 2
    with pytest.warns(FallbackWarning, match="elementwise_mul"):
        exe.run(main, feed={"x": X34, "y": X14}, fetch_list=[out], scope=fluid.Scope())
    with pytest.raises(AssertionError, match="fell back"):
        assert_native(exe)   # the fallback happened in the branch's sub-plan
