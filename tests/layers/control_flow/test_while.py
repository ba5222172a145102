"""``while`` / ``While`` / ``while_loop`` against plain Python loops, in both executor modes; the
step-scope contract (``pdjit.runtime.context.StepScopes``) the backward pass relies on."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.runtime.context import Env

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(elementwise_floordiv|elementwise_mod)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
MODES = ["reference", "compiled"]


def _run(mode, main, feed, fetch, scope=None):
    return fluid.Executor(mode=mode).run(main, feed=feed, fetch_list=fetch,
                                         scope=scope or fluid.Scope())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("limit", [0, 1, 7])
def test_while_loop_counter_and_carried_tensor(mode, limit, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[2, 3], dtype="float32", append_batch_size=False)
    n = L.data(name="n", shape=[1], dtype="int64", append_batch_size=False)
    i = L.fill_constant([1], "int64", 0)
    i_out, x_out = L.while_loop(lambda i, x: L.less_than(i, n),
                                lambda i, x: [i + 1, x * 2.0 + 1.0], [i, x])
    xv = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    got_i, got_x = _run(mode, main, {"x": xv, "n": np.array([limit], np.int64)}, [i_out, x_out])
    want = xv.copy()
    k = 0
    while k < limit:
        k, want = k + 1, want * np.float32(2) + np.float32(1)
    assert got_i.tolist() == [limit]
    np.testing.assert_allclose(got_x, want, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_while_block_guard_with_increment_and_cond_out(mode, fresh_programs):
    """Fluid 1.x style: the body updates the condition with ``less_than(..., cond=c)``."""
    main, _ = fresh_programs
    x = L.data(name="x", shape=[3], dtype="float64", append_batch_size=False)
    i = L.fill_constant([1], "int64", 0)
    limit = L.fill_constant([1], "int64", 5)
    acc = L.fill_constant([3], "float64", 0.0)
    c = L.less_than(i, limit)
    loop = L.While(c)
    with loop.block():
        L.assign(acc + x * L.cast(i, "float64"), acc)
        L.increment(i, 1.0, in_place=True)
        L.less_than(i, limit, cond=c)
    xv = np.array([1.0, -2.0, 0.5])
    got_acc, got_i, got_c = _run(mode, main, {"x": xv}, [acc, i, c])
    assert got_i.tolist() == [5] and got_c.tolist() == [False]
    np.testing.assert_allclose(got_acc, xv * sum(range(5)))
    (op,) = [op for op in main.global_block().ops if op.type == "while"]
    assert set(op.output("Out")) >= {acc.name, i.name, c.name}
    assert set(op.input("X")) >= {x.name, acc.name, i.name, limit.name}


@pytest.mark.parametrize("mode", MODES)
def test_nested_while_loops(mode, fresh_programs):
    main, _ = fresh_programs
    n = L.data(name="n", shape=[1], dtype="int64", append_batch_size=False)
    i = L.fill_constant([1], "int64", 0)
    total = L.fill_constant([1], "int64", 0)

    def outer(i, total):
        j = L.fill_constant([1], "int64", 0)
        _, t = L.while_loop(lambda j, t: L.less_than(j, i), lambda j, t: [j + 1, t + j],
                            [j, total])
        return [i + 1, t]

    _, t_out = L.while_loop(lambda i, t: L.less_than(i, n), outer, [i, total])
    for nv in (0, 1, 5):
        (got,) = _run(mode, main, {"n": np.array([nv], np.int64)}, [t_out])
        want = sum(j for k in range(nv) for j in range(k))
        assert got.tolist() == [want]


@pytest.mark.parametrize("mode", MODES)
def test_cond_inside_while(mode, fresh_programs):
    """Collatz steps: the body branches on the parity of the carried value."""
    main, _ = fresh_programs
    v = L.data(name="v", shape=[1], dtype="int64", append_batch_size=False)
    steps = L.fill_constant([1], "int64", 0)
    one = L.fill_constant([1], "int64", 1)
    two = L.fill_constant([1], "int64", 2)

    def body(v, steps):
        even = L.equal(L.elementwise_mod(v, two), L.fill_constant([1], "int64", 0))
        nxt = L.cond(even, lambda: L.elementwise_floordiv(v, two), lambda: v * 3 + 1)
        return [nxt, steps + 1]

    _, s_out = L.while_loop(lambda v, s: L.greater_than(v, one), body, [v, steps])
    for start in (1, 6, 27):
        (got,) = _run(mode, main, {"v": np.array([start], np.int64)}, [s_out])
        k, s = start, 0
        while k > 1:
            k, s = (k // 2 if k % 2 == 0 else 3 * k + 1), s + 1
        assert got.tolist() == [s]


@pytest.mark.parametrize("mode", MODES)
def test_step_scopes_keep_one_env_per_iteration_with_saved_inputs(mode, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
    i = L.fill_constant([1], "int64", 0)
    three = L.fill_constant([1], "int64", 3)
    L.while_loop(lambda i, x: L.less_than(i, three), lambda i, x: [i + 1, x * 2.0], [i, x])
    (op,) = [op for op in main.global_block().ops if op.type == "while"]
    xv = np.array([1.0, -1.0], np.float32)
    (scopes,) = _run(mode, main, {"x": xv}, [op.output("StepScopes")[0]])
    assert len(scopes) == 3  # (fetched as a list of the envs)
    body = main.block(op.attr("sub_block"))
    for k, env in enumerate(scopes):
        assert isinstance(env, Env) and env.block.idx == body.idx
        assert set(env.saved) == set(op.input("X"))
        np.testing.assert_allclose(env.saved[x.name], xv * 2.0 ** k)
        assert env.saved[i.name].tolist() == [k]
        local = [n for n in env.values if body.has_var(n)]
        assert local and all(body.has_var(n) for n in env.values)


@pytest.mark.parametrize("mode", MODES)
def test_is_test_keeps_no_step_scopes(mode, fresh_programs):
    main, _ = fresh_programs
    i = L.fill_constant([1], "int64", 0)
    three = L.fill_constant([1], "int64", 3)
    (i_out,) = L.while_loop(lambda i: L.less_than(i, three), lambda i: [i + 1], [i],
                            is_test=True)
    (op,) = [op for op in main.global_block().ops if op.type == "while"]
    assert op.attr("is_test") is True
    got_i, scopes = _run(mode, main, {}, [i_out, op.output("StepScopes")[0]])
    assert got_i.tolist() == [3] and len(scopes) == 0


def test_while_condition_must_be_one_bool(fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
    with pytest.raises(TypeError, match="bool"):
        L.While(x)
    two = L.data(name="two", shape=[2], dtype="bool", append_batch_size=False)
    with pytest.raises(TypeError, match="one element"):
        L.While(two)
    with pytest.raises(TypeError, match="callable"):
        L.while_loop(None, lambda v: v, [x])
    with pytest.raises(ValueError, match="must not be empty"):
        L.while_loop(lambda: two, lambda: [], [])
    i = L.fill_constant([1], "int64", 0)
    with pytest.raises(ValueError, match="as many values"):
        L.while_loop(lambda i: L.less_than(i, i), lambda i: [i, i], [i])


@pytest.mark.parametrize("mode", MODES)
def test_runtime_condition_of_many_elements_names_the_while_op(mode, fresh_programs):
    main, _ = fresh_programs
    c = L.data(name="c", shape=[-1], dtype="bool", append_batch_size=False)
    loop = L.While(c)
    with loop.block():
        L.assign(L.logical_not(c), c)
    with pytest.raises(fluid.OpRunError, match=r"op 'while' \(block 0.*one element"):
        _run(mode, main, {"c": np.array([True, False])}, [c])


@pytest.mark.parametrize("mode", MODES)
def test_failing_op_inside_the_body_is_named_and_the_scope_is_kept(mode, fresh_programs):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[-1, 3], dtype="float32", append_batch_size=False)
    q = L.data(name="q", shape=[-1, 3], dtype="float32", append_batch_size=False)
    w = L.create_parameter([3], "float32", name="w_cf",
                           default_initializer=fluid.initializer.Constant(0.5))
    i = L.fill_constant([1], "int64", 0)
    two = L.fill_constant([1], "int64", 2)

    def body(i, x):
        L.assign(w * 2.0, w)        # a persistable written inside the loop, before the failure
        y = L.elementwise_add(x, q)  # fails at run time: 4 rows + 5 rows
        return [i + 1, y]

    L.while_loop(lambda i, x: L.less_than(i, two), body, [i, x])
    scope = fluid.Scope()
    exe = fluid.Executor(mode=mode)
    exe.run(startup, scope=scope)
    before = np.array(scope.find_var("w_cf").value, copy=True)
    feed = {"x": np.ones((4, 3), np.float32), "q": np.ones((5, 3), np.float32)}
    with pytest.raises(fluid.OpRunError) as info:
        exe.run(main, feed=feed, fetch_list=[x], scope=scope)
    err = info.value
    assert err.op_type == "elementwise_add" and err.block_idx == 1
    assert err.location and "test_while.py" in err.location
    np.testing.assert_array_equal(scope.find_var("w_cf").value, before)
    feed["q"] = np.ones((4, 3), np.float32)  # the same executor runs it once the input fits
    (got,) = exe.run(main, feed=feed, fetch_list=[x], scope=scope)
    np.testing.assert_allclose(got, np.full((4, 3), 3.0))
    np.testing.assert_allclose(scope.find_var("w_cf").value, before * 4)
