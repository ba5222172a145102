"""``fluid.layers.DynamicRNN`` and Fluid 1.8's dynamic-RNN ops (``lod_rank_table``,
``lod_tensor_to_array``, ``array_to_lod_tensor``, ``shrink_rnn_memory``,
``reorder_lod_tensor_by_rank``, ``max_sequence_len``): forward against NumPy written here,
gradients against finite differences, a sentiment-style classifier that trains."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import check_program_grad
from pdjit.testing.op_test import assert_native

# ops of these programs that run on the host (their NumPy references) by design, as a compiled
# plan says once per process: array_to_lod_tensor, lod_rank_table, lod_tensor_to_array,
# max_sequence_len, read_from_array, reorder_lod_tensor_by_rank, shrink_rnn_memory,
# write_to_array, rnn_memory_helper (and their gradients)
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
D, H = 3, 4
LENS = [2, 3, 1, 3]   # ties (3, 3) keep their order in the rank table; one sequence of 1


def _lod(x, lens):
    return fluid.create_lod_tensor(np.asarray(x), [list(lens)], fluid.CPUPlace())


def _rnn_program():
    """h_t = tanh(x_t @ wx + h_{t-1} @ wh + s + e), h_0 = h0 (per sequence, reordered), s a
    memory from shape/value halving each step, e = enc (a static input, one row per
    sequence); outputs h (a LoD tensor) and its last step."""
    x = L.data(name="x", shape=[D], dtype="float64", lod_level=1)
    h0 = L.data(name="h0", shape=[H], dtype="float64")
    enc = L.data(name="enc", shape=[H], dtype="float64")
    drnn = L.DynamicRNN()
    with drnn.block():
        w = drnn.step_input(x)
        e = drnn.static_input(enc)
        prev = drnn.memory(init=h0, need_reorder=True)
        s = drnn.memory(shape=[H], value=0.5, dtype="float64")
        h = L.tanh(L.fc([w, prev], H, bias_attr=False,
                        param_attr=[fluid.ParamAttr(name="wx"), fluid.ParamAttr(name="wh")])
                   + s + e)
        drnn.update_memory(prev, h)
        drnn.update_memory(s, s * 0.5)
        drnn.output(h)
    out = drnn()
    return out, L.sequence_last_step(out), [x, h0, enc]


def _numpy_rnn(x, lens, h0, enc, wx, wh):
    offs = np.cumsum([0] + list(lens))
    out = np.zeros((offs[-1], H))
    for i, n in enumerate(lens):
        h, s = h0[i], 0.5
        for t in range(n):
            h = np.tanh(x[offs[i] + t] @ wx + h @ wh + s + enc[i])
            s *= 0.5
            out[offs[i] + t] = h
    return out


def _feed(seed=0):
    rng = np.random.default_rng(seed)
    n = len(LENS)
    return {"x": _lod(rng.normal(size=(sum(LENS), D)), LENS),
            "h0": rng.normal(size=(n, H)), "enc": rng.normal(size=(n, H)) * 0.5}


def test_dynamic_rnn_matches_numpy_natively():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        out, last, _ = _rnn_program()
    types = [op.type for op in main.global_block().ops]
    for t in ("lod_rank_table", "max_sequence_len", "lod_tensor_to_array",
              "reorder_lod_tensor_by_rank", "while", "array_to_lod_tensor"):
        assert t in types, types
    assert "shrink_rnn_memory" in [op.type for op in main.block(1).ops]
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    wx, wh = (np.asarray(scope.find_var(n).value) for n in ("wx", "wh"))
    feed = _feed(1)
    got, got_last = exe.run(main, feed=feed, fetch_list=[out, last], scope=scope,
                            return_numpy=False)
    want = _numpy_rnn(np.asarray(feed["x"]), LENS, feed["h0"], feed["enc"], wx, wh)
    assert got.lod() == [[0, 2, 5, 6, 9]]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-9)
    ends = np.cumsum(LENS) - 1
    np.testing.assert_allclose(np.asarray(got_last), want[ends], rtol=1e-6, atol=1e-9)
    assert_native(exe)


def test_a_dynamic_rnn_program_is_fluid18s_and_round_trips():
    """The step block closes as Fluid 1.8's does (the counter incremented in place, then the
    memories written at it, then the condition); serialised and parsed back, it runs as
    NumPy does."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        out, _, _ = _rnn_program()
    tail = [op.type for op in main.block(1).ops][-4:]
    assert tail == ["increment", "write_to_array", "write_to_array", "less_than"], tail
    assert main.block(1).ops[-4].input("X") == main.block(1).ops[-3].input("I")
    loaded = fluid.Program.parse_from_string(main.desc.SerializeToString())
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    wx, wh = (np.asarray(scope.find_var(n).value) for n in ("wx", "wh"))
    feed = _feed(3)
    (got,) = exe.run(loaded, feed=feed, fetch_list=[out.name], scope=scope, return_numpy=False)
    want = _numpy_rnn(np.asarray(feed["x"]), LENS, feed["h0"], feed["enc"], wx, wh)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-9)
    assert got.lod() == [[0, 2, 5, 6, 9]]


def test_dynamic_rnn_gradients_match_finite_differences():
    def build():
        out, last, inputs = _rnn_program()
        return L.elementwise_add(L.sequence_pool(out, "sum"), last * 3.0), inputs
    check_program_grad(build, _feed(2), modes=("compiled",))


# ---- the ops, on a two-level LoD ----------------------------------------------------------------
def test_rank_table_ops_on_nested_sequences_match_hand_computation(fresh_programs):
    """X: 3 paragraphs of 2, 0 and 3 sentences (level 0) over sentences of rows (level 1). The
    table ranks level 0: paragraphs 2, 0, 1 (lengths 3, 2, 0)."""
    main, _ = fresh_programs
    x = L.data(name="x", shape=[1], dtype="float64", lod_level=2)
    y = L.data(name="y", shape=[2], dtype="float64")
    table = L.lod_rank_table(x, level=0)
    arr = L.lod_tensor_to_array(x, table)
    back = L.array_to_lod_tensor(arr, table)
    n = L.max_sequence_len(table)
    ry = L.reorder_lod_tensor_by_rank(y, table)
    rx = L.reorder_lod_tensor_by_rank(x, table)
    i1 = L.fill_constant([1], "int64", 1)
    shrunk = L.shrink_memory(ry, i1, table)
    steps = [L.array_read(arr, L.fill_constant([1], "int64", k)) for k in range(3)]
    # sentences: p0 = [s0 (2 rows), s1 (1 row)], p1 = [], p2 = [s2 (1), s3 (3), s4 (2)]
    rows = np.arange(9, dtype=np.float64).reshape(9, 1)
    xv = fluid.create_lod_tensor(rows, [[2, 0, 3], [2, 1, 1, 3, 2]], fluid.CPUPlace())
    yv = np.arange(6, dtype=np.float64).reshape(3, 2)
    exe = fluid.Executor(mode="reference")
    got = exe.run(main, feed={"x": xv, "y": yv},
                  fetch_list=[back, n, ry, rx, shrunk] + steps, return_numpy=False)
    back_v, n_v, ry_v, rx_v, shrunk_v, s0, s1, s2 = got
    assert np.asarray(n_v).tolist() == [3]
    np.testing.assert_array_equal(np.asarray(back_v), rows)
    assert back_v.lod() == [[0, 2, 2, 5], [0, 2, 3, 4, 7, 9]]
    np.testing.assert_array_equal(np.asarray(ry_v), yv[[2, 0, 1]])
    # p2's rows (3..8), then p0's (0..2); p1 has none
    np.testing.assert_array_equal(np.asarray(rx_v).ravel(), [3, 4, 5, 6, 7, 8, 0, 1, 2])
    assert rx_v.lod() == [[0, 3, 5, 5], [0, 1, 4, 6, 8, 9]]
    # after step 1, paragraphs longer than 1 sentence: p2 and p0 (the first two ranked)
    np.testing.assert_array_equal(np.asarray(shrunk_v), yv[[2, 0]])
    # step t: sentence t of each paragraph longer than t, in rank order (p2, then p0)
    np.testing.assert_array_equal(np.asarray(s0).ravel(), [3, 0, 1])
    assert s0.lod() == [[0, 1, 3]]
    np.testing.assert_array_equal(np.asarray(s1).ravel(), [4, 5, 6, 2])
    assert s1.lod() == [[0, 3, 4]]
    np.testing.assert_array_equal(np.asarray(s2).ravel(), [7, 8])


def test_dynamic_rnn_misuse_is_refused(fresh_programs):
    x = L.data(name="x", shape=[D], dtype="float32", lod_level=1)
    dense = L.data(name="d", shape=[D], dtype="float32")
    drnn = L.DynamicRNN()
    with pytest.raises(ValueError, match="inside 'with drnn.block"):
        drnn.step_input(x)
    with pytest.raises(ValueError, match="lod_level"):
        with drnn.block():
            drnn.step_input(dense)
    drnn = L.DynamicRNN()
    with pytest.raises(ValueError, match="not a memory"):
        with drnn.block():
            w = drnn.step_input(x)
            drnn.update_memory(w, w)


# ---- a sentiment-style classifier ---------------------------------------------------------------
VOCAB, EMB, HID = 20, 8, 8


def _sentiment():
    """The book's understand_sentiment DynamicRNN net, small: embedding, a DynamicRNN whose step
    is an fc over [word, memory], the last step, an fc softmax over 2 classes."""
    data = L.data(name="words", shape=[1], dtype="int64", lod_level=1)
    label = L.data(name="label", shape=[1], dtype="int64")
    emb = L.embedding(input=data, size=[VOCAB, EMB], param_attr=fluid.ParamAttr(
        name="emb", initializer=fluid.initializer.Uniform(-0.5, 0.5)))
    sentence = L.fc(input=emb, size=HID, act="tanh")
    rnn = L.DynamicRNN()
    with rnn.block():
        word = rnn.step_input(sentence)
        prev = rnn.memory(shape=[HID], value=0.0)
        hidden = L.fc(input=[word, prev], size=HID, act="relu")
        rnn.update_memory(prev, hidden)
        rnn.output(hidden)
    last = L.sequence_last_step(rnn())
    prediction = L.fc(input=last, size=2, act="softmax")
    cost = L.cross_entropy(input=prediction, label=label)
    acc = L.accuracy(input=prediction, label=label)
    return L.mean(cost), acc


def test_sentiment_dynamic_rnn_trains():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 5
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        loss, acc = _sentiment()
        fluid.optimizer.Adam(learning_rate=0.05).minimize(loss)
    rng = np.random.default_rng(0)
    lens = [3, 5, 2, 4, 4, 1]
    # the label: whether the sentence holds a word of the upper half of the vocabulary
    words = [rng.integers(0, VOCAB // 2, size=n) for n in lens]
    for k in (0, 2, 3):
        words[k][rng.integers(0, lens[k])] = rng.integers(VOCAB // 2, VOCAB)
    labels = np.array([[int(w.max() >= VOCAB // 2)] for w in words], np.int64)
    feed = {"words": _lod(np.concatenate(words).reshape(-1, 1).astype(np.int64), lens),
            "label": labels}
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    losses = []
    for _ in range(15):
        v, a = exe.run(main, feed=feed, fetch_list=[loss, acc], scope=scope)
        losses.append(float(np.asarray(v).reshape(-1)[0]))
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert_native(exe)
