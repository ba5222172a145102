"""Initializers: each appends the op that fills a parameter to the startup program (Fluid's API).

``Constant``, ``Uniform``, ``Normal``, ``TruncatedNormal``, ``Xavier`` and ``MSRA`` (with their
``*Initializer`` aliases). A seed of 0 draws from the program's ``random_seed`` stream (see
``pdjit.framework.random``); a non-zero seed makes the op draw the same numbers every run.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.program import Block, Variable


class Initializer:
    def __call__(self, var: Variable, block: Block):
        raise NotImplementedError

    @staticmethod
    def _check(var, block):
        if not isinstance(var, Variable):
            raise TypeError(f"initializer: expected a Variable, got {type(var).__name__}")
        if not isinstance(block, Block):
            raise TypeError(f"initializer: expected a Block, got {type(block).__name__}")
        if any(d < 0 for d in var.shape):
            raise ValueError(f"initializer: variable {var.name!r} has unknown dims "
                             f"{list(var.shape)}; a parameter's shape must be known")

    def _append(self, block, var, type, attrs):
        attrs = dict(attrs, shape=list(var.shape), dtype=dtypes.to_code(var.dtype))
        return block.append_op(type, outputs={"Out": [var]}, attrs=attrs)


class Constant(Initializer):
    def __init__(self, value: float = 0.0, force_cpu: bool = False):
        self.value, self.force_cpu = float(value), force_cpu

    def __call__(self, var, block):
        self._check(var, block)
        return self._append(block, var, "fill_constant",
                            {"value": self.value, "force_cpu": self.force_cpu})


class Uniform(Initializer):
    def __init__(self, low: float = -1.0, high: float = 1.0, seed: int = 0):
        if low > high:
            raise ValueError(f"Uniform: expected low <= high, got low={low}, high={high}")
        self.low, self.high, self.seed = float(low), float(high), int(seed)

    def __call__(self, var, block):
        self._check(var, block)
        return self._append(block, var, "uniform_random",
                            {"min": self.low, "max": self.high, "seed": self.seed})


class Normal(Initializer):
    def __init__(self, loc: float = 0.0, scale: float = 1.0, seed: int = 0):
        if scale < 0:
            raise ValueError(f"Normal: expected scale >= 0, got {scale}")
        self.loc, self.scale, self.seed = float(loc), float(scale), int(seed)

    def __call__(self, var, block):
        self._check(var, block)
        return self._append(block, var, "gaussian_random",
                            {"mean": self.loc, "std": self.scale, "seed": self.seed})


class TruncatedNormal(Normal):
    def __call__(self, var, block):
        self._check(var, block)
        return self._append(block, var, "truncated_gaussian_random",
                            {"mean": self.loc, "std": self.scale, "seed": self.seed})


def compute_fans(shape) -> tuple:
    """(fan_in, fan_out) as Fluid computes them: [in, out] for fc, [out, in, kh, kw] for conv."""
    shape = list(shape)
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = int(np.prod(shape[2:]))
    return shape[1] * receptive, shape[0] * receptive


class Xavier(Initializer):
    """Glorot: Uniform(+-sqrt(6 / (fan_in + fan_out))) or Normal(0, sqrt(2 / (fan_in+fan_out)))."""

    def __init__(self, uniform: bool = True, fan_in=None, fan_out=None, seed: int = 0):
        self.uniform, self.fan_in, self.fan_out, self.seed = uniform, fan_in, fan_out, int(seed)

    def __call__(self, var, block):
        self._check(var, block)
        f_in, f_out = compute_fans(var.shape)
        f_in = self.fan_in if self.fan_in is not None else f_in
        f_out = self.fan_out if self.fan_out is not None else f_out
        if self.uniform:
            limit = math.sqrt(6.0 / float(f_in + f_out))
            return Uniform(-limit, limit, self.seed)(var, block)
        return Normal(0.0, math.sqrt(2.0 / float(f_in + f_out)), self.seed)(var, block)


class MSRA(Initializer):
    """He/Kaiming: Uniform(+-sqrt(6 / fan_in)) or Normal(0, sqrt(2 / fan_in))."""

    def __init__(self, uniform: bool = True, fan_in=None, seed: int = 0):
        self.uniform, self.fan_in, self.seed = uniform, fan_in, int(seed)

    def __call__(self, var, block):
        self._check(var, block)
        f_in = self.fan_in if self.fan_in is not None else compute_fans(var.shape)[0]
        if self.uniform:
            limit = math.sqrt(6.0 / float(f_in))
            return Uniform(-limit, limit, self.seed)(var, block)
        return Normal(0.0, math.sqrt(2.0 / float(f_in)), self.seed)(var, block)


ConstantInitializer, UniformInitializer, NormalInitializer = Constant, Uniform, Normal
TruncatedNormalInitializer, XavierInitializer, MSRAInitializer = TruncatedNormal, Xavier, MSRA

__all__ = ["Initializer", "Constant", "Uniform", "Normal", "TruncatedNormal", "Xavier", "MSRA",
           "ConstantInitializer", "UniformInitializer", "NormalInitializer",
           "TruncatedNormalInitializer", "XavierInitializer", "MSRAInitializer", "compute_fans"]
