"""Unary elementwise ops: activations, ``scale``, ``clip``, ``cast``, and their gradients.

Each is a NumPy reference plus a scalar template for the code generator. Transcendentals emit
the code generator's vectorisable helpers (``_m.tanh`` ...), never bare libm calls (see
``shared/facts/numba.md``: scalar libm calls stop vectorisation).

Gradients follow PaddlePaddle 3.3.1's legacy grad makers (checked with
``core.get_grad_op_desc`` and by running them):

- ``<act>_grad`` reads ``Out`` and ``Out@GRAD`` when the derivative is cheapest from the output
  (relu, sigmoid, tanh, exp, sqrt, rsqrt, reciprocal), ``X`` and ``Out@GRAD`` otherwise
  (leaky_relu, log, abs, square); it writes ``X@GRAD``. The grad ops are ``ELEMENTWISE`` with a
  template, so the backward pass fuses like the forward one.
- At the kinks Paddle's choices are copied: relu'(0) = 0 (it tests ``Out > 0``),
  leaky_relu'(0) = 1 (it tests ``X >= 0``), abs'(0) = 0 (sign), and clip passes the gradient
  at both bounds (``min <= X <= max``).
- ``scale``'s gradient is a ``scale`` of ``Out@GRAD`` by the same factor with bias 0 (and the
  same ``ScaleTensor`` when there is one); ``cast``'s is a ``cast`` back; ``assign``'s (in
  ``creation.py``) an ``assign``.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    ELEMENTWISE,
    Bool,
    Float,
    GradOpSpec,
    Int,
    default_grad,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, NUMERIC, check_dtype


def _unary(name, fn, emit, allowed=FLOATS, attrs=None, doc="", grad=None, domain=None):
    """Register a unary elementwise op and, when ``grad`` is given, its ``<name>_grad`` op.

    ``grad`` is ``(reads, dx, template)``: ``reads`` is the forward slot the derivative is
    computed from (``"X"`` or ``"Out"``, as Paddle's grad op reads it), ``dx(v, g, **attrs)``
    the NumPy gradient from that value and ``Out@GRAD``, and ``template`` the same expression
    for the code generator. ``grad=None`` declares the op not differentiable.
    """
    def infer(X, **_):
        check_dtype(X, allowed, "input X")
        return {"Out": X}

    def ref(X, **kw):
        return {"Out": np.asarray(fn(X, **kw)).astype(X.dtype, copy=False)}

    maker = None
    if grad is not None:
        reads, dx, template = grad
        maker = default_grad(f"{name}_grad", fwd_inputs=("X",) if reads == "X" else (),
                             fwd_outputs=("Out",) if reads == "Out" else ())
        _register_unary_grad(name, reads, dx, template, attrs or {})
    register_op(name, inputs=["X"], outputs=["Out"], attrs=attrs or {}, traits=[ELEMENTWISE],
                infer_shape=infer, reference=ref, emit=emit, grad=maker, doc=doc,
                domain={"X": domain} if domain else None)


def _register_unary_grad(name, reads, dx, template, attrs):
    """``<name>_grad``: ``X@GRAD = dx(<reads>, Out@GRAD)``, elementwise and fusable."""
    def infer(**kw):
        # X@GRAD has the forward X's shape and dtype; for a unary op Out has the same ones
        return {"X@GRAD": kw[reads]}

    def ref(**kw):
        v, g = kw[reads], kw["Out@GRAD"]
        if v.shape != g.shape:
            raise ShapeMismatch(f"{name}_grad: expected Out@GRAD of {reads}'s shape "
                                f"{list(v.shape)}, got {list(g.shape)}")
        params = {a: kw[a] for a in attrs}
        return {"X@GRAD": np.asarray(dx(v, g, **params)).astype(v.dtype, copy=False)}

    register_op(f"{name}_grad", inputs=[reads, "Out@GRAD"], outputs=["X@GRAD?"],
                attrs=dict(attrs), traits=[ELEMENTWISE], infer_shape=infer, reference=ref,
                emit=template, grad=None,
                doc=f"X@GRAD = {template.replace('{', '').replace('}', '')} (gradient of "
                    f"{name}).")


def _sigmoid(x):
    # exp of a non-positive argument only: no overflow warnings, exact at both ends
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_unary("relu", lambda x: np.maximum(x, 0), "np.maximum({X}, {T}(0))", NUMERIC,
       doc="Out = max(X, 0)",
       grad=("Out", lambda out, g: np.where(out > 0, g, np.zeros((), g.dtype)),
             "{Out@GRAD} if {Out} > {T}(0) else {T}(0)"))
_unary("leaky_relu", lambda x, alpha: np.where(x > 0, x, x * np.asarray(alpha, x.dtype)),
       "{X} if {X} > {T}(0) else {X} * {T}({alpha})",
       attrs={"alpha": Float(0.02, low=0.0, high=1.0)}, doc="Out = X if X > 0 else alpha * X",
       # Paddle's LeakyReluGradFunctor tests X >= 0: the slope at 0 is 1, not alpha
       grad=("X", lambda x, g, alpha: np.where(x >= 0, g, g * np.asarray(alpha, g.dtype)),
             "{Out@GRAD} if {X} >= {T}(0) else {Out@GRAD} * {T}({alpha})"))
_unary("sigmoid", _sigmoid, "_m.sigmoid({X})", doc="Out = 1 / (1 + exp(-X))",
       grad=("Out", lambda out, g: g * out * (1 - out), "{Out@GRAD} * {Out} * ({T}(1) - {Out})"))
_unary("tanh", np.tanh, "_m.tanh({X})", doc="Out = tanh(X)",
       grad=("Out", lambda out, g: g * (1 - out * out), "{Out@GRAD} * ({T}(1) - {Out} * {Out})"))
_unary("exp", np.exp, "_m.exp({X})", doc="Out = exp(X)",
       grad=("Out", lambda out, g: g * out, "{Out@GRAD} * {Out}"))
_unary("log", np.log, "_m.log({X})", doc="Out = ln(X)",
       grad=("X", lambda x, g: g / x, "{Out@GRAD} / {X}"), domain="positive")
_unary("sqrt", np.sqrt, "np.sqrt({X})", doc="Out = sqrt(X)",
       grad=("Out", lambda out, g: g * 0.5 / out, "{Out@GRAD} * {T}(0.5) / {Out}"),
       domain="positive")
_unary("rsqrt", lambda x: 1 / np.sqrt(x), "{T}(1) / np.sqrt({X})", doc="Out = 1 / sqrt(X)",
       grad=("Out", lambda out, g: -0.5 * g * out * out * out,
             "{T}(-0.5) * {Out@GRAD} * {Out} * {Out} * {Out}"), domain="positive")
_unary("reciprocal", lambda x: 1 / x, "{T}(1) / {X}", doc="Out = 1 / X",
       grad=("Out", lambda out, g: -g * out * out, "-{Out@GRAD} * {Out} * {Out}"), domain="nonzero")
_unary("abs", np.abs, "abs({X})", NUMERIC, doc="Out = |X|",
       # sign(X) * Out@GRAD, 0 at X == 0 as in Paddle
       grad=("X", lambda x, g: np.sign(x).astype(g.dtype) * g,
             "({Out@GRAD} if {X} > {T}(0) else (-{Out@GRAD} if {X} < {T}(0) else {T}(0)))"))
_unary("square", np.square, "{X} * {X}", NUMERIC, doc="Out = X * X",
       grad=("X", lambda x, g: g * 2 * x, "{Out@GRAD} * {T}(2) * {X}"))
# Piecewise constant: no gradient flows (Paddle's grads of these are zeros).
_unary("floor", np.floor, "np.floor({X})", doc="Out = floor(X)")
_unary("ceil", np.ceil, "np.ceil({X})", doc="Out = ceil(X)")
_unary("sign", np.sign, "np.sign({X})", NUMERIC, doc="Out = sign(X)")


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


def _scale_grad(op):
    """Paddle's grad of ``scale``: another ``scale`` of ``Out@GRAD`` by the same factor, bias 0.

    ``ScaleTensor`` (the factor given at run time) is passed on, so the factor is the same.
    ``BiasTensor`` is not: Paddle 3.3.1 passes it too, and its ``scale`` op then adds the bias
    to the gradient (d(2x + b)/dx comes out as 2 + b); the bias does not change the derivative.
    Neither tensor gets a gradient (Paddle gives none).
    """
    xs = op.input("X")
    ins = {"X": [grad_var_name(n) for n in op.output("Out")]}
    if op.input("ScaleTensor"):
        ins["ScaleTensor"] = op.input("ScaleTensor")
    return [GradOpSpec("scale", ins, {"Out": [grad_var_name(n) for n in xs]},
                       {"scale": op.all_attrs().get("scale", 1.0),  # 1.0: the default
                        "bias": 0.0, "bias_after_scale": True})]


register_op(
    "scale", inputs=["X", "ScaleTensor?", "BiasTensor?"], outputs=["Out"],
    attrs={"scale": Float(1.0, low=-4.0, high=4.0), "bias": Float(0.0, low=-4.0, high=4.0),
           "bias_after_scale": Bool(True)},
    traits=[ELEMENTWISE], infer_shape=_scale_infer, reference=_scale_ref, emit=_scale_emit,
    grad=_scale_grad,
    doc="Out = scale * X + bias (bias_after_scale) or scale * (X + bias).")


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


def _bounds(X, Min, Max, min, max):
    lo = Min.reshape(-1)[0] if Min is not None else min
    hi = Max.reshape(-1)[0] if Max is not None else max
    return np.asarray(lo).astype(X.dtype), np.asarray(hi).astype(X.dtype)


def _clip_grad_ref(X, Min=None, Max=None, *, min, max, **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape:
        raise ShapeMismatch(f"clip_grad: expected Out@GRAD of X's shape {list(X.shape)}, got "
                            f"{list(g.shape)}")
    lo, hi = _bounds(X, Min, Max, min, max)
    # Paddle passes the gradient where min <= X <= max, bounds included
    return {"X@GRAD": np.where((X >= lo) & (X <= hi), g, np.zeros((), g.dtype))
            .astype(X.dtype, copy=False)}


def _clip_grad_emit(dtypes_, *, min, max):
    if "Min" in dtypes_ or "Max" in dtypes_:
        return None  # bounds known at run time only
    return "{Out@GRAD} if {X} >= {T}({min}) and {X} <= {T}({max}) else {T}(0)"


register_op(
    "clip_grad", inputs=["X", "Min?", "Max?", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs={"min": Float(-1.0, low=-4.0, high=0.0), "max": Float(1.0, low=0.0, high=4.0)},
    traits=[ELEMENTWISE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_clip_grad_ref,
    emit=_clip_grad_emit, grad=None,
    doc="X@GRAD = Out@GRAD where min <= X <= max, else 0 (gradient of clip).")

register_op(
    "clip", inputs=["X", "Min?", "Max?"], outputs=["Out"],
    attrs={"min": Float(-1.0, low=-4.0, high=0.0), "max": Float(1.0, low=0.0, high=4.0)},
    traits=[ELEMENTWISE], infer_shape=_clip_infer, reference=_clip_ref,
    emit=_clip_emit,
    grad=default_grad("clip_grad", fwd_inputs=("X", "Min", "Max")),
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


def _cast_grad(op):
    """Paddle's grad of ``cast``: a ``cast`` of ``Out@GRAD`` back from out_dtype to in_dtype."""
    return [GradOpSpec("cast", {"X": [grad_var_name(n) for n in op.output("Out")]},
                       {"Out": [grad_var_name(n) for n in op.input("X")]},
                       {"in_dtype": op.attr("out_dtype"), "out_dtype": op.attr("in_dtype")})]


register_op(
    "cast", inputs=["X"], outputs=["Out"],
    attrs={"in_dtype": Int(choices=_CAST_CODES), "out_dtype": Int(choices=_CAST_CODES)},
    traits=[ELEMENTWISE], infer_shape=_cast_infer, reference=_cast_ref, emit="{T}({X})",
    grad=_cast_grad, doc="Out = X converted to out_dtype (a VarType code).")


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
