"""A native driver's convolution epilogue (the elementwise chain after a convolution computed by
blocks of samples): it writes the convolution's output in place when nothing else reads that
output, and into an array of its own when something does (a fetch, a later op); the bias and
clamp the convolution takes only where nothing else reads the values between. Against a NumPy
convolution (test_conv_epilogue_fusion's); the native drivers themselves are called."""
import numpy as np
from test_conv_epilogue_fusion import _conv, _run_native

import pdjit as fluid

RNG = np.random.default_rng(18)


def _hard_swish(v):
    return v * np.clip(v + 3.0, 0.0, 6.0) / 6.0


def _conv_out(main, k):
    """The variable of the k-th conv2d's output."""
    op = [op for op in main.global_block().ops if op.type == "conv2d"][k]
    return main.global_block().var(op.output("Output")[0])


def _params(scope, k):
    return (np.asarray(scope.find_var(f"conv2d_{k}.{s}").get_tensor()).astype(np.float64)
            for s in ("w_0", "b_0"))


def _epilogue_calls(text):
    """The arguments of each driver line calling a blocked kernel (the convolution, then its
    epilogue), in order: ``(0, N, N, image, filter, output, ...)``."""
    return [[a.strip() for a in ln[ln.index("(") + 1:ln.rindex(")")].split(",")]
            for ln in text.splitlines() if ln.strip().startswith("K") and "(0, " in ln]


def _in_place(text, args) -> bool:
    """Whether the call writes the convolution's output (``args[5]``) in place: the epilogue's
    output is that array's flat view (passed as the input leaf and as the output), none of
    its own allocated."""
    flat = [ln.split("=")[0].strip() for ln in text.splitlines() if ".reshape(" in ln and
            ln.split("=")[1].strip().startswith(args[5] + ".reshape")]
    return bool(flat) and args.count(flat[0]) == 2 and \
        "np.empty(" + args[5] + ".size" not in text


def test_epilogues_write_in_place_only_where_nothing_else_reads(fresh_programs):
    """Convolutions, each with an epilogue after its bias: one whose output is fetched, one
    whose output a later group's pool reads (both keep their values: nothing taken, the
    epilogue writes an array of its own), one read by nothing else (its bias taken, sigmoid
    written in place); one whose sum before relu6 is fetched (the bias taken, relu6 not: an
    epilogue into an array of its own, the sum kept); a 1x1 one after it whose output is
    fetched (nothing taken)."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 8, 8])
    y0 = fluid.layers.conv2d(x, 5, 3, padding=1, act="hard_swish")
    y1 = fluid.layers.conv2d(x, 4, 3, stride=2, padding=1, act="hard_swish")
    y2 = fluid.layers.conv2d(x, 6, 3, padding=1, act="sigmoid")
    c0, c1 = _conv_out(main, 0), _conv_out(main, 1)
    p = fluid.layers.pool2d(c1, pool_size=2, pool_type="max", pool_stride=2)
    y3 = fluid.layers.conv2d(x, 4, 3, padding=1, act="relu6")
    pre = main.global_block().var([op for op in main.global_block().ops
                                   if op.type == "elementwise_add"][3].output("Out")[0])
    y4 = fluid.layers.conv2d(y3, 4, 1, act="relu")
    c4 = _conv_out(main, 4)
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    xv = RNG.normal(size=(3, 3, 8, 8)).astype(np.float32)
    (g0, gc0, g1, gp, g2, g3, gpre, g4, gc4), text = _run_native(
        main, scope, {"x": xv}, [y0, c0, y1, p, y2, y3, pre, y4, c4])
    (w0, b0), (w1, b1), (w2, b2), (w3, b3), (w4, b4) = (_params(scope, k) for k in range(5))
    want0, want1 = _conv(xv, w0, 1), _conv(xv, w1, 1, stride=2)
    tol = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gc0, want0, **tol)
    np.testing.assert_allclose(g0, _hard_swish(want0 + b0[:, None, None]), **tol)
    np.testing.assert_allclose(g1, _hard_swish(want1 + b1[:, None, None]), **tol)
    n, m, h, wd = want1.shape
    np.testing.assert_allclose(gp, want1.reshape(n, m, h // 2, 2, wd // 2, 2).max((3, 5)), **tol)
    np.testing.assert_allclose(g2, 1 / (1 + np.exp(-(_conv(xv, w2, 1) + b2[:, None, None]))),
                               **tol)
    v = _conv(xv, w3, 1) + b3[:, None, None]
    np.testing.assert_allclose(gpre, v, **tol)
    np.testing.assert_allclose(g3, np.clip(v, 0, 6), **tol)
    c = _conv(np.clip(v, 0, 6), w4, 0)
    np.testing.assert_allclose(gc4, c, **tol)
    np.testing.assert_allclose(g4, np.maximum(c + b4[:, None, None], 0), **tol)
    calls = _epilogue_calls(text)
    assert len(calls) == 5
    assert [_in_place(text, args) for args in calls] == [False, False, True, False, False]
    assert text.count("its elementwise_add taken by the conv2d") == 2  # conv 2's and 3's
    assert "taken by the conv2d: applied" not in text
