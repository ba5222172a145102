"""The decorators of the library kernels: Numba's options as generated kernels use them."""
import numba

#: a library kernel: cached on disk, no GIL, NumPy's error model (division by zero gives inf)
jit = numba.njit(cache=True, nogil=True, error_model="numpy")
#: the same, with ``numba.prange`` loops on threads
pjit = numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)


#: entry point name -> ``jobs(T)``: the compiled functions a call of it runs for float arrays
#: of NumPy type ``T`` and their argument types ((dtype, ndim) per C-contiguous array, ``int``,
#: ``bool``, ``float``); what a new plan's compile worker can compile ahead (a wrong guess
#: only costs the worker's time)
JOBS: dict = {}


def jobs(name: str):
    """Declare the compile jobs of entry point ``name`` (a decorator of ``jobs(T)``)."""
    def register(fn):
        JOBS[name] = fn
        return fn
    return register
