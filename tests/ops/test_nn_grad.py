"""Gradients of the matmul and nn families against finite differences (``check_grad``).

The grad ops' slots follow Paddle 3.3.1 (``mul_grad: X, Y, Out@GRAD -> X@GRAD, Y@GRAD`` ...);
their formulas were also compared with Paddle's own grad kernels while writing them.
"""
import numpy as np
import pytest

from pdjit.framework import registry
from pdjit.framework.program import Program
from pdjit.passes.backward import gradients
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing.grad_check import check_grad

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(cross_entropy_grad|softmax_with_cross_entropy"
    r"|softmax_with_cross_entropy_grad)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(7)


def _n(*shape):
    return RNG.normal(size=shape)


def _probs(*shape):
    """Rows of probabilities kept away from 0 (the cross entropies divide by them)."""
    p = RNG.uniform(0.2, 1.0, size=shape)
    return p / p.sum(-1, keepdims=True)


def _labels(high, *shape):
    return RNG.integers(0, high, size=shape).astype(np.int64)


# ---- matmul family ------------------------------------------------------------------------------
@pytest.mark.parametrize("xs,ys,xn,yn", [((3, 4), (4, 5), 1, 1), ((2, 3, 4), (4, 5, 2), 2, 1),
                                         ((2, 3, 4), (3, 4, 5), 1, 2)])
def test_mul_grad(xs, ys, xn, yn):
    check_grad("mul", {"X": _n(*xs), "Y": _n(*ys)}, {"x_num_col_dims": xn, "y_num_col_dims": yn},
               ["X", "Y"])


@pytest.mark.parametrize("tx", [False, True])
@pytest.mark.parametrize("ty", [False, True])
def test_matmul_grad_transposes_and_alpha(tx, ty):
    xs, ys = ((4, 3) if tx else (3, 4)), ((5, 4) if ty else (4, 5))
    check_grad("matmul", {"X": _n(*xs), "Y": _n(*ys)},
               {"transpose_X": tx, "transpose_Y": ty, "alpha": 1.5}, ["X", "Y"])
    check_grad("matmul", {"X": _n(2, *xs), "Y": _n(*ys)},
               {"transpose_X": tx, "transpose_Y": ty, "alpha": -0.5}, ["X", "Y"])


@pytest.mark.parametrize("xs,ys,tx,ty", [
    ((3, 4), (4, 5), False, True),           # rank 2 (native)
    ((2, 3, 4), (1, 4, 5), False, False),    # Y's batch dim broadcast: summed back
    ((2, 1, 4, 3), (3, 4, 5), True, False),  # both broadcast
    ((4,), (2, 4, 5), True, False),          # vector X ignores its flag
    ((2, 3, 4), (4,), False, True),          # vector Y
    ((4,), (4,), False, False),              # 0-d result
])
def test_matmul_v2_grad(xs, ys, tx, ty):
    if ty and len(ys) > 1:
        ys = ys[:-2] + (ys[-1], ys[-2])
    check_grad("matmul_v2", {"X": _n(*xs), "Y": _n(*ys)}, {"trans_x": tx, "trans_y": ty},
               ["X", "Y"])


def _grad_program(op_type, inputs, attrs, wrt):
    prog = Program()
    block = prog.global_block()
    ins = {k: [block.create_var(name=k.lower(), shape=list(v.shape), dtype=v.dtype)]
           for k, v in inputs.items()}
    for k, vs in ins.items():
        vs[0].stop_gradient = k not in wrt
    out = block.create_var(name="out")
    block.append_op(op_type, inputs=ins, outputs={"Out": [out]}, attrs=attrs)
    grads = gradients([out], [ins[k][0] for k in wrt],
                      target_gradients=[block.create_var(name="w", shape=list(out.shape),
                                                         dtype=out.dtype)])
    return prog, grads


@pytest.mark.parametrize("op_type,xs,ys,attrs", [
    ("mul", (3, 4), (4, 5), {}),
    ("matmul", (4, 3), (4, 5), {"transpose_X": True, "alpha": 2.0}),
    ("matmul_v2", (3, 4), (5, 4), {"trans_y": True}),
    ("matmul_v2", (4, 3), (5, 4), {"trans_x": True, "trans_y": True})])
def test_rank2_grad_ops_compile_to_native_code(op_type, xs, ys, attrs):
    x, y = _n(*xs).astype("float32"), _n(*ys).astype("float32")
    prog, grads = _grad_program(op_type, {"X": x, "Y": y}, attrs, ["X", "Y"])
    exe = Executor(mode="compiled")
    feed = {"x": x, "y": y}
    out_shape = prog.global_block().var("out").shape
    feed["w"] = _n(*out_shape).astype("float32")
    report = exe.explain(prog, feed=feed, fetch_list=grads)
    assert f"{op_type}_grad#" in report and f"reference {op_type}_grad" not in report, report
    got = exe.run(prog, feed=feed, fetch_list=grads, scope=Scope())
    want = Executor(mode="reference").run(prog, feed=feed, fetch_list=grads, scope=Scope())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_grad_of_an_input_nobody_needs_is_left_out():
    """Only X@GRAD wanted: the grad op's Y@GRAD slot is empty and the native code skips it."""
    x, y = _n(3, 4), _n(4, 5)
    prog, grads = _grad_program("mul", {"X": x, "Y": y}, {}, ["X"])
    op = next(o for o in prog.global_block().ops if o.type == "mul_grad")
    assert op.output("Y@GRAD") == [] and op.output("X@GRAD") == ["x@GRAD"]
    w = _n(3, 5)
    for mode in ("reference", "compiled"):
        (g,) = Executor(mode=mode).run(prog, feed={"x": x, "y": y, "w": w}, fetch_list=grads,
                                       scope=Scope())
        np.testing.assert_allclose(g, w @ y.T, rtol=1e-12)


# ---- nn family ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 4), 1), ((2, 3, 4), -1), ((6,), 0)])
def test_softmax_grad(shape, axis):
    check_grad("softmax", {"X": _n(*shape)}, {"axis": axis})


@pytest.mark.parametrize("label", [np.array([[0], [4], [2], [1]]),
                                   np.array([[0], [-100], [3], [4]])])
def test_cross_entropy_grad_hard(label):
    check_grad("cross_entropy", {"X": _probs(4, 5), "Label": label}, {}, output_name="Y")


def test_cross_entropy_grad_soft_and_rank3():
    check_grad("cross_entropy", {"X": _probs(2, 3, 5), "Label": _probs(2, 3, 5)},
               {"soft_label": True}, output_name="Y")
    check_grad("cross_entropy", {"X": _probs(2, 3, 5), "Label": _labels(5, 2, 3, 1)}, {},
               output_name="Y")


@pytest.mark.parametrize("shape,attrs", [((4, 5), {}), ((2, 3, 5), {"ignore_index": 1})])
def test_cross_entropy2_grad(shape, attrs):
    check_grad("cross_entropy2", {"X": _probs(*shape), "Label": _labels(5, *shape[:-1], 1)},
               attrs, output_name="Y")


@pytest.mark.parametrize("attrs", [{}, {"ignore_index": 2}, {"axis": 1}, {"soft_label": True},
                                   {"use_softmax": False},
                                   {"use_softmax": False, "soft_label": True}])
def test_softmax_with_cross_entropy_grad(attrs):
    soft, probs_in = attrs.get("soft_label", False), not attrs.get("use_softmax", True)
    shape = (2, 5, 3) if attrs.get("axis") == 1 else (4, 5)
    logits = _probs(*shape) if probs_in else _n(*shape)
    if soft:  # Paddle's gradient assumes soft labels that sum to 1
        label = _probs(*shape)
    else:
        lshape = (2, 1, 3) if attrs.get("axis") == 1 else (4, 1)
        label = _labels(5, *lshape)
        if "ignore_index" in attrs:
            label[0, 0] = 2
    check_grad("softmax_with_cross_entropy", {"Logits": logits, "Label": label}, attrs,
               ["Logits"], output_name="Loss")


@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
@pytest.mark.parametrize("is_test", [False, True])
def test_dropout_grad_with_fixed_seed(impl, is_test):
    # fix_seed makes the mask the same in every run, so finite differences see one function
    check_grad("dropout", {"X": _n(4, 6)},
               {"dropout_prob": 0.3, "is_test": is_test, "fix_seed": True, "seed": 11,
                "dropout_implementation": impl})


def test_dropout_grad_uses_the_mask_and_scale():
    from pdjit.testing.op_test import run_op

    mask = np.array([[1, 0, 1]], np.uint8)
    g = np.array([[1.0, 2.0, 3.0]])
    for impl, scale in (("downgrade_in_infer", 1.0), ("upscale_in_train", 1 / 0.75)):
        got = run_op("dropout_grad", {"Mask": mask, "Out@GRAD": g},
                     {"dropout_prob": 0.25, "dropout_implementation": impl},
                     outputs={"X@GRAD": 1})["X@GRAD"]
        np.testing.assert_allclose(got, g * mask * scale)


@pytest.mark.parametrize("ids,padding_idx", [(np.array([[0, 2], [2, 3]]), -1),
                                             (np.array([0, 2, 2, 1, 1, 3]), 1)])
def test_lookup_table_v2_grad(ids, padding_idx):
    got = check_grad("lookup_table_v2", {"Ids": ids, "W": _n(4, 3)}, {"padding_idx": padding_idx},
                     ["W"])
    if padding_idx >= 0:
        assert not got["W"][padding_idx].any()


def test_grad_op_slots_follow_paddle():
    slots = {  # Paddle 3.3.1's grad op inputs and outputs
        "mul_grad": ({"X", "Y", "Out@GRAD"}, {"X@GRAD", "Y@GRAD"}),
        "matmul_grad": ({"X", "Y", "Out@GRAD"}, {"X@GRAD", "Y@GRAD"}),
        "matmul_v2_grad": ({"X", "Y", "Out@GRAD"}, {"X@GRAD", "Y@GRAD"}),
        "softmax_grad": ({"Out", "Out@GRAD"}, {"X@GRAD"}),
        "cross_entropy_grad": ({"X", "Label", "Y@GRAD"}, {"X@GRAD"}),
        "cross_entropy_grad2": ({"XShape", "Label", "MatchX", "Y@GRAD"}, {"X@GRAD"}),
        "softmax_with_cross_entropy_grad": ({"Label", "Softmax", "Loss@GRAD"},
                                            {"Logits@GRAD"}),
        "dropout_grad": ({"Mask", "Out@GRAD"}, {"X@GRAD"}),
        "lookup_table_v2_grad": ({"W", "Ids", "Out@GRAD"}, {"W@GRAD"}),
    }
    for op, (ins, outs) in slots.items():
        d = registry.get(op)
        assert {s.name for s in d.inputs} == ins, op
        assert {s.name for s in d.outputs} == outs and all(s.dispensable for s in d.outputs), op
        assert d.grad is None and d.has(registry.OPAQUE)
    for fwd in ("mul", "matmul", "matmul_v2", "softmax", "cross_entropy", "cross_entropy2",
                "softmax_with_cross_entropy", "dropout", "lookup_table_v2"):
        assert callable(registry.get(fwd).grad) and \
            registry.get(fwd).grad is not registry.NO_GRAD_YET, fwd
    assert registry.get("accuracy").grad is None


def test_bad_out_grad_shape_is_a_clear_error():
    from pdjit.framework.errors import OpRunError
    from pdjit.testing.op_test import run_op

    with pytest.raises(OpRunError, match=r"Out@GRAD must have the forward output's shape: "
                                         r"expected \[3, 5\], got \[2, 5\]"):
        run_op("mul_grad", {"X": _n(3, 4), "Y": _n(4, 5), "Out@GRAD": _n(2, 5)},
               outputs={"X@GRAD": 1})
