"""Fluid 1.8's cell API: ``RNNCell``, ``GRUCell``, ``LSTMCell`` and ``rnn(cell, inputs, ...)``.

``rnn`` runs a cell over the time steps of ``inputs`` with a :class:`StaticRNN` (a
``recurrent`` op, differentiable), as Fluid 1.8 builds it in static mode: states carried as
memories, outputs and states stacked, the final states the last step's. With
``sequence_length``, a state stops changing once its sequence ended (``new = mask * new +
(1 - mask) * old``), so the final states are those at each sequence's end; ``is_reverse``
runs the steps last to first.

The cells compute as Fluid 1.8's ``BasicGRUUnit`` / ``BasicLSTMUnit`` (weights over
``[input, hidden]``):

- GRU: ``r, u = act_g([x, h] @ W_g + b_g)`` (split in two), ``c = act([x, r * h] @ W_c + b_c)``,
  ``h' = u * h + (1 - u) * c``;
- LSTM: ``i, j, f, o = split([x, h] @ W + b, 4)``, ``c' = c * act_g(f + forget_bias) +
  act_g(i) * act(j)``, ``h' = act(c') * act_g(o)``.
"""
from __future__ import annotations

from pdjit.framework import unique_name
from pdjit.framework.program import Variable
from pdjit.layers import nn
from pdjit.layers.control_flow import _flatten, _pack, _same_structure
from pdjit.layers.image import shape
from pdjit.layers.layer_helper import LayerHelper, check_variable
from pdjit.layers.math_ops import elementwise_add, elementwise_mul, elementwise_sub, sigmoid, tanh
from pdjit.layers.recurrent import StaticRNN
from pdjit.layers.sequence import sequence_mask
from pdjit.layers.shape_ops import concat, reshape, split, squeeze, transpose, unsqueeze
from pdjit.layers.shape_ops import slice as _slice
from pdjit.layers.tensor import cast, fill_constant_batch_size_like

__all__ = ["RNNCell", "GRUCell", "LSTMCell", "rnn"]


def _act(fn, default, layer: str, arg: str):
    if fn is None:
        return default
    if not callable(fn):
        raise TypeError(f"{layer}: {arg} must be callable (e.g. fluid.layers.sigmoid), got "
                        f"{type(fn).__name__}")
    return fn


class RNNCell:
    """The base of a cell: ``call(inputs, states, **kwargs)`` returns ``(outputs,
    new_states)``; ``state_shape`` (a shape without the batch dim, or a nesting of them)
    and ``state_dtype`` describe the states for ``get_initial_states``."""

    def call(self, inputs, states, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}: an RNNCell must define call()")

    def __call__(self, inputs, states, **kwargs):
        return self.call(inputs, states, **kwargs)

    @property
    def state_shape(self):
        raise NotImplementedError(f"{type(self).__name__}: define state_shape, or give "
                                  f"get_initial_states a shape")

    @property
    def state_dtype(self):
        raise NotImplementedError

    def get_initial_states(self, batch_ref, shape=None, dtype=None, init_value=0,
                           batch_dim_idx=0):
        """Zero (``init_value``) states of ``shape`` (default ``state_shape``), their batch dim
        taken from dim ``batch_dim_idx`` of (the first tensor of) ``batch_ref``."""
        ref = _flatten(batch_ref)[0]
        check_variable(ref, "batch_ref", f"{type(self).__name__}.get_initial_states")
        shapes = self.state_shape if shape is None else shape
        if dtype is None:
            try:
                dtype = self.state_dtype
            except NotImplementedError:
                dtype = "float32"
        leaves = _shape_leaves(shapes)
        dtypes = [dtype] * len(leaves) if not isinstance(dtype, (list, tuple)) \
            else _flatten(dtype)
        states = [fill_constant_batch_size_like(ref, shape=[-1] + list(s), dtype=d,
                                                value=float(init_value),
                                                input_dim_idx=batch_dim_idx)
                  for s, d in zip(leaves, dtypes)]
        return _pack_shapes(shapes, states)


def _is_shape(s) -> bool:
    return isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s)


def _shape_leaves(shapes) -> list:
    if _is_shape(shapes):
        return [list(shapes)]
    if isinstance(shapes, (list, tuple)):
        return [leaf for s in shapes for leaf in _shape_leaves(s)]
    raise TypeError(f"state_shape must be a list of ints or a nesting of them, got {shapes!r}")


def _pack_shapes(shapes, flat: list):
    it = iter(flat)

    def build(s):
        if _is_shape(s):
            return next(it)
        return type(s)(build(x) for x in s)
    return build(shapes)


class GRUCell(RNNCell):
    """Fluid 1.8's ``GRUCell(hidden_size)``: ``cell(x, h) -> (h', h')``."""

    def __init__(self, hidden_size, param_attr=None, bias_attr=None, gate_activation=None,
                 activation=None, dtype="float32", name="GRUCell"):
        self.hidden_size = int(hidden_size)
        self._param_attr, self._bias_attr = param_attr, bias_attr
        self._gate_act = _act(gate_activation, sigmoid, "GRUCell", "gate_activation")
        self._act = _act(activation, tanh, "GRUCell", "activation")
        self._dtype, self._name = dtype, name
        self._weights = None

    def _build(self, input_size: int):
        if self._weights is None:
            helper = LayerHelper("gru_cell", name=unique_name.generate(self._name))
            h = self.hidden_size
            self._weights = (
                helper.create_parameter(self._param_attr, [input_size + h, 2 * h], self._dtype),
                helper.create_parameter(self._bias_attr, [2 * h], self._dtype, is_bias=True),
                helper.create_parameter(self._param_attr, [input_size + h, h], self._dtype),
                helper.create_parameter(self._bias_attr, [h], self._dtype, is_bias=True))
        return self._weights

    def call(self, inputs, states):
        check_variable(inputs, "inputs", "GRUCell")
        check_variable(states, "states", "GRUCell")
        w_g, b_g, w_c, b_c = self._build(int(inputs.shape[-1]))
        gates = nn.matmul(concat([inputs, states], axis=1), w_g)
        if b_g is not None:
            gates = elementwise_add(gates, b_g)
        r, u = split(self._gate_act(gates), num_or_sections=2, dim=1)
        cand = nn.matmul(concat([inputs, r * states], axis=1), w_c)
        if b_c is not None:
            cand = elementwise_add(cand, b_c)
        c = self._act(cand)
        new_h = u * states + (1.0 - u) * c
        return new_h, new_h

    @property
    def state_shape(self):
        return [self.hidden_size]

    @property
    def state_dtype(self):
        return self._dtype


class LSTMCell(RNNCell):
    """Fluid 1.8's ``LSTMCell(hidden_size)``: ``cell(x, [h, c]) -> (h', [h', c'])``."""

    def __init__(self, hidden_size, param_attr=None, bias_attr=None, gate_activation=None,
                 activation=None, forget_bias=1.0, dtype="float32", name="LSTMCell"):
        self.hidden_size = int(hidden_size)
        self._param_attr, self._bias_attr = param_attr, bias_attr
        self._gate_act = _act(gate_activation, sigmoid, "LSTMCell", "gate_activation")
        self._act = _act(activation, tanh, "LSTMCell", "activation")
        self._forget_bias = float(forget_bias)
        self._dtype, self._name = dtype, name
        self._weights = None

    def _build(self, input_size: int):
        if self._weights is None:
            helper = LayerHelper("lstm_cell", name=unique_name.generate(self._name))
            h = self.hidden_size
            self._weights = (
                helper.create_parameter(self._param_attr, [input_size + h, 4 * h], self._dtype),
                helper.create_parameter(self._bias_attr, [4 * h], self._dtype, is_bias=True))
        return self._weights

    def call(self, inputs, states):
        check_variable(inputs, "inputs", "LSTMCell")
        if not isinstance(states, (list, tuple)) or len(states) != 2:
            raise TypeError(f"LSTMCell: states must be [hidden, cell], got {states!r}")
        pre_h, pre_c = states
        w, b = self._build(int(inputs.shape[-1]))
        gates = nn.matmul(concat([inputs, pre_h], axis=1), w)
        if b is not None:
            gates = elementwise_add(gates, b)
        i, j, f, o = split(gates, num_or_sections=4, dim=-1)
        new_c = pre_c * self._gate_act(f + self._forget_bias) + self._gate_act(i) * self._act(j)
        new_h = self._act(new_c) * self._gate_act(o)
        return new_h, [new_h, new_c]

    @property
    def state_shape(self):
        return [[self.hidden_size], [self.hidden_size]]

    @property
    def state_dtype(self):
        return [self._dtype, self._dtype]


def _steps_of(x, axis: int):
    """Dim ``axis`` of ``x`` (the time steps): an int when known, else an int64 Variable."""
    steps = int(x.shape[axis])
    if steps >= 0:
        return steps
    return cast(_slice(shape(x), axes=[0], starts=[axis], ends=[axis + 1]), "int64")


def _batch_time(x):
    return transpose(x, perm=[1, 0] + list(range(2, len(x.shape))))


def rnn(cell, inputs, initial_states=None, sequence_length=None, time_major=False,
        is_reverse=False, **kwargs):
    """Run ``cell`` over the steps of ``inputs`` (``[batch, time, ...]``, or ``[time, batch,
    ...]`` when ``time_major``; a Variable or a nesting of them). Returns ``(outputs,
    final_states)``: the cell's outputs at every step (laid out as ``inputs``) and its states
    after the last step (with ``sequence_length``, after each sequence's last step)."""
    if not isinstance(cell, RNNCell):
        raise TypeError(f"rnn: cell must be an RNNCell (GRUCell, LSTMCell or a subclass), got "
                        f"{type(cell).__name__}")
    flat_inputs = _flatten(inputs)
    for x in flat_inputs:
        check_variable(x, "inputs", "rnn")
        if len(x.shape) < 2:
            raise ValueError(f"rnn: each input must be at least [batch, time], got shape "
                             f"{list(x.shape)} ({x.name!r})")
    if initial_states is None:
        initial_states = cell.get_initial_states(batch_ref=inputs,
                                                 batch_dim_idx=1 if time_major else 0)
    flat_states = _flatten(initial_states)
    for s in flat_states:
        check_variable(s, "initial_states", "rnn")
    if not time_major:
        flat_inputs = [_batch_time(x) for x in flat_inputs]
    mask = None
    if sequence_length is not None:
        check_variable(sequence_length, "sequence_length", "rnn")
        mask = sequence_mask(sequence_length, maxlen=_steps_of(flat_inputs[0], 0),
                             dtype=flat_states[0].dtype)
        mask = transpose(mask, perm=[1, 0])
    srnn = StaticRNN()
    srnn._reverse = bool(is_reverse)
    with srnn.step():
        step_inputs = _pack(inputs, [srnn.step_input(x) for x in flat_inputs])
        memories = [srnn.memory(init=s) for s in flat_states]
        states = _pack(initial_states, memories)
        outputs, new_states = cell(step_inputs, states, **kwargs)
        why = _same_structure(states, new_states)
        if why:
            raise ValueError(f"rnn: the cell's new states must nest as its states: {why}")
        flat_new = _flatten(new_states)
        if mask is not None:
            m = srnn.step_input(mask)
            flat_new = [elementwise_sub(elementwise_mul(new, m, axis=0),
                                        elementwise_mul(old, m - 1.0, axis=0))
                        for old, new in zip(memories, flat_new)]
        for old, new in zip(memories, flat_new):
            check_variable(new, "the cell's new states", "rnn")
            srnn.update_memory(old, new)
        flat_outputs = _flatten(outputs)
        for o in flat_outputs + flat_new:
            check_variable(o, "the cell's outputs", "rnn")
            srnn.step_output(o)
    stacked = srnn()
    stacked = [stacked] if isinstance(stacked, Variable) else list(stacked)
    outs, finals = stacked[:len(flat_outputs)], stacked[len(flat_outputs):]
    # the states after the last step run: time step T - 1, or 0 when the steps ran backwards
    last = [0, 1] if is_reverse else [-1, _BIG]
    finals = [squeeze(_slice(s, axes=[0], starts=[last[0]], ends=[last[1]]), axes=[0])
              for s in finals]
    if not time_major:
        outs = [_batch_time(o) for o in outs]
    return _pack(outputs, outs), _pack(new_states, finals)


_BIG = 2 ** 31 - 1


# ---- fluid.contrib.layers.basic_lstm / basic_gru ------------------------------------------------
class _MaskedCell(RNNCell):
    """``cell`` on inputs ``[x, mask]``: where the mask is 0 (past a sequence's end) the states
    keep their values, and the output is the (kept) first state, as Fluid's basic_lstm/gru."""

    def __init__(self, cell):
        self.cell = cell

    def call(self, inputs, states):
        x, m = inputs
        _, new = self.cell(x, states)
        flat_old, flat_new = _flatten(states), _flatten(new)
        kept = [elementwise_sub(elementwise_mul(n, m, axis=0), elementwise_mul(o, m - 1.0, axis=0))
                for o, n in zip(flat_old, flat_new)]
        return kept[0], _pack(new, kept)


def _layer_states(init, num_layers, directions, batch_ref, hidden_size, dtype, layer):
    """[layer][direction] initial states from ``init`` ``[num_layers * directions, B, H]``
    (zeros when None)."""
    if init is None:
        zeros = fill_constant_batch_size_like(batch_ref, shape=[-1, hidden_size], dtype=dtype,
                                              value=0.0, input_dim_idx=0)
        return [[zeros] * directions for _ in range(num_layers)]
    check_variable(init, "init", layer)
    parts = split(init, num_or_sections=num_layers * directions, dim=0)
    parts = [reshape(p, [-1, hidden_size]) for p in parts]
    return [[parts[k * directions + d] for d in range(directions)] for k in range(num_layers)]


def _basic_rnn(kind, input, inits, hidden_size, num_layers, sequence_length, dropout_prob,
               bidirectional, batch_first, make_cell, dtype, name):
    layer = f"basic_{kind}"
    check_variable(input, "input", layer)
    if len(input.shape) != 3:
        raise ValueError(f"{layer}: input must be 3-D ([batch, time, size] when batch_first), "
                         f"got shape {list(input.shape)} ({input.name!r})")
    directions = 2 if bidirectional else 1
    x = input if batch_first else transpose(input, perm=[1, 0, 2])   # batch-major from here
    batch_ref = x
    steps = int(x.shape[1])
    if sequence_length is not None:
        check_variable(sequence_length, "sequence_length", layer)
        mask = sequence_mask(sequence_length, maxlen=_steps_of(x, 1), dtype=dtype)
    else:
        mask = fill_constant_batch_size_like(x, shape=[-1, steps], dtype=dtype, value=1.0) \
            if steps > 0 else None
        if mask is None:
            raise ValueError(f"{layer}: the number of steps (dim 1 of the batch-major input) "
                             f"must be known without sequence_length")
    mask = unsqueeze(mask, axes=[2])   # [B, T, 1]: a step input beside x
    states = [_layer_states(init, num_layers, directions, batch_ref, hidden_size, dtype, layer)
              for init in inits]
    last = [[] for _ in inits]
    for k in range(num_layers):
        outs = []
        for d in range(directions):
            cell = _MaskedCell(make_cell(f"{name}_{'reverse_' if d else ''}layers_{k}"))
            init = [s[k][d] for s in states]
            out, final = rnn(cell, [x, mask], initial_states=init if len(init) > 1 else init[0],
                             is_reverse=bool(d))
            outs.append(out)
            for i, f in enumerate(_flatten(final)):
                last[i].append(f)
        x = concat(outs, axis=2) if directions == 2 else outs[0]
        if dropout_prob and k < num_layers - 1:
            x = nn.dropout(x, dropout_prob=dropout_prob,
                           dropout_implementation="upscale_in_train")
    out = x if batch_first else transpose(x, perm=[1, 0, 2])
    finals = [reshape(concat(f, axis=0), [num_layers * directions, -1, hidden_size])
              for f in last]
    return out, finals


def basic_lstm(input, init_hidden, init_cell, hidden_size, num_layers=1, sequence_length=None,
               dropout_prob=0.0, bidirectional=False, batch_first=True, param_attr=None,
               bias_attr=None, gate_activation=None, activation=None, forget_bias=1.0,
               dtype="float32", name="basic_lstm"):
    """Fluid 1.8's ``fluid.contrib.layers.basic_lstm``: a stacked (optionally bidirectional)
    LSTM of :class:`LSTMCell` units. ``init_hidden``/``init_cell`` ``[num_layers * D, B, H]``
    (None: zeros). Returns ``(rnn_out [B, T, D * H] (time-major when not batch_first),
    last_hidden, last_cell [num_layers * D, B, H])``; past a sequence's end the states and
    the outputs keep their last values."""
    def make(cell_name):
        return LSTMCell(hidden_size, param_attr, bias_attr, gate_activation, activation,
                        forget_bias, dtype, cell_name)
    out, (h, c) = _basic_rnn("lstm", input, [init_hidden, init_cell], hidden_size, num_layers,
                             sequence_length, dropout_prob, bidirectional, batch_first, make,
                             dtype, name)
    return out, h, c


def basic_gru(input, init_hidden, hidden_size, num_layers=1, sequence_length=None,
              dropout_prob=0.0, bidirectional=False, batch_first=True, param_attr=None,
              bias_attr=None, gate_activation=None, activation=None, dtype="float32",
              name="basic_gru"):
    """Fluid 1.8's ``fluid.contrib.layers.basic_gru``: as :func:`basic_lstm` with
    :class:`GRUCell` units; returns ``(rnn_out, last_hidden)``."""
    def make(cell_name):
        return GRUCell(hidden_size, param_attr, bias_attr, gate_activation, activation, dtype,
                       cell_name)
    out, (h,) = _basic_rnn("gru", input, [init_hidden], hidden_size, num_layers,
                           sequence_length, dropout_prob, bidirectional, batch_first, make,
                           dtype, name)
    return out, h
