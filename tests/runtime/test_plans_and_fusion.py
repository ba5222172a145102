"""Plans and fusion at the edges: unrelated [-1, D] values, LoD through reductions, empty
max reductions, pickled programs, executors' own plans, fetches from sub-blocks, float64
kernels compiled ahead."""
import pickle
import warnings

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import pipeline as pipeline_mod
from pdjit.framework.errors import FallbackWarning, OpRunError
from pdjit.testing import assert_native

L = fluid.layers
RNG = np.random.default_rng(21)


def _data(name, shape, dtype="float32", **kw):
    return L.data(name=name, shape=shape, dtype=dtype, append_batch_size=False, **kw)


def test_values_of_equal_build_shapes_but_other_batches_are_not_fused():
    """Tokens and sequences are both [-1, 6]: ops on them go to separate kernels."""
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = L.data("x", shape=[6], dtype="float32", lod_level=1)
        p = L.sequence_pool(x, "sum")
        a, b = L.relu(x), L.scale(p, scale=0.5)
    xv = RNG.standard_normal((5, 6)).astype(np.float32)
    t = fluid.create_lod_tensor(xv, [[2, 3]], fluid.CPUPlace())
    exe = fluid.Executor(strict=True)
    ra, rb = exe.run(main, feed={"x": t}, fetch_list=[a, b], scope=fluid.Scope())
    np.testing.assert_allclose(ra, np.maximum(xv, 0))
    np.testing.assert_allclose(rb, 0.5 * np.stack([xv[:2].sum(0), xv[2:].sum(0)]), rtol=1e-6)
    assert_native(exe)
    assert "reads nothing the open group reads or computes" in exe.explain(
        main, feed={"x": None}, fetch_list=[a, b])


def test_a_lod_does_not_pass_through_a_reduction_of_the_rows():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = L.data("x", shape=[6], dtype="float32", lod_level=1)
        y = L.data("y", shape=[6], dtype="float32", lod_level=1)
        q = L.elementwise_add(L.reduce_sum(x, dim=[0], keep_dim=True), y)
    feed = {"x": fluid.create_lod_tensor(RNG.random((5, 6)).astype(np.float32), [[2, 3]],
                                         fluid.CPUPlace()),
            "y": fluid.create_lod_tensor(RNG.random((3, 6)).astype(np.float32), [[1, 2]],
                                         fluid.CPUPlace())}
    lods = {}
    for mode in ("compiled", "reference"):
        exe = fluid.Executor(mode=mode)
        (r,) = exe.run(main, feed=feed, fetch_list=[q], return_numpy=False, scope=fluid.Scope())
        lods[mode] = r.lod()
    assert lods["compiled"] == lods["reference"] == [[0, 1, 3]]


@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_max_over_an_empty_axis_is_an_error_in_both_modes(mode):
    progs = {}
    for dim in (0, 1):
        main = fluid.Program()
        with fluid.program_guard(main, fluid.Program()):
            progs[dim] = main, L.reduce_max(_data("x", [-1, 3]), dim=[dim])
    exe, feed = fluid.Executor(mode=mode), {"x": np.zeros((0, 3), np.float32)}
    main, y = progs[0]
    with pytest.raises(OpRunError, match="reduce_max"):
        exe.run(main, feed=feed, fetch_list=[y], scope=fluid.Scope())
    main, z = progs[1]
    (got,) = exe.run(main, feed=feed, fetch_list=[z], scope=fluid.Scope())
    assert got.shape == (0,)   # nothing to reduce into nothing: fine


def test_a_program_pickles_after_a_compiled_run():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        y = L.relu(_data("x", [-1, 3])) * 2.0
    feed = {"x": np.ones((2, 3), np.float32)}
    fluid.Executor().run(main, feed=feed, fetch_list=[y], scope=fluid.Scope())
    again = pickle.loads(pickle.dumps(main))
    (got,) = fluid.Executor().run(again, feed=feed, fetch_list=[y.name], scope=fluid.Scope())
    np.testing.assert_array_equal(got, np.full((2, 3), 2.0))


def test_each_executor_builds_its_own_plans_with_the_settings_of_then():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        i = L.fill_constant([1], "int64", 0)
        n = L.fill_constant([1], "int64", 4)
        x = _data("x", [3])
        i, x = L.while_loop(lambda i, x: i < n, lambda i, x: [i + 1, x * 2.0], [i, x])
    feed = {"x": np.ones(3, np.float32)}

    def kinds(exe):
        return [s.kind for _, p in exe._plans.values() for s in p.steps]

    first = fluid.Executor()
    first.run(main, feed=feed, fetch_list=[x], scope=fluid.Scope())
    assert "native_loop" in kinds(first)
    second = fluid.Executor(native_loops=False)
    (got,) = second.run(main, feed=feed, fetch_list=[x], scope=fluid.Scope())
    np.testing.assert_array_equal(got, np.full(3, 16.0))
    assert "native_loop" not in kinds(second) and "native_loop" in kinds(first)
    second.close()
    assert kinds(second) == [] and "native_loop" in kinds(first)   # close() is its own


def test_a_variable_of_a_loop_body_can_be_fetched():
    main = fluid.Program()
    inner = {}
    with fluid.program_guard(main, fluid.Program()):
        x = _data("x", [4])
        i = L.fill_constant([1], "int64", 0)
        n = L.fill_constant([1], "int64", 3)

        def body(i, x):
            inner["y"] = L.scale(x, scale=2.0)
            return [L.increment(i), inner["y"]]
        _, out = L.while_loop(lambda i, x: L.less_than(i, n), body, [i, x])
    feed = {"x": np.ones(4, np.float32)}
    for exe in (fluid.Executor(strict=True), fluid.Executor(mode="reference")):
        # the fetched body variable holds no value before the loop: the compiled plan runs
        # the loop op's reference for it, by design (strict mode takes it: no fallback)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            got = exe.run(main, feed=feed, fetch_list=[out, inner["y"]], scope=fluid.Scope())
        np.testing.assert_array_equal(got[0], np.full(4, 8.0))
        np.testing.assert_array_equal(got[1], np.full(4, 8.0))   # the last iteration's


def test_float64_kernels_are_compiled_ahead_too(monkeypatch):
    jobs = []
    real = pipeline_mod.precompile
    monkeypatch.setattr(pipeline_mod, "precompile", lambda js: (jobs.extend(js), real(js))[1])
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = _data("x", [-1, 3], "float64")
        y = L.tanh(x) + _data("b", [3], "float64")
    fluid.Executor().run(main, feed={"x": np.ones((2, 3)), "b": np.ones(3)}, fetch_list=[y],
                         scope=fluid.Scope())
    assert jobs and all(np.dtype(t[0]) == np.float64 for _, types in jobs for t in types
                        if isinstance(t, tuple))
