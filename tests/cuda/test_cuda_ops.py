"""Each op with a cuda lowering, on the device (CUDAPlace(0), strict: native device code
only), against NumPy written here; small sizes (the simulator runs every thread in Python)."""
import numpy as np
import pytest

from pdjit.testing.op_test import CUDA, check_output

R = np.random.RandomState(11)
F = np.float32


def r(*shape, dtype=F):
    return R.randn(*shape).astype(dtype)


def _cuda(op, inputs, attrs, expected, **kw):
    return check_output(op, inputs, attrs, expected, modes=[CUDA],
                        outputs={k: 1 for k in expected}, **kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mul(dtype):
    x, y = r(5, 7, dtype=dtype), r(7, 9, dtype=dtype)
    _cuda("mul", {"X": x, "Y": y}, {}, {"Out": x @ y})


def test_mul_flattening_and_grad():
    x, y, g = r(2, 3, 4), r(4, 5), r(2, 3, 5)
    _cuda("mul", {"X": x, "Y": y}, {"x_num_col_dims": 2}, {"Out": x @ y})
    _cuda("mul_grad", {"X": x, "Y": y, "Out@GRAD": g}, {"x_num_col_dims": 2},
          {"X@GRAD": (g.reshape(6, 5) @ y.T).reshape(2, 3, 4),
           "Y@GRAD": x.reshape(6, 4).T @ g.reshape(6, 5)}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tx,ty", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_v2_and_grad(tx, ty):
    a, b = r(6, 5), r(5, 7)
    x = a.T.copy() if tx else a
    y = b.T.copy() if ty else b
    g = r(6, 7)
    attrs = {"trans_x": tx, "trans_y": ty}
    _cuda("matmul_v2", {"X": x, "Y": y}, attrs, {"Out": a @ b}, rtol=1e-5, atol=1e-5)
    da, db = g @ b.T, a.T @ g
    _cuda("matmul_v2_grad", {"X": x, "Y": y, "Out@GRAD": g}, attrs,
          {"X@GRAD": da.T if tx else da, "Y@GRAD": db.T if ty else db}, rtol=1e-5, atol=1e-5)


def test_matmul():
    x, y = r(4, 3), r(3, 6)
    _cuda("matmul", {"X": x, "Y": y}, {"transpose_X": False, "transpose_Y": False, "alpha": 1.0},
          {"Out": x @ y}, rtol=1e-5, atol=1e-5)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_softmax():
    x = r(3, 4, 10)
    _cuda("softmax", {"X": x}, {"axis": -1}, {"Out": _softmax(x)})


def test_softmax_with_cross_entropy_and_grad():
    x = r(7, 5)
    lab = R.randint(0, 5, (7, 1)).astype(np.int64)
    lab[2, 0] = -100  # ignored
    sm = _softmax(x)
    loss = -np.log(sm[np.arange(7), np.maximum(lab[:, 0], 0)])[:, None]
    loss[2] = 0
    _cuda("softmax_with_cross_entropy", {"Logits": x, "Label": lab}, {"ignore_index": -100},
          {"Softmax": sm, "Loss": loss.astype(F)}, rtol=1e-5, atol=1e-6)
    g = r(7, 1)
    want = sm * g
    for i in range(7):
        if lab[i, 0] != -100:
            want[i, lab[i, 0]] -= g[i, 0]
        else:
            want[i] = 0
    _cuda("softmax_with_cross_entropy_grad",
          {"Softmax": sm, "Label": lab, "Loss@GRAD": g}, {"ignore_index": -100},
          {"Logits@GRAD": want}, rtol=1e-5, atol=1e-6)


def test_mean_and_grad():
    x = r(6, 5)
    _cuda("mean", {"X": x}, {}, {"Out": np.array(x.mean(), F)}, rtol=1e-5)
    g = np.array([0.7], F)
    _cuda("mean_grad", {"X": x, "Out@GRAD": g}, {}, {"X@GRAD": np.full((6, 5), 0.7 / 30, F)})


def test_fill_constant_and_assign():
    _cuda("fill_constant", {}, {"shape": [3, 4], "dtype": 5, "value": 1.25},
          {"Out": np.full((3, 4), 1.25, F)})
    x = r(2, 9)
    _cuda("assign", {"X": x}, {}, {"Out": x})


@pytest.mark.parametrize("op", ["elementwise_add", "elementwise_sub", "elementwise_mul",
                                "elementwise_div"])
@pytest.mark.parametrize("yshape,axis", [((4,), -1), ((3,), 1), ((2, 3, 4), -1)])
def test_elementwise_grads(op, yshape, axis):
    x, g = r(2, 3, 4), r(2, 3, 4)
    y = (np.abs(r(*yshape)) + 0.5).astype(F)
    yb = y.reshape((1, 3, 1)) if axis == 1 else y
    dx, dy = {"elementwise_add": (g, g), "elementwise_sub": (g, -g),
              "elementwise_mul": (g * yb, g * x),
              "elementwise_div": (g / yb, -g * x / (yb * yb))}[op]
    keep = tuple(i for i in range(3) if (axis == 1 and i != 1) or
                 (axis == -1 and i < 3 - len(yshape)))
    _cuda(f"{op}_grad", {"X": x, "Y": y, "Out@GRAD": g}, {"axis": axis},
          {"X@GRAD": dx, "Y@GRAD": dy.sum(axis=keep).reshape(yshape).astype(F)},
          rtol=1e-5, atol=1e-5)


def test_sgd():
    p, g, lr = r(4, 6), r(4, 6), np.array([0.1], F)
    _cuda("sgd", {"Param": p, "Grad": g, "LearningRate": lr}, {}, {"ParamOut": p - lr * g})


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum(nesterov):
    p, g, v, lr = r(5, 3), r(5, 3), r(5, 3), np.array([0.05], F)
    mu = F(0.9)
    v2 = mu * v + g
    p2 = p - lr * (g + mu * v2) if nesterov else p - lr * v2
    _cuda("momentum", {"Param": p, "Grad": g, "Velocity": v, "LearningRate": lr},
          {"mu": 0.9, "use_nesterov": nesterov}, {"ParamOut": p2, "VelocityOut": v2},
          rtol=1e-5, atol=1e-6)


def test_adam():
    p, g = r(3, 7), r(3, 7)
    m1, m2 = r(3, 7) * F(0.1), np.abs(r(3, 7)) * F(0.1)
    lr, b1p, b2p = np.array([0.01], F), np.array([0.9 ** 3], F), np.array([0.999 ** 3], F)
    b1, b2, eps = F(0.9), F(0.999), F(1e-8)
    n1 = b1 * m1 + (1 - b1) * g
    n2 = b2 * m2 + (1 - b2) * g * g
    lrt = lr * np.sqrt(1 - b2p) / (1 - b1p)
    p2 = p - lrt * (n1 / (np.sqrt(n2) + eps * np.sqrt(1 - b2p)))
    _cuda("adam", {"Param": p, "Grad": g, "LearningRate": lr, "Moment1": m1, "Moment2": m2,
                   "Beta1Pow": b1p, "Beta2Pow": b2p}, {"beta1": 0.9, "beta2": 0.999,
                                                       "epsilon": 1e-8},
          {"ParamOut": p2, "Moment1Out": n1, "Moment2Out": n2, "Beta1PowOut": b1p * b1,
           "Beta2PowOut": b2p * b2}, rtol=1e-5, atol=1e-6)
