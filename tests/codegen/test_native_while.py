"""Compiled sub-blocks (the plan tree) and the native ``while`` loop.

Every program runs in compiled mode and is checked against the reference interpreter and a
plain NumPy computation of the same thing; the plan's step kinds say how it ran.
"""
import re

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import dtypes, registry, unique_name
from pdjit.framework.errors import FallbackWarning, OpRunError
from pdjit.framework.registry import CONTROL_FLOW, OPAQUE, VarMeta
from pdjit.proto import framework_pb2 as pb

# op 'test_native_while_plain_copy' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(test_native_while_plain_copy)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

STEP_SCOPES = pb.VarType.STEP_SCOPES


# ---- building loops the way Fluid 1.x's While block does --------------------------------------
def _block():
    return fluid.default_main_program().current_block()


def _set(dst, src):
    """dst = src, written into the variable ``dst`` (a lowerable copy: a ``cast`` to itself)."""
    code = dtypes.to_code(src.dtype)
    _block().append_op("cast", inputs={"X": [src.name]}, outputs={"Out": [dst.name]},
                       attrs={"in_dtype": code, "out_dtype": code})


def _while(cond, body, is_test=True):
    """Fluid's ``While`` block over ``body()``; returns the ``while`` op."""
    loop = fluid.layers.While(cond, is_test=is_test)
    with loop.block():
        body()
    op = _block().ops[-1]
    assert op.type == "while"
    return op


def _const(value, dtype, shape=(1,)):
    return fluid.layers.fill_constant(shape=list(shape), dtype=dtype, value=value)


def _run(main, feed, fetch, mode, **options):
    exe = fluid.Executor(mode=mode, **options)
    out = exe.run(main, feed=feed, fetch_list=fetch, scope=fluid.Scope())
    return exe, out


def _both(main, feed, fetch, rtol=0.0, **options):
    """(compiled executor, compiled results, reference results), checked equal (to ``rtol``:
    transcendental functions may differ in the last bit); ``options``: the compiled
    executor's."""
    exe, got = _run(main, feed, fetch, "compiled", **options)
    _, want = _run(main, feed, fetch, "reference")
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=0)
        assert np.asarray(g).dtype == np.asarray(w).dtype
    return exe, got, want


def _plan(exe):
    (_, plan), = exe._plans.values()
    return plan


def _kinds(exe):
    return [s.kind for s in _plan(exe).steps]


def _loop_step(exe):
    (step,) = [s for s in _plan(exe).steps if s.kind == "native_loop"]
    return step


def _counter_program(n_iter, size=16):
    x = fluid.layers.data(name="x", shape=[size], dtype="float32", append_batch_size=False)
    i, n = _const(0, "int64"), _const(n_iter, "int64")
    x_var = fluid.layers.scale(x, scale=1.0)   # the loop variable (the feed stays as it is)
    cond = fluid.layers.less_than(i, n)

    def body():
        fluid.layers.increment(i, value=1.0, in_place=True)
        _set(x_var, x_var * 0.5 + 1.0)
        fluid.layers.less_than(x=i, y=n, cond=cond)   # Fluid 1.x: written into cond
    _while(cond, body)
    return i, x_var


def _numpy_counter(xv, n_iter):
    i, x = 0, xv.copy()
    while i < n_iter:
        i += 1
        x = x * np.float32(0.5) + np.float32(1.0)
    return i, x


# ---- the native loop ----------------------------------------------------------------------
@pytest.mark.parametrize("n_iter", [1, 7, 1000])
def test_counter_loop_runs_as_one_native_step(fresh_programs, n_iter):
    main, _ = fresh_programs
    i, x = _counter_program(n_iter)
    xv = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    xv0 = xv.copy()
    exe, (gi, gx), _ = _both(main, {"x": xv}, [i, x])
    np.testing.assert_array_equal(xv, xv0)  # the feed is untouched
    wi, wx = _numpy_counter(xv, n_iter)
    assert gi.tolist() == [wi]
    np.testing.assert_allclose(gx, wx, rtol=1e-6)
    assert "native_loop" in _kinds(exe) and "reference" not in _kinds(exe)
    step = _loop_step(exe)
    assert step.fallbacks == 0 and step.retired is None


def test_zero_iterations_leave_the_loop_variables(fresh_programs):
    main, _ = fresh_programs
    i, x = _counter_program(0)
    xv = np.arange(16, dtype=np.float32)
    exe, (gi, gx), _ = _both(main, {"x": xv}, [i, x])
    assert gi.tolist() == [0]
    np.testing.assert_array_equal(gx, xv)
    assert _loop_step(exe).fallbacks == 0


def _while_loop_program(n_iter, is_test):
    x0 = fluid.layers.data(name="x", shape=[16], dtype="float32", append_batch_size=False)
    i0 = _const(0, "int64")
    n = _const(n_iter, "int64")
    return fluid.layers.while_loop(lambda i, x: fluid.layers.less_than(i, n),
                                   lambda i, x: [i + 1, x * 0.5 + 1.0], [i0, x0],
                                   is_test=is_test)


@pytest.mark.parametrize("is_test", [False, True])
def test_while_loop_layer(fresh_programs, is_test):
    main, _ = fresh_programs
    i, x = _while_loop_program(9, is_test)
    xv = np.random.default_rng(3).standard_normal(16).astype(np.float32)
    exe, (gi, gx), _ = _both(main, {"x": xv}, [i, x])
    wi, wx = _numpy_counter(xv, 9)
    assert gi.tolist() == [wi]
    np.testing.assert_allclose(gx, wx, rtol=1e-6)


def test_while_loop_layer_runs_as_one_native_step(fresh_programs):
    main, _ = fresh_programs
    i, x = _while_loop_program(1000, False)  # is_test=False: nothing reads the step scopes
    xv = np.random.default_rng(4).standard_normal(16).astype(np.float32)
    exe, (gi, gx), _ = _both(main, {"x": xv}, [i, x])
    wi, wx = _numpy_counter(xv, 1000)
    assert gi.tolist() == [wi]
    np.testing.assert_allclose(gx, wx, rtol=1e-6)
    assert _kinds(exe) == ["native", "native_loop"]
    assert _loop_step(exe).fallbacks == 0


def test_body_with_a_reduction(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3, 5], dtype="float64", append_batch_size=False)
    xv_ = fluid.layers.scale(x, scale=1.0)
    acc = _const(0.0, "float64")
    tot = _const(0.0, "float64")   # a full reduction's loop variable: [1], as in Fluid 1.x
    i, n = _const(0, "int32"), _const(6, "int32")
    cond = fluid.layers.less_than(i, n)

    def body():
        s = fluid.layers.reduce_sum(xv_ * xv_, dim=[0, 1], keep_dim=True)  # [1, 1]
        _set(acc, acc + fluid.layers.reshape(s, [1]))
        # a 0-d sum, declared 0-d as PaddlePaddle 3.x writes it (fluid.layers declares [1])
        blk = fluid.default_main_program().current_block()
        s0 = blk.create_var(name=fluid.unique_name.generate("s0"), dtype="float64")
        blk.append_op("reduce_sum", inputs={"X": [xv_]}, outputs={"Out": [s0]},
                      attrs={"dim": [0], "reduce_all": True})
        _set(tot, tot + s0)
        _set(xv_, xv_ * 0.9 - 0.1)
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(cond, fluid.layers.less_than(i, n))
    _while(cond, body)
    xv = np.random.default_rng(1).standard_normal((3, 5))
    exe, (ga, gx, gt), _ = _both(main, {"x": xv}, [acc, xv_, tot])
    a, t, y = 0.0, 0.0, xv.copy()
    s, b = float(np.float32(0.9)), float(np.float32(-0.1))  # scale's attributes are float32
    for _ in range(6):
        a += (y * y).sum()
        t += y.sum()
        y = y * s + b
    np.testing.assert_allclose(ga, [a], rtol=1e-12)
    np.testing.assert_allclose(gx, y, rtol=1e-12, atol=1e-15)
    assert gt.shape == (1,) and np.isclose(gt[0], t, rtol=1e-12)
    assert _loop_step(exe).fallbacks == 0


def test_loop_variables_of_several_dtypes(fresh_programs):
    main, _ = fresh_programs
    i, n = _const(0, "int32"), _const(5, "int32")
    f64 = _const(1.5, "float64", (2, 3))
    f32 = _const(-2.0, "float32", (4,))
    i64 = _const(3, "int64", (2,))
    cond = fluid.layers.less_than(i, n)

    def body():
        _set(f64, f64 * 1.5 + 0.25)
        _set(f32, fluid.layers.abs(f32) - 1.0)
        _set(i64, i64 * 3 - 1)
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(cond, fluid.layers.less_than(i, n))
    _while(cond, body)
    exe, got, _ = _both(main, {}, [i, f64, f32, i64])
    w64, w32, wi = np.full((2, 3), 1.5), np.full(4, -2.0, np.float32), np.full(2, 3, np.int64)
    for _ in range(5):
        w64, w32, wi = w64 * 1.5 + 0.25, np.abs(w32) - np.float32(1), wi * 3 - 1
    assert got[0].tolist() == [5] and got[0].dtype == np.int32
    np.testing.assert_allclose(got[1], w64, rtol=1e-12)
    np.testing.assert_allclose(got[2], w32, rtol=1e-6)
    np.testing.assert_array_equal(got[3], wi)
    assert [g.dtype for g in got[1:]] == [np.float64, np.float32, np.int64]
    assert _loop_step(exe).fallbacks == 0


def test_condition_computed_from_a_tensor(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[4], dtype="float32", append_batch_size=False)
    y = fluid.layers.scale(x, scale=1.0)
    limit = _const(100.0, "float32")
    count = _const(0, "int64")
    cond = fluid.layers.less_than(fluid.layers.reduce_sum(y, dim=[0], keep_dim=True), limit)

    def body():
        _set(y, y * 2.0)
        _set(count, fluid.layers.scale(count, bias=1.0))
        _set(cond, fluid.layers.less_than(fluid.layers.reduce_sum(y, dim=[0], keep_dim=True),
                                          limit))
    _while(cond, body)
    for start in ([1, 2, 3, 4], [50, 60, 0, 0], [0.5, 0.25, 0, 0.25]):
        xv = np.asarray(start, np.float32)
        exe, (gy, gc), _ = _both(main, {"x": xv}, [y, count])
        w, k = xv.copy(), 0
        while w.sum() < 100:
            w, k = w * 2, k + 1
        np.testing.assert_array_equal(gy, w)
        assert gc.tolist() == [k]
        assert _loop_step(exe).fallbacks == 0


def test_explain_shows_the_loop_and_its_source(fresh_programs):
    main, _ = fresh_programs
    i, x = _counter_program(3)
    exe = fluid.Executor()
    text = exe.explain(main, feed={"x": np.zeros(16, np.float32)}, fetch_list=[i, x])
    step = _loop_step(exe)
    assert step.describe() in text and "native loop while#" in text
    assert step.compiled.text in text
    src = step.compiled.text
    assert "while " in src
    # content-addressed: no variable names, no sizes
    fn = src.split("def loop")[1]
    assert i.name not in fn and x.name not in fn and not re.search(r"\b16\b", fn)


def test_swapping_loop_variables(fresh_programs):
    main, _ = fresh_programs
    a, b = _const(1.0, "float32", (3,)), _const(2.0, "float32", (3,))
    i, n = _const(0, "int64"), _const(5, "int64")
    cond = fluid.layers.less_than(i, n)

    def body():  # a, b = b, a + b: the body writes a from b and b from the old a
        t = a + b
        _set(a, b)
        _set(b, t)
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(cond, fluid.layers.less_than(i, n))
    _while(cond, body)
    exe, (ga, gb), _ = _both(main, {}, [a, b])
    wa, wb = 1.0, 2.0
    for _ in range(5):
        wa, wb = wb, wa + wb
    np.testing.assert_array_equal(ga, np.full(3, wa, np.float32))
    np.testing.assert_array_equal(gb, np.full(3, wb, np.float32))
    assert _loop_step(exe).fallbacks == 0


# ---- fallbacks --------------------------------------------------------------------------------
_PLAIN = "test_native_while_plain_copy"


@pytest.fixture(scope="module")
def plain_copy_op():
    registry.register_op(
        _PLAIN, inputs=["X"], outputs=["Out"], traits=[OPAQUE],
        infer_shape=lambda X: {"Out": X}, reference=lambda X: {"Out": np.array(X, copy=True)},
        emit=None, grad=None, doc="Out = X (no emit: always runs its reference).")
    yield _PLAIN
    registry.unregister_op(_PLAIN)


def test_body_that_is_not_lowerable_runs_its_compiled_sub_plan(fresh_programs, plain_copy_op):
    main, _ = fresh_programs
    i, n = _const(0, "int64"), _const(4, "int64")
    x = _const(1.0, "float32", (5,))
    cond = fluid.layers.less_than(i, n)

    def body():
        t = _block().create_var(name=unique_name.generate("t"), shape=[5], dtype="float32")
        _block().append_op(_PLAIN, inputs={"X": [x.name]}, outputs={"Out": [t.name]})
        _set(x, t * 3.0 + 1.0)
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(cond, fluid.layers.less_than(i, n))
    _while(cond, body)
    exe, (gx, gi), _ = _both(main, {}, [x, i])
    w = np.ones(5, np.float32)
    for _ in range(4):
        w = w * 3 + 1
    np.testing.assert_array_equal(gx, w)
    assert gi.tolist() == [4]
    plan = _plan(exe)
    (ref,) = [s for s in plan.steps if s.kind == "reference"]
    assert ref.op.type == "while" and "not lowerable" in ref.why
    ((idx, sub),) = ref.sub_plans
    assert idx == ref.op.attr("sub_block")
    assert [s.kind for s in sub.steps] == ["reference", "native"]  # the body is compiled too
    assert sub.steps[1].fallbacks == 0
    text = exe.explain(main, fetch_list=[x, i])
    assert "-- sub-block 1 --" in text


def test_loop_carried_shape_change_falls_back_to_the_reference(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[-1, -1], dtype="float32", append_batch_size=False)
    y = fluid.layers.data(name="y", shape=[-1, 4], dtype="float32", append_batch_size=False)
    v = fluid.layers.scale(x, scale=1.0)
    i, n = _const(0, "int64"), _const(3, "int64")
    cond = fluid.layers.less_than(i, n)

    def body():
        _set(v, v + y)  # [1, 1] + [1, 4]: the first iteration broadcasts v to [1, 4]
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(cond, fluid.layers.less_than(i, n))
    _while(cond, body)
    xv = np.full((1, 1), 2.0, np.float32)
    yv = np.arange(4, dtype=np.float32).reshape(1, 4)
    exe = fluid.Executor(strict=False)   # the fallback is the point, and it says so
    with pytest.warns(FallbackWarning, match="operand shapes do not fit") as said:
        (gv,) = exe.run(main, feed={"x": xv, "y": yv}, fetch_list=[v], scope=fluid.Scope())
    assert {str(w.message).split(" (")[0] for w in said} == {"op 'elementwise_add'", "op 'while'"}
    _, (want,) = _run(main, {"x": xv, "y": yv}, [v], "reference")
    np.testing.assert_array_equal(gv, xv + 3 * yv)
    np.testing.assert_array_equal(gv, want)
    step = _loop_step(exe)
    assert step.fallbacks == 1 and step.retired is None
    # a later run whose shapes stay put runs natively again
    exe.run(main, feed={"x": np.ones((1, 4), np.float32), "y": yv}, fetch_list=[v],
            scope=fluid.Scope())
    assert step.fallbacks == 1


def test_a_failing_loop_names_the_body_op_and_keeps_the_scope(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[-1], dtype="float32", append_batch_size=False)
    y = fluid.layers.data(name="y", shape=[-1], dtype="float32", append_batch_size=False)
    v = fluid.layers.scale(x, scale=1.0)
    i, n = _const(0, "int64"), _const(3, "int64")
    cond = fluid.layers.less_than(i, n)

    def body():
        _set(v, v * y)
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(cond, fluid.layers.less_than(i, n))
    _while(cond, body)
    for mode in ("compiled", "reference"):
        scope = fluid.Scope()
        exe = fluid.Executor(mode=mode)
        with pytest.raises(OpRunError) as e:
            exe.run(main, feed={"x": np.ones(3, np.float32), "y": np.ones(2, np.float32)},
                    fetch_list=[v], scope=scope)
        assert "elementwise_mul" in str(e.value) and "block 1" in str(e.value), str(e.value)
        assert scope.find_var(v.name) is None or scope.find_var(v.name).value is None


def test_a_condition_of_several_elements_gets_the_reference_error(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[-1], dtype="float32", append_batch_size=False)
    v = fluid.layers.scale(x, scale=1.0)
    limit = _const(10.0, "float32")
    cond = fluid.layers.less_than(v, limit)  # one element only if x has one

    def body():
        _set(v, v + 1.0)
        _set(cond, fluid.layers.less_than(v, limit))
    _while(cond, body)
    exe, (gv,), _ = _both(main, {"x": np.array([7.5], np.float32)}, [v])
    assert gv.tolist() == [10.5] and _loop_step(exe).fallbacks == 0
    for mode in ("compiled", "reference"):
        with pytest.raises(OpRunError) as e:
            _run(main, {"x": np.array([1.0, 2.0], np.float32)}, [v], mode)
        assert "'while'" in str(e.value) and "one element" in str(e.value), str(e.value)


# ---- step scopes -------------------------------------------------------------------------------
_SCOPES_READER = "test_native_while_count_scopes"


@pytest.fixture(scope="module")
def scopes_reader_op():
    registry.register_op(
        _SCOPES_READER, inputs=["X"], outputs=["Out"], traits=[CONTROL_FLOW],
        infer_shape=lambda X: {"Out": VarMeta((1,), np.int64)},
        reference=lambda X: {"Out": np.array([len(X)], np.int64)}, emit=None, grad=None,
        doc="Out = how many step scopes X holds (stands for while_grad, which reads them).")
    yield _SCOPES_READER
    registry.unregister_op(_SCOPES_READER)


@pytest.mark.parametrize("is_test", [False, True])
def test_step_scopes_that_are_read_keep_the_loop_in_the_reference(fresh_programs, scopes_reader_op,
                                                                   is_test):
    main, _ = fresh_programs
    i, x = _const(0, "int64"), _const(1.0, "float32", (2,))
    n = _const(6, "int64")
    cond = fluid.layers.less_than(i, n)

    def body():
        _set(x, x * 2.0)
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(cond, fluid.layers.less_than(i, n))
    op = _while(cond, body, is_test=is_test)
    count = _block().create_var(name="count", shape=[1], dtype="int64")
    _block().append_op(_SCOPES_READER, inputs={"X": op.output("StepScopes")},
                       outputs={"Out": [count.name]})
    exe, (gx, gc), _ = _both(main, {}, [x, count])
    np.testing.assert_array_equal(gx, np.full(2, 64.0, np.float32))
    if is_test:  # nothing kept: the loop may (and does) run natively
        assert gc.tolist() == [0] and "native_loop" in _kinds(exe)
    else:        # one env per iteration, for the backward pass
        assert gc.tolist() == [6] and "native_loop" not in _kinds(exe)
        (ref,) = [s for s in _plan(exe).steps if s.kind == "reference" and s.op.type == "while"]
        assert "step scopes are read" in ref.why


def test_fetched_step_scopes_hold_every_value_of_their_iteration(fresh_programs):
    main, _ = fresh_programs
    i, x = _counter_program(3)
    (op,) = [o for o in main.global_block().ops if o.type == "while"]
    op._set_attr("is_test", False)
    body = main.block(op.attr("sub_block"))
    local = sorted(n for o in body.ops for n in o.output_arg_names if body.has_var(n))
    xv = np.ones(16, np.float32)
    for mode in ("reference", "compiled"):
        exe, (scopes, gx) = _run(main, {"x": xv}, [op.output("StepScopes")[0], x], mode)
        np.testing.assert_allclose(gx, _numpy_counter(xv, 3)[1], rtol=1e-6)
        assert len(scopes) == 3 and local
        for k, env in enumerate(scopes):  # the body's own values, as the reference keeps them
            assert sorted(env.values) == local, mode
            np.testing.assert_allclose(env.saved[x.name], _numpy_counter(xv, k)[1], rtol=1e-6)
    assert "native_loop" not in _kinds(exe)


def test_a_loop_with_while_grad_keeps_its_step_scopes(fresh_programs):
    main, _ = fresh_programs
    a = fluid.layers.data(name="a", shape=[3], dtype="float64", append_batch_size=False)
    a.stop_gradient = False
    y0 = _const(2.0, "float64", (3,))
    i0, n = _const(0, "int64"), _const(3, "int64")
    _, y = fluid.layers.while_loop(lambda i, y: fluid.layers.less_than(i, n),
                                   lambda i, y: [i + 1, y * a], [i0, y0])
    (g,) = fluid.gradients([fluid.layers.reduce_sum(y)], [a])
    av = np.array([1.0, -2.0, 0.5])
    exe, (gy, gg), _ = _both(main, {"a": av}, [y, g])
    np.testing.assert_allclose(gy, 2 * av ** 3, rtol=1e-12)
    np.testing.assert_allclose(gg, 3 * 2 * av ** 2, rtol=1e-12)  # d/da sum(2 a^3)
    assert "native_loop" not in [s.kind for s in _plan(exe).walk()]
    (fwd,) = [s for s in _plan(exe).steps if s.kind == "reference" and s.op.type == "while"]
    assert "step scopes are read by while_grad" in fwd.why
    assert fwd.sub_plans and fwd.sub_plans[0][1].steps[0].kind == "native"  # body compiled


def test_nested_loops_compile_the_inner_one(fresh_programs):
    main, _ = fresh_programs
    i, j = _const(0, "int64"), _const(0, "int64")
    n, m = _const(3, "int64"), _const(4, "int64")
    total = _const(0.0, "float64")
    outer = fluid.layers.less_than(i, n)

    def outer_body():
        _set(j, fluid.layers.fill_constant(shape=[1], dtype="int64", value=0))
        inner = fluid.layers.less_than(j, m)

        def inner_body():
            _set(total, total + fluid.layers.cast(i * j, "float64"))
            _set(j, fluid.layers.scale(j, bias=1.0))
            _set(inner, fluid.layers.less_than(j, m))
        _while(inner, inner_body)
        _set(i, fluid.layers.scale(i, bias=1.0))
        _set(outer, fluid.layers.less_than(i, n))
    _while(outer, outer_body)
    exe, (gt,), _ = _both(main, {}, [total])
    assert gt.tolist() == [float(sum(a * b for a in range(3) for b in range(4)))]
    (ref,) = [s for s in _plan(exe).steps if s.kind == "reference"]
    assert "control_flow" in ref.why
    ((_, sub),) = ref.sub_plans
    loops = [s for s in _plan(exe).walk() if s.kind == "native_loop"]
    assert len(loops) == 1 and loops[0] in sub.steps and loops[0].fallbacks == 0


def test_native_loops_can_be_switched_off(fresh_programs):
    main, _ = fresh_programs
    i, x = _counter_program(20)
    xv = np.ones(16, np.float32)
    exe, (gi, gx), _ = _both(main, {"x": xv}, [i, x], native_loops=False)
    assert gi.tolist() == [20]
    np.testing.assert_allclose(gx, _numpy_counter(xv, 20)[1], rtol=1e-6)
    assert _kinds(exe) == ["native", "reference"]
    (ref,) = [s for s in _plan(exe).steps if s.kind == "reference"]
    assert "native_loops=False" in ref.why
    ((_, sub),) = ref.sub_plans
    assert [s.kind for s in sub.steps] == ["native"] and sub.steps[0].fallbacks == 0


# ---- conditional_block ---------------------------------------------------------------------------
@pytest.mark.parametrize("flag", [True, False])
def test_conditional_block_runs_its_compiled_sub_plan(fresh_programs, flag):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3, 4], dtype="float32", append_batch_size=False)
    out = fluid.layers.scale(x, scale=0.0, bias=-1.0)
    a, b = _const(1.0 if flag else 3.0, "float32"), _const(2.0, "float32")
    cond = fluid.layers.less_than(a, b)
    parent = _block()
    blk = main._create_block()
    try:
        _set(out, fluid.layers.relu(x * 2.0 - 1.0) + x)
    finally:
        main._rollback()
    scope_var = parent.create_var(name="cb_scope", type=STEP_SCOPES)
    parent.append_op("conditional_block", inputs={"Cond": [cond.name], "Input": [x.name]},
                     outputs={"Out": [out.name], "Scope": [scope_var.name]},
                     attrs={"sub_block": blk.idx, "is_scalar_condition": True})
    xv = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    exe, (got,), _ = _both(main, {"x": xv}, [out])
    want = np.maximum(xv * 2 - 1, 0) + xv if flag else np.full((3, 4), -1.0, np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (ref,) = [s for s in _plan(exe).steps if s.kind == "reference"]
    ((idx, sub),) = ref.sub_plans
    assert idx == blk.idx and [s.kind for s in sub.steps] == ["native"]
    assert sub.steps[0].fallbacks == 0
    run_block = ref.op.block.program.block(blk.idx)  # the run program's copy of the block
    assert exe._block_plan(run_block) is sub  # built once per program version and block


@pytest.mark.parametrize("shift", [0.0, 100.0])
def test_cond_layer_branches_run_compiled_sub_plans(fresh_programs, shift):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[2, 3], dtype="float32", append_batch_size=False)
    pred = fluid.layers.less_than(fluid.layers.reduce_sum(x, dim=[0, 1], keep_dim=True),
                                  _const(50.0, "float32", (1, 1)))
    pred = fluid.layers.reshape(pred, [1])
    out = fluid.layers.cond(pred, lambda: fluid.layers.tanh(x) * 2.0, lambda: x * x - 1.0)
    xv = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32) + shift
    exe, (got,), _ = _both(main, {"x": xv}, [out], rtol=1e-6)
    want = np.tanh(xv) * 2 if xv.sum() < 50 else xv * xv - 1
    np.testing.assert_allclose(got, want, rtol=1e-5)
    blocks = [s for s in _plan(exe).steps if getattr(s, "sub_plans", None)]
    assert [s.op.type for s in blocks] == ["conditional_block", "conditional_block"]
    for step in blocks:
        ((_, sub),) = step.sub_plans
        assert sub.steps[0].kind == "native" and sub.steps[0].fallbacks == 0


def test_reference_mode_interprets_sub_blocks(fresh_programs, monkeypatch):
    main, _ = fresh_programs
    i, x = _counter_program(5)
    exe = fluid.Executor(mode="reference")
    monkeypatch.setattr(exe, "_block_plan", lambda b: pytest.fail("reference mode compiled"))
    (gi,) = exe.run(main, feed={"x": np.zeros(16, np.float32)}, fetch_list=[i],
                    scope=fluid.Scope())
    assert gi.tolist() == [5]
