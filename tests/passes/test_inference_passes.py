"""The inference passes (pdjit.passes.inference), each alone, and the pipeline on the corpus.

Small programs are built with pdjit's layers, given random parameters (batch norm statistics
included), turned into inference programs with feed and fetch ops, and run before and after a
pass: the outputs agree to 1e-5, the folded weights and biases equal NumPy formulas written
here (``W * gamma / sqrt(var + eps)``...), the ops meant to go are gone, the names fed and
fetched stay, and what the pass was given is unchanged. Runs use the reference executor (the
passes are program rewrites) except a few compiled, native runs of rewritten programs.
"""
import glob
import os
from collections import Counter

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.target import get_target
from pdjit.framework import registry
from pdjit.io.inference_model import feed_target_names, fetch_target_names, normalize_program
from pdjit.passes.fusion import live_names, partition
from pdjit.passes.inference import (
    INFERENCE_PASSES,
    affine_elementwise,
    fold_batch_norm,
    fold_constants,
    optimize,
    prune_unused_params,
    remove_noops,
)
from pdjit.passes.inference import test_mode as test_mode_pass
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import assert_native

RNG = np.random.default_rng(17)
BN_STATS = {"Scale": (0.5, 1.5), "Bias": (-0.5, 0.5), "Mean": (-0.5, 0.5),
            "Variance": (0.5, 2.0)}


# ---- helpers -------------------------------------------------------------------------------------
def model(make, shape, extra_params=None):
    """(inference program, params) of ``make(x)`` for x of ``[-1] + shape``: every parameter
    random, batch norm statistics in their ranges; ``extra_params`` override values."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", shape=shape, dtype="float32")
        outs = make(x)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    scope = Scope()
    Executor(mode="reference").run(startup, scope=scope)
    params = {}
    for v in main.global_block().vars.values():
        held = scope.find_var(v.name)
        if v.persistable and held is not None and held.value is not None:
            params[v.name] = RNG.uniform(-1, 1, np.shape(held.value)).astype(np.float32)
    for op in main.global_block().ops:
        if op.type == "batch_norm":
            for slot, (lo, hi) in BN_STATS.items():
                for n in op.input(slot):
                    params[n] = RNG.uniform(lo, hi, params[n].shape).astype(np.float32)
    params.update(extra_params or {})
    return normalize_program(main, ["x"], outs), params


def run(prog, params, x, mode="reference"):
    scope = Scope()
    for k, v in params.items():
        scope.var(k).value = v
    exe = Executor(mode=mode, strict=True)
    out = exe.run(prog, feed={"x": x}, scope=scope)
    if mode == "compiled":
        assert_native(exe)
    return out


def ops(prog):
    return Counter(op.type for b in prog.blocks for op in b.ops)


def snapshot(prog, params):
    return prog.serialize_to_string(), {k: v.copy() for k, v in params.items()}


def assert_unchanged(prog, params, snap):
    assert prog.serialize_to_string() == snap[0], "the pass changed the program it was given"
    assert set(params) == set(snap[1]), "the pass changed the params dict it was given"
    for k, v in params.items():
        np.testing.assert_array_equal(v, snap[1][k], err_msg=f"the pass changed param {k}")


def apply(fn, prog, params, x, **close):
    """``fn`` applied; the outputs before and after agree, the inputs are unchanged, the feed
    and fetch names stay. Returns (new program, new params, outputs after)."""
    snap = snapshot(prog, params)
    new, new_params = fn(prog, params)
    assert_unchanged(prog, params, snap)
    assert feed_target_names(new) == feed_target_names(prog)
    assert fetch_target_names(new) == fetch_target_names(prog)
    before, after = run(prog, params, x), run(new, new_params, x)
    for b, a in zip(before, after):
        np.testing.assert_allclose(a, b, **(close or {"rtol": 1e-5, "atol": 1e-5}))
    return new, new_params, after


def only_op(prog, type_):
    found = [op for b in prog.blocks for op in b.ops if op.type == type_]
    assert len(found) == 1, f"expected one {type_} op, got {len(found)}"
    return found[0]


def bn_factors(prog, params):
    """(per-channel factor gamma / sqrt(var + eps), shift beta - mean * factor) in float64,
    from the one batch_norm op of ``prog``."""
    bn = only_op(prog, "batch_norm")
    g, b, m, v = (params[bn.input(s)[0]].astype(np.float64)
                  for s in ("Scale", "Bias", "Mean", "Variance"))
    f = g / np.sqrt(v + float(bn.attr("epsilon")))
    return f, b - m * f


def x_of(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- test_mode -----------------------------------------------------------------------------------
def test_test_mode_sets_is_test_in_every_block():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", shape=[3, 4, 4], dtype="float32")
        y = fluid.layers.dropout(fluid.layers.batch_norm(x), 0.3)
    sub = main._create_block()  # a sub-block holding a dropout of its own
    sub.append_op("dropout", inputs={"X": [y]}, outputs={"Out": [sub.create_var(name="z")],
                                                         "Mask": [sub.create_var(name="m")]})
    main._rollback()
    snap = snapshot(main, {})
    new, _ = test_mode_pass(main, {})
    assert_unchanged(main, {}, snap)
    flags = [(b.idx, op.type, op.attr("is_test")) for b in new.blocks for op in b.ops]
    assert flags == [(0, "batch_norm", True), (0, "dropout", True), (1, "dropout", True)]
    assert not any(op.attr("is_test") for b in main.blocks for op in b.ops)  # given: as it was


def test_test_mode_reads_the_declared_attribute():
    """An op declaring ``test_mode="infer"`` gets ``infer`` set, not ``is_test`` (which it also
    has, as a plain attribute); ``clone(for_test=True)`` reads the same declaration; a
    declaration naming no boolean attribute is refused."""
    name = "test_mode_decl_op"
    registry.register_op(
        name, inputs=["X"], outputs=["Out"],
        attrs={"infer": registry.Bool(False), "is_test": registry.Bool(False)},
        infer_shape=lambda X, **_: {"Out": X}, reference=lambda X, **_: {"Out": X.copy()},
        emit=None, grad=None, test_mode="infer")
    try:
        assert registry.get(name).test_mode == "infer"
        assert registry.get("dropout").test_mode == "is_test"  # Fluid's, by default
        main = fluid.Program()
        gb = main.global_block()
        x = gb.create_var(name="x", shape=(2,), dtype="float32")
        gb.append_op(name, inputs={"X": [x]}, outputs={"Out": [gb.create_var(name="y")]})
        for prog in (test_mode_pass(main, {})[0], main.clone(for_test=True)):
            op = prog.global_block().ops[0]
            assert (op.attr("infer"), op.attr("is_test")) == (True, False)
        with pytest.raises(ValueError, match="test_mode 'nope'"):
            registry.register_op(
                name + "_bad", inputs=["X"], outputs=["Out"], attrs={"nope": registry.Int(0)},
                infer_shape=lambda X, **_: {"Out": X}, reference=lambda X, **_: {"Out": X},
                emit=None, grad=None, test_mode="nope")
    finally:
        registry.unregister_op(name)
        registry.unregister_op(name + "_bad")


# ---- remove_noops --------------------------------------------------------------------------------
def test_remove_noops_dropout_both_implementations():
    def make(x):
        h = fluid.layers.fc(x, 6)
        a = fluid.layers.dropout(h, 0.25, dropout_implementation="upscale_in_train")
        return fluid.layers.relu(fluid.layers.dropout(a, 0.3))  # downgrade_in_infer
    prog, params = model(make, [5])
    x = x_of(2, 5)
    new, _, (got,) = apply(remove_noops, prog, params, x)
    assert ops(new)["dropout"] == 0 and ops(new)["scale"] == 1
    assert only_op(new, "scale").attr("scale") == pytest.approx(0.7, rel=1e-7)
    w, b = params["fc_0.w_0"], params["fc_0.b_0"]
    np.testing.assert_allclose(got, np.maximum((x @ w + b) * 0.7, 0), rtol=1e-5, atol=1e-6)


def test_remove_noops_scale_by_one_and_assign_chains():
    def make(x):
        h = fluid.layers.scale(fluid.layers.fc(x, 4), scale=1.0, bias=0.0)
        h = fluid.layers.assign(fluid.layers.assign(h))
        return fluid.layers.relu(fluid.layers.scale(h, scale=2.0))  # a real scale: stays
    prog, params = model(make, [3])
    new, _, _ = apply(remove_noops, prog, params, x_of(2, 3))
    assert ops(new)["assign"] == 0 and ops(new)["scale"] == 1
    assert only_op(new, "scale").attr("scale") == 2.0
    gone = {n for op in prog.global_block().ops if op.type == "assign"
            for n in op.output_arg_names}
    assert not gone & set(new.global_block().vars)  # their variables went with them


def test_remove_noops_keeps_a_fetched_name():
    # the assign's output is fetched: the fc's bias add writes that name instead
    prog, params = model(lambda x: fluid.layers.assign(fluid.layers.fc(x, 4)), [3])
    fetched = fetch_target_names(prog)
    new, _, _ = apply(remove_noops, prog, params, x_of(2, 3))
    assert ops(new)["assign"] == 0
    assert fetch_target_names(new) == fetched
    assert only_op(new, "elementwise_add").output("Out") == fetched


def test_remove_noops_keeps_an_op_between_two_names_that_must_stay():
    # feed -> assign -> fetch: neither name may change, the assign stays; a persistable
    # written by an assign: the op before it writes the persistable instead
    def make(x):
        p = fluid.layers.create_global_var([3], 0.0, "float32", persistable=True, name="kept")
        fluid.layers.assign(fluid.layers.reduce_sum(x, dim=0), output=p)
        return [fluid.layers.assign(x), p]
    prog, params = model(make, [3])
    x = x_of(2, 3)
    new, _, (copy, kept) = apply(remove_noops, prog, params, x)
    assert ops(new)["assign"] == 1  # x and the fetched copy keep their names: the op stays
    assert fetch_target_names(new)[1] == "kept" and "kept" in new.global_block().vars
    np.testing.assert_array_equal(copy, x)
    np.testing.assert_allclose(kept, x.sum(0), rtol=1e-5)
    assert only_op(new, "reduce_sum").output("Out") == ["kept"]


def test_remove_noops_with_sub_blocks():
    # h is read inside both branches and by the conditional_block ops: its assign stays; in a
    # branch, the assign of h goes, the one writing the branch's result stays
    L = fluid.layers

    def make(x):
        h = L.assign(L.fc(x, 3))
        pred = L.less_than(L.reduce_sum(x), L.fill_constant([1], "float32", 0.0))
        return L.cond(pred, lambda: L.assign(h) * 2.0, lambda: h - 1.0)
    prog, params = model(make, [3])
    inner = [op.type for op in prog.blocks[1].ops]
    assert inner == ["assign", "scale", "assign"]  # the last writes the branch's result
    w, b = params["fc_0.w_0"], params["fc_0.b_0"]
    for x in (-np.ones((2, 3), np.float32), np.ones((2, 3), np.float32)):
        new, _, (got,) = apply(remove_noops, prog, params, x)
        h = x @ w + b
        np.testing.assert_allclose(got, h * 2 if x.sum() < 0 else h - 1, rtol=1e-5, atol=1e-6)
    assert [op.type for op in new.blocks[1].ops] == ["scale", "assign"]
    assert ops(new)["assign"] == ops(prog)["assign"] - 1


# ---- fold_batch_norm -----------------------------------------------------------------------------
def check_folded(prog, params, new, new_params, weight_of, expect_w, expect_b):
    """The op whose weight slot is ``weight_of`` reads a new weight equal to ``expect_w``, one
    bias add of ``expect_b`` follows, the batch norm and its parameters are gone."""
    op_type, slot = weight_of
    old_w = only_op(prog, op_type).input(slot)[0]
    new_op = only_op(new, op_type)
    w = new_op.input(slot)[0]
    assert w != old_w and w in new_params and new.global_block().var(w).persistable
    np.testing.assert_allclose(new_params[w], expect_w, rtol=1e-5, atol=1e-6)
    add = only_op(new, "elementwise_add")
    assert add.input("X") == new_op.output(next(iter(new_op.outputs)))
    np.testing.assert_allclose(new_params[add.input("Y")[0]], expect_b, rtol=1e-5, atol=1e-6)
    assert ops(new)["batch_norm"] == 0
    bn = only_op(prog, "batch_norm")
    for n in [old_w] + bn.input("Scale") + bn.input("Mean") + bn.input("Variance"):
        assert n not in new_params and n not in new.global_block().vars
    return add


def test_fold_bn_into_conv2d_nchw_with_its_bias_compiled():
    prog, params = model(lambda x: fluid.layers.batch_norm(
        fluid.layers.conv2d(x, 4, 3, padding=1)), [3, 5, 5])
    x = x_of(2, 3, 5, 5)
    new, new_params, got = apply(fold_batch_norm, prog, params, x)
    f, shift = bn_factors(prog, params)
    w, b = params["conv2d_0.w_0"], params["conv2d_0.b_0"]
    add = check_folded(prog, params, new, new_params, ("conv2d", "Filter"),
                       w * f[:, None, None, None], b * f + shift)
    assert add.attr("axis") == 1
    assert ops(new) == Counter(feed=1, conv2d=1, elementwise_add=1, fetch=1)
    (native,) = run(new, new_params, x, mode="compiled")  # the folded program runs natively
    np.testing.assert_allclose(native, got[0], rtol=1e-5, atol=1e-5)


def _bias_as_paddle2_saves_it(y, c, shape=None):
    """``y`` plus a parameter of shape ``[1, c, 1, 1]`` (``shape``), axis -1: how PaddlePaddle
    2.x saves a convolution's bias."""
    b = fluid.layers.create_parameter(shape or [1, c, 1, 1], "float32")
    return fluid.layers.elementwise_add(y, b, axis=-1)


@pytest.mark.parametrize("shape", [[1, 4, 1, 1], [4, 1, 1]])
def test_fold_bn_after_a_bias_of_rank_4(shape):
    """A bias of shape [1, C, 1, 1] (or [C, 1, 1]) added with axis -1 varies along the
    channels only: declared per channel, it folds with the batch norm after it into the
    convolution and one bias add of shape [C]."""
    prog, params = model(lambda x: fluid.layers.batch_norm(_bias_as_paddle2_saves_it(
        fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False), 4, shape)), [3, 5, 5])
    add = only_op(prog, "elementwise_add")
    spec = registry.get("elementwise_add").inference(add)
    assert spec.axis == 1
    bias = params[add.input("Y")[0]]
    np.testing.assert_array_equal(spec.coefficients({"Y": bias})[1], bias.reshape(-1))
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(2, 3, 5, 5))
    f, shift = bn_factors(prog, params)
    add = check_folded(prog, params, new, new_params, ("conv2d", "Filter"),
                       params["conv2d_0.w_0"] * f[:, None, None, None],
                       bias.reshape(-1) * f + shift)
    assert add.attr("axis") == 1


def test_a_bias_varying_along_more_than_one_dim_is_no_channel_affine():
    """A constant of shape [1, C, H, 1] added after a convolution varies along two dims: no
    per-channel coefficients, nothing folds."""
    prog, params = model(lambda x: fluid.layers.batch_norm(_bias_as_paddle2_saves_it(
        fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False), 4, [1, 4, 5, 1])), [3, 5, 5])
    add = only_op(prog, "elementwise_add")
    spec = registry.get("elementwise_add").inference(add)
    assert spec.coefficients({"Y": params[add.input("Y")[0]]}) is None
    new, _, _ = apply(fold_batch_norm, prog, params, x_of(2, 3, 5, 5))
    assert ops(new)["batch_norm"] == 1


def test_fold_bn_into_conv2d_nhwc():
    prog, params = model(lambda x: fluid.layers.batch_norm(
        fluid.layers.conv2d(x, 4, 3, padding=1, data_format="NHWC", bias_attr=False),
        data_layout="NHWC"), [5, 5, 3])
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(2, 5, 5, 3))
    f, shift = bn_factors(prog, params)
    add = check_folded(prog, params, new, new_params, ("conv2d", "Filter"),
                       params["conv2d_0.w_0"] * f[:, None, None, None], shift)
    assert add.attr("axis") == -1


def test_fold_bn_into_depthwise_conv2d():
    prog, params = model(lambda x: fluid.layers.batch_norm(fluid.layers.conv2d(
        x, 6, 3, padding=1, groups=3, use_cudnn=False, bias_attr=False)), [3, 4, 4])
    assert ops(prog)["depthwise_conv2d"] == 1
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(2, 3, 4, 4))
    f, shift = bn_factors(prog, params)
    check_folded(prog, params, new, new_params, ("depthwise_conv2d", "Filter"),
                 params["depthwise_conv2d_0.w_0"] * f[:, None, None, None], shift)


@pytest.mark.parametrize("groups", [1, 2])
def test_fold_bn_into_conv2d_transpose(groups):
    prog, params = model(lambda x: fluid.layers.batch_norm(fluid.layers.conv2d_transpose(
        x, 6, filter_size=3, groups=groups, bias_attr=False)), [4, 3, 3])
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(2, 4, 3, 3))
    f, shift = bn_factors(prog, params)
    w = params["conv2d_transpose_0.w_0"]  # [Cin, M / groups, kh, kw]
    want = np.empty(w.shape)
    cin_g, m_g = w.shape[0] // groups, w.shape[1]
    for ci in range(w.shape[0]):
        for j in range(m_g):  # output channel of this filter column: its group's j-th
            want[ci, j] = w[ci, j] * f[(ci // cin_g) * m_g + j]
    check_folded(prog, params, new, new_params, ("conv2d_transpose", "Filter"), want, shift)


def test_fold_bn_into_fc():
    prog, params = model(lambda x: fluid.layers.batch_norm(fluid.layers.fc(x, 4)), [3])
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(5, 3))
    f, shift = bn_factors(prog, params)
    check_folded(prog, params, new, new_params, ("mul", "Y"), params["fc_0.w_0"] * f,
                 params["fc_0.b_0"] * f + shift)


@pytest.mark.parametrize("trans_y", [False, True])
def test_fold_bn_into_matmul_v2(trans_y):
    def make(x):
        w = fluid.layers.create_parameter([4, 3] if trans_y else [3, 4], "float32", name="w")
        out = fluid.default_main_program().global_block().create_var(
            name="mm", shape=[-1, 4], dtype="float32")
        fluid.default_main_program().global_block().append_op(
            "matmul_v2", inputs={"X": [x], "Y": [w]}, outputs={"Out": [out]},
            attrs={"trans_y": trans_y})
        return fluid.layers.batch_norm(out)
    prog, params = model(make, [3])
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(5, 3))
    f, shift = bn_factors(prog, params)
    w = params["w"]
    check_folded(prog, params, new, new_params, ("matmul_v2", "Y"),
                 w * f[:, None] if trans_y else w * f, shift)


def test_no_fold_when_the_conv_output_is_read_elsewhere_or_bn_trains():
    def make(x):
        c = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False)
        return [fluid.layers.batch_norm(c), fluid.layers.relu(c)]
    prog, params = model(make, [3, 4, 4])
    new, new_params = fold_batch_norm(prog, params)
    assert ops(new) == ops(prog) and set(new_params) == set(params)
    # a batch norm that uses batch statistics (not in test mode) is no per-channel affine
    prog, params = model(lambda x: fluid.layers.batch_norm(fluid.layers.fc(x, 4)), [3])
    trains = prog.clone()
    only_op(trains, "batch_norm")._set_attr("is_test", False)
    assert ops(fold_batch_norm(trains, params)[0])["batch_norm"] == 1
    # nor one whose statistics have no values
    stats = set(only_op(prog, "batch_norm").input("Mean"))
    no_values = {k: v for k, v in params.items() if k not in stats}
    assert ops(fold_batch_norm(prog, no_values)[0])["batch_norm"] == 1


def test_fold_bn_keeps_a_shared_weight():
    def make(x):
        c1 = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False,
                                 param_attr=fluid.ParamAttr(name="shared"))
        c2 = fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False,
                                 param_attr=fluid.ParamAttr(name="shared"))
        return [fluid.layers.batch_norm(c1), c2]
    prog, params = model(make, [3, 4, 4])
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(2, 3, 4, 4))
    filters = sorted(op.input("Filter")[0] for op in new.global_block().ops
                     if op.type == "conv2d")
    assert filters[0] == "shared" and filters[1].startswith("shared.")
    np.testing.assert_array_equal(new_params["shared"], params["shared"])
    # handed over (overwrite), a weight another op reads is still not scaled in place
    given = {k: v.copy() for k, v in params.items()}
    _, again = fold_batch_norm(prog, given, overwrite=True)
    np.testing.assert_array_equal(given["shared"], params["shared"])
    np.testing.assert_array_equal(again[filters[1]], new_params[filters[1]])


def test_fold_bn_many_chains_rounds_once_and_keeps_its_use_table(monkeypatch):
    """Several chains in one program (conv-bn-relu twice, a residual add, fc-bn): each folded
    weight is the float64 product rounded once to float32 (bit for bit), and the table of
    reads and writes the pass keeps up to date after each fold is the one built afresh."""
    from pdjit.passes import inference as passes

    def make(x):
        c1 = fluid.layers.relu(fluid.layers.batch_norm(
            fluid.layers.conv2d(x, 4, 3, padding=1, bias_attr=False)))
        c2 = fluid.layers.batch_norm(fluid.layers.conv2d(c1, 4, 1, bias_attr=False))
        r = fluid.layers.elementwise_add(c1, c2)
        return fluid.layers.batch_norm(fluid.layers.fc(r, 5, bias_attr=False))
    prog, params = model(make, [3, 4, 4])
    checked = []
    update = passes._Uses.update

    def checked_update(self, program, b, before, changed=()):
        update(self, program, b, before, changed)
        fresh = passes._Uses(program)
        for table in ("readers", "writers"):
            mine = {n: v for n, v in getattr(self, table).items() if v}
            assert mine == {n: v for n, v in getattr(fresh, table).items() if v}, table
        mentioned = {n for n, v in fresh.blocks.items() if v}
        assert {n for n, v in self.blocks.items() if v} == mentioned
        assert self.pinned & mentioned == fresh.pinned & mentioned
        checked.append(True)
    monkeypatch.setattr(passes._Uses, "update", checked_update)
    new, new_params, _ = apply(fold_batch_norm, prog, params, x_of(2, 3, 4, 4))
    assert len(checked) == 3 and ops(new)["batch_norm"] == 0
    bns = [op for op in prog.global_block().ops if op.type == "batch_norm"]
    for (op_type, slot), bn in zip([("conv2d", "Filter")] * 2 + [("mul", "Y")], bns):
        (x_name,) = bn.input("X")
        (lin,) = [op for op in prog.global_block().ops if x_name in op.output_arg_names]
        assert lin.type == op_type
        w_old = params[lin.input(slot)[0]]
        g, m, v = (params[bn.input(s)[0]].astype(np.float64) for s in ("Scale", "Mean",
                                                                         "Variance"))
        f = g / np.sqrt(v + float(bn.attr("epsilon")))
        f = f.reshape(-1, 1, 1, 1) if op_type == "conv2d" else f.reshape(1, -1)
        want = (w_old.astype(np.float64) * f).astype(np.float32)
        (new_lin,) = [op for op in new.global_block().ops
                      if op.type == op_type and op.output_arg_names == lin.output_arg_names]
        got = new_params[new_lin.input(slot)[0]]
        assert got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    # handed over (overwrite): the same values, each weight scaled in its own memory
    given = {k: v.copy() for k, v in params.items()}
    again, again_params = fold_batch_norm(prog, given, overwrite=True)
    assert set(again_params) == set(new_params)
    for k, v in new_params.items():
        np.testing.assert_array_equal(again_params[k], v)
    for op in prog.global_block().ops:
        if op.type in ("conv2d", "mul"):
            w_old = op.input("Filter" if op.type == "conv2d" else "Y")[0]
            assert any(np.shares_memory(given[w_old], v) for v in again_params.values())


def test_dump_after_fold_batch_norm(monkeypatch, capsys):
    prog, params = model(lambda x: fluid.layers.batch_norm(fluid.layers.fc(x, 2)), [3])
    monkeypatch.setenv("PDJIT_DUMP_AFTER", "fold_batch_norm")
    new, _ = optimize(prog, params)
    err = capsys.readouterr().err
    assert "after pass fold_batch_norm" in err and "after pass remove_noops" not in err
    assert "= batch_norm(" not in err and "= elementwise_add(" in err


# ---- affine_elementwise --------------------------------------------------------------------------
def channel_params(new, new_params, axis):
    """(scale, shift) of the elementwise_mul and elementwise_add of ``new`` (None where the
    op is absent), both broadcast along ``axis``."""
    out = []
    for t in ("elementwise_mul", "elementwise_add"):
        found = [op for op in new.global_block().ops if op.type == t]
        assert len(found) <= 1
        if found:
            assert found[0].attr("axis") == axis
            assert new.global_block().var(found[0].input("Y")[0]).persistable
        out.append(new_params[found[0].input("Y")[0]] if found else None)
    return out


def test_affine_elementwise_bn_after_a_pool_then_relu_compiled_and_fused():
    # a pre-activation network's batch norm: nothing before it to fold into
    prog, params = model(lambda x: fluid.layers.relu(fluid.layers.batch_norm(
        fluid.layers.pool2d(x, 2, pool_stride=2))), [5, 6, 6])
    x = x_of(2, 5, 6, 6)
    f, shift = bn_factors(prog, params)
    assert ops(fold_batch_norm(prog, params)[0])["batch_norm"] == 1
    new, new_params, (got,) = apply(affine_elementwise, prog, params, x)
    assert ops(new) == Counter(feed=1, pool2d=1, elementwise_mul=1, elementwise_add=1, relu=1,
                               fetch=1)
    scale, add = channel_params(new, new_params, 1)
    np.testing.assert_allclose(scale, f, rtol=1e-6)
    np.testing.assert_allclose(add, shift, rtol=1e-6, atol=1e-7)
    assert scale.dtype == add.dtype == np.float32
    bn = only_op(prog, "batch_norm")
    for n in bn.input("Scale") + bn.input("Mean") + bn.input("Variance") + bn.output("SavedMean"):
        assert n not in new_params and n not in new.global_block().vars
    pooled = x.reshape(2, 5, 3, 2, 3, 2).max(axis=(3, 5)).astype(np.float64)
    want = np.maximum(pooled * f[:, None, None] + shift[:, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    scope = Scope()
    for k, v in new_params.items():
        scope.var(k).value = v
    exe = Executor(mode="compiled", strict=True)
    (native,) = exe.run(new, feed={"x": x}, scope=scope)
    assert_native(exe)
    np.testing.assert_allclose(native, want, rtol=1e-5, atol=1e-5)
    # the three elementwise ops fuse: one group of the CPU target's partition
    block = new.global_block()
    body = [op for op in block.ops if op.type not in ("feed", "fetch")]
    part = partition(block, body, live_names(new, block, fetch_target_names(new)),
                     target=get_target("cpu"))
    groups = [[op.type for op in g.ops] for seg in part.segments for g in seg.groups]
    assert ["elementwise_mul", "elementwise_add", "relu"] in groups, groups


def test_affine_elementwise_leaves_out_ones_and_zeros_nhwc_and_rank_2():
    # mean 0, bias 0: no shift; NHWC: along the last dim
    def make(x):
        return fluid.layers.batch_norm(fluid.layers.relu(x), data_layout="NHWC")
    prog, params = model(make, [3, 3, 4])
    bn = only_op(prog, "batch_norm")
    for slot in ("Mean", "Bias"):
        params[bn.input(slot)[0]] = np.zeros(4, np.float32)
    new, new_params, _ = apply(affine_elementwise, prog, params, x_of(2, 3, 3, 4))
    scale, add = channel_params(new, new_params, -1)
    assert add is None
    f, _ = bn_factors(prog, params)
    np.testing.assert_allclose(scale, f, rtol=1e-6)
    # scale 1, variance 1 - epsilon: no factor; after a product of rank 2 (but a relu apart)
    prog, params = model(lambda x: fluid.layers.batch_norm(fluid.layers.relu(x)), [4])
    bn = only_op(prog, "batch_norm")
    eps = float(bn.attr("epsilon"))
    params[bn.input("Scale")[0]] = np.ones(4, np.float32)
    params[bn.input("Variance")[0]] = np.full(4, 1 - eps, np.float64).astype(np.float32)
    assert np.all((1 / np.sqrt(params[bn.input("Variance")[0]].astype(np.float64) + eps))
                  .astype(np.float32) == 1)  # a factor of one, once rounded
    x = x_of(3, 4)
    new, new_params, (got,) = apply(affine_elementwise, prog, params, x)
    scale, add = channel_params(new, new_params, -1)
    assert scale is None
    mean, beta = (params[bn.input(s)[0]].astype(np.float64) for s in ("Mean", "Bias"))
    np.testing.assert_allclose(add, beta - mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, np.maximum(x, 0) + beta - mean, rtol=1e-5, atol=1e-5)


def test_affine_elementwise_keeps_what_is_not_a_constant_affine():
    # training statistics; statistics without values; a running mean read by another op
    prog, params = model(lambda x: fluid.layers.batch_norm(fluid.layers.relu(x)), [3])
    trains = prog.clone()
    only_op(trains, "batch_norm")._set_attr("is_test", False)
    assert ops(affine_elementwise(trains, params)[0])["batch_norm"] == 1
    stats = set(only_op(prog, "batch_norm").input("Mean"))
    assert ops(affine_elementwise(prog, {k: v for k, v in params.items()
                                         if k not in stats})[0])["batch_norm"] == 1

    def make(x):
        y = fluid.layers.batch_norm(fluid.layers.relu(x))
        mean = y.block.ops[-1].output("MeanOut")[0]
        return [y, fluid.layers.scale(y.block.var(mean), 2.0)]
    prog, params = model(make, [3])
    new, _ = affine_elementwise(prog, params)
    assert ops(new)["batch_norm"] == 0  # MeanOut is Mean, passed through: still a constant
    np.testing.assert_allclose(run(new, _, x_of(2, 3))[1],
                               2 * params[only_op(prog, "batch_norm").input("Mean")[0]])
    # an elementwise bias add is no opaque op: it stays as it is
    prog, params = model(lambda x: fluid.layers.fc(fluid.layers.relu(x), 2), [3])
    new, _ = affine_elementwise(prog, params)
    assert ops(new) == ops(prog)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_affine_channel_folds_into_a_conv_or_becomes_elementwise(layout):
    c_axis = 1 if layout == "NCHW" else 3
    shape = [3, 5, 5] if layout == "NCHW" else [5, 5, 3]

    def affine(x, c):  # Fluid's frozen batch norm: scale and shift as parameters
        s, b = (fluid.layers.create_parameter([c], "float32") for _ in range(2))
        return fluid.layers.affine_channel(x, s, b, data_layout=layout)

    prog, params = model(lambda x: affine(fluid.layers.conv2d(
        x, 4, 3, padding=1, bias_attr=False, data_format=layout), 4), shape)
    x = x_of(2, *shape)
    new, new_params, _ = apply(fold_batch_norm, prog, params, x)
    assert ops(new) == Counter(feed=1, conv2d=1, elementwise_add=1, fetch=1)
    aff = only_op(prog, "affine_channel")
    s, b = params[aff.input("Scale")[0]], params[aff.input("Bias")[0]]
    w = only_op(new, "conv2d").input("Filter")[0]
    np.testing.assert_allclose(new_params[w], params["conv2d_0.w_0"] * s[:, None, None, None],
                               rtol=1e-6)
    # after a pool: an elementwise scale and shift, here checked against NumPy
    prog, params = model(lambda x: affine(fluid.layers.pool2d(
        x, 2, pool_type="avg", pool_stride=2, data_format=layout), 3), shape)
    new, new_params, (got,) = apply(affine_elementwise, prog, params, x)
    aff = only_op(prog, "affine_channel")
    s, b = params[aff.input("Scale")[0]], params[aff.input("Bias")[0]]
    scale, add = channel_params(new, new_params, 1 if layout == "NCHW" else -1)
    np.testing.assert_array_equal(scale, s)
    np.testing.assert_array_equal(add, b)
    if layout == "NCHW":
        pooled = x[:, :, :4, :4].reshape(2, 3, 2, 2, 2, 2).mean(axis=(3, 5))
    else:
        pooled = x[:, :4, :4].reshape(2, 2, 2, 2, 2, 3).mean(axis=(2, 4))
    view = [1, 1, 1, 1]
    view[c_axis] = 3
    np.testing.assert_allclose(got, pooled * s.reshape(view) + b.reshape(view), rtol=1e-5,
                               atol=1e-5)


# ---- fold_constants ------------------------------------------------------------------------------
def test_fold_constants_transpose_scale_and_fill_constant_chains():
    def make(x):
        w = fluid.layers.create_parameter([4, 3], "float32", name="w")
        v = fluid.layers.create_parameter([3, 4], "float32", name="v")
        two = fluid.layers.fill_constant([3, 4], "float32", 2.0)
        a = fluid.layers.matmul(x, fluid.layers.transpose(w, [1, 0]))
        b = fluid.layers.matmul(x, fluid.layers.scale(v, scale=3.0) * two)
        one = fluid.layers.fill_constant([1], "float32", 1.0)  # read by a kept op: stays
        return a + b + one
    prog, params = model(make, [3])
    x = x_of(2, 3)
    new, new_params, (got,) = apply(fold_constants, prog, params, x)
    assert ops(new) == Counter(feed=1, matmul=2, elementwise_add=2, fill_constant=1, fetch=1)
    w, v = params["w"], params["v"]
    np.testing.assert_allclose(got, x @ w.T + x @ (6 * v) + 1, rtol=1e-5, atol=1e-5)
    consts = {n: new_params[n] for op in new.global_block().ops if op.type == "matmul"
              for n in op.input("Y")}
    assert len(consts) == 2 and all(new.global_block().var(n).persistable for n in consts)
    np.testing.assert_array_equal(sorted(c.shape for c in consts.values()), [(3, 4), (3, 4)])
    assert any(np.array_equal(c, w.T) for c in consts.values())
    assert any(np.allclose(c, 6 * v) for c in consts.values())
    assert "w" not in new_params and "v" not in new_params  # now unused: dropped
    assert "w" not in new.global_block().vars and "v" not in new.global_block().vars


def test_prune_unused_params():
    prog, params = model(lambda x: fluid.layers.fc(x, 2), [3])
    snap = snapshot(prog, params)
    new, new_params = prune_unused_params(prog, dict(params, stale=np.zeros(2, np.float32)))
    assert_unchanged(prog, params, snap)
    assert set(new_params) == set(params)


# ---- the pipeline --------------------------------------------------------------------------------
def test_optimize_names_and_errors():
    prog, params = model(lambda x: fluid.layers.dropout(fluid.layers.fc(x, 2), 0.5), [3])
    assert [n for n, _ in INFERENCE_PASSES] == ["test_mode", "remove_noops", "fold_batch_norm",
                                               "affine_elementwise", "fold_constants",
                                               "fuse_attention", "channels_last"]
    new, _ = optimize(prog, params, passes=["test_mode"])
    assert ops(new) == ops(prog)
    new, _ = optimize(prog, params)
    assert ops(new)["dropout"] == 0
    with pytest.raises(ValueError, match="unknown inference pass.*'fold_bn'"):
        optimize(prog, params, passes=["fold_bn"])
    with pytest.raises(TypeError, match="params must be a dict"):
        optimize(prog, list(params))


def _corpus():
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle")
    paths = [os.path.join(root, "mlp_infer.pdmodel")]
    paths += sorted(glob.glob(os.path.join(root, "models", "*.pdmodel")))
    return [pytest.param(p, id=os.path.basename(p)[:-8]) for p in paths]


def _io_cases(path, feed_names):
    io = np.load(path[:-len(".pdmodel")] + "_io.npz")
    cases = sorted({k.split("/")[0] for k in io.files if "/feed/" in k})
    if not cases:  # the top-level fixtures: feed names as keys
        return [{k: io[k] for k in feed_names}]
    return [{k.split("/", 2)[2]: io[k] for k in io.files if k.startswith(f"{c}/feed/")}
            for c in cases[:1]]


@pytest.mark.parametrize("path", _corpus())
def test_corpus_models_agree_after_every_pass(path):
    with open(path, "rb") as f:
        prog = fluid.Program.parse_from_string(f.read())
    with open(path[:-len(".pdmodel")] + ".pdiparams", "rb") as f:
        params = fluid.io.load_combined_params(f.read(), fluid.io.persistable_names(prog))
    snap = snapshot(prog, params)
    steps, p, q = [], prog, params
    for name, fn in INFERENCE_PASSES:
        p, q = fn(p, q)
        steps.append((name, p, q))
    assert_unchanged(prog, params, snap)
    assert fetch_target_names(p) == fetch_target_names(prog)
    assert feed_target_names(p) == feed_target_names(prog)
    assert sum(ops(p).values()) <= sum(ops(prog).values())
    missing = sorted({op.type for b in prog.blocks for op in b.ops
                      if registry.lookup(op.type) is None})
    if missing:
        pytest.skip(f"ops not in pdjit yet: {missing}")
    for feeds in _io_cases(path, feed_target_names(prog)):
        want = _run_feeds(prog, params, feeds)
        for name, p, q in steps:
            for a, b in zip(_run_feeds(p, q, feeds), want):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5,
                                           err_msg=f"after pass {name}")


def _run_feeds(prog, params, feeds):
    scope = Scope()
    for k, v in params.items():
        scope.var(k).value = v
    return Executor(mode="reference").run(prog, feed=feeds, scope=scope)
