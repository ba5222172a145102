"""Image kernels: resizing (nearest, bilinear), 3-D padding, per-channel affine maps.

Every kernel works on one view of its arrays that serves both data layouts: an image of
``[A, H, W, B]`` (resizing) or ``[A, D, H, W, B]`` (padding), where the layout decides what the
outer and inner axes hold: channel-first data (NCHW) is viewed as ``[N*C, H, W, 1]``,
channel-last data (NHWC) as ``[N, H, W, C]``. The lowerings make these views (reshapes of
C-contiguous arrays, no copies), so one compilation per dtype serves both layouts.

Resizing follows PaddlePaddle's CPU kernels to the bit: the source coordinate of an output
pixel is computed in float32 from a float32 ratio (:func:`interp_ratio`), with the same mix of
float32 and float64 steps, so that fractional coordinates fall on the same side of an integer.
Where Paddle would read outside the image (an ``OutSize`` that disagrees with a ``scale`` that
still sets the ratio), the source index is clamped to the last row or column.
"""
import math

import numpy as np

from pdjit.codegen.cpu.lib._jit import jit

__all__ = ["interp_ratio", "interp_out_size", "interp_nearest", "interp_nearest_grad",
           "interp_bilinear", "interp_bilinear_grad", "pad3d", "pad3d_grad",
           "affine_channel", "affine_channel_grad"]


# ---- resizing --------------------------------------------------------------------------------
@jit
def interp_out_size(in_h, in_w, out_h, out_w, scale_h, scale_w, size_h, size_w, sized):
    """The output size of a resize: ``(out_h, out_w)``.

    ``sized`` > 0: ``size_h, size_w`` come from ``SizeTensor`` or ``OutSize`` and win.
    Otherwise a scale (``scale_h, scale_w`` > 0, from the ``Scale`` tensor or attribute)
    gives ``int(in * scale)``, else the ``out_h, out_w`` attributes stand. Raises ValueError
    for a size that is not positive.
    """
    if sized > 0:
        out_h, out_w = size_h, size_w
    elif scale_h > 0.0 and scale_w > 0.0:
        out_h, out_w = int(in_h * scale_h), int(in_w * scale_w)
    if out_h <= 0 or out_w <= 0:
        raise ValueError("pdjit: a resize's output size must be positive")
    return out_h, out_w


@jit
def interp_ratio(in_n, out_n, align_corners, scale):
    """The float32 step between source coordinates of neighbouring output pixels: ``(in-1) /
    (out-1)`` with ``align_corners``, else ``1/scale`` when a scale was given (> 0), else
    ``in/out``; 0 for an output of one pixel."""
    if out_n <= 1:
        return np.float32(0.0)
    if align_corners:
        return np.float32(in_n - 1) / np.float32(out_n - 1)
    if scale > 0.0:
        return np.float32(1.0 / scale)
    return np.float32(in_n) / np.float32(out_n)


@jit
def _nearest_index(ratio, out_n, in_n, align_corners, grad):
    """Source index of each output index: ``ratio * k`` in float32, rounded half away from
    zero with ``align_corners`` (the gradient, as Paddle's, adds 0.5 in float32 and
    truncates), truncated otherwise."""
    r = np.float32(ratio)
    idx = np.empty(out_n, np.int64)
    for k in range(out_n):
        v = r * np.float32(k)
        if not align_corners:
            i = int(v)
        elif grad:
            i = int(v + np.float32(0.5))
        else:
            i = int(math.floor(np.float64(v) + 0.5))
        idx[k] = min(max(i, 0), in_n - 1)
    return idx


@jit
def _linear_index(ratio, out_n, in_n, half_pixel, index32, weight32):
    """For each output index: the lower source index, the upper one and the float32 weight of
    the upper one. ``half_pixel`` (align_mode 0 without align_corners): source = ratio * (k +
    0.5) - 0.5, clamped at 0; else ratio * k (float32). Paddle computes the half-pixel source in
    float32 or in float64 depending on the axis and on forward or backward: ``index32`` for the
    index, ``weight32`` for the weight."""
    r = np.float32(ratio)
    lo = np.empty(out_n, np.int64)
    hi = np.empty(out_n, np.int64)
    wt = np.empty(out_n, np.float32)
    for k in range(out_n):
        src32 = r * (np.float32(k) + np.float32(0.5)) - np.float32(0.5)
        src64 = np.float64(r) * (k + 0.5) - 0.5
        if not half_pixel:
            i = int(r * np.float32(k))
        elif index32:
            i = int(src32)
        else:
            i = int(src64)
        i = min(max(i, 0), in_n - 1)
        lo[k] = i
        hi[k] = min(i + 1, in_n - 1)
        if half_pixel:
            src = src32 if weight32 else np.float32(src64)
            if src < 0:
                src = np.float32(0.0)
            wt[k] = src - np.float32(i)
        else:
            wt[k] = r * np.float32(k) - np.float32(i)
    return lo, hi, wt


@jit
def interp_nearest(x, out, ratio_h, ratio_w, align_corners):
    """``out[a, k, l, b] = x[a, ih(k), iw(l), b]``: nearest-neighbour resize of ``x``
    ([A, H, W, B]) into ``out`` ([A, OH, OW, B]); an unchanged size is a copy."""
    a_, h_, w_, b_ = x.shape
    oh_, ow_ = out.shape[1], out.shape[2]
    if oh_ == h_ and ow_ == w_:
        out[:] = x
        return
    ih = _nearest_index(ratio_h, oh_, h_, align_corners, False)
    iw = _nearest_index(ratio_w, ow_, w_, align_corners, False)
    for a in range(a_):
        for k in range(oh_):
            if b_ == 1:  # channel-first data: no inner loop (3x faster)
                for j in range(ow_):
                    out[a, k, j, 0] = x[a, ih[k], iw[j], 0]
                continue
            for j in range(ow_):
                for b in range(b_):
                    out[a, k, j, b] = x[a, ih[k], iw[j], b]


@jit
def interp_nearest_grad(dout, dx, ratio_h, ratio_w, align_corners):
    """The gradient of :func:`interp_nearest`: each ``dout`` pixel adds into its source pixel
    of ``dx`` (overwritten)."""
    a_, h_, w_, b_ = dx.shape
    oh_, ow_ = dout.shape[1], dout.shape[2]
    if oh_ == h_ and ow_ == w_:
        dx[:] = dout
        return
    dx[:] = 0
    ih = _nearest_index(ratio_h, oh_, h_, align_corners, True)
    iw = _nearest_index(ratio_w, ow_, w_, align_corners, True)
    for a in range(a_):
        for k in range(oh_):
            if b_ == 1:
                for j in range(ow_):
                    dx[a, ih[k], iw[j], 0] += dout[a, k, j, 0]
                continue
            for j in range(ow_):
                for b in range(b_):
                    dx[a, ih[k], iw[j], b] += dout[a, k, j, b]


@jit
def interp_bilinear(x, out, ratio_h, ratio_w, half_pixel):
    """Bilinear resize of ``x`` ([A, H, W, B]) into ``out`` ([A, OH, OW, B]); an unchanged size
    is a copy. Each output is the four neighbours weighted by float32 weights, summed in
    Paddle's order (in the input's precision, float32 for float32 data)."""
    a_, h_, w_, b_ = x.shape
    oh_, ow_ = out.shape[1], out.shape[2]
    if oh_ == h_ and ow_ == w_:
        out[:] = x
        return
    yn, ys, dn = _linear_index(ratio_h, oh_, h_, half_pixel, False, False)
    xw, xe, dw = _linear_index(ratio_w, ow_, w_, half_pixel, False, True)
    one = np.float32(1.0)
    for a in range(a_):
        for k in range(oh_):
            n, s, wn = yn[k], ys[k], dn[k]
            ws = one - wn
            if b_ == 1:
                for j in range(ow_):
                    w, e, we = xw[j], xe[j], dw[j]
                    ww = one - we
                    out[a, k, j, 0] = (x[a, n, w, 0] * ws * ww + x[a, s, w, 0] * wn * ww
                                       + x[a, n, e, 0] * ws * we + x[a, s, e, 0] * wn * we)
                continue
            for j in range(ow_):
                w, e, we = xw[j], xe[j], dw[j]
                ww = one - we
                for b in range(b_):
                    out[a, k, j, b] = (x[a, n, w, b] * ws * ww + x[a, s, w, b] * wn * ww
                                       + x[a, n, e, b] * ws * we + x[a, s, e, b] * wn * we)


@jit
def interp_bilinear_grad(dout, dx, ratio_h, ratio_w, half_pixel):
    """The gradient of :func:`interp_bilinear`: each ``dout`` pixel adds into its four source
    pixels of ``dx`` (overwritten) with the forward weights."""
    a_, h_, w_, b_ = dx.shape
    oh_, ow_ = dout.shape[1], dout.shape[2]
    if oh_ == h_ and ow_ == w_:
        dx[:] = dout
        return
    dx[:] = 0
    # Paddle's backward computes more of the coordinates in float32 than its forward
    yn, ys, dn = _linear_index(ratio_h, oh_, h_, half_pixel, False, True)
    xw, xe, dw = _linear_index(ratio_w, ow_, w_, half_pixel, True, True)
    one = np.float32(1.0)
    for a in range(a_):
        for k in range(oh_):
            n, s, wn = yn[k], ys[k], dn[k]
            ws = one - wn
            if b_ == 1:
                for j in range(ow_):
                    w, e, we = xw[j], xe[j], dw[j]
                    ww = one - we
                    g = dout[a, k, j, 0]
                    dx[a, n, w, 0] += g * ws * ww
                    dx[a, s, w, 0] += g * wn * ww
                    dx[a, n, e, 0] += g * ws * we
                    dx[a, s, e, 0] += g * wn * we
                continue
            for j in range(ow_):
                w, e, we = xw[j], xe[j], dw[j]
                ww = one - we
                for b in range(b_):
                    g = dout[a, k, j, b]
                    dx[a, n, w, b] += g * ws * ww
                    dx[a, s, w, b] += g * wn * ww
                    dx[a, n, e, b] += g * ws * we
                    dx[a, s, e, b] += g * wn * we


# ---- padding ---------------------------------------------------------------------------------
# modes, as the lowerings pass them
PAD_CONSTANT, PAD_REFLECT, PAD_REPLICATE, PAD_CIRCULAR = 0, 1, 2, 3


@jit
def _pad_source(o, before, size, mode):
    """The source index of output index ``o`` along an axis padded by ``before`` in front
    (-1: outside, for constant padding)."""
    i = o - before
    if mode == 0:
        return i if 0 <= i < size else -1
    if mode == 1:  # reflect about the edge elements (pads are smaller than the size)
        i = abs(i)
        return (size - 1) - abs(i - (size - 1))
    if mode == 2:
        return min(max(i, 0), size - 1)
    return i % size


@jit
def _pad_map(out_n, before, size, mode):
    m = np.empty(out_n, np.int64)
    for o in range(out_n):
        m[o] = _pad_source(o, before, size, mode)
    return m


@jit
def pad3d(x, out, front, top, left, mode, value):
    """Pad ``x`` ([A, D, H, W, B]) into ``out`` ([A, OD, OH, OW, B]): ``front``, ``top``,
    ``left`` elements before D, H, W (negative: cropped), the rest after. ``mode``: 0 constant
    (``value``), 1 reflect, 2 replicate (edge), 3 circular."""
    a_, d_, h_, w_, b_ = x.shape
    od, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    back, bottom, right = od - d_ - front, oh - h_ - top, ow - w_ - left
    if mode != 0 and min(min(front, back), min(min(top, bottom), min(left, right))) < 0:
        raise ValueError("pdjit: negative paddings crop only in constant mode")
    if mode == 1 and (max(front, back) >= d_ or max(top, bottom) >= h_ or
                      max(left, right) >= w_):
        raise ValueError("pdjit: reflect padding must be smaller than the padded dim")
    md = _pad_map(od, front, d_, mode)
    mh = _pad_map(oh, top, h_, mode)
    mw = _pad_map(ow, left, w_, mode)
    for a in range(a_):
        for i in range(od):
            si = md[i]
            for j in range(oh):
                sj = mh[j]
                if b_ == 1:  # channel-first data: no inner loop
                    for k in range(ow):
                        sk = mw[k]
                        if si < 0 or sj < 0 or sk < 0:
                            out[a, i, j, k, 0] = value
                        else:
                            out[a, i, j, k, 0] = x[a, si, sj, sk, 0]
                    continue
                for k in range(ow):
                    sk = mw[k]
                    if si < 0 or sj < 0 or sk < 0:
                        for b in range(b_):
                            out[a, i, j, k, b] = value
                    else:
                        for b in range(b_):
                            out[a, i, j, k, b] = x[a, si, sj, sk, b]


@jit
def pad3d_grad(dout, dx, front, top, left, mode):
    """The gradient of :func:`pad3d`: each ``dout`` element adds into its source element of
    ``dx`` (overwritten); constant padding's filler has none."""
    a_, d_, h_, w_, b_ = dx.shape
    od, oh, ow = dout.shape[1], dout.shape[2], dout.shape[3]
    md = _pad_map(od, front, d_, mode)
    mh = _pad_map(oh, top, h_, mode)
    mw = _pad_map(ow, left, w_, mode)
    dx[:] = 0
    for a in range(a_):
        for i in range(od):
            si = md[i]
            for j in range(oh):
                sj = mh[j]
                for k in range(ow):
                    sk = mw[k]
                    if si >= 0 and sj >= 0 and sk >= 0:
                        for b in range(b_):
                            dx[a, si, sj, sk, b] += dout[a, i, j, k, b]


# ---- per-channel affine map ------------------------------------------------------------------
@jit
def affine_channel(x, scale, bias, out):
    """``out[a, c, b] = x[a, c, b] * scale[c] + bias[c]`` on ``[A, C, B]`` views."""
    a_, c_, b_ = x.shape
    for a in range(a_):
        for c in range(c_):
            s, t = scale[c], bias[c]
            for b in range(b_):
                out[a, c, b] = x[a, c, b] * s + t


@jit
def affine_channel_grad(x, scale, dout, dx, dscale, dbias, want_dx, want_dscale, want_dbias):
    """The gradients of :func:`affine_channel` on ``[A, C, B]`` views: ``dx = dout * scale``,
    ``dscale[c] = sum(dout * x)``, ``dbias[c] = sum(dout)`` over the non-channel axes; each
    computed only when wanted (an unwanted one may be any array)."""
    a_, c_, b_ = dout.shape
    if want_dscale:
        dscale[:] = 0
    if want_dbias:
        dbias[:] = 0
    for a in range(a_):
        for c in range(c_):
            s = scale[c]
            for b in range(b_):
                g = dout[a, c, b]
                if want_dx:
                    dx[a, c, b] = g * s
                if want_dscale:
                    dscale[c] += g * x[a, c, b]
                if want_dbias:
                    dbias[c] += g
