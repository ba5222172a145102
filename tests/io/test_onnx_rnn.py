"""pdjit.io.onnx_export of recurrent programs: Paddle's ``rnn`` op (LSTM and GRU, stacked,
bidirectional, initial states fed or made by ``fill_constant_batch_size_like``) exported to
ONNX's LSTM/GRU nodes runs in onnxruntime and gives the outputs of a NumPy network written here
from Paddle's cells (LSTM gates i, f, c~, o; GRU gates r, z, c~ with ``c~ = tanh(W_ic x + b_ic
+ r * (W_hc h + b_hc))``, ``h = z * h' + (1 - z) * c~``; the reverse direction from the last
step; a layer's input the concatenated directions of the one below) and those of pdjit's
compiled executor (``Executor(strict=True)``, native steps asserted), float32, at batches 1, 5
and 17 (the kernel's two paths for the recurrent product, 17 sequences two vectors of them).
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.initializer import Uniform
from pdjit.io.onnx_export import to_onnx
from pdjit.layers.layer_helper import LayerHelper
from pdjit.param_attr import ParamAttr
from pdjit.testing.op_test import assert_native

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

TOL = dict(rtol=2e-5, atol=2e-5)
T, I = 4, 3


def sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def oracle(mode, x, h0, c0, ws, L, D):
    """x ``[T, B, I]``; ws in Paddle's order (every ``w_ih, w_hh``, then every ``b_ih,
    b_hh``): (out ``[T, B, D*H]``, last h, last c), float64."""
    nw = 2 * L * D
    inp, hs, cs = x.astype(np.float64), [], []
    for layer in range(L):
        outs = []
        for d in range(D):
            k = layer * D + d
            wih, whh, bih, bhh = ws[2 * k], ws[2 * k + 1], ws[nw + 2 * k], ws[nw + 2 * k + 1]
            h, c = h0[k].astype(np.float64), c0[k].astype(np.float64)
            out = np.zeros((x.shape[0], x.shape[1], h.shape[1]))
            for t in (range(x.shape[0]) if d == 0 else range(x.shape[0] - 1, -1, -1)):
                gx, gh = inp[t] @ wih.T + bih, h @ whh.T + bhh
                if mode == "LSTM":
                    i, f, g, o = np.split(gx + gh, 4, axis=1)
                    c = sig(f) * c + sig(i) * np.tanh(g)
                    h = sig(o) * np.tanh(c)
                else:
                    (xr, xz, xc), (hr, hz, hc) = np.split(gx, 3, 1), np.split(gh, 3, 1)
                    r, z = sig(xr + hr), sig(xz + hz)
                    h = z * h + (1 - z) * np.tanh(xc + r * hc)
                out[t] = h
            outs.append(out)
            hs.append(h)
            cs.append(c)
        inp = np.concatenate(outs, axis=2)
    return inp, np.stack(hs), np.stack(cs)


def _rnn(mode, x, pre, H, L, D):
    """The ``rnn`` op over time-major ``x`` with initial states ``pre``; (out, states, weight
    parameters in WeightList's order)."""
    G = 4 if mode == "LSTM" else 3
    helper = LayerHelper(mode.lower())
    init = Uniform(-0.6, 0.6)
    ws = []
    for k in range(L * D):
        for cols in (I if k < D else D * H, H):
            ws.append(helper.create_parameter(ParamAttr(), [G * H, cols], "float32",
                                              default_initializer=init))
    for _ in range(2 * L * D):
        ws.append(helper.create_parameter(ParamAttr(), [G * H], "float32", is_bias=True,
                                          default_initializer=init))
    out = helper.create_variable_for_type_inference("float32")
    states = [helper.create_variable_for_type_inference("float32") for _ in pre]
    reserve = helper.create_variable_for_type_inference("float32", stop_gradient=True)
    drop = helper.create_variable_for_type_inference("uint8", stop_gradient=True)
    helper.append_op("rnn", inputs={"Input": [x], "PreState": pre, "WeightList": ws},
                     outputs={"Out": [out], "State": states, "Reserve": [reserve],
                              "DropoutState": [drop]},
                     attrs={"dropout_prob": 0.0, "is_bidirec": D == 2, "input_size": I,
                            "hidden_size": H, "num_layers": L, "mode": mode, "is_test": True})
    return out, states, ws


def _program(mode, H, L, D, fed_states):
    """x ``[B, T, I]`` transposed to time-major; the states fed (``h0``/``c0`` ``[L*D, B,
    H]``) or ``fill_constant_batch_size_like`` of x (0.25 and, LSTM's cell, -0.5)."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [T, I])
        feeds = [x]
        n = 2 if mode == "LSTM" else 1
        if fed_states:
            pre = [fluid.layers.data(nm, [L * D, -1, H], append_batch_size=False)
                   for nm in ("h0", "c0")[:n]]
            feeds += pre
        else:
            pre = [fluid.layers.fill_constant_batch_size_like(
                x, [L * D, -1, H], "float32", v, input_dim_idx=0, output_dim_idx=1)
                for v in (0.25, -0.5)[:n]]
        out, states, ws = _rnn(mode, fluid.layers.transpose(x, [1, 0, 2]), pre, H, L, D)
    exe, scope = fluid.Executor(strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    params = {w.name: np.asarray(scope.find_var(w.name).value) for w in ws}
    return main, exe, scope, feeds, [out] + states, [params[w.name] for w in ws], params


CASES = [("LSTM", 5, 2, True, True), ("LSTM", 3, 1, False, False), ("GRU", 7, 2, True, False),
         ("GRU", 4, 1, False, True)]


@pytest.mark.parametrize("mode,H,L,bidirec,fed", CASES)
def test_rnn_exports_to_onnx_and_matches_numpy_and_pdjit(mode, H, L, bidirec, fed):
    D = 2 if bidirec else 1
    main, exe, scope, feeds, fetches, ws, params = _program(mode, H, L, D, fed)
    model = to_onnx(main, params, [v.name for v in feeds], [v.name for v in fetches])
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)
    kinds = [n.op_type for n in onnx.load_from_string(model).graph.node]
    assert kinds.count(mode) == L  # one node per layer, both directions in it
    if not fed:
        assert "ConstantOfShape" in kinds
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(H)
    for B in (1, 5, 17):
        feed = {"x": rng.standard_normal((B, T, I)).astype(np.float32)}
        if fed:
            for nm in ("h0", "c0")[:2 if mode == "LSTM" else 1]:
                feed[nm] = rng.standard_normal((L * D, B, H)).astype(np.float32)
        h0 = feed.get("h0", np.full((L * D, B, H), 0.25, np.float32))
        c0 = feed.get("c0", np.full((L * D, B, H), -0.5 if mode == "LSTM" else 0.0))
        want = oracle(mode, feed["x"].transpose(1, 0, 2), h0, c0, ws, L, D)
        want = list(want[:3 if mode == "LSTM" else 2])
        got_ort = sess.run(None, feed)
        got_pd = exe.run(main, feed=feed, fetch_list=fetches, scope=scope)
        assert_native(exe)
        for name, w, go, gp in zip(("Out", "h", "c"), want, got_ort, got_pd):
            assert go.shape == gp.shape == w.shape, name
            np.testing.assert_allclose(go, w, err_msg=f"onnxruntime {name} B={B}", **TOL)
            np.testing.assert_allclose(gp, w, err_msg=f"pdjit {name} B={B}", **TOL)


def test_fill_constant_batch_size_like_takes_its_dim_at_run_time():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [3, 2])  # [N, 3, 2]
        a = fluid.layers.fill_constant_batch_size_like(x, [-1, 4], "float32", 1.5)
        b = fluid.layers.fill_constant_batch_size_like(x, [2, 5, -1], "int64", 7,
                                                       input_dim_idx=0, output_dim_idx=-1)
        c = fluid.layers.fill_constant_batch_size_like(x, [6, -1], "float32", -2.0,
                                                       input_dim_idx=1, output_dim_idx=1)
    sess = ort.InferenceSession(to_onnx(main, {}, ["x"], [a.name, b.name, c.name]),
                                providers=["CPUExecutionProvider"])
    for n in (1, 4):
        got = sess.run(None, {"x": np.zeros((n, 3, 2), np.float32)})
        for g, want in zip(got, (np.full((n, 4), 1.5, np.float32),
                                 np.full((2, 5, n), 7, np.int64),
                                 np.full((6, 3), -2.0, np.float32))):
            assert g.dtype == want.dtype
            np.testing.assert_array_equal(g, want)


def test_fill_constant_batch_size_like_with_a_second_unknown_dim_is_refused():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [3])
        y = fluid.layers.fill_constant_batch_size_like(x, [-1, 2], "float32", 0.0)
    main.global_block().ops[-1]._set_attr("shape", [-1, -1])
    with pytest.raises(NotImplementedError,
                       match=r"op fill_constant_batch_size_like #\d+ \(block 0\): .*a -1 "
                             r"outside output_dim_idx 0"):
        to_onnx(main, {}, ["x"], [y.name])


def test_rnn_in_a_native_driver_matches_numpy():
    """The served form: the step's driver compiled as one native function (the weight table
    and the forward as compiled code) gives the NumPy network's outputs in every run."""
    main, _, scope, feeds, fetches, ws, _ = _program("LSTM", 5, 2, 2, True)
    exe = fluid.Executor(native_drivers=True, strict=True)
    rng = np.random.default_rng(3)
    for run in range(10):  # the trials: the host driver, then the native one
        B = 1 if run % 2 else 5
        feed = {"x": rng.standard_normal((B, T, I)).astype(np.float32),
                "h0": rng.standard_normal((4, B, 5)).astype(np.float32),
                "c0": rng.standard_normal((4, B, 5)).astype(np.float32)}
        want = oracle("LSTM", feed["x"].transpose(1, 0, 2), feed["h0"], feed["c0"], ws, 2, 2)
        got = exe.run(main, feed=feed, fetch_list=fetches, scope=scope)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, err_msg=f"run {run}", **TOL)
    assert_native(exe)
    steps = [s for _, plan in exe._plans.values() for s in plan.walk()
             if s.kind.startswith("native")]
    # the native driver was built and ran at both batch sizes: timed in a trial going on, or
    # in one that picked a driver (each candidate runs in a trial; with cold caches a batch
    # size's runs are long and its trial ends after one run of each)
    ran = {b for s in steps if s.native is not None
           for b, trial in s.tiers._trials.items() if trial[1]}
    ran |= {b for s in steps if s.native is not None for b in s.tiers.picked}
    assert ran == {1, 5}
