"""``layers.rnn`` with ``GRUCell``, ``LSTMCell`` and a user's ``RNNCell``: forward against NumPy
cells written here (batch- and time-major, ``sequence_length``, ``is_reverse``), gradients
against finite differences."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import check_program_grad
from pdjit.testing.op_test import assert_native

# ops of these programs that run on the host (their NumPy references) by design, as a compiled
# plan says once per process: rnn_memory_helper, sequence_mask (and their gradients)
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
B, T, D, H = 3, 4, 2, 3
LENGTHS = np.array([4, 2, 1], np.int64)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm(x, h, c, w, b, forget_bias=1.0):
    g = np.concatenate([x, h], 1) @ w + b
    i, j, f, o = np.split(g, 4, axis=1)
    c = c * sigmoid(f + forget_bias) + sigmoid(i) * np.tanh(j)
    return np.tanh(c) * sigmoid(o), c


def np_gru(x, h, w_g, b_g, w_c, b_c):
    r, u = np.split(sigmoid(np.concatenate([x, h], 1) @ w_g + b_g), 2, axis=1)
    c = np.tanh(np.concatenate([x, r * h], 1) @ w_c + b_c)
    return u * h + (1 - u) * c


def np_rnn(step, x, states, lengths=None, reverse=False):
    """x: [B, T, D]; step(x_t, states) -> (out, states); masked and reversed as layers.rnn."""
    outs = [None] * x.shape[1]
    order = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
    for t in order:
        out, new = step(x[:, t], states)
        if lengths is not None:
            m = (t < lengths).astype(x.dtype)[:, None]
            new = [m * n + (1 - m) * s for n, s in zip(new, states)]
        states = new
        outs[t] = out
    return np.stack(outs, 1), states


def _program(reverse, time_major):
    x = L.data(name="x", shape=[T, B, D] if time_major else [B, T, D], dtype="float64",
               append_batch_size=False)
    lengths = L.data(name="len", shape=[B], dtype="int64", append_batch_size=False)
    h0 = L.data(name="h0", shape=[B, H], dtype="float64", append_batch_size=False)
    lstm = L.LSTMCell(H, dtype="float64", name="lstm")
    out, (h, c) = L.rnn(lstm, x, initial_states=[h0, h0 * 0.5], sequence_length=lengths,
                        time_major=time_major, is_reverse=reverse)
    gru = L.GRUCell(H, dtype="float64", name="gru")
    gout, gh = L.rnn(gru, x, time_major=time_major)   # zero initial states
    return [out, h, c, gout, gh], [x, h0]


@pytest.mark.parametrize("reverse,time_major", [(False, False), (True, True)])
def test_rnn_with_lstm_and_gru_cells_matches_numpy(reverse, time_major):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        fetch, _ = _program(reverse, time_major)
    names = [p.name for p in main.global_block().all_parameters()]
    assert names == ["lstm_0.w_0", "lstm_0.b_0", "gru_0.w_0", "gru_0.b_0", "gru_0.w_1",
                     "gru_0.b_1"], names
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    p = {n: np.asarray(scope.find_var(n).value) for n in names}
    rng = np.random.default_rng(4)
    x = rng.normal(size=(B, T, D))
    h0 = rng.normal(size=(B, H))
    feed = {"x": x.transpose(1, 0, 2) if time_major else x, "len": LENGTHS, "h0": h0}
    out, h, c, gout, gh = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
    want_out, (want_h, want_c) = np_rnn(
        lambda xt, s: (lambda hc: (hc[0], list(hc)))(np_lstm(xt, s[0], s[1], p["lstm_0.w_0"],
                                                              p["lstm_0.b_0"])),
        x, [h0, h0 * 0.5], LENGTHS, reverse)
    want_gout, (want_gh,) = np_rnn(
        lambda xt, s: (lambda n: (n, [n]))(np_gru(xt, s[0], p["gru_0.w_0"], p["gru_0.b_0"],
                                                  p["gru_0.w_1"], p["gru_0.b_1"])),
        x, [np.zeros((B, H))])
    if time_major:
        want_out, want_gout = want_out.transpose(1, 0, 2), want_gout.transpose(1, 0, 2)
    for got, want in ((out, want_out), (h, want_h), (c, want_c), (gout, want_gout),
                      (gh, want_gh)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    assert_native(exe)


def test_rnn_gradients_match_finite_differences():
    def build():
        fetch, inputs = _program(True, False)
        out, h, c, gout, gh = fetch
        total = L.reduce_sum(out, dim=1) + h * 2.0 + c + L.reduce_sum(gout, dim=1) + gh
        return total, inputs
    check_program_grad(build, {"x": np.random.default_rng(5).normal(size=(B, T, D)),
                               "len": LENGTHS,
                               "h0": np.random.default_rng(6).normal(size=(B, H))},
                       modes=("compiled",))


class _Elman(L.RNNCell):
    """A user's cell with two states (a nesting of a tensor and a list)."""

    def __init__(self):
        self.w = None

    def call(self, inputs, states):
        h, (acc,) = states
        if self.w is None:
            self.w = L.create_parameter([D + H, H], "float64", name="elman_w")
        new_h = L.tanh(L.matmul(L.concat([inputs, h], axis=1), self.w))
        return new_h * 2.0, [new_h, [acc + new_h]]

    @property
    def state_shape(self):
        return [[H], [[H]]]

    @property
    def state_dtype(self):
        return "float64"


def test_a_users_cell_with_nested_states(fresh_programs):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[B, T, D], dtype="float64", append_batch_size=False)
    out, (h, (acc,)) = L.rnn(_Elman(), x)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    w = np.asarray(scope.find_var("elman_w").value)
    xv = np.random.default_rng(8).normal(size=(B, T, D))
    got_out, got_h, got_acc = exe.run(main, feed={"x": xv}, fetch_list=[out, h, acc],
                                      scope=scope)
    hv, total, outs = np.zeros((B, H)), np.zeros((B, H)), []
    for t in range(T):
        hv = np.tanh(np.concatenate([xv[:, t], hv], 1) @ w)
        total = total + hv
        outs.append(hv * 2.0)
    np.testing.assert_allclose(got_out, np.stack(outs, 1), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got_h, hv, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got_acc, total, rtol=1e-6, atol=1e-9)


def test_rnn_refuses_what_is_not_a_cell(fresh_programs):
    x = L.data(name="x", shape=[B, T, D], dtype="float32", append_batch_size=False)
    with pytest.raises(TypeError, match="rnn: cell must be an RNNCell"):
        L.rnn(lambda i, s: (i, s), x)
    with pytest.raises(TypeError, match="LSTMCell: states must be"):
        L.rnn(L.LSTMCell(H), x, initial_states=L.fill_constant([B, H], "float32", 0.0))


# ---- fluid.contrib.layers.basic_lstm / basic_gru ------------------------------------------------
def _np_stack(step, x, lengths, inits, num_layers, bidirectional, params):
    """Fluid's basic_lstm/gru: per layer and direction a masked recurrence whose outputs past
    a sequence's end repeat the last state; outputs of both directions concatenated."""
    finals = []
    it = iter(params)
    for k in range(num_layers):
        outs = []
        for d in range(2 if bidirectional else 1):
            w = next(it)
            states = [s[k * (2 if bidirectional else 1) + d] for s in inits]
            seq = [None] * x.shape[1]
            order = range(x.shape[1] - 1, -1, -1) if d else range(x.shape[1])
            for t in order:
                new = step(x[:, t], states, w)
                m = (t < lengths).astype(x.dtype)[:, None]
                states = [m * n + (1 - m) * s for n, s in zip(new, states)]
                seq[t] = states[0]
            outs.append(np.stack(seq, 1))
            finals.append(states)
        x = np.concatenate(outs, 2)
    return x, [np.stack([f[i] for f in finals]) for i in range(len(inits))]


def test_basic_lstm_and_basic_gru_match_numpy(fresh_programs):
    from pdjit.layers.rnn_cells import basic_gru, basic_lstm

    main, startup = fresh_programs
    x = L.data(name="x", shape=[B, T, D], dtype="float64", append_batch_size=False)
    lengths = L.data(name="len", shape=[B], dtype="int64", append_batch_size=False)
    h0 = L.data(name="h0", shape=[2, B, H], dtype="float64", append_batch_size=False)
    out, last_h, last_c = basic_lstm(x, None, None, H, num_layers=2, sequence_length=lengths,
                                     bidirectional=True, dtype="float64")
    n_lstm = len(main.global_block().all_parameters())
    xt = L.transpose(x, perm=[1, 0, 2])
    gout, g_h = basic_gru(xt, h0, H, num_layers=2, batch_first=False, dtype="float64")
    assert list(out.shape) == [B, T, 2 * H] and list(last_h.shape)[0] == 4
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    params = [np.asarray(scope.find_var(p.name).value)
              for p in main.global_block().all_parameters()]
    rng = np.random.default_rng(9)
    xv, h0v = rng.normal(size=(B, T, D)), rng.normal(size=(2, B, H))
    got = exe.run(main, feed={"x": xv, "len": LENGTHS, "h0": h0v},
                  fetch_list=[out, last_h, last_c, gout, g_h], scope=scope)
    lstm_w = [(params[i], params[i + 1]) for i in range(0, n_lstm, 2)]
    want_out, (want_h, want_c) = _np_stack(
        lambda xt_, s, w: list(np_lstm(xt_, s[0], s[1], *w)), xv, LENGTHS,
        [np.zeros((4, B, H))] * 2, 2, True, lstm_w)
    gru_w = [tuple(params[i:i + 4]) for i in range(n_lstm, len(params), 4)]
    want_g, (want_gh,) = _np_stack(lambda xt_, s, w: [np_gru(xt_, s[0], *w)], xv,
                                   np.full(B, T), [h0v], 2, False, gru_w)
    for g, w in zip(got, (want_out, want_h, want_c, want_g.transpose(1, 0, 2), want_gh)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)


def test_rnn_with_steps_known_at_run_time(fresh_programs):
    """T unknown when built: the mask takes its length from the input at run time; the final
    state of each sequence is its output at its last step."""
    main, startup = fresh_programs
    x = L.data(name="x", shape=[-1, -1, D], dtype="float64", append_batch_size=False)
    lengths = L.data(name="len", shape=[-1], dtype="int64", append_batch_size=False)
    out, h = L.rnn(L.GRUCell(H, dtype="float64"), x, sequence_length=lengths)
    assert list(out.shape) == [-1, -1, H]
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    xv = np.random.default_rng(3).normal(size=(B, 5, D))
    got_out, got_h = exe.run(main, feed={"x": xv, "len": LENGTHS}, fetch_list=[out, h],
                             scope=scope)
    assert got_out.shape == (B, 5, H)
    np.testing.assert_allclose(got_h, got_out[np.arange(B), LENGTHS - 1], rtol=1e-12)
