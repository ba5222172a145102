"""The math functions generated kernels call as ``_m.<name>``, for the ``python`` target: NumPy
on one scalar, keeping its float dtype (an integer or bool argument computes in float64)."""
from __future__ import annotations

import math

import numpy as np


def _float(x):
    a = np.asarray(x)
    return a if a.dtype.kind == "f" else a.astype(np.float64)


def _scalar(a):
    return a[()] if a.ndim == 0 else a


def _apply(fn, x):
    a = _float(x)
    with np.errstate(all="ignore"):
        return _scalar(np.asarray(fn(a), dtype=a.dtype))


def tanh(x):
    return _apply(np.tanh, x)


def exp(x):
    return _apply(np.exp, x)


def expm1(x):
    return _apply(np.expm1, x)


def log(x):
    return _apply(np.log, x)


def log1p(x):
    return _apply(np.log1p, x)


def sigmoid(x):
    """1 / (1 + exp(-x)), without overflow."""
    def f(a):
        e = np.exp(-np.abs(a))
        r = a.dtype.type(1) / (a.dtype.type(1) + e)
        return np.where(a >= 0, r, e * r)
    return _apply(f, x)


def softplus(x):
    """log(1 + exp(x)), without overflow."""
    return _apply(lambda a: np.logaddexp(a.dtype.type(0), a), x)


def erf(x):
    return _apply(np.vectorize(math.erf), x)


def erfc(x):
    return _apply(np.vectorize(math.erfc), x)
