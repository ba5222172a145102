"""Convolutions: ``conv2d``, ``depthwise_conv2d``, ``conv2d_transpose``,
``depthwise_conv2d_transpose``, and their gradients.

Semantics are PaddlePaddle 3.3.1's legacy ops:

- ``Input`` is ``[N, C, H, W]`` (``data_format`` ``NCHW``, also written ``AnyLayout``) or
  ``[N, H, W, C]`` (``NHWC``). ``Filter`` is ``[M, C / groups, KH, KW]`` for a convolution and
  ``[C, M / groups, KH, KW]`` for a transposed one, in either data format.
- ``paddings`` holds 2 values (``[ph, pw]``, both sides alike) or 4 (``[top, bottom, left,
  right]``). ``padding_algorithm`` ``SAME`` pads so that ``out = ceil(in / stride)``: the total
  ``max((out - 1) * stride + k - in, 0)`` goes half to the top/left (rounded down), the rest to
  the bottom/right, and the dilations count as 1; ``VALID`` pads nothing.
- A convolution's output is ``(in + p0 + p1 - (d * (k - 1) + 1)) // stride + 1``; a
  transposed one's is ``(in - 1) * stride - p0 - p1 + d * (k - 1) + 1``, plus
  ``output_padding``, or ``output_size`` when given (which must lie in ``[that, that +
  stride)``).
- ``depthwise_conv2d`` is ``conv2d`` with ``groups`` (= C) given; the ``depthwise_*`` op types
  exist because Paddle writes them, and compute the same.

Each target lowers them in its own table (``codegen/<target>/lowerings/conv.py``); this module
gives them the geometry (``Geometry``, with source expressions over run-time sizes), the
target-neutral guards (``native_float``) and the sizes of images and outputs as source.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    ChannelLinear,
    Int,
    Ints,
    Layout,
    Opaque,
    RowWise,
    Str,
    VarMeta,
    default_grad,
    register_op,
    scaled_weight,
)
from pdjit.ops._common import FLOATS, check_dtype

_ALGOS = ("EXPLICIT", "SAME", "VALID")
_FORMATS = ("NCHW", "NHWC", "AnyLayout")


class Geometry:
    """A 2-D sliding window's attributes (shared by convolution and pooling): strides,
    paddings as ``(top, bottom, left, right)``, dilations, the padding algorithm, the layout."""

    def __init__(self, *, strides, paddings, padding_algorithm="EXPLICIT", dilations=(1, 1),
                 data_format="NCHW", what="conv2d"):
        self.what = what
        if len(strides) != 2 or min(strides) < 1:
            raise ShapeMismatch(f"{what}: expected strides of 2 positive ints, got "
                                f"{list(strides)}")
        if len(dilations) != 2 or min(dilations) < 1:
            raise ShapeMismatch(f"{what}: expected dilations of 2 positive ints, got "
                                f"{list(dilations)}")
        p = list(paddings)
        if len(p) == 2:
            p = [p[0], p[0], p[1], p[1]]
        elif len(p) != 4:
            raise ShapeMismatch(f"{what}: expected paddings of 2 or 4 ints, got {list(paddings)}")
        if min(p) < 0:
            raise ShapeMismatch(f"{what}: expected paddings >= 0, got {list(paddings)}")
        if padding_algorithm not in _ALGOS:
            raise ShapeMismatch(f"{what}: padding_algorithm must be one of {list(_ALGOS)}, got "
                                f"{padding_algorithm!r}")
        if data_format not in _FORMATS:
            raise ShapeMismatch(f"{what}: data_format must be NCHW or NHWC, got {data_format!r}")
        self.strides, self.dilations = tuple(strides), tuple(dilations)
        self.pads = tuple(p)
        self.algo = padding_algorithm
        self.nhwc = data_format == "NHWC"

    def spatial(self, shape) -> tuple:
        """(H, W) of an image of ``shape`` in this layout."""
        return tuple(shape[1:3]) if self.nhwc else tuple(shape[2:4])

    def channels(self, shape) -> int:
        return shape[3] if self.nhwc else shape[1]

    def image(self, n, c, h, w) -> tuple:
        return (n, h, w, c) if self.nhwc else (n, c, h, w)

    def window(self, axis: int, size: int, k: int) -> tuple:
        """(pad before, pad after, dilation) along spatial ``axis`` of an input of ``size``
        (-1: unknown, then the SAME pads are too)."""
        s, d = self.strides[axis], self.dilations[axis]
        if self.algo == "VALID":
            return 0, 0, d
        if self.algo == "SAME":
            if size < 0:
                return -1, -1, 1
            out = -(-size // s)
            total = max((out - 1) * s + k - size, 0)
            return total // 2, total - total // 2, 1
        return self.pads[2 * axis], self.pads[2 * axis + 1], d

    def conv_out(self, axis: int, size: int, k: int) -> int:
        """The output size of a convolution along ``axis`` (-1 when unknown)."""
        if size < 0:
            return -1
        p0, p1, d = self.window(axis, size, k)
        out = (size + p0 + p1 - (d * (k - 1) + 1)) // self.strides[axis] + 1
        if out <= 0:
            raise ShapeMismatch(f"{self.what}: an input of size {size} along spatial axis "
                                f"{axis}, padded by {p0}+{p1}, is smaller than the window "
                                f"({d * (k - 1) + 1}): expected an output size > 0, got {out}")
        return out

    # -- source expressions for the lowerings (run-time sizes) ---------------------------------
    def src_window(self, axis: int, size: str, k: int) -> tuple:
        """(pad before, pad after, dilation) as source expressions over the source ``size``."""
        s, d = self.strides[axis], self.dilations[axis]
        if self.algo == "VALID":
            return "0", "0", str(d)
        if self.algo == "SAME":
            total = f"max((({size}) + {s - 1}) // {s} * {s} - {s} + {k} - ({size}), 0)"
            return f"({total}) // 2", f"({total} - ({total}) // 2)", "1"
        return str(self.pads[2 * axis]), str(self.pads[2 * axis + 1]), str(d)

    def src_conv_out(self, axis: int, size: str, k: int) -> str:
        p0, p1, d = self.src_window(axis, size, k)
        return f"(({size}) + {p0} + {p1} - ({d} * {k - 1} + 1)) // {self.strides[axis]} + 1"


def _geometry(attrs: dict, what: str) -> Geometry:
    return Geometry(strides=attrs["strides"], paddings=attrs["paddings"],
                    padding_algorithm=attrs["padding_algorithm"], dilations=attrs["dilations"],
                    data_format=attrs["data_format"], what=what)


_CONV_ATTRS = {
    "strides": Ints([1, 1], at_least=1), "paddings": Ints([0, 0], at_least=0),
    "padding_algorithm": Str("EXPLICIT", choices=_ALGOS, one_of=_ALGOS),
    "groups": Int(1, low=1, high=2, at_least=1), "dilations": Ints([1, 1], at_least=1),
    "data_format": Str("NCHW", choices=("NCHW", "NHWC")),
}
_TRANSPOSE_ATTRS = dict(_CONV_ATTRS, output_padding=Ints([]), output_size=Ints([]))


def _check_4d(meta, what, op):
    if meta.ndim != 4:
        raise ShapeMismatch(f"{op}: expected {what} of rank 4, got shape {list(meta.shape)}")


def _known(a: int, b: int) -> bool:
    return a >= 0 and b >= 0


# ---- NumPy references (NCHW) ---------------------------------------------------------------------
def _windows(xp, i, j, g: Geometry, d, oh, ow):
    """The slice of the padded image ``xp`` that kernel position (i, j) meets, [N, C, oh, ow]."""
    (sh, sw), (dh, dw) = g.strides, d
    return xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]


def _pads_of(g: Geometry, h, w, kh, kw):
    pt, pb, dh = g.window(0, h, kh)
    pl, pr, dw = g.window(1, w, kw)
    return (pt, pb, pl, pr), (dh, dw)


def conv_ref(x, w, g: Geometry, groups, y_hw=None):
    """``conv(x, w)`` on NCHW arrays."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (pt, pb, pl, pr), d = _pads_of(g, h, wd, kh, kw)
    oh, ow = (g.conv_out(0, h, kh), g.conv_out(1, wd, kw)) if y_hw is None else y_hw
    xp = np.pad(x, ((0, 0), (0, 0), (pt, max(pb, 0)), (pl, max(pr, 0))))
    need_h = (kh - 1) * d[0] + g.strides[0] * (oh - 1) + 1
    need_w = (kw - 1) * d[1] + g.strides[1] * (ow - 1) + 1
    xp = np.pad(xp, ((0, 0), (0, 0), (0, max(need_h - xp.shape[2], 0)),
                     (0, max(need_w - xp.shape[3], 0))))
    wg = w.reshape(groups, m // groups, cg, kh, kw)
    y = np.zeros((n, groups, m // groups, oh, ow), np.result_type(x, w))
    for i in range(kh):
        for j in range(kw):
            xs = _windows(xp, i, j, g, d, oh, ow).reshape(n, groups, cg, oh, ow)
            y += np.einsum("gmc,ngchw->ngmhw", wg[:, :, :, i, j], xs)
    return y.reshape(n, m, oh, ow).astype(x.dtype, copy=False)


def conv_t_ref(dy, w, g: Geometry, groups, x_hw):
    """``conv^T(dy, w)`` on NCHW arrays: the image gradient of ``conv``, of spatial size
    ``x_hw``."""
    n, m, oh, ow = dy.shape
    _, cg, kh, kw = w.shape
    h, wd = x_hw
    (pt, pb, pl, pr), d = _pads_of(g, h, wd, kh, kw)
    hp = max(h + pt + pb, (kh - 1) * d[0] + g.strides[0] * (oh - 1) + 1 + 0)
    wp = max(wd + pl + pr, (kw - 1) * d[1] + g.strides[1] * (ow - 1) + 1)
    hp, wp = max(hp, pt + h), max(wp, pl + wd)
    dxp = np.zeros((n, groups * cg, hp, wp), np.result_type(dy, w))
    wg = w.reshape(groups, m // groups, cg, kh, kw)
    dyg = dy.reshape(n, groups, m // groups, oh, ow)
    for i in range(kh):
        for j in range(kw):
            part = np.einsum("gmc,ngmhw->ngchw", wg[:, :, :, i, j], dyg)
            _windows(dxp, i, j, g, d, oh, ow)[...] += part.reshape(n, groups * cg, oh, ow)
    return dxp[:, :, pt:pt + h, pl:pl + wd].astype(dy.dtype, copy=False)


def conv_w_ref(x, dy, g: Geometry, groups, w_shape):
    """The filter gradient of ``conv(x, w)`` contracted with ``dy`` (NCHW)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w_shape
    oh, ow = dy.shape[2:]
    (pt, pb, pl, pr), d = _pads_of(g, h, wd, kh, kw)
    need_h = (kh - 1) * d[0] + g.strides[0] * (oh - 1) + 1
    need_w = (kw - 1) * d[1] + g.strides[1] * (ow - 1) + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pt, max(need_h - h - pt, 0)),
                    (pl, max(need_w - wd - pl, 0))))
    dyg = dy.reshape(n, groups, m // groups, oh, ow)
    dw = np.zeros((groups, m // groups, cg, kh, kw), np.result_type(x, dy))
    for i in range(kh):
        for j in range(kw):
            xs = _windows(xp, i, j, g, d, oh, ow).reshape(n, groups, cg, oh, ow)
            dw[:, :, :, i, j] = np.einsum("ngmhw,ngchw->gmc", dyg, xs)
    return dw.reshape(w_shape).astype(x.dtype, copy=False)


def to_nchw(a, g: Geometry):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2)) if g.nhwc else a


def from_nchw(a, g: Geometry):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if g.nhwc else a


# ---- conv2d / depthwise_conv2d ----------------------------------------------------------------
def _operands(Input, Filter, attrs, op):
    """Checks both convolutions make of their operands; their geometry."""
    check_dtype(Input, FLOATS, "Input")
    if Filter.dtype != Input.dtype:
        raise ShapeMismatch(f"{op}: expected Filter of Input's dtype {Input.dtype}, got "
                            f"{Filter.dtype}")
    _check_4d(Input, "Input", op)
    _check_4d(Filter, "Filter", op)
    return _geometry(attrs, op)


def _conv_infer(Input, Filter, **attrs):
    op = "conv2d"
    g = _operands(Input, Filter, attrs, op)
    groups = attrs["groups"]
    m, cg, kh, kw = Filter.shape
    c = g.channels(Input.shape)
    if groups < 1 or (m >= 0 and m % groups):
        raise ShapeMismatch(f"{op}: expected groups >= 1 dividing the {m} filters, got "
                            f"groups={groups}")
    if _known(c, cg) and c != cg * groups:
        raise ShapeMismatch(f"{op}: Input has {c} channels but Filter {list(Filter.shape)} with "
                            f"groups={groups} expects {cg * groups}")
    h, w = g.spatial(Input.shape)
    return {"Output": Input.with_(shape=g.image(Input.shape[0], m, g.conv_out(0, h, kh),
                                                 g.conv_out(1, w, kw)))}


def _conv_ref(Input, Filter, **attrs):
    g = _geometry(attrs, "conv2d")
    _conv_infer_arrays(Input, Filter, attrs)
    y = conv_ref(to_nchw(Input, g), Filter, g, attrs["groups"])
    return {"Output": from_nchw(y, g)}


def _conv_infer_arrays(Input, Filter, attrs):
    _conv_infer(VarMeta(Input.shape, Input.dtype), VarMeta(Filter.shape, Filter.dtype), **attrs)


_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def native_float(dtype) -> bool:
    """Whether the library kernels take this dtype (BLAS: float32 and float64; float16 runs
    the references)."""
    return np.dtype(dtype) in _NATIVE_FLOATS


def _float_ok(ctx, *slots) -> bool:
    return all(native_float(ctx.dtype(s)) and ctx.dtype(s) == ctx.dtype(slots[0])
               for s in slots)


def image_dims(g: Geometry, X: str) -> tuple:
    """Source for (N, C, H, W) of the image ``X`` in its own layout."""
    n, h, w, c = (f"{X}.shape[{i}]" for i in range(4))
    return (n, c, h, w) if g.nhwc else (n, h, w, c)


def _conv_grad_ref(Input, Filter, **kw):
    attrs = {k: v for k, v in kw.items() if k != "Output@GRAD"}
    g = _geometry(attrs, "conv2d_grad")
    x, dy = to_nchw(Input, g), to_nchw(kw["Output@GRAD"], g)
    groups = attrs["groups"]
    return {"Input@GRAD": from_nchw(conv_t_ref(dy, Filter, g, groups, x.shape[2:]), g),
            "Filter@GRAD": conv_w_ref(x, dy, g, groups, Filter.shape)}


def _conv_grad_infer(Input, Filter, **_):
    return {"Input@GRAD": Input, "Filter@GRAD": Filter}


def _channel_linear(transposed: bool):
    """Output channel m is filter row m ([M, C/g, kh, kw]) or, transposed ([C, M/g, kh, kw]),
    column m % (M/g) of the rows of group m // (M/g): what inference passes scale."""
    def inference(op):
        g = int(op.all_attrs().get("groups", 1) or 1)

        def scale_weight(w, a, out=None):
            if w.ndim != 4:
                return None
            if not transposed:
                return scaled_weight(w, a.reshape(-1, 1, 1, 1), out)
            c, mg = w.shape[:2]
            grouped = (g, c // g, mg, *w.shape[2:])
            return scaled_weight(w.reshape(grouped), a.reshape(g, 1, mg, 1, 1),
                                 None if out is None else out.reshape(grouped)
                                 ).reshape(w.shape)
        nhwc = op.all_attrs().get("data_format", "NCHW") == "NHWC"
        return ChannelLinear("Filter", "Output", -1 if nhwc else 1, scale_weight)
    return inference


for _t in ("conv2d", "depthwise_conv2d"):
    register_op(
        _t, inputs=["Input", "Filter"], outputs=["Output"], attrs=_CONV_ATTRS, traits=[OPAQUE],
        row_wise=RowWise(batch=("Input",), const=("Filter",)),
        infer_shape=_conv_infer, reference=_conv_ref, inference=_channel_linear(False),
        emit=Opaque(), layout=Layout(inputs=("Input",), outputs=("Output",)),
        grad=default_grad(f"{_t}_grad", fwd_inputs=("Input", "Filter"),
                          grad_outputs=("Output",), wrt=("Input", "Filter")),
        doc="Output = the 2-D convolution of Input with Filter [M, C/groups, KH, KW].")
    register_op(
        f"{_t}_grad", inputs=["Input", "Filter", "Output@GRAD"],
        outputs=["Input@GRAD?", "Filter@GRAD?"], attrs=_CONV_ATTRS, traits=[OPAQUE],
        infer_shape=_conv_grad_infer, reference=_conv_grad_ref,
        emit=Opaque(), grad=None,
        doc=f"Gradients of {_t} for Input and Filter.")


# ---- conv2d_transpose / depthwise_conv2d_transpose ----------------------------------------------
def _t_out(g: Geometry, axis: int, size: int, k: int, attrs) -> int:
    """A transposed convolution's output size along ``axis`` (-1 when unknown)."""
    if size < 0:
        return -1
    p0, p1, d = g.window(axis, size, k)
    s = g.strides[axis]
    base = (size - 1) * s - p0 - p1 + d * (k - 1) + 1
    out_size, out_pad = list(attrs["output_size"]), list(attrs["output_padding"])
    if out_size:
        if len(out_size) != 2:
            raise ShapeMismatch(f"{g.what}: expected output_size of 2 ints, got {out_size}")
        want = out_size[axis]
        if not base <= want < base + s:
            raise ShapeMismatch(f"{g.what}: output_size[{axis}] = {want} does not fit an input "
                                f"of size {size}: expected a value in [{base}, {base + s})")
        return want
    if out_pad:
        if len(out_pad) != 2:
            raise ShapeMismatch(f"{g.what}: expected output_padding of 2 ints, got {out_pad}")
        if not 0 <= out_pad[axis] < max(s, d):
            raise ShapeMismatch(f"{g.what}: output_padding[{axis}] = {out_pad[axis]}: expected "
                                f"a value in [0, max(stride, dilation)) = [0, {max(s, d)})")
        base += out_pad[axis]
    if base <= 0:
        raise ShapeMismatch(f"{g.what}: input size {size} along spatial axis {axis} gives an "
                            f"output size {base}: expected > 0")
    return base


def _convt_infer(Input, Filter, **attrs):
    op = "conv2d_transpose"
    g = _operands(Input, Filter, attrs, op)
    groups = attrs["groups"]
    cin, mg, kh, kw = Filter.shape
    c = g.channels(Input.shape)
    if groups < 1 or (cin >= 0 and cin % groups):
        raise ShapeMismatch(f"{op}: expected groups >= 1 dividing the Filter's {cin} input "
                            f"channels, got groups={groups}")
    if _known(c, cin) and c != cin:
        raise ShapeMismatch(f"{op}: Input has {c} channels, Filter {list(Filter.shape)} expects "
                            f"{cin}")
    h, w = g.spatial(Input.shape)
    m = mg * groups if mg >= 0 else -1
    return {"Output": Input.with_(shape=g.image(Input.shape[0], m, _t_out(g, 0, h, kh, attrs),
                                                 _t_out(g, 1, w, kw, attrs)))}


def _convt_geometry(attrs, what, in_shape, k_hw):
    g = _geometry(attrs, what)
    if g.algo == "SAME":
        h, w = g.spatial(in_shape)
        pt, pb, _ = g.window(0, h, k_hw[0])
        pl, pr, _ = g.window(1, w, k_hw[1])
        g = Geometry(strides=g.strides, paddings=[pt, pb, pl, pr], dilations=(1, 1),
                     data_format="NHWC" if g.nhwc else "NCHW", what=what)
    return g


def _convt_ref(Input, Filter, **attrs):
    meta = _convt_infer(VarMeta(Input.shape, Input.dtype), VarMeta(Filter.shape, Filter.dtype),
                        **attrs)["Output"]
    g = _convt_geometry(attrs, "conv2d_transpose", Input.shape, Filter.shape[2:])
    y = conv_t_ref(to_nchw(Input, g), Filter, g, attrs["groups"], g.spatial(meta.shape))
    return {"Output": from_nchw(y, g)}


def _convt_grad_ref(Input, Filter, **kw):
    attrs = {k: v for k, v in kw.items() if k != "Output@GRAD"}
    g = _convt_geometry(attrs, "conv2d_transpose_grad", Input.shape, Filter.shape[2:])
    x, dy = to_nchw(Input, g), to_nchw(kw["Output@GRAD"], g)
    groups = attrs["groups"]
    # Output = conv^T(Input): dInput = conv(dOutput), dFilter = conv's filter gradient with
    # dOutput as the image and Input as the output gradient
    dx = conv_ref(dy, Filter, g, groups, y_hw=x.shape[2:])
    dw = conv_w_ref(dy, x, g, groups, Filter.shape)
    return {"Input@GRAD": from_nchw(dx, g), "Filter@GRAD": dw}


def _t_out_src(ctx, g: Geometry, X: str, axis: int, k: int) -> str:
    size = image_dims(g, X)[2 + axis]
    s = g.strides[axis]
    out_size = list(ctx.attrs["output_size"])
    if out_size:
        return str(out_size[axis])
    p0, p1, d = g.src_window(axis, size, k)
    extra = list(ctx.attrs["output_padding"])
    pad = f" + {extra[axis]}" if extra else ""
    return f"(({size}) - 1) * {s} - {p0} - {p1} + {d} * {k - 1} + 1{pad}"


for _t in ("conv2d_transpose", "depthwise_conv2d_transpose"):
    register_op(
        _t, inputs=["Input", "Filter"], outputs=["Output"], attrs=_TRANSPOSE_ATTRS,
        row_wise=RowWise(batch=("Input",), const=("Filter",)),
        traits=[OPAQUE], infer_shape=_convt_infer, reference=_convt_ref,
        inference=_channel_linear(True),
        emit=Opaque(),
        grad=default_grad(f"{_t}_grad", fwd_inputs=("Input", "Filter"),
                          grad_outputs=("Output",), wrt=("Input", "Filter")),
        doc="Output = the transposed 2-D convolution of Input with Filter "
            "[C, M/groups, KH, KW] (the input gradient of a convolution).")
    register_op(
        f"{_t}_grad", inputs=["Input", "Filter", "Output@GRAD"],
        outputs=["Input@GRAD?", "Filter@GRAD?"], attrs=_TRANSPOSE_ATTRS, traits=[OPAQUE],
        infer_shape=_conv_grad_infer, reference=_convt_grad_ref,
        emit=Opaque(), grad=None,
        doc=f"Gradients of {_t} for Input and Filter.")
