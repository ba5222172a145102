"""The compiled executor: fusion decisions, one plan across batch sizes, errors, inspection."""
import functools

import numpy as np
import pytest

import pdjit as fluid
from pdjit.custom import define_op
from pdjit.framework.errors import FallbackWarning, OpRunError
from pdjit.testing import assert_native

# op 'test_row_sort' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = [pytest.mark.filterwarnings(
    r"ignore:op '(test_row_sort)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning"), pytest.mark.usefixtures("counted_trials")]


def _steps(exe):
    (prog, plan), = exe._plans.values()
    return plan.steps


def _both(main, feed, fetch, startup=None):
    """Run compiled and reference from the same start; return both results."""
    out = []
    for mode in ("compiled", "reference"):
        scope, exe = fluid.Scope(), fluid.Executor(mode=mode)
        if startup is not None:
            exe.run(startup, scope=scope)
        out.append(exe.run(main, feed=feed, fetch_list=fetch, scope=scope))
        if mode == "compiled":
            assert_native(exe)
    return out


def test_elementwise_chain_fuses_into_one_native_step(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[8], dtype="float32")
    a = fluid.layers.data(name="a", shape=[8], dtype="float32")
    y = fluid.layers.relu(fluid.layers.tanh(x * a + 1.0) * 2.0 - 0.25) + x * 0.5
    exe = fluid.Executor()
    xv = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    av = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    (got,) = exe.run(main, feed={"x": xv, "a": av}, fetch_list=[y], scope=fluid.Scope())
    want = np.maximum(np.tanh(xv * av + 1) * 2 - 0.25, 0) + xv * 0.5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (step,) = _steps(exe)
    assert step.describe().startswith("native")
    assert step.describe().count("elementwise [") == 1  # one group holds every op
    assert step.outputs == [y.name]                     # intermediates never reach memory
    assert step.fallbacks == 0


def test_one_plan_serves_every_batch_size(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.reduce_sum(fluid.layers.exp(x), dim=[1])
    exe, scope = fluid.Executor(), fluid.Scope()
    for n in (1, 4, 17, 4):
        xv = np.arange(3 * n, dtype=np.float32).reshape(n, 3) / 10
        (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        np.testing.assert_allclose(got, np.exp(xv).sum(1), rtol=1e-5)
    (step,) = _steps(exe)
    assert len(exe._plans) == 1
    # specialised on dtype and rank, not size
    assert all(len(k.fn.signatures) == 1 for k in step.compiled.kernels)


@functools.cache
def _row_sort_layer():
    """An op with a NumPy reference and no emit rule (any built-in op may gain one), defined
    when a test first runs (not at collection: the registry-wide tests list the ops then)."""
    return define_op("test_row_sort", reference=lambda X: np.sort(X, axis=-1))


def _row_sort(x):
    return _row_sort_layer()(x)


def test_refusals_have_reasons_and_explain_shows_source(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[4], dtype="float32")
    h = fluid.layers.relu(x)
    s = fluid.layers.reduce_sum(h, dim=[1], keep_dim=True)     # folds relu in
    t = fluid.layers.elementwise_div(h, s)                    # shape differs from reduction's
    u = _row_sort(t)                                           # no emit: reference step
    exe = fluid.Executor()
    report = exe.explain(main, feed={"x": None}, fetch_list=[u])
    assert "reduction [relu#" in report and "reduce_sum#" in report
    assert "test_row_sort#" in report and "no emit rule" in report
    assert "def segment(" in report and "@numba.njit(" in report
    xv = np.abs(np.random.default_rng(2).normal(size=(3, 4))).astype(np.float32) + 0.1
    got, ref = _both(main, {"x": xv}, [u])
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)


def test_broadcasting_inside_a_fused_group(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[2, 3, 4], dtype="float64", append_batch_size=False)
    b = fluid.layers.data(name="b", shape=[3], dtype="float64", append_batch_size=False)
    c = fluid.layers.data(name="c", shape=[1, 4], dtype="float64", append_batch_size=False)
    y = fluid.layers.elementwise_mul(fluid.layers.elementwise_add(x, b, axis=1), c, axis=1)
    z = fluid.layers.sigmoid(y)
    rng = np.random.default_rng(3)
    feed = {"x": rng.normal(size=(2, 3, 4)), "b": rng.normal(size=3), "c": rng.normal(size=(1, 4))}
    got, ref = _both(main, feed, [y, z])
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-12)
    want = (feed["x"] + feed["b"][None, :, None]) * feed["c"][None]
    np.testing.assert_allclose(got[0], want, rtol=1e-12)


@pytest.mark.parametrize("y_shape, row_loop", [([4], True), ([1, 4], True), ([-1, 4], False)])
def test_row_loop_is_compiled_only_where_a_leaf_can_be_a_repeated_row(fresh_programs, y_shape,
                                                                      row_loop):
    """A bias (rank 1, or size 1 in a leading dim) gets the vectorising row loop; same-shape
    leaves do not, and a [-1, 4] leaf fed one row at run time (a broadcast the flat form does
    not cover) gets the right answer from the references, with a warning."""
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[-1, 4], dtype="float32", append_batch_size=False)
    y = fluid.layers.data(name="y", shape=y_shape, dtype="float32", append_batch_size=False)
    z = fluid.layers.tanh(fluid.layers.elementwise_add(x, y))
    report = fluid.Executor().explain(main, feed={"x": None, "y": None}, fetch_list=[z])
    assert ("for r in range(" in report) == row_loop, report
    rng = np.random.default_rng(4)
    xv = rng.normal(size=(5, 4)).astype(np.float32)
    fed = [[5 if d == -1 else d for d in y_shape]] + ([[1, 4]] if -1 in y_shape else [])
    for shape in fed:
        yv = rng.normal(size=shape).astype(np.float32)
        if list(shape) == [1, 4] and -1 in y_shape:
            with pytest.warns(FallbackWarning, match="elementwise_add"):
                got = fluid.Executor(strict=False).run(main, feed={"x": xv, "y": yv},
                                                       fetch_list=[z], scope=fluid.Scope())
        else:
            got, ref = _both(main, {"x": xv, "y": yv}, [z])
            np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)
        np.testing.assert_allclose(got[0], np.tanh(xv + yv), rtol=1e-6)


def test_runtime_shape_error_names_the_op_and_scope_is_kept(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data(name="x", shape=[-1, 3], dtype="float32", append_batch_size=False)
    y = fluid.layers.data(name="y", shape=[-1, 3], dtype="float32", append_batch_size=False)
    acc = fluid.layers.create_global_var([1], 0.0, "float32", persistable=True, name="acc")
    fluid.layers.assign(fluid.layers.increment(acc, value=1.0) if hasattr(fluid.layers, "increment")
                        else acc + 1.0, output=acc)
    z = fluid.layers.elementwise_add(x, y)
    scope, exe = fluid.Scope(), fluid.Executor(strict=False)  # a broadcast outside the form
    exe.run(startup, scope=scope)
    with pytest.raises(OpRunError, match=r"op 'elementwise_add'.*do not broadcast"):
        exe.run(main, feed={"x": np.ones((2, 3), np.float32), "y": np.ones((4, 3), np.float32)},
                fetch_list=[z], scope=scope)
    np.testing.assert_array_equal(scope.find_var("acc").value, [0.0])
    (got,) = exe.run(main, feed={"x": np.ones((2, 3), np.float32),
                                 "y": np.ones((1, 3), np.float32)}, fetch_list=[z], scope=scope)
    np.testing.assert_array_equal(got, np.full((2, 3), 2.0))


def test_mlp_forward_is_one_native_function(fresh_programs):
    main, startup = fresh_programs
    startup.random_seed = 5
    x = fluid.layers.data(name="x", shape=[16], dtype="float32")
    h = fluid.layers.fc(x, size=32, act="relu")
    p = fluid.layers.fc(h, size=10, act="softmax")
    xv = np.random.default_rng(4).normal(size=(8, 16)).astype(np.float32)
    got, ref = _both(main, {"x": xv}, [p], startup)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-7)
    exe = fluid.Executor()
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": xv}, fetch_list=[p], scope=scope)
    main_steps = [s for prog, plan in exe._plans.values() if prog.global_block().has_var("x")
                  for s in plan.steps]
    assert len(main_steps) == 1 and main_steps[0].describe().startswith("native")


def test_dump_env_prints_the_plan(fresh_programs, monkeypatch, capsys):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[2], dtype="float32")
    y = fluid.layers.abs(x)
    monkeypatch.setenv("PDJIT_DUMP", "1")
    monkeypatch.setenv("PDJIT_DUMP_AFTER", "prune,fusion")
    fluid.Executor().run(main, feed={"x": np.ones((1, 2), np.float32)}, fetch_list=[y],
                         scope=fluid.Scope())
    err = capsys.readouterr().err
    assert "after pass prune" in err and "after pass fusion" in err and "def segment(" in err


def test_reference_mode_is_selectable_by_environment(monkeypatch):
    monkeypatch.setenv("PDJIT_EXECUTOR", "reference")
    assert fluid.Executor().mode == "reference"
    monkeypatch.setenv("PDJIT_EXECUTOR", "compiled")
    assert fluid.Executor().mode == "compiled"
    monkeypatch.setenv("PDJIT_EXECUTOR", "turbo")
    with pytest.raises(ValueError, match="PDJIT_EXECUTOR='turbo'"):
        fluid.Executor()


def test_parallel_loops_when_threads_are_asked_for(fresh_programs):
    from pdjit.codegen.cpu.target import PARALLEL_MIN_SIZE

    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[-1], dtype="float32", append_batch_size=False)
    y = fluid.layers.sigmoid(x * 2.0) + x
    fluid.set_num_threads(2)
    try:
        exe = fluid.Executor()
        for n in (5, PARALLEL_MIN_SIZE + 3):  # below and above the parallel threshold
            xv = np.linspace(-3, 3, n).astype(np.float32)
            (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=fluid.Scope())
            np.testing.assert_allclose(got, 1 / (1 + np.exp(-2 * xv)) + xv, rtol=1e-6,
                                       atol=1e-6)
        (step,) = _steps(exe)
        assert "numba.prange" in step.compiled.text and "parallel=True" in step.compiled.text
    finally:
        fluid.set_num_threads(1)
    assert fluid.get_num_threads() == 1


def test_in_place_update_of_a_persistable_is_written_back(fresh_programs):
    """An elementwise op whose output is its own input (increment) in a fused group."""
    main, startup = fresh_programs
    counter = fluid.layers.create_global_var([1], 0.0, "float32", persistable=True, name="n")
    main.global_block().append_op("increment", inputs={"X": counter}, outputs={"Out": counter},
                                  attrs={"step": 2.0})
    doubled = counter * 2.0
    scope, exe = fluid.Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    for k in range(1, 4):
        (d,) = exe.run(main, fetch_list=[doubled], scope=scope)
        assert float(d[0]) == 4.0 * k and float(scope.find_var("n").value[0]) == 2.0 * k


def test_plans_live_on_the_program_keyed_by_content_not_identity():
    import gc
    import weakref

    def build():
        main = fluid.Program()
        with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
            x = fluid.layers.data(name="x", shape=[3], dtype="float32")
            y = fluid.layers.tanh(x) * 2.0
        return main, y

    exe = fluid.Executor()
    main, y = build()
    xv = np.ones((2, 3), np.float32)
    exe.run(main, feed={"x": xv}, fetch_list=[y], scope=fluid.Scope())
    key = main.content_key()
    assert main.content_key() is key                    # computed once per version
    (entry,) = [v for k, v in main._run_cache().items() if k[1][0] == "run"]
    exe.run(main, feed={"x": xv}, fetch_list=[y], scope=fluid.Scope())
    assert [v for k, v in main._run_cache().items() if k[1][0] == "run"] == [entry]
    # an equal program has the same content key, a changed one another
    again = main.clone()
    assert again.content_key() == key
    with fluid.program_guard(main, fluid.Program()):
        fluid.layers.relu(y)
    assert main.content_key() != key and not main._run_cache()  # the old plans are gone
    # the executor does not keep programs alive
    ref = weakref.ref(again)
    exe.run(again, feed={"x": xv}, fetch_list=[y.name], scope=fluid.Scope())
    del again
    gc.collect()
    assert ref() is None


def test_no_feed_or_fetch_op_is_added_to_the_program(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.relu(x)
    before = [op.type for op in main.global_block().ops]
    for mode in ("compiled", "reference"):
        exe = fluid.Executor(mode=mode)
        exe.run(main, feed={"x": np.ones((1, 3), np.float32)}, fetch_list=[y],
                scope=fluid.Scope())
        assert [op.type for op in main.global_block().ops] == before
        if mode == "compiled":
            ((prog, _),) = exe._plans.values()
            assert prog is main                          # the user's program itself ran


def test_native_drivers_are_measured_and_chosen_per_batch_size(fresh_programs):
    """``Executor(native_drivers=True)``: each native step also has its driver as one compiled
    function; the first runs of a batch size time both and keep the faster; every run gives
    the NumPy answer."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [6])
    h = fluid.layers.fc(x, 5, act="relu", param_attr=fluid.ParamAttr(name="w0"),
                        bias_attr=fluid.ParamAttr(name="b0"))
    y = fluid.layers.softmax(fluid.layers.scale(h, 2.0, bias=0.5))
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers=True, strict=True)
    exe.run(startup, scope=scope)
    w0, b0 = (np.asarray(scope.find_var(n).value) for n in ("w0", "b0"))
    rng = np.random.default_rng(3)
    for batch in (1, 7):
        for _ in range(10):
            xv = rng.standard_normal((batch, 6)).astype("float32")
            (out,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
            z = 2.0 * np.maximum(xv @ w0 + b0, 0) + 0.5
            e = np.exp(z - z.max(1, keepdims=True))
            np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    steps = [s for (pid, _), (_, plan) in exe._plans.items() if pid == id(main)
             for s in plan.steps if s.kind == "native"]
    assert steps
    for step in steps:
        assert step.native is not None
        assert sorted(step.tiers.picked) == [1, 7]
        assert all(fn in (step.native.fn, step.compiled.fn) for fn in step.tiers.picked.values())
        assert "driver by batch size" in step.describe()
        assert step.native.fn.signatures  # the native driver was compiled and ran
