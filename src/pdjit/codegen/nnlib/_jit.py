"""The decorators of the library kernels: Numba's options as generated kernels use them."""
import numba

#: a library kernel: cached on disk, no GIL, NumPy's error model (division by zero gives inf)
jit = numba.njit(cache=True, nogil=True, error_model="numpy")
#: the same, with ``numba.prange`` loops on threads
pjit = numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)
