"""The ``chunk_eval`` op and ``layers.chunk_eval``: chunk counts against a chunk extractor
written here (every scheme, excluded types, LoD and padded sequences), against PaddlePaddle
3.3.1's recorded outputs (``tests/fixtures/make_chunk_eval_fixture.py``), feeding
``metrics.ChunkEvaluator`` from a program, and the errors bad input gets.

The op has no lowering: compiled plans run it as a reference step (which strict mode accepts);
the tests check that step kind and that compiled and reference executors agree."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pdjit as fluid
from pdjit import metrics
from pdjit.framework.errors import ReferenceStepWarning
from pdjit.testing.op_test import assert_native

pytestmark = pytest.mark.filterwarnings(f"ignore::{ReferenceStepWarning.__module__}."
                                        f"{ReferenceStepWarning.__name__}")

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle", "chunk_eval.npz")
# each scheme's tag letters in order: tag number k is LETTERS[scheme][k]
LETTERS = {"IOB": "BI", "IOE": "IE", "IOBES": "BIES", "plain": "I"}
TYPES = 3


# ---- the oracle: a chunk extractor written from the schemes' definitions -----------------------
def chunks(seq, scheme, num_types=TYPES):
    """The chunks ``(begin, end, type)`` (end inclusive) of one tag sequence. A tag is ``type *
    len(letters) + k`` for the letter ``letters[k]``; ``num_types * len(letters)`` is O. A chunk
    runs over tokens of one type; B and S open a new one, E and S close the current one."""
    letters = LETTERS[scheme]
    found, cur = set(), None          # cur: [begin, end, type, last letter]
    for i, t in enumerate(seq):
        t = int(t)
        kind, letter = divmod(t, len(letters))
        if kind == num_types:          # O
            if cur:
                found.add(tuple(cur[:3]))
            cur = None
            continue
        letter = letters[letter]
        if cur and cur[2] == kind and letter not in "BS" and cur[3] not in "ES":
            cur[1], cur[3] = i, letter
            continue
        if cur:
            found.add(tuple(cur[:3]))
        cur = [i, i, kind, letter]
    if cur:
        found.add(tuple(cur[:3]))
    return found


def counts(infer_seqs, label_seqs, scheme, excluded=()):
    """(inferred, labelled, correct) chunk counts over pairs of sequences."""
    n_i = n_l = n_c = 0
    for a, b in zip(infer_seqs, label_seqs):
        ca = {c for c in chunks(a, scheme) if c[2] not in excluded}
        cb = {c for c in chunks(b, scheme) if c[2] not in excluded}
        n_i, n_l, n_c = n_i + len(ca), n_l + len(cb), n_c + len(ca & cb)
    return n_i, n_l, n_c


def test_the_oracle_on_hand_tagged_sequences():
    # IOB, 2 types (O = 4): B-0 I-0 O B-1 I-1 I-1 B-1 I-0
    assert chunks([0, 1, 4, 2, 3, 3, 2, 1], "IOB", 2) == \
        {(0, 1, 0), (3, 5, 1), (6, 6, 1), (7, 7, 0)}
    # IOE: I-0 E-0 I-0 I-0 E-0 O E-1 I-1
    assert chunks([0, 1, 0, 0, 1, 4, 3, 2], "IOE", 2) == \
        {(0, 1, 0), (2, 4, 0), (6, 6, 1), (7, 7, 1)}
    # IOBES: B-0 E-0 S-0 I-0 E-0 O S-1
    assert chunks([0, 2, 3, 1, 2, 8, 7], "IOBES", 2) == \
        {(0, 1, 0), (2, 2, 0), (3, 4, 0), (6, 6, 1)}
    assert chunks([0, 0, 1, 2, 0], "plain", 2) == {(0, 1, 0), (2, 2, 1), (4, 4, 0)}


# ---- programs --------------------------------------------------------------------------------
def _tags(rng, n, scheme):
    top = TYPES * len(LETTERS[scheme])
    t = rng.integers(0, top + 1, n)
    t[rng.random(n) < 0.2] = top
    return t.astype(np.int64)


def _noisy(rng, t, scheme):
    out = t.copy()
    flip = rng.random(t.size) < 0.3
    out[flip] = rng.integers(0, TYPES * len(LETTERS[scheme]) + 1, int(flip.sum()))
    return out


def _lod(seqs):
    flat = np.concatenate([np.asarray(s, np.int64) for s in seqs]).reshape(-1, 1)
    return fluid.create_lod_tensor(flat, [[len(s) for s in seqs]], fluid.CPUPlace())


WIDTH = 8


def _programs():
    """One program: for each scheme a LoD pair and a padded pair (``[B, WIDTH]``; IOBES as
    ``[B, WIDTH, 1]``) with lengths, excluding chunk type 1 on the padded pairs."""
    main, startup = fluid.Program(), fluid.Program()
    res = {}
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        for scheme in LETTERS:
            i = fluid.layers.data(name=f"{scheme}_i", shape=[1], dtype="int64", lod_level=1)
            lab = fluid.layers.data(name=f"{scheme}_l", shape=[1], dtype="int64", lod_level=1)
            res[scheme, "lod"] = fluid.layers.chunk_eval(i, lab, scheme, TYPES)
            shape = [-1, WIDTH, 1] if scheme == "IOBES" else [-1, WIDTH]
            ip = fluid.data(f"{scheme}_ip", shape, "int64")
            lp = fluid.data(f"{scheme}_lp", shape, "int64")
            n = fluid.data(f"{scheme}_n", [-1], "int64")
            res[scheme, "pad"] = fluid.layers.chunk_eval(ip, lp, scheme, TYPES,
                                                         excluded_chunk_types=[1],
                                                         seq_length=n)
    return main, res


def _step_kinds(exe) -> dict:
    kinds = {}
    for _, plan in exe._plans.values():
        for step in plan.walk():
            for op in [step.op] if hasattr(step, "op") else [o for o, _ in step.ops]:
                kinds.setdefault(op.type, set()).add(step.kind)
    return kinds


def test_every_scheme_against_the_oracle_lod_and_padded():
    rng = np.random.default_rng(7)
    main, res = _programs()
    lengths = [6, 0, 8, 3, 5]
    feed, want = {}, {}
    for scheme in LETTERS:
        lab = [_tags(rng, n, scheme) for n in lengths]
        inf = [_noisy(rng, s, scheme) for s in lab]
        feed[f"{scheme}_i"], feed[f"{scheme}_l"] = _lod(inf), _lod(lab)
        want[scheme, "lod"] = counts(inf, lab, scheme)
        # padded: garbage (an out-of-range tag) past each length, which must not be read;
        # SeqLength has one length fewer than rows, so the last row is not evaluated either
        lens = np.array(lengths[:-1], np.int64)
        pad = np.full((len(lengths), WIDTH), 99, np.int64)
        ip, lp = pad.copy(), pad.copy()
        for r, (a, b) in enumerate(zip(inf, lab)):
            ip[r, :len(a)], lp[r, :len(b)] = a, b
        if scheme == "IOBES":
            ip, lp = ip[..., None], lp[..., None]
        feed.update({f"{scheme}_ip": ip, f"{scheme}_lp": lp, f"{scheme}_n": lens})
        want[scheme, "pad"] = counts(inf[:-1], lab[:-1], scheme, excluded=(1,))
    fetch = [v for outs in res.values() for v in outs]
    got = {}
    for mode in ("compiled", "reference"):
        exe = fluid.Executor(fluid.CPUPlace(), mode=mode, strict=True)
        vals = exe.run(main, feed=feed, fetch_list=fetch)
        got[mode] = vals
        if mode == "compiled":  # a plan of reference steps, which strict mode accepts
            assert _step_kinds(exe) == {"chunk_eval": {"reference"}}
    for a, b in zip(got["compiled"], got["reference"]):
        np.testing.assert_array_equal(a, b)
    for k, key in enumerate(res):
        p, r, f1, n_i, n_l, n_c = got["compiled"][6 * k:6 * k + 6]
        assert (n_i.tolist(), n_l.tolist(), n_c.tolist()) == \
            tuple([c] for c in want[key]), key
        assert all(v.dtype == np.float32 and v.shape == (1,) for v in (p, r, f1))
        assert all(v.dtype == np.int64 and v.shape == (1,) for v in (n_i, n_l, n_c))
        wi, wl, wc = want[key]
        assert 0 < wc < max(wi, wl), key   # the draw exercises partial matches
        assert p[0] == np.float32(wc) / np.float32(wi)
        assert r[0] == np.float32(wc) / np.float32(wl)
        assert f1[0] == pytest.approx(2 * wc / (wi + wl), rel=1e-6)


def test_matches_paddles_recorded_outputs():
    rec = np.load(FIXTURE)
    slots = ["Precision", "Recall", "F1-Score", "NumInferChunks", "NumLabelChunks",
             "NumCorrectChunks"]
    lengths = [7, 0, 9, 4]       # make_chunk_eval_fixture.LENGTHS
    width = rec["IOB/pad/inf"].shape[1]
    assert width == 9
    main, startup = fluid.Program(), fluid.Program()
    outs = {}
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        for scheme in LETTERS:
            i = fluid.layers.data(name=f"{scheme}_i", shape=[1], dtype="int64", lod_level=1)
            lab = fluid.layers.data(name=f"{scheme}_l", shape=[1], dtype="int64", lod_level=1)
            outs[scheme, "lod"] = fluid.layers.chunk_eval(i, lab, scheme, TYPES)
            ip, lp = (fluid.data(f"{scheme}_{s}", [-1, width], "int64") for s in ("ip", "lp"))
            n = fluid.data(f"{scheme}_n", [-1], "int64")
            outs[scheme, "pad"] = fluid.layers.chunk_eval(ip, lp, scheme, TYPES, [1], n)
    feed = {}
    for scheme in LETTERS:
        split = np.cumsum(lengths)[:-1]
        inf, lab = (np.split(rec[f"{scheme}/lod/{s}"], split) for s in ("inf", "lab"))
        feed.update({f"{scheme}_i": _lod(inf), f"{scheme}_l": _lod(lab),
                     f"{scheme}_ip": rec[f"{scheme}/pad/inf"],
                     f"{scheme}_lp": rec[f"{scheme}/pad/lab"],
                     f"{scheme}_n": rec[f"{scheme}/pad/len"]})
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    got = exe.run(main, feed=feed, fetch_list=[v for o in outs.values() for v in o])
    for k, (scheme, layout) in enumerate(outs):
        for slot, value in zip(slots, got[6 * k:6 * k + 6]):
            want = rec[f"{scheme}/{layout}/{slot}"]
            assert value.dtype == want.dtype and value.shape == want.shape
            np.testing.assert_array_equal(value, want, err_msg=f"{scheme} {layout} {slot}")


def test_counts_from_a_program_feed_chunk_evaluator():
    """A tagger's output (the best tag of each token's scores, a native top-k) evaluated by
    chunk_eval over three batches; the fetched counts accumulate in metrics.ChunkEvaluator."""
    scheme, ntags = "IOB", TYPES * 2 + 1
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        scores = fluid.layers.data(name="scores", shape=[ntags], dtype="float32", lod_level=1)
        label = fluid.layers.data(name="label", shape=[1], dtype="int64", lod_level=1)
        _, tags = fluid.layers.topk(scores, 1)
        p, r, f1, n_i, n_l, n_c = fluid.layers.chunk_eval(tags, label, scheme, TYPES)
    rng = np.random.default_rng(11)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    ev = metrics.ChunkEvaluator()
    total = np.zeros(3, np.int64)
    for _ in range(3):
        lengths = list(rng.integers(1, 9, 4))
        lab = [_tags(rng, n, scheme) for n in lengths]
        inf = [_noisy(rng, s, scheme) for s in lab]
        sc = rng.random((sum(lengths), ntags)).astype(np.float32)
        sc[np.arange(sum(lengths)), np.concatenate(inf)] += 1.0   # the best tag is inf's
        feed = {"scores": fluid.create_lod_tensor(sc, [lengths], fluid.CPUPlace()),
                "label": _lod(lab)}
        out = exe.run(main, feed=feed, fetch_list=[p, r, n_i, n_l, n_c])
        ev.update(out[2], out[3], out[4])
        want = counts(inf, lab, scheme)
        assert [int(v[0]) for v in out[2:]] == list(want)
        total += want
    assert_native(exe)  # top_k ran as native code
    assert "reference" in _step_kinds(exe)["chunk_eval"]
    wi, wl, wc = total
    prec, rec, f1 = ev.eval()
    assert (prec, rec) == (pytest.approx(wc / wi), pytest.approx(wc / wl))
    assert f1 == pytest.approx(2 * wc / (wi + wl))


def test_bad_input_gets_a_clear_error():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        i = fluid.layers.data(name="i", shape=[1], dtype="int64", lod_level=1)
        lab = fluid.layers.data(name="l", shape=[1], dtype="int64", lod_level=1)
        with pytest.raises(TypeError, match=r"chunk_eval: argument 'input' must have dtype "
                                            r"int64, got int32"):
            fluid.layers.chunk_eval(fluid.layers.cast(i, "int32"), lab, "IOB", 2)
        with pytest.raises(ValueError, match=r"chunk_scheme must be one of .*'IOBES'.*got "
                                             r"'BIO'"):
            fluid.layers.chunk_eval(i, lab, "BIO", 2)
        with pytest.raises(ValueError, match="num_chunk_types must be an int >= 0, got -1"):
            fluid.layers.chunk_eval(i, lab, "IOB", -1)
        a, b = fluid.data("a", [-1, 5], "int64"), fluid.data("b", [-1, 4], "int64")
        n = fluid.data("n", [-1], "int64")
        with pytest.raises(fluid.OpShapeError, match=r"chunk_eval.*same shape, got \[-1, 5\] "
                                                     r"\(Inference\) and \[-1, 4\] \(Label\)"):
            fluid.layers.chunk_eval(a, b, "IOB", 2, seq_length=n)
        with pytest.raises(TypeError, match=r"chunk_eval: argument 'seq_length' must have "
                                            r"dtype int64, got int32"):
            fluid.layers.chunk_eval(a, a, "IOB", 2, seq_length=fluid.data("n32", [-1], "int32"))
        outs = fluid.layers.chunk_eval(i, lab, "IOB", 2)
        pad = fluid.layers.chunk_eval(a, a, "IOB", 2, seq_length=n)
        nolen = fluid.layers.chunk_eval(a, a, "IOB", 2)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    good = _lod([[0, 1], [4]])
    with pytest.raises(fluid.OpRunError, match=r"chunk_eval.*Label holds tag 5, which is not a "
                                               r"tag of the IOB scheme with 2 chunk types: "
                                               r"expected 0\.\.4"):
        exe.run(main, feed={"i": good, "l": _lod([[0, 5], [4]])}, fetch_list=[outs[0]])
    with pytest.raises(fluid.OpRunError, match=r"chunk_eval.*Inference holds tag -1"):
        exe.run(main, feed={"i": _lod([[0, -1], [4]]), "l": good}, fetch_list=[outs[0]])
    with pytest.raises(fluid.OpRunError, match=r"chunk_eval.*same LoD"):
        exe.run(main, feed={"i": _lod([[0], [1, 4]]), "l": good}, fetch_list=[outs[0]])
    x = np.zeros((2, 5), np.int64)
    with pytest.raises(fluid.OpRunError, match=r"chunk_eval.*SeqLength\[1\] = 6 is not a "
                                               r"length within the padded width 5"):
        exe.run(main, feed={"a": x, "n": np.array([5, 6])}, fetch_list=[pad[0]])
    with pytest.raises(fluid.OpRunError, match=r"chunk_eval.*SeqLength holds 3 lengths for 2 "
                                               r"rows"):
        exe.run(main, feed={"a": x, "n": np.array([1, 1, 1])}, fetch_list=[pad[0]])
    with pytest.raises(fluid.OpRunError, match=r"chunk_eval.*Label has no LoD: give SeqLength"):
        exe.run(main, feed={"a": x}, fetch_list=[nolen[0]])
