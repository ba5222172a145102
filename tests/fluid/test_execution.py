"""Execution spellings: CompiledProgram (with_data_parallel runs one replica: the plain
program's losses), ParallelExecutor, BuildStrategy/ExecutionStrategy, name_scope,
install_check.run_check."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import pdjit as fluid
from pdjit import compiler
from pdjit.testing.op_test import assert_native

RNG = np.random.default_rng(3)
FEEDS = [{"x": RNG.standard_normal((6, 4)).astype("float32"),
          "y": RNG.standard_normal((6, 1)).astype("float32")} for _ in range(4)]


def _net():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 5
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 4], "float32")
        y = fluid.data("y", [-1, 1], "float32")
        h = fluid.layers.fc(x, 8, act="relu")
        loss = fluid.layers.mean(fluid.layers.square_error_cost(fluid.layers.fc(h, 1), y))
        fluid.optimizer.SGD(0.05).minimize(loss)
    return main, startup, loss


def _losses(program, startup, loss):
    exe, scope = fluid.Executor(fluid.CPUPlace(), strict=True), fluid.Scope()
    exe.run(startup, scope=scope)
    return [exe.run(program, feed=f, fetch_list=[loss], scope=scope)[0] for f in FEEDS]


def _numpy_losses(startup_scope_params, feeds):
    """The same MLP trained with SGD, written out in NumPy from the initial parameters."""
    w1, b1, w2, b2 = (p.astype(np.float64) for p in startup_scope_params)
    out = []
    for f in feeds:
        x, y = f["x"].astype(np.float64), f["y"].astype(np.float64)
        z = x @ w1 + b1
        h = np.maximum(z, 0)
        p = h @ w2 + b2
        d = p - y
        out.append(np.mean(d ** 2))
        gp = 2 * d / d.size
        gw2, gb2 = h.T @ gp, gp.sum(0)
        gz = (gp @ w2.T) * (z > 0)
        gw1, gb1 = x.T @ gz, gz.sum(0)
        w1, b1, w2, b2 = w1 - 0.05 * gw1, b1 - 0.05 * gb1, w2 - 0.05 * gw2, b2 - 0.05 * gb2
    return out


def test_compiled_program_trains_as_the_plain_program_and_warns_once():
    main, startup, loss = _net()
    plain = _losses(main, startup, loss)
    compiled = fluid.CompiledProgram(main).with_data_parallel(loss_name=loss.name)
    assert isinstance(compiled, fluid.CompiledProgram) and compiled.program is main
    compiled = fluid.CompiledProgram(main, build_strategy=fluid.BuildStrategy())
    assert compiled.with_data_parallel(loss_name=loss.name) is compiled
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel = _losses(compiled, startup, loss)
    replica = [w for w in caught if "one replica" in str(w.message)]
    assert len(replica) == 1, [str(w.message) for w in caught]
    assert "not split" in str(replica[0].message)
    assert replica[0].filename == __file__  # points at the user's exe.run line
    np.testing.assert_array_equal(np.array(parallel), np.array(plain))
    # and both are the NumPy oracle's losses from the same initial parameters
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup, scope=scope)
    params = [np.array(scope.find_var(p.name).get_tensor()) for p in main.all_parameters()]
    np.testing.assert_allclose(np.array(plain, np.float64).ravel(),
                               _numpy_losses(params, FEEDS), rtol=1e-4, atol=1e-6)
    # without with_data_parallel: no warning at all
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _losses(fluid.CompiledProgram(main), startup, loss)


def test_parallel_executor_trains_as_the_plain_program():
    # Fluid 1.x's older spelling: ParallelExecutor(use_cuda, loss_name, main_program, ...).run
    main, startup, loss = _net()
    plain = _losses(main, startup, loss)
    scope = fluid.Scope()
    fluid.Executor(fluid.CPUPlace()).run(startup, scope=scope)
    pe = fluid.ParallelExecutor(use_cuda=False, loss_name=loss.name, main_program=main,
                                scope=scope, exec_strategy=fluid.ExecutionStrategy(),
                                build_strategy=fluid.BuildStrategy())
    assert pe.device_count == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-replica warning, tested above
        got = [pe.run([loss.name], feed=FEEDS[0])[0], pe.run([loss], feed_dict=FEEDS[1])[0]]
        test = fluid.ParallelExecutor(False, main_program=main, share_vars_from=pe)
        got += [test.run(fetch_list=[loss], feed=[f])[0] for f in FEEDS[2:]]  # one per place
    np.testing.assert_array_equal(np.array(got), np.array(plain))
    assert_native(pe._exe, "ParallelExecutor")
    with pytest.raises(RuntimeError, match="not compiled with CUDA"):
        fluid.ParallelExecutor(use_cuda=True, main_program=main)
    with pytest.raises(ValueError, match="num_trainers=2, trainer_id=0: distributed"):
        fluid.ParallelExecutor(False, main_program=main, num_trainers=2)
    with pytest.raises(TypeError, match="share_vars_from must be a ParallelExecutor"):
        fluid.ParallelExecutor(False, main_program=main, share_vars_from=main)


def test_compiled_program_bad_input():
    main, startup, loss = _net()
    with pytest.raises(TypeError, match="expected a Program, got str"):
        fluid.CompiledProgram("main")
    with pytest.raises(TypeError, match="build_strategy must be a BuildStrategy"):
        fluid.CompiledProgram(main, build_strategy={})
    with pytest.raises(ValueError, match="loss_name 'nope' is not a variable"):
        fluid.CompiledProgram(main).with_data_parallel(loss_name="nope")
    c = fluid.CompiledProgram(main).with_data_parallel(loss_name=loss)
    with pytest.raises(RuntimeError, match="already called"):
        c.with_data_parallel()
    with pytest.raises(TypeError, match="exec_strategy must be an ExecutionStrategy"):
        fluid.CompiledProgram(main).with_data_parallel(exec_strategy=fluid.BuildStrategy())


def test_strategies_accept_fluids_fields_and_warn_once_for_unused_ones(monkeypatch):
    monkeypatch.setattr(compiler, "_warned_fields", set())
    bs = fluid.BuildStrategy()
    es = fluid.ExecutionStrategy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fulfilled anyway: silent
        bs.reduce_strategy = fluid.BuildStrategy.ReduceStrategy.Reduce
        bs.fuse_elewise_add_act_ops = True
        bs.enable_inplace = True
        bs.memory_optimize = False
        bs.sync_batch_norm = True
        bs.gradient_scale_strategy = fluid.BuildStrategy.GradientScaleStrategy.One
        es.num_iteration_per_drop_scope = 10
        es.use_experimental_executor = True  # Fluid 1.x scripts' "fast executor" switch
        es.num_threads = 0  # the default
    with pytest.warns(UserWarning, match=r"ExecutionStrategy.num_threads = 4 has no effect.*"
                                         r"set_num_threads"):
        es.num_threads = 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        es.num_threads = 2  # once per field
    with pytest.warns(UserWarning, match="BuildStrategy.num_trainers = 2 has no effect"):
        bs.num_trainers = 2
    with pytest.warns(UserWarning, match="gradient_scale_strategy = 2"):
        bs.gradient_scale_strategy = fluid.BuildStrategy.GradientScaleStrategy.Customized
    assert (es.num_threads, bs.num_trainers, bs.reduce_strategy) == (2, 2, 1)
    with pytest.raises(AttributeError, match="BuildStrategy has no field 'fuse_everything'"):
        bs.fuse_everything = True
    assert fluid.BuildStrategy().trainers_endpoints is not fluid.BuildStrategy().trainers_endpoints
    main, startup, loss = _net()
    c = fluid.CompiledProgram(main, bs).with_data_parallel(loss.name, exec_strategy=es,
                                                           places=[fluid.CPUPlace()] * 2)
    with pytest.warns(UserWarning, match="Fluid would run 2 places"):
        c._as_program()


def test_name_scope_records_op_namescope_as_fluid_does():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data("x", [-1, 4], "float32")
        with fluid.name_scope("enc"):
            h = fluid.layers.fc(x, 3)
            with fluid.name_scope("inner"):
                h = fluid.layers.relu(h)
        with fluid.name_scope("enc"):
            h = fluid.layers.scale(h, 2.0)
        fluid.layers.mean(h)
        with pytest.raises(ValueError, match="prefix must be a non-empty string"):
            with fluid.name_scope(""):
                pass
    got = [(op.type, op.attr("op_namescope") if op.has_attr("op_namescope") else None)
           for op in main.global_block().ops]
    # Paddle 3.3.1 (legacy static, paddle.static.name_scope) names the same ops the same way
    assert got == [("mul", "/enc/"), ("elementwise_add", "/enc/"), ("relu", "/enc/inner/"),
                   ("scale", "/enc_1/"), ("mean", None)]
    assert {op.attr("op_namescope") for op in startup.global_block().ops} == {"/enc/"}
    # the attribute survives serialisation
    again = fluid.Program.parse_from_string(main.serialize_to_string())
    assert again.global_block().ops[2].attr("op_namescope") == "/enc/inner/"


def test_name_scope_names_ops_of_programs_guarded_inside_it():
    other, other_startup = fluid.Program(), fluid.Program()
    with fluid.name_scope("outer"):
        with fluid.program_guard(other, other_startup), fluid.unique_name.guard():
            x = fluid.data("x", [-1, 2], "float32")
            fluid.layers.relu(x)
    assert [op.attr("op_namescope") for op in other.global_block().ops] == ["/outer/"]


def test_install_check_runs(capsys):
    fluid.install_check.run_check()
    out = capsys.readouterr().out
    assert "Your pdjit works well on CPU." in out
