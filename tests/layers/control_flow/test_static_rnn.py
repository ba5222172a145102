"""``fluid.layers.StaticRNN`` (a ``recurrent`` op, as Fluid 1.8 builds it): forward against a
NumPy recurrence, gradients against finite differences, and a PTB-style LSTM language model
that trains."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import check_program_grad
from pdjit.testing.op_test import assert_native

# rnn_memory_helper_grad (the gradient carried into a step's memory) runs its NumPy reference by
# design; a compiled plan says so once per process
pytestmark = pytest.mark.filterwarnings(
    "ignore:op 'rnn_memory_helper_grad' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
T, B, D, H = 3, 2, 4, 5


def _rnn_program(static_t=True):
    """h_t = tanh(x_t @ wx + h_{t-1} @ wh + b + c_{t-1}), c_t = 0.5 * c_{t-1} + 0.1 * h_t:
    one memory from ``init``, one from ``shape`` + ``batch_ref``; outputs h and c."""
    x = L.data(name="x", shape=[T if static_t else -1, B, D], dtype="float64",
               append_batch_size=False)
    h0 = L.data(name="h0", shape=[B, H], dtype="float64", append_batch_size=False)
    rnn = L.StaticRNN()
    with rnn.step():
        x_t = rnn.step_input(x)
        h_pre = rnn.memory(init=h0)
        c_pre = rnn.memory(shape=[-1, H], batch_ref=x_t, init_value=0.25)
        pre = L.fc([x_t, h_pre], H, param_attr=[fluid.ParamAttr(name="wx"),
                                                fluid.ParamAttr(name="wh")],
                   bias_attr=fluid.ParamAttr(name="b"))
        h = L.tanh(pre + c_pre)
        c = c_pre * 0.5 + h * 0.1
        rnn.update_memory(h_pre, h)
        rnn.update_memory(c_pre, c)
        rnn.step_output(h)
        rnn.step_output(c)
    hs, cs = rnn()
    return hs, cs, [x, h0]


def _numpy_rnn(x, h0, wx, wh, b):
    h, c = h0, np.full_like(h0, 0.25)
    hs, cs = [], []
    # ``h * 0.1`` is a scale op: its factor is a float32 attribute, as in Fluid (0.1 rounded
    # to float32 is 0.1 + 1.5e-9, visible where c's two terms cancel)
    tenth = float(np.float32(0.1))
    for t in range(x.shape[0]):
        h = np.tanh(x[t] @ wx + h @ wh + b + c)
        c = c * 0.5 + h * tenth
        hs.append(h)
        cs.append(c)
    return np.stack(hs), np.stack(cs)


def _feed(seed=0, t=T):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(t, B, D)), "h0": rng.normal(size=(B, H))}


@pytest.mark.parametrize("static_t", [True, False], ids=["T-known", "T-at-run-time"])
def test_static_rnn_matches_numpy_natively(static_t):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        hs, cs, _ = _rnn_program(static_t)
    assert list(hs.shape) == [T if static_t else -1, B, H]
    # Fluid 1.8's layout: a recurrent op, memories handed on through rnn_memory_helper
    (rec,) = [op for op in main.global_block().ops if op.type == "recurrent"]
    assert rec.input("inputs") == ["x"] and len(rec.attr("ex_states")) == 2
    assert [op.type for op in main.block(1).ops].count("rnn_memory_helper") == 4
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    params = [np.asarray(scope.find_var(n).value) for n in ("wx", "wh", "b")]
    t = T if static_t else 4
    feed = _feed(1, t)
    got_h, got_c = exe.run(main, feed=feed, fetch_list=[hs, cs], scope=scope)
    want_h, want_c = _numpy_rnn(feed["x"], feed["h0"], *params)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got_c, want_c, rtol=1e-6, atol=1e-9)
    assert_native(exe)


def test_static_rnn_gradients_match_finite_differences():
    def build():
        hs, cs, inputs = _rnn_program()
        return L.elementwise_add(hs, cs * 2.0), inputs
    check_program_grad(build, _feed(2), modes=("compiled",))


def test_static_rnn_misuse_is_refused(fresh_programs):
    x = L.data(name="x", shape=[T, B, D], dtype="float32", append_batch_size=False)
    y = L.data(name="y", shape=[T + 1, B, D], dtype="float32", append_batch_size=False)
    rnn = L.StaticRNN()
    with pytest.raises(ValueError, match="inside 'with rnn.step"):
        rnn.step_input(x)
    with pytest.raises(ValueError, match="same seq_len"):
        with rnn.step():
            rnn.step_input(x)
            rnn.step_input(y)
    rnn = L.StaticRNN()
    with pytest.raises(ValueError, match="never updated"):
        with rnn.step():
            x_t = rnn.step_input(x)
            rnn.memory(shape=[-1, 3], batch_ref=x_t)
            rnn.step_output(x_t)


# ---- a PTB-style language model ---------------------------------------------------------------
VOCAB, EMB, HID, STEPS, BATCH = 12, 8, 8, 4, 4


def _ptb_lm():
    """The models repository's PTB LM, small: embedding, an LSTM cell written out in a
    StaticRNN over time-major embeddings (h and c memories from fed initial states), a softmax
    over the vocabulary."""
    x = L.data(name="x", shape=[BATCH, STEPS, 1], dtype="int64", append_batch_size=False)
    y = L.data(name="y", shape=[BATCH * STEPS, 1], dtype="int64", append_batch_size=False)
    init_h = L.data(name="init_h", shape=[BATCH, HID], dtype="float32", append_batch_size=False)
    init_c = L.data(name="init_c", shape=[BATCH, HID], dtype="float32", append_batch_size=False)
    emb = L.embedding(x, size=[VOCAB, EMB], param_attr=fluid.ParamAttr(
        name="emb", initializer=fluid.initializer.Uniform(-0.5, 0.5)))
    emb = L.reshape(emb, [BATCH, STEPS, EMB])
    emb = L.transpose(emb, perm=[1, 0, 2])
    rnn = L.StaticRNN()
    with rnn.step():
        x_t = rnn.step_input(emb)
        h_pre = rnn.memory(init=init_h)
        c_pre = rnn.memory(init=init_c)
        gates = L.fc(L.concat([x_t, h_pre], axis=1), 4 * HID, param_attr=fluid.ParamAttr(
            name="lstm_w", initializer=fluid.initializer.Uniform(-0.3, 0.3)))
        i, j, f, o = L.split(gates, num_or_sections=4, dim=-1)
        c = c_pre * L.sigmoid(f) + L.sigmoid(i) * L.tanh(j)
        h = L.tanh(c) * L.sigmoid(o)
        rnn.update_memory(h_pre, h)
        rnn.update_memory(c_pre, c)
        rnn.step_output(h)
    out = L.transpose(rnn(), perm=[1, 0, 2])
    out = L.reshape(out, [-1, HID])
    logits = L.fc(out, VOCAB, param_attr=fluid.ParamAttr(name="softmax_w"))
    loss = L.softmax_with_cross_entropy(logits, y)
    return L.reduce_mean(loss)


def test_ptb_style_static_rnn_language_model_trains():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 3
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        loss = _ptb_lm()
        fluid.optimizer.Adam(learning_rate=0.05).minimize(loss)
    rng = np.random.default_rng(0)
    # a learnable stream: each token is the one before plus one (mod VOCAB)
    start = rng.integers(0, VOCAB, size=(BATCH, 1))
    seq = (start + np.arange(STEPS + 1)) % VOCAB
    feed = {"x": seq[:, :-1, None].astype(np.int64),
            "y": seq[:, 1:].reshape(-1, 1).astype(np.int64),
            "init_h": np.zeros((BATCH, HID), np.float32),
            "init_c": np.zeros((BATCH, HID), np.float32)}
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    losses = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss],
                                       scope=scope)[0]).reshape(-1)[0]) for _ in range(12)]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert_native(exe)
