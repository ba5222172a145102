"""Image and shape ops: flatten_contiguous_range, flatten2, shape, pad, pad3d, the resize ops
(nearest_interp, bilinear_interp and their _v2 versions), affine_channel — with gradients.

Semantics follow PaddlePaddle 3.3.1's legacy ops, checked against it op by op while writing
(random shapes, sizes, scales, layouts and align options; the resize and padding results agreed
to the bit). What is worth knowing:

- ``flatten_contiguous_range`` merges dims ``start_axis..stop_axis``; ``flatten2`` makes a
  matrix ``[prod(dims[:axis]), prod(dims[axis:])]``. A 0-D input becomes ``[1]``. ``XShape``
  carries X's shape for the backward pass (``[0] + X.shape``, no data), as ``reshape2``'s does;
  Paddle's ``flatten2_grad`` also lists X.
- ``shape`` gives an input's dims as int32.
- ``pad`` pads every dim (``paddings`` = before/after pairs, first dim first) with
  ``pad_value``; ``pad3d`` pads D, H, W of a 5-D input (``paddings`` = left, right, top,
  bottom, front, back) in mode ``constant`` (``value``; negative paddings crop), ``reflect``
  (pads smaller than the dim), ``replicate`` or ``circular``; a ``Paddings`` tensor overrides
  the attribute. Float attributes are float32 in Paddle, so a float64 pad value is rounded to
  float32 first.
- The resize ops take their kernel from ``interp_method`` (``bilinear`` or ``nearest``; the op
  type does not decide it, and its default is ``bilinear`` for every one of them). The output
  size: ``SizeTensor`` (two 1-element tensors) wins, then ``OutSize``, then a scale (the
  ``Scale`` tensor: one value or two; else the ``scale`` attribute: two floats in the _v2 ops,
  one float > 0 in the old ones), then ``out_h``/``out_w``. A scale that does not decide the size
  (``OutSize`` given too) still sets the step between source coordinates: ``1/scale`` instead
  of ``in/out`` (without align_corners). The source coordinate of output pixel ``k`` is
  ``ratio * k`` (align_corners, or bilinear with ``align_mode`` 1) or ``ratio * (k + 0.5) -
  0.5`` clamped at 0 (bilinear with align_mode 0), with ratio ``(in-1)/(out-1)`` under
  align_corners; it is computed in float32 with Paddle's mix of float32 and float64 steps;
  nearest rounds it (align_corners) or truncates it. An unchanged size copies. Where Paddle
  would read past the image (an OutSize larger than the scale implies) the index is clamped.
  A single-float ``scale`` list in a _v2 op is refused (Paddle reads a second float that is not
  there). Build-time output dims that a tensor decides are unknown (-1).
- ``affine_channel``: ``Out = X * Scale[c] + Bias[c]`` along the channel axis (dim 1 for
  ``NCHW``; the last dim otherwise, ``AnyLayout`` being the op's default).

Every op runs natively: views and slicing in the driver (flatten, shape, pad), or the
lowerings of each target (pad3d, resize, affine_channel: ``codegen/<target>/lowerings/image.py``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    VIEW,
    Bool,
    ChannelAffine,
    Float,
    Floats,
    Int,
    Ints,
    Opaque,
    RowWise,
    Str,
    VarMeta,
    default_grad,
    register_op,
)
from pdjit.ops._common import INTS, check_dtype, int_values, norm_axis, prod_known, src_literal
from pdjit.ops.shape import (
    _grad_meta_from_xshape,
    _regrow,
    _shape_from_xshape,
    _view_grad_lower,
    _xshape,
    _xshape_line,
)

# dtypes the native kernels take (Numba has no float16 arithmetic)
_DATA = (np.dtype(np.float32), np.dtype(np.float64)) + INTS
_REAL = (np.dtype(np.float32), np.dtype(np.float64))


def _f32(v) -> float:
    """A float attribute as Paddle holds it (float32), as a Python float."""
    return float(np.float32(v))


# ---- flatten ----------------------------------------------------------------------------------
def _range_groups(rank, start_axis, stop_axis) -> list:
    """The dims of X each output dim of flatten_contiguous_range multiplies."""
    if rank == 0:
        return [[]]
    s, e = norm_axis(start_axis, rank, "start_axis"), norm_axis(stop_axis, rank, "stop_axis")
    if s > e:
        raise ShapeMismatch(f"flatten_contiguous_range: expected start_axis <= stop_axis, got "
                            f"{start_axis} (dim {s}) and {stop_axis} (dim {e})")
    return [[i] for i in range(s)] + [list(range(s, e + 1))] + [[i] for i in range(e + 1, rank)]


def _flatten2_groups(rank, axis) -> list:
    if not 0 <= axis <= rank:
        raise ShapeMismatch(f"flatten2: expected axis in 0..{rank} for X of rank {rank}, got "
                            f"{axis}")
    if rank == 0:
        return [[]]
    return [list(range(axis)), list(range(axis, rank))]


def _grouped(shape, groups) -> tuple:
    return tuple(prod_known(shape[i] for i in g) for g in groups)


def _flatten_op(name, groups_of, attrs, grad_inputs):
    def infer(X, **kw):
        out = _grouped(X.shape, groups_of(X.ndim, **kw))
        return {"Out": X.with_(shape=out), "XShape": X.with_(shape=(0,) + X.shape)}

    def ref(X, **kw):
        return {"Out": X.reshape(_grouped(X.shape, groups_of(X.ndim, **kw))),
                "XShape": _xshape(X)}

    def lower(ctx):
        X = ctx.inp("X")
        try:
            groups = groups_of(ctx.rank("X"), **ctx.attrs)
        except ShapeMismatch:
            return None  # an error the reference reports
        dims = [" * ".join(f"{X}.shape[{i}]" for i in g) or "1" for g in groups]
        return _xshape_line(ctx, X) + [f"{ctx.out('Out')} = {X}.reshape({ctx.tuple_src(dims)})"]

    register_op(
        name, inputs=["X"], outputs=["Out", "XShape~"], attrs=attrs, traits=[VIEW],
        infer_shape=infer, reference=ref, emit=Opaque(lower, host=True),
        grad=default_grad(f"{name}_grad", fwd_inputs=tuple(s.rstrip("?") for s in grad_inputs),
                          fwd_outputs=("XShape",)),
        doc=f"Out = X with contiguous dims merged ({name}).")
    register_op(
        f"{name}_grad", inputs=list(grad_inputs) + ["XShape", "Out@GRAD"], outputs=["X@GRAD?"],
        attrs=attrs, traits=[VIEW], infer_shape=_grad_meta_from_xshape,
        reference=lambda XShape, **kw: _regrow(_shape_from_xshape(XShape), **kw),
        emit=_view_grad_lower("XShape"), grad=None,
        doc=f"X@GRAD = Out@GRAD viewed with X's shape (from XShape); the gradient of {name}.")


_flatten_op("flatten_contiguous_range",
            lambda rank, *, start_axis, stop_axis, **_: _range_groups(rank, start_axis, stop_axis),
            {"start_axis": Int(REQUIRED, low=0, high=1),
             "stop_axis": Int(REQUIRED, low=-1, high=1)}, ())
# Paddle's flatten2_grad lists X as well (not needed: XShape carries its shape)
_flatten_op("flatten2", lambda rank, *, axis, **_: _flatten2_groups(rank, axis),
            {"axis": Int(1, low=0, high=1)}, ("X?",))


# ---- shape ------------------------------------------------------------------------------------
def _shape_lower(ctx):
    r, x = ctx.rank("Input"), ctx.inp("Input")
    out = ctx.out("Out", shape=f"({r},)")
    return [f"{out}[{i}] = {x}.shape[{i}]" for i in range(r)]


register_op(
    "shape", inputs=["Input"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=lambda Input: {"Out": VarMeta((Input.ndim,), np.int32)},
    reference=lambda Input: {"Out": np.array(np.shape(Input), np.int32)},
    emit=Opaque(_shape_lower, host=True), grad=None,
    doc="Out = the dims of Input, as int32.")


# ---- pad --------------------------------------------------------------------------------------
def _pad_pairs(rank, paddings) -> list:
    p = [int(v) for v in paddings]
    if len(p) != 2 * rank or any(v < 0 for v in p):
        raise ShapeMismatch(f"pad: expected paddings of 2 * rank = {2 * rank} non-negative ints "
                            f"(before and after each dim), got {p}")
    return [(p[2 * i], p[2 * i + 1]) for i in range(rank)]


def _pad_infer(X, *, paddings, **_):
    check_dtype(X, _DATA, "pad: X")
    pairs = _pad_pairs(X.ndim, paddings)
    return {"Out": X.with_(shape=tuple(d + a + b if d >= 0 else -1
                                       for d, (a, b) in zip(X.shape, pairs)))}


def _pad_ref(X, *, paddings, pad_value):
    value = np.asarray(_f32(pad_value)).astype(X.dtype)
    return {"Out": np.pad(X, _pad_pairs(X.ndim, paddings), constant_values=value)}


def _pad_lower(ctx):
    X, r = ctx.inp("X"), ctx.rank("X")
    try:
        pairs = _pad_pairs(r, ctx.attrs["paddings"])
    except ShapeMismatch:
        return None
    if r == 0:
        return None
    out = ctx.out("Out", shape=ctx.tuple_src(f"{X}.shape[{i}] + {a + b}"
                                            for i, (a, b) in enumerate(pairs)))
    inner = ", ".join(f"{a}:{a} + {X}.shape[{i}]" for i, (a, _) in enumerate(pairs))
    return [f"{out}[:] = {src_literal(_f32(ctx.attrs['pad_value']))}",
            f"{out}[{inner}] = {X}"]


def _pad_grad_infer(**kw):
    g = kw["Out@GRAD"]
    pairs = _pad_pairs(g.ndim, kw["paddings"])
    return {"X@GRAD": g.with_(shape=tuple(d - a - b if d >= 0 else -1
                                          for d, (a, b) in zip(g.shape, pairs)))}


def _pad_grad_ref(*, paddings, **kw):
    g = kw["Out@GRAD"]
    pairs = _pad_pairs(g.ndim, paddings)
    return {"X@GRAD": g[tuple(slice(a, d - b) for d, (a, b) in zip(g.shape, pairs))].copy()}


def _pad_grad_lower(ctx):
    if not ctx.has_output("X@GRAD"):
        return []
    g, r = ctx.inp("Out@GRAD"), ctx.rank("Out@GRAD")
    try:
        pairs = _pad_pairs(r, ctx.attrs["paddings"])
    except ShapeMismatch:
        return None
    if r == 0:
        return None
    dx = ctx.out("X@GRAD", shape=ctx.tuple_src(f"{g}.shape[{i}] - {a + b}"
                                               for i, (a, b) in enumerate(pairs)))
    inner = ", ".join(f"{a}:{g}.shape[{i}] - {b}" for i, (a, b) in enumerate(pairs))
    return [f"{dx}[:] = {g}[{inner}]"]


_PAD_ATTRS = {"paddings": Ints(REQUIRED, choices=([0, 1, 2, 0], [1, 1, 0, 2])),
              "pad_value": Float(0.0)}
register_op(
    "pad", inputs=["X"], outputs=["Out"], attrs=_PAD_ATTRS, traits=[OPAQUE],
    row_wise=RowWise(check=lambda v: None if list(v.attr("paddings"))[:2] == [0, 0]
                     else "pads the batch axis"),
    infer_shape=_pad_infer, reference=_pad_ref, emit=Opaque(_pad_lower, host=True),
    grad=default_grad("pad_grad", fwd_inputs=()),
    doc="Out = X with paddings[2i] values before and paddings[2i+1] after dim i, all "
        "pad_value.")
register_op(
    "pad_grad", inputs=["Out@GRAD"], outputs=["X@GRAD?"], attrs=_PAD_ATTRS, traits=[OPAQUE],
    infer_shape=_pad_grad_infer, reference=_pad_grad_ref,
    emit=Opaque(_pad_grad_lower, host=True), grad=None,
    doc="X@GRAD = Out@GRAD without its padding; the gradient of pad.")


# ---- pad3d ------------------------------------------------------------------------------------
_PAD_MODES = {"constant": 0, "reflect": 1, "replicate": 2, "circular": 3}
_PAD3D_ATTRS = {
    "paddings": Ints(REQUIRED, choices=([1, 0, 0, 1, 1, 1], [0, 2, 1, 0, 0, 0]),
                     doc="left, right, top, bottom, front, back"),
    "mode": Str("constant", choices=tuple(_PAD_MODES)),
    "value": Float(0.0),
    "data_format": Str("NCDHW", choices=("NCDHW", "NDHWC")),
}


def _dhw_axes(data_format) -> tuple:
    if data_format not in ("NCDHW", "NDHWC"):
        raise ShapeMismatch(f"pad3d: expected data_format NCDHW or NDHWC, got {data_format!r}")
    return (2, 3, 4) if data_format == "NCDHW" else (1, 2, 3)


def _pad3d_check(X, paddings, mode, data_format, Paddings=None) -> tuple:
    """The D, H, W axes and, when known at build time, the (before, after) pads of each."""
    if X.ndim != 5:
        raise ShapeMismatch(f"pad3d: expected a 5-D X, got shape {list(X.shape)}")
    if mode not in _PAD_MODES:
        raise ShapeMismatch(f"pad3d: expected mode in {sorted(_PAD_MODES)}, got {mode!r}")
    axes = _dhw_axes(data_format)
    if Paddings is not None:
        return axes, None
    p = [int(v) for v in paddings]
    if len(p) != 6:
        raise ShapeMismatch(f"pad3d: expected 6 paddings (left, right, top, bottom, front, "
                            f"back), got {p}")
    pairs = [(p[4], p[5]), (p[2], p[3]), (p[0], p[1])]
    for ax, (a, b) in zip(axes, pairs):
        d = X.shape[ax]
        if mode == "reflect" and d >= 0 and max(a, b) >= d:
            raise ShapeMismatch(f"pad3d: reflect padding must be smaller than the padded dim: "
                                f"pads {a}, {b} for dim {ax} of size {d} (X of shape "
                                f"{list(X.shape)})")
        if mode != "constant" and min(a, b) < 0:
            raise ShapeMismatch(f"pad3d: negative paddings {p} crop only in constant mode")
        if d >= 0 and d + a + b < 0:
            raise ShapeMismatch(f"pad3d: paddings {p} crop dim {ax} of size {d} below zero")
    return axes, pairs


def _pad3d_infer(X, Paddings=None, *, paddings, mode, data_format, **_):
    check_dtype(X, _DATA, "pad3d: X")
    if Paddings is not None and Paddings.ndim != 1:
        raise ShapeMismatch(f"pad3d: expected Paddings to be a 1-D tensor of 6 ints, got shape "
                            f"{list(Paddings.shape)}")
    axes, pairs = _pad3d_check(X, paddings, mode, data_format, Paddings)
    shape = list(X.shape)
    for k, ax in enumerate(axes):
        shape[ax] = -1 if pairs is None or shape[ax] < 0 else shape[ax] + sum(pairs[k])
    return {"Out": X.with_(shape=tuple(shape))}


def _pad_source(n_out, before, size, mode) -> np.ndarray:
    """Source index of each output index along one axis (-1: the constant filler)."""
    i = np.arange(n_out) - before
    if mode == "constant":
        return np.where((i >= 0) & (i < size), i, -1)
    if mode == "reflect":
        i = np.abs(i)
        return (size - 1) - np.abs(i - (size - 1))
    if mode == "replicate":
        return np.clip(i, 0, size - 1)
    return i % size


def _pad3d_maps(X, Paddings, paddings, mode, data_format, out_dims=None) -> tuple:
    """(axes, [source map per D/H/W axis]); the output dims from the paddings (or given)."""
    if Paddings is not None:
        paddings = int_values(Paddings)
    x_meta = VarMeta(X.shape, X.dtype)
    axes, pairs = _pad3d_check(x_meta, paddings, mode, data_format)
    maps = []
    for k, ax in enumerate(axes):
        n = X.shape[ax] + sum(pairs[k]) if out_dims is None else out_dims[ax]
        maps.append(_pad_source(n, pairs[k][0], X.shape[ax], mode))
    return axes, maps


def _pad3d_ref(X, Paddings=None, *, paddings, mode, value, data_format):
    axes, maps = _pad3d_maps(X, Paddings, paddings, mode, data_format)
    out = X
    fill = np.asarray(_f32(value)).astype(X.dtype)
    for ax, m in zip(axes, maps):
        out = np.take(out, np.maximum(m, 0), axis=ax)
        if mode == "constant":
            where = [slice(None)] * 5
            where[ax] = m < 0
            out[tuple(where)] = fill
    return {"Out": np.ascontiguousarray(out)}


def _pad3d_grad_ref(X, Paddings=None, *, paddings, mode, data_format, **kw):
    g = kw["Out@GRAD"]
    axes, maps = _pad3d_maps(X, Paddings, paddings, mode, data_format, g.shape)
    dx = np.zeros(X.shape, g.dtype)
    grid = np.ix_(*[np.arange(n) for n in g.shape])
    src = list(grid)
    keep = np.ones(g.shape, bool)
    for ax, m in zip(axes, maps):
        src[ax] = m.reshape([-1 if i == ax else 1 for i in range(5)])
        keep &= src[ax] >= 0
    np.add.at(dx, tuple(np.broadcast_to(s, g.shape)[keep] for s in src), g[keep])
    return {"X@GRAD": dx}


register_op(
    "pad3d", inputs=["X", "Paddings?"], outputs=["Out"], attrs=_PAD3D_ATTRS, traits=[OPAQUE],
    infer_shape=_pad3d_infer, reference=_pad3d_ref, emit=Opaque(),
    grad=default_grad("pad3d_grad", fwd_inputs=("X", "Paddings")),
    doc="Out = X padded along D, H, W: paddings = [left, right, top, bottom, front, back] (or "
        "the Paddings tensor), mode constant (value), reflect, replicate or circular.")
register_op(
    "pad3d_grad", inputs=["X", "Paddings?", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=_PAD3D_ATTRS, traits=[OPAQUE],
    infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_pad3d_grad_ref,
    emit=Opaque(), grad=None,
    doc="X@GRAD: each Out@GRAD element added into the X element it was copied from; the "
        "gradient of pad3d.")


# ---- resize: nearest_interp(_v2), bilinear_interp(_v2) ---------------------------------------
_METHODS = ("bilinear", "nearest")
_LAYOUTS = ("NCHW", "NHWC", "AnyLayout")  # AnyLayout: channel-last, as Paddle's kernels read it


def _interp_attrs(v1: bool) -> dict:
    return {
        "data_layout": Str("NCHW", choices=("NCHW", "NHWC")),
        "out_d": Int(0),
        "out_h": Int(0, low=1, high=9),
        "out_w": Int(0, low=1, high=9),
        "scale": Float(0.0) if v1 else Floats([]),
        "interp_method": Str("bilinear", choices=_METHODS),
        "align_corners": Bool(True),
        "align_mode": Int(1, choices=(0, 1)),
    }


def _hw_axes(data_layout) -> tuple:
    if data_layout not in _LAYOUTS:
        raise ShapeMismatch(f"resize: expected data_layout NCHW or NHWC, got {data_layout!r}")
    return (2, 3) if data_layout == "NCHW" else (1, 2)


def _attr_scales(scale) -> tuple:
    """(scale_h, scale_w) from the scale attribute (-1: none): a float > 0 (old ops) or a list
    of two floats > 0 (_v2 ops), as float32 values."""
    if isinstance(scale, (list, tuple)):
        if not scale:
            return -1.0, -1.0
        if len(scale) < 2:
            raise ShapeMismatch(f"resize: expected the scale attribute to hold 2 floats "
                                f"(height, width), got {list(scale)}")
        sh, sw = _f32(scale[0]), _f32(scale[1])
        if sh <= 0 or sw <= 0:
            raise ShapeMismatch(f"resize: expected scales > 0, got {list(scale)}")
        return sh, sw
    return (_f32(scale),) * 2 if scale > 0 else (-1.0, -1.0)


def _interp_check(X, interp_method, data_layout, align_mode):
    if X.ndim != 4:
        raise ShapeMismatch(f"resize: expected a 4-D X (NCHW or NHWC), got shape "
                            f"{list(X.shape)}")
    if interp_method not in _METHODS:
        raise ShapeMismatch(f"resize: expected interp_method in {list(_METHODS)}, got "
                            f"{interp_method!r}")
    if align_mode not in (0, 1):
        raise ShapeMismatch(f"resize: expected align_mode 0 or 1, got {align_mode}")
    return _hw_axes(data_layout)


def _interp_infer(X, OutSize=None, SizeTensor=None, Scale=None, *, data_layout, out_h, out_w,
                  scale, interp_method, align_mode, **_):
    check_dtype(X, _DATA, "resize: X")
    ah, aw = _interp_check(X, interp_method, data_layout, align_mode)
    if SizeTensor:
        if len(SizeTensor) != 2:
            raise ShapeMismatch(f"resize: expected SizeTensor to hold 2 tensors (height, "
                                f"width), got {len(SizeTensor)}")
        oh = ow = -1
    elif OutSize is not None or Scale is not None:
        oh = ow = -1
    else:
        sh, sw = _attr_scales(scale)
        if sh > 0:
            oh = int(X.shape[ah] * sh) if X.shape[ah] >= 0 else -1
            ow = int(X.shape[aw] * sw) if X.shape[aw] >= 0 else -1
        else:
            oh, ow = out_h, out_w
        if oh == 0 or ow == 0 or (sh <= 0 and (oh < 0 or ow < 0)):
            raise ShapeMismatch(f"resize: expected an output size > 0: out_h={out_h}, "
                                f"out_w={out_w}, scale={scale} give {oh} x {ow} for X of shape "
                                f"{list(X.shape)}")
    shape = list(X.shape)
    shape[ah], shape[aw] = oh, ow
    return {"Out": X.with_(shape=tuple(shape))}


def _interp_plan(X_shape, OutSize, SizeTensor, Scale, data_layout, out_h, out_w, scale,
                 align_corners, out_hw=None):
    """(axes, in_h, in_w, out_h, out_w, ratio_h, ratio_w): the run-time geometry of a resize
    (``out_hw``: the output size, known from a gradient)."""
    ah, aw = _hw_axes(data_layout)
    ih, iw = X_shape[ah], X_shape[aw]
    sh = sw = -1.0
    if SizeTensor:
        oh, ow = int_values(SizeTensor)[:2]
    else:
        if Scale is not None:
            v = np.asarray(Scale, np.float64).reshape(-1)
            sh, sw = float(v[0]), float(v[1] if v.size > 1 else v[0])
            if sh <= 0 or sw <= 0:
                raise ShapeMismatch(f"resize: expected the Scale tensor's values > 0, got "
                                    f"{v.tolist()}")
        else:
            sh, sw = _attr_scales(scale)
        oh, ow = out_h, out_w
        if sh > 0 and sw > 0:
            oh, ow = int(ih * sh), int(iw * sw)
        if OutSize is not None:
            oh, ow = int_values(OutSize)[:2]
    if out_hw is not None:
        oh, ow = out_hw
    if oh <= 0 or ow <= 0:
        raise ShapeMismatch(f"resize: expected an output size > 0, got {oh} x {ow} (X of shape "
                            f"{list(X_shape)})")
    return (ah, aw, ih, iw, oh, ow, _ratio(ih, oh, align_corners, sh),
            _ratio(iw, ow, align_corners, sw))


def _ratio(n_in, n_out, align_corners, s) -> np.float32:
    if n_out <= 1:
        return np.float32(0)
    if align_corners:
        return np.float32(n_in - 1) / np.float32(n_out - 1)
    if s > 0:
        return np.float32(1.0 / s)
    return np.float32(n_in) / np.float32(n_out)


def _nearest_src(ratio, n_out, n_in, align_corners, grad=False) -> np.ndarray:
    """Source index per output index (see ``cpu.lib.image._nearest_index``: the same steps)."""
    v = np.float32(ratio) * np.arange(n_out, dtype=np.float32)
    if not align_corners:
        i = np.trunc(v)
    elif grad:
        i = np.trunc(v + np.float32(0.5))
    else:
        i = np.floor(v.astype(np.float64) + 0.5)
    return np.clip(i.astype(np.int64), 0, n_in - 1)


def _linear_src(ratio, n_out, n_in, half_pixel, index32, weight32) -> tuple:
    """(lower index, upper index, float32 weight of the upper) per output index (see
    ``cpu.lib.image._linear_index``: the same float32/float64 steps)."""
    r, k = np.float32(ratio), np.arange(n_out)
    k32 = k.astype(np.float32)
    src32 = r * (k32 + np.float32(0.5)) - np.float32(0.5)
    src64 = np.float64(r) * (k + 0.5) - 0.5
    if not half_pixel:
        i = np.trunc(r * k32)
    else:
        i = np.trunc(src32 if index32 else src64)
    i = np.clip(i.astype(np.int64), 0, n_in - 1)
    if half_pixel:
        src = src32 if weight32 else src64.astype(np.float32)
        wt = np.maximum(src, np.float32(0)) - i.astype(np.float32)
    else:
        wt = r * k32 - i.astype(np.float32)
    return i, np.minimum(i + 1, n_in - 1), wt


def _as_ahwb(x, ah) -> np.ndarray:
    """``x`` viewed as [A, H, W, B] (channel-first data: B = 1)."""
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3], 1) if ah == 2 else x


def _interp_ref(X, OutSize=None, SizeTensor=None, Scale=None, *, data_layout, out_h, out_w,
                scale, interp_method, align_corners, align_mode, **_):
    _interp_check(VarMeta(X.shape, X.dtype), interp_method, data_layout, align_mode)
    ah, aw, ih, iw, oh, ow, rh, rw = _interp_plan(X.shape, OutSize, SizeTensor, Scale,
                                                  data_layout, out_h, out_w, scale,
                                                  align_corners)
    shape = list(X.shape)
    shape[ah], shape[aw] = oh, ow
    if (ih, iw) == (oh, ow):
        return {"Out": X.copy()}
    x = _as_ahwb(X, ah)
    if interp_method == "nearest":
        out = x[:, _nearest_src(rh, oh, ih, align_corners)][:, :, _nearest_src(rw, ow, iw,
                                                                                 align_corners)]
        return {"Out": np.ascontiguousarray(out).reshape(shape)}
    half = align_mode == 0 and not align_corners
    yn, ys, wn = _linear_src(rh, oh, ih, half, False, False)
    xw, xe, we = _linear_src(rw, ow, iw, half, False, True)
    ws, ww = np.float32(1) - wn, np.float32(1) - we
    ws, wn, ww, we = ws[:, None, None], wn[:, None, None], ww[:, None], we[:, None]
    xf = x if X.dtype == np.float64 else x.astype(np.float32)
    rows_n, rows_s = xf[:, yn], xf[:, ys]
    out = (rows_n[:, :, xw] * ws * ww + rows_s[:, :, xw] * wn * ww
           + rows_n[:, :, xe] * ws * we + rows_s[:, :, xe] * wn * we)
    return {"Out": out.astype(X.dtype).reshape(shape)}


def _interp_grad_ref(X, OutSize=None, SizeTensor=None, Scale=None, *, data_layout, out_h,
                     out_w, scale, interp_method, align_corners, align_mode, **kw):
    g = kw["Out@GRAD"]
    ah, aw = _interp_check(VarMeta(X.shape, X.dtype), interp_method, data_layout, align_mode)
    _, _, ih, iw, oh, ow, rh, rw = _interp_plan(X.shape, OutSize, SizeTensor, Scale,
                                                data_layout, out_h, out_w, scale,
                                                align_corners, (g.shape[ah], g.shape[aw]))
    if (ih, iw) == (oh, ow):
        return {"X@GRAD": g.reshape(X.shape).copy()}
    dx = np.zeros(X.shape, g.dtype)
    d4, g4 = _as_ahwb(dx, ah), _as_ahwb(g, ah)
    if interp_method == "nearest":
        iy = _nearest_src(rh, oh, ih, align_corners, grad=True)[:, None]
        ix = _nearest_src(rw, ow, iw, align_corners, grad=True)[None, :]
        for a in range(d4.shape[0]):
            np.add.at(d4[a], (iy, ix), g4[a])
        return {"X@GRAD": dx}
    half = align_mode == 0 and not align_corners
    # Paddle's backward computes more of the coordinates in float32 than its forward
    yn, ys, wn = _linear_src(rh, oh, ih, half, False, True)
    xw, xe, we = _linear_src(rw, ow, iw, half, True, True)
    ws, ww = np.float32(1) - wn, np.float32(1) - we
    for rows, wy in ((yn, ws), (ys, wn)):
        for cols, wx in ((xw, ww), (xe, we)):
            part = g4 * wy[:, None, None] * wx[:, None]
            for a in range(d4.shape[0]):
                np.add.at(d4[a], (rows[:, None], cols[None, :]), part[a])
    return {"X@GRAD": dx}


for _type in ("nearest_interp", "bilinear_interp", "nearest_interp_v2", "bilinear_interp_v2"):
    _attrs = _interp_attrs(v1=not _type.endswith("_v2"))
    _ins = ["X", "OutSize?", "SizeTensor*?", "Scale?"]
    register_op(
        _type, inputs=_ins, outputs=["Out"], attrs=_attrs, traits=[OPAQUE],
        infer_shape=_interp_infer, reference=_interp_ref,
        emit=Opaque(),
        grad=default_grad(f"{_type}_grad", fwd_inputs=("X", "OutSize", "SizeTensor", "Scale")),
        doc="Out = X resized along H and W (interp_method bilinear or nearest; see the module "
            "docstring for sizes, ratios and align options).")
    register_op(
        f"{_type}_grad", inputs=_ins + ["Out@GRAD"], outputs=["X@GRAD?"], attrs=_attrs,
        traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_interp_grad_ref,
        emit=Opaque(), grad=None,
        doc=f"X@GRAD: each Out@GRAD pixel added into its source pixels with the forward "
            f"weights; the gradient of {_type}.")


# ---- affine_channel ---------------------------------------------------------------------------
def _channel_axis(rank, data_layout) -> int:
    if data_layout not in _LAYOUTS:
        raise ShapeMismatch(f"affine_channel: expected data_layout NCHW, NHWC or AnyLayout, got "
                            f"{data_layout!r}")
    return 1 if data_layout == "NCHW" else rank - 1


def _affine_infer(X, Scale, Bias, *, data_layout):
    check_dtype(X, _REAL, "affine_channel: X")
    if X.ndim < 2:
        raise ShapeMismatch(f"affine_channel: expected X of rank >= 2, got shape "
                            f"{list(X.shape)}")
    c = X.shape[_channel_axis(X.ndim, data_layout)]
    for name, v in (("Scale", Scale), ("Bias", Bias)):
        if v.ndim != 1 or (c >= 0 and v.shape[0] >= 0 and v.shape[0] != c) or v.dtype != X.dtype:
            raise ShapeMismatch(f"affine_channel: expected {name} of shape [{c}] and dtype "
                                f"{X.dtype} (X's channels, {data_layout}), got "
                                f"{v.dtype}{list(v.shape)}")
    return {"Out": X}


def _channel_view(x, axis) -> np.ndarray:
    """``x`` viewed as [A, C, B] with the channel axis in the middle."""
    return x.reshape(int(np.prod(x.shape[:axis])), x.shape[axis], -1)


def _affine_ref(X, Scale, Bias, *, data_layout):
    axis = _channel_axis(X.ndim, data_layout)
    shape = [1] * X.ndim
    shape[axis] = -1
    if Scale.shape != (X.shape[axis],) or Bias.shape != (X.shape[axis],):
        raise ShapeMismatch(f"affine_channel: expected Scale and Bias of shape "
                            f"[{X.shape[axis]}], got {list(Scale.shape)} and {list(Bias.shape)}")
    return {"Out": X * Scale.reshape(shape) + Bias.reshape(shape)}


def _affine_grad_ref(X, Scale, Bias=None, *, data_layout, **kw):
    g = kw["Out@GRAD"]
    axis = _channel_axis(X.ndim, data_layout)
    g3, x3 = _channel_view(g, axis), _channel_view(X, axis)
    return {"X@GRAD": (g3 * Scale[None, :, None]).reshape(X.shape),
            "Scale@GRAD": (g3 * x3).sum(axis=(0, 2)).astype(X.dtype),
            "Bias@GRAD": g3.sum(axis=(0, 2)).astype(X.dtype)}


def _affine_inference(op):
    """Per channel ``X * Scale + Bias``: folded by inference passes like a batch norm."""
    layout = op.all_attrs().get("data_layout", "AnyLayout")
    if layout not in _LAYOUTS:
        return None

    def coefficients(v):
        s, b = v["Scale"], v["Bias"]
        return None if s.ndim != 1 or b.ndim != 1 else (s, b)
    return ChannelAffine("X", "Out", 1 if layout == "NCHW" else -1, ("Scale", "Bias"),
                         coefficients)


_AFFINE_ATTRS = {"data_layout": Str("AnyLayout", choices=_LAYOUTS)}
register_op(
    "affine_channel", inputs=["X", "Scale", "Bias"], outputs=["Out"], attrs=_AFFINE_ATTRS,
    row_wise=RowWise(const=("Scale", "Bias")),
    traits=[OPAQUE], infer_shape=_affine_infer, reference=_affine_ref,
    emit=Opaque(), inference=_affine_inference,
    grad=default_grad("affine_channel_grad", fwd_inputs=("X", "Scale", "Bias"),
                      wrt=("X", "Scale", "Bias")),
    doc="Out = X * Scale[c] + Bias[c] along the channel axis (dim 1 for NCHW, the last dim "
        "for NHWC and AnyLayout).")
register_op(
    "affine_channel_grad", inputs=["X", "Scale", "Bias?", "Out@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=_AFFINE_ATTRS, traits=[OPAQUE],
    infer_shape=lambda X, Scale, Bias=None, **_: {"X@GRAD": X, "Scale@GRAD": Scale,
                                                  "Bias@GRAD": Scale},
    reference=_affine_grad_ref, emit=Opaque(), grad=None,
    doc="X@GRAD = Out@GRAD * Scale[c]; Scale@GRAD[c] = sum(Out@GRAD * X), Bias@GRAD[c] = "
        "sum(Out@GRAD) over the non-channel axes; the gradient of affine_channel.")
