"""Ops that Fluid 1.8's layers append under names of their own, where a composition of other
ops would compute the same: a program Fluid saved holds these op types, so each is defined here
with Fluid 1.8's slots and attributes, its shape rule, its NumPy semantics and its gradient.

- ``label_smooth(X, PriorDist?) -> Out``: ``(1 - epsilon) * X + epsilon * prior``, the prior
  ``PriorDist`` (``[1, K]``) or uniform ``1 / K`` over the last axis.
- ``maxout(X) -> Out``: the maximum of each run of ``groups`` consecutive channels along
  ``axis``; the gradient goes to the first maximum of each run (as Fluid's kernel).
- ``lrn(X) -> Out, MidOut``: ``MidOut = k + alpha * sum of X^2`` over the ``n`` channels around
  each one (``(n - 1) // 2`` before it), ``Out = X * MidOut^-beta``.
- Rearrangements, each one index map (the gradient adds each output's gradient into the
  input element it read): ``pixel_shuffle`` (``upscale_factor``), ``shuffle_channel``
  (``group``), ``space_to_depth`` (``blocksize``, darknet's reorg as Fluid computes it),
  ``temporal_shift`` (``seg_num``, ``shift_ratio``, ``data_format``), ``pad2d``
  (``paddings`` ``[top, bottom, left, right]`` or the ``Paddings`` input, ``mode`` constant /
  reflect / edge, ``pad_value``, ``data_format``), ``flip`` (``dims``, or 2.x's ``axis``),
  ``tril_triu`` (``diagonal``, ``lower``), ``expand_as`` (``X`` tiled to
  ``target_tensor``'s shape).
- ``reduce_all`` / ``reduce_any`` (bool, Fluid's ``dim`` / ``keep_dim`` / ``reduce_all``),
  ``size`` (int64: the element count of ``Input``, ``[1]`` from a Fluid 1.x layer),
  ``clip_by_norm`` (``X`` scaled to L2 norm ``max_norm`` when larger), ``one_hot`` (Fluid
  1.x's: ids ``[..., 1]`` to ``[..., depth]``, ``depth`` or the ``depth_tensor`` input,
  ``allow_out_of_range``): no gradient.

None of them is lowered to native code (``emit=None``): a compiled plan runs each as a host
step of its NumPy definition.
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import dtypes
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    Bool,
    Float,
    Int,
    Ints,
    Str,
    VarMeta,
    default_grad,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype, norm_axis

F64 = np.float64
INT64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


def _bad(op: str, what: str) -> ShapeMismatch:
    return ShapeMismatch(f"{op}: {what}")


def _rank(op: str, X: VarMeta, rank: int, slot: str = "X") -> None:
    if X.ndim != rank:
        raise _bad(op, f"input {slot} of shape {list(X.shape)}: expected rank {rank}, got "
                       f"{X.ndim}")


def _same_shape_grad(op: str):
    """infer_shape of a grad op writing ``X@GRAD`` of ``X``'s meta."""
    return lambda X, **_: {"X@GRAD": X}


# ---- label_smooth ------------------------------------------------------------------------------
def _ls_infer(X, PriorDist=None, *, epsilon):
    check_dtype(X, FLOATS, "label_smooth: input X")
    if not 0.0 <= epsilon <= 1.0:
        raise _bad("label_smooth", f"expected epsilon in [0, 1], got {epsilon}")
    if PriorDist is not None:
        k = X.shape[-1] if X.ndim else -1
        if PriorDist.dtype != X.dtype or PriorDist.ndim not in (1, 2) or (
                k >= 0 and PriorDist.shape[-1] >= 0 and PriorDist.shape[-1] != k) or (
                PriorDist.ndim == 2 and PriorDist.shape[0] not in (1, -1)):
            raise _bad("label_smooth", f"expected PriorDist of shape [1, {k}] and dtype "
                                       f"{X.dtype}, got {list(PriorDist.shape)} "
                                       f"{PriorDist.dtype}")
    return {"Out": X}


def _ls_ref(X, PriorDist=None, *, epsilon):
    eps = float(np.float32(epsilon))
    if X.ndim == 0:
        raise _bad("label_smooth", "expected X of rank >= 1, got a 0-d tensor")
    prior = (PriorDist.reshape(-1).astype(F64) if PriorDist is not None
             else 1.0 / X.shape[-1])
    if PriorDist is not None and PriorDist.size != X.shape[-1]:
        raise _bad("label_smooth", f"expected PriorDist of {X.shape[-1]} values, got "
                                   f"{PriorDist.size}")
    return {"Out": ((1 - eps) * X.astype(F64) + eps * prior).astype(X.dtype)}


def _ls_grad_ref(*, epsilon, **kw):
    g = kw["Out@GRAD"]
    return {"X@GRAD": ((1 - float(np.float32(epsilon))) * g.astype(F64)).astype(g.dtype)}


register_op(
    "label_smooth", inputs=["X", "PriorDist?"], outputs=["Out"],
    attrs={"epsilon": Float(0.0, low=0.0, high=0.5)}, traits=[OPAQUE],
    infer_shape=_ls_infer, reference=_ls_ref, emit=None,
    grad=default_grad("label_smooth_grad", fwd_inputs=(), wrt=("X",)),
    doc="Out = (1 - epsilon) * X + epsilon * (PriorDist or 1 / K).")
register_op(
    "label_smooth_grad", inputs=["Out@GRAD"], outputs=["X@GRAD"],
    attrs={"epsilon": Float(0.0, low=0.0, high=0.5)}, traits=[OPAQUE],
    infer_shape=lambda **kw: {"X@GRAD": kw["Out@GRAD"]}, reference=_ls_grad_ref, emit=None,
    grad=None, doc="X@GRAD = (1 - epsilon) * Out@GRAD.")


# ---- maxout ------------------------------------------------------------------------------------
_MAXOUT_ATTRS = {"groups": Int(2, choices=(2,)), "axis": Int(1, choices=(1, -1))}


def _maxout_axis(rank: int, axis: int) -> int:
    if axis not in (1, -1, 3):
        raise _bad("maxout", f"expected axis 1 or -1 (3), got {axis}")
    return norm_axis(axis, rank, "maxout: axis")


def _maxout_infer(X, *, groups, axis):
    check_dtype(X, FLOATS, "maxout: input X")
    _rank("maxout", X, 4)
    a = _maxout_axis(4, axis)
    c = X.shape[a]
    if groups < 1 or (c >= 0 and c % groups):
        raise _bad("maxout", f"expected the channel count ({c}) to divide by groups "
                             f"({groups})")
    shape = list(X.shape)
    shape[a] = c // groups if c >= 0 else -1
    return {"Out": X.with_(shape=tuple(shape))}


def _maxout_split(X, groups, axis):
    a = _maxout_axis(X.ndim, axis)
    c = X.shape[a]
    if groups < 1 or c % groups:
        raise _bad("maxout", f"expected the channel count ({c}) of X {list(X.shape)} to "
                             f"divide by groups ({groups})")
    shape = X.shape[:a] + (c // groups, groups) + X.shape[a + 1:]
    return X.reshape(shape), a + 1


def _maxout_ref(X, *, groups, axis):
    if X.ndim != 4:
        raise _bad("maxout", f"expected a 4-D X, got {list(X.shape)}")
    xs, g = _maxout_split(X, groups, axis)
    return {"Out": xs.max(axis=g)}


def _maxout_grad_ref(X, Out, *, groups, axis, **kw):
    xs, g = _maxout_split(X, groups, axis)
    out = np.expand_dims(Out, g)
    hit = xs == out
    first = hit & (np.cumsum(hit, axis=g) == 1)        # the first maximum of each run
    dx = np.where(first, np.expand_dims(kw["Out@GRAD"], g), 0).astype(X.dtype)
    return {"X@GRAD": dx.reshape(X.shape)}


register_op(
    "maxout", inputs=["X"], outputs=["Out"], attrs=_MAXOUT_ATTRS, traits=[OPAQUE],
    infer_shape=_maxout_infer, reference=_maxout_ref, emit=None,
    grad=default_grad("maxout_grad", fwd_inputs=("X",), fwd_outputs=("Out",)),
    doc="The maximum over each run of `groups` consecutive channels along `axis`.")
register_op(
    "maxout_grad", inputs=["X", "Out", "Out@GRAD"], outputs=["X@GRAD"],
    attrs=_MAXOUT_ATTRS, traits=[OPAQUE], infer_shape=_same_shape_grad("maxout_grad"),
    reference=_maxout_grad_ref, emit=None, grad=None,
    doc="Out@GRAD to the first maximum of each run.")


# ---- lrn ---------------------------------------------------------------------------------------
_LRN_ATTRS = {"n": Int(5, choices=(3, 5)), "k": Float(2.0, low=1.0, high=2.0),
              "alpha": Float(1e-4, low=1e-4, high=0.5), "beta": Float(0.75, low=0.5, high=1.0),
              "data_format": Str("AnyLayout", choices=("AnyLayout", "NCHW", "NHWC"))}


def _lrn_axis(data_format: str) -> int:
    if data_format in ("AnyLayout", "NCHW"):
        return 1
    if data_format == "NHWC":
        return 3
    raise _bad("lrn", f"expected data_format 'AnyLayout', 'NCHW' or 'NHWC', got "
                      f"{data_format!r}")


def _lrn_infer(X, *, n, k, alpha, beta, data_format):
    check_dtype(X, FLOATS, "lrn: input X")
    _rank("lrn", X, 4)
    _lrn_axis(data_format)
    if n < 1:
        raise _bad("lrn", f"expected n >= 1, got {n}")
    return {"Out": X, "MidOut": X}


def _window_sum(v, a: int, before: int, after: int):
    """``sum(v[c - before : c + after + 1])`` along axis ``a`` for every ``c`` (zeros past the
    ends)."""
    pad = [(0, 0)] * v.ndim
    pad[a] = (before, after)
    p = np.pad(v, pad)
    c = v.shape[a]
    return sum(np.take(p, np.arange(i, i + c), axis=a) for i in range(before + after + 1))


def _f32(v) -> float:
    return float(np.float32(v))


def _lrn_ref(X, *, n, k, alpha, beta, data_format):
    if X.ndim != 4:
        raise _bad("lrn", f"expected a 4-D X, got {list(X.shape)}")
    a = _lrn_axis(data_format)
    pre = (n - 1) // 2
    x = X.astype(F64)
    mid = _f32(k) + _f32(alpha) * _window_sum(x * x, a, pre, n - 1 - pre)
    return {"Out": (x * mid ** -_f32(beta)).astype(X.dtype), "MidOut": mid.astype(X.dtype)}


def _lrn_grad_ref(X, Out, MidOut, *, n, k, alpha, beta, data_format, **kw):
    a = _lrn_axis(data_format)
    pre = (n - 1) // 2
    x, out, mid = X.astype(F64), Out.astype(F64), MidOut.astype(F64)
    g = kw["Out@GRAD"].astype(F64)
    # channel c is in the window of channels c - (n - 1 - pre) .. c + pre
    acc = _window_sum(g * out / mid, a, n - 1 - pre, pre)
    dx = g * mid ** -_f32(beta) - 2 * _f32(alpha) * _f32(beta) * x * acc
    return {"X@GRAD": dx.astype(X.dtype)}


register_op(
    "lrn", inputs=["X"], outputs=["Out", "MidOut~"], attrs=_LRN_ATTRS, traits=[OPAQUE],
    infer_shape=_lrn_infer, reference=_lrn_ref, emit=None,
    grad=default_grad("lrn_grad", fwd_inputs=("X",), fwd_outputs=("Out", "MidOut")),
    doc="Local response normalisation across channels: X * (k + alpha * window sum of "
        "X^2)^-beta.")
register_op(
    "lrn_grad", inputs=["X", "Out", "MidOut", "Out@GRAD"], outputs=["X@GRAD"],
    attrs=_LRN_ATTRS, traits=[OPAQUE], infer_shape=_same_shape_grad("lrn_grad"),
    reference=_lrn_grad_ref, emit=None, grad=None, doc="The gradient of lrn.")


# ---- rearrangements: one index map each --------------------------------------------------------
def _register_index_op(op, *, inputs, attrs, infer, arrange, doc, fill=None, extra=()):
    """Define ``op`` (``Out`` from ``X``) and ``op_grad`` by ``arrange(X, fill, **attrs)``, a
    function that builds the output from the elements of ``X`` (and ``fill`` where the output
    reads no element, ``fill(attrs)`` or 0). The gradient applies ``arrange`` to the element
    indices of ``X``, -1 where nothing is read, and adds each output gradient into its
    element. ``extra``: further input slots ``arrange`` reads by keyword."""
    def ref(X, *, ctx=None, **kw):
        a = {k: v for k, v in kw.items() if k in attrs}
        ins = {s: kw.get(s) for s in extra}
        value = fill(a) if fill is not None else 0
        return {"Out": arrange(X, value, **ins, **a)}

    def grad_ref(X, **kw):
        a = {k: v for k, v in kw.items() if k in attrs}
        ins = {s: kw.get(s) for s in extra}
        idx = arrange(np.arange(X.size, dtype=np.int64).reshape(X.shape), -1, **ins, **a)
        g = kw["Out@GRAD"]
        if g.shape != idx.shape:
            raise _bad(f"{op}_grad", f"input Out@GRAD of shape {list(g.shape)}: expected "
                                     f"{list(idx.shape)}")
        dx = np.zeros(X.size, F64)
        read = idx >= 0
        np.add.at(dx, idx[read], g[read].astype(F64))
        return {"X@GRAD": dx.reshape(X.shape).astype(X.dtype)}

    register_op(op, inputs=inputs, outputs=["Out"], attrs=attrs, traits=[OPAQUE],
                infer_shape=infer, reference=ref, emit=None,
                grad=default_grad(f"{op}_grad", fwd_inputs=("X",) + tuple(extra)),
                doc=doc)
    register_op(f"{op}_grad", inputs=["X"] + [f"{s}?" for s in extra] + ["Out@GRAD"],
                outputs=["X@GRAD"], attrs=attrs, traits=[OPAQUE],
                infer_shape=_same_shape_grad(f"{op}_grad"), reference=grad_ref, emit=None,
                grad=None, doc=f"The gradient of {op}: Out@GRAD added into the elements of X "
                               f"each output element read.")


def _known4(op, X, what):
    _rank(op, X, 4)
    return X.shape


def _div(op, d, by, what):
    if d >= 0 and d % by:
        raise _bad(op, f"expected {what} ({d}) to divide by {by}")
    return d // by if d >= 0 else -1


def _mul(d, by):
    return d * by if d >= 0 else -1


# pixel_shuffle: [N, C r^2, H, W] -> [N, C, H r, W r]
def _ps_infer(X, *, upscale_factor, data_format):
    n, c, h, w = _known4("pixel_shuffle", X, "X")
    r = upscale_factor
    if r < 1:
        raise _bad("pixel_shuffle", f"expected upscale_factor >= 1, got {r}")
    if data_format == "NHWC":
        n, h, w, c = X.shape
        return {"Out": X.with_(shape=(n, _mul(h, r), _mul(w, r),
                                      _div("pixel_shuffle", c, r * r, "the channels")))}
    return {"Out": X.with_(shape=(n, _div("pixel_shuffle", c, r * r, "the channels"),
                                  _mul(h, r), _mul(w, r)))}


def _ps_arrange(X, fill, *, upscale_factor, data_format):
    r = upscale_factor
    if X.ndim != 4:
        raise _bad("pixel_shuffle", f"expected a 4-D X, got {list(X.shape)}")
    x = X.transpose(0, 3, 1, 2) if data_format == "NHWC" else X
    n, c, h, w = x.shape
    if c % (r * r):
        raise _bad("pixel_shuffle", f"expected the channels ({c}) to divide by {r * r}")
    y = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    y = y.reshape(n, c // (r * r), h * r, w * r)
    return np.ascontiguousarray(y.transpose(0, 2, 3, 1) if data_format == "NHWC" else y)


_register_index_op(
    "pixel_shuffle", inputs=["X"],
    attrs={"upscale_factor": Int(1, choices=(1, 2)),
           "data_format": Str("NCHW", choices=("NCHW", "NHWC"))},
    infer=_ps_infer, arrange=_ps_arrange,
    doc="[N, C r^2, H, W] rearranged to [N, C, H r, W r] (r = upscale_factor).")


# shuffle_channel: the C = g * m channels read as an [m, g] grid
def _sc_infer(X, *, group):
    _known4("shuffle_channel", X, "X")
    if group < 1:
        raise _bad("shuffle_channel", f"expected group >= 1, got {group}")
    _div("shuffle_channel", X.shape[1], group, "the channels")
    return {"Out": X}


def _sc_arrange(X, fill, *, group):
    if X.ndim != 4 or X.shape[1] % group:
        raise _bad("shuffle_channel", f"expected a 4-D X whose channels divide by group "
                                      f"({group}), got {list(X.shape)}")
    n, c, h, w = X.shape
    return np.ascontiguousarray(
        X.reshape(n, group, c // group, h, w).transpose(0, 2, 1, 3, 4).reshape(X.shape))


_register_index_op(
    "shuffle_channel", inputs=["X"], attrs={"group": Int(1, choices=(1, 2))},
    infer=_sc_infer, arrange=_sc_arrange,
    doc="The channels regrouped: group groups of C / group channels read column by column.")


# space_to_depth: Fluid's (darknet's reorg) order, [N, C, H, W] -> [N, C b^2, H / b, W / b]
def _s2d_infer(X, *, blocksize):
    n, c, h, w = _known4("space_to_depth", X, "X")
    b = blocksize
    if b < 1:
        raise _bad("space_to_depth", f"expected blocksize >= 1, got {b}")
    _div("space_to_depth", c, b * b, "the channels")
    return {"Out": X.with_(shape=(n, _mul(c, b * b), _div("space_to_depth", h, b, "the height"),
                                  _div("space_to_depth", w, b, "the width")))}


def _s2d_arrange(X, fill, *, blocksize):
    b = blocksize
    if X.ndim != 4:
        raise _bad("space_to_depth", f"expected a 4-D X, got {list(X.shape)}")
    n, c, h, w = X.shape
    if c % (b * b) or h % b or w % b:
        raise _bad("space_to_depth", f"expected the channels of X {list(X.shape)} to divide "
                                     f"by {b * b} and its height and width by {b}")
    y = X.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    return np.ascontiguousarray(y).reshape(n, c * b * b, h // b, w // b)


_register_index_op(
    "space_to_depth", inputs=["X"], attrs={"blocksize": Int(2, choices=(1, 2))},
    infer=_s2d_infer, arrange=_s2d_arrange,
    doc="Fluid's space_to_depth (darknet's reorg): [N, C, H, W] -> [N, C b^2, H/b, W/b].")


# temporal_shift: [N T, C, H, W]; the first C * ratio channels from the previous segment, the
# next as many from the following one (zeros past either end)
def _ts_infer(X, *, seg_num, shift_ratio, data_format):
    _known4("temporal_shift", X, "X")
    if data_format not in ("NCHW", "NHWC"):
        raise _bad("temporal_shift", f"expected data_format 'NCHW' or 'NHWC', got "
                                     f"{data_format!r}")
    if seg_num < 1 or not 0 < shift_ratio < 0.5:
        raise _bad("temporal_shift", f"expected seg_num >= 1 and 0 < shift_ratio < 0.5, got "
                                     f"{seg_num} and {shift_ratio}")
    _div("temporal_shift", X.shape[0], seg_num, "the batch")
    return {"Out": X}


def _ts_arrange(X, fill, *, seg_num, shift_ratio, data_format):
    if X.ndim != 4 or X.shape[0] % seg_num:
        raise _bad("temporal_shift", f"expected a 4-D X whose batch divides by seg_num "
                                     f"({seg_num}), got {list(X.shape)}")
    if data_format == "NHWC":
        out = _ts_arrange(np.ascontiguousarray(X.transpose(0, 3, 1, 2)), fill, seg_num=seg_num,
                          shift_ratio=shift_ratio, data_format="NCHW")
        return np.ascontiguousarray(out.transpose(0, 2, 3, 1))
    nt, c, h, w = X.shape
    t = seg_num
    ratio = _f32(shift_ratio)
    c1, c2 = int(c * ratio), int(c * 2 * ratio)
    x = X.reshape(nt // t, t, c, h, w)
    out = np.full_like(x, fill)
    out[:, 1:, :c1] = x[:, :-1, :c1]
    out[:, :-1, c1:c2] = x[:, 1:, c1:c2]
    out[:, :, c2:] = x[:, :, c2:]
    return out.reshape(X.shape)


_register_index_op(
    "temporal_shift", inputs=["X"],
    attrs={"seg_num": Int(1, choices=(1, 2)), "shift_ratio": Float(0.25, low=0.25, high=0.25),
           "data_format": Str("NCHW", choices=("NCHW", "NHWC"))},
    infer=_ts_infer, arrange=_ts_arrange,
    doc="TSM's temporal shift of [N T, C, H, W] by one segment for two channel slices.")


# pad2d: [top, bottom, left, right] of H and W
_PAD2D_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge"}


def _pad2d_infer(X, Paddings=None, *, paddings, mode, pad_value, data_format):
    _rank("pad2d", X, 4)
    if mode not in _PAD2D_MODES:
        raise _bad("pad2d", f"expected mode 'constant', 'reflect' or 'edge', got {mode!r}")
    if data_format not in ("NCHW", "NHWC"):
        raise _bad("pad2d", f"expected data_format 'NCHW' or 'NHWC', got {data_format!r}")
    shape = list(X.shape)
    ha, wa = (2, 3) if data_format == "NCHW" else (1, 2)
    if Paddings is not None:
        shape[ha] = shape[wa] = -1
    else:
        if len(paddings) != 4 or min(paddings) < 0:
            raise _bad("pad2d", f"expected paddings [top, bottom, left, right] >= 0, got "
                                f"{list(paddings)}")
        shape[ha] = shape[ha] + paddings[0] + paddings[1] if shape[ha] >= 0 else -1
        shape[wa] = shape[wa] + paddings[2] + paddings[3] if shape[wa] >= 0 else -1
    return {"Out": X.with_(shape=tuple(shape))}


def _pad2d_arrange(X, fill, *, Paddings=None, paddings, mode, pad_value, data_format):
    if X.ndim != 4:
        raise _bad("pad2d", f"expected a 4-D X, got {list(X.shape)}")
    p = [int(v) for v in (np.asarray(Paddings).reshape(-1) if Paddings is not None
                          else paddings)]
    if len(p) != 4 or min(p) < 0:
        raise _bad("pad2d", f"expected paddings [top, bottom, left, right] >= 0, got {p}")
    ha, wa = (2, 3) if data_format == "NCHW" else (1, 2)
    width = [(0, 0)] * 4
    width[ha], width[wa] = (p[0], p[1]), (p[2], p[3])
    if mode == "reflect" and (p[0] >= X.shape[ha] or p[1] >= X.shape[ha]
                              or p[2] >= X.shape[wa] or p[3] >= X.shape[wa]):
        raise _bad("pad2d", f"reflect padding {p} needs each padding smaller than the padded "
                            f"size, got X of shape {list(X.shape)}")
    if mode == "constant":
        return np.pad(X, width, constant_values=np.asarray(fill).astype(X.dtype))
    return np.pad(X, width, mode=_PAD2D_MODES[mode])


_register_index_op(
    "pad2d", inputs=["X", "Paddings?"],
    attrs={"paddings": Ints([0, 0, 0, 0], choices=([0, 0, 0, 0], [1, 0, 0, 1])),
           "mode": Str("constant", choices=("constant", "reflect", "edge")),
           "pad_value": Float(0.0, low=0.0, high=1.0),
           "data_format": Str("NCHW", choices=("NCHW", "NHWC"))},
    infer=_pad2d_infer, arrange=_pad2d_arrange, fill=lambda a: _f32(a["pad_value"]),
    extra=("Paddings",),
    doc="A 4-D tensor padded along H and W (constant, reflect or edge).")


# flip: reversed along dims (Fluid 1.8's attribute) or axis (PaddlePaddle 2.x's)
def _flip_infer(X, *, dims, axis):
    dims = list(axis) or list(dims)
    if not dims:
        raise _bad("flip", "expected the axes to reverse in dims or axis, got neither")
    for d in dims:
        norm_axis(d, X.ndim, "flip: dims")
    if len({d % max(X.ndim, 1) for d in dims}) != len(dims):
        raise _bad("flip", f"expected distinct dims, got {list(dims)}")
    return {"Out": X}


def _flip_arrange(X, fill, *, dims, axis):
    dims = list(axis) or list(dims)
    return np.ascontiguousarray(np.flip(X, [norm_axis(d, X.ndim, "flip: dims") for d in dims]))


_register_index_op(
    "flip", inputs=["X"], attrs={"dims": Ints([0], choices=([0], [0, 1]), axis_of="X"),
                                 "axis": Ints([], choices=([], [1]), axis_of="X")},
    infer=_flip_infer, arrange=_flip_arrange,
    doc="X reversed along each of axis (PaddlePaddle 2.x) or, when axis is empty, dims.")


# tril_triu: the lower (or upper) triangle of the last two axes, from diagonal on
def _tt_infer(X, *, diagonal, lower):
    if X.ndim < 2:
        raise _bad("tril_triu", f"expected X of rank >= 2, got {list(X.shape)}")
    return {"Out": X}


def _tt_arrange(X, fill, *, diagonal, lower):
    if X.ndim < 2:
        raise _bad("tril_triu", f"expected X of rank >= 2, got {list(X.shape)}")
    keep = (np.tril if lower else np.triu)(np.ones(X.shape[-2:], bool), diagonal)
    return np.where(keep, X, np.asarray(fill).astype(X.dtype))


_register_index_op(
    "tril_triu", inputs=["X"],
    attrs={"diagonal": Int(0, low=-1, high=1), "lower": Bool(True)},
    infer=_tt_infer, arrange=_tt_arrange,
    doc="The lower (lower=True) or upper triangle of the last two axes; zeros elsewhere.")


# expand_as: X tiled to target_tensor's shape
def _ea_infer(X, target_tensor, **_):
    if X.ndim != target_tensor.ndim:
        raise _bad("expand_as", f"expected X {list(X.shape)} and target_tensor "
                                f"{list(target_tensor.shape)} of one rank")
    for a, b in zip(X.shape, target_tensor.shape):
        if a > 0 and b >= 0 and b % a:
            raise _bad("expand_as", f"expected each size of target_tensor "
                                    f"{list(target_tensor.shape)} to be a multiple of X's "
                                    f"{list(X.shape)}")
    return {"Out": X.with_(shape=target_tensor.shape)}


def _ea_arrange(X, fill, *, target_tensor):
    t = np.asarray(target_tensor).shape
    if X.ndim != len(t) or any(a == 0 or b % a for a, b in zip(X.shape, t)):
        raise _bad("expand_as", f"expected each size of target_tensor {list(t)} to be a "
                                f"multiple of X's {list(X.shape)}")
    return np.tile(X, [b // a for a, b in zip(X.shape, t)])


_register_index_op(
    "expand_as", inputs=["X", "target_tensor"], attrs={}, infer=_ea_infer,
    arrange=_ea_arrange, extra=("target_tensor",),
    doc="X tiled along each axis to target_tensor's shape.")


# ---- reduce_all / reduce_any -------------------------------------------------------------------
_BOOL_REDUCE_ATTRS = {"dim": Ints([0], choices=([0], [1], [])), "keep_dim": Bool(False),
                      "reduce_all": Bool(False)}


def _bool_axes(op, shape, dim, reduce_all):
    rank = len(shape)
    axes = sorted({norm_axis(int(d), rank, f"{op}: dim") for d in dim})
    return tuple(range(rank)) if reduce_all or not axes else tuple(axes)


def _make_bool_reduce(op, fn):
    def infer(X, *, dim, keep_dim, reduce_all):
        check_dtype(X, (BOOL,), f"{op}: input X")
        axes = _bool_axes(op, X.shape, dim, reduce_all)
        shape = tuple(1 if i in axes else d for i, d in enumerate(X.shape)) if keep_dim else \
            tuple(d for i, d in enumerate(X.shape) if i not in axes)
        return {"Out": X.with_(shape=shape)}

    def ref(X, *, dim, keep_dim, reduce_all):
        axes = _bool_axes(op, X.shape, dim, reduce_all)
        return {"Out": np.asarray(fn(X.astype(bool), axis=axes, keepdims=keep_dim))}

    register_op(op, inputs=["X"], outputs=["Out"], attrs=_BOOL_REDUCE_ATTRS, traits=[OPAQUE],
                infer_shape=infer, reference=ref, emit=None, grad=None,
                doc=f"Logical {'AND' if fn is np.all else 'OR'} of a bool tensor over dim.")


_make_bool_reduce("reduce_all", np.all)
_make_bool_reduce("reduce_any", np.any)


# ---- size, clip_by_norm, one_hot ---------------------------------------------------------------
register_op(
    "size", inputs=["Input"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=lambda Input: {"Out": VarMeta((), INT64)},
    reference=lambda Input: {"Out": np.array(np.asarray(Input).size, np.int64)},
    emit=None, grad=None,
    doc="The element count of Input, int64 (0-d; [1] where a Fluid 1.x builder declares it).")


def _cbn_infer(X, *, max_norm):
    check_dtype(X, FLOATS, "clip_by_norm: input X")
    if not max_norm > 0:
        raise _bad("clip_by_norm", f"expected max_norm > 0, got {max_norm}")
    return {"Out": X}


def _cbn_ref(X, *, max_norm):
    m = _f32(max_norm)
    norm = np.sqrt(np.sum(np.square(X.astype(F64))))
    return {"Out": (X.astype(F64) * (m / norm if norm > m else 1.0)).astype(X.dtype)}


register_op(
    "clip_by_norm", inputs=["X"], outputs=["Out"],
    attrs={"max_norm": Float(1.0, low=0.5, high=2.0)}, traits=[OPAQUE],
    infer_shape=_cbn_infer, reference=_cbn_ref, emit=None, grad=None,
    doc="X * max_norm / ||X||_2 when ||X||_2 > max_norm, else X.")


def _oh_infer(X, depth_tensor=None, *, depth, dtype, allow_out_of_range):
    check_dtype(X, (np.dtype(np.int32), INT64), "one_hot: input X")
    if X.ndim < 1 or X.shape[-1] not in (1, -1):
        raise _bad("one_hot", f"expected X of shape [..., 1], got {list(X.shape)}")
    d = -1 if depth_tensor is not None else depth
    if depth_tensor is None and depth < 1:
        raise _bad("one_hot", f"expected depth >= 1, got {depth}")
    return {"Out": VarMeta(X.shape[:-1] + (d,), dtypes.to_numpy(dtype), X.lod_level)}


def _oh_ref(X, depth_tensor=None, *, depth, dtype, allow_out_of_range):
    d = int(np.asarray(depth_tensor).reshape(-1)[0]) if depth_tensor is not None else depth
    ids = X.reshape(X.shape[:-1]).astype(np.int64)
    bad = (ids < 0) | (ids >= d)
    if bad.any() and not allow_out_of_range:
        raise IndexError(f"one_hot: ids {ids[bad][:5].tolist()} out of range [0, {d}) (set "
                         f"allow_out_of_range to give them all-zero rows)")
    out = (ids[..., None] == np.arange(d)) & ~bad[..., None]
    return {"Out": out.astype(dtypes.to_numpy(dtype))}


register_op(
    "one_hot", inputs=["X", "depth_tensor?"], outputs=["Out"],
    attrs={"depth": Int(4, choices=(3, 4)), "dtype": Int(5, choices=(5,)),
           "allow_out_of_range": Bool(False)},
    traits=[OPAQUE], infer_shape=_oh_infer, reference=_oh_ref, emit=None, grad=None,
    domain={"X": "positive"},
    doc="Fluid 1.x's one_hot: ids [..., 1] to rows [..., depth] of zeros and a one.")
