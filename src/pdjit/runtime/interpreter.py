"""The reference interpreter: an op run with its NumPy reference (``OpDef.reference``).

It is the executor's ``reference`` mode (the debugging mode and the oracle the compiled mode is
tested against), the step of a compiled plan for an op without a lowering, and what a native
step falls back to. Inputs are read from the run's ``Env`` (a missing value is an error naming
the op and the variable), LoD tensors arrive as arrays with their LoDs in the ``RunContext``,
outputs get their LoD from the op's ``out_lod`` rule or the first input carrying one.

The executor's run-time checks (``pdjit.runtime.checks``) apply here: before the reference runs,
input shapes the op's ``infer_shape`` refuses are an ``OpRunError`` saying why (the error a
compiled plan's native step gives for them), and an output whose size (from ``infer_shape`` and
the input shapes) exceeds the allocation limit is refused; with NaN/Inf checking on, each
floating-point output is checked before it reaches the env.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import OpRunError, PdjitError, UnregisteredOpError
from pdjit.framework.scalars import as_declared
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime import checks
from pdjit.runtime.context import Env, RunContext
from pdjit.runtime.lod_flow import first_lod, output_lod, rule_lods
from pdjit.runtime.tensor import LoDTensor, check_offsets

VarType = pb.VarType


def run_op(runner, op, op_idx: int, env: Env, run_index: int) -> None:
    """Run ``op`` (index ``op_idx`` of its block) with its NumPy reference on the values in
    ``env``, and store its outputs there, with their LoD; errors name the op."""
    opdef = registry.lookup(op.type)
    if opdef is None:
        raise UnregisteredOpError(f"{op._describe()}: op type {op.type!r} is not registered "
                                  f"in pdjit, so the program cannot run")
    ctx = RunContext(runner, env, op, op_idx, run_index)
    raw = opdef.has(registry.FEED_FETCH) or opdef.has(registry.CONTROL_FLOW)
    inputs = {}
    for slot in opdef.inputs:
        names = [n for n in op.input(slot.name) if n != registry.EMPTY_VAR_NAME]
        values = []
        for n in names:
            value = env.get(n)
            if value is None:
                var = op.block._find_var_recursive(n)
                if var is not None and var.type == VarType.LOD_TENSOR_ARRAY:
                    value = []  # a tensor array nothing has written to yet is empty
                elif opdef.has(registry.CONTROL_FLOW):
                    values.append(None)  # control flow decides what a missing value means
                    continue
                else:
                    raise _op_error(op, op_idx, f"input {slot.name!r} reads variable {n!r}, "
                                    f"which holds no value (run the startup program, or "
                                    f"feed it)")
            if not raw:  # in_lods[slot][i]: the LoD of the slot's i-th value ([]: none)
                slot_lods = ctx.in_lods.setdefault(slot.name, [])
                slot_lods.append(value.lod() if isinstance(value, LoDTensor) else [])
                if isinstance(value, LoDTensor):
                    value = np.asarray(value)
            values.append(value)
        inputs[slot.name] = values if slot.duplicable else (values[0] if values else None)
    attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
    settings = getattr(runner, "checks", checks.OFF)
    if not raw:  # shapes the op refuses (as a native step would), outputs over the limit
        misfit = checks.check_op(op, op_idx, inputs, settings.limit)
        if misfit is not None:
            raise _op_error(op, op_idx, misfit)
    try:
        with np.errstate(all="ignore"):
            result = opdef.call_reference(inputs, attrs, ctx)
    except PdjitError as e:
        if isinstance(e, OpRunError):
            raise
        raise _op_error(op, op_idx, str(e)) from e
    except (ValueError, IndexError, KeyError, TypeError, ArithmeticError, MemoryError) as e:
        raise _op_error(op, op_idx, f"{type(e).__name__}: {e}") from e
    _store_outputs(op, op_idx, opdef, result, ctx, env, raw, settings.nan_inf and not raw)


def _store_outputs(op, op_idx, opdef, result, ctx, env, raw, nan_inf=False) -> None:
    block = op.block
    first, rule = None, {}
    if not raw:
        in_lods = [(s.name, s.duplicable, ctx.in_lods.get(s.name, [])) for s in opdef.inputs
                   if any(n != registry.EMPTY_VAR_NAME for n in op.input(s.name))]
        first = first_lod(in_lods)
        try:
            rule = rule_lods(opdef, op.all_attrs(), in_lods)
        except registry.ValueDependentLoD:
            pass  # the reference set those LoDs itself (ctx.set_output_lod)
        except (ValueError, IndexError, KeyError, TypeError) as e:
            raise _op_error(op, op_idx, str(e)) from e
    for slot in opdef.outputs:
        names = op.output(slot.name)  # may hold @EMPTY@ placeholders: matched by position
        if not any(n != registry.EMPTY_VAR_NAME for n in names):
            continue
        if slot.name not in result:
            if slot.dispensable or slot.intermediate:
                continue
            raise _op_error(op, op_idx, f"internal: the reference gave no output "
                            f"{slot.name!r}")
        values = result[slot.name]
        values = list(values) if slot.duplicable else [values]
        if len(values) != len(names):
            raise _op_error(op, op_idx, f"internal: output {slot.name!r} binds {len(names)} "
                            f"variables, the reference gave {len(values)} values")
        for i, (n, value) in enumerate(zip(names, values)):
            if n == registry.EMPTY_VAR_NAME or (raw and value is None):
                continue  # (a control-flow op's None: that output is left untouched)
            if nan_inf:
                checks.check_output(op, op_idx, slot.name, n, value)
            if not raw and isinstance(value, np.generic):
                value = np.asarray(value)  # a NumPy scalar (arithmetic on 0-d arrays): 0-d
            if not raw and isinstance(value, np.ndarray):
                var = block._find_var_recursive(n)
                value = as_declared(value, var)  # a 0-d result declared [1] (Fluid 1.x)
                lod = ctx.out_lods.get(slot.name, {}).get(i)
                if lod is None:
                    lod, _ = output_lod(slot.name, slot.duplicable, i, rule, first,
                                        var is not None and bool(var.lod_level),
                                        value.shape[0] if value.ndim else -1)
                if lod:
                    try:
                        value = LoDTensor._wrap(value, check_offsets(
                            lod, value.shape[0] if value.ndim else 1, "its LoD"))
                    except ValueError as e:
                        raise _op_error(op, op_idx, f"output {slot.name!r}: {e}") from e
            env.set(n, value)


def _op_error(op, op_idx, reason) -> OpRunError:
    return OpRunError(reason, op.type, op.block.idx, op_idx, op.location())

