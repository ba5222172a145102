"""Utility layers of Fluid 1.8: ``l2_normalize``, ``uniform_random``, ``gaussian_random``,
``linspace``, ``isfinite``, ``has_nan``, ``has_inf``, ``Print``, ``autoincreased_step_counter``,
and 2.x's ``log_softmax``.

Each appends the legacy op Fluid appends (``l2_normalize`` -> ``norm``, ``has_nan`` ->
``isnan``, ``has_inf`` -> ``isinf``, ``Print`` -> ``print``); see ``pdjit.ops.misc`` and
``pdjit.ops.creation`` for the semantics.
"""
from __future__ import annotations

from pdjit.framework import dtypes
from pdjit.framework.program import Variable
from pdjit.layers.layer_helper import LayerHelper, check_dtype, check_variable

__all__ = ["l2_normalize", "log_softmax", "uniform_random", "gaussian_random", "linspace",
           "isfinite", "has_nan", "has_inf", "Print", "autoincreased_step_counter", "is_empty",
           "uniform_random_batch_size_like", "gaussian_random_batch_size_like"]

_FLOATS = ("float16", "float32", "float64")
_LINSPACE_DTYPES = ("int32", "int64", "float32", "float64")


def l2_normalize(x, axis, epsilon=1e-12, name=None) -> Variable:
    """``x / sqrt(sum(x^2 along axis) + epsilon)`` (the ``norm`` op; a 1-D ``x`` normalises
    along axis 0 whatever ``axis`` says, as Fluid 1.8)."""
    check_variable(x, "x", "l2_normalize")
    check_dtype(x, "x", _FLOATS, "l2_normalize")
    if len(x.shape) == 1:
        axis = 0
    axis = 1 if axis is None else int(axis)
    if not -len(x.shape) <= axis < max(len(x.shape), 1):
        raise ValueError(f"l2_normalize: axis {axis} is out of range for x of shape "
                         f"{list(x.shape)}")
    helper = LayerHelper("l2_normalize", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    norm = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("norm", inputs={"X": [x]}, outputs={"Out": [out], "Norm": [norm]},
                     attrs={"axis": axis, "epsilon": float(epsilon)})
    return out


def log_softmax(x, axis=-1, dtype=None, name=None) -> Variable:
    """``log(softmax(x))`` along ``axis`` (Paddle 2.x's ``nn.functional.log_softmax``);
    ``dtype`` casts ``x`` first."""
    check_variable(x, "x", "log_softmax")
    if dtype is not None and dtypes.to_numpy(dtype) != x.dtype:
        from pdjit.layers.tensor import cast
        x = cast(x, dtype)
    check_dtype(x, "x", _FLOATS, "log_softmax")
    helper = LayerHelper("log_softmax", name=name)
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op("log_softmax", inputs={"X": [x]}, outputs={"Out": [out]},
                     attrs={"axis": int(axis)})
    return out


def _shape_args(shape, layer: str, helper: LayerHelper) -> tuple:
    """(inputs, shape attribute) for a creation op: ``shape`` a list/tuple of ints and 1-element
    int Variables, or an int Variable holding the whole shape."""
    if isinstance(shape, Variable):
        check_dtype(shape, "shape", ("int32", "int64"), layer)
        return {"ShapeTensor": [shape]}, []
    if not isinstance(shape, (list, tuple)) or not shape:
        raise TypeError(f"{layer}: shape must be a non-empty list or tuple of ints (or a "
                        f"Variable), got {shape!r}")
    if not any(isinstance(d, Variable) for d in shape):
        dims = []
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int) or d < -1:
                raise TypeError(f"{layer}: shape must hold ints >= 0 (or -1), got {shape!r}")
            dims.append(int(d))
        return {}, dims
    from pdjit.layers.tensor import fill_constant
    items = []
    for d in shape:
        if isinstance(d, Variable):
            check_dtype(d, "shape", ("int32", "int64"), layer)
            items.append(d)
        elif isinstance(d, int) and not isinstance(d, bool) and d >= 0:
            items.append(fill_constant([1], "int64", d))
        else:
            raise TypeError(f"{layer}: shape items must be ints >= 0 or Variables, got {d!r}")
    return {"ShapeTensorList": items}, [-1] * len(items)


def _random(op: str, shape, dtype, attrs: dict, name) -> Variable:
    if dtypes.dtype_str(dtypes.to_numpy(dtype)) not in _FLOATS:
        raise TypeError(f"{op}: dtype must be float16, float32 or float64, got {dtype!r}")
    helper = LayerHelper(op, name=name)
    inputs, dims = _shape_args(shape, op, helper)
    out = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    helper.append_op(op, inputs=inputs, outputs={"Out": [out]},
                     attrs={"shape": dims, "dtype": dtypes.to_code(dtype), **attrs})
    out.stop_gradient = True
    return out


def uniform_random(shape, dtype="float32", min=-1.0, max=1.0, seed=0,  # noqa: A002 - Fluid's
                   name=None) -> Variable:
    """A tensor of ``shape`` drawn from Uniform[min, max); a non-zero ``seed`` draws the same
    numbers every run, 0 follows the program's random seed."""
    if float(min) > float(max):
        raise ValueError(f"uniform_random: min must be <= max, got min={min}, max={max}")
    return _random("uniform_random", shape, dtype,
                   {"min": float(min), "max": float(max), "seed": int(seed)}, name)


def gaussian_random(shape, mean=0.0, std=1.0, seed=0, dtype="float32", name=None) -> Variable:
    """A tensor of ``shape`` drawn from Normal(mean, std); ``seed`` as in uniform_random."""
    if float(std) < 0:
        raise ValueError(f"gaussian_random: std must be >= 0, got {std}")
    return _random("gaussian_random", shape, dtype,
                   {"mean": float(mean), "std": float(std), "seed": int(seed)}, name)


def linspace(start, stop, num, dtype=None, name=None) -> Variable:
    """``num`` evenly spaced values from ``start`` to ``stop`` (both included), a 1-D tensor of
    ``dtype`` (default float32). ``start``/``stop`` are numbers or 1-element Variables (cast to
    ``dtype``), ``num`` an int or a 1-element int32 Variable."""
    from pdjit.layers.tensor import cast, fill_constant
    dtype = "float32" if dtype is None else dtype
    if dtypes.dtype_str(dtypes.to_numpy(dtype)) not in _LINSPACE_DTYPES:
        raise TypeError(f"linspace: dtype must be int32, int64, float32 or float64, got "
                        f"{dtype!r}")
    bounds = []
    for arg, v in (("start", start), ("stop", stop)):
        if isinstance(v, Variable):
            v = v if v.dtype == dtypes.to_numpy(dtype) else cast(v, dtype)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            v = fill_constant([1], dtype, v)
        else:
            raise TypeError(f"linspace: {arg} must be a number or a Variable, got "
                            f"{type(v).__name__}")
        bounds.append(v)
    known = None
    if isinstance(num, Variable):
        check_dtype(num, "num", ("int32", "int64"), "linspace")
        n = num if num.dtype == dtypes.to_numpy("int32") else cast(num, "int32")
    elif isinstance(num, int) and not isinstance(num, bool):
        if num < 0:
            raise ValueError(f"linspace: num must be >= 0, got {num}")
        known, n = num, fill_constant([1], "int32", num)
    else:
        raise TypeError(f"linspace: num must be an int or a Variable, got {type(num).__name__}")
    helper = LayerHelper("linspace", name=name)
    out = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    helper.append_op("linspace", inputs={"Start": [bounds[0]], "Stop": [bounds[1]], "Num": [n]},
                     outputs={"Out": [out]}, attrs={"dtype": dtypes.to_code(dtype)})
    if known is not None:
        out.shape = (known,)
    out.stop_gradient = True
    return out


def _check(op: str, layer: str, x) -> Variable:
    check_variable(x, "x", layer)
    helper = LayerHelper(layer)
    out = helper.create_variable_for_type_inference("bool", stop_gradient=True)
    helper.append_op(op, inputs={"X": [x]}, outputs={"Out": [out]})
    out.stop_gradient = True
    return out


def isfinite(x) -> Variable:
    """One bool (shape [1]): whether every element of ``x`` is finite (Fluid 1.x)."""
    return _check("isfinite", "isfinite", x)


def has_nan(x) -> Variable:
    """One bool (shape [1]): whether some element of ``x`` is NaN (the ``isnan`` op)."""
    return _check("isnan", "has_nan", x)


def has_inf(x) -> Variable:
    """One bool (shape [1]): whether some element of ``x`` is +-inf (the ``isinf`` op)."""
    return _check("isinf", "has_inf", x)


_PHASES = ("forward", "backward", "both")


def Print(input, first_n=-1, message=None, summarize=20,  # noqa: N802 - Fluid's name
          print_tensor_name=True, print_tensor_type=True, print_tensor_shape=True,
          print_tensor_lod=True, print_phase="both") -> Variable:
    """Print ``input`` to standard output each time the program runs it (the first
    ``first_n`` times; -1: always), in compiled mode too; returns a Variable holding the same
    value, through which gradients flow (and are printed when ``print_phase`` is 'backward'
    or 'both'). ``summarize``: how many values to show (-1: all)."""
    check_variable(input, "input", "Print")
    if not isinstance(print_phase, str) or print_phase.lower() not in _PHASES:
        raise ValueError(f"Print: print_phase must be 'forward', 'backward' or 'both', got "
                         f"{print_phase!r}")
    helper = LayerHelper("print")
    out = helper.create_variable_for_type_inference(input.dtype)
    helper.append_op("print", inputs={"In": [input]}, outputs={"Out": [out]},
                     attrs={"first_n": int(first_n), "summarize": int(summarize),
                            "message": message or "",
                            "print_tensor_name": bool(print_tensor_name),
                            "print_tensor_type": bool(print_tensor_type),
                            "print_tensor_shape": bool(print_tensor_shape),
                            "print_tensor_layout": True,
                            "print_tensor_lod": bool(print_tensor_lod),
                            "print_phase": print_phase.upper()})
    out.lod_level = input.lod_level
    out.stop_gradient = input.stop_gradient
    return out


def autoincreased_step_counter(counter_name=None, begin=1, step=1) -> Variable:
    """A persistable int64 ``[1]`` counter (``counter_name``, default ``@STEP_COUNTER@``) that
    an ``increment`` op at the start of the main program advances by ``step`` each run. It
    starts at ``begin - 1``, so the first run sees ``begin - 1 + step`` (``begin`` for the
    default step 1), as in Paddle. Asking again for a counter of the same name returns it (one
    increment per run), as Fluid 1.8 does; e.g. ``ExponentialMovingAverage``'s
    ``thres_steps``."""
    from pdjit.framework import registry
    from pdjit.layers.initializer import Constant
    name = "@STEP_COUNTER@" if counter_name is None else counter_name
    if not isinstance(name, str) or not name:
        raise TypeError(f"autoincreased_step_counter: counter_name must be a non-empty str, "
                        f"got {counter_name!r}")
    for what, v in (("begin", begin), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"autoincreased_step_counter: {what} must be an int, got {v!r}")
    helper = LayerHelper("global_step_counter")
    block = helper.main_program.global_block()
    if block.has_var(name):
        return block.var(name)
    counter = helper.create_global_variable(name=name, dtype="int64", shape=[1],
                                            persistable=True, stop_gradient=True)
    helper.set_variable_initializer(counter, Constant(float(begin - 1)))
    with helper.main_program._op_role_guard(registry.OP_ROLE_LRSCHED):
        block._prepend_op("increment", inputs={"X": [counter]}, outputs={"Out": [counter]},
                          attrs={"step": float(step)})
    counter.stop_gradient = True
    return counter


def is_empty(x, cond=None):
    """Whether ``x`` holds no element: a bool Variable (``[1]``, as Fluid 1.x declares it),
    into ``cond`` when given."""
    check_variable(x, "x", "is_empty")
    helper = LayerHelper("is_empty")
    if cond is None:
        cond = helper.create_variable_for_type_inference("bool", stop_gradient=True)
    else:
        check_variable(cond, "cond", "is_empty")
    helper.append_op("is_empty", inputs={"X": [x]}, outputs={"Out": [cond]})
    return cond


def _random_batch_size_like(op, input, shape, dtype, input_dim_idx, output_dim_idx, attrs):
    check_variable(input, "input", op)
    if not isinstance(shape, (list, tuple)) or not shape:
        raise TypeError(f"{op}: argument 'shape' must be a non-empty list of ints, got "
                        f"{shape!r}")
    helper = LayerHelper(op)
    out = helper.create_variable_for_type_inference(dtype, stop_gradient=True)
    helper.append_op(op, inputs={"Input": [input]}, outputs={"Out": [out]},
                     attrs={"shape": [int(d) for d in shape],
                            "input_dim_idx": int(input_dim_idx),
                            "output_dim_idx": int(output_dim_idx),
                            "dtype": dtypes.to_code(dtype), **attrs})
    return out


def uniform_random_batch_size_like(input, shape, dtype="float32", input_dim_idx=0,
                                   output_dim_idx=0, min=-1.0, max=1.0,  # noqa: A002
                                   seed=0) -> Variable:
    """A tensor of ``shape`` drawn from Uniform[min, max), its dim ``output_dim_idx`` the size
    of ``input``'s dim ``input_dim_idx`` (the batch); ``seed`` as in uniform_random."""
    if float(min) > float(max):
        raise ValueError(f"uniform_random_batch_size_like: min must be <= max, got min={min}, "
                         f"max={max}")
    return _random_batch_size_like("uniform_random_batch_size_like", input, shape, dtype,
                                   input_dim_idx, output_dim_idx,
                                   {"min": float(min), "max": float(max), "seed": int(seed)})


def gaussian_random_batch_size_like(input, shape, input_dim_idx=0, output_dim_idx=0,
                                    mean=0.0, std=1.0, seed=0, dtype="float32") -> Variable:
    """A tensor of ``shape`` drawn from Normal(mean, std), its dim ``output_dim_idx`` the size
    of ``input``'s dim ``input_dim_idx`` (the batch); ``seed`` as in uniform_random."""
    if float(std) < 0:
        raise ValueError(f"gaussian_random_batch_size_like: std must be >= 0, got {std}")
    return _random_batch_size_like("gaussian_random_batch_size_like", input, shape, dtype,
                                   input_dim_idx, output_dim_idx,
                                   {"mean": float(mean), "std": float(std), "seed": int(seed)})
