"""Fluid 1.8's ``BeamSearchDecoder`` + ``dynamic_decode`` against a beam search written here in
NumPy (same cell, embedding and output layer), and ``gather_tree`` by hand."""
import numpy as np
import pytest

import pdjit as fluid

# ops of these programs that run on the host (their NumPy references) by design, as a compiled
# plan says once per process: elementwise_floordiv, elementwise_mod, gather_tree, slice,
# tensor_array_to_tensor, write_to_array, read_from_array (and their gradients)
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
B, H, E, VOCAB, BEAM, START, END, MAX_STEP = 2, 4, 3, 6, 2, 0, 1, 3


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_gather_tree_by_hand(fresh_programs):
    main, _ = fresh_programs
    ids = L.data(name="ids", shape=[3, 1, 2], dtype="int64", append_batch_size=False)
    parents = L.data(name="parents", shape=[3, 1, 2], dtype="int64", append_batch_size=False)
    out = L.gather_tree(ids, parents)
    ids_v = np.array([[[2, 3]], [[4, 5]], [[6, 7]]], np.int64)
    par_v = np.array([[[0, 0]], [[1, 0]], [[1, 1]]], np.int64)
    (got,) = fluid.Executor().run(main, feed={"ids": ids_v, "parents": par_v},
                                  fetch_list=[out])
    # beam 0 at the end: 6, from beam 1 at step 1 (5), from beam 0 at step 0 (2)
    assert got[:, 0, 0].tolist() == [2, 5, 6] and got[:, 0, 1].tolist() == [2, 5, 7]


def _np_beam_search(p, h0):
    """The decoder in NumPy: (ids [B, T, BEAM] traced back, final log-probs)."""
    def gru(x, h):
        r, u = np.split(sigmoid(np.concatenate([x, h], 1) @ p["w_g"] + p["b_g"]), 2, axis=1)
        c = np.tanh(np.concatenate([x, r * h], 1) @ p["w_c"] + p["b_c"])
        return u * h + (1 - u) * c

    state = np.repeat(h0, BEAM, axis=0).reshape(B, BEAM, H)
    log_probs = np.tile(np.array([0.0] + [-1e9] * (BEAM - 1)), (B, 1))
    finished = np.zeros((B, BEAM), bool)
    tokens = np.full((B, BEAM), START)
    steps_ids, steps_parents = [], []
    for _ in range(MAX_STEP + 1):
        h = gru(p["emb"][tokens.reshape(-1)], state.reshape(-1, H))
        logits = (h @ p["w_out"] + p["b_out"]).reshape(B, BEAM, VOCAB)
        logits = logits - logits.max(-1, keepdims=True)
        step = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        noend = np.full(VOCAB, -1e9)
        noend[END] = 0.0
        step = np.where(finished[..., None], noend, step)
        total = (step + log_probs[..., None]).reshape(B, BEAM * VOCAB)
        top = np.argsort(-total, axis=1, kind="stable")[:, :BEAM]
        beam_idx, tokens = top // VOCAB, top % VOCAB
        rows = np.arange(B)[:, None]
        log_probs = total[rows, top]
        state = h.reshape(B, BEAM, H)[rows, beam_idx]
        finished = finished[rows, beam_idx] | (tokens == END)
        steps_ids.append(tokens)
        steps_parents.append(beam_idx)
        if finished.all():
            break
    ids, parents = np.stack(steps_ids), np.stack(steps_parents)
    out = np.empty_like(ids)
    out[-1] = ids[-1]
    at = parents[-1]
    for t in range(len(ids) - 2, -1, -1):
        out[t] = ids[t][np.arange(B)[:, None], at]
        at = parents[t][np.arange(B)[:, None], at]
    return out.transpose(1, 0, 2), log_probs


def test_beam_search_decoder_with_dynamic_decode_matches_numpy():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 4
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        h0 = L.data(name="h0", shape=[B, H], dtype="float32", append_batch_size=False)
        cell = L.GRUCell(H, name="dec")
        decoder = L.BeamSearchDecoder(
            cell, START, END, BEAM,
            embedding_fn=lambda ids: L.embedding(ids, size=[VOCAB, E], param_attr=fluid.ParamAttr(
                name="emb", initializer=fluid.initializer.Uniform(-1.0, 1.0))),
            output_fn=lambda x: L.fc(x, VOCAB, num_flatten_dims=2,
                                     param_attr=fluid.ParamAttr(
                                         name="w_out",
                                         initializer=fluid.initializer.Uniform(-1.5, 1.5)),
                                     bias_attr=fluid.ParamAttr(name="b_out")))
        outputs, final_states = L.dynamic_decode(decoder, inits=h0, max_step_num=MAX_STEP,
                                                 is_test=True)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    names = {"emb": "emb", "w_out": "w_out", "b_out": "b_out", "w_g": "dec_0.w_0",
             "b_g": "dec_0.b_0", "w_c": "dec_0.w_1", "b_c": "dec_0.b_1"}
    p = {k: np.asarray(scope.find_var(v).value, np.float64) for k, v in names.items()}
    h0v = np.random.default_rng(0).normal(size=(B, H)).astype(np.float32)
    got_ids, got_lp = exe.run(main, feed={"h0": h0v},
                              fetch_list=[outputs, final_states.log_probs], scope=scope)
    want_ids, want_lp = _np_beam_search(p, h0v.astype(np.float64))
    assert got_ids.shape == want_ids.shape, (got_ids.shape, want_ids.shape)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_lp, want_lp, rtol=1e-4, atol=1e-4)


# ---- BasicDecoder with GreedyEmbeddingHelper and TrainingHelper ----------------------------------
def _np_gru(p, x, h):
    r, u = np.split(sigmoid(np.concatenate([x, h], 1) @ p["w_g"] + p["b_g"]), 2, axis=1)
    c = np.tanh(np.concatenate([x, r * h], 1) @ p["w_c"] + p["b_c"])
    return u * h + (1 - u) * c


def _basic_decoder_program():
    h0 = L.data(name="h0", shape=[B, H], dtype="float32", append_batch_size=False)
    trg = L.data(name="trg", shape=[B, MAX_STEP, 1], dtype="int64", append_batch_size=False)
    trg_len = L.data(name="trg_len", shape=[B], dtype="int64", append_batch_size=False)
    start = L.data(name="start", shape=[B], dtype="int64", append_batch_size=False)

    def embed(ids):
        return L.embedding(ids, size=[VOCAB, E], param_attr=fluid.ParamAttr(
            name="emb", initializer=fluid.initializer.Uniform(-1.0, 1.0)))

    def out_fn(x):
        return L.fc(x, VOCAB, num_flatten_dims=len(x.shape) - 1, param_attr=fluid.ParamAttr(
            name="w_out", initializer=fluid.initializer.Uniform(-1.5, 1.5)),
            bias_attr=fluid.ParamAttr(name="b_out"))
    cell = L.GRUCell(H, name="dec")
    greedy = L.BasicDecoder(cell, L.GreedyEmbeddingHelper(embed, start, END), out_fn)
    (g_logits, g_ids), _ = L.dynamic_decode(greedy, inits=h0, max_step_num=MAX_STEP,
                                            is_test=True)
    trg_emb = L.reshape(embed(trg), [B, MAX_STEP, E])
    forced = L.BasicDecoder(cell, L.TrainingHelper(trg_emb, trg_len), out_fn)
    (t_logits, t_ids), _, t_len = L.dynamic_decode(forced, inits=h0, return_length=True)
    return g_ids, t_logits, t_len


def test_basic_decoder_greedy_and_teacher_forced_match_numpy():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 6
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        fetch = _basic_decoder_program()
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    names = {"emb": "emb", "w_out": "w_out", "b_out": "b_out", "w_g": "dec_0.w_0",
             "b_g": "dec_0.b_0", "w_c": "dec_0.w_1", "b_c": "dec_0.b_1"}
    p = {k: np.asarray(scope.find_var(v).value, np.float64) for k, v in names.items()}
    rng = np.random.default_rng(1)
    h0 = rng.normal(size=(B, H)).astype(np.float32)
    trg = rng.integers(2, VOCAB, size=(B, MAX_STEP, 1)).astype(np.int64)
    trg_len = np.array([MAX_STEP, 2], np.int64)
    feed = {"h0": h0, "trg": trg, "trg_len": trg_len, "start": np.full(B, START, np.int64)}
    g_ids, t_logits, t_len = exe.run(main, feed=feed, fetch_list=list(fetch), scope=scope)
    # greedy: the arg-max word fed back until every entry produced END or MAX_STEP + 1 steps
    h, word, done, want = h0.astype(np.float64), np.full(B, START), np.zeros(B, bool), []
    for _ in range(MAX_STEP + 1):
        h = _np_gru(p, p["emb"][word], h)
        word = np.argmax(h @ p["w_out"] + p["b_out"], axis=1)
        want.append(word)
        done |= word == END
        if done.all():
            break
    np.testing.assert_array_equal(g_ids, np.stack(want, 1))
    # teacher forcing: step t reads target word t, until the longest target ends
    h, want = h0.astype(np.float64), []
    for t in range(trg_len.max()):
        h = _np_gru(p, p["emb"][trg[:, t, 0]], h)
        want.append(h @ p["w_out"] + p["b_out"])
    np.testing.assert_allclose(t_logits, np.stack(want, 1), rtol=1e-4, atol=1e-5)
    assert t_len.tolist() == trg_len.tolist()


def test_a_seq2seq_decoder_trains_through_dynamic_decode():
    """Teacher forcing through dynamic_decode (a While built for training): the loss of
    predicting each next target word falls."""
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 3
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        h0 = L.data(name="h0", shape=[B, H], dtype="float32", append_batch_size=False)
        trg = L.data(name="trg", shape=[B, MAX_STEP, 1], dtype="int64",
                     append_batch_size=False)
        label = L.data(name="label", shape=[B, MAX_STEP, 1], dtype="int64",
                       append_batch_size=False)
        trg_len = L.data(name="trg_len", shape=[B], dtype="int64", append_batch_size=False)
        emb = L.reshape(L.embedding(trg, size=[VOCAB, E]), [B, MAX_STEP, E])
        decoder = L.BasicDecoder(L.GRUCell(H), L.TrainingHelper(emb, trg_len),
                                 lambda x: L.fc(x, VOCAB))
        (logits, _), _ = L.dynamic_decode(decoder, inits=h0)
        loss = L.reduce_mean(L.softmax_with_cross_entropy(logits, label))
        fluid.optimizer.Adam(0.05).minimize(loss)
    rng = np.random.default_rng(0)
    trg_v = rng.integers(2, VOCAB, size=(B, MAX_STEP, 1)).astype(np.int64)
    feed = {"h0": rng.normal(size=(B, H)).astype(np.float32), "trg": trg_v,
            "label": (trg_v + 1) % VOCAB, "trg_len": np.full(B, MAX_STEP, np.int64)}
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    losses = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss],
                                       scope=scope)[0]).reshape(-1)[0]) for _ in range(12)]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses


# ---- SampleEmbeddingHelper ---------------------------------------------------------------------
def test_sample_embedding_helper_draws_from_the_softmax(fresh_programs):
    """Sampled decoding: with a tiny temperature the draw is the greedy arg-max (checked
    against NumPy); with a large batch at temperature 2 the first step's ids follow
    softmax(logits / 2) of the first step's logits (fetched, the histogram compared)."""
    main, startup = fresh_programs
    main.random_seed = startup.random_seed = 4
    n = 2000
    h0 = L.data(name="h0", shape=[-1, H], dtype="float32", append_batch_size=False)
    start = L.data(name="start", shape=[-1], dtype="int64", append_batch_size=False)

    def embed(ids):
        return L.embedding(ids, size=[VOCAB, E], param_attr=fluid.ParamAttr(
            name="emb", initializer=fluid.initializer.Uniform(-1.0, 1.0)))

    def out_fn(x):
        return L.fc(x, VOCAB, num_flatten_dims=len(x.shape) - 1, param_attr=fluid.ParamAttr(
            name="w_out", initializer=fluid.initializer.Uniform(-1.5, 1.5)),
            bias_attr=fluid.ParamAttr(name="b_out"))
    cell = L.GRUCell(H, name="dec")
    fetch = []
    for temperature in (1e-4, 2.0):
        helper = L.SampleEmbeddingHelper(embed, start, END, softmax_temperature=temperature)
        decoder = L.BasicDecoder(cell, helper, out_fn)
        (logits, ids), _ = L.dynamic_decode(decoder, inits=h0, max_step_num=MAX_STEP,
                                            is_test=True)
        fetch += [logits, ids]
    with pytest.raises(ValueError, match="SampleEmbeddingHelper: softmax_temperature"):
        L.SampleEmbeddingHelper(embed, start, END, softmax_temperature=0)
    exe = fluid.Executor()
    exe.run(startup)
    scope = fluid.global_scope()
    names = {"emb": "emb", "w_out": "w_out", "b_out": "b_out", "w_g": "dec_0.w_0",
             "b_g": "dec_0.b_0", "w_c": "dec_0.w_1", "b_c": "dec_0.b_1"}
    p = {k: np.asarray(scope.find_var(v).value, np.float64) for k, v in names.items()}
    rng = np.random.default_rng(3)
    h0v = rng.normal(size=(n, H)).astype(np.float32)
    h0v[:] = h0v[:1]                              # one state: every row draws from one softmax
    feed = {"h0": h0v, "start": np.full(n, START, np.int64)}
    cold_logits, cold_ids, warm_logits, warm_ids = exe.run(main, feed=feed, fetch_list=fetch)
    assert cold_ids.dtype == np.int64 and warm_ids.dtype == np.int64
    # temperature -> 0: greedy, step by step, for the first row
    h, word, want = h0v[:1].astype(np.float64), np.array([START]), []
    for _ in range(cold_ids.shape[1]):
        h = _np_gru(p, p["emb"][word], h)
        word = np.argmax(h @ p["w_out"] + p["b_out"], axis=1)
        want.append(word[0])
        if word[0] == END:
            break
    np.testing.assert_array_equal(cold_ids[0, :len(want)], want)
    # temperature 2: the first step's frequencies are softmax(logits / 2)
    z = warm_logits[0, 0].astype(np.float64) / 2.0
    prob = np.exp(z - z.max())
    prob /= prob.sum()
    freq = np.bincount(warm_ids[:, 0], minlength=VOCAB) / n
    np.testing.assert_allclose(freq, prob, atol=4 * np.sqrt(0.25 / n))
    assert len(set(warm_ids[:, 0].tolist())) > 1
