"""Normalisation layers in the Fluid 1.x style: ``batch_norm``, ``instance_norm``, ``group_norm``,
``layer_norm``.

Each appends the op of the same name (``pdjit.ops.norm``) with Fluid's parameters:

- ``batch_norm``: scale ``batch_norm_N.w_0`` (ones) and bias ``batch_norm_N.b_0`` (zeros),
  trainable; the moving mean ``batch_norm_N.w_1`` (zeros) and variance ``batch_norm_N.w_2``
  (ones), persistable, not trainable and ``stop_gradient``, which the op updates in place
  (MeanOut/VarianceOut are those variables). ``program.clone(for_test=True)`` sets ``is_test``
  and so switches the op to the moving statistics. ``momentum`` may be a Variable (it then
  feeds MomentumTensor, as in Fluid 1.8). ``in_place=True`` is accepted but Y is always a new
  variable: the backward pass needs X as it was.
- ``instance_norm``: scale and bias (unless ``param_attr``/``bias_attr`` is False) of the
  channels (dim 1).
- ``group_norm``: as Fluid's code does (not as its docstring says), a scale only when
  ``param_attr`` is given and a bias only when ``bias_attr`` is given; by default neither.
- ``layer_norm``: with ``scale`` a scale ``layer_norm_N.w_0`` (ones) and with ``shift`` a bias
  ``layer_norm_N.b_0`` (zeros), both of ``prod(input.shape[begin_norm_axis:])`` values (those
  dims must be known); Mean and Variance are ``stop_gradient`` temporaries; then ``act``.
"""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.initializer import Constant
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable
from pdjit.layers.param_attr import ParamAttr

__all__ = ["batch_norm", "instance_norm", "group_norm", "layer_norm"]

_FLOATS = ("float32", "float64")


def _channels(input, data_layout: str, layer: str, max_rank: int | None) -> int:
    if data_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"{layer}: data_layout must be 'NCHW' or 'NHWC', got {data_layout!r}")
    rank = len(input.shape)
    if rank < 2 or (max_rank is not None and rank > max_rank):
        want = f"2..{max_rank}" if max_rank is not None else ">= 2"
        raise ValueError(f"{layer}: input must have rank {want}, got shape {list(input.shape)}")
    c = int(input.shape[1] if data_layout == "NCHW" else input.shape[-1])
    if c < 0:
        raise ValueError(f"{layer}: the channel dim of input {input.name!r} (shape "
                         f"{list(input.shape)}, {data_layout}) must be known to size the "
                         f"parameters")
    return c


def _param(helper, arg, c: int, dtype, init: float, is_bias: bool):
    """The per-channel parameter ``arg`` asks for (None when it is False; True: defaults)."""
    attr = ParamAttr._to_attr(None if arg is True else arg)
    if attr is False:
        return None
    return helper.create_parameter(attr, [c], dtype, is_bias=is_bias,
                                   default_initializer=Constant(init))


def batch_norm(input, act=None, is_test=False, momentum=0.9, epsilon=1e-05, param_attr=None,
               bias_attr=None, data_layout="NCHW", in_place=False, name=None,
               moving_mean_name=None, moving_variance_name=None,
               do_model_average_for_mean_and_var=True, use_global_stats=False):
    """Batch normalisation of ``input`` over every dim but its channels, then ``act``."""
    check_variable(input, "input", "batch_norm")
    check_dtype(input, "input", _FLOATS, "batch_norm")
    c = _channels(input, data_layout, "batch_norm", 5)
    helper = LayerHelper("batch_norm", input=input, act=act, name=name)
    dtype = input.dtype
    scale = _param(helper, param_attr, c, dtype, 1.0, False)
    bias = _param(helper, bias_attr, c, dtype, 0.0, True)
    for p, attr in ((scale, param_attr), (bias, bias_attr)):
        attr = ParamAttr._to_attr(None if attr is True else attr)
        if p is not None and use_global_stats and attr.learning_rate == 0.0:
            p.stop_gradient = True
    stats = []
    for stat_name, init in ((moving_mean_name, 0.0), (moving_variance_name, 1.0)):
        v = helper.create_parameter(
            ParamAttr(name=stat_name, initializer=Constant(init), trainable=False,
                      do_model_average=do_model_average_for_mean_and_var), [c], dtype)
        v.stop_gradient = True
        stats.append(v)
    mean, variance = stats
    saved_mean = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    saved_variance = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    y = helper.create_variable_for_type_inference(dtype)
    inputs = {"X": [input], "Mean": [mean], "Variance": [variance]}
    if scale is not None:
        inputs["Scale"] = [scale]
    if bias is not None:
        inputs["Bias"] = [bias]
    attrs = {"epsilon": float(epsilon), "is_test": bool(is_test), "data_layout": data_layout,
             "use_global_stats": bool(use_global_stats)}
    if isinstance(momentum, Variable):
        inputs["MomentumTensor"] = [momentum]
    else:
        attrs["momentum"] = float(momentum)
    helper.append_op("batch_norm", inputs=inputs,
                     outputs={"Y": [y], "MeanOut": [mean], "VarianceOut": [variance],
                              "SavedMean": [saved_mean], "SavedVariance": [saved_variance]},
                     attrs=attrs)
    return helper.append_activation(y)


def instance_norm(input, epsilon=1e-05, param_attr=None, bias_attr=None, name=None):
    """Instance normalisation: each sample's channels over their spatial dims (NCHW)."""
    check_variable(input, "input", "instance_norm")
    check_dtype(input, "input", _FLOATS, "instance_norm")
    c = _channels(input, "NCHW", "instance_norm", 5)
    helper = LayerHelper("instance_norm", input=input, name=name)
    dtype = input.dtype
    inputs = {"X": [input]}
    scale = _param(helper, param_attr, c, dtype, 1.0, False)
    bias = _param(helper, bias_attr, c, dtype, 0.0, True)
    if scale is not None:
        inputs["Scale"] = [scale]
    if bias is not None:
        inputs["Bias"] = [bias]
    saved_mean = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    saved_variance = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    y = helper.create_variable_for_type_inference(dtype)
    helper.append_op("instance_norm", inputs=inputs,
                     outputs={"Y": [y], "SavedMean": [saved_mean],
                              "SavedVariance": [saved_variance]},
                     attrs={"epsilon": float(epsilon)})
    return y


def group_norm(input, groups, epsilon=1e-05, param_attr=None, bias_attr=None, act=None,
               data_layout="NCHW", name=None):
    """Group normalisation: each sample's groups of ``C / groups`` channels, then ``act``."""
    check_variable(input, "input", "group_norm")
    check_dtype(input, "input", _FLOATS, "group_norm")
    c = _channels(input, data_layout, "group_norm", None)
    if not isinstance(groups, int) or groups < 1 or c % groups:
        raise ValueError(f"group_norm: groups must be a positive int dividing the {c} channels "
                         f"of the input, got {groups!r}")
    helper = LayerHelper("group_norm", input=input, act=act, name=name)
    dtype = input.dtype
    inputs = {"X": [input]}
    if param_attr:  # Fluid's code: a scale only when param_attr is given
        inputs["Scale"] = [_param(helper, param_attr, c, dtype, 1.0, False)]
    if bias_attr:
        inputs["Bias"] = [_param(helper, bias_attr, c, dtype, 0.0, True)]
    mean = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    variance = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    y = helper.create_variable_for_type_inference(dtype)
    helper.append_op("group_norm", inputs=inputs,
                     outputs={"Y": [y], "Mean": [mean], "Variance": [variance]},
                     attrs={"epsilon": float(epsilon), "groups": groups,
                            "data_layout": data_layout})
    return helper.append_activation(y)


def layer_norm(input, scale=True, shift=True, begin_norm_axis=1, epsilon=1e-05, param_attr=None,
               bias_attr=None, act=None, name=None):
    """Layer normalisation of ``input`` over its dims from ``begin_norm_axis`` on, for each index
    of the leading dims; a learnt scale (``scale``) and bias (``shift``); then ``act``."""
    check_variable(input, "input", "layer_norm")
    check_dtype(input, "input", _FLOATS, "layer_norm")
    shape = list(input.shape)
    if not isinstance(begin_norm_axis, int) or not 0 < begin_norm_axis < len(shape):
        raise ValueError(f"layer_norm: begin_norm_axis must be an int in 1..{len(shape) - 1} for "
                         f"input {input.name!r} of shape {shape}, got {begin_norm_axis!r}")
    normalised = shape[begin_norm_axis:]
    if any(d < 0 for d in normalised):
        raise ValueError(f"layer_norm: the dims {begin_norm_axis}.. of input {input.name!r} "
                         f"(shape {shape}) must be known to size the scale and bias")
    n = 1
    for d in normalised:
        n *= int(d)
    if scale and param_attr is False:
        raise ValueError("layer_norm: param_attr must not be False when scale is True")
    if shift and bias_attr is False:
        raise ValueError("layer_norm: bias_attr must not be False when shift is True")
    helper = LayerHelper("layer_norm", input=input, act=act, name=name)
    dtype = input.dtype
    inputs = {"X": [input]}
    if scale:
        inputs["Scale"] = [_param(helper, param_attr, n, dtype, 1.0, False)]
    if shift:
        inputs["Bias"] = [_param(helper, bias_attr, n, dtype, 0.0, True)]
    mean = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    variance = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    y = helper.create_variable_for_type_inference(dtype)
    helper.append_op("layer_norm", inputs=inputs,
                     outputs={"Y": [y], "Mean": [mean], "Variance": [variance]},
                     attrs={"epsilon": float(epsilon), "begin_norm_axis": begin_norm_axis})
    return helper.append_activation(y)
