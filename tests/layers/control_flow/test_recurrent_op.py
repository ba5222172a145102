"""Fluid 1.8's ``recurrent`` op (what its ``StaticRNN`` serialises to), built here as Fluid 1.8's
``StaticRNN._complete_op`` lays it out: it survives serialisation, runs against a NumPy
recurrence, and ``recurrent_grad`` (from pdjit's backward pass) matches finite differences."""
import numpy as np
import pytest

import pdjit as fluid
from pdjit.proto import framework_pb2 as pb
from pdjit.testing import check_program_grad
from pdjit.testing.op_test import assert_native

# rnn_memory_helper (Out = X, carrying a memory into a step) runs its NumPy reference by design;
# a compiled plan says so once per process
pytestmark = pytest.mark.filterwarnings(
    "ignore:op 'rnn_memory_helper(_grad)?' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

L = fluid.layers
T, B, D, H = 3, 2, 4, 5


def _fluid18_static_rnn(x, h0, reverse=False):
    """h_t = tanh(x_t @ wx + h_{t-1} @ wh + b); outputs h (via rnn_memory_helper), as Fluid
    1.8 writes it: the step input and output variables of the step block share the outer
    names, the memory update goes through rnn_memory_helper."""
    program = fluid.default_main_program()
    parent = program.current_block()
    block = program._create_block()
    x_t = block.create_var(name=x.name, shape=list(x.shape[1:]), dtype=x.dtype)
    pre = block.create_var(name="static_rnn_0@mem", shape=list(h0.shape), dtype=h0.dtype)
    h = L.fc([x_t, pre], H, act="tanh",
             param_attr=[fluid.ParamAttr(name="wx"), fluid.ParamAttr(name="wh")],
             bias_attr=fluid.ParamAttr(name="b"))
    out_t = block.create_var(name="static_rnn_0.out", shape=list(h.shape), dtype=h.dtype)
    block.append_op("rnn_memory_helper", inputs={"X": [h]}, outputs={"Out": [out_t]},
                    attrs={"dtype": 6})
    new = block.create_var(name="static_rnn_0.new_mem", shape=list(h.shape), dtype=h.dtype)
    block.append_op("rnn_memory_helper", inputs={"X": [h]}, outputs={"Out": [new]},
                    attrs={"dtype": 6})
    program._rollback()
    out = parent.create_var(name=out_t.name, shape=[T] + list(h.shape), dtype=h.dtype)
    scopes = parent.create_var(name="static_rnn_0.scopes", type=pb.VarType.STEP_SCOPES)
    parent.append_op("recurrent",
                     inputs={"inputs": [x], "initial_states": [h0],
                             "parameters": ["wx", "wh", "b"]},
                     outputs={"outputs": [out], "step_scopes": [scopes]},
                     attrs={"has_states": True, "ex_states": [pre.name],
                            "states": [new.name], "sub_block": block.idx,
                            "reverse": reverse, "is_train": True})
    return out


def _program(reverse=False):
    x = L.data(name="x", shape=[T, B, D], dtype="float64", append_batch_size=False)
    h0 = L.data(name="h0", shape=[B, H], dtype="float64", append_batch_size=False)
    return _fluid18_static_rnn(x, h0, reverse), [x, h0]


def test_a_fluid18_recurrent_op_loads_and_matches_numpy():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        out, _ = _program(reverse=True)
    loaded = fluid.Program.parse_from_string(main.desc.SerializeToString())
    assert loaded.desc.SerializeToString() == main.desc.SerializeToString()
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    wx, wh, b = (np.asarray(scope.find_var(n).value) for n in ("wx", "wh", "b"))
    rng = np.random.default_rng(0)
    xv, h0v = rng.normal(size=(T, B, D)), rng.normal(size=(B, H))
    (got,) = exe.run(loaded, feed={"x": xv, "h0": h0v}, fetch_list=[out.name], scope=scope)
    want, h = np.zeros((T, B, H)), h0v
    for t in reversed(range(T)):
        h = np.tanh(xv[t] @ wx + h @ wh + b)
        want[t] = h
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    assert_native(exe)


def test_recurrent_grad_matches_finite_differences():
    def build():
        out, inputs = _program()
        return out, inputs + [fluid.default_main_program().global_block().var("wh")]
    rng = np.random.default_rng(1)
    check_program_grad(build, {"x": rng.normal(size=(T, B, D)), "h0": rng.normal(size=(B, H))},
                       modes=("compiled",))
