"""Gradient clipping, applied before regularisation and the update (Fluid's ``clip``).

- ``GradientClipByValue(max, min=-max)``: each element clipped to ``[min, max]``;
- ``GradientClipByNorm(clip_norm)``: each gradient scaled to an L2 norm of at most ``clip_norm``;
- ``GradientClipByGlobalNorm(clip_norm)``: all gradients scaled together so that the L2 norm
  of their concatenation is at most ``clip_norm``.

All are ops appended to the program, so they run compiled like the rest of the step.
"""
from __future__ import annotations

from pdjit.framework import unique_name


def _tmp(block, like, name, shape=None):
    return block.create_var(name=unique_name.generate(name), shape=like.shape if shape is None
                            else shape, dtype=like.dtype, stop_gradient=True)


def _sum_of_squares(block, g):
    sq = _tmp(block, g, f"{g.name}@SQ")
    block.append_op("square", inputs={"X": [g]}, outputs={"Out": [sq]})
    s = _tmp(block, g, f"{g.name}@SQSUM", shape=[])
    block.append_op("reduce_sum", inputs={"X": [sq]}, outputs={"Out": [s]},
                    attrs={"reduce_all": True, "dim": []})
    return s


def _scale_factor(block, norm, clip_norm):
    """clip_norm / max(norm, clip_norm): 1 when the norm is within bounds."""
    c = _tmp(block, norm, "clip_norm", shape=[])
    block.append_op("fill_constant", outputs={"Out": [c]},
                     attrs={"shape": [], "value": float(clip_norm), "dtype": 5 if
                            norm.dtype == "float32" else 6})
    m = _tmp(block, norm, "clip_max", shape=[])
    block.append_op("elementwise_max", inputs={"X": [norm], "Y": [c]}, outputs={"Out": [m]})
    f = _tmp(block, norm, "clip_factor", shape=[])
    block.append_op("elementwise_div", inputs={"X": [c], "Y": [m]}, outputs={"Out": [f]})
    return f


def _scaled(block, g, factor):
    out = _tmp(block, g, f"{g.name}@CLIP")
    block.append_op("elementwise_mul", inputs={"X": [g], "Y": [factor]}, outputs={"Out": [out]})
    return out


class GradientClipByValue:
    def __init__(self, max, min=None):
        min = -max if min is None else min
        if min > max:
            raise ValueError(f"GradientClipByValue: expected min <= max, got min={min}, "
                             f"max={max}")
        self.max, self.min = float(max), float(min)

    def __call__(self, params_grads):
        out = []
        for p, g in params_grads:
            block = g.block
            c = _tmp(block, g, f"{g.name}@CLIP")
            block.append_op("clip", inputs={"X": [g]}, outputs={"Out": [c]},
                            attrs={"min": self.min, "max": self.max})
            out.append((p, c))
        return out


class GradientClipByNorm:
    def __init__(self, clip_norm):
        if clip_norm <= 0:
            raise ValueError(f"GradientClipByNorm: clip_norm must be > 0, got {clip_norm}")
        self.clip_norm = float(clip_norm)

    def __call__(self, params_grads):
        out = []
        for p, g in params_grads:
            block = g.block
            norm = _tmp(block, g, f"{g.name}@NORM", shape=[])
            block.append_op("sqrt", inputs={"X": [_sum_of_squares(block, g)]},
                            outputs={"Out": [norm]})
            out.append((p, _scaled(block, g, _scale_factor(block, norm, self.clip_norm))))
        return out


class GradientClipByGlobalNorm:
    def __init__(self, clip_norm):
        if clip_norm <= 0:
            raise ValueError(f"GradientClipByGlobalNorm: clip_norm must be > 0, got "
                             f"{clip_norm}")
        self.clip_norm = float(clip_norm)

    def __call__(self, params_grads):
        if not params_grads:
            return params_grads
        block = params_grads[0][1].block
        sums = [_sum_of_squares(block, g) for _, g in params_grads]
        first = params_grads[0][1]
        total = _tmp(block, first, "global_norm_sq", shape=[])
        block.append_op("sum", inputs={"X": sums}, outputs={"Out": [total]})
        norm = _tmp(block, first, "global_norm", shape=[])
        block.append_op("sqrt", inputs={"X": [total]}, outputs={"Out": [norm]})
        factor = _scale_factor(block, norm, self.clip_norm)
        return [(p, _scaled(block, g, factor)) for p, g in params_grads]


ClipGradByValue, ClipGradByNorm, ClipGradByGlobalNorm = (GradientClipByValue, GradientClipByNorm,
                                                          GradientClipByGlobalNorm)
