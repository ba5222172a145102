"""The program model: blocks, variables, ops, printing, cloning, build-time errors."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import registry
from pdjit.framework.errors import OpShapeError, ProgramError, UnregisteredOpError


def test_blocks_nest_and_lookups_fall_back_to_ancestors(fresh_programs):
    main, _ = fresh_programs
    gb = main.global_block()
    x = gb.create_var(name="x", shape=[-1, 4], dtype="float32")
    b1 = main._create_block()
    assert main.current_block() is b1 and b1.parent_idx == 0 and b1.idx == 1
    b1.create_var(name="inner", shape=[4], dtype="float32")
    b2 = main._create_block()
    assert b2.parent_idx == 1
    assert b2._find_var_recursive("x") is x
    assert b2._find_var_recursive("inner") is b1.var("inner")
    assert gb._find_var_recursive("inner") is None
    with pytest.raises(ProgramError, match="'inner' is not in block 0"):
        gb.var("inner")
    main._rollback()
    main._rollback()
    assert main.current_block() is gb
    assert main.num_blocks == 3
    assert [v.name for v in main.list_vars()] == ["x", "inner"]
    with pytest.raises(ProgramError, match="block index 7 out of range"):
        main.block(7)


def test_variable_properties_and_producing_op(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3, 5], dtype="float32")
    assert (x.name, x.shape, x.dtype, x.lod_level, x.persistable, x.stop_gradient) == \
        ("x", (-1, 3, 5), np.float32, 0, False, True)
    assert x.op is None
    y = fluid.layers.relu(x)
    assert y.op.type == "relu" and y.op.input("X") == ["x"] and y.shape == (-1, 3, 5)
    seq = fluid.layers.data(name="seq", shape=[1], dtype="int64", lod_level=1)
    assert seq.lod_level == 1 and seq.dtype == np.int64


def test_parameters_and_unique_names(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data(name="x", shape=[4], dtype="float32")
    h = fluid.layers.create_parameter([4, 2], "float32", name="w")
    assert isinstance(h, fluid.Parameter) and h.persistable and h.desc.is_parameter
    assert [p.name for p in main.all_parameters()] == ["w"]
    # the startup program holds the parameter and its initialiser
    assert startup.global_block().has_var("w")
    assert startup.global_block().ops[-1].output("Out") == ["w"]
    with fluid.unique_name.guard():
        assert fluid.unique_name.generate("fc") == "fc_0"
        assert fluid.unique_name.generate("fc") == "fc_1"
    with fluid.unique_name.guard():
        assert fluid.unique_name.generate("fc") == "fc_0"
    assert x.name == "x"


def test_program_guard_restores_defaults():
    before = fluid.default_main_program()
    p, s = fluid.Program(), fluid.Program()
    with fluid.program_guard(p, s):
        assert fluid.default_main_program() is p and fluid.default_startup_program() is s
    assert fluid.default_main_program() is before
    with pytest.raises(TypeError, match="must be a Program"):
        with fluid.program_guard("not a program"):
            pass


def test_to_string_is_the_seed_dump(fresh_programs):
    """Seed 004 prints blocks/vars/ops as protobuf text: idx, parent_idx, type, dims..."""
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[1], dtype="float32")
    fluid.layers.scale(x, scale=2.0)
    text = main.to_string(True)
    for piece in ["blocks {", "idx: 0", "parent_idx: -1", 'name: "x"', "type: LOD_TENSOR",
                  "data_type: FP32", "dims: -1", "dims: 1", "persistable: false",
                  'type: "scale"', 'parameter: "X"', 'arguments: "x"', 'name: "scale"']:
        assert piece in text, piece
    readable = str(main)
    assert "var x : LOD_TENSOR.shape[-1, 1].dtype(float32)" in readable
    assert "scale(inputs={X=['x']}" in readable


def test_op_records_callstack_and_role(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[2], dtype="float32")
    y = fluid.layers.tanh(x)  # the line recorded below
    op = y.op
    assert op.attr("op_role") == registry.OP_ROLE_FORWARD
    loc = op.location()
    assert loc is not None and loc.endswith(f"test_program.py:{_line_of('fluid.layers.tanh(x)')}")
    assert any("test_program.py" in frame for frame in op.attr("op_callstack"))


def _line_of(snippet):
    import inspect

    lines = inspect.getsource(test_op_records_callstack_and_role).splitlines()
    start = inspect.getsourcelines(test_op_records_callstack_and_role)[1]
    return start + next(i for i, line in enumerate(lines) if snippet in line)


def test_build_time_errors_name_the_op_and_the_user_line(fresh_programs):
    main, _ = fresh_programs
    gb = main.global_block()
    x = fluid.layers.data(name="x", shape=[2, 3, 4], dtype="float32", append_batch_size=False)
    y = fluid.layers.data(name="y", shape=[5], dtype="float32", append_batch_size=False)
    n_ops = len(gb.ops)
    with pytest.raises(OpShapeError) as e:
        fluid.layers.elementwise_add(x, y, axis=1)
    msg = str(e.value)
    assert "op 'elementwise_add'" in msg and "block 0" in msg and "test_program.py:" in msg
    assert "[2, 3, 4]" in msg and "[5]" in msg
    assert len(gb.ops) == n_ops  # a refused op leaves the block as it was
    out = gb.create_var(name="o")
    with pytest.raises(OpShapeError, match="has no input slot 'Z'"):
        gb.append_op("relu", inputs={"Z": x}, outputs={"Out": out})
    with pytest.raises(OpShapeError, match="input 'X' is required"):
        gb.append_op("relu", inputs={}, outputs={"Out": out})
    with pytest.raises(OpShapeError, match="unknown attribute 'alpah'"):
        gb.append_op("leaky_relu", inputs={"X": x}, outputs={"Out": out}, attrs={"alpah": 0.1})
    with pytest.raises(OpShapeError, match="attribute 'alpha': expected FLOAT"):
        gb.append_op("leaky_relu", inputs={"X": x}, outputs={"Out": out}, attrs={"alpha": "big"})
    with pytest.raises(OpShapeError, match="variable 'nope' is not defined"):
        gb.append_op("relu", inputs={"X": "nope"}, outputs={"Out": out})
    with pytest.raises(OpShapeError, match="takes one variable, got 2"):
        gb.append_op("relu", inputs={"X": [x, y]}, outputs={"Out": out})
    with pytest.raises(OpShapeError, match="expected dtype"):
        ints = gb.create_var(name="i", shape=[3], dtype="int64")
        gb.append_op("tanh", inputs={"X": ints}, outputs={"Out": out})
    with pytest.raises(UnregisteredOpError, match="'no_such_op' is not registered"):
        gb.append_op("no_such_op", inputs={"X": x}, outputs={"Out": out})
    with pytest.raises(TypeError, match="relu: argument 'x' must be a Variable"):
        fluid.layers.relu(np.ones(3))
    assert len(gb.ops) == n_ops


def test_unregistered_op_loads_prints_and_fails_to_run_by_name():
    p = fluid.Program()
    gb = p.global_block()
    x = gb.create_var(name="x", shape=[2], dtype="float32")
    gb.create_var(name="y", shape=[2], dtype="float32")
    gb.append_op("relu", inputs={"X": x}, outputs={"Out": "y"})
    data = bytearray(p.serialize_to_string())
    data = bytes(data.replace(b"relu", b"rel0"))  # an op type pdjit does not know
    loaded = fluid.Program.parse_from_string(data)
    assert loaded.global_block().ops[0].type == "rel0"
    assert 'type: "rel0"' in loaded.to_string(True) and "rel0(" in str(loaded)
    with pytest.raises(UnregisteredOpError, match=r"op 'rel0' \(block 0, op #0\).*not registered"):
        fluid.Executor().run(loaded, feed={"x": np.ones(2, np.float32)}, fetch_list=["y"],
                             scope=fluid.Scope())


def test_parse_rejects_garbage():
    with pytest.raises(ProgramError, match="cannot parse a ProgramDesc"):
        fluid.Program.parse_from_string(b"\xff\xff\xff garbage")


def test_serialize_round_trip_and_versions(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    v0 = main.version
    y = fluid.layers.sigmoid(x)
    assert main.version > v0
    data = main.serialize_to_string()
    again = fluid.Program.parse_from_string(data)
    assert again.serialize_to_string() == data
    assert again.global_block().var(y.name).op.type == "sigmoid"
    v1 = main.version
    main.serialize_to_string()
    assert main.version == v1  # reading does not change the program


def test_written_names_follow_every_change(fresh_programs):
    """``Program.written_names``: the outputs of the ops of every block, as the program is
    now (found again after an op is added, an output renamed, an op removed)."""
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.fc(x, size=2)
    w = main.global_block().all_parameters()[0].name
    assert y.name in main.written_names() and w not in main.written_names()
    assert x.name not in main.written_names()
    block = main.global_block()
    op = block.append_op(type="scale", inputs={"X": [y]}, outputs={"Out": [w]},
                         attrs={"scale": 2.0})
    assert w in main.written_names()
    op._rename_output(w, x.name)
    assert w not in main.written_names() and x.name in main.written_names()
    block._remove_op(len(block.ops) - 1)
    assert x.name not in main.written_names() and y.name in main.written_names()


def test_clone_for_test_drops_backward_and_sets_is_test(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.relu(x)
    gb = main.global_block()
    with main._op_role_guard(registry.OP_ROLE_BACKWARD):
        gb.append_op("scale", inputs={"X": y}, outputs={"Out": gb.create_var(name="g")})
    with main._op_role_guard(registry.OP_ROLE_OPTIMIZE):
        gb.append_op("scale", inputs={"X": y}, outputs={"Out": gb.create_var(name="u")})
    clone = main.clone()
    assert [op.type for op in clone.global_block().ops] == ["relu", "scale", "scale"]
    test = main.clone(for_test=True)
    assert [op.type for op in test.global_block().ops] == ["relu"]
    assert len(main.global_block().ops) == 3  # the original is untouched
    main.random_seed = 7
    assert main.clone().random_seed == 7


def test_variable_operators_build_ops(fresh_programs):
    main, _ = fresh_programs
    x = fluid.layers.data(name="x", shape=[2], dtype="float32")
    y = fluid.layers.data(name="y", shape=[2], dtype="float32")
    exprs = {"add": x + y, "radd": 1.5 + x, "sub": x - 2.0, "rsub": 3.0 - x, "mul": x * y,
             "rmul": 2.0 * x, "div": x / 4.0, "rdiv": 1.0 / y, "pow": x ** 2, "neg": -x,
             "lt": x < y, "le": x <= 1.0, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}
    xv = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    yv = np.array([[2.0, -2.0], [0.25, 1.0]], np.float32)
    got = fluid.Executor().run(main, feed={"x": xv, "y": yv}, fetch_list=list(exprs.values()),
                               scope=fluid.Scope())
    want = {"add": xv + yv, "radd": 1.5 + xv, "sub": xv - 2, "rsub": 3 - xv, "mul": xv * yv,
            "rmul": 2 * xv, "div": xv / 4, "rdiv": 1 / yv, "pow": xv ** 2, "neg": -xv,
            "lt": xv < yv, "le": xv <= 1, "gt": xv > yv, "ge": xv >= yv, "eq": xv == yv,
            "ne": xv != yv}
    for (k, w), g in zip(want.items(), got):
        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=k)
        assert g.dtype == np.asarray(w).dtype, k
    with pytest.raises(TypeError, match="truth value of Variable"):
        bool(x < y)
    assert {x: 1}[x] == 1  # Variables stay hashable by identity
