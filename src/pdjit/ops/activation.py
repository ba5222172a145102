"""Unary elementwise ops: activations, ``scale``, ``clip``, ``cast``, and their gradients;
and ``prelu`` (an activation with a learnt, broadcast ``Alpha``).

Each is a NumPy reference plus a scalar template for the code generator. Transcendentals emit
the code generator's vectorisable helpers (``_m.tanh`` ...), never bare libm calls (see
``shared/facts/numba.md``: scalar libm calls stop vectorisation).

Gradients follow PaddlePaddle 3.3.1's legacy grad makers (checked with
``core.get_grad_op_desc`` and by running them):

- ``<act>_grad`` reads ``Out`` and ``Out@GRAD`` when the derivative is cheapest from the output
  (relu, sigmoid, tanh, exp, sqrt, rsqrt, reciprocal, relu6, hard_sigmoid, selu), ``X`` and
  ``Out@GRAD`` otherwise (leaky_relu, log, abs, square, hard_swish, swish, softplus, mish,
  gelu),
  ``X``, ``Out`` and ``Out@GRAD`` for silu and elu; it writes ``X@GRAD``. The grad ops are
  ``ELEMENTWISE`` with a template, so the backward pass fuses like the forward one.
- At the kinks Paddle's choices are copied: relu'(0) = 0 (it tests ``Out > 0``),
  leaky_relu'(0) = 1 (it tests ``X >= 0``), abs'(0) = 0 (sign), and clip passes the gradient
  at both bounds (``min <= X <= max``); relu6 and hard_sigmoid pass it strictly inside their
  bounds only; hard_swish's is 0 at ``X = -offset``; elu'(0) = alpha, selu'(0) = scale * alpha;
  prelu'(0) = Alpha (all test ``X > 0`` or ``Out > 0``).
- Where Paddle's gradient is not its forward's derivative, Paddle's is copied: hard_swish's is
  1 (not threshold / scale) from ``X + offset >= threshold`` on, and mish's uses
  ``1 - exp(-X)`` for the derivative of its softplus above ``threshold`` (where the forward
  takes ``X`` itself). Both agree with the derivative at the default attributes.
- Attributes Paddle 3.3.1 ignores are honoured as Fluid 1.x defined them: it writes no
  ``threshold`` on relu6 and no ``beta`` on swish (absent: 6 and 1) and computes hard_swish
  with 6, 6, 3 whatever its attributes say.
- ``scale``'s gradient is a ``scale`` of ``Out@GRAD`` by the same factor with bias 0 (and the
  same ``ScaleTensor`` when there is one); ``cast``'s is a ``cast`` back; ``assign``'s (in
  ``creation.py``) an ``assign``.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    ELEMENTWISE,
    OPAQUE,
    Bool,
    Clamp,
    Float,
    Gate,
    GradOpSpec,
    Int,
    Opaque,
    Passthrough,
    RowWise,
    Scale,
    Str,
    default_grad,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, NUMERIC, check_dtype


def _unary(name, fn, emit, allowed=FLOATS, attrs=None, doc="", grad=None, domain=None,
           may_lack_attrs=False, inference=None):
    """Register a unary elementwise op and, when ``grad`` is given, its ``<name>_grad`` op.

    ``grad`` is ``(reads, dx, template)``: ``reads`` names the forward slots the grad op reads
    besides ``Out@GRAD`` (``"X"``, ``"Out"`` or ``("X", "Out")``, as Paddle's grad op reads
    them), ``dx(*values, g, **attrs)`` the NumPy gradient from their values (in ``reads``
    order) and ``Out@GRAD``, and ``template`` the same expression for the code generator.
    ``grad=None`` declares the op not differentiable. ``may_lack_attrs``: programs written by
    some Paddle version leave attributes out (see ``_filled``); the emit rules then become
    callables that write in the defaults of the absent ones.
    """
    attrs = attrs or {}

    def infer(X, **_):
        check_dtype(X, allowed, "input X")
        return {"Out": X}

    def ref(X, **kw):
        return {"Out": np.asarray(fn(X, **_filled(attrs, kw))).astype(X.dtype, copy=False)}

    maker = None
    if grad is not None:
        reads, dx, template = grad
        reads = (reads,) if isinstance(reads, str) else tuple(reads)
        maker = default_grad(f"{name}_grad", fwd_inputs=("X",) if "X" in reads else (),
                             fwd_outputs=("Out",) if "Out" in reads else ())
        _register_unary_grad(name, reads, dx, template, attrs, may_lack_attrs)
    register_op(name, inputs=["X"], outputs=["Out"], attrs=attrs, traits=[ELEMENTWISE],
                infer_shape=infer, reference=ref,
                emit=_with_defaults(emit, attrs) if may_lack_attrs else emit, grad=maker,
                doc=doc, domain={"X": domain} if domain else None, inference=inference)


def _filled(attrs, given) -> dict:
    """The values of ``attrs``: as given, or their defaults where the op carries none (a
    program written by Paddle 3.3.1 has no ``threshold`` on relu6, no ``beta`` on swish)."""
    return {a: given[a] if a in given else spec.default for a, spec in attrs.items()}


def _with_defaults(template, attrs):
    """The emit rule of a template over attributes: the template itself, with the default
    written in for an attribute the op does not carry (see ``_filled``)."""
    if not attrs or not isinstance(template, str):
        return template

    def emit(dtypes_, **given):
        t = template
        for a, spec in attrs.items():
            if a not in given:
                t = t.replace("{" + a + "}", repr(spec.default))
        return t
    return emit


def _register_unary_grad(name, reads, dx, template, attrs, may_lack_attrs):
    """``<name>_grad``: ``X@GRAD = dx(<reads>..., Out@GRAD)``, elementwise and fusable."""
    def infer(**kw):
        # X@GRAD has the forward X's shape and dtype; for a unary op Out has the same ones
        return {"X@GRAD": kw[reads[0]]}

    def ref(**kw):
        values, g = [kw[r] for r in reads], kw["Out@GRAD"]
        for r, v in zip(reads, values):
            if v.shape != g.shape:
                raise ShapeMismatch(f"{name}_grad: expected Out@GRAD of {r}'s shape "
                                    f"{list(v.shape)}, got {list(g.shape)}")
        params = _filled(attrs, kw)
        return {"X@GRAD": np.asarray(dx(*values, g, **params)).astype(values[0].dtype,
                                                                      copy=False)}

    register_op(f"{name}_grad", inputs=[*reads, "Out@GRAD"], outputs=["X@GRAD?"],
                attrs=dict(attrs), traits=[ELEMENTWISE], infer_shape=infer, reference=ref,
                emit=_with_defaults(template, attrs) if may_lack_attrs else template, grad=None,
                doc=f"X@GRAD = {template.replace('{', '').replace('}', '')} (gradient of "
                    f"{name}).")


def _sigmoid(x):
    # exp of a non-positive argument only: no overflow warnings, exact at both ends
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_unary("relu", lambda x: np.maximum(x, 0), "np.maximum({X}, {T}(0))", NUMERIC,
       doc="Out = max(X, 0)",
       grad=("Out", lambda out, g: np.where(out > 0, g, np.zeros((), g.dtype)),
             "{Out@GRAD} if {Out} > {T}(0) else {T}(0)"),
       inference=lambda op: Clamp("X", "Out", 0.0, math.inf))
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


# ---- activations of vision models (MobileNetV3, YOLO, EfficientNet...) ------------------------
# Semantics and grad slots are Paddle 3.3.1's (see the module docstring). Transcendentals go
# through the code generator's helpers; the NumPy references avoid overflow warnings by
# evaluating the branch that np.where drops on safe values.
def _clamp(v, lo, hi):
    return np.minimum(np.maximum(v, lo), hi)


def _f(x, v):
    """Attribute ``v`` as a scalar of ``x``'s dtype (float32 math stays float32)."""
    return np.asarray(v, x.dtype)


def _softplus_np(z):
    return np.logaddexp(np.zeros((), z.dtype), z)


def _neg_expm1(x):
    """alpha * (exp(x) - 1) needs expm1 of the non-positive part only."""
    return np.expm1(np.minimum(x, 0))


def _attrs(op) -> dict:
    """The op's attribute values, the declared defaults for those it lacks."""
    return op.opdef.attr_values(op.all_attrs())


_unary("relu6", lambda x, threshold: _clamp(x, _f(x, 0), _f(x, threshold)),
       "np.minimum(np.maximum({X}, {T}(0)), {T}({threshold}))",
       attrs={"threshold": Float(6.0, low=1.0, high=10.0,
                                 doc="Fluid 1.x writes it; Paddle 3.3.1 writes none (6)")},
       may_lack_attrs=True, doc="Out = min(max(X, 0), threshold)",
       # relu6_grad reads Out: 0 at both kinks (Out == 0 and Out == threshold)
       grad=("Out", lambda out, g, threshold: np.where((out > 0) & (out < threshold), g,
                                                       np.zeros((), g.dtype)),
             "{Out@GRAD} if {Out} > {T}(0) and {Out} < {T}({threshold}) else {T}(0)"),
       inference=lambda op: Clamp("X", "Out", 0.0, float(_attrs(op)["threshold"])))


def _hard_swish(x, threshold, scale, offset):
    return x * _clamp(x + _f(x, offset), _f(x, 0), _f(x, threshold)) / _f(x, scale)


def _hard_swish_gate(a: dict) -> Gate | None:
    # (x * 1 is x: the template's x + offset, then its clamp, product and division; a scale
    # of 0, or one that rounds to 0 in float32, is a Gate's "no product": not declared)
    scale = float(a["scale"])
    if not abs(scale) >= 1e-30:
        return None
    return Gate("X", "Out", 1.0, float(a["offset"]), 0.0, float(a["threshold"]), scale)


def _hard_sigmoid_gate(a: dict) -> Gate:
    return Gate("X", "Out", float(a["slope"]), float(a["offset"]), 0.0, 1.0, 0.0)


def _hard_swish_dx(x, g, threshold, scale, offset):
    # Paddle's HardSwishGradFunctor: 1 (not threshold / scale) where X + offset >= threshold
    t = x + _f(x, offset)
    inner = np.where(t > 0, g * (2 * x + _f(x, offset)) / _f(x, scale), np.zeros((), g.dtype))
    return np.where(t < threshold, inner, g)


_unary("hard_swish", _hard_swish,
       "{X} * np.minimum(np.maximum({X} + {T}({offset}), {T}(0)), {T}({threshold})) "
       "/ {T}({scale})",
       attrs={"threshold": Float(6.0, low=1.0, high=10.0), "scale": Float(6.0, low=1.0, high=10.0),
              "offset": Float(3.0, low=0.5, high=5.0)},
       may_lack_attrs=True, doc="Out = X * min(max(X + offset, 0), threshold) / scale",
       grad=("X", _hard_swish_dx,
             "({Out@GRAD} * ({T}(2) * {X} + {T}({offset})) / {T}({scale}) "
             "if {X} + {T}({offset}) > {T}(0) else {T}(0)) "
             "if {X} + {T}({offset}) < {T}({threshold}) else {Out@GRAD}"),
       inference=lambda op: _hard_swish_gate(_attrs(op)))
_unary("hard_sigmoid",
       lambda x, slope, offset: _clamp(x * _f(x, slope) + _f(x, offset), _f(x, 0), _f(x, 1)),
       "np.minimum(np.maximum({X} * {T}({slope}) + {T}({offset}), {T}(0)), {T}(1))",
       attrs={"slope": Float(0.2, low=0.0625, high=1.0), "offset": Float(0.5, low=0.0, high=1.0)},
       may_lack_attrs=True, doc="Out = min(max(slope * X + offset, 0), 1)",
       # hard_sigmoid_grad reads Out: slope strictly between the bounds, 0 at them
       grad=("Out", lambda out, g, slope, offset: np.where(
           (out > 0) & (out < 1), g * _f(g, slope), np.zeros((), g.dtype)),
           "{Out@GRAD} * {T}({slope}) if {Out} > {T}(0) and {Out} < {T}(1) else {T}(0)"),
       inference=lambda op: _hard_sigmoid_gate(_attrs(op)))

_SIG_BX = "_m.sigmoid({T}({beta}) * {X})"
_unary("swish", lambda x, beta: x * _sigmoid(x * _f(x, beta)), "{X} * " + _SIG_BX,
       attrs={"beta": Float(1.0, low=0.25, high=4.0,
                            doc="Fluid 1.x writes it; Paddle 3.3.1 writes none (1)")},
       may_lack_attrs=True, doc="Out = X * sigmoid(beta * X)",
       grad=("X", lambda x, g, beta: g * _sigmoid(x * _f(x, beta)) * (
           1 + _f(x, beta) * x * (1 - _sigmoid(x * _f(x, beta)))),
           f"{{Out@GRAD}} * {_SIG_BX} * ({{T}}(1) + {{T}}({{beta}}) * {{X}} * "
           f"({{T}}(1) - {_SIG_BX}))"))
# silu_grad reads X and Out (Paddle's slots); the derivative is computed from X alone
_unary("silu", lambda x: x * _sigmoid(x), "{X} * _m.sigmoid({X})", doc="Out = X * sigmoid(X)",
       grad=(("X", "Out"), lambda x, out, g: g * _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
             "{Out@GRAD} * _m.sigmoid({X}) * ({T}(1) + {X} * ({T}(1) - _m.sigmoid({X})))"))
_unary("elu", lambda x, alpha: np.where(x > 0, x, _f(x, alpha) * _neg_expm1(x)),
       "{X} if {X} > {T}(0) else {T}({alpha}) * _m.expm1({X})",
       attrs={"alpha": Float(1.0, low=0.125, high=2.0)},
       may_lack_attrs=True, doc="Out = X if X > 0 else alpha * (exp(X) - 1)",
       # Paddle's elu_grad: Out@GRAD where X > 0, else Out@GRAD * (Out + alpha) (= alpha at 0)
       grad=(("X", "Out"), lambda x, out, g, alpha: np.where(x > 0, g, g * (out + _f(x, alpha))),
             "{Out@GRAD} if {X} > {T}(0) else {Out@GRAD} * ({Out} + {T}({alpha}))"))
_unary("selu",
       lambda x, scale, alpha: _f(x, scale) * np.where(x > 0, x, _f(x, alpha) * _neg_expm1(x)),
       "{T}({scale}) * ({X} if {X} > {T}(0) else {T}({alpha}) * _m.expm1({X}))",
       attrs={"scale": Float(1.0507009873554805, low=1.0, high=2.0),
              "alpha": Float(1.6732632423543772, low=0.0, high=2.0)},
       may_lack_attrs=True, doc="Out = scale * (X if X > 0 else alpha * (exp(X) - 1))",
       # selu_grad reads Out only: scale where Out > 0, else Out + scale * alpha (at 0 too)
       grad=("Out", lambda out, g, scale, alpha: np.where(
           out > 0, g * _f(g, scale), g * (out + _f(g, scale) * _f(g, alpha))),
           "{Out@GRAD} * {T}({scale}) if {Out} > {T}(0) else "
           "{Out@GRAD} * ({Out} + {T}({scale}) * {T}({alpha}))"))


def _softplus(x, beta, threshold):
    bx = x * _f(x, beta)
    return np.where(bx > threshold, x, _softplus_np(bx) / _f(x, beta))


_unary("softplus", _softplus,
       "{X} if {T}({beta}) * {X} > {T}({threshold}) else "
       "_m.softplus({T}({beta}) * {X}) / {T}({beta})",
       attrs={"beta": Float(1.0, low=0.5, high=4.0), "threshold": Float(20.0, low=5.0, high=30.0)},
       may_lack_attrs=True,
       doc="Out = X if beta * X > threshold else log(1 + exp(beta * X)) / beta",
       grad=("X", lambda x, g, beta, threshold: np.where(
           x * _f(x, beta) > threshold, g, g * _sigmoid(x * _f(x, beta))),
           "{Out@GRAD} if {T}({beta}) * {X} > {T}({threshold}) else "
           "{Out@GRAD} * _m.sigmoid({T}({beta}) * {X})"))


def _mish_sp(x, threshold):
    return np.where(x > threshold, x, _softplus_np(x))


def _mish_dx(x, g, threshold):
    # Paddle's MishGradFunctor: sp = softplus with the threshold, d = tanh(sp) + X *
    # (1 - tanh(sp)^2) * (1 - exp(-sp)); 1 - exp(-sp) is sigmoid(X) below the threshold
    sp = _mish_sp(x, threshold)
    t = np.tanh(sp)
    return g * (t + x * (1 - t * t) * -np.expm1(-sp))


_MISH_SP = "({X} if {X} > {T}({threshold}) else _m.softplus({X}))"
_MISH_T = f"_m.tanh({_MISH_SP})"
_unary("mish", lambda x, threshold: x * np.tanh(_mish_sp(x, threshold)), "{X} * " + _MISH_T,
       attrs={"threshold": Float(20.0, low=5.0, high=30.0)},
       may_lack_attrs=True, doc="Out = X * tanh(X if X > threshold else log(1 + exp(X)))",
       grad=("X", _mish_dx,
             f"{{Out@GRAD}} * ({_MISH_T} + {{X}} * ({{T}}(1) - {_MISH_T} * {_MISH_T}) * "
             f"-_m.expm1(-{_MISH_SP}))"))


# ---- prelu: Out = X if X > 0 else Alpha * X, Alpha shared per mode ---------------------------
# Not a unary op: Alpha broadcasts by mode ("all": one value; "channel": one per channel, the
# channel axis being 1 (NCHW) or the last (NHWC); "element": one per element of a sample), and
# Alpha's gradient is a reduction over what shares it. Alpha's shape need not line up with X's
# by NumPy's rule (Paddle takes a channel Alpha as [C] or [1, C, 1, 1] for X of any rank >= 2),
# so both ops are opaque loop nests over X viewed as rows: for "channel"/NCHW a row is the
# spatial extent of one (sample, channel) pair and takes Alpha[row % C]; for NHWC and "element"
# a column k takes Alpha[k]; for "all" every element takes Alpha[0].
_PRELU_MODES = ("all", "channel", "element")
_PRELU_FORMATS = ("NCHW", "NHWC")


def _known_prod(dims) -> int:
    """The product of ``dims``, or -1 when one is unknown."""
    return -1 if any(d < 0 for d in dims) else int(np.prod(dims, dtype=np.int64))


def _prelu_alpha_size(x_shape, mode, data_format) -> int:
    """How many values Alpha must hold for X of ``x_shape`` (-1: unknown until run time);
    ShapeMismatch for a mode, format or rank Paddle refuses."""
    rank = len(x_shape)
    if mode == "all":
        return 1
    if mode == "channel":
        if rank < 2:
            raise ShapeMismatch(f"prelu: mode 'channel' expects X of rank >= 2, got shape "
                                f"{list(x_shape)}")
        if data_format not in _PRELU_FORMATS:
            raise ShapeMismatch(f"prelu: data_format must be one of {list(_PRELU_FORMATS)} in "
                                f"mode 'channel', got {data_format!r}")
        return x_shape[1] if data_format == "NCHW" else x_shape[-1]
    if mode == "element":
        if rank < 1:
            raise ShapeMismatch("prelu: mode 'element' expects X of rank >= 1, got a scalar")
        return _known_prod(x_shape[1:])
    raise ShapeMismatch(f"prelu: mode must be one of {list(_PRELU_MODES)}, got {mode!r}")


def _prelu_infer(X, Alpha, *, mode="all", data_format="NCHW"):
    check_dtype(X, FLOATS, "input X")
    if Alpha.dtype != X.dtype:
        raise ShapeMismatch(f"prelu: Alpha must have X's dtype {X.dtype}, got {Alpha.dtype}")
    want = _prelu_alpha_size(X.shape, mode, data_format)
    if mode == "element" and Alpha.ndim != X.ndim:
        raise ShapeMismatch(f"prelu: in mode 'element' Alpha must have X's rank {X.ndim}, got "
                            f"shape {list(Alpha.shape)}")
    have = _known_prod(Alpha.shape[1:] if mode == "element" else Alpha.shape)
    if want >= 0 and have >= 0 and want != have:
        raise ShapeMismatch(f"prelu: in mode {mode!r} Alpha must hold {want} value(s) for X of "
                            f"shape {list(X.shape)}, got shape {list(Alpha.shape)}")
    return {"Out": X}


def _prelu_alpha(X, Alpha, mode, data_format):
    """Alpha reshaped to broadcast against X (NumPy's rule), after checking its size."""
    want = _prelu_alpha_size(X.shape, mode, data_format)
    if Alpha.size != want:
        raise ShapeMismatch(f"prelu: in mode {mode!r} Alpha must hold {want} value(s) for X of "
                            f"shape {list(X.shape)}, got shape {list(Alpha.shape)}")
    if mode == "all":
        return Alpha.reshape(())
    if mode == "element":
        return Alpha.reshape((1,) + X.shape[1:])
    shape = [1] * X.ndim
    shape[1 if data_format == "NCHW" else -1] = want
    return Alpha.reshape(shape)


def _prelu_ref(X, Alpha, *, mode="all", data_format="NCHW"):
    a = _prelu_alpha(X, Alpha, mode, data_format)
    return {"Out": np.where(X > 0, X, a * X).astype(X.dtype, copy=False)}


def _prelu_grad_ref(X, Alpha, *, mode="all", data_format="NCHW", **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape:
        raise ShapeMismatch(f"prelu_grad: expected Out@GRAD of X's shape {list(X.shape)}, got "
                            f"{list(g.shape)}")
    a = _prelu_alpha(X, Alpha, mode, data_format)
    pos = X > 0
    # Paddle tests X > 0: at 0 the slope is Alpha; Alpha's gradient sums X * Out@GRAD where X <= 0
    dx = np.where(pos, g, a * g).astype(X.dtype, copy=False)
    contrib = np.where(pos, np.zeros((), X.dtype), X * g)
    axes = tuple(i for i in range(X.ndim) if np.ndim(a) == 0 or a.shape[i] == 1)
    da = contrib.sum(axis=axes).reshape(Alpha.shape).astype(Alpha.dtype, copy=False)
    return {"X@GRAD": dx, "Alpha@GRAD": da}


def _prelu_attrs(ctx):
    """(mode, data_format) of the op being lowered, defaults for absent ones."""
    return ctx.attrs.get("mode", "all"), ctx.attrs.get("data_format", "NCHW")


def _prelu_rows(ctx, X, rank):
    """(rows, cols, share): source expressions viewing X as a 2-D array of rows for the mode,
    and which index picks Alpha's value: ``"row"`` (``row % C``), ``"col"`` or ``"one"``."""
    mode, fmt = _prelu_attrs(ctx)
    if mode == "channel" and fmt == "NCHW":
        return f"{X}.shape[0] * {X}.shape[1]", ctx.prod(X, 2, rank), "row"
    if mode == "element":
        return f"{X}.shape[0]", ctx.prod(X, 1, rank), "col"
    last = (ctx.prod(X, 0, rank - 1), f"{X}.shape[{rank - 1}]")
    return (*last, "col") if mode == "channel" else (*last, "one")


def _prelu_check(ctx, X, A, rank) -> list:
    """Lines raising ValueError (the executor then runs the references, which explain) when
    Alpha does not hold the values the mode needs."""
    mode, fmt = _prelu_attrs(ctx)
    if mode == "all":
        want = "1"
    elif mode == "element":
        want = ctx.prod(X, 1, rank)
    else:
        want = f"{X}.shape[{1 if fmt == 'NCHW' else rank - 1}]"
    return [f"if {A}.size != {want}: raise ValueError('pdjit: prelu Alpha size')"]


def _prelu_lowerable(ctx) -> bool:
    r = ctx.rank("X")
    mode, fmt = _prelu_attrs(ctx)
    if mode == "channel" and (r < 2 or fmt not in _PRELU_FORMATS):
        return False
    return (r >= 1 and mode in _PRELU_MODES and ctx.dtype("X").kind == "f"
            and ctx.dtype("Alpha") == ctx.dtype("X"))


def _prelu_row_entry(share, arr, i, X) -> str:
    """Source for the entry of ``arr`` (Alpha or its gradient, flat) that row ``i`` uses
    (shares ``"row"`` and ``"one"``)."""
    return f"{arr}[{i} % {X}.shape[1]]" if share == "row" else f"{arr}[0]"


def _prelu_lower(ctx):
    if not _prelu_lowerable(ctx):
        return None
    X, A, T, r = ctx.inp("X"), ctx.inp("Alpha"), ctx.T("X"), ctx.rank("X")
    out = ctx.out("Out", shape=f"{X}.shape")
    x2, o2, a1, i, k, al, v = (ctx.tmp(h) for h in ("x", "o", "a", "i", "k", "al", "v"))
    rows, cols, share = _prelu_rows(ctx, X, r)
    if share == "col":
        head, alpha = [], f"{a1}[{k}]"
    else:
        head, alpha = [f"{al} = {_prelu_row_entry(share, a1, i, X)}"], al
    body = head + [
        f"for {k} in range({x2}.shape[1]):",
        f"    {v} = {x2}[{i}, {k}]",
        f"    {o2}[{i}, {k}] = {v} if {v} > {T}(0) else {alpha} * {v}",
    ]
    return (_prelu_check(ctx, X, A, r) + [
        f"{x2} = {X}.reshape(({rows}, {cols}))",
        f"{o2} = {out}.reshape({x2}.shape)",
        f"{a1} = {A}.reshape(({A}.size,))",
    ] + ctx.loop(i, f"{x2}.shape[0]", body, size=f"{X}.size"))


def _prelu_grad_lower(ctx):
    """One pass over X: X@GRAD, and Alpha@GRAD's sums of X * Out@GRAD where X <= 0 (summed
    per row first when the row shares one Alpha value). Serial over the rows, which share
    Alpha@GRAD's entries."""
    if not _prelu_lowerable(ctx) or ctx.dtype("Out@GRAD") != ctx.dtype("X"):
        return None
    X, A, G, T, r = ctx.inp("X"), ctx.inp("Alpha"), ctx.inp("Out@GRAD"), ctx.T("X"), ctx.rank("X")
    want_dx, want_da = ctx.has_output("X@GRAD"), ctx.has_output("Alpha@GRAD")
    x2, g2, d2, a1, da1, i, k, al, v, gv, s = (ctx.tmp(h) for h in (
        "x", "g", "d", "a", "da", "i", "k", "al", "v", "gv", "s"))
    rows, cols, share = _prelu_rows(ctx, X, r)
    lines = _prelu_check(ctx, X, A, r) + [
        f"if {G}.size != {X}.size: raise ValueError('pdjit: prelu_grad shapes differ')",
        f"{x2} = {X}.reshape(({rows}, {cols}))",
        f"{g2} = {G}.reshape({x2}.shape)",
        f"{a1} = {A}.reshape(({A}.size,))",
    ]
    if want_dx:
        dx = ctx.out("X@GRAD", shape=f"{X}.shape")
        lines.append(f"{d2} = {dx}.reshape({x2}.shape)")
    if want_da:
        da = ctx.out("Alpha@GRAD", shape=f"{A}.shape", zero=True)
        lines.append(f"{da1} = {da}.reshape(({A}.size,))")
    contrib = f"({T}(0) if {v} > {T}(0) else {v} * {gv})"
    if share == "col":
        head, tail, alpha = [], [], f"{a1}[{k}]"
        acc = f"{da1}[{k}] += {contrib}"
    else:
        head = [f"{al} = {_prelu_row_entry(share, a1, i, X)}"] + \
            ([f"{s} = {T}(0)"] if want_da else [])
        tail = [f"{_prelu_row_entry(share, da1, i, X)} += {s}"] if want_da else []
        alpha = al
        acc = f"{s} += {contrib}"
    body = [f"    {v} = {x2}[{i}, {k}]", f"    {gv} = {g2}[{i}, {k}]"]
    if want_dx:
        body.append(f"    {d2}[{i}, {k}] = {gv} if {v} > {T}(0) else {alpha} * {gv}")
    if want_da:
        body.append(f"    {acc}")
    loop = head + [f"for {k} in range({x2}.shape[1]):"] + body + tail
    return lines + [f"for {i} in range({x2}.shape[0]):"] + ["    " + line for line in loop]


_PRELU_ATTRS = {"mode": Str("all", choices=_PRELU_MODES),
                "data_format": Str("NCHW", choices=_PRELU_FORMATS)}

register_op(
    "prelu", inputs=["X", "Alpha"], outputs=["Out"], attrs=_PRELU_ATTRS, traits=[OPAQUE],
    row_wise=RowWise(const=("Alpha",)),
    infer_shape=_prelu_infer, reference=_prelu_ref, emit=Opaque(_prelu_lower),
    grad=default_grad("prelu_grad", fwd_inputs=("X", "Alpha"), wrt=("X", "Alpha")),
    doc="Out = X if X > 0 else Alpha * X, Alpha shared by mode (all, channel, element).")

register_op(
    "prelu_grad", inputs=["X", "Alpha", "Out@GRAD"], outputs=["X@GRAD?", "Alpha@GRAD?"],
    attrs=_PRELU_ATTRS, traits=[OPAQUE],
    infer_shape=lambda X, Alpha, **_: {"X@GRAD": X, "Alpha@GRAD": Alpha},
    reference=_prelu_grad_ref, emit=Opaque(_prelu_grad_lower), grad=None,
    doc="X@GRAD = Out@GRAD if X > 0 else Alpha * Out@GRAD; Alpha@GRAD = the sum of "
        "X * Out@GRAD where X <= 0 over the elements sharing each Alpha value.")


# ---- scale: Out = scale * X + bias (or scale * (X + bias)) ------------------------------------
def _scale_infer(X, ScaleTensor=None, BiasTensor=None, *, scale=1.0, bias=0.0, **_):
    check_dtype(X, NUMERIC, "input X")
    for name, t, v in (("ScaleTensor", ScaleTensor, scale), ("BiasTensor", BiasTensor, bias)):
        if t is not None and t.shape not in ((), (1,), (-1,)):
            raise ShapeMismatch(f"{name} must hold one value: expected shape [] or [1], got "
                                f"{list(t.shape)}")
        kind = np.dtype(X.dtype).kind
        if t is None and kind in "iu":  # computed in X's dtype: the factor must be one of it
            info = np.iinfo(X.dtype)
            if not (np.isfinite(v) and info.min <= v <= info.max):
                attr = name[:-6].lower()
                raise ShapeMismatch(f"{attr} {v!r} is no {np.dtype(X.dtype)} value (X's dtype, "
                                    f"which the op computes in): expected {info.min} to "
                                    f"{info.max}")
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


def _scale_form(op):
    """A product by a constant: scale's factor given as an attribute, no bias."""
    a = op.all_attrs()
    if op.input("ScaleTensor") or op.input("BiasTensor") or a.get("bias", 0.0) != 0.0:
        return None
    return Scale("X", "Out", float(a.get("scale", 1.0)))


def _scale_inference(op):
    """Scale by 1 with bias 0 (factors given as attributes) leaves X as it is."""
    a = op.all_attrs()
    if op.input("ScaleTensor") or op.input("BiasTensor") or a.get("scale", 1.0) != 1.0 \
            or a.get("bias", 0.0) != 0.0:
        return None
    return Passthrough("X", "Out")


register_op(
    "scale", inputs=["X", "ScaleTensor?", "BiasTensor?"], outputs=["Out"],
    attrs={"scale": Float(1.0, low=-4.0, high=4.0), "bias": Float(0.0, low=-4.0, high=4.0),
           "bias_after_scale": Bool(True)},
    traits=[ELEMENTWISE], infer_shape=_scale_infer, reference=_scale_ref, emit=_scale_emit,
    grad=_scale_grad, inference=_scale_inference, form=_scale_form,
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


# ---- gelu: Out = X * Phi(X), exact (erf) or with Paddle's tanh approximation -------------------
# Paddle 3.3.1's kernels: approximate=False: 0.5 X (1 + erf(X / sqrt 2)); approximate=True:
# 0.5 X (1 + tanh(sqrt(2 / pi) (X + 0.044715 X^3))). gelu_grad reads X and Out@GRAD and gives
# the derivative of the same form. The references work in float64 (math.erf per element).
#
# Natively the tanh form vectorises through ``_m.tanh``; the exact form takes
# Phi(X) = erfc(-X / sqrt 2) / 2 from the code generator's vectorised ``_m.erfc`` (float32 and
# float64; see pdjit.codegen.cpu.mathfuncs): accurate in both tails (Paddle's float32 ``1 + erf``
# loses most digits below X = -3), and several times faster than libm's scalar erf.
_SQRT1_2 = 0.7071067811865476      # 1 / sqrt(2)
_SQRT_2_PI = 0.7978845608028654    # sqrt(2 / pi)
_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 pi)
_GELU_C = 0.044715


def _gelu_np(x, approximate):
    v = np.asarray(x, np.float64)
    if approximate:
        return 0.5 * v * (1.0 + np.tanh(_SQRT_2_PI * (v + _GELU_C * v ** 3)))
    return 0.5 * v * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(v * _SQRT1_2))


def _gelu_dx_np(x, g, approximate):
    v = np.asarray(x, np.float64)
    if approximate:
        t = np.tanh(_SQRT_2_PI * (v + _GELU_C * v ** 3))
        d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * _SQRT_2_PI * (1.0 + 3 * _GELU_C * v * v)
    else:
        cdf = 0.5 * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(v * _SQRT1_2))
        d = cdf + v * _INV_SQRT_2PI * np.exp(-0.5 * v * v)
    return d * g


_PHI = "{T}(0.5) * _m.erfc(v * {T}(%r))" % -_SQRT1_2   # Phi(v)


_GELU_TANH = "_m.tanh({T}(%r) * (v + {T}(%r) * v * v * v))" % (_SQRT_2_PI, _GELU_C)


def _gelu_emit(dtypes_, approximate=False):
    if approximate:
        body = "{T}(0.5) * v * ({T}(1) + " + _GELU_TANH + ")"
    else:
        body = "v * " + _PHI
    return "(lambda v: " + body + ")({X})"


def _gelu_grad_emit(dtypes_, approximate=False):
    if approximate:
        body = ("(lambda t: {T}(0.5) * ({T}(1) + t) + {T}(0.5) * v * ({T}(1) - t * t) * "
                "{T}(%r) * ({T}(1) + {T}(%r) * v * v))(" % (_SQRT_2_PI, 3 * _GELU_C)
                + _GELU_TANH + ")")
    else:
        body = (_PHI + " + v * {T}(%r) * _m.exp({T}(-0.5) * v * v)" % _INV_SQRT_2PI)
    return "{Out@GRAD} * (lambda v: " + body + ")({X})"


def _gelu_infer(X, **_):
    check_dtype(X, FLOATS, "gelu: X")
    return {"Out": X}


def _gelu_grad_infer(X, **_):
    check_dtype(X, FLOATS, "gelu_grad: X")
    return {"X@GRAD": X}


def _gelu_ref(X, *, approximate=False):
    return {"Out": _gelu_np(X, approximate).astype(X.dtype)}


def _gelu_grad_ref(X, *, approximate=False, **kw):
    g = kw["Out@GRAD"]
    if g.shape != X.shape:
        raise ShapeMismatch(f"gelu_grad: expected Out@GRAD of X's shape {list(X.shape)}, got "
                            f"{list(g.shape)}")
    return {"X@GRAD": _gelu_dx_np(X, g, approximate).astype(X.dtype)}


_GELU_ATTRS = {"approximate": Bool(False)}

register_op(
    "gelu", inputs=["X"], outputs=["Out"], attrs=dict(_GELU_ATTRS), traits=[ELEMENTWISE],
    infer_shape=_gelu_infer, reference=_gelu_ref, emit=_gelu_emit,
    grad=default_grad("gelu_grad", fwd_inputs=("X",)),
    doc="Out = 0.5 X (1 + erf(X / sqrt 2)), or with approximate 0.5 X (1 + tanh(sqrt(2 / pi) "
        "(X + 0.044715 X^3))).")

register_op(
    "gelu_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"], attrs=dict(_GELU_ATTRS),
    traits=[ELEMENTWISE], infer_shape=_gelu_grad_infer, reference=_gelu_grad_ref,
    emit=_gelu_grad_emit, grad=None, doc="X@GRAD = Out@GRAD * gelu'(X) (gradient of gelu).")
