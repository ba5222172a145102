"""Saving and loading inference models, and the Predictor.

Oracle: the model's forward pass written in NumPy from the parameters in the scope (fc, relu,
softmax), and PaddlePaddle itself (a subprocess, when it is installed) for models pdjit saved.
"""
import importlib.util
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import pdjit as fluid
import pdjit.inference as inference
import pdjit.static as static
from pdjit.framework.errors import FeedError, ModelFileError
from pdjit.io.inference_model import load_model

RNG = np.random.default_rng(7)


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _forward(scope, x, extra):
    """The MLP of ``_build`` in NumPy: fc(8->16) relu, dropout (identity at test time:
    upscale_in_train), + extra, fc(16->4) softmax; also the hidden layer."""
    w0, b0 = (np.asarray(scope.find_var(n).value) for n in ("fc_0.w_0", "fc_0.b_0"))
    w1, b1 = (np.asarray(scope.find_var(n).value) for n in ("fc_1.w_0", "fc_1.b_0"))
    h = np.maximum(x @ w0 + b0, 0)
    return _softmax((h + extra) @ w1 + b1), h


@pytest.fixture
def trained(fresh_programs):
    """A two-input MLP trained one step (so the program has backward and optimizer ops), in a
    fresh global scope."""
    main, startup = fresh_programs
    x = fluid.layers.data("x", [8])
    extra = fluid.layers.data("extra", [16])
    label = fluid.layers.data("label", [1], dtype="int64")
    h = fluid.layers.fc(x, 16, act="relu")
    d = fluid.layers.dropout(h, 0.5, dropout_implementation="upscale_in_train")
    y = fluid.layers.fc(fluid.layers.elementwise_add(d, extra), 4, act="softmax")
    loss = fluid.layers.mean(fluid.layers.cross_entropy(y, label))
    fluid.optimizer.SGD(0.1).minimize(loss)
    scope = fluid.Scope()
    with fluid.scope_guard(scope):
        exe = fluid.Executor()
        exe.run(startup)
        feed = {"x": RNG.standard_normal((4, 8)).astype("float32"),
                "extra": RNG.standard_normal((4, 16)).astype("float32"),
                "label": RNG.integers(0, 4, (4, 1)).astype("int64")}
        exe.run(main, feed=feed, fetch_list=[loss])
        yield main, exe, scope, (x, extra), (y, h)


def _inputs(n=3):
    return RNG.standard_normal((n, 8)).astype("float32"), \
        RNG.standard_normal((n, 16)).astype("float32")


def test_static_save_load_prunes_and_matches_numpy(trained, tmp_path):
    main, exe, scope, (x, extra), (y, h) = trained
    prefix = str(tmp_path / "m")
    static.save_inference_model(prefix, [x, extra], [y, h], exe)
    assert sorted(os.listdir(tmp_path)) == ["m.pdiparams", "m.pdmodel"]
    with _fresh_scope() as loaded:
        program, feeds, fetches = static.load_inference_model(prefix, exe)
        assert feeds == ["x", "extra"] and [v.name for v in fetches] == [y.name, h.name]
        gb = program.global_block()
        types = [op.type for op in gb.ops]
        # pruned: no loss, no backward, no optimizer ops; feed ops first in reverse column
        # order, fetch ops last, as PaddlePaddle writes them
        assert types[:2] == ["feed", "feed"] and types[-2:] == ["fetch", "fetch"]
        assert [op.attr("col") for op in gb.ops[:2]] == [1, 0]
        assert not {"mean", "cross_entropy", "sgd"} & set(types)
        assert not any(t.endswith("_grad") for t in types)
        assert all(op.attr("is_test") for op in gb.ops if op.has_attr("is_test"))
        names = [v.name for v in gb.vars.values()]
        assert names[-2:] == ["feed", "fetch"] and names[:-2] == sorted(names[:-2])
        assert "label" not in names and not any("@GRAD" in n for n in names)
        xv, ev = _inputs()
        out, hid = fluid.Executor(strict=True).run(program, feed={"x": xv, "extra": ev},
                                                   fetch_list=fetches)
        want, want_h = _forward(loaded, xv, ev)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hid, want_h, rtol=1e-5, atol=1e-6)
    # the loaded parameters are the trained ones
    np.testing.assert_array_equal(loaded.find_var("fc_0.w_0").value,
                                  scope.find_var("fc_0.w_0").value)


class _fresh_scope:
    def __enter__(self):
        self.scope = fluid.Scope()
        self.guard = fluid.scope_guard(self.scope)
        self.guard.__enter__()
        return self.scope

    def __exit__(self, *exc):
        self.guard.__exit__(*exc)


@pytest.mark.parametrize("params_filename", [None, "__params__"])
def test_fluid_directory_forms(trained, tmp_path, params_filename):
    main, exe, scope, (x, extra), (y, h) = trained
    d = str(tmp_path / "model")
    got = fluid.io.save_inference_model(d, ["x", "extra"], [y], exe, main_program=main,
                                        params_filename=params_filename)
    assert got == [y.name]
    files = sorted(os.listdir(d))
    params = ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]
    assert files == sorted(["__model__"] + ([params_filename] if params_filename else params))
    xv, ev = _inputs()
    with _fresh_scope() as loaded:
        program, feeds, fetches = fluid.io.load_inference_model(d, exe,
                                                                params_filename=params_filename)
        (out,) = fluid.Executor().run(program, feed={"x": xv, "extra": ev}, fetch_list=fetches)
        want, _ = _forward(loaded, xv, ev)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    # the Predictor finds the same model from the directory alone
    cfg = inference.Config(d)
    cfg.switch_ir_optim(False)
    (pout,) = inference.create_predictor(cfg).run([xv, ev])
    np.testing.assert_allclose(pout, want, rtol=1e-5, atol=1e-6)


def test_resave_is_byte_identical(trained, tmp_path):
    main, exe, scope, (x, extra), (y, h) = trained
    static.save_inference_model(str(tmp_path / "a"), [x, extra], [y], exe)
    with _fresh_scope():
        program, feeds, fetches = static.load_inference_model(str(tmp_path / "a"), exe)
        gb = program.global_block()
        static.save_inference_model(str(tmp_path / "b"), [gb.var(n) for n in feeds], fetches,
                                    exe, program=program)
    for ext in (".pdmodel", ".pdiparams"):
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"b{ext}").read_bytes()
    assert static.serialize_program([x, extra], [y], program=main) == \
        (tmp_path / "a.pdmodel").read_bytes()


def test_feeding_an_intermediate_prunes_its_producers(trained, tmp_path):
    main, exe, scope, (x, extra), (y, h) = trained
    static.save_inference_model(str(tmp_path / "m"), [h, extra], [y], exe)
    model = load_model(str(tmp_path / "m"))
    assert model.feed_names == [h.name, "extra"]
    assert "fc_0.w_0" not in model.params and "x" not in model.program.global_block().vars
    hv, ev = RNG.standard_normal((2, 16)).astype("float32"), _inputs(2)[1]
    sc = fluid.Scope()
    for n, v in model.params.items():
        sc.var(n).value = v
    (out,) = fluid.Executor().run(model.program, feed={h.name: hv, "extra": ev}, scope=sc)
    w1, b1 = model.params["fc_1.w_0"], model.params["fc_1.b_0"]
    np.testing.assert_allclose(out, _softmax((hv + ev) @ w1 + b1), rtol=1e-5, atol=1e-6)


def test_save_errors(trained, tmp_path):
    main, exe, scope, (x, extra), (y, h) = trained
    with pytest.raises(ValueError, match="'nope' is not in the program"):
        static.save_inference_model(str(tmp_path / "m"), ["nope"], [y], exe)
    with pytest.raises(ValueError, match="targets.*empty"):
        static.save_inference_model(str(tmp_path / "m"), [x], [], exe)
    with pytest.raises(ValueError, match="not a directory"):
        static.save_inference_model(str(tmp_path), [x], [y], exe)
    with _fresh_scope(), pytest.raises(ValueError, match="fc_0.b_0.*no value in the scope"):
        static.save_inference_model(str(tmp_path / "m"), [x, extra], [y], exe)
    assert not os.listdir(tmp_path)  # nothing half-written


def _damage_cases(tmp_path, trained):
    main, exe, scope, (x, extra), (y, h) = trained
    static.save_inference_model(str(tmp_path / "m"), [x, extra], [y], exe)
    model = (tmp_path / "m.pdmodel").read_bytes()
    params = (tmp_path / "m.pdiparams").read_bytes()
    return model, params


@pytest.mark.parametrize("case", ["model_truncated", "model_garbage", "model_missing",
                                  "params_short", "params_long", "params_missing",
                                  "params_other_model", "params_bad_dtype"])
def test_damaged_models_are_named_errors_and_load_nothing(trained, tmp_path, case):
    model, params = _damage_cases(tmp_path, trained)
    files = {"m.pdmodel": model, "m.pdiparams": params}
    if case == "model_truncated":
        files["m.pdmodel"], match = model[:len(model) // 2], r"m\.pdmodel"
    elif case == "model_garbage":
        files["m.pdmodel"], match = bytes(RNG.integers(0, 256, 300, dtype=np.uint8)), \
            r"m\.pdmodel"
    elif case == "model_missing":
        del files["m.pdmodel"]
        match = r"m\.pdmodel"
    elif case == "params_short":
        files["m.pdiparams"], match = params[:-5], r"m\.pdiparams.*truncated.*fc_1\.w_0"
    elif case == "params_long":
        files["m.pdiparams"], match = params + b"\0" * 12, r"m\.pdiparams: 12 bytes left"
    elif case == "params_missing":
        del files["m.pdiparams"]
        match = r"m\.pdiparams"
    elif case == "params_other_model":  # the tensors of another shape, in the same order
        w = fluid.io.write_tensor
        files["m.pdiparams"] = b"".join([w(np.zeros(16, "float32")), w(np.zeros((8, 15),
                                         "float32")), w(np.zeros(4, "float32")),
                                         w(np.zeros((16, 4), "float32"))])
        match = r"'fc_0\.w_0' has shape \[8, 16\] in the program, the file holds \[8, 15\]"
    else:  # float64 where the program declares float32
        w = fluid.io.write_tensor
        files["m.pdiparams"] = w(np.zeros(16, "float64")) + params[24 + 64:]
        match = r"'fc_0\.b_0' is float32 in the program, the file holds float64"
    for p in tmp_path.iterdir():
        p.unlink()
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with _fresh_scope() as sc:
        sc.var("fc_0.w_0").value = sentinel = np.full((8, 16), 7.0, "float32")
        with pytest.raises(ModelFileError, match=match):
            static.load_inference_model(str(tmp_path / "m"), fluid.Executor())
        with pytest.raises(ModelFileError, match=match):
            inference.create_predictor(inference.Config(str(tmp_path / "m.pdmodel"),
                                                        str(tmp_path / "m.pdiparams")))
        assert sc.find_var("fc_0.w_0").value is sentinel  # nothing half-loaded
        assert sc.find_var("fc_1.w_0") is None


def test_missing_per_variable_file(trained, tmp_path):
    main, exe, scope, (x, extra), (y, h) = trained
    d = tmp_path / "dir"
    fluid.io.save_inference_model(str(d), ["x", "extra"], [y], exe, main_program=main)
    (d / "fc_1.b_0").unlink()
    with _fresh_scope() as sc, pytest.raises(ModelFileError, match=r"'fc_1\.b_0'.*fc_1\.b_0"):
        fluid.io.load_inference_model(str(d), exe)
    assert sc.find_var("fc_0.w_0") is None


def _predictor(trained, tmp_path, **cfg):
    main, exe, scope, (x, extra), (y, h) = trained
    static.save_inference_model(str(tmp_path / "m"), [x, extra], [y], exe)
    config = inference.Config(str(tmp_path / "m.pdmodel"), str(tmp_path / "m.pdiparams"))
    for k, v in cfg.items():
        getattr(config, k)(v)
    return inference.create_predictor(config), scope


def test_predictor_handles_and_shortcut(trained, tmp_path):
    pred, scope = _predictor(trained, tmp_path)  # the inference passes remove the dropout
    assert pred.get_input_names() == ["x", "extra"]
    (out_name,) = pred.get_output_names()
    xv, ev = _inputs(5)
    want, _ = _forward(scope, xv, ev)
    for name, value in zip(pred.get_input_names(), (xv, ev)):
        handle = pred.get_input_handle(name)
        assert handle.type() == inference.DataType.FLOAT32 and handle.shape()[1:] == \
            list(value.shape[1:])
        handle.reshape(value.shape)
        handle.copy_from_cpu(value)
    xv[:] = 0  # copy_from_cpu copied
    assert pred.run() is True
    out = pred.get_output_handle(out_name).copy_to_cpu()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert pred.get_output_handle(out_name).shape() == [5, 4]
    (again,) = pred.run([xv, ev])
    np.testing.assert_allclose(again, _forward(scope, xv, ev)[0], rtol=1e-5, atol=1e-6)
    plans = list(pred._exe._plans.values())
    assert "dropout" not in [op.type for op in pred.program().global_block().ops]
    steps = [s for _, plan in plans for s in plan.steps]
    assert steps and all(s.kind == "native" for s in steps)


def test_predictor_rejects_bad_inputs_before_running(trained, tmp_path):
    pred, _ = _predictor(trained, tmp_path, switch_ir_optim=False)
    with pytest.raises(KeyError, match=r"no input 'y'.*\['x', 'extra'\]"):
        pred.get_input_handle("y")
    with pytest.raises(KeyError, match="no output"):
        pred.get_output_handle("x")
    h = pred.get_input_handle("x")
    with pytest.raises(FeedError, match="'x'.*float32.*float64"):
        h.copy_from_cpu(np.zeros((2, 8)))
    with pytest.raises(FeedError, match=r"'x'.*\[2, 7\]"):
        h.copy_from_cpu(np.zeros((2, 7), "float32"))
    with pytest.raises(FeedError, match=r"'x': shape \[2, 9\] does not fit"):
        h.reshape([2, 9])
    h.reshape([2, 8])
    with pytest.raises(FeedError, match=r"shape \[3, 8\], reshape\(\) said \[2, 8\]"):
        h.copy_from_cpu(np.zeros((3, 8), "float32"))
    h.copy_from_cpu(np.zeros((2, 8), "float32"))
    with pytest.raises(FeedError, match=r"no data for input\(s\) \['extra'\]"):
        pred.run()
    with pytest.raises(FeedError, match="expected a list of 2 arrays"):
        pred.run([np.zeros((2, 8), "float32")])
    with pytest.raises(RuntimeError, match="run the predictor first"):
        pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu()
    with pytest.raises(ModelFileError, match="no model"):
        inference.create_predictor(inference.Config(str(tmp_path / "nothing")))


def test_predictor_clones_run_in_threads(trained, tmp_path):
    pred, scope = _predictor(trained, tmp_path, switch_ir_optim=False)
    inputs = [_inputs(n) for n in (1, 2, 3, 4)]
    results, errors = {}, []

    def work(k, p):
        try:
            for _ in range(20):
                results[k] = p.run(list(inputs[k]))[0]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=work, args=(k, pred.clone() if k else pred))
          for k in range(len(inputs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for k, (xv, ev) in enumerate(inputs):
        np.testing.assert_allclose(results[k], _forward(scope, xv, ev)[0], rtol=1e-5,
                                   atol=1e-6)


_PADDLE_LOAD = r'''
import os, pickle, sys
os.environ["FLAGS_enable_pir_api"] = "0"
import numpy as np, paddle
paddle.enable_static()
exe = paddle.static.Executor(paddle.CPUPlace())
prefix, feed = pickle.load(open(sys.argv[1], "rb"))
out = {}
prog, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
out["prefix"] = (feeds, exe.run(prog, feed=feed, fetch_list=fetches))
prog, feeds, fetches = paddle.static.load_inference_model(prefix + "_dir", exe,
                                                          model_filename="__model__")
out["dir"] = (feeds, exe.run(prog, feed=feed, fetch_list=fetches))
pickle.dump(out, open(sys.argv[2], "wb"))
'''


@pytest.mark.paddle
def test_paddle_loads_what_pdjit_saved(trained, tmp_path):
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    main, exe, scope, (x, extra), (y, h) = trained
    prefix = str(tmp_path / "m")
    static.save_inference_model(prefix, [x, extra], [y, h], exe)
    fluid.io.save_inference_model(prefix + "_dir", ["x", "extra"], [y, h], exe,
                                  main_program=main)
    xv, ev = _inputs(3)
    (tmp_path / "in.pkl").write_bytes(pickle.dumps((prefix, {"x": xv, "extra": ev})))
    (tmp_path / "run.py").write_text(_PADDLE_LOAD)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "in.pkl"),
                           str(tmp_path / "out.pkl")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = pickle.loads((tmp_path / "out.pkl").read_bytes())
    want, want_h = _forward(scope, xv, ev)
    for form in ("prefix", "dir"):
        feeds, (out, hid) = got[form]
        assert feeds == ["x", "extra"]
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(hid, want_h, rtol=1e-5, atol=1e-6)


def test_a_loop_updating_the_fed_value_is_kept(fresh_programs, tmp_path):
    """Pruning drops the producers of a fed value, never an op that updates it in place (a
    ``while`` carrying the fed variable)."""
    x = fluid.data("x", [-1, 3], "float32")
    i = fluid.layers.fill_constant([1], "int64", 0)
    n = fluid.layers.fill_constant([1], "int64", 3)
    _, h = fluid.layers.while_loop(lambda i, h: fluid.layers.less_than(i, n),
                                   lambda i, h: [i + 1, h * 2.0], [i, x])
    y = fluid.layers.scale(h, 1.0, bias=1.0)
    exe = fluid.Executor()
    xv = RNG.standard_normal((2, 3)).astype("float32")
    static.save_inference_model(str(tmp_path / "m"), [x], [y], exe, program=fresh_programs[0])
    program, feeds, fetches = static.load_inference_model(str(tmp_path / "m"), exe)
    assert "while" in [op.type for op in program.global_block().ops]
    (out,) = exe.run(program, feed={"x": xv}, fetch_list=fetches)
    np.testing.assert_allclose(out, xv * 8 + 1, rtol=1e-6)


def test_predictor_native_drivers(trained, tmp_path, counted_trials):
    """With native drivers (the Predictor's default; the suite turns the default off), every
    step has its driver compiled as one function on a thread of its own, started after the
    step's second run (no run compiles it), and then keeps the faster driver per batch size;
    the answers stay the NumPy forward pass."""
    pred, scope = _predictor(trained, tmp_path, switch_native_drivers=True)
    assert pred._exe.native_drivers == "background"

    def runs(n):
        for _ in range(n):
            xv, ev = _inputs(2)
            (out,) = pred.run([xv, ev])
            np.testing.assert_allclose(out, _forward(scope, xv, ev)[0], rtol=1e-5, atol=1e-6)

    runs(1)
    steps = [s for _, plan in pred._exe._plans.values() for s in plan.steps]
    assert steps and all(s.kind == "native" and s.tiers.tiering is None for s in steps)
    runs(1)
    assert all(s.tiers.tiering is not None for s in steps)
    for s in steps:
        s.tiers.tiering.join(300)
    runs(8)   # 4 trial runs of each driver
    assert all(s.native is not None for s in steps), [s.describe() for s in steps]
    assert all(list(s.tiers.picked) == [2] and s.native.fn.signatures for s in steps)
