"""Fluid 1.8's remaining activation and math layers: ``brelu``, ``soft_relu``, ``stanh``,
``hard_shrink``, ``softshrink``, ``thresholded_relu``, ``logsigmoid``, ``softsign``,
``tanh_shrink``, ``sin``, ``cos``, ``acos``, ``asin``, ``atan``, ``round``, ``erf``, ``pow``.

Each appends the op of the same name with Fluid 1.8's arguments and defaults (see
``pdjit.ops.activation_fluid``).
"""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.math_ops import _unary

_PLAIN = ["logsigmoid", "softsign", "tanh_shrink", "sin", "cos", "acos", "asin", "atan",
          "round", "erf"]

__all__ = _PLAIN + ["brelu", "soft_relu", "stanh", "hard_shrink", "softshrink",
                    "thresholded_relu", "pow"]


def _make(op_type):
    def layer(x, name=None):
        return _unary(op_type, x, name)
    layer.__name__ = layer.__qualname__ = op_type
    layer.__doc__ = f"``{op_type}`` of x, elementwise."
    return layer


for _op in _PLAIN:
    globals()[_op] = _make(_op)


def brelu(x, t_min: float = 0.0, t_max: float = 24.0, name=None) -> Variable:
    """``min(max(x, t_min), t_max)``."""
    if t_min > t_max:
        raise ValueError(f"brelu: expected t_min <= t_max, got t_min={t_min}, t_max={t_max}")
    return _unary("brelu", x, name, t_min=float(t_min), t_max=float(t_max))


def soft_relu(x, threshold: float = 40.0, name=None) -> Variable:
    """``log(1 + exp(clip(x, -threshold, threshold)))``."""
    return _unary("soft_relu", x, name, threshold=float(threshold))


def stanh(x, scale_a: float = 0.67, scale_b: float = 1.7159, name=None) -> Variable:
    """``scale_b * tanh(scale_a * x)``."""
    return _unary("stanh", x, name, scale_a=float(scale_a), scale_b=float(scale_b))


def hard_shrink(x, threshold=None) -> Variable:
    """``x`` where ``|x| > threshold`` (default 0.5), else 0."""
    return _unary("hard_shrink", x, None, threshold=0.5 if threshold is None else float(threshold))


def softshrink(x, alpha=None) -> Variable:
    """``x - alpha`` above ``alpha`` (default 0.5), ``x + alpha`` below ``-alpha``, else 0."""
    return _unary("softshrink", x, None, **{"lambda": 0.5 if alpha is None else float(alpha)})


def thresholded_relu(x, threshold=None) -> Variable:
    """``x`` where ``x > threshold`` (default 1.0), else 0."""
    return _unary("thresholded_relu", x, None,
                  threshold=1.0 if threshold is None else float(threshold))


def pow(x, factor=1.0, name=None) -> Variable:  # noqa: A001 - Fluid's name
    """``x ** factor`` elementwise (``factor`` a Python number)."""
    if isinstance(factor, Variable):
        raise TypeError("pow: argument 'factor' must be a Python number here; a Variable "
                        "factor (Fluid's FactorTensor) is not supported")
    return _unary("pow", x, name, factor=float(factor))
