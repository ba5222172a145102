"""``check_grad``: the gradients pdjit's backward pass builds, against finite differences.

For an op and inputs (computed in float64), the checked function is
``L = sum(W * op(inputs)[output])`` with fixed random weights ``W`` (so every output element
matters with a different weight). The backward pass (``gradients``, seeded with ``W`` as the
output's gradient, so no other op's gradient is involved) builds the gradient program; its
``X@GRAD`` for each checked input is compared, in every executor mode, with central
differences of ``L`` computed once by the reference interpreter.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from pdjit.framework import registry
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing.op_test import TARGETS, _describe, as_lod_input, build_op_program, lod_of


def _as64(v):
    """Float inputs in float64 (the check needs the precision); others as they are. A LoD input
    (``LoDTensor`` or ``(array, lod)`` pair) keeps its LoD."""
    v = as_lod_input(v)
    if isinstance(v, (list, tuple)):
        return [_as64(x) for x in v]
    a = np.asarray(v)
    a = a.astype(np.float64) if a.dtype.kind == "f" else a
    return LoDTensor(a, v.lod()) if isinstance(v, LoDTensor) and v.lod() else a


def _pick(outs, out_index):
    return outs[out_index] if isinstance(outs, list) else outs


def numeric_grad(op_type, inputs, attrs, output_name, name, weights, out_index=0,
                 delta=1e-6, index=None, outputs=None) -> np.ndarray:
    """Central differences of ``sum(weights * op(...)[output])`` w.r.t. input ``name``
    (element ``index`` of it when the slot holds a list): the op's program built once, each
    run on the input changed in place."""
    from pdjit.testing.op_test import OpRun

    inputs = {k: (list(v) if isinstance(v, list) else v) for k, v in inputs.items()}
    given = inputs[name][index] if index is not None else inputs[name]
    x = np.array(np.asarray(as_lod_input(given)), dtype=np.float64)
    lod = lod_of(given)
    value = LoDTensor(x, lod) if lod else x  # shares x: the perturbations below reach it
    if index is not None:
        inputs[name][index] = value
    else:
        inputs[name] = value
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    run = OpRun(op_type, inputs, attrs, outputs=outputs)
    run()  # (checked once: each run below changes one value)
    # (an op drawing random numbers draws new ones on each run of one executor, the same on
    # each first run: it gets a program and executor of its own each time)
    again = registry.get(op_type).has(registry.RANDOM)

    def f():
        runs = OpRun(op_type, inputs, attrs, outputs=outputs) if again else run
        o = _pick(runs(check=False)[output_name], out_index)
        return float(np.sum(weights * o))

    for i in range(flat.size):
        orig = flat[i]
        flat[i] = orig + delta
        hi = f()
        flat[i] = orig - delta
        lo = f()
        flat[i] = orig
        gflat[i] = (hi - lo) / (2 * delta)
    return grad


def check_grad(op_type: str, inputs: Mapping, attrs: Mapping | None = None,
               inputs_to_check=("X",), output_name: str = "Out", *, out_index: int = 0,
               max_relative_error: float = 1e-5, atol: float = 1e-7, delta: float = 1e-6,
               modes=None, seed: int = 0, outputs: Mapping | None = None) -> dict:
    """Compare the backward pass's gradients with finite differences; return them.

    Float inputs are converted to float64; integer inputs (labels, indices) are left as they
    are. A slot holding a list (``concat``'s X) has each element checked. ``outputs`` sizes
    list outputs (``{"Out": 3}`` for a split into 3).
    """
    inputs = {k: _as64(v) for k, v in inputs.items() if v is not None}
    attrs = dict(attrs or {})
    prog, feed, out_vars = build_op_program(op_type, inputs, attrs, outputs=outputs)
    block = prog.global_block()
    out = out_vars[output_name][out_index]
    from pdjit.testing.op_test import run_op

    shape = np.shape(_pick(run_op(op_type, inputs, attrs, outputs=outputs)[output_name],
                           out_index))
    weights = np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)
    w = block.create_var(name="check_grad_w", shape=list(weights.shape), dtype=out.dtype,
                         need_check_feed=True)
    checked = []  # (slot, element index or None, variable)
    for slot in inputs_to_check:
        if isinstance(inputs[slot], list):
            checked += [(slot, i, block.var(f"{slot.lower()}_{i}"))
                        for i in range(len(inputs[slot]))]
        else:
            checked.append((slot, None, block.var(f"{slot.lower()}_0")))
    grads = gradients([out], [v for _, _, v in checked], target_gradients=[w])
    feed = dict(feed, check_grad_w=weights.astype(out.dtype))
    got = {}
    wants = {}  # (slot, index) -> the finite differences, the same for every mode
    for mode in modes or TARGETS:
        fetch = [g for g in grads if g is not None]
        exe = Executor(mode=mode, cold_runs="compile")
        results = iter(exe.run(prog, feed=feed, fetch_list=fetch, scope=Scope()))
        for (slot, index, _), g in zip(checked, grads):
            label = slot if index is None else f"{slot}[{index}]"
            where = f"{_describe(op_type, inputs, attrs)} d{output_name}/d{label} [{mode}]"
            assert g is not None, f"{where}: the backward pass gave no gradient"
            value = next(results)
            want = wants.get((slot, index))
            if want is None:
                want = wants[slot, index] = numeric_grad(
                    op_type, inputs, attrs, output_name, slot, weights, out_index, delta,
                    index, outputs)
            np.testing.assert_allclose(value, want, rtol=max_relative_error, atol=atol,
                                       err_msg=where)
            got.setdefault(label, value)
    return got
