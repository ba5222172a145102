"""A convolution computed by blocks takes the per-channel bias add and the clamp after it
(declared ``ChannelAffine`` and ``Clamp``) into its kernels' stores when nothing else reads the
values between: no elementwise kernel runs for them. The rest of a chain that does not fit stays
the epilogue after it. Against a NumPy convolution written here; native drivers called
directly (the plan's ``native_drivers=True``) and the executor's host driver (strict)."""
import numpy as np

import pdjit as fluid
from pdjit.runtime.plan import build_plan
from pdjit.testing import assert_native

RNG = np.random.default_rng(19)


def _conv(x, w, pad, stride=1, groups=1):
    """Cross-correlation, NCHW, float64."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    wg = w.astype(np.float64).reshape(groups, m // groups, cg, kh, kw)
    out = np.zeros((n, groups, m // groups, oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("gmc,ngchw->ngmhw", wg[:, :, :, i, j],
                             win.reshape(n, groups, cg, oh, ow))
    return out.reshape(n, m, oh, ow)


def _run_native(main, scope, feed, fetch):
    """The plan's native drivers called in order: (fetched values, the drivers' sources)."""
    plan = build_plan(main, [v.name for v in fetch], native_drivers=True)
    env = dict(feed)
    texts = []
    for step in plan.steps:
        assert step.kind == "native" and step.native is not None
        args = [env[n] if n in env else np.asarray(scope.find_var(n).get_tensor())
                for n in step.args]
        env.update(zip(step.outputs, step.native.fn(*args)))
        assert step.native.fn.signatures  # the native driver compiled and ran
        texts.append(step.native.text)
    return [env[v.name] for v in fetch], "\n".join(texts)


def _params(scope, k=0):
    return (np.asarray(scope.find_var(f"conv2d_{k}.{s}").get_tensor()) for s in ("w_0", "b_0"))


CLAMPS = {"relu6": (lambda v: np.clip(v, 0, 6), "0.0, 6.0"),
          "relu": (lambda v: np.maximum(v, 0), "0.0, math.inf")}


def _groups(text, op):
    """The driver's groups whose ops start with ``op``, each as its lines, in order."""
    lines = text.splitlines()
    heads = [i for i, ln in enumerate(lines) if "# group" in ln] + [len(lines)]
    return ["\n".join(lines[a:b]) for a, b in zip(heads, heads[1:]) if f"[{op}" in lines[a]]


def test_bias_and_clamp_are_taken_by_the_convolution(fresh_programs):
    """Four convolutions in one program, run at batch 3 and 1: relu6 after the taps kernel,
    relu after im2col + BLAS (odd sizes: the pass after it), relu6 after the depthwise
    direct loops: each add and clamp taken (the kernel's arguments: bias, lo, hi; no kernel
    of their own); hard_swish after the add: the add taken, hard_swish the epilogue after
    each block, in place."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [4, 16, 16])
    x2 = fluid.layers.data("x2", [4, 7, 5])
    ys = [fluid.layers.conv2d(x, 8, 3, padding=1, act="relu6"),
          fluid.layers.conv2d(x2, 8, 3, padding=1, act="relu"),
          fluid.layers.conv2d(x, 4, 3, padding=1, groups=4, act="relu6"),
          fluid.layers.conv2d(x2, 5, 3, stride=2, padding=1, act="hard_swish")]
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    plan = build_plan(main, [y.name for y in ys], native_drivers=True)
    (step,) = plan.steps
    assert step.kind == "native" and step.native is not None
    params = [tuple(_params(scope, k)) for k in range(4)]
    for batch in (3, 1):
        feed = {"x": RNG.normal(size=(batch, 4, 16, 16)).astype(np.float32),
                "x2": RNG.normal(size=(batch, 4, 7, 5)).astype(np.float32)}
        args = [feed[n] if n in feed else np.asarray(scope.find_var(n).get_tensor())
                for n in step.args]
        got = dict(zip(step.outputs, step.native.fn(*args)))
        for k, (src, stride, groups, act) in enumerate(
                [("x", 1, 1, "relu6"), ("x2", 1, 1, "relu"), ("x", 1, 4, "relu6"),
                 ("x2", 2, 1, "hard_swish")]):
            w, b = params[k]
            v = _conv(feed[src], w, 1, stride=stride, groups=groups) + b[:, None, None]
            want = v * np.clip(v + 3, 0, 6) / 6 if act == "hard_swish" else CLAMPS[act][0](v)
            np.testing.assert_allclose(got[ys[k].name], want, rtol=1e-4, atol=1e-4)
    assert step.native.fn.signatures  # the native driver compiled and ran
    groups = _groups(step.native.text, "elementwise_add")
    assert len(groups) == 4
    for group, fn, act in zip(groups[:3], ["_fwd_range", "_fwd_range", "_direct_range"],
                              ["relu6", "relu", "relu6"]):
        assert "taken by the conv2d" in group
        (call,) = [ln for ln in group.splitlines() if f"_nn.conv.{fn}(" in ln]
        # bias, lo, hi (and an empty residual, for the taps or BLAS)
        tail = ")" if fn == "_direct_range" else ", nb"
        assert f", {CLAMPS[act][1]}{tail}" in call
        assert not any(ln.strip().startswith("K") for ln in group.splitlines())
    assert "its elementwise_add taken by the conv2d" in groups[3]
    (call,) = [ln for ln in groups[3].splitlines() if ln.strip().startswith("K")]
    args = [a.strip() for a in call[call.index("(") + 1:call.rindex(")")].split(",")]
    assert "-math.inf, math.inf" in call  # the bias alone, no bounds
    # hard_swish written in place: the output's flat view passed as its leaf and its output
    flat = [ln.split("=")[0].strip() for ln in groups[3].splitlines() if ".reshape(" in ln
            and ln.split("=")[1].strip().startswith(args[5] + ".reshape")]
    assert flat and args.count(flat[0]) == 2


def test_the_host_driver_takes_them_too(fresh_programs):
    """The executor's (host) driver: the convolution with its bias and relu6 in one library
    call over the batch; native execution asserted."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [2, 16, 16])
    y = fluid.layers.conv2d(x, 16, 1, act="relu6")
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    xv = RNG.normal(size=(3, 2, 16, 16)).astype(np.float32) * 4
    (got,) = exe.run(main, feed={"x": xv}, fetch_list=[y])
    assert_native(exe)
    w, b = _params(fluid.global_scope())
    np.testing.assert_allclose(got, np.clip(_conv(xv, w, 0) + b[:, None, None], 0, 6),
                               rtol=1e-4, atol=1e-4)
    texts = [s.compiled.text for _, plan in exe._plans.values() for s in plan.walk()
             if s.kind == "native"]
    assert any("_nn.split_work(_nn.conv._fwd_range" in t and "0.0, 6.0, nb" in t
               for t in texts)


def test_a_residual_connection_is_taken_too(fresh_programs):
    """bias add, then the block's input added (declared ``ADDITION``: a residual
    connection), then relu: all three taken by the convolution (its kernel's bias, lo, hi and
    the residual flat), in the native driver and the executor's host driver, by the taps
    kernel and by im2col + BLAS (a plane of fewer than 16 outputs), without a bias too; a
    residual that is read again afterwards, and one made after the convolution, are not
    taken. Against NumPy."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [8, 8, 8])
    x2 = fluid.layers.data("x2", [8, 3, 3])
    outs = [fluid.layers.relu(fluid.layers.elementwise_add(
                fluid.layers.conv2d(x, 8, 3, padding=1), x)),
            fluid.layers.elementwise_add(fluid.layers.conv2d(x2, 8, 3, padding=1), x2),
            fluid.layers.relu6(fluid.layers.elementwise_add(
                x, fluid.layers.conv2d(x, 8, 1, bias_attr=False)))]
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    feed = {"x": RNG.normal(size=(3, 8, 8, 8)).astype(np.float32),
            "x2": RNG.normal(size=(2, 8, 3, 3)).astype(np.float32)}
    w0, b0 = _params(scope, 0)
    w1, b1 = _params(scope, 1)
    w2 = np.asarray(scope.find_var("conv2d_2.w_0").get_tensor())
    want = [np.maximum(_conv(feed["x"], w0, 1) + b0[:, None, None] + feed["x"], 0),
            _conv(feed["x2"], w1, 1) + b1[:, None, None] + feed["x2"],
            np.clip(feed["x"] + _conv(feed["x"], w2, 0), 0, 6)]
    got, text = _run_native(main, scope, feed, outs)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-4)
    calls = [ln for ln in text.splitlines() if "_nn.conv._fwd_range(" in ln]
    assert len(calls) == 3 and not any(ln.strip().startswith("K") for ln in text.splitlines()
                                       if "_fwd_range" not in ln)
    assert all(c.split(",")[-1].strip().startswith("res") for c in calls)  # the residual
    got = exe.run(main, feed=feed, fetch_list=outs, scope=scope)
    assert_native(exe)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, v, rtol=1e-4, atol=1e-4)


def test_a_sum_read_again_ends_the_epilogue_there(fresh_programs):
    """The sum of the bias and the residual is fetched too: the convolution takes both adds
    (its output is that sum) and the relu after it stays the elementwise epilogue after each
    block; the values right."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [8, 8, 8])
    s = fluid.layers.elementwise_add(fluid.layers.conv2d(x, 8, 3, padding=1), x)
    y = fluid.layers.relu(s)
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    feed = {"x": RNG.normal(size=(2, 8, 8, 8)).astype(np.float32)}
    w, b = _params(scope)
    (gs, gy), text = _run_native(main, scope, feed, [s, y])
    want = _conv(feed["x"], w, 1) + b[:, None, None] + feed["x"]
    np.testing.assert_allclose(gs, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gy, np.maximum(want, 0), rtol=1e-4, atol=1e-4)
    (group,) = _groups(text, "elementwise_add")
    assert "its elementwise_add, elementwise_add taken by the conv2d" in group
    assert any(ln.strip().startswith("K") for ln in group.splitlines())  # relu after it


def test_a_bias_of_shape_1_c_1_1_is_taken_too(fresh_programs):
    """The bias as PaddlePaddle 2.x saves a convolution's, a parameter of shape [1, C, 1, 1]
    added with axis -1, then relu: taken by the convolution (its values passed as a vector),
    in the native driver and in the executor's host driver; against NumPy."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 9, 9])
    b = fluid.layers.create_parameter(
        [1, 8, 1, 1], "float32", name="b4",
        default_initializer=fluid.initializer.NormalInitializer(0.0, 1.0))
    y = fluid.layers.relu(fluid.layers.elementwise_add(
        fluid.layers.conv2d(x, 8, 3, padding=1, bias_attr=False), b, axis=-1))
    scope = fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    feed = {"x": RNG.normal(size=(2, 3, 9, 9)).astype(np.float32)}
    w = np.asarray(scope.find_var("conv2d_0.w_0").get_tensor())
    bv = np.asarray(scope.find_var("b4").get_tensor())
    assert np.abs(bv).max() > 0
    want = np.maximum(_conv(feed["x"], w, 1) + bv, 0)
    (got,), text = _run_native(main, scope, feed, [y])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    (group,) = _groups(text, "elementwise_add")
    assert "taken by the conv2d" in group
    assert not any(ln.strip().startswith("K") for ln in group.splitlines())
    (got,) = exe.run(main, feed=feed, fetch_list=[y], scope=scope)
    assert_native(exe)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    texts = [s.compiled.text for _, plan in exe._plans.values() for s in plan.walk()
             if s.kind == "native"]
    assert any("_nn.split_work(_nn.conv._fwd_range" in t and "0.0, math.inf, nb" in t
               for t in texts)
