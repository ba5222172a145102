"""Ops that create values: constants (fill_constant, fill_constant_batch_size_like,
fill_any_like, assign_value), ranges (range), copies, and the random initialisers.

Random ops draw from pdjit's one stream (``pdjit.framework.random``): element ``i`` of the
output is a pure function of the op's key and ``i``, so every executor draws the same numbers.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework import random as prandom
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    COPIES,
    ELEMENTWISE,
    FILLS,
    OPAQUE,
    RANDOM,
    Bool,
    Float,
    Float64s,
    Floats,
    GradOpSpec,
    Int,
    Ints,
    Longs,
    Opaque,
    Passthrough,
    RowWise,
    Scalars,
    Str,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import norm_axis, src_literal

_DTYPE_CODES = tuple(dtypes.to_code(d) for d in
                     ("bool", "int32", "int64", "float16", "float32", "float64", "uint8", "int8",
                      "int16"))
_FLOAT_CODES = tuple(dtypes.to_code(d) for d in ("float16", "float32", "float64"))


def _np_dtype(code) -> np.dtype:
    try:
        return dtypes.to_numpy(code)
    except TypeError as e:
        raise ShapeMismatch(f"dtype: {e}") from None


def _shape_from(shape, ShapeTensor=None, ShapeTensorList=None) -> tuple:
    if ShapeTensor is not None:
        return tuple(int(d) for d in np.asarray(ShapeTensor).reshape(-1))
    if ShapeTensorList:
        return tuple(int(np.asarray(t).reshape(-1)[0]) for t in ShapeTensorList)
    return tuple(int(d) for d in shape)


def _check_run_shape(shape) -> tuple:
    if any(d < 0 for d in shape):
        raise ShapeMismatch(f"shape must be fully known when the op runs, got {list(shape)}")
    return shape


def _int_tensor(meta, what: str) -> None:
    """A shape input must hold integers. (Its size is not checked: a list entry computed by
    an op whose output shape depends on values, known only when it ran, would be refused in
    reference mode and not inside a native step; its first element is the dim.)"""
    if meta.dtype is not None and np.dtype(meta.dtype).kind not in "iu":
        raise ShapeMismatch(f"{what} holds the output's dims: expected an int32 or int64 "
                            f"tensor, got {np.dtype(meta.dtype)}")


def _created_infer(shape, dtype, ShapeTensor=None, ShapeTensorList=None):
    if ShapeTensor is not None:
        _int_tensor(ShapeTensor, "ShapeTensor")
        n = ShapeTensor.shape[0] if ShapeTensor.shape else 1
        if n < 0:
            raise ShapeMismatch(f"ShapeTensor's length decides the output's rank, so it must be "
                                f"known when the program is built: expected shape [k], got "
                                f"{list(ShapeTensor.shape)}")
        return VarMeta((-1,) * n, _np_dtype(dtype))
    if ShapeTensorList:
        for i, t in enumerate(ShapeTensorList):
            _int_tensor(t, f"ShapeTensorList[{i}]")
        return VarMeta((-1,) * len(ShapeTensorList), _np_dtype(dtype))
    if any(int(d) < -1 for d in shape):
        raise ShapeMismatch(f"shape: dims must be >= 0 (or -1), got {list(shape)}")
    return VarMeta(tuple(shape), _np_dtype(dtype))


# ---- fill_constant -----------------------------------------------------------------------------
def _fill_infer(ValueTensor=None, ShapeTensor=None, ShapeTensorList=None, *, shape, dtype, **_):
    return {"Out": _created_infer(shape, dtype, ShapeTensor, ShapeTensorList)}


def _str_value_problem(text) -> str | None:
    """Why ``str_value`` (a number as text, "" for none) is not a fill value, or None."""
    if not text:
        return None
    try:
        float(text)
    except (TypeError, ValueError):
        return f"expected a number as text (or \"\" to use 'value'), got {text!r}"
    return None


def _fill_value(value, str_value, dtype: np.dtype):
    if str_value:
        problem = _str_value_problem(str_value)
        if problem:
            raise ShapeMismatch(f"attribute 'str_value': {problem}")
        v = float(str_value)
        if dtype.kind in "iu" and not np.isfinite(v):
            raise ShapeMismatch(f"attribute 'str_value': {str_value!r} is not an integer of "
                                f"dtype {dtype}")
        return v if dtype.kind == "f" else int(v) if dtype.kind in "iu" else bool(v)
    return value


def _fill_ref(ValueTensor=None, ShapeTensor=None, ShapeTensorList=None, *, shape, dtype, value,
              str_value):
    dt = _np_dtype(dtype)
    shp = _check_run_shape(_shape_from(shape, ShapeTensor, ShapeTensorList))
    v = ValueTensor.reshape(-1)[0] if ValueTensor is not None else _fill_value(value, str_value, dt)
    return {"Out": np.full(shp, v, dtype=dt)}


def _fill_lower(ctx):
    """An allocation and a fill. Dims from ``ShapeTensor`` / ``ShapeTensorList`` and the value
    from ``ValueTensor`` are read at run time (the LSTM's initial state: shape -> slice ->
    fill_constant(ShapeTensorList)); a negative dim there fails the allocation and the
    reference names the op."""
    dt = _np_dtype(ctx.attrs["dtype"])
    lines = []
    if ctx.has_input("ShapeTensor"):
        st = ctx.shape("ShapeTensor")
        n = st[0] if st else 1
        if n < 0:
            return None
        t = ctx.tmp("dims")
        lines.append(f"{t} = {ctx.inp('ShapeTensor')}.reshape({ctx.inp('ShapeTensor')}.size)")
        dims = [f"{t}[{i}]" for i in range(n)]
    elif ctx.has_input("ShapeTensorList"):
        dims = []
        for i in range(len(ctx.op.input("ShapeTensorList"))):
            v = ctx.inp("ShapeTensorList", i)
            dims.append(f"{v}.reshape({v}.size)[0]")
    else:
        shape = [int(d) for d in ctx.attrs["shape"]]
        if any(d < 0 for d in shape):
            return None
        dims = [str(d) for d in shape]
    out, T = ctx.out("Out"), ctx.T("Out")
    if ctx.has_input("ValueTensor"):
        vt = ctx.inp("ValueTensor")
        value = f"{T}({vt}.reshape({vt}.size)[0])"
    else:
        value = f"{T}({src_literal(_fill_value(ctx.attrs['value'], ctx.attrs['str_value'], dt))})"
    names = []
    for d in dims:  # each run-time dim an int of its own (a tuple of them sizes the array)
        if d.isdigit():
            names.append(d)
            continue
        names.append(ctx.tmp("d"))
        lines.append(f"{names[-1]} = int({d})")
    return lines + [f"{out} = np.empty({ctx.tuple_src(names)}, {T})",
                    f"{out}.reshape({out}.size)[:] = {value}"]


register_op(
    "fill_constant", inputs=["ValueTensor?", "ShapeTensor?", "ShapeTensorList*?"],
    outputs=["Out"],
    attrs={"dtype": Int(5, choices=_DTYPE_CODES), "shape": Longs([]),
           "value": Float(0.0, low=-4.0, high=4.0),
           "str_value": Str("", valid=_str_value_problem), "force_cpu": Bool(False),
           "place_type": Int(-1)},
    traits=[OPAQUE, FILLS], infer_shape=_fill_infer, reference=_fill_ref,
    emit=Opaque(_fill_lower, host=True), grad=None,
    doc="Out = a tensor of `shape` filled with `value` (or `str_value`, exactly).")


# ---- fill_constant_batch_size_like -----------------------------------------------------------
def _fcbsl_infer(Input, *, shape, input_dim_idx, output_dim_idx, dtype, **_):
    out = list(shape)
    i = norm_axis(input_dim_idx, Input.ndim, "input_dim_idx")
    o = norm_axis(output_dim_idx, len(out), "output_dim_idx")
    out[o] = Input.shape[i]
    return {"Out": VarMeta(tuple(out), _np_dtype(dtype))}


def _fcbsl_ref(Input, *, shape, input_dim_idx, output_dim_idx, dtype, value, str_value):
    dt = _np_dtype(dtype)
    out = list(shape)
    out[output_dim_idx % len(out)] = Input.shape[input_dim_idx % max(Input.ndim, 1)]
    return {"Out": np.full(_check_run_shape(tuple(out)), _fill_value(value, str_value, dt), dt)}


def _fcbsl_lower(ctx):
    """An allocation of ``shape`` with Input's dim at output_dim_idx, and a fill."""
    a = ctx.attrs
    shape = [str(int(d)) for d in a["shape"]]
    r = ctx.rank("Input")
    if not shape or r == 0 or not -len(shape) <= a["output_dim_idx"] < len(shape) \
            or not -r <= a["input_dim_idx"] < r:
        return None
    shape[a["output_dim_idx"] % len(shape)] = \
        f"{ctx.inp('Input')}.shape[{a['input_dim_idx'] % r}]"
    if any(d.startswith("-") for d in shape):
        return None
    dt = _np_dtype(a["dtype"])
    out, T = ctx.out("Out"), ctx.T("Out")
    value = src_literal(_fill_value(a["value"], a["str_value"], dt))
    return [f"{out} = np.empty({ctx.tuple_src(shape)}, {T})",
            f"{out}.reshape({out}.size)[:] = {T}({value})"]


register_op(
    "fill_constant_batch_size_like", inputs=["Input"], outputs=["Out"],
    attrs={"shape": Ints(choices=([-1, 3], [-1], [2, -1, 4])), "input_dim_idx": Int(0),
           "output_dim_idx": Int(0),
           "dtype": Int(5, choices=_DTYPE_CODES), "value": Float(0.0),
           "str_value": Str("", valid=_str_value_problem),
           "force_cpu": Bool(False)},
    traits=[OPAQUE], infer_shape=_fcbsl_infer, reference=_fcbsl_ref,
    emit=Opaque(lambda ctx: _fcbsl_lower(ctx), host=True), grad=None,
    doc="Out = constant of `shape` whose dim output_dim_idx is Input's dim input_dim_idx.")


# ---- assign --------------------------------------------------------------------------------------
def _assign_grad(op):
    """Paddle's grad of ``assign``: an ``assign`` of ``Out@GRAD`` into ``X@GRAD``."""
    if not op.input("X"):
        return []  # an assign without X (its value set elsewhere) has nothing to differentiate
    return [GradOpSpec("assign", {"X": [grad_var_name(n) for n in op.output("Out")]},
                       {"Out": [grad_var_name(n) for n in op.input("X")]})]


def _assign_lower(ctx):
    """A copy of a dense tensor (fusion keeps tensor arrays and values set elsewhere out)."""
    if not ctx.has_input("X"):
        return None
    return [f"{ctx.out('Out')} = {ctx.inp('X')}.copy()"]


register_op(
    "assign", inputs=["X?"], outputs=["Out"], traits=[OPAQUE, COPIES], row_wise=RowWise(),
    infer_shape=lambda X=None: {"Out": X} if X is not None else {},
    reference=lambda X=None: {} if X is None else  # a tensor array (a list) is copied as one
    {"Out": list(X) if isinstance(X, list) else np.array(X, copy=True)},
    emit=Opaque(_assign_lower, host=True), grad=_assign_grad,
    doc="Out = a copy of X.",
    inference=lambda op: Passthrough("X", "Out") if op.input("X") else None)


# ---- random initialisers ----------------------------------------------------------------------
def _random_infer(ShapeTensor=None, ShapeTensorList=None, *, shape, dtype, **_):
    if _np_dtype(dtype).kind != "f":
        raise ShapeMismatch(f"dtype: expected a float type, got {_np_dtype(dtype)}")
    return {"Out": _created_infer(shape, dtype, ShapeTensor, ShapeTensorList)}


def _uniform_ref(ShapeTensor=None, ShapeTensorList=None, *, shape, dtype, min, max, ctx,
                 diag_num, diag_step, diag_val):
    shp = _check_run_shape(_shape_from(shape, ShapeTensor, ShapeTensorList))
    if min > max:
        raise ShapeMismatch(f"expected min <= max, got min={min}, max={max}")
    out = prandom.uniform(ctx.rng_key(), shp, min, max, _np_dtype(dtype))
    if diag_num > 0:  # Paddle's option: put diag_val on a strided diagonal of the flat array
        flat = out.reshape(-1)
        for i in range(diag_num):
            idx = i * diag_step + i
            if idx < flat.size:
                flat[idx] = diag_val
    return {"Out": out}


register_op(
    "uniform_random", inputs=["ShapeTensor?", "ShapeTensorList*?"], outputs=["Out"],
    attrs={"shape": Longs([]), "dtype": Int(5, choices=_FLOAT_CODES),
           "min": Float(-1.0, low=-4.0, high=0.0), "max": Float(1.0, low=0.0, high=4.0),
           "seed": Int(0), "diag_num": Int(0), "diag_step": Int(0), "diag_val": Float(1.0)},
    traits=[OPAQUE, RANDOM], infer_shape=_random_infer, reference=_uniform_ref,
    emit=Opaque(),
    grad=None, doc="Out ~ Uniform[min, max) from the run's random stream.")


def _gaussian_ref(ShapeTensor=None, ShapeTensorList=None, *, shape, dtype, mean, std, ctx):
    shp = _check_run_shape(_shape_from(shape, ShapeTensor, ShapeTensorList))
    return {"Out": prandom.normal(ctx.rng_key(), shp, mean, std, _np_dtype(dtype))}


register_op(
    "gaussian_random", inputs=["ShapeTensor?", "ShapeTensorList*?"], outputs=["Out"],
    attrs={"shape": Longs([]), "mean": Float(0.0), "std": Float(1.0, low=0.0, high=4.0),
           "seed": Int(0), "dtype": Int(5, choices=_FLOAT_CODES)},
    traits=[OPAQUE, RANDOM], infer_shape=_random_infer, reference=_gaussian_ref,
    emit=Opaque(),
    grad=None, doc="Out ~ Normal(mean, std) from the run's random stream.")


def _tgauss_ref(*, shape, dtype, mean, std, a, b, ctx):
    shp = _check_run_shape(tuple(int(d) for d in shape))
    if not a < b:
        raise ShapeMismatch(f"expected a < b, got a={a}, b={b}")
    return {"Out": prandom.truncated_normal(ctx.rng_key(), shp, mean, std, _np_dtype(dtype), a, b)}


register_op(
    "truncated_gaussian_random", inputs=[], outputs=["Out"],
    attrs={"shape": Ints(choices=([3], [2, 3], [4, 1, 2])), "mean": Float(0.0),
           "std": Float(1.0, low=0.0, high=4.0),
           "seed": Int(0), "a": Float(-2.0), "b": Float(2.0),
           "dtype": Int(5, choices=_FLOAT_CODES)},
    traits=[OPAQUE, RANDOM], infer_shape=_random_infer, reference=_tgauss_ref, emit=None,
    grad=None, doc="Out ~ Normal(mean, std) truncated to [mean + a*std, mean + b*std].")


# ---- assign_value: a constant tensor written into the program ----------------------------------
_VALUE_ATTRS = ("values", "fp32_values", "int32_values", "int64_values", "bool_values",
                "fp64_values")


def _assign_value_infer(ValuesTensor=None, *, shape, dtype, **_):
    return {"Out": VarMeta(tuple(shape), _np_dtype(dtype))}


def _assign_value_ref(ValuesTensor=None, *, shape, dtype, **values):
    dt = _np_dtype(dtype)
    given = next((values[k] for k in _VALUE_ATTRS if values.get(k)), [])
    n = int(np.prod(shape, dtype=np.int64))
    if len(given) != n:
        raise ShapeMismatch(f"expected {n} values for shape {list(shape)}, got {len(given)}")
    return {"Out": np.asarray(given).astype(dt).reshape(tuple(shape))}


#: assign_value natively up to this many values (a literal tuple in the driver; larger constants
#: would only slow its compilation) and for these dtypes
_ASSIGN_MAX = 1024
_ASSIGN_NATIVE = tuple(np.dtype(d) for d in ("bool", "int32", "int64", "float32", "float64"))


def _assign_value_lower(ctx):
    """The values as a literal tuple, converted to the dtype here, copied into Out."""
    a = ctx.attrs
    dt = _np_dtype(a["dtype"])
    given = next((a[k] for k in _VALUE_ATTRS if a.get(k)), [])
    n = int(np.prod(a["shape"], dtype=np.int64))
    if (ctx.has_input("ValuesTensor") or dt not in _ASSIGN_NATIVE or len(given) != n
            or not 0 < n <= _ASSIGN_MAX or any(int(d) < 0 for d in a["shape"])):
        return None  # the reference: other dtypes, a count mismatch (its error), big constants
    vals = np.asarray(given).astype(dt)
    lit = (repr(bool(v)) if dt.kind == "b" else repr(int(v)) if dt.kind in "iu"
           else src_literal(float(v)) for v in vals)
    out = ctx.out("Out", shape=ctx.tuple_src(int(d) for d in a["shape"]))
    return [f"{out}.reshape({out}.size)[:] = np.array(({''.join(f'{v}, ' for v in lit)}), "
            f"{ctx.T('Out')})"]


register_op(
    "assign_value", inputs=["ValuesTensor?"], outputs=["Out"],
    attrs={"shape": Ints(choices=([2], [1, 3])), "dtype": Int(choices=_DTYPE_CODES),
           "values": Scalars([]),
           "fp32_values": Floats([]), "int32_values": Ints([]), "int64_values": Longs([]),
           "bool_values": Ints([]), "fp64_values": Float64s([])},
    traits=[OPAQUE], infer_shape=_assign_value_infer, reference=_assign_value_ref,
    emit=Opaque(_assign_value_lower, host=True),
    grad=None, doc="Out = the constant stored in the attributes (Paddle 3: `values`; older "
                   "programs: fp32_values/int32_values/int64_values/bool_values); natively "
                   "up to 1024 values of bool/int32/int64/float32/float64.")


# ---- fill_any_like -----------------------------------------------------------------------------
def _fill_like_dtype(X, dtype) -> np.dtype:
    return X.dtype if int(dtype) == -1 else _np_dtype(dtype)


def _fill_like_literal(value, dt: np.dtype) -> str:
    if dt.kind == "b":
        return repr(bool(value))
    if dt.kind in "iu":
        return repr(int(value))
    return src_literal(float(value))


def _fill_like_emit(dtypes, value=0.0, dtype=-1, **_):
    dt = dtypes.get("Out")
    if dt is None:
        return None
    return "{T}(" + _fill_like_literal(value, np.dtype(dt)) + ")"


register_op(
    "fill_any_like", inputs=["X"], outputs=["Out"],
    attrs={"value": Float(0.0, low=-4.0, high=4.0), "dtype": Int(-1)},
    traits=[ELEMENTWISE],
    infer_shape=lambda X, *, dtype, **_: {"Out": X.with_(dtype=_fill_like_dtype(X, dtype))},
    reference=lambda X, *, value, dtype: {
        "Out": np.full(X.shape, value, _fill_like_dtype(X, dtype))},
    emit=_fill_like_emit, grad=None,
    doc="Out = a tensor of X's shape filled with value, of dtype (-1: X's dtype).")


# ---- range -------------------------------------------------------------------------------------
def _range_infer(Start, End, Step):
    for name, m in (("Start", Start), ("End", End), ("Step", Step)):
        if m.shape not in ((), (1,), (-1,)):
            raise ShapeMismatch(f"range: expected {name} holding one value (shape [1]), got "
                                f"shape {list(m.shape)}")
        if m.dtype != Start.dtype:
            raise ShapeMismatch(f"range: expected {name} of Start's dtype {Start.dtype}, got "
                                f"{m.dtype}")
    if Start.dtype not in (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32),
                           np.dtype(np.float64)):
        raise ShapeMismatch(f"range: expected Start of dtype int32, int64, float32 or float64, "
                            f"got {Start.dtype}")
    return {"Out": VarMeta((-1,), Start.dtype)}


def _range_ref(Start, End, Step):
    t = Start.dtype.type
    s, e, st = (t(np.asarray(v).reshape(-1)[0]) for v in (Start, End, Step))
    if st == 0:
        raise ShapeMismatch("range: expected a nonzero Step, got 0")
    if (s < e and st < 0) or (s > e and st > 0):
        n = 0  # the step leads away from End: nothing (as Paddle)
    elif Start.dtype.kind in "iu":
        n = (abs(int(e) - int(s)) + abs(int(st)) - 1) // abs(int(st))
    else:
        n = int(np.ceil(np.abs((e - s) / st)))
    out = np.empty(n, Start.dtype)
    v = s
    for i in range(n):  # step added one by one in the data's type, as Paddle
        out[i] = v
        v = t(v + st)
    return {"Out": out}


register_op(
    "range", inputs=["Start", "End", "Step"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=_range_infer, reference=_range_ref, emit=Opaque(),
    grad=None,
    doc="Out = Start, Start + Step, ... up to End (excluded); empty when Step leads away.")
