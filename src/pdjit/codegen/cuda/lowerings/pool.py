"""The pooling of :mod:`pdjit.ops.pool` (``pool2d`` and its gradient) on the device: one
thread per output element (per input element for the gradient), the geometry and the flags
run-time arguments (one kernel for max and avg), NCHW or NHWC."""
from __future__ import annotations

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.codegen.cuda.lowerings.conv import image_index
from pdjit.ops.conv import image_dims, native_float
from pdjit.ops.pool import _Pool


@lowering("pool2d", host=True)
def _pool_lower(ctx):
    if not native_float(ctx.dtype("X")):
        return None
    return _pool_device_lines(ctx, grad=False)


@lowering("pool2d_grad", host=True)
def _pool_grad_lower(ctx):
    if not native_float(ctx.dtype("X")):
        return None
    return _pool_device_lines(ctx, grad=True)


def _span_lines(o: str, size: str, osize: str, k: str, s: str, p0: str, v: str) -> list:
    """Kernel lines binding ``{v}0, {v}1`` (the part of window ``o`` inside the image) and
    ``{v}n`` (the window's length for a non-exclusive average), as ``_spans`` has them."""
    return ["if adp:",
            f"    {v}0 = ({o} * {size}) // {osize}",
            f"    {v}1 = (({o} + 1) * {size} + {osize} - 1) // {osize}",
            f"    {v}n = {v}1 - {v}0",
            "else:",
            f"    {v}0 = {o} * {s} - {p0}",
            f"    {v}1 = min({v}0 + {k}, {size} + {p0})",
            f"    {v}n = {v}1 - {v}0",
            f"    {v}0 = max({v}0, 0)",
            f"    {v}1 = min({v}1, {size})",
            "cnt = (h1 - h0) * (w1 - w0) if excl or adp else hn * wn" if v == "w" else "pass"]


def _pool_device_lines(ctx, grad: bool) -> list | None:
    """Pooling (``grad``: its gradient) on a device target, NCHW: one thread per output
    element (per input element for the gradient, visiting the output windows; a max window's
    gradient goes to its first element equal to Out, as the reference's). The geometry and
    the flags are run-time arguments (one kernel for max and avg). NCHW or NHWC."""
    p = _Pool(ctx.attrs, "pool2d_grad" if grad else "pool2d")
    X = ctx.inp("X")
    at, dims = image_index(p.g)
    n, c, h, w = image_dims(p.g, X)
    names = [ctx.tmp(v) for v in ("kh", "kw", "sh", "sw", "pt", "pl", "mx", "ex", "ad")]
    vals = p.args(h, w).split(", ") + [str(int(p.is_max)), str(int(p.exclusive)),
                                       str(int(p.adaptive))]
    lines = [f"{nm} = int({v})" for nm, v in zip(names, vals)]
    kh, kw, sh, sw, pt, pl, mx, ex, ad = names
    spans = (_span_lines("oh_", "H_", "OH_", kh, sh, pt, "h")
             + _span_lines("ow_", "W_", "OW_", kw, sw, pl, "w"))
    _, xc, xh, xw = dims(X)
    before = [f"H_ = {xh}", f"W_ = {xw}", f"C_ = {xc}",
              f"ismax = {mx} != 0", f"excl = {ex} != 0", f"adp = {ad} != 0"]
    i = ctx.tmp("i")
    T = ctx.T("X")
    if not grad:
        y = ctx.out("Out", shape="(" + ", ".join(p.g.image(n, c, p.src_out(0, h),
                                                             p.src_out(1, w))) + ")")
        body = [f"t_ = {i}", "ow_ = t_ % OW_", "t_ = t_ // OW_", "oh_ = t_ % OH_",
                "t_ = t_ // OH_", "c_ = t_ % C_", "nb = t_ // C_"] + spans + [
            f"r_ = {at(X, 'nb', 'c_', 'h0', 'w0')}",
            "if not ismax:",
            f"    r_ = {T}(0)",
            "for a_ in range(h0, h1):",
            "    for b_ in range(w0, w1):",
            f"        v_ = {at(X, 'nb', 'c_', 'a_', 'b_')}",
            "        if ismax:",
            "            if v_ > r_:",
            "                r_ = v_",
            "        else:",
            "            r_ += v_",
            "if not ismax:",
            f"    r_ = {T}(r_ / cnt)",
            f"{at(y, 'nb', 'c_', 'oh_', 'ow_')} = r_"]
        _, _, yh, yw = dims(y)
        before += [f"OH_ = {yh}", f"OW_ = {yw}"]
        return lines + ctx.device_loop(i, f"{y}.size", body, before)
    Y, DY = ctx.inp("Out"), ctx.inp("Out@GRAD")
    want = p.g.image(n, c, p.src_out(0, h), p.src_out(1, w))
    lines.append("_rt.check(" + " and ".join(
        f"{a}.ndim == 4 and " + " and ".join(f"{a}.shape[{k}] == {e}" for k, e in enumerate(want))
        for a in (Y, DY)) + ")")
    dx = ctx.out("X@GRAD", shape=f"{X}.shape")
    body = [f"t_ = {i}", "iw = t_ % W_", "t_ = t_ // W_", "ih = t_ % H_", "t_ = t_ // H_",
            "c_ = t_ % C_", "nb = t_ // C_", f"g_ = {T}(0)",
            "for oh_ in range(OH_):",
            "    for ow_ in range(OW_):"] + ["        " + ln for ln in spans] + [
            "        if ih >= h0 and ih < h1 and iw >= w0 and iw < w1:",
            "            if not ismax:",
            f"                g_ += {T}({at(DY, 'nb', 'c_', 'oh_', 'ow_')} / cnt)",
            "            else:",
            f"                y_ = {at(Y, 'nb', 'c_', 'oh_', 'ow_')}",
            "                fh = -1",
            "                fw = -1",
            "                for a_ in range(h0, h1):",
            "                    for b_ in range(w0, w1):",
            f"                        if fh < 0 and {at(X, 'nb', 'c_', 'a_', 'b_')} == y_:",
            "                            fh = a_",
            "                            fw = b_",
            "                if fh == ih and fw == iw:",
            f"                    g_ += {at(DY, 'nb', 'c_', 'oh_', 'ow_')}",
            f"{at(dx, 'nb', 'c_', 'ih', 'iw')} = g_"]
    _, _, yh, yw = dims(Y)
    before += [f"OH_ = {yh}", f"OW_ = {yw}"]
    return lines + ctx.device_loop(i, f"{dx}.size", body, before)
