"""The Paddle 2.0-preview functions Fluid 1.8 documents under fluid.layers
(``pdjit.layers.preview``): values against NumPy in one program (compiled and reference),
gradients of the composed differentiable ones by finite differences."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.op_test import assert_native
from pdjit.testing.program_grad import check_program_grad

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(13)
A = RNG.normal(size=(3, 3))
B = RNG.normal(size=(3, 3))
V = RNG.normal(size=(2, 3))
W = RNG.normal(size=(2, 3))
BA = RNG.normal(size=(2, 2, 3))
BB = RNG.normal(size=(2, 3, 2))
P = np.array([0.5, 0.0, 2.0, 0.0])
IDX = np.array([[2, 0], [1, 1], [0, 2]], np.int64)


def build():
    L = fluid.layers
    d = {k: fluid.data(k, list(v.shape), str(v.dtype))
         for k, v in dict(a=A, b=B, v=V, w=W, ba=BA, bb=BB, p=P, idx=IDX,
                          sel=np.array([1, 0, 2], np.int64),
                          mask=np.array([True, False, True, True])).items()}
    mg = L.meshgrid([L.slice(d["p"], [0], [0], [2]), L.slice(d["p"], [0], [0], [3])])
    return {
        "addcmul": L.addcmul(d["a"], d["b"], d["a"], value=0.5),
        "addmm": L.addmm(d["a"], d["a"], d["b"], alpha=2.0, beta=0.5),
        "allclose": L.allclose(d["a"], L.scale(d["a"], scale=1.0 + 1e-9)),
        "allclose_no": L.allclose(d["a"], d["b"]),
        "arange": L.arange(1, 7, 2),
        "bmm": L.bmm(d["ba"], d["bb"]),
        "clamp": L.clamp(d["a"], min=-0.5),
        "cross": L.cross(d["v"], d["w"], dim=1),
        "dist2": L.dist(d["v"], d["w"]),
        "dist0": L.dist(d["p"], L.scale(d["p"], scale=0.0), p=0),
        "distinf": L.dist(d["v"], d["w"], p=float("inf")),
        "dot": L.dot(d["v"], d["w"]),
        "eq": L.elementwise_equal(d["a"], d["a"]),
        "flip": L.flip(d["a"], [1]),
        "full": L.full([2, 2], 3.0),
        "full_like": L.full_like(d["v"], 1.5),
        "index_select": L.index_select(d["a"], d["sel"], dim=1),
        "index_sample": L.index_sample(d["a"], d["idx"]),
        "kron": L.kron(d["v"], d["w"]),
        "log1p": L.log1p(d["p"]),
        "logsumexp": L.logsumexp(d["a"], dim=1),
        "masked_select": L.masked_select(d["p"], d["mask"]),
        "meshgrid0": mg[0], "meshgrid1": mg[1],
        "nonzero": L.nonzero(d["p"]),
        "roll": L.roll(d["a"], 1, dims=0),
        "roll_flat": L.roll(d["v"], 2),
        "t": L.t(d["v"]),
        "trace": L.trace(d["a"], offset=1),
        "tril": L.tril(d["a"]),
        "triu": L.triu(d["a"], diagonal=1),
        "diag_embed": L.diag_embed(d["v"]),
    }


def np_cross(v, w):
    return np.cross(v, w, axis=1)


WANT = {
    "addcmul": A + 0.5 * B * A, "addmm": 0.5 * A + 2.0 * A @ B,
    "allclose": np.array([True]), "allclose_no": np.array([False]),
    "arange": np.array([1, 3, 5]), "bmm": BA @ BB, "clamp": np.maximum(A, -0.5),
    "cross": np_cross(V, W), "dist2": [np.sqrt(((V - W) ** 2).sum())], "dist0": [2.0],
    "distinf": [np.abs(V - W).max()], "dot": (V * W).sum(1, keepdims=True),
    "eq": np.ones((3, 3), bool), "flip": A[:, ::-1], "full": np.full((2, 2), 3.0, np.float32),
    "full_like": np.full((2, 3), 1.5), "index_select": A[:, [1, 0, 2]],
    "index_sample": np.take_along_axis(A, IDX, 1), "kron": np.kron(V, W),
    "log1p": np.log1p(P), "logsumexp": np.log(np.exp(A).sum(1)),
    "masked_select": P[[0, 2, 3]],
    "meshgrid0": np.meshgrid(P[:2], P[:3], indexing="ij")[0],
    "meshgrid1": np.meshgrid(P[:2], P[:3], indexing="ij")[1],
    "nonzero": np.array([[0], [2]]), "roll": np.roll(A, 1, axis=0),
    "roll_flat": np.roll(V.reshape(-1), 2).reshape(2, 3), "t": V.T,
    "trace": [np.trace(A, offset=1)], "tril": np.tril(A), "triu": np.triu(A, 1),
    "diag_embed": np.stack([np.diag(r) for r in V]),
}


def test_preview_functions_against_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        outs = build()
    feed = dict(a=A, b=B, v=V, w=W, ba=BA, bb=BB, p=P, idx=IDX, sel=np.array([1, 0, 2]),
                mask=np.array([True, False, True, True]))
    for mode in ("compiled", "reference"):
        exe = Executor(mode=mode)
        got = exe.run(main, feed=feed, fetch_list=list(outs.values()), scope=Scope())
        if mode == "compiled":
            assert_native(exe, "preview")
        for name, g in zip(outs, got):
            want = np.asarray(WANT[name])
            np.testing.assert_allclose(np.asarray(g).reshape(want.shape), want, rtol=1e-7,
                                       err_msg=f"{name} [{mode}]")


@pytest.mark.parametrize("fn", [
    lambda x: fluid.layers.logsumexp(fluid.layers.kron(x, x), dim=0),
    lambda x: fluid.layers.cross(fluid.layers.roll(fluid.layers.triu(x), 1, dims=1), x, dim=0),
])
def test_preview_gradients(fn):
    def build_one():
        x = fluid.data("x", [3, 3], "float64")
        x.stop_gradient = False
        return fn(x), [x]

    check_program_grad(build_one, {"x": A})


def test_preview_errors():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 3], "float32")
        assert list(fluid.layers.kron(x, x).shape) == [-1, 9]     # the kron op: sizes may be -1
        assert list(fluid.layers.diag_embed(x, offset=1).shape) == [-1, 4, 4]
        with pytest.raises(LayerInputError, match=r"diag_embed: dim1 and dim2 must differ"):
            fluid.layers.diag_embed(x, dim1=0, dim2=-3)
