"""Fluid 1.8's sequence layers over LoD tensors (``data(..., lod_level=1)``).

Each function appends the op Fluid 1.8 appends (``sequence_pool``, ``sequence_softmax``,
``sequence_expand``... with the same slots and attributes; see ``pdjit.ops.sequence`` for the
semantics) and returns its output Variable(s). ``dynamic_lstm``, ``dynamic_gru`` and
``sequence_conv`` also create their parameters as Fluid 1.8 does (``lstm_0.w_0`` ``[H, 4H]``,
``lstm_0.b_0`` ``[1, 7H]`` or ``[1, 4H]``; ``gru_0.w_0`` ``[H, 3H]``, ``gru_0.b_0`` ``[1, 3H]``;
``sequence_conv_0.w_0`` ``[filter_size * D, num_filters]`` and its bias added after the op).

LoDs are run-time values: shapes here keep the number of rows unknown (``-1``).
"""
from __future__ import annotations

from pdjit.framework import dtypes
from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["sequence_pool", "sequence_first_step", "sequence_last_step", "sequence_softmax",
           "sequence_expand", "sequence_expand_as", "sequence_concat", "sequence_pad",
           "sequence_unpad", "sequence_mask", "sequence_reverse", "lod_reset", "dynamic_lstm",
           "dynamic_gru", "sequence_conv"]

_FLOATS = ("float16", "float32", "float64")
_POOL_TYPES = ("average", "sum", "sqrt", "max", "last", "first")


def _one(op_type, x, layer, name=None, attrs=None, out_slot="Out", extra_inputs=None):
    check_variable(x, "x" if layer != "sequence_pool" else "input", layer)
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    inputs = {"X": [x]}
    inputs.update(extra_inputs or {})
    helper.append_op(op_type, inputs=inputs, outputs={out_slot: [out]}, attrs=dict(attrs or {}))
    return out


def sequence_pool(input, pool_type, is_test=False, pad_value=0.0):
    """One row per sequence of ``input``'s last LoD level: ``pool_type`` is ``average``,
    ``sum``, ``sqrt`` (sum / sqrt(length)), ``max``, ``last`` or ``first``; an empty sequence
    gives ``pad_value``. The result keeps the LoD levels above the last."""
    check_variable(input, "input", "sequence_pool")
    check_dtype(input, "input", _FLOATS, "sequence_pool")
    if not isinstance(pool_type, str) or pool_type.lower() not in _POOL_TYPES:
        raise ValueError(f"sequence_pool: pool_type must be one of {_POOL_TYPES}, got "
                         f"{pool_type!r}")
    helper = LayerHelper("sequence_pool")
    out = helper.create_variable_for_type_inference(input.dtype)
    max_index = helper.create_variable_for_type_inference("int32", stop_gradient=True)
    helper.append_op("sequence_pool", inputs={"X": [input]},
                     outputs={"Out": [out], "MaxIndex": [max_index]},
                     attrs={"pooltype": pool_type.upper(), "is_test": bool(is_test),
                            "pad_value": float(pad_value)})
    return out


def sequence_first_step(input):
    """The first row of each sequence (``sequence_pool(input, 'first')``)."""
    return sequence_pool(input, "first")


def sequence_last_step(input):
    """The last row of each sequence (``sequence_pool(input, 'last')``)."""
    return sequence_pool(input, "last")


def sequence_softmax(input, use_cudnn=False, name=None):
    """Softmax within each sequence of ``input`` (shape ``[N, 1]`` or ``[N]``)."""
    check_variable(input, "input", "sequence_softmax")
    check_dtype(input, "input", _FLOATS, "sequence_softmax")
    return _one("sequence_softmax", input, "sequence_softmax", name)


def sequence_expand(x, y, ref_level=-1, name=None):
    """Repeat each sequence of ``x`` (each row, if ``x`` has no LoD) as many times as the
    matching sequence of ``y``'s LoD level ``ref_level`` (-1: the last) is long."""
    check_variable(y, "y", "sequence_expand")
    if not isinstance(ref_level, int):
        raise TypeError(f"sequence_expand: ref_level must be an int, got {ref_level!r}")
    return _one("sequence_expand", x, "sequence_expand", name, {"ref_level": ref_level},
                extra_inputs={"Y": [y]})


def sequence_expand_as(x, y, name=None):
    """Row ``i`` of ``x`` repeated as many times as sequence ``i`` of ``y`` is long."""
    check_variable(y, "y", "sequence_expand_as")
    return _one("sequence_expand_as", x, "sequence_expand_as", name, extra_inputs={"Y": [y]})


def sequence_concat(input, name=None):
    """Sequence ``i`` of the result is sequence ``i`` of each of ``input`` in turn."""
    items = list(input) if isinstance(input, (list, tuple)) else [input]
    if not items:
        raise ValueError("sequence_concat: 'input' must not be empty")
    for v in items:
        check_variable(v, "input", "sequence_concat")
    helper = LayerHelper("sequence_concat", name=name)
    out = helper.create_variable_for_type_inference(items[0].dtype)
    helper.append_op("sequence_concat", inputs={"X": items}, outputs={"Out": [out]})
    return out


def sequence_pad(x, pad_value, maxlen=None, name=None):
    """``(out, length)``: the sequences of ``x`` padded with ``pad_value`` (a Variable holding
    one value or one time step) to ``maxlen`` steps (the longest sequence when None), and their
    lengths (int64)."""
    check_variable(x, "x", "sequence_pad")
    check_variable(pad_value, "pad_value", "sequence_pad")
    if maxlen is not None and (not isinstance(maxlen, int) or maxlen <= 0):
        raise ValueError(f"sequence_pad: maxlen must be None or a positive int, got {maxlen!r}")
    helper = LayerHelper("sequence_pad", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    length = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("sequence_pad", inputs={"X": [x], "PadValue": [pad_value]},
                     outputs={"Out": [out], "Length": [length]},
                     attrs={"padded_length": -1 if maxlen is None else int(maxlen)})
    return out, length


def sequence_unpad(x, length, name=None):
    """The first ``length[i]`` steps of each padded sequence ``x[i]``, as a LoD tensor."""
    check_variable(length, "length", "sequence_unpad")
    check_dtype(length, "length", ("int32", "int64"), "sequence_unpad")
    return _one("sequence_unpad", x, "sequence_unpad", name, extra_inputs={"Length": [length]})


def sequence_mask(x, maxlen=None, dtype="int64", name=None):
    """``mask[..., j] = j < x[...]`` for ``j < maxlen`` (an int, a Variable, or None for
    ``max(x)``), in ``dtype``."""
    check_variable(x, "x", "sequence_mask")
    check_dtype(x, "x", ("int32", "int64"), "sequence_mask")
    helper = LayerHelper("sequence_mask", name=name)
    out = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    inputs = {"X": [x]}
    attrs = {"out_dtype": dtypes.to_code(dtype)}
    if isinstance(maxlen, Variable):
        inputs["MaxLenTensor"] = [maxlen]
    elif maxlen is None:
        attrs["maxlen"] = -1
    elif isinstance(maxlen, int) and maxlen >= 0:
        attrs["maxlen"] = int(maxlen)
    else:
        raise ValueError(f"sequence_mask: maxlen must be None, a non-negative int or a "
                         f"Variable, got {maxlen!r}")
    helper.append_op("sequence_mask", inputs=inputs, outputs={"Y": [out]}, attrs=attrs)
    return out


def sequence_reverse(x, name=None):
    """The rows of each sequence of ``x`` in reverse order (same LoD)."""
    return _one("sequence_reverse", x, "sequence_reverse", name, out_slot="Y")


def lod_reset(x, y=None, target_lod=None):
    """``x``'s data with a new LoD: ``y``'s LoD (or ``y``'s values as offsets when it has
    none), else the level-0 offsets ``target_lod``."""
    check_variable(x, "x", "lod_reset")
    if y is not None:
        check_variable(y, "y", "lod_reset")
        return _one("lod_reset", x, "lod_reset", extra_inputs={"Y": [y]})
    if target_lod is not None:
        if not isinstance(target_lod, (list, tuple)) or not target_lod:
            raise ValueError(f"lod_reset: target_lod must be a non-empty list of offsets, got "
                             f"{target_lod!r}")
        return _one("lod_reset", x, "lod_reset",
                    attrs={"target_lod": [int(v) for v in target_lod]})
    raise ValueError("lod_reset: y and target_lod must not both be None")


def _rnn_input(input, layer, width_name, width, gates):
    check_variable(input, "input", layer)
    check_dtype(input, "input", ("float32", "float64"), layer)
    if len(input.shape) != 2 or input.shape[1] not in (-1, width):
        raise ValueError(f"{layer}: input of shape {list(input.shape)}: expected [-1, {width}] "
                         f"({gates} gates of {width_name}, projected by an fc first)")


def _state(value, arg, layer, size, dtype):
    if value is None:
        return None
    check_variable(value, arg, layer)
    if len(value.shape) != 2 or value.shape[1] not in (-1, size):
        raise ValueError(f"{layer}: {arg} of shape {list(value.shape)}: expected [-1, {size}] "
                         f"(one row per sequence)")
    if value.dtype != dtype:
        raise TypeError(f"{layer}: {arg} has dtype {value.dtype}: expected {dtype}")
    return value


def dynamic_lstm(input, size, h_0=None, c_0=None, param_attr=None, bias_attr=None,
                 use_peepholes=True, is_reverse=False, gate_activation="sigmoid",
                 cell_activation="tanh", candidate_activation="tanh", dtype="float32",
                 name=None):
    """``(hidden, cell)``: Fluid's LSTM over each sequence of ``input`` (a LoD tensor
    ``[-1, size]``, the four gates already projected, e.g. by ``fc(x, size)``); ``size`` is
    ``4 * H``. ``h_0``/``c_0`` (``[sequences, H]``) start the sequences (zeros otherwise);
    ``use_peepholes`` adds the cell to the gates' inputs (a bias of ``7H``); ``is_reverse`` runs
    each sequence from its end."""
    if not isinstance(size, int) or size <= 0 or size % 4:
        raise ValueError(f"dynamic_lstm: size must be a positive multiple of 4 (4 * hidden "
                         f"size), got {size!r}")
    _rnn_input(input, "dynamic_lstm", "H = size / 4", size, 4)
    if bias_attr is False:
        raise ValueError("dynamic_lstm: bias_attr=False: the lstm op needs its Bias")
    hidden_size = size // 4
    helper = LayerHelper("lstm", name=name, param_attr=param_attr, bias_attr=bias_attr)
    dtype = dtypes.dtype_str(input.dtype) if dtype is None else dtype
    if dtypes.dtype_str(input.dtype) != dtypes.dtype_str(dtype):
        raise TypeError(f"dynamic_lstm: input has dtype {input.dtype}: expected dtype={dtype}")
    weight = helper.create_parameter(helper.param_attr, [hidden_size, 4 * hidden_size], dtype)
    bias = helper.create_parameter(helper.bias_attr,
                                   [1, (7 if use_peepholes else 4) * hidden_size], dtype,
                                   is_bias=True)
    inputs = {"Input": [input], "Weight": [weight], "Bias": [bias]}
    for slot, arg, value in (("H0", "h_0", h_0), ("C0", "c_0", c_0)):
        if _state(value, arg, "dynamic_lstm", hidden_size, input.dtype) is not None:
            inputs[slot] = [value]
    outs = {s: helper.create_variable_for_type_inference(dtype)
            for s in ("Hidden", "Cell", "BatchGate", "BatchCellPreAct")}
    helper.append_op("lstm", inputs=inputs, outputs={k: [v] for k, v in outs.items()},
                     attrs={"use_peepholes": bool(use_peepholes), "is_reverse": bool(is_reverse),
                            "gate_activation": gate_activation,
                            "cell_activation": cell_activation,
                            "candidate_activation": candidate_activation})
    return outs["Hidden"], outs["Cell"]


def dynamic_gru(input, size, param_attr=None, bias_attr=None, is_reverse=False,
                gate_activation="sigmoid", candidate_activation="tanh", h_0=None,
                origin_mode=False):
    """Fluid's GRU over each sequence of ``input`` (a LoD tensor ``[-1, 3 * size]``, the three
    gates already projected); ``size`` is the hidden size H. ``h_0`` (``[sequences, H]``)
    starts the sequences; ``origin_mode`` takes ``h = u * h_prev + (1 - u) * c`` (the GRU
    paper's), else ``h = (1 - u) * h_prev + u * c``. ``bias_attr=False``: no bias."""
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"dynamic_gru: size must be a positive int (the hidden size), got "
                         f"{size!r}")
    _rnn_input(input, "dynamic_gru", "H = size", 3 * size, 3)
    helper = LayerHelper("gru", param_attr=param_attr, bias_attr=bias_attr)
    dtype = input.dtype
    weight = helper.create_parameter(helper.param_attr, [size, 3 * size], dtype)
    inputs = {"Input": [input], "Weight": [weight]}
    if bias_attr is not False:
        inputs["Bias"] = [helper.create_parameter(helper.bias_attr, [1, 3 * size], dtype,
                                                  is_bias=True)]
    if _state(h_0, "h_0", "dynamic_gru", size, dtype) is not None:
        inputs["H0"] = [h_0]
    outs = {s: helper.create_variable_for_type_inference(dtype)
            for s in ("Hidden", "BatchGate", "BatchResetHiddenPrev", "BatchHidden")}
    helper.append_op("gru", inputs=inputs, outputs={k: [v] for k, v in outs.items()},
                     attrs={"is_reverse": bool(is_reverse), "gate_activation": gate_activation,
                            "activation": candidate_activation,
                            "origin_mode": bool(origin_mode)})
    return outs["Hidden"]


def sequence_conv(input, num_filters, filter_size=3, filter_stride=1, padding=True,
                  padding_start=None, bias_attr=None, param_attr=None, act=None, name=None):
    """A convolution along each sequence of ``input`` (``[-1, D]``): row ``t`` of the result is
    rows ``t + padding_start ... t + padding_start + filter_size - 1`` of its sequence (zeros
    outside it) times a ``[filter_size * D, num_filters]`` filter, plus a bias, through
    ``act``. ``padding_start`` defaults to ``-(filter_size // 2)`` (centred windows);
    ``padding`` is accepted and ignored, as in Fluid 1.8."""
    check_variable(input, "input", "sequence_conv")
    check_dtype(input, "input", ("float32", "float64"), "sequence_conv")
    if len(input.shape) != 2 or input.shape[1] < 1:
        raise ValueError(f"sequence_conv: input of shape {list(input.shape)}: expected [-1, D] "
                         f"with D known")
    for arg, value in (("num_filters", num_filters), ("filter_size", filter_size)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"sequence_conv: {arg} must be a positive int, got {value!r}")
    if filter_stride != 1:
        raise ValueError(f"sequence_conv: filter_stride={filter_stride!r}: only 1 is supported "
                         f"(as in Fluid)")
    helper = LayerHelper("sequence_conv", name=name, param_attr=param_attr,
                         bias_attr=bias_attr, act=act)
    dtype = input.dtype
    filt = helper.create_parameter(helper.param_attr, [filter_size * input.shape[1],
                                                       num_filters], dtype)
    pre_bias = helper.create_variable_for_type_inference(dtype)
    if padding_start is None:
        padding_start = -int(filter_size // 2)
    helper.append_op("sequence_conv", inputs={"X": [input], "Filter": [filt]},
                     outputs={"Out": [pre_bias]},
                     attrs={"contextStride": int(filter_stride),
                            "contextStart": int(padding_start),
                            "contextLength": int(filter_size)})
    return helper.append_activation(helper.append_bias_op(pre_bias))
