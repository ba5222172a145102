"""Fluid 1.x ``IfElse`` (split_lod_tensor / conditional blocks / merge_lod_tensor): the issue's
two-branch classifier against NumPy with the weights read back from the scope."""
import numpy as np
import pytest

import pdjit as fluid

L = fluid.layers
MODES = ["reference", "compiled"]


def _build():
    image = L.data(name="image", shape=[784], dtype="float32")
    label = L.data(name="label", shape=[1], dtype="int64")
    limit = L.fill_constant_batch_size_like(input=label, dtype="int64", shape=[-1, 1], value=5.0)
    cond = L.less_than(x=label, y=limit)
    ie = L.IfElse(cond)
    with ie.true_block():
        true_image = ie.input(image)
        hidden = L.fc(input=true_image, size=100, act="tanh")
        prob = L.fc(input=hidden, size=10, act="softmax")
        ie.output(prob)
    with ie.false_block():
        false_image = ie.input(image)
        hidden = L.fc(input=false_image, size=200, act="tanh")
        prob = L.fc(input=hidden, size=10, act="softmax")
        ie.output(prob)
    prob = ie()[0]
    return prob


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _numpy_ifelse(scope, image, label):
    w = {n: np.asarray(scope.find_var(n).value, np.float64)
         for n in ["fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0", "fc_2.w_0", "fc_2.b_0",
                   "fc_3.w_0", "fc_3.b_0"]}
    assert w["fc_0.w_0"].shape == (784, 100) and w["fc_2.w_0"].shape == (784, 200)
    x = image.astype(np.float64)
    t = _softmax(np.tanh(x @ w["fc_0.w_0"] + w["fc_0.b_0"]) @ w["fc_1.w_0"] + w["fc_1.b_0"])
    f = _softmax(np.tanh(x @ w["fc_2.w_0"] + w["fc_2.b_0"]) @ w["fc_3.w_0"] + w["fc_3.b_0"])
    return np.where(label < 5, t, f)  # label is [batch, 1]: broadcasts over the 10 classes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("labels", [[3, 7, 0, 9, 5, 4], [0, 1, 4], [5, 9, 6, 8], [2], [7]],
                         ids=["mixed", "all-true", "all-false", "one-true", "one-false"])
def test_issue_ifelse_program_matches_numpy(mode, labels, fresh_programs):
    main, startup = fresh_programs
    prob = _build()
    scope = fluid.Scope()
    exe = fluid.Executor(mode=mode)
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(len(labels))
    image = rng.uniform(-1, 1, (len(labels), 784)).astype(np.float32)
    label = np.array(labels, np.int64).reshape(-1, 1)
    (got,) = exe.run(main, feed={"image": image, "label": label}, fetch_list=[prob],
                     scope=scope)
    assert got.shape == (len(labels), 10) and got.dtype == np.float32
    np.testing.assert_allclose(got, _numpy_ifelse(scope, image, label), rtol=1e-4, atol=1e-6)


def test_ifelse_program_structure(fresh_programs):
    main, _ = fresh_programs
    _build()
    types = [op.type for op in main.global_block().ops]
    assert types.count("split_lod_tensor") == 1  # image is split once, shared by both blocks
    assert types.count("conditional_block") == 2 and types[-1] == "merge_lod_tensor"
    for op in main.global_block().ops:
        if op.type == "conditional_block":
            assert op.attr("is_scalar_condition") is False
            assert len(op.output("Out")) == 1  # the branch's output, assigned outside


@pytest.mark.parametrize("mode", MODES)
def test_ifelse_several_outputs_and_one_sided(mode, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[-1, 2], dtype="float64", append_batch_size=False)
    c = L.data(name="c", shape=[-1, 1], dtype="bool", append_batch_size=False)
    ie = L.IfElse(c)
    with ie.true_block():
        a = ie.input(x)
        ie.output(a * 2.0, a + 1.0)
    with ie.false_block():
        b = ie.input(x)
        ie.output(b * -1.0, b - 1.0)
    o1, o2 = ie()
    ie2 = L.IfElse(c)
    with ie2.true_block():
        ie2.output(ie2.input(x) * 10.0)
    (only_true,) = ie2()
    xv = np.arange(10, dtype=np.float64).reshape(5, 2)
    cv = np.array([[True], [False], [False], [True], [True]])
    g1, g2, g3 = _run(mode, main, {"x": xv, "c": cv}, [o1, o2, only_true])
    np.testing.assert_allclose(g1, np.where(cv, xv * 2, -xv))
    np.testing.assert_allclose(g2, np.where(cv, xv + 1, xv - 1))
    np.testing.assert_allclose(g3, xv[cv[:, 0]] * 10)  # unmerged: the true rows only


def _run(mode, main, feed, fetch):
    return fluid.Executor(mode=mode).run(main, feed=feed, fetch_list=fetch, scope=fluid.Scope())


def test_ifelse_misuse_is_refused(fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[-1, 2], dtype="float64", append_batch_size=False)
    c = L.data(name="c", shape=[-1, 1], dtype="bool", append_batch_size=False)
    with pytest.raises(TypeError, match="bool"):
        L.IfElse(x)
    ie = L.IfElse(c)
    with pytest.raises(ValueError, match="inside true_block"):
        ie.input(x)
    with pytest.raises(ValueError, match="output\\(\\) in true_block"):
        ie()
    with ie.true_block():
        ie.output(ie.input(x), ie.input(x))
        with pytest.raises(ValueError, match="outside"):
            ie()
    with ie.false_block():
        ie.output(ie.input(x))
    with pytest.raises(ValueError, match="different numbers"):
        ie()


@pytest.mark.parametrize("mode", MODES)
def test_split_and_merge_lod_tensor_ops(mode, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[-1, 3], dtype="float32", append_batch_size=False)
    m = L.data(name="m", shape=[-1, 1], dtype="bool", append_batch_size=False)
    t, f = L.split_lod_tensor(x, m)
    merged = L.merge_lod_tensor(t * 2.0, f, m, m)
    xv = np.arange(12, dtype=np.float32).reshape(4, 3)
    for mv in ([1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]):
        mask = np.array(mv, bool).reshape(-1, 1)
        gt, gf, gm = _run(mode, main, {"x": xv, "m": mask}, [t, f, merged])
        np.testing.assert_array_equal(gt, xv[mask[:, 0]])
        np.testing.assert_array_equal(gf, xv[~mask[:, 0]])
        np.testing.assert_array_equal(gm, np.where(mask, xv * 2, xv))
    with pytest.raises(fluid.OpRunError, match="split_lod_tensor.*Mask has 3 elements"):
        _run(mode, main, {"x": xv, "m": np.ones((3, 1), bool)}, [t])


def _lod_program(lod_level, level):
    x = L.data(name="x", shape=[-1, 2], dtype="float32", append_batch_size=False,
               lod_level=lod_level)
    m = L.data(name="m", shape=[-1, 1], dtype="bool", append_batch_size=False)
    t, f = L.split_lod_tensor(x, m, level=level)
    merged = L.merge_lod_tensor(t, f, x, m, level=level)
    return t, f, merged


@pytest.mark.parametrize("mode", MODES)
def test_split_merge_whole_sequences_of_a_lod_tensor(mode, fresh_programs):
    """Fluid 1.x: with a LoD, the mask has one value per sequence and whole sequences move."""
    main, _ = fresh_programs
    t, f, merged = _lod_program(1, 0)
    xv = np.arange(12, dtype=np.float32).reshape(6, 2)
    x = fluid.LoDTensor(xv, [[0, 2, 3, 6]])
    mask = np.array([[True], [False], [True]])
    exe = fluid.Executor(mode=mode)
    gt, gf, gm = exe.run(main, feed={"x": x, "m": mask}, fetch_list=[t, f, merged],
                         scope=fluid.Scope(), return_numpy=False)
    np.testing.assert_array_equal(np.array(gt), xv[[0, 1, 3, 4, 5]])
    assert gt.lod() == [[0, 2, 5]]
    np.testing.assert_array_equal(np.array(gf), xv[[2]])
    assert gf.lod() == [[0, 1]]
    np.testing.assert_array_equal(np.array(gm), xv)
    assert gm.lod() == [[0, 2, 3, 6]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", [0, 1])
def test_split_merge_two_level_lod(mode, level, fresh_programs):
    main, _ = fresh_programs
    t, f, merged = _lod_program(2, level)
    xv = np.arange(8, dtype=np.float32).reshape(4, 2)
    lod = [[0, 2, 3], [0, 1, 3, 4]]  # 2 outer sequences of 2 and 1 inner ones; rows 1, 2, 1
    if level == 0:
        mask = np.array([[False], [True]])
        want_t, want_t_lod = xv[[3]], [[0, 1], [0, 1]]
        want_f, want_f_lod = xv[[0, 1, 2]], [[0, 2], [0, 1, 3]]
    else:
        mask = np.array([[True], [False], [True]])
        want_t, want_t_lod = xv[[0, 3]], [[0, 1, 2]]
        want_f, want_f_lod = xv[[1, 2]], [[0, 2]]
    gt, gf, gm = fluid.Executor(mode=mode).run(
        main, feed={"x": fluid.LoDTensor(xv, lod), "m": mask}, fetch_list=[t, f, merged],
        scope=fluid.Scope(), return_numpy=False)
    np.testing.assert_array_equal(np.array(gt), want_t)
    np.testing.assert_array_equal(np.array(gf), want_f)
    assert (gt.lod(), gf.lod()) == (want_t_lod, want_f_lod)
    np.testing.assert_array_equal(np.array(gm), xv)
    assert gm.lod() == lod


@pytest.mark.parametrize("mode", MODES)
def test_ifelse_inside_a_while_loop(mode, fresh_programs):
    """Each iteration halves the positive rows and adds 3 to the others (a per-row branch)."""
    main, _ = fresh_programs
    x = L.data(name="x", shape=[-1, 2], dtype="float64", append_batch_size=False)
    n = L.data(name="n", shape=[1], dtype="int64", append_batch_size=False)
    zero = L.fill_constant([1], "float64", 0.0)

    def body(i, v):
        c = L.greater_than(L.reduce_sum(v, dim=1, keep_dim=True), zero)
        ie = L.IfElse(c)
        with ie.true_block():
            ie.output(ie.input(v) * 0.5)
        with ie.false_block():
            ie.output(ie.input(v) + 3.0)
        return [i + 1, ie()[0]]

    _, out = L.while_loop(lambda i, v: L.less_than(i, n), body,
                          [L.fill_constant([1], "int64", 0), x])
    xv = np.array([[1.0, 2.0], [-4.0, 0.5], [-9.0, -9.0]])
    for nv in (0, 1, 4):
        (got,) = _run(mode, main, {"x": xv, "n": np.array([nv], np.int64)}, [out])
        want = xv.copy()
        for _ in range(nv):
            pos = want.sum(axis=1, keepdims=True) > 0
            want = np.where(pos, want * 0.5, want + 3.0)
        np.testing.assert_allclose(got, want)
