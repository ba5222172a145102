"""The reference Executor and the Scope: feeds, fetches, errors, nothing lost on failure."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import FeedError, OpRunError

# op 'elementwise_div' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(elementwise_div)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")


def _counter_program():
    """main: acc += x (acc persistable, created by startup); y = x * 2."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
        acc = fluid.layers.create_global_var([2], 0.0, "float32", persistable=True, name="acc")
        total = fluid.layers.elementwise_add(acc, x)
        fluid.layers.assign(total, output=acc)
        y = fluid.layers.scale(x, scale=2.0)
    return main, startup, x, acc, y


def test_runs_and_updates_persistables():
    main, startup, x, acc, y = _counter_program()
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    np.testing.assert_array_equal(scope.find_var("acc").value, [0, 0])
    for _ in range(3):
        out_y, out_acc = exe.run(main, feed={"x": np.array([1, 2], np.float32)},
                                 fetch_list=[y, "acc"], scope=scope)
    np.testing.assert_array_equal(out_y, [2, 4])
    np.testing.assert_array_equal(out_acc, [3, 6])
    np.testing.assert_array_equal(np.array(scope.find_var("acc").get_tensor()), [3, 6])
    # temporaries do not leak into the scope; persistables do
    assert scope.find_var(y.name) is None


def test_fetched_arrays_alias_nothing():
    main, startup, x, acc, y = _counter_program()
    scope, exe = fluid.Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    (fetched,) = exe.run(main, feed={"x": np.ones(2, np.float32)}, fetch_list=[acc], scope=scope)
    fetched[:] = 100.0
    np.testing.assert_array_equal(scope.find_var("acc").value, [1, 1])
    feed = np.ones(2, np.float32)
    (out,) = exe.run(main, feed={"x": feed}, fetch_list=[x], scope=scope)
    out[:] = -1
    assert feed[0] == 1.0


def test_failed_run_leaves_the_scope_as_it_was():
    main, startup, x, acc, y = _counter_program()
    with fluid.program_guard(main, startup):
        idx = fluid.layers.data(name="idx", shape=[1], dtype="int64", append_batch_size=False)
        main.global_block().append_op(
            "cast", inputs={"X": idx}, outputs={"Out": main.global_block().create_var(name="c")},
            attrs={"in_dtype": 3, "out_dtype": 5})
        bad = main.global_block().create_var(name="bad")
        main.global_block().append_op("elementwise_div", inputs={"X": idx, "Y": idx},
                                      outputs={"Out": bad})
    scope, exe = fluid.Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": np.ones(2, np.float32), "idx": np.array([1])}, fetch_list=[acc],
            scope=scope)
    before = scope.find_var("acc").value.copy()
    with pytest.raises(OpRunError) as e:  # integer division by zero, after acc was updated
        exe.run(main, feed={"x": np.ones(2, np.float32), "idx": np.array([0])},
                fetch_list=[acc, bad], scope=scope)
    assert "op 'elementwise_div'" in str(e.value) and "division by zero" in str(e.value)
    assert "test_executor.py" in str(e.value)
    np.testing.assert_array_equal(scope.find_var("acc").value, before)


def test_feed_errors_name_the_variable_and_what_was_expected():
    main, startup, x, acc, y = _counter_program()
    scope, exe = fluid.Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    with pytest.raises(FeedError, match=r"variable 'x' expects dtype float32, got float64"):
        exe.run(main, feed={"x": np.ones(2)}, fetch_list=[y], scope=scope)
    with pytest.raises(FeedError, match=r"variable 'x' expects shape \[2\].*got \[3\]"):
        exe.run(main, feed={"x": np.ones(3, np.float32)}, fetch_list=[y], scope=scope)
    with pytest.raises(FeedError, match=r"variable 'nope' is not in the program"):
        exe.run(main, feed={"x": np.ones(2, np.float32), "nope": np.ones(1)}, scope=scope)
    with pytest.raises(FeedError, match=r"fetch: variable 'ghost' is not in the program"):
        exe.run(main, feed={"x": np.ones(2, np.float32)}, fetch_list=["ghost"], scope=scope)
    with pytest.raises(FeedError, match=r"reads 'x', which is not fed .*can be fed: 'x'"):
        exe.run(main, feed={}, fetch_list=[y], scope=scope)  # before any op runs
    with pytest.raises(FeedError, match="expected a numpy array"):
        exe.run(main, feed={"x": object()}, fetch_list=[y], scope=scope)
    with pytest.raises(TypeError, match="feed must be a dict"):
        exe.run(main, feed=[1, 2], scope=scope)
    # lists and scalars are converted to the declared dtype
    (out,) = exe.run(main, feed={"x": [1, 2]}, fetch_list=[y], scope=scope)
    assert out.dtype == np.float32 and out.tolist() == [2.0, 4.0]


def test_unknown_batch_size_accepts_any_size(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.relu(x)
    exe, scope = fluid.Executor(), fluid.Scope()
    for n in (1, 5, 17):
        (out,) = exe.run(main, feed={"x": -np.ones((n, 3), np.float32)}, fetch_list=[y],
                         scope=scope)
        assert out.shape == (n, 3) and not out.any()
    with pytest.raises(FeedError, match=r"expects shape \[-1, 3\]"):
        exe.run(main, feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[y], scope=scope)


def test_feed_and_fetch_containers_users_pass(fresh_programs):
    """Feeds as a dict, an OrderedDict or None (nothing to feed); fetches as a list, a list
    subclass, a tuple, one Variable or one name: the same values."""
    import collections

    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.scale(x, scale=3.0)
    exe, scope = fluid.Executor(), fluid.Scope()
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)

    class Fetches(list):
        pass

    for feed in ({"x": xv}, collections.OrderedDict(x=xv)):
        for fetch in ([y], Fetches([y]), (y,), y, y.name):
            (out,) = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
            np.testing.assert_array_equal(out, 3 * xv)
    assert exe.run(fluid.Program(), feed=None, fetch_list=None, scope=scope) == []


def test_scope_nesting_and_api():
    root = fluid.Scope()
    root.var("a").value = np.ones(1)
    kid = root.new_scope()
    kid.var("b").value = np.zeros(1)
    assert kid.find_var("a") is root.find_var("a")
    assert root.find_var("b") is None and kid.find_local_var("a") is None
    assert root.kids() == [kid]
    root.drop_kids()
    assert root.kids() == []
    t = root.var("c").get_tensor()
    t.set(np.arange(4, dtype=np.float32).reshape(2, 2), fluid.CPUPlace())
    np.testing.assert_array_equal(root.find_var("c").value, [[0, 1], [2, 3]])
    with fluid.scope_guard(kid):
        assert fluid.global_scope() is kid
    assert fluid.global_scope() is not kid


def test_executor_rejects_bad_arguments():
    with pytest.raises(TypeError, match="place must be"):
        fluid.Executor("cpu")
    with pytest.raises(ValueError, match="mode 'fast' is not one of"):
        fluid.Executor(mode="fast")
    with pytest.raises(TypeError, match="program must be a Program"):
        fluid.Executor().run(program="main")


def test_random_initialisers_are_reproducible_with_random_seed():
    def init(seed, exe=None):
        main, startup = fluid.Program(), fluid.Program()
        startup.random_seed = seed
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            fluid.layers.create_parameter([50, 40], "float32", name="w",
                                          default_initializer=fluid.initializer.Normal(0, 1))
        scope = fluid.Scope()
        (exe or fluid.Executor()).run(startup, scope=scope)
        return scope.find_var("w").value

    a, b, c = init(1), init(1), init(2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert abs(a.mean()) < 0.1 and abs(a.std() - 1) < 0.05


def _mlp_program():
    """main: y = x @ W0 + b0 ... @ W3 + b3 (eight parameters, written by no op of main)."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        t = x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        for _ in range(4):
            t = fluid.layers.fc(t, size=4)
    names = [p.name for p in main.global_block().all_parameters()]
    assert len(names) == 8
    return main, startup, x, t, names


def test_a_step_sees_its_parameters_replaced_between_runs():
    """A native step of enough parameters passes on the ones it found last run without
    looking them up again while nothing moved them: a value set again, a variable erased and
    made again, another Scope: each run computes with the Scope's parameters of that run
    (NumPy's products)."""
    main, startup, x, y, names = _mlp_program()
    exe = fluid.Executor(fluid.CPUPlace())
    scopes = [fluid.Scope(), fluid.Scope()]
    for s in scopes:
        exe.run(startup, scope=s)
    xv = np.arange(8, dtype=np.float32).reshape(2, 4) / 8

    def check(scope):
        (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y], scope=scope)
        want = xv
        for k in range(4):
            w, b = (scope.find_var(names[2 * k + j]).value for j in range(2))
            want = want @ w + b
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    for _ in range(4):
        check(scopes[0])
    steps = [s for _, plan in exe._plans.values() for s in plan.steps if s.kind == "native"]
    assert steps and any(s._kept is not None for s in steps)  # (the shortcut serves)
    w, b = names[2], names[3]
    rng = np.random.default_rng(0)
    scopes[0].find_var(w).value = rng.standard_normal((4, 4)).astype(np.float32)
    check(scopes[0])
    scopes[0].find_var(b).get_tensor().set(np.full(4, 2.0, np.float32), fluid.CPUPlace())
    check(scopes[0])
    scopes[0].find_var(w).value[0] = 5.0  # (in place: the same array)
    check(scopes[0])
    scopes[0].erase([w])
    scopes[0].var(w).value = rng.standard_normal((4, 4)).astype(np.float32)
    check(scopes[0])
    check(scopes[0])
    for _ in range(3):  # (two Scopes by turns)
        check(scopes[1])
        check(scopes[0])
    del x
