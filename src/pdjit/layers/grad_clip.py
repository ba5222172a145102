"""Gradient clipping, applied before regularisation and the update (Fluid's ``clip``).

- ``GradientClipByValue(max, min=-max)``: each element clipped to ``[min, max]``;
- ``GradientClipByNorm(clip_norm)``: each gradient scaled to an L2 norm of at most ``clip_norm``;
- ``GradientClipByGlobalNorm(clip_norm)``: all gradients scaled together so that the L2 norm
  of their concatenation is at most ``clip_norm``.

All are ops appended to the program, so they run compiled like the rest of the step.

An optimizer's ``grad_clip`` clips its gradients. Without one, ``minimize`` applies the 1.x
global clip set by ``set_gradient_clip(clip, param_list=None, program=None)``: each parameter
named there carries the clip (``Parameter.gradient_clip_attr``), and ``append_gradient_clip_ops``
clips the gradients of the parameters that share one clip object together (a global norm is
the norm over that group; global-norm clips of one ``group_name`` form one group). Each
clip's ``need_clip(param)`` (Fluid 1.8) can leave some gradients out.
"""
from __future__ import annotations

import warnings

from pdjit.framework import registry, unique_name
from pdjit.framework.program import default_main_program
from pdjit.framework.variable import Parameter


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


class GradientClipBase:
    """What every gradient clip is: ``clip(params_grads) -> params_grads`` appending ops.

    ``need_clip`` (Fluid 1.8): a function of a Parameter returning whether its gradient is
    clipped; the others pass through untouched (and stay out of a global norm). ``None``:
    every gradient is clipped."""

    def __init__(self, need_clip=None):
        if need_clip is not None and not callable(need_clip):
            raise TypeError(f"{type(self).__name__}: need_clip must be a function of a "
                            f"Parameter returning bool, or None; got "
                            f"{type(need_clip).__name__}")
        self._need_clip = need_clip

    def __call__(self, params_grads):
        params_grads = list(params_grads)
        picked = [i for i, (p, _) in enumerate(params_grads)
                  if self._need_clip is None or self._need_clip(p)]
        out = list(params_grads)
        if picked:
            for i, pg in zip(picked, self._clip([params_grads[i] for i in picked])):
                out[i] = pg
        return out

    def _clip(self, params_grads):
        raise NotImplementedError


class GradientClipByValue(GradientClipBase):
    def __init__(self, max, min=None, need_clip=None):
        super().__init__(need_clip)
        min = -max if min is None else min
        if min > max:
            raise ValueError(f"GradientClipByValue: expected min <= max, got min={min}, "
                             f"max={max}")
        self.max, self.min = float(max), float(min)

    def _clip(self, params_grads):
        out = []
        for p, g in params_grads:
            block = g.block
            c = _tmp(block, g, f"{g.name}@CLIP")
            block.append_op("clip", inputs={"X": [g]}, outputs={"Out": [c]},
                            attrs={"min": self.min, "max": self.max})
            out.append((p, c))
        return out


class GradientClipByNorm(GradientClipBase):
    def __init__(self, clip_norm, need_clip=None):
        super().__init__(need_clip)
        if clip_norm <= 0:
            raise ValueError(f"GradientClipByNorm: clip_norm must be > 0, got {clip_norm}")
        self.clip_norm = float(clip_norm)

    def _clip(self, params_grads):
        out = []
        for p, g in params_grads:
            block = g.block
            norm = _tmp(block, g, f"{g.name}@NORM", shape=[])
            block.append_op("sqrt", inputs={"X": [_sum_of_squares(block, g)]},
                            outputs={"Out": [norm]})
            out.append((p, _scaled(block, g, _scale_factor(block, norm, self.clip_norm))))
        return out


class GradientClipByGlobalNorm(GradientClipBase):
    """``group_name``: with ``set_gradient_clip``, the parameters of every global-norm clip of
    one group name are clipped together, by one norm (their ``clip_norm`` must agree).
    ``auto_skip_clip`` (3.x's ``ClipGradByGlobalNorm``) is accepted: a norm within
    ``clip_norm`` scales by exactly 1 here, which is what skipping the clip gives."""

    def __init__(self, clip_norm, group_name="default_group", need_clip=None,
                 auto_skip_clip=False):
        super().__init__(need_clip)
        if clip_norm <= 0:
            raise ValueError(f"GradientClipByGlobalNorm: clip_norm must be > 0, got "
                             f"{clip_norm}")
        if not isinstance(group_name, str):
            raise TypeError(f"GradientClipByGlobalNorm: group_name must be a str, got "
                            f"{type(group_name).__name__}")
        self.clip_norm = float(clip_norm)
        self.group_name = group_name

    def _clip(self, params_grads):
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


def set_gradient_clip(clip, param_list=None, program=None) -> None:
    """Fluid 1.x's global gradient clip: ``minimize`` of an optimizer built without
    ``grad_clip`` clips the gradients of ``param_list`` (parameters or their names; default:
    all parameters of ``program``, default the main program) with ``clip``. Parameters given in
    one call are clipped together (one global norm). Call it before ``minimize``."""
    if not isinstance(clip, GradientClipBase):
        raise TypeError(f"set_gradient_clip: clip must be a GradientClipByValue, "
                        f"GradientClipByNorm or GradientClipByGlobalNorm, got "
                        f"{type(clip).__name__}")
    program = program if program is not None else default_main_program()
    block = program.global_block()
    if param_list is None:
        param_list = block.all_parameters()
    params = []
    for p in param_list:
        if isinstance(p, str):
            if not block.has_var(p) or not isinstance(block.var(p), Parameter):
                raise ValueError(f"set_gradient_clip: {p!r} is not a parameter of the program")
            p = block.var(p)
        if not isinstance(p, Parameter):
            raise TypeError(f"set_gradient_clip: param_list must hold Parameters or their "
                            f"names, got {type(p).__name__}")
        params.append(p)
    if any(op.has_attr("op_role") and int(op.attr("op_role")) & registry.OP_ROLE_OPTIMIZE
           for op in block.ops):
        warnings.warn("set_gradient_clip: minimize has already run on this program, so the clip "
                      "set now has no effect on it; call set_gradient_clip before minimize",
                      stacklevel=2)
    for p in params:
        p.gradient_clip_attr = clip


def append_gradient_clip_ops(params_grads) -> list:
    """Clip each gradient whose parameter carries a clip from ``set_gradient_clip``; the
    gradients of parameters sharing one clip object are clipped as one group."""
    groups: dict = {}
    for i, (p, g) in enumerate(params_grads):
        clip = getattr(p, "gradient_clip_attr", None)
        if g is not None and clip is not None:
            if not isinstance(clip, GradientClipBase):
                raise TypeError(f"parameter {p.name!r}: gradient_clip_attr must be a gradient "
                                f"clip, got {type(clip).__name__}")
            key = id(clip)
            if isinstance(clip, GradientClipByGlobalNorm):  # grouped by name, as Fluid 1.8
                key = ("global norm", clip.group_name)
                first = groups.get(key, (clip,))[0]
                if first.clip_norm != clip.clip_norm:
                    raise ValueError(f"set_gradient_clip: the GradientClipByGlobalNorm clips "
                                     f"of group {clip.group_name!r} must share one clip_norm, "
                                     f"got {first.clip_norm} and {clip.clip_norm} (parameter "
                                     f"{p.name!r})")
            groups.setdefault(key, (clip, []))[1].append(i)
    out = list(params_grads)
    for clip, idx in groups.values():
        for i, pg in zip(idx, clip([params_grads[i] for i in idx])):
            out[i] = pg
    return out


__all__ = ["GradientClipBase", "GradientClipByValue", "GradientClipByNorm",
           "GradientClipByGlobalNorm", "ClipGradByValue", "ClipGradByNorm", "ClipGradByGlobalNorm",
           "set_gradient_clip", "append_gradient_clip_ops"]
