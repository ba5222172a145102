"""Fluid 1.x's beam search layers: ``beam_search`` and ``beam_search_decode`` (the ops are in
``pdjit.ops.beam_search``)."""
from __future__ import annotations

from pdjit.layers.control_flow import _check_array
from pdjit.layers.layer_helper import LayerHelper, check_variable

__all__ = ["beam_search", "beam_search_decode"]


def beam_search(pre_ids, pre_scores, ids, scores, beam_size, end_id, level=0,
                is_accumulated=True, name=None, return_parent_idx=False):
    """One step of beam search (Fluid 1.8's ``layers.beam_search``): per source sentence (LoD
    level ``level`` of ``scores``) the ``beam_size`` best continuations of the live prefixes.
    Returns ``(selected_ids, selected_scores)`` (and ``parent_idx`` when
    ``return_parent_idx``), LoD ``[sources -> prefixes, prefixes -> selected]``."""
    layer = "beam_search"
    for arg, v in (("pre_ids", pre_ids), ("pre_scores", pre_scores), ("scores", scores)):
        check_variable(v, arg, layer)
    if ids is not None:
        check_variable(ids, "ids", layer)
    for arg, v in (("beam_size", beam_size), ("end_id", end_id), ("level", level)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{layer}: {arg} must be an int, got {v!r}")
    if beam_size < 1:
        raise ValueError(f"{layer}: beam_size must be >= 1, got {beam_size}")
    helper = LayerHelper(layer, name=name)
    inputs = {"pre_ids": [pre_ids], "pre_scores": [pre_scores], "scores": [scores]}
    if ids is not None:
        inputs["ids"] = [ids]
    sel_scores = helper.create_variable_for_type_inference(pre_scores.dtype)
    sel_ids = helper.create_variable_for_type_inference(pre_ids.dtype)
    parent_idx = helper.create_variable_for_type_inference("int32")
    helper.append_op("beam_search", inputs=inputs,
                     outputs={"selected_ids": [sel_ids], "selected_scores": [sel_scores],
                              "parent_idx": [parent_idx]},
                     attrs={"level": level, "beam_size": beam_size, "end_id": end_id,
                            "is_accumulated": bool(is_accumulated)})
    if return_parent_idx:
        return sel_ids, sel_scores, parent_idx
    return sel_ids, sel_scores


def beam_search_decode(ids, scores, beam_size, end_id, name=None):
    """The hypotheses of each source traced back through the tensor arrays ``ids`` and
    ``scores`` of the beam_search steps, best first: ``(sentence_ids, sentence_scores)``, LoD
    ``[sources -> hypotheses, hypotheses -> ids]``."""
    _check_array(ids, "beam_search_decode")
    _check_array(scores, "beam_search_decode")
    helper = LayerHelper("beam_search_decode", name=name)
    sentence_ids = helper.create_variable_for_type_inference(ids.dtype)
    sentence_scores = helper.create_variable_for_type_inference(scores.dtype)
    helper.append_op("beam_search_decode", inputs={"Ids": [ids], "Scores": [scores]},
                     outputs={"SentenceIds": [sentence_ids],
                              "SentenceScores": [sentence_scores]},
                     attrs={"beam_size": int(beam_size), "end_id": int(end_id)})
    return sentence_ids, sentence_scores

