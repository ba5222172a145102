"""fluid.metrics (host side) against scikit-learn and hand counts, the ``auc`` layer against
scikit-learn and against PaddlePaddle 3.3.1's legacy ``auc`` op, and the ``edit_distance``
layer against a dynamic programme and Paddle's recorded values."""
from __future__ import annotations

import numpy as np
import pytest

import pdjit as fluid
from pdjit import metrics
from pdjit.testing.op_test import assert_native

# op 'auc' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(auc)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")


@pytest.fixture(scope="module")
def sk():
    """scikit-learn's metrics (imported by the tests that use them: 1.8 s at collection)."""
    return pytest.importorskip("sklearn.metrics")


RNG = np.random.default_rng(7)


def _batches(n_batches=4, n=50):
    """(probability of class 1 [n, 1], 0/1 labels [n, 1]) batches, labels correlated with the
    probabilities so every metric is away from its trivial value."""
    out = []
    for _ in range(n_batches):
        lab = RNG.integers(0, 2, (n, 1))
        p = np.clip(0.35 * lab + 0.65 * RNG.random((n, 1)), 0, 1)
        out.append((p.astype(np.float32), lab.astype(np.int64)))
    return out


def test_precision_recall_match_sklearn(sk):
    batches = _batches()
    prec, rec = metrics.Precision(), metrics.Recall("rec")
    for p, lab in batches:
        prec.update(p, lab)
        rec.update(p.reshape(-1), lab.reshape(-1))  # [N] works too
    p = np.concatenate([b[0] for b in batches]).ravel()
    lab = np.concatenate([b[1] for b in batches]).ravel()
    hard = (p >= 0.5).astype(int)  # np.rint: 0.5 rounds to 0, and no p is exactly 0.5 here
    assert not np.any(p == 0.5)
    assert prec.eval() == pytest.approx(sk.precision_score(lab, hard))
    assert rec.eval() == pytest.approx(sk.recall_score(lab, hard))
    assert str(prec) == "Precision" and str(rec) == "rec"
    prec.reset()
    assert prec.eval() == 0.0 and prec.tp == 0 and prec.fp == 0


def test_accuracy_is_the_weighted_mean_of_batch_accuracies(sk):
    acc = metrics.Accuracy()
    total_right = total = 0
    for p, lab in _batches(3, 40):
        hard = (p >= 0.5).astype(int)
        batch_acc = np.asarray(sk.accuracy_score(lab, hard), np.float32)  # as the layer fetches
        acc.update(batch_acc, len(lab))
        total_right += int(np.sum(hard == lab))
        total += len(lab)
    assert isinstance(acc.eval(), float)  # summed in float64, not in the fetched float32
    assert acc.eval() == pytest.approx(total_right / total, rel=1e-6)
    acc.reset()
    with pytest.raises(ValueError, match="no data"):
        acc.eval()
    with pytest.raises(ValueError, match="'weight' can not be negative"):
        acc.update(0.5, -1)
    with pytest.raises(ValueError, match="'value' must be a number"):
        acc.update("0.5", 3)


def test_auc_metric_matches_sklearn_with_many_thresholds(sk):
    batches = _batches()
    auc = metrics.Auc("auc", num_thresholds=2 ** 16)
    for p, lab in batches:
        auc.update(np.concatenate([1 - p, p], axis=1), lab)
    p = np.concatenate([b[0] for b in batches]).ravel()
    lab = np.concatenate([b[1] for b in batches]).ravel()
    assert auc.eval() == pytest.approx(sk.roc_auc_score(lab, p), abs=1e-3)
    assert type(auc.eval()) is float   # as Fluid's, not a NumPy scalar
    auc.reset()
    assert auc.eval() == 0.0
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]: row 1"):
        auc.update(np.array([[0.5, 0.5], [0.0, 1.5]]), np.array([[0], [1]]))
    with pytest.raises(ValueError, match="one row per sample"):
        auc.update(np.array([[0.5, 0.5]]), np.array([[0], [1]]))


def _edit_distance(a, b) -> int:
    """Levenshtein distance by the textbook dynamic programme."""
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[-1]


def test_edit_distance_metric_against_a_dynamic_programme():
    pairs = [([1, 2, 3], [1, 2, 3]), ([1, 2, 3, 4], [2, 3, 5]), ([7], [1, 2]),
             ([], [4, 4]), ([5, 6], [5, 6]), ([1, 2, 1], [2, 1, 2])]
    dists = [_edit_distance(a, b) for a, b in pairs]
    m = metrics.EditDistance("ed")
    m.update(np.array(dists[:4], np.float32).reshape(-1, 1), 4)
    m.update(np.array(dists[4:], np.float32).reshape(-1, 1), 2)
    avg, err = m.eval()
    assert dists == [0, 2, 2, 2, 0, 2]
    assert avg == pytest.approx(8 / 6)
    assert err == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="seq_num=3, got 2 distances"):
        m.update(np.zeros(2), 3)
    m.reset()
    with pytest.raises(ValueError, match="no data"):
        m.eval()


def _lod(seqs):
    flat = np.array([t for s in seqs for t in s], np.int64).reshape(-1, 1)
    return fluid.create_lod_tensor(flat, [[len(s) for s in seqs]], fluid.CPUPlace())


def test_edit_distance_layer_feeds_the_metric_natively():
    """layers.edit_distance on LoD and padded sequences (empty ones included), normalized or
    not, against the dynamic programme above; compiled (native) and reference runs agree."""
    rng = np.random.default_rng(3)
    hyps = [list(rng.integers(0, 4, n)) for n in (3, 0, 5, 2, 4)]
    refs = [list(rng.integers(0, 4, n)) for n in (2, 3, 5, 1, 4)]
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        h = fluid.layers.data(name="h", shape=[1], dtype="int64", lod_level=1)
        r = fluid.layers.data(name="r", shape=[1], dtype="int64", lod_level=1)
        dist, num = fluid.layers.edit_distance(h, r, normalized=False)
        ndist, _ = fluid.layers.edit_distance(h, r)  # normalized by default, as Fluid
        hp, rp = fluid.data("hp", [-1, 5], "int64"), fluid.data("rp", [-1, 5], "int64")
        hl, rl = fluid.data("hl", [-1], "int64"), fluid.data("rl", [-1], "int64")
        pdist, pnum = fluid.layers.edit_distance(hp, rp, False, input_length=hl,
                                                 label_length=rl)
    assert (dist.dtype, list(dist.shape), num.dtype, list(num.shape)) == \
        (np.float32, [-1, 1], np.int64, [1])
    padded = np.full((5, 5), 9, np.int64)   # padding that must not count
    feed = {"h": _lod(hyps), "r": _lod(refs), "hp": padded.copy(), "rp": padded.copy(),
            "hl": np.array([len(s) for s in hyps]), "rl": np.array([len(s) for s in refs])}
    for k, (a, b) in enumerate(zip(hyps, refs)):
        feed["hp"][k, :len(a)], feed["rp"][k, :len(b)] = a, b
    want = np.array([_edit_distance(a, b) for a, b in zip(hyps, refs)], np.float64)
    results = []
    for mode in ("compiled", "reference"):
        exe = fluid.Executor(fluid.CPUPlace(), mode=mode, strict=mode == "compiled")
        got = exe.run(main, feed=feed, fetch_list=[dist, num, ndist, pdist, pnum])
        if mode == "compiled":
            assert_native(exe, "edit_distance")
        np.testing.assert_array_equal(got[0].ravel(), want)
        np.testing.assert_array_equal(got[3].ravel(), want)
        np.testing.assert_allclose(got[2].ravel(), want / [len(b) for b in refs], rtol=1e-7)
        assert got[1].tolist() == got[4].tolist() == [5] and got[0].dtype == np.float32
        results.append(got)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    m = metrics.EditDistance("ed")
    m.update(results[0][0], results[0][1])
    assert m.eval() == pytest.approx((want.mean(), np.mean(want > 0)))


def test_edit_distance_matches_paddles_recorded_values_and_errors():
    # outputs of PaddlePaddle 3.3.1's legacy edit_distance op on these inputs
    hyps, refs = [[1, 2, 3], [4, 5], [], [7, 7, 7, 7]], [[1, 2, 4], [4], [1, 2], [7]]
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        h = fluid.layers.data(name="h", shape=[1], dtype="int64", lod_level=1)
        r = fluid.layers.data(name="r", shape=[1], dtype="int64", lod_level=1)
        dist, _ = fluid.layers.edit_distance(h, r, normalized=False)
        ndist, _ = fluid.layers.edit_distance(h, r)
        with pytest.raises(ValueError, match="ignored_tokens is not supported"):
            fluid.layers.edit_distance(h, r, ignored_tokens=[0])
        with pytest.raises(ValueError, match="input_length and label_length together"):
            fluid.layers.edit_distance(h, r, input_length=h)
        with pytest.raises(TypeError, match="edit_distance"):
            fluid.layers.edit_distance(fluid.layers.cast(h, "int32"), r)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    got = exe.run(main, feed={"h": _lod(hyps), "r": _lod(refs)}, fetch_list=[dist, ndist])
    np.testing.assert_array_equal(got[0].ravel(), [1.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(got[1].ravel(), np.float32([1 / 3, 1.0, 1.0, 3.0]))
    # an empty reference cannot normalize: Paddle's "Reference string 2 is empty"
    with pytest.raises(fluid.OpRunError, match=r"edit_distance.*Reference string 2 is empty"):
        exe.run(main, feed={"h": _lod(hyps), "r": _lod([[1], [], [1], [2]])},
                fetch_list=[ndist])


def _chunks(tags, num_types=2):
    """IOB chunks (begin, end, type) of a tag sequence: tag 2t = B-t, 2t+1 = I-t for t <
    num_types; any other tag is O."""
    chunks, start, typ = set(), None, None
    for i, t in enumerate(list(tags) + [-1]):
        t = t if 0 <= t < 2 * num_types else -1
        inside = t >= 0 and t % 2 == 1 and typ == t // 2 and start is not None
        if not inside and start is not None:
            chunks.add((start, i, typ))
            start = None
        if t >= 0 and t % 2 == 0:
            start, typ = i, t // 2
    return chunks


def test_chunk_evaluator_against_hand_counts():
    # O is 4; types 0 and 1
    label = [0, 1, 4, 2, 3, 3, 4, 0]
    infer = [0, 1, 4, 2, 3, 4, 4, 2]
    lc, ic = _chunks(label), _chunks(infer)
    assert lc == {(0, 2, 0), (3, 6, 1), (7, 8, 0)}
    assert ic == {(0, 2, 0), (3, 5, 1), (7, 8, 1)}
    ev = metrics.ChunkEvaluator()
    ev.update(np.array([len(ic)]), np.array([len(lc)]), np.array([len(ic & lc)]))
    ev.update(2, 1, 1)  # plain ints too
    p, r, f1 = ev.eval()
    assert (p, r) == (pytest.approx(2 / 5), pytest.approx(2 / 4))
    assert f1 == pytest.approx(2 * 0.4 * 0.5 / 0.9)
    ev.reset()
    assert ev.eval() == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="'num_label_chunks' can not be negative"):
        ev.update(1, -1, 0)


def test_composite_metric_updates_every_metric(sk):
    comp = metrics.CompositeMetric()
    comp.add_metric(metrics.Precision())
    comp.add_metric(metrics.Recall())
    p, lab = _batches(1, 60)[0]
    comp.update(p, lab)
    hard = (p >= 0.5).astype(int).ravel()
    assert comp.eval() == [pytest.approx(sk.precision_score(lab.ravel(), hard)),
                           pytest.approx(sk.recall_score(lab.ravel(), hard))]
    with pytest.raises(ValueError, match="expected a MetricBase"):
        comp.add_metric(object())
    with pytest.raises(ValueError, match="'preds' must be a numpy ndarray"):
        comp.update([0.1], lab)


# ---- the auc layer ------------------------------------------------------------------------------
def _auc_program(num_thresholds, slide_steps, width=2):
    main, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, start), fluid.unique_name.guard():
        x = fluid.data("x", [-1, width], "float32")
        y = fluid.data("y", [-1, 1], "int64")
        res = fluid.layers.auc(x, y, num_thresholds=num_thresholds, slide_steps=slide_steps)
    return main, start, res


def _assert_native(exe):
    steps = [s for _, plan in exe._plans.values() for s in plan.walk()]
    assert steps and all(s.kind.startswith("native") for s in steps), \
        [s.describe() for s in steps]


def _run_auc(main, start, res, batches):
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace(), strict=True)
    fluid.Executor(fluid.CPUPlace(), mode="reference").run(start, scope=scope)
    out = []
    for p, lab in batches:
        feed = {"x": np.concatenate([1 - p, p], axis=1), "y": lab}
        out.append(exe.run(main, feed=feed, fetch_list=[res[0], res[1]] + res[2], scope=scope))
    _assert_native(exe)  # both auc ops ran as native code
    return out


def test_auc_layer_matches_sklearn_globally_and_over_the_window(sk):
    batches = _batches(3, 40)
    main, start, res = _auc_program(4095, 2)
    outs = _run_auc(main, start, res, batches)
    for k, (g, b, bpos, bneg, pos, neg) in enumerate(outs):
        assert int(bneg[-1]) == k + 1
        assert g.shape == (1,) and g.dtype == np.float64  # Fluid 1.x's [1]
        seen = batches[:k + 1]
        p = np.concatenate([s[0] for s in seen]).ravel()
        lab = np.concatenate([s[1] for s in seen]).ravel()
        assert float(g[0]) == pytest.approx(sk.roc_auc_score(lab, p), abs=1e-3)
        win = batches[max(0, k - 1):k + 1]  # slide_steps=2: this batch and the one before
        wp = np.concatenate([s[0] for s in win]).ravel()
        wl = np.concatenate([s[1] for s in win]).ravel()
        assert float(b[0]) == pytest.approx(sk.roc_auc_score(wl, wp), abs=1e-3)
        assert pos.shape == (1, 4096) and int(pos.sum()) == int(lab.sum())
        assert int(neg.sum()) == lab.size - int(lab.sum())
        assert bpos.shape == (3 * 4096 + 1,) and bpos[-1] == k + 1
    ops = [op.type for op in main.global_block().ops]
    assert ops.count("auc") == 2


def test_auc_layer_bad_input_names_the_op():
    main, start, res = _auc_program(4095, 2)
    p = np.array([[0.2], [1.2]], np.float32)
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    exe.run(start, scope=scope)
    with pytest.raises(fluid.OpRunError, match=r"auc.*\[0, 1\]"):
        exe.run(main, feed={"x": np.concatenate([1 - p, p], 1), "y": np.zeros((2, 1), "int64")},
                fetch_list=[res[0]], scope=scope)
    with fluid.program_guard(main, start):
        x3 = fluid.data("x3", [-1, 3], "float32")
        with pytest.raises(fluid.OpShapeError, match=r"Predict must be \[N, 2\]"):
            fluid.layers.auc(x3, main.global_block().var("y"))
        with pytest.raises(ValueError, match="curve must be 'ROC' or 'PR'"):
            fluid.layers.auc(main.global_block().var("x"), main.global_block().var("y"),
                             curve="XY")


def test_the_verifier_refuses_bad_auc_attributes():
    """A loaded program's auc op with attributes the op refuses: a ProgramError naming it."""
    main, _, _ = _auc_program(7, 1)
    op = main.global_block().ops[0]
    op._set_attr("num_thresholds", 0)
    with pytest.raises(fluid.ProgramError, match=r"op 'auc' \(block 0, op #0\): attribute "
                                                 r"'num_thresholds': expected >= 1, got 0"):
        fluid.verify(main)
    op._set_attr("num_thresholds", 7)
    op._set_attr("curve", "XY")
    with pytest.raises(fluid.ProgramError, match="'curve': expected one of"):
        fluid.verify(main)


# Paddle 3.3.1's legacy ``auc`` ops (``paddle.static.auc(x, y, num_thresholds=4095,
# slide_steps=2)``, legacy static mode, CPU) on the three batches of ``_paddle_batches``: per
# batch, the global AUC, the batch AUC and the batch counter (recorded with
# tests/fixtures/make_auc_fixture.py, which runs paddle; test_auc_layer_against_paddle_live
# reruns it).
PADDLE_AUC = [(0.16666666666666666, 0.16666666666666666, 1),
              (0.3174603174603175, 0.3174603174603175, 2),
              (0.45, 0.59375, 3)]


def _paddle_batches():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(3):
        p = rng.random((8, 1)).astype("float32")
        out.append((p, rng.integers(0, 2, (8, 1)).astype("int64")))
    return out


def test_auc_layer_matches_paddles_recorded_outputs():
    main, start, res = _auc_program(4095, 2)
    outs = _run_auc(main, start, res, _paddle_batches())
    for (g, b, bpos, *_), (want_g, want_b, count) in zip(outs, PADDLE_AUC):
        assert float(g[0]) == want_g and float(b[0]) == want_b and bpos[-1] == count
    # Paddle's legacy layer takes ins_tag_weight and leaves it out of its ops (measured: a
    # weight of 0 changes nothing); so does this one
    main, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, start), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 2], "float32")
        y = fluid.data("y", [-1, 1], "int64")
        w = fluid.data("w", [1, 1], "float32")
        res = fluid.layers.auc(x, y, num_thresholds=4095, slide_steps=2, ins_tag_weight=w)
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace(), strict=True)
    fluid.Executor(fluid.CPUPlace(), mode="reference").run(start, scope=scope)
    for (p, lab), (want_g, want_b, _) in zip(_paddle_batches(), PADDLE_AUC):
        g, b = exe.run(main, feed={"x": np.concatenate([1 - p, p], 1), "y": lab,
                                   "w": np.zeros((1, 1), "float32")},
                       fetch_list=[res[0], res[1]], scope=scope)
        assert (float(g[0]), float(b[0])) == (want_g, want_b)


def test_auc_op_compiled_equals_reference_on_edge_values(sk):
    """float64 [N, 1] probabilities with 0 and 1 exactly, int32 labels of rank 1 with a
    negative label (counted in neither histogram): the native kernel gives the reference's
    bits; and the same statistics as counting by hand."""
    from pdjit.testing import build_op_program, run_op

    p = np.array([[0.0], [1.0], [0.5], [0.25], [0.999], [0.7]])
    lab = np.array([0, 1, 1, -1, 0, 1], np.int32)
    size = 3 * 4096 + 1
    ins = {"Predict": p, "Label": lab, "StatPos": np.zeros(size, np.int64),
           "StatNeg": np.zeros(size, np.int64)}
    attrs = {"num_thresholds": 4095, "slide_steps": 2}
    ref = run_op("auc", ins, attrs, mode="reference")
    prog, feed, outs = build_op_program("auc", ins, attrs)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    slots = list(outs)
    got = exe.run(prog, feed=feed, fetch_list=[outs[s_][0] for s_ in slots], scope=fluid.Scope())
    _assert_native(exe)
    exe_got = dict(zip(slots, got))
    for slot in ref:
        np.testing.assert_array_equal(exe_got[slot], ref[slot])
    bins = (p[:, 0] * 4095).astype(int)
    want_pos = np.bincount(bins[lab > 0], minlength=4096)
    np.testing.assert_array_equal(exe_got["StatPosOut"][2 * 4096:3 * 4096], want_pos)
    assert exe_got["StatNegOut"][:4096].sum() == 2 and exe_got["StatNegOut"][-1] == 1
    # 3 positives above both negatives but one: the one at 0.999 outranks 0.5 and 0.7
    assert float(exe_got["AUC"]) == pytest.approx(sk.roc_auc_score([0, 1, 1, 0, 1],
                                                                   p[[0, 1, 2, 4, 5], 0]))


def test_auc_op_ins_tag_weight_zero_counts_nothing():
    from pdjit.testing import run_op

    rng = np.random.default_rng(5)
    p = rng.random((6, 1))
    stats = rng.integers(0, 4, (2, 3 * 9 + 1)).astype(np.int64)
    stats[:, -1] = 4  # batches seen: the next one goes to ring slot 4 % 2 = 0
    stats[:, 18:27] = stats[:, 0:9] + stats[:, 9:18]  # the window's sum
    ins = {"Predict": np.concatenate([1 - p, p], 1), "Label": rng.integers(0, 2, (6, 1)),
           "StatPos": stats[0], "StatNeg": stats[1], "InsTagWeight": np.zeros((1, 1))}
    got = run_op("auc", ins, {"num_thresholds": 8, "slide_steps": 2}, mode="compiled")
    for slot, s in (("StatPosOut", stats[0]), ("StatNegOut", stats[1])):
        want = s.copy()
        want[0:9] = 0  # slot 0's old batch leaves the window, the padding batch adds nothing
        want[18:27] = s[9:18]
        want[-1] = 5
        np.testing.assert_array_equal(got[slot], want)


@pytest.mark.paddle
def test_auc_layer_against_paddle_live():
    import ast
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    script = Path(__file__).parent.parent / "fixtures" / "make_auc_fixture.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = ast.literal_eval(proc.stdout.strip().splitlines()[-1])  # [(float, float, int)]
    assert got == PADDLE_AUC
