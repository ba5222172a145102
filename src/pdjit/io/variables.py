"""Fluid's ``save_vars`` / ``load_vars`` / ``save_params`` / ``load_params`` /
``save_persistables`` / ``load_persistables``.

Values are written in PaddlePaddle's tensor stream format (``tensor_stream``), LoD included:
with ``filename`` one combined file holding the variables in the order of their sorted names
(as ``save_combine`` gets them from Paddle's ``save_vars``), else one file per variable, named
after it, in ``dirname``. Loading checks each tensor against its ``VarDesc`` (dtype, known
dims) and writes the Scope only after every value was read, so a failed load changes nothing.
"""
from __future__ import annotations

import os
import stat

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ModelFileError, named_errors
from pdjit.framework.program import Parameter, Program, Variable, default_main_program
from pdjit.io.tensor_stream import _FileReader, read_tensor, write_tensor
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime.checks import alloc_limit
from pdjit.runtime.scope import global_scope
from pdjit.runtime.tensor import LoDTensor

_SKIP = {pb.VarType.FEED_MINIBATCH, pb.VarType.FETCH_LIST, pb.VarType.READER, pb.VarType.RAW}

__all__ = ["save_vars", "load_vars", "save_params", "load_params", "save_persistables",
           "load_persistables", "is_persistable", "is_parameter"]


def is_persistable(var: Variable) -> bool:
    return bool(var.persistable) and var.type not in _SKIP


def is_parameter(var: Variable) -> bool:
    """A parameter of the program (a ``Parameter``: weights, biases), not optimizer state."""
    return isinstance(var, Parameter)


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


def check_against(var, value, where: str) -> None:
    """``value`` (read from ``where``) has ``var``'s dtype and known dims, or ModelFileError. A
    variable declared without dims (``[]``: PaddlePaddle's "not recorded") takes the dims of
    the value the file holds, so that a compiled plan is built for the rank it will get."""
    if isinstance(var, str):
        return
    arr = np.asarray(value)
    if var.dtype is not None and arr.dtype != var.dtype:
        raise ModelFileError(f"{where}: variable {var.name!r} is {dtypes.dtype_str(var.dtype)} "
                             f"in the program, the file holds {arr.dtype}")
    shape = tuple(var.shape)
    if shape and (len(shape) != arr.ndim or any(d >= 0 and d != a
                                                for d, a in zip(shape, arr.shape))):
        raise ModelFileError(f"{where}: variable {var.name!r} has shape {list(shape)} in the "
                             f"program, the file holds {list(arr.shape)}")
    if not shape and arr.ndim and getattr(var, "type", None) == pb.VarType.LOD_TENSOR:
        var.shape = arr.shape


_CHUNK = 1 << 24  # bytes read at a time


def open_regular(path: str, what: str):
    """``(file, size)``: ``path`` opened for reading, refused with a :class:`ModelFileError`
    unless it is a regular file (a device such as ``/dev/zero``, a FIFO or a directory never
    ends or is no file) no larger than the allocation limit. Opening never blocks (a FIFO
    without a writer)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ModelFileError(f"{what}: no such file: {path}") from None
    except OSError as e:
        raise ModelFileError(f"{what}: cannot read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else \
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else \
                "a socket or other special file"
            raise ModelFileError(f"{what}: {path} is {kind}, not a regular file")
        limit = alloc_limit()
        if limit is not None and st.st_size > limit:
            raise ModelFileError(f"{what}: {path} holds {st.st_size} bytes, more than the "
                                 f"allocation limit {limit} (PDJIT_MAX_ALLOC_BYTES)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return f, st.st_size


def _read_file(path: str, what: str) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), read in chunks into
    one buffer of the size the file has."""
    f, size = open_regular(path, what)
    with f:
        buf = bytearray(size)
        view, pos = memoryview(buf), 0
        try:
            while pos < size:
                n = f.readinto(view[pos:pos + _CHUNK])
                if not n:
                    break
                pos += n
            extra = f.read(1)
        except OSError as e:
            raise ModelFileError(f"{what}: cannot read {path}: {e.strerror}") from None
        if pos != size or extra:
            raise ModelFileError(f"{what}: {path} changed while it was read")
        view.release()
    return bytes(buf) if size < _CHUNK else buf


def _reader(path: str, what: str):
    """A tensor reader over the regular file ``path``, reading as it goes."""
    f, size = open_regular(path, what)
    return f, _FileReader(f, size, path)


def read_checked(reader, var, path: str):
    name = var if isinstance(var, str) else var.name
    try:
        value = read_tensor(reader, name)
    except ValueError as e:
        raise ModelFileError(str(e)) from None
    check_against(var, value, path)
    return value


def read_values(chosen, dirname, filename=None) -> dict:
    """``{name: value}`` of the variables ``chosen`` (Variables or names), read from the combined
    file ``dirname/filename`` (in that order) or from one file per variable, each checked
    against its ``VarDesc``; any problem is a ModelFileError naming the file and variable."""
    values = {}
    if filename is not None:
        path = os.path.join(dirname, filename)
        f, reader = _reader(path, "parameters")
        with f:
            for v in chosen:
                values[v if isinstance(v, str) else v.name] = read_checked(reader, v, path)
        left = reader.left
        if left:
            names = list(values)
            raise ModelFileError(f"{path}: {left} bytes left after the {len(names)} expected "
                                 f"tensors: the file does not match the variables "
                                 f"{names[:5]}{'...' if len(names) > 5 else ''}")
        return values
    for v in chosen:
        name = v if isinstance(v, str) else v.name
        path = os.path.join(dirname, name)
        f, reader = _reader(path, f"variable {name!r}")
        with f:
            values[name] = read_checked(reader, v, path)
        if reader.left:
            raise ModelFileError(f"{path}: {reader.left} bytes left after the "
                                 f"tensor of {name!r}")
    return values


def commit_values(values: dict, scope) -> None:
    """Write values read by :func:`read_values` into ``scope``."""
    for n, value in values.items():
        # np.asarray keeps a 0-d value 0-d (np.ascontiguousarray would make it 1-d)
        scope.var(n).value = value if isinstance(value, LoDTensor) else \
            np.asarray(value, order="C")


@named_errors("pdjit.io.load_vars")
def load_vars(executor, dirname, main_program=None, vars=None, predicate=None, filename=None,
              scope=None) -> None:
    """Read the values of ``vars`` (or of the program's variables ``predicate`` accepts) into
    the scope, only once every one was read and checked; a LoD saved with a value comes back
    with it."""
    commit_values(read_values(_select(main_program, vars, predicate), dirname, filename),
                  _scope(scope))


def save_persistables(executor, dirname, main_program=None, filename=None, scope=None) -> None:
    """``save_vars`` of every persistable variable (feed/fetch holders excluded)."""
    save_vars(executor, dirname, main_program, predicate=is_persistable, filename=filename,
              scope=scope)


@named_errors("pdjit.io.load_persistables")
def load_persistables(executor, dirname, main_program=None, filename=None, scope=None) -> None:
    """``load_vars`` of every persistable variable (feed/fetch holders excluded)."""
    load_vars(executor, dirname, main_program, predicate=is_persistable, filename=filename,
              scope=scope)


def save_params(executor, dirname, main_program=None, filename=None, scope=None) -> None:
    """``save_vars`` of every parameter (not the optimizer state: see ``save_persistables``)."""
    save_vars(executor, dirname, main_program, predicate=is_parameter, filename=filename,
              scope=scope)


@named_errors("pdjit.io.load_params")
def load_params(executor, dirname, main_program=None, filename=None, scope=None) -> None:
    """``load_vars`` of every parameter, as ``save_params`` wrote them."""
    load_vars(executor, dirname, main_program, predicate=is_parameter, filename=filename,
              scope=scope)
