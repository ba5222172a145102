"""Fluid 1.8's single-step recurrent units ``gru_unit`` and ``lstm_unit``, composed of
existing layers (so they run natively and differentiate), with Fluid 1.8's parameters:

- ``gru_unit(input [N, 3H], hidden [N, H], size=3H)``: parameters ``gru_unit_N.w_0`` ``[H, 3H]``
  (in memory: the ``[H, 2H]`` weight of the update and reset gates, then the ``[H, H]`` weight of
  the candidate, as Fluid's kernel reads it) and ``gru_unit_N.b_0`` ``[1, 3H]``;
  ``u, r = gate_act(input[:, :2H] + b[:2H] + hidden @ W_ur)``, ``c = act(input[:, 2H:] +
  b[2H:] + (r * hidden) @ W_c)``, ``h = (1 - u) * hidden + u * c`` (``origin_mode``: ``u *
  hidden + (1 - u) * c``). Returns ``(h, r * hidden, [u, r, c])``.
- ``lstm_unit(x_t, hidden_t_prev, cell_t_prev, forget_bias)``: an ``fc`` of ``[x_t,
  hidden_t_prev]`` to ``4H`` gates in the order (i, f, o, g); ``c = sigmoid(f + forget_bias) *
  c_prev + sigmoid(i) * tanh(g)``, ``h = sigmoid(o) * tanh(c)``. Returns ``(h, c)``.
"""
from __future__ import annotations

from pdjit.layers import math_ops, nn, shape_ops
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["gru_unit", "lstm_unit"]

_ACTS = {"sigmoid": math_ops.sigmoid, "tanh": math_ops.tanh, "relu": math_ops.relu,
         "identity": lambda x: x}


def _act(name, arg: str, layer: str):
    if name not in _ACTS:
        raise ValueError(f"{layer}: argument {arg!r} must be one of {sorted(_ACTS)}, got "
                         f"{name!r}")
    return _ACTS[name]


def _cols(x, start: int, end: int):
    return shape_ops.slice(x, [1], [start], [end])


def gru_unit(input, hidden, size, param_attr=None, bias_attr=None, activation="tanh",
             gate_activation="sigmoid", origin_mode=False):
    """One GRU step (see the module docstring); ``size`` is ``3 * H``."""
    layer = "gru_unit"
    check_variable(input, "input", layer)
    check_dtype(input, "input", ("float32", "float64"), layer)
    check_variable(hidden, "hidden", layer)
    act, gate_act = _act(activation, "activation", layer), \
        _act(gate_activation, "gate_activation", layer)
    if size % 3:
        raise ValueError(f"{layer}: argument 'size' must be 3 * the hidden size, got {size}")
    h = size // 3
    if input.shape[-1] not in (-1, size) or hidden.shape[-1] not in (-1, h):
        raise ValueError(f"{layer}: expected input [N, {size}] and hidden [N, {h}], got "
                         f"{list(input.shape)} and {list(hidden.shape)}")
    helper = LayerHelper(layer, param_attr=param_attr, bias_attr=bias_attr)
    dtype = input.dtype
    weight = helper.create_parameter(helper.param_attr, [h, 3 * h], dtype)
    gates = input
    if bias_attr is not False:
        bias = helper.create_parameter(helper.bias_attr, [1, 3 * h], dtype, is_bias=True)
        gates = math_ops.elementwise_add(input, bias)
    flat = shape_ops.reshape(weight, [3 * h * h])
    w_ur = shape_ops.reshape(shape_ops.slice(flat, [0], [0], [2 * h * h]), [h, 2 * h])
    w_c = shape_ops.reshape(shape_ops.slice(flat, [0], [2 * h * h], [3 * h * h]), [h, h])
    ur = math_ops.elementwise_add(_cols(gates, 0, 2 * h), nn.matmul(hidden, w_ur))
    u, r = gate_act(_cols(ur, 0, h)), gate_act(_cols(ur, h, 2 * h))
    reset_hidden = math_ops.elementwise_mul(r, hidden)
    c = act(math_ops.elementwise_add(_cols(gates, 2 * h, 3 * h), nn.matmul(reset_hidden, w_c)))
    if origin_mode:   # c + u * (hidden - c)
        new_h = math_ops.elementwise_add(
            c, math_ops.elementwise_mul(u, math_ops.elementwise_sub(hidden, c)))
    else:             # hidden + u * (c - hidden)
        new_h = math_ops.elementwise_add(
            hidden, math_ops.elementwise_mul(u, math_ops.elementwise_sub(c, hidden)))
    return new_h, reset_hidden, shape_ops.concat([u, r, c], axis=1)


def lstm_unit(x_t, hidden_t_prev, cell_t_prev, forget_bias: float = 0.0, param_attr=None,
              bias_attr=None, name=None):
    """One LSTM step (see the module docstring); returns ``(h, c)``."""
    layer = "lstm_unit"
    for arg, v in (("x_t", x_t), ("hidden_t_prev", hidden_t_prev),
                   ("cell_t_prev", cell_t_prev)):
        check_variable(v, arg, layer)
        if len(v.shape) != 2:
            raise ValueError(f"{layer}: argument {arg!r} must be 2-D, got {list(v.shape)}")
    h = cell_t_prev.shape[1]
    if h < 0 or hidden_t_prev.shape[1] not in (-1, h):
        raise ValueError(f"{layer}: hidden_t_prev and cell_t_prev must have one known width, "
                         f"got {list(hidden_t_prev.shape)} and {list(cell_t_prev.shape)}")
    gates = nn.fc(shape_ops.concat([x_t, hidden_t_prev], axis=1), size=4 * h,
                  param_attr=param_attr, bias_attr=bias_attr)
    i, f, o, g = (_cols(gates, k * h, (k + 1) * h) for k in range(4))
    f = math_ops.sigmoid(math_ops.scale(f, bias=float(forget_bias)) if forget_bias else f)
    c = math_ops.elementwise_add(math_ops.elementwise_mul(f, cell_t_prev),
                                 math_ops.elementwise_mul(math_ops.sigmoid(i), math_ops.tanh(g)))
    new_h = math_ops.elementwise_mul(math_ops.sigmoid(o), math_ops.tanh(c))
    return new_h, c
