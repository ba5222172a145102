"""Adamax, Adadelta, DecayedAdagrad, Ftrl, Lamb, LarsMomentum, ExponentialMovingAverage,
ModelAverage and set_gradient_clip, against NumPy formulas written here.

Each update op runs once on fixed values in a strict compiled executor (and the plan must hold
a native step, so the native lowering ran), then by reference; the expectation is the update
rule in float64 NumPy. Shapes are shared so each kernel compiles once. The Paddle parity test
(``@pytest.mark.paddle``) runs Paddle's legacy ops on the same values in a subprocess.
"""

import importlib.util
import pickle
import subprocess
import sys

import numpy as np
import pytest

import pdjit as fluid
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(11)
P = RNG.normal(size=(3, 4)).astype(np.float32)
G = RNG.normal(size=(3, 4)).astype(np.float32)
A = np.abs(RNG.normal(size=(3, 4))).astype(np.float32) + 0.1   # a non-negative state
B = RNG.normal(size=(3, 4)).astype(np.float32)                  # a signed state
P2 = RNG.normal(size=(5,)).astype(np.float32)
G2 = RNG.normal(size=(5,)).astype(np.float32)
V2 = RNG.normal(size=(5,)).astype(np.float32)
LR = np.array([0.1], np.float32)


def f64(*a):
    return [np.asarray(x, np.float64) for x in a]


def run_update(op_type, inputs, attrs, outputs=None):
    """Run one op compiled (strict; a native step must have run) and by reference; return the
    compiled outputs after checking the two agree."""
    results = []
    for mode in ("compiled", "reference"):
        prog, feed, out_vars = build_op_program(op_type, inputs, attrs, outputs=outputs)
        fetch = [v for vs in out_vars.values() for v in vs]
        exe = Executor(mode=mode, strict=True)
        got = exe.run(prog, feed=feed, fetch_list=fetch, scope=Scope())
        if mode == "compiled":
            assert_native(exe, op_type)
            kinds = [s.kind for _, plan in exe._plans.values() for s in plan.walk()]
            assert "reference" not in kinds, f"{op_type}: a step ran by reference: {kinds}"
        it = iter(got)
        results.append({k: [next(it) for _ in vs] if len(vs) > 1 else next(it)
                        for k, vs in out_vars.items()})
    for k in results[0]:
        pairs = zip(results[0][k], results[1][k]) if isinstance(results[0][k], list) else \
            [(results[0][k], results[1][k])]
        for a, b in pairs:
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                       rtol=2e-6, atol=1e-7,
                                       err_msg=f"{op_type} {k}: compiled vs reference")
    return results[0]


def close(got, want, what=""):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=1e-6,
                               err_msg=what)


# ---- the update rules, one op at a time --------------------------------------------------------
def test_adamax_rule():
    b1, b2, eps, b1p = 0.9, 0.999, 1e-8, 0.81
    got = run_update("adamax", dict(Param=P, Grad=G, LearningRate=LR, Moment=B, InfNorm=A,
                                    Beta1Pow=np.array([b1p], np.float32)), {})
    p, g, m, u = f64(P, G, B, A)
    m = b1 * m + (1 - b1) * g
    u = np.maximum(b2 * u + eps, np.abs(g))
    close(got["MomentOut"], m)
    close(got["InfNormOut"], u)
    close(got["ParamOut"], p - 0.1 / (1 - b1p) * m / u)


def test_adadelta_rule():
    rho, eps = 0.9, 0.1   # the training test's (one kernel for both)
    got = run_update("adadelta", dict(Param=P, Grad=G, AvgSquaredGrad=A, AvgSquaredUpdate=A * 2,
                                      LearningRate=LR), {"rho": rho, "epsilon": eps})
    p, g, sg, su = f64(P, G, A, A * 2)
    sg = rho * sg + (1 - rho) * g * g
    upd = -np.sqrt((su + eps) / (sg + eps)) * g
    close(got["AvgSquaredGradOut"], sg)
    close(got["AvgSquaredUpdateOut"], rho * su + (1 - rho) * upd * upd)
    close(got["ParamOut"], p + 0.1 * upd)


def test_decayed_adagrad_rule():
    got = run_update("decayed_adagrad", dict(Param=P, Grad=G, Moment=A, LearningRate=LR),
                     {"decay": 0.9, "epsilon": 1e-6})
    p, g, m = f64(P, G, A)
    m = 0.9 * m + 0.1 * g * g
    close(got["MomentOut"], m)
    close(got["ParamOut"], p - 0.1 * g / (np.sqrt(m) + 1e-6))


def np_ftrl(p, sq, lin, g, lr, l1, l2, lr_power):
    new_sq = sq + g * g
    e = -lr_power
    lin = lin + g - (new_sq ** e - sq ** e) / lr * p
    y = new_sq ** e / lr + 2 * l2
    new_p = np.where(np.abs(lin) > l1, (l1 * np.sign(lin) - lin) / y, 0.0)
    return new_p, new_sq, lin


# lr_power = -0.5 (square roots) with the training test's l1/l2; another power with an l1 that
# shrinks some of the values to 0
@pytest.mark.parametrize("lr_power,l1,l2", [(-0.5, 0.01, 0.01), (-0.25, 0.5, 0.25)])
def test_ftrl_rule(lr_power, l1, l2):
    got = run_update("ftrl", dict(Param=P, SquaredAccumulator=A, LinearAccumulator=B, Grad=G,
                                  LearningRate=LR), {"l1": l1, "l2": l2, "lr_power": lr_power})
    p, sq, lin = np_ftrl(*f64(P, A, B, G), 0.1, l1, l2, lr_power)
    if l1 > 0.1:
        assert (p == 0).any() and (p != 0).any()   # both sides of the l1 shrinkage
    close(got["ParamOut"], p)
    close(got["SquaredAccumOut"], sq)
    close(got["LinearAccumOut"], lin)


def np_lamb(p, g, m1, m2, b1p, b2p, lr, wd, b1=0.9, b2=0.999, eps=1e-6, adapt=None):
    m1 = b1 * m1 + (1 - b1) * g
    m2 = b2 * m2 + (1 - b2) * g * g
    r = (m1 / (1 - b1p)) / (np.sqrt(m2 / (1 - b2p)) + eps) + wd * p
    pn, rn = np.linalg.norm(p), np.linalg.norm(r)
    adapt = wd > 0 if adapt is None else adapt
    trust = pn / rn if adapt and pn > 0 and rn > 0 else 1.0
    return p - lr * trust * r, m1, m2


@pytest.mark.parametrize("wd,always_adapt", [(0.01, False), (0.0, False), (0.0, True)])
def test_lamb_rule(wd, always_adapt):
    got = run_update("lamb", dict(Param=P, Grad=G, LearningRate=LR, Moment1=B, Moment2=A,
                                  Beta1Pow=np.array([0.81], np.float32),
                                  Beta2Pow=np.array([0.998], np.float32)),
                     {"weight_decay": wd, "always_adapt": always_adapt},
                     outputs={"Beta1PowOut": 1, "Beta2PowOut": 1})
    p, m1, m2 = np_lamb(*f64(P, G, B, A), 0.81, 0.998, 0.1, wd, adapt=wd > 0 or always_adapt)
    close(got["ParamOut"], p)
    close(got["Moment1Out"], m1)
    close(got["Moment2Out"], m2)
    close(got["Beta1PowOut"], [0.81 * 0.9])
    close(got["Beta2PowOut"], [0.998 * 0.999])


def np_lars(p, g, v, lr, mu, coeff, wd, eps, rescale=1.0):
    g = g * rescale
    pn, gn = np.linalg.norm(p), np.linalg.norm(g)
    local = lr * coeff * pn / (gn + wd * pn + eps) if pn > 0 and gn > 0 else lr
    v = mu * v + local * (g + wd * p)
    return p - v, v


def test_lars_momentum_rule_two_params():
    attrs = {"mu": 0.9, "lars_coeff": 0.001, "lars_weight_decay": [0.0005, 0.001],
             "epsilon": 1e-3, "rescale_grad": 0.5}
    got = run_update("lars_momentum",
                     dict(Param=[P, P2], Grad=[G, G2], Velocity=[B, V2], LearningRate=[LR, LR]),
                     attrs, outputs={"ParamOut": 2, "VelocityOut": 2})
    for k, (p, g, v, wd) in enumerate(((P, G, B, 0.0005), (P2, G2, V2, 0.001))):
        want_p, want_v = np_lars(*f64(p, g, v), 0.1, 0.9, 0.001, wd, 1e-3, rescale=0.5)
        close(got["ParamOut"][k], want_p, f"ParamOut[{k}]")
        close(got["VelocityOut"][k], want_v, f"VelocityOut[{k}]")


def test_lars_momentum_zero_param_uses_the_plain_rate():
    got = run_update("lars_momentum", dict(Param=[np.zeros_like(P)], Grad=[G], Velocity=[B],
                                           LearningRate=[LR]),
                     {"mu": 0.9, "lars_coeff": 0.05, "lars_weight_decay": [0.001]})
    close(got["VelocityOut"], 0.9 * B.astype(np.float64) + 0.1 * G)


def np_average_accumulates(state, param, rate, min_w, max_w):
    s1, s2, s3, acc, old, upd = state
    upd, acc, s1 = upd + 1, acc + 1, s1 + param
    if upd % 16384 == 0:
        s2, s1 = s2 + s1, np.zeros_like(s1)
    if acc >= min_w and acc >= min(max_w, int(upd * rate)):
        s3, s1, s2 = s1 + s2, np.zeros_like(s1), np.zeros_like(s2)
        old, acc = acc, 0
    return [s1, s2, s3, acc, old, upd]


def test_average_accumulates_rule_and_its_errors():
    # the 16384th update moves sum_1 into sum_2, then the window restarts (6 >= 2, 6 >= 3)
    state = [P * 10, P * 100, P * 1000, 5, 3, 16383]
    ins = {"param": P, "in_sum_1": state[0], "in_sum_2": state[1], "in_sum_3": state[2],
           "in_num_accumulates": np.array([5], np.int64),
           "in_old_num_accumulates": np.array([3], np.int64),
           "in_num_updates": np.array([16383], np.int64)}
    attrs = {"average_window": 0.5, "min_average_window": 2, "max_average_window": 3}
    got = list(run_update("average_accumulates", ins, attrs).values())
    want = np_average_accumulates([np.asarray(x, np.float64) for x in state[:3]] + state[3:],
                                  P.astype(np.float64), 0.5, 2, 3)
    for g, w in zip(got, want):
        close(g, np.reshape(w, np.shape(g)))
    assert got[3].dtype == np.int64 and list(got[5]) == [16384]
    bad = dict(attrs, min_average_window=30)
    prog, feed, outs = build_op_program("average_accumulates", ins, bad)
    with pytest.raises(Exception, match="min_average_window must be <= max_average_window"):
        Executor(mode="reference").run(prog, feed=feed, scope=Scope(),
                                       fetch_list=[v for vs in outs.values() for v in vs])


def test_update_ops_refuse_mismatched_state():
    with pytest.raises(Exception, match=r"adamax: InfNorm must match Param"):
        build_op_program("adamax", dict(Param=P, Grad=G, LearningRate=LR, Moment=B,
                                        InfNorm=P2, Beta1Pow=np.array([0.9], np.float32)), {})
    with pytest.raises(Exception, match=r"lars_momentum: lars_weight_decay must hold one value"):
        build_op_program("lars_momentum", dict(Param=[P], Grad=[G], Velocity=[B],
                                               LearningRate=[LR]),
                         {"mu": 0.9, "lars_weight_decay": [0.1, 0.2, 0.3]})


# ---- through minimize: a linear model trained a few steps ------------------------------------
X = RNG.normal(size=(8, 3)).astype(np.float32)
W_TRUE = np.array([[1.5], [-2.0], [0.5]], np.float32)
Y = X @ W_TRUE + 0.3
W0 = RNG.normal(size=(3, 1)).astype(np.float32)
B0 = np.array([0.1], np.float32)


def np_grads(w, b):
    r = X @ w + b - Y
    return (2.0 / r.size) * X.T @ r, (2.0 / r.size) * r.sum(axis=0)


def build(make_opt, extra=None):
    """The model and its training program; ``extra(main)`` runs in the program guard."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        pred = fluid.layers.fc(x, 1)
        loss = fluid.layers.mean(fluid.layers.square_error_cost(pred, y))
        opt = make_opt()
        if opt is not None:
            opt.minimize(loss)
        made = extra(main) if extra else None
    scope, exe = Scope(), fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    scope.var("fc_0.w_0").value = W0.copy()
    scope.var("fc_0.b_0").value = B0.copy()
    return main, loss, scope, exe, made


def train(main, loss, scope, exe, steps):
    losses, params = [], []
    for _ in range(steps):
        losses.append(float(exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss],
                                    scope=scope)[0][0]))
        params.append((np.array(scope.find_var("fc_0.w_0").value),
                       np.array(scope.find_var("fc_0.b_0").value)))
    assert_native(exe, "training step")
    return losses, params


def np_adamax(lr, b1=0.9, b2=0.999, eps=1e-8):
    def step(p, g, s, t):
        s.setdefault("m", np.zeros_like(p))
        s.setdefault("u", np.zeros_like(p))
        s["m"] = b1 * s["m"] + (1 - b1) * g
        s["u"] = np.maximum(b2 * s["u"] + eps, np.abs(g))
        return p - lr / (1 - b1 ** t) * s["m"] / s["u"]
    return step


def np_adadelta(lr, rho=0.95, eps=1e-6):
    def step(p, g, s, t):
        sg = rho * s.get("sg", 0 * p) + (1 - rho) * g * g
        d = -np.sqrt((s.get("su", 0 * p) + eps) / (sg + eps)) * g
        s["sg"], s["su"] = sg, rho * s.get("su", 0 * p) + (1 - rho) * d * d
        return p + lr * d
    return step


def np_decayed_adagrad(lr, decay=0.95, eps=1e-6):
    def step(p, g, s, t):
        s["m"] = decay * s.get("m", 0 * p) + (1 - decay) * g * g
        return p - lr * g / (np.sqrt(s["m"]) + eps)
    return step


def np_ftrl_opt(lr, l1, l2, lr_power):
    def step(p, g, s, t):
        p, s["sq"], s["lin"] = np_ftrl(p, s.get("sq", 0 * p), s.get("lin", 0 * p), g, lr, l1,
                                       l2, lr_power)
        return p
    return step


def np_lamb_opt(lr, wd):
    def step(p, g, s, t):
        p, s["m1"], s["m2"] = np_lamb(p, g, s.get("m1", 0 * p), s.get("m2", 0 * p), 0.9 ** t,
                                      0.999 ** t, lr, wd)
        return p
    return step


def np_lars_opt(lr, mu, coeff, wd):
    def step(p, g, s, t):
        p, s["v"] = np_lars(p, g, s.get("v", 0 * p), lr, mu, coeff, wd, 0.0)
        return p
    return step


OPTIMIZERS = {
    "adamax": (lambda: fluid.optimizer.Adamax(0.1), np_adamax(0.1)),
    "adadelta": (lambda: fluid.optimizer.AdadeltaOptimizer(learning_rate=1.0, epsilon=0.1,
                                                           rho=0.9),
                 np_adadelta(1.0, rho=0.9, eps=0.1)),
    "decayed_adagrad": (lambda: fluid.optimizer.DecayedAdagrad(0.1, decay=0.9),
                        np_decayed_adagrad(0.1, decay=0.9)),
    "ftrl": (lambda: fluid.optimizer.FtrlOptimizer(0.5, l1=0.01, l2=0.01),
             np_ftrl_opt(0.5, 0.01, 0.01, -0.5)),
    "lamb": (lambda: fluid.optimizer.Lamb(0.05, lamb_weight_decay=0.01),
             np_lamb_opt(0.05, 0.01)),
    "lars_momentum": (lambda: fluid.optimizer.LarsMomentumOptimizer(1.0, 0.9, lars_coeff=0.05,
                                                                    lars_weight_decay=0.001),
                      np_lars_opt(1.0, 0.9, 0.05, 0.001)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_trains_as_numpy_says(name):
    make, np_step = OPTIMIZERS[name]
    main, loss, scope, exe, _ = build(make)
    types = [op.type for op in main.global_block().ops]
    assert types.count(name) == 2, types   # one update per parameter
    losses, params = train(main, loss, scope, exe, 25)
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    sw, sb = {}, {}
    for t in (1, 2, 3):
        gw, gb = np_grads(w, b)
        w, b = np_step(w, gw, sw, t), np_step(b, gb, sb, t)
        close(params[t - 1][0], w, f"{name} w after step {t}")
        close(params[t - 1][1], b, f"{name} b after step {t}")
    assert losses[-1] < 0.5 * losses[0], f"{name}: loss {losses[0]} -> {losses[-1]}"


def test_lamb_excludes_parameters_from_weight_decay():
    main, *_ = build(lambda: fluid.optimizer.Lamb(
        0.05, exclude_from_weight_decay_fn=lambda p: p.name.endswith(".b_0")))
    wd = {op.input("Param")[0]: op.attr("weight_decay") for op in main.global_block().ops
          if op.type == "lamb"}
    assert wd == {"fc_0.w_0": pytest.approx(0.01), "fc_0.b_0": 0.0}


def test_optimizer_arguments_are_checked():
    with pytest.raises(ValueError, match=r"Adamax: beta1 must be 0 <= beta1 < 1, got 1.5"):
        fluid.optimizer.Adamax(0.1, beta1=1.5)
    with pytest.raises(ValueError, match=r"Ftrl: l1 must be 0 <= l1, got -1"):
        fluid.optimizer.Ftrl(0.1, l1=-1)
    with pytest.raises(TypeError, match=r"Lamb: exclude_from_weight_decay_fn must be callable"):
        fluid.optimizer.Lamb(0.1, exclude_from_weight_decay_fn=3)
    with pytest.raises(ValueError, match=r"LarsMomentum: momentum is required"):
        fluid.optimizer.LarsMomentum(0.1, None)


# ---- ExponentialMovingAverage -----------------------------------------------------------------
def _sgd():
    return fluid.optimizer.SGD(0.1)


def _check_restored(scope, params):
    np.testing.assert_array_equal(scope.find_var("fc_0.w_0").value, params[-1][0])
    np.testing.assert_array_equal(scope.find_var("fc_0.b_0").value, params[-1][1])


def test_ema_averages_and_restores():
    def extra(main):
        ema = fluid.optimizer.ExponentialMovingAverage(0.9)
        ema.update()
        return ema
    main, loss, scope, exe, ema = build(_sgd, extra)
    _, params = train(main, loss, scope, exe, 5)
    want = [np.zeros((3, 1)), np.zeros(1)]
    for w, b in params:
        want = [0.9 * want[0] + 0.1 * w, 0.9 * want[1] + 0.1 * b]
    with fluid.scope_guard(scope):
        with ema.apply(exe):
            close(scope.find_var("fc_0.w_0").value, want[0] / (1 - 0.9 ** 5), "EMA of w")
            close(scope.find_var("fc_0.b_0").value, want[1] / (1 - 0.9 ** 5), "EMA of b")
        _check_restored(scope, params)
        with ema.apply(exe, need_restore=False):
            pass
        close(scope.find_var("fc_0.w_0").value, want[0] / (1 - 0.9 ** 5))
        ema.restore(exe)
        _check_restored(scope, params)


def test_ema_decay_follows_thres_steps():
    def extra(main):
        step = fluid.layers.autoincreased_step_counter()  # as Fluid 1.8's example: 1, 2, ...
        ema = fluid.optimizer.ExponentialMovingAverage(0.999, thres_steps=step)
        ema.update()
        return ema
    main, loss, scope, exe, ema = build(_sgd, extra)
    _, params = train(main, loss, scope, exe, 4)
    want, decay = [np.zeros((3, 1)), np.zeros(1)], None
    for t, (w, b) in enumerate(params, start=1):
        decay = min(0.999, (1 + t) / (10 + t))
        want = [decay * want[0] + (1 - decay) * w, decay * want[1] + (1 - decay) * b]
    with fluid.scope_guard(scope), ema.apply(exe):
        close(scope.find_var("fc_0.w_0").value, want[0] / (1 - decay ** 4), "EMA of w")
        close(scope.find_var("fc_0.b_0").value, want[1] / (1 - decay ** 4), "EMA of b")
    with fluid.scope_guard(scope):
        _check_restored(scope, params)


def test_ema_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"ExponentialMovingAverage: decay must be"):
        fluid.optimizer.ExponentialMovingAverage(1.5)
    with pytest.raises(TypeError, match=r"thres_steps must be a Variable"):
        fluid.optimizer.ExponentialMovingAverage(0.9, thres_steps=3)


# ---- ModelAverage -----------------------------------------------------------------------------
def test_model_average_against_a_numpy_window():
    rate, lo, hi = 0.5, 2, 3

    def extra(main):
        return fluid.optimizer.ModelAverage(rate, min_average_window=lo, max_average_window=hi)
    main, loss, scope, exe, avg = build(_sgd, extra)
    _, params = train(main, loss, scope, exe, 7)
    states = [[np.zeros((3, 1)), np.zeros((3, 1)), np.zeros((3, 1)), 0, 0, 0],
              [np.zeros(1), np.zeros(1), np.zeros(1), 0, 0, 0]]
    for w, b in params:
        states = [np_average_accumulates(states[0], w, rate, lo, hi),
                  np_average_accumulates(states[1], b, rate, lo, hi)]
    with fluid.scope_guard(scope):
        with avg.apply(exe):
            for name, (s1, s2, s3, acc, old, _) in zip(("fc_0.w_0", "fc_0.b_0"), states):
                close(scope.find_var(name).value, (s1 + s2 + s3) / (acc + old),
                      f"average of {name}")
        _check_restored(scope, params)
    with pytest.raises(ValueError, match=r"min_average_window must be <= max_average_window"):
        with fluid.program_guard(main):
            fluid.optimizer.ModelAverage(0.1, min_average_window=5, max_average_window=2)


# ---- set_gradient_clip ------------------------------------------------------------------------
def _one_sgd_step(clip_setup):
    def make():
        clip_setup()
        return fluid.optimizer.SGD(0.1)
    main, loss, scope, exe, _ = build(make)
    _, params = train(main, loss, scope, exe, 1)
    return params[0]


def test_set_gradient_clip_by_value_on_some_parameters():
    w, b = _one_sgd_step(lambda: fluid.clip.set_gradient_clip(
        fluid.clip.GradientClipByValue(0.05), param_list=["fc_0.w_0"]))
    gw, gb = np_grads(W0.astype(np.float64), B0.astype(np.float64))
    assert np.abs(gw).max() > 0.05
    close(w, W0 - 0.1 * np.clip(gw, -0.05, 0.05))
    close(b, B0 - 0.1 * gb)   # not in param_list: unclipped


def test_set_gradient_clip_by_global_norm():
    w, b = _one_sgd_step(lambda: fluid.clip.set_gradient_clip(
        fluid.clip.ClipGradByGlobalNorm(0.5, auto_skip_clip=True)))  # 3.x's spelling
    gw, gb = np_grads(W0.astype(np.float64), B0.astype(np.float64))
    norm = np.sqrt((gw ** 2).sum() + (gb ** 2).sum())
    assert norm > 0.5
    close(w, W0 - 0.1 * gw * 0.5 / norm)
    close(b, B0 - 0.1 * gb * 0.5 / norm)


def test_backward_then_apply_optimize_is_minimize():
    # Fluid 1.8's two halves of minimize, with the global clip applied by the second
    grads = []

    def make():
        fluid.clip.set_gradient_clip(fluid.clip.GradientClipByValue(0.05))
        opt = fluid.optimizer.SGD(0.1)
        loss = fluid.default_main_program().global_block().var("mean_0.tmp_0")
        params_grads = opt.backward(loss)
        grads.extend(g.name for _, g in params_grads)
        ops = opt.apply_optimize(loss, fluid.default_startup_program(), params_grads)
        assert [op.type for op in ops] == ["sgd", "sgd"]
    main, loss, scope, exe, _ = build(make)
    assert grads == ["fc_0.w_0@GRAD", "fc_0.b_0@GRAD"]
    (w, b), = train(main, loss, scope, exe, 1)[1]
    gw, gb = np_grads(W0.astype(np.float64), B0.astype(np.float64))
    close(w, W0 - 0.1 * np.clip(gw, -0.05, 0.05))
    close(b, B0 - 0.1 * np.clip(gb, -0.05, 0.05))


def test_clip_need_clip_leaves_gradients_out_of_the_clip_and_the_norm():
    # Fluid 1.8's need_clip(param): the bias is neither clipped nor part of the global norm
    w, b = _one_sgd_step(lambda: fluid.clip.set_gradient_clip(
        fluid.clip.GradientClipByGlobalNorm(0.5, need_clip=lambda p: p.name.endswith("w_0"))))
    gw, gb = np_grads(W0.astype(np.float64), B0.astype(np.float64))
    norm = np.sqrt((gw ** 2).sum())
    assert norm > 0.5
    close(w, W0 - 0.1 * gw * 0.5 / norm)
    close(b, B0 - 0.1 * gb)
    with pytest.raises(TypeError, match=r"GradientClipByValue: need_clip must be a function"):
        fluid.clip.GradientClipByValue(1.0, need_clip=True)


def test_set_gradient_clip_groups_global_norms_by_group_name():
    def two_clips(norm_b):
        def setup():
            fluid.clip.set_gradient_clip(fluid.clip.GradientClipByGlobalNorm(0.5, "g"),
                                         param_list=["fc_0.w_0"])
            fluid.clip.set_gradient_clip(fluid.clip.GradientClipByGlobalNorm(norm_b, "g"),
                                         param_list=["fc_0.b_0"])
        return setup
    w, b = _one_sgd_step(two_clips(0.5))   # two clip objects, one group: one norm
    gw, gb = np_grads(W0.astype(np.float64), B0.astype(np.float64))
    norm = np.sqrt((gw ** 2).sum() + (gb ** 2).sum())
    close(w, W0 - 0.1 * gw * 0.5 / norm)
    close(b, B0 - 0.1 * gb * 0.5 / norm)
    with pytest.raises(ValueError, match=r"group 'g' must share one clip_norm, got 0.5 and 0.7"):
        _one_sgd_step(two_clips(0.7))


def test_optimizer_grad_clip_wins_over_set_gradient_clip():
    def make():
        fluid.clip.set_gradient_clip(fluid.clip.GradientClipByValue(1e-6))
        return fluid.optimizer.SGD(0.1, grad_clip=fluid.clip.GradientClipByValue(0.05))
    with pytest.warns(UserWarning, match=r"set_gradient_clip is ignored"):
        main, loss, scope, exe, _ = build(make)
    (w, b), = train(main, loss, scope, exe, 1)[1]
    gw, _ = np_grads(W0.astype(np.float64), B0.astype(np.float64))
    close(w, W0 - 0.1 * np.clip(gw, -0.05, 0.05))


def test_set_gradient_clip_errors_and_late_call():
    with pytest.raises(TypeError, match=r"set_gradient_clip: clip must be"):
        fluid.clip.set_gradient_clip(0.5)
    main, *_ = build(_sgd)
    with pytest.warns(UserWarning, match=r"minimize has already run"):
        fluid.clip.set_gradient_clip(fluid.clip.GradientClipByValue(1.0), program=main)
    with pytest.raises(ValueError, match=r"'nope' is not a parameter"):
        fluid.clip.set_gradient_clip(fluid.clip.GradientClipByValue(1.0), ["nope"], main)


# ---- parity with Paddle's legacy update ops ------------------------------------------------------
_AVG_IN = {"param": P, "in_sum_1": P * 10, "in_sum_2": P * 100, "in_sum_3": P * 1000,
           "in_num_accumulates": np.array([1], np.int64),
           "in_old_num_accumulates": np.array([3], np.int64),
           "in_num_updates": np.array([7], np.int64)}
PARITY_CASES = [
    ("adamax", dict(Param=P, Grad=G, LearningRate=LR, Moment=B, InfNorm=A,
                    Beta1Pow=np.array([0.81], np.float32)), {}, None),
    ("adadelta", dict(Param=P, Grad=G, AvgSquaredGrad=A, AvgSquaredUpdate=A * 2,
                      LearningRate=LR), {"rho": 0.9, "epsilon": 0.1}, None),
    ("decayed_adagrad", dict(Param=P, Grad=G, Moment=A, LearningRate=LR),
     {"decay": 0.9, "epsilon": 1e-6}, None),
    ("ftrl", dict(Param=P, SquaredAccumulator=A, LinearAccumulator=B, Grad=G, LearningRate=LR),
     {"l1": 0.01, "l2": 0.01, "lr_power": -0.5}, None),
    ("ftrl", dict(Param=P, SquaredAccumulator=A, LinearAccumulator=B, Grad=G, LearningRate=LR),
     {"l1": 0.5, "l2": 0.25, "lr_power": -0.25}, None),
    ("lamb", dict(Param=P, Grad=G, LearningRate=LR, Moment1=B, Moment2=A,
                  Beta1Pow=np.array([0.81], np.float32), Beta2Pow=np.array([0.998], np.float32)),
     {"weight_decay": 0.01, "always_adapt": False}, {"Beta1PowOut": 1, "Beta2PowOut": 1}),
    ("lamb", dict(Param=P, Grad=G, LearningRate=LR, Moment1=B, Moment2=A,
                  Beta1Pow=np.array([0.81], np.float32), Beta2Pow=np.array([0.998], np.float32)),
     {"weight_decay": 0.0, "always_adapt": True}, {"Beta1PowOut": 1, "Beta2PowOut": 1}),
    ("lars_momentum", dict(Param=[P, P2], Grad=[G, G2], Velocity=[B, V2], LearningRate=[LR, LR]),
     {"mu": 0.9, "lars_coeff": 0.001, "lars_weight_decay": [0.0005, 0.001], "epsilon": 1e-3,
      "rescale_grad": 0.5}, {"ParamOut": 2, "VelocityOut": 2}),
    ("average_accumulates", _AVG_IN,
     {"average_window": 0.5, "min_average_window": 2, "max_average_window": 3}, None),
]

_PADDLE_RUN = r"""
import os, pickle, sys
os.environ["FLAGS_enable_pir_api"] = "0"
import numpy as np, paddle
from paddle.base.framework import OpProtoHolder
paddle.enable_static()
exe = paddle.static.Executor(paddle.CPUPlace())
results = []
for op_type, inputs, attrs, n_out in pickle.load(open(sys.argv[1], "rb")):
    main = paddle.static.Program()
    block = main.global_block()
    feed, ins = {}, {}
    for slot, v in inputs.items():
        arrays = v if isinstance(v, list) else [v]
        names = [f"{slot}_{i}" for i in range(len(arrays))]
        ins[slot] = [block.create_var(name=n, shape=a.shape, dtype=str(a.dtype), persistable=True)
                     for n, a in zip(names, arrays)]
        feed.update(zip(names, arrays))
    outs, fetch = {}, []
    for o in OpProtoHolder.instance().get_op_proto(op_type).outputs:
        if o.dispensable and o.name not in n_out:
            continue
        if op_type == "average_accumulates":   # in place, as ModelAverage appends it
            outs[o.name] = ins[o.name.replace("out_", "in_")]
        else:
            outs[o.name] = [block.create_var(name=f"out_{o.name}_{i}", dtype="float32")
                            for i in range(n_out.get(o.name, 1))]
        fetch += [(o.name, v) for v in outs[o.name]]
    block.append_op(type=op_type, inputs=ins, outputs=outs, attrs=attrs)
    got = exe.run(main, feed=feed, fetch_list=[v for _, v in fetch])
    results.append([(slot, np.asarray(g)) for (slot, _), g in zip(fetch, got)])
pickle.dump(results, open(sys.argv[2], "wb"))
"""


@pytest.mark.paddle
def test_update_ops_match_paddles(tmp_path):
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    cases = [(t, ins, attrs, outs or {}) for t, ins, attrs, outs in PARITY_CASES]
    (tmp_path / "in.pkl").write_bytes(pickle.dumps(cases))
    (tmp_path / "run.py").write_text(_PADDLE_RUN)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "in.pkl"),
                           str(tmp_path / "out.pkl")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    paddle_results = pickle.loads((tmp_path / "out.pkl").read_bytes())
    for (op_type, ins, attrs, outs), want in zip(PARITY_CASES, paddle_results):
        got = run_update(op_type, ins, attrs, outputs=outs)
        seen: dict = {}
        for slot, w in want:
            k = seen[slot] = seen.get(slot, -1) + 1
            g = got[slot][k] if isinstance(got[slot], list) else got[slot]
            np.testing.assert_allclose(np.asarray(g, np.float64).reshape(w.shape), w,
                                       rtol=1e-5, atol=1e-6,
                                       err_msg=f"{op_type} {attrs} {slot}[{k}] vs Paddle")


def test_2x_spellings_parameters_and_weight_decay():
    """``parameters=`` / ``weight_decay=`` (2.x names) do what ``parameter_list=`` /
    ``regularization=L2Decay`` do: one SGD step on w only, against NumPy."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [2], dtype="float32")
        w = fluid.layers.create_parameter([2, 1], "float32", name="w",
                                          default_initializer=fluid.initializer.Constant(0.5))
        b = fluid.layers.create_parameter([1], "float32", name="b",
                                          default_initializer=fluid.initializer.Constant(0.25))
        loss = fluid.layers.mean(fluid.layers.matmul(x, w) + b)
        fluid.optimizer.SGD(0.1, parameters=[w], weight_decay=0.2).minimize(loss)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    xv = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    exe.run(main, feed={"x": xv}, scope=scope)
    grad = xv.mean(0).reshape(2, 1) + 0.2 * 0.5
    np.testing.assert_allclose(scope.find_var("w").value, 0.5 - 0.1 * grad, rtol=1e-6)
    np.testing.assert_array_equal(scope.find_var("b").value, [0.25])   # not in parameters
    with pytest.raises(TypeError, match="not both"):
        fluid.optimizer.Adam(0.1, parameter_list=[w], parameters=[w])
