"""pdjit's one random stream: counter-based, so every executor draws the same numbers.

A random op draws element ``i`` of its output from ``mix64(key + (i + 1) * GOLDEN)``, where
``key`` depends only on:

- the op's ``seed`` attribute when it is non-zero (then every run draws the same numbers, as in
  Fluid), else
- the program's ``random_seed``, the op's block and index and, for an op inside loops, the
  iteration number of every enclosing loop (outermost first): a draw inside a ``while``
  differs from one iteration to the next, as in Fluid; outside loops no iteration is mixed in.
  A seeded program draws the same numbers on every run (a startup program run again gives the
  same parameters, as Fluid's seeded random ops do); distinct ops draw distinct streams.
- with ``random_seed`` 0: a per-process entropy seed, the op's block and index, how many times
  this executor ran the program before (each run draws new numbers), and the iterations.

An iteration ``i`` is mixed in as ``key = mix64(key ^ i)`` (:func:`iteration_key`), after the
run: the key of an op in a loop is a function of the key without that loop's iteration, so a
generated loop derives each iteration's key from one argument.

Being a pure function of (key, index), the stream can be generated in any order, by any target:
the reference interpreter here, and the generated code of the compiled targets.
"""
from __future__ import annotations

import os

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1
_PROCESS_SEED = int.from_bytes(os.urandom(8), "little")


def mix64_int(x: int) -> int:
    """splitmix64's finaliser on a Python int (exact 64-bit wrap-around)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def op_key(op_seed: int, program_seed: int, block_idx: int, op_idx: int, run: int,
           iterations=()) -> int:
    """The stream key of one run of one random op; ``iterations``: the iteration number of
    each loop the op runs in, outermost first (ignored with a fixed ``op_seed``, which draws
    the same numbers every time); ``run`` (the executor's runs of the program before) only
    counts when ``program_seed`` is 0."""
    if op_seed:
        return mix64_int(mix64_int(int(op_seed) & _MASK) ^ 0x5EED)
    base = int(program_seed) if program_seed else _PROCESS_SEED
    k = mix64_int(base & _MASK)
    # a seeded program's draws do not follow the run count: the same numbers every run
    for part in (block_idx, op_idx, 0 if program_seed else run):
        k = mix64_int(k ^ (int(part) & _MASK))
    for i in iterations:
        k = iteration_key(k, i)
    return k


def iteration_key(key: int, iteration: int) -> int:
    """The key of iteration ``iteration`` of a loop, from the key without it."""
    return mix64_int(key ^ (int(iteration) & _MASK))


def fixed_seed(op) -> int:
    """The seed attribute a random op draws with every time (non-zero: the same numbers in
    every run and every iteration), or 0: ``seed``, unless a ``fix_seed`` attribute is false."""
    seed = op.attr("seed") if op.has_attr("seed") else 0
    if op.has_attr("fix_seed") and not op.attr("fix_seed"):
        seed = 0
    return int(seed or 0)


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def bits(key: int, n: int, offset: int = 0) -> np.ndarray:
    """``n`` uint64 words of the stream of ``key``, starting at element ``offset``."""
    with np.errstate(over="ignore"):
        i = np.arange(offset + 1, offset + n + 1, dtype=np.uint64)
        return _mix64(np.uint64(key) + i * GOLDEN)


# Elements drawn at a time: the scratch of a draw (words, indices, float64 temporaries) stays a
# few MB whatever the output's size, which is all the allocation limit counts.
_CHUNK = 1 << 17


def _filled(shape, dtype, draw) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` whose elements ``start .. start + n`` are
    ``draw(start, n)`` (float64, cast as ``astype`` casts), drawn piece by piece."""
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype)
    for start in range(0, n, _CHUNK):
        m = min(_CHUNK, n - start)
        out[start:start + m] = draw(start, m)
    return out.reshape(shape)


def _uniform01(key: int, n: int, offset: int = 0) -> np.ndarray:
    return (bits(key, n, offset) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def uniform01(key: int, n: int, offset: int = 0) -> np.ndarray:
    """``n`` float64 in [0, 1): the top 53 bits of each word."""
    if n <= _CHUNK:
        return _uniform01(key, n, offset)
    return _filled((n,), np.float64, lambda s, m: _uniform01(key, m, offset + s))


def uniform(key: int, shape, low: float, high: float, dtype) -> np.ndarray:
    return _filled(shape, dtype, lambda s, m: low + (high - low) * _uniform01(key, m, s))


def _normal_piece(key: int, start: int, m: int, mean: float, std: float) -> np.ndarray:
    u = _uniform01(key, 2 * m, 2 * start)
    u1, u2 = 1.0 - u[0::2], u[1::2]  # u1 in (0, 1]: log is finite
    return mean + std * (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2))


def normal(key: int, shape, mean: float, std: float, dtype) -> np.ndarray:
    """Box-Muller on the pair of words (2i, 2i+1) for element i."""
    return _filled(shape, dtype, lambda s, m: _normal_piece(key, s, m, mean, std))


def truncated_normal(key: int, shape, mean: float, std: float, dtype, a: float = -2.0,
                     b: float = 2.0) -> np.ndarray:
    """Normal truncated to [mean + a*std, mean + b*std] by inverting the CDF (no rejection)."""
    from scipy.special import ndtr, ndtri

    lo, hi = ndtr(a), ndtr(b)

    def piece(start, m):
        z = ndtri(lo + _uniform01(key, m, start) * (hi - lo))
        return mean + std * np.clip(z, a, b)
    return _filled(shape, dtype, piece)
