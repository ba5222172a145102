"""Pooling kernels (NCHW): max and average pooling over 2-D windows, their gradients, and max
pooling that records where each maximum came from.

The window of output ``(oh, ow)`` along one axis (PaddlePaddle's rule, see ``pdjit.ops.pool``):

- adaptive: ``[floor(oh * H / OH), ceil((oh + 1) * H / OH))``;
- otherwise it starts at ``oh * stride - pad_before`` and ends ``k`` later, but not past
  ``H + pad_before``; the part inside the image is read. An average divides by the number of
  elements read (``exclusive`` or adaptive) or by the window's length before that clipping.

The first maximum of a window wins (its position is the ``mask``; its input gets the gradient).
"""
import numpy as np

from pdjit.codegen.nnlib._jit import jit

__all__ = ["pool2d_fwd", "pool2d_bwd", "max_pool2d_index_fwd", "max_pool2d_index_bwd"]


@jit
def _span(o, size, osize, k, s, p, adaptive):
    """(first, end, length) of output ``o``'s window along one axis: ``first..end`` is read,
    ``length`` is the window's length for a non-exclusive average."""
    if adaptive:
        a = (o * size) // osize
        b = -((-(o + 1) * size) // osize)
        return a, b, b - a
    a = o * s - p
    b = min(a + k, size + p)
    return max(a, 0), min(b, size), b - a


@jit
def pool2d_fwd(x, y, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """``y`` = the max (``is_max``) or average pool of ``x``."""
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                h0, h1, lh = _span(oh, h_, oh_, kh, sh, pt, adaptive)
                for ow in range(ow_):
                    w0, w1, lw = _span(ow, w_, ow_, kw, sw, pl, adaptive)
                    if is_max:
                        acc = -np.inf
                        for h in range(h0, h1):
                            for w in range(w0, w1):
                                v = x[n, c, h, w]
                                if v > acc:
                                    acc = v
                        y[n, c, oh, ow] = acc
                    else:
                        acc = 0.0
                        for h in range(h0, h1):
                            for w in range(w0, w1):
                                acc += x[n, c, h, w]
                        cnt = (h1 - h0) * (w1 - w0) if exclusive or adaptive else lh * lw
                        y[n, c, oh, ow] = acc / cnt


@jit
def pool2d_bwd(x, y, dy, dx, kh, kw, sh, sw, pt, pl, is_max, exclusive, adaptive):
    """``dx`` (overwritten) = the gradient of :func:`pool2d_fwd` contracted with ``dy``."""
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    dx[:] = 0
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                h0, h1, lh = _span(oh, h_, oh_, kh, sh, pt, adaptive)
                for ow in range(ow_):
                    w0, w1, lw = _span(ow, w_, ow_, kw, sw, pl, adaptive)
                    g = dy[n, c, oh, ow]
                    if is_max:
                        m = y[n, c, oh, ow]
                        done = False
                        for h in range(h0, h1):
                            for w in range(w0, w1):
                                if not done and x[n, c, h, w] == m:
                                    dx[n, c, h, w] += g
                                    done = True
                    else:
                        cnt = (h1 - h0) * (w1 - w0) if exclusive or adaptive else lh * lw
                        share = g / cnt
                        for h in range(h0, h1):
                            for w in range(w0, w1):
                                dx[n, c, h, w] += share


@jit
def max_pool2d_index_fwd(x, y, mask, kh, kw, sh, sw, pt, pl, adaptive):
    """``y`` = the max pool of ``x`` and ``mask`` = each maximum's index ``h * W + w`` in its
    plane."""
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                h0, h1, _ = _span(oh, h_, oh_, kh, sh, pt, adaptive)
                for ow in range(ow_):
                    w0, w1, _ = _span(ow, w_, ow_, kw, sw, pl, adaptive)
                    acc = -np.inf
                    at = -1
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            v = x[n, c, h, w]
                            if v > acc:
                                acc = v
                                at = h * w_ + w
                    y[n, c, oh, ow] = acc
                    mask[n, c, oh, ow] = at


@jit
def max_pool2d_index_bwd(mask, dy, dx):
    """``dx`` (overwritten): each ``dy`` element added at the input position its ``mask``
    names."""
    n_, c_, h_, w_ = dx.shape
    dx[:] = 0
    for n in range(n_):
        for c in range(c_):
            for oh in range(dy.shape[2]):
                for ow in range(dy.shape[3]):
                    at = mask[n, c, oh, ow]
                    if at >= 0:
                        dx[n, c, at // w_, at % w_] += dy[n, c, oh, ow]
