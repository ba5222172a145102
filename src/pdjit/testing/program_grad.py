"""``check_program_grad``: a whole program's gradients against finite differences.

The builder makes the forward program with layers (control flow included) and returns
``(out, [inputs])``: the checked function is ``L = sum(W * out)`` with fixed random weights
``W`` (every output element matters, with a different weight), and each input (a fed variable
or a parameter) gets the gradient the backward pass builds compared, in every executor mode,
with float64 central differences of ``L`` computed by the reference interpreter.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from pdjit.framework.program import Parameter, Program, program_guard
from pdjit.passes.backward import append_backward, gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor

MODES = ("reference", "compiled")
WEIGHTS = "program_grad_w"


def _run(program, feed, fetch, scope_values: Mapping, mode="reference", lods=None):
    scope = Scope()
    for name, value in scope_values.items():
        scope.var(name).value = np.array(value, copy=True)
    feed = {k: LoDTensor(v, lods[k]) if lods and k in lods else v for k, v in feed.items()}
    exe = Executor(mode=mode, cold_runs="compile")
    return exe.run(program, feed=feed, fetch_list=list(fetch), scope=scope)


def check_program_grad(build: Callable, feed: Mapping | None = None, *,
                       method: str = "gradients", modes=MODES, delta: float = 1e-6,
                       rtol: float = 1e-5, atol: float = 1e-7, seed: int = 0) -> dict:
    """Compare the backward pass's gradients of ``build``'s program with finite differences.

    ``build()`` runs under a fresh main and startup program and returns ``(out, inputs)``;
    ``feed`` gives the fed values (floats are used as float64: build the program in float64;
    a LoD tensor keeps its LoD).
    Parameters start from the startup program's values. ``method``: ``"gradients"``
    (``fluid.gradients`` seeded with ``W``) or ``"append_backward"`` (of the loss
    ``reduce_sum(out * W)``; the inputs must then be parameters). Returns ``{input name:
    gradient}`` of the first mode; raises ``AssertionError`` naming the input and mode.
    """
    if method not in ("gradients", "append_backward"):
        raise ValueError(f"check_program_grad: method must be 'gradients' or "
                         f"'append_backward', got {method!r}")
    lods = {k: v.lod() for k, v in (feed or {}).items() if isinstance(v, LoDTensor) and v.lod()}
    feed = {k: (np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
            for k, v in (feed or {}).items()}
    main, startup = Program(), Program()
    with program_guard(main, startup):
        out, inputs = build()
    inputs = list(inputs)
    params = {}
    if startup.global_block().ops:
        scope = Scope()
        Executor(mode="reference").run(startup, scope=scope)
        params = {n: np.asarray(scope.find_var(n).value) for n in scope.local_var_names()
                  if scope.find_var(n).value is not None}
    (value,) = _run(main, feed, [out], params, lods=lods)
    weights = np.random.default_rng(seed).uniform(0.5, 1.5, size=np.shape(value))
    forward = main.clone()  # what the differences run: the program before its backward pass
    with program_guard(main, startup):
        w = main.global_block().create_var(name=WEIGHTS, shape=list(weights.shape),
                                           dtype=out.dtype, stop_gradient=True)
        if method == "gradients":
            grads = gradients([out], inputs, target_gradients=[w])
        else:
            from pdjit.layers import math_ops, shape_ops

            not_params = [v.name for v in inputs if not isinstance(v, Parameter)]
            if not_params:
                raise ValueError(f"check_program_grad: append_backward checks parameters only, "
                                 f"got {not_params}")
            loss = shape_ops.reduce_sum(math_ops.elementwise_mul(out, w))
            found = dict((p.name, g) for p, g in append_backward(loss))
            grads = [found.get(v.name) for v in inputs]
    feed_w = dict(feed, **{WEIGHTS: weights.astype(out.dtype)})

    def objective(values: dict, feeds: dict) -> float:
        (o,) = _run(forward, feeds, [out.name], values, lods=lods)
        return float(np.sum(weights * np.asarray(o, np.float64)))

    want = {}
    for v in inputs:
        base = params if v.name in params else feed
        if v.name not in base:
            raise ValueError(f"check_program_grad: input {v.name!r} is neither fed nor a "
                             f"parameter of the startup program")
        x = np.array(base[v.name], np.float64)
        g = np.zeros_like(x)
        for i in range(x.size):
            vals = {n: a for n, a in params.items()}
            feeds = dict(feed)
            target = vals if v.name in params else feeds
            for sign in (1, -1):
                xp = x.copy()
                xp.reshape(-1)[i] += sign * delta
                target[v.name] = xp.astype(base[v.name].dtype)
                g.reshape(-1)[i] += sign * objective(vals, feeds)
        want[v.name] = g / (2 * delta)
    got = {}
    for mode in modes:
        fetch = [g for g in grads if g is not None]
        results = iter(_run(main, feed_w, fetch, params, mode, lods))
        for v, g in zip(inputs, grads):
            where = f"d(sum(W * {out.name}))/d{v.name} [{mode}]"
            assert g is not None, f"{where}: the backward pass gave no gradient"
            value = np.asarray(next(results))
            np.testing.assert_allclose(value, want[v.name], rtol=rtol, atol=atol, err_msg=where)
            got.setdefault(v.name, value)
    return got
