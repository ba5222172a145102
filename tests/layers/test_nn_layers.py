"""The Fluid-style nn layers: the ops they emit (as Paddle's legacy layers do) and their values.

Programs are built under fresh (main, startup) programs, run with a fresh Scope, and compared
with NumPy formulas over the parameters read back from the Scope.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit import layers
from pdjit.initializer import Constant
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope

# op 'cross_entropy' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(cross_entropy)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(3)


def run(main, startup, feed, fetch):
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    return exe.run(main, feed=feed, fetch_list=fetch, scope=scope), scope


def op_types(main):
    return [op.type for op in main.global_block().ops]


def np_softmax(x, axis=-1):
    z = np.maximum(x - x.max(axis=axis, keepdims=True), -64.0)
    return np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)


# ---- fc ----------------------------------------------------------------------------------------
def test_fc_structure_names_and_values(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [2, 3])
    out = layers.fc(x, size=4, act="relu", bias_attr=fluid.ParamAttr(initializer=Constant(0.5)))
    assert op_types(main) == ["mul", "elementwise_add", "relu"]
    mul, add, _ = main.global_block().ops
    assert mul.attr("x_num_col_dims") == 1 and mul.attr("y_num_col_dims") == 1
    assert add.attr("axis") == 1 and add.input("Y") == ["fc_0.b_0"]
    assert main.global_block().var("fc_0.w_0").shape == (6, 4)
    assert out.name == "fc_0.tmp_2" and out.shape == (-1, 4)
    xv = RNG.normal(size=(5, 2, 3)).astype("float32")
    (got,), scope = run(main, startup, {"x": xv}, [out])
    w, b = scope.find_var("fc_0.w_0").value, scope.find_var("fc_0.b_0").value
    assert w.shape == (6, 4) and np.all(np.abs(w) <= np.sqrt(6 / 10) + 1e-6)  # Xavier bounds
    np.testing.assert_allclose(b, np.full(4, 0.5, "float32"))
    np.testing.assert_allclose(got, np.maximum(xv.reshape(5, 6) @ w + b, 0), rtol=1e-5,
                               atol=1e-6)


def test_fc_num_flatten_dims_and_softmax(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [2, 3])
    out = layers.fc(x, size=5, num_flatten_dims=2, act="softmax")
    mul, add, sm = main.global_block().ops
    assert (mul.attr("x_num_col_dims"), add.attr("axis"), sm.type) == (2, 2, "softmax")
    assert out.shape == (-1, 2, 5)
    xv = RNG.normal(size=(4, 2, 3)).astype("float32")
    (got,), scope = run(main, startup, {"x": xv}, [out])
    w = scope.find_var("fc_0.w_0").value
    assert w.shape == (3, 5)
    np.testing.assert_allclose(got, np_softmax(np.einsum("nij,jk->nik", xv, w)), rtol=1e-5,
                               atol=1e-6)


def test_fc_several_inputs_sum_and_no_bias(fresh_programs):
    main, startup = fresh_programs
    a, b = layers.data("a", [3]), layers.data("b", [2])
    out = layers.fc([a, b], size=2)
    assert op_types(main) == ["mul", "mul", "sum", "elementwise_add"]
    names = {v.name for v in main.global_block().all_parameters()}
    assert names == {"fc_0.w_0", "fc_0.w_1", "fc_0.b_0"}
    plain = layers.fc(a, size=2, bias_attr=False)
    assert op_types(main)[-1] == "mul" and plain.name == "fc_1.tmp_0"
    av, bv = RNG.normal(size=(4, 3)).astype("float32"), RNG.normal(size=(4, 2)).astype("float32")
    (got, got_plain), scope = run(main, startup, {"a": av, "b": bv}, [out, plain])
    w0, w1 = scope.find_var("fc_0.w_0").value, scope.find_var("fc_0.w_1").value
    np.testing.assert_allclose(got, av @ w0 + bv @ w1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_plain, av @ scope.find_var("fc_1.w_0").value, rtol=1e-5,
                               atol=1e-6)


def test_fc_bad_input():
    with pytest.raises(TypeError, match=r"fc: argument 'input' must be a Variable, got ndarray"):
        layers.fc(np.ones((2, 3)), size=2)


def test_fc_bad_num_flatten_dims(fresh_programs):
    x = layers.data("x", [3])
    with pytest.raises(ValueError, match=r"num_flatten_dims=2 does not fit input 'x'"):
        layers.fc(x, size=2, num_flatten_dims=2)


# ---- matmul / mul --------------------------------------------------------------------------------
def test_matmul_and_mul_layers(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [3, 4])
    y = layers.data("y", [5, 4])
    mm = layers.matmul(x, y, transpose_y=True, alpha=0.5)
    op = main.global_block().ops[-1]
    assert (op.type, op.attr("transpose_X"), op.attr("transpose_Y"), op.attr("alpha")) == \
        ("matmul", False, True, 0.5)
    assert mm.shape == (-1, 3, 5)
    m = layers.mul(x, layers.data("w", [4, 2], append_batch_size=False), x_num_col_dims=2)
    assert main.global_block().ops[-1].attr("x_num_col_dims") == 2 and m.shape == (-1, 3, 2)
    xv, yv = RNG.normal(size=(2, 3, 4)), RNG.normal(size=(2, 5, 4))
    wv = RNG.normal(size=(4, 2)).astype("float32")
    xv, yv = xv.astype("float32"), yv.astype("float32")
    (got_mm, got_m), _ = run(main, startup, {"x": xv, "y": yv, "w": wv}, [mm, m])
    np.testing.assert_allclose(got_mm, 0.5 * np.einsum("bik,bjk->bij", xv, yv), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got_m, np.einsum("bik,kj->bij", xv, wv), rtol=1e-5, atol=1e-6)


# ---- softmax and losses ------------------------------------------------------------------------
def test_softmax_and_cross_entropy_layers(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [4])
    lab = layers.data("lab", [1], dtype="int64")
    soft = layers.data("soft", [4])
    p = layers.softmax(x)
    hard_loss = layers.cross_entropy(p, lab)
    soft_loss = layers.cross_entropy(p, soft, soft_label=True)
    assert op_types(main) == ["softmax", "cross_entropy2", "cross_entropy"]
    ce2 = main.global_block().ops[1]
    assert set(ce2.outputs) == {"Y", "XShape", "MatchX"} and ce2.attr("ignore_index") == -100
    assert hard_loss.shape == (-1, 1) and soft_loss.shape == (-1, 1)
    xv = RNG.normal(size=(6, 4)).astype("float32")
    lv = RNG.integers(0, 4, size=(6, 1)).astype("int64")
    sv = np_softmax(RNG.normal(size=(6, 4))).astype("float32")
    (pv, hv, s_v), _ = run(main, startup, {"x": xv, "lab": lv, "soft": sv},
                           [p, hard_loss, soft_loss])
    want_p = np_softmax(xv)
    np.testing.assert_allclose(pv, want_p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(hv, -np.log(np.take_along_axis(want_p, lv, 1)), rtol=1e-5)
    np.testing.assert_allclose(s_v, -(sv * np.log(want_p)).sum(1, keepdims=True), rtol=1e-5)


def test_softmax_with_cross_entropy_layer(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [3])
    lab = layers.data("lab", [1], dtype="int64")
    loss, sm = layers.softmax_with_cross_entropy(x, lab, ignore_index=2, return_softmax=True)
    op = main.global_block().ops[-1]
    assert op.type == "softmax_with_cross_entropy" and op.attr("ignore_index") == 2
    assert (sm.name, loss.name) == ("softmax_with_cross_entropy_0.tmp_0",
                                    "softmax_with_cross_entropy_0.tmp_1")
    xv = RNG.normal(size=(5, 3)).astype("float32")
    lv = np.array([[0], [1], [2], [1], [0]], "int64")
    (lossv, smv), _ = run(main, startup, {"x": xv, "lab": lv}, [loss, sm])
    want_sm = np_softmax(xv)
    want = -np.log(np.take_along_axis(want_sm, lv, 1))
    want[lv == 2] = 0
    np.testing.assert_allclose(smv, want_sm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(lossv, want, rtol=1e-5, atol=1e-7)


def test_square_error_cost(fresh_programs):
    main, startup = fresh_programs
    x, y = layers.data("x", [1]), layers.data("y", [1])
    cost = layers.square_error_cost(x, y)
    assert op_types(main) == ["elementwise_sub", "square"]
    assert cost.name == "square_error_cost_0.tmp_1"
    xv, yv = RNG.normal(size=(4, 1)).astype("float32"), RNG.normal(size=(4, 1)).astype("float32")
    (got,), _ = run(main, startup, {"x": xv, "y": yv}, [cost])
    np.testing.assert_allclose(got, (xv - yv) ** 2, rtol=1e-6)


def test_accuracy_layer(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [5])
    lab = layers.data("lab", [1], dtype="int64")
    acc = layers.accuracy(x, lab, k=2)
    topk, accop = main.global_block().ops
    assert (topk.type, topk.attr("k"), topk.attr("sorted")) == ("top_k_v2", 2, False)
    assert accop.type == "accuracy" and acc.shape == (1,) and acc.dtype == np.float32
    xv = RNG.normal(size=(20, 5)).astype("float32")
    lv = RNG.integers(0, 5, size=(20, 1)).astype("int64")
    (got,), _ = run(main, startup, {"x": xv, "lab": lv}, [acc])
    top2 = np.argsort(-xv, axis=1)[:, :2]
    want = np.mean([lv[i, 0] in top2[i] for i in range(20)])
    assert got.shape == (1,) and got[0] == pytest.approx(want)


# ---- dropout and embedding ---------------------------------------------------------------------
def test_dropout_layer(fresh_programs):
    main, startup = fresh_programs
    x = layers.data("x", [100])
    train = layers.dropout(x, 0.3, seed=5, dropout_implementation="upscale_in_train")
    infer = layers.dropout(x, 0.3, is_test=True)
    op1, op2 = main.global_block().ops
    assert (op1.attr("fix_seed"), op1.attr("seed"), op2.attr("fix_seed")) == (True, 5, False)
    assert main.global_block().var(op1.output("Mask")[0]).dtype == np.uint8
    xv = np.ones((100, 100), "float32")
    (t, i), _ = run(main, startup, {"x": xv}, [train, infer])
    kept = t != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(t[kept], np.float32(1 / 0.7), rtol=1e-6)
    np.testing.assert_allclose(i, xv * np.float32(0.7))
    with pytest.raises(ValueError, match=r"dropout_prob must be a number in \[0, 1\], got 2"):
        layers.dropout(x, 2)


def test_dropout_uses_program_random_seed(fresh_programs):
    main, _ = fresh_programs
    main.random_seed = 90
    layers.dropout(layers.data("x", [4]), 0.5)
    op = main.global_block().ops[-1]
    assert (op.attr("fix_seed"), op.attr("seed")) == (True, 90)  # as Fluid 1.x does


def test_embedding_layer(fresh_programs):
    main, startup = fresh_programs
    ids = layers.data("ids", [3], dtype="int64")
    emb = layers.embedding(ids, size=[10, 4], padding_idx=-1)
    op = main.global_block().ops[-1]
    assert op.type == "lookup_table_v2" and op.attr("padding_idx") == 9
    assert (op.attr("is_sparse"), op.attr("remote_prefetch")) == (False, False)
    assert emb.shape == (-1, 3, 4)
    iv = np.array([[0, 9, 3], [9, 1, 1]], "int64")
    (got,), scope = run(main, startup, {"ids": iv}, [emb])
    w = scope.find_var("embedding_0.w_0").value
    want = w[iv]
    want[iv == 9] = 0
    np.testing.assert_allclose(got, want)
    with pytest.raises(ValueError, match=r"padding_idx=10 is out of range"):
        layers.embedding(ids, size=[10, 4], padding_idx=10)
    with pytest.raises(TypeError, match=r"embedding: argument 'input' must have dtype int32 or "
                                        r"int64, got float32"):
        layers.embedding(layers.data("f", [3]), size=[10, 4])


def test_embedding_of_ids_with_a_last_dim_of_1_is_fluid_1x(fresh_programs):
    """Fluid 1.x's layers.embedding: ids [N, 1] -> lookup_table, [N, width]; fluid.embedding
    keeps the ids' shape (lookup_table_v2, [N, 1, width])."""
    main, startup = fresh_programs
    ids = layers.data("ids", [1], dtype="int64")
    emb = layers.embedding(ids, size=[10, 4])
    assert main.global_block().ops[-1].type == "lookup_table" and emb.shape == (-1, 4)
    emb2 = fluid.embedding(ids, size=[10, 4])
    assert main.global_block().ops[-1].type == "lookup_table_v2" and emb2.shape == (-1, 1, 4)
    iv = np.array([[3], [0], [7]], "int64")
    (got, got2), scope = run(main, startup, {"ids": iv}, [emb, emb2])
    np.testing.assert_array_equal(got, scope.find_var("embedding_0.w_0").value[iv[:, 0]])
    np.testing.assert_array_equal(got2, scope.find_var("embedding_1.w_0").value[iv])


def test_all_exported():
    for name in layers.nn.__all__:  # (functions wrapped to name the user's line on errors)
        exported = getattr(fluid.layers, name)
        assert getattr(exported, "__wrapped_layer__", exported) is getattr(layers.nn, name)
