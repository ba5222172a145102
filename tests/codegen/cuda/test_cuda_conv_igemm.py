"""Convolution on the device as an implicit GEMM (``pdjit.codegen.cuda.lib.conv``): conv2d and
conv2d_transpose with both gradients over strides, explicit 2- and 4-value / SAME / VALID
paddings, dilations, groups, NCHW and NHWC, on CUDAPlace(0) strict (native device code only),
against NumPy loops written here; each case also asserts that the tiled kernels ran (their
launches counted), not the direct loops. Tiny sizes: the simulator runs every thread in
Python."""
import numpy as np
import pytest

from pdjit.codegen.cuda.lib import conv as cconv
from pdjit.testing.op_test import CUDA, check_output

R = np.random.RandomState(19)


@pytest.fixture
def launches(monkeypatch):
    """The modes of the implicit-GEMM kernels launched during the test (FWD 0, FILTER 1,
    DATA 2)."""
    seen = []
    orig = cconv._igemm_kernel

    def spy(dtype, mode):
        seen.append(mode)
        return orig(dtype, mode)
    monkeypatch.setattr(cconv, "_igemm_kernel", spy)
    return seen


def _cuda(op, inputs, attrs, expected, tol):
    return check_output(op, inputs, attrs, expected, modes=[CUDA],
                        outputs={k: 1 for k in expected}, rtol=tol, atol=tol)


def _pads(algo, pads, size, k, s, d):
    """(pad before, dilation) along one axis: Paddle's rules, written here."""
    if algo == "VALID":
        return 0, d
    if algo == "SAME":      # out = ceil(in / s); the dilation counts as 1
        out = -(-size // s)
        return max((out - 1) * s + k - size, 0) // 2, 1
    return pads, d


def _np_conv(x, w, dy_of, s, p, d, groups):
    """(y, dx, dw) of a convolution, NCHW, by visiting every (output, filter tap) pair: y[n, m,
    oh, ow] += x[n, c, oh*s - pt + a*d, ow*s - pl + b*d] * w[m, c - group start, a, b];
    ``p``: (top, left, out_h, out_w); ``dy_of(y)``: the output gradient."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (pt, pl, oh, ow), mg = p, m // groups
    y = np.zeros((n, m, oh, ow))
    taps = []
    for b_ in range(n):
        for o in range(m):
            for ci in range(cg):
                cc = (o // mg) * cg + ci
                for i in range(oh):
                    for j in range(ow):
                        for a in range(kh):
                            ih = i * s[0] - pt + a * d[0]
                            for b in range(kw):
                                iw = j * s[1] - pl + b * d[1]
                                if 0 <= ih < h and 0 <= iw < wd:
                                    taps.append((b_, o, ci, cc, i, j, a, b, ih, iw))
                                    y[b_, o, i, j] += x[b_, cc, ih, iw] * w[o, ci, a, b]
    dy = dy_of(y)
    dx, dw = np.zeros(x.shape), np.zeros(w.shape)
    for b_, o, ci, cc, i, j, a, b, ih, iw in taps:
        dx[b_, cc, ih, iw] += dy[b_, o, i, j] * w[o, ci, a, b]
        dw[o, ci, a, b] += dy[b_, o, i, j] * x[b_, cc, ih, iw]
    return y, dy, dx, dw


def _geometry(x_hw, k_hw, stride, pads, dil, algo):
    p = list(pads)
    if len(p) == 2:
        p = [p[0], p[0], p[1], p[1]]
    out = []
    for ax in range(2):
        pb, d = _pads(algo, p[2 * ax], x_hw[ax], k_hw[ax], stride[ax], dil[ax])
        if algo == "SAME":
            total = max((-(-x_hw[ax] // stride[ax]) - 1) * stride[ax] + k_hw[ax] - x_hw[ax], 0)
            pa = total - pb
        else:
            pa = 0 if algo == "VALID" else p[2 * ax + 1]
        size = (x_hw[ax] + pb + pa - (d * (k_hw[ax] - 1) + 1)) // stride[ax] + 1
        out.append((pb, d, size))
    (pt, dh, oh), (pl, dw, ow) = out
    return (pt, pl, oh, ow), (dh, dw)


def _lay(a, nhwc):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if nhwc else a


CASES = [
    # x (NCHW), filter, strides, paddings, dilations, algorithm, groups, NHWC, dtype
    ((1, 4, 5, 6), (4, 2, 3, 2), (2, 2), [1, 0, 0, 1], (1, 1), "EXPLICIT", 2, False,
     np.float32),
    ((1, 3, 5, 5), (2, 3, 3, 3), (1, 1), [1, 1], (2, 2), "EXPLICIT", 1, True, np.float32),
    ((1, 2, 5, 4), (3, 2, 3, 3), (2, 2), [0, 0], (1, 1), "SAME", 1, False, np.float64),
    ((1, 6, 4, 5), (3, 2, 2, 2), (1, 2), [0, 0], (1, 1), "VALID", 3, True, np.float32),
    # more rows than a simulator tile (8): 9 filters, 9 channels
    ((1, 9, 2, 3), (9, 9, 1, 2), (1, 1), [0, 0], (1, 1), "EXPLICIT", 1, False, np.float32),
]


@pytest.mark.parametrize("xs,ws,stride,pads,dil,algo,groups,nhwc,dtype", CASES)
def test_conv2d_and_grads_tiled(launches, xs, ws, stride, pads, dil, algo, groups, nhwc,
                                dtype):
    x, w = R.randn(*xs).astype(dtype), R.randn(*ws).astype(dtype)
    p, d = _geometry(xs[2:], ws[2:], stride, pads, dil, algo)
    y, dy, dx, dw = _np_conv(x, w, lambda y: R.randn(*y.shape), stride, p, d, groups)
    attrs = {"strides": list(stride), "paddings": list(pads), "dilations": list(dil),
             "padding_algorithm": algo, "groups": groups,
             "data_format": "NHWC" if nhwc else "NCHW"}
    tol = 1e-5 if dtype == np.float32 else 1e-10
    X, DY = _lay(x, nhwc), _lay(dy.astype(dtype), nhwc)
    _cuda("conv2d", {"Input": X, "Filter": w}, attrs, {"Output": _lay(y, nhwc).astype(dtype)},
          tol)
    assert launches == [cconv.FWD]
    _cuda("conv2d_grad", {"Input": X, "Filter": w, "Output@GRAD": DY}, attrs,
          {"Input@GRAD": _lay(dx, nhwc).astype(dtype), "Filter@GRAD": dw.astype(dtype)}, tol)
    assert sorted(launches) == [cconv.FWD, cconv.FILTER, cconv.DATA]


def test_conv2d_grad_filter_only_and_input_only(launches):
    x, w = R.randn(2, 2, 4, 4).astype(np.float32), R.randn(3, 2, 2, 2).astype(np.float32)
    p, d = _geometry((4, 4), (2, 2), (2, 1), [0, 1], (1, 1), "EXPLICIT")
    _, dy, dx, dw = _np_conv(x, w, lambda y: R.randn(*y.shape), (2, 1), p, d, 1)
    attrs = {"strides": [2, 1], "paddings": [0, 1]}
    ins = {"Input": x, "Filter": w, "Output@GRAD": dy.astype(np.float32)}
    _cuda("conv2d_grad", ins, attrs, {"Filter@GRAD": dw.astype(np.float32)}, 1e-5)
    assert launches == [cconv.FILTER]
    _cuda("conv2d_grad", ins, attrs, {"Input@GRAD": dx.astype(np.float32)}, 1e-5)
    assert launches == [cconv.FILTER, cconv.DATA]


@pytest.mark.parametrize("nhwc", [False, True])
def test_conv2d_transpose_and_grads_tiled(launches, nhwc):
    # a transposed convolution is the input gradient of the convolution it transposes: its
    # Input is that convolution's output (gradient), its Output the image (gradient); stride
    # 2, pads [1, 0], dilation 2, groups 2 (filter [C=4, M/groups=2, 2, 3])
    n, groups = 1, 2
    w = R.randn(4, 2, 2, 3).astype(np.float32)
    xin = R.randn(n, 4, 3, 2).astype(np.float32)
    out_hw = ((3 - 1) * 2 - 2 + 2 * (2 - 1) + 1, (2 - 1) * 2 - 0 + 2 * (3 - 1) + 1)
    # the convolution with image [n, 4 = M, out_hw] and filter w viewed as [4, 2, 2, 3]
    # (M = 4 filters of 2 channels a group): y = conv(image) has xin's shape
    p = (1, 0, 3, 2)
    img = np.zeros((n, 4) + out_hw)
    _, _, y, _ = _np_conv(img, w, lambda y: xin.astype(np.float64), (2, 2), p, (2, 2),
                          groups)             # Output = conv^T(Input): the image gradient
    dy = R.randn(*y.shape)
    conv_dy, _, _, dw = _np_conv(dy, w, lambda y: xin.astype(np.float64), (2, 2), p, (2, 2),
                                 groups)
    # dInput = conv(dOutput); dFilter = the conv's filter gradient, image dOutput, output
    # gradient Input
    attrs = {"strides": [2, 2], "paddings": [1, 0], "dilations": [2, 2], "groups": groups,
             "data_format": "NHWC" if nhwc else "NCHW"}
    f = np.float32
    _cuda("conv2d_transpose", {"Input": _lay(xin, nhwc), "Filter": w}, attrs,
          {"Output": _lay(y, nhwc).astype(f)}, 1e-5)
    assert launches == [cconv.DATA]
    _cuda("conv2d_transpose_grad", {"Input": _lay(xin, nhwc), "Filter": w,
                                    "Output@GRAD": _lay(dy.astype(f), nhwc)}, attrs,
          {"Input@GRAD": _lay(conv_dy, nhwc).astype(f), "Filter@GRAD": dw.astype(f)}, 1e-5)
    assert sorted(launches) == [cconv.FWD, cconv.FILTER, cconv.DATA]


def test_depthwise_keeps_the_direct_loops(launches):
    # one input channel per group: no tiled kernel (the op's own tests check the values)
    x, w = R.randn(1, 2, 4, 4).astype(np.float32), R.randn(2, 1, 3, 3).astype(np.float32)
    p, d = _geometry((4, 4), (3, 3), (1, 1), [1, 1], (1, 1), "EXPLICIT")
    y, _, _, _ = _np_conv(x, w, lambda y: y, (1, 1), p, d, 2)
    _cuda("depthwise_conv2d", {"Input": x, "Filter": w}, {"paddings": [1, 1], "groups": 2},
          {"Output": y.astype(np.float32)}, 1e-5)
    assert launches == []


def test_library_rejects_misfits():
    from numba import cuda

    x = cuda.to_device(np.zeros((1, 4, 3, 3), np.float32))
    w = cuda.to_device(np.zeros((2, 3, 2, 2), np.float32))
    y = cuda.to_device(np.zeros((1, 2, 2, 2), np.float32))
    with pytest.raises(ValueError, match=r"conv2d_fwd: image \(1, 4, 3, 3\), filter "
                                         r"\(2, 3, 2, 2\).*groups=1"):
        cconv.conv2d_fwd(x, w, y, False, 1, 1, 0, 0, 1, 1, 1)
    w64 = cuda.to_device(np.zeros((2, 4, 2, 2), np.float64))
    with pytest.raises(ValueError, match="conv2d_bwd_filter: operands of several dtypes"):
        cconv.conv2d_bwd_filter(x, y, w64, False, 1, 1, 0, 0, 1, 1, 1)
    with pytest.raises(ValueError, match=r"conv2d_bwd_data \(image\): expected a rank-4"):
        cconv.conv2d_bwd_data(y, cuda.to_device(np.zeros((2, 4, 2, 2), np.float32)),
                              cuda.to_device(np.zeros((4, 3, 3), np.float32)), False, 1, 1, 0,
                              0, 1, 1, 1)
