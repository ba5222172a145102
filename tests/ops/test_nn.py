"""softmax, cross entropies, accuracy, dropout and lookup_table_v2 against NumPy.

Expected values are NumPy formulas written here. They include two behaviours of Paddle 3.3.1's
CPU kernels that were measured with Paddle: softmax clips ``x - max`` at -64 before ``exp``, and
the cross entropies of probabilities replace ``log(0)`` by ``-1e20``.
"""
import numpy as np
import pytest

from pdjit.framework import registry
from pdjit.framework.errors import OpRunError, OpShapeError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_output, run_op

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(cross_entropy|softmax_with_cross_entropy)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(2)
DTYPES = ["float32", "float64"]


def np_softmax(x, axis=-1):
    z = np.maximum(x - x.max(axis=axis, keepdims=True), -64.0)
    return np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)


def probs(shape, dtype):
    return np_softmax(RNG.normal(size=shape)).astype(dtype)


def labels(shape, classes):
    return RNG.integers(0, classes, size=shape).astype("int64")


# ---- softmax -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 4), -1), ((2, 3, 4), 1),
                                        ((4, 3), 0), ((6,), 0)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax(shape, axis, dtype):
    x = RNG.normal(scale=3, size=shape).astype(dtype)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    check_output("softmax", {"X": x}, {"axis": axis},
                 {"Out": (e / e.sum(axis=axis, keepdims=True)).astype(dtype)},
                 batch_unknown=axis != 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_is_stable_and_clips_like_paddle(dtype):
    x = np.array([[1000.0, 0.0, -1000.0], [0.0, -70.0, -10.0]], dtype)
    tiny = np.exp(-64.0)  # Paddle's CPU floor for exp(x - max)
    r1 = np.array([1.0, tiny, tiny]) / (1 + 2 * tiny)
    r2 = np.array([1.0, tiny, np.exp(-10.0)]) / (1 + tiny + np.exp(-10.0))
    out = check_output("softmax", {"X": x}, {}, {"Out": np.array([r1, r2], dtype)})["Out"]
    assert np.all(np.isfinite(out))


def test_softmax_bad_axis():
    with pytest.raises(OpShapeError, match=r"op 'softmax'.*axis=2 is out of range.*expected "
                                           r"-2..1"):
        build_op_program("softmax", {"X": np.ones((2, 3), "float32")}, {"axis": 2})


# ---- cross_entropy / cross_entropy2 --------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_hard(shape, dtype):
    p, lab = probs(shape, dtype), labels(shape[:-1] + (1,), shape[-1])
    want = -np.log(np.take_along_axis(p, lab, axis=-1))
    check_output("cross_entropy", {"X": p, "Label": lab}, {}, {"Y": want.astype(dtype)},
                 batch_unknown=True)
    # labels without the trailing 1 give a loss without it too
    check_output("cross_entropy", {"X": p, "Label": lab[..., 0].astype("int32")}, {},
                 {"Y": want[..., 0].astype(dtype)}, batch_unknown=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_soft(dtype):
    p, soft = probs((5, 4), dtype), probs((5, 4), dtype)
    want = -(soft * np.log(p)).sum(axis=-1, keepdims=True)
    check_output("cross_entropy", {"X": p, "Label": soft}, {"soft_label": True},
                 {"Y": want.astype(dtype)}, batch_unknown=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_zero_probability_and_ignore_index(dtype):
    p = np.array([[0.2, 0.3, 0.5], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]], dtype)
    lab = np.array([[2], [0], [1]], "int64")
    # log(0) becomes -1e20 (Paddle's TolerableValue): a large finite loss, not inf
    want = np.array([[-np.log(0.5)], [1e20], [-np.log(0.5)]], dtype)
    check_output("cross_entropy", {"X": p, "Label": lab}, {}, {"Y": want})
    want[2, 0] = 0.0  # ignored rows give 0
    check_output("cross_entropy", {"X": p, "Label": lab}, {"ignore_index": 1}, {"Y": want})
    soft = np.array([[0, 0.5, 0.5], [0.5, 0.5, 0], [0.5, 0.5, 0]], dtype)  # 0 * log(0) -> 0
    want_soft = np.array([[-0.5 * np.log(0.3) - 0.5 * np.log(0.5)], [0.5e20],
                          [-np.log(0.5)]], dtype)
    check_output("cross_entropy", {"X": p, "Label": soft}, {"soft_label": True},
                 {"Y": want_soft})


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy2(dtype):
    p = probs((6, 4), dtype)
    lab = labels((6, 1), 4)
    lab[3, 0] = -100
    match = np.take_along_axis(p, np.maximum(lab, 0), axis=-1)
    match[3, 0] = 0
    y = -np.log(np.where(lab == -100, 1, match))
    got = check_output("cross_entropy2", {"X": p, "Label": lab}, {},
                       {"Y": y.astype(dtype), "MatchX": match.astype(dtype)},
                       batch_unknown=True)
    assert got["XShape"].shape == (6, 4, 0)  # carries X's shape only, as in Paddle


@pytest.mark.parametrize("op", ["cross_entropy", "cross_entropy2", "softmax_with_cross_entropy"])
def test_out_of_range_label_is_a_run_error(op):
    slot = "Logits" if op == "softmax_with_cross_entropy" else "X"
    for bad in (3, -1):
        lab = np.array([[0], [bad]], "int64")
        with pytest.raises(OpRunError, match=rf"op '{op}'.*IndexError: Label holds {bad} at "
                                             r"index \[1, 0\]: expected a value in \[0, 3\) or "
                                             r"ignore_index=-100"):
            run_op(op, {slot: probs((2, 3), "float32"), "Label": lab})


def test_cross_entropy_label_shape_errors():
    p = probs((4, 3), "float32")
    with pytest.raises(OpShapeError, match=r"hard labels must have shape \[4, 1\] \(or \[4\]\) "
                                           r"for X of shape \[4, 3\], got \[4, 2\]"):
        build_op_program("cross_entropy", {"X": p, "Label": labels((4, 2), 3)})
    with pytest.raises(OpShapeError, match=r"soft labels must match X: expected float32\[4, 3\]"):
        build_op_program("cross_entropy", {"X": p, "Label": p[:, :2].copy()},
                         {"soft_label": True})
    with pytest.raises(OpShapeError, match=r"hard Label: expected dtype int32, int64, got float32"):
        build_op_program("cross_entropy", {"X": p, "Label": p[:, :1].copy()})


# ---- softmax_with_cross_entropy ----------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((4, 5), -1), ((2, 3, 4), -1), ((2, 3, 4), 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_with_cross_entropy_hard(shape, axis, dtype):
    x = RNG.normal(scale=2, size=shape).astype(dtype)
    lab_shape = list(shape)
    lab_shape[axis] = 1
    lab = labels(tuple(lab_shape), shape[axis])
    sm = np_softmax(x, axis)
    loss = -np.log(np.take_along_axis(sm, lab, axis=axis))
    for stable in (True, False):  # the CPU result does not depend on numeric_stable_mode
        check_output("softmax_with_cross_entropy", {"Logits": x, "Label": lab},
                     {"axis": axis, "numeric_stable_mode": stable},
                     {"Softmax": sm.astype(dtype), "Loss": loss.astype(dtype)},
                     batch_unknown=axis != 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_with_cross_entropy_soft_ignore_and_extremes(dtype):
    x = np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]], dtype)
    sm = np_softmax(x)
    # shifted logits are clipped at -64, so the loss of class 1 in row 2 is 64 (as Paddle)
    check_output("softmax_with_cross_entropy", {"Logits": x, "Label": np.array([[2], [1]])}, {},
                 {"Softmax": sm.astype(dtype),
                  "Loss": np.array([[-np.log(sm[0, 2])], [64.0]], dtype)})
    check_output("softmax_with_cross_entropy", {"Logits": x, "Label": np.array([[2], [-100]])},
                 {}, {"Loss": np.array([[-np.log(sm[0, 2])], [0.0]], dtype)})
    soft = np.array([[0, 0.5, 0.5], [0.5, 0.5, 0]], dtype)
    check_output("softmax_with_cross_entropy", {"Logits": x, "Label": soft},
                 {"soft_label": True, "ignore_index": 1},  # soft labels ignore ignore_index
                 {"Loss": -(soft * np.log(sm)).sum(-1, keepdims=True).astype(dtype)})


def test_softmax_with_cross_entropy_without_softmax():
    p = np.array([[0.2, 0.3, 0.5], [0.0, 1.0, 0.0]], "float32")
    check_output("softmax_with_cross_entropy", {"Logits": p, "Label": np.array([[2], [0]])},
                 {"use_softmax": False},
                 {"Softmax": p, "Loss": np.array([[-np.log(0.5)], [1e20]], "float32")})


def test_softmax_with_cross_entropy_label_shape_error():
    with pytest.raises(OpShapeError, match=r"hard labels must have shape \[2, 1, 4\].*got "
                                           r"\[2, 3, 1\]"):
        build_op_program("softmax_with_cross_entropy",
                         {"Logits": np.ones((2, 3, 4), "float32"), "Label": labels((2, 3, 1), 3)},
                         {"axis": 1})


# ---- accuracy ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", [(8, 1), (10, 3), (1, 2)])
def test_accuracy(n, k):
    x = RNG.normal(size=(n, 5)).astype("float32")
    idx = np.argsort(-x, axis=1)[:, :k].astype("int64")
    out = np.take_along_axis(x, idx, axis=1)
    lab = labels((n, 1), 5)
    correct = sum(int(lab[i, 0] in idx[i]) for i in range(n))
    check_output("accuracy", {"Out": out, "Indices": idx, "Label": lab}, {},
                 {"Accuracy": np.asarray(correct / n, "float32"),
                  "Correct": np.asarray(correct, "int32"), "Total": np.asarray(n, "int32")},
                 batch_unknown=True)


def test_accuracy_of_an_empty_batch_is_zero():
    check_output("accuracy", {"Out": np.zeros((0, 1), "float32"),
                              "Indices": np.zeros((0, 1), "int64"),
                              "Label": np.zeros((0, 1), "int64")}, {},
                 {"Accuracy": np.asarray(0, "float32"), "Total": np.asarray(0, "int32")})


def test_accuracy_shape_errors_and_no_grad():
    with pytest.raises(OpShapeError, match=r"Label must have shape \[3, 1\] for Indices of shape "
                                           r"\[3, 2\], got \[3, 2\]"):
        build_op_program("accuracy", {"Out": np.zeros((3, 2), "float32"),
                                      "Indices": np.zeros((3, 2), "int64"),
                                      "Label": np.zeros((3, 2), "int64")})
    assert registry.get("accuracy").grad is None


# ---- dropout ---------------------------------------------------------------------------------
def _dropout(x, **attrs):
    return run_op("dropout", {"X": x}, attrs)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
def test_dropout_training_statistics_and_scaling(p, impl):
    x = RNG.uniform(1, 2, size=(100, 100)).astype("float32")
    got = _dropout(x, dropout_prob=p, dropout_implementation=impl)
    mask = got["Mask"]
    assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
    kept = mask.astype(bool)
    assert abs(kept.mean() - (1 - p)) < 4 * np.sqrt(p * (1 - p) / x.size)  # 4 sigma
    scale = 1 / (1 - p) if impl == "upscale_in_train" else 1.0
    np.testing.assert_allclose(got["Out"][kept], (x * np.float32(scale))[kept], rtol=1e-6)
    assert np.all(got["Out"][~kept] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_test_mode(dtype):
    x = RNG.normal(size=(3, 4)).astype(dtype)
    check_output("dropout", {"X": x}, {"dropout_prob": 0.25, "is_test": True},
                 {"Out": (x * 0.75).astype(dtype)}, batch_unknown=True)
    check_output("dropout", {"X": x}, {"dropout_prob": 0.25, "is_test": True,
                                       "dropout_implementation": "upscale_in_train"},
                 {"Out": x}, batch_unknown=True)


def test_dropout_extremes():
    x = np.ones((50, 20), "float32")
    for impl in ("downgrade_in_infer", "upscale_in_train"):
        assert np.all(_dropout(x, dropout_prob=1.0, dropout_implementation=impl)["Out"] == 0)
        np.testing.assert_array_equal(
            _dropout(x, dropout_prob=0.0, dropout_implementation=impl)["Out"], x)


def test_dropout_seed_determinism():
    x = np.ones((40, 50), "float32")
    a = _dropout(x, fix_seed=True, seed=7)["Mask"]
    b = _dropout(x, fix_seed=True, seed=7)["Mask"]
    c = _dropout(x, fix_seed=True, seed=8)["Mask"]
    np.testing.assert_array_equal(a, b)
    assert np.any(a != c)
    # without a fixed seed, successive runs of one program draw new masks
    prog, feed, outs = build_op_program("dropout", {"X": x})
    exe, scope = Executor(), Scope()
    m1 = exe.run(prog, feed=feed, fetch_list=outs["Mask"], scope=scope)[0]
    m2 = exe.run(prog, feed=feed, fetch_list=outs["Mask"], scope=scope)[0]
    assert np.any(m1 != m2)
    # a Seed input wins over the attributes
    s = np.array([7], "int32")
    d1 = run_op("dropout", {"X": x, "Seed": s}, {"fix_seed": True, "seed": 8})["Mask"]
    d2 = run_op("dropout", {"X": x, "Seed": s})["Mask"]
    np.testing.assert_array_equal(d1, d2)


def test_dropout_bad_attributes():
    x = np.ones((2, 3), "float32")
    with pytest.raises(OpShapeError, match=r"dropout_prob must be in \[0, 1\], got 1.5"):
        build_op_program("dropout", {"X": x}, {"dropout_prob": 1.5})
    with pytest.raises(OpShapeError, match=r"dropout_implementation must be one of"):
        build_op_program("dropout", {"X": x}, {"dropout_implementation": "nope"})
    assert registry.get("dropout").has(registry.RANDOM)


# ---- lookup_table_v2 ---------------------------------------------------------------------------
@pytest.mark.parametrize("ids_shape", [(5,), (4, 1), (2, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_lookup_table_v2(ids_shape, dtype, id_dtype):
    w = RNG.normal(size=(6, 3)).astype(dtype)
    ids = RNG.integers(0, 6, size=ids_shape).astype(id_dtype)
    want = np.stack([w[i] for i in ids.reshape(-1)]).reshape(ids_shape + (3,))
    check_output("lookup_table_v2", {"Ids": ids, "W": w}, {}, {"Out": want}, batch_unknown=False)
    ids.reshape(-1)[0] = 2
    want = np.stack([w[i] if i != 2 else np.zeros(3, dtype) for i in ids.reshape(-1)])
    check_output("lookup_table_v2", {"Ids": ids, "W": w}, {"padding_idx": 2},
                 {"Out": want.reshape(ids_shape + (3,))})


def test_lookup_table_v2_unknown_batch():
    w = RNG.normal(size=(6, 3)).astype("float32")
    ids = np.array([[1, 5], [0, 0]], "int64")
    prog, _, outs = build_op_program("lookup_table_v2", {"Ids": ids, "W": w}, batch_unknown=True)
    assert outs["Out"][0].shape == (-1, 2, 3)


@pytest.mark.parametrize("bad", [6, -1])
def test_lookup_table_v2_out_of_range_id(bad):
    w = np.ones((6, 3), "float32")
    with pytest.raises(OpRunError, match=rf"op 'lookup_table_v2'.*IndexError: Ids holds {bad} at "
                                         r"index \[1\]: expected a value in \[0, 6\)"):
        run_op("lookup_table_v2", {"Ids": np.array([0, bad], "int64"), "W": w})


def test_differentiable_ops_await_grad_makers():
    for op in ("softmax", "cross_entropy", "cross_entropy2", "softmax_with_cross_entropy",
               "dropout", "lookup_table_v2"):
        d = registry.get(op)
        assert callable(d.grad) and d.grad is not registry.NO_GRAD_YET
        assert d.has(registry.OPAQUE)
        assert d.emit is None or isinstance(d.emit, registry.Opaque)
    assert registry.get("lookup_table_v2").attrs["padding_idx"].type == registry.A.LONG
