"""``conv3d`` and ``pool3d`` (``pdjit.ops.conv3d``) against NumPy loops written here, their
gradients by finite differences, and the layers."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import check_output
from pdjit.testing.grad_check import check_grad

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(23)


def np_conv3d(x, w, s, p, d, groups):
    n, c, dd, hh, ww = x.shape
    m, cg, kd, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1]), (p[2], p[2])))
    od = (dd + 2 * p[0] - d[0] * (kd - 1) - 1) // s[0] + 1
    oh = (hh + 2 * p[1] - d[1] * (kh - 1) - 1) // s[1] + 1
    ow = (ww + 2 * p[2] - d[2] * (kw - 1) - 1) // s[2] + 1
    out = np.zeros((n, m, od, oh, ow))
    mg = m // groups
    for o in range(m):
        g = o // mg
        for i in range(od):
            for j in range(oh):
                for k in range(ow):
                    patch = xp[:, g * cg:(g + 1) * cg,
                               i * s[0]:i * s[0] + d[0] * (kd - 1) + 1:d[0],
                               j * s[1]:j * s[1] + d[1] * (kh - 1) + 1:d[1],
                               k * s[2]:k * s[2] + d[2] * (kw - 1) + 1:d[2]]
                    out[:, o, i, j, k] = (patch * w[o]).sum(axis=(1, 2, 3, 4))
    return out


def test_conv3d_output_and_grad():
    x = RNG.normal(size=(2, 4, 3, 4, 3))
    w = RNG.normal(size=(4, 2, 2, 2, 1))
    attrs = {"strides": [1, 2, 1], "paddings": [1, 0, 1], "dilations": [1, 1, 2], "groups": 2}
    check_output("conv3d", {"Input": x, "Filter": w}, attrs,
                 {"Output": np_conv3d(x, w, [1, 2, 1], [1, 0, 1], [1, 1, 2], 2)})
    check_grad("conv3d", {"Input": x, "Filter": w}, attrs, inputs_to_check=("Input", "Filter"),
               output_name="Output")


def np_pool3d(x, k, s, kind):
    n, c, d, h, w = x.shape
    od, oh, ow = [(a - b) // st + 1 for a, b, st in zip((d, h, w), k, s)]
    out = np.zeros((n, c, od, oh, ow))
    for i in range(od):
        for j in range(oh):
            for m in range(ow):
                blk = x[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1],
                        m * s[2]:m * s[2] + k[2]]
                out[:, :, i, j, m] = blk.max(axis=(2, 3, 4)) if kind == "max" else \
                    blk.mean(axis=(2, 3, 4))
    return out


def test_pool3d_output_and_grad():
    x = RNG.normal(size=(2, 2, 3, 4, 4))
    for kind in ("max", "avg"):
        attrs = {"pooling_type": kind, "ksize": [2, 2, 3], "strides": [1, 2, 1]}
        check_output("pool3d", {"X": x}, attrs,
                     {"Out": np_pool3d(x, [2, 2, 3], [1, 2, 1], kind)})
        check_grad("pool3d", {"X": x}, attrs)
    adaptive = {"pooling_type": "avg", "ksize": [2, 3, 1], "adaptive": True}
    want = np.stack([np.stack([np.stack([
        x[:, :, i * 3 // 2:-(-(i + 1) * 3 // 2), j * 4 // 3:-(-(j + 1) * 4 // 3), :]
        .mean(axis=(2, 3, 4)) for k in range(1)], -1) for j in range(3)], -2) for i in range(2)],
        -3)
    check_output("pool3d", {"X": x}, adaptive, {"Out": want})


def test_conv3d_pool3d_layers_train():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        v = fluid.data("v", [-1, 1, 3, 4, 4], "float32")
        y = fluid.layers.conv3d(v, num_filters=2, filter_size=2, act="relu")
        y = fluid.layers.pool3d(y, pool_size=2, pool_type="avg")
        y = fluid.layers.adaptive_pool3d(y, 1, pool_type="max")
        loss = fluid.layers.mean(fluid.layers.square(y))
        fluid.optimizer.SGD(0.1).minimize(loss)
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    assert tuple(scope.find_var("conv3d_0.w_0").value.shape) == (2, 1, 2, 2, 2)
    feed = {"v": RNG.normal(size=(3, 1, 3, 4, 4)).astype(np.float32)}
    ls = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
                .reshape(-1)[0]) for _ in range(4)]
    assert ls[-1] < ls[0]


def test_conv3d_transpose_is_conv3ds_adjoint_and_grad():
    x = RNG.normal(size=(2, 2, 2, 3, 2))
    w = RNG.normal(size=(2, 3, 2, 1, 2))
    attrs = {"strides": [2, 1, 1], "paddings": [0, 0, 1], "dilations": [1, 1, 1], "groups": 1}
    # out[n, m, i*s + a, j + b, k + c] += x[n, c_, i, j, k] w[c_, m, a, b, c], then cropped
    full = np.zeros((2, 3, (2 - 1) * 2 + 2, 3, (2 - 1) + 2))
    for a in range(2):
        for c in range(2):
            for i in range(2):
                for k in range(2):
                    full[:, :, i * 2 + a, :, k + c] += np.einsum(
                        "nch,cm->nmh", x[:, :, i, :, k], w[:, :, a, 0, c])
    check_output("conv3d_transpose", {"Input": x, "Filter": w}, attrs,
                 {"Output": full[:, :, :, :, 1:-1]})
    check_grad("conv3d_transpose", {"Input": x, "Filter": w}, attrs,
               inputs_to_check=("Input", "Filter"), output_name="Output")


def np_lerp_axis(v, axis, n_out, align_corners, align_mode):
    n_in = v.shape[axis]
    out = []
    for o in range(n_out):
        if align_corners:
            src = o * (n_in - 1) / (n_out - 1)
        elif align_mode == 0:
            src = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
        else:
            src = o * n_in / n_out
        i0 = min(int(np.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        t = src - i0
        out.append((1 - t) * np.take(v, i0, axis) + t * np.take(v, i1, axis))
    return np.stack(out, axis=axis)


def test_trilinear_interp_and_grad():
    x = RNG.normal(size=(1, 2, 2, 3, 4))
    for ac, mode in ((True, 1), (False, 0), (False, 1)):
        want = x
        for axis, n in zip((2, 3, 4), (3, 5, 2)):
            want = np_lerp_axis(want, axis, n, ac, mode)
        attrs = {"out_d": 3, "out_h": 5, "out_w": 2, "align_corners": ac, "align_mode": mode}
        check_output("trilinear_interp", {"X": x}, attrs, {"Out": want})
    check_grad("trilinear_interp", {"X": x}, attrs)


def test_spectral_norm_against_svd_and_grad():
    w = RNG.normal(size=(3, 2, 2))
    u0, v0 = RNG.normal(size=3), RNG.normal(size=4)
    # many power iterations converge to the largest singular value
    attrs = {"dim": 0, "power_iters": 50}
    sigma = np.linalg.svd(w.reshape(3, 4), compute_uv=False)[0]
    check_output("spectral_norm", {"Weight": w, "U": u0, "V": v0}, attrs, {"Out": w / sigma},
                 rtol=1e-6, atol=1e-8)
    # dim 1: the matrix is axis 1 against the rest
    w1 = np.transpose(w, (1, 0, 2)).reshape(2, 6)
    s1 = np.linalg.svd(w1, compute_uv=False)[0]
    check_output("spectral_norm", {"Weight": w, "U": RNG.normal(size=2), "V": RNG.normal(size=6)},
                 {"dim": 1, "power_iters": 60}, {"Out": w / s1}, rtol=1e-6, atol=1e-8)
    # the gradient holds u and v fixed (Fluid's): with one iteration it is not the derivative
    # of the whole map, so compare with the formula written here
    attrs1 = {"dim": 0, "power_iters": 1}
    m = w.reshape(3, 4)
    v = m.T @ u0
    v /= np.linalg.norm(v) + 1e-12
    u = m @ v
    u /= np.linalg.norm(u) + 1e-12
    s = u @ m @ v
    g = RNG.normal(size=(3, 2, 2))
    want = (g.reshape(3, 4) - (g.reshape(3, 4) * m).sum() * np.outer(u, v) / s) / s
    from pdjit.testing.op_test import run_op

    got = run_op("spectral_norm_grad", {"Weight": w, "U": u0, "V": v0, "Out@GRAD": g}, attrs1,
                 outputs={"Weight@GRAD": 1})
    np.testing.assert_allclose(got["Weight@GRAD"], want.reshape(3, 2, 2), rtol=1e-6)
    # converged, u and v are the singular vectors: then it is the true derivative
    check_grad("spectral_norm", {"Weight": w, "U": u0, "V": v0}, attrs,
               inputs_to_check=("Weight",), max_relative_error=1e-4, atol=1e-6)


def test_spectral_norm_layer_in_training():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 3], "float32")
        w = fluid.layers.create_parameter([3, 2], "float32", name="w")
        y = fluid.layers.matmul(x, fluid.layers.spectral_norm(w, dim=0, power_iters=20))
        loss = fluid.layers.mean(fluid.layers.square(y))
        params = [p.name for p, _ in fluid.optimizer.SGD(0.1).minimize(loss)[1]]
    assert params == ["w"]                      # U and V are not trained
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    # singular values 3 and 1: 20 power iterations converge from any start
    scope.find_var("w").value = np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], np.float32)
    got, = exe.run(main, feed={"x": np.eye(3, dtype=np.float32)},
                   fetch_list=[y], scope=scope)
    assert abs(np.linalg.svd(got, compute_uv=False)[0] - 1.0) < 1e-3   # W / sigma(W)
