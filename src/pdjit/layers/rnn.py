"""Fluid 1.x's recurrent layers: ``dynamic_lstm``, ``dynamic_gru``, ``lstm`` (the ``rnn`` op) and
``sequence_conv``."""
from __future__ import annotations

import math

from pdjit.layers.initializer import Uniform
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable
from pdjit.layers.param_attr import ParamAttr
from pdjit.layers.shape_ops import transpose

__all__: list = ["lstm"]

_FLOATS = ("float32", "float64")


def lstm(input, init_h, init_c, max_len, hidden_size, num_layers, dropout_prob=0.0,
         is_bidirec=False, is_test=False, name=None, default_initializer=None, seed=-1):
    """A stacked (optionally bidirectional) LSTM over batch-major ``input`` ``[B, T, I]``, as
    Fluid 1.8's ``fluid.layers.lstm`` (which appended ``cudnn_lstm``): returns
    ``(rnn_out [B, T, D * hidden_size], last_h, last_c)``, the states ``[num_layers * D, B,
    hidden_size]`` like ``init_h`` and ``init_c`` (``D = 2`` when ``is_bidirec``).

    It appends ``transpose2`` (to time-major), the ``rnn`` op (mode ``LSTM``) and a
    ``transpose2`` back. The weights are parameters of their own in Paddle's order (``w_ih
    [4H, I_l]``, ``w_hh [4H, H]`` per layer and direction, then the biases ``b_ih``, ``b_hh``
    ``[4H]``), initialised uniformly in ``[-1/sqrt(H), 1/sqrt(H)]`` (``default_initializer``
    replaces that). ``max_len`` is accepted as Fluid 1.8 took it (the steps come from
    ``input``); ``dropout_prob`` drops the outputs of every layer but the last when not
    ``is_test``; ``seed`` -1 draws from the program's random stream."""
    layer = "lstm"
    check_variable(input, "input", layer)
    check_dtype(input, "input", _FLOATS, layer)
    for arg, v in (("init_h", init_h), ("init_c", init_c)):
        check_variable(v, arg, layer)
        if v.dtype != input.dtype:
            raise ValueError(f"lstm: {arg} must have input's dtype {input.dtype}, got {v.dtype}")
    if len(input.shape) != 3:
        raise ValueError(f"lstm: input must be [batch, seq_len, input_size], got shape "
                         f"{list(input.shape)} ({input.name!r})")
    hidden_size, num_layers = int(hidden_size), int(num_layers)
    if hidden_size < 1 or num_layers < 1:
        raise ValueError(f"lstm: hidden_size and num_layers must be >= 1, got {hidden_size} "
                         f"and {num_layers}")
    if not 0.0 <= float(dropout_prob) < 1.0:
        raise ValueError(f"lstm: dropout_prob must lie in [0, 1), got {dropout_prob}")
    input_size = int(input.shape[-1])
    if input_size < 0:
        raise ValueError(f"lstm: the last dim of input {input.name!r} (shape "
                         f"{list(input.shape)}) must be known to size the weights")
    d = 2 if is_bidirec else 1
    for arg, v in (("init_h", init_h), ("init_c", init_c)):
        want = [num_layers * d, hidden_size]
        got = [int(v.shape[0]), int(v.shape[-1])] if len(v.shape) == 3 else None
        if got is None or any(g >= 0 and g != w for g, w in zip(got, want)):
            raise ValueError(f"lstm: {arg} must have shape [num_layers * directions, batch, "
                             f"hidden_size] = [{want[0]}, batch, {hidden_size}], got "
                             f"{list(v.shape)} ({v.name!r})")
    helper = LayerHelper("lstm", name=name)
    dtype = input.dtype
    bound = 1.0 / math.sqrt(hidden_size)
    init = default_initializer or Uniform(-bound, bound)
    g = 4 * hidden_size
    weights, biases = [], []
    for k in range(num_layers * d):
        il = input_size if k < d else d * hidden_size
        weights += [helper.create_parameter(ParamAttr(), [g, il], dtype,
                                            default_initializer=init),
                    helper.create_parameter(ParamAttr(), [g, hidden_size], dtype,
                                            default_initializer=init)]
    for _ in range(num_layers * d):
        biases += [helper.create_parameter(ParamAttr(), [g], dtype, is_bias=True,
                                           default_initializer=init) for _ in range(2)]
    x = transpose(input, [1, 0, 2])
    out = helper.create_variable_for_type_inference(dtype)
    last_h = helper.create_variable_for_type_inference(dtype)
    last_c = helper.create_variable_for_type_inference(dtype)
    reserve = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    dropout_state = helper.create_variable_for_type_inference("uint8", stop_gradient=True)
    helper.append_op(
        "rnn", inputs={"Input": [x], "PreState": [init_h, init_c],
                       "WeightList": weights + biases},
        outputs={"Out": [out], "State": [last_h, last_c], "Reserve": [reserve],
                 "DropoutState": [dropout_state]},
        attrs={"dropout_prob": float(dropout_prob), "is_bidirec": bool(is_bidirec),
               "input_size": input_size, "hidden_size": hidden_size, "num_layers": num_layers,
               "mode": "LSTM", "seed": max(int(seed), 0), "is_test": bool(is_test)})
    return transpose(out, [1, 0, 2]), last_h, last_c
