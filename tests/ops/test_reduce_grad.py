"""Gradients of the reductions: reduce_*, mean, sum (add_n) and top_k / top_k_v2.

``check_grad`` compares the backward pass's gradient (both executor modes) with float64
central differences, on a specific axis, keep_dim, a negative axis and reduce_all. Inputs for
max/min/top_k have distinct, well separated values so the selection does not change under the
finite-difference step; Paddle's rule for ties (an equal share each) is checked directly.
"""
import numpy as np
import pytest

from pdjit.framework import registry
from pdjit.framework.program import Program
from pdjit.passes.backward import append_backward, gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import check_output
from pdjit.testing.grad_check import check_grad

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(top_k_grad|top_k_v2|top_k_v2_grad)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(11)
SHAPE = (3, 4)
SHAPE3 = (2, 3, 4)

CASES = [  # (shape, attrs)
    (SHAPE, {"dim": [1]}),
    (SHAPE, {"dim": [0], "keep_dim": True}),
    (SHAPE3, {"dim": [-1, 0]}),
    (SHAPE3, {"dim": [1], "reduce_all": True, "keep_dim": True}),
]


def _distinct(shape):
    """A permutation of well separated values (gaps 0.25 >> the 1e-6 step), signs mixed."""
    n = int(np.prod(shape))
    return (RNG.permutation(n) * 0.25 - n * 0.1).reshape(shape) + 0.05


def _away_from_zero(shape):
    return RNG.uniform(0.5, 1.5, shape) * RNG.choice([-1.0, 1.0], shape)


@pytest.mark.parametrize("shape, attrs", CASES)
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
                                "reduce_prod"])
def test_reduce_grad_matches_finite_differences(op, shape, attrs):
    make = _distinct if op in ("reduce_max", "reduce_min") else _away_from_zero
    check_grad(op, {"X": make(shape)}, attrs)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
                                "reduce_prod"])
def test_reduce_grad_slots_are_paddles(op):
    prog = Program()
    b = prog.global_block()
    x = b.create_var(name="x", shape=[3, 4], dtype="float32")
    out = b.create_var(name="out", dtype="float32")
    b.append_op(op, inputs={"X": [x]}, outputs={"Out": [out]},
                attrs={"dim": [1], "keep_dim": True})
    gradients([out], [x])
    g = b.ops[-1]
    assert g.type == f"{op}_grad"
    want = {"X": ["x"], "Out@GRAD": ["out@GRAD"]}
    if op in ("reduce_max", "reduce_min", "reduce_prod"):
        want["Out"] = ["out"]
    assert {s: g.input(s) for s in g.input_names if g.input(s)} == want
    assert g.output("X@GRAD") == ["x@GRAD"]
    assert g.attr("dim") == [1] and g.attr("keep_dim") is True


def test_max_min_grad_share_ties_equally_like_paddle():
    """Paddle 3.3.1 (run): reduce_max of [[1, 3, 3], [2, 2, 0]] over dim 1 gives
    [[0, .5, .5], [.5, .5, 0]] as the gradient of sum(Out)."""
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    g = np.array([1.0, 4.0])
    dx = {"X@GRAD": 1}
    check_output("reduce_max_grad", {"X": x, "Out": x.max(1), "Out@GRAD": g}, {"dim": [1]},
                 {"X@GRAD": np.array([[0, 0.5, 0.5], [2, 2, 0]])}, outputs=dx)
    check_output("reduce_min_grad", {"X": x, "Out": x.min(1), "Out@GRAD": g}, {"dim": [1]},
                 {"X@GRAD": np.array([[1.0, 0, 0], [0, 0, 4]])}, outputs=dx)
    xa = np.array([[5.0, 1.0], [5.0, 5.0]], np.float32)
    check_output("reduce_max_grad", {"X": xa, "Out": np.float32(5), "Out@GRAD": np.float32(3)},
                 {"dim": [], "reduce_all": True},
                 {"X@GRAD": np.array([[1, 0], [1, 1]], np.float32)}, outputs=dx)


def test_prod_grad_is_exact_at_zeros():
    """d prod / dx_i = product of the others, also where X holds zeros (Paddle: NaN there)."""
    x = np.array([[1.0, 0.0, 3.0], [0.0, 0.0, 2.0], [2.0, 3.0, 4.0]])
    g = np.array([1.0, 1.0, 2.0])
    want = np.array([[0.0, 3.0, 0.0], [0.0, 0.0, 0.0], [24.0, 16.0, 12.0]])
    check_output("reduce_prod_grad", {"X": x, "Out": x.prod(1), "Out@GRAD": g}, {"dim": [1]},
                 {"X@GRAD": want}, outputs={"X@GRAD": 1})
    check_grad("reduce_prod", {"X": x}, {"dim": [1]})


@pytest.mark.parametrize("shape", [SHAPE, SHAPE3])
def test_mean_grad(shape):
    check_grad("mean", {"X": RNG.uniform(-1, 1, shape)})


@pytest.mark.parametrize("shape", [SHAPE, SHAPE3])
def test_top_k_grad(shape):
    check_grad("top_k", {"X": _distinct(shape)}, {"k": 2})


@pytest.mark.parametrize("shape, attrs", [
    (SHAPE, {"k": 2, "axis": 0, "largest": False}),
    (SHAPE3, {"k": 3, "axis": 1, "largest": True}),
])
def test_top_k_v2_grad(shape, attrs):
    check_grad("top_k_v2", {"X": _distinct(shape)}, attrs)


def test_top_k_grad_slots_and_scatter():
    x = np.array([[1.0, 3.0, 3.0, 2.0]])
    check_output("top_k_grad", {"X": x, "Indices": np.array([[1, 2]]),
                                "Out@GRAD": np.array([[5.0, 7.0]])}, {"k": 2},
                 {"X@GRAD": np.array([[0.0, 5.0, 7.0, 0.0]])}, outputs={"X@GRAD": 1})
    d = registry.get("top_k_v2_grad")
    assert [s.name for s in d.inputs] == ["X", "K", "Indices", "Out@GRAD"]
    assert registry.get("arg_max").grad is None and registry.get("arg_min").grad is None


def _sum_program(n_inputs, repeat_first=False):
    prog = Program()
    b = prog.global_block()
    xs = [b.create_var(name=f"x{i}", shape=list(SHAPE), dtype="float64", need_check_feed=True)
          for i in range(n_inputs)]
    ins = xs + [xs[0]] if repeat_first else xs
    out = b.create_var(name="out", dtype="float64")
    loss = b.create_var(name="loss", dtype="float64")
    b.append_op("sum", inputs={"X": ins}, outputs={"Out": [out]})
    b.append_op("square", inputs={"X": [out]}, outputs={"Out": [loss]})
    return prog, xs, loss


@pytest.mark.parametrize("repeat_first", [False, True])
def test_sum_grad_is_one_scale_per_input(repeat_first):
    prog, xs, loss = _sum_program(3, repeat_first)
    w = np.arange(12.0).reshape(SHAPE)  # seed: d(sum(w * loss))
    b = prog.global_block()
    seed = b.create_var(name="w", shape=list(SHAPE), dtype="float64", need_check_feed=True)
    grads = gradients([loss], xs, target_gradients=[seed])
    scales = [op for op in b.ops if op.type == "scale"]
    assert len(scales) == 3 + repeat_first
    assert all(op.input("X") == ["out@GRAD"] and op.attr("scale") == 1.0 for op in scales)
    vals = [RNG.uniform(-1, 1, SHAPE) for _ in xs]
    total = sum(vals) + (vals[0] if repeat_first else 0)
    d_out = w * 2 * total
    feed = {f"x{i}": v for i, v in enumerate(vals)}
    feed["w"] = w
    for mode in ("reference", "compiled"):
        got = Executor(mode=mode).run(prog, feed=feed, fetch_list=grads, scope=Scope())
        np.testing.assert_allclose(got[0], d_out * (2 if repeat_first else 1), rtol=1e-12)
        for g in got[1:]:
            np.testing.assert_allclose(g, d_out, rtol=1e-12)


def test_chain_append_backward_matches_numpy():
    """loss = mean(reduce_max(square(w), dim=1) + reduce_sum(w, dim=1)) via sum (add_n)."""
    prog = Program()
    b = prog.global_block()
    w = b.create_parameter(name="w", shape=list(SHAPE), dtype="float64")
    sq = b.create_var(name="sq", shape=list(SHAPE), dtype="float64")
    mx = b.create_var(name="mx", shape=[3], dtype="float64")
    sm = b.create_var(name="sm", shape=[3], dtype="float64")
    tot = b.create_var(name="tot", shape=[3], dtype="float64")
    loss = b.create_var(name="loss", shape=[], dtype="float64")
    b.append_op("square", inputs={"X": [w]}, outputs={"Out": [sq]})
    b.append_op("reduce_max", inputs={"X": [sq]}, outputs={"Out": [mx]}, attrs={"dim": [1]})
    b.append_op("reduce_sum", inputs={"X": [w]}, outputs={"Out": [sm]}, attrs={"dim": [1]})
    b.append_op("sum", inputs={"X": [mx, sm]}, outputs={"Out": [tot]})
    b.append_op("mean", inputs={"X": [tot]}, outputs={"Out": [loss]})
    ((_, gw),) = append_backward(loss)

    wv = _distinct(SHAPE)
    arg = np.argmax(wv * wv, axis=1)
    want = np.full(SHAPE, 1 / 3)                         # from reduce_sum, through mean
    want[np.arange(3), arg] += 2 * wv[np.arange(3), arg] / 3  # from max(square)
    for mode in ("reference", "compiled"):
        scope = Scope()
        scope.var("w").value = wv.copy()
        (g,) = Executor(mode=mode).run(prog, feed={}, fetch_list=[gw], scope=scope)
        np.testing.assert_allclose(g, want, rtol=1e-12)
