"""Batch norm and layer norm (:mod:`pdjit.ops.norm`), with their gradients, on the device:
every size and attribute a run-time argument, the numerics of the CPU's norm kernels
(statistics and sums in float64)."""
from __future__ import annotations

from pdjit.codegen.cuda.lowerings import lowering
from pdjit.ops.norm import _batch_stats, _f32, _ln_native, _native, bn_grad_batch


@lowering("batch_norm", host=True)
def _bn_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias", "Mean", "Variance", "MomentumTensor")):
        return None
    return _bn_device_lines(ctx)


@lowering("batch_norm_grad", host=True)
def _bn_grad_lower(ctx):
    batch = bn_grad_batch(ctx)
    return None if batch is None else _bn_grad_device_lines(ctx, batch)


@lowering("layer_norm", host=True)
def _ln_lower(ctx):
    if not _ln_native(ctx, ("Scale", "Bias", "Y", "Mean", "Variance")):
        return None
    return _ln_device_lines(ctx, grad=False)


@lowering("layer_norm_grad", host=True)
def _ln_grad_lower(ctx):
    if not _ln_native(ctx, ("Scale", "Mean", "Variance", "Y@GRAD", "X@GRAD", "Scale@GRAD",
                            "Bias@GRAD")):
        return None
    return _ln_device_lines(ctx, grad=True)



# ---- batch_norm on a device target ---------------------------------------------------------------
# X seen flat as (A, P, C, R) (see _view): element ((a * P + p) * C + c) * R + r. One thread per
# channel computes the channel's statistics (float64, two passes, as cpu.lib.norm) and its
# coefficients; one thread per element applies them. Every size and attribute is a run-time
# argument.
def _bn_device_common(ctx, lines: list) -> tuple:
    """(x1, C, R, cnt, flat, cx): driver locals of X flat, its channels, the run after the
    channel, the values per channel; ``flat(local)`` appends a line viewing ``local`` 1-D;
    ``cx`` the channels as an expression over X (for the driver's output shapes)."""
    X, r = ctx.inp("X"), ctx.rank("X")
    nhwc = ctx.attrs["data_layout"] == "NHWC" and r > 2

    def flat(local):
        t = ctx.tmp("f")
        lines.append(f"{t} = {local}.reshape({local}.size)")
        return t
    x1 = flat(X)
    C, R, cnt = ctx.tmp("C"), ctx.tmp("R"), ctx.tmp("cnt")
    lines += [f"{C} = {X}.shape[{r - 1 if nhwc else 1}]",
              f"{R} = {1 if nhwc else ctx.prod(X, 2, r)}",
              f"{cnt} = {X}.size // max({C}, 1)"]
    return x1, C, R, cnt, flat, f"{X}.shape[{r - 1 if nhwc else 1}]"


def _device_out(ctx, slot: str, shape: str, T: str, lines: list) -> str:
    """Output ``slot`` allocated by the driver, or device scratch when it is not bound."""
    if ctx.has_output(slot):
        return ctx.out(slot, shape=shape)
    t = ctx.tmp("u")
    lines.append(f"{t} = _cu.empty({shape}, {T})")
    return t


def _fits(ctx, lines: list, n: str, slots) -> None:
    """A line checking that each bound input of ``slots`` holds ``n`` values (the kernels
    index them by channel or row and cannot raise: else the reference names the misfit)."""
    sizes = [f"{ctx.inp(s)}.size == {n}" for s in slots if ctx.has_input(s)]
    if sizes:
        lines.append(f"_rt.check({' and '.join(sizes)})")


def _bn_device_lines(ctx):
    a = ctx.attrs
    lines: list = []
    x1, C, R, cnt, flat, cx = _bn_device_common(ctx, lines)
    X, TS = ctx.inp("X"), ctx.T("Mean")
    mean, var = flat(ctx.inp("Mean")), flat(ctx.inp("Variance"))
    y = ctx.out("Y", shape=f"{X}.shape")
    mo = flat(_device_out(ctx, "MeanOut", f"{ctx.inp('Mean')}.shape", TS, lines))
    vo = flat(_device_out(ctx, "VarianceOut", f"{ctx.inp('Variance')}.shape", TS, lines))
    sm = _device_out(ctx, "SavedMean", f"({cx},)", TS, lines)
    sv = _device_out(ctx, "SavedVariance", f"({cx},)", TS, lines)
    if ctx.has_output("ReserveSpace"):
        ctx.out("ReserveSpace", shape="(0,)")
    y1 = flat(y)
    sc, bc, eps, mom = ctx.tmp("s"), ctx.tmp("b"), ctx.tmp("eps"), ctx.tmp("mom")
    lines += [f"{sc} = _cu.empty(({C},), np.float64)", f"{bc} = _cu.empty(({C},), np.float64)",
              f"{eps} = {_f32(a['epsilon'])}"]
    if ctx.has_input("MomentumTensor"):  # read on the device: no host round trip
        mom_line = f"mom_ = float({flat(ctx.inp('MomentumTensor'))}[0])"
    else:
        lines.append(f"{mom} = {_f32(a['momentum'])}")
        mom_line = f"mom_ = {mom}"
    scale = f"{ctx.inp('Scale')}[c_]" if ctx.has_input("Scale") else "1.0"
    bias = f"{ctx.inp('Bias')}[c_]" if ctx.has_input("Bias") else "0.0"
    _fits(ctx, lines, C, ("Scale", "Bias", "Mean", "Variance"))
    if _batch_stats(a["is_test"], a["use_global_stats"], a["trainable_statistics"]):
        stats = [
            "acc = 0.0",
            "for e_ in range(cnt_):",
            f"    acc += {x1}[((e_ // {R}) * {C} + c_) * {R} + e_ % {R}]",
            "m_ = acc / cnt_",
            "acc = 0.0",
            "for e_ in range(cnt_):",
            f"    d_ = {x1}[((e_ // {R}) * {C} + c_) * {R} + e_ % {R}] - m_",
            "    acc += d_ * d_",
            "v_ = acc / cnt_",
            "if cnt_ == 1:",
            f"    {mo}[c_] = {mean}[c_]",
            f"    {vo}[c_] = {var}[c_]",
            f"    {sm}[c_] = 0.0",
            f"    {sv}[c_] = 0.0",
            f"    {sc}[c_] = 1.0",
            f"    {bc}[c_] = 0.0",
            "else:",
            f"    iv = 1.0 / math.sqrt(v_ + {eps})",
            mom_line.join(["    ", ""]),
            f"    {mo}[c_] = {mean}[c_] * mom_ + m_ * (1.0 - mom_)",
            f"    {vo}[c_] = {var}[c_] * mom_ + v_ * (1.0 - mom_)",
            f"    {sm}[c_] = m_",
            f"    {sv}[c_] = iv",
            f"    {sc}[c_] = iv * {scale}",
            f"    {bc}[c_] = {bias} - m_ * {sc}[c_]"]
    else:
        stats = [
            "m_ = float(" + f"{mean}[c_])",
            f"iv = 1.0 / math.sqrt(float({var}[c_]) + {eps})",
            f"{mo}[c_] = {mean}[c_]", f"{vo}[c_] = {var}[c_]",
            f"{sm}[c_] = {mean}[c_]", f"{sv}[c_] = iv",
            f"{sc}[c_] = iv * {scale}", f"{bc}[c_] = {bias} - m_ * {sc}[c_]"]
    lines += ctx.device_loop("c_", C, stats, before=[f"cnt_ = {cnt}"])
    relu = ["if v_ < 0.0:", "    v_ = 0.0"] if a["fuse_with_relu"] else []
    lines += ctx.device_loop("i_", f"{x1}.size", [
        f"c_ = (i_ // {R}) % {C}", f"v_ = {x1}[i_] * {sc}[c_] + {bc}[c_]"] + relu +
        [f"{y1}[i_] = v_"])
    return lines


def _bn_grad_device_lines(ctx, batch: bool):
    lines: list = []
    x1, C, R, cnt, flat, cx = _bn_device_common(ctx, lines)
    X, T = ctx.inp("X"), ctx.T("X")
    dy = flat(ctx.inp("Y@GRAD"))
    dx = flat(_device_out(ctx, "X@GRAD", f"{X}.shape", T, lines))
    TS = ctx.T("Scale") if ctx.has_input("Scale") else T
    ds = _device_out(ctx, "Scale@GRAD", f"({cx},)", TS, lines)
    db = _device_out(ctx, "Bias@GRAD", f"({cx},)",
                     ctx.T("Bias") if ctx.has_input("Bias") else T, lines)
    cf = [ctx.tmp(h) for h in ("m", "cg", "cx", "c0")]
    lines += [f"{t} = _cu.empty(({C},), np.float64)" for t in cf]
    mc, cg, cx, c0 = cf
    scale = f"{ctx.inp('Scale')}[c_]" if ctx.has_input("Scale") else "1.0"
    _fits(ctx, lines, C, ("Scale", "SavedMean", "SavedVariance") if batch else
          ("Scale", "MeanOut", "VarianceOut"))
    lines.append(f"_rt.check({ctx.inp('Y@GRAD')}.shape == {X}.shape)")
    if batch:
        sm, sv = flat(ctx.inp("SavedMean")), flat(ctx.inp("SavedVariance"))
        head = ["if cnt_ == 1:",
                "    m_ = 0.0", "    iv = 1.0", "    sc_ = 1.0",
                "else:", f"    m_ = float({sm}[c_])", f"    iv = float({sv}[c_])",
                f"    sc_ = {scale}"]
    else:
        eps = ctx.tmp("eps")
        lines.append(f"{eps} = {_f32(ctx.attrs['epsilon'])}")
        mo, vo = flat(ctx.inp("MeanOut")), flat(ctx.inp("VarianceOut"))
        head = [f"m_ = float({mo}[c_])", f"iv = 1.0 / math.sqrt(float({vo}[c_]) + {eps})",
                f"sc_ = {scale}"]
    body = head + [
        "s1 = 0.0", "s2 = 0.0",
        "for e_ in range(cnt_):",
        f"    j_ = ((e_ // {R}) * {C} + c_) * {R} + e_ % {R}",
        f"    s1 += {dy}[j_]",
        f"    s2 += {dy}[j_] * ({x1}[j_] - m_)",
        "if cnt_ == 1 and bstat:",
        f"    {db}[c_] = 0.0", f"    {ds}[c_] = 0.0",
        "else:",
        f"    {db}[c_] = s1", f"    {ds}[c_] = s2 * iv",
        f"{mc}[c_] = m_",
        f"{cg}[c_] = iv * sc_",
        "if bstat and cnt_ > 1:",
        f"    {cx}[c_] = -iv * iv * (s2 * iv * sc_) / cnt_",
        f"    {c0}[c_] = -iv * (s1 * sc_) / cnt_",
        "else:",
        f"    {cx}[c_] = 0.0", f"    {c0}[c_] = 0.0"]
    bs = ctx.tmp("bs")
    lines.append(f"{bs} = {int(batch)}")
    lines += ctx.device_loop("c_", C, body, before=[f"cnt_ = {cnt}", f"bstat = {bs} != 0"])
    lines += ctx.device_loop("i_", f"{x1}.size", [
        f"c_ = (i_ // {R}) % {C}",
        f"{dx}[i_] = {cg}[c_] * {dy}[i_] + {cx}[c_] * ({x1}[i_] - {mc}[c_]) + {c0}[c_]"])
    return lines


def _ln_device_lines(ctx, grad: bool) -> list:
    """layer_norm (``grad``: its gradients) on a device target, with cpu.lib.norm's numerics
    (statistics and sums in float64, the per-row mean and 1/std rounded to X's type, products
    in X's type): the forward pass one thread per row; the gradients one thread per column
    (Scale@GRAD, Bias@GRAD: sums over the rows) and one per row (X@GRAD)."""
    X, T = ctx.inp("X"), ctx.T("X")
    axis, rank = int(ctx.attrs["begin_norm_axis"]), ctx.rank("X")
    right = f"({ctx.prod(X, axis, rank)})"
    lead = "(" + "".join(f"{X}.shape[{i}], " for i in range(axis)) + ")"
    lines: list = []

    def flat(local):
        t = ctx.tmp("f")
        lines.append(f"{t} = {local}.reshape({local}.size)")
        return t

    def out(slot, shape):
        if ctx.has_output(slot):
            return ctx.out(slot, shape=shape)
        t = ctx.tmp("u")
        lines.append(f"{t} = _cu.empty({shape}, {T})")
        return t

    x1 = flat(X)
    nc, nr, eps = ctx.tmp("nc"), ctx.tmp("nr"), ctx.tmp("eps")
    lines += [f"{nc} = {right}", f"{nr} = {X}.size // max({nc}, 1)",
              f"{eps} = {_f32(ctx.attrs['epsilon'])}"]
    scale = f"{ctx.inp('Scale')}[j_]" if ctx.has_input("Scale") else f"{T}(1)"
    bias = f"{ctx.inp('Bias')}[j_]" if ctx.has_input("Bias") else f"{T}(0)"
    _fits(ctx, lines, nc, ("Scale", "Bias"))
    if not grad:
        y1 = flat(ctx.out("Y", shape=f"{X}.shape"))
        mean, var = flat(out("Mean", lead)), flat(out("Variance", lead))
        body = [f"b_ = r_ * {nc}", "s_ = 0.0", f"for j_ in range({nc}):",
                f"    s_ += {x1}[b_ + j_]", f"m_ = s_ / {nc}", "q_ = 0.0",
                f"for j_ in range({nc}):", f"    d_ = {x1}[b_ + j_] - m_", "    q_ += d_ * d_",
                f"v_ = q_ / {nc}", f"{mean}[r_] = m_", f"{var}[r_] = v_",
                f"mt = {T}(m_)", f"it = {T}(1.0 / math.sqrt(v_ + {eps}))",
                f"for j_ in range({nc}):",
                f"    {y1}[b_ + j_] = ({x1}[b_ + j_] - mt) * it * {scale} + {bias}"]
        return lines + ctx.device_loop("r_", nr, body)
    _fits(ctx, lines, nr, ("Mean", "Variance"))
    lines.append(f"_rt.check({ctx.inp('Y@GRAD')}.shape == {X}.shape)")
    mean, var = flat(ctx.inp("Mean")), flat(ctx.inp("Variance"))
    dy = flat(ctx.inp("Y@GRAD"))
    row = [f"mt = {T}({mean}[r_])", f"it = {T}(1.0 / math.sqrt(float({var}[r_]) + {eps}))"]
    if ctx.has_output("Scale@GRAD") or ctx.has_output("Bias@GRAD"):
        ds, db = out("Scale@GRAD", f"({right},)"), out("Bias@GRAD", f"({right},)")
        lines += ctx.device_loop("j_", nc, [
            "s1 = 0.0", "s2 = 0.0", f"for r_ in range({nr}):"] + ["    " + t for t in row] + [
            f"    k_ = r_ * {nc} + j_", f"    d_ = {dy}[k_]",
            f"    s1 += d_ * (({x1}[k_] - mt) * it)", "    s2 += d_",
            f"{ds}[j_] = s1", f"{db}[j_] = s2"])
    if ctx.has_output("X@GRAD"):
        dx = flat(ctx.out("X@GRAD", shape=f"{X}.shape"))
        lines += ctx.device_loop("r_", nr, row + [
            f"b_ = r_ * {nc}", "sg = 0.0", "sgx = 0.0", f"for j_ in range({nc}):",
            f"    g_ = {dy}[b_ + j_] * {scale}", "    sg += g_",
            f"    sgx += g_ * (({x1}[b_ + j_] - mt) * it)",
            f"a_ = {T}(sg / {nc})", f"c_ = {T}(sgx / {nc})",
            f"for j_ in range({nc}):",
            f"    {dx}[b_ + j_] = it * ({dy}[b_ + j_] * {scale} - a_ - "
            f"(({x1}[b_ + j_] - mt) * it) * c_)"])
    return lines
