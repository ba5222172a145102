"""Gradients of the unary elementwise ops (activations, scale, clip, cast, assign).

Each differentiable op is checked with ``check_grad`` (the backward pass's gradient against
float64 central differences) on two shapes, with inputs kept away from the points where the op
is not differentiable: in both executor modes on the first shape, in the reference mode on the
second. (The grad ops' templates are scalar expressions, so one compiled shape checks them; a
compiled kernel per op and shape would double this file's cold-cache time, ~5 s each.)
Paddle's choices at those points, and the slots of its grad ops, are checked separately, as is
fusion of the grad ops by the compiler.
"""
import numpy as np
import pytest

from pdjit.framework import dtypes, registry
from pdjit.framework.program import Program
from pdjit.passes.backward import append_backward, gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import check_output
from pdjit.testing.grad_check import check_grad

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(clip_grad|scale)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(7)
SHAPES = [(3, 4), (2, 1, 3)]


def _modes(shape):
    """Both executor modes on the first shape, the reference on the others (see above)."""
    return None if shape == SHAPES[0] else ["reference"]


def _signed(shape, low=0.2, high=2.0):
    """Values with |x| in [low, high] and random signs: away from 0, where kinks sit."""
    return RNG.uniform(low, high, shape) * RNG.choice([-1.0, 1.0], shape)


def _positive(shape, low=0.3, high=3.0):
    return RNG.uniform(low, high, shape)


# op -> (input maker, attrs, which forward value Paddle's grad op reads)
UNARY = {
    "relu": (_signed, {}, "Out"),
    "leaky_relu": (_signed, {"alpha": 0.1}, "X"),
    "sigmoid": (lambda s: RNG.uniform(-4, 4, s), {}, "Out"),
    "tanh": (lambda s: RNG.uniform(-2, 2, s), {}, "Out"),
    "exp": (lambda s: RNG.uniform(-2, 2, s), {}, "Out"),
    "log": (_positive, {}, "X"),
    "sqrt": (_positive, {}, "Out"),
    "rsqrt": (_positive, {}, "Out"),
    "reciprocal": (_positive, {}, "Out"),
    "abs": (_signed, {}, "X"),
    "square": (lambda s: RNG.uniform(-2, 2, s), {}, "X"),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_grad_matches_finite_differences(op, shape):
    make, attrs, _ = UNARY[op]
    check_grad(op, {"X": make(shape)}, attrs, modes=_modes(shape))


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_grad_ops_have_paddles_slots_and_fuse(op):
    _, _, reads = UNARY[op]
    d = registry.get(f"{op}_grad")
    assert [s.name for s in d.inputs] == [reads, "Out@GRAD"]
    assert [s.name for s in d.outputs] == ["X@GRAD"]
    assert d.has(registry.ELEMENTWISE) and isinstance(d.emit, str)
    assert registry.get(op).grad is not registry.NO_GRAD_YET


@pytest.mark.parametrize("op", ["floor", "ceil", "sign"])
def test_piecewise_constant_ops_have_no_gradient(op):
    assert registry.get(op).grad is None


def test_kinks_follow_paddle():
    """Paddle 3.3.1 (run): relu'(0)=0, leaky_relu'(0)=1, abs'(0)=0, clip passes its bounds.

    In float32, so the templates are also compiled for a type other than check_grad's float64.
    """
    dtype = "float32"
    x = np.array([-1.0, 0.0, 1.0], dtype)
    g = np.array([2.0, 3.0, 5.0], dtype)
    out = np.maximum(x, 0)
    dx = {"X@GRAD": 1}  # X@GRAD is dispensable: ask for it
    check_output("relu_grad", {"Out": out, "Out@GRAD": g}, {},
                 {"X@GRAD": np.array([0, 0, 5]).astype(dtype)}, outputs=dx)
    check_output("leaky_relu_grad", {"X": x, "Out@GRAD": g}, {"alpha": 0.25},
                 {"X@GRAD": np.array([0.5, 3, 5]).astype(dtype)}, outputs=dx)
    check_output("abs_grad", {"X": x, "Out@GRAD": g}, {},
                 {"X@GRAD": np.array([-2, 0, 5]).astype(dtype)}, outputs=dx)
    xc = np.array([-2.0, -1.0, 0.0, 1.0, 2.0], dtype)
    gc = np.arange(1, 6).astype(dtype)
    check_output("clip_grad", {"X": xc, "Out@GRAD": gc}, {"min": -1.0, "max": 1.0},
                 {"X@GRAD": np.array([0, 2, 3, 4, 0]).astype(dtype)}, outputs=dx)


@pytest.mark.parametrize("shape", SHAPES)
def test_clip_grad(shape):
    # values near the bounds excluded: the derivative jumps there
    x = RNG.choice([-1.0, 1.0], shape) * RNG.choice([0.3, 0.6, 1.5, 1.9], shape)
    check_grad("clip", {"X": x}, {"min": -1.0, "max": 1.2}, modes=_modes(shape))
    check_grad("clip", {"X": x, "Min": np.array([-0.8]), "Max": np.array([1.0])}, {},
               modes=_modes(shape))


@pytest.mark.parametrize("shape", SHAPES)
def test_scale_grad(shape):
    x = RNG.uniform(-2, 2, shape)
    check_grad("scale", {"X": x}, {"scale": 2.5, "bias": 1.0, "bias_after_scale": False},
               modes=_modes(shape))
    # run-time factor and bias: the bias must not leak into the gradient (it does in Paddle)
    got = check_grad("scale", {"X": x, "ScaleTensor": np.array([-1.5]),
                               "BiasTensor": np.array([3.0])}, {}, modes=_modes(shape))
    assert got["X"].shape == shape


def test_scale_grad_is_a_scale_op_like_paddles():
    prog = Program()
    b = prog.global_block()
    x = b.create_var(name="x", shape=[2, 3], dtype="float32")
    s = b.create_var(name="s", shape=[1], dtype="float32")
    s.stop_gradient = True
    out = b.create_var(name="out", shape=[2, 3], dtype="float32")
    b.append_op("scale", inputs={"X": [x], "ScaleTensor": [s]}, outputs={"Out": [out]},
                attrs={"scale": 3.0, "bias": 2.0, "bias_after_scale": False})
    gradients([out], [x])
    op = b.ops[-1]
    assert op.type == "scale"
    assert op.input("X") == ["out@GRAD"] and op.input("ScaleTensor") == ["s"]
    assert op.output("Out") == ["x@GRAD"]
    assert (op.attr("scale"), op.attr("bias"), op.attr("bias_after_scale")) == (3.0, 0.0, True)


@pytest.mark.parametrize("shape", SHAPES)
def test_assign_grad(shape):
    check_grad("assign", {"X": RNG.uniform(-2, 2, shape)}, {}, modes=_modes(shape))


def test_cast_grad_casts_back():
    """float32 -> float64 -> mean: x@GRAD is a float32 cast of the float64 gradient."""
    prog = Program()
    b = prog.global_block()
    x = b.create_var(name="x", shape=[3, 4], dtype="float32", need_check_feed=True)
    y = b.create_var(name="y", shape=[3, 4], dtype="float64")
    loss = b.create_var(name="loss", shape=[], dtype="float64")
    b.append_op("cast", inputs={"X": [x]}, outputs={"Out": [y]},
                attrs={"in_dtype": dtypes.to_code("float32"),
                       "out_dtype": dtypes.to_code("float64")})
    b.append_op("mean", inputs={"X": [y]}, outputs={"Out": [loss]})
    (gx,) = gradients([loss], [x])
    cast_back = [op for op in b.ops if op.type == "cast"][-1]
    assert cast_back.input("X") == ["y@GRAD"] and cast_back.output("Out") == ["x@GRAD"]
    assert cast_back.attr("in_dtype") == dtypes.to_code("float64")
    assert cast_back.attr("out_dtype") == dtypes.to_code("float32")
    for mode in ("reference", "compiled"):
        (g,) = Executor(mode=mode).run(prog, feed={"x": np.ones((3, 4), np.float32)},
                                       fetch_list=[gx], scope=Scope())
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, np.full((3, 4), 1 / 12, np.float32), rtol=1e-6)


def test_chain_append_backward_matches_numpy_and_fuses():
    """loss = mean(tanh(3 * sigmoid(w) - 1)): w@GRAD by the chain rule in NumPy."""
    prog = Program()
    b = prog.global_block()
    w = b.create_parameter(name="w", shape=[3, 4], dtype="float64")
    names = ["s", "t", "q", "loss"]
    v = {n: b.create_var(name=n, shape=[3, 4] if n != "loss" else [], dtype="float64")
         for n in names}
    b.append_op("sigmoid", inputs={"X": [w]}, outputs={"Out": [v["s"]]})
    b.append_op("scale", inputs={"X": [v["s"]]}, outputs={"Out": [v["t"]]},
                attrs={"scale": 3.0, "bias": -1.0})
    b.append_op("tanh", inputs={"X": [v["t"]]}, outputs={"Out": [v["q"]]})
    b.append_op("mean", inputs={"X": [v["q"]]}, outputs={"Out": [v["loss"]]})
    ((p, gw),) = append_backward(v["loss"])
    assert p.name == "w" and gw.name == "w@GRAD"
    assert [op.type for op in b.ops[4:]] == ["fill_constant", "mean_grad", "tanh_grad", "scale",
                                             "sigmoid_grad"]

    wv = RNG.uniform(-2, 2, (3, 4))
    sig = 1 / (1 + np.exp(-wv))
    t = np.tanh(3 * sig - 1)
    want = (1 / 12) * (1 - t * t) * 3 * sig * (1 - sig)
    for mode in ("reference", "compiled"):
        scope = Scope()
        scope.var("w").value = wv.copy()
        (g,) = Executor(mode=mode).run(prog, feed={}, fetch_list=[gw], scope=scope)
        np.testing.assert_allclose(g, want, rtol=1e-12)
    # the three elementwise grad ops run as one fused loop, not as references
    report = Executor().explain(prog, feed={}, fetch_list=[gw])
    assert "elementwise [tanh_grad#" in report and "sigmoid_grad#" in report, report
