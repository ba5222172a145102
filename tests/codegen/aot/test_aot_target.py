"""The ``aot`` target (``codegen/aot/``): a target built on the ``cpu`` target (``base``), so
that an artifact's kernels are the JIT executor's (the same texts, the same cache entries), and
generated for one thread. Also the ``base`` mechanism of ``codegen.target`` itself, on a toy
target built on the ``python`` target. Nothing here compiles C."""
import numpy as np

import pdjit as fluid
from pdjit.codegen import pipeline
from pdjit.codegen import target as target_mod
from pdjit.codegen.target import BUILTIN, Target, get_target, register_target


def _program():
    """An inference program: h = relu(x @ w + b) * 2 (a GEMM and its epilogue), s = sum(h)."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [4])
        h = fluid.layers.scale(fluid.layers.fc(x, 3, act="relu"), 2.0)
        s = fluid.layers.reduce_sum(fluid.layers.tanh(h), dim=1)
    return main.clone(for_test=True), startup, x, s


def _kernels(desc) -> list:
    return sorted(k.name for st in desc.steps for k in st.compiled.kernels)


def test_the_aot_target_is_the_cpu_targets_code_for_one_thread():
    aot, cpu = get_target("aot"), get_target("cpu")
    assert BUILTIN["aot"] == "pdjit.codegen.aot.target" and aot.base == "cpu"
    assert aot.name == "aot" and aot.threads() == (1, 1) and not aot.parallel_variants
    # what it does not define is the CPU target's: its table, rendering, drivers, modules
    assert aot.lowerings is cpu.lowerings and aot.generic_lowerings
    assert aot.render is cpu.render and aot.call_site is cpu.call_site
    assert aot.host_driver is cpu.host_driver and aot.native_driver is cpu.native_driver
    assert aot.module_text.__self__ is cpu and aot.dependencies == cpu.dependencies
    assert aot.native_drivers and aot.precompile and not aot.device

    main, _, x, s = _program()
    a = pipeline.compile_block(main, fetch_names=[s.name], target=aot, native_drivers=True)
    c = pipeline.compile_block(main, fetch_names=[s.name], target=cpu, native_drivers=True,
                               threads=(1, 1))
    # the same kernels and drivers, compiled once for both: one module each, the CPU's text;
    # the kernels are the JIT's too, generated for threads
    jit = pipeline.compile_block(main, fetch_names=[s.name], target=cpu, threads=(2, 2))
    assert _kernels(a) and _kernels(a) == _kernels(c) == _kernels(jit)
    assert [st.native.name for st in a.steps] == [st.native.name for st in c.steps]
    assert all(st.native.compiled is cc.native.compiled for st, cc in zip(a.steps, c.steps))
    assert all("target cpu" in st.native.text and "prange" not in st.native.text and
               not st.native.parallel for st in a.steps)
    # and what they compute: NumPy's answer
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace())
    exe.run(_program()[1], scope=scope)
    xv = np.random.default_rng(0).standard_normal((2, 4)).astype("float32")
    (step,) = a.steps
    params = {n: np.asarray(scope.find_var(n).get_tensor()) for n in step.args if n != "x"}
    (got,) = step.native.fn(*[xv if n == "x" else params[n] for n in step.args])
    bias, weight = (params[n] for n in sorted(params))   # fc_0.b_0, fc_0.w_0
    assert weight.shape == (4, 3) and bias.shape == (3,)
    want = np.tanh(np.maximum(xv @ weight + bias, 0) * 2).sum(1)
    np.testing.assert_allclose(got, want, rtol=1e-5)


class _Toy(Target):
    """Built on the python target: one method and one field of its own."""
    name = "toy_on_python"
    base = "python"
    native_drivers = False
    lowerings = None

    def threads(self):
        return 3, 3


def test_a_target_takes_what_it_does_not_define_from_its_base(monkeypatch):
    py = get_target("python")  # (registered before the registry is copied: it stays after)
    monkeypatch.setattr(target_mod, "_TARGETS", dict(target_mod._TARGETS))
    toy = register_target(_Toy())
    assert get_target("toy_on_python") is toy and toy.threads() == (3, 3)
    # the python target's own methods, bound to it; its fields' values
    assert toy.render.__self__ is py and toy.module_text.__self__ is py
    assert toy.host_driver is py.host_driver and toy.dependencies == py.dependencies
    # the interface's defaults stay the toy's own, reading its fields
    assert toy.lowering.__self__ is toy and toy.require.__self__ is toy
    assert get_target("python").threads() != (3, 3)


def test_a_target_that_is_its_own_base_is_refused(monkeypatch):
    monkeypatch.setattr(target_mod, "_TARGETS", dict(target_mod._TARGETS))

    class Loop(Target):
        name = base = "loop_target"

    try:
        register_target(Loop())
    except ValueError as e:
        assert "its own base" in str(e)
    else:
        raise AssertionError("a target that is its own base was registered")
