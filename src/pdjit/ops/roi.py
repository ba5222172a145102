"""Fluid 1.8's region-of-interest pooling: ``roi_pool`` (max over quantised bins, with
``Argmax``), ``roi_align`` (the mean of bilinear samples per bin) and ``psroi_pool``
(position-sensitive means, described above its definition), with their gradients.

``ROIs [R, 4]`` hold ``(x1, y1, x2, y2)`` in input-image coordinates; its one-level LoD says
which image of ``X [N, C, H, W]`` each belongs to (without a LoD, with ``N = 1``, all belong to
image 0). Coordinates are scaled by ``spatial_scale``.

- ``roi_pool``: corners rounded (halves away from zero), the box at least 1x1 pixel and
  inclusive of its end; bin ``(i, j)`` covers rows ``floor(i h / ph) .. ceil((i + 1) h / ph)``
  of it (clipped to the image); ``Out`` is the bin's maximum (0 for an empty bin) and
  ``Argmax`` its flat ``row * W + col`` (-1 when empty). The gradient goes to the argmax.
- ``roi_align`` (Fluid 1.8: not ``aligned``): the box unrounded and at least 1x1; each bin
  averages ``sampling_ratio`` x ``sampling_ratio`` bilinear samples (``ceil`` of the bin's size
  when ``sampling_ratio <= 0``) at the centres of a regular grid over the bin; a sample more than
  one pixel outside the image counts 0, others are clamped to the image. The gradient
  distributes each bin's gradient to the samples' four pixels.

Both run their NumPy references as plan steps (``emit`` is ``None``).
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    SEQUENCE,
    Float,
    GradOpSpec,
    Int,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

_POOL = {"pooled_height": Int(1, low=1, high=2), "pooled_width": Int(1, low=1, high=2),
         "spatial_scale": Float(1.0, low=0.5, high=1.0)}
_ALIGN = dict(_POOL, sampling_ratio=Int(-1, low=-1, high=2))


def _batch_ids(ctx, rois, n_images, op):
    lod = ctx.input_lod("ROIs") if ctx is not None else []
    if not lod:
        if n_images != 1:
            raise ShapeMismatch(f"{op}: ROIs need a one-level LoD saying which of the "
                                f"{n_images} images each belongs to")
        return np.zeros(rois.shape[0], np.int64)
    offs = np.asarray(lod[-1], np.int64)
    if offs[-1] != rois.shape[0] or len(offs) - 1 != n_images:
        raise ShapeMismatch(f"{op}: ROIs' LoD {lod[-1]}: expected {n_images} sequences over "
                            f"{rois.shape[0]} rows")
    return np.repeat(np.arange(n_images), np.diff(offs))


def _infer(X, ROIs, *, pooled_height, pooled_width, **_):
    check_dtype(X, FLOATS, "input X")
    if X.ndim != 4 or ROIs.ndim != 2 or ROIs.shape[1] not in (4, -1):
        raise ShapeMismatch(f"expected X [N, C, H, W] and ROIs [R, 4], got {list(X.shape)} and "
                            f"{list(ROIs.shape)}")
    return (ROIs.shape[0], X.shape[1], pooled_height, pooled_width)


def _round(v):
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def _pool_bins(roi, scale, ph, pw, h, w):
    x1, y1, x2, y2 = (_round(float(v) * scale) for v in roi)
    rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
    for i in range(ph):
        hs = min(max(math.floor(i * rh / ph) + y1, 0), h)
        he = min(max(math.ceil((i + 1) * rh / ph) + y1, 0), h)
        for j in range(pw):
            ws = min(max(math.floor(j * rw / pw) + x1, 0), w)
            we = min(max(math.ceil((j + 1) * rw / pw) + x1, 0), w)
            yield i, j, hs, he, ws, we


def _pool_ref(X, ROIs, *, pooled_height, pooled_width, spatial_scale, ctx):
    ids = _batch_ids(ctx, ROIs, X.shape[0], "roi_pool")
    r, c = ROIs.shape[0], X.shape[1]
    h, w = X.shape[2:]
    out = np.zeros((r, c, pooled_height, pooled_width), X.dtype)
    arg = np.full(out.shape, -1, np.int64)
    for k in range(r):
        for i, j, hs, he, ws, we in _pool_bins(ROIs[k], float(np.float32(spatial_scale)),
                                               pooled_height, pooled_width, h, w):
            if he <= hs or we <= ws:
                continue
            patch = X[ids[k], :, hs:he, ws:we].reshape(c, -1)
            best = patch.argmax(axis=1)
            out[k, :, i, j] = patch[np.arange(c), best]
            arg[k, :, i, j] = (hs + best // (we - ws)) * w + ws + best % (we - ws)
    return {"Out": out, "Argmax": arg}


def _pool_grad_ref(X, ROIs, Argmax, ctx, **kw):
    g = kw["Out@GRAD"]
    ids = _batch_ids(ctx, ROIs, X.shape[0], "roi_pool_grad")
    dx = np.zeros((X.shape[0], X.shape[1], X.shape[2] * X.shape[3]))
    r, c = Argmax.shape[:2]
    for k in range(r):
        for ch in range(c):
            a, gv = Argmax[k, ch].reshape(-1), g[k, ch].reshape(-1)
            ok = a >= 0
            np.add.at(dx[ids[k], ch], a[ok], gv[ok])
    return {"X@GRAD": dx.reshape(X.shape).astype(X.dtype)}


register_op(
    "roi_pool", inputs=["X", "ROIs"], outputs=["Out", "Argmax~"], attrs=_POOL,
    traits=[OPAQUE, SEQUENCE],
    infer_shape=lambda X, ROIs, **a: {"Out": VarMeta(_infer(X, ROIs, **a), X.dtype),
                                      "Argmax": VarMeta(_infer(X, ROIs, **a), np.int64)},
    reference=_pool_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "roi_pool_grad", {"X": op.input("X"), "ROIs": op.input("ROIs"),
                          "Argmax": op.output("Argmax"),
                          "Out@GRAD": [grad_var_name(v) for v in op.output("Out")]},
        {"X@GRAD": [grad_var_name(v) for v in op.input("X")]},
        {k: v for k, v in op.all_attrs().items() if k in _POOL})],
    out_lod=lambda lods, **_: {"Out": [], "Argmax": []},
    doc="Max over each quantised bin of each region of interest.")
register_op(
    "roi_pool_grad", inputs=["X", "ROIs", "Argmax", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_POOL), traits=[OPAQUE, SEQUENCE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_pool_grad_ref, emit=None, grad=None, out_lod=lambda lods, **_: {"X@GRAD": []},
    doc="Out@GRAD added at each bin's argmax.")


def _align_samples(roi, scale, ph, pw, ratio, h, w):
    """For each bin (i, j): [(weight, row, col)] of its bilinear taps, weights / count."""
    x1, y1, x2, y2 = (float(v) * scale for v in roi)
    rw, rh = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
    bh, bw = rh / ph, rw / pw
    gh = ratio if ratio > 0 else math.ceil(rh / ph)
    gw = ratio if ratio > 0 else math.ceil(rw / pw)
    count = gh * gw
    for i in range(ph):
        for j in range(pw):
            taps = []
            for iy in range(gh):
                y = y1 + i * bh + (iy + 0.5) * bh / gh
                for ix in range(gw):
                    x = x1 + j * bw + (ix + 0.5) * bw / gw
                    if y < -1.0 or y > h or x < -1.0 or x > w:
                        continue
                    y, x = max(y, 0.0), max(x, 0.0)
                    yl, xl = int(y), int(x)
                    if yl >= h - 1:
                        yl = yh = h - 1
                        y = float(yl)
                    else:
                        yh = yl + 1
                    if xl >= w - 1:
                        xl = xh = w - 1
                        x = float(xl)
                    else:
                        xh = xl + 1
                    ly, lx = y - yl, x - xl
                    hy, hx = 1 - ly, 1 - lx
                    taps += [(hy * hx / count, yl, xl), (hy * lx / count, yl, xh),
                             (ly * hx / count, yh, xl), (ly * lx / count, yh, xh)]
            yield i, j, taps


def _align_ref(X, ROIs, *, pooled_height, pooled_width, spatial_scale, sampling_ratio, ctx):
    ids = _batch_ids(ctx, ROIs, X.shape[0], "roi_align")
    out = np.zeros((ROIs.shape[0], X.shape[1], pooled_height, pooled_width))
    for k in range(ROIs.shape[0]):
        img = X[ids[k]].astype(np.float64)
        for i, j, taps in _align_samples(ROIs[k], float(np.float32(spatial_scale)),
                                         pooled_height, pooled_width, sampling_ratio,
                                         X.shape[2], X.shape[3]):
            for wt, yy, xx in taps:
                out[k, :, i, j] += wt * img[:, yy, xx]
    return {"Out": out.astype(X.dtype)}


def _align_grad_ref(X, ROIs, *, pooled_height, pooled_width, spatial_scale, sampling_ratio,
                    ctx, **kw):
    g = kw["Out@GRAD"].astype(np.float64)
    ids = _batch_ids(ctx, ROIs, X.shape[0], "roi_align_grad")
    dx = np.zeros(X.shape)
    for k in range(ROIs.shape[0]):
        for i, j, taps in _align_samples(ROIs[k], float(np.float32(spatial_scale)),
                                         pooled_height, pooled_width, sampling_ratio,
                                         X.shape[2], X.shape[3]):
            for wt, yy, xx in taps:
                dx[ids[k], :, yy, xx] += wt * g[k, :, i, j]
    return {"X@GRAD": dx.astype(X.dtype)}


register_op(
    "roi_align", inputs=["X", "ROIs"], outputs=["Out"], attrs=_ALIGN,
    traits=[OPAQUE, SEQUENCE],
    infer_shape=lambda X, ROIs, **a: {"Out": VarMeta(_infer(X, ROIs, **a), X.dtype)},
    reference=_align_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "roi_align_grad", {"X": op.input("X"), "ROIs": op.input("ROIs"),
                           "Out@GRAD": [grad_var_name(v) for v in op.output("Out")]},
        {"X@GRAD": [grad_var_name(v) for v in op.input("X")]},
        {k: v for k, v in op.all_attrs().items() if k in _ALIGN})],
    out_lod=lambda lods, **_: {"Out": []},
    doc="The mean of bilinear samples over each bin of each region of interest.")
register_op(
    "roi_align_grad", inputs=["X", "ROIs", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_ALIGN), traits=[OPAQUE, SEQUENCE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_align_grad_ref, emit=None, grad=None, out_lod=lambda lods, **_: {"X@GRAD": []},
    doc="Each bin's gradient spread over its samples' pixels.")


# ---- psroi_pool (position-sensitive) -----------------------------------------------------------
# X [N, K * ph * pw, H, W] -> Out [R, K, ph, pw]: bin (i, j) of output channel k averages input
# channel (k * ph + i) * pw + j over the bin; the box's corners rounded, its end pixel included,
# then scaled (at least 0.1 wide); bins floor/ceil'd and clipped; an empty bin gives 0.
_PS = {"output_channels": Int(1, low=1, high=2), "pooled_height": Int(1, low=1, high=2),
       "pooled_width": Int(1, low=1, high=2), "spatial_scale": Float(1.0, low=0.5, high=1.0)}


def _ps_bins(roi, scale, ph, pw, h, w):
    x1, y1 = _round(float(roi[0])) * scale, _round(float(roi[1])) * scale
    x2, y2 = (_round(float(roi[2])) + 1.0) * scale, (_round(float(roi[3])) + 1.0) * scale
    rh, rw = max(y2 - y1, 0.1), max(x2 - x1, 0.1)
    bh, bw = rh / ph, rw / pw
    for i in range(ph):
        hs = min(max(math.floor(bh * i + y1), 0), h)
        he = min(max(math.ceil(bh * (i + 1) + y1), 0), h)
        for j in range(pw):
            ws = min(max(math.floor(bw * j + x1), 0), w)
            we = min(max(math.ceil(bw * (j + 1) + x1), 0), w)
            yield i, j, hs, he, ws, we


def _ps_infer(X, ROIs, *, output_channels, pooled_height, pooled_width, **_):
    check_dtype(X, FLOATS, "psroi_pool: input X")
    if X.ndim != 4 or (X.shape[1] >= 0 and
                       X.shape[1] != output_channels * pooled_height * pooled_width):
        raise ShapeMismatch(f"psroi_pool: expected X [N, output_channels * ph * pw = "
                            f"{output_channels * pooled_height * pooled_width}, H, W], got "
                            f"{list(X.shape)}")
    return {"Out": VarMeta((ROIs.shape[0], output_channels, pooled_height, pooled_width),
                           X.dtype)}


def _ps_walk(X, ROIs, a, ctx, op):
    ids = _batch_ids(ctx, ROIs, X.shape[0], op)
    ph, pw = a["pooled_height"], a["pooled_width"]
    for k in range(ROIs.shape[0]):
        for i, j, hs, he, ws, we in _ps_bins(ROIs[k], float(np.float32(a["spatial_scale"])),
                                             ph, pw, X.shape[2], X.shape[3]):
            chans = (np.arange(a["output_channels"]) * ph + i) * pw + j
            yield k, ids[k], i, j, chans, hs, he, ws, we


def _ps_ref(X, ROIs, *, ctx, **a):
    out = np.zeros((ROIs.shape[0], a["output_channels"], a["pooled_height"],
                    a["pooled_width"]))
    for k, b, i, j, chans, hs, he, ws, we in _ps_walk(X, ROIs, a, ctx, "psroi_pool"):
        if he > hs and we > ws:
            out[k, :, i, j] = X[b, chans, hs:he, ws:we].astype(np.float64).mean(axis=(1, 2))
    return {"Out": out.astype(X.dtype)}


def _ps_grad_ref(X, ROIs, *, ctx, **a):
    g = a.pop("Out@GRAD").astype(np.float64)
    dx = np.zeros(X.shape)
    for k, b, i, j, chans, hs, he, ws, we in _ps_walk(X, ROIs, a, ctx, "psroi_pool_grad"):
        if he > hs and we > ws:
            dx[b, chans, hs:he, ws:we] += (g[k, :, i, j] / ((he - hs) * (we - ws)))[:, None, None]
    return {"X@GRAD": dx.astype(X.dtype)}


register_op(
    "psroi_pool", inputs=["X", "ROIs"], outputs=["Out"], attrs=_PS, traits=[OPAQUE, SEQUENCE],
    infer_shape=_ps_infer, reference=_ps_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "psroi_pool_grad", {"X": op.input("X"), "ROIs": op.input("ROIs"),
                            "Out@GRAD": [grad_var_name(v) for v in op.output("Out")]},
        {"X@GRAD": [grad_var_name(v) for v in op.input("X")]},
        {k: v for k, v in op.all_attrs().items() if k in _PS})],
    out_lod=lambda lods, **_: {"Out": []},
    doc="Position-sensitive average pooling of each region of interest.")
register_op(
    "psroi_pool_grad", inputs=["X", "ROIs", "Out@GRAD"], outputs=["X@GRAD?"], attrs=dict(_PS),
    traits=[OPAQUE, SEQUENCE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_ps_grad_ref, emit=None, grad=None, out_lod=lambda lods, **_: {"X@GRAD": []},
    doc="Each bin's gradient spread evenly over its pixels.")
