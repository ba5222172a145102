"""Gradients of the layout ops (reshape, transpose, squeeze, unsqueeze) and of the select/join ops
(concat, split, stack, slice, gather), against float64 finite differences in every executor mode.

``check_grad`` checks one input array per slot; concat, stack and split have duplicable slots
(lists of arrays of different shapes), so they go through ``_check_list_grad`` below, the same
comparison written for lists.
"""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import registry
from pdjit.framework.errors import OpRunError
from pdjit.passes.backward import append_backward, gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, run_op
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import TARGETS

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(concat_grad|slice_grad|unsqueeze2)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(7)


def _normal(*shape):
    return RNG.normal(size=shape)


# ---- layout ops: check_grad ----------------------------------------------------------------------
@pytest.mark.parametrize("op,shape,attrs", [
    ("reshape2", (2, 3, 4), {"shape": [0, -1]}),
    ("reshape2", (2, 3, 4), {"shape": [4, 3, 2]}),
    ("reshape2", (6,), {"shape": [-1, 1, 2]}),
    ("reshape", (2, 3, 4), {"shape": [4, -1]}),
    ("reshape", (3, 4), {"shape": [0, 2, 2]}),
    ("transpose2", (2, 3, 4), {"axis": [2, 0, 1]}),
    ("transpose2", (2, 3, 4, 5), {"axis": [-1, 0, -2, 1]}),
    ("transpose", (3, 4), {"axis": [1, 0]}),
    ("transpose", (2, 3, 4), {"axis": [0, -1, 1]}),
    ("squeeze2", (2, 1, 4, 1), {"axes": [-1]}),
    ("squeeze2", (1, 3, 1), {"axes": []}),
    ("unsqueeze2", (2, 4), {"axes": [0, -1]}),
    ("unsqueeze2", (3,), {"axes": [1]}),
])
def test_layout_grads(op, shape, attrs):
    check_grad(op, {"X": _normal(*shape)}, attrs)


@pytest.mark.parametrize("op,shape,attrs", [
    ("reshape2", (2, 3, 4), {"shape": [0, -1]}),
    ("reshape", (2, 3, 4), {"shape": [-1]}),
    ("squeeze2", (2, 1, 3), {"axes": [1]}),
    ("unsqueeze2", (2, 3), {"axes": [0]}),
    ("transpose2", (2, 3), {"axis": [1, 0]}),
    ("transpose", (2, 3, 4), {"axis": [2, 0, 1]}),
])
def test_layout_grads_compile_natively(op, shape, attrs):
    # the layout grads are views or a transpose: they lower into generated code, never a
    # reference step (reshape/squeeze/unsqueeze grads also carry the VIEW trait)
    prog, feed, outs = build_op_program(op, {"X": _normal(*shape)}, attrs)
    block, out = prog.global_block(), outs["Out"][0]
    w = block.create_var(name="w", shape=list(out.shape), dtype=np.float64, need_check_feed=True)
    (g,) = gradients([out], [block.var("x_0")], target_gradients=[w])
    report = Executor().explain(prog, feed=dict(feed, w=np.ones(out.shape)), fetch_list=[g])
    steps = report.split("== steps ==")[1].split("== generated")[0]
    grad_step = next(line for line in steps.splitlines() if f"[{op}_grad#" in line)
    assert grad_step.strip().startswith("native"), report
    assert registry.get(f"{op}_grad").has(registry.VIEW) == (not op.startswith("transpose"))


def test_unsqueeze2_grad_with_axes_tensor():
    check_grad("unsqueeze2", {"X": _normal(2, 3), "AxesTensor": np.array([0, 3], np.int32)})


# ---- slice / gather ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,attrs,extra", [
    ((3, 4, 5), {"axes": [0, 2], "starts": [1, -3], "ends": [2, 100], "decrease_axis": [0]}, {}),
    ((4, 5), {"axes": [-1], "starts": [1], "ends": [-1]}, {}),
    ((3, 4), {"axes": [0, 1], "starts": [2, 1], "ends": [3, 2], "decrease_axis": [0, 1]}, {}),
    ((4, 6), {"axes": [1], "starts": [0], "ends": [0]},
     {"StartsTensor": np.array([2], np.int64), "EndsTensor": np.array([5], np.int64)}),
])
def test_slice_grad(shape, attrs, extra):
    check_grad("slice", {"Input": _normal(*shape), **extra}, attrs, inputs_to_check=["Input"])


@pytest.mark.parametrize("shape,index,axis", [
    ((4, 3), np.array([2, 0, 2, 2]), 0),              # repeated indices add up
    ((3, 5), np.array([-1, 0, 4, -1], np.int32), -1),  # negative axis and indices
    ((4, 3), np.array([[1], [1], [3]]), 0),            # Index of shape [N, 1]
    ((2, 3, 4), np.array(2), 1),                      # a 0-d index drops the axis
])
def test_gather_grad(shape, index, axis):
    check_grad("gather", {"X": _normal(*shape), "Index": index}, {"axis": axis})


def test_gather_grad_sums_repeated_indices_exactly():
    got = check_grad("gather", {"X": np.zeros((3, 2)), "Index": np.array([1, 1, 1, 0])})["X"]
    # each output row's weight flows back to the row it came from; row 1 was taken 3 times
    w = np.random.default_rng(0).uniform(0.5, 1.5, size=(4, 2))  # check_grad's weights
    np.testing.assert_allclose(got, [w[3], w[0] + w[1] + w[2], [0.0, 0.0]])


# ---- concat / stack / split: duplicable slots ----------------------------------------------------
def _check_list_grad(op_type, inputs, attrs, *, out_slot="Out", n_out=1, seeded=(0,),
                     rtol=1e-6, atol=1e-8):
    """Gradients of ``sum_k sum(W_k * out[k])`` over the seeded outputs w.r.t. every element of
    every float input (lists included), from the backward pass (every mode) vs central
    differences of the reference."""
    outputs = {out_slot: n_out}
    prog, feed, out_vars = build_op_program(op_type, inputs, attrs, outputs=outputs)
    block = prog.global_block()
    base = run_op(op_type, inputs, attrs, outputs=outputs)[out_slot]
    base = base if isinstance(base, list) else [base]
    rng = np.random.default_rng(1)
    weights = {k: rng.uniform(0.5, 1.5, size=base[k].shape) for k in seeded}
    ws = [block.create_var(name=f"w_{k}", shape=list(weights[k].shape), dtype=np.float64,
                           need_check_feed=True) for k in seeded]
    feed.update({f"w_{k}": weights[k] for k in seeded})
    # every float input, as (slot, position, variable)
    checked = []
    for slot, value in inputs.items():
        values = value if isinstance(value, list) else [value]
        for i, v in enumerate(values):
            if np.asarray(v).dtype.kind == "f":
                checked.append((slot, i, block.var(f"{slot.lower()}_{i}")))
    grads = gradients([out_vars[out_slot][k] for k in seeded], [c[2] for c in checked],
                      target_gradients=ws)

    def loss(ins):
        outs = run_op(op_type, ins, attrs, outputs=outputs)[out_slot]
        outs = outs if isinstance(outs, list) else [outs]
        return sum(float(np.sum(weights[k] * outs[k])) for k in seeded)

    wants = []
    for slot, i, _ in checked:
        values = [np.array(v, dtype=np.float64) for v in
                  (inputs[slot] if isinstance(inputs[slot], list) else [inputs[slot]])]
        x = values[i].reshape(-1)
        want = np.zeros_like(x)
        for j in range(x.size):
            orig = x[j]
            for sign in (1, -1):
                x[j] = orig + sign * 1e-6
                ins = dict(inputs, **{slot: values if isinstance(inputs[slot], list)
                                      else values[0]})
                want[j] += sign * loss(ins) / 2e-6
            x[j] = orig
        wants.append(want.reshape(values[i].shape))
    for mode in TARGETS:
        got = Executor(mode=mode).run(prog, feed=feed, fetch_list=grads, scope=Scope())
        for (slot, i, _), g, want in zip(checked, got, wants):
            np.testing.assert_allclose(g, want, rtol=rtol, atol=atol,
                                       err_msg=f"{op_type} {attrs} d/d{slot}[{i}] [{mode}]")


@pytest.mark.parametrize("shapes,axis", [
    ([(2, 3), (2, 1), (2, 2)], -1),
    ([(1, 3, 2), (2, 3, 2)], 0),
])
def test_concat_grad(shapes, axis):
    _check_list_grad("concat", {"X": [_normal(*s) for s in shapes]}, {"axis": axis})


def test_concat_grad_with_axis_tensor():
    _check_list_grad("concat", {"X": [_normal(2, 2), _normal(2, 3)],
                                "AxisTensor": np.array([1], np.int32)}, {"axis": 0})


@pytest.mark.parametrize("n,shape,axis", [(2, (2, 3), 0), (3, (2, 3), -1), (2, (3,), 1)])
def test_stack_grad(n, shape, axis):
    _check_list_grad("stack", {"X": [_normal(*shape) for _ in range(n)]}, {"axis": axis},
                     out_slot="Y")


@pytest.mark.parametrize("shape,attrs,n_out,seeded", [
    ((2, 4), {"num": 2, "axis": 1}, 2, (0,)),            # Out[1] unused: zero-filled
    ((3, 6), {"sections": [1, -1, 2], "axis": -1}, 3, (2,)),
    ((3, 6), {"sections": [1, -1, 2], "axis": -1}, 3, (0, 1, 2)),
    ((4, 2), {"num": 4, "axis": 0}, 4, (1, 3)),
])
def test_split_grad(shape, attrs, n_out, seeded):
    _check_list_grad("split", {"X": _normal(*shape)}, attrs, n_out=n_out, seeded=seeded)


def test_split_grad_is_a_concat_with_zeros_for_unused_pieces():
    prog, _, outs = build_op_program("split", {"X": _normal(2, 4)}, {"num": 2, "axis": 1},
                                     outputs={"Out": 2})
    x = prog.global_block().var("x_0")
    gradients([outs["Out"][0]], [x])
    types = [op.type for op in prog.global_block().ops]
    assert types == ["split", "fill_constant", "fill_zeros_like", "concat"], types
    concat = prog.global_block().ops[-1]
    assert concat.attr("axis") == 1 and concat.output("Out") == ["x_0@GRAD"]


def test_concat_grad_when_one_input_needs_no_gradient():
    """The unneeded entry of concat_grad's list output is bound to @EMPTY@ (as Paddle does), so
    the other entries keep their positions."""
    prog, feed, outs = build_op_program("concat", {"X": [_normal(2, 3), _normal(2, 2)]},
                                        {"axis": 1})
    block = prog.global_block()
    block.var("x_0").stop_gradient = True
    (g,) = gradients([outs["Out"][0]], [block.var("x_1")])
    grad_op = next(op for op in block.ops if op.type == "concat_grad")
    assert grad_op.output("X@GRAD") == ["@EMPTY@", "x_1@GRAD"]
    for mode in ("compiled", "reference"):
        got = Executor(mode=mode).run(prog, feed=feed, fetch_list=[g], scope=Scope())[0]
        np.testing.assert_array_equal(got, np.ones((2, 2)))


# ---- grad op slots follow Paddle's -------------------------------------------------------------
@pytest.mark.parametrize("op,inputs,attrs,want", [
    ("reshape2", {"X": np.zeros((2, 3))}, {"shape": [3, 2]},
     ("reshape2_grad", {"XShape", "Out@GRAD"}, {"X@GRAD"})),
    ("reshape", {"X": np.zeros((2, 3))}, {"shape": [3, 2]},
     ("reshape_grad", {"X", "Out@GRAD"}, {"X@GRAD"})),
    ("transpose2", {"X": np.zeros((2, 3))}, {"axis": [1, 0]},
     ("transpose2_grad", {"XShape", "Out@GRAD"}, {"X@GRAD"})),
    ("squeeze2", {"X": np.zeros((2, 1))}, {"axes": [1]},
     ("squeeze2_grad", {"XShape", "Out@GRAD"}, {"X@GRAD"})),
    ("unsqueeze2", {"X": np.zeros((2,))}, {"axes": [1]},
     ("unsqueeze2_grad", {"XShape", "Out@GRAD"}, {"X@GRAD"})),
    ("concat", {"X": [np.zeros((2,)), np.zeros((1,))]}, {"axis": 0},
     ("concat_grad", {"X", "Out@GRAD"}, {"X@GRAD"})),
    ("stack", {"X": [np.zeros((2,)), np.zeros((2,))]}, {},
     ("stack_grad", {"X", "Y@GRAD"}, {"X@GRAD"})),
    ("slice", {"Input": np.zeros((4,))}, {"axes": [0], "starts": [1], "ends": [3]},
     ("slice_grad", {"Input", "Out@GRAD"}, {"Input@GRAD"})),
    ("gather", {"X": np.zeros((4,)), "Index": np.array([1])}, {},
     ("gather_grad", {"X", "Index", "Out@GRAD"}, {"X@GRAD"})),
    ("split", {"X": np.zeros((4,))}, {"num": 2}, ("concat", {"X"}, {"Out"})),
])
def test_grad_op_types_and_slots_are_paddles(op, inputs, attrs, want):
    outputs = {"Out": 2} if op == "split" else None
    prog, _, _ = build_op_program(op, inputs, attrs, outputs=outputs)
    fwd = prog.global_block().ops[-1]
    (spec,) = registry.get(op).grad(fwd)
    assert (spec.type, set(spec.inputs), set(spec.outputs)) == want


# ---- errors --------------------------------------------------------------------------------------
def test_grad_ops_report_mismatched_gradients():
    with pytest.raises(OpRunError, match=r"expected Out@GRAD with 6 elements .* got shape \[5\]"):
        run_op("reshape2_grad", {"XShape": np.empty((0, 2, 3)), "Out@GRAD": np.ones(5)}, {})
    with pytest.raises(OpRunError, match=r"gather_grad: expected Out@GRAD of shape \[2, 3\]"):
        run_op("gather_grad", {"X": np.ones((4, 3)), "Index": np.array([0, 1]),
                               "Out@GRAD": np.ones((3, 3))}, {})
    with pytest.raises(OpRunError, match=r"slice_grad: expected Out@GRAD of shape \[2\]"):
        run_op("slice_grad", {"Input": np.ones((4,)), "Out@GRAD": np.ones(3)},
               {"axes": [0], "starts": [1], "ends": [3]})


# ---- a program mixing the ops, through append_backward -----------------------------------------
def test_append_backward_through_layout_and_join_ops():
    """loss = mean(concat([reshape(x), transpose(y), gather(slice(z))]) * c): the gradient of
    each parameter is c's matching block / N moved back through its layout op."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.create_parameter([2, 3, 4], "float64", name="x")
        y = fluid.layers.create_parameter([4, 5], "float64", name="y")
        z = fluid.layers.create_parameter([3, 6, 4], "float64", name="z")
        c = fluid.layers.data("c", [14, 4], append_batch_size=False, dtype="float64")
        idx = fluid.layers.data("idx", [3], append_batch_size=False, dtype="int64")
        zs = fluid.layers.slice(z, axes=[1], starts=[1], ends=[5])         # [3, 4, 4]
        zg = fluid.layers.reshape(fluid.layers.gather(zs, idx), [-1, 4])   # [12, 4] -> rows
        parts = fluid.layers.split(zg, [3, -1], dim=0)                     # [3, 4], [9, 4]
        joined = fluid.layers.concat([fluid.layers.reshape(x, [-1, 4]),
                                      fluid.layers.transpose(y, [1, 0]), parts[0]], axis=0)
        loss = fluid.layers.mean(fluid.layers.elementwise_mul(joined, c))
        grads = dict((p.name, g) for p, g in append_backward(loss))
    xv, yv, zv = _normal(2, 3, 4), _normal(4, 5), _normal(3, 6, 4)
    cv, iv = _normal(14, 4), np.array([2, 0, 2])
    n = cv.size
    want_x = (cv[:6] / n).reshape(2, 3, 4)
    want_y = (cv[6:11] / n).T
    # parts[0] is the first 3 rows of gather(slice(z)) flattened: gathered item 0 (z[2]), rows 0..2
    want_z = np.zeros_like(zv)
    want_z[2, 1:4] = cv[11:14] / n
    for mode in TARGETS:
        scope = Scope()
        for name, v in (("x", xv), ("y", yv), ("z", zv)):
            scope.var(name).value = v
        got = Executor(mode=mode).run(main, feed={"c": cv, "idx": iv},
                                      fetch_list=[grads["x"], grads["y"], grads["z"]],
                                      scope=scope)
        for g, want, name in zip(got, (want_x, want_y, want_z), "xyz"):
            np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-14,
                                       err_msg=f"d loss/d {name} [{mode}]")
