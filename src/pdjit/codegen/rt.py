"""Helpers the generated code calls (compiled with it by Numba).

Keep this file small and stable: generated modules embed a hash of it, so that a change here
invalidates Numba's on-disk cache of every generated module that uses it.
"""
import numba


@numba.njit(inline="always")
def bdim(acc, d):
    """Broadcast one more size into a dim: 1 gives way to anything; else sizes must agree."""
    if acc == 1:
        return d
    if d == 1 or d == acc:
        return acc
    raise ValueError("pdjit: operand shapes do not broadcast")


@numba.njit(inline="always")
def check(cond):
    if not cond:
        raise ValueError("pdjit: operand shapes do not fit")
