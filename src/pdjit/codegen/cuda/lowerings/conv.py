"""The convolutions of :mod:`pdjit.ops.conv` (``conv2d``, ``depthwise_conv2d``, the transposed
ones, and their gradients) on the device, NCHW or NHWC: an implicit GEMM (``_cu.conv2d_*``, a
tiled shared-memory product with the patch matrix gathered on the fly), or one thread per
element of the output summing what meets it directly (a filter of one channel per group: see
:func:`_tiled`). The geometry is run-time arguments, so layers share the kernels. A transposed
convolution runs on the convolution's kernels (its output is the convolution's input gradient).
"""
from __future__ import annotations

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.ops.conv import Geometry, _float_ok, _geometry, _t_out_src, image_dims


def _device_geometry(ctx, g: Geometry, X: str, kh: int, kw: int) -> tuple:
    """(driver lines binding the geometry as locals, their names ``sh, sw, pt, pl, dh, dw,
    groups``): run-time arguments of the device kernels, so layers share them. SAME pads come
    from the image's run-time size in its own layout."""
    names = [ctx.tmp(h) for h in ("sh", "sw", "pt", "pl", "dh", "dw", "gr")]
    _, _, h, w = image_dims(g, X)
    pt, _, dh = g.src_window(0, h, kh)
    pl, _, dw = g.src_window(1, w, kw)
    vals = [str(g.strides[0]), str(g.strides[1]), pt, pl, dh, dw, str(ctx.attrs["groups"])]
    return [f"{n} = int({v})" for n, v in zip(names, vals)], names


def image_index(g: Geometry):
    """(index source of element (n, c, h, w) of an image, source of its N, C, H, W sizes)."""
    if g.nhwc:
        return (lambda a, n, c, h, w: f"{a}[{n}, {h}, {w}, {c}]",
                lambda a: (f"{a}.shape[0]", f"{a}.shape[3]", f"{a}.shape[1]", f"{a}.shape[2]"))
    return (lambda a, n, c, h, w: f"{a}[{n}, {c}, {h}, {w}]",
            lambda a: tuple(f"{a}.shape[{i}]" for i in range(4)))


def _conv_sizes(g: Geometry, x: str, w: str, y: str, gr: str) -> list:
    """Kernel lines every thread runs first: the sizes of image ``x`` [N, C, H, W], filter
    ``w`` [M, C/g, KH, KW] and output (gradient) ``y`` [N, M, OH, OW] (NCHW, or NHWC)."""
    _, dims = image_index(g)
    n, c, h, wd = dims(x)
    _, _, oh, ow = dims(y)
    return [f"N_ = {n}", f"C_ = {c}", f"H_ = {h}", f"W_ = {wd}", f"M_ = {w}.shape[0]",
            f"CG_ = {w}.shape[1]", f"KH_ = {w}.shape[2]", f"KW_ = {w}.shape[3]",
            f"OH_ = {oh}", f"OW_ = {ow}", f"MG_ = M_ // {gr}"]


def _unravel(i: str, names: list, dims: list) -> list:
    """Lines unravelling flat index ``i`` into ``names`` over ``dims`` (row-major)."""
    lines = [f"t_ = {i}"]
    for n, d in zip(reversed(names[1:]), reversed(dims[1:])):
        lines += [f"{n} = t_ % {d}", f"t_ = t_ // {d}"]
    return lines + [f"{names[0]} = t_"]


def _fwd_body(g: Geometry, T: str, geo, X: str, W: str, y: str, i: str) -> list:
    """Kernel lines of element ``i`` of convolution output ``y`` (image ``X``, filter ``W``):
    the sum of what meets it directly. ``geo``: the geometry's local names."""
    at, _ = image_index(g)
    sh, sw, pt, pl, dh, dw, _ = geo
    return _unravel(i, ["nb", "m_", "oh_", "ow_"], ["N_", "M_", "OH_", "OW_"]) + [
        f"acc = {T}(0)",
        "c0 = (m_ // MG_) * CG_",
        "for c_ in range(CG_):",
        "    for a_ in range(KH_):",
        f"        ih = oh_ * {sh} - {pt} + a_ * {dh}",
        "        if ih >= 0 and ih < H_:",
        "            for b_ in range(KW_):",
        f"                iw = ow_ * {sw} - {pl} + b_ * {dw}",
        "                if iw >= 0 and iw < W_:",
        f"                    acc += {at(X, 'nb', 'c0 + c_', 'ih', 'iw')} * "
        f"{W}[m_, c_, a_, b_]",
        f"{at(y, 'nb', 'm_', 'oh_', 'ow_')} = acc"]


def _data_body(g: Geometry, T: str, geo, DY: str, W: str, dx: str, i: str) -> list:
    """Kernel lines of element ``i`` of a convolution's input gradient ``dx`` (output gradient
    ``DY``, filter ``W``): also a transposed convolution's output."""
    at, _ = image_index(g)
    sh, sw, pt, pl, dh, dw, _ = geo
    return _unravel(i, ["nb", "c_", "ih", "iw"], ["N_", "C_", "H_", "W_"]) + [
        f"acc = {T}(0)",
        "cg = c_ % CG_",
        "m0 = (c_ // CG_) * MG_",
        "for q_ in range(MG_):",
        "    m_ = m0 + q_",
        "    for a_ in range(KH_):",
        f"        th = ih + {pt} - a_ * {dh}",
        f"        if th >= 0 and th % {sh} == 0 and th // {sh} < OH_:",
        f"            oh_ = th // {sh}",
        "            for b_ in range(KW_):",
        f"                tw = iw + {pl} - b_ * {dw}",
        f"                if tw >= 0 and tw % {sw} == 0 and tw // {sw} < OW_:",
        f"                    acc += {at(DY, 'nb', 'm_', 'oh_', f'tw // {sw}')} * "
        f"{W}[m_, cg, a_, b_]",
        f"{at(dx, 'nb', 'c_', 'ih', 'iw')} = acc"]


def _filter_body(g: Geometry, T: str, geo, X: str, DY: str, dwt: str, j: str) -> list:
    """Kernel lines of element ``j`` of a convolution's filter gradient ``dwt`` (image ``X``,
    output gradient ``DY``)."""
    at, _ = image_index(g)
    sh, sw, pt, pl, dh, dw, _ = geo
    return _unravel(j, ["m_", "c_", "a_", "b_"], ["M_", "CG_", "KH_", "KW_"]) + [
        f"acc = {T}(0)",
        "ci = (m_ // MG_) * CG_ + c_",
        "for nb in range(N_):",
        "    for oh_ in range(OH_):",
        f"        ih = oh_ * {sh} - {pt} + a_ * {dh}",
        "        if ih >= 0 and ih < H_:",
        "            for ow_ in range(OW_):",
        f"                iw = ow_ * {sw} - {pl} + b_ * {dw}",
        "                if iw >= 0 and iw < W_:",
        f"                    acc += {at(DY, 'nb', 'm_', 'oh_', 'ow_')} * "
        f"{at(X, 'nb', 'ci', 'ih', 'iw')}",
        f"{dwt}[m_, c_, a_, b_] = acc"]


def _tiled(ctx) -> bool:
    """Whether a device convolution runs as an implicit GEMM (``_cu.conv2d_*``, a tiled
    shared-memory product with the patch matrix gathered on the fly) or keeps the direct loops
    (one thread per element computed): the direct loops serve a filter of one channel per group
    (``Filter.shape[1] == 1``: a depthwise convolution, or a transposed one whose groups each
    make one output channel). There each output row of the product is a dot of only ``KH*KW``
    terms (the input gradient has a single row per group): a GEMM tile would be mostly padding
    and its shared-memory staging cost more than the products it feeds, while a thread per
    element reads each operand once from the cache."""
    return ctx.shape("Filter")[1] != 1


def _igemm(fn: str, a: str, b: str, out: str, g: Geometry, geo) -> str:
    """The driver's call of an implicit-GEMM convolution kernel ``_cu.<fn>`` (arguments as in
    :mod:`pdjit.codegen.cuda.lib.conv`: images in the op's layout, geometry as locals)."""
    return f"_cu.{fn}({a}, {b}, {out}, {g.nhwc}, {', '.join(geo)})"


#: the direct body (one thread per element) of each rule of the implicit GEMM
_DIRECT = {"conv2d_fwd": _fwd_body, "conv2d_bwd_data": _data_body,
           "conv2d_bwd_filter": _filter_body}


def _device_conv(ctx, rule: str, a: str, b: str, out: str, g: Geometry, T: str, geo,
                 tiled: bool, sizes: list) -> list:
    """Lines computing ``out`` from ``a`` and ``b`` by one of the convolution's rules (forward,
    input gradient, filter gradient: ``_cu.<rule>``'s operands): the implicit GEMM when
    ``tiled``, else one thread per element of ``out`` (``sizes``: the lines binding the
    direct body's sizes)."""
    if tiled:
        return [_igemm(rule, a, b, out, g, geo)]
    i = ctx.tmp("i")
    return ctx.device_loop(i, f"{out}.size", _DIRECT[rule](g, T, geo, a, b, out, i),
                           before=sizes)


def _conv_device_lines(ctx, grad: bool) -> list | None:
    """A convolution (``grad``: its gradients) on a device target, NCHW or NHWC: an implicit
    GEMM (:func:`_tiled`), or one thread per element of the output (image gradient, filter
    gradient) summing what meets it directly (no workspace)."""
    g = _geometry(ctx.attrs, ctx.op.type)
    X, W = ctx.inp("Input"), ctx.inp("Filter")
    _, _, kh, kw = ctx.shape("Filter")
    if min(kh, kw) < 1:
        return None
    T = ctx.T("Input")
    _, dims = image_index(g)
    lines, geo = _device_geometry(ctx, g, X, kh, kw)
    gr = geo[6]
    # what the kernels index by must fit (a kernel cannot raise): else the reference names it
    n, c, h, w = image_dims(g, X)
    lines.append(f"_rt.check({W}.ndim == 4 and {W}.shape[0] % {gr} == 0 and "
                 f"{c} == {W}.shape[1] * {gr})")
    tiled = _tiled(ctx)
    if not grad:
        y = ctx.out("Output", shape="(" + ", ".join(g.image(
            n, f"{W}.shape[0]", g.src_conv_out(0, h, kh), g.src_conv_out(1, w, kw))) + ")")
        return lines + _device_conv(ctx, "conv2d_fwd", X, W, y, g, T, geo, tiled,
                                    _conv_sizes(g, X, W, y, gr))
    DY = ctx.inp("Output@GRAD")
    want = (n, f"{W}.shape[0]", g.src_conv_out(0, h, kh), g.src_conv_out(1, w, kw))
    lines.append("_rt.check(" + " and ".join(
        f"{got} == {exp}" for got, exp in zip(dims(DY), want)) + f" and {DY}.ndim == 4)")
    if ctx.has_output("Input@GRAD"):
        dx = ctx.out("Input@GRAD", shape=f"{X}.shape")
        lines += _device_conv(ctx, "conv2d_bwd_data", DY, W, dx, g, T, geo, tiled,
                              _conv_sizes(g, X, W, DY, gr))
    if ctx.has_output("Filter@GRAD"):
        dwt = ctx.out("Filter@GRAD", shape=f"{W}.shape")
        lines += _device_conv(ctx, "conv2d_bwd_filter", X, DY, dwt, g, T, geo, tiled,
                              _conv_sizes(g, X, W, DY, gr))
    return lines


def _t_device_geometry(ctx, g: Geometry, X: str, kh: int, kw: int) -> tuple:
    """(driver lines, names ``sh, sw, pt, pl, dh, dw, groups``) of the convolution a transposed
    one transposes, on a device target: ``_t_args``'s values (SAME pads from the transposed
    op's input ``X``) as run-time arguments."""
    s0, s1 = g.strides
    if g.algo == "VALID":
        vals = [s0, s1, 0, 0, g.dilations[0], g.dilations[1]]
    elif g.algo != "SAME":
        vals = [s0, s1, g.pads[0], g.pads[2], g.dilations[0], g.dilations[1]]
    else:
        _, _, h, w = image_dims(g, X)
        vals = [s0, s1, g.src_window(0, h, kh)[0], g.src_window(1, w, kw)[0], 1, 1]
    names = [ctx.tmp(h) for h in ("sh", "sw", "pt", "pl", "dh", "dw", "gr")]
    vals.append(ctx.attrs["groups"])
    return [f"{n} = int({v})" for n, v in zip(names, vals)], names


def _convt_device_lines(ctx, grad: bool) -> list | None:
    """A transposed convolution (``grad``: its gradients) on a device target, from the
    convolution's kernels: its output is the convolution's input gradient (the transposed
    op's Input as the output gradient, Filter [C, M/groups, KH, KW] as the filter); its input
    gradient is the convolution of Output@GRAD; its filter gradient the convolution's, with
    Output@GRAD as the image and Input as the output gradient. An implicit GEMM where
    :func:`_tiled`, else one thread per element."""
    g = _geometry(ctx.attrs, ctx.op.type)
    X, W = ctx.inp("Input"), ctx.inp("Filter")
    _, _, kh, kw = ctx.shape("Filter")
    if min(kh, kw) < 1:
        return None
    T = ctx.T("Input")
    _, dims = image_index(g)
    lines, geo = _t_device_geometry(ctx, g, X, kh, kw)
    gr = geo[6]
    n, c, _, _ = image_dims(g, X)
    lines.append(f"_rt.check({W}.ndim == 4 and {X}.ndim == 4 and {W}.shape[0] % {gr} == 0 "
                 f"and {c} == {W}.shape[0])")
    # (the output's shape is computed before these lines run: over the inputs and attributes)
    out = (n, f"{W}.shape[1] * {int(ctx.attrs['groups'])}", _t_out_src(ctx, g, X, 0, kh),
           _t_out_src(ctx, g, X, 1, kw))
    tiled = _tiled(ctx)
    if not grad:
        y = ctx.out("Output", shape="(" + ", ".join(g.image(*out)) + ")")
        return lines + _device_conv(ctx, "conv2d_bwd_data", X, W, y, g, T, geo, tiled,
                                    _conv_sizes(g, y, W, X, gr))
    DY = ctx.inp("Output@GRAD")
    lines.append("_rt.check(" + " and ".join(
        f"{got} == {exp}" for got, exp in zip(dims(DY), out)) + f" and {DY}.ndim == 4)")
    if ctx.has_output("Input@GRAD"):
        dx = ctx.out("Input@GRAD", shape=f"{X}.shape")
        lines += _device_conv(ctx, "conv2d_fwd", DY, W, dx, g, T, geo, tiled,
                              _conv_sizes(g, DY, W, dx, gr))
    if ctx.has_output("Filter@GRAD"):
        dwt = ctx.out("Filter@GRAD", shape=f"{W}.shape")
        lines += _device_conv(ctx, "conv2d_bwd_filter", DY, X, dwt, g, T, geo, tiled,
                              _conv_sizes(g, DY, W, X, gr))
    return lines


@lowering("conv2d", "depthwise_conv2d", host=True)
def _conv_lower(ctx):
    if not _float_ok(ctx, "Input", "Filter"):
        return None
    return _conv_device_lines(ctx, grad=False)


@lowering("conv2d_grad", "depthwise_conv2d_grad", host=True)
def _conv_grad_lower(ctx):
    if not _float_ok(ctx, "Input", "Filter", "Output@GRAD"):
        return None
    return _conv_device_lines(ctx, grad=True)


@lowering("conv2d_transpose", "depthwise_conv2d_transpose", host=True)
def _convt_lower(ctx):
    if not _float_ok(ctx, "Input", "Filter"):
        return None
    return _convt_device_lines(ctx, grad=False)


@lowering("conv2d_transpose_grad", "depthwise_conv2d_transpose_grad", host=True)
def _convt_grad_lower(ctx):
    if not _float_ok(ctx, "Input", "Filter", "Output@GRAD"):
        return None
    return _convt_device_lines(ctx, grad=True)
