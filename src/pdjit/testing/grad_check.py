"""``check_grad``: the gradients pdjit's backward pass builds, against finite differences.

For an op and inputs (computed in float64), the checked function is
``L = sum(W * op(inputs)[output])`` with fixed random weights ``W`` (so every output element
matters with a different weight). The backward pass (``gradients``, seeded with ``W`` as the
output's gradient, so no other op's gradient is involved) builds the gradient program; its
``X@GRAD`` for each checked input is compared, in every executor mode, with central
differences of ``L`` computed by the reference interpreter.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from pdjit.framework import registry
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.op_test import TARGETS, _describe, build_op_program


def numeric_grad(op_type, inputs, attrs, output_name, name, weights, out_index=0,
                 delta=1e-6) -> np.ndarray:
    """Central differences of ``sum(weights * op(...)[output])`` w.r.t. input ``name``."""
    from pdjit.testing.op_test import run_op

    x = np.asarray(inputs[name], dtype=np.float64)
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)

    def f():
        outs = run_op(op_type, dict(inputs, **{name: x}), attrs)[output_name]
        o = outs[out_index] if isinstance(outs, list) else outs
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
               modes=None, seed: int = 0) -> dict:
    """Compare ``append_backward``'s gradients with finite differences; return them.

    Float inputs are converted to float64 (the check needs the precision); integer inputs
    (labels, indices) are left as they are.
    """
    inputs = {k: (np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else v)
              for k, v in inputs.items() if v is not None}
    attrs = dict(attrs or {})
    opdef = registry.get(op_type)
    prog, feed, out_vars = build_op_program(op_type, inputs, attrs)
    block = prog.global_block()
    out = out_vars[output_name][out_index] if opdef.output_slot(output_name).duplicable \
        else out_vars[output_name][0]
    weights = np.random.default_rng(seed).uniform(0.5, 1.5, size=_run_shape(
        op_type, inputs, attrs, output_name, out_index))
    w = block.create_var(name="check_grad_w", shape=list(weights.shape), dtype=out.dtype,
                         need_check_feed=True)
    checked = [block.var(f"{slot.lower()}_0") for slot in inputs_to_check]
    grads = gradients([out], checked, target_gradients=[w])
    feed = dict(feed, check_grad_w=weights.astype(out.dtype))
    got = {}
    for mode in modes or TARGETS:
        results = Executor(mode=mode).run(prog, feed=feed, fetch_list=[g for g in grads if g is not None],
                                          scope=Scope())
        it = iter(results)
        for slot, g in zip(inputs_to_check, grads):
            where = f"{_describe(op_type, inputs, attrs)} d{output_name}/d{slot} [{mode}]"
            assert g is not None, f"{where}: the backward pass gave no gradient"
            value = next(it)
            want = numeric_grad(op_type, inputs, attrs, output_name, slot, weights, out_index,
                                delta)
            np.testing.assert_allclose(value, want, rtol=max_relative_error, atol=atol,
                                       err_msg=where)
            got.setdefault(slot, value)
    return got


def _run_shape(op_type, inputs, attrs, output_name, out_index):
    from pdjit.testing.op_test import run_op

    outs = run_op(op_type, inputs, attrs)[output_name]
    o = outs[out_index] if isinstance(outs, list) else outs
    return np.asarray(o).shape
