"""Recurrent ops: ``rnn`` (Paddle 2.x/3.x's LSTM/GRU/simple RNN op), Fluid 1.x's LoD ``lstm`` and
``gru``, and ``sequence_conv``, with their gradients.

``rnn`` and ``rnn_grad`` are PaddlePaddle 3.3.1's legacy ops (what ``nn.LSTM``, ``nn.GRU`` and
``nn.SimpleRNN`` write in a legacy program), compared with Paddle in every mode, stacked and
bidirectional, with and without sequence lengths:

- Inputs: ``Input`` ``[T, B, I]`` (time-major), ``PreState`` (``[h0]``, or ``[h0, c0]`` for
  LSTM; each ``[L * D, B, H]``, ``D = 2`` when ``is_bidirec``), ``WeightList`` in Paddle's order
  (every ``w_ih [G*H, I_l]``, ``w_hh [G*H, H]`` per layer and direction, then every ``b_ih``,
  ``b_hh`` ``[G*H]``; ``I_l`` is I for the first layer, ``D * H`` after), optional
  ``SequenceLength`` (int ``[B]``, each in ``0..T``). Outputs: ``Out`` ``[T, B, D * H]`` (the
  directions side by side), ``State`` (last states, as PreState), ``Reserve`` (what the
  gradient reads, the layout of the native rnn kernels, in Input's dtype; Paddle declares
  it uint8, and a variable declared so holds the same bytes) and ``DropoutState`` (optional,
  uint8: the dropout masks of the layers but the last, ``[(L-1) * T * B * D*H]`` when
  dropping, else empty; the gradient of a dropping op needs it). Paddle's slot flags and
  attribute defaults (``mode`` defaults to ``RNN_TANH``).
- Cells (``mode``): LSTM gates i, f, c~, o: ``c = f * c' + i * c~``, ``h = o * tanh(c)``;
  GRU gates r, z, c~: ``c~ = tanh(W_ic x + b_ic + r * (W_hc h' + b_hc))``,
  ``h = z * h' + (1 - z) * c~``; RNN_TANH / RNN_RELU ``h = act(W_ih x + b_ih + W_hh h' + b_hh)``.
  The reverse direction runs from the last step (of each sequence) to the first.
- ``SequenceLength``: steps at or past a sequence's length keep its state and write zeros.
- Dropout (``dropout_prob`` when not ``is_test``): on the outputs of every layer but the last,
  upscaled (kept values divided by ``1 - dropout_prob``; compared with Paddle through the mask
  it writes), drawn from pdjit's random stream (``seed`` fixes it); every layer's mask goes to
  ``DropoutState`` for the gradient (Paddle keeps one ``[T, B, D*H]`` mask, the last drawn;
  for two layers the layouts agree).
- Paddle 3.3.1's own ``rnn_grad`` disagrees with finite differences of its forward for the
  reverse direction with ``SequenceLength`` (``tests/fixtures/make_rnn_fixtures.py`` records
  where); pdjit's gradient is that of the forward.
- ``rnn_grad`` reads the forward inputs, ``Out``, ``DropoutState``, ``Reserve``, ``Out@GRAD``
  and ``State@GRAD`` and writes ``Input@GRAD``, ``PreState@GRAD`` and ``WeightList@GRAD``
  (Paddle's slots; no gradient to SequenceLength).

Each target lowers both ops its own way (``codegen/<target>/lowerings/rnn.py``).
"""
from __future__ import annotations

import numpy as np

from pdjit.framework import random as prandom
from pdjit.framework.errors import ShapeMismatch
from pdjit.framework.registry import (
    OPAQUE,
    RANDOM,
    Bool,
    Float,
    GradOpSpec,
    Int,
    Opaque,
    Str,
    VarMeta,
    grad_var_name,
    register_op,
)
from pdjit.ops._common import FLOATS, check_dtype

_MODES = {"LSTM": (0, 4), "GRU": (1, 3), "RNN_TANH": (2, 1), "RNN_RELU": (3, 1)}
_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
_INT = (np.dtype(np.int32), np.dtype(np.int64))

_RNN_ATTRS = {
    "dropout_prob": Float(0.0, low=0.0, high=0.0, at_least=0.0, less_than=1.0),
    "is_bidirec": Bool(False),
    "input_size": Int(10, low=1, high=8),
    "hidden_size": Int(100, low=1, high=8),
    "num_layers": Int(1, low=1, high=3),
    "mode": Str("RNN_TANH", choices=tuple(_MODES)),  # Paddle's default
    "seed": Int(0, low=0, high=1000),
    "is_test": Bool(False),
}


# ---- shapes ------------------------------------------------------------------------------------
def _mode(mode: str, op: str) -> tuple:
    if mode not in _MODES:
        raise ShapeMismatch(f"{op}: mode must be one of {list(_MODES)}, got {mode!r}")
    return _MODES[mode]


def _dims(a) -> str:
    """A build-time dim for a message: ``?`` when unknown."""
    return "?" if a < 0 else str(a)


def _check(op, Input, PreState, WeightList, SequenceLength, mode, num_layers, is_bidirec,
           hidden_size, dropout_prob) -> tuple:
    """Checks the op's inputs (metas or arrays); returns ``(code, G, L, D, H)``."""
    code, g = _mode(mode, op)
    check_dtype(Input, FLOATS, f"{op}: Input")
    if len(Input.shape) != 3:
        raise ShapeMismatch(f"{op}: Input must be [seq_len, batch, input_size] (time-major), "
                            f"got shape {list(Input.shape)}")
    if num_layers < 1:
        raise ShapeMismatch(f"{op}: num_layers must be >= 1, got {num_layers}")
    if not 0.0 <= dropout_prob < 1.0:
        raise ShapeMismatch(f"{op}: dropout_prob must lie in [0, 1), got {dropout_prob}")
    L, D = int(num_layers), 2 if is_bidirec else 1
    T, B, I = (int(d) for d in Input.shape)
    want = 2 if code == 0 else 1
    if len(PreState) != want:
        raise ShapeMismatch(f"{op}: PreState must hold {want} tensor(s) for mode {mode!r} "
                            f"({'[h0, c0]' if want == 2 else '[h0]'}), got {len(PreState)}")
    H = int(hidden_size)
    for i, s in enumerate(PreState):
        shape = tuple(int(d) for d in s.shape)
        if s.dtype != Input.dtype:
            raise ShapeMismatch(f"{op}: PreState[{i}] must have Input's dtype {Input.dtype}, "
                                f"got {s.dtype}")
        ok = (len(shape) == 3 and shape[0] in (L * D, -1) and shape[2] in (H, -1)
              and (B < 0 or shape[1] in (B, -1)))
        if not ok:
            raise ShapeMismatch(f"{op}: PreState[{i}] must have shape [num_layers * "
                                f"directions, batch, hidden_size] = [{L * D}, {_dims(B)}, "
                                f"{H}], got {list(shape)}")
    n = 4 * L * D
    if len(WeightList) != n:
        raise ShapeMismatch(f"{op}: WeightList must hold {n} tensors for num_layers={L}, "
                            f"is_bidirec={bool(is_bidirec)} (w_ih, w_hh per layer and "
                            f"direction, then b_ih, b_hh), got {len(WeightList)}")
    gh = g * H
    for k in range(L * D):
        il = I if k < D else D * H
        for j, want_shape in ((2 * k, (gh, il)), (2 * k + 1, (gh, H)),
                              (2 * L * D + 2 * k, (gh,)), (2 * L * D + 2 * k + 1, (gh,))):
            w = WeightList[j]
            shape = tuple(int(d) for d in w.shape)
            fits = len(shape) == len(want_shape) and all(
                a == b or a < 0 or b < 0 for a, b in zip(shape, want_shape))
            if not fits:
                what = ("w_ih", "w_hh", "b_ih", "b_hh")[(j % 2) + (2 if j >= 2 * L * D else 0)]
                raise ShapeMismatch(
                    f"{op}: WeightList[{j}] ({what} of layer {k // D}, direction {k % D}) "
                    f"must have shape [{', '.join(_dims(d) for d in want_shape)}] for mode "
                    f"{mode!r}, got {list(shape)}")
            if w.dtype != Input.dtype:
                raise ShapeMismatch(f"{op}: WeightList[{j}] must have Input's dtype "
                                    f"{Input.dtype}, got {w.dtype}")
    if SequenceLength is not None:
        check_dtype(SequenceLength, _INT, f"{op}: SequenceLength")
        shape = tuple(int(d) for d in SequenceLength.shape)
        if len(shape) != 1 or (B >= 0 and shape[0] not in (B, -1)):
            raise ShapeMismatch(f"{op}: SequenceLength must have shape [batch] = "
                                f"[{_dims(B)}], got {list(shape)}")
    return code, g, L, D, H


def _reserve_values(g, T, B, H, L, D) -> int:
    """Values of the dtype in Reserve (the native rnn kernels' layout)."""
    return L * D * T * B * (g + 2) * H + (L - 1) * T * B * D * H


def _dropping(dropout_prob, is_test, L) -> bool:
    return bool(dropout_prob > 0.0 and not is_test and L > 1)


def _rnn_infer(Input, PreState, WeightList, SequenceLength=None, *, mode, num_layers,
               is_bidirec, hidden_size, dropout_prob, is_test, **_):
    code, g, L, D, H = _check("rnn", Input, PreState, WeightList, SequenceLength, mode,
                              num_layers, is_bidirec, hidden_size, dropout_prob)
    T, B, _ = Input.shape
    known = T >= 0 and B >= 0
    res = _reserve_values(g, T, B, H, L, D) if known else -1
    drop = ((L - 1) * T * B * D * H if known else -1) if _dropping(dropout_prob, is_test, L) \
        else 0
    u8 = np.dtype(np.uint8)
    return {"Out": VarMeta((T, B, D * H), Input.dtype),
            "State": [s.with_(shape=(L * D, B, H)) for s in PreState],
            "Reserve": VarMeta((res,), Input.dtype), "DropoutState": VarMeta((drop,), u8)}


# ---- the reference, in float64 -----------------------------------------------------------------
def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _lens(SequenceLength, T, B, op):
    if SequenceLength is None:
        return np.full(B, T, np.int64)
    lens = np.asarray(SequenceLength).astype(np.int64).reshape(-1)
    if lens.size != B:
        raise ShapeMismatch(f"{op}: SequenceLength must hold {B} values (one per sequence), "
                            f"got {lens.size}")
    if lens.size and (lens.min() < 0 or lens.max() > T):
        raise ShapeMismatch(f"{op}: SequenceLength values must lie in [0, {T}] (the steps of "
                            f"Input), got {lens.tolist()}")
    return lens


def _split_weights(WeightList, L, D):
    n = 2 * L * D
    return [(np.asarray(WeightList[2 * k], np.float64), np.asarray(WeightList[2 * k + 1],
                                                                   np.float64),
             np.asarray(WeightList[n + 2 * k], np.float64),
             np.asarray(WeightList[n + 2 * k + 1], np.float64)) for k in range(L * D)]


def _cell(code, xg, hg, h, c, H):
    """One step for the whole batch: (h_new, c_new, gates, aux) in float64."""
    if code == 0:
        a = xg + hg
        i, f, o = _sig(a[:, :H]), _sig(a[:, H:2 * H]), _sig(a[:, 3 * H:])
        g = np.tanh(a[:, 2 * H:3 * H])
        cn = f * c + i * g
        return o * np.tanh(cn), cn, np.concatenate([i, f, g, o], axis=1), c
    if code == 1:
        r = _sig(xg[:, :H] + hg[:, :H])
        z = _sig(xg[:, H:2 * H] + hg[:, H:2 * H])
        hc = hg[:, 2 * H:]
        cand = np.tanh(xg[:, 2 * H:] + r * hc)
        return z * h + (1.0 - z) * cand, c, np.concatenate([r, z, cand], axis=1), hc
    a = xg + hg
    hn = np.tanh(a) if code == 2 else np.maximum(a, 0.0)
    return hn, c, hn, np.zeros_like(h)


def _run_forward(code, G, L, D, H, x, states, weights, lens, masks, scale):
    """The forward pass in float64: (out, hn, cn, record) where ``record`` holds per
    ``(layer, direction)`` the gates, states before each step and auxiliaries, and the layers'
    outputs as the next layer read them."""
    T, B, _ = x.shape
    h0 = np.asarray(states[0], np.float64)
    c0 = np.asarray(states[1], np.float64) if code == 0 else np.zeros_like(h0)
    inp = np.asarray(x, np.float64)
    hn, cn = np.empty_like(h0), np.empty_like(c0)
    blocks, layer_outs = [], []
    for layer in range(L):
        y = np.zeros((T, B, D * H))
        for d in range(D):
            k = layer * D + d
            wih, whh, bih, bhh = weights[k]
            xp = inp @ wih.T + bih
            h, c = h0[k].copy(), c0[k].copy()
            gates, hprev, aux = (np.zeros((T, B, G * H)), np.zeros((T, B, H)),
                                 np.zeros((T, B, H)))
            for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                alive = (t < lens)[:, None]
                hnew, cnew, gt, ax = _cell(code, xp[t], h @ whh.T + bhh, h, c, H)
                hprev[t] = h
                gates[t] = np.where(alive, gt, 0.0)
                aux[t] = np.where(alive, ax, 0.0)
                y[t, :, d * H:(d + 1) * H] = np.where(alive, hnew, 0.0)
                h = np.where(alive, hnew, h)
                c = np.where(alive, cnew, c)
            hn[k], cn[k] = h, c
            blocks.append((gates, hprev, aux))
        if layer < L - 1:
            if masks is not None:
                y = np.where(masks[layer], y * scale, 0.0)
            layer_outs.append(y)
        inp = y
    return inp, hn, cn, blocks, layer_outs


def _masks(ctx, seed, shape, p):
    key = ctx.rng_key() if ctx is not None else prandom.op_key(seed, 0, 0, 0, 0)
    n = int(np.prod(shape))
    return (prandom.uniform01(key, n) >= p).reshape(shape)


def _rnn_ref(Input, PreState, WeightList, SequenceLength=None, *, mode, num_layers, is_bidirec,
             hidden_size, dropout_prob, is_test, seed, ctx=None, **_):
    code, G, L, D, H = _check("rnn", Input, PreState, WeightList, SequenceLength, mode,
                              num_layers, is_bidirec, hidden_size, dropout_prob)
    T, B, _ = Input.shape
    lens = _lens(SequenceLength, T, B, "rnn")
    masks, scale = None, 1.0
    if _dropping(dropout_prob, is_test, L):
        masks = _masks(ctx, seed, (L - 1, T, B, D * H), dropout_prob)
        scale = 1.0 / (1.0 - dropout_prob)
    out, hn, cn, blocks, layer_outs = _run_forward(
        code, G, L, D, H, Input, PreState, _split_weights(WeightList, L, D), lens, masks, scale)
    dt = Input.dtype
    parts = [a.reshape(-1) for blk in blocks for a in blk] + [y.reshape(-1) for y in layer_outs]
    reserve = np.concatenate(parts).astype(dt) if parts else np.empty(0, dt)
    states = [hn.astype(dt)] + ([cn.astype(dt)] if code == 0 else [])
    return {"Out": out.astype(dt), "State": states, "Reserve": reserve,
            "DropoutState": (masks.astype(np.uint8).reshape(-1) if masks is not None
                             else np.empty(0, np.uint8))}


def _rnn_grad_maker(op):
    ins = {s: op.input(s) for s in ("Input", "PreState", "WeightList", "SequenceLength")
           if op.input(s)}
    ins.update({s: op.output(s) for s in ("Out", "DropoutState", "Reserve") if op.output(s)})
    ins["Out@GRAD"] = [grad_var_name(n) for n in op.output("Out")]
    ins["State@GRAD"] = [grad_var_name(n) for n in op.output("State")]
    outs = {f"{s}@GRAD": [grad_var_name(n) for n in op.input(s)]
            for s in ("Input", "PreState", "WeightList")}
    attrs = {k: v for k, v in op.all_attrs().items() if k in _RNN_ATTRS}
    return [GradOpSpec("rnn_grad", ins, outs, attrs)]


register_op(
    "rnn", inputs=["Input", "PreState*", "WeightList*", "SequenceLength?"],
    outputs=["Out", "DropoutState?", "State*", "Reserve~"], attrs=dict(_RNN_ATTRS),
    traits=[OPAQUE, RANDOM], infer_shape=_rnn_infer, reference=_rnn_ref,
    emit=Opaque(), grad=_rnn_grad_maker,
    doc="Stacked (bidirectional) LSTM / GRU / simple RNN over time-major Input; Paddle's "
        "WeightList order; optional SequenceLength.")


# ---- the gradient ------------------------------------------------------------------------------
def _rnn_grad_infer(Input, PreState, WeightList, SequenceLength=None, *, mode, num_layers,
                    is_bidirec, hidden_size, dropout_prob, **_):
    _check("rnn_grad", Input, PreState, WeightList, SequenceLength, mode, num_layers,
           is_bidirec, hidden_size, dropout_prob)
    return {"Input@GRAD": Input, "PreState@GRAD": list(PreState),
            "WeightList@GRAD": list(WeightList)}


def _run_backward(code, G, L, D, H, x, weights, lens, blocks, layer_outs, dout, dhn, dcn,
                  masks, scale):
    """Gradients in float64 from the forward's record: (dx, dh0, dc0, [(dwih, dwhh, dbih,
    dbhh)] per (layer, direction))."""
    T, B, _ = x.shape
    dy = dout
    dh0, dc0 = np.zeros_like(dhn), np.zeros_like(dhn)
    dws = [None] * (L * D)
    dx = None
    for layer in range(L - 1, -1, -1):
        inp = np.asarray(x, np.float64) if layer == 0 else layer_outs[layer - 1]
        dinp = np.zeros(inp.shape)
        for d in range(D):
            k = layer * D + d
            wih, whh, _, _ = weights[k]
            gates, hprev, aux = blocks[k]
            dxp, dhp = np.zeros((T, B, G * H)), np.zeros((T, B, G * H))
            dh, dc = dhn[k].copy(), dcn[k].copy()
            for t in (range(T - 1, -1, -1) if d == 0 else range(T)):
                alive = (t < lens)[:, None]
                g = dh + dy[t, :, d * H:(d + 1) * H]
                gt = gates[t]
                keep_h = np.zeros_like(dh)
                if code == 0:
                    i, f, c_, o = (gt[:, q * H:(q + 1) * H] for q in range(4))
                    tc = np.tanh(f * aux[t] + i * c_)
                    dcs = dc + g * o * (1.0 - tc * tc)
                    da = np.concatenate([dcs * c_ * i * (1 - i), dcs * aux[t] * f * (1 - f),
                                         dcs * i * (1 - c_ * c_), g * tc * o * (1 - o)], axis=1)
                    db_h = da
                    dc = np.where(alive, dcs * f, dc)
                elif code == 1:
                    r, z, cand = (gt[:, q * H:(q + 1) * H] for q in range(3))
                    dac = g * (1 - z) * (1 - cand * cand)
                    dar = dac * aux[t] * r * (1 - r)
                    daz = g * (hprev[t] - cand) * z * (1 - z)
                    da = np.concatenate([dar, daz, dac], axis=1)
                    db_h = np.concatenate([dar, daz, dac * r], axis=1)
                    keep_h = g * z
                else:
                    da = g * (1 - gt * gt) if code == 2 else np.where(gt > 0, g, 0.0)
                    db_h = da
                da, db_h = np.where(alive, da, 0.0), np.where(alive, db_h, 0.0)
                dxp[t], dhp[t] = da, db_h
                dh = np.where(alive, keep_h, dh) + db_h @ whh
            dh0[k], dc0[k] = dh, dc
            dxp2, dhp2 = dxp.reshape(T * B, -1), dhp.reshape(T * B, -1)
            dws[k] = (dxp2.T @ inp.reshape(T * B, -1), dhp2.T @ hprev.reshape(T * B, H),
                      dxp2.sum(0), dhp2.sum(0))
            dinp += (dxp2 @ wih).reshape(inp.shape)
        if layer == 0:
            dx = dinp
        else:
            dy = dinp if masks is None else np.where(masks[layer - 1], dinp * scale, 0.0)
    return dx, dh0, dc0, dws


def _rnn_grad_ref(Input, PreState, WeightList, SequenceLength=None, DropoutState=None, *, mode,
                  num_layers, is_bidirec, hidden_size, dropout_prob, is_test, **kw):
    code, G, L, D, H = _check("rnn_grad", Input, PreState, WeightList, SequenceLength, mode,
                              num_layers, is_bidirec, hidden_size, dropout_prob)
    T, B, _ = Input.shape
    lens = _lens(SequenceLength, T, B, "rnn_grad")
    masks, scale = None, 1.0
    if _dropping(dropout_prob, is_test, L):
        n = (L - 1) * T * B * D * H
        if DropoutState is None or DropoutState.size != n:
            got = "none" if DropoutState is None else f"{DropoutState.size} values"
            raise ShapeMismatch(f"rnn_grad: DropoutState must hold the forward's {n} dropout "
                                f"mask values (dropout_prob={dropout_prob:g}: the rnn op must "
                                f"write its DropoutState output), got {got}")
        masks = DropoutState.reshape(L - 1, T, B, D * H) != 0
        scale = 1.0 / (1.0 - dropout_prob)
    weights = _split_weights(WeightList, L, D)
    _, _, _, blocks, layer_outs = _run_forward(code, G, L, D, H, Input, PreState, weights, lens,
                                               masks, scale)
    dout = kw.get("Out@GRAD")
    dout = np.zeros((T, B, D * H)) if dout is None else np.asarray(dout, np.float64)
    if dout.shape != (T, B, D * H):
        raise ShapeMismatch(f"rnn_grad: Out@GRAD must have shape {[T, B, D * H]}, got "
                            f"{list(dout.shape)}")
    sg = list(kw.get("State@GRAD") or [])
    zeros = np.zeros((L * D, B, H))
    dhn = np.asarray(sg[0], np.float64) if len(sg) > 0 else zeros
    dcn = np.asarray(sg[1], np.float64) if len(sg) > 1 and code == 0 else zeros
    dx, dh0, dc0, dws = _run_backward(code, G, L, D, H, Input, weights, lens, blocks, layer_outs,
                                      dout, dhn, dcn, masks, scale)
    n = 2 * L * D
    gw = [None] * (2 * n)
    for k, (a, b, c, e) in enumerate(dws):
        gw[2 * k], gw[2 * k + 1], gw[n + 2 * k], gw[n + 2 * k + 1] = a, b, c, e
    dt = Input.dtype
    return {"Input@GRAD": dx.astype(dt),
            "PreState@GRAD": [dh0.astype(dt)] + ([dc0.astype(dt)] if code == 0 else []),
            "WeightList@GRAD": [g.astype(dt).reshape(w.shape) for g, w in zip(gw, WeightList)]}


register_op(
    "rnn_grad",
    inputs=["Input", "PreState*", "WeightList*", "SequenceLength?", "Out?", "DropoutState?",
            "Reserve?", "Out@GRAD?", "State@GRAD*?"],
    outputs=["Input@GRAD?", "PreState@GRAD*?", "WeightList@GRAD*?"], attrs=dict(_RNN_ATTRS),
    traits=[OPAQUE], infer_shape=_rnn_grad_infer, reference=_rnn_grad_ref,
    emit=Opaque(), grad=None,
    doc="Gradients of rnn to Input, PreState and WeightList through the time loop.")
