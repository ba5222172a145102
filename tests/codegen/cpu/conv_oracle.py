"""A NumPy oracle of the convolution, for the tests of this folder."""
import numpy as np


def conv_ref(x, w, b, stride, pad, groups):
    """NumPy oracle: a grouped 2-D convolution (NCHW, symmetric padding) plus a bias."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // groups
    for o in range(m):
        g = o // mg
        for i in range(kh):
            for j in range(kw):
                win = xp[:, g * cg:(g + 1) * cg, i:i + stride * oh:stride, j:j + stride * ow:stride]
                y[:, o] += np.einsum("nchw,c->nhw", win, w[o, :, i, j])
    return y + b[None, :, None, None]
