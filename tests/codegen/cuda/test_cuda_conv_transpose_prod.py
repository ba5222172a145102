"""conv2d_transpose / depthwise_conv2d_transpose (+grads) and reduce_prod's gradient on the
device (strict CUDAPlace(0): native device code only), against NumPy written here."""
import numpy as np
import pytest

from pdjit.testing.op_test import CUDA, check_output

R = np.random.RandomState(3)
F = np.float32


def _cuda(op, inputs, attrs, expected, **kw):
    return check_output(op, inputs, attrs, expected, modes=[CUDA],
                        outputs={k: 1 for k in expected}, rtol=1e-5, atol=1e-5, **kw)


def _convt(x, w, dy, stride, pad, dil, groups, out_hw):
    """(Output, dInput, dFilter) of a transposed convolution, NCHW, by scattering each input
    pixel through the filter: Output[n, m, i*s - p + a*d, j*s - p + b*d] += x[n, c, i, j] *
    w[c, m % (M/groups), a, b] for c in m's group."""
    n, cin, h, wd = x.shape
    _, mg, kh, kw = w.shape
    cg = cin // groups
    y = np.zeros((n, mg * groups) + out_hw)
    dx, dw = np.zeros(x.shape), np.zeros(w.shape)
    for b_ in range(n):
        for c in range(cin):
            grp = c // cg
            for i in range(h):
                for j in range(wd):
                    for q in range(mg):
                        m = grp * mg + q
                        for a in range(kh):
                            oh = i * stride - pad + a * dil
                            for b in range(kw):
                                ow = j * stride - pad + b * dil
                                if 0 <= oh < out_hw[0] and 0 <= ow < out_hw[1]:
                                    y[b_, m, oh, ow] += x[b_, c, i, j] * w[c, q, a, b]
                                    dx[b_, c, i, j] += dy[b_, m, oh, ow] * w[c, q, a, b]
                                    dw[c, q, a, b] += x[b_, c, i, j] * dy[b_, m, oh, ow]
    return y.astype(F), dx.astype(F), dw.astype(F)


@pytest.mark.parametrize("op,groups,nhwc", [("conv2d_transpose", 2, False),
                                            ("depthwise_conv2d_transpose", 2, True)])
def test_conv2d_transpose_and_grad(op, groups, nhwc):
    # stride 2, pads 1, dilation 1, output_padding 1: a 3x3 input gives a 6x6 output
    x, w = R.randn(2, 2, 3, 3).astype(F), R.randn(2, 2, 3, 3).astype(F)
    dy = R.randn(2, 2 * groups, 6, 6).astype(F)
    y, dx, dw = _convt(x, w, dy, 2, 1, 1, groups, (6, 6))
    attrs = {"strides": [2, 2], "paddings": [1, 1], "groups": groups, "dilations": [1, 1],
             "output_padding": [1, 1], "data_format": "NHWC" if nhwc else "NCHW"}

    def lay(a):
        return a.transpose(0, 2, 3, 1).copy() if nhwc else a
    _cuda(op, {"Input": lay(x), "Filter": w}, attrs, {"Output": lay(y)})
    _cuda(f"{op}_grad", {"Input": lay(x), "Filter": w, "Output@GRAD": lay(dy)}, attrs,
          {"Input@GRAD": lay(dx), "Filter@GRAD": dw})


def test_conv2d_transpose_valid_dilated():
    x, w = R.randn(1, 2, 3, 2).astype(F), R.randn(2, 3, 2, 2).astype(F)
    out_hw = ((3 - 1) * 1 + 2 * 1 + 1, (2 - 1) * 1 + 2 * 1 + 1)   # VALID, dilation 2
    dy = R.randn(1, 3, *out_hw).astype(F)
    y, dx, dw = _convt(x, w, dy, 1, 0, 2, 1, out_hw)
    attrs = {"padding_algorithm": "VALID", "dilations": [2, 2]}
    _cuda("conv2d_transpose", {"Input": x, "Filter": w}, attrs, {"Output": y})
    _cuda("conv2d_transpose_grad", {"Input": x, "Filter": w, "Output@GRAD": dy}, attrs,
          {"Input@GRAD": dx, "Filter@GRAD": dw})


@pytest.mark.parametrize("dim,keep", [([1], False), ([0, 2], True)])
def test_reduce_prod_grad(dim, keep):
    x = R.uniform(0.5, 1.5, (3, 4, 2)).astype(F)
    x[1, 2, 0] = 0.0       # a zero: its group's other gradients vanish, its own does not
    out = x.prod(axis=tuple(dim), keepdims=True)
    g = R.randn(*out.shape).astype(F)
    dx = np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape):   # the product of the others in the group, times g
        grp = tuple(slice(None) if d in dim else idx[d] for d in range(3))
        others = x[grp].astype(np.float64).copy()
        own = tuple(idx[d] for d in dim)
        others[own] = 1.0
        gi = tuple(0 if d in dim else idx[d] for d in range(3))
        dx[idx] = g[gi] * others.prod()
    gin = g if keep else g.reshape([s for d, s in enumerate(g.shape) if d not in dim])
    _cuda("reduce_prod_grad", {"X": x, "Out": out if keep else out.reshape(gin.shape),
                               "Out@GRAD": gin},
          {"dim": dim, "keep_dim": keep}, {"X@GRAD": dx.astype(F)})
