"""A compile job carries what the compile worker balances by as fields set where the code is
made: a generated kernel's estimated compile time and the math helpers it calls (from its loop
kernel's description and its ops' emit templates), a library kernel's compile time as its
library declares it. Nothing reads them back from the generated text."""
import numpy as np

import pdjit as fluid
from pdjit.codegen import compiler
from pdjit.codegen.cpu.lib import _jit, conv, pool
from pdjit.codegen.lowering import template_math
from pdjit.codegen.target import get_target
from pdjit.testing import assert_native


def test_generated_kernels_carry_their_cost_and_math_helpers(fresh_programs):
    main, startup = fresh_programs
    x = fluid.layers.data("x", [6])
    s = fluid.layers.reduce_sum(fluid.layers.tanh(x), dim=1)  # tanh fused into the sum
    z = fluid.layers.scale(fluid.layers.relu(x), 3.0)           # a group of its own
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    xv = np.linspace(-2, 2, 18, dtype=np.float32).reshape(3, 6)
    got_s, got_z = exe.run(main, feed={"x": xv}, fetch_list=[s, z])
    assert_native(exe)
    np.testing.assert_allclose(got_s, np.tanh(xv).sum(1), rtol=1e-5)
    np.testing.assert_allclose(got_z, 3 * np.maximum(xv, 0), rtol=1e-6)
    kernels = [c for _, plan in exe._plans.values() for step in plan.walk()
               if step.kind == "native" for c in step.compiled.kernels]
    by_math = {c.math: c for c in kernels}
    assert ("tanh",) in by_math and () in by_math, [c.math for c in kernels]
    tanh_k, plain = by_math[("tanh",)], by_math[()]
    assert tanh_k.affinity == ("math", "tanh") and plain.affinity == ("own", plain.name)
    # a math helper to compile costs more than the loops around it
    assert tanh_k.cost >= plain.cost + compiler.HELPER_SECONDS
    # relu and scale: two statements and one store
    assert plain.cost == compiler.kernel_cost(3)


def test_math_helpers_come_from_the_templates_syntax():
    assert template_math("{T}({a}) * _m.tanh({T}({b}) * {X})") == {"tanh"}
    assert template_math("{Out@GRAD} * -_m.expm1(-{Out}) if {Out} > {T}(0) else {X}") == \
        {"expm1"}
    assert template_math("max({X}, {T}(0))") == frozenset()
    assert template_math("not an expression (") == frozenset()


def test_library_jobs_carry_their_declared_compile_time():
    jobs = get_target("cpu").library_jobs(["conv2d_fwd", "pool2d_max22"], np.float32)
    cost = {job.fn: job.cost for job, _ in jobs}
    assert cost[conv._taps_range] == _jit.cost_of(conv._taps_range) > 2.0
    assert cost[pool._max22] == _jit.cost_of(pool._max22) < 1.0
    assert all(isinstance(job, compiler.LibraryKernel) for job, _ in jobs)
    assert {job.affinity for job, _ in jobs} == {conv.__name__, pool.__name__}
