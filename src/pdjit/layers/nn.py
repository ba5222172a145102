"""Neural-network layers in the Fluid 1.x style: fc, matmul, softmax, losses, dropout, embedding.

Each function appends the ops PaddlePaddle's legacy layers append (same op types, slots and
attributes, as checked against PaddlePaddle) to the default main program, creating parameters and
their initialisers through :class:`LayerHelper`, and returns the result Variable(s).
"""
from __future__ import annotations

import numbers

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable
from pdjit.layers.param_attr import ParamAttr

__all__ = ["fc", "matmul", "mul", "softmax", "cross_entropy", "softmax_with_cross_entropy",
           "square_error_cost", "accuracy", "dropout", "embedding"]

_FLOATS = ("float16", "float32", "float64")
_IDS = ("int32", "int64")


def _inputs(input, layer: str) -> list:
    items = list(input) if isinstance(input, (list, tuple)) else [input]
    if not items:
        raise ValueError(f"{layer}: 'input' must not be empty")
    for x in items:
        check_variable(x, "input", layer)
    return items


def _param_attrs(param_attr, n: int, layer: str) -> list:
    """One ParamAttr per input: a list is taken as it is, a single attr is used for all."""
    attrs = ParamAttr._to_attr(param_attr, layer, "param_attr")
    if isinstance(attrs, list):
        if len(attrs) != n:
            raise ValueError(f"{layer}: expected {n} param_attr (one per input), got "
                             f"{len(attrs)}")
        return attrs
    return [attrs] * n


# ---- fc ----------------------------------------------------------------------------------------
def fc(input, size, num_flatten_dims=1, param_attr=None, bias_attr=None, act=None, name=None):
    """Fully connected: ``act(sum_i(flatten(input_i) @ w_i) + b)``.

    Emitted as Fluid 1.x does: one ``mul`` per input (weights ``fc_N.w_i``), a ``sum`` when there
    are several, ``elementwise_add`` of the bias ``fc_N.b_0`` with ``axis=num_flatten_dims``,
    then the activation op.
    """
    inputs = _inputs(input, "fc")
    if not isinstance(size, numbers.Integral) or size <= 0:
        raise ValueError(f"fc: size must be a positive int, got {size!r}")
    helper = LayerHelper("fc", input=inputs, size=size, num_flatten_dims=num_flatten_dims,
                         param_attr=param_attr, bias_attr=bias_attr, act=act, name=name)
    dtype = helper.input_dtype()
    for x in inputs:
        check_dtype(x, "input", _FLOATS, "fc")
    results = []
    for x, attr in zip(inputs, _param_attrs(param_attr, len(inputs), "fc")):
        nfd = len(x.shape) - 1 if num_flatten_dims == -1 else num_flatten_dims
        if not 1 <= nfd < len(x.shape):
            raise ValueError(f"fc: num_flatten_dims={num_flatten_dims} does not fit input "
                             f"{x.name!r} of shape {list(x.shape)}: expected 1 <= "
                             f"num_flatten_dims < {len(x.shape)} (or -1)")
        feature = list(x.shape[nfd:])
        if any(d < 0 for d in feature):
            raise ValueError(f"fc: input {x.name!r} of shape {list(x.shape)} has unknown dims "
                             f"after num_flatten_dims={nfd}: expected them known to size the "
                             f"weight")
        in_features = 1
        for d in feature:
            in_features *= int(d)
        w = helper.create_parameter(attr, [in_features, int(size)], dtype, is_bias=False)
        tmp = helper.create_variable_for_type_inference(dtype)
        helper.append_op("mul", inputs={"X": [x], "Y": [w]}, outputs={"Out": [tmp]},
                         attrs={"x_num_col_dims": nfd, "y_num_col_dims": 1})
        results.append(tmp)
    if len(results) == 1:
        pre_bias = results[0]
    else:
        pre_bias = helper.create_variable_for_type_inference(dtype)
        helper.append_op("sum", inputs={"X": results}, outputs={"Out": [pre_bias]})
    # the bias covers the dims after num_flatten_dims, i.e. [size]
    nfd = len(results[0].shape) - 1
    pre_act = helper.append_bias_op(pre_bias, dim_start=nfd)
    return helper.append_activation(pre_act, act)


# ---- products ----------------------------------------------------------------------------------
def matmul(x, y, transpose_x=False, transpose_y=False, alpha=1.0, name=None):
    """``alpha * op(x) @ op(y)`` over the last two dims (the legacy ``matmul`` op)."""
    check_variable(x, "x", "matmul")
    check_variable(y, "y", "matmul")
    helper = LayerHelper("matmul", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("matmul", inputs={"X": [x], "Y": [y]}, outputs={"Out": [out]},
                     attrs={"transpose_X": bool(transpose_x), "transpose_Y": bool(transpose_y),
                            "alpha": float(alpha)})
    return out


def mul(x, y, x_num_col_dims=1, y_num_col_dims=1, name=None):
    """``flatten(x, x_num_col_dims) @ flatten(y, y_num_col_dims)`` (the ``mul`` op)."""
    check_variable(x, "x", "mul")
    check_variable(y, "y", "mul")
    helper = LayerHelper("mul", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("mul", inputs={"X": [x], "Y": [y]}, outputs={"Out": [out]},
                     attrs={"x_num_col_dims": int(x_num_col_dims),
                            "y_num_col_dims": int(y_num_col_dims)})
    return out


# ---- softmax and losses ------------------------------------------------------------------------
def softmax(input, use_cudnn=False, name=None, axis=-1):
    """Softmax along ``axis`` (Fluid 1.8's signature; ``use_cudnn`` is accepted and ignored)."""
    check_variable(input, "input", "softmax")
    check_dtype(input, "input", _FLOATS, "softmax")
    helper = LayerHelper("softmax", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("softmax", inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"axis": int(axis)})
    return out


def cross_entropy(input, label, soft_label=False, ignore_index=-100):
    """Cross entropy of probabilities ``input`` against ``label``.

    As in Fluid 1.x: hard labels emit ``cross_entropy2`` (with its XShape and MatchX
    intermediates), soft labels emit ``cross_entropy``.
    """
    check_variable(input, "input", "cross_entropy")
    check_variable(label, "label", "cross_entropy")
    check_dtype(input, "input", _FLOATS, "cross_entropy")
    if not soft_label:
        helper = LayerHelper("cross_entropy2")
        out = helper.create_variable_for_type_inference(input.dtype)
        xshape = helper.create_variable_for_type_inference(input.dtype)
        match_x = helper.create_variable_for_type_inference(input.dtype)
        helper.append_op("cross_entropy2", inputs={"X": [input], "Label": [label]},
                         outputs={"Y": [out], "MatchX": [match_x], "XShape": [xshape]},
                         attrs={"ignore_index": int(ignore_index)})
        return out
    helper = LayerHelper("cross_entropy")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("cross_entropy", inputs={"X": [input], "Label": [label]},
                     outputs={"Y": [out]},
                     attrs={"soft_label": True, "ignore_index": int(ignore_index)})
    return out


def softmax_with_cross_entropy(logits, label, soft_label=False, ignore_index=-100,
                               numeric_stable_mode=True, return_softmax=False, axis=-1):
    """Loss of ``softmax(logits)`` against ``label``; ``(loss, softmax)`` if return_softmax."""
    check_variable(logits, "logits", "softmax_with_cross_entropy")
    check_variable(label, "label", "softmax_with_cross_entropy")
    check_dtype(logits, "logits", _FLOATS, "softmax_with_cross_entropy")
    helper = LayerHelper("softmax_with_cross_entropy")
    sm = helper.create_variable_for_type_inference(logits.dtype)
    loss = helper.create_variable_for_type_inference(logits.dtype)
    helper.append_op("softmax_with_cross_entropy", inputs={"Logits": [logits], "Label": [label]},
                     outputs={"Softmax": [sm], "Loss": [loss]},
                     attrs={"soft_label": bool(soft_label), "ignore_index": int(ignore_index),
                            "numeric_stable_mode": bool(numeric_stable_mode),
                            "axis": int(axis)})
    return (loss, sm) if return_softmax else loss


def square_error_cost(input, label):
    """``(input - label) ** 2`` elementwise: ``elementwise_sub`` then ``square`` (not an op)."""
    check_variable(input, "input", "square_error_cost")
    check_variable(label, "label", "square_error_cost")
    helper = LayerHelper("square_error_cost")
    minus = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("elementwise_sub", inputs={"X": [input], "Y": [label]},
                     outputs={"Out": [minus]})
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("square", inputs={"X": [minus]}, outputs={"Out": [out]})
    return out


def accuracy(input, label, k=1, correct=None, total=None):
    """Top-k accuracy: ``top_k_v2(k, sorted=False)`` then ``accuracy`` (a float32 of shape [1])."""
    check_variable(input, "input", "accuracy")
    check_variable(label, "label", "accuracy")
    check_dtype(input, "input", _FLOATS, "accuracy")
    helper = LayerHelper("accuracy")
    topk_out = helper.create_variable_for_type_inference(input.dtype)
    topk_idx = helper.create_variable_for_type_inference("int64")
    inputs, attrs = {"X": [input]}, {"sorted": False}
    if isinstance(k, Variable):
        inputs["K"] = [k]
    else:
        attrs["k"] = int(k)
    helper.append_op("top_k_v2", inputs=inputs, outputs={"Out": [topk_out],
                                                         "Indices": [topk_idx]}, attrs=attrs)
    acc = helper.create_variable_for_type_inference("float32")
    correct = correct if correct is not None else helper.create_variable_for_type_inference("int32")
    total = total if total is not None else helper.create_variable_for_type_inference("int32")
    helper.append_op("accuracy", inputs={"Out": [topk_out], "Indices": [topk_idx],
                                         "Label": [label]},
                     outputs={"Accuracy": [acc], "Correct": [correct], "Total": [total]})
    return acc


# ---- dropout and embedding ---------------------------------------------------------------------
def dropout(x, dropout_prob, is_test=False, seed=None, name=None,
            dropout_implementation="downgrade_in_infer"):
    """Zero each element with probability ``dropout_prob`` (scaled per the implementation).

    As in Fluid 1.x, a non-zero ``Program.random_seed`` fixes the seed when none is given, so
    every run draws the same mask.
    """
    check_variable(x, "x", "dropout")
    check_dtype(x, "x", _FLOATS, "dropout")
    if isinstance(dropout_prob, bool) or not isinstance(dropout_prob, numbers.Real) or \
            not 0 <= dropout_prob <= 1:
        raise ValueError(f"dropout: dropout_prob must be a number in [0, 1], got "
                         f"{dropout_prob!r}")
    if dropout_implementation not in ("downgrade_in_infer", "upscale_in_train"):
        raise ValueError(f"dropout: dropout_implementation must be 'downgrade_in_infer' or "
                         f"'upscale_in_train', got {dropout_implementation!r}")
    helper = LayerHelper("dropout", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    mask = helper.create_variable_for_type_inference("uint8", stop_gradient=True)
    if not seed and helper.main_program.random_seed:
        seed = helper.main_program.random_seed
    helper.append_op("dropout", inputs={"X": [x]}, outputs={"Out": [out], "Mask": [mask]},
                     attrs={"dropout_prob": float(dropout_prob), "is_test": bool(is_test),
                            "fix_seed": seed is not None, "seed": int(seed or 0),
                            "dropout_implementation": dropout_implementation})
    return out


def embedding(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
              param_attr=None, dtype="float32"):
    """Fluid 1.x's ``layers.embedding``: rows of a ``size = [vocab, width]`` table
    ``embedding_N.w_0`` picked by the ids ``input``, whose last dim is 1 as Fluid 1.x asks:
    ``lookup_table``, with shape ``input.shape[:-1] + [width]``. Ids of another last dim are
    looked up as ``fluid.embedding`` does (``lookup_table_v2``, ``input.shape + [width]``). A
    negative ``padding_idx`` counts from the end of the vocabulary; that id's rows are zeros.
    """
    shape = getattr(input, "shape", ())
    v1 = len(shape) > 0 and shape[-1] == 1
    return _embedding("lookup_table" if v1 else "lookup_table_v2", input, size, is_sparse,
                      is_distributed, padding_idx, param_attr, dtype)


def embedding_v2(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
                 param_attr=None, dtype="float32"):
    """``fluid.embedding`` (Fluid 1.8's newer spelling): ``lookup_table_v2``, shape
    ``input.shape + [width]`` whatever ``input``'s last dim."""
    return _embedding("lookup_table_v2", input, size, is_sparse, is_distributed, padding_idx,
                      param_attr, dtype)


def _embedding(op_type, input, size, is_sparse, is_distributed, padding_idx, param_attr,
               dtype):
    check_variable(input, "input", "embedding")
    check_dtype(input, "input", _IDS, "embedding")
    if not isinstance(size, (list, tuple)) or len(size) != 2 or \
            not all(isinstance(d, numbers.Integral) and d > 0 for d in size):
        raise ValueError(f"embedding: size must be [vocab_size, width] of positive ints, got "
                         f"{size!r}")
    vocab = int(size[0])
    if padding_idx is None:
        padding_idx = -1
    elif not -vocab <= padding_idx < vocab:
        raise ValueError(f"embedding: padding_idx={padding_idx} is out of range: expected "
                         f"-{vocab} <= padding_idx < {vocab}")
    elif padding_idx < 0:
        padding_idx += vocab
    helper = LayerHelper("embedding", param_attr=param_attr)
    w = helper.create_parameter(helper.param_attr, [vocab, int(size[1])], dtype, is_bias=False)
    out = helper.create_variable_for_type_inference(dtype)
    helper.append_op(op_type, inputs={"Ids": [input], "W": [w]},
                     outputs={"Out": [out]},
                     attrs={"is_sparse": bool(is_sparse), "is_distributed": bool(is_distributed),
                            "remote_prefetch": bool(is_sparse) and not is_distributed,
                            "padding_idx": int(padding_idx)})
    return out
