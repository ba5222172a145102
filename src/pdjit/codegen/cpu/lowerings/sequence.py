"""The LoD recurrent ops and the sequence convolution of :mod:`pdjit.ops.sequence` (lstm, gru,
sequence_conv, with their gradients) on the CPU: host lines calling the kernels of
:mod:`pdjit.codegen.cpu.lib.lod_rnn` (float32/float64): one compiled loop over the time steps
with one GEMM per step over the sequences alive at it. The other sequence ops run their
definitions' own loops over the LoD offsets (:mod:`pdjit.ops.sequence_lower`)."""
from __future__ import annotations

from pdjit.codegen.cpu.lowerings import lowering
from pdjit.ops.sequence_lower import _ACT_CODES


def _floats(ctx, slots) -> bool:
    """Float32 or float64, one dtype, rank 2, for every bound slot of ``slots``."""
    bound = [s for s in slots if ctx.has_input(s) or ctx.has_output(s)]
    dts = {ctx.dtype(s) for s in bound}
    return len(dts) == 1 and dts.pop().name in ("float32", "float64") and \
        all(ctx.rank(s) == 2 for s in bound)


def _codes(ctx, *names):
    codes = [_ACT_CODES.get(ctx.attrs[n]) for n in names]
    return None if None in codes else [str(c) for c in codes]


class _Host:
    """Host lines for a recurrent op: inputs or arrays without rows when absent, outputs
    allocated by the driver or scratch arrays when not bound."""

    def __init__(self, ctx, T: str):
        self.ctx, self.T, self.lines = ctx, T, []

    @classmethod
    def recurrent(cls, ctx, slots: tuple, *activations: str):
        """The host of an ``lstm``/``gru`` (or grad) lowering, with ``X`` (Input), ``W``
        (Weight), ``H`` (the hidden size, as source), ``offs`` (Input's LoD offsets) and
        ``codes`` (of the ``activations`` attributes); ``None`` when the op's values are not
        float matrices of one dtype or an activation has no code."""
        codes = _codes(ctx, *activations) if _floats(ctx, slots) else None
        if codes is None:
            return None
        h = cls(ctx, ctx.T("Input"))
        h.X, h.W, h.codes, h.offs = ctx.inp("Input"), ctx.inp("Weight"), codes, ctx.lod("Input")
        h.H = f"{h.W}.shape[0]"
        return h

    def inp(self, slot: str, cols: str) -> str:
        return self.ctx.inp(slot) if self.ctx.has_input(slot) else self.empty(cols)

    def empty(self, cols: str) -> str:
        """An array without rows (an absent optional input)."""
        t = self.ctx.tmp("z")
        self.lines.append(f"{t} = np.zeros((0, {cols}), {self.T})")
        return t

    def out(self, slot: str, shape: str) -> str:
        return self.ctx.out_or_scratch(slot, shape, self.T, self.lines)

    def grad_of(self, slot: str, like: str) -> str:
        """``slot@GRAD`` shaped like input ``slot`` (bound as ``like``); an array without
        rows when the input is absent."""
        if not self.ctx.has_input(slot):
            return like
        return self.out(f"{slot}@GRAD", f"{self.ctx.inp(slot)}.shape")


def lstm(ctx):
    """Hidden, Cell and the batch-ordered gates through ``_nn.lod_lstm``."""
    h = _Host.recurrent(ctx, ("Input", "H0", "C0", "Weight", "Bias", "Hidden", "Cell"),
                        "gate_activation", "cell_activation", "candidate_activation")
    if h is None:
        return None
    X, W, B, H, offs, codes = h.X, h.W, ctx.inp("Bias"), h.H, h.offs, h.codes
    h0, c0 = h.inp("H0", H), h.inp("C0", H)
    rows = f"({X}.shape[0], {H})"
    hid, cell = h.out("Hidden", rows), h.out("Cell", rows)
    gate, cact = h.out("BatchGate", f"{X}.shape"), h.out("BatchCellPreAct", rows)
    a = ctx.attrs
    h.lines.append(f"{ctx.lib_fn('lod_lstm')}({X}, {offs}, {W}, {B}, {h0}, {c0}, "
                   f"{bool(a['use_peepholes'])}, {bool(a['is_reverse'])}, {', '.join(codes)}, "
                   f"{hid}, {cell}, {gate}, {cact})")
    return h.lines


def lstm_grad(ctx):
    """The gradients of ``lstm`` through ``_nn.lod_lstm_grad``."""
    slots = ("Input", "H0", "C0", "Weight", "Bias", "Hidden", "Cell", "BatchGate",
             "BatchCellPreAct", "Hidden@GRAD", "Cell@GRAD", "Input@GRAD", "Weight@GRAD",
             "Bias@GRAD", "H0@GRAD", "C0@GRAD")
    h = _Host.recurrent(ctx, slots, "gate_activation", "cell_activation",
                        "candidate_activation")
    if h is None:
        return None
    X, W, B, H, offs, codes = h.X, h.W, ctx.inp("Bias"), h.H, h.offs, h.codes
    h0, c0 = h.inp("H0", H), h.inp("C0", H)
    hid, cell, gate, cact = (ctx.inp(s) for s in ("Hidden", "Cell", "BatchGate",
                                                   "BatchCellPreAct"))
    dh, dc = ctx.inp("Hidden@GRAD"), h.inp("Cell@GRAD", H)
    dx = h.out("Input@GRAD", f"{X}.shape")
    dw, db = h.out("Weight@GRAD", f"{W}.shape"), h.out("Bias@GRAD", f"{B}.shape")
    dh0, dc0 = h.grad_of("H0", h0), h.grad_of("C0", c0)
    a = ctx.attrs
    h.lines.append(f"{ctx.lib_fn('lod_lstm_grad')}("
                   f"{offs}, {W}, {B}, {h0}, {c0}, {hid}, {cell}, {gate}, "
                   f"{cact}, {dh}, {dc}, {bool(a['use_peepholes'])}, {bool(a['is_reverse'])}, "
                   f"{', '.join(codes)}, {dx}, {dw}, {db}, {dh0}, {dc0})")
    return h.lines


def gru(ctx):
    """Hidden and the batch-ordered intermediates through ``_nn.lod_gru``."""
    h = _Host.recurrent(ctx, ("Input", "H0", "Weight", "Bias", "Hidden"), "gate_activation",
                        "activation")
    if h is None:
        return None
    X, W, H, offs, codes = h.X, h.W, h.H, h.offs, h.codes
    h0, b = h.inp("H0", H), h.inp("Bias", f"3 * {H}")
    rows = f"({X}.shape[0], {H})"
    hid, gate = h.out("Hidden", rows), h.out("BatchGate", f"{X}.shape")
    rhp, hb = h.out("BatchResetHiddenPrev", rows), h.out("BatchHidden", rows)
    a = ctx.attrs
    h.lines.append(f"{ctx.lib_fn('lod_gru')}({X}, {offs}, {W}, {b}, {h0}, {bool(a['is_reverse'])}, "
                   f"{codes[0]}, {codes[1]}, {bool(a['origin_mode'])}, {hid}, {gate}, {rhp}, "
                   f"{hb})")
    return h.lines


def gru_grad(ctx):
    """The gradients of ``gru`` through ``_nn.lod_gru_grad``."""
    slots = ("Input", "H0", "Weight", "Bias", "BatchGate", "BatchResetHiddenPrev",
             "BatchHidden", "Hidden@GRAD", "Input@GRAD", "H0@GRAD", "Weight@GRAD",
             "Bias@GRAD")
    h = _Host.recurrent(ctx, slots, "gate_activation", "activation")
    if h is None:
        return None
    X, W, H, offs, codes = h.X, h.W, h.H, h.offs, h.codes
    h0, b = h.inp("H0", H), h.inp("Bias", f"3 * {H}")
    gate, rhp, hb = (ctx.inp(s) for s in ("BatchGate", "BatchResetHiddenPrev", "BatchHidden"))
    dx, dw = h.out("Input@GRAD", f"{X}.shape"), h.out("Weight@GRAD", f"{W}.shape")
    db, dh0 = h.grad_of("Bias", b), h.grad_of("H0", h0)
    a = ctx.attrs
    h.lines.append(f"{ctx.lib_fn('lod_gru_grad')}({offs}, {W}, {b}, {h0}, {gate}, {rhp}, {hb}, "
                   f"{ctx.inp('Hidden@GRAD')}, {bool(a['is_reverse'])}, {codes[0]}, "
                   f"{codes[1]}, {bool(a['origin_mode'])}, {dx}, {dw}, {db}, {dh0})")
    return h.lines


def _conv_attrs(ctx):
    a = ctx.attrs
    if int(a["contextStride"]) != 1 or int(a["contextLength"]) < 1:
        return None
    return str(int(a["contextLength"])), str(int(a["contextStart"])), bool(a["paddingTrainable"])


def seq_conv(ctx):
    """Out = the context windows of X times Filter, through ``_nn.seq_conv``."""
    attrs = _conv_attrs(ctx)
    if attrs is None or not _floats(ctx, ("X", "Filter", "PaddingData", "Out")):
        return None
    length, start, trained = attrs
    if trained and not ctx.has_input("PaddingData"):
        return None
    X, F, T = ctx.inp("X"), ctx.inp("Filter"), ctx.T("X")
    h = _Host(ctx, T)
    pad = ctx.inp("PaddingData") if trained else h.empty(f"{X}.shape[1]")
    out = ctx.out("Out", shape=f"({X}.shape[0], {F}.shape[1])")
    h.lines.append(f"{ctx.lib_fn('seq_conv')}("
                   f"{X}, {ctx.lod('X')}, {F}, {pad}, {length}, {start}, {out})")
    return h.lines


def seq_conv_grad(ctx):
    """The gradients of ``sequence_conv`` through ``_nn.seq_conv_grad``."""
    attrs = _conv_attrs(ctx)
    slots = ("X", "Filter", "PaddingData", "Out@GRAD", "X@GRAD", "Filter@GRAD",
             "PaddingData@GRAD")
    if attrs is None or not _floats(ctx, slots):
        return None
    length, start, trained = attrs
    if trained and not ctx.has_input("PaddingData"):
        return None
    X, F, T = ctx.inp("X"), ctx.inp("Filter"), ctx.T("X")
    h = _Host(ctx, T)
    pad = ctx.inp("PaddingData") if trained else h.empty(f"{X}.shape[1]")
    dx, df = h.out("X@GRAD", f"{X}.shape"), h.out("Filter@GRAD", f"{F}.shape")
    if trained:
        dpad = h.out("PaddingData@GRAD", f"{pad}.shape")
    else:  # untrained padding: zeros, and no gradient for it
        dpad = h.empty(f"{X}.shape[1]")
        if ctx.has_output("PaddingData@GRAD"):
            ctx.out("PaddingData@GRAD", shape=f"{ctx.inp('PaddingData')}.shape", zero=True)
    h.lines.append(f"{ctx.lib_fn('seq_conv_grad')}("
                   f"{X}, {ctx.lod('X')}, {F}, {pad}, {ctx.inp('Out@GRAD')}, "
                   f"{length}, {start}, {dx}, {df}, {dpad})")
    return h.lines


for _type, _lower in (("lstm", lstm), ("lstm_grad", lstm_grad), ("gru", gru),
                      ("gru_grad", gru_grad), ("sequence_conv", seq_conv),
                      ("sequence_conv_grad", seq_conv_grad)):
    lowering(_type, host=True)(_lower)
