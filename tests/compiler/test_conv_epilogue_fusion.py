"""A convolution computed by blocks takes the per-channel bias add and the clamp after it
(declared ``ChannelAffine`` and ``Clamp``) into its kernels' stores when nothing else reads the
values between: no elementwise kernel runs for them. The rest of a chain that does not fit stays
the epilogue after it. Against a NumPy convolution written here; native drivers called
directly (the plan's ``native_drivers=True``) and the executor's host driver (strict)."""
import numpy as np
import pytest

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


def _group_of(text, op):
    """The driver's lines of its group of elementwise ops starting with ``op``."""
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if "# group" in ln and f"[{op}" in ln)
    end = next((i for i in range(at + 1, len(lines)) if "# group" in lines[i]), len(lines))
    return "\n".join(lines[at:end])


CLAMPS = {"relu6": (lambda v: np.clip(v, 0, 6), "0.0, 6.0"),
          "relu": (lambda v: np.maximum(v, 0), "0.0, math.inf")}


@pytest.mark.parametrize("act, groups, size, batch", [
    ("relu6", 1, (16, 16), 3),    # the taps kernel
    ("relu", 1, (7, 5), 1),       # odd sizes, batch 1: im2col + BLAS, then the pass
    ("relu6", 4, (8, 8), 2),      # depthwise: the direct loops
])
def test_bias_and_clamp_are_taken_by_the_convolution(fresh_programs, act, groups, size,
                                                     batch):
    main, startup = fresh_programs
    x = fluid.layers.data("x", [4, *size])
    y = fluid.layers.conv2d(x, 4 if groups > 1 else 8, 3, padding=1, groups=groups, act=act)
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    xv = RNG.normal(size=(batch, 4, *size)).astype(np.float32)
    (got,), text = _run_native(main, scope, {"x": xv}, [y])
    w, b = _params(scope)
    clamp, bounds = CLAMPS[act]
    want = clamp(_conv(xv, w, 1, groups=groups) + b[:, None, None])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    group = _group_of(text, "elementwise_add")
    assert "taken by the conv2d" in group
    fn = "_direct_range" if groups > 1 else "_fwd_range"
    (call,) = [ln for ln in group.splitlines() if f"_nn.conv.{fn}(" in ln]
    assert call.rstrip().endswith(f", {bounds})")   # bias, lo, hi: the kernel's arguments
    assert not any(ln.strip().startswith("K") for ln in group.splitlines())  # no kernel of its own


def test_a_chain_that_does_not_fit_keeps_its_rest_as_the_epilogue(fresh_programs):
    """conv -> add -> hard_swish: the add taken, hard_swish the epilogue after each block."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 9, 7])
    y = fluid.layers.conv2d(x, 5, 3, stride=2, padding=1, act="hard_swish")
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    xv = RNG.normal(size=(2, 3, 9, 7)).astype(np.float32)
    (got,), text = _run_native(main, scope, {"x": xv}, [y])
    w, b = _params(scope)
    v = _conv(xv, w, 1, stride=2) + b[:, None, None]
    np.testing.assert_allclose(got, v * np.clip(v + 3, 0, 6) / 6, rtol=1e-4, atol=1e-4)
    group = _group_of(text, "elementwise_add")
    assert "its elementwise_add taken by the conv2d" in group
    (call,) = [ln for ln in group.splitlines() if ln.strip().startswith("K")]
    assert "-math.inf, math.inf" in call  # the bias alone, no bounds


def test_values_read_elsewhere_are_not_taken(fresh_programs):
    """The sum before the clamp is fetched: the bias is taken, the clamp is not (it stays an
    epilogue, and the sum keeps its value). A second convolution whose output is fetched
    takes nothing."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 8, 8])
    y = fluid.layers.conv2d(x, 4, 3, padding=1, act="relu6")
    ops = main.global_block().ops
    pre = main.global_block().var(next(op for op in ops if op.type == "elementwise_add")
                                  .output("Out")[0])
    y2 = fluid.layers.conv2d(y, 4, 1, act="relu")
    c2 = main.global_block().var([op for op in main.global_block().ops
                                  if op.type == "conv2d"][1].output("Output")[0])
    scope = fluid.Scope()
    fluid.Executor().run(startup, scope=scope)
    xv = RNG.normal(size=(2, 3, 8, 8)).astype(np.float32)
    (got_pre, got, got_c2, got2), text = _run_native(main, scope, {"x": xv}, [pre, y, c2, y2])
    w, b = _params(scope)
    w2, b2 = _params(scope, 1)
    v = _conv(xv, w, 1) + b[:, None, None]
    np.testing.assert_allclose(got_pre, v, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, np.clip(v, 0, 6), rtol=1e-4, atol=1e-4)
    c = _conv(np.clip(v, 0, 6), w2, 0)
    np.testing.assert_allclose(got_c2, c, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got2, np.maximum(c + b2[:, None, None], 0), rtol=1e-4,
                               atol=1e-4)
    assert text.count("its elementwise_add taken by the conv2d") == 1
    assert "taken by the conv2d: applied" not in text


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
    assert any("_nn.split_work(_nn.conv._fwd_range" in t and "0.0, 6.0, head=3)" in t
               for t in texts)
