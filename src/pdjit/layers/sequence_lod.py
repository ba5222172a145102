"""Fluid 1.8's ``sequence_enumerate``, ``sequence_reshape``, ``sequence_slice``,
``sequence_scatter``, ``im2sequence``, ``row_conv`` and ``add_position_encoding`` layers (ops in
``pdjit.ops.sequence_fluid``), and the CTC layers ``warpctc`` and ``ctc_greedy_decoder``
(``pdjit.ops.ctc``): each appends the op Fluid 1.8 appends, with Fluid 1.8's arguments. Their
sequence inputs carry a one-level LoD."""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["sequence_enumerate", "sequence_reshape", "sequence_slice", "sequence_scatter",
           "warpctc", "ctc_greedy_decoder", "im2sequence", "row_conv", "add_position_encoding"]


def _positive_int(value, arg: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{layer}: argument {arg!r} must be a positive int, got {value!r}")
    return value


def sequence_enumerate(input, win_size, pad_value=0, name=None) -> Variable:
    """For each row ``t`` of a sequence of ids (``[N, 1]``, int32/int64), the ``win_size`` ids
    from ``t`` on, ``pad_value`` past the sequence's end: ``[N, win_size]``, same LoD."""
    check_variable(input, "input", "sequence_enumerate")
    check_dtype(input, "input", ("int32", "int64"), "sequence_enumerate")
    helper = LayerHelper("sequence_enumerate", name=name)
    out = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    helper.append_op("sequence_enumerate", inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"win_size": _positive_int(win_size, "win_size",
                                                      "sequence_enumerate"),
                            "pad_value": int(pad_value)})
    return out


def sequence_reshape(input, new_dim) -> Variable:
    """Each sequence of ``input`` (``[N, D]``) re-cut into rows of ``new_dim`` values."""
    check_variable(input, "input", "sequence_reshape")
    helper = LayerHelper("sequence_reshape")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("sequence_reshape", inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"new_dim": _positive_int(new_dim, "new_dim", "sequence_reshape")})
    return out


def sequence_slice(input, offset, length, name=None) -> Variable:
    """Rows ``offset[i] .. offset[i] + length[i] - 1`` of each sequence ``i`` of ``input``
    (``offset``, ``length``: ``[num_sequences, 1]`` int64 Variables)."""
    check_variable(input, "input", "sequence_slice")
    for arg, v in (("offset", offset), ("length", length)):
        check_variable(v, arg, "sequence_slice")
        check_dtype(v, arg, ("int64",), "sequence_slice")
    helper = LayerHelper("sequence_slice", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("sequence_slice",
                     inputs={"X": [input], "Offset": [offset], "Length": [length]},
                     outputs={"Out": [out]})
    return out


def sequence_scatter(input, index, updates, name=None) -> Variable:
    """``input`` (``[S, D]``) with ``updates[j]`` added at column ``index[j]`` of row ``i`` for
    each row ``j`` of ``index``'s sequence ``i`` (``index``, ``updates``: ``[M, 1]``, one-level
    LoD with ``S`` sequences)."""
    check_variable(input, "input", "sequence_scatter")
    check_variable(index, "index", "sequence_scatter")
    check_dtype(index, "index", ("int64",), "sequence_scatter")
    check_variable(updates, "updates", "sequence_scatter")
    helper = LayerHelper("sequence_scatter", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("sequence_scatter",
                     inputs={"X": [input], "Ids": [index], "Updates": [updates]},
                     outputs={"Out": [out]})
    return out


def _lod_only(layer: str, **lengths) -> None:
    given = [k for k, v in lengths.items() if v is not None]
    if given:
        raise ValueError(f"{layer}: the padded form ({', '.join(given)}) is not supported; "
                         f"give LoD tensors (lod_level=1)")


def warpctc(input, label, blank: int = 0, norm_by_times: bool = False, input_length=None,
            label_length=None) -> Variable:
    """The CTC loss of each sequence: ``-log p(label | softmax(input))`` over every alignment;
    ``input`` ``[T, num_classes + 1]`` unnormalised logits, ``label`` ``[L, 1]`` int32 class
    ids (both one-level LoD). Returns ``[num_sequences, 1]``. ``norm_by_times`` divides each
    sequence's gradient by its length."""
    _lod_only("warpctc", input_length=input_length, label_length=label_length)
    check_variable(input, "input", "warpctc")
    check_dtype(input, "input", ("float32", "float64"), "warpctc")
    check_variable(label, "label", "warpctc")
    check_dtype(label, "label", ("int32", "int64"), "warpctc")
    helper = LayerHelper("warpctc")
    grad = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    loss = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("warpctc", inputs={"Logits": [input], "Label": [label]},
                     outputs={"WarpCTCGrad": [grad], "Loss": [loss]},
                     attrs={"blank": int(blank), "norm_by_times": bool(norm_by_times)})
    return loss


def ctc_greedy_decoder(input, blank: int, input_length=None, padding_value: int = 0,
                       name=None) -> Variable:
    """Greedy CTC decoding of per-step class scores ``input`` ``[T, num_classes + 1]``
    (one-level LoD): the best class of each step, repeats merged, blanks removed; an int64
    ``[N, 1]`` LoD tensor of the decoded ids."""
    _lod_only("ctc_greedy_decoder", input_length=input_length)
    check_variable(input, "input", "ctc_greedy_decoder")
    from pdjit.layers.shape_ops import topk

    _, ids = topk(input, k=1)
    helper = LayerHelper("ctc_greedy_decoder", name=name)
    out = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("ctc_align", inputs={"Input": [ids]}, outputs={"Output": [out]},
                     attrs={"blank": int(blank), "merge_repeated": True,
                            "padding_value": int(padding_value)})
    return out


def _pair(value, arg: str, layer: str) -> list:
    v = [value, value] if isinstance(value, int) and not isinstance(value, bool) else list(value)
    if len(v) != 2 or not all(isinstance(i, int) and i >= 0 for i in v):
        raise ValueError(f"{layer}: argument {arg!r} must be an int or a pair of ints >= 0, got "
                         f"{value!r}")
    return v


def im2sequence(input, filter_size=1, stride=1, padding=0, input_image_size=None,
                out_stride=1, name=None) -> Variable:
    """Each image of ``input`` (``[N, C, H, W]``) as one sequence of its ``filter_size``
    patches (moved by ``stride`` over the image padded by ``padding``: an int, a pair (height,
    width) or four values (up, left, down, right)): ``[N * oh * ow, C * fh * fw]``."""
    layer = "im2sequence"
    check_variable(input, "input", layer)
    if input_image_size is not None:
        raise ValueError(f"{layer}: argument 'input_image_size' (per-image real sizes) is not "
                         f"supported")
    kernels, strides = _pair(filter_size, "filter_size", layer), _pair(stride, "stride", layer)
    if isinstance(padding, int) and not isinstance(padding, bool):
        paddings = [padding] * 4
    elif len(padding) == 2:
        paddings = [padding[0], padding[1], padding[0], padding[1]]
    elif len(padding) == 4:
        paddings = list(padding)
    else:
        raise ValueError(f"{layer}: argument 'padding' must be an int, 2 or 4 ints, got "
                         f"{padding!r}")
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op(layer, inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"kernels": kernels, "strides": strides, "paddings": paddings,
                            "out_stride": _pair(out_stride, "out_stride", layer)})
    return out


def row_conv(input, future_context_size: int, param_attr=None, act=None) -> Variable:
    """Lookahead convolution over each sequence of ``input`` (``[T, D]``): row ``t`` becomes
    ``sum_k input[t + k] * w[k]`` for ``k <= future_context_size`` (rows past the sequence's end
    count 0), with a learnt ``w`` of shape ``[future_context_size + 1, D]``."""
    check_variable(input, "input", "row_conv")
    check_dtype(input, "input", ("float32", "float64"), "row_conv")
    if isinstance(future_context_size, bool) or not isinstance(future_context_size, int) \
            or future_context_size < 0:
        raise ValueError(f"row_conv: argument 'future_context_size' must be an int >= 0, got "
                         f"{future_context_size!r}")
    if len(input.shape) != 2 or input.shape[1] < 0:
        raise ValueError(f"row_conv: expected input [T, D] with D known, got "
                         f"{list(input.shape)}")
    helper = LayerHelper("row_conv", param_attr=param_attr, act=act)
    filt = helper.create_parameter(helper.param_attr, [future_context_size + 1, input.shape[1]],
                                   input.dtype)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("row_conv", inputs={"X": [input], "Filter": [filt]},
                     outputs={"Out": [out]})
    return helper.append_activation(out)


def add_position_encoding(input, alpha, beta, name=None) -> Variable:
    """``alpha * input + beta * PE`` with the sinusoidal position encoding ``PE`` of each
    position (axis 1 of ``[N, T, D]``, or the rows of each sequence of a LoD ``[T, D]``)."""
    check_variable(input, "input", "add_position_encoding")
    check_dtype(input, "input", ("float32", "float64"), "add_position_encoding")
    helper = LayerHelper("add_position_encoding", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("add_position_encoding", inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"alpha": float(alpha), "beta": float(beta)})
    return out
