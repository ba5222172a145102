"""Fluid 1.x layers for images and shapes: flatten, shape, pad, pad2d, image_resize (with
resize_bilinear, resize_nearest) and affine_channel.

Each appends the ops Fluid 1.8 appends, under PaddlePaddle's legacy op types: ``flatten`` emits
``flatten2``, ``image_resize`` the old ``bilinear_interp``/``nearest_interp`` ops. ``pad2d``'s op
no longer exists in PaddlePaddle 3.x, whose pad layers give a 4-D image a depth of one and pad it
with ``pad3d``; ``pad2d`` does the same (``unsqueeze2``, ``pad3d``, ``squeeze2``), keeping Fluid's
arguments: paddings ``[top, bottom, left, right]`` and mode ``edge`` for ``pad3d``'s
``replicate``.
"""
from __future__ import annotations

import warnings

import numpy as np

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["flatten", "shape", "pad", "pad2d", "image_resize", "resize_bilinear",
           "resize_nearest", "affine_channel"]


def _stop(v: Variable) -> Variable:
    v.stop_gradient = True
    return v


def flatten(x, axis=1, name=None):
    """``x`` as a matrix: dims before ``axis`` make the rows, the rest the columns
    (``axis`` = 0: one row)."""
    check_variable(x, "x", "flatten")
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis <= len(x.shape):
        raise ValueError(f"flatten: axis must be an int in [0, rank(x)] = [0, {len(x.shape)}], "
                         f"got {axis!r}")
    helper = LayerHelper("flatten", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    xshape = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    helper.append_op("flatten2", inputs={"X": [x]}, outputs={"Out": [out], "XShape": [xshape]},
                     attrs={"axis": axis})
    return out


def shape(input):
    """The dims of ``input`` as a 1-D int32 Variable (known at run time)."""
    check_variable(input, "input", "shape")
    helper = LayerHelper("shape")
    out = helper.create_variable_for_type_inference("int32", stop_gradient=True)
    helper.append_op("shape", inputs={"Input": [input]}, outputs={"Out": [out]})
    return out


def _int_list(values, arg, layer) -> list:
    values = list(values) if isinstance(values, (list, tuple)) else None
    if values is None or any(isinstance(v, bool) or not isinstance(v, (int, np.integer))
                             for v in values):
        raise TypeError(f"{layer}: {arg} must be a list of ints, got {values!r}")
    return [int(v) for v in values]


def pad(x, paddings, pad_value=0.0, name=None):
    """``x`` padded with ``pad_value``: ``paddings[2i]`` values before dim i and
    ``paddings[2i+1]`` after it."""
    check_variable(x, "x", "pad")
    paddings = _int_list(paddings, "paddings", "pad")
    if len(paddings) != 2 * len(x.shape):
        raise ValueError(f"pad: paddings must hold 2 * rank(x) = {2 * len(x.shape)} ints, got "
                         f"{paddings}")
    helper = LayerHelper("pad", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("pad", inputs={"X": [x]}, outputs={"Out": [out]},
                     attrs={"paddings": paddings, "pad_value": float(pad_value)})
    return out


_PAD2D_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


def pad2d(input, paddings=[0, 0, 0, 0], mode="constant", pad_value=0.0, data_format="NCHW",  # noqa: B006
          name=None):
    """A 4-D image padded along H and W: ``paddings`` = ``[top, bottom, left, right]`` (a list
    or a 1-D int32 Variable of 4), ``mode`` ``constant`` (``pad_value``), ``reflect`` or
    ``edge``; ``data_format`` NCHW or NHWC."""
    from pdjit.layers.shape_ops import concat, gather, squeeze, unsqueeze
    from pdjit.layers.tensor import assign, fill_constant

    check_variable(input, "input", "pad2d")
    if len(input.shape) != 4:
        raise ValueError(f"pad2d: input must be a 4-D image, got shape {list(input.shape)}")
    if mode not in _PAD2D_MODES:
        raise ValueError(f"pad2d: mode must be one of {sorted(_PAD2D_MODES)}, got {mode!r}")
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"pad2d: data_format must be NCHW or NHWC, got {data_format!r}")
    depth_axis = 2 if data_format == "NCHW" else 1
    inputs, attrs = {}, {"mode": _PAD2D_MODES[mode], "value": float(pad_value),
                         "data_format": "NCDHW" if data_format == "NCHW" else "NDHWC"}
    if isinstance(paddings, Variable):
        # [top, bottom, left, right] -> [left, right, top, bottom, front = 0, back = 0]
        order = gather(paddings, assign(np.array([2, 3, 0, 1], np.int32)))
        inputs["Paddings"] = [concat([order, fill_constant([2], paddings.dtype, 0)])]
        attrs["paddings"] = []
    else:
        values = _int_list(paddings, "paddings", "pad2d")
        if len(values) != 4:
            raise ValueError(f"pad2d: paddings must be [top, bottom, left, right], got "
                             f"{values}")
        top, bottom, left, right = values
        attrs["paddings"] = [left, right, top, bottom, 0, 0]
    helper = LayerHelper("pad2d", name=name)
    x5 = unsqueeze(input, [depth_axis])
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("pad3d", inputs={"X": [x5], **inputs}, outputs={"Out": [out]},
                     attrs=attrs)
    return squeeze(out, [depth_axis])


_RESAMPLE = {"BILINEAR": "bilinear", "NEAREST": "nearest"}


def image_resize(input, out_shape=None, scale=None, name=None, resample="BILINEAR",
                 actual_shape=None, align_corners=True, align_mode=1, data_format="NCHW"):
    """A batch of 4-D images resized along H and W by ``resample`` (``BILINEAR`` or
    ``NEAREST``) to ``out_shape`` ([out_h, out_w] of ints or int Variables, or an int32
    Variable of 2), else by ``scale`` (a float > 0 or a float Variable). ``actual_shape`` (an
    int32 Variable of 2) overrides both at run time. ``align_corners`` aligns the corner pixels'
    centres; ``align_mode`` 0 samples at half-pixel centres (bilinear without align_corners)."""
    from pdjit.layers.tensor import fill_constant

    check_variable(input, "input", "image_resize")
    if resample not in _RESAMPLE:
        raise ValueError(f"image_resize: resample must be 'BILINEAR' or 'NEAREST' (the 4-D "
                         f"methods), got {resample!r}")
    if len(input.shape) != 4:
        raise ValueError(f"image_resize: 'BILINEAR' and 'NEAREST' take a 4-D input, got shape "
                         f"{list(input.shape)}")
    if not isinstance(align_corners, bool):
        raise TypeError(f"image_resize: align_corners must be a bool, got {align_corners!r}")
    if align_mode not in (0, 1):
        raise ValueError(f"image_resize: align_mode must be 0 or 1, got {align_mode!r}")
    if out_shape is None and scale is None:
        raise ValueError("image_resize: one of out_shape and scale must be given")
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"image_resize: data_format must be NCHW or NHWC for a 4-D input, got "
                         f"{data_format!r}")
    check_dtype(input, "input", ("float32", "float64", "uint8"), "image_resize")
    method = _RESAMPLE[resample]
    helper = LayerHelper(f"{method}_interp", name=name)
    inputs = {"X": [input]}
    attrs = {"out_d": -1, "out_h": -1, "out_w": -1, "interp_method": method,
             "align_corners": align_corners, "align_mode": align_mode,
             "data_layout": data_format}
    if out_shape is not None:
        if isinstance(out_shape, Variable):
            inputs["OutSize"] = [_stop(out_shape)]
        elif isinstance(out_shape, (list, tuple)):
            if len(out_shape) != 2:
                raise ValueError(f"image_resize: out_shape must hold 2 sizes (out_h, out_w) for "
                                 f"a 4-D input, got {list(out_shape)}")
            for d in out_shape:
                if not isinstance(d, Variable) and (isinstance(d, bool) or
                                                    not isinstance(d, int) or d <= 0):
                    raise ValueError(f"image_resize: each size in out_shape must be an int > 0 "
                                     f"or a Variable, got {list(out_shape)}")
            if any(isinstance(d, Variable) for d in out_shape):
                inputs["SizeTensor"] = [_stop(d) if isinstance(d, Variable)
                                        else fill_constant([1], "int32", d, force_cpu=True)
                                        for d in out_shape]
            attrs["out_h"], attrs["out_w"] = [-1 if isinstance(d, Variable) else int(d)
                                              for d in out_shape]
        else:
            raise TypeError(f"image_resize: out_shape must be a list, tuple or Variable, got "
                            f"{type(out_shape).__name__}")
    elif isinstance(scale, Variable):
        inputs["Scale"] = [_stop(scale)]
    elif isinstance(scale, (int, float)) and not isinstance(scale, bool):
        if scale <= 0:
            raise ValueError(f"image_resize: scale must be > 0, got {scale}")
        attrs["scale"] = float(scale)
    else:
        raise TypeError(f"image_resize: scale must be a float, an int or a Variable, got "
                        f"{type(scale).__name__}")
    if isinstance(actual_shape, Variable):
        warnings.warn("image_resize: actual_shape is deprecated; give out_shape a Variable "
                      "instead", DeprecationWarning, stacklevel=2)
        inputs["OutSize"] = [_stop(actual_shape)]
    elif actual_shape is not None:
        raise TypeError(f"image_resize: actual_shape must be a Variable or None, got "
                        f"{type(actual_shape).__name__}")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op(f"{method}_interp", inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
    return out


def resize_bilinear(input, out_shape=None, scale=None, name=None, actual_shape=None,
                    align_corners=True, align_mode=1, data_format="NCHW"):
    """:func:`image_resize` with ``resample='BILINEAR'``."""
    return image_resize(input, out_shape, scale, name, "BILINEAR", actual_shape, align_corners,
                        align_mode, data_format)


def resize_nearest(input, out_shape=None, scale=None, name=None, actual_shape=None,
                   align_corners=True, data_format="NCHW"):
    """:func:`image_resize` with ``resample='NEAREST'``."""
    return image_resize(input, out_shape, scale, name, "NEAREST", actual_shape, align_corners,
                        1, data_format)


def affine_channel(x, scale=None, bias=None, data_layout="NCHW", name=None, act=None):
    """``x * scale[c] + bias[c]`` along the channel axis (dim 1 for NCHW, the last for NHWC),
    then ``act``. ``scale`` and ``bias`` are 1-D Variables of the channel count (Fluid's
    frozen batch norm keeps them as parameters)."""
    check_variable(x, "x", "affine_channel")
    check_dtype(x, "x", ("float32", "float64"), "affine_channel")
    if scale is None or bias is None:
        raise ValueError("affine_channel: scale and bias must be given (1-D Variables of the "
                         "channel count)")
    check_variable(scale, "scale", "affine_channel")
    check_variable(bias, "bias", "affine_channel")
    if data_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"affine_channel: data_layout must be NCHW or NHWC, got "
                         f"{data_layout!r}")
    helper = LayerHelper("affine_channel", name=name, act=act)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("affine_channel", inputs={"X": [x], "Scale": [scale], "Bias": [bias]},
                     outputs={"Out": [out]}, attrs={"data_layout": data_layout})
    return helper.append_activation(out)
