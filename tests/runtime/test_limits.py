"""The allocation limit (``PDJIT_MAX_ALLOC_BYTES``, by default the machine's available memory): an
op output that would exceed it is refused before anything is allocated, with an error naming the
op, the variable, the shape, the bytes and the limit, in both executor modes; a stopped run
leaves the Scope unchanged; outputs within the limit run as before (NumPy oracles)."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import AllocationLimitError, OpRunError
from pdjit.layers import LayerHelper
from pdjit.proto import framework_pb2 as pb
from pdjit.runtime import checks

L = fluid.layers
MODES = ["reference", "compiled"]
HERE = __file__.rsplit("/", 1)[-1]
BIG = 10 ** 9


@pytest.fixture
def default_limit(monkeypatch):
    monkeypatch.delenv("PDJIT_MAX_ALLOC_BYTES", raising=False)


def _broadcast(main):
    x = L.data("x", [-1, 1], dtype="float32", append_batch_size=False)
    y = L.data("y", [1, -1], dtype="float32", append_batch_size=False)
    z = L.elementwise_add(x, y)
    return z, L.reduce_sum(z)


def _feed(n):
    return {"x": np.arange(n, dtype=np.float32).reshape(n, 1),
            "y": np.ones((1, n), np.float32)}


def _kinds(exe):
    return [s.kind for _, plan in exe._plans.values() for s in plan.walk()]


def _check(e, op_type, var, shape, nbytes, limit):
    assert isinstance(e, OpRunError) and isinstance(e, MemoryError)
    assert (e.op_type, e.var_name, e.shape, e.nbytes, e.limit) == \
        (op_type, var, tuple(shape), nbytes, limit)
    msg = str(e)
    assert f"op '{op_type}' (block 0, op #" in msg and HERE in msg
    assert f"variable {var!r}) of shape {list(shape)} and dtype float32 would take {nbytes} " \
           f"bytes" in msg
    assert f"than the limit of {limit} bytes" in msg and "PDJIT_MAX_ALLOC_BYTES" in msg


@pytest.mark.parametrize("mode", MODES)
def test_fill_constant_too_large_is_refused_before_anything_runs(mode, default_limit,
                                                                 fresh_programs):
    main, _ = fresh_programs
    ok = L.create_global_var([2], 1.0, "float32", persistable=True, name="kept")
    L.assign(L.fill_constant([2], "float32", 7.0), ok)  # would change the Scope if it ran
    big = L.fill_constant([BIG, BIG], "float32", 1.0)
    scope = fluid.Scope()
    scope.var("kept").get_tensor().set(np.array([1.0, 1.0], np.float32), fluid.CPUPlace())
    exe = fluid.Executor(mode=mode, strict=True)
    with pytest.raises(AllocationLimitError) as info:
        exe.run(main, fetch_list=[big], scope=scope)
    limit = checks.available_memory()
    e = info.value
    assert 0 < e.limit and abs(e.limit - limit) < 2 ** 30  # the available memory, when made
    _check(e, "fill_constant", big.name, [BIG, BIG], BIG * BIG * 4, e.limit)
    np.testing.assert_array_equal(np.array(scope.find_var("kept").get_tensor()), [1.0, 1.0])


@pytest.mark.parametrize("mode", MODES)
def test_random_op_with_a_huge_shape(mode, monkeypatch, fresh_programs):
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", str(1 << 30))
    main, _ = fresh_programs
    helper = LayerHelper("uniform_random")
    out = helper.create_variable_for_type_inference("float32")
    helper.append_op(type="uniform_random", inputs={}, outputs={"Out": [out]},
                     attrs={"shape": [1 << 20, 1 << 20], "dtype": pb.VarType.FP32, "min": -1.0,
                            "max": 1.0, "seed": 0})
    with pytest.raises(AllocationLimitError) as info:
        fluid.Executor(mode=mode, strict=True).run(main, fetch_list=[out])
    _check(info.value, "uniform_random", out.name, [1 << 20, 1 << 20], 4 << 40, 1 << 30)


@pytest.mark.parametrize("mode", MODES)
def test_fed_broadcast_that_explodes(mode, default_limit, fresh_programs):
    """[N, 1] + [1, N] with N = 200000: 160 GB, refused under the default limit before the
    native step (or the reference) allocates it; small feeds still run."""
    main, _ = fresh_programs
    z, s = _broadcast(main)
    exe = fluid.Executor(mode=mode, strict=True)
    got_z, got_s = exe.run(main, feed=_feed(3), fetch_list=[z, s])
    want = np.arange(3, dtype=np.float32)[:, None] + np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(got_z, want)
    assert got_s == want.sum()
    n = 200_000
    with pytest.raises(AllocationLimitError) as info:
        exe.run(main, feed=_feed(n), fetch_list=[s])
    _check(info.value, "elementwise_add", z.name, [n, n], n * n * 4, info.value.limit)
    if mode == "compiled":  # the guard of the native step refused it
        assert set(_kinds(exe)) == {"native"}


@pytest.mark.parametrize("mode", MODES)
def test_limit_from_the_environment_per_feed_shape(mode, monkeypatch, fresh_programs):
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", "4096")  # 1024 float32
    main, _ = fresh_programs
    z, s = _broadcast(main)
    exe = fluid.Executor(mode=mode, strict=True)
    assert exe.checks.limit == 4096
    for n in (32, 33, 16, 33):  # 32 * 32 * 4 = 4096 fits; 33 * 33 * 4 does not
        if n * n * 4 <= 4096:
            (got,) = exe.run(main, feed=_feed(n), fetch_list=[s])
            assert got == np.float32(n * (n - 1) / 2 * n + n * n)
            continue
        with pytest.raises(AllocationLimitError) as info:
            exe.run(main, feed=_feed(n), fetch_list=[s])
        _check(info.value, "elementwise_add", z.name, [n, n], n * n * 4, 4096)
    if mode == "compiled":
        assert set(_kinds(exe)) == {"native"}
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", "0")  # no limit
    (got,) = fluid.Executor(mode=mode, strict=True).run(main, feed=_feed(33), fetch_list=[s])
    assert got == np.float32(33 * 32 / 2 * 33 + 33 * 33)


@pytest.mark.parametrize("mode", MODES)
def test_stopped_training_run_leaves_parameters_unchanged(mode, monkeypatch, fresh_programs):
    """An SGD step followed by a broadcast the feeds make too large: the run stops, the updated
    parameter never reaches the Scope."""
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", "4096")
    main, startup = fresh_programs
    x = L.data("x", [-1, 1], dtype="float32", append_batch_size=False)
    y = L.data("y", [1, -1], dtype="float32", append_batch_size=False)
    loss = L.mean(L.fc(x, 2))
    fluid.optimizer.SGD(0.5).minimize(loss)
    z = L.elementwise_add(x, y)
    scope = fluid.Scope()
    exe = fluid.Executor(mode=mode, strict=True)
    exe.run(startup, scope=scope)
    names = [p.name for p in main.all_parameters()]
    before = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
    with pytest.raises(AllocationLimitError) as info:
        exe.run(main, feed=_feed(64), fetch_list=[loss, z], scope=scope)
    assert (info.value.op_type, info.value.var_name) == ("elementwise_add", z.name)
    for n in names:
        np.testing.assert_array_equal(np.array(scope.find_var(n).get_tensor()), before[n])
    exe.run(main, feed=_feed(4), fetch_list=[loss, z], scope=scope)  # fits: the update lands
    w = [n for n in names if before[n].ndim == 2][0]
    np.testing.assert_allclose(np.array(scope.find_var(w).get_tensor()),
                               before[w] - 0.5 * np.arange(4).mean() / 2, rtol=1e-6)


def test_bad_limit_values_are_named(monkeypatch):
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", "lots")
    with pytest.raises(ValueError, match="PDJIT_MAX_ALLOC_BYTES='lots': expected a number"):
        fluid.Executor()
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", "-5")
    with pytest.raises(ValueError, match="PDJIT_MAX_ALLOC_BYTES='-5': expected a number"):
        fluid.Executor()
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", "1e6")
    assert fluid.Executor().checks.limit == 10 ** 6
