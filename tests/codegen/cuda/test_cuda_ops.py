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


# ---- convolution and pooling (NCHW; NumPy loops written here) ---------------------------------
def _np_conv(x, w, stride, pad, groups):
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // groups
    for b in range(n):
        for o in range(m):
            cs = slice((o // mg) * cg, (o // mg + 1) * cg)
            for i in range(oh):
                for j in range(ow):
                    win = xp[b, cs, i * stride:i * stride + kh, j * stride:j * stride + kw]
                    y[b, o, i, j] = (win * w[o]).sum()
    return y


def _np_conv_grads(x, w, dy, stride, pad, groups):
    """Both gradients by the chain rule of the loops above, element by element."""
    m, cg, kh, kw = w.shape
    mg = m // groups
    dxp = np.zeros((x.shape[0], x.shape[1], x.shape[2] + 2 * pad, x.shape[3] + 2 * pad))
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    dw = np.zeros(w.shape)
    for b in range(x.shape[0]):
        for o in range(m):
            cs = slice((o // mg) * cg, (o // mg + 1) * cg)
            for i in range(dy.shape[2]):
                for j in range(dy.shape[3]):
                    hs, ws = slice(i * stride, i * stride + kh), slice(j * stride, j * stride + kw)
                    dxp[b, cs, hs, ws] += dy[b, o, i, j] * w[o]
                    dw[o] += dy[b, o, i, j] * xp[b, cs, hs, ws]
    dx = dxp[:, :, pad:pad + x.shape[2], pad:pad + x.shape[3]]
    return dx.astype(F), dw.astype(F)


def _nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("op,groups,stride,pad,fmt", [("conv2d", 1, 1, 1, "NCHW"),
                                                      ("depthwise_conv2d", 2, 2, 1, "NCHW"),
                                                      ("conv2d", 1, 2, 1, "NHWC")])
def test_conv2d_and_grads(op, groups, stride, pad, fmt):
    x, w = r(1, 2, 5, 5), r(2, 2 // groups, 3, 3)
    attrs = {"strides": [stride, stride], "paddings": [pad, pad], "groups": groups,
             "data_format": fmt}
    lay = _nhwc if fmt == "NHWC" else (lambda a: a)
    y = _np_conv(x, w, stride, pad, groups).astype(F)
    _cuda(op, {"Input": lay(x), "Filter": w}, attrs, {"Output": lay(y)}, rtol=1e-5, atol=1e-5)
    dy = r(*y.shape)
    dx, dw = _np_conv_grads(x, w, dy, stride, pad, groups)
    _cuda(f"{op}_grad", {"Input": lay(x), "Filter": w, "Output@GRAD": lay(dy)}, attrs,
          {"Input@GRAD": lay(dx), "Filter@GRAD": dw}, rtol=1e-5, atol=1e-5)


def _np_pool(x, k, s, p, is_max, exclusive=True):
    """Windows clipped to the image; an average divides by what it read (exclusive) or by
    the window's length (``k * k``, no window here runs past the padding)."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = np.zeros((n, c, oh, ow), F)
    dx_of = {}
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s - p, j * s - p
            hs = slice(max(h0, 0), min(h0 + k, h))
            ws = slice(max(w0, 0), min(w0 + k, w))
            win = x[:, :, hs, ws]
            if is_max:
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = win.shape[2] * win.shape[3] if exclusive else k * k
                y[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
            dx_of[i, j] = (hs, ws, win)
    return y, dx_of


@pytest.mark.parametrize("ptype,k,s,p,exclusive,fmt", [("max", 2, 2, 0, True, "NCHW"),
                                                       ("avg", 3, 2, 1, False, "NCHW"),
                                                       ("avg", 3, 2, 1, True, "NCHW"),
                                                       ("max", 3, 2, 1, True, "NHWC")])
def test_pool2d_and_grad(ptype, k, s, p, exclusive, fmt):
    x = r(1, 2, 5, 5)
    attrs = {"pooling_type": ptype, "ksize": [k, k], "strides": [s, s], "paddings": [p, p],
             "exclusive": exclusive, "data_format": fmt}
    lay = _nhwc if fmt == "NHWC" else (lambda a: a)
    y, windows = _np_pool(x, k, s, p, ptype == "max", exclusive)
    _cuda("pool2d", {"X": lay(x)}, attrs, {"Out": lay(y)}, rtol=1e-6, atol=1e-6)
    dy = r(*y.shape)
    dx = np.zeros_like(x)
    for (i, j), (hs, ws, win) in windows.items():
        for b in range(x.shape[0]):
            for c in range(x.shape[1]):
                if ptype == "max":  # the first maximum, row-major
                    a, e = np.unravel_index(np.argmax(win[b, c]), win[b, c].shape)
                    dx[b, c, hs.start + a, ws.start + e] += dy[b, c, i, j]
                else:
                    cnt = win.shape[2] * win.shape[3] if exclusive else k * k
                    dx[b, c, hs, ws] += dy[b, c, i, j] / cnt
    _cuda("pool2d_grad", {"X": lay(x), "Out": lay(y), "Out@GRAD": lay(dy)}, attrs,
          {"X@GRAD": lay(dx)}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ptype", ["max", "avg"])
def test_global_pool2d(ptype):
    x = r(2, 3, 2, 3)
    red = x.max(axis=(2, 3)) if ptype == "max" else x.mean(axis=(2, 3))
    _cuda("pool2d", {"X": x}, {"pooling_type": ptype, "ksize": [1, 1], "global_pooling": True},
          {"Out": red[:, :, None, None]}, rtol=1e-6, atol=1e-6)


# ---- batch_norm and layer_norm (float64 NumPy statistics written here) -------------------------
def _bn_np(x, scale, bias, mean, var, eps, mom):
    mu = x.astype(np.float64).mean(axis=(0, 2, 3))
    v = x.astype(np.float64).var(axis=(0, 2, 3))
    inv = 1.0 / np.sqrt(v + eps)
    xh = (x - mu[None, :, None, None]) * inv[None, :, None, None]
    y = xh * scale[None, :, None, None] + bias[None, :, None, None]
    return {"Y": y.astype(F), "MeanOut": (mean * mom + mu * (1 - mom)).astype(F),
            "VarianceOut": (var * mom + v * (1 - mom)).astype(F), "SavedMean": mu.astype(F),
            "SavedVariance": inv.astype(F)}, xh, inv


@pytest.mark.parametrize("is_test", [False, True])
def test_batch_norm_and_grad(is_test):
    x, scale, bias, mean = r(2, 3, 2, 2), r(3), r(3), r(3)
    var = (np.abs(r(3)) + F(0.5)).astype(F)
    ins = {"X": x, "Scale": scale, "Bias": bias, "Mean": mean, "Variance": var}
    dy = r(*x.shape)
    if is_test:  # the running statistics normalise; the gradient goes straight through them
        inv = 1.0 / np.sqrt(var.astype(np.float64) + 1e-5)
        xh = (x - mean[None, :, None, None]) * inv[None, :, None, None]
        y = (xh * scale[None, :, None, None] + bias[None, :, None, None]).astype(F)
        _cuda("batch_norm", ins, {"is_test": True}, {"Y": y, "MeanOut": mean,
                                                      "VarianceOut": var}, rtol=1e-5, atol=1e-5)
        dx = dy * (scale * inv)[None, :, None, None]
        _cuda("batch_norm_grad", {"X": x, "Scale": scale, "Bias": bias, "MeanOut": mean,
                                  "VarianceOut": var, "SavedMean": mean,
                                  "SavedVariance": inv.astype(F), "Y@GRAD": dy},
              {"is_test": True}, {"X@GRAD": dx.astype(F),
                                  "Scale@GRAD": (dy * xh).sum(axis=(0, 2, 3)).astype(F),
                                  "Bias@GRAD": dy.sum(axis=(0, 2, 3))}, rtol=1e-4, atol=1e-5)
        return
    want, xh, inv = _bn_np(x, scale, bias, mean, var, 1e-5, 0.9)
    _cuda("batch_norm", ins, {"momentum": 0.9}, want, rtol=1e-5, atol=1e-5)
    n = x.size // 3
    db, ds = dy.sum(axis=(0, 2, 3)), (dy * xh).sum(axis=(0, 2, 3))
    dx = (scale * inv)[None, :, None, None] * (dy - db[None, :, None, None] / n
                                               - xh * ds[None, :, None, None] / n)
    _cuda("batch_norm_grad", {"X": x, "Scale": scale, "Bias": bias,
                              "SavedMean": want["SavedMean"],
                              "SavedVariance": want["SavedVariance"], "Y@GRAD": dy}, {},
          {"X@GRAD": dx.astype(F), "Scale@GRAD": ds.astype(F), "Bias@GRAD": db},
          rtol=1e-4, atol=1e-5)


def test_layer_norm_and_grad():
    x, scale, bias = r(2, 3, 4), r(12), r(12)
    x2 = x.reshape(2, 12).astype(np.float64)
    m, v = x2.mean(1), x2.var(1)
    inv = 1.0 / np.sqrt(v + 1e-5)
    xh = (x2 - m[:, None]) * inv[:, None]
    ins = {"X": x, "Scale": scale, "Bias": bias}
    _cuda("layer_norm", ins, {"begin_norm_axis": 1},
          {"Y": (xh * scale + bias).reshape(x.shape).astype(F), "Mean": m.astype(F),
           "Variance": v.astype(F)}, rtol=1e-5, atol=1e-5)
    dy = r(2, 12).astype(np.float64)
    g = dy * scale
    dx = inv[:, None] * (g - g.mean(1, keepdims=True) - xh * (g * xh).mean(1, keepdims=True))
    _cuda("layer_norm_grad", dict(ins, Mean=m.astype(F), Variance=v.astype(F),
                                  **{"Y@GRAD": dy.reshape(x.shape).astype(F)}),
          {"begin_norm_axis": 1},
          {"X@GRAD": dx.reshape(x.shape).astype(F), "Scale@GRAD": (dy * xh).sum(0).astype(F),
           "Bias@GRAD": dy.sum(0).astype(F)}, rtol=1e-4, atol=1e-5)


# ---- reduction gradients and sum ----------------------------------------------------------------
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"])
def test_reduce_grads(op):
    x = r(2, 3, 4)
    x[1, 0, 2] = x[1, 0, :].max() if op == "reduce_max" else x[1, 0, 2]  # a tie: shared
    x[0, 2, 0] = x[0, 2, :].min() if op == "reduce_min" else x[0, 2, 0]
    attrs = {"dim": [2], "keep_dim": False}
    g = r(2, 3)
    if op in ("reduce_sum", "reduce_mean"):
        dx = np.repeat(g[:, :, None], 4, axis=2) / (4 if op == "reduce_mean" else 1)
        ins = {"X": x, "Out@GRAD": g}
    else:
        out = x.max(axis=2) if op == "reduce_max" else x.min(axis=2)
        hit = x == out[:, :, None]
        dx = g[:, :, None] * hit / hit.sum(axis=2, keepdims=True)
        ins = {"X": x, "Out": out, "Out@GRAD": g}
    _cuda(f"{op}_grad", ins, attrs, {"X@GRAD": dx.astype(F)}, rtol=1e-6, atol=1e-7)


def test_reduce_grad_over_leading_axes():
    x, g = r(3, 2, 2), r(2)
    _cuda("reduce_mean_grad", {"X": x, "Out@GRAD": g}, {"dim": [0, 2], "keep_dim": False},
          {"X@GRAD": np.broadcast_to((g / 6)[None, :, None], x.shape).astype(F)})


def test_sum():
    a, b, c = r(3, 5), r(3, 5), r(3, 5)
    _cuda("sum", {"X": [a, b, c]}, {}, {"Out": (a + b) + c})


# ---- operands that do not fit: the kernels cannot raise, the driver checks first ---------------
@pytest.mark.parametrize("op,inputs,bad", [
    ("conv2d_grad", {"Input": (1, 2, 5, 5), "Filter": (2, 2, 3, 3), "Output@GRAD": (1, 2, 5, 5)},
     "Output@GRAD"),
    ("batch_norm_grad", {"X": (2, 3, 2, 2), "Scale": (3,), "SavedMean": (3,),
                         "SavedVariance": (3,), "Y@GRAD": (2, 3, 2, 2)}, "Y@GRAD"),
    ("pool2d_grad", {"X": (1, 2, 4, 4), "Out": (1, 2, 2, 2), "Out@GRAD": (1, 2, 2, 2)},
     "Out@GRAD")])
def test_misfit_operands_name_the_op(op, inputs, bad):
    """A gradient of another batch size (the program declares it -1): the driver's check
    sends the op to its reference, whose error names the op, instead of a kernel reading
    past an array (without the check the kernels would run without an error)."""
    from pdjit.framework.errors import FallbackError, OpRunError
    from pdjit.runtime.executor import Executor
    from pdjit.runtime.place import CUDAPlace
    from pdjit.runtime.scope import Scope
    from pdjit.testing.op_test import build_op_program

    attrs = {"paddings": [1, 1]} if op == "conv2d_grad" else \
        {"ksize": [2, 2], "strides": [2, 2]} if op == "pool2d_grad" else {}
    values = {k: r(*s) for k, s in inputs.items()}
    grad = {"conv2d_grad": "Input@GRAD", "batch_norm_grad": "X@GRAD"}.get(op, "X@GRAD")
    prog, feed, outs = build_op_program(op, values, attrs, batch_unknown={bad},
                                        outputs={grad: 1})
    name = f"{bad.lower()}_0"
    feed[name] = np.concatenate([feed[name]] * 2)
    fetch = [v for vs in outs.values() for v in vs]
    with pytest.raises((FallbackError, OpRunError), match=op):
        Executor(CUDAPlace(0), strict=True).run(prog, feed=feed, fetch_list=fetch,
                                                scope=Scope())
