"""Batched GEMM on the device: matmul / matmul_v2 / bmm with batch dims (equal, broadcast, one
operand without), transposes, alpha, vectors, and their gradients, as one batched tiled
kernel; against NumPy written here (strict CUDAPlace(0): native device code only)."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cuda import lib as cuda_lib
from pdjit.framework.errors import FallbackError
from pdjit.testing.op_test import CUDA, check_output

R = np.random.RandomState(5)
F = np.float32
TOL = {"rtol": 1e-5, "atol": 1e-5}


def r(*shape, dtype=F):
    return R.randn(*shape).astype(dtype)


def _cuda(op, inputs, attrs, expected, **kw):
    return check_output(op, inputs, attrs, expected, modes=[CUDA],
                        outputs={k: 1 for k in expected}, **{**TOL, **kw})


def _t(a, flag):
    return np.swapaxes(a, -1, -2) if flag and a.ndim > 1 else a


def _unbroadcast(g, shape):
    """``g`` summed down to ``shape`` (NumPy's broadcasting undone)."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    axes = tuple(i for i, (s, n) in enumerate(zip(shape, g.shape)) if s == 1 and n != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _want(x, y, tx, ty, alpha, g):
    """(Out, dX, dY) of ``Out = alpha * op(X) @ op(Y)`` for operands of rank >= 2."""
    a, b = _t(x, tx), _t(y, ty)
    out = alpha * np.matmul(a.astype(np.float64), b)
    ga = alpha * np.matmul(g.astype(np.float64), np.swapaxes(b, -1, -2))
    gb = alpha * np.matmul(np.swapaxes(a, -1, -2).astype(np.float64), g)
    dx = _unbroadcast(_t(ga, tx), x.shape)
    dy = _unbroadcast(_t(gb, ty), y.shape)
    return out.astype(x.dtype), dx.astype(x.dtype), dy.astype(y.dtype)


CASES = {  # name: (X shape, Y shape) as op(X), op(Y) multiply: before any transpose
    "equal": ((2, 3, 4), (2, 4, 5)),
    "broadcast": ((2, 1, 3, 4), (3, 4, 5)),
    "x_matrix": ((3, 4), (2, 4, 5)),
}


def _operands(xs, ys, tx, ty, dtype=F):
    x, y = r(*xs, dtype=dtype), r(*ys, dtype=dtype)
    return (_t(x, tx).copy() if tx else x), (_t(y, ty).copy() if ty else y)


@pytest.mark.parametrize("case,tx,ty", [("equal", False, False), ("equal", True, True),
                                        ("broadcast", False, True), ("x_matrix", True, False)])
def test_matmul_v2_batched_and_grad(case, tx, ty):
    x, y = _operands(*CASES[case], tx, ty)
    out0 = np.matmul(_t(x, tx), _t(y, ty))
    g = r(*out0.shape)
    out, dx, dy = _want(x, y, tx, ty, 1.0, g)
    attrs = {"trans_x": tx, "trans_y": ty}
    _cuda("matmul_v2", {"X": x, "Y": y}, attrs, {"Out": out})
    _cuda("matmul_v2_grad", {"X": x, "Y": y, "Out@GRAD": g}, attrs,
          {"X@GRAD": dx, "Y@GRAD": dy})


@pytest.mark.parametrize("xs,ys,tx,ty", [((2, 3, 4), (2, 4, 5), False, True),
                                         ((3, 4), (2, 4, 5), True, False),
                                         ((4, 3), (3, 5), False, False),
                                         ((2, 3, 4), (4, 5), False, False)])
def test_matmul_alpha_transposes_and_grad(xs, ys, tx, ty):
    x, y = _operands(xs, ys, tx, ty, np.float64)
    g = r(*np.matmul(_t(x, tx), _t(y, ty)).shape, dtype=np.float64)
    out, dx, dy = _want(x, y, tx, ty, 0.5, g)
    attrs = {"transpose_X": tx, "transpose_Y": ty, "alpha": 0.5}
    _cuda("matmul", {"X": x, "Y": y}, attrs, {"Out": out})
    _cuda("matmul_grad", {"X": x, "Y": y, "Out@GRAD": g}, attrs, {"X@GRAD": dx, "Y@GRAD": dy})


def test_matmul_v2_vector_times_batch_and_grad():
    x, y = r(4), r(2, 4, 3)
    out = np.matmul(x.astype(np.float64), y)
    g = r(2, 3)
    dx = np.einsum("bn,bkn->k", g, y)
    dy = np.einsum("k,bn->bkn", x, g)
    _cuda("matmul_v2", {"X": x, "Y": y}, {}, {"Out": out.astype(F)})
    _cuda("matmul_v2_grad", {"X": x, "Y": y, "Out@GRAD": g}, {},
          {"X@GRAD": dx.astype(F), "Y@GRAD": dy.astype(F)})


def test_bmm_and_grad():
    x, y, g = r(3, 2, 4), r(3, 4, 5), r(3, 2, 5)
    _cuda("bmm", {"X": x, "Y": y}, {}, {"Out": np.matmul(x, y)})
    _cuda("bmm_grad", {"X": x, "Y": y, "Out@GRAD": g}, {},
          {"X@GRAD": np.matmul(g, np.swapaxes(y, 1, 2)),
           "Y@GRAD": np.matmul(np.swapaxes(x, 1, 2), g)})


def test_batch_plan_merges_dims_that_broadcast_alike():
    # [2, 3] both, then [4] only X's: two merged dims, strides over each operand's batches
    plan = cuda_lib._batch_plan((2, 3, 4), (2, 3, 4), (2, 3, 1), (2, 3, 4))
    assert plan == [[1, True, 0, 0], [6, True, 4, 1], [4, True, 1, 0]]
    # Y's gradient of a broadcast Y: the dim it lacks is summed (not kept)
    plan = cuda_lib._batch_plan((5, 2), (5, 2), (5, 2), (1, 2))
    assert plan[1:] == [[5, False, 2, 2], [2, True, 1, 1]]
    with pytest.raises(ValueError, match="do not broadcast"):
        cuda_lib._batch_plan((2, 3), (2, 3), (3, 3), (2, 3))


def _alternating():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data("x", [2, 1, 2, 1, 2, 3], append_batch_size=False)
        y = fluid.layers.data("y", [1, 2, 1, 2, 3, 2], append_batch_size=False)
        out = fluid.layers.matmul(x, y)
    return main, out


def test_more_broadcast_patterns_than_the_kernel_takes_run_the_reference():
    # batch dims alternating which operand broadcasts: four merged dims, more than the kernel's
    # three; the step says why and the reference computes (strict refuses)
    main, out = _alternating()
    x, y = r(2, 1, 2, 1, 2, 3), r(1, 2, 1, 2, 3, 2)
    exe = fluid.Executor(fluid.CUDAPlace(0), strict=False)
    with pytest.warns(Warning, match="batch dims"):
        (got,) = exe.run(main, feed={"x": x, "y": y}, fetch_list=[out])
    np.testing.assert_allclose(got, np.matmul(x, y), rtol=1e-5, atol=1e-6)
    with pytest.raises(FallbackError, match="batch dims"):
        fluid.Executor(fluid.CUDAPlace(0), strict=True).run(
            main, feed={"x": x, "y": y}, fetch_list=[out])
