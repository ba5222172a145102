"""OpTest-style checks: run one op through pdjit and compare with an expected result.

``check_output(op_type, inputs, attrs, expected)`` builds a one-op program, runs it with every
executor mode in :data:`TARGETS`, and checks that

- the outputs equal ``expected`` (computed independently by the caller, e.g. NumPy written in
  the test) within tolerances chosen per dtype;
- the op's ``infer_shape`` agrees with what ran: same dtype, same rank, every known dim equal.

With ``batch_unknown=True`` the inputs are declared with ``-1`` leading dims, as Fluid's data
layers are, so the op is also checked with sizes unknown at build time; a collection of slot
names (``{"X"}``) makes only those slots' leading dims unknown (weights keep theirs).

Failures raise ``AssertionError`` with a reproducer: op, attrs, input shapes and dtypes.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from pdjit.framework import registry
from pdjit.framework.program import Program
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor

#: Executor modes every op is checked in; compiled targets join this list as they land.
TARGETS = ["reference", "compiled"]

_TOL = {np.dtype(np.float16): (1e-3, 1e-3), np.dtype(np.float32): (1e-5, 1e-6),
        np.dtype(np.float64): (1e-10, 1e-12)}


def tolerance(dtype) -> tuple:
    """(rtol, atol) for comparing results of ``dtype``; exact for integers and bools."""
    return _TOL.get(np.dtype(dtype), (0.0, 0.0))


def _describe(op_type, inputs, attrs) -> str:
    def d(v):
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(d(x) for x in v) + "]"
        a = np.asarray(v)
        return f"{a.dtype}{list(a.shape)}"
    ins = ", ".join(f"{k}={d(v)}" for k, v in inputs.items())
    return f"{op_type}({ins}, attrs={dict(attrs or {})})"


def build_op_program(op_type: str, inputs: Mapping, attrs: Mapping | None = None,
                     batch_unknown: bool = False, outputs: Mapping | None = None):
    """A program holding one op fed by data variables; returns (program, feed, out_vars)."""
    opdef = registry.get(op_type)
    prog = Program()
    block = prog.global_block()
    feed, in_vars = {}, {}
    for slot in opdef.inputs:
        if slot.name not in inputs or inputs[slot.name] is None:
            continue
        values = inputs[slot.name]
        values = list(values) if slot.duplicable else [values]
        vs = []
        for i, value in enumerate(values):
            lod = value.lod() if isinstance(value, LoDTensor) else None
            arr = np.asarray(value)
            shape = list(arr.shape)
            if shape and (batch_unknown is True or (batch_unknown and slot.name in batch_unknown)):
                shape[0] = -1
            name = f"{slot.name.lower()}_{i}"
            v = block.create_var(name=name, shape=shape, dtype=arr.dtype,
                                 lod_level=len(lod) if lod else 0, need_check_feed=True)
            feed[name] = value
            vs.append(v)
        in_vars[slot.name] = vs
    out_vars = {}
    for slot in opdef.outputs:
        n = (outputs or {}).get(slot.name, 1 if not slot.dispensable else 0)
        if slot.name in (outputs or {}) or not slot.dispensable:
            out_vars[slot.name] = [block.create_var(name=f"out_{slot.name.lower()}_{i}")
                                   for i in range(max(n, 1) if slot.duplicable else 1)]
    block.append_op(op_type, inputs=in_vars, outputs=out_vars, attrs=dict(attrs or {}))
    return prog, feed, out_vars


def run_op(op_type: str, inputs: Mapping, attrs: Mapping | None = None, mode: str = "reference",
           batch_unknown: bool = False, outputs: Mapping | None = None) -> dict:
    """Run one op; returns ``{slot: array or [arrays]}`` and checks infer_shape on the way."""
    prog, feed, out_vars = build_op_program(op_type, inputs, attrs, batch_unknown, outputs)
    opdef = registry.get(op_type)
    fetch = [v for vs in out_vars.values() for v in vs]
    exe = Executor(mode=mode)
    results = exe.run(prog, feed=feed, fetch_list=fetch, scope=Scope())
    _check_native(exe, op_type, inputs, attrs)
    got, it = {}, iter(results)
    for slot in opdef.outputs:
        if slot.name not in out_vars:
            continue
        arrays = [next(it) for _ in out_vars[slot.name]]
        for v, a in zip(out_vars[slot.name], arrays):
            _check_meta(op_type, inputs, attrs, v, a)
        got[slot.name] = arrays if slot.duplicable else arrays[0]
    return got


def _check_native(exe, op_type, inputs, attrs) -> None:
    """Compiled mode must really run native code: a native step that gave up (its code did not
    compile) or fell back to the references on valid inputs is a lowering bug."""
    for _, plan in exe._plans.values():
        for step in plan.steps:
            bad = getattr(step, "retired", None) or (getattr(step, "fallbacks", 0) and
                                                     "native code fell back at run time")
            assert not bad, f"{_describe(op_type, inputs, attrs)}: {bad}"


def _check_meta(op_type, inputs, attrs, var, arr) -> None:
    arr = np.asarray(arr)
    where = f"{_describe(op_type, inputs, attrs)} output {var.name}"
    assert var.dtype == arr.dtype, f"{where}: infer_shape says dtype {var.dtype}, ran {arr.dtype}"
    shape = var.shape
    assert len(shape) == arr.ndim, (f"{where}: infer_shape says shape {list(shape)}, ran "
                                    f"{list(arr.shape)}")
    for d, a in zip(shape, arr.shape):
        assert d == -1 or d == a, f"{where}: infer_shape says shape {list(shape)}, ran " \
                                  f"{list(arr.shape)}"


def assert_close(got, want, where: str = "", rtol=None, atol=None) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{where}: shape {list(got.shape)}, expected " \
                                    f"{list(want.shape)}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, expected {want.dtype}"
    r, a = tolerance(want.dtype)
    r = r if rtol is None else rtol
    a = a if atol is None else atol
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=r, atol=a, equal_nan=True, err_msg=where)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


def check_output(op_type: str, inputs: Mapping, attrs: Mapping | None = None,
                 expected: Mapping | None = None, *, rtol=None, atol=None,
                 batch_unknown: bool = False, outputs: Mapping | None = None,
                 modes=None) -> dict:
    """Run ``op_type`` in every mode and compare with ``expected`` ({slot: array(s)}).

    Slots absent from ``expected`` are not compared (but still shape-checked). Returns the
    outputs of the first mode.
    """
    first = None
    for mode in modes or TARGETS:
        for unknown in ((False, batch_unknown) if batch_unknown else (False,)):
            got = run_op(op_type, inputs, attrs, mode, unknown, outputs)
            where = f"{_describe(op_type, inputs, attrs)} [{mode}" \
                    f"{', -1 batch dims' if unknown else ''}]"
            for slot, want in (expected or {}).items():
                if isinstance(want, (list, tuple)):
                    for i, (g, w) in enumerate(zip(got[slot], want)):
                        assert_close(g, w, f"{where} output {slot}[{i}]", rtol, atol)
                else:
                    assert_close(got[slot], want, f"{where} output {slot}", rtol, atol)
            first = first or got
    return first
