"""Sequence ops against NumPy computed here over explicit Python lists of sequences.

Each test cuts its inputs into per-sequence arrays (``_seqs``), computes the expected result
sequence by sequence, and checks data *and* output LoD with ``check_output`` in every executor
mode. LoDs are drawn by Hypothesis (``strategies.lods``) and include empty sequences.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pdjit as fluid
from pdjit.framework.errors import OpRunError
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing import TARGETS, check_output, run_op
from pdjit.testing import strategies as S

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(lod_reset|sequence_mask|sequence_unpad)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

POOLTYPES = ["AVERAGE", "SUM", "SQRT", "MAX", "LAST", "FIRST"]
VARTYPE = {"bool": 0, "int32": 2, "int64": 3, "float32": 5, "float64": 6}


def _seqs(x, offsets):
    """The sequences of ``x`` cut at ``offsets``, as a Python list of arrays."""
    return [x[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def _offs(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return out


def _data(seed, shape, dtype="float64"):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.uniform(-2, 2, size=shape).astype(dtype)


seeds = st.integers(0, 2 ** 31 - 1)


# ---- sequence_pool -----------------------------------------------------------------------
def _pool_one(seq, pooltype, pad_value, first_row):
    """(pooled row, MaxIndex row) of one sequence, computed element by element."""
    width = seq.shape[1:]
    if len(seq) == 0:
        return np.full(width, pad_value), np.full(width, -1)
    if pooltype == "AVERAGE":
        return seq.astype(np.float64).sum(0) / len(seq), np.full(width, -1)
    if pooltype == "SUM":
        return seq.astype(np.float64).sum(0), np.full(width, -1)
    if pooltype == "SQRT":
        return seq.astype(np.float64).sum(0) / math.sqrt(len(seq)), np.full(width, -1)
    if pooltype == "LAST":
        return seq[-1], np.full(width, -1)
    if pooltype == "FIRST":
        return seq[0], np.full(width, -1)
    flat = seq.reshape(len(seq), -1)
    best, idx = flat[0].copy(), np.zeros(flat.shape[1], int)
    for r in range(1, len(seq)):
        for c in range(flat.shape[1]):
            if flat[r, c] > best[c]:
                best[c], idx[c] = flat[r, c], r
    return best.reshape(width), (idx + first_row).reshape(width)


# (dtype, feature shape, pad_value): every dtype, row rank (1-D X, rows, 2-D rows) and pad
# (the default and another) once; each triple compiles its own kernels (pad_value is a
# constant of the code), so the cross product would compile twice as many for no other path
POOL_VARIANTS = [("float32", (3,), -1.5), ("float64", (2, 2), 0.0), ("float64", (), -1.5)]


@pytest.mark.parametrize("pooltype", POOLTYPES)
@given(lod=S.lods(levels=1, max_seqs=5), seed=seeds, variant=st.sampled_from(POOL_VARIANTS))
def test_sequence_pool(pooltype, lod, seed, variant):
    dtype, feat, pad = variant
    offs = lod[-1]
    x = _data(seed, (offs[-1],) + feat, dtype)
    rows = [_pool_one(s, pooltype, pad, offs[i]) for i, s in enumerate(_seqs(x, offs))]
    want = np.array([r[0] for r in rows], dtype=dtype).reshape((len(rows),) + feat)
    index = np.array([r[1] for r in rows], dtype=np.int32).reshape(want.shape)
    expected = {"Out": (want, [])}
    if pooltype == "MAX":
        expected["MaxIndex"] = index
    check_output("sequence_pool", {"X": (x, lod)},
                 {"pooltype": pooltype, "pad_value": pad}, expected, batch_unknown=True)


@pytest.mark.parametrize("pooltype", ["SUM", "MAX", "FIRST"])
@given(lod=S.lods(levels=2, max_seqs=6), seed=seeds)
def test_sequence_pool_two_levels_keeps_the_upper_level(pooltype, lod, seed):
    offs = lod[-1]
    x = _data(seed, (offs[-1], 2))
    want = np.array([_pool_one(s, pooltype, 0.0, offs[i])[0]
                     for i, s in enumerate(_seqs(x, offs))]).reshape(-1, 2)
    check_output("sequence_pool", {"X": (x, lod)}, {"pooltype": pooltype},
                 {"Out": (want, lod[:-1])})


def test_sequence_pool_known_values():
    x = np.array([[1.0], [3.0], [2.0], [5.0], [4.0]])
    lod = [[0, 2, 2, 5]]
    cases = {"AVERAGE": [2.0, 7.0, 11 / 3], "SUM": [4.0, 7.0, 11.0],
             "SQRT": [4 / math.sqrt(2), 7.0, 11 / math.sqrt(3)], "MAX": [3.0, 7.0, 5.0],
             "LAST": [3.0, 7.0, 4.0], "FIRST": [1.0, 7.0, 2.0]}
    for pooltype, want in cases.items():
        got = check_output("sequence_pool", {"X": (x, lod)},
                           {"pooltype": pooltype, "pad_value": 7.0},
                           {"Out": np.array(want).reshape(3, 1)})
        if pooltype == "MAX":
            np.testing.assert_array_equal(got["MaxIndex"].ravel(), [1, -1, 3])


# ---- sequence_softmax --------------------------------------------------------------------
@given(lod=S.lods(levels=1, max_seqs=5), seed=seeds,
       column=st.booleans())
def test_sequence_softmax(lod, seed, column):
    offs = lod[-1]
    x = _data(seed, (offs[-1], 1) if column else (offs[-1],))
    parts = []
    for s in _seqs(x.reshape(-1), offs):
        e = np.exp(s - (s.max() if len(s) else 0.0))
        parts.append(e / e.sum())
    want = np.concatenate(parts + [np.zeros(0)]).reshape(x.shape)
    check_output("sequence_softmax", {"X": (x, lod)}, {}, {"Out": (want, lod)},
                 batch_unknown=True)


# ---- sequence_expand / sequence_expand_as ------------------------------------------------
@given(data=st.data(), seed=seeds, x_has_lod=st.booleans(), y_levels=st.integers(1, 2),
       dtype=st.sampled_from(["float64", "int64"]))
def test_sequence_expand(data, seed, x_has_lod, y_levels, dtype):
    y_lod = data.draw(S.lods(levels=y_levels, max_seqs=4))
    ref_level = data.draw(st.sampled_from([-1] + list(range(y_levels))))
    ref = y_lod[ref_level]
    n = len(ref) - 1
    y = _data(seed + 1, (y_lod[-1][-1], 1))
    if x_has_lod:
        x_lod = data.draw(S.lods(levels=1, min_seqs=n, max_seqs=n))
        x = _data(seed, (x_lod[0][-1], 2), dtype)
        units = _seqs(x, x_lod[0])
    else:
        x_lod = []
        x = _data(seed, (n, 2), dtype)
        units = [x[i:i + 1] for i in range(n)]
    out_parts, out_lens = [], []
    for i in range(n):
        for _ in range(ref[i + 1] - ref[i]):
            out_parts.append(units[i])
            out_lens.append(len(units[i]))
    want = np.concatenate(out_parts + [np.zeros((0, 2), dtype)]).astype(dtype)
    want_lod = [_offs(out_lens)] if x_has_lod else []
    check_output("sequence_expand", {"X": (x, x_lod), "Y": (y, y_lod)},
                 {"ref_level": ref_level}, {"Out": (want, want_lod)})


@given(lod=S.lods(levels=1, max_seqs=5), seed=seeds, feat=st.sampled_from([(3,), ()]))
def test_sequence_expand_as(lod, seed, feat):
    offs = lod[0]
    n = len(offs) - 1
    x = _data(seed, (n,) + feat)
    y = _data(seed + 1, (offs[-1], 1))
    parts = [np.stack([x[i]] * (offs[i + 1] - offs[i])) if offs[i + 1] > offs[i]
             else np.zeros((0,) + feat) for i in range(n)]
    want = np.concatenate(parts)
    check_output("sequence_expand_as", {"X": x, "Y": (y, lod)}, {}, {"Out": (want, lod)})


# ---- sequence_concat ---------------------------------------------------------------------
@given(data=st.data(), seed=seeds, k=st.integers(1, 3))
def test_sequence_concat(data, seed, k):
    n = data.draw(st.integers(1, 4))
    lods = [data.draw(S.lods(levels=1, min_seqs=n, max_seqs=n)) for _ in range(k)]
    xs = [_data(seed + j, (lod[0][-1], 2)) for j, lod in enumerate(lods)]
    parts, lens = [], []
    for i in range(n):
        for x, lod in zip(xs, lods):
            parts.append(_seqs(x, lod[0])[i])
        lens.append(sum(lod[0][i + 1] - lod[0][i] for lod in lods))
    want = np.concatenate(parts)
    check_output("sequence_concat", {"X": [(x, lod) for x, lod in zip(xs, lods)]}, {},
                 {"Out": (want, [_offs(lens)])})


# ---- sequence_pad / sequence_unpad -------------------------------------------------------
# (dtype, PadValue a whole time step, padded_length): each dtype, both PadValue shapes and
# both kinds of padded_length once (it is a constant of the code: every value compiles its own
# kernels); sequences are at most 4 long, so 4 is often exactly the longest and 6 never is
PAD_VARIANTS = [("float64", False, -1), ("int64", True, 4), ("float64", True, 6)]


@given(lod=S.lods(levels=1, max_seqs=5, max_len=4), seed=seeds,
       variant=st.sampled_from(PAD_VARIANTS))
def test_sequence_pad(lod, seed, variant):
    dtype, step_pad, padded = variant
    offs = lod[0]
    x = _data(seed, (offs[-1], 3), dtype)
    pad = _data(seed + 1, (3,) if step_pad else (1,), dtype)
    seqs = _seqs(x, offs)
    longest = max(len(s) for s in seqs)
    width = longest if padded == -1 else padded
    want = np.zeros((len(seqs), width, 3), dtype)
    for i, s in enumerate(seqs):
        for t in range(width):
            want[i, t] = s[t] if t < len(s) else pad
    lengths = np.array([len(s) for s in seqs], np.int64)
    check_output("sequence_pad", {"X": (x, lod), "PadValue": pad},
                 {"padded_length": padded},
                 {"Out": (want, []), "Length": (lengths, [])}, batch_unknown={"X"})


@given(data=st.data(), seed=seeds, feat=st.sampled_from([(2,), ()]))
def test_sequence_unpad(data, seed, feat):
    n = data.draw(st.integers(1, 4))
    width = data.draw(st.integers(1, 4))
    lengths = data.draw(st.lists(st.integers(0, width), min_size=n, max_size=n))
    x = _data(seed, (n, width) + feat)
    want = np.concatenate([x[i, :lengths[i]] for i in range(n)])
    check_output("sequence_unpad", {"X": x, "Length": np.array(lengths, np.int64)}, {},
                 {"Out": (want, [_offs(lengths)])})


# ---- sequence_mask -----------------------------------------------------------------------
@given(seed=seeds, shape=st.sampled_from([(4,), (2, 3)]),
       how=st.sampled_from(["attr", "max", "tensor"]),
       dtype=st.sampled_from(["int64", "float32", "bool", "int32"]),
       xdtype=st.sampled_from(["int64", "int32"]))
def test_sequence_mask(seed, shape, how, dtype, xdtype):
    x = np.random.default_rng(seed).integers(0, 6, size=shape).astype(xdtype)
    maxlen = {"attr": 4, "max": int(x.max()), "tensor": 3}[how]
    want = np.zeros(shape + (maxlen,), dtype)
    for idx in np.ndindex(*shape):
        for j in range(maxlen):
            want[idx + (j,)] = j < x[idx]
    inputs = {"X": x}
    attrs = {"out_dtype": VARTYPE[dtype]}
    if how == "attr":
        attrs["maxlen"] = maxlen
    elif how == "tensor":
        inputs["MaxLenTensor"] = np.array([maxlen], np.int32)
    check_output("sequence_mask", inputs, attrs, {"Y": want})


# ---- sequence_reverse --------------------------------------------------------------------
@given(lod=S.lods(levels=1, max_seqs=5),
       seed=seeds, dtype=st.sampled_from(["float32", "int64"]))
def test_sequence_reverse(lod, seed, dtype):
    x = _data(seed, (lod[-1][-1], 2), dtype)
    want = np.concatenate([s[::-1] for s in _seqs(x, lod[-1])] + [np.zeros((0, 2), dtype)])
    check_output("sequence_reverse", {"X": (x, lod)}, {}, {"Y": (want.astype(dtype), lod)})


@given(lod=S.lods(levels=2, max_seqs=5), seed=seeds)
def test_sequence_reverse_two_levels_reverses_the_last(lod, seed):
    x = _data(seed, (lod[-1][-1], 1))
    want = np.concatenate([s[::-1] for s in _seqs(x, lod[-1])] + [np.zeros((0, 1))])
    check_output("sequence_reverse", {"X": (x, lod)}, {}, {"Y": (want, lod)})


# ---- lod_reset ---------------------------------------------------------------------------
@given(data=st.data(), seed=seeds, how=st.sampled_from(["attr", "y_lod", "y_data"]),
       x_has_lod=st.booleans())
def test_lod_reset(data, seed, how, x_has_lod):
    rows = data.draw(st.integers(0, 6))
    new = data.draw(S.lods(rows=rows, max_seqs=4))
    x = _data(seed, (rows, 2))
    x_in = (x, data.draw(S.lods(rows=rows, max_seqs=3))) if x_has_lod else x
    if how == "attr":
        inputs, attrs, want_lod = {"X": x_in}, {"target_lod": new[0]}, new
    elif how == "y_lod":
        y_lod = data.draw(S.lods(rows=rows, max_seqs=4, levels=data.draw(st.integers(1, 2))))
        inputs, attrs, want_lod = {"X": x_in, "Y": (np.zeros((rows, 1)), y_lod)}, {}, y_lod
    else:
        inputs = {"X": x_in, "Y": np.array(new[0], np.int32)}
        attrs, want_lod = {}, new
    check_output("lod_reset", inputs, attrs, {"Out": (x, want_lod)})


def test_lod_reset_append_adds_a_level():
    # Fluid's lod_append: X's level now counts the sequences of the new level below it
    x = np.arange(5.0).reshape(5, 1)
    got = check_output("lod_reset", {"X": (x, [[0, 2, 5]])},
                       {"target_lod": [0, 1, 2, 3, 4, 5], "append": True},
                       {"Out": (x, [[0, 2, 5], [0, 1, 2, 3, 4, 5]])})
    assert got["Out"].shape == (5, 1)
    check_output("lod_reset", {"X": x}, {"target_lod": [0, 2, 5], "append": True},
                 {"Out": (x, [[0, 2, 5]])})
    with pytest.raises(OpRunError, match="append: X's LoD's last level ends at 5"):
        run_op("lod_reset", {"X": (x, [[0, 2, 5]])}, {"target_lod": [0, 2, 5], "append": True})


# ---- malformed input: errors name the op and say expected vs got ---------------------------
@pytest.mark.parametrize("mode", TARGETS)
@pytest.mark.parametrize("op,inputs,attrs,words", [
    ("sequence_pool", {"X": np.ones((3, 2))}, {}, ["must be a LoD tensor", "expected"]),
    ("sequence_softmax", {"X": np.ones((3, 1))}, {}, ["must be a LoD tensor"]),
    ("sequence_reverse", {"X": np.ones((3, 1))}, {}, ["must be a LoD tensor"]),
    ("sequence_expand", {"X": np.ones((3, 2)), "Y": (np.ones((4, 1)), [[0, 1, 4]])}, {},
     ["3 rows", "2 sequences", "expected"]),
    ("sequence_expand", {"X": (np.ones((3, 2)), [[0, 1, 3]]), "Y": (np.ones((4, 1)),
                                                                     [[0, 1, 2, 4]])}, {},
     ["2 sequences", "3", "expected equal counts"]),
    ("sequence_expand", {"X": np.ones((2, 2)), "Y": (np.ones((4, 1)), [[0, 1, 4]])},
     {"ref_level": 1}, ["ref_level=1", "expected -1 or 0..0"]),
    ("sequence_expand_as", {"X": np.ones((3, 2)), "Y": (np.ones((4, 1)), [[0, 1, 4]])}, {},
     ["3 rows", "2 sequences"]),
    ("sequence_concat", {"X": [(np.ones((3, 2)), [[0, 1, 3]]),
                               (np.ones((3, 2)), [[0, 1, 2, 3]])]}, {},
     ["same number of sequences"]),
    ("sequence_pad", {"X": (np.ones((5, 2)), [[0, 1, 5]]), "PadValue": np.zeros(1)},
     {"padded_length": 3}, ["padded_length=3", "longest sequence (4)", ">= 4"]),
    ("sequence_unpad", {"X": np.ones((2, 3, 1)), "Length": np.array([1, 4], np.int64)}, {},
     ["Length[1] = 4", "<= 3"]),
    ("sequence_unpad", {"X": np.ones((2, 3, 1)), "Length": np.array([1, 2, 3], np.int64)}, {},
     ["3 lengths", "2 padded sequences"]),
    ("lod_reset", {"X": np.ones((4, 1))}, {"target_lod": [0, 2, 3]},
     ["ends at 3", "rows of X, 4"]),
    ("lod_reset", {"X": np.ones((4, 1))}, {"target_lod": [0, 3, 2, 4]}, ["never decrease"]),
    ("lod_reset", {"X": np.ones((4, 1)), "Y": np.array([0, 1, 5], np.int32)}, {},
     ["ends at 5", "4"]),
])
def test_malformed_input_is_a_clear_error(mode, op, inputs, attrs, words):
    with pytest.raises(OpRunError) as info:
        run_op(op, inputs, attrs, mode)
    msg = str(info.value)
    assert f"op '{op}'" in msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_lod_reset_without_y_or_target_lod_fails_at_build_time():
    with pytest.raises(Exception, match="lod_reset needs input Y or a non-empty target_lod"):
        run_op("lod_reset", {"X": np.ones((2, 1))}, {})


def test_malformed_lod_is_refused_at_feed():
    with pytest.raises(ValueError, match="level 0"):
        LoDTensor(np.ones((3, 1)), [[0, 2, 1, 3]])
    with pytest.raises(ValueError, match="rows"):  # offsets past the rows: refused at feed
        run_op("sequence_pool", {"X": LoDTensor(np.ones((3, 1)), [[0, 2, 4]])}, {})


# ---- programs: LoD propagation through row-wise ops, layers ----------------------------------
def _run(main, startup, feed, fetch, mode):
    exe = fluid.Executor(fluid.CPUPlace(), mode=mode)
    scope = Scope()
    exe.run(startup, scope=scope)
    return exe.run(main, feed=feed, fetch_list=fetch, scope=scope, return_numpy=False), scope


@pytest.mark.parametrize("mode", TARGETS)
def test_lod_flows_through_fc_relu_into_sequence_pool(mode):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float64", lod_level=2)
        h = fluid.layers.fc(x, size=3, act=None)
        r = fluid.layers.relu(h)
        s = fluid.layers.scale(r, scale=2.0)
        pooled = fluid.layers.sequence_pool(s, "sum")
        top = fluid.layers.sequence_pool(pooled, "max")
    lod = [[0, 2, 4], [0, 1, 4, 4, 6]]
    xv = np.random.default_rng(0).uniform(-1, 1, (6, 4))
    (hv, rv, pv, tv), scope = _run(main, startup, {"x": LoDTensor(xv, lod)},
                                   [h, r, pooled, top], mode)
    for v in (hv, rv):
        assert isinstance(v, LoDTensor) and v.lod() == lod
    w = np.asarray(scope.find_var("fc_0.w_0").get_tensor())
    b = np.asarray(scope.find_var("fc_0.b_0").get_tensor())
    want_h = xv @ w + b
    np.testing.assert_allclose(np.asarray(hv), want_h, rtol=1e-12)
    relu2 = 2 * np.maximum(want_h, 0)
    want_p = np.array([seq.sum(0) if len(seq) else np.zeros(3)
                       for seq in _seqs(relu2, lod[1])])
    assert pv.lod() == [lod[0]]
    np.testing.assert_allclose(np.asarray(pv), want_p, rtol=1e-12)
    want_t = np.array([seq.max(0) for seq in _seqs(want_p, lod[0])])
    assert not isinstance(tv, LoDTensor) or tv.lod() == []
    np.testing.assert_allclose(np.asarray(tv), want_t, rtol=1e-12)


@pytest.mark.parametrize("mode", TARGETS)
def test_embedding_keeps_the_ids_lod(mode):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids = fluid.layers.data(name="ids", shape=[1], dtype="int64", lod_level=1)
        emb = fluid.layers.embedding(ids, size=[10, 4], dtype="float64")
        avg = fluid.layers.sequence_pool(emb, "average")
    lod = [[0, 3, 3, 5]]
    idv = np.array([[1], [4], [1], [9], [0]], np.int64)
    (ev, av), scope = _run(main, startup, {"ids": LoDTensor(idv, lod)}, [emb, avg], mode)
    table = np.asarray(scope.find_var("embedding_0.w_0").get_tensor())
    assert isinstance(ev, LoDTensor) and ev.lod() == lod
    np.testing.assert_allclose(np.asarray(ev), table[idv[:, 0]])  # lookup_table: [N, 4]
    want = np.array([table[[1, 4, 1]].mean(0), np.zeros(4), table[[9, 0]].mean(0)])
    np.testing.assert_allclose(np.asarray(av).reshape(3, 4), want, rtol=1e-12)


@pytest.mark.parametrize("mode", TARGETS)
def test_sequence_layers_in_a_program(mode):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[2], dtype="float64", lod_level=1)
        q = fluid.layers.data(name="q", shape=[2], dtype="float64")
        pad = fluid.layers.fill_constant([1], "float64", -9.0)
        padded, length = fluid.layers.sequence_pad(x, pad)
        back = fluid.layers.sequence_unpad(padded, length)
        rev = fluid.layers.sequence_reverse(back)
        first = fluid.layers.sequence_first_step(rev)
        last = fluid.layers.sequence_last_step(x)
        expanded = fluid.layers.sequence_expand_as(q, x)
        both = fluid.layers.sequence_concat([x, expanded])
        mask = fluid.layers.sequence_mask(length, dtype="float64")
        reset = fluid.layers.lod_reset(x, target_lod=[0, 4])
    assert padded.shape == (-1, -1, 2) and list(length.shape) == [-1]
    assert mask.dtype == np.float64 and x.lod_level == 1 and back.lod_level == 1
    lod = [[0, 1, 4]]
    xv = np.arange(8.0).reshape(4, 2)
    qv = np.array([[10.0, 11.0], [12.0, 13.0]])
    (pv, lv, bv, fv, la, ev, cv, mv, rv), _ = _run(
        main, startup, {"x": LoDTensor(xv, lod), "q": qv},
        [padded, length, back, first, last, expanded, both, mask, reset], mode)
    np.testing.assert_array_equal(np.asarray(pv), [[[0, 1], [-9, -9], [-9, -9]],
                                                   [[2, 3], [4, 5], [6, 7]]])
    np.testing.assert_array_equal(np.asarray(lv), [1, 3])
    assert bv.lod() == lod
    np.testing.assert_array_equal(np.asarray(bv), xv)
    np.testing.assert_array_equal(np.asarray(fv), [[0, 1], [6, 7]])
    np.testing.assert_array_equal(np.asarray(la), [[0, 1], [6, 7]])
    assert ev.lod() == lod
    np.testing.assert_array_equal(np.asarray(ev), [[10, 11], [12, 13], [12, 13], [12, 13]])
    assert cv.lod() == [[0, 2, 8]]
    np.testing.assert_array_equal(np.asarray(mv), [[1, 0, 0], [1, 1, 1]])
    assert rv.lod() == [[0, 4]]


def test_layers_refuse_bad_arguments(fresh_programs):
    x = fluid.layers.data(name="x", shape=[2], dtype="float64", lod_level=1)
    with pytest.raises(ValueError, match="pool_type"):
        fluid.layers.sequence_pool(x, "median")
    with pytest.raises(ValueError, match="y and target_lod"):
        fluid.layers.lod_reset(x)
    with pytest.raises(ValueError, match="maxlen"):
        fluid.layers.sequence_pad(x, x, maxlen=0)


def test_a_failed_run_leaves_the_scope_as_it_was():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[2], dtype="float64", lod_level=1)
        h = fluid.layers.fc(x, size=2)
        pooled = fluid.layers.sequence_pool(h, "sum")
    exe = fluid.Executor(fluid.CPUPlace(), mode="reference")
    scope = Scope()
    exe.run(startup, scope=scope)
    w = np.array(scope.find_var("fc_0.w_0").get_tensor(), copy=True)
    with pytest.raises(OpRunError, match="sequence_pool"):
        exe.run(main, feed={"x": np.ones((3, 2))}, fetch_list=[pooled], scope=scope)
    np.testing.assert_array_equal(np.asarray(scope.find_var("fc_0.w_0").get_tensor()), w)


# ---- PaddlePaddle's legacy ops as the oracle (when paddle is installed) ----------------------
_PADDLE_SCRIPT = r'''
import os, sys, pickle
os.environ["FLAGS_enable_pir_api"] = "0"
import numpy as np
import paddle
from paddle.base.layer_helper import LayerHelper
paddle.enable_static()
cases, results = pickle.load(open(sys.argv[1], "rb")), []
for op, inputs, attrs, outs in cases:
    main, startup = paddle.static.Program(), paddle.static.Program()
    feed = {}
    with paddle.static.program_guard(main, startup):
        ins = {}
        for k, (arr, lod) in inputs.items():
            ins[k] = [paddle.static.data(k.lower(), [-1] + list(arr.shape[1:]), str(arr.dtype),
                                         lod_level=len(lod))]
            t = paddle.base.core.LoDTensor()
            t.set(arr, paddle.CPUPlace())
            if lod:
                t.set_lod(lod)
            feed[k.lower()] = t
        o = {s: [main.global_block().create_var(name="o_" + s, dtype=dt)]
             for s, dt in outs.items()}
        if op == "sequence_pool" and "MaxIndex" not in o:
            o["MaxIndex"] = [main.global_block().create_var(name="o_mi", dtype="int32")]
        LayerHelper(op).append_op(type=op, inputs=ins, outputs=o, attrs=dict(attrs))
    res = paddle.static.Executor(paddle.CPUPlace()).run(
        main, feed=feed, fetch_list=[o[s][0] for s in outs], return_numpy=False)
    results.append({s: (np.array(r), [list(map(int, lv)) for lv in r.lod()])
                    for s, r in zip(outs, res)})
pickle.dump(results, open(sys.argv[2], "wb"))
'''


def _paddle_cases():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (5, 2)).astype("float32")
    col = x[:, :1].copy()
    y = rng.uniform(-1, 1, (5, 1)).astype("float32")
    lod1, lod2 = [[0, 2, 2, 5]], [[0, 1, 3], [0, 2, 2, 5]]
    cases = []
    for pt in POOLTYPES:
        for lod in (lod1, lod2):
            outs = {"Out": "float32", "MaxIndex": "int32"} if pt == "MAX" and lod is lod1 \
                else {"Out": "float32"}
            cases.append(("sequence_pool", {"X": (x, lod)}, {"pooltype": pt, "pad_value": 0.5},
                          outs))
    cases += [
        ("sequence_softmax", {"X": (col, lod1)}, {}, {"Out": "float32"}),
        ("sequence_expand", {"X": (x[:3].copy(), []), "Y": (y, lod1)}, {"ref_level": -1},
         {"Out": "float32"}),
        ("sequence_expand", {"X": (x[:3].copy(), [[0, 1, 1, 3]]), "Y": (y, lod1)},
         {"ref_level": -1}, {"Out": "float32"}),
        ("sequence_expand", {"X": (x[:3].copy(), [[0, 1, 3]]), "Y": (y, lod2)},
         {"ref_level": 0}, {"Out": "float32"}),
        ("sequence_mask", {"X": (np.array([[0, 3], [1, 2]], np.int64), [])},
         {"out_dtype": 3, "maxlen": -1}, {"Y": "int64"}),
        ("sequence_mask", {"X": (np.array([4, 1], np.int64), [])},
         {"out_dtype": 5, "maxlen": 6}, {"Y": "float32"}),
        ("lod_reset", {"X": (x, [])}, {"target_lod": [0, 4, 5]}, {"Out": "float32"}),
        ("lod_reset", {"X": (x, [[0, 5]]), "Y": (y, lod2)}, {}, {"Out": "float32"}),
        ("lod_reset", {"X": (x, []), "Y": (np.array([0, 2, 5], np.int32), [])}, {},
         {"Out": "float32"}),
        ("lod_reset", {"X": (x, [[0, 2, 5]])}, {"target_lod": [0, 1, 2, 3, 4, 5],
                                                 "append": True}, {"Out": "float32"}),
    ]
    return cases


def test_matches_paddle_legacy_ops(tmp_path):
    """The ops PaddlePaddle 3.3.1 still has, run by its legacy executor on the same inputs:
    same data and same output LoD (empty sequences, two-level LoDs, pad_value included)."""
    import importlib.util
    import pickle
    import subprocess
    import sys

    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    cases = _paddle_cases()
    (tmp_path / "in.pkl").write_bytes(pickle.dumps(cases))
    (tmp_path / "run.py").write_text(_PADDLE_SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "in.pkl"),
                           str(tmp_path / "out.pkl")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = pickle.loads((tmp_path / "out.pkl").read_bytes())
    for (op, inputs, attrs, outs), want in zip(cases, results):
        for mode in TARGETS:
            got = run_op(op, {k: (a, lod) for k, (a, lod) in inputs.items()}, attrs, mode,
                         return_lod=True)
            for slot in outs:
                where = f"{op} {attrs} {slot} [{mode}]"
                data, lod = want[slot]
                g = got[slot]
                assert (g.lod() if isinstance(g, LoDTensor) else []) == lod, where
                g = np.asarray(g)
                np.testing.assert_allclose(g, data.reshape(g.shape),
                                           rtol=1e-6, atol=1e-7, err_msg=where)
