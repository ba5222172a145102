"""fluid.nets: glu and scaled_dot_product_attention against NumPy written here; the image
conv nets build, run natively, and simple_img_conv_pool matches a NumPy convolution."""
from __future__ import annotations

import numpy as np
import pytest

import pdjit as fluid
from pdjit import nets

RNG = np.random.default_rng(11)


def _run(main, startup, feed, fetch):
    """Run ``main`` with a strict executor; every step of its plan must be native."""
    scope = fluid.Scope()
    fluid.Executor(fluid.CPUPlace(), mode="reference").run(startup, scope=scope)  # no compile
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    got = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
    steps = [s for _, plan in exe._plans.values() for s in plan.walk()]
    assert steps and all(s.kind.startswith("native") for s in steps), \
        [s.describe() for s in steps]
    return got, scope


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_glu_halves_the_dim_and_gates():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 3, 6], "float32")
        last = nets.glu(x)
        with pytest.raises(ValueError, match="along dim 1 must be even.*got 3"):
            nets.glu(x, dim=1)
        with pytest.raises(ValueError, match="dim=3 is out of range"):
            nets.glu(x, dim=3)
    assert list(last.shape) == [-1, 3, 3]
    xv = RNG.standard_normal((2, 3, 6)).astype("float32")
    (got,), _ = _run(main, startup, {"x": xv}, [last])
    want = xv[..., :3] * _sigmoid(xv[..., 3:])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _attention_program(num_heads, dropout_rate=0.0):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        q = fluid.data("q", [-1, 3, 4], "float32")
        k = fluid.data("k", [-1, 5, 4], "float32")
        v = fluid.data("v", [-1, 5, 6], "float32")
        out = nets.scaled_dot_product_attention(q, k, v, num_heads=num_heads,
                                                dropout_rate=dropout_rate)
    return main, startup, out


ATT_FEED = {"q": RNG.standard_normal((2, 3, 4)).astype("float32"),
            "k": RNG.standard_normal((2, 5, 4)).astype("float32"),
            "v": RNG.standard_normal((2, 5, 6)).astype("float32")}


def _np_attention(q, k, v, heads):
    def split(x):
        n, L, h = x.shape
        return x.reshape(n, L, heads, h // heads).transpose(0, 2, 1, 3)

    qs, ks, vs = split(q), split(k), split(v)
    w = _softmax(qs @ ks.transpose(0, 1, 3, 2) / np.sqrt(k.shape[-1] // heads))
    o = w @ vs
    return o.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], v.shape[-1])


def test_scaled_dot_product_attention_one_head():
    main, startup, out = _attention_program(1)
    assert list(out.shape) == [-1, 3, 6]
    (got,), _ = _run(main, startup, ATT_FEED, [out])
    f = {n: a.astype(np.float64) for n, a in ATT_FEED.items()}
    np.testing.assert_allclose(got, _np_attention(f["q"], f["k"], f["v"], 1), rtol=1e-5,
                               atol=1e-6)


def test_scaled_dot_product_attention_two_heads_projects_each_input():
    main, startup, out = _attention_program(2)
    assert list(out.shape) == [-1, 3, 6]
    (got,), scope = _run(main, startup, ATT_FEED, [out])
    params = {p.name: np.array(scope.find_var(p.name).get_tensor(), np.float64)
              for p in main.all_parameters()}
    assert len(params) == 6  # a weight and a bias per projection
    ws = sorted(n for n in params if ".w_" in n)
    bs = sorted(n for n in params if ".b_" in n)
    proj = [ATT_FEED[n].astype(np.float64) @ params[w] + params[b]
            for n, w, b in zip("qkv", ws, bs)]
    np.testing.assert_allclose(got, _np_attention(*proj, 2), rtol=1e-4, atol=1e-5)


def test_scaled_dot_product_attention_bad_input_and_dropout():
    main, startup, out = _attention_program(1, dropout_rate=0.5)
    assert "dropout" in [op.type for op in main.global_block().ops]
    with fluid.program_guard(main, startup):
        q, k = main.global_block().var("q"), main.global_block().var("k")
        v = main.global_block().var("v")
        with pytest.raises(ValueError, match="one hidden size, got 4 and 6"):
            nets.scaled_dot_product_attention(q, v, v)
        with pytest.raises(ValueError, match=r"hidden size of keys \(4\) must be known and "
                                             r"divisible by num_heads \(3\)"):
            nets.scaled_dot_product_attention(q, k, v, num_heads=3)
        with pytest.raises(ValueError, match="must be 3-D"):
            nets.scaled_dot_product_attention(fluid.data("q2", [-1, 4], "float32"), k, v)


def _np_conv_relu_maxpool(x, w, b, pool):
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    oh, ow = h - kh + 1, wd - kw + 1
    out = np.zeros((n, f, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i:i + kh, j:j + kw]
            out[:, :, i, j] = np.einsum("nchw,fchw->nf", patch, w)
    out = np.maximum(out + b.reshape(1, -1, 1, 1), 0)
    return out.reshape(n, f, oh // pool, pool, ow // pool, pool).max(axis=(3, 5))


def test_simple_img_conv_pool_matches_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = fluid.data("img", [-1, 2, 6, 6], "float32")
        out = nets.simple_img_conv_pool(img, num_filters=3, filter_size=3, pool_size=2,
                                        pool_stride=2, act="relu")
    assert list(out.shape) == [-1, 3, 2, 2]
    xv = RNG.standard_normal((2, 2, 6, 6)).astype("float32")
    (got,), scope = _run(main, startup, {"img": xv}, [out])
    w, b = (np.array(scope.find_var(p.name).get_tensor(), np.float64)
            for p in main.all_parameters())
    np.testing.assert_allclose(got, _np_conv_relu_maxpool(xv.astype(np.float64), w, b, 2),
                               rtol=1e-4, atol=1e-5)


def test_img_conv_group_builds_and_runs_natively():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = fluid.data("img", [-1, 2, 6, 6], "float32")
        # the convolutions of simple_img_conv_pool's test (no padding, relu): kernels shared
        out = nets.img_conv_group(img, conv_num_filter=[3, 3], pool_size=2, pool_stride=2,
                                  conv_padding=0, conv_act="relu")
        with pytest.raises(ValueError, match="conv_padding must have one entry per "
                                             "convolution: expected 2"):
            nets.img_conv_group(img, [3, 3], 2, conv_padding=[1, 1, 1])
        with pytest.raises(TypeError, match="conv_num_filter must be a non-empty list"):
            nets.img_conv_group(img, 3, 2)
    assert list(out.shape) == [-1, 3, 1, 1]
    plain = ["conv2d", "elementwise_add", "relu"]
    assert [op.type for op in main.global_block().ops] == plain * 2 + ["pool2d"]
    bn_main = fluid.Program()  # built only (its batch norm would compile kernels of its own)
    with fluid.program_guard(bn_main, fluid.Program()), fluid.unique_name.guard():
        img = fluid.data("img", [-1, 2, 6, 6], "float32")
        with_bn = nets.img_conv_group(img, conv_num_filter=(3, 3), pool_size=2, pool_stride=2,
                                      conv_act="relu", conv_with_batchnorm=[True, False],
                                      conv_batchnorm_drop_rate=[0.5, 0.0])
    assert list(with_bn.shape) == [-1, 3, 3, 3]
    assert [op.type for op in bn_main.global_block().ops] == \
        ["conv2d", "elementwise_add", "batch_norm", "relu", "dropout"] + plain + ["pool2d"]
    xv = RNG.standard_normal((2, 2, 6, 6)).astype("float32")
    (got,), scope = _run(main, startup, {"img": xv}, [out])
    w1, b1, w2, b2 = (np.array(scope.find_var(p.name).get_tensor(), np.float64)
                      for p in main.all_parameters()[:4])
    h = _np_conv_relu_maxpool(xv.astype(np.float64), w1, b1, 1)
    np.testing.assert_allclose(got, _np_conv_relu_maxpool(h, w2, b2, 2), rtol=1e-4, atol=1e-5)
