"""The ONNX export rules (:func:`pdjit.io.onnx_export.to_onnx`), registered per op type.

Each rule ``rule(ex, op)`` writes the ONNX nodes of one pdjit op through the exporter ``ex``
(its ``inp``/``out_var``/``node``/``const``... helpers): ONNX's operator set is not pdjit's, so a
rule is written for the op types it registers for, with ``@onnx_rule(type, ...)`` beside it, as
a target's lowerings are. The exporter looks a rule up by the op's type (:data:`RULES`) and
names no op itself.

Semantics are the inference ones: ``dropout`` scales by ``1 - p`` (``downgrade_in_infer``) or
passes through (``upscale_in_train``), and ``batch_norm`` normalises with its moving statistics
whatever ``is_test`` says. Windows follow pdjit's op definitions (``pdjit.ops.conv.Geometry``):
``SAME`` padding is computed from the input's (known) spatial size, dilations counting as 1.
An ``avg`` ``pool2d`` whose windows ONNX places or counts differently (``ceil_mode``; or
``exclusive=False`` with unequal paddings) is written as a zero padding, an unpadded
AveragePool and a constant divisor map. ``layer_norm`` exports ``Y`` only (its
``Mean``/``Variance`` outputs are not produced, and reading them is an error).
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework import dtypes
from pdjit.io.onnx_export import _COPY, _onnx_type
from pdjit.ops.conv import Geometry
from pdjit.ops.shape import unsqueeze_shape

#: op type -> rule
RULES: dict = {}


def onnx_rule(*types: str):
    """Register the decorated function as the ONNX rule of op ``types``."""
    def register(fn):
        for t in types:
            if t in RULES:
                raise ValueError(f"onnx export: op {t!r} has two rules")
            RULES[t] = fn
        return fn
    return register


# ==== conversions ===============================================================================
def _unary(onnx_type, **fixed):
    def convert(ex, op):
        ex.node(onnx_type, [ex.inp(op, "X")], out=ex.out_var(op), **fixed)
    return convert


def _attr(op, name, default):
    return op.attr(name) if op.has_attr(name) else default


def _scalar(ex, op, value, slot="X", hint="c"):
    """A 0-d initializer of ``value`` in the dtype of ``op``'s input ``slot``."""
    return ex.const(value, ex.dtype(ex.in_var(op, slot)), hint)


# -- matrix products ------------------------------------------------------------------------------
@onnx_rule("mul")
def _mul(ex, op):
    xv, yv = ex.in_var(op, "X"), ex.in_var(op, "Y")
    xs, ys = ex.shape(xv), ex.shape(yv)
    xn, yn = int(op.attr("x_num_col_dims")), int(op.attr("y_num_col_dims"))
    x = ex.inp(op, "X")
    x2 = x if (len(xs) == 2 and xn == 1) else ex.node("Flatten", [x], axis=xn)
    w = ex.param(yv)
    if w is not None:
        y2 = ex.value(yv) if w.ndim == 2 and yn == 1 else ex.derived_param(
            yv, w.reshape(int(np.prod(w.shape[:yn])), -1), "2d")
    else:
        y = ex.inp(op, "Y")
        y2 = y if (len(ys) == 2 and yn == 1) else ex.node("Flatten", [y], axis=yn)
    out = ex.out_var(op)
    if xn == 1 and len(ys) - yn == 1:
        ex.node("MatMul", [x2, y2], out=out)
        return
    m = ex.node("MatMul", [x2, y2])
    parts = [_COPY if (i == 0 and xn == 1) else ex.dims(x, xs, i, i + 1) for i in range(xn)]
    parts += [ex.dims(ex.value(yv), ys, j, j + 1) for j in range(yn, len(ys))]
    ex.reshape(m, parts, out=out)


def _matmul_operand(ex, op, slot, flag):
    var = ex.in_var(op, slot)
    rank = len(ex.shape(var))
    if not flag or rank < 2:  # a vector ignores its transpose flag
        return ex.inp(op, slot)
    w = ex.param(var)
    if w is not None:
        return ex.derived_param(var, np.swapaxes(w, -1, -2), "T")
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return ex.transpose(ex.inp(op, slot), perm)


def _matmul_with(tx_attr, ty_attr, alpha_attr=None):
    def convert(ex, op):
        x = _matmul_operand(ex, op, "X", bool(_attr(op, tx_attr, False)))
        y = _matmul_operand(ex, op, "Y", bool(_attr(op, ty_attr, False)))
        alpha = float(_attr(op, alpha_attr, 1.0)) if alpha_attr else 1.0
        out = ex.out_var(op)
        if alpha == 1.0:
            ex.node("MatMul", [x, y], out=out)
        else:
            ex.node("Mul", [ex.node("MatMul", [x, y]), _scalar(ex, op, alpha, hint="alpha")],
                    out=out)
    return convert


# -- elementwise with Fluid's axis --------------------------------------------------------------
def _aligned(ex, op, slot, other_slot, axis):
    """``op``'s operand ``slot`` with trailing 1-dims added so that NumPy broadcasting applies
    Fluid's ``axis`` rule (the lower-rank operand's dims start at ``axis``)."""
    var, other = ex.in_var(op, slot), ex.in_var(op, other_slot)
    rank, big = len(ex.shape(var)), len(ex.shape(other))
    if axis == -1 or rank >= big:
        return ex.inp(op, slot)
    if not 0 <= axis <= big - rank:
        raise ValueError(f"{ex.where()}: axis={axis} is out of range for operands of rank "
                         f"{big} and {rank}: expected -1 or 0..{big - rank}")
    trailing = big - rank - axis
    if trailing == 0:
        return ex.inp(op, slot)
    w = ex.param(var)
    if w is not None:
        return ex.derived_param(var, w.reshape(w.shape + (1,) * trailing), f"axis{axis}")
    return ex.node("Unsqueeze", [ex.inp(op, slot), ex.ints(range(rank, rank + trailing),
                                                          "axes")])


def _binary(onnx_type):
    def convert(ex, op):
        axis = int(_attr(op, "axis", -1))
        x = _aligned(ex, op, "X", "Y", axis)
        y = _aligned(ex, op, "Y", "X", axis)
        ex.node(onnx_type, [x, y], out=ex.out_var(op))
    return convert


# -- activations ----------------------------------------------------------------------------------
@onnx_rule("relu6")
def _relu6(ex, op):
    t = float(_attr(op, "threshold", 6.0))
    ex.node("Clip", [ex.inp(op, "X"), _scalar(ex, op, 0.0, hint="lo"),
                     _scalar(ex, op, t, hint="hi")], out=ex.out_var(op))


@onnx_rule("hard_swish")
def _hard_swish(ex, op):
    t, s, o = (float(_attr(op, k, d)) for k, d in (("threshold", 6.0), ("scale", 6.0),
                                                     ("offset", 3.0)))
    x, out = ex.inp(op, "X"), ex.out_var(op)
    if (t, s, o) == (6.0, 6.0, 3.0):
        ex.node("HardSwish", [x], out=out)
        return
    gate = ex.node("Clip", [ex.node("Add", [x, _scalar(ex, op, o, hint="offset")]),
                            _scalar(ex, op, 0.0, hint="lo"), _scalar(ex, op, t, hint="hi")])
    ex.node("Div", [ex.node("Mul", [x, gate]), _scalar(ex, op, s, hint="scale")], out=out)


@onnx_rule("hard_sigmoid")
def _hard_sigmoid(ex, op):
    ex.node("HardSigmoid", [ex.inp(op, "X")], out=ex.out_var(op),
            alpha=float(_attr(op, "slope", 0.2)), beta=float(_attr(op, "offset", 0.5)))


@onnx_rule("leaky_relu")
def _leaky_relu(ex, op):
    ex.node("LeakyRelu", [ex.inp(op, "X")], out=ex.out_var(op),
            alpha=float(_attr(op, "alpha", 0.02)))


@onnx_rule("elu")
def _elu(ex, op):
    ex.node("Elu", [ex.inp(op, "X")], out=ex.out_var(op), alpha=float(_attr(op, "alpha", 1.0)))


@onnx_rule("selu")
def _selu(ex, op):
    ex.node("Selu", [ex.inp(op, "X")], out=ex.out_var(op),
            alpha=float(_attr(op, "alpha", 1.6732632423543772)),
            gamma=float(_attr(op, "scale", 1.0507009873554805)))


@onnx_rule("swish")
def _swish(ex, op, beta=None):
    x = ex.inp(op, "X")
    beta = float(_attr(op, "beta", 1.0)) if beta is None else beta
    z = x if beta == 1.0 else ex.node("Mul", [x, _scalar(ex, op, beta, hint="beta")])
    ex.node("Mul", [x, ex.node("Sigmoid", [z])], out=ex.out_var(op))


@onnx_rule("gelu")
def _gelu(ex, op):
    x, out = ex.inp(op, "X"), ex.out_var(op)
    approximate = bool(_attr(op, "approximate", False))
    if ex.opset >= 20:
        ex.node("Gelu", [x], out=out, approximate="tanh" if approximate else "none")
        return
    c = lambda v, h: _scalar(ex, op, v, hint=h)  # noqa: E731
    if approximate:  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        cube = ex.node("Mul", [ex.node("Mul", [x, x]), x])
        inner = ex.node("Add", [x, ex.node("Mul", [cube, c(0.044715, "k")])])
        t = ex.node("Tanh", [ex.node("Mul", [inner, c(math.sqrt(2.0 / math.pi), "s")])])
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        t = ex.node("Erf", [ex.node("Mul", [x, c(1.0 / math.sqrt(2.0), "s")])])
    half_x = ex.node("Mul", [x, c(0.5, "half")])
    ex.node("Mul", [half_x, ex.node("Add", [t, c(1.0, "one")])], out=out)


@onnx_rule("softmax")
def _softmax(ex, op):
    ex.node("Softmax", [ex.inp(op, "X")], out=ex.out_var(op), axis=int(_attr(op, "axis", -1)))


@onnx_rule("scale")
def _scale(ex, op):
    x, out = ex.inp(op, "X"), ex.out_var(op)
    s = ex.inp(op, "ScaleTensor") if ex.has(op, "ScaleTensor") else float(op.attr("scale"))
    b = ex.inp(op, "BiasTensor") if ex.has(op, "BiasTensor") else float(op.attr("bias"))
    as_input = lambda v, h: v if isinstance(v, str) else _scalar(ex, op, v, hint=h)  # noqa: E731
    steps = []
    if bool(_attr(op, "bias_after_scale", True)):
        if s != 1.0:
            steps.append(("Mul", as_input(s, "scale")))
        if b != 0.0:
            steps.append(("Add", as_input(b, "bias")))
    else:
        if b != 0.0:
            steps.append(("Add", as_input(b, "bias")))
        if s != 1.0:
            steps.append(("Mul", as_input(s, "scale")))
    if not steps:
        ex.alias(out, x)
        return
    for i, (kind, operand) in enumerate(steps):
        x = ex.node(kind, [x, operand], out=out if i == len(steps) - 1 else None)


@onnx_rule("dropout")
def _dropout(ex, op):
    x, out = ex.inp(op, "X"), ex.out_var(op)
    impl = _attr(op, "dropout_implementation", "downgrade_in_infer")
    p = float(_attr(op, "dropout_prob", 0.5))
    if impl == "upscale_in_train" or p == 0.0:
        ex.alias(out, x)
    elif impl == "downgrade_in_infer":
        ex.node("Mul", [x, _scalar(ex, op, 1.0 - p, hint="keep")], out=out)
    else:
        raise ex.unsupported(f"dropout_implementation={impl!r}")


@onnx_rule("cast")
def _cast(ex, op):
    to = np.dtype(dtypes.to_numpy(int(op.attr("out_dtype"))))
    ex.node("Cast", [ex.inp(op, "X")], out=ex.out_var(op),
            to=_onnx_type(ex.helper, to, ex.out_var(op)))


# -- convolution and pooling ----------------------------------------------------------------------
def _geometry(op) -> Geometry:
    """The window attributes of a convolution or pooling op, as pdjit's ops read them."""
    return Geometry(strides=list(_attr(op, "strides", [1, 1])),
                    paddings=list(_attr(op, "paddings", [0, 0])),
                    padding_algorithm=_attr(op, "padding_algorithm", "EXPLICIT") or "EXPLICIT",
                    dilations=list(_attr(op, "dilations", [1, 1])),
                    data_format=_layout(op, "data_format"), what=op.type)


def _layout(op, attr) -> str:
    fmt = _attr(op, attr, "NCHW")
    return "NCHW" if fmt == "AnyLayout" else fmt


def _nchw_node(ex, onnx_type, x, extra, nhwc, out, **attrs):
    """``onnx_type`` applied to image ``x`` (NCHW, transposed there and back when ``nhwc``)."""
    if not nhwc:
        return ex.node(onnx_type, [x] + extra, out=out, **attrs)
    y = ex.node(onnx_type, [ex.transpose(x, [0, 3, 1, 2])] + extra, **attrs)
    return ex.transpose(y, [0, 2, 3, 1], out=out)


def _window_attrs(g: Geometry, hw, k) -> dict:
    """ONNX ``pads``/``dilations`` (or ``auto_pad``) of window ``k`` over spatial size ``hw``."""
    if g.algo == "SAME" and min(hw) < 0:
        return {"auto_pad": "SAME_UPPER", "dilations": [1, 1]}
    (t, b, d0), (left, r, d1) = (g.window(0, hw[0], k[0]), g.window(1, hw[1], k[1]))
    return {"pads": [t, left, b, r], "dilations": [d0, d1]}


@onnx_rule("conv2d", "depthwise_conv2d")
def _conv(ex, op):
    xv, wv = ex.in_var(op, "Input"), ex.in_var(op, "Filter")
    g = _geometry(op)
    xs, ks = ex.shape(xv), ex.shape(wv)
    if len(xs) != 4 or len(ks) != 4:
        raise ex.unsupported(f"a convolution of rank {len(xs)} (Input {list(xs)})")
    k = ks[2:]
    _nchw_node(ex, "Conv", ex.inp(op, "Input"), [ex.inp(op, "Filter")], g.nhwc,
               ex.out_var(op, "Output"), kernel_shape=list(k), strides=list(g.strides),
               group=int(_attr(op, "groups", 1)), **_window_attrs(g, g.spatial(xs), k))


@onnx_rule("conv2d_transpose", "depthwise_conv2d_transpose")
def _conv_transpose(ex, op):
    xv, wv = ex.in_var(op, "Input"), ex.in_var(op, "Filter")
    g = _geometry(op)
    xs, ks = ex.shape(xv), ex.shape(wv)
    if len(xs) != 4 or len(ks) != 4:
        raise ex.unsupported(f"a transposed convolution of rank {len(xs)} (Input {list(xs)})")
    k, hw = ks[2:], g.spatial(xs)
    out_size = list(_attr(op, "output_size", []))
    out_pad = list(_attr(op, "output_padding", []))
    if min(hw) < 0 and (g.algo == "SAME" or out_size):
        raise ex.unsupported(f"padding_algorithm={g.algo!r} / output_size={out_size} with "
                             f"unknown spatial dims {list(hw)}")
    pads, dil, extra = [0, 0, 0, 0], [1, 1], [0, 0]
    for axis in range(2):
        p0, p1, d = g.window(axis, hw[axis], k[axis])
        pads[axis], pads[axis + 2], dil[axis] = p0, p1, d
        if out_size:
            base = (hw[axis] - 1) * g.strides[axis] - p0 - p1 + d * (k[axis] - 1) + 1
            extra[axis] = int(out_size[axis]) - base
        elif out_pad:
            extra[axis] = int(out_pad[axis])
    attrs = dict(kernel_shape=list(k), strides=list(g.strides), pads=pads, dilations=dil,
                 group=int(_attr(op, "groups", 1)))
    if any(extra):
        attrs["output_padding"] = extra
    _nchw_node(ex, "ConvTranspose", ex.inp(op, "Input"), [ex.inp(op, "Filter")], g.nhwc,
               ex.out_var(op, "Output"), **attrs)


@onnx_rule("pool2d")
def _pool2d(ex, op):
    xv = ex.in_var(op, "X")
    xs = ex.shape(xv)
    if len(xs) != 4:
        raise ex.unsupported(f"pool2d of rank {len(xs)}")
    is_max = _attr(op, "pooling_type", "max") == "max"
    g = _geometry(op)
    hw, ksize = g.spatial(xs), [int(v) for v in op.attr("ksize")]
    x, out = ex.inp(op, "X"), ex.out_var(op)
    global_ = bool(_attr(op, "global_pooling", False))
    adaptive = bool(_attr(op, "adaptive", False)) and not global_
    if adaptive and ksize == [1, 1]:
        global_ = True
    if global_:
        _nchw_node(ex, "GlobalMaxPool" if is_max else "GlobalAveragePool", x, [], g.nhwc, out)
        return
    attrs = {}
    ceil, exclusive = bool(_attr(op, "ceil_mode", False)), bool(_attr(op, "exclusive", True))
    if adaptive:
        if min(hw) < 0 or hw[0] % ksize[0] or hw[1] % ksize[1]:
            raise ex.unsupported(f"adaptive pooling of a {list(hw)} image to {ksize} (the "
                                 f"output must divide the known input)")
        k = [hw[0] // ksize[0], hw[1] // ksize[1]]
        attrs.update(kernel_shape=k, strides=k, pads=[0, 0, 0, 0])
    else:
        win = _window_attrs(g, hw, ksize)
        pads = win.get("pads", [0, 0, 0, 0])
        if not is_max and (ceil or (not exclusive and pads[:2] != pads[2:])):
            _avg_pool_exact(ex, g, x, hw, ksize, exclusive, ceil, out)
            return
        win.pop("dilations")
        attrs.update(kernel_shape=ksize, strides=list(g.strides), **win)
        if ceil:
            attrs["ceil_mode"] = 1
    if not is_max:
        attrs["count_include_pad"] = 0 if (adaptive or exclusive) else 1
    _nchw_node(ex, "MaxPool" if is_max else "AveragePool", x, [], g.nhwc, out, **attrs)


def _avg_pool_exact(ex, g: Geometry, x, hw, ksize, exclusive, ceil, out):
    """Average pooling with Paddle's windows where ONNX's differ (ceil_mode: ONNX drops a last
    window that starts in the padding; exclusive=False with unequal paddings: Paddle clips a
    window at the padding *before*): the image zero-padded to cover every window, an
    AveragePool without padding (so each window divides by its full size), and a constant map
    turning that into Paddle's divisor (the count read in the image, or the clipped length)."""
    if min(hw) < 0:
        raise ex.unsupported(f"an avg pool2d with ceil_mode or unequal paddings over unknown "
                             f"spatial dims {list(hw)}")
    begin, end, factors = [], [], []
    for axis in range(2):
        size, k, s = hw[axis], ksize[axis], g.strides[axis]
        p0, p1, _ = g.window(axis, size, k)
        n_out = (size - k + p0 + p1 + (s - 1 if ceil else 0)) // s + 1
        begin.append(p0)
        end.append(max((n_out - 1) * s + k - size - p0, 0))
        a = np.arange(n_out) * s - p0  # window starts; a window ends k later, not past size + p0
        b = np.minimum(a + k, size + p0)
        divisor = np.minimum(b, size) - np.maximum(a, 0) if exclusive else b - a
        with np.errstate(divide="ignore"):
            factors.append(k / divisor.astype(np.float64))  # 0 read: 0 / 0, as Paddle gives
    dt = ex.dtype(ex.in_var(ex.op, "X"))
    x = ex.transpose(x, [0, 3, 1, 2]) if g.nhwc else x
    padded = ex.node("Pad", [x, ex.ints([0, 0] + begin + [0, 0] + end, "pads")], mode="constant")
    mean = ex.node("AveragePool", [padded], kernel_shape=list(ksize), strides=list(g.strides))
    scale = ex.const(np.outer(factors[0], factors[1]), dt, "divisor")
    if g.nhwc:
        ex.transpose(ex.node("Mul", [mean, scale]), [0, 2, 3, 1], out=out)
    else:
        ex.node("Mul", [mean, scale], out=out)


# -- normalisation --------------------------------------------------------------------------------
@onnx_rule("batch_norm")
def _batch_norm(ex, op):
    xv = ex.in_var(op, "X")
    xs = ex.shape(xv)
    nhwc = _layout(op, "data_layout") == "NHWC" and len(xs) > 2
    c = ex.shape(ex.in_var(op, "Mean"))[0]
    mt = ex.dtype(ex.in_var(op, "Mean"))
    scale = ex.inp(op, "Scale") if ex.has(op, "Scale") else ex.const(np.ones(c), mt, "ones")
    bias = ex.inp(op, "Bias") if ex.has(op, "Bias") else ex.const(np.zeros(c), mt, "zeros")
    x = ex.inp(op, "X")
    if nhwc:
        x = ex.transpose(x, [0, len(xs) - 1] + list(range(1, len(xs) - 1)))
    out = ex.out_var(op, "Y")
    y = ex.node("BatchNormalization", [x, scale, bias, ex.inp(op, "Mean"),
                                       ex.inp(op, "Variance")], out=None if nhwc else out,
                epsilon=float(_attr(op, "epsilon", 1e-5)))
    if nhwc:
        ex.transpose(y, [0] + list(range(2, len(xs))) + [1], out=out)


@onnx_rule("layer_norm")
def _layer_norm(ex, op):
    if ex.opset < 17:
        raise ex.unsupported(f"layer_norm at opset {ex.opset} (LayerNormalization needs 17)")
    xv = ex.in_var(op, "X")
    xs, dt = ex.shape(xv), ex.dtype(xv)
    begin = int(_attr(op, "begin_norm_axis", 1))
    norm_shape = xs[begin:]
    if any(d < 0 for d in norm_shape):
        raise ex.unsupported(f"layer_norm over unknown dims {list(norm_shape)}")

    def affine(slot, fill):
        if not ex.has(op, slot):
            return ex.const(np.full(norm_shape, fill), dt, slot.lower())
        var = ex.in_var(op, slot)
        w = ex.param(var)
        if w is not None:
            return ex.derived_param(var, w.reshape(norm_shape), "nd") \
                if w.shape != norm_shape else ex.value(var)
        return ex.reshape(ex.inp(op, slot), list(norm_shape))

    ex.node("LayerNormalization", [ex.inp(op, "X"), affine("Scale", 1.0), affine("Bias", 0.0)],
            out=ex.out_var(op, "Y"), axis=begin, epsilon=float(_attr(op, "epsilon", 1e-5)))


# -- shapes ---------------------------------------------------------------------------------------
@onnx_rule("flatten_contiguous_range")
def _flatten_range(ex, op):
    xv = ex.in_var(op, "X")
    xs = ex.shape(xv)
    r = len(xs)
    s, e = int(op.attr("start_axis")), int(op.attr("stop_axis"))
    s, e = (s + r if s < 0 else s), (e + r if e < 0 else e)
    x, out = ex.inp(op, "X"), ex.out_var(op)
    if r == 0 or not 0 <= s <= e < r:
        raise ValueError(f"{ex.where()}: start_axis={op.attr('start_axis')}, stop_axis="
                         f"{op.attr('stop_axis')} do not fit X of shape {list(xs)}")
    if s == 1 and e == r - 1:
        ex.node("Flatten", [x], out=out, axis=1)
        return
    parts = [_COPY if xs[i] < 0 else xs[i] for i in range(s)]
    parts.append(ex.dims(x, xs, s, e + 1))
    parts += [ex.dims(x, xs, i, i + 1) for i in range(e + 1, r)]
    ex.reshape(x, parts, out=out)


@onnx_rule("flatten2")
def _flatten2(ex, op):
    ex.node("Flatten", [ex.inp(op, "X")], out=ex.out_var(op), axis=int(_attr(op, "axis", 1)))


@onnx_rule("reshape2", "reshape")
def _reshape2(ex, op):
    if ex.has(op, "Shape") or ex.has(op, "ShapeTensor"):
        raise ex.unsupported("a reshape by a Shape/ShapeTensor input")
    shape = [int(d) for d in op.attr("shape")]
    ex.node("Reshape", [ex.inp(op, "X"), ex.ints(shape, "shape")], out=ex.out_var(op))


@onnx_rule("transpose2", "transpose")
def _transpose2(ex, op):
    ex.transpose(ex.inp(op, "X"), [int(a) for a in op.attr("axis")], out=ex.out_var(op))


@onnx_rule("concat")
def _concat(ex, op):
    if ex.has(op, "AxisTensor"):
        raise ex.unsupported("concat with an AxisTensor input")
    ex.node("Concat", [ex.value(n) for n in op.input("X")], out=ex.out_var(op),
            axis=int(_attr(op, "axis", 0)))


@onnx_rule("split")
def _split(ex, op):
    """``Split`` with the pieces' sizes as an input (the sizes known when exporting: ``num``
    equal pieces or ``sections``, one -1 taking the rest)."""
    if ex.has(op, "AxisTensor") or ex.has(op, "SectionsTensorList"):
        raise ex.unsupported("split with its axis or sections given as tensors")
    xs = ex.shape(ex.in_var(op, "X"))
    axis = int(_attr(op, "axis", 0))
    axis = axis + len(xs) if axis < 0 else axis
    outs = op.output("Out")
    sizes = [ex.shape(n)[axis] for n in outs]
    if any(s < 0 for s in sizes):
        raise ex.unsupported(f"split of an axis of unknown size into {len(outs)} pieces")
    ex.node_n("Split", [ex.inp(op, "X"), ex.ints(sizes, "split")], outs, axis=axis)


@onnx_rule("squeeze2")
def _squeeze2(ex, op):
    xs = ex.shape(ex.in_var(op, "X"))
    r = len(xs)
    named = {int(a) + r if int(a) < 0 else int(a) for a in _attr(op, "axes", [])}
    axes = sorted(i for i in (named or range(r)) if xs[i] == 1 or (named and xs[i] < 0))
    x, out = ex.inp(op, "X"), ex.out_var(op)
    if not axes:
        ex.alias(out, x)
    else:
        ex.node("Squeeze", [x, ex.ints(axes, "axes")], out=out)


@onnx_rule("unsqueeze2")
def _unsqueeze2(ex, op):
    if ex.has(op, "AxesTensor") or ex.has(op, "AxesTensorList"):
        raise ex.unsupported("unsqueeze2 with axes given as tensors")
    r = len(ex.shape(ex.in_var(op, "X")))
    marks = tuple(range(2, r + 2))  # stand-ins for X's dims (never 1)
    placed = unsqueeze_shape(marks, [int(a) for a in op.attr("axes")])
    axes = [i for i, d in enumerate(placed) if d == 1]
    ex.node("Unsqueeze", [ex.inp(op, "X"), ex.ints(axes, "axes")], out=ex.out_var(op))


@onnx_rule("fill_constant")
def _fill_constant(ex, op):
    dt = np.dtype(dtypes.to_numpy(int(op.attr("dtype"))))
    str_value = _attr(op, "str_value", "")
    value = np.asarray(float(str_value) if str_value else op.attr("value")).astype(dt)
    out = ex.out_var(op)
    if ex.has(op, "ShapeTensor"):
        shape = ex.node("Cast", [ex.inp(op, "ShapeTensor")], to=_onnx_type(ex.helper, np.dtype(
            np.int64), "ShapeTensor"))
    elif ex.has(op, "ShapeTensorList"):
        i64 = _onnx_type(ex.helper, np.dtype(np.int64), "ShapeTensorList")
        one = ex.ints([1], "one")
        shape = ex.node("Concat", [ex.node("Reshape", [ex.node("Cast", [ex.value(n)], to=i64),
                                                       one])
                                   for n in op.input("ShapeTensorList")], axis=0)
    else:
        shape = None
    if ex.has(op, "ValueTensor"):
        v = ex.node("Cast", [ex.inp(op, "ValueTensor")], to=_onnx_type(ex.helper, dt, out))
        v = ex.node("Reshape", [v, ex.ints([], "scalar")])
        target = shape if shape is not None else ex.ints([int(d) for d in op.attr("shape")])
        ex.node("Expand", [v, target], out=out)
        return
    if shape is not None:
        ex.node("ConstantOfShape", [shape], out=out,
                value=ex.numpy_helper.from_array(value.reshape(1)))
        return
    dims = [int(d) for d in op.attr("shape")]
    if any(d < 0 for d in dims):
        raise ex.unsupported(f"fill_constant of unknown shape {dims}")
    name = ex.define(out)
    ex.inits.append(ex.numpy_helper.from_array(np.full(dims, value, dt), name))


@onnx_rule("fill_constant_batch_size_like")
def _fill_constant_batch_size_like(ex, op):
    """``shape`` with dim ``output_dim_idx`` taken from Input's dim ``input_dim_idx`` (read at
    run time: a Shape slice), filled with ``value``."""
    dt = np.dtype(dtypes.to_numpy(int(op.attr("dtype"))))
    str_value = _attr(op, "str_value", "")
    value = np.asarray(float(str_value) if str_value else op.attr("value")).astype(dt)
    dims = [int(d) for d in op.attr("shape")]
    r = len(ex.shape(ex.in_var(op, "Input")))
    i, o = int(_attr(op, "input_dim_idx", 0)), int(_attr(op, "output_dim_idx", 0))
    if not dims or not -r <= i < r or not -len(dims) <= o < len(dims):
        raise ValueError(f"{ex.where()}: input_dim_idx={i}, output_dim_idx={o} do not fit "
                         f"Input of rank {r} and shape {dims}")
    i, o = i % r, o % len(dims)
    if any(d < 0 for k, d in enumerate(dims) if k != o):
        raise ex.unsupported(f"fill_constant_batch_size_like of shape {dims} (a -1 outside "
                             f"output_dim_idx {o})")
    batch = ex.node("Shape", [ex.inp(op, "Input")], start=i, end=i + 1)
    parts = [ex.ints(dims[:o], "head")] if o > 0 else []
    parts.append(batch)
    if o + 1 < len(dims):
        parts.append(ex.ints(dims[o + 1:], "tail"))
    shape = parts[0] if len(parts) == 1 else ex.node("Concat", parts, axis=0)
    ex.node("ConstantOfShape", [shape], out=ex.out_var(op),
            value=ex.numpy_helper.from_array(value.reshape(1)))


def _reduce(onnx_type):
    def convert(ex, op):
        xv, out = ex.in_var(op, "X"), ex.out_var(op)
        rank = len(ex.shape(xv))
        dims = [int(d) + rank if int(d) < 0 else int(d) for d in _attr(op, "dim", [])]
        if bool(_attr(op, "reduce_all", False)) or not dims or len(set(dims)) >= rank:
            dims = list(range(rank))
        keep = int(bool(_attr(op, "keep_dim", False)))
        same_type = ex.dtype(out) == ex.dtype(xv)
        target = out if same_type else None
        if onnx_type == "ReduceSum" or ex.opset >= 18:
            y = ex.node(onnx_type, [ex.inp(op, "X"), ex.ints(dims, "axes")], out=target,
                        keepdims=keep)
        else:
            y = ex.node(onnx_type, [ex.inp(op, "X")], out=target, axes=dims, keepdims=keep)
        if not same_type:
            ex.node("Cast", [y], out=out, to=_onnx_type(ex.helper, ex.dtype(out), out))
    return convert


@onnx_rule("shape")
def _shape(ex, op):
    s = ex.node("Shape", [ex.inp(op, "Input")])
    ex.node("Cast", [s], out=ex.out_var(op), to=_onnx_type(ex.helper, np.dtype(np.int32), "Out"))


@onnx_rule("slice")
def _slice(ex, op):
    if any(ex.has(op, s) for s in ("StartsTensor", "EndsTensor", "StartsTensorList",
                                   "EndsTensorList")):
        raise ex.unsupported("slice with tensor bounds")
    x, out = ex.inp(op, "Input"), ex.out_var(op)
    axes = [int(a) for a in op.attr("axes")]
    big = np.iinfo(np.int64).max
    clip = lambda v: max(min(int(v), big), -big)  # noqa: E731
    sliced = ex.node("Slice", [x, ex.ints([clip(v) for v in op.attr("starts")], "starts"),
                               ex.ints([clip(v) for v in op.attr("ends")], "ends"),
                               ex.ints(axes, "axes")])
    dec = [int(a) for a in _attr(op, "decrease_axis", [])]
    if dec:
        r = len(ex.shape(ex.in_var(op, "Input")))
        ex.node("Squeeze", [sliced, ex.ints(sorted(a + r if a < 0 else a for a in dec),
                                            "axes")], out=out)
    else:
        ex.alias(out, sliced)


# -- recurrent networks ---------------------------------------------------------------------------
# Paddle's gate blocks (rows of its weights) in ONNX's order: LSTM i, f, g, o -> i, o, f, g;
# GRU r, z, c -> z, r, h (with linear_before_reset, as Paddle computes); simple RNNs one gate.
_RNN_MODES = {"LSTM": ("LSTM", [0, 3, 1, 2], 2), "GRU": ("GRU", [1, 0, 2], 1),
              "RNN_TANH": ("RNN", [0], 1), "RNN_RELU": ("RNN", [0], 1)}


@onnx_rule("rnn")
def _rnn(ex, op):
    """Paddle's ``rnn`` op (time-major, ``num_layers`` stacked, optionally bidirectional) as
    one ONNX LSTM/GRU/RNN node per layer. WeightList holds per cell (layer-major, then
    direction) ``w_ih, w_hh``, then per cell ``b_ih, b_hh``; they must be parameters."""
    mode = _attr(op, "mode", "LSTM")
    if mode not in _RNN_MODES:
        raise ex.unsupported(f"rnn mode {mode!r}")
    if ex.has(op, "SequenceLength"):
        raise ex.unsupported("rnn with a SequenceLength input")
    onnx_type, order, n_states = _RNN_MODES[mode]
    ndir = 2 if bool(_attr(op, "is_bidirec", False)) else 1
    layers, hidden = int(op.attr("num_layers")), int(op.attr("hidden_size"))
    ncell, wl = layers * ndir, op.input("WeightList")
    if len(wl) != 4 * ncell:
        raise ValueError(f"{ex.where()}: expected {4 * ncell} tensors in WeightList "
                         f"({layers} layers x {ndir} directions x 4), got {len(wl)}")
    arrays = [ex.param(n) for n in wl]
    if any(a is None for a in arrays):
        raise ex.unsupported("an rnn whose weights are not parameters")
    dt = ex.dtype(ex.in_var(op, "Input"))

    def gates(a):  # rows regrouped in ONNX's gate order
        blocks = np.split(np.asarray(a, dt), len(order), axis=0)
        return np.concatenate([blocks[g] for g in order], axis=0)

    pre = [ex.value(n) for n in op.input("PreState")]
    if len(pre) != n_states:
        raise ValueError(f"{ex.where()}: mode {mode} expects {n_states} PreState tensors, got "
                         f"{len(pre)}")
    state_vars = op.output("State")
    x = ex.inp(op, "Input")
    finals = [[] for _ in range(n_states)]
    for layer in range(layers):
        cells = range(layer * ndir, (layer + 1) * ndir)
        w = np.stack([gates(arrays[2 * c]) for c in cells])
        r = np.stack([gates(arrays[2 * c + 1]) for c in cells])
        b = np.stack([np.concatenate([gates(arrays[2 * ncell + 2 * c]),
                                      gates(arrays[2 * ncell + 2 * c + 1])]) for c in cells])
        names = [ex.derived_param(wl[2 * cells[0]], arr, f"onnx_{k}")
                 for k, arr in (("W", w), ("R", r), ("B", b))]
        bounds = [ex.ints([layer * ndir], "start"), ex.ints([(layer + 1) * ndir], "end"),
                  ex.ints([0], "axis")]
        init = [ex.node("Slice", [s] + bounds) for s in pre]
        attrs = dict(hidden_size=hidden, direction="bidirectional" if ndir == 2 else "forward")
        if onnx_type == "GRU":
            attrs["linear_before_reset"] = 1
        elif onnx_type == "RNN":
            attrs["activations"] = ["Relu" if mode == "RNN_RELU" else "Tanh"] * ndir
        outs = ex.node_n(onnx_type, [x] + names + [""] + init, [None] * (1 + n_states), **attrs)
        y = ex.transpose(outs[0], [0, 2, 1, 3])  # [T, dirs, B, H] -> [T, B, dirs, H]
        last = layer == layers - 1
        x = ex.node("Reshape", [y, ex.ints([0, 0, ndir * hidden], "shape")],
                    out=ex.out_var(op) if last else None)
        for k in range(n_states):
            finals[k].append(outs[1 + k])
    for k, var in enumerate(state_vars[:n_states]):
        if len(finals[k]) == 1:
            ex.alias(var, finals[k][0])
        else:
            ex.node("Concat", finals[k], out=var, axis=0)


@onnx_rule("sum")
def _sum(ex, op):
    ex.node("Sum", [ex.value(n) for n in op.input("X")], out=ex.out_var(op))


# ---- the ops converted by a generic rule with fixed ONNX types ----
onnx_rule("matmul")(_matmul_with("transpose_X", "transpose_Y", "alpha"))
onnx_rule("matmul_v2")(_matmul_with("trans_x", "trans_y"))
onnx_rule("elementwise_add")(_binary("Add"))
onnx_rule("elementwise_sub")(_binary("Sub"))
onnx_rule("elementwise_mul")(_binary("Mul"))
onnx_rule("elementwise_div")(_binary("Div"))
onnx_rule("elementwise_max")(_binary("Max"))
onnx_rule("elementwise_min")(_binary("Min"))
onnx_rule("elementwise_pow")(_binary("Pow"))
onnx_rule("relu")(_unary("Relu"))
onnx_rule("sigmoid")(_unary("Sigmoid"))
onnx_rule("tanh")(_unary("Tanh"))
onnx_rule("exp")(_unary("Exp"))
onnx_rule("log")(_unary("Log"))
onnx_rule("sqrt")(_unary("Sqrt"))
onnx_rule("abs")(_unary("Abs"))
onnx_rule("floor")(_unary("Floor"))
onnx_rule("assign")(_unary("Identity"))
onnx_rule("silu")(lambda ex, op: _swish(ex, op, beta=1.0))
onnx_rule("reduce_sum")(_reduce("ReduceSum"))
onnx_rule("reduce_mean")(_reduce("ReduceMean"))
onnx_rule("reduce_max")(_reduce("ReduceMax"))
onnx_rule("reduce_min")(_reduce("ReduceMin"))
onnx_rule("reduce_prod")(_reduce("ReduceProd"))
