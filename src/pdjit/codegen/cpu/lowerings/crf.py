"""``linear_chain_crf`` (with its gradient) and ``crf_decoding`` (:mod:`pdjit.ops.crf`) on the
CPU: natively (float32/float64) the ops call the kernels of :mod:`pdjit.codegen.cpu.lib.crf`
(one compiled loop over the sequences; sums in float64)."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering


# ---- native lowerings (``_nn``: pdjit.codegen.cpu.lib.crf) --------------------------------------
def _floats(ctx, slots) -> bool:
    """Float32 or float64, one dtype, for every bound slot of ``slots``."""
    dts = {ctx.dtype(s) for s in slots if ctx.has_input(s) or ctx.has_output(s)}
    return len(dts) == 1 and dts.pop().name in ("float32", "float64")


def _form(ctx, lines, lod_slot):
    """Source of the kernels' ``(rows, offs, lens, padded, stride)``: Emission as rows and its
    sequences, from ``lod_slot``'s LoD (level 0) or from Length."""
    E = ctx.inp("Emission")
    x2, lens, offs = ctx.tmp("x"), ctx.tmp("lens"), ctx.tmp("offs")
    if ctx.has_input("Length"):
        L = ctx.inp("Length")
        lines += [f"{x2} = {E}.reshape(({E}.shape[0] * {E}.shape[1], {E}.shape[2]))",
                  f"{lens} = {L}.reshape(-1).astype(np.int64)",
                  f"{offs} = np.zeros(0, np.int64)"]
        return x2, offs, lens, "True", f"{E}.shape[1]"
    o = ctx.lod(lod_slot, level=0)
    lines += [f"{x2} = {E}", f"{lens} = np.zeros(0, np.int64)"]
    return x2, o, lens, "False", "0"


def _rows(ctx, local: str, lines) -> str:
    """``local`` (shaped like Emission) viewed as rows ``[R, D]``."""
    if not ctx.has_input("Length"):
        return local
    r = ctx.tmp("r")
    lines.append(f"{r} = {local}.reshape(({local}.shape[0] * {local}.shape[1], "
                 f"{local}.shape[2]))")
    return r


@lowering("linear_chain_crf", host=True)
def _crf_lower(ctx):
    """Alpha, EmissionExps, TransitionExps and LogLikelihood through ``_nn.crf_nll``."""
    if not _floats(ctx, ("Emission", "Transition")):
        return None
    E, W, T = ctx.inp("Emission"), ctx.inp("Transition"), ctx.T("Emission")
    lines: list = []
    n = f"{ctx.inp('Length')}.shape[0]" if ctx.has_input("Length") else \
        f"{ctx.lod('Label', level=0)}.shape[0] - 1"
    nll = ctx.out("LogLikelihood", shape=f"({n}, 1)")
    alpha = ctx.out_or_scratch("Alpha", f"{E}.shape", T, lines)
    eexp = ctx.out_or_scratch("EmissionExps", f"{E}.shape", T, lines)
    wexp = ctx.out_or_scratch("TransitionExps", f"{W}.shape", T, lines)
    x2, offs, lens, padded, stride = _form(ctx, lines, "Label")
    lab = ctx.tmp("lab")
    lines.append(f"{lab} = {ctx.inp('Label')}.reshape(-1).astype(np.int64)")
    a2, e2 = _rows(ctx, alpha, lines), _rows(ctx, eexp, lines)
    lines.append(f"{ctx.lib_fn('crf_nll')}("
                 f"{x2}, {W}, {lab}, {offs}, {lens}, {padded}, {stride}, {a2}, "
                 f"{e2}, {wexp}, {nll})")
    return lines


@lowering("linear_chain_crf_grad", host=True)
def _crf_grad_lower(ctx):
    """Emission@GRAD and Transition@GRAD through ``_nn.crf_nll_grad``."""
    if not _floats(ctx, ("EmissionExps", "TransitionExps", "Alpha", "LogLikelihood@GRAD",
                         "Emission@GRAD", "Transition@GRAD")):
        return None
    E, W, T = ctx.inp("Emission"), ctx.inp("Transition"), ctx.T("EmissionExps")
    lines: list = []
    dx = ctx.out("Emission@GRAD", shape=f"{E}.shape") if ctx.has_output("Emission@GRAD") \
        else None
    dw = ctx.out("Transition@GRAD", shape=f"{W}.shape") \
        if ctx.has_output("Transition@GRAD") else None
    _, offs, lens, padded, stride = _form(ctx, lines, "Label")
    eexp = _rows(ctx, ctx.inp("EmissionExps"), lines)
    alpha = _rows(ctx, ctx.inp("Alpha"), lines)
    none = ctx.tmp("none")
    lines.append(f"{none} = np.zeros((0, 0), {T})")
    dx2 = _rows(ctx, dx, lines) if dx is not None else none
    lab, g = ctx.tmp("lab"), ctx.tmp("g")
    lines += [f"{lab} = {ctx.inp('Label')}.reshape(-1).astype(np.int64)",
              f"{g} = {ctx.inp('LogLikelihood@GRAD')}.reshape(({ctx.inp('LogLikelihood@GRAD')}"
              f".size, 1))"]
    lines.append(f"{ctx.lib_fn('crf_nll_grad')}("
                 f"{eexp}, {ctx.inp('TransitionExps')}, {lab}, {alpha}, {g}, "
                 f"{offs}, {lens}, {padded}, {stride}, {dx2}, {dw if dw is not None else none})")
    return lines


@lowering("crf_decoding", host=True)
def _decode_lower(ctx):
    """ViterbiPath through ``_nn.crf_viterbi``."""
    if not _floats(ctx, ("Emission", "Transition")):
        return None
    E, W = ctx.inp("Emission"), ctx.inp("Transition")
    lines: list = []
    shape = f"({E}.shape[0], {E}.shape[1])" if ctx.has_input("Length") else \
        f"({E}.shape[0], 1)"
    path = ctx.out("ViterbiPath", shape=shape)
    x2, offs, lens, padded, stride = _form(ctx, lines, "Emission")
    lab, p = ctx.tmp("lab"), ctx.tmp("p")
    lines.append(f"{lab} = {ctx.inp('Label')}.reshape(-1).astype(np.int64)"
                 if ctx.has_input("Label")
                 else f"{lab} = np.zeros(0, np.int64)")
    lines.append(f"{p} = {path}.reshape(-1)")
    lines.append(f"{ctx.lib_fn('crf_viterbi')}("
                 f"{x2}, {W}, {lab}, {offs}, {lens}, {padded}, {stride}, {p})")
    return lines
