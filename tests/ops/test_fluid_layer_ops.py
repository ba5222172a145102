"""The ops Fluid 1.8's layers append under names of their own (``ops/fluid_layer_ops.py``):
an inference model PaddlePaddle 3.3.1 saved with them (``tests/fixtures/paddle/
fluid_layer_ops.*``, recorded by ``tests/fixtures/make_fluid_layer_ops_fixture.py``) loads and
runs, its outputs and the gradients pdjit's backward pass computes on it equal Paddle's; the
values equal NumPy written here; and the layers append these op types."""
import json

import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing import check_output

PADDLE = __import__("pathlib").Path(__file__).parents[1] / "fixtures" / "paddle"

# the ops run their NumPy definitions in compiled plans, by design
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")


# ---- NumPy, written here -----------------------------------------------------------------------
def np_maxout(x, groups, axis):
    x = np.moveaxis(x, axis, 1)
    n, c, h, w = x.shape
    out = np.empty((n, c // groups, h, w), x.dtype)
    for i in range(c // groups):
        out[:, i] = x[:, i * groups:(i + 1) * groups].max(axis=1)
    return np.moveaxis(out, 1, axis)


def np_lrn(x, n, k, alpha, beta):
    c = x.shape[1]
    mid = np.full(x.shape, k, np.float64)
    for ch in range(c):
        for j in range(ch - (n - 1) // 2, ch - (n - 1) // 2 + n):
            if 0 <= j < c:
                mid[:, ch] += alpha * x[:, j].astype(np.float64) ** 2
    return x * mid ** -beta


def np_pixel_shuffle(x, r):
    n, c, h, w = x.shape
    out = np.empty((n, c // (r * r), h * r, w * r), x.dtype)
    for co in range(c // (r * r)):
        for i in range(r):
            for j in range(r):
                out[:, co, i::r, j::r] = x[:, co * r * r + i * r + j]
    return out


def np_shuffle_channel(x, group):
    c = x.shape[1]
    m = c // group
    out = np.empty_like(x)
    for gi in range(group):
        for k in range(m):
            out[:, k * group + gi] = x[:, gi * m + k]
    return out


def np_temporal_shift(x, seg_num, ratio):
    nt, c, h, w = x.shape
    c1, c2 = int(c * ratio), int(c * 2 * ratio)
    out = np.zeros_like(x)
    for b in range(nt // seg_num):
        for t in range(seg_num):
            row = b * seg_num + t
            if t > 0:
                out[row, :c1] = x[row - 1, :c1]
            if t < seg_num - 1:
                out[row, c1:c2] = x[row + 1, c1:c2]
            out[row, c2:] = x[row, c2:]
    return out


def np_space_to_depth(x, b):
    """Fluid's (darknet's reorg): channel (oy * b + ox) * C' + c at (j, i) goes to row
    j * b + oy, column i * b + ox of channel c of an [N, C', H b, W b] array, read as
    [N, C b^2, H / b, W / b]."""
    n, c, h, w = x.shape
    cp = c // (b * b)
    big = np.empty((n, cp, h * b, w * b), x.dtype)
    for oy in range(b):
        for ox in range(b):
            for ch in range(cp):
                big[:, ch, oy::b, ox::b] = x[:, (oy * b + ox) * cp + ch]
    return big.reshape(n, c * b * b, h // b, w // b)


def np_label_smooth(x, eps, prior=None):
    return (1 - eps) * x + eps * (prior if prior is not None else 1.0 / x.shape[-1])


# ---- PaddlePaddle's saved model ---------------------------------------------------------------
def test_a_model_paddle_saved_with_these_ops_runs_and_differentiates_as_paddle():
    meta = json.loads((PADDLE / "fluid_layer_ops.json").read_text())
    io = np.load(PADDLE / "fluid_layer_ops_io.npz")
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    with fluid.scope_guard(scope):
        program, feed_names, fetch_targets = fluid.io.load_inference_model(
            str(PADDLE / "fluid_layer_ops.pdmodel"), exe)
    types = {op.type for op in program.global_block().ops}
    assert {"label_smooth", "maxout", "lrn", "pixel_shuffle", "shuffle_channel",
            "temporal_shift", "flip", "tril_triu", "clip_by_norm", "size", "reduce_all",
            "reduce_any"} <= types
    feed = {n: io[n] for n in feed_names}
    got = exe.run(program, feed=feed, fetch_list=fetch_targets, scope=scope)
    assert [t.name for t in fetch_targets] == [meta["fetch"][f"out_{i}"]
                                               for i in range(len(fetch_targets))]
    for i, value in enumerate(got):
        want = io[f"out_{i}"]
        assert value.dtype == want.dtype and value.shape == want.shape, (i, value.shape)
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6, err_msg=f"out_{i}")

    # the same values from NumPy written here
    x = {n: io[f"{n}_x"] for n in meta["cases"]}
    np.testing.assert_array_equal(got[0], np_maxout(x["maxout"], 3, 1))
    np.testing.assert_array_equal(got[1], np_maxout(x["maxout_last"], 2, 3))
    np.testing.assert_allclose(got[2], np_lrn(x["lrn"], 5, 1.0, 0.05, 0.75), rtol=1e-5)
    np.testing.assert_array_equal(got[3], np_pixel_shuffle(x["pixel_shuffle"], 2))
    np.testing.assert_array_equal(got[4], np_shuffle_channel(x["shuffle_channel"], 3))
    np.testing.assert_array_equal(got[5], np_temporal_shift(x["temporal_shift"], 2, 0.25))
    np.testing.assert_array_equal(got[6], x["flip"][::-1, :, ::-1])
    np.testing.assert_array_equal(got[7], np.tril(x["tril"], 1))
    np.testing.assert_array_equal(got[8], np.triu(x["triu"], -1))
    norm = np.sqrt((x["clip_by_norm"].astype(np.float64) ** 2).sum())
    np.testing.assert_allclose(got[9], x["clip_by_norm"] / max(norm, 1.0), rtol=1e-6)
    np.testing.assert_allclose(got[10], np_label_smooth(x["label_smooth"], 0.1), rtol=1e-6)
    np.testing.assert_allclose(got[11], np_label_smooth(io["prior_y"], 0.2, io["prior_p"]),
                               rtol=1e-6)
    np.testing.assert_array_equal(got[12], io["flags"].all(axis=1))
    np.testing.assert_array_equal(got[13], io["flags"].any(axis=0, keepdims=True))
    assert got[14].shape == () and int(got[14]) == x["maxout"].size     # 0-d, as 3.x saved it

    # pdjit's backward pass on Paddle's program: the gradients of sum(w * out) equal Paddle's
    block = program.global_block()
    with fluid.program_guard(program, fluid.Program()):
        grads_of = [(n, block.var(f"{n}_x"), target) for n, target in
                    zip(meta["cases"], fetch_targets) if f"grad_{n}" in io]
        losses = []
        for n, _, out in grads_of:
            w = fluid.layers.assign(io[f"w_{n}"])
            losses.append(fluid.layers.reduce_sum(fluid.layers.elementwise_mul(out, w)))
        grads = fluid.gradients([fluid.layers.sums(losses)], [v for _, v, _ in grads_of])
    got = exe.run(program, feed=feed, fetch_list=grads, scope=scope)
    assert len(grads_of) == 10
    for (n, _, _), g in zip(grads_of, got):
        if n == "shuffle_channel":
            # Paddle 3.3.1's shuffle_channel_grad applies the forward permutation to the output
            # gradient again; the gradient is its inverse (they agree only when group equals
            # C / group). pdjit gives the inverse, as finite differences do (op_samples).
            w = io["w_shuffle_channel"]
            np.testing.assert_array_equal(io["grad_shuffle_channel"], np_shuffle_channel(w, 3))
            np.testing.assert_array_equal(g, np_shuffle_channel(w, 2))   # C/g = 2: the inverse
            continue
        np.testing.assert_allclose(g, io[f"grad_{n}"], rtol=1e-5, atol=1e-6, err_msg=n)


# ---- pdjit's layers append the Fluid op types -------------------------------------------------
def test_layers_append_fluids_op_types_and_compute_what_numpy_does(fresh_programs, tmp_path):
    main, _ = fresh_programs
    L = fluid.layers
    img = L.data(name="img", shape=[8, 4, 4], dtype="float32")
    vid = L.data(name="vid", shape=[4, 2, 2], dtype="float32")
    prob = L.data(name="prob", shape=[5], dtype="float32")
    ids = L.data(name="ids", shape=[1], dtype="int64")
    outs = [L.maxout(img, groups=2), L.lrn(img, n=3, k=2.0, alpha=0.1, beta=0.5),
            L.pixel_shuffle(img, 2), L.shuffle_channel(img, 4), L.space_to_depth(img, 2),
            L.temporal_shift(vid, seg_num=2, shift_ratio=0.25),
            L.label_smooth(prob, epsilon=0.1), L.one_hot(ids, depth=5),
            L.clip_by_norm(prob, max_norm=0.5), L.size(img), L.flip(img, [1]),
            L.triu(L.reshape(prob, [-1, 5]), 1),
            L.expand_as(prob, L.concat([prob, prob], axis=1))]
    types = [op.type for op in main.global_block().ops]
    for t in ("maxout", "lrn", "pixel_shuffle", "shuffle_channel", "space_to_depth",
              "temporal_shift", "label_smooth", "one_hot", "clip_by_norm", "size", "flip",
              "tril_triu", "expand_as"):
        assert t in types, (t, types)
    rng = np.random.default_rng(5)
    feed = {"img": rng.uniform(-1, 1, (2, 8, 4, 4)).astype("float32"),
            "vid": rng.uniform(-1, 1, (4, 4, 2, 2)).astype("float32"),
            "prob": rng.dirichlet(np.ones(5), 2).astype("float32"),
            "ids": np.array([[3], [0]], np.int64)}
    exe = fluid.Executor(fluid.CPUPlace())
    got = exe.run(main, feed=feed, fetch_list=outs)
    x, p = feed["img"], feed["prob"]
    want = [np_maxout(x, 2, 1), np_lrn(x, 3, 2.0, 0.1, 0.5), np_pixel_shuffle(x, 2),
            np_shuffle_channel(x, 4), np_space_to_depth(x, 2),
            np_temporal_shift(feed["vid"], 2, 0.25), np_label_smooth(p, 0.1),
            np.eye(5, dtype="float32")[[3, 0]],
            p * min(1.0, 0.5 / np.sqrt((p.astype(np.float64) ** 2).sum())),
            np.array([x.size]), x[:, ::-1], np.triu(p, 1), np.tile(p, (1, 2))]
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")
    assert got[9].shape == (1,) and got[9].dtype == np.int64

    # saved and loaded, the program keeps the op types and computes the same
    fluid.io.save_inference_model(str(tmp_path / "m"), ["img", "vid", "prob", "ids"], outs,
                                  exe, main_program=main)
    with fluid.scope_guard(fluid.Scope()):
        program, names, targets = fluid.io.load_inference_model(str(tmp_path / "m"), exe)
        assert {"maxout", "lrn", "label_smooth", "one_hot"} <= {
            op.type for op in program.global_block().ops}
        again = exe.run(program, feed=feed, fetch_list=targets)
    for g, a in zip(got, again):
        np.testing.assert_array_equal(g, a)


def test_maxout_gradient_goes_to_the_first_maximum_and_lrn_errors_name_the_op():
    x = np.array([[[[1.0]], [[3.0]], [[3.0]], [[2.0]]]])          # [1, 4, 1, 1], a tie
    check_output("maxout", {"X": x}, {"groups": 2, "axis": 1},
                 {"Out": np.array([[[[3.0]], [[3.0]]]])})
    from pdjit.testing import run_op
    g = run_op("maxout_grad", {"X": x, "Out": np.array([[[[3.0]], [[3.0]]]]),
                               "Out@GRAD": np.array([[[[1.0]], [[2.0]]]])},
               {"groups": 2, "axis": 1})["X@GRAD"]
    np.testing.assert_array_equal(g.reshape(-1), [0.0, 1.0, 2.0, 0.0])
    with pytest.raises(Exception, match="lrn"):
        fluid.layers.lrn(fluid.layers.data(name="v", shape=[3], dtype="float32"))


# ---- more ops, one program each, against PaddlePaddle 3.3.1 -----------------------------------
MORE = json.loads((PADDLE / "fluid_layer_ops_more.json").read_text())["cases"]


@pytest.mark.parametrize("name", sorted(MORE))
def test_op_matches_paddle_forward_and_backward(name, fresh_programs):
    case = MORE[name]
    io = np.load(PADDLE / "fluid_layer_ops_more.npz")
    main, _ = fresh_programs
    helper = fluid.layers.LayerHelper(case["op"])
    feed, inputs = {}, {}
    for slot in case["inputs"]:
        value = io[f"{name}/{slot}"]
        v = fluid.data(f"{name}_{slot}", list(value.shape), str(value.dtype))
        v.stop_gradient = slot not in case["grad"]
        inputs[slot] = [v]
        feed[v.name] = value
    want = io[f"{name}/out"]
    out = helper.create_variable_for_type_inference(str(want.dtype))
    helper.append_op(case["op"], inputs=inputs, outputs={case["out"]: [out]},
                     attrs=case["attrs"])
    fetch = [out]
    if f"{name}/w" in io:
        w = fluid.layers.assign(io[f"{name}/w"])
        loss = fluid.layers.reduce_sum(fluid.layers.elementwise_mul(out, w))
        fetch += fluid.gradients([loss], [inputs[s][0] for s in case["grad"]])
    got = fluid.Executor(fluid.CPUPlace()).run(main, feed=feed, fetch_list=fetch)
    if want.ndim == 0:       # a full reduction: 0-d as 3.x declares it, [1] from LayerHelper
        assert got[0].shape == (1,)
        got[0] = got[0].reshape(())
    assert got[0].dtype == want.dtype and got[0].shape == want.shape
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    for slot, g in zip(case["grad"], got[1:]):
        np.testing.assert_allclose(g, io[f"{name}/grad_{slot}"], rtol=1e-5, atol=1e-6,
                                   err_msg=slot)


def test_more_ops_against_numpy():
    """The same inputs through NumPy written here."""
    io = np.load(PADDLE / "fluid_layer_ops_more.npz")
    x = io["kron/X"]
    np.testing.assert_allclose(io["kron/out"], np.kron(x, io["kron/Y"]), rtol=1e-6)
    np.testing.assert_array_equal(io["roll/out"], np.roll(io["roll/X"], (1, -2), (0, 2)))
    np.testing.assert_array_equal(io["index_sample/out"], np.take_along_axis(
        io["index_sample/X"], io["index_sample/Index"], 1))
    np.testing.assert_array_equal(io["crop_tensor/out"], io["crop_tensor/X"][1:3, 2:])
    np.testing.assert_allclose(io["trace/out"], np.trace(io["trace/Input"], 1, 1, 2),
                               rtol=1e-6)
    theta = io["affine_grid_half/Theta"][0]
    xs, ys = np.array([-2 / 3, 0, 2 / 3]), np.array([-0.5, 0.5])     # pixel centres, W 3, H 2
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            np.testing.assert_allclose(io["affine_grid_half/out"][0, i, j],
                                       theta @ [xv, yv, 1.0], rtol=1e-5, atol=1e-6)
    ids = io["shard_index/X"]
    np.testing.assert_array_equal(io["shard_index/out"], np.where(ids // 3 == 1, ids - 3, -1))


def test_unstack_multiplex_meshgrid_pad_constant_like_fsp_layers(fresh_programs):
    main, _ = fresh_programs
    L = fluid.layers
    a = fluid.data("a", [3, 2], "float64")
    b = fluid.data("b", [3, 2], "float64")
    ids = fluid.data("ids", [3, 1], "int32")
    v = fluid.data("v", [2], "float64")
    w = fluid.data("w", [3], "float64")
    x = fluid.data("x", [2, 3, 2, 2], "float64")
    y = fluid.data("y", [2, 2, 2, 2], "float64")
    for t in (a, b, v, w, x, y):
        t.stop_gradient = False
    parts = L.unstack(a, axis=1)
    mux = L.multiplex([a, b], ids)
    gx, gy = L.meshgrid([v, w])
    padded = L.pad_constant_like(L.concat([a, a], axis=1), b, pad_value=0.5)
    fsp = L.fsp_matrix(x, y)
    types = [op.type for op in main.global_block().ops]
    for t in ("unstack", "multiplex", "meshgrid", "pad_constant_like", "fsp"):
        assert t in types
    outs = parts + [mux, gx, gy, padded, fsp]
    loss = L.sums([L.reduce_sum(L.elementwise_mul(o, o)) for o in outs])
    grads = fluid.gradients([loss], [a, b, v, w, x, y])
    rng = np.random.default_rng(2)
    feed = {"a": rng.normal(size=(3, 2)), "b": rng.normal(size=(3, 2)),
            "ids": np.array([[1], [0], [1]], np.int32), "v": rng.normal(size=2),
            "w": rng.normal(size=3), "x": rng.normal(size=(2, 3, 2, 2)),
            "y": rng.normal(size=(2, 2, 2, 2))}
    got = fluid.Executor(fluid.CPUPlace()).run(main, feed=feed, fetch_list=outs + grads)
    A, B = feed["a"], feed["b"]
    sel = np.array([1, 0, 1])
    want_mux = np.where(sel[:, None] == 1, B, A)
    X, Y = feed["x"].reshape(2, 3, 4), feed["y"].reshape(2, 2, 4)
    want = [A[:, 0], A[:, 1], want_mux, np.repeat(feed["v"][:, None], 3, 1),
            np.repeat(feed["w"][None], 2, 0), np.pad(B, [(0, 0), (0, 2)], constant_values=0.5),
            X @ Y.transpose(0, 2, 1) / 4]
    for i, (g, wv) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, wv, rtol=1e-12, err_msg=f"output {i}")
    ga, gb, gv, gw, gxx, gyy = got[len(outs):]
    # d/dA: unstack (2A), multiplex rows that chose A (2A)
    np.testing.assert_allclose(ga, 2 * A + 2 * np.where(sel[:, None] == 0, A, 0), rtol=1e-12)
    np.testing.assert_allclose(gb, 2 * np.where(sel[:, None] == 1, B, 0) + 2 * B, rtol=1e-12)
    np.testing.assert_allclose(gv, 2 * 3 * feed["v"], rtol=1e-12)
    np.testing.assert_allclose(gw, 2 * 2 * feed["w"], rtol=1e-12)
    F = X @ Y.transpose(0, 2, 1) / 4
    np.testing.assert_allclose(gxx, (2 * F @ Y / 4).reshape(x.shape), rtol=1e-12)
    np.testing.assert_allclose(gyy, (2 * F.transpose(0, 2, 1) @ X / 4).reshape(y.shape),
                               rtol=1e-12)


def test_random_batch_size_like_layers(fresh_programs):
    """The batch comes from the input at run time; the draws have the distribution's moments
    and bounds; a fixed seed draws the same numbers every run."""
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    u = fluid.layers.uniform_random_batch_size_like(x, [-1, 500], min=-2.0, max=1.0, seed=5)
    g = fluid.layers.gaussian_random_batch_size_like(x, shape=[-1, 500], mean=1.0, std=0.5,
                                                     dtype="float64")
    assert [op.type for op in main.global_block().ops] == [
        "uniform_random_batch_size_like", "gaussian_random_batch_size_like"]
    exe = fluid.Executor(fluid.CPUPlace())
    feed = {"x": np.zeros((8, 3), "float32")}
    u1, g1 = exe.run(main, feed=feed, fetch_list=[u, g])
    u2, g2 = exe.run(main, feed=feed, fetch_list=[u, g])
    assert u1.shape == (8, 500) and u1.dtype == np.float32 and g1.dtype == np.float64
    assert u1.min() >= -2.0 and u1.max() < 1.0 and abs(u1.mean() + 0.5) < 0.05
    assert abs(u1.std() - 3 / np.sqrt(12)) < 0.03
    assert abs(g1.mean() - 1.0) < 0.03 and abs(g1.std() - 0.5) < 0.03
    np.testing.assert_array_equal(u1, u2)                 # seed 5: the same every run
    assert not np.array_equal(g1, g2)                     # seed 0: the program's stream


def test_randint_and_randperm_layers(fresh_programs):
    main, _ = fresh_programs
    ints = fluid.layers.randint(-2, 3, shape=[50, 40], seed=3)
    perm = fluid.layers.randperm(7, dtype="int32")
    assert [op.type for op in main.global_block().ops] == ["randint", "randperm"]
    exe = fluid.Executor(fluid.CPUPlace())
    a, p = exe.run(main, fetch_list=[ints, perm])
    b, _ = exe.run(main, fetch_list=[ints, perm])
    assert a.dtype == np.int64 and a.shape == (50, 40) and p.dtype == np.int32
    counts = np.bincount(a.reshape(-1) + 2, minlength=5)
    assert counts.size == 5 and abs(counts / a.size - 0.2).max() < 0.03   # uniform on [-2, 3)
    assert sorted(p.tolist()) == list(range(7))
    np.testing.assert_array_equal(a, b)                    # seed 3: the same every run


def test_hash_is_fluids_xxh64():
    """The hash layer's op on int32 and int64 rows of 1 to 9 ids (4 to 72 bytes: every branch
    of XXH64) equals what PaddlePaddle 3.3.1 computed; and XXH64 itself on the reference
    vectors of the xxHash project (the empty input, seeds 0 and 1)."""
    from pdjit.ops.fluid_layer_ops import xxh64

    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"", 1) == 0xD5AFBA1336A3BE4B
    io = np.load(PADDLE / "fluid_layer_ops_hash.npz")
    for case in sorted({k.split("/")[0] for k in io}):
        x = io[f"{case}/x"]
        main, startup = fluid.Program(), fluid.Program()
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            v = fluid.data("x", list(x.shape), str(x.dtype))
            out = fluid.layers.hash(v, hash_size=100000, num_hash=3)
        got, = fluid.Executor(fluid.CPUPlace()).run(main, feed={"x": x}, fetch_list=[out])
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, io[f"{case}/out"], err_msg=case)


def test_similarity_focus_as_fluids_documentation_shows(fresh_programs):
    """The example of Fluid 1.8's documentation (axis 1, indexes [0]), and a case by hand
    along axis 2 with two indexes OR-ed."""
    main, _ = fresh_programs
    x = fluid.data("x", [2, 3, 2, 2], "float32")
    y = fluid.data("y", [1, 2, 2, 3], "float64")
    out = fluid.layers.similarity_focus(x, axis=1, indexes=[0])
    out2 = fluid.layers.similarity_focus(y, axis=2, indexes=[0, 1])
    xv = np.array([[[[0.8, 0.1], [0.4, 0.5]], [[0.9, 0.7], [0.9, 0.9]],
                    [[0.8, 0.9], [0.1, 0.2]]],
                   [[[0.2, 0.5], [0.3, 0.4]], [[0.9, 0.7], [0.8, 0.4]],
                    [[0.0, 0.2], [0.4, 0.7]]]], "float32")
    # y[0, :, 0, :] = [[5, 1, 0], [2, 4, 3]] -> 5 at (0, 0), then 4 at (1, 1)
    # y[0, :, 1, :] = [[0, 0, 9], [8, 0, 0]] -> 9 at (0, 2), then 8 at (1, 0)
    yv = np.array([[[[5, 1, 0], [0, 0, 9]], [[2, 4, 3], [8, 0, 0]]]], "float64")
    got, got2 = fluid.Executor(fluid.CPUPlace()).run(main, feed={"x": xv, "y": yv},
                                                     fetch_list=[out, out2])
    eye, anti = np.eye(2), np.eye(2)[::-1]
    np.testing.assert_array_equal(got, np.stack([np.stack([eye] * 3), np.stack([anti] * 3)]))
    mask = np.array([[1, 0, 1], [1, 1, 0]], "float64")
    np.testing.assert_array_equal(got2, np.stack([mask, mask], axis=1)[None])


def test_bipartite_match_as_paddle():
    """LoD and plain distance matrices, both match types, against PaddlePaddle 3.3.1."""
    io = np.load(PADDLE / "fluid_layer_ops_bipartite.npz")
    for case in ("lod_bipartite", "lod_per_prediction", "plain_bipartite"):
        dist, lod = io[f"{case}/dist"], io[f"{case}/lod"].tolist()
        main, startup = fluid.Program(), fluid.Program()
        with fluid.program_guard(main, startup), fluid.unique_name.guard():
            d = fluid.data("d", [-1, 5], "float32", lod_level=1 if lod else 0)
            idx, md = fluid.layers.bipartite_match(
                d, "per_prediction" if "per_prediction" in case else None, 0.3)
        feed = fluid.create_lod_tensor(dist, [list(np.diff(lod))], fluid.CPUPlace()) \
            if lod else dist
        got_idx, got_dist = fluid.Executor(fluid.CPUPlace()).run(
            main, feed={"d": feed}, fetch_list=[idx, md])
        np.testing.assert_array_equal(got_idx, io[f"{case}/indices"], err_msg=case)
        np.testing.assert_allclose(got_dist, io[f"{case}/match_dist"], rtol=1e-6, err_msg=case)
    # by hand: 0.9 pairs row 1 with column 0, then 0.7 row 0 with column 2; column 1 stays
    # unmatched (row 0's 0.6 lost its row), unless per_prediction with threshold 0.5
    from pdjit.ops.fluid_layer_ops import _bm_one
    d = np.array([[0.6, 0.6, 0.7], [0.9, 0.0, 0.2]], "float32")
    idx, dist = _bm_one(d, "bipartite", 0.5)
    assert idx.tolist() == [1, -1, 0] and dist.tolist() == [d[1, 0], 0.0, d[0, 2]]
    assert _bm_one(d, "per_prediction", 0.5)[0].tolist() == [1, 0, 0]


def test_target_assign_by_hand(fresh_programs):
    """Two instances (2 and 1 rows of X), matches, misses and negatives, as Fluid 1.8's
    documentation defines the op."""
    main, _ = fresh_programs
    x = fluid.data("x", [-1, 2, 3], "float32", lod_level=1)
    match = fluid.data("match", [2, 2], "int32")
    neg = fluid.data("neg", [-1, 1], "int32", lod_level=1)
    out, weight = fluid.layers.target_assign(x, match, negative_indices=neg, mismatch_value=7)
    xv = np.arange(18, dtype="float32").reshape(3, 2, 3)
    feed = {"x": fluid.create_lod_tensor(xv, [[2, 1]], fluid.CPUPlace()),
            "match": np.array([[1, -1], [-1, 0]], np.int32),
            "neg": fluid.create_lod_tensor(np.array([[1], [0]], np.int32), [[1, 1]],
                                           fluid.CPUPlace())}
    got, w = fluid.Executor(fluid.CPUPlace()).run(main, feed=feed, fetch_list=[out, weight])
    want = np.full((2, 2, 3), 7.0, "float32")
    want[0, 0] = xv[1, 0]                 # instance 0, column 0: its row 1, X's column 0
    want[1, 1] = xv[2, 1]                 # instance 1, column 1: its row 0 (X's row 2)
    np.testing.assert_array_equal(got, want)
    # instance 0: matched column 0, negative column 1; instance 1: negative 0, matched 1
    np.testing.assert_array_equal(w.reshape(2, 2), [[1, 1], [1, 1]])
    feed["neg"] = fluid.create_lod_tensor(np.zeros((0, 1), np.int32), [[0, 0]],
                                          fluid.CPUPlace())
    _, w = fluid.Executor(fluid.CPUPlace()).run(main, feed=feed, fetch_list=[out, weight])
    np.testing.assert_array_equal(w.reshape(2, 2), [[1, 0], [0, 1]])
