"""The pooling ops of :mod:`pdjit.ops.pool` (``pool2d``, ``max_pool2d_with_index``, and their
gradients) on the CPU: float32/float64 data calls the library's pooling kernels on NCHW views,
the window geometry and flags as arguments; an average whose every window is a whole plane
calls the global average alone. A forward ``pool2d`` on NHWC images but an adaptive one runs
on them as they are; anything else NHWC is copied to and from NCHW around its kernel.
"""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.codegen.cpu.lowerings.conv import as_nchw, nchw_dest
from pdjit.framework.errors import ShapeMismatch
from pdjit.ops.conv import image_dims, native_float
from pdjit.ops.pool import _Pool


def _global_mean(attrs) -> bool:
    """An average whose every window is a whole plane whatever the image's size."""
    p = _Pool(attrs, "pool2d")
    return not p.is_max and (p.global_ or p.adaptive and p.ksize == (1, 1))


def _channels_last(op) -> bool:
    """A pool runs on NHWC images as they are, what the inference pass ``channels_last`` asks
    (the pool joins a chain whose image it reads): the global average by
    ``pool2d_mean_nhwc`` (a chain then ends without converting the image, only its one value
    per channel), any other but an adaptive one by ``pool2d_nhwc`` (a chain runs on through
    it: GoogLeNet's and Inception-v3's blocks, VGG's layers)."""
    x = op.block._find_var_recursive(op.input("X")[0]) if len(op.input("X")) == 1 else None
    if x is None or not native_float(x.dtype):
        return False
    attrs = op.opdef.attr_values(op.all_attrs())
    return _global_mean(attrs) or not _Pool(attrs, "pool2d").adaptive


@lowering("pool2d", host=True, channels_last=_channels_last)
def _pool_lower(ctx):
    if not native_float(ctx.dtype("X")):
        return None
    p = _Pool(ctx.attrs, "pool2d")
    X = ctx.inp("X")
    if p.g.nhwc and _global_mean(ctx.attrs):
        y = ctx.out("Out", shape=f"({X}.shape[0], 1, 1, {X}.shape[3])")
        return [f"{ctx.lib_fn('pool2d_mean_nhwc')}({X}, {y})"]
    n, c, h, w = image_dims(p.g, X)
    if p.g.nhwc and not p.adaptive:
        y = ctx.out("Out", shape=f"({n}, {p.src_out(0, h)}, {p.src_out(1, w)}, {c})")
        return [f"{ctx.lib_fn('pool2d_nhwc')}({X}, {y}, {p.args(h, w)}, {p.is_max}, "
                f"{p.exclusive})"]
    lines, xc = as_nchw(ctx, p.g, X)
    y, pre, post = nchw_dest(ctx, p.g, "Out", n, c, p.src_out(0, h), p.src_out(1, w))
    if _whole_planes(ctx, p):
        return lines + pre + [f"{ctx.lib_fn('pool2d_mean')}({xc}, {y})"] + post
    call = _window_call(ctx, p, xc, y, h, w)
    if call is not None:
        return lines + pre + [call] + post
    flags = f"{p.is_max}, {p.exclusive}, {p.adaptive}"
    return lines + pre + [f"{ctx.lib_fn('pool2d_fwd')}({xc}, {y}, {p.args(h, w)}, {flags})"] + post


def _window_call(ctx, p: _Pool, xc: str, y: str, h: str, w: str) -> str | None:
    """The call of the library's entry of the pool whose windows the attributes fix (2x2 at
    stride 2 unpadded, max or average; 3x3 at one stride of 1 or 2 on both axes), so that
    the plan's compile jobs name that kernel alone; else None (the general entry)."""
    if p.adaptive or p.global_:
        return None
    kh, sh, pt, _ = p.src_window(0, h)
    kw, sw, pl, _ = p.src_window(1, w)
    if (kh, kw, sh, sw, pt, pl) == ("2", "2", "2", "2", "0", "0"):
        return f"{ctx.lib_fn('pool2d_max22' if p.is_max else 'pool2d_avg22')}({xc}, {y})"
    if kh == kw == "3" and sh == sw and sh in ("1", "2"):
        if p.is_max:
            return f"{ctx.lib_fn('pool2d_max33')}({xc}, {y}, {sh}, {pt}, {pl})"
        return f"{ctx.lib_fn('pool2d_avg33')}({xc}, {y}, {sh}, {pt}, {pl}, {p.exclusive})"
    return None


def _whole_planes(ctx, p: _Pool) -> bool:
    """Whether this is an average whose every window is a whole plane (a global pool), as
    the attributes and the input's build-time shape tell: it then calls the library's
    global average, and the plan's compile jobs name that kernel alone."""
    if p.is_max:
        return False
    if p.global_:
        return True
    if p.adaptive:
        return p.ksize == (1, 1)
    h, w = p.g.spatial(ctx.shape("X"))
    if h < 1 or w < 1:
        return False
    try:
        return all(p.out(axis, size) == 1 and p.window(axis, size)[0] == size and
                   p.window(axis, size)[2] == 0 for axis, size in ((0, h), (1, w)))
    except ShapeMismatch:
        return False


@lowering("pool2d_grad", host=True)
def _pool_grad_lower(ctx):
    if not native_float(ctx.dtype("X")):
        return None
    p = _Pool(ctx.attrs, "pool2d_grad")
    X, Y, DY = ctx.inp("X"), ctx.inp("Out"), ctx.inp("Out@GRAD")
    if _whole_planes(ctx, p):
        lines, dyc = as_nchw(ctx, p.g, DY)
        n, c, h, w = image_dims(p.g, X)
        dx, pre, post = nchw_dest(ctx, p.g, "X@GRAD", n, c, h, w)
        return lines + pre + [f"{ctx.lib_fn('pool2d_mean_bwd')}({dyc}, {dx})"] + post
    lines = []
    locs = []
    for local in (X, Y, DY):
        more, c = as_nchw(ctx, p.g, local)
        lines += more
        locs.append(c)
    n, c, h, w = image_dims(p.g, X)
    dx, pre, post = nchw_dest(ctx, p.g, "X@GRAD", n, c, h, w)
    flags = f"{p.is_max}, {p.exclusive}, {p.adaptive}"
    return lines + pre + [f"{ctx.lib_fn('pool2d_bwd')}("
                          f"{', '.join(locs)}, {dx}, {p.args(h, w)}, {flags})"] \
        + post


@lowering("max_pool2d_with_index", host=True)
def _index_lower(ctx):
    if not native_float(ctx.dtype("X")):
        return None
    p = _Pool(ctx.attrs, "max_pool2d_with_index")
    X = ctx.inp("X")
    n, c, h, w = image_dims(p.g, X)
    shape = f"({n}, {c}, {p.src_out(0, h)}, {p.src_out(1, w)})"
    y, mask = ctx.out("Out", shape=shape), ctx.out("Mask", shape=shape)
    return [f"{ctx.lib_fn('max_pool2d_index_fwd')}({X}, {y}, {mask}, {p.args(h, w)}, {p.adaptive})"]


@lowering("max_pool2d_with_index_grad", host=True)
def _index_grad_lower(ctx):
    if not native_float(ctx.dtype("X")):
        return None
    X, M, DY = ctx.inp("X"), ctx.inp("Mask"), ctx.inp("Out@GRAD")
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    return [f"{ctx.lib_fn('max_pool2d_index_bwd')}({M}, {DY}, {dx})"]
