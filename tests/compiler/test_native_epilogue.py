"""A native driver's convolution epilogue (the elementwise chain after a convolution computed by
blocks of samples): it writes the convolution's output in place when nothing else reads that
output, and into an array of its own when something does (a fetch, a later op). Against a
NumPy convolution written here; the native drivers themselves are called."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.runtime.plan import build_plan

RNG = np.random.default_rng(18)


def _conv(x, w, pad, stride=1):
    """Naive cross-correlation, NCHW, float64."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,mc->nmhw", win, w[:, :, i, j])
    return out


def _hard_swish(v):
    return v * np.clip(v + 3.0, 0.0, 6.0) / 6.0


def _run_native(main, scope, feed, fetch):
    """The plan's native drivers (``native_drivers=True``) called in order on ``feed`` and the
    scope's parameters: (fetched values, the drivers' sources)."""
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


def _net(act, channels=5, size=(7, 6), stride=1):
    x = fluid.layers.data("x", [3, *size])
    y = fluid.layers.conv2d(x, channels, 3, stride=stride, padding=1, act=act)
    conv_out = next(op for op in fluid.default_main_program().global_block().ops
                    if op.type == "conv2d").output("Output")[0]
    return x, y, fluid.default_main_program().global_block().var(conv_out)


def _params(scope):
    return (np.asarray(scope.find_var(n).get_tensor()).astype(np.float64)
            for n in ("conv2d_0.w_0", "conv2d_0.b_0"))


def _epilogue_call(text):
    """The driver's line calling the blocked kernel (the convolution, then its epilogue)."""
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("K") and "(0, " in ln]
    return line


@pytest.mark.parametrize("act, fn", [("hard_swish", _hard_swish),
                                     ("sigmoid", lambda v: 1 / (1 + np.exp(-v)))])
def test_an_epilogue_writes_the_convolution_output_in_place(fresh_programs, act, fn):
    main, startup = fresh_programs
    x, y, _ = _net(act)
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    xv = RNG.normal(size=(4, 3, 7, 6)).astype(np.float32)
    (got,), text = _run_native(main, scope, {"x": xv}, [y])
    w, b = _params(scope)
    np.testing.assert_allclose(got, fn(_conv(xv, w, 1) + b[:, None, None]), rtol=1e-4,
                               atol=1e-5)
    # the epilogue's output is the convolution's: no array of its own, the same one passed
    # as the input leaf and the (unused) output
    call = _epilogue_call(text)
    args = [a.strip() for a in call[call.index("(") + 1:call.rindex(")")].split(",")]
    flat_out = [ln.split("=")[0].strip() for ln in text.splitlines() if ".reshape(" in ln
                and ln.split("=")[1].strip().startswith(args[5] + ".reshape")]
    assert flat_out and args.count(flat_out[0]) == 2
    assert "np.empty(" + args[5] + ".size" not in text


def test_a_fetched_convolution_output_keeps_its_value(fresh_programs):
    """The convolution's output is fetched too: the epilogue must not overwrite it."""
    main, startup = fresh_programs
    x, y, c = _net("hard_swish")
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    xv = RNG.normal(size=(1, 3, 7, 6)).astype(np.float32)
    (got, conv), text = _run_native(main, scope, {"x": xv}, [y, c])
    w, b = _params(scope)
    want = _conv(xv, w, 1)
    np.testing.assert_allclose(conv, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, _hard_swish(want + b[:, None, None]), rtol=1e-4, atol=1e-5)
    call = _epilogue_call(text)
    args = [a.strip() for a in call[call.index("(") + 1:call.rindex(")")].split(",")]
    assert "np.empty(" + args[5] + ".size" in text  # an output array of its own


def test_a_convolution_output_read_by_a_later_op_keeps_its_value(fresh_programs):
    """An op of a later group (a pool) reads the convolution's output: not overwritten."""
    main, startup = fresh_programs
    x, y, c = _net("hard_swish", size=(8, 8), stride=2)
    p = fluid.layers.pool2d(c, pool_size=2, pool_type="max", pool_stride=2)
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    xv = RNG.normal(size=(3, 3, 8, 8)).astype(np.float32)
    (got, pooled), _ = _run_native(main, scope, {"x": xv}, [y, p])
    w, b = _params(scope)
    want = _conv(xv, w, 1, stride=2)
    np.testing.assert_allclose(got, _hard_swish(want + b[:, None, None]), rtol=1e-4, atol=1e-5)
    n, m, h, wd = want.shape
    np.testing.assert_allclose(pooled, want.reshape(n, m, h // 2, 2, wd // 2, 2).max((3, 5)),
                               rtol=1e-4, atol=1e-5)
