"""One or more valid samples for every registered forward op (used by ``test_registry.py``).

``SAMPLES = {op_type: [sample, ...]}``. A sample is either

- a function ``rng -> (inputs, attrs)`` (run and compared across executor modes only), or
- a dict with the keys

  ``inputs``   ``{slot: array | [arrays]}``, or a function ``rng -> {slot: ...}``; a LoD
               input is an ``(array, lod)`` pair (or a ``LoDTensor``);
  ``attrs``    ``{name: value}`` (default ``{}``);
  ``outputs``  sizes of list outputs, e.g. ``{"Out": 2}`` for a split into 2 (default none);
  ``grad``     the input slots to gradient-check, or ``None`` (default: no gradient check);
  ``out``      the output slot the gradient check differentiates (default ``"Out"``).

:func:`materialize` turns either form into one :class:`Sample`.

Values are chosen where the ops are smooth: float inputs are float64; ``relu``/``abs``/
``sign``/``leaky_relu`` inputs keep away from 0, ``clip`` inputs from min/max, ``floor``/
``ceil`` from integers, ``reduce_max``/``top_k``/``arg_max`` inputs have no ties; ``log``/
``sqrt``/``rsqrt`` get positive inputs, divisors keep away from 0; labels and indices are int64
and in range. Shapes are small and mostly rank 2, so the compiled kernels are few.

A new op joins by adding an entry here: ``test_every_forward_op_has_a_sample`` fails until it
has one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

F64 = np.float64
I64 = np.int64

# VarType codes (PaddlePaddle's): dtype attributes of cast, fill_constant, random ops...
BOOL, INT32, INT64, FP32, FP64 = 0, 2, 3, 5, 6


# ---- value helpers ---------------------------------------------------------------------------
def u(rng, shape, lo=-1.0, hi=1.0):
    """Uniform float64 values in [lo, hi)."""
    return rng.uniform(lo, hi, size=shape).astype(F64)


def pos(rng, shape, lo=0.5, hi=2.0):
    """Positive float64 values (log, sqrt, divisors, products)."""
    return u(rng, shape, lo, hi)


def away(rng, shape, gap=0.2, hi=1.5):
    """Float64 values of random sign with ``gap <= |x| < hi``: away from a kink at 0."""
    mag = rng.uniform(gap, hi, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(F64)


def distinct(rng, shape, step=0.25):
    """Float64 values without ties (every pair at least ``step`` apart): max/min/argmax/top_k."""
    n = int(np.prod(shape))
    vals = (rng.permutation(n) - n / 2) * step + rng.uniform(-0.05, 0.05, size=n)
    return vals.reshape(shape).astype(F64)


def off_integer(rng, shape):
    """Float64 values at least 0.1 from every integer (floor, ceil)."""
    whole = rng.integers(-3, 3, size=shape)
    return (whole + rng.uniform(0.1, 0.9, size=shape)).astype(F64)


def probs(rng, shape):
    """Rows (last axis) of probabilities, each entry >= ~0.1."""
    p = rng.uniform(0.5, 1.5, size=shape)
    return (p / p.sum(axis=-1, keepdims=True)).astype(F64)


def labels(rng, shape, classes):
    return rng.integers(0, classes, size=shape).astype(I64)


def lr(value=0.1):
    return np.array([value], F64)


# ---- the sample form -------------------------------------------------------------------------
@dataclass
class Sample:
    inputs: dict
    attrs: dict = field(default_factory=dict)
    outputs: dict | None = None
    grad: list | None = None
    out: str = "Out"


def materialize(sample, rng) -> Sample:
    """A sample (function or dict) as a :class:`Sample` with its values drawn from ``rng``."""
    if callable(sample):
        inputs, attrs = sample(rng)
        return Sample(dict(inputs), dict(attrs or {}))
    inputs = sample["inputs"]
    inputs = inputs(rng) if callable(inputs) else inputs
    grad = sample.get("grad")
    return Sample(dict(inputs), dict(sample.get("attrs") or {}), sample.get("outputs"),
                  list(grad) if grad else None, sample.get("out", "Out"))


def S(inputs, attrs=None, grad=None, out="Out", outputs=None) -> dict:
    """A dict sample (keyword shorthand)."""
    d = {"inputs": inputs, "attrs": dict(attrs or {}), "grad": grad, "out": out}
    if outputs:
        d["outputs"] = outputs
    return d


SAMPLES: dict = {}


def add(op_type, *samples):
    SAMPLES.setdefault(op_type, []).extend(samples)


# ---- unary elementwise (activation.py, trig.py) ------------------------------------------------
add("relu", S(lambda r: {"X": away(r, (2, 3))}, grad=["X"]))
add("leaky_relu", S(lambda r: {"X": away(r, (2, 3))}, {"alpha": 0.1}, grad=["X"]))
add("sigmoid", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("tanh", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("exp", S(lambda r: {"X": u(r, (2, 3), -1, 1)}, grad=["X"]))
add("log", S(lambda r: {"X": pos(r, (2, 3))}, grad=["X"]))
add("sqrt", S(lambda r: {"X": pos(r, (2, 3))}, grad=["X"]))
add("rsqrt", S(lambda r: {"X": pos(r, (2, 3))}, grad=["X"]))
add("reciprocal", S(lambda r: {"X": away(r, (2, 3), gap=0.5)}, grad=["X"]))
add("abs", S(lambda r: {"X": away(r, (2, 3))}, grad=["X"]))
add("square", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("sin", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("cos", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("floor", S(lambda r: {"X": off_integer(r, (2, 3))}))
add("ceil", S(lambda r: {"X": off_integer(r, (2, 3))}))
add("sign", S(lambda r: {"X": away(r, (2, 3))}))
add("scale",
    S(lambda r: {"X": u(r, (2, 3))}, {"scale": 2.0, "bias": 0.5}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"scale": -1.5, "bias": 0.25, "bias_after_scale": False},
      grad=["X"]),
    # the factor and bias given as tensors (not lowered: the compiled plan runs the reference)
    S(lambda r: {"X": u(r, (2, 3)), "ScaleTensor": np.array([3.0]),
                 "BiasTensor": np.array([-0.5])}, grad=["X"]))


def _clip_x(r, shape, lo=-0.5, hi=0.5, gap=0.1):
    """Values in (-1, 1) at least ``gap`` from the clip bounds."""
    x = r.uniform(-1, 1, size=shape)
    for b in (lo, hi):
        near = np.abs(x - b) < gap
        x = np.where(near, b + np.where(x >= b, gap, -gap) * 1.5, x)
    return x.astype(F64)


add("clip",
    S(lambda r: {"X": _clip_x(r, (2, 3))}, {"min": -0.5, "max": 0.5}, grad=["X"]),
    S(lambda r: {"X": _clip_x(r, (2, 3)), "Min": np.array([-0.5]), "Max": np.array([0.5])},
      grad=["X"]))
add("cast",
    S(lambda r: {"X": u(r, (2, 3))}, {"in_dtype": FP64, "out_dtype": FP64}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3), -3, 3)}, {"in_dtype": FP64, "out_dtype": INT32}),
    S(lambda r: {"X": u(r, (2, 3))}, {"in_dtype": FP64, "out_dtype": FP32}),
    S(lambda r: {"X": r.integers(-3, 3, (2, 3)).astype(I64)}, {"in_dtype": INT64,
                                                               "out_dtype": FP64}))
add("increment", S(lambda r: {"X": np.array([2.0])}, {"step": 1.5}))
add("fill_zeros_like", S(lambda r: {"X": u(r, (2, 3))}))
add("assign", S(lambda r: {"X": u(r, (2, 3))}, grad=["X"]))
add("rnn_memory_helper", S(lambda r: {"X": u(r, (2, 3))}, {"dtype": FP64}, grad=["X"]))


# ---- binary elementwise, comparisons, logical ops (elementwise.py) -----------------------------
def _xy(r, x=(2, 3), y=(2, 3), xf=u, yf=u):
    return {"X": xf(r, x), "Y": yf(r, y)}


for _t in ("elementwise_add", "elementwise_sub", "elementwise_mul"):
    add(_t,
        S(lambda r: _xy(r), grad=["X", "Y"]),
        # Y broadcast along X's trailing dim, then along dim 0 with axis=0
        S(lambda r: _xy(r, y=(3,)), grad=["X", "Y"]),
        S(lambda r: _xy(r, y=(2,)), {"axis": 0}, grad=["X", "Y"]),
        # both operands broadcast: X [2, 1] against Y [1, 3]
        S(lambda r: _xy(r, x=(2, 1), y=(1, 3)), grad=["X", "Y"]),
        S(lambda r: {"X": r.integers(-5, 5, (2, 3)).astype(I64),
                     "Y": r.integers(-5, 5, (3,)).astype(I64)}))
add("elementwise_div",
    S(lambda r: _xy(r, yf=lambda r, s: away(r, s, gap=0.5)), grad=["X", "Y"]),
    S(lambda r: _xy(r, y=(3,), yf=lambda r, s: away(r, s, gap=0.5)), grad=["X", "Y"]),
    S(lambda r: _xy(r, x=(2, 1), y=(1, 3), yf=lambda r, s: away(r, s, gap=0.5)),
      grad=["X", "Y"]))


def _max_min_xy(r, y_shape=(2, 3)):
    """X and Y that differ by >= 0.2 everywhere (no ties between them)."""
    y = u(r, y_shape)
    x = np.broadcast_to(y, (2, 3)) + away(r, (2, 3), gap=0.2, hi=1.0)
    return {"X": x.astype(F64), "Y": y}


for _t in ("elementwise_max", "elementwise_min"):
    add(_t, S(_max_min_xy, grad=["X", "Y"]),
        S(lambda r: _max_min_xy(r, (3,)), grad=["X", "Y"]))
add("elementwise_pow",
    S(lambda r: _xy(r, xf=pos, yf=lambda r, s: u(r, s, 0.5, 2.0)), grad=["X", "Y"]))
for _t in ("elementwise_floordiv", "elementwise_mod"):
    add(_t,
        S(lambda r: {"X": r.integers(-20, 20, (2, 3)).astype(I64),
                     "Y": r.integers(1, 5, (2, 3)).astype(I64)}),
        S(lambda r: {"X": u(r, (2, 3), -4, 4), "Y": pos(r, (2, 3), 0.5, 1.5)}))


def _with_ties(r, shape):
    """Float64 values from a small set, so X == Y happens."""
    return r.integers(0, 3, size=shape).astype(F64)


for _t in ("less_than", "less_equal", "greater_than", "greater_equal", "equal", "not_equal"):
    add(_t,
        S(lambda r: _xy(r, xf=_with_ties, yf=_with_ties)),
        S(lambda r: {"X": r.integers(0, 3, (2, 3)).astype(I64),
                     "Y": r.integers(0, 3, (3,)).astype(I64)}))


def _bools(r, shape):
    return r.random(size=shape) < 0.5


for _t in ("logical_and", "logical_or", "logical_xor"):
    add(_t, S(lambda r: {"X": _bools(r, (2, 3)), "Y": _bools(r, (2, 3))}))
add("logical_not", S(lambda r: {"X": _bools(r, (2, 3))}))


# ---- reductions (reduce.py) ------------------------------------------------------------------
for _t in ("reduce_sum", "reduce_mean"):
    add(_t,
        S(lambda r: {"X": u(r, (2, 3))}, {"dim": [1]}, grad=["X"]),
        S(lambda r: {"X": u(r, (2, 3))}, {"dim": [0], "keep_dim": True}, grad=["X"]),
        S(lambda r: {"X": u(r, (2, 3))}, {"reduce_all": True}, grad=["X"]))
for _t in ("reduce_max", "reduce_min"):
    add(_t,
        S(lambda r: {"X": distinct(r, (2, 3))}, {"dim": [1]}, grad=["X"]),
        S(lambda r: {"X": distinct(r, (2, 3))}, {"dim": [0], "keep_dim": True}, grad=["X"]))
add("reduce_prod",
    S(lambda r: {"X": pos(r, (2, 3), 0.5, 1.5)}, {"dim": [1]}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"reduce_all": True}, grad=["X"]))
add("reduce_sum",  # bool/int32 sums give int64
    S(lambda r: {"X": r.integers(-3, 3, (2, 3)).astype(np.int32)}, {"dim": [0]}),
    # rank 3: a middle axis, and two axes around one kept
    S(lambda r: {"X": u(r, (2, 3, 2))}, {"dim": [1]}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3, 2))}, {"dim": [0, -1], "keep_dim": True}, grad=["X"]))
add("reduce_max",
    S(lambda r: {"X": distinct(r, (2, 3, 2))}, {"dim": [-1, 0]}, grad=["X"]))
add("mean", S(lambda r: {"X": u(r, (2, 3))}, grad=["X"]))
add("sum",
    S(lambda r: {"X": [u(r, (2, 3)) for _ in range(3)]}, grad=["X"]),
    S(lambda r: {"X": [r.integers(-3, 3, (2, 3)).astype(I64) for _ in range(2)]}))
for _t in ("arg_max", "arg_min"):
    add(_t,
        S(lambda r: {"X": distinct(r, (2, 3))}, {"axis": 1}),
        S(lambda r: {"X": distinct(r, (2, 3))}, {"axis": 0, "keepdims": True, "dtype": INT32}),
        S(lambda r: {"X": distinct(r, (2, 3))}, {"axis": 0, "flatten": True}))
add("top_k",
    S(lambda r: {"X": distinct(r, (2, 4))}, {"k": 2}, grad=["X"]),
    S(lambda r: {"X": distinct(r, (2, 4)), "K": np.array([3], I64)}, grad=["X"]))
add("top_k_v2",
    S(lambda r: {"X": distinct(r, (2, 4))}, {"k": 2}, grad=["X"]),
    S(lambda r: {"X": distinct(r, (2, 4))}, {"k": 1, "axis": 0, "largest": False}, grad=["X"]))


# ---- matmul family (matmul.py) ----------------------------------------------------------------
add("mul",
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (3, 4))}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (2, 3, 2)), "Y": u(r, (2, 4))}, {"x_num_col_dims": 2},
      grad=["X", "Y"]))
add("matmul",
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (3, 4))}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (3, 2)), "Y": u(r, (4, 3))},
      {"transpose_X": True, "transpose_Y": True, "alpha": 2.0}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (2, 2, 3)), "Y": u(r, (3, 4))}, grad=["X", "Y"]))
add("matmul_v2",
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (3, 4))}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (2, 3)), "Y": u(r, (4, 3))}, {"trans_y": True}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (2, 2, 3)), "Y": u(r, (3, 4))}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (3,)), "Y": u(r, (3, 4))}, grad=["X", "Y"]))


# ---- nn (nn.py) -------------------------------------------------------------------------------
add("softmax",
    S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3), -2, 2)}, {"axis": 0}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 2, 3), -2, 2)}, grad=["X"]))
add("scaled_dot_product_attention",
    S(lambda r: {"Q": u(r, (2, 3, 4)), "K": u(r, (2, 5, 4)), "V": u(r, (2, 5, 3))},
      {"alpha": 0.5}),
    # heads of [batch, seq, heads, dim] values read and written through permutations, a mask
    S(lambda r: {"Q": u(r, (2, 3, 2, 4)), "K": u(r, (2, 5, 2, 4)), "V": u(r, (2, 5, 2, 3)),
                 "Mask": u(r, (2, 1, 1, 5), -2, 0)},
      {"alpha": 0.25, "q_perm": [0, 2, 1, 3], "k_perm": [0, 2, 1, 3], "v_perm": [0, 2, 1, 3],
       "out_perm": [0, 2, 1, 3]}),
    # K given as columns ([batch, dim, keys])
    S(lambda r: {"Q": u(r, (1, 2, 4)), "K": u(r, (1, 4, 6)), "V": u(r, (1, 6, 2)),
                 "Mask": u(r, (2, 6))}, {"k_perm": [0, 2, 1]}))
add("cross_entropy",
    S(lambda r: {"X": probs(r, (2, 3)), "Label": labels(r, (2, 1), 3)}, out="Y", grad=["X"]),
    S(lambda r: {"X": probs(r, (2, 3)), "Label": probs(r, (2, 3))}, {"soft_label": True},
      out="Y", grad=["X"]),
    S(lambda r: {"X": probs(r, (3, 3)), "Label": np.array([[0], [-100], [2]], I64)},
      out="Y", grad=["X"]))
add("cross_entropy2",
    S(lambda r: {"X": probs(r, (2, 3)), "Label": labels(r, (2, 1), 3)}, out="Y", grad=["X"]))
add("softmax_with_cross_entropy",
    S(lambda r: {"Logits": u(r, (2, 3), -2, 2), "Label": labels(r, (2, 1), 3)}, out="Loss",
      grad=["Logits"]),
    S(lambda r: {"Logits": u(r, (2, 3), -2, 2), "Label": probs(r, (2, 3))},
      {"soft_label": True}, out="Loss", grad=["Logits"]),
    S(lambda r: {"Logits": u(r, (2, 3), -2, 2), "Label": labels(r, (1, 3), 2)}, {"axis": 0},
      out="Loss", grad=["Logits"]))


def _accuracy_inputs(r):
    out = np.sort(r.uniform(0, 1, size=(4, 2)), axis=1)[:, ::-1].copy()
    indices = np.stack([r.permutation(3)[:2] for _ in range(4)]).astype(I64)
    return {"Out": out, "Indices": indices, "Label": labels(r, (4, 1), 3)}


add("accuracy", lambda r: (_accuracy_inputs(r), {}))  # the function form of a sample
add("dropout",
    S(lambda r: {"X": u(r, (2, 3))}, {"dropout_prob": 0.3, "seed": 7, "fix_seed": True},
      grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"dropout_prob": 0.4, "seed": 3, "fix_seed": True,
                                      "dropout_implementation": "upscale_in_train"}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"dropout_prob": 0.3, "is_test": True}, grad=["X"]))
add("lookup_table_v2",
    S(lambda r: {"Ids": labels(r, (2, 3), 5), "W": u(r, (5, 4))}, grad=["W"]),
    S(lambda r: {"Ids": np.array([[0, 2, 1], [2, 4, 2]], I64), "W": u(r, (5, 4))},
      {"padding_idx": 2}, grad=["W"]))


# ---- select and join (indexing.py) -------------------------------------------------------------
add("concat",
    S(lambda r: {"X": [u(r, (2, 3)), u(r, (1, 3))]}, {"axis": 0}, grad=["X"]),
    S(lambda r: {"X": [u(r, (2, 3)), u(r, (2, 1)), u(r, (2, 2))]}, {"axis": -1}, grad=["X"]),
    S(lambda r: {"X": [u(r, (2, 3)), u(r, (2, 2))], "AxisTensor": np.array([1], np.int32)},
      grad=["X"]))
add("stack",
    S(lambda r: {"X": [u(r, (2, 3)), u(r, (2, 3))]}, {"axis": 1}, out="Y", grad=["X"]))
add("split",
    S(lambda r: {"X": u(r, (4, 3))}, {"num": 2, "axis": 0}, outputs={"Out": 2}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 5))}, {"sections": [1, -1, 2], "axis": 1}, outputs={"Out": 3},
      grad=["X"]))
add("slice",
    S(lambda r: {"Input": u(r, (3, 4))}, {"axes": [0, 1], "starts": [1, 0], "ends": [3, -1]},
      grad=["Input"]),
    S(lambda r: {"Input": u(r, (3, 4))},
      {"axes": [0], "starts": [1], "ends": [2], "decrease_axis": [0]}, grad=["Input"]),
    S(lambda r: {"Input": u(r, (3, 4)), "StartsTensor": np.array([-2], I64),
                 "EndsTensor": np.array([100], I64)}, {"axes": [1]}, grad=["Input"]))
add("gather",
    S(lambda r: {"X": u(r, (4, 3)), "Index": np.array([3, 0, 3], I64)}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 4)), "Index": np.array([1, -1], I64)}, {"axis": 1},
      grad=["X"]),
    S(lambda r: {"X": u(r, (3, 2)), "Index": np.array([[2], [0]], I64)}, grad=["X"]))
add("one_hot_v2",
    S(lambda r: {"X": labels(r, (2, 3), 4)}, {"depth": 4}),
    S(lambda r: {"X": labels(r, (3,), 4), "depth_tensor": np.array([5], I64)},
      {"dtype": INT64}))


# ---- layout (shape.py) -------------------------------------------------------------------------
for _t in ("reshape", "reshape2"):
    add(_t,
        S(lambda r: {"X": u(r, (2, 3))}, {"shape": [3, 2]}, grad=["X"]),
        S(lambda r: {"X": u(r, (2, 3))}, {"shape": [0, -1, 1]}, grad=["X"]),
        S(lambda r: {"X": u(r, (2, 3)), "Shape": np.array([6], np.int32)}, grad=["X"]))
for _t in ("transpose", "transpose2"):
    add(_t,
        S(lambda r: {"X": u(r, (2, 3))}, {"axis": [1, 0]}, grad=["X"]),
        S(lambda r: {"X": u(r, (2, 3, 2))}, {"axis": [2, 0, 1]}, grad=["X"]))
add("squeeze2",
    S(lambda r: {"X": u(r, (2, 1, 3))}, {"axes": [1]}, grad=["X"]),
    S(lambda r: {"X": u(r, (1, 3, 1))}, {"axes": []}, grad=["X"]))
add("unsqueeze2",
    S(lambda r: {"X": u(r, (2, 3))}, {"axes": [0, -1]}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3)), "AxesTensor": np.array([1], np.int32)}, grad=["X"]))


# ---- creation (creation.py) --------------------------------------------------------------------
add("fill_constant",
    S({}, {"shape": [2, 3], "dtype": FP64, "value": 1.5}),
    S({}, {"shape": [3], "dtype": INT64, "value": 7.0}),
    S(lambda r: {"ShapeTensor": np.array([2, 3], I64)}, {"dtype": FP64, "value": -2.0}))
add("fill_constant_batch_size_like",
    S(lambda r: {"Input": u(r, (3, 2))}, {"shape": [-1, 4], "dtype": FP64, "value": 2.5}))
add("assign_value",
    S({}, {"shape": [2, 3], "dtype": FP32, "fp32_values": [0.5, 1.0, 1.5, -2.0, 0.0, 3.0]}),
    S({}, {"shape": [3], "dtype": INT64, "int64_values": [4, -1, 2]}))
add("uniform_random",
    S({}, {"shape": [2, 3], "dtype": FP64, "min": -2.0, "max": 3.0, "seed": 11}),
    S({}, {"shape": [4], "dtype": FP32, "seed": 12, "diag_num": 2, "diag_step": 1,
           "diag_val": 5.0}))
add("gaussian_random",
    S({}, {"shape": [2, 3], "dtype": FP64, "mean": 1.0, "std": 2.0, "seed": 13}))
add("truncated_gaussian_random",
    S({}, {"shape": [2, 3], "dtype": FP64, "mean": 0.5, "std": 1.0, "seed": 17}))


# ---- optimizer update ops (optimizer.py): state inputs, no gradient -------------------------
add("sgd",
    S(lambda r: {"Param": u(r, (2, 3)), "LearningRate": lr(), "Grad": u(r, (2, 3))}))
add("momentum",
    S(lambda r: {"Param": u(r, (2, 3)), "Grad": u(r, (2, 3)), "Velocity": u(r, (2, 3)),
                 "LearningRate": lr()}, {"mu": 0.9}),
    S(lambda r: {"Param": u(r, (2, 3)), "Grad": u(r, (2, 3)), "Velocity": u(r, (2, 3)),
                 "LearningRate": lr()},
      {"mu": 0.8, "use_nesterov": True, "regularization_method": "l2_decay",
       "regularization_coeff": 0.01}))


def _adam_state(r):
    return {"Param": u(r, (2, 3)), "Grad": u(r, (2, 3)), "LearningRate": lr(0.01),
            "Moment1": u(r, (2, 3), -0.1, 0.1), "Moment2": pos(r, (2, 3), 0.01, 0.1),
            "Beta1Pow": np.array([0.9 ** 3]), "Beta2Pow": np.array([0.999 ** 3])}


add("adam", S(_adam_state), S(_adam_state, {"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6}))
add("adamw", S(_adam_state, {"with_decay": True, "coeff": 0.05, "lr_ratio": 0.5}),
    S(_adam_state))
add("adagrad",
    S(lambda r: {"Param": u(r, (2, 3)), "Grad": u(r, (2, 3)), "Moment": pos(r, (2, 3), 0.1, 1),
                 "LearningRate": lr()}))


def _rmsprop_state(r, centered=False):
    s = {"Param": u(r, (2, 3)), "MeanSquare": pos(r, (2, 3), 0.5, 1.0), "Grad": u(r, (2, 3)),
         "Moment": u(r, (2, 3), -0.1, 0.1), "LearningRate": lr(0.01)}
    if centered:
        s["MeanGrad"] = u(r, (2, 3), -0.1, 0.1)
    return s


add("rmsprop",
    S(_rmsprop_state, {"momentum": 0.5}),
    {"inputs": lambda r: _rmsprop_state(r, True), "attrs": {"centered": True},
     "outputs": {"MeanGradOut": 1}})


# ---- control flow (ops/control_flow.py) ---------------------------------------------------------
# conditional_block / while own sub-blocks, select_output leaves its unselected outputs without
# a value, and the tensor-array ops take or give tensor arrays: they are exempt here
# (test_registry.NO_SAMPLE, CONTROL_FLOW) and covered by tests/layers/control_flow/.
def _merge_inputs(r):
    mask = np.array([[True], [False], [False], [True], [False]])
    x = u(r, (5, 3))
    return {"X": mask, "Mask": mask, "InTrue": x[mask[:, 0]], "InFalse": x[~mask[:, 0]]}


add("select_input",
    S(lambda r: {"X": [u(r, (2, 3)), u(r, (2, 3))], "Mask": np.array([1], np.int32)},
      grad=["X"]),
    S(lambda r: {"X": [u(r, (2, 3)), u(r, (2, 3)), u(r, (2, 3))],
                 "Mask": np.array([0], np.int32)}))
add("split_lod_tensor",
    S(lambda r: {"X": u(r, (4, 3)), "Mask": np.array([[True], [False], [True], [True]])},
      grad=["X"], out="OutTrue"),
    S(lambda r: {"X": u(r, (3, 2)), "Mask": np.zeros((3, 1), bool)}))
add("merge_lod_tensor", S(_merge_inputs, grad=["InTrue", "InFalse"]))


# ---- sequence ops (ops/sequence.py): LoD inputs as (array, lod) pairs, empty sequences in -----
SEQ_LOD = [[0, 2, 2, 5]]


def _lod_x(r, shape=(5, 3), f=u, lod=SEQ_LOD):
    return (f(r, shape), lod)


for _pool in ("AVERAGE", "SUM", "SQRT", "LAST", "FIRST"):
    add("sequence_pool", S(lambda r: {"X": _lod_x(r)}, {"pooltype": _pool, "pad_value": 0.5},
                           grad=["X"]))
add("sequence_pool",
    S(lambda r: {"X": _lod_x(r, f=distinct)}, {"pooltype": "MAX"}, grad=["X"]),
    S(lambda r: {"X": _lod_x(r, (5, 2), lod=[[0, 1, 3], [0, 2, 2, 5]])}, {"pooltype": "SUM"},
      grad=["X"]))
add("sequence_softmax", S(lambda r: {"X": _lod_x(r, (5, 1))}, grad=["X"]))
add("gather_tree", S(lambda r: {"Ids": r.integers(0, 9, size=(3, 2, 2)).astype(I64),
                                "Parents": r.integers(0, 2, size=(3, 2, 2)).astype(I64)}))
_BEAM_LOD = [[0, 2, 3], [0, 1, 2, 3]]
add("beam_search",
    S(lambda r: {"pre_ids": (np.array([[1], [2], [0]], I64), _BEAM_LOD),
                 "pre_scores": (np.array([[-0.5], [-0.9], [-0.3]]), _BEAM_LOD),
                 "ids": (np.array([[4, 5], [6, 4], [7, 8]], I64), _BEAM_LOD),
                 "scores": (u(r, (3, 2), -2.0, -0.1), _BEAM_LOD)},
      {"beam_size": 2, "end_id": 0}),
    S(lambda r: {"pre_ids": (np.array([[1], [2], [3]], I64), _BEAM_LOD),
                 "pre_scores": (u(r, (3, 1), -2.0, -0.1), _BEAM_LOD),
                 "scores": (u(r, (3, 4), 0.05, 1.0), _BEAM_LOD)},
      {"beam_size": 3, "end_id": 0, "is_accumulated": False}))
add("sequence_expand",
    S(lambda r: {"X": u(r, (3, 2)), "Y": _lod_x(r, (5, 1))}, grad=["X"]),
    S(lambda r: {"X": _lod_x(r, (3, 2), lod=[[0, 1, 1, 3]]), "Y": _lod_x(r, (5, 1))},
      {"ref_level": 0}, grad=["X"]))
add("sequence_expand_as", S(lambda r: {"X": u(r, (3, 2)), "Y": _lod_x(r, (5, 1))}, grad=["X"]))
add("sequence_concat",
    S(lambda r: {"X": [_lod_x(r, (5, 2)), _lod_x(r, (4, 2), lod=[[0, 0, 3, 4]])]}, grad=["X"]))
add("sequence_pad",
    S(lambda r: {"X": _lod_x(r), "PadValue": np.array([0.25])}, grad=["X"]),
    S(lambda r: {"X": _lod_x(r), "PadValue": u(r, (3,))}, {"padded_length": 4}, grad=["X"]))
add("sequence_unpad",
    S(lambda r: {"X": u(r, (3, 4, 2)), "Length": np.array([2, 0, 4], I64)}, grad=["X"]))
add("sequence_mask",
    S({"X": np.array([[0, 3], [1, 2]], I64)}, {"out_dtype": INT64}, out="Y"),
    S({"X": np.array([4, 1], I64), "MaxLenTensor": np.array([5], np.int32)},
      {"out_dtype": FP64}, out="Y"))
add("sequence_reverse", S(lambda r: {"X": _lod_x(r)}, grad=["X"], out="Y"))
add("lod_reset",
    S(lambda r: {"X": u(r, (5, 2))}, {"target_lod": [0, 4, 5]}, grad=["X"]),
    S(lambda r: {"X": _lod_x(r, (5, 2)), "Y": _lod_x(r, (5, 1), lod=[[0, 5]])}, grad=["X"]))

# ---- vision: activations, convolution, pooling --------------------------------------------------
add("relu6", S(lambda r: {"X": away(r, (2, 3), hi=1.5) * 4}, {"threshold": 4.0}, grad=["X"]))
add("hard_swish", S(lambda r: {"X": away(r, (2, 3)) * 2}, grad=["X"]))
add("hard_sigmoid", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("swish", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, {"beta": 1.5}, grad=["X"]))
add("silu", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("elu", S(lambda r: {"X": away(r, (2, 3))}, {"alpha": 0.5}, grad=["X"]))
add("selu", S(lambda r: {"X": away(r, (2, 3))}, grad=["X"]))
add("softplus", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, {"beta": 2.0}, grad=["X"]))
add("mish", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, grad=["X"]))
add("prelu",
    S(lambda r: {"X": away(r, (2, 3, 2)), "Alpha": pos(r, (1, 3, 1, 1), 0.1, 0.5)},
      {"mode": "channel"}, grad=["X", "Alpha"]),
    S(lambda r: {"X": away(r, (2, 3)), "Alpha": pos(r, (1,), 0.1, 0.5)}, {"mode": "all"},
      grad=["X", "Alpha"]))
for _conv in ("conv2d", "depthwise_conv2d"):
    add(_conv, S(lambda r: {"Input": u(r, (2, 2, 4, 3)), "Filter": u(r, (4, 1, 2, 2))},
                 {"groups": 2, "paddings": [1, 0], "strides": [2, 1]}, grad=["Input", "Filter"],
                 out="Output"))
for _conv in ("conv2d_transpose", "depthwise_conv2d_transpose"):
    add(_conv, S(lambda r: {"Input": u(r, (2, 2, 3, 2)), "Filter": u(r, (2, 1, 2, 2))},
                 {"groups": 2, "strides": [2, 1], "paddings": [0, 1]}, grad=["Input", "Filter"],
                 out="Output"))
add("pool2d",
    S(lambda r: {"X": distinct(r, (2, 2, 4, 5))}, {"ksize": [2, 2], "strides": [2, 2],
                                                    "ceil_mode": True}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 2, 4, 5))}, {"pooling_type": "avg", "ksize": [3, 3],
                                            "paddings": [1, 1], "exclusive": False},
      grad=["X"]))
add("max_pool2d_with_index",
    S(lambda r: {"X": distinct(r, (2, 2, 4, 5))}, {"ksize": [2, 2], "strides": [2, 2]},
      grad=["X"]))

# ---- vision: shape and image ops (image.py) -----------------------------------------------------
add("flatten_contiguous_range",
    S(lambda r: {"X": u(r, (2, 3, 2))}, {"start_axis": 1, "stop_axis": -1}, grad=["X"]))
add("flatten2", S(lambda r: {"X": u(r, (2, 3, 2))}, {"axis": 2}, grad=["X"]))
add("shape", S(lambda r: {"Input": u(r, (2, 3))}, out="Out"))
add("pad", S(lambda r: {"X": u(r, (2, 3))}, {"paddings": [1, 0, 0, 2], "pad_value": 0.5},
             grad=["X"]))
add("pad3d", S(lambda r: {"X": u(r, (1, 2, 2, 2, 3))},
               {"paddings": [1, 2, 0, 1, 1, 0], "mode": "reflect"}, grad=["X"]))
for _interp in ("bilinear_interp", "bilinear_interp_v2", "nearest_interp", "nearest_interp_v2"):
    add(_interp, S(lambda r: {"X": u(r, (1, 2, 3, 2))},
                   {"out_h": 4, "out_w": 3, "align_corners": False, "align_mode": 0,
                    "interp_method": "nearest" if _interp.startswith("n") else "bilinear"},
                   grad=["X"]))
add("affine_channel",
    S(lambda r: {"X": u(r, (2, 3, 2)), "Scale": u(r, (3,)), "Bias": u(r, (3,))},
      {"data_layout": "NCHW"}, grad=["X", "Scale", "Bias"]))

# ---- normalisation (norm.py) --------------------------------------------------------------------
def _bn_inputs(r):
    return {"X": u(r, (3, 2, 2)), "Scale": pos(r, (2,)), "Bias": u(r, (2,)),
            "Mean": u(r, (2,)), "Variance": pos(r, (2,))}


add("batch_norm", S(_bn_inputs, {"momentum": 0.8}, grad=["X", "Scale", "Bias"], out="Y"),
    S(_bn_inputs, {"use_global_stats": True, "data_layout": "NHWC"},
      grad=["X", "Scale", "Bias"], out="Y"))
add("instance_norm",
    S(lambda r: {"X": u(r, (2, 2, 3)), "Scale": pos(r, (2,)), "Bias": u(r, (2,))},
      grad=["X", "Scale", "Bias"], out="Y"))
add("group_norm",
    S(lambda r: {"X": u(r, (2, 4, 3)), "Scale": pos(r, (4,)), "Bias": u(r, (4,))},
      {"groups": 2}, grad=["X", "Scale", "Bias"], out="Y"))

# ---- transformer ops (norm.py, activation.py, matmul.py) ----------------------------------------
add("layer_norm",
    S(lambda r: {"X": u(r, (2, 2, 3)), "Scale": pos(r, (6,)), "Bias": u(r, (6,))},
      grad=["X", "Scale", "Bias"], out="Y"),
    # normalised over the last axis only, no affine parameters
    S(lambda r: {"X": u(r, (2, 3, 2))}, {"begin_norm_axis": 2, "epsilon": 1e-4}, grad=["X"],
      out="Y"))
add("gelu",
    S(lambda r: {"X": u(r, (2, 3), -3, 3)}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3), -3, 3)}, {"approximate": True}, grad=["X"]))
add("bmm", S(lambda r: {"X": u(r, (2, 2, 3)), "Y": u(r, (2, 3, 2))}, grad=["X", "Y"]))

# ---- indexing, tiling and scans (indexing.py, shape.py, creation.py) -----------------------------
add("argsort",
    S(lambda r: {"X": distinct(r, (2, 4))}, grad=["X"]),
    S(lambda r: {"X": distinct(r, (3, 2))}, {"axis": 0, "descending": True}, grad=["X"]))
add("cumsum",
    S(lambda r: {"X": u(r, (2, 3))}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"axis": 0, "exclusive": True, "reverse": True},
      grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"flatten": True}, grad=["X"]))
add("expand",
    S(lambda r: {"X": u(r, (2, 1))}, {"expand_times": [2, 3]}, grad=["X"]),
    S(lambda r: {"X": u(r, (1, 3)), "ExpandTimes": np.array([2, 1], np.int32)}, grad=["X"]))
add("expand_v2",
    S(lambda r: {"X": u(r, (3, 1))}, {"shape": [2, -1, 2]}, grad=["X"]),
    S(lambda r: {"X": u(r, (1, 3)), "Shape": np.array([2, 3], np.int32)}, grad=["X"]))
add("expand_as_v2",
    S(lambda r: {"X": u(r, (1, 3)), "Y": u(r, (2, 3))}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 1))}, {"target_shape": [2, 2, 3]}, grad=["X"]))
add("tile",
    S(lambda r: {"X": u(r, (2, 3))}, {"repeat_times": [2, 1, 2]}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 1)), "RepeatTimes": np.array([1, 3], np.int32)}, grad=["X"]))
add("fill_any_like",
    S(lambda r: {"X": u(r, (2, 3))}, {"value": 1.5}),
    S(lambda r: {"X": u(r, (2, 3))}, {"value": 3.0, "dtype": INT64}))
add("range",
    S({"Start": np.array([1.0]), "End": np.array([3.0]), "Step": np.array([0.5])}),
    S({"Start": np.array([5], I64), "End": np.array([-1], I64), "Step": np.array([-2], I64)}))
add("gather_nd",
    S(lambda r: {"X": u(r, (3, 2, 2)), "Index": np.array([[2, 1], [0, 0], [2, 1]], I64)},
      grad=["X"]),
    S(lambda r: {"X": u(r, (3, 2)), "Index": np.array([[[1]], [[2]]], I64)}, grad=["X"]))
add("index_select",
    S(lambda r: {"X": u(r, (3, 2)), "Index": np.array([2, 0, 2], I64)}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 4)), "Index": np.array([3, 1], np.int32)}, {"dim": 1},
      grad=["X"]))
add("scatter",
    S(lambda r: {"X": u(r, (4, 2)), "Ids": np.array([2, 0], I64), "Updates": u(r, (2, 2))},
      grad=["X", "Updates"]),
    # accumulate: repeated ids add up
    S(lambda r: {"X": u(r, (3, 2)), "Ids": np.array([1, 1, 0], I64), "Updates": u(r, (3, 2))},
      {"overwrite": False}, grad=["X", "Updates"]))
add("where",
    S(lambda r: {"Condition": _bools(r, (2, 3)), "X": u(r, (2, 3)), "Y": u(r, (2, 3))},
      grad=["X", "Y"]))
add("where_index",
    S(lambda r: {"Condition": _bools(r, (2, 3))}),
    S({"Condition": np.zeros((3,), bool)}))
add("masked_select",
    S(lambda r: {"X": u(r, (2, 3)), "Mask": np.array([[True, False, True],
                                                      [False, False, True]])},
      grad=["X"], out="Y"))
add("lookup_table",
    S(lambda r: {"W": u(r, (5, 3)), "Ids": labels(r, (4, 1), 5)}, grad=["W"]),
    S(lambda r: {"W": u(r, (5, 3)), "Ids": (np.array([[1], [3], [1]], I64), [[0, 2, 3]])},
      {"padding_idx": 1}, grad=["W"]))


# ---- recurrent ops (rnn.py): LoD inputs with an empty sequence, one and two layers --------------
H = 2
RNN_LOD = [[0, 2, 2, 3]]


def _lstm_inputs(r, peepholes=True, state=True):
    ins = {"Input": (u(r, (3, 4 * H)), RNN_LOD), "Weight": u(r, (H, 4 * H)),
           "Bias": u(r, (1, (7 if peepholes else 4) * H))}
    if state:
        ins.update(H0=u(r, (3, H)), C0=u(r, (3, H)))
    return ins


add("lstm",
    S(_lstm_inputs, grad=["Input", "Weight", "Bias", "H0", "C0"], out="Hidden"),
    S(lambda r: _lstm_inputs(r, peepholes=False, state=False),
      {"use_peepholes": False, "is_reverse": True, "candidate_activation": "relu"},
      grad=["Input", "Weight", "Bias"], out="Cell"))
add("gru",
    S(lambda r: {"Input": (u(r, (3, 3 * H)), RNN_LOD), "Weight": u(r, (H, 3 * H)),
                 "Bias": u(r, (1, 3 * H)), "H0": u(r, (3, H))},
      grad=["Input", "Weight", "Bias", "H0"], out="Hidden"),
    S(lambda r: {"Input": (u(r, (3, 3 * H)), RNN_LOD), "Weight": u(r, (H, 3 * H))},
      {"is_reverse": True, "origin_mode": True}, grad=["Input", "Weight"], out="Hidden"))
add("sequence_conv",
    S(lambda r: {"X": (u(r, (3, 2)), RNN_LOD), "Filter": u(r, (6, 3))},
      {"contextLength": 3, "contextStart": -1}, grad=["X", "Filter"]),
    S(lambda r: {"X": (u(r, (3, 2)), RNN_LOD), "Filter": u(r, (4, 3)),
                 "PaddingData": u(r, (1, 2))},
      {"contextLength": 2, "contextStart": -1, "paddingTrainable": True},
      grad=["X", "Filter", "PaddingData"]))


# ---- linear-chain CRF (crf.py) -------------------------------------------------------------------
def _crf_inputs(r, padded=False):
    if padded:
        return {"Emission": u(r, (2, 2, 3)), "Transition": u(r, (5, 3)),
                "Label": r.integers(0, 3, (2, 2)).astype(np.int64),
                "Length": np.array([2, 1], np.int64)}
    return {"Emission": (u(r, (3, 3)), RNN_LOD), "Transition": u(r, (5, 3)),
            "Label": (r.integers(0, 3, (3, 1)).astype(np.int64), RNN_LOD)}


add("linear_chain_crf",
    S(_crf_inputs, grad=["Emission", "Transition"], out="LogLikelihood"),
    S(lambda r: _crf_inputs(r, padded=True), grad=["Emission", "Transition"],
      out="LogLikelihood"))
add("crf_decoding",
    S(lambda r: {k: v for k, v in _crf_inputs(r).items() if k != "Label"}, out="ViterbiPath"),
    S(lambda r: _crf_inputs(r, padded=True), out="ViterbiPath"))


def _rnn_inputs(r, mode, layers=1, bidirec=False, lens=None, T=3, B=2, n_in=2):
    gates = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    d = 2 if bidirec else 1
    ws = []
    for layer in range(layers):
        for _ in range(d):
            ws += [u(r, (gates * H, n_in if layer == 0 else d * H)), u(r, (gates * H, H))]
    ws += [u(r, (gates * H,)) for _ in range(2 * layers * d)]
    pre = [u(r, (layers * d, B, H)) for _ in range(2 if mode == "LSTM" else 1)]
    ins = {"Input": u(r, (T, B, n_in)), "PreState": pre, "WeightList": ws}
    if lens is not None:
        ins["SequenceLength"] = np.array(lens, np.int32)
    return ins


def _rnn(mode, layers=1, bidirec=False, lens=None):
    return S(lambda r: _rnn_inputs(r, mode, layers, bidirec, lens),
             {"mode": mode, "num_layers": layers, "is_bidirec": bidirec, "hidden_size": H,
              "input_size": 2}, grad=["Input", "PreState", "WeightList"],
             outputs={"State": 2 if mode == "LSTM" else 1})


add("rnn", _rnn("LSTM"), _rnn("GRU", bidirec=True, lens=[3, 1]),
    _rnn("RNN_TANH", layers=2, lens=[2, 3]))


# ---- more optimizer update ops (optimizer.py: part D of issue 22) -----------------------------
def _state(r, *names, signed=()):
    """Param, Grad and a learning rate, plus state slots: positive, or signed for ``signed``."""
    s = {"Param": u(r, (2, 3)), "Grad": u(r, (2, 3)), "LearningRate": lr()}
    s.update({n: u(r, (2, 3)) if n in signed else pos(r, (2, 3), 0.1, 1) for n in names})
    return s


add("adamax", S(lambda r: {**_state(r, "Moment", "InfNorm", signed=("Moment",)),
                           "Beta1Pow": np.array([0.9 ** 3])}))
add("adadelta", S(lambda r: _state(r, "AvgSquaredGrad", "AvgSquaredUpdate"),
                  {"rho": 0.9, "epsilon": 1e-3}))
add("decayed_adagrad", S(lambda r: _state(r, "Moment"), {"decay": 0.9}))
add("ftrl",
    S(lambda r: _state(r, "SquaredAccumulator", "LinearAccumulator",
                       signed=("LinearAccumulator",)), {"l1": 0.1, "l2": 0.1}),
    S(lambda r: _state(r, "SquaredAccumulator", "LinearAccumulator",
                       signed=("LinearAccumulator",)), {"l1": 0.1, "lr_power": -0.25}))
add("lamb",
    S(lambda r: {**_state(r, "Moment1", "Moment2", signed=("Moment1",)),
                 "Beta1Pow": np.array([0.9 ** 3]), "Beta2Pow": np.array([0.999 ** 3])},
      {"weight_decay": 0.01}, outputs={"Beta1PowOut": 1, "Beta2PowOut": 1}))
add("lars_momentum",
    S(lambda r: {"Param": [u(r, (2, 3)), u(r, (4,))], "Grad": [u(r, (2, 3)), u(r, (4,))],
                 "Velocity": [u(r, (2, 3)), u(r, (4,))], "LearningRate": [lr(), lr(0.2)]},
      {"mu": 0.9, "lars_weight_decay": [0.001, 0.002]}, outputs={"ParamOut": 2,
                                                                "VelocityOut": 2}))
add("average_accumulates",
    S(lambda r: {"param": u(r, (2, 3)), "in_sum_1": u(r, (2, 3)), "in_sum_2": u(r, (2, 3)),
                 "in_sum_3": u(r, (2, 3)), "in_num_accumulates": np.array([4], I64),
                 "in_old_num_accumulates": np.array([2], I64),
                 "in_num_updates": np.array([9], I64)},
      {"average_window": 0.5, "min_average_window": 2, "max_average_window": 5}))


# ---- auc (ops/metric.py: part C of issue 22) ---------------------------------------------------
def _auc_sample(slide_steps, nt=16):
    def inputs(r):
        p = r.random((6, 1))
        size = nt + 1 if slide_steps == 0 else (slide_steps + 1) * (nt + 1) + 1
        stats = [r.integers(0, 3, (size,)).astype(I64) for _ in range(2)]
        return {"Predict": np.concatenate([1 - p, p], 1), "Label": labels(r, (6, 1), 2),
                "StatPos": stats[0], "StatNeg": stats[1]}
    return S(inputs, {"num_thresholds": nt, "slide_steps": slide_steps})


add("auc", _auc_sample(0), _auc_sample(2))
# ---- losses (loss.py) and utility ops (misc.py) ------------------------------------------------
_OFFSETS = np.array([[0.3, -1.5, 0.6], [-0.4, 1.8, -0.2]])  # residuals away from the kinks at 1


add("sigmoid_cross_entropy_with_logits",
    S(lambda r: {"X": u(r, (2, 3), -2, 2), "Label": u(r, (2, 3), 0, 1)}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3), -2, 2), "Label": u(r, (2, 3), 0, 1),
                 "pos_weight": pos(r, (2, 3))}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3), -2, 2),
                 "Label": np.array([[0.2, -100.0, 1.0], [0.0, 0.5, 1.0]])},
      {"normalize": True}, grad=["X"]))
add("bce_loss", S(lambda r: {"X": u(r, (2, 3), 0.1, 0.9), "Label": u(r, (2, 3), 0, 1)},
                  grad=["X"]))
add("huber_loss", S(lambda r: (lambda x: {"X": x, "Y": x + _OFFSETS})(u(r, (2, 3))),
                    {"delta": 1.0}, grad=["X", "Y"]))
add("smooth_l1_loss",
    S(lambda r: (lambda x: {"X": x, "Y": x - _OFFSETS})(u(r, (2, 3))), {"sigma": 1.0},
      grad=["X", "Y"]),
    S(lambda r: (lambda x: {"X": x.reshape(2, 3, 1), "Y": (x - _OFFSETS).reshape(2, 3, 1),
                            "InsideWeight": pos(r, (2, 3, 1), 0.9, 1.1),
                            "OutsideWeight": pos(r, (2, 3, 1))})(u(r, (2, 3))),
      {"sigma": 1.0}, grad=["X", "Y"]))
add("kldiv_loss", *[S(lambda r: {"X": u(r, (2, 3)), "Target": probs(r, (2, 3))},
                      {"reduction": red}, grad=["X"], out="Loss")
                    for red in ("none", "batchmean", "mean", "sum")],
    S(lambda r: {"X": u(r, (2, 3)), "Target": u(r, (2, 3))},
      {"reduction": "sum", "log_target": True}, grad=["X"], out="Loss"))
add("log_loss", S(lambda r: {"Predicted": u(r, (3, 1), 0.1, 0.9), "Labels": u(r, (3, 1), 0, 1)},
                  {"epsilon": 1e-4}, grad=["Predicted"], out="Loss"))
add("cos_sim", S(lambda r: {"X": u(r, (3, 4)), "Y": u(r, (3, 4))}, grad=["X", "Y"]),
    S(lambda r: {"X": u(r, (3, 2, 2)), "Y": u(r, (1, 2, 2))}, grad=["X", "Y"]))
add("is_empty", S(lambda r: {"X": u(r, (2, 3))}), S({"X": np.zeros((0, 3))}))
add("norm", S(lambda r: {"X": u(r, (2, 3, 4))}, {"axis": 1}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3))}, {"axis": -1, "epsilon": 1e-6}, grad=["X"]))
add("log_softmax", S(lambda r: {"X": u(r, (2, 3), -2, 2)}, {"axis": -1}, grad=["X"]),
    S(lambda r: {"X": u(r, (2, 3, 2), -2, 2)}, {"axis": 1}, grad=["X"]))
add("linspace",
    S({"Start": np.array([-1.0]), "Stop": np.array([2.0]), "Num": np.array([7], np.int32)},
      {"dtype": FP64}),
    S({"Start": np.array([0], np.int32), "Stop": np.array([10], np.int32),
       "Num": np.array([4], np.int32)}, {"dtype": INT32}))
for _check in ("isfinite", "isnan", "isinf"):
    add(_check, S(lambda r: {"X": u(r, (2, 3))}),
        S({"X": np.array([[1.0, np.inf], [np.nan, 0.0]])}))
add("print", S(lambda r: {"In": u(r, (2, 3))},
               {"summarize": 2, "print_phase": "BACKWARD"}, grad=["In"]))


# ---- edit_distance (metric.py): LoD sequences (an empty hypothesis) and padded ones ---------
def _ids(r, shape):
    return r.integers(0, 3, size=shape).astype(np.int64)


add("edit_distance",
    S(lambda r: {"Hyps": (_ids(r, (5, 1)), [[0, 2, 2, 5]]),
                 "Refs": (_ids(r, (4, 1)), [[0, 1, 3, 4]])}),
    S(lambda r: {"Hyps": (_ids(r, (5, 1)), [[0, 2, 2, 5]]),
                 "Refs": (_ids(r, (4, 1)), [[0, 1, 3, 4]])}, {"normalized": True}),
    S(lambda r: {"Hyps": _ids(r, (3, 4)), "Refs": _ids(r, (3, 5)),
                 "HypsLength": np.array([4, 2, 0], np.int64),
                 "RefsLength": np.array([5, 0, 1], np.int64)}))


# ---- chunk_eval (metric.py): IOB tags of LoD sequences (an empty one), IOBES padded ----------
add("chunk_eval",
    S(lambda r: {"Inference": (r.integers(0, 5, (6, 1)).astype(I64), [[0, 4, 4, 6]]),
                 "Label": (r.integers(0, 5, (6, 1)).astype(I64), [[0, 4, 4, 6]])},
      {"num_chunk_types": 2, "chunk_scheme": "IOB"}),
    S(lambda r: {"Inference": r.integers(0, 9, (2, 5)).astype(I64),
                 "Label": r.integers(0, 9, (2, 5)).astype(I64),
                 "SeqLength": np.array([5, 3], I64)},
      {"num_chunk_types": 2, "chunk_scheme": "IOBES", "excluded_chunk_types": [1]}))


# ---- collective ops (collective.py): one rank, no communicator (identities) -------------------
def _x2(r):
    return u(r, (2, 3)).astype(np.float64)


add("broadcast", S(lambda r: {"x": _x2(r)}, {"root": 0}, out="out"))
add("c_broadcast", S(lambda r: {"X": _x2(r)}, {"root": 0, "ring_id": 0}))
add("all_reduce", *[S(lambda r: {"x": _x2(r)}, {"reduce_type": t}, out="out") for t in (0, 1, 4)])
for _t in ("sum", "max", "min", "prod"):
    add(f"c_allreduce_{_t}", S(lambda r: {"X": _x2(r)}))
add("c_sync_calc_stream", S(lambda r: {"X": [_x2(r)]}, outputs={"Out": 1}))
add("c_sync_comm_stream", S(lambda r: {"X": [_x2(r), _x2(r)]}, outputs={"Out": 2}))
add("depend", S(lambda r: {"X": _x2(r), "Dep": [_x2(r)]}))
add("coalesce_tensor",
    S(lambda r: {"Input": [u(r, (2, 3)).astype(np.float64), u(r, (5,)).astype(np.float64)]},
      {"copy_data": True, "dtype": 6, "use_align": True, "align_size": 64},
      out="Output", outputs={"Output": 2}),
    S(lambda r: {"Input": [u(r, (3,)).astype(np.float64)]},
      {"set_constant": True, "constant": 1.5, "dtype": 6, "use_align": False},
      out="Output", outputs={"Output": 1}))


# ---- the ops completing Fluid 1.8's fluid.layers: samples in a module of their own -----------
import op_samples_fluid_gap  # noqa: E402,F401
import op_samples_fluid_layer_ops  # noqa: E402,F401
