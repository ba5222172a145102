"""Fluid 1.x's ``beam_search`` and ``beam_search_decode``: steps and back-traces computed by
hand on small vocabularies, and a brute-force ranking written here."""
import math

import numpy as np
import pytest

import pdjit as fluid

L = fluid.layers
END = 0


def _lod(x, offsets):
    """A LoD tensor of ``x`` with LoD ``offsets`` (given as offsets, passed as lengths)."""
    lengths = [np.diff(level).tolist() for level in offsets]
    return fluid.create_lod_tensor(np.asarray(x), lengths, fluid.CPUPlace())


def _step_program(beam_size, with_ids, is_accumulated, width):
    pre_ids = L.data(name="pre_ids", shape=[1], dtype="int64", lod_level=2)
    pre_scores = L.data(name="pre_scores", shape=[1], dtype="float64", lod_level=2)
    ids = L.data(name="ids", shape=[width], dtype="int64", lod_level=2) if with_ids else None
    scores = L.data(name="scores", shape=[width], dtype="float64", lod_level=2)
    return L.beam_search(pre_ids, pre_scores, ids, scores, beam_size=beam_size, end_id=END,
                         is_accumulated=is_accumulated, return_parent_idx=True)


def _run_step(feed, **kw):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        outs = _step_program(**kw)
    return fluid.Executor().run(main, feed=feed, fetch_list=list(outs), return_numpy=False)


def test_beam_search_step_by_hand():
    """Source 0 has two live prefixes (rows 0, 1), source 1 one that ended (row 2)."""
    lod = [[0, 2, 3], [0, 1, 2, 3]]
    feed = {"pre_ids": _lod([[1], [2], [END]], lod),
            "pre_scores": _lod([[-0.5], [-0.9], [-0.3]], lod),
            "ids": _lod([[4, 5], [6, 4], [7, 8]], lod),
            "scores": _lod([[-0.6, -1.2], [-1.0, -0.7], [-0.4, -0.5]], lod)}
    ids, scores, parent = _run_step(feed, beam_size=2, with_ids=True, is_accumulated=True,
                                    width=2)
    # source 0: (-0.6, row 0, id 4) and (-0.7, row 1, id 4); source 1 chose only end_id
    # after an ended prefix: finished, it selects nothing
    assert np.asarray(ids).tolist() == [[4], [4]]
    np.testing.assert_allclose(np.asarray(scores), [[-0.6], [-0.7]])
    assert np.asarray(parent).tolist() == [0, 1]
    assert ids.lod() == [[0, 2, 3], [0, 1, 2, 2]] and scores.lod() == ids.lod()


def test_beam_search_prunes_a_source_whose_selection_all_ended():
    """Source 1's ended prefix (row 2, -0.3) beats every candidate of its live prefix
    (row 1): with beam 1 it alone is selected, an end_id after an ended prefix, so the source
    is finished and selects nothing, though row 1 did not end (Fluid 1.8 looks only at the
    selected candidates). Source 0 keeps its best."""
    lod = [[0, 1, 3], [0, 1, 2, 3]]
    feed = {"pre_ids": _lod([[1], [2], [END]], lod),
            "pre_scores": _lod([[-0.5], [-0.9], [-0.3]], lod),
            "ids": _lod([[4, 5], [6, 7], [8, 9]], lod),
            "scores": _lod([[-0.6, -1.2], [-1.0, -0.7], [-0.4, -0.5]], lod)}
    ids, scores, parent = _run_step(feed, beam_size=1, with_ids=True, is_accumulated=True,
                                    width=2)
    assert np.asarray(ids).tolist() == [[4]]
    np.testing.assert_allclose(np.asarray(scores), [[-0.6]])
    assert np.asarray(parent).tolist() == [0]
    assert ids.lod() == [[0, 1, 3], [0, 1, 1, 1]]


def _brute_force(pre_ids, pre_scores, probs, sources, beam_size):
    """Every (row, word) candidate of a source ranked by score, then by row (later first)."""
    chosen = {r: [] for r in range(len(pre_ids))}
    for a, b in zip(sources[:-1], sources[1:]):
        cands = []
        for r in range(a, b):
            if pre_ids[r] == END:
                cands.append((pre_scores[r], r, END))
            else:
                cands += [(pre_scores[r] + math.log(p), r, w) for w, p in enumerate(probs[r])]
        cands.sort(key=lambda c: (-c[0], -c[1]))
        for c in cands[:beam_size]:
            chosen[c[1]].append(c)
    return chosen


def test_beam_search_over_probabilities_matches_a_brute_force_ranking():
    rng = np.random.default_rng(0)
    rows, vocab, beam = 5, 6, 3
    lod = [[0, 3, 5], [0, 1, 2, 3, 4, 5]]
    pre_ids = np.array([3, END, 2, 4, 1])
    pre_scores = np.log(rng.uniform(0.2, 1.0, rows))
    probs = rng.dirichlet(np.ones(vocab), size=rows)
    feed = {"pre_ids": _lod(pre_ids.reshape(-1, 1), lod),
            "pre_scores": _lod(pre_scores.reshape(-1, 1), lod),
            "scores": _lod(probs, lod)}
    ids, scores, parent = _run_step(feed, beam_size=beam, with_ids=False,
                                    is_accumulated=False, width=vocab)
    chosen = _brute_force(pre_ids, pre_scores, probs, lod[0], beam)
    want = [c for r in range(rows) for c in chosen[r]]
    assert np.asarray(ids).ravel().tolist() == [c[2] for c in want]
    np.testing.assert_allclose(np.asarray(scores).ravel(), [c[0] for c in want], rtol=1e-12)
    assert np.asarray(parent).tolist() == [c[1] for c in want]
    offsets = np.cumsum([0] + [len(chosen[r]) for r in range(rows)]).tolist()
    assert ids.lod() == [[0, 3, 5], offsets]


def test_beam_search_decode_traces_back_by_hand(fresh_programs):
    """One source, beam 2: step 0 picks 3 and 5; step 1 extends 3 by 7 and ends 5 (end_id);
    step 2 extends 7 by 9 and repeats the ended hypothesis's end_id (kept once)."""
    main, _ = fresh_programs
    steps = [([[3], [5]], [[-0.1], [-0.2]], [[0, 1], [0, 2]]),
             ([[7], [END]], [[-0.3], [-0.25]], [[0, 2], [0, 1, 2]]),
             ([[9], [END]], [[-0.5], [-0.25]], [[0, 2], [0, 1, 2]])]
    ids_arr = L.create_array("int64")
    scores_arr = L.create_array("float64")
    feed = {}
    for t, (ids, scores, lod) in enumerate(steps):
        i = L.fill_constant([1], "int64", t)
        L.array_write(L.data(name=f"ids{t}", shape=[1], dtype="int64", lod_level=2), i,
                      array=ids_arr)
        L.array_write(L.data(name=f"sc{t}", shape=[1], dtype="float64", lod_level=2), i,
                      array=scores_arr)
        feed[f"ids{t}"], feed[f"sc{t}"] = _lod(ids, lod), _lod(scores, lod)
    sent_ids, sent_scores = L.beam_search_decode(ids_arr, scores_arr, beam_size=2, end_id=END)
    got_ids, got_scores = fluid.Executor().run(main, feed=feed,
                                               fetch_list=[sent_ids, sent_scores],
                                               return_numpy=False)
    # best final score first: [5, end] (-0.25), then [3, 7, 9] (-0.5)
    assert np.asarray(got_ids).tolist() == [5, END, 3, 7, 9]
    np.testing.assert_allclose(np.asarray(got_scores), [-0.2, -0.25, -0.1, -0.3, -0.5])
    assert got_ids.lod() == [[0, 2], [0, 2, 5]] and got_scores.lod() == got_ids.lod()


def test_beam_search_refuses_bad_arguments(fresh_programs):
    x = L.data(name="x", shape=[1], dtype="int64", lod_level=2)
    s = L.data(name="s", shape=[4], dtype="float32", lod_level=2)
    with pytest.raises(ValueError, match="beam_search: beam_size must be >= 1"):
        L.beam_search(x, s, None, s, beam_size=0, end_id=0)
    with pytest.raises(TypeError, match="beam_search: end_id must be an int"):
        L.beam_search(x, s, None, s, beam_size=2, end_id="0")
