"""mul, matmul and matmul_v2 against NumPy products (Paddle 3.3.1's shape rules)."""
import numpy as np
import pytest

from pdjit.framework import registry
from pdjit.framework.errors import OpShapeError
from pdjit.testing import build_op_program, check_output

# op 'matmul_v2' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(matmul_v2)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(1)
DTYPES = ["float32", "float64"]


def _rand(shape, dtype):
    return RNG.uniform(-1, 1, size=shape).astype(dtype)


def _tr(a, flag):
    """op(a): swap the last two dims when asked (a vector is never transposed)."""
    return np.swapaxes(a, -1, -2) if flag and a.ndim > 1 else a


# ---- mul ---------------------------------------------------------------------------------------
MUL_CASES = [  # X shape, Y shape, x_num_col_dims, y_num_col_dims, output shape
    ((2, 3), (3, 4), 1, 1, (2, 4)),
    ((2, 3, 4), (12, 5), 1, 1, (2, 5)),
    ((2, 3, 4), (4, 5, 2), 2, 1, (2, 3, 5, 2)),
    ((2, 3, 4), (3, 4, 5), 1, 2, (2, 5)),
    ((1, 6), (6, 1), 1, 1, (1, 1)),
]


@pytest.mark.parametrize("xs,ys,xn,yn,out_shape", MUL_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mul_flattens_then_multiplies(xs, ys, xn, yn, out_shape, dtype):
    x, y = _rand(xs, dtype), _rand(ys, dtype)
    rows, inner = int(np.prod(xs[:xn])), int(np.prod(xs[xn:]))
    cols = int(np.prod(ys[yn:]))
    want = np.zeros((rows, cols), dtype)
    x2, y2 = x.reshape(rows, inner), y.reshape(inner, cols)
    for i in range(rows):  # the product written out, independent of np.matmul
        for j in range(cols):
            want[i, j] = np.sum(x2[i, :] * y2[:, j])
    check_output("mul", {"X": x, "Y": y}, {"x_num_col_dims": xn, "y_num_col_dims": yn},
                 {"Out": want.reshape(out_shape)}, batch_unknown=True)


def test_mul_shape_errors_at_build_time():
    with pytest.raises(OpShapeError, match=r"op 'mul'.*width 3.*height 4.*expected them equal"):
        build_op_program("mul", {"X": np.ones((2, 3), "float32"), "Y": np.ones((4, 5), "float32")})
    with pytest.raises(OpShapeError, match=r"x_num_col_dims=2 does not fit X of shape \[2, 3\]"):
        build_op_program("mul", {"X": np.ones((2, 3), "float32"), "Y": np.ones((3, 5), "float32")},
                         {"x_num_col_dims": 2})
    with pytest.raises(OpShapeError, match=r"expected Y float32, got float64"):
        build_op_program("mul", {"X": np.ones((2, 3), "float32"), "Y": np.ones((3, 5))})
    with pytest.raises(OpShapeError, match=r"expected dtype float16, float32, float64, got int64"):
        build_op_program("mul", {"X": np.ones((2, 3), "int64"), "Y": np.ones((3, 5), "int64")})


# ---- matmul / matmul_v2 ------------------------------------------------------------------------
MATMUL_CASES = [  # X shape, Y shape, transpose X, transpose Y, output shape (Paddle 3.3.1)
    ((2, 3), (3, 4), False, False, (2, 4)),
    ((3, 2), (3, 4), True, False, (2, 4)),
    ((2, 3), (4, 3), False, True, (2, 4)),
    ((3, 2), (4, 3), True, True, (2, 4)),
    ((5, 2, 3), (5, 3, 4), False, False, (5, 2, 4)),
    ((2, 3), (5, 3, 4), False, False, (5, 2, 4)),
    ((5, 2, 3), (3, 4), False, False, (5, 2, 4)),
    ((2, 1, 3, 4), (1, 2, 4, 2), False, False, (2, 2, 3, 2)),
    ((2, 1, 3, 4), (2, 2, 4), False, True, (2, 2, 3, 2)),
    ((3,), (3, 4), False, False, (4,)),
    ((2, 3), (3,), False, False, (2,)),
    ((3, 2), (3,), True, False, (2,)),
    ((4, 2, 3), (3,), False, False, (4, 2)),
    ((3,), (2, 3, 5), False, False, (2, 5)),
    ((3,), (1, 3), True, True, (1,)),
]


def _expected(x, y, tx, ty):
    xm, ym = _tr(x, tx), _tr(y, ty)
    x2 = xm[None, :] if x.ndim == 1 else xm  # a 1-D X is a row, a 1-D Y a column
    y2 = ym[:, None] if y.ndim == 1 else ym
    out = np.einsum("...ik,...kj->...ij", x2, y2)
    if y.ndim == 1:
        out = out[..., 0]
    if x.ndim == 1:
        out = out[..., 0, :] if y.ndim > 1 else out[..., 0]
    return out


@pytest.mark.parametrize("xs,ys,tx,ty,out_shape", MATMUL_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_legacy(xs, ys, tx, ty, out_shape, dtype):
    x, y = _rand(xs, dtype), _rand(ys, dtype)
    want = (2.5 * _expected(x, y, tx, ty)).astype(dtype)
    assert want.shape == out_shape
    check_output("matmul", {"X": x, "Y": y},
                 {"transpose_X": tx, "transpose_Y": ty, "alpha": 2.5}, {"Out": want},
                 batch_unknown=len(xs) > 1 and len(ys) > 1)


@pytest.mark.parametrize("xs,ys,tx,ty,out_shape", MATMUL_CASES + [
    ((1, 3, 4), (2, 4, 5), False, False, (2, 3, 5)),  # refused by legacy matmul, fine here
    ((2, 1, 3, 4), (5, 4, 2), False, False, (2, 5, 3, 2)),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_v2(xs, ys, tx, ty, out_shape, dtype):
    x, y = _rand(xs, dtype), _rand(ys, dtype)
    want = _expected(x, y, tx, ty).astype(dtype)
    assert want.shape == out_shape
    check_output("matmul_v2", {"X": x, "Y": y}, {"trans_x": tx, "trans_y": ty}, {"Out": want},
                 batch_unknown=len(xs) > 1 and len(ys) > 1)


def test_vector_dot_vector_is_0d_in_both():
    x, y = _rand((4,), "float64"), _rand((4,), "float64")
    want = np.asarray(np.sum(x * y))
    check_output("matmul", {"X": x, "Y": y}, {"transpose_X": True, "transpose_Y": True},
                 {"Out": want})
    check_output("matmul_v2", {"X": x, "Y": y}, {}, {"Out": want})


def test_matmul_v2_on_integers():
    x = RNG.integers(-5, 5, size=(2, 3)).astype("int64")
    y = RNG.integers(-5, 5, size=(3, 4)).astype("int64")
    want = np.array([[sum(x[i, k] * y[k, j] for k in range(3)) for j in range(4)]
                     for i in range(2)], "int64")
    check_output("matmul_v2", {"X": x, "Y": y}, {}, {"Out": want})


@pytest.mark.parametrize("op,attrs", [("matmul", {"transpose_Y": True}),
                                      ("matmul_v2", {"trans_y": True})])
def test_inner_dims_must_agree(op, attrs):
    with pytest.raises(OpShapeError, match=rf"op '{op}'.*expected X's 3 columns to equal Y's "
                                           r"rows, got 4"):
        build_op_program(op, {"X": np.ones((2, 3), "float32"), "Y": np.ones((5, 4), "float32")},
                         attrs)


def test_unknown_inner_dim_is_accepted_at_build_time():
    prog, _, out = build_op_program("matmul", {"X": np.ones((2, 3), "float32"),
                                               "Y": np.ones((4, 5), "float32")},
                                    batch_unknown=True)  # Y's rows become -1
    assert out["Out"][0].shape == (-1, 5)


def test_batch_dims_errors():
    with pytest.raises(OpShapeError, match=r"batch sizes .* differ: expected equal batch sizes.*"
                                           r"got 1 and 2"):
        build_op_program("matmul", {"X": np.ones((1, 3, 4), "float32"),
                                    "Y": np.ones((2, 4, 5), "float32")})
    with pytest.raises(OpShapeError, match=r"batch dims of X \[3, 2, 3\] and Y \[4, 3, 5\] do "
                                           r"not broadcast"):
        build_op_program("matmul_v2", {"X": np.ones((3, 2, 3), "float32"),
                                       "Y": np.ones((4, 3, 5), "float32")})


def test_matmul_declares_opaque_and_pending_grad():
    for op in ("mul", "matmul", "matmul_v2"):
        d = registry.get(op)
        assert d.has(registry.OPAQUE) and isinstance(d.emit, registry.Opaque)
        assert callable(d.grad) and d.grad is not registry.NO_GRAD_YET
    assert registry.get("matmul").attrs["alpha"].type == registry.A.FLOAT
