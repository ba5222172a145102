"""The fusion partition (``pdjit.passes.fusion.partition``) on small programs built here with the
Fluid API, for the CPU target: which ops share a group, where a reduction, an opaque op, a
reference op, a change of shape or an unrelated input ends a chain, and which values a group
stores (read by another group, fetched, persistable). Nothing compiles: the partition reads the
program only.

Oracle: the partition's contract (its module docstring), applied by hand to each program; the
expected groups are written here from what the ops compute.
"""
import pdjit as fluid
from pdjit.codegen.target import get_target
from pdjit.passes.fusion import live_names, partition

L = fluid.layers


def _build(body):
    """``body(layers) -> (fetched vars, extra)`` inside a fresh program; the program's block,
    ops, fetched vars and ``extra``."""
    prog, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(prog, startup), fluid.unique_name.guard():
        fetch, extra = body(L)
    block = prog.global_block()
    return prog, block, list(block.ops), fetch, extra


def _partition(prog, block, ops, fetch, declined=frozenset()):
    live = live_names(prog, block, [v.name for v in fetch])
    part = partition(block, ops, live, declined, target=get_target("cpu"))
    groups = [g for seg in part.segments for g in seg.groups]
    # every op in exactly one group, the groups in program order
    assert [op for g in groups for op in g.ops] == ops, part.describe()
    return part, groups


def _kinds(groups):
    return [(g.kind, [op.type for op in g.ops]) for g in groups]


def _stored(groups):
    return [set(g.stored) for g in groups]


def _not_joined(part):
    """The ops the partition log names (``type#index``): those that did not join the group
    open before them."""
    return {line.split(":")[0] for line in part.log}


def test_an_elementwise_chain_is_one_group_storing_only_what_is_fetched():
    def body(L):
        x = L.data("x", [4])
        y = L.data("y", [4])
        d = L.elementwise_add(L.exp(L.relu(L.scale(x, 2.0, 1.0))), y)
        return [d], None

    prog, block, ops, (d,), _ = _build(body)
    assert [op.type for op in ops] == ["scale", "relu", "exp", "elementwise_add"]
    part, groups = _partition(prog, block, ops, [d])
    assert len(part.segments) == 1 and part.segments[0].native
    assert _kinds(groups) == [("elementwise", ["scale", "relu", "exp", "elementwise_add"])]
    assert groups[0].shape == (-1, 4)
    assert _stored(groups) == [{d.name}]   # the three values between stay in registers
    assert part.log == []


def test_a_reduction_ends_the_chain_that_computes_its_input():
    def body(L):
        x = L.data("x", [4])
        s = L.reduce_sum(L.exp(L.relu(x)), dim=1)
        t = L.scale(s, 3.0)
        return [t], s

    prog, block, ops, (t,), s = _build(body)
    assert [op.type for op in ops] == ["relu", "exp", "reduce_sum", "scale"]
    part, groups = _partition(prog, block, ops, [t])
    assert len(part.segments) == 1
    assert _kinds(groups) == [("reduction", ["relu", "exp", "reduce_sum"]),
                              ("elementwise", ["scale"])]
    # the reduction's group runs over its input's shape; the sum is read by the next group
    assert groups[0].shape == (-1, 4) and groups[1].shape == (-1,)
    assert _stored(groups) == [{s.name}, {t.name}]


def test_a_reduction_of_a_value_the_chain_does_not_compute_is_a_group_of_its_own():
    def body(L):
        x = L.data("x", [4])
        z = L.data("z", [4])
        a = L.relu(x)
        s = L.reduce_sum(z, dim=1)
        return [a, s], None

    prog, block, ops, (a, s), _ = _build(body)
    part, groups = _partition(prog, block, ops, [a, s])
    assert _kinds(groups) == [("elementwise", ["relu"]), ("reduction", ["reduce_sum"])]
    assert groups[1].shape == (-1, 4)
    assert _stored(groups) == [{a.name}, {s.name}]
    assert _not_joined(part) == {"reduce_sum#1"}


def test_an_opaque_op_breaks_the_chain_and_values_read_later_are_stored():
    """relu -> exp -> mul (a GEMM: a library call) -> relu, then an add reading the first relu's
    value again: the add's shape [-1, 4] is not the open group's [-1, 3]."""
    def body(L):
        x = L.data("x", [4])
        w = L.data("w", [4, 3], append_batch_size=False)
        a = L.relu(x)
        b = L.exp(a)
        m = L.mul(b, w)
        c = L.relu(m)
        e = L.elementwise_add(a, x)
        return [c, e], (a, b, m)

    prog, block, ops, (c, e), (a, b, m) = _build(body)
    assert [op.type for op in ops] == ["relu", "exp", "mul", "relu", "elementwise_add"]
    part, groups = _partition(prog, block, ops, [c, e])
    assert len(part.segments) == 1 and part.segments[0].native
    assert _kinds(groups) == [("elementwise", ["relu", "exp"]), ("opaque", ["mul"]),
                              ("elementwise", ["relu"]), ("elementwise", ["elementwise_add"])]
    assert [g.shape for g in groups if g.kind == "elementwise"] == [(-1, 4), (-1, 3), (-1, 4)]
    # a: read by the add's group; b: read by the GEMM; m: the GEMM's result, read by relu
    assert _stored(groups) == [{a.name, b.name}, {m.name}, {c.name}, {e.name}]
    assert _not_joined(part) == {"mul#2", "elementwise_add#4"}


def test_an_op_reading_nothing_of_the_open_group_starts_another():
    """Equal build-time shapes with -1 dims need not be equal at run time: an op joins only a
    group whose values (read or computed) it reads."""
    def body(L):
        x = L.data("x", [4])
        x2 = L.data("x2", [4])
        a = L.relu(x)
        b = L.exp(x)         # reads x, which the open group reads: joins it
        c = L.relu(x2)       # reads nothing of it: a group of its own
        return [a, b, c], None

    prog, block, ops, fetch, _ = _build(body)
    part, groups = _partition(prog, block, ops, fetch)
    assert _kinds(groups) == [("elementwise", ["relu", "exp"]), ("elementwise", ["relu"])]
    assert _stored(groups) == [{fetch[0].name, fetch[1].name}, {fetch[2].name}]
    assert _not_joined(part) == {"relu#2"}


def test_an_op_that_runs_its_reference_splits_the_segments():
    """An op whose lowering declined (``declined``) runs its NumPy reference: a group and a
    segment of its own between two native segments, every output stored."""
    def body(L):
        x = L.data("x", [4])
        a = L.relu(x)
        b = L.exp(a)
        c = L.tanh(b)
        return [c], (a, b)

    prog, block, ops, (c,), (a, b) = _build(body)
    part, groups = _partition(prog, block, ops, [c], declined={id(ops[1])})
    assert _kinds(groups) == [("elementwise", ["relu"]), ("reference", ["exp"]),
                              ("elementwise", ["tanh"])]
    assert [seg.native for seg in part.segments] == [True, False, True]
    assert _stored(groups) == [{a.name}, {b.name}, {c.name}]
    assert _not_joined(part) == {"exp#1"}


def test_persistable_values_are_stored_from_inside_a_chain():
    def body(L):
        x = L.data("x", [4])
        a = L.scale(x, 0.5)
        b = L.relu(a)
        c = L.exp(b)
        return [c], (a, b)

    prog, block, ops, (c,), (a, b) = _build(body)
    block.var(b.name).persistable = True
    live = live_names(prog, block, [c.name])
    assert b.name in live and a.name not in live
    part, groups = _partition(prog, block, ops, [c])
    assert _kinds(groups) == [("elementwise", ["scale", "relu", "exp"])]
    assert _stored(groups) == [{b.name, c.name}]


def _softmax_of_sum(fetch_sum):
    def body(L):
        x = L.data("x", [4])
        bias = L.data("bias", [4], append_batch_size=False)
        h = L.elementwise_add(x, bias)
        p = L.softmax(h)
        return ([h, p] if fetch_sum else [p]), (h, p)
    return body


def test_a_chain_only_a_row_wise_op_reads_is_its_prologue():
    """softmax over the last axis reads each row of its input once: the add computing that
    input runs inside softmax's row loop, and its value is never stored."""
    prog, block, ops, fetch, (h, p) = _build(_softmax_of_sum(False))
    assert [op.type for op in ops] == ["elementwise_add", "softmax"]
    part, groups = _partition(prog, block, ops, fetch)
    assert _kinds(groups) == [("opaque", ["elementwise_add", "softmax"])]
    assert _stored(groups) == [{p.name}]


def test_no_prologue_when_the_chain_s_value_is_needed_after_the_block():
    prog, block, ops, fetch, (h, p) = _build(_softmax_of_sum(True))
    part, groups = _partition(prog, block, ops, fetch)
    assert _kinds(groups) == [("elementwise", ["elementwise_add"]), ("opaque", ["softmax"])]
    assert _stored(groups) == [{h.name}, {p.name}]
    assert _not_joined(part) == {"softmax#1"}


def test_a_chain_longer_than_the_fused_op_bound_is_cut_into_groups(monkeypatch):
    monkeypatch.setenv("PDJIT_MAX_FUSED_OPS", "2")

    def body(L):
        x = L.data("x", [4])
        return [L.relu(L.sigmoid(L.tanh(L.exp(L.relu(x)))))], None

    prog, block, ops, fetch, _ = _build(body)
    part, groups = _partition(prog, block, ops, fetch)
    assert [len(g.nodes) for g in groups] == [2, 2, 1]
    assert all(g.kind == "elementwise" for g in groups)
    assert len(part.segments) == 1
    assert _not_joined(part) == {"tanh#2", "relu#4"}
    # each cut stores the value the next group reads
    assert _stored(groups) == [{ops[1].output_arg_names[0]}, {ops[3].output_arg_names[0]},
                               {fetch[0].name}]

