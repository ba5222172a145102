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

Natively (float32 and float64; float16 runs the references) every op calls the three library
kernels of ``pdjit.codegen.cpu.lib.norm`` (statistics, normalisation, gradients) on a 4-D view
of its data, one compilation per dtype for all of them; the host lines do the bookkeeping on
the few values per channel (running averages, saved statistics) with NumPy. ``layer_norm`` and
its gradient call ``cpu.lib.norm.layer_norm_fwd`` / ``layer_norm_bwd`` on the ``(left, right)``
rows (one compilation per dtype for every shape and axis; float32 and float64 with Scale and
Bias of X's type, else the references).
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


# ---- lowering helpers --------------------------------------------------------------------------
def _native(ctx, slots) -> bool:
    """Float32/float64 for every bound slot of ``slots``."""
    return all(ctx.dtype(s) in _NATIVE for s in slots if ctx.has_input(s) or ctx.has_output(s))


def _f32(value) -> str:
    """A float attribute as the float32 value Paddle stores, as a Python literal."""
    return repr(float(np.float32(value)))


def _batch_stats(is_test: bool, use_global_stats: bool, trainable_statistics: bool) -> bool:
    return not ((is_test and not trainable_statistics) or use_global_stats)


class _Host:
    """Host lines under construction for a norm op on X: the ``(A, P, C, R)`` views of arrays
    (see :func:`_view`), per-channel inputs (constants when absent), outputs (scratch arrays
    when not bound). The lines call the kernels of ``pdjit.codegen.cpu.lib.norm`` and do the
    per-channel bookkeeping on a few values with NumPy (valid Python and Numba)."""

    def __init__(self, ctx, data_layout: str):
        self.ctx, self.layout, self.lines = ctx, data_layout, []
        self.rank, self.T, self.X = ctx.rank("X"), ctx.T("X"), ctx.inp("X")
        self.c = f"{self.X}.shape[{_channel_axis(self.rank, data_layout)}]"

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def tmp(self, hint: str) -> str:
        return self.ctx.tmp(hint)

    def view(self, local: str) -> str:
        r, v = self.rank, self.tmp("v")
        if self.layout == "NHWC" and r > 2:
            shape = (f"({local}.shape[0], {self.ctx.prod(local, 1, r - 1)}, "
                     f"{local}.shape[{r - 1}], 1)")
        else:
            shape = f"({local}.shape[0], 1, {local}.shape[1], {self.ctx.prod(local, 2, r)})"
        self.emit(f"{v} = {local}.reshape({shape})")
        return v

    def dtype_of(self, slot: str) -> str:
        ctx = self.ctx
        return ctx.T(slot) if ctx.has_input(slot) or ctx.has_output(slot) else self.T

    def param(self, slot: str, fill: str) -> str:
        """Input ``slot``, or ``np.ones``/``np.zeros`` (``fill``) per channel when absent."""
        if self.ctx.has_input(slot):
            return self.ctx.inp(slot)
        return self.const(fill, self.dtype_of(slot))

    def const(self, fill: str, T: str) -> str:
        t = self.tmp("k")
        self.emit(f"{t} = np.{fill}(({self.c},), {T})")
        return t

    def out(self, slot: str, shape: str, T: str) -> str:
        """Output ``slot`` allocated by the driver, or a scratch array when it is not bound."""
        return self.ctx.out_or_scratch(slot, shape, T, self.lines)

    def grads(self, x4: str, dy: str) -> tuple:
        """(dy4, dx4, dscale, dbias): the out-grad viewed like ``x4`` and the gradients."""
        dy4, dx = self.tmp("g"), self.out("X@GRAD", f"{self.X}.shape", self.T)
        self.emit(f"{dy4} = {dy}.reshape({x4}.shape)")
        ds = self.out("Scale@GRAD", f"({self.c},)", self.dtype_of("Scale"))
        db = self.out("Bias@GRAD", f"({self.c},)", self.dtype_of("Bias"))
        return dy4, f"{dx}.reshape({x4}.shape)", ds, db


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


def _bn_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias", "Mean", "Variance", "MomentumTensor")):
        return None
    if ctx.target != "cpu":
        return _bn_device_lines(ctx)
    a = ctx.attrs
    h = _Host(ctx, a["data_layout"])
    mean, var, TS = ctx.inp("Mean"), ctx.inp("Variance"), ctx.T("Mean")
    scale, bias = h.param("Scale", "ones"), h.param("Bias", "zeros")
    mom = _f32(a["momentum"])
    if ctx.has_input("MomentumTensor"):
        mt, mom = ctx.inp("MomentumTensor"), h.tmp("mom")
        h.emit(f"{mom} = float({mt}.reshape({mt}.size)[0])")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    mo, vo = h.out("MeanOut", f"{mean}.shape", TS), h.out("VarianceOut", f"{var}.shape", TS)
    sm, sv = h.out("SavedMean", f"({h.c},)", TS), h.out("SavedVariance", f"({h.c},)", TS)
    if ctx.has_output("ReserveSpace"):
        ctx.out("ReserveSpace", shape="(0,)")
    x4, y4 = h.view(h.X), h.view(y)
    m, v, inv = h.tmp("m"), h.tmp("v"), h.tmp("inv")
    eps, relu = _f32(a["epsilon"]), bool(a["fuse_with_relu"])
    apply = f"_nn.norm_apply({x4}, {m}, {inv}, {{}}, {{}}, False, 1, {relu}, {y4})"
    if not _batch_stats(a["is_test"], a["use_global_stats"], a["trainable_statistics"]):
        h.emit(f"{m} = {mean}.astype(np.float64).reshape((1, {mean}.size))",
               f"{inv} = 1.0 / np.sqrt({var}.astype(np.float64).reshape((1, {var}.size)) + "
               f"{eps})",
               f"{mo}[:] = {mean}", f"{vo}[:] = {var}", f"{sm}[:] = {mean}",
               f"{sv}[:] = {inv}[0]", apply.format(scale, bias))
        return h.lines
    ones, zeros = h.const("ones", h.dtype_of("Scale")), h.const("zeros", h.dtype_of("Bias"))
    h.emit(f"{m} = np.empty((1, {x4}.shape[2]))", f"{v} = np.empty((1, {x4}.shape[2]))",
           f"_nn.norm_stats({x4}, False, 1, {m}, {v})",
           f"if {x4}.size == {x4}.shape[2]:  # one value per channel: Y = X, statistics kept",
           f"    {m}[:, :] = 0.0", f"    {inv} = np.ones((1, {x4}.shape[2]))",
           f"    {mo}[:] = {mean}", f"    {vo}[:] = {var}", f"    {sm}[:] = 0.0",
           f"    {sv}[:] = 0.0", "    " + apply.format(ones, zeros),
           "else:",
           f"    {inv} = 1.0 / np.sqrt({v} + {eps})",
           f"    {mo}[:] = {mean}.astype(np.float64) * {mom} + {m}[0] * (1.0 - {mom})",
           f"    {vo}[:] = {var}.astype(np.float64) * {mom} + {v}[0] * (1.0 - {mom})",
           f"    {sm}[:] = {m}[0]", f"    {sv}[:] = {inv}[0]", "    " + apply.format(scale, bias))
    return h.lines


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
    emit=Opaque(_bn_lower, host=True), grad=_bn_grad_maker,
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


def _bn_grad_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias", "SavedMean", "SavedVariance", "MeanOut",
                         "VarianceOut", "Y@GRAD")):
        return None
    a = ctx.attrs
    batch = _batch_stats(a["is_test"], a["use_global_stats"], a["trainable_statistics"])
    if not batch and not (ctx.has_input("MeanOut") and ctx.has_input("VarianceOut")):
        return None  # the reference names what is missing
    if ctx.target != "cpu":
        return _bn_grad_device_lines(ctx, batch)
    h = _Host(ctx, a["data_layout"])
    scale = h.param("Scale", "ones")
    x4 = h.view(h.X)
    dy4, dx4, ds, db = h.grads(x4, ctx.inp("Y@GRAD"))
    grad = f"_nn.norm_grad({x4}, {dy4}, {{}}, {{}}, {{}}, False, 1, {{}}, {dx4}, {ds}, {db})"
    if not batch:
        mean, var = ctx.inp("MeanOut"), ctx.inp("VarianceOut")
        h.emit(grad.format(f"{mean}.astype(np.float64).reshape((1, {mean}.size))",
                           f"1.0 / np.sqrt({var}.astype(np.float64).reshape((1, {var}.size)) + "
                           f"{_f32(a['epsilon'])})", scale, False))
        return h.lines
    sm, sv = ctx.inp("SavedMean"), ctx.inp("SavedVariance")
    ones = h.const("ones", h.dtype_of("Scale"))
    h.emit(f"if {x4}.size == {x4}.shape[2]:  # the forward op passed X through",
           "    " + grad.format(f"np.zeros((1, {x4}.shape[2]))", f"np.ones((1, {x4}.shape[2]))",
                                ones, False),
           f"    {ds}[:] = 0.0", f"    {db}[:] = 0.0",
           "else:",
           "    " + grad.format(f"{sm}.astype(np.float64).reshape((1, {sm}.size))",
                                f"{sv}.astype(np.float64).reshape((1, {sv}.size))", scale, True))
    return h.lines


# ---- batch_norm on a device target ---------------------------------------------------------------
# X seen flat as (A, P, C, R) (see _view): element ((a * P + p) * C + c) * R + r. One thread per
# channel computes the channel's statistics (float64, two passes, as cpu.lib.norm) and its
# coefficients; one thread per element applies them. Every size and attribute is a run-time
# argument.
def _bn_device_common(ctx, lines: list) -> tuple:
    """(x1, C, R, cnt, flat, cx): driver locals of X flat, its channels, the run after the
    channel, the values per channel; ``flat(local)`` appends a line viewing ``local`` 1-D;
    ``cx`` the channels as an expression over X (for the driver's output shapes)."""
    X, r = ctx.inp("X"), ctx.rank("X")
    nhwc = ctx.attrs["data_layout"] == "NHWC" and r > 2

    def flat(local):
        t = ctx.tmp("f")
        lines.append(f"{t} = {local}.reshape({local}.size)")
        return t
    x1 = flat(X)
    C, R, cnt = ctx.tmp("C"), ctx.tmp("R"), ctx.tmp("cnt")
    lines += [f"{C} = {X}.shape[{r - 1 if nhwc else 1}]",
              f"{R} = {1 if nhwc else ctx.prod(X, 2, r)}",
              f"{cnt} = {X}.size // max({C}, 1)"]
    return x1, C, R, cnt, flat, f"{X}.shape[{r - 1 if nhwc else 1}]"


def _device_out(ctx, slot: str, shape: str, T: str, lines: list) -> str:
    """Output ``slot`` allocated by the driver, or device scratch when it is not bound."""
    if ctx.has_output(slot):
        return ctx.out(slot, shape=shape)
    t = ctx.tmp("u")
    lines.append(f"{t} = _cu.empty({shape}, {T})")
    return t


def _fits(ctx, lines: list, n: str, slots) -> None:
    """A line checking that each bound input of ``slots`` holds ``n`` values (the kernels
    index them by channel or row and cannot raise: else the reference names the misfit)."""
    sizes = [f"{ctx.inp(s)}.size == {n}" for s in slots if ctx.has_input(s)]
    if sizes:
        lines.append(f"_rt.check({' and '.join(sizes)})")


def _bn_device_lines(ctx):
    a = ctx.attrs
    lines: list = []
    x1, C, R, cnt, flat, cx = _bn_device_common(ctx, lines)
    X, TS = ctx.inp("X"), ctx.T("Mean")
    mean, var = flat(ctx.inp("Mean")), flat(ctx.inp("Variance"))
    y = ctx.out("Y", shape=f"{X}.shape")
    mo = flat(_device_out(ctx, "MeanOut", f"{ctx.inp('Mean')}.shape", TS, lines))
    vo = flat(_device_out(ctx, "VarianceOut", f"{ctx.inp('Variance')}.shape", TS, lines))
    sm = _device_out(ctx, "SavedMean", f"({cx},)", TS, lines)
    sv = _device_out(ctx, "SavedVariance", f"({cx},)", TS, lines)
    if ctx.has_output("ReserveSpace"):
        ctx.out("ReserveSpace", shape="(0,)")
    y1 = flat(y)
    sc, bc, eps, mom = ctx.tmp("s"), ctx.tmp("b"), ctx.tmp("eps"), ctx.tmp("mom")
    lines += [f"{sc} = _cu.empty(({C},), np.float64)", f"{bc} = _cu.empty(({C},), np.float64)",
              f"{eps} = {_f32(a['epsilon'])}"]
    if ctx.has_input("MomentumTensor"):  # read on the device: no host round trip
        mom_line = f"mom_ = float({flat(ctx.inp('MomentumTensor'))}[0])"
    else:
        lines.append(f"{mom} = {_f32(a['momentum'])}")
        mom_line = f"mom_ = {mom}"
    scale = f"{ctx.inp('Scale')}[c_]" if ctx.has_input("Scale") else "1.0"
    bias = f"{ctx.inp('Bias')}[c_]" if ctx.has_input("Bias") else "0.0"
    _fits(ctx, lines, C, ("Scale", "Bias", "Mean", "Variance"))
    if _batch_stats(a["is_test"], a["use_global_stats"], a["trainable_statistics"]):
        stats = [
            "acc = 0.0",
            "for e_ in range(cnt_):",
            f"    acc += {x1}[((e_ // {R}) * {C} + c_) * {R} + e_ % {R}]",
            "m_ = acc / cnt_",
            "acc = 0.0",
            "for e_ in range(cnt_):",
            f"    d_ = {x1}[((e_ // {R}) * {C} + c_) * {R} + e_ % {R}] - m_",
            "    acc += d_ * d_",
            "v_ = acc / cnt_",
            "if cnt_ == 1:",
            f"    {mo}[c_] = {mean}[c_]",
            f"    {vo}[c_] = {var}[c_]",
            f"    {sm}[c_] = 0.0",
            f"    {sv}[c_] = 0.0",
            f"    {sc}[c_] = 1.0",
            f"    {bc}[c_] = 0.0",
            "else:",
            f"    iv = 1.0 / math.sqrt(v_ + {eps})",
            mom_line.join(["    ", ""]),
            f"    {mo}[c_] = {mean}[c_] * mom_ + m_ * (1.0 - mom_)",
            f"    {vo}[c_] = {var}[c_] * mom_ + v_ * (1.0 - mom_)",
            f"    {sm}[c_] = m_",
            f"    {sv}[c_] = iv",
            f"    {sc}[c_] = iv * {scale}",
            f"    {bc}[c_] = {bias} - m_ * {sc}[c_]"]
    else:
        stats = [
            "m_ = float(" + f"{mean}[c_])",
            f"iv = 1.0 / math.sqrt(float({var}[c_]) + {eps})",
            f"{mo}[c_] = {mean}[c_]", f"{vo}[c_] = {var}[c_]",
            f"{sm}[c_] = {mean}[c_]", f"{sv}[c_] = iv",
            f"{sc}[c_] = iv * {scale}", f"{bc}[c_] = {bias} - m_ * {sc}[c_]"]
    lines += ctx.device_loop("c_", C, stats, before=[f"cnt_ = {cnt}"])
    relu = ["if v_ < 0.0:", "    v_ = 0.0"] if a["fuse_with_relu"] else []
    lines += ctx.device_loop("i_", f"{x1}.size", [
        f"c_ = (i_ // {R}) % {C}", f"v_ = {x1}[i_] * {sc}[c_] + {bc}[c_]"] + relu +
        [f"{y1}[i_] = v_"])
    return lines


def _bn_grad_device_lines(ctx, batch: bool):
    lines: list = []
    x1, C, R, cnt, flat, cx = _bn_device_common(ctx, lines)
    X, T = ctx.inp("X"), ctx.T("X")
    dy = flat(ctx.inp("Y@GRAD"))
    dx = flat(_device_out(ctx, "X@GRAD", f"{X}.shape", T, lines))
    TS = ctx.T("Scale") if ctx.has_input("Scale") else T
    ds = _device_out(ctx, "Scale@GRAD", f"({cx},)", TS, lines)
    db = _device_out(ctx, "Bias@GRAD", f"({cx},)",
                     ctx.T("Bias") if ctx.has_input("Bias") else T, lines)
    cf = [ctx.tmp(h) for h in ("m", "cg", "cx", "c0")]
    lines += [f"{t} = _cu.empty(({C},), np.float64)" for t in cf]
    mc, cg, cx, c0 = cf
    scale = f"{ctx.inp('Scale')}[c_]" if ctx.has_input("Scale") else "1.0"
    _fits(ctx, lines, C, ("Scale", "SavedMean", "SavedVariance") if batch else
          ("Scale", "MeanOut", "VarianceOut"))
    lines.append(f"_rt.check({ctx.inp('Y@GRAD')}.shape == {X}.shape)")
    if batch:
        sm, sv = flat(ctx.inp("SavedMean")), flat(ctx.inp("SavedVariance"))
        head = ["if cnt_ == 1:",
                "    m_ = 0.0", "    iv = 1.0", "    sc_ = 1.0",
                "else:", f"    m_ = float({sm}[c_])", f"    iv = float({sv}[c_])",
                f"    sc_ = {scale}"]
    else:
        eps = ctx.tmp("eps")
        lines.append(f"{eps} = {_f32(ctx.attrs['epsilon'])}")
        mo, vo = flat(ctx.inp("MeanOut")), flat(ctx.inp("VarianceOut"))
        head = [f"m_ = float({mo}[c_])", f"iv = 1.0 / math.sqrt(float({vo}[c_]) + {eps})",
                f"sc_ = {scale}"]
    body = head + [
        "s1 = 0.0", "s2 = 0.0",
        "for e_ in range(cnt_):",
        f"    j_ = ((e_ // {R}) * {C} + c_) * {R} + e_ % {R}",
        f"    s1 += {dy}[j_]",
        f"    s2 += {dy}[j_] * ({x1}[j_] - m_)",
        "if cnt_ == 1 and bstat:",
        f"    {db}[c_] = 0.0", f"    {ds}[c_] = 0.0",
        "else:",
        f"    {db}[c_] = s1", f"    {ds}[c_] = s2 * iv",
        f"{mc}[c_] = m_",
        f"{cg}[c_] = iv * sc_",
        "if bstat and cnt_ > 1:",
        f"    {cx}[c_] = -iv * iv * (s2 * iv * sc_) / cnt_",
        f"    {c0}[c_] = -iv * (s1 * sc_) / cnt_",
        "else:",
        f"    {cx}[c_] = 0.0", f"    {c0}[c_] = 0.0"]
    bs = ctx.tmp("bs")
    lines.append(f"{bs} = {int(batch)}")
    lines += ctx.device_loop("c_", C, body, before=[f"cnt_ = {cnt}", f"bstat = {bs} != 0"])
    lines += ctx.device_loop("i_", f"{x1}.size", [
        f"c_ = (i_ // {R}) % {C}",
        f"{dx}[i_] = {cg}[c_] * {dy}[i_] + {cx}[c_] * ({x1}[i_] - {mc}[c_]) + {c0}[c_]"])
    return lines


register_op(
    "batch_norm_grad",
    inputs=["X", "Scale?", "Bias?", "MeanOut?", "VarianceOut?", "SavedMean", "SavedVariance",
            "ReserveSpace?", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=dict(_BN_ATTRS), traits=[OPAQUE],
    infer_shape=_bn_grad_infer, reference=_bn_grad_ref,
    emit=Opaque(_bn_grad_lower, host=True),
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


def _in_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias")):
        return None
    h = _Host(ctx, "NCHW")
    scale, bias, TS = h.param("Scale", "ones"), h.param("Bias", "zeros"), h.dtype_of("Scale")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    nc = f"({h.X}.shape[0] * {h.c},)"
    sm, sv = h.out("SavedMean", nc, TS), h.out("SavedVariance", nc, TS)
    x4, y4 = h.view(h.X), h.view(y)
    m, v, inv = h.tmp("m"), h.tmp("v"), h.tmp("inv")
    h.emit(f"{m} = np.empty(({x4}.shape[0], {x4}.shape[2]))",
           f"{v} = np.empty(({x4}.shape[0], {x4}.shape[2]))",
           f"_nn.norm_stats({x4}, True, 1, {m}, {v})",
           f"{inv} = 1.0 / np.sqrt({v} + {_f32(ctx.attrs['epsilon'])})",
           f"{sm}[:] = {m}.reshape({m}.size)", f"{sv}[:] = {inv}.reshape({inv}.size)",
           f"_nn.norm_apply({x4}, {m}, {inv}, {scale}, {bias}, True, 1, False, {y4})")
    return h.lines


register_op(
    "instance_norm", inputs=["X", "Scale?", "Bias?"],
    outputs=["Y", "SavedMean~", "SavedVariance~"],
    row_wise=RowWise(const=("Scale", "Bias"), drop=("SavedMean", "SavedVariance")),
    attrs={"epsilon": Float(1e-5, low=0.0, high=1e-2)},
    traits=[OPAQUE], infer_shape=_in_infer, reference=_in_ref, emit=Opaque(_in_lower, host=True),
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


def _in_grad_lower(ctx):
    if not _native(ctx, ("X", "Scale", "SavedMean", "SavedVariance", "Y@GRAD")):
        return None
    h = _Host(ctx, "NCHW")
    scale = h.param("Scale", "ones")
    x4 = h.view(h.X)
    dy4, dx4, ds, db = h.grads(x4, ctx.inp("Y@GRAD"))
    stat = f"({x4}.shape[0], {x4}.shape[2])"
    h.emit(f"_nn.norm_grad({x4}, {dy4}, "
           f"{ctx.inp('SavedMean')}.astype(np.float64).reshape({stat}), "
           f"{ctx.inp('SavedVariance')}.astype(np.float64).reshape({stat}), {scale}, True, 1, "
           f"True, {dx4}, {ds}, {db})")
    return h.lines


register_op(
    "instance_norm_grad", inputs=["X", "Scale?", "Bias?", "SavedMean", "SavedVariance", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"],
    attrs={"epsilon": Float(1e-5, low=0.0, high=1e-2)}, traits=[OPAQUE],
    infer_shape=_in_grad_infer, reference=_in_grad_ref, emit=Opaque(_in_grad_lower, host=True),
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


def _gn_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias")):
        return None
    a = ctx.attrs
    h, groups = _Host(ctx, a["data_layout"]), int(a["groups"])
    scale, bias = h.param("Scale", "ones"), h.param("Bias", "zeros")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    stat = f"({h.X}.shape[0], {groups})"
    mo, vo = h.out("Mean", stat, h.T), h.out("Variance", stat, h.T)
    x4, y4 = h.view(h.X), h.view(y)
    m, v = h.tmp("m"), h.tmp("v")
    cpg = f"{x4}.shape[2] // {groups}"
    h.emit(f"{m} = np.empty({stat})", f"{v} = np.empty({stat})",
           f"_nn.norm_stats({x4}, True, {cpg}, {m}, {v})",
           f"{mo}[:, :] = {m}", f"{vo}[:, :] = {v}",
           f"_nn.norm_apply({x4}, {m}, 1.0 / np.sqrt({v} + {_f32(a['epsilon'])}), {scale}, "
           f"{bias}, True, {cpg}, False, {y4})")
    return h.lines


register_op(
    "group_norm", inputs=["X", "Scale?", "Bias?"], outputs=["Y", "Mean~", "Variance~"],
    row_wise=RowWise(const=("Scale", "Bias"), drop=("Mean", "Variance")),
    attrs=dict(_GN_ATTRS), traits=[OPAQUE], infer_shape=_gn_infer, reference=_gn_ref,
    emit=Opaque(_gn_lower, host=True),
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


def _gn_grad_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Mean", "Variance", "Y@GRAD")):
        return None
    a = ctx.attrs
    h, groups = _Host(ctx, a["data_layout"]), int(a["groups"])
    scale = h.param("Scale", "ones")
    x4 = h.view(h.X)
    dy4, dx4, ds, db = h.grads(x4, ctx.inp("Y@GRAD"))
    stat = f"({x4}.shape[0], {groups})"
    h.emit(f"_nn.norm_grad({x4}, {dy4}, {ctx.inp('Mean')}.astype(np.float64).reshape({stat}), "
           f"1.0 / np.sqrt({ctx.inp('Variance')}.astype(np.float64).reshape({stat}) + "
           f"{_f32(a['epsilon'])}), {scale}, True, {x4}.shape[2] // {groups}, True, {dx4}, "
           f"{ds}, {db})")
    return h.lines


register_op(
    "group_norm_grad", inputs=["X", "Y?", "Scale?", "Bias?", "Mean", "Variance", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=dict(_GN_ATTRS), traits=[OPAQUE],
    infer_shape=_gn_grad_infer, reference=_gn_grad_ref, emit=Opaque(_gn_grad_lower, host=True),
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


def _ln_native(ctx, slots) -> bool:
    """float32/float64 data, every bound slot of ``slots`` of X's type, a valid axis."""
    t = ctx.dtype("X")
    if t not in _NATIVE or not 0 < int(ctx.attrs["begin_norm_axis"]) < ctx.rank("X"):
        return False
    return all(ctx.dtype(s) == t for s in slots if ctx.has_input(s) or ctx.has_output(s))


class _LNHost:
    """Host lines of a layer-norm op: X as ``(left, right)`` rows, parameters (ones/zeros when
    absent), outputs (scratch arrays when not bound)."""

    def __init__(self, ctx):
        self.ctx, self.lines = ctx, []
        self.X, self.T = ctx.inp("X"), ctx.T("X")
        self.axis, rank = int(ctx.attrs["begin_norm_axis"]), ctx.rank("X")
        # a source expression over X alone: output shapes are evaluated before the lines run
        self.right = f"({ctx.prod(self.X, self.axis, rank)})"
        self.x2 = ctx.tmp("x")
        self.lines.append(f"{self.x2} = {self.X}.reshape(({ctx.prod(self.X, 0, self.axis)}, "
                          f"{self.right}))")
        self.eps = _f32(ctx.attrs["epsilon"])

    def param(self, slot: str, fill: str) -> str:
        if self.ctx.has_input(slot):
            return self.ctx.inp(slot)
        t = self.ctx.tmp("k")
        self.lines.append(f"{t} = np.{fill}(({self.right},), {self.T})")
        return t

    def out(self, slot: str, shape: str) -> str:
        return self.ctx.out_or_scratch(slot, shape, self.T, self.lines)

    def lead_shape(self) -> str:
        dims = "".join(f"{self.X}.shape[{i}], " for i in range(self.axis))
        return f"({dims})"


def _ln_lower(ctx):
    if not _ln_native(ctx, ("Scale", "Bias", "Y", "Mean", "Variance")):
        return None
    if ctx.target != "cpu":
        return _ln_device_lines(ctx, grad=False)
    h = _LNHost(ctx)
    scale, bias = h.param("Scale", "ones"), h.param("Bias", "zeros")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    mean, var = h.out("Mean", h.lead_shape()), h.out("Variance", h.lead_shape())
    rows = f"{h.x2}.shape[0]"
    h.lines.append(f"_nn.layer_norm_fwd({h.x2}, {scale}, {bias}, {h.eps}, "
                   f"{y}.reshape({h.x2}.shape), {mean}.reshape(({rows},)), "
                   f"{var}.reshape(({rows},)))")
    return h.lines


register_op(
    "layer_norm", inputs=["X", "Scale?", "Bias?"], outputs=["Y", "Mean~", "Variance~"],
    row_wise=RowWise(const=("Scale", "Bias"), drop=("Mean", "Variance"),
                     check=lambda v: None if int(v.attr("begin_norm_axis")) >= 1
                     else "begin_norm_axis < 1"),
    attrs=dict(_LN_ATTRS), traits=[OPAQUE], infer_shape=_ln_infer, reference=_ln_ref,
    emit=Opaque(_ln_lower, host=True),
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


def _ln_grad_lower(ctx):
    if not _ln_native(ctx, ("Scale", "Mean", "Variance", "Y@GRAD", "X@GRAD", "Scale@GRAD",
                            "Bias@GRAD")):
        return None
    if ctx.target != "cpu":
        return _ln_device_lines(ctx, grad=True)
    h = _LNHost(ctx)
    scale = h.param("Scale", "ones")
    if ctx.has_output("X@GRAD"):
        dx, want = f"{ctx.out('X@GRAD', shape=f'{h.X}.shape')}.reshape({h.x2}.shape)", True
    else:
        dx, want = f"np.empty((0, 0), {h.T})", False
    ds, db = h.out("Scale@GRAD", f"({h.right},)"), h.out("Bias@GRAD", f"({h.right},)")
    mean, var, dy = ctx.inp("Mean"), ctx.inp("Variance"), ctx.inp("Y@GRAD")
    h.lines.append(f"_nn.layer_norm_bwd({h.x2}, {dy}.reshape({h.x2}.shape), "
                   f"{mean}.reshape(({mean}.size,)), {var}.reshape(({var}.size,)), {scale}, "
                   f"{h.eps}, {want}, {dx}, {ds}, {db})")
    return h.lines


def _ln_device_lines(ctx, grad: bool) -> list:
    """layer_norm (``grad``: its gradients) on a device target, with cpu.lib.norm's numerics
    (statistics and sums in float64, the per-row mean and 1/std rounded to X's type, products
    in X's type): the forward pass one thread per row; the gradients one thread per column
    (Scale@GRAD, Bias@GRAD: sums over the rows) and one per row (X@GRAD)."""
    X, T = ctx.inp("X"), ctx.T("X")
    axis, rank = int(ctx.attrs["begin_norm_axis"]), ctx.rank("X")
    right = f"({ctx.prod(X, axis, rank)})"
    lead = "(" + "".join(f"{X}.shape[{i}], " for i in range(axis)) + ")"
    lines: list = []

    def flat(local):
        t = ctx.tmp("f")
        lines.append(f"{t} = {local}.reshape({local}.size)")
        return t

    def out(slot, shape):
        if ctx.has_output(slot):
            return ctx.out(slot, shape=shape)
        t = ctx.tmp("u")
        lines.append(f"{t} = _cu.empty({shape}, {T})")
        return t

    x1 = flat(X)
    nc, nr, eps = ctx.tmp("nc"), ctx.tmp("nr"), ctx.tmp("eps")
    lines += [f"{nc} = {right}", f"{nr} = {X}.size // max({nc}, 1)",
              f"{eps} = {_f32(ctx.attrs['epsilon'])}"]
    scale = f"{ctx.inp('Scale')}[j_]" if ctx.has_input("Scale") else f"{T}(1)"
    bias = f"{ctx.inp('Bias')}[j_]" if ctx.has_input("Bias") else f"{T}(0)"
    _fits(ctx, lines, nc, ("Scale", "Bias"))
    if not grad:
        y1 = flat(ctx.out("Y", shape=f"{X}.shape"))
        mean, var = flat(out("Mean", lead)), flat(out("Variance", lead))
        body = [f"b_ = r_ * {nc}", "s_ = 0.0", f"for j_ in range({nc}):",
                f"    s_ += {x1}[b_ + j_]", f"m_ = s_ / {nc}", "q_ = 0.0",
                f"for j_ in range({nc}):", f"    d_ = {x1}[b_ + j_] - m_", "    q_ += d_ * d_",
                f"v_ = q_ / {nc}", f"{mean}[r_] = m_", f"{var}[r_] = v_",
                f"mt = {T}(m_)", f"it = {T}(1.0 / math.sqrt(v_ + {eps}))",
                f"for j_ in range({nc}):",
                f"    {y1}[b_ + j_] = ({x1}[b_ + j_] - mt) * it * {scale} + {bias}"]
        return lines + ctx.device_loop("r_", nr, body)
    _fits(ctx, lines, nr, ("Mean", "Variance"))
    lines.append(f"_rt.check({ctx.inp('Y@GRAD')}.shape == {X}.shape)")
    mean, var = flat(ctx.inp("Mean")), flat(ctx.inp("Variance"))
    dy = flat(ctx.inp("Y@GRAD"))
    row = [f"mt = {T}({mean}[r_])", f"it = {T}(1.0 / math.sqrt(float({var}[r_]) + {eps}))"]
    if ctx.has_output("Scale@GRAD") or ctx.has_output("Bias@GRAD"):
        ds, db = out("Scale@GRAD", f"({right},)"), out("Bias@GRAD", f"({right},)")
        lines += ctx.device_loop("j_", nc, [
            "s1 = 0.0", "s2 = 0.0", f"for r_ in range({nr}):"] + ["    " + t for t in row] + [
            f"    k_ = r_ * {nc} + j_", f"    d_ = {dy}[k_]",
            f"    s1 += d_ * (({x1}[k_] - mt) * it)", "    s2 += d_",
            f"{ds}[j_] = s1", f"{db}[j_] = s2"])
    if ctx.has_output("X@GRAD"):
        dx = flat(ctx.out("X@GRAD", shape=f"{X}.shape"))
        lines += ctx.device_loop("r_", nr, row + [
            f"b_ = r_ * {nc}", "sg = 0.0", "sgx = 0.0", f"for j_ in range({nc}):",
            f"    g_ = {dy}[b_ + j_] * {scale}", "    sg += g_",
            f"    sgx += g_ * (({x1}[b_ + j_] - mt) * it)",
            f"a_ = {T}(sg / {nc})", f"c_ = {T}(sgx / {nc})",
            f"for j_ in range({nc}):",
            f"    {dx}[b_ + j_] = it * ({dy}[b_ + j_] * {scale} - a_ - "
            f"(({x1}[b_ + j_] - mt) * it) * c_)"])
    return lines


register_op(
    "layer_norm_grad", inputs=["X", "Scale?", "Bias?", "Mean", "Variance", "Y@GRAD"],
    outputs=["X@GRAD?", "Scale@GRAD?", "Bias@GRAD?"], attrs=dict(_LN_ATTRS), traits=[OPAQUE],
    infer_shape=_ln_grad_infer, reference=_ln_grad_ref,
    emit=Opaque(_ln_grad_lower, host=True),
    grad=None, doc="Gradients of layer_norm through the row statistics Mean and Variance.")
