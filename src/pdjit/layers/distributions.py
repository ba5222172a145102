"""Fluid 1.8's ``fluid.layers`` distributions: ``Uniform``, ``Normal``, ``Categorical`` and
``MultivariateNormalDiag``, built from layers (native, differentiable in their parameters).

Parameters may be Python numbers, lists, NumPy arrays (constants, float32 as in Fluid) or
Variables. ``sample(shape, seed)`` draws ``shape + batch_shape`` values; ``entropy``,
``log_prob`` and ``kl_divergence`` follow Fluid 1.8's formulas: ``Uniform``: entropy
``log(high - low)``, log-density ``log(1[low < v < high]) - log(high - low)``; ``Normal``:
entropy ``1/2 + log(sqrt(2 pi) scale)``, the Gaussian log-density, KL ``(r + d^2 - 1 -
log r) / 2`` with ``r = (scale / other.scale)^2``, ``d = (loc - other.loc) / other.scale``;
``Categorical(logits)``: entropy and KL of the softmax over the last axis (``keep_dim``);
``MultivariateNormalDiag(loc, scale)`` with ``scale`` a diagonal covariance matrix ``[k, k]``:
entropy ``(k (1 + log 2 pi) + log det scale) / 2`` and the Gaussian KL.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework.program import Variable
from pdjit.layers import math_ops, misc, shape_ops, tensor
from pdjit.layers.activation import pow as _pow

__all__ = ["Uniform", "Normal", "Categorical", "MultivariateNormalDiag"]


def _var(value, name: str, cls: str) -> Variable:
    if isinstance(value, Variable):
        return value
    arr = np.asarray(value, dtype=np.float32)
    if arr.dtype.kind != "f":
        raise TypeError(f"{cls}: argument {name!r} must be a number, list, array or Variable, "
                        f"got {value!r}")
    return tensor.assign(arr.reshape(arr.shape or (1,)))


def _sub(a, b):
    return math_ops.elementwise_sub(a, b)


def _mul(a, b):
    return math_ops.elementwise_mul(a, b)


def _div(a, b):
    return math_ops.elementwise_div(a, b)


def _batch_shape(*vs) -> list:
    shapes = [list(v.shape) for v in vs]
    return list(np.broadcast_shapes(*[tuple(max(d, 1) for d in s) for s in shapes]))


class Uniform:
    """Uniform distribution on ``[low, high)``."""

    def __init__(self, low, high):
        self.low, self.high = _var(low, "low", "Uniform"), _var(high, "high", "Uniform")

    def sample(self, shape, seed=0) -> Variable:
        full = list(shape) + _batch_shape(self.low, self.high)
        u = misc.uniform_random(full, "float32", 0.0, 1.0, seed=int(seed))
        return math_ops.elementwise_add(_mul(u, _sub(self.high, self.low)), self.low)

    def log_prob(self, value) -> Variable:
        inside = _mul(tensor.cast(math_ops.less_than(self.low, value), "float32"),
                      tensor.cast(math_ops.less_than(value, self.high), "float32"))
        return _sub(math_ops.log(inside), math_ops.log(_sub(self.high, self.low)))

    def entropy(self) -> Variable:
        return math_ops.log(_sub(self.high, self.low))


class Normal:
    """Normal distribution with mean ``loc`` and standard deviation ``scale``."""

    def __init__(self, loc, scale):
        self.loc, self.scale = _var(loc, "loc", "Normal"), _var(scale, "scale", "Normal")

    def sample(self, shape, seed=0) -> Variable:
        full = list(shape) + _batch_shape(self.loc, self.scale)
        z = misc.gaussian_random(full, 0.0, 1.0, seed=int(seed))
        return math_ops.elementwise_add(_mul(z, self.scale), self.loc)

    def entropy(self) -> Variable:
        return math_ops.scale(math_ops.log(self.scale),
                              bias=0.5 + 0.5 * math.log(2.0 * math.pi))

    def log_prob(self, value) -> Variable:
        d = _sub(value, self.loc)
        quad = _div(math_ops.square(d), math_ops.scale(math_ops.square(self.scale), scale=2.0))
        return math_ops.scale(_sub(math_ops.scale(quad, scale=-1.0), math_ops.log(self.scale)),
                              bias=-math.log(math.sqrt(2.0 * math.pi)))

    def kl_divergence(self, other: "Normal") -> Variable:
        if not isinstance(other, Normal):
            raise TypeError(f"Normal.kl_divergence: expected another Normal, got {other!r}")
        ratio = math_ops.square(_div(self.scale, other.scale))
        t1 = math_ops.square(_div(_sub(self.loc, other.loc), other.scale))
        s = _sub(math_ops.elementwise_add(ratio, t1), math_ops.log(ratio))
        return math_ops.scale(s, scale=0.5, bias=-0.5)


class Categorical:
    """Categorical distribution given by unnormalised ``logits`` over the last axis."""

    def __init__(self, logits):
        self.logits = _var(logits, "logits", "Categorical")

    def _parts(self):
        z = _sub(self.logits, shape_ops.reduce_max(self.logits, dim=-1, keep_dim=True))
        e = math_ops.exp(z)
        total = shape_ops.reduce_sum(e, dim=-1, keep_dim=True)
        return z, _div(e, total), total

    def entropy(self) -> Variable:
        z, p, total = self._parts()
        return math_ops.scale(shape_ops.reduce_sum(
            _mul(p, _sub(z, math_ops.log(total))), dim=-1, keep_dim=True), scale=-1.0)

    def kl_divergence(self, other: "Categorical") -> Variable:
        if not isinstance(other, Categorical):
            raise TypeError(f"Categorical.kl_divergence: expected another Categorical, got "
                            f"{other!r}")
        z, p, total = self._parts()
        oz, _, ototal = other._parts()
        diff = _sub(_sub(z, math_ops.log(total)), _sub(oz, math_ops.log(ototal)))
        return shape_ops.reduce_sum(_mul(p, diff), dim=-1, keep_dim=True)


class MultivariateNormalDiag:
    """Multivariate normal with mean ``loc [k]`` and diagonal covariance ``scale [k, k]``."""

    def __init__(self, loc, scale):
        self.loc = _var(loc, "loc", "MultivariateNormalDiag")
        self.scale = _var(scale, "scale", "MultivariateNormalDiag")
        k = self.loc.shape[0]
        if len(self.scale.shape) != 2 or k < 0 or list(self.scale.shape) != [k, k]:
            raise ValueError(f"MultivariateNormalDiag: expected loc [k] and scale [k, k], got "
                             f"{list(self.loc.shape)} and {list(self.scale.shape)}")
        self.k = k

    def _diag(self, m):
        eye = tensor.assign(np.eye(self.k, dtype=np.float32))
        return shape_ops.reduce_sum(_mul(m, eye), dim=1)

    def _log_det(self):
        return shape_ops.reduce_sum(math_ops.log(self._diag(self.scale)))

    def entropy(self) -> Variable:
        return math_ops.scale(self._log_det(), scale=0.5,
                              bias=0.5 * self.k * (1.0 + math.log(2.0 * math.pi)))

    def kl_divergence(self, other: "MultivariateNormalDiag") -> Variable:
        if not isinstance(other, MultivariateNormalDiag):
            raise TypeError(f"MultivariateNormalDiag.kl_divergence: expected another "
                            f"MultivariateNormalDiag, got {other!r}")
        inv = _pow(other._diag(other.scale), -1.0)
        tr = shape_ops.reduce_sum(_mul(inv, self._diag(self.scale)))
        d = _sub(other.loc, self.loc)
        quad = shape_ops.reduce_sum(_mul(_mul(d, inv), d))
        s = math_ops.elementwise_add(math_ops.elementwise_add(tr, quad),
                                     _sub(other._log_det(), self._log_det()))
        return math_ops.scale(s, scale=0.5, bias=-0.5 * self.k)
