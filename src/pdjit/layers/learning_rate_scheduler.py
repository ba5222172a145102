"""Learning-rate schedules: a learning rate computed in the program from a step counter.

Each schedule reads the global step counter (``@LR_DECAY_COUNTER@``, a persistable float32
``[1]`` that an ``increment`` op at the start of the main program advances once per run; the
first run sees step 0) and builds the rate from elementwise ops — no control flow, so the
whole schedule fuses into the step's native code. Pass the result to an optimizer as
``learning_rate``. Formulas follow Fluid's layers of the same names.
"""
from __future__ import annotations

import math

from pdjit.framework import registry
from pdjit.framework.program import Variable, default_main_program
from pdjit.layers import math_ops
from pdjit.layers.layer_helper import LayerHelper
from pdjit.layers.tensor import cast, create_global_var, fill_constant

__all__ = ["piecewise_decay", "exponential_decay", "natural_exp_decay", "inverse_time_decay",
           "polynomial_decay", "cosine_decay", "linear_lr_warmup", "noam_decay"]

COUNTER = "@LR_DECAY_COUNTER@"


def _step_counter() -> Variable:
    """The global step (float32 [1]): starts at 0 on the first run, +1 each later run."""
    main = default_main_program()
    gb = main.global_block()
    if gb.has_var(COUNTER):
        return gb.var(COUNTER)
    counter = create_global_var([1], -1.0, "float32", persistable=True, name=COUNTER)
    with main._op_role_guard(registry.OP_ROLE_LRSCHED):
        gb._prepend_op("increment", inputs={"X": [counter]}, outputs={"Out": [counter]},
                       attrs={"step": 1.0})
    counter.stop_gradient = True
    return counter


def _lr_role():
    return default_main_program()._op_role_guard(registry.OP_ROLE_LRSCHED)


def _const(value) -> Variable:
    return fill_constant([1], "float32", float(value))


def exponential_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``lr * decay_rate ** (step / decay_steps)`` (the exponent floored when staircase)."""
    with _lr_role():
        step = _step_counter()
        e = math_ops.scale(step, scale=1.0 / float(decay_steps))
        if staircase:
            e = math_ops.floor(e)
        return math_ops.scale(math_ops.elementwise_pow(_const(decay_rate), e),
                              scale=float(learning_rate))


def natural_exp_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``lr * exp(-decay_rate * step / decay_steps)``"""
    with _lr_role():
        e = math_ops.scale(_step_counter(), scale=1.0 / float(decay_steps))
        if staircase:
            e = math_ops.floor(e)
        return math_ops.scale(math_ops.exp(math_ops.scale(e, scale=-float(decay_rate))),
                              scale=float(learning_rate))


def inverse_time_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``lr / (1 + decay_rate * step / decay_steps)``"""
    with _lr_role():
        e = math_ops.scale(_step_counter(), scale=1.0 / float(decay_steps))
        if staircase:
            e = math_ops.floor(e)
        denom = math_ops.scale(e, scale=float(decay_rate), bias=1.0)
        return math_ops.elementwise_div(_const(learning_rate), denom)


def polynomial_decay(learning_rate, decay_steps, end_learning_rate=0.0001, power=1.0,
                     cycle=False):
    """``(lr - end) * (1 - min(step, decay_steps) / decay_steps) ** power + end``; with cycle,
    ``decay_steps`` grows to the next multiple of itself past the step."""
    with _lr_role():
        step = _step_counter()
        if cycle:
            k = math_ops.ceil(math_ops.scale(step, scale=1.0 / float(decay_steps)))
            k = math_ops.elementwise_max(k, _const(1.0))
            steps = math_ops.scale(k, scale=float(decay_steps))
            frac = math_ops.elementwise_div(step, steps)
        else:
            frac = math_ops.scale(math_ops.elementwise_min(step, _const(decay_steps)),
                                  scale=1.0 / float(decay_steps))
        base = math_ops.scale(frac, scale=-1.0, bias=1.0)
        decayed = math_ops.elementwise_pow(base, _const(power))
        return math_ops.scale(decayed, scale=float(learning_rate) - float(end_learning_rate),
                              bias=float(end_learning_rate))


def piecewise_decay(boundaries, values):
    """``values[i]`` while ``boundaries[i-1] <= step < boundaries[i]``: a sum of indicators."""
    if len(values) != len(boundaries) + 1:
        raise ValueError(f"piecewise_decay: expected len(values) == len(boundaries) + 1, got "
                         f"{len(values)} values for {len(boundaries)} boundaries")
    if list(boundaries) != sorted(boundaries):
        raise ValueError(f"piecewise_decay: boundaries must increase, got {list(boundaries)}")
    with _lr_role():
        step = _step_counter()
        lr = _const(values[0])
        for b, prev, cur in zip(boundaries, values, values[1:]):
            # from boundary b on, the rate moves from prev to cur: add (cur - prev) * [step >= b]
            past = cast(math_ops.greater_equal(step, _const(b)), "float32")
            lr = math_ops.elementwise_add(lr, math_ops.scale(past, scale=float(cur - prev)))
        return lr


def cosine_decay(learning_rate, step_each_epoch, epochs):
    """``lr * 0.5 * (cos(floor(step / step_each_epoch) * pi / epochs) + 1)``"""
    with _lr_role():
        epoch = math_ops.floor(math_ops.scale(_step_counter(), scale=1.0 / float(step_each_epoch)))
        helper = LayerHelper("cos")
        c = helper.create_variable_for_type_inference("float32")
        helper.append_op("cos", inputs={"X": [math_ops.scale(epoch, scale=math.pi / epochs)]},
                         outputs={"Out": [c]})
        return math_ops.scale(c, scale=0.5 * float(learning_rate), bias=0.5 * float(learning_rate))


def linear_lr_warmup(learning_rate, warmup_steps, start_lr, end_lr):
    """``start + (end - start) * step / warmup_steps`` during warm-up, then ``learning_rate``
    (a float or a schedule Variable)."""
    if warmup_steps <= 0:
        raise ValueError(f"linear_lr_warmup: warmup_steps must be > 0, got {warmup_steps}")
    with _lr_role():
        step = _step_counter()
        warm = math_ops.scale(step, scale=(float(end_lr) - float(start_lr)) / warmup_steps,
                              bias=float(start_lr))
        lr = learning_rate if isinstance(learning_rate, Variable) else _const(learning_rate)
        during = cast(math_ops.less_than(step, _const(warmup_steps)), "float32")
        after = math_ops.scale(during, scale=-1.0, bias=1.0)
        return math_ops.elementwise_add(math_ops.elementwise_mul(warm, during),
                                        math_ops.elementwise_mul(lr, after))


def noam_decay(d_model, warmup_steps, learning_rate=1.0):
    """``lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` with step counted from 1."""
    with _lr_role():
        step = math_ops.scale(_step_counter(), bias=1.0)
        a = math_ops.rsqrt(step)
        b = math_ops.scale(step, scale=float(warmup_steps) ** -1.5)
        return math_ops.scale(math_ops.elementwise_min(a, b),
                              scale=float(learning_rate) * float(d_model) ** -0.5)
