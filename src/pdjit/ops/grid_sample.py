"""Fluid 1.8's ``grid_sampler`` (spatial-transformer sampling) and its gradient.

``Output[n, c, i, j]`` is ``X[n, c]`` read bilinearly at the point ``Grid[n, i, j] = (gx, gy)``
in [-1, 1] coordinates, the corners of the image at -1 and 1 (``x = (gx + 1) (W - 1) / 2``,
``y = (gy + 1) (H - 1) / 2``); neighbours outside the image count 0. The gradient reaches ``X``
(each read's weight) and ``Grid`` (the weights' slopes). Only Fluid 1.8's behaviour is
implemented (``mode`` 'bilinear', ``padding_mode`` 'zeros', ``align_corners``); the NumPy
reference runs as a plan step (``emit`` is ``None``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    Bool,
    GradOpSpec,
    Str,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

_ATTRS = {"use_cudnn": Bool(True), "align_corners": Bool(True, one_of=(True,)),
          "padding_mode": Str("zeros", one_of=("zeros",)),
          "mode": Str("bilinear", one_of=("bilinear",))}


def _infer(X, Grid, **_):
    check_dtype(X, FLOATS, "grid_sampler: input X")
    if X.ndim != 4 or Grid.ndim != 4 or Grid.shape[3] not in (2, -1):
        raise ShapeMismatch(f"grid_sampler: expected X [N, C, H, W] and Grid [N, H', W', 2], "
                            f"got {list(X.shape)} and {list(Grid.shape)}")
    return {"Output": VarMeta((X.shape[0], X.shape[1], Grid.shape[1], Grid.shape[2]), X.dtype)}


def _corners(X, Grid):
    """The four neighbours of every grid point: [(y, x, weight, in_bounds, dw/dx, dw/dy)]."""
    h, w = X.shape[2], X.shape[3]
    x = (Grid[..., 0].astype(np.float64) + 1) * (w - 1) / 2
    y = (Grid[..., 1].astype(np.float64) + 1) * (h - 1) / 2
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = x - x0, y - y0
    out = []
    for dy, wy, sy in ((0, 1 - fy, -1.0), (1, fy, 1.0)):
        for dx, wx, sx in ((0, 1 - fx, -1.0), (1, fx, 1.0)):
            yy, xx = (y0 + dy).astype(np.int64), (x0 + dx).astype(np.int64)
            ok = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            out.append((np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1), wy * wx, ok,
                        sx * wy, sy * wx))
    return out


def _check(X, Grid):
    if Grid.shape[0] != X.shape[0] or Grid.shape[3] != 2:
        raise ShapeMismatch(f"grid_sampler: expected Grid [{X.shape[0]}, H', W', 2], got "
                            f"{list(Grid.shape)}")


def _ref(X, Grid, **_):
    _check(X, Grid)
    n = np.arange(X.shape[0]).reshape(-1, 1, 1)
    out = np.zeros((X.shape[0], X.shape[1]) + Grid.shape[1:3])
    xv = X.astype(np.float64)
    for yy, xx, wgt, ok, _, _ in _corners(X, Grid):
        v = xv[n, :, yy, xx]                                   # [N, H', W', C]
        out += np.moveaxis(v * (wgt * ok)[..., None], -1, 1)
    return {"Output": out.astype(X.dtype)}


def _grad_ref(X, Grid, **kw):
    g = kw["Output@GRAD"].astype(np.float64)
    _check(X, Grid)
    h, w = X.shape[2], X.shape[3]
    n = np.arange(X.shape[0]).reshape(-1, 1, 1)
    gl = np.moveaxis(g, 1, -1)                                 # [N, H', W', C]
    dx = np.zeros(X.shape)
    dgx = np.zeros(Grid.shape[:3])
    dgy = np.zeros(Grid.shape[:3])
    xv = X.astype(np.float64)
    for yy, xx, wgt, ok, dwx, dwy in _corners(X, Grid):
        m = ok[..., None]
        contrib = gl * (wgt[..., None] * m)
        nn_ = np.broadcast_to(n, yy.shape)
        np.add.at(dx, (nn_.reshape(-1), slice(None), yy.reshape(-1), xx.reshape(-1)),
                  contrib.reshape(-1, X.shape[1]))
        v = (xv[n, :, yy, xx] * gl * m).sum(-1)               # [N, H', W']
        dgx += v * dwx
        dgy += v * dwy
    dgrid = np.stack([dgx * (w - 1) / 2, dgy * (h - 1) / 2], axis=-1)
    return {"X@GRAD": dx.astype(X.dtype), "Grid@GRAD": dgrid.astype(Grid.dtype)}


register_op(
    "grid_sampler", inputs=["X", "Grid"], outputs=["Output"], attrs=_ATTRS, traits=[OPAQUE],
    infer_shape=_infer, reference=_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "grid_sampler_grad",
        {"X": op.input("X"), "Grid": op.input("Grid"),
         "Output@GRAD": [grad_var_name(v) for v in op.output("Output")]},
        {"X@GRAD": [grad_var_name(v) for v in op.input("X")],
         "Grid@GRAD": [grad_var_name(v) for v in op.input("Grid")]},
        {k: v for k, v in op.all_attrs().items() if k in _ATTRS})],
    domain={"Grid": "unit"},
    doc="X sampled bilinearly at the [-1, 1] points of Grid (zeros outside).")
register_op(
    "grid_sampler_grad", inputs=["X", "Grid", "Output@GRAD"], outputs=["X@GRAD?", "Grid@GRAD?"],
    attrs=dict(_ATTRS), traits=[OPAQUE],
    infer_shape=lambda X, Grid, **_: {"X@GRAD": X, "Grid@GRAD": Grid},
    reference=_grad_ref, emit=None, grad=None, doc="Gradients of grid_sampler.")
