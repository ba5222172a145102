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

- ``roll`` (``shifts``; ``dims`` or 2.x's ``axis``), ``index_sample``, ``crop_tensor``,
  ``crop``, ``diag`` (index maps too), ``kron``, ``trace`` (``dim1``/``dim2`` or 2.x's
  ``axis1``/``axis2``), ``cross``, ``addmm``, ``bilinear_tensor_product``, ``affine_grid``,
  ``unstack`` (its gradient a ``stack``), ``multiplex``, ``meshgrid``, ``pad_constant_like``,
  ``fsp``, with their gradients; ``eye`` and ``shard_index`` without.
- ``uniform_random_batch_size_like``, ``gaussian_random_batch_size_like``, ``randint``,
  ``randperm``: random, from the run's stream (a fixed ``seed`` repeats every run).
- ``hash`` (XXH64 of each row's bytes), ``similarity_focus``, ``bipartite_match``,
  ``target_assign``: no gradient.

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
    Long,
    Longs,
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


# ---- roll, index_sample, crop_tensor, crop (index maps) ----------------------------------------
def _roll_axes(op, ndim, shifts, dims, axis):
    axes = list(axis) or list(dims)
    if axes and len(axes) != len(shifts):
        raise _bad(op, f"expected one shift per axis, got shifts {list(shifts)} and axes {axes}")
    if not axes and len(shifts) != 1:
        raise _bad(op, f"expected one shift for the flattened tensor, got {list(shifts)}")
    return [norm_axis(a, ndim, f"{op}: axis") for a in axes]


def _roll_infer(X, *, shifts, dims, axis):
    _roll_axes("roll", X.ndim, shifts, dims, axis)
    return {"Out": X}


def _roll_arrange(X, fill, *, shifts, dims, axis):
    axes = _roll_axes("roll", X.ndim, shifts, dims, axis)
    if not axes:
        return np.roll(X.reshape(-1), shifts[0]).reshape(X.shape)
    return np.roll(X, list(shifts), axes)


_register_index_op(
    "roll", inputs=["X"],
    attrs={"shifts": Ints([1], choices=([1], [-2])),
           "dims": Ints([], choices=([], [0]), axis_of="X"),
           "axis": Ints([], choices=([],), axis_of="X")},
    infer=_roll_infer, arrange=_roll_arrange,
    doc="X shifted circularly by shifts along axis (PaddlePaddle 2.x) or dims (Fluid 1.8); "
        "the flattened X when both are empty.")


def _is_infer(X, Index):
    check_dtype(Index, (np.dtype(np.int32), INT64), "index_sample: input Index")
    if X.ndim != 2 or Index.ndim != 2:
        raise _bad("index_sample", f"expected X [N, C] and Index [N, K], got {list(X.shape)} "
                                   f"and {list(Index.shape)}")
    return {"Out": X.with_(shape=(X.shape[0], Index.shape[1]))}


def _is_arrange(X, fill, *, Index):
    if X.ndim != 2 or Index.ndim != 2 or X.shape[0] != Index.shape[0]:
        raise _bad("index_sample", f"expected X [N, C] and Index [N, K], got {list(X.shape)} "
                                   f"and {list(Index.shape)}")
    if Index.size and (Index.min() < 0 or Index.max() >= X.shape[1]):
        raise IndexError(f"index_sample: Index holds {int(Index.min())}..{int(Index.max())}, "
                         f"expected 0..{X.shape[1] - 1}")
    return np.take_along_axis(X, Index.astype(np.int64), axis=1)


_register_index_op(
    "index_sample", inputs=["X", "Index"], attrs={}, infer=_is_infer, arrange=_is_arrange,
    extra=("Index",), doc="Out[i, j] = X[i, Index[i, j]].")


def _crop_box(op, xshape, shape, offsets):
    shape, offsets = [int(s) for s in shape], [int(o) for o in offsets] or [0] * len(xshape)
    if len(shape) != len(xshape) or len(offsets) != len(xshape):
        raise _bad(op, f"expected shape and offsets of {len(xshape)} values, got {shape} and "
                       f"{offsets}")
    out = []
    for d, (n, s, o) in enumerate(zip(xshape, shape, offsets)):
        s = n - o if s == -1 and n >= 0 else s
        if o < 0 or (n >= 0 and s >= 0 and o + s > n) or s < -1:
            raise _bad(op, f"dimension {d}: expected 0 <= offset and offset + size <= {n}, got "
                           f"offset {o}, size {s}")
        out.append(s)
    return out, offsets


def _values(v):
    return [int(a) for a in np.asarray(v).reshape(-1)]


def _ct_infer(X, Shape=None, Offsets=None, *, shape, offsets):
    if Shape is not None:
        return {"Out": X.with_(shape=(-1,) * X.ndim)}
    if Offsets is not None:
        return {"Out": X.with_(shape=tuple(s if s >= 0 else -1 for s in shape))}
    out, _ = _crop_box("crop_tensor", X.shape, shape, offsets)
    return {"Out": X.with_(shape=tuple(out))}


def _crop_slices(op, X, shape, offsets):
    out, offsets = _crop_box(op, X.shape, shape, offsets)
    return X[tuple(slice(o, o + s) for o, s in zip(offsets, out))]


def _ct_arrange(X, fill, *, Shape=None, Offsets=None, shape, offsets):
    return np.ascontiguousarray(_crop_slices(
        "crop_tensor", X, _values(Shape) if Shape is not None else shape,
        _values(Offsets) if Offsets is not None else offsets))


_register_index_op(
    "crop_tensor", inputs=["X", "Shape?", "Offsets?"],
    attrs={"shape": Ints([], choices=([],)), "offsets": Ints([], choices=([],))},
    infer=_ct_infer, arrange=_ct_arrange, extra=("Shape", "Offsets"),
    doc="The block of X of size shape (-1: to the end) at offsets (attributes or the Shape "
        "and Offsets inputs).")


def _crop_infer(X, Y=None, Offsets=None, *, shape, offsets):
    if Y is not None:
        if Y.ndim != X.ndim:
            raise _bad("crop", f"expected Y of X's rank {X.ndim}, got {list(Y.shape)}")
        return {"Out": X.with_(shape=Y.shape)}
    if len(shape) != X.ndim:
        raise _bad("crop", f"expected shape of {X.ndim} values, got {list(shape)}")
    return {"Out": X.with_(shape=tuple(shape))}


def _crop_arrange(X, fill, *, Y=None, Offsets=None, shape, offsets):
    return np.ascontiguousarray(_crop_slices(
        "crop", X, list(np.shape(Y)) if Y is not None else shape,
        _values(Offsets) if Offsets is not None else offsets))


_register_index_op(
    "crop", inputs=["X", "Y?", "Offsets?"],
    attrs={"shape": Ints([], choices=([],)), "offsets": Ints([], choices=([],))},
    infer=_crop_infer, arrange=_crop_arrange, extra=("Y", "Offsets"),
    doc="The block of X of Y's shape (or shape) at offsets (or the Offsets input).")


# diag (Fluid 1.8's): a 1-D Diagonal on the diagonal of a square matrix
def _diag_infer(Diagonal):
    if Diagonal.ndim != 1:
        raise _bad("diag", f"expected a 1-D Diagonal, got {list(Diagonal.shape)}")
    return {"Out": Diagonal.with_(shape=(Diagonal.shape[0],) * 2)}


def _diag_arrange(X, fill):
    if X.ndim != 1:
        raise _bad("diag", f"expected a 1-D Diagonal, got {list(X.shape)}")
    out = np.full((X.size, X.size), fill, X.dtype)
    out[np.arange(X.size), np.arange(X.size)] = X
    return out


register_op(
    "diag", inputs=["Diagonal"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=_diag_infer,
    reference=lambda Diagonal: {"Out": _diag_arrange(Diagonal, 0)}, emit=None,
    grad=default_grad("diag_grad", fwd_inputs=("Diagonal",), wrt=("Diagonal",)),
    doc="A square matrix with Diagonal on its diagonal, zeros elsewhere.")
register_op(
    "diag_grad", inputs=["Diagonal", "Out@GRAD"], outputs=["Diagonal@GRAD"], traits=[OPAQUE],
    infer_shape=lambda Diagonal, **_: {"Diagonal@GRAD": Diagonal},
    reference=lambda Diagonal, **kw: {"Diagonal@GRAD": np.ascontiguousarray(
        np.diagonal(kw["Out@GRAD"])).astype(Diagonal.dtype)},
    emit=None, grad=None, doc="The diagonal of Out@GRAD.")


# ---- kron, trace, cross, addmm, bilinear_tensor_product, affine_grid ---------------------------
def _kron_shapes(x, y):
    r = max(len(x), len(y))
    return (1,) * (r - len(x)) + tuple(x), (1,) * (r - len(y)) + tuple(y)


def _kron_infer(X, Y):
    if X.dtype != Y.dtype:
        raise _bad("kron", f"expected X and Y of one dtype, got {X.dtype} and {Y.dtype}")
    xs, ys = _kron_shapes(X.shape, Y.shape)
    return {"Out": X.with_(shape=tuple(a * b if a >= 0 and b >= 0 else -1
                                       for a, b in zip(xs, ys)))}


def _kron_grad_ref(X, Y, **kw):
    xs, ys = _kron_shapes(X.shape, Y.shape)
    g = kw["Out@GRAD"].astype(F64).reshape([s for a, b in zip(xs, ys) for s in (a, b)])
    x, y = X.astype(F64).reshape(xs), Y.astype(F64).reshape(ys)
    r = len(xs)
    xi = [2 * i for i in range(r)]
    yi = [2 * i + 1 for i in range(r)]
    gx = np.einsum(g, list(range(2 * r)), y, yi, xi)
    gy = np.einsum(g, list(range(2 * r)), x, xi, yi)
    return {"X@GRAD": gx.reshape(X.shape).astype(X.dtype),
            "Y@GRAD": gy.reshape(Y.shape).astype(Y.dtype)}


register_op(
    "kron", inputs=["X", "Y"], outputs=["Out"], traits=[OPAQUE], infer_shape=_kron_infer,
    reference=lambda X, Y: {"Out": np.kron(X, Y).astype(X.dtype)}, emit=None,
    grad=default_grad("kron_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="The Kronecker product of X and Y (the lower rank padded with leading 1s).")
register_op(
    "kron_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    traits=[OPAQUE], infer_shape=lambda X, Y, **_: {"X@GRAD": X, "Y@GRAD": Y},
    reference=_kron_grad_ref, emit=None, grad=None, doc="The gradients of kron.")


_TRACE_ATTRS = {"offset": Int(0, low=-1, high=1), "axis1": Int(0, choices=(0,)),
                "axis2": Int(1, choices=(1,)), "dim1": Int(0, choices=(0,)),
                "dim2": Int(1, choices=(1,))}


def _trace_axes(ndim, axis1, axis2, dim1, dim2):
    a1, a2 = (axis1, axis2) if (axis1, axis2) != (0, 1) else (dim1, dim2)
    a1, a2 = norm_axis(a1, ndim, "trace: axis1"), norm_axis(a2, ndim, "trace: axis2")
    if a1 == a2:
        raise _bad("trace", f"expected two different axes, got {a1} and {a2}")
    return a1, a2


def _trace_infer(Input, *, offset, axis1, axis2, dim1, dim2):
    if Input.ndim < 2:
        raise _bad("trace", f"expected Input of rank >= 2, got {list(Input.shape)}")
    a1, a2 = _trace_axes(Input.ndim, axis1, axis2, dim1, dim2)
    return {"Out": Input.with_(shape=tuple(d for i, d in enumerate(Input.shape)
                                           if i not in (a1, a2)))}


def _trace_ref(Input, *, offset, axis1, axis2, dim1, dim2):
    a1, a2 = _trace_axes(Input.ndim, axis1, axis2, dim1, dim2)
    return {"Out": np.asarray(np.trace(Input, offset, a1, a2)).astype(Input.dtype)}


def _trace_grad_ref(Input, *, offset, axis1, axis2, dim1, dim2, **kw):
    a1, a2 = _trace_axes(Input.ndim, axis1, axis2, dim1, dim2)
    g = np.zeros(Input.shape, Input.dtype)
    moved = np.moveaxis(g, (a1, a2), (-2, -1))          # a view: writes reach g
    n1, n2 = moved.shape[-2:]
    i = np.arange(max(0, -offset), min(n1, n2 - offset))
    moved[..., i, i + offset] = np.asarray(kw["Out@GRAD"])[..., None]
    return {"Input@GRAD": g}


register_op(
    "trace", inputs=["Input"], outputs=["Out"], attrs=_TRACE_ATTRS, traits=[OPAQUE],
    infer_shape=_trace_infer, reference=_trace_ref, emit=None,
    grad=default_grad("trace_grad", fwd_inputs=("Input",), wrt=("Input",)),
    doc="The sums of the offset-th diagonals of the (axis1, axis2) planes (Fluid 1.8 names "
        "the axes dim1, dim2).")
register_op(
    "trace_grad", inputs=["Input", "Out@GRAD"], outputs=["Input@GRAD"], attrs=_TRACE_ATTRS,
    traits=[OPAQUE], infer_shape=lambda Input, **_: {"Input@GRAD": Input},
    reference=_trace_grad_ref, emit=None, grad=None, doc="Out@GRAD on the traced diagonals.")


_CROSS_DEFAULT = 9          # Fluid's "no dim given": the first axis of size 3


def _cross_dim(op, shape, dim):
    if dim == _CROSS_DEFAULT:
        d = next((i for i, s in enumerate(shape) if s == 3), None)
        if d is None:
            raise _bad(op, f"expected an axis of size 3, got shape {list(shape)}")
        return d
    d = norm_axis(dim, len(shape), f"{op}: dim")
    if shape[d] not in (3, -1):
        raise _bad(op, f"expected axis {d} of size 3, got shape {list(shape)}")
    return d


def _cross_infer(X, Y, *, dim):
    if X.shape != Y.shape or X.dtype != Y.dtype:
        raise _bad("cross", f"expected X and Y of one shape and dtype, got {list(X.shape)} "
                            f"{X.dtype} and {list(Y.shape)} {Y.dtype}")
    _cross_dim("cross", X.shape, dim)
    return {"Out": X}


def _cross_ref(X, Y, *, dim):
    d = _cross_dim("cross", X.shape, dim)
    return {"Out": np.cross(X, Y, axis=d).astype(X.dtype)}


def _cross_grad_ref(X, Y, *, dim, **kw):
    d = _cross_dim("cross_grad", X.shape, dim)
    g = kw["Out@GRAD"]
    return {"X@GRAD": np.cross(Y, g, axis=d).astype(X.dtype),
            "Y@GRAD": np.cross(g, X, axis=d).astype(Y.dtype)}


register_op(
    "cross", inputs=["X", "Y"], outputs=["Out"], attrs={"dim": Int(_CROSS_DEFAULT,
                                                                 choices=(_CROSS_DEFAULT,))},
    traits=[OPAQUE], infer_shape=_cross_infer, reference=_cross_ref, emit=None,
    grad=default_grad("cross_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="The cross product of 3-vectors along dim (9: the first axis of size 3).")
register_op(
    "cross_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs={"dim": Int(_CROSS_DEFAULT, choices=(_CROSS_DEFAULT,))}, traits=[OPAQUE],
    infer_shape=lambda X, Y, **_: {"X@GRAD": X, "Y@GRAD": Y}, reference=_cross_grad_ref,
    emit=None, grad=None, doc="X@GRAD = Y x Out@GRAD, Y@GRAD = Out@GRAD x X.")


_ADDMM_ATTRS = {"Alpha": Float(1.0, low=0.5, high=2.0), "Beta": Float(1.0, low=0.5, high=2.0)}


def _addmm_infer(Input, X, Y, *, Alpha, Beta):
    if X.ndim != 2 or Y.ndim != 2 or Input.ndim not in (1, 2):
        raise _bad("addmm", f"expected X [M, K], Y [K, N] and Input of rank 1 or 2, got "
                            f"{list(X.shape)}, {list(Y.shape)} and {list(Input.shape)}")
    if X.shape[1] >= 0 and Y.shape[0] >= 0 and X.shape[1] != Y.shape[0]:
        raise _bad("addmm", f"expected X's columns ({X.shape[1]}) to equal Y's rows "
                            f"({Y.shape[0]})")
    return {"Out": X.with_(shape=(X.shape[0], Y.shape[1]))}


def _addmm_ref(Input, X, Y, *, Alpha, Beta):
    out = _f32(Beta) * Input.astype(F64) + _f32(Alpha) * (X.astype(F64) @ Y.astype(F64))
    if out.shape != (X.shape[0], Y.shape[1]):
        raise _bad("addmm", f"expected Input {list(Input.shape)} to broadcast to "
                            f"{[X.shape[0], Y.shape[1]]}")
    return {"Out": out.astype(X.dtype)}


def _addmm_grad_ref(Input, X, Y, *, Alpha, Beta, **kw):
    g = kw["Out@GRAD"].astype(F64)
    gi = _f32(Beta) * g
    gi = gi.sum(axis=tuple(range(gi.ndim - Input.ndim)))
    gi = gi.sum(axis=tuple(i for i, n in enumerate(Input.shape) if n == 1), keepdims=True)
    return {"Input@GRAD": gi.reshape(Input.shape).astype(Input.dtype),
            "X@GRAD": (_f32(Alpha) * g @ Y.astype(F64).T).astype(X.dtype),
            "Y@GRAD": (_f32(Alpha) * X.astype(F64).T @ g).astype(Y.dtype)}


register_op(
    "addmm", inputs=["Input", "X", "Y"], outputs=["Out"], attrs=_ADDMM_ATTRS, traits=[OPAQUE],
    infer_shape=_addmm_infer, reference=_addmm_ref, emit=None,
    grad=default_grad("addmm_grad", fwd_inputs=("Input", "X", "Y"), wrt=("Input", "X", "Y")),
    doc="Out = Beta * Input + Alpha * X @ Y (Input broadcast).")
register_op(
    "addmm_grad", inputs=["Input", "X", "Y", "Out@GRAD"],
    outputs=["Input@GRAD?", "X@GRAD?", "Y@GRAD?"], attrs=_ADDMM_ATTRS, traits=[OPAQUE],
    infer_shape=lambda Input, X, Y, **_: {"Input@GRAD": Input, "X@GRAD": X, "Y@GRAD": Y},
    reference=_addmm_grad_ref, emit=None, grad=None, doc="The gradients of addmm.")


def _btp_infer(X, Y, Weight, Bias=None):
    if X.ndim != 2 or Y.ndim != 2 or Weight.ndim != 3:
        raise _bad("bilinear_tensor_product", f"expected X [N, M], Y [N, K] and Weight "
                                              f"[S, M, K], got {list(X.shape)}, "
                                              f"{list(Y.shape)} and {list(Weight.shape)}")
    for a, b, what in ((X.shape[1], Weight.shape[1], "X's width and Weight's dim 1"),
                       (Y.shape[1], Weight.shape[2], "Y's width and Weight's dim 2")):
        if a >= 0 and b >= 0 and a != b:
            raise _bad("bilinear_tensor_product", f"expected {what} to agree, got {a} and {b}")
    if Bias is not None and Bias.shape not in ((1, Weight.shape[0]), (-1, Weight.shape[0])):
        raise _bad("bilinear_tensor_product", f"expected Bias [1, {Weight.shape[0]}], got "
                                              f"{list(Bias.shape)}")
    return {"Out": X.with_(shape=(X.shape[0], Weight.shape[0]))}


def _btp_ref(X, Y, Weight, Bias=None):
    out = np.einsum("nm,smk,nk->ns", X.astype(F64), Weight.astype(F64), Y.astype(F64))
    if Bias is not None:
        out = out + Bias.astype(F64)
    return {"Out": out.astype(X.dtype)}


def _btp_grad_ref(X, Y, Weight, Bias=None, **kw):
    g, x, y, w = (a.astype(F64) for a in (kw["Out@GRAD"], X, Y, Weight))
    out = {"X@GRAD": np.einsum("ns,smk,nk->nm", g, w, y).astype(X.dtype),
           "Y@GRAD": np.einsum("ns,smk,nm->nk", g, w, x).astype(Y.dtype),
           "Weight@GRAD": np.einsum("ns,nm,nk->smk", g, x, y).astype(Weight.dtype)}
    if Bias is not None:
        out["Bias@GRAD"] = g.sum(axis=0, keepdims=True).astype(Bias.dtype)
    return out


register_op(
    "bilinear_tensor_product", inputs=["X", "Y", "Weight", "Bias?"], outputs=["Out"],
    traits=[OPAQUE], infer_shape=_btp_infer, reference=_btp_ref, emit=None,
    grad=default_grad("bilinear_tensor_product_grad", fwd_inputs=("X", "Y", "Weight", "Bias"),
                      wrt=("X", "Y", "Weight", "Bias")),
    doc="Out[n, s] = X[n] Weight[s] Y[n]^T + Bias[s].")
register_op(
    "bilinear_tensor_product_grad", inputs=["X", "Y", "Weight", "Bias?", "Out@GRAD"],
    outputs=["X@GRAD?", "Y@GRAD?", "Weight@GRAD?", "Bias@GRAD?"], traits=[OPAQUE],
    infer_shape=lambda X, Y, Weight, Bias=None, **_: {
        "X@GRAD": X, "Y@GRAD": Y, "Weight@GRAD": Weight, "Bias@GRAD": Bias},
    reference=_btp_grad_ref, emit=None, grad=None,
    doc="The gradients of bilinear_tensor_product.")


def _ag_base(h, w, align_corners, dtype=F64):
    def axis(n):
        if n == 1:
            return np.array([-1.0]) if align_corners else np.array([0.0])
        if align_corners:
            return np.linspace(-1.0, 1.0, n)
        return (np.arange(n) * 2.0 + 1.0) / n - 1.0
    gx, gy = np.meshgrid(axis(w), axis(h))
    return np.stack([gx, gy, np.ones_like(gx)], axis=-1).astype(dtype)     # [H, W, 3]


def _ag_infer(Theta, OutputShape=None, *, output_shape, align_corners):
    if Theta.ndim != 3 or Theta.shape[1:] not in ((2, 3), (-1, 3), (2, -1), (-1, -1)):
        raise _bad("affine_grid", f"expected Theta [N, 2, 3], got {list(Theta.shape)}")
    if OutputShape is None and len(output_shape) != 4:
        raise _bad("affine_grid", f"expected output_shape [N, C, H, W], got "
                                  f"{list(output_shape)}")
    h, w = (-1, -1) if OutputShape is not None else output_shape[2:]
    return {"Output": Theta.with_(shape=(Theta.shape[0], h, w, 2))}


def _ag_size(OutputShape, output_shape):
    s = _values(OutputShape) if OutputShape is not None else list(output_shape)
    if len(s) != 4:
        raise _bad("affine_grid", f"expected an output shape [N, C, H, W], got {s}")
    return s[2], s[3]


def _ag_ref(Theta, OutputShape=None, *, output_shape, align_corners):
    h, w = _ag_size(OutputShape, output_shape)
    base = _ag_base(h, w, align_corners)
    out = np.einsum("hwj,nij->nhwi", base, Theta.astype(F64))
    return {"Output": out.astype(Theta.dtype)}


def _ag_grad_ref(Theta, OutputShape=None, *, output_shape, align_corners, **kw):
    h, w = _ag_size(OutputShape, output_shape)
    base = _ag_base(h, w, align_corners)
    g = np.einsum("nhwi,hwj->nij", kw["Output@GRAD"].astype(F64), base)
    return {"Theta@GRAD": g.astype(Theta.dtype)}


_AG_ATTRS = {"output_shape": Ints([], choices=([1, 1, 2, 3],)),
             "align_corners": Bool(True)}
register_op(
    "affine_grid", inputs=["Theta", "OutputShape?"], outputs=["Output"], attrs=_AG_ATTRS,
    traits=[OPAQUE], infer_shape=_ag_infer, reference=_ag_ref, emit=None,
    grad=default_grad("affine_grid_grad", fwd_inputs=("Theta", "OutputShape"),
                      grad_outputs=("Output",), wrt=("Theta",)),
    doc="The sampling grid [N, H, W, 2] of the affine maps Theta [N, 2, 3]: (x, y, 1) of each "
        "output pixel in [-1, 1] coordinates times Theta^T.")
register_op(
    "affine_grid_grad", inputs=["Theta", "OutputShape?", "Output@GRAD"],
    outputs=["Theta@GRAD"], attrs=_AG_ATTRS, traits=[OPAQUE],
    infer_shape=lambda Theta, **_: {"Theta@GRAD": Theta}, reference=_ag_grad_ref, emit=None,
    grad=None, doc="The gradient of affine_grid with respect to Theta.")


# ---- eye, shard_index: no gradient -------------------------------------------------------------
def _eye_infer(*, num_rows, num_columns, dtype):
    cols = num_rows if num_columns == -1 else num_columns
    if num_rows < 0 or cols < 0:
        raise _bad("eye", f"expected num_rows, num_columns >= 0, got {num_rows}, {num_columns}")
    return {"Out": VarMeta((num_rows, cols), dtypes.to_numpy(dtype))}


register_op(
    "eye", inputs=[], outputs=["Out"],
    attrs={"num_rows": Int(2, choices=(2, 3)), "num_columns": Int(-1, choices=(-1, 2)),
           "dtype": Int(5, choices=(5,))},
    traits=[OPAQUE], infer_shape=_eye_infer,
    reference=lambda *, num_rows, num_columns, dtype: {"Out": np.eye(
        num_rows, num_rows if num_columns == -1 else num_columns,
        dtype=dtypes.to_numpy(dtype))},
    emit=None, grad=None, doc="The identity matrix [num_rows, num_columns (-1: num_rows)].")


_SHARD_ATTRS = {"index_num": Int(8, choices=(8,)), "nshards": Int(3, choices=(3,)),
                "shard_id": Int(1, choices=(0, 1)), "ignore_value": Int(-1, choices=(-1,))}


def _shard_check(index_num, nshards, shard_id):
    if index_num < 1 or nshards < 1 or not 0 <= shard_id < nshards:
        raise _bad("shard_index", f"expected index_num >= 1, nshards >= 1 and 0 <= shard_id < "
                                  f"nshards, got {index_num}, {nshards}, {shard_id}")


def _shard_infer(X, *, index_num, nshards, shard_id, ignore_value):
    check_dtype(X, (np.dtype(np.int32), INT64), "shard_index: input X")
    _shard_check(index_num, nshards, shard_id)
    return {"Out": X}


def _shard_ref(X, *, index_num, nshards, shard_id, ignore_value):
    _shard_check(index_num, nshards, shard_id)
    if X.size and (X.min() < 0 or X.max() >= index_num):
        raise IndexError(f"shard_index: ids {int(X.min())}..{int(X.max())} outside "
                         f"[0, {index_num})")
    size = (index_num + nshards - 1) // nshards
    return {"Out": np.where(X // size == shard_id, X % size, ignore_value).astype(X.dtype)}


register_op(
    "shard_index", inputs=["X"], outputs=["Out"], attrs=_SHARD_ATTRS, traits=[OPAQUE],
    infer_shape=_shard_infer, reference=_shard_ref, emit=None, grad=None,
    domain={"X": "positive"},
    doc="Each id's row within shard shard_id of ceil(index_num / nshards) rows, else "
        "ignore_value.")


# ---- unstack, multiplex, meshgrid, pad_constant_like, fsp --------------------------------------
def _unstack_axis(op, ndim, axis):
    return norm_axis(axis, ndim, f"{op}: axis")


def _unstack_infer(X, *, axis, num):
    if X.ndim < 1:
        raise _bad("unstack", "expected X of rank >= 1, got a 0-d tensor")
    a = _unstack_axis("unstack", X.ndim, axis)
    if X.shape[a] >= 0 and X.shape[a] != num:
        raise _bad("unstack", f"expected num ({num}) to equal the size of axis {a} of X "
                              f"{list(X.shape)}")
    part = X.with_(shape=X.shape[:a] + X.shape[a + 1:])
    return {"Y": [part] * num}


def _unstack_ref(X, *, axis, num):
    a = _unstack_axis("unstack", X.ndim, axis)
    if X.shape[a] != num:
        raise _bad("unstack", f"expected num ({num}) to equal the size of axis {a} of X "
                              f"{list(X.shape)}")
    return {"Y": [np.ascontiguousarray(np.take(X, i, axis=a)) for i in range(num)]}


def _unstack_grad(op):
    """unstack's gradient stacks the Y@GRADs again (an output nobody used: zeros)."""
    from pdjit.framework.registry import GradOpSpec, grad_var_name

    return [GradOpSpec("stack", {"X": [grad_var_name(n) for n in op.output("Y")]},
                       {"Y": [grad_var_name(n) for n in op.input("X")]},
                       {"axis": op.attr("axis")})]


register_op(
    "unstack", inputs=["X"], outputs=["Y*"],
    attrs={"axis": Int(0, choices=(0, -1), axis_of="X"), "num": Int(2, choices=(2,))},
    traits=[OPAQUE], infer_shape=_unstack_infer, reference=_unstack_ref, emit=None,
    grad=_unstack_grad, doc="The num slices of X along axis, that axis removed.")


def _mux_infer(X, Ids):
    check_dtype(Ids, (np.dtype(np.int32), INT64), "multiplex: input Ids")
    first = X[0]
    for i, m in enumerate(X):
        if m.shape != first.shape or m.dtype != first.dtype:
            raise _bad("multiplex", f"expected the inputs X of one shape and dtype, got X[0] "
                                    f"{list(first.shape)} {first.dtype} and X[{i}] "
                                    f"{list(m.shape)} {m.dtype}")
    return {"Out": first}


def _mux_rows(X, Ids):
    ids = np.asarray(Ids).reshape(-1).astype(np.int64)
    if ids.size != X[0].shape[0]:
        raise _bad("multiplex", f"expected one id per row ({X[0].shape[0]}), got {ids.size}")
    if ids.size and (ids.min() < 0 or ids.max() >= len(X)):
        raise IndexError(f"multiplex: Ids hold {int(ids.min())}..{int(ids.max())}, expected "
                         f"0..{len(X) - 1}")
    return ids


def _mux_ref(X, Ids):
    ids = _mux_rows(X, Ids)
    return {"Out": np.stack(X, axis=0)[ids, np.arange(ids.size)]}


def _mux_grad_ref(X, Ids, **kw):
    ids = _mux_rows(X, Ids)
    g = kw["Out@GRAD"]
    return {"X@GRAD": [np.where((ids == i).reshape((-1,) + (1,) * (g.ndim - 1)), g,
                                0).astype(x.dtype) for i, x in enumerate(X)]}


register_op(
    "multiplex", inputs=["X*", "Ids"], outputs=["Out"], traits=[OPAQUE],
    infer_shape=_mux_infer, reference=_mux_ref, emit=None,
    grad=default_grad("multiplex_grad", fwd_inputs=("X", "Ids")),
    doc="Row i of X[Ids[i]] for each row i.")
register_op(
    "multiplex_grad", inputs=["X*", "Ids", "Out@GRAD"], outputs=["X@GRAD*?"], traits=[OPAQUE],
    infer_shape=lambda X, **_: {"X@GRAD": list(X)}, reference=_mux_grad_ref, emit=None,
    grad=None, doc="Out@GRAD's row i to X[Ids[i]]@GRAD, zeros elsewhere.")


def _mesh_infer(X):
    for i, m in enumerate(X):
        if m.ndim != 1:
            raise _bad("meshgrid", f"expected 1-D inputs, got X[{i}] {list(m.shape)}")
    shape = tuple(m.shape[0] for m in X)
    return {"Out": [m.with_(shape=shape) for m in X]}


def _mesh_ref(X):
    return {"Out": [np.ascontiguousarray(a) for a in np.meshgrid(*X, indexing="ij")]}


def _mesh_grad_ref(X, **kw):
    gs = kw["Out@GRAD"]
    n = len(X)
    return {"X@GRAD": [np.asarray(g).sum(axis=tuple(k for k in range(n) if k != i)).astype(
        x.dtype) for i, (x, g) in enumerate(zip(X, gs))]}


register_op(
    "meshgrid", inputs=["X*"], outputs=["Out*"], traits=[OPAQUE], infer_shape=_mesh_infer,
    reference=_mesh_ref, emit=None,
    grad=default_grad("meshgrid_grad", fwd_inputs=("X",)),
    doc="The grids of the 1-D inputs: Out[i] holds X[i] along axis i (indexing 'ij').")
register_op(
    "meshgrid_grad", inputs=["X*", "Out@GRAD*"], outputs=["X@GRAD*?"], traits=[OPAQUE],
    infer_shape=lambda X, **_: {"X@GRAD": list(X)}, reference=_mesh_grad_ref, emit=None,
    grad=None, doc="X[i]@GRAD: Out[i]@GRAD summed over every axis but i.")


def _pcl_infer(X, Y, *, pad_value):
    if X.ndim != Y.ndim or X.dtype != Y.dtype or any(
            a >= 0 and b >= 0 and a < b for a, b in zip(X.shape, Y.shape)):
        raise _bad("pad_constant_like", f"expected X and Y of one rank and dtype with X's "
                                        f"sizes >= Y's, got {list(X.shape)} {X.dtype} and "
                                        f"{list(Y.shape)} {Y.dtype}")
    return {"Out": X}


def _pcl_ref(X, Y, *, pad_value):
    if X.ndim != Y.ndim or any(a < b for a, b in zip(X.shape, Y.shape)):
        raise _bad("pad_constant_like", f"expected X's sizes {list(X.shape)} >= Y's "
                                        f"{list(Y.shape)}")
    return {"Out": np.pad(Y, [(0, a - b) for a, b in zip(X.shape, Y.shape)],
                          constant_values=np.asarray(_f32(pad_value)).astype(Y.dtype))}


register_op(
    "pad_constant_like", inputs=["X", "Y"], outputs=["Out"],
    attrs={"pad_value": Float(0.0, low=0.0, high=1.0)}, traits=[OPAQUE],
    infer_shape=_pcl_infer, reference=_pcl_ref, emit=None,
    grad=default_grad("pad_constant_like_grad", fwd_inputs=("Y",), wrt=("Y",)),
    doc="Y padded with pad_value at the end of each axis to X's shape.")
register_op(
    "pad_constant_like_grad", inputs=["Y", "Out@GRAD"], outputs=["Y@GRAD"],
    attrs={"pad_value": Float(0.0, low=0.0, high=1.0)}, traits=[OPAQUE],
    infer_shape=lambda Y, **_: {"Y@GRAD": Y},
    reference=lambda Y, **kw: {"Y@GRAD": np.ascontiguousarray(
        kw["Out@GRAD"][tuple(slice(0, n) for n in Y.shape)]).astype(Y.dtype)},
    emit=None, grad=None, doc="The leading block of Out@GRAD of Y's shape.")


def _fsp_infer(X, Y):
    if X.ndim != 4 or Y.ndim != 4 or X.dtype != Y.dtype:
        raise _bad("fsp", f"expected 4-D X and Y of one dtype, got {list(X.shape)} {X.dtype} "
                          f"and {list(Y.shape)} {Y.dtype}")
    for a, b in zip(X.shape[2:], Y.shape[2:]):
        if a >= 0 and b >= 0 and a != b:
            raise _bad("fsp", f"expected X and Y of one height and width, got "
                              f"{list(X.shape)} and {list(Y.shape)}")
    return {"Out": X.with_(shape=(X.shape[0], X.shape[1], Y.shape[1]))}


def _fsp_flat(X, Y):
    if X.shape[0] != Y.shape[0] or X.shape[2:] != Y.shape[2:]:
        raise _bad("fsp", f"expected X and Y of one batch, height and width, got "
                          f"{list(X.shape)} and {list(Y.shape)}")
    n, hw = X.shape[0], X.shape[2] * X.shape[3]
    return X.astype(F64).reshape(n, X.shape[1], hw), Y.astype(F64).reshape(n, Y.shape[1], hw), hw


def _fsp_ref(X, Y):
    x, y, hw = _fsp_flat(X, Y)
    return {"Out": (x @ y.transpose(0, 2, 1) / hw).astype(X.dtype)}


def _fsp_grad_ref(X, Y, **kw):
    x, y, hw = _fsp_flat(X, Y)
    g = kw["Out@GRAD"].astype(F64) / hw
    return {"X@GRAD": (g @ y).reshape(X.shape).astype(X.dtype),
            "Y@GRAD": (g.transpose(0, 2, 1) @ x).reshape(Y.shape).astype(Y.dtype)}


register_op(
    "fsp", inputs=["X", "Y"], outputs=["Out"], traits=[OPAQUE], infer_shape=_fsp_infer,
    reference=_fsp_ref, emit=None,
    grad=default_grad("fsp_grad", fwd_inputs=("X", "Y"), wrt=("X", "Y")),
    doc="The flow-of-solution-procedure matrix: Out[n] = X[n] Y[n]^T / (H W) over the "
        "flattened H W.")
register_op(
    "fsp_grad", inputs=["X", "Y", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    traits=[OPAQUE], infer_shape=lambda X, Y, **_: {"X@GRAD": X, "Y@GRAD": Y},
    reference=_fsp_grad_ref, emit=None, grad=None, doc="The gradients of fsp.")


# ---- diag_embed (an index map), dist -----------------------------------------------------------
def _de_axes(rank_out, dim1, dim2):
    d1 = norm_axis(dim1, rank_out, "diag_embed: dim1")
    d2 = norm_axis(dim2, rank_out, "diag_embed: dim2")
    if d1 == d2:
        raise _bad("diag_embed", f"expected two different dims, got {dim1} and {dim2}")
    return d1, d2


def _de_infer(X, *, offset, dim1, dim2):
    if X.ndim < 1:
        raise _bad("diag_embed", "expected Input of rank >= 1, got a 0-d tensor")
    d1, d2 = _de_axes(X.ndim + 1, dim1, dim2)
    n = X.shape[-1] + abs(offset) if X.shape[-1] >= 0 else -1
    rest = list(X.shape[:-1])
    shape = []
    for i in range(X.ndim + 1):
        shape.append(n if i in (d1, d2) else rest.pop(0))
    return {"Out": X.with_(shape=tuple(shape))}


def _de_arrange(X, fill, *, offset, dim1, dim2):
    d1, d2 = _de_axes(X.ndim + 1, dim1, dim2)
    k = X.shape[-1]
    n = k + abs(offset)
    out = np.full(X.shape[:-1] + (n, n), fill, X.dtype)
    i = np.arange(k)
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    out[..., rows, cols] = X
    # the last two axes (rows, columns) go to dim1 and dim2
    return np.ascontiguousarray(np.moveaxis(out, (-2, -1), (d1, d2)))


def _register_diag_embed():
    attrs = {"offset": Int(0, low=-1, high=1), "dim1": Int(-2, choices=(-2, 0)),
             "dim2": Int(-1, choices=(-1,))}

    def infer(Input, **kw):
        return _de_infer(Input, **kw)

    def ref(Input, *, offset, dim1, dim2):
        return {"Out": _de_arrange(Input, 0, offset=offset, dim1=dim1, dim2=dim2)}

    def grad_ref(Input, *, offset, dim1, dim2, **kw):
        idx = _de_arrange(np.arange(Input.size, dtype=np.int64).reshape(Input.shape), -1,
                          offset=offset, dim1=dim1, dim2=dim2)
        dx = np.zeros(Input.size, F64)
        read = idx >= 0
        np.add.at(dx, idx[read], kw["Out@GRAD"][read].astype(F64))
        return {"Input@GRAD": dx.reshape(Input.shape).astype(Input.dtype)}

    register_op("diag_embed", inputs=["Input"], outputs=["Out"], attrs=attrs, traits=[OPAQUE],
                infer_shape=infer, reference=ref, emit=None,
                grad=default_grad("diag_embed_grad", fwd_inputs=("Input",), wrt=("Input",)),
                doc="Input's last axis on the offset-th diagonal of the planes (dim1, dim2).")
    register_op("diag_embed_grad", inputs=["Input", "Out@GRAD"], outputs=["Input@GRAD"],
                attrs=attrs, traits=[OPAQUE],
                infer_shape=lambda Input, **_: {"Input@GRAD": Input}, reference=grad_ref,
                emit=None, grad=None, doc="The diagonal of Out@GRAD.")


_register_diag_embed()


def _dist_infer(X, Y, *, p):
    if X.dtype != Y.dtype:
        raise _bad("dist", f"expected X and Y of one dtype, got {X.dtype} and {Y.dtype}")
    return {"Out": X.with_(shape=())}


def _dist_ref(X, Y, *, p):
    d = np.abs(X.astype(F64) - Y.astype(F64))
    p = _f32(p)
    if p == 0:
        r = np.count_nonzero(d)
    elif np.isinf(p):
        r = d.max() if p > 0 else d.min()
    else:
        r = np.sum(d ** p) ** (1.0 / p)
    return {"Out": np.asarray(r, X.dtype)}


def _sum_to(g, shape):
    g = g.sum(axis=tuple(range(g.ndim - len(shape))))
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


def _dist_grad_ref(X, Y, Out, *, p, **kw):
    d = X.astype(F64) - Y.astype(F64)
    a, out = np.abs(d), float(np.asarray(Out).reshape(-1)[0])
    g = float(np.asarray(kw["Out@GRAD"]).reshape(-1)[0])
    p = _f32(p)
    if p == 0 or out == 0:
        gd = np.zeros_like(d)
    elif np.isinf(p):        # the extreme differences, compared as the forward rounded them
        gd = np.sign(d) * (a.astype(X.dtype) == np.asarray(Out).reshape(-1)[0])
    else:
        gd = np.sign(d) * a ** (p - 1) / out ** (p - 1)
    gd = gd * g
    return {"X@GRAD": _sum_to(gd, X.shape).reshape(X.shape).astype(X.dtype),
            "Y@GRAD": (-_sum_to(gd, Y.shape)).reshape(Y.shape).astype(Y.dtype)}


register_op(
    "dist", inputs=["X", "Y"], outputs=["Out"], attrs={"p": Float(2.0, low=1.0, high=3.0)},
    traits=[OPAQUE], infer_shape=_dist_infer, reference=_dist_ref, emit=None,
    grad=default_grad("dist_grad", fwd_inputs=("X", "Y"), fwd_outputs=("Out",),
                      wrt=("X", "Y")),
    doc="The p-norm of X - Y (broadcast; p 0: the count of non-zeros, inf / -inf: the "
        "largest / smallest absolute difference): 0-d ([1] from a Fluid 1.x layer).")
register_op(
    "dist_grad", inputs=["X", "Y", "Out", "Out@GRAD"], outputs=["X@GRAD?", "Y@GRAD?"],
    attrs={"p": Float(2.0, low=1.0, high=3.0)}, traits=[OPAQUE],
    infer_shape=lambda X, Y, **_: {"X@GRAD": X, "Y@GRAD": Y}, reference=_dist_grad_ref,
    emit=None, grad=None,
    doc="The gradients of dist (at p = inf every largest difference gets the gradient).")


# ---- uniform_random_batch_size_like, gaussian_random_batch_size_like ---------------------------
_FLOAT_CODE_CHOICES = tuple(dtypes.to_code(d) for d in ("float32", "float64"))


def _bsl_shape(op, in_shape, shape, input_dim_idx, output_dim_idx):
    shape = [int(d) for d in shape]
    if not shape:
        raise _bad(op, "expected a non-empty shape")
    i = norm_axis(input_dim_idx, len(in_shape), f"{op}: input_dim_idx")
    o = norm_axis(output_dim_idx, len(shape), f"{op}: output_dim_idx")
    shape[o] = in_shape[i]
    return tuple(shape)


def _register_random_bsl(op, dist_attrs, draw, doc):
    attrs = {"shape": Ints([-1, 2], choices=([-1, 2], [3, -1])),
             "input_dim_idx": Int(0, choices=(0,)), "output_dim_idx": Int(0, choices=(0,)),
             "seed": Int(0), "dtype": Int(5, choices=_FLOAT_CODE_CHOICES), **dist_attrs}

    def infer(Input, *, shape, input_dim_idx, output_dim_idx, dtype, **_):
        out = dtypes.to_numpy(dtype)
        if out.kind != "f":
            raise _bad(op, f"expected a float dtype, got {out}")
        return {"Out": VarMeta(_bsl_shape(op, Input.shape, shape, input_dim_idx,
                                          output_dim_idx), out)}

    def ref(Input, *, shape, input_dim_idx, output_dim_idx, dtype, ctx, **kw):
        shp = _bsl_shape(op, np.shape(Input), shape, input_dim_idx, output_dim_idx)
        if min(shp) < 0:
            raise _bad(op, f"expected a known output shape, got {list(shp)}")
        return {"Out": draw(ctx.rng_key(), shp, dtypes.to_numpy(dtype), kw)}

    from pdjit.framework.registry import RANDOM

    register_op(op, inputs=["Input"], outputs=["Out"], attrs=attrs, traits=[OPAQUE, RANDOM],
                infer_shape=infer, reference=ref, emit=None, grad=None, doc=doc)


def _uniform_draw(key, shape, dtype, kw):
    from pdjit.framework import random as prandom

    if kw["min"] > kw["max"]:
        raise _bad("uniform_random_batch_size_like", f"expected min <= max, got min="
                                                     f"{kw['min']}, max={kw['max']}")
    out = prandom.uniform(key, shape, kw["min"], kw["max"], dtype)
    flat = out.reshape(-1)
    for i in range(kw["diag_num"]):          # Paddle's option: diag_val on a strided diagonal
        if i * kw["diag_step"] + i < flat.size:
            flat[i * kw["diag_step"] + i] = kw["diag_val"]
    return out


def _gaussian_draw(key, shape, dtype, kw):
    from pdjit.framework import random as prandom

    return prandom.normal(key, shape, kw["mean"], kw["std"], dtype)


_register_random_bsl(
    "uniform_random_batch_size_like",
    {"min": Float(-1.0, low=-2.0, high=0.0), "max": Float(1.0, low=0.0, high=2.0),
     "diag_num": Int(0, choices=(0,)), "diag_step": Int(0, choices=(0,)),
     "diag_val": Float(1.0, low=1.0, high=1.0)},
    _uniform_draw,
    "Out ~ Uniform[min, max) of shape with dim output_dim_idx taken from Input's "
    "input_dim_idx (the batch).")
_register_random_bsl(
    "gaussian_random_batch_size_like",
    {"mean": Float(0.0, low=-1.0, high=1.0), "std": Float(1.0, low=0.5, high=2.0)},
    _gaussian_draw,
    "Out ~ Normal(mean, std) of shape with dim output_dim_idx taken from Input's "
    "input_dim_idx (the batch).")


# ---- randint, randperm -------------------------------------------------------------------------
_INT_CODES = tuple(dtypes.to_code(d) for d in ("int32", "int64"))


def _randint_infer(ShapeTensor=None, *, low, high, shape, dtype, seed):
    out = dtypes.to_numpy(dtype)
    if out.kind not in "iu" or not low < high:
        raise _bad("randint", f"expected an int dtype and low < high, got {out} and "
                              f"[{low}, {high})")
    shp = (-1,) * int(np.prod(ShapeTensor.shape)) if ShapeTensor is not None and \
        ShapeTensor.ndim == 1 and ShapeTensor.shape[0] >= 0 else tuple(shape)
    return {"Out": VarMeta(shp, out)}


def _randint_ref(ShapeTensor=None, *, low, high, shape, dtype, seed, ctx):
    from pdjit.framework import random as prandom

    shp = tuple(_values(ShapeTensor)) if ShapeTensor is not None else tuple(shape)
    if not low < high or min(shp, default=0) < 0:
        raise _bad("randint", f"expected low < high and a known shape, got [{low}, {high}) "
                              f"and {list(shp)}")
    u = prandom.uniform01(ctx.rng_key(), int(np.prod(shp, dtype=np.int64)))
    ids = np.minimum(low + np.floor(u * (high - low)), high - 1)
    return {"Out": ids.astype(dtypes.to_numpy(dtype)).reshape(shp)}


def _randperm_ref(*, n, dtype, seed, ctx):
    from pdjit.framework import random as prandom

    if n < 1:
        raise _bad("randperm", f"expected n >= 1, got {n}")
    keys = prandom.uniform01(ctx.rng_key(), n)
    return {"Out": np.argsort(keys, kind="stable").astype(dtypes.to_numpy(dtype))}


def _register_random_ints():
    from pdjit.framework.registry import RANDOM

    register_op(
        "randint", inputs=["ShapeTensor?"], outputs=["Out"],
        attrs={"low": Int(0, choices=(0, -2)), "high": Int(5, choices=(5,)),
               "shape": Longs([2, 3], choices=([2, 3],)), "dtype": Int(3, choices=_INT_CODES),
               "seed": Int(0)},
        traits=[OPAQUE, RANDOM], infer_shape=_randint_infer, reference=_randint_ref,
        emit=None, grad=None, doc="Integers drawn uniformly from [low, high).")
    register_op(
        "randperm", inputs=[], outputs=["Out"],
        attrs={"n": Int(5, choices=(1, 5)), "dtype": Int(3, choices=_INT_CODES),
               "seed": Int(0)},
        traits=[OPAQUE, RANDOM],
        infer_shape=lambda *, n, dtype, seed: {"Out": VarMeta((n,), dtypes.to_numpy(dtype))},
        reference=_randperm_ref, emit=None, grad=None,
        doc="A random permutation of 0 .. n - 1.")


_register_random_ints()


# ---- hash: XXH64 of each row's bytes -----------------------------------------------------------
_M64 = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                           0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _xxh_round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` (the xxHash algorithm's 64-bit variant, little-endian lanes)."""
    n, p = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed & _M64, (seed - _P1) & _M64]
        while n - p >= 32:
            for i in range(4):
                v[i] = _xxh_round(v[i], int.from_bytes(data[p + 8 * i:p + 8 * i + 8], "little"))
            p += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for lane in v:
            h = ((h ^ _xxh_round(0, lane)) * _P1 + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while n - p >= 8:
        h ^= _xxh_round(0, int.from_bytes(data[p:p + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        p += 8
    if n - p >= 4:
        h ^= (int.from_bytes(data[p:p + 4], "little") * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        p += 4
    while p < n:
        h ^= (data[p] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def _hash_infer(X, *, num_hash, mod_by):
    check_dtype(X, (np.dtype(np.int32), INT64), "hash: input X")
    if X.ndim != 2 or num_hash < 1 or mod_by < 1:
        raise _bad("hash", f"expected a 2-D X, num_hash >= 1 and mod_by >= 1, got "
                           f"{list(X.shape)}, {num_hash}, {mod_by}")
    return {"Out": X.with_(shape=(X.shape[0], num_hash, 1))}


def _hash_ref(X, *, num_hash, mod_by):
    if X.ndim != 2:
        raise _bad("hash", f"expected a 2-D X, got {list(X.shape)}")
    rows = np.ascontiguousarray(X, X.dtype.newbyteorder("<"))
    out = np.array([[xxh64(row.tobytes(), seed) % mod_by for seed in range(num_hash)]
                    for row in rows], np.int64).reshape(X.shape[0], num_hash, 1)
    return {"Out": out.astype(X.dtype)}


register_op(
    "hash", inputs=["X"], outputs=["Out"],
    attrs={"num_hash": Int(1, choices=(1, 3)), "mod_by": Long(100000, choices=(7, 100000))},
    traits=[OPAQUE], infer_shape=_hash_infer, reference=_hash_ref, emit=None, grad=None,
    doc="For each row of ids, XXH64 of its bytes with seeds 0 .. num_hash - 1, modulo mod_by: "
        "[N, num_hash, 1] of X's dtype.")


# ---- similarity_focus ----------------------------------------------------------------------------
def _sf_infer(X, *, axis, indexes):
    check_dtype(X, FLOATS, "similarity_focus: input X")
    if X.ndim != 4 or axis not in (1, 2, 3) or not indexes:
        raise _bad("similarity_focus", f"expected a 4-D X, axis 1, 2 or 3 and indexes, got "
                                       f"{list(X.shape)}, axis {axis}, indexes "
                                       f"{list(indexes)}")
    if X.shape[axis] >= 0 and not all(0 <= i < X.shape[axis] for i in indexes):
        raise _bad("similarity_focus", f"expected indexes in [0, {X.shape[axis]}), got "
                                       f"{list(indexes)}")
    return {"Out": X}


def _focus(t: np.ndarray) -> np.ndarray:
    """1 at the largest value of ``t``, then at the largest of what is left once its row and
    column are taken, ... (min(rows, columns) ones; of equal values the first in row-major
    order)."""
    rows, cols = t.shape
    mask = np.zeros(t.shape, bool)
    used_r, used_c = np.zeros(rows, bool), np.zeros(cols, bool)
    left = min(rows, cols)
    for flat in np.argsort(-t, axis=None, kind="stable"):
        r, c = divmod(int(flat), cols)
        if not used_r[r] and not used_c[c]:
            mask[r, c] = used_r[r] = used_c[c] = True
            left -= 1
            if not left:
                break
    return mask


def _sf_ref(X, *, axis, indexes):
    if X.ndim != 4 or axis not in (1, 2, 3):
        raise _bad("similarity_focus", f"expected a 4-D X and axis 1, 2 or 3, got "
                                       f"{list(X.shape)} and {axis}")
    if not all(0 <= i < X.shape[axis] for i in indexes):
        raise _bad("similarity_focus", f"expected indexes in [0, {X.shape[axis]}), got "
                                       f"{list(indexes)}")
    out = np.zeros(X.shape, X.dtype)
    for n in range(X.shape[0]):
        x = np.moveaxis(X[n], axis - 1, 0)
        mask = np.zeros(x.shape[1:], bool)
        for i in indexes:
            mask |= _focus(x[i])
        np.moveaxis(out[n], axis - 1, 0)[:] = mask
    return {"Out": out}


register_op(
    "similarity_focus", inputs=["X"], outputs=["Out"],
    attrs={"axis": Int(1, choices=(1, 2, 3)), "indexes": Ints([0], choices=([0], [0, 1]))},
    traits=[OPAQUE], infer_shape=_sf_infer, reference=_sf_ref, emit=None, grad=None,
    doc="Fluid's similarity focus mask: for each index along axis, greedily the largest "
        "values with distinct rows and columns of that 2-D slice; the masks OR-ed and "
        "broadcast along axis.")


# ---- bipartite_match ---------------------------------------------------------------------------
_BM_EPS = 1e-6


def _bm_infer(DistMat, *, match_type, dist_threshold):
    check_dtype(DistMat, FLOATS, "bipartite_match: input DistMat")
    if DistMat.ndim != 2 or match_type not in ("bipartite", "per_prediction"):
        raise _bad("bipartite_match", f"expected a 2-D DistMat and match_type 'bipartite' or "
                                      f"'per_prediction', got {list(DistMat.shape)} and "
                                      f"{match_type!r}")
    shape = (-1, DistMat.shape[1])
    return {"ColToRowMatchIndices": VarMeta(shape, np.int32),
            "ColToRowMatchDist": VarMeta(shape, DistMat.dtype)}


def _bm_one(d, match_type, threshold):
    """Column-to-row matches of one instance: greedily the largest distance among unmatched
    rows and columns (distances below 1e-6 never match); with 'per_prediction', each column
    left unmatched then takes its largest row at or above ``threshold``."""
    rows, cols = d.shape
    idx = np.full(cols, -1, np.int32)
    dist = np.zeros(cols, d.dtype)
    free_r, free_c = np.ones(rows, bool), np.ones(cols, bool)
    work = np.where(d < _BM_EPS, -np.inf, d.astype(F64))
    while free_r.any() and free_c.any():
        masked = np.where(free_r[:, None] & free_c[None, :], work, -np.inf)
        flat = int(np.argmax(masked))
        r, c = divmod(flat, cols)
        if masked[r, c] == -np.inf:
            break
        idx[c], dist[c] = r, d[r, c]
        free_r[r] = free_c[c] = False
    if match_type == "per_prediction":
        for c in np.flatnonzero(idx == -1):
            col = np.where(work[:, c] >= threshold, work[:, c], -np.inf)
            r = int(np.argmax(col))
            if col[r] > -np.inf:
                idx[c], dist[c] = r, d[r, c]
    return idx, dist


def _bm_ref(DistMat, *, match_type, dist_threshold, ctx=None):
    lod = ctx.input_lod("DistMat") if ctx is not None else []
    offsets = list(lod[-1]) if lod else [0, DistMat.shape[0]]
    if offsets[-1] != DistMat.shape[0]:
        raise _bad("bipartite_match", f"expected the LoD {offsets} to end at the "
                                      f"{DistMat.shape[0]} rows of DistMat")
    pairs = [_bm_one(DistMat[a:b], match_type, _f32(dist_threshold))
             for a, b in zip(offsets[:-1], offsets[1:])]
    return {"ColToRowMatchIndices": np.stack([p[0] for p in pairs]),
            "ColToRowMatchDist": np.stack([p[1] for p in pairs])}


register_op(
    "bipartite_match", inputs=["DistMat"],
    outputs=["ColToRowMatchIndices", "ColToRowMatchDist"],
    attrs={"match_type": Str("bipartite", choices=("bipartite", "per_prediction")),
           "dist_threshold": Float(0.5, low=0.3, high=0.7)},
    traits=[OPAQUE], infer_shape=_bm_infer, reference=_bm_ref, emit=None, grad=None,
    domain={"DistMat": "positive"},
    doc="For each instance (LoD sequence of rows) of a row-by-column distance matrix, the row "
        "each column is matched to (-1: none) and its distance: greedy bipartite matching, "
        "then (per_prediction) each unmatched column's best row at or above dist_threshold.")


# ---- target_assign -----------------------------------------------------------------------------
def _ta_infer(X, MatchIndices, NegIndices=None, *, mismatch_value):
    check_dtype(MatchIndices, (np.dtype(np.int32),), "target_assign: input MatchIndices")
    if X.ndim != 3 or MatchIndices.ndim != 2:
        raise _bad("target_assign", f"expected a 3-D X [M, P, K] and a 2-D MatchIndices "
                                    f"[N, P], got {list(X.shape)} and "
                                    f"{list(MatchIndices.shape)}")
    n, p = MatchIndices.shape
    return {"Out": X.with_(shape=(n, p, X.shape[2]), lod_level=0),
            "OutWeight": VarMeta((n, p, 1), np.float32)}


def _ta_ref(X, MatchIndices, NegIndices=None, *, mismatch_value, ctx=None):
    x_lod = ctx.input_lod("X") if ctx is not None else []
    offsets = list(x_lod[-1]) if x_lod else [0, X.shape[0]]
    n, p = MatchIndices.shape
    if len(offsets) - 1 != n:
        raise _bad("target_assign", f"expected X's LoD to hold the {n} instances of "
                                    f"MatchIndices, got offsets {offsets}")
    out = np.full((n, p, X.shape[2]), mismatch_value, X.dtype)
    weight = np.zeros((n, p, 1), np.float32)
    for i in range(n):
        for j in range(p):
            k = int(MatchIndices[i, j])
            if k >= 0:
                if offsets[i] + k >= offsets[i + 1]:
                    raise IndexError(f"target_assign: MatchIndices[{i}, {j}] = {k} is past "
                                     f"the {offsets[i + 1] - offsets[i]} rows of instance {i}")
                out[i, j] = X[offsets[i] + k, j % X.shape[1]]
                weight[i, j] = 1.0
    if NegIndices is not None:
        neg_lod = ctx.input_lod("NegIndices") if ctx is not None else []
        neg = np.asarray(NegIndices).reshape(-1)
        noffs = list(neg_lod[-1]) if neg_lod else [0, neg.size]
        if len(noffs) - 1 != n:
            raise _bad("target_assign", f"expected NegIndices' LoD to hold {n} instances, "
                                        f"got offsets {noffs}")
        for i in range(n):
            for k in neg[noffs[i]:noffs[i + 1]]:
                out[i, int(k)] = mismatch_value
                weight[i, int(k)] = 1.0
    return {"Out": out, "OutWeight": weight}


register_op(
    "target_assign", inputs=["X", "MatchIndices", "NegIndices?"],
    outputs=["Out", "OutWeight"], attrs={"mismatch_value": Int(0, choices=(0, 1))},
    traits=[OPAQUE], infer_shape=_ta_infer, reference=_ta_ref, emit=None, grad=None,
    doc="Out[i, j] = X[lod[i] + MatchIndices[i, j], j % P] (weight 1) where the index is "
        ">= 0, else mismatch_value (weight 0); then mismatch_value with weight 1 at each "
        "negative index of instance i.")
