"""The program verifier (``pdjit.verify``): each check with its message, where it runs (programs
parsed from model files, the executor before it plans), and ``pdjit check MODEL``."""
import shutil

import numpy as np
import pytest

import pdjit as fluid
import pdjit.static
from pdjit.cli import main as cli_main
from pdjit.framework import registry
from pdjit.framework.errors import ModelFileError, ProgramError, UnregisteredOpError
from pdjit.io import inference_model as inf
from pdjit.io.tensor_stream import _Reader, read_tensor, write_tensor
from pdjit.passes import verify as verify_mod
from pdjit.proto import framework_pb2 as pb

A = pb.AttrType
VarType = pb.VarType


@pytest.fixture(scope="module")
def fc_program():
    """x[-1, 4] -> fc 3 relu: mul (op #0), elementwise_add (#1), relu (#2); with its startup."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        h = fluid.layers.fc(x, size=3, act="relu")
    return main, startup, h.name


def edited(program, change):
    """A copy of ``program`` parsed back from its ProgramDesc after ``change(desc)``."""
    desc = pb.ProgramDesc.FromString(program.serialize_to_string())
    change(desc)
    return fluid.Program.parse_from_string(desc.SerializeToString())


def op_desc(desc, op_type, block=0):
    return next(op for op in desc.blocks[block].ops if op.type == op_type)


def drop_attr(op, name):
    kept = [a for a in op.attrs if a.name != name]
    del op.attrs[:]
    op.attrs.extend(kept)


def var_desc(desc, name, block=0):
    return next(v for v in desc.blocks[block].vars if v.name == name)


def test_a_valid_program_passes_unchanged(fc_program):
    main, startup, _ = fc_program
    v = main.version
    assert fluid.verify(main) is main and main.version == v
    fluid.verify(startup)
    assert fluid.verify(fluid.CompiledProgram(main)) is main
    with pytest.raises(TypeError, match="verify: expected a Program, got str"):
        fluid.verify("main")


def test_unregistered_op(fc_program):
    p = edited(fc_program[0], lambda d: setattr(op_desc(d, "relu"), "type", "relu_v9"))
    with pytest.raises(UnregisteredOpError, match=r"op 'relu_v9' \(block 0, op #2\): op type "
                                                  r"'relu_v9' is not registered"):
        fluid.verify(p)
    fluid.verify(p, registered=False)  # inspecting such a program is fine


def test_required_slot_absent_or_empty(fc_program):
    def drop_y(d):
        op = op_desc(d, "mul")
        kept = [s for s in op.inputs if s.parameter != "Y"]
        del op.inputs[:]
        op.inputs.extend(kept)
    with pytest.raises(ProgramError, match=r"op 'mul' \(block 0, op #0\): input slot 'Y' is "
                                           r"required but absent"):
        fluid.verify(edited(fc_program[0], drop_y))

    def empty_out(d):
        del op_desc(d, "relu").outputs[0].arguments[:]
    with pytest.raises(ProgramError, match=r"op 'relu' \(block 0, op #2\): output slot 'Out' "
                                           r"is required but empty"):
        fluid.verify(edited(fc_program[0], empty_out))


def test_slot_taking_one_variable_given_two(fc_program):
    p = edited(fc_program[0], lambda d: op_desc(d, "relu").inputs[0].arguments.append("x"))
    with pytest.raises(ProgramError, match=r"op 'relu' \(block 0, op #2\): input slot 'X' takes "
                                           r"one variable, got 2"):
        fluid.verify(p)


def test_undefined_variable_and_unusable_type(fc_program):
    def ghost(d):
        op_desc(d, "relu").inputs[0].arguments[0] = "ghost"
    with pytest.raises(ProgramError, match=r"op 'relu' \(block 0, op #2\): input 'X': variable "
                                           r"'ghost' is not defined in block 0 or its ancestors"):
        fluid.verify(edited(fc_program[0], ghost))

    def holder(d):
        d.blocks[0].vars.add(name="feed", persistable=True).type.type = VarType.FEED_MINIBATCH
        op_desc(d, "relu").inputs[0].arguments[0] = "feed"
    with pytest.raises(ProgramError, match=r"op 'relu' \(block 0, op #2\): input 'X': variable "
                                           r"'feed' is a FEED_MINIBATCH .*expected a tensor"):
        fluid.verify(edited(fc_program[0], holder))


def test_attribute_of_the_wrong_type(fc_program):
    def as_float(d):
        a = next(a for a in op_desc(d, "mul").attrs if a.name == "x_num_col_dims")
        a.type, a.f = A.FLOAT, 1.0
    with pytest.raises(ProgramError, match=r"op 'mul' \(block 0, op #0\): attribute "
                                           r"'x_num_col_dims': expected INT, got FLOAT"):
        fluid.verify(edited(fc_program[0], as_float))

    def as_long(d):  # LONG holds the same values as INT: accepted
        a = next(a for a in op_desc(d, "mul").attrs if a.name == "x_num_col_dims")
        a.type, a.l = A.LONG, 1
    fluid.verify(edited(fc_program[0], as_long))


def test_missing_attribute_gets_its_default_and_the_program_runs(fc_program):
    main, startup, out = fc_program
    p = edited(main, lambda d: drop_attr(op_desc(d, "mul"), "y_num_col_dims"))
    mul = p.global_block().ops[0]
    assert not mul.has_attr("y_num_col_dims")
    v = p.version
    fluid.verify(p)
    assert mul.attr("y_num_col_dims") == 1 and mul.attr_type("y_num_col_dims") == A.INT
    assert p.version != v
    scope = fluid.Scope()
    exe = fluid.Executor(mode="reference")
    exe.run(startup, scope=scope)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    got, = exe.run(p, feed={"x": x}, fetch_list=[out], scope=scope)
    w = np.asarray(scope.find_var("fc_0.w_0").value)
    b = np.asarray(scope.find_var("fc_0.b_0").value)
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-6)


def test_unknown_extra_attributes_are_accepted(fc_program):
    def extra(d):
        op = op_desc(d, "mul")
        op.attrs.add(name="use_mkldnn", type=A.BOOLEAN, b=False)
        op.attrs.add(name="mkldnn_data_type", type=A.STRING, s="float32")
    p = edited(fc_program[0], extra)
    fluid.verify(p)
    assert p.global_block().ops[0].attr("use_mkldnn") is False


@pytest.fixture
def test_op():
    """An op of this test's own with a required attribute and declared ranges."""
    def infer(X, **_):
        return {"Out": X}
    registry.register_op(
        "verify_test_op", inputs=["X"], outputs=["Out"],
        attrs={"n": registry.Int(), "k": registry.Int(1, at_least=0, at_most=3),
               "ks": registry.Ints([1], at_least=1),
               "mode": registry.Str("a", one_of=["a", "b"])},
        infer_shape=infer, reference=lambda X, **_: {"Out": X.copy()}, emit=None, grad=None)
    yield "verify_test_op"
    registry.unregister_op("verify_test_op")


def _test_op_program(**attrs):
    p = fluid.Program()
    gb = p.global_block()
    gb.create_var(name="x", shape=[2], dtype="float32")
    gb.create_var(name="y", shape=[2], dtype="float32")
    gb.append_op("verify_test_op", inputs={"X": "x"}, outputs={"Out": "y"},
                 attrs={"n": 1, **attrs})
    return p


def test_required_attribute_and_declared_ranges(test_op):
    p = _test_op_program()
    fluid.verify(p)
    q = edited(p, lambda d: drop_attr(d.blocks[0].ops[0], "n"))
    with pytest.raises(ProgramError, match=r"op 'verify_test_op' \(block 0, op #0\): attribute "
                                           r"'n' \(INT\) is required but absent"):
        fluid.verify(q)
    for attrs, message in (({"k": 4}, r"attribute 'k': expected >= 0 and <= 3, got 4"),
                           ({"k": -1}, r"attribute 'k': expected >= 0 and <= 3, got -1"),
                           ({"ks": [2, 0]}, r"attribute 'ks': expected >= 1, got \[2, 0\]"),
                           ({"mode": "c"}, r"attribute 'mode': expected one of \['a', 'b'\], "
                                           r"got 'c'")):
        with pytest.raises(ProgramError, match=r"op 'verify_test_op' \(block 0, op #0\): "
                                               + message):
            fluid.verify(_test_op_program(**attrs))


def test_variable_dims_dtype_type_and_lod_level(fc_program):
    cases = [
        (lambda v: v.type.lod_tensor.tensor.dims.__setitem__(0, -3),
         r"block 0, variable 'x': dims \[-3, 4\]: expected every dim >= -1 .*got -3"),
        (lambda v: setattr(v.type.lod_tensor.tensor, "data_type", VarType.BF16),
         r"block 0, variable 'x': data type BF16 is not one pdjit computes with"),
        (lambda v: setattr(v.type.lod_tensor, "lod_level", 99),
         r"block 0, variable 'x': lod_level 99, expected 0..16"),
    ]
    for change, message in cases:
        with pytest.raises(ProgramError, match=message):
            fluid.verify(edited(fc_program[0], lambda d, c=change: c(var_desc(d, "x"))))


def test_names_that_are_not_utf8(fc_program):
    data = fc_program[0].serialize_to_string()
    bad = data.replace(b"fc_0.tmp_2", b"fc_0.tmp\xff2")  # a variable and the op writing it
    p = fluid.Program.parse_from_string(bad)
    with pytest.raises(ProgramError, match="is not valid UTF-8 text"):
        fluid.verify(p)


def test_required_proto_fields_are_a_parse_error(fc_program):
    def untyped(d):
        var_desc(d, "x").type.ClearField("type")
    desc = pb.ProgramDesc.FromString(fc_program[0].serialize_to_string())
    untyped(desc)
    data = desc.SerializePartialToString()
    with pytest.raises(ProgramError, match=r"required field\(s\) missing: "
                                           r"blocks\[0\]\.vars\[\d+\]\.type\.type"):
        fluid.Program.parse_from_string(data)


def _control_flow_desc(sub_block_of_1: int, parent_of_2: int = 0) -> pb.ProgramDesc:
    """Block 0 runs conditional_block(sub_block=1); block 1 one of sub_block_of_1; block 2 a
    relu."""
    d = pb.ProgramDesc()
    for i, parent in enumerate((-1, 0, parent_of_2)):
        d.blocks.add(idx=i, parent_idx=parent)
    for name, t in (("c", VarType.BOOL), ("x", VarType.FP32), ("y", VarType.FP32)):
        v = d.blocks[0].vars.add(name=name)
        v.type.type = VarType.LOD_TENSOR
        v.type.lod_tensor.tensor.data_type = t
        v.type.lod_tensor.tensor.dims.extend([1])
    for name in ("s0", "s1"):
        d.blocks[0].vars.add(name=name).type.type = VarType.STEP_SCOPES
    for b, sub, scope in ((0, 1, "s0"), (1, sub_block_of_1, "s1")):
        op = d.blocks[b].ops.add(type="conditional_block")
        op.inputs.add(parameter="Cond", arguments=["c"])
        op.inputs.add(parameter="Input", arguments=["x"])
        op.outputs.add(parameter="Out", arguments=["y"])
        op.outputs.add(parameter="Scope", arguments=[scope])
        op.attrs.add(name="sub_block", type=A.BLOCK, block_idx=sub)
        op.attrs.add(name="is_scalar_condition", type=A.BOOLEAN, b=True)
    op = d.blocks[2].ops.add(type="relu")
    op.inputs.add(parameter="X", arguments=["x"])
    op.outputs.add(parameter="Out", arguments=["y"])
    return d


def _parse(desc):
    return fluid.Program.parse_from_string(desc.SerializeToString())


def test_block_structure():
    fluid.verify(_parse(_control_flow_desc(2)))
    with pytest.raises(ProgramError, match=r"op 'conditional_block' \(block 1, op #0\): attribute "
                                           r"'sub_block': sub-block 1 is its own block"):
        fluid.verify(_parse(_control_flow_desc(1)))
    with pytest.raises(ProgramError, match=r"op 'conditional_block' \(block 1, op #0\): attribute "
                                           r"'sub_block': sub-block 0 is block 0, an ancestor of "
                                           r"block 1"):
        fluid.verify(_parse(_control_flow_desc(0)))
    with pytest.raises(ProgramError, match=r"attribute 'sub_block': block index 7 out of range, "
                                           r"expected 1\.\.2 \(the program has 3 blocks\)"):
        fluid.verify(_parse(_control_flow_desc(7)))
    # block 2 (a sibling of block 1, not an ancestor) running block 1 again: a cycle 1 -> 2 -> 1
    d = _control_flow_desc(2)
    op = d.blocks[2].ops.add()
    op.CopyFrom(d.blocks[1].ops[0])
    op.attrs[0].block_idx = 1
    with pytest.raises(ProgramError, match=r"op 'conditional_block' \(block 2, op #1\): sub-block "
                                           r"1 leads back to itself \(blocks 0 -> 1 -> 2 -> 1\)"):
        fluid.verify(_parse(d))
    p = _parse(_control_flow_desc(2))
    p.blocks[2].desc.parent_idx = 2
    with pytest.raises(ProgramError, match=r"block 2: parent_idx is 2, expected a block before "
                                           r"it \(0\.\.1\)"):
        fluid.verify(p)
    p.blocks[2].desc.parent_idx = 0
    p.blocks[0].desc.parent_idx = 0
    with pytest.raises(ProgramError, match=r"block 0 \(the global block\): parent_idx is 0, "
                                           r"expected -1"):
        fluid.verify(p)


def test_the_executor_verifies_once_per_program_content(fc_program, monkeypatch):
    main, startup, out = fc_program
    calls = []
    real = verify_mod.verify
    monkeypatch.setattr(verify_mod, "verify", lambda p, **kw: calls.append(p) or real(p, **kw))
    scope = fluid.Scope()
    exe = fluid.Executor(mode="reference")
    exe.run(startup, scope=scope)
    x = np.ones((2, 4), np.float32)
    p = edited(main, lambda d: None)
    exe.run(p, feed={"x": x}, fetch_list=[out], scope=scope)
    exe.run(p, feed={"x": x}, fetch_list=["fc_0.tmp_0"], scope=scope)  # another run, same content
    assert [c for c in calls if c is p] == [p]
    bad = edited(main, lambda d: setattr(op_desc(d, "relu"), "type", "relu_v9"))
    with pytest.raises(UnregisteredOpError, match=r"op 'relu_v9' \(block 0, op #2\)"):
        exe.run(bad, feed={"x": x}, fetch_list=[out], scope=scope)


CORPUS = "models/mlp"


def _copy_model(fixtures_dir, tmp_path):
    for ext in (".pdmodel", ".pdiparams"):
        shutil.copy(fixtures_dir / (CORPUS + ext), tmp_path / ("m" + ext))
    return tmp_path / "m"


def _retype_mul_attr(model_path):
    """The model file with its first mul's x_num_col_dims stored as a FLOAT."""
    desc = pb.ProgramDesc.FromString(model_path.read_bytes())
    a = next(a for a in op_desc(desc, "mul").attrs if a.name == "x_num_col_dims")
    a.type, a.f = A.FLOAT, 1.0
    model_path.write_bytes(desc.SerializeToString())
    return next(i for i, op in enumerate(desc.blocks[0].ops) if op.type == "mul")


def test_loading_a_model_verifies_it_naming_the_file(fixtures_dir, tmp_path):
    prefix = _copy_model(fixtures_dir, tmp_path)
    inf.load_model(str(prefix))
    i = _retype_mul_attr(tmp_path / "m.pdmodel")
    with pytest.raises(ProgramError, match=rf"m\.pdmodel: op 'mul' \(block 0, op #{i}\): "
                                           r"attribute 'x_num_col_dims': expected INT, got FLOAT"):
        inf.load_model(str(prefix))
    with pytest.raises(ProgramError, match="expected INT, got FLOAT"):
        pdjit.static.deserialize_program((tmp_path / "m.pdmodel").read_bytes())


def test_check_command(fixtures_dir, tmp_path, capsys):
    prefix = _copy_model(fixtures_dir, tmp_path)
    assert cli_main(["check", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {prefix}.pdmodel: 1 block, 9 ops of 7 types")
    assert "feeds:   x [-1, 16] float32" in out and "parameters: 4 read and checked" in out

    i = _retype_mul_attr(tmp_path / "m.pdmodel")
    assert cli_main(["check", str(tmp_path / "m.pdmodel")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"op 'mul' (block 0, op #{i}): attribute 'x_num_col_dims': expected INT, got " \
           f"FLOAT" in captured.err and captured.err.startswith("pdjit check: ")

    (tmp_path / "t.pdmodel").write_bytes((fixtures_dir / (CORPUS + ".pdmodel")).read_bytes()[:999])
    assert cli_main(["check", str(tmp_path / "t.pdmodel")]) == 1
    assert "ModelFileError" in capsys.readouterr().err

    shutil.copy(fixtures_dir / (CORPUS + ".pdmodel"), tmp_path / "p.pdmodel")
    (tmp_path / "p.pdiparams").write_bytes(
        (fixtures_dir / (CORPUS + ".pdiparams")).read_bytes()[:-3])
    assert cli_main(["check", str(tmp_path / "p")]) == 1
    assert "truncated at byte" in capsys.readouterr().err

    assert cli_main(["check", str(tmp_path / "missing")]) == 2  # bad input, not a bad model
    assert "no model at" in capsys.readouterr().err


def test_tensor_files_claiming_huge_dims_allocate_nothing():
    good = write_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    desc = pb.VarType.TensorDesc(data_type=VarType.FP32, dims=[2 ** 40, 2 ** 40])
    d = desc.SerializeToString()
    huge = good[:16] + len(d).to_bytes(4, "little", signed=True) + d + good[-24:]
    with pytest.raises(ModelFileError, match=r"truncated at byte \d+ while reading t: data of "
                                             r"shape \[1099511627776, 1099511627776\] "
                                             r"\(4835703278458516698824704 bytes wanted, 24 left"):
        read_tensor(_Reader(huge, "f"), "t")
    wraps = pb.VarType.TensorDesc(data_type=VarType.FP32, dims=[2 ** 32, 2 ** 32])
    wraps = wraps.SerializeToString()
    with pytest.raises(ModelFileError, match="bytes wanted"):  # 2^64 * 4 wrapped to 0 in int64
        read_tensor(_Reader(good[:16] + len(wraps).to_bytes(4, "little") + wraps, "f"), "t")
    with pytest.raises(ModelFileError, match="bad TensorDesc"):
        read_tensor(_Reader(good[:16] + (1).to_bytes(4, "little") + b"\x08", "f"), "t")


def test_a_forward_op_reading_an_intermediate_output_is_refused(fresh_programs):
    """reshape2's XShape (declared intermediate: its scratch for reshape2_grad) read by a
    forward scale: refused, naming both ops (a fuzz mutant read an rnn's Reserve, whose
    layout each executor chooses for itself); before that, the training program verifies
    (reshape2_grad, a backward op, reads it)."""
    from pdjit.passes.verify import verify
    main, startup = fresh_programs
    x = fluid.layers.data("x", [6])
    y = fluid.layers.reshape(fluid.layers.fc(x, 6), [-1, 2, 3])
    loss = fluid.layers.mean(y)
    fluid.optimizer.SGD(0.1).minimize(loss)
    (op,) = [o for o in main.global_block().ops if o.type == "reshape2"]
    xshape = op.output("XShape")[0]
    verify(main)  # reshape2_grad reads it: fine
    block = main.global_block()
    out = block.create_var(name="bad", dtype="float32")
    block.append_op("scale", inputs={"X": [xshape]}, outputs={"Out": [out]},
                    attrs={"scale": 2.0})
    with pytest.raises(ProgramError, match=r"op 'scale' .*input '.*' is the intermediate "
                                           r"output of op 'reshape2'"):
        verify(main)
