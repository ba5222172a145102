"""Fluid 1.x scripts run unchanged: [1]-shaped scalar results, the 1.x module paths and helpers
(profiler, require_version, places), and Fluid's leniencies (bias_attr=True, a data variable
declared twice, LoD feeds, seeded random ops that repeat on every run)."""
import os

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import LayerInputError
from pdjit.testing import assert_native

HERE = os.path.basename(__file__)
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "paddle")


def _scalars_program():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 5
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [4])
        label = fluid.layers.data("label", [1], dtype="int64")
        prob = fluid.layers.fc(x, 3, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(prob, label))
        total = fluid.layers.reduce_sum(x)                       # dim=None
        biggest = fluid.layers.reduce_max(x, dim=[0, 1])          # every dim listed
        acc = fluid.layers.accuracy(prob, label)
        cost = loss + fluid.layers.reduce_mean(prob) * 0.0        # [1] + [1]
        fluid.optimizer.SGD(0.5).minimize(cost)
    return main, startup, (x, label, prob), (loss, total, biggest, acc, cost)


def test_scalar_results_are_declared_and_fetched_with_fluid1_shape():
    main, startup, _, outs = _scalars_program()
    for v in outs:
        assert v.shape == (1,), (v.name, v.shape)
    rng = np.random.default_rng(0)
    xv = rng.normal(size=(6, 4)).astype(np.float32)
    lv = rng.integers(0, 3, (6, 1)).astype(np.int64)
    got = {}
    for mode in ("compiled", "reference"):
        exe, scope = fluid.Executor(fluid.CPUPlace(), mode=mode, strict=True), fluid.Scope()
        exe.run(startup, scope=scope)
        w = np.array(scope.find_var("fc_0.w_0").value, np.float64)
        b = np.array(scope.find_var("fc_0.b_0").value, np.float64)
        runs = [exe.run(main, feed={"x": xv, "label": lv}, fetch_list=list(outs), scope=scope)
                for _ in range(3)]
        for r in runs:
            assert [a.shape for a in r] == [(1,)] * 5
        loss, total, biggest, acc, cost = runs[0]
        # the script's idioms: index [0], format with %f, float() of the element
        assert "%f" % loss[0] == "%f" % float(cost[0])
        z = xv @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(loss[0], -np.log(p[np.arange(6), lv[:, 0]]).mean(),
                                   rtol=1e-5)
        np.testing.assert_allclose(total[0], xv.astype(np.float64).sum(), rtol=1e-5)
        assert biggest[0] == xv.max()
        assert acc[0] == pytest.approx(np.mean(p.argmax(1) == lv[:, 0]))
        assert runs[2][0][0] < runs[0][0][0]                      # it trains
        got[mode] = runs
        if mode == "compiled":
            assert_native(exe)
    for a, b in zip(got["compiled"], got["reference"]):
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, rtol=1e-5)


def test_files_keep_the_shapes_they_declare():
    """A PaddlePaddle 3.x program (0-d mean) stays 0-d, and both kinds of program round-trip
    byte for byte."""
    data = open(os.path.join(FIXTURES, "fit_a_line_main.pb"), "rb").read()
    paddle3 = fluid.Program.parse_from_string(data)
    assert paddle3.serialize_to_string() == data
    block = paddle3.global_block()
    mean_out = next(op for op in block.ops if op.type == "reduce_mean").output("Out")[0]
    assert block.var(mean_out).shape == ()
    start = fluid.Program.parse_from_string(
        open(os.path.join(FIXTURES, "fit_a_line_startup.pb"), "rb").read())
    feed = {v.name: np.ones([2 if d < 0 else d for d in v.shape], np.float32)
            for v in block.vars.values() if v.need_check_feed}
    for mode in ("compiled", "reference"):
        exe, scope = fluid.Executor(mode=mode), fluid.Scope()
        exe.run(start, scope=scope)
        got, = exe.run(paddle3, feed=feed, fetch_list=[mean_out], scope=scope)
        assert got.shape == ()                                    # as the file declares
    main = _scalars_program()[0]
    text = main.serialize_to_string()
    again = fluid.Program.parse_from_string(text)
    assert again.serialize_to_string() == text
    loss = next(op for op in again.global_block().ops if op.type == "mean").output("Out")[0]
    assert again.global_block().var(loss).shape == (1,)


def test_a_program_built_op_by_op_keeps_its_0d_results():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.data("x", [None, 3], "float32")
        block = main.global_block()
        s = block.create_var(name="s", dtype="float32")
        block.append_op("reduce_sum", inputs={"X": [x]}, outputs={"Out": [s]},
                        attrs={"dim": [0], "reduce_all": True})
    assert s.shape == ()
    got, = fluid.Executor(strict=True).run(main, feed={"x": np.ones((2, 3), np.float32)},
                                           fetch_list=[s])
    assert got.shape == () and got == 6.0


def test_fluid1_module_paths():
    from pdjit.contrib import layers as contrib_layers
    from pdjit.executor import Executor, global_scope
    from pdjit.framework import Program, Variable, default_main_program, program_guard
    from pdjit.layers.control_flow import While

    assert Executor is fluid.Executor and global_scope is fluid.global_scope
    assert Program is fluid.Program and Variable is fluid.Variable
    assert program_guard is fluid.program_guard and default_main_program is \
        fluid.default_main_program
    assert While is fluid.layers.While
    assert fluid.contrib.layers is contrib_layers
    assert fluid.framework.in_dygraph_mode() is False
    assert callable(fluid.profiler.profiler)


def _table(text):
    """[(event name, [calls, total, min, max, ave, ratio])] of a profiler report."""
    rows = []
    for line in text.splitlines():
        t = line.split()
        if len(t) >= 7 and t[-6].isdigit():
            rows.append((" ".join(t[:-6]), t[-6:]))
    return rows


def test_profiler_tables_the_steps_it_ran(tmp_path):
    main, startup, _, outs = _scalars_program()
    feed = {"x": np.ones((2, 4), np.float32), "label": np.zeros((2, 1), np.int64)}
    exe, scope = fluid.Executor(strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    exe.run(main, feed=feed, fetch_list=[outs[0]], scope=scope)   # compiled before profiling
    path = tmp_path / "profile.txt"
    with fluid.profiler.profiler("CPU", sorted_key="total", profile_path=str(path)):
        for _ in range(3):
            exe.run(main, feed=feed, fetch_list=[outs[0]], scope=scope)
    text = path.read_text()
    rows = _table(text)
    calls = {name: int(r[0]) for name, r in rows}
    # each fusion group of the native driver, and the op run with its reference, per run
    assert calls["sgd"] == 6 and calls["mul"] == 3 and calls["cross_entropy2"] == 3, text
    assert any(name.startswith("fused(") for name in calls), text
    assert all(c % 3 == 0 for c in calls.values()), text
    totals = [float(r[1]) for _, r in rows]
    assert totals == sorted(totals)[::-1]
    assert sum(float(r[-1]) for _, r in rows) == pytest.approx(1.0, abs=2e-3)
    # the reference executor times each op; reset_profiler forgets the runs so far
    ref = fluid.Executor(mode="reference")
    fluid.profiler.start_profiler("All")
    ref.run(main, feed=feed, fetch_list=[outs[0]], scope=scope)
    fluid.profiler.reset_profiler()
    ref.run(main, feed=feed, fetch_list=[outs[0]], scope=scope)
    text = fluid.profiler.stop_profiler("calls", str(path))
    calls = {name: int(r[0]) for name, r in _table(text)}
    assert calls["mean"] == 1 and calls["sgd"] == 2 and calls["mul"] == 1, text
    assert fluid.profiler.stop_profiler() == ""                   # not recording
    with pytest.raises(ValueError, match="state must be one of"):
        fluid.profiler.start_profiler("TPU")
    with pytest.raises(ValueError, match="sorted_key"):
        with fluid.profiler.profiler("CPU", sorted_key="name"):
            pass


def test_profiler_times_a_convolution_with_the_epilogue_it_applies(tmp_path):
    """A convolution that applies its bias and relu as it stores runs in the lines of the
    group of those ops: the profiler times the two groups as one event named after all three
    ops, not the convolution alone (its output allocation) beside the elementwise ops."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [2, 8, 12, 12], append_batch_size=False)
        y = fluid.layers.conv2d(x, 16, 3, padding=1, act="relu")
    exe, scope = fluid.Executor(strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    feed = {"x": np.ones((2, 8, 12, 12), np.float32)}
    exe.run(main, feed=feed, fetch_list=[y], scope=scope)
    assert "(taken by the conv2d" in exe.explain(main, feed=feed, fetch_list=[y])
    path = tmp_path / "profile.txt"
    with fluid.profiler.profiler("CPU", sorted_key="total", profile_path=str(path)):
        for _ in range(4):
            exe.run(main, feed=feed, fetch_list=[y], scope=scope)
    text = path.read_text()
    calls = {name: int(r[0]) for name, r in _table(text)}
    assert calls == {"fused(conv2d+elementwise_add+relu)": 4}, text


def test_require_version_follows_fluid_1_8():
    assert fluid.version.fluid_version.startswith("1.8.")
    fluid.require_version("1.6.0")
    fluid.require_version("1.8")
    fluid.require_version("1.5.0", "1.8.9")
    with pytest.raises(fluid.version.VersionError, match="2.0.0 or higher.*1.8"):
        fluid.require_version("2.0.0")
    with pytest.raises(fluid.version.VersionError, match=r"in \[1.0, 1.7.2\]"):
        fluid.require_version("1.0", "1.7.2")
    with pytest.raises(ValueError, match="up to four numbers"):
        fluid.require_version("1.8.x")
    with pytest.raises(TypeError, match="min_version must be a str"):
        fluid.require_version(1.8)
    with pytest.raises(ValueError, match="below min_version"):
        fluid.require_version("1.8", "1.7")


def test_places(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "3")
    assert fluid.cpu_places() == [fluid.CPUPlace()] * 3
    assert len(fluid.cuda_pinned_places()) == 3
    from pdjit.runtime.place import NoDeviceError, _gpu_count

    with pytest.raises(NoDeviceError, match=r"CUDAPlace\(7\) needs GPU 7, which is not here"):
        fluid.cuda_places([0, 7] if _gpu_count() < 8 else [99])
    if _gpu_count() == 0:
        with pytest.raises(NoDeviceError, match=r"CUDAPlace\(0\).*cpu_places"):
            fluid.cuda_places()
    else:
        assert fluid.cuda_places()[0] == fluid.CUDAPlace(0)


def test_bias_attr_true_and_layer_argument_errors():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [3])
        fluid.layers.fc(x, 2, bias_attr=True, param_attr=True)
        names = sorted(p.name for p in main.global_block().all_parameters())
        assert names == ["fc_0.b_0", "fc_0.w_0"]
        with pytest.raises(LayerInputError) as e:
            fluid.layers.fc(x, 2, bias_attr=3)
        msg = str(e.value)
        assert "fc" in msg and "'bias_attr'" in msg and f"{HERE}:" in msg, msg
        assert isinstance(e.value, TypeError)       # what a Fluid script may catch
        with pytest.raises(LayerInputError, match=rf"conv2d.*{HERE}:\d+"):
            fluid.layers.conv2d(x, num_filters=2, filter_size=3)   # x is not 4-D


def test_data_declared_twice():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        a = fluid.layers.data("img", [3])
        assert fluid.data("img", [None, 3], "float32") is a
        assert fluid.layers.data("img", [3]) is a
        with pytest.raises(LayerInputError) as e:
            fluid.data("img", [None, 4], "float32")
    msg = str(e.value)
    lines = [int(t.split(":")[1].split()[0].rstrip(",")) for t in msg.split(HERE)[1:]]
    assert len(lines) == 2 and lines[0] > lines[1], msg        # the new and the first line
    assert "float32[-1, 4]" in msg and "float32[-1, 3]" in msg


def test_lod_feed_leniencies():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        dense = fluid.data("dense", [None, 2], "float32")            # lod_level 0
        words = fluid.data("words", [None], "int64", lod_level=1)
        d2 = fluid.layers.scale(dense, scale=2.0)
        w2 = fluid.layers.scale(words, scale=3.0)
    exe = fluid.Executor(strict=True)
    dv = np.arange(6, dtype=np.float32).reshape(3, 2)
    ids = np.array([[1], [2], [3], [4]], np.int64)                   # [N, 1], as 1.x readers give
    got_d, got_w = exe.run(main, feed={
        "dense": fluid.create_lod_tensor(dv, [[1, 2]], fluid.CPUPlace()),
        "words": fluid.create_lod_tensor(ids, [[3, 1]], fluid.CPUPlace())},
        fetch_list=[d2, w2], return_numpy=False)
    np.testing.assert_array_equal(np.array(got_d), dv * 2)
    assert got_d.lod() == []                                          # its data only
    np.testing.assert_array_equal(np.array(got_w), ids[:, 0] * 3)
    assert got_w.lod() == [[0, 3, 4]]


def test_seeded_startup_gives_the_same_parameters_every_run():
    main, startup = fluid.Program(), fluid.Program()
    startup.random_seed = 11
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [4])
        fluid.layers.fc(fluid.layers.fc(x, 4), 4)
    exe = fluid.Executor()
    draws = []
    for _ in range(3):
        scope = fluid.Scope()
        exe.run(startup, scope=scope)
        draws.append([np.array(scope.find_var(f"fc_{i}.w_0").value) for i in (0, 1)])
    for d in draws[1:]:
        for a, b in zip(d, draws[0]):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(draws[0][0], draws[0][1])      # two ops, two streams
    startup.random_seed = 0                                   # unseeded: new numbers each run
    a, b = fluid.Scope(), fluid.Scope()
    exe.run(startup, scope=a)
    exe.run(startup, scope=b)
    assert not np.array_equal(a.find_var("fc_0.w_0").value, b.find_var("fc_0.w_0").value)
