"""pdjit's packed GEMM (``pdjit.codegen.cpu.lib.pgemm``): the micro-kernel and its driver
against NumPy in float64 over sizes that are not multiples of the tile (rows of ``MR``,
columns of a panel), with and without a bias; products by weights on the weights packed once
(``_nn.weight_gemm``): results against NumPy written here, a weight changed in the Scope
(a new array, or in place by a training program) seen by the next run, the packed copy never
in a fetched value or a saved model."""
import os

import numpy as np
import pytest

import pdjit as fluid
from pdjit.codegen.cpu import threads
from pdjit.codegen.cpu.lib import pgemm, team
from pdjit.codegen.cpu.lib._jit import caller
from pdjit.testing import assert_native

RNG = np.random.default_rng(37)
#: the gate array of hard_swish (``.tile.gate_of``), and its oracle: x * relu6(x + 3) / 6
HARD_SWISH = (1.0, 3.0, 0.0, 6.0, 6.0)


def _hard_swish(v):
    return v * np.clip(v + 3, 0, 6) / 6


def _pack(b):
    nr = pgemm.panel_width(b.dtype)
    bp = np.full(((b.shape[1] + nr - 1) // nr) * b.shape[0] * nr, np.nan, b.dtype)
    pgemm.pack_b(b, bp)
    return bp


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_gemm_against_numpy(dtype):
    nr = pgemm.panel_width(dtype)
    # (the last: more rows than _packed_rows keeps as one block, ROWS_WHOLE_BYTES)
    # (a block's last rows past whole tiles: 1 to TAIL_ROWS on the tail tile, more on a
    # whole one)
    sizes = [(1, 1, 1), (5, 3, 7), (pgemm.MR, 16, nr), (13, 17, nr + 1), (2 * pgemm.MR + 1,
                                                                          33, 2 * nr + 5),
             (pgemm.MR + 2, 4, nr - 1), (2 * pgemm.MR + 3, 7, 5), (16, 9, nr + 2),
             (150, 1800, nr + 3)]
    assert {m % pgemm.MR for m, _, _ in sizes} >= set(range(1, pgemm.TAIL_ROWS + 2))
    assert 150 * 1800 * 4 > pgemm.ROWS_WHOLE_BYTES
    for m, k, n in sizes:
        tol = (1e-5 if dtype == np.float32 else 1e-12) * (10 if k > 100 else 1)  # (long sums)
        a = RNG.uniform(-1, 1, (m, k)).astype(dtype)
        b = RNG.uniform(-1, 1, (k, n)).astype(dtype)
        bias = RNG.uniform(-1, 1, n).astype(dtype)
        bp = _pack(b)
        # the panels: b's columns by NR, zero past n
        npan = (n + nr - 1) // nr
        pad = np.zeros((k, npan * nr), dtype)
        pad[:, :n] = b
        np.testing.assert_array_equal(bp.reshape(npan, k, nr),
                                      pad.reshape(k, npan, nr).transpose(1, 0, 2))
        want = a.astype(np.float64) @ b.astype(np.float64)
        c = np.full((m, n), np.nan, dtype)
        pgemm.packed_gemm(a, bp, n, np.empty(0, dtype), c)
        np.testing.assert_allclose(c, want, rtol=tol, atol=tol, err_msg=f"{m}x{k}x{n}")
        c = np.full((m, n), np.nan, dtype)
        pgemm.packed_gemm(a, bp, n, bias, c)
        np.testing.assert_allclose(c, want + bias, rtol=tol, atol=tol, err_msg=f"{m}x{k}x{n}")
        # a range of rows (one thread's part) leaves the others as they were; the epilogue
        # of a residual add and a clamp
        res = RNG.uniform(-1, 1, (m, n)).astype(dtype)
        c = np.full((m, n), 7.0, dtype)
        pgemm._packed_rows(a, bp, n, bias, c, m // 2, m, res.ravel(), -0.5, 0.25)
        np.testing.assert_array_equal(c[:m // 2], 7.0)
        np.testing.assert_allclose(c[m // 2:], np.clip(want + bias + res, -0.5, 0.25)[m // 2:],
                                   rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="do not fit"):
        pgemm.packed_gemm(a, bp[:-1], n, bias, c)


def test_weight_gemm_packs_once_and_splits_over_threads(monkeypatch):
    a = RNG.uniform(-1, 1, (4 * pgemm.MR + 3, 20)).astype(np.float32)
    w = RNG.uniform(-1, 1, (20, 70)).astype(np.float32)
    want = a.astype(np.float64) @ w
    got = pgemm.weight_gemm(a, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    first = pgemm.packed_weight(w)
    assert pgemm.packed_weight(w) is first                      # kept beside the weight
    np.testing.assert_allclose(pgemm.weight_gemm(a, w.T.copy(), True), want, rtol=1e-5,
                               atol=1e-5)
    # rows split over two loop threads: the same values; the helpers pass every argument
    # (a default left out is typed again at each call: a slow path holding the GIL)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    monkeypatch.setattr(threads, "gemm_threads", lambda work: 2)  # (the helpers' split)
    monkeypatch.setattr(team, "run", lambda loop, call: False)      # (the team's not ready)
    monkeypatch.setattr(pgemm, "SPLIT_MIN_WORK", 1)
    calls, real = [], pgemm._packed_rows
    monkeypatch.setattr(pgemm, "_packed_rows", lambda *args: calls.append(len(args)) or
                        real(*args))
    np.testing.assert_array_equal(pgemm.weight_gemm(a, w), got)
    assert calls and set(calls) == {13}, calls
    monkeypatch.setattr(pgemm, "_packed_rows", real)
    # a run that may write the weight in place: packed again; the copy goes with its array
    from pdjit.codegen import params
    params.written([w])
    assert pgemm.packed_weight(w) is not first
    # a product of fewer rows runs by BLAS: nothing packed for it
    assert pgemm.packed_weight(w, False, pgemm.PACKED_MIN_ROWS - 1).size == 0
    key = (id(w), ("packed", False))
    assert key in params._DERIVED
    del w
    assert key not in params._DERIVED


def test_derived_values_start_on_a_cache_line():
    """What ``params.derived`` keeps starts at a multiple of 64 bytes (a vector load of an
    AVX-512 kernel then never straddles two lines), copied where ``make`` gave an array that
    does not; tuples of arrays too; the values are unchanged."""
    from pdjit.codegen import params

    w = np.zeros(3, np.float32)
    raw = np.arange(70, dtype=np.float32)
    off = raw[next(i for i in range(16) if raw[i:].ctypes.data % 64 == 16):][:40]
    assert off.ctypes.data % 64 == 16
    got = params.derived(w, ("test", "off"), lambda: off.reshape(5, 8))
    assert got.ctypes.data % 64 == 0 and got.shape == (5, 8) and got.dtype == np.float32
    np.testing.assert_array_equal(got.ravel(), off)
    assert params.derived(w, ("test", "off"), lambda: None) is got  # kept
    pair = params.derived(w, ("test", "pair"), lambda: (off[1:], np.int64(4)))
    assert pair[0].ctypes.data % 64 == 0 and pair[1] == 4
    np.testing.assert_array_equal(pair[0], off[1:])


def test_a_native_driver_takes_its_packed_weight_from_the_host(monkeypatch):
    """The native driver a hot inference step gets (an fc over each position of a sequence,
    bias and relu in its stores) takes the weight packed by the host, kept beside the weight,
    as an argument: its compiled code packs nothing at each run. Every run against NumPy, the
    native driver serving."""
    from pdjit.codegen.cpu import tiers
    from pdjit.codegen.cpu.target import DerivedArgs

    monkeypatch.setattr(tiers, "HOT_RUNS", 2)
    monkeypatch.setattr(tiers, "TIER_UP_THREAD", False)
    monkeypatch.setattr(threads, "SHORT_TRIAL_RUNS", 1)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [20, 12])
        y = fluid.layers.fc(x, 24, num_flatten_dims=2, act="relu",
                            param_attr=fluid.ParamAttr(name="w"),
                            bias_attr=fluid.ParamAttr(name="b"))
    scope = fluid.Scope()
    exe = fluid.Executor(native_drivers="auto", strict=True)
    exe.run(startup, scope=scope)
    infer = main.clone(for_test=True)
    w, b = (np.asarray(scope.find_var(n).value, np.float64) for n in ("w", "b"))

    def check(runs):
        for _ in range(runs):
            xv = RNG.standard_normal((2, 20, 12)).astype(np.float32)
            (got,) = exe.run(infer, feed={"x": xv}, fetch_list=[y], scope=scope)
            np.testing.assert_allclose(got, np.maximum(xv @ w + b, 0), rtol=1e-5, atol=1e-5)

    check(4)
    (step,) = [s for _, plan in exe._plans.values() for s in plan.walk()
               if s.kind == "native" and s.tiers is not None]
    nd = step.tiers.native
    assert isinstance(nd.fn, DerivedArgs) and "dv0" in nd.text
    assert "packed_weight" not in nd.text and "weight_rows" in nd.text
    step.tiers.picked[2] = nd.fn  # (the native driver serves, whatever the trial picked)
    check(3)
    assert len(nd.fn.fn.signatures) == 1
    assert nd.fn._values[0] is pgemm.packed_weight(scope.find_var("w").value)


def _model(main, startup):
    """fc (rank 3 input) -> fc by a matmul_v2 with a transposed weight."""
    x = fluid.layers.data("x", [pgemm.PACKED_MIN_ROWS + 1, 9])
    h = fluid.layers.fc(x, 70, num_flatten_dims=2, param_attr=fluid.ParamAttr(name="pa_w"),
                        bias_attr=fluid.ParamAttr(name="pa_b"))
    w = fluid.layers.create_parameter([3, 70], "float32", name="pw")
    y = fluid.layers.matmul(h, w, transpose_y=True)
    f = fluid.layers.fc(h, 70, num_flatten_dims=2, param_attr=fluid.ParamAttr(name="pr_w"),
                        bias_attr=fluid.ParamAttr(name="pr_b"))
    r = fluid.layers.relu(fluid.layers.elementwise_add(f, h))
    return x, h, y, r


def _want(xv, scope):
    wa, ba, pw, wr, br = (np.asarray(scope.find_var(n).get_tensor()).astype(np.float64)
                          for n in ("pa_w", "pa_b", "pw", "pr_w", "pr_b"))
    h = xv.astype(np.float64) @ wa + ba
    return h, h @ pw.T, np.maximum(h @ wr + br + h, 0)


def test_products_by_weights_on_packed_weights(fresh_programs, tmp_path, monkeypatch):
    main, startup = fresh_programs
    x, h, y, r = _model(main, startup)
    # the library functions the plan's lowerings name (ctx.lib_fn), as its generator asks
    # the target for their compile jobs
    from pdjit.codegen.target import get_target
    cpu, named = get_target("cpu"), []
    asked = cpu.library_jobs
    monkeypatch.setattr(cpu, "library_jobs",
                        lambda names, dtype: named.extend(names) or asked(names, dtype),
                        raising=False)
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    scope = fluid.global_scope()
    exe.run(startup)
    for batch in (1, 3):
        xv = RNG.normal(size=(batch, pgemm.PACKED_MIN_ROWS + 1, 9)).astype(np.float32)
        got_h, got_y, got_r = exe.run(main, feed={"x": xv}, fetch_list=[h, y, r])
        assert_native(exe)
        want_h, want_y, want_r = _want(xv, scope)
        np.testing.assert_allclose(got_h, want_h, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_r, want_r, rtol=1e-5, atol=1e-5)
    # buffers of dead values reused (memory_optim): the products never write an operand
    exe_m = fluid.Executor(fluid.CPUPlace(), strict=True, memory_optim=True)
    got_m = exe_m.run(main, feed={"x": xv}, fetch_list=[y, r])
    for g, want in zip(got_m, (want_y, want_r)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
    packs = []
    orig = pgemm.pack_scaled
    monkeypatch.setattr(pgemm, "pack_scaled", lambda *a: packs.append(a[0].shape) or orig(*a))
    exe.run(main, feed={"x": xv}, fetch_list=[h, y, r])
    assert packs == []                        # packed once: the runs after pack nothing
    monkeypatch.undo()
    report = exe.explain(main, feed={"x": xv}, fetch_list=[h, y, r])
    # the bias adds, the residual add and the relu stored by the products' tiles
    assert report.count("_nn.weight_gemm(") == 1 and report.count("_nn.weight_rows,") == 2, \
        report
    assert report.count("taken by the mul") == 2, report
    # a new plan's compile worker compiles the kernels these calls use (the signatures met)
    from pdjit.codegen import compiler
    from pdjit.codegen.cpu import lib as nnlib
    assert {"weight_gemm", "weight_rows", "packed_weight"} <= set(named), named
    jobs = nnlib.library_jobs(named, np.float32)
    assert {fn.py_func.__name__ for fn, _ in jobs} >= {"pack_scaled", "_weight_rows"}
    for fn, types in jobs:
        if fn.py_func.__name__ in ("pack_scaled", "_weight_rows"):
            sig = tuple(compiler._numba_type(t) for t in types)
            assert sig in fn.overloads, (fn.py_func.__name__, sig, list(fn.overloads))
    # a weight fetched is the weight as it is, never its packed copy
    got_w, = exe.run(main, feed={"x": xv}, fetch_list=["pa_w"])
    assert got_w.shape == (9, 70)
    np.testing.assert_array_equal(got_w, np.asarray(scope.find_var("pa_w").get_tensor()))
    # a new weight set in the Scope between runs
    new = RNG.normal(size=(9, 70)).astype(np.float32)
    scope.find_var("pa_w").get_tensor().set(new, fluid.CPUPlace())
    got_h, got_y = exe.run(main, feed={"x": xv}, fetch_list=[h, y])
    want_h, want_y, _ = _want(xv, scope)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-5)
    # the weights changed in place by a training program on the same parameters
    with fluid.program_guard(train := fluid.Program(), tstart := fluid.Program()):
        tx = fluid.layers.data("x", [pgemm.PACKED_MIN_ROWS + 1, 9])
        th = fluid.layers.fc(tx, 70, num_flatten_dims=2,
                             param_attr=fluid.ParamAttr(name="pa_w"),
                             bias_attr=fluid.ParamAttr(name="pa_b"))
        tw = fluid.layers.create_parameter([3, 70], "float32", name="pw")
        loss = fluid.layers.mean(fluid.layers.matmul(th, tw, transpose_y=True))
        fluid.optimizer.SGD(learning_rate=3.0).minimize(loss)
    exe.run(tstart)  # (new values, and the learning rate)
    got_h, got_y = exe.run(main, feed={"x": xv}, fetch_list=[h, y])
    np.testing.assert_allclose(got_y, _want(xv, scope)[1], rtol=1e-5, atol=1e-5)
    before = np.asarray(scope.find_var("pw").get_tensor()).copy()
    from pdjit.codegen import params
    kept = dict(params._DERIVED)
    exe.run(main, feed={"x": xv}, fetch_list=[y])
    assert params._DERIVED == kept            # an inference program changes no parameter
    exe.run(train, feed={"x": xv}, fetch_list=[loss])
    # a training step writes pa_w and pw in place: their packed copies are made again
    ids = {id(scope.find_var(n).value) for n in ("pw", "pa_w")}
    assert kept and not any(k[0] in ids for k in params._DERIVED)
    assert not np.array_equal(before, np.asarray(scope.find_var("pw").get_tensor()))
    got_h, got_y = exe.run(main, feed={"x": xv}, fetch_list=[h, y])
    want_h, want_y, _ = _want(xv, scope)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-5)
    # a saved model holds the weights as they are
    fluid.io.save_inference_model(str(tmp_path), ["x"], [y], exe, main_program=main)
    loaded = fluid.Scope()
    with fluid.scope_guard(loaded):
        prog, feeds, fetches = fluid.io.load_inference_model(str(tmp_path), exe)
        got, = exe.run(prog, feed={"x": xv}, fetch_list=fetches)
    for n in ("pa_w", "pw"):
        np.testing.assert_array_equal(np.asarray(loaded.find_var(n).get_tensor()),
                                      np.asarray(scope.find_var(n).get_tensor()))
    np.testing.assert_allclose(got, want_y, rtol=1e-5, atol=1e-5)
    assert os.path.exists(tmp_path / "__model__")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_products_on_the_packed_gemm(dtype, monkeypatch):
    """``batched_gemm`` of a batch without broadcasting (attention's QK^T and PV): each right
    operand packed scaled; transposed or not, rows and columns not multiples of the tile, one
    thread and split over two."""
    from pdjit.codegen.cpu.lib import gemm as nngemm

    calls = []
    orig = nngemm.packed_batches
    monkeypatch.setattr(nngemm, "packed_batches", lambda *a: calls.append(a[-2:]) or orig(*a))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    nr = pgemm.panel_width(dtype)
    for nb, m, k, n, tb, alpha in [(1, 16, 1, 1, False, 1.0), (3, 17, 9, nr + 3, True, 0.37),
                                   (2, 23, 33, 5, False, 2.0)]:
        a = RNG.uniform(-1, 1, (nb, m, k)).astype(dtype)
        b = RNG.uniform(-1, 1, (nb, n, k) if tb else (nb, k, n)).astype(dtype)
        b64 = b.astype(np.float64).transpose(0, 2, 1) if tb else b.astype(np.float64)
        want = alpha * np.einsum("bik,bkj->bij", a.astype(np.float64), b64)
        it = np.array([nb], np.int64)
        c = np.full((nb, m, n), np.nan, dtype)
        calls.clear()
        nngemm.batched_gemm(a, b, False, tb, alpha, it, it, it, it, c)
        assert calls == [(0, nb)]
        np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
        c2 = np.full((nb, m, n), np.nan, dtype)
        nngemm._range_gemm(a, b, False, tb, alpha, c2, 0, 1)
        nngemm._range_gemm(a, b, False, tb, alpha, c2, 1, nb)
        np.testing.assert_array_equal(c2, c)
    # fewer rows than PACKED_MIN_ROWS, or a transposed a: BLAS
    a = RNG.uniform(-1, 1, (2, 3, 4)).astype(dtype)
    b = RNG.uniform(-1, 1, (2, 4, 5)).astype(dtype)
    it = np.array([2], np.int64)
    c = np.empty((2, 3, 5), dtype)
    calls.clear()
    nngemm.batched_gemm(a, b, False, False, 1.0, it, it, it, it, c)
    assert calls == []
    np.testing.assert_allclose(c, a @ b, rtol=tol, atol=tol)


def test_weight_gemm_in_compiled_code_equals_the_host():
    """A native driver's (or an artifact's) product by a weight: packed at the call, the same
    bits as the host's on the weight packed once; few rows: BLAS in both."""
    @caller
    def compiled(a, w, trans):
        return pgemm.weight_gemm(a, w, trans)

    w = RNG.uniform(-1, 1, (33, 70)).astype(np.float32)
    for m in (3, pgemm.PACKED_MIN_ROWS + 5):
        a = RNG.uniform(-1, 1, (m, 33)).astype(np.float32)
        np.testing.assert_array_equal(compiled(a, w, False), pgemm.weight_gemm(a, w, False))
        wt = w.T.copy()
        np.testing.assert_array_equal(compiled(a, wt, True), pgemm.weight_gemm(a, wt, True))
        np.testing.assert_allclose(compiled(a, w, False), a.astype(np.float64) @ w,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_long_sum_by_chunks_of_the_panel(dtype):
    """A panel larger than ``PANEL_WHOLE_BYTES`` (1500 rows) is summed by chunks of
    ``PANEL_CHUNK_BYTES`` (12 of them) whose sums are read back from ``c``: the residual added
    once (also where it is ``c`` itself, in place), the bias, the clamp and the gate
    (hard_swish) once, at the end."""
    nr = pgemm.panel_width(dtype)
    m, k, n = 2 * pgemm.MR + 1, 1500, nr + 9
    size = np.dtype(dtype).itemsize
    assert k * nr * size > pgemm.PANEL_WHOLE_BYTES and \
        -(-k // (pgemm.PANEL_CHUNK_BYTES // (nr * size))) == 12
    tol = 1e-4 if dtype == np.float32 else 1e-11
    a = RNG.uniform(-1, 1, (m, k)).astype(dtype)
    b = (RNG.uniform(-1, 1, (k, n)) / 8).astype(dtype)
    bias = RNG.uniform(-1, 1, n).astype(dtype)
    res = RNG.uniform(-1, 1, (m, n)).astype(dtype)
    bp = _pack(b)
    want = a.astype(np.float64) @ b + bias + res
    clipped = np.clip(want, -1.5, 2.0)
    swish = _hard_swish(clipped)
    gate = np.array(HARD_SWISH, dtype)
    for in_place in (False, True):
        c = res.copy() if in_place else np.full((m, n), np.nan, dtype)
        r = c.ravel() if in_place else res.ravel()
        pgemm._packed_rows(a, bp, n, bias, c, 0, m, r, -1.5, 2.0, gate)
        np.testing.assert_allclose(c, swish, rtol=tol, atol=tol, err_msg=f"in place {in_place}")
        c = np.full((m, n), np.nan, dtype)
        pgemm._packed_rows(a, bp, n, bias, c, 0, m, res.ravel(), -1.5, 2.0)
        np.testing.assert_allclose(c, clipped, rtol=tol, atol=tol)
    assert 0 < (clipped == 2.0).mean() < 0.5 and 0 < (clipped == -1.5).mean() < 0.5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_panels_summed_by_groups(dtype):
    """Whole panels are taken by groups of ``GROUP_BYTES`` where the block of rows of ``c`` is
    larger than ``GROUP_MIN_OUT_BYTES`` (three panels a group here, the last group short), each
    tile summing the group's panels in turn: against NumPy with a bias, a residual, a clamp
    and a gate, also for a range of panels that starts and ends inside groups; the same bits
    as the panels taken one call each."""
    nr = pgemm.panel_width(dtype)
    size = np.dtype(dtype).itemsize
    k = pgemm.GROUP_BYTES // (3 * nr * size)
    n = 394  # (7 panels of 64 float32, 13 of 32 float64: a short group last)
    npan = -(-n // nr)
    m = pgemm.ROWS_WHOLE_BYTES // (k * size) - 3  # (one block of rows)
    assert pgemm.GROUP_BYTES // (k * nr * size) == 3 and npan % 3 == 1 and \
        k * nr * size <= pgemm.PANEL_WHOLE_BYTES and m * n * size > pgemm.GROUP_MIN_OUT_BYTES
    tol = 1e-4 if dtype == np.float32 else 1e-11
    a = RNG.uniform(-1, 1, (m, k)).astype(dtype)
    b = (RNG.uniform(-1, 1, (k, n)) / 8).astype(dtype)
    bias = RNG.uniform(-1, 1, n).astype(dtype)
    res = RNG.uniform(-1, 1, (m, n)).astype(dtype)
    gate = np.array(HARD_SWISH, dtype)
    bp = _pack(b)
    want = _hard_swish(np.clip(a.astype(np.float64) @ b + bias + res, -1.5, 2.0))
    c = np.full((m, n), np.nan, dtype)
    pgemm._packed_rows(a, bp, n, bias, c, 0, m, res.ravel(), -1.5, 2.0, gate)
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    one = np.full((m, n), np.nan, dtype)
    for j in range(npan):
        pgemm._packed_rows(a, bp, n, bias, one, 0, m, res.ravel(), -1.5, 2.0, gate, j, j + 1)
    np.testing.assert_array_equal(c, one)
    part = np.full((m, n), 7.0, dtype)  # panels 1 .. 5: groups [1, 4) and [4, 5)
    pgemm._packed_rows(a, bp, n, bias, part, 3, m, res.ravel(), -1.5, 2.0, gate, 1, 5)
    np.testing.assert_array_equal(part[3:, nr:5 * nr], c[3:, nr:5 * nr])
    assert (part[:3] == 7.0).all() and (part[:, :nr] == 7.0).all() and \
        (part[:, 5 * nr:] == 7.0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weight_rows_with_its_epilogue(dtype):
    """``weight_rows``: samples ``n0 .. n1`` of ``r`` rows, bias + residual + clamp; blocks of
    fewer than ``PACKED_MIN_ROWS`` rows by BLAS then the same epilogue; transposed weights."""
    tol = 1e-5 if dtype == np.float32 else 1e-12
    r, k, n = 5, 11, 37
    x = RNG.uniform(-1, 1, (8 * r, k)).astype(dtype)
    w = RNG.uniform(-1, 1, (k, n)).astype(dtype)
    bias = RNG.uniform(-1, 1, n).astype(dtype)
    res = RNG.uniform(-1, 1, (8 * r, n)).astype(dtype)
    want = np.clip(x.astype(np.float64) @ w + bias + res, -0.75, 0.5)
    for trans in (False, True):
        wt = w.T.copy() if trans else w
        bp = pgemm.packed_weight(wt, trans)
        for n0, n1 in ((0, 1), (1, 5), (5, 8)):   # 5 rows (BLAS), 20 and 15 rows
            out = np.full((8 * r, n), 9.0, dtype)
            pgemm.weight_rows(x, wt, trans, bp, n0, n1, out, r, bias, res.ravel(), -0.75, 0.5)
            np.testing.assert_allclose(out[n0 * r:n1 * r], want[n0 * r:n1 * r], rtol=tol,
                                       atol=tol, err_msg=f"{trans} {n0}..{n1}")
            assert (np.delete(out, np.s_[n0 * r:n1 * r], axis=0) == 9.0).all()
        out = np.empty((8 * r, n), dtype)
        empty = np.empty(0, dtype)
        pgemm.weight_rows(x, wt, trans, bp, 0, 8, out, r, empty, empty, -np.inf, np.inf)
        np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=tol, atol=tol)
        # one sample of many rows split by blocks of rows over two threads: the same bits,
        # on run_parts' helpers (the parallel loop not on disk), then by the parallel loop
        one = np.empty((8 * r, n), dtype)
        pgemm.weight_rows(x, wt, trans, bp, 0, 1, one, 8 * r, bias, res.ravel(), -0.75, 0.5)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(threads, "loop_threads", lambda: 2)
            mp.setattr(threads, "gemm_threads", lambda work: 2)  # (the helpers' split)
            mp.setattr(pgemm, "SPLIT_MIN_WORK", 1)
            mp.setattr(team, "AFTER_RUNS", 0)
            mp.setattr(team, "LOOK_AGAIN_S", 0.0)
            for here in (False, True):  # (True: the loop compiled at its first ask)
                mp.setattr(team, "COMPILE", here)
                two = np.empty((8 * r, n), dtype)
                pgemm.weight_rows(x, wt, trans, bp, 0, 1, two, 8 * r, bias, res.ravel(),
                                  -0.75, 0.5)
                np.testing.assert_array_equal(two, one)
        assert team._READY[(pgemm._row_parts, np.dtype(dtype))]
        np.testing.assert_allclose(one, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_product_by_a_wider_weight_splits_by_rows(dtype, monkeypatch):
    """One sample's product by a weight of more columns than the sample has rows splits by
    ranges of blocks of rows as any other, on the parallel loop: the same bits as one thread,
    with the bias, residual and clamp, whatever the parts and panels."""
    tol = 1e-5 if dtype == np.float32 else 1e-12
    nr = pgemm.NV * (64 // np.dtype(dtype).itemsize)
    monkeypatch.setattr(threads, "loop_threads", lambda: 3)
    monkeypatch.setattr(pgemm, "SPLIT_MIN_WORK", 1)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "COMPILE", True)
    ran = []
    real = team.run
    monkeypatch.setattr(team, "run", lambda loop, call: ran.append((loop, call[-1])) or
                        real(loop, call))
    for rows, cols, parts in ((24, 7 * nr + 5, 3), (20, 5 * nr, 2), (40, 3 * nr, 2),
                              (24, 5 * nr, 3)):
        x = RNG.uniform(-1, 1, (rows, 13)).astype(dtype)
        w = RNG.uniform(-1, 1, (13, cols)).astype(dtype)
        bias = RNG.uniform(-1, 1, cols).astype(dtype)
        res = RNG.uniform(-1, 1, rows * cols).astype(dtype)
        bp = pgemm.packed_weight(w, False)
        one = np.empty((rows, cols), dtype)
        pgemm._weight_rows(x, w, False, bp, 0, 1, one, rows, bias, res, -0.75, 0.5)
        np.testing.assert_allclose(one, np.clip(x.astype(np.float64) @ w + bias +
                                                res.reshape(rows, cols), -0.75, 0.5),
                                   rtol=tol, atol=tol)
        monkeypatch.setattr(threads, "loop_threads", lambda parts=parts: parts)
        two = np.full((rows, cols), np.nan, dtype)
        pgemm.weight_rows(x, w, False, bp, 0, 1, two, rows, bias, res, -0.75, 0.5)
        assert ran[-1] == (pgemm._row_parts, parts)
        np.testing.assert_array_equal(two, one)
    assert team._READY[(pgemm._row_parts, np.dtype(dtype))]


def test_a_sample_splits_over_the_loop_threads_without_a_thread_count(monkeypatch):
    """The packed GEMM's split follows the loop threads (``pgemm.split_threads``), not BLAS's
    threshold: with no thread count asked (``threads.gemm_threads`` one thread below
    ``GEMM_PARALLEL_MIN_WORK``), one sample's product of ``SPLIT_MIN_WORK`` multiply-adds (a
    BERT-like encoder's 128 x 256 x 256) splits by the parallel loop where it is ready;
    before it is, such a product runs on one thread (the helpers' hand-overs pay only for
    products BLAS's rule splits). The same bits each way."""
    rows, k, n = 128, 256, 256
    assert pgemm.SPLIT_MIN_WORK <= rows * k * n < threads.GEMM_PARALLEL_MIN_WORK
    monkeypatch.setattr(threads, "gemm_threads",
                        lambda work: 2 if work >= threads.GEMM_PARALLEL_MIN_WORK else 1)
    monkeypatch.setattr(threads, "loop_threads", lambda: 2)
    x = RNG.uniform(-1, 1, (rows, k)).astype(np.float32)
    w = RNG.uniform(-1, 1, (k, n)).astype(np.float32)
    bias = RNG.uniform(-1, 1, n).astype(np.float32)
    empty = np.empty(0, np.float32)
    bp = pgemm.packed_weight(w, False)
    one = np.empty((rows, n), np.float32)
    pgemm._weight_rows(x, w, False, bp, 0, 1, one, rows, bias, empty, -np.inf, np.inf)
    np.testing.assert_allclose(one, x.astype(np.float64) @ w + bias, rtol=1e-5, atol=1e-5)
    assert pgemm.weight_split_work(x, w) == rows * k * n
    loops, helpers = [], []
    real_run, real_ready = team.run, team.ready
    monkeypatch.setattr(team, "run", lambda loop, call: loops.append(
        (loop, real_run(loop, call))) or loops[-1][1])
    monkeypatch.setattr(pgemm, "run_chunks", lambda *a: helpers.append(a))
    monkeypatch.setattr(team, "ready", lambda loop, call: False)  # (not on disk yet)
    two = np.full((rows, n), np.nan, np.float32)
    pgemm.weight_rows(x, w, False, bp, 0, 1, two, rows, bias, empty, -np.inf, np.inf)
    assert loops == [(pgemm._row_parts, False)] and helpers == []
    np.testing.assert_array_equal(two, one)
    monkeypatch.setattr(team, "ready", real_ready)
    monkeypatch.setattr(team, "AFTER_RUNS", 0)
    monkeypatch.setattr(team, "COMPILE", True)
    loops.clear()
    three = np.full((rows, n), np.nan, np.float32)
    pgemm.weight_rows(x, w, False, bp, 0, 1, three, rows, bias, empty, -np.inf, np.inf)
    assert loops == [(pgemm._row_parts, True)]
    np.testing.assert_array_equal(three, one)


def test_a_batch_of_products_by_a_weight_splits_by_rows(monkeypatch):
    """``conv.split_work`` splits ``weight_rows`` over a batch by blocks of rows of the whole
    product (``pgemm._split_batch``: by the parallel loop where it is ready, else on the
    helpers), not by samples: the same bits as one thread; a batch of fewer rows than the
    packed kernel takes is split by samples as before."""
    from pdjit.codegen.cpu.lib import conv

    r, k, n, batch = 5, 11, 37, 8
    x = RNG.uniform(-1, 1, (batch * r, k)).astype(np.float32)
    w = RNG.uniform(-1, 1, (k, n)).astype(np.float32)
    bias = RNG.uniform(-1, 1, n).astype(np.float32)
    res = RNG.uniform(-1, 1, batch * r * n).astype(np.float32)
    want = np.clip(x.astype(np.float64) @ w + bias + res.reshape(batch * r, n), -0.75, 0.5)
    bp = pgemm.packed_weight(w, False)
    one = np.empty((batch * r, n), np.float32)
    pgemm.weight_rows(x, w, False, bp, 0, batch, one, r, bias, res, -0.75, 0.5)
    np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-5)
    seen = []
    real = pgemm._split_rows
    monkeypatch.setattr(pgemm, "_split_rows", lambda *a: seen.append(a[-1]) or real(*a))
    monkeypatch.setattr(conv, "loop_threads", lambda: 3)
    two = np.full((batch * r, n), np.nan, np.float32)
    conv.split_work(pgemm.weight_rows, batch, 1 << 40, x, w, False, bp, two, r, bias, res,
                    -0.75, 0.5, head=4)
    assert seen == [3]
    np.testing.assert_array_equal(two, one)
    # rows too few for the packed kernel's split (a batch of 8 one-row samples): by samples
    few = batch
    assert few < max(2 * pgemm.MR, pgemm.PACKED_MIN_ROWS)
    xs, rs = x[:few].copy(), res[:few * n].copy()
    seen.clear()
    three = np.full((few, n), np.nan, np.float32)
    conv.split_work(pgemm.weight_rows, few, 1 << 40, xs, w, False, bp, three, 1, bias, rs,
                    -0.75, 0.5, head=4)
    assert seen == []
    np.testing.assert_allclose(three, np.clip(xs.astype(np.float64) @ w + bias +
                                              rs.reshape(few, n), -0.75, 0.5),
                               rtol=1e-5, atol=1e-5)


def test_a_fed_weight_refilled_between_runs_is_packed_again(fresh_programs):
    """A persistable fed with the user's buffer, refilled in place before the next run, and
    a program that writes other persistables (a batch norm's statistics) beside the product:
    every run gives the product of the values fed, against NumPy."""
    main, startup = fresh_programs
    rows = pgemm.PACKED_MIN_ROWS + 1
    with fluid.program_guard(main, startup):
        x = fluid.layers.data("x", [rows, 9])
        h = fluid.layers.fc(x, 30, num_flatten_dims=2, bias_attr=False,
                            param_attr=fluid.ParamAttr(name="fw"))
        s = fluid.layers.batch_norm(fluid.layers.data("c", [3, 4, 4]))
    exe = fluid.Executor(fluid.CPUPlace(), strict=True)
    exe.run(startup)
    xv = RNG.normal(size=(1, rows, 9)).astype(np.float32)
    cv = RNG.normal(size=(2, 3, 4, 4)).astype(np.float32)
    w = RNG.normal(size=(9, 30)).astype(np.float32)
    for fill in (None, 0.0, 2.5):
        if fill is not None:
            w[...] = RNG.normal(size=w.shape) * fill
        got, _ = exe.run(main, feed={"x": xv, "c": cv, "fw": w}, fetch_list=[h, s])
        assert_native(exe)
        np.testing.assert_allclose(got, xv.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
