"""The corpus of PaddlePaddle-saved inference models against Paddle's own outputs.

``tests/fixtures/paddle/models/`` (made by ``tests/fixtures/make_inference_corpus.py`` with
PaddlePaddle 3.3.1, legacy mode) holds small models written by Paddle's
``save_inference_model``, the inputs fed and what Paddle computed from the saved files
(``<name>_io.npz``: ``<case>/feed/<var>``, ``<case>/fetch/<var>``), and ``manifest.json``.
Every model loads with ``pdjit.io.inference_model.load_model`` and runs natively
(``Executor(strict=True)``: native code that falls back to its NumPy reference fails the test,
and so does an op planned as a reference step, by ``ReferenceStepWarning`` made an error) to
Paddle's outputs within ``RTOL``/``ATOL``. The Fluid 1.x directory forms (``__model__`` with one
file per variable, or ``__params__``) load through ``pdjit.io.load_inference_model`` and give
the same outputs. Paddle is not needed to run these tests.
"""
import hashlib
import json
import pathlib
from collections import Counter

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import registry
from pdjit.io.inference_model import load_model

MODELS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "paddle" / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())["models"]
# every step of a compiled plan must be native code: a reference step is an error (its warning
# comes when the plan is built, in the first test of a process that runs that program)
pytestmark = pytest.mark.filterwarnings("error::pdjit.framework.errors.ReferenceStepWarning")
#: float32 outputs against Paddle's (softmax probabilities, logits of order 1, activations)
RTOL = ATOL = 1e-5

#: models whose ops pdjit does not have yet (strict: the mark must go when they pass)
PENDING: dict = {}


def _models(names):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=PENDING[n]))
            if n in PENDING else n for n in names]


def _io(name):
    with np.load(MODELS / f"{name}_io.npz") as z:
        return dict(z)


def _run_cases(name, exe, program, feed_names, fetch, scope=None):
    """Run every case of the model's npz and compare each output with Paddle's."""
    io = _io(name)
    entry = MANIFEST[name]
    fetch_names = [f if isinstance(f, str) else f.name for f in fetch]
    assert entry["cases"], name
    for case in entry["cases"]:
        feed = {n: io[f"{case}/feed/{n}"] for n in feed_names}
        outs = exe.run(program, feed=feed, fetch_list=fetch, scope=scope)
        assert len(outs) == len(fetch_names)
        for n, got in zip(fetch_names, outs):
            want = io[f"{case}/fetch/{n}"]
            assert got.dtype == want.dtype and got.shape == want.shape, (name, case, n)
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}: {n}, case {case}")


def test_corpus_files_are_the_ones_listed():
    """Every file of the manifest is there with its recorded sha256 (Paddle wrote them)."""
    assert set(MANIFEST) == {"mlp", "lenet", "resnet_block", "mobilenet", "transformer", "lstm",
                             "gru", "cond_while"}
    for entry in MANIFEST.values():
        listed = dict(entry["sha256"])
        for form in entry.get("dir_forms", {}).values():
            listed.update({f"{form['dir']}/{f}": h for f, h in form["sha256"].items()})
        for rel, digest in listed.items():
            assert hashlib.sha256((MODELS / rel).read_bytes()).hexdigest() == digest, rel


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_corpus_model_loads(name):
    """Every model parses (all blocks) and its parameters read, whether pdjit can run it or not."""
    entry = MANIFEST[name]
    model = load_model(MODELS / name)
    assert model.feed_names == [f["name"] for f in entry["feed"]]
    assert model.fetch_names == [f["name"] for f in entry["fetch"]]
    assert pathlib.Path(model.model_file).name == f"{name}.pdmodel"
    assert pathlib.Path(model.params_file).name == f"{name}.pdiparams"
    program = model.program
    assert program.num_blocks == entry["blocks"]
    ops = Counter(op.type for b in range(program.num_blocks) for op in program.block(b).ops)
    assert dict(ops) == entry["op_types"]
    assert sorted(model.params) == entry["params"]
    gb = program.global_block()
    for n, v in model.params.items():
        var = gb.var(n)
        assert v.dtype == np.float32 and tuple(v.shape) == tuple(var.shape), n
    assert sum(v.size for v in model.params.values()) == entry["n_param_values"]
    for f in entry["feed"]:
        assert list(gb.var(f["name"]).shape) == f["shape"]


@pytest.mark.parametrize("name", _models(sorted(MANIFEST)))
def test_corpus_model_matches_paddle(name):
    model = load_model(MODELS / name)
    scope = fluid.Scope()
    for n, v in model.params.items():
        scope.var(n).value = v
    _run_cases(name, fluid.Executor(strict=True), model.program, model.feed_names,
               model.fetch_names, scope=scope)


DIR_FORMS = [(n, form) for n in sorted(MANIFEST) for form in MANIFEST[n].get("dir_forms", {})]


@pytest.mark.parametrize("name,form", DIR_FORMS, ids=[f"{n}-{f}" for n, f in DIR_FORMS])
def test_fluid_directory_forms(name, form):
    """``__model__`` + one file per variable (``save_vars``), or + ``__params__``: the same
    program and parameters as ``<name>.pdmodel``/``.pdiparams``, so the same outputs."""
    spec = MANIFEST[name]["dir_forms"][form]
    dirname = MODELS / spec["dir"]
    assert (dirname / "__model__").read_bytes() == (MODELS / f"{name}.pdmodel").read_bytes()
    ref = load_model(MODELS / name)
    exe = fluid.Executor(strict=True)
    scope = fluid.Scope()
    with fluid.scope_guard(scope):
        program, feed_names, fetch_targets = fluid.io.load_inference_model(
            str(dirname), exe, params_filename=spec["params_filename"])
        assert feed_names == ref.feed_names
        assert [v.name for v in fetch_targets] == ref.fetch_names
        for n, v in ref.params.items():
            np.testing.assert_array_equal(np.asarray(scope.find_var(n).value), v, err_msg=n)
        _run_cases(name, exe, program, feed_names, fetch_targets)
    # load_model finds the same layout from the directory alone
    model = load_model(dirname)
    assert (model.params_file is None) == (spec["params_filename"] is None)
    assert sorted(model.params) == sorted(ref.params)
    for n, v in ref.params.items():
        np.testing.assert_array_equal(model.params[n], v, err_msg=n)


def _resave(name, tmp_path):
    """Load the Paddle-saved model and save it again with pdjit (twice: the second save, of
    what the first wrote, must give the same bytes)."""
    import pdjit.static as static

    paths = []
    src = str(MODELS / name)
    for k in range(2):
        with fluid.scope_guard(fluid.Scope()):
            exe = fluid.Executor()
            program, feeds, fetches = static.load_inference_model(src, exe)
            gb = program.global_block()
            src = str(tmp_path / f"{name}_{k}")
            static.save_inference_model(src, [gb.var(n) for n in feeds], fetches, exe,
                                        program=program)
        paths.append(src)
    return paths


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_corpus_resaved_by_pdjit(name, tmp_path):
    """pdjit -> pdjit: re-saving keeps every parameter byte (in Paddle's order), a second
    re-save gives the same bytes, and the re-saved model computes Paddle's outputs."""
    first, second = _resave(name, tmp_path)
    for ext in (".pdmodel", ".pdiparams"):
        assert pathlib.Path(first + ext).read_bytes() == pathlib.Path(second + ext).read_bytes()
    assert pathlib.Path(first + ".pdiparams").read_bytes() == \
        (MODELS / f"{name}.pdiparams").read_bytes()
    if name in PENDING:
        return
    model = load_model(first)
    scope = fluid.Scope()
    for n, v in model.params.items():
        scope.var(n).value = v
    _run_cases(name, fluid.Executor(strict=True), model.program, model.feed_names,
               model.fetch_names, scope=scope)


_PADDLE_RUN = r'''
import os, pickle, sys
os.environ["FLAGS_enable_pir_api"] = "0"
import numpy as np, paddle
paddle.enable_static()
exe = paddle.static.Executor(paddle.CPUPlace())
out = {}
for name, prefix, feed in pickle.load(open(sys.argv[1], "rb")):
    with paddle.static.scope_guard(paddle.static.Scope()):
        prog, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
        out[name] = (feeds, [np.asarray(v) for v in exe.run(prog, feed=feed,
                                                              fetch_list=fetches)])
pickle.dump(out, open(sys.argv[2], "wb"))
'''


@pytest.mark.paddle
def test_paddle_runs_the_corpus_as_pdjit_saved_it(tmp_path):
    """pdjit -> Paddle: every corpus model re-saved by pdjit loads in PaddlePaddle (legacy
    mode) and computes the outputs Paddle computed from its own files."""
    import importlib.util
    import pickle
    import subprocess
    import sys

    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    jobs = []
    for name in sorted(MANIFEST):
        first, _ = _resave(name, tmp_path)
        io = _io(name)
        feed = {f["name"]: io[f"batch2/feed/{f['name']}"] for f in MANIFEST[name]["feed"]}
        jobs.append((name, first, feed))
    (tmp_path / "in.pkl").write_bytes(pickle.dumps(jobs))
    (tmp_path / "run.py").write_text(_PADDLE_RUN)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "in.pkl"),
                           str(tmp_path / "out.pkl")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = pickle.loads((tmp_path / "out.pkl").read_bytes())
    for name in sorted(MANIFEST):
        io = _io(name)
        feeds, outs = got[name]
        assert feeds == [f["name"] for f in MANIFEST[name]["feed"]]
        for f, out in zip(MANIFEST[name]["fetch"], outs):
            np.testing.assert_allclose(out, io[f"batch2/fetch/{f['name']}"], rtol=RTOL,
                                       atol=ATOL, err_msg=f"{name}: {f['name']}")


@pytest.mark.parametrize("name", _models(sorted(MANIFEST)))
def test_corpus_through_the_predictor(name):
    """The Predictor (inference passes on: batch norm folded, dropout gone) gives Paddle's
    outputs, and every step it runs is native code."""
    import pdjit.inference as inference

    predictor = inference.create_predictor(inference.Config(str(MODELS / name)))
    types = Counter(op.type for b in predictor.program().blocks for op in b.ops)
    assert not types["batch_norm"] and not types["dropout"]
    io = _io(name)
    for case in MANIFEST[name]["cases"]:
        outs = predictor.run([io[f"{case}/feed/{n}"] for n in predictor.get_input_names()])
        for n, got in zip(predictor.get_output_names(), outs):
            np.testing.assert_allclose(got, io[f"{case}/fetch/{n}"], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}: {n}, case {case}")
    steps = [s for _, plan in predictor._exe._plans.values() for s in plan.walk()]
    # control-flow ops run their sub-blocks' plans (native) from the host
    control = registry.CONTROL_FLOW
    assert steps and all(s.kind.startswith("native") or registry.get(s.op.type).has(control)
                         for s in steps), [s.describe() for s in steps]


@pytest.mark.parametrize("name", ["resnet_block", "mobilenet", "cond_while"])
def test_corpus_with_the_memory_plan(name):
    """The Predictor's memory plan (on unless ``Config.enable_memory_optim(False)``): buffers
    reused and released by liveness inside each compiled step; the outputs stay Paddle's, the
    plan reports what it assigned, and switched off the outputs are the same bits."""
    import pdjit.inference as inference

    config = inference.Config(str(MODELS / name))
    assert config.memory_optim_enabled()
    predictor = inference.create_predictor(config)
    assert predictor._exe.memory_optim
    off = inference.Config(str(MODELS / name))
    off.enable_memory_optim(False)
    plain = inference.create_predictor(off)
    assert not plain._exe.memory_optim
    io = _io(name)
    for case in MANIFEST[name]["cases"]:
        feeds = [io[f"{case}/feed/{n}"] for n in predictor.get_input_names()]
        outs = predictor.run(feeds)
        for n, got, same in zip(predictor.get_output_names(), outs, plain.run(feeds)):
            np.testing.assert_allclose(got, io[f"{case}/fetch/{n}"], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name}: {n}, case {case}")
            np.testing.assert_array_equal(got, same)
    for exe, planned in ((predictor._exe, True), (plain._exe, False)):
        plans = [plan for _, plan in exe._plans.values()]
        assert any("memory plan" in plan.report() for plan in plans) == planned
