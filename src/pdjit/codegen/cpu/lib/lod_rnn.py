"""LoD recurrent kernels: the time loops of Fluid 1.x's ``lstm`` and ``gru`` over the sequences of a
LoD batch, and ``sequence_conv``, with their gradients (semantics: ``pdjit.ops.sequence``).

The recurrent kernels work in *batch order*, as PaddlePaddle's kernels do: the sequences are
sorted by length, longest first (ties keep their order), and time step ``t`` is the rows
``starts[t]:starts[t + 1]`` of a ``[rows, width]`` buffer, one row per sequence still alive at
``t`` in that order (``rows[i]``: the row of the input that batch row ``i`` holds; reversed
sequences walk their rows from the end). So the sequences alive at a step are a contiguous block
and the block of the step before begins with the same sequences: each step is one GEMM with the
recurrent weight over the whole block (BLAS through ``np.dot``), followed by an elementwise pass.
The gradients walk the steps backwards the same way; the weight gradients are one GEMM over all
rows at the end.

Activations are codes: 0 identity, 1 sigmoid, 2 tanh, 3 relu; sigmoid clamps its input to
``[-40, 13]`` as PaddlePaddle's recurrent kernels do, and every derivative is taken from the
activation's output.
Absent optional inputs (``H0``, ``C0``, a GRU's ``Bias``, ``PaddingData``) arrive as arrays with
no rows. A shape or LoD that does not fit raises ``ValueError`` (the step then runs the op's
reference, which names the problem).
"""
import numpy as np

from pdjit.codegen.cpu import mathfuncs as _m
from pdjit.codegen.cpu.lib._jit import by_address, compile_cost, jit, jobs

__all__ = ["lod_batch_order", "lod_lstm", "lod_lstm_grad", "lod_gru",
           "lod_gru_grad", "seq_conv", "seq_conv_grad"]

# Activations and their derivatives over a run of one row, one loop per code: with the
# branch-free helpers of ``mathfuncs`` the loops vectorise (scalar exp/tanh calls cost ~20 ns
# each and made the LSTM's elementwise pass ten times slower than its GEMMs)
@jit
def _limits(dtype_like):
    """Sigmoid's input clamp [-40, 13] in the data's type (float literals would widen)."""
    lim = np.empty(2, dtype_like.dtype)
    lim[0] = -40.0
    lim[1] = 13.0
    return lim


@jit
def _act_seg(a, j, off, n, code, lim):
    """``a[j, off:off + n] = act(a[j, off:off + n])`` for activation ``code``."""
    if code == 1:
        lo, hi = lim[0], lim[1]
        for q in range(off, off + n):
            v = a[j, q]
            v = lo if v < lo else v
            v = hi if v > hi else v
            a[j, q] = _m.sigmoid(v)
    elif code == 2:
        for q in range(off, off + n):
            a[j, q] = _m.tanh(a[j, q])
    elif code == 3:
        for q in range(off, off + n):
            v = a[j, q]
            a[j, q] = v if v > 0 else v * 0
    # 0: identity


@jit
def _dact_seg(a, j, off, n, code, out, o0):
    """``out[o0:o0 + n]`` = the derivative of activation ``code`` where its outputs are
    ``a[j, off:off + n]``."""
    if code == 1:
        for q in range(n):
            y = a[j, off + q]
            out[o0 + q] = y * (1.0 - y)
    elif code == 2:
        for q in range(n):
            y = a[j, off + q]
            out[o0 + q] = 1.0 - y * y
    elif code == 3:
        for q in range(n):
            out[o0 + q] = 1.0 if a[j, off + q] > 0 else 0.0
    else:
        for q in range(n):
            out[o0 + q] = 1.0


@jit
def lod_batch_order(offs, rows_total, reverse):
    """``(order, starts, rows)`` of the batch order of the sequences ``offs`` (see above)."""
    n = offs.shape[0] - 1
    if n < 0 or offs[0] != 0 or offs[n] != rows_total:
        raise ValueError("pdjit: the LoD does not fit the data")
    lens = np.empty(max(n, 0), np.int64)
    longest = 0
    for s in range(n):
        lens[s] = offs[s + 1] - offs[s]
        if lens[s] < 0:
            raise ValueError("pdjit: the LoD does not fit the data")
        longest = max(longest, lens[s])
    # a stable counting sort, longest first (np.argsort costs seconds of compilation)
    first = np.zeros(longest + 2, np.int64)  # first[l]: where the sequences of length l go
    for s in range(n):
        first[longest - lens[s] + 1] += 1
    for i in range(1, longest + 2):
        first[i] += first[i - 1]
    order = np.empty(max(n, 0), np.int64)
    for s in range(n):
        order[first[longest - lens[s]]] = s
        first[longest - lens[s]] += 1
    starts = np.zeros(longest + 1, np.int64)
    rows = np.empty(rows_total, np.int64)
    p = 0
    for t in range(longest):
        starts[t] = p
        for k in range(n):
            s = order[k]
            if lens[s] <= t:
                break
            rows[p] = offs[s] + (lens[s] - 1 - t if reverse else t)
            p += 1
    starts[longest] = p
    return order, starts, rows


# explicit loops rather than NumPy's slice assignments: they compile several times faster
@jit
def _gather_rows(src, order, m, dst):
    """``dst[k] = src[order[k]]`` for ``k < m``."""
    for k in range(m):
        for q in range(src.shape[1]):
            dst[k, q] = src[order[k], q]


@jit
def _scatter_rows(src, order, m, dst):
    """``dst[order[k]] = src[k]`` for ``k < m``."""
    for k in range(m):
        for q in range(src.shape[1]):
            dst[order[k], q] = src[k, q]


@jit
def _copy_rows(src, s0, m, dst, d0):
    """``dst[d0:d0 + m] = src[s0:s0 + m]``."""
    for k in range(m):
        for q in range(src.shape[1]):
            dst[d0 + k, q] = src[s0 + k, q]


@jit
def _add_rows(src, m, dst, d0):
    """``dst[d0:d0 + m] += src[:m]``."""
    for k in range(m):
        for q in range(src.shape[1]):
            dst[d0 + k, q] += src[k, q]


@jit
def _transpose(a):
    t = np.empty((a.shape[1], a.shape[0]), a.dtype)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            t[j, i] = a[i, j]
    return t


# ---- lstm ------------------------------------------------------------------------------------
@jit
def _lstm_check(x, w, b, h0, c0, n, peep):
    H = w.shape[0]
    if w.shape[1] != 4 * H or x.shape[1] != 4 * H or b.size != (7 * H if peep else 4 * H):
        raise ValueError("pdjit: lstm: the weights do not fit the input")
    if (h0.shape[0] > 0 and h0.shape != (n, H)) or (c0.shape[0] > 0 and c0.shape != (n, H)):
        raise ValueError("pdjit: lstm: H0/C0 do not fit the sequences")


@by_address
@jit
def lod_lstm(x, offs, w, b, h0, c0, peep, reverse, ga, ca, cda, hidden, cell, gate, cact):
    """Fluid's ``lstm`` over the sequences ``offs`` of ``x`` ([rows, 4H], gates {c~, i, f, o}
    already projected): writes ``hidden``, ``cell`` ([rows, H], the input's row order),
    ``gate`` (the activated gates) and ``cact`` (``act_cell(c)``), both in batch order."""
    T = x.shape[0]
    H = w.shape[0]
    n = offs.shape[0] - 1
    _lstm_check(x, w, b, h0, c0, n, peep)
    if hidden.shape != (T, H) or cell.shape != (T, H) or gate.shape != (T, 4 * H) or \
            cact.shape != (T, H):
        raise ValueError("pdjit: lstm: the outputs do not fit the input")
    order, starts, rows = lod_batch_order(offs, T, reverse)
    bf = b.reshape(b.size)
    has_h0, has_c0 = h0.shape[0] > 0, c0.shape[0] > 0
    cb = np.empty((T, H), x.dtype)
    hb = np.empty((T, H), x.dtype)
    for i in range(T):
        src = x[rows[i]]
        dst = gate[i]
        for q in range(4 * H):
            dst[q] = src[q] + bf[q]
    cp = np.zeros(H, x.dtype)
    hs = np.empty((max(n, 1), H), x.dtype)
    lim = _limits(x)
    for t in range(starts.shape[0] - 1):
        p = starts[t]
        m = starts[t + 1] - p
        pp = starts[t - 1] if t > 0 else 0
        if t > 0:
            _add_rows(np.dot(hb[pp:pp + m], w), m, gate, p)
        elif has_h0:
            _gather_rows(h0, order, m, hs)
            _add_rows(np.dot(hs[:m], w), m, gate, p)
        has_prev = t > 0 or has_c0
        for k in range(m):
            j = p + k
            for q in range(H):  # zeros without a previous cell
                cp[q] = cb[pp + k, q] if t > 0 else (c0[order[k], q] if has_c0 else 0.0)
            if peep and has_prev:
                for q in range(H):
                    gate[j, H + q] += cp[q] * bf[4 * H + q]
                    gate[j, 2 * H + q] += cp[q] * bf[5 * H + q]
            _act_seg(gate, j, 0, H, cda, lim)
            _act_seg(gate, j, H, 2 * H, ga, lim)
            for q in range(H):
                cb[j, q] = gate[j, q] * gate[j, H + q] + cp[q] * gate[j, 2 * H + q]
            if peep:
                for q in range(H):
                    gate[j, 3 * H + q] += cb[j, q] * bf[6 * H + q]
            _act_seg(gate, j, 3 * H, H, ga, lim)
            for q in range(H):
                cact[j, q] = cb[j, q]
            _act_seg(cact, j, 0, H, ca, lim)
            for q in range(H):
                hb[j, q] = gate[j, 3 * H + q] * cact[j, q]
    _scatter_rows(hb, rows, T, hidden)
    _scatter_rows(cb, rows, T, cell)


@by_address
@jit
def lod_lstm_grad(offs, w, b, h0, c0, hidden, cell, gate, cact, dh_in, dc_in, peep, reverse,
                  ga, ca, cda, dx, dw, db, dh0, dc0):
    """The gradients of :func:`lod_lstm` given those of ``hidden`` (``dh_in``) and ``cell``
    (``dc_in``, no rows: zeros): ``dx`` [rows, 4H], ``dw``, ``db`` (the bias's shape), ``dh0``,
    ``dc0`` (no rows when H0/C0 are absent)."""
    T = hidden.shape[0]
    H = w.shape[0]
    n = offs.shape[0] - 1
    _lstm_check(dx, w, b, h0, c0, n, peep)
    if cell.shape != (T, H) or gate.shape != (T, 4 * H) or cact.shape != (T, H) or \
            dh_in.shape != (T, H) or (dc_in.shape[0] > 0 and dc_in.shape != (T, H)) or \
            dx.shape != (T, 4 * H) or dw.shape != w.shape or db.size != b.size or \
            dh0.shape != h0.shape or dc0.shape != c0.shape:
        raise ValueError("pdjit: lstm_grad: the gradients do not fit the op")
    order, starts, rows = lod_batch_order(offs, T, reverse)
    bf = b.reshape(b.size)
    has_h0, has_c0 = h0.shape[0] > 0, c0.shape[0] > 0
    dhb = np.empty((T, H), dx.dtype)
    dcb = np.zeros((T, H), dx.dtype)
    _gather_rows(dh_in, rows, T, dhb)
    if dc_in.shape[0] > 0:
        _gather_rows(dc_in, rows, T, dcb)
    dg = np.empty((T, 4 * H), dx.dtype)
    hprev = np.zeros((T, H), dx.dtype)
    wt = _transpose(w)
    dpeep = np.zeros(3 * H)
    dh0s = np.zeros((max(n, 1), H), dx.dtype)
    dc0s = np.zeros((max(n, 1), H), dx.dtype)
    cp = np.zeros(H, dx.dtype)
    dcp = np.zeros(H, dx.dtype)
    dv = np.empty(5 * H, dx.dtype)  # the activations' derivatives: 4 gates, then the cell's
    for t in range(starts.shape[0] - 2, -1, -1):
        p = starts[t]
        m = starts[t + 1] - p
        pp = starts[t - 1] if t > 0 else 0
        has_prev = t > 0 or has_c0
        for k in range(m):
            j = p + k
            rj = rows[j]
            for q in range(H):  # zeros without a previous cell
                cp[q] = cell[rows[pp + k], q] if t > 0 else (c0[order[k], q] if has_c0 else 0.0)
            _dact_seg(gate, j, 0, H, cda, dv, 0)
            _dact_seg(gate, j, H, 2 * H, ga, dv, H)
            _dact_seg(gate, j, 3 * H, H, ga, dv, 3 * H)
            _dact_seg(cact, j, 0, H, ca, dv, 4 * H)
            for q in range(H):
                a, ig = gate[j, q], gate[j, H + q]
                fg, og = gate[j, 2 * H + q], gate[j, 3 * H + q]
                dh = dhb[j, q]
                dgo = dh * cact[j, q] * dv[3 * H + q]
                dc = dcb[j, q] + dh * og * dv[4 * H + q]
                if peep:
                    dc += dgo * bf[6 * H + q]
                dgi = dc * a * dv[H + q]
                dgf = dc * cp[q] * dv[2 * H + q]
                dg[j, q] = dc * ig * dv[q]
                dg[j, H + q] = dgi
                dg[j, 2 * H + q] = dgf
                dg[j, 3 * H + q] = dgo
                dcp[q] = dc * fg + (dgi * bf[4 * H + q] + dgf * bf[5 * H + q] if peep else 0.0)
            if peep:
                for q in range(H):
                    dpeep[2 * H + q] += dg[j, 3 * H + q] * cell[rj, q]
                    dpeep[q] += dg[j, H + q] * cp[q]
                    dpeep[H + q] += dg[j, 2 * H + q] * cp[q]
            if has_prev:
                for q in range(H):
                    if t > 0:
                        dcb[pp + k, q] += dcp[q]
                    else:
                        dc0s[k, q] = dcp[q]
        if t > 0:
            _add_rows(np.dot(dg[p:p + m], wt), m, dhb, pp)
            _gather_rows(hidden, rows[pp:pp + m], m, hprev[p:p + m])
        elif has_h0:
            _copy_rows(np.dot(dg[p:p + m], wt), 0, m, dh0s, 0)
            _gather_rows(h0, order, m, hprev[p:p + m])
    _copy_rows(np.dot(_transpose(hprev), dg), 0, H, dw, 0)
    dbf = db.reshape(db.size)
    for q in range(4 * H):
        acc = 0.0
        for i in range(T):
            acc += dg[i, q]
        dbf[q] = acc
    if peep:
        for q in range(3 * H):
            dbf[4 * H + q] = dpeep[q]
    _scatter_rows(dg, rows, T, dx)
    if has_h0:
        _scatter_rows(dh0s, order, n, dh0)
    if has_c0:
        _scatter_rows(dc0s, order, n, dc0)


# ---- gru -------------------------------------------------------------------------------------
@jit
def _gru_check(x, w, b, h0, n):
    H = w.shape[0]
    if w.shape[1] != 3 * H or x.shape[1] != 3 * H or (b.size != 0 and b.size != 3 * H):
        raise ValueError("pdjit: gru: the weights do not fit the input")
    if h0.shape[0] > 0 and h0.shape != (n, H):
        raise ValueError("pdjit: gru: H0 does not fit the sequences")


@jit
def _gru_weights(w):
    """The update/reset weight ``[H, 2H]`` and the candidate weight ``[H, H]``: the first
    ``2H * H`` values of ``w`` and the rest, as PaddlePaddle lays them out."""
    H = w.shape[0]
    wf = w.reshape(w.size)
    return wf[:2 * H * H].reshape((H, 2 * H)), wf[2 * H * H:].reshape((H, H))


@by_address
@jit
def lod_gru(x, offs, w, b, h0, reverse, ga, act, origin, hidden, gate, rhp, hb):
    """Fluid's ``gru`` over the sequences ``offs`` of ``x`` ([rows, 3H], gates {u, r, c}
    already projected): ``hidden`` in the input's row order; ``gate`` (activated gates),
    ``rhp`` (``r * h_prev``) and ``hb`` (the hidden state) in batch order."""
    T = x.shape[0]
    H = w.shape[0]
    n = offs.shape[0] - 1
    _gru_check(x, w, b, h0, n)
    if hidden.shape != (T, H) or gate.shape != (T, 3 * H) or rhp.shape != (T, H) or \
            hb.shape != (T, H):
        raise ValueError("pdjit: gru: the outputs do not fit the input")
    order, starts, rows = lod_batch_order(offs, T, reverse)
    wg, ws = _gru_weights(w)
    bf = b.reshape(b.size)
    has_b, has_h0 = b.size > 0, h0.shape[0] > 0
    for i in range(T):
        src = x[rows[i]]
        dst = gate[i]
        for q in range(3 * H):
            dst[q] = src[q] + bf[q] if has_b else src[q]
    hp = np.zeros((max(n, 1), H), x.dtype)  # zeros without a previous state
    lim = _limits(x)
    for t in range(starts.shape[0] - 1):
        p = starts[t]
        m = starts[t + 1] - p
        has_prev = t > 0 or has_h0
        if t > 0:
            _copy_rows(hb, starts[t - 1], m, hp, 0)
        elif has_h0:
            _gather_rows(h0, order, m, hp)
        if has_prev:
            ur = np.dot(hp[:m], wg)
            for k in range(m):
                for q in range(2 * H):
                    gate[p + k, q] += ur[k, q]
        for k in range(m):
            j = p + k
            _act_seg(gate, j, 0, 2 * H, ga, lim)
            for q in range(H):
                rhp[j, q] = gate[j, H + q] * hp[k, q]
        if has_prev:
            cc = np.dot(rhp[p:p + m], ws)
            for k in range(m):
                for q in range(H):
                    gate[p + k, 2 * H + q] += cc[k, q]
        for k in range(m):
            j = p + k
            _act_seg(gate, j, 2 * H, H, act, lim)
            for q in range(H):
                u, c, h = gate[j, q], gate[j, 2 * H + q], hp[k, q]
                hb[j, q] = u * h + (1.0 - u) * c if origin else (1.0 - u) * h + u * c
    _scatter_rows(hb, rows, T, hidden)


@by_address
@jit
def lod_gru_grad(offs, w, b, h0, gate, rhp, hb, dh_in, reverse, ga, act, origin, dx, dw, db,
                 dh0):
    """The gradients of :func:`lod_gru` given that of ``hidden`` (``dh_in``): ``dx``
    [rows, 3H], ``dw``, ``db`` (no values when the bias is absent), ``dh0`` (no rows when H0
    is absent)."""
    T = hb.shape[0]
    H = w.shape[0]
    n = offs.shape[0] - 1
    _gru_check(dx, w, b, h0, n)
    if gate.shape != (T, 3 * H) or rhp.shape != (T, H) or dh_in.shape != (T, H) or \
            dx.shape != (T, 3 * H) or dw.shape != w.shape or db.size != b.size or \
            dh0.shape != h0.shape:
        raise ValueError("pdjit: gru_grad: the gradients do not fit the op")
    order, starts, rows = lod_batch_order(offs, T, reverse)
    wg, ws = _gru_weights(w)
    wgt = _transpose(wg)
    wst = _transpose(ws)
    has_h0 = h0.shape[0] > 0
    dhb = np.empty((T, H), dx.dtype)
    _gather_rows(dh_in, rows, T, dhb)
    dur = np.zeros((T, 2 * H), dx.dtype)  # the update and reset gates' pre-activation grads
    dgc = np.empty((T, H), dx.dtype)      # the candidate's
    hprev = np.zeros((T, H), dx.dtype)
    hp = np.zeros((max(n, 1), H), dx.dtype)
    dhp = np.zeros((max(n, 1), H), dx.dtype)
    dh0s = np.zeros((max(n, 1), H), dx.dtype)
    dv = np.empty(3 * H, dx.dtype)
    for t in range(starts.shape[0] - 2, -1, -1):
        p = starts[t]
        m = starts[t + 1] - p
        pp = starts[t - 1] if t > 0 else 0
        has_prev = t > 0 or has_h0
        if t > 0:
            _copy_rows(hb, pp, m, hp, 0)
        elif has_h0:
            _gather_rows(h0, order, m, hp)
        else:
            for k in range(m):
                for q in range(H):
                    hp[k, q] = 0.0
        for k in range(m):
            j = p + k
            _dact_seg(gate, j, 0, 2 * H, ga, dv, 0)
            _dact_seg(gate, j, 2 * H, H, act, dv, 2 * H)
            for q in range(H):
                u, c = gate[j, q], gate[j, 2 * H + q]
                dh = dhb[j, q]
                h = hp[k, q]
                if origin:
                    du, dc, dhp[k, q] = dh * (h - c), dh * (1.0 - u), dh * u
                else:
                    du, dc, dhp[k, q] = dh * (c - h), dh * u, dh * (1.0 - u)
                dur[j, q] = du * dv[q]
                dgc[j, q] = dc * dv[2 * H + q]
        if not has_prev:
            continue
        drhp = np.dot(dgc[p:p + m], wst)
        for k in range(m):
            j = p + k
            _dact_seg(gate, j, H, H, ga, dv, H)
            for q in range(H):
                r = gate[j, H + q]
                dur[j, H + q] = drhp[k, q] * hp[k, q] * dv[H + q]
                dhp[k, q] += drhp[k, q] * r
                hprev[j, q] = hp[k, q]
        _add_rows(np.dot(dur[p:p + m], wgt), m, dhp, 0)
        if t > 0:
            _add_rows(dhp, m, dhb, pp)
        else:
            _copy_rows(dhp, 0, m, dh0s, 0)
    dwg, dws = _gru_weights(dw)
    _copy_rows(np.dot(_transpose(hprev), dur), 0, H, dwg, 0)
    _copy_rows(np.dot(_transpose(rhp), dgc), 0, H, dws, 0)
    dbf = db.reshape(db.size)
    if db.size > 0:
        for q in range(3 * H):
            acc = 0.0
            for i in range(T):
                acc += dur[i, q] if q < 2 * H else dgc[i, q - 2 * H]
            dbf[q] = acc
    for i in range(T):
        dst = dx[rows[i]]
        for q in range(2 * H):
            dst[q] = dur[i, q]
        for q in range(H):
            dst[2 * H + q] = dgc[i, q]
    if has_h0:
        _scatter_rows(dh0s, order, n, dh0)


# ---- sequence_conv ---------------------------------------------------------------------------
@jit
def _context_cols(x, offs, pad, length, start, cols):
    """``cols[t]``: the ``length`` rows of ``t``'s context window, side by side; rows outside
    the sequence are zeros, or ``pad`` rows (the ``up`` rows above first, then those below)."""
    T, D = x.shape
    n = offs.shape[0] - 1
    if n < 0 or offs[0] != 0 or offs[n] != T:
        raise ValueError("pdjit: the LoD does not fit the data")
    up = max(0, -start)
    down = max(0, start + length - 1)
    has_pad = pad.shape[0] > 0
    if has_pad and pad.shape != (up + down, D):
        raise ValueError("pdjit: sequence_conv: PaddingData does not fit")
    for s in range(n):
        b, e = offs[s], offs[s + 1]
        if e < b:
            raise ValueError("pdjit: the LoD does not fit the data")
        for t in range(b, e):
            row = cols[t]
            for j in range(length):
                r = t + start + j
                if b <= r < e:
                    for q in range(D):
                        row[j * D + q] = x[r, q]
                elif has_pad:
                    src = pad[r - b + up] if r < b else pad[up + r - e]
                    for q in range(D):
                        row[j * D + q] = src[q]
                else:
                    for q in range(D):
                        row[j * D + q] = 0.0


@by_address
@jit
def seq_conv(x, offs, filt, pad, length, start, out):
    """``out = cols @ filt``: the context window of each row (see :func:`_context_cols`) times
    the filter ``[length * D, O]``."""
    T, D = x.shape
    if filt.shape[0] != length * D or out.shape != (T, filt.shape[1]):
        raise ValueError("pdjit: sequence_conv: the filter does not fit the input")
    cols = np.empty((T, length * D), x.dtype)
    _context_cols(x, offs, pad, length, start, cols)
    _copy_rows(np.dot(cols, filt), 0, T, out, 0)


@by_address
@jit
def seq_conv_grad(x, offs, filt, pad, dout, length, start, dx, dfilt, dpad):
    """The gradients of :func:`seq_conv`: ``dx``, ``dfilt`` and ``dpad`` (no rows when the
    padding is not trained)."""
    T, D = x.shape
    if filt.shape[0] != length * D or dout.shape != (T, filt.shape[1]) or dx.shape != x.shape \
            or dfilt.shape != filt.shape or (dpad.shape[0] > 0 and dpad.shape != pad.shape):
        raise ValueError("pdjit: sequence_conv_grad: the gradients do not fit the op")
    cols = np.empty((T, length * D), x.dtype)
    _context_cols(x, offs, pad, length, start, cols)
    _copy_rows(np.dot(_transpose(cols), dout), 0, filt.shape[0], dfilt, 0)
    dcols = np.dot(dout, _transpose(filt))
    up = max(0, -start)
    for i in range(T):
        for q in range(D):
            dx[i, q] = 0.0
    for i in range(dpad.shape[0]):
        for q in range(D):
            dpad[i, q] = 0.0
    for s in range(offs.shape[0] - 1):
        b, e = offs[s], offs[s + 1]
        for t in range(b, e):
            row = dcols[t]
            for j in range(length):
                r = t + start + j
                if b <= r < e:
                    for q in range(D):
                        dx[r, q] += row[j * D + q]
                elif dpad.shape[0] > 0:
                    k = r - b + up if r < b else up + r - e
                    for q in range(D):
                        dpad[k, q] += row[j * D + q]


# the argument types the lowerings pass: 2-D C-contiguous data of the op's dtype, LoD offsets
# (read-only int64: "lod")
_L = "lod"
jobs("lod_lstm")(lambda T: [(lod_lstm, ((T, 2), _L, (T, 2), (T, 2), (T, 2), (T, 2), bool, bool,
                                        int, int, int, (T, 2), (T, 2), (T, 2), (T, 2)))])
jobs("lod_lstm_grad")(lambda T: [(lod_lstm_grad, (_L,) + ((T, 2),) * 10 +
                                  (bool, bool, int, int, int) + ((T, 2),) * 5)])
jobs("lod_gru")(lambda T: [(lod_gru, ((T, 2), _L, (T, 2), (T, 2), (T, 2), bool, int, int, bool,
                                      (T, 2), (T, 2), (T, 2), (T, 2)))])
jobs("lod_gru_grad")(lambda T: [(lod_gru_grad, (_L,) + ((T, 2),) * 7 + (bool, int, int, bool) +
                                 ((T, 2),) * 4)])
jobs("seq_conv")(lambda T: [(seq_conv, ((T, 2), _L, (T, 2), (T, 2), int, int, (T, 2)))])
jobs("seq_conv_grad")(lambda T: [(seq_conv_grad, ((T, 2), _L) + ((T, 2),) * 3 + (int, int) +
                                  ((T, 2),) * 3)])

# compile times (CPU seconds, a cold compile of the signature its jobs predict, alone in a fresh
# process, 2 cores at load 5-26): the compile worker balances its groups by them
compile_cost(3.8, lod_lstm_grad, lod_gru_grad)  # 3.82, 3.69 s
compile_cost(3.2, lod_lstm, lod_gru)  # 3.25, 3.19 s
compile_cost(1.5, seq_conv_grad)
compile_cost(1.2, seq_conv)
