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

_DETECTION = ("object-detection op (matching, target assignment, proposals, FPN, detection "
              "losses and metrics; the box, prior, anchor, NMS and YOLO-box ops exist): not "
              "implemented yet")

#: why a Fluid 1.8 name is not in pdjit.layers (names not listed: "not implemented yet")
REASONS = {
    **dict.fromkeys(["box_decoder_and_assign", "collect_fpn_proposals",
                     "detection_map", "distribute_fpn_proposals",
                     "generate_mask_labels", "generate_proposal_labels", "generate_proposals",
                     "locality_aware_nms", "multi_box_head",
                     "retinanet_detection_output",
                     "retinanet_target_assign", "roi_perspective_transform",
                     "rpn_target_assign", "ssd_loss",
                     "yolov3_loss"], _DETECTION),
    "deformable_conv": "needs a deformable-convolution op (offsets, masks): not implemented yet",
    "deformable_roi_pooling": "needs deformable position-sensitive RoI pooling: not implemented "
                              "yet",
    "prroi_pool": "needs precise RoI pooling (integrals of the bilinear surface): not "
                  "implemented yet",
    "dynamic_lstmp": "needs an LSTM-with-projection recurrent op (lstmp): not implemented yet",
    "sampled_softmax_with_cross_entropy": "needs the sample_logits op (sampled classes, "
                                          "accidental-hit removal): not implemented yet",
    "data_norm": "CTR normalisation whose backward writes batch statistics, not gradients: "
                 "not implemented yet",
    "filter_by_instag": "CTR instance filtering by tags (LoD in, LoD out, loss weights): not "
                        "implemented yet",
    "load": "needs a load op reading a saved tensor file at run time (the file reader lives in "
            "pdjit.io, above the ops): not implemented yet",
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
