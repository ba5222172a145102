"""Binary elementwise, comparison and logical ops against NumPy (Fluid's axis broadcasting)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.testing import build_op_program, check_output, run_op

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(elementwise_div|elementwise_floordiv|elementwise_mod)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(0)

ARITH = {
    "elementwise_add": lambda x, y: x + y,
    "elementwise_sub": lambda x, y: x - y,
    "elementwise_mul": lambda x, y: x * y,
    "elementwise_div": lambda x, y: x / y,
    "elementwise_max": np.maximum,
    "elementwise_min": np.minimum,
    "elementwise_pow": np.power,
}
# (X shape, Y shape, axis, how Y is laid out against X for the NumPy expectation)
CASES = [
    ((2, 3, 4), (2, 3, 4), -1, lambda y: y),
    ((2, 3, 4), (4,), -1, lambda y: y),
    ((2, 3, 4), (3,), 1, lambda y: y[None, :, None]),
    ((2, 3, 4), (2, 3), 0, lambda y: y[:, :, None]),
    ((2, 3, 4), (3, 1), 1, lambda y: y[None, :, :]),
    ((5, 1), (1, 6), -1, lambda y: y),
    ((4,), (3, 4), -1, lambda y: y),
    ((), (3,), -1, lambda y: y),
]


def _data(shape, dtype, positive=False):
    if np.dtype(dtype).kind == "f":
        a = RNG.uniform(0.5 if positive else -2, 2, size=shape)
    else:
        a = RNG.integers(1 if positive else -5, 6, size=shape)
    return np.asarray(a, dtype=dtype)


# every op with every broadcast case, float32 and float64 alternating so that each op meets
# both dtypes over the cases and each case both over the ops; every (op, case, dtype) compiles
# a kernel of its own, and the op's expression (a template), the loops of the broadcast and
# the dtype are independent parts of it: the whole cross product (twice as many) adds no path
ARITH_RUNS = [pytest.param(op, *case, ("float32", "float64")[(i + j) % 2],
                           id=f"{op}-case{j}-{('float32', 'float64')[(i + j) % 2]}")
              for i, op in enumerate(sorted(ARITH)) for j, case in enumerate(CASES)]


@pytest.mark.parametrize("op,xs,ys,axis,lay,dtype", ARITH_RUNS)
def test_arith_matches_numpy(op, xs, ys, axis, lay, dtype):
    positive = op in ("elementwise_pow", "elementwise_div")
    x, y = _data(xs, dtype, positive), _data(ys, dtype, positive)
    want = ARITH[op](x, lay(y)).astype(dtype)
    check_output(op, {"X": x, "Y": y}, {"axis": axis}, {"Out": want},
                 batch_unknown=len(xs) >= len(ys) and len(xs) > 1 and axis != 0)


@pytest.mark.parametrize("op", ["elementwise_add", "elementwise_sub", "elementwise_mul",
                                "elementwise_max", "elementwise_min"])
def test_arith_on_integers(op):
    x, y = _data((3, 4), "int64"), _data((4,), "int64")
    check_output(op, {"X": x, "Y": y}, {}, {"Out": ARITH[op](x, y)})


def test_integer_division_truncates_toward_zero_mod_and_floordiv_follow_python():
    x = np.array([-7, 7, -7, 7, 0], np.int64)
    y = np.array([2, 2, -2, -2, 3], np.int64)
    check_output("elementwise_div", {"X": x, "Y": y}, {}, {"Out": np.array([-3, 3, 3, -3, 0])})
    check_output("elementwise_floordiv", {"X": x, "Y": y}, {}, {"Out": np.array([-4, 3, 3, -4, 0])})
    check_output("elementwise_mod", {"X": x, "Y": y}, {}, {"Out": np.array([1, 1, -1, -1, 0])})
    xf = np.array([-7.5, 7.5], np.float32)
    yf = np.array([2.0, -2.0], np.float32)
    check_output("elementwise_mod", {"X": xf, "Y": yf}, {},
                 {"Out": np.array([0.5, -0.5], np.float32)})


def test_integer_division_by_zero_is_a_clear_error():
    x = np.array([1, 2], np.int64)
    with pytest.raises(OpRunError, match=r"op 'elementwise_div'.*division by zero"):
        run_op("elementwise_div", {"X": x, "Y": np.array([1, 0], np.int64)})


def test_float_division_by_zero_is_ieee():
    x = np.array([1.0, -1.0, 0.0], np.float32)
    out = run_op("elementwise_div", {"X": x, "Y": np.zeros(3, np.float32)})["Out"]
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


@pytest.mark.parametrize("xs,ys,axis,msg", [
    ((2, 3, 4), (3,), -1, r"do not broadcast with axis=-1"),
    ((2, 3, 4), (5,), 1, r"do not broadcast with axis=1"),
    ((2, 3, 4), (3, 4), 2, r"axis=2 is out of range"),
])
def test_bad_shapes_are_refused_at_build_time(xs, ys, axis, msg):
    with pytest.raises(OpShapeError, match=msg):
        build_op_program("elementwise_add", {"X": np.zeros(xs, np.float32),
                                             "Y": np.zeros(ys, np.float32)}, {"axis": axis})


def test_mixed_dtypes_are_refused():
    with pytest.raises(OpShapeError, match="expected Y float32, got float64"):
        build_op_program("elementwise_mul", {"X": np.zeros(3, np.float32),
                                             "Y": np.zeros(3, np.float64)})


COMPARE = {"less_than": np.less, "less_equal": np.less_equal, "greater_than": np.greater,
           "greater_equal": np.greater_equal, "equal": np.equal, "not_equal": np.not_equal}


@pytest.mark.parametrize("op", sorted(COMPARE))
@pytest.mark.parametrize("dtype", ["float32", "int64", "int32"])
def test_comparisons(op, dtype):
    x = _data((3, 4), dtype)
    y = x.copy()
    y[0] += 1
    y[1] -= 1
    check_output(op, {"X": x, "Y": y}, {}, {"Out": COMPARE[op](x, y)}, batch_unknown=True)
    yb = _data((4,), dtype)
    check_output(op, {"X": x, "Y": yb}, {"axis": -1}, {"Out": COMPARE[op](x, yb)})


@pytest.mark.parametrize("op,fn", [("logical_and", np.logical_and), ("logical_or", np.logical_or),
                                   ("logical_xor", np.logical_xor)])
def test_logical(op, fn):
    a = RNG.integers(0, 2, (4, 3)).astype(bool)
    b = RNG.integers(0, 2, (4, 3)).astype(bool)
    check_output(op, {"X": a, "Y": b}, {}, {"Out": fn(a, b)}, batch_unknown=True)
    check_output("logical_not", {"X": a}, {}, {"Out": ~a})


@given(st.integers(0, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_axis_broadcast_property(axis, d0, d1, d2):
    """Y = X's dims [axis, axis + len(Y)) broadcasts exactly like NumPy after reshaping."""
    xs = (d0, d1, d2, 2)
    axis = min(axis, 3)
    ys = xs[axis:axis + 1]
    x, y = _data(xs, "float64"), _data(ys, "float64")
    shape = [1] * 4
    shape[axis] = ys[0]
    check_output("elementwise_sub", {"X": x, "Y": y}, {"axis": axis},
                 {"Out": x - y.reshape(shape)})
