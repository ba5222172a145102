"""The book's machine-translation decoder as Fluid 1.x scripts write it: a ``While`` whose body
reads the step's prefixes from tensor arrays, scores the vocabulary with an RNN cell, runs
``beam_search``, and stops at a maximum length or when ``is_empty``; ``beam_search_decode``
traces the hypotheses back. Each hypothesis's scores are checked against the model's own
log-probabilities computed in NumPy along its words."""
import numpy as np
import pytest

import pdjit as fluid

# ops of these programs that run on the host (their NumPy references) by design, as a compiled
# plan says once per process: beam_search, beam_search_decode, read_from_array, write_to_array,
# is_empty (and their gradients)
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
VOCAB, EMB, HID, BEAM, MAX_LEN, END = 7, 4, 5, 2, 4, 1


def _decoder():
    src = L.data(name="src", shape=[HID], dtype="float32", lod_level=1)
    context = L.sequence_last_step(src)
    init_ids = L.data(name="init_ids", shape=[1], dtype="int64", lod_level=2)
    init_scores = L.data(name="init_scores", shape=[1], dtype="float32", lod_level=2)
    array_len = L.fill_constant(shape=[1], dtype="int64", value=MAX_LEN)
    counter = L.zeros(shape=[1], dtype="int64", force_cpu=True)
    state_array = L.create_array("float32")
    L.array_write(context, array=state_array, i=counter)
    ids_array = L.create_array("int64")
    scores_array = L.create_array("float32")
    L.array_write(init_ids, array=ids_array, i=counter)
    L.array_write(init_scores, array=scores_array, i=counter)
    cond = L.less_than(x=counter, y=array_len)
    while_op = L.While(cond=cond)
    with while_op.block():
        pre_ids = L.array_read(array=ids_array, i=counter)
        pre_state = L.array_read(array=state_array, i=counter)
        pre_score = L.array_read(array=scores_array, i=counter)
        pre_state_expanded = L.sequence_expand(pre_state, pre_score)
        pre_ids_emb = L.embedding(input=pre_ids, size=[VOCAB, EMB], dtype="float32",
                                  param_attr=fluid.ParamAttr(name="trg_emb"))
        current_state = L.fc(input=[pre_state_expanded, pre_ids_emb], size=HID, act="tanh",
                             param_attr=[fluid.ParamAttr(name="w_state"),
                                         fluid.ParamAttr(name="w_word")],
                             bias_attr=fluid.ParamAttr(name="b_state"))
        current_state_with_lod = L.lod_reset(x=current_state, y=pre_score)
        current_score = L.fc(input=current_state_with_lod, size=VOCAB, act="softmax",
                             param_attr=fluid.ParamAttr(name="w_out"),
                             bias_attr=fluid.ParamAttr(name="b_out"))
        topk_scores, topk_indices = L.topk(current_score, k=BEAM)
        accu_scores = L.elementwise_add(x=L.log(topk_scores),
                                        y=L.reshape(pre_score, shape=[-1]), axis=0)
        selected_ids, selected_scores = L.beam_search(pre_ids, pre_score, topk_indices,
                                                      accu_scores, BEAM, end_id=END, level=0)
        L.increment(x=counter, value=1, in_place=True)
        L.array_write(current_state, array=state_array, i=counter)
        L.array_write(selected_ids, array=ids_array, i=counter)
        L.array_write(selected_scores, array=scores_array, i=counter)
        length_cond = L.less_than(x=counter, y=array_len)
        finish_cond = L.logical_not(L.is_empty(x=selected_ids))
        L.logical_and(x=length_cond, y=finish_cond, out=cond)
    return L.beam_search_decode(ids=ids_array, scores=scores_array, beam_size=BEAM,
                                end_id=END)


def _log_probs(p, state, word):
    """One decoder step in NumPy: (new state, log-probabilities of the next word)."""
    state = np.tanh(state @ p["w_state"] + p["trg_emb"][word] @ p["w_word"] + p["b_state"])
    logits = state @ p["w_out"] + p["b_out"]
    logits = logits - logits.max()
    return state, logits - np.log(np.exp(logits).sum())


def test_book_style_beam_search_decoder():
    if not hasattr(L, "is_empty"):
        pytest.skip("fluid.layers.is_empty is not available")
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 2
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids, scores = _decoder()
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    p = {n: np.asarray(scope.find_var(n).value, np.float64)
         for n in ("trg_emb", "w_state", "w_word", "b_state", "w_out", "b_out")}
    rng = np.random.default_rng(0)
    lens = [3, 2]
    src = rng.normal(size=(sum(lens), HID)).astype(np.float32)
    n = len(lens)
    start = 0  # every hypothesis starts from word 0 with score 0
    feed = {"src": fluid.create_lod_tensor(src, [lens], fluid.CPUPlace()),
            "init_ids": fluid.create_lod_tensor(np.full((n, 1), start, np.int64),
                                                [[1] * n, [1] * n], fluid.CPUPlace()),
            "init_scores": fluid.create_lod_tensor(np.zeros((n, 1), np.float32),
                                                   [[1] * n, [1] * n], fluid.CPUPlace())}
    got_ids, got_scores = exe.run(main, feed=feed, fetch_list=[ids, scores],
                                  return_numpy=False, scope=scope)
    src_lod, hyp_lod = got_ids.lod()
    assert len(src_lod) == n + 1 and got_scores.lod() == got_ids.lod()
    words, word_scores = np.asarray(got_ids), np.asarray(got_scores)
    contexts = src[np.cumsum(lens) - 1].astype(np.float64)
    for s in range(n):
        finals = []
        for h in range(src_lod[s], src_lod[s + 1]):
            hyp = words[hyp_lod[h]:hyp_lod[h + 1]].tolist()
            hyp_scores = word_scores[hyp_lod[h]:hyp_lod[h + 1]]
            assert hyp[0] == start and 1 < len(hyp) <= MAX_LEN + 1, hyp
            assert all(w != END for w in hyp[:-1]), hyp   # only the last word may end it
            # the scores are the hypothesis's accumulated log-probabilities under the model
            state, total, want = contexts[s], 0.0, [0.0]
            for prev, word in zip(hyp[:-1], hyp[1:]):
                state, logp = _log_probs(p, state, prev)
                total += logp[word]
                want.append(total)
            np.testing.assert_allclose(hyp_scores, want, rtol=1e-4, atol=1e-5)
            finals.append(hyp_scores[-1])
        assert finals == sorted(finals, reverse=True)   # best first
