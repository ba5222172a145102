"""Optimizer update ops against NumPy formulas written here (Paddle 3.3.1's CPU kernels).

Each program updates its state in place as Paddle's optimizers do (``ParamOut`` names the
``Param`` variable, ``Moment1Out`` the ``Moment1`` variable, ...) and runs several steps in
every executor mode, state carried in the Scope.
"""
import numpy as np
import pytest

from pdjit.framework import registry
from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.framework.program import Program
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope

RNG = np.random.default_rng(3)
MODES = ["reference", "compiled"]
DTYPES = ["float32", "float64"]
TOL = {"float32": dict(rtol=2e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-14)}


def f32(x):
    """Float attributes are stored as float32 in the program (as in Paddle)."""
    return float(np.float32(x))


def _state(dtype, shape=(3, 4), **extra):
    s = {"Param": RNG.normal(size=shape), "Grad": RNG.normal(size=shape),
         "LearningRate": np.array([0.1])}
    s.update(extra)
    return {k: np.asarray(v).astype(dtype) for k, v in s.items()}


def _program(op_type, state, outs, attrs, alias=True):
    """One op reading persistable vars; each output writes its input var (``alias``) or a new
    one named ``<input>_out``."""
    prog = Program()
    block = prog.global_block()
    vs = {k: block.create_var(name=k, shape=list(v.shape), dtype=v.dtype, persistable=True)
          for k, v in state.items()}
    ov = {slot: vs[src] if alias else
          block.create_var(name=src + "_out", shape=list(state[src].shape),
                           dtype=state[src].dtype, persistable=True)
          for slot, src in outs.items()}
    block.append_op(op_type, inputs={k: [v] for k, v in vs.items()},
                    outputs={k: [v] for k, v in ov.items()}, attrs=attrs)
    return prog, ov


def _run_steps(op_type, state, outs, attrs, steps, mode, grads=None):
    """Run ``steps`` in-place updates; returns the state after each step ({input name: array})."""
    prog, ov = _program(op_type, state, outs, attrs)
    scope = Scope()
    for k, v in state.items():
        scope.var(k).value = v.copy()
    exe = Executor(mode=mode)
    history = []
    for step in range(steps):
        if grads is not None:
            scope.var("Grad").value = grads[step]
        exe.run(prog, fetch_list=[], scope=scope)
        history.append({src: np.asarray(scope.var(src).value).copy() for src in outs.values()})
    return history


def _check(history, expected, dtype):
    for step, (got, want) in enumerate(zip(history, expected)):
        for k, w in want.items():
            assert got[k].dtype == np.dtype(dtype), f"step {step} {k}: dtype {got[k].dtype}"
            np.testing.assert_allclose(got[k], w, err_msg=f"step {step} {k}", **TOL[dtype])


# ---- sgd ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_sgd(dtype, mode):
    s = _state(dtype)
    T = np.dtype(dtype).type
    grads = [RNG.normal(size=(3, 4)).astype(dtype) for _ in range(2)]
    hist = _run_steps("sgd", s, {"ParamOut": "Param"}, {}, 2, mode, grads)
    p, want = s["Param"], []
    for g in grads:
        p = p - T(0.1) * g
        want.append({"Param": p})
    _check(hist, want, dtype)


def test_sgd_with_0d_learning_rate_and_fresh_output():
    s = _state("float64")
    s["LearningRate"] = np.array(0.5)
    prog, ov = _program("sgd", s, {"ParamOut": "Param"}, {}, alias=False)
    for mode in MODES:
        scope = Scope()
        for k, v in s.items():
            scope.var(k).value = v.copy()
        (out,) = Executor(mode=mode).run(prog, fetch_list=[ov["ParamOut"]], scope=scope)
        np.testing.assert_allclose(out, s["Param"] - 0.5 * s["Grad"], rtol=1e-15)
        np.testing.assert_array_equal(scope.var("Param").value, s["Param"])  # input untouched


# ---- momentum ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("reg", ["", "l2_decay"])
def test_momentum(dtype, mode, nesterov, reg):
    s = _state(dtype, Velocity=RNG.normal(size=(3, 4)))
    T = np.dtype(dtype).type
    attrs = {"mu": 0.9, "use_nesterov": nesterov, "regularization_method": reg,
             "regularization_coeff": 0.05, "rescale_grad": 0.5}
    hist = _run_steps("momentum", s, {"ParamOut": "Param", "VelocityOut": "Velocity"}, attrs,
                      3, mode)
    p, v, lr, mu = s["Param"], s["Velocity"], T(0.1), T(f32(0.9))
    want = []
    for _ in range(3):
        # Paddle's CPU kernel applies l2 decay but not rescale_grad to dense gradients
        g = s["Grad"] + (T(f32(0.05)) * p if reg else T(0))
        v = mu * v + g
        p = p - (g + mu * v) * lr if nesterov else p - lr * v
        want.append({"Param": p, "Velocity": v})
    _check(hist, want, dtype)


# ---- adam / adamw -------------------------------------------------------------------------------
ADAM_OUTS = {"ParamOut": "Param", "Moment1Out": "Moment1", "Moment2Out": "Moment2",
             "Beta1PowOut": "Beta1Pow", "Beta2PowOut": "Beta2Pow"}


def _adam_numpy(s, grads, beta1, beta2, eps, T, decay=None):
    b1, b2, e = T(f32(beta1)), T(f32(beta2)), T(f32(eps))
    p, m1, m2 = s["Param"], s["Moment1"], s["Moment2"]
    b1p, b2p, lr, one = s["Beta1Pow"], s["Beta2Pow"], T(s["LearningRate"][0]), T(1)
    out = []
    for g in grads:
        if decay is not None:  # adamw: decoupled decay of the parameter first
            coeff, lr_ratio = decay
            p = p - lr * T(f32(lr_ratio)) * T(f32(coeff)) * p
        m1 = b1 * m1 + (one - b1) * g
        m2 = b2 * m2 + (one - b2) * g * g
        lr_t = lr * np.sqrt(one - b2p[0]) / (one - b1p[0])
        p = p - lr_t * (m1 / (np.sqrt(m2) + e * np.sqrt(one - b2p[0])))
        b1p, b2p = b1p * b1, b2p * b2
        out.append({"Param": p, "Moment1": m1, "Moment2": m2, "Beta1Pow": b1p,
                    "Beta2Pow": b2p})
    return out


def _adam_state(dtype, beta1, beta2):
    # the beta pows start at beta1/beta2, as Paddle's Adam optimizer initialises them
    return _state(dtype, Moment1=RNG.normal(size=(3, 4)) * 0.1,
                  Moment2=RNG.uniform(0, 0.1, size=(3, 4)),
                  Beta1Pow=np.array([f32(beta1)]), Beta2Pow=np.array([f32(beta2)]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("betas", [(0.9, 0.999, 1e-8), (0.8, 0.95, 1e-3)])
def test_adam_several_steps(dtype, mode, betas):
    beta1, beta2, eps = betas
    s = _adam_state(dtype, beta1, beta2)
    grads = [RNG.normal(size=(3, 4)).astype(dtype) for _ in range(4)]
    hist = _run_steps("adam", s, ADAM_OUTS, {"beta1": beta1, "beta2": beta2, "epsilon": eps}, 4,
                      mode, grads)
    _check(hist, _adam_numpy(s, grads, beta1, beta2, eps, np.dtype(dtype).type), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_decay", [False, True])
def test_adamw(dtype, mode, with_decay):
    s = _adam_state(dtype, 0.9, 0.999)
    grads = [RNG.normal(size=(3, 4)).astype(dtype) for _ in range(3)]
    attrs = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "coeff": 0.1, "lr_ratio": 0.5,
             "with_decay": with_decay}
    hist = _run_steps("adamw", s, ADAM_OUTS, attrs, 3, mode, grads)
    want = _adam_numpy(s, grads, 0.9, 0.999, 1e-8, np.dtype(dtype).type,
                       decay=(0.1, 0.5) if with_decay else None)
    _check(hist, want, dtype)


def test_adam_skip_update_and_global_beta_pow():
    from pdjit.testing.op_test import run_op

    s = _adam_state("float64", 0.9, 0.999)
    out = run_op("adam", dict(s, SkipUpdate=np.array([True])), {})
    for slot, src in ADAM_OUTS.items():
        np.testing.assert_array_equal(out[slot], s[src])
    out = run_op("adam", s, {"use_global_beta_pow": True})
    np.testing.assert_array_equal(out["Beta1PowOut"], s["Beta1Pow"])
    assert not np.allclose(out["ParamOut"], s["Param"])


# ---- adagrad / rmsprop ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_adagrad(dtype, mode):
    s = _state(dtype, Moment=RNG.uniform(0, 1, size=(3, 4)))
    T = np.dtype(dtype).type
    hist = _run_steps("adagrad", s, {"ParamOut": "Param", "MomentOut": "Moment"},
                      {"epsilon": 1e-6}, 2, mode)
    p, m, want = s["Param"], s["Moment"], []
    for _ in range(2):
        m = m + s["Grad"] * s["Grad"]
        p = p - T(0.1) * s["Grad"] / (np.sqrt(m) + T(f32(1e-6)))
        want.append({"Param": p, "Moment": m})
    _check(hist, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop(dtype, mode, centered):
    s = _state(dtype, Moment=RNG.normal(size=(3, 4)), MeanSquare=RNG.uniform(0, 1, (3, 4)),
               MeanGrad=RNG.normal(size=(3, 4)) * 0.1)
    T = np.dtype(dtype).type
    outs = {"ParamOut": "Param", "MomentOut": "Moment", "MeanSquareOut": "MeanSquare",
            "MeanGradOut": "MeanGrad"}
    attrs = {"epsilon": 1e-6, "decay": 0.9, "momentum": 0.5, "centered": centered}
    hist = _run_steps("rmsprop", s, outs, attrs, 2, mode)
    rho, eps, mom, lr, g = T(f32(0.9)), T(f32(1e-6)), T(f32(0.5)), T(0.1), s["Grad"]
    p, mo, ms, mg, want = s["Param"], s["Moment"], s["MeanSquare"], s["MeanGrad"], []
    for _ in range(2):
        ms = rho * ms + (1 - rho) * g * g
        if centered:
            mg = rho * mg + (1 - rho) * g
            with np.errstate(invalid="ignore"):  # a negative centred variance: NaN, as the op
                mo = mom * mo + lr * g / np.sqrt(ms - mg * mg + eps)
        else:
            mo = mom * mo + lr * g / np.sqrt(ms + eps)
        p = p - mo
        want.append({"Param": p, "Moment": mo, "MeanSquare": ms, "MeanGrad": mg})
    _check(hist, want, dtype)


# ---- lowering, declarations, errors ---------------------------------------------------------
@pytest.mark.parametrize("op_type,extra,outs,attrs", [
    ("sgd", {}, {"ParamOut": "Param"}, {}),
    ("momentum", {"Velocity": np.zeros((3, 4))}, {"ParamOut": "Param", "VelocityOut": "Velocity"},
     {"mu": 0.9, "use_nesterov": True}),
    ("adam", {"Moment1": np.zeros((3, 4)), "Moment2": np.zeros((3, 4)),
              "Beta1Pow": np.array([0.9]), "Beta2Pow": np.array([0.999])}, ADAM_OUTS, {}),
    ("adamw", {"Moment1": np.zeros((3, 4)), "Moment2": np.zeros((3, 4)),
               "Beta1Pow": np.array([0.9]), "Beta2Pow": np.array([0.999])}, ADAM_OUTS,
     {"with_decay": True}),
])
@pytest.mark.parametrize("alias", [True, False])
def test_updates_compile_to_native_code(op_type, extra, outs, attrs, alias):
    """In place (the optimizers' programs) or into new variables, one native function."""
    s = _state("float32", **extra)
    prog, ov = _program(op_type, s, outs, attrs, alias=alias)
    fetch = list(ov.values())
    exe = Executor(mode="compiled")
    report = exe.explain(prog, fetch_list=fetch)
    assert f"{op_type}#0" in report and f"reference {op_type}#" not in report, report
    results = {}
    for mode, e in (("compiled", exe), ("reference", Executor(mode="reference"))):
        scope = Scope()
        for k, v in s.items():
            scope.var(k).value = v.copy()
        results[mode] = e.run(prog, fetch_list=fetch, scope=scope)
    for got, want in zip(results["compiled"], results["reference"]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_optimizer_ops_declare_their_contract():
    for op in ("sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop"):
        d = registry.get(op)
        assert d.grad is None and d.has(registry.OPAQUE), op
        assert {s.name for s in d.inputs} >= {"Param", "Grad", "LearningRate"}, op
        assert d.output_slot("ParamOut") is not None and \
            d.output_slot("MasterParamOut").dispensable, op
    assert registry.get("momentum").attrs["mu"].required
    assert registry.get("adam").attrs["min_row_size_to_use_multithread"].type == registry.A.LONG


def test_learning_rate_must_hold_one_value():
    s = _state("float32")
    s["LearningRate"] = np.array([0.1, 0.2], "float32")
    with pytest.raises(OpShapeError, match=r"sgd: LearningRate must hold one value: expected "
                                           r"shape \[1\] or \[\], got \[2\]"):
        _program("sgd", s, {"ParamOut": "Param"}, {})


def test_grad_shape_mismatch_is_a_clear_error():
    s = _state("float32")
    s["Grad"] = np.ones((4, 3), "float32")
    with pytest.raises(OpShapeError, match=r"sgd: Grad must match Param: expected "
                                           r"float32\[3, 4\], got float32\[4, 3\]"):
        _program("sgd", s, {"ParamOut": "Param"}, {})
    s["Grad"] = np.ones((3, 4), "float64")
    with pytest.raises(OpShapeError, match=r"expected float32\[3, 4\], got float64\[3, 4\]"):
        _program("sgd", s, {"ParamOut": "Param"}, {})


def test_run_time_shape_mismatch_names_the_slot():
    from pdjit.testing.op_test import run_op

    # (the op's infer_shape refuses the run-time shapes before its reference runs)
    with pytest.raises(OpRunError, match=r"momentum: Velocity must match Param: expected "
                                         r"float64\[3, 4\], got float64\[2, 4\]"):
        run_op("momentum", {"Param": np.ones((3, 4)), "Grad": np.ones((3, 4)),
                            "Velocity": np.ones((2, 4)), "LearningRate": np.array([0.1])},
               {"mu": 0.9}, batch_unknown={"Velocity"})
