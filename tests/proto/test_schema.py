"""The schema: shipped generated module, Paddle's field numbers, wire compatibility.

Oracles: the field numbers written in shared/facts/paddle_formats.md (measured on PaddlePaddle
3.3.1), and the bytes PaddlePaddle itself serialised (tests/fixtures/paddle/).
"""
import importlib.util
import pathlib
import sys

import pytest

import pdjit as fluid
from pdjit.proto import framework_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "paddle"
PADDLE_FILES = sorted(FIXTURES.glob("*.pb")) + sorted(FIXTURES.glob("*.pdmodel"))


def test_shipped_module_matches_schema(tmp_path):
    """Regenerating from schema/framework.proto describes exactly the shipped messages."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) regenerates the schema")
    from pdjit.proto.regen import generate

    out = generate(str(ROOT / "schema"), str(tmp_path))
    source = pathlib.Path(out).read_text()
    shipped = (ROOT / "src" / "pdjit" / "proto" / "framework_pb2.py").read_text()

    def serialized_descriptor(text):
        start = text.index("AddSerializedFile(b'") + len("AddSerializedFile(")
        end = text.index("')\n", start) + 1
        return eval(text[start:end])  # a bytes literal written by protoc

    assert serialized_descriptor(source) == serialized_descriptor(shipped), \
        "framework_pb2.py is stale: run python -m pdjit.proto.regen"


def _number(msg, field):
    return msg.DESCRIPTOR.fields_by_name[field].number


@pytest.mark.parametrize("msg,field,number", [
    (pb.ProgramDesc, "blocks", 1), (pb.ProgramDesc, "version", 4),
    (pb.ProgramDesc, "op_version_map", 5),
    (pb.BlockDesc, "idx", 1), (pb.BlockDesc, "parent_idx", 2), (pb.BlockDesc, "vars", 3),
    (pb.BlockDesc, "ops", 4), (pb.BlockDesc, "forward_block_idx", 5),
    (pb.VarDesc, "name", 1), (pb.VarDesc, "type", 2), (pb.VarDesc, "persistable", 3),
    (pb.VarDesc, "need_check_feed", 4), (pb.VarDesc, "is_parameter", 5),
    (pb.VarDesc, "stop_gradient", 6), (pb.VarDesc, "attrs", 7),
    (pb.VarType, "type", 1), (pb.VarType, "selected_rows", 2), (pb.VarType, "lod_tensor", 3),
    (pb.VarType, "tensor_array", 4), (pb.VarType, "reader", 5), (pb.VarType, "tuple", 7),
    (pb.VarType.TensorDesc, "data_type", 1), (pb.VarType.TensorDesc, "dims", 2),
    (pb.VarType.LoDTensorDesc, "tensor", 1), (pb.VarType.LoDTensorDesc, "lod_level", 2),
    (pb.OpDesc, "type", 3), (pb.OpDesc, "inputs", 1), (pb.OpDesc, "outputs", 2),
    (pb.OpDesc, "attrs", 4), (pb.OpDesc, "is_target", 5),
    (pb.OpDesc.Var, "parameter", 1), (pb.OpDesc.Var, "arguments", 2),
    (pb.OpDesc.Attr, "i", 3), (pb.OpDesc.Attr, "f", 4), (pb.OpDesc.Attr, "s", 5),
    (pb.OpDesc.Attr, "ints", 6), (pb.OpDesc.Attr, "floats", 7), (pb.OpDesc.Attr, "strings", 8),
    (pb.OpDesc.Attr, "b", 10), (pb.OpDesc.Attr, "bools", 11), (pb.OpDesc.Attr, "block_idx", 12),
    (pb.OpDesc.Attr, "l", 13), (pb.OpDesc.Attr, "blocks_idx", 14), (pb.OpDesc.Attr, "longs", 15),
    (pb.OpDesc.Attr, "float64s", 16), (pb.OpDesc.Attr, "var_name", 17),
    (pb.OpDesc.Attr, "vars_name", 18), (pb.OpDesc.Attr, "float64", 19),
    (pb.OpDesc.Attr, "scalar", 20), (pb.OpDesc.Attr, "scalars", 21),
])
def test_field_numbers_are_paddles(msg, field, number):
    assert _number(msg, field) == number


@pytest.mark.parametrize("name,value", [
    ("BOOL", 0), ("INT16", 1), ("INT32", 2), ("INT64", 3), ("FP16", 4), ("FP32", 5), ("FP64", 6),
    ("LOD_TENSOR", 7), ("SELECTED_ROWS", 8), ("FEED_MINIBATCH", 9), ("FETCH_LIST", 10),
    ("STEP_SCOPES", 11), ("LOD_RANK_TABLE", 12), ("LOD_TENSOR_ARRAY", 13), ("PLACE_LIST", 14),
    ("READER", 15), ("RAW", 17), ("TUPLE", 18), ("SIZE_T", 19), ("UINT8", 20), ("INT8", 21),
    ("BF16", 22), ("COMPLEX64", 23), ("COMPLEX128", 24), ("STRING", 25), ("STRINGS", 26),
    ("VOCAB", 27), ("FEED_LIST", 28), ("PSTRING", 29), ("SPARSE_COO", 30), ("SPARSE_CSR", 31),
    ("FP8_E4M3FN", 32), ("FP8_E5M2", 33), ("UINT16", 36), ("UINT32", 37), ("UINT64", 38),
])
def test_vartype_enum_values_are_paddles(name, value):
    assert pb.VarType.Type.Value(name) == value


def test_attr_type_enum_values_are_paddles():
    names = ["INT", "FLOAT", "STRING", "INTS", "FLOATS", "STRINGS", "BOOLEAN", "BOOLEANS", "BLOCK",
             "LONG", "BLOCKS", "LONGS", "FLOAT64S", "VAR", "VARS", "FLOAT64", "SCALAR", "SCALARS"]
    assert [pb.AttrType.Value(n) for n in names] == list(range(18))


def test_dims_are_written_unpacked():
    """Paddle writes TensorDesc dims unpacked: [16, 32] FP32 is 08 05 10 10 10 20."""
    td = pb.VarType.TensorDesc(data_type=pb.VarType.FP32, dims=[16, 32])
    assert td.SerializeToString() == bytes.fromhex("080510101020")
    assert pb.VarType.TensorDesc(data_type=pb.VarType.FP32, dims=[1280]).SerializeToString() \
        == bytes.fromhex("080510800a")


def test_package_differs_from_paddles():
    assert pb.DESCRIPTOR.package == "pdjit.framework"
    assert pb.DESCRIPTOR.name != "framework.proto"


@pytest.mark.parametrize("path", PADDLE_FILES, ids=lambda p: p.name)
def test_paddle_bytes_round_trip(path):
    """A ProgramDesc serialised by PaddlePaddle parses here and re-serialises to the same bytes."""
    data = path.read_bytes()
    program = fluid.Program.parse_from_string(data)
    assert program.serialize_to_string() == data
    assert program.num_blocks >= 1
    # and still the same after the program was touched and reassembled
    program._bump()
    assert program.serialize_to_string() == data


def test_paddle_fixtures_exist():
    names = {p.name for p in PADDLE_FILES}
    assert {"fit_a_line_main.pb", "fit_a_line_startup.pb", "ops_zoo.pb", "while_loop.pb",
            "mlp_infer.pdmodel"} <= names


def test_parsed_paddle_program_structure():
    prog = fluid.Program.parse_from_string((FIXTURES / "fit_a_line_main.pb").read_bytes())
    gb = prog.global_block()
    assert [op.type for op in gb.ops][:5] == ["mul", "elementwise_add", "elementwise_sub",
                                              "square", "reduce_mean"]
    assert gb.var("x").shape == (-1, 1) and gb.var("x").dtype == "float32"
    assert {p.name for p in prog.all_parameters()} == {"fc_0.w_0", "fc_0.b_0"}
    sgd = [op for op in gb.ops if op.type == "sgd"]
    assert sgd and sgd[0].input("MasterParam") == []  # empty slots are kept
    wl = fluid.Program.parse_from_string((FIXTURES / "while_loop.pb").read_bytes())
    assert wl.num_blocks == 2 and wl.block(1).parent_idx == 0
    while_op = next(op for op in wl.global_block().ops if op.type == "while")
    assert while_op._block_attr("sub_block") is wl.block(1)


def test_pdjit_bytes_parse_with_paddles_schema(fresh_programs):
    """What pdjit writes parses with PaddlePaddle's own schema (and prints the same)."""
    paddle_pb = _paddle_framework_pb2()
    main, startup = fresh_programs
    x = fluid.layers.data(name="x", shape=[3], dtype="float32")
    y = fluid.layers.scale(fluid.layers.relu(x), scale=2.0) + x
    main.global_block().append_op("cast", inputs={"X": y}, outputs={
        "Out": main.global_block().create_var(name="c")}, attrs={"in_dtype": 5, "out_dtype": 6})
    sub = main._create_block()
    sub.create_var(name="inner", shape=[1], dtype="int64")
    main._rollback()
    data = main.serialize_to_string()
    theirs = paddle_pb.ProgramDesc.FromString(data)
    assert theirs.SerializeToString() == data
    assert len(theirs.blocks) == 2 and theirs.blocks[1].parent_idx == 0
    assert [op.type for op in theirs.blocks[0].ops] == ["relu", "scale", "elementwise_add", "cast"]


def _paddle_framework_pb2():
    """Paddle's generated schema module, loaded on its own (paddle itself is not imported)."""
    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("paddlepaddle is not installed (the 'compare' extra)")
    pkg = pathlib.Path(spec.submodule_search_locations[0])
    candidates = list(pkg.glob("base/proto/framework_pb2.py")) + \
        list(pkg.glob("framework/proto/framework_pb2.py"))
    if not candidates:
        pytest.skip("paddle's framework_pb2 was not found")
    mod_spec = importlib.util.spec_from_file_location("_paddle_framework_pb2_probe", candidates[0])
    mod = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(mod)
    except Exception as e:  # a protobuf version paddle's gencode does not accept
        pytest.skip(f"paddle's framework_pb2 does not load here: {e}")
    sys.modules.setdefault("_paddle_framework_pb2_probe", mod)
    return mod
