"""The Paddle 2.0-preview tensor functions that Fluid 1.8 also documents under
``fluid.layers``: ``addcmul``, ``addmm``, ``allclose``, ``arange``, ``bmm``, ``clamp``,
``cross``, ``dist``, ``dot``, ``elementwise_equal``, ``flip``, ``full``, ``full_like``,
``index_select``, ``index_sample``, ``kron``, ``log1p``, ``logsumexp``, ``masked_select``,
``meshgrid``, ``nonzero``, ``randn``, ``randperm``, ``roll``, ``t``, ``trace``, ``tril``,
``triu`` and ``diag_embed``, with Fluid 1.8's signatures.

``bmm``, ``index_select``, ``masked_select`` and ``log1p`` append the ops of those names; the
others are composed of existing layers (native, differentiable where the values are). Layers
that rearrange by sizes (``kron``, ``meshgrid``, ``roll``, ``trace``, ``tril``, ``triu``,
``diag_embed``) need them known when the program is built.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.program import Variable
from pdjit.layers import math_ops, misc, shape_ops, tensor
from pdjit.layers.layer_helper import LayerHelper, check_variable
from pdjit.layers.manip import _fluid_op

__all__ = ["addcmul", "addmm", "allclose", "arange", "bmm", "clamp", "cross", "dist", "dot",
           "elementwise_equal", "flip", "full", "full_like", "index_select", "index_sample",
           "kron", "log1p", "logsumexp", "masked_select", "meshgrid", "nonzero", "randn",
           "randperm", "roll", "t", "trace", "tril", "triu", "diag_embed"]


def _op(op_type, inputs, attrs=None, out_slot="Out", dtype=None, name=None):
    helper = LayerHelper(op_type, name=name)
    first = next(iter(inputs.values()))[0]
    out = helper.create_variable_for_type_inference(dtype or first.dtype)
    helper.append_op(op_type, inputs=inputs, outputs={out_slot: [out]}, attrs=dict(attrs or {}))
    return out


def _const_like(value, x) -> Variable:
    return tensor.fill_constant([1], x.dtype, value)


def addcmul(input, tensor1, tensor2, value=1.0, out=None, name=None) -> Variable:
    """``input + value * tensor1 * tensor2`` (broadcast)."""
    for arg, v in (("input", input), ("tensor1", tensor1), ("tensor2", tensor2)):
        check_variable(v, arg, "addcmul")
    prod = math_ops.elementwise_mul(tensor1, tensor2)
    return math_ops.elementwise_add(input, math_ops.scale(prod, scale=float(value)))


def addmm(input, x, y, alpha=1.0, beta=1.0, name=None) -> Variable:
    """``beta * input + alpha * (x @ y)``."""

    for arg, v in (("input", input), ("x", x), ("y", y)):
        check_variable(v, arg, "addmm")
    if len(x.shape) != 2 or len(y.shape) != 2:
        raise ValueError(f"addmm: expected 2-D x and y, got {list(x.shape)} and "
                         f"{list(y.shape)}")
    return _fluid_op("addmm", {"Input": input, "X": x, "Y": y},
                     {"Alpha": float(alpha), "Beta": float(beta)}, x.dtype, name)


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False, name=None) -> Variable:
    """Whether ``|input - other| <= atol + rtol * |other|`` everywhere: a bool ``[1]``."""
    check_variable(input, "input", "allclose")
    check_variable(other, "other", "allclose")
    if equal_nan:
        raise ValueError("allclose: equal_nan=True is not supported")
    diff = math_ops.abs(math_ops.elementwise_sub(input, other))
    bound = math_ops.scale(math_ops.abs(other), scale=float(rtol), bias=float(atol))
    from pdjit.layers.manip import reduce_all

    ok = reduce_all(math_ops.less_equal(diff, bound))
    return shape_ops.reshape(ok, [1])


def arange(start, end, step=1, dtype=None, name=None) -> Variable:
    """``start, start + step, ...`` below ``end`` (``dtype`` default int64 for ints, else
    float32)."""
    if dtype is None:
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step))
        dtype = "int64" if ints else "float32"
    return tensor.range(start, end, step, dtype)


def bmm(x, y, name=None) -> Variable:
    """Batched matrix product ``[B, N, K] @ [B, K, M]``."""
    check_variable(x, "x", "bmm")
    check_variable(y, "y", "bmm")
    return _op("bmm", {"X": [x], "Y": [y]}, name=name)


def clamp(input, min=None, max=None, output=None, name=None) -> Variable:  # noqa: A002
    """``input`` limited to ``[min, max]`` (an absent bound: none)."""
    check_variable(input, "input", "clamp")
    lo = -3.4e38 if min is None else float(min)
    hi = 3.4e38 if max is None else float(max)
    return math_ops.clip(input, lo, hi)


def cross(input, other, dim=None) -> Variable:
    """The cross product of 3-vectors along ``dim`` (default: the first axis of size 3)."""
    check_variable(input, "input", "cross")
    check_variable(other, "other", "cross")
    r = len(input.shape)
    d = next((i for i, s in enumerate(input.shape) if s == 3), None) if dim is None else dim % r
    if d is None or input.shape[d] != 3:
        raise ValueError(f"cross: expected an axis of size 3 (dim={dim}), got shape "
                         f"{list(input.shape)}")

    return _fluid_op("cross", {"X": input, "Y": other}, {"dim": 9 if dim is None else d},
                     input.dtype)


def dist(x, y, p=2) -> Variable:
    """The ``p``-norm of ``x - y`` (``p`` 0: the count of non-zeros; inf / -inf: the largest /
    smallest absolute difference): ``[1]``."""
    check_variable(x, "x", "dist")
    check_variable(y, "y", "dist")
    return _fluid_op("dist", {"X": x, "Y": y}, {"p": float(p)}, x.dtype)


def dot(x, y, name=None) -> Variable:
    """The inner product along the last axis: ``[1]`` for 1-D, ``[N, 1]`` for 2-D inputs."""
    check_variable(x, "x", "dot")
    check_variable(y, "y", "dot")
    return shape_ops.reduce_sum(math_ops.elementwise_mul(x, y), dim=-1, keep_dim=True)


def elementwise_equal(x, y, name=None) -> Variable:
    """``x == y`` elementwise (bool)."""
    return math_ops.equal(x, y)


def flip(input, dims, name=None) -> Variable:
    """``input`` reversed along each axis of ``dims`` (Fluid's ``flip`` op)."""
    check_variable(input, "input", "flip")
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not dims:
        raise TypeError(f"flip: argument 'dims' must be a non-empty list of ints, got {dims!r}")
    return _fluid_op("flip", {"X": input}, {"dims": [int(d) for d in dims]}, input.dtype, name)


def full(shape, fill_value, out=None, dtype=None, device=None, stop_gradient=True,
         name=None) -> Variable:
    """A tensor of ``shape`` filled with ``fill_value`` (``dtype`` default float32)."""
    v = tensor.fill_constant(list(shape), dtype or "float32", fill_value, out=out)
    v.stop_gradient = bool(stop_gradient)
    return v


def full_like(input, fill_value, out=None, dtype=None, device=None, stop_gradient=True,
              name=None) -> Variable:
    """A tensor of ``input``'s shape filled with ``fill_value``."""
    check_variable(input, "input", "full_like")
    base = tensor.zeros_like(input)
    if dtype is not None and str(np.dtype(dtype)) != str(np.dtype(input.dtype)):
        base = tensor.cast(base, dtype)
    v = math_ops.elementwise_add(base, tensor.fill_constant([1], base.dtype, fill_value))
    v.stop_gradient = bool(stop_gradient)
    return v


def index_select(input, index, dim=0) -> Variable:
    """The slices of ``input`` along ``dim`` at ``index`` (1-D ints)."""
    check_variable(input, "input", "index_select")
    check_variable(index, "index", "index_select")
    return _op("index_select", {"X": [input], "Index": [index]}, {"dim": int(dim)})


def index_sample(x, index) -> Variable:
    """``out[i, j] = x[i, index[i, j]]`` (``x [N, C]``, ``index [N, K]`` ints)."""
    check_variable(x, "x", "index_sample")
    check_variable(index, "index", "index_sample")
    if len(x.shape) != 2 or len(index.shape) != 2 or x.shape[1] < 0:
        raise ValueError(f"index_sample: expected x [N, C] with C known and index [N, K], got "
                         f"{list(x.shape)} and {list(index.shape)}")
    return _fluid_op("index_sample", {"X": x, "Index": index}, {}, x.dtype)


def kron(x, y, out=None, name=None) -> Variable:
    """The Kronecker product of ``x`` and ``y`` (one rank, sizes known)."""
    check_variable(x, "x", "kron")
    check_variable(y, "y", "kron")
    r = len(x.shape)
    if len(y.shape) != r:
        raise ValueError(f"kron: expected x and y of one rank, got {list(x.shape)} and "
                         f"{list(y.shape)}")
    return _fluid_op("kron", {"X": x, "Y": y}, {}, x.dtype, name)


def log1p(x, out=None, name=None) -> Variable:
    """``ln(1 + x)`` elementwise."""
    check_variable(x, "x", "log1p")
    return _op("log1p", {"X": [x]}, name=name)


def logsumexp(x, dim=None, keepdim=False, out=None, name=None) -> Variable:
    """``log(sum(exp(x)))`` over ``dim`` (all axes when None), computed stably."""
    check_variable(x, "x", "logsumexp")
    m = shape_ops.reduce_max(x, dim=dim, keep_dim=True)
    m.stop_gradient = True
    s = shape_ops.reduce_sum(math_ops.exp(math_ops.elementwise_sub(x, m)), dim=dim,
                             keep_dim=True)
    res = math_ops.elementwise_add(math_ops.log(s), m)
    if keepdim:
        return res
    axes = list(range(len(x.shape))) if dim is None else \
        [d % len(x.shape) for d in ([dim] if isinstance(dim, int) else dim)]
    if len(axes) == len(x.shape):
        return shape_ops.reshape(res, [1])
    return shape_ops.squeeze(res, axes)


def masked_select(input, mask) -> Variable:
    """The elements of ``input`` where ``mask`` (bool, same shape) is true, as a 1-D tensor."""
    check_variable(input, "input", "masked_select")
    check_variable(mask, "mask", "masked_select")
    return _op("masked_select", {"X": [input], "Mask": [mask]}, out_slot="Y")


def meshgrid(input, name=None) -> list:
    """For 1-D tensors of sizes ``n_1 ... n_k``: ``k`` tensors of shape ``[n_1, ..., n_k]``,
    the ``i``-th varying along axis ``i``."""
    xs = list(input)
    for i, v in enumerate(xs):
        check_variable(v, f"input[{i}]", "meshgrid")
        if len(v.shape) != 1 or v.shape[0] < 0:
            raise ValueError(f"meshgrid: input[{i}] must be 1-D of known size, got "
                             f"{list(v.shape)}")
    helper = LayerHelper("meshgrid", name=name)
    out = [helper.create_variable_for_type_inference(v.dtype) for v in xs]
    helper.append_op("meshgrid", inputs={"X": xs}, outputs={"Out": out})
    return out


def nonzero(input, as_tuple=False):
    """The int64 coordinates ``[n, rank]`` of the non-zero elements of ``input`` (with
    ``as_tuple``, one ``[n, 1]`` tensor per axis)."""
    check_variable(input, "input", "nonzero")
    cond = input if str(np.dtype(input.dtype)) == "bool" else \
        math_ops.not_equal(input, tensor.zeros_like(input))
    idx = shape_ops.where(cond)
    if not as_tuple:
        return idx
    r = len(input.shape)
    return [shape_ops.slice(idx, [1], [i], [i + 1]) for i in range(r)] if r > 1 else [idx]


def randn(shape, out=None, dtype=None, device=None, stop_gradient=True, name=None) -> Variable:
    """Standard normal draws of ``shape``."""
    v = misc.gaussian_random(list(shape), 0.0, 1.0, dtype=dtype or "float32")
    v.stop_gradient = bool(stop_gradient)
    return v


def randperm(n, out=None, dtype="int64", device=None, stop_gradient=True, seed=0) -> Variable:
    """A random permutation of ``0 .. n - 1``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"randperm: argument 'n' must be an int >= 1, got {n!r}")
    from pdjit.framework import dtypes

    v = _fluid_op("randperm", {}, {"n": n, "dtype": dtypes.to_code(dtype), "seed": int(seed)},
                  dtype)
    v.stop_gradient = True
    return v


def roll(input, shifts, dims=None) -> Variable:
    """``input`` shifted circularly by ``shifts`` along ``dims`` (the flattened tensor when
    ``dims`` is None)."""
    check_variable(input, "input", "roll")
    shifts = [shifts] if isinstance(shifts, int) else [int(s) for s in shifts]
    dims = [] if dims is None else [dims] if isinstance(dims, int) else [int(d) for d in dims]
    if (dims and len(dims) != len(shifts)) or (not dims and len(shifts) != 1):
        raise ValueError(f"roll: expected one shift per dim (one shift without dims), got "
                         f"shifts {shifts} and dims {dims}")
    for d in dims:
        if not -len(input.shape) <= d < len(input.shape):
            raise ValueError(f"roll: dim {d} is out of range for shape {list(input.shape)}")
    return _fluid_op("roll", {"X": input}, {"shifts": shifts, "dims": dims}, input.dtype)


def t(input, name=None) -> Variable:
    """The transpose of a matrix (a 0-D or 1-D input as it is)."""
    check_variable(input, "input", "t")
    if len(input.shape) > 2:
        raise ValueError(f"t: expected at most 2 dimensions, got {list(input.shape)}")
    return shape_ops.transpose(input, [1, 0]) if len(input.shape) == 2 else input


def tril(input, diagonal=0, name=None) -> Variable:
    """``input`` with the elements above its ``diagonal``-th diagonal set to 0."""
    return _tril_triu(input, diagonal, True, name, "tril")


def triu(input, diagonal=0, name=None) -> Variable:
    """``input`` with the elements below its ``diagonal``-th diagonal set to 0."""
    return _tril_triu(input, diagonal, False, name, "triu")


def _tril_triu(x, diagonal, lower, name, layer) -> Variable:
    check_variable(x, "input", layer)
    if len(x.shape) < 2:
        raise ValueError(f"{layer}: input must have rank >= 2, got shape {list(x.shape)}")
    if isinstance(diagonal, bool) or not isinstance(diagonal, int):
        raise TypeError(f"{layer}: argument 'diagonal' must be an int, got {diagonal!r}")
    return _fluid_op("tril_triu", {"X": x}, {"diagonal": diagonal, "lower": lower}, x.dtype,
                     name, layer=layer)


def trace(input, offset=0, dim1=0, dim2=1, name=None) -> Variable:
    """The sum of the ``offset``-th diagonal of the planes ``(dim1, dim2)`` of ``input``."""
    check_variable(input, "input", "trace")
    r = len(input.shape)
    if r < 2:
        raise ValueError(f"trace: input must have rank >= 2, got shape {list(input.shape)}")
    d1, d2 = dim1 % r, dim2 % r
    if d1 == d2:
        raise ValueError(f"trace: dim1 and dim2 must differ, got {dim1} and {dim2}")
    return _fluid_op("trace", {"Input": input}, {"offset": int(offset), "dim1": int(dim1),
                                                 "dim2": int(dim2)}, input.dtype, name)


def diag_embed(input, offset=0, dim1=-2, dim2=-1) -> Variable:
    """Matrices with ``input``'s last axis on their ``offset``-th diagonal, in the planes
    ``(dim1, dim2)`` of the output (Fluid's ``diag_embed`` op)."""
    check_variable(input, "input", "diag_embed")
    r = len(input.shape) + 1
    for arg, d in (("dim1", dim1), ("dim2", dim2)):
        if isinstance(d, bool) or not isinstance(d, int) or not -r <= d < r:
            raise ValueError(f"diag_embed: argument {arg!r} must be an int in [{-r}, {r}), got "
                             f"{d!r}")
    if dim1 % r == dim2 % r:
        raise ValueError(f"diag_embed: dim1 and dim2 must differ, got {dim1} and {dim2}")
    helper = LayerHelper("diag_embed")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("diag_embed", inputs={"Input": [input]}, outputs={"Out": [out]},
                     attrs={"offset": int(offset), "dim1": int(dim1), "dim2": int(dim2)})
    return out
