"""Shape rules and helpers shared by op definitions (build-time shapes keep ``-1`` unknown)."""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import VarMeta


def broadcast_dim(a: int, b: int, what: str) -> int:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if a == -1:
        return b
    if b == -1:
        return a
    raise ShapeMismatch(what)


def align_for_axis(x_shape, y_shape, axis: int):
    """Fluid's ``axis`` rule: the shapes of X and Y padded with 1s to one rank.

    ``axis == -1``: trailing dims align (NumPy). ``axis >= 0``: the lower-rank operand's dims
    align with the higher-rank one's starting at ``axis``.
    """
    x_shape, y_shape = tuple(x_shape), tuple(y_shape)
    nx, ny = len(x_shape), len(y_shape)
    big, small = max(nx, ny), min(nx, ny)
    if axis == -1 or nx == ny:
        start = big - small
    else:
        start = axis
        if not 0 <= start <= big - small:
            raise ShapeMismatch(f"axis={axis} is out of range for X of shape {list(x_shape)} and "
                                f"Y of shape {list(y_shape)}: expected -1 or 0..{big - small}")
    pad = lambda s: (1,) * start + s + (1,) * (big - small - start)  # noqa: E731
    return (pad(x_shape), y_shape) if nx < ny else (x_shape, pad(y_shape))


def broadcast_shapes(x_shape, y_shape, axis: int = -1) -> tuple:
    xs, ys = align_for_axis(x_shape, y_shape, axis)
    msg = (f"X of shape {list(x_shape)} and Y of shape {list(y_shape)} do not broadcast with "
           f"axis={axis}: expected each aligned pair of dims to be equal or 1")
    return tuple(broadcast_dim(a, b, msg) for a, b in zip(xs, ys))


def aligned_arrays(x: np.ndarray, y: np.ndarray, axis: int):
    """Reshape X and Y (views) so NumPy broadcasting applies Fluid's ``axis`` rule."""
    xs, ys = align_for_axis(x.shape, y.shape, axis)
    broadcast_shapes(x.shape, y.shape, axis)  # raises ShapeMismatch with a clear message
    return x.reshape(xs), y.reshape(ys)


def reduce_to_shape(g: np.ndarray, shape, axis: int, full_shape) -> np.ndarray:
    """Sum a broadcast gradient ``g`` back to an operand of ``shape`` (aligned by ``axis``)."""
    aligned, _ = align_for_axis(shape, full_shape, axis) if len(shape) <= len(full_shape) \
        else (shape, None)
    aligned = tuple(aligned)
    extra = g.ndim - len(aligned)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(aligned, g.shape)) if a == 1 and b != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def src_literal(value) -> str:
    """A number as Python source for generated code (infinities and nan included)."""
    v = float(value)
    if v != v:
        return "math.nan"
    if v in (float("inf"), float("-inf")):
        return "math.inf" if v > 0 else "-math.inf"
    return repr(value) if isinstance(value, (bool, int)) else repr(v)


def int_values(t) -> list:
    """The ints held by a tensor-valued attribute input (a tensor or a list of 1-element ones)."""
    if isinstance(t, (list, tuple)):
        return [int(np.asarray(v).reshape(-1)[0]) for v in t]
    return [int(v) for v in np.asarray(t).reshape(-1)]


def same_as(x: VarMeta, **kw) -> VarMeta:
    return x.with_(**kw)


def check_dtype(meta: VarMeta, allowed, what: str) -> None:
    if meta.dtype not in allowed:
        names = ", ".join(str(np.dtype(d)) for d in allowed)
        raise ShapeMismatch(f"{what}: expected dtype {names}, got {meta.dtype}")


def norm_axis(axis: int, ndim: int, what: str = "axis") -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ShapeMismatch(f"{what}={axis} is out of range for a tensor of rank {ndim}: "
                            f"expected {-max(ndim, 1)}..{max(ndim, 1) - 1}")
    return axis % max(ndim, 1)


def prod_known(dims) -> int:
    """Product of dims, or -1 if any is unknown."""
    p = 1
    for d in dims:
        if d < 0:
            return -1
        p *= d
    return p


FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
INTS = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64),
        np.dtype(np.uint8))
INDEX = (np.dtype(np.int32), np.dtype(np.int64))
NUMERIC = FLOATS + INTS
