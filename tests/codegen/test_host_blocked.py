"""A host driver's block-by-block call (an opaque op's blocks of samples, each followed by its
epilogue kernel) runs as Python calling the two compiled functions: no compiled copy of the
library kernel per epilogue. Against NumPy written here; native execution asserted."""
import numpy as np

import pdjit as fluid
from pdjit.codegen.compiler import Compiled, HostFunction
from pdjit.testing import assert_native

RNG = np.random.default_rng(15)


def _conv(x, w, pad):
    """Naive cross-correlation, NCHW, stride 1."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return out


def _steps(exe):
    return [s for _, plan in exe._plans.values() for s in plan.walk() if s.kind == "native"]


def test_conv_epilogue_is_a_python_loop_over_compiled_calls(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data("x", [3, 7, 6])
    z = fluid.layers.data("z", [4, 7, 6])
    c = fluid.layers.conv2d(x, 4, 3, padding=1, act="relu")
    out = fluid.layers.elementwise_add(c, z)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    feed = {"x": RNG.normal(size=(3, 3, 7, 6)).astype(np.float32),
            "z": RNG.normal(size=(3, 4, 7, 6)).astype(np.float32)}
    (got,) = exe.run(main, feed=feed, fetch_list=[out])
    assert_native(exe)
    scope = fluid.global_scope()
    w, b = (np.asarray(scope.find_var(n).get_tensor()) for n in ("conv2d_0.w_0", "conv2d_0.b_0"))
    want = np.maximum(_conv(feed["x"], w, 1) + b[:, None, None], 0) + feed["z"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    calls = [c for s in _steps(exe) for _, c in getattr(s.compiled, "calls", ())]
    loops = [c for c in calls if isinstance(c, HostFunction)]
    assert len(loops) == 1 and "_kc(_nn.conv._fwd_range, " in loops[0].text
    (_, epi), = loops[0].calls
    assert isinstance(epi, Compiled) and epi.fn.signatures  # the epilogue ran compiled
    # no compiled function holds the convolution's loop over blocks
    assert not any("_fwd_range" in c.text for c in calls if isinstance(c, Compiled))
