"""Fluid 1.8's ranking, recommendation and metric-learning losses: ``rank_loss``,
``margin_rank_loss``, ``bpr_loss``, ``teacher_student_sigmoid_loss`` (each appends the op of its
name, see ``pdjit.ops.loss_rank``), the losses Fluid 1.8 composes from other layers:
``npair_loss``, ``mse_loss``, ``dice_loss``; ``label_smooth`` (its own op,
``pdjit.ops.fluid_layer_ops``); and
``hsigmoid`` (``pdjit.ops.hsigmoid``), ``nce`` (``pdjit.ops.nce``), ``sigmoid_focal_loss``
(``pdjit.ops.detection_basic``) and ``center_loss`` (``pdjit.ops.center_loss``).
"""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers import math_ops, nn, shape_ops, tensor
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["rank_loss", "margin_rank_loss", "bpr_loss", "teacher_student_sigmoid_loss",
           "npair_loss", "mse_loss", "dice_loss", "label_smooth", "hsigmoid",
           "nce", "sigmoid_focal_loss", "center_loss"]

_FLOATS = ("float32", "float64")


def _same(layer: str, ref_name: str, ref, **others) -> None:
    check_variable(ref, ref_name, layer)
    check_dtype(ref, ref_name, _FLOATS, layer)
    for name, v in others.items():
        check_variable(v, name, layer)
        if v.dtype != ref.dtype:
            raise TypeError(f"{layer}: argument {name!r} must have {ref_name}'s dtype "
                            f"{ref.dtype}, got {v.dtype}")
        if len(v.shape) != len(ref.shape) or any(a >= 0 and b >= 0 and a != b
                                                 for a, b in zip(v.shape, ref.shape)):
            raise ValueError(f"{layer}: argument {name!r} must have {ref_name}'s shape "
                             f"{list(ref.shape)}, got {list(v.shape)}")


def rank_loss(label, left, right, name=None) -> Variable:
    """RankNet's loss ``log(1 + exp(left - right)) - label * (left - right)``, elementwise
    (``label`` 1 where ``left`` ranks higher, 0 where lower, 0.5 for ties)."""
    _same("rank_loss", "left", left, label=label, right=right)
    helper = LayerHelper("rank_loss", name=name)
    out = helper.create_variable_for_type_inference(left.dtype)
    helper.append_op("rank_loss", inputs={"Label": [label], "Left": [left], "Right": [right]},
                     outputs={"Out": [out]})
    return out


def margin_rank_loss(label, left, right, margin: float = 0.1, name=None) -> Variable:
    """``max(0, margin - label * (left - right))`` elementwise (``label`` +1 or -1)."""
    _same("margin_rank_loss", "left", left, label=label, right=right)
    helper = LayerHelper("margin_rank_loss", name=name)
    out = helper.create_variable_for_type_inference(left.dtype)
    act = helper.create_variable_for_type_inference(left.dtype, stop_gradient=True)
    helper.append_op("margin_rank_loss", inputs={"Label": [label], "X1": [left], "X2": [right]},
                     outputs={"Out": [out], "Activated": [act]},
                     attrs={"margin": float(margin)})
    return out


def bpr_loss(input, label, name=None) -> Variable:
    """Bayesian personalised ranking loss of logits ``input [N, C]`` whose positive class is
    ``label [N, 1]`` (int64): the mean over the other classes ``j`` of
    ``log(1 + exp(input[j] - input[label]))``; ``[N, 1]``."""
    check_variable(input, "input", "bpr_loss")
    check_dtype(input, "input", _FLOATS, "bpr_loss")
    check_variable(label, "label", "bpr_loss")
    check_dtype(label, "label", ("int64",), "bpr_loss")
    helper = LayerHelper("bpr_loss", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("bpr_loss", inputs={"X": [input], "Label": [label]}, outputs={"Y": [out]})
    return out


def teacher_student_sigmoid_loss(input, label, soft_max_up_bound: float = 15.0,
                                 soft_max_lower_bound: float = -15.0) -> Variable:
    """Sigmoid loss of logits ``input [N, 1]`` against a click and an optional teacher value
    encoded in ``label`` (-2: no click; -1: click; ``z'``: teacher value, no click; ``1 + z'``:
    teacher value, click)."""
    _same("teacher_student_sigmoid_loss", "input", input, label=label)
    helper = LayerHelper("teacher_student_sigmoid_loss")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("teacher_student_sigmoid_loss", inputs={"X": [input], "Label": [label]},
                     outputs={"Y": [out]},
                     attrs={"soft_max_up_bound": float(soft_max_up_bound),
                            "soft_max_lower_bound": float(soft_max_lower_bound)})
    return out


def npair_loss(anchor, positive, labels, l2_reg: float = 0.002) -> Variable:
    """N-pair loss (Sohn, 2016) of embeddings ``anchor`` and ``positive`` (``[B, D]``) with
    class ``labels`` (``[B]``): the soft-label cross entropy of each row of
    ``anchor @ positive^T`` against the rows' same-class indicators (normalised per row),
    weighted as Fluid 1.8 weighs it, plus ``l2_reg / 4`` times the mean squared norms of both
    embeddings. The batch size must be known when the program is built."""
    layer = "npair_loss"
    _same(layer, "anchor", anchor, positive=positive)
    check_variable(labels, "labels", layer)
    if len(anchor.shape) != 2:
        raise ValueError(f"{layer}: argument 'anchor' must be [batch_size, dims], got "
                         f"{list(anchor.shape)}")
    b = labels.shape[0] if labels.shape else -1
    if b < 0:
        raise ValueError(f"{layer}: the batch size (labels.shape[0]) must be known when the "
                         f"program is built, got {list(labels.shape)}")
    lab = shape_ops.reshape(labels, [b, 1])
    lab = shape_ops.expand(lab, [1, b])
    same = math_ops.equal(lab, shape_ops.transpose(lab, [1, 0]))
    target = tensor.cast(same, anchor.dtype)
    target = math_ops.elementwise_div(target, shape_ops.reduce_sum(target, dim=1, keep_dim=True))
    l2 = math_ops.elementwise_add(
        shape_ops.reduce_mean(shape_ops.reduce_sum(math_ops.square(anchor), dim=1)),
        shape_ops.reduce_mean(shape_ops.reduce_sum(math_ops.square(positive), dim=1)))
    l2 = math_ops.scale(l2, scale=0.25 * float(l2_reg))
    sim = nn.matmul(anchor, positive, transpose_y=True)
    ce = nn.softmax_with_cross_entropy(sim, target, soft_label=True)
    ce = shape_ops.reduce_mean(shape_ops.reduce_sum(math_ops.elementwise_mul(target, ce), dim=0))
    return math_ops.elementwise_add(l2, ce)


def mse_loss(input, label) -> Variable:
    """The mean of ``(input - label) ** 2`` over every element."""
    _same("mse_loss", "input", input, label=label)
    return shape_ops.reduce_mean(nn.square_error_cost(input, label))


def dice_loss(input, label, epsilon: float = 0.00001, name=None) -> Variable:
    """``1 - 2 |input * onehot(label)| / (|input| + |onehot(label)| + epsilon)`` per sample
    (sums over every axis but the first), averaged over the batch. ``input`` holds class
    probabilities on its last axis; ``label`` the class indices (last axis 1)."""
    layer = "dice_loss"
    check_variable(input, "input", layer)
    check_dtype(input, "input", _FLOATS, layer)
    check_variable(label, "label", layer)
    check_dtype(label, "label", ("int32", "int64"), layer)
    if len(input.shape) < 2 or len(label.shape) != len(input.shape) or label.shape[-1] != 1:
        raise ValueError(f"{layer}: expected input [N, ..., D] and label [N, ..., 1] of one "
                         f"rank, got {list(input.shape)} and {list(label.shape)}")
    depth = input.shape[-1]
    if depth < 0:
        raise ValueError(f"{layer}: the class count (input.shape[-1]) must be known, got "
                         f"{list(input.shape)}")
    ids = shape_ops.squeeze(label, [len(label.shape) - 1])
    onehot = tensor.cast(shape_ops.one_hot_v2(ids, depth), input.dtype)
    axes = list(range(1, len(input.shape)))
    inter = shape_ops.reduce_sum(math_ops.elementwise_mul(input, onehot), dim=axes)
    total = math_ops.elementwise_add(shape_ops.reduce_sum(input, dim=axes),
                                     shape_ops.reduce_sum(onehot, dim=axes))
    total = math_ops.scale(total, bias=float(epsilon))
    score = math_ops.scale(math_ops.elementwise_div(inter, total), scale=-2.0, bias=1.0)
    return shape_ops.reduce_mean(score)


def label_smooth(label, prior_dist=None, epsilon: float = 0.1, dtype="float32",
                 name=None) -> Variable:
    """``(1 - epsilon) * label + epsilon * prior`` with ``prior`` the uniform distribution over
    the last axis (``1 / depth``) or ``prior_dist`` (``[1, depth]``)."""
    check_variable(label, "label", "label_smooth")
    check_dtype(label, "label", _FLOATS, "label_smooth")
    if not 0.0 <= float(epsilon) <= 1.0:
        raise ValueError(f"label_smooth: argument 'epsilon' must be in [0, 1], got {epsilon}")
    eps = float(epsilon)
    if prior_dist is None:
        depth = label.shape[-1]
        if depth < 0:
            raise ValueError(f"label_smooth: the class count (label.shape[-1]) must be known, "
                             f"got {list(label.shape)}")
    else:
        check_variable(prior_dist, "prior_dist", "label_smooth")
    helper = LayerHelper("label_smooth", name=name)
    out = helper.create_variable_for_type_inference(label.dtype)
    inputs = {"X": [label]}
    if prior_dist is not None:
        inputs["PriorDist"] = [prior_dist]
    helper.append_op("label_smooth", inputs=inputs, outputs={"Out": [out]},
                     attrs={"epsilon": eps})
    return out


def hsigmoid(input, label, num_classes, param_attr=None, bias_attr=None, name=None,
             path_table=None, path_code=None, is_custom=False, is_sparse=False) -> Variable:
    """Hierarchical sigmoid loss (``[N, 1]``) of ``input [N, D]`` for classes ``label [N, 1]``
    (int64) over the default binary tree of ``num_classes`` leaves (``num_classes - 1`` learnt
    nodes), or over a custom tree (``is_custom``: ``path_table`` / ``path_code`` ``[N, L]``
    int64 give each sample's node rows, ended by -1, and bits; ``num_classes`` nodes).
    Parameters: ``W [nodes, D]`` and, unless ``bias_attr`` is False, ``Bias [nodes, 1]``."""
    layer = "hsigmoid"
    check_variable(input, "input", layer)
    check_dtype(input, "input", _FLOATS, layer)
    check_variable(label, "label", layer)
    check_dtype(label, "label", ("int64",), layer)
    if is_custom != (path_table is not None) or (path_table is None) != (path_code is None):
        raise ValueError(f"{layer}: a custom tree needs is_custom=True with both path_table and "
                         f"path_code; the default tree none of them")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"{layer}: argument 'num_classes' must be an int >= 2, got "
                         f"{num_classes!r}")
    if len(input.shape) != 2 or input.shape[1] < 0:
        raise ValueError(f"{layer}: expected input [N, D] with D known, got {list(input.shape)}")
    nodes = num_classes if is_custom else num_classes - 1
    helper = LayerHelper(layer, name=name, param_attr=param_attr, bias_attr=bias_attr)
    w = helper.create_parameter(helper.param_attr, [nodes, input.shape[1]], input.dtype)
    inputs = {"X": [input], "W": [w], "Label": [label]}
    if is_custom:
        inputs.update(PathTable=[path_table], PathCode=[path_code])
    if bias_attr is not False:
        inputs["Bias"] = [helper.create_parameter(helper.bias_attr, [nodes, 1], input.dtype,
                                                  is_bias=True)]
    out = helper.create_variable_for_type_inference(input.dtype)
    pre = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    helper.append_op("hierarchical_sigmoid", inputs=inputs,
                     outputs={"Out": [out], "PreOut": [pre]},
                     attrs={"num_classes": int(num_classes), "is_sparse": bool(is_sparse)})
    return out


_SAMPLERS = {"uniform": 0, "log_uniform": 1}


def nce(input, label, num_total_classes, sample_weight=None, param_attr=None, bias_attr=None,
        num_neg_samples=None, name=None, sampler="uniform", custom_dist=None, seed=0,
        is_sparse=False) -> Variable:
    """Noise-contrastive estimation loss of ``input [N, D]`` for the true classes ``label
    [N, num_true]`` (int64) against ``num_neg_samples`` (default 10) classes drawn by
    ``sampler`` ('uniform' or 'log_uniform'), divided by ``num_neg_samples + 1`` as Fluid 1.8
    returns it: ``[N, 1]``. Parameters ``W [num_total_classes, D]`` and (unless ``bias_attr``
    is False) ``b [num_total_classes, 1]``; ``seed`` fixes the draws."""
    layer = "nce"
    check_variable(input, "input", layer)
    check_dtype(input, "input", _FLOATS, layer)
    check_variable(label, "label", layer)
    check_dtype(label, "label", ("int64",), layer)
    if sampler not in _SAMPLERS or custom_dist is not None:
        raise ValueError(f"{layer}: argument 'sampler' must be 'uniform' or 'log_uniform' "
                         f"(custom_dist is not supported), got {sampler!r}")
    if len(input.shape) != 2 or input.shape[1] < 0 or len(label.shape) != 2:
        raise ValueError(f"{layer}: expected input [N, D] with D known and label [N, num_true], "
                         f"got {list(input.shape)} and {list(label.shape)}")
    neg = 10 if num_neg_samples is None else int(num_neg_samples)
    helper = LayerHelper(layer, name=name, param_attr=param_attr, bias_attr=bias_attr)
    w = helper.create_parameter(helper.param_attr, [num_total_classes, input.shape[1]],
                                input.dtype)
    inputs = {"Input": [input], "Label": [label], "Weight": [w]}
    if bias_attr is not False:
        inputs["Bias"] = [helper.create_parameter(helper.bias_attr, [num_total_classes, 1],
                                                  input.dtype, is_bias=True)]
    if sample_weight is not None:
        check_variable(sample_weight, "sample_weight", layer)
        inputs["SampleWeight"] = [sample_weight]
    cost = helper.create_variable_for_type_inference(input.dtype)
    logits = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    labels = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("nce", inputs=inputs,
                     outputs={"Cost": [cost], "SampleLogits": [logits],
                              "SampleLabels": [labels]},
                     attrs={"num_total_classes": int(num_total_classes), "num_neg_samples": neg,
                            "sampler": _SAMPLERS[sampler], "seed": int(seed),
                            "is_sparse": bool(is_sparse)})
    return math_ops.scale(cost, scale=1.0 / (neg + 1))


def sigmoid_focal_loss(x, label, fg_num, gamma=2.0, alpha=0.25) -> Variable:
    """RetinaNet's focal loss of per-class logits ``x [N, C]`` for labels ``label [N, 1]``
    (int32; 0 background, ``c`` class ``c - 1``, -1 ignored), normalised by ``fg_num`` (int32
    ``[1]``): ``[N, C]``."""
    layer = "sigmoid_focal_loss"
    check_variable(x, "x", layer)
    check_dtype(x, "x", _FLOATS, layer)
    for arg, v in (("label", label), ("fg_num", fg_num)):
        check_variable(v, arg, layer)
        check_dtype(v, arg, ("int32",), layer)
    helper = LayerHelper(layer)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(layer, inputs={"X": [x], "Label": [label], "FgNum": [fg_num]},
                     outputs={"Out": [out]}, attrs={"gamma": float(gamma), "alpha": float(alpha)})
    return out


def center_loss(input, label, num_classes, alpha, param_attr, update_center=True) -> Variable:
    """Half the squared distance of each row of ``input [N, D]`` to the centre of its class
    (``label [N, 1]`` int): ``[N, 1]``. The centres (``[num_classes, D]``, a parameter made from
    ``param_attr``, not trained by the optimizer) move towards their samples by ``alpha`` (a
    number or a ``[1]`` Variable) each run when ``update_center``."""
    layer = "center_loss"
    check_variable(input, "input", layer)
    check_dtype(input, "input", _FLOATS, layer)
    check_variable(label, "label", layer)
    check_dtype(label, "label", ("int32", "int64"), layer)
    if len(input.shape) != 2 or input.shape[1] < 0:
        raise ValueError(f"{layer}: expected input [N, D] with D known, got {list(input.shape)}")
    helper = LayerHelper(layer, param_attr=param_attr)
    centers = helper.create_parameter(helper.param_attr, [int(num_classes), input.shape[1]],
                                      input.dtype)
    centers.stop_gradient = True
    if isinstance(alpha, Variable):
        rate = alpha
    else:
        rate = tensor.create_global_var([1], float(alpha), input.dtype, persistable=True,
                                        name="centerloss_alpha")
    diff = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    loss = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op(layer, inputs={"X": [input], "Label": [label], "Centers": [centers],
                                    "CenterUpdateRate": [rate]},
                     outputs={"SampleCenterDiff": [diff], "Loss": [loss],
                              "CentersOut": [centers]},
                     attrs={"cluster_num": int(num_classes), "need_update": bool(update_center)})
    return loss
