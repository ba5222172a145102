"""softmax on any axis, the attention prologue fusion and native dropout.

Oracles are NumPy written here; every compiled program runs with ``Executor(strict=True)`` and
each step of its plan must be native. Dropout's oracle is the reference executor on the same
program and run (the compiled kernel draws the same counter-based stream: Out and Mask must be
bit-identical), plus the kept fraction.
"""
import re

import numpy as np
import pytest

import pdjit as fluid
from pdjit import layers
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope

RNG = np.random.default_rng(160)


def np_softmax(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _native(prog, feed, fetch, exe=None):
    exe = exe or Executor(strict=True)
    got = exe.run(prog, feed=feed, fetch_list=fetch, scope=Scope())
    plans = [plan for _, plan in exe._plans.values()]
    steps = [s for plan in plans for s in plan.walk()]
    assert steps and all(s.kind.startswith("native") for s in steps), \
        [s.describe() for s in steps]
    return got, plans


# ---- softmax on any axis ------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_any_axis_native_with_grad(axis):
    x = RNG.normal(size=(3, 4, 5)).astype("float32")
    w = RNG.uniform(0.5, 1.5, size=x.shape).astype("float32")
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        xv = layers.data("x", list(x.shape), append_batch_size=False)
        xv.stop_gradient = False
        wv = layers.data("w", list(x.shape), append_batch_size=False)
        out = layers.softmax(xv, axis=axis)
        dx, = gradients([out], [xv], target_gradients=[wv])
    (o, d), _ = _native(prog, {"x": x, "w": w}, [out, dx])
    want = np_softmax(x, axis)
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
    want_dx = want * (w - (w * want).sum(axis=axis, keepdims=True))
    np.testing.assert_allclose(d, want_dx, rtol=1e-5, atol=1e-6)


# ---- attention: scale, mask add and softmax in one pass over the scores -----------------------
B, H, S, D = 2, 3, 5, 4


def _attention(use_scale: bool):
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        q = layers.data("q", [B, H, S, D], append_batch_size=False)
        k = layers.data("k", [B, H, S, D], append_batch_size=False)
        mask = layers.data("mask", [B, 1, 1, S], append_batch_size=False)
        if use_scale:
            s = layers.scale(layers.matmul(q, k, transpose_y=True), scale=D ** -0.5)
        else:
            s = layers.matmul(q, k, transpose_y=True, alpha=D ** -0.5)
        s = layers.elementwise_add(s, mask)
        p = layers.softmax(s)
    return prog, [p]


def _attention_feed():
    return {"q": RNG.normal(size=(B, H, S, D)).astype("float32"),
            "k": RNG.normal(size=(B, H, S, D)).astype("float32"),
            "mask": np.where(RNG.random((B, 1, 1, S)) < 0.3, -1e4, 0.0).astype("float32")}


def _want(feed):
    scores = np.einsum("bhid,bhjd->bhij", feed["q"].astype(np.float64), feed["k"]) * D ** -0.5
    return np_softmax(scores + feed["mask"], -1)


@pytest.mark.parametrize("use_scale", [False, True])
def test_attention_scale_mask_softmax_fuse_into_one_pass(use_scale):
    prog, fetch = _attention(use_scale)
    feed = _attention_feed()
    (p,), plans = _native(prog, feed, fetch)
    np.testing.assert_allclose(p, _want(feed), rtol=1e-5, atol=1e-6)
    text = plans[0].partition_text
    chain = "scale#1, elementwise_add#2, softmax#3" if use_scale else \
        "elementwise_add#1, softmax#2"
    # one group: the chain runs inside softmax's pass over each row of scores; no loop group
    # over the scores is left, and the chain's result is never stored
    assert f"opaque [{chain}] stores ['{fetch[0].name}']" in text, text
    assert "group elementwise" not in text and "group reduction" not in text, text
    source = "\n".join(src for _, src in plans[0].sources)
    assert len(re.findall(r"^# K\d+ = ", source, re.M)) == 1, source  # one generated kernel


@pytest.mark.parametrize("mask_shape,axis,trainable", [
    ((B, 1, 1, S), -1, False),  # a padding mask over the keys, fed
    ((B, 1, 1, S), -1, True),   # the same mask learnt
    ((H, S), 1, True),          # a learnt bias per head and query row, Fluid's axis rule
])
def test_attention_training_step_sums_the_mask_gradient_back_natively(mask_shape, axis,
                                                                      trainable):
    """d(sum(w * softmax(q k^T * D^-1/2 + mask)))/d(q, k, mask) under a strict plan: the mask's
    gradient is the scores' gradient summed over the dims the mask was broadcast along."""
    feed = _attention_feed()
    feed["mask"] = RNG.normal(size=mask_shape).astype("float32")
    feed["w"] = RNG.normal(size=(B, H, S, S)).astype("float32")
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        q = layers.data("q", [B, H, S, D], append_batch_size=False)
        k = layers.data("k", [B, H, S, D], append_batch_size=False)
        mask = layers.data("mask", list(mask_shape), append_batch_size=False)
        w = layers.data("w", [B, H, S, S], append_batch_size=False)
        q.stop_gradient = k.stop_gradient = False
        mask.stop_gradient = not trainable
        s = layers.elementwise_add(layers.matmul(q, k, transpose_y=True, alpha=D ** -0.5), mask,
                                   axis=axis)
        loss = layers.reduce_sum(layers.elementwise_mul(layers.softmax(s), w))
        wrt = [q, k] + ([mask] if trainable else [])
        grads = gradients([loss], wrt)
    got, plans = _native(prog, feed, grads)
    types = [op.type for op in prog.global_block().ops]
    assert "elementwise_add_grad" in types and "elementwise_mul_grad" in types
    q64, k64, w64 = (feed[n].astype(np.float64) for n in "qkw")
    m = feed["mask"].reshape((1,) + mask_shape + (1,)) if axis == 1 else feed["mask"]
    p = np_softmax(np.einsum("bhid,bhjd->bhij", q64, k64) * D ** -0.5 + m, -1)
    ds = p * (w64 - (w64 * p).sum(-1, keepdims=True))
    want = [np.einsum("bhij,bhjd->bhid", ds, k64) * D ** -0.5,
            np.einsum("bhij,bhid->bhjd", ds, q64) * D ** -0.5]
    if trainable:
        keep = (1, 2) if axis == 1 else (0, 3)
        want.append(ds.sum(axis=tuple(i for i in range(4) if i not in keep)).reshape(mask_shape))
    for g, wv in zip(got, want):
        assert g.shape == wv.shape
        np.testing.assert_allclose(g, wv, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("op", ["elementwise_mul", "elementwise_div"])
def test_mul_div_gradients_sum_back_over_broadcast_dims_natively(op):
    """X [2, 1, 4] against Y [3, 1] with axis=1 (aligned as [1, 3, 1]): both operands are
    broadcast, each gradient is summed back to its own shape."""
    x = RNG.normal(size=(2, 1, 4))
    y = RNG.uniform(0.5, 1.5, size=(3, 1)) * RNG.choice([-1, 1], size=(3, 1))
    w = RNG.normal(size=(2, 3, 4))
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        xv = layers.data("x", [2, 1, 4], dtype="float64", append_batch_size=False)
        yv = layers.data("y", [3, 1], dtype="float64", append_batch_size=False)
        wv = layers.data("w", [2, 3, 4], dtype="float64", append_batch_size=False)
        xv.stop_gradient = yv.stop_gradient = False
        out = getattr(layers, op)(xv, yv, axis=1)
        dx, dy = gradients([out], [xv, yv], target_gradients=[wv])
    (gx, gy), _ = _native(prog, {"x": x, "y": y, "w": w}, [dx, dy])
    yb = y.reshape(1, 3, 1)
    if op == "elementwise_mul":
        fx, fy = w * yb, w * x
    else:
        fx, fy = w / yb, -w * x / yb ** 2
    np.testing.assert_allclose(gx, fx.sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(gy, fy.sum(axis=(0, 2)).reshape(3, 1), rtol=1e-12)


def test_prologue_refused_when_the_chain_result_is_needed():
    """The scaled, masked scores are fetched too: they must be stored, so the chain stays a
    loop group of its own and the partition log says why (rank 3: the softmax kernel of the
    any-axis test serves)."""
    x = RNG.normal(size=(3, 4, 5)).astype("float32")
    m = RNG.normal(size=(4, 5)).astype("float32")
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        xv = layers.data("x", list(x.shape), append_batch_size=False)
        mv = layers.data("m", list(m.shape), append_batch_size=False)
        s = layers.elementwise_add(layers.scale(xv, scale=0.5), mv, axis=1)
        p = layers.softmax(s)
    (got_p, got_s), plans = _native(prog, {"x": x, "m": m}, [p, s])
    want_s = 0.5 * x.astype(np.float64) + m
    np.testing.assert_allclose(got_s, want_s, rtol=1e-6)
    np.testing.assert_allclose(got_p, np_softmax(want_s, -1), rtol=1e-5, atol=1e-6)
    text = plans[0].partition_text
    assert f"softmax#2: no prologue: {s.name} is needed after the block" in text, text
    assert "group elementwise: elementwise [scale#0, elementwise_add#1]" in text, text
    assert "opaque [softmax#2]" in text, text


def test_an_op_computed_by_blocks_before_a_prologue_is_computed_whole():
    """conv2d (which can take an elementwise epilogue by blocks of samples) followed by a bias
    add fused into softmax as a prologue: the prologue group is no epilogue, so the driver
    computes the convolution itself first (generated source only: nothing compiles)."""
    from pdjit.codegen.lowering import SegmentGen
    from pdjit.codegen.target import get_target
    from pdjit.passes.fusion import live_names, partition

    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        x = layers.data("x", [3, 6, 6])
        p = layers.softmax(layers.conv2d(x, 4, 3, padding=1))
    block = prog.global_block()
    live = live_names(prog, block, [p.name])
    part = partition(block, list(block.ops), live, target=get_target("cpu"))
    assert "opaque [elementwise_add#1, softmax#2]" in part.describe()
    gen = SegmentGen(part.segments[0], block, live)
    gen.generate()
    source = gen.source("segment")
    # the whole batch (every sample), no epilogue, before the prologue's kernel runs
    whole = "_nn.split_work(_nn.conv._fwd_range, s1.shape[0], "
    assert whole in source and "nb2, -math.inf, math.inf, nb2, head=3)" in source, source
    assert source.index(whole) < source.index("K0(s1, a2, s3)"), source


# ---- softmax_with_cross_entropy: the same split passes over each row ---------------------------
def test_softmax_with_cross_entropy_rows_in_split_passes_native():
    """Rows of 37 logits (the four-partial reductions' remainder loop runs), a label equal to
    ignore_index (loss 0, no gradient), large logits (the shift by the max): Softmax, Loss and
    the Logits gradient against NumPy under a strict plan."""
    n, c = 6, 37
    x = (RNG.normal(size=(n, c)) * 4).astype("float32")
    x[1] += 300.0
    lab = RNG.integers(0, c, (n, 1))
    lab[2] = -100
    w = RNG.uniform(0.5, 1.5, size=(n, 1)).astype("float32")
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        xv = layers.data("x", [n, c], append_batch_size=False)
        lv = layers.data("l", [n, 1], dtype="int64", append_batch_size=False)
        wv = layers.data("w", [n, 1], append_batch_size=False)
        xv.stop_gradient = False
        loss, sm = layers.softmax_with_cross_entropy(xv, lv, return_softmax=True)
        dx, = gradients([loss], [xv], target_gradients=[wv])
    (got_sm, got_loss, got_dx), plans = _native(prog, {"x": x, "l": lab, "w": w}, [sm, loss, dx])
    assert "opaque [softmax_with_cross_entropy#0]" in plans[0].partition_text
    p = np_softmax(x, -1)
    rows, keep = np.arange(n), lab[:, 0] != -100
    want_loss = np.where(keep, -np.log(p[rows, np.where(keep, lab[:, 0], 0)]), 0.0)[:, None]
    onehot = np.zeros((n, c))
    onehot[rows[keep], lab[keep, 0]] = 1.0
    want_dx = (p - onehot) * w * keep[:, None]
    np.testing.assert_allclose(got_sm, p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-5, atol=1e-6)


# ---- dropout ------------------------------------------------------------------------------------
def _dropout_program(p, impl, is_test=False, shape=(40, 50)):
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        x = layers.data("x", list(shape), append_batch_size=False)
        x.stop_gradient = False
        w = layers.data("w", list(shape), append_batch_size=False)
        y = layers.dropout(x, p, is_test=is_test, dropout_implementation=impl)
        mask = prog.global_block().ops[-1].output("Mask")[0]
        dx, = gradients([y], [x], target_gradients=[w])
    return prog, [y, mask, dx]


@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
@pytest.mark.parametrize("p", [0.3, 1.0])
def test_dropout_native_draws_the_reference_stream(impl, p):
    prog, fetch = _dropout_program(p, impl)
    x = RNG.normal(size=(40, 50)).astype("float32")
    w = RNG.uniform(0.5, 1.5, size=x.shape).astype("float32")
    feed = {"x": x, "w": w}
    exe, ref = Executor(strict=True), Executor(mode="reference")
    masks = []
    for _ in range(2):  # a new key each run, the same in both executors
        (y, mask, dx), _ = _native(prog, feed, fetch, exe)
        want = ref.run(prog, feed=feed, fetch_list=fetch, scope=Scope())
        for got, w_, what in zip((y, mask, dx), want, ("Out", "Mask", "X@GRAD")):
            assert got.dtype == w_.dtype and np.array_equal(got, w_), what
        keep = mask.astype(bool)
        scale = (1.0 / np.float32(1 - p) if p < 1 else 0.0) if impl == "upscale_in_train" \
            else 1.0
        np.testing.assert_allclose(y, np.where(keep, x * scale, 0), rtol=1e-6)
        np.testing.assert_allclose(dx, np.where(keep, w * scale, 0), rtol=1e-6)
        n = keep.size
        assert abs(keep.mean() - (1 - p)) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-12, keep.mean()
        masks.append(mask)
    assert p == 1.0 or not np.array_equal(*masks)


@pytest.mark.parametrize("impl,factor", [("downgrade_in_infer", 0.75), ("upscale_in_train", 1.0)])
def test_dropout_test_mode_native(impl, factor):
    prog, fetch = _dropout_program(0.25, impl, is_test=True, shape=(6, 7))
    x = RNG.normal(size=(6, 7)).astype("float32")
    w = RNG.uniform(0.5, 1.5, size=x.shape).astype("float32")
    (y, mask, dx), _ = _native(prog, {"x": x, "w": w}, fetch)
    np.testing.assert_allclose(y, x * np.float32(factor), rtol=1e-7)
    np.testing.assert_allclose(dx, w * np.float32(factor), rtol=1e-7)
    assert mask.dtype == np.uint8 and mask.all()


@pytest.mark.parametrize("seed", [0, 7, -3])
def test_dropout_seed_input_native(seed):
    """A Seed input: a non-zero value fixes the stream (every run draws the same), zero means
    the run's key; bit-identical to the reference either way."""
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        x = layers.data("x", [30, 20], append_batch_size=False)
        s = layers.data("seed", [1], dtype="int32", append_batch_size=False)
        block = prog.global_block()
        out = block.create_var(name="out", dtype=x.dtype, shape=list(x.shape))
        mask = block.create_var(name="mask", dtype=np.uint8, shape=list(x.shape))
        block.append_op("dropout", inputs={"X": [x], "Seed": [s]},
                        outputs={"Out": [out], "Mask": [mask]}, attrs={"dropout_prob": 0.4})
    feed = {"x": RNG.normal(size=(30, 20)).astype("float32"),
            "seed": np.array([seed], np.int32)}
    exe, ref = Executor(strict=True), Executor(mode="reference")
    masks = []
    for _ in range(2):
        got, _ = _native(prog, feed, [out, mask], exe)
        want = ref.run(prog, feed=feed, fetch_list=[out, mask], scope=Scope())
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        masks.append(got[1])
    assert np.array_equal(*masks) == (seed != 0)


def test_dropout_test_mode_out_is_x_without_a_copy():
    """upscale_in_train in test mode, Out read only by a later op: Out is X itself (no kernel
    call, no copy); the fed array stays untouched, and a fetched Out is still a copy."""
    prog, start = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, start):
        x = layers.data("x", [6, 7], append_batch_size=False)
        y = layers.dropout(x, 0.25, is_test=True, dropout_implementation="upscale_in_train")
        z = layers.scale(y, scale=2.0, bias=1.0)
    x0 = RNG.normal(size=(6, 7)).astype("float32")
    keep = x0.copy()
    (got,), plans = _native(prog, {"x": x0}, [z])
    np.testing.assert_allclose(got, keep * 2 + 1, rtol=1e-7)
    assert np.array_equal(x0, keep)
    text = "\n".join(t for plan in plans for _, t in plan.sources)
    assert "dropout_fwd" not in text, text
    (got_y, got_z), _ = _native(prog, {"x": x0}, [y, z])  # Out fetched: computed, not X
    np.testing.assert_array_equal(got_y, keep)
    assert not np.shares_memory(got_y, x0)
    np.testing.assert_allclose(got_z, keep * 2 + 1, rtol=1e-7)
