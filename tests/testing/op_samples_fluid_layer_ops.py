"""Samples (see ``op_samples.py``) of the ops Fluid 1.8's layers append under names of their
own (``src/pdjit/ops/fluid_layer_ops.py``). Imported at the end of ``op_samples.py``."""
from __future__ import annotations

import numpy as np
from op_samples import I64, S, add, distinct, pos, probs, u

add("label_smooth",
    S(lambda r: {"X": probs(r, (2, 3))}, {"epsilon": 0.1}, grad=["X"]),
    S(lambda r: {"X": probs(r, (2, 3)), "PriorDist": probs(r, (1, 3))}, {"epsilon": 0.2},
      grad=["X"]))
add("maxout",
    S(lambda r: {"X": distinct(r, (2, 4, 2, 2))}, {"groups": 2, "axis": 1}, grad=["X"]),
    S(lambda r: {"X": distinct(r, (1, 2, 2, 6))}, {"groups": 3, "axis": -1}, grad=["X"]))
add("lrn",
    S(lambda r: {"X": u(r, (2, 5, 2, 2))},
      {"n": 3, "k": 1.0, "alpha": 0.1, "beta": 0.75, "data_format": "NCHW"}, grad=["X"]),
    S(lambda r: {"X": u(r, (1, 2, 2, 4))},
      {"n": 4, "k": 2.0, "alpha": 0.2, "beta": 0.5, "data_format": "NHWC"}, grad=["X"]))
add("pixel_shuffle", S(lambda r: {"X": u(r, (1, 8, 2, 3))}, {"upscale_factor": 2},
                       grad=["X"]))
add("shuffle_channel", S(lambda r: {"X": u(r, (2, 6, 2, 2))}, {"group": 3}, grad=["X"]))
add("space_to_depth", S(lambda r: {"X": u(r, (1, 4, 4, 2))}, {"blocksize": 2}, grad=["X"]))
add("temporal_shift", S(lambda r: {"X": u(r, (4, 4, 2, 2))},
                        {"seg_num": 2, "shift_ratio": 0.25}, grad=["X"]))
add("pad2d",
    S(lambda r: {"X": u(r, (1, 2, 3, 3))},
      {"paddings": [1, 0, 2, 1], "mode": "constant", "pad_value": 0.5}, grad=["X"]),
    S(lambda r: {"X": u(r, (1, 2, 3, 3))}, {"paddings": [2, 1, 0, 2], "mode": "reflect"},
      grad=["X"]),
    S(lambda r: {"X": u(r, (1, 3, 3, 2))},
      {"paddings": [1, 2, 1, 0], "mode": "edge", "data_format": "NHWC"}, grad=["X"]),
    S(lambda r: {"X": u(r, (1, 1, 2, 3)), "Paddings": np.array([0, 1, 1, 0], np.int32)},
      {"mode": "constant"}))
add("flip", S(lambda r: {"X": u(r, (2, 3, 4))}, {"dims": [0, 2]}, grad=["X"]))
add("tril_triu",
    S(lambda r: {"X": u(r, (2, 3, 4))}, {"diagonal": 1, "lower": True}, grad=["X"]),
    S(lambda r: {"X": u(r, (3, 4))}, {"diagonal": -1, "lower": False}, grad=["X"]))
add("expand_as", S(lambda r: {"X": u(r, (2, 1, 3)), "target_tensor": u(r, (2, 4, 3))},
                   grad=["X"]))
add("reduce_all",
    S(lambda r: {"X": r.uniform(size=(2, 3)) > 0.3}, {"dim": [1]}),
    S(lambda r: {"X": np.ones((2, 3), bool)}, {"dim": [0], "reduce_all": True}))
add("reduce_any",
    S(lambda r: {"X": r.uniform(size=(2, 3)) > 0.7}, {"dim": [0], "keep_dim": True}),
    S(lambda r: {"X": np.zeros((2, 3), bool)}, {"reduce_all": True}))
add("size", S(lambda r: {"Input": u(r, (2, 3, 4))}))
add("clip_by_norm",
    S(lambda r: {"X": pos(r, (2, 3))}, {"max_norm": 1.0}),
    S(lambda r: {"X": u(r, (2, 3)) * 0.1}, {"max_norm": 2.0}))
add("one_hot",
    S(lambda r: {"X": r.integers(0, 4, (3, 1)).astype(I64)}, {"depth": 4, "dtype": 5}),
    S(lambda r: {"X": np.array([[1], [5]], I64)},
      {"depth": 3, "dtype": 6, "allow_out_of_range": True}))
add("temporal_shift", S(lambda r: {"X": u(r, (4, 2, 2, 4))},
                        {"seg_num": 2, "shift_ratio": 0.25, "data_format": "NHWC"},
                        grad=["X"]))
add("flip", S(lambda r: {"X": u(r, (2, 3))}, {"axis": [1]}, grad=["X"]))
add("roll",
    S(lambda r: {"X": u(r, (2, 3, 4))}, {"shifts": [1, -2], "axis": [0, 2]}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"shifts": [2], "dims": [1]}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"shifts": [-1]}, grad=["X"]))
add("index_sample", S(lambda r: {"X": u(r, (3, 4)), "Index": r.integers(0, 4, (3, 2))},
                      grad=["X"]))
add("crop_tensor",
    S(lambda r: {"X": u(r, (3, 4))}, {"shape": [2, -1], "offsets": [1, 1]}, grad=["X"]),
    S(lambda r: {"X": u(r, (3, 4)), "Shape": np.array([2, 2], np.int32),
                 "Offsets": np.array([0, 1], np.int32)}, grad=["X"]))
add("crop",
    S(lambda r: {"X": u(r, (3, 4)), "Y": u(r, (2, 2))}, {"offsets": [1, 2]}, grad=["X"]),
    S(lambda r: {"X": u(r, (3, 4))}, {"shape": [1, 3], "offsets": [2, 0]}, grad=["X"]))
add("diag", S(lambda r: {"Diagonal": u(r, (3,))}, grad=["Diagonal"]))
add("kron",
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (3, 2))}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (2,)), "Y": u(r, (2, 2))}, grad=["X", "Y"]))
add("trace",
    S(lambda r: {"Input": u(r, (3, 4))}, {"offset": 1}, grad=["Input"]),
    S(lambda r: {"Input": u(r, (2, 3, 4))}, {"offset": -1, "axis1": 1, "axis2": 2},
      grad=["Input"]),
    S(lambda r: {"Input": u(r, (3, 2, 3))}, {"dim1": 0, "dim2": 2}, grad=["Input"]))
add("cross",
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (2, 3))}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (3, 3)), "Y": u(r, (3, 3))}, {"dim": 0}, grad=["X", "Y"]))
add("addmm", S(lambda r: {"Input": u(r, (1, 4)), "X": u(r, (2, 3)), "Y": u(r, (3, 4))},
               {"Alpha": 2.0, "Beta": 0.5}, grad=["Input", "X", "Y"]))
add("bilinear_tensor_product",
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (2, 4)), "Weight": u(r, (5, 3, 4)),
                 "Bias": u(r, (1, 5))}, grad=["X", "Y", "Weight", "Bias"]),
    S(lambda r: {"X": u(r, (2, 2)), "Y": u(r, (2, 3)), "Weight": u(r, (1, 2, 3))},
      grad=["X", "Y", "Weight"]))
add("affine_grid",
    S(lambda r: {"Theta": u(r, (2, 2, 3))}, {"output_shape": [2, 1, 3, 4]}, grad=["Theta"],
      out="Output"),
    S(lambda r: {"Theta": u(r, (1, 2, 3)), "OutputShape": np.array([1, 1, 2, 3], np.int32)},
      {"align_corners": False}, grad=["Theta"], out="Output"))
add("eye", S(lambda r: {}, {"num_rows": 2, "num_columns": 3}),
    S(lambda r: {}, {"num_rows": 3, "dtype": 6}))
add("shard_index", S(lambda r: {"X": np.array([[0], [3], [7], [5]], I64)},
                     {"index_num": 8, "nshards": 3, "shard_id": 1, "ignore_value": -1}))
add("unstack", S(lambda r: {"X": u(r, (2, 3))}, {"axis": 1, "num": 3}, grad=["X"], out="Y",
                 outputs={"Y": 3}))
add("multiplex", S(lambda r: {"X": [u(r, (3, 2)), u(r, (3, 2))],
                              "Ids": np.array([[1], [0], [1]], np.int32)}, grad=["X"]))
add("meshgrid", S(lambda r: {"X": [u(r, (2,)), u(r, (3,))]}, grad=["X"],
                  outputs={"Out": 2}))
add("pad_constant_like", S(lambda r: {"X": u(r, (3, 4)), "Y": u(r, (2, 3))},
                           {"pad_value": 0.5}, grad=["Y"]))
add("fsp", S(lambda r: {"X": u(r, (2, 3, 2, 2)), "Y": u(r, (2, 2, 2, 2))}, grad=["X", "Y"]))
add("diag_embed",
    S(lambda r: {"Input": u(r, (2, 3))}, grad=["Input"]),
    S(lambda r: {"Input": u(r, (2, 3))}, {"offset": 1, "dim1": 0, "dim2": -1}, grad=["Input"]),
    S(lambda r: {"Input": u(r, (3,))}, {"offset": -1}, grad=["Input"]))
add("dist",
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (3,))}, {"p": 2.0}, grad=["X", "Y"]),
    S(lambda r: {"X": distinct(r, (2, 3)), "Y": distinct(r, (1, 3)) + 3.0}, {"p": 3.0},
      grad=["X", "Y"]),
    S(lambda r: {"X": distinct(r, (2, 3)), "Y": np.zeros((2, 3))}, {"p": float("inf")},
      grad=["X"]))
add("uniform_random_batch_size_like",
    S(lambda r: {"Input": u(r, (3, 2))}, {"shape": [-1, 4], "min": -2.0, "max": 0.5}),
    S(lambda r: {"Input": u(r, (2, 5))}, {"shape": [3, -1], "input_dim_idx": 1,
                                          "output_dim_idx": 1, "dtype": 6}))
add("gaussian_random_batch_size_like",
    S(lambda r: {"Input": u(r, (3, 2))}, {"shape": [-1, 4], "mean": 1.0, "std": 0.5}))
add("randint", S(lambda r: {}, {"low": -2, "high": 5, "shape": [3, 4]}),
    S(lambda r: {"ShapeTensor": np.array([2, 2], I64)}, {"low": 0, "high": 3, "dtype": 2}))
add("randperm", S(lambda r: {}, {"n": 6}), S(lambda r: {}, {"n": 1, "dtype": 2}))
add("hash", S(lambda r: {"X": r.integers(-50, 50, (3, 2)).astype(np.int32)},
              {"num_hash": 3, "mod_by": 1000}),
    S(lambda r: {"X": r.integers(0, 9, (2, 5)).astype(I64)}, {"num_hash": 1, "mod_by": 7}))
add("similarity_focus",
    S(lambda r: {"X": distinct(r, (2, 3, 2, 3))}, {"axis": 1, "indexes": [0, 2]}),
    S(lambda r: {"X": distinct(r, (1, 2, 3, 2))}, {"axis": 3, "indexes": [1]}))
add("bipartite_match",
    S(lambda r: {"DistMat": distinct(r, (3, 4)) + 2.0}, {"match_type": "bipartite"},
      out="ColToRowMatchIndices"),
    S(lambda r: {"DistMat": r.uniform(0.0, 1.0, (2, 4))},
      {"match_type": "per_prediction", "dist_threshold": 0.3}, out="ColToRowMatchIndices"))
add("target_assign",
    S(lambda r: {"X": (u(r, (3, 2, 4)), [[0, 2, 3]]),
                 "MatchIndices": np.array([[1, -1], [-1, 0]], np.int32),
                 "NegIndices": (np.array([[1], [0]], np.int32), [[0, 1, 2]])},
      {"mismatch_value": 1}))
