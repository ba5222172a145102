"""``LayerHelper``: what every layer function uses to create variables, parameters and ops.

A layer gets a unique name (``fc_0``), creates its temporaries (``fc_0.tmp_0``) in the current
block of the default main program, its parameters (``fc_0.w_0``) in the global block with their
initialising ops in the default startup program, and appends its ops (shapes inferred on append).
"""
from __future__ import annotations

from pdjit.framework import dtypes, registry, unique_name
from pdjit.framework.program import (
    Parameter,
    Variable,
    default_main_program,
    default_startup_program,
)
from pdjit.framework.scalars import declare_fluid1_scalars
from pdjit.layers.initializer import Constant, Xavier
from pdjit.layers.param_attr import ParamAttr


def check_variable(value, arg: str, layer: str) -> Variable:
    """``value`` if it is a Variable, else a TypeError naming the layer and the argument."""
    if not isinstance(value, Variable):
        raise TypeError(f"{layer}: argument {arg!r} must be a Variable, got "
                        f"{type(value).__name__}")
    return value


def check_dtype(value: Variable, arg: str, allowed, layer: str) -> None:
    if value.dtype is None or dtypes.dtype_str(value.dtype) not in allowed:
        raise TypeError(f"{layer}: argument {arg!r} must have dtype {' or '.join(allowed)}, got "
                        f"{value.dtype}")


class LayerHelper:
    def __init__(self, layer_type: str, **kwargs):
        self.layer_type = layer_type
        self.kwargs = kwargs
        name = kwargs.get("name")
        self.name = unique_name.generate(layer_type) if name is None else name

    @property
    def main_program(self):
        return default_main_program()

    @property
    def startup_program(self):
        return default_startup_program()

    @property
    def block(self):
        return self.main_program.current_block()

    # -- inputs ----------------------------------------------------------------------------------
    def multiple_input(self, input_param_name: str = "input") -> list:
        inputs = self.kwargs.get(input_param_name, [])
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if not inputs:
            raise ValueError(f"{self.layer_type}: {input_param_name!r} must not be empty")
        for x in inputs:
            check_variable(x, input_param_name, self.layer_type)
        return inputs

    def input(self, input_param_name: str = "input") -> Variable:
        inputs = self.multiple_input(input_param_name)
        if len(inputs) != 1:
            raise ValueError(f"{self.layer_type}: expected one {input_param_name!r}, got "
                             f"{len(inputs)}")
        return inputs[0]

    def input_dtype(self, input_param_name: str = "input"):
        inputs = self.multiple_input(input_param_name)
        dtype = inputs[0].dtype
        for x in inputs[1:]:
            if x.dtype != dtype:
                raise TypeError(f"{self.layer_type}: all of {input_param_name!r} must have one "
                                f"dtype: expected {dtype}, got {x.dtype} for {x.name!r}")
        return dtype

    @property
    def param_attr(self):
        return ParamAttr._to_attr(self.kwargs.get("param_attr"), self.layer_type, "param_attr")

    @property
    def bias_attr(self):
        attr = ParamAttr._to_attr(self.kwargs.get("bias_attr"), self.layer_type, "bias_attr")
        return None if attr is False else attr

    # -- variables -------------------------------------------------------------------------------
    def create_variable_for_type_inference(self, dtype=None,
                                           stop_gradient: bool = False) -> Variable:
        return self.block.create_var(name=unique_name.generate(f"{self.name}.tmp"),
                                     dtype=dtype if dtype is not None else "float32",
                                     stop_gradient=stop_gradient)

    def create_variable(self, **kwargs) -> Variable:
        return self.block.create_var(**kwargs)

    def create_global_variable(self, persistable: bool = False, **kwargs) -> Variable:
        kwargs.setdefault("name", unique_name.generate(f"{self.name}.tmp"))
        return self.main_program.global_block().create_var(persistable=persistable, **kwargs)

    def create_parameter(self, attr, shape, dtype, is_bias: bool = False,
                         default_initializer=None) -> Parameter | None:
        """A parameter in the main program and its initialising op in the startup program.

        Weights default to Xavier, biases to zeros (Fluid's defaults). ``attr=False``: none.
        """
        if attr is False:
            return None
        attr = ParamAttr._to_attr(attr) if not isinstance(attr, ParamAttr) else attr
        shape = [int(d) for d in shape]
        if any(d < 0 for d in shape):
            raise ValueError(f"{self.layer_type}: parameter shape {shape} has unknown dims; the "
                             f"input's feature dims must be known when the layer is built")
        name = attr.name or unique_name.generate(f"{self.name}.{'b' if is_bias else 'w'}")
        init = attr.initializer or default_initializer or (Constant(0.0) if is_bias else Xavier())
        main_block = self.main_program.global_block()
        if main_block.has_var(name):
            existing = main_block.var(name)
            if list(existing.shape) != shape:
                raise ValueError(f"{self.layer_type}: parameter {name!r} exists with shape "
                                 f"{list(existing.shape)}, expected {shape}")
            return existing
        param = main_block.create_parameter(name, shape, dtype, initializer=init,
                                            **attr._param_kwargs())
        start_block = self.startup_program.global_block()
        if not start_block.has_var(name):
            svar = start_block.create_var(name=name, shape=shape, dtype=dtype, persistable=True)
            init(svar, start_block)
        return param

    def set_variable_initializer(self, var: Variable, initializer) -> Variable:
        """Declare ``var`` (persistable) in the startup program and initialise it there."""
        start_block = self.startup_program.global_block()
        svar = start_block.create_var(name=var.name, shape=var.shape, dtype=var.dtype,
                                      type=var.type, lod_level=var.lod_level, persistable=True)
        initializer(svar, start_block)
        return var

    # -- ops ---------------------------------------------------------------------------------------
    def append_op(self, *args, **kwargs):
        """Append an op; a scalar result gets Fluid 1.x's declared shape ``[1]``
        (``pdjit.framework.scalars``)."""
        op = self.block.append_op(*args, **kwargs)
        declare_fluid1_scalars(op)
        return op

    def append_bias_op(self, input_var: Variable, dim_start: int = 1, dim_end=None) -> Variable:
        bias_attr = self.bias_attr
        if bias_attr is None:
            return input_var
        size = list(input_var.shape[dim_start:dim_end])
        b = self.create_parameter(bias_attr, size, input_var.dtype, is_bias=True)
        out = self.create_variable_for_type_inference(input_var.dtype)
        self.append_op("elementwise_add", inputs={"X": [input_var], "Y": [b]},
                       outputs={"Out": [out]}, attrs={"axis": dim_start})
        return out

    def append_activation(self, input_var: Variable, act=None) -> Variable:
        """Apply ``act`` (an op type such as 'relu', or {'type': ..., attrs...}); None: identity."""
        act = act if act is not None else self.kwargs.get("act")
        if act is None:
            return input_var
        attrs = {}
        if isinstance(act, dict):
            attrs = {k: v for k, v in act.items() if k != "type"}
            act = act["type"]
        if not isinstance(act, str) or registry.lookup(act) is None:
            raise ValueError(f"{self.layer_type}: unknown activation {act!r}")
        out = self.create_variable_for_type_inference(input_var.dtype)
        self.append_op(act, inputs={"X": [input_var]}, outputs={"Out": [out]}, attrs=attrs)
        return out
