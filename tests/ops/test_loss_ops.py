"""Loss and utility ops (``pdjit.ops.loss``, ``pdjit.ops.misc``) against NumPy written here,
gradients against finite differences, native execution asserted.

The formulas below are the ops' documented semantics, written independently of the code under
test; where Paddle 3.3.1 makes a choice a formula cannot guess (pos_weight's form, linspace's
integer rounding, the output shapes) the expected values were measured with Paddle's legacy ops.
"""
import numpy as np
import pytest

from pdjit.framework.errors import OpShapeError, PdjitError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_output
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(11)
X = RNG.normal(size=(3, 4))
P = RNG.uniform(0.05, 0.95, size=(3, 4))      # probabilities away from 0 and 1
LAB = RNG.uniform(0.0, 1.0, size=(3, 4))
W = RNG.uniform(0.5, 2.0, size=(3, 4))


def native(op_type, inputs, attrs=None):
    """Run one op compiled in strict mode; assert a native step ran; return {slot: array}."""
    prog, feed, outs = build_op_program(op_type, inputs, attrs or {})
    exe = Executor(mode="compiled", strict=True)
    fetch = [v for vs in outs.values() for v in vs]
    got = exe.run(prog, feed=feed, fetch_list=fetch, scope=Scope())
    assert_native(exe, op_type)
    return dict(zip(outs, got))


def close(got, want, dtype):
    tol = 2e-5 if np.dtype(dtype) == np.float32 else 1e-11
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


# ---- sigmoid_cross_entropy_with_logits ---------------------------------------------------------
def np_sce(x, lab, pw=None, ignore=-100, normalize=False):
    if pw is None:
        out = np.logaddexp(0, x) - x * lab
    else:  # Paddle's form: pos_weight weighs the whole log term
        out = (1 - lab) * x + pw * np.logaddexp(0, -x)
    keep = np.trunc(lab) != ignore
    out = np.where(keep, out, 0.0)
    return out / np.sum(np.abs(lab - ignore) > 1e-6) if normalize else out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sigmoid_cross_entropy_native(dtype):
    lab = LAB.copy()
    lab[0, 1] = -100  # ignored
    ins = {"X": X.astype(dtype), "Label": lab.astype(dtype)}
    close(native("sigmoid_cross_entropy_with_logits", ins)["Out"], np_sce(X, lab), dtype)
    ins["pos_weight"] = W.astype(dtype)
    close(native("sigmoid_cross_entropy_with_logits", ins)["Out"], np_sce(X, lab, W), dtype)


def test_sigmoid_cross_entropy_pos_weight_matches_paddle():
    """Values of Paddle 3.3.1's kernel (pos_weight 3, label 0.3)."""
    x = np.array([[-2.0, -0.5, 0.0, 0.7, 2.5]], np.float32)
    out = native("sigmoid_cross_entropy_with_logits",
                 {"X": x, "Label": np.full_like(x, 0.3), "pos_weight": np.full_like(x, 3.0)})
    np.testing.assert_allclose(out["Out"], [[4.980784, 2.572231, 2.0794415, 1.699558,
                                             1.9866692]], rtol=1e-6)


def test_sigmoid_cross_entropy_normalize_and_ignore_index():
    lab = LAB.copy()
    lab[1, :2] = 3  # ignore_index=3
    attrs = {"normalize": True, "ignore_index": 3}
    want = np_sce(X, lab, ignore=3, normalize=True)
    check_output("sigmoid_cross_entropy_with_logits", {"X": X, "Label": lab}, attrs,
                 {"Out": want})
    ins = {"X": X.astype(np.float32), "Label": lab.astype(np.float32),
           "pos_weight": W.astype(np.float32)}
    close(native("sigmoid_cross_entropy_with_logits", ins, attrs)["Out"],
          np_sce(X, lab, W, ignore=3, normalize=True), np.float32)
    everything_ignored = {"X": X[:1, :2], "Label": np.full((1, 2), -100.0)}
    for got in (check_output("sigmoid_cross_entropy_with_logits", everything_ignored,
                             {"normalize": True}, modes=["reference"]),
                native("sigmoid_cross_entropy_with_logits", everything_ignored,
                       {"normalize": True})):
        assert np.isnan(got["Out"]).all()  # 0 / 0, as Paddle


@pytest.mark.parametrize("attrs,pw", [({}, False), ({}, True), ({"normalize": True}, False)])
def test_sigmoid_cross_entropy_grad(attrs, pw):
    lab = LAB.copy()
    lab[2, 3] = -100
    ins = {"X": X, "Label": lab}
    if pw:
        ins["pos_weight"] = W
    check_grad("sigmoid_cross_entropy_with_logits", ins, attrs)


# ---- bce_loss ---------------------------------------------------------------------------------
def np_bce(x, lab):
    with np.errstate(divide="ignore"):
        return -(lab * np.maximum(np.log(x), -100) + (1 - lab) * np.maximum(np.log(1 - x), -100))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bce_loss_native(dtype):
    p = P.copy()
    p[0, 0], p[0, 1] = 0.0, 1.0  # the logs are clamped at -100
    lab = (LAB > 0.5).astype(np.float64)
    lab[0, 0], lab[0, 1] = 1.0, 0.0
    got = native("bce_loss", {"X": p.astype(dtype), "Label": lab.astype(dtype)})["Out"]
    close(got, np_bce(p, lab), dtype)
    assert got[0, 0] == got[0, 1] == 100


def test_bce_loss_grad_and_range_error():
    check_grad("bce_loss", {"X": P, "Label": LAB}, {})
    with pytest.raises(PdjitError, match=r"bce_loss: expected X \(probabilities\) in \[0, 1\]"):
        check_output("bce_loss", {"X": P + 1, "Label": LAB}, modes=["reference"])


# ---- huber_loss -------------------------------------------------------------------------------
def np_huber(x, y, delta):
    r = y - x
    return np.where(np.abs(r) <= delta, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta)), r


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_huber_loss_native(dtype):
    y = X + RNG.uniform(-2, 2, size=X.shape)
    got = native("huber_loss", {"X": X.astype(dtype), "Y": y.astype(dtype)}, {"delta": 0.5})
    want, r = np_huber(X.astype(dtype).astype(np.float64), y.astype(dtype).astype(np.float64),
                       0.5)
    close(got["Out"], want, dtype)
    close(got["Residual"], r, dtype)


def test_huber_loss_grad():
    y = X + np.where(RNG.random(X.shape) < 0.5, -1, 1) * RNG.uniform(0.1, 2, size=X.shape)
    y[np.abs(y - X - 0.7) < 0.05] += 0.2  # away from the kink at |r| = delta
    check_grad("huber_loss", {"X": X, "Y": y}, {"delta": 0.7}, ["X", "Y"])


# ---- smooth_l1_loss ----------------------------------------------------------------------------
def np_smooth_l1(x, y, sigma, iw=None, ow=None):
    d = (x - y) * (iw if iw is not None else 1)
    s2 = sigma * sigma
    e = np.where(np.abs(d) < 1 / s2, 0.5 * s2 * d * d, np.abs(d) - 0.5 / s2)
    e = e * (ow if ow is not None else 1)
    return e.reshape(len(x), -1).sum(1, keepdims=True), d


@pytest.mark.parametrize("weights", [False, True])
def test_smooth_l1_native(weights):
    x, y = X.reshape(3, 2, 2), LAB.reshape(3, 2, 2)
    ins = {"X": x, "Y": y}
    iw = ow = None
    if weights:
        iw, ow = W.reshape(3, 2, 2), P.reshape(3, 2, 2)
        ins.update(InsideWeight=iw, OutsideWeight=ow)
    got = native("smooth_l1_loss", ins, {"sigma": 2.0})
    want, d = np_smooth_l1(x, y, 2.0, iw, ow)
    assert got["Out"].shape == (3, 1)
    close(got["Out"], want, np.float64)
    close(got["Diff"], d, np.float64)


def test_smooth_l1_grad_and_weights_error():
    y = X + np.where(RNG.random(X.shape) < 0.5, -1, 1) * RNG.uniform(0.05, 1, size=X.shape)
    y[np.abs(np.abs(y - X) - 0.25) < 0.03] += 0.1  # away from 1 / sigma^2 (sigma = 2)
    check_grad("smooth_l1_loss", {"X": X, "Y": y, "InsideWeight": W, "OutsideWeight": P},
               {"sigma": 2.0}, ["X", "Y"])
    with pytest.raises(OpShapeError, match="InsideWeight and OutsideWeight together"):
        build_op_program("smooth_l1_loss", {"X": X, "Y": y, "InsideWeight": W})


# ---- kldiv_loss -----------------------------------------------------------------------------
def np_kldiv(x, t, reduction, log_target=False):
    if log_target:
        e = np.exp(t) * (t - x)
    else:
        e = np.where(t > 0, t * (np.log(np.where(t > 0, t, 1)) - x), 0)
    return {"none": e, "sum": e.sum(), "mean": e.mean(), "batchmean": e.sum() / len(x)}[reduction]


@pytest.mark.parametrize("reduction", ["none", "batchmean", "mean", "sum"])
def test_kldiv_loss_native_and_grad(reduction):
    t = LAB.copy()
    t[0, 0] = -0.3  # no contribution, no gradient
    got = native("kldiv_loss", {"X": X.astype(np.float32), "Target": t.astype(np.float32)},
                 {"reduction": reduction})["Loss"]
    assert got.shape == (X.shape if reduction == "none" else ())  # 0-d, as Paddle 3.3.1
    close(got, np_kldiv(X.astype(np.float32).astype(np.float64),
                        t.astype(np.float32).astype(np.float64), reduction), np.float32)
    check_grad("kldiv_loss", {"X": X, "Target": t}, {"reduction": reduction},
               output_name="Loss")


def test_kldiv_loss_log_target_and_bad_reduction():
    got = native("kldiv_loss", {"X": X, "Target": LAB - 0.5},
                 {"reduction": "none", "log_target": True})["Loss"]
    close(got, np_kldiv(X, LAB - 0.5, "none", True), np.float64)
    with pytest.raises(OpShapeError, match="reduction 'none', 'batchmean'.*got 'avg'"):
        build_op_program("kldiv_loss", {"X": X, "Target": LAB}, {"reduction": "avg"})


# ---- norm and log_softmax ----------------------------------------------------------------------
X3 = RNG.normal(size=(2, 3, 4))


@pytest.mark.parametrize("axis", [1, -1])
def test_norm_native_and_grad(axis):
    got = native("norm", {"X": X3.astype(np.float32)}, {"axis": axis, "epsilon": 1e-10})
    n = np.sqrt((X3.astype(np.float32).astype(np.float64) ** 2).sum(axis, keepdims=True) + 1e-10)
    close(got["Norm"], n, np.float32)
    close(got["Out"], X3.astype(np.float32) / n, np.float32)
    check_grad("norm", {"X": X3}, {"axis": axis})


@pytest.mark.parametrize("axis", [1, -1])
def test_log_softmax_native_and_grad(axis):
    got = native("log_softmax", {"X": X3 * 30}, {"axis": axis})["Out"]  # large logits: no -inf
    want = X3 * 30 - np.log(np.exp(X3 * 30).sum(axis, keepdims=True))
    close(got, want, np.float64)
    check_grad("log_softmax", {"X": X3}, {"axis": axis})


# ---- linspace ------------------------------------------------------------------------------
FP32, FP64, INT32, INT64 = 5, 6, 2, 3


@pytest.mark.parametrize("start,stop,num,code,want", [
    (0.0, 1.0, 5, FP32, np.linspace(0, 1, 5)),
    (-1.0, 2.0, 7, FP64, np.linspace(-1, 2, 7)),
    (1.5, 2.0, 1, FP64, [1.5]),
    (0.0, 1.0, 0, FP32, []),
    # Paddle 3.3.1's integer results: the first half counts up from Start, the rest down from
    # Stop, each truncated
    (0, 10, 4, INT32, [0, 3, 6, 10]), (10, 0, 4, INT64, [10, 6, 3, 0]), (0, 7, 3, INT32, [0, 3, 7]),
])
def test_linspace(start, stop, num, code, want):
    dt = {FP32: np.float32, FP64: np.float64, INT32: np.int32, INT64: np.int64}[code]
    ins = {"Start": np.array([start], dt), "Stop": np.array([stop], dt),
           "Num": np.array([num], np.int32)}
    got = native("linspace", ins, {"dtype": code})["Out"]
    assert got.dtype == dt and got.shape == (num,)
    np.testing.assert_allclose(got, np.asarray(want, dt), rtol=1e-6)


def test_linspace_negative_num_is_an_error():
    ins = {"Start": np.array([0.0], np.float32), "Stop": np.array([1.0], np.float32),
           "Num": np.array([-2], np.int32)}
    for mode in ("reference", "compiled"):
        prog, feed, outs = build_op_program("linspace", ins, {"dtype": FP32})
        with pytest.raises(PdjitError, match="linspace: expected Num >= 0, got -2"):
            Executor(mode=mode).run(prog, feed=feed, fetch_list=outs["Out"], scope=Scope())


# ---- isfinite / isnan / isinf: one bool for the whole tensor (Fluid 1.x) ---------------------
CASES = {"finite": np.array([[1.0, -2.0], [0.0, 3.0]]),
         "nan": np.array([[1.0, np.nan], [0.0, 3.0]]),
         "inf": np.array([[1.0, 2.0], [-np.inf, 3.0]]),
         "both": np.array([[np.inf, np.nan]]),
         "empty": np.zeros((0, 2)), "ints": np.arange(4, dtype=np.int64)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("op", ["isfinite", "isnan", "isinf"])
def test_checks_reduce_to_one_bool(op, case):
    x = CASES[case]
    expected = {"isfinite": np.all(np.isfinite(x)), "isnan": np.any(np.isnan(x)),
                "isinf": np.any(np.isinf(x))}[op]
    for dtype in ({"float32", "float64"} if x.dtype.kind == "f" else {x.dtype}):
        got = native(op, {"X": x.astype(dtype)})["Out"]
        assert got.dtype == np.bool_ and got.shape == (1,) and got[0] == expected, (op, case)
    check_output(op, {"X": x}, {}, {"Out": np.array([expected])}, modes=["reference"])


# ---- a program written and run by PaddlePaddle 3.3.1 ------------------------------------------
@pytest.mark.filterwarnings("ignore::pdjit.framework.errors.ReferenceStepWarning")
def test_paddle_written_program_runs_the_same(capsys):
    """``tests/fixtures/paddle/loss_ops.npz`` (``tests/fixtures/make_loss_fixture.py``): the
    ops appended by Paddle with its slot and attribute names, serialised, parsed here and run in
    both modes: every fetched value and the text of the print op equal Paddle's."""
    import pathlib

    import pdjit as fluid

    d = np.load(pathlib.Path(__file__).parent.parent / "fixtures" / "paddle" / "loss_ops.npz")
    prog = fluid.Program.parse_from_string(d["desc"].tobytes())
    feed = {k[len("feed_"):]: d[k] for k in d.files if k.startswith("feed_")}
    fetch = [str(n) for n in d["fetch"]]
    for mode in ("compiled", "reference"):
        capsys.readouterr()
        exe = Executor(mode=mode)
        got = exe.run(prog, feed=feed, fetch_list=fetch, scope=Scope())
        assert capsys.readouterr().out == str(d["printed"]), mode
        if mode == "compiled":
            assert_native(exe)
        for i, (name, g) in enumerate(zip(fetch, got)):
            want = d[f"out_{i}"]
            assert g.shape == want.shape and g.dtype == want.dtype, (mode, name)
            np.testing.assert_allclose(g, want, rtol=2e-6, atol=1e-6, err_msg=f"{mode} {name}")
