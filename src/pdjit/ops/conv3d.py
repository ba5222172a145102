"""Fluid 1.8's 3-D convolution and pooling: ``conv3d``, ``conv3d_transpose`` (described above its
definition), ``pool3d`` (with ``adaptive``) and ``trilinear_interp`` (likewise), with their
gradients, over NCDHW tensors.

- ``conv3d(Input [N, C, D, H, W], Filter [M, C / groups, kd, kh, kw]) -> Output``: the
  cross-correlation with ``strides``, zero ``paddings`` (3 values, or 6: front/back, top/bottom,
  left/right) and ``dilations``; channels in ``groups``.
- ``pool3d(X) -> Out``: ``max`` or ``avg`` over ``ksize`` windows moved by ``strides`` over the
  zero-padded X (padding never wins a max; ``exclusive`` averages count only the real
  elements), ``global_pooling`` over everything, ``adaptive`` windows ``floor(i D / o) ..
  ceil((i + 1) D / o)`` for ``ksize`` outputs per axis, ``ceil_mode`` rounding the output size
  up. The max's gradient goes to the first maximum of each window.

The NumPy references run as plan steps (``emit`` is ``None``): a correct, unhurried 3-D path.
"""
from __future__ import annotations

import math

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    Bool,
    Float,
    GradOpSpec,
    Int,
    Ints,
    Str,
    VarMeta,
    default_grad,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype


def _pads(paddings) -> list:
    p = list(paddings)
    if len(p) == 3:
        return [p[0], p[0], p[1], p[1], p[2], p[2]]
    if len(p) == 6:
        return p
    raise ShapeMismatch(f"expected 3 or 6 paddings, got {p}")


def _out_size(n, k, s, p0, p1, d=1, ceil=False):
    span = n + p0 + p1 - (d * (k - 1) + 1)
    return (-(-span // s) if ceil else span // s) + 1 if n >= 0 else -1


# ---- conv3d ------------------------------------------------------------------------------------
_CONV = {"strides": Ints([1, 1, 1], choices=([1, 1, 1], [2, 1, 1])),
         "paddings": Ints([0, 0, 0], choices=([0, 0, 0], [1, 0, 1])),
         "dilations": Ints([1, 1, 1], choices=([1, 1, 1],)),
         "groups": Int(1, low=1, high=1),
         "data_format": Str("NCDHW", one_of=("NCDHW", "AnyLayout")),
         "padding_algorithm": Str("EXPLICIT", one_of=("EXPLICIT",)),
         "use_cudnn": Bool(True)}


def _conv_infer(Input, Filter, *, strides, paddings, dilations, groups, **_):
    check_dtype(Input, FLOATS, "conv3d: Input")
    if Input.ndim != 5 or Filter.ndim != 5:
        raise ShapeMismatch(f"conv3d: expected Input [N, C, D, H, W] and Filter [M, C / groups, "
                            f"kd, kh, kw], got {list(Input.shape)} and {list(Filter.shape)}")
    if Input.shape[1] >= 0 and Input.shape[1] != Filter.shape[1] * groups:
        raise ShapeMismatch(f"conv3d: Input has {Input.shape[1]} channels: expected Filter's "
                            f"{Filter.shape[1]} x groups {groups}")
    p = _pads(paddings)
    out = [_out_size(Input.shape[2 + a], Filter.shape[2 + a], strides[a], p[2 * a],
                     p[2 * a + 1], dilations[a]) for a in range(3)]
    return {"Output": VarMeta((Input.shape[0], Filter.shape[0], *out), Input.dtype)}


def _taps(shape, fshape, strides, paddings, dilations):
    """For each kernel offset (a, b, c): the slices of the padded input it reads."""
    p = _pads(paddings)
    out = [_out_size(shape[2 + a], fshape[2 + a], strides[a], p[2 * a], p[2 * a + 1],
                     dilations[a]) for a in range(3)]
    if min(out) < 1:
        raise ShapeMismatch(f"conv3d: input {list(shape[2:])} with paddings {p} is smaller than "
                            f"the dilated kernel {list(fshape[2:])}")
    for a in range(fshape[2]):
        for b in range(fshape[3]):
            for c in range(fshape[4]):
                yield (a, b, c), tuple(
                    slice(k * dilations[i], k * dilations[i] + (out[i] - 1) * strides[i] + 1,
                          strides[i]) for i, k in enumerate((a, b, c)))


def _padded(x, paddings):
    p = _pads(paddings)
    return np.pad(x, ((0, 0), (0, 0), (p[0], p[1]), (p[2], p[3]), (p[4], p[5])))


def _conv_ref(Input, Filter, *, strides, paddings, dilations, groups, **_):
    xp = _padded(Input.astype(np.float64), paddings)
    w = Filter.astype(np.float64)
    m, cg = w.shape[0], w.shape[1]
    mg = m // groups
    out = None
    for (a, b, c), sl in _taps(Input.shape, w.shape, strides, paddings, dilations):
        win = xp[(slice(None), slice(None)) + sl]                 # [N, C, Do, Ho, Wo]
        parts = [np.einsum("ncdhw,mc->nmdhw", win[:, g * cg:(g + 1) * cg],
                           w[g * mg:(g + 1) * mg, :, a, b, c]) for g in range(groups)]
        term = np.concatenate(parts, axis=1)
        out = term if out is None else out + term
    return {"Output": out.astype(Input.dtype)}


def _conv_grad_ref(Input, Filter, *, strides, paddings, dilations, groups, **kw):
    g_out = kw["Output@GRAD"].astype(np.float64)
    xp = _padded(Input.astype(np.float64), paddings)
    w = Filter.astype(np.float64)
    m, cg = w.shape[0], w.shape[1]
    mg = m // groups
    dxp, dw = np.zeros(xp.shape), np.zeros(w.shape)
    for (a, b, c), sl in _taps(Input.shape, w.shape, strides, paddings, dilations):
        win = xp[(slice(None), slice(None)) + sl]
        for g in range(groups):
            go = g_out[:, g * mg:(g + 1) * mg]
            dw[g * mg:(g + 1) * mg, :, a, b, c] += np.einsum(
                "nmdhw,ncdhw->mc", go, win[:, g * cg:(g + 1) * cg])
            dxp[(slice(None), slice(g * cg, (g + 1) * cg)) + sl] += np.einsum(
                "nmdhw,mc->ncdhw", go, w[g * mg:(g + 1) * mg, :, a, b, c])
    p = _pads(paddings)
    d, h, wd = Input.shape[2:]
    dx = dxp[:, :, p[0]:p[0] + d, p[2]:p[2] + h, p[4]:p[4] + wd]
    return {"Input@GRAD": dx.astype(Input.dtype), "Filter@GRAD": dw.astype(Filter.dtype)}


register_op(
    "conv3d", inputs=["Input", "Filter"], outputs=["Output"], attrs=_CONV, traits=[OPAQUE],
    infer_shape=_conv_infer, reference=_conv_ref, emit=None,
    grad=default_grad("conv3d_grad", fwd_inputs=("Input", "Filter"), grad_outputs=("Output",),
                      wrt=("Input", "Filter")),
    doc="3-D cross-correlation of Input with Filter (NCDHW).")
register_op(
    "conv3d_grad", inputs=["Input", "Filter", "Output@GRAD"],
    outputs=["Input@GRAD?", "Filter@GRAD?"], attrs=dict(_CONV), traits=[OPAQUE],
    infer_shape=lambda Input, Filter, **_: {"Input@GRAD": Input, "Filter@GRAD": Filter},
    reference=_conv_grad_ref, emit=None, grad=None, doc="Gradients of conv3d.")


# ---- pool3d ------------------------------------------------------------------------------------
_POOL = {"pooling_type": Str(REQUIRED, one_of=("max", "avg"), choices=("max", "avg")),
         "ksize": Ints(REQUIRED, choices=([1, 2, 2], [2, 1, 1])),
         "strides": Ints([1, 1, 1], choices=([1, 1, 1], [1, 2, 2])),
         "paddings": Ints([0, 0, 0], choices=([0, 0, 0],)),
         "global_pooling": Bool(False), "exclusive": Bool(True), "adaptive": Bool(False),
         "ceil_mode": Bool(False),
         "data_format": Str("NCDHW", one_of=("NCDHW", "AnyLayout")),
         "padding_algorithm": Str("EXPLICIT", one_of=("EXPLICIT",)),
         "use_cudnn": Bool(True)}


def _windows(shape, a):
    """[(out index (i, j, k), (slices over the real elements), padded element count)]."""
    d, h, w = shape[2:]
    dims = (d, h, w)
    if a["global_pooling"]:
        return [((0, 0, 0), (slice(0, d), slice(0, h), slice(0, w)), d * h * w)], (1, 1, 1)
    if a["adaptive"]:
        outs = tuple(a["ksize"])
        axes = [[(math.floor(i * n / o), math.ceil((i + 1) * n / o)) for i in range(o)]
                for n, o in zip(dims, outs)]
    else:
        p = _pads(a["paddings"])
        outs = tuple(_out_size(n, k, s, p[2 * i], p[2 * i + 1], 1, a["ceil_mode"])
                     for i, (n, k, s) in enumerate(zip(dims, a["ksize"], a["strides"])))
        if min(outs) < 1:
            raise ShapeMismatch(f"pool3d: input {list(dims)} smaller than ksize {a['ksize']}")
        axes = [[(i * s - p[2 * ax], i * s - p[2 * ax] + k) for i in range(o)]
                for ax, (o, k, s) in enumerate(zip(outs, a["ksize"], a["strides"]))]
    wins = []
    for i, (d0, d1) in enumerate(axes[0]):
        for j, (h0, h1) in enumerate(axes[1]):
            for k, (w0, w1) in enumerate(axes[2]):
                sl = (slice(max(d0, 0), min(d1, d)), slice(max(h0, 0), min(h1, h)),
                      slice(max(w0, 0), min(w1, w)))
                full = (d1 - d0) * (h1 - h0) * (w1 - w0)
                wins.append(((i, j, k), sl, full))
    return wins, outs


def _pool_infer(X, **a):
    check_dtype(X, FLOATS, "pool3d: X")
    if X.ndim != 5 or len(a["ksize"]) != 3:
        raise ShapeMismatch(f"pool3d: expected X [N, C, D, H, W] and 3 ksize values, got "
                            f"{list(X.shape)} and {a['ksize']}")
    if a["global_pooling"]:
        out = [1, 1, 1]
    elif a["adaptive"]:
        out = list(a["ksize"])
    else:
        p = _pads(a["paddings"])
        out = [_out_size(X.shape[2 + i], a["ksize"][i], a["strides"][i], p[2 * i], p[2 * i + 1],
                         1, a["ceil_mode"]) for i in range(3)]
    return {"Out": VarMeta((X.shape[0], X.shape[1], *out), X.dtype)}


def _pool_ref(X, **a):
    wins, outs = _windows(X.shape, a)
    out = np.zeros(X.shape[:2] + tuple(outs))
    x = X.astype(np.float64)
    for idx, sl, full in wins:
        block = x[(slice(None), slice(None)) + sl].reshape(X.shape[0], X.shape[1], -1)
        if block.shape[2] == 0:
            continue
        if a["pooling_type"] == "max":
            out[(slice(None), slice(None)) + idx] = block.max(axis=2)
        else:
            count = block.shape[2] if (a["exclusive"] or a["adaptive"]) else full
            out[(slice(None), slice(None)) + idx] = block.sum(axis=2) / count
    return {"Out": out.astype(X.dtype)}


def _pool_grad_ref(X, **kw):
    g = kw.pop("Out@GRAD").astype(np.float64)
    kw.pop("Out", None)
    wins, _ = _windows(X.shape, kw)
    dx = np.zeros(X.shape)
    x = X.astype(np.float64)
    n, c = X.shape[:2]
    for idx, sl, full in wins:
        region = (slice(None), slice(None)) + sl
        block = x[region].reshape(n, c, -1)
        if block.shape[2] == 0:
            continue
        gv = g[(slice(None), slice(None)) + idx]
        if kw["pooling_type"] == "max":
            hit = np.zeros(block.shape)
            hit[np.arange(n)[:, None], np.arange(c)[None, :], block.argmax(axis=2)] = 1.0
            dx[region] += (hit * gv[:, :, None]).reshape(dx[region].shape)
        else:
            count = block.shape[2] if (kw["exclusive"] or kw["adaptive"]) else full
            dx[region] += (gv / count)[:, :, None, None, None]
    return {"X@GRAD": dx.astype(X.dtype)}


register_op(
    "pool3d", inputs=["X"], outputs=["Out"], attrs=_POOL, traits=[OPAQUE],
    infer_shape=_pool_infer, reference=_pool_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "pool3d_grad", {"X": op.input("X"), "Out": op.output("Out"),
                        "Out@GRAD": [grad_var_name(v) for v in op.output("Out")]},
        {"X@GRAD": [grad_var_name(v) for v in op.input("X")]},
        {k: v for k, v in op.all_attrs().items() if k in _POOL})],
    doc="3-D max or average pooling (global, adaptive or by windows).")
register_op(
    "pool3d_grad", inputs=["X", "Out", "Out@GRAD"], outputs=["X@GRAD?"], attrs=dict(_POOL),
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_pool_grad_ref,
    emit=None, grad=None, doc="Gradient of pool3d.")


# ---- conv3d_transpose --------------------------------------------------------------------------
# Input [N, C, D, H, W], Filter [C, M / groups, kd, kh, kw] -> Output [N, M, (D - 1) s - p0 - p1
# + dil (k - 1) + 1, ...]: each input element spreads Filter's kernel (times itself) over the
# output at stride s, then the paddings are cut from the borders (the adjoint of conv3d).
_CONVT = dict(_CONV, output_size=Ints([], choices=([],)))


def _convt_full(shape, fshape, strides, dilations):
    return [(shape[2 + i] - 1) * strides[i] + dilations[i] * (fshape[2 + i] - 1) + 1
            for i in range(3)]


def _convt_infer(Input, Filter, *, strides, paddings, dilations, groups, **_):
    check_dtype(Input, FLOATS, "conv3d_transpose: Input")
    if Input.ndim != 5 or Filter.ndim != 5:
        raise ShapeMismatch(f"conv3d_transpose: expected Input [N, C, D, H, W] and Filter "
                            f"[C, M / groups, kd, kh, kw], got {list(Input.shape)} and "
                            f"{list(Filter.shape)}")
    p = _pads(paddings)
    full = _convt_full(Input.shape, Filter.shape, strides, dilations)
    out = [f - p[2 * i] - p[2 * i + 1] if Input.shape[2 + i] >= 0 else -1
           for i, f in enumerate(full)]
    return {"Output": VarMeta((Input.shape[0], Filter.shape[1] * groups, *out), Input.dtype)}


def _convt_taps(shape, fshape, strides, dilations):
    for a in range(fshape[2]):
        for b in range(fshape[3]):
            for c in range(fshape[4]):
                yield (a, b, c), tuple(
                    slice(k * dilations[i], k * dilations[i] + (shape[2 + i] - 1) * strides[i]
                          + 1, strides[i]) for i, k in enumerate((a, b, c)))


def _convt_ref(Input, Filter, *, strides, paddings, dilations, groups, **_):
    x, w = Input.astype(np.float64), Filter.astype(np.float64)
    cg, mg = x.shape[1] // groups, w.shape[1]
    full = _convt_full(x.shape, w.shape, strides, dilations)
    out = np.zeros((x.shape[0], mg * groups, *full))
    for (a, b, c), sl in _convt_taps(x.shape, w.shape, strides, dilations):
        for g in range(groups):
            out[(slice(None), slice(g * mg, (g + 1) * mg)) + sl] += np.einsum(
                "ncdhw,cm->nmdhw", x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg, :, a, b, c])
    p = _pads(paddings)
    out = out[:, :, p[0]:full[0] - p[1], p[2]:full[1] - p[3], p[4]:full[2] - p[5]]
    return {"Output": out.astype(Input.dtype)}


def _convt_grad_ref(Input, Filter, *, strides, paddings, dilations, groups, **kw):
    x, w = Input.astype(np.float64), Filter.astype(np.float64)
    cg, mg = x.shape[1] // groups, w.shape[1]
    p = _pads(paddings)
    g = np.pad(kw["Output@GRAD"].astype(np.float64),
               ((0, 0), (0, 0), (p[0], p[1]), (p[2], p[3]), (p[4], p[5])))
    dx, dw = np.zeros(x.shape), np.zeros(w.shape)
    for (a, b, c), sl in _convt_taps(x.shape, w.shape, strides, dilations):
        for gi in range(groups):
            go = g[(slice(None), slice(gi * mg, (gi + 1) * mg)) + sl]
            xs = x[:, gi * cg:(gi + 1) * cg]
            dx[:, gi * cg:(gi + 1) * cg] += np.einsum("nmdhw,cm->ncdhw", go,
                                                      w[gi * cg:(gi + 1) * cg, :, a, b, c])
            dw[gi * cg:(gi + 1) * cg, :, a, b, c] += np.einsum("ncdhw,nmdhw->cm", xs, go)
    return {"Input@GRAD": dx.astype(Input.dtype), "Filter@GRAD": dw.astype(Filter.dtype)}


register_op(
    "conv3d_transpose", inputs=["Input", "Filter"], outputs=["Output"], attrs=_CONVT,
    traits=[OPAQUE], infer_shape=_convt_infer, reference=_convt_ref, emit=None,
    grad=default_grad("conv3d_transpose_grad", fwd_inputs=("Input", "Filter"),
                      grad_outputs=("Output",), wrt=("Input", "Filter")),
    doc="3-D transposed convolution (the adjoint of conv3d).")
register_op(
    "conv3d_transpose_grad", inputs=["Input", "Filter", "Output@GRAD"],
    outputs=["Input@GRAD?", "Filter@GRAD?"], attrs=dict(_CONVT), traits=[OPAQUE],
    infer_shape=lambda Input, Filter, **_: {"Input@GRAD": Input, "Filter@GRAD": Filter},
    reference=_convt_grad_ref, emit=None, grad=None, doc="Gradients of conv3d_transpose.")


# ---- trilinear_interp --------------------------------------------------------------------------
# X [N, C, D, H, W] resized to out_d x out_h x out_w by linear interpolation along each axis:
# with align_corners the corners match (source = dst (in - 1) / (out - 1)); else ratio =
# in / out and source = dst ratio (align_mode 1) or (dst + 0.5) ratio - 0.5, at least 0
# (align_mode 0). The resize is a product of one [out, in] matrix per axis; the gradient applies
# their transposes.
_TRI = {"out_d": Int(-1, low=2, high=3), "out_h": Int(-1, low=2, high=3),
        "out_w": Int(-1, low=2, high=3), "scale": Float(0.0, low=0.0, high=0.0),
        "interp_method": Str("trilinear", one_of=("trilinear",)),
        "align_corners": Bool(True), "align_mode": Int(1, one_of=(0, 1), choices=(0, 1)),
        "data_layout": Str("NCHW", one_of=("NCHW", "NCDHW", "AnyLayout"))}


def _tri_sizes(shape, out_d, out_h, out_w, scale):
    if out_d > 0 and out_h > 0 and out_w > 0:
        return [out_d, out_h, out_w]
    if scale and scale > 0:
        return [int(n * scale) if n >= 0 else -1 for n in shape[2:]]
    raise ShapeMismatch(f"trilinear_interp: expected out_d, out_h, out_w or a scale > 0, got "
                        f"{[out_d, out_h, out_w]} and scale {scale}")


def _tri_matrix(n_in, n_out, align_corners, align_mode):
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        if align_corners:
            src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        elif align_mode == 0:
            src = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
        else:
            src = o * n_in / n_out
        i0 = min(int(src), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        lam = src - i0
        m[o, i0] += 1 - lam
        m[o, i1] += lam
    return m


def _tri_infer(X, *, out_d, out_h, out_w, scale, **_):
    check_dtype(X, FLOATS, "trilinear_interp: X")
    if X.ndim != 5:
        raise ShapeMismatch(f"trilinear_interp: expected X [N, C, D, H, W], got "
                            f"{list(X.shape)}")
    return {"Out": VarMeta((X.shape[0], X.shape[1],
                            *_tri_sizes(X.shape, out_d, out_h, out_w, scale)), X.dtype)}


def _tri_mats(shape, a):
    sizes = _tri_sizes(shape, a["out_d"], a["out_h"], a["out_w"], a["scale"])
    return [_tri_matrix(n, o, a["align_corners"], a["align_mode"])
            for n, o in zip(shape[2:], sizes)]


def _tri_ref(X, **a):
    md, mh, mw = _tri_mats(X.shape, a)
    out = np.einsum("ncdhw,Dd,Hh,Ww->ncDHW", X.astype(np.float64), md, mh, mw)
    return {"Out": out.astype(X.dtype)}


def _tri_grad_ref(X, **kw):
    g = kw.pop("Out@GRAD").astype(np.float64)
    md, mh, mw = _tri_mats(X.shape, kw)
    return {"X@GRAD": np.einsum("ncDHW,Dd,Hh,Ww->ncdhw", g, md, mh, mw).astype(X.dtype)}


register_op(
    "trilinear_interp", inputs=["X"], outputs=["Out"], attrs=_TRI, traits=[OPAQUE],
    infer_shape=_tri_infer, reference=_tri_ref, emit=None,
    grad=default_grad("trilinear_interp_grad", fwd_inputs=("X",)),
    doc="X resized by trilinear interpolation (NCDHW).")
register_op(
    "trilinear_interp_grad", inputs=["X", "Out@GRAD"], outputs=["X@GRAD?"], attrs=dict(_TRI),
    traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X}, reference=_tri_grad_ref,
    emit=None, grad=None, doc="Gradient of trilinear_interp.")
