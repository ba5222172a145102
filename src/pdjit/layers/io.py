"""``data``: declare a fed input variable (Fluid's ``layers.data`` and the newer ``data``)."""
from __future__ import annotations

from pdjit.framework.program import default_main_program
from pdjit.proto import framework_pb2 as pb

__all__ = ["data"]


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
    if block.has_var(name):
        raise ValueError(f"data: a variable named {name!r} already exists in the program")
    return block.create_var(name=name, shape=shape, dtype=dtype, type=type, lod_level=lod_level,
                            stop_gradient=stop_gradient, need_check_feed=True)


def data_v2(name: str, shape, dtype="float32", lod_level: int = 0):
    """The newer ``fluid.data``: ``shape`` is the whole shape (``None``/``-1`` for unknown dims)."""
    return data(name, [(-1 if d is None else d) for d in shape], append_batch_size=False,
                dtype=dtype, lod_level=lod_level)
