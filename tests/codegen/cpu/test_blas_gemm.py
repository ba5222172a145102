"""``nnlib.blas_gemm``: one BLAS GEMM call from compiled code (C and transposed operands, both
float dtypes, empty and misfit shapes), against NumPy's float64 products computed here; and
what it costs to compile against ``np.dot``."""
import numba
import numpy as np
import pytest

from pdjit.codegen.cpu.lib import blas_gemm

RNG = np.random.default_rng(7)


@numba.njit
def _all_forms(a, b, bt, at_, out):
    """The four layouts: out[0] = a @ b, out[1] = a @ bt.T, out[2] = at_.T @ b,
    out[3] = at_.T @ bt.T."""
    blas_gemm(a, b, out[0])
    blas_gemm(a, bt.T, out[1])
    blas_gemm(at_.T, b, out[2])
    blas_gemm(at_.T, bt.T, out[3])


@numba.njit
def _rows(a, b, out, lo, hi):
    blas_gemm(a[lo:hi], b, out[lo:hi])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (1, 4, 6), (6, 4, 1), (1, 5, 1), (3, 0, 2),
                                   (0, 3, 2)])
def test_products_match_numpy(dtype, m, k, n):
    a = RNG.normal(size=(m, k)).astype(dtype)
    b = RNG.normal(size=(k, n)).astype(dtype)
    at_ = np.ascontiguousarray(a.T)
    bt = np.ascontiguousarray(b.T)
    out = np.full((4, m, n), np.nan, dtype)
    _all_forms(a, b, bt, at_, out)
    want = a.astype(np.float64) @ b.astype(np.float64)  # k == 0: zeros
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for i in range(4):
        np.testing.assert_allclose(out[i], want, rtol=tol, atol=tol)
    assert out.dtype == dtype


def test_row_block_of_a_product():
    a = RNG.normal(size=(8, 5))
    b = RNG.normal(size=(5, 4))
    out = np.zeros((8, 4))
    _rows(a, b, out, 2, 6)
    np.testing.assert_allclose(out[2:6], a[2:6] @ b, rtol=1e-12)
    assert not out[:2].any() and not out[6:].any()


def test_misfit_shapes_raise():
    with pytest.raises(ValueError, match="blas_gemm: a \\(m, k\\) @ b \\(k, n\\) does not fit"):
        _rows(np.ones((4, 3)), np.ones((2, 5)), np.zeros((4, 5)), 0, 4)
    with pytest.raises(ValueError, match="does not fit out"):
        _rows(np.ones((4, 3)), np.ones((3, 5)), np.zeros((4, 6)), 0, 4)


def test_unsupported_types_name_them():
    @numba.njit
    def strided(a, b, out):
        blas_gemm(a[:, ::2], b, out)

    with pytest.raises(numba.core.errors.TypingError, match="blas_gemm takes 2-D"):
        strided(np.ones((3, 4)), np.ones((2, 2)), np.zeros((3, 2)))

    @numba.njit
    def ints(a, b, out):
        blas_gemm(a, b, out)

    with pytest.raises(numba.core.errors.TypingError, match="float32/float64"):
        ints(np.ones((2, 2), np.int64), np.ones((2, 2), np.int64), np.zeros((2, 2), np.int64))
