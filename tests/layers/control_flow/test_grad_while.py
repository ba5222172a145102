"""Gradients through ``while_loop`` / ``While`` (step scopes), a ``cond`` nested in a loop, and
tensor arrays, against finite differences in both executor modes."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import check_program_grad

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(read_from_array|read_from_array_grad|sum_array|tensor_array_to_tensor"
    r"|tensor_array_to_tensor_grad|write_to_array|write_to_array_grad)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers


def _data(name, shape, dtype="float64"):
    return L.data(name=name, shape=shape, dtype=dtype, append_batch_size=False)


def _recurrence():
    """h = tanh(h @ w + b), n times (n fed): w and b are loop-invariant parameters."""
    x = _data("x", [2, 3])
    n = _data("n", [1], "int64")
    w = L.create_parameter(shape=[3, 3], dtype="float64", name="w")
    b = L.create_parameter(shape=[3], dtype="float64", name="b",
                           default_initializer=fluid.initializer.Uniform(-0.5, 0.5))
    i = L.fill_constant(shape=[1], dtype="int64", value=0)
    h = L.assign(x)

    def body(i, h):
        return [L.increment(i, in_place=False), L.tanh(L.elementwise_add(L.matmul(h, w), b))]

    _, h = L.while_loop(lambda i, h: L.less_than(i, n), body, [i, h])
    return h, [x, w, b]


def _numpy_recurrence(x, w, b, n, weights):
    hs = [x]
    for _ in range(n):
        hs.append(np.tanh(hs[-1] @ w + b))
    g = weights.copy()
    gw, gb = np.zeros_like(w), np.zeros_like(b)
    for k in range(n, 0, -1):
        dz = g * (1 - hs[k] ** 2)
        gw += hs[k - 1].T @ dz
        gb += dz.sum(0)
        g = dz @ w.T
    return g, gw, gb


@pytest.mark.parametrize("n", [0, 1, 4])
def test_while_loop_recurrence_with_loop_invariant_parameters(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(2, 3))
    got = check_program_grad(_recurrence, {"x": x, "n": np.array([n], np.int64)})
    # the checker's own oracle, cross-checked by a hand-written backward through time
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        _recurrence()
    scope = fluid.Scope()
    fluid.Executor(mode="reference").run(startup, scope=scope)
    w, b = (np.asarray(scope.find_var(k).value) for k in ("w", "b"))
    weights = np.random.default_rng(0).uniform(0.5, 1.5, size=(2, 3))
    gx, gw, gb = _numpy_recurrence(x, w, b, n, weights)
    np.testing.assert_allclose(got["x"], gx, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["w"], gw, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["b"], gb, rtol=1e-9, atol=1e-12)


def _while_guard_program():
    """The Fluid 1.x ``While`` block guard: x = x * s + tanh(x), two loop-carried floats."""
    x = _data("x", [4])
    s = _data("s", [4])
    i = L.fill_constant(shape=[1], dtype="int64", value=0)
    n = L.fill_constant(shape=[1], dtype="int64", value=3)
    acc = L.fill_constant(shape=[4], dtype="float64", value=0.0)
    h = L.assign(x)
    c = L.less_than(i, n)
    loop = L.While(c)
    with loop.block():
        h2 = h * s + L.tanh(h)
        L.assign(h2, h)
        L.assign(acc + h2 * h2, acc)
        L.increment(i, in_place=True)
        L.less_than(i, n, cond=c)
    return acc, [x, s]


def test_while_block_guard_with_two_carried_variables():
    rng = np.random.default_rng(7)
    check_program_grad(_while_guard_program, {"x": rng.uniform(-1, 1, 4),
                                              "s": rng.uniform(0.5, 1.0, 4)})


def _cond_in_while():
    """Each step: h = cond(sum(h) > 0, h * a, tanh(h) - a): which branch runs changes per
    step."""
    x = _data("x", [3])
    a = _data("a", [3])
    i = L.fill_constant(shape=[1], dtype="int64", value=0)
    h = L.assign(x)

    def body(i, h):
        positive = L.greater_than(L.reduce_sum(h), L.fill_constant([1], "float64", 0.0))
        h2 = L.cond(positive, lambda: h * a, lambda: L.tanh(h) - a)
        return [L.increment(i, in_place=False), h2]

    limit = L.fill_constant(shape=[1], dtype="int64", value=4)
    _, h = L.while_loop(lambda i, h: L.less_than(i, limit), body, [i, h])
    return h, [x, a]


@pytest.mark.parametrize("start", [[0.3, 0.2, 0.4], [-0.9, 0.1, -0.2]])
def test_cond_nested_in_while(start):
    check_program_grad(_cond_in_while, {"x": np.array(start), "a": np.array([0.8, -1.1, 0.6])})


def _array_program(read):
    """Write h_k = tanh(h_{k-1} * w) into an array for k = 0..3, then read it back."""
    x = _data("x", [2])
    w = _data("w", [2])
    arr = L.create_array("float64")
    i = L.fill_constant(shape=[1], dtype="int64", value=0)
    n = L.fill_constant(shape=[1], dtype="int64", value=4)
    h = L.assign(x)
    c = L.less_than(i, n)
    loop = L.While(c)
    with loop.block():
        h2 = L.tanh(h * w)
        L.array_write(h2, i, array=arr)
        L.assign(h2, h)
        L.increment(i, in_place=True)
        L.less_than(i, n, cond=c)
    if read == "stack":
        out, _ = L.tensor_array_to_tensor(arr, axis=0, use_stack=True)
    elif read == "concat":
        out, _ = L.tensor_array_to_tensor(arr, axis=0)
    else:  # two elements read back: the array's gradient has two producers
        one = L.fill_constant(shape=[1], dtype="int64", value=1)
        three = L.fill_constant(shape=[1], dtype="int64", value=3)
        out = L.array_read(arr, one) * 2.0 + L.array_read(arr, three)
    return out, [x, w]


@pytest.mark.parametrize("read", ["stack", "concat", "array_read"])
def test_tensor_array_written_in_a_loop(read):
    rng = np.random.default_rng(3)
    check_program_grad(lambda: _array_program(read), {"x": rng.uniform(-1, 1, 2),
                                                      "w": rng.uniform(0.5, 1.5, 2)})


def _overwritten_then_read():
    """Each step overwrites h, then reads the new h: the gradient needs h's value after the
    write, which the backward pass copies in the loop body."""
    x, s = _data("x", [3]), _data("s", [3])
    i = L.fill_constant(shape=[1], dtype="int64", value=0)
    n = L.fill_constant(shape=[1], dtype="int64", value=2)
    acc = L.fill_constant(shape=[3], dtype="float64", value=0.0)
    h = L.assign(x)
    c = L.less_than(i, n)
    loop = L.While(c)
    with loop.block():
        L.assign(L.tanh(h), h)
        L.assign(acc + h * s, acc)   # reads the h this iteration just wrote
        L.increment(i, in_place=True)
        L.less_than(i, n, cond=c)
    return acc, [x, s]


def test_reading_a_carried_variable_after_overwriting_it():
    rng = np.random.default_rng(11)
    x, s = rng.uniform(-1, 1, 3), rng.uniform(0.5, 1.5, 3)
    got = check_program_grad(_overwritten_then_read, {"x": x, "s": s})
    # by hand: acc = s * (tanh(x) + tanh(tanh(x))), weighted by the checker's W
    w = np.random.default_rng(0).uniform(0.5, 1.5, size=3)
    t1 = np.tanh(x)
    t2 = np.tanh(t1)
    np.testing.assert_allclose(got["s"], w * (t1 + t2), rtol=1e-9)
    np.testing.assert_allclose(got["x"], w * s * (1 - t1 ** 2) * (1 + (1 - t2 ** 2)),
                               rtol=1e-9)


def test_a_while_built_for_test_has_no_gradient(fresh_programs):
    x = _data("x", [3])
    i = L.fill_constant(shape=[1], dtype="int64", value=0)
    n = L.fill_constant(shape=[1], dtype="int64", value=2)
    _, h = L.while_loop(lambda i, h: L.less_than(i, n),
                        lambda i, h: [L.increment(i, in_place=False), L.tanh(h)],
                        [i, L.assign(x)], is_test=True)
    with pytest.raises(fluid.ProgramError, match="is_test=True"):
        fluid.gradients([h], [x])
