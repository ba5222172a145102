"""Benchmark pdjit.codegen.cpu.mathfuncs against NumPy ufuncs and Numba loops calling math.*.

Standalone script: ``python benchmarks/bench_mathfuncs.py [--n N] [--repeat R] [--dtype f4|f8]``.
For each function it times, on N contiguous elements (single thread, preallocated output):

- ``pdjit``: ``@njit(error_model='numpy')`` loop calling ``mathfuncs.<f>``;
- ``numpy``: NumPy's ufunc with ``out=`` (sigmoid: 4 ufunc calls; softplus: np.logaddexp);
- ``math.*``: the same njit loop calling ``math.<f>`` (libm, not vectorised without SVML).

Prints medians in ns/element and the speed-up of pdjit over the other two.
"""
import argparse
import math
import os
import sys
import time

import numpy as np
from numba import njit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
from pdjit.codegen.cpu import mathfuncs as _m  # noqa: E402


def _loop(fn):
    @njit(error_model="numpy")
    def loop(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])
    return loop


@njit(error_model="numpy")
def _math_sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


@njit(error_model="numpy")
def _math_softplus(v):
    return max(v, 0.0) + math.log1p(math.exp(-abs(v)))


def _np_sigmoid(x, out):
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)


FUNCS = {
    # name: (input maker, numpy callable(x, out), math-based scalar function)
    "tanh": (lambda x: x, lambda x, o: np.tanh(x, out=o), math.tanh),
    "exp": (lambda x: x, lambda x, o: np.exp(x, out=o), math.exp),
    "sigmoid": (lambda x: x, _np_sigmoid, _math_sigmoid),
    "log": (np.abs, lambda x, o: np.log(x, out=o), math.log),
    "expm1": (lambda x: x, lambda x, o: np.expm1(x, out=o), math.expm1),
    "log1p": (np.abs, lambda x, o: np.log1p(x, out=o), math.log1p),
    "softplus": (lambda x: x, lambda x, o: np.logaddexp(0, x, out=o), _math_softplus),
}


def _median_ns(fn, x, out, repeat):
    fn(x, out)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x, out)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e9 / x.size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4_194_304)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--dtype", default="f4", choices=["f4", "f8"])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    base = (rng.standard_normal(args.n) * 4).astype(args.dtype)
    out = np.empty_like(base)
    print(f"n={args.n} dtype={np.dtype(args.dtype).name} repeats={args.repeat} (medians, 1 thread)")
    print(f"{'func':9s} {'pdjit ns/el':>11s} {'numpy ns/el':>11s} {'math.* ns/el':>12s} "
          f"{'vs numpy':>9s} {'vs math.*':>9s}")
    for name, (make, np_fn, math_fn) in FUNCS.items():
        x = np.ascontiguousarray(make(base))
        ours = _median_ns(_loop(getattr(_m, name)), x, out, args.repeat)
        with np.errstate(all="ignore"):
            ref = _median_ns(np_fn, x, out, args.repeat)
        libm = _median_ns(_loop(math_fn), x, out, max(3, args.repeat // 4))
        print(f"{name:9s} {ours:11.3f} {ref:11.3f} {libm:12.3f} {ref / ours:8.2f}x "
              f"{libm / ours:8.2f}x")
    copy = _median_ns(lambda a, o: np.copyto(o, a), base, out, args.repeat)
    print(f"{'(copy)':9s} {copy:11.3f}   <- memory-bound floor: read + write one array")


if __name__ == "__main__":
    main()
