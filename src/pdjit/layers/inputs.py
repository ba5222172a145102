"""``data``: declare a fed input variable (Fluid's ``layers.data`` and the newer ``data``);
``py_reader`` / ``create_py_reader_by_data`` / ``read_file`` / ``double_buffer``: feed such
variables from a Python generator.

A py_reader here is no READER variable with ``create_py_reader``/``read`` ops: it creates (or
takes) the data variables and attaches a non-iterable loader to their program
(``pdjit.runtime.generator_loader``); after ``reader.start()`` each run of that program that
does not feed them takes the next batch, and ``fluid.core.EOFException`` ends a pass. ``read_file``
returns the variables. A clone of the program (``clone(for_test=True)``) reads from the same
readers, as a Fluid clone reads the same reader variable.
"""
from __future__ import annotations

from pdjit.framework import dtypes, unique_name
from pdjit.framework.errors import LayerInputError
from pdjit.framework.operator import _user_callstack, location_from_callstack
from pdjit.framework.program import default_main_program
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime.generator_loader import PyReaderLoader

__all__ = ["data", "py_reader", "create_py_reader_by_data", "read_file", "double_buffer"]


def data(name: str, shape, append_batch_size: bool = True, dtype="float32", lod_level: int = 0,
         type=pb.VarType.LOD_TENSOR, stop_gradient: bool = True):
    """A variable fed at run time, in the global block of the main program.

    As in Fluid 1.x, ``shape`` is per example and a ``-1`` batch dim is put in front, unless
    ``append_batch_size=False`` or ``shape`` already has an unknown (``-1``/``None``) dim.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"data: name must be a non-empty str, got {name!r}")
    shape = list(shape)
    for i, d in enumerate(shape):
        if d is None:
            shape[i], append_batch_size = -1, False
        elif not isinstance(d, int):
            raise TypeError(f"data {name!r}: dims must be ints or None, got {d!r}")
        elif d < 0:
            append_batch_size = False
    if append_batch_size:
        shape = [-1] + shape
    block = default_main_program().global_block()
    where = location_from_callstack(_user_callstack()) or "an unknown line"
    if block.has_var(name):  # Fluid returns the variable when the declarations agree
        old = block.var(name)
        want = (list(shape), dtypes.dtype_str(dtype), int(lod_level), type)
        have = (list(old.shape), dtypes.dtype_str(old.dtype) if old.dtype is not None else None,
                old.lod_level, old.type)
        if want == have:
            return old
        first = getattr(old, "_declared_at", None) or "an earlier declaration (or op output)"

        def show(t):
            return f"{t[1]}{t[0]} lod_level {t[2]}"
        raise LayerInputError(f"data {name!r}: declared at {where} as {show(want)}, but the "
                              f"program already declares it at {first} as {show(have)}: "
                              f"expected the same shape, dtype and lod_level (or another name)")
    var = block.create_var(name=name, shape=shape, dtype=dtype, type=type, lod_level=lod_level,
                           stop_gradient=stop_gradient, need_check_feed=True)
    var._declared_at = where
    return var


def data_v2(name: str, shape, dtype="float32", lod_level: int = 0):
    """The newer ``fluid.data``: ``shape`` is the whole shape (``None``/``-1`` for unknown dims)."""
    return data(name, [(-1 if d is None else d) for d in shape], append_batch_size=False,
                dtype=dtype, lod_level=lod_level)


class _PyReader(PyReaderLoader):
    """What ``py_reader`` returns: a non-iterable loader with ``start``/``reset`` and the
    ``decorate_*`` methods; ``read_file`` gives its variables."""


def py_reader(capacity, shapes, dtypes, lod_levels=None, name=None,
              use_double_buffer: bool = True):
    """A reader of batches with these ``shapes`` (batch dim included, ``-1`` for any size),
    ``dtypes`` and ``lod_levels``, fed by a Python generator; ``read_file(reader)`` gives its
    variables. Call ``decorate_sample_list_generator`` (or ``decorate_batch_generator`` /
    ``decorate_sample_generator``), then ``start()`` before the runs, and ``reset()`` after
    ``fluid.core.EOFException``."""
    shapes, dtypes = list(shapes), list(dtypes)
    if not shapes:
        raise ValueError("py_reader: shapes is empty")
    if len(dtypes) != len(shapes):
        raise ValueError(f"py_reader: {len(shapes)} shapes but {len(dtypes)} dtypes")
    if lod_levels is None:
        lod_levels = [0] * len(shapes)
    lod_levels = list(lod_levels)
    if len(lod_levels) != len(shapes):
        raise ValueError(f"py_reader: {len(shapes)} shapes but {len(lod_levels)} lod_levels")
    base = name or unique_name.generate("py_reader")
    block = default_main_program().global_block()
    feed_list = []
    for i, (shape, dtype, lod_level) in enumerate(zip(shapes, dtypes, lod_levels)):
        try:
            dims = [-1 if d is None else int(d) for d in shape]
        except (TypeError, ValueError):
            raise TypeError(f"py_reader: shapes[{i}] must be a list of ints, got "
                            f"{shape!r}") from None
        var_name = unique_name.generate(f"{base}_data")
        feed_list.append(block.create_var(name=var_name, shape=dims, dtype=dtype,
                                          type=pb.VarType.LOD_TENSOR, lod_level=int(lod_level),
                                          stop_gradient=True, need_check_feed=True))
    return _PyReader(feed_list, capacity, use_double_buffer, iterable=False, name=base,
                     kind="py_reader")


def create_py_reader_by_data(capacity, feed_list, name=None, use_double_buffer: bool = True):
    """A ``py_reader`` feeding existing data variables (``feed_list``); ``read_file`` returns
    them."""
    return _PyReader(list(feed_list), capacity, use_double_buffer, iterable=False,
                     name=name or unique_name.generate("py_reader"), kind="py_reader")


def read_file(reader):
    """The variables a ``py_reader`` feeds (a single Variable when there is one)."""
    if not isinstance(reader, PyReaderLoader):
        raise TypeError(f"read_file: expected a reader from py_reader / "
                        f"create_py_reader_by_data, got {type(reader).__name__}")
    out = list(reader._feed_list)
    return out[0] if len(out) == 1 else out


def double_buffer(reader, place=None, name=None):
    """``reader`` itself: every py_reader already prefetches in a background thread."""
    if not isinstance(reader, PyReaderLoader):
        raise TypeError(f"double_buffer: expected a reader from py_reader / "
                        f"create_py_reader_by_data, got {type(reader).__name__}")
    return reader
