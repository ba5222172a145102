"""Loss and utility layers (``pdjit.layers.loss``, ``pdjit.layers.misc``) used as a Fluid 1.8
script uses them, against NumPy written here; Print's output captured in both modes."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(5)
XV = RNG.normal(size=(4, 3)).astype(np.float32)
YV = RNG.uniform(0.05, 0.95, size=(4, 3)).astype(np.float32)


def _run(main, feed, fetch, startup=None, mode="compiled", scope=None):
    scope = scope if scope is not None else fluid.Scope()
    exe = fluid.Executor(fluid.CPUPlace(), mode=mode)
    if startup is not None:
        exe.run(startup, scope=scope)
    out = exe.run(main, feed=feed, fetch_list=fetch, scope=scope)
    return out, exe


def _xy():
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.data(name="y", shape=[3], dtype="float32")
    return x, y


def test_loss_layers(fresh_programs):
    main, _ = fresh_programs
    x, y = _xy()
    sce = fluid.layers.sigmoid_cross_entropy_with_logits(x, y)
    bce = fluid.layers.bce_loss(fluid.layers.sigmoid(x), y)
    hub = fluid.layers.huber_loss(x, y, delta=0.5)
    sl1 = fluid.layers.smooth_l1(x, y, sigma=2.0)
    kl = fluid.layers.kldiv_loss(fluid.layers.log_softmax(x), fluid.layers.softmax(y),
                                 reduction="batchmean")
    got, exe = _run(main, {"x": XV, "y": YV}, [sce, bce, hub, sl1, kl])
    assert_native(exe)
    x64, y64 = XV.astype(np.float64), YV.astype(np.float64)
    sig = 1 / (1 + np.exp(-x64))
    r = y64 - x64
    d = x64 - y64
    logp = x64 - np.log(np.exp(x64).sum(1, keepdims=True))
    q = np.exp(y64) / np.exp(y64).sum(1, keepdims=True)
    want = [np.logaddexp(0, x64) - x64 * y64,
            -(y64 * np.log(sig) + (1 - y64) * np.log(1 - sig)),
            np.where(np.abs(r) <= 0.5, 0.5 * r * r, 0.5 * (np.abs(r) - 0.25)),
            np.where(np.abs(d) < 0.25, 2 * d * d, np.abs(d) - 0.125).sum(1, keepdims=True),
            (q * (np.log(q) - logp)).sum() / 4]
    for g, w, name in zip(got, want, ["sce", "bce", "huber", "smooth_l1", "kldiv"]):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, err_msg=name)
    assert sl1.shape == (-1, 1) and kl.shape == (1,)


def test_sigmoid_cross_entropy_trains_a_logistic_regression(fresh_programs):
    """The loss and its gradient in a training program: SGD fits separable data."""
    main, startup = fresh_programs
    x = fluid.layers.data(name="x", shape=[2], dtype="float32")
    label = fluid.layers.data(name="label", shape=[1], dtype="float32")
    zero = fluid.ParamAttr(initializer=fluid.initializer.Constant(0.0))
    logit = fluid.layers.fc(x, 1, param_attr=zero, bias_attr=zero)
    loss = fluid.layers.mean(fluid.layers.sigmoid_cross_entropy_with_logits(logit, label))
    fluid.optimizer.SGD(learning_rate=0.5).minimize(loss)
    xs = np.random.default_rng(0).normal(size=(64, 2)).astype(np.float32)
    ys = (xs @ np.array([2.0, -1.0]) > 0).astype(np.float32).reshape(-1, 1)
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed={"x": xs, "label": ys}, fetch_list=[loss],
                            scope=scope)[0][0]) for _ in range(30)]
    assert_native(exe)
    assert abs(losses[0] - np.log(2)) < 1e-6  # zero weights: every probability is 1/2
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.35, losses


def _value_and_grad(layer, xv, wv):
    """``layer(x)`` and d(sum(w * layer(x)))/dx, in a program of their own."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[3], dtype="float64")
        x.stop_gradient = False
        w = fluid.layers.data(name="w", shape=[3], dtype="float64")
        out = layer(x)
        (gx,) = fluid.gradients([fluid.layers.reduce_sum(fluid.layers.elementwise_mul(out, w))],
                                [x])
    got, exe = _run(main, {"x": xv, "w": wv}, [out, gx])
    assert_native(exe)
    return got


def test_l2_normalize_and_log_softmax_with_gradients():
    xv, wv = XV.astype(np.float64), RNG.normal(size=(4, 3))
    nn, dn = _value_and_grad(lambda x: fluid.layers.l2_normalize(x, axis=1), xv, wv)
    ll, dl = _value_and_grad(lambda x: fluid.layers.log_softmax(x, axis=-1), xv, wv)
    norm = np.sqrt((xv ** 2).sum(1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(nn, xv / norm, rtol=1e-7)
    np.testing.assert_allclose(ll, xv - np.log(np.exp(xv).sum(1, keepdims=True)), rtol=1e-7)
    # d(w . x/|x|)/dx = w/|x| - x (w . x) / |x|^3 ; d(w . log_softmax(x))/dx = w - softmax * sum w
    np.testing.assert_allclose(dn, wv / norm - xv * (wv * xv).sum(1, keepdims=True) / norm ** 3,
                               rtol=1e-6)
    sm = np.exp(xv) / np.exp(xv).sum(1, keepdims=True)
    np.testing.assert_allclose(dl, wv - sm * wv.sum(1, keepdims=True), rtol=1e-6)


def test_l2_normalize_of_a_vector_uses_axis_0(fresh_programs):
    main, _ = fresh_programs
    v = fluid.layers.data(name="v", shape=[5], dtype="float32", append_batch_size=False)
    out = fluid.layers.l2_normalize(v, axis=3)
    vv = np.arange(1, 6, dtype=np.float32)
    (got,), _ = _run(main, {"v": vv}, [out])
    np.testing.assert_allclose(got, vv / np.linalg.norm(vv), rtol=1e-6)


# ---- random layers ----------------------------------------------------------------------------
def test_random_layers_moments_and_seeds(fresh_programs):
    main, startup = fresh_programs
    u = fluid.layers.uniform_random([200, 100], min=-2.0, max=4.0, seed=7)
    g = fluid.layers.gaussian_random([200, 100], mean=1.5, std=0.5, seed=7, dtype="float64")
    u0 = fluid.layers.uniform_random([1000])
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.Scope()
    uu, gg, a = exe.run(main, fetch_list=[u, g, u0], scope=scope)
    uu2, gg2, b = exe.run(main, fetch_list=[u, g, u0], scope=scope)
    assert uu.dtype == np.float32 and uu.shape == (200, 100) and gg.dtype == np.float64
    assert uu.min() >= -2.0 and uu.max() < 4.0
    # moments of 20,000 draws: mean within ~5 standard errors
    assert abs(uu.mean() - 1.0) < 5 * 6 / np.sqrt(12 * uu.size)
    assert abs(uu.var() - 36 / 12) < 0.1
    assert abs(gg.mean() - 1.5) < 5 * 0.5 / np.sqrt(gg.size)
    assert abs(gg.std() - 0.5) < 0.01
    # a fixed seed draws the same numbers every run; seed 0 new ones in each run
    np.testing.assert_array_equal(uu, uu2)
    np.testing.assert_array_equal(gg, gg2)
    assert not np.array_equal(a, b)


def test_random_layers_follow_the_program_seed():
    def draw():
        main, startup = fluid.Program(), fluid.Program()
        main.random_seed = 123
        with fluid.program_guard(main, startup):
            u = fluid.layers.uniform_random([4, 3])
            n = fluid.layers.fill_constant([1], "int64", 6)
            g = fluid.layers.gaussian_random([2, n], std=2.0)
        (uu, gg), _ = _run(main, {}, [u, g])
        return uu, gg
    (u1, g1), (u2, g2) = draw(), draw()
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(g1, g2)
    assert g1.shape == (2, 6)


def test_random_layers_reject_bad_arguments(fresh_programs):
    with pytest.raises(TypeError, match="uniform_random: dtype must be float"):
        fluid.layers.uniform_random([2], dtype="int32")
    with pytest.raises(ValueError, match="min must be <= max"):
        fluid.layers.uniform_random([2], min=1.0, max=0.0)
    with pytest.raises(TypeError, match="gaussian_random: shape must hold ints"):
        fluid.layers.gaussian_random([2, 1.5])


# ---- linspace and the checks ------------------------------------------------------------------
def test_linspace_layer(fresh_programs):
    main, _ = fresh_programs
    a = fluid.layers.linspace(0, 1, 5)
    stop = fluid.layers.fill_constant([1], "float64", 10.0)
    num = fluid.layers.fill_constant([1], "int32", 4)
    b = fluid.layers.linspace(0, stop, num, dtype="int32")
    assert a.shape == (5,) and b.shape == (-1,)
    (aa, bb), exe = _run(main, {}, [a, b])
    assert_native(exe)
    np.testing.assert_allclose(aa, np.linspace(0, 1, 5).astype(np.float32))
    np.testing.assert_array_equal(bb, np.array([0, 3, 6, 10], np.int32))  # Paddle 3.3.1's values
    with pytest.raises(TypeError, match="linspace: dtype must be"):
        fluid.layers.linspace(0, 1, 3, dtype="bool")


@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_isfinite_has_nan_has_inf(fresh_programs, mode):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    outs = [fluid.layers.isfinite(x), fluid.layers.has_nan(x), fluid.layers.has_inf(x)]
    assert all(o.shape == (1,) and o.dtype == np.bool_ for o in outs)
    cases = {"finite": XV, "nan": np.where(XV > 1, np.nan, XV).astype(np.float32),
             "inf": np.where(XV > 1, -np.inf, XV).astype(np.float32)}
    assert np.isnan(cases["nan"]).any() and np.isinf(cases["inf"]).any()
    for v in cases.values():
        got, _ = _run(main, {"x": v}, outs, mode=mode)
        want = [np.isfinite(v).all(), np.isnan(v).any(), np.isinf(v).any()]
        assert [bool(g[0]) for g in got] == want


# ---- Print ------------------------------------------------------------------------------------
def _printed(text):
    """The blocks of printed tensors: [{field: value}]."""
    blocks = []
    for line in text.splitlines():
        if line.startswith("Variable: "):
            blocks.append({"name": line[len("Variable: "):]})
        elif line.startswith("  - "):
            key, _, value = line[4:].partition(": ")
            if not blocks or key in blocks[-1]:
                blocks.append({})
            blocks[-1][key] = value
    return blocks


@pytest.mark.filterwarnings("ignore::pdjit.framework.errors.ReferenceStepWarning")
@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_print_prints_as_the_program_runs(fresh_programs, capsys, mode):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    p = fluid.layers.Print(x, message="the x", summarize=4)
    out = fluid.layers.scale(p, scale=2.0)
    capsys.readouterr()
    (got,), exe = _run(main, {"x": XV}, [out], mode=mode)
    if mode == "compiled":
        assert_native(exe)  # the scale after the print step
    np.testing.assert_allclose(got, 2 * XV)
    (block,) = _printed(capsys.readouterr().out)
    assert block == {"name": "x", "message": "the x", "lod": "{}", "place": "Place(cpu)",
                     "shape": "[4, 3]", "layout": "NCHW", "dtype": "float32",
                     "data": "[" + " ".join(f"{v:f}" for v in XV.reshape(-1)[:4]) + "]"}


def test_print_first_n_fields_and_lod(fresh_programs, capsys):
    main, _ = fresh_programs
    s = fluid.layers.data(name="s", shape=[1], dtype="int64", lod_level=1)
    fluid.layers.Print(s, first_n=2, summarize=-1, print_tensor_type=False,
                       print_tensor_shape=False)
    fluid.layers.Print(s, print_tensor_name=False, print_tensor_lod=False, summarize=1)
    value = fluid.LoDTensor(np.arange(5, dtype=np.int64).reshape(5, 1), [[0, 2, 5]])
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.Scope()
    capsys.readouterr()
    for _ in range(3):
        exe.run(main, feed={"s": value}, scope=scope)  # nothing fetched: Print still runs
    blocks = _printed(capsys.readouterr().out)
    first = [b for b in blocks if b.get("name") == "s"]
    second = [b for b in blocks if "name" not in b]
    assert len(first) == 2 and len(second) == 3  # first_n=2; -1: every run
    assert first[0] == {"name": "s", "lod": "{{0, 2, 5}}", "place": "Place(cpu)",
                        "layout": "NCHW", "data": "[0.000000 1.000000 2.000000 3.000000 "
                                                  "4.000000]"}
    assert second[0] == {"place": "Place(cpu)", "shape": "[5, 1]", "layout": "NCHW",
                         "dtype": "int64", "data": "[0.000000]"}


@pytest.mark.parametrize("phase,forward,backward", [("both", True, True),
                                                    ("forward", True, False),
                                                    ("backward", False, True)])
def test_print_phases_and_gradient_through_print(fresh_programs, capsys, phase, forward,
                                                 backward):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float64")
    x.stop_gradient = False
    p = fluid.layers.Print(x, message="m", print_phase=phase)
    y = fluid.layers.scale(p, scale=3.0)
    (gx,) = fluid.gradients([fluid.layers.reduce_sum(y)], [x])
    capsys.readouterr()
    (g,), _ = _run(main, {"x": XV.astype(np.float64)}, [gx])
    np.testing.assert_array_equal(g, np.full((4, 3), 3.0))  # the gradient passes through
    names = [b.get("name") for b in _printed(capsys.readouterr().out)]
    assert ("x" in names) == forward
    assert any(n and n.endswith("@GRAD") for n in names) == backward
    with pytest.raises(ValueError, match="print_phase must be"):
        fluid.layers.Print(x, print_phase="sideways")


def test_autoincreased_step_counter_counts_runs(fresh_programs):
    main, startup = fresh_programs
    x, _ = _xy()
    first = fluid.layers.autoincreased_step_counter()            # begin=1, step=1
    assert fluid.layers.autoincreased_step_counter() is first    # one counter, one increment
    other = fluid.layers.autoincreased_step_counter("@MY_COUNTER@", begin=5, step=2)
    total = fluid.layers.reduce_sum(x)
    assert (first.name, first.dtype, list(first.shape)) == ("@STEP_COUNTER@", np.int64, [1])
    assert [op.type for op in main.global_block().ops].count("increment") == 2
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    seen = [exe.run(main, feed={"x": XV}, fetch_list=[first, other, total], scope=scope)[:2]
            for _ in range(3)]
    assert_native(exe)
    # Paddle starts a counter at begin - 1: the first run sees begin - 1 + step
    assert [(int(a[0]), int(b[0])) for a, b in seen] == [(1, 6), (2, 8), (3, 10)]
    with pytest.raises(TypeError, match=r"autoincreased_step_counter: step must be an int"):
        fluid.layers.autoincreased_step_counter("c", step=0.5)
