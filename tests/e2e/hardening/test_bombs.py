"""Small programs and files with a huge or invalid effect: each ends in a named pdjit error,
quickly and without allocating much (issue: every valid program runs the same compiled and
interpreted; every invalid one is named before it runs)."""
import contextlib
import math
import re
import time
import tracemalloc

import numpy as np
import pytest

import pdjit as fluid
from pdjit.cli import main as cli_main
from pdjit.framework.errors import PdjitError, ProgramError, ReferenceStepWarning
from pdjit.proto import framework_pb2 as pb

A = pb.AttrType
VarType = pb.VarType


@pytest.fixture(scope="module")
def net():
    """img[-1, 1, 6, 6] -> conv2d -> pool2d max -> fc 3 -> dropout -> softmax, + fill_constant."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        img = fluid.layers.data(name="img", shape=[1, 6, 6], dtype="float32")
        c = fluid.layers.conv2d(img, num_filters=2, filter_size=3)
        p = fluid.layers.pool2d(c, pool_size=2, pool_type="max")
        f = fluid.layers.fc(p, size=3)
        d = fluid.layers.dropout(f, dropout_prob=0.5)
        s = fluid.layers.softmax(d)
        k = fluid.layers.fill_constant(shape=[1], dtype="float32", value=1.0)
        out = fluid.layers.elementwise_add(s, k)
    return main, startup, out.name


def edited(program, change):
    desc = pb.ProgramDesc.FromString(program.serialize_to_string())
    change(desc)
    return desc.SerializeToString()


def set_attr(op_type, name, value, nth=0):
    def change(desc):
        ops = [op for op in desc.blocks[0].ops if op.type == op_type]
        a = next(a for a in ops[nth].attrs if a.name == name)
        if a.type in (A.INT, A.LONG):
            setattr(a, "i" if a.type == A.INT else "l", value)
        elif a.type == A.FLOAT:
            a.f = value
        elif a.type == A.STRING:
            a.s = value
        elif a.type in (A.INTS, A.LONGS):
            field = a.ints if a.type == A.INTS else a.longs
            del field[:]
            field.extend(value)
    return change


def refused(data: bytes) -> str:
    """The message of the ProgramError that verifying ``data`` (ProgramDesc bytes) raises."""
    with pytest.raises(ProgramError) as e:
        fluid.verify(fluid.Program.parse_from_string(data))
    return str(e.value)


@contextlib.contextmanager
def bounded(seconds=30.0, megabytes=200):
    """The block ends within ``seconds`` and its Python allocations peak under ``megabytes``.
    Each bomb here took minutes or gigabytes before it was refused; on a quiet machine the
    refusals take well under a second. The time bound is generous (a shared CI machine, the
    tracer's own cost): it tells a refusal from a bomb, it does not time the refusal."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield
        took = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert took < seconds, took
    assert peak < megabytes << 20, peak


DECLARED_RANGES = [
    (("softmax", "axis", 3), r"op 'softmax' \(block 0, op #6\): attribute 'axis': 3 is not an "
                             r"axis of input 'X' \(rank 2\): expected -2..1"),
    (("elementwise_add", "axis", 1000000, 2), r"attribute 'axis': 1000000 is not an axis"),
    (("elementwise_add", "axis", -2147483648, 2), r"attribute 'axis': expected >= -1, got "
                                                  r"-2147483648"),
    (("mul", "x_num_col_dims", 2 ** 30), r"op 'mul' .*'x_num_col_dims': 1073741824 is not an "
                                         r"axis of input 'X' \(rank 4\)"),
    (("mul", "x_num_col_dims", -2 ** 31), r"'x_num_col_dims': expected >= 1, got -2147483648"),
    (("mul", "y_num_col_dims", 0), r"'y_num_col_dims': expected >= 1, got 0"),
    (("conv2d", "strides", [0, 1]), r"op 'conv2d' .*'strides': expected >= 1, got \[0, 1\]"),
    (("conv2d", "dilations", [1, -1]), r"'dilations': expected >= 1, got \[1, -1\]"),
    (("conv2d", "paddings", [-1, 0]), r"'paddings': expected >= 0, got \[-1, 0\]"),
    (("conv2d", "groups", 0), r"'groups': expected >= 1, got 0"),
    (("conv2d", "padding_algorithm", "FULL"), r"'padding_algorithm': expected one of"),
    (("pool2d", "ksize", [0, 2]), r"op 'pool2d' .*'ksize': expected >= 1, got \[0, 2\]"),
    (("pool2d", "strides", [2, 0]), r"'strides': expected >= 1"),
    (("pool2d", "pooling_type", "median"), r"'pooling_type': expected one of \['max', 'avg'\]"),
    (("dropout", "dropout_prob", math.nan), r"op 'dropout' .*'dropout_prob': expected >= 0.0 and "
                                            r"<= 1.0, got nan"),
    (("dropout", "dropout_prob", 1.5), r"'dropout_prob': expected >= 0.0 and <= 1.0, got 1.5"),
    (("dropout", "dropout_implementation", "x"), r"'dropout_implementation': expected one of"),
    (("fill_constant", "str_value", "max"), r"op 'fill_constant' .*'str_value': expected a "
                                            r"number as text .*got 'max'"),
]


def test_declared_attribute_ranges_are_enforced(net):
    main = net[0]
    fluid.verify(fluid.Program.parse_from_string(main.serialize_to_string()))
    for (op_type, name, value, *nth), message in DECLARED_RANGES:
        msg = refused(edited(main, set_attr(op_type, name, value, *nth)))
        assert re.search(message, msg), (op_type, name, value, msg)


@pytest.fixture
def paddle_mlp(fixtures_dir, tmp_path):
    """A copy of the PaddlePaddle-written MLP as ``tmp_path/m.pdmodel`` + ``m.pdiparams``."""
    for ext in (".pdmodel", ".pdiparams"):
        (tmp_path / ("m" + ext)).write_bytes((fixtures_dir / ("models/mlp" + ext)).read_bytes())
    return tmp_path / "m"


@pytest.mark.parametrize("value", [2 ** 30, 2 ** 31 - 1, -2 ** 31])
def test_mul_num_col_dims_bomb_is_refused_by_check_and_load(paddle_mlp, capsys, value):
    """A 4 KB model whose mul x_num_col_dims would make the code generator build 2^30 terms."""
    path = paddle_mlp.with_suffix(".pdmodel")
    desc = pb.ProgramDesc.FromString(path.read_bytes())
    op = next(op for op in desc.blocks[0].ops if op.type == "mul")
    next(a for a in op.attrs if a.name == "x_num_col_dims").i = value
    path.write_bytes(desc.SerializeToString())
    assert len(path.read_bytes()) < 8192
    with bounded():
        assert cli_main(["check", str(paddle_mlp)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pdjit check: ") and "'x_num_col_dims'" in err
    assert err.count("\n") == 1
    with bounded(), pytest.raises(ProgramError, match=r"op 'mul' .*'x_num_col_dims'"):
        fluid.io.load_inference_model(str(paddle_mlp.parent), fluid.Executor(),
                                      model_filename="m.pdmodel", params_filename="m.pdiparams")


def set_var(name, dims=None, dtype=None):
    def change(desc):
        v = next(v for b in desc.blocks for v in b.vars if v.name == name)
        td = v.type.lod_tensor.tensor
        if dims is not None:
            del td.dims[:]
            td.dims.extend(dims)
        if dtype is not None:
            td.data_type = dtype
    return change


def _out(main, op_type, slot="Out"):
    return next(op for op in main.global_block().ops if op.type == op_type).output(slot)[0]


def test_declarations_that_contradict_the_ops_are_refused(net):
    """A VarDesc that says what its op does not compute (dtype, rank, a known dim) is a
    ProgramError naming op, block, index, variable, declared vs inferred; both executors refuse
    it the same way before anything runs."""
    main = net[0]
    sm, mul = _out(main, "softmax"), _out(main, "mul")
    cases = [
        (set_var(sm, dtype=VarType.BOOL),
         rf"op 'softmax' \(block 0, op #6\): output 'Out': variable '{sm}' is declared bool, "
         rf"but the op computes float32 .*declared bool vs inferred float32"),
        (set_var(mul, dims=[-1, 3, 1, 1, 1]),
         rf"op 'mul' \(block 0, op #3\): output 'Out': variable '{mul}' is declared of shape "
         rf"\[-1, 3, 1, 1, 1\], .*inferred \[-1, 3\]"),
        (set_var(mul, dims=[-1, 4]), r"declared \[-1, 4\] vs inferred \[-1, 3\]"),
        (set_var("img", dtype=VarType.BOOL),
         r"op 'conv2d' \(block 0, op #0\): its inputs as declared do not fit it: .*bool"),
    ]
    x = np.zeros((2, 1, 6, 6), np.float32)
    for change, message in cases:
        data = edited(main, change)
        assert re.search(message, refused(data)), (message, refused(data))
        for mode in ("reference", "compiled"):
            with pytest.raises(ProgramError, match=message):
                fluid.Executor(mode=mode).run(fluid.Program.parse_from_string(data),
                                              feed={"img": x}, fetch_list=[net[2]],
                                              scope=fluid.Scope())


def test_scalar_declared_as_1_or_0d_is_accepted():
    """Fluid 1.x layers declare a mean or a full reduction [1], newer ones []: both verify."""
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        m = fluid.layers.mean(x)
        s = fluid.layers.reduce_sum(x)
    for name in (m.name, s.name):
        for dims in ([], [1]):
            fluid.verify(fluid.Program.parse_from_string(edited(main, set_var(name, dims))))


def nested_conds(depth: int, *, with_body: bool = True) -> bytes:
    """ProgramDesc bytes: ``depth`` conditional_blocks each inside the one before; the
    innermost adds 1 to ``x`` (a global var) into ``y``; fetch y."""
    d = pb.ProgramDesc()
    d.version.version = 0
    for i in range(depth + 1):
        b = d.blocks.add()
        b.idx, b.parent_idx = i, i - 1
    g = d.blocks[0]

    def var(block, name, dims, dtype=VarType.FP32, kind=VarType.LOD_TENSOR):
        v = block.vars.add()
        v.name, v.type.type = name, kind
        if kind == VarType.LOD_TENSOR:
            v.type.lod_tensor.tensor.data_type = dtype
            v.type.lod_tensor.tensor.dims.extend(dims)
    var(g, "x", [2])
    var(g, "y", [2])
    var(g, "c", [1], VarType.BOOL)
    for i in range(depth):
        b = d.blocks[i]
        var(b, f"scope{i}", [], kind=VarType.STEP_SCOPES)
        op = b.ops.add()
        op.type = "conditional_block"
        for slot, args in (("Cond", ["c"]), ("Input", ["x"])):
            s = op.inputs.add()
            s.parameter = slot
            s.arguments.extend(args)
        for slot, args in (("Out", ["y"]), ("Scope", [f"scope{i}"])):
            s = op.outputs.add()
            s.parameter = slot
            s.arguments.extend(args)
        a = op.attrs.add()
        a.name, a.type, a.block_idx = "sub_block", A.BLOCK, i + 1
        a = op.attrs.add()
        a.name, a.type, a.b = "is_scalar_condition", A.BOOLEAN, True
    if with_body:
        op = d.blocks[depth].ops.add()
        op.type = "scale"
        for which, slot, arg in ((op.inputs, "X", "x"), (op.outputs, "Out", "y")):
            s = which.add()
            s.parameter = slot
            s.arguments.append(arg)
        a = op.attrs.add()
        a.name, a.type, a.f = "bias", A.FLOAT, 1.0
    return d.SerializeToString()


def test_deep_nesting_is_a_named_bound(monkeypatch):
    """300 nested conds (a 20 KB file) end in a ProgramLimitError naming the bound; the
    nesting allowed runs in both executors."""
    from pdjit.framework.errors import ProgramLimitError
    data = nested_conds(300)
    with bounded():
        with pytest.raises(ProgramLimitError, match=r"nesting depth .*: 65, more than the bound "
                                                    r"64 \(PDJIT_MAX_BLOCK_DEPTH; set it"):
            fluid.verify(fluid.Program.parse_from_string(data))
    x = np.array([1.0, 2.0], np.float32)
    feed = {"x": x, "c": np.array([True])}
    for mode in ("reference", "compiled"):
        p = fluid.Program.parse_from_string(nested_conds(40))
        y, = fluid.Executor(mode=mode).run(p, feed=feed, fetch_list=["y"], scope=fluid.Scope())
        np.testing.assert_array_equal(y, x + 1)
    monkeypatch.setenv("PDJIT_MAX_BLOCK_DEPTH", "3")
    with pytest.raises(ProgramLimitError, match="PDJIT_MAX_BLOCK_DEPTH"):
        fluid.verify(fluid.Program.parse_from_string(nested_conds(4)))
    monkeypatch.setenv("PDJIT_MAX_OPS_PER_BLOCK", "2")
    with pytest.raises(ProgramLimitError, match=r"block 0: ops: 3, more than the bound 2 "
                                                r"\(PDJIT_MAX_OPS_PER_BLOCK"):
        fluid.verify(fluid.Program.parse_from_string(edited(
            fluid.Program.parse_from_string(nested_conds(1)),
            lambda d: d.blocks[0].ops.extend([d.blocks[0].ops[0]] * 2))))


def test_feed_or_fetch_inside_a_sub_block_is_refused():
    def feed_in_body(d):
        op = d.blocks[1].ops.add()
        op.type = "feed"
        for which, slot, arg in ((op.inputs, "X", "feed"), (op.outputs, "Out", "x")):
            s = which.add()
            s.parameter = slot
            s.arguments.append(arg)
        a = op.attrs.add()
        a.name, a.type, a.i = "col", A.INT, 0
        v = d.blocks[0].vars.add()
        v.name, v.type.type = "feed", VarType.FEED_MINIBATCH
    data = edited(fluid.Program.parse_from_string(nested_conds(1)), feed_in_body)
    assert re.search(r"op 'feed' \(block 1, op #1\): a feed/fetch op inside sub-block 1",
                     refused(data))


def test_long_elementwise_chain_is_fused_in_bounded_groups(monkeypatch):
    """A chain of 300 elementwise ops becomes kernels of at most PDJIT_MAX_FUSED_OPS ops (so
    compile time stays linear in the op count), and runs to NumPy's result."""
    from pdjit.passes.fusion import partition
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()):
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        y = x
        for _ in range(300):
            y = fluid.layers.scale(y, scale=1.0, bias=1.0)
    block = main.global_block()
    sizes = [len(g.nodes) for s in partition(block, list(block.ops), {y.name}).segments
             for g in s.groups]
    assert sizes == [128, 128, 44], sizes
    monkeypatch.setenv("PDJIT_MAX_FUSED_OPS", "100")
    sizes = [len(g.nodes) for s in partition(block, list(block.ops), {y.name}).segments
             for g in s.groups]
    assert sizes == [100, 100, 100], sizes


def test_generated_code_python_cannot_compile_is_a_named_error():
    from pdjit.codegen.compiler import compile_source
    from pdjit.framework.errors import ProgramLimitError
    deep = "def f(x):\n" + "".join("    " * (i + 1) + f"for i{i} in x:\n" for i in range(25)) \
        + "    " * 26 + "pass\n"
    with pytest.raises(ProgramLimitError, match="too many statically nested blocks.*"
                                                "PDJIT_MAX_FUSED_OPS"):
        compile_source(deep, "<deep>")
    long_expr = "y = " + "(" * 5000 + "1" + ")" * 5000 + "\n"
    with pytest.raises(ProgramLimitError, match="<long>"):
        compile_source(long_expr, "<long>")


@pytest.mark.parametrize("mode", ["reference", "compiled"])
def test_endless_while_stops_at_the_iteration_bound(mode, monkeypatch):
    """A while whose counter update was deleted never ends; with PDJIT_MAX_LOOP_ITERATIONS it
    ends in a LoopLimitError naming the loop (op, block, index)."""
    from pdjit.framework.errors import LoopLimitError
    L = fluid.layers
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = L.data(name="x", shape=[2], dtype="float32", append_batch_size=False)
        i = L.fill_constant([1], "int64", 0)
        n = L.fill_constant([1], "int64", 3)
        _, out = L.while_loop(lambda i, x: L.less_than(i, n), lambda i, x: [i + 1, x + 1.0],
                              [i, x])

    def drop_increment(desc):  # the body's assign that carries i + 1 back into i
        body = desc.blocks[1]
        kept = [op for op in body.ops if not (op.type == "assign" and i.name in
                                              [a for s in op.outputs for a in s.arguments])]
        del body.ops[:]
        body.ops.extend(kept)
    x0 = np.zeros(2, np.float32)
    exe = fluid.Executor(mode=mode)
    got, = exe.run(main, feed={"x": x0}, fetch_list=[out], scope=fluid.Scope())
    np.testing.assert_array_equal(got, x0 + 3)
    endless = fluid.Program.parse_from_string(edited(main, drop_increment))
    assert len(endless.block(1).ops) < len(main.block(1).ops)
    monkeypatch.setenv("PDJIT_MAX_LOOP_ITERATIONS", "50")
    with bounded(), pytest.raises(LoopLimitError, match=r"op 'while' \(block 0, op "
                                                                 r"#\d+\).* after 50 iterations"):
        fluid.Executor(mode=mode).run(endless, feed={"x": x0}, fetch_list=[out],
                                      scope=fluid.Scope())


def test_special_and_huge_files_are_refused(paddle_mlp, tmp_path, capsys, monkeypatch):
    """/dev/zero or a FIFO given as a model or parameter file would be read for ever; a sparse
    file claiming gigabytes is refused by the allocation limit before it is read."""
    import os

    from pdjit.framework.errors import ModelFileError
    from pdjit.io import inference_model as inf
    fifo = tmp_path / "fifo.pdiparams"
    os.mkfifo(fifo)
    model = paddle_mlp.with_suffix(".pdmodel")
    zero = tmp_path / "zero.pdmodel"
    zero.symlink_to("/dev/zero")
    with bounded():
        for args, message in (((str(zero),), r"zero.pdmodel is a device, not a regular file"),
                              ((str(model), str(fifo)), r"fifo.pdiparams is a FIFO, not a "
                                                        r"regular file"),
                              ((str(model), str(tmp_path)), r"is a directory")):
            with pytest.raises(ModelFileError, match=message):
                inf.load_model(*args)
    big = tmp_path / "big.pdiparams"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: no disk used
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", str(1 << 28))
    with bounded(), pytest.raises(ModelFileError, match=r"big.pdiparams holds 1073741824 bytes, "
                                                        r"more than the allocation limit"):
        inf.load_model(str(model), str(big))
    assert cli_main(["check", str(zero)]) == 1
    err = capsys.readouterr().err
    assert "not a regular file" in err and err.count("\n") == 1


class _SharedArray:
    """Pickles as an ndarray whose data is ``raw`` (the same bytes object each time: the
    pickle memoizes it once and refers to it again)."""

    def __init__(self, raw, n):
        self.raw, self.n = raw, n

    def __reduce__(self):
        reconstruct = np.zeros(1).__reduce__()[0]
        return (reconstruct, (np.ndarray, (0,), b"b"),
                (1, (self.n,), np.dtype("float32"), False, self.raw))


def test_pickle_amplification_is_refused(tmp_path):
    """The restricted unpickler counts what it builds: shared references cost nothing twice,
    and array data beyond what the file can hold is refused."""
    import pickle

    from pdjit.framework.errors import ModelFileError
    from pdjit.io.checkpoint import load_pickle
    nested = []
    for _ in range(31):  # 2^31 leaves if walked as a tree
        nested = [nested, nested]
    path = tmp_path / "shared.pdparams"
    path.write_bytes(pickle.dumps({"x": nested}, protocol=2))
    assert path.stat().st_size < 400
    with bounded():
        got = load_pickle(str(path))
    assert got["x"][0] is got["x"][1]  # still shared: nothing was multiplied

    raw = bytes(1 << 20)
    path.write_bytes(pickle.dumps({f"v{i}": _SharedArray(raw, 1 << 18) for i in range(80)},
                                  protocol=4))
    assert path.stat().st_size < (1 << 20) + 4096
    with bounded(), pytest.raises(ModelFileError, match="array data beyond what the file's "
                                                        "size can hold"):
        load_pickle(str(path))
    # one honest array reads
    path.write_bytes(pickle.dumps({"v": _SharedArray(raw, 1 << 18)}, protocol=4))
    assert load_pickle(str(path))["v"].shape == (1 << 18,)

    big = {"w@@.0": np.zeros(4, np.float32),
           "UnpackBigParamInfor@@": {"w": {"OriginShape": [1 << 20, 1 << 20],
                                           "slices": ["w@@.0"]}}}
    path.write_bytes(pickle.dumps(big, protocol=2))
    with bounded(), pytest.raises(ModelFileError, match=r"OriginShape \[1048576, 1048576\] "
                                                        r"holds 1099511627776 elements, the "
                                                        r"slices 4"):
        load_pickle(str(path))


@pytest.mark.parametrize("mode", ["reference", "compiled"])
def test_fed_broadcast_view_is_not_copied_beyond_the_limit(mode, monkeypatch):
    """A 2^31-element broadcast view (a few bytes of data) fed to exe.run would be copied to
    8 GiB by the feed check; the copy counts against the allocation limit."""
    from pdjit.framework.errors import FeedError
    monkeypatch.setenv("PDJIT_MAX_ALLOC_BYTES", str(1 << 28))
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[-1, -1], dtype="float32",
                              append_batch_size=False)
        y = fluid.layers.scale(x, scale=2.0)
    view = np.broadcast_to(np.float32(1), (1 << 16, 1 << 15))
    with bounded(), pytest.raises(FeedError, match=r"feed: variable 'x': .* must be copied to "
                                                   r"8589934592 contiguous bytes, more than the "
                                                   r"allocation limit 268435456"):
        fluid.Executor(mode=mode).run(main, feed={"x": view}, fetch_list=[y],
                                      scope=fluid.Scope())
    small = np.broadcast_to(np.float32(1), (3, 2))  # a view within the limit is copied
    got, = fluid.Executor(mode=mode).run(main, feed={"x": small}, fetch_list=[y],
                                         scope=fluid.Scope())
    np.testing.assert_array_equal(got, np.full((3, 2), 2, np.float32))


def test_random_initializer_scratch_is_bounded():
    """uniform_random / gaussian_random draw piece by piece: the peak is the output and a few
    MB, not 6-8 times the output."""
    from pdjit.framework import random as prandom
    n = 1 << 23  # 32 MB of float32
    for draw in (lambda: prandom.uniform(3, (n,), -1.0, 1.0, np.float32),
                 lambda: prandom.normal(3, (n,), 0.0, 1.0, np.float32)):
        tracemalloc.start()
        try:
            out = draw()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < out.nbytes + (8 << 20), peak
    # the pieces join into the stream element i = f(key, i): a draw's head is a shorter draw
    np.testing.assert_array_equal(prandom.uniform(3, (1000,), -1.0, 1.0, np.float32),
                                  prandom.uniform(3, (n,), -1.0, 1.0, np.float32)[:1000])


def test_parameter_declared_without_dims_takes_the_files(paddle_mlp):
    """A persistable declared ``[]`` (dims not recorded) takes the dims of the value its file
    holds, so the compiled plan is built for the rank it gets: both executors agree."""
    from pdjit.io import inference_model as inf
    from pdjit.testing.op_test import assert_native
    path = paddle_mlp.with_suffix(".pdmodel")
    desc = pb.ProgramDesc.FromString(path.read_bytes())
    bias = next(v for v in desc.blocks[0].vars if v.name == "fc_1.b_0")
    want_dims = list(bias.type.lod_tensor.tensor.dims)
    del bias.type.lod_tensor.tensor.dims[:]
    path.write_bytes(desc.SerializeToString())
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    results = []
    for mode in ("reference", "compiled"):
        exe = fluid.Executor(mode=mode, strict=True)
        scope = fluid.Scope()
        model = inf.load_model(str(paddle_mlp))
        inf.commit_values(model.params, scope)
        assert list(model.program.global_block().var("fc_1.b_0").shape) == want_dims
        results.append(exe.run(model.program, feed={"x": x}, scope=scope,
                               fetch_list=inf.fetch_target_names(model.program))[0])
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)
    assert_native(exe)


def test_bare_exceptions_leave_entry_points_as_pdjit_errors(net):
    """An exception pdjit did not name leaves a public entry point as an InternalError that is
    also of the original class, with the original as its cause."""
    from pdjit.framework.errors import InternalError
    with pytest.raises(InternalError) as e:
        fluid.Executor(mode="reference").run(net[0], feed=5, fetch_list=[net[2]])
    assert isinstance(e.value, TypeError) and isinstance(e.value, PdjitError)
    assert isinstance(e.value.__cause__, TypeError)
    assert str(e.value).startswith("Executor.run: TypeError: ")
    with pytest.raises(InternalError, match="pdjit.verify: TypeError"):
        fluid.verify("main")


def test_parameter_files_are_read_tensor_by_tensor(tmp_path):
    """A parameter file is read straight into its arrays: the peak is the values, not the
    file twice over."""
    from pdjit.io.tensor_stream import write_tensor
    from pdjit.io.variables import read_values
    a = np.arange(1 << 22, dtype=np.float32)  # 16 MB each
    b = -a
    (tmp_path / "params").write_bytes(write_tensor(a) + write_tensor(b))
    tracemalloc.start()
    try:
        got = read_values(["a", "b"], str(tmp_path), "params")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)
    assert peak < a.nbytes + b.nbytes + (4 << 20), peak


def test_reduce_in_dtype_is_checked_and_inferred():
    """A reduction's in_dtype must be -1 or a data type code; X is cast to it before the
    reduction in the reference, so inference does the same and a declaration that disagrees
    is refused before either executor runs."""
    main = fluid.Program()
    with fluid.program_guard(main, fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[3], dtype="float32")
        fluid.layers.reduce_sum(x)
    assert re.search(r"op 'reduce_sum' .*'in_dtype': expected -1 or a data type code, got -5",
                     refused(edited(main, set_attr("reduce_sum", "in_dtype", -5))))
    assert re.search(r"declared float32 vs inferred float64",
                     refused(edited(main, set_attr("reduce_sum", "in_dtype", 6))))


def test_scalar_declared_0d_but_computed_1_agrees(fixtures_dir):
    """A value of one element declared [] where its op computes [1] (the verifier accepts
    both forms): the op runs its reference in the compiled plan (which stores the declared
    form, as the reference executor does; a ReferenceStepWarning says so), the rest native;
    both modes give the same values."""
    from pdjit.io import inference_model as inf
    from pdjit.testing.op_test import assert_native
    stem = fixtures_dir / "models" / "cond_while"
    desc = pb.ProgramDesc.FromString(stem.with_suffix(".pdmodel").read_bytes())
    v = next(v for v in desc.blocks[0].vars if v.name == "fill_constant_3.tmp_0")
    assert list(v.type.lod_tensor.tensor.dims) == [1]
    del v.type.lod_tensor.tensor.dims[:]
    program = inf.parse_model(desc.SerializeToString(), "cond_while.pdmodel")
    params = inf.params_from_bytes(program, stem.with_suffix(".pdiparams").read_bytes(), "p")
    feeds = {n: np.random.default_rng(0).standard_normal(
        [2 if d < 0 else d for d in program.global_block().var(n).shape]).astype(np.float32)
        for n in inf.feed_target_names(program)}
    results = []
    for mode in ("reference", "compiled"):
        exe = fluid.Executor(mode=mode, strict=True)
        scope = fluid.Scope()
        inf.commit_values(params, scope)
        warns = pytest.warns(ReferenceStepWarning, match="declared \\[\\] that it computes") \
            if mode == "compiled" else contextlib.nullcontext()
        with warns:
            results.append(exe.run(program, feed=feeds, scope=scope,
                                   fetch_list=inf.fetch_target_names(program)))
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert_native(exe)
