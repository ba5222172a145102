"""Normalisation ops: ``batch_norm``, ``instance_norm``, ``group_norm``, ``layer_norm`` and
their gradients.

Types, slots, attributes and grad makers are PaddlePaddle 3.3.1's legacy ops; the numerics are
those of its CPU kernels, compared with Paddle on both layouts, float32 and float64:

- ``batch_norm`` normalises each channel ``C`` (dim 1 for ``NCHW`` and for any rank-2 X, the
  last dim for ``NHWC``; X of rank 2..5). *Training* (the default; also ``is_test`` together
  with ``trainable_statistics``): the batch mean and the *biased* batch variance over every dim
  but C give ``Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias``; the running statistics
  move, ``MeanOut = momentum * Mean + (1 - momentum) * mean`` and ``VarianceOut`` likewise with
  the biased variance; ``SavedMean = mean`` and ``SavedVariance = 1 / sqrt(var + epsilon)``.
  A batch holding one value per channel gives ``Y = X``, zeros saved and the running statistics
  unchanged (Paddle's CPU kernel). *Global statistics* (``is_test`` without
  ``trainable_statistics``, or ``use_global_stats``): Mean and Variance normalise and are passed
  through to MeanOut/VarianceOut; SavedMean/SavedVariance get Mean and
  ``1 / sqrt(Variance + epsilon)`` (Paddle leaves them unset). ``epsilon`` must lie in
  ``[0, 0.001]`` (Paddle's attribute check). MeanOut/VarianceOut are usually the very variables
  Mean/Variance (in place, as Paddle requires); here they may also be others.
  Differences from Paddle 3.3.1's CPU kernel, each deliberate: ``MomentumTensor`` replaces
  ``momentum`` when given (as Fluid 1.x and Paddle's GPU kernel do; the 3.3.1 CPU kernel
  ignores it); ``fuse_with_relu`` (an attribute Fluid 1.x wrote, honoured by oneDNN kernels
  only) applies ``max(Y, 0)``, and such an op has no gradient.
- ``batch_norm_grad`` reads X, Scale, Bias, MeanOut, VarianceOut (the running statistics, as
  Paddle's grad maker names them), SavedMean, SavedVariance, ReserveSpace and Y@GRAD, and writes
  X@GRAD, Scale@GRAD, Bias@GRAD. Training: through the batch statistics, ``dX = inv * Scale *
  (dY - mean(dY) - xhat * mean(dY * xhat))``; global statistics: ``dX = inv * Scale * dY``.
  ``is_test`` with ``trainable_statistics`` differentiates the batch statistics the forward op
  used (Paddle's kernel would use the running ones there).
- ``instance_norm`` (NCHW, rank 2..5): statistics per (sample, channel) over the spatial dims;
  SavedMean and SavedVariance have ``N * C`` values, SavedVariance holding
  ``1 / sqrt(var + epsilon)``. Scale and Bias are optional (ones and zeros).
- ``group_norm`` (rank >= 2, either layout): statistics per (sample, group of ``C / groups``
  consecutive channels); Mean and Variance are ``[N, groups]`` and Variance holds the variance
  itself. ``groups`` (default -1, as Paddle) must be >= 1, at most C, and divide C. Its grad
  reads Y as Paddle's grad maker passes it, but computes from X and the statistics.
- ``layer_norm`` normalises X seen as rows: ``left = prod(X.shape[:begin_norm_axis])`` rows of
  ``right = prod(X.shape[begin_norm_axis:])`` values (``begin_norm_axis`` in ``1..rank-1``,
  default 1; ``epsilon`` in ``[0, 0.001]``, default 1e-5), ``Y = (X - mean) / sqrt(var +
  epsilon) * Scale + Bias`` with Scale and Bias (optional: ones and zeros) of ``[right]``.
  Mean and Variance (the *biased* variance, not its inverse root) have X's leading dims
  ``X.shape[:begin_norm_axis]``, as Paddle 3.3.1 writes them (Fluid 1.x declared ``[left]``;
  the grad op takes either), float32 for float16 X, else X's type. ``layer_norm_grad`` reads
  X, Scale, Bias, Mean, Variance and Y@GRAD (Paddle's grad maker) and writes X@GRAD,
  Scale@GRAD, Bias@GRAD through the row statistics.

Natively (float32 and float64; float16 runs the references) every op runs its target's lowering
(``codegen/<target>/lowerings/norm.py``); layer norm natively wants Scale and Bias of X's type.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ProgramError, ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    Bool,
    ChannelAffine,
    Float,
    Int,
    Opaque,
    RowWise,
    Str,
    VarMeta,
    default_grad,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

_LAYOUTS = ("NCHW", "NHWC")
_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


# ---- shapes ------------------------------------------------------------------------------------
def _check_layout(data_layout: str, op: str) -> None:
    if data_layout not in _LAYOUTS:
        raise ShapeMismatch(f"{op}: data_layout must be 'NCHW' or 'NHWC', got {data_layout!r}")


def _check_rank(X, low: int, high: int | None, op: str) -> None:
    if X.ndim < low or (high is not None and X.ndim > high):
        want = f"{low}..{high}" if high is not None else f">= {low}"
        raise ShapeMismatch(f"{op}: X must have rank {want}, got shape {list(X.shape)}")


def _channel_axis(ndim: int, data_layout: str) -> int:
    return ndim - 1 if data_layout == "NHWC" else 1


def _check_param(meta, c: int, what: str, op: str) -> None:
    """A per-channel input: float, rank 1, C values (when both are known)."""
    if meta is None:
        return
    check_dtype(meta, FLOATS, f"{op}: {what}")
    if meta.ndim != 1 or (c >= 0 and meta.shape[0] >= 0 and meta.shape[0] != c):
        raise ShapeMismatch(f"{op}: {what} must have shape [{c}] (one value per channel of X), "
                            f"got {list(meta.shape)}")


def _view(x: np.ndarray, data_layout: str) -> np.ndarray:
    """``x`` as ``(A, P, C, R)``: NCHW ``(N, 1, C, prod(S))``, NHWC ``(N, prod(S), C, 1)``."""
    n = x.shape[0]
    if data_layout == "NHWC" and x.ndim > 2:
        return x.reshape(n, int(np.prod(x.shape[1:-1])), x.shape[-1], 1)
    return x.reshape(n, 1, x.shape[1], int(np.prod(x.shape[2:])))


# ---- the computations, in float64 --------------------------------------------------------------
def _stats(x4: np.ndarray, per_sample: bool, groups: int):
    """Mean and biased variance of the groups: shape ``(A, G)`` per sample, else ``(G,)``."""
    a, p, c, r = x4.shape
    x5 = x4.astype(np.float64).reshape(a, p, groups, c // groups, r)
    axes = (1, 3, 4) if per_sample else (0, 1, 3, 4)
    mean = x5.mean(axis=axes)
    var = np.square(x5 - _spread(mean, per_sample)).mean(axis=axes)
    return mean, var


def _spread(stat: np.ndarray, per_sample: bool) -> np.ndarray:
    """A ``(A, G)`` (or ``(G,)``) statistic shaped to broadcast over ``(A, P, G, cpg, R)``."""
    return stat[:, None, :, None, None] if per_sample else stat[None, None, :, None, None]


def _normalize(x4, mean, inv, scale, bias, per_sample: bool) -> np.ndarray:
    a, p, c, r = x4.shape
    g = mean.shape[-1]
    x5 = x4.astype(np.float64).reshape(a, p, g, c // g, r)
    xhat = ((x5 - _spread(mean, per_sample)) * _spread(inv, per_sample)).reshape(x4.shape)
    return xhat * _per_channel(scale, c, 1.0) + _per_channel(bias, c, 0.0)


def _per_channel(v, c: int, default: float) -> np.ndarray:
    if v is None:
        return np.full((1, 1, c, 1), default)
    if v.size != c:
        raise ShapeMismatch(f"expected {c} values (one per channel of X), got shape "
                            f"{list(v.shape)}")
    return v.astype(np.float64).reshape(1, 1, c, 1)


def _grads(x4, dy4, mean, inv, scale, per_sample: bool, batch_stats: bool):
    """(dX, dScale, dBias) in float64 (see ``cpu.lib.norm._grad``)."""
    a, p, c, r = x4.shape
    g = mean.shape[-1]
    shape5 = (a, p, g, c // g, r)
    m, iv = _spread(mean, per_sample), _spread(inv, per_sample)
    xhat = (x4.astype(np.float64).reshape(shape5) - m) * iv
    dy = dy4.astype(np.float64).reshape(a, p, c, r)
    dscale = (dy * xhat.reshape(dy.shape)).sum(axis=(0, 1, 3))
    dbias = dy.sum(axis=(0, 1, 3))
    gy = (dy * _per_channel(scale, c, 1.0)).reshape(shape5)
    if batch_stats:
        axes = (1, 3, 4) if per_sample else (0, 1, 3, 4)
        dx = iv * (gy - gy.mean(axis=axes, keepdims=True)
                   - xhat * (gy * xhat).mean(axis=axes, keepdims=True))
    else:
        dx = iv * gy
    return dx.reshape(x4.shape), dscale, dbias


def _same_shape(g: np.ndarray, x: np.ndarray, op: str) -> np.ndarray:
    if g.shape != x.shape:
        raise ShapeMismatch(f"{op}: Y@GRAD must have X's shape {list(x.shape)}, got "
                            f"{list(g.shape)}")
    return g


# ---- what the lowerings share (target-neutral) ----------------------------------------------
def _native(ctx, slots) -> bool:
    """Float32/float64 for every bound slot of ``slots``."""
    return all(ctx.dtype(s) in _NATIVE for s in slots if ctx.has_input(s) or ctx.has_output(s))


def _f32(value) -> str:
    """A float attribute as the float32 value Paddle stores, as a Python literal."""
    return repr(float(np.float32(value)))


def bn_grad_batch(ctx) -> bool | None:
    """Whether a lowerable ``batch_norm_grad`` differentiates batch statistics; ``None``: not
    lowerable (dtypes other than float32/float64, or running statistics missing)."""
    if not _native(ctx, ("X", "Scale", "Bias", "SavedMean", "SavedVariance", "MeanOut",
                         "VarianceOut", "Y@GRAD")):
        return None
    a = ctx.attrs
    batch = _batch_stats(a["is_test"], a["use_global_stats"], a["trainable_statistics"])
    if not batch and not (ctx.has_input("MeanOut") and ctx.has_input("VarianceOut")):
        return None  # the reference names what is missing
    return batch


def _ln_native(ctx, slots) -> bool:
    """float32/float64 data, every bound slot of ``slots`` of X's type, a valid axis."""
    t = ctx.dtype("X")
    if t not in _NATIVE or not 0 < int(ctx.attrs["begin_norm_axis"]) < ctx.rank("X"):
        return False
    return all(ctx.dtype(s) == t for s in slots if ctx.has_input(s) or ctx.has_output(s))


def _batch_stats(is_test: bool, use_global_stats: bool, trainable_statistics: bool) -> bool:
    return not ((is_test and not trainable_statistics) or use_global_stats)


# ---- batch_norm --------------------------------------------------------------------------------
_BN_ATTRS = {
    "epsilon": Float(1e-5, low=0.0, high=1e-3),
    "momentum": Float(0.9, low=0.0, high=1.0),
    "data_layout": Str("NCHW", choices=_LAYOUTS),
    "is_test": Bool(False),
    "use_global_stats": Bool(False),
    "trainable_statistics": Bool(False),
    "fuse_with_relu": Bool(False),
}


def _bn_check(X, Scale, Bias, epsilon, data_layout, op) -> int:
    check_dtype(X, FLOATS, f"{op}: X")
    _check_layout(data_layout, op)
    _check_rank(X, 2, 5, op)
    if not 0.0 <= np.float32(epsilon) <= np.float32(1e-3):  # compared as float32, as Paddle
        raise ShapeMismatch(f"{op}: epsilon must lie in [0, 0.001], got {float(epsilon):.6g}")
    c = X.shape[_channel_axis(X.ndim, data_layout)]
    _check_param(Scale, c, "Scale", op)
    _check_param(Bias, c, "Bias", op)
    return c


def _bn_infer(X, Mean, Variance, Scale=None, Bias=None, MomentumTensor=None, *, epsilon,
              data_layout, **_):
    c = _bn_check(X, Scale, Bias, epsilon, data_layout, "batch_norm")
    _check_param(Mean, c, "Mean", "batch_norm")
    _check_param(Variance, c, "Variance", "batch_norm")
    if MomentumTensor is not None and MomentumTensor.shape not in ((), (1,), (-1,)):
        raise ShapeMismatch(f"batch_norm: MomentumTensor must hold one value, got shape "
                            f"{list(MomentumTensor.shape)}")
    stat = VarMeta((c,), Mean.dtype)
    return {"Y": X, "MeanOut": Mean, "VarianceOut": Variance, "SavedMean": stat,
            "SavedVariance": stat, "ReserveSpace": VarMeta((0,), X.dtype)}


def _bn_ref(X, Mean, Variance, Scale=None, Bias=None, MomentumTensor=None, *, epsilon, momentum,
            data_layout, is_test, use_global_stats, trainable_statistics, fuse_with_relu):
    x4 = _view(X, data_layout)
    c = x4.shape[2]
    mean0 = _per_channel(Mean, c, 0.0).reshape(c)
    var0 = _per_channel(Variance, c, 0.0).reshape(c)
    if MomentumTensor is not None:
        momentum = float(np.asarray(MomentumTensor).reshape(-1)[0])
    momentum = float(np.float32(momentum))
    if not _batch_stats(is_test, use_global_stats, trainable_statistics):
        mean, var = mean0, var0
        inv = 1.0 / np.sqrt(var + epsilon)
        mean_out, var_out, saved = Mean.copy(), Variance.copy(), (mean, inv)
    elif x4.shape[0] * x4.shape[1] * x4.shape[3] == 1:  # one value per channel: Y = X
        zeros = np.zeros(c, Mean.dtype)
        y = np.maximum(X, 0) if fuse_with_relu else X.copy()
        return {"Y": y, "MeanOut": Mean.copy(), "VarianceOut": Variance.copy(),
                "SavedMean": zeros, "SavedVariance": zeros.copy(),
                "ReserveSpace": np.empty((0,), X.dtype)}
    else:
        mean, var = _stats(x4, False, c)
        inv = 1.0 / np.sqrt(var + epsilon)
        mean_out = mean0 * momentum + mean * (1.0 - momentum)
        var_out = var0 * momentum + var * (1.0 - momentum)
        saved = (mean, inv)
    y = _normalize(x4, mean, inv, Scale, Bias, False)
    if fuse_with_relu:
        y = np.maximum(y, 0.0)
    t = Mean.dtype
    return {"Y": y.astype(X.dtype).reshape(X.shape),
            "MeanOut": np.asarray(mean_out, t).reshape(Mean.shape),
            "VarianceOut": np.asarray(var_out, Variance.dtype).reshape(Variance.shape),
            "SavedMean": saved[0].astype(t), "SavedVariance": saved[1].astype(t),
            "ReserveSpace": np.empty((0,), X.dtype)}


def _bn_rows(v):
    """A batch norm keeps rows apart with running statistics only."""
    if not (v.attr("is_test") or v.attr("use_global_stats")):
        return "is_test and use_global_stats are false (batch statistics)"
    return "trainable_statistics" if v.attr("trainable_statistics") else None


def _bn_grad_maker(op):
    if op.attr("fuse_with_relu"):
        raise ProgramError(f"{op._describe()}: batch_norm with fuse_with_relu=True has no "
                           f"gradient (an inference fusion); use a relu op after it instead")
    return _bn_default_grad(op)


_bn_default_grad = default_grad(
    "batch_norm_grad", fwd_inputs=("X", "Scale", "Bias"),
    fwd_outputs=("MeanOut", "VarianceOut", "SavedMean", "SavedVariance", "ReserveSpace"),
    grad_outputs=("Y",), wrt=("X", "Scale", "Bias"))

def _bn_inference(op):
    """With running statistics, a per-channel ``Y = X * a + b`` (what inference passes fold)."""
    a = op.all_attrs()
    if _batch_stats(a.get("is_test", False), a.get("use_global_stats", False),
                    a.get("trainable_statistics", False)) or a.get("fuse_with_relu", False):
        return None
    eps = float(a.get("epsilon", 1e-5))

    def coefficients(v):
        mul = v["Scale"] / np.sqrt(v["Variance"] + eps) if v["Scale"] is not None \
            else 1.0 / np.sqrt(v["Variance"] + eps)
        return mul, (v["Bias"] if v["Bias"] is not None else 0.0) - v["Mean"] * mul

    return ChannelAffine("X", "Y", 1 if a.get("data_layout", "NCHW") == "NCHW" else -1,
                         ("Scale", "Bias", "Mean", "Variance"), coefficients,
                         {"MeanOut": "Mean", "VarianceOut": "Variance"})


register_op(
    "batch_norm", inputs=["X", "Scale?", "Bias?", "Mean", "Variance", "MomentumTensor?"],
    outputs=["Y", "MeanOut", "VarianceOut", "SavedMean~", "SavedVariance~", "ReserveSpace?"],
    row_wise=RowWise(const=("Scale", "Bias", "Mean", "Variance", "MomentumTensor"),
                     drop=("MeanOut", "VarianceOut", "SavedMean", "SavedVariance",
                           "ReserveSpace"), check=_bn_rows),
    attrs=dict(_BN_ATTRS), traits=[OPAQUE], infer_shape=_bn_infer, reference=_bn_ref,
    emit=Opaque(), grad=_bn_grad_maker,
    inference=_bn_inference,
    doc="Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias per channel, with batch or running "
        "statistics; the running statistics move by momentum in training.")


def _grad_outs_infer(X, Scale, Bias) -> dict:
    out = {"X@GRAD": X}
    if Scale is not None:
        out["Scale@GRAD"] = Scale
    if Bias is not None:
        out["Bias@GRAD"] = Bias
    return out


def _bn_grad_infer(X, SavedMean, SavedVariance, Scale=None, Bias=None, *, epsilon, data_layout,
                   **_):
    _bn_check(X, Scale, Bias, epsilon, data_layout, "batch_norm_grad")
    return _grad_outs_infer(X, Scale, Bias)


def _grad_result(X, Scale, Bias, dx, dscale, dbias) -> dict:
    out = {"X@GRAD": dx.astype(X.dtype).reshape(X.shape)}
    if Scale is not None:
        out["Scale@GRAD"] = dscale.astype(Scale.dtype).reshape(Scale.shape)
    if Bias is not None:
        out["Bias@GRAD"] = dbias.astype(Bias.dtype).reshape(Bias.shape)
    return out


def _bn_grad_ref(X, SavedMean, SavedVariance, Scale=None, Bias=None, MeanOut=None,
                 VarianceOut=None, *, epsilon, data_layout, is_test, use_global_stats,
                 trainable_statistics, **kw):
    dy = _same_shape(kw["Y@GRAD"], X, "batch_norm_grad")
    x4 = _view(X, data_layout)
    c = x4.shape[2]
    batch = _batch_stats(is_test, use_global_stats, trainable_statistics)
    if batch and x4.shape[0] * x4.shape[1] * x4.shape[3] == 1:  # the forward op copied X
        z = np.zeros(c)
        return _grad_result(X, Scale, Bias, dy, z, z)
    if batch:
        mean = _per_channel(SavedMean, c, 0.0).reshape(c)
        inv = _per_channel(SavedVariance, c, 0.0).reshape(c)
    else:
        if MeanOut is None or VarianceOut is None:
            raise ShapeMismatch("batch_norm_grad: with global statistics (is_test or "
                                "use_global_stats) MeanOut and VarianceOut must be given")
        mean = _per_channel(MeanOut, c, 0.0).reshape(c)
        inv = 1.0 / np.sqrt(_per_channel(VarianceOut, c, 0.0).reshape(c) + epsilon)
    dx, dscale, dbias = _grads(x4, dy.reshape(x4.shape), mean, inv, Scale, False, batch)
    return _grad_result(X, Scale, Bias, dx, dscale, dbias)


register_op(
    "batch_norm_grad",
    inputs=["X", "Scale?", "Bias?", "MeanOut?", "VarianceOut?", "SavedMean", "SavedVariance",
            "ReserveSpace?", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=dict(_BN_ATTRS), traits=[OPAQUE],
    infer_shape=_bn_grad_infer, reference=_bn_grad_ref,
    emit=Opaque(),
    grad=None, doc="Gradients of batch_norm through the batch or the running statistics.")


# ---- instance_norm -----------------------------------------------------------------------------
def _in_infer(X, Scale=None, Bias=None, *, epsilon, **_):
    check_dtype(X, FLOATS, "instance_norm: X")
    _check_rank(X, 2, 5, "instance_norm")
    c = X.shape[1]
    _check_param(Scale, c, "Scale", "instance_norm")
    _check_param(Bias, c, "Bias", "instance_norm")
    n = X.shape[0]
    nc = n * c if n >= 0 and c >= 0 else -1
    stat = VarMeta((nc,), Scale.dtype if Scale is not None else X.dtype)
    return {"Y": X, "SavedMean": stat, "SavedVariance": stat}


def _in_ref(X, Scale=None, Bias=None, *, epsilon):
    x4 = _view(X, "NCHW")
    mean, var = _stats(x4, True, x4.shape[2])
    inv = 1.0 / np.sqrt(var + epsilon)
    t = Scale.dtype if Scale is not None else X.dtype
    y = _normalize(x4, mean, inv, Scale, Bias, True)
    return {"Y": y.astype(X.dtype).reshape(X.shape), "SavedMean": mean.astype(t).reshape(-1),
            "SavedVariance": inv.astype(t).reshape(-1)}


register_op(
    "instance_norm", inputs=["X", "Scale?", "Bias?"],
    outputs=["Y", "SavedMean~", "SavedVariance~"],
    row_wise=RowWise(const=("Scale", "Bias"), drop=("SavedMean", "SavedVariance")),
    attrs={"epsilon": Float(1e-5, low=0.0, high=1e-2)},
    traits=[OPAQUE], infer_shape=_in_infer, reference=_in_ref, emit=Opaque(),
    grad=default_grad("instance_norm_grad", fwd_inputs=("X", "Scale", "Bias"),
                      fwd_outputs=("SavedMean", "SavedVariance"), grad_outputs=("Y",),
                      wrt=("X", "Scale", "Bias")),
    doc="Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias, statistics per sample and channel.")


def _in_grad_infer(X, Scale=None, Bias=None, **_):
    check_dtype(X, FLOATS, "instance_norm_grad: X")
    _check_rank(X, 2, 5, "instance_norm_grad")
    return _grad_outs_infer(X, Scale, Bias)


def _in_grad_ref(X, SavedMean, SavedVariance, Scale=None, Bias=None, **kw):
    dy = _same_shape(kw["Y@GRAD"], X, "instance_norm_grad")
    x4 = _view(X, "NCHW")
    n, c = X.shape[0], X.shape[1]
    if SavedMean.size != n * c or SavedVariance.size != n * c:
        raise ShapeMismatch(f"instance_norm_grad: SavedMean and SavedVariance must hold N*C = "
                            f"{n * c} values, got {SavedMean.size} and {SavedVariance.size}")
    mean = SavedMean.astype(np.float64).reshape(n, c)
    inv = SavedVariance.astype(np.float64).reshape(n, c)
    dx, dscale, dbias = _grads(x4, dy.reshape(x4.shape), mean, inv, Scale, True, True)
    return _grad_result(X, Scale, Bias, dx, dscale, dbias)


register_op(
    "instance_norm_grad", inputs=["X", "Scale?", "Bias?", "SavedMean", "SavedVariance", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"],
    attrs={"epsilon": Float(1e-5, low=0.0, high=1e-2)}, traits=[OPAQUE],
    infer_shape=_in_grad_infer, reference=_in_grad_ref, emit=Opaque(),
    grad=None, doc="Gradients of instance_norm through its saved statistics.")


# ---- group_norm --------------------------------------------------------------------------------
_GN_ATTRS = {"epsilon": Float(1e-5, low=0.0, high=1e-2), "groups": Int(-1, low=1, high=4),
             "data_layout": Str("NCHW", choices=_LAYOUTS)}


def _gn_check(X, Scale, Bias, groups, data_layout, op) -> int:
    check_dtype(X, FLOATS, f"{op}: X")
    _check_layout(data_layout, op)
    _check_rank(X, 2, None, op)
    c = X.shape[_channel_axis(X.ndim, data_layout)]
    if groups < 1:
        raise ShapeMismatch(f"{op}: groups must be >= 1, got {groups}")
    if c >= 0 and (groups > c or c % groups):
        raise ShapeMismatch(f"{op}: groups={groups} must divide the {c} channels of X (shape "
                            f"{list(X.shape)}, data_layout={data_layout!r})")
    _check_param(Scale, c, "Scale", op)
    _check_param(Bias, c, "Bias", op)
    return c


def _gn_infer(X, Scale=None, Bias=None, *, groups, data_layout, **_):
    _gn_check(X, Scale, Bias, groups, data_layout, "group_norm")
    stat = VarMeta((X.shape[0], groups), X.dtype)
    return {"Y": X, "Mean": stat, "Variance": stat}


def _gn_ref(X, Scale=None, Bias=None, *, epsilon, groups, data_layout):
    x4 = _view(X, data_layout)
    if groups < 1 or x4.shape[2] % groups:
        raise ShapeMismatch(f"group_norm: groups={groups} must divide the {x4.shape[2]} "
                            f"channels of X")
    mean, var = _stats(x4, True, groups)
    y = _normalize(x4, mean, 1.0 / np.sqrt(var + epsilon), Scale, Bias, True)
    return {"Y": y.astype(X.dtype).reshape(X.shape), "Mean": mean.astype(X.dtype),
            "Variance": var.astype(X.dtype)}


register_op(
    "group_norm", inputs=["X", "Scale?", "Bias?"], outputs=["Y", "Mean~", "Variance~"],
    row_wise=RowWise(const=("Scale", "Bias"), drop=("Mean", "Variance")),
    attrs=dict(_GN_ATTRS), traits=[OPAQUE], infer_shape=_gn_infer, reference=_gn_ref,
    emit=Opaque(),
    grad=default_grad("group_norm_grad", fwd_inputs=("X", "Scale", "Bias"),
                      fwd_outputs=("Y", "Mean", "Variance"), grad_outputs=("Y",),
                      wrt=("X", "Scale", "Bias")),
    doc="Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias, statistics per sample and group "
        "of channels.")


def _gn_grad_infer(X, Scale=None, Bias=None, *, groups, data_layout, **_):
    _gn_check(X, Scale, Bias, groups, data_layout, "group_norm_grad")
    return _grad_outs_infer(X, Scale, Bias)


def _gn_grad_ref(X, Mean, Variance, Scale=None, Bias=None, *, epsilon, groups, data_layout,
                 **kw):
    dy = _same_shape(kw["Y@GRAD"], X, "group_norm_grad")
    x4 = _view(X, data_layout)
    n = X.shape[0]
    if groups < 1 or x4.shape[2] % groups:
        raise ShapeMismatch(f"group_norm_grad: groups={groups} must divide the {x4.shape[2]} "
                            f"channels of X")
    if Mean.size != n * groups or Variance.size != n * groups:
        raise ShapeMismatch(f"group_norm_grad: Mean and Variance must have shape [{n}, "
                            f"{groups}], got {list(Mean.shape)} and {list(Variance.shape)}")
    mean = Mean.astype(np.float64).reshape(n, groups)
    inv = 1.0 / np.sqrt(Variance.astype(np.float64).reshape(n, groups) + epsilon)
    dx, dscale, dbias = _grads(x4, dy.reshape(x4.shape), mean, inv, Scale, True, True)
    return _grad_result(X, Scale, Bias, dx, dscale, dbias)


register_op(
    "group_norm_grad", inputs=["X", "Y?", "Scale?", "Bias?", "Mean", "Variance", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=dict(_GN_ATTRS), traits=[OPAQUE],
    infer_shape=_gn_grad_infer, reference=_gn_grad_ref, emit=Opaque(),
    grad=None, doc="Gradients of group_norm through its statistics.")


# ---- layer_norm --------------------------------------------------------------------------------
# X is seen as rows: left = prod(X.shape[:begin_norm_axis]) rows of right =
# prod(X.shape[begin_norm_axis:]) values; Scale and Bias hold `right` values.
_LN_ATTRS = {"epsilon": Float(1e-5, low=0.0, high=1e-3), "begin_norm_axis": Int(1, low=1, high=2)}


def _ln_split(shape, begin_norm_axis: int, op: str) -> tuple:
    """(left, right) of X's ``shape`` (-1 when unknown); ShapeMismatch for an axis Paddle
    refuses (it must lie in 1..rank-1)."""
    rank = len(shape)
    if not 0 < begin_norm_axis < rank:
        raise ShapeMismatch(f"{op}: begin_norm_axis must lie in 1..{rank - 1} for X of rank "
                            f"{rank} (shape {list(shape)}), got {begin_norm_axis}")
    return _known_prod(shape[:begin_norm_axis]), _known_prod(shape[begin_norm_axis:])


def _known_prod(dims) -> int:
    """The product of ``dims``, or -1 when one is unknown."""
    return int(np.prod(dims, dtype=np.int64)) if all(d >= 0 for d in dims) else -1


def _ln_stat_dtype(x_dtype) -> np.dtype:
    """Mean and Variance are float32 for float16 X (Paddle's kernels), else X's type."""
    return np.dtype(np.float32) if np.dtype(x_dtype) == np.float16 else np.dtype(x_dtype)


def _ln_check(X, Scale, Bias, epsilon, begin_norm_axis, op) -> tuple:
    check_dtype(X, FLOATS, f"{op}: X")
    left, right = _ln_split(X.shape, begin_norm_axis, op)
    if not 0.0 <= np.float32(epsilon) <= np.float32(1e-3):  # compared as float32, as Paddle
        raise ShapeMismatch(f"{op}: epsilon must lie in [0, 0.001], got {float(epsilon):.6g}")
    for what, meta in (("Scale", Scale), ("Bias", Bias)):
        if meta is None:
            continue
        check_dtype(meta, FLOATS, f"{op}: {what}")
        if meta.ndim != 1 or (right >= 0 and meta.shape[0] >= 0 and meta.shape[0] != right):
            raise ShapeMismatch(
                f"{op}: {what} must have shape [{right}] (one value per element of X's dims "
                f"{begin_norm_axis}.. of shape {list(X.shape)}), got {list(meta.shape)}")
    return left, right


def _ln_infer(X, Scale=None, Bias=None, *, epsilon, begin_norm_axis):
    _ln_check(X, Scale, Bias, epsilon, begin_norm_axis, "layer_norm")
    # Paddle 3.3.1 gives Mean and Variance X's leading dims (Fluid 1.x gave [left])
    stat = VarMeta(X.shape[:begin_norm_axis], _ln_stat_dtype(X.dtype))
    return {"Y": X, "Mean": stat, "Variance": stat}


def _ln_values(v, right: int, what: str, op: str, default: float) -> np.ndarray:
    if v is None:
        return np.full(right, default)
    if v.size != right:
        raise ShapeMismatch(f"{op}: {what} must hold {right} values (one per element of X's "
                            f"normalised dims), got shape {list(v.shape)}")
    return v.astype(np.float64).reshape(right)


def _ln_rows(X, begin_norm_axis, op) -> np.ndarray:
    left, right = _ln_split(X.shape, begin_norm_axis, op)
    return X.astype(np.float64).reshape(left, right)


def _ln_ref(X, Scale=None, Bias=None, *, epsilon, begin_norm_axis):
    x = _ln_rows(X, begin_norm_axis, "layer_norm")
    right = x.shape[1]
    scale = _ln_values(Scale, right, "Scale", "layer_norm", 1.0)
    bias = _ln_values(Bias, right, "Bias", "layer_norm", 0.0)
    mean = x.mean(axis=1)
    var = np.square(x - mean[:, None]).mean(axis=1)
    eps = float(np.float32(epsilon))
    y = (x - mean[:, None]) / np.sqrt(var + eps)[:, None] * scale + bias
    t, lead = _ln_stat_dtype(X.dtype), X.shape[:begin_norm_axis]
    return {"Y": y.astype(X.dtype).reshape(X.shape), "Mean": mean.astype(t).reshape(lead),
            "Variance": var.astype(t).reshape(lead)}


register_op(
    "layer_norm", inputs=["X", "Scale?", "Bias?"], outputs=["Y", "Mean~", "Variance~"],
    row_wise=RowWise(const=("Scale", "Bias"), drop=("Mean", "Variance"),
                     check=lambda v: None if int(v.attr("begin_norm_axis")) >= 1
                     else "begin_norm_axis < 1"),
    attrs=dict(_LN_ATTRS), traits=[OPAQUE], infer_shape=_ln_infer, reference=_ln_ref,
    emit=Opaque(),
    grad=default_grad("layer_norm_grad", fwd_inputs=("X", "Scale", "Bias"),
                      fwd_outputs=("Mean", "Variance"), grad_outputs=("Y",),
                      wrt=("X", "Scale", "Bias")),
    doc="Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias, statistics over the dims from "
        "begin_norm_axis on, per leading index.")


def _ln_grad_infer(X, Mean, Variance, Scale=None, Bias=None, *, epsilon, begin_norm_axis, **_):
    _ln_check(X, Scale, Bias, epsilon, begin_norm_axis, "layer_norm_grad")
    return _grad_outs_infer(X, Scale, Bias)


def _ln_grad_ref(X, Mean, Variance, Scale=None, Bias=None, *, epsilon, begin_norm_axis, **kw):
    op = "layer_norm_grad"
    x = _ln_rows(X, begin_norm_axis, op)
    left, right = x.shape
    dy = _same_shape(kw["Y@GRAD"], X, op).astype(np.float64).reshape(left, right)
    if Mean.size != left or Variance.size != left:
        raise ShapeMismatch(f"{op}: Mean and Variance must hold {left} values (one per row of "
                            f"X's leading dims), got shapes {list(Mean.shape)} and "
                            f"{list(Variance.shape)}")
    scale = _ln_values(Scale, right, "Scale", op, 1.0)
    mean = Mean.astype(np.float64).reshape(left, 1)
    inv = 1.0 / np.sqrt(Variance.astype(np.float64).reshape(left, 1) + float(np.float32(epsilon)))
    xhat = (x - mean) * inv
    g = dy * scale
    dx = inv * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return _grad_result(X, Scale, Bias, dx, (dy * xhat).sum(axis=0), dy.sum(axis=0))


register_op(
    "layer_norm_grad", inputs=["X", "Scale?", "Bias?", "Mean", "Variance", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=dict(_LN_ATTRS), traits=[OPAQUE],
    infer_shape=_ln_grad_infer, reference=_ln_grad_ref,
    emit=Opaque(),
    grad=None, doc="Gradients of layer_norm through the row statistics Mean and Variance.")
