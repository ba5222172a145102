"""Native steps with LoD inputs: LoD propagation through fused chains and fc, and the sequence
ops' loops over offsets, checked against NumPy computed over explicit lists of sequences and
against the reference executor; every step must run natively, without falling back."""
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import pdjit as fluid
from pdjit.framework.errors import OpRunError
from pdjit.runtime.plan import NativeStep
from pdjit.testing.op_test import build_op_program

# op 'lod_reset' has no native code for some inputs tested here: a compiled
# plan runs its NumPy reference by design and says so once per process
pytestmark = pytest.mark.filterwarnings(
    r"ignore:op '(lod_reset)' runs its NumPy reference"
    ":pdjit.framework.errors.ReferenceStepWarning")

F32 = np.float32


def _steps(exe):
    return [s for _, plan in exe._plans.values() for s in plan.steps]


def assert_native(exe):
    """Every step of every plan ran native code, and none fell back to the references."""
    steps = _steps(exe)
    assert steps
    for s in steps:
        assert isinstance(s, NativeStep), f"not native: {s.describe()}"
        assert s.fallbacks == 0 and s.retired is None, s.describe()


def run_compiled(op_type, inputs, attrs=None, outputs=None):
    """Run one op in both executors; return the compiled results (values as fetched with
    return_numpy=False), after checking the compiled run was native and equals the reference."""
    prog, feed, outs = build_op_program(op_type, inputs, attrs, outputs=outputs)
    fetch = [v for vs in outs.values() for v in vs]
    exe = fluid.Executor(mode="compiled")
    got = exe.run(prog, feed=feed, fetch_list=fetch, scope=fluid.Scope(), return_numpy=False)
    assert_native(exe)
    ref = fluid.Executor(mode="reference").run(prog, feed=feed, fetch_list=fetch,
                                               scope=fluid.Scope(), return_numpy=False)
    for v, g, r in zip(fetch, got, ref):
        assert g.lod() == r.lod(), f"{op_type} {v.name}: LoD {g.lod()} vs reference {r.lod()}"
        np.testing.assert_allclose(np.array(g), np.array(r), rtol=2e-6, atol=1e-6,
                                   err_msg=f"{op_type} {v.name}")
    return {v.name: g for v, g in zip(fetch, got)}


def lod_of(lengths):
    return [[0] + np.cumsum(lengths).astype(int).tolist()]


def seqs_of(x, lengths):
    """The sequences as an explicit Python list of arrays."""
    out, at = [], 0
    for n in lengths:
        out.append(x[at:at + n])
        at += n
    return out


lengths_st = st.lists(st.integers(0, 6), min_size=1, max_size=7)


# ---- LoD through native chains -----------------------------------------------------------------
def test_lod_flows_through_a_fused_chain_and_fc():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data(name="x", shape=[None, 3], dtype="float32", lod_level=1)
        h = fluid.layers.relu(fluid.layers.scale(x, scale=2.0, bias=-0.5))
        y = fluid.layers.fc(h, 4, act="tanh")
        total = fluid.layers.reduce_sum(y)
    scope = fluid.Scope()
    fluid.Executor(mode="reference").run(startup, scope=scope)
    exe = fluid.Executor(mode="compiled")
    data = np.random.rand(6, 3).astype(F32)
    for lens in ([2, 0, 4], [6], [1, 1, 1, 3]):  # one plan, several LoDs
        t = fluid.create_lod_tensor(data, [lens])
        gh, gy, gt = exe.run(main, feed={"x": t}, fetch_list=[h, y, total], scope=scope,
                             return_numpy=False)
        assert gh.lod() == lod_of(lens) and gy.lod() == lod_of(lens) and gt.lod() == []
        w = np.array(scope.find_var("fc_0.w_0").value)
        b = np.array(scope.find_var("fc_0.b_0").value)
        want_h = np.maximum(data * 2 - 0.5, 0)
        np.testing.assert_allclose(np.array(gh), want_h, rtol=1e-6)
        np.testing.assert_allclose(np.array(gy), np.tanh(want_h @ w + b), rtol=1e-5, atol=1e-6)
    main_steps = [s for s in _steps(exe) if "scale" in s.describe()]
    assert len(main_steps) == 1
    assert_native(exe)


def test_lod_reaches_a_sequence_op_through_the_segment():
    """fc then sequence_pool in one native function: the pool's offsets come from x's LoD,
    carried through fc's output inside the segment."""
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data(name="x", shape=[None, 3], dtype="float32", lod_level=1)
        h = fluid.layers.fc(x, 5)
        pooled = fluid.layers.sequence_pool(h, "sum")
        soft = fluid.layers.sequence_softmax(fluid.layers.fc(x, 1))
    scope = fluid.Scope()
    fluid.Executor(mode="reference").run(startup, scope=scope)
    exe = fluid.Executor(mode="compiled")
    data = np.random.rand(7, 3).astype(F32)
    lens = [3, 0, 4]
    gp, gs = exe.run(main, feed={"x": fluid.create_lod_tensor(data, [lens])},
                     fetch_list=[pooled, soft], scope=scope, return_numpy=False)
    assert_native(exe)
    assert len(_steps(exe)) == 1
    w, b = (np.array(scope.find_var(n).value) for n in ("fc_0.w_0", "fc_0.b_0"))
    hv = data @ w + b
    want = [s.sum(axis=0) if len(s) else np.zeros(5, F32) for s in seqs_of(hv, lens)]
    np.testing.assert_allclose(np.array(gp), np.stack(want), rtol=1e-5, atol=1e-6)
    assert gp.lod() == [] and gs.lod() == lod_of(lens)
    w1, b1 = (np.array(scope.find_var(n).value) for n in ("fc_1.w_0", "fc_1.b_0"))
    z = (data @ w1 + b1).ravel()
    want_s = np.concatenate([np.exp(s - s.max()) / np.exp(s - s.max()).sum()
                             for s in seqs_of(z, lens) if len(s)])
    np.testing.assert_allclose(np.array(gs).ravel(), want_s, rtol=1e-5)


def test_missing_lod_falls_back_to_the_clear_error():
    prog, feed, outs = build_op_program(
        "sequence_pool", {"X": fluid.create_lod_tensor(np.ones((3, 2), F32), [[1, 2]])},
        {"pooltype": "SUM"})
    exe = fluid.Executor(mode="compiled")
    fetch = outs["Out"]
    exe.run(prog, feed=feed, fetch_list=fetch, scope=fluid.Scope())
    with pytest.raises(OpRunError, match=r"sequence_pool.*must be a LoD tensor"):
        exe.run(prog, feed={"x_0": np.ones((3, 2), F32)}, fetch_list=fetch, scope=fluid.Scope())
    step = next(s for s in _steps(exe) if isinstance(s, NativeStep))
    assert step.fallbacks == 1  # the native code never ran without offsets


def test_offsets_past_the_rows_are_refused_before_native_code():
    x = fluid.LoDTensor(np.ones((3, 2), F32))
    x.set_lod([[0, 2, 5]])
    prog, feed, outs = build_op_program("sequence_pool", {"X": fluid.create_lod_tensor(
        np.ones((3, 2), F32), [[1, 2]])}, {"pooltype": "SUM"})
    with pytest.raises(fluid.FeedError, match="rows 3"):
        fluid.Executor(mode="compiled").run(prog, feed={"x_0": x}, fetch_list=outs["Out"])


def test_generated_source_holds_no_names_or_sizes():
    sources = []
    for n, lens in ((4, [1, 3]), (9, [2, 0, 7])):
        prog, feed, outs = build_op_program(
            "sequence_pool", {"X": fluid.create_lod_tensor(np.ones((n, 3), F32), [lens])},
            {"pooltype": "MAX"})
        exe = fluid.Executor(mode="compiled")
        exe.run(prog, feed=feed, fetch_list=outs["Out"], scope=fluid.Scope())
        sources.append(next(iter(exe._plans.values()))[1].sources[0][1])
    assert sources[0] == sources[1]
    assert "x_0" not in sources[0] and "out_out" not in sources[0]


# ---- sequence ops against NumPy over lists of sequences ------------------------------------------
POOL = {
    "AVERAGE": lambda s: s.mean(axis=0), "SUM": lambda s: s.sum(axis=0),
    "SQRT": lambda s: s.sum(axis=0) / np.sqrt(len(s)), "MAX": lambda s: s.max(axis=0),
    "LAST": lambda s: s[-1], "FIRST": lambda s: s[0],
}


@given(lengths=lengths_st, width=st.integers(1, 3),
       pooltype=st.sampled_from(sorted(POOL)), seed=st.integers(0, 2 ** 16))
def test_sequence_pool(lengths, width, pooltype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sum(lengths), width)).astype(F32)
    got = run_compiled("sequence_pool",
                       {"X": fluid.create_lod_tensor(x, [lengths])},
                       {"pooltype": pooltype, "pad_value": 0.25}, outputs={"MaxIndex": 1})
    want = np.stack([POOL[pooltype](s) if len(s) else np.full(width, 0.25, F32)
                     for s in seqs_of(x, lengths)])
    np.testing.assert_allclose(np.array(got["out_out_0"]), want, rtol=1e-5, atol=1e-6)
    index = np.array(got["out_maxindex_0"])
    if pooltype == "MAX":
        offs = lod_of(lengths)[0]
        want_i = np.stack([offs[i] + s.argmax(axis=0) if len(s) else np.full(width, -1)
                           for i, s in enumerate(seqs_of(x, lengths))])
        np.testing.assert_array_equal(index, want_i)


@given(lengths=lengths_st, width=st.integers(1, 3),
       pooltype=st.sampled_from(sorted(POOL)), seed=st.integers(0, 2 ** 16))
def test_sequence_pool_grad(lengths, width, pooltype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sum(lengths), width)).astype(F32)
    g = rng.standard_normal((len(lengths), width)).astype(F32)
    xt = fluid.create_lod_tensor(x, [lengths])
    inputs = {"X": xt, "Out@GRAD": g}
    offs = lod_of(lengths)[0]
    if pooltype == "MAX":
        inputs["MaxIndex"] = np.stack(
            [offs[i] + s.argmax(axis=0) if len(s) else np.full(width, -1)
             for i, s in enumerate(seqs_of(x, lengths))]).astype(np.int32)
    got = run_compiled("sequence_pool_grad", inputs, {"pooltype": pooltype})
    dx = np.zeros_like(x)
    for i, n in enumerate(lengths):
        a, b = offs[i], offs[i + 1]
        if n == 0:
            continue
        if pooltype in ("SUM", "AVERAGE", "SQRT"):
            dx[a:b] = g[i] / {"SUM": 1, "AVERAGE": n, "SQRT": np.sqrt(n)}[pooltype]
        elif pooltype == "MAX":
            dx[inputs["MaxIndex"][i], np.arange(width)] = g[i]
        else:
            dx[b - 1 if pooltype == "LAST" else a] = g[i]
    np.testing.assert_allclose(np.array(got["out_x@grad_0"]), dx, rtol=1e-6, atol=1e-7)


@given(lengths=lengths_st, seed=st.integers(0, 2 ** 16), column=st.booleans())
def test_sequence_softmax_and_grad(lengths, seed, column):
    rng = np.random.default_rng(seed)
    shape = (sum(lengths), 1) if column else (sum(lengths),)
    x = (rng.standard_normal(shape) * 3).astype(F32)
    xt = fluid.create_lod_tensor(x, [lengths])
    got = np.array(run_compiled("sequence_softmax", {"X": xt})["out_out_0"])
    parts = [np.exp(s - s.max()) / np.exp(s - s.max()).sum() for s in seqs_of(x, lengths)
             if len(s)]
    want = np.concatenate(parts) if parts else np.zeros(shape, F32)
    np.testing.assert_allclose(got, want.reshape(shape), rtol=1e-5, atol=1e-7)
    g = rng.standard_normal(shape).astype(F32)
    dx = np.array(run_compiled("sequence_softmax_grad",
                               {"Out": got, "Out@GRAD": g, "X": xt})["out_x@grad_0"])
    want_dx = [o * (gg - (o * gg).sum()) for o, gg in zip(seqs_of(got, lengths),
                                                        seqs_of(g, lengths))]
    want_dx = np.concatenate(want_dx) if want_dx else np.zeros(shape, F32)
    np.testing.assert_allclose(dx, want_dx.reshape(shape), rtol=1e-5, atol=1e-6)


@given(lengths=lengths_st, width=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_sequence_reverse_and_grad(lengths, width, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sum(lengths), width)).astype(F32)
    xt = fluid.create_lod_tensor(x, [lengths])
    y = run_compiled("sequence_reverse", {"X": xt})["out_y_0"]
    assert y.lod() == lod_of(lengths)
    want = np.concatenate([s[::-1] for s in seqs_of(x, lengths)] + [np.zeros((0, width), F32)])
    np.testing.assert_array_equal(np.array(y), want)
    dx = run_compiled("sequence_reverse_grad", {"X": xt, "Y@GRAD": want})["out_x@grad_0"]
    np.testing.assert_array_equal(np.array(dx), x)


@given(lengths=lengths_st, width=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_sequence_expand_as_and_grad(lengths, width, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((len(lengths), width)).astype(F32)
    y = fluid.create_lod_tensor(np.zeros((sum(lengths), 1), F32), [lengths])
    out = run_compiled("sequence_expand_as", {"X": x, "Y": y})["out_out_0"]
    assert out.lod() == lod_of(lengths)
    want = np.concatenate([np.repeat(x[i:i + 1], n, axis=0) for i, n in enumerate(lengths)])
    np.testing.assert_array_equal(np.array(out), want)
    g = rng.standard_normal(want.shape).astype(F32)
    dx = run_compiled("sequence_expand_as_grad", {"X": x, "Y": y, "Out@GRAD": g})
    want_dx = np.stack([s.sum(axis=0) for s in seqs_of(g, lengths)])
    np.testing.assert_allclose(np.array(dx["out_x@grad_0"]), want_dx, rtol=1e-5, atol=1e-6)


@given(ref=lengths_st, seed=st.integers(0, 2 ** 16), x_lod=st.booleans(), data=st.data())
def test_sequence_expand_and_grad(ref, seed, x_lod, data):
    rng = np.random.default_rng(seed)
    n = len(ref)
    x_lens = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)) if x_lod else [1] * n
    x = rng.standard_normal((sum(x_lens), 2)).astype(F32)
    xin = fluid.create_lod_tensor(x, [x_lens]) if x_lod else x
    y = fluid.create_lod_tensor(np.zeros((sum(ref), 1), F32), [ref])
    out = run_compiled("sequence_expand", {"X": xin, "Y": y})["out_out_0"]
    pieces = [s for s, r in zip(seqs_of(x, x_lens), ref) for _ in range(r)]
    want = np.concatenate(pieces + [np.zeros((0, 2), F32)])
    np.testing.assert_array_equal(np.array(out), want)
    assert out.lod() == (lod_of([len(p) for p in pieces]) if x_lod else [])
    g = rng.standard_normal(want.shape).astype(F32)
    dx = np.array(run_compiled("sequence_expand_grad",
                               {"X": xin, "Y": y, "Out@GRAD": g})["out_x@grad_0"])
    want_dx = np.zeros_like(x)
    offs, at = lod_of(x_lens)[0], 0
    for i, r in enumerate(ref):
        for _ in range(r):
            want_dx[offs[i]:offs[i + 1]] += g[at:at + x_lens[i]]
            at += x_lens[i]
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6)


def test_threaded_loops_over_large_batches():
    """Above the size threshold the sequence loops run on threads: same answers."""
    old = fluid.get_num_threads()
    fluid.set_num_threads(2)
    try:
        rng = np.random.default_rng(7)
        lengths = rng.integers(0, 60, 1500).tolist()
        x = rng.standard_normal((sum(lengths), 32)).astype(F32)
        xt = fluid.create_lod_tensor(x, [lengths])
        for pooltype in ("AVERAGE", "MAX"):
            got = np.array(run_compiled("sequence_pool", {"X": xt},
                                        {"pooltype": pooltype})["out_out_0"])
            want = np.stack([POOL[pooltype](s) if len(s) else np.zeros(32, F32)
                             for s in seqs_of(x, lengths)])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        y = run_compiled("sequence_reverse", {"X": xt})["out_y_0"]
        np.testing.assert_array_equal(
            np.array(y), np.concatenate([s[::-1] for s in seqs_of(x, lengths)]))
    finally:
        fluid.set_num_threads(old)


# padded_length is a constant of the generated code (each value compiles its kernels): -1
# (the longest), 6 (no sequence is longer; the example holds one of 6) and 8 (longer than any)
@given(lengths=lengths_st, seed=st.integers(0, 2 ** 16), padded=st.sampled_from([-1, 6, 8]),
       step_pad=st.booleans())
@example(lengths=[2, 6, 0], seed=1, padded=6, step_pad=False)   # exactly the longest
def test_sequence_pad_and_grad(lengths, seed, padded, step_pad):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sum(lengths), 2)).astype(F32)
    xt = fluid.create_lod_tensor(x, [lengths])
    pad = np.array([0.5, -1.5], F32) if step_pad else np.array([0.25], F32)
    assert max(lengths) <= 6
    width = max(lengths) if padded == -1 else padded
    got = run_compiled("sequence_pad", {"X": xt, "PadValue": pad}, {"padded_length": padded},
                       outputs={"Length": 1})
    want = np.empty((len(lengths), width, 2), F32)
    want[...] = pad
    for i, s in enumerate(seqs_of(x, lengths)):
        want[i, :len(s)] = s
    np.testing.assert_array_equal(np.array(got["out_out_0"]), want)
    np.testing.assert_array_equal(np.array(got["out_length_0"]), lengths)
    dx = run_compiled("sequence_pad_grad", {"X": xt, "Out@GRAD": want * 3},
                      {"padded_length": padded})["out_x@grad_0"]
    np.testing.assert_array_equal(np.array(dx), x * 3)


@given(a=lengths_st, seed=st.integers(0, 2 ** 16), data=st.data())
def test_sequence_concat_and_grad(a, seed, data):
    rng = np.random.default_rng(seed)
    b = data.draw(st.lists(st.integers(0, 4), min_size=len(a), max_size=len(a)))
    xa = rng.standard_normal((sum(a), 3)).astype(F32)
    xb = rng.standard_normal((sum(b), 3)).astype(F32)
    ins = [fluid.create_lod_tensor(xa, [a]), fluid.create_lod_tensor(xb, [b])]
    out = run_compiled("sequence_concat", {"X": ins})["out_out_0"]
    parts = [p for sa, sb in zip(seqs_of(xa, a), seqs_of(xb, b)) for p in (sa, sb)]
    np.testing.assert_array_equal(np.array(out), np.concatenate(parts))
    assert out.lod() == lod_of([i + j for i, j in zip(a, b)])
    g = np.array(out) * 2
    got = run_compiled("sequence_concat_grad", {"X": ins, "Out@GRAD": g},
                       outputs={"X@GRAD": 2})
    np.testing.assert_array_equal(np.array(got["out_x@grad_0"]), xa * 2)
    np.testing.assert_array_equal(np.array(got["out_x@grad_1"]), xb * 2)


def test_lod_reset_native_and_from_values():
    x = np.arange(12, dtype=F32).reshape(6, 2)
    out = run_compiled("lod_reset", {"X": x}, {"target_lod": [0, 4, 6]})["out_out_0"]
    assert out.lod() == [[0, 4, 6]]
    np.testing.assert_array_equal(np.array(out), x)
    y = fluid.create_lod_tensor(np.zeros((6, 1), F32), [[1, 5]])
    assert run_compiled("lod_reset", {"X": x, "Y": y})["out_out_0"].lod() == [[0, 1, 6]]
    # offsets from Y's values: only the reference can read them; the op runs its reference
    prog, feed, outs = build_op_program("lod_reset", {"X": x, "Y": np.array([0, 2, 6], np.int32)})
    exe = fluid.Executor(mode="compiled")
    got, = exe.run(prog, feed=feed, fetch_list=outs["Out"], return_numpy=False)
    assert got.lod() == [[0, 2, 6]]
    assert not any(isinstance(s, NativeStep) and s.fallbacks for s in _steps(exe))


@given(outer=st.lists(st.integers(0, 3), min_size=1, max_size=4), seed=st.integers(0, 2 ** 16),
       data=st.data())
def test_sequence_pool_on_two_levels_keeps_the_upper_level(outer, seed, data):
    inner = data.draw(st.lists(st.integers(0, 4), min_size=sum(outer), max_size=sum(outer)))
    x = np.random.default_rng(seed).standard_normal((sum(inner), 2)).astype(F32)
    xt = fluid.create_lod_tensor(x, [outer, inner])
    out = run_compiled("sequence_pool", {"X": xt}, {"pooltype": "SUM"})["out_out_0"]
    assert out.lod() == lod_of(outer)
    want = np.stack([s.sum(axis=0) for s in seqs_of(x, inner)] + [np.zeros(2, F32)])[:-1]
    np.testing.assert_allclose(np.array(out), want, rtol=1e-5, atol=1e-6)
