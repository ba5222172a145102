"""Optimizer update ops: ``sgd``, ``momentum``, ``adam``, ``adamw``, ``adagrad``, ``rmsprop``.

Types, slots and attributes are PaddlePaddle 3.3.1's legacy ops; the update formulas are those
of its CPU kernels, checked numerically against Paddle (float32 and float64, several steps):

- ``sgd``:      ``p -= lr * g``
- ``momentum``: ``g' = g + coeff * p`` (only with ``regularization_method="l2_decay"``);
  ``v = mu * v + g'``; ``p -= lr * v``, or with Nesterov ``p -= lr * (g' + mu * v)``.
  ``rescale_grad`` is accepted and, as in Paddle's CPU kernel for dense gradients, not applied.
- ``adam``:     ``m1 = b1 * m1 + (1 - b1) * g``; ``m2 = b2 * m2 + (1 - b2) * g * g``;
  ``lr_t = lr * sqrt(1 - b2p) / (1 - b1p)``; ``p -= lr_t * m1 / (sqrt(m2) + eps * sqrt(1 - b2p))``
  where ``b1p``/``b2p`` are the *input* beta powers; then ``b1p *= b1``, ``b2p *= b2``
  (Paddle's optimizer initialises them to ``b1``/``b2``, so the first step uses ``b1``).
  ``amsgrad`` uses ``max(m2, Moment2Max)`` in the denominator.
- ``adamw``:    with ``with_decay``, first ``p -= lr * lr_ratio * coeff * p``, then adam on the
  decayed ``p`` with the plain ``lr`` (Paddle's CPU kernel; ``lr_ratio`` scales only the decay).
- ``adagrad``:  ``m += g * g``; ``p -= lr * g / (sqrt(m) + eps)``
- ``rmsprop``:  ``ms = rho * ms + (1 - rho) * g * g``; centered: ``mg = rho * mg + (1 - rho) * g``
  and ``mom = momentum * mom + lr * g / sqrt(ms - mg * mg + eps)``, else
  ``mom = momentum * mom + lr * g / sqrt(ms + eps)``; ``p -= mom``.

Arithmetic is in the parameter's dtype (float attributes are float32 in the program, as in
Paddle), or in MasterParam's dtype when ``multi_precision`` is set and a MasterParam is given
(then ParamOut is the master result cast to Param's dtype, and MasterParamOut the master).

``LearningRate`` is a 1-element (or 0-d) tensor. ParamOut usually names the Param variable
itself (the update is in place in the program); the references always return new arrays.
These ops write persistable state and have no gradient.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import OPAQUE, Bool, Float, Long, Opaque, Str, register_op
from pdjit.ops._common import FLOATS, check_dtype

_F32 = np.float32


def _dims_agree(a: int, b: int) -> bool:
    return a == b or a < 0 or b < 0


def _check_like(meta, param, what: str, op: str) -> None:
    """``meta`` (a state or gradient) must have the parameter's shape and dtype."""
    if meta is None:
        return
    if meta.dtype != param.dtype or len(meta.shape) != len(param.shape) or \
            not all(_dims_agree(a, b) for a, b in zip(meta.shape, param.shape)):
        raise ShapeMismatch(f"{op}: {what} must match Param: expected {param.dtype}"
                            f"{list(param.shape)}, got {meta.dtype}{list(meta.shape)}")


def _check_scalar(meta, what: str, op: str) -> None:
    """A 1-element tensor: shape [], [1] (or unknown)."""
    if meta is None:
        return
    check_dtype(meta, FLOATS, f"{op}: {what}")
    if meta.shape not in ((), (1,), (-1,)):
        raise ShapeMismatch(f"{op}: {what} must hold one value: expected shape [1] or [], got "
                            f"{list(meta.shape)}")


def _scalar(a: np.ndarray, what: str, op: str) -> float:
    a = np.asarray(a)
    if a.size != 1:
        raise ShapeMismatch(f"{op}: {what} must hold one value: expected shape [1] or [], got "
                            f"{list(a.shape)}")
    return a.reshape(-1)[0]


def _check_run(arrays: dict, param: np.ndarray, op: str) -> None:
    for what, a in arrays.items():
        if a is not None and a.shape != param.shape:
            raise ShapeMismatch(f"{op}: {what} must have Param's shape: expected "
                                f"{list(param.shape)}, got {list(a.shape)}")


def _master(Param, MasterParam, multi_precision):
    """The array the update works on and its scalar type (the master copy when asked)."""
    p = MasterParam if (multi_precision and MasterParam is not None) else Param
    return p, p.dtype.type


def _param_outs(new_p, Param, MasterParam, multi_precision) -> dict:
    if multi_precision and MasterParam is not None:
        return {"ParamOut": new_p.astype(Param.dtype), "MasterParamOut": new_p}
    return {"ParamOut": new_p.astype(Param.dtype, copy=False)}


def _f(x, T):
    """An attribute (a float32 in the program, as Paddle stores it) as the compute type."""
    return T(_F32(x))


def _param_infer(Param, MasterParam=None, **_):
    check_dtype(Param, FLOATS, "Param")
    out = {"ParamOut": Param}
    if MasterParam is not None:
        out["MasterParamOut"] = MasterParam
    return out


_MULTI = {"multi_precision": Bool(False)}


# ---- lowering --------------------------------------------------------------------------------
def _elementwise_lower(slots_in, slots_out, prologue, body, check_scalars=("LearningRate",)):
    """A flat loop over the parameter's elements.

    ``prologue(ctx, T, v)`` gives lines computing scalars once (``v`` maps slot -> flat local,
    scalar slots -> their 1-element flat view); ``body(ctx, T, v, i)`` the lines of one element.
    Declines for master params and dtypes other than float32/float64. The kernel is ``flat``
    (every array 1-D); outputs are new arrays the driver allocates, even when they name an
    input variable (``ParamOut`` = ``Param``), so the inputs stay untouched should the segment
    fall back to the references.
    """
    def lower(ctx):
        if ctx.has_input("MasterParam"):
            return None
        t = ctx.dtype("Param")
        if t not in (np.dtype(np.float32), np.dtype(np.float64)):
            return None
        if any(ctx.has_input(s) and ctx.dtype(s) != t for s in slots_in):
            return None
        T = ctx.T("Param")
        P = ctx.inp("Param")
        v, lines = {}, []
        for s in slots_in:
            if s == "Param" or not ctx.has_input(s):
                continue
            a = ctx.inp(s)
            lines.append(f"if {a}.size != {P}.size: raise ValueError('pdjit: {s} size')")
            v[s] = ctx.tmp(s[:2].lower())
            lines.append(f"{v[s]} = {a}.reshape({a}.size)")
        v["Param"] = ctx.tmp("p")
        lines.append(f"{v['Param']} = {P}.reshape({P}.size)")
        for s in check_scalars:
            a = ctx.inp(s)
            lines.append(f"if {a}.size != 1: raise ValueError('pdjit: {s} must hold one value')")
            v[s] = ctx.tmp(s[:2].lower())
            lines.append(f"{v[s]} = {a}.reshape(1)")
        for s in slots_out:
            if ctx.has_output(s):
                v[s] = ctx.out(s, shape=f"{P}.shape")
        lines += prologue(ctx, T, v)
        i = ctx.tmp("i")
        lines.append(f"for {i} in range({v['Param']}.size):")
        lines += ["    " + line for line in body(ctx, T, v, i)]
        return lines
    return lower


def _lit(ctx, name: str, T: str) -> str:
    return f"{T}({float(_F32(ctx.attrs[name]))!r})"


# ---- sgd -----------------------------------------------------------------------------------------
def _sgd_infer(Param, LearningRate, Grad, MasterParam=None, **_):
    _check_like(Grad, Param, "Grad", "sgd")
    _check_scalar(LearningRate, "LearningRate", "sgd")
    return _param_infer(Param, MasterParam)


def _sgd_ref(Param, LearningRate, Grad, MasterParam=None, *, multi_precision):
    _check_run({"Grad": Grad}, Param, "sgd")
    p, T = _master(Param, MasterParam, multi_precision)
    lr = T(_scalar(LearningRate, "LearningRate", "sgd"))
    return _param_outs(p - lr * Grad.astype(T, copy=False), Param, MasterParam, multi_precision)


register_op(
    "sgd", inputs=["Param", "LearningRate", "Grad", "MasterParam?"],
    outputs=["ParamOut", "MasterParamOut?"], attrs=dict(_MULTI), traits=[OPAQUE],
    infer_shape=_sgd_infer, reference=_sgd_ref,
    emit=Opaque(_elementwise_lower(
        ("Param", "Grad"), ("ParamOut",),
        lambda ctx, T, v: [f"lr_ = {T}({v['LearningRate']}[0])"],
        lambda ctx, T, v, i: [f"{v['ParamOut']}[{i}] = {v['Param']}[{i}] - lr_ * "
                              f"{v['Grad']}[{i}]"]), flat=True),
    grad=None, doc="ParamOut = Param - LearningRate * Grad.")


# ---- momentum ------------------------------------------------------------------------------------
def _momentum_infer(Param, Grad, Velocity, LearningRate, MasterParam=None, **_):
    _check_like(Grad, Param, "Grad", "momentum")
    _check_like(Velocity, Param, "Velocity", "momentum")
    _check_scalar(LearningRate, "LearningRate", "momentum")
    return {**_param_infer(Param, MasterParam), "VelocityOut": Velocity}


_REG_METHODS = ("", "l2_decay")


def _momentum_ref(Param, Grad, Velocity, LearningRate, MasterParam=None, *, mu, use_nesterov,
                  regularization_method, regularization_coeff, multi_precision, **_):
    if regularization_method not in _REG_METHODS:
        raise ValueError(f"momentum: regularization_method must be one of {list(_REG_METHODS)},"
                         f" got {regularization_method!r}")
    _check_run({"Grad": Grad, "Velocity": Velocity}, Param, "momentum")
    p, T = _master(Param, MasterParam, multi_precision)
    lr = T(_scalar(LearningRate, "LearningRate", "momentum"))
    g = Grad.astype(T, copy=False)
    if regularization_method == "l2_decay":
        g = g + _f(regularization_coeff, T) * p
    v = _f(mu, T) * Velocity.astype(T, copy=False) + g
    new_p = p - (g + _f(mu, T) * v) * lr if use_nesterov else p - lr * v
    return {**_param_outs(new_p, Param, MasterParam, multi_precision),
            "VelocityOut": v.astype(Velocity.dtype, copy=False)}


def _momentum_prologue(ctx, T, v):
    reg = ctx.attrs["regularization_method"]
    if reg not in _REG_METHODS:
        raise ValueError(f"momentum: regularization_method must be one of {list(_REG_METHODS)}, "
                         f"got {reg!r}")
    coeff = _lit(ctx, "regularization_coeff", T) if reg == "l2_decay" else f"{T}(0.0)"
    return [f"lr_ = {T}({v['LearningRate']}[0])", f"mu_ = {_lit(ctx, 'mu', T)}",
            f"rc_ = {coeff}"]


def _momentum_body(ctx, T, v, i):
    p = f"{v['Param']}[{i}]"
    upd = "(g_ + mu_ * v_) * lr_" if ctx.attrs["use_nesterov"] else "lr_ * v_"
    return [f"g_ = {v['Grad']}[{i}] + rc_ * {p}",
            f"v_ = mu_ * {v['Velocity']}[{i}] + g_",
            f"{v['VelocityOut']}[{i}] = v_",
            f"{v['ParamOut']}[{i}] = {p} - {upd}"]


register_op(
    "momentum", inputs=["Param", "Grad", "Velocity", "LearningRate", "MasterParam?"],
    outputs=["ParamOut", "VelocityOut", "MasterParamOut?"],
    attrs={"mu": Float(low=0.0, high=1.0), "use_nesterov": Bool(False),
           "regularization_method": Str("", choices=_REG_METHODS),
           "regularization_coeff": Float(0.0, low=0.0, high=0.1), **_MULTI,
           "rescale_grad": Float(1.0, low=0.5, high=2.0)},
    traits=[OPAQUE], infer_shape=_momentum_infer, reference=_momentum_ref,
    emit=Opaque(_elementwise_lower(("Param", "Grad", "Velocity"), ("ParamOut", "VelocityOut"),
                                   _momentum_prologue, _momentum_body),
                flat=True),
    grad=None,
    doc="VelocityOut = mu * Velocity + Grad (+ l2 coeff * Param); ParamOut = Param - lr * "
        "VelocityOut (Nesterov: Param - lr * (Grad + mu * VelocityOut)).")


# ---- adam / adamw --------------------------------------------------------------------------------
_ADAM_INPUTS = ["Param", "Grad", "LearningRate", "Moment1", "Moment2", "Moment2Max?", "Beta1Pow",
                "Beta2Pow", "MasterParam?", "SkipUpdate?", "Beta1Tensor?", "Beta2Tensor?",
                "EpsilonTensor?"]
_ADAM_OUTPUTS = ["ParamOut", "Moment1Out", "Moment2Out", "Moment2MaxOut?", "Beta1PowOut",
                 "Beta2PowOut", "MasterParamOut?"]
_ADAM_ATTRS = {
    "beta1": Float(0.9, low=0.0, high=0.99), "beta2": Float(0.999, low=0.0, high=0.9999),
    "epsilon": Float(1e-8, low=1e-10, high=1e-3), "lazy_mode": Bool(False),
    "min_row_size_to_use_multithread": Long(1000), **_MULTI,
    "use_global_beta_pow": Bool(False), "amsgrad": Bool(False)}


def _adam_infer(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow,
                Moment2Max=None, MasterParam=None, SkipUpdate=None, Beta1Tensor=None,
                Beta2Tensor=None, EpsilonTensor=None, **_):
    for what, meta in (("Grad", Grad), ("Moment1", Moment1), ("Moment2", Moment2),
                       ("Moment2Max", Moment2Max)):
        _check_like(meta, Param, what, "adam")
    for what, meta in (("LearningRate", LearningRate), ("Beta1Pow", Beta1Pow),
                       ("Beta2Pow", Beta2Pow), ("Beta1Tensor", Beta1Tensor),
                       ("Beta2Tensor", Beta2Tensor), ("EpsilonTensor", EpsilonTensor)):
        _check_scalar(meta, what, "adam")
    out = {**_param_infer(Param, MasterParam), "Moment1Out": Moment1, "Moment2Out": Moment2,
           "Beta1PowOut": Beta1Pow, "Beta2PowOut": Beta2Pow}
    if Moment2Max is not None:
        out["Moment2MaxOut"] = Moment2Max
    return out


def _adam_step(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, Moment2Max,
               MasterParam, SkipUpdate, Beta1Tensor, Beta2Tensor, EpsilonTensor, *, beta1,
               beta2, epsilon, multi_precision, use_global_beta_pow, amsgrad, decay=None,
               op="adam"):
    """One adam (or, with ``decay`` = (coeff, lr_ratio), adamw) update; new arrays only."""
    _check_run({"Grad": Grad, "Moment1": Moment1, "Moment2": Moment2,
                "Moment2Max": Moment2Max}, Param, op)
    p, T = _master(Param, MasterParam, multi_precision)
    outs = {"Moment1Out": Moment1.copy(), "Moment2Out": Moment2.copy(),
            "Beta1PowOut": Beta1Pow.copy(), "Beta2PowOut": Beta2Pow.copy()}
    if Moment2Max is not None:
        outs["Moment2MaxOut"] = Moment2Max.copy()
    if SkipUpdate is not None and bool(_scalar(SkipUpdate, "SkipUpdate", op)):
        return {**_param_outs(p.copy(), Param, MasterParam, multi_precision), **outs}
    # a 0-d tensor input, when given, replaces its attribute
    b1 = T(_scalar(Beta1Tensor, "Beta1Tensor", op)) if Beta1Tensor is not None else _f(beta1, T)
    b2 = T(_scalar(Beta2Tensor, "Beta2Tensor", op)) if Beta2Tensor is not None else _f(beta2, T)
    eps = T(_scalar(EpsilonTensor, "EpsilonTensor", op)) if EpsilonTensor is not None \
        else _f(epsilon, T)
    lr = T(_scalar(LearningRate, "LearningRate", op))
    b1p = T(_scalar(Beta1Pow, "Beta1Pow", op))
    b2p = T(_scalar(Beta2Pow, "Beta2Pow", op))
    one = T(1)
    if decay is not None:  # adamw: decoupled weight decay on the parameter first
        coeff, lr_ratio = decay
        p = p - lr * _f(lr_ratio, T) * _f(coeff, T) * p
    g = Grad.astype(T, copy=False)
    m1 = b1 * Moment1.astype(T, copy=False) + (one - b1) * g
    m2 = b2 * Moment2.astype(T, copy=False) + (one - b2) * g * g
    denom_m2 = m2
    if amsgrad and Moment2Max is not None:
        denom_m2 = np.maximum(m2, Moment2Max.astype(T, copy=False))
        outs["Moment2MaxOut"] = denom_m2.astype(Moment2Max.dtype, copy=False)
    lr_t = lr * np.sqrt(one - b2p) / (one - b1p)
    new_p = p - lr_t * (m1 / (np.sqrt(denom_m2) + eps * np.sqrt(one - b2p)))
    outs["Moment1Out"] = m1.astype(Moment1.dtype, copy=False)
    outs["Moment2Out"] = m2.astype(Moment2.dtype, copy=False)
    if not use_global_beta_pow:  # else the program updates the beta pows itself
        outs["Beta1PowOut"] = (Beta1Pow * Beta1Pow.dtype.type(b1)).astype(Beta1Pow.dtype)
        outs["Beta2PowOut"] = (Beta2Pow * Beta2Pow.dtype.type(b2)).astype(Beta2Pow.dtype)
    return {**_param_outs(new_p, Param, MasterParam, multi_precision), **outs}


def _adam_ref(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow, Moment2Max=None,
              MasterParam=None, SkipUpdate=None, Beta1Tensor=None, Beta2Tensor=None,
              EpsilonTensor=None, *, beta1, beta2, epsilon, multi_precision,
              use_global_beta_pow, amsgrad, **_):
    return _adam_step(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow,
                      Moment2Max, MasterParam, SkipUpdate, Beta1Tensor, Beta2Tensor,
                      EpsilonTensor, beta1=beta1, beta2=beta2, epsilon=epsilon,
                      multi_precision=multi_precision, use_global_beta_pow=use_global_beta_pow,
                      amsgrad=amsgrad)


def _adam_lower(ctx):
    """The common case natively: no master param, skip flag, tensor betas or amsgrad."""
    if any(ctx.has_input(s) for s in ("Moment2Max", "SkipUpdate", "Beta1Tensor", "Beta2Tensor",
                                      "EpsilonTensor")):
        return None
    t = ctx.dtype("Param")
    if ctx.dtype("Beta1Pow") != t or ctx.dtype("Beta2Pow") != t:
        return None
    return _adam_loop(ctx)


def _adam_prologue(ctx, T, v):
    lines = [f"lr_ = {T}({v['LearningRate']}[0])", f"b1_ = {_lit(ctx, 'beta1', T)}",
             f"b2_ = {_lit(ctx, 'beta2', T)}", f"eps_ = {_lit(ctx, 'epsilon', T)}",
             f"b1p_ = {T}({v['Beta1Pow']}[0])", f"b2p_ = {T}({v['Beta2Pow']}[0])",
             f"one_ = {T}(1)",
             "lrt_ = lr_ * np.sqrt(one_ - b2p_) / (one_ - b1p_)",
             "epst_ = eps_ * np.sqrt(one_ - b2p_)"]
    keep = ctx.attrs["use_global_beta_pow"]
    for pw, pow_, b in (("Beta1Pow", "b1p_", "b1_"), ("Beta2Pow", "b2p_", "b2_")):
        out = ctx.out(f"{pw}Out", shape=f"{ctx.inp(pw)}.shape")
        lines.append(f"{out}[0] = {pow_}" + ("" if keep else f" * {b}"))
    return lines


def _adam_body(ctx, T, v, i):
    p = f"{v['Param']}[{i}]"
    decayed = "coeff" in ctx.attrs and ctx.attrs.get("with_decay")
    return ([f"p_ = {p} - lr_ * {_lit(ctx, 'lr_ratio', T)} * {_lit(ctx, 'coeff', T)} * {p}"]
            if decayed else [f"p_ = {p}"]) + [
        f"g_ = {v['Grad']}[{i}]",
        f"m1_ = b1_ * {v['Moment1']}[{i}] + (one_ - b1_) * g_",
        f"m2_ = b2_ * {v['Moment2']}[{i}] + (one_ - b2_) * g_ * g_",
        f"{v['Moment1Out']}[{i}] = m1_",
        f"{v['Moment2Out']}[{i}] = m2_",
        f"{v['ParamOut']}[{i}] = p_ - lrt_ * (m1_ / (np.sqrt(m2_) + epst_))"]


_adam_loop = _elementwise_lower(("Param", "Grad", "Moment1", "Moment2"),
                                ("ParamOut", "Moment1Out", "Moment2Out"), _adam_prologue,
                                _adam_body,
                                check_scalars=("LearningRate", "Beta1Pow", "Beta2Pow"))

register_op(
    "adam", inputs=_ADAM_INPUTS, outputs=_ADAM_OUTPUTS, attrs=dict(_ADAM_ATTRS),
    traits=[OPAQUE], infer_shape=_adam_infer, reference=_adam_ref,
    emit=Opaque(_adam_lower, flat=True),
    grad=None,
    doc="Adam: moments updated, ParamOut = Param - lr * sqrt(1 - b2p) / (1 - b1p) * m1 / "
        "(sqrt(m2) + epsilon * sqrt(1 - b2p)); beta pows multiplied by beta1/beta2.")


def _adamw_ref(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow,
               Moment2Max=None, MasterParam=None, SkipUpdate=None, Beta1Tensor=None,
               Beta2Tensor=None, EpsilonTensor=None, *, beta1, beta2, epsilon, lr_ratio, coeff,
               with_decay, multi_precision, use_global_beta_pow, amsgrad, **_):
    return _adam_step(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow,
                      Moment2Max, MasterParam, SkipUpdate, Beta1Tensor, Beta2Tensor,
                      EpsilonTensor, beta1=beta1, beta2=beta2, epsilon=epsilon,
                      multi_precision=multi_precision, use_global_beta_pow=use_global_beta_pow,
                      amsgrad=amsgrad, decay=(coeff, lr_ratio) if with_decay else None,
                      op="adamw")


register_op(
    "adamw", inputs=_ADAM_INPUTS, outputs=_ADAM_OUTPUTS,
    attrs={**_ADAM_ATTRS, "lr_ratio": Float(1.0, low=0.1, high=1.0),
           "coeff": Float(0.01, low=0.0, high=0.1), "with_decay": Bool(False)},
    traits=[OPAQUE], infer_shape=_adam_infer, reference=_adamw_ref,
    emit=Opaque(_adam_lower, flat=True),
    grad=None,
    doc="AdamW: with with_decay, Param -= lr * lr_ratio * coeff * Param, then the adam update.")


# ---- adagrad -------------------------------------------------------------------------------------
def _adagrad_infer(Param, Grad, Moment, LearningRate, MasterParam=None, **_):
    _check_like(Grad, Param, "Grad", "adagrad")
    _check_like(Moment, Param, "Moment", "adagrad")
    _check_scalar(LearningRate, "LearningRate", "adagrad")
    return {**_param_infer(Param, MasterParam), "MomentOut": Moment}


def _adagrad_ref(Param, Grad, Moment, LearningRate, MasterParam=None, *, epsilon,
                 multi_precision):
    _check_run({"Grad": Grad, "Moment": Moment}, Param, "adagrad")
    p, T = _master(Param, MasterParam, multi_precision)
    lr = T(_scalar(LearningRate, "LearningRate", "adagrad"))
    g = Grad.astype(T, copy=False)
    m = Moment.astype(T, copy=False) + g * g
    new_p = p - lr * g / (np.sqrt(m) + _f(epsilon, T))
    return {**_param_outs(new_p, Param, MasterParam, multi_precision),
            "MomentOut": m.astype(Moment.dtype, copy=False)}


register_op(
    "adagrad", inputs=["Param", "Grad", "Moment", "LearningRate", "MasterParam?"],
    outputs=["ParamOut", "MomentOut", "MasterParamOut?"],
    attrs={"epsilon": Float(1e-6, low=1e-10, high=1e-3), **_MULTI}, traits=[OPAQUE],
    infer_shape=_adagrad_infer, reference=_adagrad_ref, emit=None, grad=None,
    doc="MomentOut = Moment + Grad^2; ParamOut = Param - lr * Grad / (sqrt(MomentOut) + eps).")


# ---- rmsprop -------------------------------------------------------------------------------------
def _rmsprop_infer(Param, MeanSquare, Grad, Moment, LearningRate, MeanGrad=None,
                   MasterParam=None, **_):
    for what, meta in (("Grad", Grad), ("Moment", Moment), ("MeanSquare", MeanSquare),
                       ("MeanGrad", MeanGrad)):
        _check_like(meta, Param, what, "rmsprop")
    _check_scalar(LearningRate, "LearningRate", "rmsprop")
    return {**_param_infer(Param, MasterParam), "MomentOut": Moment,
            "MeanSquareOut": MeanSquare, "MeanGradOut": MeanGrad or Param}


def _rmsprop_ref(Param, MeanSquare, Grad, Moment, LearningRate, MeanGrad=None,
                 MasterParam=None, *, epsilon, decay, momentum, centered, multi_precision):
    _check_run({"Grad": Grad, "Moment": Moment, "MeanSquare": MeanSquare,
                "MeanGrad": MeanGrad}, Param, "rmsprop")
    p, T = _master(Param, MasterParam, multi_precision)
    rho, eps, mom = _f(decay, T), _f(epsilon, T), _f(momentum, T)
    lr = T(_scalar(LearningRate, "LearningRate", "rmsprop"))
    one = T(1)
    g = Grad.astype(T, copy=False)
    ms = rho * MeanSquare.astype(T, copy=False) + (one - rho) * g * g
    if centered:
        if MeanGrad is None:
            raise ShapeMismatch("rmsprop: centered=True needs the MeanGrad input: expected a "
                                "tensor of Param's shape, got none")
        mg = rho * MeanGrad.astype(T, copy=False) + (one - rho) * g
        mo = mom * Moment.astype(T, copy=False) + lr * g / np.sqrt(ms - mg * mg + eps)
    else:  # MeanGradOut passes MeanGrad through (Paddle leaves it as it was)
        mg = MeanGrad.copy() if MeanGrad is not None else np.zeros(Param.shape, T)
        mo = mom * Moment.astype(T, copy=False) + lr * g / np.sqrt(ms + eps)
    return {**_param_outs(p - mo, Param, MasterParam, multi_precision),
            "MomentOut": mo.astype(Moment.dtype, copy=False),
            "MeanSquareOut": ms.astype(MeanSquare.dtype, copy=False),
            "MeanGradOut": mg.astype(MeanGrad.dtype if MeanGrad is not None else Param.dtype,
                                     copy=False)}


register_op(
    "rmsprop", inputs=["Param", "MeanSquare", "Grad", "Moment", "LearningRate", "MeanGrad?",
                       "MasterParam?"],
    outputs=["ParamOut", "MomentOut", "MeanSquareOut", "MeanGradOut?", "MasterParamOut?"],
    attrs={"epsilon": Float(1e-10, low=1e-10, high=1e-3), "decay": Float(0.9, low=0.0, high=1.0),
           "momentum": Float(0.0, low=0.0, high=0.99), "centered": Bool(False), **_MULTI},
    traits=[OPAQUE], infer_shape=_rmsprop_infer, reference=_rmsprop_ref, emit=None, grad=None,
    doc="MeanSquareOut = rho * ms + (1 - rho) * g^2; MomentOut = momentum * mom + lr * g / "
        "sqrt(ms (- mg^2 when centered) + eps); ParamOut = Param - MomentOut.")
