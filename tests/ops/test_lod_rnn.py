"""lstm, gru and sequence_conv (Fluid 1.x's LoD ops) and their gradients.

The oracle is NumPy written here: each sequence walked row by row (from its end when reversed),
as Fluid documents the ops; gradients are central differences of that NumPy forward. Both
executor modes are compared with it, and the compiled one must run every op of the program
natively (``strict``, and no reference step). LoDs hold empty sequences at the start, the
middle and the end. ``check_grad`` (the test kit's finite differences through pdjit itself)
runs once per op on the smallest sizes; the PaddlePaddle parity cases are in
``test_lod_rnn_paddle`` below, against fixtures Paddle 3.3.1 wrote.
"""
import json
import pathlib

import numpy as np
import pytest

from pdjit.framework.errors import OpShapeError
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_grad
from pdjit.testing.op_test import assert_native

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "paddle" / "lod_rnn"
LODS = [[[0, 2, 2, 7, 8]], [[0, 0, 3, 4, 4]]]
H = 3


# ---- NumPy oracle ----------------------------------------------------------------------------
def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-np.clip(v, -40.0, 13.0)))  # Paddle clamps sigmoid's input


ACT = {"sigmoid": sigmoid, "tanh": np.tanh, "relu": lambda v: np.maximum(v, 0.0),
       "identity": lambda v: v}


def np_lstm(x, offs, w, b, h0=None, c0=None, use_peepholes=True, is_reverse=False,
            gate_activation="sigmoid", cell_activation="tanh", candidate_activation="tanh"):
    hd = w.shape[0]
    b = b.reshape(-1)
    hidden, cell = np.zeros((x.shape[0], hd)), np.zeros((x.shape[0], hd))
    for s in range(len(offs) - 1):
        rows = range(offs[s], offs[s + 1])
        h = h0[s] if h0 is not None else np.zeros(hd)
        c = c0[s] if c0 is not None else None
        for r in (reversed(rows) if is_reverse else rows):
            g = x[r] + b[:4 * hd] + h @ w
            cand, i, f, o = np.split(g, 4)
            if use_peepholes and c is not None:
                i = i + c * b[4 * hd:5 * hd]
                f = f + c * b[5 * hd:6 * hd]
            c = ACT[candidate_activation](cand) * ACT[gate_activation](i) + \
                (c * ACT[gate_activation](f) if c is not None else 0.0)
            if use_peepholes:
                o = o + c * b[6 * hd:]
            h = ACT[gate_activation](o) * ACT[cell_activation](c)
            hidden[r], cell[r] = h, c
    return hidden, cell


def np_gru(x, offs, w, b=None, h0=None, is_reverse=False, gate_activation="sigmoid",
           activation="tanh", origin_mode=False):
    hd = w.shape[0]
    w_ur = w.reshape(-1)[:2 * hd * hd].reshape(hd, 2 * hd)  # Paddle's layout of Weight
    w_c = w.reshape(-1)[2 * hd * hd:].reshape(hd, hd)
    hidden = np.zeros((x.shape[0], hd))
    for s in range(len(offs) - 1):
        rows = range(offs[s], offs[s + 1])
        h = h0[s] if h0 is not None else np.zeros(hd)
        for r in (reversed(rows) if is_reverse else rows):
            g = x[r] + (b.reshape(-1) if b is not None else 0.0)
            ur = ACT[gate_activation](g[:2 * hd] + h @ w_ur)
            u, rg = ur[:hd], ur[hd:]
            c = ACT[activation](g[2 * hd:] + (rg * h) @ w_c)
            h = u * h + (1 - u) * c if origin_mode else (1 - u) * h + u * c
            hidden[r] = h
    return hidden


def np_seq_conv(x, offs, filt, length, start, pad=None):
    d = x.shape[1]
    up = max(0, -start)
    out = np.zeros((x.shape[0], filt.shape[1]))
    for s in range(len(offs) - 1):
        b, e = offs[s], offs[s + 1]
        for t in range(b, e):
            window = np.zeros(length * d)
            for j in range(length):
                r = t + start + j
                if b <= r < e:
                    window[j * d:(j + 1) * d] = x[r]
                elif pad is not None:  # rows above the sequence first, then those below
                    window[j * d:(j + 1) * d] = pad[r - b + up] if r < b else pad[up + r - e]
            out[t] = window @ filt
    return out


def numeric(f, arrays, name, delta=1e-6):
    """Central differences of the scalar ``f(**arrays)`` with respect to ``arrays[name]``."""
    x = arrays[name].copy()
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[i] += delta
        lo[i] -= delta
        g[i] = (f(**dict(arrays, **{name: hi})) - f(**dict(arrays, **{name: lo}))) / (2 * delta)
    return g


# ---- running through pdjit ---------------------------------------------------------------------
def native_types(exe) -> set:
    """Op types the compiled plans ran in native steps (asserting none fell back)."""
    assert_native(exe)
    types, reference = set(), set()
    for _, plan in exe._plans.values():
        for step in plan.walk():
            if step.kind.startswith("native"):
                types.update(op.type for op, _ in step.ops)
            elif step.kind == "reference":
                reference.add(step.op.type)
    assert not (types & reference), f"ops run by their references: {reference}"
    return types


def run(op_type, inputs, attrs, fetch, wrt=(), weights=None, mode="compiled"):
    """Outputs ``fetch`` and the gradients of ``sum(weights[slot] * out[slot])`` with respect
    to the input slots ``wrt``; in compiled mode every op must run natively."""
    prog, feed, outs = build_op_program(op_type, inputs, attrs)
    block = prog.global_block()
    fetch_vars = [outs[s][0] for s in fetch]
    if wrt:
        seeds = []
        for slot, w in weights.items():
            v = block.create_var(name=f"w_{slot}", shape=list(w.shape), dtype=w.dtype)
            feed[f"w_{slot}"] = w
            seeds.append(v)
        fetch_vars += gradients([outs[s][0] for s in weights], [block.var(f"{s.lower()}_0")
                                                                for s in wrt], seeds)
    exe = Executor(mode=mode, strict=True)
    got = exe.run(prog, feed=feed, fetch_list=fetch_vars, scope=Scope(), return_numpy=False)
    if mode == "compiled":
        want = {op_type} | ({op_type + "_grad"} if wrt else set())
        assert want <= native_types(exe), f"not native: {want - native_types(exe)}"
    return got


def u(rng, *shape):
    return rng.uniform(-1, 1, shape)


def lstm_case(seed, lod, peep, with_state):
    rng = np.random.default_rng(seed)
    rows, n = lod[0][-1], len(lod[0]) - 1
    ins = {"Input": u(rng, rows, 4 * H), "Weight": u(rng, H, 4 * H),
           "Bias": u(rng, 1, (7 if peep else 4) * H)}
    if with_state:
        ins.update(H0=u(rng, n, H), C0=u(rng, n, H))
    return ins


LSTM_CASES = [  # lod, use_peepholes, H0/C0, is_reverse, activations (gate, cell, candidate)
    (LODS[0], True, False, False, ("sigmoid", "tanh", "tanh")),
    (LODS[1], True, True, True, ("sigmoid", "tanh", "tanh")),
    (LODS[0], False, True, False, ("sigmoid", "relu", "identity")),
    (LODS[1], False, False, True, ("tanh", "identity", "relu")),
]


@pytest.mark.parametrize("lod,peep,with_state,reverse,acts", LSTM_CASES)
def test_lstm_forward_and_gradients(lod, peep, with_state, reverse, acts):
    ins = lstm_case(len(str(lod)) + peep, lod, peep, with_state)
    attrs = {"use_peepholes": peep, "is_reverse": reverse, "gate_activation": acts[0],
             "cell_activation": acts[1], "candidate_activation": acts[2]}
    offs = lod[0]
    rng = np.random.default_rng(1)
    wts = {"Hidden": rng.uniform(0.5, 1.5, (offs[-1], H)),
           "Cell": rng.uniform(0.5, 1.5, (offs[-1], H))}
    names = {"Input": "x", "Weight": "w", "Bias": "b", "H0": "h0", "C0": "c0"}

    def loss(x, w, b, h0=None, c0=None):
        h, c = np_lstm(x, offs, w, b, h0, c0, peep, reverse, *acts)
        return float(np.sum(h * wts["Hidden"]) + np.sum(c * wts["Cell"]))

    arrays = {names[k]: v for k, v in ins.items()}
    want_h, want_c = np_lstm(arrays["x"], offs, arrays["w"], arrays["b"], arrays.get("h0"),
                             arrays.get("c0"), peep, reverse, *acts)
    wrt = tuple(ins)
    feed = dict(ins, Input=(ins["Input"], lod))
    for mode in ("reference", "compiled"):
        got = run("lstm", feed, attrs, ["Hidden", "Cell"], wrt, wts, mode)
        assert got[0].lod() == lod and got[1].lod() == lod
        np.testing.assert_allclose(np.asarray(got[0]), want_h, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(got[1]), want_c, rtol=1e-10, atol=1e-12)
        for slot, g in zip(wrt, got[2:]):
            np.testing.assert_allclose(np.asarray(g), numeric(loss, arrays, names[slot]),
                                       rtol=1e-6, atol=1e-8, err_msg=f"{mode} d/d{slot}")


GRU_CASES = [  # lod, H0, Bias, is_reverse, origin_mode, activations (gate, candidate)
    (LODS[0], False, True, False, False, ("sigmoid", "tanh")),
    (LODS[1], True, True, True, False, ("sigmoid", "tanh")),
    (LODS[0], True, False, False, True, ("sigmoid", "relu")),
    (LODS[1], False, True, True, True, ("tanh", "identity")),
]


@pytest.mark.parametrize("lod,with_h0,with_bias,reverse,origin,acts", GRU_CASES)
def test_gru_forward_and_gradients(lod, with_h0, with_bias, reverse, origin, acts):
    rng = np.random.default_rng(len(str(lod)) + 2 * with_h0 + origin)
    offs = lod[0]
    ins = {"Input": u(rng, offs[-1], 3 * H), "Weight": u(rng, H, 3 * H)}
    if with_bias:
        ins["Bias"] = u(rng, 1, 3 * H)
    if with_h0:
        ins["H0"] = u(rng, len(offs) - 1, H)
    attrs = {"is_reverse": reverse, "origin_mode": origin, "gate_activation": acts[0],
             "activation": acts[1]}
    wts = {"Hidden": rng.uniform(0.5, 1.5, (offs[-1], H))}
    names = {"Input": "x", "Weight": "w", "Bias": "b", "H0": "h0"}

    def loss(x, w, b=None, h0=None):
        return float(np.sum(np_gru(x, offs, w, b, h0, reverse, *acts, origin) * wts["Hidden"]))

    arrays = {names[k]: v for k, v in ins.items()}
    want = np_gru(arrays["x"], offs, arrays["w"], arrays.get("b"), arrays.get("h0"), reverse,
                  *acts, origin)
    wrt = tuple(ins)
    for mode in ("reference", "compiled"):
        got = run("gru", dict(ins, Input=(ins["Input"], lod)), attrs, ["Hidden"], wrt, wts,
                  mode)
        assert got[0].lod() == lod
        np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-10, atol=1e-12)
        for slot, g in zip(wrt, got[1:]):
            np.testing.assert_allclose(np.asarray(g), numeric(loss, arrays, names[slot]),
                                       rtol=1e-6, atol=1e-8, err_msg=f"{mode} d/d{slot}")


CONV_CASES = [  # lod, contextLength, contextStart, paddingTrainable
    (LODS[0], 3, -1, False), (LODS[1], 2, 1, False), (LODS[0], 4, -2, True),
    (LODS[1], 3, -3, True), (LODS[0], 1, 0, False),
]


@pytest.mark.parametrize("lod,length,start,trained", CONV_CASES)
def test_sequence_conv_forward_and_gradients(lod, length, start, trained):
    rng = np.random.default_rng(length + 10 * trained)
    offs, d = lod[0], 2
    ins = {"X": u(rng, offs[-1], d), "Filter": u(rng, length * d, 4)}
    if trained:
        ins["PaddingData"] = u(rng, max(0, -start) + max(0, start + length - 1), d)
    attrs = {"contextLength": length, "contextStart": start, "paddingTrainable": trained}
    wts = {"Out": rng.uniform(0.5, 1.5, (offs[-1], 4))}
    names = {"X": "x", "Filter": "filt", "PaddingData": "pad"}

    def loss(x, filt, pad=None):
        return float(np.sum(np_seq_conv(x, offs, filt, length, start, pad) * wts["Out"]))

    arrays = {names[k]: v for k, v in ins.items()}
    want = np_seq_conv(arrays["x"], offs, arrays["filt"], length, start, arrays.get("pad"))
    wrt = tuple(ins)
    for mode in ("reference", "compiled"):
        got = run("sequence_conv", dict(ins, X=(ins["X"], lod)), attrs, ["Out"], wrt, wts, mode)
        assert got[0].lod() == lod
        np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-10, atol=1e-12)
        for slot, g in zip(wrt, got[1:]):
            np.testing.assert_allclose(np.asarray(g), numeric(loss, arrays, names[slot]),
                                       rtol=1e-6, atol=1e-8, err_msg=f"{mode} d/d{slot}")


def test_untrained_padding_data_is_ignored():
    """PaddingData without paddingTrainable: the windows see zeros, as Paddle's kernel does."""
    rng = np.random.default_rng(3)
    lod = LODS[0]
    x, f = u(rng, 8, 2), u(rng, 6, 3)
    want = np_seq_conv(x, lod[0], f, 3, -1)
    got = run("sequence_conv", {"X": (x, lod), "Filter": f, "PaddingData": u(rng, 2, 2)},
              {"contextLength": 3, "contextStart": -1}, ["Out"])
    np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-10)


@pytest.mark.parametrize("op_type,inputs,attrs,out,width", [
    ("lstm", {"Input": np.zeros((0, 12)), "Weight": np.ones((3, 12)), "Bias": np.ones((1, 21)),
              "H0": np.ones((2, 3)), "C0": np.ones((2, 3))}, {}, "Hidden", 3),
    ("gru", {"Input": np.zeros((0, 9)), "Weight": np.ones((3, 9)), "H0": np.ones((2, 3))}, {},
     "Hidden", 3),
    ("sequence_conv", {"X": np.zeros((0, 2)), "Filter": np.ones((6, 4))},
     {"contextLength": 3, "contextStart": -1}, "Out", 4),
])
def test_a_batch_of_empty_sequences(op_type, inputs, attrs, out, width):
    """Only empty sequences: no rows out, and zero gradients for every input."""
    lod = [[0, 0, 0]]
    slot = "X" if op_type == "sequence_conv" else "Input"
    feed = dict(inputs, **{slot: (inputs[slot], lod)})
    for mode in ("reference", "compiled"):
        got = run(op_type, feed, attrs, [out], tuple(inputs), {out: np.ones((0, width))}, mode)
        assert np.asarray(got[0]).shape == (0, width)
        for name, g in zip(inputs, got[1:]):
            assert np.asarray(g).shape == inputs[name].shape and not np.asarray(g).any()


# ---- the test kit's check_grad, once per op ---------------------------------------------------
def test_check_grad_through_the_kit():
    """The kit's finite differences through pdjit's own reference interpreter (the native
    gradients are checked above: this adds the references of the grad ops)."""
    rng = np.random.default_rng(5)
    lod = [[0, 1, 1, 3]]
    ref = ["reference"]
    check_grad("lstm", {"Input": (u(rng, 3, 8), lod), "Weight": u(rng, 2, 8),
                        "Bias": u(rng, 1, 14), "H0": u(rng, 3, 2), "C0": u(rng, 3, 2)},
               {"is_reverse": True}, inputs_to_check=("Input", "Weight", "Bias", "C0"),
               output_name="Hidden", modes=ref)
    check_grad("gru", {"Input": (u(rng, 3, 6), lod), "Weight": u(rng, 2, 6),
                       "Bias": u(rng, 1, 6), "H0": u(rng, 3, 2)},
               inputs_to_check=("Input", "Weight", "H0"), output_name="Hidden", modes=ref)
    check_grad("sequence_conv", {"X": (u(rng, 3, 2), lod), "Filter": u(rng, 6, 2)},
               {"contextLength": 3, "contextStart": -1}, inputs_to_check=("X", "Filter"),
               modes=ref)


# ---- float32 -------------------------------------------------------------------------------------
def test_lstm_float32_native():
    ins = {k: v.astype(np.float32) for k, v in lstm_case(9, LODS[0], True, True).items()}
    want_h, want_c = np_lstm(ins["Input"].astype(np.float64), LODS[0][0],
                             *(ins[k].astype(np.float64) for k in ("Weight", "Bias", "H0", "C0")))
    got = run("lstm", dict(ins, Input=(ins["Input"], LODS[0])), {}, ["Hidden", "Cell"])
    assert np.asarray(got[0]).dtype == np.float32
    np.testing.assert_allclose(np.asarray(got[0]), want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got[1]), want_c, rtol=1e-5, atol=1e-6)


# ---- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op_type,inputs,attrs,message", [
    ("lstm", {"Input": (np.zeros((4, 12)), [[0, 4]]), "Weight": np.zeros((3, 8)),
              "Bias": np.zeros((1, 21))}, {}, "Weight of shape [3, 8]: expected [3, 12]"),
    ("lstm", {"Input": (np.zeros((4, 12)), [[0, 4]]), "Weight": np.zeros((3, 12)),
              "Bias": np.zeros((1, 12))}, {}, "Bias of shape [1, 12]: expected [1, 21]"),
    ("lstm", {"Input": (np.zeros((4, 8)), [[0, 4]]), "Weight": np.zeros((3, 12)),
              "Bias": np.zeros((1, 21))}, {}, "Input of shape [4, 8]: expected [-1, 12]"),
    ("lstm", {"Input": (np.zeros((4, 12)), [[0, 4]]), "Weight": np.zeros((3, 12)),
              "Bias": np.zeros((1, 21))}, {"gate_activation": "softmax"},
     "gate_activation='softmax': expected one of"),
    ("lstm", {"Input": (np.zeros((4, 12)), [[0, 4]]), "Weight": np.zeros((3, 12)),
              "Bias": np.zeros((1, 21)), "H0": np.zeros((1, 3))}, {},
     "H0 is given without C0"),
    ("lstm", {"Input": (np.zeros((4, 12)), [[0, 4]]), "Weight": np.zeros((3, 12)),
              "Bias": np.zeros((1, 21), np.float32)}, {},
     "input Bias is float32: expected float64"),
    ("gru", {"Input": (np.zeros((4, 9)), [[0, 4]]), "Weight": np.zeros((3, 9)),
             "H0": np.zeros((2, 4))}, {}, "H0 of shape [2, 4]: expected [-1, 3]"),
    ("sequence_conv", {"X": (np.zeros((4, 2)), [[0, 4]]), "Filter": np.zeros((5, 3))},
     {"contextLength": 3}, "Filter of shape [5, 3]: expected [contextLength * D, O] = [6, O]"),
    ("sequence_conv", {"X": (np.zeros((4, 2)), [[0, 4]]), "Filter": np.zeros((6, 3))},
     {"contextLength": 3, "contextStride": 2}, "contextStride=2: expected 1"),
    ("sequence_conv", {"X": (np.zeros((4, 2)), [[0, 4]]), "Filter": np.zeros((6, 3))},
     {"contextLength": 3, "contextStart": -1, "paddingTrainable": True},
     "paddingTrainable=True needs input PaddingData"),
])
def test_bad_shapes_are_refused_at_build_time(op_type, inputs, attrs, message):
    with pytest.raises(OpShapeError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("*", r"\*")) as e:
        build_op_program(op_type, inputs, attrs)
    assert op_type in str(e.value)


@pytest.mark.parametrize("mode", ["reference", "compiled"])
def test_run_time_mismatch_names_the_input(mode):
    """H0 declared with an unknown batch: one row per sequence is checked when it runs."""
    rng = np.random.default_rng(0)
    ins = {"Input": (u(rng, 4, 12), [[0, 1, 4]]), "Weight": u(rng, 3, 12),
           "Bias": u(rng, 1, 21), "H0": u(rng, 3, 3), "C0": u(rng, 2, 3)}
    prog, feed, outs = build_op_program("lstm", ins, {}, batch_unknown={"H0"})
    with pytest.raises(Exception, match=r"H0 of shape \[3, 3\]: expected \[2, 3\]"):
        Executor(mode=mode).run(prog, feed=feed, fetch_list=[outs["Hidden"][0]], scope=Scope())


# ---- PaddlePaddle parity -------------------------------------------------------------------------
def _fixture_cases():
    path = FIXTURES / "cases.json"
    return json.loads(path.read_text())["cases"] if path.exists() else []


@pytest.mark.parametrize("case", _fixture_cases(), ids=lambda c: c["name"])
def test_lod_rnn_paddle(case):
    """Outputs and input gradients of ``sum(W * out)`` as Paddle 3.3.1 computed them
    (``tests/fixtures/make_lod_rnn_fixtures.py``; LoDs with empty sequences), compiled natively
    in float64 (Paddle's sequence_conv ran in float32: its numbers are compared at float32
    precision)."""
    data = np.load(FIXTURES / f"{case['name']}.npz")
    ins = {slot: data[f"in_{slot}"].astype(np.float64) for slot in case["inputs"]}
    feed = dict(ins, **{case["lod_slot"]: (ins[case["lod_slot"]], case["lod"])})
    out, wrt = case["output"], tuple(case["grads"])
    fetch = [out] + (["Cell"] if "out_Cell" in data else [])
    got = run(case["op"], feed, case["attrs"], fetch, wrt,
              {out: data["W"].astype(np.float64)})
    single = data[f"out_{out}"].dtype == np.float32
    tol = dict(rtol=2e-5, atol=2e-6) if single else dict(rtol=1e-9, atol=1e-12)
    for slot, g in zip(fetch, got):
        assert g.lod() == case["lod"]
        np.testing.assert_allclose(np.asarray(g), data[f"out_{slot}"], err_msg=slot, **tol)
    for slot, g in zip(wrt, got[len(fetch):]):
        np.testing.assert_allclose(np.asarray(g), data[f"grad_{slot}"], err_msg=slot, **tol)
