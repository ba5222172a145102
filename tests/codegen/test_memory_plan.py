"""The memory plan (``Executor(memory_optim=True)``, ``pdjit.codegen.memplan``): host drivers
that reuse the buffers of dead intermediates and release each one after its last use.

Every program runs natively (strict executors) with the plan, and is checked against NumPy
written here and against the same executor without the plan (identical arrays: the plan moves
memory, never arithmetic).
"""
import math
import re
import threading
import tracemalloc
import warnings

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen import memplan
from pdjit.framework.errors import FallbackWarning
from pdjit.testing import assert_native

L = fluid.layers
RNG = np.random.default_rng(11)


def _plans(exe, main=None):
    """The plans ``exe`` built (for ``main`` only, when given)."""
    return [p for (pid, _), (_, p) in exe._plans.items() if main is None or pid == id(main)]


def _memory_plans(exe, main):
    return [s.compiled.memory_plan for p in _plans(exe, main) for s in p.walk()
            if s.kind == "native" and s.compiled.memory_plan is not None]


def _run_both(main, startup, feed, fetch, steps=1):
    """Results of ``steps`` runs with and without the plan (fresh scopes, same startup), the
    last run's fetches and the final scope of each, checked identical; (results, exe, scope)
    of the planned run."""
    out = {}
    for on in (False, True):
        exe, scope = fluid.Executor(strict=True, memory_optim=on), fluid.Scope()
        exe.run(startup, scope=scope)
        for _ in range(steps):
            got = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
        assert_native(exe)
        out[on] = (got, exe, scope)
    for a, b in zip(out[False][0], out[True][0]):
        np.testing.assert_array_equal(a, b)
    return out[True]


def _params(scope, names):
    return {n: np.array(scope.find_var(n).value) for n in names}


def _relu(x):
    return np.maximum(x, 0)


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ---- the planner alone ----------------------------------------------------------------------
DRIVER = '''def segment(a0):
    # group 0: opaque [k] rank 0
    s1 = np.empty(a0.shape, np.float64)
    K(a0, s1)
    v2 = s1.reshape(s1.size)
    # group 1: opaque [k] rank 0
    s3 = np.empty(a0.shape, np.float64)
    K(a0, s3)
    # group 2: opaque [k] rank 0
    s4 = np.empty(a0.shape, np.float64)
    K(s3, s4)
    # group 3: opaque [k] rank 0
    s5 = np.empty((a0.shape[0], a0.shape[1]), np.float64)
    K(s4, s5)
    s6 = v2.sum() + s5
    return (s6, )'''


def test_a_plan_is_kept_in_the_cache_directory(tmp_path, monkeypatch):
    """A driver planned once is read back from ``<cache dir>/memplan`` (the same source and
    plan); other labels are another entry; a damaged entry is planned again and rewritten;
    a driver offered an in-place rewrite that switches a kernel is planned each time,
    nothing kept; one whose call takes the buffer as it is is kept, keyed by the offer."""
    monkeypatch.setenv("PDJIT_CACHE_DIR", str(tmp_path))
    labels, groups = {"s1": "x1", "s3": "x3", "s4": "x4", "s5": "x5", "s6": "out"}, [2, 6, 9, 12]
    calls = []
    real = memplan._plan_driver
    monkeypatch.setattr(memplan, "_plan_driver", lambda *a: calls.append(a) or real(*a))
    first = memplan.plan_driver(DRIVER, labels, None, None, groups)
    kept = list((tmp_path / memplan.PLAN_DIR).iterdir())
    assert len(calls) == 1 and len(kept) == 1
    again = memplan.plan_driver(DRIVER, labels, None, None, groups)
    assert len(calls) == 1 and again[0] == first[0] and \
        again[1].describe() == first[1].describe()
    memplan.plan_driver(DRIVER, {**labels, "s6": "y"}, None, None, groups)
    assert len(calls) == 2 and len(list((tmp_path / memplan.PLAN_DIR).iterdir())) == 2
    kept[0].write_bytes(kept[0].read_bytes()[:-3] + b"xyz")
    assert memplan.plan_driver(DRIVER, labels, None, None, groups)[0] == first[0]
    assert len(calls) == 3
    assert memplan.plan_driver(DRIVER, labels, None, None, groups)[0] == first[0]
    assert len(calls) == 3   # (rewritten: read again)
    # an in-place offer the call takes as it is: kept, keyed by the offer
    offered = memplan.plan_driver(DRIVER, labels, None, {"s5": (["s4"], [])}, groups)
    assert memplan.plan_driver(DRIVER, labels, None, {"s5": (["s4"], [])}, groups) == offered
    assert len(calls) == 4 and len(list((tmp_path / memplan.PLAN_DIR).iterdir())) == 3
    assert offered[1].inplace and "s5 = s4.reshape(" in offered[0]
    # one that switches the call to a kernel variant (a callback into the generator, which
    # registers it): read back by calling the callback again, the new name where it differs
    asked = []

    def switch(name):
        return {"s5": (["s4"], [], lambda leaf: asked.append(leaf) or {"K": name})}

    first = memplan.plan_driver(DRIVER, labels, None, switch("K1"), groups)
    assert len(calls) == 5 and asked == ["s4"] and "K1(s4, s5)" in first[0]
    again = memplan.plan_driver(DRIVER, labels, None, switch("K1"), groups)
    assert len(calls) == 5 and asked == ["s4"] * 2 and again == first
    moved = memplan.plan_driver(DRIVER, labels, None, switch("K9"), groups)
    assert len(calls) == 5 and "K9(s4, s5)" in moved[0] and "K1(" not in moved[0]
    # a kept plan whose rewrite the offers no longer make is planned anew, no callback called
    (entry,) = [f for f in (tmp_path / memplan.PLAN_DIR).iterdir()
                if memplan._read_plan(f)[1].variants]
    src, plan = memplan._read_plan(entry)
    plan.variants = [("s5", "s3", {})]
    assert memplan._replay((src, plan), switch("K1")) is None and asked == ["s4"] * 3


def test_a_plan_read_back_switches_its_kernels_again(fresh_programs, monkeypatch):
    """A second executor of the same program reads its plan back (no planning) and makes the
    in-place rewrites that switch kernels again: the bias + activation after each product
    writes into the product's buffer through the variant, the same values."""
    main, startup = fresh_programs
    x = L.data(name="x", shape=[16], dtype="float32")
    out = _fc(_fc(x, 32, "relu", "k1"), 8, "tanh", "k2")
    xv = RNG.standard_normal((5, 16)).astype(np.float32)
    calls = []
    real = memplan._plan_driver
    monkeypatch.setattr(memplan, "_plan_driver", lambda *a: calls.append(1) or real(*a))
    got = []
    for k in range(2):
        exe, scope = fluid.Executor(strict=True, memory_optim=True), fluid.Scope()
        exe.run(startup, scope=scope)
        got.append(exe.run(main, feed={"x": xv}, fetch_list=[out], scope=scope)[0])
        assert_native(exe)
        (mp,) = _memory_plans(exe, main)
        assert mp.variants and len(mp.inplace) == 2
        (step,) = [st for p in _plans(exe, main) for st in p.walk() if st.kind == "native"]
        assert sum("L0[b + c] = " in c.text for _, c in step.compiled.calls) == 2
        if k == 0:
            planned = len(calls)
    assert len(calls) == planned   # the second planned nothing: every plan read back
    p = _params(scope, ["k1.w", "k1.b", "k2.w", "k2.b"])
    want = np.tanh(_relu(xv @ p["k1.w"] + p["k1.b"]) @ p["k2.w"] + p["k2.b"])
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-6)


def test_a_view_keeps_its_buffer_alive_and_outputs_keep_theirs():
    src, plan = memplan.plan_driver(DRIVER, labels={"s1": "x1", "s3": "x3", "s4": "x4",
                                                    "s5": "x5", "s6": "out"},
                                    groups=[2, 6, 9, 12])   # DRIVER's "# group" lines
    (dtype, tenants), = plan.slots
    # s1 is read through its view v2 up to the last group: nobody takes its buffer; s3 dies in
    # group 2, so s5 (group 3) reuses it; s4 is live with s3 in group 2, so it cannot
    assert dtype == "np.float64" and [t.local for t in tenants] == ["s3", "s5"]
    assert src.index("del s5, v2") > src.index("s6 = v2.sum() + s5")   # released after it
    assert "x3 (groups 1-2), x5 (groups 3-3)" in plan.describe()
    new = src.splitlines()   # where each group begins in the rewritten driver
    assert [new[at - 1].strip() for at in plan.group_lines] == \
        [f"# group {k}: opaque [k] rank 0" for k in range(4)]

    def K(x, out):  # noqa: N802 - a stand-in kernel: writes every element of its output
        out[...] = np.sqrt(np.abs(x)) + x.sum()

    x = RNG.standard_normal((3, 5))
    want, got = {}, {}
    exec(compile(DRIVER, "<before>", "exec"), ns := {"np": np, "K": K})   # noqa: S102
    exec(compile(src, "<after>", "exec"), ns2 := {"np": np, "K": K, "math": math,  # noqa: S102
                                                  "_mp": memplan})
    want, = ns["segment"](x.copy())
    got, = ns2["segment"](x.copy())
    np.testing.assert_array_equal(got, want)


def test_an_always_empty_array_keeps_its_own_allocation():
    # a kernel's "no bias" argument (np.empty(0, T)) among tenants of a slot: no slot code
    src = """def segment(a0):
    # group 0: opaque [k] rank 0
    s1 = np.empty(a0.shape, np.float64)
    e2 = np.empty(0, np.float64)
    K(a0, e2, s1)
    # group 1: opaque [k] rank 0
    s3 = np.empty(a0.shape, np.float64)
    e4 = np.empty(0, np.float64)
    K(s1, e4, s3)
    # group 2: opaque [k] rank 0
    s5 = np.empty(a0.shape, np.float64)
    e6 = np.empty((0,), np.float64)
    K(s3, e6, s5)
    # group 3: opaque [k] rank 0
    s7 = np.empty(a0.shape, np.float64)
    K(s5, e6, s7)
    return (s7, )"""
    new, plan = memplan.plan_driver(src, groups=[2, 6, 10, 14])
    (_, tenants), = plan.slots
    assert [t.local for t in tenants] == ["s1", "s5"]
    for e in ("e2", "e4", "e6"):
        assert re.search(rf"^ *{e} = np.empty\((0|\(0,\)), np.float64\)$", new, re.M), new
    assert "_mp.numel" not in new

    def K(x, e, out):  # noqa: N802 - a stand-in kernel
        assert e.size == 0
        out[...] = x * 2 + 1

    x = RNG.standard_normal((3, 5))
    exec(compile(src, "<before>", "exec"), ns := {"np": np, "K": K})  # noqa: S102
    exec(compile(new, "<after>", "exec"), ns2 := {"np": np, "K": K, "math": math,  # noqa: S102
                                                 "_mp": memplan})
    np.testing.assert_array_equal(ns2["segment"](x.copy())[0], ns["segment"](x.copy())[0])


def test_numel_raises_on_negative_dims_like_np_empty():
    assert memplan.numel((2, 3, 4)) == 24 and memplan.numel(()) == 1 and memplan.numel(5) == 5
    with pytest.raises(ValueError, match="negative"):
        memplan.numel((-1, 3))


# ---- programs -------------------------------------------------------------------------------
def _fc(x, size, act, name):
    return L.fc(x, size, act=act, param_attr=fluid.ParamAttr(name=f"{name}.w"),
                bias_attr=fluid.ParamAttr(name=f"{name}.b"))


def test_views_and_fetched_intermediates(fresh_programs):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[16], dtype="float32")
    h1 = _fc(x, 32, "relu", "f1")
    r = L.reshape(h1, [-1, 4, 8])          # a view of h1, fetched
    f = L.flatten(r)                       # a view of a view
    h2 = _fc(f, 32, "tanh", "f2")
    h3 = _fc(h2, 32, "relu", "f3")
    out = _fc(h3, 8, "softmax", "f4")
    xv = RNG.standard_normal((6, 16)).astype(np.float32)
    (g_h1, g_r, g_out), exe, scope = _run_both(main, startup, {"x": xv}, [h1, r, out])
    p = _params(scope, [f"f{i}.{k}" for i in range(1, 5) for k in "wb"])
    w_h1 = _relu(xv @ p["f1.w"] + p["f1.b"])
    w_h3 = _relu(np.tanh(w_h1 @ p["f2.w"] + p["f2.b"]) @ p["f3.w"] + p["f3.b"])
    w_out = _softmax(w_h3 @ p["f4.w"] + p["f4.b"])
    np.testing.assert_allclose(g_h1, w_h1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_r, w_h1.reshape(6, 4, 8), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_out, w_out, rtol=1e-5, atol=1e-6)
    (mp,) = _memory_plans(exe, main)
    assert mp.inplace or mp.slots   # something was reused
    text = mp.describe()
    slots = [line for line in text.splitlines() if line.lstrip().startswith("slot ")]
    # the fetched values leave the driver: their buffers are never reused
    for name in (h1.name, r.name, out.name):
        assert f"over {name} (" not in text and not any(name in line for line in slots)
    assert f"own buffer: {out.name} (returned" in text
    # the bias + activation after each product writes the product's buffer through a kernel
    # variant that stores into its leaf (no aliased output argument)
    (step,) = [st for p in _plans(exe, main) for st in p.walk() if st.kind == "native"]
    assert any("L0[b + c] = " in c.text for _, c in step.compiled.calls)


def test_persistables_written_in_the_block(fresh_programs):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[4, 8], dtype="float32", append_batch_size=False)
    acc = L.create_global_var([4, 8], 0.5, "float32", persistable=True, name="acc")
    y = L.relu(x * 2.0)
    z = L.tanh(y) + acc
    w = L.exp(z * 0.25)
    L.assign(w + y, acc)
    xv = RNG.standard_normal((4, 8)).astype(np.float32)
    (g,), exe, scope = _run_both(main, startup, {"x": xv}, [w], steps=2)
    a = np.full((4, 8), 0.5, np.float32)
    for _ in range(2):
        yv = _relu(xv * 2)
        wv = np.exp((np.tanh(yv) + a) * 0.25)
        a = wv + yv
    np.testing.assert_allclose(g, wv, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(scope.find_var("acc").value), a, rtol=1e-5)


def test_native_while_loop_bodies_are_left_to_numba(fresh_programs):
    main, _ = fresh_programs
    x0 = L.data(name="x", shape=[16], dtype="float32", append_batch_size=False)
    h = L.tanh(x0 * 0.5)
    i0 = L.fill_constant(shape=[1], dtype="int64", value=0)
    n = L.fill_constant(shape=[1], dtype="int64", value=5)
    _, xs = L.while_loop(lambda i, v: L.less_than(i, n),
                         lambda i, v: [L.increment(i, 1.0, in_place=False),
                                       L.relu(v * 0.5 + 1.0) - 0.25],
                         [i0, h], is_test=True)
    out = L.exp(xs) * 2.0
    xv = RNG.standard_normal(16).astype(np.float32)
    (g,), exe, _ = _run_both(main, fluid.Program(), {"x": xv}, [out])
    v = np.tanh(xv * np.float32(0.5))
    for _ in range(5):
        v = _relu(v * np.float32(0.5) + 1) - np.float32(0.25)
    np.testing.assert_allclose(g, np.exp(v) * 2, rtol=1e-5)
    (loop,) = [s for p in _plans(exe, main) for s in p.walk() if s.kind == "native_loop"]
    assert "_mp" not in loop.compiled.text   # compiled as it was generated


def test_a_fallback_reruns_the_references_on_untouched_inputs(fresh_programs):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[16], dtype="float32")
    y = L.data(name="y", shape=[32], dtype="float32")
    h = _fc(_fc(x, 32, "tanh", "g1"), 32, "relu", "g2")
    z = L.elementwise_mul(h, y) + 1.0     # y [1, 32] at run time: not the planned loop form
    out = L.exp(z * 0.1)
    exe, scope = fluid.Executor(strict=False, memory_optim=True), fluid.Scope()
    exe.run(startup, scope=scope)
    xv = RNG.standard_normal((5, 16)).astype(np.float32)
    yv = RNG.standard_normal((1, 32)).astype(np.float32)
    xv0, yv0 = xv.copy(), yv.copy()
    with pytest.warns(FallbackWarning, match="loop form"):
        (g,) = exe.run(main, feed={"x": xv, "y": yv}, fetch_list=[out], scope=scope)
    p = _params(scope, ["g1.w", "g1.b", "g2.w", "g2.b"])
    hv = _relu(np.tanh(xv @ p["g1.w"] + p["g1.b"]) @ p["g2.w"] + p["g2.b"])
    np.testing.assert_allclose(g, np.exp((hv * yv + 1) * 0.1), rtol=1e-5)
    np.testing.assert_array_equal(xv, xv0)
    np.testing.assert_array_equal(yv, yv0)
    (step,) = [s for p in _plans(exe, main) for s in p.walk() if s.kind == "native"]
    assert step.fallbacks == 1 and step.compiled.memory_plan is not None
    # a feed that fits runs natively again, with the same right answer
    yv5 = np.repeat(yv, 5, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        (g5,) = exe.run(main, feed={"x": xv, "y": yv5}, fetch_list=[out], scope=scope)
    np.testing.assert_allclose(g5, g, rtol=1e-6)
    assert step.fallbacks == 1


def test_training_step_matches_numpy(fresh_programs):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[12], dtype="float32")
    t = L.data(name="t", shape=[4], dtype="float32")
    h = _fc(x, 24, "relu", "m1")
    h2 = _fc(h, 24, "tanh", "m2")
    pred = _fc(h2, 4, None, "m3")
    loss = L.mean(L.square_error_cost(pred, t))
    fluid.optimizer.SGD(learning_rate=0.1).minimize(loss)
    xv = RNG.standard_normal((8, 12)).astype(np.float32)
    tv = RNG.standard_normal((8, 4)).astype(np.float32)
    names = [f"m{i}.{k}" for i in range(1, 4) for k in "wb"]
    init = fluid.Scope()
    fluid.Executor().run(startup, scope=init)
    p = _params(init, names)
    (g_loss,), exe, scope = _run_both(main, startup, {"x": xv, "t": tv}, [loss], steps=2)
    losses = []
    for _ in range(2):   # the same two SGD steps in NumPy
        a1 = xv @ p["m1.w"] + p["m1.b"]
        h1 = _relu(a1)
        h2v = np.tanh(h1 @ p["m2.w"] + p["m2.b"])
        pv = h2v @ p["m3.w"] + p["m3.b"]
        losses.append(np.mean((pv - tv) ** 2))
        d_p = 2 * (pv - tv) / pv.size
        d_h2 = (d_p @ p["m3.w"].T) * (1 - h2v ** 2)
        d_h1 = (d_h2 @ p["m2.w"].T) * (a1 > 0)
        grads = {"m3.w": h2v.T @ d_p, "m3.b": d_p.sum(0), "m2.w": h1.T @ d_h2,
                 "m2.b": d_h2.sum(0), "m1.w": xv.T @ d_h1, "m1.b": d_h1.sum(0)}
        p = {k: p[k] - 0.1 * grads[k] for k in names}
    np.testing.assert_allclose(g_loss.reshape(()), losses[-1], rtol=1e-5)
    got = _params(scope, names)
    for k in names:
        np.testing.assert_allclose(got[k], p[k], rtol=1e-4, atol=1e-6, err_msg=k)
    (mp,) = _memory_plans(exe, main)
    assert mp.slots and mp.inplace   # the gradients' buffers are reused
    # the driver keeps exactly the kernels and parallel variants its rewritten source calls
    # (read here from the source, the generator counts them as it writes and switches calls)
    (step,) = [s for p_ in _plans(exe, main) for s in p_.walk()
               if s.kind == "native" and s.compiled.memory_plan is not None]
    drv = step.compiled
    named = set(re.findall(r"\b[KP]\d+\b", drv.source))
    assert {g for g, _ in drv.calls} == {g for g in named if g[0] == "K"}
    assert {g for g, _ in drv.lazy} == {g for g in named if g[0] == "P"}


def _conv(x, w, b, pad):
    """float64 cross-correlation, NCHW, stride 1, plus the bias."""
    n, c, h, wd = x.shape
    k = w.shape[2]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = sum(np.einsum("mc,nchw->nmhw", w[:, :, i, j].astype(np.float64),
                        xp[:, :, i:i + h + 2 * pad - k + 1, j:j + wd + 2 * pad - k + 1])
              for i in range(k) for j in range(k))
    return out + b[None, :, None, None]


def test_a_convolution_takes_the_buffer_of_its_residual(fresh_programs):
    """A bottleneck's last convolution adds the block's input (a residual connection that
    dies there) as it stores: its output takes the residual's buffer (every kernel that adds
    a residual reads each of its values before it writes over it), the values those without
    the plan and NumPy's give. A residual fetched, or read again after, keeps its buffer; so
    does one that is also the convolution's input."""
    main, startup = fresh_programs
    x = L.data(name="x", shape=[8, 16, 16], dtype="float32")
    h = L.conv2d(x, 24, 1, act="relu")                        # conv2d_0
    t = L.conv2d(h, 16, 3, padding=1, act="relu")             # conv2d_1
    out1 = L.relu(L.elementwise_add(L.conv2d(t, 24, 1), h))   # conv2d_2: h dies here
    z = L.conv2d(out1, 24, 1)                                 # conv2d_3
    out2 = L.relu(L.elementwise_add(z, out1))                 # out1: fetched
    out3 = L.elementwise_add(L.conv2d(out2, 24, 1), out2)     # conv2d_4 reads out2 too
    xv = RNG.standard_normal((2, 8, 16, 16)).astype(np.float32)
    (g1, g3), exe, scope = _run_both(main, startup, {"x": xv}, [out1, out3])
    p = [(np.asarray(scope.find_var(f"conv2d_{k}.w_0").get_tensor()),
          np.asarray(scope.find_var(f"conv2d_{k}.b_0").get_tensor())) for k in range(5)]
    w_h = _relu(_conv(xv, *p[0], 0))
    w1 = _relu(_conv(_relu(_conv(w_h, *p[1], 1)), *p[2], 0) + w_h)
    w2 = _relu(_conv(w1, *p[3], 0) + w1)
    np.testing.assert_allclose(g1, w1, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g3, _conv(w2, *p[4], 0) + w2, rtol=1e-4, atol=1e-4)
    (mp,) = _memory_plans(exe, main)
    # (a buffer is named by the first value it holds: a convolution's own output)
    convs = [op.output("Output")[0] for op in main.global_block().ops if op.type == "conv2d"]
    assert [(out, leaf) for _, out, leaf in mp.inplace] == [(convs[2], convs[0])]


def test_a_product_by_a_weight_takes_the_buffer_of_its_residual(fresh_programs):
    """``fc(h) + r`` (an encoder's residual connection) stores into ``r``'s buffer where ``r``
    dies there, not where ``r`` is the product's own input (``fc(h) + h``)."""
    main, startup = fresh_programs

    def fc(v, size, act, name):  # by positions of a sequence: the packed weight's kernel
        return L.fc(v, size, num_flatten_dims=2, act=act,
                    param_attr=fluid.ParamAttr(name=f"{name}.w"),
                    bias_attr=fluid.ParamAttr(name=f"{name}.b"))

    x = L.data(name="x", shape=[20, 24], dtype="float32")
    r = fc(x, 32, "relu", "p0")
    h = fc(x, 24, "tanh", "p1")
    out1 = L.relu(L.elementwise_add(fc(h, 32, None, "p2"), r))     # r dies here
    out2 = L.elementwise_add(fc(out1, 32, None, "p3"), out1)        # out1 is the input
    xv = RNG.standard_normal((3, 20, 24)).astype(np.float32)
    (got,), exe, scope = _run_both(main, startup, {"x": xv}, [out2])
    p = _params(scope, [f"p{i}.{k}" for i in range(4) for k in "wb"])
    w_r = _relu(xv @ p["p0.w"] + p["p0.b"])
    w1 = _relu(np.tanh(xv @ p["p1.w"] + p["p1.b"]) @ p["p2.w"] + p["p2.b"] + w_r)
    np.testing.assert_allclose(got, w1 @ p["p3.w"] + p["p3.b"] + w1, rtol=1e-5, atol=1e-5)
    (mp,) = _memory_plans(exe, main)
    muls = [op.output("Out")[0] for op in main.global_block().ops if op.type == "mul"]
    took = [(out, leaf) for _, out, leaf in mp.inplace]
    assert (muls[2], muls[0]) in took and (muls[3], muls[2]) not in took


def test_peak_memory_of_a_chain_drops(fresh_programs):
    """fc + tanh, six times: each fc's product and each activation is a dead intermediate
    once the next layer has read it."""
    main, startup = fresh_programs
    x = L.data(name="x", shape=[128], dtype="float32")
    h = x
    for k in range(6):
        h = _fc(h, 128, "tanh", f"c{k}")
        h = L.scale(h, scale=0.5, bias=0.1)
    out = L.reduce_sum(h)
    xv = RNG.standard_normal((256, 128)).astype(np.float32)   # 128 KiB per activation
    peaks, results = {}, {}
    for on in (False, True):
        exe, scope = fluid.Executor(strict=True, memory_optim=on), fluid.Scope()
        exe.run(startup, scope=scope)
        exe.run(main, feed={"x": xv}, fetch_list=[out], scope=scope)   # compiles
        for t in threading.enumerate():  # (with a cold cache a thread may still compile a
            if t.name in ("pdjit-tier-up", "pdjit-parallel-variant"):  # faster variant: its
                t.join()                                   # allocations are traced too)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            results[on] = exe.run(main, feed={"x": xv}, fetch_list=[out], scope=scope)[0]
            peaks[on] = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert_native(exe)
    np.testing.assert_array_equal(results[False], results[True])
    act = 256 * 128 * 4
    assert peaks[False] > 8 * act          # every intermediate held to the end
    assert peaks[True] < 3 * act, peaks    # two activations at a time (measured: 2.0)


def test_explain_dump_and_switches(fresh_programs, monkeypatch, capsys):
    main, startup = fresh_programs
    x = L.data(name="x", shape=[16], dtype="float32")
    out = _fc(_fc(x, 16, "relu", "e1"), 16, "tanh", "e2")
    feed = {"x": np.ones((2, 16), np.float32)}
    monkeypatch.setenv("PDJIT_DUMP_AFTER", "memory_plan")
    monkeypatch.delenv("PDJIT_MEMORY_OPTIM", raising=False)
    on = fluid.Executor(strict=True, memory_optim=True)
    text = on.explain(main, feed=feed, fetch_list=[out])
    assert "== memory plan:" in text and "in place:" in text
    assert "==== pdjit: after pass memory_plan ====" in capsys.readouterr().err
    off = fluid.Executor(strict=True)   # the default: off
    assert "== memory plan:" not in off.explain(main, feed=feed, fetch_list=[out])
    monkeypatch.setenv("PDJIT_MEMORY_OPTIM", "1")
    assert fluid.Executor().memory_optim is True
    monkeypatch.setenv("PDJIT_MEMORY_OPTIM", "maybe")
    with pytest.raises(ValueError, match="PDJIT_MEMORY_OPTIM"):
        fluid.Executor()
