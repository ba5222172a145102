"""Random programs: compiled == reference on Hypothesis-built DAGs of ops.

Values come in three shapes that broadcast with each other: full ``[-1, K]``, a row ``[K]``
and a column ``[-1, 1]`` (from a reduction with keep_dim). Each program is fed at several batch
sizes through one executor (one plan), and every fetched value is compared with the reference
interpreter's.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pdjit as fluid
from pdjit.testing import assert_native

K = 5
UNARY = ["relu", "tanh", "sigmoid", "abs", "square", "exp", "sign"]
BINARY = ["elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_max",
          "elementwise_min"]


@st.composite
def programs(draw):
    n_ops = draw(st.integers(2, 9))
    steps = []
    kinds = ["full", "row"]          # the two inputs: x [-1, K], r [K]
    for _ in range(n_ops):
        choice = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "scale"]))
        a = draw(st.integers(0, len(kinds) - 1))
        if choice == "binary":
            b = draw(st.integers(0, len(kinds) - 1))
            op = draw(st.sampled_from(BINARY))
            kind = "full" if "full" in (kinds[a], kinds[b]) or {kinds[a], kinds[b]} == \
                {"row", "col"} else kinds[a]
            steps.append(("binary", op, a, b))
        elif choice == "reduce" and kinds[a] == "full":
            steps.append(("reduce", draw(st.sampled_from(["reduce_sum", "reduce_max",
                                                          "reduce_mean"])), a))
            kind = "col"
        elif choice == "scale":
            steps.append(("scale", draw(st.floats(-2, 2, width=32)), a))
            kind = kinds[a]
        else:
            steps.append(("unary", draw(st.sampled_from(UNARY)), a))
            kind = kinds[a]
        kinds.append(kind)
    fetch = draw(st.lists(st.integers(2, len(kinds) - 1), min_size=1, max_size=3, unique=True))
    return steps, fetch


def _build(steps, fetch):
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[-1, K], dtype="float64", append_batch_size=False)
        r = fluid.layers.data(name="r", shape=[K], dtype="float64", append_batch_size=False)
        values = [x, r]
        for step in steps:
            if step[0] == "binary":
                _, op, a, b = step
                va, vb = values[a], values[b]
                if len(va.shape) < len(vb.shape):  # the higher-rank operand goes first
                    va, vb = vb, va
                values.append(getattr(fluid.layers, op)(va, vb))
            elif step[0] == "reduce":
                _, op, a = step
                values.append(getattr(fluid.layers, op)(values[a], dim=[1], keep_dim=True))
            elif step[0] == "scale":
                values.append(fluid.layers.scale(values[step[2]], scale=step[1], bias=0.5))
            else:
                v = values[step[2]]
                if step[1] == "exp":  # keep exp finite: squash its input first
                    v = fluid.layers.tanh(v)
                values.append(getattr(fluid.layers, step[1])(v))
    return main, [values[i] for i in fetch]


@settings(max_examples=20)
@given(programs(), st.integers(0, 2**31 - 1))
def test_random_programs_compiled_equals_reference(prog, seed):
    steps, fetch = prog
    main, outs = _build(steps, fetch)
    rng = np.random.default_rng(seed)
    compiled, reference = fluid.Executor(mode="compiled"), fluid.Executor(mode="reference")
    for n in (1, 4, 9):
        feed = {"x": rng.uniform(-2, 2, (n, K)), "r": rng.uniform(-2, 2, K)}
        got = compiled.run(main, feed=feed, fetch_list=outs, scope=fluid.Scope())
        want = reference.run(main, feed=feed, fetch_list=outs, scope=fluid.Scope())
        for g, w, v in zip(got, want, outs):
            assert g.shape == w.shape, (v.name, steps)
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=f"{v.name} {steps}")
    assert len(compiled._plans) == 1  # one plan for every batch size
    assert_native(compiled, str(steps))
