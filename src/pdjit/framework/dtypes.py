"""Data types: the mapping between ``VarType.Type`` codes, NumPy dtypes and the names users write.

Users name dtypes the Fluid way (``'float32'``, ``'int64'``, ``np.float32``, a ``VarType`` code);
everything inside pdjit uses ``np.dtype``, and the proto stores the ``VarType.Type`` code.
"""
from __future__ import annotations

import numpy as np

from pdjit.proto import framework_pb2 as pb

VarType = pb.VarType

# VarType.Type code -> NumPy dtype, for the POD types that pdjit computes with.
_CODE_TO_NP = {
    VarType.BOOL: np.dtype(np.bool_),
    VarType.INT16: np.dtype(np.int16),
    VarType.INT32: np.dtype(np.int32),
    VarType.INT64: np.dtype(np.int64),
    VarType.FP16: np.dtype(np.float16),
    VarType.FP32: np.dtype(np.float32),
    VarType.FP64: np.dtype(np.float64),
    VarType.UINT8: np.dtype(np.uint8),
    VarType.INT8: np.dtype(np.int8),
    VarType.UINT16: np.dtype(np.uint16),
    VarType.UINT32: np.dtype(np.uint32),
    VarType.UINT64: np.dtype(np.uint64),
    VarType.COMPLEX64: np.dtype(np.complex64),
    VarType.COMPLEX128: np.dtype(np.complex128),
    VarType.SIZE_T: np.dtype(np.uint64),
}
_NP_TO_CODE = {v: k for k, v in _CODE_TO_NP.items() if k != VarType.SIZE_T}

# The names Fluid users write. Fluid reads a dtype name through NumPy (``np.dtype(name)``), so
# ``"int"`` and ``"long"`` are int64 and ``"float"`` float64, as NumPy has them on Linux.
_ALIASES = {
    "float": "float64", "double": "float64", "half": "float16", "fp16": "float16",
    "fp32": "float32", "fp64": "float64", "int": "int64", "long": "int64", "bool": "bool",
}

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def to_numpy(dtype) -> np.dtype:
    """Any dtype spelling (name, NumPy type, ``VarType`` code) -> ``np.dtype``.

    Raises ``TypeError`` naming what it got when the spelling is unknown.
    """
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        try:
            return _CODE_TO_NP[int(dtype)]
        except KeyError:
            raise TypeError(f"VarType code {int(dtype)} ({type_name(int(dtype))}) is not a "
                            f"tensor data type") from None
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype.lower(), dtype.lower())
        if name in ("bfloat16", "bf16"):
            raise TypeError("dtype 'bfloat16' is not supported by pdjit")
        try:
            return np.dtype(name)
        except TypeError:
            raise TypeError(f"unknown dtype {dtype!r}") from None
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unknown dtype {dtype!r}") from None


def to_code(dtype) -> int:
    """Any dtype spelling -> its ``VarType.Type`` code."""
    d = to_numpy(dtype)
    try:
        return _NP_TO_CODE[d]
    except KeyError:
        raise TypeError(f"dtype {d} has no VarType code") from None


def type_name(code: int) -> str:
    """``VarType.Type`` code -> its enum name (``5`` -> ``'FP32'``)."""
    try:
        return VarType.Type.Name(code)
    except ValueError:
        return f"<VarType {code}>"


def is_float(dtype) -> bool:
    return to_numpy(dtype).kind == "f"


def dtype_str(dtype) -> str:
    """The short name used in messages: ``'float32'``."""
    return str(to_numpy(dtype))
