"""The inference pass ``channels_last`` (``pdjit.passes.layout``) on the CPU target.

Oracle: a MobileNetV2-like model (a 3x3 stem, inverted residual blocks of 1x1 and depthwise
convolutions with batch norm and relu6, a residual add, global pooling, fc) written in NumPy
here from the values of the scope it was saved from. Through the Predictor, the chain of
the stem and the blocks runs on NHWC images (its convolutions and global pool switched,
transposes at its ends) and gives the oracle's values, every step natively; a value of the
chain that is fetched keeps its name, layout and value; squeeze-and-excitation blocks
(MobileNetV3's) stay in the chain; a chain whose conversions would cost more than it gains,
and a program optimized for no target, are left alone; an ahead-of-time artifact runs the
chain as the Predictor does.
"""
import collections
import shutil

import numpy as np
import pytest
from saved_models import load_artifact, save_drawn

import pdjit as fluid
import pdjit.inference as inference
from pdjit.codegen.target import get_target
from pdjit.passes.inference import optimize
from pdjit.testing import assert_native

RNG = np.random.default_rng(49)


def _bn(x, v, name):
    w, b, mean, var = (v[f"{name}.{k}"] for k in ("w_0", "b_0", "w_1", "w_2"))
    shape = (1, -1, 1, 1)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5) * \
        w.reshape(shape) + b.reshape(shape)


def _conv(x, w, stride=1, pad=0, groups=1):
    """NCHW convolution by naive loops over the taps (float64)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // groups
    for o in range(m):
        g = o // mg
        for ci in range(cg):
            for i in range(kh):
                for j in range(kw):
                    y[:, o] += w[o, ci, i, j] * xp[:, g * cg + ci, i:i + stride * oh:stride,
                                                   j:j + stride * ow:stride]
    return y


def _relu6(x):
    return np.minimum(np.maximum(x, 0), 6)


def _build(fluid, h):
    """The model's layers (Fluid API): its input, output and one value inside the chain."""
    x = fluid.layers.data("x", [3, 2 * h, 2 * h])
    L = fluid.layers

    def cbr(t, m, k, stride=1, groups=1, act="relu6"):
        t = L.conv2d(t, m, k, stride=stride, padding=(k - 1) // 2, groups=groups,
                     bias_attr=False)
        return L.batch_norm(t, act=act)

    t = cbr(x, 16, 3, stride=2)                        # stem: 3x3 stride 2 onto 6x6
    t = cbr(t, 48, 1)
    inner = cbr(t, 48, 3, groups=48)                   # depthwise
    t = cbr(inner, 24, 1, act=None)                    # projection
    u = cbr(t, 72, 1)
    u = cbr(u, 72, 3, groups=72)
    u = cbr(u, 24, 1, act=None)
    t = L.elementwise_add(t, u)                        # residual
    t = cbr(t, 40, 1)
    y = L.fc(L.pool2d(t, pool_type="avg", global_pooling=True), 10)
    return x, y, inner


def _forward(xv, v):
    def cbr(t, w, name, stride=1, groups=1, act=True):
        k = v[w].shape[2]
        t = _bn(_conv(t, v[w], stride, (k - 1) // 2, groups), v, name)
        return _relu6(t) if act else t

    t = cbr(xv, "conv2d_0.w_0", "batch_norm_0", stride=2)
    t = cbr(t, "conv2d_1.w_0", "batch_norm_1")
    inner = cbr(t, "conv2d_2.w_0", "batch_norm_2", groups=48)
    t = cbr(inner, "conv2d_3.w_0", "batch_norm_3", act=False)
    u = cbr(t, "conv2d_4.w_0", "batch_norm_4")
    u = cbr(u, "conv2d_5.w_0", "batch_norm_5", groups=72)
    u = cbr(u, "conv2d_6.w_0", "batch_norm_6", act=False)
    t = cbr(t + u, "conv2d_7.w_0", "batch_norm_7")
    y = t.mean(axis=(2, 3)) @ v["fc_0.w_0"] + v["fc_0.b_0"]
    return y, inner


@pytest.fixture
def saved(fresh_programs, tmp_path, monkeypatch):
    """The model saved (outputs: the result, then the depthwise layer's output) with random
    weights and batch norm statistics; ``(dir, values)``."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    x, y, inner = _build(fluid, 6)

    def draw(name, shape):
        if name.endswith("w_2"):  # a variance
            return RNG.uniform(0.5, 2, shape)
        return RNG.standard_normal(shape) * (0.3 if len(shape) > 1 else 0.5)
    return tmp_path, save_drawn(main, startup, [x], [y, inner], tmp_path, draw)


def _predictor(d, layout=True):
    cfg = inference.Config(str(d / "m.pdmodel"), str(d / "m.pdiparams"))
    if not layout:
        cfg.delete_pass("channels_last")
    return inference.create_predictor(cfg)


def _artifact_as_predictor(d, name, xv):
    """The outputs of the ahead-of-time artifact ``name`` in ``d`` for ``x`` = ``xv``, each
    asserted bit for bit the Predictor's on the model saved there."""
    got = load_artifact(d, name).run({"x": xv})
    for g, w in zip(got, _predictor(d).run([xv])):
        np.testing.assert_array_equal(g, w)
    return got


def test_the_chain_runs_channels_last_and_gives_the_oracle(saved):
    d, values = saved
    pred = _predictor(d)
    ops = pred.program().global_block().ops
    kinds = collections.Counter(op.type for op in ops)
    switched = [op for op in ops if op.all_attrs().get("data_format") == "NHWC"]
    # every convolution (the stem's 3x3 stride 2 onto a 6x6 plane, 1x1 and depthwise ones
    # after it) and the global pool, converted at the chain's two ends (into it before the
    # stem, out of it after the pool: [N, 40, 1, 1]) and where the depthwise layer's output
    # is fetched
    assert len(switched) == 9 and kinds["transpose"] == 3
    assert [op.type for op in switched].count("pool2d") == 1
    assert all(op.all_attrs().get("data_format") == "NHWC" for op in ops
               if op.type == "conv2d" and op.input("Filter") == ["conv2d_0.w_0"])
    xv = RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)
    y, inner = pred.run([xv])
    want_y, want_inner = _forward(xv.astype(np.float64), values)
    assert inner.shape == (2, 48, 6, 6)          # fetched NCHW, as the model says
    np.testing.assert_allclose(inner, want_inner, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
    assert_native(pred._exe)
    # the same values without the pass (the NCHW kernels)
    y0, inner0 = _predictor(d, layout=False).run([xv])
    np.testing.assert_allclose(y, y0, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(inner, inner0, rtol=1e-4, atol=1e-4)
    # one sample (the kernels' one-sample paths)
    y1, _ = pred.run([xv[:1]])
    np.testing.assert_allclose(y1, want_y[:1], rtol=1e-4, atol=1e-4)


def test_no_target_and_chains_that_do_not_pay_are_left_alone(fresh_programs):
    main, startup = fresh_programs
    L = fluid.layers
    x = L.data("x", [8, 6, 6])
    # three convolutions in a row, converted at both ends: three switched ops for two
    # conversions (each conversion needs two)
    t = L.conv2d(x, 8, 3, padding=1, act="relu")
    t = L.conv2d(t, 16, 1, act="relu")
    y = L.conv2d(t, 8, 3, padding=1)
    exe = fluid.Executor()
    scope = fluid.Scope()
    with fluid.scope_guard(scope):
        exe.run(startup)
        params = {p.name: np.asarray(scope.find_var(p.name).value)
                  for p in main.global_block().all_parameters()}
    prog = main.clone(for_test=True)
    for target in (get_target("cpu"), None):
        new, _ = optimize(prog, params, target=target)
        ops = new.global_block().ops
        assert not any(op.type == "transpose" for op in ops)
        assert all(op.all_attrs().get("data_format", "NCHW") == "NCHW" for op in ops)
    del y


def test_the_cpu_target_takes_convolutions_onto_small_planes(fresh_programs):
    """What the CPU target answers the pass (``lowerings.conv.channels_last``): any convolution
    of one group onto a plane of at most 14x14 from one at most its strides' product larger
    (3x3 and 1x1 at stride 2 from 28x28, 3x3 at stride 1 on 14x14); not 3x3 at stride 1 on
    28x28 nor at stride 2 onto 28x28, nor a grouped one that is not depthwise; and which
    kernel serves each."""
    from pdjit.codegen.cpu.lowerings.conv import _channels_last_kind, channels_last

    L = fluid.layers
    x28, x14 = L.data("x28", [16, 28, 28]), L.data("x14", [16, 14, 14])
    x56 = L.data("x56", [16, 56, 56])
    L.conv2d(x28, 8, 3, stride=2, padding=1)
    L.conv2d(x28, 8, 1, stride=2)
    L.conv2d(x14, 8, 3, padding=1)
    L.conv2d(x28, 8, 3, padding=1)
    L.conv2d(x14, 8, 3, padding=1, groups=4)
    L.conv2d(x56, 8, 3, stride=2, padding=1)
    x7 = L.data("x7", [16, 7, 7])
    L.conv2d(x14, 32, 3, padding=1)
    L.conv2d(x7, 32, 3, padding=2)
    L.conv2d(x7, 32, 3, padding=3)
    main, _ = fresh_programs
    convs = [op for op in main.global_block().ops if op.type == "conv2d"]
    assert [channels_last(op) for op in convs] == [True, True, True, False, False, False,
                                                   True, True, True]
    # the kernels: a 3x3 stride-1 filter of 32 output channels or more padded by at most 2
    # on Winograd's, the others on the direct one
    assert [_channels_last_kind(op) for op in convs if channels_last(op)] == \
        ["conv_nhwc", "conv_nhwc", "conv_nhwc", "winograd_nhwc", "winograd_nhwc", "conv_nhwc"]


def test_the_cpu_target_takes_wide_convolutions_on_any_plane(fresh_programs):
    """On planes larger than ``MAX_PLANE`` (56x56, 30x30) a convolution of one group reading
    ``WIDE_CHANNELS`` channels or more runs channels-last (1x1 at stride 1 and 2, 3x3 at
    stride 1 and 2); not one reading fewer (63, a 3-channel stem), a grouped or depthwise one,
    and each kernel as on small planes."""
    from pdjit.codegen.cpu.lowerings.conv import (
        MAX_PLANE,
        WIDE_CHANNELS,
        _channels_last_kind,
        channels_last,
    )

    assert 30 * 30 > MAX_PLANE and WIDE_CHANNELS == 64
    L = fluid.layers
    x56, x30 = L.data("x56", [64, 56, 56]), L.data("x30", [256, 30, 30])
    L.conv2d(x56, 256, 1)
    L.conv2d(x56, 64, 3, padding=1)
    L.conv2d(x30, 128, 3, stride=2, padding=1)
    L.conv2d(x30, 512, 1, stride=2)
    L.conv2d(L.data("x63", [63, 30, 30]), 64, 1)
    L.conv2d(L.data("stem", [3, 224, 224]), 64, 7, stride=2, padding=3)
    L.conv2d(x56, 64, 3, padding=1, groups=2)
    L.conv2d(x56, 64, 3, padding=1, groups=64)
    main, _ = fresh_programs
    convs = [op for op in main.global_block().ops if op.type == "conv2d"]
    assert [channels_last(op) for op in convs] == [True] * 4 + [False] * 4
    assert [_channels_last_kind(op) for op in convs[:4]] == \
        ["pointwise_nhwc", "winograd_nhwc", "conv_nhwc", "conv_nhwc"]


def test_a_wide_block_on_a_large_plane_runs_channels_last(fresh_programs, tmp_path,
                                                          monkeypatch):
    """A bottleneck block of 64 channels on a 30x30 plane (ResNet's first stages, smaller):
    its five convolutions (1x1, 3x3 on Winograd's kernel, 1x1 to 128, the 1x1 shortcut, a 3x3
    stride 2 onto 15x15 after the residual add) on NHWC images, converted only at the input
    and the output, giving the oracle's values (NumPy loops here) and the NCHW kernels'."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    L = fluid.layers
    x = L.data("x", [64, 30, 30])
    t = L.conv2d(x, 64, 1, act="relu")
    t = L.conv2d(t, 64, 3, padding=1, act="relu")
    t = L.conv2d(t, 128, 1)
    u = L.relu(L.elementwise_add(t, L.conv2d(x, 128, 1)))
    y = L.conv2d(u, 64, 3, stride=2, padding=1, act="relu")

    def draw(name, shape):
        if len(shape) == 4:
            return RNG.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        return RNG.standard_normal(shape) * 0.1
    values = save_drawn(main, startup, [x], [y], tmp_path, draw)
    pred = _predictor(tmp_path)
    ops = pred.program().global_block().ops
    assert sum(op.all_attrs().get("data_format") == "NHWC" for op in ops
               if op.type == "conv2d") == 5
    assert sum(op.type == "transpose" for op in ops) == 2
    xv = RNG.standard_normal((2, 64, 30, 30)).astype(np.float32)
    (got,) = pred.run([xv])

    def conv(t, i, stride=1):
        w = values[f"conv2d_{i}.w_0"]
        out = _conv(t, w, stride, (w.shape[2] - 1) // 2)
        return out + values[f"conv2d_{i}.b_0"].reshape(1, -1, 1, 1)

    relu = lambda t: np.maximum(t, 0)  # noqa: E731
    x64 = xv.astype(np.float64)
    t = conv(relu(conv(relu(conv(x64, 0)), 1)), 2)
    want = relu(conv(relu(t + conv(x64, 3)), 4, stride=2))
    assert got.shape == (2, 64, 15, 15)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert_native(pred._exe)
    (nchw,) = _predictor(tmp_path, layout=False).run([xv])
    np.testing.assert_allclose(got, nchw, rtol=1e-4, atol=1e-4)


@pytest.mark.xdist_group("aot")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'")
def test_an_ahead_of_time_artifact_runs_the_chain_as_the_predictor(saved, monkeypatch):
    """The ahead-of-time compiler applies the pass for its target too: the artifact's native
    code runs the NHWC kernels (the filters rearranged at each call) and gives the
    Predictor's values bit for bit (the Predictor on the stem's kernel, not on the NumPy
    calls that stand in for it in a process's first runs before warmup compiled it)."""
    from pdjit.codegen.cpu.lib import channels_last as cl
    from pdjit.io.inference_model import load_model

    monkeypatch.setattr(cl, "_conv_ready", lambda: True)

    d, values = saved
    model = load_model(str(d / "m.pdmodel"), str(d / "m.pdiparams"))
    prog, _ = optimize(model.program, model.params, target=get_target("aot"))
    assert sum(op.all_attrs().get("data_format") == "NHWC"
               for op in prog.global_block().ops) == 9
    xv = RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)
    got = _artifact_as_predictor(d, "chain_artifact", xv)
    np.testing.assert_allclose(got[0], _forward(xv.astype(np.float64), values)[0], rtol=1e-4,
                               atol=1e-4)


def test_squeeze_and_excitation_blocks_stay_in_the_chain(fresh_programs, tmp_path,
                                                         monkeypatch):
    """MobileNetV3's blocks: a global average pool inside the chain (its [N, C, 1, 1] value
    NHWC too), 1x1 convolutions on it with a bias of shape [1, C, 1, 1] (a constant the pass
    permutes into a parameter of its own), hard sigmoid, the image scaled by it (a broadcast
    of two chain values); the model's own global pool ends the chain, so only its [N, C]
    value is converted. Oracle: NumPy, from the saved values."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    L = fluid.layers
    x = L.data("x", [16, 7, 7])

    def se(t, c):
        s = L.pool2d(t, pool_type="avg", global_pooling=True)
        s = L.conv2d(s, c // 4, 1, bias_attr=False)
        b = L.create_parameter([1, c // 4, 1, 1], "float32", name=f"se_b_{c}")
        s = L.relu(L.elementwise_add(s, b))
        s = L.hard_sigmoid(L.conv2d(s, c, 1, bias_attr=False))
        return L.elementwise_mul(t, s)

    t = L.conv2d(x, 32, 1, bias_attr=False, act="relu")
    t = se(L.conv2d(t, 32, 3, padding=1, groups=32, bias_attr=False), 32)
    t = L.conv2d(t, 24, 1, bias_attr=False)
    y = L.pool2d(t, pool_type="avg", global_pooling=True)
    v = save_drawn(main, startup, [x], [y], tmp_path,
              lambda name, shape: RNG.standard_normal(shape) * 0.4)
    pred = _predictor(tmp_path)
    ops = pred.program().global_block().ops
    kinds = collections.Counter(op.type for op in ops)
    switched = collections.Counter(op.type for op in ops
                                   if op.all_attrs().get("data_format") == "NHWC")
    assert switched == {"conv2d": 5, "pool2d": 2} and kinds["transpose"] == 2
    assert any(n.endswith(".nhwc") for n in pred.program().global_block().vars
               if pred.program().global_block().vars[n].persistable)

    xv = RNG.standard_normal((3, 16, 7, 7)).astype(np.float32)
    w = [v[f"conv2d_{k}.w_0"] for k in range(5)]
    t = np.maximum(_conv(xv.astype(np.float64), w[0]), 0)
    t = _conv(t, w[1], pad=1, groups=32)
    s = t.mean(axis=(2, 3), keepdims=True)
    s = np.maximum(_conv(s, w[2]) + v["se_b_32"], 0)
    s = np.clip(0.2 * _conv(s, w[3]) + 0.5, 0, 1)
    want = _conv(t * s, w[4]).mean(axis=(2, 3), keepdims=True)
    (got,) = pred.run([xv])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert_native(pred._exe)


def _hard_swish(t):
    return t * np.clip(t + 3, 0, 6) / 6


def test_hard_swish_and_hard_sigmoid_run_in_the_kernels_stores(fresh_programs, tmp_path,
                                                                monkeypatch):
    """MobileNetV3's activations after the switched convolutions (a 1x1 one and a depthwise
    one with batch norm and hard_swish, a squeeze-and-excitation block's hard_sigmoid): each
    applied by the kernel as it stores its output (a gate in the driver's lines, no loop of
    its own), the NumPy oracle's values, every step native; the same bits as the kernels
    without the gate and the activation in a loop of its own after them."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    L = fluid.layers
    x = L.data("x", [16, 7, 7])
    t = L.batch_norm(L.conv2d(x, 40, 1, bias_attr=False), act="hard_swish")
    t = L.batch_norm(L.conv2d(t, 40, 3, padding=1, groups=40, bias_attr=False),
                     act="hard_swish")
    s = L.pool2d(t, pool_type="avg", global_pooling=True)
    s = L.conv2d(L.conv2d(s, 10, 1, act="relu"), 40, 1)
    t = L.elementwise_mul(t, L.hard_sigmoid(s))
    y = L.conv2d(t, 24, 1, bias_attr=False)
    v = save_drawn(main, startup, [x], [y], tmp_path,
              lambda name, shape: RNG.uniform(0.5, 2, shape) if name.endswith("w_2")
              else RNG.standard_normal(shape) * 0.4)
    xv = RNG.standard_normal((2, 16, 7, 7)).astype(np.float32)

    pred = _predictor(tmp_path)
    (got,) = pred.run([xv])
    assert_native(pred._exe)
    report = pred._exe.explain(pred.program(), feed={"x": xv},
                               fetch_list=pred.get_output_names())
    # (each gate's values: hard_swish's twice, hard_sigmoid's once; no op left after them)
    assert report.count("np.array((1.0, 3.0, 0.0, 6.0, 6.0), np.float32)") == 2, report
    assert report.count("np.array((0.2") == 1, report

    w = [v[f"conv2d_{k}.w_0"] for k in range(5)]
    t = _hard_swish(_bn(_conv(xv.astype(np.float64), w[0]), v, "batch_norm_0"))
    t = _hard_swish(_bn(_conv(t, w[1], pad=1, groups=40), v, "batch_norm_1"))
    s = t.mean(axis=(2, 3), keepdims=True)
    s = np.maximum(_conv(s, w[2]) + v["conv2d_2.b_0"].reshape(1, -1, 1, 1), 0)
    s = _conv(s, w[3]) + v["conv2d_3.b_0"].reshape(1, -1, 1, 1)
    s = np.clip(np.float32(0.2) * s + 0.5, 0, 1)
    np.testing.assert_allclose(got, _conv(t * s, w[4]), rtol=1e-4, atol=1e-4)

    # the kernels without the gate: the activations in loops of their own, the same bits
    from pdjit.codegen.lowering import LowerContext
    real = LowerContext.channel_epilogue
    monkeypatch.setattr(LowerContext, "channel_epilogue",
                        lambda self, T, lines, residual=False, gate=False:
                        real(self, T, lines, residual, False) + (
                            [f"np.empty(0, {T})"] if gate else []))
    plain = _predictor(tmp_path)
    (apart,) = plain.run([xv])
    report = plain._exe.explain(plain.program(), feed={"x": xv},
                                fetch_list=plain.get_output_names())
    assert "np.array((1.0, 3.0" not in report, report
    np.testing.assert_array_equal(got, apart)


def test_the_gates_hard_swish_and_hard_sigmoid_declare(fresh_programs):
    """The ``Gate`` each declares, from its attributes (the defaults where absent); a
    hard_swish of scale 0 (its reference divides by it) declares none, so that no kernel
    applies it as a gate of "no product"."""
    from pdjit.framework import registry

    L = fluid.layers
    x = L.data("x", [4])
    L.hard_swish(x)
    L.hard_swish(x, threshold=8.0, scale=4.0, offset=2.0)
    L.hard_swish(x, scale=0.0)
    L.hard_sigmoid(x, slope=0.25, offset=0.4)
    got = [registry.lookup(op.type).inference(op)
           for op in fresh_programs[0].global_block().ops]
    assert [g.values() if g is not None else None for g in got] == [
        (1.0, 3.0, 0.0, 6.0, 6.0), (1.0, 2.0, 0.0, 8.0, 4.0), None,
        (0.25, pytest.approx(0.4), 0.0, 1.0, 0.0)]


def test_a_bottleneck_chain_runs_its_3x3_layers_on_winograd(fresh_programs, tmp_path,
                                                            monkeypatch):
    """ResNet's bottleneck blocks on an 8x8 plane (1x1, 3x3 padded, 1x1, the residual add):
    its 3x3 layers of 32 and 48 output channels run Winograd's NHWC kernel inside the chain;
    the values are the NumPy oracle's, every step native, for two samples and one (each
    split over threads by panels)."""
    from pdjit.codegen.cpu.lib import channels_last as cl

    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cl, "_wino_ready", lambda: True)  # (not NumPy's stand-in)
    main, startup = fresh_programs
    L = fluid.layers
    x = L.data("x", [32, 8, 8])
    t = L.conv2d(x, 32, 1, act="relu")
    t = L.conv2d(t, 48, 3, padding=1, act="relu")
    t = L.conv2d(t, 32, 3, padding=1)
    t = L.relu(L.elementwise_add(t, x))
    y = L.conv2d(t, 40, 1)

    def draw(name, shape):
        return RNG.standard_normal(shape) * (0.2 if len(shape) > 1 else 0.5)
    values = save_drawn(main, startup, [x], [y], tmp_path, draw)
    pred = _predictor(tmp_path)
    ops = pred.program().global_block().ops
    assert sum(op.type == "conv2d" and op.all_attrs().get("data_format") == "NHWC"
               for op in ops) == 4
    xv = RNG.standard_normal((2, 32, 8, 8)).astype(np.float32)

    def forward(xv):
        def conv(t, i, pad=0):
            return _conv(t, values[f"conv2d_{i}.w_0"], 1, pad) + \
                values[f"conv2d_{i}.b_0"].reshape(1, -1, 1, 1)
        t = np.maximum(conv(xv, 0), 0)
        t = np.maximum(conv(t, 1, 1), 0)
        t = np.maximum(conv(t, 2, 1) + xv, 0)
        return conv(t, 3)

    calls = cl.WINO_CALLS[0]
    for xs in (xv, xv[:1]):
        got, = pred.run([xs])
        np.testing.assert_allclose(got, forward(xs.astype(np.float64)), rtol=1e-4, atol=1e-4)
    assert cl.WINO_CALLS[0] >= calls + 4
    assert_native(pred._exe)


def _fire(L, t, s, e):
    """SqueezeNet's fire module: a 1x1 squeeze, then 1x1 and 3x3 expansions joined."""
    t = L.conv2d(t, s, 1, act="relu")
    return L.concat([L.conv2d(t, e, 1, act="relu"), L.conv2d(t, e, 3, padding=1, act="relu")],
                    axis=1)



@pytest.fixture
def fire_saved(fresh_programs, tmp_path, monkeypatch):
    """Four of SqueezeNet's fire modules on a 7x7 plane, a concat of their output with the
    input, a 1x1 convolution, the global pool (outputs: it, then a concat of the input with
    itself), saved with random weights; ``(dir, values)``."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    L = fluid.layers
    x = L.data("x", [24, 7, 7])
    t = x
    for _ in range(4):
        t = _fire(L, t, 8, 16)
    t = L.concat([t, x], axis=1)  # (x comes from outside the chain: converted)
    t = L.conv2d(t, 10, 1, act="relu")
    outside = L.concat([x, x], axis=1)  # (no image of a chain)
    y = L.pool2d(t, pool_type="avg", global_pooling=True)
    return tmp_path, save_drawn(main, startup, [x], [y, outside], tmp_path,
                                lambda name, shape: RNG.standard_normal(shape) * 0.3)


def test_a_chain_runs_on_through_a_concat_of_its_images(fire_saved):
    """SqueezeNet's fire modules: each concat of a module's two expansions joins the chain
    (its ``axis`` 1 becomes 3), so that four modules and the last 1x1 convolution run on NHWC
    images between two conversions; a concat of a value from outside the chain converts that
    value; a concat with no image of a chain, and the joins of a chain that would copy more
    than its kernels gain (a conversion each), stay NCHW. Oracle: NumPy, from the saved
    values."""
    L = fluid.layers
    d, v = fire_saved
    pred = _predictor(d)
    ops = pred.program().global_block().ops
    joins = [op.all_attrs()["axis"] for op in ops if op.type == "concat"]
    switched = collections.Counter(op.type for op in ops
                                   if op.all_attrs().get("data_format") == "NHWC")
    assert sorted(joins) == [1, 3, 3, 3, 3, 3] and switched == {"conv2d": 13, "pool2d": 1}
    # into the chain: x, read by the first module and by the third concat; out: the pool's
    assert collections.Counter(op.type for op in ops)["transpose"] == 2

    xv = RNG.standard_normal((2, 24, 7, 7)).astype(np.float32)
    w = [v[f"conv2d_{k}.w_0"] for k in range(13)]
    b = [v[f"conv2d_{k}.b_0"].reshape(1, -1, 1, 1) for k in range(13)]
    w = [(wk, bk) for wk, bk in zip(w, b)]

    def conv(t, k, pad=0):
        return _conv(t, w[k][0], pad=pad) + w[k][1]

    def fire(t, k):
        t = np.maximum(conv(t, k), 0)
        return np.concatenate([np.maximum(conv(t, k + 1), 0),
                               np.maximum(conv(t, k + 2, pad=1), 0)], axis=1)

    x64 = xv.astype(np.float64)
    t = x64
    for k in range(0, 12, 3):
        t = fire(t, k)
    want = np.maximum(conv(np.concatenate([t, x64], axis=1), 12), 0).mean(axis=(2, 3),
                                                                           keepdims=True)
    got, got_outside = pred.run([xv])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got_outside, np.concatenate([xv, xv], axis=1))
    assert_native(pred._exe)

    # a DenseNet-like block (each layer's output joined to all before it) on that plane:
    # the chain's joins would cost more than its kernels gain; it stays NCHW
    main2, startup2 = fluid.Program(), fluid.Program()
    with fluid.program_guard(main2, startup2), fluid.unique_name.guard():
        t = x2 = L.data("x", [24, 7, 7])
        for _ in range(3):
            t = L.concat([t, L.conv2d(L.conv2d(t, 16, 1, act="relu"), 8, 3, padding=1)],
                         axis=1)
    params = {p.name: np.zeros(p.shape, np.float32)
              for p in main2.global_block().all_parameters()}
    new, _ = optimize(main2.clone(for_test=True), params, target=get_target("cpu"))
    ops = new.global_block().ops
    assert [op.all_attrs()["axis"] for op in ops if op.type == "concat"] == [1, 1, 1]
    assert not any(op.type == "transpose" for op in ops)
    del x2


@pytest.mark.xdist_group("aot")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'")
def test_an_ahead_of_time_artifact_runs_the_concats_of_a_chain(fire_saved, monkeypatch):
    """The artifact of the fire modules (its concats on NHWC images, in native code) gives
    the Predictor's values bit for bit."""
    from pdjit.codegen.cpu.lib import channels_last as cl
    from pdjit.io.inference_model import load_model

    monkeypatch.setattr(cl, "_conv_ready", lambda: True)
    d, _ = fire_saved
    model = load_model(str(d / "m.pdmodel"), str(d / "m.pdiparams"))
    prog, _ = optimize(model.program, model.params, target=get_target("aot"))
    assert sorted(op.all_attrs()["axis"] for op in prog.global_block().ops
                  if op.type == "concat") == [1, 3, 3, 3, 3, 3]
    xv = RNG.standard_normal((2, 24, 7, 7)).astype(np.float32)
    _artifact_as_predictor(d, "fire_artifact", xv)


def _np_pool(x, k, s, p, is_max, exclusive=True):
    """NCHW pool by windows (float64): max, or the average over the inputs read (exclusive)
    or over the window's length clipped at the padding past the image."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            a, b = i * s - p, min(i * s - p + k, h + p)
            e, f = j * s - p, min(j * s - p + k, w + p)
            win = x[:, :, max(a, 0):min(b, h), max(e, 0):min(f, w)]
            cnt = win.shape[2] * win.shape[3] if exclusive else (b - a) * (f - e)
            y[:, :, i, j] = win.max(axis=(2, 3)) if is_max else win.sum(axis=(2, 3)) / cnt
    return y


@pytest.fixture
def pools_saved(fresh_programs, tmp_path, monkeypatch):
    """Six convolutions (1x1 and 3x3, 24-64 channels) on an 11x11 plane with a 3x3 max pool
    (stride 2) and a 3x3 average pool (stride 1, not exclusive) between them, and a pool of
    the input alone, saved with random weights (outputs: the last convolution, the max pool,
    the lone pool); ``(dir, values)``."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    main, startup = fresh_programs
    L = fluid.layers
    x = L.data("x", [64, 11, 11])
    alone = L.pool2d(x, 2, pool_stride=2)  # (no chain's image)
    t = L.conv2d(x, 24, 3, padding=1, act="relu")
    t = L.conv2d(t, 64, 1, act="relu")
    mp = L.pool2d(t, 3, pool_stride=2, pool_padding=1)
    t = L.conv2d(mp, 64, 1, act="relu")
    t = L.conv2d(t, 24, 3, padding=1, act="relu")
    t = L.pool2d(t, 3, pool_type="avg", pool_padding=1, exclusive=False)
    t = L.conv2d(t, 64, 1, act="relu")
    y = L.conv2d(t, 32, 1)
    return tmp_path, save_drawn(main, startup, [x], [y, mp, alone], tmp_path,
                                lambda name, shape: RNG.standard_normal(shape) * 0.1)


def test_a_chain_runs_on_through_its_pools(pools_saved):
    """Pools that read a chain's image join it (``Layout.join``): the six convolutions and
    the two pools among them run on NHWC images between three conversions (one in, two
    out), the pools by ``pool2d_nhwc``; the pool of an image from outside a chain stays NCHW;
    the max pool's output, fetched, keeps its layout and value. Oracle: NumPy, from the saved
    values."""
    d, values = pools_saved
    pred = _predictor(d)
    ops = pred.program().global_block().ops
    layout = collections.Counter((op.type, op.all_attrs().get("data_format")) for op in ops)
    assert layout[("pool2d", "NHWC")] == 2 and layout[("pool2d", "NCHW")] == 1 and \
        layout[("conv2d", "NHWC")] == 6
    assert collections.Counter(op.type for op in ops)["transpose"] == 3  # x in; y, mp out

    xv = RNG.standard_normal((2, 64, 11, 11)).astype(np.float32)

    def conv(t, i, pad=0):
        return _conv(t, values[f"conv2d_{i}.w_0"], 1, pad) + \
            values[f"conv2d_{i}.b_0"].reshape(1, -1, 1, 1)

    def relu(t):
        return np.maximum(t, 0)
    x64 = xv.astype(np.float64)
    want_mp = _np_pool(relu(conv(relu(conv(x64, 0, 1)), 1)), 3, 2, 1, True)
    t = relu(conv(relu(conv(want_mp, 2)), 3, 1))
    t = relu(conv(_np_pool(t, 3, 1, 1, False, exclusive=False), 4))
    got_y, got_mp, got_alone = pred.run([xv])
    np.testing.assert_allclose(got_mp, want_mp, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_y, conv(t, 5), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_alone, _np_pool(x64, 2, 2, 0, True), rtol=1e-6, atol=1e-6)
    assert_native(pred._exe)


@pytest.mark.xdist_group("aot")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'")
def test_an_ahead_of_time_artifact_runs_the_pools_of_a_chain(pools_saved, monkeypatch):
    """The artifact of that program (its pools on NHWC images, in native code) gives the
    Predictor's values bit for bit."""
    from pdjit.codegen.cpu.lib import channels_last as cl
    from pdjit.io.inference_model import load_model

    monkeypatch.setattr(cl, "_conv_ready", lambda: True)
    d, _ = pools_saved
    model = load_model(str(d / "m.pdmodel"), str(d / "m.pdiparams"))
    prog, _ = optimize(model.program, model.params, target=get_target("aot"))
    assert sum(op.type == "pool2d" and op.all_attrs().get("data_format") == "NHWC"
               for op in prog.global_block().ops) == 2
    xv = RNG.standard_normal((2, 64, 11, 11)).astype(np.float32)
    _artifact_as_predictor(d, "pools_artifact", xv)
