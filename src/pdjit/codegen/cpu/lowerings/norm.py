"""The normalisations of :mod:`pdjit.ops.norm` (batch, instance, group and layer norm, with
their gradients) on the CPU.

Natively (float32 and float64; float16 runs the references) every op calls the three library
kernels of ``pdjit.codegen.cpu.lib.norm`` (statistics, normalisation, gradients) on a 4-D view
of its data, one compilation per dtype for all of them; the host lines do the bookkeeping on
the few values per channel (running averages, saved statistics) with NumPy. ``layer_norm`` and
its gradient call ``cpu.lib.norm.layer_norm_fwd`` / ``layer_norm_bwd`` on the ``(left, right)``
rows (one compilation per dtype for every shape and axis; float32 and float64 with Scale and
Bias of X's type, else the references).
"""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.ops.norm import (
    _batch_stats,
    _channel_axis,
    _f32,
    _ln_native,
    _native,
    bn_grad_batch,
)


class _Host:
    """Host lines under construction for a norm op on X: the ``(A, P, C, R)`` views of arrays
    (see :func:`_view`), per-channel inputs (constants when absent), outputs (scratch arrays
    when not bound). The lines call the kernels of ``pdjit.codegen.cpu.lib.norm`` and do the
    per-channel bookkeeping on a few values with NumPy (valid Python and Numba)."""

    def __init__(self, ctx, data_layout: str):
        self.ctx, self.layout, self.lines = ctx, data_layout, []
        self.rank, self.T, self.X = ctx.rank("X"), ctx.T("X"), ctx.inp("X")
        self.c = f"{self.X}.shape[{_channel_axis(self.rank, data_layout)}]"

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def tmp(self, hint: str) -> str:
        return self.ctx.tmp(hint)

    def view(self, local: str) -> str:
        r, v = self.rank, self.tmp("v")
        if self.layout == "NHWC" and r > 2:
            shape = (f"({local}.shape[0], {self.ctx.prod(local, 1, r - 1)}, "
                     f"{local}.shape[{r - 1}], 1)")
        else:
            shape = f"({local}.shape[0], 1, {local}.shape[1], {self.ctx.prod(local, 2, r)})"
        self.emit(f"{v} = {local}.reshape({shape})")
        return v

    def dtype_of(self, slot: str) -> str:
        ctx = self.ctx
        return ctx.T(slot) if ctx.has_input(slot) or ctx.has_output(slot) else self.T

    def param(self, slot: str, fill: str) -> str:
        """Input ``slot``, or ``np.ones``/``np.zeros`` (``fill``) per channel when absent."""
        if self.ctx.has_input(slot):
            return self.ctx.inp(slot)
        return self.const(fill, self.dtype_of(slot))

    def const(self, fill: str, T: str) -> str:
        t = self.tmp("k")
        self.emit(f"{t} = np.{fill}(({self.c},), {T})")
        return t

    def out(self, slot: str, shape: str, T: str) -> str:
        """Output ``slot`` allocated by the driver, or a scratch array when it is not bound."""
        return self.ctx.out_or_scratch(slot, shape, T, self.lines)

    def grads(self, x4: str, dy: str) -> tuple:
        """(dy4, dx4, dscale, dbias): the out-grad viewed like ``x4`` and the gradients."""
        dy4, dx = self.tmp("g"), self.out("X@GRAD", f"{self.X}.shape", self.T)
        self.emit(f"{dy4} = {dy}.reshape({x4}.shape)")
        ds = self.out("Scale@GRAD", f"({self.c},)", self.dtype_of("Scale"))
        db = self.out("Bias@GRAD", f"({self.c},)", self.dtype_of("Bias"))
        return dy4, f"{dx}.reshape({x4}.shape)", ds, db


@lowering("batch_norm", host=True)
def _bn_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias", "Mean", "Variance", "MomentumTensor")):
        return None
    a = ctx.attrs
    h = _Host(ctx, a["data_layout"])
    mean, var, TS = ctx.inp("Mean"), ctx.inp("Variance"), ctx.T("Mean")
    scale, bias = h.param("Scale", "ones"), h.param("Bias", "zeros")
    mom = _f32(a["momentum"])
    if ctx.has_input("MomentumTensor"):
        mt, mom = ctx.inp("MomentumTensor"), h.tmp("mom")
        h.emit(f"{mom} = float({mt}.reshape({mt}.size)[0])")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    mo, vo = h.out("MeanOut", f"{mean}.shape", TS), h.out("VarianceOut", f"{var}.shape", TS)
    sm, sv = h.out("SavedMean", f"({h.c},)", TS), h.out("SavedVariance", f"({h.c},)", TS)
    if ctx.has_output("ReserveSpace"):
        ctx.out("ReserveSpace", shape="(0,)")
    x4, y4 = h.view(h.X), h.view(y)
    m, v, inv = h.tmp("m"), h.tmp("v"), h.tmp("inv")
    eps, relu = _f32(a["epsilon"]), bool(a["fuse_with_relu"])
    apply = f"{ctx.lib_fn('norm_apply')}({x4}, {m}, {inv}, {{}}, {{}}, False, 1, {relu}, {y4})"
    if not _batch_stats(a["is_test"], a["use_global_stats"], a["trainable_statistics"]):
        h.emit(f"{m} = {mean}.astype(np.float64).reshape((1, {mean}.size))",
               f"{inv} = 1.0 / np.sqrt({var}.astype(np.float64).reshape((1, {var}.size)) + "
               f"{eps})",
               f"{mo}[:] = {mean}", f"{vo}[:] = {var}", f"{sm}[:] = {mean}",
               f"{sv}[:] = {inv}[0]", apply.format(scale, bias))
        return h.lines
    ones, zeros = h.const("ones", h.dtype_of("Scale")), h.const("zeros", h.dtype_of("Bias"))
    h.emit(f"{m} = np.empty((1, {x4}.shape[2]))", f"{v} = np.empty((1, {x4}.shape[2]))",
           f"{ctx.lib_fn('norm_stats')}({x4}, False, 1, {m}, {v})",
           f"if {x4}.size == {x4}.shape[2]:  # one value per channel: Y = X, statistics kept",
           f"    {m}[:, :] = 0.0", f"    {inv} = np.ones((1, {x4}.shape[2]))",
           f"    {mo}[:] = {mean}", f"    {vo}[:] = {var}", f"    {sm}[:] = 0.0",
           f"    {sv}[:] = 0.0", "    " + apply.format(ones, zeros),
           "else:",
           f"    {inv} = 1.0 / np.sqrt({v} + {eps})",
           f"    {mo}[:] = {mean}.astype(np.float64) * {mom} + {m}[0] * (1.0 - {mom})",
           f"    {vo}[:] = {var}.astype(np.float64) * {mom} + {v}[0] * (1.0 - {mom})",
           f"    {sm}[:] = {m}[0]", f"    {sv}[:] = {inv}[0]", "    " + apply.format(scale, bias))
    return h.lines


@lowering("batch_norm_grad", host=True)
def _bn_grad_lower(ctx):
    batch = bn_grad_batch(ctx)
    if batch is None:
        return None
    a = ctx.attrs
    h = _Host(ctx, a["data_layout"])
    scale = h.param("Scale", "ones")
    x4 = h.view(h.X)
    dy4, dx4, ds, db = h.grads(x4, ctx.inp("Y@GRAD"))
    grad = (f"{ctx.lib_fn('norm_grad')}("
            f"{x4}, {dy4}, {{}}, {{}}, {{}}, False, 1, {{}}, {dx4}, {ds}, {db})")
    if not batch:
        mean, var = ctx.inp("MeanOut"), ctx.inp("VarianceOut")
        h.emit(grad.format(f"{mean}.astype(np.float64).reshape((1, {mean}.size))",
                           f"1.0 / np.sqrt({var}.astype(np.float64).reshape((1, {var}.size)) + "
                           f"{_f32(a['epsilon'])})", scale, False))
        return h.lines
    sm, sv = ctx.inp("SavedMean"), ctx.inp("SavedVariance")
    ones = h.const("ones", h.dtype_of("Scale"))
    h.emit(f"if {x4}.size == {x4}.shape[2]:  # the forward op passed X through",
           "    " + grad.format(f"np.zeros((1, {x4}.shape[2]))", f"np.ones((1, {x4}.shape[2]))",
                                ones, False),
           f"    {ds}[:] = 0.0", f"    {db}[:] = 0.0",
           "else:",
           "    " + grad.format(f"{sm}.astype(np.float64).reshape((1, {sm}.size))",
                                f"{sv}.astype(np.float64).reshape((1, {sv}.size))", scale, True))
    return h.lines


@lowering("instance_norm", host=True)
def _in_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias")):
        return None
    h = _Host(ctx, "NCHW")
    scale, bias, TS = h.param("Scale", "ones"), h.param("Bias", "zeros"), h.dtype_of("Scale")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    nc = f"({h.X}.shape[0] * {h.c},)"
    sm, sv = h.out("SavedMean", nc, TS), h.out("SavedVariance", nc, TS)
    x4, y4 = h.view(h.X), h.view(y)
    m, v, inv = h.tmp("m"), h.tmp("v"), h.tmp("inv")
    h.emit(f"{m} = np.empty(({x4}.shape[0], {x4}.shape[2]))",
           f"{v} = np.empty(({x4}.shape[0], {x4}.shape[2]))",
           f"{ctx.lib_fn('norm_stats')}({x4}, True, 1, {m}, {v})",
           f"{inv} = 1.0 / np.sqrt({v} + {_f32(ctx.attrs['epsilon'])})",
           f"{sm}[:] = {m}.reshape({m}.size)", f"{sv}[:] = {inv}.reshape({inv}.size)",
           f"{ctx.lib_fn('norm_apply')}({x4}, {m}, {inv}, {scale}, {bias}, True, 1, False, {y4})")
    return h.lines


@lowering("instance_norm_grad", host=True)
def _in_grad_lower(ctx):
    if not _native(ctx, ("X", "Scale", "SavedMean", "SavedVariance", "Y@GRAD")):
        return None
    h = _Host(ctx, "NCHW")
    scale = h.param("Scale", "ones")
    x4 = h.view(h.X)
    dy4, dx4, ds, db = h.grads(x4, ctx.inp("Y@GRAD"))
    stat = f"({x4}.shape[0], {x4}.shape[2])"
    h.emit(f"{ctx.lib_fn('norm_grad')}({x4}, {dy4}, "
           f"{ctx.inp('SavedMean')}.astype(np.float64).reshape({stat}), "
           f"{ctx.inp('SavedVariance')}.astype(np.float64).reshape({stat}), {scale}, True, 1, "
           f"True, {dx4}, {ds}, {db})")
    return h.lines


@lowering("group_norm", host=True)
def _gn_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Bias")):
        return None
    a = ctx.attrs
    h, groups = _Host(ctx, a["data_layout"]), int(a["groups"])
    scale, bias = h.param("Scale", "ones"), h.param("Bias", "zeros")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    stat = f"({h.X}.shape[0], {groups})"
    mo, vo = h.out("Mean", stat, h.T), h.out("Variance", stat, h.T)
    x4, y4 = h.view(h.X), h.view(y)
    m, v = h.tmp("m"), h.tmp("v")
    cpg = f"{x4}.shape[2] // {groups}"
    h.emit(f"{m} = np.empty({stat})", f"{v} = np.empty({stat})",
           f"{ctx.lib_fn('norm_stats')}({x4}, True, {cpg}, {m}, {v})",
           f"{mo}[:, :] = {m}", f"{vo}[:, :] = {v}",
           f"{ctx.lib_fn('norm_apply')}("
           f"{x4}, {m}, 1.0 / np.sqrt({v} + {_f32(a['epsilon'])}), {scale}, "
           f"{bias}, True, {cpg}, False, {y4})")
    return h.lines


@lowering("group_norm_grad", host=True)
def _gn_grad_lower(ctx):
    if not _native(ctx, ("X", "Scale", "Mean", "Variance", "Y@GRAD")):
        return None
    a = ctx.attrs
    h, groups = _Host(ctx, a["data_layout"]), int(a["groups"])
    scale = h.param("Scale", "ones")
    x4 = h.view(h.X)
    dy4, dx4, ds, db = h.grads(x4, ctx.inp("Y@GRAD"))
    stat = f"({x4}.shape[0], {groups})"
    h.emit(f"{ctx.lib_fn('norm_grad')}("
           f"{x4}, {dy4}, {ctx.inp('Mean')}.astype(np.float64).reshape({stat}), "
           f"1.0 / np.sqrt({ctx.inp('Variance')}.astype(np.float64).reshape({stat}) + "
           f"{_f32(a['epsilon'])}), {scale}, True, {x4}.shape[2] // {groups}, True, {dx4}, "
           f"{ds}, {db})")
    return h.lines


class _LNHost:
    """Host lines of a layer-norm op: X as ``(left, right)`` rows, parameters (ones/zeros when
    absent), outputs (scratch arrays when not bound)."""

    def __init__(self, ctx):
        self.ctx, self.lines = ctx, []
        self.X, self.T = ctx.inp("X"), ctx.T("X")
        self.axis, rank = int(ctx.attrs["begin_norm_axis"]), ctx.rank("X")
        # a source expression over X alone: output shapes are evaluated before the lines run
        self.right = f"({ctx.prod(self.X, self.axis, rank)})"
        self.x2 = ctx.tmp("x")
        self.lines.append(f"{self.x2} = {self.X}.reshape(({ctx.prod(self.X, 0, self.axis)}, "
                          f"{self.right}))")
        self.eps = _f32(ctx.attrs["epsilon"])

    def param(self, slot: str, fill: str) -> str:
        if self.ctx.has_input(slot):
            return self.ctx.inp(slot)
        t = self.ctx.tmp("k")
        self.lines.append(f"{t} = np.{fill}(({self.right},), {self.T})")
        return t

    def out(self, slot: str, shape: str) -> str:
        return self.ctx.out_or_scratch(slot, shape, self.T, self.lines)

    def lead_shape(self) -> str:
        dims = "".join(f"{self.X}.shape[{i}], " for i in range(self.axis))
        return f"({dims})"


@lowering("layer_norm", host=True)
def _ln_lower(ctx):
    if not _ln_native(ctx, ("Scale", "Bias", "Y", "Mean", "Variance")):
        return None
    h = _LNHost(ctx)
    scale, bias = h.param("Scale", "ones"), h.param("Bias", "zeros")
    y = ctx.out("Y", shape=f"{h.X}.shape")
    mean, var = h.out("Mean", h.lead_shape()), h.out("Variance", h.lead_shape())
    rows = f"{h.x2}.shape[0]"
    h.lines.append(f"{ctx.lib_fn('layer_norm_fwd')}({h.x2}, {scale}, {bias}, {h.eps}, "
                   f"{y}.reshape({h.x2}.shape), {mean}.reshape(({rows},)), "
                   f"{var}.reshape(({rows},)))")
    return h.lines


@lowering("layer_norm_grad", host=True)
def _ln_grad_lower(ctx):
    if not _ln_native(ctx, ("Scale", "Mean", "Variance", "Y@GRAD", "X@GRAD", "Scale@GRAD",
                            "Bias@GRAD")):
        return None
    h = _LNHost(ctx)
    scale = h.param("Scale", "ones")
    if ctx.has_output("X@GRAD"):
        dx, want = f"{ctx.out('X@GRAD', shape=f'{h.X}.shape')}.reshape({h.x2}.shape)", True
    else:
        dx, want = f"np.empty((0, 0), {h.T})", False
    ds, db = h.out("Scale@GRAD", f"({h.right},)"), h.out("Bias@GRAD", f"({h.right},)")
    mean, var, dy = ctx.inp("Mean"), ctx.inp("Variance"), ctx.inp("Y@GRAD")
    h.lines.append(f"{ctx.lib_fn('layer_norm_bwd')}({h.x2}, {dy}.reshape({h.x2}.shape), "
                   f"{mean}.reshape(({mean}.size,)), {var}.reshape(({var}.size,)), {scale}, "
                   f"{h.eps}, {want}, {dx}, {ds}, {db})")
    return h.lines
