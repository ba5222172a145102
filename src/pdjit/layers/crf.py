"""Fluid 1.x's linear-chain CRF layers: ``linear_chain_crf`` (the training cost) and
``crf_decoding`` (Viterbi), sharing one transition parameter by its ``ParamAttr`` name (ops in
``pdjit.ops.crf``)."""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable
from pdjit.layers.param_attr import ParamAttr

__all__ = ["linear_chain_crf", "crf_decoding"]


def _checked(layer, input, label, length):
    check_variable(input, "input", layer)
    check_dtype(input, "input", ("float32", "float64"), layer)
    if label is not None:
        check_variable(label, "label", layer)
        check_dtype(label, "label", ("int64", "int32"), layer)
    if length is not None:
        check_variable(length, "length", layer)
        check_dtype(length, "length", ("int64", "int32"), layer)
    rank = 3 if length is not None else 2
    if len(input.shape) != rank or input.shape[-1] < 1:
        form = "[batch, max_len, num_tags] (with length)" if length is not None else \
            "[-1, num_tags] (a LoD tensor, without length)"
        raise ValueError(f"{layer}: argument 'input' of shape {list(input.shape)}: expected "
                         f"{form} with num_tags known")
    return int(input.shape[-1])


def linear_chain_crf(input, label, param_attr=None, length=None):
    """The negative log-likelihood ``[sequences, 1]`` of ``label`` under a linear-chain CRF
    over the emission scores ``input`` (``[-1, num_tags]`` LoD rows, or ``[batch, max_len,
    num_tags]`` padded with ``length``), learning a transition parameter ``[num_tags + 2,
    num_tags]`` (start weights, end weights, then tag-to-tag weights) named by
    ``param_attr``. Minimise its mean; decode with :func:`crf_decoding` and the same
    ``param_attr`` name."""
    layer = "linear_chain_crf"
    check_variable(label, "label", layer)
    size = _checked(layer, input, label, length)
    helper = LayerHelper(layer, param_attr=param_attr)
    dtype = input.dtype
    transition = helper.create_parameter(helper.param_attr, [size + 2, size], dtype)
    alpha, emission_exps, transition_exps, log_likelihood = (
        helper.create_variable_for_type_inference(dtype) for _ in range(4))
    inputs = {"Emission": [input], "Transition": [transition], "Label": [label]}
    if length is not None:
        inputs["Length"] = [length]
    helper.append_op("linear_chain_crf", inputs=inputs,
                     outputs={"Alpha": [alpha], "EmissionExps": [emission_exps],
                              "TransitionExps": [transition_exps],
                              "LogLikelihood": [log_likelihood]})
    return log_likelihood


def crf_decoding(input, param_attr, label=None, length=None):
    """The best tag path (``int64``) of each sequence of ``input`` under the transition
    parameter that :func:`linear_chain_crf` created with ``param_attr`` (its name); with
    ``label``, 1 where the decoded tag equals the label and 0 elsewhere."""
    layer = "crf_decoding"
    _checked(layer, input, label, length)
    attr = ParamAttr._to_attr(param_attr)
    name = getattr(attr, "name", None)
    helper = LayerHelper(layer, param_attr=param_attr)
    block = helper.main_program.global_block()
    if not name or not block.has_var(name):
        raise ValueError(f"crf_decoding: argument 'param_attr' must name the transition "
                         f"parameter of a linear_chain_crf built before it, got "
                         f"{param_attr!r}" + (f" (no parameter {name!r} in the program)"
                                              if name else ""))
    transition = block.var(name)
    if not isinstance(transition, Variable) or list(transition.shape) != \
            [input.shape[-1] + 2, input.shape[-1]]:
        raise ValueError(f"crf_decoding: parameter {name!r} of shape {list(transition.shape)}: "
                         f"expected {[input.shape[-1] + 2, input.shape[-1]]} for "
                         f"{input.shape[-1]} tags")
    path = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    inputs = {"Emission": [input], "Transition": [transition]}
    if label is not None:
        inputs["Label"] = [label]
    if length is not None:
        inputs["Length"] = [length]
    helper.append_op("crf_decoding", inputs=inputs, outputs={"ViterbiPath": [path]})
    return path
