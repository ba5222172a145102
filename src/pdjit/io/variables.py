"""Fluid's ``save_vars`` / ``load_vars`` / ``save_persistables`` / ``load_persistables``.

Values are written in PaddlePaddle's tensor stream format (``tensor_stream``), LoD included:
with ``filename`` one combined file holding the variables in the order of their sorted names
(as ``save_combine`` gets them from Paddle's ``save_vars``), else one file per variable, named
after it, in ``dirname``. Loading checks each tensor against its ``VarDesc`` (dtype, known
dims) and writes the Scope only after every value was read, so a failed load changes nothing.
"""
from __future__ import annotations

import os

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.program import Program, Variable, default_main_program
from pdjit.io.tensor_stream import _Reader, read_tensor, write_tensor
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime.scope import global_scope
from pdjit.runtime.tensor import LoDTensor

_SKIP = {pb.VarType.FEED_MINIBATCH, pb.VarType.FETCH_LIST, pb.VarType.READER, pb.VarType.RAW}

__all__ = ["save_vars", "load_vars", "save_persistables", "load_persistables",
           "is_persistable"]


def is_persistable(var: Variable) -> bool:
    return bool(var.persistable) and var.type not in _SKIP


def _select(program, vars, predicate) -> list:
    program = program if program is not None else default_main_program()
    if not isinstance(program, Program):
        raise TypeError(f"main_program must be a Program, got {type(program).__name__}")
    if vars is None:
        vars = [v for v in program.list_vars() if predicate is None or predicate(v)]
    out = {}
    for v in vars:
        name = v if isinstance(v, str) else v.name
        out[name] = v
    return [out[n] for n in sorted(out)]


def _scope(scope):
    return scope if scope is not None else global_scope()


def save_vars(executor, dirname, main_program=None, vars=None, predicate=None, filename=None,
              scope=None) -> None:
    """Write the values of ``vars`` (or of the program's variables ``predicate`` accepts)."""
    chosen = _select(main_program, vars, predicate)
    sc = _scope(scope)
    values = {}
    for v in chosen:
        name = v if isinstance(v, str) else v.name
        sv = sc.find_var(name)
        if sv is None or sv.value is None:
            raise ValueError(f"save_vars: variable {name!r} has no value in the scope (run the "
                             f"startup program first)")
        values[name] = sv.value
    os.makedirs(dirname, exist_ok=True)
    if filename is not None:
        with open(os.path.join(dirname, filename), "wb") as f:
            f.write(b"".join(write_tensor(values[n]) for n in sorted(values)))
        return
    for name, value in values.items():
        with open(os.path.join(dirname, name), "wb") as f:
            f.write(write_tensor(value))


def _check_against(var, value, where: str) -> None:
    if isinstance(var, str):
        return
    arr = np.asarray(value)
    if var.dtype is not None and arr.dtype != var.dtype:
        raise ValueError(f"{where}: variable {var.name!r} is {dtypes.dtype_str(var.dtype)} in "
                         f"the program, the file holds {arr.dtype}")
    shape = tuple(var.shape)
    if shape and (len(shape) != arr.ndim or any(d >= 0 and d != a
                                                for d, a in zip(shape, arr.shape))):
        raise ValueError(f"{where}: variable {var.name!r} has shape {list(shape)} in the "
                         f"program, the file holds {list(arr.shape)}")


def load_vars(executor, dirname, main_program=None, vars=None, predicate=None, filename=None,
              scope=None) -> None:
    """Read the values of ``vars`` (or of the program's variables ``predicate`` accepts) into
    the scope; a LoD saved with a value comes back with it."""
    chosen = _select(main_program, vars, predicate)
    names = [v if isinstance(v, str) else v.name for v in chosen]
    loaded = {}
    if filename is not None:
        path = os.path.join(dirname, filename)
        with open(path, "rb") as f:
            reader = _Reader(f.read(), path)
        for n in names:
            loaded[n] = read_tensor(reader, n)
        if reader.pos != len(reader.data):
            raise ValueError(f"{path}: {len(reader.data) - reader.pos} bytes left after the "
                             f"{len(names)} expected tensors: the file does not match the "
                             f"variables {names[:5]}{'...' if len(names) > 5 else ''}")
    else:
        for n in names:
            path = os.path.join(dirname, n)
            if not os.path.exists(path):
                raise FileNotFoundError(f"load_vars: no file for variable {n!r}: {path}")
            with open(path, "rb") as f:
                reader = _Reader(f.read(), path)
            loaded[n] = read_tensor(reader, n)
            if reader.pos != len(reader.data):
                raise ValueError(f"{path}: {len(reader.data) - reader.pos} bytes left after "
                                 f"the tensor")
    for v in chosen:
        n = v if isinstance(v, str) else v.name
        _check_against(v, loaded[n], f"load_vars {os.path.join(dirname, filename or n)}")
    sc = _scope(scope)
    for n, value in loaded.items():
        sc.var(n).value = value if isinstance(value, LoDTensor) else np.ascontiguousarray(value)


def save_persistables(executor, dirname, main_program=None, filename=None, scope=None) -> None:
    """``save_vars`` of every persistable variable (feed/fetch holders excluded)."""
    save_vars(executor, dirname, main_program, predicate=is_persistable, filename=filename,
              scope=scope)


def load_persistables(executor, dirname, main_program=None, filename=None, scope=None) -> None:
    """``load_vars`` of every persistable variable (feed/fetch holders excluded)."""
    load_vars(executor, dirname, main_program, predicate=is_persistable, filename=filename,
              scope=scope)
