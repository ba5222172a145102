"""Convolution and pooling layers in the Fluid 1.x style: ``conv2d``, ``conv2d_transpose``,
``pool2d``, ``adaptive_pool2d``.

They append the ops Fluid 1.x appends: ``conv2d`` (``depthwise_conv2d`` for a depthwise
filter when ``use_cudnn`` is off), then the bias as ``elementwise_add`` over the channel axis
and the activation; parameters ``conv2d_N.w_0`` / ``.b_0``. ``padding`` may be an int, 2 or 4
ints, ``[[0, 0], [0, 0], [t, b], [l, r]]`` pairs, or ``"SAME"`` / ``"VALID"``.
"""
from __future__ import annotations

import math
import numbers

from pdjit.layers.initializer import Normal
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["conv2d", "conv2d_transpose", "pool2d", "adaptive_pool2d"]

_FLOATS = ("float16", "float32", "float64")


def _pair(value, name: str, layer: str) -> list:
    if isinstance(value, numbers.Integral):
        return [int(value)] * 2
    if isinstance(value, (list, tuple)) and len(value) == 2 and \
            all(isinstance(v, numbers.Integral) for v in value):
        return [int(v) for v in value]
    raise ValueError(f"{layer}: {name} must be an int or 2 ints, got {value!r}")


def _padding(padding, data_format: str, layer: str) -> tuple:
    """(paddings attribute, padding_algorithm) from a layer's ``padding`` argument."""
    if isinstance(padding, str):
        algo = padding.upper()
        if algo not in ("SAME", "VALID"):
            raise ValueError(f"{layer}: padding must be 'SAME', 'VALID', ints or pairs, got "
                             f"{padding!r}")
        return [0, 0], algo
    if isinstance(padding, numbers.Integral):
        return [int(padding)] * 2, "EXPLICIT"
    pads = list(padding)
    if pads and all(isinstance(p, (list, tuple)) for p in pads):
        if len(pads) != 4:
            raise ValueError(f"{layer}: padding as pairs needs 4 of them (one per dim), got "
                             f"{padding!r}")
        spatial = pads[1:3] if data_format == "NHWC" else pads[2:4]
        batch_ch = [pads[0], pads[3]] if data_format == "NHWC" else pads[0:2]
        if any(list(p) != [0, 0] for p in batch_ch):
            raise ValueError(f"{layer}: padding of the batch and channel dims must be [0, 0], "
                             f"got {padding!r}")
        pads = [int(v) for p in spatial for v in p]
    if len(pads) not in (2, 4) or not all(isinstance(p, numbers.Integral) for p in pads):
        raise ValueError(f"{layer}: padding must be an int, 2 or 4 ints, got {padding!r}")
    return [int(p) for p in pads], "EXPLICIT"


def _format(data_format: str, layer: str) -> str:
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"{layer}: data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    return data_format


def _channels(input, data_format: str, layer: str) -> int:
    if len(input.shape) != 4:
        raise ValueError(f"{layer}: expected a 4-D input, got {input.name!r} of shape "
                         f"{list(input.shape)}")
    c = input.shape[3] if data_format == "NHWC" else input.shape[1]
    if c < 0:
        raise ValueError(f"{layer}: the channel dim of {input.name!r} ({list(input.shape)}) "
                         f"must be known to size the filter")
    return int(c)


def _groups(groups, c: int, num_filters: int, layer: str) -> int:
    groups = 1 if groups is None else int(groups)
    if groups < 1 or c % groups or num_filters % groups:
        raise ValueError(f"{layer}: groups={groups} must divide the input's {c} channels and "
                         f"the {num_filters} filters")
    return groups


def _bias_act(helper, pre_bias, data_format: str):
    axis = 3 if data_format == "NHWC" else 1
    pre_act = helper.append_bias_op(pre_bias, dim_start=axis, dim_end=axis + 1)
    return helper.append_activation(pre_act)


def conv2d(input, num_filters, filter_size, stride=1, padding=0, dilation=1, groups=None,
           param_attr=None, bias_attr=None, use_cudnn=True, act=None, name=None,
           data_format="NCHW"):
    """A 2-D convolution with ``num_filters`` filters of ``filter_size``, then bias and
    ``act``. Weights default to Normal(0, sqrt(2 / (KH * KW * C))) as in Fluid."""
    check_variable(input, "input", "conv2d")
    check_dtype(input, "input", _FLOATS, "conv2d")
    data_format = _format(data_format, "conv2d")
    c = _channels(input, data_format, "conv2d")
    groups = _groups(groups, c, num_filters, "conv2d")
    ksize = _pair(filter_size, "filter_size", "conv2d")
    paddings, algo = _padding(padding, data_format, "conv2d")
    op_type = "conv2d"
    if c == groups and num_filters % c == 0 and c != 1 and not use_cudnn:
        op_type = "depthwise_conv2d"
    helper = LayerHelper(op_type, param_attr=param_attr, bias_attr=bias_attr, act=act,
                         name=name)
    shape = [int(num_filters), c // groups] + ksize
    std = math.sqrt(2.0 / (ksize[0] * ksize[1] * c))
    w = helper.create_parameter(helper.param_attr, shape, input.dtype,
                                default_initializer=Normal(0.0, std))
    pre_bias = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op(op_type, inputs={"Input": [input], "Filter": [w]},
                     outputs={"Output": [pre_bias]},
                     attrs={"strides": _pair(stride, "stride", "conv2d"), "paddings": paddings,
                            "dilations": _pair(dilation, "dilation", "conv2d"),
                            "groups": groups, "padding_algorithm": algo,
                            "data_format": data_format})
    return _bias_act(helper, pre_bias, data_format)


def conv2d_transpose(input, num_filters, output_size=None, filter_size=None, padding=0,
                     stride=1, dilation=1, groups=None, param_attr=None, bias_attr=None,
                     use_cudnn=True, act=None, name=None, data_format="NCHW"):
    """A transposed 2-D convolution (the input gradient of a convolution), then bias and
    ``act``. ``filter_size`` may be left out when ``output_size`` gives the size."""
    check_variable(input, "input", "conv2d_transpose")
    check_dtype(input, "input", _FLOATS, "conv2d_transpose")
    data_format = _format(data_format, "conv2d_transpose")
    c = _channels(input, data_format, "conv2d_transpose")
    groups = _groups(groups, c, num_filters, "conv2d_transpose")
    stride = _pair(stride, "stride", "conv2d_transpose")
    dilation = _pair(dilation, "dilation", "conv2d_transpose")
    paddings, algo = _padding(padding, data_format, "conv2d_transpose")
    out_size = [] if output_size is None else _pair(output_size, "output_size",
                                                    "conv2d_transpose")
    if filter_size is None:
        if not out_size:
            raise ValueError("conv2d_transpose: give filter_size or output_size")
        hw = input.shape[1:3] if data_format == "NHWC" else input.shape[2:4]
        if min(hw) < 0:
            raise ValueError("conv2d_transpose: filter_size is worked out from output_size only "
                             f"when the input's spatial dims are known, got {list(input.shape)}")
        p = paddings if len(paddings) == 4 else [paddings[0]] * 2 + [paddings[1]] * 2
        filter_size = [(out_size[i] - (hw[i] - 1) * stride[i] + p[2 * i] + p[2 * i + 1] - 1)
                       // dilation[i] + 1 for i in range(2)]
    ksize = _pair(filter_size, "filter_size", "conv2d_transpose")
    op_type = "conv2d_transpose"
    if c == groups and c == num_filters and not use_cudnn:
        op_type = "depthwise_conv2d_transpose"
    helper = LayerHelper(op_type, param_attr=param_attr, bias_attr=bias_attr, act=act,
                         name=name)
    w = helper.create_parameter(helper.param_attr, [c, int(num_filters) // groups] + ksize,
                                input.dtype)
    pre_bias = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op(op_type, inputs={"Input": [input], "Filter": [w]},
                     outputs={"Output": [pre_bias]},
                     attrs={"output_size": out_size, "strides": stride, "paddings": paddings,
                            "padding_algorithm": algo, "dilations": dilation, "groups": groups,
                            "data_format": data_format})
    return _bias_act(helper, pre_bias, data_format)


def pool2d(input, pool_size=-1, pool_type="max", pool_stride=1, pool_padding=0,
           global_pooling=False, use_cudnn=True, ceil_mode=False, name=None, exclusive=True,
           data_format="NCHW"):
    """Max or average pooling over ``pool_size`` windows (the ``pool2d`` op)."""
    check_variable(input, "input", "pool2d")
    check_dtype(input, "input", _FLOATS, "pool2d")
    if pool_type not in ("max", "avg"):
        raise ValueError(f"pool2d: pool_type must be 'max' or 'avg', got {pool_type!r}")
    data_format = _format(data_format, "pool2d")
    if not global_pooling and pool_size == -1:
        raise ValueError("pool2d: give pool_size (or global_pooling=True)")
    ksize = [1, 1] if pool_size == -1 else _pair(pool_size, "pool_size", "pool2d")
    paddings, algo = _padding(pool_padding, data_format, "pool2d")
    helper = LayerHelper("pool2d", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("pool2d", inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"pooling_type": pool_type, "ksize": ksize,
                            "global_pooling": bool(global_pooling),
                            "strides": _pair(pool_stride, "pool_stride", "pool2d"),
                            "paddings": paddings, "padding_algorithm": algo,
                            "ceil_mode": bool(ceil_mode), "exclusive": bool(exclusive),
                            "adaptive": False, "data_format": data_format})
    return out


def adaptive_pool2d(input, pool_size, pool_type="max", require_index=False, name=None):
    """Pooling to an output of ``pool_size``, each window ``[floor(i*H/OH), ceil((i+1)*H/OH))``.
    With ``require_index`` (max only) returns ``(out, mask)`` from ``max_pool2d_with_index``."""
    check_variable(input, "input", "adaptive_pool2d")
    check_dtype(input, "input", _FLOATS, "adaptive_pool2d")
    if pool_type not in ("max", "avg"):
        raise ValueError(f"adaptive_pool2d: pool_type must be 'max' or 'avg', got "
                         f"{pool_type!r}")
    if require_index and pool_type != "max":
        raise ValueError("adaptive_pool2d: require_index=True needs pool_type='max'")
    ksize = _pair(pool_size, "pool_size", "adaptive_pool2d")
    helper = LayerHelper("adaptive_pool2d", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    if require_index:
        mask = helper.create_variable_for_type_inference("int32")
        helper.append_op("max_pool2d_with_index", inputs={"X": [input]},
                         outputs={"Out": [out], "Mask": [mask]},
                         attrs={"ksize": ksize, "adaptive": True})
        return out, mask
    helper.append_op("pool2d", inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"pooling_type": pool_type, "ksize": ksize, "adaptive": True})
    return out
