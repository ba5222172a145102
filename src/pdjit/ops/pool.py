"""Pooling: ``pool2d`` (max/avg), ``max_pool2d_with_index``, and their gradients.

Semantics are PaddlePaddle 3.3.1's legacy ops (measured against it):

- ``ksize``, ``strides``, ``paddings`` (2 or 4 values), ``padding_algorithm`` and
  ``data_format`` as for the convolutions (``pdjit.ops.conv``); SAME pads by the window size.
- Output size ``(H - k + p0 + p1) // s + 1``, or ``(H - k + p0 + p1 + s - 1) // s + 1`` with
  ``ceil_mode``. ``global_pooling`` pools the whole plane (``ksize`` = the image, no padding);
  ``adaptive`` makes ``ksize`` the output size, with window ``[floor(i * H / OH), ceil((i + 1)
  * H / OH))``.
- Window ``i`` starts at ``i * s - p0`` and ends ``k`` later but not past ``H + p0`` (the
  padding *before*, as Paddle's CPU kernel has it, even with unequal paddings); what lies in
  the image is read. ``avg`` divides by the count read when ``exclusive`` (or adaptive), else
  by the window's length before clipping to the image.
- ``max`` ignores padding; the gradient goes to the first maximum of each window (row-major).
  ``max_pool2d_with_index`` writes that position ``h * W + w`` as ``Mask`` (int32); it has no
  ``data_format`` or ``padding_algorithm``.

Each target lowers them in its own table (``codegen/<target>/lowerings/pool.py``); ``_Pool``
gives them the resolved attributes, with the window and output sizes as source expressions.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    Bool,
    Ints,
    Layout,
    Opaque,
    RowWise,
    Str,
    VarMeta,
    default_grad,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype
from pdjit.ops.conv import Geometry, from_nchw, to_nchw

_KSIZE = Ints(REQUIRED, choices=([2, 2], [3, 3], [1, 2]), at_least=1)
_POOL_ATTRS = {
    "pooling_type": Str("max", choices=("max", "avg"), one_of=("max", "avg")), "ksize": _KSIZE,
    "global_pooling": Bool(False), "strides": Ints([1, 1], at_least=1),
    "paddings": Ints([0, 0], at_least=0), "exclusive": Bool(True), "adaptive": Bool(False),
    "ceil_mode": Bool(False),
    "data_format": Str("NCHW", choices=("NCHW", "NHWC")),
    "padding_algorithm": Str("EXPLICIT", choices=("EXPLICIT", "SAME", "VALID")),
}
_INDEX_ATTRS = {
    "ksize": _KSIZE, "global_pooling": Bool(False), "strides": Ints([1, 1], at_least=1),
    "paddings": Ints([0, 0], at_least=0), "adaptive": Bool(False), "ceil_mode": Bool(False),
}


class _Pool:
    """A pooling op's attributes, resolved: geometry, window, flags."""

    def __init__(self, attrs: dict, what: str):
        self.what = what
        ksize = list(attrs["ksize"])
        if len(ksize) != 2 or min(ksize) < 1:
            raise ShapeMismatch(f"{what}: expected ksize of 2 positive ints, got {ksize}")
        self.ksize = tuple(ksize)
        self.global_ = attrs["global_pooling"]
        self.adaptive = attrs["adaptive"] and not self.global_
        self.is_max = attrs.get("pooling_type", "max") == "max"
        self.exclusive = attrs.get("exclusive", True)
        self.ceil = attrs.get("ceil_mode", False)
        algo = attrs.get("padding_algorithm", "EXPLICIT")
        self.g = Geometry(strides=attrs["strides"], paddings=attrs["paddings"],
                          padding_algorithm=algo, data_format=attrs.get("data_format", "NCHW"),
                          what=what)

    def window(self, axis: int, size: int) -> tuple:
        """(k, stride, pad before, pad after) along ``axis`` for an input of ``size``."""
        if self.global_:
            return size, 1, 0, 0
        k = self.ksize[axis]
        p0, p1, _ = self.g.window(axis, size, k)
        return k, self.g.strides[axis], p0, p1

    def out(self, axis: int, size: int) -> int:
        if self.global_:
            return 1
        if self.adaptive:
            return self.ksize[axis]
        if size < 0:
            return -1
        k, s, p0, p1 = self.window(axis, size)
        out = (size - k + p0 + p1 + (s - 1 if self.ceil else 0)) // s + 1
        if out <= 0:
            raise ShapeMismatch(f"{self.what}: an input of size {size} along spatial axis {axis}"
                                f" with paddings {p0}+{p1} is smaller than the window {k}: "
                                f"expected an output size > 0, got {out}")
        return out

    # source expressions over the run-time size ``size`` (the lowerings)
    def src_window(self, axis: int, size: str) -> tuple:
        if self.global_:
            return size, "1", "0", "0"
        k = self.ksize[axis]
        p0, p1, _ = self.g.src_window(axis, size, k)
        return str(k), str(self.g.strides[axis]), p0, p1

    def src_out(self, axis: int, size: str) -> str:
        if self.global_:
            return "1"
        if self.adaptive:
            return str(self.ksize[axis])
        k, s, p0, p1 = self.src_window(axis, size)
        extra = f" + {int(s) - 1}" if self.ceil else ""
        return f"(({size}) - {k} + {p0} + {p1}{extra}) // {s} + 1"

    def args(self, h: str, w: str) -> str:
        """``kh, kw, sh, sw, pt, pl`` of the library call for an NCHW image of ``h, w``."""
        kh, sh, pt, _ = self.src_window(0, h)
        kw, sw, pl, _ = self.src_window(1, w)
        return f"{kh}, {kw}, {sh}, {sw}, {pt}, {pl}"

    def meta(self, X: VarMeta) -> VarMeta:
        if X.ndim != 4:
            raise ShapeMismatch(f"{self.what}: expected X of rank 4, got shape {list(X.shape)}")
        h, w = self.g.spatial(X.shape)
        return X.with_(shape=self.g.image(X.shape[0], self.g.channels(X.shape), self.out(0, h),
                                          self.out(1, w)))


def _spans(p: _Pool, axis: int, size: int, osize: int):
    """Per output index: (first, end, length for a non-exclusive average)."""
    k, s, p0, _ = p.window(axis, size)
    spans = []
    for o in range(osize):
        if p.adaptive:
            a, b = (o * size) // osize, -(-(o + 1) * size // osize)
            spans.append((a, b, b - a))
        else:
            a = o * s - p0
            b = min(a + k, size + p0)
            spans.append((max(a, 0), min(b, size), b - a))
    return spans


def _pool_ref_nchw(x, p: _Pool, osize):
    n, c, h, w = x.shape
    y = np.empty((n, c) + osize, x.dtype)
    hs, ws = _spans(p, 0, h, osize[0]), _spans(p, 1, w, osize[1])
    for i, (h0, h1, lh) in enumerate(hs):
        for j, (w0, w1, lw) in enumerate(ws):
            win = x[:, :, h0:h1, w0:w1]
            if p.is_max:
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = (h1 - h0) * (w1 - w0) if p.exclusive or p.adaptive else lh * lw
                y[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return y


def _pool_infer(X, **attrs):
    check_dtype(X, FLOATS, "input X")
    return {"Out": _Pool(attrs, "pool2d").meta(X)}


def _pool_ref(X, **attrs):
    p = _Pool(attrs, "pool2d")
    out = p.meta(VarMeta(X.shape, X.dtype)).shape
    return {"Out": from_nchw(_pool_ref_nchw(to_nchw(X, p.g), p, p.g.spatial(out)), p.g)}


def _pool_grad_ref(X, Out, **kw):
    attrs = {k: v for k, v in kw.items() if k != "Out@GRAD"}
    p = _Pool(attrs, "pool2d_grad")
    x, y, dy = (to_nchw(a, p.g) for a in (X, Out, kw["Out@GRAD"]))
    dx = np.zeros_like(x)
    hs, ws = _spans(p, 0, x.shape[2], y.shape[2]), _spans(p, 1, x.shape[3], y.shape[3])
    for i, (h0, h1, lh) in enumerate(hs):
        for j, (w0, w1, lw) in enumerate(ws):
            g = dy[:, :, i, j]
            if p.is_max:
                win = x[:, :, h0:h1, w0:w1].reshape(x.shape[0], x.shape[1], -1)
                first = np.argmax(win == y[:, :, i, j][..., None], axis=2)
                hh, ww = h0 + first // (w1 - w0), w0 + first % (w1 - w0)
                nn, cc = np.indices(first.shape)
                np.add.at(dx, (nn, cc, hh, ww), g)
            else:
                cnt = (h1 - h0) * (w1 - w0) if p.exclusive or p.adaptive else lh * lw
                dx[:, :, h0:h1, w0:w1] += (g / cnt)[..., None, None]
    return {"X@GRAD": from_nchw(dx.astype(X.dtype, copy=False), p.g)}


register_op(
    "pool2d", inputs=["X"], outputs=["Out"], attrs=_POOL_ATTRS, traits=[OPAQUE],
    row_wise=RowWise(),
    infer_shape=_pool_infer, reference=_pool_ref,
    emit=Opaque(), layout=Layout(inputs=("X",), outputs=("Out",), join=True),
    grad=default_grad("pool2d_grad", fwd_inputs=("X",), fwd_outputs=("Out",)),
    doc="Out = the max or average of X over 2-D windows.")
register_op(
    "pool2d_grad", inputs=["X", "Out", "Out@GRAD"], outputs=["X@GRAD?"], attrs=_POOL_ATTRS,
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_pool_grad_ref,
    emit=Opaque(), grad=None,
    doc="The gradient of pool2d.")


# ---- max_pool2d_with_index --------------------------------------------------------------------
def _index_infer(X, **attrs):
    check_dtype(X, FLOATS, "input X")
    out = _Pool(attrs, "max_pool2d_with_index").meta(X)
    return {"Out": out, "Mask": out.with_(dtype=np.dtype(np.int32))}


def _index_ref(X, **attrs):
    p = _Pool(attrs, "max_pool2d_with_index")
    n, c, h, w = X.shape
    oh, ow = p.meta(VarMeta(X.shape, X.dtype)).shape[2:]
    y = np.empty((n, c, oh, ow), X.dtype)
    mask = np.empty((n, c, oh, ow), np.int32)
    for i, (h0, h1, _) in enumerate(_spans(p, 0, h, oh)):
        for j, (w0, w1, _) in enumerate(_spans(p, 1, w, ow)):
            win = X[:, :, h0:h1, w0:w1].reshape(n, c, -1)
            first = np.argmax(win, axis=2)
            y[:, :, i, j] = win.max(axis=2)
            mask[:, :, i, j] = (h0 + first // (w1 - w0)) * w + w0 + first % (w1 - w0)
    return {"Out": y, "Mask": mask}


def _index_grad_ref(X, Mask, **kw):
    dy = kw["Out@GRAD"]
    n, c, h, w = X.shape
    dx = np.zeros((n, c, h * w), X.dtype)
    nn, cc = np.indices((n, c))
    for i in range(dy.shape[2]):
        for j in range(dy.shape[3]):
            np.add.at(dx, (nn, cc, Mask[:, :, i, j]), dy[:, :, i, j])
    return {"X@GRAD": dx.reshape(X.shape)}


register_op(
    "max_pool2d_with_index", inputs=["X"], outputs=["Out", "Mask"], attrs=_INDEX_ATTRS,
    row_wise=RowWise(),
    traits=[OPAQUE], infer_shape=_index_infer, reference=_index_ref,
    emit=Opaque(),
    grad=default_grad("max_pool2d_with_index_grad", fwd_inputs=("X",), fwd_outputs=("Mask",)),
    doc="Out = the max of X over 2-D windows; Mask = where each max is (h * W + w).")
register_op(
    "max_pool2d_with_index_grad", inputs=["X", "Mask", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=_INDEX_ATTRS, traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_index_grad_ref, emit=Opaque(), grad=None,
    doc="The gradient of max_pool2d_with_index: Out@GRAD added where Mask points.")
