"""PaddlePaddle as the oracle: programs and parameters it wrote, and the outputs it computed.

The fixtures (tests/fixtures/paddle/, made by tests/fixtures/make_paddle_fixtures.py) hold
Paddle-serialized programs and the values Paddle's own executor produced; pdjit parses the
programs and must reproduce the values. Paddle itself is not needed to run these tests.
"""
import json
import pathlib

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import registry
from pdjit.io import load_combined_params, persistable_names, save_combined_params

# these ops have no native code for some inputs tested here: a compiled plan
# runs their NumPy reference by design and says so once per process
# one worker runs the module (xdist_group): the ops zoo's program compiles once, not per worker
pytestmark = [pytest.mark.filterwarnings(
    r"ignore:op '(cross_entropy|elementwise_floordiv|elementwise_mod"
    r"|softmax_with_cross_entropy)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning"), pytest.mark.xdist_group("paddle_zoo")]

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "paddle"
ZOO = json.loads((FIXTURES / "ops_zoo.json").read_text())


def _load_model(stem):
    program = fluid.Program.parse_from_string((FIXTURES / f"{stem}.pdmodel").read_bytes())
    names = persistable_names(program)
    params = load_combined_params((FIXTURES / f"{stem}.pdiparams").read_bytes(), names)
    return program, names, params


@pytest.mark.parametrize("stem", ["mlp_infer", "fit_a_line_infer"])
def test_pdiparams_read_and_rewrite_byte_identical(stem):
    program, names, params = _load_model(stem)
    assert names == sorted(names) and len(names) >= 2
    data = (FIXTURES / f"{stem}.pdiparams").read_bytes()
    assert save_combined_params(params, names) == data
    for n in names:
        assert tuple(params[n].shape) == program.global_block().var(n).shape


def test_pdiparams_damage_is_a_clear_error():
    program, names, _ = _load_model("mlp_infer")
    data = (FIXTURES / "mlp_infer.pdiparams").read_bytes()
    with pytest.raises(ValueError, match="truncated at byte"):
        load_combined_params(data[:-3], names)
    with pytest.raises(ValueError, match="bytes left after"):
        load_combined_params(data + b"\0" * 8, names)
    with pytest.raises(ValueError, match="unsupported tensor version"):
        load_combined_params(b"\x07" + data[1:], names)


@pytest.mark.parametrize("stem", ["mlp_infer", "fit_a_line_infer"])
def test_inference_models_give_paddles_outputs(stem):
    """The saved model keeps its own feed/fetch ops; its output is Paddle's (npz key = name)."""
    program, names, params = _load_model(stem)
    io = np.load(FIXTURES / f"{stem}_io.npz")
    scope = fluid.Scope()
    for n, v in params.items():
        scope.var(n).value = v
    gb = program.global_block()
    (feed_name,) = [op.output("Out")[0] for op in gb.ops if op.type == "feed"]
    (fetch_name,) = [op.input("X")[0] for op in gb.ops if op.type == "fetch"]
    (out,) = fluid.Executor().run(program, feed={feed_name: io[feed_name]}, scope=scope)
    np.testing.assert_allclose(out, io[fetch_name], rtol=2e-5, atol=1e-6)
    # the same program fetched by name, at another batch size
    (again,) = fluid.Executor().run(program, feed={feed_name: io[feed_name][:2]},
                                    fetch_list=[fetch_name], scope=scope)
    np.testing.assert_allclose(again, io[fetch_name][:2], rtol=2e-5, atol=1e-6)


@pytest.fixture(scope="module")
def zoo_run():
    program = fluid.Program.parse_from_string((FIXTURES / "ops_zoo.pb").read_bytes())
    io = np.load(FIXTURES / "ops_zoo_io.npz")
    feed = {name: io[name] for name in ZOO["feeds"]}
    fetch = [f["fetch"] for f in ZOO["fetches"]]
    outs = fluid.Executor().run(program, feed=feed, fetch_list=fetch, scope=fluid.Scope())
    return program, dict(zip(fetch, outs)), io


@pytest.mark.parametrize("entry", ZOO["fetches"], ids=lambda f: f["fetch"])
def test_ops_zoo_matches_paddle(entry, zoo_run):
    program, got, io = zoo_run
    want = io[entry["fetch"]]
    out = got[entry["fetch"]]
    assert out.dtype == np.dtype(entry["runtime_dtype"]), entry
    assert list(out.shape) == entry["runtime_shape"], entry
    if out.dtype.kind == "f":
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6, err_msg=str(entry))
    else:
        np.testing.assert_array_equal(out, want, err_msg=str(entry))


def test_ops_zoo_infer_shape_matches_paddles(zoo_run):
    """pdjit's infer_shape, run on Paddle's ops, gives the shapes Paddle inferred."""
    program, _, _ = zoo_run
    gb = program.global_block()
    wrong = []
    for entry in ZOO["fetches"]:
        op = gb.var(entry["fetch"]).op
        opdef = registry.get(op.type)
        metas = {}
        for slot in opdef.inputs:
            ms = [gb.var(n).meta() for n in op.input(slot.name)]
            metas[slot.name] = ms if slot.duplicable else (ms[0] if ms else None)
        attrs = {k: v for k, v in op.all_attrs().items() if k in opdef.attrs}
        result = opdef.call_infer_shape(metas, attrs)[entry["slot"]]
        names = op.output(entry["slot"])
        meta = result[names.index(entry["fetch"])] if isinstance(result, list) else result
        if list(meta.shape) != entry["inferred_shape"]:
            wrong.append((entry["fetch"], list(meta.shape), entry["inferred_shape"]))
    assert not wrong, wrong
