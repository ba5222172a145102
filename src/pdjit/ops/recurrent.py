"""Fluid 1.x's ``recurrent`` op (what its ``StaticRNN`` serialises to) and ``recurrent_grad``.

Slots and attributes are Fluid 1.8's, so its programs load and run:

- ``recurrent`` (inputs*, initial_states*, parameters* -> outputs*, step_scopes; ``sub_block``,
  ``ex_states``, ``states``, ``reverse``, ``is_train``, ``has_states``): ``T`` = dim 0 of the
  inputs (all equal). Run ``k`` (0..T-1) works on time step ``t = k`` (``T - 1 - k`` when
  ``reverse``): in the body, each input name holds ``input[t]``, each ``ex_states[i]`` holds
  ``initial_states[i]`` at run 0 and, after, the value ``states[i]`` had at the end of the run
  before; ``outputs[j][t]`` is the value the body left in the output's name. The parameters
  (and anything else) are read from the enclosing block. ``step_scopes`` keeps every run's env
  when ``is_train``.
- ``recurrent_grad`` (the same, plus outputs, outputs@GRAD -> inputs@GRAD,
  initial_states@GRAD, parameters@GRAD): the grad block runs once per forward run, last run
  first; in it ``outputs@GRAD`` names hold step ``t`` of each output's gradient and
  ``states[i]@GRAD`` the gradient ``ex_states[i]@GRAD`` had in the run after (zeros at the
  last run); the gradients it leaves (``input@GRAD`` of each step input, the parameters'
  under the op's output names) are gathered into step ``t`` of the inputs', summed for the
  parameters', and the first run's ex-state gradients are the initial states'.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ProgramError, ShapeMismatch
from pdjit.framework.registry import (
    CONTROL_FLOW,
    EMPTY_VAR_NAME,
    LOOP,
    BlockAttr,
    Bool,
    ControlFlow,
    GradOpSpec,
    Strs,
    grad_var_name,
    register_op,
)
from pdjit.ops.control_flow_grad import _add, _by_name, _run_grad_block, _steps, _zeros_like

_SKIP_DOC = "names Paddle's executor must not free early; recorded only"


def _data(v):
    return np.asarray(v)


def _seq_len(op, inputs) -> int:
    names = op.input("inputs")
    if not names:
        raise ShapeMismatch("recurrent: the op has no inputs; the number of steps is dim 0 of "
                            "its inputs")
    lens = []
    for n, v in zip(names, inputs):
        if v is None:
            raise ValueError(f"recurrent: input {n!r} holds no value")
        a = _data(v)
        if a.ndim < 1:
            raise ShapeMismatch(f"recurrent: input {n!r} must be [seq_len, ...], got a 0-d "
                                f"tensor")
        lens.append(a.shape[0])
    if len(set(lens)) != 1:
        raise ShapeMismatch(f"recurrent: every input must have the same seq_len (dim 0): "
                            f"{dict(zip(names, lens))}")
    return lens[0]


def _recurrent_ref(inputs, initial_states, parameters, *, sub_block, ex_states, states, reverse,
                   is_train, has_states, ctx):
    op, env = ctx.op, ctx.env
    inputs = list(inputs or [])
    initial_states = list(initial_states or [])
    steps = _seq_len(op, inputs)
    if has_states and len(ex_states) != len(states) or \
            has_states and len(initial_states) != len(ex_states):
        raise ProgramError(f"{op._describe()}: ex_states ({len(ex_states)}), states "
                           f"({len(states)}) and initial_states ({len(initial_states)}) must "
                           f"pair up")
    block = ctx.program.block(sub_block)
    in_names, out_names = op.input("inputs"), op.output("outputs")
    saved = {n: env.get(n) for n in op.input_arg_names}
    scopes = ctx.new_step_scopes()
    outs = {n: [None] * steps for n in out_names}
    prev = None
    for k in range(steps):
        t = steps - 1 - k if reverse else k
        step = env.child(block)
        step.saved = saved
        for n, v in zip(in_names, inputs):
            step.values[n] = np.array(_data(v)[t], copy=True)
        if has_states:
            for i, ex in enumerate(ex_states):
                step.values[ex] = initial_states[i] if prev is None else prev.get(states[i])
        ctx.run_block(sub_block, step, k)
        for n in out_names:
            v = step.get(n)
            if v is None:
                raise ValueError(f"recurrent: the step block left no value in output {n!r}")
            outs[n][t] = _data(v)
        if is_train:
            scopes.append(step)
        prev = step
    result = []
    for n in out_names:
        if steps == 0:
            v = block._find_var_recursive(n)
            shape = [0] + [max(int(d), 0) for d in (v.shape if v is not None else ())]
            result.append(np.zeros(shape, v.dtype if v is not None else np.float32))
        else:
            result.append(np.ascontiguousarray(np.stack(outs[n])))
    return {"outputs": result, "step_scopes": scopes}


def _recurrent_grad_maker(op):
    if not op.attr("is_train"):
        raise ProgramError(f"{op._describe()}: built with is_train=False, it keeps no step "
                           f"scopes, so no gradient can flow through it")
    outs = op.output("outputs")
    return [GradOpSpec(
        "recurrent_grad",
        {"inputs": op.input("inputs"), "initial_states": op.input("initial_states"),
         "parameters": op.input("parameters"), "outputs": outs,
         "outputs@GRAD": [grad_var_name(n) for n in outs],
         "step_scopes": op.output("step_scopes")},
        {"inputs@GRAD": [grad_var_name(n) for n in op.input("inputs")],
         "initial_states@GRAD": [grad_var_name(n) for n in op.input("initial_states")],
         "parameters@GRAD": [grad_var_name(n) for n in op.input("parameters")]},
        {k: op.attr(k) for k in ("sub_block", "ex_states", "states", "reverse", "is_train",
                                 "has_states")})]


_ATTRS = {"sub_block": BlockAttr(), "ex_states": Strs([]), "states": Strs([]),
          "reverse": Bool(False), "is_train": Bool(True), "has_states": Bool(False),
          "skip_eager_deletion_vars": Strs([], doc=_SKIP_DOC)}

register_op(
    "recurrent", inputs=["inputs*", "initial_states*?", "parameters*?"],
    outputs=["outputs*", "step_scopes"], attrs=_ATTRS,
    traits=[CONTROL_FLOW], infer_shape=lambda **_: {}, reference=_recurrent_ref, emit=None,
    grad=_recurrent_grad_maker,
    control=ControlFlow(LOOP, body="sub_block", step_scopes="step_scopes",
                        keeps_no_scopes=None, state_links=("ex_states", "states")),
    doc="Fluid's StaticRNN: sub_block once per step of the inputs (dim 0), ex_states linked "
        "to the states of the step before (initial_states at the first), outputs stacked.")


def _recurrent_grad_ref(ctx, **kw):
    op = ctx.op
    a = {k: op.attr(k) for k in ("ex_states", "states", "reverse", "has_states")}
    grad_block = ctx.program.block(op.attr("sub_block"))
    runs = _steps(kw.get("step_scopes"), f"step_scopes {op.input('step_scopes')[0]!r}")
    xs = _by_name(op, "inputs", kw.get("inputs"))
    inits = _by_name(op, "initial_states", kw.get("initial_states"))
    params = _by_name(op, "parameters", kw.get("parameters"))
    ogs = {g: v for g, v in _by_name(op, "outputs@GRAD", kw.get("outputs@GRAD")).items()}
    steps = len(runs)
    x_sinks = dict(zip(op.input("inputs"), op.output("inputs@GRAD")))
    p_sinks = dict(zip(op.input("parameters"), op.output("parameters@GRAD")))
    x_grads = {x: _zeros_like(_data(v)) for x, v in xs.items()}
    p_grads: dict = {}
    ex_grads: list = [None] * len(a["ex_states"])
    for k in reversed(range(steps)):
        t = steps - 1 - k if a["reverse"] else k
        run = runs[k]
        seeds = {g: _data(v)[t] for g, v in ogs.items() if v is not None}
        if a["has_states"]:
            for i, st in enumerate(a["states"]):
                g = ex_grads[i] if k + 1 < steps else None
                seeds[grad_var_name(st)] = g if g is not None else _zeros_like(run.get(st))
        genv = _run_grad_block(ctx, grad_block, run, seeds)
        for x, sink in x_sinks.items():
            if sink == EMPTY_VAR_NAME:
                continue
            g = genv.get(grad_var_name(x))   # the step's gradient, under the inner x@GRAD
            if g is not None:
                x_grads[x][t] = _data(g)
        for p, sink in p_sinks.items():
            if sink != EMPTY_VAR_NAME:
                p_grads[p] = _add(p_grads.get(p), genv.get(sink))
        if a["has_states"]:
            ex_grads = [genv.get(grad_var_name(ex)) for ex in a["ex_states"]]
            ex_grads = [g if g is not None else _zeros_like(run.get(ex))
                        for g, ex in zip(ex_grads, a["ex_states"])]
    out_x = [None if g == EMPTY_VAR_NAME else x_grads[x]
             for x, g in zip(op.input("inputs"), op.output("inputs@GRAD"))]
    out_p = [None if g == EMPTY_VAR_NAME else
             (p_grads.get(p) if p_grads.get(p) is not None else _zeros_like(params.get(p)))
             for p, g in zip(op.input("parameters"), op.output("parameters@GRAD"))]
    out_i = []
    for i, (n, g) in enumerate(zip(op.input("initial_states"),
                                   op.output("initial_states@GRAD"))):
        if g == EMPTY_VAR_NAME:
            out_i.append(None)
        elif steps and a["has_states"] and ex_grads[i] is not None:
            out_i.append(np.array(_data(ex_grads[i]), copy=True))
        else:
            out_i.append(_zeros_like(inits.get(n)))
    return {"inputs@GRAD": out_x, "initial_states@GRAD": out_i, "parameters@GRAD": out_p}


register_op(
    "recurrent_grad",
    inputs=["inputs*", "initial_states*?", "parameters*?", "outputs*", "outputs@GRAD*?",
            "step_scopes"],
    outputs=["inputs@GRAD*?", "initial_states@GRAD*?", "parameters@GRAD*?"], attrs=_ATTRS,
    traits=[CONTROL_FLOW], infer_shape=lambda **_: {}, reference=_recurrent_grad_ref,
    emit=None, grad=None,
    control=ControlFlow(LOOP, body="sub_block", state_links=("ex_states", "states")),
    doc="The gradients of a recurrent op: its grad block once per step, last step first, "
        "state gradients passed from each step to the one before.")
