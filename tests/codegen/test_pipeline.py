"""The compile pipeline (``pdjit.codegen.pipeline``): its stages dumped by name in order, and
the plan description it yields as plain data: native segments with their compiled drivers and
facts the generator set (``calls_blas``, ``group_lines``), host ops with their ``ControlFlow``
declaration and sub-blocks. Oracles: the programs written here (which ops, which block) and
NumPy."""
import numpy as np

import pdjit as fluid
from pdjit.codegen import pipeline
from pdjit.framework import registry


def _program():
    """h = relu(x @ w + b) (a GEMM); y = relu(x) * 2 (elementwise only)."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [4])
        h = fluid.layers.fc(x, 3, act="relu")
        y = fluid.layers.scale(fluid.layers.relu(x), 2.0)
    return main, startup, x, h, y


def test_the_stages_dump_in_order_and_the_description_is_data(monkeypatch, capsys):
    monkeypatch.setenv("PDJIT_DUMP_AFTER", ",".join(pipeline.STAGES))
    main, startup, x, h, y = _program()
    desc = pipeline.compile_block(main, fetch_names=[h.name], memory_optim=True)
    err = capsys.readouterr().err
    dumped = [line.split("after pass ", 1)[1].split(" ")[0] for line in err.splitlines()
              if "after pass " in line]
    assert dumped == list(pipeline.STAGES)
    assert "== memory plan: segment 0 ==" in err
    assert isinstance(desc, pipeline.PlanDescription) and desc.block_idx == 0
    (step,) = desc.steps  # y is not fetched: pruned
    assert step.kind == "native" and isinstance(step, pipeline.NativeSegment)
    assert [op.type for op, _ in step.ops] == ["mul", "elementwise_add", "relu"]
    assert step.outputs == [h.name] and step.args[0] == "x" and step.batch_arg == 0
    assert step.compiled.calls_blas  # the fc's product is a GEMM: set by the generator
    assert step.native is None and step.build_native is None  # native_drivers=False
    assert (step.compiled.name, step.compiled.text) in desc.sources
    # where each group begins, as the generator recorded it through the memory plan's
    # rewrite (read here from the driver's "# group" comments)
    lines = step.compiled.source.splitlines()
    assert step.compiled.group_lines == \
        [k + 1 for k, line in enumerate(lines) if line.lstrip().startswith("# group ")]
    assert len(step.compiled.group_lines) == len(step.groups)
    monkeypatch.delenv("PDJIT_DUMP_AFTER")
    (only,) = pipeline.compile_block(main, fetch_names=[y.name]).steps
    assert [op.type for op, _ in only.ops] == ["relu", "scale"]
    assert not only.compiled.calls_blas  # elementwise loops only
    # the description's host driver is what the plan calls: NumPy's answer
    xv = np.random.default_rng(0).standard_normal((2, 4)).astype("float32")
    (got,) = only.compiled.fn(xv)
    np.testing.assert_allclose(got, np.maximum(xv, 0) * 2, rtol=1e-6)


def test_native_drivers_are_built_with_the_plan_or_when_hot():
    main, startup, x, h, y = _program()
    infer = main.clone(for_test=True)
    (now,) = pipeline.compile_block(infer, fetch_names=[h.name], native_drivers=True).steps
    assert now.native is not None and now.build_native is None
    assert now.split() == ((0,), "")  # x's rows are the batch's: the step may run on slices
    (later,) = pipeline.compile_block(infer, fetch_names=[h.name],
                                      native_drivers="auto").steps
    assert later.native is None and callable(later.build_native)


def test_a_control_flow_op_is_a_host_op_with_its_declaration():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        i = fluid.layers.fill_constant([1], "int64", 0)
        n = fluid.layers.fill_constant([1], "int64", 3)
        cond = fluid.layers.less_than(i, n)
        loop = fluid.layers.While(cond)
        with loop.block():
            fluid.layers.increment(i, in_place=True)
            fluid.layers.less_than(i, n, cond=cond)
    desc = pipeline.compile_block(main, fetch_names=[i.name])
    kinds = [s.kind for s in desc.steps]
    assert "native_loop" in kinds  # the body is one lowerable segment
    (lp,) = [s for s in desc.steps if s.kind == "native_loop"]
    assert lp.op.type == "while" and lp.body == 1 and lp.control.kind == registry.LOOP
    assert lp.args == lp.loop.args and lp.ops == [(lp.op, lp.op_idx)]
    desc = pipeline.compile_block(main, fetch_names=[i.name], run_native_loops=False)
    (host,) = [s for s in desc.steps if s.kind == "reference"]
    assert host.op.type == "while" and host.sub_blocks == (1,)
    assert host.control is registry.get("while").control
    assert "native_loops=False" in host.why
