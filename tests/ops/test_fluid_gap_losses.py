"""Fluid 1.8's ranking/recommendation losses (``pdjit.ops.loss_rank``) and the losses Fluid
composes from layers (``pdjit.layers.losses``): outputs against NumPy written here, gradients
against finite differences, native code asserted in compiled mode."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError, LayerTypeError, PdjitError
from pdjit.runtime.executor import Executor
from pdjit.runtime.scope import Scope
from pdjit.testing import build_op_program, check_output
from pdjit.testing.grad_check import check_grad
from pdjit.testing.op_test import assert_native
from pdjit.testing.program_grad import check_program_grad

# many of the ops these tests build run their NumPy reference as a plan step by design (no
# native lowering: they are declared reference-only); a compiled plan says so once per
# process
pytestmark = pytest.mark.filterwarnings(
    "ignore::pdjit.framework.errors.ReferenceStepWarning")

RNG = np.random.default_rng(5)
LEFT = RNG.normal(size=(5, 1))
RIGHT = RNG.normal(size=(5, 1))


def softplus(z):
    return np.log1p(np.exp(z))


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def native(op_type, inputs, attrs=None):
    prog, feed, outs = build_op_program(op_type, inputs, attrs or {})
    exe = Executor(mode="compiled", strict=True)
    got = exe.run(prog, feed=feed, fetch_list=[v for vs in outs.values() for v in vs],
                  scope=Scope())
    assert_native(exe, op_type)
    return dict(zip(outs, got))


def test_rank_loss():
    lab = np.array([[1.0], [0.0], [0.5], [1.0], [0.0]])
    o = LEFT - RIGHT
    want = softplus(o) - lab * o
    ins = {"Label": lab, "Left": LEFT, "Right": RIGHT}
    check_output("rank_loss", ins, expected={"Out": want})
    got = native("rank_loss", {k: v.astype(np.float32) for k, v in ins.items()})["Out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    check_grad("rank_loss", ins, inputs_to_check=("Left", "Right"))


def test_margin_rank_loss():
    lab = np.array([[1.0], [-1.0], [1.0], [-1.0], [1.0]])
    ins = {"X1": LEFT, "X2": RIGHT, "Label": lab}
    want = np.maximum(0.0, 0.25 - lab * (LEFT - RIGHT))
    assert (want > 0).any() and (want == 0).any()
    check_output("margin_rank_loss", ins, {"margin": 0.25},
                 {"Out": want, "Activated": (want > 0).astype(np.float64)})
    assert native("margin_rank_loss", ins, {"margin": 0.25})["Out"].shape == (5, 1)
    check_grad("margin_rank_loss", ins, {"margin": 0.25}, inputs_to_check=("X1", "X2"))


def test_teacher_student_sigmoid_loss():
    x = np.array([[-3.0], [-0.5], [0.2], [1.4], [2.5], [20.0]])
    lab = np.array([[-2.0], [-1.0], [0.3], [1.6], [0.0], [1.0]])
    sp = softplus(x)
    want = np.where(lab < -1, sp, np.where(lab < 0, sp - x, 2 * sp - x * lab))
    # a teacher value z' with click z: the sum of the two sigmoid cross entropies
    z, zt = 1.0, 0.6
    assert np.isclose(want[3, 0], (sp[3, 0] - x[3, 0] * z) + (sp[3, 0] - x[3, 0] * zt))
    check_output("teacher_student_sigmoid_loss", {"X": x, "Label": lab}, expected={"Y": want})
    native("teacher_student_sigmoid_loss", {"X": x, "Label": lab})
    # inside the soft-max bounds the gradient is the derivative
    check_grad("teacher_student_sigmoid_loss", {"X": x[:5], "Label": lab[:5]},
               output_name="Y")
    # beyond them, 0 (Fluid's choice)
    grads = check_grad("teacher_student_sigmoid_loss",
                       {"X": np.array([[0.5], [3.0]]), "Label": np.array([[-1.0], [0.5]])},
                       {"soft_max_up_bound": 2.0}, output_name="Y", modes=["compiled"],
                       max_relative_error=1e9, atol=1e9)
    assert grads["X"][1, 0] == 0.0 and grads["X"][0, 0] != 0.0


def test_bpr_loss():
    x = RNG.normal(size=(4, 5))
    lab = np.array([[0], [4], [2], [2]], np.int64)
    want = np.array([[np.mean([softplus(x[i, j] - x[i, lab[i, 0]]) for j in range(5)
                               if j != lab[i, 0]])] for i in range(4)])
    check_output("bpr_loss", {"X": x, "Label": lab}, expected={"Y": want})
    got = native("bpr_loss", {"X": x.astype(np.float32), "Label": lab})["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    check_grad("bpr_loss", {"X": x, "Label": lab}, output_name="Y")
    with pytest.raises(PdjitError, match=r"label 7 out of range \[0, 5\)"):
        check_output("bpr_loss", {"X": x, "Label": lab + 7 - lab.max()}, modes=["reference"])


def _layers_program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        a = fluid.data("a", [4, 3], "float64")
        p = fluid.data("p", [4, 3], "float64")
        cls = fluid.data("cls", [4], "int64")
        prob = fluid.data("prob", [4, 2, 3], "float64")
        seg = fluid.data("seg", [4, 2, 1], "int64")
        onehot = fluid.data("onehot", [4, 3], "float64")
        prior = fluid.data("prior", [1, 3], "float64")
        outs = [fluid.layers.npair_loss(a, p, cls, l2_reg=0.01),
                fluid.layers.mse_loss(a, p),
                fluid.layers.dice_loss(prob, seg, epsilon=1e-3),
                fluid.layers.label_smooth(onehot, epsilon=0.2, dtype="float64"),
                fluid.layers.label_smooth(onehot, prior_dist=prior, epsilon=0.2)]
    return main, outs


def _np_npair(a, p, cls, l2_reg):
    same = (cls[:, None] == cls[None, :]).astype(np.float64)
    t = same / same.sum(1, keepdims=True)
    l2 = 0.25 * l2_reg * ((a ** 2).sum(1).mean() + (p ** 2).sum(1).mean())
    s = a @ p.T
    logp = s - np.log(np.exp(s).sum(1, keepdims=True))
    ce_rows = -(t * logp).sum(1, keepdims=True)      # soft-label cross entropy of each row
    return l2 + (t * ce_rows).sum(0).mean()


def test_composed_losses_against_numpy():
    main, outs = _layers_program()
    a, p = RNG.normal(size=(4, 3)), RNG.normal(size=(4, 3))
    cls = np.array([0, 1, 0, 2], np.int64)
    prob = RNG.uniform(0.1, 0.9, size=(4, 2, 3))
    seg = RNG.integers(0, 3, size=(4, 2, 1)).astype(np.int64)
    onehot = np.eye(3)[[0, 2, 1, 1]]
    prior = np.array([[0.5, 0.3, 0.2]])
    feed = dict(a=a, p=p, cls=cls, prob=prob, seg=seg, onehot=onehot, prior=prior)
    oh = np.eye(3)[seg[..., 0]]
    inter = (prob * oh).sum((1, 2))
    dice = (1 - 2 * inter / (prob.sum((1, 2)) + oh.sum((1, 2)) + 1e-3)).mean()
    want = [_np_npair(a, p, cls, 0.01), ((a - p) ** 2).mean(), dice,
            0.8 * onehot + 0.2 / 3, 0.8 * onehot + 0.2 * prior]
    for mode in ("compiled", "reference"):
        exe = Executor(mode=mode)
        got = exe.run(main, feed=feed, fetch_list=outs, scope=Scope())
        if mode == "compiled":
            assert_native(exe, "composed losses")
        for g, w, name in zip(got, want, ["npair", "mse", "dice", "smooth", "smooth prior"]):
            # rtol: l2_reg, epsilon and the smoothing weights are float32 attributes (as in Fluid)
            np.testing.assert_allclose(np.asarray(g).reshape(np.shape(w)), w, rtol=1e-6,
                                       err_msg=f"{name} [{mode}]")


def test_npair_loss_gradient_and_errors():
    cls = np.array([0, 1, 0], np.int64)

    def build():
        a = fluid.data("a", [3, 2], "float64")
        p = fluid.data("p", [3, 2], "float64")
        a.stop_gradient = p.stop_gradient = False
        return fluid.layers.npair_loss(a, p, fluid.data("cls", [3], "int64")), [a, p]

    check_program_grad(build, {"a": RNG.normal(size=(3, 2)), "p": RNG.normal(size=(3, 2)),
                               "cls": cls})
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        a = fluid.data("a", [-1, 2], "float32")
        with pytest.raises(LayerInputError, match=r"npair_loss: the batch size"):
            fluid.layers.npair_loss(a, a, fluid.data("c", [-1], "int64"))
        with pytest.raises(LayerTypeError, match=r"bpr_loss: .*label"):
            fluid.layers.bpr_loss(a, fluid.data("l", [-1, 1], "float32"))
        with pytest.raises(LayerInputError, match=r"rank_loss: argument 'right' must have"):
            fluid.layers.rank_loss(a, a, fluid.data("r", [-1, 3], "float32"))


def np_hsigmoid(x, w, b, label, num_classes, table=None, code=None):
    """Fluid's loss: softplus(z) - bit * z over the path, log 2 per unused PreOut position."""
    width = table.shape[1] if table is not None else (num_classes - 1).bit_length()
    out = np.zeros((x.shape[0], 1))
    for i in range(x.shape[0]):
        if table is None:
            c = int(label[i, 0]) + num_classes
            path = [((c >> (j + 1)) - 1, (c >> j) & 1) for j in range(c.bit_length() - 1)]
        else:
            path = []
            for node, bit in zip(table[i], code[i]):
                if node < 0:
                    break
                path.append((node, bit))
        for node, bit in path:
            z = float(np.clip(x[i] @ w[node] + (b[node, 0] if b is not None else 0), -40, 40))
            out[i, 0] += np.log1p(np.exp(z)) - bit * z
        out[i, 0] += (width - len(path)) * np.log(2)
    return out


def test_hsigmoid_default_and_custom_tree():
    x = RNG.normal(size=(4, 3))
    w = RNG.normal(size=(5, 3))
    b = RNG.normal(size=(5, 1))
    lab = np.array([[0], [5], [2], [3]], np.int64)
    ins = {"X": x, "W": w, "Label": lab, "Bias": b}
    check_output("hierarchical_sigmoid", ins, {"num_classes": 6},
                 {"Out": np_hsigmoid(x, w, b, lab, 6)})
    check_grad("hierarchical_sigmoid", ins, {"num_classes": 6},
               inputs_to_check=("X", "W", "Bias"))
    table = np.array([[0, 2, -1], [1, -1, -1], [0, 3, 4], [2, 1, -1]], np.int64)
    code = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 1], [1, 1, 0]], np.int64)
    ins_c = {"X": x, "W": w, "Label": lab, "PathTable": table, "PathCode": code}
    check_output("hierarchical_sigmoid", ins_c, {"num_classes": 5},
                 {"Out": np_hsigmoid(x, w, None, lab, 5, table, code)})
    check_grad("hierarchical_sigmoid", ins_c, {"num_classes": 5}, inputs_to_check=("X", "W"))


def test_hsigmoid_layer_trains():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 4], "float32")
        y = fluid.data("y", [-1, 1], "int64")
        loss = fluid.layers.mean(fluid.layers.hsigmoid(fluid.layers.fc(x, 8), y, 10))
        fluid.optimizer.SGD(0.5).minimize(loss)
        with pytest.raises(LayerInputError, match=r"hsigmoid: a custom tree needs"):
            fluid.layers.hsigmoid(x, y, 10, is_custom=True)
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    feed = {"x": RNG.normal(size=(6, 4)).astype(np.float32),
            "y": RNG.integers(0, 10, size=(6, 1)).astype(np.int64)}
    ls = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
                .reshape(-1)[0]) for _ in range(5)]
    assert ls[-1] < ls[0]


def test_nce_with_fixed_negatives_and_grad():
    x = RNG.normal(size=(3, 4))
    w = RNG.normal(size=(6, 4))
    b = RNG.normal(size=(6, 1))
    lab = np.array([[1], [4], [0]], np.int64)
    sw = np.array([[1.0], [0.5], [2.0]])
    attrs = {"num_total_classes": 6, "num_neg_samples": 2, "custom_neg_classes": [3, 5]}
    want = np.zeros((3, 1))
    for i in range(3):
        for j, c in enumerate([lab[i, 0], 3, 5]):
            o = 1 / (1 + np.exp(-(x[i] @ w[c] + b[c, 0])))
            q = 2 * (1 / 6)
            want[i, 0] += -np.log(o / (o + q)) if j == 0 else -np.log(q / (o + q))
        want[i, 0] *= sw[i, 0]
    ins = {"Input": x, "Label": lab, "Weight": w, "Bias": b, "SampleWeight": sw}
    got = check_output("nce", ins, attrs, {"Cost": want})
    np.testing.assert_array_equal(got["SampleLabels"], [[1, 3, 5], [4, 3, 5], [0, 3, 5]])
    check_grad("nce", ins, attrs, inputs_to_check=("Input", "Weight", "Bias"),
               output_name="Cost")


def test_nce_layer_samples_and_trains():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 4], "float32")
        y = fluid.data("y", [-1, 1], "int64")
        cost = fluid.layers.nce(fluid.layers.fc(x, 8), y, num_total_classes=20,
                                num_neg_samples=4, sampler="log_uniform", seed=7)
        loss = fluid.layers.mean(cost)
        fluid.optimizer.SGD(0.5).minimize(loss)
        with pytest.raises(LayerInputError, match=r"nce: argument 'sampler'"):
            fluid.layers.nce(x, y, 20, sampler="custom_dist")
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    feed = {"x": RNG.normal(size=(6, 4)).astype(np.float32),
            "y": RNG.integers(0, 20, size=(6, 1)).astype(np.int64)}
    ls = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
                .reshape(-1)[0]) for _ in range(5)]
    assert ls[-1] < ls[0] and all(np.isfinite(ls))


def test_sigmoid_focal_loss_and_grad():
    x = RNG.normal(size=(4, 3)) * 2
    lab = np.array([[0], [2], [-1], [3]], np.int32)
    fg = np.array([2], np.int32)
    p = 1 / (1 + np.exp(-x))
    want = np.zeros((4, 3))
    for i in range(4):
        for j in range(3):
            if lab[i, 0] == -1:
                continue
            if lab[i, 0] == j + 1:
                want[i, j] = -0.25 / 2 * (1 - p[i, j]) ** 2 * np.log(p[i, j])
            else:
                want[i, j] = -0.75 / 2 * p[i, j] ** 2 * np.log(1 - p[i, j])
    ins = {"X": x, "Label": lab, "FgNum": fg}
    check_output("sigmoid_focal_loss", ins, expected={"Out": want})
    check_grad("sigmoid_focal_loss", ins)


def test_iou_similarity():
    a = np.array([[0, 0, 2, 2], [1, 1, 3, 4]], np.float64)
    b = np.array([[1, 1, 2, 2], [0, 0, 2, 2], [5, 5, 6, 6]], np.float64)
    want = np.array([[1 / 4, 1.0, 0.0], [1 / 6, 1 / (4 + 6 - 1), 0.0]])
    check_output("iou_similarity", {"X": a, "Y": b}, expected={"Out": want})
    # pixel boxes: widths count both ends
    want_px = np.array([[4 / 9, 1.0, 0.0], [4 / 12, 4 / (9 + 12 - 4), 0.0]])
    check_output("iou_similarity", {"X": a, "Y": b}, {"box_normalized": False}, {"Out": want_px})


def test_center_loss_updates_centres_and_trains():
    x = RNG.normal(size=(4, 3))
    lab = np.array([[0], [2], [0], [1]], np.int64)
    c = RNG.normal(size=(3, 3))
    rate = np.array([0.5])
    got = check_output("center_loss", {"X": x, "Label": lab, "Centers": c,
                                       "CenterUpdateRate": rate},
                       {"cluster_num": 3, "need_update": True},
                       {"Loss": 0.5 * ((x - c[lab[:, 0]]) ** 2).sum(1, keepdims=True)})
    want_c = c.copy()
    for k in range(3):
        rows = lab[:, 0] == k
        want_c[k] += 0.5 * (x[rows] - c[k]).sum(0) / (1 + rows.sum())
    np.testing.assert_allclose(got["CentersOut"], want_c, rtol=1e-12)
    check_grad("center_loss", {"X": x, "Label": lab, "Centers": c, "CenterUpdateRate": rate},
               {"cluster_num": 3}, output_name="Loss")
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        xv = fluid.data("x", [-1, 3], "float32")
        yv = fluid.data("y", [-1, 1], "int64")
        loss = fluid.layers.mean(fluid.layers.center_loss(fluid.layers.fc(xv, 3), yv, 3, 0.1,
                                                          fluid.ParamAttr(name="centers")))
        trained = [p.name for p, _ in fluid.optimizer.SGD(0.1).minimize(loss)[1]]
    assert "centers" not in trained
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    before = np.array(scope.find_var("centers").value)
    feed = {"x": x.astype(np.float32), "y": lab}
    ls = [float(np.asarray(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
                .reshape(-1)[0]) for _ in range(4)]
    assert ls[-1] < ls[0]
    assert not np.allclose(np.asarray(scope.find_var("centers").value), before)


def test_box_coder_encode_decode_round_trip():
    prior = np.array([[0.1, 0.1, 0.5, 0.6], [0.3, 0.2, 0.9, 0.7]])
    var = np.array([[0.1, 0.1, 0.2, 0.2], [0.1, 0.2, 0.2, 0.1]])
    target = np.array([[0.2, 0.2, 0.4, 0.5], [0.0, 0.3, 0.8, 0.9], [0.5, 0.5, 0.6, 0.9]])
    want = np.zeros((3, 2, 4))
    for i, (x0, y0, x1, y1) in enumerate(target):
        for j, (a0, b0, a1, b1) in enumerate(prior):
            pw, ph = a1 - a0, b1 - b0
            want[i, j] = [((x0 + x1) / 2 - (a0 + a1) / 2) / pw / var[j, 0],
                          ((y0 + y1) / 2 - (b0 + b1) / 2) / ph / var[j, 1],
                          np.log((x1 - x0) / pw) / var[j, 2], np.log((y1 - y0) / ph) / var[j, 3]]
    enc = check_output("box_coder", {"PriorBox": prior, "PriorBoxVar": var, "TargetBox": target},
                       expected={"OutputBox": want})["OutputBox"]
    # decoding the encoding gives each target back against every prior
    check_output("box_coder", {"PriorBox": prior, "PriorBoxVar": var, "TargetBox": enc},
                 {"code_type": "decode_center_size"},
                 {"OutputBox": np.repeat(target[:, None, :], 2, axis=1)})
    # pixel boxes (+1 sizes) with the variance attribute, decoded along axis 1
    px = prior * 10
    enc_px = check_output("box_coder", {"PriorBox": px, "TargetBox": target * 10},
                          {"box_normalized": False, "variance": [0.1, 0.1, 0.2, 0.2]},
                          modes=["reference"])["OutputBox"]
    back = check_output("box_coder", {"PriorBox": px[:1].repeat(3, 0), "TargetBox": enc_px[:, :1]
                                      .repeat(2, 1)},
                        {"box_normalized": False, "variance": [0.1, 0.1, 0.2, 0.2],
                         "code_type": "decode_center_size", "axis": 1}, modes=["reference"])
    # Fluid's kernel takes the centre as (x0 + x1) / 2 but the size as x1 - x0 + 1, so the
    # round trip of pixel boxes comes back half a pixel up and left
    np.testing.assert_allclose(back["OutputBox"][:, 0], target * 10 - 0.5, rtol=1e-10)


def test_prior_box_by_hand():
    feat, img = np.zeros((1, 2, 2, 3)), np.zeros((1, 3, 8, 12))
    attrs = {"min_sizes": [2.0], "max_sizes": [4.0], "aspect_ratios": [2.0], "flip": True,
             "clip": True}
    # cells 4 px apart (12 / 3, 8 / 2), centres at (w + .5) * 4, (h + .5) * 4; per cell the boxes
    # of ratio 1, 2, 1/2 (min size 2), then the square of side sqrt(2 * 4)
    sizes = [(2.0, 2.0), (2 * np.sqrt(2), 2 / np.sqrt(2)), (2 / np.sqrt(2), 2 * np.sqrt(2)),
             (np.sqrt(8), np.sqrt(8))]
    want = np.zeros((2, 3, 4, 4))
    for h in range(2):
        for w in range(3):
            cx, cy = (w + 0.5) * 4, (h + 0.5) * 4
            for k, (bw, bh) in enumerate(sizes):
                want[h, w, k] = np.clip([(cx - bw / 2) / 12, (cy - bh / 2) / 8,
                                         (cx + bw / 2) / 12, (cy + bh / 2) / 8], 0, 1)
    got = check_output("prior_box", {"Input": feat, "Image": img}, attrs,
                       {"Boxes": want, "Variances": np.broadcast_to([.1, .1, .2, .2], want.shape)
                        .copy()}, rtol=1e-6)
    ordered = check_output("prior_box", {"Input": feat, "Image": img},
                           dict(attrs, min_max_aspect_ratios_order=True), modes=["reference"])
    np.testing.assert_allclose(ordered["Boxes"][:, :, [0, 2, 3, 1]], got["Boxes"], rtol=1e-6)


def test_multiclass_nms_by_hand():
    boxes = np.array([[[0.0, 0.0, 1.0, 1.0], [0.05, 0.0, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0],
                       [0.0, 0.0, 0.5, 0.5]]])
    # class 0 is background; class 1 scores box 1 > 0 (they overlap: IoU 0.95) > 3; class 2: 2
    scores = np.array([[[0.9, 0.9, 0.9, 0.9], [0.7, 0.8, 0.05, 0.6], [0.1, 0.2, 0.95, 0.01]]])
    attrs = {"score_threshold": 0.1, "nms_top_k": -1, "keep_top_k": -1, "nms_threshold": 0.5}
    want = np.array([[1, 0.8, *boxes[0, 1]], [1, 0.6, *boxes[0, 3]], [2, 0.95, *boxes[0, 2]],
                     [2, 0.2, *boxes[0, 1]]])
    check_output("multiclass_nms", {"BBoxes": boxes, "Scores": scores}, attrs,
                 {"Out": (want, [[0, 4]])})
    # keep_top_k keeps the best 2 over all classes; an image with nothing kept gives [-1]
    top = check_output("multiclass_nms", {"BBoxes": boxes, "Scores": scores},
                       dict(attrs, keep_top_k=2), modes=["reference"])
    np.testing.assert_allclose(top["Out"], want[[0, 2]])
    empty = check_output("multiclass_nms", {"BBoxes": boxes, "Scores": scores * 0.01}, attrs,
                         modes=["reference"])
    np.testing.assert_array_equal(empty["Out"], [[-1]])


def test_detection_output_composes_decode_softmax_nms():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        loc = fluid.data("loc", [1, 2, 4], "float32")
        sc = fluid.data("sc", [1, 2, 3], "float32")
        pb = fluid.data("pb", [2, 4], "float32")
        pbv = fluid.data("pbv", [2, 4], "float32")
        out = fluid.layers.detection_output(loc, sc, pb, pbv, score_threshold=0.3)
    prior = np.array([[0.0, 0.0, 0.4, 0.4], [0.5, 0.5, 1.0, 1.0]], np.float32)
    logits = np.array([[[0.0, 3.0, 0.0], [0.0, 0.0, 3.0]]], np.float32)
    got, = Executor().run(main, feed={"loc": np.zeros((1, 2, 4), np.float32), "sc": logits,
                                      "pb": prior, "pbv": np.ones((2, 4), np.float32)},
                          fetch_list=[out], scope=Scope(), return_numpy=False)
    p = np.exp(3) / (np.exp(3) + 2)          # zero offsets decode to the priors themselves
    np.testing.assert_allclose(np.asarray(got), [[1, p, *prior[0]], [2, p, *prior[1]]],
                               rtol=1e-5, atol=1e-6)
    assert got.lod() == [[0, 2]]


def test_box_clip():
    boxes = np.array([[-1.0, 2.0, 30.0, 9.0], [3.0, -4.0, 5.0, 50.0], [1.0, 1.0, 19.6, 19.6]])
    info = np.array([[10.0, 20.0, 1.0], [40.0, 40.0, 2.0]])      # images 20x10 and 20x20
    want = np.array([[0.0, 2.0, 19.0, 9.0], [3.0, 0.0, 5.0, 19.0], [1.0, 1.0, 19.0, 19.0]])
    check_output("box_clip", {"Input": (boxes, [[0, 1, 3]]), "ImInfo": info},
                 expected={"Output": (want, [[0, 1, 3]])})


def test_yolo_box_by_hand():
    x = RNG.normal(size=(1, 2 * 7, 2, 2))          # 2 anchors, 2 classes, a 2x2 grid
    x[0, 4, 0, 0] = -9.0                           # anchor 0 at cell (0, 0): confidence ~0
    img = np.array([[64, 96]], np.int32)           # height 64, width 96
    anchors = [10, 14, 23, 27]
    attrs = {"anchors": anchors, "class_num": 2, "conf_thresh": 0.01, "downsample_ratio": 16}

    def sig(v):
        return 1 / (1 + np.exp(-v))

    boxes, scores = np.zeros((1, 8, 4)), np.zeros((1, 8, 2))
    for a in range(2):
        for k in range(2):
            for c in range(2):
                t = x[0, a * 7:(a + 1) * 7, k, c]
                conf = sig(t[4])
                if conf < 0.01:
                    continue
                cx, cy = (c + sig(t[0])) * 96 / 2, (k + sig(t[1])) * 64 / 2
                bw = np.exp(t[2]) * anchors[2 * a] * 96 / 32
                bh = np.exp(t[3]) * anchors[2 * a + 1] * 64 / 32
                i = a * 4 + k * 2 + c
                boxes[0, i] = [max(cx - bw / 2, 0), max(cy - bh / 2, 0), min(cx + bw / 2, 95),
                               min(cy + bh / 2, 63)]
                scores[0, i] = conf * sig(t[5:])
    assert not boxes[0, 0].any()
    check_output("yolo_box", {"X": x, "ImgSize": img}, attrs, {"Boxes": boxes, "Scores": scores})


def test_anchor_generator_by_hand():
    feat = np.zeros((1, 1, 2, 3))
    attrs = {"anchor_sizes": [32.0, 64.0], "aspect_ratios": [0.5, 2.0], "stride": [16.0, 16.0]}
    want = np.zeros((2, 3, 4, 4))
    for h in range(2):
        for w in range(3):
            xc, yc = w * 16 + 7.5, h * 16 + 7.5
            k = 0
            for r in (0.5, 2.0):
                base_w = np.floor(np.sqrt(256 / r) + 0.5)        # 23 for 0.5, 11 for 2
                base_h = np.floor(base_w * r + 0.5)              # 12, 22
                for a in (32.0, 64.0):
                    aw, ah = a / 16 * base_w, a / 16 * base_h
                    want[h, w, k] = [xc - (aw - 1) / 2, yc - (ah - 1) / 2, xc + (aw - 1) / 2,
                                     yc + (ah - 1) / 2]
                    k += 1
    check_output("anchor_generator", {"Input": feat}, attrs,
                 {"Anchors": want, "Variances": np.broadcast_to([.1, .1, .2, .2], want.shape)
                  .copy()}, rtol=1e-6)


def test_polygon_box_transform_by_hand():
    geo = RNG.normal(size=(1, 4, 2, 3))
    want = geo.copy()
    for c in range(4):
        for h in range(2):
            for w in range(3):
                want[0, c, h, w] = (4 * w if c % 2 == 0 else 4 * h) - geo[0, c, h, w]
    check_output("polygon_box_transform", {"Input": geo}, expected={"Output": want})


def test_density_prior_box_by_hand():
    feat, img = np.zeros((1, 1, 1, 2)), np.zeros((1, 1, 8, 16))
    attrs = {"densities": [2], "fixed_sizes": [4.0], "fixed_ratios": [1.0]}
    # one row of 2 cells, steps 8 x 8: per cell a 2 x 2 grid of 4x4 boxes 4 px apart
    want = np.zeros((1, 2, 4, 4))
    for w in range(2):
        cx, cy = (w + 0.5) * 8, 4.0
        k = 0
        for di in range(2):
            for dj in range(2):
                x, y = cx - 4 + 2 + dj * 4, cy - 4 + 2 + di * 4
                want[0, w, k] = [max((x - 2) / 16, 0), max((y - 2) / 8, 0),
                                 min((x + 2) / 16, 1), min((y + 2) / 8, 1)]
                k += 1
    check_output("density_prior_box", {"Input": feat, "Image": img}, attrs, {"Boxes": want},
                 rtol=1e-6)
    flat = check_output("density_prior_box", {"Input": feat, "Image": img},
                        dict(attrs, flatten_to_2d=True), modes=["reference"])
    np.testing.assert_allclose(flat["Boxes"], want.reshape(-1, 4), rtol=1e-6)
