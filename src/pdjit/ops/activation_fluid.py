"""The rest of Fluid 1.8's unary activations and math functions, with their gradients:
``brelu``, ``soft_relu``, ``stanh``, ``hard_shrink``, ``softshrink``, ``thresholded_relu``,
``logsigmoid``, ``softsign``, ``tanh_shrink``, ``acos``, ``asin``, ``atan``, ``round``, ``erf``,
``pow`` and ``log1p``.

Op types, attribute names and defaults are Fluid 1.8's (``softshrink``'s threshold is the
attribute ``lambda``). Each is an elementwise op with a scalar template (see
``pdjit.ops.activation._unary``), so chains of them fuse into one loop nest, and each grad op is
elementwise too. Kinks follow Fluid's grad functors: ``brelu`` passes the gradient strictly
between its bounds, ``hard_shrink``, ``softshrink`` and ``thresholded_relu`` strictly outside
(above) theirs, ``soft_relu``'s gradient ``1 - exp(-Out)`` is taken where ``Out`` lies strictly
inside ``(-threshold, threshold)``. ``round`` rounds halves away from zero (C's ``round``) and
has no gradient (Fluid's is zero).
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework.registry import Float
from pdjit.ops.activation import _f, _sigmoid, _softplus_np, _unary

_ZERO = "{T}(0)"


def _softplus_neg(x):
    return _softplus_np(-x)


_unary("brelu", lambda x, t_min, t_max: np.minimum(np.maximum(x, _f(x, t_min)), _f(x, t_max)),
       "np.minimum(np.maximum({X}, {T}({t_min})), {T}({t_max}))",
       attrs={"t_min": Float(0.0, low=-2.0, high=0.0), "t_max": Float(24.0, low=0.5, high=24.0)},
       doc="Out = min(max(X, t_min), t_max)",
       grad=("X", lambda x, g, t_min, t_max: np.where((x > t_min) & (x < t_max), g,
                                                      np.zeros((), g.dtype)),
             "{Out@GRAD} if {X} > {T}({t_min}) and {X} < {T}({t_max}) else " + _ZERO))


def _soft_relu(x, threshold):
    t = _f(x, threshold)
    return _softplus_np(np.minimum(np.maximum(x, -t), t))


_unary("soft_relu", _soft_relu,
       "_m.softplus(np.minimum(np.maximum({X}, -{T}({threshold})), {T}({threshold})))",
       attrs={"threshold": Float(40.0, low=1.0, high=40.0)},
       doc="Out = log(1 + exp(min(max(X, -threshold), threshold)))",
       grad=("Out", lambda out, g, threshold: np.where(
           (out > -threshold) & (out < threshold), g * -np.expm1(-out), np.zeros((), g.dtype)),
           "{Out@GRAD} * -_m.expm1(-{Out}) if {Out} > -{T}({threshold}) and "
           "{Out} < {T}({threshold}) else " + _ZERO))
_unary("stanh", lambda x, scale_a, scale_b: _f(x, scale_b) * np.tanh(_f(x, scale_a) * x),
       "{T}({scale_b}) * _m.tanh({T}({scale_a}) * {X})",
       attrs={"scale_a": Float(0.67, low=0.25, high=2.0),
              "scale_b": Float(1.7159, low=0.5, high=2.0)},
       doc="Out = scale_b * tanh(scale_a * X)",
       grad=("X", lambda x, g, scale_a, scale_b: g * _f(x, scale_a * scale_b) * (
           1 - np.tanh(_f(x, scale_a) * x) ** 2),
           "{Out@GRAD} * {T}({scale_a}) * {T}({scale_b}) * ({T}(1) - _m.tanh({T}({scale_a}) "
           "* {X}) * _m.tanh({T}({scale_a}) * {X}))"))
_unary("hard_shrink",
       lambda x, threshold: np.where((x > threshold) | (x < -threshold), x, np.zeros((), x.dtype)),
       "{X} if {X} > {T}({threshold}) or {X} < -{T}({threshold}) else " + _ZERO,
       attrs={"threshold": Float(0.5, low=0.0, high=2.0)},
       doc="Out = X if |X| > threshold else 0",
       grad=("X", lambda x, g, threshold: np.where((x > threshold) | (x < -threshold), g,
                                                   np.zeros((), g.dtype)),
             "{Out@GRAD} if {X} > {T}({threshold}) or {X} < -{T}({threshold}) else " + _ZERO))


def _softshrink(x, **kw):
    lam = _f(x, kw["lambda"])
    return np.where(x > lam, x - lam, np.where(x < -lam, x + lam, np.zeros((), x.dtype)))


def _softshrink_dx(x, g, **kw):
    lam = kw["lambda"]
    return np.where((x > lam) | (x < -lam), g, np.zeros((), g.dtype))


_unary("softshrink", _softshrink,
       "{X} - {T}({lambda}) if {X} > {T}({lambda}) else "
       "({X} + {T}({lambda}) if {X} < -{T}({lambda}) else {T}(0))",
       attrs={"lambda": Float(0.5, low=0.0, high=2.0)},
       doc="Out = X - lambda if X > lambda, X + lambda if X < -lambda, else 0",
       grad=("X", _softshrink_dx,
             "{Out@GRAD} if {X} > {T}({lambda}) or {X} < -{T}({lambda}) else " + _ZERO))
_unary("thresholded_relu", lambda x, threshold: np.where(x > threshold, x, np.zeros((), x.dtype)),
       "{X} if {X} > {T}({threshold}) else " + _ZERO,
       attrs={"threshold": Float(1.0, low=-1.0, high=2.0)},
       doc="Out = X if X > threshold else 0",
       grad=("X", lambda x, g, threshold: np.where(x > threshold, g, np.zeros((), g.dtype)),
             "{Out@GRAD} if {X} > {T}({threshold}) else " + _ZERO))
_unary("logsigmoid", lambda x: -_softplus_neg(x), "-_m.softplus(-{X})",
       doc="Out = log(sigmoid(X)) = -log(1 + exp(-X))",
       grad=("X", lambda x, g: g * _sigmoid(-x), "{Out@GRAD} * _m.sigmoid(-{X})"))
_unary("softsign", lambda x: x / (1 + np.abs(x)), "{X} / ({T}(1) + abs({X}))",
       doc="Out = X / (1 + |X|)",
       grad=("X", lambda x, g: g / (1 + np.abs(x)) ** 2,
             "{Out@GRAD} / (({T}(1) + abs({X})) * ({T}(1) + abs({X})))"))
_unary("tanh_shrink", lambda x: x - np.tanh(x), "{X} - _m.tanh({X})", doc="Out = X - tanh(X)",
       grad=("X", lambda x, g: g * np.tanh(x) ** 2,
             "{Out@GRAD} * _m.tanh({X}) * _m.tanh({X})"))
_unary("acos", np.arccos, "math.acos({X})", doc="Out = arccos(X)", domain="unit",
       grad=("X", lambda x, g: -g / np.sqrt(1 - x * x),
             "-{Out@GRAD} / np.sqrt({T}(1) - {X} * {X})"))
_unary("asin", np.arcsin, "math.asin({X})", doc="Out = arcsin(X)", domain="unit",
       grad=("X", lambda x, g: g / np.sqrt(1 - x * x),
             "{Out@GRAD} / np.sqrt({T}(1) - {X} * {X})"))
_unary("atan", np.arctan, "math.atan({X})", doc="Out = arctan(X)",
       grad=("X", lambda x, g: g / (1 + x * x), "{Out@GRAD} / ({T}(1) + {X} * {X})"))
# halves away from zero, as C's round (NumPy's rounds them to even)
_unary("round", lambda x: np.sign(x) * np.floor(np.abs(x) + _f(x, 0.5)),
       "np.sign({X}) * np.floor(abs({X}) + {T}(0.5))", doc="Out = round(X), halves away from 0")
_unary("erf", lambda x: np.vectorize(math.erf, otypes=[np.float64])(x), "_m.erf({X})",
       doc="Out = erf(X)",
       grad=("X", lambda x, g: g * (2 / math.sqrt(math.pi)) * np.exp(-x * x),
             "{Out@GRAD} * {T}(%r) * _m.exp(-{X} * {X})" % (2 / math.sqrt(math.pi))))
_unary("pow", lambda x, factor: np.power(x, _f(x, factor)), "{X} ** {T}({factor})",
       attrs={"factor": Float(1.0, low=-2.0, high=3.0)}, doc="Out = X ** factor",
       domain="positive",
       grad=("X", lambda x, g, factor: g * _f(x, factor) * np.power(x, _f(x, factor - 1)),
             "{Out@GRAD} * {T}({factor}) * {X} ** ({T}({factor}) - {T}(1))"))
_unary("log1p", np.log1p, "_m.log1p({X})", doc="Out = ln(1 + X)", domain="positive",
       grad=("X", lambda x, g: g / (1 + x), "{Out@GRAD} / ({T}(1) + {X})"))
