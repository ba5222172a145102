"""Unary elementwise ops: activations, ``scale``, ``clip``, ``cast``.

Each is a NumPy reference plus a scalar template for the code generator. Transcendentals emit
the code generator's vectorisable helpers (``_m.tanh`` ...), never bare libm calls (see
``shared/facts/numba.md``: scalar libm calls stop vectorisation).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import ELEMENTWISE, NO_GRAD_YET, Bool, Float, Int, register_op
from pdjit.ops._common import FLOATS, NUMERIC, check_dtype


def _unary(name, fn, emit, allowed=FLOATS, attrs=None, doc="", differentiable=True):
    def infer(X, **_):
        check_dtype(X, allowed, "input X")
        return {"Out": X}

    def ref(X, **kw):
        return {"Out": np.asarray(fn(X, **kw)).astype(X.dtype, copy=False)}

    register_op(name, inputs=["X"], outputs=["Out"], attrs=attrs or {}, traits=[ELEMENTWISE],
                infer_shape=infer, reference=ref, emit=emit,
                grad=NO_GRAD_YET if differentiable else None, doc=doc)


def _sigmoid(x):
    # exp of a non-positive argument only: no overflow warnings, exact at both ends
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_unary("relu", lambda x: np.maximum(x, 0), "np.maximum({X}, {T}(0))", NUMERIC,
       doc="Out = max(X, 0)")
_unary("leaky_relu", lambda x, alpha: np.where(x > 0, x, x * np.asarray(alpha, x.dtype)),
       "{X} if {X} > {T}(0) else {X} * {T}({alpha})",
       attrs={"alpha": Float(0.02, low=0.0, high=1.0)}, doc="Out = X if X > 0 else alpha * X")
_unary("sigmoid", _sigmoid, "_m.sigmoid({X})", doc="Out = 1 / (1 + exp(-X))")
_unary("tanh", np.tanh, "_m.tanh({X})", doc="Out = tanh(X)")
_unary("exp", np.exp, "_m.exp({X})", doc="Out = exp(X)")
_unary("log", np.log, "_m.log({X})", doc="Out = ln(X)")
_unary("sqrt", np.sqrt, "np.sqrt({X})", doc="Out = sqrt(X)")
_unary("rsqrt", lambda x: 1 / np.sqrt(x), "{T}(1) / np.sqrt({X})", doc="Out = 1 / sqrt(X)")
_unary("reciprocal", lambda x: 1 / x, "{T}(1) / {X}", doc="Out = 1 / X")
_unary("abs", np.abs, "abs({X})", NUMERIC, doc="Out = |X|")
_unary("square", np.square, "{X} * {X}", NUMERIC, doc="Out = X * X")
_unary("floor", np.floor, "np.floor({X})", doc="Out = floor(X)", differentiable=False)
_unary("ceil", np.ceil, "np.ceil({X})", doc="Out = ceil(X)", differentiable=False)
_unary("sign", np.sign, "np.sign({X})", NUMERIC, doc="Out = sign(X)",
       differentiable=False)


# ---- scale: Out = scale * X + bias (or scale * (X + bias)) ------------------------------------
def _scale_infer(X, ScaleTensor=None, BiasTensor=None, **_):
    check_dtype(X, NUMERIC, "input X")
    for name, t in (("ScaleTensor", ScaleTensor), ("BiasTensor", BiasTensor)):
        if t is not None and t.shape not in ((), (1,), (-1,)):
            raise ShapeMismatch(f"{name} must hold one value: expected shape [] or [1], got "
                                f"{list(t.shape)}")
    return {"Out": X}


def _scale_ref(X, ScaleTensor=None, BiasTensor=None, *, scale, bias, bias_after_scale):
    if ScaleTensor is not None:
        scale = ScaleTensor.reshape(-1)[0]
    if BiasTensor is not None:
        bias = BiasTensor.reshape(-1)[0]
    s, b = np.asarray(scale).astype(X.dtype), np.asarray(bias).astype(X.dtype)
    out = X * s + b if bias_after_scale else (X + b) * s
    return {"Out": out.astype(X.dtype, copy=False)}


def _scale_emit(dtypes_, *, scale, bias, bias_after_scale):
    if "ScaleTensor" in dtypes_ or "BiasTensor" in dtypes_:
        return None  # the factors are known at run time only
    if bias_after_scale:
        return "{X} * {T}({scale}) + {T}({bias})"
    return "({X} + {T}({bias})) * {T}({scale})"


register_op(
    "scale", inputs=["X", "ScaleTensor?", "BiasTensor?"], outputs=["Out"],
    attrs={"scale": Float(1.0, low=-4.0, high=4.0), "bias": Float(0.0, low=-4.0, high=4.0),
           "bias_after_scale": Bool(True)},
    traits=[ELEMENTWISE], infer_shape=_scale_infer, reference=_scale_ref, emit=_scale_emit,
    grad=NO_GRAD_YET, doc="Out = scale * X + bias (bias_after_scale) or scale * (X + bias).")


# ---- clip ------------------------------------------------------------------------------------
def _clip_infer(X, Min=None, Max=None, **_):
    check_dtype(X, NUMERIC, "input X")
    return {"Out": X}


def _clip_ref(X, Min=None, Max=None, *, min, max):
    lo = Min.reshape(-1)[0] if Min is not None else min
    hi = Max.reshape(-1)[0] if Max is not None else max
    if lo > hi:
        raise ShapeMismatch(f"clip: expected min <= max, got min={lo}, max={hi}")
    lo, hi = np.asarray(lo).astype(X.dtype), np.asarray(hi).astype(X.dtype)
    return {"Out": np.minimum(np.maximum(X, lo), hi)}


def _clip_emit(dtypes_, *, min, max):
    if "Min" in dtypes_ or "Max" in dtypes_ or min > max:
        return None  # bounds known at run time only, or an error the reference reports
    return "np.minimum(np.maximum({X}, {T}({min})), {T}({max}))"


register_op(
    "clip", inputs=["X", "Min?", "Max?"], outputs=["Out"],
    attrs={"min": Float(-1.0, low=-4.0, high=0.0), "max": Float(1.0, low=0.0, high=4.0)},
    traits=[ELEMENTWISE], infer_shape=_clip_infer, reference=_clip_ref,
    emit=_clip_emit, grad=NO_GRAD_YET,
    doc="Out = min(max(X, min), max).")


# ---- cast ------------------------------------------------------------------------------------
_CAST_CODES = tuple(dtypes.to_code(d) for d in
                    ("bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32",
                     "float64"))


def _cast_infer(X, *, in_dtype, out_dtype):
    try:
        want_in, out = dtypes.to_numpy(in_dtype), dtypes.to_numpy(out_dtype)
    except TypeError as e:
        raise ShapeMismatch(str(e)) from None
    if X.dtype != want_in:
        raise ShapeMismatch(f"in_dtype says {want_in}, but X is {X.dtype}")
    return {"Out": X.with_(dtype=out)}


def _cast_ref(X, *, in_dtype, out_dtype):
    return {"Out": X.astype(dtypes.to_numpy(out_dtype))}


register_op(
    "cast", inputs=["X"], outputs=["Out"],
    attrs={"in_dtype": Int(choices=_CAST_CODES), "out_dtype": Int(choices=_CAST_CODES)},
    traits=[ELEMENTWISE], infer_shape=_cast_infer, reference=_cast_ref, emit="{T}({X})",
    grad=NO_GRAD_YET, doc="Out = X converted to out_dtype (a VarType code).")


# ---- increment: X + step, on a one-element counter ----------------------------------------------
def _increment_infer(X, *, step):
    if X.shape not in ((), (1,), (-1,)):
        raise ShapeMismatch(f"increment works on a one-element tensor: expected shape [1] or [], "
                            f"got {list(X.shape)}")
    return {"Out": X}


register_op(
    "increment", inputs=["X"], outputs=["Out"], attrs={"step": Float(1.0, low=-4.0, high=4.0)},
    traits=[ELEMENTWISE], infer_shape=_increment_infer,
    reference=lambda X, *, step: {"Out": (X + np.asarray(step).astype(X.dtype)).astype(X.dtype)},
    emit="{X} + {T}({step})", grad=None, doc="Out = X + step (a loop counter).")
