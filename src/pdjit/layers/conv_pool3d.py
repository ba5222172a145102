"""Fluid 1.8's ``conv3d``, ``conv3d_transpose``, ``pool3d`` and ``adaptive_pool3d`` layers
(NCDHW), appending the ops of those names (``pdjit.ops.conv3d``; the pools append ``pool3d``);
``conv3d`` creates ``conv3d_N.w_0`` ``[num_filters, C / groups, kd, kh, kw]`` (Normal(0,
sqrt(2 / (kd kh kw C))) as in Fluid), ``conv3d_transpose`` ``[C, num_filters / groups, kd, kh,
kw]`` (Xavier), each with a bias over the channel axis. ``resize_trilinear`` appends
``trilinear_interp``."""
from __future__ import annotations

import math
import numbers

from pdjit.framework.program import Variable
from pdjit.layers.initializer import Normal
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["conv3d", "conv3d_transpose", "pool3d", "adaptive_pool3d", "resize_trilinear"]


def _triple(value, name: str, layer: str) -> list:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return [int(value)] * 3
    if isinstance(value, (list, tuple)) and len(value) == 3 and \
            all(isinstance(v, numbers.Integral) for v in value):
        return [int(v) for v in value]
    raise ValueError(f"{layer}: {name} must be an int or 3 ints, got {value!r}")


def _paddings(padding, layer: str) -> list:
    if isinstance(padding, numbers.Integral):
        return [int(padding)] * 3
    p = list(padding)
    if len(p) in (3, 6) and all(isinstance(v, numbers.Integral) for v in p):
        return [int(v) for v in p]
    raise ValueError(f"{layer}: padding must be an int, 3 or 6 ints, got {padding!r}")


def _check_input(input, layer: str, data_format: str) -> int:
    check_variable(input, "input", layer)
    check_dtype(input, "input", ("float32", "float64"), layer)
    if data_format != "NCDHW":
        raise ValueError(f"{layer}: only data_format 'NCDHW' is supported, got {data_format!r}")
    if len(input.shape) != 5:
        raise ValueError(f"{layer}: expected a 5-D input [N, C, D, H, W], got "
                         f"{list(input.shape)}")
    return input.shape[1]


def conv3d(input, num_filters, filter_size, stride=1, padding=0, dilation=1, groups=None,
           param_attr=None, bias_attr=None, use_cudnn=True, act=None, name=None,
           data_format="NCDHW") -> Variable:
    """3-D convolution of ``input [N, C, D, H, W]`` with ``num_filters`` learnt
    ``filter_size`` kernels, then the bias and ``act``."""
    layer = "conv3d"
    c = _check_input(input, layer, data_format)
    if c < 0:
        raise ValueError(f"{layer}: the channel dim of the input must be known, got "
                         f"{list(input.shape)}")
    groups = 1 if groups is None else int(groups)
    if groups < 1 or c % groups or num_filters % groups:
        raise ValueError(f"{layer}: groups={groups} must divide the {c} channels and the "
                         f"{num_filters} filters")
    k = _triple(filter_size, "filter_size", layer)
    helper = LayerHelper(layer, param_attr=param_attr, bias_attr=bias_attr, act=act, name=name)
    std = math.sqrt(2.0 / (k[0] * k[1] * k[2] * c))
    w = helper.create_parameter(helper.param_attr, [int(num_filters), c // groups] + k,
                                input.dtype, default_initializer=Normal(0.0, std))
    pre = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("conv3d", inputs={"Input": [input], "Filter": [w]},
                     outputs={"Output": [pre]},
                     attrs={"strides": _triple(stride, "stride", layer),
                            "paddings": _paddings(padding, layer),
                            "dilations": _triple(dilation, "dilation", layer),
                            "groups": groups, "use_cudnn": bool(use_cudnn)})
    return helper.append_activation(helper.append_bias_op(pre, dim_start=1, dim_end=2))


def conv3d_transpose(input, num_filters, output_size=None, filter_size=None, padding=0,
                     stride=1, dilation=1, groups=None, param_attr=None, bias_attr=None,
                     use_cudnn=True, act=None, name=None, data_format="NCDHW") -> Variable:
    """3-D transposed convolution of ``input [N, C, D, H, W]`` with ``num_filters`` learnt
    ``filter_size`` kernels (``output_size`` is not supported: give ``filter_size``), then the
    bias and ``act``."""
    layer = "conv3d_transpose"
    c = _check_input(input, layer, data_format)
    if filter_size is None or output_size is not None:
        raise ValueError(f"{layer}: give filter_size (output_size is not supported)")
    if c < 0:
        raise ValueError(f"{layer}: the channel dim of the input must be known, got "
                         f"{list(input.shape)}")
    groups = 1 if groups is None else int(groups)
    if groups < 1 or c % groups or num_filters % groups:
        raise ValueError(f"{layer}: groups={groups} must divide the {c} channels and the "
                         f"{num_filters} filters")
    k = _triple(filter_size, "filter_size", layer)
    helper = LayerHelper(layer, param_attr=param_attr, bias_attr=bias_attr, act=act, name=name)
    w = helper.create_parameter(helper.param_attr, [c, int(num_filters) // groups] + k,
                                input.dtype)
    pre = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op(layer, inputs={"Input": [input], "Filter": [w]},
                     outputs={"Output": [pre]},
                     attrs={"strides": _triple(stride, "stride", layer),
                            "paddings": _paddings(padding, layer),
                            "dilations": _triple(dilation, "dilation", layer),
                            "groups": groups, "use_cudnn": bool(use_cudnn)})
    return helper.append_activation(helper.append_bias_op(pre, dim_start=1, dim_end=2))


def _pool(input, attrs, layer, name=None) -> Variable:
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("pool3d", inputs={"X": [input]}, outputs={"Out": [out]}, attrs=attrs)
    return out


def pool3d(input, pool_size=-1, pool_type="max", pool_stride=1, pool_padding=0,
           global_pooling=False, use_cudnn=True, ceil_mode=False, name=None, exclusive=True,
           data_format="NCDHW") -> Variable:
    """3-D max or average pooling of ``input [N, C, D, H, W]``."""
    layer = "pool3d"
    _check_input(input, layer, data_format)
    if pool_type not in ("max", "avg"):
        raise ValueError(f"{layer}: pool_type must be 'max' or 'avg', got {pool_type!r}")
    if pool_size == -1 and not global_pooling:
        raise ValueError(f"{layer}: give pool_size, or global_pooling=True")
    ksize = [1, 1, 1] if pool_size == -1 else _triple(pool_size, "pool_size", layer)
    return _pool(input, {"pooling_type": pool_type, "ksize": ksize,
                         "strides": _triple(pool_stride, "pool_stride", layer),
                         "paddings": _paddings(pool_padding, layer),
                         "global_pooling": bool(global_pooling), "ceil_mode": bool(ceil_mode),
                         "exclusive": bool(exclusive), "use_cudnn": bool(use_cudnn)},
                 layer, name)


def adaptive_pool3d(input, pool_size, pool_type="max", require_index=False,
                    name=None) -> Variable:
    """Max or average pooling of ``input [N, C, D, H, W]`` into ``pool_size`` bins per axis
    (bin ``i`` of an axis of size ``n`` into ``o``: ``floor(i n / o) .. ceil((i + 1) n / o)``)."""
    layer = "adaptive_pool3d"
    _check_input(input, layer, "NCDHW")
    if pool_type not in ("max", "avg"):
        raise ValueError(f"{layer}: pool_type must be 'max' or 'avg', got {pool_type!r}")
    if require_index:
        raise ValueError(f"{layer}: require_index=True is not supported")
    return _pool(input, {"pooling_type": pool_type,
                         "ksize": _triple(pool_size, "pool_size", layer),
                         "adaptive": True}, layer, name)


def resize_trilinear(input, out_shape=None, scale=None, name=None, actual_shape=None,
                     align_corners=True, align_mode=1, data_format="NCDHW") -> Variable:
    """``input [N, C, D, H, W]`` resized to ``out_shape`` ([D', H', W'] ints) or by ``scale``
    with trilinear interpolation (corners aligned by default, as in Fluid)."""
    layer = "resize_trilinear"
    _check_input(input, layer, data_format)
    if actual_shape is not None or isinstance(out_shape, Variable):
        raise ValueError(f"{layer}: out_shape must be a list of 3 ints (Variables and "
                         f"actual_shape are not supported)")
    attrs = {"align_corners": bool(align_corners), "align_mode": int(align_mode),
             "data_layout": "NCDHW"}
    if out_shape is not None:
        d, h, w = _triple(list(out_shape), "out_shape", layer)
        attrs.update(out_d=d, out_h=h, out_w=w)
    elif scale is not None and float(scale) > 0:
        attrs["scale"] = float(scale)
    else:
        raise ValueError(f"{layer}: give out_shape or a scale > 0")
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("trilinear_interp", inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs=attrs)
    return out
