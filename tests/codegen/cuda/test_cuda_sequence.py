"""LoD on the device: the sequence ops' cuda lowerings (kernels reading the offsets' device
copy) against NumPy written here, and a LoD model trained on CUDAPlace(0) like on CPUPlace(),
its offsets copied in once per fed LoD (counted), never back."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cuda import device
from pdjit.runtime.tensor import LoDTensor
from pdjit.testing.op_test import CUDA, assert_native, check_output

R = np.random.RandomState(7)
F = np.float32
OFFS = [0, 2, 2, 5, 6]          # four sequences, the second empty
SEQS = [(OFFS[i], OFFS[i + 1]) for i in range(len(OFFS) - 1)]


def r(*shape):
    return R.randn(*shape).astype(F)


def _cuda(op, inputs, attrs, expected, **kw):
    return check_output(op, inputs, attrs, expected, modes=[CUDA],
                        outputs={k: 1 for k in expected}, **kw)


def _pool(x, pooltype, pad):
    out = np.full((len(SEQS),) + x.shape[1:], pad, F)
    idx = np.full(out.shape, -1, np.int32)
    for s, (b, e) in enumerate(SEQS):
        if e == b:
            continue
        seg = x[b:e].astype(np.float64)
        out[s] = {"SUM": seg.sum(0), "AVERAGE": seg.mean(0),
                  "SQRT": seg.sum(0) / np.sqrt(e - b), "MAX": seg.max(0),
                  "LAST": seg[-1], "FIRST": seg[0]}[pooltype]
        idx[s] = b + seg.argmax(0)
    return out, idx


def _pool_grad(x, g, idx, pooltype):
    dx = np.zeros_like(x)
    for s, (b, e) in enumerate(SEQS):
        if e == b:
            continue
        if pooltype in ("SUM", "AVERAGE", "SQRT"):
            scale = {"SUM": 1.0, "AVERAGE": 1.0 / (e - b), "SQRT": 1.0 / np.sqrt(e - b)}
            dx[b:e] = g[s] * scale[pooltype]
        elif pooltype == "MAX":
            for k in range(x.shape[1]):
                dx[idx[s, k], k] += g[s, k]
        else:
            dx[e - 1 if pooltype == "LAST" else b] = g[s]
    return dx


@pytest.mark.parametrize("pooltype", ["SUM", "AVERAGE", "SQRT", "MAX", "LAST", "FIRST"])
def test_sequence_pool_and_grad(pooltype):
    x, g = r(6, 3), r(4, 3)
    out, idx = _pool(x, pooltype, 0.5)
    want = {"Out": out}
    if pooltype == "MAX":
        want["MaxIndex"] = idx
    attrs = {"pooltype": pooltype, "pad_value": 0.5}
    _cuda("sequence_pool", {"X": (x, [OFFS])}, attrs, want, rtol=1e-5, atol=1e-6)
    inputs = {"X": (x, [OFFS]), "Out@GRAD": g}
    if pooltype == "MAX":
        inputs["MaxIndex"] = idx
    _cuda("sequence_pool_grad", inputs, attrs,
          {"X@GRAD": (_pool_grad(x, g, idx, pooltype), [OFFS])}, rtol=1e-5, atol=1e-6)


def test_sequence_softmax_and_grad():
    x, g = r(6, 1), r(6, 1)
    out = np.zeros_like(x)
    dx = np.zeros_like(x)
    for b, e in SEQS:
        if e > b:
            ex = np.exp(x[b:e] - x[b:e].max())
            out[b:e] = ex / ex.sum()
            dx[b:e] = out[b:e] * (g[b:e] - (out[b:e] * g[b:e]).sum())
    _cuda("sequence_softmax", {"X": (x, [OFFS])}, {}, {"Out": (out, [OFFS])},
          rtol=1e-5, atol=1e-6)
    _cuda("sequence_softmax_grad", {"X": (x, [OFFS]), "Out": (out, [OFFS]), "Out@GRAD": g}, {},
          {"X@GRAD": (dx, [OFFS])}, rtol=1e-5, atol=1e-6)


def test_sequence_expand_as_and_grad():
    x, y = r(4, 2, 2), r(6, 1)
    reps = np.diff(OFFS)
    out = np.repeat(x, reps, axis=0)
    _cuda("sequence_expand_as", {"X": x, "Y": (y, [OFFS])}, {}, {"Out": (out, [OFFS])})
    g = r(6, 2, 2)
    dx = np.stack([g[b:e].sum(0) for b, e in SEQS])
    _cuda("sequence_expand_as_grad", {"X": x, "Y": (y, [OFFS]), "Out@GRAD": g}, {},
          {"X@GRAD": dx}, rtol=1e-5, atol=1e-6)


def _expand_index(x_offs, ref_offs):
    """Rows of X in the order sequence_expand copies them: each sequence of X (each row, when
    X has no LoD) once per row of the matching sequence of Y."""
    idx = []
    for s in range(len(ref_offs) - 1):
        b, e = (x_offs[s], x_offs[s + 1]) if x_offs else (s, s + 1)
        for _ in range(ref_offs[s + 1] - ref_offs[s]):
            idx += list(range(b, e))
    return np.array(idx, np.int64)


@pytest.mark.parametrize("x_lod", [None, [0, 1, 3, 3, 4]])
def test_sequence_expand_and_grad(x_lod):
    ref = [0, 2, 3, 3, 5]
    x, y = r(4, 2), r(5, 1)
    idx = _expand_index(x_lod, ref)
    out, g = x[idx], r(len(idx), 2)
    dx = np.zeros_like(x)
    np.add.at(dx, idx, g)
    xin = x if x_lod is None else (x, [x_lod])
    want = out if x_lod is None else (out, [[0, 1, 2, 4, 5, 6]])
    _cuda("sequence_expand", {"X": xin, "Y": (y, [ref])}, {}, {"Out": want})
    _cuda("sequence_expand_grad", {"X": xin, "Y": (y, [ref]), "Out@GRAD": g}, {},
          {"X@GRAD": dx}, rtol=1e-5, atol=1e-6)


# ---- a LoD model trained on the device --------------------------------------------------------
LENS = [[2, 0, 3, 1]]


def _lod_model(pooltype):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 5
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [4], dtype="float32", lod_level=1)
        y = fluid.layers.data("y", [1], dtype="float32")
        h = fluid.layers.fc(x, 5, act="tanh")
        p = fluid.layers.sequence_pool(h, pooltype)
        o = fluid.layers.fc(p, 1)
        loss = fluid.layers.mean(fluid.layers.square_error_cost(o, y))
        fluid.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss


def _feeds():
    rs = np.random.RandomState(1)
    return [(fluid.create_lod_tensor(rs.randn(6, 4).astype(F), LENS, fluid.CPUPlace()),
             rs.randn(4, 1).astype(F)) for _ in range(3)]


def _train(place, pooltype):
    main, startup, loss = _lod_model(pooltype)
    scope = fluid.Scope()
    exe = fluid.Executor(place, strict=True)
    exe.run(startup, scope=scope)
    device.reset_transfers()
    device.forget_offsets()
    losses = [exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss], scope=scope)[0]
              for x, y in _feeds()]
    params = {n: np.asarray(scope.find_var(n).get_tensor())
              for n in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0")}
    return losses, params, exe, scope, main, loss


@pytest.mark.parametrize("pooltype", ["SQRT", "MAX"])
def test_lod_model_trains_like_the_cpu_with_offsets_on_the_device(pooltype):
    want, want_params, *_ = _train(fluid.CPUPlace(), pooltype)
    got, got_params, exe, scope, main, loss = _train(fluid.CUDAPlace(0), pooltype)
    t = device.transfers()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for n, w in want_params.items():
        np.testing.assert_allclose(got_params[n], w, rtol=1e-5, atol=1e-6, err_msg=n)
    # one device step (the sequence ops and their gradients included)
    steps = [s for (pid, _), (_, plan) in exe._plans.items() if pid == id(main)
             for s in plan.walk()]
    assert [(s.kind, s.device is not None) for s in steps] == [("native", True)], \
        [s.describe() for s in steps]
    assert assert_native(exe) >= 1
    # per run: x and y in, the loss out; the offsets once: each run's new LoDTensor has the
    # same sequence lengths, whose device copy serves (never copied back)
    assert (t["h2d"], t["d2h"]) == (3 * 2 + 1, 3), t
    # the same LoDTensor fed again: no copy of its offsets
    x, y = _feeds()[0]
    device.reset_transfers()
    exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss], scope=scope)
    assert (device.transfers()["h2d"], device.transfers()["d2h"]) == (2, 1), device.transfers()
    # other sequence lengths: their offsets are copied in once with the feed
    x2 = fluid.create_lod_tensor(np.asarray(x), [[1, 1, 3, 1]], fluid.CPUPlace())
    device.reset_transfers()
    exe.run(main, feed={"x": x2, "y": y}, fetch_list=[loss], scope=scope)
    assert device.transfers()["h2d"] == 3, device.transfers()


def test_a_fetched_lod_value_keeps_its_offsets_and_stays_on_the_device():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [1], dtype="float32", lod_level=1)
        s = fluid.layers.sequence_softmax(x)
    x = r(6, 1)
    exe = fluid.Executor(fluid.CUDAPlace(0), strict=True)
    device.reset_transfers()
    (got,) = exe.run(main, feed={"x": fluid.create_lod_tensor(x, LENS, fluid.CPUPlace())},
                     fetch_list=[s], return_numpy=False)
    assert isinstance(got, LoDTensor) and device.is_device_array(got._array)
    assert got.lod() == [OFFS]
    assert device.transfers()["d2h"] == 0
    np.testing.assert_allclose(np.asarray(got)[0:2].sum(), 1.0, rtol=1e-5)
