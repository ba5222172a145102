"""Run-time shapes the compiled executor and the reference interpreter treat alike: inputs whose
run-time shapes do not fit an op (the same named error in both modes, before native code runs
on them), one-element values declared ``[]`` or ``[1]`` inside a fused segment (the same shapes
and values fetched), and an op that names one variable in two outputs (refused by the
verifier: which write wins is undefined)."""
import itertools
import warnings

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework.errors import OpRunError, ProgramError
from pdjit.layers.layer_helper import LayerHelper
from pdjit.proto import framework_pb2 as pb
from pdjit.testing.op_test import assert_native

L = fluid.layers


def _run(program, feed, fetch, mode):
    exe = fluid.Executor(mode=mode, strict=mode == "compiled")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = exe.run(program, feed=feed, fetch_list=fetch)
    return exe, [np.asarray(o) for o in out]


@pytest.fixture(scope="module")
def huber():
    """huber_loss of x and y, both declared [-1, -1], then mean: one fused native step."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[-1, -1], dtype="float32", append_batch_size=False)
        y = L.data(name="y", shape=[-1, -1], dtype="float32", append_batch_size=False)
        loss = L.huber_loss(x, y, delta=1.0)
        avg = L.mean(loss)
    return main, [loss.name, avg.name]


def test_inputs_that_do_not_fit_are_the_same_named_error_in_both_modes(huber):
    main, fetch = huber
    x = np.array([[0.5], [3.0]], dtype="float32")
    # shapes that fit: native code ran, and computed what NumPy does
    exe, (loss, avg) = _run(main, {"x": x, "y": np.zeros((2, 1), "float32")}, fetch,
                            "compiled")
    assert_native(exe)
    want = np.where(np.abs(x) <= 1.0, 0.5 * x * x, np.abs(x) - 0.5)
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    np.testing.assert_allclose(avg.ravel(), [want.mean()], rtol=1e-6)
    # shapes that broadcast but that huber_loss refuses: native code would broadcast them
    for y_shape in [(1, 1), (1, 2), (2, 2), (4, 1)]:
        y = np.ones(y_shape, "float32")
        errors = []
        for mode in ("reference", "compiled"):
            with pytest.raises(OpRunError) as e:
                _run(main, {"x": x, "y": y}, fetch, mode)
            errors.append(str(e.value))
        assert errors[0] == errors[1], (y_shape, errors)
        assert errors[0].startswith("op 'huber_loss' (block 0, op #0), created at ")
        assert "test_run_shapes.py" in errors[0]
        assert f"expected Y of X's shape [2, 1], got {list(y_shape)}" in errors[0]


def _scalar_program():
    """reduce_sum (0-d, declared [1]) -> scale -> relu, + the sum, * fill_constant([1])."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[4], dtype="float32")
        s = L.reduce_sum(x)
        t = L.scale(s, scale=2.0, bias=1.0)
        u = L.elementwise_add(L.relu(t), s)
        f = L.fill_constant(shape=[1], dtype="float32", value=3.0)
        w = L.elementwise_mul(u, f)
    return main, [s.name, t.name, u.name, f.name, w.name]


def test_one_element_values_declared_0d_or_1_agree_between_modes():
    """Every choice of [] or [1] for the five scalar variables (a file may declare either):
    both modes fetch each value with the rank its variable declares, and the values NumPy
    computes; native code runs where the shapes are the ones the ops compute."""
    main, names = _scalar_program()
    x = np.arange(8, dtype="float32").reshape(2, 4)
    s = x.sum()
    t = 2.0 * s + 1.0
    u = max(t, 0.0) + s
    want = [s, t, u, 3.0, 3.0 * u]
    desc = main.serialize_to_string()
    for dims in itertools.product([[], [1]], repeat=len(names)):
        d = pb.ProgramDesc.FromString(desc)
        for v in d.blocks[0].vars:
            if v.name in names:
                td = v.type.lod_tensor.tensor
                del td.dims[:]
                td.dims.extend(dims[names.index(v.name)])
        program = fluid.Program.parse_from_string(d.SerializeToString())
        _, ref = _run(program, {"x": x}, names, "reference")
        exe, got = _run(program, {"x": x}, names, "compiled")
        for name, declared, r, g, w in zip(names, dims, ref, got, want):
            assert r.shape == g.shape == tuple(declared), (dims, name, r.shape, g.shape)
            np.testing.assert_allclose(g, r, rtol=1e-6)
            np.testing.assert_allclose(r.ravel(), [w], rtol=1e-6)
        if dims == (1, 1, 1, 1, 1) or dims == ([1], [1], [1], [1], [1]):
            assert_native(exe)


def test_an_op_writing_one_variable_twice_is_refused():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[8], dtype="float32")
        L.reshape(x, [-1, 2, 4])
    d = pb.ProgramDesc.FromString(main.serialize_to_string())
    op = next(op for op in d.blocks[0].ops if op.type == "reshape2")
    out = next(s for s in op.outputs if s.parameter == "Out").arguments[0]
    next(s for s in op.outputs if s.parameter == "XShape").arguments[0] = out
    with pytest.raises(ProgramError, match=r"op 'reshape2' \(block 0, op #\d+\): output "
                                           r"'(XShape|Out)': variable '.*' is written by "
                                           r"output '(Out|XShape)' of the same op too"):
        fluid.verify(fluid.Program.parse_from_string(d.SerializeToString()))


def test_shape_inputs_must_be_integer_tensors():
    """fill_constant's ShapeTensorList: dims from int tensors; a float tensor is refused when
    the program is verified (a mutant fed a float [-1, 4] tensor there, whose run gave a shape
    no declaration said)."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[4], dtype="float32")
        n = L.fill_constant([1], "int64", 3)
        m = L.fill_constant([1], "int32", 2)
        out = main.global_block().create_var(name="filled", dtype="float32", shape=[-1, -1])
        LayerHelper("fill_constant").append_op(
            "fill_constant", inputs={"ShapeTensorList": [n, m]}, outputs={"Out": [out]},
            attrs={"shape": [], "dtype": out.desc.type.lod_tensor.tensor.data_type,
                   "value": 1.5})
    got, = fluid.Executor(mode="reference").run(main, feed={"x": np.zeros((2, 4), "float32")},
                                                 fetch_list=[out])
    np.testing.assert_array_equal(got, np.full((3, 2), 1.5, np.float32))
    for bad, why in ((x.name, r"ShapeTensorList\[0\] holds the output's dims: expected an "
                              r"int32 or int64 tensor, got float32"),):
        d = pb.ProgramDesc.FromString(main.serialize_to_string())
        op = [o for o in d.blocks[0].ops if o.type == "fill_constant"][-1]
        slot = next(s for s in op.inputs if s.parameter == "ShapeTensorList")
        slot.arguments[0] = bad
        with pytest.raises(ProgramError, match=r"op 'fill_constant' \(block 0, op #\d+\): .*"
                                               + why):
            fluid.verify(fluid.Program.parse_from_string(d.SerializeToString()))


def test_integer_scale_factors_must_be_values_of_the_dtype():
    """scale computes in X's dtype: on an int64 counter a bias of 1e30 has no value (NumPy
    converts it to -2**63, native code to something else: a campaign mutant's loop ended in
    one mode and not the other), so the verifier refuses it; an in-range bias runs."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        i = L.fill_constant([1], "int64", 2)
        out = L.scale(i, scale=3.0, bias=1.0)
    got, = fluid.Executor(mode="reference").run(main, fetch_list=[out])
    assert got.tolist() == [7]
    d = pb.ProgramDesc.FromString(main.serialize_to_string())
    op = next(o for o in d.blocks[0].ops if o.type == "scale")
    next(a for a in op.attrs if a.name == "bias").f = 1e30
    with pytest.raises(ProgramError, match=r"op 'scale' \(block 0, op #\d+\): .*bias 1\.0+\d*e\+30 "
                                           r"is no int64 value"):
        fluid.verify(fluid.Program.parse_from_string(d.SerializeToString()))


def test_a_sub_block_declaration_beyond_the_limit_stops_neither_mode(monkeypatch):
    """An op in a conditional block whose output is declared [2**33, 4] (a -1 the file made
    specific) where it computes [2, 4]: both modes check the sizes an op computes when it
    runs, so neither refuses it, whether the branch runs or not."""
    from pdjit.layers.control_flow import ConditionalBlock
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", str(1 << 28))
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data(name="x", shape=[4], dtype="float32")
        flag = L.data(name="flag", shape=[1], dtype="bool", append_batch_size=False)
        z = main.global_block().create_var(name="z", dtype="float32", shape=[-1, 4])
        L.assign(x, z)
        with ConditionalBlock([flag], is_scalar_condition=True).block():
            L.assign(L.scale(x, 2.0), z)
    d = pb.ProgramDesc.FromString(main.serialize_to_string())
    inner = next(v for v in d.blocks[1].vars if v.name.startswith("scale"))
    inner.type.lod_tensor.tensor.dims[0] = 1 << 33
    program = fluid.Program.parse_from_string(d.SerializeToString())
    x0 = np.arange(8, dtype="float32").reshape(2, 4)
    for taken in (False, True):
        feed = {"x": x0, "flag": np.array([taken])}
        for mode in ("reference", "compiled"):
            _, (got,) = _run(program, feed, ["z"], mode)
            np.testing.assert_array_equal(got, x0 * (2 if taken else 1))
