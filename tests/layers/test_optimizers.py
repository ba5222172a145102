"""Optimizers, schedules, regularisation and clipping through ``minimize``, against NumPy.

Every expectation is a NumPy formula written here: a linear model ``pred = x @ w + b`` with the
loss ``mean((pred - y)^2)``, whose gradients are written out by hand below.
"""
import math

import numpy as np
import pytest

import pdjit as fluid

RNG = np.random.default_rng(7)
X = RNG.normal(size=(8, 3)).astype(np.float32)
Y = RNG.normal(size=(8, 1)).astype(np.float32)
W0 = RNG.normal(size=(3, 1)).astype(np.float32)
B0 = np.array([0.1], np.float32)


def _grads(w, b):
    r = X @ w + b - Y
    n = r.size
    return (2.0 / n) * X.T @ r, (2.0 / n) * r.sum(axis=0)


def _train(make_opt, steps=4, mode="compiled", param_attr=None, lr_fn=None):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        pred = fluid.layers.fc(x, 1, param_attr=param_attr)
        loss = fluid.layers.mean(fluid.layers.square_error_cost(pred, y))
        lr = lr_fn() if lr_fn else None
        opt = make_opt(lr)
        ops, params_grads = opt.minimize(loss)
    scope, exe = fluid.Scope(), fluid.Executor(mode=mode)
    exe.run(startup, scope=scope)
    scope.var("fc_0.w_0").value = W0.copy()
    scope.var("fc_0.b_0").value = B0.copy()
    fetched = []
    for _ in range(steps):
        fetch = [loss] + ([lr] if lr is not None else [])
        fetched.append(exe.run(main, feed={"x": X, "y": Y}, fetch_list=fetch, scope=scope))
    assert {p.name for p, _ in params_grads} == {"fc_0.w_0", "fc_0.b_0"}
    return scope.find_var("fc_0.w_0").value, scope.find_var("fc_0.b_0").value, fetched


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["compiled", "reference"])
def test_sgd(mode):
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    for _ in range(4):
        gw, gb = _grads(w, b)
        w, b = w - 0.1 * gw, b - 0.1 * gb
    got_w, got_b, _ = _train(lambda lr: fluid.optimizer.SGD(0.1), mode=mode)
    _close(got_w, w)
    _close(got_b, b)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum(nesterov):
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    vw, vb, mu, lr = np.zeros_like(w), np.zeros_like(b), 0.9, 0.05
    for _ in range(4):
        gw, gb = _grads(w, b)
        vw, vb = mu * vw + gw, mu * vb + gb
        if nesterov:
            w, b = w - lr * (gw + mu * vw), b - lr * (gb + mu * vb)
        else:
            w, b = w - lr * vw, b - lr * vb
    got_w, got_b, _ = _train(lambda _: fluid.optimizer.Momentum(lr, mu, use_nesterov=nesterov))
    _close(got_w, w)
    _close(got_b, b)


def _adam_ref(lr, b1, b2, eps, steps, decay=0.0):
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    m = {"w": np.zeros_like(w), "b": np.zeros_like(b)}
    v = {"w": np.zeros_like(w), "b": np.zeros_like(b)}
    for t in range(1, steps + 1):
        gw, gb = _grads(w, b)
        new = {}
        for k, p, g in (("w", w, gw), ("b", b, gb)):
            p = p * (1 - lr * decay)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            new[k] = p - lr_t * m[k] / (np.sqrt(v[k]) + eps * math.sqrt(1 - b2 ** t))
        w, b = new["w"], new["b"]
    return w, b


def test_adam():
    w, b = _adam_ref(0.01, 0.9, 0.999, 1e-8, 5)
    got_w, got_b, _ = _train(lambda _: fluid.optimizer.Adam(0.01), steps=5)
    _close(got_w, w)
    _close(got_b, b)


def test_adamw_decays_weights():
    w, b = _adam_ref(0.01, 0.9, 0.999, 1e-8, 5, decay=0.1)
    got_w, got_b, _ = _train(lambda _: fluid.optimizer.AdamW(0.01, weight_decay=0.1), steps=5)
    _close(got_w, w)
    _close(got_b, b)


def test_adagrad():
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    mw, mb = np.zeros_like(w), np.zeros_like(b)
    for _ in range(4):
        gw, gb = _grads(w, b)
        mw, mb = mw + gw * gw, mb + gb * gb
        w, b = w - 0.1 * gw / (np.sqrt(mw) + 1e-6), b - 0.1 * gb / (np.sqrt(mb) + 1e-6)
    got_w, got_b, _ = _train(lambda _: fluid.optimizer.Adagrad(0.1))
    _close(got_w, w)
    _close(got_b, b)


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop(centered):
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    st = {k: [np.zeros_like(p) for _ in range(3)] for k, p in (("w", w), ("b", b))}
    rho, eps, mom, lr = 0.95, 1e-6, 0.5, 0.01
    for _ in range(4):
        gw, gb = _grads(w, b)
        new = {}
        for k, p, g in (("w", w, gw), ("b", b, gb)):
            ms, mg, m = st[k]
            ms = rho * ms + (1 - rho) * g * g
            if centered:
                mg = rho * mg + (1 - rho) * g
                m = mom * m + lr * g / np.sqrt(ms - mg * mg + eps)
            else:
                m = mom * m + lr * g / np.sqrt(ms + eps)
            st[k] = [ms, mg, m]
            new[k] = p - m
        w, b = new["w"], new["b"]
    got_w, got_b, _ = _train(lambda _: fluid.optimizer.RMSProp(lr, rho, eps, mom, centered))
    _close(got_w, w)
    _close(got_b, b)


def test_l2_regularization_and_param_level_override():
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    for _ in range(3):
        gw, gb = _grads(w, b)
        w, b = w - 0.1 * (gw + 0.5 * np.sign(w)), b - 0.1 * (gb + 0.2 * b)
    got_w, got_b, _ = _train(
        lambda _: fluid.optimizer.SGD(0.1, regularization=fluid.regularizer.L2Decay(0.2)),
        steps=3, param_attr=fluid.ParamAttr(regularizer=fluid.regularizer.L1Decay(0.5)))
    _close(got_w, w)
    _close(got_b, b)


@pytest.mark.parametrize("kind", ["value", "norm", "global_norm"])
def test_gradient_clipping(kind):
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    for _ in range(3):
        gw, gb = _grads(w, b)
        if kind == "value":
            gw, gb = np.clip(gw, -0.05, 0.05), np.clip(gb, -0.05, 0.05)
        elif kind == "norm":
            gw = gw * 0.05 / max(np.linalg.norm(gw), 0.05)
            gb = gb * 0.05 / max(np.linalg.norm(gb), 0.05)
        else:
            g = math.sqrt((gw ** 2).sum() + (gb ** 2).sum())
            gw, gb = gw * 0.05 / max(g, 0.05), gb * 0.05 / max(g, 0.05)
        w, b = w - 0.1 * gw, b - 0.1 * gb
    clip = {"value": fluid.clip.GradientClipByValue(0.05),
            "norm": fluid.clip.GradientClipByNorm(0.05),
            "global_norm": fluid.clip.GradientClipByGlobalNorm(0.05)}[kind]
    got_w, got_b, _ = _train(lambda _: fluid.optimizer.SGD(0.1, grad_clip=clip), steps=3)
    _close(got_w, w)
    _close(got_b, b)


SCHEDULES = {
    "exponential": (lambda: fluid.layers.exponential_decay(0.1, 2, 0.5),
                    lambda t: 0.1 * 0.5 ** (t / 2)),
    "exponential_staircase": (lambda: fluid.layers.exponential_decay(0.1, 2, 0.5, True),
                              lambda t: 0.1 * 0.5 ** math.floor(t / 2)),
    "natural_exp": (lambda: fluid.layers.natural_exp_decay(0.1, 2, 0.5),
                    lambda t: 0.1 * math.exp(-0.5 * t / 2)),
    "inverse_time": (lambda: fluid.layers.inverse_time_decay(0.1, 2, 0.5),
                     lambda t: 0.1 / (1 + 0.5 * t / 2)),
    "polynomial": (lambda: fluid.layers.polynomial_decay(0.1, 3, 0.01, 2.0),
                   lambda t: (0.1 - 0.01) * (1 - min(t, 3) / 3) ** 2 + 0.01),
    "piecewise": (lambda: fluid.layers.piecewise_decay([1, 3], [0.1, 0.05, 0.01]),
                  lambda t: 0.1 if t < 1 else 0.05 if t < 3 else 0.01),
    "cosine": (lambda: fluid.layers.cosine_decay(0.1, 2, 3),
               lambda t: 0.1 * 0.5 * (math.cos(math.floor(t / 2) * math.pi / 3) + 1)),
    "warmup": (lambda: fluid.layers.linear_lr_warmup(0.1, 2, 0.0, 0.1),
               lambda t: 0.0 + 0.1 * t / 2 if t < 2 else 0.1),
    "noam": (lambda: fluid.layers.noam_decay(16, 2),
             lambda t: 16 ** -0.5 * min((t + 1) ** -0.5, (t + 1) * 2 ** -1.5)),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_learning_rate_schedules(name):
    make, formula = SCHEDULES[name]
    steps = 5
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    for t in range(steps):
        gw, gb = _grads(w, b)
        w, b = w - formula(t) * gw, b - formula(t) * gb
    got_w, got_b, fetched = _train(lambda lr: fluid.optimizer.SGD(lr), steps=steps,
                                   lr_fn=make)
    lrs = [float(np.asarray(f[1]).reshape(-1)[0]) for f in fetched]
    np.testing.assert_allclose(lrs, [formula(t) for t in range(steps)], rtol=1e-5, atol=1e-7)
    _close(got_w, w)
    _close(got_b, b)


def test_minimize_refuses_a_loss_with_many_values():
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        out = fluid.layers.fc(x, 2)
        with pytest.raises(ValueError, match="the loss must hold one value"):
            fluid.optimizer.SGD(0.1).minimize(out)
    with pytest.raises(TypeError, match="learning_rate must be a float or a Variable"):
        fluid.optimizer.SGD("fast")


def test_clone_for_test_drops_training_ops_and_switches_dropout():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        h = fluid.layers.dropout(fluid.layers.fc(x, 4), dropout_prob=0.5)
        loss = fluid.layers.mean(h)
        test_prog = main.clone(for_test=True)
        fluid.optimizer.SGD(0.1).minimize(loss)
        test_after = main.clone(for_test=True)
    for prog in (test_prog, test_after):
        types = [op.type for op in prog.global_block().ops]
        assert "sgd" not in types and not any(t.endswith("_grad") for t in types)
        drop = next(op for op in prog.global_block().ops if op.type == "dropout")
        assert drop.attr("is_test") is True


def test_regularizer_coefficient_as_fluid1_and_paddle2_name_it():
    """``L2DecayRegularizer(regularization_coeff=c)`` (Fluid 1.x), ``L2Decay(coeff=c)``
    (Paddle 2.x) and ``L2Decay(c)`` are one regularizer; a bad coefficient names it."""
    from pdjit.framework.errors import LayerInputError
    reg = fluid.regularizer
    assert reg.L2DecayRegularizer(regularization_coeff=0.25).coeff == 0.25
    assert reg.L1DecayRegularizer(regularization_coeff=np.float32(0.5)).coeff == 0.5
    assert reg.L2Decay(coeff=0.125).coeff == reg.L2Decay(0.125).coeff == 0.125
    assert reg.L2Decay().coeff == 0.0
    for bad in (dict(regularization_coeff=-1.0), dict(coeff="0.1"),
                dict(regularization_coeff=0.1, coeff=0.2)):
        with pytest.raises(LayerInputError, match="L2Decay.*coeff"):
            reg.L2DecayRegularizer(**bad)
