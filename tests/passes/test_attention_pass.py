"""The inference pass ``fuse_attention`` (``pdjit.passes.attention``) on the CPU target.

Oracle: multi-head self-attention as a Fluid 1.x user writes it (three projections, the heads
split by ``reshape`` + ``transpose``, scores scaled by ``matmul``'s ``alpha``, a padding mask
added, ``softmax``, the context by ``matmul``, the heads joined again, an output projection),
computed in NumPy here from the values of the scope it was saved from. Through the Predictor
the core becomes one ``scaled_dot_product_attention`` op with the four transposes taken in,
gives the oracle's values, runs natively and gives the values of the program without the
pass;
the pass leaves alone what it cannot take (a value read elsewhere, a transposed left operand,
no target); ``matmul_v2`` with K given as columns and a rank-3 core (no heads) fuse too.
"""
import collections
import shutil

import numpy as np
import pytest
from saved_models import load_artifact, save_drawn

import pdjit as fluid
import pdjit.inference as inference
from pdjit.codegen.target import get_target
from pdjit.passes.inference import optimize
from pdjit.testing import assert_native

RNG = np.random.default_rng(67)
S, H, D = 19, 3, 8          # (odd sizes: nothing a multiple of the kernels' tiles)
E = H * D
CORE = "scaled_dot_product_attention"


def _build(L, fetch_scores=False, v2=False):
    x = L.data("x", [S, E])
    mask = L.data("mask", [1, 1, S])

    def heads(t):
        return L.transpose(L.reshape(t, [0, 0, H, D]), [0, 2, 1, 3])

    q, k, v = (heads(L.fc(x, E, num_flatten_dims=2)) for _ in range(3))
    if v2:  # the queries scaled first (a ``scale`` op), K as columns: [B, H, D, S]
        s = L.matmul(L.scale(q, D ** -0.5), L.transpose(k, [0, 1, 3, 2]))
    else:
        s = L.matmul(q, k, transpose_y=True, alpha=D ** -0.5)
    s = L.elementwise_add(s, mask)
    p = L.softmax(s)
    c = L.matmul(p, v)
    c = L.reshape(L.transpose(c, [0, 2, 1, 3]), [0, 0, E])
    y = L.fc(c, E, num_flatten_dims=2)
    return [x, mask], ([y, p] if fetch_scores else [y])


def _forward(xv, mv, vals):
    def fc(t, i):
        return t @ vals[f"fc_{i}.w_0"] + vals[f"fc_{i}.b_0"]

    def heads(t):
        return t.reshape(t.shape[0], S, H, D).transpose(0, 2, 1, 3)

    q, k, v = (heads(fc(xv, i)) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) * D ** -0.5 + mv
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    c = (p @ v).transpose(0, 2, 1, 3).reshape(xv.shape[0], S, E)
    return fc(c, 3), p


def _save(d, **kw):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        feeds, fetches = _build(fluid.layers, **kw)
    return save_drawn(main, startup, feeds, fetches, d,
                      lambda name, shape: RNG.standard_normal(shape) * 0.4)


def _predictor(d, fuse=True):
    cfg = inference.Config(str(d / "m.pdmodel"), str(d / "m.pdiparams"))
    if not fuse:
        cfg.delete_pass("fuse_attention")
    return inference.create_predictor(cfg)


def _inputs(n):
    xv = RNG.standard_normal((n, S, E)).astype(np.float32)
    mv = np.where(RNG.random((n, 1, 1, S)) < 0.8, 0.0, -1e4).astype(np.float32)
    return xv, mv


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_the_core_is_one_op_and_gives_the_oracle(cache):
    values = _save(cache)
    pred = _predictor(cache)
    kinds = collections.Counter(op.type for op in pred.program().global_block().ops)
    assert kinds[CORE] == 1
    assert not {"transpose2", "softmax", "matmul"} & set(kinds)
    core = next(op for op in pred.program().global_block().ops if op.type == CORE)
    assert core.input("Mask") == ["mask"] and core.attr("q_perm") == [0, 2, 1, 3] and \
        core.attr("out_perm") == [0, 2, 1, 3] and core.attr("alpha") == pytest.approx(D ** -0.5)
    for n in (1, 3):
        xv, mv = _inputs(n)
        feed = {"x": xv, "mask": mv}
        (y,) = pred.run([feed[k] for k in pred.get_input_names()])
        want, _ = _forward(xv.astype(np.float64), mv.astype(np.float64), values)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        assert_native(pred._exe)
        (y0,) = _predictor(cache, fuse=False).run([feed[k] for k in pred.get_input_names()])
        np.testing.assert_allclose(y, y0, rtol=1e-6, atol=1e-6)   # (the sums' order differs)


def test_what_is_read_elsewhere_stays(cache):
    """The softmax fetched: nothing fused, the values as the oracle's."""
    values = _save(cache, fetch_scores=True)
    pred = _predictor(cache)
    kinds = collections.Counter(op.type for op in pred.program().global_block().ops)
    assert kinds[CORE] == 0 and kinds["softmax"] == 1
    xv, mv = _inputs(2)
    feed = {"x": xv, "mask": mv}
    y, p = pred.run([feed[k] for k in pred.get_input_names()])
    want, want_p = _forward(xv.astype(np.float64), mv.astype(np.float64), values)
    np.testing.assert_allclose(p, want_p, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_scaled_queries_and_keys_as_columns(cache):
    """The queries scaled by a ``scale`` op before the product (``paddle.nn``'s way: the
    factor goes into the core's ``alpha``, the heads' transpose before it into ``q_perm``),
    the keys transposed to columns by a ``transpose`` the core takes in (with the product's
    own transpose: K's heads as they are; their transpose stays)."""
    values = _save(cache, v2=True)
    pred = _predictor(cache)
    ops = pred.program().global_block().ops
    kinds = collections.Counter(op.type for op in ops)
    assert kinds[CORE] == 1 and kinds["softmax"] == 0 and kinds["scale"] == 0 and \
        kinds["transpose2"] == 1
    core = next(op for op in ops if op.type == CORE)
    assert core.attr("q_perm") == [0, 2, 1, 3] and core.attr("k_perm") == [] and \
        core.attr("alpha") == pytest.approx(D ** -0.5)
    xv, mv = _inputs(2)
    feed = {"x": xv, "mask": mv}
    (y,) = pred.run([feed[k] for k in pred.get_input_names()])
    want, _ = _forward(xv.astype(np.float64), mv.astype(np.float64), values)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert_native(pred._exe)


def _program(body):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        out = body(fluid.layers)
    return main.clone(for_test=True), out


def test_rank3_and_matmul_v2_with_keys_as_columns():
    """No heads (``[B, S, D]``), K given as ``[B, D, S]`` to ``matmul_v2``: one core op whose
    K permutation swaps the last two axes; its reference and its kernel give NumPy's values."""
    def body(L):
        q = L.data("q", [S, D])
        kt = L.data("kt", [D, S])
        v = L.data("v", [S, D])
        p = L.softmax(fluid.layers.matmul(q, kt))
        return fluid.layers.matmul(p, v)
    prog, out = _program(body)
    new, _ = optimize(prog, {}, target=get_target("cpu"))
    ops = [op for op in new.global_block().ops if op.type not in ("feed", "fetch")]
    assert [op.type for op in ops] == [CORE] and ops[0].attr("k_perm") == [0, 2, 1]
    qv, ktv, vv = (RNG.standard_normal(s).astype(np.float32)
                   for s in ((2, S, D), (2, D, S), (2, S, D)))
    s = qv.astype(np.float64) @ ktv
    e = np.exp(s - s.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True) @ vv
    exe = fluid.Executor()
    for p in (new, prog):
        (got,) = exe.run(p, feed={"q": qv, "kt": ktv, "v": vv}, fetch_list=[out.name])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert_native(exe)


def test_a_value_written_between_the_products_keeps_the_ops():
    """A persistable K (a cache) written after the scores used it and before the context:
    the fused op would read the new value at P2's place; nothing is fused, the values stay."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        L = fluid.layers
        q = L.data("q", [1, 2, 5, 4], append_batch_size=False)
        v = L.data("v", [1, 2, 5, 4], append_batch_size=False)
        kc = L.create_global_var([1, 2, 5, 4], 0.5, "float32", persistable=True, name="kc")
        p = L.softmax(L.matmul(q, kc, transpose_y=True, alpha=0.5))
        L.fill_constant([1, 2, 5, 4], "float32", 3.0, out=kc)
        o = L.matmul(p, v)
    prog = main.clone(for_test=True)
    kv = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    new, _ = optimize(prog, {"kc": kv}, target=get_target("cpu"))
    assert CORE not in {op.type for op in new.global_block().ops}
    scope = fluid.Scope()
    with fluid.scope_guard(scope):
        exe = fluid.Executor()
        exe.run(startup)
        scope.find_var("kc").value = kv.copy()
        qv, vv = (RNG.standard_normal((1, 2, 5, 4)).astype(np.float32) for _ in range(2))
        (got,) = exe.run(new, feed={"q": qv, "v": vv}, fetch_list=[o.name])
    s = 0.5 * qv.astype(np.float64) @ kv.transpose(0, 1, 3, 2)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True) @ vv, rtol=1e-5, atol=1e-6)


def test_a_transposed_left_operand_and_no_target_are_left_alone():
    def body(L):
        q = L.data("q", [D, S])
        k = L.data("k", [S, D])
        v = L.data("v", [S, D])
        p = L.softmax(L.matmul(q, k, transpose_x=True, transpose_y=True))
        return L.matmul(p, v)
    prog, _ = _program(body)
    new, _ = optimize(prog, {}, target=get_target("cpu"))
    assert CORE not in {op.type for op in new.global_block().ops}

    def plain(L):
        q = L.data("q", [S, D])
        return L.matmul(L.softmax(L.matmul(q, q, transpose_y=True)), q)
    prog, _ = _program(plain)
    assert CORE in {op.type for op in optimize(prog, {}, target=get_target("cpu"))[0]
                    .global_block().ops}
    assert CORE not in {op.type for op in optimize(prog, {})[0].global_block().ops}


@pytest.mark.xdist_group("aot")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc'")
def test_an_ahead_of_time_artifact_runs_the_core_as_the_predictor(cache):
    """The ahead-of-time compiler applies the pass for its target too: the artifact's native
    code runs the core's kernel and gives the Predictor's values bit for bit."""
    from pdjit.io.inference_model import load_model

    values = _save(cache)
    model = load_model(str(cache / "m.pdmodel"), str(cache / "m.pdiparams"))
    prog, _ = optimize(model.program, model.params, target=get_target("aot"))
    assert CORE in {op.type for op in prog.global_block().ops}
    xv, mv = _inputs(2)
    (got,) = load_artifact(cache, "core_artifact").run({"x": xv, "mask": mv})
    pred = _predictor(cache)
    feed = {"x": xv, "mask": mv}
    (want,) = pred.run([feed[k] for k in pred.get_input_names()])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, _forward(xv.astype(np.float64), mv.astype(np.float64),
                                             values)[0], rtol=1e-4, atol=1e-4)


def test_an_encoder_block_replays_the_kernels_below_the_entry_points(tmp_path, monkeypatch):
    """Attention, a residual layer norm and a feed-forward pair with gelu through the
    Predictor at batch 1: once recorded, its runs replay only compiled kernels (the
    products', the layer norm's, the attention core's, the gelu epilogue's), none of the
    library's Python entry points nor the generated loop that runs the epilogue by blocks,
    and give the oracle's values and the host driver's bits for inputs the recording never
    saw."""
    from numba.core.dispatcher import Dispatcher
    from scipy.special import erf

    from pdjit.codegen.cpu import replay, threads

    monkeypatch.setenv("PDJIT_NATIVE_DRIVERS", "")  # (the default: tiers, a host replay)
    monkeypatch.setattr(replay, "TRIAL_RUNS", 0)  # (no timed trial: the runs are too short)
    monkeypatch.setattr(threads.RunChoice, "begin", lambda self, key: None)
    monkeypatch.setattr(threads.RunChoice, "end", lambda self, key, seconds: None)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        L = fluid.layers
        feeds, (y,) = _build(L)
        h = L.layer_norm(L.elementwise_add(y, feeds[0]), begin_norm_axis=2)
        f = L.fc(L.fc(h, 2 * E, num_flatten_dims=2, act="gelu"), E, num_flatten_dims=2)
    values = save_drawn(main, startup, feeds, [f], tmp_path,
                        lambda name, shape: RNG.standard_normal(shape) * 0.4)
    pred = _predictor(tmp_path)  # (the library's kernels from the tests' cache: ready)
    assert collections.Counter(op.type for op in pred.program().global_block().ops)[CORE] == 1

    def oracle(xv, mv):
        a, _ = _forward(xv, mv, values)
        t = a + xv
        t = (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5)
        t = t * values["layer_norm_0.w_0"] + values["layer_norm_0.b_0"]
        g = t @ values["fc_4.w_0"] + values["fc_4.b_0"]
        g = 0.5 * g * (1 + erf(g / np.sqrt(2)))
        return g @ values["fc_5.w_0"] + values["fc_5.b_0"]

    def run(xv, mv):
        feed = {"x": xv, "mask": mv}
        return pred.run([feed[k] for k in pred.get_input_names()])[0]

    reps = []
    for _ in range(3 * (replay.AFTER_RUNS + 2)):
        run(*_inputs(1))
        reps = [s.tiers.replay for _, plan in pred._exe._plans.values() for s in plan.walk()
                if getattr(s, "tiers", None) is not None and s.tiers.replay is not None]
        if any(r.replays for r in reps):
            break
    (rp,) = [r for r in reps if r.replays]
    ops = [fn for rec in rp.recordings.values() for fn, *_ in rec.ops]
    assert ops and all(isinstance(fn, Dispatcher) for fn in ops), ops
    xv, mv = _inputs(1)
    got = run(xv, mv)
    np.testing.assert_allclose(got, oracle(xv.astype(np.float64), mv.astype(np.float64)),
                               rtol=1e-4, atol=1e-4)
    before, rp.off = rp.off, "compared"  # the host driver itself
    try:
        np.testing.assert_array_equal(run(xv, mv), got)
    finally:
        rp.off = before
