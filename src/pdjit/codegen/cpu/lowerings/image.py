"""Pad3d, the interpolations and affine_channel (:mod:`pdjit.ops.image`) on the CPU: the library
kernels of :mod:`pdjit.codegen.cpu.lib.image`, whose sizes, pads, ratios and modes are run-time
arguments."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import VarMeta
from pdjit.ops._common import src_literal
from pdjit.ops.image import (
    _DATA,
    _LAYOUTS,
    _PAD_MODES,
    _REAL,
    _attr_scales,
    _channel_axis,
    _dhw_axes,
    _f32,
    _interp_check,
    _pad3d_check,
)


def _view5(X, data_format) -> str:
    """Source viewing a 5-D array as [A, D, H, W, B] (channel-first: B = 1)."""
    if data_format == "NDHWC":
        return X
    return f"{X}.reshape(({X}.shape[0] * {X}.shape[1], {X}.shape[2], {X}.shape[3], " \
           f"{X}.shape[4], 1))"


def _pad3d_args(ctx):
    """(front, top, left source expressions, [(before, after) expressions per D/H/W]), or None
    when the attributes are refused (the reference says why)."""
    fmt = ctx.attrs["data_format"]
    if ctx.has_input("Paddings"):
        P = ctx.inp("Paddings")
        if ctx.attrs["mode"] not in _PAD_MODES or fmt not in ("NCDHW", "NDHWC"):
            return None
        p = [f"int({P}[{i}])" for i in range(6)]
    else:
        meta = VarMeta(ctx.shape("X"), ctx.dtype("X"))
        try:
            _pad3d_check(meta, ctx.attrs["paddings"], ctx.attrs["mode"], fmt)
        except ShapeMismatch:
            return None
        p = [str(int(v)) for v in ctx.attrs["paddings"]]
    return (p[4], p[2], p[0]), [(p[4], p[5]), (p[2], p[3]), (p[0], p[1])]


@lowering("pad3d", host=True)
def _pad3d_lower(ctx):
    X, fmt = ctx.inp("X"), ctx.attrs["data_format"]
    if ctx.rank("X") != 5 or ctx.dtype("X") not in _DATA:
        return None
    args = _pad3d_args(ctx)
    if args is None:
        return None
    (front, top, left), pairs = args
    dims = [f"{X}.shape[{i}]" for i in range(5)]
    for ax, (a, b) in zip(_dhw_axes(fmt), pairs):
        dims[ax] = f"{X}.shape[{ax}] + {a} + {b}"
    out = ctx.out("Out", shape=ctx.tuple_src(dims))
    mode = _PAD_MODES[ctx.attrs["mode"]]
    value = src_literal(_f32(ctx.attrs["value"]))
    return [f"{ctx.lib_fn('pad3d')}("
            f"{_view5(X, fmt)}, {_view5(out, fmt)}, {front}, {top}, {left}, {mode}, "
            f"{value})"]


@lowering("pad3d_grad", host=True)
def _pad3d_grad_lower(ctx):
    if not ctx.has_output("X@GRAD"):
        return []
    X, g, fmt = ctx.inp("X"), ctx.inp("Out@GRAD"), ctx.attrs["data_format"]
    if ctx.rank("X") != 5 or ctx.dtype("Out@GRAD") not in _REAL:
        return None
    args = _pad3d_args(ctx)
    if args is None:
        return None
    front, top, left = args[0]
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    mode = _PAD_MODES[ctx.attrs["mode"]]
    return [f"{ctx.lib_fn('pad3d_grad')}("
            f"{_view5(g, fmt)}, {_view5(dx, fmt)}, {front}, {top}, {left}, "
            f"{mode})"]


def _interp_scales(ctx) -> tuple:
    """Source of (scale_h, scale_w) as the kernel sees them (-1.0: none), or None when the
    scale attribute is refused."""
    if ctx.has_input("SizeTensor"):
        return "-1.0", "-1.0"
    if ctx.has_input("Scale"):
        S = ctx.inp("Scale")
        return f"float({S}[0])", f"float({S}[1 if {S}.size > 1 else 0])"
    try:
        sh, sw = _attr_scales(ctx.attrs["scale"])
    except ShapeMismatch:
        return None
    return src_literal(sh), src_literal(sw)


def _interp_geometry(ctx, X, ah, aw, out_size) -> list | None:
    """Lines binding ``oh, ow, rh, rw`` (the names in ``out_size``) for a resize of ``X``: the
    output size and the ratios from the op's inputs and attributes."""
    scales = _interp_scales(ctx)
    if scales is None:
        return None
    sh, sw = scales
    oh, ow, rh, rw = out_size
    lines = []
    if ctx.has_input("Scale") and not ctx.has_input("SizeTensor"):
        lines.append(f"_rt.check({sh} > 0.0 and {sw} > 0.0)")
    if ctx.has_input("SizeTensor"):
        st = [ctx.inp("SizeTensor", i) for i in range(2)]
        size, sized = [f"int({t}.reshape({t}.size)[0])" for t in st], 2
    elif ctx.has_input("OutSize"):
        o = ctx.inp("OutSize")
        size, sized = [f"int({o}[0])", f"int({o}[1])"], 1
    else:
        size, sized = ["0", "0"], 0
    lines.append(f"{oh}, {ow} = {ctx.lib_fn('interp_out_size')}({X}.shape[{ah}], {X}.shape[{aw}], "
                 f"{int(ctx.attrs['out_h'])}, {int(ctx.attrs['out_w'])}, {sh}, {sw}, "
                 f"{size[0]}, {size[1]}, {sized})")
    align = bool(ctx.attrs["align_corners"])
    lines += [f"{rh} = {ctx.lib_fn('interp_ratio')}({X}.shape[{ah}], {oh}, {align}, {sh})",
              f"{rw} = {ctx.lib_fn('interp_ratio')}({X}.shape[{aw}], {ow}, {align}, {sw})"]
    return lines


def _interp_kernel_args(ctx) -> tuple:
    nearest = ctx.attrs["interp_method"] == "nearest"
    flag = bool(ctx.attrs["align_corners"]) if nearest else \
        ctx.attrs["align_mode"] == 0 and not ctx.attrs["align_corners"]
    return ("interp_nearest" if nearest else "interp_bilinear"), flag


def _view4(local, ah) -> str:
    if ah != 2:
        return local
    return f"{local}.reshape(({local}.shape[0] * {local}.shape[1], {local}.shape[2], " \
           f"{local}.shape[3], 1))"


@lowering("nearest_interp", "bilinear_interp", "nearest_interp_v2", "bilinear_interp_v2", host=True)
def _interp_lower(ctx):
    X = ctx.inp("X")
    try:
        ah, aw = _interp_check(VarMeta(ctx.shape("X"), ctx.dtype("X")),
                               ctx.attrs["interp_method"], ctx.attrs["data_layout"],
                               ctx.attrs["align_mode"])
    except ShapeMismatch:
        return None
    if ctx.dtype("X") not in _DATA:
        return None
    names = [ctx.tmp(h) for h in ("oh", "ow", "rh", "rw")]
    lines = _interp_geometry(ctx, X, ah, aw, names)
    if lines is None:
        return None
    oh, ow, rh, rw = names
    dims = [f"{X}.shape[{i}]" for i in range(4)]
    dims[ah], dims[aw] = oh, ow
    out, T = ctx.out("Out"), ctx.T("X")
    kernel, flag = _interp_kernel_args(ctx)
    if kernel == "interp_bilinear" and ctx.dtype("X") not in _REAL:
        # integer images: interpolated in float32, truncated back (Paddle's casts)
        xf, of = ctx.tmp("xf"), ctx.tmp("of")
        return lines + [
            f"{xf} = {X}.astype(np.float32)",
            f"{of} = np.empty({ctx.tuple_src(dims)}, np.float32)",
            f"{ctx.lib_fn(kernel)}({_view4(xf, ah)}, {_view4(of, ah)}, {rh}, {rw}, {flag})",
            f"{out} = {of}.astype({T})"]
    return lines + [
        f"{out} = np.empty({ctx.tuple_src(dims)}, {T})",
        f"{ctx.lib_fn(kernel)}({_view4(X, ah)}, {_view4(out, ah)}, {rh}, {rw}, {flag})"]


@lowering("nearest_interp_grad", "bilinear_interp_grad", "nearest_interp_v2_grad",
          "bilinear_interp_v2_grad", host=True)
def _interp_grad_lower(ctx):
    if not ctx.has_output("X@GRAD"):
        return []
    X, g = ctx.inp("X"), ctx.inp("Out@GRAD")
    try:
        ah, aw = _interp_check(VarMeta(ctx.shape("X"), ctx.dtype("X")),
                               ctx.attrs["interp_method"], ctx.attrs["data_layout"],
                               ctx.attrs["align_mode"])
    except ShapeMismatch:
        return None
    if ctx.dtype("Out@GRAD") not in _REAL:
        return None
    scales = _interp_scales(ctx)
    if scales is None:
        return None
    align = bool(ctx.attrs["align_corners"])
    rh, rw = ctx.tmp("rh"), ctx.tmp("rw")
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    kernel, flag = _interp_kernel_args(ctx)
    c = 1 if ah == 2 else 3
    return [f"_rt.check({g}.shape[0] == {X}.shape[0] and {g}.shape[{c}] == {X}.shape[{c}])",
            f"{rh} = {ctx.lib_fn('interp_ratio')}("
            f"{X}.shape[{ah}], {g}.shape[{ah}], {align}, {scales[0]})",
            f"{rw} = {ctx.lib_fn('interp_ratio')}("
            f"{X}.shape[{aw}], {g}.shape[{aw}], {align}, {scales[1]})",
            f"{ctx.lib_fn(kernel + '_grad')}("
            f"{_view4(g, ah)}, {_view4(dx, ah)}, {rh}, {rw}, {flag})"]


def _view3_src(local, rank, axis) -> str:
    lead = " * ".join(f"{local}.shape[{i}]" for i in range(axis)) or "1"
    rest = " * ".join(f"{local}.shape[{i}]" for i in range(axis + 1, rank)) or "1"
    return f"{local}.reshape(({lead}, {local}.shape[{axis}], {rest}))"


@lowering("affine_channel", host=True)
def _affine_lower(ctx):
    X, r = ctx.inp("X"), ctx.rank("X")
    if r < 2 or ctx.dtype("X") not in _REAL or ctx.attrs["data_layout"] not in _LAYOUTS:
        return None
    axis = _channel_axis(r, ctx.attrs["data_layout"])
    out = ctx.out("Out", shape=f"{X}.shape")
    S, B = ctx.inp("Scale"), ctx.inp("Bias")
    return [f"_rt.check({S}.shape[0] == {X}.shape[{axis}] and {B}.shape[0] == {S}.shape[0])",
            f"{ctx.lib_fn('affine_channel')}({_view3_src(X, r, axis)}, {S}, {B}, "
            f"{_view3_src(out, r, axis)})"]


@lowering("affine_channel_grad", host=True)
def _affine_grad_lower(ctx):
    X, r = ctx.inp("X"), ctx.rank("X")
    if r < 2 or ctx.dtype("X") not in _REAL or ctx.attrs["data_layout"] not in _LAYOUTS:
        return None
    wants = [ctx.has_output(s) for s in ("X@GRAD", "Scale@GRAD", "Bias@GRAD")]
    if not any(wants):
        return []
    axis = _channel_axis(r, ctx.attrs["data_layout"])
    S, g, T = ctx.inp("Scale"), ctx.inp("Out@GRAD"), ctx.T("X")
    lines = [f"_rt.check({g}.shape == {X}.shape and {S}.shape[0] == {X}.shape[{axis}])"]
    dx = _view3_src(ctx.out("X@GRAD", shape=f"{X}.shape"), r, axis) if wants[0] else None
    if dx is None:
        dx = ctx.tmp("dx")
        lines.append(f"{dx} = np.empty((0, 0, 0), {T})")
    grads = []
    for slot, want in (("Scale@GRAD", wants[1]), ("Bias@GRAD", wants[2])):
        if want:
            grads.append(ctx.out(slot, shape=f"({S}.shape[0],)"))
        else:
            grads.append(ctx.tmp("d"))
            lines.append(f"{grads[-1]} = np.empty((0,), {T})")
    lines.append(f"{ctx.lib_fn('affine_channel_grad')}({_view3_src(X, r, axis)}, {S}, "
                 f"{_view3_src(g, r, axis)}, {dx}, {grads[0]}, {grads[1]}, {wants[0]}, "
                 f"{wants[1]}, {wants[2]})")
    return lines
