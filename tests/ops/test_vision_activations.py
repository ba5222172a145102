"""The activations of vision models: relu6, hard_swish, hard_sigmoid, swish, silu, elu, selu,
softplus, mish and prelu, with their grad ops and Fluid 1.x layers.

Oracles: NumPy written here (forward values, also at the kinks and where a formula switches),
central differences (``check_grad``), Paddle 3.3.1's choices at the kinks (measured with its
legacy executor, written below as NumPy), and Paddle itself when it is installed.
"""
import importlib.util
import pickle
import subprocess
import sys

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import OpShapeError
from pdjit.framework.program import Program
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import TARGETS, assert_native, check_output
from pdjit.testing.grad_check import check_grad

RNG = np.random.default_rng(11)
# where the ops have kinks or switch formulas (0, +-3, 6, 2.5 = softplus's 5 / beta 2, 20...)
KINKS = np.array([-25, -7, -3, -1, -0.5, 0, 0.5, 1, 2.5, 3, 3.5, 6, 7, 20, 21], np.float64)
X = np.concatenate([KINKS, RNG.uniform(-8, 8, 9)]).reshape(3, 8)
# FLOAT attributes hold float32 values (Paddle's too): the defaults as the ops see them
SELU_SCALE = float(np.float32(1.0507009873554805))
SELU_ALPHA = float(np.float32(1.6732632423543772))
SLOPE = float(np.float32(0.2))


def _sig(z):
    return 1 / (1 + np.exp(-z))


def _softplus(z):
    return np.log1p(np.exp(z))


def _elu(x, alpha):
    return np.where(x > 0, x, alpha * (np.exp(x) - 1))


# (op, attrs, NumPy forward in float64)
FORWARD = [
    ("relu6", {}, lambda x: np.clip(x, 0, 6)),
    ("relu6", {"threshold": 3.0}, lambda x: np.clip(x, 0, 3)),
    ("hard_swish", {}, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    ("hard_swish", {"threshold": 4.0, "scale": 5.0, "offset": 2.0},
     lambda x: x * np.clip(x + 2, 0, 4) / 5),
    ("hard_sigmoid", {}, lambda x: np.clip(SLOPE * x + 0.5, 0, 1)),
    ("hard_sigmoid", {"slope": 0.5, "offset": 0.25}, lambda x: np.clip(0.5 * x + 0.25, 0, 1)),
    ("swish", {}, lambda x: x * _sig(x)),
    ("swish", {"beta": 2.0}, lambda x: x * _sig(2 * x)),
    ("silu", {}, lambda x: x * _sig(x)),
    ("elu", {}, lambda x: _elu(x, 1.0)),
    ("elu", {"alpha": 0.5}, lambda x: _elu(x, 0.5)),
    ("selu", {}, lambda x: SELU_SCALE * _elu(x, SELU_ALPHA)),
    ("selu", {"scale": 2.0, "alpha": 0.5}, lambda x: 2 * _elu(x, 0.5)),
    ("softplus", {}, lambda x: np.where(x > 20, x, _softplus(x))),
    # beta * x == threshold at x = 2.5: still the log formula (Paddle tests beta * x > threshold)
    ("softplus", {"beta": 2.0, "threshold": 5.0},
     lambda x: np.where(2 * x > 5, x, _softplus(2 * x) / 2)),
    ("mish", {}, lambda x: x * np.tanh(np.where(x > 20, x, _softplus(x)))),
    ("mish", {"threshold": 3.0}, lambda x: x * np.tanh(np.where(x > 3, x, _softplus(x)))),
]


def _id(case):
    op, attrs, *_ = case
    return op + "".join(f"-{k}{v:g}" for k, v in attrs.items())


@pytest.mark.parametrize("case", FORWARD, ids=_id)
def test_forward_matches_numpy(case):
    op, attrs, fn = case
    for dtype in ("float32", "float64"):
        x = X.astype(dtype)
        check_output(op, {"X": x}, attrs, {"Out": fn(X).astype(dtype)})


# ---- gradients ----------------------------------------------------------------------------------
# Away from the kinks (random values are, by more than check_grad's delta). hard_swish's grad is
# Paddle's: 1 (not threshold / scale) where X + offset >= threshold, so the attrs keep
# threshold == scale; mish's uses 1 - exp(-X) as the derivative of X above its threshold, so
# the threshold stays at 20, beyond the values.
GRAD = [
    ("relu6", {}), ("relu6", {"threshold": 3.0}), ("hard_swish", {}),
    ("hard_swish", {"threshold": 5.0, "scale": 5.0, "offset": 2.0}),
    ("hard_sigmoid", {"slope": 0.5, "offset": 0.25}), ("swish", {"beta": 2.0}), ("silu", {}),
    ("elu", {"alpha": 0.5}), ("selu", {}), ("softplus", {"beta": 2.0, "threshold": 5.0}),
    ("mish", {}),
]


@pytest.mark.parametrize("case", GRAD, ids=_id)
def test_grad_matches_finite_differences(case):
    op, attrs = case
    check_grad(op, {"X": RNG.uniform(-8, 8, (3, 4))}, attrs)


def _hard_swish_dx(x, g):
    return np.where(x + 3 < 6, np.where(x + 3 > 0, g * (2 * x + 3) / 6, 0), g)


def _mish_dx(x, g, threshold):
    sp = np.where(x > threshold, x, _softplus(x))
    t = np.tanh(sp)
    return g * (t + x * (1 - t * t) * (1 - np.exp(-sp)))


# (grad op, attrs, inputs from (x, out, g), expected X@GRAD): Paddle 3.3.1's values at the kinks
KINK_GRADS = [
    # Out > 0 and Out < threshold: 0 at both ends
    ("relu6_grad", {}, lambda x, g: {"Out": np.clip(x, 0, 6), "Out@GRAD": g},
     lambda x, g: np.where((x > 0) & (x < 6), g, 0)),
    # 0 at X = -offset, 1 from X + offset = threshold on
    ("hard_swish_grad", {}, lambda x, g: {"X": x, "Out@GRAD": g}, _hard_swish_dx),
    ("hard_sigmoid_grad", {}, lambda x, g: {"Out": np.clip(SLOPE * x + 0.5, 0, 1), "Out@GRAD": g},
     lambda x, g: np.where((x > -2.5) & (x < 2.5), SLOPE * g, 0)),
    # alpha at 0 (X > 0 picks the linear side)
    ("elu_grad", {"alpha": 0.5}, lambda x, g: {"X": x, "Out": _elu(x, 0.5), "Out@GRAD": g},
     lambda x, g: np.where(x > 0, g, 0.5 * np.exp(np.minimum(x, 0)) * g)),
    # selu_grad reads Out only: scale * alpha at 0
    ("selu_grad", {}, lambda x, g: {"Out": SELU_SCALE * _elu(x, SELU_ALPHA), "Out@GRAD": g},
     lambda x, g: np.where(x > 0, SELU_SCALE * g,
                           SELU_SCALE * SELU_ALPHA * np.exp(np.minimum(x, 0)) * g)),
    ("softplus_grad", {"beta": 2.0, "threshold": 5.0}, lambda x, g: {"X": x, "Out@GRAD": g},
     lambda x, g: np.where(2 * x > 5, g, _sig(2 * x) * g)),
    ("mish_grad", {"threshold": 3.0}, lambda x, g: {"X": x, "Out@GRAD": g},
     lambda x, g: _mish_dx(x, g, 3.0)),
]


@pytest.mark.parametrize("case", KINK_GRADS, ids=lambda c: c[0])
def test_grad_ops_take_paddles_values_at_the_kinks(case):
    op, attrs, inputs, want = case
    g = RNG.uniform(0.5, 1.5, KINKS.shape)
    check_output(op, inputs(KINKS, g), attrs, {"X@GRAD": want(KINKS, g)}, outputs={"X@GRAD": 1})


def test_grad_ops_read_what_paddles_read():
    """The grad ops' slots, as ``core.get_grad_op_desc`` shows them in Paddle 3.3.1."""
    reads = {"relu6": {"Out"}, "hard_swish": {"X"}, "hard_sigmoid": {"Out"}, "swish": {"X"},
             "silu": {"X", "Out"}, "elu": {"X", "Out"}, "selu": {"Out"}, "softplus": {"X"},
             "mish": {"X"}}
    for op, slots in reads.items():
        prog = Program()
        b = prog.global_block()
        x = b.create_var(name="x", shape=[2, 3], dtype="float32")
        out = b.create_var(name="out", shape=[2, 3], dtype="float32")
        b.append_op(op, inputs={"X": [x]}, outputs={"Out": [out]})
        gradients([out], [x])
        grad_op = b.ops[-1]
        assert grad_op.type == f"{op}_grad"
        assert set(grad_op.input_names) == slots | {"Out@GRAD"}, op
        assert grad_op.output("X@GRAD") == ["x@GRAD"]


# ---- prelu ----------------------------------------------------------------------------------
# (mode, data_format, X's shape, Alpha's shape, Alpha reshaped to broadcast like NumPy)
PRELU = [
    ("all", "NCHW", (2, 3, 4), (1,), ()),
    ("channel", "NCHW", (2, 3, 2, 2), (1, 3, 1, 1), (1, 3, 1, 1)),
    ("channel", "NCHW", (2, 3, 4), (3,), (1, 3, 1)),       # a [C] Alpha (dygraph's PReLU)
    ("channel", "NCHW", (4, 3), (1, 3, 1, 1), (1, 3)),     # [1, C, 1, 1] for a rank-2 X
    ("channel", "NHWC", (2, 2, 2, 3), (1, 1, 1, 3), (1, 1, 1, 3)),
    ("element", "NCHW", (2, 3, 4), (1, 3, 4), (1, 3, 4)),
]


def _prelu_inputs(x_shape, a_shape, dtype="float64"):
    x = RNG.uniform(-2, 2, x_shape)
    x.reshape(-1)[::5] = 0.0  # the kink
    return x.astype(dtype), RNG.uniform(0.1, 0.5, a_shape).astype(dtype)


@pytest.mark.parametrize("case", PRELU, ids=lambda c: f"{c[0]}-{c[1]}-{len(c[2])}d-a{len(c[3])}d")
def test_prelu(case):
    mode, fmt, xs, as_, bcast = case
    attrs = {"mode": mode, "data_format": fmt}
    x, a = _prelu_inputs(xs, as_, "float32")
    ab = a.reshape(bcast)
    check_output("prelu", {"X": x, "Alpha": a}, attrs, {"Out": np.where(x > 0, x, ab * x)})
    # Paddle's grad: X > 0 picks Out@GRAD (so Alpha * Out@GRAD at 0); Alpha's sums X * Out@GRAD
    # where X <= 0 over the elements sharing the value
    g = RNG.uniform(0.5, 1.5, xs).astype("float32")
    axes = tuple(i for i in range(len(xs)) if not bcast or bcast[i] == 1)
    da = np.where(x > 0, 0, x * g).sum(axis=axes).reshape(as_)
    check_output("prelu_grad", {"X": x, "Alpha": a, "Out@GRAD": g}, attrs,
                 {"X@GRAD": np.where(x > 0, g, ab * g), "Alpha@GRAD": da},
                 outputs={"X@GRAD": 1, "Alpha@GRAD": 1}, rtol=1e-5, atol=1e-5)
    x = np.where(x == 0, 0.3, x)  # finite differences away from the kink
    check_grad("prelu", {"X": x, "Alpha": a}, attrs, inputs_to_check=("X", "Alpha"))


@pytest.mark.parametrize("alpha_shape,attrs,match", [
    ((2,), {"mode": "all"}, "1 value"),
    ((4,), {"mode": "channel"}, "3 value"),
    ((3,), {"mode": "channel", "data_format": "NHWC"}, "5 value"),
    ((4, 5), {"mode": "element"}, "rank"),
    ((1,), {"mode": "every"}, "mode must be one of"),
])
def test_prelu_refuses_alphas_that_do_not_fit(alpha_shape, attrs, match):
    prog = Program()
    b = prog.global_block()
    x = b.create_var(name="x", shape=[2, 3, 4, 5], dtype="float32")
    a = b.create_var(name="a", shape=list(alpha_shape), dtype="float32")
    out = b.create_var(name="out", dtype="float32")
    with pytest.raises(OpShapeError, match=match):
        b.append_op("prelu", inputs={"X": [x], "Alpha": [a]}, outputs={"Out": [out]},
                    attrs=attrs)


# ---- programs written by Paddle 3.3.1: relu6 and swish carry no attribute ---------------------
@pytest.mark.parametrize("op,attr,fn,dfn", [
    ("relu6", "threshold", lambda x: np.clip(x, 0, 6), lambda x: ((x > 0) & (x < 6)) * 1.0),
    ("swish", "beta", lambda x: x * _sig(x), lambda x: _sig(x) * (1 + x * (1 - _sig(x)))),
])
def test_absent_attribute_means_paddles_constant(op, attr, fn, dfn):
    prog = Program()
    b = prog.global_block()
    x = b.create_var(name="x", shape=[3, 8], dtype="float64", need_check_feed=True)
    out = b.create_var(name="out", shape=[3, 8], dtype="float64")
    b.append_op(op, inputs={"X": [x]}, outputs={"Out": [out]})
    desc = prog.desc
    (op_desc,) = [o for o in desc.blocks[0].ops if o.type == op]
    kept = [a for a in op_desc.attrs if a.name != attr]
    del op_desc.attrs[:]
    op_desc.attrs.extend(kept)
    prog = Program.parse_from_string(desc.SerializeToString())
    b = prog.global_block()
    assert not b.ops[0].has_attr(attr)
    (dx,) = gradients([b.var("out")], [b.var("x")])
    for mode in TARGETS:
        exe = Executor(mode=mode)
        got, gx = exe.run(prog, feed={"x": X}, fetch_list=[b.var("out"), dx], scope=Scope())
        np.testing.assert_allclose(got, fn(X), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(gx, dfn(X), rtol=1e-12, atol=1e-15)
        if mode == "compiled":
            assert_native(exe)


# ---- layers ---------------------------------------------------------------------------------
def test_layers_match_numpy(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data(name="x", shape=[3, 2, 2], dtype="float32")
    layers = fluid.layers
    outs = {
        "relu6": layers.relu6(x, threshold=4.0),
        "hard_swish": layers.hard_swish(x, threshold=5.0, scale=4.0, offset=2.0),
        "hard_sigmoid": layers.hard_sigmoid(x, slope=0.3, offset=0.4),
        "swish": layers.swish(x, beta=1.5),
        "silu": layers.silu(x),
        "elu": layers.elu(x, alpha=0.7),
        "selu": layers.selu(x),
        "softplus": layers.softplus(x),
        "mish": layers.mish(x),
        "all": layers.prelu(x, "all"),
        "channel": layers.prelu(x, "channel"),
        "element": layers.prelu(x, "element", param_attr=fluid.ParamAttr(name="pe")),
        "nhwc": layers.prelu(x, "channel", data_format="NHWC"),
    }
    params = {p.name: list(p.shape) for p in main.global_block().all_parameters()}
    assert sorted(params.values()) == sorted([[1], [1, 3, 1, 1], [1, 3, 2, 2], [1, 1, 1, 2]])
    assert params["pe"] == [1, 3, 2, 2]
    xv = (RNG.uniform(-4, 4, (2, 3, 2, 2))).astype("float32")
    xv.reshape(-1)[::7] = 0
    scope, exe = Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    got = dict(zip(outs, exe.run(main, feed={"x": xv}, fetch_list=list(outs.values()),
                                 scope=scope)))
    assert_native(exe)
    x = xv.astype(np.float64)
    want = {
        "relu6": np.clip(x, 0, 4), "hard_swish": x * np.clip(x + 2, 0, 5) / 4,
        "hard_sigmoid": np.clip(0.3 * x + 0.4, 0, 1), "swish": x * _sig(1.5 * x),
        "silu": x * _sig(x), "elu": _elu(x, 0.7), "selu": SELU_SCALE * _elu(x, SELU_ALPHA),
        "softplus": _softplus(x), "mish": x * np.tanh(_softplus(x)),
    }
    for k in ("all", "channel", "element", "nhwc"):  # alpha starts at 0.25 everywhere
        want[k] = np.where(x > 0, x, 0.25 * x)
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w.astype("float32"), rtol=1e-5, atol=1e-6, err_msg=k)


def test_prelu_layer_learns_alpha(fresh_programs):
    """One SGD step on mean(prelu(x, 'channel')): Alpha[c] -= lr * mean-weighted sum of the
    non-positive x of channel c."""
    main, startup = fresh_programs
    x = fluid.layers.data(name="x", shape=[3, 4], dtype="float32")
    y = fluid.layers.prelu(x, "channel", param_attr=fluid.ParamAttr(name="alpha"))
    loss = fluid.layers.mean(y)
    fluid.optimizer.SGD(learning_rate=0.5).minimize(loss)
    xv = RNG.uniform(-2, 2, (5, 3, 4)).astype("float32")
    scope, exe = Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": xv}, fetch_list=[loss], scope=scope)
    assert_native(exe)
    alpha = np.asarray(scope.find_var("alpha").get_tensor())
    grad = np.where(xv > 0, 0, xv).sum(axis=(0, 2)) / xv.size
    np.testing.assert_allclose(alpha.reshape(-1), 0.25 - 0.5 * grad, rtol=1e-5)


def test_prelu_layer_refuses_bad_arguments(fresh_programs):
    x = fluid.layers.data(name="x", shape=[3, 4], dtype="float32")
    with pytest.raises(ValueError, match="mode"):
        fluid.layers.prelu(x, "row")
    with pytest.raises(ValueError, match="data_format"):
        fluid.layers.prelu(x, "channel", data_format="CHW")


# ---- PaddlePaddle 3.3.1 itself, when installed -------------------------------------------------
_PADDLE_SCRIPT = r'''
import os, sys, pickle
os.environ["FLAGS_enable_pir_api"] = "0"
import numpy as np
import paddle
from paddle.base.backward import gradients
paddle.enable_static()
cases, results = pickle.load(open(sys.argv[1], "rb")), []
for op, inputs, attrs, g in cases:
    main = paddle.static.Program()
    with paddle.static.program_guard(main, paddle.static.Program()):
        ins = {}
        for k, arr in inputs.items():
            v = paddle.static.data(k.lower(), list(arr.shape), str(arr.dtype))
            v.stop_gradient = False
            ins[k] = [v]
        out = main.global_block().create_var(name="out", dtype=str(g.dtype), shape=list(g.shape))
        main.global_block().append_op(type=op, inputs=ins, outputs={"Out": [out]},
                                      attrs=dict(attrs))
        gv = paddle.static.data("g", list(g.shape), str(g.dtype))
        grads = gradients([out], [ins[k][0] for k in inputs], target_gradients=[gv])
    feed = {k.lower(): a for k, a in inputs.items()}
    feed["g"] = g
    res = paddle.static.Executor(paddle.CPUPlace()).run(main, feed=feed,
                                                        fetch_list=[out] + grads)
    results.append([np.array(r) for r in res])
pickle.dump(results, open(sys.argv[2], "wb"))
'''


def test_matches_paddle(tmp_path):
    """Forward and backward at the kinks, as Paddle 3.3.1's legacy executor computes them.
    (Paddle 3.3.1 ignores relu6's threshold, hard_swish's attributes and swish's beta: it
    writes none of them; those run with their defaults here.)"""
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    g = RNG.uniform(0.5, 1.5, X.shape)
    cases = [(op, {"X": X}, attrs, g) for op, attrs in [
        ("relu6", {}), ("hard_swish", {}), ("hard_sigmoid", {"slope": 0.5, "offset": 0.25}),
        ("swish", {}), ("silu", {}), ("elu", {"alpha": 0.5}), ("selu", {}),
        ("selu", {"scale": 2.0, "alpha": 0.5}), ("softplus", {"beta": 2.0, "threshold": 5.0}),
        ("mish", {}), ("mish", {"threshold": 3.0})]]
    for mode, fmt, xs, as_, _ in PRELU:
        x, a = _prelu_inputs(xs, as_)
        cases.append(("prelu", {"X": x, "Alpha": a}, {"mode": mode, "data_format": fmt},
                      RNG.uniform(0.5, 1.5, xs)))
    (tmp_path / "in.pkl").write_bytes(pickle.dumps(cases))
    (tmp_path / "run.py").write_text(_PADDLE_SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "in.pkl"),
                           str(tmp_path / "out.pkl")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = pickle.loads((tmp_path / "out.pkl").read_bytes())
    for (op, inputs, attrs, gv), want in zip(cases, results):
        prog = Program()
        b = prog.global_block()
        ins = {k: b.create_var(name=k.lower(), shape=list(v.shape), dtype="float64",
                               need_check_feed=True) for k, v in inputs.items()}
        out = b.create_var(name="out", dtype="float64")
        b.append_op(op, inputs={k: [v] for k, v in ins.items()}, outputs={"Out": [out]},
                    attrs=attrs)
        w = b.create_var(name="w", shape=list(gv.shape), dtype="float64", need_check_feed=True)
        grads = gradients([out], list(ins.values()), target_gradients=[w])
        feed = {k.lower(): v for k, v in inputs.items()}
        feed["w"] = gv
        exe = Executor(mode="compiled")
        got = exe.run(prog, feed=feed, fetch_list=[out] + grads, scope=Scope())
        assert_native(exe)
        for name, gg, ww in zip(["Out"] + [f"{k}@GRAD" for k in inputs], got, want):
            # atol: Paddle's selu_grad multiplies scale * alpha in float32 (an error of 4e-8)
            np.testing.assert_allclose(gg, ww.reshape(gg.shape), rtol=1e-6, atol=1e-7,
                                       err_msg=f"{op} {attrs} {name}")
