"""``fluid.layers.lstm`` (Fluid 1.8's signature, appending the ``rnn`` op): shapes, the program
it builds, outputs against a NumPy LSTM written here, and training through it (native).

float64 throughout, so the kernels compiled for ``tests/ops/test_rnn_op.py`` serve this file.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.runtime.executor import Executor
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(5)
T, B, I, H = 4, 3, 3, 2


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def np_lstm(x_bti, h0, c0, weights, num_layers, bidirec):
    """Batch-major x; weights in Paddle's order; (out [B, T, D*H], last h, last c)."""
    d_n = 2 if bidirec else 1
    n = 2 * num_layers * d_n
    inp = np.transpose(x_bti, (1, 0, 2))
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(d_n):
            k = layer * d_n + d
            wih, whh, bih, bhh = weights[2 * k], weights[2 * k + 1], weights[n + 2 * k], \
                weights[n + 2 * k + 1]
            h, c = h0[k].copy(), c0[k].copy()
            out = np.zeros(inp.shape[:2] + (h.shape[1],))
            for t in (range(inp.shape[0]) if d == 0 else range(inp.shape[0] - 1, -1, -1)):
                i, f, g, o = np.split(inp[t] @ wih.T + bih + h @ whh.T + bhh, 4, axis=1)
                c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
                h = sigmoid(o) * np.tanh(c)
                out[t] = h
            outs.append(out)
            hs.append(h)
            cs.append(c)
        inp = np.concatenate(outs, axis=2)
    return np.transpose(inp, (1, 0, 2)), np.stack(hs), np.stack(cs)


def build(num_layers, bidirec, is_test=False):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        d = 2 if bidirec else 1
        x = fluid.layers.data("x", [B, T, I], dtype="float64", append_batch_size=False)
        h0 = fluid.layers.data("h0", [num_layers * d, B, H], dtype="float64",
                               append_batch_size=False)
        c0 = fluid.layers.data("c0", [num_layers * d, B, H], dtype="float64",
                               append_batch_size=False)
        out, last_h, last_c = fluid.layers.lstm(x, h0, c0, T, H, num_layers,
                                                is_bidirec=bidirec, is_test=is_test)
    return main, startup, (out, last_h, last_c)


@pytest.mark.parametrize("num_layers,bidirec", [(1, False), (2, True)])
def test_lstm_layer_matches_numpy(num_layers, bidirec):
    main, startup, fetch = build(num_layers, bidirec)
    d = 2 if bidirec else 1
    assert [list(v.shape) for v in fetch] == [[B, T, d * H], [num_layers * d, B, H],
                                              [num_layers * d, B, H]]
    (rnn,) = [op for op in main.global_block().ops if op.type == "rnn"]
    assert [op.type for op in main.global_block().ops] == ["transpose2", "rnn", "transpose2"]
    assert rnn.attr("mode") == "LSTM" and rnn.attr("num_layers") == num_layers
    weights = rnn.input("WeightList")
    assert len(weights) == 4 * num_layers * d
    scope = fluid.Scope()
    exe = Executor(strict=True)
    exe.run(startup, scope=scope)
    ws = [np.asarray(scope.find_var(n).value) for n in weights]
    assert ws[0].shape == (4 * H, I) and ws[1].shape == (4 * H, H) and ws[-1].shape == (4 * H,)
    assert all(np.abs(w).max() <= 1 / np.sqrt(H) for w in ws)  # Paddle's uniform init
    feed = {"x": RNG.normal(size=(B, T, I)), "h0": RNG.normal(size=(num_layers * d, B, H)),
            "c0": RNG.normal(size=(num_layers * d, B, H))}
    got = exe.run(main, feed=feed, fetch_list=list(fetch), scope=scope)
    want = np_lstm(feed["x"], feed["h0"], feed["c0"], ws, num_layers, bidirec)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    assert_native(exe)
    assert not [s.describe() for _, p in exe._plans.values() for s in p.walk()
                if s.kind == "reference" and s.op.type == "rnn"]


@pytest.mark.filterwarnings("ignore::pdjit.framework.errors.ReferenceStepWarning")
def test_lstm_layer_trains_natively():
    """SGD through the layer: the loss falls, and the first step's weight update is the
    finite-difference gradient's."""
    main, startup, (out, last_h, _) = build(1, True)
    with fluid.program_guard(main, startup):
        loss = fluid.layers.reduce_sum(fluid.layers.square(out)) + \
            fluid.layers.reduce_sum(last_h)
        fluid.optimizer.SGD(0.05).minimize(loss)
    assert "rnn_grad" in [op.type for op in main.global_block().ops]
    scope = fluid.Scope()
    exe = Executor(strict=True)
    exe.run(startup, scope=scope)
    feed = {"x": RNG.normal(size=(B, T, I)), "h0": RNG.normal(size=(2, B, H)),
            "c0": RNG.normal(size=(2, B, H))}
    (rnn,) = [op for op in main.global_block().ops if op.type == "rnn"]
    names = rnn.input("WeightList")
    w0 = [np.array(scope.find_var(n).value) for n in names]

    def np_loss(ws):
        o, h, _ = np_lstm(feed["x"], feed["h0"], feed["c0"], ws, 1, True)
        return np.sum(o ** 2) + np.sum(h)

    losses = [float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0][0])
              for _ in range(5)]
    assert losses[0] == pytest.approx(np_loss(w0), rel=1e-10)
    assert losses[-1] < losses[0]
    # the first step moved w_hh of the reverse direction by -0.05 * dL/dw
    w1 = [np.array(scope.find_var(n).value) for n in names]  # after 5 steps: redo one step
    for n, w in zip(names, w0):
        scope.find_var(n).value = w.copy()
    exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    step = np.asarray(scope.find_var(names[3]).value) - w0[3]
    eps, num = 1e-6, np.zeros_like(w0[3])
    for idx in np.ndindex(*w0[3].shape):
        hi = [w.copy() for w in w0]
        lo = [w.copy() for w in w0]
        hi[3][idx] += eps
        lo[3][idx] -= eps
        num[idx] = (np_loss(hi) - np_loss(lo)) / (2 * eps)
    np.testing.assert_allclose(step, -0.05 * num, rtol=1e-6, atol=1e-9)
    assert not np.allclose(w1[0], w0[0])
    assert_native(exe)
    assert not [s.describe() for _, p in exe._plans.values() for s in p.walk()
                if s.kind == "reference" and s.op.type in ("rnn", "rnn_grad")]


def test_lstm_layer_refuses_bad_states():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [B, T, I], dtype="float64", append_batch_size=False)
        h0 = fluid.layers.data("h0", [1, B, H], dtype="float64", append_batch_size=False)
        c0 = fluid.layers.data("c0", [1, B, H], dtype="float64", append_batch_size=False)
        with pytest.raises(ValueError, match=r"lstm: init_h must have shape \[num_layers \* "
                                             r"directions, batch, hidden_size\] = \[2, batch, 2\]"):
            fluid.layers.lstm(x, h0, c0, T, H, 1, is_bidirec=True)
        c32 = fluid.layers.data("c32", [1, B, H], dtype="float32", append_batch_size=False)
        with pytest.raises(ValueError, match="init_c must have input's dtype float64"):
            fluid.layers.lstm(x, h0, c32, T, H, 1)
