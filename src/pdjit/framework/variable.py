"""Variable and Parameter: views of a block's ``VarDesc`` messages.

A Variable owns its ``VarDesc`` (the block's ``BlockDesc`` is assembled from them when the
program's desc is asked for); its shape, dtype, LoD level and flags read and write that message
and bump the program's version.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from google.protobuf import text_format

from pdjit.framework import dtypes, registry
from pdjit.framework.errors import (
    ProgramError,
)
from pdjit.proto import framework_pb2 as pb

if TYPE_CHECKING:
    from pdjit.framework.block import Block
    from pdjit.framework.operator import Operator
    from pdjit.framework.program import Program

VarType = pb.VarType
# Variable types whose VarType carries a TensorDesc, and where it lives.
_TENSOR_HOLDERS = {VarType.LOD_TENSOR: "lod_tensor", VarType.LOD_TENSOR_ARRAY: "tensor_array",
                   VarType.SELECTED_ROWS: "selected_rows"}


def _tensor_desc(vt: pb.VarType, create: bool = False):
    holder = _TENSOR_HOLDERS.get(vt.type)
    if holder is None:
        return None
    if holder == "selected_rows":
        return vt.selected_rows if (create or vt.HasField("selected_rows")) else None
    sub = getattr(vt, holder)
    return sub.tensor if (create or sub.HasField("tensor")) else None




class Variable:
    """A named value of a block: a view of its ``VarDesc``.

    ``op`` is the op that produced it (``None`` for feeds, parameters and loaded programs
    until looked up). Arithmetic operators append ops (installed by ``pdjit.layers``).
    """

    def __init__(self, block: "Block", desc: pb.VarDesc):
        self.block = block
        self.desc = desc
        self.op: Operator | None = None

    # -- identity ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.desc.name

    @property
    def program(self) -> "Program":
        return self.block.program

    # -- type, dtype, shape --------------------------------------------------------------------
    @property
    def type(self) -> int:
        return self.desc.type.type

    @property
    def dtype(self) -> np.dtype | None:
        td = _tensor_desc(self.desc.type)
        return dtypes.to_numpy(td.data_type) if td is not None else None

    @dtype.setter
    def dtype(self, value) -> None:
        _tensor_desc(self.desc.type, create=True).data_type = dtypes.to_code(value)
        self._changed()

    @property
    def shape(self) -> tuple:
        td = _tensor_desc(self.desc.type)
        return tuple(td.dims) if td is not None else ()

    @shape.setter
    def shape(self, value) -> None:
        td = _tensor_desc(self.desc.type, create=True)
        del td.dims[:]
        td.dims.extend(int(d) for d in value)
        self._changed()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def lod_level(self) -> int:
        vt = self.desc.type
        if vt.type == VarType.LOD_TENSOR:
            return vt.lod_tensor.lod_level
        if vt.type == VarType.LOD_TENSOR_ARRAY:
            return vt.tensor_array.lod_level
        return 0

    @lod_level.setter
    def lod_level(self, value: int) -> None:
        vt = self.desc.type
        if vt.type == VarType.LOD_TENSOR:
            vt.lod_tensor.lod_level = int(value)
        elif vt.type == VarType.LOD_TENSOR_ARRAY:
            vt.tensor_array.lod_level = int(value)
        elif value:
            raise ProgramError(f"variable {self.name!r} of type "
                               f"{dtypes.type_name(vt.type)} has no lod_level")
        self._changed()

    # -- flags ---------------------------------------------------------------------------------
    def _flag(name):  # noqa: N805 - property factory
        def get(self):
            return getattr(self.desc, name)

        def set_(self, value):
            setattr(self.desc, name, bool(value))
            self._changed()
        return property(get, set_)

    persistable = _flag("persistable")
    stop_gradient = _flag("stop_gradient")
    is_parameter = _flag("is_parameter")
    need_check_feed = _flag("need_check_feed")
    del _flag

    def meta(self) -> registry.VarMeta:
        """What infer_shape sees of this variable."""
        return registry.VarMeta(self.shape, self.dtype if self.dtype is not None else np.float32,
                                self.lod_level, self.type, self.name)

    def _changed(self) -> None:
        self.block.program._bump()

    def to_string(self, throw_on_error: bool = False, with_details: bool = False) -> str:
        text = text_format.MessageToString(self.desc)
        if with_details:
            text += "".join(f"{k}: {getattr(self, k)!r}\n" for k in self._detail_fields())
        return text

    def _detail_fields(self):
        return ("stop_gradient",)

    def __repr__(self) -> str:
        dt = dtypes.dtype_str(self.dtype) if self.dtype is not None else "-"
        kind = dtypes.type_name(self.type)
        extra = ", persistable" if self.persistable else ""
        lod = f", lod_level={self.lod_level}" if self.lod_level else ""
        return f"var {self.name} : {kind}.shape{list(self.shape)}.dtype({dt}){lod}{extra}"

    __str__ = __repr__

    # Variables hash by identity; ``==`` appends an ``equal`` op (see pdjit.layers.math_ops).
    __hash__ = object.__hash__


class Parameter(Variable):
    """A persistable, trainable variable of the global block (weights, biases)."""

    def __init__(self, block, desc, trainable=True, optimize_attr=None, regularizer=None,
                 gradient_clip_attr=None, do_model_average=None, initializer=None):
        super().__init__(block, desc)
        self.trainable = trainable
        self.optimize_attr = optimize_attr if optimize_attr is not None else {"learning_rate": 1.0}
        self.regularizer = regularizer
        self.gradient_clip_attr = gradient_clip_attr
        self.do_model_average = do_model_average
        self.initializer = initializer

    def _detail_fields(self):
        return ("stop_gradient", "trainable", "optimize_attr", "regularizer")

