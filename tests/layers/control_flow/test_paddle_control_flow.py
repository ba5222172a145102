"""Control-flow programs written by PaddlePaddle (legacy ProgramDesc) parse and give Paddle's
outputs (tests/fixtures/paddle/: while_loop, cond, tensor_array; see manifest.json)."""
import json
import pathlib

import numpy as np
import pytest

import pdjit as fluid

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(lod_array_length|read_from_array|tensor_array_to_tensor|write_to_array"
    r")' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "paddle"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
MODES = ["reference", "compiled"]


def _load(stem):
    program = fluid.Program.parse_from_string((FIXTURES / f"{stem}.pb").read_bytes())
    return program, np.load(FIXTURES / f"{stem}_io.npz")


def _run(mode, program, feed, fetch):
    return fluid.Executor(mode=mode).run(program, feed=feed, fetch_list=fetch,
                                         scope=fluid.Scope())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shuffle", [False, True])
def test_paddle_while_loop(mode, shuffle):
    spec = MANIFEST["while_loop"]
    program, io = _load("while_loop")
    (op,) = [op for op in program.global_block().ops if op.type == "while"]
    assert program.block(op.attr("sub_block")).parent_idx == 0
    if shuffle:  # Paddle's X/Out lists come from Python sets: their order must not matter
        op._set_slot("input", "X", list(reversed(op.input("X"))))
        op._set_slot("output", "Out", list(reversed(op.output("Out"))))
    fetch = spec["fetch_vars"]
    got_i, got_x = _run(mode, program, {"x": io["feed/x"]}, [fetch["fetch/i"], fetch["fetch/x"]])
    np.testing.assert_array_equal(got_i, io["fetch/i"])
    np.testing.assert_allclose(got_x, io["fetch/x"], rtol=1e-6)
    np.testing.assert_allclose(got_x, (io["feed/x"] + 1) * 2 ** 10 - 1, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("branch", ["true", "false"])
def test_paddle_cond(mode, branch):
    spec = MANIFEST["cond"]
    program, io = _load("cond")
    types = [op.type for op in program.global_block().ops]
    assert types.count("conditional_block") == 2 and "select_input" in types
    (got,) = _run(mode, program, {"x": io["feed/x"], "s": io[f"feed/s_{branch}"]},
                  [spec["fetch_var"]])
    np.testing.assert_allclose(got, io[f"fetch/{branch}"], rtol=1e-6)
    x = io["feed/x"]
    np.testing.assert_allclose(got, x * 3 if branch == "true" else x - 1, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_paddle_tensor_array(mode):
    spec = MANIFEST["tensor_array"]
    program, io = _load("tensor_array")
    names = list(spec["fetch"].values())
    got = _run(mode, program, {"x": io["feed/x"]}, names)
    for name, g in zip(names, got):
        assert g.dtype == io[name].dtype, name
        np.testing.assert_allclose(g, io[name], rtol=1e-6, err_msg=name)


def test_paddle_programs_reserialize_to_the_same_bytes():
    for stem in ("while_loop", "cond", "tensor_array"):
        data = (FIXTURES / f"{stem}.pb").read_bytes()
        assert fluid.Program.parse_from_string(data).serialize_to_string() == data


_PROTO_SCRIPT = """
import json, os
os.environ["FLAGS_enable_pir_api"] = "0"
from paddle.base import core
from paddle.base.proto import framework_pb2
want = set(json.loads(os.environ["PDJIT_WANT"]))
out = {}
for s in core.get_all_op_protos():
    p = framework_pb2.OpProto.FromString(s)
    if p.type in want:
        out[p.type] = {"inputs": [i.name for i in p.inputs],
                       "outputs": [o.name for o in p.outputs],
                       "attrs": {a.name: a.type for a in p.attrs}}
print(json.dumps(out))
"""


def test_slots_and_attributes_match_paddles_op_protos():
    """The legacy op types keep Paddle's slot names, attribute names and attribute types."""
    import importlib.util
    import os
    import subprocess
    import sys

    from pdjit.framework import registry

    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    ours = ["conditional_block", "while", "select_input", "select_output", "write_to_array",
            "read_from_array", "lod_array_length", "tensor_array_to_tensor"]
    env = dict(os.environ, PDJIT_WANT=json.dumps(ours))
    done = subprocess.run([sys.executable, "-c", _PROTO_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    protos = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(protos) == sorted(ours)
    for t in ours:
        d = registry.get(t)
        assert [s.name for s in d.inputs] == protos[t]["inputs"], t
        assert [s.name for s in d.outputs] == protos[t]["outputs"], t
        for name, spec in d.attrs.items():
            if name in protos[t]["attrs"]:
                assert spec.type == protos[t]["attrs"][name], (t, name)
        missing = set(protos[t]["attrs"]) - set(d.attrs) - set(registry.COMMON_ATTRS)
        assert not missing, (t, missing)
