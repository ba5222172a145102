"""Scalar results as their program declares them: shape ``[1]`` (Fluid 1.x) or ``[]`` (0-d).

Fluid 1.x has no 0-d tensors: ``mean``, a reduction over every dim, ``accuracy``, ``auc`` and
every other scalar result is declared with shape ``[1]``, and its scripts index it
(``loss[0]``, ``exe.run(...)[0][0]``). PaddlePaddle 2.x/3.x declares the same results 0-d. The
ops here compute such results 0-d; what a run gives is what the program declares:

- **Build time** (:func:`declare_fluid1_scalars`): the Fluid 1.x builders (``pdjit.layers``,
  through ``LayerHelper.append_op``) declare a result ``[1]`` where the op makes it 0-d from
  inputs of rank 1 or more. Ops without inputs (``fill_constant(shape=[])``) and ops on 0-d
  inputs keep the shape they infer. A program read from a file keeps its ``VarDesc``s as they
  are, so a Fluid 1.x file says ``[1]`` and a PaddlePaddle 3.x file says ``[]``.
- **Run time** (one rule, every executor path): an output the op computes 0-d whose variable is
  declared ``[1]`` is that one element with shape ``(1,)`` (a view), and one it computes
  ``(1,)`` whose variable is declared ``[]`` is 0-d: a one-element value takes the form its
  variable declares, so what later ops read (and what a run fetches) has the declared rank,
  which compiled code is built for. The reference interpreter applies it to each value it
  stores (:func:`as_declared`); compiled code views the outputs :func:`promoted` names right
  after the op computed them, and runs an op that has an output :func:`demoted` names with
  its reference (a program file's form, rare: Fluid 1.x and PaddlePaddle declare what the op
  computes). Nothing else changes shape.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import registry
from pdjit.framework.errors import PdjitError
from pdjit.framework.variable import _TENSOR_HOLDERS
from pdjit.proto import framework_pb2 as pb

#: the shape Fluid 1.x declares for a scalar result
FLUID1_SCALAR = (1,)
_DENSE = (pb.VarType.LOD_TENSOR,)


def _tensor_outputs(op):
    block = op.block
    for name in op.output_arg_names:
        if name == registry.EMPTY_VAR_NAME:
            continue
        v = block._find_var_recursive(name)
        if v is not None and v.type in _DENSE:
            yield v


def declare_fluid1_scalars(op) -> None:
    """Declare ``[1]`` for each 0-d tensor output of ``op`` (just appended by a Fluid 1.x
    builder) when one of its inputs has rank 1 or more: the shape Fluid 1.x gives."""
    block = op.block
    ranked = False
    for name in op.input_arg_names:
        v = block._find_var_recursive(name) if name != registry.EMPTY_VAR_NAME else None
        if v is not None and v.type in _TENSOR_HOLDERS and len(v.shape) >= 1:
            ranked = True
            break
    if not ranked:
        return
    for v in _tensor_outputs(op):
        if v.shape == () and v.dtype is not None:
            v.shape = FLUID1_SCALAR


def promoted(op) -> frozenset:
    """The outputs of ``op`` declared ``[1]`` that the op computes 0-d (its ``infer_shape`` on
    the declared inputs), which run time views as ``(1,)``; empty for an op that is not
    registered or whose inputs do not fit (running it then says why)."""
    return _computed(op, FLUID1_SCALAR, ())


def demoted(op) -> frozenset:
    """The outputs of ``op`` declared ``[]`` that the op computes ``(1,)`` (its
    ``infer_shape`` on the declared inputs), which run time views as 0-d."""
    return _computed(op, (), FLUID1_SCALAR)


def _computed(op, declared_shape: tuple, computed_shape: tuple) -> frozenset:
    """The tensor outputs of ``op`` declared ``declared_shape`` that its ``infer_shape``
    computes ``computed_shape`` from the declared inputs."""
    candidates = [v.name for v in _tensor_outputs(op) if v.shape == declared_shape]
    if not candidates:
        return frozenset()
    opdef = registry.lookup(op.type)
    if opdef is None:
        return frozenset()
    block = op.block

    def declared(n):
        v = block._find_var_recursive(n)
        return None if v is None else v.meta()

    try:
        result = opdef.infer_op(op, declared)
    except (PdjitError, ValueError, TypeError, IndexError, KeyError):
        return frozenset()
    if not isinstance(result, dict):
        return frozenset()
    found = set()
    for slot in opdef.outputs:
        res = result.get(slot.name)
        if res is None:
            continue
        res = res if isinstance(res, (list, tuple)) else [res]
        for n, meta in zip(op.output(slot.name), res):
            if isinstance(meta, registry.VarMeta) and tuple(meta.shape) == computed_shape:
                found.add(n)
    return frozenset(n for n in candidates if n in found)


def as_declared(value, var):
    """``value`` (an output just computed) as ``var`` declares it: a 0-d array declared
    ``[1]`` viewed as ``(1,)``, a ``(1,)`` array declared ``[]`` viewed as 0-d; anything else
    as it is."""
    if type(value) is np.ndarray and value.ndim <= 1 and var is not None and \
            var.type in _DENSE:
        if value.ndim == 0:
            if var.shape == FLUID1_SCALAR:
                return value.reshape(FLUID1_SCALAR)
        elif value.shape == FLUID1_SCALAR and var.shape == ():
            return value.reshape(())
    return value
