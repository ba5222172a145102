"""Fluid 1.x layers for reductions, reshaping and indexing.

Each function appends one op (Paddle's legacy type: ``reshape`` emits ``reshape2``, ``squeeze``
``squeeze2``...) to the current block of the default main program and returns its output
Variable(s); shapes are inferred as the op is appended, so a bad shape fails here, naming the op.

Where Fluid 1.8 accepts a Variable for a shape, axis, bound or count (``reshape(x, [v, 4])``,
``concat(xs, axis=v)``, ``topk(x, k=v)``), the op's tensor input slot carries it and the dims it
decides are unknown (``-1``) until run time.

``one_hot`` emits ``one_hot_v2``: the one-hot dim is *appended* (``[N, 1]`` ids give
``[N, 1, depth]``), unlike Fluid 1.x's ``one_hot`` op, which replaced a last dim of 1 (that op
no longer exists in PaddlePaddle 3.x).
"""
from __future__ import annotations

from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_variable

__all__ = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "mean",
           "sums", "reshape", "transpose", "concat", "split", "slice", "squeeze", "unsqueeze",
           "stack", "gather", "one_hot", "argmax", "argmin", "topk", "expand", "where",
           "cumsum", "gather_nd", "scatter", "argsort"]


def _int_tensor(value, layer) -> Variable:
    """A Variable stays; an int becomes a 1-element int32 constant (for ``*TensorList`` slots)."""
    if isinstance(value, Variable):
        return value
    if not isinstance(value, int):
        raise TypeError(f"{layer}: expected an int or a Variable, got {type(value).__name__}")
    from pdjit.layers.tensor import fill_constant  # local: tensor imports layer_helper too
    return fill_constant([1], "int32", value)


def _ints(value, arg, layer) -> list:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{layer}: {arg} must be ints, got {v!r}")
    return [int(v) for v in values]


# ---- reductions ------------------------------------------------------------------------------
def _reduce(op_type, input, dim, keep_dim, name):
    check_variable(input, "input", op_type)
    helper = LayerHelper(op_type, name=name)
    dims = [] if dim is None else _ints(dim, "dim", op_type)
    out = helper.create_variable_for_type_inference(input.dtype)
    # Fluid writes dim=[0] with reduce_all for "everything"; the op treats both alike
    helper.append_op(op_type, inputs={"X": [input]}, outputs={"Out": [out]},
                     attrs={"dim": dims or [0], "keep_dim": bool(keep_dim),
                            "reduce_all": not dims or len(dims) == len(input.shape)})
    return out


def reduce_sum(input, dim=None, keep_dim=False, name=None):
    """The sum of ``input`` over ``dim`` (an int or list; None: every dim, giving shape [1] as
    Fluid 1.x declares a scalar)."""
    return _reduce("reduce_sum", input, dim, keep_dim, name)


def reduce_mean(input, dim=None, keep_dim=False, name=None):
    """The mean of ``input`` over ``dim`` (None: every dim)."""
    return _reduce("reduce_mean", input, dim, keep_dim, name)


def reduce_max(input, dim=None, keep_dim=False, name=None):
    """The maximum of ``input`` over ``dim`` (None: every dim)."""
    return _reduce("reduce_max", input, dim, keep_dim, name)


def reduce_min(input, dim=None, keep_dim=False, name=None):
    """The minimum of ``input`` over ``dim`` (None: every dim)."""
    return _reduce("reduce_min", input, dim, keep_dim, name)


def reduce_prod(input, dim=None, keep_dim=False, name=None):
    """The product of ``input`` over ``dim`` (None: every dim)."""
    return _reduce("reduce_prod", input, dim, keep_dim, name)


def mean(x, name=None):
    """The mean of every element of ``x``: a Variable of shape [1] (Fluid 1.x's scalar)."""
    check_variable(x, "x", "mean")
    helper = LayerHelper("mean", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("mean", inputs={"X": [x]}, outputs={"Out": [out]})
    return out


def sums(input, out=None):
    """The elementwise sum of a list of Variables of one shape (``sum`` op); into ``out``."""
    helper = LayerHelper("sum", input=input)
    xs = helper.multiple_input("input")
    if out is None:
        out = helper.create_variable_for_type_inference(helper.input_dtype("input"))
    helper.append_op("sum", inputs={"X": xs}, outputs={"Out": [out]})
    return out


# ---- reshaping -------------------------------------------------------------------------------
def _with_xshape(op_type, x, inputs, attrs, name, act=None):
    helper = LayerHelper(op_type, name=name, act=act)
    out = helper.create_variable_for_type_inference(x.dtype)
    xshape = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    helper.append_op(op_type, inputs={"X": [x], **inputs}, outputs={"Out": [out],
                                                                   "XShape": [xshape]},
                     attrs=attrs)
    return helper.append_activation(out, act)


def reshape(x, shape, actual_shape=None, act=None, inplace=False, name=None):
    """``x`` with a new ``shape`` (0: keep x's dim, -1: inferred), then ``act``.

    ``shape`` may be a list of ints and Variables, or a 1-D int Variable; ``actual_shape`` (a
    Variable) overrides it at run time. ``inplace`` is accepted for compatibility; a new
    Variable is always returned.
    """
    check_variable(x, "x", "reshape")
    inputs, attrs = {}, {}
    if isinstance(shape, Variable):
        inputs["Shape"] = [shape]
    elif isinstance(shape, (list, tuple)):
        if any(isinstance(s, Variable) for s in shape):
            inputs["ShapeTensor"] = [_int_tensor(s, "reshape") for s in shape]
            attrs["shape"] = [-1 if isinstance(s, Variable) else int(s) for s in shape]
        else:
            attrs["shape"] = _ints(shape, "shape", "reshape")
    else:
        raise TypeError(f"reshape: shape must be a list, tuple or Variable, got "
                        f"{type(shape).__name__}")
    if actual_shape is not None:
        inputs["Shape"] = [check_variable(actual_shape, "actual_shape", "reshape")]
    return _with_xshape("reshape2", x, inputs, attrs, name, act)


def transpose(x, perm, name=None):
    """``x`` with its dims permuted: dim i of the result is dim ``perm[i]`` of ``x``."""
    check_variable(x, "x", "transpose")
    perm = _ints(perm, "perm", "transpose")
    if len(perm) != len(x.shape):
        raise ValueError(f"transpose: perm must have one entry per dim of x: expected "
                         f"{len(x.shape)}, got {len(perm)} ({perm})")
    return _with_xshape("transpose2", x, {}, {"axis": perm}, name)


def squeeze(input, axes, name=None):
    """``input`` without its size-1 dims among ``axes`` (all size-1 dims when empty)."""
    check_variable(input, "input", "squeeze")
    return _with_xshape("squeeze2", input, {}, {"axes": _ints(axes, "axes", "squeeze")}, name)


def unsqueeze(input, axes, name=None):
    """``input`` with size-1 dims inserted at ``axes`` (ints, or a Variable of them)."""
    check_variable(input, "input", "unsqueeze")
    if isinstance(axes, Variable):
        return _with_xshape("unsqueeze2", input, {"AxesTensor": [axes]}, {}, name)
    if isinstance(axes, (list, tuple)) and any(isinstance(a, Variable) for a in axes):
        return _with_xshape("unsqueeze2", input,
                            {"AxesTensorList": [_int_tensor(a, "unsqueeze") for a in axes]}, {},
                            name)
    return _with_xshape("unsqueeze2", input, {}, {"axes": _ints(axes, "axes", "unsqueeze")}, name)


# ---- joining and cutting ---------------------------------------------------------------------
def concat(input, axis=0, name=None):
    """The Variables in ``input`` joined along ``axis`` (an int or an int Variable)."""
    helper = LayerHelper("concat", input=input, name=name)
    xs = helper.multiple_input("input")
    out = helper.create_variable_for_type_inference(helper.input_dtype("input"))
    inputs = {"X": xs}
    attrs = {}
    if isinstance(axis, Variable):
        inputs["AxisTensor"] = [axis]
    else:
        attrs["axis"] = _ints(axis, "axis", "concat")[0]
    helper.append_op("concat", inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
    return out


def stack(x, axis=0):
    """The Variables in ``x`` (one shape) stacked along a new dim at ``axis``."""
    helper = LayerHelper("stack", x=x)
    xs = helper.multiple_input("x")
    out = helper.create_variable_for_type_inference(helper.input_dtype("x"))
    helper.append_op("stack", inputs={"X": xs}, outputs={"Y": [out]},
                     attrs={"axis": _ints(axis, "axis", "stack")[0]})
    return out


def split(input, num_or_sections, dim=-1, name=None):
    """``input`` cut along ``dim`` into ``num_or_sections`` equal parts (an int) or parts of the
    given sizes (a list; one -1 takes the rest). Returns the list of parts."""
    check_variable(input, "input", "split")
    helper = LayerHelper("split", name=name)
    inputs, attrs = {"X": [input]}, {}
    if isinstance(dim, Variable):
        inputs["AxisTensor"] = [dim]
    else:
        attrs["axis"] = _ints(dim, "dim", "split")[0]
    if isinstance(num_or_sections, int) and not isinstance(num_or_sections, bool):
        if num_or_sections < 1:
            raise ValueError(f"split: num_or_sections must be >= 1, got {num_or_sections}")
        n, attrs["num"] = num_or_sections, num_or_sections
    elif isinstance(num_or_sections, (list, tuple)) and num_or_sections:
        n = len(num_or_sections)
        if any(isinstance(s, Variable) for s in num_or_sections):
            inputs["SectionsTensorList"] = [_int_tensor(s, "split") for s in num_or_sections]
        attrs["sections"] = [-1 if isinstance(s, Variable) else int(s) for s in num_or_sections]
    else:
        raise TypeError(f"split: num_or_sections must be an int or a non-empty list, got "
                        f"{num_or_sections!r}")
    outs = [helper.create_variable_for_type_inference(input.dtype) for _ in range(n)]
    helper.append_op("split", inputs=inputs, outputs={"Out": outs}, attrs=attrs)
    return outs


def slice(input, axes, starts, ends):
    """``input[starts[i]:ends[i]]`` along each of ``axes`` (Python-style bounds, clamped).

    ``starts``/``ends`` may be lists of ints and Variables, or 1-D int Variables.
    """
    check_variable(input, "input", "slice")
    helper = LayerHelper("slice")
    axes = _ints(axes, "axes", "slice")
    inputs, attrs = {"Input": [input]}, {"axes": axes}
    flags = [1] * len(axes)
    for key, value in (("starts", starts), ("ends", ends)):
        slot = key.capitalize() + "Tensor"
        if isinstance(value, Variable):
            inputs[slot] = [value]
            flags = [-1] * len(axes)
        elif any(isinstance(v, Variable) for v in value):
            inputs[slot + "List"] = [_int_tensor(v, "slice") for v in value]
            flags = [-1 if isinstance(v, Variable) else f for v, f in zip(value, flags)]
            attrs[key] = [-1 if isinstance(v, Variable) else int(v) for v in value]
        else:
            attrs[key] = _ints(value, key, "slice")
    attrs["infer_flags"] = flags
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("slice", inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
    return out


# ---- indexing --------------------------------------------------------------------------------
def gather(input, index, overwrite=True):
    """The rows of ``input`` at ``index`` (1-D int). ``overwrite`` only matters to the gradient
    of duplicate indices in Fluid; PaddlePaddle 3.x's op has no such attribute."""
    check_variable(input, "input", "gather")
    check_variable(index, "index", "gather")
    helper = LayerHelper("gather")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("gather", inputs={"X": [input], "Index": [index]}, outputs={"Out": [out]})
    return out


def one_hot(input, depth, allow_out_of_range=False):
    """``input``'s int ids one-hot encoded (float32), as Fluid 1.x's ``one_hot``: the trailing
    dim of size 1 of ``input`` ``[..., 1]`` becomes the ``depth`` classes (``[N, 1]`` ids give
    ``[N, depth]``). An input whose last dim is not 1 gets a new last dim of size ``depth``
    (``one_hot_v2``, as ``paddle.nn.functional.one_hot``). Ids outside ``[0, depth)`` are an
    error at run time, or give all-zero rows with ``allow_out_of_range``."""
    check_variable(input, "input", "one_hot")
    if not (len(input.shape) >= 2 and input.shape[-1] == 1):
        return one_hot_v2(input, depth, allow_out_of_range)
    helper = LayerHelper("one_hot")
    inputs, attrs = {"X": [input]}, {"allow_out_of_range": bool(allow_out_of_range),
                                     "dtype": 5}                       # float32
    if isinstance(depth, Variable):
        inputs["depth_tensor"] = [depth]
        attrs["depth"] = -1
    else:
        attrs["depth"] = _ints(depth, "depth", "one_hot")[0]
    out = helper.create_variable_for_type_inference("float32", stop_gradient=True)
    helper.append_op("one_hot", inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
    return out


def one_hot_v2(input, depth, allow_out_of_range=False):
    """``input``'s int ids one-hot encoded (float32) in a new last dim of size ``depth``."""
    check_variable(input, "input", "one_hot")
    helper = LayerHelper("one_hot_v2")
    inputs, attrs = {"X": [input]}, {"allow_out_of_range": bool(allow_out_of_range)}
    if isinstance(depth, Variable):
        inputs["depth_tensor"] = [depth]
    else:
        attrs["depth"] = _ints(depth, "depth", "one_hot")[0]
    out = helper.create_variable_for_type_inference("float32")
    helper.append_op("one_hot_v2", inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
    return out


def _arg(op_type, layer, x, axis):
    check_variable(x, "x", layer)
    helper = LayerHelper(op_type)
    out = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op(op_type, inputs={"X": [x]}, outputs={"Out": [out]},
                     attrs={"axis": _ints(axis, "axis", layer)[0]})
    return out


def argmax(x, axis=0):
    """The int64 index of the largest value of ``x`` along ``axis`` (that dim removed)."""
    return _arg("arg_max", "argmax", x, axis)


def argmin(x, axis=0):
    """The int64 index of the smallest value of ``x`` along ``axis`` (that dim removed)."""
    return _arg("arg_min", "argmin", x, axis)


def topk(input, k, name=None):
    """(values, indices): the ``k`` largest entries of ``input`` along its last dim, descending,
    and their int64 indices. ``k`` may be an int or a 1-element int Variable."""
    check_variable(input, "input", "topk")
    helper = LayerHelper("top_k_v2", name=name)
    inputs, attrs = {"X": [input]}, {}
    if isinstance(k, Variable):
        inputs["K"] = [k]
    else:
        attrs["k"] = _ints(k, "k", "topk")[0]
    values = helper.create_variable_for_type_inference(input.dtype)
    indices = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("top_k_v2", inputs=inputs, outputs={"Out": [values], "Indices": [indices]},
                     attrs=attrs)
    return values, indices


# ---- issue 16: expand, where, cumsum, gather_nd, scatter, argsort (Fluid 1.8 signatures) -------
def expand(x, expand_times, name=None):
    """``x`` tiled ``expand_times[i]`` times along each dim ``i`` (Fluid 1.x's ``expand``: one
    count per dim of ``x``). ``expand_times`` may be a list of ints and Variables, or a 1-D int
    Variable."""
    check_variable(x, "x", "expand")
    helper = LayerHelper("expand", name=name)
    inputs, attrs = {"X": [x]}, {}
    if isinstance(expand_times, Variable):
        inputs["ExpandTimes"] = [expand_times]
    else:
        times = list(expand_times) if isinstance(expand_times, (list, tuple)) else None
        if times is None:
            raise TypeError(f"expand: expand_times must be a list, tuple or Variable, got "
                            f"{type(expand_times).__name__}")
        if any(isinstance(t, Variable) for t in times):
            inputs["expand_times_tensor"] = [_int_tensor(t, "expand") for t in times]
            attrs["expand_times"] = [-1 if isinstance(t, Variable) else int(t) for t in times]
        else:
            attrs["expand_times"] = _ints(times, "expand_times", "expand")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("expand", inputs=inputs, outputs={"Out": [out]}, attrs=attrs)
    return out


def where(condition, x=None, y=None, name=None):
    """Fluid 1.8's ``where(condition)``: the int64 coordinates ``[n, rank]`` of the true
    elements of ``condition`` (``where_index``). With ``x`` and ``y`` (Paddle 2.x's form):
    ``x`` where ``condition`` else ``y`` (``where``), all three of one shape."""
    check_variable(condition, "condition", "where")
    if (x is None) != (y is None):
        raise TypeError("where: expected both x and y, or neither (then the indices of "
                        "condition's true elements)")
    if x is None:
        helper = LayerHelper("where_index", name=name)
        out = helper.create_variable_for_type_inference("int64", stop_gradient=True)
        helper.append_op("where_index", inputs={"Condition": [condition]},
                         outputs={"Out": [out]})
        return out
    check_variable(x, "x", "where")
    check_variable(y, "y", "where")
    helper = LayerHelper("where", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("where", inputs={"Condition": [condition], "X": [x], "Y": [y]},
                     outputs={"Out": [out]})
    return out


def cumsum(x, axis=None, exclusive=None, reverse=None):
    """The running sums of ``x`` along ``axis`` (Fluid 1.8: None is the op's default, -1);
    ``exclusive`` leaves each element out of its own sum; ``reverse`` sums from the end."""
    check_variable(x, "x", "cumsum")
    helper = LayerHelper("cumsum")
    attrs = {}
    for key, value in (("axis", axis), ("exclusive", exclusive), ("reverse", reverse)):
        if value is not None:  # as Fluid 1.8: only the arguments given become attributes
            attrs[key] = _ints(value, key, "cumsum")[0] if key == "axis" else bool(value)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("cumsum", inputs={"X": [x]}, outputs={"Out": [out]}, attrs=attrs)
    return out


def gather_nd(input, index, name=None):
    """``input``'s slices at the coordinates in ``index``'s last dim (``[..., k]``, int)."""
    check_variable(input, "input", "gather_nd")
    check_variable(index, "index", "gather_nd")
    helper = LayerHelper("gather_nd", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("gather_nd", inputs={"X": [input], "Index": [index]},
                     outputs={"Out": [out]})
    return out


def scatter(input, index, updates, name=None, overwrite=True):
    """``input`` with row ``index[m]`` replaced by ``updates[m]`` (``overwrite``), or with the
    indexed rows zeroed and every update added (``overwrite=False``)."""
    for arg, v in (("input", input), ("index", index), ("updates", updates)):
        check_variable(v, arg, "scatter")
    helper = LayerHelper("scatter", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("scatter", inputs={"X": [input], "Ids": [index], "Updates": [updates]},
                     outputs={"Out": [out]}, attrs={"overwrite": bool(overwrite)})
    return out


def argsort(input, axis=-1, descending=False, name=None):
    """(sorted ``input`` along ``axis``, the int64 indices they came from); a stable sort."""
    check_variable(input, "input", "argsort")
    helper = LayerHelper("argsort", name=name)
    out = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    ids = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("argsort", inputs={"X": [input]}, outputs={"Out": [out], "Indices": [ids]},
                     attrs={"axis": _ints(axis, "axis", "argsort")[0],
                            "descending": bool(descending)})
    return out, ids
