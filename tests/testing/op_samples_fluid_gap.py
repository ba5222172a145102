"""Samples (see ``op_samples.py``) of the ops that complete Fluid 1.8's ``fluid.layers``:
the remaining activations, ranking/recommendation/CTC/focal/center losses, sequence ops, tensor
manipulations, ROI pooling, grid sampling, 3-D convolution and pooling, spectral norm.

Imported at the end of ``op_samples.py``; values kept away from every op's kinks."""
from __future__ import annotations

import numpy as np
from op_samples import I64, S, add, away, distinct, labels, pos, probs, u

I32 = np.int32


def _kinkless(r, shape, kinks, gap=0.1, lo=-2.0, hi=2.0):
    """Uniform values at least ``gap`` from each of ``kinks``."""
    x = r.uniform(lo, hi, size=shape)
    for k in kinks:
        x = np.where(np.abs(x - k) < gap, k + gap * np.sign(x - k + 1e-9) * 1.5, x)
    return x


# ---- activations (activation_fluid.py) ---------------------------------------------------------
add("brelu", S(lambda r: {"X": _kinkless(r, (2, 3), [-0.5, 1.0])}, {"t_min": -0.5, "t_max": 1.0},
               grad=["X"]))
add("soft_relu", S(lambda r: {"X": u(r, (2, 3), -3, 3)}, {"threshold": 5.0}, grad=["X"]))
add("stanh", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, {"scale_a": 0.75, "scale_b": 1.5},
               grad=["X"]))
add("hard_shrink", S(lambda r: {"X": _kinkless(r, (2, 3), [-0.5, 0.5])}, grad=["X"]))
add("softshrink", S(lambda r: {"X": _kinkless(r, (2, 3), [-0.5, 0.5])}, grad=["X"]))
add("thresholded_relu", S(lambda r: {"X": _kinkless(r, (2, 3), [1.0])}, grad=["X"]))
for _op in ("logsigmoid", "softsign", "tanh_shrink", "atan", "erf"):
    add(_op, S(lambda r: {"X": away(r, (2, 3))}, grad=["X"]))
for _op in ("acos", "asin"):
    add(_op, S(lambda r: {"X": u(r, (2, 3), -0.8, 0.8)}, grad=["X"]))
add("round", S(lambda r: {"X": r.integers(-3, 3, (2, 3)) + r.uniform(0.1, 0.4, (2, 3))}))
add("pow", S(lambda r: {"X": pos(r, (2, 3))}, {"factor": 2.5}, grad=["X"]))
add("log1p", S(lambda r: {"X": pos(r, (2, 3))}, grad=["X"]))

# ---- ranking and recommendation losses (loss_rank.py) ------------------------------------------
add("rank_loss", S(lambda r: {"Label": r.integers(0, 2, (4, 1)).astype(np.float64),
                              "Left": u(r, (4, 1)), "Right": u(r, (4, 1))},
                   grad=["Left", "Right"]))
add("margin_rank_loss",
    S(lambda r: {"X1": np.array([[0.5], [0.1], [-0.4]]), "X2": np.array([[0.1], [0.9], [0.2]]),
                 "Label": np.array([[1.0], [1.0], [-1.0]])}, {"margin": 0.1},
      grad=["X1", "X2"]))
add("teacher_student_sigmoid_loss",
    S(lambda r: {"X": u(r, (4, 1), -2, 2), "Label": np.array([[-2.0], [-1.0], [0.4], [1.3]])},
      grad=["X"], out="Y"))
add("bpr_loss", S(lambda r: {"X": u(r, (3, 4)), "Label": labels(r, (3, 1), 4)}, grad=["X"],
                  out="Y"))
add("center_loss",
    S(lambda r: {"X": u(r, (4, 3)), "Label": labels(r, (4, 1), 3), "Centers": u(r, (3, 3)),
                 "CenterUpdateRate": np.array([0.5])}, {"cluster_num": 3, "need_update": True},
      grad=["X"], out="Loss"))
add("sigmoid_focal_loss",
    S(lambda r: {"X": u(r, (3, 2), -2, 2), "Label": np.array([[0], [2], [1]], I32),
                 "FgNum": np.array([2], I32)}, grad=["X"]))
add("iou_similarity",
    S(lambda r: {"X": np.array([[0.0, 0.0, 0.5, 0.5], [0.2, 0.1, 0.9, 0.6]]),
                 "Y": np.array([[0.1, 0.1, 0.4, 0.7], [0.5, 0.5, 1.0, 1.0]])}))

# ---- sequence ops (sequence_fluid.py, ctc.py) --------------------------------------------------
_LOD = [[0, 2, 2, 5]]
add("sequence_enumerate", S(lambda r: {"X": (labels(r, (5, 1), 7), _LOD)}, {"win_size": 2}))
add("sequence_reshape", S(lambda r: {"X": (u(r, (5, 2)), _LOD)}, {"new_dim": 1}, grad=["X"]))
add("sequence_slice",
    S(lambda r: {"X": (u(r, (5, 2)), _LOD), "Offset": np.array([[1], [0], [1]], I64),
                 "Length": np.array([[1], [0], [2]], I64)}, grad=["X"]))
add("sequence_scatter",
    S(lambda r: {"X": u(r, (3, 4)), "Ids": (np.array([[0], [3], [1], [1], [2]], I64), _LOD),
                 "Updates": (u(r, (5, 1)), _LOD)}, grad=["X", "Updates"]))
add("im2sequence", S(lambda r: {"X": u(r, (2, 1, 3, 3))}, {"kernels": [2, 2]}, grad=["X"]))
add("row_conv", S(lambda r: {"X": (u(r, (5, 2)), _LOD), "Filter": u(r, (2, 2))},
                  grad=["X", "Filter"]))
add("add_position_encoding",
    S(lambda r: {"X": u(r, (2, 3, 4))}, {"alpha": 0.5, "beta": 2.0}, grad=["X"]),
    S(lambda r: {"X": (u(r, (5, 4)), _LOD)}, grad=["X"]))
add("warpctc",
    S(lambda r: {"Logits": (u(r, (5, 3)), [[0, 3, 5]]),
                 "Label": (np.array([[1], [2], [1]], I32), [[0, 2, 3]])},
      grad=["Logits"], out="Loss"))
add("ctc_align", S(lambda r: {"Input": (r.integers(0, 3, (5, 1)).astype(I64), _LOD)}))

# ---- hsigmoid, nce -----------------------------------------------------------------------------
add("hierarchical_sigmoid",
    S(lambda r: {"X": u(r, (3, 2)), "W": u(r, (4, 2)), "Label": labels(r, (3, 1), 5),
                 "Bias": u(r, (4, 1))}, {"num_classes": 5}, grad=["X", "W", "Bias"]))
add("nce",
    S(lambda r: {"Input": u(r, (3, 2)), "Label": labels(r, (3, 1), 5), "Weight": u(r, (5, 2)),
                 "Bias": u(r, (5, 1))},
      {"num_total_classes": 5, "num_neg_samples": 2, "custom_neg_classes": [0, 3]},
      grad=["Input", "Weight", "Bias"], out="Cost"),
    S(lambda r: {"Input": u(r, (3, 2)), "Label": labels(r, (3, 1), 5), "Weight": u(r, (5, 2))},
      {"num_total_classes": 5, "num_neg_samples": 2, "sampler": 1}, out="Cost"))

# ---- tensor manipulation (manip.py) ------------------------------------------------------------
add("reverse", S(lambda r: {"X": u(r, (2, 3))}, {"axis": [0, 1]}, grad=["X"]))
add("unique", S(lambda r: {"X": np.array([3, 1, 3, 2, 1], I64)}))
add("unique_with_counts", S(lambda r: {"X": np.array([3, 1, 3, 2, 1], I64)}, {"dtype": 3}))
add("scatter_nd_add",
    S(lambda r: {"X": u(r, (3, 2)), "Index": np.array([[2], [0], [2]], I64),
                 "Updates": u(r, (3, 2))}, grad=["X", "Updates"]))
add("strided_slice",
    S(lambda r: {"Input": u(r, (4, 3))},
      {"axes": [0, 1], "starts": [3, 0], "ends": [0, 3], "strides": [-2, 2]}, grad=["Input"]))
add("mean_iou", S(lambda r: {"Predictions": r.integers(0, 3, (6,)).astype(I64),
                             "Labels": r.integers(0, 3, (6,)).astype(I64)}, {"num_classes": 3}))
add("sampling_id", S(lambda r: {"X": probs(r, (3, 4))}))
add("unfold", S(lambda r: {"X": u(r, (1, 2, 3, 3))}, {"kernel_sizes": [2, 2]}, grad=["X"],
                out="Y"))
add("cvm",     # CVM 0: Fluid's gradient writes CVM into the first columns, here the derivative
    S(lambda r: {"X": pos(r, (2, 4)), "CVM": np.zeros((2, 2))}, {"use_cvm": False}, grad=["X"],
      out="Y"),
    S(lambda r: {"X": pos(r, (2, 4)), "CVM": np.zeros((2, 2))}, out="Y"))
add("random_crop", S(lambda r: {"X": u(r, (2, 3, 4))}, {"shape": [2, 2], "startup_seed": 3}))

# ---- vision: ROI pooling, grid sampling, 3-D, spectral norm ------------------------------------
_ROIS = (np.array([[0.0, 0.0, 2.0, 1.0], [1.0, 1.0, 3.0, 2.0]]), [[0, 1, 2]])
add("roi_pool", S(lambda r: {"X": distinct(r, (2, 1, 3, 4)), "ROIs": _ROIS},
                  {"pooled_height": 1, "pooled_width": 2}, grad=["X"]))
add("roi_align", S(lambda r: {"X": u(r, (2, 1, 3, 4)), "ROIs": _ROIS},
                   {"pooled_height": 2, "pooled_width": 2, "sampling_ratio": 2}, grad=["X"]))
add("psroi_pool", S(lambda r: {"X": u(r, (2, 4, 3, 4)), "ROIs": _ROIS},
                    {"output_channels": 1, "pooled_height": 2, "pooled_width": 2}, grad=["X"]))
add("grid_sampler", S(lambda r: {"X": u(r, (1, 2, 3, 3)), "Grid": u(r, (1, 2, 2, 2), -0.9, 0.9)},
                      grad=["X", "Grid"], out="Output"))
add("conv3d", S(lambda r: {"Input": u(r, (1, 2, 2, 3, 3)), "Filter": u(r, (2, 2, 1, 2, 2))},
                grad=["Input", "Filter"], out="Output"))
add("conv3d_transpose",
    S(lambda r: {"Input": u(r, (1, 2, 2, 2, 2)), "Filter": u(r, (2, 1, 2, 1, 2))},
      {"strides": [2, 1, 1]}, grad=["Input", "Filter"], out="Output"))
add("pool3d",
    S(lambda r: {"X": distinct(r, (1, 1, 2, 3, 3))}, {"pooling_type": "max", "ksize": [1, 2, 2]},
      grad=["X"]),
    S(lambda r: {"X": u(r, (1, 1, 2, 3, 3))},
      {"pooling_type": "avg", "ksize": [2, 2, 1], "adaptive": True}, grad=["X"]))
add("trilinear_interp",
    S(lambda r: {"X": u(r, (1, 1, 2, 2, 3))}, {"out_d": 3, "out_h": 3, "out_w": 2}, grad=["X"]))
add("spectral_norm",
    S(lambda r: {"Weight": u(r, (3, 4)), "U": u(r, (3,)), "V": u(r, (4,))},
      {"power_iters": 60}, grad=["Weight"]))
add("box_coder",
    S(lambda r: {"PriorBox": np.array([[0.1, 0.1, 0.5, 0.6], [0.3, 0.2, 0.9, 0.7]]),
                 "PriorBoxVar": np.full((2, 4), 0.2),
                 "TargetBox": np.array([[0.2, 0.2, 0.4, 0.5], [0.0, 0.3, 0.8, 0.9]])},
      out="OutputBox"),
    S(lambda r: {"PriorBox": np.array([[1.0, 1.0, 5.0, 6.0], [3.0, 2.0, 9.0, 7.0]]),
                 "TargetBox": u(r, (3, 2, 4))},
      {"code_type": "decode_center_size", "box_normalized": False,
       "variance": [0.1, 0.1, 0.2, 0.2]}, out="OutputBox"))
add("prior_box",
    S(lambda r: {"Input": np.zeros((1, 2, 2, 3)), "Image": np.zeros((1, 3, 8, 12))},
      {"min_sizes": [2.0], "max_sizes": [4.0], "aspect_ratios": [2.0], "flip": True},
      out="Boxes"))
add("multiclass_nms",
    S(lambda r: {"BBoxes": np.array([[[0.0, 0.0, 1.0, 1.0], [0.05, 0.0, 1.0, 1.0],
                                      [2.0, 2.0, 3.0, 3.0]]]),
                 "Scores": np.array([[[0.9, 0.9, 0.9], [0.7, 0.8, 0.05], [0.1, 0.2, 0.95]]])},
      {"score_threshold": 0.1, "nms_top_k": -1, "keep_top_k": -1}))
add("box_clip",
    S(lambda r: {"Input": (u(r, (3, 4), -2, 30), [[0, 1, 3]]),
                 "ImInfo": np.array([[10.0, 20.0, 1.0], [40.0, 40.0, 2.0]])}, out="Output"))
add("yolo_box",
    S(lambda r: {"X": u(r, (1, 14, 2, 2)), "ImgSize": np.array([[64, 96]], I32)},
      {"anchors": [10, 14, 23, 27], "class_num": 2, "downsample_ratio": 16}, out="Boxes"))
add("anchor_generator",
    S(lambda r: {"Input": np.zeros((1, 1, 2, 2))},
      {"anchor_sizes": [32.0, 64.0], "aspect_ratios": [0.5, 1.0], "stride": [16.0, 16.0]},
      out="Anchors"))
add("polygon_box_transform", S(lambda r: {"Input": u(r, (1, 4, 2, 3))}, out="Output"))
add("density_prior_box",
    S(lambda r: {"Input": np.zeros((1, 1, 1, 2)), "Image": np.zeros((1, 1, 8, 16))},
      {"densities": [2], "fixed_sizes": [4.0], "fixed_ratios": [1.0]}, out="Boxes"))
