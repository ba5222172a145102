"""Checkpoints: ``fluid.save``/``fluid.load``, ``load_program_state``/``set_program_state``,
``fluid.io.save_params``/``load_params``.

Oracles: files PaddlePaddle 3.3.1 wrote (``tests/fixtures/paddle/checkpoint``, see
``make_checkpoint_fixtures.py``: its values, its split of names between ``.pdparams`` and
``.pdopt``, its losses after the save), PaddlePaddle itself loading pdjit's files (marked
``paddle``), and an uninterrupted pdjit run for the resumed one. Every run is strict (native code
must not fall back to the references).
"""
import importlib.util
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import ModelFileError
from pdjit.testing import assert_native

CKPT = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "paddle", "checkpoint")
PADDLE_PREFIX = os.path.join(CKPT, "mlp_adam")
STEPS = 10
PARAMS = ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]


def build_model():
    """The fixtures' model: x[-1,3] -> fc 4 relu -> fc 1, loss mean((pred - y)^2), Adam(0.05).
    Returns (main, startup, loss)."""
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 7
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 3], "float32")
        y = fluid.data("y", [-1, 1], "float32")
        h = fluid.layers.fc(x, 4, act="relu")
        pred = fluid.layers.fc(h, 1)
        diff = pred - y
        loss = fluid.layers.mean(diff * diff)
        fluid.optimizer.Adam(learning_rate=0.05).minimize(loss)
    return main, startup, loss


def batches(n=STEPS):
    rng = np.random.RandomState(0)
    return [(rng.uniform(-1, 1, (4, 3)).astype("float32"),
             rng.uniform(-1, 1, (4, 1)).astype("float32")) for _ in range(n)]


def train(exe, main, loss, scope, data):
    out = []
    for xv, yv in data:
        (lv,) = exe.run(main, feed={"x": xv, "y": yv}, fetch_list=[loss], scope=scope)
        out.append(np.asarray(lv).copy())
    return out


@pytest.fixture(scope="module")
def trained():
    """The model trained 3 steps in its own scope: (main, startup, loss, exe, scope)."""
    main, startup, loss = build_model()
    exe, scope = fluid.Executor(fluid.CPUPlace(), strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    train(exe, main, loss, scope, batches(3))
    return main, startup, loss, exe, scope


def scope_value(scope, name):
    return np.asarray(scope.find_var(name).value)


def fresh_scope(main, startup, exe):
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    return scope


# -- resuming -------------------------------------------------------------------------------------
_RESUME = r'''
import importlib.util, sys
import numpy as np
import pdjit as fluid
spec = importlib.util.spec_from_file_location("ckpt_test", sys.argv[1])
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
main, startup, loss = t.build_model()
exe = fluid.Executor(fluid.CPUPlace(), strict=True)
fluid.load(main, sys.argv[2], exe)
losses = t.train(exe, main, loss, fluid.global_scope(), t.batches()[5:])
from pdjit.testing import assert_native
assert_native(exe)
np.save(sys.argv[3], np.stack(losses))
'''


def test_resume_in_a_new_process_continues_the_loss_curve_exactly(tmp_path):
    main, startup, loss = build_model()
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    data = batches()
    whole = fluid.Scope()
    exe.run(startup, scope=whole)
    init = {v.name: scope_value(whole, v.name).copy()
            for v in fluid.io.get_program_persistable_vars(main)}
    straight = train(exe, main, loss, whole, data)

    first = fluid.Scope()  # the same start, as saved state
    fluid.set_program_state(main, init, scope=first)
    head = train(exe, main, loss, first, data[:5])
    assert np.array_equal(np.stack(head), np.stack(straight[:5]))
    prefix = str(tmp_path / "ckpt" / "model")
    with fluid.scope_guard(first):
        fluid.save(main, prefix)
    assert_native(exe)

    (tmp_path / "resume.py").write_text(_RESUME)
    proc = subprocess.run([sys.executable, str(tmp_path / "resume.py"), __file__, prefix,
                           str(tmp_path / "tail.npy")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tail = np.load(tmp_path / "tail.npy")
    assert tail.shape == (5, 1) and tail.dtype == np.float32  # five [1]-shaped losses
    # bit for bit: moments, beta powers and the learning rate all came back
    assert np.array_equal(tail, np.stack(straight[5:])), (tail, straight[5:])


# -- against PaddlePaddle's files -----------------------------------------------------------------
def _paddle_meta():
    with open(PADDLE_PREFIX + ".json") as f:
        return json.load(f)


def test_files_split_as_paddle_splits_them(trained, tmp_path):
    main, _, _, _, scope = trained
    prefix = str(tmp_path / "m")
    fluid.save(main, prefix, scope=scope)
    meta = _paddle_meta()
    for suffix, names in ((".pdparams", meta["pdparams_names"]),
                          (".pdopt", meta["pdopt_names"])):
        raw = open(prefix + suffix, "rb").read()
        assert raw[:2] == b"\x80\x04"  # a protocol-4 pickle
        state = pickle.loads(raw)
        assert sorted(state) == names
        for n, v in state.items():
            assert type(v) is np.ndarray
            assert v.dtype == scope_value(scope, n).dtype
            assert np.array_equal(v, scope_value(scope, n)), n
    assert open(prefix + ".pdmodel", "rb").read() == main.serialize_to_string()
    # a CompiledProgram saves and loads as its program
    compiled = fluid.CompiledProgram(main)
    fluid.save(compiled, prefix + "_c", scope=scope)
    assert open(prefix + "_c.pdparams", "rb").read() == open(prefix + ".pdparams", "rb").read()
    copy = fluid.Scope()
    fluid.load(compiled, prefix + "_c", scope=copy)
    assert np.array_equal(scope_value(copy, "fc_0.w_0"), scope_value(scope, "fc_0.w_0"))


def test_paddle_checkpoint_loads_and_training_continues_as_in_paddle(trained):
    """Paddle's .pdmodel and checkpoint, and the same checkpoint into pdjit's own program: the
    next two losses are Paddle's."""
    npz = np.load(os.path.join(CKPT, "mlp_adam_steps.npz"))
    state = fluid.io.load_program_state(PADDLE_PREFIX)
    assert sorted(state) == sorted(_paddle_meta()["pdparams_names"] +
                                   _paddle_meta()["pdopt_names"])
    for n, v in state.items():
        want = npz["state/" + n]
        assert v.dtype == want.dtype and v.shape == want.shape and np.array_equal(v, want), n

    with open(PADDLE_PREFIX + ".pdmodel", "rb") as f:
        paddle_prog = fluid.Program.parse_from_string(f.read())
    main, _, loss, exe, _ = trained
    for prog, fetch in ((paddle_prog, "mean_0.tmp_0"), (main, loss)):
        scope = fluid.Scope()
        fluid.load(prog, PADDLE_PREFIX + ".pdparams", exe, scope=scope)
        got = [exe.run(prog, feed={"x": npz[f"x{i}"], "y": npz[f"y{i}"]}, fetch_list=[fetch],
                       scope=scope)[0] for i in (3, 4)]
        np.testing.assert_allclose(np.stack(got).reshape(-1), npz["loss"][3:], rtol=2e-5)
    assert_native(exe)


_PADDLE_LOAD = r'''
import os, pickle, sys
os.environ["FLAGS_enable_pir_api"] = "0"
import numpy as np, paddle
paddle.enable_static()
prefix, xv, yv = pickle.load(open(sys.argv[1], "rb"))
main, start = paddle.static.Program(), paddle.static.Program()
with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, start):
    x = paddle.static.data("x", [-1, 3], "float32")
    y = paddle.static.data("y", [-1, 1], "float32")
    pred = paddle.static.nn.fc(paddle.static.nn.fc(x, 4, activation="relu"), 1)
    diff = pred - y
    loss = paddle.mean(diff * diff)
    paddle.optimizer.Adam(learning_rate=0.05).minimize(loss)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(start)
paddle.static.load(main, prefix, exe)
state = paddle.static.load_program_state(prefix)
(lv,) = exe.run(main, feed={"x": xv, "y": yv}, fetch_list=[loss])
pickle.dump((state, np.asarray(lv)), open(sys.argv[2], "wb"))
'''


@pytest.mark.paddle
def test_paddle_loads_what_pdjit_saved(trained, tmp_path):
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed")
    main, startup, loss, exe, scope = trained
    prefix = str(tmp_path / "m")
    fluid.save(main, prefix, scope=scope)
    xv, yv = batches(4)[3]
    (tmp_path / "in.pkl").write_bytes(pickle.dumps((prefix, xv, yv)))
    (tmp_path / "run.py").write_text(_PADDLE_LOAD)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "in.pkl"),
                           str(tmp_path / "out.pkl")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state, paddle_loss = pickle.loads((tmp_path / "out.pkl").read_bytes())
    assert len(state) == 21
    for n, v in state.items():
        assert np.array_equal(v, scope_value(scope, n)), n
    # the next step from the same state, in pdjit (on a copy of the state)
    copy = fluid.Scope()
    fluid.load(main, prefix, scope=copy)
    (lv,) = exe.run(main, feed={"x": xv, "y": yv}, fetch_list=[loss], scope=copy)
    np.testing.assert_allclose(lv, paddle_loss, rtol=2e-5)


# -- load_program_state / set_program_state -------------------------------------------------------
def test_program_state_round_trip_and_subsets(trained, tmp_path):
    main, startup, _, exe, scope = trained
    prefix = str(tmp_path / "m")
    fluid.save(main, prefix, scope=scope)
    state = fluid.io.load_program_state(prefix + ".pdopt")  # any of the three names works
    persistables = [v.name for v in fluid.io.get_program_persistable_vars(main)]
    assert sorted(state) == sorted(persistables)
    assert sorted(v.name for v in fluid.io.get_program_parameter(main)) == PARAMS

    target = fresh_scope(main, startup, exe)
    assert not np.array_equal(scope_value(target, "fc_0.w_0"), state["fc_0.w_0"])
    fluid.set_program_state(main, state, scope=target)
    for n in persistables:
        got = scope_value(target, n)
        assert got.dtype == state[n].dtype and np.array_equal(got, state[n]), n

    # a subset: only the named variables change
    sub = fluid.io.load_program_state(prefix, var_list=[main.global_block().var("fc_1.w_0"),
                                                         "learning_rate_0"])
    assert sorted(sub) == ["fc_1.w_0", "learning_rate_0"]
    other = fresh_scope(main, startup, exe)
    before = scope_value(other, "fc_0.w_0").copy()
    fluid.set_program_state(main, sub, scope=other)
    assert np.array_equal(scope_value(other, "fc_1.w_0"), state["fc_1.w_0"])
    assert np.array_equal(scope_value(other, "fc_0.w_0"), before)

    # load with var_list: the parameters only, from the .pdparams file alone
    only = fresh_scope(main, startup, exe)
    m1 = scope_value(only, "fc_0.w_0_moment1_0").copy()
    fluid.load(main, prefix, var_list=[main.global_block().var(n) for n in PARAMS], scope=only)
    for n in PARAMS:
        assert np.array_equal(scope_value(only, n), state[n])
    assert np.array_equal(scope_value(only, "fc_0.w_0_moment1_0"), m1)

    with pytest.warns(UserWarning, match="not_in_program"):
        fluid.set_program_state(main, {"not_in_program": np.zeros(1)}, scope=other)


def test_set_program_state_checks_shape_and_dtype(trained):
    main, startup, _, exe, _ = trained
    scope = fresh_scope(main, startup, exe)
    before = scope_value(scope, "fc_0.b_0").copy()
    bad = {"fc_0.b_0": np.ones(4, "float32") * 9, "fc_0.w_0": np.zeros((4, 3), "float32")}
    with pytest.raises(ValueError, match=r"'fc_0\.w_0' has shape \[3, 4\].*holds \[4, 3\]"):
        fluid.set_program_state(main, bad, scope=scope)
    assert np.array_equal(scope_value(scope, "fc_0.b_0"), before)  # nothing was set
    with pytest.raises(ValueError, match=r"'fc_0\.b_0' is float32.*holds float64"):
        fluid.set_program_state(main, {"fc_0.b_0": np.zeros(4)}, scope=scope)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        fluid.set_program_state(main, [1, 2], scope=scope)


# -- save_params / load_params and the save_vars fallbacks ----------------------------------------
def test_save_params_and_the_save_vars_fallbacks(trained, tmp_path):
    main, startup, _, exe, scope = trained
    d = str(tmp_path / "params")
    fluid.io.save_params(exe, d, main_program=main, scope=scope)
    assert sorted(os.listdir(d)) == PARAMS  # the parameters, not the optimizer state
    fluid.io.save_params(exe, d + "_one", main_program=main, filename="all", scope=scope)
    assert os.listdir(d + "_one") == ["all"]

    for kw in ({"dirname": d}, {"dirname": d + "_one", "filename": "all"}):
        target = fresh_scope(main, startup, exe)
        fluid.io.load_params(exe, main_program=main, scope=target, **kw)
        for n in PARAMS:
            assert np.array_equal(scope_value(target, n), scope_value(scope, n)), n

    # load / load_program_state read what save_vars & co. wrote
    pd = str(tmp_path / "persist")
    fluid.io.save_persistables(exe, pd, main_program=main, scope=scope)
    target = fresh_scope(main, startup, exe)
    fluid.load(main, pd, exe, scope=target)
    names = [v.name for v in fluid.io.get_program_persistable_vars(main)]
    for n in names:
        assert np.array_equal(scope_value(target, n), scope_value(scope, n)), n
    state = fluid.io.load_program_state(pd)
    assert sorted(state) == sorted(names)
    state = fluid.io.load_program_state(d + "_one/all",
                                        var_list=[main.global_block().var(n) for n in PARAMS])
    assert sorted(state) == PARAMS
    assert all(np.array_equal(state[n], scope_value(scope, n)) for n in PARAMS)
    target = fresh_scope(main, startup, exe)
    fluid.load(main, d + "_one/all", exe, var_list=[main.global_block().var(n) for n in PARAMS],
               scope=target)
    assert np.array_equal(scope_value(target, "fc_1.w_0"), scope_value(scope, "fc_1.w_0"))
    with pytest.raises(ValueError, match="var_list must say"):
        fluid.io.load_program_state(d + "_one/all")


# -- bad files ------------------------------------------------------------------------------------
class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvalEvil:
    def __reduce__(self):
        return (eval, ("1 + 1",))


def test_a_pickle_asking_for_other_globals_is_refused_and_runs_nothing(trained, tmp_path):
    main, startup, _, exe, _ = trained
    marker = tmp_path / "pwned"
    cases = {"os": ({"fc_0.w_0": _Evil(marker)}, r"os\.system|posix\.system"),
             "eval": ({"fc_0.w_0": _EvalEvil()}, r"builtins\.eval"),
             "object": ({"fc_0.w_0": np.array([1, None], dtype=object)}, r"dtype 'O8'|'O'"),
             "set": ({"fc_0.w_0": {1, 2}}, r"builtins\.set|set")}
    for name, (obj, match) in cases.items():
        prefix = tmp_path / name
        (tmp_path / f"{name}.pdparams").write_bytes(pickle.dumps(obj, protocol=4))
        with pytest.raises(ModelFileError, match=match) as e:
            fluid.io.load_program_state(str(prefix))
        assert f"{name}.pdparams" in str(e.value) and "refused" in str(e.value)
        scope = fresh_scope(main, startup, exe)
        with pytest.raises(ModelFileError, match="refused"):
            fluid.load(main, str(prefix), scope=scope)
    assert not marker.exists()
    # admitted globals misused: numpy.ndarray called directly with a huge shape, numpy.dtype as
    # a class (NEWOBJ), BUILD setting attributes on an admitted function
    for raw in (b"\x80\x02}U\x01wcnumpy\nndarray\nJ@B\x0f\x00J@B\x0f\x00\x86\x85Rs.",
                b"\x80\x02}U\x01wcnumpy\ndtype\n)\x81s.",
                b"\x80\x02}U\x01wcnumpy._core.multiarray\n_reconstruct\nN}U\x01xK\x01s\x86bs."):
        (tmp_path / "misuse.pdparams").write_bytes(raw)
        with pytest.raises(ModelFileError, match=r"misuse\.pdparams: (damaged|refused)"):
            fluid.io.load_program_state(str(tmp_path / "misuse"))


class _HandMadeArray:
    """Pickles as NumPy's reconstruction of an array with the given state, true or not."""

    def __init__(self, shape, data: bytes):
        self.shape, self.data = tuple(shape), data

    def __reduce__(self):
        rebuild = np.zeros(1).__reduce__()[0]  # numpy's own _reconstruct
        return (rebuild, (np.ndarray, (0,), b"b"),
                (1, self.shape, np.dtype("float32"), False, self.data))


def _array_pickle(shape_claim, data: bytes) -> bytes:
    return pickle.dumps({"w": _HandMadeArray(shape_claim, data)}, protocol=2)


def test_mutated_pickles_give_only_model_file_errors(tmp_path):
    """Seeded mutations (bit flips, truncation, duplicated spans, random bytes) of a Paddle-written
    .pdopt and of a protocol-2 pickle: each loads or is a ModelFileError; a memo index far past
    the table (which would make the unpickler allocate gigabytes) is refused."""
    import random
    bases = [open(PADDLE_PREFIX + ".pdopt", "rb").read(),
             pickle.dumps({"a": np.arange(6, dtype=">f4").reshape(2, 3), "b": np.float64(2),
                           "c": [1, "x", (2.0, None)]}, protocol=2)]
    rng, path, outcomes = random.Random(0), tmp_path / "f.pdparams", {}
    for _ in range(250):
        data = bytearray(rng.choice(bases))
        kind = rng.randrange(4)
        j = rng.randrange(len(data))
        if kind == 0:
            data[j] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data = data[:j]
        elif kind == 2:
            data[j:j] = data[j:j + rng.randint(1, 16)]
        else:
            data[j] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            assert isinstance(fluid.io.load_program_state(str(tmp_path / "f")), dict)
            outcomes["loaded"] = outcomes.get("loaded", 0) + 1
        except ModelFileError as e:
            assert "f.pdparams" in str(e)
            outcomes["refused"] = outcomes.get("refused", 0) + 1
    assert outcomes["loaded"] > 10 and outcomes["refused"] > 150, outcomes
    path.write_bytes(b"\x80\x02}r\xff\xff\xff\x7f.")  # LONG_BINPUT 2**31 - 1
    with pytest.raises(ModelFileError, match=r"refused to load a memo index 2147483647"):
        fluid.io.load_program_state(str(tmp_path / "f"))


def test_damaged_files_are_named_errors(trained, tmp_path):
    main, startup, _, exe, scope = trained
    prefix = str(tmp_path / "m")
    fluid.save(main, prefix, scope=scope)
    target = fresh_scope(main, startup, exe)
    before = scope_value(target, "fc_0.w_0").copy()

    with pytest.raises(ModelFileError, match=r"no checkpoint at .*nowhere"):
        fluid.load(main, str(tmp_path / "nowhere"), scope=target)
    with pytest.raises(ModelFileError, match=r"no checkpoint at .*nowhere"):
        fluid.io.load_program_state(str(tmp_path / "nowhere"))

    raw = open(prefix + ".pdparams", "rb").read()
    cut = str(tmp_path / "cut")
    open(cut + ".pdparams", "wb").write(raw[:len(raw) // 2])
    with pytest.raises(ModelFileError, match=r"cut\.pdparams: damaged or truncated pickle"):
        fluid.load(main, cut, scope=target)

    state = pickle.loads(raw)
    for label, change, match in (
            ("shape", np.zeros((4, 3), "float32"),
             r"'fc_0\.w_0' has shape \[3, 4\] in the program, the file holds \[4, 3\]"),
            ("dtype", np.zeros((3, 4), "float64"),
             r"'fc_0\.w_0' is float32 in the program, the file holds float64"),
            ("missing", None, r"no value for variable 'fc_0\.w_0'")):
        bad = dict(state)
        if change is None:
            del bad["fc_0.w_0"]
        else:
            bad["fc_0.w_0"] = change
        p = str(tmp_path / label)
        open(p + ".pdparams", "wb").write(pickle.dumps(bad, protocol=4))
        open(p + ".pdopt", "wb").write(open(prefix + ".pdopt", "rb").read())
        with pytest.raises(ModelFileError, match=match) as e:
            fluid.load(main, p, scope=target)
        assert f"{label}.pdparams" in str(e.value)

    os.remove(prefix + ".pdopt")
    with pytest.raises(ModelFileError, match=r"no such file: .*m\.pdopt"):
        fluid.load(main, prefix, scope=target)
    assert np.array_equal(scope_value(target, "fc_0.w_0"), before)  # every failure changed nothing

    # a pickle that claims a huge array with a few bytes of data allocates nothing
    huge = str(tmp_path / "huge")
    open(huge + ".pdparams", "wb").write(_array_pickle((10 ** 6, 10 ** 6), b"\0" * 16))
    with pytest.raises(ModelFileError, match=r"shape \[1000000, 1000000\].*16 bytes"):
        fluid.io.load_program_state(huge)
    open(huge + ".pdparams", "wb").write(_array_pickle((2, 2), b"\0" * 16))
    assert fluid.io.load_program_state(huge)["w"].shape == (2, 2)  # the hand-made pickle is valid


def test_save_arguments_and_protocol_2_slicing(trained, tmp_path, monkeypatch):
    main, _, _, _, scope = trained
    with pytest.raises(ValueError, match=r"protocol must be an int in \[2, 4\], got 5"):
        fluid.save(main, str(tmp_path / "m"), protocol=5, scope=scope)
    with pytest.raises(ValueError, match="non-empty prefix"):
        fluid.save(main, str(tmp_path) + os.sep, scope=scope)
    with pytest.raises(ValueError, match=r"'fc_0\.w_0' has no value in the scope"):
        fluid.save(main, str(tmp_path / "m"), scope=fluid.Scope())
    # protocol 2 slices big arrays as PaddlePaddle does; loading joins them
    from pdjit.io import checkpoint
    monkeypatch.setattr(checkpoint, "_MAX_PART_BYTES", 20)  # 5 float32 per slice
    prefix = str(tmp_path / "p2")
    fluid.save(main, prefix, protocol=2, scope=scope)
    raw = pickle.loads(open(prefix + ".pdparams", "rb").read())
    assert raw["UnpackBigParamInfor@@"]["fc_0.w_0"]["slices"] == [f"fc_0.w_0@@.{i}"
                                                                  for i in range(3)]
    # numpy 1.x names its reconstructor numpy.core.multiarray (files of Fluid 1.x days)
    old = open(prefix + ".pdparams", "rb").read().replace(b"numpy._core.", b"numpy.core.")
    open(prefix + ".pdparams", "wb").write(old)
    state = fluid.io.load_program_state(prefix)
    assert "UnpackBigParamInfor@@" not in state
    for n in PARAMS:
        assert np.array_equal(state[n], scope_value(scope, n)), n


def test_static_spells_the_checkpoint_functions_as_paddle_2():
    import pdjit.static as static

    assert (static.save, static.load, static.load_program_state, static.set_program_state) == \
        (fluid.save, fluid.load, fluid.io.load_program_state, fluid.io.set_program_state)
