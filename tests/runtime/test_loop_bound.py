"""A ``while`` whose condition never turns false ends at ``PDJIT_MAX_LOOP_ITERATIONS`` (bounded
by default) with the same ``LoopLimitError`` in the reference interpreter and in a loop compiled
as one native function, and the Scope keeps what it held before the run."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import limits
from pdjit.framework.errors import LoopLimitError
from pdjit.proto import framework_pb2 as pb

L = fluid.layers


def _loops():
    """(counted, endless, fetch names, the startup program): ``acc`` (persistable, 0) and x
    (fed) grow by 1 each iteration of ``while i < 3``; in ``endless`` the body's ``i + 1``
    is never carried back into ``i``."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
        acc = L.create_global_var([1], 0.0, "float32", persistable=True, name="acc")
        i = L.fill_constant([1], "int64", 0)
        n = L.fill_constant([1], "int64", 3)
        cond = L.less_than(i, n)
        loop = L.While(cond)
        with loop.block():
            L.assign(x + 1.0, x)
            L.assign(acc + 1.0, acc)
            L.increment(i, 1.0, in_place=True)
            L.less_than(i, n, cond=cond)
    desc = pb.ProgramDesc.FromString(main.serialize_to_string())
    body = desc.blocks[1]
    kept = [op for op in body.ops if op.type != "increment"]
    del body.ops[:]
    body.ops.extend(kept)
    endless = fluid.Program.parse_from_string(desc.SerializeToString())
    return main, endless, [x.name, acc.name], startup


def test_the_bound_is_on_by_default(monkeypatch):
    monkeypatch.delenv(limits.MAX_LOOP_ITERATIONS[0], raising=False)
    assert limits.bound(limits.MAX_LOOP_ITERATIONS) == 100_000


def test_endless_loop_is_the_same_error_in_both_modes_and_the_scope_is_kept(monkeypatch):
    monkeypatch.setenv(limits.MAX_LOOP_ITERATIONS[0], "40")
    counted, endless, fetch, startup = _loops()
    x0 = np.zeros(2, np.float32)
    errors = []
    for mode in ("reference", "compiled"):
        scope = fluid.Scope()
        exe = fluid.Executor(mode=mode, strict=mode == "compiled")
        exe.run(startup, scope=scope)
        x, acc = exe.run(counted, feed={"x": x0}, fetch_list=fetch, scope=scope)
        np.testing.assert_array_equal(x, x0 + 3)
        np.testing.assert_array_equal(np.ravel(acc), [3.0])
        if mode == "compiled":  # the loop ran as one native function
            (_, plan), = [v for v in exe._plans.values() if v[1].block_idx == 0][-1:]
            assert "native_loop" in [s.kind for s in plan.steps]
        with pytest.raises(LoopLimitError) as e:
            exe.run(endless, feed={"x": x0}, fetch_list=fetch, scope=scope)
        errors.append(str(e.value))
        # nothing of the failed run reached the Scope: acc is what the counted run left
        np.testing.assert_array_equal(np.ravel(np.asarray(scope.find_var("acc").value)), [3.0])
        if mode == "compiled":
            (loop,) = [s for _, p in exe._plans.values() for s in p.steps
                       if s.kind == "native_loop" and s.op.block.program is endless]
            assert loop.fallbacks == 0  # the native loop raised it, not a rerun of the loop
    assert errors[0] == errors[1], errors
    assert errors[0].startswith("op 'while' (block 0, op #")
    assert "test_loop_bound.py" in errors[0]
    assert "after 40 iterations, the bound PDJIT_MAX_LOOP_ITERATIONS=40" in errors[0]


def test_a_loop_writing_a_value_before_it_has_one_agrees_between_modes():
    """A variable the body writes before reading it, and no op before the loop writes: the
    native loop takes arrays only, so the loop op's reference runs it (not a fallback: strict
    mode accepts it), with the values of reference mode."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
        y = main.global_block().create_var(name="y", shape=[2], dtype="float32")
        i = L.fill_constant([1], "int64", 0)
        n = L.fill_constant([1], "int64", 3)
        cond = L.less_than(i, n)
        loop = L.While(cond)
        with loop.block():
            L.assign(x * 2.0, y)
            L.assign(y + 1.0, x)
            L.increment(i, 1.0, in_place=True)
            L.less_than(i, n, cond=cond)
    x0 = np.array([1.0, -2.0], np.float32)
    want_x, want_y = x0.copy(), None
    for _ in range(3):
        want_y = want_x * 2
        want_x = want_y + 1
    for mode in ("reference", "compiled"):
        exe = fluid.Executor(mode=mode, strict=mode == "compiled")
        got_x, got_y = exe.run(main, feed={"x": x0}, fetch_list=[x, y], scope=fluid.Scope())
        np.testing.assert_allclose(got_x, want_x)
        np.testing.assert_allclose(got_y, want_y)
