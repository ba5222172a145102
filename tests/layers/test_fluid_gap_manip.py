"""Fluid 1.8's tensor-manipulation and channel layers (``pdjit.layers.manip``): values against
NumPy loops written here (one program, compiled and reference), gradients of the differentiable
ones against finite differences, and their argument errors."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError, LayerTypeError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.op_test import assert_native
from pdjit.testing.program_grad import check_program_grad

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(21)
X3 = RNG.normal(size=(2, 3, 4))
A, B, C = (RNG.normal(size=(4, 2)) for _ in range(3))
IDX = np.array([[2], [0], [1], [2]], np.int64)
M = RNG.normal(size=(2, 4, 2, 2))
PS = RNG.normal(size=(1, 8, 2, 2))
SC = RNG.normal(size=(1, 6, 1, 2))
LR = RNG.uniform(-1, 1, size=(1, 5, 2, 2))
TS = RNG.normal(size=(6, 4, 1, 2))
FLAGS = np.array([[True, True, False], [True, True, True]])


def np_pixel_shuffle(x, r):
    n, c, h, w = x.shape
    out = np.zeros((n, c // (r * r), h * r, w * r))
    for ch in range(c // (r * r)):
        for i in range(r):
            for j in range(r):
                out[:, ch, i::r, j::r] = x[:, ch * r * r + i * r + j]
    return out


def np_lrn(x, n, k, alpha, beta):
    c = x.shape[1]
    out = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (n - 1) // 2), min(c, ch - (n - 1) // 2 + n)
        out[:, ch] = x[:, ch] / (k + alpha * (x[:, lo:hi] ** 2).sum(1)) ** beta
    return out


def np_temporal_shift(x, t, ratio):
    nt, c = x.shape[:2]
    c1, c2 = int(c * ratio), int(c * 2 * ratio)
    v = x.reshape(nt // t, t, *x.shape[1:])
    out = np.zeros_like(v)
    for it in range(t):
        for ch in range(c):
            src = it - 1 if ch < c1 else (it + 1 if ch < c2 else it)
            if 0 <= src < t:
                out[:, it, ch] = v[:, src, ch]
    return out.reshape(x.shape)


def build():
    d = {name: fluid.data(name, list(v.shape), str(v.dtype))
         for name, v in dict(x3=X3, a=A, b=B, c=C, idx=IDX, m=M, ps=PS, sc=SC, lr=LR, ts=TS,
                             flags=FLAGS, dg=np.arange(3.0)).items()}
    L = fluid.layers
    outs = {
        "reverse": L.reverse(d["x3"], [0, 2]),
        "unstack1": L.unstack(d["x3"], axis=1)[1],
        "expand_as": L.expand_as(d["x3"], fluid.data("tgt", [4, 6, 4], "float64")),
        "rank": L.rank(d["x3"]),
        "size": L.size(d["x3"]),
        "crop": L.crop(d["x3"], shape=[1, 2, 3], offsets=[1, 1, 0]),
        "crop_tensor": L.crop_tensor(d["x3"], shape=[-1, 2, -1], offsets=[0, 1, 1]),
        "pad_like": L.pad_constant_like(d["x3"], L.slice(d["x3"], [0, 2], [0, 0], [1, 2]),
                                        pad_value=0.5),
        "eye": L.eye(2, 3, dtype="float64"),
        "eye_batch": L.eye(2, batch_shape=[2], dtype="float64"),
        "diag": L.diag(d["dg"]),
        "all": L.reduce_all(d["flags"], dim=1),
        "any": L.reduce_any(d["flags"]),
        "sum": L.sum([d["a"], d["b"], d["c"]]),
        "multiplex": L.multiplex([d["a"], d["b"], d["c"]], d["idx"]),
        "maxout": L.maxout(d["m"], groups=2),
        "pixel_shuffle": L.pixel_shuffle(d["ps"], 2),
        "shuffle_channel": L.shuffle_channel(d["sc"], 2),
        "lrn": L.lrn(d["lr"], n=3, k=2.0, alpha=0.5, beta=0.75),
        "temporal_shift": L.temporal_shift(d["ts"], seg_num=3, shift_ratio=0.25),
    }
    return outs


WANT = {
    "reverse": X3[::-1, :, ::-1],
    "unstack1": X3[:, 1],
    "expand_as": np.tile(X3, (2, 2, 1)),
    "rank": np.array([3], np.int32),
    "size": np.array([24], np.int64),
    "crop": X3[1:2, 1:3, 0:3],
    "crop_tensor": X3[:, 1:3, 1:],
    "pad_like": np.pad(X3[:1, :, :2], ((0, 1), (0, 0), (0, 2)), constant_values=0.5),
    "eye": np.eye(2, 3),
    "eye_batch": np.stack([np.eye(2)] * 2),
    "diag": np.diag(np.arange(3.0)),
    "all": np.array([False, True]),
    "any": np.array(True),
    "sum": A + B + C,
    "multiplex": np.stack([[A, B, C][IDX[i, 0]][i] for i in range(4)]),
    "maxout": np.stack([np.maximum(M[:, 2 * g], M[:, 2 * g + 1]) for g in range(2)], axis=1),
    "pixel_shuffle": np_pixel_shuffle(PS, 2),
    "shuffle_channel": SC[:, [0, 3, 1, 4, 2, 5]],
    "lrn": np_lrn(LR, 3, 2.0, 0.5, 0.75),
    "temporal_shift": np_temporal_shift(TS, 3, 0.25),
}


def test_manip_layers_against_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        outs = build()
    feed = dict(x3=X3, a=A, b=B, c=C, idx=IDX, m=M, ps=PS, sc=SC, lr=LR, ts=TS, flags=FLAGS,
                dg=np.arange(3.0), tgt=np.zeros((4, 6, 4)))
    for mode in ("compiled", "reference"):
        exe = Executor(mode=mode)
        got = exe.run(main, feed=feed, fetch_list=list(outs.values()), scope=Scope())
        if mode == "compiled":
            assert_native(exe, "manip layers")
        for name, g in zip(outs, got):
            w = WANT[name]
            g = np.asarray(g)
            assert g.dtype == np.asarray(w).dtype, f"{name} [{mode}]: dtype {g.dtype}"
            np.testing.assert_allclose(g.reshape(np.shape(w)), w, rtol=1e-6,
                                       err_msg=f"{name} [{mode}]")


@pytest.mark.parametrize("layer,value", [
    (lambda x: fluid.layers.lrn(x, n=3, k=2.0, alpha=0.5, beta=0.75), LR),
    (lambda x: fluid.layers.temporal_shift(
        fluid.layers.reverse(fluid.layers.pixel_shuffle(x, 2), [1]), seg_num=1), PS),
    (lambda x: fluid.layers.maxout(fluid.layers.shuffle_channel(x, 2), groups=2), M),
])
def test_manip_gradients(layer, value):
    def build_one():
        x = fluid.data("x", list(value.shape), "float64")
        x.stop_gradient = False
        return layer(x), [x]

    check_program_grad(build_one, {"x": value})


def test_manip_layer_errors():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 6, 2, 2], "float32")
        with pytest.raises(LayerInputError, match=r"pixel_shuffle: the channel count 6 must "
                                                  r"divide by upscale_factor\^2 = 4"):
            fluid.layers.pixel_shuffle(x, 2)
        with pytest.raises(LayerInputError, match=r"expand_as: each size of target_tensor"):
            fluid.layers.expand_as(x, fluid.data("t", [-1, 7, 2, 2], "float32"))
        with pytest.raises(LayerTypeError, match=r"reverse: argument 'axis'"):
            fluid.layers.reverse(x, "0")
        with pytest.raises(LayerInputError, match=r"crop: dimension 1: expected 0 <= offset"):
            fluid.layers.crop(x, shape=[-1, 4, 2, 2], offsets=[0, 3, 0, 0])


def test_more_layers_against_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids = fluid.data("ids", [6], "int64")
        img = fluid.data("img", [1, 2, 4, 6], "float64")
        fx = fluid.data("fx", [2, 3, 2, 2], "float64")
        fy = fluid.data("fy", [2, 2, 2, 2], "float64")
        bx = fluid.data("bx", [2, 3], "float64")
        by = fluid.data("by", [2, 2], "float64")
        sid = fluid.data("sid", [5, 1], "int64")
        u, ui = fluid.layers.unique(ids)
        uc = fluid.layers.unique_with_counts(ids, dtype="int64")
        outs = [u, ui, *uc, fluid.layers.image_resize_short(img, 2),
                fluid.layers.fsp_matrix(fx, fy),
                fluid.layers.bilinear_tensor_product(bx, by, size=2, bias_attr=False),
                fluid.layers.get_tensor_from_selected_rows(bx),
                fluid.layers.merge_selected_rows(bx),
                fluid.layers.shard_index(sid, index_num=20, nshards=2, shard_id=1)]
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    ids_v = np.array([2, 3, 3, 1, 5, 3], np.int64)
    fxv, fyv = RNG.normal(size=(2, 3, 2, 2)), RNG.normal(size=(2, 2, 2, 2))
    bxv, byv = RNG.normal(size=(2, 3)), RNG.normal(size=(2, 2))
    sidv = np.array([[16], [1], [10], [19], [9]], np.int64)
    feed = {"ids": ids_v, "img": RNG.normal(size=(1, 2, 4, 6)), "fx": fxv, "fy": fyv,
            "bx": bxv, "by": byv, "sid": sidv}
    got = exe.run(main, feed=feed, fetch_list=outs, scope=scope)
    w = np.asarray(scope.find_var("bilinear_tensor_product_0.w_0").value)
    want = [np.array([2, 3, 1, 5]), np.array([0, 1, 1, 2, 3, 1], np.int32),
            np.array([2, 3, 1, 5]), np.array([0, 1, 1, 2, 3, 1]), np.array([1, 3, 1, 1]),
            None,
            np.einsum("nchw,ndhw->ncd", fxv, fyv) / 4,
            np.stack([np.einsum("ni,ij,nj->n", bxv, w[k], byv) for k in range(2)], axis=1),
            bxv, bxv, np.array([[6], [-1], [0], [9], [-1]])]
    for k, (g, wv) in enumerate(zip(got, want)):
        if wv is None:
            assert g.shape == (1, 2, 2, 3)        # 4x6 -> shorter side 2, longer 3
            continue
        np.testing.assert_allclose(g, wv, rtol=1e-10, err_msg=f"output {k}")
        if wv.dtype.kind == "i":
            assert g.dtype == wv.dtype or k == 0 or k == 2, f"output {k}: {g.dtype}"


def test_last_batch_against_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [3, 4], "float64")
        idx = fluid.data("idx", [3, 1], "int64")
        upd = fluid.data("upd", [3, 4], "float64")
        pred = fluid.data("pred", [6], "int64")
        lab = fluid.data("lab", [6], "int64")
        theta = fluid.data("theta", [2, 2, 3], "float64")
        probs = fluid.data("probs", [4, 3], "float64")
        seq = fluid.data("seq", [-1, 2], "float64", lod_level=1)
        miou = fluid.layers.mean_iou(pred, lab, 3)
        outs = [fluid.layers.clip_by_norm(x, 1.0),
                fluid.layers.scatter_nd_add(x, idx, upd),
                fluid.layers.scatter_nd(idx, upd, [3, 4]),
                fluid.layers.strided_slice(x, [0, 1], [2, -1], [-4, 0], [-1, -2]),
                *miou,
                fluid.layers.affine_grid(theta, [2, 1, 2, 3]),
                fluid.layers.sampling_id(probs, seed=3),
                fluid.layers.randint(2, 5, shape=[50], seed=1),
                fluid.layers.interpolate(fluid.layers.reshape(x, [1, 1, 3, 4]), out_shape=[6, 8]),
                fluid.layers.lod_append(seq, [0, 1, 2, 3, 4, 5])]
    xv = RNG.normal(size=(3, 4))
    idxv = np.array([[2], [0], [2]], np.int64)
    updv = RNG.normal(size=(3, 4))
    th = RNG.normal(size=(2, 2, 3))
    pv, lv = np.array([0, 1, 1, 2, 0, 2]), np.array([0, 1, 2, 2, 1, 2])
    pr = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0, 1.0, 0]])
    from pdjit.runtime.tensor import LoDTensor
    feed = {"x": xv, "idx": idxv, "upd": updv, "pred": pv, "lab": lv, "theta": th,
            "probs": pr, "seq": LoDTensor(RNG.normal(size=(5, 2)), [[0, 2, 4, 5]])}
    got = Executor().run(main, feed=feed, fetch_list=outs, scope=Scope(), return_numpy=False)
    got = [np.asarray(g) for g in got[:-1]] + [got[-1]]
    snd = xv.copy()
    np.add.at(snd, idxv[:, 0], updv)
    zeros = np.zeros((3, 4))
    np.add.at(zeros, idxv[:, 0], updv)
    norm = np.sqrt((xv ** 2).sum())
    gx, gy = np.meshgrid(np.linspace(-1, 1, 3), np.linspace(-1, 1, 2))
    grid = np.stack([np.stack([t[0, 0] * gx + t[0, 1] * gy + t[0, 2],
                               t[1, 0] * gx + t[1, 1] * gy + t[1, 2]], -1) for t in th])
    # classes 0: 1 correct, 1 wrong (pred 0 / label 1 at 4); 1: 1 correct, 2 wrong; 2: 2, 1
    correct, wrong = np.array([1, 1, 2]), np.array([1, 2, 1])
    want = [xv * min(1.0, 1.0 / norm), snd, zeros, xv[2:-4:-1, -1:0:-2],
            [np.mean(correct / (correct + wrong))], wrong, correct, grid,
            np.array([0, 1, 2, 1])]
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[k], w, rtol=1e-6, err_msg=f"output {k}")
    r = got[9]
    assert r.dtype == np.int64 and r.min() >= 2 and r.max() <= 4 and len(set(r.tolist())) == 3
    assert got[10].shape == (1, 1, 6, 8)
    assert got[11].lod() == [[0, 2, 4, 5], [0, 1, 2, 3, 4, 5]]


def test_space_to_depth_as_fluids_kernel():
    x = RNG.normal(size=(2, 8, 4, 6))
    b, (n, c, h, w) = 2, x.shape
    out_c = c // (b * b)
    flat = np.zeros(x.size)
    for bi in range(n):                      # the kernel's index map, written out
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    c2, off = k % out_c, k // out_c
                    w2, h2 = i * b + off % b, j * b + off // b
                    flat[w2 + w * b * (h2 + h * b * (c2 + out_c * bi))] = x[bi, k, j, i]
    want = flat.reshape(n, c * b * b, h // b, w // b)

    def build_one():
        v = fluid.data("x", list(x.shape), "float64")
        v.stop_gradient = False
        return fluid.layers.space_to_depth(v, 2), [v]

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        out, _ = build_one()
    got, = Executor().run(main, feed={"x": x}, fetch_list=[out], scope=Scope())
    np.testing.assert_array_equal(got, want)
    check_program_grad(build_one, {"x": x})
