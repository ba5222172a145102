"""The layers ``dynamic_lstm``, ``dynamic_gru``, ``sequence_conv`` and
``fluid.nets.sequence_conv_pool``: the ops and parameters they append (Fluid 1.8's), their
results against NumPy written here (row by row within each sequence), and training through
them, natively (strict executor, every op of the plans in native steps).

float64 data, so the kernels compiled by ``tests/ops/test_lod_rnn.py`` serve these tests too.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.runtime.scope import Scope
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing.op_test import assert_native

LOD = [[0, 3, 3, 7, 8]]


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def np_lstm(x, offs, w, b, h0, c0, peep):
    """Fluid's LSTM row by row: gates {c~, i, f, o}, peepholes in the last 3H of the bias."""
    hd = w.shape[0]
    b = b.reshape(-1)
    out = np.zeros((x.shape[0], hd))
    for s in range(len(offs) - 1):
        h, c = h0[s], c0[s]
        for r in range(offs[s], offs[s + 1]):
            cand, i, f, o = np.split(x[r] + b[:4 * hd] + h @ w, 4)
            if peep:
                i, f = i + c * b[4 * hd:5 * hd], f + c * b[5 * hd:6 * hd]
            c = np.tanh(cand) * sigmoid(i) + c * sigmoid(f)
            h = sigmoid(o + c * b[6 * hd:] if peep else o) * np.tanh(c)
            out[r] = h
    return out


def np_gru_reverse(x, offs, w, b, origin):
    hd = w.shape[0]
    w_ur, w_c = w.reshape(-1)[:2 * hd * hd].reshape(hd, 2 * hd), w.reshape(-1)[2 * hd * hd:]
    out = np.zeros((x.shape[0], hd))
    for s in range(len(offs) - 1):
        h = np.zeros(hd)
        for r in reversed(range(offs[s], offs[s + 1])):
            g = x[r] + b.reshape(-1)
            u, rg = np.split(sigmoid(g[:2 * hd] + h @ w_ur), 2)
            c = np.tanh(g[2 * hd:] + (rg * h) @ w_c.reshape(hd, hd))
            h = u * h + (1 - u) * c if origin else (1 - u) * h + u * c
            out[r] = h
    return out


def native_types(exe) -> set:
    assert_native(exe)
    return {op.type for _, plan in exe._plans.values() for step in plan.walk()
            if step.kind.startswith("native") for op, _ in step.ops}


def param(scope, name):
    return np.array(scope.find_var(name).get_tensor(), copy=True)


def test_dynamic_lstm_appends_fluids_op_and_matches_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[8], dtype="float64", lod_level=1)
        h0 = fluid.layers.data(name="h0", shape=[2], dtype="float64")
        c0 = fluid.layers.data(name="c0", shape=[2], dtype="float64")
        hidden, cell = fluid.layers.dynamic_lstm(x, size=8, h_0=h0, c_0=c0, dtype="float64")
    (op,) = [o for o in main.global_block().ops if o.type == "lstm"]
    assert op.input("Weight") == ["lstm_0.w_0"] and op.input("Bias") == ["lstm_0.b_0"]
    assert op.input("H0") == ["h0"] and op.input("C0") == ["c0"]
    assert op.attr("use_peepholes") is True and op.attr("candidate_activation") == "tanh"
    assert list(main.global_block().var("lstm_0.w_0").shape) == [2, 8]
    assert list(main.global_block().var("lstm_0.b_0").shape) == [1, 14]
    assert list(hidden.shape) == [-1, 2] and hidden.lod_level == 1
    rng = np.random.default_rng(0)
    xv, h0v, c0v = rng.uniform(-1, 1, (8, 8)), rng.uniform(-1, 1, (4, 2)), \
        rng.uniform(-1, 1, (4, 2))
    exe, scope = fluid.Executor(fluid.CPUPlace(), strict=True), Scope()
    exe.run(startup, scope=scope)
    # a bias that is not zero, so that the peepholes count
    scope.find_var("lstm_0.b_0").get_tensor().set(rng.uniform(-1, 1, (1, 14)))
    got, = exe.run(main, feed={"x": LoDTensor(xv, LOD), "h0": h0v, "c0": c0v},
                   fetch_list=[hidden], scope=scope, return_numpy=False)
    want = np_lstm(xv, LOD[0], param(scope, "lstm_0.w_0"), param(scope, "lstm_0.b_0"), h0v,
                   c0v, True)
    assert got.lod() == LOD
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)
    assert "lstm" in native_types(exe)


def test_dynamic_gru_appends_fluids_op_and_matches_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[9], dtype="float64", lod_level=1)
        hidden = fluid.layers.dynamic_gru(x, size=3, is_reverse=True, origin_mode=True)
    (op,) = [o for o in main.global_block().ops if o.type == "gru"]
    assert op.attr("activation") == "tanh" and op.attr("origin_mode") is True
    assert list(main.global_block().var("gru_0.w_0").shape) == [3, 9]
    assert list(main.global_block().var("gru_0.b_0").shape) == [1, 9]
    rng = np.random.default_rng(1)
    xv = rng.uniform(-1, 1, (8, 9))
    exe, scope = fluid.Executor(fluid.CPUPlace(), strict=True), Scope()
    exe.run(startup, scope=scope)
    scope.find_var("gru_0.b_0").get_tensor().set(rng.uniform(-1, 1, (1, 9)))
    got, = exe.run(main, feed={"x": LoDTensor(xv, LOD)}, fetch_list=[hidden], scope=scope)
    want = np_gru_reverse(xv, LOD[0], param(scope, "gru_0.w_0"), param(scope, "gru_0.b_0"),
                          True)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert "gru" in native_types(exe)


def test_sequence_conv_pool_matches_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[2], dtype="float64", lod_level=1)
        pooled = fluid.nets.sequence_conv_pool(x, num_filters=4, filter_size=3)
    (op,) = [o for o in main.global_block().ops if o.type == "sequence_conv"]
    assert (op.attr("contextLength"), op.attr("contextStart"), op.attr("contextStride")) == \
        (3, -1, 1)
    types = [o.type for o in main.global_block().ops]
    assert types == ["sequence_conv", "elementwise_add", "sigmoid", "sequence_pool"]
    rng = np.random.default_rng(2)
    xv = rng.uniform(-1, 1, (8, 2))
    exe, scope = fluid.Executor(fluid.CPUPlace(), strict=True), Scope()
    exe.run(startup, scope=scope)
    bias = rng.uniform(-1, 1, 4)
    scope.find_var("sequence_conv_0.b_0").get_tensor().set(bias)
    got, = exe.run(main, feed={"x": LoDTensor(xv, LOD)}, fetch_list=[pooled], scope=scope)
    filt = param(scope, "sequence_conv_0.w_0")
    want = np.zeros((4, 4))  # the empty sequence pools to 0
    offs = LOD[0]
    for s in range(4):
        rows = []
        for t in range(offs[s], offs[s + 1]):
            window = [xv[r] if offs[s] <= r < offs[s + 1] else np.zeros(2)
                      for r in (t - 1, t, t + 1)]
            rows.append(sigmoid(np.concatenate(window) @ filt + bias))
        if rows:
            want[s] = np.max(rows, axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert "sequence_conv" in native_types(exe)


SEED = 1


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_training_through_the_recurrent_layers(cell):
    """fc -> dynamic_lstm/gru -> last step -> fc -> squared error, trained by SGD: the loss
    falls, and the recurrent op runs natively forward and backward."""
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = SEED  # the initial weights: not this process's entropy seed
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[3], dtype="float64", lod_level=1)
        y = fluid.layers.data(name="y", shape=[1], dtype="float64")
        if cell == "lstm":
            proj = fluid.layers.fc(x, size=16)
            h, _ = fluid.layers.dynamic_lstm(proj, size=16, use_peepholes=False,
                                             dtype="float64")
        else:
            proj = fluid.layers.fc(x, size=12)
            h = fluid.layers.dynamic_gru(proj, size=4)
        pred = fluid.layers.fc(fluid.layers.sequence_last_step(h), size=1)
        loss = fluid.layers.mean(fluid.layers.square(pred - y))
        fluid.optimizer.SGD(learning_rate=0.3).minimize(loss)
    rng = np.random.default_rng(3)
    lod = [[0, 2, 2, 5, 6, 9]]
    xv = rng.uniform(-1, 1, (9, 3))
    yv = rng.uniform(-1, 1, (5, 1))
    exe, scope = fluid.Executor(fluid.CPUPlace(), strict=True), Scope()
    exe.run(startup, scope=scope)
    losses = [float(np.asarray(exe.run(main, feed={"x": LoDTensor(xv, lod), "y": yv},
                                       fetch_list=[loss], scope=scope)[0]).reshape(-1)[0])
              for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert {cell, cell + "_grad"} <= native_types(exe)


def test_bad_layer_arguments():
    with fluid.program_guard(fluid.Program(), fluid.Program()):
        x = fluid.layers.data(name="x", shape=[6], dtype="float32", lod_level=1)
        with pytest.raises(ValueError, match="size must be a positive multiple of 4"):
            fluid.layers.dynamic_lstm(x, size=6)
        with pytest.raises(ValueError, match=r"input of shape \[-1, 6\]: expected \[-1, 8\]"):
            fluid.layers.dynamic_lstm(x, size=8)
        with pytest.raises(ValueError, match=r"input of shape \[-1, 6\]: expected \[-1, 9\]"):
            fluid.layers.dynamic_gru(x, size=3)
        h0 = fluid.layers.data(name="h0", shape=[3], dtype="float32")
        with pytest.raises(ValueError, match=r"h_0 of shape \[-1, 3\]: expected \[-1, 2\]"):
            fluid.layers.dynamic_gru(x, size=2, h_0=h0)
        with pytest.raises(ValueError, match="filter_stride=2"):
            fluid.layers.sequence_conv(x, num_filters=2, filter_stride=2)
        with pytest.raises(TypeError, match="argument 'input' must be a Variable"):
            fluid.nets.sequence_conv_pool(np.zeros((2, 6)), num_filters=2, filter_size=3)
