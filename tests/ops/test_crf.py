"""linear_chain_crf (and its gradient) and crf_decoding, Fluid 1.8's ops.

Oracles written here: the CRF's log-partition by brute force over every tag path (tiny sizes),
cross-checked with a log-space forward algorithm; the decoder by brute force too (the path of
the highest score, the lowest tags on ties); gradients by central differences of the NumPy
negative log-likelihood. Both executor modes are compared with them and the compiled one must
run the ops natively (strict mode, no reference step). LoD tensors (with an empty sequence)
and the padded ``Length`` form, float64 and float32.
"""
import itertools
import json
import pathlib

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import compiler, nnlib
from pdjit.framework.errors import PdjitError
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_grad
from pdjit.testing.op_test import assert_native

LOD = [[0, 3, 3, 4, 6]]  # lengths 3, 0, 1, 2
D = 3


# ---- NumPy oracles ---------------------------------------------------------------------------
def path_score(x, w, tags):
    s = w[0, tags[0]] + w[1, tags[-1]] + sum(x[k, t] for k, t in enumerate(tags))
    return s + sum(w[2 + a, b] for a, b in zip(tags, tags[1:]))


def brute_logz(x, w):
    scores = [path_score(x, w, p) for p in itertools.product(range(x.shape[1]),
                                                            repeat=x.shape[0])]
    m = max(scores)
    return m + np.log(np.sum(np.exp(np.array(scores) - m)))


def forward_logz(x, w):
    """The forward algorithm in log space (a second, independent oracle)."""
    a = w[0] + x[0]
    for k in range(1, x.shape[0]):
        t = a[:, None] + w[2:]
        m = t.max(axis=0)
        a = m + np.log(np.exp(t - m).sum(axis=0)) + x[k]
    t = a + w[1]
    return t.max() + np.log(np.exp(t - t.max()).sum())


def np_nll(x, w, labels, spans):
    out = np.zeros((len(spans), 1))
    for i, (b, e) in enumerate(spans):
        if e > b:
            out[i, 0] = brute_logz(x[b:e], w) - path_score(x[b:e], w, list(labels[b:e]))
    return out


def brute_viterbi(x, w):
    paths = list(itertools.product(range(x.shape[1]), repeat=x.shape[0]))
    scores = [path_score(x, w, p) for p in paths]
    return list(paths[int(np.argmax(scores))])  # the first in lexicographic order on ties


def spans_of(offs):
    return list(zip(offs[:-1], offs[1:]))


def numeric(f, x, delta=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[i] += delta
        lo[i] -= delta
        g[i] = (f(hi) - f(lo)) / (2 * delta)
    return g


# ---- running one op ------------------------------------------------------------------------------
def run(op_type, inputs, fetch, mode, wrt=(), weights=None):
    prog, feed, outs = build_op_program(op_type, inputs, {})
    block = prog.global_block()
    fetch_vars = [outs[s][0] for s in fetch]
    if wrt:
        v = block.create_var(name="w_seed", shape=list(weights.shape), dtype=weights.dtype)
        feed["w_seed"] = weights
        fetch_vars += gradients([outs["LogLikelihood"][0]],
                                [block.var(f"{s.lower()}_0") for s in wrt], [v])
    exe = Executor(mode=mode, strict=True)
    got = exe.run(prog, feed=feed, fetch_list=fetch_vars, scope=Scope(), return_numpy=False)
    if mode == "compiled":
        want = {op_type} | ({op_type + "_grad"} if wrt else set())
        assert want <= native_ops(exe), f"not native: {want - native_ops(exe)}"
    return got


def native_ops(exe) -> set:
    """The op types ``exe``'s plans ran in native steps (none of which fell back)."""
    assert_native(exe)
    return {op.type for _, plan in exe._plans.values() for step in plan.walk()
            if step.kind.startswith("native") for op, _ in step.ops}


def case(seed, rows, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (rows, D)).astype(dtype)
    w = rng.uniform(-1, 1, (D + 2, D)).astype(dtype)
    lab = rng.integers(0, D, (rows, 1)).astype(np.int64)
    return x, w, lab


def test_oracles_agree():
    x, w, _ = case(0, 4)
    assert abs(brute_logz(x, w) - forward_logz(x, w)) < 1e-12


@pytest.mark.parametrize("mode", ["reference", "compiled"])
def test_linear_chain_crf_lod_forward_and_gradients(mode):
    x, w, lab = case(1, LOD[0][-1])
    spans = spans_of(LOD[0])
    want = np_nll(x, w, lab.reshape(-1), spans)
    seed = np.array([[0.5], [1.5], [-1.0], [2.0]])
    got = run("linear_chain_crf", {"Emission": (x, LOD), "Transition": w, "Label": (lab, LOD)},
              ["LogLikelihood", "Alpha", "EmissionExps", "TransitionExps"], mode,
              wrt=("Emission", "Transition"), weights=seed)
    nll, alpha, eexp, wexp, dx, dw = (np.asarray(g) for g in got)
    np.testing.assert_allclose(nll, want, rtol=1e-10, atol=1e-12)
    assert nll[1, 0] == 0.0  # the empty sequence
    # the intermediates as Fluid defines them
    np.testing.assert_allclose(eexp, np.exp(x - x.max(axis=1, keepdims=True)), rtol=1e-12)
    np.testing.assert_allclose(wexp, np.exp(w), rtol=1e-12)
    np.testing.assert_allclose(alpha.sum(axis=1), 1.0, rtol=1e-12)

    def loss_x(xv):
        return float(np.sum(np_nll(xv, w, lab.reshape(-1), spans) * seed))

    def loss_w(wv):
        return float(np.sum(np_nll(x, wv, lab.reshape(-1), spans) * seed))

    np.testing.assert_allclose(dx, numeric(loss_x, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dw, numeric(loss_w, w), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", ["reference", "compiled"])
def test_linear_chain_crf_padded_length(mode):
    """The padded form: Emission [B, S, D], Label [B, S], Length [B]; padding is ignored and
    gets zero gradients."""
    B, S = 3, 3
    lens = np.array([2, 3, 0], np.int64)
    x, w, lab = case(2, B * S)
    x3, lab2 = x.reshape(B, S, D), lab.reshape(B, S)
    spans = [(i * S, i * S + n) for i, n in enumerate(lens)]
    want = np_nll(x, w, lab.reshape(-1), spans)
    seed = np.array([[1.0], [0.5], [3.0]])
    got = run("linear_chain_crf", {"Emission": x3, "Transition": w, "Label": lab2,
                                   "Length": lens}, ["LogLikelihood", "Alpha"], mode,
              wrt=("Emission", "Transition"), weights=seed)
    nll, alpha, dx, dw = (np.asarray(g) for g in got)
    np.testing.assert_allclose(nll, want, rtol=1e-10, atol=1e-12)
    assert alpha.shape == (B, S, D) and not alpha[0, 2].any() and not alpha[2].any()

    def loss(xv, wv):
        return float(np.sum(np_nll(xv.reshape(-1, D), wv, lab.reshape(-1), spans) * seed))

    np.testing.assert_allclose(dx, numeric(lambda v: loss(v, w), x3), rtol=1e-6, atol=1e-8)
    assert not dx[0, 2].any() and not dx[2].any()
    np.testing.assert_allclose(dw, numeric(lambda v: loss(x3, v), w), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", ["reference", "compiled"])
def test_crf_decoding_lod_and_padded(mode):
    rng = np.random.default_rng(3)
    offs = [0, 4, 4, 5, 8]
    x = rng.normal(size=(8, D))
    w = rng.normal(size=(D + 2, D))
    want = np.zeros(8, np.int64)
    for b, e in spans_of(offs):
        if e > b:
            want[b:e] = brute_viterbi(x[b:e], w)
    lab = want.copy()
    lab[[0, 5]] = (lab[[0, 5]] + 1) % D  # two wrong labels
    got = run("crf_decoding", {"Emission": (x, [offs]), "Transition": w}, ["ViterbiPath"], mode)
    path = got[0]
    assert path.lod() == [offs]
    np.testing.assert_array_equal(np.asarray(path), want.reshape(-1, 1))
    got = run("crf_decoding", {"Emission": (x, [offs]), "Transition": w,
                               "Label": (lab.reshape(-1, 1), [offs])}, ["ViterbiPath"], mode)
    np.testing.assert_array_equal(np.asarray(got[0]).reshape(-1), (lab == want).astype(int))
    # padded: [B, S, D] with lengths; padding decodes to 0
    B, S = 2, 4
    lens = np.array([3, 1], np.int64)
    x3 = rng.normal(size=(B, S, D))
    want3 = np.zeros((B, S), np.int64)
    for i, n in enumerate(lens):
        want3[i, :n] = brute_viterbi(x3[i, :n], w)
    got = run("crf_decoding", {"Emission": x3, "Transition": w, "Length": lens},
              ["ViterbiPath"], mode)
    np.testing.assert_array_equal(np.asarray(got[0]), want3)
    lab3 = want3.copy()
    lab3[0, 1] = (lab3[0, 1] + 1) % D
    lab3[1, 3] = 2  # padding: 0 whatever the label
    got = run("crf_decoding", {"Emission": x3, "Transition": w, "Label": lab3, "Length": lens},
              ["ViterbiPath"], mode)
    mask = np.arange(S)[None, :] < lens[:, None]
    np.testing.assert_array_equal(np.asarray(got[0]), ((lab3 == want3) & mask).astype(int))


def test_ties_decode_to_the_lowest_tags():
    x = np.zeros((3, D))
    w = np.zeros((D + 2, D))
    for mode in ("reference", "compiled"):
        got = run("crf_decoding", {"Emission": (x, [[0, 3]]), "Transition": w},
                  ["ViterbiPath"], mode)
        np.testing.assert_array_equal(np.asarray(got[0]).reshape(-1), [0, 0, 0])


def test_float32_native():
    x, w, lab = case(4, 6, np.float32)
    spans = spans_of(LOD[0])
    want = np_nll(x.astype(np.float64), w.astype(np.float64), lab.reshape(-1), spans)
    got = run("linear_chain_crf", {"Emission": (x, LOD), "Transition": w, "Label": (lab, LOD)},
              ["LogLikelihood"], "compiled", wrt=("Emission",), weights=np.ones((4, 1),
                                                                               np.float32))
    assert np.asarray(got[0]).dtype == np.float32
    np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-5, atol=1e-5)
    # int32 labels are taken too
    got32 = run("linear_chain_crf", {"Emission": (x, LOD), "Transition": w,
                                     "Label": (lab.astype(np.int32), LOD)}, ["LogLikelihood"],
                "compiled")
    np.testing.assert_array_equal(np.asarray(got32[0]), np.asarray(got[0]))
    # the compile jobs a new plan predicts for the kernels are the signatures the calls used
    for name in ("crf_nll", "crf_nll_grad"):
        for fn, types in nnlib.JOBS[name](np.dtype(np.float32)):
            assert tuple(compiler._numba_type(t) for t in types) in fn.overloads, name


def test_check_grad_through_the_kit():
    x, w, lab = case(5, 3)
    check_grad("linear_chain_crf", {"Emission": (x, [[0, 2, 3]]), "Transition": w,
                                    "Label": (lab, [[0, 2, 3]])},
               inputs_to_check=("Emission", "Transition"), output_name="LogLikelihood",
               modes=["reference"])


def test_bad_inputs_are_named():
    x, w, lab = case(6, 3)
    bad = lab.copy()
    bad[1, 0] = D
    for mode in ("reference", "compiled"):
        with pytest.raises(PdjitError, match="label 3 is out of range"):
            run("linear_chain_crf", {"Emission": (x, [[0, 3]]), "Transition": w,
                                     "Label": (bad, [[0, 3]])}, ["LogLikelihood"], mode)
    with pytest.raises(PdjitError, match=r"Transition of shape \[4, 3\]: expected \[D \+ 2"):
        run("linear_chain_crf", {"Emission": (x, [[0, 3]]), "Transition": w[1:],
                                 "Label": (lab, [[0, 3]])}, ["LogLikelihood"], "reference")
    with pytest.raises(PdjitError, match="must be a LoD tensor"):
        run("crf_decoding", {"Emission": x, "Transition": w}, ["ViterbiPath"], "reference")


# ---- a semantic-role-labelling program, as the Fluid 1.x book chapter writes it --------------
@pytest.mark.filterwarnings("ignore::pdjit.framework.errors.ReferenceStepWarning")
def test_srl_style_program_trains_and_decodes():
    """embedding -> fc -> linear_chain_crf, SGD on the mean cost; crf_decoding shares the
    transition by its ParamAttr name and feeds chunk_eval. Synthetic data: a word's tag is its
    id modulo the tag count, so the CRF can learn it; the cost falls and decoding gets it."""
    word_dict_len, label_dict_len, emb_dim, hidden = 12, 5, 8, 16
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 7
    with fluid.program_guard(main, startup):
        word = fluid.layers.data(name="word_data", shape=[1], dtype="int64", lod_level=1)
        target = fluid.layers.data(name="target", shape=[1], dtype="int64", lod_level=1)
        emb = fluid.layers.embedding(input=word, size=[word_dict_len, emb_dim],
                                     param_attr=fluid.ParamAttr(name="emb"))
        hidden_0 = fluid.layers.fc(input=emb, size=hidden, act="tanh")
        feature_out = fluid.layers.fc(input=hidden_0, size=label_dict_len)
        crf_cost = fluid.layers.linear_chain_crf(
            input=feature_out, label=target,
            param_attr=fluid.ParamAttr(name="crfw", learning_rate=1.0))
        avg_cost = fluid.layers.mean(crf_cost)
        sgd_optimizer = fluid.optimizer.SGD(learning_rate=0.05)
        sgd_optimizer.minimize(avg_cost)
        crf_decode = fluid.layers.crf_decoding(input=feature_out,
                                               param_attr=fluid.ParamAttr(name="crfw"))
        (precision, recall, f1_score, num_infer_chunks, num_label_chunks,
         num_correct_chunks) = fluid.layers.chunk_eval(
            input=crf_decode, label=target, chunk_scheme="IOB",
            num_chunk_types=int(np.ceil((label_dict_len - 1) / 2.0)))
    assert [op.type for op in main.global_block().ops].count("linear_chain_crf_grad") == 1
    place = fluid.CPUPlace()
    exe = fluid.Executor(place)
    exe.run(startup)
    rng = np.random.default_rng(0)

    def batch():
        lens = [int(n) for n in rng.integers(2, 6, 4)]
        words = rng.integers(0, word_dict_len, sum(lens)).reshape(-1, 1)
        return {"word_data": fluid.create_lod_tensor(words, [lens], place),
                "target": fluid.create_lod_tensor(words % label_dict_len, [lens], place)}

    costs = []
    for _ in range(40):
        cost, = exe.run(main, feed=batch(), fetch_list=[avg_cost])
        costs.append(float(np.asarray(cost).reshape(-1)[0]))
    assert all(np.isfinite(costs))
    assert np.mean(costs[-5:]) < 0.5 * np.mean(costs[:5]), costs
    feed = batch()
    path, f1 = exe.run(main.clone(for_test=True), feed=feed, fetch_list=[crf_decode, f1_score])
    words = np.asarray(feed["word_data"]).reshape(-1)
    np.testing.assert_array_equal(np.asarray(path).reshape(-1), words % label_dict_len)
    assert float(np.asarray(f1).reshape(-1)[0]) == 1.0
    assert {"linear_chain_crf", "linear_chain_crf_grad", "crf_decoding"} <= native_ops(exe)


# ---- PaddlePaddle 3.3.1's crf_decoding --------------------------------------------------------
FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "paddle" / "crf"
PADDLE_CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", PADDLE_CASES, ids=[c["name"] for c in PADDLE_CASES])
def test_paddle_parity(case):
    """The paths Paddle 3.3.1's crf_decoding decoded (``make_crf_fixtures.py``; Paddle no
    longer registers linear_chain_crf), LoD and padded, with and without labels."""
    data = np.load(FIXTURES / f"{case['name']}.npz")
    inputs = {s: data[f"in_{s}"] for s in case["inputs"]}
    if case["lod"]:
        for s in ("Emission", "Label"):
            if s in inputs:
                inputs[s] = (inputs[s], case["lod"])
    for mode in ("reference", "compiled"):
        got = run(case["op"], inputs, ["ViterbiPath"], mode)
        np.testing.assert_array_equal(np.asarray(got[0]), data["out_ViterbiPath"],
                                      err_msg=f"{case['name']} [{mode}]")


def test_padded_program_with_length_trains():
    """Fluid 1.8's padded form as its documentation writes it: fc with num_flatten_dims=2,
    linear_chain_crf and crf_decoding with ``length``; the cost falls and the decoded tags
    (zeros past each length) learn the labels."""
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 3
    B, S, F, tags = 4, 5, 6, 3
    with fluid.program_guard(main, startup):
        input_data2 = fluid.data(name="input_data2", shape=[-1, S, F], dtype="float32")
        label2 = fluid.data(name="label2", shape=[-1, S, 1], dtype="int64")
        label_length = fluid.data(name="length", shape=[-1, 1], dtype="int64")
        emission2 = fluid.layers.fc(input=input_data2, size=tags, num_flatten_dims=2)
        crf_cost2 = fluid.layers.linear_chain_crf(
            input=emission2, label=label2, length=label_length,
            param_attr=fluid.ParamAttr(name="crfw_pad", learning_rate=1.0))
        avg_cost = fluid.layers.mean(crf_cost2)
        fluid.optimizer.SGD(learning_rate=0.1).minimize(avg_cost)
        crf_decode2 = fluid.layers.crf_decoding(input=emission2, length=label_length,
                                                param_attr=fluid.ParamAttr(name="crfw_pad"))
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(1)
    lens = np.array([[5], [3], [1], [4]], np.int64)
    mask = np.arange(S)[None, :] < lens
    feats = rng.normal(size=(B, S, F)).astype(np.float32)
    labels = np.argmax(feats[:, :, :tags], axis=2) * mask  # the largest of the first 3
    feed = {"input_data2": feats, "label2": labels[:, :, None], "length": lens}
    costs = []
    for _ in range(60):
        cost, path = exe.run(main, feed=feed, fetch_list=[avg_cost, crf_decode2])
        costs.append(float(np.asarray(cost).reshape(-1)[0]))
    assert costs[-1] < 0.3 * costs[0], costs
    assert np.asarray(path).shape == (B, S)
    np.testing.assert_array_equal(np.asarray(path), labels)
    assert {"linear_chain_crf", "linear_chain_crf_grad", "crf_decoding"} <= native_ops(exe)
