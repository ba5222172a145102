"""Reading and writing ``OpDesc.Attr`` messages as Python values.

An attribute's proto type decides which field holds it. Values come back as plain Python
objects: ints, floats, bools, strings, lists of those, block indices for ``BLOCK``/``BLOCKS``.
"""
from __future__ import annotations

import numpy as np

from pdjit.proto import framework_pb2 as pb

A = pb.AttrType

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def attr_type_name(t: int) -> str:
    return pb.AttrType.Name(t)


def read(attr: pb.OpDesc.Attr):
    """The Python value of an attribute message."""
    t = attr.type
    if t == A.INT:
        return attr.i
    if t == A.FLOAT:
        return attr.f
    if t == A.STRING:
        return attr.s
    if t == A.INTS:
        return list(attr.ints)
    if t == A.FLOATS:
        return list(attr.floats)
    if t == A.STRINGS:
        return list(attr.strings)
    if t == A.BOOLEAN:
        return attr.b
    if t == A.BOOLEANS:
        return list(attr.bools)
    if t == A.BLOCK:
        return attr.block_idx
    if t == A.LONG:
        return attr.l
    if t == A.BLOCKS:
        return list(attr.blocks_idx)
    if t == A.LONGS:
        return list(attr.longs)
    if t == A.FLOAT64S:
        return list(attr.float64s)
    if t == A.VAR:
        return attr.var_name
    if t == A.VARS:
        return list(attr.vars_name)
    if t == A.FLOAT64:
        return attr.float64
    if t == A.SCALAR:
        return _read_scalar(attr.scalar)
    if t == A.SCALARS:
        return [_read_scalar(s) for s in attr.scalars]
    raise ValueError(f"attribute {attr.name!r} has unknown type {t}")


def _read_scalar(s: pb.Scalar):
    if s.type == pb.Scalar.BOOLEAN:
        return s.b
    if s.type == pb.Scalar.LONG:
        return s.i
    if s.type == pb.Scalar.FLOAT64:
        return s.r
    return complex(s.c.r, s.c.i)


def infer_type(value) -> int:
    """The attribute type a Python value is stored as when no op definition declares one."""
    from pdjit.framework.block import Block  # local: block imports this module

    if isinstance(value, (bool, np.bool_)):
        return A.BOOLEAN
    if isinstance(value, (int, np.integer)):
        return A.INT if INT32_MIN <= int(value) <= INT32_MAX else A.LONG
    if isinstance(value, (float, np.floating)):
        return A.FLOAT
    if isinstance(value, str):
        return A.STRING
    if isinstance(value, Block):
        return A.BLOCK
    if isinstance(value, (list, tuple)):
        if not value:
            return A.INTS
        first = value[0]
        if isinstance(first, Block):
            return A.BLOCKS
        if isinstance(first, (bool, np.bool_)):
            return A.BOOLEANS
        if isinstance(first, (int, np.integer)):
            big = any(not INT32_MIN <= int(v) <= INT32_MAX for v in value)
            return A.LONGS if big else A.INTS
        if isinstance(first, (float, np.floating)):
            return A.FLOATS
        if isinstance(first, str):
            return A.STRINGS
    raise TypeError(f"cannot store a value of type {type(value).__name__} as an attribute")


def write(attr: pb.OpDesc.Attr, name: str, t: int, value) -> None:
    """Fill ``attr`` with ``value`` stored as type ``t``; raise ``TypeError`` if it does not fit."""
    from pdjit.framework.block import Block

    attr.Clear()
    attr.name = name
    attr.type = t
    try:
        if t == A.INT:
            v = _as_int(value)
            if not INT32_MIN <= v <= INT32_MAX:
                raise TypeError(f"{v} does not fit in INT (int32)")
            attr.i = v
        elif t == A.LONG:
            attr.l = _as_int(value)
        elif t == A.FLOAT:
            attr.f = _as_float(value)
        elif t == A.FLOAT64:
            attr.float64 = _as_float(value)
        elif t == A.STRING:
            attr.s = _as_str(value)
        elif t == A.BOOLEAN:
            attr.b = _as_bool(value)
        elif t == A.INTS:
            attr.ints.extend(_as_int(v) for v in _as_list(value))
        elif t == A.LONGS:
            attr.longs.extend(_as_int(v) for v in _as_list(value))
        elif t == A.FLOATS:
            attr.floats.extend(_as_float(v) for v in _as_list(value))
        elif t == A.FLOAT64S:
            attr.float64s.extend(_as_float(v) for v in _as_list(value))
        elif t == A.STRINGS:
            attr.strings.extend(_as_str(v) for v in _as_list(value))
        elif t == A.BOOLEANS:
            attr.bools.extend(_as_bool(v) for v in _as_list(value))
        elif t == A.BLOCK:
            attr.block_idx = value.idx if isinstance(value, Block) else _as_int(value)
        elif t == A.BLOCKS:
            attr.blocks_idx.extend(v.idx if isinstance(v, Block) else _as_int(v)
                                   for v in _as_list(value))
        elif t == A.VAR:
            attr.var_name = value if isinstance(value, str) else value.name
        elif t == A.VARS:
            attr.vars_name.extend(v if isinstance(v, str) else v.name for v in _as_list(value))
        elif t == A.SCALAR:
            _write_scalar(attr.scalar, value)
        elif t == A.SCALARS:
            for v in _as_list(value):
                _write_scalar(attr.scalars.add(), v)
        else:
            raise TypeError(f"unknown attribute type {t}")
    except (TypeError, ValueError) as e:
        raise TypeError(f"attribute {name!r}: expected {attr_type_name(t)}, got "
                        f"{value!r} ({e})") from None


def _write_scalar(s: pb.Scalar, v) -> None:
    if isinstance(v, (bool, np.bool_)):
        s.type, s.b = pb.Scalar.BOOLEAN, bool(v)
    elif isinstance(v, (int, np.integer)):
        s.type, s.i = pb.Scalar.LONG, int(v)
    elif isinstance(v, (float, np.floating)):
        s.type, s.r = pb.Scalar.FLOAT64, float(v)
    elif isinstance(v, complex):
        s.type = pb.Scalar.COMPLEX128
        s.c.r, s.c.i = v.real, v.imag
    else:
        raise TypeError(f"not a scalar: {v!r}")


def _as_list(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if not isinstance(v, (list, tuple)):
        raise TypeError("expected a list")
    return v


def _as_int(v) -> int:
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    raise TypeError("expected an integer")


def _as_float(v) -> float:
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, str):
        return float(v)
    raise TypeError("expected a number")


def _as_bool(v) -> bool:
    if isinstance(v, (bool, np.bool_, int, np.integer)):
        return bool(v)
    raise TypeError("expected a bool")


def _as_str(v) -> str:
    if isinstance(v, str):
        return v
    raise TypeError("expected a string")
