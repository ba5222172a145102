"""The collective rewrite, in one process: the programs follow what PaddlePaddle 3.3.1 writes
(``tests/fixtures/paddle/distributed/paddle_layouts.json``, written by Paddle itself:
``tests/fixtures/make_paddle_layouts.py``), the
collective ops mean what Paddle's do (checked with a communicator written here that holds the
values of every simulated rank), the data sharding and the launcher's command line."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import pdjit as fluid
from pdjit.framework import unique_name

HERE = pathlib.Path(__file__).parent
FIXTURES = HERE.parent / "fixtures" / "paddle" / "distributed"
LAYOUTS = json.loads((FIXTURES / "paddle_layouts.json").read_text())
COLLECTIVE = {"broadcast", "all_reduce", "c_sync_calc_stream", "c_sync_comm_stream",
              "coalesce_tensor"}


def _mlp(fuse: bool, nrings: int, fuse_num: int = 3):
    """Paddle's fixture model (fc 4->3 relu, fc 3->1, mean squared error, Adam), transpiled."""
    from pdjit.distributed import GradAllReduce

    main, startup = fluid.Program(), fluid.Program()
    with unique_name.guard(), fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        h = fluid.layers.fc(x, 3, act="relu")
        p = fluid.layers.fc(h, 1)
        loss = fluid.layers.mean(fluid.layers.square(p - y))
        fluid.optimizer.Adam(0.01).minimize(loss)
        t = GradAllReduce(nrings=nrings, fuse=fuse, fuse_grad_size_in_num=fuse_num)
        t.transpile(startup, main, 2)
    return main, startup, t


def _ours(program):
    out = []
    for op in program.global_block().ops:
        a = op.all_attrs()
        out.append([op.type, {k: list(v) for k, v in op.inputs.items() if v},
                    {k: list(v) for k, v in op.outputs.items() if v}, int(a.get("op_role", 0)),
                    list(a.get("op_role_var", [])), a])
    return out


def _projection(ops):
    """What the layout is made of: the collective ops (slots and attributes), the loss
    gradient's fill_constant and scale, the ops producing parameter gradients (role, role
    vars) and the optimizer ops, in order. (The forward ops' own types differ: pdjit's
    ``layers.mean`` writes ``mean`` where Paddle 3.3.1's ``paddle.mean`` writes
    ``reduce_mean``.)"""
    keep = ("ring_id", "root", "reduce_type", "scale", "copy_data", "use_align", "dtype")
    rows = []
    for t, ins, outs, role, role_var, attrs in ops:
        if role & 2:
            continue  # the optimizer ops: compared as a set (Paddle orders them by name)
        if t in COLLECTIVE or (t in ("fill_constant", "scale") and role & 1) or role_var:
            rows.append((t, json.dumps(ins, sort_keys=True) if t in COLLECTIVE else "",
                         json.dumps(outs, sort_keys=True) if t in COLLECTIVE else "", role,
                         tuple(role_var),
                         tuple(sorted((k, round(float(v), 6)) for k, v in attrs.items()
                                      if k in keep and not (t == "fill_constant")))))
    return rows


def _updates(ops):
    return sorted((t, tuple(rv)) for t, _, _, role, rv, _ in ops if role & 2)


def test_grad_allreduce_layout_is_paddles_unfused_two_rings():
    main, startup, _ = _mlp(fuse=False, nrings=2)
    want = LAYOUTS["grad_allreduce"]
    assert _projection(_ours(main)) == _projection(want["main"])
    assert _updates(_ours(main)) == _updates(want["main"])
    # startup: Paddle's tail (its initialisers differ in form), broadcasts then the syncs
    ours = _ours(startup)
    first = next(i for i, o in enumerate(ours) if o[0] == "broadcast")
    theirs = want["startup"][next(i for i, o in enumerate(want["startup"])
                                  if o[0] == "broadcast"):]
    assert _projection(ours[first:]) == _projection(theirs)
    assert [o[0] for o in ours[first:]] == ["broadcast"] * 4 + ["c_sync_comm_stream"] * 2


def test_fused_layout_is_fleets_with_buckets_per_dtype_and_count():
    main, startup, t = _mlp(fuse=True, nrings=1, fuse_num=3)
    want = LAYOUTS["fleet_fused"]
    assert _projection(_ours(main)) == _projection(want["main"])
    assert _updates(_ours(main)) == _updates(want["main"])
    # two buckets: three gradients, then one (fuse_grad_size_in_num = 3): 2 all-reduce calls
    assert [len(g) for _, g, _ in t.buckets] == [3, 1]
    assert sum(o.type == "all_reduce" for o in main.global_block().ops) == 2
    bcast = sorted(o[1]["x"][0] for o in _ours(startup) if o[0] == "broadcast")
    assert bcast == sorted(o[1]["x"][0] for o in want["startup"] if o[0] == "broadcast")
    assert _ours(startup)[-1][0] == want["startup"][-1][0] == "c_sync_comm_stream"


class _Ranks:
    """A communicator of ``size`` simulated ranks: ``values[r]`` is what rank r contributes
    (set by the test); broadcast returns the root's."""

    def __init__(self, size, rank=0):
        self.size, self.rank, self.calls, self.others = size, rank, 0, []

    def allreduce(self, a, op=0, ring_id=0):
        self.calls += 1
        parts = [a] + [f(a) for f in self.others]
        return {0: np.sum, 1: np.max, 2: np.min, 3: np.prod}[op](np.stack(parts), axis=0) \
            if op != 4 else np.mean(np.stack(parts), axis=0).astype(a.dtype)

    def broadcast(self, a, root=0, ring_id=0):
        self.calls += 1
        return np.array(a if root == self.rank else a * 0 + 7, copy=True)


@pytest.fixture
def ranks():
    from pdjit.ops import collective

    r = _Ranks(3)
    collective.set_communicator(r)
    yield r
    collective.set_communicator(None)


def _run_op(op_type, inputs, outputs, attrs, feed, fetch):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        block = main.global_block()
        for name, v in feed.items():
            block.create_var(name=name, shape=v.shape, dtype=v.dtype)
        for names in outputs.values():
            for name in names:
                block.create_var(name=name, dtype=next(iter(feed.values())).dtype)
        block.append_op(op_type, inputs=inputs, outputs=outputs, attrs=attrs)
    return fluid.Executor(strict=True).run(main, feed=feed, fetch_list=fetch,
                                           scope=fluid.Scope())


@pytest.mark.parametrize("reduce_type", [0, 1, 2, 3, 4])
def test_all_reduce_reduces_over_every_rank(ranks, reduce_type):
    import pdjit.distributed  # noqa: F401 (registers the ops)

    ranks.others = [lambda a: a * 2, lambda a: a - 1]
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    (out,) = _run_op("all_reduce", {"x": ["x"]}, {"out": ["x"]},
                     {"reduce_type": reduce_type}, {"x": x}, ["x"])
    stack = np.stack([x, 2 * x, x - 1])
    want = [stack.sum(0), stack.max(0), stack.min(0), stack.prod(0), stack.mean(0)][reduce_type]
    np.testing.assert_allclose(out, want, rtol=1e-6)
    (out2,) = _run_op("c_allreduce_sum", {"X": ["x"]}, {"Out": ["x"]}, {}, {"x": x}, ["x"])
    np.testing.assert_allclose(out2, stack.sum(0), rtol=1e-6)


def test_broadcast_takes_the_roots_value(ranks):
    import pdjit.distributed  # noqa: F401

    x = np.full((2, 2), 3.0, np.float32)
    (mine,) = _run_op("broadcast", {"x": ["x"]}, {"out": ["x"]}, {"root": 0}, {"x": x}, ["x"])
    np.testing.assert_array_equal(mine, x)
    (theirs,) = _run_op("c_broadcast", {"X": ["x"]}, {"Out": ["x"]}, {"root": 2}, {"x": x},
                        ["x"])
    np.testing.assert_array_equal(theirs, np.full((2, 2), 7.0))
    with pytest.raises(Exception, match="root 5 is not a rank"):
        _run_op("broadcast", {"x": ["x"]}, {"out": ["x"]}, {"root": 5}, {"x": x}, ["x"])


def test_coalesce_tensor_packs_aligned_views():
    import pdjit.distributed  # noqa: F401

    a = np.arange(3, dtype=np.float32)
    b = np.arange(4, dtype=np.float32).reshape(2, 2) + 10
    # (copy_data, alignment in elements (None: use_align off, -1: Paddle's CPU 4 KiB), size,
    # offset of b)
    for copy, align, want_size, b_at in ((True, 8, 16, 8), (False, -1, 2048, 1024),
                                         (True, None, 7, 3)):
        attrs = {"copy_data": copy, "dtype": 5, "use_align": align is not None}
        if align is not None:
            attrs["align_size"] = align * 4 if align > 0 else -1
        oa, ob, fused = _run_op("coalesce_tensor", {"Input": ["a", "b"]},
                                {"Output": ["oa", "ob"], "FusedOutput": ["f"]}, attrs,
                                {"a": a, "b": b}, ["oa", "ob", "f"])
        assert fused.shape == (want_size,) and ob.shape == (2, 2)
        if copy:
            np.testing.assert_array_equal(oa, a)
            np.testing.assert_array_equal(ob, b)
            np.testing.assert_array_equal(fused[:3], a)
            np.testing.assert_array_equal(fused[b_at:b_at + 4], b.ravel())
            assert not fused[3:b_at].any()  # the alignment gap: zeros
        else:
            assert not fused.any()
    _, _, f = _run_op("coalesce_tensor", {"Input": ["a", "b"]},
                      {"Output": ["oa", "ob"], "FusedOutput": ["f"]},
                      {"set_constant": True, "constant": 2.5, "dtype": 5, "use_align": False},
                      {"a": a, "b": b}, ["oa", "ob", "f"])
    np.testing.assert_array_equal(f, np.full(7, 2.5, np.float32))
    with pytest.raises(Exception, match="expected the fused dtype float64"):
        _run_op("coalesce_tensor", {"Input": ["a"]}, {"Output": ["oa"], "FusedOutput": ["f"]},
                {"dtype": 6}, {"a": a}, ["f"])


def test_fused_bucket_reduces_the_gradients_the_backward_ops_wrote(ranks):
    """Paddle's fused layout (the buffer made before the gradients are written) gives every
    rank the sum of every rank's gradient, in one all-reduce call per bucket."""
    main, startup, t = _mlp(fuse=True, nrings=1, fuse_num=3)
    ranks.others = [lambda a: a * 2, lambda a: a * 3]  # the sum: 6x this rank's gradients
    scope = fluid.Scope()
    exe = fluid.Executor(strict=True)
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(5, 4)).astype(np.float32),
            "y": rng.normal(size=(5, 1)).astype(np.float32)}
    grads = [g for _, gs, _ in t.buckets for g in gs]
    # the reference: the same program without the collectives (1 rank), gradients scaled 1/2
    ref_main, ref_startup, _ = _mlp(fuse=True, nrings=1, fuse_num=3)
    ref_scope = fluid.Scope()
    exe.run(ref_startup, scope=ref_scope)
    for n in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"):
        ref_scope.var(n).value = np.array(scope.find_var(n).value)
    from pdjit.ops import collective
    collective.set_communicator(None)
    want = exe.run(ref_main, feed=feed, fetch_list=grads, scope=ref_scope)
    collective.set_communicator(ranks)
    calls = ranks.calls
    got = exe.run(main, feed=feed, fetch_list=grads, scope=scope)
    assert ranks.calls - calls == 2
    for g, w, n in zip(got, want, grads):
        np.testing.assert_allclose(g, 6 * w, rtol=1e-5, atol=1e-7, err_msg=n)


def test_sharding_gives_each_rank_its_own_part_of_each_epoch():
    from pdjit.distributed import epoch_order, shard_batches, shard_indices, split_batch

    parts = [shard_indices(11, epoch=2, seed=5, rank=r, nranks=3) for r in range(3)]
    assert all(len(p) == 3 for p in parts)  # 11 % 3 samples left out: equal step counts
    allp = np.concatenate(parts)
    assert len(set(allp.tolist())) == 9 and set(allp.tolist()) <= set(range(11))
    np.testing.assert_array_equal(epoch_order(11, 2, 5), epoch_order(11, 2, 5))
    assert not np.array_equal(epoch_order(50, 0, 5), epoch_order(50, 1, 5))
    batches = [list(shard_batches(10, 4, epoch=0, seed=1, rank=r, nranks=2)) for r in range(2)]
    order = epoch_order(10, 0, 1)
    assert len(batches[0]) == 2
    np.testing.assert_array_equal(np.concatenate([batches[0][0], batches[1][0]]), order[:4])
    x = np.arange(12).reshape(6, 2)
    np.testing.assert_array_equal(split_batch((x, x[:, 0]), rank=1, nranks=3)[0], x[2:4])
    with pytest.raises(ValueError, match="divisible by the number of ranks 4"):
        split_batch(x, rank=0, nranks=4)
    with pytest.raises(ValueError, match="multiple of the number of ranks 3"):
        list(shard_batches(10, 4, rank=0, nranks=3))
    with pytest.raises(ValueError, match="0 <= rank < nranks"):
        shard_indices(10, rank=2, nranks=2)


def test_one_rank_without_mpi_leaves_the_programs_alone():
    from pdjit.distributed import GradAllReduce

    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[2], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.fc(x, 1))
        fluid.optimizer.SGD(0.1).minimize(loss)
    before = main.serialize_to_string()
    GradAllReduce().transpile(startup, main, 1)
    assert main.serialize_to_string() == before
    with pytest.raises(ValueError, match="nrings must be >= 1"):
        GradAllReduce(nrings=0)
    GradAllReduce(nrings=1).transpile(startup, main, 2)
    with pytest.raises(ValueError, match="transpiled twice"):
        GradAllReduce().transpile(startup, main, 2)


def test_launch_command_line(tmp_path):
    from pdjit.distributed import launch

    hosts = tmp_path / "hosts"
    hosts.write_text("node1:2\n# a comment\nnode2\n")
    cmd = launch.command(["train.py", "--lr", "1"], 2, hostfile=str(hosts),
                         mpiexec="/bin/true")
    assert cmd[:5] == ["/bin/true", "-f", str(hosts), "-ppn", "2"]
    assert cmd[5:7] == ["-n", "4"] and cmd[-3:] == ["train.py", "--lr", "1"]
    assert launch.command(["t.py"], 3, ips="a,b", mpiexec="/bin/true")[1:6] == \
        ["-hosts", "a,b", "-ppn", "3", "-n"]
    env = launch.yielding_env({}, threads=1)
    assert env["MPIR_CVAR_POLLS_BEFORE_YIELD"] == "1" and env["PDJIT_NUM_THREADS"] == "1"
    with pytest.raises(FileNotFoundError, match="no such executable"):
        launch.command(["t.py"], 2, mpiexec=str(tmp_path / "nope"))
    with pytest.raises(SystemExit):
        launch.main(["--nproc_per_node", "0", "t.py"])


def test_fleet_minimize_transpiles_and_compares_the_programs(monkeypatch):
    """fleet.distributed_optimizer(...).minimize on (simulated) 2 ranks: the programs are
    rewritten with the strategy's buckets, and both are compared across the ranks."""
    from pdjit.distributed import fleet

    seen = []

    class Two:
        rank, size = 0, 2

        def check_same(self, what, digest):
            seen.append((what, len(digest)))

    monkeypatch.setattr(fleet, "_comm", Two())
    main, startup = fluid.Program(), fluid.Program()
    with unique_name.guard(), fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.fc(fluid.layers.fc(x, 3), 1))
        s = fleet.DistributedStrategy()
        s.fuse_grad_size_in_num = 2
        opt = fleet.distributed_optimizer(fluid.optimizer.SGD(0.1), s)
        opt.minimize(loss)
    assert [w for w, _ in seen] == ["startup program", "main program"]
    types = [op.type for op in main.global_block().ops]
    assert types.count("coalesce_tensor") == 2 and types.count("all_reduce") == 2
    assert [op.type for op in startup.global_block().ops].count("broadcast") == 4
    with pytest.raises(TypeError, match="expected an optimizer"):
        fleet.distributed_optimizer(object())
    with pytest.raises(NotImplementedError, match="parameter-server"):
        fleet.init(is_collective=False)


def test_a_program_paddle_transpiled_runs_and_matches_paddle(ranks):
    """The startup and main programs Paddle 3.3.1's GradAllReduce wrote (serialised by Paddle:
    broadcast, c_sync_*, all_reduce on 2 rings) run here on 2 simulated ranks fed the same
    batch; one step reaches the parameters Paddle itself reached running the program before
    the rewrite from the same initial values."""
    d = FIXTURES / "paddle_collective"
    import pdjit.distributed  # noqa: F401

    startup = fluid.Program.parse_from_string((d / "startup.pb").read_bytes())
    main = fluid.Program.parse_from_string((d / "main.pb").read_bytes())
    values = np.load(d / "values.npz")
    ranks.size, ranks.others = 2, [lambda a: a]  # the other rank: the same gradients
    scope = fluid.Scope()
    exe = fluid.Executor(strict=True)
    exe.run(startup, scope=scope)
    names = [k[len("init/"):] for k in values.files if k.startswith("init/")]
    for n in names:
        scope.var(n).value = values[f"init/{n}"].copy()
    feed = {k[len("feed/"):]: values[k] for k in values.files if k.startswith("feed/")}
    calls = ranks.calls
    exe.run(main, feed=feed, fetch_list=[], scope=scope)
    assert ranks.calls - calls == 4  # one all_reduce per gradient (unfused)
    for n in names:
        np.testing.assert_allclose(np.array(scope.find_var(n).value), values[f"after/{n}"],
                                   rtol=1e-5, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_other_optimizers_clipping_and_regularisation_work_unchanged(ranks, fuse):
    """Momentum with clipping by global norm and L2 regularisation: the rewritten program on 2
    simulated ranks fed the same batch takes the step the program without the rewrite takes."""
    from pdjit.distributed import GradAllReduce
    from pdjit.ops import collective

    def build(transpile):
        main, startup = fluid.Program(), fluid.Program()
        startup.random_seed = 3
        with unique_name.guard(), fluid.program_guard(main, startup):
            x = fluid.layers.data(name="x", shape=[4], dtype="float32")
            y = fluid.layers.data(name="y", shape=[2], dtype="float32")
            p = fluid.layers.fc(fluid.layers.fc(x, 5, act="tanh"), 2)
            loss = fluid.layers.mean(fluid.layers.square_error_cost(p, y))
            fluid.optimizer.Momentum(
                0.1, 0.9, grad_clip=fluid.clip.GradientClipByGlobalNorm(0.01),
                regularization=fluid.regularizer.L2Decay(0.01)).minimize(loss)
        if transpile:
            GradAllReduce(nrings=1, fuse=fuse).transpile(startup, main, 2)
        return main, startup

    rng = np.random.default_rng(4)
    feed = {"x": rng.normal(size=(6, 4)).astype(np.float32),
            "y": rng.normal(size=(6, 2)).astype(np.float32)}
    results = []
    for transpile in (False, True):
        collective.set_communicator(ranks if transpile else None)
        ranks.size, ranks.others = 2, [lambda a: a]
        main, startup = build(transpile)
        scope = fluid.Scope()
        exe = fluid.Executor(strict=True)
        exe.run(startup, scope=scope)
        for _ in range(3):
            exe.run(main, feed=feed, fetch_list=[], scope=scope)
        results.append({p.name: np.array(scope.find_var(p.name).value)
                        for p in main.global_block().all_parameters()})
    for n in results[0]:
        np.testing.assert_allclose(results[1][n], results[0][n], rtol=1e-5, atol=1e-7,
                                   err_msg=n)
