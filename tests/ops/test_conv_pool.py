"""conv2d / conv2d_transpose / pool2d / max_pool2d_with_index (and the depthwise types) against
NumPy written here: naive loops over every output element, and values PaddlePaddle 3.3.1
printed for the same inputs. Gradients against finite differences."""
import warnings

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import OpShapeError, ReferenceStepWarning
from pdjit.testing import assert_native
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import check_output, run_op

RNG = np.random.default_rng(3)


def _pads4(p):
    return [p[0], p[0], p[1], p[1]] if len(p) == 2 else list(p)


def _same(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def naive_conv(x, w, strides=(1, 1), paddings=(0, 0), dilations=(1, 1), groups=1, algo=None):
    """NCHW convolution, one output element at a time."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    pt, pb, pl, pr = _pads4(paddings)
    dh, dw = dilations
    if algo == "SAME":
        (pt, pb), (pl, pr), dh, dw = _same(h, kh, strides[0]), _same(wd, kw, strides[1]), 1, 1
    elif algo == "VALID":
        pt = pb = pl = pr = 0
    oh = (h + pt + pb - dh * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // groups
    for b in range(n):
        for o in range(m):
            g = o // mg
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for ci in range(cg):
                        for a in range(kh):
                            for e in range(kw):
                                hh = i * strides[0] - pt + a * dh
                                ww = j * strides[1] - pl + e * dw
                                if 0 <= hh < h and 0 <= ww < wd:
                                    acc += x[b, g * cg + ci, hh, ww] * w[o, ci, a, e]
                    y[b, o, i, j] = acc
    return y.astype(x.dtype)


def naive_conv_t(x, w, strides=(1, 1), paddings=(0, 0), dilations=(1, 1), groups=1,
                 out_hw=None, algo=None):
    """NCHW transposed convolution: every input element scattered through the filter."""
    n, c, h, wd = x.shape
    _, mg, kh, kw = w.shape
    pt, pb, pl, pr = _pads4(paddings)
    dh, dw = dilations
    if algo == "SAME":
        (pt, pb), (pl, pr), dh, dw = _same(h, kh, strides[0]), _same(wd, kw, strides[1]), 1, 1
    elif algo == "VALID":
        pt = pb = pl = pr = 0
    full_h = (h - 1) * strides[0] + dh * (kh - 1) + 1
    full_w = (wd - 1) * strides[1] + dw * (kw - 1) + 1
    oh, ow = out_hw or (full_h - pt - pb, full_w - pl - pr)
    y = np.zeros((n, mg * groups, max(full_h, oh + pt), max(full_w, ow + pl)))
    cg = c // groups
    for b in range(n):
        for ci in range(c):
            g = ci // cg
            for i in range(h):
                for j in range(wd):
                    for o in range(mg):
                        for a in range(kh):
                            for e in range(kw):
                                y[b, g * mg + o, i * strides[0] + a * dh, j * strides[1] + e * dw] \
                                    += x[b, ci, i, j] * w[ci, o, a, e]
    return y[:, :, pt:pt + oh, pl:pl + ow].astype(x.dtype)


def _nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


CONV_CASES = [
    dict(),
    dict(strides=[2, 1], paddings=[1, 2]),
    dict(strides=[2, 2], paddings=[0, 1, 2, 1], dilations=[1, 2]),
    dict(groups=2, paddings=[1, 1]),
    dict(padding_algorithm="SAME", strides=[2, 2], dilations=[2, 2]),  # SAME ignores dilations
    dict(padding_algorithm="VALID", paddings=[3, 3], strides=[1, 2]),
]


@pytest.mark.parametrize("attrs", CONV_CASES)
def test_conv2d_both_layouts(attrs):
    x = RNG.normal(size=(2, 4, 7, 6)).astype(np.float32)
    w = RNG.normal(size=(6, 4 // attrs.get("groups", 1), 3, 3)).astype(np.float32)
    want = naive_conv(x, w, attrs.get("strides", (1, 1)), attrs.get("paddings", (0, 0)),
                      attrs.get("dilations", (1, 1)), attrs.get("groups", 1),
                      attrs.get("padding_algorithm"))
    check_output("conv2d", {"Input": x, "Filter": w}, attrs, {"Output": want},
                 rtol=1e-4, atol=1e-5, batch_unknown={"Input"})
    check_output("conv2d", {"Input": _nhwc(x), "Filter": w}, dict(attrs, data_format="NHWC"),
                 {"Output": _nhwc(want)}, rtol=1e-4, atol=1e-5)


def test_depthwise_conv2d_and_batch_one():
    x = RNG.normal(size=(1, 3, 9, 8))
    w = RNG.normal(size=(6, 1, 3, 3))  # channel multiplier 2
    attrs = dict(groups=3, strides=[2, 2], paddings=[1, 1])
    want = naive_conv(x, w, (2, 2), (1, 1), groups=3)
    for op in ("depthwise_conv2d", "conv2d"):
        check_output(op, {"Input": x, "Filter": w}, attrs, {"Output": want})


TRANSPOSE_CASES = [
    (dict(), None),
    (dict(strides=[2, 2], paddings=[1, 0]), None),
    (dict(strides=[2, 1], paddings=[1, 1], output_size=[10, 3]), (10, 3)),
    (dict(strides=[2, 2], output_padding=[1, 1], dilations=[2, 1]), "pad"),
    (dict(groups=2, paddings=[0, 1, 1, 0]), None),
    (dict(padding_algorithm="SAME", strides=[2, 2]), None),
    (dict(padding_algorithm="VALID", paddings=[1, 1], strides=[2, 1]), None),
]


@pytest.mark.parametrize("attrs,out", TRANSPOSE_CASES)
def test_conv2d_transpose_both_layouts(attrs, out):
    x = RNG.normal(size=(2, 4, 5, 4))
    g = attrs.get("groups", 1)
    w = RNG.normal(size=(4, 3, 3, 2))
    s, p, d = attrs.get("strides", (1, 1)), attrs.get("paddings", (0, 0)), \
        attrs.get("dilations", (1, 1))
    if out == "pad":
        base = naive_conv_t(x, w, s, p, d, g)
        want = naive_conv_t(x, w, s, p, d, g, out_hw=(base.shape[2] + 1, base.shape[3] + 1))
    else:
        want = naive_conv_t(x, w, s, p, d, g, out_hw=out, algo=attrs.get("padding_algorithm"))
    check_output("conv2d_transpose", {"Input": x, "Filter": w}, attrs, {"Output": want},
                 batch_unknown={"Input"})
    check_output("conv2d_transpose", {"Input": _nhwc(x), "Filter": w},
                 dict(attrs, data_format="NHWC"), {"Output": _nhwc(want)})


def test_depthwise_conv2d_transpose():
    x = RNG.normal(size=(1, 3, 4, 5))
    w = RNG.normal(size=(3, 1, 3, 3))
    attrs = dict(groups=3, strides=[2, 2], paddings=[1, 1])
    check_output("depthwise_conv2d_transpose", {"Input": x, "Filter": w}, attrs,
                 {"Output": naive_conv_t(x, w, (2, 2), (1, 1), groups=3)})


@pytest.mark.parametrize("op,attrs", [
    ("conv2d", dict(strides=[2, 1], paddings=[1, 0, 2, 1], groups=2)),
    ("conv2d", dict(padding_algorithm="SAME", strides=[2, 2], data_format="NHWC")),
    ("depthwise_conv2d", dict(groups=4, dilations=[2, 1], paddings=[2, 1])),
    ("conv2d_transpose", dict(strides=[2, 2], paddings=[1, 0], groups=2)),
    ("conv2d_transpose", dict(strides=[2, 1], output_padding=[1, 0], data_format="NHWC")),
])
def test_conv_grads(op, attrs):
    nhwc = attrs.get("data_format") == "NHWC"
    transpose = op.endswith("transpose")
    groups = attrs.get("groups", 1)
    x = RNG.normal(size=(2, 4, 5, 4))
    w = RNG.normal(size=(4, 2, 3, 2) if transpose else (4, 4 // groups, 3, 2))
    check_grad(op, {"Input": _nhwc(x) if nhwc else x, "Filter": w}, attrs,
               ["Input", "Filter"], "Output", max_relative_error=1e-6)


# ---- pooling ------------------------------------------------------------------------------------
X25 = np.arange(1, 26, dtype=np.float32).reshape(1, 1, 5, 5)

# (attrs, Out) as PaddlePaddle 3.3.1's legacy executor printed them for X25
PADDLE_POOL = [
    (dict(pooling_type="avg", ksize=[3, 3], strides=[2, 2], paddings=[1, 1], exclusive=False,
          ceil_mode=True),
     [[1.7777778, 3.6666667, 3.1111112], [7.6666665, 13., 9.666667],
      [8.444445, 13.666667, 9.777778]]),
    (dict(pooling_type="avg", ksize=[3, 3], strides=[2, 2], paddings=[1, 1], ceil_mode=True),
     [[4., 5.5, 7.], [11.5, 13., 14.5], [19., 20.5, 22.]]),
    (dict(pooling_type="avg", ksize=[2, 2], strides=[2, 2], exclusive=False, ceil_mode=True),
     [[4., 6., 7.5], [14., 16., 17.5], [21.5, 23.5, 25.]]),
    (dict(pooling_type="max", ksize=[2, 2], strides=[2, 2], ceil_mode=True),
     [[7., 9., 10.], [17., 19., 20.], [22., 24., 25.]]),
    (dict(pooling_type="avg", ksize=[2, 3], adaptive=True),
     [[6.5, 8., 9.5], [16.5, 18., 19.5]]),
    (dict(pooling_type="max", ksize=[3, 3], strides=[2, 2], padding_algorithm="SAME"),
     [[7., 9., 10.], [17., 19., 20.], [22., 24., 25.]]),
    # unequal paddings: a window ends at H + the padding *before* (Paddle's CPU kernel)
    (dict(pooling_type="avg", ksize=[2, 2], strides=[2, 2], paddings=[0, 1, 0, 1],
          exclusive=False), [[4., 6., 7.5], [14., 16., 17.5], [21.5, 23.5, 25.]]),
    (dict(pooling_type="avg", ksize=[2, 2], strides=[2, 2], paddings=[1, 0, 1, 0],
          exclusive=False), [[0.25, 1.25, 2.25], [4.25, 10., 12.], [9.25, 20., 22.]]),
    (dict(pooling_type="avg", ksize=[2, 2], paddings=[1, 1], global_pooling=True), [[13.]]),
    (dict(pooling_type="avg", ksize=[2, 2], strides=[2, 2], paddings=[1, 1], exclusive=False,
          padding_algorithm="VALID", ceil_mode=True),
     [[4., 6., 7.5], [14., 16., 17.5], [21.5, 23.5, 25.]]),
]


@pytest.mark.parametrize("attrs,want", PADDLE_POOL)
def test_pool2d_matches_paddle(attrs, want):
    want = np.array(want, np.float32)
    check_output("pool2d", {"X": X25}, attrs, {"Out": want[None, None]}, batch_unknown=True)
    check_output("pool2d", {"X": X25.reshape(1, 5, 5, 1)}, dict(attrs, data_format="NHWC"),
                 {"Out": want[None, :, :, None]})


def naive_pool(x, k, s, p, is_max, exclusive=True, ceil=False):
    """Pooling by the window rule of the module docstring, one output element at a time."""
    n, c, h, w = x.shape
    pt, pb, pl, pr = _pads4(p)
    oh = (h - k[0] + pt + pb + (s[0] - 1 if ceil else 0)) // s[0] + 1
    ow = (w - k[1] + pl + pr + (s[1] - 1 if ceil else 0)) // s[1] + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        a0 = i * s[0] - pt
        a1 = min(a0 + k[0], h + pt)
        for j in range(ow):
            b0 = j * s[1] - pl
            b1 = min(b0 + k[1], w + pl)
            win = x[:, :, max(a0, 0):min(a1, h), max(b0, 0):min(b1, w)]
            if is_max:
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = win.shape[2] * win.shape[3] if exclusive else (a1 - a0) * (b1 - b0)
                y[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return y


@pytest.mark.parametrize("attrs", [
    dict(pooling_type="max", ksize=[3, 2], strides=[2, 1], paddings=[1, 0]),
    dict(pooling_type="avg", ksize=[3, 3], strides=[2, 2], paddings=[1, 2, 0, 1],
         exclusive=False, ceil_mode=True),
])
def test_pool2d_odd_sizes(attrs):
    x = RNG.normal(size=(3, 2, 7, 6))
    want = naive_pool(x, attrs["ksize"], attrs["strides"], attrs["paddings"],
                      attrs["pooling_type"] == "max", attrs.get("exclusive", True),
                      attrs.get("ceil_mode", False))
    check_output("pool2d", {"X": x}, attrs, {"Out": want})


def test_max_pool2d_with_index_matches_paddle():
    check_output("max_pool2d_with_index", {"X": X25},
                 dict(ksize=[3, 3], strides=[2, 2], paddings=[1, 1]),
                 {"Out": np.array([[7, 9, 10], [17, 19, 20], [22, 24, 25]], np.float32)[None, None],
                  "Mask": np.array([[6, 8, 9], [16, 18, 19], [21, 23, 24]], np.int32)[None, None]})
    check_output("max_pool2d_with_index", {"X": X25}, dict(ksize=[2, 2], adaptive=True),
                 {"Out": np.array([[13, 15], [23, 25]], np.float32)[None, None],
                  "Mask": np.array([[12, 14], [22, 24]], np.int32)[None, None]})


@pytest.mark.parametrize("op,attrs", [
    ("pool2d", dict(pooling_type="max", ksize=[2, 2], strides=[2, 2], ceil_mode=True)),
    ("pool2d", dict(pooling_type="avg", ksize=[3, 3], strides=[2, 2], paddings=[1, 1],
                    exclusive=False, data_format="NHWC")),
    ("pool2d", dict(pooling_type="avg", ksize=[2, 3], adaptive=True)),
    ("pool2d", dict(pooling_type="max", ksize=[1, 1], global_pooling=True)),
    ("max_pool2d_with_index", dict(ksize=[3, 3], strides=[2, 2], paddings=[1, 1])),
])
def test_pool_grads(op, attrs):
    x = RNG.permutation(2 * 3 * 5 * 5).reshape(2, 3, 5, 5) / 7.0  # distinct: one max a window
    check_grad(op, {"X": x}, attrs, ["X"])


def test_max_pool_gradient_goes_to_the_first_maximum():
    x = np.ones((1, 1, 2, 2), np.float32)
    prog = fluid.Program()
    with fluid.program_guard(prog, fluid.Program()):
        xv = fluid.layers.data("x", [1, 1, 2, 2], append_batch_size=False, stop_gradient=False)
        y = fluid.layers.pool2d(xv, 2, "max", 2)
        (g,) = fluid.gradients([y], [xv])
    for mode in ("reference", "compiled"):
        exe = fluid.Executor(fluid.CPUPlace(), mode=mode)
        (got,) = exe.run(prog, feed={"x": x}, fetch_list=[g])
        np.testing.assert_array_equal(got, [[[[1, 0], [0, 0]]]])


# ---- layers and errors --------------------------------------------------------------------------
def test_conv_pool_layers_match_numpy(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 9, 9])
    c = fluid.layers.conv2d(x, 4, 3, stride=2, padding=[[0, 0], [0, 0], [1, 0], [0, 1]],
                            act="relu")
    t = fluid.layers.conv2d_transpose(c, 2, filter_size=3, stride=2, groups=2)
    p = fluid.layers.pool2d(t, 3, "avg", 2, pool_padding="SAME")
    a = fluid.layers.adaptive_pool2d(p, [2, 3], "max")
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    xb = RNG.normal(size=(2, 3, 9, 9)).astype(np.float32)
    got = exe.run(main, feed={"x": xb}, fetch_list=[c, t, p, a])
    assert_native(exe)
    scope = fluid.global_scope()
    w0, b0 = (np.asarray(scope.find_var(n).get_tensor()) for n in ("conv2d_0.w_0", "conv2d_0.b_0"))
    w1, b1 = (np.asarray(scope.find_var(n).get_tensor())
              for n in ("conv2d_transpose_0.w_0", "conv2d_transpose_0.b_0"))
    assert w0.shape == (4, 3, 3, 3) and w1.shape == (4, 1, 3, 3)
    want_c = np.maximum(naive_conv(xb, w0, (2, 2), (1, 0, 0, 1)) + b0[:, None, None], 0)
    np.testing.assert_allclose(got[0], want_c, rtol=1e-4, atol=1e-5)
    want_t = naive_conv_t(want_c, w1, (2, 2), groups=2) + b1[:, None, None]
    np.testing.assert_allclose(got[1], want_t, rtol=1e-4, atol=1e-5)
    assert got[2].shape == (2, 2, 5, 5) and got[3].shape == (2, 2, 2, 3)


def test_depthwise_layer_type_and_clear_errors(fresh_programs):
    x = fluid.layers.data("x", [4, 8, 8])
    fluid.layers.conv2d(x, 8, 3, groups=4, use_cudnn=False)
    assert fluid.default_main_program().global_block().ops[-2].type == "depthwise_conv2d"
    w = fluid.layers.create_parameter([4, 3, 3, 3], "float32")
    with pytest.raises(OpShapeError, match=r"conv2d.*4 channels.*expects 3"):
        block = fluid.default_main_program().global_block()
        out = block.create_var(name="bad", dtype="float32")
        block.append_op(type="conv2d", inputs={"Input": [x], "Filter": [w]},
                        outputs={"Output": [out]})
    with pytest.raises(OpShapeError, match=r"output_size\[0\] = 30 .*expected a value in"):
        fluid.layers.conv2d_transpose(x, 2, output_size=30, filter_size=3, stride=2)


def test_misfit_run_time_shapes_give_the_op_error_not_a_crash(fresh_programs):
    """With every dim unknown at build time, a feed whose channels do not fit the filter must
    reach the reference's error (the library kernels index without bounds checks)."""
    x = fluid.layers.data("x", [-1, -1, -1, -1], append_batch_size=False)
    w = fluid.layers.create_parameter([4, 3, 3, 3], "float32", name="w")
    block = fluid.default_main_program().global_block()
    out = block.create_var(name="out", dtype="float32")
    block.append_op(type="conv2d", inputs={"Input": [x], "Filter": [w]},
                    outputs={"Output": [out]})
    pooled = fluid.layers.pool2d(out, 2, "max", 2)
    exe = fluid.Executor(fluid.CPUPlace(), strict=False)
    exe.run(fluid.default_startup_program())
    good = exe.run(feed={"x": np.ones((2, 3, 6, 6), np.float32)}, fetch_list=[pooled])[0]
    assert good.shape == (2, 4, 2, 2)
    assert_native(exe)
    with pytest.raises(Exception, match=r"conv2d.*5 channels.*expects 3"):
        exe.run(feed={"x": np.ones((2, 5, 6, 6), np.float32)}, fetch_list=[pooled])


# ---- epilogues: the elementwise chain after a convolution, run block by block ----------------
def _report(exe, prog, feed, fetch):
    return exe.explain(prog, feed=feed, fetch_list=fetch)


def test_conv_epilogue_runs_block_by_block_and_matches_numpy(fresh_programs):
    """conv -> bias -> relu -> residual add: one compiled call computes blocks of samples and
    runs the chain on each; a chain with an operand broadcast outside the blockable forms
    runs after the whole batch. Both against naive NumPy, native."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 9, 8])
    z = fluid.layers.data("z", [4, 9, 8])
    s = fluid.layers.data("s", [1, 9, 8])   # broadcast over channels: a strided operand
    c = fluid.layers.conv2d(x, 4, 3, padding=1, act="relu")
    out = fluid.layers.elementwise_add(c, z)  # joins the conv's epilogue group
    c2 = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False)
    out2 = fluid.layers.elementwise_mul(c2, s)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    feed = {"x": RNG.normal(size=(5, 3, 9, 8)).astype(np.float32),
            "z": RNG.normal(size=(5, 4, 9, 8)).astype(np.float32),
            "s": RNG.normal(size=(5, 1, 9, 8)).astype(np.float32)}
    got, got2 = exe.run(main, feed=feed, fetch_list=[out, out2])
    assert_native(exe)
    scope = fluid.global_scope()
    w, b = (np.asarray(scope.find_var(n).get_tensor()) for n in ("conv2d_0.w_0", "conv2d_0.b_0"))
    w2 = np.asarray(scope.find_var("conv2d_1.w_0").get_tensor())
    want = np.maximum(naive_conv(feed["x"], w, paddings=(1, 1)) + b[:, None, None], 0) + feed["z"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got2, naive_conv(feed["x"], w2, paddings=(1, 1)) * feed["s"],
                               rtol=1e-4, atol=1e-5)
    report = _report(exe, main, feed, [out, out2])
    # the blocked kernel calls the convolution per block, a batch of one through split_work
    blocked = "_nn.split_work(_nn.conv._fwd_range, 1, W, r0, r1, r2, "
    # (a host loop calls through the replay recorder's hook, ``_kc``)
    assert "_kc(_nn.conv._fwd_range, r0, r1, r2, b0, b1" in report and \
        report.count(blocked) == 1
    assert report.count("_nn.split_work(") == 2
    rest = report.replace(blocked, "")
    assert "_nn.conv._fwd_range" in rest.split("_nn.split_work(")[1]  # the strided one


def test_conv_epilogue_inside_a_native_loop(fresh_programs):
    """In a native loop's compiled driver the block-by-block call runs on this thread."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [2, 2, 5, 5], append_batch_size=False)
    i = fluid.layers.fill_constant([1], "int64", 0)
    n = fluid.layers.fill_constant([1], "int64", 2)
    h = fluid.layers.scale(x, scale=1.0)
    cond = fluid.layers.less_than(i, n)
    loop = fluid.layers.While(cond, is_test=True)
    with loop.block():
        fluid.layers.increment(i, value=1.0, in_place=True)
        y = fluid.layers.conv2d(h, 2, 3, padding=1, act="tanh",
                                param_attr=fluid.ParamAttr(name="lw"),
                                bias_attr=fluid.ParamAttr(name="lb"))
        fluid.layers.assign(y, h)
        fluid.layers.less_than(i, n, cond=cond)
    xv = RNG.normal(size=(2, 2, 5, 5)).astype(np.float32)
    got = {}
    for mode in ("compiled", "reference"):
        exe = fluid.Executor(fluid.CPUPlace(), mode=mode)
        scope = fluid.Scope()
        exe.run(startup, scope=scope)
        got[mode] = exe.run(main, feed={"x": xv}, fetch_list=[h], scope=scope)[0]
        if mode == "compiled":
            kinds = [s.kind for _, plan in exe._plans.values() for s in plan.steps]
            assert "native_loop" in kinds
            assert_native(exe)
            w = np.asarray(scope.find_var("lw").get_tensor())
            b = np.asarray(scope.find_var("lb").get_tensor())
    want = xv
    for _ in range(2):
        want = np.tanh(naive_conv(want, w, paddings=(1, 1)) + b[:, None, None])
    np.testing.assert_allclose(got["compiled"], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["reference"], want, rtol=1e-4, atol=1e-5)


def test_float16_runs_the_references():
    """The library kernels are float32/float64 (BLAS): float16 convolutions and pools run
    their references, with the right answer."""
    x = RNG.normal(size=(1, 2, 5, 5)).astype(np.float16)
    w = RNG.normal(size=(3, 2, 3, 3)).astype(np.float16)
    want = naive_conv(x.astype(np.float64), w.astype(np.float64)).astype(np.float16)
    with warnings.catch_warnings():  # once per process: another test may have seen it first
        warnings.simplefilter("ignore", ReferenceStepWarning)
        got = run_op("conv2d", {"Input": x, "Filter": w}, {}, mode="compiled")
    np.testing.assert_allclose(got["Output"].astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("seed", range(12))
def test_direct_depthwise_kernel_against_naive(seed):
    """The direct (depthwise) library kernel on random geometry: strides 1-3 per axis,
    dilations, asymmetric paddings wider than the filter, 1..5-tap filters, channel
    multipliers 1-4, rectangular planes (it splits each padded plane by stride phase)."""
    from pdjit.codegen.cpu.lib import conv

    r = np.random.default_rng(seed)
    groups, mult = int(r.integers(1, 5)), int(r.integers(1, 5))
    kh, kw = int(r.integers(1, 6)), int(r.integers(1, 6))
    sh, sw, dh, dw = (int(v) for v in r.integers(1, 4, 4))
    pt, pl = int(r.integers(0, 6)), int(r.integers(0, 6))
    h = int(r.integers(max(1, dh * (kh - 1) + 1 - 2 * pt), 14))
    wd = int(r.integers(max(1, dw * (kw - 1) + 1 - 2 * pl), 14))
    x = r.normal(size=(2, groups, h, wd))
    w = r.normal(size=(groups * mult, 1, kh, kw))
    want = naive_conv(x, w, (sh, sw), (pt, pl), (dh, dw), groups)
    assert conv.use_direct(1, mult)
    y = np.full(want.shape, np.nan)
    conv.conv2d_fwd(x, w, y, sh, sw, pt, pl, dh, dw, groups)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_depthwise_and_max_pool_plane_kernels_over_rows_of_several_vectors():
    """The plane kernels (float32: rows of 16-lane vectors) of depthwise filters 3x3, 5x5 and
    7x7 and of the 3x3 max pool, at strides 1 and 2, on planes whose rows span several
    vectors and end part-way through one (a 3x3 filter's columns of vectors at stride 1 by
    fours, then twos, at stride 2 by twos, plain where all lie inside the image, else masked
    (the rest one at a time); at stride 2 a last column whose loads read one column past the
    row, unused: plain where the array goes on, masked in its last plane), every padding the
    filter allows, against loops written here."""
    from pdjit.codegen.cpu.lib import conv, pool

    r = np.random.default_rng(7)
    # (50 columns padded by 1 at stride 2: the last column of vectors, outputs 17..24 of 25,
    # reads input columns up to 50 and uses up to 49)
    for k in (3, 5, 7):
        for s in (1, 2):
            for h, wd in ((9, 37), (20, 50), (6, 70)):
                for p in range(max(0, (k - h + 1) // 2), k // 2 + 1):
                    x = r.normal(size=(2, 3, h, wd)).astype(np.float32)
                    w = r.normal(size=(3, 1, k, k)).astype(np.float32)
                    want = naive_conv(x.astype(np.float64), w.astype(np.float64), (s, s),
                                      (p, p), (1, 1), 3)
                    y = np.full(want.shape, np.nan, np.float32)
                    conv.conv2d_fwd(x, w, y, s, s, p, p, 1, 1, 3)
                    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(
                        want).max(), err_msg=f"k {k} stride {s} plane {h}x{wd} pad {p}")
    for h, wd in ((9, 37), (20, 50), (112, 112)):
        for p in (0, 1):
            x = r.normal(size=(1, 4, h, wd)).astype(np.float32)
            xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
            oh, ow = (h + 2 * p - 3) // 2 + 1, (wd + 2 * p - 3) // 2 + 1
            want = np.empty((1, 4, oh, ow), np.float32)
            for i in range(oh):
                for j in range(ow):
                    want[:, :, i, j] = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3))
            y = np.full(want.shape, np.nan, np.float32)
            pool._max33(x, y, 0, 4, 2, p, p)
            np.testing.assert_array_equal(y, want, err_msg=f"pool plane {h}x{wd} pad {p}")



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_2x2_pool_plane_kernels_max_and_average(dtype):
    """The 2x2 stride-2 plane kernels (vectors of outputs from pairs of input rows), max and
    average, on planes whose output rows span several vectors and end part-way through one,
    odd sizes (the last row and column unread), through the entries the lowering calls and
    the general one, against :func:`naive_pool`."""
    from pdjit.codegen.cpu.lib import pool

    r = np.random.default_rng(11)
    for h, wd in ((4, 4), (9, 37), (20, 66), (56, 56), (7, 130)):
        x = r.normal(size=(2, 3, h, wd)).astype(dtype)
        for is_max in (True, False):
            want = naive_pool(x.astype(np.float64), (2, 2), (2, 2), [0, 0], is_max)
            for call in ("entry", "general"):
                y = np.full(want.shape, np.nan, dtype)
                if call == "general":
                    pool.pool2d_fwd(x, y, 2, 2, 2, 2, 0, 0, is_max, False, False)
                elif is_max:
                    pool.pool2d_max22(x, y)
                else:
                    pool.pool2d_avg22(x, y)
                where = f"{'max' if is_max else 'avg'} {h}x{wd} {call} {np.dtype(dtype)}"
                if is_max:
                    np.testing.assert_array_equal(y, want, err_msg=where)
                else:
                    np.testing.assert_allclose(y, want, rtol=4 * np.finfo(dtype).eps,
                                               atol=4 * np.finfo(dtype).eps, err_msg=where)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_3x3_average_pool_plane_kernel(dtype):
    """The 3x3 average windows at strides 1 and 2 (vectors of outputs, each input row's taps
    summed once for the output rows that read it, then divided per lane by the window's
    count): exclusive or not, padded by 0, 1 or 2 (windows that reach past the image and,
    in ceil mode, past its padding), on planes narrower than a vector, spanning several
    and ending part-way through one, through the entry the lowering calls, the general
    one, and on the team's ranges of planes, against :func:`naive_pool`."""
    from pdjit.codegen.cpu.lib import pool

    r = np.random.default_rng(12)
    for h, wd in ((3, 5), (9, 37), (17, 17), (35, 35), (8, 70)):
        x = r.normal(size=(2, 3, h, wd)).astype(dtype)
        for s in (1, 2):
            for p in (0, 1, 2):
                for exclusive in (True, False):
                    for ceil in (False, True):
                        with np.errstate(invalid="ignore"):  # (a window past the image)
                            want = naive_pool(x.astype(np.float64), (3, 3), (s, s), [p, p],
                                              False, exclusive, ceil)
                        for call in ("entry", "general", "team"):
                            y = np.full(want.shape, np.nan, dtype)
                            if call == "entry":
                                pool.pool2d_avg33(x, y, s, p, p, exclusive)
                            elif call == "general":
                                pool.pool2d_fwd(x, y, 3, 3, s, s, p, p, False, exclusive, False)
                            else:
                                pool._planes_by_team(x, y, 3, s, p, p, False, exclusive, 2)
                            np.testing.assert_allclose(
                                y, want, rtol=8 * np.finfo(dtype).eps,
                                atol=8 * np.finfo(dtype).eps,
                                err_msg=f"{h}x{wd} stride {s} pad {p} exclusive {exclusive} "
                                        f"ceil {ceil} {call} {np.dtype(dtype)}")


def test_3x3_average_pools_of_a_program_run_natively(fresh_programs):
    """Inception's branch pool (3x3, stride 1, padded by 1, not exclusive) and a strided
    exclusive one, in a program, on the plane kernel: native code, NumPy's values."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [6, 35, 35])
    inc = fluid.layers.pool2d(x, 3, "avg", 1, 1, exclusive=False)
    exc = fluid.layers.pool2d(x, 3, "avg", 2, 1)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    xb = RNG.normal(size=(2, 6, 35, 35)).astype(np.float32)
    got = exe.run(main, feed={"x": xb}, fetch_list=[inc, exc])
    assert_native(exe)
    np.testing.assert_allclose(got[0], naive_pool(xb, (3, 3), (1, 1), [1, 1], False, False),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], naive_pool(xb, (3, 3), (2, 2), [1, 1], False, True),
                               rtol=1e-6, atol=1e-6)


def test_2x2_pools_of_a_program_run_natively(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data("x", [5, 12, 34])
    avg = fluid.layers.pool2d(x, 2, "avg", 2)
    mx = fluid.layers.pool2d(x, 2, "max", 2)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    xb = RNG.normal(size=(2, 5, 12, 34)).astype(np.float32)
    got = exe.run(main, feed={"x": xb}, fetch_list=[avg, mx])
    assert_native(exe)
    np.testing.assert_allclose(got[0], naive_pool(xb, (2, 2), (2, 2), [0, 0], False),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[1], naive_pool(xb, (2, 2), (2, 2), [0, 0], True))

# ---- the taps kernel: convolutions with few output channels, without im2col ------------------
TAPS_CASES = [  # (n, c, h, w, m, kh, kw, strides, paddings [t, b, l, r], dilations, groups)
    (1, 1, 12, 12, 6, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 1),  # 6 rows: two overlapping fours
    (2, 4, 32, 32, 4, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # the image itself; rows 4 KiB apart
    (2, 8, 16, 16, 8, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # the image itself, rows in place
    (2, 3, 9, 13, 2, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),   # 3 taps padded to 4, 2 rows aside
    (1, 4, 23, 26, 8, 3, 3, (2, 3), (1, 2, 0, 2), (1, 2), 2),  # groups, strides, dilation, pads
    (1, 6, 14, 14, 5, 5, 5, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 100 outputs, computed to 112
    (2, 6, 16, 16, 5, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),  # 1x1 stride 2: one row phase
    (1, 2, 26, 21, 3, 3, 2, (3, 2), (2, 0, 1, 1), (2, 3), 1),  # row phases read by dilation
    (1, 2, 16, 16, 34, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 34 channels over 256 outputs
    # "same" convolutions: each plane row block one copy, the columns outside zeroed after
    (1, 3, 10, 11, 5, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 1),
    (1, 4, 9, 12, 6, 3, 3, (1, 1), (0, 2, 1, 1), (1, 1), 2),
    (1, 2, 70, 1, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),    # one column: side taps all zero
]


def _taps_case(seed):
    """A random geometry the taps kernel serves (at least 64 outputs per channel)."""
    r = np.random.default_rng(seed)
    while True:
        groups = int(r.integers(1, 3))
        cg, mg = int(r.integers(1, 4)), int(r.integers(1, 7))
        kh, kw = int(r.integers(1, 4)), int(r.integers(1, 4))
        sh, sw, dh, dw = (int(v) for v in r.integers(1, 3, 4))
        pads = tuple(int(v) for v in r.integers(0, 3, 4))
        h, w = int(r.integers(8, 22)), int(r.integers(8, 22))
        oh = (h + pads[0] + pads[1] - dh * (kh - 1) - 1) // sh + 1
        ow = (w + pads[2] + pads[3] - dw * (kw - 1) - 1) // sw + 1
        if oh * ow >= 64:
            return (1, groups * cg, h, w, groups * mg, kh, kw, (sh, sw), pads, (dh, dw), groups)


@pytest.mark.parametrize("case", TAPS_CASES + [_taps_case(s) for s in range(6)])
def test_taps_kernel_against_naive(case):
    """The convolution that reads the image through a table of tap offsets (few output
    channels per group, 64+ outputs each): float32 and float64 against the naive loops, the
    library entry as the compiled plans call it (all of y written: it starts as NaN)."""
    from pdjit.codegen.cpu.lib import conv

    n, c, h, w, m, kh, kw, strides, pads, dils, groups = case
    r = np.random.default_rng(abs(hash(case)) % 2**32)
    x = r.normal(size=(n, c, h, w))
    wt = r.normal(size=(m, c // groups, kh, kw))
    want = naive_conv(x, wt, strides, pads, dils, groups)
    assert conv._use_taps(m // groups, wt[0].size, want.shape[2] * want.shape[3])
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 2e-5)):
        y = np.full(want.shape, np.nan, dtype)
        conv.conv2d_fwd(x.astype(dtype), wt.astype(dtype), y, *strides, pads[0], pads[2], *dils,
                        groups)
        np.testing.assert_allclose(y, want, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("xshape,wshape,pads,dils", [
    ((2, 3, 5, 1), (40, 3, 3, 3), (1, 1, 1, 1), (1, 1)),  # one column: side taps all zero
    ((2, 2, 3, 5), (8, 2, 3, 3), (2, 2, 2, 2), (2, 2)),
    ((1, 2, 2, 6), (36, 2, 3, 3), (0, 2, 1, 1), (1, 1)),
])
def test_im2col_of_same_convolutions_through_blas(xshape, wshape, pads, dils):
    """Stride-1 convolutions with as many output columns as image columns copy each patch
    row's rows inside the image in one piece (then zero the columns outside): the BLAS path
    (small planes, many channels) against the naive loops."""
    from pdjit.codegen.cpu.lib import conv

    x, w = RNG.normal(size=xshape), RNG.normal(size=wshape)
    want = naive_conv(x, w, (1, 1), pads, dils)
    assert want.shape[3] == xshape[3]
    assert not conv._use_taps(wshape[0], w[0].size, want.shape[2] * want.shape[3])
    y = np.full(want.shape, np.nan)
    conv.conv2d_fwd(x, w, y, 1, 1, pads[0], pads[2], *dils, 1)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def _driver_source(prog, fetch):
    """The generated host driver of ``prog``'s first segment (nothing compiles)."""
    from pdjit.codegen.lowering import SegmentGen
    from pdjit.codegen.target import get_target
    from pdjit.passes.fusion import live_names, partition

    block = prog.global_block()
    ops = [op for op in block.ops if op.type not in ("feed", "fetch")]
    live = live_names(prog, block, [fetch.name])
    part = partition(block, ops, live, target=get_target("cpu"))
    gen = SegmentGen(part.segments[0], block, live)
    gen.generate()
    return gen.source("segment")


@pytest.mark.parametrize("after", ["pool", "bn_test", "bn_batch_stats", "trained"])
def test_a_convolution_alone_runs_its_blocked_kernels_in_inference_programs(after):
    """A 3x3 convolution with nothing elementwise after it (a pooling, a batch norm of batch
    statistics) runs the kernels of its blocked form (``conv._fwd_range``, which has
    Winograd's) when no op writes its filter; one a batch norm in test mode reads (the
    inference passes would fold it), or whose filter an optimizer writes, keeps the plain
    call (the taps kernel alone)."""
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start), fluid.unique_name.guard():
        x = fluid.layers.data("x", [32, 12, 12])
        c = fluid.layers.conv2d(x, 32, 3, padding=1, bias_attr=False)
        if after == "pool" or after == "trained":
            y = fluid.layers.pool2d(c, 2, pool_stride=2)
        else:
            y = fluid.layers.batch_norm(c, is_test=after == "bn_test")
        if after == "trained":
            fluid.optimizer.SGD(0.1).minimize(fluid.layers.mean(y))
    source = _driver_source(prog, y)
    blocked = after in ("pool", "bn_batch_stats")
    assert ("split_work(_nn.conv._fwd_range_3x3" in source) == blocked, source
    assert ("_nn.conv2d_fwd(" in source) != blocked, source
