"""Unary elementwise ops (activations, scale, clip, cast, increment) against NumPy."""
import numpy as np
import pytest

from pdjit.framework import dtypes
from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.testing import build_op_program, check_output

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(clip|scale)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(1)


def _x(dtype, shape=(3, 4), low=-3.0, high=3.0):
    return RNG.uniform(low, high, size=shape).astype(dtype)


UNARY = {
    "relu": (lambda x: np.where(x > 0, x, 0), -3, 3),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x.astype(np.float64))), -30, 30),
    "tanh": (lambda x: np.tanh(x.astype(np.float64)), -5, 5),
    "exp": (lambda x: np.exp(x.astype(np.float64)), -5, 5),
    "log": (lambda x: np.log(x.astype(np.float64)), 0.01, 10),
    "sqrt": (lambda x: np.sqrt(x.astype(np.float64)), 0, 10),
    "rsqrt": (lambda x: 1 / np.sqrt(x.astype(np.float64)), 0.1, 10),
    "reciprocal": (lambda x: 1 / x.astype(np.float64), 0.5, 4),
    "abs": (np.abs, -3, 3),
    "square": (lambda x: x.astype(np.float64) ** 2, -3, 3),
    "floor": (np.floor, -3, 3),
    "ceil": (np.ceil, -3, 3),
    "sign": (np.sign, -3, 3),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(7,), (2, 3, 4), ()])
def test_unary_matches_numpy(op, dtype, shape):
    fn, lo, hi = UNARY[op]
    x = _x(dtype, shape, lo, hi)
    rtol = 2e-6 if dtype == "float32" else 1e-12
    check_output(op, {"X": x}, {}, {"Out": np.asarray(fn(x)).astype(dtype)}, rtol=rtol,
                 batch_unknown=len(shape) > 1)


def test_sigmoid_saturates_without_overflow():
    x = np.array([-1000, -80, 0, 80, 1000], np.float32)
    check_output("sigmoid", {"X": x}, {}, {"Out": np.array([0, 1 / (1 + np.exp(80.0)), 0.5, 1, 1],
                                                         np.float32)})


@pytest.mark.parametrize("op", ["relu", "abs", "square", "sign"])
def test_integer_activations(op):
    x = RNG.integers(-5, 5, (3, 3)).astype(np.int64)
    check_output(op, {"X": x}, {}, {"Out": UNARY[op][0](x).astype(np.int64)})


def test_leaky_relu():
    x = _x("float32")
    check_output("leaky_relu", {"X": x}, {"alpha": 0.1}, {"Out": np.where(x > 0, x, 0.1 * x)})
    check_output("leaky_relu", {"X": x}, {}, {"Out": np.where(x > 0, x, np.float32(0.02) * x)})


@pytest.mark.parametrize("after", [True, False])
def test_scale(after):
    x = _x("float64")
    want = x * 2.5 + 0.5 if after else (x + 0.5) * 2.5
    check_output("scale", {"X": x}, {"scale": 2.5, "bias": 0.5, "bias_after_scale": after},
                 {"Out": want}, batch_unknown=True)
    s = np.array([3.0])
    check_output("scale", {"X": x, "ScaleTensor": s}, {"bias": 1.0}, {"Out": x * 3.0 + 1.0})
    check_output("scale", {"X": x, "ScaleTensor": s, "BiasTensor": np.array([-2.0])}, {},
                 {"Out": x * 3.0 - 2.0})


def test_scale_on_integers_truncates_its_attributes_like_paddle():
    x = np.array([1, 2, 3], np.int64)
    check_output("scale", {"X": x}, {"scale": 2.7, "bias": 0.5}, {"Out": x * 2})


def test_clip():
    x = _x("float32")
    check_output("clip", {"X": x}, {"min": -0.5, "max": 1.0}, {"Out": np.clip(x, -0.5, 1.0)})
    check_output("clip", {"X": x, "Min": np.array([0.0], np.float32),
                          "Max": np.array([0.5], np.float32)}, {}, {"Out": np.clip(x, 0, 0.5)})
    with pytest.raises(OpRunError, match="expected min <= max"):
        check_output("clip", {"X": x}, {"min": 1.0, "max": 0.0})


@pytest.mark.parametrize("src,dst", [("float32", "int64"), ("float64", "float32"),
                                     ("int64", "float32"), ("int32", "bool"), ("bool", "float64"),
                                     ("float32", "int32")])
def test_cast(src, dst):
    x = (RNG.uniform(-3, 3, (4, 5)) * (10 if src.startswith("int") else 1)).astype(src)
    check_output("cast", {"X": x}, {"in_dtype": dtypes.to_code(src),
                                    "out_dtype": dtypes.to_code(dst)},
                 {"Out": x.astype(dst)}, batch_unknown=True)


def test_cast_checks_in_dtype():
    with pytest.raises(OpShapeError, match="in_dtype says float64, but X is float32"):
        build_op_program("cast", {"X": np.zeros(3, np.float32)}, {"in_dtype": 6, "out_dtype": 5})


def test_increment():
    check_output("increment", {"X": np.array([3], np.int64)}, {"step": 2.0},
                 {"Out": np.array([5], np.int64)})
    check_output("increment", {"X": np.array([0.5], np.float32)}, {},
                 {"Out": np.array([1.5], np.float32)})
    with pytest.raises(OpShapeError, match="one-element tensor"):
        build_op_program("increment", {"X": np.zeros((2, 2), np.float32)})


def test_float_only_ops_refuse_integers():
    with pytest.raises(OpShapeError, match=r"op 'exp'.*expected dtype float16, float32, float64, "
                                           r"got int64"):
        build_op_program("exp", {"X": np.zeros(3, np.int64)})
