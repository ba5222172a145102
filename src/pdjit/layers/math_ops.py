"""Elementwise layers (arithmetic, activations, comparisons, logic) and Variable's operators.

``x + y``, ``x * 2.0``, ``-x``, ``x < y`` ... on Variables append ops the way Fluid does: a
scalar operand of ``+ - * /`` becomes a ``scale`` op, other scalars a ``fill_constant``.
"""
from __future__ import annotations

import numbers

from pdjit.framework import dtypes
from pdjit.framework.program import Variable
from pdjit.layers.initializer import Constant
from pdjit.layers.layer_helper import LayerHelper, check_variable

_ELEMENTWISE = ["elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div",
                "elementwise_max", "elementwise_min", "elementwise_pow", "elementwise_mod",
                "elementwise_floordiv"]
_ACTIVATIONS = ["relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "square",
                "reciprocal", "floor", "ceil", "sign"]
_COMPARE = ["less_than", "less_equal", "greater_than", "greater_equal", "equal", "not_equal"]
_LOGICAL = ["logical_and", "logical_or", "logical_xor"]

__all__ = (_ELEMENTWISE + _ACTIVATIONS + _COMPARE + _LOGICAL
           + ["logical_not", "leaky_relu", "scale", "clip", "elementwise_floor_div", "relu6",
              "hard_swish", "hard_sigmoid", "swish", "silu", "elu", "selu", "softplus", "mish",
              "prelu", "gelu"])


def _binary(op_type: str, x, y, axis: int = -1, act=None, name=None) -> Variable:
    check_variable(x, "x", op_type)
    check_variable(y, "y", op_type)
    helper = LayerHelper(op_type, name=name, act=act)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(op_type, inputs={"X": [x], "Y": [y]}, outputs={"Out": [out]},
                     attrs={"axis": axis})
    return helper.append_activation(out)


def _make_binary(op_type):
    def layer(x, y, axis: int = -1, act=None, name=None):
        return _binary(op_type, x, y, axis, act, name)
    layer.__name__ = layer.__qualname__ = op_type
    layer.__doc__ = f"``{op_type}`` of x and y (Y broadcast into X by Fluid's axis rule)."
    return layer


def _unary(op_type: str, x, name=None, **attrs) -> Variable:
    check_variable(x, "x", op_type)
    helper = LayerHelper(op_type, name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(op_type, inputs={"X": [x]}, outputs={"Out": [out]}, attrs=attrs)
    return out


def _make_unary(op_type):
    def layer(x, name=None):
        return _unary(op_type, x, name)
    layer.__name__ = layer.__qualname__ = op_type
    layer.__doc__ = f"``{op_type}`` of x, elementwise."
    return layer


def _compare(op_type: str, x, y, cond=None, force_cpu=None) -> Variable:
    check_variable(x, "x", op_type)
    check_variable(y, "y", op_type)
    helper = LayerHelper(op_type)
    if cond is None:
        cond = helper.create_variable_for_type_inference("bool", stop_gradient=True)
    attrs = {"force_cpu": bool(force_cpu)} if force_cpu is not None else {}
    helper.append_op(op_type, inputs={"X": [x], "Y": [y]}, outputs={"Out": [cond]}, attrs=attrs)
    cond.stop_gradient = True
    return cond


def _make_compare(op_type):
    def layer(x, y, force_cpu=None, cond=None, name=None):
        return _compare(op_type, x, y, cond, force_cpu)
    layer.__name__ = layer.__qualname__ = op_type
    layer.__doc__ = f"``{op_type}`` of x and y, elementwise (bool result)."
    return layer


def _logical(op_type: str, x, y=None, out=None, name=None) -> Variable:
    check_variable(x, "x", op_type)
    helper = LayerHelper(op_type, name=name)
    if out is None:
        out = helper.create_variable_for_type_inference("bool", stop_gradient=True)
    inputs = {"X": [x]}
    if y is not None:
        inputs["Y"] = [check_variable(y, "y", op_type)]
    helper.append_op(op_type, inputs=inputs, outputs={"Out": [out]})
    return out


def _make_logical(op_type):
    def layer(x, y, out=None, name=None):
        return _logical(op_type, x, y, out, name)
    layer.__name__ = layer.__qualname__ = op_type
    layer.__doc__ = f"``{op_type}`` of x and y, elementwise (bool result)."
    return layer


for _op in _ELEMENTWISE:
    globals()[_op] = _make_binary(_op)
for _op in _ACTIVATIONS:
    globals()[_op] = _make_unary(_op)
for _op in _COMPARE:
    globals()[_op] = _make_compare(_op)
for _op in _LOGICAL:
    globals()[_op] = _make_logical(_op)
elementwise_floor_div = globals()["elementwise_floordiv"]


def logical_not(x, out=None, name=None) -> Variable:
    return _logical("logical_not", x, None, out, name)


def leaky_relu(x, alpha: float = 0.02, name=None) -> Variable:
    return _unary("leaky_relu", x, name, alpha=float(alpha))


def scale(x, scale: float = 1.0, bias: float = 0.0, bias_after_scale: bool = True, act=None,
          name=None) -> Variable:
    """``scale * x + bias`` (or ``scale * (x + bias)``); ``scale`` may be a 1-element Variable."""
    check_variable(x, "x", "scale")
    helper = LayerHelper("scale", name=name, act=act)
    out = helper.create_variable_for_type_inference(x.dtype)
    inputs = {"X": [x]}
    attrs = {"bias": float(bias), "bias_after_scale": bool(bias_after_scale)}
    if isinstance(scale, Variable):
        inputs["ScaleTensor"] = [scale]
    else:
        attrs["scale"] = float(scale)
    helper.append_op("scale", inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
    return helper.append_activation(out)


def clip(x, min: float, max: float, name=None) -> Variable:
    if min > max:
        raise ValueError(f"clip: expected min <= max, got min={min}, max={max}")
    return _unary("clip", x, name, min=float(min), max=float(max))



# ---- activations with attributes (Fluid 1.x signatures) --------------------------------------
def relu6(x, threshold: float = 6.0, name=None) -> Variable:
    """``min(max(x, 0), threshold)``."""
    return _unary("relu6", x, name, threshold=float(threshold))


def hard_swish(x, threshold: float = 6.0, scale: float = 6.0, offset: float = 3.0,
               name=None) -> Variable:
    """``x * min(max(x + offset, 0), threshold) / scale`` (MobileNetV3)."""
    return _unary("hard_swish", x, name, threshold=float(threshold), scale=float(scale),
                  offset=float(offset))


def hard_sigmoid(x, slope: float = 0.2, offset: float = 0.5, name=None) -> Variable:
    """``min(max(slope * x + offset, 0), 1)``."""
    return _unary("hard_sigmoid", x, name, slope=float(slope), offset=float(offset))


def swish(x, beta: float = 1.0, name=None) -> Variable:
    """``x * sigmoid(beta * x)``."""
    return _unary("swish", x, name, beta=float(beta))


def silu(x, name=None) -> Variable:
    """``x * sigmoid(x)``."""
    return _unary("silu", x, name)


def elu(x, alpha: float = 1.0, name=None) -> Variable:
    """``x if x > 0 else alpha * (exp(x) - 1)``."""
    return _unary("elu", x, name, alpha=float(alpha))


def selu(x, scale=None, alpha=None, name=None) -> Variable:
    """``scale * (x if x > 0 else alpha * (exp(x) - 1))``; ``None`` keeps the op's defaults."""
    attrs = {k: float(v) for k, v in (("scale", scale), ("alpha", alpha)) if v is not None}
    return _unary("selu", x, name, **attrs)


def softplus(x, beta: float = 1.0, threshold: float = 20.0, name=None) -> Variable:
    """``log(1 + exp(beta * x)) / beta``, or ``x`` where ``beta * x > threshold``."""
    return _unary("softplus", x, name, beta=float(beta), threshold=float(threshold))


def mish(x, threshold: float = 20.0, name=None) -> Variable:
    """``x * tanh(softplus(x))``, softplus taken as ``x`` above ``threshold``."""
    return _unary("mish", x, name, threshold=float(threshold))


def gelu(x, approximate: bool = False) -> Variable:
    """``gelu`` of x: ``0.5 x (1 + erf(x / sqrt 2))``, or its tanh approximation with
    ``approximate``."""
    return _unary("gelu", x, approximate=bool(approximate))


_PRELU_FORMATS = {"NC": "NCHW", "NCL": "NCHW", "NCHW": "NCHW", "NCDHW": "NCHW",
                  "NLC": "NHWC", "NHWC": "NHWC", "NDHWC": "NHWC"}


def prelu(x, mode: str, param_attr=None, data_format: str = "NCHW", name=None) -> Variable:
    """``x if x > 0 else alpha * x`` with a learnt ``alpha`` (initialised to 0.25) shared by
    ``mode``: ``"all"`` (one value, shape [1]), ``"channel"`` (one per channel: shape
    [1, C, 1, 1], or [1, 1, 1, C] for a channels-last ``data_format``) or ``"element"`` (one per
    element of a sample: shape [1] + x.shape[1:]); the shapes Paddle's ``static.nn.prelu``
    creates. ``data_format`` may be any of Paddle's spellings (``NC``, ``NCL``, ``NCDHW``,
    ``NLC``, ``NDHWC``...)."""
    check_variable(x, "x", "prelu")
    if mode not in ("all", "channel", "element"):
        raise ValueError(f"prelu: mode must be one of 'all', 'channel', 'element', got {mode!r}")
    fmt = _PRELU_FORMATS.get(data_format)
    shape = [1]
    if mode == "channel":
        if fmt is None:
            raise ValueError(f"prelu: data_format must be one of {sorted(_PRELU_FORMATS)}, got "
                             f"{data_format!r}")
        if len(x.shape) < 2:
            raise ValueError(f"prelu: mode 'channel' needs x of rank >= 2, got shape "
                             f"{list(x.shape)}")
        shape = [1, x.shape[1], 1, 1] if fmt == "NCHW" else [1, 1, 1, x.shape[-1]]
    elif mode == "element":
        if len(x.shape) < 1:
            raise ValueError("prelu: mode 'element' needs x of rank >= 1")
        shape = [1] + list(x.shape[1:])
    helper = LayerHelper("prelu", name=name, param_attr=param_attr)
    alpha = helper.create_parameter(helper.param_attr, shape, x.dtype,
                                    default_initializer=Constant(0.25))
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("prelu", inputs={"X": [x], "Alpha": [alpha]}, outputs={"Out": [out]},
                     attrs={"mode": mode, "data_format": fmt or data_format})
    return out

# ---- operators on Variable ------------------------------------------------------------------
def _constant_like(x: Variable, value) -> Variable:
    from pdjit.layers.tensor import fill_constant

    return fill_constant([1], x.dtype, value)


def _operand(x: Variable, y):
    if isinstance(y, Variable):
        return y
    if isinstance(y, numbers.Number):
        return _constant_like(x, y)
    raise TypeError(f"unsupported operand: Variable {x.name!r} and {type(y).__name__}")


def _scalar_or_binary(op_type, scale_of=None, reverse=False):
    """An operator: scale op for a scalar operand where Fluid uses one, else the binary op."""
    def method(self, other):
        if scale_of is not None and isinstance(other, numbers.Number) \
                and not isinstance(other, bool) and dtypes.is_float(self.dtype):
            s, b = scale_of(float(other))
            return scale(self, scale=s, bias=b)
        other = _operand(self, other)
        a, b = (other, self) if reverse else (self, other)
        return _binary(op_type, a, b)
    return method


def _cmp(op_type):
    def method(self, other):
        return _compare(op_type, self, _operand(self, other))
    return method


def _patch_variable() -> None:
    V = Variable
    V.__add__ = V.__radd__ = _scalar_or_binary("elementwise_add", lambda v: (1.0, v))
    V.__sub__ = _scalar_or_binary("elementwise_sub", lambda v: (1.0, -v))
    V.__rsub__ = _scalar_or_binary("elementwise_sub", lambda v: (-1.0, v), reverse=True)
    V.__mul__ = V.__rmul__ = _scalar_or_binary("elementwise_mul", lambda v: (v, 0.0))
    V.__truediv__ = _scalar_or_binary(
        "elementwise_div", lambda v: (1.0 / v, 0.0) if v != 0 else (float("inf"), 0.0))
    V.__rtruediv__ = _scalar_or_binary("elementwise_div", reverse=True)
    V.__floordiv__ = _scalar_or_binary("elementwise_floordiv")
    V.__mod__ = _scalar_or_binary("elementwise_mod")
    V.__pow__ = _scalar_or_binary("elementwise_pow")
    V.__rpow__ = _scalar_or_binary("elementwise_pow", reverse=True)
    V.__neg__ = lambda self: scale(self, scale=-1.0, bias=0.0)
    V.__lt__, V.__le__ = _cmp("less_than"), _cmp("less_equal")
    V.__gt__, V.__ge__ = _cmp("greater_than"), _cmp("greater_equal")
    V.__eq__, V.__ne__ = _cmp("equal"), _cmp("not_equal")
    V.__hash__ = object.__hash__
    V.__bool__ = _no_bool


def _no_bool(self):
    raise TypeError(f"the truth value of Variable {self.name!r} is only known when the program "
                    f"runs; use layers.cond / IfElse, or compare names")


_patch_variable()
