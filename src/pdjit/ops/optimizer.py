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
from pdjit.framework.registry import OPAQUE, Bool, Float, Floats, Long, Opaque, Str, register_op
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
def _flat_lower(slots_in, slots_out, code, check_scalars=("LearningRate",)):
    """Lines over the parameter's elements, flat (every array 1-D).

    ``code(ctx, T, v)`` gives the lines after the set-up (``v`` maps slot -> flat local, scalar
    slots -> their 1-element flat view, output slots -> the driver-allocated output). Declines
    for master params and dtypes other than float32/float64. The kernel is ``flat``; outputs are
    new arrays the driver allocates, even when they name an input variable (``ParamOut`` =
    ``Param``), so the inputs stay untouched should the segment fall back to the references.
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
                if ctx.device:  # (a host target's flat kernel gets every array 1-D)
                    f = ctx.tmp("o")
                    lines.append(f"{f} = {v[s]}.reshape({v[s]}.size)")
                    v[s] = f
        return lines + code(ctx, T, v)
    return lower


def _elementwise_lower(slots_in, slots_out, prologue, body, check_scalars=("LearningRate",)):
    """A flat loop over the parameter's elements (see ``_flat_lower``): ``prologue(ctx, T, v)``
    gives lines computing scalars once, ``body(ctx, T, v, i)`` the lines of one element."""
    def code(ctx, T, v):
        i = ctx.tmp("i")
        if ctx.device:  # a device target: the same lines as one grid-stride kernel
            return ctx.device_loop(i, f"{v['Param']}.size", body(ctx, T, v, i),
                                   before=prologue(ctx, T, v))
        return prologue(ctx, T, v) + [f"for {i} in range({v['Param']}.size):"] + \
            ["    " + line for line in body(ctx, T, v, i)]
    return _flat_lower(slots_in, slots_out, code, check_scalars)


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
    infer_shape=_adagrad_infer, reference=_adagrad_ref,
    emit=Opaque(_elementwise_lower(
        ("Param", "Grad", "Moment"), ("ParamOut", "MomentOut"),
        lambda ctx, T, v: [f"lr_ = {T}({v['LearningRate']}[0])",
                           f"eps_ = {_lit(ctx, 'epsilon', T)}"],
        lambda ctx, T, v, i: [
            f"g_ = {v['Grad']}[{i}]",
            f"m_ = {v['Moment']}[{i}] + g_ * g_",
            f"{v['MomentOut']}[{i}] = m_",
            f"{v['ParamOut']}[{i}] = {v['Param']}[{i}] - lr_ * g_ / (np.sqrt(m_) + eps_)"]),
        flat=True),
    grad=None,
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


def _rmsprop_prologue(ctx, T, v):
    return [f"lr_ = {T}({v['LearningRate']}[0])", f"rho_ = {_lit(ctx, 'decay', T)}",
            f"eps_ = {_lit(ctx, 'epsilon', T)}", f"mom_ = {_lit(ctx, 'momentum', T)}",
            f"one_ = {T}(1)"]


def _rmsprop_body(ctx, T, v, i):
    lines = [f"g_ = {v['Grad']}[{i}]",
             f"ms_ = rho_ * {v['MeanSquare']}[{i}] + (one_ - rho_) * g_ * g_",
             f"{v['MeanSquareOut']}[{i}] = ms_"]
    if ctx.attrs["centered"]:
        lines += [f"mg_ = rho_ * {v['MeanGrad']}[{i}] + (one_ - rho_) * g_",
                  "den_ = np.sqrt(ms_ - mg_ * mg_ + eps_)"]
    else:  # MeanGradOut passes MeanGrad through (Paddle leaves it as it was)
        lines += [f"mg_ = {v['MeanGrad']}[{i}]" if "MeanGrad" in v else f"mg_ = {T}(0)",
                  "den_ = np.sqrt(ms_ + eps_)"]
    lines += [f"mo_ = mom_ * {v['Moment']}[{i}] + lr_ * g_ / den_",
              f"{v['MomentOut']}[{i}] = mo_",
              f"{v['ParamOut']}[{i}] = {v['Param']}[{i}] - mo_"]
    if "MeanGradOut" in v:
        lines.append(f"{v['MeanGradOut']}[{i}] = mg_")
    return lines


_rmsprop_loop = _elementwise_lower(
    ("Param", "Grad", "MeanSquare", "Moment", "MeanGrad"),
    ("ParamOut", "MomentOut", "MeanSquareOut", "MeanGradOut"), _rmsprop_prologue,
    _rmsprop_body)


def _rmsprop_lower(ctx):
    """The rmsprop update as one flat loop; centered needs MeanGrad (the reference names
    its absence)."""
    if ctx.attrs["centered"] and not ctx.has_input("MeanGrad"):
        return None
    return _rmsprop_loop(ctx)


register_op(
    "rmsprop", inputs=["Param", "MeanSquare", "Grad", "Moment", "LearningRate", "MeanGrad?",
                       "MasterParam?"],
    outputs=["ParamOut", "MomentOut", "MeanSquareOut", "MeanGradOut?", "MasterParamOut?"],
    attrs={"epsilon": Float(1e-10, low=1e-10, high=1e-3), "decay": Float(0.9, low=0.0, high=1.0),
           "momentum": Float(0.0, low=0.0, high=0.99), "centered": Bool(False), **_MULTI},
    traits=[OPAQUE], infer_shape=_rmsprop_infer, reference=_rmsprop_ref,
    emit=Opaque(_rmsprop_lower, flat=True), grad=None,
    doc="MeanSquareOut = rho * ms + (1 - rho) * g^2; MomentOut = momentum * mom + lr * g / "
        "sqrt(ms (- mg^2 when centered) + eps); ParamOut = Param - MomentOut.")


# ---- helpers of the norm-based updates ----------------------------------------------------------
def _norm(a: np.ndarray, T):
    """The L2 norm of ``a`` (summed in float64, as the native code does) as the type ``T``."""
    a = np.asarray(a, np.float64).reshape(-1)
    return T(np.sqrt(np.dot(a, a)))


def _with_scalar_outputs(lines, ctx, pairs):
    """Lines writing 1-element outputs: ``pairs`` of (output slot, input slot, expression)."""
    for out_slot, in_slot, expr in pairs:
        if ctx.has_output(out_slot):
            out = ctx.out(out_slot, shape=f"{ctx.inp(in_slot)}.shape")
            lines.append(f"{out}[0] = {expr}")
    return lines


# ---- adamax --------------------------------------------------------------------------------------
def _adamax_infer(Param, Grad, LearningRate, Moment, InfNorm, Beta1Pow, MasterParam=None, **_):
    for what, meta in (("Grad", Grad), ("Moment", Moment), ("InfNorm", InfNorm)):
        _check_like(meta, Param, what, "adamax")
    _check_scalar(LearningRate, "LearningRate", "adamax")
    _check_scalar(Beta1Pow, "Beta1Pow", "adamax")
    return {**_param_infer(Param, MasterParam), "MomentOut": Moment, "InfNormOut": InfNorm}


def _adamax_ref(Param, Grad, LearningRate, Moment, InfNorm, Beta1Pow, MasterParam=None, *,
                beta1, beta2, epsilon, multi_precision):
    _check_run({"Grad": Grad, "Moment": Moment, "InfNorm": InfNorm}, Param, "adamax")
    p, T = _master(Param, MasterParam, multi_precision)
    lr = T(_scalar(LearningRate, "LearningRate", "adamax"))
    b1p = T(_scalar(Beta1Pow, "Beta1Pow", "adamax"))
    b1, b2, eps, one = _f(beta1, T), _f(beta2, T), _f(epsilon, T), T(1)
    g = Grad.astype(T, copy=False)
    m = b1 * Moment.astype(T, copy=False) + (one - b1) * g
    inf = np.maximum(b2 * InfNorm.astype(T, copy=False) + eps, np.abs(g))
    new_p = p - (lr / (one - b1p)) * (m / inf)
    return {**_param_outs(new_p, Param, MasterParam, multi_precision),
            "MomentOut": m.astype(Moment.dtype, copy=False),
            "InfNormOut": inf.astype(InfNorm.dtype, copy=False)}


def _adamax_lower(ctx):
    if ctx.dtype("Beta1Pow") != ctx.dtype("Param"):
        return None
    return _adamax_loop(ctx)


_adamax_loop = _elementwise_lower(
    ("Param", "Grad", "Moment", "InfNorm"), ("ParamOut", "MomentOut", "InfNormOut"),
    lambda ctx, T, v: [f"lr_ = {T}({v['LearningRate']}[0])", f"b1_ = {_lit(ctx, 'beta1', T)}",
                       f"b2_ = {_lit(ctx, 'beta2', T)}", f"eps_ = {_lit(ctx, 'epsilon', T)}",
                       f"one_ = {T}(1)", f"lrt_ = lr_ / (one_ - {T}({v['Beta1Pow']}[0]))"],
    lambda ctx, T, v, i: [
        f"g_ = {v['Grad']}[{i}]",
        f"m_ = b1_ * {v['Moment']}[{i}] + (one_ - b1_) * g_",
        f"n_ = max(b2_ * {v['InfNorm']}[{i}] + eps_, abs(g_))",
        f"{v['MomentOut']}[{i}] = m_",
        f"{v['InfNormOut']}[{i}] = n_",
        f"{v['ParamOut']}[{i}] = {v['Param']}[{i}] - lrt_ * (m_ / n_)"],
    check_scalars=("LearningRate", "Beta1Pow"))

register_op(
    "adamax", inputs=["Param", "Grad", "LearningRate", "Moment", "InfNorm", "Beta1Pow",
                      "MasterParam?"],
    outputs=["ParamOut", "MomentOut", "InfNormOut", "MasterParamOut?"],
    attrs={"beta1": Float(0.9, low=0.0, high=0.99), "beta2": Float(0.999, low=0.0, high=0.9999),
           "epsilon": Float(1e-8, low=1e-10, high=1e-3), **_MULTI},
    traits=[OPAQUE], infer_shape=_adamax_infer, reference=_adamax_ref,
    emit=Opaque(_adamax_lower, flat=True), grad=None,
    doc="MomentOut = b1 * m + (1 - b1) * g; InfNormOut = max(b2 * inf + eps, |g|); ParamOut = "
        "Param - lr / (1 - Beta1Pow) * MomentOut / InfNormOut (the optimizer scales Beta1Pow).")


# ---- adadelta ------------------------------------------------------------------------------------
def _adadelta_infer(Param, Grad, AvgSquaredGrad, AvgSquaredUpdate, LearningRate,
                    MasterParam=None, **_):
    for what, meta in (("Grad", Grad), ("AvgSquaredGrad", AvgSquaredGrad),
                       ("AvgSquaredUpdate", AvgSquaredUpdate)):
        _check_like(meta, Param, what, "adadelta")
    _check_scalar(LearningRate, "LearningRate", "adadelta")
    return {**_param_infer(Param, MasterParam), "AvgSquaredGradOut": AvgSquaredGrad,
            "AvgSquaredUpdateOut": AvgSquaredUpdate}


def _adadelta_ref(Param, Grad, AvgSquaredGrad, AvgSquaredUpdate, LearningRate,
                  MasterParam=None, *, rho, epsilon, multi_precision):
    _check_run({"Grad": Grad, "AvgSquaredGrad": AvgSquaredGrad,
                "AvgSquaredUpdate": AvgSquaredUpdate}, Param, "adadelta")
    p, T = _master(Param, MasterParam, multi_precision)
    lr = T(_scalar(LearningRate, "LearningRate", "adadelta"))
    r, eps, one = _f(rho, T), _f(epsilon, T), T(1)
    g = Grad.astype(T, copy=False)
    asg = r * AvgSquaredGrad.astype(T, copy=False) + (one - r) * g * g
    asu_in = AvgSquaredUpdate.astype(T, copy=False)
    upd = -np.sqrt((asu_in + eps) / (asg + eps)) * g
    asu = r * asu_in + (one - r) * upd * upd
    return {**_param_outs(p + lr * upd, Param, MasterParam, multi_precision),
            "AvgSquaredGradOut": asg.astype(AvgSquaredGrad.dtype, copy=False),
            "AvgSquaredUpdateOut": asu.astype(AvgSquaredUpdate.dtype, copy=False)}


register_op(
    "adadelta", inputs=["Param", "Grad", "AvgSquaredGrad", "AvgSquaredUpdate", "LearningRate",
                        "MasterParam?"],
    outputs=["ParamOut", "AvgSquaredGradOut", "AvgSquaredUpdateOut", "MasterParamOut?"],
    attrs={"rho": Float(0.95, low=0.0, high=0.99), "epsilon": Float(1e-6, low=1e-10, high=1e-3),
           **_MULTI},
    traits=[OPAQUE], infer_shape=_adadelta_infer, reference=_adadelta_ref,
    emit=Opaque(_elementwise_lower(
        ("Param", "Grad", "AvgSquaredGrad", "AvgSquaredUpdate"),
        ("ParamOut", "AvgSquaredGradOut", "AvgSquaredUpdateOut"),
        lambda ctx, T, v: [f"lr_ = {T}({v['LearningRate']}[0])", f"rho_ = {_lit(ctx, 'rho', T)}",
                           f"eps_ = {_lit(ctx, 'epsilon', T)}", f"one_ = {T}(1)"],
        lambda ctx, T, v, i: [
            f"g_ = {v['Grad']}[{i}]",
            f"a_ = rho_ * {v['AvgSquaredGrad']}[{i}] + (one_ - rho_) * g_ * g_",
            f"w_ = {v['AvgSquaredUpdate']}[{i}]",
            "u_ = -np.sqrt((w_ + eps_) / (a_ + eps_)) * g_",
            f"{v['AvgSquaredGradOut']}[{i}] = a_",
            f"{v['AvgSquaredUpdateOut']}[{i}] = rho_ * w_ + (one_ - rho_) * u_ * u_",
            f"{v['ParamOut']}[{i}] = {v['Param']}[{i}] + lr_ * u_"]), flat=True),
    grad=None,
    doc="AvgSquaredGradOut = rho * asg + (1 - rho) * g^2; update = -sqrt((asu + eps) / "
        "(AvgSquaredGradOut + eps)) * g; AvgSquaredUpdateOut = rho * asu + (1 - rho) * update^2; "
        "ParamOut = Param + lr * update.")


# ---- decayed_adagrad -----------------------------------------------------------------------------
def _decayed_adagrad_infer(Param, Grad, Moment, LearningRate, **_):
    _check_like(Grad, Param, "Grad", "decayed_adagrad")
    _check_like(Moment, Param, "Moment", "decayed_adagrad")
    _check_scalar(LearningRate, "LearningRate", "decayed_adagrad")
    return {**_param_infer(Param), "MomentOut": Moment}


def _decayed_adagrad_ref(Param, Grad, Moment, LearningRate, *, decay, epsilon):
    _check_run({"Grad": Grad, "Moment": Moment}, Param, "decayed_adagrad")
    T = Param.dtype.type
    lr = T(_scalar(LearningRate, "LearningRate", "decayed_adagrad"))
    d, one = _f(decay, T), T(1)
    g = Grad.astype(T, copy=False)
    m = d * Moment.astype(T, copy=False) + (one - d) * g * g
    return {"ParamOut": Param - lr * g / (np.sqrt(m) + _f(epsilon, T)),
            "MomentOut": m.astype(Moment.dtype, copy=False)}


register_op(
    "decayed_adagrad", inputs=["Param", "Grad", "Moment", "LearningRate"],
    outputs=["ParamOut", "MomentOut"],
    attrs={"decay": Float(0.95, low=0.0, high=0.99), "epsilon": Float(1e-6, low=1e-10, high=1e-3)},
    traits=[OPAQUE], infer_shape=_decayed_adagrad_infer, reference=_decayed_adagrad_ref,
    emit=Opaque(_elementwise_lower(
        ("Param", "Grad", "Moment"), ("ParamOut", "MomentOut"),
        lambda ctx, T, v: [f"lr_ = {T}({v['LearningRate']}[0])", f"d_ = {_lit(ctx, 'decay', T)}",
                           f"eps_ = {_lit(ctx, 'epsilon', T)}", f"one_ = {T}(1)"],
        lambda ctx, T, v, i: [
            f"g_ = {v['Grad']}[{i}]",
            f"m_ = d_ * {v['Moment']}[{i}] + (one_ - d_) * g_ * g_",
            f"{v['MomentOut']}[{i}] = m_",
            f"{v['ParamOut']}[{i}] = {v['Param']}[{i}] - lr_ * g_ / (np.sqrt(m_) + eps_)"]),
        flat=True),
    grad=None,
    doc="MomentOut = decay * m + (1 - decay) * g^2; ParamOut = Param - lr * g / "
        "(sqrt(MomentOut) + epsilon).")


# ---- ftrl ----------------------------------------------------------------------------------------
_FTRL_TINY = 1e-10  # added to l1 and l2, as Paddle's kernel does


def _ftrl_infer(Param, SquaredAccumulator, LinearAccumulator, Grad, LearningRate, **_):
    for what, meta in (("Grad", Grad), ("SquaredAccumulator", SquaredAccumulator),
                       ("LinearAccumulator", LinearAccumulator)):
        _check_like(meta, Param, what, "ftrl")
    _check_scalar(LearningRate, "LearningRate", "ftrl")
    return {**_param_infer(Param), "SquaredAccumOut": SquaredAccumulator,
            "LinearAccumOut": LinearAccumulator}


def _ftrl_ref(Param, SquaredAccumulator, LinearAccumulator, Grad, LearningRate, *, l1, l2,
              lr_power):
    _check_run({"Grad": Grad, "SquaredAccumulator": SquaredAccumulator,
                "LinearAccumulator": LinearAccumulator}, Param, "ftrl")
    T = Param.dtype.type
    lr = T(_scalar(LearningRate, "LearningRate", "ftrl"))
    l1_, l2_ = _f(l1, T) + T(_FTRL_TINY), _f(l2, T) + T(_FTRL_TINY)
    p, g = Param, Grad.astype(T, copy=False)
    sq = SquaredAccumulator.astype(T, copy=False)
    new_sq = sq + g * g
    if _f(lr_power, T) == T(-0.5):
        def scaled(a):
            return np.sqrt(a)
    else:
        e = -_f(lr_power, T)

        def scaled(a):
            return np.power(a, e)
    lin = LinearAccumulator.astype(T, copy=False) + g - ((scaled(new_sq) - scaled(sq)) / lr) * p
    x = l1_ * np.sign(lin) - lin
    y = scaled(new_sq) / lr + T(2) * l2_
    new_p = np.where(np.abs(lin) > l1_, x / y, T(0)).astype(Param.dtype, copy=False)
    return {"ParamOut": new_p,
            "SquaredAccumOut": new_sq.astype(SquaredAccumulator.dtype, copy=False),
            "LinearAccumOut": lin.astype(LinearAccumulator.dtype, copy=False)}


def _ftrl_prologue(ctx, T, v):
    return [f"lr_ = {T}({v['LearningRate']}[0])",
            f"l1_ = {_lit(ctx, 'l1', T)} + {T}({_FTRL_TINY!r})",
            f"l2_ = {_lit(ctx, 'l2', T)} + {T}({_FTRL_TINY!r})",
            f"e_ = -{_lit(ctx, 'lr_power', T)}", f"zero_ = {T}(0)", f"two_ = {T}(2)"]


def _ftrl_body(ctx, T, v, i):
    if float(_F32(ctx.attrs["lr_power"])) == -0.5:
        def scaled(a):
            return f"np.sqrt({a})"
    else:
        def scaled(a):
            return f"{a} ** e_"
    return [
        f"g_ = {v['Grad']}[{i}]",
        f"p_ = {v['Param']}[{i}]",
        f"s_ = {v['SquaredAccumulator']}[{i}]",
        "n_ = s_ + g_ * g_",
        f"l_ = {v['LinearAccumulator']}[{i}] + g_ - (({scaled('n_')} - {scaled('s_')}) / lr_) * p_",
        f"{v['LinearAccumOut']}[{i}] = l_",
        f"{v['SquaredAccumOut']}[{i}] = n_",
        "sg_ = zero_ if l_ == zero_ else (l1_ if l_ > zero_ else -l1_)",
        f"y_ = {scaled('n_')} / lr_ + two_ * l2_",
        f"{v['ParamOut']}[{i}] = (sg_ - l_) / y_ if abs(l_) > l1_ else zero_"]


register_op(
    "ftrl", inputs=["Param", "SquaredAccumulator", "LinearAccumulator", "Grad", "LearningRate"],
    outputs=["ParamOut", "SquaredAccumOut", "LinearAccumOut"],
    attrs={"l1": Float(0.0, low=0.0, high=0.5), "l2": Float(0.0, low=0.0, high=0.5),
           "lr_power": Float(-0.5, choices=(-0.5, -0.25))},
    traits=[OPAQUE], infer_shape=_ftrl_infer, reference=_ftrl_ref,
    emit=Opaque(_elementwise_lower(
        ("Param", "SquaredAccumulator", "LinearAccumulator", "Grad"),
        ("ParamOut", "SquaredAccumOut", "LinearAccumOut"), _ftrl_prologue, _ftrl_body),
        flat=True),
    grad=None,
    doc="FTRL-proximal: n = sq + g^2; lin += g - (n^-lr_power - sq^-lr_power) / lr * p; "
        "ParamOut = (l1 * sign(lin) - lin) / (n^-lr_power / lr + 2 * l2) where |lin| > l1, else "
        "0 (sqrt for lr_power = -0.5; l1 and l2 get 1e-10 added, as in Paddle).")


# ---- lamb ----------------------------------------------------------------------------------------
def _lamb_infer(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow,
                MasterParam=None, SkipUpdate=None, **_):
    for what, meta in (("Grad", Grad), ("Moment1", Moment1), ("Moment2", Moment2)):
        _check_like(meta, Param, what, "lamb")
    for what, meta in (("LearningRate", LearningRate), ("Beta1Pow", Beta1Pow),
                       ("Beta2Pow", Beta2Pow)):
        _check_scalar(meta, what, "lamb")
    return {**_param_infer(Param, MasterParam), "Moment1Out": Moment1, "Moment2Out": Moment2,
            "Beta1PowOut": Beta1Pow, "Beta2PowOut": Beta2Pow}


def _lamb_ref(Param, Grad, LearningRate, Moment1, Moment2, Beta1Pow, Beta2Pow,
              MasterParam=None, SkipUpdate=None, *, weight_decay, beta1, beta2, epsilon,
              always_adapt, multi_precision):
    _check_run({"Grad": Grad, "Moment1": Moment1, "Moment2": Moment2}, Param, "lamb")
    p, T = _master(Param, MasterParam, multi_precision)
    if SkipUpdate is not None and bool(_scalar(SkipUpdate, "SkipUpdate", "lamb")):
        return {**_param_outs(p.copy(), Param, MasterParam, multi_precision),
                "Moment1Out": Moment1.copy(), "Moment2Out": Moment2.copy(),
                "Beta1PowOut": Beta1Pow.copy(), "Beta2PowOut": Beta2Pow.copy()}
    lr = T(_scalar(LearningRate, "LearningRate", "lamb"))
    b1p = T(_scalar(Beta1Pow, "Beta1Pow", "lamb"))
    b2p = T(_scalar(Beta2Pow, "Beta2Pow", "lamb"))
    b1, b2, eps, wd, one = (_f(beta1, T), _f(beta2, T), _f(epsilon, T), _f(weight_decay, T),
                            T(1))
    g = Grad.astype(T, copy=False)
    m1 = b1 * Moment1.astype(T, copy=False) + (one - b1) * g
    m2 = b2 * Moment2.astype(T, copy=False) + (one - b2) * g * g
    r = (m1 / (one - b1p)) / (np.sqrt(m2 / (one - b2p)) + eps) + wd * p
    trust = one
    if wd > 0 or always_adapt:
        pn, rn = _norm(p, T), _norm(r, T)
        if pn > 0 and rn > 0:
            trust = T(pn / rn)
    new_p = p - lr * trust * r
    return {**_param_outs(new_p, Param, MasterParam, multi_precision),
            "Moment1Out": m1.astype(Moment1.dtype, copy=False),
            "Moment2Out": m2.astype(Moment2.dtype, copy=False),
            "Beta1PowOut": (Beta1Pow * Beta1Pow.dtype.type(b1)).astype(Beta1Pow.dtype),
            "Beta2PowOut": (Beta2Pow * Beta2Pow.dtype.type(b2)).astype(Beta2Pow.dtype)}


def _lamb_code(ctx, T, v):
    a = ctx.attrs
    adapt = float(_F32(a["weight_decay"])) > 0 or bool(a["always_adapt"])
    lines = [f"lr_ = {T}({v['LearningRate']}[0])", f"b1_ = {_lit(ctx, 'beta1', T)}",
             f"b2_ = {_lit(ctx, 'beta2', T)}", f"eps_ = {_lit(ctx, 'epsilon', T)}",
             f"wd_ = {_lit(ctx, 'weight_decay', T)}", f"one_ = {T}(1)",
             f"c1_ = one_ - {T}({v['Beta1Pow']}[0])", f"c2_ = one_ - {T}({v['Beta2Pow']}[0])"]
    _with_scalar_outputs(lines, ctx, [("Beta1PowOut", "Beta1Pow", f"{v['Beta1Pow']}[0] * b1_"),
                                      ("Beta2PowOut", "Beta2Pow", f"{v['Beta2Pow']}[0] * b2_")])
    P, out = v["Param"], v["ParamOut"]
    i = ctx.tmp("i")
    lines += ["pn_ = 0.0", "rn_ = 0.0",
              f"for {i} in range({P}.size):",
              f"    g_ = {v['Grad']}[{i}]",
              f"    p_ = {P}[{i}]",
              f"    m1_ = b1_ * {v['Moment1']}[{i}] + (one_ - b1_) * g_",
              f"    m2_ = b2_ * {v['Moment2']}[{i}] + (one_ - b2_) * g_ * g_",
              f"    {v['Moment1Out']}[{i}] = m1_",
              f"    {v['Moment2Out']}[{i}] = m2_",
              "    r_ = (m1_ / c1_) / (np.sqrt(m2_ / c2_) + eps_) + wd_ * p_",
              f"    {out}[{i}] = r_",
              "    pn_ += float(p_) * float(p_)",
              "    rn_ += float(r_) * float(r_)",
              "tr_ = one_"]
    if adapt:
        lines += ["pn_ = np.sqrt(pn_)", "rn_ = np.sqrt(rn_)",
                  f"if {T}(pn_) > 0 and {T}(rn_) > 0:",
                  f"    tr_ = {T}({T}(pn_) / {T}(rn_))"]
    lines += ["st_ = lr_ * tr_",
              f"for {i} in range({P}.size):",
              f"    {out}[{i}] = {P}[{i}] - st_ * {out}[{i}]"]
    return lines


_lamb_flat = _flat_lower(("Param", "Grad", "Moment1", "Moment2"),
                         ("ParamOut", "Moment1Out", "Moment2Out"), _lamb_code,
                         check_scalars=("LearningRate", "Beta1Pow", "Beta2Pow"))


def _lamb_lower(ctx):
    t = ctx.dtype("Param")
    if ctx.has_input("SkipUpdate") or ctx.dtype("Beta1Pow") != t or ctx.dtype("Beta2Pow") != t:
        return None
    return _lamb_flat(ctx)


register_op(
    "lamb", inputs=["Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow",
                    "MasterParam?", "SkipUpdate?"],
    outputs=["ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut?", "Beta2PowOut?",
             "MasterParamOut?"],
    attrs={"weight_decay": Float(low=0.0, high=0.1), "beta1": Float(0.9, low=0.0, high=0.99),
           "beta2": Float(0.999, low=0.0, high=0.9999),
           "epsilon": Float(1e-6, low=1e-10, high=1e-3), "always_adapt": Bool(False), **_MULTI},
    traits=[OPAQUE], infer_shape=_lamb_infer, reference=_lamb_ref,
    emit=Opaque(_lamb_lower, flat=True), grad=None,
    doc="LAMB: adam moments; r = m1 / (1 - b1p) / (sqrt(m2 / (1 - b2p)) + eps) + weight_decay * "
        "Param; ParamOut = Param - lr * trust * r with trust = ||Param|| / ||r|| (1 when either "
        "norm is 0, or when weight_decay <= 0 and not always_adapt); beta pows times beta1/2.")


# ---- lars_momentum -------------------------------------------------------------------------------
_LARS_SLOTS = ("Param", "Grad", "Velocity", "LearningRate")


def _lars_infer(Param, Grad, Velocity, LearningRate, MasterParam=None, *, lars_weight_decay,
                **_):
    n = len(Param)
    for what, metas in (("Grad", Grad), ("Velocity", Velocity), ("LearningRate", LearningRate)):
        if len(metas) != n:
            raise ShapeMismatch(f"lars_momentum: {what} must hold one variable per Param: "
                                f"expected {n}, got {len(metas)}")
    if len(lars_weight_decay) not in (1, n):
        raise ShapeMismatch(f"lars_momentum: lars_weight_decay must hold one value per Param "
                            f"(or one for all): expected {n}, got {len(lars_weight_decay)}")
    for k in range(n):
        check_dtype(Param[k], FLOATS, "lars_momentum: Param")
        _check_like(Grad[k], Param[k], "Grad", "lars_momentum")
        _check_like(Velocity[k], Param[k], "Velocity", "lars_momentum")
        _check_scalar(LearningRate[k], "LearningRate", "lars_momentum")
    out = {"ParamOut": list(Param), "VelocityOut": list(Velocity)}
    if MasterParam:
        out["MasterParamOut"] = list(MasterParam)
    return out


def _lars_ref(Param, Grad, Velocity, LearningRate, MasterParam=None, *, mu, lars_coeff,
              lars_weight_decay, epsilon, multi_precision, rescale_grad):
    n = len(Param)
    if len(lars_weight_decay) not in (1, n):
        raise ShapeMismatch(f"lars_momentum: lars_weight_decay must hold one value per Param "
                            f"(or one for all): expected {n}, got {len(lars_weight_decay)}")
    masters = list(MasterParam or [])
    outs = {"ParamOut": [], "VelocityOut": [], "MasterParamOut": []}
    for k in range(n):
        master = masters[k] if k < len(masters) else None
        _check_run({"Grad": Grad[k], "Velocity": Velocity[k]}, Param[k], "lars_momentum")
        p, T = _master(Param[k], master, multi_precision)
        lr = T(_scalar(LearningRate[k], "LearningRate", "lars_momentum"))
        wd = _f(lars_weight_decay[k if len(lars_weight_decay) == n else 0], T)
        g = Grad[k].astype(T, copy=False) * _f(rescale_grad, T)
        pn, gn = _norm(p, T), _norm(g, T)
        local_lr = lr
        if pn > 0 and gn > 0:
            local_lr = lr * _f(lars_coeff, T) * pn / (gn + wd * pn + _f(epsilon, T))
        v = _f(mu, T) * Velocity[k].astype(T, copy=False) + local_lr * (g + wd * p)
        po = _param_outs(p - v, Param[k], master, multi_precision)
        outs["ParamOut"].append(po["ParamOut"])
        if "MasterParamOut" in po:
            outs["MasterParamOut"].append(po["MasterParamOut"])
        outs["VelocityOut"].append(v.astype(Velocity[k].dtype, copy=False))
    if not outs["MasterParamOut"]:
        del outs["MasterParamOut"]
    return outs


def _lars_lower(ctx):
    """One loop pair per parameter: the two norms, then the update."""
    if ctx.has_input("MasterParam"):
        return None
    op = ctx.op
    n = len(op.input("Param"))
    wds = list(ctx.attrs["lars_weight_decay"])
    if len(wds) not in (1, n) or any(len(op.input(s)) != n for s in _LARS_SLOTS):
        return None
    lines = []
    for k in range(n):
        t = ctx.dtype("Param", k)
        if t not in (np.dtype(np.float32), np.dtype(np.float64)) or \
                any(ctx.dtype(s, k) != t for s in _LARS_SLOTS):
            return None
        T = ctx.T("Param", k)
        P, G, V, L = (ctx.inp(s, k) for s in _LARS_SLOTS)
        po = ctx.out("ParamOut", k, shape=f"{P}.shape")
        vo = ctx.out("VelocityOut", k, shape=f"{P}.shape")
        wd = f"{T}({float(_F32(wds[k if len(wds) == n else 0]))!r})"
        i = ctx.tmp("i")
        lines += [
            f"if {G}.size != {P}.size or {V}.size != {P}.size: "
            "raise ValueError('pdjit: lars_momentum Grad/Velocity size')",
            f"if {L}.size != 1: raise ValueError('pdjit: LearningRate must hold one value')",
            f"lr_ = {T}({L}.reshape(1)[0])", f"mu_ = {_lit(ctx, 'mu', T)}",
            f"rs_ = {_lit(ctx, 'rescale_grad', T)}", f"wd_ = {wd}",
            "pn_ = 0.0", "gn_ = 0.0",
            f"for {i} in range({P}.size):",
            f"    p_ = float({P}[{i}])",
            f"    g_ = float({G}[{i}] * rs_)",
            "    pn_ += p_ * p_",
            "    gn_ += g_ * g_",
            f"pn_ = {T}(np.sqrt(pn_))", f"gn_ = {T}(np.sqrt(gn_))",
            "llr_ = lr_",
            "if pn_ > 0 and gn_ > 0:",
            f"    llr_ = lr_ * {_lit(ctx, 'lars_coeff', T)} * pn_ / (gn_ + wd_ * pn_ + "
            f"{_lit(ctx, 'epsilon', T)})",
            f"for {i} in range({P}.size):",
            f"    p_ = {P}[{i}]",
            f"    v_ = mu_ * {V}[{i}] + llr_ * ({G}[{i}] * rs_ + wd_ * p_)",
            f"    {vo}[{i}] = v_",
            f"    {po}[{i}] = p_ - v_"]
    return lines


register_op(
    "lars_momentum", inputs=["Param*", "Grad*", "Velocity*", "LearningRate*", "MasterParam*?"],
    outputs=["ParamOut*", "VelocityOut*", "MasterParamOut*?"],
    attrs={"mu": Float(low=0.0, high=0.99), "lars_coeff": Float(0.001, low=0.0, high=0.01),
           "lars_weight_decay": Floats([0.0005]), "epsilon": Float(0.0, low=0.0, high=1e-3),
           **_MULTI, "rescale_grad": Float(1.0, low=0.5, high=2.0)},
    traits=[OPAQUE], infer_shape=_lars_infer, reference=_lars_ref,
    emit=Opaque(_lars_lower, flat=True), grad=None,
    doc="LARS, per parameter: g = rescale_grad * Grad; local_lr = lr * lars_coeff * ||p|| / "
        "(||g|| + wd * ||p|| + epsilon) (lr when either norm is 0); VelocityOut = mu * v + "
        "local_lr * (g + wd * p); ParamOut = p - VelocityOut.")


# ---- average_accumulates (ModelAverage) ----------------------------------------------------------
_MAX_NUM_ACCUMULATES = 16384  # sum_1 moves into sum_2 this often, to keep its precision
_AVG_SUMS = ("in_sum_1", "in_sum_2", "in_sum_3")
_AVG_COUNTS = ("in_num_accumulates", "in_old_num_accumulates", "in_num_updates")


def _avg_infer(param, in_sum_1, in_sum_2, in_sum_3, in_num_accumulates, in_old_num_accumulates,
               in_num_updates, **_):
    check_dtype(param, FLOATS, "average_accumulates: param")
    for what, meta in zip(_AVG_SUMS, (in_sum_1, in_sum_2, in_sum_3)):
        _check_like(meta, param, what, "average_accumulates")
    for what, meta in zip(_AVG_COUNTS, (in_num_accumulates, in_old_num_accumulates,
                                        in_num_updates)):
        check_dtype(meta, (np.dtype(np.int64),), f"average_accumulates: {what}")
        if meta.shape not in ((), (1,), (-1,)):
            raise ShapeMismatch(f"average_accumulates: {what} must hold one value: expected "
                                f"shape [1], got {list(meta.shape)}")
    return {"out_sum_1": in_sum_1, "out_sum_2": in_sum_2, "out_sum_3": in_sum_3,
            "out_num_accumulates": in_num_accumulates,
            "out_old_num_accumulates": in_old_num_accumulates, "out_num_updates": in_num_updates}


def _avg_ref(param, in_sum_1, in_sum_2, in_sum_3, in_num_accumulates, in_old_num_accumulates,
             in_num_updates, *, average_window, max_average_window, min_average_window):
    op = "average_accumulates"
    if min_average_window > max_average_window:
        raise ValueError(f"{op}: min_average_window must be <= max_average_window, got "
                         f"{min_average_window} > {max_average_window}")
    _check_run(dict(zip(_AVG_SUMS, (in_sum_1, in_sum_2, in_sum_3))), param, op)
    num_acc = int(_scalar(in_num_accumulates, "in_num_accumulates", op)) + 1
    old_acc = int(_scalar(in_old_num_accumulates, "in_old_num_accumulates", op))
    num_upd = int(_scalar(in_num_updates, "in_num_updates", op)) + 1
    T = in_sum_1.dtype.type
    s1 = in_sum_1 + param.astype(T, copy=False)
    s2, s3 = in_sum_2.copy(), in_sum_3.copy()
    if num_upd % _MAX_NUM_ACCUMULATES == 0:
        s2 = s2 + s1
        s1 = np.zeros_like(s1)
    # num_updates * average_window in float32, truncated, as Paddle's kernel does
    window = min(int(max_average_window), int(_F32(num_upd) * _F32(average_window)))
    if num_acc >= min_average_window and num_acc >= window:
        s3 = s1 + s2
        s1, s2 = np.zeros_like(s1), np.zeros_like(s2)
        old_acc, num_acc = num_acc, 0

    def count(v, like):
        return np.full(like.shape, v, np.int64)
    return {"out_sum_1": s1, "out_sum_2": s2, "out_sum_3": s3,
            "out_num_accumulates": count(num_acc, in_num_accumulates),
            "out_old_num_accumulates": count(old_acc, in_old_num_accumulates),
            "out_num_updates": count(num_upd, in_num_updates)}


def _avg_lower(ctx):
    """The sums in one pass; the counters and the window decision before it, as scalars."""
    a = ctx.attrs
    lo, hi = int(a["min_average_window"]), int(a["max_average_window"])
    if lo > hi:
        return None   # the reference says what is wrong
    t = ctx.dtype("param")
    if t not in (np.dtype(np.float32), np.dtype(np.float64)) or \
            any(ctx.dtype(s) != t for s in _AVG_SUMS) or \
            any(ctx.dtype(s) != np.dtype(np.int64) for s in _AVG_COUNTS):
        return None
    T = ctx.T("param")
    P = ctx.inp("param")
    s1, s2, s3 = (ctx.inp(s) for s in _AVG_SUMS)
    na, oa, nu = (ctx.inp(s) for s in _AVG_COUNTS)
    lines = [f"if {s}.size != {P}.size: raise ValueError('pdjit: average_accumulates sum size')"
             for s in (s1, s2, s3)]
    lines += [f"if {c}.size != 1: raise ValueError('pdjit: average_accumulates count size')"
              for c in (na, oa, nu)]
    o1, o2, o3 = (ctx.out(f"out_{s[3:]}", shape=f"{P}.shape") for s in _AVG_SUMS)
    on, oo, ou = (ctx.out(f"out_{c[3:]}", shape=f"{c_in}.shape")
                  for c, c_in in zip(_AVG_COUNTS, (na, oa, nu)))
    i = ctx.tmp("i")
    rate = float(_F32(a["average_window"]))
    lines += [
        f"na_ = {na}[0] + 1", f"oa_ = {oa}[0]", f"nu_ = {nu}[0] + 1",
        f"move_ = nu_ % {_MAX_NUM_ACCUMULATES} == 0",
        f"win_ = min(np.int64({hi}), np.int64(np.float32(nu_) * np.float32({rate!r})))",
        f"reset_ = na_ >= {lo} and na_ >= win_",
        f"zero_ = {T}(0)",
        f"for {i} in range({P}.size):",
        f"    a_ = {s1}[{i}] + {P}[{i}]",
        f"    b_ = {s2}[{i}]",
        f"    c_ = {s3}[{i}]",
        "    if move_:",
        "        b_ = b_ + a_",
        "        a_ = zero_",
        "    if reset_:",
        "        c_ = a_ + b_",
        "        a_ = zero_",
        "        b_ = zero_",
        f"    {o1}[{i}] = a_", f"    {o2}[{i}] = b_", f"    {o3}[{i}] = c_",
        "if reset_:",
        "    oa_ = na_",
        "    na_ = 0",
        f"{on}[0] = na_", f"{oo}[0] = oa_", f"{ou}[0] = nu_"]
    return lines


register_op(
    "average_accumulates",
    inputs=["param", *_AVG_SUMS, *_AVG_COUNTS],
    outputs=["out_sum_1", "out_sum_2", "out_sum_3", "out_num_accumulates",
             "out_old_num_accumulates", "out_num_updates"],
    attrs={"average_window": Float(0.0, low=0.0, high=1.0),
           "max_average_window": Long(2 ** 63 - 1, choices=(2 ** 63 - 1, 20)),
           "min_average_window": Long(10000, choices=(10000, 2))},
    traits=[OPAQUE], infer_shape=_avg_infer, reference=_avg_ref,
    emit=Opaque(_avg_lower, flat=True), grad=None,
    doc="ModelAverage's sliding window of parameter sums: num_updates += 1; num_accumulates += 1;"
        " sum_1 += param; every 16384 updates sum_2 += sum_1, sum_1 = 0; once num_accumulates >= "
        "min_average_window and >= min(max_average_window, int(num_updates * average_window)): "
        "sum_3 = sum_1 + sum_2, sum_1 = sum_2 = 0, old_num_accumulates = num_accumulates, "
        "num_accumulates = 0.")
