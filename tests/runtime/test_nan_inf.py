"""NaN/Inf checking (``PDJIT_CHECK_NAN_INF=1``, ``FLAGS_check_nan_inf=1``): a run stops at the
first op whose output holds NaN or Inf, naming the op, the variable and the counts (counted here
with NumPy from the feeds), in both executor modes; compiled plans run native code (strict mode,
plan step kinds) and pinpoint the op inside a fused step; the Scope is unchanged after a stopped
run; runs without NaN/Inf give the same results with the check on."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import NanInfError, OpRunError

L = fluid.layers
MODES = ["reference", "compiled"]
HERE = __file__.rsplit("/", 1)[-1]


@pytest.fixture
def check_on(monkeypatch):
    monkeypatch.setenv("PDJIT_CHECK_NAN_INF", "1")
    monkeypatch.delenv("FLAGS_check_nan_inf", raising=False)


def _op_index(block, op_type):
    (idx,) = [i for i, op in enumerate(block.ops) if op.type == op_type]
    return idx


def _native_steps(exe):
    return [s for _, plan in exe._plans.values() for s in plan.walk() if s.kind != "reference"]


def _chain(main):
    """``out = exp(sqrt(relu(x) - 1) * 0.5)``: one fused native step in compiled mode; sqrt
    makes NaN where relu(x) < 1, exp makes Inf where sqrt(...) * 0.5 > 88.7 (float32)."""
    x = L.data("x", [4], dtype="float32")
    r = L.relu(x)
    s = L.sqrt(r - 1.0)
    return x, L.exp(s * 0.5)


def _counts(a):
    return int(np.isnan(a).sum()), int(np.isinf(a).sum())


@pytest.mark.parametrize("mode", MODES)
def test_first_op_with_nan_is_named_with_counts(mode, check_on, fresh_programs):
    main, _ = fresh_programs
    x, out = _chain(main)
    xv = np.array([[0.5, 2.0, -3.0, 5.0], [1.0, 0.25, 10.0, 3.0]], np.float32)
    exe = fluid.Executor(mode=mode, strict=True)
    with pytest.raises(NanInfError) as info:
        exe.run(main, feed={"x": xv}, fetch_list=[out])
    e = info.value
    sqrt_in = np.maximum(xv, 0) - np.float32(1)
    with np.errstate(invalid="ignore"):
        want_nan, want_inf = _counts(np.sqrt(sqrt_in))
    assert (want_nan, want_inf) == (3, 0)
    sqrt_op = main.global_block().ops[_op_index(main.global_block(), "sqrt")]
    assert isinstance(e, OpRunError)
    assert (e.op_type, e.block_idx, e.op_idx) == ("sqrt", 0, _op_index(main.global_block(),
                                                                          "sqrt"))
    assert (e.var_name, e.nan_count, e.inf_count) == (sqrt_op.output("Out")[0], 3, 0)
    msg = str(e)
    assert "op 'sqrt' (block 0, op #" in msg and HERE in msg
    assert f"variable {sqrt_op.output('Out')[0]!r}" in msg
    assert "holds 3 NaN and 0 Inf of 8 values" in msg
    if mode == "compiled":  # the fused step ran natively, then its references pinpointed sqrt
        steps = _native_steps(exe)
        assert steps and all(s.fallbacks == 0 for s in steps)
        assert any("sqrt" in s.description and "exp" in s.description for s in steps)


@pytest.mark.parametrize("mode", MODES)
def test_inf_is_counted_and_a_clean_run_is_unaffected(mode, check_on, fresh_programs):
    main, _ = fresh_programs
    x, out = _chain(main)
    exe = fluid.Executor(mode=mode, strict=True)
    clean = np.array([[1.0, 2.0, 5.0, 9.0]], np.float32)
    (got,) = exe.run(main, feed={"x": clean}, fetch_list=[out])
    np.testing.assert_allclose(got, np.exp(np.sqrt(clean - 1) * 0.5), rtol=1e-6)
    big = np.array([[1.0, 1e5, 2.0, 4e4]], np.float32)  # sqrt: 316, 200 -> exp(158), exp(100)
    with pytest.raises(NanInfError) as info:
        exe.run(main, feed={"x": big}, fetch_list=[out])
    with np.errstate(over="ignore"):
        want = _counts(np.exp(np.sqrt(big - np.float32(1)) * np.float32(0.5)))
    assert want == (0, 2)
    e = info.value
    assert (e.op_type, e.var_name, e.nan_count, e.inf_count) == ("exp", out.name, 0, 2)
    assert "holds 0 NaN and 2 Inf of 4 values" in str(e)
    if mode == "compiled":
        assert _native_steps(exe)


@pytest.mark.parametrize("mode", MODES)
def test_off_by_default_and_paddle_flag_turns_it_on(mode, monkeypatch, fresh_programs):
    main, _ = fresh_programs
    x, out = _chain(main)
    xv = np.array([[0.5, 2.0, -3.0, 5.0]], np.float32)
    monkeypatch.delenv("PDJIT_CHECK_NAN_INF", raising=False)
    monkeypatch.delenv("FLAGS_check_nan_inf", raising=False)
    (got,) = fluid.Executor(mode=mode).run(main, feed={"x": xv}, fetch_list=[out])
    assert np.isnan(got).sum() == 2
    monkeypatch.setenv("FLAGS_check_nan_inf", "1")
    exe = fluid.Executor(mode=mode)
    assert exe.checks.nan_inf
    with pytest.raises(NanInfError, match="op 'sqrt'"):
        exe.run(main, feed={"x": xv}, fetch_list=[out])
    monkeypatch.setenv("FLAGS_check_nan_inf", "maybe")
    with pytest.raises(ValueError, match="FLAGS_check_nan_inf='maybe': expected 0 or 1"):
        fluid.Executor(mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_stopped_training_run_leaves_the_scope_unchanged(mode, check_on, fresh_programs):
    main, startup = fresh_programs
    x = L.data("x", [4], dtype="float32")
    h = L.fc(x, 3, bias_attr=False)
    loss = L.mean(L.log(h))  # log of a negative activation: NaN before the SGD update
    fluid.optimizer.SGD(0.1).minimize(loss)
    scope = fluid.Scope()
    exe = fluid.Executor(mode=mode, strict=True)
    exe.run(startup, scope=scope)
    (w_name,) = [p.name for p in main.all_parameters()]
    w0 = np.array(scope.find_var(w_name).get_tensor())
    xv = np.array([[1, 1, 1, 1], [-1, -1, -1, -1]], np.float32)  # rows of h: s and -s
    with pytest.raises(NanInfError) as info:
        exe.run(main, feed={"x": xv}, fetch_list=[loss], scope=scope)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = _counts(np.log(xv @ w0))
    assert want == (3, 0)
    e = info.value
    assert (e.op_type, e.nan_count, e.inf_count) == ("log", *want)
    np.testing.assert_array_equal(np.array(scope.find_var(w_name).get_tensor()), w0)
    if mode == "compiled":
        assert _native_steps(exe)


@pytest.mark.parametrize("mode", MODES)
def test_nan_inside_a_while_body_names_the_sub_block_op(mode, check_on, fresh_programs):
    main, _ = fresh_programs
    x = L.data("x", [3], dtype="float32", append_batch_size=False)
    i = L.fill_constant([1], "int64", 0)
    n = L.fill_constant([1], "int64", 4)
    c = L.less_than(i, n)
    loop = L.While(c)
    with loop.block():
        L.assign(L.sqrt(x - 1.0), x)  # 5 -> 2 -> 1 -> 0 -> sqrt(-1): NaN in the 4th iteration
        L.increment(i, 1.0, in_place=True)
        L.less_than(i, n, cond=c)
    exe = fluid.Executor(mode=mode, strict=True)
    with pytest.raises(NanInfError) as info:
        exe.run(main, feed={"x": np.array([5.0, 2.0, 10.0], np.float32)}, fetch_list=[x])
    e = info.value
    body = main.block(1)
    assert (e.op_type, e.block_idx, e.op_idx) == ("sqrt", 1, _op_index(body, "sqrt"))
    v = np.array([5.0, 2.0, 10.0], np.float32)
    with np.errstate(invalid="ignore"):
        while not np.isnan(v).any():  # the iteration that first makes NaN stops the run
            v = np.sqrt(v - np.float32(1))
    assert (e.nan_count, e.inf_count) == _counts(v) == (1, 0)
    assert "op 'sqrt' (block 1, op #" in str(e)
    if mode == "compiled":  # the loop ran as native code, then was pinpointed
        assert any(s.kind == "native_loop" for s in _native_steps(exe))


@pytest.mark.parametrize("mode", MODES)
def test_nan_in_a_cond_branch_is_named_and_the_parameter_kept(mode, check_on, fresh_programs):
    main, startup = fresh_programs
    x = L.data("x", [4], dtype="float32")
    s = L.data("s", [1], dtype="float32", append_batch_size=False)
    w = L.create_parameter([4], "float32", name="w_nan_cond",
                           default_initializer=fluid.initializer.Constant(1.0))

    def true_fn():
        L.assign(w + 1.0, w)  # a persistable written in the branch before the NaN
        return L.sqrt(x - 1.0)

    out = L.cond(L.less_than(s, L.fill_constant([1], "float32", 0.0)), true_fn, lambda: x)
    scope = fluid.Scope()
    exe = fluid.Executor(mode=mode, strict=True)
    exe.run(startup, scope=scope)
    xv = np.array([[0.5, 2.0, -3.0, 5.0]], np.float32)
    (got,) = exe.run(main, feed={"x": xv, "s": np.array([1.0], np.float32)}, fetch_list=[out],
                     scope=scope)  # the other branch: no NaN
    np.testing.assert_array_equal(got, xv)
    with pytest.raises(NanInfError) as info:
        exe.run(main, feed={"x": xv, "s": np.array([-1.0], np.float32)}, fetch_list=[out],
                scope=scope)
    e = info.value
    with np.errstate(invalid="ignore"):
        assert _counts(np.sqrt(xv - np.float32(1))) == (2, 0)
    assert (e.op_type, e.block_idx, e.nan_count, e.inf_count) == ("sqrt", 1, 2, 0)
    assert e.op_idx == _op_index(main.block(1), "sqrt")
    np.testing.assert_array_equal(scope.find_var("w_nan_cond").value, np.ones(4, np.float32))
    if mode == "compiled":  # the branch's plan ran sqrt natively before it was pinpointed
        assert any("sqrt" in s.description and s.fallbacks == 0 for s in _native_steps(exe))


@pytest.mark.parametrize("mode", MODES)
def test_inf_made_and_consumed_inside_one_fused_kernel_is_caught(mode, check_on,
                                                                 fresh_programs):
    """``tanh(exp(x))``: exp makes Inf, tanh makes it 1 again inside one fused loop; both
    executors stop at exp, as the reference checks every op's output."""
    main, _ = fresh_programs
    x = L.data("x", [2], dtype="float32")
    out = L.tanh(L.exp(x))
    exe = fluid.Executor(mode=mode, strict=True)
    xv = np.array([[0.5, 100.0]], np.float32)  # exp(100) is Inf in float32
    with pytest.raises(NanInfError, match="op 'exp'") as e:
        exe.run(main, feed={"x": xv}, fetch_list=[out], scope=fluid.Scope())
    assert (e.value.nan_count, e.value.inf_count) == (0, 1)
    fine = np.array([[0.5, 1.0]], np.float32)
    got, = exe.run(main, feed={"x": fine}, fetch_list=[out], scope=fluid.Scope())
    np.testing.assert_allclose(got, np.tanh(np.exp(fine)), rtol=1e-6)
    if mode == "compiled":
        assert _native_steps(exe)
