"""The convolutions of :mod:`pdjit.ops.conv` (``conv2d``, ``depthwise_conv2d``, the transposed
ones, and their gradients) on the CPU.

Three library kernels (``pdjit.codegen.cpu.lib.conv``) compute the forward pass and both
gradients of a convolution on NCHW float32/float64 data (NHWC is copied to and from NCHW around
them); a transposed convolution's forward pass is the input gradient of the convolution it
transposes, its input gradient is a convolution, and its filter gradient the filter gradient
with the roles of image and output exchanged. Sizes and attributes are arguments, so every
layer shares the compiled kernels. A convolution followed by a per-channel bias and clamp runs
by blocks of samples (``_conv_blocked``), the epilogue applied as the kernels store; a 1x1
stride-1 one whose filter is a weight, or any one of one group onto a small plane, runs there on
pdjit's packed GEMM with the filter packed once (``_pointwise``:
``pdjit.codegen.cpu.lib.pointwise``) where its sizes take it.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from pdjit.codegen.cpu.lib.channels_last import MAX_PLANE
from pdjit.codegen.cpu.lib.conv import _dw_by_taps, _use_gemm, by_forward, use_direct
from pdjit.codegen.cpu.lib.pointwise import usable
from pdjit.codegen.cpu.lib.winograd import may_take
from pdjit.codegen.cpu.lowerings import lowering
from pdjit.codegen.lowering import weight_var
from pdjit.framework import registry
from pdjit.ops.conv import (
    Geometry,
    _float_ok,
    _geometry,
    _t_out_src,
    image_dims,
)


def _arg_list(g: Geometry, X: str, kh: int, kw: int, groups: int) -> list:
    """The geometry arguments of a library call: ``sh, sw, pt, pl, dh, dw, groups``, with the
    pads of SAME worked out from the run-time size of the image ``X`` (NCHW local)."""
    pt, _, dh = g.src_window(0, f"{X}.shape[2]", kh)
    pl, _, dw = g.src_window(1, f"{X}.shape[3]", kw)
    return [str(g.strides[0]), str(g.strides[1]), pt, pl, dh, dw, str(groups)]


def _args(g: Geometry, X: str, kh: int, kw: int, groups: int) -> str:
    return ", ".join(_arg_list(g, X, kh, kw, groups))


def as_nchw(ctx, g: Geometry, local: str) -> list:
    """(lines, local) of ``local`` as an NCHW array."""
    if not g.nhwc:
        return [], local
    t = ctx.tmp("c")
    return [f"{t} = {ctx.lib_fn('nchw')}({local})"], t


def _conv_blocked(ctx):
    """The convolution by blocks of samples (NCHW float data and a filter of known shape), for
    an epilogue after each block (see ``Opaque.blocked``)."""
    g = _geometry(ctx.attrs, ctx.op.type)
    m, cg, kh, kw = ctx.shape("Filter")
    groups = ctx.attrs["groups"]
    if g.nhwc:
        return _nhwc_blocked(ctx, g) if channels_last(ctx.op) else None
    if not _float_ok(ctx, "Input", "Filter") or min(m, cg, kh, kw) < 1:
        return None
    X, W = ctx.inp("Input"), ctx.inp("Filter")
    n, _, h, w = image_dims(g, X)
    y = ctx.out("Output", shape=f"({n}, {W}.shape[0], {g.src_conv_out(0, h, kh)}, "
                                f"{g.src_conv_out(1, w, kw)})")
    direct = use_direct(cg, m // groups)
    wino = may_take(m, cg, kh, kw, g.strides, g.dilations, groups)
    args = _arg_list(g, X, kh, kw, groups)
    packed = "" if direct else _pointwise(ctx, g, m, cg, kh, kw, args)
    lines = [f"_rt.check({ctx.lib_fn('conv._fits_native')}({X}, {y}, {W}, {groups}))"]
    pro = ctx.channel_prologue("Input", ctx.T("Input"), lines)
    if pro is not None and packed != "pointwise_range_rows":  # (the image through it first)
        X = _through(ctx, X, pro, lines)
        pro = None
    if not direct and not packed and _subsampled(ctx, g, m, cg, kh, kw, args):
        # a 1x1 strided filter: the image's rows and columns it reads, then a stride-1 one
        xs = ctx.tmp("xs")
        lines += [f"{xs} = np.empty(({X}.shape[0], {X}.shape[1], {y}.shape[2], {y}.shape[3]), "
                  f"{ctx.T('Input')})",
                  f"{ctx.lib_fn('conv.subsample')}({X}, {args[0]}, {args[1]}, {xs})"]
        X, args, packed = xs, ["1", "1", "0", "0"] + args[4:], "pointwise_range_rows"
    fn = ctx.lib_fn("conv._direct_range" if direct else
                    "pointwise_range_prologue" if pro is not None else packed or
                    ("conv._fwd_range_3x3" if wino else "conv._fwd_range"))
    # the per-channel bias, residual (not for the direct loops) and clamp after it, applied as
    # the kernels store (when they fit)
    epi = ctx.channel_epilogue(ctx.T("Output"), lines, residual=not direct)
    lines.append(f"_rt.check({epi[0]}.size == 0 or {epi[0]}.size == {W}.shape[0])")
    before = [X, W, y]
    if packed:  # the filter packed once (kept beside the weight), for the plane's size
        ap = ctx.tmp("ap")
        lines.append(f"{ap} = {ctx.lib_fn('pointwise_weight')}({W}, "
                     f"{_packed_args(g, X, kh, kw, args, wino)})")
        before = [X, W, ap, y]
    return lines, fn, before, args + epi + (pro or []), f"{y}.size * {W}[0].size"


def _through(ctx, X: str, pro: list, lines: list) -> str:
    """A copy of image ``X`` through the channel prologue ``pro`` (``ctx.channel_prologue``'s
    arguments), made by the lines appended to ``lines``: for a kernel that does not apply one
    as it reads."""
    xs = ctx.tmp("xp")
    lines += [f"{xs} = np.empty({X}.shape, {ctx.T('Input')})",
              f"{ctx.lib_fn('prologue_into')}({X}, 0, {X}.shape[0], {', '.join(pro)}, {xs})"]
    return xs


def _prologue_slot(op) -> str | None:
    """``"Input"`` where the convolution ``op`` reads its image through a per-channel product,
    sum and clamp as the packed row tiles pack its panels (``Opaque.channel_prologue``;
    ``pointwise.pointwise_range_prologue``): NCHW, float32, a filter that is a weight, 1x1,
    stride 1, unpadded, one group, onto a plane known when lowering that the row tiles
    serve (``pointwise.usable``)."""
    got = _float32_image_and_weight(op)
    if got is None:
        return None
    x, w, attrs = got
    if attrs.get("data_format") == "NHWC" or min(x.shape[1:]) < 1:
        return None
    g = _geometry({**attrs, "data_format": "NCHW"}, op.type)
    m, cg, kh, kw = w.shape
    if kh != 1 or kw != 1 or tuple(g.strides) != (1, 1) or any(g.pads) or \
            int(attrs.get("groups", 1) or 1) != 1 or x.shape[1] != cg:
        return None
    p = x.shape[2] * x.shape[3]
    return "Input" if usable(m, cg, 1, 1, 1, 1, 0, 0, 1, 1, 1, p=p) == \
        "pointwise_range_rows" else None


#: the fewest input channels of a convolution of one group that runs on NHWC images whatever
#: its plane (above ``MAX_PLANE`` too): its 1x1 layers are products of ``K`` >= 64 on the
#: packed GEMM's tile, its 3x3 stride-1 ones on Winograd's NHWC kernel. Measured on a 2-vCPU
#: AMD EPYC (Zen 3, AVX2), ResNet-50 at batch 1, one thread, ms, NCHW kernels / NHWC: 56x56
#: 64->64 1x1 0.60 / 0.35, 64->256 2.09 / 1.50, 256->64 1.70 / 1.46, 3x3 64->64 2.48 / 1.71,
#: 28x28 3x3 128->128 2.50 / 1.66, 1x1 512->128 1.47 / 1.42, its stride-2 layers from 56x56
#: 3.4 / 3.8 (3x3) and 3.0 / 3.1 (1x1); MobileNetV2's 56x56 1x1 144->24 0.48 / 0.36, but
#: 32->16 0.36 / 0.46, 24->144 0.40 / 0.46 and its 3x3 stem from 3 channels 0.73 / 1.53.
#: Filters of at most 9 taps only (1x1, 3x3, 1x7): AlexNet's 5x5 64 -> 192 onto 27x27 at
#: batch 1 on two threads took 3.67 ms on NHWC images against 2.56 on the NCHW taps kernel
WIDE_CHANNELS = 64


def channels_last(op) -> bool:
    """Whether a kernel of :mod:`pdjit.codegen.cpu.lib.channels_last` serves the convolution
    ``op`` on NHWC images (what the inference pass ``channels_last`` asks the target): float32,
    planes known when lowering, a filter that is a weight (persistable, written by no op), and
    either, on a plane of at most ``MAX_PLANE`` pixels, 1x1, stride 1, no padding, one group
    (:func:`~pdjit.codegen.cpu.lib.channels_last.pointwise_nhwc`) or one filter per channel
    (:func:`~pdjit.codegen.cpu.lib.channels_last.depthwise_nhwc`), or any other of one group
    onto a plane of at most ``MAX_PLANE`` pixels from one at most the strides' product larger
    (:func:`~pdjit.codegen.cpu.lib.channels_last.conv_nhwc`; a 3x3 stride-1 one that
    Winograd's kernel may take, :func:`~pdjit.codegen.cpu.lib.winograd.may_take`, padded by
    at most 2: :func:`~pdjit.codegen.cpu.lib.channels_last.winograd_nhwc`); on a larger plane
    the same kernels for one of one group that reads at least :data:`WIDE_CHANNELS` channels
    through a filter of at most 9 taps (on larger planes with fewer channels or larger
    filters, and for depthwise ones, the NCHW kernels measured faster)."""
    return _channels_last_kind(op) is not None


def _weight_filter(op):
    """The convolution's filter variable where it is a weight: persistable and written by no
    op of the program (a packed or transformed copy made once stays valid); else None."""
    ws = op.input("Filter")
    return weight_var(op, ws[0]) if len(ws) == 1 else None


def _float32_image_and_weight(op):
    """``(image variable, filter variable, attributes)`` of the convolution ``op`` where its
    image and its filter are float32 of rank 4 and the filter is a weight (``_weight_filter``);
    else None."""
    xs = op.input("Input")
    x = op.block._find_var_recursive(xs[0]) if len(xs) == 1 else None
    w = _weight_filter(op)
    if x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4 or \
            np.dtype(x.dtype) != np.float32 or np.dtype(w.dtype) != np.float32:
        return None
    return x, w, op.opdef.attr_values(op.all_attrs())


def _channels_last_kind(op) -> str | None:
    got = _float32_image_and_weight(op)
    if got is None or min(got[1].shape) < 1:
        return None
    x, w, attrs = got
    m, cg, kh, kw = w.shape
    groups = int(attrs.get("groups", 1) or 1)
    g = _geometry({**attrs, "data_format": "NCHW"}, op.type)
    nhwc = attrs.get("data_format") == "NHWC"
    c = x.shape[3] if nhwc else x.shape[1]
    h, w_ = (x.shape[1], x.shape[2]) if nhwc else (x.shape[2], x.shape[3])
    if h < 1 or w_ < 1:
        return None
    small, wide = h * w_ <= MAX_PLANE, groups == 1 and cg >= WIDE_CHANNELS and kh * kw <= 9
    if small or wide:
        if groups == 1 and kh == kw == 1 and tuple(g.strides) == (1, 1) and \
                (g.algo != "EXPLICIT" or not any(g.pads)):
            return "pointwise_nhwc"
        if small and cg == 1 and m == groups and (c < 0 or c == m):
            return "depthwise_nhwc"
    # (a strided one may read a larger plane: ResNet-50's 3x3 and 1x1 stride-2 layers into
    # 14x14 from 28x28)
    if groups != 1 or not wide and h * w_ > MAX_PLANE * g.strides[0] * g.strides[1]:
        return None
    try:
        out = g.conv_out(0, h, kh) * g.conv_out(1, w_, kw)
    except ValueError:  # (a window larger than the image: its lowering says so)
        return None
    if out > MAX_PLANE and not wide:
        return None
    if may_take(m, cg, kh, kw, g.strides, g.dilations, groups) and \
            (g.algo != "EXPLICIT" or max(g.pads) <= 2):
        return "winograd_nhwc"
    return "conv_nhwc"


def _nhwc_blocked(ctx, g: Geometry):
    """:func:`_conv_blocked` for an NHWC convolution that :func:`channels_last` accepts."""
    kind = _channels_last_kind(ctx.op)
    X, W = ctx.inp("Input"), ctx.inp("Filter")
    m, _, kh, kw = ctx.shape("Filter")
    n, _, h, w = image_dims(g, X)
    oh, ow = g.src_conv_out(0, h, kh), g.src_conv_out(1, w, kw)
    y = ctx.out("Output", shape=f"({n}, {oh}, {ow}, {W}.shape[0])")
    lines = [f"_rt.check({X}.shape[3] == {W}.shape[1] * {ctx.attrs['groups']})"]
    # (conv_nhwc's tiles and Winograd's output transform take no gate: a hard_swish after
    # them runs as an op of its own)
    epi = ctx.channel_epilogue(ctx.T("Output"), lines, residual=True,
                               gate=kind in ("pointwise_nhwc", "depthwise_nhwc"))
    wt = ctx.tmp("wt")
    lines.append(f"{wt} = {ctx.lib_fn(kind + '_weight')}({W})")
    fn = ctx.lib_fn(kind)
    if kind == "pointwise_nhwc":
        return lines, fn, [X, wt, y], epi, f"{y}.size * {W}.shape[1]"
    pt, _, dh = g.src_window(0, f"{X}.shape[1]", kh)
    pl, _, dw = g.src_window(1, f"{X}.shape[2]", kw)
    geo = [str(g.strides[0]), str(g.strides[1]), pt, pl, dh, dw, str(kh), str(kw)]
    return lines, fn, [X, wt, y], geo + epi, f"{y}.size * {W}[0].size"


def _packed_args(g: Geometry, X: str, kh: int, kw: int, args: list, wino: bool) -> str:
    """The arguments of ``pointwise_weight`` after the filter: the output plane's pixels, the
    batch, whether the image is its own patches (1x1, stride 1, unpadded) and, for a filter
    Winograd's kernel may take, its tiles per sample (0: none), and the output rows' pixels."""
    oh, ow = g.src_conv_out(0, f"{X}.shape[2]", kh), g.src_conv_out(1, f"{X}.shape[3]", kw)
    in_place = kh == kw == 1 and args[:4] == ["1", "1", "0", "0"]
    if in_place:
        return f"{X}.shape[2] * {X}.shape[3], {X}.shape[0]"
    tiles = f"(({oh}) + 1) // 2 * ((({ow}) + 1) // 2)" if wino else "0"
    return f"({oh}) * ({ow}), {X}.shape[0], False, {tiles}, {ow}"


def _pointwise(ctx, g: Geometry, m: int, cg: int, kh: int, kw: int, args: list) -> str:
    """The library entry by which a convolution runs on pdjit's packed GEMM with its filter
    packed once (``_nn.pointwise_range``, see ``pdjit.codegen.cpu.lib.pointwise``; ``""``:
    not): a convolution of one group, float32, whose filter is a weight (persistable,
    written by no op of the program: the packed copy is made again after a run that may
    write it, see ``pdjit.codegen.params``), 1x1 stride-1 unpadded on a plane the packed
    kernels serve, or any other onto a small plane they serve (known when lowering); the
    entry then names the one kernel that serves it, so that the plan compiles that one
    alone."""
    if ctx.dtype("Input") != np.float32 or ctx.dtype("Filter") != np.float32 or \
            not all(a.lstrip("-").isdigit() for a in args):
        return ""
    h, w = g.spatial(ctx.shape("Input"))
    known = h is not None and w is not None and h > 0 and w > 0
    entry = usable(m, cg, kh, kw, *(int(a) for a in args), p=h * w if known else -1,
                   q=g.conv_out(0, h, kh) * g.conv_out(1, w, kw) if known else -1,
                   ow=g.conv_out(1, w, kw) if known else -1)
    return entry if entry and _weight_filter(ctx.op) is not None else ""


def _subsampled(ctx, g: Geometry, m: int, cg: int, kh: int, kw: int, args: list) -> bool:
    """Whether a 1x1 unpadded convolution of strides above one (ResNet's shortcuts) runs as a
    stride-1 one on the image's subsample (``_nn.conv.subsample``): where the packed GEMM's
    row tiles (``pointwise_range_rows``) serve the output plane (known when lowering) of a
    filter that is a weight. Measured alone (one thread, batch 4, ms): ResNet-50's 256 -> 512
    from 56x56 5.10 on the taps kernel against 4.07 with the subsample's copy (0.23)."""
    if kh != 1 or kw != 1 or ctx.dtype("Input") != np.float32 or \
            ctx.dtype("Filter") != np.float32 or not all(a.isdigit() for a in args) or \
            args[2:4] != ["0", "0"] or args[:2] == ["1", "1"] or _weight_filter(ctx.op) is None:
        return False
    h, w = g.spatial(ctx.shape("Input"))
    if h is None or w is None or h < 1 or w < 1:
        return False
    q = g.conv_out(0, h, 1) * g.conv_out(1, w, 1)
    return usable(m, cg, 1, 1, 1, 1, 0, 0, 1, 1, int(args[6]), p=q) == "pointwise_range_rows"


def _channel_axis(op) -> int:
    return -1 if op.all_attrs().get("data_format") == "NHWC" else 1


def _served_weight(op) -> bool:
    """Whether a convolution with nothing elementwise after it runs its blocked form's kernels
    (else the taps kernel alone, as a training program's do): its filter is a weight that no
    op writes (an inference program's), and no per-channel affine op that runs apart
    (declared ``ChannelAffine`` and ``OPAQUE``: a batch norm at inference) reads its output,
    which the inference passes would have folded into the filter: a program run as it was
    saved, whose first run would compile those kernels too (ResNet-50 through the Executor:
    +2.6 s cold, for 11 % less time a run)."""
    if _weight_filter(op) is None:
        return False
    out = op.output("Output")
    for o in op.block.ops:
        if out and out[0] in o.input_arg_names:
            spec = registry.inference_of(o)
            if isinstance(spec, registry.ChannelAffine) and \
                    registry.get(o.type).has(registry.OPAQUE) and \
                    o.input(spec.x) == out:
                return False
    return True


@lowering("conv2d", "depthwise_conv2d", host=True, blocked=_conv_blocked,
          channel_axis=_channel_axis, channels_last=channels_last,
          channel_prologue=_prologue_slot)
def _conv_lower(ctx):
    if not _float_ok(ctx, "Input", "Filter"):
        return None
    if ctx.gen.target.block_forms and (_served_weight(ctx.op) or ctx.pre_offer is not None):
        spec = _conv_blocked(ctx)  # the kernels of the blocked form (packed filters,
        if spec is not None:       # Winograd's), with no epilogue
            return ctx.whole_batch("Output", spec)
    g = _geometry(ctx.attrs, ctx.op.type)
    X, W = ctx.inp("Input"), ctx.inp("Filter")
    _, _, kh, kw = ctx.shape("Filter")
    lines = []
    pro = ctx.channel_prologue("Input", ctx.T("Input"), lines)
    if pro is not None:
        X = _through(ctx, X, pro, lines)
    more, xc = as_nchw(ctx, g, X)
    lines += more
    n, _, h, w = image_dims(g, X)
    y, pre, post = nchw_dest(ctx, g, "Output", n, f"{W}.shape[0]", g.src_conv_out(0, h, kh),
                         g.src_conv_out(1, w, kw))
    call = (f"{ctx.lib_fn('conv2d_fwd')}("
            f"{xc}, {W}, {y}, {_args(g, xc, kh, kw, ctx.attrs['groups'])})")
    return lines + pre + [call] + post


def nchw_dest(ctx, g: Geometry, slot: str, n: str, c: str, h: str, w: str) -> tuple:
    """(NCHW local to compute into, lines before, lines after) for output ``slot`` of dims
    ``n, c, h, w`` (source expressions over the op's inputs)."""
    out = ctx.out(slot, shape=f"({', '.join(g.image(n, c, h, w))})")
    if not g.nhwc:
        return out, [], []
    t = ctx.tmp("c")
    return t, [f"{t} = {ctx.lib_fn('nchw_empty')}("
               f"{out})"], [f"{ctx.lib_fn('nhwc_into')}({t}, {out})"]


def _grad_lines(ctx, transposed: bool) -> list | None:
    """Both gradients of a convolution (``transposed``: of a transposed one, whose input
    gradient is a convolution and whose filter gradient swaps image and output gradient)."""
    if not _float_ok(ctx, "Input", "Filter", "Output@GRAD"):
        return None
    g = _geometry(ctx.attrs, ctx.op.type)
    X, W, DY = ctx.inp("Input"), ctx.inp("Filter"), ctx.inp("Output@GRAD")
    _, _, kh, kw = ctx.shape("Filter")
    lines, xc = as_nchw(ctx, g, X)
    more, dyc = as_nchw(ctx, g, DY)
    lines += more
    if transposed:
        args = _t_args(ctx, g, X, kh, kw)
        data, image, grad = "conv2d_fwd", dyc, xc
    else:
        arg_list = _arg_list(g, xc, kh, kw, ctx.attrs["groups"])
        args = ", ".join(arg_list)
        data, image, grad = _bwd_data_entry(ctx, g, arg_list), xc, dyc
    if ctx.has_output("Input@GRAD"):
        dx, pre, post = nchw_dest(ctx, g, "Input@GRAD", *image_dims(g, X))
        lines += pre + [f"{ctx.lib_fn(data)}({dyc}, {W}, {dx}, {args})"] + post
    if ctx.has_output("Filter@GRAD"):
        dw = ctx.out("Filter@GRAD", shape=f"{W}.shape")
        entry = "conv2d_bwd_filter" if transposed else _bwd_filter_entry(ctx, g, arg_list)
        lines.append(f"{ctx.lib_fn(entry)}({image}, {grad}, {dw}, {args})")
    return lines


def _bwd_filter_entry(ctx, g: Geometry, arg_list: list) -> str:
    """The library's entry of a convolution's filter gradient: ``conv2d_bwd_filter_by_blas``
    where the filter and the output gradient's size known when lowering say that it runs by
    im2col + BLAS (the plan's compile jobs then name that kernel, not the taps one), else
    ``conv2d_bwd_filter``. Both are the same function (it picks by the sizes)."""
    m, cg, kh, kw = tuple(ctx.shape("Filter"))
    oh, ow = g.spatial(ctx.shape("Output@GRAD"))
    groups = arg_list[-1]
    if not groups.isdigit() or int(groups) < 1 or min(m, cg, kh, kw, oh, ow) < 1 or \
            m % int(groups):
        return "conv2d_bwd_filter"
    if _dw_by_taps(oh * ow, m // int(groups), cg * kh * kw):
        return "conv2d_bwd_filter"
    return "conv2d_bwd_filter_by_blas"


def _bwd_data_entry(ctx, g: Geometry, arg_list: list) -> str:
    """The library's entry of a convolution's input gradient: ``conv2d_bwd_data_by_taps``
    where the filter, the geometry and the image's size known when lowering say that the
    gradient runs as the taps kernel over dy (the plan's compile jobs then name that kernel
    alone), else ``conv2d_bwd_data``. Both are the same function (it picks by the sizes)."""
    shape = tuple(ctx.shape("Filter"))
    h, w = g.spatial(ctx.shape("Input"))
    if not all(a.lstrip("-").isdigit() for a in arg_list) or h < 1 or w < 1 or \
            min(shape) < 1:
        return "conv2d_bwd_data"
    sh, sw, pt, pl, dh, dw, groups = (int(a) for a in arg_list)
    m, cg, kh, kw = shape
    if groups < 1 or m % groups or use_direct(m // groups, cg) or \
            not by_forward(SimpleNamespace(shape=shape), h * w, sh, sw, pt, pl, dh, dw, groups):
        return "conv2d_bwd_data"
    # the forward pass over dy ([N, M, H, W] where it is 1x1) onto dx with the flipped filter:
    # a 1x1 one of many channels may run as one BLAS product per sample instead (at batch 1
    # for the most planes: where even that does not, no batch does)
    dy, dx = (SimpleNamespace(shape=(1, c, h, w)) for c in (m, cg * groups))
    flipped = SimpleNamespace(shape=(cg * groups, m // groups, kh, kw))
    if _use_gemm(dy, flipped, dx, 1, 1, (kh - 1) * dh - pt, (kw - 1) * dw - pl, groups, 1):
        return "conv2d_bwd_data"
    return "conv2d_bwd_data_by_taps"


@lowering("conv2d_grad", "depthwise_conv2d_grad", host=True)
def _conv_grad_lower(ctx):
    return _grad_lines(ctx, transposed=False)


def _t_args(ctx, g: Geometry, X: str, kh: int, kw: int) -> str:
    """Library arguments of the convolution a transposed one transposes; SAME pads come from
    the transposed op's input ``X`` (its original layout)."""
    if g.algo == "VALID":
        return (f"{g.strides[0]}, {g.strides[1]}, 0, 0, {g.dilations[0]}, {g.dilations[1]}, "
                f"{ctx.attrs['groups']}")
    if g.algo != "SAME":
        return (f"{g.strides[0]}, {g.strides[1]}, {g.pads[0]}, {g.pads[2]}, "
                f"{g.dilations[0]}, {g.dilations[1]}, {ctx.attrs['groups']}")
    _, _, h, w = image_dims(g, X)
    pt, _, _ = g.src_window(0, h, kh)
    pl, _, _ = g.src_window(1, w, kw)
    return f"{g.strides[0]}, {g.strides[1]}, {pt}, {pl}, 1, 1, {ctx.attrs['groups']}"


@lowering("conv2d_transpose", "depthwise_conv2d_transpose", host=True)
def _convt_lower(ctx):
    if not _float_ok(ctx, "Input", "Filter"):
        return None
    g = _geometry(ctx.attrs, ctx.op.type)
    X, W = ctx.inp("Input"), ctx.inp("Filter")
    _, mg, kh, kw = ctx.shape("Filter")
    lines, xc = as_nchw(ctx, g, X)
    m = f"{W}.shape[1] * {ctx.attrs['groups']}"
    y, pre, post = nchw_dest(ctx, g, "Output", f"{X}.shape[0]", m, _t_out_src(ctx, g, X, 0, kh),
                             _t_out_src(ctx, g, X, 1, kw))
    call = f"{ctx.lib_fn('conv2d_bwd_data')}({xc}, {W}, {y}, {_t_args(ctx, g, X, kh, kw)})"
    return lines + pre + [call] + post


@lowering("conv2d_transpose_grad", "depthwise_conv2d_transpose_grad", host=True)
def _convt_grad_lower(ctx):
    return _grad_lines(ctx, transposed=True)
