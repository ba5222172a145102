"""``cond`` and ``conditional_block`` against plain Python branches, in both executor modes."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.layers.control_flow import select_input
from pdjit.proto import framework_pb2 as pb

L = fluid.layers
MODES = ["reference", "compiled"]


def _run(mode, main, feed, fetch, scope=None):
    return fluid.Executor(mode=mode).run(main, feed=feed, fetch_list=fetch,
                                         scope=scope or fluid.Scope())


def _xs(main):
    x = L.data(name="x", shape=[2, 3], dtype="float32", append_batch_size=False)
    s = L.data(name="s", shape=[1], dtype="float32", append_batch_size=False)
    return x, s


@pytest.mark.parametrize("mode", MODES)
def test_cond_picks_the_branch_of_the_predicate(mode, fresh_programs):
    main, _ = fresh_programs
    x, s = _xs(main)
    out = L.cond(L.less_than(s, L.fill_constant([1], "float32", 0.0)),
                 lambda: L.tanh(x) * 3.0, lambda: x - 1.0)
    xv = np.random.default_rng(1).uniform(-2, 2, (2, 3)).astype(np.float32)
    for sv in (-0.5, 0.0, 2.0):
        (got,) = _run(mode, main, {"x": xv, "s": np.array([sv], np.float32)}, [out])
        want = np.tanh(xv) * 3 if sv < 0 else xv - 1
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_cond_is_built_as_paddle_builds_it(fresh_programs):
    main, _ = fresh_programs
    x, s = _xs(main)
    pred = L.less_than(s, L.fill_constant([1], "float32", 0.0))
    L.cond(pred, lambda: x * 3.0, lambda: x - 1.0)
    types = [op.type for op in main.global_block().ops]
    assert types[-5:] == ["conditional_block", "logical_not", "conditional_block", "cast",
                          "select_input"]
    cb1, _, cb2, cast, sel = main.global_block().ops[-5:]
    assert cb1.input("Cond") == [pred.name] and cb1.attr("is_scalar_condition") is True
    assert cb1.input("Input") == [x.name] and cb2.input("Input") == [x.name]
    assert cast.attr("out_dtype") == 2  # int32
    assert sel.input("X") == cb2.output("Out") + cb1.output("Out")  # [false, true]
    assert sel.input("Mask") == cast.output("Out")
    assert main.block(cb1.attr("sub_block")).parent_idx == 0


@pytest.mark.parametrize("mode", MODES)
def test_cond_with_nested_outputs(mode, fresh_programs):
    main, _ = fresh_programs
    x, s = _xs(main)
    pred = L.greater_than(s, L.fill_constant([1], "float32", 1.0))
    out = L.cond(pred, lambda: {"a": x + 1.0, "b": (x * x, L.reduce_sum(x))},
                 lambda: {"a": x - 1.0, "b": (x * 0.5, L.reduce_max(x))})
    assert isinstance(out, dict) and isinstance(out["b"], tuple)
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    for sv in (0.0, 2.0):
        a, b0, b1 = _run(mode, main, {"x": xv, "s": np.array([sv], np.float32)},
                         [out["a"], out["b"][0], out["b"][1]])
        if sv > 1:
            wa, wb0, wb1 = xv + 1, xv * xv, xv.sum()
        else:
            wa, wb0, wb1 = xv - 1, xv * 0.5, xv.max()
        np.testing.assert_allclose(a, wa)
        np.testing.assert_allclose(b0, wb0)
        np.testing.assert_allclose(np.reshape(b1, ()), wb1)


@pytest.mark.parametrize("mode", MODES)
def test_cond_without_outputs_runs_the_branch_for_its_writes(mode, fresh_programs):
    main, _ = fresh_programs
    x, s = _xs(main)
    acc = L.fill_constant([2, 3], "float32", 0.0)
    pred = L.less_than(s, L.fill_constant([1], "float32", 0.0))

    def true_fn():
        L.assign(x * 2.0, acc)

    assert L.cond(pred, true_fn) is None
    xv = np.ones((2, 3), np.float32)
    (neg,) = _run(mode, main, {"x": xv, "s": np.array([-1.0], np.float32)}, [acc])
    (pos,) = _run(mode, main, {"x": xv, "s": np.array([1.0], np.float32)}, [acc])
    np.testing.assert_allclose(neg, 2 * xv)
    np.testing.assert_allclose(pos, 0 * xv)


@pytest.mark.parametrize("mode", MODES)
def test_while_inside_cond(mode, fresh_programs):
    main, _ = fresh_programs
    n = L.data(name="n", shape=[1], dtype="int64", append_batch_size=False)

    def count_up():
        i = L.fill_constant([1], "int64", 0)
        t = L.fill_constant([1], "int64", 0)
        _, t = L.while_loop(lambda i, t: L.less_than(i, n), lambda i, t: [i + 1, t + i], [i, t])
        return t

    out = L.cond(L.greater_than(n, L.fill_constant([1], "int64", 3)), count_up,
                 lambda: n * 100)
    for nv in (2, 3, 4, 9):
        (got,) = _run(mode, main, {"n": np.array([nv], np.int64)}, [out])
        assert got.tolist() == [sum(range(nv)) if nv > 3 else nv * 100]


@pytest.mark.parametrize("mode", MODES)
def test_cond_inside_cond(mode, fresh_programs):
    main, _ = fresh_programs
    x, s = _xs(main)
    zero = L.fill_constant([1], "float32", 0.0)
    ten = L.fill_constant([1], "float32", 10.0)
    out = L.cond(L.less_than(s, zero), lambda: x * -1.0,
                 lambda: L.cond(L.less_than(s, ten), lambda: x + 10.0, lambda: x * 10.0))
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    for sv, want in ((-1.0, -xv), (5.0, xv + 10), (50.0, xv * 10)):
        (got,) = _run(mode, main, {"x": xv, "s": np.array([sv], np.float32)}, [out])
        np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("mode", MODES)
def test_conditional_block_keeps_its_step_scope(mode, fresh_programs):
    main, _ = fresh_programs
    x, s = _xs(main)
    pred = L.less_than(s, L.fill_constant([1], "float32", 0.0))
    L.cond(pred, lambda: x * 3.0, lambda: x - 1.0)
    cb1, cb2 = [op for op in main.global_block().ops if op.type == "conditional_block"]
    xv = np.ones((2, 3), np.float32)
    s1, s2 = _run(mode, main, {"x": xv, "s": np.array([-1.0], np.float32)},
                  [cb1.output("Scope")[0], cb2.output("Scope")[0]])
    assert len(s1) == 1 and len(s2) == 0
    (env,) = s1
    assert env.block.idx == cb1.attr("sub_block")
    np.testing.assert_array_equal(env.saved[x.name], xv)


def test_cond_build_errors(fresh_programs):
    main, _ = fresh_programs
    x, s = _xs(main)
    with pytest.raises(TypeError, match="'pred' must be a bool"):
        L.cond(s, lambda: x, lambda: x)
    pred = L.less_than(s, s)
    with pytest.raises(TypeError, match="true_fn must be callable"):
        L.cond(pred, x, lambda: x)
    with pytest.raises(ValueError, match="true_fn returns None"):
        L.cond(pred, lambda: None, lambda: x)
    with pytest.raises(ValueError, match="sequence of 2 vs one of 1"):
        L.cond(pred, lambda: [x, x], lambda: [x])


@pytest.mark.parametrize("mode", MODES)
def test_runtime_predicate_of_many_elements_names_the_op(mode, fresh_programs):
    main, _ = fresh_programs
    x, _ = _xs(main)
    p = L.data(name="p", shape=[2], dtype="bool", append_batch_size=False)
    out = L.cond(p, lambda: x + 1.0, lambda: x - 1.0)
    with pytest.raises(fluid.OpRunError,
                       match=r"op 'conditional_block' \(block 0.*test_cond.py.*one element"):
        _run(mode, main, {"x": np.ones((2, 3), np.float32), "p": np.array([True, False])},
             [out])


@pytest.mark.parametrize("mode", MODES)
def test_failing_op_in_a_branch_is_named_and_the_scope_is_kept(mode, fresh_programs):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[-1, 3], dtype="float32", append_batch_size=False)
    q = L.data(name="q", shape=[-1, 3], dtype="float32", append_batch_size=False)
    s = L.data(name="s", shape=[1], dtype="float32", append_batch_size=False)
    w = L.create_parameter([3], "float32", name="w_cond",
                           default_initializer=fluid.initializer.Constant(1.0))

    def true_fn():
        L.assign(w + 1.0, w)
        return L.elementwise_mul(x, q)

    out = L.cond(L.less_than(s, L.fill_constant([1], "float32", 0.0)), true_fn, lambda: x)
    scope = fluid.Scope()
    exe = fluid.Executor(mode=mode)
    exe.run(startup, scope=scope)
    feed = {"x": np.ones((2, 3), np.float32), "q": np.ones((3, 3), np.float32),
            "s": np.array([-1.0], np.float32)}
    with pytest.raises(fluid.OpRunError) as info:
        exe.run(main, feed=feed, fetch_list=[out], scope=scope)
    assert info.value.op_type == "elementwise_mul" and info.value.block_idx == 1
    assert "test_cond.py" in info.value.location
    np.testing.assert_array_equal(scope.find_var("w_cond").value, np.ones(3, np.float32))
    feed["s"] = np.array([1.0], np.float32)  # the failing branch does not run
    (got,) = exe.run(main, feed=feed, fetch_list=[out], scope=scope)
    np.testing.assert_array_equal(got, feed["x"])
    np.testing.assert_array_equal(scope.find_var("w_cond").value, np.ones(3, np.float32))


@pytest.mark.parametrize("mode", MODES)
def test_select_output_writes_only_the_selected_output(mode, fresh_programs):
    main, _ = fresh_programs
    x, _ = _xs(main)
    m = L.data(name="m", shape=[1], dtype="int32", append_batch_size=False)
    block = main.global_block()
    o0 = block.create_var(name="o0", shape=[2, 3], dtype="float32")
    o1 = block.create_var(name="o1", shape=[2, 3], dtype="float32")
    block.append_op("select_output", inputs={"X": [x], "Mask": [m]}, outputs={"Out": [o0, o1]})
    sel = select_input([o0, o1], m)
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    for k, (want_name, other) in enumerate([(o0, o1), (o1, o0)]):
        feed = {"x": xv, "m": np.array([k], np.int32)}
        got, got_sel = _run(mode, main, feed, [want_name, sel])
        np.testing.assert_array_equal(got, xv)
        np.testing.assert_array_equal(got_sel, xv)
        with pytest.raises(fluid.PdjitError, match=f"{other.name!r}.*no value"):
            _run(mode, main, feed, [other])
    with pytest.raises(fluid.OpRunError, match=r"select_output.*Mask is 2"):
        _run(mode, main, {"x": xv, "m": np.array([2], np.int32)}, [o0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_type", ["conditional_block", "while"])
def test_non_bool_condition_at_run_time_names_the_op(mode, op_type, fresh_programs):
    """A program built (or loaded) without the layers' checks: the condition is float."""
    main, _ = fresh_programs
    x, s = _xs(main)
    out = main.global_block().create_var(name="out_cf", shape=[2, 3], dtype="float32")
    sub = main._create_block()
    L.assign(x * 2.0, out)
    main._rollback()
    scopes = main.global_block().create_var(name="scopes_cf", type=pb.VarType.STEP_SCOPES)
    if op_type == "while":
        main.global_block().append_op(
            "while", inputs={"X": [x], "Condition": [s]},
            outputs={"Out": [out], "StepScopes": [scopes]}, attrs={"sub_block": sub.idx})
    else:
        main.global_block().append_op(
            "conditional_block", inputs={"Cond": [s], "Input": [x]},
            outputs={"Out": [out], "Scope": [scopes]},
            attrs={"sub_block": sub.idx, "is_scalar_condition": True})
    feed = {"x": np.ones((2, 3), np.float32), "s": np.array([1.0], np.float32)}
    with pytest.raises(fluid.OpRunError,
                       match=rf"op '{op_type}' \(block 0, op #\d+\).*must be a bool tensor of "
                             rf"one element: expected bool\[1\], got float32 tensor"):
        _run(mode, main, feed, [out])
