"""Fluid 1.8's detection ops that stand alone: ``sigmoid_focal_loss`` (with its gradient),
``iou_similarity``, ``box_coder``, ``prior_box``, ``multiclass_nms``, ``box_clip``, ``yolo_box``,
``anchor_generator``, ``polygon_box_transform`` and ``density_prior_box`` (the last eight
described above their definitions).

- ``sigmoid_focal_loss(X [N, C] logits, Label [N, 1] int32 (0: background, c: class c - 1),
  FgNum [1] int32; gamma, alpha) -> Out [N, C]``: with ``p = sigmoid(x)``, ``f = max(FgNum,
  1)``: ``-alpha / f (1 - p)^gamma log p`` for the sample's class, ``-(1 - alpha) / f p^gamma
  log(1 - p)`` for the other classes, 0 for every class of a sample labelled -1 (ignored).
- ``iou_similarity(X [N, 4], Y [M, 4]; box_normalized) -> Out [N, M]``: the intersection over
  union of each pair of (xmin, ymin, xmax, ymax) boxes; unnormalised boxes count their end
  pixels (+1 to widths and heights). Out keeps X's LoD.

All run their NumPy references (``emit`` is ``None``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    REQUIRED,
    SEQUENCE,
    Bool,
    Float,
    Floats,
    GradOpSpec,
    Int,
    Ints,
    Str,
    ValueDependentLoD,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

_FOCAL = {"gamma": Float(2.0, low=0.5, high=3.0), "alpha": Float(0.25, low=0.1, high=0.9)}


def _focal_parts(X, Label, FgNum, gamma, alpha):
    x = X.astype(np.float64)
    n, c = x.shape
    lab = Label.reshape(-1).astype(np.int64)
    if lab.size != n:
        raise ShapeMismatch(f"sigmoid_focal_loss: expected one label per row ({n}), got "
                            f"{lab.size}")
    f = max(int(FgNum.reshape(-1)[0]), 1)
    cls = np.arange(1, c + 1).reshape(1, -1)
    pos_b = lab.reshape(-1, 1) == cls
    pos = pos_b.astype(np.float64)
    neg = ((lab.reshape(-1, 1) != -1) & ~pos_b).astype(np.float64)
    e = np.exp(-np.abs(x))
    p = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    log_p = np.minimum(x, 0) - np.log1p(e)            # log sigmoid(x)
    log_q = -np.maximum(x, 0) - np.log1p(e)           # log (1 - sigmoid(x))
    a, b = float(np.float32(alpha)) / f, (1 - float(np.float32(alpha))) / f
    return x, p, log_p, log_q, pos, neg, a, b, float(np.float32(gamma))


def _focal_infer(X, Label, FgNum, **_):
    check_dtype(X, FLOATS, "sigmoid_focal_loss: input X")
    if X.ndim != 2:
        raise ShapeMismatch(f"sigmoid_focal_loss: expected X [N, C], got {list(X.shape)}")
    return {"Out": X}


def _focal_ref(X, Label, FgNum, *, gamma, alpha):
    _, p, log_p, log_q, pos, neg, a, b, g = _focal_parts(X, Label, FgNum, gamma, alpha)
    out = -pos * a * (1 - p) ** g * log_p - neg * b * p ** g * log_q
    return {"Out": out.astype(X.dtype)}


def _focal_grad_ref(X, Label, FgNum, *, gamma, alpha, **kw):
    d = kw["Out@GRAD"].astype(np.float64)
    _, p, log_p, log_q, pos, neg, a, b, g = _focal_parts(X, Label, FgNum, gamma, alpha)
    dpos = (1 - p) ** g * ((1 - p) - g * p * log_p)
    dneg = p ** g * (g * (1 - p) * log_q - p)
    return {"X@GRAD": ((-pos * a * dpos - neg * b * dneg) * d).astype(X.dtype)}


register_op(
    "sigmoid_focal_loss", inputs=["X", "Label", "FgNum"], outputs=["Out"], attrs=_FOCAL,
    traits=[OPAQUE], infer_shape=_focal_infer, reference=_focal_ref, emit=None,
    grad=lambda op: [GradOpSpec(
        "sigmoid_focal_loss_grad",
        {"X": op.input("X"), "Label": op.input("Label"), "FgNum": op.input("FgNum"),
         "Out@GRAD": [grad_var_name(v) for v in op.output("Out")]},
        {"X@GRAD": [grad_var_name(v) for v in op.input("X")]},
        {k: v for k, v in op.all_attrs().items() if k in _FOCAL})],
    domain={"FgNum": "positive"},
    doc="Focal loss of per-class sigmoids (RetinaNet), normalised by the foreground count.")
register_op(
    "sigmoid_focal_loss_grad", inputs=["X", "Label", "FgNum", "Out@GRAD"], outputs=["X@GRAD?"],
    attrs=dict(_FOCAL), traits=[OPAQUE], infer_shape=lambda X, **_: {"X@GRAD": X},
    reference=_focal_grad_ref, emit=None, grad=None, doc="Gradient of sigmoid_focal_loss.")


def _iou_infer(X, Y, **_):
    check_dtype(X, FLOATS, "iou_similarity: input X")
    if X.ndim != 2 or Y.ndim != 2:
        raise ShapeMismatch(f"iou_similarity: expected X [N, 4] and Y [M, 4], got "
                            f"{list(X.shape)} and {list(Y.shape)}")
    return {"Out": VarMeta((X.shape[0], Y.shape[0]), X.dtype, X.lod_level)}


def _iou_ref(X, Y, *, box_normalized):
    if X.shape[-1] != 4 or Y.shape[-1] != 4:
        raise ShapeMismatch(f"iou_similarity: expected boxes of 4 values, got {list(X.shape)} "
                            f"and {list(Y.shape)}")
    one = 0.0 if box_normalized else 1.0
    x, y = X.astype(np.float64)[:, None, :], Y.astype(np.float64)[None, :, :]
    area_x = (x[..., 2] - x[..., 0] + one) * (x[..., 3] - x[..., 1] + one)
    area_y = (y[..., 2] - y[..., 0] + one) * (y[..., 3] - y[..., 1] + one)
    iw = np.maximum(np.minimum(x[..., 2], y[..., 2]) - np.maximum(x[..., 0], y[..., 0]) + one, 0)
    ih = np.maximum(np.minimum(x[..., 3], y[..., 3]) - np.maximum(x[..., 1], y[..., 1]) + one, 0)
    inter = iw * ih
    with np.errstate(invalid="ignore", divide="ignore"):
        out = inter / (area_x + area_y - inter)
    return {"Out": np.nan_to_num(out).astype(X.dtype)}


register_op(
    "iou_similarity", inputs=["X", "Y"], outputs=["Out"],
    attrs={"box_normalized": Bool(True)}, traits=[OPAQUE], infer_shape=_iou_infer,
    reference=_iou_ref, emit=None, grad=None,
    doc="Intersection over union of every pair of boxes of X and Y.")


# ---- box_coder -------------------------------------------------------------------------------
# PriorBox [M, 4] boxes (xmin, ymin, xmax, ymax), their variances (PriorBoxVar [M, 4], else the
# 4 values of the variance attribute, else 1). encode_center_size: TargetBox [N, 4] -> [N, M, 4]
# of ((tx - px) / pw / vx, (ty - py) / ph / vy, log|tw / pw| / vw, log|th / ph| / vh) with
# centres and sizes (unnormalised boxes count their end pixels: + 1 to sizes).
# decode_center_size: TargetBox [N, M, 4] of such offsets -> the boxes they encode, the priors
# broadcast along axis (0: prior j for column j; 1: prior i for row i).
_CODER = {"code_type": Str("encode_center_size",
                           one_of=("encode_center_size", "decode_center_size"),
                           choices=("encode_center_size",)),
          "box_normalized": Bool(True), "axis": Int(0, one_of=(0, 1), choices=(0,)),
          "variance": Floats([], choices=([],))}


def _coder_infer(PriorBox, TargetBox, PriorBoxVar=None, *, code_type, **_):
    check_dtype(PriorBox, FLOATS, "box_coder: PriorBox")
    if code_type == "encode_center_size":
        return {"OutputBox": VarMeta((TargetBox.shape[0], PriorBox.shape[0], 4), PriorBox.dtype,
                                     TargetBox.lod_level)}
    return {"OutputBox": TargetBox.with_(lod_level=0)}


def _centre_size(b, one):
    w, h = b[..., 2] - b[..., 0] + one, b[..., 3] - b[..., 1] + one
    return (b[..., 2] + b[..., 0]) / 2, (b[..., 3] + b[..., 1]) / 2, w, h


def _coder_ref(PriorBox, TargetBox, PriorBoxVar=None, *, code_type, box_normalized, axis,
               variance):
    p = PriorBox.astype(np.float64)
    m = p.shape[0]
    if PriorBoxVar is not None:
        var = PriorBoxVar.astype(np.float64).reshape(m, 4)
    elif variance:
        if len(variance) != 4:
            raise ShapeMismatch(f"box_coder: expected 4 variance values, got {list(variance)}")
        var = np.tile(np.asarray(variance, np.float64), (m, 1))
    else:
        var = np.ones((m, 4))
    one = 0.0 if box_normalized else 1.0
    px, py, pw, ph = _centre_size(p, one)
    t = TargetBox.astype(np.float64)
    if code_type == "encode_center_size":
        tx, ty, tw, th = (v[:, None] for v in _centre_size(t.reshape(-1, 4), one))
        out = np.stack([(tx - px) / pw / var[:, 0], (ty - py) / ph / var[:, 1],
                        np.log(np.abs(tw / pw)) / var[:, 2], np.log(np.abs(th / ph)) / var[:, 3]],
                       axis=-1)
        return {"OutputBox": out.astype(PriorBox.dtype)}
    if t.ndim != 3 or t.shape[2] != 4 or t.shape[1 - axis] != m:
        raise ShapeMismatch(f"box_coder: decoding expected TargetBox [N, M, 4] with {m} priors "
                            f"along axis {1 - axis}, got {list(t.shape)}")

    def along(v):
        return v[None, :] if axis == 0 else v[:, None]

    cx = along(var[:, 0]) * t[..., 0] * along(pw) + along(px)
    cy = along(var[:, 1]) * t[..., 1] * along(ph) + along(py)
    w = np.exp(along(var[:, 2]) * t[..., 2]) * along(pw)
    h = np.exp(along(var[:, 3]) * t[..., 3]) * along(ph)
    out = np.stack([cx - w / 2, cy - h / 2, cx + w / 2 - one, cy + h / 2 - one], axis=-1)
    return {"OutputBox": out.astype(PriorBox.dtype)}


register_op(
    "box_coder", inputs=["PriorBox", "PriorBoxVar?", "TargetBox"], outputs=["OutputBox"],
    attrs=_CODER, traits=[OPAQUE], infer_shape=_coder_infer, reference=_coder_ref, emit=None,
    grad=None, doc="Boxes encoded as offsets from prior boxes, or offsets decoded into boxes.")


# ---- prior_box -------------------------------------------------------------------------------
# SSD's prior boxes of a feature map Input [N, C, H, W] over an Image [N, C', IH, IW]: at each
# cell centre ((w + offset) step_w, (h + offset) step_h) (steps IW / W, IH / H unless given),
# for each min size: one box per aspect ratio (1 first, then each ratio not yet listed and, with
# flip, its inverse; size min_size sqrt(ar) x min_size / sqrt(ar)), and with max sizes a square
# of side sqrt(min_size max_size) after them (min_max_aspect_ratios_order: the min square, the
# max square, then the other ratios). Corners divided by the image size, clipped to [0, 1] with
# clip. Boxes and Variances (the variances repeated) are [H, W, priors, 4].
_PRIOR = {"min_sizes": Floats(REQUIRED, choices=([2.0],)), "max_sizes": Floats([], choices=([],)),
          "aspect_ratios": Floats([1.0], choices=([1.0], [2.0])),
          "variances": Floats([0.1, 0.1, 0.2, 0.2], choices=([0.1, 0.1, 0.2, 0.2],)),
          "flip": Bool(False), "clip": Bool(False), "step_w": Float(0.0, low=0.0, high=0.0),
          "step_h": Float(0.0, low=0.0, high=0.0), "offset": Float(0.5, low=0.5, high=0.5),
          "min_max_aspect_ratios_order": Bool(False)}


def _ratios(aspect_ratios, flip):
    out = [1.0]
    for ar in aspect_ratios:
        if all(abs(ar - a) >= 1e-6 for a in out):
            out.append(ar)
            if flip:
                out.append(1.0 / ar)
    return out


def _num_priors(min_sizes, max_sizes, aspect_ratios, flip):
    return len(_ratios(aspect_ratios, flip)) * len(min_sizes) + len(max_sizes)


def _prior_infer(Input, Image, *, min_sizes, max_sizes, aspect_ratios, variances, flip, **_):
    check_dtype(Input, FLOATS, "prior_box: Input")
    if Input.ndim != 4 or Image.ndim != 4:
        raise ShapeMismatch(f"prior_box: expected 4-D Input and Image, got {list(Input.shape)} "
                            f"and {list(Image.shape)}")
    if max_sizes and len(max_sizes) != len(min_sizes):
        raise ShapeMismatch(f"prior_box: expected one max size per min size, got {max_sizes} for "
                            f"{min_sizes}")
    shape = (Input.shape[2], Input.shape[3],
             _num_priors(min_sizes, max_sizes, aspect_ratios, flip), 4)
    return {"Boxes": VarMeta(shape, Input.dtype), "Variances": VarMeta(shape, Input.dtype)}


def _prior_ref(Input, Image, *, min_sizes, max_sizes, aspect_ratios, variances, flip, clip,
               step_w, step_h, offset, min_max_aspect_ratios_order):
    f32 = [float(np.float32(v)) for v in min_sizes], [float(np.float32(v)) for v in max_sizes]
    mins, maxs = f32
    ih, iw = Image.shape[2], Image.shape[3]
    fh, fw = Input.shape[2], Input.shape[3]
    sw, sh = (iw / fw, ih / fh) if step_w == 0 or step_h == 0 else (step_w, step_h)
    ratios = _ratios([float(np.float32(a)) for a in aspect_ratios], flip)
    boxes = []
    for h in range(fh):
        for w in range(fw):
            cx, cy = (w + offset) * sw, (h + offset) * sh
            cell = []
            for s, mn in enumerate(mins):
                sizes = [(mn * np.sqrt(ar), mn / np.sqrt(ar)) for ar in ratios]
                big = [(np.sqrt(mn * maxs[s]),) * 2] if maxs else []
                if min_max_aspect_ratios_order:
                    cell += [sizes[0]] + big + [sz for ar, sz in zip(ratios, sizes)
                                                if abs(ar - 1.0) >= 1e-6]
                else:
                    cell += sizes + big
            boxes.append([[(cx - bw / 2) / iw, (cy - bh / 2) / ih, (cx + bw / 2) / iw,
                           (cy + bh / 2) / ih] for bw, bh in cell])
    out = np.asarray(boxes, np.float64).reshape(fh, fw, -1, 4)
    if clip:
        out = np.clip(out, 0.0, 1.0)
    var = np.broadcast_to(np.asarray(variances, np.float64), out.shape)
    return {"Boxes": out.astype(Input.dtype), "Variances": np.array(var, dtype=Input.dtype)}


register_op(
    "prior_box", inputs=["Input", "Image"], outputs=["Boxes", "Variances"], attrs=_PRIOR,
    traits=[OPAQUE], infer_shape=_prior_infer, reference=_prior_ref, emit=None, grad=None,
    doc="SSD prior boxes of each cell of a feature map, and their variances.")


# ---- multiclass_nms --------------------------------------------------------------------------
# BBoxes [N, M, 4], Scores [N, C, M]: per image and class (but background_label), the boxes
# scoring above score_threshold, best first (ties by index), at most nms_top_k, then greedy NMS:
# a box is kept unless its IoU with a kept one exceeds the threshold (times nms_eta after each
# kept box while the threshold is above 0.5). Over all classes at most keep_top_k, the best.
# Out: rows (label, score, xmin, ymin, xmax, ymax), by label then score, one LoD sequence per
# image; with nothing kept anywhere, Fluid's single row [-1] (LoD [0, 1]).
_NMS = {"background_label": Int(0, low=0, high=0),
        "score_threshold": Float(REQUIRED, low=0.1, high=0.1),
        "nms_top_k": Int(REQUIRED, low=-1, high=3), "nms_threshold": Float(0.3, low=0.3, high=0.5),
        "nms_eta": Float(1.0, low=1.0, high=1.0), "keep_top_k": Int(REQUIRED, low=-1, high=4),
        "normalized": Bool(True)}


def _iou_one(a, b, normalized):
    one = 0.0 if normalized else 1.0
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw = min(a[2], b[2]) - max(a[0], b[0]) + one
    ih = min(a[3], b[3]) - max(a[1], b[1]) + one
    inter = iw * ih
    area_a = (a[2] - a[0] + one) * (a[3] - a[1] + one)
    area_b = (b[2] - b[0] + one) * (b[3] - b[1] + one)
    return inter / (area_a + area_b - inter)


def _nms_class(boxes, scores, a):
    cand = [i for i in np.argsort(-scores, kind="stable") if scores[i] > a["score_threshold"]]
    if a["nms_top_k"] > -1:
        cand = cand[:a["nms_top_k"]]
    kept, thr = [], float(np.float32(a["nms_threshold"]))
    eta = float(np.float32(a["nms_eta"]))
    for i in cand:
        if all(_iou_one(boxes[i], boxes[k], a["normalized"]) <= thr for k in kept):
            kept.append(i)
            if eta < 1 and thr > 0.5:
                thr *= eta
    return kept


def _nms_infer(BBoxes, Scores, **_):
    check_dtype(BBoxes, FLOATS, "multiclass_nms: BBoxes")
    if BBoxes.ndim != 3 or Scores.ndim != 3:
        raise ShapeMismatch(f"multiclass_nms: expected BBoxes [N, M, 4] and Scores [N, C, M], got "
                            f"{list(BBoxes.shape)} and {list(Scores.shape)}")
    # 6 columns, or Fluid's single [-1] when nothing is kept: the width is left unknown
    return {"Out": VarMeta((-1, -1), BBoxes.dtype, 1)}


def _nms_ref(BBoxes, Scores, *, ctx, **a):
    a["score_threshold"] = float(np.float32(a["score_threshold"]))
    rows, offs = [], [0]
    for n in range(BBoxes.shape[0]):
        picked = []
        for c in range(Scores.shape[1]):
            if c == a["background_label"]:
                continue
            picked += [(float(Scores[n, c, i]), c, i)
                       for i in _nms_class(BBoxes[n], Scores[n, c], a)]
        if a["keep_top_k"] > -1 and len(picked) > a["keep_top_k"]:
            picked = sorted(picked, key=lambda t: -t[0])[:a["keep_top_k"]]
        picked.sort(key=lambda t: (t[1], -t[0]))
        rows += [[c, s, *BBoxes[n, i]] for s, c, i in picked]
        offs.append(len(rows))
    if not rows:
        ctx.set_output_lod("Out", [[0, 1]])
        return {"Out": np.full((1, 1), -1, BBoxes.dtype)}
    ctx.set_output_lod("Out", [offs])
    return {"Out": np.asarray(rows, np.float64).astype(BBoxes.dtype)}


def _nms_lod(lods, **_):
    raise ValueDependentLoD("multiclass_nms's LoD counts the boxes kept")


register_op(
    "multiclass_nms", inputs=["BBoxes", "Scores"], outputs=["Out"], attrs=_NMS,
    traits=[OPAQUE, SEQUENCE], infer_shape=_nms_infer, reference=_nms_ref, emit=None, grad=None,
    out_lod=_nms_lod, doc="Per-class non-maximum suppression of scored boxes.")


# ---- box_clip --------------------------------------------------------------------------------
# Input [..., 4] boxes clipped into their image: x to [0, round(width / scale) - 1], y to
# [0, round(height / scale) - 1] from ImInfo [N, 3] (height, width, scale); the image of a row
# is its LoD sequence (one-level LoD), else its index along the first axis.
def _clip_infer(Input, ImInfo):
    check_dtype(Input, FLOATS, "box_clip: Input")
    if Input.shape and Input.shape[-1] not in (4, -1):
        raise ShapeMismatch(f"box_clip: expected boxes [..., 4], got {list(Input.shape)}")
    return {"Output": Input}


def _round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _clip_ref(Input, ImInfo, ctx):
    lod = ctx.input_lod("Input") if ctx is not None else []
    n = ImInfo.shape[0]
    if lod:
        offs = np.asarray(lod[-1], np.int64)
        if len(offs) - 1 != n or offs[-1] != Input.shape[0]:
            raise ShapeMismatch(f"box_clip: Input's LoD {lod[-1]}: expected {n} sequences over "
                                f"{Input.shape[0]} rows")
        image = np.repeat(np.arange(n), np.diff(offs))
    elif Input.shape[0] == n:
        image = np.arange(n)
    else:
        raise ShapeMismatch(f"box_clip: {Input.shape[0]} rows for {n} images: give Input a LoD "
                            f"or one row per image")
    info = ImInfo.astype(np.float64)
    h = _round_half_away(info[:, 0] / info[:, 2])[image] - 1
    w = _round_half_away(info[:, 1] / info[:, 2])[image] - 1
    b = Input.astype(np.float64).reshape(Input.shape[0], -1, 4)
    lim = np.stack([w, h, w, h], axis=-1)[:, None, :]
    out = np.maximum(np.minimum(b, lim), 0.0)
    return {"Output": out.reshape(Input.shape).astype(Input.dtype)}


register_op(
    "box_clip", inputs=["Input", "ImInfo"], outputs=["Output"], traits=[OPAQUE, SEQUENCE],
    infer_shape=_clip_infer, reference=_clip_ref, emit=None, grad=None,
    out_lod=lambda lods, **_: {"Output": lods["Input"]},
    doc="Boxes clipped into their image's size.")


# ---- yolo_box --------------------------------------------------------------------------------
# X [N, S (5 + classes), H, W] of a YOLOv3 head, ImgSize [N, 2] int32 (height, width): for
# anchor s at cell (k, l) (box s H W + k W + l): centre ((l + sigmoid(tx)) / W, (k +
# sigmoid(ty)) / H) and size (exp(tw) aw, exp(th) ah) / (downsample_ratio H), all times the
# image size; boxes as corners (with clip_bbox the low corner at least 0, the high one at most
# the size - 1), scores sigmoid(conf) sigmoid(class); a box whose sigmoid(conf) is below
# conf_thresh stays all zeros. scale_x_y s scales the sigmoid of the centre: s sig - (s - 1)/2.
_YOLO = {"anchors": Ints(REQUIRED, choices=([2, 3, 4, 5],)),
         "class_num": Int(REQUIRED, low=2, high=2),
         "conf_thresh": Float(0.01, low=0.01, high=0.01),
         "downsample_ratio": Int(32, low=8, high=8), "clip_bbox": Bool(True),
         "scale_x_y": Float(1.0, low=1.0, high=1.0)}


def _yolo_infer(X, ImgSize, *, anchors, class_num, **_):
    check_dtype(X, FLOATS, "yolo_box: X")
    s = len(anchors) // 2
    if X.ndim != 4 or (X.shape[1] >= 0 and X.shape[1] != s * (5 + class_num)):
        raise ShapeMismatch(f"yolo_box: expected X [N, {s} * (5 + {class_num}), H, W], got "
                            f"{list(X.shape)}")
    m = s * X.shape[2] * X.shape[3] if min(X.shape[2:]) >= 0 else -1
    return {"Boxes": VarMeta((X.shape[0], m, 4), X.dtype),
            "Scores": VarMeta((X.shape[0], m, class_num), X.dtype)}


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _yolo_ref(X, ImgSize, *, anchors, class_num, conf_thresh, downsample_ratio, clip_bbox,
              scale_x_y):
    n, _, h, w = X.shape
    s = len(anchors) // 2
    x = X.astype(np.float64).reshape(n, s, 5 + class_num, h, w)
    an = np.asarray(anchors, np.float64).reshape(s, 2)
    sc = float(np.float32(scale_x_y))
    img_h = ImgSize[:, 0].astype(np.float64).reshape(n, 1, 1, 1)
    img_w = ImgSize[:, 1].astype(np.float64).reshape(n, 1, 1, 1)
    col = np.arange(w).reshape(1, 1, 1, w)
    row = np.arange(h).reshape(1, 1, h, 1)
    cx = (col + _sig(x[:, :, 0]) * sc - 0.5 * (sc - 1)) * img_w / w
    cy = (row + _sig(x[:, :, 1]) * sc - 0.5 * (sc - 1)) * img_h / h
    input_size = downsample_ratio * h
    bw = np.exp(x[:, :, 2]) * an[:, 0].reshape(1, s, 1, 1) * img_w / input_size
    bh = np.exp(x[:, :, 3]) * an[:, 1].reshape(1, s, 1, 1) * img_h / input_size
    boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=-1)
    if clip_bbox:
        boxes[..., 0] = np.maximum(boxes[..., 0], 0)
        boxes[..., 1] = np.maximum(boxes[..., 1], 0)
        boxes[..., 2] = np.minimum(boxes[..., 2], img_w[..., 0] - 1)
        boxes[..., 3] = np.minimum(boxes[..., 3], img_h[..., 0] - 1)
    conf = _sig(x[:, :, 4])
    keep = conf >= float(np.float32(conf_thresh))
    scores = conf[..., None] * np.moveaxis(_sig(x[:, :, 5:]), 2, -1)
    boxes = np.where(keep[..., None], boxes, 0.0)
    scores = np.where(keep[..., None], scores, 0.0)
    return {"Boxes": boxes.reshape(n, -1, 4).astype(X.dtype),
            "Scores": scores.reshape(n, -1, class_num).astype(X.dtype)}


register_op(
    "yolo_box", inputs=["X", "ImgSize"], outputs=["Boxes", "Scores"], attrs=_YOLO,
    traits=[OPAQUE], infer_shape=_yolo_infer, reference=_yolo_ref, emit=None, grad=None,
    doc="YOLOv3 head outputs decoded into boxes and class scores.")


# ---- anchor_generator ------------------------------------------------------------------------
# Faster R-CNN's anchors of a feature map Input [N, C, H, W]: at cell (h, w) centred at (w sw +
# offset (sw - 1), h sh + offset (sh - 1)) (stride [sw, sh]), for each aspect ratio r then each
# size a: base width round(sqrt(sw sh / r)), height round(width r) (halves away from 0), scaled
# by a / sw and a / sh; corners at the centre -+ (size - 1) / 2. Anchors and Variances are
# [H, W, ratios * sizes, 4].
_ANCHOR = {"anchor_sizes": Floats(REQUIRED, choices=([32.0, 64.0],)),
           "aspect_ratios": Floats(REQUIRED, choices=([0.5, 1.0],)),
           "stride": Floats(REQUIRED, choices=([16.0, 16.0],)),
           "variances": Floats([0.1, 0.1, 0.2, 0.2], choices=([0.1, 0.1, 0.2, 0.2],)),
           "offset": Float(0.5, low=0.5, high=0.5)}


def _anchor_infer(Input, *, anchor_sizes, aspect_ratios, **_):
    check_dtype(Input, FLOATS, "anchor_generator: Input")
    if Input.ndim != 4:
        raise ShapeMismatch(f"anchor_generator: expected a 4-D Input, got {list(Input.shape)}")
    shape = (Input.shape[2], Input.shape[3], len(anchor_sizes) * len(aspect_ratios), 4)
    return {"Anchors": VarMeta(shape, Input.dtype), "Variances": VarMeta(shape, Input.dtype)}


def _anchor_ref(Input, *, anchor_sizes, aspect_ratios, stride, variances, offset):
    sw, sh = (float(np.float32(v)) for v in stride[:2])
    off = float(np.float32(offset))
    fh, fw = Input.shape[2], Input.shape[3]
    out = np.zeros((fh, fw, len(anchor_sizes) * len(aspect_ratios), 4))
    for h in range(fh):
        for w in range(fw):
            xc, yc = w * sw + off * (sw - 1), h * sh + off * (sh - 1)
            k = 0
            for r in (float(np.float32(v)) for v in aspect_ratios):
                for a in (float(np.float32(v)) for v in anchor_sizes):
                    bw = float(_round_half_away(np.sqrt(sw * sh / r)))
                    bh = float(_round_half_away(bw * r))
                    aw, ah = a / sw * bw, a / sh * bh
                    out[h, w, k] = [xc - 0.5 * (aw - 1), yc - 0.5 * (ah - 1),
                                    xc + 0.5 * (aw - 1), yc + 0.5 * (ah - 1)]
                    k += 1
    var = np.broadcast_to(np.asarray(variances, np.float64), out.shape)
    return {"Anchors": out.astype(Input.dtype), "Variances": np.array(var, dtype=Input.dtype)}


register_op(
    "anchor_generator", inputs=["Input"], outputs=["Anchors", "Variances"], attrs=_ANCHOR,
    traits=[OPAQUE], infer_shape=_anchor_infer, reference=_anchor_ref, emit=None, grad=None,
    doc="Faster R-CNN anchors of each cell of a feature map, and their variances.")


# ---- polygon_box_transform -------------------------------------------------------------------
# EAST's geometry map Input [N, 2k, H, W] of offsets to quadrangle corners: channel 2i (x)
# becomes 4 w - Input, channel 2i + 1 (y) 4 h - Input, at column w and row h.
def _poly_infer(Input):
    check_dtype(Input, FLOATS, "polygon_box_transform: Input")
    if Input.ndim != 4 or (Input.shape[1] >= 0 and Input.shape[1] % 2):
        raise ShapeMismatch(f"polygon_box_transform: expected Input [N, 2k, H, W], got "
                            f"{list(Input.shape)}")
    return {"Output": Input}


def _poly_ref(Input):
    _, c, h, w = Input.shape
    cols = np.broadcast_to(4.0 * np.arange(w), (h, w))
    rows = np.broadcast_to(4.0 * np.arange(h).reshape(-1, 1), (h, w))
    grid = np.stack([cols if k % 2 == 0 else rows for k in range(c)])
    return {"Output": (grid[None] - Input).astype(Input.dtype)}


register_op(
    "polygon_box_transform", inputs=["Input"], outputs=["Output"], traits=[OPAQUE],
    infer_shape=_poly_infer, reference=_poly_ref, emit=None, grad=None,
    doc="EAST geometry offsets turned into corner coordinates (4 x the cell position minus them).")


# ---- density_prior_box -----------------------------------------------------------------------
# Prior boxes placed densely: per cell (centre as prior_box's), per fixed size s with density d
# and per fixed ratio r, a d x d grid of boxes (s sqrt r wide, s / sqrt r high) whose centres
# are shift = int(avg step) // d apart, starting at centre - avg step / 2 + shift / 2 (avg step
# = int((step_w + step_h) / 2)); corners divided by the image size and kept in [0, 1].
# [H, W, priors, 4], or [H W priors, 4] with flatten_to_2d.
_DENSE = {"densities": Ints(REQUIRED, choices=([2],)),
          "fixed_sizes": Floats(REQUIRED, choices=([4.0],)),
          "fixed_ratios": Floats(REQUIRED, choices=([1.0],)),
          "variances": Floats([0.1, 0.1, 0.2, 0.2], choices=([0.1, 0.1, 0.2, 0.2],)),
          "clip": Bool(False), "step_w": Float(0.0, low=0.0, high=0.0),
          "step_h": Float(0.0, low=0.0, high=0.0), "offset": Float(0.5, low=0.5, high=0.5),
          "flatten_to_2d": Bool(False)}


def _dense_infer(Input, Image, *, densities, fixed_ratios, flatten_to_2d, **_):
    check_dtype(Input, FLOATS, "density_prior_box: Input")
    if Input.ndim != 4 or Image.ndim != 4:
        raise ShapeMismatch(f"density_prior_box: expected 4-D Input and Image, got "
                            f"{list(Input.shape)} and {list(Image.shape)}")
    p = len(fixed_ratios) * sum(d * d for d in densities)
    h, w = Input.shape[2], Input.shape[3]
    shape = ((h * w * p if min(h, w) >= 0 else -1, 4) if flatten_to_2d else (h, w, p, 4))
    return {"Boxes": VarMeta(shape, Input.dtype), "Variances": VarMeta(shape, Input.dtype)}


def _dense_ref(Input, Image, *, densities, fixed_sizes, fixed_ratios, variances, clip, step_w,
               step_h, offset, flatten_to_2d):
    ih, iw = Image.shape[2], Image.shape[3]
    fh, fw = Input.shape[2], Input.shape[3]
    sw, sh = (iw / fw, ih / fh) if step_w == 0 or step_h == 0 else (step_w, step_h)
    avg = int((sw + sh) * 0.5)
    out = []
    for h in range(fh):
        for w in range(fw):
            cx, cy = (w + offset) * sw, (h + offset) * sh
            cell = []
            for size, d in zip((float(np.float32(v)) for v in fixed_sizes), densities):
                shift = avg // d
                for r in (float(np.float32(v)) for v in fixed_ratios):
                    bw, bh = size * np.sqrt(r), size / np.sqrt(r)
                    x0, y0 = cx - avg / 2 + shift / 2, cy - avg / 2 + shift / 2
                    for di in range(d):
                        for dj in range(d):
                            x, y = x0 + dj * shift, y0 + di * shift
                            cell.append([max((x - bw / 2) / iw, 0.0), max((y - bh / 2) / ih, 0.0),
                                         min((x + bw / 2) / iw, 1.0), min((y + bh / 2) / ih, 1.0)])
            out.append(cell)
    boxes = np.asarray(out, np.float64).reshape(fh, fw, -1, 4)
    if clip:
        boxes = np.clip(boxes, 0.0, 1.0)
    if flatten_to_2d:
        boxes = boxes.reshape(-1, 4)
    var = np.broadcast_to(np.asarray(variances, np.float64), boxes.shape)
    return {"Boxes": boxes.astype(Input.dtype), "Variances": np.array(var, dtype=Input.dtype)}


register_op(
    "density_prior_box", inputs=["Input", "Image"], outputs=["Boxes", "Variances"],
    attrs=_DENSE, traits=[OPAQUE], infer_shape=_dense_infer, reference=_dense_ref, emit=None,
    grad=None, doc="Densely placed prior boxes of each cell of a feature map.")
