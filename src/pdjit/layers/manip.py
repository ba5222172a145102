"""Fluid 1.8's remaining tensor-manipulation and channel-rearranging layers.

``reverse`` appends Fluid's ``reverse`` op and ``sum`` its ``sum`` op. The others are composed
of existing layers (so they run natively and have gradients), computing what Fluid 1.8's op of
the same name computes: ``unstack`` (split + squeeze), ``expand_as`` (tiling by the static
ratio of the shapes), ``rank``, ``size``, ``crop`` / ``crop_tensor`` (a slice),
``pad_constant_like`` (a pad), ``eye``, ``diag``, ``reduce_all`` / ``reduce_any`` (min / max of
the ints), ``multiplex`` (one-hot weighted sum), ``maxout``, ``pixel_shuffle``, ``space_to_depth``,
``shuffle_channel`` (reshape + transpose), ``lrn`` (a sum of shifted squares) and
``temporal_shift`` (pads and slices over the time axis), ``image_resize_short``, ``fsp_matrix``,
``bilinear_tensor_product`` (matmuls), ``shard_index`` (integer arithmetic and ``where``), and
``get_tensor_from_selected_rows`` / ``merge_selected_rows`` (copies: pdjit keeps sparse values
dense), ``clip_by_norm``, ``randint``, ``scatter_nd`` (into zeros) and ``affine_grid`` (a matmul
with the constant base grid); ``interpolate`` is ``image_resize``, ``lod_append`` a
``lod_reset`` with ``append``. ``unique`` / ``unique_with_counts``, ``scatter_nd_add``,
``strided_slice``, ``mean_iou``, ``sampling_id``, ``grid_sampler``, ``unfold``, ``roi_pool``,
``roi_align``, ``psroi_pool``, ``continuous_value_model`` (``cvm``), ``random_crop`` and
``iou_similarity`` append Fluid's ops; ``inplace_abn`` is ``batch_norm`` and its activation;
``py_func`` calls the user's Python function (``pdjit.ops.py_func``); ``spectral_norm``,
``box_coder``, ``prior_box``, ``multiclass_nms``, ``box_clip``, ``yolo_box``,
``anchor_generator``, ``polygon_box_transform`` and ``density_prior_box`` append Fluid's ops
(``detection_output`` composes some).
Composed layers need the sizes they rearrange to be known when the program is built, and say
so otherwise.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.program import Variable
from pdjit.layers import image, math_ops, shape_ops, tensor
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["reverse", "sum", "unstack", "expand_as", "rank", "size", "crop", "crop_tensor",
           "pad_constant_like", "eye", "diag", "reduce_all", "reduce_any", "multiplex",
           "maxout", "pixel_shuffle", "shuffle_channel", "lrn", "temporal_shift", "unique",
           "unique_with_counts", "image_resize_short", "fsp_matrix", "bilinear_tensor_product",
           "get_tensor_from_selected_rows", "merge_selected_rows", "shard_index", "interpolate",
           "clip_by_norm", "lod_append", "randint", "scatter_nd_add", "scatter_nd",
           "strided_slice", "mean_iou", "sampling_id", "affine_grid", "grid_sampler",
           "unfold", "roi_pool", "roi_align", "continuous_value_model", "random_crop",
           "iou_similarity", "space_to_depth", "psroi_pool", "inplace_abn",
           "py_func", "spectral_norm", "box_coder", "prior_box",
           "multiclass_nms", "detection_output", "box_clip",
           "yolo_box", "anchor_generator", "polygon_box_transform",
           "density_prior_box", "hash", "similarity_focus", "bipartite_match",
           "target_assign"]


def _axes_list(axis, layer: str) -> list:
    axes = [axis] if isinstance(axis, int) and not isinstance(axis, bool) else axis
    if not isinstance(axes, (list, tuple)) or not axes or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in axes):
        raise TypeError(f"{layer}: argument 'axis' must be an int or a non-empty list of ints, "
                        f"got {axis!r}")
    return [int(a) for a in axes]


def _known(x, dims, layer: str, what: str) -> None:
    if any(x.shape[d] < 0 for d in dims):
        raise ValueError(f"{layer}: {what} of x must be known when the program is built, got "
                         f"shape {list(x.shape)}")


def reverse(x, axis) -> Variable:
    """``x`` with its elements in reverse order along ``axis`` (an int or a list)."""
    check_variable(x, "x", "reverse")
    axes = _axes_list(axis, "reverse")
    helper = LayerHelper("reverse")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("reverse", inputs={"X": [x]}, outputs={"Out": [out]}, attrs={"axis": axes})
    return out


def sum(x) -> Variable:  # noqa: A001 - Fluid's name
    """The elementwise sum of a Variable or a list of Variables (Fluid's ``sum`` op)."""
    xs = [x] if isinstance(x, Variable) else list(x)
    if not xs:
        raise ValueError("sum: argument 'x' must be a Variable or a non-empty list of them")
    for i, v in enumerate(xs):
        check_variable(v, f"x[{i}]", "sum")
    helper = LayerHelper("sum")
    out = helper.create_variable_for_type_inference(xs[0].dtype)
    helper.append_op("sum", inputs={"X": xs}, outputs={"Out": [out]})
    return out


def unstack(x, axis: int = 0, num=None) -> list:
    """``x`` cut along ``axis`` into its ``num`` slices, that axis removed from each."""
    check_variable(x, "x", "unstack")
    a = axis % len(x.shape) if x.shape else 0
    n = x.shape[a] if num is None else int(num)
    if n < 0:
        raise ValueError(f"unstack: the size of axis {axis} must be known (or num given), got "
                         f"shape {list(x.shape)}")
    helper = LayerHelper("unstack")
    outs = [helper.create_variable_for_type_inference(x.dtype) for _ in range(n)]
    helper.append_op("unstack", inputs={"X": [x]}, outputs={"Y": outs},
                     attrs={"axis": int(axis), "num": n})
    return outs


def expand_as(x, target_tensor, name=None) -> Variable:
    """``x`` tiled along each axis so that its shape becomes ``target_tensor``'s (each of
    target's sizes a multiple of x's)."""
    check_variable(x, "x", "expand_as")
    check_variable(target_tensor, "target_tensor", "expand_as")
    if len(x.shape) != len(target_tensor.shape):
        raise ValueError(f"expand_as: x and target_tensor must have one rank, got "
                         f"{list(x.shape)} and {list(target_tensor.shape)}")
    times = []
    for a, b in zip(x.shape, target_tensor.shape):
        if a == b:
            times.append(1)
        elif a > 0 and b > 0 and b % a == 0:
            times.append(b // a)
        else:
            raise ValueError(f"expand_as: each size of target_tensor {list(target_tensor.shape)} "
                             f"must be a known multiple of x's {list(x.shape)}")
    return _fluid_op("expand_as", {"X": x, "target_tensor": target_tensor}, {}, x.dtype, name)


def rank(input) -> Variable:
    """The number of dimensions of ``input``, as an int32 Variable of shape ``[1]``."""
    check_variable(input, "input", "rank")
    return tensor.fill_constant([1], "int32", len(input.shape))


def size(input) -> Variable:
    """The number of elements of ``input``, as an int64 Variable of shape ``[1]``."""
    check_variable(input, "input", "size")
    out = _fluid_op("size", {"Input": input}, {}, "int64")
    out.stop_gradient = True
    return out


def _crop(x, shape, offsets, layer: str) -> Variable:
    check_variable(x, "x", layer)
    r = len(x.shape)
    if isinstance(shape, Variable) or isinstance(offsets, Variable) or (
            offsets is not None and any(isinstance(o, Variable) for o in offsets)) or (
            shape is not None and any(isinstance(s, Variable) for s in shape)):
        raise TypeError(f"{layer}: 'shape' and 'offsets' as Variables are not supported; give "
                        f"lists of ints")
    shape = list(x.shape) if shape is None else [int(s) for s in shape]
    offsets = [0] * r if offsets is None else [int(o) for o in offsets]
    if len(shape) != r or len(offsets) != r:
        raise ValueError(f"{layer}: 'shape' and 'offsets' need one value per dimension of x "
                         f"({r}), got {shape} and {offsets}")
    axes, starts, ends = [], [], []
    for d, (s, o) in enumerate(zip(shape, offsets)):
        if s == -1 or (s == x.shape[d] and o == 0):
            if o != 0:
                starts.append(o)
                ends.append(2 ** 31 - 1)
                axes.append(d)
            continue
        if s < 0 or o < 0 or (x.shape[d] >= 0 and o + s > x.shape[d]):
            raise ValueError(f"{layer}: dimension {d}: expected 0 <= offset and offset + size "
                             f"<= {x.shape[d]}, got offset {o}, size {s}")
        axes.append(d)
        starts.append(o)
        ends.append(o + s)
    if not axes:
        return tensor.assign(x)
    return shape_ops.slice(x, axes, starts, ends)


def crop(x, shape=None, offsets=None, name=None) -> Variable:
    """The block of ``x`` of size ``shape`` (a list, or a Variable whose shape it takes)
    starting at ``offsets`` (a list or a 1-D int Variable): Fluid's ``crop`` op."""
    return _crop("crop", "Y", x, shape, offsets, name)


def crop_tensor(x, shape=None, offsets=None, name=None) -> Variable:
    """The block of ``x`` of size ``shape`` (``-1``: to the end; a list or a 1-D int Variable)
    starting at ``offsets`` (a list or a 1-D int Variable): Fluid's ``crop_tensor`` op."""
    return _crop("crop_tensor", "Shape", x, shape, offsets, name)


def _crop(op: str, shape_slot: str, x, shape, offsets, name) -> Variable:
    """``crop`` / ``crop_tensor``: a Variable ``shape`` goes to ``shape_slot``, a list to the
    ``shape`` attribute (checked against ``x``); ``offsets`` likewise to ``Offsets`` or the
    ``offsets`` attribute (zeros when None)."""
    check_variable(x, "x", op)
    inputs, attrs = {"X": x}, {}
    if isinstance(shape, Variable):
        inputs[shape_slot] = shape
    else:
        attrs["shape"] = _crop_check(x, shape, offsets, op)
    if isinstance(offsets, Variable):
        inputs["Offsets"] = offsets
    else:
        attrs["offsets"] = [0] * len(x.shape) if offsets is None else [int(o) for o in offsets]
    return _fluid_op(op, inputs, attrs, x.dtype, name)


def _crop_check(x, shape, offsets, layer) -> list:
    """``shape`` as a list of ints, checked against ``x`` and ``offsets`` (a list or a
    Variable) where both are known."""
    r = len(x.shape)
    shape = list(x.shape) if shape is None else [int(s) for s in shape]
    offs = None if isinstance(offsets, Variable) else (
        [0] * r if offsets is None else [int(o) for o in offsets])
    if len(shape) != r or (offs is not None and len(offs) != r):
        raise ValueError(f"{layer}: 'shape' and 'offsets' need one value per dimension of x "
                         f"({r}), got {shape} and {offsets}")
    for d, s in enumerate(shape):
        o = offs[d] if offs is not None else 0
        if s < -1 or o < 0 or (x.shape[d] >= 0 and s >= 0 and o + s > x.shape[d]):
            raise ValueError(f"{layer}: dimension {d}: expected 0 <= offset and offset + size "
                             f"<= {x.shape[d]}, got offset {o}, size {s}")
    return shape


def pad_constant_like(x, y, pad_value: float = 0.0, name=None) -> Variable:
    """``y`` padded with ``pad_value`` at the end of each axis to ``x``'s shape."""
    check_variable(x, "x", "pad_constant_like")
    check_variable(y, "y", "pad_constant_like")
    if len(x.shape) != len(y.shape):
        raise ValueError(f"pad_constant_like: x and y must have one rank, got {list(x.shape)} "
                         f"and {list(y.shape)}")
    for d, (a, b) in enumerate(zip(x.shape, y.shape)):
        if a != b and not (a >= 0 and b >= 0 and a >= b):
            raise ValueError(f"pad_constant_like: dimension {d}: expected x's size ({a}) known "
                             f"and >= y's ({b})")
    return _fluid_op("pad_constant_like", {"X": x, "Y": y}, {"pad_value": float(pad_value)},
                     y.dtype, name)


def eye(num_rows, num_columns=None, batch_shape=None, dtype="float32") -> Variable:
    """An identity matrix ``[num_rows, num_columns]``, repeated over ``batch_shape``."""
    cols = num_rows if num_columns is None else num_columns
    for arg, v in (("num_rows", num_rows), ("num_columns", cols)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise TypeError(f"eye: argument {arg!r} must be an int >= 0, got {v!r}")
    from pdjit.framework import dtypes

    out = _fluid_op("eye", {}, {"num_rows": num_rows, "num_columns": cols,
                                "dtype": dtypes.to_code(dtype)}, dtype)
    if batch_shape:
        batch_shape = [int(b) for b in batch_shape]
        out = shape_ops.reshape(out, [1] * len(batch_shape) + [num_rows, cols])
        out = shape_ops.expand(out, batch_shape + [1, 1])
    out.stop_gradient = True
    return out


def _constant(value: np.ndarray, dtype) -> Variable:
    """A constant of ``dtype`` holding ``value`` (exact in float32: 0s and 1s here); ``assign``
    writes float64 arrays as float32, so wider dtypes get a ``cast``."""
    out = tensor.assign(value.astype(np.float32))
    return out if np.dtype(dtype) == np.float32 else tensor.cast(out, dtype)


def diag(diagonal) -> Variable:
    """The square matrix with ``diagonal`` (a 1-D Variable of known size, or an array) on its
    diagonal and zeros elsewhere."""
    if not isinstance(diagonal, Variable):
        return tensor.assign(np.diag(np.asarray(diagonal)))
    check_variable(diagonal, "diagonal", "diag")
    if len(diagonal.shape) != 1 or diagonal.shape[0] < 0:
        raise ValueError(f"diag: argument 'diagonal' must be 1-D of known size, got "
                         f"{list(diagonal.shape)}")
    helper = LayerHelper("diag")
    out = helper.create_variable_for_type_inference(diagonal.dtype)
    helper.append_op("diag", inputs={"Diagonal": [diagonal]}, outputs={"Out": [out]})
    return out


def _reduce_bool(x, dim, keep_dim, name, layer, reduce):
    check_variable(x, "input", layer)
    check_dtype(x, "input", ("bool",), layer)
    if dim is not None and not isinstance(dim, (list, tuple)):
        dim = [dim]
    dims = [int(d) for d in dim] if dim else [0]
    every = not dim or len(dims) >= max(len(x.shape), 1)
    out = _fluid_op(layer, {"X": x}, {"dim": dims, "keep_dim": bool(keep_dim),
                                      "reduce_all": bool(every)}, "bool", name)
    out.stop_gradient = True
    return out


def reduce_all(input, dim=None, keep_dim=False, name=None) -> Variable:
    """Logical AND of a bool tensor over ``dim`` (all dims when ``None``)."""
    return _reduce_bool(input, dim, keep_dim, name, "reduce_all", shape_ops.reduce_min)


def reduce_any(input, dim=None, keep_dim=False, name=None) -> Variable:
    """Logical OR of a bool tensor over ``dim`` (all dims when ``None``)."""
    return _reduce_bool(input, dim, keep_dim, name, "reduce_any", shape_ops.reduce_max)


def multiplex(inputs, index) -> Variable:
    """Row ``i`` of ``inputs[index[i]]`` for each row ``i`` (``index``: ``[N, 1]`` int32/64;
    the inputs of one shape ``[N, ...]``)."""
    if not isinstance(inputs, (list, tuple)) or len(inputs) < 2:
        raise ValueError("multiplex: argument 'inputs' must be a list of at least 2 Variables")
    for i, v in enumerate(inputs):
        check_variable(v, f"inputs[{i}]", "multiplex")
    check_variable(index, "index", "multiplex")
    check_dtype(index, "index", ("int32", "int64"), "multiplex")
    helper = LayerHelper("multiplex")
    out = helper.create_variable_for_type_inference(inputs[0].dtype)
    helper.append_op("multiplex", inputs={"X": list(inputs), "Ids": [index]},
                     outputs={"Out": [out]})
    return out


def _fluid_op(op_type, inputs, attrs, dtype, name=None, layer=None, outputs=()) -> Variable:
    """Append Fluid's ``op_type`` with ``inputs`` ({slot: Variable}) and ``attrs``: its
    ``Out`` (of ``dtype``) is returned; ``outputs`` names further (intermediate) outputs."""
    helper = LayerHelper(layer or op_type, name=name)
    out = helper.create_variable_for_type_inference(dtype)
    outs = {"Out": [out]}
    for slot in outputs:
        outs[slot] = [helper.create_variable_for_type_inference(dtype, stop_gradient=True)]
    helper.append_op(op_type, inputs={k: [v] for k, v in inputs.items()}, outputs=outs,
                     attrs=attrs)
    return out


def maxout(x, groups: int, name=None, axis: int = 1) -> Variable:
    """The maximum over each run of ``groups`` consecutive channels (``axis`` 1 or -1 of a 4-D
    ``x``): ``C / groups`` channels."""
    check_variable(x, "x", "maxout")
    if len(x.shape) != 4 or axis not in (1, -1, 3):
        raise ValueError(f"maxout: expected a 4-D x and axis 1 or -1, got {list(x.shape)} and "
                         f"axis {axis}")
    a = axis % 4
    c = x.shape[a]
    if c < 0 or groups < 1 or c % groups:
        raise ValueError(f"maxout: the channel count ({c}) must be known and divide by groups "
                         f"({groups})")
    return _fluid_op("maxout", {"X": x}, {"groups": int(groups), "axis": int(axis)}, x.dtype,
                     name)


def pixel_shuffle(x, upscale_factor: int) -> Variable:
    """``[N, C r^2, H, W]`` rearranged to ``[N, C, H r, W r]`` (``r = upscale_factor``)."""
    check_variable(x, "x", "pixel_shuffle")
    r = int(upscale_factor)
    if len(x.shape) != 4 or r < 1:
        raise ValueError(f"pixel_shuffle: expected a 4-D x and upscale_factor >= 1, got "
                         f"{list(x.shape)} and {upscale_factor}")
    _known(x, [1, 2, 3], "pixel_shuffle", "the channels, height and width")
    n, c, h, w = x.shape
    if c % (r * r):
        raise ValueError(f"pixel_shuffle: the channel count {c} must divide by "
                         f"upscale_factor^2 = {r * r}")
    return _fluid_op("pixel_shuffle", {"X": x}, {"upscale_factor": r}, x.dtype)


def shuffle_channel(x, group: int, name=None) -> Variable:
    """The channels of ``[N, C, H, W]`` regrouped: ``group`` groups of ``C / group`` channels
    read column by column (ShuffleNet)."""
    check_variable(x, "x", "shuffle_channel")
    if len(x.shape) != 4:
        raise ValueError(f"shuffle_channel: expected a 4-D x, got {list(x.shape)}")
    _known(x, [1, 2, 3], "shuffle_channel", "the channels, height and width")
    n, c, h, w = x.shape
    if group < 1 or c % group:
        raise ValueError(f"shuffle_channel: the channel count {c} must divide by group "
                         f"({group})")
    return _fluid_op("shuffle_channel", {"X": x}, {"group": int(group)}, x.dtype, name)


def lrn(input, n: int = 5, k: float = 1.0, alpha: float = 1e-4, beta: float = 0.75,
        name=None, data_format: str = "NCHW") -> Variable:
    """Local response normalisation across channels:
    ``input / (k + alpha * sum of input^2 over the n channels centred on each) ** beta``."""
    check_variable(input, "input", "lrn")
    check_dtype(input, "input", ("float32", "float64"), "lrn")
    if len(input.shape) != 4 or data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"lrn: expected a 4-D input and data_format 'NCHW' or 'NHWC', got "
                         f"{list(input.shape)} and {data_format!r}")
    if n < 1:
        raise ValueError(f"lrn: argument 'n' must be >= 1, got {n}")
    return _fluid_op("lrn", {"X": input}, {"n": int(n), "k": float(k), "alpha": float(alpha),
                                           "beta": float(beta), "data_format": data_format},
                     input.dtype, name, outputs=("MidOut",))


def temporal_shift(x, seg_num: int, shift_ratio: float = 0.25, name=None) -> Variable:
    """TSM's temporal shift of ``[N * seg_num, C, H, W]``: the first ``C * shift_ratio``
    channels take the previous segment's values, the next as many the following segment's
    (zeros past either end), the rest stay."""
    check_variable(x, "x", "temporal_shift")
    if len(x.shape) != 4 or seg_num < 1 or not 0 < shift_ratio < 0.5:
        raise ValueError(f"temporal_shift: expected a 4-D x, seg_num >= 1 and 0 < shift_ratio "
                         f"< 0.5, got {list(x.shape)}, {seg_num}, {shift_ratio}")
    _known(x, [1, 2, 3], "temporal_shift", "the channels, height and width")
    return _fluid_op("temporal_shift", {"X": x},
                     {"seg_num": int(seg_num), "shift_ratio": float(shift_ratio)}, x.dtype, name)


def unique(x, dtype="int32"):
    """The distinct values of the 1-D ``x`` in order of first appearance, and for each element
    of ``x`` the position of its value among them (``dtype`` int32 or int64)."""
    return _unique("unique", x, dtype)


def unique_with_counts(x, dtype="int32"):
    """``unique``, with how often each distinct value occurs."""
    return _unique("unique_with_counts", x, dtype)


def _unique(op_type, x, dtype):
    check_variable(x, "x", op_type)
    codes = {"int32": 2, "int64": 3}
    if str(np.dtype(dtype)) not in codes:
        raise TypeError(f"{op_type}: argument 'dtype' must be 'int32' or 'int64', got "
                        f"{dtype!r}")
    helper = LayerHelper(op_type)
    out = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    index = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    outputs = {"Out": [out], "Index": [index]}
    if op_type == "unique_with_counts":
        outputs["Count"] = [helper.create_variable_for_type_inference(dtype, stop_gradient=True)]
    helper.append_op(op_type, inputs={"X": [x]}, outputs=outputs,
                     attrs={"dtype": codes[str(np.dtype(dtype))]})
    return tuple(v[0] for v in outputs.values())


def image_resize_short(input, out_short_len: int, resample="BILINEAR") -> Variable:
    """``input`` (``[N, C, H, W]``) resized so that its shorter side is ``out_short_len``,
    keeping the aspect ratio (the longer side rounded to the nearest pixel)."""
    check_variable(input, "input", "image_resize_short")
    if len(input.shape) != 4:
        raise ValueError(f"image_resize_short: expected a 4-D input, got {list(input.shape)}")
    _known(input, [2, 3], "image_resize_short", "the height and width")
    hw = list(input.shape[2:])
    short = 0 if hw[0] <= hw[1] else 1
    out = [0, 0]
    out[short] = int(out_short_len)
    out[1 - short] = int(float(hw[1 - short]) * (out_short_len / float(hw[short])) + 0.5)
    return image.image_resize(input, out_shape=out, resample=resample)


def fsp_matrix(x, y) -> Variable:
    """The flow-of-solution-procedure matrix of feature maps ``x [N, C1, H, W]`` and ``y [N,
    C2, H, W]``: ``[N, C1, C2]``, the channel-by-channel inner products over the H * W
    positions divided by H * W."""
    check_variable(x, "x", "fsp_matrix")
    check_variable(y, "y", "fsp_matrix")
    if len(x.shape) != 4 or len(y.shape) != 4:
        raise ValueError(f"fsp_matrix: expected 4-D x and y, got {list(x.shape)} and "
                         f"{list(y.shape)}")
    return _fluid_op("fsp", {"X": x, "Y": y}, {}, x.dtype, layer="fsp_matrix")


def bilinear_tensor_product(x, y, size: int, act=None, name=None, param_attr=None,
                            bias_attr=None) -> Variable:
    """``out[:, i] = x W_i y^T + b_i`` for ``i < size`` with a learnt ``W [size, Dx, Dy]`` and
    ``b [1, size]``; ``act`` applied last."""
    layer = "bilinear_tensor_product"
    check_variable(x, "x", layer)
    check_variable(y, "y", layer)
    if len(x.shape) != 2 or len(y.shape) != 2 or x.shape[1] < 0 or y.shape[1] < 0:
        raise ValueError(f"{layer}: expected x [N, Dx] and y [N, Dy] with known widths, got "
                         f"{list(x.shape)} and {list(y.shape)}")
    dx, dy = x.shape[1], y.shape[1]
    helper = LayerHelper(layer, name=name, param_attr=param_attr, bias_attr=bias_attr, act=act)
    w = helper.create_parameter(helper.param_attr, [size, dx, dy], x.dtype)
    inputs = {"X": [x], "Y": [y], "Weight": [w]}
    if bias_attr is not False:
        inputs["Bias"] = [helper.create_parameter(helper.bias_attr, [1, size], x.dtype,
                                                  is_bias=True)]
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(layer, inputs=inputs, outputs={"Out": [out]})
    return helper.append_activation(out)


def get_tensor_from_selected_rows(x, name=None) -> Variable:
    """The dense tensor of a sparse (SelectedRows) value. pdjit keeps every value dense (a
    sparse gradient is a dense tensor), so this is a copy of ``x``."""
    check_variable(x, "x", "get_tensor_from_selected_rows")
    return tensor.assign(x)


def merge_selected_rows(x, name=None) -> Variable:
    """A SelectedRows value with its duplicate rows summed. pdjit keeps every value dense (rows
    already summed), so this is a copy of ``x``."""
    check_variable(x, "x", "merge_selected_rows")
    return tensor.assign(x)


def shard_index(input, index_num: int, nshards: int, shard_id: int, ignore_value: int = -1):
    """For ids ``input`` (int) of a table of ``index_num`` rows cut into ``nshards`` shards of
    ``ceil(index_num / nshards)`` rows: the id within shard ``shard_id``, or ``ignore_value``
    for ids of other shards."""
    layer = "shard_index"
    check_variable(input, "input", layer)
    check_dtype(input, "input", ("int32", "int64"), layer)
    if nshards < 1 or not 0 <= shard_id < nshards or index_num < 1:
        raise ValueError(f"{layer}: expected index_num >= 1, nshards >= 1 and 0 <= shard_id < "
                         f"nshards, got {index_num}, {nshards}, {shard_id}")
    out = _fluid_op("shard_index", {"X": input},
                    {"index_num": int(index_num), "nshards": int(nshards),
                     "shard_id": int(shard_id), "ignore_value": int(ignore_value)}, input.dtype)
    out.stop_gradient = True
    return out


def interpolate(input, out_shape=None, scale=None, name=None, resample="BILINEAR",
                actual_shape=None, align_corners=True, align_mode=1, data_format="NCHW"):
    """Fluid 1.8's other name of ``image_resize`` (same arguments)."""
    return image.image_resize(input, out_shape=out_shape, scale=scale, name=name,
                              resample=resample, actual_shape=actual_shape,
                              align_corners=align_corners, align_mode=align_mode,
                              data_format=data_format)


def clip_by_norm(x, max_norm, name=None) -> Variable:
    """``x`` scaled down to L2 norm ``max_norm`` when its norm is larger, else ``x``."""
    check_variable(x, "x", "clip_by_norm")
    check_dtype(x, "x", ("float32", "float64"), "clip_by_norm")
    if not float(max_norm) > 0:
        raise ValueError(f"clip_by_norm: argument 'max_norm' must be > 0, got {max_norm}")
    return _fluid_op("clip_by_norm", {"X": x}, {"max_norm": float(max_norm)}, x.dtype, name)


def lod_append(x, level) -> Variable:
    """``x`` with a LoD level added below its own: ``level`` as offsets (a list), or a
    Variable's LoD (or values as offsets)."""
    from pdjit.layers.sequence import _one

    check_variable(x, "x", "lod_append")
    if isinstance(level, Variable):
        return _one("lod_reset", x, "lod_append", attrs={"append": True},
                    extra_inputs={"Y": [level]})
    if not isinstance(level, (list, tuple)) or not level:
        raise ValueError(f"lod_append: argument 'level' must be a non-empty list of offsets or "
                         f"a Variable, got {level!r}")
    return _one("lod_reset", x, "lod_append",
                attrs={"target_lod": [int(v) for v in level], "append": True})


def randint(low=0, high=None, shape=None, out=None, dtype=None, device=None,
            stop_gradient=False, seed=0, name=None) -> Variable:
    """Integers drawn uniformly from ``[low, high)`` (``[0, low)`` when ``high`` is None)."""
    from pdjit.framework import dtypes

    lo, hi = (0, low) if high is None else (low, high)
    if not hi > lo:
        raise ValueError(f"randint: expected low < high, got [{lo}, {hi})")
    inputs, attrs = {}, {"low": int(lo), "high": int(hi), "seed": int(seed),
                         "dtype": dtypes.to_code(dtype or "int64")}
    if isinstance(shape, Variable):
        inputs["ShapeTensor"] = shape
        attrs["shape"] = []
    else:
        attrs["shape"] = [1] if shape is None else [int(d) for d in shape]
    v = _fluid_op("randint", inputs, attrs, dtype or "int64", name)
    v.stop_gradient = True
    return v


def scatter_nd_add(ref, index, updates, name=None) -> Variable:
    """``ref`` with ``updates[i]`` added at each index tuple ``index[i]`` (``index [..., k]``
    addressing ``ref``'s first ``k`` axes)."""
    for arg, v in (("ref", ref), ("index", index), ("updates", updates)):
        check_variable(v, arg, "scatter_nd_add")
    helper = LayerHelper("scatter_nd_add", name=name)
    out = helper.create_variable_for_type_inference(ref.dtype)
    helper.append_op("scatter_nd_add", inputs={"X": [ref], "Index": [index],
                                               "Updates": [updates]}, outputs={"Out": [out]})
    return out


def scatter_nd(index, updates, shape, name=None) -> Variable:
    """A zero tensor of ``shape`` with ``updates`` added at ``index`` (``scatter_nd_add`` into
    zeros)."""
    check_variable(updates, "updates", "scatter_nd")
    zeros = tensor.fill_constant(list(shape), updates.dtype, 0.0)
    return scatter_nd_add(zeros, index, updates, name=name)


def strided_slice(input, axes, starts, ends, strides) -> Variable:
    """``input[start:end:stride]`` along each of ``axes`` (lists of ints)."""
    check_variable(input, "input", "strided_slice")
    vals = [axes, starts, ends, strides]
    if any(isinstance(v, Variable) or not isinstance(v, (list, tuple)) for v in vals) or any(
            isinstance(i, Variable) for v in vals for i in v):
        raise TypeError("strided_slice: axes, starts, ends and strides must be lists of ints "
                        "(Variables are not supported)")
    helper = LayerHelper("strided_slice")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("strided_slice", inputs={"Input": [input]}, outputs={"Out": [out]},
                     attrs={"axes": [int(a) for a in axes], "starts": [int(a) for a in starts],
                            "ends": [int(a) for a in ends],
                            "strides": [int(a) for a in strides],
                            "infer_flags": [1] * len(axes), "decrease_axis": []})
    return out


def mean_iou(input, label, num_classes):
    """Mean intersection-over-union of predicted classes ``input`` against ``label``:
    ``(mean_iou [1] float32, out_wrong [num_classes] int32, out_correct [num_classes]
    int32)``."""
    check_variable(input, "input", "mean_iou")
    check_variable(label, "label", "mean_iou")
    helper = LayerHelper("mean_iou")
    miou = helper.create_variable_for_type_inference("float32", stop_gradient=True)
    wrong = helper.create_variable_for_type_inference("int32", stop_gradient=True)
    correct = helper.create_variable_for_type_inference("int32", stop_gradient=True)
    helper.append_op("mean_iou", inputs={"Predictions": [input], "Labels": [label]},
                     outputs={"OutMeanIou": [miou], "OutWrong": [wrong],
                              "OutCorrect": [correct]},
                     attrs={"num_classes": int(num_classes)})
    return miou, wrong, correct


def sampling_id(x, min=0.0, max=1.0, seed=0, dtype="float32") -> Variable:  # noqa: A002
    """For each row of probabilities ``x [N, C]``, a column drawn with those probabilities:
    int64 ``[N]``."""
    check_variable(x, "x", "sampling_id")
    helper = LayerHelper("sampling_id")
    out = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    helper.append_op("sampling_id", inputs={"X": [x]}, outputs={"Out": [out]},
                     attrs={"min": float(min), "max": float(max), "seed": int(seed)})
    return out


def affine_grid(theta, out_shape, name=None) -> Variable:
    """The sampling grid ``[N, H, W, 2]`` of the affine maps ``theta [N, 2, 3]`` over an
    ``out_shape`` (``[N, C, H, W]``, a list) image: the (x, y) each output pixel reads, in
    [-1, 1] coordinates with the corners at -1 and 1."""
    check_variable(theta, "theta", "affine_grid")
    inputs, attrs = {"Theta": [theta]}, {}
    if isinstance(out_shape, Variable):
        inputs["OutputShape"] = [out_shape]
    elif isinstance(out_shape, (list, tuple)) and len(out_shape) == 4:
        attrs["output_shape"] = [int(s) for s in out_shape]
    else:
        raise TypeError(f"affine_grid: argument 'out_shape' must be a list [N, C, H, W] or an "
                        f"int Variable of 4, got {out_shape!r}")
    helper = LayerHelper("affine_grid", name=name)
    out = helper.create_variable_for_type_inference(theta.dtype)
    helper.append_op("affine_grid", inputs=inputs, outputs={"Output": [out]}, attrs=attrs)
    return out


def grid_sampler(x, grid, name=None) -> Variable:
    """``x`` (``[N, C, H, W]``) sampled bilinearly at the points of ``grid`` (``[N, H', W',
    2]``, (x, y) in [-1, 1] with the image's corners at -1 and 1; zeros outside the image):
    ``[N, C, H', W']``. Differentiable in both."""
    check_variable(x, "x", "grid_sampler")
    check_variable(grid, "grid", "grid_sampler")
    helper = LayerHelper("grid_sampler", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("grid_sampler", inputs={"X": [x], "Grid": [grid]},
                     outputs={"Output": [out]})
    return out


def unfold(x, kernel_sizes, strides=1, paddings=0, dilations=1, name=None) -> Variable:
    """im2col: the ``kernel_sizes`` patches of ``x`` (``[N, C, H, W]``) as the columns of
    ``[N, C * kh * kw, L]``. ``paddings``: an int, [h, w] or [top, left, bottom, right]."""
    layer = "unfold"
    check_variable(x, "x", layer)

    def pair(v, arg):
        v = [v, v] if isinstance(v, int) and not isinstance(v, bool) else list(v)
        if len(v) != 2:
            raise ValueError(f"{layer}: argument {arg!r} must be an int or 2 ints, got {v!r}")
        return [int(i) for i in v]

    if isinstance(paddings, int) and not isinstance(paddings, bool):
        pads = [paddings] * 4
    elif len(paddings) == 2:
        pads = [paddings[0], paddings[1], paddings[0], paddings[1]]
    elif len(paddings) == 4:
        pads = [int(p) for p in paddings]
    else:
        raise ValueError(f"{layer}: argument 'paddings' must be an int, 2 or 4 ints, got "
                         f"{paddings!r}")
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(layer, inputs={"X": [x]}, outputs={"Y": [out]},
                     attrs={"kernel_sizes": pair(kernel_sizes, "kernel_sizes"),
                            "strides": pair(strides, "strides"), "paddings": pads,
                            "dilations": pair(dilations, "dilations")})
    return out


def _roi(op_type, input, rois, attrs):
    check_variable(input, "input", op_type)
    check_variable(rois, "rois", op_type)
    helper = LayerHelper(op_type)
    out = helper.create_variable_for_type_inference(input.dtype)
    outputs = {"Out": [out]}
    if op_type == "roi_pool":
        outputs["Argmax"] = [helper.create_variable_for_type_inference("int64",
                                                                       stop_gradient=True)]
    helper.append_op(op_type, inputs={"X": [input], "ROIs": [rois]}, outputs=outputs,
                     attrs=attrs)
    return out


def roi_pool(input, rois, pooled_height=1, pooled_width=1, spatial_scale=1.0) -> Variable:
    """Max pooling of each region ``rois [R, 4]`` (x1, y1, x2, y2; a one-level LoD naming each
    one's image) of ``input [N, C, H, W]`` into ``pooled_height x pooled_width`` bins."""
    return _roi("roi_pool", input, rois,
                {"pooled_height": int(pooled_height), "pooled_width": int(pooled_width),
                 "spatial_scale": float(spatial_scale)})


def roi_align(input, rois, pooled_height=1, pooled_width=1, spatial_scale=1.0,
              sampling_ratio=-1, name=None) -> Variable:
    """RoIAlign: each region of ``rois`` averaged bilinearly into ``pooled_height x
    pooled_width`` bins (``sampling_ratio`` samples per bin side; adaptive when <= 0)."""
    return _roi("roi_align", input, rois,
                {"pooled_height": int(pooled_height), "pooled_width": int(pooled_width),
                 "spatial_scale": float(spatial_scale), "sampling_ratio": int(sampling_ratio)})


def continuous_value_model(input, cvm, use_cvm=True) -> Variable:
    """CTR features whose first two columns are show and click counts: those as
    ``log(show + 1)`` and ``log(click + 1) - log(show + 1)`` (``use_cvm``), or dropped."""
    check_variable(input, "input", "continuous_value_model")
    check_variable(cvm, "cvm", "continuous_value_model")
    helper = LayerHelper("cvm")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("cvm", inputs={"X": [input], "CVM": [cvm]}, outputs={"Y": [out]},
                     attrs={"use_cvm": bool(use_cvm)})
    return out


def random_crop(x, shape, seed=None) -> Variable:
    """The last ``len(shape)`` axes of ``x`` cropped to ``shape`` at random offsets, drawn
    per instance (``seed``: an int fixing them, or an int64 Variable)."""
    check_variable(x, "x", "random_crop")
    helper = LayerHelper("random_crop")
    out = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    seed_out = helper.create_variable_for_type_inference("int64", stop_gradient=True)
    inputs, attrs = {"X": [x]}, {"shape": [int(s) for s in shape], "startup_seed": 0}
    if isinstance(seed, Variable):
        inputs["Seed"] = [seed]
    elif seed is not None:
        attrs["startup_seed"] = int(seed)
    helper.append_op("random_crop", inputs=inputs, outputs={"Out": [out], "SeedOut": [seed_out]},
                     attrs=attrs)
    return out


def iou_similarity(x, y, box_normalized=True, name=None) -> Variable:
    """The intersection over union of every box of ``x [N, 4]`` with every box of ``y [M, 4]``
    (xmin, ymin, xmax, ymax): ``[N, M]``, keeping ``x``'s LoD."""
    check_variable(x, "x", "iou_similarity")
    check_variable(y, "y", "iou_similarity")
    helper = LayerHelper("iou_similarity", name=name)
    out = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    helper.append_op("iou_similarity", inputs={"X": [x], "Y": [y]}, outputs={"Out": [out]},
                     attrs={"box_normalized": bool(box_normalized)})
    return out


def space_to_depth(x, blocksize, name=None) -> Variable:
    """Fluid 1.8's space_to_depth of ``x [N, C, H, W]`` (C divisible by ``blocksize^2``, H and
    W by ``blocksize``): ``[N, C * b^2, H / b, W / b]``. As Fluid's kernel (darknet's reorg)
    computes it: channel ``k = (oy * b + ox) * C / b^2 + c`` at ``(j, i)`` goes to row ``j * b +
    oy``, column ``i * b + ox`` of channel ``c`` of a ``[N, C / b^2, H b, W b]`` tensor, whose
    memory is then read as the output shape."""
    check_variable(x, "x", "space_to_depth")
    b = int(blocksize)
    if len(x.shape) != 4 or b < 1:
        raise ValueError(f"space_to_depth: expected a 4-D x and blocksize >= 1, got "
                         f"{list(x.shape)} and {blocksize}")
    _known(x, [1, 2, 3], "space_to_depth", "the channels, height and width")
    _, c, h, w = x.shape
    if c % (b * b) or h % b or w % b:
        raise ValueError(f"space_to_depth: the channels ({c}) must divide by blocksize^2 and the "
                         f"height ({h}) and width ({w}) by blocksize ({b})")
    return _fluid_op("space_to_depth", {"X": x}, {"blocksize": b}, x.dtype, name)


def psroi_pool(input, rois, output_channels, spatial_scale, pooled_height, pooled_width,
               name=None) -> Variable:
    """Position-sensitive RoI pooling (R-FCN): bin ``(i, j)`` of output channel ``k`` of each
    region averages input channel ``(k * pooled_height + i) * pooled_width + j``."""
    check_variable(input, "input", "psroi_pool")
    check_variable(rois, "rois", "psroi_pool")
    helper = LayerHelper("psroi_pool", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("psroi_pool", inputs={"X": [input], "ROIs": [rois]},
                     outputs={"Out": [out]},
                     attrs={"output_channels": int(output_channels),
                            "spatial_scale": float(spatial_scale),
                            "pooled_height": int(pooled_height),
                            "pooled_width": int(pooled_width)})
    return out


def inplace_abn(input, act=None, is_test=False, momentum=0.9, epsilon=1e-05, param_attr=None,
                bias_attr=None, data_layout="NCHW", name=None, moving_mean_name=None,
                moving_variance_name=None, do_model_average_for_mean_and_var=True,
                use_global_stats=False, act_alpha=1.0) -> Variable:
    """Batch normalisation followed by ``act`` (None, 'identity', 'leaky_relu' or 'elu', with
    ``act_alpha``): what Fluid's in-place activated batch norm computes (pdjit plans memory
    itself, so the in-place part is not needed)."""
    from pdjit.layers.norm import batch_norm

    if act not in (None, "identity", "leaky_relu", "elu"):
        raise ValueError(f"inplace_abn: argument 'act' must be None, 'identity', 'leaky_relu' or "
                         f"'elu', got {act!r}")
    out = batch_norm(input, is_test=is_test, momentum=momentum, epsilon=epsilon,
                     param_attr=param_attr, bias_attr=bias_attr, data_layout=data_layout,
                     name=name, moving_mean_name=moving_mean_name,
                     moving_variance_name=moving_variance_name,
                     use_global_stats=use_global_stats)
    if act == "leaky_relu":
        return math_ops.leaky_relu(out, alpha=float(act_alpha))
    if act == "elu":
        return math_ops.elu(out, alpha=float(act_alpha))
    return out


def py_func(func, x, out, backward_func=None, skip_vars_in_backward_input=None):
    """Run ``func`` (Python) on the values of ``x`` (a Variable or list; each passed as a LoD
    tensor) to fill ``out`` (Variables the caller created with their shapes and dtypes). With
    ``backward_func``, gradients flow: it gets ``x``, ``out`` (less
    ``skip_vars_in_backward_input``) and the gradients of ``out``, and returns those of
    ``x``. Returns ``out``."""
    from pdjit.ops.py_func import register_callable

    if not callable(func) or (backward_func is not None and not callable(backward_func)):
        raise TypeError("py_func: arguments 'func' and 'backward_func' must be callable")
    xs = [] if x is None else ([x] if isinstance(x, Variable) else list(x))
    outs = [] if out is None else ([out] if isinstance(out, Variable) else list(out))
    for i, v in enumerate(xs):
        check_variable(v, f"x[{i}]", "py_func")
    for i, v in enumerate(outs):
        check_variable(v, f"out[{i}]", "py_func")
    skip = skip_vars_in_backward_input
    skip = [] if skip is None else ([skip] if isinstance(skip, Variable) else list(skip))
    known = {v.name for v in xs + outs}
    names = [v.name if isinstance(v, Variable) else str(v) for v in skip]
    if any(n not in known for n in names):
        raise ValueError(f"py_func: skip_vars_in_backward_input must be among x and out, got "
                         f"{names}")
    helper = LayerHelper("py_func")
    helper.append_op("py_func", inputs={"X": xs}, outputs={"Out": outs},
                     attrs={"forward_callable_id": register_callable(func),
                            "backward_callable_id": register_callable(backward_func)
                            if backward_func is not None else -1,
                            "backward_skip_vars": names})
    return out


def spectral_norm(weight, dim=0, power_iters=1, eps=1e-12, name=None) -> Variable:
    """``weight`` divided by its largest singular value (``dim`` as the matrix's rows), estimated
    by ``power_iters`` power iterations from two non-trainable vectors ``U`` and ``V`` drawn
    from Normal(0, 1)."""
    from pdjit.layers.initializer import Normal
    from pdjit.layers.param_attr import ParamAttr

    layer = "spectral_norm"
    check_variable(weight, "weight", layer)
    check_dtype(weight, "weight", ("float32", "float64"), layer)
    shape = list(weight.shape)
    if len(shape) < 2 or not 0 <= dim < len(shape) or any(d < 0 for d in shape):
        raise ValueError(f"{layer}: expected a weight of rank >= 2 with known sizes and dim in "
                         f"range, got {shape} and dim {dim}")
    h = shape[dim]
    w = int(np.prod(shape)) // h
    helper = LayerHelper(layer, name=name)
    u = helper.create_parameter(ParamAttr(trainable=False), [h], weight.dtype,
                                default_initializer=Normal(0.0, 1.0))
    v = helper.create_parameter(ParamAttr(trainable=False), [w], weight.dtype,
                                default_initializer=Normal(0.0, 1.0))
    out = helper.create_variable_for_type_inference(weight.dtype)
    helper.append_op(layer, inputs={"Weight": [weight], "U": [u], "V": [v]},
                     outputs={"Out": [out]},
                     attrs={"dim": int(dim), "power_iters": int(power_iters), "eps": float(eps)})
    return out


def box_coder(prior_box, prior_box_var, target_box, code_type="encode_center_size",
              box_normalized=True, name=None, axis=0) -> Variable:
    """Encode boxes ``target_box [N, 4]`` as offsets from ``prior_box [M, 4]`` (``[N, M, 4]``),
    or decode offsets ``[N, M, 4]`` into boxes; ``prior_box_var``: a ``[M, 4]`` Variable, 4
    numbers, or None (1)."""
    layer = "box_coder"
    check_variable(prior_box, "prior_box", layer)
    check_variable(target_box, "target_box", layer)
    if code_type not in ("encode_center_size", "decode_center_size"):
        raise ValueError(f"{layer}: code_type must be 'encode_center_size' or "
                         f"'decode_center_size', got {code_type!r}")
    inputs = {"PriorBox": [prior_box], "TargetBox": [target_box]}
    attrs = {"code_type": code_type, "box_normalized": bool(box_normalized), "axis": int(axis)}
    if isinstance(prior_box_var, Variable):
        inputs["PriorBoxVar"] = [prior_box_var]
    elif prior_box_var is not None:
        attrs["variance"] = [float(v) for v in prior_box_var]
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(prior_box.dtype, stop_gradient=True)
    helper.append_op(layer, inputs=inputs, outputs={"OutputBox": [out]}, attrs=attrs)
    return out


def prior_box(input, image, min_sizes, max_sizes=None, aspect_ratios=(1.0,),
              variance=(0.1, 0.1, 0.2, 0.2), flip=False, clip=False, steps=(0.0, 0.0),
              offset=0.5, name=None, min_max_aspect_ratios_order=False):
    """SSD's prior boxes for each cell of the feature map ``input`` over ``image``:
    ``(boxes, variances)``, each ``[H, W, num_priors, 4]``."""
    layer = "prior_box"
    check_variable(input, "input", layer)
    check_variable(image, "image", layer)

    def floats(v, arg):
        if v is None:
            return []
        vs = [v] if isinstance(v, (int, float)) else list(v)
        if not all(isinstance(x, (int, float)) for x in vs):
            raise TypeError(f"{layer}: argument {arg!r} must be a number or a list of numbers, "
                            f"got {v!r}")
        return [float(x) for x in vs]

    steps = floats(steps, "steps")
    if len(steps) != 2:
        raise ValueError(f"{layer}: argument 'steps' must hold 2 values, got {steps}")
    helper = LayerHelper(layer, name=name)
    boxes = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    var = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    helper.append_op(layer, inputs={"Input": [input], "Image": [image]},
                     outputs={"Boxes": [boxes], "Variances": [var]},
                     attrs={"min_sizes": floats(min_sizes, "min_sizes"),
                            "max_sizes": floats(max_sizes, "max_sizes"),
                            "aspect_ratios": floats(aspect_ratios, "aspect_ratios"),
                            "variances": floats(variance, "variance"), "flip": bool(flip),
                            "clip": bool(clip), "step_w": steps[0], "step_h": steps[1],
                            "offset": float(offset),
                            "min_max_aspect_ratios_order": bool(min_max_aspect_ratios_order)})
    return boxes, var


def multiclass_nms(bboxes, scores, score_threshold, nms_top_k, keep_top_k, nms_threshold=0.3,
                   normalized=True, nms_eta=1.0, background_label=0, name=None) -> Variable:
    """Per-class non-maximum suppression of ``bboxes [N, M, 4]`` scored by ``scores [N, C,
    M]``: rows ``(label, score, xmin, ymin, xmax, ymax)``, one LoD sequence per image (a single
    ``-1`` row when nothing is kept)."""
    layer = "multiclass_nms"
    check_variable(bboxes, "bboxes", layer)
    check_variable(scores, "scores", layer)
    helper = LayerHelper(layer, name=name)
    out = helper.create_variable_for_type_inference(bboxes.dtype, stop_gradient=True)
    helper.append_op(layer, inputs={"BBoxes": [bboxes], "Scores": [scores]},
                     outputs={"Out": [out]},
                     attrs={"background_label": int(background_label),
                            "score_threshold": float(score_threshold),
                            "nms_top_k": int(nms_top_k), "nms_threshold": float(nms_threshold),
                            "nms_eta": float(nms_eta), "keep_top_k": int(keep_top_k),
                            "normalized": bool(normalized)})
    return out


def detection_output(loc, scores, prior_box, prior_box_var, background_label=0,
                     nms_threshold=0.3, nms_top_k=400, keep_top_k=200, score_threshold=0.01,
                     nms_eta=1.0, return_index=False) -> Variable:
    """SSD's detections: the offsets ``loc [N, M, 4]`` decoded against ``prior_box [M, 4]``
    (``box_coder``), ``scores [N, M, C]`` softmaxed over the classes, then ``multiclass_nms``
    (Fluid 1.8 composes the same layers)."""
    from pdjit.layers.nn import softmax

    if return_index:
        raise ValueError("detection_output: return_index=True is not supported")
    boxes = box_coder(prior_box, prior_box_var, loc, code_type="decode_center_size")
    probs = shape_ops.transpose(softmax(scores), [0, 2, 1])
    probs.stop_gradient = True
    return multiclass_nms(boxes, probs, score_threshold, nms_top_k, keep_top_k,
                          nms_threshold=nms_threshold, nms_eta=nms_eta,
                          background_label=background_label)


def box_clip(input, im_info, name=None) -> Variable:
    """Boxes ``input [..., 4]`` clipped into their image (``im_info [N, 3]``: height, width,
    scale; a row's image is its LoD sequence, else its index)."""
    check_variable(input, "input", "box_clip")
    check_variable(im_info, "im_info", "box_clip")
    helper = LayerHelper("box_clip", name=name)
    out = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    helper.append_op("box_clip", inputs={"Input": [input], "ImInfo": [im_info]},
                     outputs={"Output": [out]})
    return out


def yolo_box(x, img_size, anchors, class_num, conf_thresh, downsample_ratio, clip_bbox=True,
             name=None, scale_x_y=1.0):
    """YOLOv3 head ``x [N, S (5 + class_num), H, W]`` decoded into ``(boxes [N, S H W, 4],
    scores [N, S H W, class_num])`` for images of ``img_size [N, 2]`` (int32 height, width);
    ``anchors`` the S (width, height) pairs, flattened."""
    layer = "yolo_box"
    check_variable(x, "x", layer)
    check_variable(img_size, "img_size", layer)
    if not isinstance(anchors, (list, tuple)) or len(anchors) % 2:
        raise TypeError(f"{layer}: argument 'anchors' must be a list of (width, height) pairs, "
                        f"got {anchors!r}")
    if isinstance(class_num, bool) or not isinstance(class_num, int):
        raise TypeError(f"{layer}: argument 'class_num' must be an int, got {class_num!r}")
    helper = LayerHelper(layer, name=name)
    boxes = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    scores = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    helper.append_op(layer, inputs={"X": [x], "ImgSize": [img_size]},
                     outputs={"Boxes": [boxes], "Scores": [scores]},
                     attrs={"anchors": [int(a) for a in anchors], "class_num": class_num,
                            "conf_thresh": float(conf_thresh),
                            "downsample_ratio": int(downsample_ratio),
                            "clip_bbox": bool(clip_bbox), "scale_x_y": float(scale_x_y)})
    return boxes, scores


def anchor_generator(input, anchor_sizes=None, aspect_ratios=None, variance=(0.1, 0.1, 0.2, 0.2),
                     stride=None, offset=0.5, name=None):
    """Faster R-CNN's anchors for each cell of the feature map ``input``: ``(anchors,
    variances)``, each ``[H, W, len(aspect_ratios) * len(anchor_sizes), 4]``."""
    layer = "anchor_generator"
    check_variable(input, "input", layer)

    def floats(v, arg, n=None):
        vs = [v] if isinstance(v, (int, float)) else list(v or [])
        if not vs or (n is not None and len(vs) != n):
            raise ValueError(f"{layer}: argument {arg!r} must be "
                             f"{'a number or ' if n is None else ''}a list of "
                             f"{n or 'one or more'} numbers, got {v!r}")
        return [float(x) for x in vs]

    helper = LayerHelper(layer, name=name)
    anchors = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    var = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    helper.append_op(layer, inputs={"Input": [input]},
                     outputs={"Anchors": [anchors], "Variances": [var]},
                     attrs={"anchor_sizes": floats(anchor_sizes, "anchor_sizes"),
                            "aspect_ratios": floats(aspect_ratios, "aspect_ratios"),
                            "variances": floats(variance, "variance", 4),
                            "stride": floats(stride, "stride", 2), "offset": float(offset)})
    return anchors, var


def polygon_box_transform(input, name=None) -> Variable:
    """EAST's geometry offsets ``input [N, 2k, H, W]`` as corner coordinates: ``4 w - x`` in
    the even channels, ``4 h - y`` in the odd ones."""
    check_variable(input, "input", "polygon_box_transform")
    helper = LayerHelper("polygon_box_transform", name=name)
    out = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    helper.append_op("polygon_box_transform", inputs={"Input": [input]},
                     outputs={"Output": [out]})
    return out


def density_prior_box(input, image, densities=None, fixed_sizes=None, fixed_ratios=None,
                      variance=(0.1, 0.1, 0.2, 0.2), clip=False, steps=(0.0, 0.0), offset=0.5,
                      flatten_to_2d=False, name=None):
    """Densely placed prior boxes for each cell of ``input`` over ``image``: ``(boxes,
    variances)``, ``[H, W, priors, 4]`` (``[H W priors, 4]`` with ``flatten_to_2d``)."""
    layer = "density_prior_box"
    check_variable(input, "input", layer)
    check_variable(image, "image", layer)
    if not densities or not fixed_sizes or not fixed_ratios or \
            len(densities) != len(fixed_sizes):
        raise ValueError(f"{layer}: give densities and fixed_sizes of one length, and "
                         f"fixed_ratios, got {densities}, {fixed_sizes}, {fixed_ratios}")
    steps = [float(s) for s in steps]
    helper = LayerHelper(layer, name=name)
    boxes = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    var = helper.create_variable_for_type_inference(input.dtype, stop_gradient=True)
    helper.append_op(layer, inputs={"Input": [input], "Image": [image]},
                     outputs={"Boxes": [boxes], "Variances": [var]},
                     attrs={"densities": [int(d) for d in densities],
                            "fixed_sizes": [float(v) for v in fixed_sizes],
                            "fixed_ratios": [float(v) for v in fixed_ratios],
                            "variances": [float(v) for v in variance], "clip": bool(clip),
                            "step_w": steps[0], "step_h": steps[1], "offset": float(offset),
                            "flatten_to_2d": bool(flatten_to_2d)})
    return boxes, var


def hash(input, hash_size, num_hash=1, name=None) -> Variable:  # noqa: A001 - Fluid's name
    """For each row of int ids ``input [N, K]``, ``num_hash`` hashes of the row (XXH64 of its
    bytes with seeds 0 .. num_hash - 1) modulo ``hash_size``: ``[N, num_hash, 1]`` of
    ``input``'s dtype, as Fluid's ``hash`` op."""
    check_variable(input, "input", "hash")
    check_dtype(input, "input", ("int32", "int64"), "hash")
    if len(input.shape) != 2:
        raise ValueError(f"hash: input must be 2-D [N, K], got shape {list(input.shape)}")
    for arg, v in (("hash_size", hash_size), ("num_hash", num_hash)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"hash: argument {arg!r} must be an int >= 1, got {v!r}")
    out = _fluid_op("hash", {"X": input}, {"num_hash": num_hash, "mod_by": hash_size},
                    input.dtype, name)
    out.stop_gradient = True
    return out


def similarity_focus(input, axis, indexes, name=None) -> Variable:
    """Fluid's similarity focus mask of ``input [N, C, A, B]`` (same shape): for each of
    ``indexes`` along ``axis`` (1, 2 or 3), the 2-D slice's largest value, then the largest
    among those in other rows and columns, ... marked 1; the masks OR-ed and broadcast along
    ``axis``."""
    check_variable(input, "input", "similarity_focus")
    check_dtype(input, "input", ("float32", "float64"), "similarity_focus")
    if len(input.shape) != 4 or axis not in (1, 2, 3):
        raise ValueError(f"similarity_focus: expected a 4-D input and axis 1, 2 or 3, got "
                         f"{list(input.shape)} and {axis!r}")
    if isinstance(indexes, int):
        indexes = [indexes]
    if not isinstance(indexes, (list, tuple)) or not indexes:
        raise ValueError(f"similarity_focus: argument 'indexes' must be a non-empty list of "
                         f"ints, got {indexes!r}")
    out = _fluid_op("similarity_focus", {"X": input},
                    {"axis": int(axis), "indexes": [int(i) for i in indexes]}, input.dtype,
                    name)
    out.stop_gradient = True
    return out


def bipartite_match(dist_matrix, match_type=None, dist_threshold=None, name=None):
    """``(match_indices, match_distance)``, each ``[N, K]``: for each instance (LoD sequence
    of rows) of ``dist_matrix`` ``[sum rows, K]``, the row each of the K columns is matched to
    (int32, -1: none) and the distance, by greedy bipartite matching; with ``match_type``
    ``'per_prediction'`` each column left unmatched takes its best row at or above
    ``dist_threshold`` (default 0.5)."""
    check_variable(dist_matrix, "dist_matrix", "bipartite_match")
    check_dtype(dist_matrix, "dist_matrix", ("float32", "float64"), "bipartite_match")
    match_type = match_type or "bipartite"
    if match_type not in ("bipartite", "per_prediction"):
        raise ValueError(f"bipartite_match: match_type must be 'bipartite' or "
                         f"'per_prediction', got {match_type!r}")
    helper = LayerHelper("bipartite_match", name=name)
    idx = helper.create_variable_for_type_inference("int32", stop_gradient=True)
    dist = helper.create_variable_for_type_inference(dist_matrix.dtype, stop_gradient=True)
    helper.append_op("bipartite_match", inputs={"DistMat": [dist_matrix]},
                     outputs={"ColToRowMatchIndices": [idx], "ColToRowMatchDist": [dist]},
                     attrs={"match_type": match_type,
                            "dist_threshold": 0.5 if dist_threshold is None
                            else float(dist_threshold)})
    return idx, dist


def target_assign(input, matched_indices, negative_indices=None, mismatch_value=None,
                  name=None):
    """``(out [N, P, K], out_weight [N, P, 1])``: for each instance ``i`` (LoD sequence of
    ``input [M, P, K]``) and column ``j``, the row ``matched_indices[i, j]`` of the instance
    (weight 1), or ``mismatch_value`` (weight 0) where that index is -1; then
    ``mismatch_value`` with weight 1 at the instance's ``negative_indices`` (int32 LoD)."""
    check_variable(input, "input", "target_assign")
    check_variable(matched_indices, "matched_indices", "target_assign")
    check_dtype(matched_indices, "matched_indices", ("int32",), "target_assign")
    helper = LayerHelper("target_assign", name=name)
    out = helper.create_variable_for_type_inference(input.dtype)
    weight = helper.create_variable_for_type_inference("float32")
    inputs = {"X": [input], "MatchIndices": [matched_indices]}
    if negative_indices is not None:
        check_variable(negative_indices, "negative_indices", "target_assign")
        inputs["NegIndices"] = [negative_indices]
    helper.append_op("target_assign", inputs=inputs,
                     outputs={"Out": [out], "OutWeight": [weight]},
                     attrs={"mismatch_value": int(mismatch_value or 0)})
    return out, weight
