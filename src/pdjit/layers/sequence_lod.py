"""Fluid 1.8's ``sequence_enumerate``, ``sequence_reshape``, ``sequence_slice`` and
``sequence_scatter`` layers (ops in ``pdjit.ops.sequence_fluid``), and the CTC layers ``warpctc``
and ``ctc_greedy_decoder`` (``pdjit.ops.ctc``); each appends the op Fluid 1.8 appends
with Fluid 1.8's arguments. Their sequence inputs carry a one-level LoD."""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["sequence_enumerate", "sequence_reshape", "sequence_slice", "sequence_scatter",
           "warpctc", "ctc_greedy_decoder"]


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
