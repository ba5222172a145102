"""Loss layers of Fluid 1.8: ``sigmoid_cross_entropy_with_logits``, ``huber_loss``,
``smooth_l1``, ``kldiv_loss``, ``log_loss``, ``cos_sim``, and 2.x's ``bce_loss`` (accepted as
Fluid users meet it).

Each appends the legacy op of the same name (``smooth_l1`` appends ``smooth_l1_loss``) with
Fluid 1.8's arguments and defaults; see ``pdjit.ops.loss`` for the semantics.
"""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["sigmoid_cross_entropy_with_logits", "bce_loss", "huber_loss", "smooth_l1",
           "kldiv_loss", "log_loss", "cos_sim"]

_FLOATS = ("float16", "float32", "float64")
_REDUCTIONS = ("none", "batchmean", "mean", "sum")


def _check_pair(x, y, xname: str, yname: str, layer: str) -> None:
    check_variable(x, xname, layer)
    check_variable(y, yname, layer)
    check_dtype(x, xname, _FLOATS, layer)
    if y.dtype != x.dtype:
        raise TypeError(f"{layer}: argument {yname!r} must have {xname}'s dtype {x.dtype}, got "
                        f"{y.dtype}")
    if len(x.shape) != len(y.shape) or any(a >= 0 and b >= 0 and a != b
                                           for a, b in zip(x.shape, y.shape)):
        raise ValueError(f"{layer}: {xname} and {yname} must have one shape, got "
                         f"{list(x.shape)} and {list(y.shape)}")


def sigmoid_cross_entropy_with_logits(x, label, ignore_index=-100, name=None,
                                      normalize=False, pos_weight=None) -> Variable:
    """Elementwise ``softplus(x) - x * label`` (logits ``x``, labels in [0, 1]); 0 where the
    label is ``ignore_index``; ``normalize`` divides by the number of labels kept.
    ``pos_weight`` (Paddle 2.x's ``binary_cross_entropy_with_logits``) weighs the log term."""
    layer = "sigmoid_cross_entropy_with_logits"
    _check_pair(x, label, "x", "label", layer)
    inputs = {"X": [x], "Label": [label]}
    if pos_weight is not None:
        _check_pair(x, pos_weight, "x", "pos_weight", layer)
        inputs["pos_weight"] = [pos_weight]
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(layer, inputs=inputs, outputs={"Out": [out]},
                     attrs={"ignore_index": int(ignore_index), "normalize": bool(normalize)})
    return out


def bce_loss(input, label, name=None) -> Variable:
    """Binary cross entropy of probabilities ``input`` (in [0, 1]) against ``label``,
    elementwise (Paddle 2.x's name; ``binary_cross_entropy`` with reduction 'none')."""
    _check_pair(input, label, "input", "label", "bce_loss")
    helper = LayerHelper("bce_loss", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("bce_loss", inputs={"X": [input], "Label": [label]},
                     outputs={"Out": [out]})
    return out


def huber_loss(input, label, delta) -> Variable:
    """Elementwise Huber loss of the residual ``label - input``: quadratic within ``delta``,
    linear outside."""
    _check_pair(input, label, "input", "label", "huber_loss")
    helper = LayerHelper("huber_loss")
    residual = helper.create_variable_for_type_inference(input.dtype)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("huber_loss", inputs={"X": [input], "Y": [label]},
                     outputs={"Out": [out], "Residual": [residual]},
                     attrs={"delta": float(delta)})
    return out


def smooth_l1(x, y, inside_weight=None, outside_weight=None, sigma=None) -> Variable:
    """Smooth L1 loss of ``x - y`` summed per sample: a ``[N, 1]`` Variable. The weights
    (both or neither) multiply the difference and the loss elementwise; ``sigma`` (default
    1.0) sets where the quadratic part ends (``1 / sigma^2``)."""
    _check_pair(x, y, "x", "y", "smooth_l1")
    inputs = {"X": [x], "Y": [y]}
    if (inside_weight is None) != (outside_weight is None):
        raise ValueError("smooth_l1: give inside_weight and outside_weight together (both or "
                         "neither)")
    if inside_weight is not None:
        _check_pair(x, inside_weight, "x", "inside_weight", "smooth_l1")
        _check_pair(x, outside_weight, "x", "outside_weight", "smooth_l1")
        inputs.update(InsideWeight=[inside_weight], OutsideWeight=[outside_weight])
    helper = LayerHelper("smooth_l1_loss")
    diff = helper.create_variable_for_type_inference(x.dtype)
    loss = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("smooth_l1_loss", inputs=inputs, outputs={"Diff": [diff], "Out": [loss]},
                     attrs={"sigma": float(sigma) if sigma is not None else 1.0})
    return loss


def kldiv_loss(x, target, reduction="mean", name=None) -> Variable:
    """Kullback-Leibler divergence of log-probabilities ``x`` from probabilities ``target``:
    ``target * (log target - x)`` reduced by ``reduction`` ('none', 'batchmean', 'mean',
    'sum'; the last three give shape [1], Fluid 1.x's scalar)."""
    _check_pair(x, target, "x", "target", "kldiv_loss")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"kldiv_loss: reduction must be 'none', 'batchmean', 'mean' or 'sum', "
                         f"got {reduction!r}")
    helper = LayerHelper("kldiv_loss", name=name)
    loss = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("kldiv_loss", inputs={"X": [x], "Target": [target]},
                     outputs={"Loss": [loss]}, attrs={"reduction": reduction})
    return loss


def log_loss(input, label, epsilon=1e-4, name=None):
    """Fluid's ``log_loss``: ``-label * log(input + epsilon) - (1 - label) * log(1 - input +
    epsilon)`` for ``[N, 1]`` probabilities ``input`` and labels ``label`` (an ``[N, 1]``
    result)."""
    _check_pair(input, label, "input", "label", "log_loss")
    helper = LayerHelper("log_loss", name=name)
    loss = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("log_loss", inputs={"Predicted": [input], "Labels": [label]},
                     outputs={"Loss": [loss]}, attrs={"epsilon": float(epsilon)})
    return loss


def cos_sim(X, Y):
    """Fluid's ``cos_sim``: the cosine similarity of each row of ``X`` with the same row of
    ``Y`` (or with ``Y``'s one row): an ``[N, 1]`` result."""
    check_variable(X, "X", "cos_sim")
    check_variable(Y, "Y", "cos_sim")
    check_dtype(X, "X", _FLOATS, "cos_sim")
    helper = LayerHelper("cos_sim")
    out = helper.create_variable_for_type_inference(X.dtype)
    xnorm = helper.create_variable_for_type_inference(X.dtype)
    ynorm = helper.create_variable_for_type_inference(X.dtype)
    helper.append_op("cos_sim", inputs={"X": [X], "Y": [Y]},
                     outputs={"Out": [out], "XNorm": [xnorm], "YNorm": [ynorm]})
    return out
