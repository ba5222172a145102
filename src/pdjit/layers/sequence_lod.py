"""Fluid 1.8's ``sequence_enumerate``, ``sequence_reshape``, ``sequence_slice`` and
``sequence_scatter`` layers: each appends the op of its name (``pdjit.ops.sequence_fluid``)
with Fluid 1.8's arguments. Their sequence inputs carry a one-level LoD."""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["sequence_enumerate", "sequence_reshape", "sequence_slice", "sequence_scatter"]


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
