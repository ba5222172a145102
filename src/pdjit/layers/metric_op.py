"""Metric layers: ``auc`` (streaming area under the ROC curve), ``edit_distance`` and
``chunk_eval``. ``accuracy`` lives in ``layers.nn``."""
from __future__ import annotations

import numbers

from pdjit.layers.initializer import Constant
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["auc", "edit_distance", "chunk_eval"]


def auc(input, label, curve="ROC", num_thresholds=2 ** 12 - 1, topk=1, slide_steps=1,
        ins_tag_weight=None):
    """The area under the ROC curve of ``input``'s positive-class probabilities (its last
    column: ``[N, 2]`` softmax outputs or ``[N, 1]`` probabilities) against ``label``
    (``[N, 1]`` ints; ``> 0`` positive, ``0`` negative), as Fluid's ``layers.auc``.

    Two ``auc`` ops share the inputs: one accumulates over every batch run (the global AUC),
    one over the last ``slide_steps`` batches (the batch AUC; ``slide_steps=0``: every batch
    too). Their statistics are persistable int64 variables initialised to zeros by the startup
    program. Returns ``(auc_out, batch_auc_out, [batch_stat_pos, batch_stat_neg, stat_pos,
    stat_neg])``; the AUCs are float64 of shape [1]. ``topk`` is accepted and unused, as in Fluid.
    ``ins_tag_weight`` (Paddle 2.x's extra argument) is checked and, as Paddle's legacy-mode
    layer does, not passed to the ops (measured with Paddle 3.3.1: a weight of 0 changes
    nothing); the op's own ``InsTagWeight`` input is there for programs that set it.
    """
    check_variable(input, "input", "auc")
    check_variable(label, "label", "auc")
    check_dtype(input, "input", ("float32", "float64"), "auc")
    check_dtype(label, "label", ("int32", "int64"), "auc")
    if curve not in ("ROC", "PR"):
        raise ValueError(f"auc: curve must be 'ROC' or 'PR', got {curve!r}")
    num_thresholds, slide_steps = int(num_thresholds), int(slide_steps)
    if num_thresholds < 1:
        raise ValueError(f"auc: num_thresholds must be >= 1, got {num_thresholds}")
    if slide_steps < 0:
        raise ValueError(f"auc: slide_steps must be >= 0, got {slide_steps}")
    if ins_tag_weight is not None:
        check_variable(ins_tag_weight, "ins_tag_weight", "auc")
        check_dtype(ins_tag_weight, "ins_tag_weight", ("float32", "float64"), "auc")
    helper = LayerHelper("auc")
    auc_out = helper.create_variable_for_type_inference("float64", stop_gradient=True)
    batch_auc_out = helper.create_variable_for_type_inference("float64", stop_gradient=True)
    buckets = num_thresholds + 1
    # the batch AUC's statistics: slide_steps per-batch histograms, their sum, the batch count
    # (with slide_steps=0 the first histogram accumulates every batch; the rest goes unused)
    batch_shape = [(1 + slide_steps) * buckets + 1]
    batch_stat_pos, batch_stat_neg, stat_pos, stat_neg = (
        helper.create_global_variable(persistable=True, dtype="int64", shape=shape,
                                      stop_gradient=True)
        for shape in (batch_shape, batch_shape, [1, buckets], [1, buckets]))
    for var in (batch_stat_pos, batch_stat_neg, stat_pos, stat_neg):
        helper.set_variable_initializer(var, Constant(0.0))
    for out, pos, neg, steps in ((batch_auc_out, batch_stat_pos, batch_stat_neg, slide_steps),
                                 (auc_out, stat_pos, stat_neg, 0)):
        helper.append_op(
            "auc",
            inputs={"Predict": [input], "Label": [label], "StatPos": [pos], "StatNeg": [neg]},
            outputs={"AUC": [out], "StatPosOut": [pos], "StatNegOut": [neg]},
            attrs={"curve": curve, "num_thresholds": num_thresholds, "slide_steps": steps})
    return auc_out, batch_auc_out, [batch_stat_pos, batch_stat_neg, stat_pos, stat_neg]


def edit_distance(input, label, normalized=True, ignored_tokens=None, input_length=None,
                  label_length=None):
    """The edit (Levenshtein) distance of each hypothesis sequence of ``input`` to its
    reference in ``label``, as Fluid's ``layers.edit_distance`` (the ``edit_distance`` op):
    int64 LoD tensors ``[N, 1]``, or padded ``[batch, length]`` tensors with ``input_length``
    and ``label_length`` (``[batch]`` int64). With ``normalized`` each distance is divided by
    its reference's length (an empty reference is then an error). Returns ``(distances,
    sequence_num)``: float32 ``[batch, 1]`` and int64 ``[1]``, what ``metrics.EditDistance``
    takes. ``ignored_tokens`` is refused, as Paddle 3.3.1 refuses it: remove those tokens from
    the sequences before feeding them."""
    check_variable(input, "input", "edit_distance")
    check_variable(label, "label", "edit_distance")
    check_dtype(input, "input", ("int64",), "edit_distance")
    check_dtype(label, "label", ("int64",), "edit_distance")
    if ignored_tokens is not None and len(ignored_tokens) > 0:
        raise ValueError(f"edit_distance: ignored_tokens is not supported (expected None, got "
                         f"{ignored_tokens!r}); remove those tokens from the sequences first")
    if (input_length is None) != (label_length is None):
        raise ValueError("edit_distance: give input_length and label_length together (padded "
                         "sequences) or neither (LoD sequences)")
    inputs = {"Hyps": [input], "Refs": [label]}
    if input_length is not None:
        for arg, v in (("input_length", input_length), ("label_length", label_length)):
            check_variable(v, arg, "edit_distance")
            check_dtype(v, arg, ("int64",), "edit_distance")
        inputs.update(HypsLength=[input_length], RefsLength=[label_length])
    helper = LayerHelper("edit_distance")
    out = helper.create_variable_for_type_inference("float32", stop_gradient=True)
    seq_num = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("edit_distance", inputs=inputs,
                     outputs={"Out": [out], "SequenceNum": [seq_num]},
                     attrs={"normalized": bool(normalized)})
    return out, seq_num


_CHUNK_SCHEMES = ("IOB", "IOE", "IOBES", "plain")


def chunk_eval(input, label, chunk_scheme, num_chunk_types, excluded_chunk_types=None,
               seq_length=None):
    """Chunk detection (named entities, phrases) of tagged sequences, as Fluid 1.8's
    ``layers.chunk_eval`` (the ``chunk_eval`` op): ``input`` (the inferred tags) and ``label``
    are int64 LoD tensors ``[N, 1]`` with the same LoD, or padded ``[batch, length]`` (or
    ``[batch, length, 1]``) tensors with ``seq_length`` (``[batch]`` int64).

    A tag is ``chunk_type * num_tag_types + tag`` (IOB: B=0, I=1; IOE: I=0, E=1; IOBES: B=0,
    I=1, E=2, S=3; plain: one tag), and ``num_chunk_types * num_tag_types`` is outside any
    chunk. Chunks of ``excluded_chunk_types`` are not counted. Returns ``(precision, recall,
    f1_score, num_infer_chunks, num_label_chunks, num_correct_chunks)`` of the batch: float32
    ``[1]`` and int64 ``[1]``; the three counts are what ``metrics.ChunkEvaluator.update``
    takes to accumulate over batches."""
    check_variable(input, "input", "chunk_eval")
    check_variable(label, "label", "chunk_eval")
    check_dtype(input, "input", ("int64",), "chunk_eval")
    check_dtype(label, "label", ("int64",), "chunk_eval")
    if chunk_scheme not in _CHUNK_SCHEMES:
        raise ValueError(f"chunk_eval: chunk_scheme must be one of {list(_CHUNK_SCHEMES)}, got "
                         f"{chunk_scheme!r}")
    if isinstance(num_chunk_types, bool) or not isinstance(num_chunk_types, numbers.Integral) \
            or num_chunk_types < 0:
        raise ValueError(f"chunk_eval: num_chunk_types must be an int >= 0, got "
                         f"{num_chunk_types!r}")
    excluded = [] if excluded_chunk_types is None else list(excluded_chunk_types)
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in excluded):
        raise ValueError(f"chunk_eval: excluded_chunk_types must be a list of ints, got "
                         f"{excluded_chunk_types!r}")
    inputs = {"Inference": [input], "Label": [label]}
    if seq_length is not None:
        check_variable(seq_length, "seq_length", "chunk_eval")
        check_dtype(seq_length, "seq_length", ("int64",), "chunk_eval")
        inputs["SeqLength"] = [seq_length]
    helper = LayerHelper("chunk_eval")
    outs = [helper.create_variable_for_type_inference("float32" if k < 3 else "int64",
                                                      stop_gradient=True) for k in range(6)]
    helper.append_op(
        "chunk_eval", inputs=inputs,
        outputs={slot: [v] for slot, v in zip(
            ("Precision", "Recall", "F1-Score", "NumInferChunks", "NumLabelChunks",
             "NumCorrectChunks"), outs)},
        attrs={"num_chunk_types": int(num_chunk_types), "chunk_scheme": chunk_scheme,
               "excluded_chunk_types": [int(t) for t in excluded]})
    return tuple(outs)
