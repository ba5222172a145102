"""Which of Fluid 1.8's ``fluid.layers`` names pdjit has, and why each missing one is missing.

    PYTHONPATH=src python benchmarks/fluid_api_coverage.py [--names-only]

The names are read from ``benchmarks/data/fluid_1_8_layers.txt`` (every name Fluid 1.8's API
reference documents under ``fluid.layers``) and looked up in ``pdjit.layers``. A missing name is
printed with the reason recorded in :data:`REASONS` (``not implemented yet`` when none is). Exit
status 0; the script measures nothing and compiles nothing.
"""
from __future__ import annotations

import pathlib
import sys

DATA = pathlib.Path(__file__).parent / "data" / "fluid_1_8_layers.txt"

_DETECTION = "object-detection op family (boxes, anchors, NMS, proposals): not implemented yet"
_PREVIEW = ("Paddle 2.0-preview tensor API that Fluid 1.8 also documents under fluid.layers: "
            "not implemented yet")
_DECODING = ("layers.rnn decoding helper (Decoder family): not implemented yet; "
             "BeamSearchDecoder/dynamic_decode are being built elsewhere")
_DISTRIBUTION = "fluid.layers.distributions class: not implemented yet"
_SELECTED_ROWS = "needs the SelectedRows value type (pdjit keeps sparse gradients dense)"
_THREE_D = "needs 3-D convolution/pooling kernels (only 2-D exist)"
_SEARCH_CHAIN = "part of the beam-search decoding chain being built elsewhere"

#: why a Fluid 1.8 name is not in pdjit.layers (names not listed: "not implemented yet")
REASONS = {
    **dict.fromkeys(["BasicDecoder", "DecodeHelper", "Decoder", "GreedyEmbeddingHelper",
                     "SampleEmbeddingHelper", "TrainingHelper"], _DECODING),
    **dict.fromkeys(["BeamSearchDecoder", "dynamic_decode", "beam_search", "beam_search_decode",
                     "gather_tree", "is_empty"], _SEARCH_CHAIN),
    **dict.fromkeys(["Categorical", "MultivariateNormalDiag", "Normal", "Uniform"],
                    _DISTRIBUTION),
    **dict.fromkeys(["anchor_generator", "bipartite_match", "box_clip", "box_coder",
                     "box_decoder_and_assign", "collect_fpn_proposals", "density_prior_box",
                     "detection_map", "detection_output", "distribute_fpn_proposals",
                     "generate_mask_labels", "generate_proposal_labels", "generate_proposals",
                     "iou_similarity", "locality_aware_nms", "multi_box_head", "multiclass_nms",
                     "polygon_box_transform", "prior_box", "retinanet_detection_output",
                     "retinanet_target_assign", "roi_perspective_transform",
                     "rpn_target_assign", "sigmoid_focal_loss", "ssd_loss", "target_assign",
                     "yolo_box", "yolov3_loss", "deformable_roi_pooling"], _DETECTION),
    **dict.fromkeys(["addcmul", "addmm", "allclose", "arange", "bmm", "clamp", "cross", "dist",
                     "dot", "elementwise_equal", "flip", "full", "full_like", "index_select",
                     "kron", "log1p", "logsumexp", "meshgrid", "nonzero", "randn", "randperm",
                     "roll", "t", "trace", "tril", "triu", "masked_select", "diag_embed",
                     "index_sample"], _PREVIEW),
    **dict.fromkeys(["get_tensor_from_selected_rows", "merge_selected_rows"], _SELECTED_ROWS),
    **dict.fromkeys(["conv3d", "conv3d_transpose", "pool3d", "adaptive_pool3d",
                     "resize_trilinear"], _THREE_D),
    "cos_sim": "being built elsewhere (with its gradient)",
    "log_loss": "being built elsewhere",
    "load": "needs a load op reading one variable's file at run time: not implemented yet",
    "py_func": "needs run-time calls into user Python from compiled plans: not implemented yet",
    "hash": "needs Fluid's xxHash-based hash op (values must match Fluid's): not implemented yet",
    "deformable_conv": "needs a deformable-convolution kernel: not implemented yet",
    "inplace_abn": "in-place activated batch norm: not implemented yet",
    "continuous_value_model": "CTR-specific op (cvm): not implemented yet",
    "filter_by_instag": "CTR-specific op: not implemented yet",
    "shard_index": "distributed-embedding helper op: not implemented yet",
    "sampled_softmax_with_cross_entropy": "needs a sampler op (sample_logits): not implemented "
                                          "yet",
    "nce": "needs a sampler of negative classes: not implemented yet",
    "hsigmoid": "hierarchical sigmoid with its tree paths: not implemented yet",
    "warpctc": "CTC loss (forward-backward over label lattices): not implemented yet",
    "dynamic_lstmp": "LSTM with projection kernel: not implemented yet",
    "random_crop": "random op with per-sample offsets: not implemented yet",
    "sampling_id": "random sampling op: not implemented yet",
    "similarity_focus": "not implemented yet",
    "fsp_matrix": "not implemented yet (distillation op)",
    "lod_append": "not implemented yet",
}


def fluid_names() -> list[str]:
    lines = DATA.read_text().splitlines()
    return [s.strip() for s in lines if s.strip() and not s.startswith("#")]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import pdjit.layers as layers

    names = fluid_names()
    have = [n for n in names if hasattr(layers, n)]
    missing = [n for n in names if not hasattr(layers, n)]
    if "--names-only" in argv:
        print("\n".join(missing))
        return 0
    print(f"Fluid 1.8 fluid.layers names: {len(names)}; in pdjit.layers: {len(have)}; "
          f"missing: {len(missing)}\n")
    print("## covered")
    print(" ".join(have))
    print("\n## missing (name: why)")
    for n in missing:
        print(f"- {n}: {REASONS.get(n, 'not implemented yet')}")
    stale = sorted(n for n in REASONS if hasattr(layers, n))
    if stale:
        print("\n(reasons recorded for names that now exist: " + " ".join(stale) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
