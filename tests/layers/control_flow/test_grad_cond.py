"""Gradients through ``cond`` and ``IfElse`` against finite differences, in both executor modes.

The oracle is ``pdjit.testing.check_program_grad``: float64 central differences of
``sum(W * out)`` run by the reference interpreter; a few gradients are also written out in
NumPy here so that the checker itself is checked.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import check_program_grad

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(merge_lod_tensor|split_lod_tensor)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers


def _data(name, shape, dtype="float64"):
    return L.data(name=name, shape=shape, dtype=dtype, append_batch_size=False)


def _cond_program():
    x, y = _data("x", [3]), _data("y", [3])
    p = _data("p", [1], "bool")
    out = L.cond(p, lambda: L.tanh(x) * y, lambda: x * x)
    return out, [x, y]


@pytest.mark.parametrize("taken", [True, False])
def test_cond_gradients_follow_the_branch_taken(taken):
    xv, yv = np.array([0.1, -0.5, 0.7]), np.array([1.0, 2.0, -3.0])
    g = check_program_grad(_cond_program, {"x": xv, "y": yv, "p": np.array([taken])})
    w = np.random.default_rng(0).uniform(0.5, 1.5, size=3)  # the checker's weights (seed 0)
    if taken:
        np.testing.assert_allclose(g["x"], w * yv * (1 - np.tanh(xv) ** 2), rtol=1e-10)
        np.testing.assert_allclose(g["y"], w * np.tanh(xv), rtol=1e-10)
    else:  # y is read only by the branch that did not run: its gradient is zero
        np.testing.assert_allclose(g["x"], w * 2 * xv, rtol=1e-10)
        np.testing.assert_array_equal(g["y"], np.zeros(3))


def _cond_with_parameters():
    x = _data("x", [2, 4])
    p = _data("p", [1], "bool")
    h = L.fc(x, 3, act="tanh", name="shared")

    def true_fn():
        return L.fc(h, 2, name="branch_t")

    def false_fn():
        return L.sigmoid(L.fc(h, 2, name="branch_f")) * 2.0

    return L.cond(p, true_fn, false_fn), [x]


@pytest.mark.parametrize("taken", [True, False])
def test_cond_with_parameters_inside_the_branches(taken):
    rng = np.random.default_rng(1)
    feed = {"x": rng.normal(size=(2, 4)), "p": np.array([taken])}
    check_program_grad(_cond_with_parameters, feed)

    def build():
        out, _ = _cond_with_parameters()
        prog = out.block.program
        return out, [v for v in prog.global_block().all_parameters()]
    got = check_program_grad(build, feed, method="append_backward")
    unused = "branch_f" if taken else "branch_t"
    for name, g in got.items():
        if name.startswith(unused):
            assert not np.any(g), f"{name}: its branch did not run, expected zeros"
        else:
            assert np.any(g), f"{name}: expected a gradient"


def _ifelse_program():
    x = L.data(name="x", shape=[3], dtype="float64")
    label = L.data(name="label", shape=[1], dtype="int64")
    limit = L.fill_constant_batch_size_like(input=label, dtype="int64", shape=[-1, 1], value=5.0)
    cond = L.less_than(x=label, y=limit)
    ie = L.IfElse(cond)
    with ie.true_block():
        xt = ie.input(x)
        ie.output(L.fc(L.fc(xt, 4, act="tanh", name="t0"), 2, act="softmax", name="t1"))
    with ie.false_block():
        xf = ie.input(x)
        ie.output(L.fc(L.fc(xf, 5, act="tanh", name="f0"), 2, act="softmax", name="f1"))
    prob = ie()[0]
    return prob, [x]


@pytest.mark.parametrize("labels", [[1, 7, 3, 9, 5], [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]],
                         ids=["mixed", "all-true", "all-false"])
def test_ifelse_rows_split_and_merged(labels):
    rng = np.random.default_rng(2)
    feed = {"x": rng.normal(size=(len(labels), 3)),
            "label": np.array(labels, np.int64).reshape(-1, 1)}
    check_program_grad(_ifelse_program, feed)

    def build():
        out, _ = _ifelse_program()
        return out, out.block.program.global_block().all_parameters()
    got = check_program_grad(build, feed, method="append_backward")
    rows_true = sum(lbl < 5 for lbl in labels)
    for name, g in got.items():
        idle = (name.startswith("t") and rows_true == 0) or \
            (name.startswith("f") and rows_true == len(labels))
        assert np.any(g) != idle, f"{name}: gradient {g}"


def _switch_program():
    """Fluid's Switch updating one variable in place: h = h * s if p else tanh(h) - s."""
    x, s = _data("x", [3]), _data("s", [3])
    p = _data("p", [1], "bool")
    h = L.assign(x)
    with L.Switch() as switch:
        with switch.case(p):
            L.assign(h * s, h)
        with switch.default():
            L.assign(L.tanh(h) - s, h)
    return h * 1.0, [x, s]


@pytest.mark.parametrize("taken", [True, False])
def test_switch_writing_a_variable_it_reads(taken):
    """The case that did not run leaves the variable, and its gradient, as they were."""
    xv, sv = np.array([0.3, -0.6, 0.9]), np.array([1.5, -0.5, 2.0])
    g = check_program_grad(_switch_program, {"x": xv, "s": sv, "p": np.array([taken])})
    w = np.random.default_rng(0).uniform(0.5, 1.5, size=3)
    np.testing.assert_allclose(g["x"], w * (sv if taken else 1 - np.tanh(xv) ** 2),
                               rtol=1e-10)
    np.testing.assert_allclose(g["s"], w * (xv if taken else -1.0), rtol=1e-10)


def test_switch_overwriting_a_value_on_the_gradient_path_is_refused(fresh_programs):
    x = _data("x", [3])
    p = _data("p", [1], "bool")
    h = L.assign(L.tanh(x))            # the value a case that does not run leaves in h
    with L.Switch() as switch:
        with switch.case(p):
            L.assign(x * 2.0, h)       # writes h without reading it
    with pytest.raises(fluid.ProgramError, match=f"may leave '{h.name}'"):
        fluid.gradients([h * 1.0], [x])
