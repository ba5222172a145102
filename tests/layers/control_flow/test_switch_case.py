"""``Switch``, ``case`` and ``switch_case`` against plain Python, in both executor modes."""
import numpy as np
import pytest

import pdjit as fluid

L = fluid.layers
MODES = ["reference", "compiled"]


def _run(mode, main, feed, fetch, scope=None):
    return fluid.Executor(mode=mode).run(main, feed=feed, fetch_list=fetch,
                                         scope=scope or fluid.Scope())


@pytest.mark.parametrize("mode", MODES)
def test_switch_piecewise_learning_rate(mode, fresh_programs):
    """The Fluid idiom: a global variable set by the first case that holds."""
    main, _ = fresh_programs
    step = L.data(name="step", shape=[1], dtype="float32", append_batch_size=False)
    lr = L.create_global_var(shape=[1], value=0.0, dtype="float32", persistable=True,
                             name="lr_switch")
    b1 = L.fill_constant([1], "float32", 10.0)
    b2 = L.fill_constant([1], "float32", 20.0)
    with L.Switch() as switch:
        with switch.case(L.less_than(step, b1)):
            L.fill_constant([1], "float32", 1.0, out=lr)
        with switch.case(L.less_than(step, b2)):
            L.assign(step * 0.1, lr)
        with switch.default():
            L.fill_constant([1], "float32", 0.01, out=lr)
    for sv in (0.0, 9.5, 10.0, 15.0, 20.0, 100.0):
        (got,) = _run(mode, main, {"step": np.array([sv], np.float32)}, [lr])
        want = 1.0 if sv < 10 else (sv * 0.1 if sv < 20 else 0.01)
        np.testing.assert_allclose(got, [want], rtol=1e-6)


def test_switch_misuse(fresh_programs):
    main, _ = fresh_programs
    c = L.data(name="c", shape=[1], dtype="bool", append_batch_size=False)
    s = L.Switch()
    with pytest.raises(ValueError, match="inside"):
        s.case(c)
    with s:
        with pytest.raises(ValueError, match="at least one case"):
            s.default()
        with pytest.raises(TypeError, match="bool"):
            s.case(L.cast(c, "float32"))


@pytest.mark.parametrize("mode", MODES)
def test_case_first_true_predicate_wins(mode, fresh_programs):
    main, _ = fresh_programs
    x = L.data(name="x", shape=[1], dtype="float32", append_batch_size=False)
    zero = L.fill_constant([1], "float32", 0.0)
    one = L.fill_constant([1], "float32", 1.0)
    out = L.case([(L.less_than(x, zero), lambda: x * -1.0),
                  (L.less_than(x, one), lambda: x + 100.0)],
                 default=lambda: x * 0.0)
    out_no_default = L.case([(L.less_than(x, zero), lambda: x * -1.0),
                             (L.less_than(x, one), lambda: x + 100.0)])
    for xv in (-3.0, 0.5, 4.0):
        got, got2 = _run(mode, main, {"x": np.array([xv], np.float32)}, [out, out_no_default])
        want = -xv if xv < 0 else (xv + 100 if xv < 1 else 0.0)
        want2 = -xv if xv < 0 else xv + 100  # without default, the last fn is the default
        np.testing.assert_allclose(got, [want])
        np.testing.assert_allclose(got2, [want2])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_switch_case_list_dict_and_default(mode, dtype, fresh_programs):
    main, _ = fresh_programs
    idx = L.data(name="idx", shape=[1], dtype=dtype, append_batch_size=False)
    x = L.data(name="x", shape=[3], dtype="float32", append_batch_size=False)
    by_list = L.switch_case(idx, [lambda: x + 1.0, lambda: x * 2.0, lambda: x - 5.0])
    by_dict = L.switch_case(idx, {3: lambda: x * 3.0, 1: lambda: x * 10.0},
                            default=lambda: x * 0.0)
    by_pairs = L.switch_case(idx, [(2, lambda: x * 7.0), (0, lambda: x * -1.0)])
    xv = np.array([1.0, 2.0, 3.0], np.float32)
    fns_list = {0: xv + 1, 1: xv * 2, 2: xv - 5}
    for k in (0, 1, 2, 3, 9):
        a, b, c = _run(mode, main, {"idx": np.array([k], dtype), "x": xv},
                       [by_list, by_dict, by_pairs])
        np.testing.assert_allclose(a, fns_list.get(k, xv - 5))  # default: the largest key
        np.testing.assert_allclose(b, {3: xv * 3, 1: xv * 10}.get(k, xv * 0))
        np.testing.assert_allclose(c, {0: -xv}.get(k, xv * 7))


def test_switch_case_and_case_argument_errors(fresh_programs):
    main, _ = fresh_programs
    idx = L.data(name="idx", shape=[1], dtype="int64", append_batch_size=False)
    f = L.data(name="f", shape=[1], dtype="float32", append_batch_size=False)
    with pytest.raises(TypeError, match="int64"):
        L.switch_case(f, [lambda: f])
    with pytest.raises(ValueError, match="more than once"):
        L.switch_case(idx, [(1, lambda: f), (1, lambda: f)])
    with pytest.raises(TypeError, match="ints"):
        L.switch_case(idx, [("a", lambda: f)])
    with pytest.raises(TypeError, match="default must be callable"):
        L.switch_case(idx, [lambda: f], default=3)
    with pytest.raises(TypeError, match=r"\(pred, fn\) tuple"):
        L.case([L.less_than(f, f)])
    with pytest.raises(TypeError, match="bool"):
        L.case([(f, lambda: f)])
