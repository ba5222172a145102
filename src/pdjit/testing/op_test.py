"""OpTest-style checks: run one op through pdjit and compare with an expected result.

``check_output(op_type, inputs, attrs, expected)`` builds a one-op program, runs it with every
executor mode in :data:`TARGETS`, and checks that

- the outputs equal ``expected`` (computed independently by the caller, e.g. NumPy written in
  the test) within tolerances chosen per dtype;
- the op's ``infer_shape`` agrees with what ran: same dtype, same rank, every known dim equal.

With ``batch_unknown=True`` the inputs are declared with ``-1`` leading dims, as Fluid's data
layers are, so the op is also checked with sizes unknown at build time; a collection of slot
names (``{"X"}``) makes only those slots' leading dims unknown (weights keep theirs).

LoD: an input may be a :class:`LoDTensor` or an ``(array, lod)`` pair (``lod`` a list of offset
lists); it is declared with its ``lod_level`` and fed with its LoD. An expected output given as a
``LoDTensor`` or ``(array, lod)`` pair has its LoD compared too (``(array, [])``: no LoD);
``run_op(..., return_lod=True)`` returns outputs that carry a LoD as ``LoDTensor``.

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
#: the ``cuda`` target (``CUDAPlace(0)``, compiled): opt in with ``modes=[..., CUDA]``, as it
#: needs ``numba.cuda`` (a GPU or the simulator, ``pdjit.codegen.cuda.device.available()``) and
#: not every op has a cuda lowering; there every op must run in native device code
CUDA = "cuda"

_TOL = {np.dtype(np.float16): (1e-3, 1e-3), np.dtype(np.float32): (1e-5, 1e-6),
        np.dtype(np.float64): (1e-10, 1e-12)}


def tolerance(dtype) -> tuple:
    """(rtol, atol) for comparing results of ``dtype``; exact for integers and bools."""
    return _TOL.get(np.dtype(dtype), (0.0, 0.0))


def as_lod_input(value):
    """An ``(array, lod)`` pair as a :class:`LoDTensor`; any other value as it is."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], list) \
            and not isinstance(value[0], (list, tuple)):
        return LoDTensor(np.asarray(value[0]), value[1])
    return value


def lod_of(value) -> list:
    """The LoD of a value (``[]`` for a plain array)."""
    value = as_lod_input(value)
    return value.lod() if isinstance(value, LoDTensor) else []


def _describe(op_type, inputs, attrs) -> str:
    def d(v):
        v = as_lod_input(v)
        if isinstance(v, LoDTensor) and v.lod():
            a = np.asarray(v)
            return f"{a.dtype}{list(a.shape)} lod={v.lod()}"
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
            value = as_lod_input(value)
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
           batch_unknown: bool = False, outputs: Mapping | None = None,
           return_lod: bool = False) -> dict:
    """Run one op; returns ``{slot: array or [arrays]}`` and checks infer_shape on the way.

    With ``return_lod`` an output that carries a LoD comes back as a ``LoDTensor``."""
    return OpRun(op_type, inputs, attrs, mode, batch_unknown, outputs)(return_lod)


class OpRun:
    """One op's program and executor (:func:`run_op`), built once: each call runs the op on
    the values its inputs' arrays hold at the time (finite differences change them in place)
    and checks, unless told not to, that native code ran and infer_shape said what ran. Each
    call is a further run of one executor: an op drawing random numbers without a fixed seed
    draws new ones each time (a fresh ``OpRun``'s first call draws what :func:`run_op` does)."""

    def __init__(self, op_type: str, inputs: Mapping, attrs: Mapping | None = None,
                 mode: str = "reference", batch_unknown: bool = False,
                 outputs: Mapping | None = None):
        self.op_type, self.inputs, self.attrs, self.mode = op_type, inputs, attrs, mode
        self.prog, self.feed, self.out_vars = build_op_program(op_type, inputs, attrs,
                                                               batch_unknown, outputs)
        self.fetch = [v for vs in self.out_vars.values() for v in vs]
        if mode == CUDA:
            from pdjit.runtime.place import CUDAPlace

            self.exe = Executor(CUDAPlace(0), mode="compiled", strict=True)
        else:
            self.exe = Executor(mode=mode, cold_runs="compile")

    def __call__(self, return_lod: bool = False, check: bool = True) -> dict:
        results = self.exe.run(self.prog, feed=self.feed, fetch_list=self.fetch, scope=Scope(),
                               return_numpy=False)
        results = [np.asarray(r) if isinstance(r, LoDTensor) and not (return_lod and r.lod())
                   else r for r in results]
        if check:
            if self.mode == CUDA:  # the op itself ran on the device
                assert_native(self.exe, _describe(self.op_type, self.inputs, self.attrs) +
                              " [cuda]")
            _check_native(self.exe, self.op_type, self.inputs, self.attrs)
        got, it = {}, iter(results)
        for slot in registry.get(self.op_type).outputs:
            if slot.name not in self.out_vars:
                continue
            arrays = [next(it) for _ in self.out_vars[slot.name]]
            if check:
                for v, a in zip(self.out_vars[slot.name], arrays):
                    _check_meta(self.op_type, self.inputs, self.attrs, v, a)
            got[slot.name] = arrays if slot.duplicable else arrays[0]
        return got


def _check_native(exe, op_type, inputs, attrs) -> None:
    """Compiled mode must really run native code: a native step that gave up (its code did not
    compile) or fell back to the references on valid inputs is a lowering bug."""
    assert_native(exe, _describe(op_type, inputs, attrs), require=False)


def assert_native(exe, where: str = "", require: bool = True) -> int:
    """Assert that every native step ``exe`` ran (in every plan and sub-plan) ran natively:
    none gave up its code or fell back to the references. With ``require``, at least one
    native step must exist (a program of reference steps only would otherwise pass any
    compiled-vs-reference comparison). Returns the number of native steps."""
    native = 0
    for _, plan in exe._plans.values():
        for step in plan.walk():
            if not step.kind.startswith("native"):
                continue
            native += 1
            bad = step.retired or (step.fallbacks and
                                   f"native code fell back at run time: {step.describe()}")
            assert not bad, f"{where}: {bad}" if where else bad
    assert native or not require, f"{where}: no step of the plan ran native code"
    return native


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
            got = run_op(op_type, inputs, attrs, mode, unknown, outputs, return_lod=True)
            where = f"{_describe(op_type, inputs, attrs)} [{mode}" \
                    f"{', -1 batch dims' if unknown else ''}]"
            for slot, want in (expected or {}).items():
                if isinstance(want, list) or (isinstance(want, tuple)
                                              and as_lod_input(want) is want):
                    assert len(got[slot]) == len(want), f"{where} output {slot}: " \
                        f"{len(got[slot])} values, expected {len(want)}"
                    for i, (g, w) in enumerate(zip(got[slot], want)):
                        _assert_close_lod(g, w, f"{where} output {slot}[{i}]", rtol, atol)
                else:
                    _assert_close_lod(got[slot], want, f"{where} output {slot}", rtol, atol)
            first = first or {k: [np.asarray(x) for x in v] if isinstance(v, list)
                              else np.asarray(v) for k, v in got.items()}
    return first


def _assert_close_lod(got, want, where, rtol, atol) -> None:
    """Data within tolerance; the LoD too when ``want`` gives one (a LoDTensor or a pair)."""
    want = as_lod_input(want)
    if isinstance(want, LoDTensor):
        assert lod_of(got) == want.lod(), f"{where}: LoD {lod_of(got)}, expected {want.lod()}"
    assert_close(np.asarray(got), np.asarray(want), where, rtol, atol)
