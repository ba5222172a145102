"""Layers that create tensors: parameters, global variables, constants, copies, casts."""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes, unique_name
from pdjit.framework.program import Variable
from pdjit.layers.initializer import Constant
from pdjit.layers.layer_helper import LayerHelper, check_variable
from pdjit.layers.param_attr import ParamAttr

__all__ = ["create_tensor", "create_parameter", "create_global_var", "fill_constant",
           "fill_constant_batch_size_like", "assign", "cast", "zeros", "ones", "zeros_like",
           "ones_like", "range"]


def create_tensor(dtype, name=None, persistable: bool = False) -> Variable:
    helper = LayerHelper("create_tensor", name=name)
    return helper.create_variable(name=helper.name, dtype=dtype, persistable=persistable)


def create_parameter(shape, dtype, name=None, attr=None, is_bias: bool = False,
                     default_initializer=None) -> Variable:
    helper = LayerHelper("create_parameter", name=name)
    attr = ParamAttr._to_attr(attr) or ParamAttr()
    if attr.name is None and name is not None:
        attr.name = name
    return helper.create_parameter(attr, shape, dtype, is_bias, default_initializer)


def create_global_var(shape, value, dtype, persistable: bool = False, force_cpu: bool = False,
                      name=None) -> Variable:
    """A global variable filled with ``value`` by the startup program."""
    helper = LayerHelper("global_var", name=name)
    var = helper.create_global_variable(name=name or unique_name.generate("global_var"),
                                        shape=shape, dtype=dtype, persistable=persistable,
                                        stop_gradient=True)
    helper.set_variable_initializer(var, Constant(value, force_cpu))
    return var


def fill_constant(shape, dtype, value, force_cpu: bool = False, out=None) -> Variable:
    helper = LayerHelper("fill_constant")
    if out is None:
        out = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    attrs = {"shape": [int(d) for d in shape], "dtype": dtypes.to_code(dtype),
             "value": float(value), "force_cpu": force_cpu}
    d = dtypes.to_numpy(dtype)
    if d.kind in "iub" and float(value) != float(np.float32(value)):
        attrs["str_value"] = str(int(value))  # FLOAT cannot hold it exactly
    helper.append_op("fill_constant", outputs={"Out": [out]}, attrs=attrs)
    out.stop_gradient = True
    return out


def fill_constant_batch_size_like(input, shape, dtype, value, input_dim_idx: int = 0,
                                  output_dim_idx: int = 0, force_cpu: bool = False) -> Variable:
    check_variable(input, "input", "fill_constant_batch_size_like")
    helper = LayerHelper("fill_constant_batch_size_like")
    out = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    helper.append_op("fill_constant_batch_size_like", inputs={"Input": [input]},
                     outputs={"Out": [out]},
                     attrs={"shape": [int(d) for d in shape], "dtype": dtypes.to_code(dtype),
                            "value": float(value), "input_dim_idx": input_dim_idx,
                            "output_dim_idx": output_dim_idx, "force_cpu": force_cpu})
    return out


def assign(input, output=None) -> Variable:
    """Copy a Variable (``assign`` op); a NumPy array or number becomes a constant."""
    helper = LayerHelper("assign")
    if isinstance(input, Variable):
        if output is None:
            output = helper.create_variable(  # a tensor array's copy is a tensor array
                name=unique_name.generate(f"{helper.name}.tmp"), dtype=input.dtype,
                type=input.type)
        helper.append_op("assign", inputs={"X": [input]}, outputs={"Out": [output]})
        return output
    arr = np.asarray(input)
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)  # Fluid's assign turns float64 arrays into float32
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"assign: cannot assign a value of dtype {arr.dtype}")
    if output is None:
        output = helper.create_variable_for_type_inference(arr.dtype)
    values = arr.reshape(-1).tolist()
    helper.append_op("assign_value", outputs={"Out": [output]},
                     attrs={"shape": list(arr.shape), "dtype": dtypes.to_code(arr.dtype),
                            "values": [bool(v) if arr.dtype.kind == "b" else v for v in values]})
    return output


def cast(x, dtype) -> Variable:
    check_variable(x, "x", "cast")
    helper = LayerHelper("cast")
    out = helper.create_variable_for_type_inference(dtype)
    helper.append_op("cast", inputs={"X": [x]}, outputs={"Out": [out]},
                     attrs={"in_dtype": dtypes.to_code(x.dtype),
                            "out_dtype": dtypes.to_code(dtype)})
    return out


def zeros(shape, dtype, force_cpu: bool = False) -> Variable:
    return fill_constant(shape, dtype, 0.0, force_cpu)


def ones(shape, dtype, force_cpu: bool = False) -> Variable:
    return fill_constant(shape, dtype, 1.0, force_cpu)


def zeros_like(x, out=None) -> Variable:
    """Zeros of ``x``'s shape and dtype (``fill_zeros_like``, as Fluid 1.8)."""
    check_variable(x, "x", "zeros_like")
    helper = LayerHelper("zeros_like")
    if out is None:
        out = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    helper.append_op("fill_zeros_like", inputs={"X": [x]}, outputs={"Out": [out]})
    out.stop_gradient = True
    return out


def ones_like(x, out=None) -> Variable:
    """Ones of ``x``'s shape and dtype (``fill_any_like`` with value 1, as Fluid 1.8)."""
    check_variable(x, "x", "ones_like")
    helper = LayerHelper("ones_like")
    if out is None:
        out = helper.create_variable_for_type_inference(x.dtype, stop_gradient=True)
    helper.append_op("fill_any_like", inputs={"X": [x]}, outputs={"Out": [out]},
                     attrs={"value": 1.0})
    out.stop_gradient = True
    return out


def range(start, end, step, dtype) -> Variable:  # noqa: A001 - Fluid's name
    """``start, start + step, ...`` up to ``end`` (excluded), a 1-D tensor of ``dtype``. Each
    bound may be a number or a 1-element Variable (cast to ``dtype`` when it differs)."""
    helper = LayerHelper("range")
    bounds = []
    for arg, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, Variable):
            if v.dtype != dtypes.to_numpy(dtype):
                v = cast(v, dtype)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            v = fill_constant([1], dtype, v)
        else:
            raise TypeError(f"range: {arg} must be a number or a Variable, got "
                            f"{type(v).__name__}")
        bounds.append(v)
    out = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    helper.append_op("range", inputs={"Start": [bounds[0]], "End": [bounds[1]],
                                      "Step": [bounds[2]]}, outputs={"Out": [out]})
    out.stop_gradient = True
    return out
