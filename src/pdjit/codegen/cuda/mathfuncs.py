"""What the ops' scalar templates call, as CUDA device functions.

The emit templates are written once, for every target: they call ``math.*``, the helpers
``_m.exp/log/tanh/sigmoid/...`` (``pdjit.codegen.cpu.mathfuncs`` on the CPU) and a few NumPy
scalar functions and types (``np.maximum``, ``np.sqrt``, ``np.float32(...)``). In a CUDA
kernel module ``_m`` is this module and ``np`` is :data:`np`, a module holding device
functions under NumPy's names and NumPy's scalar types (casts), so the same text compiles
with ``numba.cuda`` (NumPy's functions on scalars do not) and runs in the simulator.

The helpers are ``inline="always"`` device functions: inlined into each kernel, so a kernel
compiles to PTX without a device (``cuda.compile_ptx``) and carries no call.
"""
from __future__ import annotations

import math
import os
import sys
import types

import numpy as _np
from numba import cuda

_dev = cuda.jit(device=True, inline="always")


@_dev
def exp(x):
    return math.exp(x)


@_dev
def expm1(x):
    return math.expm1(x)


@_dev
def log(x):
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


@_dev
def log1p(x):
    return math.log1p(x) if x > -1 else (-math.inf if x == -1 else math.nan)


@_dev
def tanh(x):
    return math.tanh(x)


@_dev
def sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@_dev
def softplus(x):
    if x > 0:
        return x + math.log1p(math.exp(-x))
    return math.log1p(math.exp(x))


@_dev
def erf(x):
    return math.erf(x)


@_dev
def erfc(x):
    return math.erfc(x)


@_dev
def maximum(a, b):
    return a if (a >= b or a != a) else b


@_dev
def minimum(a, b):
    return a if (a <= b or a != a) else b


@_dev
def sqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan


@_dev
def ceil(x):
    return math.ceil(x)


@_dev
def floor(x):
    return math.floor(x)


@_dev
def sign(x):
    return (x - x) + (1 if x > 0 else (-1 if x < 0 else 0))


@_dev
def fabs(x):
    return abs(x)


@_dev
def where(c, a, b):
    return a if c else b


@_dev
def power(a, b):
    return a ** b


@_dev
def isnan(x):
    return x != x


@_dev
def isinf(x):
    return math.isinf(x)


@_dev
def isfinite(x):
    return not (math.isinf(x) or x != x)


# ---- the random stream (pdjit.framework.random): element i of key's stream, bit-identical ---
_GOLDEN = _np.uint64(0x9E3779B97F4A7C15)
_M1 = _np.uint64(0xBF58476D1CE4E5B9)
_M2 = _np.uint64(0x94D049BB133111EB)


def _uniform01(key, i):
    """Element ``i`` of the stream of ``key`` (uint64) as a float64 in [0, 1): splitmix64's
    finaliser of ``key + (i + 1) * GOLDEN``, its top 53 bits (as every target draws it)."""
    x = _np.uint64(key) + _np.uint64(i + 1) * _GOLDEN
    x = x ^ (x >> _np.uint64(30))
    x = x * _M1
    x = x ^ (x >> _np.uint64(27))
    x = x * _M2
    x = x ^ (x >> _np.uint64(31))
    return _np.float64(x >> _np.uint64(11)) * (1.0 / 9007199254740992.0)


def _uniform01_python(key, i):
    """The same in Python ints (the simulator runs kernels as Python, where NumPy's uint64
    scalars warn on the wrap-around the stream relies on)."""
    m = (1 << 64) - 1
    x = (int(key) + (int(i) + 1) * 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    x ^= x >> 31
    return float(x >> 11) * (1.0 / 9007199254740992.0)


uniform01 = _dev(_uniform01_python if getattr(cuda, "simulator_enabled", False) or
                 os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0") else _uniform01)


# ``np`` inside a CUDA kernel module
np = types.ModuleType("pdjit_cuda_np")
np.__doc__ = ("NumPy's scalar names as CUDA device functions and casts "
              "(pdjit.codegen.cuda.mathfuncs)")
for _name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
              "uint16", "uint32", "uint64", "bool_", "inf", "nan", "pi", "e"):
    setattr(np, _name, getattr(_np, _name))
for _name, _fn in (("maximum", maximum), ("minimum", minimum), ("fmax", maximum),
                   ("fmin", minimum), ("sqrt", sqrt), ("ceil", ceil), ("floor", floor),
                   ("sign", sign), ("abs", fabs), ("absolute", fabs), ("fabs", fabs),
                   ("where", where), ("power", power), ("isnan", isnan), ("isinf", isinf),
                   ("isfinite", isfinite), ("exp", exp), ("expm1", expm1), ("log", log),
                   ("log1p", log1p), ("tanh", tanh)):
    setattr(np, _name, _fn)
sys.modules.setdefault(np.__name__, np)


def kernel(fn):
    """A generated kernel as its module compiles it (``@_m.kernel``): ``cuda.jit`` with
    numba-cuda's disk cache (``cache=True``), so a second process that generates the same
    module (the same file in pdjit's cache directory, see ``pdjit.codegen.compiler``) loads
    the compiled kernel instead of compiling it again; the cache is keyed by the module's
    file, the argument types and the device's compute capability. A module without a file
    (the disk cache off) compiles without it. The simulator ignores ``cache``."""
    try:
        return cuda.jit(fn, cache=True)
    except RuntimeError as e:  # no file to key the cache on, or nowhere to write it
        if "cannot cache" not in str(e):
            raise
        return cuda.jit(fn)
